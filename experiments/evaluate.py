"""Evaluates a model: zero-shot tasks, needle in a haystack, perplexity.

Usage::

    python experiments/fetch_eval_data.py    # once: the data, to the default --data_dir
    python experiments/evaluate.py --checkpoint=runs/default --tasks=all \\
        --output_dir=runs/default/eval
    python experiments/evaluate.py --checkpoint=runs/default --tasks=hellaswag,piqa,niah_single_2 \\
        --limit=50 --niah_lengths=1024,2048
    python experiments/evaluate.py --checkpoint=SmolLM2-135M-Instruct.Q4_1.gguf --tasks=piqa \\
        --limit=100 --output_dir=/tmp/smollm2-eval

``--checkpoint`` is a lattn-jax training workdir, a HALO workdir (its converted student), a Hugging
Face checkpoint directory or a ``.gguf`` file (``lattn_jax.eval.restore.load_model``). ``--limit=N``
scores the first N documents of each zero-shot task, as lm-evaluation-harness ``--limit`` does;
``--sample_items=N`` scores a random subset of N drawn with ``--sample_seed`` (all of a smaller
task, with a note). Checks the model path, every requested task's data files (one error lists
all missing ones) and an existing
``results.json`` in the output directory first; nothing is scored when one is wrong. Merges the
results into ``results.json`` under ``--output_dir`` (default ``<checkpoint>/eval``; required for a
GGUF file) as each task finishes (Ctrl-C keeps the finished ones): tasks of earlier runs are kept,
re-run tasks replaced, each entry with its checkpoint ``step``; rewrites ``results.md`` (scores
with binomial standard errors beside chance, 1 / number of choices, and the scored items'
majority-answer rate, the fairer baseline on a ``--limit`` subset or with unbalanced labels) and
writes ``niah_single_<k>.png`` heatmaps. The checks and the run:
:mod:`lattn_jax.eval.driver`. Task definitions: ``lattn_jax/eval/tasks.py``, ``niah.py``,
``perplexity.py``. Nothing is downloaded here: data comes from ``--data_dir``, which
``experiments/fetch_eval_data.py`` fills (pinned, checksummed).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags, logging  # noqa: E402

from lattn_jax import config as config_lib  # noqa: E402
from lattn_jax import multihost  # noqa: E402
from lattn_jax.eval import driver, fetch, runner  # noqa: E402

_CHECKPOINT = flags.DEFINE_string(
    "checkpoint", None, "What to evaluate: a lattn-jax training workdir, a HALO workdir (its "
    "student), a Hugging Face checkpoint directory (config.json, safetensors, tokenizer.json) or "
    "a .gguf file.")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step of a training or HALO workdir "
                             "(default: the newest).")
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
                               "documents per zero-shot task, drawn with --sample_seed (all of "
                               "a task with fewer, and a line saying so).")
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
    "held out for validation; refused if their files changed since it started, per its "
    "data_fingerprint.json) and/or text files: a relative path is resolved against --data_dir, "
    "not the current directory; pass a file of your own by its absolute path. A file the run "
    "trained on (config data.paths) is flagged as a training perplexity.")
_PPL_DOCS = flags.DEFINE_integer(
    "perplexity_max_docs", None, "Score only the first N documents per perplexity file; a result "
    "that covers fewer than all goes to results.json as perplexity:<file>@<N>_docs (with "
    "documents and documents_total), never replacing the full file's entry.")
_PPL_WINDOW = flags.DEFINE_integer("perplexity_window", 2048, "Perplexity window (tokens).")
_PPL_STRIDE = flags.DEFINE_integer("perplexity_stride", 2048, "Perplexity stride (tokens).")
_CONTEXT = flags.DEFINE_integer("context", 1, "Split every sequence over this many devices "
                                "(context parallelism); the other devices split the batch.")
flags.mark_flags_as_required(["checkpoint"])


def main(argv):
    config_lib.reject_arguments(argv)  # one line, not the help text
    logging.set_verbosity(logging.WARNING)
    request = driver.EvaluateRequest(
        checkpoint=_CHECKPOINT.value, tasks=_TASKS.value, step=_STEP.value,
        data_dir=_DATA_DIR.value, output_dir=_OUTPUT_DIR.value, limit=_LIMIT.value,
        sample_items=_SAMPLE.value, sample_seed=_SAMPLE_SEED.value, max_len=_MAX_LEN.value,
        batch_size=_BATCH.value, perplexity_batch_size=_PPL_BATCH.value,
        niah_lengths=_LENGTHS.value, niah_depths=_DEPTHS.value,
        niah_samples=_NIAH_SAMPLES.value, perplexity_files=_PPL_FILES.value,
        perplexity_max_docs=_PPL_DOCS.value, perplexity_window=_PPL_WINDOW.value,
        perplexity_stride=_PPL_STRIDE.value, context=_CONTEXT.value)
    try:
        driver.evaluate(request)
    except (ValueError, OSError, ImportError) as e:  # OSError: a file unreadable (as train.py)
        if isinstance(e, ConnectionError):
            raise
        sys.exit(f"error: {e}")
    except (driver.Interrupted, KeyboardInterrupt) as e:  # Ctrl-C: one line, no traceback
        print(e if isinstance(e, driver.Interrupted) else "interrupted (not while scoring)",
              file=sys.stderr, flush=True)
        multihost.exit_now(130)  # not sys.exit: its shutdown segfaulted with XLA work in flight


if __name__ == "__main__":
    app.run(main, flags_parser=config_lib.parse_flags)
