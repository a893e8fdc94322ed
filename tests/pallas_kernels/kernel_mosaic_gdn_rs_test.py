"""Tests of ``forward="fused_rs"``: the forward-only GDN kernel with the transposed state in
registers (``kernel_mosaic_gpu_rs``, MOSAIC_GPU.md Sec. 56).

* CI: the kernel and the op export for CUDA with the kernel's name (K = V = 128 with GVA,
  documents, ``h0``; K 64 / V 128 with two stages); the ring depth and SMEM sizes; the
  refusals; the fallbacks to ``"fused_t0"`` (under differentiation, with ``return_residual``,
  on rows with too few CTAs) and their log lines. About 4 s.
* ``slow`` (``RsInterpretTest``): the kernel in Mosaic GPU interpret mode against the fp32
  token-serial reference (``reference.gated_delta_rule_reference``) with packed documents
  starting inside chunks, ``h0``, strong decay, GVA, a partial last chunk and a ring that
  wraps; DeltaNet in fp16; the op's primal. Run as ``PJRT_NPROC=8 timeout 900 python -m pytest
  -q -m slow tests/pallas_kernels/kernel_mosaic_gdn_rs_test.py`` (the interpreter hangs on a
  2-core host without ``PJRT_NPROC``; ``kernel_mosaic_gdn_t0_test``'s docstring).
* ``gpu`` (``GpuTest``): the compiled kernel (register operands, ``ACC.init``, the transposed
  ``V`` load on jax 0.11) on realistic rows, against the reference and beside the default
  ``fused_t0`` kernel's errors.
"""

import contextlib
import functools
import io
from unittest import mock

import jax
import jax.numpy as jnp
import pytest
from absl.testing import absltest, parameterized

from pallas_kernels.common import validation
from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu as kgd
from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu_fused as kfused
from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu_rs as krs
from pallas_kernels.gated_delta_rule import mosaic_vjp
from tests import tolerances
from tests.pallas_kernels import kernel_mosaic_gdn_bwd_test as bwd_test
from tests.pallas_kernels import kernel_mosaic_gdn_t0_test as t0_test
from tests.pallas_kernels import kernel_mosaic_gdn_test as gdn_test
from tests.pallas_kernels import kernel_mosaic_gdn_vjp_test as vjp_test
from tests.pallas_kernels import kernel_mosaic_gpu_test as kmg_test

_GATE = t0_test._FWD_GATE


def _run_kernel(batch, seq_len, heads, kv_heads, dk, dv, decay, h0, docs, dtype=jnp.bfloat16,
                *, seed=0, interpret=True, stages=None):
    """The ``T0`` kernel then the ``fused_rs`` kernel; returns the inputs, ``(o, final)``."""
    inputs = t0_test._inputs(batch, seq_len, heads, kv_heads, dk, dv, decay, h0, docs, dtype,
                             seed=seed)
    q, k, v, g, beta, state, seg = inputs
    t0 = kgd.chunk_kkt_inverse_mosaic(k, beta, segment_ids=seg, interpret=interpret)
    out = krs.chunk_delta_fused_rs_fwd_mosaic(q, k, v, t0, g, beta, scale=dk ** -0.5,
                                              initial_state=state, segment_ids=seg,
                                              interpret=interpret, stages=stages)
    return inputs, t0, out


def _check_kernel(test, *case, dtype=jnp.bfloat16, seed=0, interpret=True, stages=None):
    """``fused_rs`` against the fp32 reference (``o`` and the final state); returns the
    relative RMS errors."""
    (q, k, v, g, beta, state, seg), _, (o, final) = _run_kernel(
        *case, dtype, seed=seed, interpret=interpret, stages=stages)
    want_o, want_final, _ = gdn_test._reference(q, k, v, g, beta, state, seg, k.shape[-1] ** -0.5)
    test.assertEqual((o.shape, o.dtype), (v.shape, v.dtype))
    test.assertEqual((final.shape, final.dtype), (want_final.shape, jnp.float32))
    errs = {}
    for name, got, want in (("o", o, want_o), ("final_state", final, want_final)):
        gdn_test._assert_close(test, name, got, want, max_err=_GATE[jnp.dtype(dtype)],
                               allclose=False)
        errs[name] = tolerances.rel_err(got, want)
    return errs


def _export_text(fn, *args):
    return jax.export.export(jax.jit(fn), platforms=["cuda"])(*args).mlir_module()


def _rs_residuals_on():
    """The switch of the residual form on (``RS_RESIDUALS``), on whole rows (the test rows have
    few CTAs: ``FUSED_T0_FALLBACK`` off keeps ``fused_rs``)."""
    return mock.patch.multiple(mosaic_vjp, RS_RESIDUALS=True, FUSED_T0_FALLBACK=False)


