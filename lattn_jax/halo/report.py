"""The HALO report: the teacher against its converted HypeNet student (arXiv 2601.22156).

:func:`run_report` measures both models (spec ``hypenet-halo.md`` §4) and writes
``report.json`` and ``report.md`` in its directory after every measurement; a run that finds a
measurement of a model there (with the same options) skips it, so the stage resumes after an
interruption. Measurements, in this order:

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
3. ``commonsense``: the zero-shot tasks of :mod:`lattn_jax.eval.tasks` (lm-eval prompts,
   ``acc``/``acc_norm``) on ``csr_limit`` documents each (the seeded subsample of
   :func:`lattn_jax.eval.tasks.load_task`), read from ``<data_dir>/eval``.
4. ``niah``: RULER needles (:mod:`lattn_jax.eval.niah`: ``niah_single_*`` and the multi-key
   ``niah_multikey_1``) over ``niah_lengths x niah_depths`` with ``niah_samples`` prompts per
   cell, greedy decoding of ``niah_max_new_tokens`` tokens. The prompts are built once for both
   models, and every prompt is left-padded to the longest length (the padding is a separate
   document that no token attends to), so that each model compiles one prefill and one
   decoding step for the whole grid.

Both models are evaluated with ``use_segment_ids`` on: a prefill with segment ids keeps left
padding out of the prompt; calls without segment ids (scoring, the timed prefill) are the plain
causal forward.

Shapes are kept few on purpose (one compiled program per shape): perplexity windows are padded to
the window, commonsense requests to a multiple of ``csr_bucket``.

:func:`render_markdown` turns the JSON of every stage of a HALO workdir (config, per-stage
metrics and timings, the selection, the calibration and this report) into the results page
``benchmarks/results/halo-<model>-<date>.md``.
"""

import datetime
import inspect
import json
import math
import os
import platform
import random
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
from lattn_jax.eval import generate as gen_lib
from lattn_jax.eval import niah
from lattn_jax.eval import perplexity as ppl_lib
from lattn_jax.eval import runner
from lattn_jax.eval import scoring
from lattn_jax.eval import tasks as tasks_lib
from lattn_jax.mixers import attention as attention_lib

MEASUREMENTS = ("speed", "perplexity", "commonsense", "niah")
MODELS = ("teacher", "student")
REPORT_JSON = "report.json"
REPORT_MD = "report.md"
DEFAULT_PERPLEXITY_FILE = "corpus/wikitext-2-raw/wiki.test.raw"  # bundled asset


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


def read_json(path: str, default: Any = None) -> Any:
    """The JSON object in ``path``, or ``default`` if the file does not exist."""
    if not os.path.exists(path):
        return default
    with open(path) as f:
        return json.load(f)


def read_jsonl(path: str) -> List[Dict[str, Any]]:
    """The records of a JSONL file (``[]`` if it does not exist; unparsable lines skipped)."""
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    return out


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
# NIAH
# ---------------------------------------------------------------------------------------------

def niah_samples(tokenizer, *, tasks: Sequence[str], lengths: Sequence[int],
                 depths: Sequence[float], samples_per_cell: int,
                 essay_words: Optional[Sequence[str]], max_new_tokens: int,
                 seed: int = 42) -> Dict[str, List[List[niah.Sample]]]:
    """The prompts of :func:`lattn_jax.eval.niah.run` (same seeds and order), built once.

    Each search for the largest haystack starts from the previous sample's size (scaled to the
    length), which gives the same prompts with a few tokenizations each.

    Returns:
      ``{task: [per length: [samples, depth-major]]}``.
    """
    out = {}
    for task in tasks:
        rng = random.Random(seed)
        per_length, hint, previous = [], None, None
        for length in lengths:
            samples = []
            if hint is not None:  # the haystack grows about in proportion to the length
                hint = max(1, int(hint * (length - max_new_tokens) / (previous - max_new_tokens)))
            previous = length
            for d in depths:
                for _ in range(samples_per_cell):
                    s = niah.make_sample(task, tokenizer, length, d, rng, essay_words,
                                         max_new_tokens, start_units=hint)
                    hint = s.haystack_units
                    samples.append(s)
            per_length.append(samples)
        out[task] = per_length
    return out


