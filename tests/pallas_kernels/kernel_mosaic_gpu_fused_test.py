"""The fused Mosaic GPU (``plgpu``) forward of the scalar-decay family, tested on CPU.

``simple_gla_fused_fwd_mosaic`` (``pallas_kernels/simple_gla/kernel_mosaic_gpu.py``, issue 29)
runs the chunk-state pass and the chunk outputs in one kernel with three warpgroups (memory,
state, output); ``simple_gla_fwd_mosaic(forward="fused")`` and
``simple_gla_mosaic(forward="fused")`` select it. ``InterpretTest`` runs it in jax's Mosaic GPU
interpret mode (``InterpretGPUParams`` with race detection, so the ``s_ready``/``s_free``
handshake of the published state and the two-consumer TMA ring are checked for races) and
checks ``o`` and the final state against the fp32 token-serial reference
(:func:`pallas_kernels.simple_gla.reference.simple_gla_reference`) on bf16 inputs, rounded once
before the reference: relative RMS < 5e-3 (BUILD.md's gate for the GPU kernels) plus
``assert_allclose`` at the bf16 forward tolerance, as ``kernel_mosaic_gpu_fwd_test``. With
``store_h`` the chunk states must equal ``chunk_states_mosaic``'s bitwise (same fp32 arithmetic,
same rounding to the input dtype), also with a sequence split (``pieces``). ``LoweringTest``
lowers the kernel for CUDA on the CPU host (the layout branch interpret mode replaces), in CI.
``GpuTest`` (marked ``gpu``; skipped without a Hopper-or-newer GPU) compiles the kernel and
checks it against the reference and against the two-pass forward at longer rows.
``ResidualHFastTest`` (a few seconds) and ``ResidualHInterpretTest`` (slow) check
``simple_gla_mosaic(residual_h=True)``, the fused forward's ``h`` as the backward's residual
(MOSAIC_GPU.md Sec. 54): gradients bitwise the default path's, sequence pieces included.

A failing interpreted kernel may hang instead of raising; run a single test to see its traceback.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest, parameterized

from pallas_kernels.simple_gla import kernel_mosaic_gpu as kmg
from tests import tolerances
from tests.pallas_kernels import kernel_mosaic_gpu_fwd_test as fwd_test
from tests.pallas_kernels import kernel_mosaic_gpu_test as kmg_test


def _check_against_reference(test, o, final, want_o, want_final, *, allclose=True):
    test.assertEqual((o.shape, o.dtype), (want_o.shape, jnp.bfloat16))
    test.assertEqual((final.shape, final.dtype), (want_final.shape, jnp.float32))
    for name, got, want in (("o", o, want_o), ("final_state", final, want_final)):
        err = tolerances.rel_err(got, want)
        test.assertLess(err, 5e-3, msg=f"{name}: relative RMS error {err:.2e}")
        if allclose:
            np.testing.assert_allclose(np.asarray(got, np.float32), want,
                                       **tolerances.fwd_tol(jnp.bfloat16), err_msg=name)


# Slow (out of CI), as the other interpreted Mosaic GPU kernels: the interpreter can hang
# instead of failing (MOSAIC_GPU.md, "Interpreter hang seen"), and this kernel has three
# warpgroups. On the 2-core host `gva4_2_no_decay_packed_T192_K128_V128` hung 2 of 2 times at
# 0 % CPU (faulthandler: the three warpgroup threads inside their nested XLA executions, two
# XLA CPU threads blocked in the interpreter's `_barrier_wait` callback, so the pool had no
# thread left for the warpgroup that would arrive), and ran in 25 s with the XLA CPU client's
# thread pool enlarged: `PJRT_NPROC=8` (read by jaxlib's DefaultThreadPoolSize before the
# backend starts; it must be in the environment, not set by a test). With it the whole class
# passed in 44 s (2026-12-03):
#   PJRT_NPROC=8 timeout 600 python -m pytest -q -m slow <this file>
@pytest.mark.slow
class InterpretTest(parameterized.TestCase):

    @parameterized.named_parameters(
        # B, T, H, Hk, K, V, decay, h0, document lengths (the rest is one more document)
        ("no_decay_T128_K64_V64", 1, 128, 1, 1, 64, 64, None, False, None),
        # starts at 64 (a chunk boundary), 100 (inside chunk 1) and 130 (inside the partial
        # last chunk 2)
        ("gva_h0_packed_T150_K64_V128", 1, 150, 2, 1, 64, 128, 0.02, True, (64, 36, 30)),
        ("strong_decay_h0_T65_K128_V64", 2, 65, 1, 1, 128, 64, 5.0, True, None),
        # starts at 10 and 70: chunk 0's incoming state reaches its first 10 tokens only
        ("packed_decay_h0_T128_K64_V64", 1, 128, 1, 1, 64, 64, 0.2, True, (10, 60)),
        # GVA 4:2 at K = V = 128 (two value blocks), no decay, a start at 100
        ("gva4_2_no_decay_packed_T192_K128_V128", 1, 192, 4, 2, 128, 128, None, False, (100,)),
    )
    def test_forward_matches_reference(self, batch, seq_len, heads, kv_heads, dk, dv, decay, h0,
                                       docs):
        q, k, v, g, state, seg = kmg_test.inputs(batch, seq_len, heads, kv_heads, dk, dv,
                                                 decay=decay, h0=h0, docs=docs)
        scale = dk ** -0.5
        o, final = kmg.simple_gla_fused_fwd_mosaic(q, k, v, g, scale=scale, initial_state=state,
                                                   segment_ids=seg, interpret=True)
        want_o, want_final = fwd_test._reference(q, k, v, g, state, seg, scale)
        _check_against_reference(self, o, final, want_o, want_final)

    def test_three_stage_ring(self):
        """``stages=3`` with 5 chunks (the ring refills slots 0 and 1), packed, with ``h0``."""
        q, k, v, g, state, seg = kmg_test.inputs(1, 300, 1, 1, 64, 64, decay=0.1, h0=True,
                                                 docs=(130,))
        o, final = kmg.simple_gla_fused_fwd_mosaic(q, k, v, g, initial_state=state,
                                                   segment_ids=seg, stages=3, interpret=True)
        want_o, want_final = fwd_test._reference(q, k, v, g, state, seg, 64 ** -0.5)
        _check_against_reference(self, o, final, want_o, want_final)

    def test_sequence_pieces(self):
        """``pieces=2`` over 4 chunks (a GVA packed row with ``h0``; starts at 40 in piece 0 and
        at 150 in piece 1, and one exactly at the piece boundary 128): ``o`` and the final state
        against the reference, ``h`` bitwise the split state pass's."""
        q, k, v, g, state, seg = kmg_test.inputs(1, 256, 2, 1, 64, 64, decay=0.05, h0=True,
                                                 docs=(40, 88, 22))
        scale = 64 ** -0.5
        o, final, h = kmg.simple_gla_fused_fwd_mosaic(q, k, v, g, scale=scale,
                                                      initial_state=state, segment_ids=seg,
                                                      store_h=True, pieces=2, interpret=True)
        want_o, want_final = fwd_test._reference(q, k, v, g, state, seg, scale)
        _check_against_reference(self, o, final, want_o, want_final)
        want_h, _ = kmg.chunk_states_mosaic(k, v, g, initial_state=state, segment_ids=seg,
                                            states_dtype=v.dtype, pieces=2, interpret=True)
        np.testing.assert_array_equal(np.asarray(h, np.float32), np.asarray(want_h, np.float32))

    def test_store_h_equals_state_pass(self):
        """``store_h`` returns the states ``chunk_states_mosaic`` stores in bf16, bitwise, and
        the same ``o`` and final state as without it; through ``simple_gla_fwd_mosaic``'s
        ``forward="fused"`` the outputs are the same again."""
        q, k, v, g, state, seg = kmg_test.inputs(1, 150, 2, 1, 64, 64, decay=0.1, h0=True,
                                                 docs=(64, 1, 35))
        o, final, h = kmg.simple_gla_fused_fwd_mosaic(q, k, v, g, initial_state=state,
                                                      segment_ids=seg, store_h=True,
                                                      interpret=True)
        want_h, want_final = kmg.chunk_states_mosaic(k, v, g, initial_state=state,
                                                     segment_ids=seg, states_dtype=v.dtype,
                                                     interpret=True)
        self.assertEqual((h.shape, h.dtype), (want_h.shape, want_h.dtype))
        np.testing.assert_array_equal(np.asarray(h, np.float32), np.asarray(want_h, np.float32))
        np.testing.assert_allclose(final, want_final, rtol=1e-6, atol=1e-6)
        o2, final2 = kmg.simple_gla_fwd_mosaic(q, k, v, g, initial_state=state, segment_ids=seg,
                                               forward="fused", interpret=True)
        np.testing.assert_array_equal(np.asarray(o, np.float32), np.asarray(o2, np.float32))
        np.testing.assert_array_equal(final, final2)


