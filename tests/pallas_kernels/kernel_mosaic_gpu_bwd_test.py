"""The Mosaic GPU (``plgpu``) reverse state pass of the scalar-decay family, tested on CPU.

``chunk_dstates_mosaic`` (``pallas_kernels/simple_gla/kernel_mosaic_gpu.py``, groundwork for
issue 29, not dispatched) returns the gradient of the loss w.r.t. the state entering every
chunk of 64 tokens and w.r.t. ``initial_state``. ``InterpretTest`` runs it in jax's Mosaic GPU
interpret mode (``InterpretGPUParams`` with race detection) against an independent reference:
``jax.vjp`` of the fp32 token-serial forward
(:func:`pallas_kernels.simple_gla.reference.simple_gla_reference`) for the loss
``L = sum(o * do) + sum(final_state * dht)``. For chunk ``n`` the reference restarts the
forward at token ``64 n`` from a free state ``S`` (see :func:`_reference_dstates`) and
differentiates w.r.t. ``S``; ``dh0`` is the vjp of the whole forward w.r.t. ``initial_state``.
Inputs are bf16, rounded once before the reference; the kernel adds one rounding (the decayed
``do`` enters ``wgmma`` in bf16), so the gate is the relative RMS error (< 5e-3, the GPU
kernels' state gate in BUILD.md) plus ``assert_allclose`` at the bf16 forward tolerance.
``LoweringTest`` lowers the kernel for CUDA on the CPU host (the layout branch that interpret
mode replaces). ``GpuTest`` (marked ``gpu``; skipped without a Hopper-or-newer GPU) compiles the
real kernel and checks it against the same reference on longer rows.

A failing interpreted kernel may hang instead of raising; run a single test (under ``timeout``)
to see its traceback.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest, parameterized

from pallas_kernels.simple_gla import kernel_mosaic_gpu as kmg
from pallas_kernels.simple_gla import reference
from tests import tolerances
from tests.pallas_kernels import kernel_mosaic_gpu_test as kmg_test


def _inputs(batch, seq_len, heads, kv_heads, dk, dv, *, decay, dht, docs, seed=0):
    """bf16 ``q, do``, fp32 ``g``, ``dht`` (or ``None``) and ``segment_ids``."""
    q, _, _, g, _, seg = kmg_test.inputs(batch, seq_len, heads, kv_heads, dk, dv, decay=decay,
                                         h0=False, docs=docs, seed=seed)
    keys = jax.random.split(jax.random.key(seed + 1), 2)
    do = jax.random.normal(keys[0], (batch, seq_len, heads, dv)).astype(jnp.bfloat16)
    final_grad = jax.random.normal(keys[1], (batch, heads, dk, dv)) if dht else None
    return q, do, g, final_grad, seg


def _loss_fn(q, do, g, dht, seg, scale):
    """``S -> sum(o * do) + sum(final * dht)`` of the fp32 reference started from state ``S``."""
    def loss(state):
        kf = jnp.zeros_like(q)  # dL/dS does not depend on k, v (the forward is affine in S)
        vf = jnp.zeros_like(do)
        o, final = reference.simple_gla_reference(q, kf, vf, g, scale=scale,
                                                  initial_state=state, segment_ids=seg)
        out = jnp.sum(o * do)
        return out if dht is None else out + jnp.sum(final * dht)
    return loss


def _reference_dstates(q, do, g, dht, seg, scale):
    """``dh [B, H, N, K, V]`` and ``dh0 [B, H, K, V]`` by ``jax.vjp`` of the fp32 reference.

    ``dh[:, :, n]`` is the gradient w.r.t. the state the forward stores for chunk ``n``: the
    state after token ``64 n - 1``, which reaches the later tokens through the decay and only
    until the next document start. The reference runs tokens ``[64 n - 1, T)`` from a free
    state ``S``, with token ``64 n - 1`` replaced by a dummy (``q = k = v = 0``, ``g = 0``, its
    own segment id) so that the state after it is ``S`` and a document starting at ``64 n``
    resets it, as in the full forward. ``dL/dS`` at ``S = 0`` is exact: ``L`` is affine in
    ``S``.
    """
    batch, seq_len, heads, dv = do.shape
    dk = q.shape[-1]
    qf = jnp.repeat(q.astype(jnp.float32), heads // q.shape[2], axis=2)  # GVA by repetition
    dof = do.astype(jnp.float32)
    gf = jnp.zeros((batch, seq_len, heads), jnp.float32) if g is None else g
    sf = jnp.zeros((batch, seq_len), jnp.int32) if seg is None else seg
    zero_state = jnp.zeros((batch, heads, dk, dv), jnp.float32)
    dh = []
    for n in range(-(-seq_len // kmg.CHUNK)):
        t = n * kmg.CHUNK
        prev = max(t - 1, 0)  # the dummy shares the segment id of token 64 n - 1 (or token 0)

        def with_dummy(x, fill):
            return jnp.concatenate([jnp.full_like(x[:, :1], fill), x[:, t:]], axis=1)

        loss = _loss_fn(with_dummy(qf, 0.0), with_dummy(dof, 0.0), with_dummy(gf, 0.0), dht,
                        jnp.concatenate([sf[:, prev:prev + 1], sf[:, t:]], axis=1), scale)
        dh.append(jax.grad(loss)(zero_state))
    _, vjp = jax.vjp(_loss_fn(qf, dof, g, dht, seg, scale), zero_state)
    (dh0,) = vjp(jnp.ones((), jnp.float32))
    return jnp.stack(dh, axis=2), dh0


# Slow (out of CI): interpreted Mosaic GPU kernels can hang instead of failing (a warpgroup
# thread blocks in the interpreter's barrier callback; MOSAIC_GPU.md, "Interpreter hang seen").
# On 2026-12-02 the CPU subset of these files hung twice in five runs on the 2-core host, which
# would stall CI. Run them one at a time under `timeout`: pytest -m slow <file> -k <case>.
@pytest.mark.slow
class InterpretTest(parameterized.TestCase):

    @parameterized.named_parameters(
        # B, T, H, Hk, K, V, decay, dht, document lengths (the rest is one more document),
        # leaving (store the gradient of the state leaving each chunk), dtype of the stored dh
        ("plain_T128_K64_V64", 1, 128, 1, 1, 64, 64, None, False, None, False, jnp.float32),
        # starts at 64 (a chunk boundary), 65 (just after it), 100 (inside chunk 1) and 129
        ("gva_dht_packed_T150_K64_V128", 1, 150, 2, 1, 64, 128, 0.02, True, (64, 1, 35, 29),
         False, jnp.float32),
        ("strong_decay_dht_T65_K128_V64", 2, 65, 1, 1, 128, 64, 5.0, True, None, False,
         jnp.float32),
        # starts at 10 and 70: only the first 10 (64..69) tokens of chunk 0 (1) see its state
        ("packed_decay_dht_T192_K64_V64", 1, 192, 1, 1, 64, 64, 0.2, True, (10, 60), False,
         jnp.float32),
        # what simple_gla_bwd_mosaic uses: dS' per chunk (shifted by one, dht last), in bf16
        ("leaving_bf16_gva_dht_packed_T150_K64_V128", 1, 150, 2, 1, 64, 128, 0.02, True,
         (64, 1, 35, 29), True, jnp.bfloat16),
        ("leaving_packed_decay_T192_K64_V64", 1, 192, 1, 1, 64, 64, 0.2, False, (10, 60), True,
         jnp.float32),
    )
    def test_dstates_match_reference(self, batch, seq_len, heads, kv_heads, dk, dv, decay, dht,
                                     docs, leaving, states_dtype):
        q, do, g, final_grad, seg = _inputs(batch, seq_len, heads, kv_heads, dk, dv,
                                            decay=decay, dht=dht, docs=docs)
        scale = dk ** -0.5
        dh, dh0 = kmg.chunk_dstates_mosaic(q, do, g, scale=scale, final_state_grad=final_grad,
                                           segment_ids=seg, states_dtype=states_dtype,
                                           leaving=leaving, interpret=True)
        want_dh, want_dh0 = _reference_dstates(q, do, g, final_grad, seg, scale)
        if leaving:  # chunk n holds dS_{n+1}; the last holds dht (zeros without one)
            last = (jnp.zeros_like(want_dh0) if final_grad is None else final_grad)[:, :, None]
            want_dh = jnp.concatenate([want_dh[:, :, 1:], last], axis=2)
        self.assertEqual((dh.shape, dh0.shape), (want_dh.shape, want_dh0.shape))
        self.assertEqual((dh.dtype, dh0.dtype), (jnp.dtype(states_dtype), jnp.float32))
        for name, got, want in (("dh", dh, want_dh), ("dh0", dh0, want_dh0)):
            err = tolerances.rel_err(got, want)
            self.assertLess(err, 5e-3, msg=f"{name}: relative RMS error {err:.2e}")
            np.testing.assert_allclose(got.astype(jnp.float32), want,
                                       **tolerances.fwd_tol(jnp.bfloat16))


@pytest.mark.gpu
class GpuTest(kmg_test.HopperTestCase):
    """The compiled kernel (wgmma, TMA) on bf16 inputs against the fp32 reference."""

    @parameterized.named_parameters(
        # B, T, H, Hk, K, V, decay, dht, document lengths (the rest is one more document)
        ("gva_dht_packed_T768_K128_V128", 2, 768, 4, 2, 128, 128, 0.05, True,
         (64, 1, 200, 300)),
        ("strong_decay_partial_T1000_K64_V128", 1, 1000, 2, 1, 64, 128, 5.0, True, None),
        ("packed_T640_K128_V64", 1, 640, 3, 3, 128, 64, 0.2, False, (10, 54, 500)),
    )
    def test_dstates_match_reference(self, batch, seq_len, heads, kv_heads, dk, dv, decay, dht,
                                     docs):
        q, do, g, final_grad, seg = _inputs(batch, seq_len, heads, kv_heads, dk, dv,
                                            decay=decay, dht=dht, docs=docs, seed=5)
        scale = dk ** -0.5
        dh, dh0 = kmg.chunk_dstates_mosaic(q, do, g, scale=scale, final_state_grad=final_grad,
                                           segment_ids=seg)
        want_dh, want_dh0 = _reference_dstates(q, do, g, final_grad, seg, scale)
        for name, got, want in (("dh", dh, want_dh), ("dh0", dh0, want_dh0)):
            err = tolerances.rel_err(got, want)
            self.assertLess(err, 5e-3, msg=f"{name}: relative RMS error {err:.2e}")


# Slow (out of CI): each interpreted two-warpgroup launch can hang the Mosaic GPU interpreter
# (MOSAIC_GPU.md, "Interpreter hang seen"), and each case here makes several; a 2026-12-02 run
# of the CPU subset hung in one such test after 70 had passed. (The mark goes on the class:
# absl's parameterized copies of a method do not keep a method-level mark.)
@pytest.mark.slow
class PiecesTest(parameterized.TestCase):
    """The reverse pass's sequence split against one pass and the reference."""

    @parameterized.named_parameters(
        ("two_pieces_dht", 2, None, True, False),
        ("four_pieces_packed_leaving", 4, (70, 30, 90), True, True),
    )
    def test_pieces_match_one_pass_and_reference(self, pieces, docs, dht, leaving):
        q, do, g, final_grad, seg = _inputs(1, 256, 2, 1, 64, 64, decay=0.05, dht=dht,
                                            docs=docs, seed=4)
        kw = dict(scale=0.125, final_state_grad=final_grad, segment_ids=seg, leaving=leaving,
                  interpret=True)
        one_dh, one_dh0 = kmg.chunk_dstates_mosaic(q, do, g, pieces=1, **kw)
        dh, dh0 = kmg.chunk_dstates_mosaic(q, do, g, pieces=pieces, **kw)
        want_dh, want_dh0 = _reference_dstates(q, do, g, final_grad, seg, 0.125)
        if leaving:
            last = (jnp.zeros_like(want_dh0) if final_grad is None else final_grad)[:, :, None]
            want_dh = jnp.concatenate([want_dh[:, :, 1:], last], axis=2)
        for got, one, want in ((dh, one_dh, want_dh), (dh0, one_dh0, want_dh0)):
            self.assertEqual(got.shape, want.shape)
            np.testing.assert_allclose(got, one, rtol=1e-5, atol=1e-5)  # fp32 reassociation
            self.assertLess(tolerances.rel_err(got, want), 5e-3)


