"""The HALO report: the teacher against its converted HypeNet student (arXiv 2601.22156).

:func:`run_report` measures both models (spec ``hypenet-halo.md`` §4) and writes
``report.json`` and ``report.md`` in its directory after every measurement; a run that finds a
measurement of a model there (with the same options) skips it, so the stage resumes after an
interruption. Measurements (run in the order ``options.measurements`` lists them):

1. ``speed``: batch 1, per context length ``L`` in ``speed_lengths``: the prefill of a prompt of
   ``P = L - niah_max_new_tokens`` tokens of real text (median wall time of ``speed_repeats``
   jitted calls after a warm-up, ``jax.block_until_ready``), then ``speed_decode_tokens`` greedy
   decoding steps with the caches sized ``P + speed_decode_tokens`` (mean time per token after
   one warm-up step; spec §4.4). Memory: the bytes of the decoding state pytrees (attention KV
   caches and recurrent states, from the arrays' ``nbytes``), and the device's
   ``bytes_in_use``/``peak_bytes_in_use`` (``memory_stats()``; the peak is the process's, so it
   also covers everything run before).
2. ``perplexity``: sliding-window perplexity (:mod:`lattn_jax.eval.perplexity`, disjoint windows
   of ``perplexity_window`` tokens) of the WikiText-2 raw test text.
   ``corpus_perplexity``: the same windows over the first ``corpus_perplexity_tokens`` tokens of
   the distillation corpus's validation split (token-shard directories
   ``corpus_perplexity_paths``; documents in order, the last one cut), each document scored on
   its own after one EOS. Beside WikiText-2 it separates the student's in-distribution gap
   from the gap that comes from the corpus being unlike the evaluation text.
3. ``commonsense``: the zero-shot tasks of :mod:`lattn_jax.eval.tasks` (lm-eval prompts,
   ``acc``/``acc_norm``, each with its binomial standard error ``sqrt(p (1 - p) / n)``) on
   ``csr_limit`` documents each (the seeded subsample of
   :func:`lattn_jax.eval.tasks.load_task`; ARC from its Test files), read from
   ``<data_dir>/eval``; the page adds the mean over the tasks (``acc_norm``, ``acc`` where a
   task has none) with SE ``sqrt(sum SE_i^2) / n_tasks``.
4. ``niah``: RULER needles (:mod:`lattn_jax.eval.niah`: ``niah_single_*`` and the multi-key
   ``niah_multikey_1``) over ``niah_lengths x niah_depths`` with ``niah_samples`` prompts per
   cell, greedy decoding of ``niah_max_new_tokens`` tokens, scored with ``string_match_all``.
   The prompts (and their token ids) are built once for both models
   (:class:`lattn_jax.eval.niah.SampleBuilder`). The unit of work is a *part*: the
   ``len(niah_depths) x niah_samples`` prompts of one (model, task, length), decoded in
   batches of ``niah_batch_size(L, count, niah_batch_tokens)`` rows (:class:`NiahDecoder`: the
   first ``P`` tokens of every row prefilled with the plain causal forward, the rest of each
   prompt fed as decoding steps, so no padding and no attention mask). ``P`` and the width of
   the rest are fixed per length over all tasks, so each model compiles one prefill and one
   chunk of decoding steps per length, and a part's answers do not depend on which other
   parts ran in the same process. On an accelerator those programs are compiled for every
   length at once before the first part, in a thread pool (:meth:`NiahDecoder.precompile`).
   After each part its accuracy is printed and its answers are appended to
   ``<stage_dir>/niah_parts.jsonl`` (:func:`niah_answers`); a run that finds
   parts of the same options there skips them and scores the measurement from that file, so
   an interrupted NIAH measurement loses at most the part it was decoding and resumes
   with the same result as an uninterrupted run. (A part per task costs a few more batches
   than batching a length's tasks together when a part's count is not a multiple of the rows
   per batch: 84 instead of 77 batches per model on the ``h200`` grid.) Per task and
   length: the mean and its binomial SE; the means over the lengths up to
   ``niah_short_max_len`` (2K-8K, the teacher's trained context) and above it (16K-64K).

5. ``niah_forced``: the same NIAH prompts up to ``niah_short_max_len`` (inside the teacher's
   context), teacher-forced with the gold answer ``" " + value`` (tokenised on its own after
   the prompt's ids): per prompt the probability of the answer's first token and whether it
   is the argmax, and the mean probability of the other answer tokens given the gold ones
   before them and whether all of them are argmaxes (:func:`niah_forced_scores`). A greedy
   answer that misses the value (``niah``) either did not rank the value's first token first
   or lost the value later; this separates the two, and a low first-token probability with
   high later ones means the model can copy the value but does not start with it. The first
   token is that of the gold string ``" " + value``: a model whose own answers begin another
   way (SmolLM2-135M-Instruct answers single-3 with ``": <value>"``, 2026-12-03f) gives it a
   low probability even when it answers right, so compare the first-token column between
   models, never against 1.

Models: ``teacher`` and ``student`` get every measurement; ``student_stage2`` (the student
after Stage 2, before the long-context Stage 3, when the caller passes it) gets only those in
``stage2_measurements``: the ablation that shows what Stage 3 does to them; ``student_unscaled``
(the final student without the calibrated logit scaling, when the caller passes it) gets only
those in ``unscaled_measurements``: what the scaling, which acts at every position
(``s_t = log_a(t + a)``, 1.16 at 2K for ``a = 1000``), costs or gains inside the teacher's
context. These two extra models are measured on NIAH lengths up to
``extra_models_niah_max_len`` only (``None``: all lengths).

The teacher does not change from one conversion to the next: with ``teacher_report`` naming
the ``report.json`` of an earlier run that measured the same teacher under the same options,
its teacher results are copied (each marked ``reused_from``) instead of measured again
(:func:`reusable_teacher_results`), except a result lacking a field this code records
(:data:`REUSE_REQUIRED_FIELDS`: ``position_nll`` of ``perplexity`` and ``corpus_perplexity``),
which is measured anew.

Calls without segment ids (scoring, the prefills) are the plain causal forward.

Shapes are kept few on purpose (one compiled program per shape): perplexity windows are padded to
the window, commonsense requests to a multiple of ``csr_bucket``.

:func:`render_markdown` turns the JSON of every stage of a HALO workdir (config, per-stage
metrics and timings, the selection, the calibration and this report) into the results page
(``experiments/halo_report.py`` writes it to ``<workdir>/halo-<model>-<date>.md`` by default).
"""

import concurrent.futures
import dataclasses
import datetime
import errno
import functools
import hashlib
import inspect
import json
import math
import os
import platform
import random
import re
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lattn_jax import assets
from lattn_jax import model as model_lib
from lattn_jax import records
from lattn_jax.eval import fetch
from lattn_jax.eval import generate as gen_lib
from lattn_jax.eval import niah
from lattn_jax.eval import perplexity as ppl_lib
from lattn_jax.eval import runner
from lattn_jax.eval import scoring
from lattn_jax.eval import tasks as tasks_lib
from lattn_jax.mixers import attention as attention_lib

MEASUREMENTS = ("speed", "perplexity", "corpus_perplexity", "commonsense", "niah", "niah_forced")
MODELS = ("teacher", "student", "student_stage2", "student_unscaled")
MAIN_MODELS = ("teacher", "student")  # the two that every measurement covers
# The other models and the option listing the measurements each gets.
EXTRA_MODEL_MEASUREMENTS = {"student_stage2": "stage2_measurements",
                            "student_unscaled": "unscaled_measurements"}
REPORT_JSON = "report.json"
REPORT_MD = "report.md"
NIAH_PARTS = "niah_parts.jsonl"  # one line per finished NIAH (model, task, length)
DEFAULT_PERPLEXITY_FILE = "corpus/wikitext-2-raw/wiki.test.raw"  # bundled asset
NIAH_DECODE_CHUNK = 16  # NIAH decoding steps per compiled call (NiahDecoder.chunk)


# ---------------------------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------------------------

