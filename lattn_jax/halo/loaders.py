"""Pretrained Transformer teachers into our Flax model: Hugging Face checkpoints and GGUF files.

HALO (arXiv 2601.22156; spec ``hypenet-halo.md`` §2.1) starts from a pretrained Transformer. This
module reads one into :class:`~lattn_jax.model.LanguageModel` parameters, for the Llama and
Qwen3 families:

* Hugging Face: a directory with ``config.json`` and ``model.safetensors`` (or a sharded
  ``model.safetensors.index.json``), :func:`load_hf`;
* GGUF (llama.cpp): one ``.gguf`` file read with the ``gguf`` package, :func:`load_gguf`. Tensors
  are dequantized to fp32 (``gguf.quants.dequantize``); llama.cpp's converter permutes the rows of
  ``attn_q``/``attn_k`` of ``llama`` models (interleaved RoPE pairs), which we undo
  (:func:`unpermute_llama_qk`); the tokenizer comes from the GGUF metadata
  (:class:`lattn_jax.data.GGUFTokenizer`).

Both formats first become a flat mapping of Hugging Face names (``model.layers.3.self_attn.q_proj
.weight``, PyTorch ``[out, in]`` layout) to fp32 numpy arrays, then :func:`params_from_hf_state`
maps that onto our parameter tree: ``Dense`` kernels are ``[in, out]``, the attention projection
is fused ``[q | k | v]`` and the MLP's ``fc1`` is fused ``[gate | up]``.

With ``params=False`` (:func:`load_teacher`, :func:`load_hf`, :func:`load_gguf`) only the
configuration and the tokenizer are read: the GGUF metadata and tensor headers (the tensor data
stays memory-mapped, untouched), or ``config.json`` and ``tokenizer.json``, no safetensors. That
is what a converted student needs of its teacher (:func:`lattn_jax.halo.experiment
.load_student`).

Nothing is downloaded: every path must exist locally. Errors name the file and the field.
"""

import dataclasses
import json
import os
from typing import Any, Dict, Mapping, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lattn_jax import config as config_lib
from lattn_jax import model as model_lib
from lattn_jax.typing import PyTree

# Hugging Face ``model_type`` values we can load, and the GGUF ``general.architecture`` values.
HF_MODEL_TYPES: Tuple[str, ...] = ("llama", "qwen3")
GGUF_ARCHITECTURES: Tuple[str, ...] = ("llama", "qwen3")


@dataclasses.dataclass(frozen=True)
class Teacher:
    """A loaded pretrained model.

    Attributes:
      model_config: our :class:`~lattn_jax.config.ModelConfig` (all layers ``"attn"``, fp32).
      params: the parameter tree of :class:`~lattn_jax.model.LanguageModel` (fp32 arrays), as
        produced by ``nnx.to_pure_dict``; ``None`` when loaded with ``params=False`` (the
        configuration and tokenizer only).
      family: ``"llama"`` or ``"qwen3"``.
      path: the file or directory it was read from.
      tokenizer: a :class:`lattn_jax.data.Tokenizer` when the checkpoint carries one
        (GGUF metadata, or ``tokenizer.json`` next to ``config.json``), else ``None``.
    """

    model_config: config_lib.ModelConfig
    params: Optional[PyTree]
    family: str
    path: str
    tokenizer: Any = None


# ---------------------------------------------------------------------------------------------
# Hugging Face
# ---------------------------------------------------------------------------------------------

def _rope_theta(hf: Mapping[str, Any], path: str) -> float:
    """RoPE base from ``rope_theta`` or ``rope_parameters`` (transformers >= 5).

    Raises:
      ValueError: RoPE scaling other than ``"default"``, or no ``rope_theta``.
    """
    params = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling") or None
    rope_type = (params.get("rope_type") or params.get("type") or
                 (scaling or {}).get("rope_type") or (scaling or {}).get("type") or "default")
    if rope_type != "default":
        raise ValueError(f"{path}: rope type {rope_type!r} (rope_scaling / rope_parameters) is "
                         f"not supported; only the default RoPE is")
    theta = params.get("rope_theta", hf.get("rope_theta"))
    if theta is None:
        raise ValueError(f"{path}: config has no rope_theta")
    return float(theta)