class LoweringTest(parameterized.TestCase):

    @parameterized.product(dk=(64, 128), dv=(64, 128))
    def test_pieces_lower_for_cuda(self, dk, dv):
        q, do, g, final_grad, seg = _inputs(1, 256, 2, 1, dk, dv, decay=0.2, dht=True,
                                            docs=(70, 30))

        def fn(q, do, g, final_grad, seg):
            return kmg.chunk_dstates_mosaic(q, do, g, scale=0.125, final_state_grad=final_grad,
                                            segment_ids=seg, states_dtype=jnp.bfloat16,
                                            leaving=True, pieces=2)

        text = jax.jit(fn).trace(q, do, g, final_grad, seg).lower(
            lowering_platforms=("cuda",)).as_text()
        self.assertEqual(text.count("simple_gla_chunk_dstates_mosaic_gpu"), 2)

    @parameterized.product(dk=(64, 128), dv=(64, 128), leaving=(False, True))
    def test_dstates_lower_for_cuda(self, dk, dv, leaving):
        q, do, g, final_grad, seg = _inputs(1, 200, 2, 1, dk, dv, decay=0.2, dht=True,
                                            docs=(70, 30))
        states_dtype = jnp.bfloat16 if leaving else jnp.float32  # the two combinations in use

        def fn(q, do, g, final_grad, seg):
            return kmg.chunk_dstates_mosaic(q, do, g, scale=dk ** -0.5,
                                            final_state_grad=final_grad, segment_ids=seg,
                                            states_dtype=states_dtype, leaving=leaving)

        lowered = jax.jit(fn).trace(q, do, g, final_grad, seg).lower(
            lowering_platforms=("cuda",))
        text = lowered.as_text()
        self.assertIn("mosaic_gpu", text)
        self.assertIn("simple_gla_chunk_dstates", text)


