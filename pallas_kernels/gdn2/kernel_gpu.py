"""Pallas GPU kernels (Triton lowering) for Gated DeltaNet-2 (GDN-2): a thin entry point.

GDN-2 (paper arXiv 2607.07953, Eqs. 21-24; spec §2.6), per batch row and value head, with a
per-key-channel log-decay g_t in R^K, an erase gate b_t in (0,1)^K and a write gate w_t in
(0,1)^V::

    S~_t = Diag(exp g_t) S_{t-1},  u_t = w_t * v_t - S~_t^T (b_t * k_t),  S_t = S~_t + k_t u_t^T,
    o_t  = scale S_t^T q_t,

is the per-channel-decay delta rule of :mod:`pallas_kernels.common.channelwise_gpu` with read
key ``kr = b * k`` and write value ``vw = w * v``. The kernels, their numerics and the backward
are documented there.
"""

from typing import Optional, Tuple

import jax

from pallas_kernels.common import channelwise_gpu


def gdn2_pallas(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    b: jax.Array,
    w: jax.Array,
    *,
    scale: float,
    initial_state: Optional[jax.Array] = None,
    segment_ids: Optional[jax.Array] = None,
    return_residual: bool = True,
    interpret: bool = False,
) -> Tuple[jax.Array, jax.Array, Optional[jax.Array]]:
    """GDN-2 (arXiv 2607.07953, Eqs. 21-24; spec §2.6) on the Pallas GPU kernels.

    :func:`pallas_kernels.common.channelwise_gpu.channelwise_delta_pallas` with ``kr = b * k``
    and ``vw = w * v`` (formed in fp32 in the kernels; db and dw from their ``custom_vjp``).

    Args:
      q: queries ``[B, T, H, K]`` (already expanded to the value heads), bf16/fp16/fp32.
      k: keys ``[B, T, H, K]``, same dtype as q.
      v: values ``[B, T, H, V]``, same dtype as q.
      g: per-key-channel log-decay ``[B, T, H, K]`` (``<= 0``).
      b: erase gate ``[B, T, H, K]``.
      w: write gate ``[B, T, H, V]``.
      scale, initial_state, segment_ids, return_residual, interpret: as
        :func:`pallas_kernels.common.channelwise_gpu.channelwise_delta_pallas`.

    Returns:
      ``(o [B, T, H, V] in v.dtype, final_state [B, H, K, V] fp32, u [B, T, H, V] or None)``.

    Raises:
      ValueError: if K or V is not 64 or 128, or b / w is not shaped like k / v.
    """
    o, state, u = channelwise_gpu.channelwise_delta_pallas(
        q, k, v, g, b, w, scale=scale, initial_state=initial_state, segment_ids=segment_ids,
        return_residual=return_residual, interpret=interpret)
    return o.astype(v.dtype), state, None if u is None else u.astype(v.dtype)
