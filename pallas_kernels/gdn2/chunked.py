"""Chunkwise form of Gated DeltaNet-2 (GDN-2) in pure JAX.

Paper "Linear Attention Architectures" (arXiv 2607.07953), Eqs. 21-24 (spec §2.6). GDN-2 is the
per-key-channel-decay delta rule with read key ``b_t * k_t`` and write value ``w_t * v_t``::

    S~_t = Diag(exp g_t) S_{t-1},  u_t = w_t * v_t - S~_t^T (b_t * k_t),  S_t = S~_t + k_t u_t^T,
    o_t  = scale * S_t^T q_t.

The chunk form is shared with KDA: see
:func:`pallas_kernels.common.channelwise_chunked.channelwise_delta_chunked` for the algebra and
the numerics (masking before exp, exact document boundaries, padding, memory).
"""

from typing import Optional, Tuple

import jax
import jax.numpy as jnp

from pallas_kernels import common
from pallas_kernels.common import channelwise_chunked


def gdn2_chunked(
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
) -> Tuple[jax.Array, jax.Array, jax.Array]:
    """Computes GDN-2 (Eqs. 21-24) with the chunkwise form.

    ``u_t = w_t * v_t - S~_t^T (b_t * k_t)``, ``S_t = S~_t + k_t u_t^T`` with
    ``S~_t = Diag(exp g_t) S_{t-1}``, ``o_t = scale * S_t^T q_t``; this is
    :func:`pallas_kernels.common.channelwise_chunked.channelwise_delta_chunked` with
    ``k_read = b * k`` and ``v_write = w * v``.

    Args:
        q: queries ``[B, T, H, K]`` (already expanded to the value heads).
        k: keys ``[B, T, H, K]``, used as given (L2-normalise them beforehand).
        v: values ``[B, T, H, V]``.
        g: per-key-channel log-decay ``[B, T, H, K]`` in natural-log units (``<= 0``).
        b: erase gate ``[B, T, H, K]`` in ``(0, 1)``.
        w: write gate ``[B, T, H, V]`` in ``(0, 1)``.
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
    common.check_arrays(q=q, k=k, v=v, g=g, b=b, w=w, initial_state=initial_state,
                        segment_ids=segment_ids)
    f32 = jnp.float32
    k = k.astype(f32)
    return channelwise_chunked.channelwise_delta_chunked(
        q, k, b.astype(f32) * k, w.astype(f32) * v.astype(f32), g,
        scale=scale, initial_state=initial_state, segment_ids=segment_ids,
        chunk_size=chunk_size,
    )
