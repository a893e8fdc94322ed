"""Token-serial reference for Kimi Delta Attention (KDA): the ground truth for every form.

Paper "Linear Attention Architectures" (arXiv 2607.07953), Eqs. 18-20 (spec §2.4): the gated
delta rule with a per-key-channel decay. In the FLA state layout S in R^{K x V}, per token::

    S~_t = Diag(exp g_t) S_{t-1}                      (decay each key channel)
    u_t  = beta_t (v_t - S~_t^T k_t)                  (residual against the decayed read, [V])
    S_t  = S~_t + k_t u_t^T
    o_t  = scale * S_t^T q_t                          (inclusive of token t)

i.e. ``S_t = (I - beta_t k_t k_t^T) Diag(exp g_t) S_{t-1} + beta_t k_t v_t^T``.

This is written independently of the GDN-2 reference (KDA is GDN-2 with ``b = beta 1_K`` and
``w = beta 1_V``), so the two cross-check each other. Everything runs in fp32 with
``Precision.HIGHEST``; the code is written for clarity, not speed. Validation, GVA head expansion
and the output dtype are handled by :func:`pallas_kernels.kda.api.kda`.
"""

from typing import Optional, Tuple

import jax
import jax.numpy as jnp

from pallas_kernels import common
from pallas_kernels.common import associative

_HIGHEST = jax.lax.Precision.HIGHEST


def kda_reference(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    *,
    scale: float,
    initial_state: Optional[jax.Array] = None,
    segment_ids: Optional[jax.Array] = None,
) -> Tuple[jax.Array, jax.Array, jax.Array]:
    """Runs the KDA recurrence (Eqs. 18-20) one token at a time with ``lax.scan``.

    Args:
        q: queries ``[B, T, H, K]`` (already expanded to the value heads).
        k: keys ``[B, T, H, K]``, used as given (L2-normalise them beforehand).
        v: values ``[B, T, H, V]``.
        g: per-key-channel log-decay ``[B, T, H, K]`` in natural-log units (``<= 0``).
        beta: write strengths ``[B, T, H]`` in ``(0, 1)``.
        scale: read-out scale applied to ``S_t^T q_t`` (usually ``K ** -0.5``).
        initial_state: ``[B, H, K, V]`` state before the first token, or ``None`` for zeros. It
            applies to the first document of each row only.
        segment_ids: optional int ``[B, T]``. A new document starts wherever
            ``segment_ids[:, t] != segment_ids[:, t - 1]``; the state is reset to zero there.

    Returns:
        ``(o, final_state, u)``, all fp32: ``o`` ``[B, T, H, V]``, the state after the last token
        of each row ``[B, H, K, V]``, and the residuals ``u`` ``[B, T, H, V]``.

    Raises:
        TypeError: naming the first array argument that is not a ``jax.Array`` or
            ``numpy.ndarray`` (a Python list, say), as the public ops do
            (:func:`pallas_kernels.common.check_arrays`).
    """
    common.check_arrays(q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state,
                        segment_ids=segment_ids)
    f32 = jnp.float32
    batch, seq_len, heads, dk = k.shape
    dv = v.shape[-1]
    if initial_state is None:
        initial_state = jnp.zeros((batch, heads, dk, dv), f32)
    if segment_ids is None:
        resets = jnp.zeros((batch, seq_len), bool)
    else:
        resets = associative.document_starts(segment_ids)  # [B, T]

    def step(state, xs):
        q_t, k_t, v_t, g_t, beta_t, reset_t = xs  # [B, H, K] x2, [B, H, V], [B, H, K], [B, H], [B]
        state = jnp.where(reset_t[:, None, None, None], 0.0, state)  # new document: zero state
        state = jnp.exp(g_t)[..., :, None] * state  # S~_t = Diag(exp g_t) S_{t-1}
        read = jnp.einsum("bhk,bhkv->bhv", k_t, state, precision=_HIGHEST)
        u_t = beta_t[..., None] * (v_t - read)  # [B, H, V]
        state = state + k_t[..., :, None] * u_t[..., None, :]
        o_t = scale * jnp.einsum("bhk,bhkv->bhv", q_t, state, precision=_HIGHEST)
        return state, (o_t, u_t)

    def time_major(x):
        return jnp.moveaxis(x.astype(f32), 1, 0)

    xs = tuple(time_major(x) for x in (q, k, v, g, beta)) + (jnp.moveaxis(resets, 1, 0),)
    final_state, (o, u) = jax.lax.scan(step, initial_state.astype(f32), xs)
    return jnp.moveaxis(o, 0, 1), final_state, jnp.moveaxis(u, 0, 1)
