"""HypeNet conversion of a pretrained Transformer (arXiv 2601.22156; spec ``hypenet-halo.md`` §2).

Every teacher layer becomes either

* a Lightning Attention layer (``"lightning"``, spec §1.5) with HyPE: RoPE on q and k (the
  teacher's base), QK RMSNorm (the teacher's q/k norm weights, ones if it has none), K/V heads
  expanded from GQA to MHA by ``repeat_interleave`` over heads (new head ``h`` = teacher KV head
  ``h // g``, spec §2.2 and §6 item 12), the output RMSNorm over all heads initialised to ones,
  the sigmoid output gate ``z_proj ~ U(-1/sqrt(D), 1/sqrt(D))`` (spec §2.3), no short
  convolution; ``W_q``, ``W_o`` copied; or
* a softmax attention layer that keeps the teacher's weights, drops RoPE (``"attn_nope"``), gains
  the output gate ``o_gate ~ N(0, 0.02^2)`` (spec §2.3, at Stage 2), and at inference uses the
  dynamic logit scaling ``s_t = log_a(t + a)`` (``AttentionConfig.logit_scaling_base``, §1.6).

Norms, MLPs, embeddings and the final norm are copied. The selection-sweep and Stage-1 models are
the same conversion with other options (``attention_rope=True, attention_gate=False``); with every
layer kept as attention, RoPE kept, no gate and no logit scaling, the converted model is the
teacher exactly.
"""

import dataclasses
import math
from typing import Dict, Iterable, Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np

from lattn_jax import config as config_lib
from lattn_jax.halo import loaders
from lattn_jax.typing import PyTree


def hypenet_config(teacher: config_lib.ModelConfig, attention_layers: Iterable[int], *,
                   attention_rope: bool = False, attention_gate: bool = True,
                   logit_scaling_base: Optional[float] = None,
                   tie_embeddings: Optional[bool] = None,
                   lightning_implementation: str = "auto",
                   lightning_alibi_max_bias: float = 8.0,
                   lightning_qk_norm: bool = True,
                   dtype: Optional[str] = None,
                   param_dtype: Optional[str] = None,
                   split_projections: Optional[bool] = None,
                   swiglu_packed: Optional[bool] = None) -> config_lib.ModelConfig:
    """The HypeNet student configuration for a (Llama/Qwen3-like, all-``"attn"``) teacher.

    Args:
      teacher: the teacher's configuration (every layer ``"attn"``).
      attention_layers: 0-based indices of the layers kept as softmax attention; the others
        become Lightning Attention. HypeNet keeps ``floor(L / 4)`` (spec §3.2 item 5).
      attention_rope: keep RoPE in the attention layers (the teacher and the selection sweep);
        HypeNet's final model is NoPE (``False``).
      attention_gate: add the sigmoid output gate to the attention layers (HypeNet: on).
      logit_scaling_base: ``a`` of ``s_t = log_a(t + a)`` (inference only; ``None`` in training).
      tie_embeddings: ``None`` keeps the teacher's; ``True`` ties the head to the embedding as
        the authors' loaders force (spec §6 item 11).
      lightning_implementation: ``LightningConfig.implementation``.
      lightning_alibi_max_bias: ``LightningConfig.alibi_max_bias`` (HypeNet: 8; another value
        is an ablation of the Lightning layers' longest memory, outside the spec).
      lightning_qk_norm: ``LightningConfig.qk_norm`` (HypeNet: on, its Qwen3 teachers' trained
        QK norms copied, spec §2.2). ``False`` is an ablation for teachers without QK norms
        (SmolLM2, Llama): there HypeNet's layers get new all-ones norms, and the per-head
        RMSNorm drops the magnitudes of ``q`` and ``k`` that the teacher's attention used.
      dtype, param_dtype: override the teacher's dtypes.
      split_projections: ``ModelConfig.split_projections`` (the fused projections' column
        blocks as separate products: same values, no cotangent concatenate in the backward);
        ``None`` keeps the teacher's.
      swiglu_packed: ``ModelConfig.swiglu_packed`` (the MLP's ``fc1`` as one product and
        ``lattn_jax.layers.swiglu_packed``: same parameters and values, one ``[.., 2F]``
        cotangent; the MOSAIC_GPU.md Sec. 46.2 experiment); ``None`` keeps the teacher's.

    Returns:
      A validated :class:`~lattn_jax.config.ModelConfig`: Lightning heads = teacher query heads
      (MHA), head dim = teacher head dim, ``scale = 1/sqrt(dh)``, no segment resets.

    Raises:
      ValueError: if the teacher has a non-attention layer or an index is out of range.
    """
    if any(name != "attn" for name in teacher.layer_pattern):
        raise ValueError(f"the teacher must be all 'attn' layers, got {teacher.layer_pattern}")
    keep = set(int(i) for i in attention_layers)
    bad = sorted(i for i in keep if not 0 <= i < teacher.num_layers)
    if bad:
        raise ValueError(f"attention layer indices {bad} are outside [0, {teacher.num_layers})")
    att = teacher.attention
    attn_name = "attn" if attention_rope else "attn_nope"
    pattern = tuple(attn_name if i in keep else "lightning" for i in range(teacher.num_layers))
    return dataclasses.replace(
        teacher,
        layer_pattern=pattern,
        tie_embeddings=teacher.tie_embeddings if tie_embeddings is None else tie_embeddings,
        use_segment_ids=False,
        dtype=dtype or teacher.dtype,
        param_dtype=param_dtype or teacher.param_dtype,
        split_projections=(teacher.split_projections if split_projections is None
                           else bool(split_projections)),
        swiglu_packed=(teacher.swiglu_packed if swiglu_packed is None else bool(swiglu_packed)),
        attention=dataclasses.replace(att, output_gate=attention_gate,
                                      logit_scaling_base=logit_scaling_base),
        lightning=config_lib.LightningConfig(
            num_heads=att.num_heads, num_kv_heads=att.num_heads,
            head_dim=teacher.attention_head_dim, rope_theta=att.rope_theta,
            qk_norm=bool(lightning_qk_norm),
            output_norm=True, output_gate=True, scale="1/sqrt(d)", conv_width=0,
            implementation=lightning_implementation,
            alibi_max_bias=lightning_alibi_max_bias),
    )


