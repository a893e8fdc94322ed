"""Runs a sweep's training runs, one or ``--parallel`` at a time, resumably; writes its results.

Usage::

    python experiments/sweep.py \\
        --config=configs/sweeps/lr_scan_small.py:corpus=/data/prose-llama2 \\
        --root=runs/lr_scan --deadline_s=540
    python experiments/sweep.py --config=configs/sweeps/table2_small.py:tiny --root=/tmp/t2 \\
        --only=arch=gdn,opt=muon          # CPU smoke run of a subset
    python experiments/sweep.py --config=... --root=runs/lr_scan --report_only

Each run is ``experiments/train.py --config=<train_config>:<arg> --workdir=<root>/runs/<name>
--config.<field>=<value>...`` in a subprocess, so a crash, an OOM or a bad option ends that run
(reported in the table with its error line), not the sweep. The same command again continues:
finished runs are skipped, failed ones too (``--retry_failed`` runs them again), a partial one
resumes from its checkpoint (:mod:`lattn_jax.sweep`). ``--deadline_s`` ends the call cleanly:
no run starts with less than ``--min_run_s`` left before its SIGTERM, and the running
trainer gets SIGTERM (the trainer has no time limit of its own; SIGTERM is its preemption
signal: it saves a checkpoint after the current step and exits) ``--stop_margin_s`` before the
deadline; SIGTERM or Ctrl-C to the sweep does the same at once; ``--finish_by_deadline`` (a
machine's last call) also holds back a run that would not finish by then, by the finished runs'
median wall time.
``--parallel=N`` runs up to N trainers at once on the machine (default 1: one after another),
still in the grid's order, the next when one exits; each then gets
``XLA_PYTHON_CLIENT_MEM_FRACTION`` = 0.9/N (0.45 for 2) so that they fit on one GPU together,
unless the environment already sets ``XLA_PYTHON_CLIENT_MEM_FRACTION`` (or
``XLA_CLIENT_MEM_FRACTION``), ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` or
``XLA_PYTHON_CLIENT_ALLOCATOR=platform``; the deadline, ``--min_run_s``, ``--max_runs`` and
``--finish_by_deadline`` apply to each launch, SIGTERM or Ctrl-C stops every trainer in
flight, the console shows each trainer's lines behind ``[<run name>]`` (its own ``sweep.log``
holds them all), and each attempt records its concurrency, which the results mark: tokens/s,
MFU and wall time measured on a shared GPU are not compared with those measured alone.
``--reuse_from=<another sweep's root>`` (repeatable) copies the records of a finished run there
whose training is identical (the experiment config its trainer recorded at every invocation
equals this run's, e.g. Table 7's host ``route=none,seed=42`` and Table 2's
``arch=gdn,stack=hybrid,opt=muon,...,seed=42``) instead of running it again; the runs table
names the source.

After every run, and at the end, ``<root>/results.{md,csv,json}`` and ``curves.png`` are
rewritten from every run directory (:mod:`lattn_jax.sweep_report`); every invocation appends
its command line and outcome to ``<root>/sweep.jsonl``. ``--export=<dir>`` then (also with
``--report_only``) copies the
records and results, without checkpoints, to ``<dir>``: the results files as they are, the
runs' records as ``records.tar.gz`` (``--noexport_archive``: a ``runs/`` tree; run names hold
``=`` and ``,``, which the GPU machine's return folder refuses). A sweep continues on another
machine from them: ``tar xzf records.tar.gz -C <new root>``. Compiled programs are shared
through a persistent cache in ``<root>/jax_cache`` (``--compilation_cache=''``: the
environment's ``JAX_COMPILATION_CACHE_DIR``, if any).

Exit status: 0 when every selected run is finished or failed, 3 when the call stopped before
that (deadline, ``--max_runs``, SIGTERM or Ctrl-C: run the same command again), 1 on a bad flag
or sweep config (one line naming it).
"""

import datetime
import json
import os
import shlex
import signal
import sys
import threading
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _ROOT)

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from lattn_jax import config as config_lib  # noqa: E402
from lattn_jax import sweep  # noqa: E402
from lattn_jax import sweep_report  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Sweep config file.",
                                          lock_config=True)
_ROOT_DIR = flags.DEFINE_string("root", None, "Sweep directory (runs in <root>/runs/<name>).")
_ONLY = flags.DEFINE_multi_string("only", [], "Run only the runs matching this filter: "
                                  "axis=glob conditions joined by commas (all must hold), or a "
                                  "glob on the run name; repeat for alternatives.")
_MAX_RUNS = flags.DEFINE_integer("max_runs", None, "Start at most this many runs (>= 1).",
                                 lower_bound=1)
_DEADLINE = flags.DEFINE_float("deadline_s", None, "End cleanly this many seconds after start "
                               "(> 0).")
