"""HALO losses against hand-computed values."""

import math

import jax.numpy as jnp
import numpy as np
from absl.testing import absltest

from lattn_jax.halo import losses


class LossesTest(absltest.TestCase):

    def test_layer_mse(self):
        s = jnp.array([1.0, 2.0, 3.0, 4.0]).reshape(2, 1, 1, 2)
        t = jnp.array([1.0, 0.0, 3.0, 1.0]).reshape(2, 1, 1, 2)
        self.assertAlmostEqual(float(losses.layer_mse(s, t)), (0 + 4 + 0 + 9) / 4, places=6)
        with self.assertRaisesRegex(ValueError, "shape"):
            losses.layer_mse(s, t[:1])

    def test_forward_kl_hand_computed(self):
        # p_T = (1/4, 3/4), p_S = (1/2, 1/2): KL = 1/4 ln(1/2) + 3/4 ln(3/2).
        kl1 = 0.25 * math.log(0.5) + 0.75 * math.log(1.5)
        t = jnp.array([[[0.0, math.log(3.0)], [0.0, 0.0]]])  # [1, 2, 2]
        s = jnp.zeros((1, 2, 2))
        np.testing.assert_allclose(losses.forward_kl(t, s), kl1 / 2, rtol=1e-6)
        # Padding masked: only the first token counts.
        w = jnp.array([[1.0, 0.0]])
        np.testing.assert_allclose(losses.forward_kl(t, s, w), kl1, rtol=1e-6)
        # Forward, not reverse: KL(S || T) = 1/2 ln 2 + 1/2 ln(2/3) differs.
        self.assertNotAlmostEqual(float(losses.forward_kl(s, t, w)), kl1, places=3)
        # Temperature 2: p_T = softmax((0, ln 3) / 2) = (1, sqrt 3) / (1 + sqrt 3).
        p = np.array([1.0, math.sqrt(3.0)]) / (1 + math.sqrt(3.0))
        np.testing.assert_allclose(losses.forward_kl(t, s, w, temperature=2.0),
                                   float(np.sum(p * np.log(p / 0.5))), rtol=1e-6)

    def test_vocab_truncation_and_chunks(self):
        rng = np.random.default_rng(0)
        t = jnp.asarray(rng.normal(size=(2, 5, 7)), jnp.float32)
        s = jnp.asarray(rng.normal(size=(2, 5, 9)), jnp.float32)
        w = jnp.asarray(rng.integers(0, 2, size=(2, 5)), jnp.float32)
        full = losses.forward_kl(t, s, w)
        ref = losses.forward_kl(t, s[..., :7], w)
        np.testing.assert_allclose(full, ref, rtol=1e-6)
        np.testing.assert_allclose(losses.forward_kl(t, s, w, chunk_size=3), full, rtol=1e-6)
        lt, ls = np.asarray(t), np.asarray(s[..., :7])
        pt = np.exp(lt) / np.exp(lt).sum(-1, keepdims=True)
        ps = np.exp(ls) / np.exp(ls).sum(-1, keepdims=True)
        kl = (pt * (np.log(pt) - np.log(ps))).sum(-1)
        np.testing.assert_allclose(full, (kl * np.asarray(w)).sum() / np.asarray(w).sum(),
                                   rtol=1e-5)
        self.assertAlmostEqual(float(losses.forward_kl(t, t)), 0.0, places=6)


if __name__ == "__main__":
    absltest.main()
