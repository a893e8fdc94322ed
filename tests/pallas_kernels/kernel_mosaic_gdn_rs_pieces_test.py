"""``forward="fused_rs"`` on sequence pieces (``mosaic_vjp.RS_PIECES``, MOSAIC_GPU.md Sec. 60).

On rows with too few CTAs (S2, P1) the op runs ``fused_t0``'s sequence pieces (Sec. 42): the
pieces' maps ``M_p``, their passes from zero ``X_p``, the entry states ``e_p``, then a last
launch on the pieces as rows from ``e_p``. With ``RS_PIECES`` that last launch is
``kernel_mosaic_gpu_rs.chunk_delta_fused_rs_fwd_mosaic(pieces=P)`` (with ``RS_RESIDUALS``
under differentiation its residual form: ``h`` at global chunk indices, ``v_new``).

* CI (``RsPiecesTest``, about 2 s): the resolution and the piece count with the switch on and
  off; the kernel's refusals of ``pieces``; the op's primal lowered for CUDA with the switch
  (the ``fused_rs`` kernel in place of the fused ``T0`` kernel's last launch); the op's jaxpr
  with the switch off equal to ``forward="fused_t0"``'s on such rows (the fallback, unchanged).
* ``slow`` (``RsPiecesInterpretTest``, ``PJRT_NPROC=8``): ``mosaic_vjp._fused_t0_pieces`` with
  ``rs=True`` against ``rs=False`` on the same inputs (``maps`` bit-equal; ``h`` at each piece's
  first chunk, the entry state in 16 bits, bit-equal; ``o``, the final state, ``v_new`` and
  ``h`` within the forward gate) and both against the fp32 token-serial reference: documents
  crossing piece boundaries, a document starting at a piece start, ``h0``, a partial last
  chunk, GVA; with ``MAPS_CARRY_X`` and ``PIECE_SKIP``. The op's gradients with ``RS_PIECES``
  and ``RS_RESIDUALS`` against the fp32 chunked vjp (``kernel_mosaic_gdn_vjp_test._check``);
  its primal against the reference; with ``return_residual`` against ``fused_t0``'s pieces.
* ``gpu`` (``RsPiecesGpuTest``): the compiled kernel on pieces against ``fused_t0``'s pieces
  and the reference at K = V = 128; the op's gradients with both switches.
"""

import functools
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest, parameterized

from pallas_kernels.common import mosaic_gpu
from pallas_kernels.common import mosaic_gpu_lib as mgl
from pallas_kernels.common import validation
from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu_rs as krs
from pallas_kernels.gated_delta_rule import mosaic_vjp
from tests import tolerances
from tests.pallas_kernels import kernel_mosaic_gdn_bwd_test as bwd_test
from tests.pallas_kernels import kernel_mosaic_gdn_piece_skip_test as ps_test
from tests.pallas_kernels import kernel_mosaic_gdn_t0_test as t0_test
from tests.pallas_kernels import kernel_mosaic_gdn_test as gdn_test
from tests.pallas_kernels import kernel_mosaic_gdn_vjp_test as vjp_test
from tests.pallas_kernels import kernel_mosaic_gpu_test as kmg_test

C = mgl.CHUNK
_GATE = t0_test._FWD_GATE


def _rs_pieces_on(residuals=False, **extra):
    """``RS_PIECES`` on (and ``RS_RESIDUALS`` with ``residuals``), plus other switches."""
    return mock.patch.multiple(mosaic_vjp, RS_PIECES=True, RS_RESIDUALS=residuals, **extra)


def _case(seq_len, heads, kv_heads, dk, dv, docs, decay=0.2, seed=0, h0=True):
    """``ps_test._case`` (inputs, ``T0``, ``W``, whole-row vectors) plus an ``h0``."""
    case = ps_test._case(seq_len, heads, kv_heads, dk, dv, docs, decay=decay, seed=seed)
    state = None
    if h0:
        state = 0.5 * jax.random.normal(jax.random.key(seed + 7), (1, heads, dk, dv),
                                        jnp.float32)
    return case, state