def niah_scores(generate_fn: Callable[[List[int]], List[int]], tokenizer,
                samples: Mapping[str, List[List[niah.Sample]]], *, lengths: Sequence[int],
                depths: Sequence[float], samples_per_cell: int) -> Dict[str, Any]:
    """Scores one model on prebuilt NIAH samples, in :func:`lattn_jax.eval.niah.run`'s format.

    Args:
      generate_fn: ``prompt ids -> generated ids`` (greedy).
      tokenizer: decodes the answers.
      samples: from :func:`niah_samples`.

    Returns:
      ``{task: {"grid" [lengths x depths], "lengths", "depths", "mean", "per_length",
      "examples"}}`` (``string_match_all`` scores in ``[0, 1]``).
    """
    out = {}
    for task, per_length in samples.items():
        grid = np.zeros((len(lengths), len(depths)))
        examples = []
        for li, batch in enumerate(per_length):
            for k, s in enumerate(batch):
                text = tokenizer.decode(generate_fn(tokenizer.encode(s.prompt)))
                grid[li, k // samples_per_cell] += (niah.string_match_all(text, [s.value])
                                                    / samples_per_cell)
                if len(examples) < 3 or (k == 0 and lengths[li] == max(lengths)):
                    examples.append({"length": lengths[li], "depth": s.depth,
                                     "value": s.value, "answer": text})
        out[task] = {"grid": grid.tolist(), "lengths": list(lengths), "depths": list(depths),
                     "mean": float(grid.mean()),
                     "per_length": {str(n): float(grid[i].mean())
                                    for i, n in enumerate(lengths)},
                     "examples": examples}
    return out


# ---------------------------------------------------------------------------------------------
# The report stage
# ---------------------------------------------------------------------------------------------

def _options_dict(options) -> Dict[str, Any]:
    d = options.to_dict() if hasattr(options, "to_dict") else dict(options)
    return json.loads(json.dumps(d, default=str))


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


def run_report(*, options, stage_dir: str, models: Mapping[str, Tuple[Any, Any]],
               tokenizer, meta: Mapping[str, Any], print_fn: Callable[[str], None] = print,
               should_stop: Optional[Callable[[], bool]] = None) -> Dict[str, Any]:
    """Measures every model on every measurement of ``options.measurements``.

    Args:
      options: the ``config.report`` section (see ``lattn_jax.halo.experiment.base_config``).
      stage_dir: where ``report.json`` and ``report.md`` go.
      models: ``{"teacher": (LanguageModel, description), "student": (...)}``, each model with
        ``use_segment_ids`` on (left padding in prefills).
      tokenizer: the teacher's tokenizer.
      meta: recorded as is (model descriptions, calibration, sources).
      print_fn: progress lines.
      should_stop: asked before each measurement; ``True`` ends the run early (resumable).

    Returns:
      The report dict (also in ``<stage_dir>/report.json``), with ``"complete"``.

    Raises:
      ValueError: an unknown measurement or model.
      FileNotFoundError: a missing evaluation file or essay directory.
    """
    unknown = sorted(set(options.measurements) - set(MEASUREMENTS))
    if unknown:
        raise ValueError(f"report.measurements: unknown {unknown}; choose from {MEASUREMENTS}")
    bad = sorted(set(models) - set(MODELS))
    if bad:
        raise ValueError(f"unknown models {bad}; expected {MODELS}")
    path = os.path.join(stage_dir, REPORT_JSON)
    opts = _options_dict(options)
    report = read_json(path) or {}
    if report.get("options") != opts:
        if report:
            print_fn("report options changed: measuring everything again")
        report = {"options": opts, "results": {}, "seconds": {}, "started": _now()}
    report["meta"] = dict(meta, hardware=hardware())
    decoders: Dict[str, Decoder] = {}
    cache: Dict[str, Any] = {}
    order = [m for m in MEASUREMENTS if m in options.measurements]
    complete = True
    for measurement in order:
        for name in models:
            if name in report["results"].get(measurement, {}):
                continue
            if should_stop is not None and should_stop():
                complete = False
                break
            model = models[name][0]
            t0 = time.perf_counter()
            result = _measure(measurement, name, model, tokenizer, options, decoders, cache,
                              print_fn)
            seconds = time.perf_counter() - t0
            report["results"].setdefault(measurement, {})[name] = result
            report["seconds"][f"{measurement}/{name}"] = seconds
            report["updated"] = _now()
            _write_json(path, report)
            with open(os.path.join(stage_dir, REPORT_MD), "w") as f:
                f.write(results_markdown(report))
            print_fn(f"{measurement} / {name}: {_summary(measurement, result)} ({seconds:.1f} s)")
        if not complete:
            break
    report["complete"] = complete and all(
        name in report["results"].get(m, {}) for m in order for name in models)
    _write_json(path, report)
    return report


