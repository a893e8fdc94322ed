"""Tests for ``pallas_kernels.simple_gla``: scalar-decay linear attention (linear, Lightning).

The token-serial ``lax.scan`` reference is ground truth; it is itself checked against float64
NumPy oracles in quadratic form (``o_t = scale * sum_{s <= t} decay(s, t) (q_t . k_s) v_s``).
The chunked and associative-scan forms must match the reference in fp32 (outputs, final state and
all gradients), handle packed rows, GVA and bf16 inputs, stay finite under strong decay, be
causal, continue exactly from a carried state, and reject bad arguments with a ``ValueError``
naming the argument. ``lightning_log_decay`` is checked against values computed by hand from the
spec's formula (``hypenet-halo.md`` §1.5 item 5).

Run from the repository root: ``python -m pytest -q tests/pallas_kernels/simple_gla_test.py``, or
as a script: ``python -m tests.pallas_kernels.simple_gla_test``.
"""

import functools
import math

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels import simple_gla as sg
from tests import tolerances

F32 = jnp.float32
# Relative-RMS bounds for fp32 results, taken from the tolerance table (rtol of each entry).
FWD_REL = tolerances.fwd_tol(F32)["rtol"]
GRAD_REL = tolerances.grad_tol(F32)["rtol"]
# (implementation, chunk_size) pairs checked against the reference.
FORMS = (("chunked", 16), ("chunked", 64), ("associative_scan", 64))
REF = (("reference", 64),)
FORM_PARAMS = [dict(testcase_name=f"{impl}_C={cs}", impl=impl, chunk_size=cs) for impl, cs in FORMS]
ARG_NAMES = ("q", "k", "v", "g", "initial_state")


def make_inputs(seed, *, batch=2, seq_len=40, key_heads=1, heads=2, dk=16, dv=32):
    """Random inputs: normal q, k, v, initial_state; log-decays mixing slow and fast heads.

    Drawn with NumPy, so that a new shape does not compile new random-number programs.
    """
    rng = np.random.default_rng(seed)

    def normal(*shape):
        return jnp.asarray(rng.standard_normal(shape), F32)

    return dict(
        q=normal(batch, seq_len, key_heads, dk),
        k=normal(batch, seq_len, key_heads, dk),
        v=normal(batch, seq_len, heads, dv),
        # softplus(x - 2) spans slow (~0.02) to fast (~1) decays, so state crosses chunks.
        g=-jax.nn.softplus(normal(batch, seq_len, heads) - 2.0),
        initial_state=normal(batch, heads, dk, dv),
    )


def _call(inputs, impl, chunk_size, *, gated=True, initial_state=True, segment_ids=None):
    return sg.simple_gla(
        inputs["q"], inputs["k"], inputs["v"], inputs["g"] if gated else None,
        initial_state=inputs["initial_state"] if initial_state else None,
        output_final_state=True, segment_ids=segment_ids, implementation=impl,
        chunk_size=chunk_size,
    )


def run_forms(inputs, forms, *, gated=True, initial_state=True, segment_ids=None):
    """Runs ``simple_gla`` for every ``(implementation, chunk_size)``; returns (o, S) pairs.

    No outer ``jit``: each form is the op's own jitted program, which tests with equal shapes
    share (also with and without ``initial_state``, which the op turns into zeros).
    """
    return [_call(inputs, impl, cs, gated=gated, initial_state=initial_state,
                  segment_ids=segment_ids) for impl, cs in forms]


def assert_outputs_close(got, want, max_err, what=""):
    for name, a, e in zip(("o", "final_state"), got, want):
        if a.shape != e.shape:
            raise AssertionError(f"{what} {name}: shape {a.shape} != {e.shape}")
        tolerances.assert_rel_err(a, e, max_err, f"{what} {name}")


