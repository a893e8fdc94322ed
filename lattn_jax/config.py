"""Typed, frozen, validated configuration for models, optimisation and training runs.

Experiment files in ``configs/`` return ``ml_collections.ConfigDict`` objects (so that every value
can be overridden from the command line with ``--config.model.d_model=256``). At the boundary,
:func:`experiment_from_config_dict` turns that ConfigDict into the frozen dataclasses below, which
validate themselves in ``__post_init__``; library modules only ever see these dataclasses.

Every validation error is a ``ValueError`` whose message names the offending option by its full
dotted path (for example ``model.attention.num_heads``).
"""

import dataclasses
import math
import numbers
import os
import sys
import typing
from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np

from lattn_jax.data.config import DataConfig
# The command-line error helpers live in a light module (absl only); binaries and tests use them
# as config.parse_flags and friends.
from lattn_jax.flag_errors import (  # noqa: F401
    bare_tuple_override, ConfigArgumentError, describe_config_file_error,
    describe_config_load_error, describe_flag_error, parse_flags, reject_arguments,
    repeated_tuple_override, TUPLE_OPTIONS)

# Names a layer pattern may use. The mapping from name to module lives in
# ``lattn_jax.mixers.REGISTRY``; it is checked against this tuple when the package is imported.
MIXER_NAMES: Tuple[str, ...] = (
    "attn", "gdn", "deltanet", "kda", "gdn2", "lightning", "linear_attn", "attn_nope")

# Mixer names that are softmax attention layers (configured by ``ModelConfig.attention``).
ATTENTION_MIXERS: Tuple[str, ...] = ("attn", "attn_nope")

# Mixers that emit the cross-layer routing signal (spec §4.1, §10 item 16: only GDN and DeltaNet
# have ``supports_cler``; KDA, GDN-2 and linear attention cannot route).
ROUTABLE_MIXERS: Tuple[str, ...] = ("gdn", "deltanet")

# Cross-layer routing modes (``ModelConfig.routing.mode``), spec §4.2-4.3:
#   "none";  "cler": value-space CLER, v_l <- v_l + Gamma_l r_{p(l)};
#   "cler_h": P_l(r_l) into the residual stream;  "clvr": P_l(v_l) into the residual stream;
#   "error_value": P_l([r_l; v_l]) (CLER-RV);  "surprise_gate": P_l(v_l * sigmoid(a s + b))
#   (CLER-G);  "hidden_state": P_l(h_{l+1}) (the self-transform capacity control).
ROUTING_MODES: Tuple[str, ...] = (
    "none", "cler", "cler_h", "clvr", "error_value", "surprise_gate", "hidden_state")

# Modes that add a projection P_l of a per-layer signal to the residual stream (spec §4.3).
HIDDEN_ROUTING_MODES: Tuple[str, ...] = (
    "cler_h", "clvr", "error_value", "surprise_gate", "hidden_state")

_DTYPES = ("float32", "bfloat16", "float16")

# Rematerialisation policies by name (``ModelConfig.remat_policy``), resolved to
# ``jax.checkpoint_policies`` in ``lattn_jax.model``: what a rematerialised block keeps from its
# forward pass. "nothing_saveable" is full recompute (least memory); "dots_saveable" keeps every
# matmul output; "dots_with_no_batch_dims_saveable" keeps the projection outputs only (MaxText's
# "minimal" policy); "everything_saveable" is remat in name only (for A/B timing).
REMAT_POLICIES: Tuple[str, ...] = (
    "nothing_saveable", "dots_saveable", "dots_with_no_batch_dims_saveable",
    "everything_saveable")

# How the model's RMSNorms run (``ModelConfig.norm_implementation``, ``lattn_jax.layers.RMSNorm``):
# XLA, the one-pass Pallas GPU kernels, or those kernels in Pallas interpret mode (tests).
NORM_IMPLEMENTATIONS: Tuple[str, ...] = ("xla", "pallas", "pallas_interpret")

# What the train loop does when a step's loss or gradient norm is NaN/inf (``TrainConfig``).
NONFINITE_POLICIES: Tuple[str, ...] = ("stop", "skip")

# Mesh axis names, outermost first: data parallel, fully-sharded data parallel (parameters and
# optimizer state sharded, batch sharded too), context parallel (the sequence axis of the
# activations; ``lattn_jax.context_parallel``), tensor parallel (heads / MLP hidden / vocabulary).
MESH_AXES: Tuple[str, ...] = ("data", "fsdp", "context", "tensor")

# The logical -> mesh axis rules (STYLE item 14, MaxText ``logical_axis_rules``): every parameter
# and every constrained activation names its dimensions with the logical names on the left
# (``lattn_jax.sharding``); each maps to a mesh axis, a tuple of mesh axes, or ``None``
# (replicated). A dimension whose size the mesh axes do not divide stays replicated.
DEFAULT_AXIS_RULES: Tuple[Tuple[str, Any], ...] = (
    # parameters
    ("vocab", "tensor"),        # S of the embedding and the LM head
    ("embed", "fsdp"),          # D of every projection (FSDP shards the parameters along D)
    ("mlp", "tensor"),          # F of the SwiGLU MLP
    ("heads", "tensor"),        # fused per-head widths of the mixers' projections
    ("rank", None),             # low-rank bottlenecks (KDA/GDN-2 gates, routing)
    ("conv_width", None),       # W of the short convolutions
    ("vector", None),           # norm scales, biases, per-head decay parameters, gains
    # activations
    ("act_batch", ("data", "fsdp")),
    ("act_len", "context"),     # T of every activation (context parallelism)
    ("act_embed", None),
    ("act_heads", "tensor"),
    ("act_vocab", "tensor"),
)


class ConfigError(ValueError):
    """An invalid or inconsistent option; the message names it by its dotted path."""


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


def _require_bound(option: str, value: Any, bound: float = 0.0, *, strict: bool = True,
                   none_ok: bool = False) -> None:
    """Checks a float option that must be a finite number above ``bound`` (``> bound``, or
    ``>= bound`` when not ``strict``); ``None`` passes when ``none_ok``.

    A bare ``value > 0`` lets ``inf`` through (a learning rate of ``inf`` trained until the NaN
    guard stopped it at step 2); ``nan`` fails every comparison, so it was already refused.

    Args:
      option: the dotted option name the message names (``optim.learning_rate``).
      value: the value (a number, or ``None``).
      bound: the lower bound.
      strict: ``True``: ``value > bound``; ``False``: ``value >= bound``.
      none_ok: whether ``None`` is allowed (and named in the message).

    Raises:
      ConfigError: ``optim.learning_rate must be a finite number > 0, got inf`` for a value
        that is not a finite number, ``optim.learning_rate must be > 0, got -1.0`` for one
        below the bound (``... or None`` where ``None`` is allowed).
    """
    if value is None and none_ok:
        return
    op = ">" if strict else ">="
    tail = " or None" if none_ok else ""
    finite = (isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))
              and math.isfinite(float(value)))
    _require(finite, f"{option} must be a finite number {op} {bound:g}{tail}, got {value!r}")
    _require(value > bound if strict else value >= bound,
             f"{option} must be {op} {bound:g}{tail}, got {value}")


_STACKS = ("pure", "hybrid", "dense")


def stack_pattern(stack: str, num_layers: int, linear: Optional[str] = None, *,
                  attention_freq: int = 3, attention: str = "attn") -> Tuple[str, ...]:
    """The per-layer mixer names of a pure, hybrid or dense stack (spec §3).

    ``hybrid`` follows the authors' ``get_linear_attention_pattern`` with integer
    ``--linear-attention-freq N``: layer ``i`` (0-based) is softmax iff ``(i + 1) % N == 0``, so
    ``N = 3`` gives ``[lin, lin, attn]`` repeated (2 linear : 1 softmax; softmax at 2, 5, 8, ...)
    and the 20-layer stack ends with a linear layer. ``pure`` is ``[linear] * L`` and ``dense``
    ``[attention] * L``. Any other stack is an explicit ``ModelConfig.layer_pattern``.

    Args:
      stack: ``"pure"``, ``"hybrid"`` or ``"dense"``.
      num_layers: ``L >= 1``.
      linear: the linear mixer name (required for ``pure`` and ``hybrid``).
      attention_freq: ``N >= 2`` of the hybrid stack.
      attention: the softmax mixer name (``"attn"`` or ``"attn_nope"``).

    Returns:
      A tuple of ``L`` mixer names.

    Raises:
      ConfigError: on an unknown stack, ``L < 1``, ``N < 2`` or a missing/unknown mixer name.
    """
    _require(stack in _STACKS, f"model stack={stack!r}; choose from {', '.join(_STACKS)}")
    _require(num_layers >= 1, f"model num_layers must be >= 1, got {num_layers}")
    _require(attention in ATTENTION_MIXERS,
             f"model attention mixer={attention!r}; choose from {', '.join(ATTENTION_MIXERS)}")
    if stack == "dense":
        return (attention,) * num_layers
    _require(linear in MIXER_NAMES and linear not in ATTENTION_MIXERS,
             f"model linear mixer={linear!r} is not a linear mixer; choose from "
             f"{', '.join(n for n in MIXER_NAMES if n not in ATTENTION_MIXERS)}")
    if stack == "pure":
        return (linear,) * num_layers
    _require(attention_freq >= 2, f"model attention_freq must be >= 2, got {attention_freq}")
    return tuple(attention if (i + 1) % attention_freq == 0 else linear
                 for i in range(num_layers))


ATTENTION_IMPLEMENTATIONS = ("auto", "xla", "cudnn")


