"""Sweeps: a grid of training runs, one (or N) at a time, resumable, each in its own directory.

A sweep config (``configs/sweeps/<name>.py``, ``get_config(arg)`` returning a ConfigDict) names
a training config and a grid; :func:`expand` turns it into :class:`Run` s, each of which is one
``experiments/train.py`` invocation::

    name          str: the sweep's name (results pages are titled with it)
    train_config  str: the training config file, relative to the repository root
    arg           ((key, value), ...): the training config's argument string, fixed part
    overrides     ((field, value), ...): ``--config.<field>=<value>`` for every run
    grid          (block, ...): the union of the blocks' runs, in this order; a block is
                  ((axis, values), ...) and yields the product of its axes' values (the last
                  axis varies fastest). An axis with a dot (``optim.learning_rate``) is a config
                  field (a ``--config.`` override); one without (``arch``) is an argument of
                  the training config's argument string.
    seed_axis     str or None: the axis holding seeds; runs that differ only in it form a group
                  (:attr:`Run.group`), whose results the report averages
    local_args    (name, ...): arguments that may differ between machines (e.g. ``corpus``, a
                  path), left out when a run directory's recorded definition is compared with
                  the grid's (:func:`conflicts`), and paths under them in its recorded
                  experiment config (:func:`config_changes`); they name paths, which must
                  exist before a run is launched (:func:`missing_local_paths`)

(``references``, ``claims`` and ``scan`` are read by :mod:`lattn_jax.sweep_report`.)

A run is named by its axis values in grid order (``arch=gdn,stack=hybrid,opt=muon,seed=42``)
and lives in ``<root>/runs/<name>/``: the trainer's own files (``metrics.jsonl``,
``console.log``, ``invocations.jsonl``, ``config.json``, ``checkpoints/``, ``loss.png``) plus
the sweep's: ``sweep_run.json`` (the run's definition and command), ``sweep_attempts.jsonl``
(one ``start`` and one ``end`` record per attempt: time, return code, who stopped it, the error
line; with ``parallel`` > 1 also the concurrency: ``parallel``, and at the end ``concurrent``,
the most runs in flight at once during it, and ``shared_s``, the seconds it shared the machine;
with ``gpus``, the ``start`` record names the attempt's GPU group, ``gpus``, and there is no
concurrency: each run was alone on its GPUs) and ``sweep.log`` (the trainer's stdout and
stderr, every attempt).

Status (:func:`run_state`), from those files alone (no checkpoint needed to tell a finished run):

* finished: ``console.log`` ends an invocation with ``final: step N``, N the run's
  ``train.total_steps`` (printed after the final evaluation and checkpoint);
* failed: the last attempt ended with the trainer's own error (exit status > 0, not 130 = Ctrl-C,
  not 143 = SIGTERM or 129 = SIGHUP: the trainer's statuses for a stop on those signals after
  a checkpoint, not stopped by the sweep); the error line is kept;
* partial: anything else that started (stopped at the deadline, on SIGTERM, SIGHUP or Ctrl-C,
  killed by a signal, or the sweep itself died mid-run); the next attempt resumes from the
  newest checkpoint through the trainer's own resume, or starts over when there is none;
* not started: no run directory.

:func:`execute` runs a list of runs in order, each as a subprocess (a crash, an OOM or a bad
option ends that run, never the sweep), skipping finished (and, unless asked, failed) runs, and
stops cleanly at a deadline: the running trainer receives SIGTERM, its preemption signal (it
finishes the step, saves a checkpoint and exits), ``stop_margin_s`` before the deadline. With
``parallel`` > 1 it keeps up to that many trainers in flight on one machine (small models leave
a GPU partly idle; :func:`parallel_env` gives each its share of the GPU's memory); with
``gpus`` (a host of several GPUs) each trainer in flight has a GPU group of its own instead
(``CUDA_VISIBLE_DEVICES``, :class:`GpuPool`), alone on it.
"""

import ast
import calendar
import collections
import contextlib
import dataclasses
import difflib
import enum
import fnmatch
import importlib.util
import itertools
import json
import math
import os
import queue
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import ml_collections
from absl import flags as absl_flags
from ml_collections.config_flags import tuple_parser

from lattn_jax import records
from lattn_jax.eval import fetch

RUNS_DIR = "runs"
RUN_RECORD = "sweep_run.json"
ATTEMPTS = "sweep_attempts.jsonl"
RUN_LOG = "sweep.log"
# Exit statuses of the trainer after a stop on Ctrl-C, SIGTERM or SIGHUP (the terminal or ssh
# session closed): in the loop after saving a checkpoint (train.stop_exit_status), a second
# Ctrl-C (KeyboardInterrupt), or a signal held back until a checkpoint write was complete
# (experiments/train.py, train.Terminated.exit_status = 128 + signal): interruptions, not
# failures of the run. (A stop at train.max_steps_per_run exits 0.)
_EXIT_INTERRUPTED = 130
_EXIT_TERMINATED = 143
_EXIT_HUNG_UP = 129
_EXIT_STOPPED = (_EXIT_INTERRUPTED, _EXIT_TERMINATED, _EXIT_HUNG_UP)
_FINAL_LINE = re.compile(r"^final: step (\d+)\b", re.MULTILINE)
_PARAMS_LINE = re.compile(r"^model: ([\d,]+) parameters", re.MULTILINE)
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b.*")


class SweepConfigError(ValueError):
    """A sweep config that cannot be expanded; the message names the bad option."""


# ------------------------------------------------------------------------------------------------
# Grid expansion and run names
# ------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Run:
    """One training run of a sweep.

    Attributes:
      name: the axis values in grid order, ``axis=value`` joined by commas; the run
        directory's name.
      values: ``((axis, value), ...)`` of the run's grid block, in axis order.
      arg: the training config's argument string (the fixed ``arg`` and the argument axes).
      overrides: ``((field, value), ...)``: the fixed overrides, then the field axes.
      group: ``name`` without the seed axis (runs that differ only in their seed share it).
      seed: the value of the seed axis, or ``None`` when the run's block has none.
    """

    name: str
    values: Tuple[Tuple[str, Any], ...]
    arg: str
    overrides: Tuple[Tuple[str, Any], ...]
    group: str
    seed: Any = None

    def value(self, axis: str, default: Any = None) -> Any:
        """This run's value of ``axis`` (``default`` when its block has no such axis)."""
        return dict(self.values).get(axis, default)


def format_value(value: Any) -> str:
    """The text of a value in run names, argument strings and ``--config.`` flags.

    Floats use the shortest text that reads back as the same float (``0.0036``, ``1e-05``);
    tuples and lists their Python literal; everything else ``str``.
    """
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (tuple, list)):
        return repr(tuple(value))
    return str(value)


def _pairs(value: Any, option: str) -> Tuple[Tuple[str, Any], ...]:
    """``((key, value), ...)`` from a config option (a tuple of pairs, or ``None``)."""
    if value is None:
        return ()
    try:
        pairs = tuple((str(k), v) for k, v in value)
    except (TypeError, ValueError):
        raise SweepConfigError(f"{option} must be a tuple of (name, value) pairs, got "
                               f"{value!r}") from None
    return pairs


def values_name(values: Sequence[Tuple[str, Any]]) -> str:
    """``((axis, value), ...)`` -> ``"axis=value,..."`` (:func:`format_value`): run and group
    names."""
    return ",".join(f"{axis}={format_value(v)}" for axis, v in values)


def expand(config: Mapping[str, Any]) -> List[Run]:
    """The runs of a sweep config, in grid order (module docstring: the config's options).

    Args:
      config: the sweep ConfigDict (or a mapping with the same keys).

    Returns:
      One :class:`Run` per grid point; blocks in order, each block's product with its last
      axis varying fastest.

    Raises:
      SweepConfigError: naming the option: a missing ``train_config`` or ``grid`` (for a
        config of another kind, a training or HALO config, naming its kind), a block or
        axis that is not a (name, values) pair, an empty axis, an axis given twice in a block,
        an argument value holding a comma (the argument string's separator) or a value
        holding ``/`` (run names are directory names), or two runs with the same name.
    """
    if not config.get("train_config"):
        from lattn_jax import config as config_lib  # noqa: PLC0415 (jax, only for the error)
        other = config_lib.describe_config_kind(config)
        kind = config_lib.config_kind(config)
        if other and kind != "sweep":
            raise SweepConfigError(
                f"--config is not a sweep config (configs/sweeps/; it has no train_config or "
                f"grid): {other}" + ("; a sweep config names one as its train_config"
                                     if kind == "training" else ""))
        raise SweepConfigError("train_config: the training config file is missing")
    fixed_arg = _pairs(config.get("arg"), "arg")
    fixed_overrides = _pairs(config.get("overrides"), "overrides")
    seed_axis = config.get("seed_axis")
    grid = config.get("grid")
    if not grid:
        raise SweepConfigError("grid: no blocks (a tuple of blocks of (axis, values) pairs)")
    runs, seen = [], {}
    for b, block in enumerate(grid):
        axes = _pairs(block, f"grid[{b}]")
        if not axes:
            raise SweepConfigError(f"grid[{b}]: a block needs at least one (axis, values) pair")
        names = [axis for axis, _ in axes]
        if len(set(names)) != len(names):
            raise SweepConfigError(f"grid[{b}]: an axis appears twice in {names}")
        for axis, values in axes:
            if not isinstance(values, (tuple, list)) or not values:
                raise SweepConfigError(f"grid[{b}] axis {axis!r}: values must be a non-empty "
                                       f"tuple, got {values!r}")
            for v in values:
                text = format_value(v)
                if "/" in text:
                    raise SweepConfigError(f"grid[{b}] axis {axis!r}: value {text!r} holds '/' "
                                           f"(run names are directory names)")
                if "." not in axis and "," in text:
                    raise SweepConfigError(f"grid[{b}] axis {axis!r}: value {text!r} holds ',', "
                                           f"the argument string's separator")
        for combo in itertools.product(*[values for _, values in axes]):
            values = tuple(zip(names, combo))
            arg = dict(fixed_arg)
            overrides = dict(fixed_overrides)
            for axis, v in values:
                (overrides if "." in axis else arg)[axis] = v
            name = values_name(values)
            if name in seen:
                raise SweepConfigError(f"grid[{b}]: run {name!r} is already in grid[{seen[name]}]")
            seen[name] = b
            group_values = [(a, v) for a, v in values if a != seed_axis]
            runs.append(Run(
                name=name, values=values,
                arg=",".join(f"{k}={format_value(v)}" for k, v in arg.items()),
                overrides=tuple(overrides.items()), group=values_name(group_values),
                seed=dict(values).get(seed_axis) if seed_axis else None))
    return runs


def parse_filter(text: str) -> List[Tuple[Optional[str], str]]:
    """``"arch=gdn,opt=mu*"`` -> ``[("arch", "gdn"), ("opt", "mu*")]``; a part without ``=`` is
    a pattern on the whole run name (``(None, pattern)``). Patterns are shell globs."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, pattern = part.partition("=")
        out.append((key.strip(), pattern.strip()) if sep else (None, part))
    return out


def matches(run: Run, conditions: Sequence[Tuple[Optional[str], str]]) -> bool:
    """Whether ``run`` meets every condition of :func:`parse_filter` (an axis the run does not
    have never matches)."""
    values = {axis: format_value(v) for axis, v in run.values}
    for key, pattern in conditions:
        if key is None:
            if not fnmatch.fnmatchcase(run.name, pattern):
                return False
        elif key not in values or not fnmatch.fnmatchcase(values[key], pattern):
            return False
    return True


def select(runs: Sequence[Run], only: Sequence[str] = ()) -> List[Run]:
    """The runs matching any of the ``only`` filters (all runs when there are none), in order.

    Raises:
      SweepConfigError: for a filter that names an axis no run has, or that matches no run (a
        typo in a value, or values that each occur but never together), naming it and the
        values its axes take.
    """
    if not only:
        return list(runs)
    axes = {axis for run in runs for axis, _ in run.values}
    filters = []
    for text in only:
        conditions = parse_filter(text)
        unknown = sorted({k for k, _ in conditions if k is not None and k not in axes})
        if unknown:
            raise SweepConfigError(f"--only={text!r}: no axis {', '.join(unknown)}; the axes are "
                                   f"{', '.join(sorted(axes))}")
        if runs and not any(matches(run, conditions) for run in runs):
            named = sorted({k for k, _ in conditions if k is not None})
            values = {k: sorted({format_value(v) for run in runs for a, v in run.values
                                 if a == k}) for k in named}
            taken = "; ".join(f"{k}: {', '.join(v)}" for k, v in values.items())
            apart = len(conditions) > 1 and all(any(matches(run, [c]) for run in runs)
                                                for c in conditions)
            raise SweepConfigError(
                f"--only={text!r} matches no run of the grid" + (f" ({taken})" if taken else "")
                + ("; each of its conditions matches some run, but no run meets them all: the "
                   "grid does not hold every combination of its values (an argument of the "
                   "sweep config may add the missing runs, e.g. seeds=; its docstring lists "
                   "them)" if apart else ""))
        filters.append(conditions)
    return [run for run in runs if any(matches(run, c) for c in filters)]


def run_dir(root: str, run: Run) -> str:
    """``<root>/runs/<run name>``."""
    return os.path.join(root, RUNS_DIR, run.name)


def command(run: Run, *, config_path: str, workdir: str, train_script: str,
            python: str = sys.executable,
            extra_overrides: Sequence[Tuple[str, Any]] = ()) -> List[str]:
    """The ``experiments/train.py`` command line of ``run``.

    Args:
      run: the run.
      config_path: the training config file.
      workdir: the run directory.
      train_script: path of ``experiments/train.py``.
      python: the interpreter.
      extra_overrides: ``(field, value)`` pairs appended after the run's own (this machine's
        settings, e.g. ``train.micro_batch_size``; not part of the run's name).

    Returns:
      ``[python, train_script, --config=<path>[:<arg>], --workdir=<dir>, --config.<f>=<v>...]``.
    """
    config = config_path + (f":{run.arg}" if run.arg else "")
    cmd = [python, train_script, f"--config={config}", f"--workdir={workdir}"]
    for field, value in tuple(run.overrides) + tuple(extra_overrides):
        cmd.append(f"--config.{field}={format_value(value)}")
    return cmd


# ------------------------------------------------------------------------------------------------
# Run directories: status and metrics
# ------------------------------------------------------------------------------------------------

@enum.unique
class Status(enum.Enum):
    """A run's status (:func:`run_state`; the module docstring gives the rules)."""

    FINISHED = "finished"
    PARTIAL = "partial"
    FAILED = "failed"
    NOT_STARTED = "not started"


@dataclasses.dataclass(frozen=True)
class RunState:
    """What a run directory says about its run (:func:`run_state`).

    Attributes:
      status: a :class:`Status`.
      step: the newest checkpoint step (0 when there is none).
      total_steps: ``train.total_steps`` of the newest trainer invocation (``None`` before the
        trainer recorded one).
      error: the error line of a failed run's last attempt, else ``None``.
      attempts: sweep attempts started so far.
    """

    status: Status
    step: int = 0
    total_steps: Optional[int] = None
    error: Optional[str] = None
    attempts: int = 0


read_jsonl = fetch.read_jsonl  # a torn last line (a killed writer) is skipped


