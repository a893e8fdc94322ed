"""``experiments/halo_eval_subset.py``: a missing source file is reported with the flag to fix."""

import os
import subprocess
import sys

import pytest
from absl.testing import absltest, parameterized

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


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


if __name__ == "__main__":
    absltest.main()
