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
* Matmuls run at ``highest`` precision so that fp32 comparisons against fp64 references are not
  limited by TF32 on GPUs; the ops themselves already request HIGHEST where it matters.
* Under ``pytest -n N`` (pytest-xdist) without an explicit ``--dist``, each test file runs on
  one worker (xdist's ``loadfile`` scheduling) instead of ``load``, which deals the first
  quarter of the tests out one by one, so that both workers paid the warm-up compiles (eager
  ops, module-level jitted references) of nearly every file. On the 2-core CI machine this cut
  the wall time of ``-n 2`` runs by about 10-15 % (tests/lattn_jax 279 -> 252 s,
  tests/pallas_kernels 317 -> 264 s).
"""

import atexit
import shutil
import tempfile

import jax
import pytest
from absl import flags

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


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``loadfile`` scheduling for ``-n`` unless ``--dist`` was given (see the docstring)."""
    args = list(config.invocation_params.args)
    if config.getoption("dist") != "load" or any(str(a).startswith("--dist") for a in args):
        return None
    from xdist.scheduler import LoadFileScheduling  # pylint: disable=import-outside-toplevel
    return LoadFileScheduling(config, log)
