"""Building blocks shared by the mixers and the model: norms, projections, MLP, RoPE, short conv.

All modules are Flax NNX modules with separate ``dtype`` (compute) and ``param_dtype`` (storage).
Norm statistics are computed in fp32 whatever the activation dtype. Shapes use the legend of
``lattn_jax.typing``.
"""

import functools
import math
from typing import NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lattn_jax import context_parallel, sharding
from lattn_jax.config import NORM_IMPLEMENTATIONS
from lattn_jax.causal_conv import causal_conv1d
from lattn_jax.typing import Array
from pallas_kernels.common import rms_norm_gpu, validation


def normal_init(std: float):
    """``N(0, std^2)`` initialiser (paper 1 §1: every linear uses std 0.02)."""
    return jax.nn.initializers.normal(stddev=std)


class RMSNorm(nnx.Module):
    """Root-mean-square norm ``y = x / sqrt(mean(x^2) + eps) * scale`` over the last axis.

    Zhang & Sennrich (2019); paper 1 §1 uses eps 1e-5, scale initialised to 1, no bias. Statistics
    are computed in fp32; the result is cast back to ``x.dtype``.

    Args:
      dim: size of the normalised (last) axis.
      eps: added to the mean square.
      param_dtype: dtype of ``scale``.
      implementation: ``"xla"`` (:func:`rms_norm`), ``"pallas"`` (the one-pass Pallas GPU
        kernels of ``pallas_kernels.common.rms_norm_gpu``; needs a GPU backend) or
        ``"pallas_interpret"`` (the same kernels in Pallas interpret mode, any backend; tests).
        The same math in the same precision (``ModelConfig.norm_implementation``).

    Raises:
      ValueError: for an ``implementation`` not in ``lattn_jax.config.NORM_IMPLEMENTATIONS``,
        ``"pallas"`` called off a GPU backend, or a Pallas implementation called under an
        active mesh of more than one device (the kernels are not yet wrapped in ``shard_map``).
    """

    def __init__(self, dim: int, *, eps: float = 1e-5, param_dtype=jnp.float32,
                 implementation: str = "xla"):
        if implementation not in NORM_IMPLEMENTATIONS:
            raise ValueError(f"RMSNorm implementation={implementation!r}; choose from "
                             f"{', '.join(NORM_IMPLEMENTATIONS)}")
        self.eps = eps
        self.implementation = implementation
        self.scale = nnx.Param(jnp.ones((dim,), param_dtype))

    def __call__(self, x: Array) -> Array:
        """``x``: ``[..., dim]`` any float dtype -> same shape and dtype (:func:`rms_norm`, or
        ``rms_norm_gpu.rms_norm_pallas`` for the Pallas implementations)."""
        if self.implementation == "xla":
            return rms_norm(x, self.scale[...], self.eps)
        if self.implementation == "pallas" and jax.default_backend() != "gpu":
            raise ValueError(f"RMSNorm implementation='pallas' (model.norm_implementation) needs "
                             f"a GPU backend, not {jax.default_backend()!r}; use 'xla' or "
                             f"'pallas_interpret'")
        mesh = sharding.active_mesh()
        if mesh is not None and mesh.size > 1:
            # The kernels see whole arrays: GSPMD would gather a sharded x for them.
            raise ValueError(f"RMSNorm implementation={self.implementation!r} "
                             f"(model.norm_implementation) runs on one device only (not yet in "
                             f"shard_map); the active mesh has {mesh.size} devices: use 'xla'")
        return rms_norm_gpu.rms_norm_pallas(x, self.scale[...], self.eps,
                                            interpret=self.implementation == "pallas_interpret")


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def rms_norm(x: Array, scale: Array, eps: float) -> Array:
    """``y = x r scale`` with ``r = 1 / sqrt(mean(x^2) + eps)`` over the last axis (Zhang &
    Sennrich 2019), statistics and products in fp32, ``y`` rounded once to ``x.dtype``.

    The backward is written out (fp32; ``xh = x r``, ``gs = dy scale``):

        d x = r (gs - xh mean(gs xh)),     d scale = sum over all leading axes of dy xh

    from ``x`` and ``r`` ([..., 1] fp32) saved by the forward. Autodiff of the same expression
    keeps the fp32 ``x r`` ([..., dim], twice the bytes of a bf16 ``x``) for ``d scale``;
    the 2026-12-03h profile of HALO's Stage 2 put the norms' reductions at 21 ms of a 204 ms
    step. The forward is the same operations as before, hence the same bits.

    Args:
      x: ``[..., dim]`` any float dtype.
      scale: ``[dim]`` any float dtype (fp32 master weights in mixed precision).
      eps: added to the mean square (static).

    Returns:
      ``[..., dim]`` in ``x.dtype``; gradients in the dtypes of ``x`` and ``scale``.
    """
    return _rms_norm_fwd(x, scale, eps)[0]


