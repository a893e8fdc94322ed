"""Test-session settings shared by every test file.

* On CPU, ``jax_disable_most_optimizations`` cuts XLA compile time several-fold; the tests run
  tiny shapes, where compilation, not execution, dominates (STYLE item 38). It is left off on
  GPU, where jax 0.11.2's unoptimised pipeline hit an XLA internal error.
* On CPU, compiled programs also go to a persistent compilation cache in a fresh temporary
  directory of this process (removed at exit; nothing is reused across runs). Many tests compile
  the same program again: every ``Trainer`` (a training run, its resume, a restore check) jits
  its own steps, so a kill-and-resume test compiled one train step four times. A cache hit
  returns the executable of the identical program (same HLO, options and backend), so nothing
  the tests check changes; programs with host callbacks (Pallas interpret mode) are never
  cached by JAX.
* On CPU, XLA generates each fusion with its legacy elemental emitters instead of the newer
  MLIR fusion emitters (``--xla_cpu_use_fusion_emitters=false``, appended to ``XLA_FLAGS``
  before the backend starts). Most of the suite's time is XLA compiling small programs (eager
  ops, one per op and shape), and the fusion emitters' pipeline roughly doubled the cost of
  each: 100 shapes of four small ops compiled in 19 s with them and 11.5 s without, and the
  CI suite (``-n 2 -m "not slow"``, interop tests included) ran in 497 s instead of 732 s
  (2026-12-02, jax 0.10.2, 2 cores, back to back). Both emitters compile the same HLO; the
  tests check our math, not XLA's choice of code generator. Only jaxlib <= 0.11.0 has the
  flag (0.11.1 removed it with the legacy emitters, and XLA stops the process on an unknown
  flag), so newer versions run without it; an ``XLA_FLAGS`` that already names it is left as
  it is. Subprocesses started by tests inherit it through the environment (the multi-device
  workers of ``sharding_test`` and ``context_parallel_test`` add their device count to it).
* Matmuls run at ``highest`` precision so that fp32 comparisons against fp64 references are not
  limited by TF32 on GPUs; the ops themselves already request HIGHEST where it matters.
* Under ``pytest -n N`` (pytest-xdist) without an explicit ``--dist``, each test file runs on
  one worker (xdist's ``loadfile`` scheduling) instead of ``load``, which deals the first
  quarter of the tests out one by one, so that both workers paid the warm-up compiles (eager
  ops, module-level jitted references) of nearly every file. On the 2-core CI machine this cut
  the wall time of ``-n 2`` runs by about 10-15 % (tests/lattn_jax 279 -> 252 s,
  tests/pallas_kernels 317 -> 264 s).
* absltest's default test tmpdir exists before any test runs (tests pass it to
  ``tempfile.mkdtemp``; only ``absltest.main()`` and ``create_tempdir`` create it).
* The tests named in ``tests/ci_slow.py`` are marked ``slow`` at collection (before ``-m``
  selects): second checks moved out of the CI run to keep it under 15 minutes.
* After the run, the tests marked ``interop`` (lm-evaluation-harness, ``transformers``, the
  SmolLM2 GGUF file) are listed with their outcomes, skip reasons included, and counted in one
  line, ``interop: N passed, N skipped, N failed``: they skip when an optional package is
  missing, and the CI log has to show that they ran.
"""

import atexit
import importlib.metadata
import os
import shutil
import tempfile

import jax
import pytest
from absl import flags
from absl.testing import absltest

_FUSION_EMITTERS_FLAG = "--xla_cpu_use_fusion_emitters=false"


def _jaxlib_has_fusion_emitters_flag():
    """Whether this jaxlib's XLA knows ``--xla_cpu_use_fusion_emitters`` (<= 0.11.0)."""
    try:
        version = importlib.metadata.version("jaxlib")
    except importlib.metadata.PackageNotFoundError:
        return False
    numbers = []
    for part in version.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        numbers.append(int(digits or 0))
    return tuple(numbers) <= (0, 11, 0)


