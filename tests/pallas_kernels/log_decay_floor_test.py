"""Hard resets and huge decays: every op's chunked form and GPU kernel against its ``lax.scan``
reference when some tokens carry ``g = -inf`` (decay 0) or ``g = -1e8``.

Before ``common.floor_log_decay`` (2026-12-03) the chunked forms' in-chunk differences of
cumulative log-decays turned ``-inf`` into NaN (Triton GDN and simple-GLA kernels, KDA's chunked
form and kernel) and ``-1e8`` into errors of 0.05-0.26 (the later gates rounded away). The
references apply ``exp(g_t)`` token by token and are exact for both.
"""

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized

from pallas_kernels import common
from pallas_kernels import gated_delta_rule as gdr
from pallas_kernels import gdn2 as gdn2_lib
from pallas_kernels import kda as kda_lib
from pallas_kernels import simple_gla as sgla

B, T, H, K, V = 1, 160, 2, 64, 64  # 2.5 chunks of 64; K, V: the kernels' smallest head dim
EVENTS = (5, 64, 100)  # inside the first chunk, the second chunk's first token, mid-chunk


def _inputs(seed, per_channel, event):
    # numpy's generator, not jax.random: each jax.random call (and each eager op on the
    # draws) on a new shape compiles a program.
    rng = np.random.default_rng(seed)

    def normal(*shape):
        return rng.standard_normal(shape)

    def l2(x):  # common.l2_normalize
        return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + 1e-6)

    def sigmoid(x):
        return 1.0 / (1.0 + np.exp(-x))

    q = l2(normal(B, T, H, K))
    k = l2(normal(B, T, H, K))
    v = normal(B, T, H, V)
    shape = (B, T, H, K) if per_channel else (B, T, H)
    g = -np.logaddexp(0.0, normal(*shape)) * 0.5  # -softplus / 2
    idx = list(EVENTS)
    if per_channel:  # the event on some key channels only
        g[:, idx, :, : K // 4] = event
    else:
        g[:, idx] = event
    beta = sigmoid(normal(B, T, H))
    b = sigmoid(normal(B, T, H, K))
    w = sigmoid(normal(B, T, H, V))
    return tuple(jnp.asarray(x, jnp.float32) for x in (q, k, v, g, beta, b, w))


def _call(op, impl, x):
    q, k, v, g, beta, b, w = x
    kw = dict(implementation=impl, output_final_state=True)
    if op == "gdn":
        return gdr.gated_delta_rule(q, k, v, g, beta, **kw)
    if op == "simple_gla":
        return sgla.simple_gla(q, k, v, g, **kw)
    if op == "kda":
        return kda_lib.kda(q, k, v, g, beta, **kw)
    return gdn2_lib.gdn2(q, k, v, g, b, w, **kw)


_CASES = [(f"{op}_{impl}_{name}", op, impl, event)
          for op in ("gdn", "simple_gla", "kda", "gdn2")
          for impl in ("chunked", "pallas_interpret")
          for name, event in (("neg_inf", -np.inf), ("neg_1e8", -1e8))]


class LogDecayFloorTest(parameterized.TestCase):

    def test_floor_values(self):
        g = jnp.asarray([0.0, -3.5, -127.0, -128.0, -129.0, -1e8, -np.inf, np.nan], jnp.float32)
        got = np.asarray(common.floor_log_decay(g))
        np.testing.assert_array_equal(got[:4], [0.0, -3.5, -127.0, -128.0])
        np.testing.assert_array_equal(got[4:7], [-128.0] * 3)
        self.assertTrue(np.isnan(got[7]))
        # The floor's decay is exactly 0 in fp32, as exp(g) of any g <= -104 is.
        self.assertEqual(float(jnp.exp(jnp.float32(common.LOG_DECAY_FLOOR))), 0.0)
        self.assertEqual(float(jnp.exp(jnp.float32(-104.0))), 0.0)

    @parameterized.named_parameters(*_CASES)
    def test_matches_reference(self, op, impl, event):
        x = _inputs(len(op) + (event == -np.inf), op in ("kda", "gdn2"), event)
        o_ref, s_ref = _call(op, "reference", x)
        o, s = _call(op, impl, x)
        for name, got, want in (("o", o, o_ref), ("final_state", s, s_ref)):
            got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
            self.assertTrue(np.isfinite(got).all(), f"{name} has NaN/inf")
            # fp32 inputs: the chunked forms agree with the recurrence to summation order
            # (measured <= 2e-5 here); the kernels' dots run at bf16-class precision.
            tol = 1e-4 if impl == "chunked" else 2e-2
            np.testing.assert_allclose(got, want, atol=tol, rtol=tol, err_msg=name)

    @parameterized.named_parameters(("gdn", "gdn"), ("kda", "kda"))
    def test_gradients_finite_and_match(self, op):
        """The chunked form's gradients with -inf events: finite, equal to the reference's for
        q, k, v, and 0 for g at the events (the fp32 value of d exp(g) / dg there)."""
        x = _inputs(3, op == "kda", -np.inf)
        q, k, v, g = x[:4]

        def loss(impl):
            def f(q, k, v, g):
                o, s = _call(op, impl, (q, k, v, g) + x[4:])
                return jnp.sum(o * jnp.cos(o)) + jnp.sum(s)
            return jax.grad(f, argnums=(0, 1, 2, 3))(q, k, v, g)

        got, want = loss("chunked"), loss("reference")
        for name, a, r in zip("qkv", got[:3], want[:3]):
            self.assertTrue(np.isfinite(np.asarray(a)).all(), name)
            np.testing.assert_allclose(np.asarray(a), np.asarray(r), atol=1e-4, rtol=1e-4,
                                       err_msg=name)
        dg = np.asarray(got[3])
        self.assertTrue(np.isfinite(dg).all())
        at = (np.asarray(g) == -np.inf)
        np.testing.assert_array_equal(dg[at], 0.0)
        dg_ref = np.asarray(want[3])
        ok = ~at & np.isfinite(dg_ref)
        np.testing.assert_allclose(dg[ok], dg_ref[ok], atol=1e-4, rtol=1e-4)

    def test_kernel_floor_gradient_is_floor_log_decays(self):
        """The per-channel Pallas kernels floor g in their gamma kernel and take dg through
        ``common.floor_log_decay_grad``: the same values as ``jax.vjp`` of
        ``floor_log_decay`` (1 above the floor, 1/2 at it, 0 below), bit for bit."""
        g = jnp.asarray([0.0, -3.5, -127.0, -128.0, -129.0, -1e8, -np.inf, -127.99999],
                        jnp.float32)
        dg = jnp.asarray(np.random.default_rng(0).standard_normal(g.shape), jnp.float32)
        want = jax.vjp(common.floor_log_decay, g)[1](dg)[0]
        got = common.floor_log_decay_grad(g, dg)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        self.assertEqual(float(got[3]), 0.5 * float(dg[3]))

    @parameterized.named_parameters(("kda", "kda"), ("gdn2", "gdn2"))
    def test_kernel_gradients_finite_and_match(self, op):
        """The Pallas GPU path (interpreted) with -inf events and one token exactly at the
        floor: its gradients finite, 0 for g at the events, the others the reference's."""
        x = list(_inputs(4, True, -np.inf))
        x[3] = x[3].at[:, 30, :, 5].set(common.LOG_DECAY_FLOOR)  # a tie: dg halved
        q, k, v, g = x[:4]

        def grads(impl):
            def f(q, k, v, g):
                o, s = _call(op, impl, (q, k, v, g) + tuple(x[4:]))
                return jnp.sum(o * jnp.cos(o)) + jnp.sum(s)
            return jax.grad(f, argnums=(0, 1, 2, 3))(q, k, v, g)

        got, want = grads("pallas_interpret"), grads("reference")
        for name, a, r in zip("qkvg", got, want):
            a, r = np.asarray(a), np.asarray(r)
            self.assertTrue(np.isfinite(a).all(), name)
            ok = np.isfinite(r) & (np.asarray(g) > common.LOG_DECAY_FLOOR)
            np.testing.assert_allclose(a[ok], r[ok], atol=3e-2, rtol=3e-2, err_msg=name)
        dg = np.asarray(got[3])
        np.testing.assert_array_equal(dg[np.asarray(g) == -np.inf], 0.0)


if __name__ == "__main__":
    absltest.main()