def model_config_from_hf(hf: Mapping[str, Any], path: str = "config.json"
                         ) -> Tuple[config_lib.ModelConfig, str]:
    """Our model configuration for a Hugging Face Llama or Qwen3 ``config.json``.

    Args:
      hf: the parsed ``config.json``.
      path: its path, for error messages.

    Returns:
      ``(model_config, family)``: all layers ``"attn"`` with the checkpoint's RoPE base, RMSNorm
      epsilon, head dim, GQA, tied embeddings and (Qwen3) QK norm; fp32; no segment resets.

    Raises:
      ValueError: naming ``path`` and the field, for an unsupported ``model_type``, biases,
        RoPE scaling, a non-SiLU activation or sliding-window attention.
    """
    family = hf.get("model_type")
    if family not in HF_MODEL_TYPES:
        raise ValueError(f"{path}: model_type={family!r} is not supported; choose from "
                         f"{', '.join(HF_MODEL_TYPES)}")
    for flag in ("attention_bias", "mlp_bias"):
        if hf.get(flag):
            raise ValueError(f"{path}: {flag}=true is not supported (our projections have no "
                             f"bias)")
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"{path}: hidden_act={hf.get('hidden_act')!r}; only 'silu' (SwiGLU)")
    if hf.get("use_sliding_window"):
        raise ValueError(f"{path}: use_sliding_window=true is not supported")
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "intermediate_size"):
        if key not in hf:
            raise ValueError(f"{path}: config has no {key}")
    heads = int(hf["num_attention_heads"])
    head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
    cfg = config_lib.ModelConfig(
        vocab_size=int(hf["vocab_size"]),
        d_model=int(hf["hidden_size"]),
        layer_pattern=("attn",) * int(hf["num_hidden_layers"]),
        mlp_hidden=int(hf["intermediate_size"]),
        tie_embeddings=bool(hf.get("tie_word_embeddings", family == "qwen3")),
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        use_segment_ids=False,
        attention=config_lib.AttentionConfig(
            num_heads=heads, num_kv_heads=int(hf.get("num_key_value_heads") or heads),
            head_dim=int(head_dim), rope_theta=_rope_theta(hf, path), qk_norm=family == "qwen3"),
    )
    return cfg, family


def _read_safetensors(directory: str) -> Dict[str, np.ndarray]:
    """All tensors of ``model.safetensors`` (or its sharded index) as fp32 numpy arrays."""
    from safetensors import safe_open

    single = os.path.join(directory, "model.safetensors")
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(single):
        files = [single]
    elif os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f).get("weight_map")
        if not weight_map:
            raise ValueError(f"{index}: no weight_map")
        files = [os.path.join(directory, name) for name in sorted(set(weight_map.values()))]
    else:
        raise FileNotFoundError(f"{directory}: no model.safetensors or "
                                f"model.safetensors.index.json")
    out = {}
    for name in files:
        if not os.path.exists(name):
            raise FileNotFoundError(f"{name}: shard listed in {index} is missing")
        with safe_open(name, framework="flax") as f:  # jax arrays: bf16 survives
            for key in f.keys():
                out[key] = np.asarray(f.get_tensor(key).astype(jnp.float32))
    return out