flags.register_validator("deadline_s", lambda v: v is None or v > 0, "must be above 0 seconds")
_MIN_RUN = flags.DEFINE_float("min_run_s", 0.0, "Start no run that would train for less than "
                              "this (the time left minus --stop_margin_s).",
                              lower_bound=0.0)
_MARGIN = flags.DEFINE_float("stop_margin_s", 30.0, "SIGTERM to the trainer this long before "
                             "the deadline (and SIGKILL this long after SIGTERM).")
_PARALLEL = flags.DEFINE_integer("parallel", 1, "Trainer subprocesses at once on this "
                                 "machine (>= 1; 1: one after another). Above 1 each trainer "
                                 "gets XLA_PYTHON_CLIENT_MEM_FRACTION=0.9/N unless the "
                                 "environment sets its GPU memory (lattn_jax.sweep."
                                 "parallel_env); the records mark the runs that shared it.")
flags.register_validator("parallel", lambda v: v is not None and v >= 1,
                         "must be at least 1 (trainer subprocesses at once; 1 runs them one "
                         "after another)")
_REPORT_ONLY = flags.DEFINE_bool("report_only", False, "Only rebuild the results from <root> "
                                 "(an existing sweep directory).")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print what the same command would do with "
                             "each selected run (skip, reuse, launch: in which order and which "
                             "at once, or hold back) and its command; writes nothing.")
_RETRY = flags.DEFINE_bool("retry_failed", False, "Run failed runs again.")
_FINISH = flags.DEFINE_bool("finish_by_deadline", False, "Launch or resume only runs that the "
                            "finished runs' median wall time says end before the deadline (a "
                            "machine's last call: a run cut there is lost).")
_REUSE = flags.DEFINE_multi_string("reuse_from", [], "Another sweep's root: a run not started "
                                   "here whose training is identical to a finished run there "
                                   "(the experiment config its trainer recorded) gets its "
                                   "records instead of a launch (e.g. Table 7's host from "
                                   "Table 2).")
_OVERRIDE = flags.DEFINE_multi_string("override", [], "field=value: an extra --config.<field> "
                                      "for every run (this machine's settings, e.g. "
                                      "train.micro_batch_size=8; not in the run names).")
_CACHE = flags.DEFINE_string("compilation_cache", None, "Persistent compilation cache of the "
                             "trainers (default <root>/jax_cache; '' leaves "
                             "JAX_COMPILATION_CACHE_DIR as the environment has it).")
_EXPORT = flags.DEFINE_string("export", None, "Copy the records and results (no checkpoints) "
                              "here at the end.")
_EXPORT_ARCHIVE = flags.DEFINE_bool("export_archive", True, "--export: the runs' records as "
                                    "one records.tar.gz (run names hold '=' and ','), not a "
                                    "runs/ tree.")
flags.mark_flags_as_required(["config", "root"])

EXIT_STOPPED = 3


def _log(msg: str) -> None:
    print(msg, flush=True)


def _overrides():
    out = []
    for text in _OVERRIDE.value:
        field, sep, value = text.partition("=")
        if not sep or not field.strip():
            sys.exit(f"error: --override={text!r}: expected field=value "
                     f"(e.g. train.micro_batch_size=8)")
        out.append((field.strip(), value))
    return out


def _parallel_note(env) -> str:
    """The start line's words on ``--parallel`` (empty for 1): runs at once, and each trainer's
    GPU memory (:func:`lattn_jax.sweep.parallel_env`)."""
    if _PARALLEL.value == 1:
        return ""
    child = sweep.parallel_env(env, _PARALLEL.value)
    if child.get(sweep.MEM_FRACTION_ENV) != env.get(sweep.MEM_FRACTION_ENV):
        memory = f"{sweep.MEM_FRACTION_ENV}={child[sweep.MEM_FRACTION_ENV]} each"
    else:
        memory = "GPU memory as the environment sets it"
    return f"; up to {_PARALLEL.value} runs at once ({memory})"


def parse_flags(argv):
    """Parses flags; a bad sweep config, argument string or ``--config.<field>`` ends with one
    readable line (:func:`lattn_jax.config.parse_flags`, shared with ``train.py``). An unknown
    ``--config.<field>`` also says that a field of every run's experiment config (``train.*``,
    ``model.*``, ...) goes in ``--override=<field>=<value>``: ``--config`` is the sweep's own.

    Raises:
      SystemExit: on any flag or config error.
    """
    return config_lib.parse_flags(argv, unknown_option_hint=_override_hint)


def _override_hint(key, argv):
    """The hint for an unknown ``--config.<key>...`` that is no typo of a sweep field."""
    typed = [a[len("--config."):].split("=", 1) for a in list(argv)[1:]
             if a.startswith((f"--config.{key}=", f"--config.{key}."))]
    field, value = (typed[0] + ["<value>"])[:2] if typed else (key, "<value>")
    return (f"--config is the sweep's config: a field of every run's experiment config goes in "
            f"--override={field}={value}")


