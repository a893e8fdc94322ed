"""The evaluation driver behind ``experiments/evaluate.py``: checks, restores, scores, writes.

:func:`evaluate` takes the binary's options (:class:`EvaluateRequest`, one field per flag) and
does what one invocation does, refusing bad input before anything slow happens: first the
flags on their own (no task, a count below 1, an ``--output_dir`` that is a file), a damaged
``results.json`` in the output directory, the NIAH grid, the context-parallel devices, the
model path and its kind (flags that do not fit a Hugging Face or GGUF model), and every
requested task's data files (:func:`lattn_jax.eval.runner.check_data`: one error lists all
missing ones) and, for the held-out ``validation`` perplexity of a training workdir, that its
data files are those the run started with (:func:`lattn_jax.train.check_held_out_data`); then
it restores the model (:func:`lattn_jax.eval.restore.load_model`), scores
the tasks (:func:`lattn_jax.eval.runner.run_evaluation`) and merges the results into
``<output_dir>/results.json`` and ``results.md`` (:func:`lattn_jax.eval.runner.write_results`),
each entry with its checkpoint ``step``, as soon as it is scored: an interrupted run
(Ctrl-C) keeps its finished tasks and ends with :class:`Interrupted`.
"""

import dataclasses
import os
from typing import Callable, Dict, List, Optional, Sequence

import jax

from lattn_jax import context_parallel
from lattn_jax import records
from lattn_jax import train as train_lib
from lattn_jax.eval import fetch, restore, runner


class Interrupted(Exception):
    """An evaluation stopped by Ctrl-C (``KeyboardInterrupt``) while scoring; its message is one
    line saying how many tasks were saved and where (``experiments/evaluate.py`` prints it and
    exits with status 130)."""


@dataclasses.dataclass(frozen=True)
class EvaluateRequest:
    """One evaluation (``experiments/evaluate.py``'s flags of the same names).

    Attributes:
      checkpoint: a lattn-jax training workdir, a HALO workdir (its converted student), a
        Hugging Face checkpoint directory or a ``.gguf`` file.
      tasks: task and group names (:data:`lattn_jax.eval.runner.ALL_TASKS`,
        :data:`~lattn_jax.eval.runner.GROUPS`).
      step: a workdir's checkpoint step (``None``: the newest).
      data_dir: the evaluation data (``experiments/fetch_eval_data.py``).
      output_dir: where results go (``None``: ``<checkpoint>/eval``; required for a GGUF file).
      limit, sample_items, sample_seed, max_len, batch_size, perplexity_batch_size,
        niah_samples, perplexity_files, perplexity_max_docs, perplexity_window,
        perplexity_stride, context: :class:`lattn_jax.eval.runner.EvalOptions`' (``limit``,
        ``sample_items``, ``seed``, ...).
      niah_lengths, niah_depths: the NIAH grid as given (strings,
        :func:`lattn_jax.eval.runner.parse_niah_grid`).
    """

    checkpoint: str
    tasks: Sequence[str] = ("zeroshot",)
    step: Optional[int] = None
    data_dir: str = fetch.DEFAULT_DATA_DIR
    output_dir: Optional[str] = None
    limit: Optional[int] = None
    sample_items: Optional[int] = None
    sample_seed: int = 1234
    max_len: int = 2048
    batch_size: int = 16
    perplexity_batch_size: int = runner.EvalOptions.perplexity_batch_size
    niah_lengths: Sequence[str] = ("1024", "2048", "4096", "8192", "16384", "32768", "65536",
                                   "131072", "262144")
    niah_depths: Sequence[str] = ("0", "25", "50", "75", "100")
    niah_samples: int = 1
    perplexity_files: Sequence[str] = runner.EvalOptions.perplexity_files
    perplexity_max_docs: Optional[int] = None
    perplexity_window: int = 2048
    perplexity_stride: int = 2048
    context: int = 1


# Flags that count something: a value below 1 is refused, naming what it counts.
_COUNTS = (("limit", "documents per zero-shot task"), ("sample_items", "items per task"),
           ("perplexity_max_docs", "documents per perplexity file"),
           ("niah_samples", "NIAH prompts per (length, depth)"),
           ("batch_size", "sequences per forward pass"), ("max_len", "tokens"),
           ("perplexity_batch_size", "windows per forward pass"), ("perplexity_window", "tokens"),
           ("perplexity_stride", "tokens"), ("context", "devices"))


