"""Chunkwise form of Kimi Delta Attention (KDA) in pure JAX.

Paper "Linear Attention Architectures" (arXiv 2607.07953), Eqs. 18-20 (spec §2.4). KDA is the
per-key-channel-decay delta rule with read key ``beta_t k_t`` and write value ``beta_t v_t``::

    S~_t = Diag(exp g_t) S_{t-1},  u_t = beta_t (v_t - S~_t^T k_t),  S_t = S~_t + k_t u_t^T.

Per chunk of C tokens with entry state S_0 and gamma_i in R^K the within-chunk cumsum of g
(Gamma_ijc = exp(gamma_ic - gamma_jc), i >= j)::

    M_ij = sum_c k_ic k_jc Gamma_ijc  (j < i)
    u    = (I + diag(beta) M)^{-1} diag(beta) (V - (K * e^gamma) S_0)
    O_i  = scale * [S_0^T (e^{gamma_i} * q_i) + sum_{j <= i} (sum_c q_ic k_jc Gamma_ijc) u_j]
    S_C  = Diag(e^{gamma_C}) S_0 + sum_j (e^{gamma_C - gamma_j} * k_j) u_j^T

This is the GDN-2 chunk form with ``b = beta 1_K`` and ``w = beta 1_V``, so the computation is
shared: see :func:`pallas_kernels.common.channelwise_chunked.channelwise_delta_chunked` for the
numerics (masking before exp, exact document boundaries, padding, memory).
"""

from typing import Optional, Tuple

import jax
import jax.numpy as jnp

from pallas_kernels import common
from pallas_kernels.common import channelwise_chunked


def kda_chunked(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    *,
    scale: float,
    initial_state: Optional[jax.Array] = None,
    segment_ids: Optional[jax.Array] = None,
    chunk_size: int = 64,
) -> Tuple[jax.Array, jax.Array, jax.Array]:
    """Computes KDA (Eqs. 18-20) with the chunkwise form.

    Any ``T >= 1`` works (time is padded with inert tokens; the chunk size is clipped to
    ``T`` when ``T`` is shorter).

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
        chunk_size: chunk length C, a power of two (validated by the public op).

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
    k = k.astype(f32)
    beta = beta.astype(f32)[..., None]  # [B, T, H, 1]
    return channelwise_chunked.channelwise_delta_chunked(
        q, k, beta * k, beta * v.astype(f32), g,
        scale=scale, initial_state=initial_state, segment_ids=segment_ids,
        chunk_size=chunk_size,
    )