def _check_residuals(test, *case, dtype=jnp.bfloat16, seed=0, interpret=True):
    """The residual form's ``h`` and ``v_new`` against ``fused_t0``'s (``store_h``,
    ``store_v_new``) on the same inputs and ``T0``: same shapes and dtypes, ``h``'s first chunk
    (``h0`` in 16 bits) bit-equal, the rest within the forward gate (relative RMS; the kinds of
    rounding are the same, the summation orders differ); ``o`` and the final state equal the
    forward-only kernel's bit for bit. Returns the relative RMS differences."""
    (q, k, v, g, beta, state, seg), t0, (o, final) = _run_kernel(
        *case, dtype, seed=seed, interpret=interpret)
    scale = k.shape[-1] ** -0.5
    o_r, final_r, vn_r, h_r = krs.chunk_delta_fused_rs_fwd_mosaic(
        q, k, v, t0, g, beta, scale=scale, initial_state=state, segment_ids=seg,
        interpret=interpret, store_h=True, store_v_new=True)
    _, _, vn_t, h_t = kfused.chunk_delta_fused_t0_fwd_mosaic(
        q, k, v, t0, g, beta, scale=scale, initial_state=state, segment_ids=seg,
        interpret=interpret, store_h=True, store_v_new=True)
    test.assertTrue(bool(jnp.all(o_r == o)), "o")  # the stores change no sum
    test.assertTrue(bool(jnp.all(final_r == final)), "final_state")
    test.assertTrue(bool(jnp.all(h_r[:, :, 0] == h_t[:, :, 0])), "h0")
    errs = {}
    for name, got, want in (("h", h_r, h_t), ("v_new", vn_r, vn_t)):
        test.assertEqual((got.shape, got.dtype), (want.shape, want.dtype), name)
        errs[name] = tolerances.rel_err(got, want)
        test.assertLess(errs[name], _GATE[jnp.dtype(dtype)], name)
    return errs


