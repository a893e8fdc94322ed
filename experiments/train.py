"""Trains a language model: ``train_and_evaluate(config, workdir)`` behind absl flags.

Usage::

    python experiments/train.py --config=configs/default.py --workdir=runs/default
    python experiments/train.py --config=configs/default.py:pattern=pure --workdir=runs/pure \
        --config.train.total_steps=1000 --config.model.d_model=256

Running it again with the same ``--workdir`` resumes from the newest checkpoint there.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from lattn_jax import config as config_lib  # noqa: E402
from lattn_jax import train  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints and metrics.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    logging.set_verbosity(logging.WARNING)
    # Bad options and missing files end the run with one line naming them, without a traceback.
    try:
        config = config_lib.experiment_from_config_dict(_CONFIG.value)
    except (ValueError, FileNotFoundError) as e:
        sys.exit(f"error: {e}")
    print(f"jax {jax.__version__}, devices {jax.devices()}")
    try:
        train.train_and_evaluate(config, _WORKDIR.value)
    except (config_lib.ConfigError, FileNotFoundError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    app.run(main)
