"""One home per kind of code (issue 34): the benchmarks depend on the library, never the reverse,
and the kernel packages share code only through public names.

`benchmarks/` holds every benchmark, profiler and tuning tool with its helpers; it may import
`lattn_jax`, `pallas_kernels`, `configs` and run `experiments/` binaries, but nothing under
`lattn_jax/`, `pallas_kernels/`, `experiments/` or `configs/` imports `benchmarks`, at module
level or inside a function.

Inside `pallas_kernels/`, each op package (`gated_delta_rule`, `kda`, ...) and `common/` use
only public names of another package: a helper that two packages need is public in `common/`.
`common/` imports no op package. `lattn_jax/`, `experiments/` and `configs/` use only public
names of `pallas_kernels`. (Tests and the kernel tools in `benchmarks/` may reach private names
of the module they test or time.)
"""

import ast
import os
from typing import Iterator, List, Tuple

from absl.testing import absltest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
# Directories whose modules must not import the benchmarks package.
NO_BENCHMARK_IMPORTS = ("lattn_jax", "pallas_kernels", "experiments", "configs")
# STYLE item 4's "under ~100 lines" for the absl binaries in experiments/, with some slack.
MAX_BINARY_LINES = 120


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
    if "benchmarks" not in source:  # every form counted names it literally
        return []
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


def _is_pallas_module(dotted: str) -> bool:
    """Whether ``dotted`` names a module or package of ``pallas_kernels`` in this tree."""
    path = os.path.join(ROOT, *dotted.split("."))
    return (dotted.split(".")[0] == "pallas_kernels"
            and (os.path.isfile(path + ".py") or os.path.isfile(os.path.join(path, "__init__.py"))))


def _package_of(dotted: str) -> str:
    """The package of a ``pallas_kernels`` module: ``pallas_kernels.kda.api`` -> ``kda``
    (``""`` for the top-level package itself)."""
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 else ""


def private_uses(source: str, package: str = None, is_module=_is_pallas_module
                 ) -> List[Tuple[int, str]]:
    """``(line, name)`` of every private name of another ``pallas_kernels`` package in ``source``.

    ``package`` is the source's own package under ``pallas_kernels`` (``"kda"``, ``"common"``;
    ``None`` outside ``pallas_kernels``). Counts ``from pallas_kernels.x[.y] import _name`` and
    ``m._name`` where ``m`` is bound to a module of another package (``import ... as m``,
    ``from pallas_kernels.x import m``, or an attribute chain from such a name). Dunder names
    are not private.
    """
    def private(name):
        return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))

    if "pallas_kernels" not in source:  # nothing can name a pallas_kernels module
        return []
    modules = {}  # local name -> dotted pallas_kernels module it is bound to
    found = []
    attributes = []  # private attribute nodes, resolved once every import is known
    for node in ast.walk(ast.parse(source)):  # one walk: most of this test's time
        if isinstance(node, ast.Attribute):
            if private(node.attr):
                attributes.append(node)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "pallas_kernels":
                    if a.asname:
                        modules[a.asname] = a.name
                    else:
                        modules["pallas_kernels"] = "pallas_kernels"
        elif (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
              and node.module.split(".")[0] == "pallas_kernels"):
            for a in node.names:
                dotted = node.module + "." + a.name
                if is_module(dotted):
                    modules[a.asname or a.name] = dotted
                elif private(a.name) and _package_of(node.module) != package:
                    found.append((node.lineno, dotted))

    def resolve(expr):
        if isinstance(expr, ast.Name):
            return modules.get(expr.id)
        if isinstance(expr, ast.Attribute):
            base = resolve(expr.value)
            if base and is_module(base + "." + expr.attr):
                return base + "." + expr.attr
        return None

    for node in attributes:
        base = resolve(node.value)
        if base and _package_of(base) != package:
            found.append((node.lineno, base + "." + node.attr))
    return sorted(found)