@dataclasses.dataclass(frozen=True, kw_only=True)
class AttentionConfig:
    """Causal softmax attention (Transformer++ layers and the softmax layers of hybrids).

    Attributes:
      num_heads: query heads ``H``.
      num_kv_heads: key/value heads ``G`` (GQA; ``H % G == 0``). Equal to ``num_heads`` for MHA.
      head_dim: per-head width; ``None`` means ``d_model // num_heads`` (which must divide).
      rope_theta: RoPE base (paper 1: 5e5, non-interleaved rotate-half); ``None`` disables RoPE.
      output_gate: elementwise sigmoid gate on the attention output before the out projection
        (paper 1 §2.5: on in GDN / GDN-2 hybrids only).
      qk_norm: RMSNorm on q and k per head before RoPE.
      logit_scaling_base: HypeNet's position-dependent logit scaling (arXiv 2601.22156; spec
        ``hypenet-halo.md`` §1.6 item 4): ``q_t <- s_t q_t`` with ``s_t = log_a(t + a) =
        ln(t + a) / ln(a)``, ``t`` the 0-based position of the query inside its document and
        ``a`` this value (HypeNet-2B: 500 at inference). ``None`` (the default, and HypeNet's
        training setting) disables it. Must be ``> 1``.
      implementation: the attention kernel of the training path and of a prefill that starts a
        cache: ``"auto"`` (cuDNN flash attention on a GPU when the compute dtype is bf16/fp16
        and the head dim is a multiple of 8 up to 256, XLA otherwise), ``"xla"`` (XLA's fused
        softmax over the materialised ``[B, H, T, T]`` logits) or ``"cudnn"`` (flash attention;
        raises on another backend or dtype). Decoding steps with a cache always use XLA.

    Layers named ``"attn_nope"`` in ``ModelConfig.layer_pattern`` use these settings without RoPE
    (NoPE), so RoPE and NoPE softmax layers can be mixed per layer.
    """

    num_heads: int = 4
    num_kv_heads: int = 4
    head_dim: Optional[int] = None
    rope_theta: Optional[float] = 500_000.0
    output_gate: bool = False
    qk_norm: bool = False
    logit_scaling_base: Optional[float] = None
    implementation: str = "auto"

    def __post_init__(self):
        _require(
            self.implementation in ATTENTION_IMPLEMENTATIONS,
            f"model.attention.implementation={self.implementation!r}; choose from "
            f"{', '.join(ATTENTION_IMPLEMENTATIONS)}",
        )
        _require(self.num_heads >= 1,
                 f"model.attention.num_heads must be >= 1, got {self.num_heads}")
        _require(
            self.num_kv_heads >= 1 and self.num_heads % self.num_kv_heads == 0,
            f"model.attention.num_heads={self.num_heads} must be a multiple of "
            f"model.attention.num_kv_heads={self.num_kv_heads}",
        )
        _require(
            self.head_dim is None or self.head_dim >= 1,
            f"model.attention.head_dim must be >= 1, got {self.head_dim}",
        )
        _require_bound("model.attention.rope_theta", self.rope_theta, none_ok=True)
        _require_bound("model.attention.logit_scaling_base", self.logit_scaling_base, 1,
                       none_ok=True)


# Gated DeltaNet / DeltaNet: "pallas" forces the Triton kernels, "mosaic_gpu" the Mosaic GPU
# kernels (Hopper; "auto" picks them for Gated DeltaNet where they can run, not yet for
# DeltaNet: pallas_kernels.common.mosaic_gpu.AUTO_OFF).
_DELTA_IMPLEMENTATIONS = ("auto", "chunked", "reference", "pallas", "mosaic_gpu")


@dataclasses.dataclass(frozen=True, kw_only=True)
class GatedDeltaNetConfig:
    """Gated DeltaNet mixer (paper 1 §3.3, spec §2.1).

    Attributes:
      num_k_heads: query/key heads ``HK``.
      num_v_heads: value heads ``H`` (GVA: a multiple of ``num_k_heads``).
      head_k_dim: ``K`` per key head.
      head_v_dim: ``V`` per value head.
      conv_width: short causal depthwise convolution width ``W`` over [q; k; v].
      chunk_size: chunk length ``C`` of the chunked (WY/UT) form; a power of two.
      implementation: op implementation (``"auto"``, ``"chunked"``, ``"reference"``,
        ``"pallas"``: the Pallas Triton GPU kernels, or ``"mosaic_gpu"``: the Pallas Mosaic GPU
        kernels for Hopper; either an error naming the reason where it cannot run).
      norm_eps: epsilon of the per-head output RMSNorm.
    """

    num_k_heads: int = 4
    num_v_heads: int = 8
    head_k_dim: int = 64
    head_v_dim: int = 64
    conv_width: int = 4
    chunk_size: int = 64
    implementation: str = "auto"
    norm_eps: float = 1e-5

    def __post_init__(self):
        for name in ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim", "conv_width"):
            value = getattr(self, name)
            _require(value >= 1, f"model.gdn.{name} must be >= 1, got {value}")
        _require(
            self.num_v_heads % self.num_k_heads == 0,
            f"model.gdn.num_v_heads={self.num_v_heads} must be a multiple of "
            f"model.gdn.num_k_heads={self.num_k_heads}",
        )
        c = self.chunk_size
        _require(
            c >= 1 and c & (c - 1) == 0,
            f"model.gdn.chunk_size must be a positive power of two, got {c}",
        )
        _require(
            self.implementation in _DELTA_IMPLEMENTATIONS,
            f"model.gdn.implementation={self.implementation!r}; choose from "
            f"{', '.join(_DELTA_IMPLEMENTATIONS)}",
        )


def _check_linear_mixer(cfg, section: str, implementations: Tuple[str, ...],
                        min_conv_width: int = 1) -> None:
    """Validation shared by the linear-attention mixer sections (``model.<section>.*``)."""
    for name in ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim"):
        value = getattr(cfg, name)
        _require(value >= 1, f"model.{section}.{name} must be >= 1, got {value}")
    _require(
        cfg.conv_width >= min_conv_width,
        f"model.{section}.conv_width must be >= {min_conv_width}, got {cfg.conv_width}",
    )
    _require(
        cfg.num_v_heads % cfg.num_k_heads == 0,
        f"model.{section}.num_v_heads={cfg.num_v_heads} must be a multiple of "
        f"model.{section}.num_k_heads={cfg.num_k_heads}",
    )
    c = cfg.chunk_size
    _require(
        c >= 1 and c & (c - 1) == 0,
        f"model.{section}.chunk_size must be a positive power of two, got {c}",
    )
    _require(
        cfg.implementation in implementations,
        f"model.{section}.implementation={cfg.implementation!r}; choose from "
        f"{', '.join(implementations)}",
    )
    _require_bound(f"model.{section}.norm_eps", cfg.norm_eps)


def _check_dt_init(cfg, section: str) -> None:
    """Validation of the Mamba-style ``dt_bias`` initialisation range (KDA, GDN-2)."""
    _require(
        0 < cfg.dt_min <= cfg.dt_max,
        f"model.{section}.dt_min={cfg.dt_min} and model.{section}.dt_max={cfg.dt_max} must "
        f"satisfy 0 < dt_min <= dt_max",
    )
    _require_bound(f"model.{section}.dt_max", cfg.dt_max)
    _require_bound(f"model.{section}.dt_floor", cfg.dt_floor)
    _require(
        cfg.gate_rank is None or cfg.gate_rank >= 1,
        f"model.{section}.gate_rank must be >= 1 or None, got {cfg.gate_rank}",
    )


# "pallas" forces the Pallas GPU kernel (an error naming the reason where it cannot run);
# "auto" picks it where supported (for KDA/GDN-2 gated by common.channelwise_gpu.AUTO_SELECT, on).
_CHANNEL_IMPLEMENTATIONS = ("auto", "chunked", "reference", "associative_scan", "pallas")
# The scalar-decay ops (simple GLA / Lightning / linear attention) also have Mosaic GPU kernels
# (Hopper): "mosaic_gpu" forces them; "auto" picks them on Hopper (common.mosaic_gpu).
_SCALAR_IMPLEMENTATIONS = _CHANNEL_IMPLEMENTATIONS + ("mosaic_gpu",)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DeltaNetConfig:
    """DeltaNet mixer (paper 1 Eq. 14, spec §2.2): delta rule without decay, no output gate.

    The authors' config requires ``num_v_heads == num_k_heads`` (spec §2.2); we also allow GVA
    (``num_v_heads`` a multiple of ``num_k_heads``) since the op supports it.

    Attributes:
      num_k_heads: query/key heads ``HK`` (350M: 4).
      num_v_heads: value heads ``H`` (350M: 4).
      head_k_dim: ``K`` (350M: 64).
      head_v_dim: ``V`` (350M: 128).
      conv_width: short causal depthwise convolution width ``W`` over [q; k; v].
      chunk_size: chunk length ``C`` of the chunked (WY/UT) form; a power of two.
      implementation: op implementation (``"auto"``, ``"chunked"``, ``"reference"``,
        ``"pallas"``: the Pallas Triton GPU kernels, or ``"mosaic_gpu"``: the Pallas Mosaic GPU
        kernels for Hopper; either an error naming the reason where it cannot run).
      norm_eps: epsilon of the per-head output RMSNorm.
    """

    num_k_heads: int = 4
    num_v_heads: int = 4
    head_k_dim: int = 64
    head_v_dim: int = 128
    conv_width: int = 4
    chunk_size: int = 64
    implementation: str = "auto"
    norm_eps: float = 1e-5

    def __post_init__(self):
        _check_linear_mixer(self, "deltanet", _DELTA_IMPLEMENTATIONS)


