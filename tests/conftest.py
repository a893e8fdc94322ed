"""Test-session settings shared by every test file.

* On CPU, ``jax_disable_most_optimizations`` cuts XLA compile time several-fold; the tests run
  tiny shapes, where compilation, not execution, dominates (STYLE item 38). It is left off on
  GPU, where jax 0.11.2's unoptimised pipeline hit an XLA internal error.
* Matmuls run at ``highest`` precision so that fp32 comparisons against fp64 references are not
  limited by TF32 on GPUs; the ops themselves already request HIGHEST where it matters.
"""

import jax
from absl import flags

if jax.default_backend() == "cpu":
    jax.config.update("jax_disable_most_optimizations", True)
jax.config.update("jax_default_matmul_precision", "highest")

# absltest helpers (create_tempdir, ...) read absl flags; under pytest nothing parses them.
if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