class RsTest(parameterized.TestCase):
    """CI: exports, sizes, refusals, fallbacks (no interpreter)."""

    def test_kernel_exports_for_cuda(self):
        for dk, dv, kv_heads, stages in ((128, 128, 1, None), (64, 128, 2, 2)):
            q, k, v, g, beta, state, seg = t0_test._inputs(1, 200, 2, kv_heads, dk, dv, 0.2,
                                                           True, (70, 30))
            t0 = kgd.kkt_inverse_xla(k, beta, segment_ids=seg).astype(k.dtype)
            text = _export_text(
                lambda *a: krs.chunk_delta_fused_rs_fwd_mosaic(  # noqa: B023
                    *a[:6], scale=0.1, initial_state=a[6], segment_ids=a[7],
                    stages=stages), q, k, v, t0, g, beta, state, seg)
            self.assertEqual(text.count("custom_call @mosaic_gpu"), 1)
            # stages=None at K = 128: PRIMAL_STAGES's two (MOSAIC_GPU.md Sec. 63)
            self.assertIn(krs.rs_kernel_name(stages or krs.PRIMAL_STAGES[dk]), text)
        self.assertEqual(krs.PRIMAL_STAGES, {128: 2})

    def test_ablations_export_with_their_names(self):
        q, k, v, g, beta, state, seg = t0_test._inputs(1, 200, 2, 2, 128, 128, 0.2, True,
                                                       (70, 30))
        t0 = kgd.kkt_inverse_xla(k, beta, segment_ids=seg).astype(k.dtype)
        for ablation in ("state", "readout"):
            text = _export_text(
                lambda *a: krs.chunk_delta_fused_rs_fwd_mosaic(  # noqa: B023
                    *a[:6], scale=0.1, initial_state=a[6], segment_ids=a[7],
                    ablation=ablation), q, k, v, t0, g, beta, state, seg)
            self.assertTrue(krs.rs_kernel_name(2, ablation) in text)  # PRIMAL_STAGES at K 128
        self.assertEqual(krs.rs_kernel_name(2, "readout"),
                         "gdn_chunk_delta_fused_rs_fwd_s2_abl_readout")

    def test_ag_ahead_exports_with_its_name(self):
        # protocol="ag_ahead" (MOSAIC_GPU.md Sec. 64), three stages (the item times it there),
        # K = V = 128, GVA, documents, h0: one kernel, named _s3_ah; "joint" is the default.
        q, k, v, g, beta, state, seg = t0_test._inputs(1, 200, 2, 1, 128, 128, 0.2, True,
                                                       (70, 30))
        t0 = kgd.kkt_inverse_xla(k, beta, segment_ids=seg).astype(k.dtype)
        text = _export_text(
            lambda *a: krs.chunk_delta_fused_rs_fwd_mosaic(
                *a[:6], scale=0.1, initial_state=a[6], segment_ids=a[7], stages=3,
                protocol="ag_ahead"), q, k, v, t0, g, beta, state, seg)
        self.assertEqual(text.count("custom_call @mosaic_gpu"), 1)
        self.assertIn("gdn_chunk_delta_fused_rs_fwd_s3_ah", text)
        self.assertEqual(krs.RS_PROTOCOLS, ("joint", "ag_ahead"))
        self.assertEqual(krs.rs_kernel_name(2, "state", protocol="ag_ahead"),
                         "gdn_chunk_delta_fused_rs_fwd_s2_ah_abl_state")
        self.assertEqual(krs.rs_kernel_name(2, protocol="joint"), krs.rs_kernel_name(2))
        with self.assertRaisesRegex(ValueError, "ablation must be one of"):
            krs.chunk_delta_fused_rs_fwd_mosaic(q, k, v, t0, g, beta, scale=0.1, ablation="io")

    def test_op_primal_runs_the_kernel_and_vjp_falls_back(self):
        q, k, v, g, beta, state, seg = t0_test._inputs(1, 200, 2, 1, 128, 128, 0.2, True,
                                                       (70, 30))

        def primal(q, k, v, g, beta, state, seg):
            return mosaic_vjp.gated_delta_rule_mosaic(
                q, k, v, g, beta, initial_state=state, segment_ids=seg,
                output_final_state=True, forward="fused_rs")

        text = _export_text(primal, q, k, v, g, beta, state, seg)
        self.assertEqual(text.count("custom_call @mosaic_gpu"), 2)  # T0, then fused_rs
        self.assertIn("gdn_chunk_kkt_inverse", text)
        self.assertIn(krs.rs_kernel_name(2), text)  # K = 128: PRIMAL_STAGES
        # Under differentiation: the fused_t0 forward (it stores h, v_new), logged once.
        with mock.patch.object(validation, "_logged", set()), \
                self.assertLogs(level="INFO") as logs:
            res = jax.eval_shape(lambda *a: mosaic_vjp._forward(
                *a, scale=0.1, forward="fused_rs", interpret=False), q, k, v, g, beta, state,
                seg)
        _, (_, h, v_new, _, t0) = res
        self.assertIsNotNone(h)
        self.assertIsNotNone(v_new)
        self.assertIsNotNone(t0)
        self.assertIn("under differentiation", "\n".join(logs.output))
        # The primal with return_residual needs v_new: fused_t0 as well.
        _, (_, h, v_new, _, _) = jax.eval_shape(lambda *a: mosaic_vjp._forward(
            *a, scale=0.1, forward="fused_rs", interpret=False, residuals=False,
            want_v_new=True), q, k, v, g, beta, state, seg)
        self.assertIsNone(h)
        self.assertIsNotNone(v_new)
        _, (w, h, v_new, maps, t0) = jax.eval_shape(lambda *a: mosaic_vjp._forward(
            *a, scale=0.1, forward="fused_rs", interpret=False, residuals=False), q, k, v, g,
            beta, state, seg)
        self.assertEqual((w, h, v_new, maps, t0), (None,) * 5)

    def test_rows_with_few_ctas_resolve_to_fused_t0(self):
        self.assertEqual(mosaic_vjp.resolve_forward("fused_rs", 8, 16, 128, 4096), "fused_rs")
        with mock.patch.object(validation, "_logged", set()), \
                self.assertLogs(level="INFO") as logs:
            self.assertEqual(mosaic_vjp.resolve_forward("fused_rs", 1, 16, 128, 32768),
                             "fused_t0")
        self.assertIn("sequence pieces", "\n".join(logs.output))
        with mock.patch.object(mosaic_vjp, "FUSED_T0_PIECES", False):
            self.assertEqual(mosaic_vjp.resolve_forward("fused_rs", 1, 16, 128, 32768),
                             "three_pass")
        self.assertIn("fused_rs", kgd.FORWARDS)
        self.assertEqual(mosaic_vjp.DEFAULT_FORWARD, "fused_rs")  # MOSAIC_GPU.md Sec. 63

    def test_fwd_mosaic_with_residual_falls_back(self):
        q, k, v, g, beta, state, seg = t0_test._inputs(1, 100, 1, 1, 64, 64, 0.2, False, None)
        run = jax.eval_shape(lambda *a: kgd.gated_delta_rule_fwd_mosaic(
            *a, forward="fused_rs", return_residual=True), q, k, v, g, beta)
        self.assertEqual(len(run), 3)  # o, final_state, v_new: from fused_t0
        self.assertEqual(len(jax.eval_shape(lambda *a: kgd.gated_delta_rule_fwd_mosaic(
            *a, forward="fused_rs"), q, k, v, g, beta)), 2)

    def test_ring_depth_and_smem(self):
        for dk in (64, 128):
            for dtype in (jnp.bfloat16, jnp.float16):
                self.assertEqual(krs.rs_ring_depth(dk, dtype), 3)
        # K = V = 128, 16 bits, three stages: 3 x 50,944 + 65,536 + 1,024 (barriers) bytes
        self.assertEqual(krs.rs_smem_bytes(128, jnp.bfloat16, 3), 219_392)
        self.assertLessEqual(krs.rs_smem_bytes(128, jnp.bfloat16, 3), 227 * 1024)

    def test_refusals(self):
        q, k, v, g, beta, _, _ = t0_test._inputs(1, 100, 1, 1, 64, 64, 0.2, False, None)
        t0 = jnp.zeros(v.shape[:3] + (64,), v.dtype)
        with self.assertRaisesRegex(ValueError, "stages"):
            krs.chunk_delta_fused_rs_fwd_mosaic(q, k, v, t0, g, beta, scale=0.1, stages=4)
        with self.assertRaisesRegex(ValueError, "t0 must be"):
            krs.chunk_delta_fused_rs_fwd_mosaic(q, k, v, t0[..., :32], g, beta, scale=0.1)
        with self.assertRaisesRegex(ValueError, "forward must be one of"):
            mosaic_vjp.gated_delta_rule_mosaic(q, k, v, g, beta, forward="fused_rx")
        with self.assertRaisesRegex(ValueError, "without residuals"):
            krs.chunk_delta_fused_rs_fwd_mosaic(q, k, v, t0, g, beta, scale=0.1,
                                                ablation="state", store_h=True)
        with self.assertRaisesRegex(ValueError, "protocol must be one of"):
            krs.chunk_delta_fused_rs_fwd_mosaic(q, k, v, t0, g, beta, scale=0.1,
                                                protocol="early_s")
        q2, k2, v2, g2, beta2, _, _ = t0_test._inputs(1, 100, 1, 1, 128, 128, 0.2, False, None)
        with self.assertRaisesRegex(ValueError, "268544 bytes of SMEM"):
            krs.chunk_delta_fused_rs_fwd_mosaic(q2, k2, v2, t0, g2, beta2, scale=0.1, stages=3,
                                                store_h=True, store_v_new=True)