@dataclasses.dataclass(frozen=True, kw_only=True)
class KDAConfig:
    """Kimi Delta Attention mixer (paper 1 Eqs. 18-20, spec §2.4): per-key-channel decay.

    Attributes:
      num_k_heads: query/key heads ``HK`` (350M: 4).
      num_v_heads: value heads ``H`` (350M: 8; a multiple of ``num_k_heads``).
      head_k_dim: ``K`` (350M: 64).
      head_v_dim: ``V`` (350M: 64).
      conv_width: short convolution width ``W`` over [q; k; v].
      chunk_size: chunk length ``C`` of the chunked form; a power of two.
      implementation: ``"auto"``, ``"chunked"``, ``"reference"``, ``"associative_scan"`` or
        ``"pallas"`` (the Pallas GPU kernel; an error naming the reason where it cannot run).
      norm_eps: epsilon of the per-head output RMSNorm.
      gate_rank: width of the low-rank gate trunk (``bottleneck_proj`` ``D -> 2 r``); ``None``
        means ``head_v_dim`` as in the authors' code.
      dt_min, dt_max, dt_floor: Mamba ``dt`` init range of ``dt_bias`` (``dt ~ exp(U(log dt_min,
        log dt_max))`` clamped at ``dt_floor``; ``dt_bias = softplus^-1(dt)``).
    """

    num_k_heads: int = 4
    num_v_heads: int = 8
    head_k_dim: int = 64
    head_v_dim: int = 64
    conv_width: int = 4
    chunk_size: int = 64
    implementation: str = "auto"
    norm_eps: float = 1e-5
    gate_rank: Optional[int] = None
    dt_min: float = 1e-3
    dt_max: float = 1e-1
    dt_floor: float = 1e-4

    def __post_init__(self):
        _check_linear_mixer(self, "kda", _CHANNEL_IMPLEMENTATIONS)
        _check_dt_init(self, "kda")


