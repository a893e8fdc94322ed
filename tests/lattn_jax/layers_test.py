"""lattn_jax.layers.apply_rope against a float64 NumPy rotate-half reference."""

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized

from lattn_jax import layers


def rope_reference(x, positions, theta):
    """Rotate-half RoPE (Su et al. 2021, Eq. 34) in float64: the pair (i, i + K/2) rotates by
    ``positions * theta^(-2i/K)``."""
    x = np.asarray(x, np.float64)
    half = x.shape[-1] // 2
    inv_freq = theta ** (-np.arange(half, dtype=np.float64) * 2 / x.shape[-1])
    angles = np.asarray(positions, np.float64)[..., None, None] * inv_freq  # [B, T, 1, K/2]
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * np.cos(angles) - x2 * np.sin(angles),
                           x2 * np.cos(angles) + x1 * np.sin(angles)], axis=-1)


class ApplyRopeTest(parameterized.TestCase):

    # Angles are fp32 (as the models compute them): at positions up to 5,000 an angle is off by
    # up to about 5000 * 2^-24 rad, so |x| <= 4.5 allows about 1.5e-3 in fp32; bf16 rounds the
    # output (2^-8 relative).
    @parameterized.parameters((jnp.float32, 1e-5, 1.5e-3), (jnp.bfloat16, 1e-2, 3e-2))
    def test_matches_float64_reference(self, dtype, rtol, atol):
        rng = np.random.default_rng(0)
        x = rng.standard_normal((2, 37, 3, 16)).astype(np.float32)
        positions = rng.integers(0, 5000, size=(2, 37))
        got = layers.apply_rope(jnp.asarray(x, dtype), jnp.asarray(positions), 10000.0)
        self.assertEqual(got.dtype, dtype)
        want = rope_reference(np.asarray(jnp.asarray(x, dtype), np.float64), positions, 10000.0)
        np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=rtol, atol=atol)

    def test_relative_position_and_gradient(self):
        # <R_m q, R_n k> depends only on m - n; the map is a rotation, so its vector-Jacobian
        # product is the inverse rotation (the rotation by -positions).
        rng = np.random.default_rng(1)
        q = jnp.asarray(rng.standard_normal((1, 1, 1, 8)), jnp.float32)
        k = jnp.asarray(rng.standard_normal((1, 1, 1, 8)), jnp.float32)

        def dot(m, n):
            return float(jnp.sum(layers.apply_rope(q, jnp.array([[m]]), 500.0)
                                 * layers.apply_rope(k, jnp.array([[n]]), 500.0)))

        self.assertAlmostEqual(dot(7, 3), dot(104, 100), places=4)
        self.assertNotAlmostEqual(dot(7, 3), dot(3, 7), places=3)
        positions = jnp.asarray(rng.integers(0, 100, size=(1, 5)))
        x = jnp.asarray(rng.standard_normal((1, 5, 2, 8)), jnp.float32)
        ct = jnp.asarray(rng.standard_normal((1, 5, 2, 8)), jnp.float32)
        _, vjp = jax.vjp(lambda x: layers.apply_rope(x, positions, 500.0), x)
        np.testing.assert_allclose(vjp(ct)[0], rope_reference(ct, -positions, 500.0),
                                   rtol=1e-5, atol=1e-5)


if __name__ == "__main__":
    absltest.main()