def _op_imports_of_common(source: str) -> List[Tuple[int, str]]:
    """``(line, module)`` of every import of a ``pallas_kernels`` op package in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [node.module + "." + a.name for a in node.names]
                 if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
        for name in names:
            parts = name.split(".")
            if parts[0] == "pallas_kernels" and len(parts) > 1 and parts[1] != "common":
                found.append((node.lineno, name))
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

    def test_detects_private_names_of_other_packages(self):
        source = ("import pallas_kernels.kda.api as kda_api\n"
                  "from pallas_kernels import common\n"
                  "from pallas_kernels.common import pallas_gpu, channelwise_gpu as cw\n"
                  "from pallas_kernels.common.pallas_gpu import _dot, mm\n"
                  "import pallas_kernels.gdn2.api\n"
                  "x = kda_api._forward, common._helper, cw._config, pallas_gpu.mm\n"
                  "y = pallas_kernels.gdn2.api._validate, common.__name__, obj._private\n"
                  "from pallas_kernels.kda import reference\n"
                  "z = reference._step\n")
        modules = {"pallas_kernels", "pallas_kernels.kda", "pallas_kernels.kda.api",
                   "pallas_kernels.kda.reference", "pallas_kernels.common",
                   "pallas_kernels.common.pallas_gpu", "pallas_kernels.common.channelwise_gpu",
                   "pallas_kernels.gdn2", "pallas_kernels.gdn2.api"}
        self.assertEqual(private_uses(source, "kda", modules.__contains__),
                         [(4, "pallas_kernels.common.pallas_gpu._dot"),
                          (6, "pallas_kernels.common._helper"),
                          (6, "pallas_kernels.common.channelwise_gpu._config"),
                          (7, "pallas_kernels.gdn2.api._validate")])
        self.assertEqual(len(private_uses(source, None, modules.__contains__)), 6)

    def test_no_private_names_across_kernel_packages(self):
        offenders = []
        for top in ("pallas_kernels",) + tuple(t for t in NO_BENCHMARK_IMPORTS
                                               if t != "pallas_kernels"):
            for path in _python_files(os.path.join(ROOT, top)):
                rel = os.path.relpath(path, ROOT)
                parts = rel.split(os.sep)
                package = parts[1] if top == "pallas_kernels" and len(parts) > 2 else None
                if top == "pallas_kernels" and package is None:
                    package = ""  # pallas_kernels/__init__.py
                with open(path, encoding="utf-8") as f:
                    for line, name in private_uses(f.read(), package):
                        offenders.append(f"{rel}:{line}: {name}")
        self.assertEmpty(offenders, "these use a private name of another package (make the "
                         "helper public in pallas_kernels/common/):\n" + "\n".join(offenders))

    def test_common_imports_no_op_package(self):
        offenders = []
        for path in _python_files(os.path.join(ROOT, "pallas_kernels", "common")):
            with open(path, encoding="utf-8") as f:
                for line, module in _op_imports_of_common(f.read()):
                    offenders.append(f"{os.path.relpath(path, ROOT)}:{line}: {module}")
        self.assertEmpty(offenders, "pallas_kernels/common/ is shared by every op and imports "
                         "none of them:\n" + "\n".join(offenders))

    def test_benchmark_tools_live_in_benchmarks(self):
        moved = ("bench_kernels", "bench_train", "bench_inference", "tune_kernels",
                 "kernel_registers")
        for name in moved:
            self.assertTrue(os.path.exists(os.path.join(ROOT, "benchmarks", name + ".py")), name)
            self.assertFalse(os.path.exists(os.path.join(ROOT, "experiments", name + ".py")), name)
        self.assertFalse(os.path.exists(os.path.join(ROOT, "lattn_jax", "benchmark.py")))

    def test_binaries_are_thin(self):
        # STYLE item 4: absl binaries parse flags and call the library (~100 lines); their
        # logic lives in lattn_jax/ (sweep.py -> lattn_jax/sweep_driver.py, evaluate.py ->
        # lattn_jax/eval/driver.py, halo_pipeline.py -> lattn_jax/halo/pipeline.py,
        # generate_corpus.py -> lattn_jax/halo/corpus_driver.py; 2026-12-05).
        offenders = []
        for path in _python_files(os.path.join(ROOT, "experiments")):
            with open(path, encoding="utf-8") as f:
                n = len(f.read().splitlines())
            if n > MAX_BINARY_LINES:
                offenders.append(f"{os.path.relpath(path, ROOT)}: {n} lines")
        self.assertEmpty(offenders, f"binaries over {MAX_BINARY_LINES} lines: move their logic "
                         f"into lattn_jax/:\n" + "\n".join(offenders))

    def test_test_files_end_with_their_main_guard(self):
        # A test class defined after `if __name__ == "__main__": absltest.main()` is collected
        # by pytest but skipped when the file runs as a script (five files had one, 2026-12-06).
        offenders = []
        for path in _python_files(os.path.join(ROOT, "tests")):
            if not path.endswith("_test.py"):
                continue
            with open(path, encoding="utf-8") as f:
                body = ast.parse(f.read()).body
            guards = [i for i, node in enumerate(body) if isinstance(node, ast.If)
                      and ast.unparse(node.test) == "__name__ == '__main__'"]
            if guards and guards[-1] != len(body) - 1:
                offenders.append(os.path.relpath(path, ROOT))
        self.assertEmpty(offenders, "code after the main guard: " + ", ".join(offenders))


if __name__ == "__main__":
    absltest.main()
