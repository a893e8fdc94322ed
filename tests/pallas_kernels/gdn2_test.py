"""Tests for the GDN-2 op (paper arXiv 2607.07953, Eqs. 21-24): every form against the reference.

The token-serial ``lax.scan`` reference is ground truth. The chunked and associative-scan forms
must match it in fp32 (outputs, final state, residuals and all gradients), handle packed rows,
GVA and bf16 inputs, stay finite under extreme gates, be causal, reduce to KDA for channel-uniform
erase and write gates, and reject bad arguments with a ``ValueError`` naming the argument.

Run from the repository root: ``python -m pytest -q tests/pallas_kernels/gdn2_test.py``, or as a
script: ``python -m tests.pallas_kernels.gdn2_test``.
"""

import functools

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import gdn2 as gdn2_lib
from pallas_kernels import kda as kda_lib
from tests import tolerances

F32 = jnp.float32
# Relative-RMS bounds for fp32 results, taken from the tolerance table (rtol of each entry).
FWD_REL = tolerances.fwd_tol(F32)["rtol"]
GRAD_REL = tolerances.grad_tol(F32)["rtol"]
# (implementation, chunk_size) pairs checked against the reference.
FORMS = (("chunked", 16), ("chunked", 64), ("associative_scan", 64))
FORM_PARAMS = [dict(testcase_name=f"{impl}_C={cs}", impl=impl, chunk_size=cs) for impl, cs in FORMS]
ARGS = ("q", "k", "v", "g", "b", "w")  # positional arrays of gdn2, in order


def _l2(x):
    return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def make_inputs(seed, *, batch=2, seq_len=32, key_heads=2, heads=2, dk=16, dv=32):
    """Random GDN-2 inputs: L2-normalised q, k; sigmoid gates b, w; mixed log-decays.

    Drawn with NumPy, so that a new shape does not compile new random-number programs.
    """
    rng = np.random.default_rng(seed)

    def normal(*shape):
        return jnp.asarray(rng.standard_normal(shape), F32)

    return dict(
        q=_l2(normal(batch, seq_len, key_heads, dk)),
        k=_l2(normal(batch, seq_len, key_heads, dk)),
        v=normal(batch, seq_len, heads, dv),
        # softplus(x - 2) spans slow (~0.02) to fast (~1) decays, so state crosses chunks.
        g=-jax.nn.softplus(normal(batch, seq_len, heads, dk) - 2.0),
        b=jax.nn.sigmoid(normal(batch, seq_len, heads, dk)),
        w=jax.nn.sigmoid(normal(batch, seq_len, heads, dv)),
        initial_state=normal(batch, heads, dk, dv),
    )


def call(inputs, **kwargs):
    """``gdn2`` on the arrays of ``inputs`` (``initial_state`` too unless overridden)."""
    kwargs.setdefault("initial_state", inputs["initial_state"])
    return gdn2_lib.gdn2(*[inputs[n] for n in ARGS], **kwargs)


@functools.lru_cache(maxsize=None)
def _forms_fn(forms, initial_state):
    """One jitted function per (forms, initial_state), so repeated shapes compile once."""

    @jax.jit
    def run(inputs, segment_ids):
        h0 = inputs["initial_state"] if initial_state else None
        return [
            call(
                inputs, initial_state=h0, output_final_state=True, segment_ids=segment_ids,
                implementation=impl, chunk_size=cs, return_residual=True,
            )
            for impl, cs in forms
        ]

    return run


def run_forms(inputs, forms, initial_state=True, segment_ids=None):
    """Runs ``gdn2`` for every ``(implementation, chunk_size)`` in one jit; returns (o, S, u)s."""
    return _forms_fn(tuple(forms), initial_state)(inputs, segment_ids)


def assert_outputs_close(testcase, got, want, max_err, what=""):
    for name, a, e in zip(("o", "final_state", "u"), got, want):
        testcase.assertEqual(a.shape, e.shape, f"{what} {name}")
        tolerances.assert_rel_err(a, e, max_err, f"{what} {name}")