@dataclasses.dataclass(frozen=True, kw_only=True)
class GDN2Config:
    """Gated DeltaNet-2 mixer (paper 1 Eqs. 21-24, spec §2.6, the v2 low-rank f/g layout).

    Attributes:
      num_k_heads: query/key heads ``HK`` (350M: 4).
      num_v_heads: value heads ``H`` (350M: 8; a multiple of ``num_k_heads``).
      head_k_dim: ``K`` (350M: 64).
      head_v_dim: ``V`` (350M: 64).
      conv_width: short convolution width ``W`` over [q; k; v].
      chunk_size: chunk length ``C`` of the chunked form; a power of two.
      implementation: ``"auto"``, ``"chunked"``, ``"reference"``, ``"associative_scan"`` or
        ``"pallas"`` (the Pallas GPU kernel; an error naming the reason where it cannot run).
      norm_eps: epsilon of the per-head output RMSNorm.
      gate_rank: rank of the low-rank decay (``f_proj``) and output-gate (``g_proj``)
        projections; ``None`` means ``head_v_dim`` as in the authors' v2 code.
      dt_min, dt_max, dt_floor: Mamba ``dt`` init range of ``dt_bias`` (as :class:`KDAConfig`).
    """

    num_k_heads: int = 4
    num_v_heads: int = 8
    head_k_dim: int = 64
    head_v_dim: int = 64
    conv_width: int = 4
    chunk_size: int = 64
    implementation: str = "auto"
    norm_eps: float = 1e-5
    gate_rank: Optional[int] = None
    dt_min: float = 1e-3
    dt_max: float = 1e-1
    dt_floor: float = 1e-4

    def __post_init__(self):
        _check_linear_mixer(self, "gdn2", _CHANNEL_IMPLEMENTATIONS)
        _check_dt_init(self, "gdn2")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LinearAttentionConfig:
    """Plain (additive) linear attention: spec §2.3 "Linear Transformer", paper 1 Eqs. 4-10.

    The shell is DeltaNet's (spec §2.2): fused ``[q | k | v (| beta)]`` projection, short conv +
    SiLU, L2-normalised q and k, ``1/sqrt(K)`` scale, per-head output RMSNorm, no gate; the rule
    is ``S_t = S_{t-1} + k_t v_t^T`` with no decay and no normaliser.

    Attributes:
      num_k_heads: query/key heads ``HK``.
      num_v_heads: value heads ``H`` (a multiple of ``num_k_heads``).
      head_k_dim: ``K``.
      head_v_dim: ``V``.
      conv_width: short convolution width ``W``; ``0`` disables the convolution (and its state).
      chunk_size: chunk length ``C`` of the chunked form; a power of two.
      implementation: ``"auto"``, ``"chunked"``, ``"reference"``, ``"associative_scan"``,
        ``"pallas"`` (the Pallas Triton GPU kernels) or ``"mosaic_gpu"`` (the Pallas Mosaic GPU
        kernels for Hopper); either an error naming the reason where it cannot run.
      norm_eps: epsilon of the per-head output RMSNorm.
      dead_beta_proj: keep the authors' unused beta rows (``H`` columns) in the input projection
        so parameter counts match spec §3 (spec §10 item 14: dead parameters, zero gradient).
    """

    num_k_heads: int = 4
    num_v_heads: int = 4
    head_k_dim: int = 64
    head_v_dim: int = 128
    conv_width: int = 4
    chunk_size: int = 64
    implementation: str = "auto"
    norm_eps: float = 1e-5
    dead_beta_proj: bool = True

    def __post_init__(self):
        _check_linear_mixer(self, "linear_attn", _SCALAR_IMPLEMENTATIONS, min_conv_width=0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LightningConfig:
    """HypeNet's Lightning Attention mixer (arXiv 2601.22156; spec ``hypenet-halo.md`` §1.5).

    ``S_t = gamma_h S_{t-1} + k_t v_t^T``, ``o_t = scale S_t^T q_t`` with the fixed ALiBi decays
    ``gamma_h = exp(-2^(-8 (h + 1) / H))``, QK RMSNorm, RoPE on q and k (HyPE), an RMSNorm over
    all heads jointly and a sigmoid output gate.

    Attributes:
      num_heads: query heads ``H`` (HypeNet-2B: 16).
      num_kv_heads: key/value heads (GQA, repeated to ``H``; HypeNet: equal to ``num_heads``).
      head_dim: per-head width; ``None`` means ``d_model // num_heads`` (which must divide).
      rope_theta: RoPE base on q and k (HypeNet: 1e6); ``None`` disables RoPE.
      qk_norm: per-head RMSNorm on q and k before RoPE (HypeNet: on).
      output_norm: RMSNorm over the concatenated heads before the gate (HypeNet: on).
      output_gate: ``o <- o * sigmoid(x W_z)`` before the output projection (HypeNet: on).
      scale: read-out scale: ``"1/sqrt(d)"`` (HypeNet, ``head_dim ** -0.5``), ``"1/d"`` or
        ``"1"``.
      conv_width: short causal depthwise conv + SiLU over [q; k; v] after the projections;
        ``0`` (HypeNet) disables it.
      chunk_size: chunk length ``C`` of the chunked form; a power of two.
      implementation: ``"auto"``, ``"chunked"``, ``"reference"``, ``"associative_scan"``,
        ``"pallas"`` (the Pallas Triton GPU kernels) or ``"mosaic_gpu"`` (the Pallas Mosaic GPU
        kernels for Hopper); either an error naming the reason where it cannot run.
      alibi_max_bias: the ``b`` of the decays ``gamma_h = exp(-2^(-b (h + 1) / H))`` (HypeNet
        and ALiBi: 8; the longest half-life is then ``ln 2 * 2^b`` = 177 tokens for a
        power-of-two ``H``). Other values are an ablation outside the spec
        (``pallas_kernels.simple_gla.lightning_log_decay``).
    """

    num_heads: int = 4
    num_kv_heads: int = 4
    head_dim: Optional[int] = None
    rope_theta: Optional[float] = 1_000_000.0
    qk_norm: bool = True
    output_norm: bool = True
    output_gate: bool = True
    scale: str = "1/sqrt(d)"
    conv_width: int = 0
    chunk_size: int = 64
    implementation: str = "auto"
    alibi_max_bias: float = 8.0

    def __post_init__(self):
        _require(
            self.num_heads >= 1, f"model.lightning.num_heads must be >= 1, got {self.num_heads}")
        _require(
            not isinstance(self.alibi_max_bias, (bool, np.bool_))
            and isinstance(self.alibi_max_bias, numbers.Real)
            and math.isfinite(float(self.alibi_max_bias))
            and 0 < float(self.alibi_max_bias) < 149,
            f"model.lightning.alibi_max_bias must be a number in (0, 149) (above, the slowest "
            f"decay 2^-b rounds to none in fp32), got {self.alibi_max_bias!r}")
        _require(
            self.num_kv_heads >= 1 and self.num_heads % self.num_kv_heads == 0,
            f"model.lightning.num_heads={self.num_heads} must be a multiple of "
            f"model.lightning.num_kv_heads={self.num_kv_heads}",
        )
        _require(
            self.head_dim is None or self.head_dim >= 1,
            f"model.lightning.head_dim must be >= 1, got {self.head_dim}",
        )
        _require_bound("model.lightning.rope_theta", self.rope_theta, none_ok=True)
        _require(
            self.scale in ("1/sqrt(d)", "1/d", "1"),
            f"model.lightning.scale={self.scale!r}; choose 1/sqrt(d), 1/d or 1",
        )
        _require(
            self.conv_width >= 0,
            f"model.lightning.conv_width must be >= 0, got {self.conv_width}",
        )
        c = self.chunk_size
        _require(
            c >= 1 and c & (c - 1) == 0,
            f"model.lightning.chunk_size must be a positive power of two, got {c}",
        )
        _require(
            self.implementation in _SCALAR_IMPLEMENTATIONS,
            f"model.lightning.implementation={self.implementation!r}; choose from "
            f"{', '.join(_SCALAR_IMPLEMENTATIONS)}",
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class RoutingConfig:
    """Cross-layer routing (paper 1 §4, Eqs. 25-29; spec §4.1-4.4).

    Every GDN/DeltaNet layer ``l`` emits ``r_l`` (the op's residual ``u_t = beta_t (v_t -
    alpha_t S_{t-1}^T k_t)``, decay-adjusted and beta-scaled, spec §4.1 / §10 item 1) and ``v_l``
    (the post-conv SiLU value, spec §10 item 2). Softmax layers pass everything on.

    Attributes:
      mode: one of ``ROUTING_MODES``:
        ``"cler"`` value-space CLER (spec §4.2, "latest" routing with carry-through):
        ``v_l <- v_l + Gamma_l * norm?(r_{p(l)})`` before the kernel, ``p(l)`` the nearest
        lower routing layer (the first one receives nothing);
        ``"cler_h"`` / ``"clvr"`` (CLER-V): ``h_{l+1} <- Block_l(h_l) + P_l vec(s_l)`` with
        ``s_l = r_l`` / ``v_l``, after the layer's MLP residual add (spec §4.3, §10 item 3);
        ``"error_value"`` (CLER-RV) ``s_l = [r_l; v_l]`` per head; ``"surprise_gate"`` (CLER-G)
        ``s_l = v_l * sigmoid(a_l ||r_h|| / (||v_h|| + 1e-6) + b_l)``; ``"hidden_state"``
        (self-transform control) ``s_l = h_{l+1}``.
      gamma_mode: shape of ``Gamma_l`` for ``"cler"``: ``"scalar"`` (0-D), ``"head"`` ``[H]`` or
        ``"channel"`` ``[H, V]`` (``--cler-gamma-mode``).
      gamma_init: initial value of every ``Gamma_l`` entry (``--cler-gamma-init``, 0.0).
      normalize_residual: ``"cler"`` only: ``r <- r rsqrt(mean_V r^2 + 1e-6)`` per head
        (``--cler-normalize-residual``).
      rank: rank of ``P_l``; ``None`` is full rank (one zero-initialised ``[in, D]`` matrix),
        ``r`` gives ``P_l = U_l D_l`` with ``U_l: [in, r]`` PyTorch-default initialised and
        ``D_l: [r, D]`` zero-initialised (product zero, gradient of ``D_l`` not).
      normalize_input: ``"cler_h"``/``"clvr"`` only: ``s <- s rsqrt(mean(s^2) + 1e-6)`` over
        the flattened ``H V`` vector (``--cler-hidden-normalize-input``).
      attn_res: Full Attention Residuals (spec §4.4): every sub-layer input is a softmax-weighted
        mix of all previous sub-layer contributions with zero-initialised pseudo-queries.
    """

    mode: str = "none"
    gamma_mode: str = "scalar"
    gamma_init: float = 0.0
    normalize_residual: bool = False
    rank: Optional[int] = None
    normalize_input: bool = False
    attn_res: bool = False

    def __post_init__(self):
        _require(self.mode in ROUTING_MODES,
                 f"model.routing.mode={self.mode!r}; choose from {', '.join(ROUTING_MODES)}")
        _require(self.gamma_mode in ("scalar", "head", "channel"),
                 f"model.routing.gamma_mode={self.gamma_mode!r}; choose scalar, head or channel")
        _require(self.rank is None or self.rank >= 1,
                 f"model.routing.rank must be >= 1 or None (full rank), got {self.rank}")
        _require(not self.normalize_residual or self.mode == "cler",
                 f"model.routing.normalize_residual applies to mode 'cler' only, got mode="
                 f"{self.mode!r}")
        _require(not self.normalize_input or self.mode in ("cler_h", "clvr"),
                 f"model.routing.normalize_input applies to modes 'cler_h' and 'clvr' only "
                 f"(spec §4.3: the controls are mutually exclusive), got mode={self.mode!r}")
        _require(self.rank is None or self.mode in HIDDEN_ROUTING_MODES,
                 f"model.routing.rank applies to the residual-stream modes "
                 f"{', '.join(HIDDEN_ROUTING_MODES)}, got mode={self.mode!r}")

    @property
    def enabled(self) -> bool:
        """Whether any routing parameters exist (a routing mode or AttnRes)."""
        return self.mode != "none" or self.attn_res


def _odd_rope_head_dim(d_model: int, section: Any, name: str) -> str:
    """The error for an odd RoPE head width of ``model.<name>`` (``attention``/``lightning``):
    a set ``head_dim`` is named; a derived one (``d_model // num_heads``) is shown with where it
    comes from, and the nearest ``d_model`` values that give an even one."""
    opt = f"model.{name}"
    if section.head_dim is not None:
        return (f"RoPE needs an even head dimension, got {opt}.head_dim={section.head_dim}; "
                f"set an even one or set {opt}.rope_theta=None")
    h = section.num_heads
    lower = d_model // (2 * h) * 2 * h
    near = " or ".join(str(d) for d in (lower, lower + 2 * h) if d > 0)
    return (f"RoPE needs an even head dimension, got {opt} head_dim={d_model // h} = "
            f"model.d_model {d_model} / {opt}.num_heads {h}; choose a model.d_model that is a "
            f"multiple of 2 x {h} (e.g. {near}), set an even {opt}.head_dim, or set "
            f"{opt}.rope_theta=None")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """A decoder-only LM: embedding, pre-norm blocks (mixer + SwiGLU MLP), final norm, head.

    The stack is the per-layer ``layer_pattern`` (``("gdn", "gdn", "attn") * 4``), so pure,
    hybrid and dense models are configurations of one model class.

    Attributes:
      vocab_size: ``S``; must cover the tokenizer's ids.
      d_model: ``D``.
      layer_pattern: one mixer name per layer, from ``MIXER_NAMES``; a list is stored as a
        tuple (a string is refused: write ``("gdn",)``).
      mlp_hidden: SwiGLU hidden width ``F``.
      tie_embeddings: share the input embedding with the LM head.
      norm_eps: RMSNorm epsilon (paper 1: 1e-5).
      init_std: std of every input-side linear and the embeddings (0.02); output projections use
        ``init_std / sqrt(2 * num_layers)``.
      dtype: activation/compute dtype; params are stored in ``param_dtype``.
      param_dtype: parameter (master weight) dtype.
      use_segment_ids: reset recurrent state and mask attention at document boundaries inside a
        packed window. Paper 1 trains without resets (spec §10.17); our default resets.
      remat: rematerialise every block in the backward pass (``nnx.remat``).
      remat_policy: what a rematerialised block saves, one of ``REMAT_POLICIES``.
      split_projections: form the column blocks of the fused input projections (mixers'
        ``in_proj`` / ``qkv_proj``, the MLP's ``fc1``) as one product each instead of one
        product then a split (``lattn_jax.layers.Dense.split``): same values, same parameters;
        the backward then has no activation-sized concatenation per projection (7.5 ms of a
        165 ms GDN-pure step on the H200; end to end 164.2 -> 161.7 ms, 2026-11-30,
        ``benchmarks/results/profile-train-step-gdn-pure-h200-2026-11-30b.md``). On in the
        paper-1 presets (``configs/common.py``); the dataclass default stays off.
      swiglu_packed: form the MLP's ``fc1`` as one ``[.., 2F]`` product (whatever
        ``split_projections``) and apply ``lattn_jax.layers.swiglu_packed``, whose written-out
        backward returns ``fc1``'s cotangent as one ``[.., 2F]`` array from one pass, instead of
        ``swiglu`` on the gate and up blocks: same parameters, same forward values, gradients
        equal up to rounding (a resume may switch it). The experiment of
        ``pallas_kernels/common/MOSAIC_GPU.md`` Sec. 46.2 (the split form's SwiGLU backward ran
        as two fusions each reading gate, up and dy on the 350M step); off until an A/B of the
        step on the H100/H200 (``benchmarks/profile_train_step.py --swiglu_packed=on`` against
        ``=off``) decides.
      norm_implementation: how every RMSNorm of the model runs (the blocks' two, the final
        norm, the mixers' output and q/k norms), one of ``NORM_IMPLEMENTATIONS``: ``"xla"``
        (``lattn_jax.layers.rms_norm``), ``"pallas"`` (the one-pass Pallas GPU kernels of
        ``pallas_kernels/common/rms_norm_gpu.py``, which read ``x`` once in the forward and
        ``x`` and ``dy`` once in the backward; needs a GPU) or ``"pallas_interpret"`` (the same
        kernels in interpret mode, any backend; tests). The same math in the same precision:
        forward values and gradients equal up to fp32 rounding (a resume may switch it). The
        norms took ~226 ms of the 350M GDN step's 2,354 on the H100 (MOSAIC_GPU.md Sec. 46);
        ``"xla"`` until an A/B of the step on a card decides (MOSAIC_GPU.md Sec. 47).
      attention: settings of ``"attn"`` and ``"attn_nope"`` layers.
      gdn: settings of ``"gdn"`` layers.
      deltanet: settings of ``"deltanet"`` layers.
      kda: settings of ``"kda"`` layers.
      gdn2: settings of ``"gdn2"`` layers.
      lightning: settings of ``"lightning"`` layers.
      linear_attn: settings of ``"linear_attn"`` layers.
      routing: cross-layer routing (CLER, CLER-H, CLVR, controls, AttnRes); off by default.

    The sections (``attention`` to ``routing``) may also be given as mappings of their options,
    ``ModelConfig(gdn=dict(chunk_size=32))``; they are built into their dataclasses and checked
    here, as a config file's are.

    Raises:
      ConfigError: naming the option (``model.gdn.bogus``, ``model.d_model``) for an unknown
        section key, a value of the wrong type, or an invalid or inconsistent value.
    """

    vocab_size: int = 32000
    d_model: int = 256
    layer_pattern: Tuple[str, ...] = ("gdn", "gdn", "attn")
    mlp_hidden: int = 704
    tie_embeddings: bool = False
    norm_eps: float = 1e-5
    init_std: float = 0.02
    dtype: str = "float32"
    param_dtype: str = "float32"
    use_segment_ids: bool = True
    remat: bool = False
    remat_policy: str = "nothing_saveable"
    split_projections: bool = False
    swiglu_packed: bool = False
    norm_implementation: str = "xla"
    attention: AttentionConfig = dataclasses.field(default_factory=AttentionConfig)
    gdn: GatedDeltaNetConfig = dataclasses.field(default_factory=GatedDeltaNetConfig)
    deltanet: DeltaNetConfig = dataclasses.field(default_factory=DeltaNetConfig)
    kda: KDAConfig = dataclasses.field(default_factory=KDAConfig)
    gdn2: GDN2Config = dataclasses.field(default_factory=GDN2Config)
    lightning: LightningConfig = dataclasses.field(default_factory=LightningConfig)
    linear_attn: LinearAttentionConfig = dataclasses.field(default_factory=LinearAttentionConfig)
    routing: RoutingConfig = dataclasses.field(default_factory=RoutingConfig)

    def __post_init__(self):
        _build_sections(self, "model.")
        _require(self.vocab_size >= 2, f"model.vocab_size must be >= 2, got {self.vocab_size}")
        _require(self.d_model >= 1, f"model.d_model must be >= 1, got {self.d_model}")
        _require(self.mlp_hidden >= 1, f"model.mlp_hidden must be >= 1, got {self.mlp_hidden}")
        _require_bound("model.norm_eps", self.norm_eps)
        _require_bound("model.init_std", self.init_std, strict=False)
        _require(not isinstance(self.layer_pattern, str),
                 f"model.layer_pattern must be a tuple of mixer names, e.g. "
                 f"({self.layer_pattern!r},), got the string {self.layer_pattern!r}")
        # A list (ModelConfig(layer_pattern=["gdn", "attn"])) as the tuple it stands for: equal
        # to the tuple form and hashable, as a config file's list already is (_build).
        object.__setattr__(self, "layer_pattern", tuple(self.layer_pattern))
        _require(len(self.layer_pattern) >= 1, "model.layer_pattern must name at least one layer")
        for i, name in enumerate(self.layer_pattern):
            _require(
                name in MIXER_NAMES,
                f"model.layer_pattern[{i}]={name!r} is not a known mixer; "
                f"choose from {', '.join(MIXER_NAMES)}",
            )
        _require(self.dtype in _DTYPES, f"model.dtype={self.dtype!r}; choose from {_DTYPES}")
        _require(
            self.param_dtype in _DTYPES,
            f"model.param_dtype={self.param_dtype!r}; choose from {_DTYPES}",
        )
        uses_attention = any(name in ATTENTION_MIXERS for name in self.layer_pattern)
        if uses_attention and self.attention.head_dim is None:
            _require(
                self.d_model % self.attention.num_heads == 0,
                f"model.d_model={self.d_model} is not divisible by "
                f"model.attention.num_heads={self.attention.num_heads}; change one of them or "
                f"set model.attention.head_dim",
            )
        if "attn" in self.layer_pattern and self.attention.rope_theta is not None:
            _require(self.attention_head_dim % 2 == 0,
                     _odd_rope_head_dim(self.d_model, self.attention, "attention"))
        _require(
            self.norm_implementation in NORM_IMPLEMENTATIONS,
            f"model.norm_implementation={self.norm_implementation!r}; choose from "
            f"{', '.join(NORM_IMPLEMENTATIONS)}",
        )
        _require(
            self.remat_policy in REMAT_POLICIES,
            f"model.remat_policy={self.remat_policy!r}; choose from {', '.join(REMAT_POLICIES)}",
        )
        _require(
            not (self.remat and self.routing.attn_res),
            "model.remat is not supported with model.routing.attn_res (spec §4.4: AttnRes is "
            "incompatible with full recompute); set one of them to False",
        )
        if self.routing.mode != "none":
            for i, name in enumerate(self.layer_pattern):
                _require(
                    name in ATTENTION_MIXERS or name in ROUTABLE_MIXERS,
                    f"model.routing.mode={self.routing.mode!r} needs every linear layer to be "
                    f"one of {', '.join(ROUTABLE_MIXERS)} (spec §4.1: only they emit the routed "
                    f"signal), but model.layer_pattern[{i}]={name!r}",
                )
            _require(
                any(name in ROUTABLE_MIXERS for name in self.layer_pattern),
                f"model.routing.mode={self.routing.mode!r} needs at least one "
                f"{' or '.join(ROUTABLE_MIXERS)} layer in model.layer_pattern",
            )
            routed = [n for n in ROUTABLE_MIXERS if n in self.layer_pattern]
            shapes = {(getattr(self, n).num_v_heads, getattr(self, n).head_v_dim)
                      for n in routed}
            # (The message listed the sorted shapes without their sections, so that the
            # first pair could belong to model.deltanet.)
            _require(
                self.routing.mode != "cler" or len(shapes) == 1,
                "model.routing.mode='cler' routes r [H, V] between layers, so the gdn and "
                "deltanet layers need equal num_v_heads and head_v_dim, got "
                + ", ".join(f"model.{n}.num_v_heads={getattr(self, n).num_v_heads}, "
                            f"model.{n}.head_v_dim={getattr(self, n).head_v_dim}"
                            for n in routed),
            )
        if "lightning" in self.layer_pattern:
            if self.lightning.head_dim is None:
                _require(
                    self.d_model % self.lightning.num_heads == 0,
                    f"model.d_model={self.d_model} is not divisible by "
                    f"model.lightning.num_heads={self.lightning.num_heads}; change one of them "
                    f"or set model.lightning.head_dim",
                )
            _require(self.lightning.rope_theta is None or self.lightning_head_dim % 2 == 0,
                     _odd_rope_head_dim(self.d_model, self.lightning, "lightning"))

    @property
    def num_layers(self) -> int:
        return len(self.layer_pattern)

    @property
    def attention_head_dim(self) -> int:
        return self.attention.head_dim or self.d_model // self.attention.num_heads

    @property
    def lightning_head_dim(self) -> int:
        return self.lightning.head_dim or self.d_model // self.lightning.num_heads


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimConfig:
    """AdamW, or the paper's Muon + AdamW recipe, on a warm-up then cosine or WSD LR schedule.

    ``name="adamw"`` is spec §5.2 (AdamW everywhere); ``name="muon"`` is spec §5.1 (hidden 2-D
    matrices on NorMuon, everything else on AdamW; see ``lattn_jax.optim.param_labels``). The
    paper's Muon runs use ``learning_rate=3.6e-4`` with the defaults below.

    Attributes:
      name: ``"adamw"`` or ``"muon"``.
      learning_rate: peak LR (of the Muon group when ``name == "muon"``).
      min_lr_ratio: final LR as a fraction of the peak (paper 1: 0.1).
      warmup_steps: linear warm-up from 0 to the peak.
      schedule: ``"cosine"`` or ``"wsd"`` (constant, then a cool-down over the last
        ``decay_fraction`` of training with shape ``decay_shape``).
      decay_fraction: WSD cool-down length as a fraction of ``total_steps`` (paper 1: 0.2).
      decay_shape: ``"minus_sqrt"`` (paper 1: lr = min + (max - min)(1 - sqrt(tau))), ``"linear"``
        or ``"cosine"``.
      b1, b2, eps: Adam moments (paper 1: 0.9, 0.95, 1e-8), also of the AdamW group under Muon.
      weight_decay: decoupled weight decay (times the scheduled LR); with ``name="adamw"`` on
        params with 2+ dims only, with ``name="muon"`` on the Muon group (paper: 0.1).
      grad_clip: global L2 norm clip over all parameters (``0`` disables).
      adamw_learning_rate: peak LR of the AdamW group when ``name == "muon"``; ``None``:
        ``learning_rate * 1.5e-3 / 3.6e-4`` (spec §5.1: 1.5e-3 at the Muon LR 3.6e-4).
      adamw_min_lr_ratio: schedule floor of that group as a fraction of its peak; ``None``: 1.0,
        i.e. warm-up then constant, as the paper ran it (spec §10 item 8).
      adamw_weight_decay: weight decay of that group (2+-dim leaves); ``None``: 0 (spec §5.1).
      muon_momentum: Muon momentum (EMA rate, paper: 0.95).
      muon_nesterov: Nesterov momentum (paper: on).
      muon_ns_steps: Newton-Schulz iterations (paper: 5; a multiple of 5 for ``quintic``).
      muon_ns_coefficients: ``"quintic"`` (paper: 5 tuned triples) or ``"simple"``
        (3.4445, -4.7750, 2.0315).
      muon_ns_dtype: dtype of the Newton-Schulz iterate, ``"bfloat16"`` (paper,
        ``fp32_matmul_prec="medium"``) or ``"float32"``.
      muon_scale_mode: ``"spectral"`` (paper: ``sqrt(max(fan_in, fan_out))``),
        ``"shape_scaling"`` (``sqrt(max(1, fan_out / fan_in))``) or ``"unit_rms_norm"``
        (``sqrt(fan_out / fan_in)``).
      muon_extra_scale_factor: extra multiplier of the Muon update (paper: 1.0).
      muon_variant: ``"normuon"`` (paper: row/column second-moment normalisation after the
        orthogonalisation) or ``"muon"`` (plain Muon).
      muon_beta2: EMA rate of the NorMuon second moment (paper: 0.95, no bias correction).
      muon_eps: floor of the NorMuon second moment (paper: 1e-8).
      flatten: run the AdamW updates (all of ``name="adamw"``, the AdamW group of ``"muon"``)
        on raveled flat vectors with ``optax.flatten`` (two groups, decayed and not, see
        ``lattn_jax.optim.adamw_transform``) instead of leaf by leaf: the same result from
        fewer, larger kernels (timed by ``benchmarks/bench_optimizer.py``). The optimizer
        state's layout changes (a checkpoint restores only with the setting that wrote it),
        the parameters must share one dtype, and it is refused when parameters are sharded
        (fsdp / tensor meshes). Muon leaves stay per matrix.
    """

    name: str = "adamw"

    learning_rate: float = 3e-4
    min_lr_ratio: float = 0.1
    warmup_steps: int = 200
    schedule: str = "wsd"
    decay_fraction: float = 0.2
    decay_shape: str = "minus_sqrt"
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    adamw_learning_rate: Optional[float] = None
    adamw_min_lr_ratio: Optional[float] = None
    adamw_weight_decay: Optional[float] = None
    muon_momentum: float = 0.95
    muon_nesterov: bool = True
    muon_ns_steps: int = 5
    muon_ns_coefficients: str = "quintic"
    muon_ns_dtype: str = "bfloat16"
    muon_scale_mode: str = "spectral"
    muon_extra_scale_factor: float = 1.0
    muon_variant: str = "normuon"
    muon_beta2: float = 0.95
    muon_eps: float = 1e-8
    flatten: bool = False

    def __post_init__(self):
        _require(self.name in ("adamw", "muon"),
                 f"optim.name={self.name!r}; choose adamw or muon")
        _require_bound("optim.learning_rate", self.learning_rate)
        _require(
            0.0 <= self.min_lr_ratio <= 1.0,
            f"optim.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}",
        )
        _require(self.warmup_steps >= 0,
                 f"optim.warmup_steps must be >= 0, got {self.warmup_steps}")
        _require(
            self.schedule in ("cosine", "wsd"),
            f"optim.schedule={self.schedule!r}; choose cosine or wsd",
        )
        _require(
            0.0 <= self.decay_fraction <= 1.0,
            f"optim.decay_fraction must be in [0, 1], got {self.decay_fraction}",
        )
        _require(
            self.decay_shape in ("minus_sqrt", "linear", "cosine"),
            f"optim.decay_shape={self.decay_shape!r}; choose minus_sqrt, linear or cosine",
        )
        _require_bound("optim.grad_clip", self.grad_clip, strict=False)
        for name in ("b1", "b2", "muon_momentum", "muon_beta2"):
            value = getattr(self, name)
            _require(0.0 <= value < 1.0, f"optim.{name} must be in [0, 1), got {value}")
        for name in ("eps", "muon_eps", "muon_extra_scale_factor"):
            _require_bound(f"optim.{name}", getattr(self, name))
        _require_bound("optim.weight_decay", self.weight_decay, strict=False)
        _require_bound("optim.adamw_learning_rate", self.adamw_learning_rate, none_ok=True)
        _require(
            self.adamw_min_lr_ratio is None or 0.0 <= self.adamw_min_lr_ratio <= 1.0,
            f"optim.adamw_min_lr_ratio must be in [0, 1] or None, got {self.adamw_min_lr_ratio}",
        )
        _require_bound("optim.adamw_weight_decay", self.adamw_weight_decay, strict=False,
                       none_ok=True)
        _require(
            self.muon_ns_coefficients in ("quintic", "simple"),
            f"optim.muon_ns_coefficients={self.muon_ns_coefficients!r}; choose quintic or simple",
        )
        _require(self.muon_ns_steps >= 1,
                 f"optim.muon_ns_steps must be >= 1, got {self.muon_ns_steps}")
        _require(
            self.muon_ns_coefficients != "quintic" or self.muon_ns_steps % 5 == 0,
            f"optim.muon_ns_steps={self.muon_ns_steps} must be a multiple of 5 with "
            f"optim.muon_ns_coefficients='quintic' (one pass over the 5 tuned steps)",
        )
        _require(
            self.muon_ns_dtype in ("bfloat16", "float32"),
            f"optim.muon_ns_dtype={self.muon_ns_dtype!r}; choose bfloat16 or float32",
        )
        _require(
            self.muon_scale_mode in ("spectral", "shape_scaling", "unit_rms_norm"),
            f"optim.muon_scale_mode={self.muon_scale_mode!r}; choose spectral, shape_scaling "
            f"or unit_rms_norm",
        )
        _require(
            self.muon_variant in ("normuon", "muon"),
            f"optim.muon_variant={self.muon_variant!r}; choose normuon or muon",
        )
        _require(isinstance(self.flatten, bool),
                 f"optim.flatten must be True or False, got {self.flatten!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """The training loop: length, evaluation, checkpointing and logging cadence.

    Attributes:
      total_steps: optimizer steps.
      eval_every: run validation every this many steps (and at the end).
      checkpoint_every: save a checkpoint every this many steps (and at the end).
      keep_checkpoints: how many recent checkpoints orbax keeps.
      log_every: print and append metrics every this many steps.
      seed: model-initialisation seed (the data seed is ``data.seed``).
      max_steps_per_run: stop this invocation after this many steps (saving a checkpoint), for
        time-limited or preemptible jobs; the next invocation resumes. ``None``: no limit.
      keep_best_checkpoint: besides the ``keep_checkpoints`` newest, keep the checkpoint with the
        lowest validation loss (among those saved at an evaluation step).
      async_checkpoints: write checkpoints in a background thread while training continues.
      save_on_preemption: on SIGTERM, SIGHUP (unless ignored, as under ``nohup``) or a
        multi-host preemption notice, finish the current step, save a checkpoint and return.
      nonfinite_policy: when a step's loss or gradient norm is NaN/inf, ``"stop"`` (discard the
        update, save a checkpoint of the last good state and raise ``NonFiniteError``; costs one
        scalar device-to-host sync per step) or ``"skip"`` (discard the update and continue;
        skipped steps are counted in the metrics). Either way the batch is consumed and
        ``step`` advances, while the optimizer's own count (its LR schedule) does not, as with
        ``optax.apply_if_finite``.
      tensorboard: also write TensorBoard event files to ``<workdir>/tensorboard``.
      peak_flops_per_device: peak FLOP/s of one device for the MFU metric; ``None`` looks the
        device kind up in ``lattn_jax.flops.PEAK_FLOPS`` (no MFU if it is unknown, e.g. CPU).
      micro_batch_size: gradient accumulation: rows per data-parallel replica per micro-step
        (Megatron's MBS); one optimizer step then runs ``data.batch_size / (micro_batch_size x
        mesh data x fsdp)`` micro-batches and sums their gradients, so the loss stays the
        token mean over the whole batch (paper 1's GBS 128 on fewer devices, spec §5.4).
        ``None``: the whole batch in one pass. A batch that does not split so is a
        ``ConfigError`` when the trainer is built (``lattn_jax.train.accumulation_steps``).
      loss_chunk_size: the training loss's LM head and cross-entropy fused and applied this
        many tokens at a time (``lattn_jax.halo.losses.chunked_cross_entropy``): the
        ``[B, T, S]`` fp32 logits are never stored, each chunk's gradient is formed with its
        loss, and the logits are the fp32-accumulated ``h W`` (the plain head rounds them to
        the compute dtype first). ``None``: the plain head and
        :func:`lattn_jax.train.cross_entropy_loss`. Validation always uses the plain head.
    """

    total_steps: int = 1000
    eval_every: int = 200
    checkpoint_every: int = 200
    keep_checkpoints: int = 2
    log_every: int = 10
    seed: int = 0
    max_steps_per_run: Optional[int] = None
    keep_best_checkpoint: bool = True
    async_checkpoints: bool = True
    save_on_preemption: bool = True
    nonfinite_policy: str = "stop"
    tensorboard: bool = True
    peak_flops_per_device: Optional[float] = None
    micro_batch_size: Optional[int] = None
    loss_chunk_size: Optional[int] = None

    def __post_init__(self):
        _require(
            self.nonfinite_policy in NONFINITE_POLICIES,
            f"train.nonfinite_policy={self.nonfinite_policy!r}; choose from "
            f"{', '.join(NONFINITE_POLICIES)}",
        )
        _require_bound("train.peak_flops_per_device", self.peak_flops_per_device, none_ok=True)
        for name in ("total_steps", "eval_every", "checkpoint_every", "keep_checkpoints",
                     "log_every"):
            value = getattr(self, name)
            _require(value >= 1, f"train.{name} must be >= 1, got {value}")
        _require(
            self.max_steps_per_run is None or self.max_steps_per_run >= 1,
            f"train.max_steps_per_run must be >= 1 or None, got {self.max_steps_per_run}",
        )
        _require(
            self.micro_batch_size is None or self.micro_batch_size >= 1,
            f"train.micro_batch_size must be >= 1 or None, got {self.micro_batch_size}",
        )
        _require(
            self.loss_chunk_size is None or (isinstance(self.loss_chunk_size, int)
                                             and not isinstance(self.loss_chunk_size, bool)
                                             and self.loss_chunk_size >= 1),
            f"train.loss_chunk_size must be an int >= 1 or None, got {self.loss_chunk_size!r}",
        )


def _normalise_rules(rules) -> Tuple[Tuple[str, Any], ...]:
    """``[[name, axes], ...]`` (from a ConfigDict) -> a tuple of ``(name, axes)`` pairs with
    ``axes`` a mesh axis name, a tuple of them, or ``None``."""
    out = []
    for i, rule in enumerate(rules):
        _require(isinstance(rule, (tuple, list)) and len(rule) == 2 and isinstance(rule[0], str),
                 f"mesh.rules[{i}]={rule!r} must be a (logical_name, mesh_axes) pair")
        name, axes = rule
        if isinstance(axes, (list, tuple)):
            axes = tuple(axes)
            bad = [a for a in axes if a not in MESH_AXES]
        else:
            bad = [] if axes is None or axes in MESH_AXES else [axes]
        _require(not bad, f"mesh.rules[{i}] ({name!r}) maps to unknown mesh axes {bad}; "
                          f"choose from {', '.join(MESH_AXES)} or None")
        out.append((name, axes))
    names = [name for name, _ in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    _require(not dup, f"mesh.rules names {dup} more than once")
    return tuple(out)


@dataclasses.dataclass(frozen=True, kw_only=True)
class MeshConfig:
    """The device mesh and the logical -> mesh axis rules (STYLE items 14, 21-24).

    The mesh has the axes ``MESH_AXES = ("data", "fsdp", "context", "tensor")``; their product
    must equal the number of devices, and one of them may be ``-1`` (all the remaining devices).
    A mesh of one device runs the plain single-device path (no shardings at all).

    Attributes:
      data: data-parallel replicas (the batch is split, parameters are replicated).
      fsdp: fully-sharded data parallelism (the batch is split and parameters and optimizer
        state are sharded along ``D``).
      context: context parallelism: the sequence axis of every activation is split into
        ``context`` contiguous shards; linear-attention layers pass their recurrent state
        between shards and softmax layers gather keys and values
        (:mod:`lattn_jax.context_parallel`). The sequence length must be a multiple of it.
      tensor: tensor parallelism (heads, MLP hidden and vocabulary split).
      rules: ``(logical_name, mesh_axes)`` pairs, :data:`DEFAULT_AXIS_RULES` by default.
    """

    data: int = -1
    fsdp: int = 1
    context: int = 1
    tensor: int = 1
    rules: Tuple[Tuple[str, Any], ...] = DEFAULT_AXIS_RULES

    def __post_init__(self):
        sizes = self.sizes()
        for name, value in zip(MESH_AXES, sizes):
            _require(value == -1 or value >= 1,
                     f"mesh.{name} must be >= 1 or -1 (all remaining devices), got {value}")
        _require(sizes.count(-1) <= 1, f"at most one mesh axis may be -1, got {sizes}")
        object.__setattr__(self, "rules", _normalise_rules(self.rules))

    def sizes(self) -> Tuple[int, ...]:
        """The configured sizes in :data:`MESH_AXES` order (``-1`` unresolved)."""
        return tuple(getattr(self, name) for name in MESH_AXES)

    def shape(self, num_devices: int) -> Tuple[int, ...]:
        """The mesh shape for ``num_devices`` devices (resolving ``-1``), in ``MESH_AXES`` order.

        Raises:
          ConfigError: if the axes do not multiply to ``num_devices``.
        """
        sizes = list(self.sizes())
        described = ", ".join(f"{n}={v}" for n, v in zip(MESH_AXES, sizes))
        known = 1
        for value in sizes:
            known *= value if value != -1 else 1
        if -1 in sizes:
            _require(num_devices % known == 0,
                     f"mesh {described} does not divide the {num_devices} devices")
            sizes[sizes.index(-1)] = num_devices // known
        total = int(np.prod(sizes))
        _require(total == num_devices,
                 f"mesh {' x '.join(MESH_AXES)} = {' x '.join(map(str, sizes))} needs "
                 f"{total} devices, but there are {num_devices}")
        return tuple(sizes)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExperimentConfig:
    """Everything one run needs: ``model``, ``data``, ``optim``, ``train`` and ``mesh``."""

    model: ModelConfig
    data: DataConfig
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)

    def __post_init__(self):
        _build_sections(self, "")


def _build_sections(obj, prefix: str) -> None:
    """Turns the section fields of the dataclass ``obj`` given as mappings
    (``ModelConfig(gdn=dict(chunk_size=32))``) into their dataclasses, validated as
    :func:`_build` does, so that a bad key or value is named at construction rather than
    surfacing as an ``AttributeError`` when the model is built; checks the other fields'
    types (:func:`_matches`).

    Raises:
      ConfigError: naming the option (``model.gdn.bogus``, ``model.d_model``): an unknown key,
        a value of the wrong type, a bad value, or a section that is neither its dataclass nor
        a mapping.
    """
    hints = typing.get_type_hints(type(obj))
    for field in dataclasses.fields(obj):
        hint = hints[field.name]
        if not dataclasses.is_dataclass(hint):
            _check_type(prefix + field.name, getattr(obj, field.name), hint)
            continue
        value = getattr(obj, field.name)
        if isinstance(value, hint):
            continue
        if not isinstance(value, Mapping):
            raise ConfigError(f"{prefix}{field.name} must be a {hint.__name__} or a mapping of "
                              f"its options, got {value!r}")
        object.__setattr__(obj, field.name, _build(hint, value, f"{prefix}{field.name}."))


def _matches(value: Any, hint: Any) -> bool:
    """Whether ``value`` has the type that the dataclass field annotation ``hint`` names (a
    number where a float goes; anything where the annotation is not a plain type)."""
    origin = typing.get_origin(hint)
    if origin is typing.Union:
        return any(_matches(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, (bool, np.bool_))
    if hint is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))
    if hint is float:
        return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))
    if hint is str:
        return isinstance(value, str)
    if origin is tuple:
        return isinstance(value, (tuple, list))
    return True


def _build(cls, values: Mapping[str, Any], prefix: str):
    """Builds dataclass ``cls`` from a mapping, recursing into nested dataclass fields.

    Raises:
      ConfigError: naming the option: an unknown key, a section given a non-mapping, a value of
        the wrong type for its field's annotation (:func:`_matches`: an int where a float goes
        is fine, a bool or a float where an int goes is not), or a value its checks refuse.
    """
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigError(
            f"unknown option(s) {', '.join(prefix + k for k in unknown)}; "
            f"known options of {prefix.rstrip('.') or 'config'}: {', '.join(sorted(fields))}"
        )
    kwargs = {}
    for name, value in values.items():
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            if not isinstance(value, Mapping):
                raise ConfigError(f"{prefix}{name} must be a section (mapping), got {value!r}")
            kwargs[name] = _build(hint, value, f"{prefix}{name}.")
        elif isinstance(value, list):
            kwargs[name] = tuple(value)
        else:
            kwargs[name] = value
    for name, value in kwargs.items():  # before the checks: "no" is truthy, 3.5 compares
        _check_type(prefix + name, value, hints[name])
    return cls(**kwargs)


def _check_type(option: str, value: Any, hint: Any) -> None:
    """Raises ``ConfigError`` naming ``option`` unless ``value`` fits the field annotation
    ``hint`` (:func:`_matches`). A string for a tuple field is left to the field's own check,
    which says more (``layer_pattern="gdn"``: write ``("gdn",)``)."""
    if isinstance(value, str) and typing.get_origin(hint) is tuple:
        return
    if not _matches(value, hint):  # ModelConfig(d_model="128"), tie_embeddings="no"
        raise ConfigError(f"{option}={value!r} has the wrong type; expected "
                          f"{_type_name(hint)}")


def _type_name(hint: Any) -> str:
    """``int``, ``float or None``, ``tuple``: a field annotation as messages name it."""
    if typing.get_origin(hint) is typing.Union:
        return " or ".join(_type_name(h) for h in typing.get_args(hint))
    if hint is type(None):
        return "None"
    origin = typing.get_origin(hint)
    return getattr(origin or hint, "__name__", str(hint))


# The kinds of config file, told apart by their sections: which binary takes each. A HALO
# pipeline config (configs/halo_smollm2.py) has a teacher and a HypeNet student; a sweep config
# (configs/sweeps/) names a training config and a grid.
CONFIG_KINDS = {
    "training": ("a training config (sections model, data, optim, train, mesh)",
                 "experiments/train.py"),
    "halo": ("a HALO pipeline config (sections teacher, hypenet and one per stage)",
             "experiments/halo_pipeline.py (or experiments/halo.py, one stage at a time)"),
    "sweep": ("a sweep config (train_config, grid)", "experiments/sweep.py"),
}


def config_kind(values: Mapping[str, Any]) -> Optional[str]:
    """Which of :data:`CONFIG_KINDS` a config (ConfigDict or mapping) is, by its sections;
    ``None`` when it is none of them."""
    if "model" in values and "data" in values:
        return "training"
    if "teacher" in values and "hypenet" in values:
        return "halo"
    if "train_config" in values or "grid" in values:
        return "sweep"
    return None


def describe_config_kind(values: Mapping[str, Any]) -> str:
    """``"it is a HALO pipeline config (...), which experiments/halo_pipeline.py (...) takes"``
    for a config of a known kind (:func:`config_kind`), ``""`` otherwise: the end of an error
    for a config given to a binary of another kind."""
    kind = config_kind(values)
    if kind is None:
        return ""
    what, binary = CONFIG_KINDS[kind]
    return f"it is {what}, which {binary} takes"


def experiment_from_config_dict(config: Any) -> ExperimentConfig:
    """Converts a ``ConfigDict`` (or nested mapping) into a validated :class:`ExperimentConfig`.

    Args:
      config: a ConfigDict or dict with ``model``, ``data`` and optionally ``optim``/``train``.

    Returns:
      The frozen, validated ``ExperimentConfig``.

    Raises:
      ValueError: naming the option, for unknown options or invalid values; for a config of
        another kind (a HALO pipeline's, a sweep's), naming its kind and the binary that takes
        it.
    """
    values = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    for section in ("model", "data"):
        if section not in values:
            other = describe_config_kind(values)
            raise ConfigError(f"config has no {section!r} section" + (
                f": {other}, not a training config (experiments/train.py's, e.g. "
                f"configs/default.py)" if other else ""))
    # ``train`` first: configs derive optim fields from train.total_steps (the default's warm-up
    # is a tenth of it), so a bad total_steps must be named itself, not through warmup_steps.
    order = ["train"] + [k for k in values if k != "train"]
    values = {k: values[k] for k in order if k in values}
    return _build(ExperimentConfig, values, "")


def derived_options(config: Any) -> Dict[str, Tuple[str, ...]]:
    """The options of a ``ConfigDict`` that it computes from others through a
    ``FieldReference`` (``warmup_steps=total_steps // 10`` in ``configs/default.py`` and the
    tiny presets), each with the dotted paths of the options it follows.

    An option set outright (``--config.optim.warmup_steps=5``) follows nothing any more
    (ml_collections drops the reference's operations), and one ``FieldReference`` held by two
    options makes them one option, not one derived from the other: neither is listed.

    Args:
      config: a ``ConfigDict``; anything else (a plain mapping) has no derived options.

    Returns:
      ``{"optim.warmup_steps": ("train.total_steps",)}``; empty when nothing is derived.
    """
    from ml_collections import config_dict  # noqa: PLC0415 (only the ConfigDict boundary)
    refs: Dict[str, Any] = {}

    def collect(node, prefix):
        for key, value in node.items(preserve_field_references=True):
            if isinstance(value, config_dict.ConfigDict):
                collect(value, f"{prefix}{key}.")
            elif isinstance(value, config_dict.FieldReference):
                refs[f"{prefix}{key}"] = value

    def parents(ref):
        # ml_collections has no public accessor for what a reference is computed from: its
        # pointer (``_value``) and its operations' arguments. Missing: nothing is derived.
        found = [ref._value] if isinstance(getattr(ref, "_value", None),
                                           config_dict.FieldReference) else []
        for op in getattr(ref, "_ops", None) or ():
            found += [a for a in op.args if isinstance(a, config_dict.FieldReference)]
        return found

    if not isinstance(config, config_dict.ConfigDict):
        return {}
    collect(config, "")
    out = {}
    for path, ref in refs.items():
        seen, todo = set(), parents(ref)
        while todo:
            parent = todo.pop()
            if id(parent) not in seen and parent is not ref:
                seen.add(id(parent))
                todo += parents(parent)
        sources = tuple(p for p, r in refs.items() if id(r) in seen and r is not ref)
        if sources:
            out[path] = sources
    return out


def experiment_json_dict(config: ExperimentConfig) -> dict:
    """The config as JSON-ready nested dicts, as a run's ``config.json`` and
    ``invocations.jsonl`` store it (:mod:`lattn_jax.train`): bundled files by name
    (``"bundled:..."``), user paths as given (:func:`lattn_jax.data.config.portable_dict`), so
    that a run directory does not depend on where the clone lives.

    Args:
      config: a validated :class:`ExperimentConfig`.

    Returns:
      ``{"model": {...}, "data": {...}, "optim": {...}, "train": {...}, "mesh": {...}}``.
    """
    import json  # noqa: PLC0415 (only this helper serialises)
    from lattn_jax.data import config as data_config  # noqa: PLC0415
    values = json.loads(json.dumps(dataclasses.asdict(config), default=str))
    values["data"] = data_config.portable_dict(values["data"])
    return values


def read_run_config_json(path: str) -> dict:
    """A run's ``config.json`` (:func:`experiment_json_dict`'s form) as a dict.

    Raises:
      OSError: the file cannot be read.
      ConfigError: naming ``path``, when it is not valid JSON (a truncated or hand-edited
        file) or does not hold a JSON object.
    """
    import json  # noqa: PLC0415
    with open(path) as f:
        try:
            values = json.load(f)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path} is not valid JSON ({e}); it is the run's recorded "
                              f"config: restore it or use a new workdir") from None
    if not isinstance(values, dict):
        raise ConfigError(f"{path} does not hold a JSON object (the run's recorded config)")
    return values


def first_missing_dir(path: str) -> Optional[str]:
    """The outermost of ``path`` and its parents that does not exist (absolute), or ``None``
    when ``path`` exists: what ``os.makedirs(path)`` is about to create (so that a binary that
    fails before writing anything can remove exactly what it made: ``train.py``'s
    ``--workdir``, ``prepare_data.py``'s ``--output_dir``)."""
    path, missing = os.path.abspath(path), None
    while not os.path.lexists(path):
        missing, parent = path, os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return missing


# What experiments/train.py writes into its --workdir besides config.json, from its first moment
# on: the lock and the invocation's records (``lattn_jax.train.WORKDIR_LOCK``, ``INVOCATIONS``,
# ``CONSOLE_LOG``; before the data are read), then checkpoints/ and metrics.jsonl. Any one of
# them makes a directory a training run's (:func:`saved_training_config`), also a run stopped
# before its first checkpoint. (The lock file is there only while a trainer runs, or after a
# killed one: the trainer deletes it when it ends; the records stay.) And what
# experiments/sweep.py writes into its --root first.
TRAINING_WORKDIR_ENTRIES = (".train.lock", "invocations.jsonl", "console.log", "checkpoints/",
                            "metrics.jsonl")
SWEEP_ROOT_ENTRIES = ("sweep.jsonl", "runs/")


def _entries(directory: str, names) -> list:
    """The names of ``names`` (a trailing ``/``: a directory, else a file) in ``directory``."""
    return [name for name in names
            if (os.path.isdir if name.endswith("/") else os.path.isfile)(
                os.path.join(directory, name.rstrip("/")))]


def _and(items) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _inside_checkpoints(workdir: str) -> Optional[str]:
    """The training workdir (a ``config.json`` beside its ``checkpoints/``) whose
    ``checkpoints`` folder, or a step folder in it, ``workdir`` is; else ``None``."""
    path = os.path.normpath(os.path.abspath(workdir))
    parent, name = os.path.split(path)
    if name.isdigit() and os.path.basename(parent) == "checkpoints":
        parent, name = os.path.split(parent)
    if name == "checkpoints" and os.path.isfile(os.path.join(parent, "config.json")):
        return parent
    return None


def saved_training_config(workdir: str, *, flag: str = "--workdir",
                          consequence: str = "training would overwrite it",
                          writer: str = "train") -> Optional[dict]:
    """``<workdir>/config.json`` as a dict, refusing another kind of run's workdir.

    The one check that a directory about to be written by a training binary is not another
    kind of run's: ``train.py`` calls it for ``--workdir`` (``writer="train"``), ``sweep.py``
    for ``--root`` (``writer="sweep"``, :func:`lattn_jax.sweep.check_root`), before either
    writes anything there. Refused: a HALO pipeline's workdir (:mod:`experiments.halo_pipeline`;
    a ``config.json`` without a ``model`` section), by both; a sweep root (any of
    :data:`SWEEP_ROOT_ENTRIES`: ``sweep.jsonl``, ``runs/``) by ``train.py``; a training run's
    workdir (a ``config.json`` with a ``model`` section, or any of
    :data:`TRAINING_WORKDIR_ENTRIES`: what the trainer writes from its start on, so also a run
    stopped before it saved a checkpoint) by ``sweep.py``. A directory holding both kinds of
    files is refused by both.

    Args:
      workdir: the directory (need not exist).
      flag: the command-line option that named ``workdir`` (the message's advice).
      consequence: what the caller would do to the directory (the message's reason).
      writer: ``"train"`` or ``"sweep"``: which binary is about to write ``workdir``.

    Returns:
      The recorded config, or ``None`` when ``<workdir>/config.json`` does not exist.

    Raises:
      ConfigError: naming ``<workdir>/config.json`` when it is not valid JSON, or is another
        kind of run's (no ``model`` section; e.g. a HALO workdir's, with a ``teacher`` one);
        naming ``workdir`` when it is the other binary's directory (a sweep root for
        ``writer="train"``, a training workdir for ``writer="sweep"``), and for
        ``writer="train"`` when it is a training run's ``checkpoints`` folder or a step folder
        in it (naming that run's workdir); and ``flag``.
      ValueError: ``writer`` is neither ``"train"`` nor ``"sweep"`` (a programming error).
    """
    if writer not in ("train", "sweep"):
        raise ValueError(f"writer={writer!r}: expected 'train' or 'sweep'")
    if writer == "train":
        inside = _inside_checkpoints(workdir)
        if inside is not None:
            raise ConfigError(
                f"{workdir} is inside the checkpoints of the run in {inside} (its checkpoints "
                f"folder or a step folder): {consequence} there. Pass {flag}={inside} to "
                f"resume that run, or another {flag}")
        found = _entries(workdir, SWEEP_ROOT_ENTRIES)
        if found:
            raise ConfigError(
                f"{workdir} is a sweep root (it has {_and(found)}; experiments/sweep.py "
                f"writes it), not a training run's workdir: {consequence}. Use another {flag}")
    path = os.path.join(workdir, "config.json")
    saved = read_run_config_json(path) if os.path.exists(path) else None
    if saved is not None and "model" not in saved:
        raise ConfigError(
            f"{path} is not a training run's config (it has no 'model' section; "
            f"{'a HALO workdir' if 'teacher' in saved else 'another kind of run'}): "
            f"{consequence}. Use another {flag}")
    if writer == "sweep":
        found = ((["config.json with a 'model' section"] if saved is not None else [])
                 + _entries(workdir, TRAINING_WORKDIR_ENTRIES))
        if found:
            raise ConfigError(
                f"{workdir} is a training run's workdir (it has {_and(found)}; "
                f"experiments/train.py writes it), not a sweep root: {consequence}. Use another "
                f"{flag}")
    return saved


def config_flag_value(holder, flag: str = "--config"):
    """The value of a ``config_flags.DEFINE_config_file`` flag, or one error line and exit.

    When ml_collections cannot load the config file (no such file, a directory, unreadable), the
    flag's value raises an ``OSError`` with a ~35-line report on its first use; binaries read the
    value through this, before they create any file, so that a missing file is one line.

    Args:
      holder: the ``FlagHolder`` that ``DEFINE_config_file`` returned.
      flag: the option's name, as the message shows it.

    Returns:
      The loaded ``ConfigDict``.

    Raises:
      SystemExit: ``error: cannot load --config=<path>: No such file or directory`` (or ``Is a
        directory``, ...; :func:`lattn_jax.flag_errors.describe_config_load_error`).
    """
    try:
        value = holder.value
        getattr(value, "keys", None)  # a file that failed to load raises on first attribute use
    except OSError as e:
        # An OSError of the config file's own code (get_config() opening a missing file):
        # its file and line, not "cannot load" the config file.
        in_file = describe_config_file_error(e, sys.argv)
        if in_file:
            sys.exit(in_file)
        from absl import flags  # noqa: PLC0415 (binaries only)
        path = getattr(flags.FLAGS[holder.name], "config_filename", None)
        sys.exit(f"error: {describe_config_load_error(e, flag, path)}")
    return value
