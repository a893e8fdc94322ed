"""Pallas TPU (Mosaic) kernels for Gated DeltaNet-2 (GDN-2).

GDN-2 (paper arXiv 2607.07953, Eqs. 21-24), per batch row and value head, with a per-key-channel
log-decay g_t, an erase gate b_t in (0,1)^K and a write gate w_t in (0,1)^V::

    S~_t = Diag(exp g_t) S_{t-1},  u_t = w_t * v_t - S~_t^T (b_t * k_t),  S_t = S~_t + k_t u_t^T,
    o_t  = scale S_t^T q_t,

is the generic delta rule of :mod:`pallas_kernels.common.delta_tpu` with a per-channel decay,
read key ``kr = b * k`` and write value ``vw = w * v`` (the same chunk form as
``common/channelwise_chunked.py::channelwise_delta_chunked``). The kernels, grids and the
backward are documented in ``delta_tpu``. On a non-TPU backend the same kernels run in Pallas
TPU interpret mode (slow; tests).
"""

from typing import Optional, Tuple

import jax
import jax.numpy as jnp

from pallas_kernels.common import delta_tpu, pallas_tpu


def gdn2_tpu(
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
    chunk_size: int = 64,
    interpret=None,
) -> Tuple[jax.Array, jax.Array, jax.Array]:
    """GDN-2 on the Pallas TPU kernels.

    Args:
      q: queries ``[B, T, H, K]`` (already expanded to the value heads), bf16 or fp32.
      k: keys ``[B, T, H, K]``, used as given (L2-normalise them beforehand).
      v: values ``[B, T, H, V]``.
      g: per-key-channel log-decay ``[B, T, H, K]`` (natural log, ``<= 0``).
      b: erase gate ``[B, T, H, K]`` (read side only).
      w: write gate ``[B, T, H, V]``.
      scale: read-out scale.
      initial_state: ``[B, H, K, V]`` (fp32) or ``None`` for zeros.
      segment_ids: optional int ``[B, T]``; the state resets where the id changes.
      chunk_size: 64 or 128.
      interpret: ``None`` (Mosaic on a TPU, interpret mode elsewhere) or a ``pallas_call``
        ``interpret`` value.

    Returns:
      ``(o [B, T, H, V] in v.dtype, final_state [B, H, K, V] fp32, u [B, T, H, V] in v.dtype)``.

    Raises:
      ValueError: if K or V is not 64/128, the chunk size not 64/128, or the dtypes not
        bf16/fp32.
    """
    f32 = jnp.float32
    mdt = pallas_tpu.matmul_dtype(q, k, v)
    o, final_state, u = delta_tpu.delta_rule_tpu(
        q, k, b.astype(f32) * k.astype(f32), w.astype(f32) * v.astype(f32), g.astype(f32),
        scale=scale, initial_state=initial_state, segment_ids=segment_ids,
        chunk_size=chunk_size, mm_dtype=mdt, out_dtype=v.dtype, interpret=interpret,
    )
    return o, final_state, u.astype(v.dtype)