def load_hf(directory: str, *, params: bool = True) -> Teacher:
    """Loads a Hugging Face Llama / Qwen3 checkpoint directory (``config.json`` + safetensors).

    Args:
      directory: a local directory (never a hub id: nothing is downloaded).
      params: also read and convert the weights; ``False``: only ``config.json`` and
        ``tokenizer.json`` are read (no safetensors file is opened or looked for).

    Returns:
      The :class:`Teacher` (fp32 parameters, ``None`` with ``params=False``; ``tokenizer`` from
      ``tokenizer.json`` if present).

    Raises:
      FileNotFoundError: the directory or ``config.json`` is missing, or (with ``params``) the
        weights.
      ValueError: an unsupported architecture or option (see :func:`model_config_from_hf`), or
        (with ``params``) a missing / misshapen tensor (named).
    """
    config_path = os.path.join(directory, "config.json")
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"{directory}: no such checkpoint directory")
    if not os.path.exists(config_path):
        raise FileNotFoundError(f"{config_path}: no such file")
    with open(config_path) as f:
        hf = json.load(f)
    cfg, family = model_config_from_hf(hf, config_path)
    tree = None
    if params:
        tree = params_from_hf_state(_read_safetensors(directory), cfg, source=directory)
    tokenizer = None
    tok_path = os.path.join(directory, "tokenizer.json")
    if os.path.exists(tok_path):
        from lattn_jax import data as data_lib
        tokenizer = data_lib.HuggingFaceTokenizer(tok_path)
    return Teacher(model_config=cfg, params=tree, family=family, path=directory,
                   tokenizer=tokenizer)


def params_from_hf_state(state: Mapping[str, np.ndarray], cfg: config_lib.ModelConfig, *,
                         source: str = "checkpoint") -> PyTree:
    """Maps Hugging Face Llama/Qwen3 tensors onto our :class:`LanguageModel` parameter tree.

    ``W_ours = W_hf^T`` for every linear (``[in, out]`` vs ``[out, in]``);
    ``qkv_proj = [q_proj^T | k_proj^T | v_proj^T]``; ``fc1 = [gate_proj^T | up_proj^T]``;
    ``fc2 = down_proj^T``; norms copied (``input_layernorm`` -> ``mixer_norm``,
    ``post_attention_layernorm`` -> ``mlp_norm``, ``model.norm`` -> ``final_norm``);
    ``lm_head`` -> ``head`` unless the embeddings are tied.

    Args:
      state: HF name -> fp32 ``[out, in]`` (or ``[dim]``) arrays.
      cfg: the model configuration (from :func:`model_config_from_hf` or the GGUF header).
      source: file or directory name for error messages.

    Returns:
      A pure-dict parameter tree (fp32 ``jnp`` arrays) matching ``LanguageModel(cfg)``.

    Raises:
      ValueError: a tensor is missing or has the wrong shape (named with ``source``).
    """
    def get(name):
        if name not in state:
            raise ValueError(f"{source}: tensor {name!r} is missing")
        return np.asarray(state[name], np.float32)

    params: Dict[str, Any] = {"embed": get("model.embed_tokens.weight"),
                              "final_norm": {"scale": get("model.norm.weight")}, "blocks": {}}
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        mixer = {
            "qkv_proj": {"kernel": np.concatenate(
                [get(p + f"self_attn.{n}_proj.weight").T for n in "qkv"], axis=1)},
            "out_proj": {"kernel": get(p + "self_attn.o_proj.weight").T},
        }
        if cfg.attention.qk_norm:
            mixer["q_norm"] = {"scale": get(p + "self_attn.q_norm.weight")}
            mixer["k_norm"] = {"scale": get(p + "self_attn.k_norm.weight")}
        params["blocks"][i] = {
            "mixer_norm": {"scale": get(p + "input_layernorm.weight")},
            "mixer": mixer,
            "mlp_norm": {"scale": get(p + "post_attention_layernorm.weight")},
            "mlp": {"fc1": {"kernel": np.concatenate(
                        [get(p + "mlp.gate_proj.weight").T, get(p + "mlp.up_proj.weight").T],
                        axis=1)},
                    "fc2": {"kernel": get(p + "mlp.down_proj.weight").T}},
        }
    if not cfg.tie_embeddings:
        name = "lm_head.weight" if "lm_head.weight" in state else "model.embed_tokens.weight"
        params["head"] = {"kernel": get(name).T}
    return check_params(params, cfg, source=source)


