"""lattn_jax.layers: apply_rope against a float64 NumPy rotate-half reference; swiglu,
swiglu_packed and rms_norm with their hand-written backwards against float64 references and
fp32 autodiff; SwiGLU packed against unpacked (same parameters, values and gradients);
causal_conv1d (ShortConv's math) and its gradient against a float64 reference and fp32
autodiff of an independent formulation; ShortConv against a float64 NumPy convolution and its
conv_state check."""

import re

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized

from flax import nnx

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


def swiglu_reference(gate, up, dy):
    """float64 ``SiLU(gate) * up`` and its vector-Jacobian product by the product rule."""
    g, u, d = (np.asarray(a, np.float64) for a in (gate, up, dy))
    s = 1.0 / (1.0 + np.exp(-g))
    return g * s * u, d * u * (s + g * s * (1.0 - s)), d * g * s


class SwiGLUTest(parameterized.TestCase):

    # bf16: forward as the plain expression (two bf16 roundings); gradients rounded once from
    # fp32 (one bf16 rounding, 2^-8 relative), so they are closer to float64 than autodiff's.
    @parameterized.parameters((jnp.float32, 1e-6), (jnp.bfloat16, 1.6e-2))
    def test_matches_float64(self, dtype, rtol):
        rng = np.random.default_rng(0)
        gate, up, dy = (jnp.asarray(rng.standard_normal((3, 17, 40)) * 3, dtype)
                        for _ in range(3))
        y, vjp = jax.vjp(layers.swiglu, gate, up)
        d_gate, d_up = vjp(dy)
        self.assertEqual((y.dtype, d_gate.dtype, d_up.dtype), (dtype,) * 3)
        # The forward is the plain expression's, bit for bit.
        np.testing.assert_array_equal(np.asarray(y), np.asarray(jax.nn.silu(gate) * up))
        want = swiglu_reference(gate, up, dy)
        for name, got, ref in (("y", y, want[0]), ("d_gate", d_gate, want[1]),
                               ("d_up", d_up, want[2])):
            np.testing.assert_allclose(np.asarray(got, np.float64), ref, rtol=rtol,
                                       atol=rtol * np.abs(ref).max(), err_msg=name)

    def test_gradient_equals_autodiff_in_fp32(self):
        rng = np.random.default_rng(1)
        gate, up = (jnp.asarray(rng.standard_normal((4, 33)) * 4, jnp.float32) for _ in range(2))

        def f(fn):
            return jax.grad(lambda g, u: jnp.sum(jnp.sin(fn(g, u))), argnums=(0, 1))(gate, up)

        got = f(layers.swiglu)
        want = f(lambda g, u: jax.nn.silu(g) * u)
        for a, b in zip(got, want):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


