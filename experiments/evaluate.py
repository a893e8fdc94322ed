"""Evaluates a trained checkpoint: zero-shot tasks, needle in a haystack, perplexity.

Usage::

    python experiments/fetch_eval_data.py    # once: the data, to the default --data_dir
    python experiments/evaluate.py --checkpoint=runs/default --tasks=all \
        --output_dir=runs/default/eval
    python experiments/evaluate.py --checkpoint=runs/default --tasks=hellaswag,piqa,niah_single_2 \
        --limit=50 --niah_lengths=1024,2048

Checks every requested task's data files first (one error lists all missing ones; nothing is
scored). Merges the results into ``results.json`` under ``--output_dir`` (default
``<checkpoint>/eval``): tasks of earlier runs are kept, re-run tasks replaced, each entry with its
checkpoint ``step``; rewrites ``results.md`` (scores with binomial standard errors beside chance)
and writes ``niah_single_<k>.png`` heatmaps. Task definitions:
``lattn_jax/eval/tasks.py``, ``niah.py``, ``perplexity.py``. Nothing is downloaded here: data
comes from ``--data_dir``, which ``experiments/fetch_eval_data.py`` fills (pinned, checksummed).
"""

import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
from absl import app, flags, logging  # noqa: E402

from lattn_jax.eval import fetch, restore, runner  # noqa: E402

_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "Training workdir to evaluate.")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: the newest).")
_TASKS = flags.DEFINE_list("tasks", ["zeroshot"], f"Tasks or groups: {runner.ALL_TASKS}, "
                           f"{tuple(runner.GROUPS)}.")
_DATA_DIR = flags.DEFINE_string(
    "data_dir", fetch.DEFAULT_DATA_DIR, "Directory laid out as eval/, niah/, lm/ (written by "
    "experiments/fetch_eval_data.py; default $LATTN_DATA_DIR, else ~/.cache/lattn_jax/data).")
_OUTPUT_DIR = flags.DEFINE_string("output_dir", None, "Where results go (default <ckpt>/eval).")
_LIMIT = flags.DEFINE_integer("limit", None, "Documents per zero-shot task (subsample).")
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


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    logging.set_verbosity(logging.WARNING)
    try:
        names = runner.expand_tasks(_TASKS.value)
        options = runner.EvalOptions(
            data_dir=_DATA_DIR.value, limit=_LIMIT.value, max_len=_MAX_LEN.value,
            batch_size=_BATCH.value, perplexity_batch_size=_PPL_BATCH.value,
            niah_lengths=tuple(int(x) for x in _LENGTHS.value),
            niah_depths=tuple(float(x) for x in _DEPTHS.value),
            niah_samples=_NIAH_SAMPLES.value, perplexity_files=tuple(_PPL_FILES.value),
            perplexity_max_docs=_PPL_DOCS.value, perplexity_window=_PPL_WINDOW.value,
            perplexity_stride=_PPL_STRIDE.value, context=_CONTEXT.value)
        restore.load_config(_CHECKPOINT.value)  # a bad --checkpoint is reported first
        runner.check_data(names, options)  # then missing data, before the (slow) restore
        restored = restore.load(_CHECKPOINT.value, _STEP.value)
        options = dataclasses.replace(options, training_data=restored.config.data)
        print(f"jax {jax.__version__}, devices {jax.devices()}; {_CHECKPOINT.value} step "
              f"{restored.step}, layers {list(restored.config.model.layer_pattern)}")
        results = runner.run_evaluation(restored.model, restored.tokenizer, names, options)
    except (ValueError, FileNotFoundError) as e:
        sys.exit(f"error: {e}")
    out = _OUTPUT_DIR.value or os.path.join(_CHECKPOINT.value, "eval")
    for r in results.values():
        r["step"] = restored.step  # merged files may hold tasks of several runs
    header = f"# Evaluation of {_CHECKPOINT.value}"
    try:
        paths = runner.write_results(results, out, header)
    except ValueError as e:
        sys.exit(f"error: {e}")
    for path in paths:
        print(f"wrote {path}")
    print(runner.markdown(results, header + f" (step {restored.step}, this run)"))


if __name__ == "__main__":
    app.run(main)
