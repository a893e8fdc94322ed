"""The model side of teacher-generated text: load a teacher, sample ``[B, P]`` batches from it.

``experiments/generate_corpus.py`` writes documents sampled from a teacher as token shards
(``lattn_jax.data.generated``: prompts, filters, shards, resume). This module gives it the model:

* :func:`load_model` reads a GGUF file (:func:`lattn_jax.halo.loaders.load_gguf`, with the
  file's own tokenizer and ``tokenizer.chat_template``) or a lattn-jax training workdir
  (:func:`lattn_jax.eval.restore.load`, with the run's tokenizer), in the requested compute and
  parameter dtype (``"auto"``: bfloat16 on a GPU or TPU, float32 on CPU);
* :class:`Sampler` is a :data:`lattn_jax.data.generated.GenerateFn` over the batched
  :class:`lattn_jax.eval.generate.Generator` (prefill, then decode steps with per-layer caches).
  Every batch has the same shape ``[B, P]`` and the same cache capacity ``P + 1 +
  ceil((max_new_tokens - 1) / decode_chunk) * decode_chunk``, so the prefill and the decode
  chunk compile once per process.
"""

import dataclasses
import hashlib
import os
from typing import Any, List, Optional, Sequence, Tuple

import jax
import numpy as np
from flax import nnx

from lattn_jax import model as model_lib
from lattn_jax.data import tokenizers as tok_lib
from lattn_jax.eval import generate as gen_lib
from lattn_jax.eval import restore
from lattn_jax.halo import loaders

DTYPES = ("auto", "bfloat16", "float32")


@dataclasses.dataclass
class LoadedModel:
    """A model to sample from.

    Attributes:
      model: the :class:`~lattn_jax.model.LanguageModel` (its config's dtype and param dtype
        are the requested ones).
      tokenizer: its tokenizer.
      info: the model's identity for the manifest: ``kind`` (``"gguf"`` or ``"checkpoint"``),
        ``file`` (base name), ``sha256`` (of the GGUF file; of the checkpoint step's files,
        :func:`directory_sha256`), ``step`` (checkpoints), ``dtype``, layers and vocabulary.
      chat_template: the GGUF's ``tokenizer.chat_template`` (Jinja), or ``None``.
    """

    model: model_lib.LanguageModel
    tokenizer: tok_lib.Tokenizer
    info: dict
    chat_template: Optional[str] = None


def resolve_dtype(dtype: str) -> str:
    """``"auto"`` -> ``"bfloat16"`` on an accelerator, ``"float32"`` on CPU.

    Raises:
      ValueError: ``dtype`` not in :data:`DTYPES` (naming ``--dtype``).
    """
    if dtype not in DTYPES:
        raise ValueError(f"--dtype: expected one of {', '.join(DTYPES)}, got {dtype!r}")
    if dtype == "auto":
        return "float32" if jax.default_backend() == "cpu" else "bfloat16"
    return dtype


def directory_sha256(directory: str) -> str:
    """sha256 over the sorted ``(relative path, file sha256)`` lines of every file below
    ``directory``: one fingerprint of a checkpoint step."""
    lines = []
    for dirpath, dirnames, filenames in os.walk(directory):
        dirnames.sort()
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            lines.append(f"{os.path.relpath(path, directory)} {tok_lib.file_sha256(path)}\n")
    return hashlib.sha256("".join(sorted(lines)).encode()).hexdigest()


def _gguf_chat_template(path: str) -> Optional[str]:
    field = tok_lib.open_gguf(path).fields.get("tokenizer.chat_template")
    return None if field is None else str(field.contents())


def _with_dtype(model: model_lib.LanguageModel, dtype: str) -> model_lib.LanguageModel:
    """``model`` rebuilt with compute and parameter dtype ``dtype``."""
    cfg = model.config
    if cfg.dtype == dtype and cfg.param_dtype == dtype:
        return model
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    return loaders.build_model(loaders.cast_config(cfg, dtype=dtype, param_dtype=dtype), params)


