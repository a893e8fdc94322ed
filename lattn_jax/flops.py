"""Model FLOPs per token for the MFU metric, counting each mixer's real (chunked) work.

MFU = (training FLOPs per token x tokens/s) / (peak FLOP/s per device x devices). Counted, per
token and layer, 2 FLOPs per multiply-add:

* every projection, MLP and LM-head matmul: ``2 x`` its weight's size (from the parameter
  shapes, so new projections are counted without changes here); the tied head counts ``2 D S``;
* causal softmax attention: ``QK^T`` and ``AV`` over on average ``T / 2`` keys,
  ``2 x 2 x (T / 2) x d_h = 2 T d_h`` per query head (the project's BENCHMARKS.md §3.4:
  ``4 T^2 D`` per sequence and head, halved by causality);
* delta-rule mixers (GDN, DeltaNet, KDA, GDN-2) in the chunked WY/UT form, per token and value
  head: ``2 C (3 K + 2 V)`` for the five ``C x C``-type products, ``6 K V`` for the three
  state products, ``C^2 / 3`` for the triangular inverse (BENCHMARKS.md §3.1; ``10 C d + 6 d^2``
  at ``K = V = d``), ``C = min(chunk_size, T)``;
* additive linear / Lightning attention (no delta rule), per token and head:
  ``2 C (K + V) + 4 K V`` (§3.5);
* the short convolutions: ``2 W`` per channel.

Gates, norms and elementwise work are not counted. Training is ``3 x`` the forward (the backward
does two products per forward product); rematerialisation's recompute is not counted, so this
is model FLOPs utilisation, not hardware FLOPs utilisation.
"""

from typing import Optional

import jax
import numpy as np

from lattn_jax import config as config_lib
from lattn_jax.typing import PyTree

# Dense bf16 peak FLOP/s per device by ``jax.Device.device_kind`` (vendor spec sheets, without
# sparsity). The H200's spec is 989 TFLOP/s; an 8192^3 GEMM measured 790 TFLOP/s on the lent H200
# (BENCHMARKS.md §3), so MFU against the spec reads about 0.8x of MFU against the measured
# ceiling. Set ``train.peak_flops_per_device`` to use another number.
PEAK_FLOPS = {
    "NVIDIA H200": 989e12,
    "NVIDIA H100 80GB HBM3": 989e12,
    "NVIDIA H100": 989e12,
    "NVIDIA A100-SXM4-80GB": 312e12,
    "NVIDIA A100-SXM4-40GB": 312e12,
    "NVIDIA B200": 2250e12,
    "TPU v4": 275e12,
    "TPU v5 lite": 197e12,
    "TPU v5e": 197e12,
    "TPU v5p": 459e12,
    "TPU v5": 459e12,
    "TPU v6 lite": 918e12,
    "TPU v6e": 918e12,
}

_DELTA_MIXERS = ("gdn", "deltanet", "kda", "gdn2")
_ADDITIVE_MIXERS = ("lightning", "linear_attn")


def peak_flops_per_device(device: Optional[jax.Device] = None,
                          override: Optional[float] = None) -> Optional[float]:
    """Peak dense bf16 FLOP/s of ``device`` (default: the first), or ``None`` if unknown."""
    if override is not None:
        return float(override)
    device = jax.devices()[0] if device is None else device
    kind = getattr(device, "device_kind", "")
    if kind in PEAK_FLOPS:
        return PEAK_FLOPS[kind]
    for name, value in PEAK_FLOPS.items():  # e.g. "NVIDIA H200 NVL" or "TPU v5p chip"
        if kind.startswith(name):
            return value
    return None


def matmul_params(params: PyTree, tie_embeddings: bool) -> int:
    """Weights that are multiplied by every token: 2-D ``kernel`` leaves except convolutions,
    plus the embedding when it doubles as the LM head. ``params`` is a plain pytree or an
    ``nnx.State`` (whose leaf paths end in ``.value``)."""
    total = 0
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        names = [str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path]
        if len(names) > 1 and names[-1] == "value":  # an nnx.State leaf (Variable.value)
            names = names[:-1]
        if names[-1] == "kernel" and len(leaf.shape) == 2 and "conv" not in names:
            total += int(np.prod(leaf.shape))
        elif names == ["embed"] and tie_embeddings:
            total += int(np.prod(leaf.shape))
    return total


def _chunk(chunk_size: int, seq_len: int) -> int:
    return max(1, min(chunk_size, seq_len))


def mixer_flops_per_token(model_config: config_lib.ModelConfig, name: str,
                          seq_len: int) -> float:
    """Forward FLOPs per token of one mixer's token-mixing core (projections excluded)."""
    if name in config_lib.ATTENTION_MIXERS:
        a = model_config.attention
        return 2.0 * seq_len * model_config.attention_head_dim * a.num_heads
    if name in _DELTA_MIXERS:
        cfg = getattr(model_config, name)
        c, k, v = _chunk(cfg.chunk_size, seq_len), cfg.head_k_dim, cfg.head_v_dim
        core = 2 * c * (3 * k + 2 * v) + 6 * k * v + c * c / 3
        conv = 2 * cfg.conv_width * (2 * cfg.num_k_heads * k + cfg.num_v_heads * v)
        return cfg.num_v_heads * core + conv
    if name == "linear_attn":
        cfg = model_config.linear_attn
        c, k, v = _chunk(cfg.chunk_size, seq_len), cfg.head_k_dim, cfg.head_v_dim
        conv = 2 * cfg.conv_width * (2 * cfg.num_k_heads * k + cfg.num_v_heads * v)
        return cfg.num_v_heads * (2 * c * (k + v) + 4 * k * v) + conv
    if name == "lightning":
        cfg = model_config.lightning
        c, d = _chunk(cfg.chunk_size, seq_len), model_config.lightning_head_dim
        conv = 2 * cfg.conv_width * (cfg.num_heads + 2 * cfg.num_kv_heads) * d
        return cfg.num_heads * (2 * c * (d + d) + 4 * d * d) + conv
    raise ValueError(f"no FLOP model for mixer {name!r}")


def flops_per_token(model_config: config_lib.ModelConfig, params: PyTree, seq_len: int, *,
                    training: bool = True) -> float:
    """Model FLOPs per token (forward, or ``3 x`` forward with ``training``).

    Args:
      model_config: the model.
      params: the parameter pytree (arrays or ``jax.ShapeDtypeStruct``), for the matmul count.
      seq_len: ``T`` of the training windows.
      training: count forward + backward.
    """
    forward = 2.0 * matmul_params(params, model_config.tie_embeddings)
    for name in model_config.layer_pattern:
        forward += mixer_flops_per_token(model_config, name, seq_len)
    return 3.0 * forward if training else forward
