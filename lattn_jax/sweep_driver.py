"""The sweep driver behind ``experiments/sweep.py``: one call runs (or reports, or plans) a sweep.

:func:`run` takes the sweep ConfigDict and the binary's options (:class:`SweepOptions`, one
field per flag) and does what one invocation does:

1. checks everything before anything is written: the grid and ``--only`` filters
   (:func:`lattn_jax.sweep.expand`, :func:`~lattn_jax.sweep.select`), the training config
   file, ``--override`` texts and fields (:func:`~lattn_jax.sweep.bad_override_fields`; a
   field that the grid sets, an axis or by an argument axis, is refused too:
   :func:`~lattn_jax.sweep.override_axis_clash`, and a field given twice: :func:`parse_overrides`),
   ``--finish_by_deadline`` without a deadline, ``--reuse_from`` and ``--export`` directories,
   the root (another sweep's, a training or HALO workdir, :func:`~lattn_jax.sweep.check_root`)
   and the report's options (:func:`lattn_jax.sweep_report.build`); a bad one raises
   :class:`~lattn_jax.sweep.SweepConfigError` with one line naming it; unless
   ``report_only``, also an ``--override`` value that the training config's check refuses
   for the first run (:func:`~lattn_jax.sweep.override_config_error`: every run would fail
   on it) and run directories that were run with other config values than this call gives
   them (:func:`~lattn_jax.sweep.changed_overrides`: a changed ``--override``; skipped as
   finished, their old numbers would be reported under this call's command; the fields of
   :data:`~lattn_jax.sweep.RESUME_FREE_FIELDS` may change); it also finds the runs whose
   trainer recorded another experiment config than the training config file (or a file it
   imports) gives them now (:func:`~lattn_jax.sweep.config_changes`: the file was edited since
   they ran, which the recorded commands do not show);
2. ``report_only``: rewrites ``<root>/results.{md,csv,json}`` and ``curves.png`` (and says
   how many runs under the root the grid does not hold: :func:`outside_grid_note`), then the
   ``export``; ``dry_run``: prints what the same call would do with each run
   (:func:`~lattn_jax.sweep.plan`: skip, reuse, launch in which order and which at once, or
   hold back), after the runs of an edited config and the missing machine-local paths
   (:func:`~lattn_jax.sweep.missing_local_paths`) that the call would refuse, and writes
   nothing; the results mark those runs ``¶`` (also with ``report_only``);
3. otherwise checks the machine-local paths of the runs it would launch and the run
   directories' recorded settings (:func:`~lattn_jax.sweep.conflicts`, then the runs of an
   edited config it would skip or resume, refused unless ``accept_config_changes``), writes
   the results, and runs the sweep
   (:func:`~lattn_jax.sweep.execute`; SIGTERM, Ctrl-C and SIGHUP, unless ignored as under
   ``nohup``, stop every trainer in flight after its checkpoint; after a Ctrl-C, which the
   trainers get too, each has :data:`~lattn_jax.sweep.INTERRUPT_GRACE_S` to exit on its own
   before the sweep's SIGTERM; a second Ctrl-C stops them at once, without saving, as it
   stops a trainer run alone: :class:`~lattn_jax.sweep.StopEvent`), rewriting the results
   after every run; then appends the invocation to ``<root>/sweep.jsonl``, rewrites the
   results and writes the ``export``.

What the flags (:class:`SweepOptions`) do:

Each run is ``experiments/train.py --config=<train_config>:<arg> --workdir=<root>/runs/<name>
--config.<field>=<value>...`` in a subprocess, so a crash, an OOM or a bad option ends that run
(reported in the table with its error line), not the sweep. The same command again continues:
finished runs are skipped, failed ones too (``--retry_failed`` runs them again), a partial one
resumes from its checkpoint (:mod:`lattn_jax.sweep`). ``--deadline_s`` ends the call cleanly:
no run starts with less than ``--min_run_s`` left before its SIGTERM (by default
:data:`DEFAULT_MIN_RUN_S`, a trainer's start-up: one launched just before its SIGTERM trained
nothing and left a run directory without a checkpoint), and the running
trainer gets SIGTERM (the trainer has no time limit of its own; SIGTERM is its preemption
signal: it saves a checkpoint after the current step and exits) ``--stop_margin_s`` before the
deadline; SIGTERM, Ctrl-C or SIGHUP (a closed terminal; not under ``nohup``) to the sweep
does the same at once; ``--finish_by_deadline`` (a
machine's last call) also holds back a run that would not finish by then, by the finished runs'
median wall time.
``--parallel=N`` runs up to N trainers at once on the machine (default 1: one after another),
still in the grid's order, the next when one exits; each then gets
``XLA_PYTHON_CLIENT_MEM_FRACTION`` = 0.9/N (0.45 for 2) so that they fit on one GPU together,
unless the environment already sets ``XLA_PYTHON_CLIENT_MEM_FRACTION`` (or
``XLA_CLIENT_MEM_FRACTION``), ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` or
``XLA_PYTHON_CLIENT_ALLOCATOR=platform``; the deadline, ``--min_run_s``, ``--max_runs`` and
``--finish_by_deadline`` apply to each launch, SIGTERM, Ctrl-C or SIGHUP stops every trainer
in flight, the console shows each trainer's lines behind ``[<run name>]`` (its own ``sweep.log``
holds them all), and each attempt records its concurrency, which the results mark: tokens/s,
MFU and wall time measured on a shared GPU are not compared with those measured alone.
``--gpus=0,1,2,3`` (a host of several GPUs; ``+`` joins the GPUs of one run's group:
``--gpus=0+1,2+3``) runs one trainer per GPU group instead, each alone on its group
(``CUDA_VISIBLE_DEVICES=0``, ``=0,1``; the first free group at each launch): ``--parallel``
defaults to the number of groups and may not exceed it, no memory fraction is set, and the
attempts record their group (``gpus``) and no concurrency, so the results compare their
tokens/s as measured alone (``--finish_by_deadline`` estimates each run alone too); a bad
value (an empty group, an id that is not a non-negative integer, an id given twice) is
refused before anything runs (:func:`parse_gpus`), and so (except with ``report_only``) is an
id of a GPU the machine does not have, as ``nvidia-smi -L`` counts them (:func:`machine_gpus`;
a CPU-only machine has none: its trainers would share the CPU, measured as if alone); a dry
run plans such a call anyway (a plan for another machine) and says that it would be refused.
``--reuse_from=<another sweep's root>`` (repeatable) copies the records of a finished run there
whose training is identical (the experiment config its trainer recorded at every invocation
equals this run's, e.g. Table 7's host ``route=none,seed=42`` and Table 2's
``arch=gdn,stack=hybrid,opt=muon,...,seed=42``) instead of running it again; the runs table
names the source.
``--remeasure_alone=N`` (default 0: off) measures again the tokens/s and MFU of every
selected finished run that was measured only while sharing the GPU (``--parallel`` > 1; the
runs the results mark ``†``): its own trainer command, as the sweep builds it, in
``<run dir>/alone/`` with ``train.total_steps=N`` and evaluations and checkpoints only at its
end, one at a time with nothing else in flight, before the call's training runs (those
finished earlier) and after them (those that finished sharing the GPU in this call), under
the same ``--deadline_s``, ``--min_run_s`` and ``--max_runs`` (the launches of the call
together); the medians over its logging windows after the first go to
``<run dir>/throughput_alone.json`` (steps, tokens/s, MFU, date, command, device kinds;
exported with the records), which the results then use for the run's tokens/s and MFU, marked
``‡`` (its wall time stays marked ``†``). A run re-measured before is skipped; a failed
re-measurement is reported with its error line and ends only itself (``--retry_failed`` tries
it again) (:func:`lattn_jax.sweep.remeasure_alone`).

After every run, and at the end, ``<root>/results.{md,csv,json}`` and ``curves.png`` are
rewritten from every run directory (:mod:`lattn_jax.sweep_report`); every invocation that
runs the sweep (its checks passed; also when it stops early or a run raises) appends its
command line and outcome to ``<root>/sweep.jsonl``, which the results page lists as the
commands that produced the runs. ``--report_only`` and ``--dry_run`` are not logged: they run
nothing (a dry run writes nothing at all, and a logged one would also make a new directory a
sweep root), and a report rebuilt many times would bury the commands that trained; a call
refused by a check is not logged either. A call that tried every run exits with
:data:`EXIT_FAILED` when a run it launched failed (the last line counts them).
``--export=<dir>`` then (also with ``--report_only``) copies the records and results,
without checkpoints, to ``<dir>``: the results files as they are, the runs' records as
``records.tar.gz`` (``--noexport_archive``: a ``runs/`` tree; run names hold ``=`` and ``,``,
which the GPU machine's return folder refuses). A sweep continues on another machine from them:
``tar xzf records.tar.gz -C <new root>``. Compiled programs are shared through a persistent
cache in ``<root>/jax_cache`` (``--compilation_cache=''``: the environment's
``JAX_COMPILATION_CACHE_DIR``, if any).

:mod:`lattn_jax.sweep` describes the runs, their directories and statuses.
"""