def _pieces(case, state, pieces, rs, store=True, skip=False, carry_x=False, interpret=True):
    q, k, v, g, beta, seg, t0, w, gc, docs = case
    # jitted: eager dispatch of the launches hung in the interpreter's thread pool late in a
    # long process on a 2-core host (MOSAIC_GPU.md Sec. 60.2)
    return jax.jit(functools.partial(
        mosaic_vjp._fused_t0_pieces, pieces=pieces, scale=k.shape[-1] ** -0.5,
        store_v_new=store, store_h=store, interpret=interpret, piece_skip=skip,
        carry_x=carry_x, rs=rs))(q, k, v, t0, w, g, beta, state, gc, docs)


def _check_against_fused_t0(test, case, state, pieces, dtype=jnp.bfloat16, **options):
    """``rs=True`` against ``rs=False`` and the reference (module docstring); returns the
    relative RMS errors."""
    q, k, v, g, beta, seg = case[:6]
    got = _pieces(case, state, pieces, True, **options)
    want = _pieces(case, state, pieces, False, **options)
    o, final, vn, h, maps = got
    np.testing.assert_array_equal(np.asarray(maps), np.asarray(want[4]))
    num_chunks = -(-v.shape[1] // C)
    per = num_chunks // pieces
    for p in range(pieces):  # the entry state e_p in 16 bits, the same in both
        np.testing.assert_array_equal(np.asarray(h[:, :, p * per]),
                                      np.asarray(want[3][:, :, p * per]), err_msg=f"piece {p}")
    errs = {}
    for name, a, b in zip(("o", "final_state", "v_new", "h"), got[:4], want[:4]):
        test.assertEqual((a.shape, a.dtype), (b.shape, b.dtype), name)
        errs[f"{name}/t0"] = tolerances.rel_err(a, b)
        test.assertLess(errs[f"{name}/t0"], _GATE[jnp.dtype(dtype)], name)
    ref_o, ref_final, ref_u = gdn_test._reference(q, k, v, g, beta, state, seg,
                                                  k.shape[-1] ** -0.5)
    for name, a, b, t in (("o", o, ref_o, want[0]), ("final_state", final, ref_final, want[1]),
                          ("v_new", vn, ref_u, want[2])):
        err, err_t0 = tolerances.rel_err(a, b), tolerances.rel_err(t, b)
        errs[f"{name}/ref"], errs[f"{name}/ref_t0"] = err, err_t0
        test.assertLess(err, max(_GATE[jnp.dtype(dtype)], 1.5 * err_t0), name)
    print(f"fused_rs pieces {test.id()}: " + ", ".join(f"{k} {v:.3e}" for k, v in errs.items()))
    return errs


class RsPiecesTest(parameterized.TestCase):
    """CI: resolution, refusals, the CUDA lowering, the jaxpr with the switch off."""

    def test_resolution_and_pieces(self):
        s2 = (1, 16, 128, 32768)
        self.assertFalse(mosaic_vjp.RS_PIECES)  # off by default
        with mock.patch.object(validation, "_logged", set()):
            self.assertEqual(mosaic_vjp.resolve_forward("fused_rs", *s2), "fused_t0")
        self.assertEqual(mosaic_vjp.fused_t0_pieces("fused_rs", *s2), 1)
        with _rs_pieces_on(), mock.patch.object(validation, "log_once") as log:
            self.assertEqual(mosaic_vjp.resolve_forward("fused_rs", *s2), "fused_rs")
            self.assertEqual(mosaic_vjp.fused_t0_pieces("fused_rs", *s2),
                             mosaic_vjp.fused_t0_pieces("fused_t0", *s2))
            self.assertGreater(mosaic_vjp.fused_t0_pieces("fused_rs", *s2), 1)
            self.assertEqual(mosaic_vjp.fused_t0_pieces("fused_rs", 8, 16, 128, 4096), 1)
            log.assert_not_called()
            with mock.patch.object(mosaic_vjp, "FUSED_T0_PIECES", False), \
                    mock.patch.object(validation, "_logged", set()):
                self.assertEqual(mosaic_vjp.resolve_forward("fused_rs", *s2), "three_pass")
                self.assertEqual(mosaic_vjp.fused_t0_pieces("fused_rs", *s2), 1)

    def test_refusals(self):
        q, k, v, g, beta, state, seg = t0_test._inputs(2, 128, 1, 1, 64, 64, 0.2, False, None)
        t0 = jnp.zeros(v.shape[:3] + (C,), k.dtype)
        run = functools.partial(krs.chunk_delta_fused_rs_fwd_mosaic, q, k, v, t0, g, beta,
                                scale=0.125)
        for bad in (3, 0):
            with self.assertRaisesRegex(ValueError, "pieces"):
                jax.eval_shape(lambda: run(pieces=bad))
        with self.assertRaisesRegex(ValueError, "ablation"):
            jax.eval_shape(lambda: run(pieces=2, ablation="state"))
        q2, k2, v2, g2, beta2, _, _ = t0_test._inputs(2, 100, 1, 1, 64, 64, 0.2, False, None)
        with self.assertRaisesRegex(ValueError, "whole number of chunks"):
            jax.eval_shape(lambda: krs.chunk_delta_fused_rs_fwd_mosaic(
                q2, k2, v2, jnp.zeros(v2.shape[:3] + (C,), k2.dtype), g2, beta2, scale=0.125,
                pieces=2))
        # h at global chunk indices
        out = jax.eval_shape(lambda: run(pieces=2, store_h=True, store_v_new=True))
        self.assertEqual(out[3].shape, (1, 1, 4, 64, 64))

    def test_op_lowers_with_the_rs_kernel_on_pieces(self):
        q, k, v, g, beta, h0, seg, _, _, _ = bwd_test._pipeline_inputs(
            1, 1024, 2, 1, 64, 64, 0.05, True, True, ps_test.DOCS_A)

        def primal(q, k, v, g, beta, h0):
            return mosaic_vjp.gated_delta_rule_mosaic(
                q, k, v, g, beta, initial_state=h0, segment_ids=seg, output_final_state=True,
                forward="fused_rs")

        def calls():
            with mock.patch.object(mosaic_gpu, "compute_capability", return_value=(9, 0)):
                text = jax.jit(primal).trace(q, k, v, g, beta, h0).lower(
                    lowering_platforms=("cuda",)).as_text()
            return [line for line in text.splitlines() if "custom_call @mosaic_gpu" in line]

        with _rs_pieces_on(), mock.patch.object(validation, "log_once") as log:
            on = calls()
            log.assert_not_called()
        # T0 with W, maps, summary, fused_rs on the pieces (no fused_t0 last launch)
        self.assertLen(on, 4)
        self.assertEqual(sum(krs.rs_kernel_name(3) + "_mosaic_gpu" in c for c in on), 1)
        self.assertEqual(sum("gdn_chunk_delta_fused_t0_fwd_mosaic_gpu" in c for c in on), 0)
        self.assertEqual(sum("fused_t0_fwd_summary" in c for c in on), 1)

    def test_switch_off_is_fused_t0s_jaxpr(self):
        # rows with few CTAs: fused_rs with the switch off falls back to fused_t0's pieces
        q, k, v, g, beta, h0, seg, _, _, _ = bwd_test._pipeline_inputs(
            1, 1024, 2, 1, 64, 64, 0.05, True, True, ps_test.DOCS_A)

        def jaxpr(forward):
            def primal(q, k, v, g, beta, h0):
                return mosaic_vjp.gated_delta_rule_mosaic(
                    q, k, v, g, beta, initial_state=h0, segment_ids=seg,
                    output_final_state=True, forward=forward)
            with mock.patch.object(validation, "_logged", set()):
                return str(jax.make_jaxpr(primal)(q, k, v, g, beta, h0))

        self.assertEqual(jaxpr("fused_rs"), jaxpr("fused_t0"))


# B, T, H, Hk, K, V, document lengths, decay, pieces
_KERNEL_CASES = (
    # docs start at 0, 300, 512 (piece 2's start), 700: across the boundaries at 256 and 768;
    # P = 4 pieces of 4 chunks, the last chunk partial (T 1000); GVA; h0
    ("gva_h0_docs_at_piece_start_partial_T1000_K64_V64", 1000, 2, 1, 64, 64, ps_test.DOCS_A,
     0.2, 4),
    # K 128 / V 64, no documents, DeltaNet-free strong decay, P = 2
    ("h0_nodocs_T512_K128_V64", 512, 1, 1, 128, 64, None, 1.0, 2),
)


@pytest.mark.slow
class RsPiecesInterpretTest(parameterized.TestCase):
    """Interpreted (``PJRT_NPROC=8``)."""

    @parameterized.named_parameters(*_KERNEL_CASES)
    def test_pieces_equal_fused_t0s(self, seq_len, heads, kv_heads, dk, dv, docs, decay,
                                    pieces):
        case, state = _case(seq_len, heads, kv_heads, dk, dv, docs, decay=decay, seed=3)
        _check_against_fused_t0(self, case, state, pieces)

    def test_maps_carry_x_and_piece_skip(self):
        case, state = _case(1024, 2, 1, 64, 64, ps_test.DOCS_B, seed=4)
        _check_against_fused_t0(self, case, state, 4, skip=True, carry_x=True)

    def test_op_grads_match_reference(self):
        # T 1000 at B 1, H 2: rows with few CTAs (P = 4); documents, h0, dht, GVA
        args = bwd_test._pipeline_inputs(1, 1000, 2, 1, 64, 64, 0.05, True, True,
                                         (300, 212, 188))
        with _rs_pieces_on(residuals=True), mock.patch.object(validation, "log_once") as log:
            self.assertGreater(mosaic_vjp.fused_t0_pieces("fused_rs", 1, 2, 64, 1000), 1)
            vjp_test._check(self, args, True, forward="fused_rs")
            log.assert_not_called()  # no fallback: fused_rs's residual form on the pieces

    def test_op_primal_matches_reference(self):
        q, k, v, g, beta, h0, seg, _, _, _ = bwd_test._pipeline_inputs(
            1, 1000, 2, 1, 64, 64, 0.05, True, True, (256, 300, 200))
        with _rs_pieces_on():  # jitted: eager dispatch of the pieces' launches once hung
            # in the interpreter's thread pool on a 2-core host
            o, final = jax.jit(lambda *a: mosaic_vjp.gated_delta_rule_mosaic(
                *a, initial_state=h0, segment_ids=seg, output_final_state=True,
                forward="fused_rs", interpret=True))(q, k, v, g, beta)
        want_o, want_final, _ = gdn_test._reference(q, k, v, g, beta, h0, seg, 64 ** -0.5)
        gdn_test._assert_close(self, "o", o, want_o, allclose=False)
        gdn_test._assert_close(self, "final_state", final, want_final, allclose=False)

    def test_op_return_residual_equals_fused_t0s(self):
        # the primal with u (store_v_new alone: kernel ..._vn on the pieces) against fused_t0's
        # pieces on the same inputs
        q, k, v, g, beta, h0, seg, _, _, _ = bwd_test._pipeline_inputs(
            1, 1000, 2, 1, 64, 64, 0.05, True, True, (256, 300, 200))

        def run(forward):
            return jax.jit(lambda *a: mosaic_vjp.gated_delta_rule_mosaic(
                *a, initial_state=h0, segment_ids=seg, output_final_state=True,
                return_residual=True, forward=forward, interpret=True))(q, k, v, g, beta)

        with _rs_pieces_on(residuals=True), mock.patch.object(validation, "log_once") as log:
            got = run("fused_rs")
            log.assert_not_called()
            want = run("fused_t0")
        for name, a, b in zip(("o", "final_state", "u"), got, want, strict=True):
            self.assertEqual((a.shape, a.dtype), (b.shape, b.dtype), name)
            self.assertLess(tolerances.rel_err(a, b), _GATE[jnp.dtype(jnp.bfloat16)], name)


@pytest.mark.gpu
class RsPiecesGpuTest(kmg_test.HopperTestCase):
    """The compiled kernel on pieces (K = V = 128, GVA, documents, h0) and the op."""

    def test_pieces_equal_fused_t0s(self):
        for docs, skip in ((None, False), (ps_test.DOCS_A, False), (ps_test.DOCS_B, True)):
            for carry_x in (False, True):
                case, state = _case(1024, 4, 2, 128, 128, docs, seed=2)
                _check_against_fused_t0(self, case, state, 4, skip=skip, carry_x=carry_x,
                                        interpret=False)

    def test_op_grads_match_reference(self):
        args = bwd_test._pipeline_inputs(1, 4000, 4, 2, 128, 128, 0.05, True, True,
                                         (768, 1, 255, 900), seed=6)
        with _rs_pieces_on(residuals=True):
            self.assertGreater(mosaic_vjp.fused_t0_pieces("fused_rs", 1, 4, 128, 4000), 1)
            vjp_test._check(self, args, False, forward="fused_rs")


if __name__ == "__main__":
    absltest.main()
