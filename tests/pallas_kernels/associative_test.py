"""Tests for the generic affine associative scan in ``pallas_kernels.common.associative``.

``affine_associative_scan`` must give every state of ``S_t = A_t S_{t-1} + B_t`` exactly as a
serial loop does (values and gradients), honour ``initial_state`` and document resets, compute
in fp32 whatever the input dtype, and reject mismatched shapes.

Run from the repository root:
``python -m pytest -q tests/pallas_kernels/associative_test.py``, or as a script:
``python -m tests.pallas_kernels.associative_test``.
"""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.common import associative
from tests import tolerances

F32 = jnp.float32
FWD_REL = tolerances.fwd_tol(F32)["rtol"]
GRAD_REL = tolerances.grad_tol(F32)["rtol"]


def make_inputs(seed, *, batch=2, seq_len=33, heads=2, dk=8, dv=12):
    """Random affine steps with spectral radius around 1 (neither exploding nor vanishing)."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((batch, seq_len, heads, dk, dk)) / np.sqrt(dk)
    a = 0.5 * a + 0.5 * np.eye(dk)
    return dict(
        A=jnp.asarray(a, F32),
        Bm=jnp.asarray(rng.standard_normal((batch, seq_len, heads, dk, dv)), F32),
        initial_state=jnp.asarray(rng.standard_normal((batch, heads, dk, dv)), F32),
    )


def serial_states(A, Bm, initial_state, reset):  # noqa: N803
    """The recurrence one step at a time (``lax.scan``, fp32, HIGHEST): the ground truth."""
    batch, seq_len, heads, dk, dv = Bm.shape
    if initial_state is None:
        initial_state = jnp.zeros((batch, heads, dk, dv), F32)
    if reset is None:
        reset = jnp.zeros((batch, seq_len), bool)

    def step(state, xs):
        a_t, b_t, reset_t = xs
        state = jnp.where(reset_t[:, None, None, None], 0.0, state)
        state = jnp.einsum("bhij,bhjv->bhiv", a_t, state, precision="highest") + b_t
        return state, state

    xs = (jnp.moveaxis(A, 1, 0), jnp.moveaxis(Bm, 1, 0), jnp.moveaxis(reset, 1, 0))
    _, states = jax.lax.scan(step, initial_state, xs)
    return jnp.moveaxis(states, 0, 1)


RESET = np.zeros((2, 33), bool)
RESET[0, [5, 16, 17, 32]] = True  # includes two consecutive resets and one on the last step
RESET[1, [1]] = True


class AffineAssociativeScanTest(parameterized.TestCase):

    @parameterized.named_parameters(
        dict(testcase_name=f"T={t}_initial_state={h0}_reset={r}", seq_len=t, use_h0=h0, use_reset=r)
        for t, h0, r in [(1, True, False), (1, False, False), (33, True, False),
                         (33, False, False), (33, True, True), (33, False, True)]
    )
    def test_matches_serial_loop(self, seq_len, use_h0, use_reset):
        x = make_inputs(seq_len, seq_len=seq_len)
        h0 = x["initial_state"] if use_h0 else None
        reset = jnp.asarray(RESET[:, :seq_len]) if use_reset else None
        got = jax.jit(associative.affine_associative_scan)(x["A"], x["Bm"], h0, reset)
        want = jax.jit(serial_states)(x["A"], x["Bm"], h0, reset)
        self.assertEqual(got.shape, x["Bm"].shape)
        self.assertEqual(got.dtype, F32)
        tolerances.assert_rel_err(got, want, FWD_REL, "states")
        np.testing.assert_allclose(got, want, **tolerances.fwd_tol(F32))

    def test_reset_forgets_the_past(self):
        x = make_inputs(1)
        reset = jnp.asarray(RESET)
        scan = jax.jit(associative.affine_associative_scan)
        states = scan(x["A"], x["Bm"], x["initial_state"], reset)
        # At a reset S_t = B_t; right after it, S_{t+1} = A_{t+1} B_t + B_{t+1}.
        np.testing.assert_allclose(states[0, 5], x["Bm"][0, 5], **tolerances.fwd_tol(F32))
        np.testing.assert_allclose(states[0, 17], x["Bm"][0, 17], **tolerances.fwd_tol(F32))
        want_6 = jnp.einsum("hij,hjv->hiv", x["A"][0, 6], x["Bm"][0, 5], precision="highest")
        np.testing.assert_allclose(
            states[0, 6], want_6 + x["Bm"][0, 6], **tolerances.fwd_tol(F32)
        )
        # Changing the initial state or any step before a row's first reset (t = 5 in row 0,
        # t = 1 in row 1) changes nothing from that reset on.
        before = (jnp.arange(33)[None, :] < jnp.array([[5], [1]]))[..., None, None, None]
        other = scan(
            jnp.where(before, -2.0 * x["A"], x["A"]), jnp.where(before, x["Bm"] + 1.0, x["Bm"]),
            -x["initial_state"], reset,
        )
        np.testing.assert_allclose(other[0, 5:], states[0, 5:], **tolerances.fwd_tol(F32))
        np.testing.assert_allclose(other[1, 1:], states[1, 1:], **tolerances.fwd_tol(F32))

    def test_gradients_match_serial_loop(self):
        x = make_inputs(2)
        reset = jnp.asarray(RESET)
        cot = jnp.asarray(np.random.default_rng(3).standard_normal(x["Bm"].shape), F32)

        def loss(fn, x):
            return jnp.vdot(cot, fn(x["A"], x["Bm"], x["initial_state"], reset))

        got = jax.jit(jax.grad(lambda x: loss(associative.affine_associative_scan, x)))(x)
        want = jax.jit(jax.grad(lambda x: loss(serial_states, x)))(x)
        for name in want:
            self.assertTrue(np.all(np.isfinite(got[name])), name)
            tolerances.assert_rel_err(got[name], want[name], GRAD_REL, f"d{name}")

    def test_low_precision_inputs_compute_in_fp32(self):
        x = make_inputs(4, seq_len=16)
        low = {n: v.astype(jnp.bfloat16) for n, v in x.items()}
        args = [low[n] for n in ("A", "Bm", "initial_state")]
        got = jax.jit(associative.affine_associative_scan)(*args)
        want = jax.jit(serial_states)(*(a.astype(F32) for a in args), None)
        self.assertEqual(got.dtype, F32)
        # The inputs are identical in fp32, so only fp32 rounding separates the two.
        tolerances.assert_rel_err(got, want, FWD_REL, "bf16-input states")

    def test_document_starts(self):
        segment_ids = jnp.array([[3, 3, 1, 1, 3, 3], [0, 0, 0, 0, 0, 0]])
        want = np.array([[0, 0, 1, 0, 1, 0], [0, 0, 0, 0, 0, 0]], bool)
        np.testing.assert_array_equal(associative.document_starts(segment_ids), want)

    def test_bad_shapes_raise(self):
        x = make_inputs(5, seq_len=4)
        a, bm, h0 = x["A"], x["Bm"], x["initial_state"]
        bad_cases = [
            ((a, bm[0], None, None), r"^Bm must be \[B, T, H, K, V\] \(rank 5\), got shape "),
            ((a[..., :4], bm, None, None), r"A\.shape="),
            ((a[:, :3], bm, None, None), r"A\.shape="),
            ((a, bm, h0[:, :1], None), r"initial_state\.shape="),
            ((a, bm, None, jnp.zeros((2, 5), bool)), r"reset\.shape="),
            ((a[:, :0], bm[:, :0], None, None), r"at least one token"),
        ]
        for args, pattern in bad_cases:
            with self.subTest(pattern=pattern):
                with self.assertRaisesRegex(ValueError, pattern):
                    associative.affine_associative_scan(*args)


if __name__ == "__main__":
    absltest.main()