def _measure(measurement, name, model, tokenizer, options, decoders, cache, print_fn):
    pad = tokenizer.eos_id
    if measurement in ("speed", "niah") and name not in decoders:
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
            out[task] = runner.score_task(scorer, task, docs, pairs)
        return out
    if measurement == "niah":
        lengths = tuple(options.niah_lengths)
        m = options.niah_max_new_tokens
        if "niah" not in cache:
            words = None
            if any(t not in ("niah_single_1",) for t in options.niah_tasks):
                words = niah.load_essays(os.path.join(options.data_dir, "niah",
                                                      "PaulGrahamEssays"))
            t0 = time.perf_counter()
            cache["niah"] = niah_samples(
                tokenizer, tasks=options.niah_tasks, lengths=lengths,
                depths=options.niah_depths, samples_per_cell=options.niah_samples,
                essay_words=words, max_new_tokens=m, seed=options.niah_seed)
            print_fn(f"niah: built the prompts in {time.perf_counter() - t0:.1f} s")
        padded = max(lengths) - m
        capacity = padded + max(options.speed_decode_tokens, m)
        decoder = decoders[name]

        def generate_fn(ids):
            return decoder.generate(ids, padded_len=padded, capacity=capacity,
                                    max_new_tokens=m, stop_id=tokenizer.eos_id)

        return niah_scores(generate_fn, tokenizer, cache["niah"], lengths=lengths,
                           depths=options.niah_depths, samples_per_cell=options.niah_samples)
    raise ValueError(f"unknown measurement {measurement!r}")