class ValidationTest(absltest.TestCase):

    def test_rejects_what_the_kernel_cannot_run(self):
        q, do, g, final_grad, _ = _inputs(1, 64, 2, 1, 64, 64, decay=0.1, dht=True, docs=None)
        with self.assertRaisesRegex(ValueError, "q and do must share a 16-bit dtype"):
            kmg.chunk_dstates_mosaic(q.astype(jnp.float32), do.astype(jnp.float32), g,
                                     scale=1.0)
        with self.assertRaisesRegex(ValueError, "head dims"):
            kmg.chunk_dstates_mosaic(q[..., :32], do, g, scale=1.0)
        with self.assertRaisesRegex(ValueError, "g must be"):
            kmg.chunk_dstates_mosaic(q, do, g[:, :32], scale=1.0)
        with self.assertRaisesRegex(ValueError, "H % Hk == 0"):
            kmg.chunk_dstates_mosaic(q.repeat(2, axis=2), do[:, :, :1].repeat(3, axis=2), g,
                                     scale=1.0)
        with self.assertRaisesRegex(ValueError, "final_state_grad must be"):
            kmg.chunk_dstates_mosaic(q, do, g, scale=1.0, final_state_grad=final_grad[:, :1])


if __name__ == "__main__":
    absltest.main()
