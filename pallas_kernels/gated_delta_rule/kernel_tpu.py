"""Pallas TPU (Mosaic) kernels for the scalar-decay family: Gated DeltaNet, DeltaNet, simple GLA.

Gated DeltaNet (paper arXiv 2607.07953, Sec. 3.2, Eqs. 15-17), per batch row and value head::

    S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,   o_t = scale S_t^T q_t,

is the generic delta rule of :mod:`pallas_kernels.common.delta_tpu` with a scalar decay, read key
``kr = beta k`` and write value ``vw = beta v``. DeltaNet (Eq. 14) is ``g = None``. With
``beta = None`` the delta rule is off (``S_t = exp(g_t) S_{t-1} + k_t v_t^T``): simple GLA,
Lightning (a fixed per-head decay) and plain linear attention (HypeNet, arXiv 2601.22156, Sec. 3).
The kernels, their grids, the chunk algebra and the backward are documented in ``delta_tpu``.
On a non-TPU backend the same kernels run in Pallas TPU interpret mode (slow; tests).
"""

from typing import Optional, Tuple

import jax
import jax.numpy as jnp

from pallas_kernels.common import delta_tpu, pallas_tpu


def scalar_decay_tpu(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: Optional[jax.Array],
    beta: Optional[jax.Array],
    *,
    scale: float,
    initial_state: Optional[jax.Array] = None,
    segment_ids: Optional[jax.Array] = None,
    chunk_size: int = 64,
    interpret=None,
) -> Tuple[jax.Array, jax.Array, jax.Array]:
    """Gated DeltaNet / DeltaNet / simple GLA on the Pallas TPU kernels.

    Args:
      q: queries ``[B, T, H, K]`` (already expanded to the value heads), bf16 or fp32.
      k: keys ``[B, T, H, K]``, used as given (L2-normalise them beforehand for the delta rule).
      v: values ``[B, T, H, V]``.
      g: log-decay ``[B, T, H]`` (natural log, ``<= 0``) or ``None`` (no decay).
      beta: write strengths ``[B, T, H]`` or ``None`` (no delta rule).
      scale: read-out scale.
      initial_state: ``[B, H, K, V]`` (fp32) or ``None`` for zeros.
      segment_ids: optional int ``[B, T]``; the state resets where the id changes.
      chunk_size: 64 or 128.
      interpret: ``None`` (Mosaic on a TPU, interpret mode elsewhere) or a ``pallas_call``
        ``interpret`` value.

    Returns:
      ``(o [B, T, H, V] in v.dtype, final_state [B, H, K, V] fp32, u [B, T, H, V] in v.dtype)``;
      ``u`` is the residual (``v_new``), equal to ``v`` when ``beta`` is ``None``.

    Raises:
      ValueError: if K or V is not 64/128, the chunk size not 64/128, or the dtypes not
        bf16/fp32.
    """
    f32 = jnp.float32
    mdt = pallas_tpu.matmul_dtype(q, k, v)
    if beta is None:
        k_read, v_write = None, v
    else:
        b = beta.astype(f32)[..., None]
        k_read, v_write = b * k.astype(f32), b * v.astype(f32)
    o, final_state, u = delta_tpu.delta_rule_tpu(
        q, k, k_read, v_write, g, scale=scale, initial_state=initial_state,
        segment_ids=segment_ids, chunk_size=chunk_size, mm_dtype=mdt, out_dtype=v.dtype,
        interpret=interpret,
    )
    return o, final_state, u.astype(v.dtype)
