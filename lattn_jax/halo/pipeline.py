"""The HALO pipeline behind ``experiments/halo_pipeline.py``: the stages in order, then the report.

:func:`run` takes the HALO ConfigDict and the binary's options (:class:`PipelineOptions`, one
field per flag) and does what one invocation does:

1. checks everything it can before any stage runs, and before the workdir is made: the
   config's HALO sections (:func:`lattn_jax.halo.experiment.check_halo_config`), the stages'
   prerequisites, inputs, evaluation files and options (``experiment.check_*``) and, with
   ``markdown``, that the results page can be written (``halo_report.py --output``'s check,
   :func:`lattn_jax.halo.report.check_page_path`). A refusal with no workdir raises
   :class:`PipelineError`; with an existing workdir it is also recorded in ``pipeline.jsonl``
   (below) and no stage runs;
2. runs the requested stages in pipeline order (:data:`lattn_jax.halo.experiment.STAGES`):
   a stage that finished (``<workdir>/<stage>/done.json``) is skipped; no stage starts after
   the deadline or with less than ``min_stage_s`` left; a stage that stops early (deadline,
   SIGTERM, SIGHUP, Ctrl-C: :class:`Deadline`) ends the run. Each stage prints its wall time;
3. appends the invocation's command line, start time, wall time, per-stage times and status
   to ``<workdir>/pipeline.jsonl`` (the results page lists them,
   :func:`lattn_jax.halo.report.render_markdown`) and, with ``markdown``, renders the page:
   for every invocation that got past the checks of step 1 (complete, deadline, a signal, a
   failed stage, a second Ctrl-C, any other error), and for a refusal in step 1 when the
   workdir exists. Not recorded (nothing is written, even in an existing workdir): an unknown
   stage, a config without HALO sections, a refusal in step 1 when the workdir does not
   exist, a workdir that cannot be made, and whatever the binary refuses before calling
   :func:`run` (its flags, a config file that cannot be read);
4. prints where the run ended, and returns the exit status (0 complete, :data:`EXIT_DEADLINE`,
   :data:`EXIT_INTERRUPTED`) or raises :class:`PipelineError` (the one error line).

Compiled programs go to a persistent cache (default ``<workdir>/jax_cache``), so that a run
split over two invocations does not compile the same programs twice.
"""

import dataclasses
import datetime
import math
import os
import shlex
import time
from typing import Any, Callable, List, Optional, Sequence, Tuple

import jax

from lattn_jax import config as config_lib
from lattn_jax import records
from lattn_jax import train as train_lib
from lattn_jax.halo import experiment
from lattn_jax.halo import report as report_lib

# Exit status of a run that the deadline, SIGTERM or one Ctrl-C stopped: run it again.
EXIT_DEADLINE = 3
# The shell's status for SIGINT: a second Ctrl-C, nothing saved.
EXIT_INTERRUPTED = 130
# The invocation log in the workdir (one JSON object per line, appended).
LOG_FILE = "pipeline.jsonl"


class PipelineError(Exception):
    """An error that ends the pipeline; ``str(e)`` is the message after ``"error: "``."""


@dataclasses.dataclass(frozen=True)
class PipelineOptions:
    """The options of one pipeline invocation (the binary's flags, one field each).

    Attributes:
      workdir: directory of the pipeline's stages (made if it does not exist).
      stages: stages to run; always run in pipeline order, whatever the order given.
      deadline_s: stop cleanly this many seconds (wall clock) after the start; ``None``: never.
      min_stage_s: do not start a stage with less than this many seconds left before the
        deadline.
      markdown: also render the results page at this path; ``None``: no page.
      compilation_cache: persistent JAX compilation cache directory; ``None``:
        ``<workdir>/jax_cache``; ``""``: none.
    """

    workdir: str
    stages: Sequence[str] = experiment.STAGES
    deadline_s: Optional[float] = None
    min_stage_s: float = 0.0
    markdown: Optional[str] = None
    compilation_cache: Optional[str] = None


class Deadline:
    """The deadline the stages compare with ``time.time() >= deadline``.

    It is ``at`` (seconds since the epoch; never, for ``None``), or "now" once SIGTERM or
    Ctrl-C arrived (``watcher``, the trainer's :class:`lattn_jax.train.PreemptionWatcher`), so
    that a signal stops the run through the deadline's path: a checkpoint after the current
    step, between layers, parts. ``stop_reason`` says which (the stages' stop line names it).

    Args:
      at: the deadline in seconds since the epoch, or ``None`` for no deadline.
      watcher: an object with ``requested`` (bool) and ``signal_name`` (str) attributes.
    """

    def __init__(self, at: Optional[float], watcher: Any):
        self.at, self.watcher = (math.inf if at is None else at), watcher

    def value(self) -> float:
        """The deadline in seconds since the epoch: ``-inf`` once a signal arrived, ``inf``
        without a deadline."""
        return -math.inf if self.watcher.requested else self.at

    @property
    def stop_reason(self) -> Optional[str]:
        """``"stopped by SIGTERM"`` (or SIGINT) once a signal arrived, else ``None`` (the
        deadline, if it has passed)."""
        return f"stopped by {self.watcher.signal_name}" if self.watcher.requested else None

    def __float__(self):
        return self.value()

    def __le__(self, t):  # time.time() >= deadline
        return self.value() <= t

    def __lt__(self, t):
        return self.value() < t

    def __ge__(self, t):
        return self.value() >= t

    def __gt__(self, t):
        return self.value() > t

    def __sub__(self, seconds):
        return self.value() - seconds