def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _write_json(path: str, obj: Any) -> None:
    """Atomic JSON write (a crash never leaves half a file)."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, default=str)
    os.replace(tmp, path)


class BadJsonError(ValueError):
    """A file :func:`read_json` read is not JSON (e.g. half written); the message names it."""


def read_json(path: str, default: Any = None) -> Any:
    """The JSON object in ``path``, or ``default`` if the file does not exist.

    Raises:
      BadJsonError: ``path`` exists but is not valid JSON.
    """
    if not os.path.exists(path):
        return default
    with open(path) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise BadJsonError(f"{path} is not valid JSON: {e}") from e


read_jsonl = fetch.read_jsonl  # the run records' reader, shared with the sweep


def check_page_path(path: str, flag: str = "--output") -> None:
    """Checks, without writing anything, that :func:`write_page` can write ``path``: no
    existing part of its directory is a regular file, the path is not a directory, and the
    deepest existing directory is writable (``halo_report.py --output``, and
    ``halo_pipeline.py --markdown`` before its first stage).

    Raises:
      ValueError: ``cannot write <flag>=<path>: <reason>`` (the reason as the OS words it).
    """
    full = os.path.abspath(path)
    if os.path.isdir(full):
        reason = errno.EISDIR
    else:
        parent = records.existing_ancestor(os.path.dirname(full))
        reason = (errno.ENOTDIR if not os.path.isdir(parent) else
                  errno.EACCES if not os.access(parent, os.W_OK | os.X_OK) else None)
    if reason is not None:
        raise ValueError(f"cannot write {flag}={path}: {os.strerror(reason)}")


def write_page(path: str, text: str, flag: str = "--output") -> None:
    """Writes a results page to ``path``, making its directory.

    Raises:
      ValueError: ``path`` cannot be written (:func:`check_page_path`'s message).
    """
    check_page_path(path, flag)
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    except OSError as e:
        raise ValueError(f"cannot write {flag}={path}: {e.strerror or e}") from e


def device_memory() -> Dict[str, Optional[int]]:
    """``bytes_in_use``, ``peak_bytes_in_use`` and ``bytes_limit`` of device 0 in bytes
    (``None`` where the backend does not report them, e.g. on CPU)."""
    try:
        stats = jax.local_devices()[0].memory_stats() or {}
    except Exception:  # noqa: BLE001 - some backends raise instead of returning None
        stats = {}
    return {k: (int(stats[k]) if k in stats else None)
            for k in ("bytes_in_use", "peak_bytes_in_use", "bytes_limit")}


def state_bytes(states: Sequence[Any]) -> Dict[str, int]:
    """Bytes of per-layer decoding states: ``{"kv_cache", "recurrent", "total"}``.

    Args:
      states: the per-layer list of a ``LanguageModel`` (``KVCache`` for attention layers, a
        recurrent-state NamedTuple for linear ones).

    Returns:
      Sums of ``nbytes`` over the array leaves (KV caches at their current capacity).
    """
    kv = rec = 0
    for st in states:
        n = sum(int(x.nbytes) for x in jax.tree_util.tree_leaves(st))
        if isinstance(st, attention_lib.KVCache):
            kv += n
        else:
            rec += n
    return {"kv_cache": kv, "recurrent": rec, "total": kv + rec}


def hardware() -> Dict[str, Any]:
    """The devices and library versions of this process."""
    import flax
    import optax

    dev = jax.devices()[0]
    return {"device_kind": getattr(dev, "device_kind", str(dev)), "platform": dev.platform,
            "device_count": jax.device_count(), "jax": jax.__version__,
            "jaxlib": getattr(jax.lib, "__version__", None) or _version("jaxlib"),
            "flax": flax.__version__, "optax": optax.__version__,
            "python": sys.version.split()[0], "host": platform.platform()}


def _version(name: str) -> Optional[str]:
    try:
        from importlib import metadata
        return metadata.version(name)
    except Exception:  # noqa: BLE001
        return None


# ---------------------------------------------------------------------------------------------
# Decoding with a fixed padded length and cache capacity
# ---------------------------------------------------------------------------------------------

_GREEDY = gen_lib.SamplingConfig()


class Decoder:
    """Batch-1 greedy decoding of one model with shapes fixed by the caller.

    A prompt is left-padded to ``padded_len`` (the padding is its own document) and prefilled
    through :meth:`lattn_jax.eval.generate.Generator.prefill` with caches of exactly
    ``padded_len`` slots; the caches are then grown to ``capacity`` outside the compiled
    function. One prefill is compiled per ``padded_len`` and one decoding step per
    ``capacity``, whatever the prompts. :meth:`prefill_unpadded` is the plain causal prefill
    of an unpadded prompt (no segment ids, so attention runs the causal flash kernel with no
    mask), for timing.

    Args:
      model: a ``LanguageModel`` whose config has ``use_segment_ids`` on (so that the padded
        prefill keeps the padding out of the prompt's document).
      pad_id: the padding token.
    """

    def __init__(self, model: model_lib.LanguageModel, pad_id: int):
        self.generator = gen_lib.Generator(model, pad_id=pad_id, bucket=1)
        self.pad_id = int(pad_id)
        self._key = jax.random.key(0)
        graphdef, self._params = nnx.split(model)
        # Only the last position's logits if the model can skip the others.
        kw = ({"last_logits_only": True}
              if "last_logits_only" in inspect.signature(type(model).__call__).parameters else {})

        def prefill(params, tokens):
            logits, states = nnx.merge(graphdef, params)(tokens, return_state=True, **kw)
            return (logits[:, -1] if logits.ndim == 3 else logits), states  # [B, S]

        self._prefill_unpadded = jax.jit(prefill)

    def prefill_unpadded(self, ids: Sequence[int]):
        """``(last logits fp32 [1, S], states of capacity len(ids))`` of an unpadded prompt."""
        return self._prefill_unpadded(self._params, jnp.asarray([list(ids)], jnp.int32))

    def prefill(self, ids: Sequence[int], padded_len: int):
        """``(last logits fp32 [1, S], per-layer states of capacity padded_len)``.

        Raises:
          ValueError: if the prompt is empty or longer than ``padded_len``.
        """
        if not 0 < len(ids) <= padded_len:
            raise ValueError(f"a prompt of {len(ids)} tokens does not fit {padded_len=}")
        tokens = np.full((1, padded_len), self.pad_id, np.int32)
        mask = np.zeros((1, padded_len), bool)
        tokens[0, padded_len - len(ids):] = ids
        mask[0, padded_len - len(ids):] = True
        return self.generator.prefill(tokens, mask, padded_len)

    def step(self, token, states):
        """One greedy step: ``(next int32 [1], new states)``."""
        nxt, _, states = self.generator.step(token, states, self._key, _GREEDY)
        return nxt, states

    def generate(self, ids: Sequence[int], *, padded_len: int, capacity: int,
                 max_new_tokens: int, stop_id: Optional[int] = None) -> List[int]:
        """Greedy continuation of ``ids`` (at most ``max_new_tokens``, stop id excluded).

        Raises:
          ValueError: if ``capacity < padded_len + max_new_tokens``.
        """
        if capacity < padded_len + max_new_tokens:
            raise ValueError(f"{capacity=} is below {padded_len=} + {max_new_tokens=}")
        logits, states = self.prefill(ids, padded_len)
        states = model_lib.LanguageModel.grow_state(states, capacity)
        token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        out: List[int] = []
        for i in range(max_new_tokens):
            t = int(token[0])
            if stop_id is not None and t == stop_id:
                break
            out.append(t)
            if i < max_new_tokens - 1:
                token, states = self.step(token, states)
        return out


def measure_speed(decoder: Decoder, prompt: Sequence[int], *, decode_tokens: int,
                  repeats: int) -> Dict[str, Any]:
    """Prefill and decoding time and memory of one model at one context length (batch 1).

    Args:
      decoder: the model's :class:`Decoder`.
      prompt: ``P`` token ids (real text), prefilled without padding
        (:meth:`Decoder.prefill_unpadded`).
      decode_tokens: ``D >= 2``; the caches hold ``P + D`` tokens and ``D - 1`` steps are timed
        after one warm-up step.
      repeats: timed prefills (the median is reported) after one warm-up prefill.

    Returns:
      ``{"prompt_tokens", "capacity", "prefill_s", "prefill_s_all", "prefill_tokens_per_s",
      "decode_s_per_token", "decode_tokens_per_s", "decode_steps_timed", "state_bytes"
      ({"kv_cache", "recurrent", "total"} at capacity P + D), "device_memory"
      (after decoding, :func:`device_memory`)}``; times in seconds.

    Raises:
      ValueError: for ``decode_tokens < 2`` or ``repeats < 1``.
    """
    if decode_tokens < 2 or repeats < 1:
        raise ValueError(f"need decode_tokens >= 2 and repeats >= 1, got {decode_tokens=} "
                         f"{repeats=}")
    p = len(prompt)
    jax.block_until_ready(decoder.prefill_unpadded(prompt))  # compile / warm up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        logits, states = decoder.prefill_unpadded(prompt)
        jax.block_until_ready((logits, states))
        times.append(time.perf_counter() - t0)
    capacity = p + decode_tokens
    states = model_lib.LanguageModel.grow_state(states, capacity)
    sizes = state_bytes(states)
    token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    token, states = decoder.step(token, states)  # warm-up step (compiles)
    jax.block_until_ready(token)
    t0 = time.perf_counter()
    for _ in range(decode_tokens - 1):
        token, states = decoder.step(token, states)
    jax.block_until_ready((token, states))
    per_token = (time.perf_counter() - t0) / (decode_tokens - 1)
    prefill_s = statistics.median(times)
    return {"prompt_tokens": p, "capacity": capacity, "prefill_s": prefill_s,
            "prefill_s_all": times, "prefill_tokens_per_s": p / prefill_s,
            "decode_s_per_token": per_token, "decode_tokens_per_s": 1.0 / per_token,
            "decode_steps_timed": decode_tokens - 1, "state_bytes": sizes,
            "device_memory": device_memory()}


# ---------------------------------------------------------------------------------------------
# Standard errors
# ---------------------------------------------------------------------------------------------

def binomial_se(p: float, n: int) -> float:
    """The standard error ``sqrt(p (1 - p) / n)`` of a mean of ``n`` 0/1 outcomes (``nan`` for
    ``n < 1``)."""
    return math.sqrt(p * (1.0 - p) / n) if n >= 1 else float("nan")


def with_se(metrics: Mapping[str, Any]) -> Dict[str, Any]:
    """``metrics`` of a multiple-choice task (``acc``/``acc_norm`` in [0, 1] and ``n``
    documents) with ``acc_se``/``acc_norm_se``, their binomial standard errors, added."""
    out = dict(metrics)
    for key in ("acc", "acc_norm"):
        if key in out:
            out[f"{key}_se"] = binomial_se(out[key], int(out["n"]))
    return out


def csr_mean(result: Mapping[str, Mapping[str, Any]],
             tasks: Optional[Sequence[str]] = None) -> Tuple[float, float]:
    """``(mean, SE)`` over the tasks of one model's commonsense result of ``acc_norm`` (``acc``
    where a task has no ``acc_norm``, e.g. WinoGrande), SE ``sqrt(sum SE_i^2) / n_tasks``
    (:func:`mean_with_se`; each ``SE_i`` the stored one or :func:`binomial_se`)."""
    means, ses = [], []
    for task in (tasks if tasks is not None else sorted(result)):
        r = result[task]
        key = "acc_norm" if "acc_norm" in r else "acc"
        means.append(float(r[key]))
        ses.append(r.get(f"{key}_se", binomial_se(float(r[key]), int(r.get("n", 0)))))
    return mean_with_se(means, ses)


def mean_with_se(means: Sequence[float], ses: Sequence[float]) -> Tuple[float, float]:
    """``(mean, SE)`` of the unweighted mean of independent estimates: ``sum(means) / k`` and
    ``sqrt(sum(se_i^2)) / k`` (``(nan, nan)`` for none)."""
    if not means:
        return float("nan"), float("nan")
    k = len(means)
    return float(sum(means) / k), math.sqrt(sum(s * s for s in ses)) / k


# ---------------------------------------------------------------------------------------------
# NIAH
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class NiahPrompt:
    """One NIAH prompt: the :class:`lattn_jax.eval.niah.Sample` and its token ids (int32
    ``[sample.num_tokens]``, no BOS)."""

    sample: niah.Sample
    ids: np.ndarray


def niah_samples(tokenizer, *, tasks: Sequence[str], lengths: Sequence[int],
                 depths: Sequence[float], samples_per_cell: int,
                 essay_words: Optional[Sequence[str]], max_new_tokens: int,
                 seed: int = 42, check: bool = True) -> Dict[str, List[List[NiahPrompt]]]:
    """The prompts of :func:`lattn_jax.eval.niah.run` (same seeds and order) with their ids.

    Every sample is the one :func:`lattn_jax.eval.niah.make_sample` gives, built by
    :class:`lattn_jax.eval.niah.SampleBuilder` (cached token pieces instead of a tokenization
    per haystack size tried: 1,800 prompts of 2K-64K tokens in seconds with SmolLM2's GGUF
    tokenizer instead of about ten minutes). Each search for the largest haystack starts from
    the previous sample's size (scaled to the length).

    Args:
      tokenizer: the model's tokenizer.
      tasks, lengths, depths: the grid (:data:`lattn_jax.eval.niah.ALL_TASKS`, tokens,
        percent).
      samples_per_cell: prompts per (task, length, depth).
      essay_words: :func:`lattn_jax.eval.niah.load_essays` (for all tasks but single_1).
      max_new_tokens: room left for the answer.
      seed: key/value seed, one ``random.Random(seed)`` per task.
      check: compare the ids of the first prompt of every (task, length) with
        ``tokenizer.encode`` (one full tokenization each).

    Returns:
      ``{task: [per length: [NiahPrompt, depth-major]]}``.

    Raises:
      ValueError: an unknown task, a bad depth, or a length too short for the prompt.
      RuntimeError: if a checked prompt's ids differ from ``tokenizer.encode`` (a bug).
    """
    builder = niah.SampleBuilder(tokenizer, essay_words)
    out = {}
    for task in tasks:
        rng = random.Random(seed)
        per_length, hint, previous = [], None, None
        for length in lengths:
            prompts = []
            if hint is not None:  # the haystack grows about in proportion to the length
                hint = max(1, int(hint * (length - max_new_tokens) / (previous - max_new_tokens)))
            previous = length
            for d in depths:
                for _ in range(samples_per_cell):
                    s, ids = builder.make_sample(task, length, d, rng, max_new_tokens,
                                                 start_units=hint)
                    hint = s.haystack_units
                    prompts.append(NiahPrompt(sample=s, ids=ids))
            if check and builder.exact and prompts:
                s = prompts[0].sample
                if prompts[0].ids.tolist() != tokenizer.encode(s.prompt):
                    raise RuntimeError(f"{task} @ {length}: the piecewise token ids of a prompt "
                                       f"differ from the tokenizer's ({tokenizer!r})")
            per_length.append(prompts)
        out[task] = per_length
    return out


def niah_batch_size(length: int, count: int, batch_tokens: int) -> int:
    """Rows per batch for ``count`` prompts of ``length`` tokens: at most
    ``batch_tokens // length`` (at least 1), spread evenly over the fewest batches.

    Raises:
      ValueError: for ``batch_tokens < 1`` (``report.niah_batch_tokens``).
    """
    if batch_tokens < 1:
        raise ValueError(f"report.niah_batch_tokens must be >= 1, got {batch_tokens}")
    most = max(1, batch_tokens // length)
    batches = max(1, -(-count // most))
    return max(1, -(-count // batches))


class NiahDecoder:
    """Batched greedy decoding of prompts of about the same length, with the decoding states.

    A batch of ``B`` prompts of ``n_i`` tokens is prefilled on the first ``P = min n_i`` tokens
    of every row (the plain causal forward: no padding, no mask, the flash kernel on a GPU),
    then decoded in ``T == 1`` steps that feed each row the rest of its own prompt
    (``n_i - P`` tokens) before its own greedy tokens, so a row's answer starts right after its
    prompt. A row therefore gets exactly the tokens of its prompt prefilled and decoded alone up
    to floating-point rounding (the prefill computes the ``n_i - P`` last prompt positions as
    decoding steps). Unlike left padding with segment ids, this needs no ``[B, T, T]`` mask,
    which cuDNN turns into a dense bias (8.6 GB per 64K-token row in bf16). Steps run
    ``chunk`` at a time on the device (a ``lax.scan``); a batch stops once every row has its
    ``max_new_tokens`` tokens or its stop token.

    One prefill is compiled per ``(B, P, capacity)`` and one chunk of steps per
    ``(B, capacity, rest width)``: callers keep these fixed per length.

    Args:
      model: a ``LanguageModel`` (its parameters are captured as they are now).
      chunk: decoding steps per compiled call (>= 1).

    Raises:
      ValueError: for ``chunk < 1``.
    """

    def __init__(self, model: model_lib.LanguageModel, *, chunk: int = 16):
        if chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {chunk}")
        self.chunk = int(chunk)
        graphdef, self._params = nnx.split(model)
        kw = ({"last_logits_only": True}
              if "last_logits_only" in inspect.signature(type(model).__call__).parameters else {})

        def prefill(params, tokens, capacity):
            m = nnx.merge(graphdef, params)
            logits, states = m(tokens, return_state=True, **kw)
            nxt = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)  # [B]
            return nxt, model_lib.LanguageModel.grow_state(states, capacity)

        def steps(params, prev, rest, rest_len, start, states, n):
            m = nnx.merge(graphdef, params)
            width = rest.shape[1]

            def body(carry, j):
                prev, states = carry
                s = start + j
                forced = jax.lax.dynamic_index_in_dim(rest, jnp.clip(s, 0, width - 1), axis=1,
                                                      keepdims=False)  # [B]
                token = jnp.where(s < rest_len, forced, prev)
                logits, states = m(token[:, None], state=states, return_state=True)
                nxt = jnp.argmax(logits[:, 0], axis=-1).astype(jnp.int32)
                return (nxt, states), nxt

            (prev, states), out = jax.lax.scan(body, (prev, states),
                                               jnp.arange(n, dtype=jnp.int32))
            return out.T, prev, states  # [B, n]

        self._prefill = jax.jit(prefill, static_argnums=(2,))
        # The states are donated: the steps update the KV caches in place.
        self._steps = jax.jit(steps, static_argnums=(6,), donate_argnums=(5,))
        # Executables compiled ahead of time by :meth:`precompile`, by shape.
        self._compiled: Dict[Tuple[Any, ...], Any] = {}

    def precompile(self, shapes: Sequence[Tuple[int, int, int, int]], *,
                   max_workers: Optional[int] = None,
                   print_fn: Callable[[str], None] = print) -> float:
        """Compiles the prefill and decoding-step programs of ``shapes`` ahead of time, in a
        thread pool, so that their XLA compilations overlap (NIAH compiles one prefill and one
        step program per length; one after the other they took 26-52 s per length on the H200
        for SmolLM2-135M's student, 2026-12-02d). :meth:`generate` then runs these executables
        for those shapes and compiles any other shape on first use, as before.

        Args:
          shapes: ``(batch_size, prefix_len, capacity, width)`` per program pair, as
            :meth:`generate` will be called (``width`` is the rest-of-prompt width).
          max_workers: compiling threads (``None``: ``os.cpu_count()``).
          print_fn: one line per program that fails to compile (it is then compiled on first
            use by ``jax.jit``, which raises the error there if it is real).

        Returns:
          wall seconds spent lowering and compiling.
        """
        t0 = time.perf_counter()
        jobs = {}
        workers = max(1, max_workers or os.cpu_count() or 1)
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            unique = dict.fromkeys(tuple(int(x) for x in s) for s in shapes)
            for b, p0, capacity, width in unique:
                tokens = jax.ShapeDtypeStruct((b, p0), jnp.int32)
                low = self._prefill.lower(self._params, tokens, capacity)
                jobs[pool.submit(low.compile)] = ("prefill", b, p0, capacity)
                first, states = low.out_info
                row = jax.ShapeDtypeStruct((b,), jnp.int32)
                low = self._steps.lower(self._params, first, jax.ShapeDtypeStruct(
                    (b, width), jnp.int32), row, jax.ShapeDtypeStruct((), jnp.int32), states,
                    self.chunk)
                jobs[pool.submit(low.compile)] = ("steps", b, capacity, width)
            for future in concurrent.futures.as_completed(jobs):
                try:
                    self._compiled[jobs[future]] = future.result()
                except Exception as e:  # noqa: BLE001 - compiled again on first use instead
                    print_fn(f"niah: ahead-of-time compilation of {jobs[future]} failed "
                             f"({type(e).__name__}: {str(e)[:200]}); compiling it on first use")
        return time.perf_counter() - t0

    def generate(self, prompts: Sequence[Sequence[int]], *, batch_size: int, capacity: int,
                 max_new_tokens: int, stop_id: Optional[int] = None,
                 prefix_len: Optional[int] = None,
                 width: Optional[int] = None) -> Tuple[List[List[int]], Dict[str, Any]]:
        """Greedy continuations of ``prompts`` (at most ``max_new_tokens`` each, the stop token
        and what follows it dropped), in order.

        Args:
          prompts: token-id sequences (int), each non-empty.
          batch_size: rows per batch ``B``; a last, smaller batch is filled with copies of its
            first prompt (answers dropped).
          capacity: KV-cache slots per row, at least ``max n_i + max_new_tokens + chunk - 2``
            (the decoding runs whole chunks).
          max_new_tokens: answer tokens per prompt (>= 1).
          stop_id: a token that ends a row's answer (excluded), or ``None``.
          prefix_len: the prefill length ``P`` (default ``min n_i``; at most that).
          width: the width of the per-row rest of the prompts (default ``max n_i - P``; at
            least that), a static shape.

        Returns:
          ``(answers, stats)``: ``answers[i]`` the generated ids of ``prompts[i]``; ``stats``
          ``{"batches", "batch_size", "prefix_len", "rest_width", "steps", "prefill_s",
          "decode_s"}`` (seconds of wall time, each call waited for).

        Raises:
          ValueError: for no prompts, an empty prompt, ``max_new_tokens < 1``,
            ``batch_size < 1``, or a ``capacity``, ``prefix_len`` or ``width`` that does not fit
            the prompts.
        """
        if not prompts:
            raise ValueError("no prompts to generate from")
        lens = [len(p) for p in prompts]
        if min(lens) < 1 or max_new_tokens < 1 or batch_size < 1:
            raise ValueError(f"need non-empty prompts, max_new_tokens >= 1 and batch_size >= 1, "
                             f"got prompt lengths {min(lens)}..{max(lens)}, {max_new_tokens=}, "
                             f"{batch_size=}")
        p0 = min(lens) if prefix_len is None else int(prefix_len)
        rest_w = max(max(lens) - p0, 1) if width is None else int(width)
        need = max(lens) + max_new_tokens + self.chunk - 2
        if not 1 <= p0 <= min(lens) or rest_w < max(lens) - p0 or capacity < need:
            raise ValueError(f"prompts of {min(lens)}..{max(lens)} tokens with {max_new_tokens} "
                             f"new tokens in chunks of {self.chunk} need 1 <= prefix_len <= "
                             f"{min(lens)}, width >= {max(lens) - p0} and capacity >= {need}; "
                             f"got {p0}, {rest_w}, {capacity}")
        answers: List[List[int]] = [[] for _ in prompts]
        stats = {"batches": 0, "batch_size": batch_size, "prefix_len": p0,
                 "rest_width": rest_w, "steps": 0, "prefill_s": 0.0, "decode_s": 0.0}
        for b0 in range(0, len(prompts), batch_size):
            idx = list(range(b0, min(b0 + batch_size, len(prompts))))
            rows = idx + [idx[0]] * (batch_size - len(idx))
            tokens = np.stack([np.asarray(prompts[i][:p0], np.int32) for i in rows])
            rest = np.zeros((batch_size, rest_w), np.int32)
            rest_len = np.zeros((batch_size,), np.int32)
            for j, i in enumerate(rows):
                tail = np.asarray(prompts[i][p0:], np.int32)
                rest[j, :len(tail)] = tail
                rest_len[j] = len(tail)
            t0 = time.perf_counter()
            prefill = self._compiled.get(("prefill", batch_size, p0, int(capacity)))
            if prefill is not None:
                first, states = prefill(self._params, jnp.asarray(tokens))
            else:
                first, states = self._prefill(self._params, jnp.asarray(tokens), int(capacity))
            steps = self._compiled.get(("steps", batch_size, int(capacity), rest_w))
            if steps is None:
                steps = functools.partial(self._steps, n=self.chunk)
            first = np.asarray(first)  # waits for the prefill
            t1 = time.perf_counter()
            # Step s feeds position P + s; row j's k-th new token comes out of step
            # rest_len[j] + k - 1 (the prefill's token when that is -1).
            need_steps = int(rest_len.max()) + max_new_tokens - 1
            outs = [first[:, None]]
            prev, rest_d, len_d, done_steps = jnp.asarray(first), jnp.asarray(rest), \
                jnp.asarray(rest_len), 0
            while done_steps < need_steps:
                out, prev, states = steps(self._params, prev, rest_d, len_d,
                                          jnp.int32(done_steps), states)
                outs.append(np.asarray(out))
                done_steps += self.chunk
                if stop_id is not None and self._all_stopped(outs, rest_len[:len(idx)],
                                                             stop_id, done_steps):
                    break
            stats["decode_s"] += time.perf_counter() - t1
            stats["prefill_s"] += t1 - t0
            stats["steps"] += done_steps
            stats["batches"] += 1
            del states
            seq = np.concatenate(outs, axis=1)  # [B, 1 + steps]: column c = step c - 1
            for j, i in enumerate(idx):
                gen = seq[j, rest_len[j]:rest_len[j] + max_new_tokens].tolist()
                if stop_id is not None and stop_id in gen:
                    gen = gen[:gen.index(stop_id)]
                answers[i] = gen
        return answers, stats

    @staticmethod
    def _all_stopped(outs, rest_len, stop_id, steps) -> bool:
        """Whether every row has emitted ``stop_id`` after its prompt within ``steps`` steps."""
        seq = np.concatenate(outs, axis=1)
        return all(stop_id in seq[j, r:].tolist() for j, r in enumerate(rest_len))


def niah_scores(answers: Mapping[str, List[List[List[int]]]], tokenizer,
                prompts: Mapping[str, List[List[NiahPrompt]]], *, lengths: Sequence[int],
                depths: Sequence[float], samples_per_cell: int,
                short_max_len: int) -> Dict[str, Any]:
    """Scores one model's answers to the NIAH prompts (RULER ``string_match_all``).

    Args:
      answers: ``{task: [per length: [generated ids per prompt]]}``, in the order of
        ``prompts``.
      tokenizer: decodes the answers.
      prompts: from :func:`niah_samples`.
      lengths, depths, samples_per_cell: the grid.
      short_max_len: lengths up to this (tokens) form the ``"short"`` group, longer ones the
        ``"long"`` group.

    Returns:
      ``{task: {"grid" [lengths x depths] (cell means), "lengths", "depths", "n_per_cell",
      "per_length" {length: mean}, "per_length_se" {length: binomial SE}, "per_length_n",
      "short"/"long" {"lengths", "mean", "se"} (mean of the per-length means, SE
      ``sqrt(sum SE^2) / k``; ``None`` for a group without lengths), "mean", "mean_se" (all
      lengths), "examples", "answer_modes" {length: {mode: count}}
      (:func:`lattn_jax.eval.niah.answer_mode`: how each answer hits or misses)}}``; scores in
      ``[0, 1]``.
    """
    out = {}
    for task, per_length in prompts.items():
        grid = np.zeros((len(lengths), len(depths)))
        means, ses, examples, modes = [], [], [], {}
        for li, batch in enumerate(per_length):
            scores, texts = niah_part_scores(answers[task][li], tokenizer, batch)
            counts = dict.fromkeys(niah.ANSWER_MODES, 0)
            for k, (p, score, text) in enumerate(zip(batch, scores, texts)):
                counts[niah.answer_mode(text, p.sample.value)] += 1
                grid[li, k // samples_per_cell] += score / samples_per_cell
                if len(examples) < 3 or (k == 0 and lengths[li] == max(lengths)):
                    examples.append({"length": lengths[li], "depth": p.sample.depth,
                                     "value": p.sample.value, "answer": text})
            means.append(float(np.mean(scores)))
            ses.append(binomial_se(means[-1], len(scores)))
            modes[str(lengths[li])] = counts
        groups = {}
        for name, keep in (("short", lambda n: n <= short_max_len),
                           ("long", lambda n: n > short_max_len)):
            sel = [i for i, n in enumerate(lengths) if keep(n)]
            if sel:
                m, se = mean_with_se([means[i] for i in sel], [ses[i] for i in sel])
                groups[name] = {"lengths": [lengths[i] for i in sel], "mean": m, "se": se}
            else:
                groups[name] = None
        mean, mean_se = mean_with_se(means, ses)
        out[task] = {"grid": grid.tolist(), "lengths": list(lengths), "depths": list(depths),
                     "n_per_cell": samples_per_cell,
                     "per_length": {str(n): means[i] for i, n in enumerate(lengths)},
                     "per_length_se": {str(n): ses[i] for i, n in enumerate(lengths)},
                     "per_length_n": {str(n): len(per_length[i]) for i, n in enumerate(lengths)},
                     **groups, "mean": mean, "mean_se": mean_se, "examples": examples,
                     "answer_modes": modes}
    return out


def niah_part_scores(answers: Sequence[Sequence[int]], tokenizer,
                     prompts: Sequence[NiahPrompt]) -> Tuple[List[float], List[str]]:
    """``(scores, texts)`` of one part's answers: ``string_match_all`` in {0, 1} against each
    prompt's needle value, and the decoded answers (one per prompt, in order)."""
    texts = [tokenizer.decode(list(ids)) for ids in answers]
    return ([niah.string_match_all(t, [p.sample.value]) for p, t in zip(prompts, texts)],
            texts)


def niah_forced_scores(scorer: scoring.Scorer, tokenizer, prompts: Sequence[NiahPrompt], *,
                       rows_per_batch: int, bucket: int = 256) -> Dict[str, Any]:
    """Teacher-forced NIAH answers: how likely the gold value is, token by token.

    Per prompt with ids ``c`` and gold answer ids ``a_1 .. a_n`` (``tokenizer.encode(" " +
    value)``, appended to ``c``): ``p_1 = p(a_1 | c)`` and whether ``a_1`` is the argmax, and
    for ``n > 1`` the mean ``(1 / (n - 1)) sum_{j >= 2} p(a_j | c, a_<j)`` and whether every
    ``a_j`` (``j >= 2``) is the argmax. Softmax in fp32 (:meth:`lattn_jax.eval.scoring.Scorer.
    token_logprobs`), means in fp64.

    Args:
      scorer: the model's scorer (its ``token_logprobs`` on right-padded rows).
      tokenizer: encodes the answers.
      prompts: one (task, length) cell of :func:`niah_samples`.
      rows_per_batch: rows per forward pass (every batch padded to it: one shape per cell).
      bucket: row lengths are padded to a multiple of this.

    Returns:
      ``{"n", "first_prob", "first_greedy", "rest_prob", "rest_greedy", "answer_tokens"}``:
      means over the prompts (``rest_*`` over prompts with ``n > 1``; ``None`` if none),
      ``answer_tokens`` the mean ``n``.

    Raises:
      ValueError: no prompts, ``rows_per_batch < 1``, or an empty answer.
    """
    if not prompts or rows_per_batch < 1:
        raise ValueError(f"niah_forced_scores needs prompts and rows_per_batch >= 1, got "
                         f"{len(prompts)} prompts, {rows_per_batch=}")
    rows = []
    for p in prompts:
        answer = list(tokenizer.encode(" " + p.sample.value))
        if not answer:
            raise ValueError(f"the answer {p.sample.value!r} encodes to no tokens")
        ids = [int(t) for t in p.ids] + answer
        rows.append((ids[:-1], ids[1:], len(answer)))
    width = -(-max(len(r[0]) for r in rows) // bucket) * bucket
    first_p, first_g, rest_p, rest_g = [], [], [], []
    for start in range(0, len(rows), rows_per_batch):
        chunk = rows[start:start + rows_per_batch]
        inputs = np.zeros((rows_per_batch, width), np.int32)
        targets = np.zeros((rows_per_batch, width), np.int32)
        for r, (inp, tgt, _) in enumerate(chunk):
            inputs[r, :len(inp)], targets[r, :len(tgt)] = inp, tgt
        lp, greedy = scorer.token_logprobs(inputs, targets)
        for r, (inp, _, n) in enumerate(chunk):
            at = slice(len(inp) - n, len(inp))  # the answer's n target positions
            probs = np.exp(lp[r, at].astype(np.float64))
            first_p.append(probs[0])
            first_g.append(bool(greedy[r, at][0]))
            if n > 1:
                rest_p.append(float(probs[1:].mean()))
                rest_g.append(bool(greedy[r, at][1:].all()))
    return {"n": len(rows), "first_prob": float(np.mean(first_p)),
            "first_greedy": float(np.mean(first_g)),
            "rest_prob": float(np.mean(rest_p)) if rest_p else None,
            "rest_greedy": float(np.mean(rest_g)) if rest_g else None,
            "answer_tokens": float(np.mean([r[2] for r in rows]))}


# Options that do not change a teacher's results (what is measured and for whom; where this
# machine keeps the same data files).
# Keys of a model's result that are not tasks or lengths: where a reused result came from.
RESULT_MARKERS = ("reused_from",)

# Fields that this code writes into a measurement's result: a reused teacher result (from
# ``teacher_report``) that lacks one was measured by older code and is measured anew. For the
# corpus perplexity this also re-measures the teacher on the corpus as it is now (12-03c: the
# Stage-2 student, trained on KL alone, scored 9.490 against the reused teacher's 9.781).
REUSE_REQUIRED_FIELDS = {"perplexity": ("position_nll",), "corpus_perplexity": ("position_nll",)}

REUSE_IGNORED_OPTIONS = ("measurements", "stage2_measurements", "unscaled_measurements",
                         "extra_models_niah_max_len", "teacher_report", "data_dir",
                         "corpus_perplexity_paths")


def _same_teacher(meta: Mapping[str, Any], other: Mapping[str, Any]) -> Tuple[bool, str, str]:
    """``(same, this, other)``: the teachers' ``teacher_id`` (file name and sha256) where both
    reports have one, else their descriptions with directories dropped (reports written
    before ``teacher_id``)."""
    if meta.get("teacher_id") and other.get("teacher_id"):
        a, b = str(meta["teacher_id"]), str(other["teacher_id"])
    else:
        a, b = (re.sub(r"(?<=\s)/\S*/", "", str(m.get("teacher"))) for m in (meta, other))
    return a == b and a != "None", a, b


def reusable_teacher_results(path: str, options: Mapping[str, Any],
                             meta: Mapping[str, Any]) -> Dict[str, Any]:
    """The teacher's results of the earlier report ``path``, to copy into this one.

    Args:
      path: an earlier run's ``report.json``.
      options: this report's options (a JSON-able dict).
      meta: this report's meta (``teacher_id``, else ``teacher``, identifies the teacher).

    Returns:
      ``{measurement: result}`` for every measurement the earlier report has of its teacher,
      each with ``reused_from`` (the path and the earlier report's ``updated`` time).

    Raises:
      FileNotFoundError: no report at ``path``.
      ValueError: the earlier report measured another teacher, or under other options (the
        differing option names are listed; :data:`REUSE_IGNORED_OPTIONS` are not compared).
    """
    other = read_json(path)
    if not other:
        raise FileNotFoundError(f"report.teacher_report: no report at {path}")
    mine = {k: v for k, v in options.items() if k not in REUSE_IGNORED_OPTIONS}
    theirs = {k: v for k, v in other.get("options", {}).items()
              if k not in REUSE_IGNORED_OPTIONS}
    differ = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
    if differ:
        raise ValueError(f"report.teacher_report={path}: measured under other options: "
                         f"{', '.join(differ)}")
    same, key, their_key = _same_teacher(meta, other.get("meta", {}))
    if not same:
        raise ValueError(f"report.teacher_report={path}: another teacher ({their_key!r}, "
                         f"this run's is {key!r})")
    source = {"path": path, "updated": other.get("updated")}
    return {m: dict(r["teacher"], reused_from=source)
            for m, r in other.get("results", {}).items() if "teacher" in r}


def options_fingerprint(options: Mapping[str, Any]) -> str:
    """A 16-hex-digit digest of the report options (a JSON-able dict), stored with every NIAH
    part so that parts measured under other options are not read back."""
    text = json.dumps(options, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def append_jsonl(path: str, record: Mapping[str, Any]) -> None:
    """Appends ``record`` as one line of ``path`` and syncs it to disk.

    A line left half-written by a crash is removed first (:func:`lattn_jax.records.append_record`;
    :func:`read_jsonl` drops it with a warning while it is the last line), so that it does not
    swallow this record.
    """
    records.append_record(path, record, sync=True)


def read_niah_parts(path: str, *, model: str, fingerprint: str
                    ) -> Dict[Tuple[str, int], Dict[str, Any]]:
    """The finished NIAH parts of ``model`` in ``path`` (:data:`NIAH_PARTS`) measured under
    the options with this :func:`options_fingerprint`.

    Returns:
      ``{(task, length): record}`` (the last record of a part wins; ``{}`` without the file;
      lines that are not such records, torn or not JSON objects, are skipped),
      each record ``{"model", "task", "length", "fingerprint", "n", "accuracy", "se", "answers"
      [n lists of token ids], "stats" (:meth:`NiahDecoder.generate`), "time"}``.
    """
    out = {}
    for rec in read_jsonl(path):
        if (isinstance(rec, dict) and rec.get("model") == model
                and rec.get("fingerprint") == fingerprint
                and isinstance(rec.get("answers"), list) and "task" in rec and "length" in rec):
            out[str(rec["task"]), int(rec["length"])] = rec
    return out


def niah_answers(decoder: NiahDecoder, prompts: Mapping[str, List[List[NiahPrompt]]], *,
                 lengths: Sequence[int], max_new_tokens: int, batch_tokens: int,
                 stop_id: Optional[int], print_fn: Callable[[str], None] = print,
                 done: Optional[Mapping[Tuple[str, int], Sequence[Sequence[int]]]] = None,
                 on_part: Optional[Callable[[str, int, List[List[int]], Dict[str, Any]],
                                            None]] = None,
                 should_stop: Optional[Callable[[], bool]] = None,
                 precompile: bool = False
                 ) -> Tuple[Dict[str, List[Optional[List[List[int]]]]], Dict[str, Any]]:
    """Every prompt's greedy answer, one part (task, length) after the other.

    Per length ``L``: the prefill length ``P`` (the shortest prompt of ``L`` over all tasks)
    and the width of the rest (the longest minus ``P``) are shared by the tasks, the rows per
    batch are :func:`niah_batch_size` of the part's prompt count and the cache capacity is
    ``L + chunk``: one prefill shape and one decoding shape per length while the parts of a
    length have equal counts, and a part's answers are the same whichever parts are skipped.

    Args:
      decoder: the model's :class:`NiahDecoder`.
      prompts: ``{task: [per length: [NiahPrompt]]}`` (:func:`niah_samples`); a prompt of
        length index ``i`` has at most ``lengths[i] - max_new_tokens`` tokens.
      lengths: the target lengths in tokens, one per inner list.
      max_new_tokens: answer tokens per prompt.
      batch_tokens: ``report.niah_batch_tokens``, prompt tokens per batch.
      stop_id: ends an answer (excluded), e.g. the EOS id; ``None`` for none.
      print_fn: one progress line per decoded part when there is no ``on_part``.
      done: ``{(task, length): answers}`` of parts answered before (e.g. read back with
        :func:`read_niah_parts`); they are not decoded again.
      on_part: called as ``on_part(task, length, answers, stats)`` right after each decoded
        part (to log and store it; then nothing is printed here).
      should_stop: asked before each part to decode; ``True`` ends the run there.
      precompile: first compile every part's programs at once
        (:meth:`NiahDecoder.precompile`; the answers are the same).

    Returns:
      ``(answers {task: [per length: [ids] or None]}, stats {str(L): {task: NiahDecoder
      stats}})``; ``None`` marks a part left undone by ``should_stop``; parts taken from
      ``done`` have no stats.

    Raises:
      ValueError: if a part in ``done`` has another number of answers than prompts, or a part
        to decode has no prompts (:meth:`NiahDecoder.generate`).
    """
    done = dict(done or {})
    answers: Dict[str, List[Optional[List[List[int]]]]] = {
        task: [None] * len(lengths) for task in prompts}
    stats: Dict[str, Any] = {}

    def shared_shape(li):  # the prefill length and rest width of length index li
        lens = [len(p.ids) for task in prompts for p in prompts[task][li]] or [1]
        return min(lens), max(max(lens) - min(lens), 1)

    if precompile:
        shapes = []
        for li, length in enumerate(lengths):
            p0, width = shared_shape(li)
            shapes += [(niah_batch_size(length, len(prompts[task][li]), batch_tokens), p0,
                        length + decoder.chunk, width)
                       for task in prompts if (task, length) not in done and prompts[task][li]]
        # Past the deadline nothing will be decoded: compiling would only overrun it.
        if shapes and not (should_stop is not None and should_stop()):
            seconds = decoder.precompile(shapes, print_fn=print_fn)
            print_fn(f"niah: compiled {len(set(shapes))} prefill and step program pairs ahead "
                     f"of time in {seconds:.1f} s")
    for li, length in enumerate(lengths):
        p0, width = shared_shape(li)
        for task in prompts:
            part = prompts[task][li]
            if (task, length) in done:
                got = [list(a) for a in done[task, length]]
                if len(got) != len(part):
                    raise ValueError(f"niah part {task} @ {length}: {len(got)} answers read "
                                     f"back for {len(part)} prompts")
                answers[task][li] = got
                continue
            if should_stop is not None and should_stop():
                return answers, stats
            b = niah_batch_size(length, len(part), batch_tokens)
            out, st = decoder.generate([p.ids for p in part], batch_size=b,
                                       capacity=length + decoder.chunk,
                                       max_new_tokens=max_new_tokens, stop_id=stop_id,
                                       prefix_len=p0, width=width)
            answers[task][li] = out
            stats.setdefault(str(length), {})[task] = st
            if on_part is not None:
                on_part(task, length, out, st)
            else:
                print_fn(f"niah {task} @ {length:,}: {len(part)} prompts in {st['batches']} "
                         f"batches of {b}, prefill {st['prefill_s']:.1f} s, decode "
                         f"{st['decode_s']:.1f} s ({st['steps']} steps)")
    return answers, stats


# ---------------------------------------------------------------------------------------------
# The report stage
# ---------------------------------------------------------------------------------------------

def _options_dict(options) -> Dict[str, Any]:
    d = options.to_dict() if hasattr(options, "to_dict") else dict(options)
    return json.loads(json.dumps(d, default=str))


# Options that only say which (measurement, model) pairs are wanted: a resumed report with other
# values measures what is missing and keeps what it has (each result is stored per pair).
WHICH_OPTIONS = ("measurements", "stage2_measurements", "unscaled_measurements",
                 "teacher_report")
# Options added after reports were written, with the value those reports used implicitly.
REPORT_ADDED_OPTIONS = {"unscaled_measurements": [], "extra_models_niah_max_len": None}


def _result_options(opts: Mapping[str, Any]) -> Dict[str, Any]:
    """The options a stored result depends on: ``opts`` without :data:`WHICH_OPTIONS`, with
    :data:`REPORT_ADDED_OPTIONS` filled in where absent."""
    out = {**REPORT_ADDED_OPTIONS, **opts}
    return {k: v for k, v in out.items() if k not in WHICH_OPTIONS}


def _perplexity_path(options) -> str:
    if options.perplexity_file:
        return options.perplexity_file
    return assets.asset_path(DEFAULT_PERPLEXITY_FILE)


def _speed_prompt(tokenizer, options, length: int) -> List[int]:
    """``length - niah_max_new_tokens`` tokens of real text (the perplexity file, repeated)."""
    want = length - options.niah_max_new_tokens
    with open(_perplexity_path(options), encoding="utf-8") as f:
        ids = tokenizer.encode(f.read(6 * want + 4096))
    while len(ids) < want:
        ids = ids + ids
    return ids[:want]


def check_options(options) -> None:
    """Raises ``ValueError`` naming the first bad ``config.report`` option.

    Checks: ``measurements`` (from :data:`MEASUREMENTS`), ``niah_tasks`` (from
    :data:`lattn_jax.eval.niah.ALL_TASKS`), ``niah_lengths`` (above ``niah_max_new_tokens``),
    ``niah_depths`` (percent in [0, 100]), ``niah_samples``, ``niah_max_new_tokens`` and
    ``niah_batch_tokens`` (>= 1), ``speed_lengths`` (above ``niah_max_new_tokens``),
    ``csr_limit`` (``None`` or >= 1), ``perplexity_batch_size`` / ``csr_batch_size`` (>= 1),
    ``stage2_measurements`` / ``unscaled_measurements`` (from :data:`MEASUREMENTS` and among
    ``measurements``),
    ``extra_models_niah_max_len`` (``None`` or an int, with a NIAH length up to it when an
    extra model measures NIAH) and, with ``niah_forced``, ``niah_short_max_len`` (at least one
    NIAH length up to it).
    """
    unknown = sorted(set(options.measurements) - set(MEASUREMENTS))
    if unknown:
        raise ValueError(f"report.measurements: unknown {unknown}; choose from {MEASUREMENTS}")
    m = options.niah_max_new_tokens
    problems = [
        ("niah_tasks", [t for t in options.niah_tasks if t not in niah.ALL_TASKS],
         f"unknown tasks; choose from {niah.ALL_TASKS}"),
        ("niah_lengths", [n for n in options.niah_lengths if int(n) <= m],
         f"lengths must exceed niah_max_new_tokens={m}"),
        ("niah_depths", [d for d in options.niah_depths if not 0 <= d <= 100],
         "depths are percentages in [0, 100]"),
        ("speed_lengths", [n for n in options.speed_lengths if int(n) <= m],
         f"lengths must exceed niah_max_new_tokens={m} (the prompt is length - that)"),
    ]
    if "corpus_perplexity" in options.measurements:
        problems.append(("corpus_perplexity_paths",
                         [] if tuple(options.get("corpus_perplexity_paths") or ()) else [None],
                         "name the corpus's validation token directories"))
        problems.append(("corpus_perplexity_tokens",
                         [] if int(options.get("corpus_perplexity_tokens") or 0) >= 1
                         else [options.get("corpus_perplexity_tokens")], "must be >= 1"))
    for key in EXTRA_MODEL_MEASUREMENTS.values():
        problems.append((key, sorted(set(options.get(key) or ()) - set(MEASUREMENTS)),
                         f"unknown; choose from {MEASUREMENTS}"))
        problems.append((key, sorted(set(options.get(key) or ()) & set(MEASUREMENTS)
                                     - set(options.measurements)),
                         f"not in report.measurements={tuple(options.measurements)} (the "
                         f"report runs only those, for every model)"))
    extra_max = options.get("extra_models_niah_max_len")
    extra_niah = any(m in ("niah", "niah_forced") for key in EXTRA_MODEL_MEASUREMENTS.values()
                     for m in (options.get(key) or ()))
    problems.append(("extra_models_niah_max_len",
                     [] if extra_max is None or (
                         isinstance(extra_max, int) and not isinstance(extra_max, bool)
                         and (not extra_niah
                              or any(int(n) <= extra_max for n in options.niah_lengths)))
                     else [extra_max],
                     f"must be None (every NIAH length) or an int with at least one of "
                     f"niah_lengths={tuple(options.niah_lengths)} up to it"))
    forced = "niah_forced" in (tuple(options.measurements) + tuple(
        m for key in EXTRA_MODEL_MEASUREMENTS.values() for m in (options.get(key) or ())))
    short_max = options.get("niah_short_max_len")
    if forced and short_max is not None and not any(
            int(n) <= short_max for n in options.niah_lengths):
        problems.append(("niah_short_max_len", [short_max],
                         f"niah_forced scores the niah_lengths up to it and none of "
                         f"{tuple(options.niah_lengths)} is"))
    for key in ("niah_samples", "niah_max_new_tokens", "niah_batch_tokens",
                "perplexity_batch_size", "csr_batch_size"):
        problems.append((key, [options[key]] if options[key] < 1 else [], "must be >= 1"))
    if options.csr_limit is not None and options.csr_limit < 1:
        problems.append(("csr_limit", [options.csr_limit], "must be None (all) or >= 1"))
    for key, bad, why in problems:
        if bad:
            raise ValueError(f"report.{key}: {bad}: {why}")


def run_report(*, options, stage_dir: str, models: Mapping[str, Tuple[Any, Any]],
               tokenizer, meta: Mapping[str, Any], print_fn: Callable[[str], None] = print,
               should_stop: Optional[Callable[[], bool]] = None) -> Dict[str, Any]:
    """Measures every model on every measurement of ``options.measurements``.

    Args:
      options: the ``config.report`` section (see ``lattn_jax.halo.experiment.base_config``).
      stage_dir: where ``report.json``, ``report.md`` and :data:`NIAH_PARTS` (the finished
        NIAH parts, :func:`niah_answers`) go.
      models: ``{"teacher": (LanguageModel, description), "student": (...)}``, optionally
        ``"student_stage2"`` (measured on ``options.stage2_measurements`` only) and
        ``"student_unscaled"`` (on ``options.unscaled_measurements`` only).
      tokenizer: the teacher's tokenizer.
      meta: recorded as is (model descriptions, calibration, sources).
      print_fn: progress lines (one per measurement and model, one per NIAH part).
      should_stop: asked before each measurement and each NIAH part; ``True`` ends the run
        early (resumable: the NIAH parts already done stay in :data:`NIAH_PARTS`).

    A run that finds every measurement already in ``report.json`` (same options) measures
    nothing, says so in one line ("report already complete (<path>): ..."), and rewrites
    ``report.json`` and ``report.md`` alike (with this run's ``meta``), as it does after every
    measurement.

    Returns:
      The report dict (also in ``<stage_dir>/report.json``), with ``"complete"``; run details
      (the NIAH prompt building and per-part prefill/decode times) under ``"details"``.

    Raises:
      ValueError: an unknown measurement or model, or a bad option (:func:`check_options`).
      FileNotFoundError: a missing evaluation file or essay directory.
    """
    check_options(options)
    bad = sorted(set(models) - set(MODELS))
    if bad:
        raise ValueError(f"unknown models {bad}; expected {MODELS}")
    path = os.path.join(stage_dir, REPORT_JSON)
    opts = _options_dict(options)
    report = read_json(path) or {}
    if _result_options(report.get("options") or {}) != _result_options(opts):
        if report:
            old = _result_options(report.get("options") or {})
            new = _result_options(opts)
            changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
            print_fn(f"report options changed ({', '.join(changed)}): measuring everything "
                     f"again")
        report = {"options": opts, "results": {}, "seconds": {}, "started": _now()}
    report["options"] = opts
    report["meta"] = dict(meta, hardware=hardware())
    if options.get("teacher_report") and "teacher" in models:
        reused = reusable_teacher_results(options.teacher_report, opts, meta)
        for measurement in dict.fromkeys(options.measurements):
            done = report["results"].setdefault(measurement, {})
            if measurement in reused and "teacher" not in done:
                missing = [k for k in REUSE_REQUIRED_FIELDS.get(measurement, ())
                           if k not in reused[measurement]]
                if missing:
                    print_fn(f"{measurement} / teacher: not reused from {options.teacher_report}"
                             f" (it lacks {', '.join(missing)}): measuring it anew")
                    continue
                done["teacher"] = reused[measurement]
                print_fn(f"{measurement} / teacher: reused from {options.teacher_report}")
    decoders: Dict[str, Decoder] = {}
    cache: Dict[str, Any] = {}
    parts = {"parts_path": os.path.join(stage_dir, NIAH_PARTS),
             "fingerprint": options_fingerprint(_result_options(opts)),
             "should_stop": should_stop}
    order = list(dict.fromkeys(options.measurements))  # the options' order
    extra = {name: tuple(options.get(key) or ())
             for name, key in EXTRA_MODEL_MEASUREMENTS.items()}

    def wanted(measurement, name):
        return name in MAIN_MODELS or measurement in extra[name]

    complete, measured = True, 0
    for measurement in order:
        for name in models:
            if name in report["results"].get(measurement, {}) or not wanted(measurement, name):
                continue
            if should_stop is not None and should_stop():
                complete = False
                break
            model = models[name][0]
            t0 = time.perf_counter()
            details: Dict[str, Any] = {}
            result = _measure(measurement, name, model, tokenizer, options, decoders, cache,
                              print_fn, details, **parts)
            if result is None:  # should_stop between NIAH parts
                complete = False
                break
            seconds = time.perf_counter() - t0
            report["results"].setdefault(measurement, {})[name] = result
            report["seconds"][f"{measurement}/{name}"] = seconds
            measured += 1
            if details:
                report.setdefault("details", {}).setdefault(measurement, {})[name] = details
            report["updated"] = _now()
            _write_json(path, report)
            with open(os.path.join(stage_dir, REPORT_MD), "w") as f:
                f.write(results_markdown(report))
            print_fn(f"{measurement} / {name}: {_summary(measurement, result)} ({seconds:.1f} s)")
        if not complete:
            break
    report["complete"] = complete and all(
        name in report["results"].get(m, {}) for m in order for name in models
        if wanted(m, name))
    if report["complete"] and not measured:
        print_fn(f"report already complete ({path}): nothing to measure; report.json and "
                 f"report.md rewritten (run details refreshed). Change a report option or use "
                 f"a new --workdir to measure again")
    # Both files, always together: report.md used to miss the final meta/complete update.
    _write_json(path, report)
    with open(os.path.join(stage_dir, REPORT_MD), "w") as f:
        f.write(results_markdown(report))
    return report


def _measure(measurement, name, model, tokenizer, options, decoders, cache, print_fn,
             details, *, parts_path, fingerprint, should_stop):
    """One measurement of one model (``None`` if ``should_stop`` cut the NIAH parts short);
    run details (timings) go into ``details``; the NIAH parts go to ``parts_path``."""
    pad = tokenizer.eos_id
    if measurement == "speed" and name not in decoders:
        decoders[name] = Decoder(model, pad)
    if measurement == "speed":
        out = {}
        for length in options.speed_lengths:
            prompt = _speed_prompt(tokenizer, options, length)
            out[str(length)] = measure_speed(decoders[name], prompt,
                                             decode_tokens=options.speed_decode_tokens,
                                             repeats=options.speed_repeats)
        return out
    if measurement == "perplexity":
        if "ppl_docs" not in cache:
            cache["ppl_docs"] = runner.read_documents(_perplexity_path(options),
                                                      options.perplexity_max_docs)
        scorer = scoring.Scorer(model, max_len=options.perplexity_window,
                                batch_size=options.perplexity_batch_size,
                                bucket=options.perplexity_window)
        res = ppl_lib.evaluate(scorer, tokenizer, cache["ppl_docs"],
                               max_len=options.perplexity_window,
                               stride=options.perplexity_window)
        res["file"] = os.path.basename(_perplexity_path(options))
        res["window"] = options.perplexity_window
        return res
    if measurement == "corpus_perplexity":
        if "corpus_docs" not in cache:
            cache["corpus_docs"] = corpus_documents(options.corpus_perplexity_paths,
                                                    int(options.corpus_perplexity_tokens))
        scorer = scoring.Scorer(model, max_len=options.perplexity_window,
                                batch_size=options.perplexity_batch_size,
                                bucket=options.perplexity_window)
        res = ppl_lib.evaluate_tokens(scorer, cache["corpus_docs"], tokenizer.eos_id,
                                      max_len=options.perplexity_window,
                                      stride=options.perplexity_window)
        res["paths"] = [os.path.basename(os.path.dirname(os.path.abspath(p))) + "/"
                        + os.path.basename(os.path.abspath(p))
                        for p in options.corpus_perplexity_paths]
        res["window"] = options.perplexity_window
        return res
    if measurement == "commonsense":
        scorer = scoring.Scorer(model, max_len=options.csr_max_len,
                                batch_size=options.csr_batch_size, bucket=options.csr_bucket)
        out = {}
        for task in options.csr_tasks:
            key = f"csr/{task}"
            if key not in cache:
                docs = tasks_lib.load_task(task, os.path.join(options.data_dir, "eval"),
                                           options.csr_limit, options.csr_seed)
                pairs = [scoring.encode_pair(tokenizer, c, x) for d in docs
                         for c, x in d.requests]
                cache[key] = (docs, pairs)
            docs, pairs = cache[key]
            out[task] = with_se(runner.score_task(scorer, task, docs, pairs))
        return out
    if measurement in ("niah", "niah_forced"):
        lengths = tuple(int(n) for n in options.niah_lengths)
        m = options.niah_max_new_tokens
        if "niah" not in cache:
            words = None
            if any(t != "niah_single_1" for t in options.niah_tasks):
                words = niah.load_essays(os.path.join(options.data_dir, "niah",
                                                      "PaulGrahamEssays"))
            t0 = time.perf_counter()
            cache["niah"] = niah_samples(
                tokenizer, tasks=options.niah_tasks, lengths=lengths,
                depths=options.niah_depths, samples_per_cell=options.niah_samples,
                essay_words=words, max_new_tokens=m, seed=options.niah_seed)
            cache["niah_build_s"] = time.perf_counter() - t0
            n = sum(len(b) for per_length in cache["niah"].values() for b in per_length)
            print_fn(f"niah: built {n} prompts in {cache['niah_build_s']:.1f} s")
        prompts = cache["niah"]
        cap = options.get("extra_models_niah_max_len")
        if name not in MAIN_MODELS and cap is not None:  # the extra models' shorter list
            keep = [i for i, n in enumerate(lengths) if n <= cap]
            prompts = {t: [per_length[i] for i in keep] for t, per_length in prompts.items()}
            lengths = tuple(lengths[i] for i in keep)
    if measurement == "niah_forced":
        # As many tokens per forward pass as the perplexity's batches (full fp32 logits).
        budget = options.perplexity_batch_size * options.perplexity_window
        out = {}
        for task, per_length in prompts.items():
            out[task] = {}
            for length, cell in zip(lengths, per_length):
                if length > options.niah_short_max_len:
                    continue
                scorer = scoring.Scorer(model, max_len=length, batch_size=1, bucket=256)
                out[task][str(length)] = niah_forced_scores(
                    scorer, tokenizer, cell, rows_per_batch=max(1, budget // length))
        return out
    if measurement == "niah":
        done = read_niah_parts(parts_path, model=name, fingerprint=fingerprint)
        done = {k: r for k, r in done.items() if k[0] in prompts and k[1] in lengths}
        if done:
            print_fn(f"niah / {name}: {len(done)} of {len(prompts) * len(lengths)} parts read "
                     f"back from {parts_path}")

        def on_part(task, length, out, st):
            scores, _ = niah_part_scores(out, tokenizer, prompts[task][lengths.index(length)])
            acc = float(np.mean(scores))
            se = binomial_se(acc, len(scores))
            append_jsonl(parts_path, {"model": name, "task": task, "length": length,
                                      "fingerprint": fingerprint, "n": len(scores),
                                      "accuracy": acc, "se": se, "answers": out, "stats": st,
                                      "time": _now()})
            print_fn(f"niah / {name} / {task} @ {length:,}: {acc:.3f} ± {se:.3f} "
                     f"({len(scores)} prompts, {st['batches']} batches of {st['batch_size']}, "
                     f"prefill {st['prefill_s']:.1f} s, decode {st['decode_s']:.1f} s)")

        got, stats = niah_answers(
            NiahDecoder(model, chunk=NIAH_DECODE_CHUNK), prompts, lengths=lengths,
            max_new_tokens=m, batch_tokens=options.niah_batch_tokens, stop_id=tokenizer.eos_id,
            print_fn=print_fn, done={k: r["answers"] for k, r in done.items()},
            on_part=on_part, should_stop=should_stop, precompile=jax.default_backend() != "cpu")
        if any(a is None for per_length in got.values() for a in per_length):
            return None  # stopped between parts
        # The result is scored from the file: the parts read back and the ones just written.
        parts = read_niah_parts(parts_path, model=name, fingerprint=fingerprint)
        missing = [f"{t} @ {n}" for t in prompts for n in lengths if (t, n) not in parts]
        if missing:
            raise RuntimeError(f"niah / {name}: parts {missing} missing from {parts_path}")
        answers = {t: [parts[t, n]["answers"] for n in lengths] for t in prompts}
        details["niah"] = {"build_s": cache["niah_build_s"], "per_part": stats,
                           "parts_read_back": sorted(f"{t} @ {n}" for t, n in done)}
        return niah_scores(answers, tokenizer, prompts, lengths=lengths,
                           depths=options.niah_depths, samples_per_cell=options.niah_samples,
                           short_max_len=options.niah_short_max_len)
    raise ValueError(f"unknown measurement {measurement!r}")


def corpus_documents(paths: Sequence[str], max_tokens: int) -> List[np.ndarray]:
    """The first ``max_tokens`` tokens of token-shard directories ``paths``, as documents.

    Documents are taken in the corpus's order; the last one is cut so that the total is
    exactly ``max_tokens`` (or the corpus's size where it is smaller).

    Raises:
      FileNotFoundError / ValueError: as :func:`lattn_jax.data.shards.open_corpus`.
    """
    from lattn_jax.data import shards
    corpus = shards.open_corpus(list(paths))
    docs, total = [], 0
    for i in range(corpus.num_documents):
        if total >= max_tokens:
            break
        ids = np.asarray(corpus.document(i), np.int64)[:max_tokens - total]
        docs.append(ids.tolist())
        total += len(ids)
    return docs


def _summary(measurement: str, result: Mapping[str, Any]) -> str:
    if measurement in ("perplexity", "corpus_perplexity"):
        return f"token perplexity {result['token_perplexity']:.3f}"
    if measurement == "commonsense":
        mean, se = csr_mean(result)
        return ", ".join([f"{t} {r.get('acc_norm', r['acc']):.3f}" for t, r in result.items()]
                         + [f"mean {mean:.3f} ± {se:.3f}"])
    if measurement == "niah_forced":
        return ", ".join(f"{t} @ {int(n):,}: first token p {r['first_prob']:.2f} (argmax "
                         f"{r['first_greedy']:.2f})" for t, per in result.items()
                         for n, r in per.items())
    if measurement == "niah":
        return ", ".join(f"{t} " + ", ".join(
            f"{_span(r[g]['lengths'])} {r[g]['mean']:.2f}" for g in ("short", "long") if r.get(g))
            for t, r in result.items())
    return ", ".join(f"{n}: prefill {r['prefill_s'] * 1e3:.1f} ms, decode "
                     f"{r['decode_s_per_token'] * 1e3:.2f} ms/token, state "
                     f"{r['state_bytes']['total'] / 2 ** 20:.1f} MiB" for n, r in result.items())


# ---------------------------------------------------------------------------------------------
# Markdown
# ---------------------------------------------------------------------------------------------

def _fmt(x: Any, digits: int = 4) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        if math.isnan(x):
            return "nan"
        return f"{x:.{digits}f}"
    return str(x)


def _mib(n: Optional[int]) -> str:
    return "–" if n is None else f"{n / 2 ** 20:,.1f}"


def results_markdown(report: Mapping[str, Any]) -> str:
    """Markdown tables of a report dict: one row per metric, a column per model.

    Accuracies are shown as ``mean ± SE`` (binomial standard errors; the SE of a mean over
    tasks or lengths is ``sqrt(sum SE_i^2) / k``). NIAH: ``string_match_all`` per task and
    length, a summary table (the means over the lengths up to ``niah_short_max_len`` and above
    it, per task and over the tasks, and the student/teacher ratio of the short means with a
    delta-method SE), and a lengths x depths grid per task and model. Perplexity per position
    bucket (``position_nll``, :mod:`lattn_jax.eval.perplexity`): one row per bucket, a column
    per model that has it, and the student/teacher perplexity ratio; no table for reports
    written before the buckets.

    Args:
      report: the dict written by :func:`run_report` (any subset of its measurements; reports
        written before the SE fields existed render without them where ``n`` is unknown).
    """
    res = report.get("results", {})
    names = [m for m in MODELS if any(m in r for r in res.values())]
    if not names:
        return "No measurement yet.\n"
    lines = ["| measurement | metric | " + " | ".join(names) + " |",
             "|---|---|" + "---:|" * len(names)]

    def row(measurement, metric, values):
        lines.append(f"| {measurement} | {metric} | " + " | ".join(values) + " |")

    ppl = res.get("perplexity", {})
    if ppl:
        any_r = next(iter(ppl.values()))
        where = f"{any_r.get('file', '')}, window {any_r.get('window', '')}"
        for metric in ("token_perplexity", "word_perplexity", "bits_per_byte"):
            row(f"perplexity ({where})", metric,
                [_fmt(ppl.get(n, {}).get(metric), 3) for n in names])
    cppl = res.get("corpus_perplexity", {})
    if cppl:
        any_r = next(iter(cppl.values()))
        where = (f"{', '.join(any_r.get('paths', []))}, first {any_r.get('tokens', 0):,} tokens,"
                 f" window {any_r.get('window', '')}")
        row(f"corpus perplexity ({where})", "token_perplexity",
            [_fmt(cppl.get(n, {}).get("token_perplexity"), 3) for n in names])
    csr = res.get("commonsense", {})
    tasks = sorted({t for r in csr.values() for t in r if t not in RESULT_MARKERS})
    for t in tasks:
        for metric in ("acc", "acc_norm"):
            vals = [csr.get(n, {}).get(t) for n in names]
            if all(v is None or metric not in v for v in vals):
                continue
            n_docs = next(r[t]["n"] for r in csr.values() if t in r)
            chance = next(r[t].get(f"{metric}_chance") for r in csr.values() if t in r)
            row(f"{t} (n={n_docs}, chance {_fmt(chance, 3)})", metric,
                [_pm(v.get(metric), v.get(f"{metric}_se", _se_of(v.get(metric), v.get("n"))))
                 if v is not None else "–" for v in vals])
    if tasks:
        means = []
        for n in names:
            done = [t for t in tasks if t in csr.get(n, {})]
            means.append(_pm(*csr_mean(csr[n], done)) if done else "–")
        row(f"commonsense ({len(tasks)} tasks)", "mean of acc_norm (acc where none)", means)
    nh = res.get("niah", {})
    short_max = int(report.get("options", {}).get("niah_short_max_len") or 8192)
    niah_tasks = sorted({t for r in nh.values() for t in r if t not in RESULT_MARKERS})
    for task in niah_tasks:
        any_r = next(r[task] for r in nh.values() if task in r)
        for length in any_r["lengths"]:
            n_len = any_r.get("per_length_n", {}).get(str(length))
            tag = f"{task} (n={n_len} per length)" if n_len else task
            row(tag, f"string_match_all @ {length:,}",
                [_pm(*_niah_length(nh.get(n, {}).get(task), length)) for n in names])
        for group in ("short", "long"):
            g = _niah_group(any_r, group, short_max)
            if g is not None:
                row(task, f"mean {_span(g[0])}",
                    [_pm(*(_niah_group(nh[n][task], group, short_max) or (None, None, None))[1:])
                     if task in nh.get(n, {}) else "–" for n in names])
    sp = res.get("speed", {})
    for length in sorted({int(k) for r in sp.values() for k in r if k not in RESULT_MARKERS}):
        def get(n, *keys):
            r = sp.get(n, {}).get(str(length))
            for k in keys:
                r = None if r is None else r.get(k)
            return r

        tag = f"speed @ {length:,}"
        row(tag, "prompt tokens / cache capacity",
            [f"{get(n, 'prompt_tokens')} / {get(n, 'capacity')}"
             if get(n, "prompt_tokens") is not None else "–" for n in names])
        row(tag, "prefill (ms)", [_fmt(_ms(get(n, "prefill_s")), 1) for n in names])
        row(tag, "prefill (tokens/s)", [_fmt(get(n, "prefill_tokens_per_s"), 0)
                                        for n in names])
        row(tag, "decode (ms/token)", [_fmt(_ms(get(n, "decode_s_per_token")), 2)
                                       for n in names])
        row(tag, "decode (tokens/s)", [_fmt(get(n, "decode_tokens_per_s"), 0) for n in names])
        row(tag, "state: KV cache (MiB)", [_mib(get(n, "state_bytes", "kv_cache"))
                                           for n in names])
        row(tag, "state: recurrent (MiB)", [_mib(get(n, "state_bytes", "recurrent"))
                                            for n in names])
        row(tag, "state: total (MiB)", [_mib(get(n, "state_bytes", "total")) for n in names])
        row(tag, "device peak so far (MiB)",
            [_mib(get(n, "device_memory", "peak_bytes_in_use")) for n in names])
    out = "\n".join(lines) + "\n"
    reused = sorted({(m, r["teacher"]["reused_from"].get("path"),
                      r["teacher"]["reused_from"].get("updated"))
                     for m, r in res.items() if "reused_from" in r.get("teacher", {})})
    if reused:
        out += ("\nThe teacher's results of " + ", ".join(m for m, _, _ in reused)
                + " are reused from " + "; ".join(sorted({f"`{p}` (updated {u})"
                                                          for _, p, u in reused}))
                + ", measured under the same options.\n")
    out += _position_table(ppl, names)
    if niah_tasks:
        out += "\n" + _niah_summary(nh, [n for n in names if n in nh], niah_tasks, short_max)
        cap = (report.get("options") or {}).get("extra_models_niah_max_len")
        capped = [n for n in names if n in nh and n not in MAIN_MODELS]
        if cap is not None and capped:
            out += (f"\n{', '.join(capped)}: NIAH at lengths up to {cap:,} only "
                    f"(`report.extra_models_niah_max_len`); a dash is a length not measured.\n")
    out += _niah_modes_table(nh, names, niah_tasks)
    out += _niah_forced_table(res.get("niah_forced", {}), names)
    for task in niah_tasks:
        for n in names:
            r = nh.get(n, {}).get(task)
            if r is None:
                continue
            per_cell = f", {r['n_per_cell']} prompts per cell" if r.get("n_per_cell") else ""
            out += (f"\n{task}, {n} (string_match_all{per_cell}; rows: length in tokens, "
                    f"columns: depth %)\n\n| length | "
                    + " | ".join(f"{d:g}%" for d in r["depths"])
                    + " |\n|---:|" + "---:|" * len(r["depths"]) + "\n")
            for length, grid_row in zip(r["lengths"], r["grid"]):
                out += f"| {length:,} | " + " | ".join(f"{v:.2f}" for v in grid_row) + " |\n"
    return out


def _niah_modes_table(nh: Mapping[str, Any], names: Sequence[str],
                      tasks: Sequence[str]) -> str:
    """The NIAH answer modes (``answer_modes`` of :func:`niah_scores`) per task, length and
    model, as ``value first / value later / partial value / no value`` counts; ``""`` when
    no model has them (reports written before them)."""
    rows = []
    for task in tasks:
        have = [n for n in names if "answer_modes" in nh.get(n, {}).get(task, {})]
        if not have:
            continue
        lengths = sorted({int(k) for n in have for k in nh[n][task]["answer_modes"]})
        for length in lengths:
            vals = []
            for n in names:
                c = nh.get(n, {}).get(task, {}).get("answer_modes", {}).get(str(length))
                vals.append(" / ".join(str(c[m]) for m in niah.ANSWER_MODES) if c else "–")
            rows.append(f"| {task} | {length:,} | " + " | ".join(vals) + " |")
    if not rows:
        return ""
    head = ["", "NIAH answer modes (counts: value first / value later / part of the value / "
                "no value; `lattn_jax.eval.niah.answer_mode`)", "",
            "| task | length | " + " | ".join(names) + " |", "|---|---:|" + "---:|" * len(names)]
    return "\n".join(head + rows) + "\n"


def _niah_forced_table(forced: Mapping[str, Any], names: Sequence[str]) -> str:
    """The ``niah_forced`` table: per task and length, each model's mean probability of the
    answer's first token (argmax fraction) and of the later tokens; ``""`` without results."""
    names = [n for n in names if n in forced]
    if not names:
        return ""
    cells = sorted({(t, int(n)) for m in names for t, per in forced[m].items()
                    if t not in RESULT_MARKERS for n in per})
    lines = ["", "NIAH answers under teacher forcing (`niah_forced`): mean probability of the "
             "gold answer's first token (in brackets: the fraction of prompts where it is the "
             "argmax) and of its later tokens given the gold ones before them (in brackets: "
             "all of them argmax). The gold answer is `\" \" + value`; a model that begins "
             "its own answers otherwise (e.g. with `\": \"`) gives its first token a low "
             "probability even when it answers right: compare that column between models",
             "",
             "| task | length | "
             + " | ".join(f"{n} first token | {n} later tokens" for n in names) + " |",
             "|---|---:|" + "---:|---:|" * len(names)]
    for task, length in cells:
        vals = []
        for n in names:
            r = forced[n].get(task, {}).get(str(length))
            if r is None:
                vals += ["–", "–"]
                continue
            vals.append(f"{r['first_prob']:.3f} ({r['first_greedy']:.2f})")
            vals.append("–" if r.get("rest_prob") is None else
                        f"{r['rest_prob']:.3f} ({r['rest_greedy']:.2f})")
        lines.append(f"| {task} | {length:,} | " + " | ".join(vals) + " |")
    return "\n".join(lines) + "\n"


def _position_table(ppl: Mapping[str, Any], names: Sequence[str]) -> str:
    """The perplexity per position bucket (``position_nll``) of the models that have it, and
    the student/teacher ratio; ``""`` where no model has it (reports before the buckets)."""
    have = [n for n in names if ppl.get(n, {}).get("position_nll")]
    if not have:
        return ""
    first = ppl[have[0]]
    buckets = {n: {(b["start"], b["stop"]): b for b in ppl[n]["position_nll"]} for n in have}

    def get(n, key):
        return (buckets.get(n, {}).get(key) or {}).get("perplexity")

    out = (f"\nPerplexity by position in the window ({first.get('file', '')}, window "
           f"{first.get('window', '')}): exp(mean token NLL) of the tokens at 0-based positions "
           "[start, stop) of their scoring window.\n\n| positions | tokens | "
           + " | ".join(f"{n} ppl" for n in have) + " | student / teacher |\n|---|---:|"
           + "---:|" * (len(have) + 1) + "\n")
    for b in first["position_nll"]:
        key = (b["start"], b["stop"])
        t, s = get("teacher", key), get("student", key)
        ratio = _fmt(s / t, 3) if t and s is not None else "–"
        out += (f"| [{b['start']:,}, {b['stop']:,}) | {b['tokens']:,} | "
                + " | ".join(_fmt(get(n, key), 3) for n in have) + f" | {ratio} |\n")
    return out


def _pm(mean: Optional[float], se: Optional[float], digits: int = 3) -> str:
    """``"0.652 ± 0.015"`` (just the mean where the SE is unknown, ``–`` for no mean)."""
    if mean is None:
        return "–"
    if se is None or (isinstance(se, float) and math.isnan(se)):
        return _fmt(float(mean), digits)
    return f"{mean:.{digits}f} ± {se:.{digits}f}"


def _se_of(p: Optional[float], n: Optional[int]) -> Optional[float]:
    return None if p is None or not n else binomial_se(float(p), int(n))


def _span(lengths: Sequence[int]) -> str:
    return f"{min(lengths):,}–{max(lengths):,}" if len(lengths) > 1 else f"{lengths[0]:,}"


def _niah_length(r: Optional[Mapping[str, Any]], length: int
                 ) -> Tuple[Optional[float], Optional[float]]:
    """``(mean, SE)`` of one task's score at one length (SE ``None`` if ``n`` is unknown)."""
    if r is None or str(length) not in r.get("per_length", {}):
        return None, None
    p = r["per_length"][str(length)]
    se = r.get("per_length_se", {}).get(str(length))
    if se is None:
        se = _se_of(p, r.get("per_length_n", {}).get(str(length)))
    return p, se


def _niah_group(r: Mapping[str, Any], group: str, short_max: int
                ) -> Optional[Tuple[List[int], float, Optional[float]]]:
    """``(lengths, mean, SE)`` of a task's ``"short"`` (``<= short_max``) or ``"long"``
    lengths, from the stored group or the per-length values; ``None`` for no such length."""
    if r.get(group):
        return r[group]["lengths"], r[group]["mean"], r[group]["se"]
    sel = [n for n in r["lengths"] if (n <= short_max) == (group == "short")]
    if not sel:
        return None
    vals = [_niah_length(r, n) for n in sel]
    if any(se is None for _, se in vals):
        return sel, float(np.mean([p for p, _ in vals])), None
    return (sel, *mean_with_se([p for p, _ in vals], [se for _, se in vals]))


def _ratio(num: Optional[Tuple], den: Optional[Tuple]) -> str:
    """``num / den`` of two ``(mean, SE)`` with the delta-method SE."""
    if num is None or den is None or not den[0]:
        return "–"
    r = num[0] / den[0]
    if num[1] is None or den[1] is None:
        return _fmt(r, 3)
    rel = (num[1] / num[0]) ** 2 if num[0] else 0.0
    return _pm(r, abs(r) * math.sqrt(rel + (den[1] / den[0]) ** 2))


def _niah_summary(nh: Mapping[str, Any], names: Sequence[str], tasks: Sequence[str],
                  short_max: int) -> str:
    """The NIAH summary table: per task and over the tasks, the short and long means per
    model and the student/teacher ratio of the short means."""
    groups = {}  # (model, task) -> {group: (lengths, mean, se)}
    for n in names:
        for t in tasks:
            if t in nh.get(n, {}):
                groups[n, t] = {g: _niah_group(nh[n][t], g, short_max) for g in ("short", "long")}
    spans = {}
    for g in ("short", "long"):
        found = [v[g][0] for v in groups.values() if v[g] is not None]
        if found:
            spans[g] = _span(found[0])
    head = ["task"]
    for g in ("short", "long"):
        if g in spans:
            head += [f"{n} {spans[g]}" for n in names]
            if g == "short" and set(MAIN_MODELS) <= set(names):
                head.append(f"student / teacher {spans[g]}")
    lines = ["NIAH summary (string_match_all, mean ± SE over the lengths of each span)", "",
             "| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]

    def cells(per_model):  # per_model: {name: {group: (mean, se) or None}}
        out = []
        for g in ("short", "long"):
            if g not in spans:
                continue
            out += [_pm(*per_model[n][g]) if per_model.get(n, {}).get(g) else "–"
                    for n in names]
            if g == "short" and set(MAIN_MODELS) <= set(names):
                out.append(_ratio(per_model.get("student", {}).get(g),
                                  per_model.get("teacher", {}).get(g)))
        return out

    for t in tasks:
        per_model = {n: {g: groups[n, t][g][1:] if groups[n, t][g] else None
                         for g in ("short", "long")}
                     for n in names if (n, t) in groups}
        lines.append(f"| {t} | " + " | ".join(cells(per_model)) + " |")
    if len(tasks) > 1:
        per_model = {}
        for n in names:
            per_model[n] = {}
            for g in ("short", "long"):
                vals = [groups[n, t][g] for t in tasks if (n, t) in groups]
                if len(vals) == len(tasks) and all(v is not None for v in vals):
                    ses = [v[2] for v in vals]
                    per_model[n][g] = (mean_with_se([v[1] for v in vals], ses)
                                       if all(s is not None for s in ses)
                                       else (float(np.mean([v[1] for v in vals])), None))
                else:
                    per_model[n][g] = None
        lines.append(f"| mean of {len(tasks)} tasks | " + " | ".join(cells(per_model)) + " |")
    return "\n".join(lines) + "\n"


def _ms(seconds: Optional[float]) -> Optional[float]:
    return None if seconds is None else 1e3 * seconds


def _stage_rows(config: Mapping[str, Any], workdir: str) -> List[str]:
    """The token-budget table of the training and evaluation stages."""
    rows = ["| stage | what | seq_len x batch x steps | tokens | peak LR | loss first logged "
            "(step) | loss last logged (step) | wall time (s) | complete |",
            "|---|---|---|---:|---:|---|---|---:|---|"]
    what = {"stage1": "per-layer MSE to the attention outputs (Lightning students)",
            "stage2": "forward KL from the teacher, whole student",
            "stage3": "next-token CE, long windows"}
    s3 = config.get("stage3") or {}
    if (s3.get("kl_weight") or 0) > 0:  # stages.stage3_loss_fn: CE + w x KL on a prefix
        what["stage3"] += (f", + {s3['kl_weight']:g} x forward KL from the teacher on each "
                           f"window's first {s3.get('kl_len')} positions (the logged loss is "
                           f"the sum)")
    for stage in ("stage1", "stage2", "stage3"):
        sec = config.get(stage, {})
        if not sec:
            continue
        steps = sec.get("train", {}).get("total_steps", 0)
        tokens = sec.get("seq_len", 0) * sec.get("batch_size", 0) * steps
        metrics = read_jsonl(os.path.join(workdir, stage, "metrics.jsonl"))
        first = f"{metrics[0]['loss']:.4f} ({metrics[0]['step']})" if metrics else "–"
        last = f"{metrics[-1]['loss']:.4f} ({metrics[-1]['step']})" if metrics else "–"
        rows.append(f"| {stage} | {what[stage]} | {sec.get('seq_len')} x "
                    f"{sec.get('batch_size')} x {steps} | {tokens:,} | "
                    f"{sec.get('optim', {}).get('learning_rate')} | {first} | {last} | "
                    f"{_wall(workdir, stage)} | {_complete(workdir, stage)} |")
    sel = config.get("select", {})
    override = (config.get("hypenet") or {}).get("attention_layers")
    if sel and override is not None and not os.path.isdir(os.path.join(workdir, "select")):
        # The selection's ablation as its own pipeline (--stages without select).
        rows.append(f"| select | not run: `hypenet.attention_layers` = {list(override)} set "
                    f"in the config | – | – | – | – | – | – | – |")
    elif sel:
        selection = read_json(os.path.join(workdir, "select", "selection.json")) or {}
        layers = len(selection.get("csr", ()))
        if "csr_tokens_per_layer" in selection:  # the held-out / NIAH probes
            per_layer = selection["csr_tokens_per_layer"] + selection["recall_tokens_per_layer"]
            evals = layers + (1 if "teacher" in selection else 0)
            what = (f"{selection.get('csr_items', '?')} held-out CSR items + "
                    f"{selection.get('recall_items', '?')} NIAH recall prompts per layer")
            tokens = f"{evals * per_layer:,} (eval, {evals} models)"
        else:
            per_layer = sel.get("seq_len", 0) * sel.get("batch_size", 0) * (
                sel.get("max_val_batches") or 0)
            what = (f"{sel.get('seq_len')} x {sel.get('batch_size')} x "
                    f"{sel.get('max_val_batches')} val batches + "
                    f"{sel.get('synthetic_recall')} recall prompts per layer")
            tokens = (f"{layers * per_layer:,} (eval)" if layers and not sel.get("csr_items")
                      else "–")
        rows.append(f"| select | single-replacement sweep over {layers or '?'} layers | {what} | "
                    f"{tokens} | – | – | – | {_wall(workdir, 'select')} | "
                    f"{_complete(workdir, 'select')} |")
    cal = config.get("calibrate", {})
    if cal:
        n = len(cal.get("candidates", ()))
        rows.append(f"| calibrate | validation CE per candidate a | {cal.get('seq_len')} x "
                    f"{cal.get('batch_size')} x {cal.get('max_batches')} batches x {n} "
                    f"candidates | – | – | – | – | {_wall(workdir, 'calibrate')} | "
                    f"{_complete(workdir, 'calibrate')} |")
    if config.get("report"):
        rows.append(f"| report | teacher vs student | – | – | – | – | – | "
                    f"{_wall(workdir, 'report')} | {_complete(workdir, 'report')} |")
    return rows


def calibration_lines(cal: Mapping[str, Any]) -> List[str]:
    """The markdown of ``calibrate/calibration.json``: the validation CE of each candidate ``a``
    over the whole windows and, when recorded (``stages.calibrate_logit_scaling``'s
    ``bucket_losses``), per position bucket, then the choice."""
    buckets = cal.get("position_buckets") or []
    per = cal.get("bucket_losses") or {}
    split = len(buckets) > 1 and per
    head = "| a | validation CE |" + "".join(f" [{a:,}, {b:,}) |" for a, b in buckets if split)
    lines = [head, "|---|---:|" + "---:|" * (len(buckets) if split else 0)]
    for a, loss in cal["losses"].items():
        cells = "".join(f" {_fmt(v, 4)} |" for v in per.get(a, [None] * len(buckets))
                        ) if split else ""
        lines.append(f"| {a} | {loss:.4f} |{cells}")
    if cal.get("seq_len"):
        lines += ["", f"Windows of {cal['seq_len']:,} tokens; loss in nats per token"
                  + (" (the buckets: 0-based positions in the window)." if split else ".")]
    return lines + ["", f"Chosen: a = {cal['best']} (the lowest whole-window CE).", ""]


def selection_lines(sel: Mapping[str, Any], student_attention: str = "NoPE + gate") -> List[str]:
    """The markdown of ``select/selection.json``: the kept layers, the metrics, every layer's
    scores (and the teacher's probe values), and whether a tie at the cut decided the choice.
    ``student_attention`` names the kept layers' form in the student (HypeNet's NoPE + gate, or
    an ablation's, from the run's ``hypenet.attention_rope`` / ``attention_gate``)."""
    recall_metric = sel.get("recall_metric", "greedy `contains` on the recall items")
    lines = [f"Kept as softmax attention ({student_attention} in the student): "
             f"**{sel['attention_layers']}**.", "",
             f"* CSR: {sel.get('csr_metric')}.", f"* Recall: {recall_metric}."]
    if sel.get("recall_accuracy_metric"):
        lines.append(f"* Recall accuracy (reported, not scored): "
                     f"{sel['recall_accuracy_metric']}.")
    if "ranking" in sel:
        lines.append(f"* Ranking (descending score): {sel['ranking']}.")
    if "cut_scores" in sel:
        lines.append(f"* Scores at the cut (rank k, k + 1): {sel['cut_scores']}; "
                     f"{sel.get('notice') or 'no tie decides the choice'}.")
    boot = sel.get("bootstrap")
    if boot:
        sets = "; ".join(f"{layers} {share:.1%}" for layers, share in boot["sets"])
        lines.append(f"* Stability (a paired bootstrap over the probes' items, "
                     f"{boot['resamples']} resamples, `selection.bootstrap_selection`): the "
                     f"selected set in {boot['selected_frequency']:.1%} of them; the most "
                     f"frequent sets: {sets}. The table's last column: each layer's share of "
                     f"the resamples that keep it.")
    acc = sel.get("recall_accuracy")
    has_acc = acc is not None and any(a is not None for a in acc)
    lines += ["", "| layer | csr | recall | " + ("recall accuracy | " if has_acc else "")
              + "score |" + (" kept (bootstrap) |" if boot else ""),
              "|---:|---:|---:|" + ("---:|" if has_acc else "") + "---:|"
              + ("---:|" if boot else "")]
    teacher = sel.get("teacher")
    if teacher:
        extra = f" {teacher.get('recall_accuracy') or 0:.3f} |" if has_acc else ""
        lines.append(f"| teacher (no replacement) | {teacher['csr']:.4f} | "
                     f"{teacher['recall']:.4f} |{extra} – |" + (" – |" if boot else ""))
    for i, (c, r, sc) in enumerate(zip(sel["csr"], sel["recall"], sel["scores"])):
        mark = " **(attn)**" if i in sel["attention_layers"] else ""
        extra = (f" {acc[i]:.3f} |" if acc[i] is not None else " – |") if has_acc else ""
        kept = f" {boot['top_k_frequency'][i]:.2f} |" if boot else ""
        lines.append(f"| {i}{mark} | {c:.4f} | {r:.4f} |{extra} {sc:.3f} |{kept}")
    return lines


def stage_throughput(workdir: str, stage: str) -> Optional[Dict[str, Any]]:
    """One training stage's throughput over all its invocations (``throughput.jsonl``).

    Returns:
      ``None`` if the stage never ran, else ``{"invocations", "timed_steps", "timed_s",
      "tokens_per_step", "tokens_per_s", "flops_per_token", "peak_flops", "mfu" (or None),
      "first_step_s" (each invocation's first step: compile + one step), "median_window_mfu",
      "median_window_tokens_per_s"}``.
    """
    runs = read_jsonl(os.path.join(workdir, stage, "throughput.jsonl"))
    if not runs:
        return None
    steps = sum(r.get("timed_steps") or 0 for r in runs)
    secs = sum(r.get("timed_s") or 0.0 for r in runs)
    per_step = next((r["tokens_per_step"] for r in runs if r.get("tokens_per_step")), None)
    flops = next((r["flops_per_token"] for r in runs if r.get("flops_per_token")), None)
    peak = next((r["peak_flops"] for r in runs if r.get("peak_flops")), None)
    tps = steps * per_step / secs if secs and per_step else None
    windows = [m for m in read_jsonl(os.path.join(workdir, stage, "metrics.jsonl"))
               if "tokens_per_s" in m]
    return {"invocations": len(runs), "timed_steps": steps, "timed_s": secs,
            "tokens_per_step": per_step, "tokens_per_s": tps, "flops_per_token": flops,
            "peak_flops": peak, "mfu": (flops * tps / peak) if tps and flops and peak else None,
            "first_step_s": [r.get("first_step_s") for r in runs],
            "median_window_tokens_per_s": (statistics.median(m["tokens_per_s"] for m in windows)
                                           if windows else None),
            "median_window_mfu": (statistics.median(m["mfu"] for m in windows if "mfu" in m)
                                  if any("mfu" in m for m in windows) else None)}


def throughput_rows(workdir: str) -> List[str]:
    """The markdown table of :func:`stage_throughput` for stage 1, 2 and 3."""
    rows = ["| stage | tokens / step | GFLOP / token | timed steps | tokens/s | MFU | "
            "median window tokens/s | median window MFU | first step of each invocation (s) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for stage in ("stage1", "stage2", "stage3"):
        t = stage_throughput(workdir, stage)
        if t is None:
            rows.append(f"| {stage} | – | – | – | – | – | – | – | – |")
            continue

        def pct(x):
            return "–" if x is None else f"{x:.1%}"

        def num(x):
            return "–" if x is None else f"{x:,.0f}"

        gflop = "–" if t["flops_per_token"] is None else f"{t['flops_per_token'] / 1e9:.3f}"
        first = ", ".join("–" if x is None else f"{x:.1f}" for x in t["first_step_s"])
        rows.append(f"| {stage} | {num(t['tokens_per_step'])} | {gflop} | {t['timed_steps']} | "
                    f"{num(t['tokens_per_s'])} | {pct(t['mfu'])} | "
                    f"{num(t['median_window_tokens_per_s'])} | {pct(t['median_window_mfu'])} | "
                    f"{first} |")
    return rows


def _wall(workdir: str, stage: str) -> str:
    runs = read_jsonl(os.path.join(workdir, stage, "timing.jsonl"))
    return f"{sum(r.get('wall_s', 0.0) for r in runs):.0f}" if runs else "–"


def _complete(workdir: str, stage: str) -> str:
    return "yes" if os.path.exists(os.path.join(workdir, stage, "done.json")) else "no"


def render_markdown(workdir: str, *, title: Optional[str] = None) -> str:
    """The results page of a HALO workdir, from the JSON files its stages wrote.

    Reads ``config.json``, ``<stage>/metrics.jsonl``, ``<stage>/timing.jsonl``,
    ``<stage>/done.json``, ``select/selection.json``, ``calibrate/calibration.json``,
    ``report/report.json`` and ``pipeline.jsonl`` (the driver's command lines); any of them may
    be missing (its section says so).

    Args:
      workdir: the HALO workdir.
      title: the page title (default: from the teacher file and the report's date).

    Returns:
      Markdown text.
    """
    config = read_json(os.path.join(workdir, "config.json"), {}) or {}
    report = read_json(os.path.join(workdir, "report", REPORT_JSON), {}) or {}
    sel = read_json(os.path.join(workdir, "select", "selection.json"))
    cal = read_json(os.path.join(workdir, "calibrate", "calibration.json"))
    pipeline = read_jsonl(os.path.join(workdir, "pipeline.jsonl"))
    meta = report.get("meta", {})
    hw = meta.get("hardware", {})
    date = (report.get("updated") or report.get("started") or _now())[:10]
    teacher = config.get("teacher", {}).get("path") or config.get("teacher", {}).get("kind")
    title = title or f"HALO conversion of {os.path.basename(str(teacher))} ({date})"
    lines = [f"# {title}", ""]
    lines += [f"Hardware: {hw.get('device_count', '?')} x {hw.get('device_kind', '?')} "
              f"({hw.get('platform', '?')}); jax {hw.get('jax', '?')}, jaxlib "
              f"{hw.get('jaxlib', '?')}, flax {hw.get('flax', '?')}, optax "
              f"{hw.get('optax', '?')}, Python {hw.get('python', '?')}.", ""]
    if meta.get("teacher") or meta.get("student"):
        lines += ["Models:", ""]
        for name in MODELS:
            if name in meta:
                lines.append(f"* {name}: {meta[name]}")
        lines.append("")
    lines += ["## Commands", ""]
    if pipeline:
        lines.append("```bash")
        seen = []
        for rec in pipeline:
            cmd = rec.get("command")
            if cmd and cmd not in seen:
                seen.append(cmd)
                lines.append(cmd)
        lines += ["```", ""]
        for rec in pipeline:
            lines.append(f"* {rec.get('started', '?')}: stages {rec.get('stages', {})}, "
                         f"{rec.get('wall_s', 0):.0f} s, exit: {rec.get('status', '?')}")
        lines.append("")
    else:
        lines += ["(no pipeline.jsonl: stages were run one by one with "
                  "`experiments/halo.py --stage=...`)", ""]
    lines += ["## Stages and token budgets", "",
              "Tokens = seq_len x batch x steps (training stages); losses are the first and "
              "last logged values of `<stage>/metrics.jsonl`.", ""]
    lines += _stage_rows(config, workdir)
    total = sum(config.get(st, {}).get("seq_len", 0) * config.get(st, {}).get("batch_size", 0)
                * config.get(st, {}).get("train", {}).get("total_steps", 0)
                for st in ("stage1", "stage2", "stage3"))
    lines += ["", f"Training tokens in all: {total:,}.", ""]
    lines += ["## Throughput of the training stages", "",
              "From `<stage>/throughput.jsonl` (one line per invocation): tokens/s over the "
              "timed steps (every step but each invocation's first, which compiles; checkpoint "
              "saves not timed); MFU = model FLOPs per token (`stages.stage_flops_per_token`: "
              "teacher forward + student forward and backward, causal attention halved) x "
              "tokens/s / the device's bf16 dense peak. The median window is the median over "
              "the logged windows of `metrics.jsonl`.", ""]
    lines += throughput_rows(workdir)
    lines += ["", "## Layer selection", ""]
    override = (config.get("hypenet") or {}).get("attention_layers")
    if sel and override is not None and list(override) != list(sel["attention_layers"]):
        # A run from a copied workdir (halo_h200.sh BRANCH_FROM=stage2, the selection's
        # ablation) trains other layers than the selection it carries: say which.
        lines += [f"**This run's student does not use the selection below:** "
                  f"`config.hypenet.attention_layers` = {list(override)} overrides the "
                  f"selected {list(sel['attention_layers'])}.", ""]
    if sel:
        hyp = config.get("hypenet", {}) or {}
        lines += selection_lines(sel, " + ".join(
            ["RoPE" if hyp.get("attention_rope") else "NoPE"]
            + (["gate"] if hyp.get("attention_gate", True) else [])))
    else:
        lines.append("No selection (attention layers set in the config, or select not run).")
    lines += ["", "## Calibration of the logit scaling base a", ""]
    if cal:
        lines += calibration_lines(cal)
    else:
        lines += ["Not run (the student is evaluated without logit scaling).", ""]
    lines += ["## Teacher versus converted student", ""]
    if report:
        opts = report.get("options", {})
        lines += [f"Options: {json.dumps(opts, sort_keys=True)}", "",
                  results_markdown(report)]
        secs = report.get("seconds", {})
        if secs:
            times = ", ".join(f"{k} {v:.1f}" for k, v in secs.items())
            lines += [f"Measurement times (s): {times}", ""]
    else:
        lines += ["No report yet.", ""]
    return "\n".join(lines) + "\n"
