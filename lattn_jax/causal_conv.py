"""The short causal depthwise convolution of DeltaNet-style mixers, with its backward written out.

:func:`causal_conv1d` is the math of :class:`lattn_jax.layers.ShortConv` and of its context-
parallel form (``lattn_jax.context_parallel.short_conv``): one function, so that both store the
same residuals and round the same way. Shapes use the legend of ``lattn_jax.typing``.
"""

import functools
from typing import Optional

import jax
import jax.numpy as jnp

from lattn_jax.typing import Array

_CONV_ACTIVATIONS = (None, "silu")


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def causal_conv1d(x_ext: Array, weight: Array, doc_ext: Optional[Array] = None,
                  activation: Optional[str] = None) -> Array:
    """Causal depthwise convolution over an input that carries its ``W - 1`` preceding tokens.

    ``pre[t, c] = sum_{i<W} w[i, c] m_i[t] x_ext[t + i, c]`` and ``y = act(pre)``, where
    ``x_ext[t + W - 1]`` is token ``t`` and ``m_i[t] = 1`` unless ``doc_ext`` says tap ``i``
    reaches into another document than token ``t``'s (the last tap, the token itself, is never
    masked). Products and the sum in fp32 (tap order ``i = 0 .. W - 1``), the activation on the
    fp32 sum, ``y`` rounded once to ``x_ext.dtype`` (FLA ``causal_conv1d``, which
    ``ShortConvolution`` calls with ``activation="silu"`` in DeltaNet-style mixers).

    The backward is written out from ``x_ext``, ``weight`` and ``doc_ext`` alone (``pre`` is
    recomputed; ``d pre = dy act'(pre)``, ``act'(p) = s (1 + p (1 - s))``, ``s = sigmoid(p)``
    for SiLU):

        d w[i, c]       = sum_{b, t} m_i[t] x_ext[t + i, c] d pre[t, c]
        d x_ext[t', c]  = sum_i m_i[t' - i] w[i, c] d pre[t' - i, c]

    in fp32, rounded once to the inputs' dtypes. ShortConv's former tap loop (to 2026-12-07:
    the sum rounded to the compute dtype, then SiLU there) left this to autodiff, whose
    residuals are every tap's fp32 copy of the input (``W`` x 4 bytes per channel and token: 16
    for the usual ``W = 4``, against the 2 of a bf16 ``x_ext``) and the pre-activation, for
    every layer (XLA may fuse the copies into the backward instead of storing them), and which
    accumulated ``d x_ext`` over the taps in the compute dtype.

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
    return _conv_fwd_value(x_ext, weight, doc_ext, activation)[0]


def _conv_check(x_ext, weight, doc_ext, activation) -> None:
    if activation not in _CONV_ACTIVATIONS:
        raise ValueError(f"causal_conv1d: activation={activation!r}; choose None or 'silu'")
    if (weight.ndim != 2 or x_ext.ndim != 3 or weight.shape[1] != x_ext.shape[2]
            or not 1 <= weight.shape[0] <= x_ext.shape[1]):
        raise ValueError(f"causal_conv1d: weight {tuple(weight.shape)} must be [W, C] for x_ext "
                         f"{tuple(x_ext.shape)} = [B, W - 1 + T, C] with T >= 1")
    if doc_ext is not None and tuple(doc_ext.shape) != tuple(x_ext.shape[:2]):
        raise ValueError(f"causal_conv1d: doc_ext {tuple(doc_ext.shape)} must be [B, W - 1 + T] "
                         f"= {tuple(x_ext.shape[:2])}")


def _conv_masks(doc_ext, width: int, t: int):
    """``[m_0 .. m_{W-2}]``, each ``[B, T, 1]`` bool (tap ``i`` stays in token ``t``'s
    document), or ``None`` without documents."""
    if doc_ext is None:
        return None
    own = doc_ext[:, width - 1:]
    return [(doc_ext[:, i:i + t] == own)[..., None] for i in range(width - 1)]


def _conv_pre(x_ext, weight, masks, t: int) -> Array:
    """The fp32 pre-activation ``[B, T, C]``, the taps summed in order ``i = 0 .. W - 1``."""
    width = weight.shape[0]
    w = weight.astype(jnp.float32)
    pre = jnp.zeros((x_ext.shape[0], t, x_ext.shape[2]), jnp.float32)
    for i in range(width):
        xi = x_ext[:, i:i + t]
        if masks is not None and i < width - 1:
            xi = jnp.where(masks[i], xi, 0)
        pre = pre + xi.astype(jnp.float32) * w[i]
    return pre


def _conv_fwd_value(x_ext, weight, doc_ext, activation):
    _conv_check(x_ext, weight, doc_ext, activation)
    t = x_ext.shape[1] - weight.shape[0] + 1
    pre = _conv_pre(x_ext, weight, _conv_masks(doc_ext, weight.shape[0], t), t)
    y = jax.nn.silu(pre) if activation == "silu" else pre
    return y.astype(x_ext.dtype), (x_ext, weight, doc_ext)


def _conv_fwd(x_ext, weight, doc_ext, activation):
    return _conv_fwd_value(x_ext, weight, doc_ext, activation)


def _conv_bwd(activation, res, dy):
    x_ext, weight, doc_ext = res
    width = weight.shape[0]
    t = x_ext.shape[1] - width + 1
    masks = _conv_masks(doc_ext, width, t)
    dpre = dy.astype(jnp.float32)
    if activation == "silu":
        pre = _conv_pre(x_ext, weight, masks, t)
        s = jax.nn.sigmoid(pre)
        dpre = dpre * s * (1.0 + pre * (1.0 - s))
    w = weight.astype(jnp.float32)
    dw, dx = [], jnp.zeros(x_ext.shape, jnp.float32)
    for i in range(width):
        g = dpre if masks is None or i == width - 1 else jnp.where(masks[i], dpre, 0)
        dw.append(jnp.sum(x_ext[:, i:i + t].astype(jnp.float32) * g, axis=(0, 1)))
        dx = dx + jnp.pad(g * w[i], ((0, 0), (i, width - 1 - i), (0, 0)))
    return dx.astype(x_ext.dtype), jnp.stack(dw).astype(weight.dtype), None


causal_conv1d.defvjp(_conv_fwd, _conv_bwd)
