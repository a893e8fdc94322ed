"""Tests for ``pallas_kernels.gated_delta_rule``: Gated DeltaNet and DeltaNet.

The token-serial reference is first checked against an independent float64 NumPy loop written
in the matrix form ``S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T``; the
chunked form is then checked against the reference (outputs, states, residuals and all
gradients), and the op's contract (segments, GVA, dtypes, decode, errors) is tested through the
public API.

Run from the repository root:
``python -m pytest -q tests/pallas_kernels/gated_delta_rule_test.py``, or as a script:
``python -m tests.pallas_kernels.gated_delta_rule_test``.
"""

import functools
import itertools

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels import gated_delta_rule as gdr
from tests import random_inputs
from tests import tolerances

_F32 = jnp.float32
_ARG_NAMES = ("q", "k", "v", "g", "beta", "initial_state")


def _make_inputs(seed, *, seq_len, batch=2, key_heads=2, heads=2, dk=16, dv=32, gated=True,
                 decay=None, beta=None):
    """Random fp32 inputs: L2-normalised q, k; beta = sigmoid(randn); g = -softplus(randn - 1).

    Returns:
        ``(args, initial_state)`` with ``args = (q, k, v, g, beta)``; ``g`` is None unless
        ``gated``. ``decay``/``beta`` override g/beta with a constant or an array.
    """
    # numpy's generator, not jax.random: each jax.random call on a new shape compiles a
    # program, a fifth of this file's CPU time.
    rng = np.random.default_rng(seed)

    def normal(*shape):
        return rng.standard_normal(shape)

    q, k, v = (jnp.asarray(x, _F32) for x in
               random_inputs.qkv(rng, batch, seq_len, key_heads, heads, dk, dv))
    g = jnp.asarray(-np.logaddexp(0.0, normal(batch, seq_len, heads) - 1.0), _F32)
    if decay is not None:
        g = jnp.full_like(g, decay)
    if beta is None:
        beta = jnp.asarray(random_inputs.sigmoid(normal(batch, seq_len, heads)), _F32)
    h0 = jnp.asarray(0.5 * normal(batch, heads, dk, dv), _F32)
    return (q, k, v, g if gated else None, jnp.broadcast_to(beta, g.shape)), h0


