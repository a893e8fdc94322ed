"""HALO losses against hand-computed values; the fused (chunked) losses against the plain ones."""

import math

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized
from flax import nnx

from lattn_jax import config as config_lib
from lattn_jax import model as model_lib
from lattn_jax import train as train_lib
from lattn_jax.halo import losses
from tests import tolerances


class LossesTest(absltest.TestCase):

    def test_layer_mse(self):
        s = jnp.array([1.0, 2.0, 3.0, 4.0]).reshape(2, 1, 1, 2)
        t = jnp.array([1.0, 0.0, 3.0, 1.0]).reshape(2, 1, 1, 2)
        self.assertAlmostEqual(float(losses.layer_mse(s, t)), (0 + 4 + 0 + 9) / 4, places=6)
        with self.assertRaisesRegex(ValueError, "shape"):
            losses.layer_mse(s, t[:1])

    def test_logsumexp_one_pass_matches_float64(self):
        rng = np.random.default_rng(11)
        for shape, scale in (((5, 1000), 3.0), ((2, 3, 4099), 40.0), ((4, 7), 1e4)):
            z = rng.standard_normal(shape) * scale
            z[0, ..., 3] = -np.inf  # a masked entry
            m = np.max(z, axis=-1, keepdims=True)
            want = np.log(np.sum(np.exp(z - m), axis=-1)) + m[..., 0]
            got = losses.logsumexp_one_pass(jnp.asarray(z, jnp.float32))
            self.assertEqual((got.shape, got.dtype), (shape[:-1], jnp.float32))
            # fp32 inputs: the rounding of z itself (2^-24 relative of |z|) bounds the error.
            np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-6,
                                       atol=4 * 2.0 ** -24 * scale * 5)
        # A row of -inf is -inf (log 0), as jax.nn.logsumexp gives; no NaN from the identity.
        self.assertEqual(float(losses.logsumexp_one_pass(jnp.full((1, 6), -jnp.inf))[0]),
                         -np.inf)
        # Its derivative is the softmax.
        z = jnp.asarray(rng.standard_normal((3, 50)) * 4, jnp.float32)
        g = jax.grad(lambda z: jnp.sum(losses.logsumexp_one_pass(z) * jnp.arange(1.0, 4.0)))(z)
        want = jax.nn.softmax(z, axis=-1) * jnp.arange(1.0, 4.0)[:, None]
        np.testing.assert_allclose(np.asarray(g), np.asarray(want), rtol=1e-5, atol=1e-7)

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


def _normal(rng, shape, scale=1.0, dtype=jnp.float32):
    return jnp.asarray(rng.normal(scale=scale, size=shape), jnp.float32).astype(dtype)


def _inputs(seed, b=3, t=7, d_s=16, s_s=33, d_t=24, s_t=40, dtype=jnp.float32, masked=True):
    """Random (never zero) hidden states, heads with ~unit-scale logits, targets and weights."""
    rng = np.random.default_rng(seed)
    weights = None
    if masked:
        weights = jnp.asarray(rng.integers(0, 2, size=(b, t)), jnp.float32)
        weights = weights.at[0, 0].set(1.0).at[0, 1].set(0.0)  # some real, some masked
    return dict(
        th=_normal(rng, (b, t, d_t), dtype=dtype),
        tw=_normal(rng, (d_t, s_t), 1.5 / math.sqrt(d_t), dtype),
        sh=_normal(rng, (b, t, d_s), dtype=dtype),
        sw=_normal(rng, (d_s, s_s), 1.5 / math.sqrt(d_s), dtype),
        targets=jnp.asarray(rng.integers(0, s_s, size=(b, t)), jnp.int32),
        weights=weights)


def _f32(x):
    return x.astype(jnp.float32)


def _assert_grads_close(actual, expected, rtol, name):
    for i, (a, e) in enumerate(zip(actual, expected)):
        a = np.asarray(a, np.float64)
        e = np.asarray(e, np.float64)
        scale = float(np.max(np.abs(e)))
        if scale == 0.0:
            raise AssertionError(f"{name}[{i}]: the reference gradient is all zero")
        np.testing.assert_allclose(a, e, rtol=rtol, atol=rtol * scale, err_msg=f"{name}[{i}]")


