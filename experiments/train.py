"""Trains a language model: ``train_and_evaluate(config, workdir)`` behind absl flags.

Usage::

    python experiments/train.py --config=configs/default.py --workdir=runs/default
    python experiments/train.py --config=configs/default.py:pattern=pure --workdir=runs/pure \\
        --config.train.total_steps=1000 --config.model.d_model=256

Running it again with the same ``--workdir`` resumes from the newest readable checkpoint there
(``--step=N`` picks an older one); on a run that finished (its final evaluation recorded) it
says so in one line and records no result again. Exit status: 0 when the run reached
``train.total_steps`` (or the ``train.max_steps_per_run`` it was given); 1 with a one-line
error; after a stop on a signal (a checkpoint saved first) the shell's status for it: 143
(SIGTERM), 129 (SIGHUP), 130 (Ctrl-C). On
several devices, ``--config.mesh.data/fsdp/context/tensor`` shape the mesh (default: data
parallel over all devices; ``context`` splits each sequence, BUILD.md "Context parallelism");
multi-host launches are in BUILD.md ("Multi-host training").
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from lattn_jax import flag_errors  # noqa: E402 (absl only: before jax)
if __name__ == "__main__":  # a Ctrl-C: one line, status 130, until main() is past the flags
    flag_errors.exit_on_ctrl_c()
import jax  # noqa: E402
from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from lattn_jax import checkpoint as checkpoint_lib  # noqa: E402
from lattn_jax import config as config_lib  # noqa: E402
from lattn_jax import data  # noqa: E402
from lattn_jax import multihost  # noqa: E402
from lattn_jax import sharding  # noqa: E402
from lattn_jax import train  # noqa: E402
from pallas_kernels.common import validation  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints and metrics.")
_STEP = flags.DEFINE_integer(
    "step", None, "Resume from this checkpoint step instead of the newest (the newer ones are "
    "renamed <step>.after-step-<N>-<time> in <workdir>/checkpoints, not deleted).",
    lower_bound=0)
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None, "Multi-process: host:port of process 0. Unset: detected from "
    "the cluster environment (SLURM, Open MPI, TPU pod) or single-process.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Multi-process: process count.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "Multi-process: this process's index.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    config_lib.reject_arguments(argv)  # one line, not the help text
    logging.set_verbosity(logging.WARNING)
    # Bad options and missing files end the run with one line naming them, without a traceback.
    try:
        config_dict = config_lib.config_flag_value(_CONFIG)
        config = config_lib.experiment_from_config_dict(config_dict)
    except (ValueError, FileNotFoundError) as e:
        sys.exit(f"error: {e}")
    # Options the config file computes from others (its warm-up from train.total_steps): a
    # resume warning marks them as following the option the user changed.
    derived = config_lib.derived_options(config_dict)
    flag_errors.end_exit_on_ctrl_c()  # a KeyboardInterrupt again: the loop saves on it
    sharding.initialize_distributed(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
    multihost.watch_peers()  # another process's failure ends this one at once
    if jax.process_index() == 0:
        print(f"jax {jax.__version__}, process {jax.process_index()} of {jax.process_count()}, "
              f"devices {jax.devices()}")
    try:
        # A SIGTERM / SIGHUP after the final checkpoint: noted, the finished run exits 0.
        result = train.train_and_evaluate(config, _WORKDIR.value, step=_STEP.value,
                                          derived=derived, hold_signals_when_done=True)
    except (config_lib.ConfigError, FileNotFoundError, data.DataFileError, train.NonFiniteError,
            checkpoint_lib.CheckpointError, train.WorkdirWriteError,
            # an explicitly named kernel / cuDNN on a machine or shapes it cannot run
            validation.UnsupportedImplementationError) as e:  # one line each, no traceback
        sys.exit(f"error: {e}")
    except OSError as e:
        # A file that cannot be written or read (a full disk, a read-only or missing path):
        # one line. Lost connections (jax.distributed's coordinator, a data worker's pipe) keep
        # their traceback: where they came from is the information.
        if isinstance(e, ConnectionError):
            raise
        sys.exit(f"error: {e}")
    except KeyboardInterrupt as e:
        # Ctrl-C outside the training loop (data, compilation set-up), or a second Ctrl-C in it:
        # one line, the shell's status for SIGINT. (One Ctrl-C in the loop saves and returns.)
        # A Ctrl-C while a checkpoint is written waits for it; the message then names it.
        print(f"interrupted (Ctrl-C): {e}" if str(e) else
              "interrupted (Ctrl-C); nothing saved since the last checkpoint", file=sys.stderr,
              flush=True)
        if jax.process_count() > 1:
            sys.exit(130)  # multihost.fail_fast tells the other processes, then os._exit(130)
        # Not sys.exit: the interpreter's shutdown segfaulted with XLA work in flight (a
        # Ctrl-C in start-up: 3 of 6 tries, 2026-12-05); no checkpoint is being written here.
        multihost.exit_now(130)
    except train.Terminated as e:
        # SIGTERM or SIGHUP while a checkpoint was being written where no stop request is
        # polled (the stop path's or the final save): the write completed first; one line
        # naming it. The shell's status for the signal: 143 (SIGTERM), 129 (SIGHUP).
        # (train._notice skips a stderr that cannot be written: a SIGHUP's terminal is gone;
        # the status still says it.)
        train._notice(f"terminated ({e.signal_name}): {e}")
        sys.exit(e.exit_status)
    # Stopped early on SIGTERM, SIGHUP or Ctrl-C after a checkpoint ("Stopping at step N of
    # M" above): the signal's shell status (143, 129, 130), not 0, so that a shell loop or a
    # scheduler does not take the run for finished. 0: it ran its steps. (StopExit: in a
    # multi-process run every process stopped at the agreed step; not a failure to publish.)
    status = train.stop_exit_status(result)
    if status:
        raise multihost.StopExit(status)


if __name__ == "__main__":
    # A failure on one process of a multi-process run ends them all at once (lattn_jax.multihost).
    app.run(multihost.fail_fast(main), flags_parser=config_lib.parse_flags)
