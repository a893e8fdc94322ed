"""Evaluates a model: zero-shot tasks, needle in a haystack, perplexity.

Usage::

    python experiments/fetch_eval_data.py    # once: the data, to the default --data_dir
    python experiments/evaluate.py --checkpoint=runs/default --tasks=all \\
        --output_dir=runs/default/eval
    python experiments/evaluate.py --checkpoint=runs/default --tasks=hellaswag,piqa,niah_single_2 \\
        --limit=50 --niah_lengths=1024,2048
    python experiments/evaluate.py --checkpoint=SmolLM2-135M-Instruct.Q4_1.gguf --tasks=piqa \\
        --limit=100 --output_dir=/tmp/smollm2-eval

``--checkpoint`` is a lattn-jax training workdir, a Hugging Face checkpoint directory or a
``.gguf`` file (``lattn_jax.eval.restore.load_model``). ``--limit=N`` scores the first N documents
of each zero-shot task, as lm-evaluation-harness ``--limit`` does; ``--sample_items=N`` scores a
random subset of N drawn with ``--sample_seed``. Checks the model path, every requested task's
data files (one error lists all missing ones) and an existing ``results.json`` in the output
directory first; nothing is scored when one is wrong. Merges the results into
``results.json`` under ``--output_dir`` (default ``<checkpoint>/eval``; required for a GGUF file):
tasks of earlier runs are kept, re-run tasks replaced, each entry with its checkpoint ``step``;
rewrites ``results.md`` (scores with binomial standard errors beside chance, 1 / number of
choices, and the scored items' majority-answer rate, the fairer baseline on a ``--limit``
subset or with unbalanced labels) and writes
``niah_single_<k>.png`` heatmaps. Task definitions: ``lattn_jax/eval/tasks.py``, ``niah.py``,
``perplexity.py``. Nothing is downloaded here: data comes from ``--data_dir``, which
``experiments/fetch_eval_data.py`` fills (pinned, checksummed).
"""

import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
from absl import app, flags, logging  # noqa: E402

from lattn_jax import config as config_lib  # noqa: E402
from lattn_jax import context_parallel  # noqa: E402
from lattn_jax.eval import fetch, restore, runner  # noqa: E402

_CHECKPOINT = flags.DEFINE_string(
    "checkpoint", None, "What to evaluate: a lattn-jax training workdir, a Hugging Face checkpoint "
    "directory (config.json, safetensors, tokenizer.json) or a .gguf file.")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step of a workdir (default: the newest).")
_TASKS = flags.DEFINE_list("tasks", ["zeroshot"], f"Tasks or groups: {runner.ALL_TASKS}, "
                           f"{tuple(runner.GROUPS)}.")
_DATA_DIR = flags.DEFINE_string(
    "data_dir", fetch.DEFAULT_DATA_DIR, "Directory laid out as eval/, niah/, lm/ (written by "
    "experiments/fetch_eval_data.py; default $LATTN_DATA_DIR, else ~/.cache/lattn_jax/data).")
_OUTPUT_DIR = flags.DEFINE_string(
    "output_dir", None, "Where results go (default <checkpoint>/eval; required for a GGUF file).")
_LIMIT = flags.DEFINE_integer("limit", None, "The first N documents of every zero-shot task (as "
                              "lm-evaluation-harness --limit).")
_SAMPLE = flags.DEFINE_integer("sample_items", None, "Instead of --limit: a random subset of N "
                               "documents per zero-shot task, drawn with --sample_seed.")
_SAMPLE_SEED = flags.DEFINE_integer("sample_seed", 1234, "The seed of --sample_items.")
_MAX_LEN = flags.DEFINE_integer("max_len", 2048, "Scoring context window (tokens).")
_BATCH = flags.DEFINE_integer("batch_size", 16, "Sequences per forward pass (zero-shot, NIAH).")
_PPL_BATCH = flags.DEFINE_integer(
    "perplexity_batch_size", runner.EvalOptions.perplexity_batch_size,
    "Perplexity windows per forward pass (fp32 logits: batch x window x vocab x 4 bytes; the "
    "result does not depend on it).")
_LENGTHS = flags.DEFINE_list("niah_lengths", ["1024", "2048", "4096", "8192", "16384", "32768",
                                              "65536", "131072", "262144"], "NIAH lengths.")
_DEPTHS = flags.DEFINE_list("niah_depths", ["0", "25", "50", "75", "100"], "NIAH depths (%).")
_NIAH_SAMPLES = flags.DEFINE_integer("niah_samples", 1, "NIAH prompts per (length, depth).")
_PPL_FILES = flags.DEFINE_list(
    "perplexity_files", list(runner.EvalOptions.perplexity_files),
    f"What --tasks=perplexity scores: {runner.VALIDATION!r} (the documents the checkpoint's run "
    "held out for validation) and/or text files (relative to --data_dir or absolute); a file the "
    "run trained on (config data.paths) is flagged as a training perplexity.")
