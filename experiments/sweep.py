"""Runs a sweep's training runs, one or ``--parallel`` at a time, resumably; writes its results.

Usage::

    python experiments/sweep.py \\
        --config=configs/sweeps/lr_scan_small.py:corpus=/data/open/prose-llama2 \\
        --root=runs/lr_scan --deadline_s=540
    python experiments/sweep.py --config=configs/sweeps/table2_small.py:tiny --root=/tmp/t2 \\
        --only=arch=gdn,opt=muon          # CPU smoke run of a subset
    python experiments/sweep.py --config=... --root=/tmp/sweeps/table2 \\
        --remeasure_alone=300 --only=arch=gdn  # tokens/s alone of runs that shared the GPU
    python experiments/sweep.py --config=... --root=runs/t2 --gpus=0,1,2,3  # 1 run per GPU
    python experiments/sweep.py --config=... --root=runs/lr_scan --report_only

Each run is an ``experiments/train.py`` subprocess in ``<root>/runs/<name>``; the same command
again skips finished (and failed) runs and resumes partial ones. What each flag does, the
results files and the export: :mod:`lattn_jax.sweep_driver` (``run``).

Exit status: 0 when every selected run is finished or failed before this call, 4 when a run it
launched failed (the last line counts them), 3 when it stopped early (deadline, ``--max_runs``,
a signal: run it again), 1 on a bad flag, config or ``--override``, or a changed one (one line).
"""

import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _ROOT)

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from lattn_jax import config as config_lib  # noqa: E402
from lattn_jax import sweep, sweep_driver  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Sweep config file.", lock_config=True)
_ROOT_DIR = flags.DEFINE_string("root", None, "Sweep directory (runs in <root>/runs/<name>).")
_ONLY = flags.DEFINE_multi_string("only", [], "Run only the runs matching this filter: "
                                  "axis=glob conditions joined by commas (all must hold), or a "
                                  "glob on the run name; repeat for alternatives.")
_MAX_RUNS = flags.DEFINE_integer("max_runs", None, "Start at most this many runs (>= 1).",
                                 lower_bound=1)
_DEADLINE = flags.DEFINE_float("deadline_s", None, "End cleanly this many s (> 0) after start.")
flags.register_validator("deadline_s", lambda v: v is None or v > 0, "must be above 0 seconds")
_MIN_RUN = flags.DEFINE_float("min_run_s", None, "Start no run that would train for less than "
                              "this (the time left minus --stop_margin_s; default 60: a "
                              "trainer's start-up, 14-53 s on an H100).", lower_bound=0.0)
_MARGIN = flags.DEFINE_float("stop_margin_s", 30.0, "SIGTERM to the trainer this long before "
                             "the deadline (and SIGKILL this long after SIGTERM).")
_PARALLEL = flags.DEFINE_integer("parallel", None, "Trainer subprocesses at once (>= 1; "
                                 "default 1, one after another, or with --gpus its number of "
                                 "groups; above 1 without --gpus: they share the GPU, "
                                 "lattn_jax.sweep.parallel_env, and the records mark them).")
flags.register_validator("parallel", lambda v: v is None or v >= 1, "must be at least 1 "
                         "(trainer subprocesses at once; 1 runs them one after another)")
_GPUS = flags.DEFINE_string("gpus", None, "GPU groups, one trainer alone on each: 0,1,2,3 "
                            "(a GPU per run) or 0+1,2+3 (two per run); refused: GPUs "
                            "nvidia-smi -L does not list.")
_REMEASURE = flags.DEFINE_integer("remeasure_alone", 0, "Measure again alone, in an N-step "
                                  "run (>= 2; 0: off), the tokens/s and MFU of finished runs "
                                  "that trained sharing the GPU (lattn_jax.sweep."
                                  "remeasure_alone; results mark them \u2021).",
                                  lower_bound=0)
_REPORT_ONLY = flags.DEFINE_bool("report_only", False, "Only rebuild the results of --root.")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print what the same command would do with "
                             "each selected run (skip, reuse, launch, hold back); writes nothing.")
_RETRY = flags.DEFINE_bool("retry_failed", False, "Run failed runs again.")
_FINISH = flags.DEFINE_bool("finish_by_deadline", False, "Launch or resume only runs that the "
                            "finished runs' median wall time says end before the deadline (a "
                            "machine's last call: a run cut there is lost).")
_REUSE = flags.DEFINE_multi_string("reuse_from", [], "Another sweep's root: a run not started "
                                   "here whose training is identical to a run finished there "
                                   "gets its records instead of a launch (Table 7's host).")
_OVERRIDE = flags.DEFINE_multi_string("override", [], "field=value: an extra --config.<field> "
                                      "for every run (this machine's settings, e.g. "
                                      "train.micro_batch_size=8; not in the run names).")
_CACHE = flags.DEFINE_string("compilation_cache", None, "Persistent compilation cache of the "
                             "trainers (default <root>/jax_cache; '' leaves "
                             "JAX_COMPILATION_CACHE_DIR as the environment has it).")
_EXPORT = flags.DEFINE_string("export", None, "Copy the records and results (no checkpoints) "
                              "here at the end.")
_EXPORT_ARCHIVE = flags.DEFINE_bool("export_archive", True, "--export: the runs' records as "
                                    "one records.tar.gz, not a runs/ tree.")
flags.mark_flags_as_required(["config", "root"])
flags.adopt_module_key_flags(sweep_driver)  # --accept_config_changes, in --help


def parse_flags(argv):
    """Parses flags; a bad sweep config, argument string or ``--config.<field>`` ends with one
    readable line (:func:`lattn_jax.config.parse_flags`, shared with ``train.py``). An unknown
    ``--config.<field>`` also says that a field of every run's experiment config (``train.*``,
    ``model.*``, ...) goes in ``--override=<field>=<value>``: ``--config`` is the sweep's own.

    Raises:
      SystemExit: on any flag or config error.
    """
    return config_lib.parse_flags(argv, unknown_option_hint=sweep_driver.override_hint)


def main(argv):
    config_lib.reject_arguments(argv)  # one line, not the help text
    options = sweep_driver.SweepOptions(
        root=_ROOT_DIR.value, only=_ONLY.value, max_runs=_MAX_RUNS.value,
        deadline_s=_DEADLINE.value, min_run_s=_MIN_RUN.value, stop_margin_s=_MARGIN.value,
        parallel=_PARALLEL.value, report_only=_REPORT_ONLY.value, dry_run=_DRY_RUN.value,
        retry_failed=_RETRY.value, finish_by_deadline=_FINISH.value, reuse_from=_REUSE.value,
        overrides=_OVERRIDE.value, compilation_cache=_CACHE.value, export=_EXPORT.value,
        export_archive=_EXPORT_ARCHIVE.value, remeasure_alone=_REMEASURE.value,
        gpus=_GPUS.value, accept_config_changes=sweep_driver.ACCEPT_CONFIG_CHANGES.value)
    try:
        status = sweep_driver.run(config_lib.config_flag_value(_CONFIG), options,
                                  repo_root=_ROOT, argv=sys.argv)
    except sweep.SweepConfigError as e:
        sys.exit(f"error: {e}")
    if status:
        sys.exit(status)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