def _residual_h_grads(q, k, v, g, state, seg, do, *, residual_h, forward="fused",
                      interpret=True):
    """``(dq, dk, dv, dg, dh0)`` of ``simple_gla_mosaic`` (a ``jax.vjp`` with output gradient
    ``do`` and a final-state gradient of ones) with the given ``residual_h``."""
    def fwd(q, k, v, g, h0):
        return kmg.simple_gla_mosaic(q, k, v, g, initial_state=h0, segment_ids=seg,
                                     forward=forward, residual_h=residual_h,
                                     interpret=interpret)
    (_, final), vjp = jax.vjp(fwd, q, k, v, g, state)
    return vjp((do, jnp.ones_like(final)))


def _check_residual_h_bitwise(test, batch, seq_len, heads, kv_heads, dk, dv, decay, h0, docs):
    """``residual_h=True`` against the default (states recomputed): the fused forward's ``h``
    is bitwise the state pass's, so every gradient is bitwise the same."""
    q, k, v, g, state, seg = kmg_test.inputs(batch, seq_len, heads, kv_heads, dk, dv,
                                             decay=decay, h0=h0, docs=docs)
    do = jnp.asarray(np.random.default_rng(1).standard_normal(v.shape), v.dtype)
    got = _residual_h_grads(q, k, v, g, state, seg, do, residual_h=True)
    want = _residual_h_grads(q, k, v, g, state, seg, do, residual_h=False)
    for name, x, w in zip(("dq", "dk", "dv", "dg", "dh0"), got, want):
        if w is None:
            test.assertIsNone(x, msg=name)
            continue
        test.assertEqual((x.shape, x.dtype), (w.shape, w.dtype), msg=name)
        np.testing.assert_array_equal(np.asarray(x, np.float32), np.asarray(w, np.float32),
                                      err_msg=name)