import dataclasses
import datetime
import os
import re
import shlex
import shutil
import signal
import subprocess
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from absl import flags

from lattn_jax import records
from lattn_jax import sweep
from lattn_jax import sweep_report

# Exit status of a call that stopped before every selected run was finished or failed
# (deadline, max_runs, SIGTERM or Ctrl-C): run the same command again.
EXIT_STOPPED = 3
# Exit status of a call that tried every selected run and some run it launched failed (the
# trainer's own error; the summary line counts them): the results hold no numbers for them.
EXIT_FAILED = 4

# experiments/sweep.py's flag for SweepOptions.accept_config_changes (defined here: the binary's
# file is at its length limit).
ACCEPT_CONFIG_CHANGES = flags.DEFINE_bool(
    "accept_config_changes", False, "Skip or resume runs whose recorded experiment config "
    "differs from what the training config file gives them now (the file was edited since "
    "they ran; refused without it); the results mark them \u00b6.")


@dataclasses.dataclass(frozen=True)
class SweepOptions:
    """The options of one sweep invocation (``experiments/sweep.py``'s flags of the same names).

    Attributes:
      root: the sweep directory (runs in ``<root>/runs/<name>``).
      only: ``--only`` filters (:func:`lattn_jax.sweep.select`).
      max_runs: start at most this many runs; ``None``: no limit.
      deadline_s: end cleanly this many seconds after the start; ``None``: no deadline.
      min_run_s: start no run that would train for less than this; ``None``:
        :data:`DEFAULT_MIN_RUN_S` (:func:`resolve`).
      stop_margin_s: SIGTERM to the trainers this long before the deadline.
      parallel: trainer subprocesses at once (>= 1); ``None``: the number of GPU groups of
        ``gpus``, or 1 without (:func:`resolve`).
      report_only: only rebuild the results (and the export) from an existing root.
      dry_run: print what the call would do with each run; write nothing.
      retry_failed: run failed runs again.
      finish_by_deadline: launch or resume only runs estimated to end before the deadline.
      reuse_from: other sweeps' roots whose identical finished runs give their records.
      overrides: ``"field=value"`` texts, an extra ``--config.<field>`` for every run.
      compilation_cache: the trainers' persistent compilation cache (``None``:
        ``<root>/jax_cache``; ``""``: the environment's ``JAX_COMPILATION_CACHE_DIR``).
      export: copy the records and results (no checkpoints) here at the end; ``None``: not.
      export_archive: the runs' records as one ``records.tar.gz``, not a ``runs/`` tree.
      remeasure_alone: measure the tokens/s and MFU of every selected finished run that
        was measured only while sharing the GPU again, alone, in a run of this many steps
        (:func:`lattn_jax.sweep.remeasure_alone`), before and after the call's training
        runs; 0: not.
      gpus: ``--gpus``'s text, GPU groups (``"0,1,2,3"``, ``"0+1,2+3"``; :func:`parse_gpus`):
        one trainer per group, alone on it; ``None``: all trainers on the machine's devices.
      accept_config_changes: skip or resume runs whose recorded experiment config differs from
        what the training config resolves to now (:func:`lattn_jax.sweep.config_changes`)
        instead of refusing the call; the results mark them either way.
    """

    root: str
    only: Sequence[str] = ()
    max_runs: Optional[int] = None
    deadline_s: Optional[float] = None
    min_run_s: Optional[float] = None
    stop_margin_s: float = 30.0
    parallel: Optional[int] = 1
    report_only: bool = False
    dry_run: bool = False
    retry_failed: bool = False
    finish_by_deadline: bool = False
    reuse_from: Sequence[str] = ()
    overrides: Sequence[str] = ()
    compilation_cache: Optional[str] = None
    export: Optional[str] = None
    export_archive: bool = True
    remeasure_alone: int = 0
    gpus: Optional[str] = None
    accept_config_changes: bool = False