def _numpy_oracle(q, k, v, g, beta, *, initial_state=None, segment_ids=None, scale=None):
    """Float64 loop over (b, t, h) in the matrix form of Eq. 15; also returns u_t (§4.1)."""
    q, k, v, beta = (np.asarray(x, np.float64) for x in (q, k, v, beta))
    batch, seq_len, key_heads, dk = q.shape
    heads, dv = v.shape[2:]
    q = np.repeat(q, heads // key_heads, axis=2)
    k = np.repeat(k, heads // key_heads, axis=2)
    alpha = np.ones(beta.shape) if g is None else np.exp(np.asarray(g, np.float64))
    scale = dk**-0.5 if scale is None else scale
    o = np.zeros(v.shape)
    u = np.zeros(v.shape)
    states = np.zeros((batch, heads, dk, dv))
    for b in range(batch):
        state = np.zeros((heads, dk, dv))
        if initial_state is not None:
            state = np.array(initial_state[b], np.float64)
        for t in range(seq_len):
            if segment_ids is not None and t > 0 and segment_ids[b, t] != segment_ids[b, t - 1]:
                state = np.zeros_like(state)
            for h in range(heads):
                a, bt, kt = alpha[b, t, h], beta[b, t, h], k[b, t, h]
                u[b, t, h] = bt * (v[b, t, h] - a * state[h].T @ kt)
                state[h] = (a * (np.eye(dk) - bt * np.outer(kt, kt)) @ state[h]
                            + bt * np.outer(kt, v[b, t, h]))
                o[b, t, h] = scale * state[h].T @ q[b, t, h]
        states[b] = state
    return o, states, u


@functools.lru_cache(maxsize=None)
def _reference_outputs(seed, seq_len, gated, with_state, padded_len=130):
    """Reference ``(o, final_state)`` for ``_make_inputs(seed, ...)``, shared across chunk sizes.

    The inputs are padded to ``padded_len`` tokens with ``beta = 0`` and ``g = 0``, which leave
    the state unchanged, so that one compiled reference serves every ``seq_len``.
    """
    args, h0 = _make_inputs(seed, seq_len=seq_len, gated=gated)

    def pad(x):
        if x is None:
            return None
        widths = [(0, 0), (0, padded_len - seq_len)] + [(0, 0)] * (x.ndim - 2)
        return jnp.pad(x, widths, constant_values=0.5)

    q, k, v, g, beta = map(pad, args)
    g = None if g is None else g.at[:, seq_len:].set(0.0)
    beta = beta.at[:, seq_len:].set(0.0)
    o, state = gdr.gated_delta_rule(q, k, v, g, beta, initial_state=h0 if with_state else None,
                                    output_final_state=True, implementation="reference")
    return o[:, :seq_len], state


def _sum_loss(q, k, v, g, beta, initial_state, implementation):
    o, state = gdr.gated_delta_rule(q, k, v, g, beta, initial_state=initial_state,
                                    output_final_state=True, implementation=implementation)
    return jnp.sum(o * v) + jnp.sum(state), (o, state)


# Module level, so that parameterised cases with equal shapes share one compiled program.
_sum_loss_grads = jax.jit(jax.grad(_sum_loss, argnums=tuple(range(6)), has_aux=True),
                          static_argnames="implementation")


def _assert_close(actual, expected, max_err, name):
    tolerances.assert_rel_err(actual, expected, max_err, name)


class GatedDeltaRuleTest(parameterized.TestCase):

    # ---------------------------------------------------------------- reference vs float64 loop

    @parameterized.named_parameters(
        dict(testcase_name="gdn_gva_segments", gated=True),
        dict(testcase_name="deltanet_gva_segments", gated=False),
    )
    def test_reference_matches_numpy_oracle(self, gated):
        args, h0 = _make_inputs(0, seq_len=24, key_heads=1, heads=2, gated=gated)
        segment_ids = jnp.array([[0] * 9 + [1] * 15, [4] * 3 + [2] * 18 + [4] * 3])
        o, state, u = gdr.gated_delta_rule(
            *args, initial_state=h0, output_final_state=True, segment_ids=segment_ids,
            implementation="reference", return_residual=True)
        o_np, state_np, u_np = _numpy_oracle(*args, initial_state=h0, segment_ids=segment_ids)
        max_err = tolerances.FWD[jnp.dtype(_F32)][0]
        _assert_close(o, o_np, max_err, "o")
        _assert_close(state, state_np, max_err, "final_state")
        _assert_close(u, u_np, max_err, "u")

    # ------------------------------------------------------------------ chunked vs reference

    @parameterized.named_parameters(
        dict(testcase_name=f"T={t}_C={c}_{'gdn' if gated else 'deltanet'}",
             seq_len=t, chunk_size=c, gated=gated)
        for t, c, gated in itertools.product((1, 63, 64, 65, 100, 130), (16, 64), (True, False))
    )
    def test_chunked_matches_reference(self, seq_len, chunk_size, gated):
        args, h0 = _make_inputs(0, seq_len=seq_len, gated=gated)
        max_err = tolerances.FWD[jnp.dtype(_F32)][0]
        for with_state in (False, True):
            o, state = gdr.gated_delta_rule(
                *args, initial_state=h0 if with_state else None, output_final_state=True,
                chunk_size=chunk_size, implementation="chunked")
            o_ref, state_ref = _reference_outputs(0, seq_len, gated, with_state)
            _assert_close(o, o_ref, max_err, f"o ({with_state=})")
            _assert_close(state, state_ref, max_err, f"final_state ({with_state=})")

    @parameterized.named_parameters(("gdn", True), ("deltanet", False))
    def test_associative_scan_matches_reference(self, gated):
        # Packed rows with boundaries at 5 and 21, GVA, an initial state; outputs, final state,
        # residuals and all gradients.
        args, h0 = _make_inputs(3, seq_len=33, gated=gated, heads=4)
        segment_ids = jnp.array([[0] * 5 + [1] * 16 + [2] * 12, [7] * 33])
        cot = jax.random.normal(jax.random.key(4), args[2].shape, _F32)

        def run(implementation, *xs):
            g = xs[3] if gated else None
            o, state, u = gdr.gated_delta_rule(
                xs[0], xs[1], xs[2], g, xs[4], initial_state=xs[5], output_final_state=True,
                segment_ids=segment_ids, implementation=implementation, return_residual=True)
            return o, state, u

        primals = [x if x is not None else jnp.zeros(()) for x in (*args, h0)]
        got, want = run("associative_scan", *primals), run("reference", *primals)
        for name, a, b in zip(("o", "final_state", "u"), got, want):
            _assert_close(a, b, tolerances.FWD[jnp.dtype(_F32)][0], name)

        def loss(implementation, *xs):
            o, state, _ = run(implementation, *xs)
            return jnp.sum(o * cot) + jnp.sum(state)

        argnums = tuple(i + 1 for i in range(6) if gated or i != 3)
        g_assoc = jax.grad(loss, argnums)("associative_scan", *primals)
        g_ref = jax.grad(loss, argnums)("reference", *primals)
        for i, a, b in zip(argnums, g_assoc, g_ref):
            _assert_close(a, b, tolerances.GRAD[jnp.dtype(_F32)][0], f"d{_ARG_NAMES[i - 1]}")

    @parameterized.named_parameters(
        dict(testcase_name="gdn_T=65_C=16", gated=True, seq_len=65, segments=False, heads=2),
        dict(testcase_name="deltanet_T=65_C=16", gated=False, seq_len=65, segments=False,
             heads=2),
        dict(testcase_name="gdn_segments_gva_T=40_C=16", gated=True, seq_len=40, segments=True,
             heads=4),
    )
    def test_gradients_match_reference(self, gated, seq_len, segments, heads):
        args, h0 = _make_inputs(1, seq_len=seq_len, gated=gated, heads=heads)
        segment_ids = None
        if segments:  # boundaries inside a chunk (5, 21) and on a chunk edge (16)
            segment_ids = jnp.array([[0] * 5 + [1] * 11 + [2] * 5 + [3] * 19, [0] * 40])
        names = [n for n in _ARG_NAMES if n != "g" or gated]
        primals = [x for x in (*args, h0) if x is not None]
        keys = jax.random.split(jax.random.key(2), 2)
        d_o = jax.random.normal(keys[0], args[2].shape, _F32)
        d_state = jax.random.normal(keys[1], h0.shape, _F32)

        def grads(implementation):
            def loss(*xs):
                if not gated:
                    xs = xs[:3] + (None,) + xs[3:]
                o, state = gdr.gated_delta_rule(
                    *xs[:5], initial_state=xs[5], output_final_state=True, chunk_size=16,
                    segment_ids=segment_ids, implementation=implementation)
                return jnp.sum(o * d_o) + jnp.sum(state * d_state)
            return jax.jit(jax.grad(loss, argnums=tuple(range(len(primals)))))(*primals)

        max_err = tolerances.GRAD[jnp.dtype(_F32)][0]
        for name, got, want in zip(names, grads("chunked"), grads("reference")):
            self.assertTrue(np.all(np.isfinite(got)), f"d{name} is not finite")
            _assert_close(got, want, max_err, f"d{name}")

    # -------------------------------------------------------------------------- segment_ids

    @parameterized.named_parameters(
        dict(testcase_name=f"{impl}_{'gdn' if gated else 'deltanet'}",
             implementation=impl, gated=gated)
        for impl, gated in itertools.product(("chunked", "reference"), (True, False))
    )
    def test_segments_equal_separate_documents(self, implementation, gated):
        # Row 0: starts at 5 and 37/40 (inside chunks of 16) and 16 (a chunk edge). Row 1 reuses
        # ids (3, 7, 3) and has a one-token document.
        lengths = ((5, 11, 21, 3, 24), (16, 1, 30, 17))
        ids = ((0, 1, 2, 3, 4), (3, 7, 3, 9))
        segment_ids = jnp.array([np.repeat(i, n) for i, n in zip(ids, lengths)])
        args, h0 = _make_inputs(3, seq_len=64, gated=gated)
        o, state, u = gdr.gated_delta_rule(
            *args, initial_state=h0, output_final_state=True, segment_ids=segment_ids,
            chunk_size=16, implementation=implementation, return_residual=True)

        max_err = tolerances.FWD[jnp.dtype(_F32)][0]
        for row, row_lengths in enumerate(lengths):
            start = 0
            for doc, length in enumerate(row_lengths):
                piece = [None if x is None else x[row:row + 1, start:start + length] for x in args]
                # Each document alone, through the float64 loop (no segment logic involved).
                o_doc, state_doc, u_doc = _numpy_oracle(
                    *piece, initial_state=h0[row:row + 1] if doc == 0 else None)
                where = f"row {row} document {doc}"
                _assert_close(o[row:row + 1, start:start + length], o_doc, max_err, f"o, {where}")
                _assert_close(u[row:row + 1, start:start + length], u_doc, max_err, f"u, {where}")
                start += length
            _assert_close(state[row:row + 1], state_doc, max_err, f"final_state, row {row}")

    # ---------------------------------------------------------------------------------- GVA

    def test_gva_equals_repeated_heads(self):
        (q, k, v, g, beta), h0 = _make_inputs(4, seq_len=40, key_heads=2, heads=4)

        def loss_and_out(q, k):
            o, state = gdr.gated_delta_rule(q, k, v, g, beta, initial_state=h0,
                                            output_final_state=True, chunk_size=16)
            return jnp.sum(o * v) + jnp.sum(state), (o, state)

        grad_fn = jax.jit(jax.grad(loss_and_out, argnums=(0, 1), has_aux=True))
        (dq, dk), (o, state) = grad_fn(q, k)
        (dq_rep, dk_rep), (o_rep, state_rep) = grad_fn(jnp.repeat(q, 2, axis=2),
                                                       jnp.repeat(k, 2, axis=2))
        np.testing.assert_allclose(o, o_rep, **tolerances.fwd_tol(_F32))
        np.testing.assert_allclose(state, state_rep, **tolerances.fwd_tol(_F32))
        # Value heads (0, 1) read key head 0 and (2, 3) key head 1, so key-head gradients sum.

        def fold(x):  # [B, T, 4, K] -> [B, T, 2, K]
            return x.reshape(x.shape[:2] + (2, 2) + x.shape[3:]).sum(axis=3)

        np.testing.assert_allclose(dq, fold(dq_rep), **tolerances.grad_tol(_F32))
        np.testing.assert_allclose(dk, fold(dk_rep), **tolerances.grad_tol(_F32))

    # ---------------------------------------------------------------------------------- bf16

    def test_bf16_inputs_match_fp32_reference(self):
        args, h0 = _make_inputs(5, seq_len=130)
        args_bf16 = [x.astype(jnp.bfloat16) for x in args]
        o, state, u = gdr.gated_delta_rule(*args_bf16, initial_state=h0,
                                           output_final_state=True, return_residual=True)
        self.assertEqual(o.dtype, jnp.bfloat16)
        self.assertEqual(u.dtype, jnp.bfloat16)
        self.assertEqual(state.dtype, jnp.float32)
        o_ref, state_ref, u_ref = gdr.gated_delta_rule(
            *args, initial_state=h0, output_final_state=True, implementation="reference",
            return_residual=True)
        max_err = tolerances.FWD[jnp.dtype(jnp.bfloat16)][0]
        _assert_close(o, o_ref, max_err, "o")
        _assert_close(state, state_ref, max_err, "final_state")
        _assert_close(u, u_ref, max_err, "u")

        def loss(*xs):
            return jnp.sum(gdr.gated_delta_rule(*xs, initial_state=h0)[0].astype(_F32))

        grads = jax.jit(jax.grad(loss, argnums=tuple(range(5))))(*args_bf16)
        for name, grad in zip(_ARG_NAMES, grads):
            self.assertEqual(grad.dtype, jnp.bfloat16, f"d{name}")
            self.assertTrue(np.all(np.isfinite(np.asarray(grad, _F32))), f"d{name}")

    # -------------------------------------------------------------------------- strong decay

    @parameterized.named_parameters(
        dict(testcase_name="beta_near_0", beta_logit=-12.0),
        dict(testcase_name="beta_near_1", beta_logit=12.0),
        dict(testcase_name="beta_mixed", beta_logit=None),
    )
    def test_strong_decay_is_finite(self, beta_logit):
        seq_len = 70
        if beta_logit is None:  # alternate tokens near 0 and near 1
            beta = jax.nn.sigmoid(jnp.where(jnp.arange(seq_len) % 2 == 0, -12.0, 12.0))
            beta = jnp.broadcast_to(beta[None, :, None], (2, seq_len, 2))
        else:
            beta = jax.nn.sigmoid(jnp.float32(beta_logit))
        (q, k, v, g, beta), h0 = _make_inputs(6, seq_len=seq_len, decay=-20.0, beta=beta)

        grads, (o, state) = _sum_loss_grads(q, k, v, g, beta, h0, implementation="chunked")
        grads_ref, (o_ref, state_ref) = _sum_loss_grads(q, k, v, g, beta, h0,
                                                        implementation="reference")
        for name, x in [("o", o), ("final_state", state)] + list(zip(_ARG_NAMES, grads)):
            self.assertTrue(np.all(np.isfinite(x)), f"{name} is not finite")
        max_err = tolerances.FWD[jnp.dtype(_F32)][0]
        _assert_close(o, o_ref, max_err, "o")
        _assert_close(state, state_ref, max_err, "final_state")
        # dg is tiny here (exp(-20) per step); the segment-sum decays keep it accurate.
        max_err = tolerances.GRAD[jnp.dtype(_F32)][0]
        for name, got, want in zip(_ARG_NAMES, grads, grads_ref):
            _assert_close(got, want, max_err, f"d{name}")

    # ------------------------------------------------------------------------------ residual

    def test_residual_matches_definition(self):
        args, h0 = _make_inputs(7, seq_len=37)
        o, state, u = gdr.gated_delta_rule(*args, initial_state=h0, output_final_state=True,
                                           chunk_size=16, return_residual=True)
        _, _, u_np = _numpy_oracle(*args, initial_state=h0)
        _, _, u_ref = gdr.gated_delta_rule(*args, initial_state=h0, return_residual=True,
                                           implementation="reference")
        max_err = tolerances.FWD[jnp.dtype(_F32)][0]
        _assert_close(u, u_np, max_err, "u vs float64 loop")
        _assert_close(u, u_ref, max_err, "u vs reference")
        self.assertLen(gdr.gated_delta_rule(*args, chunk_size=16), 2)
        self.assertIsNone(gdr.gated_delta_rule(*args, chunk_size=16)[1])

    def test_residual_is_v_for_first_token_with_beta_one(self):
        # With S_0 = 0 and beta = 1, u_1 = v_1 (the CLER unit test in spec §4.1).
        (q, k, v, g, _), _ = _make_inputs(8, seq_len=1)
        _, _, u = gdr.gated_delta_rule(q, k, v, g, jnp.ones(g.shape), return_residual=True)
        np.testing.assert_allclose(u, v, **tolerances.fwd_tol(_F32))

    # ----------------------------------------------------------------------- decode and misc

    def test_decode_steps_match_full_forward(self):
        args, h0 = _make_inputs(9, seq_len=8)
        o_full, state_full = gdr.gated_delta_rule(*args, initial_state=h0,
                                                  output_final_state=True)
        state, outs = h0, []
        for t in range(8):
            o_t, state = gdr.gated_delta_rule(*(x[:, t:t + 1] for x in args),
                                              initial_state=state, output_final_state=True)
            outs.append(o_t)
        max_err = tolerances.FWD[jnp.dtype(_F32)][0]
        _assert_close(jnp.concatenate(outs, axis=1), o_full, max_err, "o")
        _assert_close(state, state_full, max_err, "final_state")

    def test_delta_rule_is_gated_delta_rule_without_decay(self):
        (q, k, v, _, beta), h0 = _make_inputs(10, seq_len=20, gated=False)
        o_dn, s_dn = gdr.delta_rule(q, k, v, beta, initial_state=h0, output_final_state=True,
                                    scale=0.3)
        o_gdn, s_gdn = gdr.gated_delta_rule(q, k, v, jnp.zeros(beta.shape), beta,
                                            initial_state=h0, output_final_state=True,
                                            scale=0.3)
        np.testing.assert_allclose(o_dn, o_gdn, **tolerances.fwd_tol(_F32))
        np.testing.assert_allclose(s_dn, s_gdn, **tolerances.fwd_tol(_F32))

    # -------------------------------------------------------------------------------- errors

    @parameterized.named_parameters(
        dict(testcase_name="q_wrong_rank", change=dict(q=(2, 8, 16)),
             match=r"^q must be \[B, T, HK, K\] \(rank 4\), got shape \(2, 8, 16\)$"),
        dict(testcase_name="k_mismatched_heads", change=dict(k=(2, 8, 1, 16)),
             match=r"k\.shape"),
        # A q/k mismatch names q when q is the odd one out (k agrees with the other arguments),
        # and both alike when nothing else carries the size (the first differing axis).
        dict(testcase_name="q_short_head_dim", change=dict(q=(2, 8, 2, 8)),
             match=r"^q\.shape=\(2, 8, 2, 8\) and k\.shape=\(2, 8, 2, 16\) differ: .*"
                   r"axis 3 \(K\): q has 8, k has 16"),
        dict(testcase_name="q_short_head_dim_with_state",
             change=dict(q=(2, 8, 2, 8), initial_state=(2, 2, 16, 32)),
             match=r"^q\.shape=\(2, 8, 2, 8\) does not match k\.shape=\(2, 8, 2, 16\): q must "
                   r"be \[B, T, HK, K\] like k \(axis 3 \(K\): q has 8, k has 16, "
                   r"initial_state has 16\)"),
        dict(testcase_name="k_short_time", change=dict(k=(2, 7, 2, 16)),
             match=r"^k\.shape=\(2, 7, 2, 16\) does not match q\.shape=\(2, 8, 2, 16\)"),
        dict(testcase_name="heads_not_multiple", change=dict(v=(2, 8, 3, 32), g=(2, 8, 3),
                                                             beta=(2, 8, 3)),
             match="multiple of the key heads"),
        dict(testcase_name="g_mismatched_heads", change=dict(g=(2, 8, 4)), match=r"g\.shape"),
        dict(testcase_name="state_wrong_shape", change=dict(initial_state=(2, 2, 32, 16)),
             match=r"initial_state\.shape"),
        dict(testcase_name="segment_ids_float", change=dict(segment_ids=(2, 8)),
             match="integer dtype"),
        dict(testcase_name="chunk_size_48", change=dict(chunk_size=48), match="power of two"),
        dict(testcase_name="unknown_implementation", change=dict(implementation="pallas"),
             match="implementation='pallas'"),
        dict(testcase_name="implementation_typo", change=dict(implementation="mosaic"),
             match=r"^gated_delta_rule: implementation='mosaic' is not available for this op; "
                   r"choose one of \('auto', 'chunked', "),
        dict(testcase_name="scale_not_a_number", change=dict(scale="x"),
             match=r"^scale must be None or a positive finite number, got scale='x' \(str\)$"),
        dict(testcase_name="scale_negative", change=dict(scale=-1.0),
             match=r"^scale must be None or a positive finite number, got scale=-1\.0 "),
    )
    def test_bad_inputs_raise(self, change, match):
        shapes = dict(q=(2, 8, 2, 16), k=(2, 8, 2, 16), v=(2, 8, 2, 32), g=(2, 8, 2),
                      beta=(2, 8, 2))
        kwargs = {}
        for name, value in change.items():
            if name in shapes or name in ("initial_state", "segment_ids"):
                shapes[name] = value
            else:
                kwargs[name] = value
        arrays = {name: 0.5 * jnp.ones(shape, _F32) for name, shape in shapes.items()}
        with self.assertRaisesRegex(ValueError, match):
            gdr.gated_delta_rule(arrays.pop("q"), arrays.pop("k"), arrays.pop("v"),
                                 arrays.pop("g"), arrays.pop("beta"), **arrays, **kwargs)


if __name__ == "__main__":
    absltest.main()