_PPL_DOCS = flags.DEFINE_integer("perplexity_max_docs", None, "Documents per perplexity file.")
_PPL_WINDOW = flags.DEFINE_integer("perplexity_window", 2048, "Perplexity window (tokens).")
_PPL_STRIDE = flags.DEFINE_integer("perplexity_stride", 2048, "Perplexity stride (tokens).")
_CONTEXT = flags.DEFINE_integer("context", 1, "Split every sequence over this many devices "
                                "(context parallelism); the other devices split the batch.")
flags.mark_flags_as_required(["checkpoint"])


def _check_kind_flags(kind, names, options):
    """Flags that do not fit an HF or GGUF model fail before anything is loaded."""
    if kind == "lattn_jax":
        return
    what = restore.model_kind_name(kind)
    if _STEP.value is not None:
        raise ValueError(f"--step applies to lattn-jax training workdirs; {_CHECKPOINT.value} is "
                         f"a {what}")
    if kind == "gguf" and _OUTPUT_DIR.value is None:
        raise ValueError(f"--output_dir is required when --checkpoint is a {what}")
    if "perplexity" in names and runner.VALIDATION in options.perplexity_files:
        raise ValueError(f"--perplexity_files={runner.VALIDATION} scores the documents a "
                         f"training run held out; a {what} has none: pass text files, e.g. "
                         "--perplexity_files=lm/wikitext-2-raw/wiki.test.raw")


def _check_flags(names):
    """Flags wrong on their own, refused before anything is loaded or scored (a bad value
    found after the restore, or an --output_dir that cannot be written after the scoring,
    cost the whole evaluation).

    Raises:
      ValueError: naming the flag and its value.
    """
    if not names:
        raise ValueError(f"--tasks={','.join(_TASKS.value)}: no task given; choose from "
                         f"{', '.join(runner.ALL_TASKS)} or a group ({', '.join(runner.GROUPS)})")
    for holder, what in ((_NIAH_SAMPLES, "NIAH prompts per (length, depth)"),
                         (_BATCH, "sequences per forward pass"), (_MAX_LEN, "tokens"),
                         (_PPL_BATCH, "windows per forward pass"), (_PPL_WINDOW, "tokens"),
                         (_PPL_STRIDE, "tokens"), (_CONTEXT, "devices")):
        if holder.value is not None and holder.value < 1:
            raise ValueError(f"--{holder.name}={holder.value}: not a positive integer ({what})")
    out = _OUTPUT_DIR.value
    if out is not None and os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"--output_dir={out} exists and is not a directory")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    logging.set_verbosity(logging.WARNING)
    out = _OUTPUT_DIR.value or os.path.join(_CHECKPOINT.value, "eval")
    try:
        names = runner.expand_tasks(_TASKS.value)
        _check_flags(names)
        runner.read_results(out)  # a damaged results.json now, not after the scoring
        lengths, depths = runner.parse_niah_grid(_LENGTHS.value, _DEPTHS.value)
        options = runner.EvalOptions(
            data_dir=_DATA_DIR.value, limit=_LIMIT.value, sample_items=_SAMPLE.value,
            seed=_SAMPLE_SEED.value, max_len=_MAX_LEN.value,
            batch_size=_BATCH.value, perplexity_batch_size=_PPL_BATCH.value,
            niah_lengths=lengths, niah_depths=depths,
            niah_samples=_NIAH_SAMPLES.value, perplexity_files=tuple(_PPL_FILES.value),
            perplexity_max_docs=_PPL_DOCS.value, perplexity_window=_PPL_WINDOW.value,
            perplexity_stride=_PPL_STRIDE.value, context=_CONTEXT.value)
        context_parallel.check_context(_CONTEXT.value)  # the devices are known: before loading
        kind = restore.model_kind(_CHECKPOINT.value)  # a bad --checkpoint is reported first
        _check_kind_flags(kind, names, options)
        runner.check_data(names, options)  # then missing data, before the (slow) restore
        restored = restore.load_model(_CHECKPOINT.value, _STEP.value)
        options = dataclasses.replace(options, training_data=restored.training_data)
        print(f"jax {jax.__version__}, devices {jax.devices()}; {_CHECKPOINT.value} "
              f"({restored.describe()}), layers {list(restored.model_config.layer_pattern)}")
        results = runner.run_evaluation(restored.model, restored.tokenizer, names, options)
    except (ValueError, FileNotFoundError, ImportError) as e:
        sys.exit(f"error: {e}")
    for r in results.values():
        r["step"] = restored.step  # merged files may hold tasks of several runs (None: HF/GGUF)
    header = f"# Evaluation of {_CHECKPOINT.value}"
    try:
        paths = runner.write_results(results, out, header)
    except ValueError as e:
        sys.exit(f"error: {e}")
    for path in paths:
        print(f"wrote {path}")
    print(runner.markdown(results, header + f" ({restored.describe()}, this run)"))


if __name__ == "__main__":
    app.run(main, flags_parser=config_lib.parse_flags)