def parse_gpus(text: str) -> List[str]:
    """``--gpus`` -> the ``CUDA_VISIBLE_DEVICES`` of each GPU group: ``"0,1,2,3"`` ->
    ``["0", "1", "2", "3"]`` (one GPU per run), ``"0+1,2+3"`` -> ``["0,1", "2,3"]``.

    Raises:
      SweepConfigError: for an empty group or id, an id that is not a non-negative integer,
        or an id given twice (in any group), in one line naming ``--gpus`` and the value.
    """
    groups, seen = [], set()
    for item in text.split(","):
        ids = [i.strip() for i in item.split("+")]
        if not all(ids):
            raise sweep.SweepConfigError(
                f"--gpus={text!r}: empty GPU group or id in {item.strip()!r} (expected GPU "
                f"ids joined by ',' between runs and '+' within one run's group, e.g. "
                f"0,1,2,3 or 0+1,2+3)")
        for i in ids:
            if not re.fullmatch(r"[0-9]+", i):
                what = ("a negative GPU id" if re.fullmatch(r"-[0-9]+", i)
                        else "not a GPU id (a non-negative integer)")
                raise sweep.SweepConfigError(f"--gpus={text!r}: {i!r} is {what}")
            if int(i) in seen:
                raise sweep.SweepConfigError(
                    f"--gpus={text!r}: GPU {int(i)} is given twice (each GPU belongs to one "
                    f"group)")
            seen.add(int(i))
        groups.append(",".join(str(int(i)) for i in ids))
    return groups


# Where the NVIDIA driver lists the machine's GPUs (one directory each), for a machine whose
# PATH has no nvidia-smi.
NVIDIA_PROC_GPUS = "/proc/driver/nvidia/gpus"


def machine_gpus() -> Tuple[Optional[int], str]:
    """How many NVIDIA GPUs this machine has, and what says so, without starting JAX (a JAX
    backend started here would take GPU memory that the trainers need).

    ``nvidia-smi -L`` counts its ``GPU <i>: ...`` lines (all of the machine's GPUs, whatever
    ``CUDA_VISIBLE_DEVICES`` this process has: ``--gpus`` replaces it for each trainer); with
    no ``nvidia-smi`` on ``PATH``, the entries of :data:`NVIDIA_PROC_GPUS` are counted.

    Returns:
      ``(count, source)``: e.g. ``(4, "nvidia-smi -L lists 4 GPU(s)")``, ``(0, "no nvidia-smi
      on PATH and no /proc/driver/nvidia/gpus: no NVIDIA driver")``, ``(0, "nvidia-smi -L
      failed: <its first line>")``; ``(None, why)`` when nvidia-smi did not answer in 30 s.
    """
    smi = shutil.which("nvidia-smi")
    if smi is None:
        try:
            count = len(os.listdir(NVIDIA_PROC_GPUS))
        except OSError:
            return 0, f"no nvidia-smi on PATH and no {NVIDIA_PROC_GPUS}: no NVIDIA driver"
        return count, f"{NVIDIA_PROC_GPUS} lists {count} GPU(s) (no nvidia-smi on PATH)"
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"nvidia-smi -L did not answer ({type(e).__name__})"
    if out.returncode != 0:
        first = (out.stdout + out.stderr).strip().splitlines()[:1] or [""]
        return 0, f"nvidia-smi -L failed with status {out.returncode}: {first[0].strip()}"
    count = sum(line.startswith("GPU ") for line in out.stdout.splitlines())
    return count, f"nvidia-smi -L lists {count} GPU(s)"


def check_gpus_exist(options: SweepOptions,
                     gpus: Optional[Callable[[], Tuple[Optional[int], str]]] = None) -> None:
    """Refuses a ``--gpus`` that names a GPU this machine does not have.

    A trainer given ``CUDA_VISIBLE_DEVICES`` of no GPU trains on the CPU, and several such
    trainers share the CPU while the results take each one's tokens/s as measured alone (a
    CPU-only machine given ``--gpus=0,1`` ran two trainers at once, unmarked). A machine
    whose count cannot be read (``None`` from ``gpus``) is not refused.

    Args:
      options: the sweep's options; nothing is checked when ``gpus`` is ``None``.
      gpus: ``() -> (count, source)``; ``None``: :func:`machine_gpus`.

    Raises:
      SweepConfigError: ``--gpus=0,1: GPU 1 is not on this machine (nvidia-smi -L lists 1
        GPU(s), id 0): name GPUs it has, or leave --gpus out (--parallel=N runs N at once,
        sharing the machine, and the results mark them)``.
    """
    if options.gpus is None:
        return
    ids = sorted({int(i) for group in parse_gpus(options.gpus) for i in group.split(",")})
    count, source = (gpus or machine_gpus)()
    missing = [i for i in ids if count is not None and i >= count]
    if missing:
        names = ", ".join(str(i) for i in missing)
        have = f", ids 0-{count - 1}" if count > 1 else ", id 0" if count else ""
        raise sweep.SweepConfigError(
            f"--gpus={options.gpus}: GPU{'' if len(missing) == 1 else 's'} {names} "
            f"{'is' if len(missing) == 1 else 'are'} not "
            f"on this machine ({source}{have}): name GPUs it has, or leave --gpus out "
            f"(--parallel=N runs N at once, sharing the machine, and the results mark them)")