class ResidualHFastTest(absltest.TestCase):
    """``simple_gla_mosaic(residual_h=True)``: one small interpreted case (a few seconds; the
    others are ``ResidualHInterpretTest``, slow). Run with ``PJRT_NPROC=8``."""

    def test_grads_bitwise_default(self):
        # one row, one head, 2 chunks, the last partial; a start at 40, h0, decay
        _check_residual_h_bitwise(self, 1, 100, 1, 1, 64, 64, 0.1, True, (40,))


@pytest.mark.slow
class ResidualHInterpretTest(parameterized.TestCase):
    """``residual_h=True`` gradients (dq, dk, dv, dg, dh0) bitwise the default path's:
    documents, GVA, ``h0``, a partial last chunk, and rows with sequence pieces."""

    @parameterized.named_parameters(
        # B, T, H, Hk, K, V, decay, h0, document lengths (the rest is one more document)
        ("gva_h0_packed_partial_T150_K64_V128", 1, 150, 2, 1, 64, 128, 0.02, True, (64, 36, 30)),
        ("no_decay_T128_K128_V64", 2, 128, 1, 1, 128, 64, None, False, None),
        ("gva4_2_decay_packed_T130_K64_V64", 1, 130, 4, 2, 64, 64, 0.2, True, (10, 60)),
    )
    def test_grads_bitwise_default(self, batch, seq_len, heads, kv_heads, dk, dv, decay, h0,
                                   docs):
        _check_residual_h_bitwise(self, batch, seq_len, heads, kv_heads, dk, dv, decay, h0, docs)

    def test_grads_bitwise_default_with_sequence_pieces(self):
        # 1 CTA, 8 chunks: num_pieces picks 2 pieces for the fused forward (h transposed from
        # per-piece rows) and for the default path's recomputing state pass alike.
        self.assertEqual(kmg.mosaic_gpu_lib.num_pieces(None, 1, 8), 2)
        _check_residual_h_bitwise(self, 1, 500, 1, 1, 64, 64, 0.05, True, (100, 28, 200))


