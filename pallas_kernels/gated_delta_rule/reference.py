"""Token-serial reference for the (Gated) DeltaNet recurrence: the ground truth for every form.

Implements Gated DeltaNet (paper "Linear Attention Architectures", arXiv 2607.07953, Sec. 3.2,
Eqs. 15-17) and DeltaNet (Eq. 14, the special case g = 0) in the FLA state layout
S in R^{K x V}:

    S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,    o_t = scale * S_t^T q_t.

The scan uses the equivalent residual ("v_new") form, which also yields the per-token residual
u_t that cross-layer routing consumes (spec §4.1):

    u_t = beta_t (v_t - exp(g_t) S_{t-1}^T k_t),    S_t = exp(g_t) S_{t-1} + k_t u_t^T.

The read-out is inclusive of token t. Everything runs in fp32 with ``Precision.HIGHEST``; the code
is written for clarity, not speed. Input validation, GVA head expansion and the output dtype are
handled by :func:`pallas_kernels.gated_delta_rule.api.gated_delta_rule`.
"""

from typing import Optional, Tuple

import jax
import jax.numpy as jnp

from pallas_kernels import common

_HIGHEST = jax.lax.Precision.HIGHEST


def gated_delta_rule_reference(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: Optional[jax.Array],
    beta: jax.Array,
    *,
    scale: float,
    initial_state: Optional[jax.Array] = None,
    segment_ids: Optional[jax.Array] = None,
) -> Tuple[jax.Array, jax.Array, jax.Array]:
    """Runs the Gated DeltaNet recurrence one token at a time with ``lax.scan``.

    Args:
        q: queries ``[B, T, H, K]`` (already expanded to the value heads).
        k: keys ``[B, T, H, K]``, used as given (L2-normalise them beforehand).
        v: values ``[B, T, H, V]``.
        g: per-token log-decay ``[B, T, H]`` in natural-log units (``alpha_t = exp(g_t)``,
            expected ``<= 0``), or ``None`` for DeltaNet (no decay).
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
    batch, _, heads, dk = k.shape
    dv = v.shape[-1]
    if initial_state is None:
        initial_state = jnp.zeros((batch, heads, dk, dv), f32)
    if segment_ids is None:
        resets = jnp.zeros(k.shape[:2], bool)
    else:
        doc = common.document_index(segment_ids)
        resets = jnp.concatenate([jnp.zeros_like(doc[:, :1], bool), doc[:, 1:] != doc[:, :-1]], 1)

    def step(state, xs):
        q_t, k_t, v_t, g_t, beta_t, reset_t = xs  # [B, H, K], [B, H, K], [B, H, V], [B, H] x2, [B]
        state = jnp.where(reset_t[:, None, None, None], 0.0, state)  # new document: zero state
        if g_t is not None:
            state = jnp.exp(g_t)[..., None, None] * state  # alpha_t S_{t-1}
        read = jnp.einsum("bhk,bhkv->bhv", k_t, state, precision=_HIGHEST)
        u_t = beta_t[..., None] * (v_t - read)
        state = state + k_t[..., :, None] * u_t[..., None, :]
        o_t = scale * jnp.einsum("bhk,bhkv->bhv", q_t, state, precision=_HIGHEST)
        return state, (o_t, u_t)

    def time_major(x):
        return None if x is None else jnp.moveaxis(x.astype(f32), 1, 0)

    xs = (time_major(q), time_major(k), time_major(v), time_major(g), time_major(beta),
          jnp.moveaxis(resets, 1, 0))
    final_state, (o, u) = jax.lax.scan(step, initial_state.astype(f32), xs)
    return jnp.moveaxis(o, 0, 1), final_state, jnp.moveaxis(u, 0, 1)