def _max_intermediate_size(jaxpr) -> int:
    """Largest number of elements of any value in ``jaxpr`` and its sub-jaxprs."""
    biggest = 0
    for eqn in jaxpr.eqns:
        for var in eqn.outvars:
            biggest = max(biggest, int(np.prod(getattr(var.aval, "shape", ()))))
        for param in eqn.params.values():
            for sub in param if isinstance(param, (list, tuple)) else [param]:
                sub = getattr(sub, "jaxpr", sub)
                if hasattr(sub, "eqns"):
                    biggest = max(biggest, _max_intermediate_size(sub))
    return biggest


class ChunkedLossesTest(parameterized.TestCase):
    """``chunked_forward_kl`` / ``chunked_cross_entropy`` against the plain losses on full
    fp32 logits: values and gradients, odd token counts, masks, vocabulary truncation, bf16."""

    # N = 21 tokens: chunk_size 1 -> 21 chunks, 5 -> 5 chunks of 5 (4 padding tokens),
    # 8 -> 3 balanced chunks of 7, 64 -> one chunk of 21 (chunk_size > N).
    @parameterized.parameters(1, 5, 8, 64)
    def test_forward_kl_matches_plain_fp32(self, chunk_size):
        x = _inputs(0)
        tau = 1.5

        def chunked(sh, sw):
            return losses.chunked_forward_kl(x["th"], x["tw"], sh, sw, x["weights"],
                                             temperature=tau, chunk_size=chunk_size)

        def plain(sh, sw):
            return losses.forward_kl(x["th"] @ x["tw"], sh @ sw, x["weights"], temperature=tau)

        value, grads = jax.jit(jax.value_and_grad(chunked, argnums=(0, 1)))(x["sh"], x["sw"])
        ref, ref_grads = jax.jit(jax.value_and_grad(plain, argnums=(0, 1)))(x["sh"], x["sw"])
        self.assertEqual(value.dtype, jnp.float32)
        self.assertGreater(float(ref), 0.05)
        np.testing.assert_allclose(value, ref, rtol=1e-5)
        _assert_grads_close(grads, ref_grads, 1e-5, "d/d(student hidden, head)")
        # The teacher's vocabulary is wider (40 > 33): only the shared 33 columns count, and
        # the teacher gets no gradient.
        t_grads = jax.jit(jax.grad(lambda th, tw: losses.chunked_forward_kl(
            th, tw, x["sh"], x["sw"], x["weights"], chunk_size=chunk_size), argnums=(0, 1)))(
                x["th"], x["tw"])
        for g in t_grads:
            np.testing.assert_array_equal(g, np.zeros_like(g))

    def test_forward_kl_student_vocab_wider_and_no_weights(self):
        # Student head wider than the teacher's (40 > 33): truncated, extra columns get zero
        # gradient; without weights every position counts.
        x = _inputs(1, s_s=40, s_t=33, masked=False)

        def chunked(sh, sw):
            return losses.chunked_forward_kl(x["th"], x["tw"], sh, sw, chunk_size=4)

        value, (gh, gw) = jax.value_and_grad(chunked, argnums=(0, 1))(x["sh"], x["sw"])
        ref, ref_grads = jax.value_and_grad(
            lambda sh, sw: losses.forward_kl(x["th"] @ x["tw"], sh @ sw),
            argnums=(0, 1))(x["sh"], x["sw"])
        np.testing.assert_allclose(value, ref, rtol=1e-5)
        _assert_grads_close((gh, gw), ref_grads, 1e-5, "d/d(student hidden, head)")
        np.testing.assert_array_equal(gw[:, 33:], np.zeros((16, 7)))
        # Same model on both sides: KL = 0.
        self.assertAlmostEqual(float(losses.chunked_forward_kl(
            x["sh"], x["sw"], x["sh"], x["sw"], chunk_size=4)), 0.0, places=6)

    @parameterized.parameters(1, 5, 8, 64)
    def test_cross_entropy_matches_plain_fp32(self, chunk_size):
        x = _inputs(2)

        def chunked(h, w):
            return losses.chunked_cross_entropy(h, w, x["targets"], x["weights"],
                                                chunk_size=chunk_size)

        def plain(h, w):
            return train_lib.cross_entropy_loss(h @ w, x["targets"], x["weights"])

        out = jax.jit(chunked)(x["sh"], x["sw"])
        ref = jax.jit(plain)(x["sh"], x["sw"])
        for a, e in zip(out, ref):
            self.assertEqual(a.dtype, jnp.float32)
            np.testing.assert_allclose(a, e, rtol=1e-5)
        self.assertEqual(float(out[2]), float(np.sum(x["weights"])))
        grads = jax.jit(jax.grad(lambda h, w: chunked(h, w)[0], argnums=(0, 1)))(x["sh"], x["sw"])
        ref_grads = jax.jit(jax.grad(lambda h, w: plain(h, w)[0], argnums=(0, 1)))(
            x["sh"], x["sw"])
        _assert_grads_close(grads, ref_grads, 1e-5, "d/d(hidden, head)")
        # Masked positions get no gradient.
        masked = np.asarray(x["weights"]) == 0
        np.testing.assert_array_equal(np.asarray(grads[0])[masked], 0.0)

    def test_cross_entropy_without_weights_counts_every_token(self):
        x = _inputs(3, masked=False)
        mean, total, count = losses.chunked_cross_entropy(x["sh"], x["sw"], x["targets"],
                                                          chunk_size=4)
        ref = train_lib.cross_entropy_loss(x["sh"] @ x["sw"], x["targets"],
                                           jnp.ones((3, 7), jnp.float32))
        self.assertEqual(float(count), 21.0)
        np.testing.assert_allclose((mean, total), ref[:2], rtol=1e-5)

    def test_bf16_inputs(self):
        # bf16 hidden states and heads (the model's compute dtype): the matmul runs on the bf16
        # values with fp32 accumulation, so the value matches the fp32 reference on the same
        # (upcast) values up to summation order; the gradients are rounded to bf16.
        x = _inputs(4, dtype=jnp.bfloat16)

        def kl(sh, sw):
            return losses.chunked_forward_kl(x["th"], x["tw"], sh, sw, x["weights"],
                                             chunk_size=8)

        def kl_ref(sh, sw):
            return losses.forward_kl(_f32(x["th"]) @ _f32(x["tw"]), sh @ sw, x["weights"])

        value, grads = jax.jit(jax.value_and_grad(kl, argnums=(0, 1)))(x["sh"], x["sw"])
        ref, ref_grads = jax.jit(jax.value_and_grad(kl_ref, argnums=(0, 1)))(_f32(x["sh"]),
                                                                             _f32(x["sw"]))
        self.assertEqual(value.dtype, jnp.float32)
        self.assertEqual([g.dtype for g in grads], [jnp.bfloat16, jnp.bfloat16])
        np.testing.assert_allclose(value, ref, rtol=1e-4)
        _assert_grads_close(grads, ref_grads, 2e-2, "bf16 KL d/d(student hidden, head)")

        def ce(h, w):
            return losses.chunked_cross_entropy(h, w, x["targets"], x["weights"],
                                                chunk_size=8)[0]

        def ce_ref(h, w):
            return train_lib.cross_entropy_loss(h @ w, x["targets"], x["weights"])[0]

        value, grads = jax.jit(jax.value_and_grad(ce, argnums=(0, 1)))(x["sh"], x["sw"])
        ref, ref_grads = jax.jit(jax.value_and_grad(ce_ref, argnums=(0, 1)))(_f32(x["sh"]),
                                                                             _f32(x["sw"]))
        np.testing.assert_allclose(value, ref, rtol=1e-4)
        _assert_grads_close(grads, ref_grads, 2e-2, "bf16 CE d/d(hidden, head)")

    def test_weights_gradients_match_plain(self):
        # The fused backward returns d/d weights too: the per-token KL / CE (through the mean's
        # normaliser as well), as the plain losses on full logits give.
        x = _inputs(7)
        kl_grad = jax.grad(lambda w: losses.chunked_forward_kl(
            x["th"], x["tw"], x["sh"], x["sw"], w, temperature=1.3, chunk_size=5))(x["weights"])
        kl_ref = jax.grad(lambda w: losses.forward_kl(
            x["th"] @ x["tw"], x["sh"] @ x["sw"], w, temperature=1.3))(x["weights"])
        _assert_grads_close([kl_grad], [kl_ref], 1e-5, "KL d/d weights")
        ce_grad = jax.grad(lambda w: losses.chunked_cross_entropy(
            x["sh"], x["sw"], x["targets"], w, chunk_size=5)[0])(x["weights"])
        ce_ref = jax.grad(lambda w: train_lib.cross_entropy_loss(
            x["sh"] @ x["sw"], x["targets"], w)[0])(x["weights"])
        _assert_grads_close([ce_grad], [ce_ref], 1e-5, "CE d/d weights")

    def test_gradient_program_matmuls(self):
        # Each chunk's gradient is formed with its loss: the value-and-grad program holds the
        # KL's four head-sized matmuls (two logits, two gradients) and the CE's three, none
        # recomputed, and with bf16 inputs every one of them takes bf16 operands (the logits
        # cotangent is rounded before its matmuls; an fp32 cotangent would run them in fp32).
        x = _inputs(8, dtype=jnp.bfloat16)

        def dots(jaxpr):
            found = []
            for eqn in jaxpr.eqns:
                if eqn.primitive.name == "dot_general":
                    found.append(tuple(v.aval.dtype for v in eqn.invars))
                for param in eqn.params.values():
                    for sub in param if isinstance(param, (list, tuple)) else [param]:
                        sub = getattr(sub, "jaxpr", sub)
                        if hasattr(sub, "eqns"):
                            found += dots(sub)
            return found

        kl = jax.make_jaxpr(jax.value_and_grad(lambda sh, sw: losses.chunked_forward_kl(
            x["th"], x["tw"], sh, sw, x["weights"], chunk_size=8), argnums=(0, 1)))
        ce = jax.make_jaxpr(jax.value_and_grad(lambda h, w: losses.chunked_cross_entropy(
            h, w, x["targets"], x["weights"], chunk_size=8)[0], argnums=(0, 1)))
        for name, fn, count in (("kl", kl, 4), ("ce", ce, 3)):
            found = dots(fn(x["sh"], x["sw"]).jaxpr)
            self.assertLen(found, count, name)
            for operands in found:
                self.assertEqual(operands, (jnp.bfloat16, jnp.bfloat16), name)

    def test_no_full_logits_in_the_gradient_program(self):
        # The backward recomputes each chunk's logits: no value in the traced value-and-grad
        # program (scan and checkpoint bodies included) is as large as [N, S].
        n, d, s, chunk = 512, 8, 64, 128
        rng = np.random.default_rng(5)
        h = _normal(rng, (1, n, d))
        w = _normal(rng, (d, s), 0.3)
        targets = jnp.zeros((1, n), jnp.int32)
        kl = jax.make_jaxpr(jax.value_and_grad(
            lambda h, w: losses.chunked_forward_kl(h, w, h, w, chunk_size=chunk), argnums=(0, 1)))
        ce = jax.make_jaxpr(jax.value_and_grad(
            lambda h, w: losses.chunked_cross_entropy(h, w, targets, chunk_size=chunk)[0],
            argnums=(0, 1)))
        for name, fn in (("kl", kl), ("ce", ce)):
            biggest = _max_intermediate_size(fn(h, w).jaxpr)
            self.assertLessEqual(biggest, chunk * s, name)
        # The plain loss on full logits does hold [N, S] values (the check can fail).
        plain = jax.make_jaxpr(jax.grad(lambda h, w: losses.forward_kl(h @ w, h @ w)))(h, w)
        self.assertGreaterEqual(_max_intermediate_size(plain.jaxpr), n * s)

    def test_bad_arguments(self):
        x = _inputs(6)
        th, tw, sh, sw, y = x["th"], x["tw"], x["sh"], x["sw"], x["targets"]
        kl = losses.chunked_forward_kl
        ce = losses.chunked_cross_entropy
        cases = [
            ("chunk_size", lambda: kl(th, tw, sh, sw, chunk_size=0)),
            ("chunk_size", lambda: ce(sh, sw, y, chunk_size=-3)),
            ("chunk_size", lambda: ce(sh, sw, y, chunk_size=2.5)),
            ("temperature", lambda: kl(th, tw, sh, sw, temperature=0.0)),
            ("temperature", lambda: kl(th, tw, sh, sw, temperature=-1.0)),
            ("temperature", lambda: kl(th, tw, sh, sw, temperature=float("inf"))),
            ("temperature", lambda: kl(th, tw, sh, sw, temperature=float("nan"))),
            ("temperature", lambda: losses.forward_kl(th @ tw, sh @ sw,
                                                      temperature=float("inf"))),
            ("student_hidden", lambda: kl(th, tw, sh[:, :5], sw)),
            ("student_hidden", lambda: kl(th, tw, sh[0], sw)),
            ("teacher_head", lambda: kl(th, tw[:5], sh, sw)),
            ("student_head", lambda: kl(th, tw, sh, sw.T)),
            ("weights", lambda: kl(th, tw, sh, sw, jnp.ones((3, 6)))),
            ("hidden", lambda: ce(sh[..., 0], sw, y)),
            ("head", lambda: ce(sh, sw[:4], y)),
            ("targets", lambda: ce(sh, sw, y[:, :4])),
            ("targets", lambda: ce(sh, sw, y.astype(jnp.float32))),
            ("weights", lambda: ce(sh, sw, y, jnp.ones((7, 3)))),
        ]
        for name, call in cases:
            with self.assertRaisesRegex(ValueError, f"^{name} "):
                call()


