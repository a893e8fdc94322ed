"""benchmarks/windows/table2_window.sh: the record restore and the start-up errors.

The script's sweeps are tested where they live (tests/experiments/sweep_test.py); here its own
shell logic runs under ``WINDOW_TMP`` with a budget too short for any phase, so nothing trains.
"""

import os
import subprocess

from absl.testing import absltest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "benchmarks", "windows", "table2_window.sh")
RUN = "arch=softmax,stack=dense,opt=adamw,lr=0.001,seed=42"


def run(tmp, budget="100", **env):
    return subprocess.run(["bash", SCRIPT, budget], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "WINDOW_TMP": tmp, "OUT": os.path.join(tmp, "out"),
                               **env}, timeout=120)


class Table2WindowTest(absltest.TestCase):

    def test_records_are_restored_once_also_when_the_corpus_was_joined_by_hand(self):
        tmp = self.create_tempdir().full_path
        os.makedirs(os.path.join(tmp, "corpus", "prose-llama2"))  # joined by an earlier command
        result = run(tmp)
        self.assertIn("restored sweeps/table2", result.stdout, result.stderr)
        self.assertIn("table2: not started, ", result.stdout)
        metrics = os.path.join(tmp, "sweeps", "table2", "runs", RUN, "metrics.jsonl")
        self.assertTrue(os.path.isfile(metrics))
        self.assertTrue(os.path.isfile(os.path.join(tmp, "sweeps", "table2", "sweep.jsonl")))
        with open(metrics, "w") as f:
            f.write("newer\n")  # this window's own records
        result = run(tmp)
        self.assertNotIn("restored", result.stdout)
        with open(metrics) as f:
            self.assertEqual(f.read(), "newer\n")

    def test_missing_pieces_are_named_with_their_own_exit_status(self):
        tmp = self.create_tempdir().full_path
        result = run(tmp)
        self.assertEqual(result.returncode, 6)
        self.assertIn(os.path.join(tmp, "pieces", "prose-llama2.tar.xz.000"), result.stderr)
        self.assertFalse(os.path.exists(os.path.join(tmp, "sweeps")))

    def test_a_budget_that_is_not_a_number_prints_the_usage(self):
        tmp = self.create_tempdir().full_path
        for arg in ("--help", "9m"):
            result = run(tmp, budget=arg)
            self.assertEqual(result.returncode, 2)
            self.assertIn("Usage, on the", result.stderr)
            self.assertIn(f"<budget_s> is a whole number of seconds, not '{arg}'", result.stderr)
        self.assertEqual(os.listdir(tmp), [])


if __name__ == "__main__":
    absltest.main()