def check_flags(request: EvaluateRequest, names: Sequence[str]) -> None:
    """Flags wrong on their own, refused before anything is loaded or scored (a bad value
    found after the restore, or an ``--output_dir`` that cannot be written after the scoring,
    cost the whole evaluation).

    Args:
      request: the evaluation.
      names: its tasks, expanded (:func:`lattn_jax.eval.runner.expand_tasks`).

    Raises:
      ValueError: naming the flag and its value: no task, a count below 1, a
        ``--perplexity_stride`` above ``--perplexity_window``, or an ``--output_dir`` that
        exists and is not a directory.
    """
    if not names:
        raise ValueError(f"--tasks={','.join(request.tasks)}: no task given; choose from "
                         f"{', '.join(runner.ALL_TASKS)} or a group ({', '.join(runner.GROUPS)})")
    for name, what in _COUNTS:
        value = getattr(request, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name}={value}: not a positive integer ({what})")
    if request.perplexity_stride > request.perplexity_window:  # found after the restore before
        raise ValueError(f"--perplexity_stride={request.perplexity_stride} exceeds "
                         f"--perplexity_window={request.perplexity_window}: a window scores at "
                         f"most its own tokens; give a stride <= the window")
    out = request.output_dir
    if out is not None and os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"--output_dir={out} exists and is not a directory")


def check_output_dir(out: str, flag: str) -> None:
    """Refuses an output directory that cannot be written or made, before any scoring (the
    results would otherwise be lost after it).

    Raises:
      ValueError: naming ``flag`` (``--output_dir``, or ``--checkpoint`` whose ``eval/`` is the
        default), the directory and why.
    """
    problem = records.unwritable_dir(out)
    if problem:
        raise ValueError(f"{flag}: the results directory {out} cannot be written ({problem}); "
                         f"nothing was scored")


def check_kind_flags(request: EvaluateRequest, kind: str, names: Sequence[str],
                     options: runner.EvalOptions) -> None:
    """Flags that do not fit a Hugging Face or GGUF model, refused before anything is loaded.

    Args:
      request: the evaluation.
      kind: the model kind (:func:`lattn_jax.eval.restore.model_kind`).
      names: the expanded tasks.
      options: the evaluation settings.

    Raises:
      ValueError: ``--step`` for a model that is not a training or HALO workdir, a GGUF file
        without ``--output_dir``, or the held-out validation perplexity of a model that is not
        a training workdir (a HALO workdir records no held-out documents of its own).
    """
    if kind == "lattn_jax":
        return
    what = restore.model_kind_name(kind)
    if request.step is not None and kind not in restore.STEPPED_KINDS:
        raise ValueError(f"--step applies to lattn-jax training and HALO workdirs; "
                         f"{request.checkpoint} is a {what}")
    if kind == "gguf" and request.output_dir is None:
        raise ValueError(f"--output_dir is required when --checkpoint is a {what}")
    if "perplexity" in names and runner.VALIDATION in options.perplexity_files:
        raise ValueError(f"--perplexity_files={runner.VALIDATION} scores the documents a "
                         f"training run held out; a {what} has none: pass text files, e.g. "
                         "--perplexity_files=lm/wikitext-2-raw/wiki.test.raw")