def _rms_norm_fwd(x, scale, eps):
    x32 = x.astype(jnp.float32)
    r = jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)
    y = ((x32 * r) * scale.astype(jnp.float32)).astype(x.dtype)
    return y, (x, r, scale)


def _rms_norm_bwd(eps, res, dy):
    del eps
    x, r, scale = res
    xh = x.astype(jnp.float32) * r
    dy32 = dy.astype(jnp.float32)
    gs = dy32 * scale.astype(jnp.float32)
    dx = r * (gs - xh * jnp.mean(gs * xh, axis=-1, keepdims=True))
    d_scale = jnp.sum(dy32 * xh, axis=tuple(range(xh.ndim - 1)))  # no reshape: keeps sharding
    return dx.astype(x.dtype), d_scale.astype(scale.dtype)


rms_norm.defvjp(_rms_norm_fwd, _rms_norm_bwd)


class Dense(nnx.Module):
    """Bias-free linear map ``y = x W`` with ``W: [in, out]`` initialised ``N(0, std^2)``.

    Args:
      in_features: input width.
      out_features: output width.
      std: init standard deviation.
      rngs: NNX rngs (uses ``rngs.params()``).
      dtype: compute dtype (inputs and weight are cast to it).
      param_dtype: storage dtype.
      kernel_init: optional ``init(key, shape, dtype)`` used instead of ``N(0, std^2)`` (e.g.
        zeros for the routing projections, spec §4.3).
      split_products: how :meth:`split` forms its parts (``ModelConfig.split_projections``).
    """

    def __init__(self, in_features: int, out_features: int, *, std: float, rngs: nnx.Rngs,
                 dtype=jnp.float32, param_dtype=jnp.float32, kernel_init=None,
                 split_products: bool = False):
        self.dtype = dtype
        self.split_products = bool(split_products)
        init = normal_init(std) if kernel_init is None else kernel_init
        self.kernel = nnx.Param(init(rngs.params(), (in_features, out_features), param_dtype))

    def __call__(self, x: Array) -> Array:
        """``x``: ``[..., in]`` -> ``[..., out]`` in ``dtype``."""
        w = self.kernel[...].astype(self.dtype)
        return jnp.einsum("...i,io->...o", x.astype(self.dtype), w)

    def split(self, x: Array, sections) -> list:
        """``jnp.split(self(x), sections, axis=-1)``: the output's column blocks.

        ``sections``: an int (that many equal blocks) or the ascending split indices, as for
        ``jnp.split``. With ``split_products`` each block is its own product ``x W[:, a:b]``: the
        same values (each output column is the same dot product), but in the backward the
        blocks' cotangents are never concatenated into one ``[..., out]`` buffer (XLA's
        transpose of the split, an activation-sized copy per projection); only the weight's
        column-block gradients are (``[in, out]``, small). Otherwise one product, then the split.

        Raises:
          ValueError: if an int ``sections`` does not divide the output width.
        """
        if not self.split_products:
            return jnp.split(self(x), sections, axis=-1)
        width = self.kernel.shape[1]
        if isinstance(sections, int):
            if sections < 1 or width % sections:
                raise ValueError(f"cannot split {width} output columns into {sections} blocks")
            sections = [width // sections * i for i in range(1, sections)]
        bounds = [0, *sections, width]
        w = self.kernel[...].astype(self.dtype)
        x = x.astype(self.dtype)
        return [jnp.einsum("...i,io->...o", x, w[:, a:b]) for a, b in zip(bounds[:-1], bounds[1:])]


@jax.custom_vjp
def swiglu(gate: Array, up: Array) -> Array:
    """SwiGLU's gated product ``SiLU(gate) * up = gate * sigmoid(gate) * up`` (Shazeer 2020).

    The forward is ``jax.nn.silu(gate) * up`` in the inputs' dtype (the same operations, hence
    the same bits, as the plain expression). The backward is written out, from one read of
    ``gate``, ``up`` and the cotangent, in fp32:

        d up   = dy * gate * s,    d gate = dy * up * s * (1 + gate * (1 - s)),   s = sigmoid(gate)

    rounded once to the inputs' dtypes. Autodiff of the plain expression stores ``SiLU(gate)``
    as an extra activation and runs the backward as separate elementwise passes in the compute
    dtype (2026-12-03 profile of HALO's Stage 2 on the H200: four fusions of 3.4-4.2 ms per step,
    29-30 launches each, all memory-bound, 14.4 ms of a 204 ms step); here the forward is one pass
    and the backward one pass with two outputs, and the gradients are rounded once instead of
    after each bf16 product.

    Args:
      gate, up: ``[..., F]``, the same shape, float (bf16 in mixed precision).

    Returns:
      ``[..., F]`` in ``jnp.result_type(gate, up)``.
    """
    return jax.nn.silu(gate) * up


def _swiglu_fwd(gate, up):
    return swiglu(gate, up), (gate, up)


def _swiglu_bwd(res, dy):
    gate, up = res
    g = gate.astype(jnp.float32)
    s = jax.nn.sigmoid(g)
    dy = dy.astype(jnp.float32)
    d_up = dy * g * s
    d_gate = dy * up.astype(jnp.float32) * s * (1.0 + g * (1.0 - s))
    return d_gate.astype(gate.dtype), d_up.astype(up.dtype)


swiglu.defvjp(_swiglu_fwd, _swiglu_bwd)


def swiglu_packed(h: Array) -> Array:
    """SwiGLU's gated product on the packed ``[gate; up]``: ``SiLU(h[..., :F]) * h[..., F:]``
    (Shazeer 2020).

    The same function as :func:`swiglu` on the two halves of ``fc1``'s one ``[..., 2F]``
    product: the forward is ``jax.nn.silu(gate) * up`` in ``h``'s dtype, the same bits as
    ``swiglu(h[..., :F], h[..., F:])``. The backward is :func:`swiglu`'s, written out in fp32
    from one read of ``h`` and the cotangent,

        d up   = dy * gate * s,    d gate = dy * up * s * (1 + gate * (1 - s)),   s = sigmoid(gate)

    each rounded once to ``h``'s dtype, and returned as one cotangent
    ``dh = concatenate([d gate, d up], -1)`` of ``h``'s shape, so that ``fc1``'s backward is one
    ``[.., 2F] x [2F, D]`` product and one weight product, and XLA may write both halves from
    one concatenate-rooted fusion (the split form ran ``d gate`` and ``d up`` as two fusions,
    each reading ``gate``, ``up`` and ``dy``: ``pallas_kernels/common/MOSAIC_GPU.md`` Sec. 46.2;
    whether the GPU fuses it so is the A/B of ``ModelConfig.swiglu_packed``).

    Args:
      h: ``[..., 2F]``, float (bf16 in mixed precision): ``gate = h[..., :F]``,
        ``up = h[..., F:]``.

    Returns:
      ``[..., F]`` in ``h.dtype``.

    Raises:
      ValueError: naming the shape if ``h`` has no axes or an odd last axis.
    """
    if jnp.ndim(h) < 1 or h.shape[-1] % 2:
        raise ValueError(f"swiglu_packed needs a last axis of even width 2F ([gate; up]), got "
                         f"shape {tuple(jnp.shape(h))}")
    return _swiglu_packed(h)


@jax.custom_vjp
def _swiglu_packed(h: Array) -> Array:
    f = h.shape[-1] // 2
    return jax.nn.silu(h[..., :f]) * h[..., f:]


def _swiglu_packed_fwd(h):
    return _swiglu_packed(h), h


def _swiglu_packed_bwd(h, dy):
    f = h.shape[-1] // 2
    d_gate, d_up = _swiglu_bwd((h[..., :f], h[..., f:]), dy)
    return (jnp.concatenate([d_gate, d_up], axis=-1),)


_swiglu_packed.defvjp(_swiglu_packed_fwd, _swiglu_packed_bwd)


class SwiGLU(nnx.Module):
    """SwiGLU MLP (Shazeer 2020): ``y = fc2(SiLU(gate) * up)`` with ``[gate; up] = fc1(x)``.

    ``fc1`` is one fused ``[D, 2F]`` matrix as in paper 1 §1 (Muon orthogonalises it as one
    matrix), no biases; ``fc2`` is an output projection with the scaled init.

    Args:
      d_model: ``D``.
      hidden: ``F``.
      std: init std of ``fc1``.
      out_std: init std of ``fc2``.
      rngs, dtype, param_dtype, split_products: as for :class:`Dense` (``fc1``'s gate and up
        blocks by :meth:`Dense.split`; not used for ``fc1`` when ``packed``).
      packed: form ``fc1`` as one ``[.., 2F]`` product and apply :func:`swiglu_packed` to it
        (``ModelConfig.swiglu_packed``) instead of :func:`swiglu` on its two blocks: the same
        parameters (names, shapes, init) and the same forward values; the backward returns
        one ``[.., 2F]`` cotangent for ``fc1``.
    """

    def __init__(self, d_model: int, hidden: int, *, std: float, out_std: float, rngs: nnx.Rngs,
                 dtype=jnp.float32, param_dtype=jnp.float32, split_products: bool = False,
                 packed: bool = False):
        self.hidden = hidden
        self.packed = bool(packed)
        self.fc1 = Dense(d_model, 2 * hidden, std=std, rngs=rngs, dtype=dtype,
                         param_dtype=param_dtype, split_products=split_products)
        self.fc2 = Dense(hidden, d_model, std=out_std, rngs=rngs, dtype=dtype,
                         param_dtype=param_dtype)

    def __call__(self, x: Array) -> Array:
        """``x``: ``[B, T, D]`` -> ``[B, T, D]``."""
        if self.packed:
            return self.fc2(swiglu_packed(self.fc1(x)))
        gate, up = self.fc1.split(x, 2)
        return self.fc2(swiglu(gate, up))


def rope_frequencies(head_dim: int, theta: float) -> Array:
    """Inverse frequencies ``theta^(-2i/d)``, ``i < d/2``, fp32 ``[head_dim // 2]``."""
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head dimension, got {head_dim=}")
    return 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))


