"""Style is enforced in CI: flake8 with the settings in setup.cfg (STYLE.md item 42)."""

import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def test_flake8_is_clean():
    dirs = ["lattn_jax", "pallas_kernels", "experiments", "benchmarks", "configs", "tests"]
    result = subprocess.run([sys.executable, "-m", "flake8", *dirs], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, "flake8 found problems:\n" + result.stdout + result.stderr