def _summary(measurement: str, result: Mapping[str, Any]) -> str:
    if measurement == "perplexity":
        return f"token perplexity {result['token_perplexity']:.3f}"
    if measurement == "commonsense":
        return ", ".join(f"{t} {r.get('acc_norm', r['acc']):.3f}" for t, r in result.items())
    if measurement == "niah":
        return ", ".join(f"{t} {r['per_length']}" for t, r in result.items())
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

    Args:
      report: the dict written by :func:`run_report` (any subset of its measurements).
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
    csr = res.get("commonsense", {})
    tasks = sorted({t for r in csr.values() for t in r})
    for t in tasks:
        for metric in ("acc", "acc_norm"):
            vals = [csr.get(n, {}).get(t, {}).get(metric) for n in names]
            if all(v is None for v in vals):
                continue
            n_docs = next(r[t]["n"] for r in csr.values() if t in r)
            chance = next(r[t].get(f"{metric}_chance") for r in csr.values() if t in r)
            row(f"{t} (n={n_docs}, chance {_fmt(chance, 3)})", metric,
                [_fmt(v, 3) for v in vals])
    if tasks:
        means = []
        for n in names:
            vals = [csr[n][t].get("acc_norm", csr[n][t]["acc"]) for t in tasks
                    if t in csr.get(n, {})]
            means.append(_fmt(float(np.mean(vals)), 3) if vals else "–")
        row("commonsense", "mean of acc_norm (acc where none)", means)
    nh = res.get("niah", {})
    for task in sorted({t for r in nh.values() for t in r}):
        lengths = next(r[task]["lengths"] for r in nh.values() if task in r)
        for length in lengths:
            row(task, f"string_match_all @ {length:,}",
                [_fmt(nh.get(n, {}).get(task, {}).get("per_length", {}).get(str(length)), 2)
                 for n in names])
        row(task, "mean", [_fmt(nh.get(n, {}).get(task, {}).get("mean"), 3) for n in names])
    sp = res.get("speed", {})
    for length in sorted({int(k) for r in sp.values() for k in r}):
        def get(n, *keys):
            r = sp.get(n, {}).get(str(length))
            for k in keys:
                r = None if r is None else r.get(k)
            return r

        tag = f"speed @ {length:,}"
        row(tag, "prompt tokens / cache capacity",
            [f"{get(n, 'prompt_tokens')} / {get(n, 'capacity')}" for n in names])
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
    for task in sorted({t for r in nh.values() for t in r}):
        for n in names:
            r = nh.get(n, {}).get(task)
            if r is None:
                continue
            out += (f"\n{task}, {n} (string_match_all; rows: length in tokens, columns: depth "
                    f"%)\n\n| length | " + " | ".join(f"{d:g}%" for d in r["depths"])
                    + " |\n|---:|" + "---:|" * len(r["depths"]) + "\n")
            for length, grid_row in zip(r["lengths"], r["grid"]):
                out += f"| {length:,} | " + " | ".join(f"{v:.2f}" for v in grid_row) + " |\n"
    return out


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
    if sel:
        selection = read_json(os.path.join(workdir, "select", "selection.json")) or {}
        layers = len(selection.get("csr", ()))
        per_layer = sel.get("seq_len", 0) * sel.get("batch_size", 0) * (
            sel.get("max_val_batches") or 0)
        tokens = f"{layers * per_layer:,} (eval)" if layers and not sel.get("csr_items") else "–"
        rows.append(f"| select | single-replacement sweep over {layers or '?'} layers | "
                    f"{sel.get('seq_len')} x {sel.get('batch_size')} x "
                    f"{sel.get('max_val_batches')} val batches + {sel.get('synthetic_recall')} "
                    f"recall prompts per layer | {tokens} | – | – | – | "
                    f"{_wall(workdir, 'select')} | {_complete(workdir, 'select')} |")
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
    lines += ["## Layer selection", ""]
    if sel:
        lines += [f"Kept as softmax attention (NoPE + gate in the student): "
                  f"**{sel['attention_layers']}**; CSR metric: {sel.get('csr_metric')}; "
                  f"recall: greedy `contains` on the recall items.", "",
                  "| layer | csr | recall | score |", "|---:|---:|---:|---:|"]
        for i, (c, r, s) in enumerate(zip(sel["csr"], sel["recall"], sel["scores"])):
            mark = " **(attn)**" if i in sel["attention_layers"] else ""
            lines.append(f"| {i}{mark} | {c:.4f} | {r:.3f} | {s:.3f} |")
    else:
        lines.append("No selection (attention layers set in the config, or select not run).")
    lines += ["", "## Calibration of the logit scaling base a", ""]
    if cal:
        lines += ["| a | validation CE |", "|---|---:|"]
        for a, loss in cal["losses"].items():
            lines.append(f"| {a} | {loss:.4f} |")
        lines += ["", f"Chosen: a = {cal['best']}.", ""]
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