def _log(msg: str) -> None:
    print(msg, flush=True)


def select_stages(requested: Sequence[str]) -> List[str]:
    """The requested stages in pipeline order (:data:`lattn_jax.halo.experiment.STAGES`).

    Args:
      requested: stage names, in any order.

    Returns:
      The requested stages, each once, in pipeline order.

    Raises:
      PipelineError: a name that is not a stage ("unknown stage(s) [...]; choose from ...").
    """
    unknown = [s for s in requested if s not in experiment.STAGES]
    if unknown:
        raise PipelineError(f"unknown stage(s) {unknown}; choose from {experiment.STAGES}")
    return [s for s in experiment.STAGES if s in requested]


def run_stage(config: Any, workdir: str, stage: str, *,
              print_fn: Callable[[str], None] = _log, stage_flag: str = "--stage") -> int:
    """Runs one stage as ``experiments/halo.py`` does, stopped by a signal as :func:`run`
    stops its stages: SIGTERM, SIGHUP (unless ignored, as under ``nohup``) or one Ctrl-C
    makes the deadline "now" (the trainer's :class:`lattn_jax.train.PreemptionWatcher` and
    :class:`Deadline`), so that the stage checkpoints after its current step (or stops at its
    next safe point), prints one line, and the same command resumes from there.

    Args:
      config: the HALO ConfigDict.
      workdir: the pipeline's directory.
      stage: one of :data:`lattn_jax.halo.experiment.STAGES`.
      print_fn: where the progress lines go (default: stdout, flushed).
      stage_flag: the binary's flag that chose ``stage``, named in a refusal
        (:func:`lattn_jax.halo.experiment.check_prerequisites`).

    Returns:
      The exit status: 0 when the stage ran (as far as ``max_steps_per_run`` lets it), or
      :data:`EXIT_DEADLINE` (3, as the pipeline's) when a signal stopped it.

    Raises:
      ValueError, FileNotFoundError, ConfigError: as :func:`lattn_jax.halo.experiment.run`.
      KeyboardInterrupt: a second Ctrl-C (nothing saved since the last checkpoint).
    """
    with train_lib.PreemptionWatcher(True) as watcher:
        deadline = Deadline(None, watcher)
        experiment.run(config, workdir, stage, print_fn=print_fn, deadline=deadline,
                       stage_flag=stage_flag)
    if not watcher.requested:
        return 0
    print_fn(f"{stage}: {deadline.stop_reason}; run the same command again to resume")
    return EXIT_DEADLINE


def _check(config, options: PipelineOptions,
           stages: Sequence[str]) -> Tuple[Optional[str], Optional[str]]:
    """The checks before any stage: ``(refusal or None, the results page or None)``; the page
    is ``None`` when it is the one that cannot be written."""
    page = options.markdown
    try:
        experiment.check_workdir_kind(options.workdir)  # a stage's folder: before what it lacks
        experiment.check_prerequisites(config, options.workdir, stages, "--stages")
        experiment.check_inputs(config, options.workdir, stages)
        experiment.check_eval_data(config, options.workdir, stages)
        experiment.check_options(config, options.workdir, stages)
        if page:  # halo_report.py --output's check: not after hours of stages
            report_lib.check_page_path(page, "--markdown")
    except (config_lib.ConfigError, FileNotFoundError, ValueError) as e:
        return f"error: {e}", (None if str(e).startswith("cannot write --markdown=") else page)
    return None, page


