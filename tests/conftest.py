"""Test-session settings shared by every test file.

``jax_disable_most_optimizations`` cuts XLA compile time on CPU several-fold; the tests run tiny
shapes, where compilation, not execution, dominates (STYLE item 38).
"""

import jax

jax.config.update("jax_disable_most_optimizations", True)

# absltest helpers (create_tempdir, ...) read absl flags; under pytest nothing parses them.
from absl import flags  # noqa: E402

if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
