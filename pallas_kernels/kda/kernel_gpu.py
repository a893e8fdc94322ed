"""Pallas GPU kernels (Triton lowering) for Kimi Delta Attention (KDA): a thin entry point.

KDA (paper arXiv 2607.07953, Eqs. 18-20; spec §2.4), per batch row and value head, with a
per-key-channel log-decay g_t in R^K::

    S~_t = Diag(exp g_t) S_{t-1},  u_t = beta_t (v_t - S~_t^T k_t),  S_t = S~_t + k_t u_t^T,
    o_t  = scale S_t^T q_t,

is the per-channel-decay delta rule of :mod:`pallas_kernels.common.channelwise_gpu` with read
key ``kr = beta k`` and write value ``vw = beta v`` (GDN-2 with ``b = beta 1_K``,
``w = beta 1_V``). The kernels, their numerics and the backward are documented there.
"""

from typing import Optional, Tuple

import jax

from pallas_kernels.common import channelwise_gpu


def kda_pallas(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    *,
    scale: float,
    initial_state: Optional[jax.Array] = None,
    segment_ids: Optional[jax.Array] = None,
    return_residual: bool = True,
    interpret: bool = False,
) -> Tuple[jax.Array, jax.Array, Optional[jax.Array]]:
    """KDA on the Pallas GPU kernels (forward and ``custom_vjp`` backward).

    :func:`pallas_kernels.common.channelwise_gpu.channelwise_delta_pallas` with ``kr = beta k``
    and ``vw = beta v`` (formed in fp32 in the kernels and rounded once to the operand dtype; dbeta
    from their ``custom_vjp``).

    Args:
      q: queries ``[B, T, H, K]`` (already expanded to the value heads), bf16/fp16/fp32.
      k: keys ``[B, T, H, K]``, used as given (L2-normalise them beforehand).
      v: values ``[B, T, H, V]``.
      g: per-key-channel log-decay ``[B, T, H, K]`` (natural log, ``<= 0``).
      beta: write strengths ``[B, T, H]``.
      scale: read-out scale.
      initial_state: ``[B, H, K, V]`` (fp32) or ``None`` for zeros.
      segment_ids: optional int ``[B, T]``; the state resets where the id changes.
      return_residual: whether to compute the residual ``u`` (``v_new``).
      interpret: run in Pallas interpret mode (any backend; slow).

    Returns:
      ``(o [B, T, H, V] in v.dtype, final_state [B, H, K, V] fp32, u [B, T, H, V] or None)``.

    Raises:
      ValueError: if K or V is not 64 or 128, or beta is not shaped ``[B, T, H]``.
    """
    o, state, u = channelwise_gpu.channelwise_delta_pallas(
        q, k, v, g, beta, beta, scale=scale, initial_state=initial_state,
        segment_ids=segment_ids, return_residual=return_residual, interpret=interpret)
    return o.astype(v.dtype), state, None if u is None else u.astype(v.dtype)
