"""Random test inputs from numpy's generator, shared by the kernel tests.

On CPU every ``jax.random`` call and every eager jnp op on a new shape compiles an XLA program
(about 20 ms each on the 2-core CI machine; a fifth of ``gated_delta_rule_test``'s time), so
the tests draw and transform their inputs in numpy (float64) and cast once.
"""

import numpy as np


def unit_rows(rng: np.random.Generator, shape) -> np.ndarray:
    """Standard-normal draws of ``shape`` (float64) with each last-axis row scaled to unit L2
    norm: the L2-normalised ``q`` and ``k`` of the delta-rule ops."""
    x = rng.standard_normal(shape)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def qkv(rng: np.random.Generator, batch: int, seq_len: int, key_heads: int, heads: int,
        dk: int, dv: int):
    """``(q, k, v)`` (float64) drawn in that order: ``q, k`` of ``[batch, seq_len, key_heads,
    dk]`` by :func:`unit_rows`, ``v`` of ``[batch, seq_len, heads, dv]`` standard normal."""
    q = unit_rows(rng, (batch, seq_len, key_heads, dk))
    k = unit_rows(rng, (batch, seq_len, key_heads, dk))
    return q, k, rng.standard_normal((batch, seq_len, heads, dv))


def sigmoid(x: np.ndarray) -> np.ndarray:
    """``1 / (1 + exp(-x))`` in numpy (``beta`` from standard-normal draws)."""
    return 1.0 / (1.0 + np.exp(-x))