def check_params(params: PyTree, cfg: config_lib.ModelConfig, *, source: str = "params"
                 ) -> PyTree:
    """Checks ``params`` against ``LanguageModel(cfg)``'s tree and shapes; returns jnp arrays.

    Raises:
      ValueError: naming the first missing, unexpected or misshapen entry.
    """
    abstract = abstract_params(cfg)
    flat_ref = dict(_flatten(abstract))
    flat = dict(_flatten(params))
    missing = sorted(set(flat_ref) - set(flat))
    extra = sorted(set(flat) - set(flat_ref))
    if missing or extra:
        raise ValueError(f"{source}: parameter tree mismatch: missing {missing[:5]}, "
                         f"unexpected {extra[:5]}")
    for key, ref in flat_ref.items():
        if tuple(flat[key].shape) != tuple(ref.shape):
            raise ValueError(f"{source}: {'/'.join(map(str, key))} has shape "
                             f"{tuple(flat[key].shape)}, expected {tuple(ref.shape)}")
    dtype = jnp.dtype(cfg.param_dtype)
    return jax.tree_util.tree_map(lambda x: jnp.asarray(x, dtype), params)


def _flatten(tree, prefix=()):
    if isinstance(tree, Mapping):
        for k, v in tree.items():
            yield from _flatten(v, prefix + (k,))
    else:
        yield prefix, tree


