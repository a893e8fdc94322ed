"""Writes the small copy of ``shared/data`` read by the HALO stages on a GPU (``report.data_dir``).

Usage::

    python experiments/halo_eval_subset.py --src=../shared/data --dst=halo_data
    python experiments/halo_eval_subset.py --src=../shared/data --dst=halo_data --limit=1000

``--limit=0`` (default): every file of each task's directory under ``<src>/eval/`` is copied as
is (for the default tasks ``arc/`` with the Test *and* Dev files, ``hellaswag/``, ``piqa/`` with
its labels, ``winogrande/`` with its labels: about 4.5 MB), so that both the report (Test files,
``tasks.load_task(task, dir, csr_limit, csr_seed)``) and the layer selection (its held-out probe:
the ARC Dev files and the HellaSwag items outside the report's subset) read the original data.
``--limit=N``: for every task exactly the ``N`` documents ``lattn_jax.eval.tasks.load_task(task,
limit=N, seed=--seed)`` keeps, in the original file formats (the report gives the same numbers
from this copy with ``csr_limit=N``; the selection's probe is then not available). With
``--niah`` (default) also the essays of ``<src>/niah/PaulGrahamEssays`` (the NIAH haystack,
0.7 MB). Every task is loaded back from the copy and its document count printed.
"""

import glob
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

from lattn_jax import flag_errors  # noqa: E402
from lattn_jax.eval import tasks as tasks_lib  # noqa: E402

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SRC = flags.DEFINE_string("src", os.path.join(_ROOT, "..", "shared", "data"),
                           "Directory laid out as shared/data.")
_DST = flags.DEFINE_string("dst", "halo_data", "Where the copy goes.")
_TASKS = flags.DEFINE_list("tasks", ["piqa", "hellaswag", "arc_easy", "arc_challenge",
                                     "winogrande"],
                           f"Tasks, from {tasks_lib.TASK_NAMES}.")
_LIMIT = flags.DEFINE_integer("limit", 0, "0: copy the tasks' full source directories; N > 0: "
                              "the N documents per task of config.report.csr_limit=N.")
_SEED = flags.DEFINE_integer("seed", 1234, "Subsampling seed (config.report.csr_seed).")
_NIAH = flags.DEFINE_bool("niah", True, "Also copy niah/PaulGrahamEssays.")

# The directory under eval/ that holds each task's files (tasks.load_task's layout).
TASK_DIRS = {"hellaswag": "hellaswag", "piqa": "piqa", "winogrande": "winogrande",
             "arc_easy": "arc", "arc_challenge": "arc", "lambada_openai": "lambada",
             "openbookqa": "openbookqa", "boolq": "boolq"}


def copy_full(tasks, src_eval: str, dst_eval: str):
    """Copies every regular file of each task's directory; returns the paths written.

    Raises:
      ValueError: an unknown task. FileNotFoundError: a missing or empty task directory.
    """
    written = []
    for d in sorted({TASK_DIRS[t] for t in tasks}):
        files = sorted(f for f in glob.glob(os.path.join(src_eval, d, "*")) if os.path.isfile(f))
        if not files:
            raise FileNotFoundError(f"no files in {os.path.join(src_eval, d)} (--src must be "
                                    f"laid out as shared/data)")
        os.makedirs(os.path.join(dst_eval, d), exist_ok=True)
        for f in files:
            written.append(shutil.copy2(f, os.path.join(dst_eval, d, os.path.basename(f))))
    return written


def main(argv):
    flag_errors.reject_arguments(argv)  # one line, not the help text
    try:
        unknown = [t for t in _TASKS.value if t not in TASK_DIRS]
        if unknown:
            raise ValueError(f"--tasks: unknown {unknown}; choose from {tasks_lib.TASK_NAMES}")
        if _LIMIT.value < 0:
            raise ValueError(f"--limit must be 0 (full files) or positive, got {_LIMIT.value}")
        if os.path.realpath(_SRC.value) == os.path.realpath(_DST.value):
            raise ValueError(f"--dst must differ from --src (both {_SRC.value}): the copy "
                             f"would overwrite its source")
        src_eval, dst_eval = (os.path.join(_SRC.value, "eval"),
                              os.path.join(_DST.value, "eval"))
        missing = [p for t in _TASKS.value for p in tasks_lib.missing_files(t, src_eval)]
        if missing:
            raise FileNotFoundError(f"--src={_SRC.value} is not laid out as shared/data "
                                    f"(experiments/fetch_eval_data.py writes it); missing: "
                                    f"{', '.join(missing)}")
        if _LIMIT.value == 0:
            written = copy_full(_TASKS.value, src_eval, dst_eval)
        else:
            written = [p for task in _TASKS.value
                       for p in tasks_lib.write_subset(task, src_eval, dst_eval, _LIMIT.value,
                                                       _SEED.value)]
        for path in written:
            print(f"wrote {path} ({os.path.getsize(path):,} bytes)")
        for task in _TASKS.value:
            print(f"{task}: {len(tasks_lib.load_task(task, dst_eval))} documents in the copy")
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
    app.run(main, flags_parser=flag_errors.parse_flags)