def expand_kv_heads(kernel: np.ndarray, num_kv_heads: int, num_heads: int) -> np.ndarray:
    """GQA -> MHA: repeats each KV head's columns ``g = H / G`` times, consecutively.

    ``[D, G dh] -> [D, H dh]`` with new head ``h`` = old head ``h // g`` (PyTorch
    ``repeat_interleave`` over heads, Qwen's ``repeat_kv`` grouping; spec §2.2, §6 item 12).

    Raises:
      ValueError: if ``num_heads`` is not a multiple of ``num_kv_heads`` or widths disagree.
    """
    d, width = kernel.shape
    if num_heads % num_kv_heads or width % num_kv_heads:
        raise ValueError(f"cannot expand {kernel.shape=} from {num_kv_heads} to {num_heads} heads")
    dh = width // num_kv_heads
    k = np.asarray(kernel).reshape(d, num_kv_heads, dh)  # [D, G, dh]
    return np.repeat(k, num_heads // num_kv_heads, axis=1).reshape(d, num_heads * dh)


def split_qkv(kernel: np.ndarray, cfg: config_lib.ModelConfig, *, gated: bool = False):
    """Splits a fused attention kernel ``[D, (H [+ H] + 2 G) dh]`` into ``(q, gate, k, v)``."""
    h, g, dh = cfg.attention.num_heads, cfg.attention.num_kv_heads, cfg.attention_head_dim
    sizes = [h * dh] + ([h * dh] if gated else []) + [g * dh]
    parts = np.split(np.asarray(kernel), np.cumsum(sizes), axis=1)
    if gated:
        return parts[0], parts[1], parts[2], parts[3]
    return parts[0], None, parts[1], parts[2]


def lightning_from_attention(mixer: Mapping, teacher: config_lib.ModelConfig,
                             student: config_lib.ModelConfig, key: jax.Array) -> Dict:
    """Stage-1 initialisation of one Lightning layer from a teacher attention layer (spec §2.2).

    Args:
      mixer: the teacher layer's mixer params (``qkv_proj``, ``out_proj``, optional norms).
      teacher: the teacher config; ``student``: the HypeNet config (its ``lightning`` section).
      key: PRNG key of the ``z_proj`` init ``U(-1/sqrt(D), 1/sqrt(D))``.

    Returns:
      The Lightning mixer params (numpy fp32): ``q_proj``, ``k_proj``/``v_proj`` expanded to MHA,
      ``q_norm``/``k_norm`` (teacher's or ones; absent when ``student.lightning.qk_norm`` is
      off), ``o_norm`` ones, ``z_proj``, ``out_proj``.
    """
    att = teacher.attention
    q, _, k, v = split_qkv(mixer["qkv_proj"]["kernel"], teacher)
    h, dh, d = att.num_heads, teacher.attention_head_dim, teacher.d_model
    ones = np.ones((dh,), np.float32)
    bound = 1.0 / math.sqrt(d)
    norms = {}
    if student.lightning.qk_norm:
        norms = {name: {"scale": np.asarray(mixer[name]["scale"]) if name in mixer else ones}
                 for name in ("q_norm", "k_norm")}
    return {
        "q_proj": {"kernel": np.asarray(q)},
        "k_proj": {"kernel": expand_kv_heads(k, att.num_kv_heads, h)},
        "v_proj": {"kernel": expand_kv_heads(v, att.num_kv_heads, h)},
        **norms,
        "o_norm": {"scale": np.ones((h * dh,), np.float32)},
        "z_proj": {"kernel": np.asarray(jax.random.uniform(key, (d, h * dh), jnp.float32,
                                                           -bound, bound))},
        "out_proj": {"kernel": np.asarray(mixer["out_proj"]["kernel"])},
    }


def attention_from_teacher(mixer: Mapping, teacher: config_lib.ModelConfig,
                           student: config_lib.ModelConfig, key: jax.Array) -> Dict:
    """An attention layer of the student: the teacher's weights, plus ``o_gate ~ N(0, 0.02^2)``
    (spec §2.3) spliced into the fused kernel ``[q | gate | k | v]`` when the student is gated."""
    out = {k: v for k, v in mixer.items() if k != "qkv_proj"}
    if not student.attention.output_gate:
        out["qkv_proj"] = {"kernel": np.asarray(mixer["qkv_proj"]["kernel"])}
        return out
    q, _, k, v = split_qkv(mixer["qkv_proj"]["kernel"], teacher)
    gate = 0.02 * np.asarray(jax.random.normal(key, q.shape, jnp.float32))
    out["qkv_proj"] = {"kernel": np.concatenate([q, gate, k, v], axis=1)}
    return out


def convert(teacher_params: PyTree, teacher: config_lib.ModelConfig,
            student: config_lib.ModelConfig, *, seed: int = 0,
            lightning_params: Optional[Mapping[int, Mapping]] = None) -> PyTree:
    """Converts teacher parameters into a HypeNet (or sweep) student's parameters.

    Args:
      teacher_params: the teacher's pure-dict params (``LanguageModel`` tree).
      teacher: its config; ``student``: from :func:`hypenet_config`.
      seed: seeds the new parameters (``z_proj``, ``o_gate``).
      lightning_params: optional ``{layer: mixer params}`` of trained Stage-1 Lightning layers;
        layers not given are initialised from the teacher (:func:`lightning_from_attention`).

    Returns:
      The student's pure-dict params (validated against ``LanguageModel(student)``, in
      ``student.param_dtype``).

    Raises:
      ValueError: if the layer counts differ or the result does not fit the student.
    """
    if teacher.num_layers != student.num_layers:
        raise ValueError(f"teacher has {teacher.num_layers} layers, student {student.num_layers}")
    keys = jax.random.split(jax.random.key(seed), student.num_layers)
    tp = jax.tree_util.tree_map(np.asarray, teacher_params)
    out = {"embed": tp["embed"], "final_norm": tp["final_norm"], "blocks": {}}
    for i, name in enumerate(student.layer_pattern):
        block = tp["blocks"][i]
        if name == "lightning":
            if lightning_params is not None and i in lightning_params:
                mixer = jax.tree_util.tree_map(np.asarray, dict(lightning_params[i]))
            else:
                mixer = lightning_from_attention(block["mixer"], teacher, student, keys[i])
        else:
            mixer = attention_from_teacher(block["mixer"], teacher, student, keys[i])
        out["blocks"][i] = {"mixer_norm": block["mixer_norm"], "mixer": mixer,
                            "mlp_norm": block["mlp_norm"], "mlp": block["mlp"]}
    if not student.tie_embeddings:
        out["head"] = tp["head"] if "head" in tp else {"kernel": tp["embed"].T}
    return loaders.check_params(out, student, source="HypeNet conversion")


def attention_layer_count(num_layers: int) -> int:
    """HALO keeps ``floor(L / 4)`` softmax layers (spec §3.2 item 5: 7/28, 9/36)."""
    return num_layers // 4