class SwiGLUPackedTest(parameterized.TestCase):
    """swiglu_packed on h = [gate; up] and SwiGLU(packed=True) (MOSAIC_GPU.md Sec. 46.2)."""

    @parameterized.parameters((jnp.float32, 1e-6), (jnp.bfloat16, 1.6e-2))
    def test_forward_bits_and_vjp(self, dtype, rtol):
        rng = np.random.default_rng(10)
        f = 40
        h = jnp.asarray(rng.standard_normal((3, 17, 2 * f)) * 3, dtype)
        dy = jnp.asarray(rng.standard_normal((3, 17, f)), dtype)
        gate, up = h[..., :f], h[..., f:]
        y, vjp = jax.vjp(layers.swiglu_packed, h)
        (dh,) = vjp(dy)
        self.assertEqual((y.shape, y.dtype, dh.shape, dh.dtype),
                         ((3, 17, f), dtype, h.shape, dtype))
        # The forward is swiglu's on the halves, bit for bit, eager and jitted.
        np.testing.assert_array_equal(np.asarray(y), np.asarray(layers.swiglu(gate, up)))
        np.testing.assert_array_equal(np.asarray(jax.jit(layers.swiglu_packed)(h)),
                                      np.asarray(jax.jit(layers.swiglu)(gate, up)))
        # The cotangent is swiglu's two, concatenated: the same fp32 formulas, rounded once.
        d_gate, d_up = jax.vjp(layers.swiglu, gate, up)[1](dy)
        np.testing.assert_array_equal(np.asarray(dh),
                                      np.asarray(jnp.concatenate([d_gate, d_up], axis=-1)))
        # Against float64 (the product rule of the plain expression) ...
        want = swiglu_reference(gate, up, dy)
        for name, got, ref in (("y", y, want[0]), ("d_gate", dh[..., :f], want[1]),
                               ("d_up", dh[..., f:], want[2])):
            np.testing.assert_allclose(np.asarray(got, np.float64), ref, rtol=rtol,
                                       atol=rtol * np.abs(ref).max(), err_msg=name)
        # ... and fp32 autodiff of the plain expression on the packed input.
        h32, dy32 = h.astype(jnp.float32), dy.astype(jnp.float32)
        (auto,) = jax.vjp(lambda h: jax.nn.silu(h[..., :f]) * h[..., f:], h32)[1](dy32)
        np.testing.assert_allclose(np.asarray(dh, np.float32), np.asarray(auto),
                                   rtol=rtol, atol=rtol * float(jnp.abs(auto).max()))

    def test_odd_or_missing_last_axis_is_refused(self):
        for shape in ((4, 7), (3,), ()):
            h = jnp.asarray(np.random.default_rng(11).standard_normal(shape), jnp.float32)
            with self.assertRaisesRegex(ValueError, re.escape(f"got shape {shape}")):
                layers.swiglu_packed(h)
            with self.assertRaisesRegex(ValueError, "even width 2F"):
                jax.vjp(layers.swiglu_packed, h)

    @parameterized.parameters(
        (jnp.float32, False, 1e-6), (jnp.float32, True, 1e-6),
        (jnp.bfloat16, False, 1e-2), (jnp.bfloat16, True, 1e-2))
    def test_module_same_params_values_and_gradients(self, dtype, split, rtol):
        # The packed module has the unpacked one's parameters (names, shapes, init), so a
        # checkpoint of either restores into the other; its output and gradients agree up to
        # the rounding of the products' sums (split_products: fc1 as two products unpacked).
        rng = np.random.default_rng(12 + split)
        x = jnp.asarray(rng.standard_normal((2, 9, 24)), jnp.float32)
        ct = jnp.asarray(rng.standard_normal((2, 9, 24)), jnp.float32)

        def build(packed):
            return layers.SwiGLU(24, 40, std=0.3, out_std=0.2, rngs=nnx.Rngs(3), dtype=dtype,
                                 split_products=split, packed=packed)

        results = []
        for packed in (False, True):
            module = build(packed)
            self.assertEqual(module.packed, packed)
            graph, params = nnx.split(module, nnx.Param)

            def loss(p):
                y = nnx.merge(graph, p)(x)
                return jnp.sum(y.astype(jnp.float32) * ct), y

            (_, y), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
            results.append((nnx.to_pure_dict(params), y, nnx.to_pure_dict(grads)))
        (p0, y0, g0), (p1, y1, g1) = results
        jax.tree_util.tree_map(np.testing.assert_array_equal, p0, p1)
        self.assertEqual(jax.tree_util.tree_structure(p0), jax.tree_util.tree_structure(p1))
        self.assertEqual(y1.dtype, dtype)
        np.testing.assert_allclose(np.asarray(y1, np.float32), np.asarray(y0, np.float32),
                                   rtol=rtol, atol=rtol * float(jnp.abs(y0).max()))
        for name in ("fc1", "fc2"):
            a, b = g1[name]["kernel"], g0[name]["kernel"]
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol,
                                       atol=rtol * float(jnp.abs(b).max()), err_msg=name)
            self.assertGreater(float(jnp.abs(b).max()), 0.0)