# ``--min_run_s`` when not given: a trainer launched with less time than this before its
# SIGTERM would spend it starting up (imports, the data, restoring, compiling the step) and stop
# before its first step. Table 2's small runs on an H100 (sweeps/table2/records.tar.gz, the 11
# runs of one attempt) took 14-53 s, median 31 s, from launch to their first step.
DEFAULT_MIN_RUN_S = 60.0


def resolve(options: SweepOptions) -> SweepOptions:
    """``options`` with ``gpus`` checked (:func:`parse_gpus`), ``parallel`` decided (the
    number of GPU groups when ``None`` with ``gpus``, 1 when ``None`` without) and
    ``min_run_s`` (``None``: :data:`DEFAULT_MIN_RUN_S`).

    Raises:
      SweepConfigError: for a bad ``gpus``, or a ``parallel`` above its number of groups.
    """
    groups = None if options.gpus is None else parse_gpus(options.gpus)
    parallel = options.parallel
    if parallel is None:
        parallel = 1 if groups is None else len(groups)
    elif groups is not None and parallel > len(groups):
        raise sweep.SweepConfigError(
            f"--parallel={parallel} is above the {len(groups)} GPU group(s) of "
            f"--gpus={options.gpus} (one run per group at a time): leave --parallel out, or "
            f"name more groups")
    min_run_s = DEFAULT_MIN_RUN_S if options.min_run_s is None else options.min_run_s
    return dataclasses.replace(options, parallel=parallel, min_run_s=min_run_s)


def gpu_groups(options: SweepOptions) -> Optional[List[str]]:
    """The ``CUDA_VISIBLE_DEVICES`` of each GPU group of ``options.gpus``, or ``None``."""
    return None if options.gpus is None else parse_gpus(options.gpus)


def parse_overrides(texts: Sequence[str]) -> List[Tuple[str, str]]:
    """``["train.micro_batch_size=8", ...]`` -> ``[("train.micro_batch_size", "8"), ...]``.

    Raises:
      SweepConfigError: for a text without ``=`` or with an empty field, naming it; for a
        field given twice (each trainer's last ``--config.<field>`` flag would win silently, or
        ml_collections would join a tuple field's values), naming the field and both values:
        ``--override gives train.total_steps twice (train.total_steps=20, then
        train.total_steps=30): give it once (a tuple field's whole tuple in one value)``.
    """
    out: List[Tuple[str, str]] = []
    first: Dict[str, str] = {}  # field -> the text that gave it first
    for text in texts:
        field, sep, value = text.partition("=")
        if not sep or not field.strip():
            raise sweep.SweepConfigError(f"--override={text!r}: expected field=value "
                                         f"(e.g. train.micro_batch_size=8)")
        field = field.strip()
        if field in first:
            raise sweep.SweepConfigError(
                f"--override gives {field} twice ({first[field]}, then {text}): give it "
                f"once (a tuple field's whole tuple in one value)")
        first[field] = text
        out.append((field, value))
    return out


def override_hint(key: str, argv: Sequence[str]) -> str:
    """The hint for an unknown ``--config.<key>...`` flag that is no typo of a sweep field:
    ``--config`` is the sweep's config, and a field of every run's experiment config goes in
    ``--override=<field>=<value>`` (with the field and value typed in ``argv``, if found).

    Args:
      key: the unknown option's first part (``train`` of ``--config.train.total_steps=3``).
      argv: the command line, program name first.

    Returns:
      The hint (one line).
    """
    typed = [a[len("--config."):].split("=", 1) for a in list(argv)[1:]
             if a.startswith((f"--config.{key}=", f"--config.{key}."))]
    field, value = (typed[0] + ["<value>"])[:2] if typed else (key, "<value>")
    return (f"--config is the sweep's config: a field of every run's experiment config goes in "
            f"--override={field}={value}")


def parallel_note(env: Mapping[str, str], parallel: int,
                  gpus: Optional[Sequence[str]] = None) -> str:
    """The start line's words on ``parallel`` (empty for 1 without ``gpus``): runs at once,
    and each trainer's GPU memory (:func:`lattn_jax.sweep.parallel_env`), or its GPU group.

    Args:
      env: the trainers' environment before :func:`~lattn_jax.sweep.parallel_env`.
      parallel: trainers at once (>= 1).
      gpus: the GPU groups (:func:`parse_gpus`), or ``None``.

    Returns:
      ``"; up to N runs at once, sharing the machine (<memory>, on a GPU)"`` (device-neutral:
      the memory fraction matters only on a GPU), ``"; up to N run(s) at once, one per GPU
      group, each alone on it (CUDA_VISIBLE_DEVICES 0 | 1)"``, or ``""`` for ``parallel`` == 1
      without ``gpus``.
    """
    if gpus is not None:
        return (f"; up to {parallel} run(s) at once, one per GPU group, each alone on it "
                f"({sweep.CUDA_VISIBLE_DEVICES} {' | '.join(gpus)})")
    if parallel == 1:
        return ""
    child = sweep.parallel_env(env, parallel)
    if child.get(sweep.MEM_FRACTION_ENV) != env.get(sweep.MEM_FRACTION_ENV):
        memory = f"{sweep.MEM_FRACTION_ENV}={child[sweep.MEM_FRACTION_ENV]} each, on a GPU"
    else:
        memory = "GPU memory, on a GPU, as the environment sets it"
    return f"; up to {parallel} runs at once, sharing the machine ({memory})"