def run(config: Any, options: PipelineOptions, *, argv: Sequence[str],
        print_fn: Callable[[str], None] = _log) -> int:
    """Runs one pipeline invocation (see the module docstring).

    Args:
      config: the HALO ConfigDict (``configs/halo_*.py``).
      options: the invocation's options.
      argv: the command line (``sys.argv``), recorded in ``pipeline.jsonl``.
      print_fn: where the progress lines go (default: stdout, flushed).

    Returns:
      The exit status: 0 when every requested stage is done, :data:`EXIT_DEADLINE` (3) when
      the deadline, SIGTERM or one Ctrl-C stopped the run, :data:`EXIT_INTERRUPTED` (130)
      after a second Ctrl-C.

    Raises:
      PipelineError: an unknown stage or a config without HALO sections (not recorded), a
        refusal before any stage (recorded only when the workdir exists), a stage that failed
        with a ``ConfigError``, ``FileNotFoundError`` or ``ValueError`` (the message names
        it), or a results page that could not be written; the last three after the record is
        appended (module docstring, step 3: what is recorded).
      OSError: the workdir cannot be made (not recorded).
      BaseException: any other error of a stage, re-raised after the record is appended.
    """
    stages = select_stages(options.stages)
    try:  # e.g. a training config (configs/default.py): it has no HALO sections
        experiment.check_halo_config(config)
    except config_lib.ConfigError as e:
        raise PipelineError(str(e)) from None
    workdir = options.workdir
    # Checked before hours of training, and before the workdir is made.
    refused, page = _check(config, options, stages)  # page: None once refused
    if refused and not os.path.exists(workdir):  # nothing left behind; an existing workdir
        raise PipelineError(refused[len("error: "):])  # records the refusal (below)
    os.makedirs(workdir, exist_ok=True)
    cache = (os.path.join(workdir, "jax_cache") if options.compilation_cache is None
             else options.compilation_cache)
    if cache:
        jax.config.update("jax_compilation_cache_dir", os.path.abspath(cache))
    t_start, started = time.time(), datetime.datetime.now(datetime.timezone.utc)
    watcher = train_lib.PreemptionWatcher(True)  # SIGTERM / Ctrl-C: stop at the deadline's path
    deadline = Deadline(None if options.deadline_s is None else t_start + options.deadline_s,
                        watcher)
    print_fn(f"jax {jax.__version__}, devices {jax.devices()}; stages {stages}; deadline "
             f"{options.deadline_s} s")
    times, status = {}, refused or "complete"
    failed = None  # the stage that raised, named in the one error line
    try:
        watcher.__enter__()
        for stage in ([] if refused else stages):
            failed = stage
            if experiment.is_done(workdir, stage):
                times[stage] = "done before"
                print_fn(f"=== {stage}: already done, skipped")
                continue
            if time.time() >= deadline - options.min_stage_s:
                status = "deadline"
                print_fn(f"=== {stage}: not started, deadline")
                break
            print_fn(f"=== {stage}: start at {time.time() - t_start:.1f} s")
            t0 = time.perf_counter()
            out = experiment.run(config, workdir, stage, print_fn=print_fn, deadline=deadline,
                                 stage_flag="--stages")
            times[stage] = round(time.perf_counter() - t0, 1)
            outcome = "complete" if out["complete"] else "stopped"
            print_fn(f"=== {stage}: {times[stage]} s ({outcome}; {time.time() - t_start:.1f} s "
                     f"since start)")
            if not out["complete"]:
                status = "deadline"
                break
        failed = None
        if status == "deadline" and watcher.requested:
            status = f"stopped by {watcher.signal_name}"
    except (config_lib.ConfigError, FileNotFoundError, ValueError) as e:
        status = f"error: {e}"
    except KeyboardInterrupt:  # a second Ctrl-C: at once, nothing saved since the last save
        status = "interrupted (second Ctrl-C)"
    except BaseException as e:  # recorded, then re-raised with its traceback
        status = f"error: {type(e).__name__}: {e}"
        raise
    finally:
        watcher.__exit__(None, None, None)
        command = "python " + " ".join(shlex.quote(a) for a in argv)
        record = {"command": command, "started": started.isoformat(timespec="seconds"),
                  "wall_s": time.time() - t_start, "stages": times, "status": status}
        records.append_record(os.path.join(workdir, LOG_FILE), record)
        if page:
            try:
                report_lib.write_page(page, report_lib.render_markdown(workdir), "--markdown")
                print_fn(f"wrote {page}")
            except ValueError as e:  # e.g. removed or made read-only during the run
                status = status if status.startswith("error") else f"error: {e}"
    # An error is printed once, on stderr by the binary, naming the stage that raised it; this
    # line only says where the run ended (it repeated the message).
    ended = ("error" + (f" in {failed}" if failed else " before any stage")
             if status.startswith("error") else status)
    again = ("; run the same command again to resume" if status.startswith("stopped")
             else "")
    print_fn(f"pipeline: {ended} after {time.time() - t_start:.1f} s; stage times {times}"
             f"{again}")
    if status == "complete" and "report" in stages:
        print_fn(f"report: {os.path.join(workdir, 'report', 'report.md')}; the results page: "
                 f"python experiments/halo_report.py --workdir={shlex.quote(workdir)}")
    if status.startswith("error"):
        message = status[len("error: "):]
        raise PipelineError(f"{failed} failed: {message}" if failed else message)
    if status.startswith("interrupted"):
        return EXIT_INTERRUPTED
    if status == "deadline" or status.startswith("stopped"):
        return EXIT_DEADLINE
    return 0