class RsResidualTest(parameterized.TestCase):
    """CI: the residual form (``store_h`` / ``store_v_new``, ``RS_RESIDUALS``; MOSAIC_GPU.md
    Sec. 58): export, ring depth, wiring. About 3 s."""

    def test_ring_depth_and_smem_with_residuals(self):
        # K = 128: the staging tiles (2 x 16 KB + 2 x 8 KB) leave room for two stages only
        self.assertEqual(krs.rs_smem_bytes(128, jnp.bfloat16, 3, True, True), 268_544)
        self.assertEqual(krs.rs_smem_bytes(128, jnp.bfloat16, 2, True, True), 217_600)
        self.assertEqual(krs.rs_ring_depth(128, jnp.bfloat16, True, True), 2)
        self.assertEqual(krs.rs_ring_depth(128, jnp.float16, False, True), 2)
        self.assertEqual(krs.rs_ring_depth(64, jnp.bfloat16, True, True), 3)
        self.assertEqual(krs.rs_kernel_name(2, "full", True, True),
                         "gdn_chunk_delta_fused_rs_fwd_s2_res")
        self.assertEqual(krs.rs_kernel_name(3, "full", False, True),
                         "gdn_chunk_delta_fused_rs_fwd_s3_vn")

    def test_residual_from_state(self):
        # MOSAIC_GPU.md Sec. 58.5: no staging tiles, three stages at K = 128; stores through a
        # transposed swizzled view, which only jax >= 0.11 lowers
        self.assertEqual(krs.rs_ring_depth(128, jnp.bfloat16, True, True, "state"), 3)
        self.assertEqual(krs.rs_smem_bytes(128, jnp.bfloat16, 3, True, True, "state"), 219_392)
        q, k, v, g, beta, state, seg = t0_test._inputs(1, 200, 2, 1, 128, 128, 0.2, True,
                                                       (70, 30))
        t0 = kgd.kkt_inverse_xla(k, beta, segment_ids=seg).astype(k.dtype)
        run = functools.partial(krs.chunk_delta_fused_rs_fwd_mosaic, scale=0.1,
                                store_h=True, store_v_new=True, residual_from="state")
        with self.assertRaisesRegex(ValueError, "residual_from must be one of"):
            run(q, k, v, t0, g, beta, residual_from="memory")
        if not krs.TRANSPOSED_V_LOAD:
            with self.assertRaisesRegex(ValueError, "cannot lower"):
                run(q, k, v, t0, g, beta)
            return
        text = _export_text(lambda *a: run(*a[:6], initial_state=a[6], segment_ids=a[7]),
                            q, k, v, t0, g, beta, state, seg)
        self.assertIn(krs.rs_kernel_name(3, "full", True, True, "state"), text)
        self.assertEqual(krs.rs_kernel_name(3, "full", True, True, "state"),
                         "gdn_chunk_delta_fused_rs_fwd_s3_res_st")

    def test_op_grad_exports_the_residual_form(self):
        # jax.grad through the op with the switch on, dh_w="t0": the plain T0 kernel, the
        # residual form, the folded reverse pass forming W, the fused backward; no fused_t0.
        q, k, v, g, beta, state, seg, _, _, scale = bwd_test._pipeline_inputs(
            1, 200, 2, 1, 128, 128, 0.2, True, True, (70, 30))

        def loss(q, k, v, g, beta, h0, seg):
            o, final = mosaic_vjp.gated_delta_rule_mosaic(
                q, k, v, g, beta, scale=scale, initial_state=h0, segment_ids=seg,
                output_final_state=True, forward="fused_rs", dh_w="t0")
            return jnp.sum(o.astype(jnp.float32) ** 2) + jnp.sum(final)

        with _rs_residuals_on():
            self.assertEqual(mosaic_vjp.resolve_dh_w("t0", "fused_rs", "fold", 1, 2, 128, 200),
                             "t0")
            text = _export_text(jax.grad(loss, argnums=(0, 1, 2, 3, 4, 5)),
                                q, k, v, g, beta, state, seg)
        calls = [line for line in text.splitlines() if "custom_call @mosaic_gpu" in line]
        self.assertEqual(len(calls), 4)
        for name in ("gdn_chunk_kkt_inverse_subst_split\\00",
                     krs.rs_kernel_name(2, "full", True, True),
                     "gdn_chunk_delta_dh_fold_t0\\00", "gdn_chunk_bwd_fused_ws\\00"):
            self.assertEqual(sum(name in c for c in calls), 1, msg=name)
        self.assertNotIn("gdn_chunk_delta_fused_t0_fwd", text)
        self.assertEqual(mosaic_vjp.RS_RESIDUALS, False)  # off by default

    def test_forward_keeps_the_residuals_without_fallback(self):
        q, k, v, g, beta, state, seg = t0_test._inputs(1, 200, 2, 1, 64, 128, 0.2, True,
                                                       (70, 30))
        fwd = functools.partial(mosaic_vjp._forward, scale=0.1, forward="fused_rs",
                                interpret=False)
        with _rs_residuals_on(), mock.patch.object(validation, "_logged", set()), \
                mock.patch.object(validation, "log_once") as log:
            _, (w, h, v_new, maps, t0) = jax.eval_shape(
                lambda *a: fwd(*a), q, k, v, g, beta, state, seg)
            self.assertEqual(h.shape, (1, 2, 4, 64, 128))
            self.assertEqual((v_new.shape, t0.shape, w.shape),
                             (v.shape, v.shape[:3] + (64,), (1, 200, 2, 64)))
            self.assertIsNone(maps)
            _, (w, h, v_new, _, t0) = jax.eval_shape(  # dh_w="t0": no W
                lambda *a: fwd(*a, want_w=False), q, k, v, g, beta, state, seg)
            self.assertEqual((w, h is None, t0 is None), (None, False, False))
            _, (w, h, v_new, _, t0) = jax.eval_shape(  # return_residual: v_new alone
                lambda *a: fwd(*a, residuals=False, want_v_new=True), q, k, v, g, beta, state,
                seg)
            self.assertEqual((w, h, t0), (None, None, None))
            self.assertEqual(v_new.shape, v.shape)
            log.assert_not_called()  # no fallback


