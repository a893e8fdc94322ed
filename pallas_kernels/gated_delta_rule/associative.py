"""Exact associative-scan form of Gated DeltaNet / DeltaNet, O(T K^3) work, O(log T) depth.

Paper "Linear Attention Architectures" (arXiv 2607.07953), Eqs. 14-17. Each token is the affine
state map ``S_t = A_t S_{t-1} + B_t`` (FLA layout S in R^{K x V}) with::

    A_t = exp(g_t) (I - beta_t k_t k_t^T)            [K, K]
    B_t = beta_t k_t v_t^T                           [K, V]

This is KDA's map (Eqs. 18-20) with the same decay on every key channel, so the computation is
delegated to :func:`pallas_kernels.kda.associative.kda_associative` with ``g`` broadcast over
``K``. The composition rule ``(A2, B2) o (A1, B1) = (A2 A1, A2 B1 + B2)`` is the one that
context parallelism and chunk-state passing reuse.
"""

from typing import Optional, Tuple

import jax
import jax.numpy as jnp

from pallas_kernels.kda import associative as kda_associative


def gated_delta_rule_associative(
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
    """Computes Gated DeltaNet (Eqs. 15-17; DeltaNet Eq. 14 when ``g`` is None) by associative scan.

    Memory is ``O(T K (K + V))`` per head (every state is materialised): a checking and
    state-composition form, not a training form.

    Args:
        q: queries ``[B, T, H, K]`` (already expanded to the value heads).
        k: keys ``[B, T, H, K]``, used as given.
        v: values ``[B, T, H, V]``.
        g: scalar log-decay per head ``[B, T, H]`` (natural log, ``<= 0``), or None (DeltaNet).
        beta: write strengths ``[B, T, H]`` in ``(0, 1)``.
        scale: read-out scale.
        initial_state: ``[B, H, K, V]`` or None (zeros); applies to each row's first document.
        segment_ids: optional int ``[B, T]``; the state resets to zero at each document start.

    Returns:
        ``(o, final_state, u)`` in fp32: ``[B, T, H, V]``, ``[B, H, K, V]``, ``[B, T, H, V]``.
    """
    dk = k.shape[-1]
    if g is None:
        g_channels = jnp.zeros(k.shape, jnp.float32)
    else:
        g_channels = jnp.broadcast_to(g.astype(jnp.float32)[..., None], (*g.shape, dk))
    return kda_associative.kda_associative(q, k, v, g_channels, beta, scale=scale,
                                           initial_state=initial_state, segment_ids=segment_ids)
