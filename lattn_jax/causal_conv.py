"""The short causal depthwise convolution of DeltaNet-style mixers.

:func:`causal_conv1d` is the math of :class:`lattn_jax.layers.ShortConv` and of its context-
parallel form (``lattn_jax.context_parallel.short_conv``): one function, so that both store the
same residuals and round the same way. Shapes use the legend of ``lattn_jax.typing``.
"""

from typing import Optional

import jax
import jax.numpy as jnp

from lattn_jax.typing import Array

_CONV_ACTIVATIONS = (None, "silu")


def causal_conv1d(x_ext: Array, weight: Array, doc_ext: Optional[Array] = None,
                  activation: Optional[str] = None) -> Array:
    """Causal depthwise convolution over an input that carries its ``W - 1`` preceding tokens.

    ``pre[t, c] = sum_{i<W} w[i, c] m_i[t] x_ext[t + i, c]`` and ``y = act(round(pre))``, where
    ``x_ext[t + W - 1]`` is token ``t`` and ``m_i[t] = 1`` unless ``doc_ext`` says tap ``i``
    reaches into another document than token ``t``'s (the last tap, the token itself, is never
    masked). Products and the sum in fp32 (tap order ``i = 0 .. W - 1``), rounded to
    ``x_ext.dtype``, then the activation in that dtype (FLA ``ShortConvolution`` with
    ``activation="silu"``, the short convolution of DeltaNet-style mixers).

    The gradient is autodiff's. A written-out backward that kept only the bf16 ``x_ext``
    (recomputing the sum, fp32 SiLU, ``d x_ext`` accumulated in fp32; commit ``1c18de9``) was
    10-12 % slower in fwd+bwd on an H100 in a 4-block stack at the 350M model's shape
    (``benchmarks/results/mosaic-gpu-h100-2026-12-07c.md``): XLA fuses autodiff's per-tap fp32
    copies into the backward's reductions instead of storing them.

    Args:
      x_ext: ``[B, W - 1 + T, C]`` float, the ``W - 1`` inputs before the first token (zeros at
        a row's start, or the carried convolution state) followed by the ``T`` tokens.
      weight: ``[W, C]`` float.
      doc_ext: optional int ``[B, W - 1 + T]``, a non-decreasing document index of every
        position of ``x_ext`` (``validation.document_index``; the carried positions take the
        first token's document). ``None``: one document.
      activation: ``None`` or ``"silu"`` (static).

    Returns:
      ``y``: ``[B, T, C]`` in ``x_ext.dtype``.

    Raises:
      ValueError: for an ``activation`` other than ``None`` or ``"silu"``, a ``weight`` that is
        not ``[W, C]`` with ``x_ext`` ``[B, W - 1 + T, C]`` and ``T >= 1``, or a ``doc_ext``
        that is not ``[B, W - 1 + T]``.
    """
    if activation not in _CONV_ACTIVATIONS:
        raise ValueError(f"causal_conv1d: activation={activation!r}; choose None or 'silu'")
    if (weight.ndim != 2 or x_ext.ndim != 3 or weight.shape[1] != x_ext.shape[2]
            or not 1 <= weight.shape[0] <= x_ext.shape[1]):
        raise ValueError(f"causal_conv1d: weight {tuple(weight.shape)} must be [W, C] for x_ext "
                         f"{tuple(x_ext.shape)} = [B, W - 1 + T, C] with T >= 1")
    if doc_ext is not None and tuple(doc_ext.shape) != tuple(x_ext.shape[:2]):
        raise ValueError(f"causal_conv1d: doc_ext {tuple(doc_ext.shape)} must be [B, W - 1 + T] "
                         f"= {tuple(x_ext.shape[:2])}")
    width = weight.shape[0]
    t = x_ext.shape[1] - width + 1
    pre = jnp.zeros((x_ext.shape[0], t, x_ext.shape[2]), jnp.float32)
    for i in range(width):
        xi = x_ext[:, i:i + t]
        if doc_ext is not None and i < width - 1:
            xi = jnp.where((doc_ext[:, i:i + t] == doc_ext[:, width - 1:])[..., None], xi, 0)
        pre = pre + xi.astype(jnp.float32) * weight[i].astype(jnp.float32)
    y = pre.astype(x_ext.dtype)
    return jax.nn.silu(y) if activation == "silu" else y