def _check_options(options: SweepOptions, root: str) -> None:
    """``--finish_by_deadline``, ``--reuse_from``, ``--export`` and ``--only`` with
    ``--report_only`` (SweepConfigError)."""
    if options.report_only and options.only:  # the report would still hold every run
        only = " ".join(f"--only={o}" for o in options.only)
        raise sweep.SweepConfigError(
            f"{only} does not apply to --report_only: the results always cover every run "
            f"under --root; drop --only (--dry_run {only} lists the selected runs)")
    if options.remeasure_alone and options.remeasure_alone < 2:
        raise sweep.SweepConfigError(
            f"--remeasure_alone={options.remeasure_alone}: at least 2 steps (its first logging "
            f"window, the warm-up after compilation, is left out), or 0 (off); e.g. 300")
    if options.finish_by_deadline and options.deadline_s is None:
        raise sweep.SweepConfigError(
            "--finish_by_deadline needs --deadline_s (the deadline it plans to)")
    for other in options.reuse_from:
        if os.path.realpath(other) == os.path.realpath(root):
            raise sweep.SweepConfigError(
                f"--reuse_from={other} is --root itself (its runs would count twice in the "
                f"ranking): name another sweep's root")
        if not os.path.isdir(os.path.join(other, sweep.RUNS_DIR)):
            what = ("is not a directory" if os.path.exists(other) and not os.path.isdir(other)
                    else "does not exist" if not os.path.exists(other)
                    else f"holds no {sweep.RUNS_DIR}/ (not a sweep's root)")
            raise sweep.SweepConfigError(f"--reuse_from={other} {what}")
    if options.export:
        export = os.path.realpath(options.export)
        if os.path.exists(export) and not os.path.isdir(export):
            raise sweep.SweepConfigError(
                f"--export={options.export} exists and is not a directory")
        problem = records.unwritable_dir(export)
        if problem:  # found now, not after the runs
            raise sweep.SweepConfigError(f"--export={options.export}: {problem}")
        here = os.path.realpath(root)
        if export == here or export.startswith(here + os.sep):
            raise sweep.SweepConfigError(f"--export={options.export} is inside --root={root}: "
                                         f"name a directory outside it")


def outside_grid_note(config: Mapping[str, Any], root: str) -> str:
    """A line on the runs under ``root`` that the grid does not hold (results.md lists them
    "(not in this grid)"), or ``""``: records rebuilt with another config argument than they
    were made with (Table 2's second seeds without ``seeds=2``, 2026-12-06)."""
    grid = {r.name for r in sweep.expand(config)}
    outside = [r.name for r in sweep.recorded_runs(root) if r.name not in grid]
    if not outside:
        return ""
    return (f"note: {len(outside)} run(s) under --root are not in this grid (results.md marks "
            f"them \"(not in this grid)\"; e.g. {outside[0]}): if they belong to this sweep, "
            f"give the config argument they were run with (the config file's docstring lists "
            f"the arguments, e.g. seeds=)")


def _train_config_path(config: Mapping[str, Any], repo_root: str) -> str:
    """The training config file of the sweep, checked (SweepConfigError)."""
    config_path = os.path.join(repo_root, config["train_config"])
    if not os.path.isfile(config_path):
        what = "a directory, not a file" if os.path.isdir(config_path) else "no such file"
        raise sweep.SweepConfigError(f"train_config: {what}: {config_path}")
    if not config_path.endswith(".py"):  # importlib finds no loader for it (a traceback)
        raise sweep.SweepConfigError(f"train_config: {config_path} is not a Python config "
                                     f"file (.py; configs/, e.g. configs/table2.py)")
    return config_path


def export(root: str, options: SweepOptions, print_fn: Callable[[str], None] = print) -> None:
    """``options.export``: the records and results of ``root``, no checkpoints
    (:func:`lattn_jax.sweep.export` with the results files and ``sweep.jsonl``); nothing when
    it is ``None``.

    Raises:
      OSError: if the export directory cannot be written.
    """
    if options.export:
        n = sweep.export(root, options.export, extra_files=(
            sweep_report.SWEEP_LOG, sweep_report.RESULTS_MD, sweep_report.RESULTS_CSV,
            sweep_report.RESULTS_JSON, sweep_report.CURVES_PNG), archive=options.export_archive)
        print_fn(f"exported {n} files to {options.export}")


def dry_run_lines(runs: Sequence[sweep.Run], config: Mapping[str, Any], options: SweepOptions,
                  *, config_path: str, train_script: str,
                  extra: Sequence[Tuple[str, Any]] = ()) -> List[str]:
    """What the same call without ``dry_run`` would do with each run
    (:func:`lattn_jax.sweep.plan`): skip, reuse, launch (in which order, which at once) or hold
    back (``max_runs``, the deadline), each with its trainer command; with ``gpus``, the GPU
    groups, and each launch's group (at the start: the one it takes; later: the one a trainer
    frees).

    Args:
      runs: the selected runs.
      config: the sweep config (its ``name``).
      options: the call's options (:func:`resolve` applies).
      config_path, train_script, extra: :func:`lattn_jax.sweep.command`'s ``config_path``,
        ``train_script`` and ``extra_overrides``.

    Returns:
      A header line; with ``remeasure_alone``, then one entry per run that is to be measured
      again alone first (:func:`lattn_jax.sweep.needs_remeasure` now; like the call itself, at
      most ``max_runs`` of them, and they count against it), with its re-measurement's command;
      then one entry per run: ``"<name>: <status> (step N); <what>"``, a newline and the
      command indented by two spaces.
    """
    options = resolve(options)
    groups = gpu_groups(options)
    alone = []
    if options.remeasure_alone:  # finished before this call (those it trains: re-measured
        # after them if they shared the GPU; not known beforehand)
        alone = [r for r in runs if sweep.needs_remeasure(options.root, r)]
        if options.max_runs is not None:
            alone = alone[:options.max_runs]
    planned = sweep.plan(
        runs, options.root, config_path=config_path, extra_overrides=extra,
        deadline_s=options.deadline_s, min_run_s=options.min_run_s,
        stop_margin_s=options.stop_margin_s, max_runs=options.max_runs,
        retry_failed=options.retry_failed, reuse_from=options.reuse_from,
        finish_by_deadline=options.finish_by_deadline, parallel=options.parallel,
        remeasurements=len(alone), gpus=groups)
    n = sum(p.action == "launch" for p in planned)
    first = sum(p.at_once for p in planned)
    at_once = (f"; up to {options.parallel} at once: launch{'es 1-' if first > 1 else ' '}"
               f"{first} at the start, each later one when a trainer exits"
               if options.parallel > 1 and n > 1 else "")
    if groups is not None:
        at_once += (f"; one run per GPU group, each alone on it ({sweep.CUDA_VISIBLE_DEVICES} "
                    f"{' | '.join(groups)})")
    lines = [f"dry run of sweep {config.get('name', '')}: {len(runs)} run(s) selected; {n} "
             f"would be launched, in this order{at_once}" + (
                 "; a launch after the start depends on the time then left before --deadline_s"
                 if options.deadline_s is not None and n > first else "")]
    for i, run in enumerate(alone, 1):
        cmd = sweep.alone_command(run, root=options.root, steps=options.remeasure_alone,
                                  config_path=config_path, train_script=train_script,
                                  extra_overrides=extra)
        counted = "" if options.max_runs is None else f"; launch {i} of --max_runs"
        lines.append(f"{run.name}: before the runs, re-measure its throughput alone "
                     f"(--remeasure_alone={options.remeasure_alone}{counted})\n  "
                     + " ".join(shlex.quote(c) for c in cmd))
    for p in planned:
        cmd = sweep.command(p.run, config_path=config_path,
                            workdir=sweep.run_dir(options.root, p.run),
                            train_script=train_script, extra_overrides=extra)
        if p.action == "launch":
            when = ("" if options.parallel == 1 else ", at the start" if p.at_once
                    else ", when a trainer exits")
            if groups is not None:
                when += (f", on {sweep.CUDA_VISIBLE_DEVICES}={p.gpus}" if p.gpus
                         else ", on the GPU group it frees")
            what = f"launch {p.launch}: {p.why}{when}"
        else:
            what = {"skip": "skipped: ", "reuse": "would reuse ",
                    "hold": "not launched: "}[p.action] + p.why
        lines.append(f"{p.run.name}: {p.state.status.value} (step {p.state.step}); {what}\n  "
                     + " ".join(shlex.quote(c) for c in cmd))
    return lines


