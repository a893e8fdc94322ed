"""One home per kind of code (issue 34): the benchmarks depend on the library, never the reverse.

`benchmarks/` holds every benchmark, profiler and tuning tool with its helpers; it may import
`lattn_jax`, `pallas_kernels`, `configs` and run `experiments/` binaries, but nothing under
`lattn_jax/`, `pallas_kernels/`, `experiments/` or `configs/` imports `benchmarks`, at module
level or inside a function.
"""

import ast
import os
from typing import Iterator, List, Tuple

from absl.testing import absltest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
# Directories whose modules must not import the benchmarks package.
NO_BENCHMARK_IMPORTS = ("lattn_jax", "pallas_kernels", "experiments", "configs")


def _python_files(directory: str) -> Iterator[str]:
    for dirpath, dirnames, filenames in os.walk(directory):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith(".py"):
                yield os.path.join(dirpath, name)


def _is_benchmarks(module: str) -> bool:
    return module == "benchmarks" or module.startswith("benchmarks.")


def benchmark_imports(source: str) -> List[Tuple[int, str]]:
    """``(line, module)`` of every import of the ``benchmarks`` package in ``source``.

    Counts ``import benchmarks[.x]``, ``from benchmarks[.x] import y`` and calls of
    ``importlib.import_module`` / ``__import__`` with a literal module name, anywhere in the file.
    """
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if _is_benchmarks(a.name)]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module and _is_benchmarks(node.module):
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            arg = node.args[0]
            if (name in ("import_module", "__import__") and isinstance(arg, ast.Constant)
                    and isinstance(arg.value, str) and _is_benchmarks(arg.value)):
                found.append((node.lineno, arg.value))
    return sorted(found)


class LayoutTest(absltest.TestCase):

    def test_detects_every_import_form(self):
        source = ("import os\n"
                  "import benchmarks\n"
                  "from benchmarks import common as bench\n"
                  "def f():\n"
                  "    from benchmarks.common import time_calls\n"
                  "    import importlib\n"
                  "    return importlib.import_module('benchmarks.bench_train')\n"
                  "import benchmarks_other\n"
                  "from . import benchmarks_helpers\n")
        self.assertEqual(benchmark_imports(source),
                         [(2, "benchmarks"), (3, "benchmarks"), (5, "benchmarks.common"),
                          (7, "benchmarks.bench_train")])

    def test_library_and_binaries_do_not_import_benchmarks(self):
        offenders = []
        for top in NO_BENCHMARK_IMPORTS:
            for path in _python_files(os.path.join(ROOT, top)):
                with open(path, encoding="utf-8") as f:
                    for line, module in benchmark_imports(f.read()):
                        offenders.append(f"{os.path.relpath(path, ROOT)}:{line}: {module}")
        self.assertEmpty(offenders, "these import benchmarks/ (move the code they need out of "
                         "benchmarks/, or the module into it):\n" + "\n".join(offenders))

    def test_benchmark_tools_live_in_benchmarks(self):
        moved = ("bench_kernels", "bench_train", "bench_inference", "tune_kernels",
                 "kernel_registers")
        for name in moved:
            self.assertTrue(os.path.exists(os.path.join(ROOT, "benchmarks", name + ".py")), name)
            self.assertFalse(os.path.exists(os.path.join(ROOT, "experiments", name + ".py")), name)
        self.assertFalse(os.path.exists(os.path.join(ROOT, "lattn_jax", "benchmark.py")))


if __name__ == "__main__":
    absltest.main()