def separate_documents(inputs, lengths):
    """Cuts each row at ``lengths`` and left-aligns every document in a row of its own.

    Rows are padded at the end with inert tokens (``k = g = 0`` leave the state unchanged), so
    one reference call runs all documents separately. Only a row's first document keeps that
    row's ``initial_state``; the others start from zero.
    """
    docs = [(row, start, n) for row, ls in enumerate(lengths)
            for start, n in zip(np.cumsum([0] + ls[:-1]), ls)]
    max_len = max(n for _, _, n in docs)
    out = {}
    for name, x in inputs.items():
        if name == "initial_state":
            out[name] = jnp.stack([x[row] * (start == 0) for row, start, _ in docs])
        else:
            out[name] = jnp.stack([
                jnp.pad(x[row, start:start + n], [(0, max_len - n)] + [(0, 0)] * (x.ndim - 2))
                for row, start, n in docs
            ])
    return out, docs


class Gdn2Test(parameterized.TestCase):

    @parameterized.named_parameters(
        dict(testcase_name=f"T={t}_initial_state={h0}", seq_len=t, initial_state=h0)
        for t in (1, 63, 65, 100) for h0 in (True, False)
    )
    def test_forms_match_reference(self, seq_len, initial_state):
        inputs = make_inputs(seq_len, seq_len=seq_len)
        ref, *outs = run_forms(inputs, (("reference", 64),) + FORMS, initial_state)
        for (impl, cs), out in zip(FORMS, outs):
            assert_outputs_close(self, out, ref, FWD_REL, f"{impl} C={cs}")

    def test_matches_matrix_form_of_the_paper(self):
        # Eqs. 21-24 in matrix form, in float64 NumPy: S_t = A_t S_{t-1} + k_t (w_t * v_t)^T with
        # A_t = (I - k_t (b_t * k_t)^T) Diag(exp g_t), o_t = K^-1/2 S_t^T q_t.
        inputs = make_inputs(12, batch=1, seq_len=5, key_heads=1, heads=1, dk=4, dv=3)
        x = {n: np.asarray(a, np.float64) for n, a in inputs.items()}
        state = x["initial_state"][0, 0]
        o_want = []
        for t in range(5):
            q, k, v, g, b, w = (x[n][0, t, 0] for n in ARGS)
            a = (np.eye(4) - np.outer(k, b * k)) @ np.diag(np.exp(g))
            state = a @ state + np.outer(k, w * v)
            o_want.append(4**-0.5 * state.T @ q)
        forms = (("reference", 64),) + FORMS
        for (impl, cs), (o, s, _) in zip(forms, run_forms(inputs, forms)):
            np.testing.assert_allclose(o[0, :, 0], np.stack(o_want), **tolerances.fwd_tol(F32),
                                       err_msg=f"{impl} C={cs} o")
            np.testing.assert_allclose(s[0, 0], state, **tolerances.fwd_tol(F32),
                                       err_msg=f"{impl} C={cs} final_state")

    @parameterized.named_parameters(
        dict(testcase_name="one_document", packed=False),
        dict(testcase_name="packed", packed=True),
    )
    def test_gradients_match_reference(self, packed):
        seq_len = 40
        inputs = make_inputs(1, seq_len=seq_len)
        segment_ids = jnp.array([[0] * 7 + [1] * 9 + [2] * 24, [0] * 20 + [1] * 20])
        segment_ids = segment_ids if packed else None
        # Random cotangents on o, final_state and u.
        primal = run_forms(inputs, (("reference", 64),), segment_ids=segment_ids)[0]
        rng = np.random.default_rng(7)
        cot = tuple(jnp.asarray(rng.standard_normal(x.shape), F32) for x in primal)
        forms = (("reference", 64),) + FORMS

        @jax.jit
        def grads(inputs):
            def loss(inputs, impl, chunk_size):
                out = call(
                    inputs, output_final_state=True, segment_ids=segment_ids,
                    implementation=impl, chunk_size=chunk_size, return_residual=True,
                )
                return sum(jnp.vdot(c, x) for c, x in zip(cot, out))

            return [jax.grad(functools.partial(loss, impl=i, chunk_size=c))(inputs)
                    for i, c in forms]

        want, *got = grads(inputs)
        for (impl, cs), got_form in zip(FORMS, got):
            for name in want:
                what = f"{impl} C={cs} d{name}"
                self.assertTrue(np.all(np.isfinite(got_form[name])), what)
                tolerances.assert_rel_err(got_form[name], want[name], GRAD_REL, what)

    @parameterized.named_parameters(
        *FORM_PARAMS, dict(testcase_name="reference", impl="reference", chunk_size=64)
    )
    def test_packed_rows_match_separate_documents(self, impl, chunk_size):
        # Row 0: boundaries inside chunk 0 (t=5), at chunk edges (16, 32) and inside chunk 2
        # (39) for C=16, reusing ids (0, 1, 0, 1, 0). Row 1: a one-token first document.
        lengths = ([5, 11, 16, 7, 9], [1, 30, 17])
        rows = [np.repeat([i % 2 for i in range(len(ls))], ls) for ls in lengths]
        segment_ids = jnp.asarray(np.stack([rows[0], rows[1] + 4]), jnp.int32)
        inputs = make_inputs(2, seq_len=48)
        o, state, u = run_forms(inputs, ((impl, chunk_size),), segment_ids=segment_ids)[0]
        separate, docs = separate_documents(inputs, lengths)
        want_o, want_s, want_u = run_forms(separate, (("reference", 64),))[0]
        for i, (row, start, n) in enumerate(docs):
            what = f"row {row} document at t={start}"
            tolerances.assert_rel_err(o[row, start:start + n], want_o[i, :n], FWD_REL, f"{what} o")
            tolerances.assert_rel_err(u[row, start:start + n], want_u[i, :n], FWD_REL, f"{what} u")
            if start + n == o.shape[1]:
                tolerances.assert_rel_err(state[row], want_s[i], FWD_REL, f"{what} final_state")

    @pytest.mark.slow  # ~12 s on 2 cores
    def test_channel_uniform_gates_equal_kda(self):
        # GDN-2 with b = beta 1_K and w = beta 1_V is KDA (Eqs. 21-24 vs. 18-20). The two
        # references are written independently, so this also cross-checks them.
        inputs = make_inputs(3, seq_len=37)
        beta = inputs["b"][..., 0]  # [B, T, H]
        inputs["b"] = jnp.broadcast_to(beta[..., None], inputs["b"].shape)
        inputs["w"] = jnp.broadcast_to(beta[..., None], inputs["w"].shape)
        segment_ids = jnp.array([[0] * 20 + [1] * 17, [0] * 37])
        forms = (("reference", 64),) + FORMS
        got_all = run_forms(inputs, forms, segment_ids=segment_ids)
        for (impl, cs), got in zip(forms, got_all):
            want = kda_lib.kda(
                inputs["q"], inputs["k"], inputs["v"], inputs["g"], beta,
                initial_state=inputs["initial_state"], output_final_state=True,
                segment_ids=segment_ids, implementation=impl, chunk_size=cs,
                return_residual=True,
            )
            assert_outputs_close(self, got, want, FWD_REL, f"{impl} C={cs} vs KDA")

    def test_gva_equals_explicit_repeat(self):
        inputs = make_inputs(4, seq_len=24, key_heads=2, heads=4)
        head_map = jnp.array([0, 0, 1, 1])  # value head h reads key head h // 2

        def loss(q, k, explicit):
            if explicit:
                q, k = q[:, :, head_map], k[:, :, head_map]
            o, s = call(dict(inputs, q=q, k=k), output_final_state=True, chunk_size=16)
            return jnp.sum(o * inputs["v"]) + jnp.sum(s**2), (o, s)

        run = jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True), static_argnums=2)
        (dq, dk), (o, s) = run(inputs["q"], inputs["k"], False)
        (dq_x, dk_x), (o_x, s_x) = run(inputs["q"], inputs["k"], True)
        self.assertEqual(o.shape, (2, 24, 4, 32))
        np.testing.assert_allclose(o, o_x, **tolerances.fwd_tol(F32))
        np.testing.assert_allclose(s, s_x, **tolerances.fwd_tol(F32))
        np.testing.assert_allclose(dq, dq_x, **tolerances.grad_tol(F32))
        np.testing.assert_allclose(dk, dk_x, **tolerances.grad_tol(F32))

    def test_bf16_inputs_match_fp32_reference(self):
        inputs = make_inputs(5, seq_len=50)
        low = {
            n: (x if n == "initial_state" else x.astype(jnp.bfloat16)) for n, x in inputs.items()
        }
        want = run_forms({n: x.astype(F32) for n, x in low.items()}, (("reference", 64),))[0]
        forms = (("reference", 64),) + FORMS
        for (impl, cs), (o, s, u) in zip(forms, run_forms(low, forms)):
            self.assertEqual((o.dtype, s.dtype, u.dtype), (jnp.bfloat16, F32, jnp.bfloat16))
            for name, a, e in (("o", o, want[0]), ("final_state", s, want[1]), ("u", u, want[2])):
                tolerances.assert_rel_err(
                    a, e, tolerances.fwd_tol(jnp.bfloat16)["rtol"], f"bf16 {impl} C={cs} {name}"
                )

    @pytest.mark.slow  # ~15 s on 2 cores
    def test_extreme_gates_are_finite(self):
        # One batch row per regime: g = -20 per token with saturated gates b = w = 1
        # (sigmoid(30)); g = -20 with b = 1, w ~ 0; g = 0 with b ~ 0 (no erase: linear
        # attention, the state grows) and w = 1; half the key channels at -20, half at 0.
        inputs = make_inputs(6, batch=4, seq_len=40)
        mixed = jnp.where(jnp.arange(16) % 2 == 0, -20.0, 0.0)
        g_rows = jnp.stack([jnp.full(16, -20.0), jnp.full(16, -20.0), jnp.zeros(16), mixed])
        inputs["g"] = jnp.broadcast_to(g_rows[:, None, None, :], inputs["g"].shape)
        b_rows = jax.nn.sigmoid(jnp.array([30.0, 30.0, -30.0, 30.0]))
        w_rows = jax.nn.sigmoid(jnp.array([30.0, -30.0, 30.0, 30.0]))
        inputs["b"] = jnp.broadcast_to(b_rows[:, None, None, None], inputs["b"].shape)
        inputs["w"] = jnp.broadcast_to(w_rows[:, None, None, None], inputs["w"].shape)
        forms = (("reference", 64),) + FORMS

        @jax.jit
        def run(inputs):
            def loss(inputs, impl, cs):
                out = call(inputs, output_final_state=True, implementation=impl, chunk_size=cs)
                return jnp.sum(out[0] ** 2) + jnp.sum(out[1] ** 2), out

            return [jax.grad(functools.partial(loss, impl=i, cs=c), has_aux=True)(inputs)
                    for i, c in forms]

        results = run(inputs)
        (_, (o_ref, s_ref)) = results[0]
        for (impl, cs), (grads, (o, s)) in zip(forms, results):
            what = f"{impl} C={cs}"
            for name, x in [("o", o), ("final_state", s)] + sorted(grads.items()):
                self.assertTrue(np.all(np.isfinite(x)), f"{what}: {name} is not finite")
            tolerances.assert_rel_err(o, o_ref, FWD_REL, f"{what} o")
            tolerances.assert_rel_err(s, s_ref, FWD_REL, f"{what} final_state")

    @parameterized.named_parameters(*FORM_PARAMS)
    def test_causal(self, impl, chunk_size):
        seq_len, cut = 40, 21  # the cut falls inside a chunk for C=16 and C=64
        inputs = make_inputs(7, seq_len=seq_len)
        noise = make_inputs(8, seq_len=seq_len)
        changed = {
            n: (x if n == "initial_state" else x.at[:, cut:].set(noise[n][:, cut:]))
            for n, x in inputs.items()
        }
        (o, _, u), (o2, _, u2) = [
            run_forms(x, ((impl, chunk_size),))[0] for x in (inputs, changed)
        ]
        np.testing.assert_allclose(o2[:, :cut], o[:, :cut], **tolerances.fwd_tol(F32))
        np.testing.assert_allclose(u2[:, :cut], u[:, :cut], **tolerances.fwd_tol(F32))
        self.assertGreater(float(jnp.abs(o2[:, cut:] - o[:, cut:]).max()), 1e-3)

    def test_decode_steps_match_full_sequence(self):
        seq_len, prefix = 20, 13
        inputs = make_inputs(9, seq_len=seq_len)

        def window(start, stop):
            return {n: (x if n == "initial_state" else x[:, start:stop]) for n, x in inputs.items()}

        o_full, s_full = call(inputs, output_final_state=True)
        _, state = call(window(0, prefix), output_final_state=True)
        for t in range(prefix, seq_len):
            o_t, state = call(window(t, t + 1), initial_state=state, output_final_state=True)
            np.testing.assert_allclose(o_t[:, 0], o_full[:, t], **tolerances.fwd_tol(F32))
        np.testing.assert_allclose(state, s_full, **tolerances.fwd_tol(F32))

    def test_api_defaults_and_return_structure(self):
        inputs = make_inputs(10, seq_len=9)
        o, state = call(inputs, initial_state=None)
        self.assertIsNone(state)
        self.assertLen(call(inputs, return_residual=True), 3)
        for impl in (None, "auto", "chunked"):
            o_impl, _ = call(inputs, initial_state=None, implementation=impl)
            np.testing.assert_array_equal(o_impl, o)
        # scale=None means K ** -0.5; o is linear in the scale.
        o_half, _ = call(inputs, initial_state=None, scale=0.5 * 16**-0.5)
        np.testing.assert_allclose(o_half, 0.5 * o, **tolerances.fwd_tol(F32))

    def test_bad_inputs_raise(self):
        base = make_inputs(11, seq_len=8, key_heads=2, heads=4)
        bad_cases = [
            (dict(q=base["q"][0]), {},
             r"^q must be \[B, T, HK, K\] \(rank 4\), got shape \(8, 2, 16\)$"),
            (dict(k=base["k"][:, :7]), {}, r"k\.shape="),
            (dict(v=base["v"][:, :, :3]), {}, r"multiple of the key heads"),
            (dict(g=base["g"][..., :8]), {}, r"g\.shape="),
            (dict(b=base["b"][..., 0]), {}, r"^b must be \[B, T, H, K\] \(rank 4\), got shape "),
            (dict(b=base["b"][:, :, :2]), {}, r"b\.shape="),
            (dict(w=base["w"][..., :16]), {}, r"w\.shape="),
            (dict(w=base["w"].astype(jnp.int32)), {}, r"w must have a floating dtype"),
            (dict(q=base["q"][:, :0], k=base["k"][:, :0]), {}, r"at least one token"),
            ({}, dict(initial_state=base["initial_state"][:, :2]), r"initial_state\.shape="),
            ({}, dict(segment_ids=jnp.zeros((2, 7), jnp.int32)), r"segment_ids\.shape="),
            ({}, dict(segment_ids=jnp.zeros((2, 8), F32)), r"segment_ids must have an integer"),
            ({}, dict(chunk_size=48), r"chunk_size must be a positive power of two"),
            ({}, dict(chunk_size=0), r"chunk_size must be a positive power of two"),
            ({}, dict(chunk_size=True), r"chunk_size must be a positive power of two"),
            ({}, dict(initial_state=base["initial_state"].astype(jnp.int32)),
             r"^initial_state must have a floating dtype"),
            ({}, dict(implementation="cuda"), r"^\w+: implementation='cuda' is not available"),
            ({}, dict(scale="x"), r"^scale must be None or a positive finite number, got "
                                  r"scale='x' \(str\)$"),
            ({}, dict(scale=True), r"^scale must be None or a positive finite number"),
            ({}, dict(scale=float("nan")), r"^scale must be None or a positive finite number"),
        ]
        for arrays, kwargs, pattern in bad_cases:
            with self.subTest(pattern=pattern):
                with self.assertRaisesRegex(ValueError, pattern):
                    gdn2_lib.gdn2(*[arrays.get(n, base[n]) for n in ARGS], **kwargs)


if __name__ == "__main__":
    absltest.main()