def run(config: Mapping[str, Any], options: SweepOptions, *, repo_root: str,
        argv: Sequence[str], env: Optional[Mapping[str, str]] = None,
        print_fn: Callable[[str], None] = print) -> int:
    """One sweep invocation (the module docstring gives the steps).

    Args:
      config: the sweep ConfigDict (``configs/sweeps/<name>.py``).
      options: the invocation's options.
      repo_root: the repository root: ``config.train_config`` is relative to it, and the
        trainers (``<repo_root>/experiments/train.py``) run in it.
      argv: the command line, recorded in ``<root>/sweep.jsonl`` (not for ``report_only`` or
        ``dry_run``).
      env: the trainers' environment (default: this process's).
      print_fn: progress and result lines.

    Returns:
      0 when every selected run is finished or failed before this call (and for
      ``report_only``, ``dry_run``), :data:`EXIT_FAILED` when every selected run was tried
      and a run (or re-measurement alone) launched by this call failed, :data:`EXIT_STOPPED`
      when the call stopped before every run was tried (deadline, ``max_runs``, SIGTERM or
      Ctrl-C).

    Raises:
      SweepConfigError: for a bad option, sweep config, root or override, before anything is
        written (one line naming it; the run directories' clash lists them on further lines),
        an ``--override`` of a field that the grid sets among them
        (:func:`lattn_jax.sweep.override_axis_clash`);
        for an ``--override`` value the training config's check refuses
        (:func:`lattn_jax.sweep.override_config_error`), and (not for ``report_only``) for
        run directories whose last launch set a config field to another value than this
        call would (:func:`lattn_jax.sweep.changed_overrides`: a changed ``--override``),
        naming each run and field (old -> new) and how to proceed; and (not for
        ``report_only``, ``dry_run`` or ``accept_config_changes``) for runs it would skip or
        resume whose recorded experiment config differs from what the training config
        resolves to now (:func:`changed_config_lines`), naming each run and its fields
        (recorded -> now).
      OSError: if a trainer cannot be started or a file cannot be written.
    """
    options = resolve(options)  # (a bad --gpus: refused before anything else)
    gpus_refused = ""  # a dry run plans anyway: the plan may be for another machine
    if not options.report_only:  # (launches nothing: GPUs of another machine may be named)
        try:
            check_gpus_exist(options)
        except sweep.SweepConfigError as e:
            if not options.dry_run:
                raise
            gpus_refused = str(e)
    root = options.root
    runs = sweep.select(sweep.expand(config), options.only)
    config_path = _train_config_path(config, repo_root)
    extra = parse_overrides(options.overrides)
    _check_options(options, root)
    bad = sweep.bad_override_fields(runs, config_path, extra)
    if bad:  # before anything is made: each run would fail on it a few seconds in
        raise sweep.SweepConfigError(  # each line names the grid, overrides or --override
            "; ".join(bad[:3])
            + (f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""))
    clash = sweep.override_axis_clash(runs, config_path, extra, grid=sweep.expand(config))
    if clash:  # the trainer's last flag would win while the run names show the grid's value
        raise sweep.SweepConfigError(clash)
    # The report's options (references, claims, scan) are checked before anything runs;
    # another sweep's root, or a missing one for report_only: refused, nothing touched.
    sweep.check_root(root, config, report_only=options.report_only)
    # Runs trained with another config than the (edited) training config file gives now:
    # marked in the results; refused below unless accepted (every grid run: the report's).
    changes = sweep.config_changes(sweep.expand(config), root, config_path=config_path,
                                   extra_overrides=extra,
                                   local_args=config.get("local_args") or ())
    report = sweep_report.build(config, root, config_changes=changes)
    train_script = os.path.join(repo_root, "experiments", "train.py")
    if options.report_only:
        print_fn(f"wrote {sweep_report.write(report)['md']}")
        outside = outside_grid_note(config, root)
        if outside:
            print_fn(outside)
        export(root, options, print_fn)
        return 0
    bad_value = sweep.override_config_error(runs, config_path, extra)
    if bad_value:  # every run would fail on it: one error instead of N failed runs
        raise sweep.SweepConfigError(f"--override: {bad_value} (the training config's check, "
                                     f"as each run's trainer makes it; nothing was run)")
    changed = sweep.changed_overrides(runs, root, config_path=config_path,
                                      train_script=train_script, extra_overrides=extra,
                                      retry_failed=options.retry_failed)
    if changed:  # skipped as done, or resumed, they would stand for settings they never had
        raise sweep.SweepConfigError(
            "run directories under --root were run with other config values than this call "
            "gives them (old -> new; " + ", ".join(sweep.RESUME_FREE_FIELDS) + " may "
            "change):\n  " + "\n  ".join(changed) + "\nnothing was run or written: use a "
            "new --root for these settings, or drop the --override (or give the values the "
            "runs were run with) to resume")
    edited = changed_config_lines(runs, changes, root, options)
    done = (sweep.Status.FINISHED,) + (() if options.retry_failed else (sweep.Status.FAILED,))
    missing = sweep.missing_local_paths(  # only the runs this call would launch
        [r for r in runs if sweep.run_state(sweep.run_dir(root, r)).status not in done
         or (options.remeasure_alone and sweep.needs_remeasure(root, r))],
        config.get("local_args") or ())
    missing_line = (f"--config argument {', '.join(missing)}: no such file or directory on this "
                    f"machine (every run would fail reading it)") if missing else ""
    if options.dry_run:  # writes nothing
        for refusal in (gpus_refused, missing_line):  # a plan for another machine
            if refusal:
                print_fn(f"dry run: the call would refuse to run here; {refusal}")
        if edited:
            print_fn(("dry run: the call would skip or resume them (--accept_config_changes)"
                      if options.accept_config_changes else "dry run: the call would refuse "
                      "to run (pass --accept_config_changes to keep them)") + "; "
                     + changed_config_message(config, edited))
        for line in dry_run_lines(runs, config, options, config_path=config_path,
                                  train_script=train_script, extra=extra):
            print_fn(line)
        return 0
    if missing:
        raise sweep.SweepConfigError(missing_line)
    clashes = sweep.conflicts(runs, root, config.get("local_args") or ())
    if clashes:
        raise sweep.SweepConfigError(
            "run directories under --root hold runs of other settings (use another --root, "
            "or the settings they were run with):\n  " + "\n  ".join(clashes))
    if edited and not options.accept_config_changes:
        raise sweep.SweepConfigError(
            changed_config_message(config, edited) + "\nnothing was run or written: use a new "
            "--root for the edited config, restore the config they were run with, or pass "
            "--accept_config_changes to skip or resume them as they are (the results mark "
            "them " + sweep_report.CONFIG_MARK + ")")
    os.makedirs(root, exist_ok=True)  # every check passed: the root is this sweep's now
    with sweep.root_lock(root):  # one call at a time launches and records runs here
        sweep_report.write(report)
        return _execute(runs, config, options, config_path=config_path, repo_root=repo_root,
                        train_script=train_script, extra=extra, argv=argv,
                        env=dict(os.environ if env is None else env), print_fn=print_fn,
                        changes=changes)


