"""benchmarks/gpu_tests.py: parallel marked tests under one deadline, on a stand-in test tree.

The binary spends rationed GPU time, and its summary is the only record of which GPU tests ran.
These tests run it here on a throw-away tree of ``gpu``-marked tests that pass, fail, skip or
sleep past the deadline, and check each test's recorded outcome and the exit status.
"""

import json
import os
import subprocess
import sys
import textwrap

from absl.testing import absltest

from benchmarks import gpu_tests

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "benchmarks", "gpu_tests.py")

TESTS = textwrap.dedent("""\
    import time
    import pytest

    pytestmark = pytest.mark.gpu

    def test_a_passes():
        assert sum(range(4)) == 6

    def test_b_fails():
        assert sum(range(4)) == 7

    def test_c_skips():
        pytest.skip("no accelerator")

    def test_d_sleeps():
        time.sleep(60)
    """)


class GpuTestsTest(absltest.TestCase):

    def _tree(self, body=TESTS):
        root = self.create_tempdir().full_path
        with open(os.path.join(root, "pytest.ini"), "w") as f:
            f.write("[pytest]\nmarkers =\n    gpu: needs a GPU\n    slow: slow\n")
        with open(os.path.join(root, "stand_in_test.py"), "w") as f:
            f.write(body)
        return root

    def _run(self, root, *flags):
        out = os.path.join(root, "out")
        proc = subprocess.run([sys.executable, SCRIPT, f"--out={out}", *flags,
                               "stand_in_test.py"], cwd=root, capture_output=True, text=True,
                              timeout=120, check=False)
        return proc, out

    def test_outcomes_deadline_and_exit_status(self):
        root = self._tree()
        proc, out = self._run(root, "--jobs=2", "--deadline_s=8", "--grace_s=10")
        self.assertEqual(proc.returncode, 1, proc.stdout + proc.stderr)
        with open(os.path.join(out, "summary.json")) as f:
            summary = json.load(f)
        name = "stand_in_test.py::test_{}"
        self.assertEqual(summary["tests"], {
            name.format("a_passes"): "passed", name.format("b_fails"): "failed",
            name.format("c_skips"): "skipped", name.format("d_sleeps"): "not run"})
        self.assertEqual(summary["counts"],
                         {"passed": 1, "failed": 1, "skipped": 1, "not run": 1})
        self.assertEqual(summary["jobs"], 2)
        self.assertEqual(summary["interrupted_workers"], 1)
        self.assertIn("FAILED: stand_in_test.py::test_b_fails", proc.stdout)
        for k in range(2):
            self.assertTrue(os.path.exists(os.path.join(out, f"worker-{k}.log")))
        with open(os.path.join(out, "summary.md")) as f:
            self.assertIn("| `stand_in_test.py::test_d_sleeps` | not run |", f.read())

    def test_all_pass_exits_zero_and_nothing_collected_exits_three(self):
        root = self._tree("import pytest\n\n@pytest.mark.gpu\ndef test_ok():\n"
                          "    assert 2 + 2 == 4\n\ndef test_unmarked():\n    assert False\n")
        proc, out = self._run(root, "--jobs=4")
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        with open(os.path.join(out, "summary.json")) as f:
            self.assertEqual(json.load(f)["tests"], {"stand_in_test.py::test_ok": "passed"})
        proc, _ = self._run(root, "--marker=tpu")
        self.assertEqual(proc.returncode, 3)
        self.assertIn("no test under", proc.stderr)
        proc, _ = self._run(root, "--jobs=0")
        self.assertEqual(proc.returncode, 3)
        self.assertIn("--jobs=0 must be at least 1", proc.stderr)

    def test_split_and_parse(self):
        self.assertEqual(gpu_tests.split_round_robin(list("abcde"), 2),
                         [["a", "c", "e"], ["b", "d"]])
        self.assertEqual(gpu_tests.split_round_robin(list("ab"), 8), [["a"], ["b"]])
        log = ("f.py::T::test_x PASSED                [ 50%]\n"
               "f.py::T::test_x ERROR                 [ 50%]\n"
               "f.py::T::test_y[a-1] FAILED           [100%]\n"
               "FAILED f.py::T::test_y[a-1] - assert 0\n")
        self.assertEqual(gpu_tests.parse_log(log),
                         {"f.py::T::test_x": "passed", "f.py::T::test_y[a-1]": "failed"})
        self.assertEqual(gpu_tests.exit_status({"passed": 3, "not run": 1}), 2)
        self.assertEqual(gpu_tests.exit_status({"passed": 3, "error": 1, "not run": 1}), 1)


if __name__ == "__main__":
    absltest.main()