def load_model(path: str, *, step: Optional[int] = None, dtype: str = "auto") -> LoadedModel:
    """Loads a GGUF teacher or a lattn-jax checkpoint for sampling.

    Args:
      path: a ``.gguf`` file, or a training workdir (``config.json`` + ``checkpoints/``).
      step: the checkpoint step (workdirs only; default the newest).
      dtype: compute and parameter dtype, one of :data:`DTYPES`.

    Returns:
      :class:`LoadedModel`.

    Raises:
      FileNotFoundError: ``path`` does not exist (named with ``--model``).
      ValueError: an unsupported file, a ``step`` given for a GGUF file, or a bad ``dtype``.
    """
    dtype = resolve_dtype(dtype)
    if not os.path.exists(path):
        raise FileNotFoundError(f"--model: no such GGUF file or checkpoint directory: {path}")
    if os.path.isdir(path):
        restored = restore.load(path, step)
        model = _with_dtype(restored.model, dtype)
        ckpt = os.path.join(path, "checkpoints", str(restored.step))
        info = {"kind": "checkpoint", "file": os.path.basename(os.path.normpath(path)),
                "step": restored.step,
                "sha256": directory_sha256(ckpt) if os.path.isdir(ckpt) else None}
        tokenizer, template = restored.tokenizer, None
    else:
        if step is not None:
            raise ValueError("--step applies to checkpoint directories, not to a GGUF file")
        teacher = loaders.load_gguf(path)
        model = loaders.build_model(
            loaders.cast_config(teacher.model_config, dtype=dtype, param_dtype=dtype),
            teacher.params)
        info = {"kind": "gguf", "file": os.path.basename(path),
                "sha256": teacher.tokenizer.sha256, "family": teacher.family}
        tokenizer, template = teacher.tokenizer, _gguf_chat_template(path)
    cfg = model.config
    info.update(dtype=dtype, layers=list(cfg.layer_pattern), d_model=cfg.d_model,
                vocab_size=cfg.vocab_size)
    if tokenizer.vocab_size > cfg.vocab_size:
        raise ValueError(f"--model: the tokenizer has {tokenizer.vocab_size} ids but the model "
                         f"only {cfg.vocab_size}")
    return LoadedModel(model=model, tokenizer=tokenizer, info=info, chat_template=template)


class Sampler:
    """Samples continuations of fixed-shape prompt batches (a ``GenerateFn``).

    Args:
      model: the model.
      pad_id: the id written into padding slots (never read by the model).
      temperature, top_p, top_k: the sampling (:class:`lattn_jax.eval.generate
        .SamplingConfig`).
      max_new_tokens: the most tokens per row.
      stop_tokens: ids that end a row (kept in its output).
      decode_chunk: decode steps per compiled call (:class:`~lattn_jax.eval.generate
        .Generator`); a row's tokens do not depend on it.

    Raises:
      ValueError: from ``SamplingConfig`` / ``Generator`` for bad values.
    """

    def __init__(self, model: model_lib.LanguageModel, *, pad_id: int, temperature: float,
                 top_p: float, top_k: int, max_new_tokens: int, stop_tokens: Sequence[int],
                 decode_chunk: int = 16):
        self.sampling = gen_lib.SamplingConfig(temperature=temperature, top_p=top_p,
                                               top_k=top_k)
        self.generator = gen_lib.Generator(model, pad_id=pad_id, bucket=1,
                                           decode_chunk=decode_chunk)
        self.max_new_tokens = int(max_new_tokens)
        self.stop_tokens = [int(s) for s in stop_tokens]

    def __call__(self, tokens: np.ndarray, mask: np.ndarray, seed: int
                 ) -> Tuple[List[List[int]], List[bool]]:
        """Generates from int ``[B, P]`` left-padded prompts and their bool ``[B, P]`` mask.

        Returns:
          ``(tokens per row, finished per row)`` as :meth:`Generator.generate_padded` gives
          them (stop token included).
        """
        out = self.generator.generate_padded(tokens, mask, max_new_tokens=self.max_new_tokens,
                                             sampling=self.sampling,
                                             stop_tokens=self.stop_tokens, seed=seed)
        return out.tokens, out.finished


def device_info() -> dict[str, Any]:
    """The backend, device kind and count, and the jax version (for a run's record)."""
    devices = jax.devices()
    return {"backend": jax.default_backend(), "device": devices[0].device_kind,
            "devices": len(devices), "jax": jax.__version__}