def changed_config_lines(runs: Sequence[sweep.Run], changes: Mapping[str, str], root: str,
                         options: SweepOptions) -> List[str]:
    """``"<name>: <field> <recorded> -> <now>; ..."`` for each of ``runs`` in ``changes``
    (:func:`lattn_jax.sweep.config_changes`) that the call would skip or resume: not one it
    starts over from nothing (:func:`lattn_jax.sweep.starts_over`)."""
    return [f"{r.name}: {changes[r.name]}" for r in runs if r.name in changes
            and not sweep.starts_over(sweep.run_dir(root, r), options.retry_failed)]


def changed_config_message(config: Mapping[str, Any], lines: Sequence[str]) -> str:
    """The refusal's (and the dry run's) words on :func:`changed_config_lines`: a header naming
    the training config, then one indented line per run."""
    return (f"run directories under --root were trained with another experiment config than "
            f"{config['train_config']} gives them now (it, or a file it imports, was edited "
            f"since; recorded -> now):\n  " + "\n  ".join(lines))


def _execute(runs, config, options, *, config_path, repo_root, train_script, extra, argv, env,
             print_fn, changes=None) -> int:
    """Runs the checked sweep (:func:`lattn_jax.sweep.execute`) with SIGTERM, Ctrl-C and
    SIGHUP handlers (SIGHUP only when it is not ignored, as under ``nohup``), then records the
    invocation, rewrites the results and exports. The handlers that were installed before
    (e.g. an in-process caller's: a test, a notebook) are restored when it returns or raises;
    from the main thread only (Python's rule for signal handlers; another thread runs the
    sweep without them). After a SIGHUP, lines that cannot be written (the terminal is gone)
    are dropped."""
    root = options.root
    cache = (os.path.join(root, "jax_cache") if options.compilation_cache is None
             else options.compilation_cache)
    if cache:
        env["JAX_COMPILATION_CACHE_DIR"] = os.path.abspath(cache)
    stop = sweep.StopEvent()  # set_by: after a Ctrl-C the trainers get a grace period
    hung_up = threading.Event()

    def say(line: str) -> None:
        # After a SIGHUP the terminal may be gone: a line that cannot be written (EIO) is
        # dropped, so that the sweep still stops its trainers and records their attempts.
        try:
            print_fn(line)
        except (OSError, ValueError):  # ValueError: a closed stream
            if not hung_up.is_set():
                raise

    def on_signal(signum, frame):
        del frame
        if signum == signal.SIGHUP:
            hung_up.set()
        stop.set_by(signum)
        if signum == signal.SIGINT and stop.interrupts >= 2:
            say("sweep: second Ctrl-C; stopping every trainer in flight at once, without saving")
            return
        say(f"sweep: {signal.Signals(signum).name}; stopping after the current run's "
            f"checkpoint" if options.parallel == 1 else
            f"sweep: {signal.Signals(signum).name}; stopping every run in flight after "
            f"its checkpoint")

    previous = {}
    try:
        if threading.current_thread() is threading.main_thread():
            # SIGHUP (the terminal or ssh session closed) as SIGTERM, unless it is ignored
            # (nohup): then the sweep was started to outlive its terminal, as the trainer does.
            hangup = () if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN else (signal.SIGHUP,)
            for signum in (signal.SIGTERM, signal.SIGINT) + hangup:
                previous[signum] = signal.signal(signum, on_signal)
        return _execute_with_handlers(runs, config, options, stop=stop, root=root,
                                      config_path=config_path, repo_root=repo_root,
                                      train_script=train_script, extra=extra, argv=argv,
                                      env=env, print_fn=say, changes=changes)
    finally:
        for signum, handler in previous.items():
            # None: a handler not installed from Python, which signal.signal cannot restore.
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)