# B, T, H, Hk, K, V, decay (None: DeltaNet), h0, document lengths (the rest one more), dtype
_INTERPRET_CASES = (
    # five chunks (the three-stage ring wraps), a 44-token last chunk, GVA, h0, documents
    # starting inside chunks (40, 140) and at 240
    ("gva_h0_packed_partial_T300_K64_V128", 1, 300, 2, 1, 64, 128, 0.1, True, (40, 100, 100),
     jnp.bfloat16),
    ("strong_decay_h0_partial_T130_K128_V64", 1, 130, 1, 1, 128, 64, 5.0, True, (10,),
     jnp.bfloat16),
    ("fp16_deltanet_packed_T200_K64_V64", 1, 200, 1, 1, 64, 64, None, False, (70, 30),
     jnp.float16),
)


# Slow (out of CI): the interpreted kernel (PJRT_NPROC=8, module docstring).
@pytest.mark.slow
class RsInterpretTest(parameterized.TestCase):

    @parameterized.named_parameters(*_INTERPRET_CASES)
    def test_kernel_matches_reference(self, *case):
        errs = _check_kernel(self, *case[:-1], dtype=case[-1])
        print(f"fused_rs {self.id()}: " + ", ".join(f"{k} {v:.3e}" for k, v in errs.items()))

    def test_two_stages_equal_three(self):
        case = _INTERPRET_CASES[0][1:-1]
        _, _, three = _run_kernel(*case, stages=3)
        _, _, two = _run_kernel(*case, stages=2)
        for a, b in zip(three, two, strict=True):  # the same arithmetic, another ring depth
            self.assertTrue(bool(jnp.all(a == b)))

    @parameterized.named_parameters(
        # the three-stage ring wraps, a 44-token last chunk, GVA, h0, documents inside chunks
        ("gva_h0_packed_partial_T300_K64_V128_s3", 0, 3, {}),
        # K 128 / V 64, strong decay, a document at 10, partial last chunk, two stages
        ("strong_decay_h0_partial_T130_K128_V64_s2", 1, 2, {}),
        # the residual form (h and v_new from the output warpgroup), fp16 DeltaNet, documents
        ("fp16_deltanet_packed_T200_K64_V64_residuals", 2, None,
         dict(store_h=True, store_v_new=True)),
        # the state ablation: only the chain's final state is defined
        ("gva_h0_packed_partial_T300_K64_V128_state", 0, 2, dict(ablation="state")),
    )
    def test_ag_ahead_is_bit_equal(self, index, stages, extra):
        # protocol="ag_ahead" (MOSAIC_GPU.md Sec. 64) reorders the output warpgroup only: every
        # output bit for bit against "joint" (the interpreter's race detector is on).
        case, dtype = _INTERPRET_CASES[index][1:-1], _INTERPRET_CASES[index][-1]
        q, k, v, g, beta, state, seg = t0_test._inputs(*case, dtype, seed=7)
        t0 = kgd.chunk_kkt_inverse_mosaic(k, beta, segment_ids=seg, interpret=True)
        run = functools.partial(krs.chunk_delta_fused_rs_fwd_mosaic, q, k, v, t0, g, beta,
                                scale=case[4] ** -0.5, initial_state=state, segment_ids=seg,
                                interpret=True, stages=stages, **extra)
        log = io.StringIO()
        with contextlib.redirect_stdout(log):  # the interpreter prints the races it detects
            joint, ahead = jax.block_until_ready((run(), run(protocol="ag_ahead")))
        self.assertNotIn("RACE DETECTED", log.getvalue(), log.getvalue()[:600])
        names = ("o", "final_state", "v_new", "h")
        self.assertEqual(len(joint), len(ahead))
        for name, a, b in zip(names, joint, ahead):  # (o, final) or with v_new, h
            if name == "o" and extra.get("ablation") == "state":
                continue  # not written
            self.assertTrue(bool(jnp.all(a == b)), name)

    def test_close_to_split_vk(self):
        # The roundings of fused_t0_split with state_layout="vk" (exp2 instead of exp only).
        case = _INTERPRET_CASES[0][1:-1]
        (q, k, v, g, beta, state, seg), t0, (o, final) = _run_kernel(*case)
        o_vk, final_vk, _, _ = kfused.chunk_delta_fused_t0_fwd_mosaic(
            q, k, v, t0, g, beta, scale=case[4] ** -0.5, initial_state=state, segment_ids=seg,
            split_output=True, split_order="shared_mask", split_stages=3, state_layout="vk",
            interpret=True)
        self.assertLess(tolerances.rel_err(o, o_vk), 1e-3)
        self.assertLess(tolerances.rel_err(final, final_vk), 1e-3)

    def test_state_ablation_keeps_the_chain(self):
        # ablation="state": the output warpgroup forms Ag only; the final state is the full
        # kernel's, bit for bit.
        case = _INTERPRET_CASES[0][1:-1]
        (q, k, v, g, beta, state, seg), t0, (_, final) = _run_kernel(*case)
        _, got = krs.chunk_delta_fused_rs_fwd_mosaic(
            q, k, v, t0, g, beta, scale=case[4] ** -0.5, initial_state=state, segment_ids=seg,
            interpret=True, ablation="state")
        self.assertTrue(bool(jnp.all(got == final)))

    def test_readout_ablation_reads_out_the_entry_state(self):
        # ablation="readout": S frozen at h0, v_new = 0: o_t = scale e^{G_t} S_0^T q_t (G
        # chunk-local, no documents), the final state is h0.
        batch, seq_len, heads, kv_heads, dk, dv = 1, 150, 2, 1, 64, 64
        q, k, v, g, beta, state, _ = t0_test._inputs(batch, seq_len, heads, kv_heads, dk, dv,
                                                     0.1, True, None)
        t0 = kgd.chunk_kkt_inverse_mosaic(k, beta, interpret=True)
        o, final = krs.chunk_delta_fused_rs_fwd_mosaic(
            q, k, v, t0, g, beta, scale=0.125, initial_state=state, interpret=True,
            ablation="readout")
        self.assertTrue(bool(jnp.all(final == state)))
        pad = -seq_len % 64
        gp = jnp.pad(g, ((0, 0), (0, pad), (0, 0))).reshape(batch, -1, 64, heads)
        decay = jnp.exp(jnp.cumsum(gp, axis=2)).reshape(batch, -1, heads)[:, :seq_len]
        s0 = state.astype(jnp.bfloat16).astype(jnp.float32)
        qh = jnp.repeat(q.astype(jnp.float32), heads // kv_heads, axis=2)
        want = 0.125 * decay[..., None] * jnp.einsum("bthk,bhkv->bthv", qh, s0)
        self.assertLess(tolerances.rel_err(o, want), 5e-3)

    def test_op_primal_matches_reference(self):
        q, k, v, g, beta, state, seg = t0_test._inputs(1, 150, 2, 1, 64, 128, 0.02, True,
                                                       (64, 36, 30))
        o, final = mosaic_vjp.gated_delta_rule_mosaic(
            q, k, v, g, beta, initial_state=state, segment_ids=seg, output_final_state=True,
            forward="fused_rs", interpret=True)
        want_o, want_final, _ = gdn_test._reference(q, k, v, g, beta, state, seg, 64 ** -0.5)
        gdn_test._assert_close(self, "o", o, want_o, allclose=False)
        gdn_test._assert_close(self, "final_state", final, want_final, allclose=False)


# B, T, H, Hk, K, V, decay (None: DeltaNet), h0, dht, document lengths; dh_w
_RESIDUAL_GRAD_CASES = (
    ("gva_h0_dht_packed_partial_T150_K64_V64", 1, 150, 2, 1, 64, 64, 0.05, True, True,
     (64, 36, 30), "stored"),
    ("gated_h0_packed_partial_T130_K128_V64_dh_w_t0", 1, 130, 2, 2, 128, 64, 0.05, True,
     False, (10, 54), "t0"),
)


# Slow (out of CI), as RsInterpretTest: the residual form (MOSAIC_GPU.md Sec. 58).
@pytest.mark.slow
class RsResidualInterpretTest(parameterized.TestCase):

    @parameterized.named_parameters(*_INTERPRET_CASES[:2])
    def test_residuals_equal_fused_t0s(self, *case):
        errs = _check_residuals(self, *case[:-1], dtype=case[-1])
        print(f"fused_rs residuals {self.id()}: " + ", ".join(
            f"{k} {v:.3e}" for k, v in errs.items()))

    @parameterized.named_parameters(*_RESIDUAL_GRAD_CASES)
    def test_op_grads_match_reference(self, *case):
        # jax.vjp of the op with the switch on against the fp32 chunked vjp (the vjp tests'
        # gates: 5e-3, dg and dbeta 1e-2)
        with _rs_residuals_on(), mock.patch.object(validation, "log_once") as log:
            vjp_test._check(self, bwd_test._pipeline_inputs(*case[:-1]), True,
                            forward="fused_rs", dh_w=case[-1])
            log.assert_not_called()  # the residual form ran, no fallback

    def test_residual_from_state_equals_output(self):
        # residual_from="state" (Sec. 58.5): the same values bit for bit, 3 and 2 stages
        case = _INTERPRET_CASES[1][1:-1]
        (q, k, v, g, beta, state, seg), t0, _ = _run_kernel(*case)
        run = functools.partial(krs.chunk_delta_fused_rs_fwd_mosaic, q, k, v, t0, g, beta,
                                scale=case[4] ** -0.5, initial_state=state, segment_ids=seg,
                                interpret=True, store_h=True, store_v_new=True)
        want = run()
        for stages in (None, 2):
            got = run(residual_from="state", stages=stages)
            for name, a, b in zip(("o", "final_state", "v_new", "h"), got, want, strict=True):
                self.assertTrue(bool(jnp.all(a == b)), f"{name}, {stages=}")

    def test_op_return_residual_equals_fused_t0s(self):
        q, k, v, g, beta, state, seg = t0_test._inputs(1, 150, 2, 1, 64, 128, 0.05, True,
                                                       (64, 36, 30))
        run = functools.partial(mosaic_vjp.gated_delta_rule_mosaic, q, k, v, g, beta,
                                initial_state=state, segment_ids=seg, return_residual=True,
                                interpret=True)
        with _rs_residuals_on():
            o, _, u = run(forward="fused_rs")
            o_t, _, u_t = run(forward="fused_t0")
        self.assertLess(tolerances.rel_err(u, u_t), _GATE[jnp.dtype(jnp.bfloat16)])
        self.assertLess(tolerances.rel_err(o, o_t), _GATE[jnp.dtype(jnp.bfloat16)])


@pytest.mark.gpu
class GpuTest(kmg_test.HopperTestCase):
    """The compiled kernel against the fp32 reference, beside the default ``fused_t0``."""

    @parameterized.named_parameters(*t0_test._GPU_KERNEL_CASES)
    def test_fused_rs_kernel_matches_reference(self, *case):
        errs = _check_kernel(self, *case[:-1], dtype=case[-1], seed=5, interpret=False)
        base = t0_test._check_fused_kernel(self, *case, seed=5, interpret=False,
                                           allclose=False)
        print(f"fused_rs {self.id()}: " + ", ".join(
            f"{k} {v:.3e} (fused_t0 {base[k]:.3e})" for k, v in errs.items()))
        for name, err in errs.items():  # the same kind of roundings: at most 1.5x fused_t0's
            self.assertLessEqual(err, 1.5 * base[name] + 1e-6, name)

    def test_fused_rs_two_stages_and_fused_t0_agree(self):
        # A realistic row (64 chunks, a partial last one, documents, h0, GVA).
        case = (1, 4090, 4, 2, 128, 128, 0.05, True, (700, 1, 64, 999, 1200))
        (q, k, v, g, beta, state, seg), t0, three = _run_kernel(*case, seed=5, interpret=False)
        _, _, two = _run_kernel(*case, seed=5, interpret=False, stages=2)
        default = kfused.chunk_delta_fused_t0_fwd_mosaic(
            q, k, v, t0, g, beta, scale=128 ** -0.5, initial_state=state, segment_ids=seg)[:2]
        for name, a, b, c in zip(("o", "final_state"), three, two, default, strict=True):
            self.assertTrue(bool(jnp.all(a == b)), name)  # the ring depth changes no sum
            err = tolerances.rel_err(a, c)
            print(f"fused_rs vs fused_t0 {name}: relative RMS {err:.3e}")
            self.assertLess(err, _GATE[jnp.dtype(jnp.bfloat16)], name)

    def test_ag_ahead_is_bit_equal(self):
        # protocol="ag_ahead" (MOSAIC_GPU.md Sec. 64) against "joint", compiled, bit for bit:
        # realistic rows (64 chunks, a partial last one, documents, h0, GVA) at K = V = 128 with
        # two and three stages, K 64 / V 128, and the residual form (two stages).
        def check(case, **kw):
            (q, k, v, g, beta, state, seg), t0, _ = _run_kernel(*case, seed=5, interpret=False)
            run = functools.partial(krs.chunk_delta_fused_rs_fwd_mosaic, q, k, v, t0, g, beta,
                                    scale=case[4] ** -0.5, initial_state=state,
                                    segment_ids=seg, **kw)
            names = ("o", "final_state", "v_new", "h")
            joint, ahead = run(), run(protocol="ag_ahead")
            self.assertEqual(len(joint), len(ahead))
            for name, a, b in zip(names, joint, ahead):  # (o, final) or with v_new, h
                self.assertTrue(bool(jnp.all(a == b)), f"{name} {case[4:6]} {kw}")

        case = (1, 4090, 4, 2, 128, 128, 0.05, True, (700, 1, 64, 999, 1200))
        for stages in (2, 3):
            check(case, stages=stages)
        check((2, 2000, 4, 2, 64, 128, 0.05, True, (700, 1, 64)))
        check(case, store_h=True, store_v_new=True)

    def test_op_primal_matches_reference(self):
        q, k, v, g, beta, state, seg = t0_test._inputs(2, 4096, 4, 4, 128, 128, 0.05, True,
                                                       (700, 1, 64, 999), seed=3)
        o, final = mosaic_vjp.gated_delta_rule_mosaic(
            q, k, v, g, beta, initial_state=state, segment_ids=seg, output_final_state=True,
            forward="fused_rs")
        want_o, want_final, _ = gdn_test._reference(q, k, v, g, beta, state, seg, 128 ** -0.5)
        gdn_test._assert_close(self, "o", o, want_o, allclose=False)
        gdn_test._assert_close(self, "final_state", final, want_final, allclose=False)

    def test_residuals_equal_fused_t0s(self):
        # The residual form (MOSAIC_GPU.md Sec. 58) on a realistic row: 64 chunks, a partial
        # last one, documents, h0, GVA; K = V = 128 (two stages)
        errs = _check_residuals(self, 1, 4090, 4, 2, 128, 128, 0.05, True,
                                (700, 1, 64, 999, 1200), seed=5, interpret=False)
        print("fused_rs residuals vs fused_t0: " + ", ".join(
            f"{k} {v:.3e}" for k, v in errs.items()))

    def test_residuals_from_state_equal_from_output(self):
        # residual_from="state" (Sec. 58.5; jax >= 0.11): bit-equal to the default form
        if not krs.TRANSPOSED_V_LOAD:
            self.skipTest("residual_from='state' needs jax >= 0.11")
        case = (1, 4090, 4, 2, 128, 128, 0.05, True, (700, 1, 64, 999, 1200))
        (q, k, v, g, beta, state, seg), t0, _ = _run_kernel(*case, seed=5, interpret=False)
        run = functools.partial(krs.chunk_delta_fused_rs_fwd_mosaic, q, k, v, t0, g, beta,
                                scale=128 ** -0.5, initial_state=state, segment_ids=seg,
                                store_h=True, store_v_new=True)
        for name, a, b in zip(("o", "final_state", "v_new", "h"), run(residual_from="state"),
                              run(), strict=True):
            self.assertTrue(bool(jnp.all(a == b)), name)

    @parameterized.named_parameters(
        ("gva_h0_dht_packed_T2048_K128_V128_stored", 1, 2048, 4, 2, 128, 128, 0.05, True, True,
         (700, 1, 64, 999), "stored"),
        ("deltanet_partial_T1000_K64_V64_t0", 2, 1000, 2, 2, 64, 64, None, False, True, None,
         "t0"),
    )
    def test_op_grads_with_rs_residuals_match_reference(self, *case):
        with _rs_residuals_on():
            vjp_test._check(self, bwd_test._pipeline_inputs(*case[:-1], seed=11), False,
                            forward="fused_rs", dh_w=case[-1])


if __name__ == "__main__":
    absltest.main()