def _tiny_config(**kw):
    return config_lib.ModelConfig(
        vocab_size=64, d_model=32, layer_pattern=("attn",), mlp_hidden=48,
        attention=config_lib.AttentionConfig(num_heads=4, num_kv_heads=2), **kw)


@nnx.jit
def _outputs(model, tokens):
    """The model's outputs with and without ``return_hidden``, in one compiled program (eager
    op-by-op dispatch of even a one-layer model took seconds on a CPU)."""
    return dict(logits=model(tokens), hidden=model(tokens, return_hidden=True),
                head=model.head_kernel(),
                last=model(tokens, return_hidden=True, last_logits_only=True),
                with_state=model(tokens, return_hidden=True, return_state=True))


class ReturnHiddenTest(parameterized.TestCase):
    """``LanguageModel(..., return_hidden=True) @ head_kernel()`` is the logits."""

    @parameterized.named_parameters(("tied_fp32", True, "float32"),
                                    ("untied_bf16", False, "bfloat16"))
    def test_hidden_times_head_kernel_is_the_logits(self, tie, dtype):
        dtype = jnp.dtype(dtype)
        model = model_lib.LanguageModel(_tiny_config(tie_embeddings=tie, dtype=dtype.name),
                                        rngs=nnx.Rngs(0))
        self.assertEqual(model.head is None, tie)
        tokens = jax.random.randint(jax.random.key(1), (2, 9), 0, 64)
        out = _outputs(model, tokens)
        logits, hidden, head = out["logits"], out["hidden"], out["head"]
        self.assertEqual((hidden.shape, head.shape), ((2, 9, 32), (32, 64)))
        self.assertEqual((hidden.dtype, head.dtype), (dtype, dtype))
        self.assertEqual(logits.dtype, jnp.float32)
        # The model's logits are rounded to the compute dtype before the fp32 cast.
        np.testing.assert_allclose(jnp.dot(hidden, head, preferred_element_type=jnp.float32),
                                   logits, **tolerances.fwd_tol(dtype))
        # Composes with last_logits_only and return_state.
        np.testing.assert_allclose(_f32(out["last"]), _f32(hidden[:, -1:]),
                                   **tolerances.fwd_tol(dtype))
        hidden2, states = out["with_state"]
        self.assertLen(states, 1)
        np.testing.assert_allclose(_f32(hidden2), _f32(hidden), **tolerances.fwd_tol(dtype))
        # The fused loss on (hidden, head_kernel) is the plain loss on the logits, and
        # head_kernel's gradient reaches the head's parameters (the embedding when tied).
        targets = jnp.roll(tokens, -1, axis=1)
        np.testing.assert_allclose(
            losses.chunked_cross_entropy(hidden, head, targets, chunk_size=4)[0],
            train_lib.cross_entropy_loss(logits, targets, jnp.ones((2, 9), jnp.float32))[0],
            **tolerances.fwd_tol(dtype))

        def loss(m):  # the forward stays out of it: eager model gradients are slow on a CPU
            return losses.chunked_cross_entropy(hidden, m.head_kernel(), targets,
                                                chunk_size=4)[0]

        grads = nnx.grad(loss)(model)
        g = grads["embed"] if tie else grads["head"]["kernel"]
        self.assertGreater(float(jnp.max(jnp.abs(g[...]))), 0.0)


if __name__ == "__main__":
    absltest.main()
