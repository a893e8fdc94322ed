"""Renders the results page of a HALO workdir from the JSON files its stages wrote.

Usage::

    python experiments/halo_report.py --workdir=runs/halo_h200
    # -> runs/halo_h200/halo-smollm2-<date of the report>.md
    python experiments/halo_report.py --workdir=runs/halo_h200 \\
        --output=benchmarks/results/halo-smollm2-<date>.md     # a page to commit

The page (:func:`lattn_jax.halo.report.render_markdown`) has the hardware and versions, the
commands (``pipeline.jsonl``), the token budget, losses and wall time of every stage, the layer
selection, the calibration of ``a`` and the teacher-versus-student tables of
``report/report.json``: every accuracy as ``mean ± binomial SE`` (commonsense per task and their
mean; NIAH per task and length), the NIAH summary (means over 2K-8K and 16K-64K per task and over
the tasks, the student/teacher ratio at 2K-8K) and the NIAH length x depth grids, then the speed
and state memory rows. Errors: a missing workdir exits with a message naming it.
"""

import os
import shlex
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

from lattn_jax import flag_errors  # noqa: E402
from lattn_jax.halo import experiment  # noqa: E402
from lattn_jax.halo import report as report_lib  # noqa: E402

_WORKDIR = flags.DEFINE_string("workdir", None, "The HALO workdir.")
_OUTPUT = flags.DEFINE_string("output", None, "Output path (default <workdir>/<name>-<date>.md).")
_NAME = flags.DEFINE_string("name", "halo-smollm2", "File name stem of the default output.")
_TITLE = flags.DEFINE_string("title", None, "Page title (default from the teacher and date).")
flags.mark_flags_as_required(["workdir"])


def main(argv):
    flag_errors.reject_arguments(argv)  # one line, not the help text
    if not os.path.isdir(_WORKDIR.value):
        sys.exit(f"error: no such workdir: {_WORKDIR.value}")
    if not os.path.exists(os.path.join(_WORKDIR.value, "config.json")):
        # Every HALO stage writes config.json first; a sweep root or an empty folder would
        # render as "HALO conversion of None". A stage's folder: the workdir to pass.
        inside = experiment.stage_folder(_WORKDIR.value)
        sys.exit(f"error: {_WORKDIR.value} is " + (
            f"the {inside.stage} folder of the HALO workdir {inside.workdir}: pass "
            f"--workdir={shlex.quote(inside.workdir)}" if inside
            else "not a HALO workdir (no config.json)"))
    config_path = os.path.join(_WORKDIR.value, "config.json")
    try:
        config = report_lib.read_json(config_path, None)
    except report_lib.BadJsonError as e:
        sys.exit(f"error: {e}")
    if not isinstance(config, dict) or "teacher" not in config:
        # A train.py workdir also has a config.json (model/data/optim/train), but no teacher.
        sys.exit(f"error: {_WORKDIR.value} is not a HALO workdir "
                 f"(its config.json has no 'teacher' section)")
    out = _OUTPUT.value
    try:  # a stage's JSON cut short (a run stopped mid-write): one line naming the file
        if out is None:
            rep = report_lib.read_json(os.path.join(_WORKDIR.value, "report",
                                                    report_lib.REPORT_JSON), {}) or {}
            date = (rep.get("updated") or rep.get("started") or "undated")[:10]
            out = os.path.join(_WORKDIR.value, f"{_NAME.value}-{date}.md")
        report_lib.check_page_path(out, "--output")  # before the (slow) rendering
        text = report_lib.render_markdown(_WORKDIR.value, title=_TITLE.value)
        report_lib.write_page(out, text, "--output")
    except ValueError as e:  # BadJsonError, or an --output that cannot be written
        sys.exit(f"error: {e}")
    print(f"wrote {out}")
    if not experiment.is_done(_WORKDIR.value, "report"):
        print(f"note: the report stage has not finished in {_WORKDIR.value} (no "
              f"report/done.json): the page shows what the stages have recorded so far")


if __name__ == "__main__":
    app.run(main, flags_parser=flag_errors.parse_flags)