def evaluate(request: EvaluateRequest,
             print_fn: Callable[[str], None] = print) -> Dict[str, dict]:
    """One evaluation (the module docstring gives the order of the checks).

    Args:
      request: what to evaluate, on which tasks, how, and where the results go.
      print_fn: the versions and devices, the files written and the results table.

    Returns:
      ``{task: result}`` of this run (each with the checkpoint's ``step``, ``None`` for a
      Hugging Face or GGUF model), as merged into ``results.json``. Each result is merged
      into ``results.json`` and ``results.md`` (atomically) as soon as it is scored.

    Raises:
      Interrupted: a ``KeyboardInterrupt`` while scoring; the tasks finished before it are in
        ``results.json`` (the message says how many, and where).
      runner.OutOfMemoryError: (a ``ValueError``) a NIAH length or a perplexity file ran out
        of device memory: one line naming it, the flags to lower (``--batch_size`` and
        ``--niah_lengths``; ``--perplexity_batch_size``) and how many finished tasks are in
        ``results.json``, ending with XLA's first line.
      ValueError, FileNotFoundError, ImportError: bad input (a flag, the model path, its
        kind, missing data files, a damaged ``results.json``; for the ``validation``
        perplexity of a training workdir, data files changed since the run started or a
        split that was not held out: :func:`lattn_jax.train.check_held_out_data`), with one
        line naming it; nothing is scored then.
      OSError: a file that cannot be read or written (for the ``validation`` perplexity, a
        data file of the run that cannot be read: ``DataFileError``, one line naming it).
    """
    out = request.output_dir or os.path.join(request.checkpoint, "eval")
    names = runner.expand_tasks(request.tasks)
    check_flags(request, names)
    existing = runner.read_results(out)  # a damaged results.json now, not after the scoring
    lengths, depths = runner.parse_niah_grid(request.niah_lengths, request.niah_depths)
    options = runner.EvalOptions(
        data_dir=request.data_dir, limit=request.limit, sample_items=request.sample_items,
        seed=request.sample_seed, max_len=request.max_len, batch_size=request.batch_size,
        perplexity_batch_size=request.perplexity_batch_size, niah_lengths=lengths,
        niah_depths=depths, niah_samples=request.niah_samples,
        perplexity_files=tuple(request.perplexity_files),
        perplexity_max_docs=request.perplexity_max_docs,
        perplexity_window=request.perplexity_window,
        perplexity_stride=request.perplexity_stride, context=request.context)
    context_parallel.check_context(request.context)  # the devices are known: before loading
    kind = restore.model_kind(request.checkpoint)  # a bad --checkpoint is reported first
    check_kind_flags(request, kind, names, options)
    check_output_dir(out, "--output_dir" if request.output_dir else
                     "--checkpoint (its eval/ is the default --output_dir)")
    held_out = None  # the run's data config, when its validation split is scored
    if (kind == "lattn_jax" and "perplexity" in names
            and runner.VALIDATION in options.perplexity_files):
        held_out = restore.load_config(request.checkpoint).data
    # Then missing data (the run's corpus too), before the (slow) restore.
    runner.check_data(names, dataclasses.replace(options, training_data=held_out))
    if held_out is not None:
        # The run's validation split is what it held out only over the files it started with.
        train_lib.check_held_out_data(request.checkpoint, held_out, print_fn)
    restored = restore.load_model(request.checkpoint, request.step)
    options = dataclasses.replace(options, training_data=restored.training_data)
    print_fn(f"jax {jax.__version__}, devices {jax.devices()}; {request.checkpoint} "
             f"({restored.describe()}), layers {list(restored.model_config.layer_pattern)}")
    header = f"# Evaluation of {request.checkpoint}"
    saved: List[str] = []

    def save(key: str, result: dict) -> None:  # each task as it finishes, not all at the end
        result["step"] = restored.step  # merged files may hold several runs' (None: HF/GGUF)
        runner.write_results({key: result}, out, header)
        saved.append(key)

    try:
        results = runner.run_evaluation(restored.model, restored.tokenizer, names, options,
                                        on_result=save, existing=existing)
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted: {len(saved)} task(s) saved to "
                          f"{os.path.join(out, 'results.json')}"
                          + (f" ({', '.join(saved)})" if saved else "")
                          + "; rerun to score the rest") from None
    except runner.OutOfMemoryError as e:  # one line: what ran out, what to lower, what is kept
        raise runner.OutOfMemoryError(
            f"{e.advice}; {len(saved)} task(s) finished before it are saved to "
            f"{os.path.join(out, 'results.json')}"
            + (f" ({', '.join(saved)})" if saved else ""), e.xla) from None
    # Every result was written as it finished (save): name the files, do not write them again.
    paths: List[str] = runner.result_paths(results, out)
    for path in paths:
        print_fn(f"wrote {path}")
    print_fn(runner.markdown(results, header + f" ({restored.describe()}, this run)"))
    return results