def _export(root):
    """``--export``: the records and results of ``root``, no checkpoints (nothing without it)."""
    if _EXPORT.value:
        n = sweep.export(root, _EXPORT.value, extra_files=(
            sweep_report.SWEEP_LOG, sweep_report.RESULTS_MD, sweep_report.RESULTS_CSV,
            sweep_report.RESULTS_JSON, sweep_report.CURVES_PNG), archive=_EXPORT_ARCHIVE.value)
        _log(f"exported {n} files to {_EXPORT.value}")


def _dry_run(runs, root, config, config_path, extra):
    """Prints what the same command without ``--dry_run`` would do with each run
    (:func:`lattn_jax.sweep.plan`): skip, reuse, launch (in which order, which at once) or
    hold back (``--max_runs``, the deadline), with its trainer command."""
    planned = sweep.plan(
        runs, root, config_path=config_path, extra_overrides=extra,
        deadline_s=_DEADLINE.value, min_run_s=_MIN_RUN.value, stop_margin_s=_MARGIN.value,
        max_runs=_MAX_RUNS.value, retry_failed=_RETRY.value, reuse_from=_REUSE.value,
        finish_by_deadline=_FINISH.value, parallel=_PARALLEL.value)
    n = sum(p.action == "launch" for p in planned)
    first = sum(p.at_once for p in planned)
    at_once = (f"; up to {_PARALLEL.value} at once: launch{'es 1-' if first > 1 else ' '}"
               f"{first} at the start, each later one when a trainer exits"
               if _PARALLEL.value > 1 and n > 1 else "")
    _log(f"dry run of sweep {config.get('name', '')}: {len(runs)} run(s) selected; {n} would "
         f"be launched, in this order{at_once}" + (
             "; a launch after the start depends on the time then left before --deadline_s"
             if _DEADLINE.value is not None and n > first else ""))
    for p in planned:
        cmd = sweep.command(p.run, config_path=config_path, workdir=sweep.run_dir(root, p.run),
                            train_script=os.path.join(_ROOT, "experiments", "train.py"),
                            extra_overrides=extra)
        if p.action == "launch":
            when = ("" if _PARALLEL.value == 1 else ", at the start" if p.at_once
                    else ", when a trainer exits")
            what = f"launch {p.launch}: {p.why}{when}"
        else:
            what = {"skip": "skipped: ", "reuse": "would reuse ",
                    "hold": "not launched: "}[p.action] + p.why
        _log(f"{p.run.name}: {p.state.status.value} (step {p.state.step}); {what}\n  "
             + " ".join(shlex.quote(c) for c in cmd))


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    config, root = config_lib.config_flag_value(_CONFIG), _ROOT_DIR.value
    try:
        runs = sweep.select(sweep.expand(config), _ONLY.value)
    except sweep.SweepConfigError as e:
        sys.exit(f"error: {e}")
    config_path = os.path.join(_ROOT, config.train_config)
    if not os.path.isfile(config_path):
        what = "a directory, not a file" if os.path.isdir(config_path) else "no such file"
        sys.exit(f"error: train_config: {what}: {config_path}")
    if not config_path.endswith(".py"):  # importlib finds no loader for it (a traceback)
        sys.exit(f"error: train_config: {config_path} is not a Python config file (.py; "
                 f"configs/, e.g. configs/table2.py)")
    extra = _overrides()
    if _FINISH.value and _DEADLINE.value is None:
        sys.exit("error: --finish_by_deadline needs --deadline_s (the deadline it plans to)")
    for other in _REUSE.value:
        if os.path.realpath(other) == os.path.realpath(root):
            sys.exit(f"error: --reuse_from={other} is --root itself (its runs would count twice "
                     f"in the ranking): name another sweep's root")
        if not os.path.isdir(os.path.join(other, sweep.RUNS_DIR)):
            what = ("is not a directory" if os.path.exists(other) and not os.path.isdir(other)
                    else "does not exist" if not os.path.exists(other)
                    else f"holds no {sweep.RUNS_DIR}/ (not a sweep's root)")
            sys.exit(f"error: --reuse_from={other} {what}")
    if _EXPORT.value:
        export = os.path.realpath(_EXPORT.value)
        if os.path.exists(export) and not os.path.isdir(export):
            sys.exit(f"error: --export={_EXPORT.value} exists and is not a directory")
        here = os.path.realpath(root)
        if export == here or export.startswith(here + os.sep):
            sys.exit(f"error: --export={_EXPORT.value} is inside --root={root}: name a "
                     f"directory outside it")
    bad = sweep.bad_override_fields(runs, config_path, extra)
    if bad:  # before anything is made: each run would fail on it a few seconds in
        sys.exit(f"error: --override or the sweep's overrides: {'; '.join(bad[:3])}"
                 + (f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""))
    try:  # the report's options (references, claims, scan) are checked before anything runs
        # another sweep's root, or a missing one for --report_only: refused, nothing touched
        sweep.check_root(root, config, report_only=_REPORT_ONLY.value)
        report = sweep_report.build(config, root)
    except sweep.SweepConfigError as e:
        sys.exit(f"error: {e}")
    if _REPORT_ONLY.value:
        _log(f"wrote {sweep_report.write(report)['md']}")
        _export(root)
        return
    if _DRY_RUN.value:  # writes nothing
        _dry_run(runs, root, config, config_path, extra)
        return
    done = (sweep.Status.FINISHED,) + (() if _RETRY.value else (sweep.Status.FAILED,))
    missing = sweep.missing_local_paths(  # only the runs this call would launch
        [r for r in runs if sweep.run_state(sweep.run_dir(root, r)).status not in done],
        config.get("local_args") or ())
    if missing:
        sys.exit(f"error: --config argument {', '.join(missing)}: no such file or directory on "
                 f"this machine (every run would fail reading it)")
    clashes = sweep.conflicts(runs, root, config.get("local_args") or ())
    if clashes:
        sys.exit("error: run directories under --root hold runs of other settings (use another "
                 "--root, or the settings they were run with):\n  " + "\n  ".join(clashes))
    os.makedirs(root, exist_ok=True)  # every check passed: the root is this sweep's now
    sweep_report.write(report)
    env = dict(os.environ)
    cache = os.path.join(root, "jax_cache") if _CACHE.value is None else _CACHE.value
    if cache:
        env["JAX_COMPILATION_CACHE_DIR"] = os.path.abspath(cache)
    stop = threading.Event()

    def on_signal(signum, frame):
        del frame
        stop.set()
        _log(f"sweep: {signal.Signals(signum).name}; stopping after the current run's "
             f"checkpoint" if _PARALLEL.value == 1 else
             f"sweep: {signal.Signals(signum).name}; stopping every run in flight after its "
             f"checkpoint")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    t0, started = time.time(), datetime.datetime.now(datetime.timezone.utc)
    deadline = None if _DEADLINE.value is None else t0 + _DEADLINE.value
    states = [sweep.run_state(sweep.run_dir(root, r)).status for r in runs]
    _log(f"sweep {config.get('name', '')}: {len(runs)} run(s) selected ("
         + ", ".join(f"{states.count(s)} {s.value}" for s in sweep.Status if s in states)
         + f"); deadline {_DEADLINE.value} s" + _parallel_note(env))

    def report(*_):
        try:
            sweep_report.write(sweep_report.build(config, root))
        except Exception as e:  # noqa: BLE001 - a failed table must not stop the runs
            _log(f"sweep: results not written: {type(e).__name__}: {e}")

    summary = sweep.ExecutionSummary(status="error")
    try:
        summary = sweep.execute(
            runs, root, config_path=config_path, cwd=_ROOT,
            train_script=os.path.join(_ROOT, "experiments", "train.py"), extra_overrides=extra,
            env=env, deadline=deadline, min_run_s=_MIN_RUN.value,
            stop_margin_s=_MARGIN.value, max_runs=_MAX_RUNS.value,
            retry_failed=_RETRY.value, stop=stop, print_fn=_log, after_run=report,
            reuse_from=_REUSE.value, finish_by_deadline=_FINISH.value,
            parallel=_PARALLEL.value)
    finally:
        record = {"command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
                  "sweep": sweep.sweep_name(config, root),  # sweep.check_root reads it
                  "started": started.isoformat(timespec="seconds"),
                  "wall_s": round(time.time() - t0, 1), "status": summary.status,
                  "launched": summary.launched}
        if _PARALLEL.value > 1:  # (one run at a time: the record as before --parallel)
            record["parallel"] = _PARALLEL.value
        with open(os.path.join(root, sweep_report.SWEEP_LOG), "a") as f:
            f.write(json.dumps(record) + "\n")
        paths = sweep_report.write(sweep_report.build(config, root))
        failed = sum(1 for why in summary.skipped.values() if why.startswith("failed"))
        retry = (f"; {failed} failed run(s) skipped, not retried (--retry_failed runs them)"
                 if failed else "")
        reused = f", {len(summary.reused)} reused" if summary.reused else ""
        _log(f"sweep: {summary.status} after {time.time() - t0:.0f} s; {len(summary.launched)} "
             f"run(s) launched{reused}{retry}; results in {paths['md']}")
        _export(root)
    if summary.status != "complete":
        sys.exit(EXIT_STOPPED)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