def rms_norm_reference(x, scale, eps, dy):
    """float64 RMSNorm and its vector-Jacobian product by the chain rule."""
    x, s, d = (np.asarray(a, np.float64) for a in (x, scale, dy))
    n = x.shape[-1]
    r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    y = x * r * s
    gs = d * s
    # d/dx_j of x_i r: r delta_ij - x_i x_j r^3 / n
    dx = r * gs - x * r ** 3 * np.sum(gs * x, axis=-1, keepdims=True) / n
    ds = np.sum((d * x * r).reshape(-1, n), axis=0)
    return y, dx, ds


class RMSNormTest(parameterized.TestCase):

    @parameterized.parameters((jnp.float32, 1e-5), (jnp.bfloat16, 1.6e-2))
    def test_matches_float64(self, dtype, rtol):
        rng = np.random.default_rng(2)
        x = jnp.asarray(rng.standard_normal((2, 7, 48)) * 3 + 0.5, dtype)
        scale = jnp.asarray(rng.uniform(0.5, 1.5, 48), jnp.float32)
        dy = jnp.asarray(rng.standard_normal((2, 7, 48)), dtype)
        y, vjp = jax.vjp(lambda x, s: layers.rms_norm(x, s, 1e-5), x, scale)
        dx, ds = vjp(dy)
        self.assertEqual((y.dtype, dx.dtype, ds.dtype), (dtype, dtype, jnp.float32))
        # The forward is the module's former expression, bit for bit.
        x32 = x.astype(jnp.float32)
        old = (x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + 1e-5)
               * scale).astype(dtype)
        np.testing.assert_array_equal(np.asarray(y), np.asarray(old))
        want = rms_norm_reference(x, scale, 1e-5, dy)
        for name, got, ref in (("y", y, want[0]), ("dx", dx, want[1]), ("d_scale", ds, want[2])):
            np.testing.assert_allclose(np.asarray(got, np.float64), ref, rtol=rtol,
                                       atol=rtol * np.abs(ref).max(), err_msg=name)

    def test_gradient_equals_autodiff_in_fp32(self):
        rng = np.random.default_rng(3)
        x = jnp.asarray(rng.standard_normal((3, 5, 16)), jnp.float32)
        scale = jnp.asarray(rng.uniform(0.5, 1.5, 16), jnp.float32)

        def plain(x, s):
            r = jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + 1e-6)
            return x * r * s

        def f(fn):
            return jax.grad(lambda x, s: jnp.sum(jnp.sin(fn(x, s))), argnums=(0, 1))(x, scale)

        got = f(lambda x, s: layers.rms_norm(x, s, 1e-6))
        for a, b in zip(got, f(plain)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
        # Through the module, with a jitted and a checkpointed (remat) caller.
        norm = layers.RMSNorm(16, eps=1e-6)
        norm.scale[...] = scale
        g1 = jax.jit(jax.grad(lambda x: jnp.sum(jnp.sin(norm(x)))))(x)
        g2 = jax.grad(jax.checkpoint(lambda x: jnp.sum(jnp.sin(norm(x)))))(x)
        np.testing.assert_allclose(np.asarray(g1), np.asarray(f(plain)[0]), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(g2), np.asarray(g1), rtol=1e-6, atol=1e-7)


def causal_conv_reference(x_ext, w, doc_ext, silu, dy):
    """float64 masked causal convolution, optional SiLU, and its vector-Jacobian product by
    the chain rule, one output at a time (independent of the vectorised code)."""
    x, w, d = (np.asarray(a, np.float64) for a in (x_ext, w, dy))
    width = w.shape[0]
    b, t = x.shape[0], x.shape[1] - width + 1
    doc = np.zeros(x.shape[:2], np.int64) if doc_ext is None else np.asarray(doc_ext)
    pre, y = np.zeros((b, t, x.shape[2])), None
    dpre, dx, dw = np.zeros_like(pre), np.zeros_like(x), np.zeros_like(w)
    keep = np.array([[[doc[r, s + i] == doc[r, s + width - 1] for i in range(width)]
                      for s in range(t)] for r in range(b)], np.float64)  # [B, T, W]
    for i in range(width):
        pre += keep[:, :, i:i + 1] * x[:, i:i + t] * w[i]
    sig = 1.0 / (1.0 + np.exp(-pre))
    y = pre * sig if silu else pre
    dpre = d * (sig * (1.0 + pre * (1.0 - sig)) if silu else 1.0)
    for i in range(width):
        dw[i] = np.sum(keep[:, :, i:i + 1] * x[:, i:i + t] * dpre, axis=(0, 1))
        dx[:, i:i + t] += keep[:, :, i:i + 1] * w[i] * dpre
    return y, dx, dw


class CausalConv1dTest(parameterized.TestCase):
    """``causal_conv1d`` (ShortConv's and the context-parallel convolution's math) and its
    autodiff gradient against float64 and against autodiff of an independent formulation."""

    def _inputs(self, dtype, docs, seed=4):
        rng = np.random.default_rng(seed)
        x_ext = jnp.asarray(rng.standard_normal((2, 3 + 29, 24)) * 2, dtype)
        w = jnp.asarray(rng.uniform(-0.5, 0.5, (4, 24)), dtype)
        dy = jnp.asarray(rng.standard_normal((2, 29, 24)), dtype)
        doc = None
        if docs:  # documents of random lengths, some shorter than the 4 taps
            ids = np.sort(rng.integers(0, 9, size=(2, 29)), axis=1)
            doc = jnp.asarray(np.concatenate([np.repeat(ids[:, :1], 3, 1), ids], 1), jnp.int32)
        return x_ext, w, doc, dy

    # bf16: y rounded before and after SiLU; autodiff's d x_ext sums the taps in bf16 (a few
    # 2^-9 relative of the largest).
    @parameterized.product(dtype=(jnp.float32, jnp.bfloat16), docs=(False, True),
                           activation=(None, "silu"))
    def test_matches_float64(self, dtype, docs, activation):
        x_ext, w, doc, dy = self._inputs(dtype, docs)
        y, vjp = jax.vjp(lambda x, w: layers.causal_conv1d(x, w, doc, activation), x_ext, w)
        dx, dw = vjp(dy)
        self.assertEqual((y.shape, y.dtype, dx.dtype, dw.dtype), ((2, 29, 24),) + (dtype,) * 3)
        want = causal_conv_reference(x_ext, w, doc, activation == "silu", dy)
        rtol = 1e-5 if dtype == jnp.float32 else 1.6e-2
        for name, got, ref in (("y", y, want[0]), ("dx", dx, want[1]), ("dw", dw, want[2])):
            np.testing.assert_allclose(np.asarray(got, np.float64), ref, rtol=rtol,
                                       atol=rtol * np.abs(ref).max(), err_msg=name)
        if docs:  # a masked tap: the token after a document start reads no earlier input
            self.assertTrue(np.any(np.diff(np.asarray(doc)[:, 3:], axis=1) > 0))

    def test_gradient_equals_autodiff_of_the_tap_loop_in_fp32(self):
        x_ext, w, doc, _ = self._inputs(jnp.float32, True, seed=5)
        t = x_ext.shape[1] - 3

        def plain(x, w):
            own = doc[:, 3:]
            pre = sum(jnp.where((doc[:, i:i + t] == own)[..., None], x[:, i:i + t], 0) * w[i]
                      for i in range(3)) + x[:, 3:] * w[3]
            return jax.nn.silu(pre)

        def f(fn):
            return jax.grad(lambda x, w: jnp.sum(jnp.sin(fn(x, w))), argnums=(0, 1))(x_ext, w)

        got = f(lambda x, w: layers.causal_conv1d(x, w, doc, "silu"))
        for a, b in zip(got, f(plain)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
        # Jitted and under jax.checkpoint (remat) the same.
        g2 = jax.jit(jax.grad(jax.checkpoint(
            lambda x: jnp.sum(jnp.sin(layers.causal_conv1d(x, w, doc, "silu"))))))(x_ext)
        np.testing.assert_allclose(np.asarray(g2), np.asarray(got[0]), rtol=1e-6, atol=1e-6)

    def test_bad_arguments_are_refused(self):
        x_ext, w, doc, _ = self._inputs(jnp.float32, True)
        for kwargs, pattern in (
                (dict(activation="gelu"), r"activation='gelu'; choose None or 'silu'"),
                (dict(weight=w[:, :5]), r"weight \(4, 5\) must be \[W, C\]"),
                (dict(doc_ext=doc[:, 1:]), r"doc_ext \(2, 31\) must be \[B, W - 1 \+ T\]")):
            args = dict(x_ext=x_ext, weight=w, doc_ext=doc, activation=None) | kwargs
            with self.subTest(kwargs=list(kwargs)):
                with self.assertRaisesRegex(ValueError, pattern):
                    layers.causal_conv1d(args["x_ext"], args["weight"], args["doc_ext"],
                                         args["activation"])


class ShortConvStateTest(absltest.TestCase):
    """A ``conv_state`` other than ``[B, W - 1, C]`` (one built for another ``conv_width``) put
    every tap on the wrong input and returned a result without an error."""

    def setUp(self):
        super().setUp()
        self.conv = layers.ShortConv(3, 4, rngs=nnx.Rngs(0))  # W = 4, C = 3
        keys = jax.random.split(jax.random.key(7), 2)
        self.x = jax.random.normal(keys[0], (2, 5, 3))
        self.history = jax.random.normal(keys[1], (2, 3, 3))  # the W - 1 inputs before x

    def test_carried_state_continues_the_row(self):
        """``conv(x2, conv_state=state of x1) == conv([x1, x2])[T1:]``, against a float64
        NumPy convolution, ``y[t] = sum_i w[i] x[t - W + 1 + i]``."""
        w = np.asarray(self.conv.kernel[...], np.float64)
        full = np.concatenate([np.asarray(self.history, np.float64),
                               np.asarray(self.x, np.float64)], axis=1)  # [B, 3 + 5, C]
        want = np.stack([sum(w[i] * full[:, t + i] for i in range(4)) for t in range(5)], 1)
        y, new_state = self.conv(self.x, conv_state=self.history)
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(new_state, self.x[:, -3:])

    def test_wrong_conv_state_shape_is_refused(self):
        for bad in ((2, 5, 3), (2, 2, 3), (2, 3, 7), (1, 3, 3)):
            with self.subTest(shape=bad):
                with self.assertRaisesRegex(
                        ValueError, r"conv_state must be \[batch=2, conv_width - 1=3, "
                        r"channels=3\].*got \(" + ", ".join(map(str, bad))):
                    self.conv(self.x, conv_state=jnp.ones(bad))

    def test_mixer_refuses_a_state_of_another_conv_width(self):
        """Through a mixer's decoding state (GDN, ``conv_width`` 4 -> a 5-wide state)."""
        from lattn_jax import config as config_lib
        from lattn_jax.mixers import gated_deltanet
        cfg = config_lib.ModelConfig(vocab_size=16, d_model=16, layer_pattern=("gdn",),
                                     mlp_hidden=32, gdn=dict(num_k_heads=1, num_v_heads=1,
                                                             head_k_dim=8, head_v_dim=8))
        mixer = gated_deltanet.GatedDeltaNet(cfg, rngs=nnx.Rngs(0))
        state = mixer.init_state(2)
        wide = jnp.ones((2, state.conv_state.shape[1] + 2, state.conv_state.shape[2]))
        x = jax.random.normal(jax.random.key(3), (2, 3, 16))
        with self.assertRaisesRegex(ValueError, "conv_state must be"):
            mixer(x, state=state._replace(conv_state=wide), return_state=True)


if __name__ == "__main__":
    absltest.main()
