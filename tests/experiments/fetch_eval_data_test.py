"""``experiments/fetch_eval_data.py`` and the data directory ``evaluate.py`` reads, offline."""

import os
import sys

import pytest
from absl.testing import absltest

from tests import binary_runs

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FIXTURES = os.path.join(ROOT, "tests", "lattn_jax", "eval", "testdata", "eval_data")


def run(binary, *flags, env=None):
    cmd = [sys.executable, os.path.join(ROOT, "experiments", binary), *flags]
    return binary_runs.run(cmd, env=dict(os.environ, **(env or {})))


@pytest.mark.entry
class FetchEvalDataTest(absltest.TestCase):
    """Issue 32, trap 7: the evaluation data can be obtained from the repository."""

    def test_list_documents_every_origin(self):
        result = run("fetch_eval_data.py", "--list")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("| `eval/piqa/valid.jsonl` | 495,929 | `93503cc97c679e45` | "
                      "ybisk/ybisk.github.io @ 21edab439af6 : piqa/data/valid.jsonl |",
                      result.stdout)
        self.assertIn("niah/PaulGrahamEssays/worked.txt", result.stdout)

    def test_wrong_bytes_are_refused_with_one_clear_error(self):
        # The fixtures are truncated copies: their checksums are not the pinned ones.
        out = os.path.join(self.create_tempdir().full_path, "data")
        result = run("fetch_eval_data.py", f"--data_dir={out}", "--groups=lm",
                     f"--mirror=file://{FIXTURES}")
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("error: 2 file(s) not obtained with the pinned checksum", result.stderr)
        self.assertIn("lm/wikitext-2-raw/wiki.test.raw", result.stderr)
        self.assertNotIn("Traceback", result.stderr)
        self.assertFalse(os.path.exists(os.path.join(out, "lm", "wikitext-2-raw",
                                                     "wiki.test.raw")))

    def test_evaluate_reads_the_directory_fetch_writes(self):
        data = os.path.join(self.create_tempdir().full_path, "data")
        for binary in ("fetch_eval_data.py", "evaluate.py"):
            result = run(binary, "--helpfull", env={"LATTN_DATA_DIR": data})
            flag = result.stdout.split("--data_dir:")[1].split("\n  --")[0]
            self.assertIn(f"(default:'{data}')", "".join(flag.split()), binary)


if __name__ == "__main__":
    absltest.main()