def _execute_with_handlers(runs, config, options, *, stop, root, config_path, repo_root,
                           train_script, extra, argv, env, print_fn, changes=None) -> int:
    """:func:`_execute`'s body, its signal handlers installed: ``stop`` is set on a signal."""
    t0, started = time.time(), datetime.datetime.now(datetime.timezone.utc)
    deadline = None if options.deadline_s is None else t0 + options.deadline_s
    states = [sweep.run_state(sweep.run_dir(root, r)).status for r in runs]
    print_fn(f"sweep {config.get('name', '')}: {len(runs)} run(s) selected ("
             + ", ".join(f"{states.count(s)} {s.value}" for s in sweep.Status if s in states)
             + ("); no deadline" if options.deadline_s is None else
                f"); deadline {options.deadline_s} s")
             + parallel_note(env, options.parallel, gpu_groups(options)))

    def report(*_):
        try:
            sweep_report.write(sweep_report.build(config, root, config_changes=changes))
        except Exception as e:  # noqa: BLE001 - a failed table must not stop the runs
            print_fn(f"sweep: results not written: {type(e).__name__}: {e}")

    summary = sweep.ExecutionSummary(status="error")
    remeasured = None

    def remeasure(launched: int) -> "sweep.RemeasureSummary":
        """The re-measurements alone (nothing else in flight), ``launched`` launches made."""
        left = None if options.max_runs is None else max(options.max_runs - launched, 0)
        groups = gpu_groups(options)  # with --gpus: on the first group, as a run would be
        alone_env = env if groups is None else {
            **(os.environ if env is None else env), sweep.CUDA_VISIBLE_DEVICES: groups[0]}
        return sweep.remeasure_alone(
            runs, root, steps=options.remeasure_alone, config_path=config_path,
            train_script=train_script, cwd=repo_root, extra_overrides=extra, env=alone_env,
            deadline=deadline, min_run_s=options.min_run_s, stop_margin_s=options.stop_margin_s,
            max_runs=left, retry_failed=options.retry_failed, stop=stop, print_fn=print_fn,
            after_run=report)

    try:
        if options.remeasure_alone:
            # First the runs finished before this call (a few minutes each, not held up by a
            # long training run), then those that finish sharing the GPU during it.
            remeasured = remeasure(0)
            if remeasured.status != "complete":
                summary = sweep.ExecutionSummary(status=remeasured.status)
        if remeasured is None or remeasured.status == "complete":
            summary = sweep.execute(
                runs, root, config_path=config_path, cwd=repo_root, train_script=train_script,
                extra_overrides=extra, env=env, deadline=deadline,
                min_run_s=options.min_run_s, stop_margin_s=options.stop_margin_s,
                max_runs=None if options.max_runs is None else max(
                    options.max_runs - len(remeasured.launched if remeasured else ()), 0),
                retry_failed=options.retry_failed, stop=stop, print_fn=print_fn,
                after_run=report, reuse_from=options.reuse_from,
                finish_by_deadline=options.finish_by_deadline, parallel=options.parallel,
                gpus=gpu_groups(options))
            if remeasured is not None and summary.launched and summary.status in (
                    "complete", "incomplete"):
                # After every trainer of the runs has exited: alone on the GPU.
                after = remeasure(len(remeasured.launched) + len(summary.launched))
                for field in ("measured", "failed", "skipped"):
                    getattr(remeasured, field).update(getattr(after, field))
                if after.status != "complete":
                    summary.status = after.status
    finally:
        record = {"command": "python " + " ".join(shlex.quote(a) for a in argv),
                  "sweep": sweep.sweep_name(config, root),  # sweep.check_root reads it
                  "started": started.isoformat(timespec="seconds"),
                  "wall_s": round(time.time() - t0, 1), "status": summary.status,
                  "launched": summary.launched}
        if options.parallel > 1:  # (one run at a time: the record as before --parallel)
            record["parallel"] = options.parallel
        if options.gpus is not None:  # (without --gpus: the record as before it)
            record["gpus"] = gpu_groups(options)
        if remeasured is not None:  # (without --remeasure_alone: the record as before it)
            record["remeasured_alone"] = remeasured.launched
        records.append_record(os.path.join(root, sweep_report.SWEEP_LOG), record)
        paths = sweep_report.write(sweep_report.build(config, root, config_changes=changes))
        failed = sum(1 for why in summary.skipped.values() if why.startswith("failed"))
        retry = (f"; {failed} failed run(s) skipped, not retried (--retry_failed runs them)"
                 if failed else "")
        failed_now = failed_runs(runs, root, summary.launched)
        if failed_now:
            retry = (f"; {len(failed_now)} of the {len(summary.launched)} run(s) launched "
                     f"failed ({', '.join(failed_now[:3])}"
                     + (f" and {len(failed_now) - 3} more" if len(failed_now) > 3 else "")
                     + ")" + retry)
        reused = f", {len(summary.reused)} reused" if summary.reused else ""
        if remeasured is not None:
            failed_alone = (f" ({len(remeasured.failed)} failed)" if remeasured.failed
                            else "")
            reused += (f", {len(remeasured.launched)} re-measured alone{failed_alone}")
        print_fn(f"sweep: {summary.status} after {time.time() - t0:.0f} s; "
                 f"{len(summary.launched)} run(s) launched{reused}{retry}; results in "
                 f"{paths['md']}")
        export(root, options, print_fn)
    if summary.status != "complete":
        return EXIT_STOPPED
    return EXIT_FAILED if failed_now or (remeasured is not None and remeasured.failed) else 0


def failed_runs(runs: Sequence[sweep.Run], root: str, launched: Sequence[str]) -> List[str]:
    """The names of the runs ``launched`` in this call that are failed now
    (:func:`lattn_jax.sweep.run_state`), in ``runs``' order."""
    launched = set(launched)
    return [r.name for r in runs if r.name in launched
            and sweep.run_state(sweep.run_dir(root, r)).status == sweep.Status.FAILED]