def abstract_params(cfg: config_lib.ModelConfig) -> PyTree:
    """``LanguageModel(cfg)``'s parameter tree as ``jax.ShapeDtypeStruct`` leaves (pure dict)."""
    model = nnx.eval_shape(lambda: model_lib.LanguageModel(cfg, rngs=nnx.Rngs(0)))
    return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def build_model(cfg: config_lib.ModelConfig, params: PyTree) -> model_lib.LanguageModel:
    """A :class:`LanguageModel` with the given pure-dict parameters (no random init is run).

    Raises:
      ValueError: from :func:`check_params` if the tree does not fit ``cfg``.
    """
    params = check_params(params, cfg)
    model = nnx.eval_shape(lambda: model_lib.LanguageModel(cfg, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(model, nnx.Param)
    nnx.replace_by_pure_dict(state, params)
    return nnx.merge(graphdef, state)


# ---------------------------------------------------------------------------------------------
# GGUF
# ---------------------------------------------------------------------------------------------

# GGUF tensor name (after ``blk.N.``) -> Hugging Face name (after ``model.layers.N.``).
_GGUF_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GGUF_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm",
                      "output": "lm_head"}


def unpermute_llama_qk(w: np.ndarray, num_heads: int) -> np.ndarray:
    """Undoes llama.cpp's ``permute`` of a ``llama`` q/k projection.

    ``convert_hf_to_gguf.py`` stores ``W.reshape(n, 2, dh/2, D).swapaxes(1, 2).reshape(W.shape)``
    (``n`` = query heads for ``attn_q``, KV heads for ``attn_k``) so that llama.cpp can use
    interleaved RoPE pairs; this returns the Hugging Face (rotate-half) row order.

    Args:
      w: ``[n * dh, D]`` rows in GGUF order.
      num_heads: ``n``.

    Raises:
      ValueError: if the rows do not split into ``num_heads`` even-sized heads.
    """
    rows = w.shape[0]
    if rows % num_heads or (rows // num_heads) % 2:
        raise ValueError(f"cannot unpermute {w.shape=} over {num_heads} heads")
    dh = rows // num_heads
    return w.reshape(num_heads, dh // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _field(reader, key: str, path: str, default: Any = None, required: bool = True):
    field = reader.fields.get(key)
    if field is None:
        if required:
            raise ValueError(f"{path}: GGUF metadata field {key!r} is missing")
        return default
    return field.contents()


def load_gguf(path: str, *, with_tokenizer: bool = True, params: bool = True) -> Teacher:
    """Loads a llama.cpp GGUF file of the Llama or Qwen3 family.

    Every tensor is dequantized to fp32 (``gguf.quants.dequantize``; F32/F16/BF16 and the
    ``Q*`` / ``K`` formats the package supports), ``llama`` q/k rows are un-permuted
    (:func:`unpermute_llama_qk`), and the configuration comes from the ``<arch>.*`` metadata:
    ``embedding_length``, ``block_count``, ``feed_forward_length``, ``attention.head_count``,
    ``attention.head_count_kv``, ``attention.key_length`` (head dim, default ``D / H``),
    ``rope.freq_base``, ``attention.layer_norm_rms_epsilon``; the embeddings are tied when the
    file has no ``output.weight``, and the vocabulary defaults to ``token_embd.weight``'s rows
    (read from the tensor's header).

    Args:
      path: a local ``.gguf`` file.
      with_tokenizer: also build the tokenizer from ``tokenizer.ggml.*``.
      params: also dequantize and convert the tensors; ``False``: only the metadata and the
        tensors' names and shapes are read (the tensor data is memory-mapped by the reader,
        never touched), so a file whose tensor data is short or garbled is not noticed.

    Returns:
      The :class:`Teacher` (fp32 parameters, ``None`` with ``params=False``).

    Raises:
      FileNotFoundError: ``path`` does not exist.
      lattn_jax.config.ConfigError: the file does not parse, or (with ``params``) a tensor's
        data does not fit its shape (truncated or garbage: ``<path> is not a readable GGUF
        file: ...``, the tokenizer's message, :func:`lattn_jax.data.tokenizers.unreadable_gguf`).
      ValueError: an unsupported ``general.architecture``, RoPE scaling (``rope_freqs`` tensor
        or ``rope.scaling.type``), an unexpected tensor name, a missing metadata field or
        ``token_embd.weight`` (named); with ``params``, a missing tensor (named).
    """
    from lattn_jax.data import tokenizers

    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such GGUF file")
    reader = tokenizers.open_gguf(path)
    arch = _field(reader, "general.architecture", path)
    if arch not in GGUF_ARCHITECTURES:
        raise ValueError(f"{path}: general.architecture={arch!r} is not supported; choose from "
                         f"{', '.join(GGUF_ARCHITECTURES)}")
    scaling = _field(reader, f"{arch}.rope.scaling.type", path, required=False)
    if scaling not in (None, "none"):
        raise ValueError(f"{path}: {arch}.rope.scaling.type={scaling!r} is not supported")
    d = int(_field(reader, f"{arch}.embedding_length", path))
    heads = int(_field(reader, f"{arch}.attention.head_count", path))
    kv_heads = int(_field(reader, f"{arch}.attention.head_count_kv", path, default=heads,
                          required=False))
    head_dim = int(_field(reader, f"{arch}.attention.key_length", path, default=d // heads,
                          required=False))
    tensors = _gguf_hf_names(reader, path)
    if "model.embed_tokens.weight" not in tensors:
        raise ValueError(f"{path}: tensor 'token_embd.weight' is missing")
    # The header's ggml dims are innermost first: [D, vocab] for token_embd.
    embed_rows = int(tensors["model.embed_tokens.weight"].shape[-1])
    vocab = int(_field(reader, f"{arch}.vocab_size", path, default=embed_rows, required=False))
    cfg = config_lib.ModelConfig(
        vocab_size=vocab, d_model=d,
        layer_pattern=("attn",) * int(_field(reader, f"{arch}.block_count", path)),
        mlp_hidden=int(_field(reader, f"{arch}.feed_forward_length", path)),
        tie_embeddings="lm_head.weight" not in tensors,
        norm_eps=float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon", path)),
        use_segment_ids=False,
        attention=config_lib.AttentionConfig(
            num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
            rope_theta=float(_field(reader, f"{arch}.rope.freq_base", path,
                                    default=10000.0 if arch == "llama" else 1e6,
                                    required=False)),
            qk_norm=arch == "qwen3"),
    )
    tree = None
    if params:
        state = _gguf_state(tensors, path, arch, heads=heads, kv_heads=kv_heads)
        tree = params_from_hf_state(state, cfg, source=path)
    tokenizer = None
    if with_tokenizer:
        from lattn_jax import data as data_lib
        tokenizer = data_lib.GGUFTokenizer(path, reader=reader)  # the metadata parsed once
    return Teacher(model_config=cfg, params=tree, family=arch, path=path, tokenizer=tokenizer)


def _gguf_hf_names(reader, path: str) -> Dict[str, Any]:
    """A GGUF file's tensors by Hugging Face name (``gguf.ReaderTensor`` values; their data is
    not read).

    Raises:
      ValueError: a ``rope_freqs.weight`` tensor (RoPE scaling) or an unexpected name.
    """
    out = {}
    for tensor in reader.tensors:
        name = tensor.name
        if name == "rope_freqs.weight":
            raise ValueError(f"{path}: tensor rope_freqs.weight (RoPE frequency scaling) is not "
                             f"supported")
        stem, _, suffix = name.rpartition(".")
        if stem.startswith("blk."):
            _, layer, short = stem.split(".", 2)
            if short not in _GGUF_LAYER_NAMES:
                raise ValueError(f"{path}: unexpected tensor {name!r}")
            hf_name = f"model.layers.{layer}.{_GGUF_LAYER_NAMES[short]}.{suffix}"
        elif stem in _GGUF_GLOBAL_NAMES:
            hf_name = f"{_GGUF_GLOBAL_NAMES[stem]}.{suffix}"
        else:
            raise ValueError(f"{path}: unexpected tensor {name!r}")
        out[hf_name] = tensor
    return out


def _gguf_state(tensors: Mapping[str, Any], path: str, arch: str, *, heads: int,
                kv_heads: int) -> Dict[str, np.ndarray]:
    """The tensors of :func:`_gguf_hf_names` dequantized to fp32 numpy arrays (``[out, in]``
    Hugging Face layout), ``llama`` q/k rows un-permuted.

    Raises:
      lattn_jax.config.ConfigError: a tensor's data does not fit its shape (named).
    """
    import gguf

    from lattn_jax.data import tokenizers

    state: Dict[str, np.ndarray] = {}
    for hf_name, tensor in tensors.items():
        name = tensor.name
        try:  # a short or inconsistent tensor: numpy's reshape / view errors, named here
            w = np.asarray(gguf.quants.dequantize(tensor.data, tensor.tensor_type), np.float32)
            if arch == "llama" and short_name(name) in ("attn_q", "attn_k"):
                w = unpermute_llama_qk(w, heads if short_name(name) == "attn_q" else kv_heads)
        except Exception as e:  # noqa: BLE001 - numpy/gguf: ValueError, IndexError, ...
            raise tokenizers.unreadable_gguf(path, f"tensor {name!r}: {e}") from e
        state[hf_name] = w
    return state


def short_name(gguf_name: str) -> str:
    """``"blk.3.attn_q.weight"`` -> ``"attn_q"``; global tensors -> their stem."""
    stem = gguf_name.rpartition(".")[0]
    return stem.split(".", 2)[2] if stem.startswith("blk.") else stem


def load_teacher(path: str, kind: str = "auto", *, params: bool = True) -> Teacher:
    """Loads a teacher from a GGUF file or a Hugging Face directory.

    Args:
      path: a ``.gguf`` file or a checkpoint directory.
      kind: ``"auto"`` (by ``path``), ``"gguf"`` or ``"hf"``.
      params: also read the weights; ``False``: the configuration and tokenizer only
        (``Teacher.params`` is ``None``; see :func:`load_hf`, :func:`load_gguf`).

    Returns:
      The :class:`Teacher`.

    Raises:
      FileNotFoundError: ``path`` does not exist.
      ValueError: an unknown ``kind`` or an unsupported checkpoint.
    """
    if kind == "auto":
        kind = "hf" if os.path.isdir(path) else "gguf"
    if kind == "hf":
        return load_hf(path, params=params)
    if kind == "gguf":
        return load_gguf(path, params=params)
    raise ValueError(f"teacher kind={kind!r}; choose auto, hf or gguf")


def cast_config(cfg: config_lib.ModelConfig, dtype: Optional[str] = None,
                param_dtype: Optional[str] = None) -> config_lib.ModelConfig:
    """``cfg`` with another compute and/or parameter dtype."""
    return dataclasses.replace(cfg, dtype=dtype or cfg.dtype,
                               param_dtype=param_dtype or cfg.param_dtype)