# Before anything starts a backend (jax.default_backend() below does): XLA reads XLA_FLAGS
# once. The flag only changes how XLA:CPU generates code; a GPU or TPU backend ignores it.
if ("xla_cpu_use_fusion_emitters" not in os.environ.get("XLA_FLAGS", "")
        and _jaxlib_has_fusion_emitters_flag()):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FUSION_EMITTERS_FLAG}".strip()

if jax.default_backend() == "cpu":
    jax.config.update("jax_disable_most_optimizations", True)
    _XLA_CACHE_DIR = tempfile.mkdtemp(prefix="lattn-jax-tests-xla-cache-")
    atexit.register(shutil.rmtree, _XLA_CACHE_DIR, ignore_errors=True)
    jax.config.update("jax_compilation_cache_dir", _XLA_CACHE_DIR)
    # Cache only programs that took a while to compile (train and eval steps, whole models);
    # the many small eager-op programs would cost more to write than to recompile.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.1)
jax.config.update("jax_default_matmul_precision", "highest")

# absltest helpers (create_tempdir, ...) read absl flags; under pytest nothing parses them.
if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
# absltest's default test tmpdir (``$TMPDIR/absl_testing``) is created only by absltest.main()
# or create_tempdir(); a test that passes it to tempfile.mkdtemp failed with FileNotFoundError
# when its file ran alone on a fresh machine (elsewhere an earlier test had created it).
os.makedirs(absltest.get_default_test_tmpdir(), exist_ok=True)


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``loadfile`` scheduling for ``-n`` unless ``--dist`` was given (see the docstring)."""
    args = list(config.invocation_params.args)
    if config.getoption("dist") != "load" or any(str(a).startswith("--dist") for a in args):
        return None
    from xdist.scheduler import LoadFileScheduling  # pylint: disable=import-outside-toplevel
    return LoadFileScheduling(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Marks ``slow`` the tests listed in ``tests/ci_slow.py`` (see the module docstring)."""
    del config
    from tests.ci_slow import is_ci_slow  # pylint: disable=import-outside-toplevel
    for item in items:
        if is_ci_slow(item.nodeid):
            item.add_marker(pytest.mark.slow)


_INTEROP_RANK = {"passed": 0, "skipped": 1, "failed": 2}
_interop_outcomes = {}  # nodeid -> (outcome, skip reason)


def pytest_runtest_logreport(report):
    """Keeps the worst outcome of each ``interop`` test over its phases and subtests."""
    if "interop" not in report.keywords:
        return
    subtest = getattr(report, "context", None) is not None
    if report.failed:
        outcome, reason = "failed", ""
    elif report.skipped and not subtest:
        longrepr = report.longrepr
        outcome = "skipped"
        reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else ""
    elif report.when == "call" and not subtest:
        outcome, reason = "passed", ""
    else:
        return
    old = _interop_outcomes.get(report.nodeid)
    if old is None or _INTEROP_RANK[outcome] > _INTEROP_RANK[old[0]]:
        _interop_outcomes[report.nodeid] = (outcome, reason)


def pytest_terminal_summary(terminalreporter):
    """Lists the ``interop`` tests that ran (under xdist: on the controller) and counts them."""
    if not _interop_outcomes or hasattr(terminalreporter.config, "workerinput"):
        return
    terminalreporter.write_sep("=", "interop tests (lm-evaluation-harness, transformers, "
                                    "SmolLM2 GGUF)")
    for nodeid, (outcome, reason) in sorted(_interop_outcomes.items()):
        why = f" - {reason}" if reason else ""
        terminalreporter.write_line(f"{outcome.upper()} {nodeid}{why}")
    counts = {k: sum(o == k for o, _ in _interop_outcomes.values()) for k in _INTEROP_RANK}
    terminalreporter.write_line(f"interop: {counts['passed']} passed, {counts['skipped']} "
                                f"skipped, {counts['failed']} failed")
