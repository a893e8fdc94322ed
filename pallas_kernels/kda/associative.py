"""Exact associative-scan form of Kimi Delta Attention (KDA), O(T K^3) work, O(log T) depth.

Paper "Linear Attention Architectures" (arXiv 2607.07953), Eqs. 18-20 (spec §2.4). Each token is
the affine state map ``S_t = A_t S_{t-1} + B_t`` (FLA layout S in R^{K x V}) with::

    A_t = (I - beta_t k_t k_t^T) Diag(exp g_t)       [K, K]
    B_t = beta_t k_t v_t^T                           [K, V]

and :func:`pallas_kernels.common.associative.affine_associative_scan` composes them. The outputs
are then read from the states: ``o_t = scale * S_t^T q_t`` and
``u_t = beta_t (v_t - (Diag(exp g_t) S_{t-1})^T k_t)``.
"""

from typing import Optional, Tuple

import jax
import jax.numpy as jnp

from pallas_kernels import common
from pallas_kernels.common import associative

_HIGHEST = jax.lax.Precision.HIGHEST


def kda_associative(
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
    """Computes KDA (Eqs. 18-20) with a parallel associative scan over affine state maps.

    Memory is ``O(T K (K + V))`` per head (every state is materialised), so this form is meant
    for checking, short sequences and composing shard or chunk states, not for long training
    sequences.

    Args:
        q: queries ``[B, T, H, K]`` (already expanded to the value heads).
        k: keys ``[B, T, H, K]``, used as given (L2-normalise them beforehand).
        v: values ``[B, T, H, V]``.
        g: per-key-channel log-decay ``[B, T, H, K]`` in natural-log units (``<= 0``).
        beta: write strengths ``[B, T, H]`` in ``(0, 1)``.
        scale: read-out scale applied to ``S_t^T q_t`` (usually ``K ** -0.5``).
        initial_state: ``[B, H, K, V]`` state before the first token, or ``None`` for zeros. It
            applies to the first document of each row only.
        segment_ids: optional int ``[B, T]``; the state is reset to zero wherever
            ``segment_ids[:, t] != segment_ids[:, t - 1]``.

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
    q, k, v, g, beta = (x.astype(f32) for x in (q, k, v, g, beta))
    batch, seq_len, heads, dk = k.shape
    dv = v.shape[-1]
    if initial_state is None:
        initial_state = jnp.zeros((batch, heads, dk, dv), f32)
    initial_state = initial_state.astype(f32)
    reset = None if segment_ids is None else associative.document_starts(segment_ids)  # [B, T]

    decay = jnp.exp(g)  # [B, T, H, K]
    beta_k = beta[..., None] * k  # [B, T, H, K]
    # A_t[i, j] = (delta_ij - beta k_i k_j) e^{g_j}: the erase acts on the decayed state.
    eye = jnp.eye(dk, dtype=f32)
    a = (eye - k[..., :, None] * beta_k[..., None, :]) * decay[..., None, :]  # [B, T, H, K, K]
    bm = beta_k[..., :, None] * v[..., None, :]  # [B, T, H, K, V]
    states = associative.affine_associative_scan(a, bm, initial_state, reset)  # [B, T, H, K, V]

    o = scale * jnp.einsum("bthkv,bthk->bthv", states, q, precision=_HIGHEST)
    prev = jnp.concatenate([initial_state[:, None], states[:, :-1]], axis=1)  # S_{t-1}
    if reset is not None:
        prev = jnp.where(reset[:, :, None, None, None], 0.0, prev)
    read = jnp.einsum("bthkv,bthk->bthv", decay[..., None] * prev, k, precision=_HIGHEST)
    return o, states[:, -1], beta[..., None] * (v - read)
