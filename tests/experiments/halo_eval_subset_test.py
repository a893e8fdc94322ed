"""``experiments/halo_eval_subset.py``: bad --src/--dst are reported with the flags to fix."""

import os
import shutil
import subprocess
import sys

import pytest
from absl.testing import absltest, parameterized

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FIXTURE = os.path.join(ROOT, "tests", "lattn_jax", "eval", "testdata", "eval_data")


@pytest.mark.entry
class HaloEvalSubsetTest(parameterized.TestCase):

    @parameterized.named_parameters(("subset", ["--limit=5"]), ("full", []))
    def test_missing_data_names_the_src_flag(self, extra):
        # Issue 32, trap 7: the error named --data_dir, a flag this binary does not have.
        src = self.create_tempdir().full_path
        dst = os.path.join(self.create_tempdir().full_path, "copy")
        cmd = [sys.executable, os.path.join(ROOT, "experiments", "halo_eval_subset.py"),
               f"--src={src}", f"--dst={dst}", "--tasks=piqa", *extra]
        result = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("--src", result.stderr)
        self.assertNotIn("--data_dir", result.stderr)
        self.assertIn(os.path.join(src, "eval", "piqa"), result.stderr)
        self.assertNotIn("Traceback", result.stderr)

    @parameterized.named_parameters(("same", ""), ("dot", "/."))
    def test_dst_equal_to_src_is_refused_before_writing(self, suffix):
        # Was a raw shutil.SameFileError traceback after the first copies.
        src = os.path.join(self.create_tempdir().full_path, "data")
        shutil.copytree(FIXTURE, src)
        before = sorted(os.walk(src))
        cmd = [sys.executable, os.path.join(ROOT, "experiments", "halo_eval_subset.py"),
               f"--src={src}", f"--dst={src}{suffix}", "--tasks=piqa"]
        result = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
        self.assertNotEqual(result.returncode, 0)
        lines = result.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, result.stderr)
        self.assertTrue(lines[0].startswith("error: "), lines[0])
        self.assertIn("--src", lines[0])
        self.assertIn("--dst", lines[0])
        self.assertEqual(sorted(os.walk(src)), before)


if __name__ == "__main__":
    absltest.main()