class LoweringTest(parameterized.TestCase):
    """CUDA lowering on the CPU host (CI): the WGMMA-layout branch of every helper, the three
    warpgroups' register budgets as requested, the SMEM tiles' swizzles and the 16-bit
    register operand ``P``."""

    @parameterized.named_parameters(
        # K, V, decay, h0, documents, store_h, stages
        ("k64_v64_packed_h0_store_h", 64, 64, 0.2, True, (70, 30), True, 2),
        ("k128_v128_no_decay_3_stages", 128, 128, None, False, None, False, 3),
        ("k64_v128_decay", 64, 128, 0.2, False, None, False, 2),
        ("k128_v64_packed_h0", 128, 64, 0.2, True, (70, 30), False, 2),
    )
    def test_fused_forward_lowers_for_cuda(self, dk, dv, decay, h0, docs, store_h, stages):
        q, k, v, g, state, seg = kmg_test.inputs(1, 200, 2, 1, dk, dv, decay=decay, h0=h0,
                                                 docs=docs)

        def fn(q, k, v, g, state, seg):
            return kmg.simple_gla_fused_fwd_mosaic(q, k, v, g, initial_state=state,
                                                   segment_ids=seg, store_h=store_h,
                                                   stages=stages)

        lowered = jax.jit(fn).trace(q, k, v, g, state, seg).lower(lowering_platforms=("cuda",))
        text = lowered.as_text()
        self.assertEqual(text.count("custom_call @mosaic_gpu"), 1)  # one kernel
        self.assertIn("simple_gla_fused_fwd", text)

    def test_sequence_pieces_lower_for_cuda(self):
        """``pieces=4``: the state pass without ``h``, then the fused kernel over the pieces."""
        q, k, v, g, state, seg = kmg_test.inputs(1, 1024, 2, 1, 128, 128, decay=0.2, h0=True,
                                                 docs=(300,))

        def fn(q, k, v, g, state, seg):
            return kmg.simple_gla_fused_fwd_mosaic(q, k, v, g, initial_state=state,
                                                   segment_ids=seg, pieces=4)

        text = jax.jit(fn).trace(q, k, v, g, state, seg).lower(
            lowering_platforms=("cuda",)).as_text()
        self.assertEqual(text.count("custom_call @mosaic_gpu"), 2)
        self.assertIn("simple_gla_chunk_states", text)
        self.assertIn("simple_gla_fused_fwd", text)

    def test_custom_vjp_with_fused_forward_lowers_for_cuda(self):
        """``jax.grad`` of ``simple_gla_mosaic(forward="fused")``: the fused forward plus the
        backward's three kernels (state pass recomputed, reverse pass, gradients)."""
        q, k, v, g, state, seg = kmg_test.inputs(1, 130, 2, 2, 64, 64, decay=0.2, h0=True,
                                                 docs=(70,))

        def loss(q, k, v, g, state):
            o, final = kmg.simple_gla_mosaic(q, k, v, g, initial_state=state, segment_ids=seg,
                                             forward="fused")
            return jnp.sum(o.astype(jnp.float32)) + jnp.sum(final)

        text = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4))).trace(
            q, k, v, g, state).lower(lowering_platforms=("cuda",)).as_text()
        self.assertEqual(text.count("custom_call @mosaic_gpu"), 4)
        self.assertIn("simple_gla_fused_fwd", text)
        self.assertNotIn("simple_gla_chunk_output", text)

    def test_auto_forward_under_grad_on_rows_with_pieces_lowers_to_two_pass(self):
        """The default ``forward="auto"`` (MOSAIC_GPU.md Sec. 50.1): rows split into sequence
        pieces (2 CTAs, 16 chunks: 4 pieces) run the two-pass forward under differentiation,
        whose state pass XLA shares with the backward's (3 Mosaic kernels, no fused one);
        the primal alone runs the fused kernel (with the pieces' state pass: 2)."""
        q, k, v, g, state, seg = kmg_test.inputs(1, 1024, 2, 2, 64, 64, decay=0.2, h0=True,
                                                 docs=(70, 600))

        def run(q, k, v, g, state):
            return kmg.simple_gla_mosaic(q, k, v, g, initial_state=state, segment_ids=seg)

        def loss(q, k, v, g, state):
            o, final = run(q, k, v, g, state)
            return jnp.sum(o.astype(jnp.float32)) + jnp.sum(final)

        text = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4))).trace(
            q, k, v, g, state).lower(lowering_platforms=("cuda",)).as_text()
        self.assertIn("simple_gla_chunk_output", text)
        self.assertNotIn("simple_gla_fused_fwd", text)
        text = jax.jit(run).trace(q, k, v, g, state).lower(
            lowering_platforms=("cuda",)).as_text()
        self.assertIn("simple_gla_fused_fwd", text)
        self.assertNotIn("simple_gla_chunk_output", text)

    def test_residual_h_under_grad_lowers_without_the_state_pass(self):
        """``residual_h=True`` with the fused forward under ``jax.value_and_grad`` on whole
        rows: the fused kernel (storing ``h``), the reverse pass and the gradients kernel, and
        no ``simple_gla_chunk_states`` kernel (the default path has one more: 4)."""
        q, k, v, g, state, seg = kmg_test.inputs(1, 130, 2, 2, 64, 64, decay=0.2, h0=True,
                                                 docs=(70,))

        def lowered(residual_h, forward="fused"):
            def loss(q, k, v, g, state):
                o, final = kmg.simple_gla_mosaic(q, k, v, g, initial_state=state,
                                                 segment_ids=seg, forward=forward,
                                                 residual_h=residual_h)
                return jnp.sum(o.astype(jnp.float32)) + jnp.sum(final)
            return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4))).trace(
                q, k, v, g, state).lower(lowering_platforms=("cuda",)).as_text()

        text = lowered(True)
        self.assertEqual(text.count("custom_call @mosaic_gpu"), 3)
        self.assertIn("simple_gla_fused_fwd", text)
        self.assertNotIn("simple_gla_chunk_states", text)
        self.assertNotIn("simple_gla_chunk_output", text)
        text = lowered(False)
        self.assertEqual(text.count("custom_call @mosaic_gpu"), 4)
        self.assertIn("simple_gla_chunk_states", text)
        # "auto" on these whole rows is fused: the option applies there too.
        self.assertNotIn("simple_gla_chunk_states", lowered(True, forward="auto"))
        # two_pass: the option does nothing (the backward shares the forward's state pass).
        self.assertIn("simple_gla_chunk_states", lowered(True, forward="two_pass"))

    def test_residual_h_with_sequence_pieces_lowers_for_cuda(self):
        """``residual_h=True``, ``forward="fused"`` on rows with pieces (2 CTAs, 16 chunks):
        the pieces' state pass (no ``h``), the fused kernel over the pieces storing ``h``, the
        reverse pass (two launches with pieces) and the gradients kernel: 5 Mosaic calls, the
        default path 7 (its backward's state pass, two launches with pieces, recomputes ``h``;
        counted in the lowered text, before XLA optimises)."""
        q, k, v, g, state, seg = kmg_test.inputs(1, 1024, 2, 2, 64, 64, decay=0.2, h0=True,
                                                 docs=(70, 600))

        def loss(q, k, v, g, state):
            o, final = kmg.simple_gla_mosaic(q, k, v, g, initial_state=state, segment_ids=seg,
                                             forward="fused", residual_h=True)
            return jnp.sum(o.astype(jnp.float32)) + jnp.sum(final)

        text = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4))).trace(
            q, k, v, g, state).lower(lowering_platforms=("cuda",)).as_text()
        self.assertIn("simple_gla_fused_fwd", text)
        self.assertEqual(text.count("custom_call @mosaic_gpu"), 5)


