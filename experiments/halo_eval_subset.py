"""Writes the small copy of ``shared/data`` read by the HALO report (``report.data_dir``).

Usage::

    python experiments/halo_eval_subset.py --src=../shared/data --dst=halo_data --limit=500

For every task, exactly the documents ``lattn_jax.eval.tasks.load_task(task, limit=--limit,
seed=--seed)`` keeps, in the original file formats under ``<dst>/eval/`` (so the report gives
the same numbers from the copy as from the full files); with ``--niah`` (default) also the
essays of ``<src>/niah/PaulGrahamEssays`` (the NIAH haystack).
"""

import glob
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

from lattn_jax.eval import tasks as tasks_lib  # noqa: E402

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SRC = flags.DEFINE_string("src", os.path.join(_ROOT, "..", "shared", "data"),
                           "Directory laid out as shared/data.")
_DST = flags.DEFINE_string("dst", "halo_data", "Where the copy goes.")
_TASKS = flags.DEFINE_list("tasks", ["piqa", "hellaswag", "arc_easy", "winogrande"],
                           f"Tasks, from {tasks_lib.TASK_NAMES}.")
_LIMIT = flags.DEFINE_integer("limit", 500, "Documents per task (config.report.csr_limit).")
_SEED = flags.DEFINE_integer("seed", 1234, "Subsampling seed (config.report.csr_seed).")
_NIAH = flags.DEFINE_bool("niah", True, "Also copy niah/PaulGrahamEssays.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    try:
        for task in _TASKS.value:
            for path in tasks_lib.write_subset(task, os.path.join(_SRC.value, "eval"),
                                               os.path.join(_DST.value, "eval"), _LIMIT.value,
                                               _SEED.value):
                print(f"wrote {path} ({os.path.getsize(path):,} bytes)")
        if _NIAH.value:
            src = os.path.join(_SRC.value, "niah", "PaulGrahamEssays")
            files = sorted(glob.glob(os.path.join(src, "*.txt")))
            if not files:
                raise FileNotFoundError(f"no essays (*.txt) in {src}")
            dst = os.path.join(_DST.value, "niah", "PaulGrahamEssays")
            os.makedirs(dst, exist_ok=True)
            for f in files:
                shutil.copyfile(f, os.path.join(dst, os.path.basename(f)))
            print(f"copied {len(files)} essays to {dst}")
    except (ValueError, FileNotFoundError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    app.run(main)