def quadratic_oracle(q, k, v, log_decay=None, *, scale=None, initial_state=None):
    """Float64 quadratic form of the recurrence, with G the inclusive cumsum of ``log_decay``::

        o_t = scale (sum_{s <= t} e^{G_t - G_s} (q_t . k_s) v_s + e^{G_t} S0^T q_t)

    ``log_decay`` is ``[B, T, H]`` (or ``None`` for 0). Also returns the final state
    ``e^{G_T} S0 + sum_s e^{G_T - G_s} k_s v_s^T``.
    """
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    _, seq_len, key_heads, dk = q.shape
    heads = v.shape[2]
    q = np.repeat(q, heads // key_heads, axis=2)
    k = np.repeat(k, heads // key_heads, axis=2)
    scale = dk ** -0.5 if scale is None else scale
    g = np.zeros(v.shape[:3]) if log_decay is None else np.asarray(log_decay, np.float64)
    cum = np.cumsum(g, axis=1)  # [B, T, H]
    t_idx = np.arange(seq_len)
    diff = cum[:, :, None, :] - cum[:, None, :, :]  # [B, t, s, H]
    causal = (t_idx[:, None] >= t_idx[None, :])[None, :, :, None]
    decay = np.where(causal, np.exp(np.where(causal, diff, 0.0)), 0.0)
    scores = np.einsum("bthk,bshk->btsh", q, k) * decay
    o = scale * np.einsum("btsh,bshv->bthv", scores, v)
    state = np.einsum("bsh,bshk,bshv->bhkv", np.exp(cum[:, -1:] - cum), k, v)
    if initial_state is not None:
        s0 = np.asarray(initial_state, np.float64)
        o = o + scale * np.einsum("bth,bthk,bhkv->bthv", np.exp(cum), q, s0)
        state = state + np.exp(cum[:, -1])[..., None, None] * s0
    return o, state


def separate_documents(inputs, lengths):
    """Cuts each row at ``lengths`` and left-aligns every document in a row of its own.

    Rows are padded at the end with inert tokens (``k = v = g = 0`` leave the state unchanged),
    so one reference call runs all documents separately. Only a row's first document keeps that
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


class SimpleGlaTest(parameterized.TestCase):

    # ------------------------------------------------------------------ forms vs reference

    @parameterized.named_parameters(
        dict(testcase_name=f"T={t}_initial_state={h0}", seq_len=t, initial_state=h0)
        for t in (1, 63, 65, 100) for h0 in (True, False)
    )
    def test_forms_match_reference(self, seq_len, initial_state):
        inputs = make_inputs(seq_len, seq_len=seq_len)
        ref, *outs = run_forms(inputs, REF + FORMS, initial_state=initial_state)
        for (impl, cs), out in zip(FORMS, outs):
            assert_outputs_close(out, ref, FWD_REL, f"{impl} C={cs}")

    def test_forms_match_reference_without_decay(self):
        inputs = make_inputs(20, seq_len=65)
        ref, *outs = run_forms(inputs, REF + FORMS, gated=False)
        for (impl, cs), out in zip(FORMS, outs):
            assert_outputs_close(out, ref, FWD_REL, f"{impl} C={cs}")

    # --------------------------------------------------------------- float64 NumPy oracles

    def test_linear_attention_matches_numpy_sum(self):
        # Plain linear attention: o_t = scale * sum_{j <= t} (q_t . k_j) v_j, in float64, with
        # GVA (two value heads read one key head) and no initial state.
        inputs = make_inputs(11)
        q, k, v = (np.asarray(inputs[n], np.float64) for n in ("q", "k", "v"))
        scale = 0.3
        o_want = np.zeros(v.shape)
        for t in range(40):
            scores = np.einsum("bhk,bjhk->bjh", q[:, t], k[:, :t + 1])  # [B, t + 1, 1]
            o_want[:, t] = scale * np.einsum("bjh,bjhv->bhv", scores, v[:, :t + 1])
        s_want = np.einsum("bjhk,bjhv->bhkv", np.repeat(k, 2, axis=2), v)
        zeros = jnp.zeros(inputs["g"].shape, F32)
        for impl, cs in REF + FORMS:
            for name, o, s in (
                ("linear_attention", *sg.linear_attention(
                    inputs["q"], inputs["k"], inputs["v"], scale=scale, output_final_state=True,
                    implementation=impl, chunk_size=cs)),
                ("simple_gla g=0", *sg.simple_gla(
                    inputs["q"], inputs["k"], inputs["v"], zeros, scale=scale,
                    output_final_state=True, implementation=impl, chunk_size=cs)),
            ):
                tolerances.assert_rel_err(o, o_want, FWD_REL, f"{name} {impl} C={cs} o")
                tolerances.assert_rel_err(s, s_want, FWD_REL, f"{name} {impl} C={cs} state")

    def test_reference_matches_quadratic_oracle(self):
        # Per-token decays with an initial state, against the float64 quadratic form.
        inputs = make_inputs(12, key_heads=2, heads=4)
        (o, s), = run_forms(inputs, REF)
        o_want, s_want = quadratic_oracle(inputs["q"], inputs["k"], inputs["v"], inputs["g"],
                                          initial_state=inputs["initial_state"])
        tolerances.assert_rel_err(o, o_want, FWD_REL, "o")
        tolerances.assert_rel_err(s, s_want, FWD_REL, "final_state")

    def test_lightning_matches_quadratic_oracle(self):
        # Spec §1.11 oracle: o = (scale Q K^T * D) V with D_ts = gamma_h^(t - s). The two heads
        # get the fastest and the slowest decay of HypeNet's 8-head schedule (gamma = 0.49 and
        # 0.996), and share one key head (GVA).
        inputs = make_inputs(13)
        log_decay = sg.lightning_log_decay(8)[jnp.array([0, 7])]
        o_want, s_want = quadratic_oracle(
            inputs["q"], inputs["k"], inputs["v"],
            np.broadcast_to(np.asarray(log_decay), inputs["g"].shape))
        for impl, cs in REF + FORMS:
            o, s = sg.lightning_attention(inputs["q"], inputs["k"], inputs["v"], log_decay,
                                          output_final_state=True, implementation=impl,
                                          chunk_size=cs)
            tolerances.assert_rel_err(o, o_want, FWD_REL, f"{impl} C={cs} o")
            tolerances.assert_rel_err(s, s_want, FWD_REL, f"{impl} C={cs} final_state")

    def test_lightning_takes_an_array_like_log_decay(self):
        # A Python list raised AttributeError ('list' object has no attribute 'dtype') deep in
        # the call; it is converted as the docstring's "any float dtype" suggests.
        seed = int(np.random.default_rng().integers(1 << 30))
        inputs = make_inputs(seed)
        rng = np.random.default_rng(seed)
        decays = (-rng.uniform(0.01, 2.0, size=inputs["v"].shape[2])).tolist()
        o_want, _ = quadratic_oracle(inputs["q"], inputs["k"], inputs["v"],
                                     np.broadcast_to(np.asarray(decays, np.float32),
                                                     inputs["g"].shape))
        for given in (decays, tuple(decays), np.asarray(decays, np.float64)):
            with self.subTest(kind=type(given).__name__, seed=seed):
                o, _ = sg.lightning_attention(inputs["q"], inputs["k"], inputs["v"], given,
                                              implementation="chunked", chunk_size=16)
                tolerances.assert_rel_err(o, o_want, FWD_REL, "o")
        qkv = [inputs[n] for n in ("q", "k", "v")]
        for bad in (None, "fast", [[-0.1], [-0.2, -0.3]]):
            with self.subTest(bad=bad):
                with self.assertRaisesRegex(TypeError, r"^log_decay must be an array-like of "
                                                       r"floats of shape \[H\], got "):
                    sg.lightning_attention(*qkv, bad)
        with self.assertRaisesRegex(ValueError, r"log_decay must have a floating dtype"):
            sg.lightning_attention(*qkv, [-1] * inputs["v"].shape[2])  # a list of ints
        with self.assertRaisesRegex(ValueError, r"log_decay\.shape="):
            sg.lightning_attention(*qkv, decays[:1])

    # ------------------------------------------------------------------------- gradients

    @parameterized.named_parameters(
        dict(testcase_name="decay_packed", gated=True, packed=True),
        dict(testcase_name="no_decay", gated=False, packed=False),
    )
    def test_gradients_match_reference(self, gated, packed):
        inputs = make_inputs(1)
        if not gated:
            del inputs["g"]
        # Boundaries inside a chunk of 16 (t=7, 20) and on a chunk edge (t=16).
        segment_ids = jnp.array([[0] * 7 + [1] * 9 + [2] * 24, [0] * 20 + [1] * 20])
        segment_ids = segment_ids if packed else None
        rng = np.random.default_rng(7)
        cot_o = jnp.asarray(rng.standard_normal(inputs["v"].shape), F32)
        cot_s = jnp.asarray(rng.standard_normal(inputs["initial_state"].shape), F32)

        @jax.jit
        def grads(inputs):
            def loss(inputs, impl, chunk_size):
                o, s = sg.simple_gla(
                    inputs["q"], inputs["k"], inputs["v"], inputs.get("g"),
                    initial_state=inputs["initial_state"], output_final_state=True,
                    segment_ids=segment_ids, implementation=impl, chunk_size=chunk_size)
                return jnp.vdot(cot_o, o) + jnp.vdot(cot_s, s)

            return [jax.grad(functools.partial(loss, impl=i, chunk_size=c))(inputs)
                    for i, c in REF + FORMS]

        want, *got = grads(inputs)
        self.assertEqual(sorted(want), sorted(n for n in ARG_NAMES if gated or n != "g"))
        for (impl, cs), got_form in zip(FORMS, got):
            for name in want:
                what = f"{impl} C={cs} d{name}"
                self.assertTrue(np.all(np.isfinite(got_form[name])), what)
                tolerances.assert_rel_err(got_form[name], want[name], GRAD_REL, what)

    def test_lightning_log_decay_gradient_matches_reference(self):
        # d log_decay sums dg over batch and time (dg itself is checked on every form above).
        inputs = make_inputs(14, key_heads=2, heads=4)
        log_decay = sg.lightning_log_decay(4)

        @jax.jit
        def grads(q, k, v, log_decay):
            def loss(q, k, v, log_decay, impl, cs):
                o, s = sg.lightning_attention(q, k, v, log_decay, output_final_state=True,
                                              implementation=impl, chunk_size=cs)
                return jnp.sum(o * v) + jnp.sum(s ** 2)

            return [jax.grad(functools.partial(loss, impl=i, cs=c), argnums=(0, 1, 2, 3))(
                q, k, v, log_decay) for i, c in REF + FORMS[:1]]

        want, *got = grads(inputs["q"], inputs["k"], inputs["v"], log_decay)
        for (impl, cs), got_form in zip(FORMS[:1], got):
            for name, a, e in zip(("q", "k", "v", "log_decay"), got_form, want):
                tolerances.assert_rel_err(a, e, GRAD_REL, f"{impl} C={cs} d{name}")

    # ------------------------------------------------------------------ packed documents

    @parameterized.named_parameters(
        *FORM_PARAMS, dict(testcase_name="reference", impl="reference", chunk_size=64)
    )
    def test_packed_rows_match_separate_documents(self, impl, chunk_size):
        # Row 0: boundaries inside chunk 0 (t=5), at chunk edges (16, 32) and inside chunk 2
        # (35) for C=16, reusing ids (0, 1, 0, 1, 0). Row 1: a one-token first document.
        lengths = ([5, 11, 16, 3, 5], [1, 22, 17])
        rows = [np.repeat([i % 2 for i in range(len(ls))], ls) for ls in lengths]
        segment_ids = jnp.asarray(np.stack([rows[0], rows[1] + 4]), jnp.int32)
        inputs = make_inputs(2)
        (o, state), = run_forms(inputs, ((impl, chunk_size),), segment_ids=segment_ids)
        separate, docs = separate_documents(inputs, lengths)
        (want_o, want_s), = run_forms(separate, REF)
        for i, (row, start, n) in enumerate(docs):
            what = f"row {row} document at t={start}"
            tolerances.assert_rel_err(o[row, start:start + n], want_o[i, :n], FWD_REL, f"{what} o")
            if start + n == o.shape[1]:
                tolerances.assert_rel_err(state[row], want_s[i], FWD_REL, f"{what} final_state")

    # ------------------------------------------------------------------------------- GVA

    def test_gva_equals_explicit_repeat(self):
        inputs = make_inputs(4, key_heads=2, heads=4)
        head_map = jnp.array([0, 0, 1, 1])  # value head h reads key head h // 2

        def loss(q, k, explicit):
            if explicit:
                q, k = q[:, :, head_map], k[:, :, head_map]
            o, s = sg.simple_gla(q, k, inputs["v"], inputs["g"],
                                 initial_state=inputs["initial_state"], output_final_state=True,
                                 chunk_size=16)
            return jnp.sum(o * inputs["v"]) + jnp.sum(s ** 2), (o, s)

        run = jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True), static_argnums=2)
        (dq, dk), (o, s) = run(inputs["q"], inputs["k"], False)
        (dq_x, dk_x), (o_x, s_x) = run(inputs["q"], inputs["k"], True)
        self.assertEqual(o.shape, (2, 40, 4, 32))
        np.testing.assert_allclose(o, o_x, **tolerances.fwd_tol(F32))
        np.testing.assert_allclose(s, s_x, **tolerances.fwd_tol(F32))
        np.testing.assert_allclose(dq, dq_x, **tolerances.grad_tol(F32))
        np.testing.assert_allclose(dk, dk_x, **tolerances.grad_tol(F32))

    # ------------------------------------------------------------------------------ bf16

    def test_bf16_inputs_match_fp32_reference(self):
        inputs = make_inputs(5)
        low = {n: (x if n == "initial_state" else x.astype(jnp.bfloat16))
               for n, x in inputs.items()}
        (want,) = run_forms({n: x.astype(F32) for n, x in low.items()}, REF)
        max_err = tolerances.fwd_tol(jnp.bfloat16)["rtol"]
        for (impl, cs), (o, s) in zip(REF + FORMS, run_forms(low, REF + FORMS)):
            self.assertEqual((o.dtype, s.dtype), (jnp.bfloat16, F32), f"{impl} C={cs}")
            assert_outputs_close((o, s), want, max_err, f"bf16 {impl} C={cs}")

        def loss(q, k, v, g):
            o, _ = sg.simple_gla(q, k, v, g, initial_state=inputs["initial_state"])
            return jnp.sum(o.astype(F32) ** 2)

        grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(
            *(low[n] for n in ("q", "k", "v", "g")))
        for name, grad in zip(ARG_NAMES, grads):
            self.assertEqual(grad.dtype, jnp.bfloat16, f"d{name}")
            self.assertTrue(np.all(np.isfinite(np.asarray(grad, F32))), f"d{name}")

    # ---------------------------------------------------------------------- strong decay

    def test_strong_decay_is_finite(self):
        # Row 0: g = -20 on every token (e^-20 per step, e^-1280 across a chunk: underflows to
        # 0); row 1: alternating -20 and 0, so some pairs inside a chunk are not decayed.
        inputs = make_inputs(6, seq_len=65)
        rows = jnp.stack([jnp.full(65, -20.0), jnp.where(jnp.arange(65) % 2 == 0, -20.0, 0.0)])
        inputs["g"] = jnp.broadcast_to(rows[:, :, None], inputs["g"].shape)

        @jax.jit
        def run(inputs):
            def loss(inputs, impl, cs):
                o, s = _call(inputs, impl, cs)
                return jnp.sum(o ** 2) + jnp.sum(s ** 2), (o, s)

            return [jax.grad(functools.partial(loss, impl=i, cs=c), has_aux=True)(inputs)
                    for i, c in REF + FORMS]

        (grads_ref, out_ref), *results = run(inputs)
        for (impl, cs), (grads, out) in zip(REF + FORMS, [(grads_ref, out_ref)] + results):
            what = f"{impl} C={cs}"
            for name, x in [("o", out[0]), ("final_state", out[1])] + sorted(grads.items()):
                self.assertTrue(np.all(np.isfinite(x)), f"{what}: {name} is not finite")
            assert_outputs_close(out, out_ref, FWD_REL, what)
            # dg is tiny where g = -20; the segment-sum decays keep it accurate.
            for name in grads:
                tolerances.assert_rel_err(grads[name], grads_ref[name], GRAD_REL,
                                          f"{what} d{name}")

    # ------------------------------------------------------------------ causality, decode

    @parameterized.named_parameters(*FORM_PARAMS)
    def test_causal(self, impl, chunk_size):
        seq_len, cut = 40, 21  # the cut falls inside a chunk for C=16 and C=64
        inputs = make_inputs(7, seq_len=seq_len)
        noise = make_inputs(8, seq_len=seq_len)
        changed = {n: (x if n == "initial_state" else x.at[:, cut:].set(noise[n][:, cut:]))
                   for n, x in inputs.items()}
        (o, _), (o2, _) = [run_forms(x, ((impl, chunk_size),))[0] for x in (inputs, changed)]
        np.testing.assert_allclose(o2[:, :cut], o[:, :cut], **tolerances.fwd_tol(F32))
        self.assertGreater(float(jnp.abs(o2[:, cut:] - o[:, cut:]).max()), 1e-3)

    @parameterized.named_parameters(
        dict(testcase_name="simple_gla", lightning=False),
        dict(testcase_name="lightning", lightning=True),
    )
    def test_prefix_then_decode_matches_full_forward(self, lightning):
        seq_len, prefix = 40, 34
        inputs = make_inputs(9, seq_len=seq_len)
        log_decay = sg.lightning_log_decay(2)

        def op(t0, t1, state):
            q, k, v = (inputs[n][:, t0:t1] for n in ("q", "k", "v"))
            if lightning:
                return sg.lightning_attention(q, k, v, log_decay, initial_state=state,
                                              output_final_state=True)
            return sg.simple_gla(q, k, v, inputs["g"][:, t0:t1], initial_state=state,
                                 output_final_state=True)

        o_full, s_full = op(0, seq_len, inputs["initial_state"])
        o_prefix, state = op(0, prefix, inputs["initial_state"])
        outs = [o_prefix]
        for t in range(prefix, seq_len):  # T = 1 calls carrying final_state
            o_t, state = op(t, t + 1, state)
            outs.append(o_t)
        np.testing.assert_allclose(jnp.concatenate(outs, axis=1), o_full,
                                   **tolerances.fwd_tol(F32))
        np.testing.assert_allclose(state, s_full, **tolerances.fwd_tol(F32))

    # -------------------------------------------------------------------------- API misc

    def test_api_defaults_and_return_structure(self):
        inputs = make_inputs(10)
        args = [inputs[n] for n in ("q", "k", "v", "g")]
        o, state = sg.simple_gla(*args)
        self.assertIsNone(state)
        self.assertEqual(o.shape, inputs["v"].shape)
        for impl in (None, "auto", "chunked"):
            o_impl, _ = sg.simple_gla(*args, implementation=impl)
            np.testing.assert_array_equal(o_impl, o)
        # scale=None means K ** -0.5; o is linear in the scale.
        o_half, _ = sg.simple_gla(*args, scale=0.5 * 16 ** -0.5)
        np.testing.assert_allclose(o_half, 0.5 * o, **tolerances.fwd_tol(F32))
        # Lightning is simple_gla with the per-head decay broadcast over batch and time.
        log_decay = jnp.array([-0.3, -0.01], F32)
        o_l, s_l = sg.lightning_attention(*args[:3], log_decay, output_final_state=True)
        o_g, s_g = sg.simple_gla(*args[:3], jnp.broadcast_to(log_decay, (2, 40, 2)),
                                 output_final_state=True)
        np.testing.assert_array_equal(o_l, o_g)
        np.testing.assert_array_equal(s_l, s_g)

    # -------------------------------------------------------------- lightning_log_decay

    def test_lightning_log_decay_hypenet_values(self):
        # Spec hypenet-halo.md §1.5 item 5: log(gamma_h) = -2^(-8 (h + 1) / H), h = 0 .. H - 1.
        for heads in (1, 2, 4, 16, 32):
            want = [-(2.0 ** (-8.0 * (h + 1) / heads)) for h in range(heads)]
            got = sg.lightning_log_decay(heads)
            self.assertEqual((got.shape, got.dtype), ((heads,), F32))
            np.testing.assert_allclose(got, want, rtol=1e-7, err_msg=f"H={heads}")
        # The spec's worked numbers: H=16 gamma_0 = 0.4931, gamma_15 = 0.99610 (half-lives ~1
        # and ~177 tokens); H=32 gamma_0 = 0.4313.
        gamma16 = np.exp(np.asarray(sg.lightning_log_decay(16), np.float64))
        np.testing.assert_allclose(gamma16[[0, 15]], [0.4931, 0.99610], atol=5e-5)
        np.testing.assert_allclose(math.log(2) / -np.log(gamma16[15]), 177.4, atol=0.05)
        np.testing.assert_allclose(np.exp(sg.lightning_log_decay(32)[0]), 0.4313, atol=5e-5)
        # H = 12 (not a power of two), ALiBi interleaving: the 8-head slopes 2^-1 .. 2^-8, then
        # the 16-head slopes at even indices 0, 2, 4, 6: 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5.
        want12 = [2.0 ** -e for e in (1, 2, 3, 4, 5, 6, 7, 8, 0.5, 1.5, 2.5, 3.5)]
        np.testing.assert_allclose(sg.lightning_log_decay(12), -np.array(want12), rtol=1e-7)

    def test_lightning_log_decay_max_bias(self):
        # max_bias b replaces the 8: slope_h = 2^(-b (h + 1) / H). H = 8, b = 12: 2^-1.5 ..
        # 2^-12, the longest half-life ln 2 * 2^12 = 2,839.1 tokens (177.4 at b = 8).
        want8 = [2.0 ** -(1.5 * (h + 1)) for h in range(8)]
        got = sg.lightning_log_decay(8, max_bias=12.0)
        np.testing.assert_allclose(got, -np.array(want8), rtol=1e-7)
        np.testing.assert_allclose(math.log(2) / -float(got[-1]), 2839.13, atol=0.05)
        # H = 9, ALiBi interleaving at b = 12: the 8 slopes above, then the first of the
        # 16-head slopes 2^(-12 / 16) = 2^-0.75.
        np.testing.assert_allclose(sg.lightning_log_decay(9, max_bias=12),
                                   -np.array(want8 + [2.0 ** -0.75]), rtol=1e-7)
        np.testing.assert_array_equal(sg.lightning_log_decay(16, max_bias=8.0),
                                      sg.lightning_log_decay(16))
        for bad in (0, -1.0, float("nan"), float("inf"), True, "8", 150.0, 2000):
            with self.subTest(max_bias=bad), self.assertRaisesRegex(ValueError, "max_bias"):
                sg.lightning_log_decay(8, max_bias=bad)
        # NumPy scalars are numbers too.
        np.testing.assert_array_equal(sg.lightning_log_decay(8, max_bias=np.float32(12)), got)
        np.testing.assert_array_equal(sg.lightning_log_decay(8, max_bias=np.int64(12)), got)

    def test_lightning_log_decay_minimax_schedule(self):
        # slope_h * (1 - l / (L - 1) + 1e-5): the first layer keeps the ALiBi slopes, the last
        # one almost stops decaying; a one-layer model uses the factor 1 + 1e-5.
        base = -(2.0 ** (-8.0 * np.arange(1, 9) / 8))
        for layer, num_layers, factor in ((0, 5, 1 + 1e-5), (2, 5, 0.5 + 1e-5), (4, 5, 1e-5),
                                          (0, 1, 1 + 1e-5)):
            np.testing.assert_allclose(sg.lightning_log_decay(8, layer, num_layers),
                                       base * factor, rtol=1e-6, err_msg=f"{layer=}")
        bad = [dict(num_heads=0), dict(num_heads=8, layer_idx=1),
               dict(num_heads=8, num_layers=4), dict(num_heads=8, layer_idx=4, num_layers=4)]
        for kwargs in bad:
            with self.subTest(**kwargs), self.assertRaises(ValueError):
                sg.lightning_log_decay(**kwargs)

    # ---------------------------------------------------------------------------- errors

    def test_bad_inputs_raise(self):
        base = make_inputs(11, seq_len=8, key_heads=2, heads=4)
        args = ("q", "k", "v", "g")
        bad_cases = [
            (dict(q=base["q"][0]), {}, r"^q must be \[B, T, HK, K\] \(rank 4\), got shape "),
            (dict(k=base["k"][:, :7]), {}, r"k\.shape="),
            (dict(k=base["k"][:, :, :1]), {}, r"k\.shape="),
            (dict(v=base["v"][:, :, :3]), {}, r"multiple of the key heads"),
            (dict(g=base["g"][..., :2]), {}, r"g\.shape="),
            (dict(g=base["g"][..., None]), {}, r"^g must be \[B, T, H\] \(rank 3\), got shape "),
            (dict(v=base["v"].astype(jnp.int32)), {}, r"v must have a floating dtype"),
            (dict(q=base["q"][:, :0], k=base["k"][:, :0]), {}, r"at least one token"),
            # Empty head axes raised ZeroDivisionError (H % HK, K ** -0.5).
            (dict(q=base["q"][:, :, :0], k=base["k"][:, :, :0]), {},
             r"^q, k and v need at least one head and one channel per head"),
            (dict(q=base["q"][..., :0], k=base["k"][..., :0]), {}, r"at least one head"),
            (dict(v=base["v"][..., :0]), {}, r"at least one head"),
            ({}, dict(initial_state=base["initial_state"][:, :2]), r"initial_state\.shape="),
            ({}, dict(segment_ids=jnp.zeros((2, 7), jnp.int32)), r"segment_ids\.shape="),
            ({}, dict(segment_ids=jnp.zeros((2, 8), F32)), r"segment_ids must have an integer"),
            ({}, dict(chunk_size=48), r"chunk_size must be a positive power of two"),
            ({}, dict(chunk_size=0), r"chunk_size must be a positive power of two"),
            ({}, dict(implementation="cuda"), r"^\w+: implementation='cuda' is not available"),
            ({}, dict(scale="x"), r"^scale must be None or a positive finite number, got "
                                  r"scale='x' \(str\)$"),
            ({}, dict(scale=True), r"^scale must be None or a positive finite number"),
            ({}, dict(scale=float("nan")), r"^scale must be None or a positive finite number"),
        ]
        for arrays, kwargs, pattern in bad_cases:
            with self.subTest(pattern=pattern):
                call_args = [arrays.get(n, base[n]) for n in args]
                with self.assertRaisesRegex(ValueError, pattern):
                    sg.simple_gla(*call_args, **kwargs)
        qkv = [base[n] for n in ("q", "k", "v")]
        with self.assertRaisesRegex(ValueError, r"log_decay\.shape="):
            sg.lightning_attention(*qkv, jnp.zeros((2,), F32))
        with self.assertRaisesRegex(ValueError, r"log_decay must have a floating dtype"):
            sg.lightning_attention(*qkv, jnp.zeros((4,), jnp.int32))
        with self.assertRaisesRegex(ValueError, r"multiple of the key heads"):
            sg.linear_attention(*qkv[:2], base["v"][:, :, :3])

    def test_each_public_op_names_itself_in_its_dispatch_errors(self):
        # linear_attention and lightning_attention named simple_gla, which they call
        # (2026-12-06 newcomer pass).
        base = make_inputs(12, seq_len=8)  # K = 16: no Pallas GPU kernel for it
        q, k, v = (base[n] for n in ("q", "k", "v"))
        decay = jnp.full((v.shape[2],), -0.1, F32)
        calls = {"simple_gla": lambda **kw: sg.simple_gla(q, k, v, base["g"], **kw),
                 "linear_attention": lambda **kw: sg.linear_attention(q, k, v, **kw),
                 "lightning_attention": lambda **kw: sg.lightning_attention(q, k, v, decay, **kw)}
        for op, call in calls.items():
            with self.subTest(op=op):
                with self.assertRaisesRegex(ValueError, rf"^{op}: implementation='bogus' is not "
                                                        r"available"):
                    call(implementation="bogus")
                with self.assertRaisesRegex(ValueError, rf"^{op}: implementation="
                                                        r"'pallas_interpret' cannot run this call"):
                    call(implementation="pallas_interpret")


if __name__ == "__main__":
    absltest.main()