class ResolveForwardTest(absltest.TestCase):

    def test_auto_is_fused_except_differentiated_rows_with_pieces(self):
        s1, p1 = (8, 4096, 16, 128), (1, 32768, 16, 128)  # B, T, H, V: 256 CTAs; 32 CTAs
        self.assertEqual(kmg.resolve_forward("auto", *s1, differentiated=False), "fused")
        self.assertEqual(kmg.resolve_forward("auto", *p1, differentiated=False), "fused")
        self.assertEqual(kmg.resolve_forward("auto", *s1, differentiated=True), "fused")
        self.assertEqual(kmg.resolve_forward("auto", *p1, differentiated=True), "two_pass")
        for forward in ("two_pass", "fused"):  # as given
            self.assertEqual(kmg.resolve_forward(forward, *p1, differentiated=True), forward)
        self.assertEqual(kmg.DEFAULT_FORWARD, "auto")
        with self.assertRaisesRegex(ValueError, "forward must be one of"):
            kmg.resolve_forward("one_pass", *s1, differentiated=False)


class ValidationTest(absltest.TestCase):

    def test_rejects_bad_inputs(self):
        q, k, v, g, _, _ = kmg_test.inputs(1, 64, 2, 1, 64, 64, decay=0.1, h0=False, docs=None)
        with self.assertRaisesRegex(ValueError, "q and k must match"):
            kmg.simple_gla_fused_fwd_mosaic(q[..., :32], k, v, g)
        with self.assertRaisesRegex(ValueError, "initial_state must be"):
            kmg.simple_gla_fused_fwd_mosaic(q, k, v, g,
                                            initial_state=jnp.zeros((1, 1, 64, 64)))
        with self.assertRaisesRegex(ValueError, "16-bit dtype"):
            kmg.simple_gla_fused_fwd_mosaic(q.astype(jnp.float32), k.astype(jnp.float32),
                                            v.astype(jnp.float32), g)
        with self.assertRaisesRegex(ValueError, "g must be"):
            kmg.simple_gla_fused_fwd_mosaic(q, k, v, g[:, :, :1])
        with self.assertRaisesRegex(ValueError, "stages must be"):
            kmg.simple_gla_fused_fwd_mosaic(q, k, v, g, stages=1)
        with self.assertRaisesRegex(ValueError, "must be a positive divisor"):
            kmg.simple_gla_fused_fwd_mosaic(q, k, v, g, pieces=2)  # one chunk
        with self.assertRaisesRegex(ValueError, "forward must be one of"):
            kmg.simple_gla_fwd_mosaic(q, k, v, g, forward="one_pass")
        with self.assertRaisesRegex(ValueError, "forward must be one of"):
            kmg.simple_gla_mosaic(q, k, v, g, forward="one_pass")

    def test_bwd_rejects_bad_h(self):
        q, k, v, g, _, _ = kmg_test.inputs(1, 100, 2, 1, 64, 64, decay=0.1, h0=False, docs=None)
        good = jnp.zeros((1, 2, 2, 64, 64), v.dtype)
        for bad in (good[:, :, :1], good.astype(jnp.float32)):
            with self.assertRaisesRegex(ValueError, r"h must be \[B, H, N, K, V\]"):
                kmg.simple_gla_bwd_mosaic(q, k, v, g, v, h=bad)


