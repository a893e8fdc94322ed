"""Style is enforced in CI: flake8 with the settings in setup.cfg (STYLE.md item 42), and test
marks that absl's parameterized would drop."""

import ast
import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def test_flake8_is_clean():
    dirs = ["lattn_jax", "pallas_kernels", "experiments", "benchmarks", "configs", "tests"]
    result = subprocess.run([sys.executable, "-m", "flake8", *dirs], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, "flake8 found problems:\n" + result.stdout + result.stderr


def dropped_marks(source: str):
    """``(line, test name)`` of each method whose ``pytest.mark.*`` decorator sits above a
    ``parameterized.*`` one: absl's parameterized builds new methods from the decorated
    object, so a mark applied outside it is lost (the cases then run in CI although marked
    ``slow``); a mark below it (applied to the function first) is copied to every case, as is
    a mark on the class."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        names = [ast.unparse(d) for d in node.decorator_list]
        params = [i for i, n in enumerate(names) if n.startswith("parameterized.")]
        marks = [i for i, n in enumerate(names) if n.startswith("pytest.mark.")]
        if params and marks and min(marks) < max(params):
            found.append((node.lineno, node.name))
    return found


def test_dropped_marks_finds_a_mark_above_parameterized():
    source = ("class T:\n"
              "    @pytest.mark.slow\n    @parameterized.parameters(1, 2)\n"
              "    def test_a(self, x): pass\n"
              "    @parameterized.parameters(1, 2)\n    @pytest.mark.slow\n"
              "    def test_b(self, x): pass\n")
    assert dropped_marks(source) == [(4, "test_a")]


def test_no_test_mark_is_dropped_by_parameterized():
    bad = []
    for folder, _, files in os.walk(os.path.join(ROOT, "tests")):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path) as f:
                    bad += [f"{os.path.relpath(path, ROOT)}:{line} {test}"
                            for line, test in dropped_marks(f.read())]
    assert not bad, ("pytest marks above a parameterized decorator are dropped; put them below "
                     "it or on the class:\n" + "\n".join(bad))