def _read_text(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def last_config(workdir: str) -> Optional[Dict[str, Any]]:
    """The config of the newest trainer invocation (``invocations.jsonl``), else
    ``config.json``, else ``None``."""
    invocations = read_jsonl(os.path.join(workdir, "invocations.jsonl"))
    if invocations and isinstance(invocations[-1].get("config"), dict):
        return invocations[-1]["config"]
    try:
        with open(os.path.join(workdir, "config.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def checkpoint_steps(workdir: str) -> List[int]:
    """Steps of the checkpoints in ``<workdir>/checkpoints`` (orbax step directories; set-aside
    and temporary ones are not steps), ascending."""
    try:
        names = os.listdir(os.path.join(workdir, "checkpoints"))
    except FileNotFoundError:
        return []
    return sorted(int(n) for n in names if n.isdigit())


def _finished_step(workdir: str) -> Optional[int]:
    """The step of the newest ``final: step N`` line in ``console.log``, or ``None``."""
    found = _FINAL_LINE.findall(_read_text(os.path.join(workdir, "console.log")))
    return int(found[-1]) if found else None


def _attempt_failed(end: Mapping[str, Any]) -> bool:
    rc = end.get("returncode")
    return (rc is not None and rc > 0 and rc not in _EXIT_STOPPED
            and not end.get("stopped_by"))


def run_state(workdir: str) -> RunState:
    """The status of the run in ``workdir`` (module docstring: the rules).

    Args:
      workdir: a run directory (need not exist).

    Returns:
      A :class:`RunState`.
    """
    if not os.path.isdir(workdir):
        return RunState(Status.NOT_STARTED)
    attempts = read_jsonl(os.path.join(workdir, ATTEMPTS))
    starts = sum(1 for a in attempts if a.get("event") == "start")
    config = last_config(workdir)
    total = None
    if config:
        total = config.get("train", {}).get("total_steps")
    steps = checkpoint_steps(workdir)
    step = steps[-1] if steps else 0
    final = _finished_step(workdir)
    if final is not None and (total is None or final >= total):
        return RunState(Status.FINISHED, max(step, final), total, None, starts)
    if attempts and attempts[-1].get("event") == "end" and _attempt_failed(attempts[-1]):
        return RunState(Status.FAILED, step, total, attempts[-1].get("error"), starts)
    return RunState(Status.PARTIAL, step, total, None, starts)


@dataclasses.dataclass
class RunResult:
    """A run's metrics, from the files the trainer writes (:func:`collect`).

    Attributes:
      final_val_loss: validation loss at ``train.total_steps`` (nats/token; ``None`` until the
        run finished).
      best_val_loss, best_val_step: the lowest finite validation loss of any evaluation, and
        its step (``None`` if no evaluation was finite).
      nonfinite_val_evals: how many evaluations gave a NaN or inf validation loss.
      last_val_loss, last_val_step: the newest evaluation.
      final_train_loss: the last logged training loss (mean over its logging window).
      step: the newest logged step (:mod:`lattn_jax.sweep_report` puts a partial run's newest
        checkpoint step there, the step it resumes from, as :func:`run_state` gives it);
        total_steps: ``train.total_steps``.
      logged_step: ``None``, or the newest logged step when the report replaced ``step`` by
        another (the loss columns are from it).
      tokens_per_step: ``data.batch_size x data.seq_len``; tokens: ``step x tokens_per_step``.
      tokens_per_sec, mfu: medians over the logged windows (the trainer leaves each
        invocation's compilation out of its first window; the median also drops the windows
        that include an evaluation).
      params: all parameters (the trainer's ``model:`` line); non_embedding_params: without the
        token embedding and the LM head (one matrix when they are tied).
      wall_s: wall time of the sweep's attempts (trainer start-up, compilation and
        evaluations included); without attempt records, first invocation to last metric.
      concurrent: the most runs in flight at once, itself included (``execute(parallel>1)``),
        while the trainer wrote the training records that give ``tokens_per_sec`` and ``mfu``
        (:func:`throughput_concurrency`); 1: they were all measured alone. Above 1, those (and
        ``wall_s``) were measured while it shared the machine; the report marks them (the
        losses are unaffected). An attempt that shared the machine but left none of those
        records (e.g. stopped before its first logging window) does not count.
      attempts_concurrent: the most runs in flight at once during any of its attempts, whether
        or not they wrote records (:func:`estimated_run_s` compares wall times by it).
      parallel: the largest ``parallel`` setting of its attempts (1: one run at a time).
      devices: the device kinds its trainer ran on (``invocations.jsonl``: e.g.
        ``("NVIDIA H200",)``; two when a resume moved it to another kind; ``()`` unknown).
        :mod:`lattn_jax.sweep_report` puts the re-measurement's there when its throughput
        replaces the shared one, and compares tokens/s only between runs on the same kind.
      val_curve, train_curve: ``[(tokens, loss), ...]`` by step.
    """

    final_val_loss: Optional[float] = None
    best_val_loss: Optional[float] = None
    best_val_step: Optional[int] = None
    nonfinite_val_evals: int = 0
    last_val_loss: Optional[float] = None
    last_val_step: Optional[int] = None
    final_train_loss: Optional[float] = None
    step: int = 0
    logged_step: Optional[int] = None
    total_steps: Optional[int] = None
    tokens_per_step: Optional[int] = None
    tokens: Optional[int] = None
    tokens_per_sec: Optional[float] = None
    mfu: Optional[float] = None
    params: Optional[int] = None
    non_embedding_params: Optional[int] = None
    wall_s: Optional[float] = None
    concurrent: int = 1
    attempts_concurrent: int = 1
    parallel: int = 1
    devices: Tuple[str, ...] = ()
    val_curve: List[Tuple[int, float]] = dataclasses.field(default_factory=list)
    train_curve: List[Tuple[int, float]] = dataclasses.field(default_factory=list)


def _median(values: Sequence[float]) -> Optional[float]:
    return statistics.median(values) if values else None


def window_throughput(records: Sequence[Mapping[str, Any]]) -> Tuple[Optional[float],
                                                                     Optional[float]]:
    """``(tokens/s, MFU)``: the medians over the trainer's logging windows (its training
    records in ``metrics.jsonl``) that logged them; ``None`` for one that none logged. The
    report's numbers of every run (:func:`collect`) and of a re-measurement alone
    (:func:`alone_throughput`)."""
    records = list(records)
    return (_median([r["tokens_per_sec"] for r in records if r.get("tokens_per_sec")]),
            _median([r["mfu"] for r in records if r.get("mfu") is not None]))


def device_kinds(workdir: str) -> Tuple[str, ...]:
    """The device kinds (``jax.Device.device_kind``, e.g. ``"NVIDIA H200"``) that the trainer
    invocations recorded in ``<workdir>/invocations.jsonl`` ran on, sorted, each once; ``()``
    when none is recorded."""
    kinds = set()
    for record in read_jsonl(os.path.join(workdir, "invocations.jsonl")):
        devices = record.get("devices")
        if isinstance(devices, dict):
            kinds.update(str(k) for k in devices.get("kinds") or ())
    return tuple(sorted(kinds))


def collect(workdir: str) -> RunResult:
    """A run's metrics from ``metrics.jsonl``, ``console.log``, ``invocations.jsonl`` and the
    sweep's attempt records (any of them may be missing: those fields stay ``None``).

    A step logged more than once (a resume from an older checkpoint replays steps) keeps its
    newest record, as the trainer's ``loss.png`` does.

    Args:
      workdir: the run directory.

    Returns:
      A :class:`RunResult`.
    """
    out = RunResult()
    config = last_config(workdir) or {}
    train_cfg, data_cfg, model_cfg = (config.get(k, {}) for k in ("train", "data", "model"))
    out.total_steps = train_cfg.get("total_steps")
    if data_cfg.get("batch_size") and data_cfg.get("seq_len"):
        out.tokens_per_step = int(data_cfg["batch_size"]) * int(data_cfg["seq_len"])
    train, val = {}, {}
    for record in read_jsonl(os.path.join(workdir, "metrics.jsonl")):
        step = record.get("step")
        if step is None:
            continue
        if "train_loss" in record:
            train[step] = record
        if "val_loss" in record:
            val[step] = record
    per_step = out.tokens_per_step or 1
    if val:
        steps = sorted(val)
        out.val_curve = [(s * per_step, float(val[s]["val_loss"])) for s in steps]
        finite = [s for s in steps if math.isfinite(float(val[s]["val_loss"]))]
        out.nonfinite_val_evals = len(steps) - len(finite)
        if finite:
            best = min(finite, key=lambda s: float(val[s]["val_loss"]))
            out.best_val_loss, out.best_val_step = float(val[best]["val_loss"]), best
        out.last_val_loss, out.last_val_step = float(val[steps[-1]]["val_loss"]), steps[-1]
        if out.total_steps is not None and steps[-1] >= out.total_steps:
            out.final_val_loss = out.last_val_loss
    if train:
        steps = sorted(train)
        out.train_curve = [(s * per_step, float(train[s]["train_loss"])) for s in steps]
        out.final_train_loss = float(train[steps[-1]]["train_loss"])
        out.tokens_per_sec, out.mfu = window_throughput(train.values())
    out.step = max(list(train) + list(val) + [0])
    if out.tokens_per_step:
        out.tokens = out.step * out.tokens_per_step
    found = _PARAMS_LINE.findall(_read_text(os.path.join(workdir, "console.log")))
    if found:
        out.params = int(found[-1].replace(",", ""))
        vocab, width = model_cfg.get("vocab_size"), model_cfg.get("d_model")
        if vocab and width:
            embeddings = vocab * width * (1 if model_cfg.get("tie_embeddings") else 2)
            out.non_embedding_params = out.params - embeddings
    attempts = read_jsonl(os.path.join(workdir, ATTEMPTS))
    out.concurrent = throughput_concurrency(attempts, [
        r for r in train.values() if r.get("tokens_per_sec") or r.get("mfu") is not None])
    out.attempts_concurrent = _run_concurrency(attempts)
    out.parallel = max([int(a.get("parallel") or 1) for a in attempts] + [1])
    out.devices = device_kinds(workdir)
    ends = [a for a in attempts if a.get("event") == "end"]
    if ends:
        out.wall_s = sum(float(a.get("wall_s", 0.0)) for a in ends)
    else:
        invocations = read_jsonl(os.path.join(workdir, "invocations.jsonl"))
        times = [r["time"] for r in list(train.values()) + list(val.values()) if "time" in r]
        if invocations and times:
            start = calendar.timegm(time.strptime(invocations[0]["time"], "%Y-%m-%dT%H:%M:%SZ"))
            out.wall_s = max(times) - start
    return out


def error_line(lines: Sequence[str]) -> Optional[str]:
    """The line that says why a trainer stopped, from the end of its output.

    The newest ``error: ...`` line (the trainer's one-line errors), else the newest
    ``SomethingError: ...`` line (an uncaught exception's last traceback line), else the last
    non-empty line; ``None`` for no output.
    """
    stripped = [line.strip() for line in lines if line.strip()]
    for line in reversed(stripped):
        if line.startswith("error: "):
            return line
    for line in reversed(stripped):
        if _EXCEPTION_LINE.match(line):
            return line
    return stripped[-1] if stripped else None


# ------------------------------------------------------------------------------------------------
# Execution
# ------------------------------------------------------------------------------------------------

def _append_jsonl(path: str, record: Mapping[str, Any]) -> None:
    records.append_record(path, record)


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _has_trainer_records(workdir: str) -> bool:
    return any(os.path.exists(os.path.join(workdir, n))
               for n in ("metrics.jsonl", "console.log", "invocations.jsonl"))


# Seconds a trainer gets to stop on its own Ctrl-C (the terminal sends SIGINT to the whole
# process group: it saves a checkpoint and exits) before the sweep's SIGTERM (:func:`launch`).
INTERRUPT_GRACE_S = 60.0


class StopEvent(threading.Event):
    """``execute``'s ``stop`` that remembers the signal that set it (:meth:`set_by`): after a
    SIGINT, :func:`launch` gives the trainer ``interrupt_grace_s`` to exit on its own Ctrl-C
    before it sends SIGTERM; after another signal (or a plain ``set``) it sends SIGTERM at
    once. It counts the Ctrl-Cs (``interrupts``): after a second one :func:`launch` stops the
    trainer at once, without saving, as a second Ctrl-C stops a trainer run alone (the
    trainer's own two may have merged into one: Python runs a signal's handler once for the
    signals that came while the main thread was in a step)."""

    def __init__(self):
        super().__init__()
        self.signum: Optional[int] = None
        self.interrupts = 0

    def set_by(self, signum: int) -> None:
        """Records ``signum`` (a SIGINT counted in ``interrupts``) and sets the event."""
        self.signum = signum
        if signum == signal.SIGINT:
            self.interrupts += 1
        self.set()


@dataclasses.dataclass(frozen=True)
class Attempt:
    """One trainer subprocess of a run (:func:`launch`).

    Attributes:
      returncode: the trainer's exit status (negative: killed by that signal).
      wall_s: seconds from start to exit.
      stopped_by: ``"deadline"`` or ``"interrupt"`` when the sweep sent the trainer SIGTERM
        (``"interrupt"`` also when, after a Ctrl-C, it exited on its own SIGINT within the
        grace period), else ``None``.
      error: :func:`error_line` of its output when it exited non-zero, else ``None``.
      parallel: the sweep's ``parallel`` setting when above 1 (several runs may share the
        machine), else ``None`` (one run at a time: not recorded, as before it existed).
      concurrent: with ``parallel``, the most runs in flight at once during the attempt, this
        one included (1: it ran alone throughout), else ``None``.
      shared_s: with ``parallel``, the seconds of the attempt during which at least one other
        run was in flight, else ``None``.
    """

    returncode: int
    wall_s: float
    stopped_by: Optional[str]
    error: Optional[str]
    parallel: Optional[int] = None
    concurrent: Optional[int] = None
    shared_s: Optional[float] = None


def _describe_exit(attempt: Attempt) -> str:
    """How a trainer's exit reads in the sweep's line for the run: ``"stopped at the
    deadline"`` (or ``"stopped at the sweep's interrupt"``, after the sweep's own Ctrl-C or
    SIGTERM) when the sweep's own SIGTERM stopped it (exit status 143, or killed by that
    SIGTERM; or, at the interrupt, 130: it stopped on its own Ctrl-C), rather than an
    ``"exit 143"`` that reads as a failure; otherwise ``"exit <status>"`` (negative: killed by
    that signal), with ``"after the deadline's SIGTERM"`` (``"after the SIGTERM of the sweep's
    interrupt"``) added when the trainer ended otherwise after it (killed after the grace
    period, or its own error)."""
    rc = attempt.returncode
    if attempt.stopped_by in ("deadline", "interrupt"):
        deadline = attempt.stopped_by == "deadline"
        own_ctrl_c = rc == _EXIT_INTERRUPTED and not deadline
        if rc in (_EXIT_TERMINATED, -signal.SIGTERM) or own_ctrl_c:
            return "stopped at the deadline" if deadline else "stopped at the sweep's interrupt"
        if rc != 0:
            return (f"exit {rc} after the deadline's SIGTERM" if deadline else
                    f"exit {rc} after the SIGTERM of the sweep's interrupt")
    return f"exit {rc}"


# Attempt fields written to the ``end`` record only when set (``parallel`` > 1), so that the
# records of one run at a time stay exactly as they were before ``parallel`` existed.
_CONCURRENCY_FIELDS = ("parallel", "concurrent", "shared_s")

# The environment variables that decide how much GPU memory a JAX process takes at start-up
# (jaxlib's ``generate_pjrt_gpu_plugin_options``): by default it preallocates 75% of the GPU.
MEM_FRACTION_ENV = "XLA_PYTHON_CLIENT_MEM_FRACTION"
_MEM_FRACTION_ENVS = (MEM_FRACTION_ENV, "XLA_CLIENT_MEM_FRACTION")  # the second: jaxlib's new name
_PREALLOCATE_ENV = "XLA_PYTHON_CLIENT_PREALLOCATE"
_ALLOCATOR_ENV = "XLA_PYTHON_CLIENT_ALLOCATOR"
# The share of GPU memory that ``parallel`` trainers take together (the rest: the CUDA
# context of each process, cuDNN / cuBLAS workspaces).
GPU_MEMORY_SHARE = 0.9


def memory_fraction(parallel: int) -> str:
    """The ``XLA_PYTHON_CLIENT_MEM_FRACTION`` of each of ``parallel`` trainers sharing a GPU:
    :data:`GPU_MEMORY_SHARE` / ``parallel``, rounded down to 3 decimals (``"0.45"`` for 2,
    ``"0.3"`` for 3, ``"0.225"`` for 4).

    Raises:
      ValueError: if ``parallel`` < 1.
    """
    if parallel < 1:
        raise ValueError(f"parallel={parallel}: must be at least 1")
    return format(math.floor(GPU_MEMORY_SHARE / parallel * 1000) / 1000, "g")


def parallel_env(env: Optional[Mapping[str, str]], parallel: int) -> Optional[Dict[str, str]]:
    """The trainers' environment when ``parallel`` of them share one machine.

    JAX preallocates 75% of a GPU's memory in each process, so a second trainer on the same
    GPU would run out of memory at start-up. For ``parallel`` > 1 each trainer gets
    ``XLA_PYTHON_CLIENT_MEM_FRACTION`` = :func:`memory_fraction` (0.45 each for 2), unless the
    environment already decides the memory itself: it sets ``XLA_PYTHON_CLIENT_MEM_FRACTION``
    or jaxlib's newer ``XLA_CLIENT_MEM_FRACTION`` (setting both is an error in jaxlib),
    ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` (or ``False``, ``0``: no pool, memory on demand)
    or ``XLA_PYTHON_CLIENT_ALLOCATOR=platform`` (no pool either); then it is left as it is.
    CPU runs ignore these variables.

    Args:
      env: the trainers' environment (``None``: this process's, ``os.environ``).
      parallel: trainers at once (>= 1).

    Returns:
      ``env`` itself for ``parallel`` == 1 (nothing changes), else a new dict.

    Raises:
      ValueError: if ``parallel`` < 1.
    """
    fraction = memory_fraction(parallel)
    if parallel == 1:
        return None if env is None else env
    out = dict(os.environ if env is None else env)
    if (any(out.get(name) for name in _MEM_FRACTION_ENVS)
            or out.get(_PREALLOCATE_ENV, "") in ("false", "False", "0")
            or out.get(_ALLOCATOR_ENV, "").lower() == "platform"):
        return out
    out[MEM_FRACTION_ENV] = fraction
    return out


class Concurrency:
    """Which runs are in flight at once, for the attempt records of ``execute(parallel>1)``.

    Thread-safe: :func:`launch` calls :meth:`enter` when its trainer starts and :meth:`leave`
    when it exits, from the threads that run the trainers.

    Attributes:
      parallel: the sweep's setting (trainers at once, >= 1).
    """

    def __init__(self, parallel: int):
        self.parallel = parallel
        self._lock = threading.Lock()
        self._next = 0
        self._active: Dict[int, List[float]] = {}  # token -> [start time, most in flight]
        self._done: List[Tuple[float, float]] = []  # (start, end) of attempts that ended

    def in_flight(self) -> int:
        """Trainers running now."""
        with self._lock:
            return len(self._active)

    def enter(self, t0: float) -> int:
        """Records a trainer started at ``t0`` (``time.time()``); returns its token."""
        with self._lock:
            token = self._next
            self._next += 1
            self._active[token] = [t0, 0]
            n = len(self._active)
            for entry in self._active.values():
                entry[1] = max(entry[1], n)
            return token

    def leave(self, token: int, t1: float) -> Tuple[int, float]:
        """Records that the trainer of ``token`` exited at ``t1``.

        Returns:
          ``(most runs in flight at once during it, itself included; seconds during which at
          least one other run was in flight)``.
        """
        with self._lock:
            t0, most = self._active.pop(token)
            others = self._done + [(s, t1) for s, _ in self._active.values()]
            self._done.append((t0, t1))
        spans = sorted((max(s, t0), min(e, t1)) for s, e in others if min(e, t1) > max(s, t0))
        shared, end = 0.0, t0
        for s, e in spans:  # the length of their union
            if e > end:
                shared += e - max(s, end)
                end = e
        return most, shared


CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"


def check_gpus(gpus: Sequence[str], parallel: int) -> List[str]:
    """``execute``'s ``gpus`` checked: a non-empty list of non-empty ``CUDA_VISIBLE_DEVICES``
    values, at least ``parallel`` of them.

    Raises:
      ValueError: naming what is wrong.
    """
    groups = [] if isinstance(gpus, str) else list(gpus)  # ("0,1": one group or two?)
    if not groups or not all(isinstance(g, str) and g.strip() for g in groups):
        raise ValueError(f"gpus={gpus!r}: expected a non-empty list of GPU groups, each a "
                         f"CUDA_VISIBLE_DEVICES value (e.g. ['0', '1'] or ['0,1', '2,3'])")
    if len(set(groups)) < len(groups):
        raise ValueError(f"gpus={gpus!r}: a GPU group appears twice")
    if parallel > len(groups):
        raise ValueError(f"parallel={parallel} is above the {len(groups)} GPU group(s) of "
                         f"gpus={groups!r}: each run in flight needs a group of its own")
    return groups


class GpuPool:
    """The free GPU groups of ``execute(gpus=...)``: each trainer in flight holds one.

    Thread-safe: :meth:`take` (the sweep's thread, at a launch) gives the first free group in
    the order given, waiting for one if none is free; :meth:`give` (the trainer's thread, when
    it exits) returns it.
    """

    def __init__(self, groups: Sequence[str]):
        self.groups = list(groups)
        self._free = list(groups)
        self._cond = threading.Condition()

    def take(self) -> str:
        """The first free group, now taken (waits until one is free)."""
        with self._cond:
            while not self._free:
                self._cond.wait(timeout=0.5)
            return self._free.pop(0)

    def reserve(self, group: str) -> bool:
        """Takes ``group`` out of the free ones if it is one of them (a trainer this call did
        not start runs on it); ``True`` if it was. :meth:`give` returns it."""
        with self._cond:
            if group in self._free:
                self._free.remove(group)
                return True
            return False

    def give(self, group: str) -> None:
        """Returns ``group`` (taken or reserved before) to the pool."""
        with self._cond:
            self._free.append(group)
            self._free.sort(key=self.groups.index)
            self._cond.notify()


def launch(cmd: Sequence[str], workdir: str, *, cwd: str, env: Optional[Mapping[str, str]] = None,
           deadline: Optional[float] = None, stop_margin_s: float = 30.0,
           stop: Optional[threading.Event] = None, print_fn: Callable[[str], None] = print,
           prefix: str = "", concurrency: Optional[Concurrency] = None,
           gpus: Optional[str] = None, interrupt_grace_s: float = INTERRUPT_GRACE_S) -> Attempt:
    """Runs one trainer subprocess, recording the attempt in ``workdir``.

    Its stdout and stderr go to ``<workdir>/sweep.log`` and, each line behind ``prefix``, to
    ``print_fn``. At ``deadline - stop_margin_s`` (``deadline`` a ``time.time()`` value), or
    when ``stop`` is set, the trainer receives SIGTERM (it saves a checkpoint after the current
    step and exits); if it is still running ``stop_margin_s`` later it is killed. A ``stop``
    set by SIGINT (:class:`StopEvent`: Ctrl-C, which the trainer gets too) sends the SIGTERM
    only if the trainer is still running ``interrupt_grace_s`` later: one on top of its own
    stop killed it as it exited after saving (``killed by SIGTERM``). A second Ctrl-C
    (``stop.interrupts >= 2``) sends the trainer SIGINT at every poll (0.5 s) until it exits:
    the trainer's second Ctrl-C, which stops it at once without saving (once a checkpoint
    being written is complete), even when the terminal's two reached it as one; it is killed
    if still running ``stop_margin_s`` later.

    Args:
      cmd: the command line.
      workdir: the run directory (made if missing).
      cwd: the trainer's working directory.
      env: its environment (default: this process's).
      deadline: see above; ``None``: no deadline.
      stop_margin_s: seconds before the deadline at which SIGTERM is sent, and the grace period
        before SIGKILL.
      stop: an event another thread (a signal handler) sets to stop the run early.
      print_fn: where the trainer's lines are echoed.
      prefix: put before each echoed line.
      concurrency: the runs in flight (``execute(parallel>1)``): the ``start`` record then
        holds ``parallel``, and the attempt's ``parallel``, ``concurrent`` and ``shared_s``
        are set and recorded; ``None`` (one run at a time): neither.
      gpus: the trainer's GPU group (``execute(gpus=...)``): it runs with
        ``CUDA_VISIBLE_DEVICES=<gpus>`` added to ``env`` (replacing any there), and the
        ``start`` record holds ``"gpus": "<gpus>"``; ``None``: neither.
      interrupt_grace_s: see above (:data:`INTERRUPT_GRACE_S`).

    Returns:
      An :class:`Attempt`, also appended as the ``end`` record of ``sweep_attempts.jsonl``.

    Raises:
      OSError: if the command cannot be started (no such interpreter or script).
    """
    os.makedirs(workdir, exist_ok=True)
    attempts_path = os.path.join(workdir, ATTEMPTS)
    t0 = time.time()
    start = {"event": "start", "time": _utc(t0), "command": list(cmd)}
    if concurrency is not None:  # (and its exact start: which records it wrote, _shared_spans)
        start.update(parallel=concurrency.parallel, t0=t0)
    if gpus is not None:
        start["gpus"] = gpus
        env = {**(os.environ if env is None else env), CUDA_VISIBLE_DEVICES: gpus}
    _append_jsonl(attempts_path, start)
    tail = collections.deque(maxlen=200)
    with open(os.path.join(workdir, RUN_LOG), "a") as log:
        log.write(f"==== {_utc(t0)}  {' '.join(cmd)}\n")
        log.flush()
        proc = subprocess.Popen(list(cmd), cwd=cwd, env=None if env is None else dict(env),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace", bufsize=1)
        token = None if concurrency is None else concurrency.enter(t0)

        def pump():
            for line in proc.stdout:
                log.write(line)
                log.flush()
                tail.append(line)
                print_fn(prefix + line.rstrip("\n"))

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        stopped_by, signalled_at, interrupted_at = None, None, None
        forwarding = False  # after a second Ctrl-C: SIGINT to the trainer until it exits
        sent = "SIGTERM"  # what signalled_at's signal was, for the kill's line
        while True:
            try:
                proc.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                pass
            now = time.time()
            if not forwarding and getattr(stop, "interrupts", 0) >= 2:
                forwarding, stopped_by = True, "interrupt"
                print_fn(f"{prefix}sweep: second Ctrl-C; Ctrl-C to the trainer until it exits "
                         f"(it stops at once, without saving)")
                if signalled_at is None:
                    signalled_at, sent = now, "the second Ctrl-C"
            if signalled_at is None:
                if stop is not None and stop.is_set():
                    stopped_by = "interrupt"
                    if getattr(stop, "signum", None) == signal.SIGINT:
                        if interrupted_at is None:  # the trainer got the Ctrl-C too
                            interrupted_at = now
                            print_fn(f"{prefix}sweep: Ctrl-C; waiting up to "
                                     f"{interrupt_grace_s:g} s for the trainer to save and exit")
                        if now - interrupted_at < interrupt_grace_s:
                            continue
                elif deadline is not None and now >= deadline - stop_margin_s:
                    stopped_by = "deadline"
                if stopped_by:
                    print_fn(f"{prefix}sweep: {stopped_by}; SIGTERM to the trainer (it saves a "
                             f"checkpoint and exits)")
                    proc.send_signal(signal.SIGTERM)
                    signalled_at = now
            elif now - signalled_at > stop_margin_s:
                print_fn(f"{prefix}sweep: the trainer did not exit {stop_margin_s:g} s after "
                         f"{sent}; killed")
                proc.kill()
                signalled_at = float("inf")
            elif forwarding:
                proc.send_signal(signal.SIGINT)
        t1 = time.time()
        shared = None if token is None else concurrency.leave(token, t1)
        reader.join(timeout=10)
    wall = time.time() - t0
    rc = proc.returncode
    error = None
    if rc != 0:
        error = error_line(list(tail))
        if rc < 0:
            name = signal.Signals(-rc).name if -rc in signal.valid_signals() else str(-rc)
            error = f"killed by {name}" + (f" (last line: {error})" if error else "")
    attempt = Attempt(returncode=rc, wall_s=wall, stopped_by=stopped_by, error=error)
    if shared is not None:
        attempt = dataclasses.replace(attempt, parallel=concurrency.parallel,
                                      concurrent=shared[0], shared_s=round(shared[1], 3))
    record = {k: v for k, v in dataclasses.asdict(attempt).items()
              if k not in _CONCURRENCY_FIELDS or v is not None}
    if shared is not None:  # its exact span: the records written during it (_shared_spans)
        record.update(t0=t0, t1=t1)
    _append_jsonl(attempts_path, {"event": "end", "time": _utc(time.time()), **record})
    return attempt


@dataclasses.dataclass
class ExecutionSummary:
    """What one :func:`execute` call did.

    Attributes:
      status: ``"complete"`` (every selected run is finished or failed), ``"deadline"``,
        ``"interrupted"`` or ``"max_runs"`` (stopped before the rest), or ``"incomplete"``
        (every run was tried, and some trainer stopped early by itself, e.g. at
        ``train.max_steps_per_run``).
      launched: names of the runs started or resumed, in order.
      skipped: ``{name: reason}`` of the runs left alone (finished, failed before).
      reused: ``{name: source run directory}`` of the runs whose records were copied from an
        identical finished run of another sweep (``reuse_from``; not run again).
    """

    status: str = "complete"
    launched: List[str] = dataclasses.field(default_factory=list)
    skipped: Dict[str, str] = dataclasses.field(default_factory=dict)
    reused: Dict[str, str] = dataclasses.field(default_factory=dict)


def execute(runs: Sequence[Run], root: str, *, config_path: str, train_script: str, cwd: str,
            python: str = sys.executable, extra_overrides: Sequence[Tuple[str, Any]] = (),
            env: Optional[Mapping[str, str]] = None, deadline: Optional[float] = None,
            min_run_s: float = 0.0, stop_margin_s: float = 30.0, max_runs: Optional[int] = None,
            retry_failed: bool = False, stop: Optional[threading.Event] = None,
            print_fn: Callable[[str], None] = print,
            after_run: Optional[Callable[[Run, Attempt], None]] = None,
            reuse_from: Sequence[str] = (),
            finish_by_deadline: bool = False, parallel: int = 1,
            gpus: Optional[Sequence[str]] = None) -> ExecutionSummary:
    """Runs ``runs`` in order, up to ``parallel`` trainer subprocesses at a time, resumably.

    Finished runs are skipped; failed ones too unless ``retry_failed``; a partial one resumes
    (the trainer restores its newest checkpoint). A run directory with trainer records but no
    checkpoint (a run stopped before its first save) is renamed ``<name>.restarted-<time>``
    (kept) and the run starts over in a clean one. No run starts after ``stop`` is set, after
    ``max_runs`` launches, or with less than ``min_run_s`` seconds left before its SIGTERM
    (``stop_margin_s`` before ``deadline``);
    a running one is stopped as :func:`launch` says.

    With ``parallel`` > 1 the runs still start in their order: the next one when a trainer
    exits and a slot is free, each check above made at that moment. Trainers this call did not
    start that hold some of ``runs`` (:func:`foreign_trainers`: a killed call's, left running)
    take slots too, and their GPU groups with ``gpus``, until they end (checked every
    :data:`FOREIGN_POLL_S` s while a launch waits for them; with ``parallel`` 1 a launch waits
    until they have ended). Every trainer in flight gets SIGTERM at ``deadline -
    stop_margin_s`` or when ``stop`` is set; a failed run ends only itself. The trainers get
    :func:`parallel_env` (each its share of the GPU's memory), their attempt records the
    concurrency (:class:`Attempt`), and the progress lines
    ``print_fn`` gets are whole lines (the trainers' own behind ``[<run name>] ``; the full
    output of each run stays in its ``sweep.log``). After a trainer stopped at the deadline or
    by ``stop``, no run starts (the others in flight stop the same way). ``after_run`` is
    called from this (the calling) thread, one run at a time.

    With ``gpus`` (a host of several GPUs) each trainer takes a free GPU group of ``gpus``
    at its launch (:class:`GpuPool`, the first free one in their order) and runs alone on
    it, with ``CUDA_VISIBLE_DEVICES=<group>`` (:func:`launch`); the group is free again when
    the trainer exits, before its run is reported ended. No memory fraction
    (:func:`parallel_env`) and no concurrency is recorded: the attempt's ``start`` record
    names its group (``gpus``) and has no ``parallel``, its ``end`` record no ``concurrent``
    or ``shared_s``, so the results compare its tokens/s as measured alone.

    Args:
      runs: the runs (:func:`expand`, :func:`select`).
      root: the sweep directory (runs go to ``<root>/runs/<name>``).
      config_path, train_script, python, extra_overrides: :func:`command`'s.
      cwd: the trainers' working directory (the repository root).
      env: the trainers' environment.
      deadline: ``time.time()`` by which the call must end; ``None``: none.
      min_run_s: do not start a run that would train for less than this: the time left
        before the deadline minus ``stop_margin_s`` (when the trainer gets its SIGTERM).
      stop_margin_s: :func:`launch`'s.
      max_runs: start at most this many runs; ``None``: no limit.
      retry_failed: run failed runs again (resuming from their checkpoints).
      stop: set by a signal handler to end the sweep after the current runs' checkpoints.
      print_fn: progress lines.
      after_run: called after every launched run (e.g. to rewrite the results).
      reuse_from: other sweeps' roots: a run not started here whose training is identical to
        a finished run there (:func:`identical_finished_run`) gets that run's records
        (:func:`reuse_records`) instead of a launch, e.g. Table 7's host runs from Table 2's
        GDN hybrid + Muon runs.
      finish_by_deadline: also launch or resume no run that :func:`estimated_run_s` says
        would not finish ``stop_margin_s`` before ``deadline`` (for the last call on a machine,
        where a run cut at the deadline is lost; without an estimate, only ``min_run_s``
        applies). With ``parallel`` > 1 the estimate is for the number of runs that will
        share the machine with it: ``min(parallel, runs in flight + 1 + runs still to
        launch after it)``; with ``gpus``, for the run alone.
      parallel: trainer subprocesses at once on this machine (>= 1; 1: one after another,
        exactly as before this option existed: the same commands, environment and records);
        with ``gpus``, at most ``len(gpus)``.
      gpus: GPU groups, each a ``CUDA_VISIBLE_DEVICES`` value (``["0", "1"]``,
        ``["0,1", "2,3"]``): one per trainer in flight (above); ``None``: the trainers share
        the machine's devices as described above.

    Returns:
      An :class:`ExecutionSummary`.

    Raises:
      ValueError: if ``parallel`` < 1, or above ``len(gpus)`` (:func:`check_gpus`).
      OSError: if a trainer cannot be started (after the runs in flight have ended).
    """
    if parallel < 1:
        raise ValueError(f"parallel={parallel}: must be at least 1 (trainers at once)")
    pool = None if gpus is None else GpuPool(check_gpus(gpus, parallel))
    summary = ExecutionSummary()
    summary.reused = reuse_identical_runs(runs, root, config_path=config_path,
                                          train_script=train_script, python=python,
                                          extra_overrides=extra_overrides, roots=reuse_from,
                                          print_fn=print_fn)
    # Each run alone on its GPU group (pool): neither a memory share nor a concurrency.
    concurrency = Concurrency(parallel) if parallel > 1 and pool is None else None
    trainer_env = parallel_env(env, parallel) if pool is None else env
    if parallel > 1:
        print_fn = _whole_lines(print_fn)
    # Trainers this call did not start (a killed call's, still running) hold some of the runs:
    # they count against `parallel` and keep their GPU groups until they end.
    foreign = foreign_trainers(runs, root)
    reserved = {name: group for name, (_, group) in foreign.items()
                if pool is not None and group is not None and pool.reserve(group)}
    if foreign:
        print_fn(f"--- {len(foreign)} run(s) held by a trainer this call did not start (pid "
                 f"{', '.join(pid for pid, _ in foreign.values())}): counted against "
                 f"--parallel={parallel} while they run"
                 + (f", their GPU group(s) {', '.join(reserved.values())} kept"
                    if reserved else ""))

    foreign_dirs = {run.name: run_dir(root, run) for run in runs if run.name in foreign}

    def foreign_running() -> int:
        """How many of ``foreign`` still run (those that ended are dropped, groups given back)."""
        for name in list(foreign):
            if trainer_lock_owner(foreign_dirs[name]) is None:
                del foreign[name]
                if name in reserved:
                    pool.give(reserved.pop(name))
        return len(foreign)

    ended: "queue.Queue[Tuple[Run, str, Any]]" = queue.Queue()
    in_flight: Dict[str, threading.Thread] = {}
    halt: List[str] = []  # why no further run starts ("deadline", "interrupted")
    errors: List[BaseException] = []

    def run_trainer(run: Run, cmd: List[str], workdir: str, group: Optional[str]) -> None:
        try:
            attempt = launch(cmd, workdir, cwd=cwd, env=trainer_env, deadline=deadline,
                             stop_margin_s=stop_margin_s, stop=stop, print_fn=print_fn,
                             prefix=f"[{run.name}] ", concurrency=concurrency, gpus=group)
        except BaseException as e:  # noqa: BLE001 - raised again in the calling thread
            result = e
        else:
            result = attempt
        if group is not None:  # free before the run is reported ended (and a slot frees)
            pool.give(group)
        ended.put((run, workdir, result))

    def collect_ended(block: bool, wait_s: Optional[float] = None) -> None:
        """Handles the trainers that have exited; ``block``: wait for one first (at most
        ``wait_s`` seconds, ``None``: until one exits)."""
        until = None if wait_s is None else time.monotonic() + wait_s
        while True:
            try:
                run, workdir, attempt = ended.get(timeout=0.5) if block else ended.get_nowait()
            except queue.Empty:
                if block and (until is None or time.monotonic() < until):
                    continue  # (signal handlers run in this thread between the waits)
                return
            block = False
            in_flight.pop(run.name).join()
            if isinstance(attempt, BaseException):
                errors.append(attempt)
                halt.append("error")
                continue
            after = run_state(workdir)
            tail = f": {attempt.error}" if attempt.error else ""
            print_fn(f"--- {run.name}: {after.status.value} after {attempt.wall_s:.0f} s "
                     f"({_describe_exit(attempt)}){tail}")
            if after_run is not None:
                after_run(run, attempt)
            if attempt.stopped_by == "deadline":
                halt.append("deadline")
            elif attempt.stopped_by == "interrupt" or (stop is not None and stop.is_set()):
                halt.append("interrupted")

    def to_launch(run: Run) -> bool:
        if run.name in summary.reused:
            return False
        status = run_state(run_dir(root, run)).status
        return status != Status.FINISHED and (retry_failed or status != Status.FAILED)

    for i, run in enumerate(runs):
        while len(in_flight) >= parallel:
            collect_ended(block=True)
        collect_ended(block=False)
        if halt:
            summary.status = halt[0]
            break
        workdir = run_dir(root, run)
        state = run_state(workdir)
        if run.name in summary.reused:
            if after_run is not None:
                after_run(run, Attempt(returncode=0, wall_s=0.0, stopped_by=None, error=None))
            continue
        if state.status == Status.FINISHED:
            summary.skipped[run.name] = "finished"
            print_fn(f"--- {run.name}: finished, skipped")
            continue
        if state.status == Status.FAILED and not retry_failed:
            summary.skipped[run.name] = f"failed: {state.error}"
            print_fn(f"--- {run.name}: failed before ({state.error}); skipped "
                     f"(--retry_failed runs it again)")
            continue
        owner = trainer_lock_owner(workdir)
        if owner is not None:  # e.g. a trainer left running by a killed sweep: never touched
            summary.skipped[run.name] = f"in use by a trainer (pid {owner})"
            print_fn(f"--- {run.name}: its workdir is in use by a trainer this call did not "
                     f"start (pid {owner}; {os.path.join(workdir, TRAINER_LOCK)}); not "
                     f"launched, nothing moved: run the sweep again once it has ended")
            continue
        where = ("not started" if state.status == Status.NOT_STARTED else
                 f"{state.status.value} at step {state.step}/{state.total_steps or '?'}")
        waited = False
        while (len(in_flight) + foreign_running() >= parallel and not halt
               and _launch_held(stop, max_runs, len(summary.launched), deadline,
                                stop_margin_s, min_run_s) is None):
            if not waited:
                print_fn(f"--- {run.name}: {where}; waiting for a slot: "
                         f"{len(foreign)} trainer(s) this call did not start still run")
                waited = True
            if in_flight:
                collect_ended(block=True, wait_s=FOREIGN_POLL_S)
            else:
                time.sleep(FOREIGN_POLL_S)
        if halt:
            summary.status = halt[0]
            break
        held = _launch_held(stop, max_runs, len(summary.launched), deadline, stop_margin_s,
                            min_run_s)
        if held is not None:
            summary.status, left = held
            if left is not None:
                print_fn(f"--- {run.name}: {where}; not launched: {left:.0f} s left before the "
                         f"trainer's stop ({stop_margin_s:g} s before the deadline), under "
                         f"--min_run_s {min_run_s:g}")
            break
        sharing = 1  # (with gpus: alone on its group)
        if parallel > 1 and finish_by_deadline and pool is None:
            sharing = min(parallel, len(in_flight) + len(foreign) + 1
                          + sum(map(to_launch, runs[i + 1:])))
        need = (estimated_run_s(root, runs, state, concurrent=sharing)
                if finish_by_deadline else None)
        if deadline is not None and need is not None and (
                deadline - time.time() - stop_margin_s < need):
            summary.status = "deadline"
            shared = f" with {sharing} runs at once" if sharing > 1 else ""
            print_fn(f"--- {run.name}: {where}; not launched: "
                     f"{max(deadline - time.time(), 0):.0f} s left before the deadline, it "
                     f"needs about {need:.0f} s{shared} (--finish_by_deadline, with a "
                     f"{stop_margin_s:g} s stop margin)")
            break
        if state.status != Status.NOT_STARTED and state.step == 0 and (
                _has_trainer_records(workdir)):
            aside = _set_aside(workdir)
            print_fn(f"--- {run.name}: no checkpoint to resume from; earlier records kept in "
                     f"{aside}")
            state = RunState(Status.NOT_STARTED)
        cmd = command(run, config_path=config_path, workdir=workdir, train_script=train_script,
                      python=python, extra_overrides=extra_overrides)
        os.makedirs(workdir, exist_ok=True)
        with open(os.path.join(workdir, RUN_RECORD), "w") as f:
            json.dump({"name": run.name, "values": [list(p) for p in run.values],
                       "group": run.group, "seed": run.seed, "arg": run.arg,
                       "overrides": [list(p) for p in run.overrides], "command": cmd},
                      f, indent=2)
        how = (f"resuming from step {state.step}" if state.step
               else "starting" if state.status == Status.NOT_STARTED else "starting over")
        group = None if pool is None else pool.take()
        others = f", {len(foreign)} not started here" if foreign else ""
        slots = ([f"{len(in_flight) + 1} of {parallel} in flight{others}"]
                 if parallel > 1 else []) + (
            [] if group is None else [f"{CUDA_VISIBLE_DEVICES}={group}"])
        print_fn(f"--- {run.name}: {how}" + (f" ({', '.join(slots)})" if slots else ""))
        summary.launched.append(run.name)
        thread = threading.Thread(target=run_trainer, args=(run, cmd, workdir, group),
                                  daemon=True, name=f"sweep {run.name}")
        in_flight[run.name] = thread
        thread.start()
    while in_flight:
        collect_ended(block=True)
    if errors:
        raise errors[0]
    if summary.status == "complete" and halt:
        summary.status = halt[0]
    if summary.status == "complete" and any(
            run_state(run_dir(root, r)).status not in (Status.FINISHED, Status.FAILED)
            for r in runs):
        summary.status = "incomplete"
    return summary


# ------------------------------------------------------------------------------------------------
# Whether a trainer may start: the locks, the limits of a call
# ------------------------------------------------------------------------------------------------

TRAINER_LOCK = ".train.lock"  # lattn_jax.train.WORKDIR_LOCK (not imported here: no jax)
ROOT_LOCK = ".sweep.lock"  # <root>/.sweep.lock: held by the sweep call that launches runs


def trainer_lock_owner(workdir: str) -> Optional[str]:
    """The pid (as the lock file records it, ``"unknown"`` when empty) of a live trainer that
    holds ``<workdir>/.train.lock`` (:func:`lattn_jax.train._workdir_lock`), or ``None`` when
    no process holds it (or there is no lock file: the trainer deletes it when it ends)."""
    return records.lock_owner(os.path.join(workdir, TRAINER_LOCK))


FOREIGN_POLL_S = 2.0  # how often a call waiting on trainers it did not start checks them


def foreign_trainers(runs: Sequence[Run], root: str) -> Dict[str, Tuple[str, Optional[str]]]:
    """The runs of ``runs`` whose workdir a live trainer holds (:func:`trainer_lock_owner`):
    ``{name: (pid, GPU group or None)}``, the group being the ``gpus`` of the run's newest
    ``start`` record (a trainer a killed sweep call left running, on the group that call gave
    it). A sweep call did not start these trainers, yet they use the machine: ``execute`` and
    :func:`plan` count them against ``parallel`` while they run, and keep their groups out of
    ``gpus``."""
    out = {}
    for run in runs:
        workdir = run_dir(root, run)
        owner = trainer_lock_owner(workdir)
        if owner is not None:
            starts = [a for a in read_jsonl(os.path.join(workdir, ATTEMPTS))
                      if a.get("event") == "start"]
            out[run.name] = (owner, starts[-1].get("gpus") if starts else None)
    return out


@contextlib.contextmanager
def root_lock(root: str):
    """Holds an exclusive ``flock`` on ``<root>/.sweep.lock`` (holding this pid) while a sweep
    call launches and records runs: a second call on the same root would set aside, launch or
    record the runs the first one has in flight (two trainers writing one run directory). The
    kernel drops the lock when the process ends, however it ends.

    Raises:
      SweepConfigError: another process holds it (naming its pid), or the root cannot be
        written, before anything is written.
    """
    path = os.path.join(root, ROOT_LOCK)
    stack = contextlib.ExitStack()
    try:
        stack.enter_context(records.pid_lock(path))
    except OSError as e:
        raise SweepConfigError(f"--root={root}: cannot write there ({e.strerror})") from None
    except records.LockHeld as e:
        raise SweepConfigError(
            f"--root={root} is in use by another sweep call (pid {e.owner}; {path}): wait "
            f"for it to end, or use another --root") from None
    with stack:
        yield


def _launch_held(stop: Optional[threading.Event], max_runs: Optional[int], launched: int,
                 deadline: Optional[float], stop_margin_s: float,
                 min_run_s: float) -> Optional[Tuple[str, Optional[float]]]:
    """Why no further trainer may start, shared by :func:`execute` and :func:`remeasure_alone`.

    Args:
      stop: set on SIGINT / SIGTERM of the sweep.
      max_runs: launches allowed in this call (``None``: no limit); ``launched``: made so far.
      deadline: ``time.time()`` at which trainers get stopped (``None``: none).
      stop_margin_s: seconds before ``deadline`` at which a trainer gets SIGTERM.
      min_run_s: the least time (s) a new trainer must have before its SIGTERM.

    Returns:
      ``None`` when a trainer may start, else ``(status, left)``: status ``"interrupted"``,
      ``"max_runs"`` or ``"deadline"``; ``left`` the seconds before the trainer's stop (for
      ``"deadline"``, which the caller reports), else ``None``. The trainer gets SIGTERM
      ``stop_margin_s`` before the deadline, so what it would run is the time left minus the
      margin (a rehearsal of 2026-12-04 launched runs 1 s before their SIGTERM).
    """
    if stop is not None and stop.is_set():
        return "interrupted", None
    if max_runs is not None and launched >= max_runs:
        return "max_runs", None
    if deadline is not None:
        left = deadline - time.time() - stop_margin_s
        if left < max(min_run_s, 0):
            return "deadline", max(left, 0.0)
    return None


# ------------------------------------------------------------------------------------------------
# Throughput re-measured alone (``--remeasure_alone``)
# ------------------------------------------------------------------------------------------------

ALONE_DIR = "alone"  # <run dir>/alone: the trainer's workdir of the re-measurement
THROUGHPUT_ALONE = "throughput_alone.json"  # <run dir>/throughput_alone.json: its result


def alone_overrides(steps: int) -> Tuple[Tuple[str, int], ...]:
    """The overrides that turn a run's trainer command into a ``steps``-step throughput
    measurement: ``train.total_steps`` (the warm-up and decay follow it where the config
    derives them), and evaluations and checkpoints only at the end (``train.eval_every``,
    ``train.checkpoint_every``), after the last logging window, so that none falls inside
    a window that is timed."""
    return (("train.total_steps", steps), ("train.eval_every", steps),
            ("train.checkpoint_every", steps))


def alone_command(run: Run, *, root: str, steps: int, config_path: str, train_script: str,
                  python: str = sys.executable,
                  extra_overrides: Sequence[Tuple[str, Any]] = ()) -> List[str]:
    """The trainer command of ``run``'s re-measurement alone: :func:`command` as the sweep
    builds it (same config, argument string, overrides and ``extra_overrides``) in the
    workdir ``<run dir>/alone``, with :func:`alone_overrides` appended (they win)."""
    return command(run, config_path=config_path,
                   workdir=os.path.join(run_dir(root, run), ALONE_DIR),
                   train_script=train_script, python=python,
                   extra_overrides=tuple(extra_overrides) + alone_overrides(steps))


def read_throughput_alone(workdir: str) -> Optional[Dict[str, Any]]:
    """The run's ``throughput_alone.json`` (:func:`remeasure_alone`), or ``None`` when it has
    none or it is not a record (no number under ``tokens_per_sec``)."""
    try:
        with open(os.path.join(workdir, THROUGHPUT_ALONE)) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("tokens_per_sec"),
                                                      (int, float)):
        return None
    return record


def alone_throughput(alone_dir: str) -> Tuple[Optional[float], Optional[float], int]:
    """``(tokens/s, MFU, windows)`` of a re-measurement alone: :func:`window_throughput` over
    its logging windows after the first one (the step that compiled is already out of that
    window, but it still warms up), ``windows`` how many it used."""
    train = {}
    for record in read_jsonl(os.path.join(alone_dir, "metrics.jsonl")):
        if record.get("step") is not None and "train_loss" in record:
            train[record["step"]] = record
    later = [train[s] for s in sorted(train)[1:]]
    tps, mfu = window_throughput(later)
    return tps, mfu, sum(1 for r in later if r.get("tokens_per_sec"))


def needs_remeasure(root: str, run: Run) -> bool:
    """Whether ``run`` is finished, its tokens/s and MFU were measured only while it shared
    the machine (:attr:`RunResult.concurrent` > 1, as the report marks them) and it has no
    measurement alone yet (``throughput_alone.json``)."""
    workdir = run_dir(root, run)
    return (run_state(workdir).status == Status.FINISHED and collect(workdir).concurrent > 1
            and read_throughput_alone(workdir) is None)


@dataclasses.dataclass
class RemeasureSummary:
    """What one :func:`remeasure_alone` call did.

    Attributes:
      status: ``"complete"``, or ``"deadline"``, ``"interrupted"`` or ``"max_runs"`` (stopped
        before the rest).
      measured: ``{run name: the throughput_alone.json record}`` of this call.
      failed: ``{run name: error line}`` of the re-measurements that failed in this call.
      skipped: ``{run name: reason}`` of those not launched (failed before).
    """

    status: str = "complete"
    measured: Dict[str, Dict[str, Any]] = dataclasses.field(default_factory=dict)
    failed: Dict[str, str] = dataclasses.field(default_factory=dict)
    skipped: Dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def launched(self) -> List[str]:
        """The runs whose re-measurement was launched (measured or failed)."""
        return list(self.measured) + list(self.failed)


def remeasure_alone(runs: Sequence[Run], root: str, *, steps: int, config_path: str,
                    train_script: str, cwd: str, python: str = sys.executable,
                    extra_overrides: Sequence[Tuple[str, Any]] = (),
                    env: Optional[Mapping[str, str]] = None, deadline: Optional[float] = None,
                    min_run_s: float = 0.0, stop_margin_s: float = 30.0,
                    max_runs: Optional[int] = None, retry_failed: bool = False,
                    stop: Optional[threading.Event] = None,
                    print_fn: Callable[[str], None] = print,
                    after_run: Optional[Callable[[Run, Attempt], None]] = None
                    ) -> RemeasureSummary:
    """Measures again, alone, the tokens/s and MFU of the finished runs of ``runs`` that were
    measured only while sharing the machine (:func:`needs_remeasure`), one at a time.

    Each is the run's own trainer command (:func:`alone_command`: ``steps`` steps, evaluations
    and checkpoints only at the end) in a fresh ``<run dir>/alone`` (an earlier attempt's is
    removed first), launched like a run (:func:`launch`: its records, log and error line in
    that directory, SIGTERM at the deadline), never two at once. Its tokens/s and MFU are the
    medians over its logging windows after the first (:func:`alone_throughput`), written with
    ``steps``, the number of windows, the date and the command to ``<run dir>/
    throughput_alone.json``, which the report then uses for the run's throughput (and a rerun
    skips). A failed re-measurement (the trainer's error, or no logging window after the
    first) is printed with its error line and ends only itself; it is not tried again unless
    ``retry_failed``. No re-measurement starts after ``stop`` is set, after ``max_runs``
    launches, or with less than ``min_run_s`` before its SIGTERM (``stop_margin_s`` before
    ``deadline``); one stopped at the deadline is not recorded (the next call starts it over).

    Args:
      runs: the selected runs (:func:`select`).
      root: the sweep directory.
      steps: steps of each re-measurement (>= 2: the first window is left out).
      config_path, train_script, python, extra_overrides: :func:`command`'s.
      cwd, env, deadline, min_run_s, stop_margin_s, max_runs, retry_failed, stop, print_fn,
        after_run: :func:`execute`'s (``env`` as for one run at a time).

    Returns:
      A :class:`RemeasureSummary`.

    Raises:
      ValueError: if ``steps`` < 2.
      OSError: if a trainer cannot be started.
    """
    if steps < 2:
        raise ValueError(f"steps={steps}: a re-measurement needs at least 2 steps (its first "
                         f"logging window is left out)")
    summary = RemeasureSummary()
    todo = [r for r in runs if needs_remeasure(root, r)]
    if todo:
        print_fn(f"--- re-measuring the throughput of {len(todo)} run(s) alone, "
                 f"{steps} steps each, one at a time")
    for run in todo:
        alone_dir = os.path.join(run_dir(root, run), ALONE_DIR)
        before = run_state(alone_dir)
        if before.status == Status.FAILED and not retry_failed:
            summary.skipped[run.name] = f"failed: {before.error}"
            print_fn(f"--- {run.name}: re-measurement alone failed before ({before.error}); "
                     f"skipped (--retry_failed runs it again)")
            continue
        held = _launch_held(stop, max_runs, len(summary.launched), deadline, stop_margin_s,
                            min_run_s)
        if held is not None:
            summary.status, left = held
            if left is not None:
                print_fn(f"--- {run.name}: re-measurement alone not launched: {left:.0f} s left "
                         f"before the trainer's stop, under --min_run_s {min_run_s:g}")
            break
        cmd = alone_command(run, root=root, steps=steps, config_path=config_path,
                            train_script=train_script, python=python,
                            extra_overrides=extra_overrides)
        shutil.rmtree(alone_dir, ignore_errors=True)  # a fresh run, not a resume
        print_fn(f"--- {run.name}: re-measuring its throughput alone ({steps} steps)")
        attempt = launch(cmd, alone_dir, cwd=cwd, env=env, deadline=deadline,
                         stop_margin_s=stop_margin_s, stop=stop, print_fn=print_fn,
                         prefix=f"[{run.name} alone] ")
        error = attempt.error
        if attempt.stopped_by:
            summary.status = "deadline" if attempt.stopped_by == "deadline" else "interrupted"
            print_fn(f"--- {run.name}: re-measurement alone stopped ({attempt.stopped_by}); "
                     f"not recorded")
            if after_run is not None:
                after_run(run, attempt)
            break
        tps = mfu = None
        windows = 0
        if attempt.returncode == 0:
            tps, mfu, windows = alone_throughput(alone_dir)
            if tps is None:
                error = (f"error: no logging window with tokens/s after the first in "
                         f"{steps} steps (train.log_every too large for --remeasure_alone?)")
                _append_jsonl(os.path.join(alone_dir, ATTEMPTS), {
                    "event": "end", "time": _utc(time.time()), "returncode": 1,
                    "wall_s": 0.0, "stopped_by": None, "error": error})
        if tps is None:
            error = error or f"exit {attempt.returncode}"
            summary.failed[run.name] = error
            print_fn(f"--- {run.name}: re-measurement alone failed "
                     f"({_describe_exit(attempt)}): {error}")
        else:
            record = {"steps": steps, "tokens_per_sec": tps, "mfu": mfu, "windows": windows,
                      "date": _utc(time.time()), "wall_s": round(attempt.wall_s, 1),
                      "workdir": ALONE_DIR, "command": list(cmd),
                      "devices": list(device_kinds(alone_dir))}
            path = os.path.join(run_dir(root, run), THROUGHPUT_ALONE)
            with open(path + ".tmp", "w") as f:
                json.dump(record, f, indent=2)
            os.replace(path + ".tmp", path)
            summary.measured[run.name] = record
            print_fn(f"--- {run.name}: alone {tps:,.0f} tokens/s"
                     + ("" if mfu is None else f", MFU {100 * mfu:.1f}%")
                     + f" (median of {windows} windows after the first)")
        if after_run is not None:
            after_run(run, attempt)
    return summary


@dataclasses.dataclass(frozen=True)
class PlannedRun:
    """What :func:`execute` would do with one run, as far as its records say beforehand
    (:func:`plan`).

    Attributes:
      run: the run; state: its :class:`RunState` now.
      action: ``"launch"``, ``"skip"`` (finished, or failed without ``retry_failed``),
        ``"reuse"`` (an identical finished run of another sweep gives its records) or
        ``"hold"`` (not launched: ``max_runs`` reached, or the deadline).
      why: for ``"launch"``, how it starts (``"starting"``, ``"resuming from step N"``,
        ``"starting over"``, with a note when records without a checkpoint are set aside
        first); otherwise why it is not launched (for ``"reuse"``, the source
        run directory).
      launch: for ``"launch"``, its place among the launches (1, 2, ...), else ``None``.
      at_once: for ``"launch"``, whether it starts at the call's start (one of the first
        ``parallel`` launches, less one per run a trainer no call started here holds:
        :func:`foreign_trainers`), not when an earlier trainer exits.
      gpus: with ``plan(gpus=...)``, the GPU group of a launch at the start (the first free
        one, as :class:`GpuPool` gives them, a held run's trainer's group kept out); ``None``
        otherwise (a later launch takes the
        group a trainer frees).
    """

    run: Run
    state: RunState
    action: str
    why: str
    launch: Optional[int] = None
    at_once: bool = False
    gpus: Optional[str] = None


def plan(runs: Sequence[Run], root: str, *, config_path: str,
         extra_overrides: Sequence[Tuple[str, Any]] = (), deadline_s: Optional[float] = None,
         min_run_s: float = 0.0, stop_margin_s: float = 30.0, max_runs: Optional[int] = None,
         retry_failed: bool = False, reuse_from: Sequence[str] = (),
         finish_by_deadline: bool = False, parallel: int = 1,
         remeasurements: int = 0, gpus: Optional[Sequence[str]] = None) -> List[PlannedRun]:
    """Which runs :func:`execute` would launch, in which order and which at once, without
    launching or writing anything (``experiments/sweep.py --dry_run``).

    The same rules in the same order: reused runs (``reuse_from``) are not launched, finished
    runs, (unless ``retry_failed``) failed ones and those a live trainer holds
    (:func:`trainer_lock_owner`) are skipped, at most ``max_runs`` runs are
    launched, in grid order, the first ``parallel`` of them at once and each later one when a
    trainer exits. The deadline checks (``min_run_s``, and ``finish_by_deadline``'s estimate,
    :func:`estimated_run_s`) are made for the launches at the start, with all of
    ``deadline_s`` left; a later launch depends on how long the earlier runs take (the real
    call decides it then).

    Args:
      runs: the runs (:func:`expand`, :func:`select`).
      root: the sweep directory.
      config_path, extra_overrides: :func:`command`'s (for :func:`identical_finished_run`).
      deadline_s: seconds from the call's start to its deadline; ``None``: none.
      min_run_s, stop_margin_s, max_runs, retry_failed, reuse_from, finish_by_deadline,
        parallel, gpus: :func:`execute`'s (with ``gpus``, each launch at the start names its
        group, and ``finish_by_deadline`` estimates each run alone).
      remeasurements: re-measurements alone the call makes before the runs
        (:func:`remeasure_alone`); they count against ``max_runs``.

    Returns:
      One :class:`PlannedRun` per run of ``runs``, in their order.

    Raises:
      ValueError: if ``parallel`` < 1, or above ``len(gpus)`` (:func:`check_gpus`).
    """
    if parallel < 1:
        raise ValueError(f"parallel={parallel}: must be at least 1 (trainers at once)")
    groups = None if gpus is None else check_gpus(gpus, parallel)
    here = os.path.realpath(root)
    roots = [r for r in reuse_from if os.path.realpath(r) != here]
    states = [run_state(run_dir(root, r)) for r in runs]
    cache: Dict[str, Any] = {}
    sources = {}
    for run, state in zip(runs, states):
        if roots and state.status == Status.NOT_STARTED:
            sources[run.name] = identical_finished_run(run, config_path, roots,
                                                       extra_overrides, cache)

    def to_launch(run: Run, state: RunState) -> bool:
        return (not sources.get(run.name) and state.status != Status.FINISHED
                and (retry_failed or state.status != Status.FAILED))

    # Trainers no call started here hold some runs: they take slots (and their GPU groups) at
    # the start; when they end is unknown, so the later launches are "when a trainer exits".
    foreign = foreign_trainers(runs, root)
    busy = {group for _, group in foreign.values()}
    free_groups = None if groups is None else [g for g in groups if g not in busy]
    out: List[PlannedRun] = []
    launched, held = 0, None
    for i, (run, state) in enumerate(zip(runs, states)):
        if sources.get(run.name):
            out.append(PlannedRun(run, state, "reuse", sources[run.name]))
            continue
        if state.status == Status.FINISHED:
            out.append(PlannedRun(run, state, "skip", "finished"))
            continue
        if state.status == Status.FAILED and not retry_failed:
            out.append(PlannedRun(run, state, "skip", f"failed before ({state.error}); "
                                                      f"--retry_failed runs it again"))
            continue
        owner = trainer_lock_owner(run_dir(root, run))
        if owner is not None:
            out.append(PlannedRun(run, state, "skip", f"in use by a trainer (pid {owner})"))
            continue
        if held is None and max_runs is not None and launched + remeasurements >= max_runs:
            held = f"--max_runs={max_runs} reached" + (
                f" (with the {remeasurements} re-measurement(s))" if remeasurements else "")
        at_once = launched + len(foreign) < parallel
        if held is None and at_once and deadline_s is not None:
            left = deadline_s - stop_margin_s
            sharing = 1  # (with gpus: alone on its group)
            if parallel > 1 and finish_by_deadline and groups is None:
                sharing = min(parallel, len(foreign) + launched + 1 + sum(
                    to_launch(r, s) for r, s in zip(runs[i + 1:], states[i + 1:])))
            need = (estimated_run_s(root, runs, state, concurrent=sharing)
                    if finish_by_deadline else None)
            if left < max(min_run_s, 0):
                held = (f"the deadline: {max(left, 0):.0f} s before the trainer's stop, under "
                        f"--min_run_s {min_run_s:g}")
            elif need is not None and left < need:
                shared = f" with {sharing} runs at once" if sharing > 1 else ""
                held = (f"the deadline: it needs about {need:.0f} s{shared} "
                        f"(--finish_by_deadline)")
        if held is not None:
            out.append(PlannedRun(run, state, "hold", held))
            continue
        launched += 1
        how = (f"resuming from step {state.step}" if state.step
               else "starting" if state.status == Status.NOT_STARTED else "starting over")
        if state.status != Status.NOT_STARTED and not state.step and _has_trainer_records(
                run_dir(root, run)):
            how += " (no checkpoint; its records are first set aside as .restarted-<time>)"
        out.append(PlannedRun(run, state, "launch", how, launch=launched, at_once=at_once,
                              gpus=free_groups[launched - 1] if groups and at_once else None))
    return out


def _whole_lines(print_fn: Callable[[str], None]) -> Callable[[str], None]:
    """``print_fn`` behind a lock: lines from several threads (trainers) never interleave."""
    lock = threading.Lock()

    def locked(line: str) -> None:
        with lock:
            print_fn(line)

    return locked


def _run_concurrency(attempts: Sequence[Mapping[str, Any]]) -> int:
    """The most runs in flight at once during any of a run's attempts (its
    ``sweep_attempts.jsonl`` records; 1: every attempt ran alone, or was recorded before
    ``parallel`` existed); an attempt with a ``start`` record only (the sweep died) counts its
    ``parallel``."""
    most = 1
    for i, a in enumerate(attempts):
        if a.get("event") == "end":
            most = max(most, int(a.get("concurrent") or 1))
        elif a.get("event") == "start" and (i + 1 == len(attempts)
                                            or attempts[i + 1].get("event") != "end"):
            most = max(most, int(a.get("parallel") or 1))
    return most


def _utc_seconds(text: Any) -> Optional[float]:
    """``"2026-12-04T10:00:00Z"`` (:func:`_utc`) -> seconds since the epoch; ``None`` if not."""
    try:
        return float(calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ")))
    except (TypeError, ValueError):
        return None


def _shared_spans(attempts: Sequence[Mapping[str, Any]]) -> List[Tuple[float, float, int]]:
    """When a run's attempts shared the machine: ``[(start, end, runs at once), ...]``
    (``time.time()`` values, ``-inf`` / ``inf`` where the records do not say).

    An ``end`` record with ``concurrent`` > 1 gives its exact ``t0`` and ``t1`` (recorded since
    2026-12-05), or else its ``time`` minus its ``wall_s``, a second wider either way (those
    times are whole seconds), or else, without a ``time``, the whole time line. A ``start``
    record with ``parallel`` > 1 and no ``end`` after it (the sweep died mid-attempt) spans
    from its start to the next attempt's start (its ``parallel``: as many may have run).
    """
    inf = float("inf")
    spans = []
    for i, a in enumerate(attempts):
        if a.get("event") == "end" and int(a.get("concurrent") or 1) > 1:
            most = int(a["concurrent"])
            if a.get("t0") is not None and a.get("t1") is not None:
                spans.append((float(a["t0"]), float(a["t1"]), most))
                continue
            end = _utc_seconds(a.get("time"))
            spans.append((-inf, inf, most) if end is None else
                         (end - float(a.get("wall_s") or 0.0) - 1.0, end + 1.0, most))
        elif (a.get("event") == "start" and int(a.get("parallel") or 1) > 1
              and (i + 1 == len(attempts) or attempts[i + 1].get("event") != "end")):
            start = a.get("t0")
            start = _utc_seconds(a.get("time")) if start is None else float(start)
            later = [b for b in attempts[i + 1:] if b.get("event") == "start"]
            end = None
            if later:
                end = later[0].get("t0")
                if end is None:
                    end = _utc_seconds(later[0].get("time"))
                    end = None if end is None else end + 1.0
            spans.append((-inf if start is None else start - 1.0,
                          inf if end is None else float(end), int(a["parallel"])))
    return spans


def throughput_concurrency(attempts: Sequence[Mapping[str, Any]],
                           records: Sequence[Mapping[str, Any]]) -> int:
    """The most runs in flight at once while the trainer wrote ``records``.

    A record counts as written while sharing the machine when its ``time`` falls in a span
    of an attempt that shared it (:func:`_shared_spans`); a record without a ``time``, in
    every such span. So an attempt that shared the machine but whose records are not among
    ``records`` (one stopped before it wrote any, then run again alone) leaves them unmarked.

    Args:
      attempts: the run's ``sweep_attempts.jsonl`` records, in order.
      records: the ``metrics.jsonl`` records in question, e.g. those that give
        :attr:`RunResult.tokens_per_sec` and :attr:`RunResult.mfu`.

    Returns:
      The most runs at once (itself included) of the spans that hold any of ``records``;
      1 when none does (measured alone, or no records).
    """
    spans = _shared_spans(attempts)
    most = 1
    for record in records:
        t = record.get("time")
        for start, end, n in spans:
            if n > most and (not isinstance(t, (int, float)) or start <= t <= end):
                most = n
    return most


def estimated_run_s(root: str, runs: Sequence[Run], state: RunState,
                    concurrent: int = 1) -> Optional[float]:
    """Seconds a run in ``state`` needs to finish with ``concurrent`` runs sharing the
    machine (itself included), from the runs of ``runs`` finished under ``root``.

    The median of their wall times (:attr:`RunResult.wall_s`: start-up, compilation and
    evaluations included), over the finished runs that ran under the same concurrency
    (:attr:`RunResult.attempts_concurrent`, the most runs in flight during any of their
    attempts) if
    there are any; otherwise over all of them, each scaled by ``max(1, concurrent / theirs)``:
    conservatively, as if sharing the machine gained no throughput at all (a run measured
    alone, estimated for 2 at once, takes twice as long; one measured with 2 at once,
    estimated alone, takes as long). For a run not started, that median; for a partial one,
    the median times the share of steps left, plus a tenth of the median (its start-up,
    compilation and final evaluation again).

    Args:
      root: the sweep directory.
      runs: the sweep's runs (their finished ones give the median).
      state: the run's :class:`RunState`.
      concurrent: runs at once while it runs (>= 1; 1: alone).

    Returns:
      The estimate, or ``None`` when no run of ``runs`` has finished with a recorded wall time.
    """
    walls = []  # (wall time, concurrency)
    for other in runs:
        workdir = run_dir(root, other)
        if run_state(workdir).status == Status.FINISHED:
            result = collect(workdir)
            if result.wall_s:
                walls.append((result.wall_s, result.attempts_concurrent))
    if not walls:
        return None
    same = [w for w, c in walls if c == concurrent]
    full = statistics.median(same or [w * max(1.0, concurrent / c) for w, c in walls])
    if state.status == Status.NOT_STARTED or not state.step or not state.total_steps:
        return full
    left = max(state.total_steps - state.step, 0) / state.total_steps
    return full * left + 0.1 * full


def _set_aside(workdir: str) -> str:
    """Renames ``workdir`` to ``<workdir>.restarted-<time>`` (kept; not a run, see
    :func:`recorded_runs`) and returns the new path."""
    aside = f"{workdir}.restarted-{time.strftime('%Y%m%dT%H%M%S')}"
    os.replace(workdir, aside)
    return aside


def _load_config_file(config_path: str):
    """The training config file ``config_path`` as a fresh module (its ``get_config``).

    Raises:
      OSError, SyntaxError, or whatever the file raises while it is executed.
    """
    spec = importlib.util.spec_from_file_location("_sweep_train_config", config_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _arg_dict(arg: str) -> Dict[str, str]:
    return dict(part.partition("=")[::2] for part in arg.split(",") if part)


def _flag_parsers():
    """``(type, parser)`` for the config-field kinds whose ``--config.<field>=<text>``
    ml_collections' config flags parse (bool before int: a bool is an int)."""
    return ((bool, absl_flags.BooleanParser()), (int, absl_flags.IntegerParser()),
            (float, absl_flags.FloatParser()), (tuple, tuple_parser.TupleParser()))


REUSED_KEY = "reused_from"  # in sweep_run.json: the run directory the records came from


def _parse_override(current: Any, value: Any, field_type: Optional[type] = None) -> Any:
    """An override's value as the trainer's ``--config.<field>=<text>`` would set it: a text
    value (``--override field=value``) parsed for an int, float, bool or tuple field with the
    parsers of ml_collections' config flags; typed values (the grid's) as they are. A field
    that holds ``None`` (``train.max_steps_per_run``) is parsed by its declared
    ``field_type`` (``ConfigDict.get_type``), ``"None"`` staying ``None``."""
    if not isinstance(value, str):
        return value
    if current is None:
        if value == "None" or field_type is None:
            return None if value == "None" else value
        for kind, parser in _flag_parsers():
            if issubclass(field_type, kind):
                return parser.parse(value)
        return value
    for kind, parser in _flag_parsers():
        if isinstance(current, kind):
            return parser.parse(value)
    return value


def resolved_config(config_path: str, arg: str, overrides: Sequence[Tuple[str, Any]],
                    cache: Dict[str, Any]) -> Optional[dict]:
    """The experiment config a run's trainer would record, without running it.

    ``get_config(arg)`` of the training config file, the overrides applied as the trainer's
    ``--config.<field>=<value>`` flags apply them, validated
    (:func:`lattn_jax.config.experiment_from_config_dict`) and turned into the dict that the
    trainer writes to ``config.json`` and ``invocations.jsonl``
    (:func:`lattn_jax.config.experiment_json_dict`).

    Args:
      config_path: the training config file (``configs/table2.py``).
      arg: its argument string.
      overrides: ``(field, value)`` pairs, the grid's typed values or ``--override`` texts.
      cache: loaded config modules by path (filled here).

    Returns:
      The dict, or ``None`` if the file cannot be loaded, ``get_config`` raises or an override
      or value is refused (the caller, :func:`identical_finished_run`, then does not reuse).
    """
    from lattn_jax import config as config_lib  # noqa: PLC0415 (jax, only for reuse)
    try:
        return config_lib.experiment_json_dict(
            _experiment_config(config_path, arg, overrides, cache))
    except Exception:  # noqa: BLE001 - an unresolvable config is simply not reused
        return None


def _experiment_config(config_path: str, arg: str, overrides: Sequence[Tuple[str, Any]],
                       cache: Dict[str, Any]) -> Any:
    """The validated :class:`lattn_jax.config.ExperimentConfig` a run's trainer would build
    (:func:`resolved_config`), or the error it would stop on.

    Raises:
      Exception: whatever loading the file, ``get_config``, applying an override
        (:func:`_overridden_config_dict`) or the config's validation
        (:func:`lattn_jax.config.experiment_from_config_dict`) raises.
    """
    from lattn_jax import config as config_lib  # noqa: PLC0415 (jax, only when asked)
    return config_lib.experiment_from_config_dict(
        _overridden_config_dict(config_path, arg, overrides, cache))


def _overridden_config_dict(config_path: str, arg: str, overrides: Sequence[Tuple[str, Any]],
                            cache: Dict[str, Any]) -> Any:
    """``get_config(arg)`` of the training config file with ``overrides`` applied as the
    trainer's ``--config.<field>=<value>`` flags apply them (:func:`_parse_override`).

    Raises:
      Exception: whatever loading the file, ``get_config`` or applying an override raises.
    """
    if config_path not in cache:
        cache[config_path] = _load_config_file(config_path)
    cd = cache[config_path].get_config(arg or None)
    for field, value in overrides:
        parent, _, leaf = field.rpartition(".")
        node = cd
        for part in filter(None, parent.split(".")):
            node = node[part]
        field_type = node.get_type(leaf) if hasattr(node, "get_type") else None
        node[leaf] = _parse_override(node[leaf], value, field_type)
    return cd


def override_config_error(runs: Sequence[Run], config_path: str,
                          extra_overrides: Sequence[Tuple[str, Any]]) -> Optional[str]:
    """The trainer's config error that ``extra_overrides`` (``--override``) cause, if any.

    The first run's experiment config is built and validated as its trainer would
    (:func:`lattn_jax.config.experiment_from_config_dict`) with and without
    ``extra_overrides``: an error only with them (``optim.learning_rate=-1``) would fail every
    run of the call the same way a few seconds in, each leaving a failed run directory. A run
    whose own grid values are refused is left to fail as a run (the results report it); so
    is an override this function cannot apply as the trainer's flags would (its text is
    :func:`bad_override_fields`' to check, the rest the trainer's), and an error the trainer
    finds only later (the corpus, the devices).

    Args:
      runs: the runs of the call (the first is checked; none: nothing is).
      config_path: the training config file.
      extra_overrides: ``(field, value)`` pairs added to every run.

    Returns:
      ``"<error>"`` (the config check's own words), or ``None``.
    """
    if not runs or not extra_overrides:
        return None
    from lattn_jax import config as config_lib  # noqa: PLC0415 (jax, only when asked)
    run, cache = runs[0], {}
    try:
        _experiment_config(config_path, run.arg, tuple(run.overrides), cache)
        cd = _overridden_config_dict(config_path, run.arg,
                                     tuple(run.overrides) + tuple(extra_overrides), cache)
    except Exception:  # noqa: BLE001 - the run's own config, or an override's text: its trainer
        return None    # reports it
    try:
        config_lib.experiment_from_config_dict(cd)
    except Exception as e:  # noqa: BLE001 - reported as one line
        return str(e) or type(e).__name__
    return None


def _field_text(cd: Any, field: str) -> Optional[str]:
    """``repr`` of ``field`` (dotted) of a ConfigDict (a section as its dict), or ``None`` when
    it has no such field (or ``cd`` is ``None``)."""
    node = cd
    try:
        for part in field.split("."):
            node = node[part]
    except (KeyError, AttributeError, TypeError, IndexError):
        return None
    return repr(node.to_dict() if hasattr(node, "to_dict") else node)


# Text axes: the most other values read from a config file's error that are tried.
_MAX_TEXT_PROBES = 8


def _other_text_values(config_path: str, others: Sequence[str], axis: str, value: str,
                       overrides: Tuple[Tuple[str, Any], ...], cache: Dict[str, Any]
                       ) -> List[str]:
    """Other values of the text argument ``axis`` (``value`` in the grid) to build the config
    with (:func:`override_axis_clash`): ``<value>_`` when the file takes it (it then reads
    the text as such, e.g. a path), else the words after ``choose`` in the file's error for
    it (``"arch='gdn_'; choose from softmax, deltanet, gdn"``; at most
    :data:`_MAX_TEXT_PROBES`, ``value`` left out), else none.
    """
    probe = f"{value}_"
    try:
        _overridden_config_dict(config_path, ",".join(list(others) + [f"{axis}={probe}"]),
                                overrides, cache)
        return [probe]
    except Exception as e:  # noqa: BLE001 - its message may list the values the file takes
        _, found, choices = str(e).partition("choose")
    words = re.findall(r"[A-Za-z0-9_./-]+", choices) if found else []
    out = [w for w in dict.fromkeys(words) if w not in (value, "from", "or")]
    return out[:_MAX_TEXT_PROBES]


def override_axis_clash(runs: Sequence[Run], config_path: str,
                        extra_overrides: Sequence[Tuple[str, Any]],
                        grid: Sequence[Run] = ()) -> Optional[str]:
    """Why an ``--override`` would replace a value that the sweep's grid sets, or ``None``.

    The trainer gets the grid's ``--config.<field>=<value>`` and then the override's (the last
    wins), while the run names and the results still show the grid's value. A field that is a
    field axis of one of ``runs`` is refused; so is a field that an argument axis sets: one
    whose value in ``get_config(arg)`` (with the run's own overrides) differs between the runs
    of the grid (``grid``, default ``runs``: ``seed=42,43`` gives ``train.seed`` two values),
    or, for one of ``runs``, from the config without one of its argument axes (the file's
    default for it) or, for a number or bool, with another value of it (``2v + 1``, ``not v``:
    ``lr=0.003`` sets ``optim.learning_rate`` in a grid of one value; for text, ``<v>_`` if
    the file takes it, else each word after ``choose`` in the file's error for it: ``arch=gdn``,
    the file's default, sets ``model.layer_pattern`` in a grid of one value). A config that
    cannot be built is skipped (:func:`bad_override_fields` reports it), and so is a field that
    only a text axis of one value sets when the file names no other value of it.

    Args:
      runs: the runs of the call (:func:`select`).
      config_path: the training config file.
      extra_overrides: ``(field, value)`` pairs added to every run (``--override``).
      grid: every run of the grid (:func:`expand`), for the fields argument axes set.

    Returns:
      ``"--override: <field> is an axis of the sweep's grid ...; ..."`` or ``"--override:
      <field> is set by the sweep's grid (its argument axis <axes>; ...); ..."``, naming the
      first such field; else ``None``.
    """
    fields = list(dict(extra_overrides))
    axes = {axis for run in runs for axis, _ in run.values if "." in axis}
    for field in fields:
        if field in axes:
            return (f"--override: {field} is an axis of the sweep's grid (its values name the "
                    f"runs); nothing was run: use --only to pick values, or edit the grid")
    grid = list(grid) or list(runs)
    if not fields or not any("." not in axis for run in grid for axis, _ in run.values):
        return None
    cache: Dict[str, Any] = {}
    built: Dict[Any, Any] = {}  # (arg, overrides) -> the ConfigDict, None if it fails

    def config_of(arg: str, overrides: Tuple[Tuple[str, Any], ...]) -> Any:
        if (arg, overrides) not in built:
            try:
                built[arg, overrides] = _overridden_config_dict(config_path, arg, overrides,
                                                                cache)
            except Exception:  # noqa: BLE001 - bad_override_fields' to report
                built[arg, overrides] = None
        return built[arg, overrides]

    def refusal(field: str, arg_axes: Sequence[str]) -> str:
        axes_text = ("axis " if len(arg_axes) == 1 else "axes ") + ", ".join(arg_axes)
        return (f"--override: {field} is set by the sweep's grid (its argument {axes_text}, "
                f"whose values name the runs); nothing was run: use --only to pick values, or "
                f"edit the grid")

    for run in runs:
        mine = config_of(run.arg, run.overrides)
        for axis, value in [(a, v) for a, v in run.values if "." not in a]:
            others = [part for part in run.arg.split(",") if part.partition("=")[0] != axis]
            probes = [",".join(others)]  # the file's default for the axis
            if isinstance(value, bool):
                probes.append(",".join(others + [f"{axis}={not value}"]))
            elif isinstance(value, (int, float)):  # another value: does the field follow it?
                probes.append(",".join(others + [f"{axis}={format_value(value * 2 + 1)}"]))
            elif isinstance(value, str):
                probes += [",".join(others + [f"{axis}={other}"]) for other in
                           _other_text_values(config_path, others, axis, value, run.overrides,
                                              cache)]
            for probe in probes:
                other = config_of(probe, run.overrides)
                if mine is None or other is None:
                    continue
                for field in fields:
                    if _field_text(mine, field) != _field_text(other, field):
                        return refusal(field, [axis])
    for field in fields:  # e.g. two text values the file has no default between
        values = {_field_text(config_of(run.arg, run.overrides), field) for run in grid}
        if len(values - {None}) > 1:
            varying = collections.defaultdict(set)
            for run in grid:
                for a, v in run.values:
                    varying[a].add(format_value(v))
            return refusal(field, sorted(a for a, vs in varying.items()
                                         if "." not in a and len(vs) > 1))
    return None


def identical_finished_run(run: Run, config_path: str, roots: Sequence[str],
                           extra_overrides: Sequence[Tuple[str, Any]] = (),
                           cache: Optional[Dict[str, Any]] = None) -> Optional[str]:
    """A finished run under ``roots`` that trained exactly what ``run`` would, or ``None``.

    ``run``'s experiment config (:func:`resolved_config`: its config file, argument string,
    the grid's overrides and ``extra_overrides``) must equal the config the source's trainer
    recorded at every one of its invocations (``invocations.jsonl``): every model, data,
    optimizer, train and mesh field, the seed and the corpus path included (the corpus is
    compared by path, not by content). The config files may differ
    (``configs/table7.py:host=gdn,route=none,...`` and ``configs/table2.py:arch=gdn,
    stack=hybrid,...`` build the same experiment). Sources that are not finished or were
    themselves reused are not candidates. The code version is not compared: the source may
    come from an older commit (:func:`reuse_records` records it).

    Args:
      run: the run about to be launched.
      config_path: its training config file.
      roots: other sweeps' root directories (missing ones are skipped).
      extra_overrides: the ``--override`` pairs of this call.
      cache: loaded config modules by path, shared between calls.

    Returns:
      The source run directory (absolute), the first match in ``roots`` order and name order.
    """
    cache = {} if cache is None else cache
    mine = None
    for root in roots:
        for other in recorded_runs(root):
            src = os.path.abspath(run_dir(root, other))
            try:
                with open(os.path.join(src, RUN_RECORD)) as f:
                    if json.load(f).get(REUSED_KEY):
                        continue
            except (OSError, ValueError):
                continue
            if run_state(src).status != Status.FINISHED:
                continue
            recorded = [r.get("config") for r in read_jsonl(os.path.join(src, "invocations.jsonl"))]
            if not recorded:
                continue
            if mine is None:
                mine = resolved_config(config_path, run.arg,
                                       tuple(run.overrides) + tuple(extra_overrides), cache)
                if mine is None:
                    return None
            if all(_same_training(config, mine) for config in recorded):
                return src
    return None


# Experiment options added since configs were first recorded for reuse that do not change what
# a run trains on once it runs (a limit it passed): a recorded config without one matches any
# value of it (:func:`_same_training`, :func:`config_changes`).
_OPTIONS_ADDED_SINCE_RECORDS = (("data", "max_bad_fraction"),)
# Experiment options added since configs were first recorded that do change the training, each
# with the value that trains as the code did before the option existed: a recorded config
# without one holds that value, and no other (:func:`_options_before_records`). (The sweeps'
# records of 2026-12-03 lack the three: sweeps/lr_scan's first runs.)
_OPTION_VALUES_BEFORE_RECORDS = (
    (("model", "lightning", "alibi_max_bias"), 8.0),  # the b that was fixed before it
    (("optim", "flatten"), False),  # per-leaf AdamW updates
    (("train", "loss_chunk_size"), None),  # the plain LM head and cross-entropy
)


def _options_before_records(recorded: dict) -> dict:
    """``recorded`` (a config of ``invocations.jsonl``) with every option of
    ``_OPTION_VALUES_BEFORE_RECORDS`` that its section lacks set to its value before the option
    (a section that is not a dict is left as it is)."""
    out = json.loads(json.dumps(recorded))
    for path, value in _OPTION_VALUES_BEFORE_RECORDS:
        node = out
        for part in path[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and path[-1] not in node:
            node[path[-1]] = value
    return out


def _same_training(recorded: Any, mine: dict) -> bool:
    """Whether a recorded config (``invocations.jsonl``) equals ``mine``, an option of
    ``_OPTIONS_ADDED_SINCE_RECORDS`` that ``recorded`` lacks left out of the comparison, one of
    ``_OPTION_VALUES_BEFORE_RECORDS`` taken as its value before the option."""
    if not isinstance(recorded, dict):
        return False
    recorded = _options_before_records(recorded)
    for section, key in _OPTIONS_ADDED_SINCE_RECORDS:
        if (isinstance(recorded.get(section), dict) and key not in recorded[section]
                and isinstance(mine.get(section), dict)):
            mine = {**mine, section: {k: v for k, v in mine[section].items() if k != key}}
    return recorded == mine


def reuse_identical_runs(runs: Sequence[Run], root: str, *, config_path: str,
                         train_script: str, python: str = sys.executable,
                         extra_overrides: Sequence[Tuple[str, Any]] = (),
                         roots: Sequence[str] = (),
                         print_fn: Callable[[str], None] = print) -> Dict[str, str]:
    """Gives every run of ``runs`` not started under ``root`` the records of an identical
    finished run under ``roots`` (:func:`identical_finished_run`, :func:`reuse_records`), all
    before any launch (so a deadline or ``max_runs`` does not keep one from it).

    Args:
      runs: the sweep's runs.
      root: this sweep's directory; it is skipped if ``roots`` names it (its own runs would
        count twice in its ranking and seed spread).
      config_path, train_script, python, extra_overrides: :func:`command`'s.
      roots: other sweeps' root directories.
      print_fn: one line per reused run.

    Returns:
      ``{run name: source run directory}``.
    """
    here = os.path.realpath(root)
    roots = [r for r in roots if os.path.realpath(r) != here]
    out: Dict[str, str] = {}
    if not roots:
        return out
    cache: Dict[str, Any] = {}
    for run in runs:
        workdir = run_dir(root, run)
        if run_state(workdir).status != Status.NOT_STARTED:
            continue
        source = identical_finished_run(run, config_path, roots, extra_overrides, cache)
        if source is None:
            continue
        cmd = command(run, config_path=config_path, workdir=workdir, train_script=train_script,
                      python=python, extra_overrides=extra_overrides)
        reuse_records(source, workdir, run, cmd)
        out[run.name] = source
        print_fn(f"--- {run.name}: the same training as the finished run {source}; its "
                 f"records copied, not run again")
    return out


def reuse_records(source: str, workdir: str, run: Run, cmd: Sequence[str]) -> None:
    """Gives ``run`` the records of the finished run ``source`` (:data:`RECORD_FILES`, no
    checkpoints) in ``workdir``, so that it counts as finished with the source's metrics.

    The files are copied into a temporary directory that then replaces ``workdir`` (a copy cut
    half-way never looks finished); ``run``'s own ``sweep_run.json`` names the source
    (``"reused_from"``) and the git commit it was trained at (``"reused_commit"``). A
    ``workdir`` that holds files already (none of a run: :func:`run_state` said not started)
    is kept aside as ``<workdir>.restarted-<time>``.

    Args:
      source: a finished run's directory (:func:`identical_finished_run`).
      workdir: ``run``'s directory under this sweep's root.
      run: the run.
      cmd: the trainer command it would have run (:func:`command`), recorded.

    Raises:
      OSError: if ``workdir`` or its temporary sibling cannot be written.
    """
    invocations = read_jsonl(os.path.join(source, "invocations.jsonl"))
    commit = invocations[-1].get("git") if invocations else None
    tmp = f"{workdir}.reuse-tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    for name in RECORD_FILES:
        if name != RUN_RECORD and os.path.exists(os.path.join(source, name)):
            shutil.copy2(os.path.join(source, name), os.path.join(tmp, name))
    with open(os.path.join(tmp, RUN_RECORD), "w") as f:
        json.dump({"name": run.name, "values": [list(p) for p in run.values],
                   "group": run.group, "seed": run.seed, "arg": run.arg,
                   "overrides": [list(p) for p in run.overrides], "command": list(cmd),
                   REUSED_KEY: source, "reused_commit": commit}, f, indent=2)
    if os.path.isdir(workdir):
        if os.listdir(workdir):
            _set_aside(workdir)
        else:
            os.rmdir(workdir)
    os.replace(tmp, workdir)


def conflicts(runs: Sequence[Run], root: str, local_args: Sequence[str] = ()) -> List[str]:
    """Runs whose directory holds a run of other settings (a changed fixed argument or
    override under the same run name, e.g. another ``muon_lr`` into the same root).

    Skipping such a finished run, or resuming such a partial one (the trainer compares only
    the model and data options), would mix two experiments under one name.

    Args:
      runs: the runs about to be run.
      root: the sweep directory.
      local_args: argument names not compared (machine-local paths).

    Returns:
      One line per conflicting run: its name and what differs (recorded -> now).
    """
    out = []
    for run in runs:
        try:
            with open(os.path.join(run_dir(root, run), RUN_RECORD)) as f:
                record = json.load(f)
        except (OSError, ValueError):
            continue
        old_arg, new_arg = _arg_dict(record.get("arg", "")), _arg_dict(run.arg)
        diffs = [f"argument {k}: {old_arg.get(k)!r} -> {new_arg.get(k)!r}"
                 for k in sorted(set(old_arg) | set(new_arg))
                 if k not in local_args and old_arg.get(k) != new_arg.get(k)]
        old_overrides = {k: v for k, v in record.get("overrides", [])}
        new_overrides = json.loads(json.dumps(dict(run.overrides)))
        diffs += [f"override {k}: {old_overrides.get(k)!r} -> {new_overrides.get(k)!r}"
                  for k in sorted(set(old_overrides) | set(new_overrides))
                  if old_overrides.get(k) != new_overrides.get(k)]
        if diffs:
            out.append(f"{run.name}: {'; '.join(diffs)}")
    return out


# Fields an ``--override`` may change between calls on one root without changing what a run
# trains or what its records measure: where it stops this call (the trainer's own limit; the
# next call resumes), memory (gradient accumulation, rematerialisation) and what is kept on disk.
# A change of any other field makes a run's records another experiment's
# (:func:`changed_overrides`).
RESUME_FREE_FIELDS = ("train.max_steps_per_run", "train.micro_batch_size", "train.tensorboard",
                      "train.keep_checkpoints", "train.checkpoint_every", "model.remat",
                      "model.remat_policy", "model.split_projections", "model.swiglu_packed",
                      "model.norm_implementation")


def _flag_value(text: str) -> Any:
    """A ``--config.<field>=`` text as a value to compare (``1e-3`` equals ``0.001``, ``64``
    equals ``64.0``, ``true`` / ``false`` in any case equal ``True`` / ``False``, as the
    trainer's boolean flags read them); a text that is no Python literal stays itself."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text


def _config_flags(cmd: Sequence[str]) -> Dict[str, Any]:
    """``{field: value}`` of a trainer command's ``--config.<field>=<value>`` flags, the last
    of a field winning (as the trainer applies them: the sweep's overrides, then
    ``--override``'s)."""
    out: Dict[str, Any] = {}
    for item in cmd:
        if item.startswith("--config.") and "=" in item:
            field, _, value = item[len("--config."):].partition("=")
            out[field] = _flag_value(value)
    return out


def _comparable(value: Any) -> Any:
    """A config value as :func:`changed_overrides` compares it (lists as tuples)."""
    if isinstance(value, (list, tuple)):
        return tuple(_comparable(v) for v in value)
    return value


def _config_default(config_path: str, arg: str, field: str, cache: Dict[str, Any]) -> Any:
    """``field``'s value in the training config's ``get_config(arg)`` (no ``--config.``
    flag), or :data:`_MISSING` when the file, ``get_config`` or the field cannot be read."""
    try:
        if arg not in cache:
            cache[arg] = _load_config_file(config_path).get_config(arg or None)
        node = cache[arg]
        for part in field.split("."):
            node = node[part]
    except Exception:  # noqa: BLE001 - shown as unset; compared as given
        return _MISSING
    if isinstance(node, ml_collections.ConfigDict):
        return _MISSING
    return _comparable(node)


def changed_overrides(runs: Sequence[Run], root: str, *, config_path: str, train_script: str,
                      extra_overrides: Sequence[Tuple[str, Any]] = (),
                      free_fields: Sequence[str] = RESUME_FREE_FIELDS,
                      retry_failed: bool = False) -> List[str]:
    """Runs with a directory under ``root`` whose last launch set a config field to another
    value than this call would (a changed ``--override``, e.g. ``model.d_model=32`` on a
    root trained with 64, or ``train.total_steps``).

    Such a finished (or failed) run would be skipped and reported beside this call's command
    as if it had trained with its values, and a partial one resumed into a mixed run. The
    values compared are the ``--config.<field>`` flags of the trainer command the run's
    ``sweep_run.json`` recorded at its last launch (or when its records were reused) and of
    the command this call would build (:func:`command`): the grid's overrides and
    ``extra_overrides``, the last of a field winning; a field one side does not set counts
    with its value in the training config file (``get_config(arg)``), so that giving a
    field its default explicitly changes nothing. ``free_fields``
    (:data:`RESUME_FREE_FIELDS`) are not compared; neither are runs without a record or
    whose record has no command, nor the argument string, which :func:`conflicts` compares,
    nor a run this call would start over (not finished, no checkpoint, and not a failed one
    skipped: :func:`execute` sets its records aside). An unchanged call (a resume,
    ``--only``) finds nothing.

    Args:
      runs: the runs of this call.
      root: the sweep directory.
      config_path, train_script, extra_overrides: :func:`command`'s.
      free_fields: fields that may change between calls.
      retry_failed: failed runs are launched again (``--retry_failed``).

    Returns:
      One line per such run: ``"<name>: <field> <old> -> <new>; ..."`` (a value of the config
      file marked ``(default)``; ``unset`` when it has none).
    """
    out, defaults = [], {}
    for run in runs:
        workdir = run_dir(root, run)
        try:
            with open(os.path.join(workdir, RUN_RECORD)) as f:
                recorded = json.load(f).get("command")
        except (OSError, ValueError, AttributeError):
            continue
        if not isinstance(recorded, list):
            continue
        if starts_over(workdir, retry_failed):
            continue  # started over from nothing: no old settings in what it will report
        old = _config_flags(recorded)
        new = _config_flags(command(run, config_path=config_path, workdir=workdir,
                                    train_script=train_script,
                                    extra_overrides=extra_overrides))
        diffs = []
        for field in sorted(set(old) | set(new)):
            if field in free_fields:
                continue
            sides = []
            for flags_ in (old, new):
                if field in flags_:
                    sides.append((_comparable(flags_[field]), ""))
                else:
                    sides.append((_config_default(config_path, run.arg, field, defaults),
                                  " (default)"))
            (a, a_note), (b, b_note) = sides
            if a != b:
                diffs.append(f"{field} {_shown(a, a_note)} -> {_shown(b, b_note)}")
        if diffs:
            out.append(f"{run.name}: {'; '.join(diffs)}")
    return out


def starts_over(workdir: str, retry_failed: bool = False) -> bool:
    """Whether a call would start the run in ``workdir`` over from nothing, its records set
    aside (:func:`execute`): not finished, no checkpoint step, and not a failed run that the
    call skips (``retry_failed`` false). Its old records then report nothing of it."""
    state = run_state(workdir)
    return (state.status != Status.FINISHED and state.step == 0
            and (retry_failed or state.status != Status.FAILED))


# Fields of a run's recorded experiment config that may differ from what its training config
# resolves to now without its records standing for another experiment (:func:`config_changes`):
# the settings an ``--override`` may change between calls (:data:`RESUME_FREE_FIELDS`: this
# machine's, and how the same parameters' products are computed with the same values,
# lattn_jax.train._RESUMABLE_MODEL_OPTIONS' remat, split_projections, swiglu_packed and
# norm_implementation), and a limit on unreadable records a run passed
# (_RESUMABLE_DATA_OPTIONS' max_bad_fraction).
CONFIG_FREE_FIELDS = RESUME_FREE_FIELDS + ("data.max_bad_fraction",)
_MAX_SHOWN_FIELDS = 3  # fields named per run in config_changes' lines


def _invocation_args(invocation: Mapping[str, Any]) -> Dict[str, str]:
    """The argument string of a trainer invocation's ``--config=<file>:<arg>`` (its ``argv``
    in ``invocations.jsonl``) as ``{name: value}``; ``{}`` without one."""
    argv = invocation.get("argv")
    for item in argv if isinstance(argv, list) else ():
        if isinstance(item, str) and item.startswith("--config=") and ".py:" in item:
            return _arg_dict(item.partition(".py:")[2])
    return {}


def _relocated(value: Any, old: str, new: str) -> Any:
    """``value`` (a recorded config or part of it) with every string that is the path ``old``
    or lies under it moved to ``new`` (``/a/corpus/train`` -> ``/b/corpus/train``)."""
    if isinstance(value, dict):
        return {k: _relocated(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_relocated(v, old, new) for v in value]
    if isinstance(value, str) and old and (value == old
                                           or value.startswith(old.rstrip("/") + "/")):
        return new + value[len(old):]
    return value


def config_changes(runs: Sequence[Run], root: str, *, config_path: str,
                   extra_overrides: Sequence[Tuple[str, Any]] = (),
                   local_args: Sequence[str] = (), free_fields: Sequence[str] = CONFIG_FREE_FIELDS,
                   cache: Optional[Dict[str, Any]] = None) -> Dict[str, str]:
    """Runs under ``root`` whose trainer recorded another experiment config, at any of its
    invocations, than the one the training config resolves to for them now
    (:func:`resolved_config`): the config file (or a file it imports, ``configs/common.py``)
    was edited since they ran, e.g. the warm-up share or the model recipe.

    :func:`conflicts` and :func:`changed_overrides` compare the recorded command, which an
    edited file leaves as it was; skipped as finished, or resumed, such runs would report
    another experiment under this one's names. Compared: every field of each invocation's
    ``config`` in ``invocations.jsonl`` (also records reused from another sweep) with the
    config this call would give the trainer (the grid's overrides and ``extra_overrides``),
    except ``free_fields`` (:data:`CONFIG_FREE_FIELDS`); a path under a ``local_args``
    argument's value at that invocation (its ``--config=<file>:<arg>``, else the
    ``sweep_run.json`` argument string) counts as the same path under its value now; an option
    that the recorded config lacks counts as its value before it existed
    (``_OPTION_VALUES_BEFORE_RECORDS``), or, for ``_OPTIONS_ADDED_SINCE_RECORDS``, as equal.
    Runs without invocations, and runs whose config does not resolve now (its trainer would
    stop on it: a local path missing on this machine, a refused value) are not compared.

    Args:
      runs: the runs to compare (those without a directory are skipped).
      root: the sweep directory.
      config_path: the training config file.
      extra_overrides: the ``--override`` pairs of this call.
      local_args: argument names whose values are machine-local paths (``corpus``).
      free_fields: dotted fields not compared.
      cache: loaded config modules by path, shared between calls (:func:`resolved_config`).

    Returns:
      ``{run name: "<field> <recorded> -> <now>; ..."}`` in ``runs``' order, at most
      ``_MAX_SHOWN_FIELDS`` fields named (``"; and N more"``), a field's values from the first
      invocation that differs in it (``unset`` where one side lacks it).
    """
    cache = {} if cache is None else cache
    out: Dict[str, str] = {}
    for run in runs:
        workdir = run_dir(root, run)
        invocations = [r for r in read_jsonl(os.path.join(workdir, "invocations.jsonl"))
                       if isinstance(r, dict) and isinstance(r.get("config"), dict)]
        if not invocations:
            continue
        mine = resolved_config(config_path, run.arg,
                               tuple(run.overrides) + tuple(extra_overrides), cache)
        if mine is None:
            continue
        try:
            with open(os.path.join(workdir, RUN_RECORD)) as f:
                run_arg = _arg_dict(str(json.load(f).get("arg", "")))
        except (OSError, ValueError, AttributeError):
            run_arg = {}
        now_args = _arg_dict(run.arg)
        diffs: Dict[str, Tuple[Any, Any]] = {}
        for invocation in invocations:
            recorded = _options_before_records(invocation["config"])
            then_args = {**run_arg, **_invocation_args(invocation)}
            for name in local_args:
                if then_args.get(name) and now_args.get(name):
                    recorded = _relocated(recorded, then_args[name], now_args[name])
            for field, a, b in records.field_diffs(recorded, mine, missing=_MISSING):
                added = tuple(field.split(".")) in _OPTIONS_ADDED_SINCE_RECORDS and a is _MISSING
                if field not in free_fields and not added and field not in diffs:
                    diffs[field] = (a, b)
        if diffs:
            shown = [f"{field} {_shown(a, '')} -> {_shown(b, '')}"
                     for field, (a, b) in list(diffs.items())[:_MAX_SHOWN_FIELDS]]
            more = len(diffs) - _MAX_SHOWN_FIELDS
            out[run.name] = "; ".join(shown + ([f"and {more} more"] if more > 0 else []))
    return out


def _shown(value: Any, note: str) -> str:
    """A value in :func:`changed_overrides`' lines: its repr and ``note``, or ``unset``."""
    return "unset" if value is _MISSING else f"{value!r}{note}"


def sweep_name(config: Mapping[str, Any], root: str) -> str:
    """The sweep's name: ``config.name``, else the root's base name (as
    :func:`lattn_jax.sweep_report.build` names it)."""
    return config.get("name", os.path.basename(os.path.abspath(root)))


def check_root(root: str, config: Mapping[str, Any], *, report_only: bool = False) -> None:
    """Refuses a ``root`` that already holds another sweep (or, for ``report_only``, none).

    Two sweeps in one root overwrite each other's results pages and mix their groups in one
    ranking (the report lists every run under the root); ``train.py`` refuses the analogous
    workdir of another run. The same sweep again (to resume, ``--retry_failed``) passes. The
    root's sweep is the name ``<root>/results.json`` records, and, should that file be gone,
    the names of the invocations in ``<root>/sweep.jsonl`` (recorded since 2026-12-03; older
    lines have none).

    Args:
      root: the sweep directory (need not exist, unless ``report_only``).
      config: the sweep config about to run (:func:`sweep_name`).
      report_only: the call only rebuilds the results of an existing sweep
        (``--report_only``): a ``root`` that does not exist is refused (a mistyped path would
        otherwise be created, holding an empty report).

    Raises:
      SweepConfigError: naming both sweeps, the root and the file that names the other one;
        a ``root`` that exists and is not a directory, or cannot be written or made
        (:func:`lattn_jax.records.unwritable_dir`); for ``report_only``, a ``root`` that
        does not exist; or a ``root`` that is another kind of run's directory (a HALO
        pipeline's workdir: its ``config.json`` has no ``model`` section; a training run's
        workdir: a ``config.json`` with a ``model`` section, or the trainer's lock, records,
        ``checkpoints/`` or ``metrics.jsonl``, also of a run stopped before its first
        checkpoint), by the check ``train.py`` makes of its ``--workdir``
        (:func:`lattn_jax.config.saved_training_config`), naming ``--report_only`` when set
        and the file; or a sweep's ``runs/`` folder given as the root (the extracted
        ``records.tar.gz`` holds ``runs/``: its parent is the root).
    """
    if os.path.exists(root) and not os.path.isdir(root):
        raise SweepConfigError(f"--root={root} exists and is not a directory")
    problem = records.unwritable_dir(root)
    if problem:
        raise SweepConfigError(f"--root={root}: {problem} (nothing was written)")
    if report_only and not os.path.exists(root):
        raise SweepConfigError(f"--root={root}: no such directory (--report_only rebuilds the "
                               f"results of an existing sweep; nothing was created)")
    if (any(os.path.lexists(os.path.join(root, name))
            for name in ("config.json", "checkpoints", TRAINER_LOCK))
            or _has_trainer_records(root)):  # a HALO pipeline's or a training run's workdir
        from lattn_jax import config as config_lib  # noqa: PLC0415 (jax, only for this check)
        try:
            config_lib.saved_training_config(
                root, flag="--root (nothing was written)", writer="sweep",
                consequence=(f"--report_only would write the sweep's results files into "
                             f"{root}" if report_only else
                             f"the sweep would write its runs and results into {root}"))
        except config_lib.ConfigError as e:
            raise SweepConfigError(str(e)) from None
    inner = _run_folders(root)
    if inner and not os.path.isdir(os.path.join(root, RUNS_DIR)):  # e.g. <records>/runs
        raise SweepConfigError(
            f"--root={root} is a sweep's {RUNS_DIR}/ folder, not its root ({inner[0]} in it "
            f"has {RUN_RECORD}): give its parent, {os.path.dirname(os.path.abspath(root))} "
            f"(nothing was written)")
    name = sweep_name(config, root)
    recorded = []
    with contextlib.suppress(OSError, ValueError, AttributeError):  # none, or not a record
        with open(os.path.join(root, "results.json")) as f:
            recorded.append((json.load(f).get("sweep"), "results.json"))
    recorded += [(r.get("sweep"), "sweep.jsonl")
                 for r in read_jsonl(os.path.join(root, "sweep.jsonl")) if isinstance(r, dict)]
    for other, source in recorded:
        if other is not None and other != name:
            raise SweepConfigError(
                f"--root {root} holds the results of sweep {other!r}, not {name!r} (its "
                f"{source}); use another --root for {name!r}")


def _run_folders(root: str) -> List[str]:
    """The folders directly in ``root`` that hold a run's ``sweep_run.json`` (sorted)."""
    with contextlib.suppress(OSError):
        return sorted(n for n in os.listdir(root)
                      if os.path.isfile(os.path.join(root, n, RUN_RECORD)))
    return []


def missing_local_paths(runs: Sequence[Run], local_args: Sequence[str] = ()) -> List[str]:
    """The machine-local path arguments of ``runs`` that do not exist on this machine.

    A missing corpus makes every run fail the same way a few seconds in (2026-12-03: 16 runs,
    each with ``error: data.paths: no such file or directory``); the sweep binary checks these
    first and ends with one error instead.

    Args:
      runs: the runs about to be run.
      local_args: argument names holding machine-local paths (the config's ``local_args``).

    Returns:
      One ``name=value`` per distinct missing path, in the order first met.
    """
    out = []
    for run in runs:
        for name, value in _arg_dict(run.arg).items():
            item = f"{name}={value}"
            if name in local_args and not os.path.exists(value) and item not in out:
                out.append(item)
    return out


def bad_override_fields(runs: Sequence[Run], config_path: str,
                        extra_overrides: Sequence[Tuple[str, Any]] = ()) -> List[str]:
    """The override fields of ``runs`` that their training config lacks or cannot take.

    A misspelled ``--override`` (``train.total_stepz``) made every run fail a few seconds in,
    each leaving a run directory; the sweep binary checks the fields first. The training config
    file is loaded here (its ``get_config(arg)``, once per distinct argument string); each field
    must exist, and its value must parse as the field's type (int, float, bool, tuple) the way
    ml_collections' config flags parse it; other values are the trainer's to check.

    Args:
      runs: the runs about to be run.
      config_path: the training config file (``sweep.train_config``).
      extra_overrides: ``(field, value)`` pairs added to every run (``--override``).

    Returns:
      One line per distinct problem, in the order first met, naming where the name came from
      (``"the sweep's grid axis"``, ``"the sweep config's overrides:"`` or ``"--override:"``):
      ``"<where> <field>: no such field in <file> (<n> of <N> runs, e.g. <file>:<arg>)"`` (or
      ``is a section, not a field``, or ``cannot take '<value>' (<type>: ...)`` for an int,
      float, bool or tuple field) or, when ``get_config`` itself raises (a misspelled argument
      axis or ``arg``), ``"the sweep's grid (argument axes, arg): <file>:<arg>: <error>"``.
    """
    module = _load_config_file(config_path)
    name = os.path.basename(config_path)
    configs: Dict[str, Any] = {}
    errors: List[str] = []
    # (where, field, problem) -> [number of runs, first run's arg, hint]
    bad: Dict[Tuple[str, str, str], List[Any]] = {}
    for run in runs:
        if run.arg not in configs:
            try:
                configs[run.arg] = module.get_config(run.arg or None)
            except Exception as e:  # noqa: BLE001 - reported as one line
                configs[run.arg] = None
                errors.append(f"the sweep's grid (argument axes, arg): {name}:{run.arg}: {e}")
        cfg = configs[run.arg]
        if cfg is None:
            continue
        axes = {axis for axis, _ in run.values}
        sources = [("the sweep's grid axis" if field in axes else
                    "the sweep config's overrides:", field, value)
                   for field, value in run.overrides]
        for where, field, value in sources + [("--override:", f, v) for f, v in extra_overrides]:
            node, hint = cfg, ""
            parts = field.split(".")
            for i, part in enumerate(parts):
                try:
                    node = node[part]
                except (KeyError, AttributeError, TypeError, IndexError):
                    hint = _did_you_mean(node, parts, i)
                    node = _MISSING
                    break
            if node is _MISSING:
                problem = "no such field"
            else:
                problem = _override_value_problem(node, format_value(value))
            if problem:
                bad.setdefault((where, field, problem), [0, run.arg, hint])[0] += 1
    lines = [f"{where} {field}: {problem} in {name} ({n} of {len(runs)} runs, e.g. "
             f"{name}:{arg}){hint}" for (where, field, problem), (n, arg, hint) in bad.items()]
    return errors + lines


def _did_you_mean(node: Any, parts: Sequence[str], i: int) -> str:
    """``'; did you mean "a.b.c"?'`` for the field whose part ``parts[i]`` is not a key of
    ``node`` (the section it was looked up in), when a key is close to it (``difflib``, as
    ml_collections suggests for the trainer's ``--config.*``) and the rest of the path exists
    under it; else ``""``."""
    keys = [str(k) for k in node.keys()] if hasattr(node, "keys") else []
    for match in difflib.get_close_matches(parts[i], keys, n=3):
        rest = node[match]
        try:
            for part in parts[i + 1:]:
                rest = rest[part]
        except (KeyError, AttributeError, TypeError, IndexError):
            continue
        return f'; did you mean "{".".join([*parts[:i], match, *parts[i + 1:]])}"?'
    return ""


def _override_value_problem(current: Any, text: str) -> Optional[str]:
    """Why the trainer's ``--config.<field>=<text>`` would fail on a field now holding
    ``current``, or ``None``: a section (a ConfigDict) is not a value, and int, float, bool and
    tuple fields parse ``text`` with the parsers ml_collections' config flags use."""
    if isinstance(current, ml_collections.ConfigDict):
        return "is a section, not a field"
    for kind, parser in _flag_parsers():
        if isinstance(current, kind):
            try:
                parser.parse(text)
            except (ValueError, SyntaxError, TypeError) as e:
                return f"cannot take {text!r} ({kind.__name__}: {str(e).strip()[:80]})"
            return None
    return None


_MISSING = object()


def recorded_runs(root: str) -> List[Run]:
    """Runs found in ``<root>/runs/*/sweep_run.json`` (e.g. of an earlier grid of the same
    sweep), sorted by name; directories set aside (``.restarted-``) are not runs."""
    out = []
    base = os.path.join(root, RUNS_DIR)
    try:
        names = sorted(os.listdir(base))
    except FileNotFoundError:
        return out
    for name in names:
        try:
            with open(os.path.join(base, name, RUN_RECORD)) as f:
                record = json.load(f)
        except (OSError, ValueError):
            continue
        if record.get("name") != name:
            continue
        out.append(Run(name=name, values=tuple(tuple(p) for p in record.get("values", [])),
                       arg=record.get("arg", ""),
                       overrides=tuple(tuple(p) for p in record.get("overrides", [])),
                       group=record.get("group", name), seed=record.get("seed")))
    return out


# Per-run files that make up its record (everything but checkpoints and TensorBoard events).
RECORD_FILES = (RUN_RECORD, ATTEMPTS, RUN_LOG, "metrics.jsonl", "console.log",
                "invocations.jsonl", "config.json", "loss.png", THROUGHPUT_ALONE)


RECORDS_ARCHIVE = "records.tar.gz"


def export(root: str, out_dir: str, extra_files: Sequence[str] = (),
           archive: bool = False) -> int:
    """Copies the sweep's records, not its checkpoints, from ``root`` to ``out_dir``.

    For every run directory under ``<root>/runs`` (set-aside ones included) the
    :data:`RECORD_FILES` it has, plus ``extra_files`` of the root (e.g. the results files):
    enough for :mod:`lattn_jax.sweep_report` to rebuild the table, and for a later sweep
    started from a copy of them to skip the finished runs. Copying a finished sweep's records
    back into a fresh ``--root`` on another machine is how a sweep continues there.

    Args:
      root: the sweep's ``--root``.
      out_dir: where the copies go (created).
      extra_files: files of ``root`` copied as they are (missing ones are skipped).
      archive: write the run records as one ``<out_dir>/records.tar.gz`` (members
        ``runs/<run name>/<file>``; unpack with ``tar xzf records.tar.gz -C <new root>``)
        instead of a ``runs/`` tree. Run names hold ``=`` and ``,``, which some transfer
        channels (the GPU machine's return folder) refuse in file names.

    Returns:
      The number of files copied (into the archive or not).
    """
    copied = 0
    base = os.path.join(root, RUNS_DIR)
    names = sorted(os.listdir(base)) if os.path.isdir(base) else []
    records = [(os.path.join(base, name, file), os.path.join(RUNS_DIR, name, file))
               for name in names for file in RECORD_FILES
               if os.path.isfile(os.path.join(base, name, file))]
    os.makedirs(out_dir, exist_ok=True)
    if archive:
        with tarfile.open(os.path.join(out_dir, RECORDS_ARCHIVE), "w:gz") as tar:
            for src, member in records:
                tar.add(src, arcname=member)
    else:
        for src, member in records:
            dst = os.path.join(out_dir, member)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copy2(src, dst)
    copied += len(records)
    for file in extra_files:
        src = os.path.join(root, file)
        if os.path.isfile(src):
            shutil.copy2(src, os.path.join(out_dir, file))
            copied += 1
    return copied