@pytest.mark.gpu
class GpuTest(kmg_test.HopperTestCase):
    """The compiled fused kernel (three warpgroups, wgmma, TMA) on bf16 inputs: against the fp32
    reference, the two-pass forward, and (``store_h``) the state pass."""

    @parameterized.named_parameters(
        # B, T, H, Hk, K, V, decay, h0, document lengths (the rest is one more document)
        ("plain_T2048_K128_V128", 2, 2048, 4, 4, 128, 128, None, False, None),
        ("gva_h0_packed_T4096_K128_V128", 2, 4096, 4, 2, 128, 128, 0.05, True,
         (700, 1, 64, 999, 1200)),
        ("strong_decay_partial_T1000_K64_V128", 2, 1000, 2, 1, 64, 128, 5.0, True, None),
        ("packed_T3000_K128_V64", 1, 3000, 3, 3, 128, 64, 0.2, False, (10, 54, 500, 2000)),
        ("decay_h0_T4096_K64_V64", 1, 4096, 2, 2, 64, 64, 0.02, True, None),
    )
    def test_forward_matches_reference(self, batch, seq_len, heads, kv_heads, dk, dv, decay, h0,
                                       docs):
        q, k, v, g, state, seg = kmg_test.inputs(batch, seq_len, heads, kv_heads, dk, dv,
                                                 decay=decay, h0=h0, docs=docs, seed=3)
        scale = dk ** -0.5
        o, final, h = kmg.simple_gla_fused_fwd_mosaic(q, k, v, g, scale=scale,
                                                      initial_state=state, segment_ids=seg,
                                                      store_h=True)
        want_o, want_final = fwd_test._reference(q, k, v, g, state, seg, scale)
        _check_against_reference(self, o, final, want_o, want_final, allclose=False)
        # The two-pass forward rounds the same states the same way: o within a bf16 ulp or so.
        o2, final2 = kmg.simple_gla_fwd_mosaic(q, k, v, g, scale=scale, initial_state=state,
                                               segment_ids=seg)
        self.assertLess(tolerances.rel_err(o, o2), 2e-3)
        self.assertLess(tolerances.rel_err(final, final2), 1e-5)
        want_h, _ = kmg.chunk_states_mosaic(k, v, g, initial_state=state, segment_ids=seg,
                                            states_dtype=v.dtype)
        self.assertLess(tolerances.rel_err(h, want_h), 1e-3)

    def test_sequence_pieces(self):
        """A row with few CTAs (B 1, H 2, V 128: 4 CTAs) is split automatically (8 pieces of 16
        chunks): against the reference and the two-pass forward (which splits the same way),
        and ``h`` against the split state pass."""
        q, k, v, g, state, seg = kmg_test.inputs(1, 8192, 2, 1, 128, 128, decay=0.02, h0=True,
                                                 docs=(1000, 1048, 3000), seed=6)
        o, final, h = kmg.simple_gla_fused_fwd_mosaic(q, k, v, g, initial_state=state,
                                                      segment_ids=seg, store_h=True)
        want_o, want_final = fwd_test._reference(q, k, v, g, state, seg, 128 ** -0.5)
        _check_against_reference(self, o, final, want_o, want_final, allclose=False)
        o2, final2 = kmg.simple_gla_fwd_mosaic(q, k, v, g, initial_state=state, segment_ids=seg)
        self.assertLess(tolerances.rel_err(o, o2), 2e-3)
        self.assertLess(tolerances.rel_err(final, final2), 1e-5)
        want_h, _ = kmg.chunk_states_mosaic(k, v, g, initial_state=state, segment_ids=seg,
                                            states_dtype=v.dtype)
        self.assertLess(tolerances.rel_err(h, want_h), 1e-3)

    def test_benchmark_shape(self):
        """B 8, T 4096, H 16, K = V = 128 (the issue-29 timing shape) against the two-pass
        forward, with and without packed documents, and with a 3-stage ring."""
        for docs in (None, (1000, 37, 2000)):
            q, k, v, g, state, seg = kmg_test.inputs(8, 4096, 16, 16, 128, 128, decay=0.05,
                                                     h0=False, docs=docs, seed=5)
            o, final = kmg.simple_gla_fwd_mosaic(q, k, v, g, segment_ids=seg, forward="fused")
            o2, final2 = kmg.simple_gla_fwd_mosaic(q, k, v, g, segment_ids=seg)
            self.assertLess(tolerances.rel_err(o, o2), 2e-3, msg=f"{docs=}")
            self.assertLess(tolerances.rel_err(final, final2), 1e-5, msg=f"{docs=}")
            # A 3-stage ring changes the schedule only, not the arithmetic.
            o3, final3 = kmg.simple_gla_fused_fwd_mosaic(q, k, v, g, segment_ids=seg, stages=3)
            np.testing.assert_array_equal(np.asarray(o3, np.float32), np.asarray(o, np.float32))
            np.testing.assert_array_equal(final3, final)

    def test_custom_vjp_grads_match_two_pass(self):
        """``simple_gla_mosaic(forward="fused")``: same gradients as the two-pass forward (the
        backward is shared), on a packed GVA row with ``h0``."""
        q, k, v, g, state, seg = kmg_test.inputs(2, 2000, 4, 2, 128, 128, decay=0.05, h0=True,
                                                 docs=(700, 1, 64), seed=4)
        do = jax.random.normal(jax.random.key(9), v.shape).astype(v.dtype)

        def grads(forward):
            def fwd(q, k, v, g, h0):
                return kmg.simple_gla_mosaic(q, k, v, g, initial_state=h0, segment_ids=seg,
                                             forward=forward)
            (o, final), vjp = jax.vjp(fwd, q, k, v, g, state)
            return vjp((do, jnp.zeros_like(final)))

        for name, x, w in zip(("dq", "dk", "dv", "dg", "dh0"), grads("fused"), grads("two_pass")):
            err = tolerances.rel_err(x, w)
            self.assertLess(err, 1e-6, msg=f"{name}: relative RMS error {err:.2e}")

    def test_residual_h_grads_match_default(self):
        """``residual_h=True`` (the fused forward's ``h`` as the backward's residual): the same
        gradients as the default path (states recomputed), on a packed GVA row with ``h0``, and
        on rows with sequence pieces (B 1, H 2, V 128: 4 CTAs)."""
        for shape, docs, seed in (((2, 2000, 4, 2, 128, 128), (700, 1, 64), 4),
                                  ((1, 8192, 2, 1, 128, 128), (1000, 1048, 3000), 6)):
            q, k, v, g, state, seg = kmg_test.inputs(*shape, decay=0.05, h0=True, docs=docs,
                                                     seed=seed)
            do = jax.random.normal(jax.random.key(9), v.shape).astype(v.dtype)
            got = _residual_h_grads(q, k, v, g, state, seg, do, residual_h=True,
                                    interpret=False)
            want = _residual_h_grads(q, k, v, g, state, seg, do, residual_h=False,
                                     interpret=False)
            for name, x, w in zip(("dq", "dk", "dv", "dg", "dh0"), got, want):
                err = tolerances.rel_err(x, w)
                self.assertLess(err, 1e-6, msg=f"{shape} {name}: relative RMS error {err:.2e}")


if __name__ == "__main__":
    absltest.main()