def apply_rope(x: Array, positions: Array, theta: float) -> Array:
    """Rotary position embedding, non-interleaved rotate-half form (Su et al. 2021, Eq. 34).

    Args:
      x: ``[B, T, H, K]`` queries or keys, any float dtype.
      positions: int ``[B, T]`` position of each token (restarting per document when packed).
      theta: RoPE base.

    Returns:
      ``[B, T, H, K]`` in ``x.dtype``; angles are computed in fp32.
    """
    inv_freq = rope_frequencies(x.shape[-1], theta)  # [K/2]
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, K/2]
    cos = jnp.cos(angles)[:, :, None, :]  # [B, T, 1, K/2]
    sin = jnp.sin(angles)[:, :, None, :]
    # [x1, x2] -> [x1 cos - x2 sin, x2 cos + x1 sin] on a [..., 2, K/2] view: the half swap is a
    # reverse of the size-2 axis, fusible with the products, instead of split + concatenate (a
    # HALO Stage-2 step has 60 unfused `wrapped_concatenate` kernels, 8.4 ms, likely two per
    # layer from here: benchmarks/results/profile-halo-stage2-2026-12-03.md). Same values: the
    # sign flip is exact.
    halves = x.astype(jnp.float32).reshape(x.shape[:-1] + (2, x.shape[-1] // 2))
    sign = jnp.array([-1.0, 1.0], jnp.float32)[:, None]  # [2, 1]
    out = halves * cos[..., None, :] + jnp.flip(halves, axis=-2) * sign * sin[..., None, :]
    return out.reshape(x.shape).astype(x.dtype)


def positions_from_segment_ids(segment_ids: Optional[Array], batch: int, length: int,
                               offset: Optional[Array] = None) -> Array:
    """Position of every token inside its document: int32 ``[B, T]``.

    Without ``segment_ids`` positions are ``offset + arange(T)``. With them, the count restarts
    at 0 wherever ``segment_ids`` changes; the first document of a row continues from ``offset``.

    Args:
      segment_ids: optional int ``[B, T]``.
      batch: ``B``.
      length: ``T``.
      offset: optional int ``[B]`` position of the row's first token (decoding).
    """
    t = jnp.arange(length, dtype=jnp.int32)[None, :]  # [1, T]
    base = jnp.zeros((batch, 1), jnp.int32) if offset is None else offset.astype(jnp.int32)[:, None]
    if segment_ids is None:
        return jnp.broadcast_to(base + t, (batch, length))
    starts = jnp.concatenate(
        [jnp.zeros((batch, 1), bool), segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1)
    start_index = jax.lax.cummax(jnp.where(starts, t, 0), axis=1)  # [B, T]
    first_doc = start_index == 0
    return jnp.where(first_doc, base + t, t - start_index)


class ShortConv(nnx.Module):
    """Causal depthwise 1-D convolution without bias (the "short conv" of DeltaNet-style mixers).

    ``y[t, c] = sum_{i<W} w[i, c] * x[t - W + 1 + i, c]``; inputs before the start of the row (or
    of the token's document when ``segment_ids`` is given) count as zero. Init is PyTorch's
    ``nn.Conv1d`` default, ``U(-1/sqrt(W), 1/sqrt(W))`` (paper 1 §1).

    Args:
      channels: ``C`` channels convolved independently.
      width: ``W`` taps.
      rngs, dtype, param_dtype: as for :class:`Dense`.
    """

    def __init__(self, channels: int, width: int, *, rngs: nnx.Rngs, dtype=jnp.float32,
                 param_dtype=jnp.float32):
        self.width = width
        self.dtype = dtype
        bound = 1.0 / math.sqrt(width)
        self.kernel = nnx.Param(jax.random.uniform(rngs.params(), (width, channels), param_dtype,
                                                   -bound, bound))

    def check_conv_state(self, conv_state: Optional[Array], batch: int, channels: int) -> None:
        """Raises ``ValueError`` unless ``conv_state`` is ``None`` or ``[batch, W - 1,
        channels]`` (static shape only). A longer or shorter one (a state built for another
        ``conv_width``) shifted every tap onto the wrong input, silently; one with other
        channels failed inside ``jnp.concatenate``."""
        if conv_state is None:
            return
        want = (batch, self.width - 1, channels)
        if tuple(jnp.shape(conv_state)) != want:
            raise ValueError(
                f"conv_state must be [batch={batch}, conv_width - 1={self.width - 1}, "
                f"channels={channels}] (the last W - 1 inputs of the short convolution, as "
                f"init_state builds it), got {tuple(jnp.shape(conv_state))}")

    def __call__(self, x: Array, *, segment_ids: Optional[Array] = None,
                 conv_state: Optional[Array] = None,
                 activation: Optional[str] = None) -> Tuple[Array, Array]:
        """Applies the convolution (:func:`causal_conv1d`), optionally followed by SiLU.

        Args:
          x: ``[B, T, C]``.
          segment_ids: optional int ``[B, T]``; taps never reach into an earlier document.
          conv_state: optional ``[B, W - 1, C]``, the inputs preceding ``x`` (decoding).
          activation: ``None`` or ``"silu"``, applied to the sum rounded to ``dtype``.

        Returns:
          ``(y, new_conv_state)``: ``y`` is ``[B, T, C]`` in ``dtype``; ``new_conv_state`` is the
          last ``W - 1`` inputs ``[B, W - 1, C]`` for the next call.

        Raises:
          ValueError: if ``conv_state`` is not ``[B, W - 1, C]`` (:meth:`check_conv_state`), or
            for another ``activation``.
        """
        b, t, c = x.shape
        self.check_conv_state(conv_state, b, c)
        x = x.astype(self.dtype)
        if conv_state is None:
            conv_state = jnp.zeros((b, self.width - 1, c), self.dtype)
        xp = jnp.concatenate([conv_state.astype(self.dtype), x], axis=1)  # [B, W-1+T, C]
        doc = None
        if segment_ids is not None:
            # A monotone document index, so that reused ids (0, 1, 0) stay distinct documents;
            # the carried inputs continue the first token's document.
            segment_ids = validation.document_index(segment_ids)
            doc = jnp.concatenate(
                [jnp.broadcast_to(segment_ids[:, :1], (b, self.width - 1)), segment_ids], axis=1)
        y = causal_conv1d(xp, self.kernel[...].astype(self.dtype), doc, activation)
        return y, xp[:, -(self.width - 1):, :] if self.width > 1 else xp[:, :0]


class RecurrentState(NamedTuple):
    """Decoding state of a linear-attention mixer (GDN, DeltaNet, KDA, GDN-2, linear attention).

    Attributes:
      conv_state: ``[B, W - 1, C]`` in the compute dtype, the last ``W - 1`` inputs of the short
        convolution (``C`` its channels); ``None`` for a mixer without a convolution.
      recurrent: fp32 ``[B, H, K, V]`` fast-weight state ``S`` (FLA layout, ``o_t = S_t^T q_t``),
        always fp32 whatever the activation dtype.
    """

    conv_state: Optional[Array]
    recurrent: Array


# ``x * rsqrt(sum(x^2) + eps)`` over the last axis in fp32 (FLA ``l2norm``); shared with the ops.
l2_normalize = validation.l2_normalize


def carry_conv_state(conv_state: Array, segment_ids: Optional[Array]) -> Array:
    """Zeroes the carried convolution inputs that belong to an earlier document.

    :class:`~lattn_jax.layers.ShortConv` returns the last ``W - 1`` inputs of a call whatever
    their document. After a packed prefill, decoding continues the row's LAST document, so inputs
    of earlier documents must not reach it: they are set to zero, exactly as the convolution
    treats inputs before a document start.

    Args:
      conv_state: ``[B, W - 1, C]`` the inputs of times ``T - W + 1 .. T - 1`` (times before the
        call come from the incoming state and belong to the call's first document).
      segment_ids: optional int ``[B, T]`` of the call.

    Returns:
      ``[B, W - 1, C]``, same dtype.
    """
    if segment_ids is None or conv_state.shape[1] == 0:
        return conv_state
    doc = validation.document_index(segment_ids)  # [B, T]
    carried = conv_state.shape[1]
    pad = jnp.zeros((doc.shape[0], carried), doc.dtype)
    seg = jnp.concatenate([pad, doc], axis=1)[:, -carried:]  # [B, W-1]
    keep = (seg == doc[:, -1:])[..., None]  # [B, W-1, 1]
    return jnp.where(keep, conv_state, jnp.zeros_like(conv_state))


def conv_silu(conv: "ShortConv", x: Array, segment_ids: Optional[Array],
              conv_state: Optional[Array]) -> Tuple[Array, Array]:
    """Short causal convolution followed by SiLU (FLA ``causal_conv1d(activation="silu")``).

    Args:
      conv: the depthwise convolution.
      x: ``[B, T, C]``.
      segment_ids: optional int ``[B, T]``; taps never cross a document start.
      conv_state: optional ``[B, W - 1, C]`` inputs preceding ``x``; they continue the call's first
        document.

    Returns:
      ``(SiLU(conv(x)), new_conv_state)``; the new state holds the last ``W - 1`` inputs of the
      row's last document (earlier documents zeroed, :func:`carry_conv_state`).
    """
    # Under context parallelism each shard receives its halo from the previous shard.
    y, new_conv_state = context_parallel.short_conv(conv, x, segment_ids, conv_state,
                                                    activation="silu")
    return y, carry_conv_state(new_conv_state, segment_ids)


def check_mixer_input(x: Array, d_model: int, segment_ids: Optional[Array] = None) -> None:
    """Checks a mixer's inputs up front (static shapes only: free under ``jit``).

    Args:
      x: should be ``[B, T, d_model]``.
      d_model: the model width the mixer was built for.
      segment_ids: ``None``, or should be ``[B, T]`` like ``x``.

    Raises:
      ValueError: ``"x must be [batch, seq_len, d_model=512], got (2, 16, 513)"`` on a wrong
        width (``"... d_model=512] (rank 3), got shape (2, 16)"`` on a wrong rank), or
        ``"segment_ids must be [batch=2, seq_len=16] like x, got (2, 15)"``, or ``"x must
        have a floating dtype (activations, not token ids), got x.dtype=int32"``, or ``"x must
        hold at least one row and one token [batch, seq_len, d_model=512], got shape (2, 0,
        512)"``, or ``"segment_ids must have an integer dtype, got segment_ids.dtype=float32"``.
    """
    validation.check_shape("x", x, (None, None, d_model), axes=("batch", "seq_len", "d_model"))
    if 0 in tuple(jnp.shape(x))[:2]:  # (was an error naming an internal q, or an empty y)
        raise ValueError(f"x must hold at least one row and one token [batch, seq_len, "
                         f"d_model={d_model}], got shape {tuple(jnp.shape(x))}")
    if not jnp.issubdtype(jnp.result_type(x), jnp.floating):
        raise ValueError(f"x must have a floating dtype (activations, not token ids), got "
                         f"x.dtype={jnp.result_type(x)}")
    check_segment_ids(segment_ids, jnp.shape(x)[:2], "x")


def check_segment_ids(segment_ids: Optional[Array], batch_time: Tuple[int, int],
                      like: str) -> None:
    """Raises ``ValueError`` unless ``segment_ids`` is ``None`` or has the shape ``batch_time``
    (``[B, T]`` of the argument named ``like``) and an integer dtype (the linear kernels' check,
    :func:`~pallas_kernels.common.validation.check_segment_ids_dtype`); static shapes and
    dtypes only."""
    if segment_ids is None:
        return
    b, t = batch_time
    shape = tuple(jnp.shape(segment_ids))
    if shape != (b, t):
        raise ValueError(f"segment_ids must be [batch={b}, seq_len={t}] like {like}, got {shape}")
    validation.check_segment_ids_dtype(segment_ids)


def check_init_state_batch(batch) -> None:
    """Raises ``ValueError`` unless ``batch`` (the ``B`` of an ``init_state``) is a positive
    integer (a Python or NumPy int, not a bool): ``"init_state: batch=0; expected a positive
    integer (rows)"``."""
    if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
        raise ValueError(f"init_state: batch={batch!r}; expected a positive integer (rows)")


def check_state_batch(state: Optional[NamedTuple], batch: int) -> None:
    """Raises ``ValueError`` if ``state`` was built for a different batch size."""
    if state is None:
        return
    leaves = [leaf for leaf in jax.tree_util.tree_leaves(state) if jnp.ndim(leaf) >= 1]
    for leaf in leaves:
        if leaf.shape[0] != batch:
            raise ValueError(f"the state was built for batch {leaf.shape[0]}, but x has batch "
                             f"{batch}; build it with init_state({batch})")


def zero_recurrent_state(cfg, batch: int, conv_dtype, *, conv: bool = True) -> RecurrentState:
    """The zero decoding state of a delta-rule / linear-attention mixer.

    Args:
      cfg: a mixer config with ``num_k_heads``, ``num_v_heads``, ``head_k_dim``, ``head_v_dim``
        and ``conv_width`` (GDN, DeltaNet, KDA, GDN-2, linear attention).
      batch: ``B``.
      conv_dtype: dtype of the convolution state (the compute dtype).
      conv: whether the mixer has a short convolution over [q; k; v].

    Returns:
      ``RecurrentState(conv_state [B, W - 1, 2 HK K + H V] or None, recurrent fp32 [B, H, K, V])``.
    """
    channels = 2 * cfg.num_k_heads * cfg.head_k_dim + cfg.num_v_heads * cfg.head_v_dim
    conv_state = None
    if conv:
        conv_state = jnp.zeros((batch, cfg.conv_width - 1, channels), conv_dtype)
    recurrent = jnp.zeros((batch, cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim), jnp.float32)
    return RecurrentState(conv_state=conv_state, recurrent=recurrent)


def split_qkv_heads(qkv: Array, cfg) -> Tuple[Array, Array, Array]:
    """Splits the convolved ``[q; k; v]`` channels into heads and L2-normalises q and k.

    Args:
      qkv: ``[B, T, 2 HK K + H V]``.
      cfg: a mixer config as for :func:`zero_recurrent_state`.

    Returns:
      ``q, k``: ``[B, T, HK, K]`` (unit norm per head, FLA ``l2norm``); ``v``: ``[B, T, H, V]``.
    """
    b, t, _ = qkv.shape
    qk_dim = cfg.num_k_heads * cfg.head_k_dim
    q, k, v = jnp.split(qkv, [qk_dim, 2 * qk_dim], axis=-1)
    q = l2_normalize(q.reshape(b, t, cfg.num_k_heads, cfg.head_k_dim))  # [B, T, HK, K]
    k = l2_normalize(k.reshape(b, t, cfg.num_k_heads, cfg.head_k_dim))  # [B, T, HK, K]
    v = v.reshape(b, t, cfg.num_v_heads, cfg.head_v_dim)  # [B, T, H, V]
    return q, k, v
