"""``gated_delta_rule_mosaic``, the differentiable Mosaic GPU Gated DeltaNet / DeltaNet op.

``pallas_kernels/gated_delta_rule/mosaic_vjp.py`` wraps the Mosaic forward stages in a
``jax.custom_vjp`` whose backward chains the four Mosaic backward stages. The reference is
``jax.vjp`` of the fp32 XLA chunk form
:func:`pallas_kernels.gated_delta_rule.chunked.gated_delta_rule_chunked` on the same bf16
inputs (``q, k`` repeated to the value heads, their gradients summed over each GVA group),
with the same random cotangents of ``o`` and of the final state; every gradient must be within
a relative RMS error of 5e-3 (``dg``, ``dbeta`` 1e-2: the pipeline tests' gates).

``InterpretTest`` is marked ``slow`` (interpreted Mosaic GPU kernels can hang instead of
failing, ``pallas_kernels/common/MOSAIC_GPU.md``); ``LoweringTest`` exports the op and its
gradient for CUDA with ``jax.export`` (two variants; ``LoweringSlowTest``, ``slow``, the other
fourteen); ``GpuTest`` (marked ``gpu``) runs the compiled kernels
on a Hopper GPU.
"""

from unittest import mock

import jax
import jax.numpy as jnp
import pytest
from absl.testing import absltest, parameterized

from pallas_kernels.common import mosaic_gpu
from pallas_kernels.gated_delta_rule import mosaic_vjp
from tests import tolerances
from tests.pallas_kernels import kernel_mosaic_gdn_bwd_test as bwd_test
from tests.pallas_kernels import kernel_mosaic_gpu_test as kmg_test

_NAMES = ("dq", "dk", "dv", "dg", "dbeta", "dh0")


def _op_grads(q, k, v, g, beta, state, seg, do, dht, scale, interpret, **options):
    """``(dq, dk, dv, dg, dbeta, dh0)`` by ``jax.vjp`` of ``gated_delta_rule_mosaic``
    (``options``: its ``forward=``, ``backward=``)."""

    def fn(q, k, v, g, beta, h0):
        return mosaic_vjp.gated_delta_rule_mosaic(q, k, v, g, beta, scale=scale,
                                                  initial_state=h0, segment_ids=seg,
                                                  output_final_state=True,
                                                  interpret=interpret, **options)

    (o, final), vjp = jax.vjp(fn, q, k, v, g, beta, state)
    if dht is None:
        dht = jnp.zeros_like(final)
    return o, final, vjp((do.astype(o.dtype), dht))


def _check(test, case_args, interpret, **options):
    q, k, v, g, beta, state, seg, do, dht, scale = case_args
    _, _, got = _op_grads(*case_args, interpret, **options)
    want = bwd_test._chunked_grads(*case_args)
    for name, x, y, inp in zip(_NAMES, got, want, (q, k, v, g, beta, state)):
        if inp is None:
            test.assertIsNone(x, msg=name)
            continue
        test.assertEqual((x.shape, x.dtype), (inp.shape, inp.dtype), msg=name)
        err = tolerances.rel_err(x.astype(jnp.float32), y)
        test.assertLess(err, 1e-2 if name in ("dg", "dbeta") else 5e-3,
                        msg=f"{name}: relative RMS error {err:.2e}")


# Slow (out of CI): see the module docstring. The mark is on the class: absl's parameterized
# copies of a method do not keep a method-level mark.
@pytest.mark.slow
class InterpretTest(parameterized.TestCase):

    @parameterized.named_parameters(
        # B, T, H, Hk, K, V, decay (None: DeltaNet), h0, dht, document lengths
        ("gva_h0_dht_packed_partial_T150_K64_V64", 1, 150, 2, 1, 64, 64, 0.05, True, True,
         (64, 36, 30)),
        ("deltanet_dht_T128_K64_V64", 1, 128, 1, 1, 64, 64, None, False, True, None),
        # no GVA: dq, dk, dv leave the kernels in bf16 (MOSAIC_GPU.md Sec. 27)
        ("gated_h0_packed_partial_T150_K64_V64", 1, 150, 2, 2, 64, 64, 0.05, True, False,
         (64, 36, 30)),
    )
    def test_vjp_matches_chunked_vjp(self, *case):
        _check(self, bwd_test._pipeline_inputs(*case), True, backward="split")


# Slow (out of CI), as InterpretTest: backward="fused" (chunk_bwd_fused_mosaic, MOSAIC_GPU.md
# Sec. 31) with T0 recomputed (three_pass) and T0 from the forward (fused_t0), and "fused_ws"
# (its three-warpgroup form; run with PJRT_NPROC=8, see kernel_mosaic_gdn_bwd_fused_test.py).
@pytest.mark.slow
class FusedBackwardInterpretTest(parameterized.TestCase):

    @parameterized.named_parameters(
        # B, T, H, Hk, K, V, decay (None: DeltaNet), h0, dht, document lengths, forward
        ("gva_h0_dht_packed_partial_T150_K64_V64", 1, 150, 2, 1, 64, 64, 0.05, True, True,
         (64, 36, 30), "three_pass"),
        ("deltanet_dht_T128_K64_V64", 1, 128, 1, 1, 64, 64, None, False, True, None,
         "three_pass"),
        ("gated_h0_packed_partial_T150_K64_V64_fused_t0", 1, 150, 2, 2, 64, 64, 0.05, True,
         False, (64, 36, 30), "fused_t0"),
    )
    def test_vjp_matches_chunked_vjp(self, *case):
        _check(self, bwd_test._pipeline_inputs(*case[:-1]), True, forward=case[-1],
               backward="fused")

    def test_three_warpgroups_match_chunked_vjp(self):
        case = (1, 150, 2, 1, 64, 64, 0.05, True, True, (64, 36, 30))
        _check(self, bwd_test._pipeline_inputs(*case), True, backward="fused_ws")

    @parameterized.named_parameters(
        # B, T, H, Hk, K, V, decay (None: DeltaNet), h0, dht, document lengths, seed
        ("gva4_1_h0_dht_packed_partial_T130_K64_V64", 1, 130, 4, 1, 64, 64, 0.1, True, True,
         (70, 1, 20), 3),
        ("gva2_deltanet_B2_partial_T100_K64_V128", 2, 100, 4, 2, 64, 128, None, False, True,
         None, 4),
    )
    def test_gva_loop_matches_chunked_vjp(self, *case):
        """The default backward with GVA at K = 64: ``dq``, ``dk`` group-summed in the fused
        kernel (its GVA loop, MOSAIC_GPU.md Sec. 33), random inputs, against ``jax.vjp`` of
        the chunk form (``q, k`` repeated, their gradients group-summed in fp32)."""
        _check(self, bwd_test._pipeline_inputs(*case[:-1], seed=case[-1]), True)


def _check_fold_equals_separate(test, case_args, interpret, **options):
    """``dv_local="fold"`` against ``"separate"`` with ``return_residual`` and a random ``du``:
    the same roundings, so every output and gradient agrees to fp32 summation order."""
    q, k, v, g, beta, state, seg, do, dht, scale = case_args
    du = jax.random.normal(jax.random.key(21), v.shape).astype(v.dtype)

    def grads(dv_local):
        def fn(q, k, v, g, beta, h0):
            return mosaic_vjp.gated_delta_rule_mosaic(
                q, k, v, g, beta, scale=scale, initial_state=h0, segment_ids=seg,
                output_final_state=True, return_residual=True, interpret=interpret,
                dv_local=dv_local, **options)

        out, vjp = jax.vjp(fn, q, k, v, g, beta, state)
        return out, vjp((do.astype(out[0].dtype),
                         jnp.zeros_like(out[1]) if dht is None else dht, du))

    (o_f, s_f, u_f), got = grads("fold")
    (o_s, s_s, u_s), want = grads("separate")
    for name, x, y in zip(("o", "final_state", "u") + _NAMES, (o_f, s_f, u_f) + tuple(got),
                          (o_s, s_s, u_s) + tuple(want)):
        if y is None:
            test.assertIsNone(x, msg=name)
            continue
        err = tolerances.rel_err(x.astype(jnp.float32), y.astype(jnp.float32))
        test.assertLess(err, 1e-6, msg=f"{name}: fold vs separate, relative RMS {err:.2e}")


# Slow (out of CI), as InterpretTest: dv_local="fold" (MOSAIC_GPU.md Sec. 32), the reverse state
# pass forming dv_local (three warpgroups: run with PJRT_NPROC=8, as every multi-launch
# interpreted test).
@pytest.mark.slow
class FoldDvLocalInterpretTest(parameterized.TestCase):

    @parameterized.named_parameters(
        # B, T, H, Hk, K, V, decay (None: DeltaNet), h0, dht, document lengths, backward
        ("gva_h0_dht_packed_partial_T150_K64_V64_fused_ws", 1, 150, 2, 1, 64, 64, 0.05, True,
         True, (64, 36, 30), "fused_ws"),
        ("deltanet_dht_T128_K64_V64_split", 1, 128, 1, 1, 64, 64, None, False, True, None,
         "split"),
    )
    def test_vjp_matches_chunked_vjp(self, *case):
        _check(self, bwd_test._pipeline_inputs(*case[:-1]), True, backward=case[-1],
               dv_local="fold")

    def test_fold_equals_separate_with_residual(self):
        case = (1, 150, 2, 1, 64, 64, 0.05, True, True, (64, 36, 30))
        _check_fold_equals_separate(self, bwd_test._pipeline_inputs(*case), True,
                                    backward="fused_ws")


def _check_dh_w_t0(test, case_args, interpret, **options):
    """``dh_w="t0"`` (MOSAIC_GPU.md Sec. 51: the reverse pass forms ``W`` from ``T0``) with
    ``forward="fused_t0"`` on whole rows, against the fp32 chunked vjp (:func:`_check`'s gates)
    and against ``dh_w="stored"``: ``o`` and the final state equal (the forward is the same
    but for the ``T0`` kernel's ``W``), the gradients within 3e-3 relative RMS (``W`` from
    ``T0`` rounded to bf16 rather than the fp32 ``T0``: one more rounding of ``T0`` in ``W``)."""
    q, k, v, g, beta, state, seg, do, dht, scale = case_args
    batch, seq_len, heads, dv = v.shape
    options = dict(options, forward="fused_t0")
    with mock.patch.object(mosaic_vjp, "FUSED_T0_FALLBACK", False):
        test.assertEqual(mosaic_vjp.resolve_dh_w("t0", "fused_t0", "fold", batch, heads, dv,
                                                 seq_len), "t0")
        o_t, s_t, got = _op_grads(*case_args, interpret, dh_w="t0", **options)
        o_s, s_s, stored = _op_grads(*case_args, interpret, dh_w="stored", **options)
    want = bwd_test._chunked_grads(*case_args)
    for name, x, y in (("o", o_t, o_s), ("final_state", s_t, s_s)):
        err = tolerances.rel_err(x.astype(jnp.float32), y.astype(jnp.float32))
        test.assertLess(err, 1e-6, msg=f"{name}: t0 vs stored, relative RMS {err:.2e}")
    for name, x, y, z, inp in zip(_NAMES, got, want, stored, (q, k, v, g, beta, state)):
        if inp is None:
            test.assertIsNone(x, msg=name)
            continue
        test.assertEqual((x.shape, x.dtype), (inp.shape, inp.dtype), msg=name)
        err = tolerances.rel_err(x.astype(jnp.float32), y)
        err_s = tolerances.rel_err(z.astype(jnp.float32), y)
        diff = tolerances.rel_err(x.astype(jnp.float32), z.astype(jnp.float32))
        print(f"dh_w=t0 {name}: vs chunked {err:.2e} (stored {err_s:.2e}), vs stored {diff:.2e}")
        test.assertLess(err, 1e-2 if name in ("dg", "dbeta") else 5e-3,
                        msg=f"{name}: relative RMS error {err:.2e}")
        test.assertLess(diff, 3e-3, msg=f"{name}: t0 vs stored, relative RMS {diff:.2e}")


# B, T, H, Hk, K, V, decay (None: DeltaNet), h0, dht, document lengths, backward
_DH_W_CASES = (
    ("gva_h0_dht_packed_partial_T150_K64_V64_fused_ws", 1, 150, 2, 1, 64, 64, 0.05, True,
     True, (64, 36, 30), "fused_ws"),
    ("deltanet_dht_T128_K64_V64_split", 1, 128, 1, 1, 64, 64, None, False, True, None,
     "split"),
)


# Slow (out of CI), as FoldDvLocalInterpretTest: dh_w="t0" (MOSAIC_GPU.md Sec. 51).
@pytest.mark.slow
class DhWT0InterpretTest(parameterized.TestCase):

    @parameterized.named_parameters(*_DH_W_CASES)
    def test_dh_w_t0_matches_chunked_vjp_and_stored(self, *case):
        _check_dh_w_t0(self, bwd_test._pipeline_inputs(*case[:-1]), True, backward=case[-1])


@pytest.mark.gpu
class GpuTest(kmg_test.HopperTestCase):
    """The compiled kernels (wgmma, TMA) under ``jax.vjp`` against the fp32 autodiff
    reference."""

    @parameterized.named_parameters(
        ("gva_h0_dht_packed_T2048_K128_V128", 1, 2048, 4, 2, 128, 128, 0.05, True, True,
         (700, 1, 64, 999)),
        ("deltanet_partial_T1000_K64_V64", 2, 1000, 2, 2, 64, 64, None, False, True, None),
        # no GVA, gated: the bf16 dq, dk, dv kernel outputs (MOSAIC_GPU.md Sec. 27)
        ("gated_h0_dht_packed_T2048_K128_V128", 1, 2048, 2, 2, 128, 128, 0.05, True, True,
         (700, 1, 64, 999)),
        ("strong_decay_h0_partial_T1000_K64_V128", 2, 1000, 2, 1, 64, 128, 5.0, True, False,
         (10, 54, 500)),
    )
    def test_vjp_matches_chunked_vjp(self, *case):
        _check(self, bwd_test._pipeline_inputs(*case, seed=11), False, backward="split")

    @parameterized.named_parameters(
        # B, T, H, Hk, K, V, decay (None: DeltaNet), h0, dht, document lengths
        ("gva_h0_dht_packed_T2048_K128_V128", 1, 2048, 4, 2, 128, 128, 0.05, True, True,
         (700, 1, 64, 999)),
        ("deltanet_partial_T1000_K64_V64", 2, 1000, 2, 2, 64, 64, None, False, True, None),
    )
    def test_fp16_defaults_match_chunked_vjp(self, *case):
        """fp16 ``q, k, v`` through the op's default forward and backward, which GDN's
        ``implementation="auto"`` runs on Hopper since 2026-12-06f (the other cases here are
        bf16; fp16 was covered kernel by kernel only)."""
        q, k, v, g, beta, state, seg, do, dht, scale = bwd_test._pipeline_inputs(*case, seed=13)
        q, k, v, do = (x.astype(jnp.float16) for x in (q, k, v, do))
        self.assertEqual(
            mosaic_gpu.choose_implementation("gated_delta_rule", None, ("chunked",), (q, k, v),
                                             (q.shape[-1], v.shape[-1]), 64, q.shape[1]),
            "mosaic_gpu")
        _check(self, (q, k, v, g, beta, state, seg, do, dht, scale), False)

    @parameterized.named_parameters(*[
        (f"{name}_{backward}", backward, *case)
        for name, *case in (
            ("gva_h0_dht_packed_T2048_K128_V128", 1, 2048, 4, 2, 128, 128, 0.05, True, True,
             (700, 1, 64, 999), "three_pass"),
            ("deltanet_partial_T1000_K64_V64_fused_t0", 2, 1000, 2, 2, 64, 64, None, False,
             True, None, "fused_t0"))
        for backward in ("fused", "fused_ws")])
    def test_fused_backward_matches_chunked_vjp(self, backward, *case):
        # rows of 4 CTAs: the fused_t0 case would run three_pass without the patch
        # (mosaic_vjp.resolve_forward)
        with mock.patch.object(mosaic_vjp, "FUSED_T0_FALLBACK", False):
            _check(self, bwd_test._pipeline_inputs(*case[:-1], seed=11), False,
                   forward=case[-1], backward=backward)

    @parameterized.named_parameters(
        # B, T, H, Hk, K, V, decay (None: DeltaNet), h0, dht, document lengths. P = 8 pieces
        # (8 CTAs a launch, 32 chunks), a document starting on a piece edge (token 768); P = 4
        # (8 CTAs, 16 chunks, the last piece padded) with strong decay
        ("gva_h0_dht_packed_edge_T2048_K128_V128", 1, 2048, 4, 2, 128, 128, 0.05, True, True,
         (768, 1, 255, 1024)),
        ("strong_decay_h0_partial_T1000_K64_V128", 2, 1000, 2, 1, 64, 128, 5.0, True, False,
         (10, 54, 500)),
    )
    def test_fused_t0_pieces_matches_chunked_vjp(self, *case):
        """The default forward ``fused_t0`` on rows with few CTAs as sequence pieces
        (``mosaic_vjp.FUSED_T0_PIECES``, MOSAIC_GPU.md Sec. 42), default backward."""
        args = bwd_test._pipeline_inputs(*case, seed=17)
        with mock.patch.object(mosaic_vjp, "FUSED_T0_PIECES", True):
            batch, seq_len, heads, dv = args[2].shape
            self.assertGreater(mosaic_vjp.fused_t0_pieces("fused_t0", batch, heads, dv,
                                                          seq_len), 1)
            _check(self, args, False)

    @parameterized.named_parameters(
        # B, T, H, Hk, K, V, decay (None: DeltaNet), h0, dht, document lengths
        ("gva2_h0_dht_packed_T2048_K64_V64", 1, 2048, 16, 8, 64, 64, 0.05, True, True,
         (700, 1, 64, 999)),
        ("gva4_deltanet_partial_T1000_K64_V128", 2, 1000, 8, 2, 64, 128, None, False, True,
         None),
    )
    def test_gva_loop_matches_chunked_vjp(self, *case):
        """The default backward (``fused_ws``) with GVA at K = 64: the fused kernel's GVA loop
        (MOSAIC_GPU.md Sec. 33) on the compiled kernels; the first case has the presets' dims
        and group (K = V = 64, ``G = 2``)."""
        _check(self, bwd_test._pipeline_inputs(*case, seed=11), False)

    @parameterized.named_parameters(
        ("gva_h0_dht_packed_T2048_K128_V128_fused_ws", 1, 2048, 4, 2, 128, 128, 0.05, True,
         True, (700, 1, 64, 999), "fused_ws"),
        ("deltanet_partial_T1000_K64_V64_split", 2, 1000, 2, 2, 64, 64, None, False, True, None,
         "split"),
    )
    def test_fold_dv_local_matches_chunked_vjp(self, *case):
        """``dv_local="fold"`` (MOSAIC_GPU.md Sec. 32), and equal to ``"separate"`` with a
        residual cotangent (both cases pick sequence pieces: P = 8 and 4)."""
        args = bwd_test._pipeline_inputs(*case[:-1], seed=11)
        _check(self, args, False, backward=case[-1], dv_local="fold")
        _check_fold_equals_separate(self, args, False, backward=case[-1])

    @parameterized.named_parameters(
        ("gva_h0_dht_packed_T2048_K128_V128_fused_ws", 1, 2048, 4, 2, 128, 128, 0.05, True,
         True, (700, 1, 64, 999), "fused_ws"),
        ("deltanet_partial_T1000_K64_V64_split", 2, 1000, 2, 2, 64, 64, None, False, True, None,
         "split"),
    )
    def test_dh_w_t0_matches_chunked_vjp_and_stored(self, *case):
        """``dh_w="t0"`` (MOSAIC_GPU.md Sec. 51) with ``forward="fused_t0"`` on whole rows (the
        fallback off): against the fp32 reference and ``dh_w="stored"``."""
        _check_dh_w_t0(self, bwd_test._pipeline_inputs(*case[:-1], seed=11), False,
                       backward=case[-1])


def _check_dh_w_t0_exports(test, dk, dv, deltanet, backward="fused_ws", forward="fused_t0"):
    """``jax.grad`` through the op with ``forward="fused_t0"``, ``dh_w="t0"`` exports four
    kernels: the plain ``T0`` kernel (no ``_w``: no ``W`` written), the fused forward, the
    reverse pass forming ``W`` (``gdn_chunk_delta_dh_fold_t0``) and the fused backward; no
    XLA ``dot_general``. ``forward="fused_rs"`` (without ``RS_RESIDUALS``) exports the same:
    under differentiation it runs ``"fused_t0"``, which keeps ``T0``."""
    q, k, v, g, beta, state, seg, _, _, scale = bwd_test._pipeline_inputs(
        1, 200, 2, 1, dk, dv, None if deltanet else 0.2, True, True, (70, 30))

    def loss(q, k, v, g, beta, h0, seg):
        o, final = mosaic_vjp.gated_delta_rule_mosaic(
            q, k, v, g, beta, scale=scale, initial_state=h0, segment_ids=seg,
            output_final_state=True, forward=forward, backward=backward, dh_w="t0")
        return jnp.sum(o.astype(jnp.float32) ** 2) + jnp.sum(final)

    argnums = (0, 1, 2, 4, 5) if deltanet else (0, 1, 2, 3, 4, 5)
    with mock.patch.object(mosaic_vjp, "FUSED_T0_FALLBACK", False):  # whole rows
        fn = jax.jit(jax.grad(loss, argnums=argnums))
        exported = jax.export.export(fn, platforms=["cuda"])(q, k, v, g, beta, state, seg)
    text = exported.mlir_module()
    calls = [line for line in text.splitlines() if "custom_call @mosaic_gpu" in line]
    test.assertEqual(len(calls), 4)  # len: a failing list would print whole kernels
    for name in ("gdn_chunk_kkt_inverse_subst_split\\00", "gdn_chunk_delta_fused_t0_fwd",
                 "gdn_chunk_delta_dh_fold_t0\\00", "gdn_chunk_bwd_fused_ws\\00"):
        test.assertEqual(sum(name in c for c in calls), 1, msg=name)
    test.assertNotIn("gdn_chunk_kkt_inverse_subst_split_w", text)  # no W write
    test.assertNotIn("dot_general", text)
    want = [x.shape for x in (q, k, v, g, beta, state) if x is not None]
    test.assertEqual([a.shape for a in exported.out_avals], want)


def _check_grad_exports(test, dk, dv, deltanet, gva, backward="split", dv_local="separate"):
    # The three-pass forward, named (the op's default is "fused_t0" since MOSAIC_GPU.md Sec.
    # 38.1; its exports are kernel_mosaic_gdn_t0_test.py's and mosaic_gpu_dispatch_test.py's).
    # Without GVA dq, dk, dv leave the kernels in bf16; with it ("split") dk (and dq at
    # K = 128) go out in fp32 for XLA's group sum, dq at K = 64 in bf16 from stage 3's GVA loop
    # (MOSAIC_GPU.md Sec. 27, 27.5); "fused_ws" at K = 64 sums both in its GVA loop (Sec. 33):
    # all kernel variants are lowered.
    q, k, v, g, beta, state, seg, _, _, scale = bwd_test._pipeline_inputs(
        1, 200, 2, 1 if gva else 2, dk, dv, None if deltanet else 0.2, True, True, (70, 30))

    def loss(q, k, v, g, beta, h0, seg):
        o, final = mosaic_vjp.gated_delta_rule_mosaic(
            q, k, v, g, beta, scale=scale, initial_state=h0, segment_ids=seg,
            output_final_state=True, forward="three_pass", backward=backward,
            dv_local=dv_local)
        return jnp.sum(o.astype(jnp.float32) ** 2) + jnp.sum(final)

    argnums = (0, 1, 2, 4, 5) if deltanet else (0, 1, 2, 3, 4, 5)
    fn = jax.jit(jax.grad(loss, argnums=argnums))
    exported = jax.export.export(fn, platforms=["cuda"])(q, k, v, g, beta, state, seg)
    text = exported.mlir_module()
    # forward: WY, state pass, read-out; backward: dv_local, reverse pass, then grads and WY
    # bwd ("split") or T0 and the fused kernel ("fused"); dv_local="fold": no dv_local kernel
    fold = dv_local == "fold"
    test.assertEqual(text.count("custom_call @mosaic_gpu"), 6 if fold else 7)
    test.assertEqual("gdn_chunk_dv_local" in text, not fold)
    test.assertEqual("gdn_chunk_delta_dh_fold" in text, fold)
    fused = {"fused": "gdn_chunk_bwd_fused\\00", "fused_ws": "gdn_chunk_bwd_fused_ws\\00"}
    test.assertIn(fused.get(backward, "gdn_chunk_wy_bwd"), text)
    if backward == "split":
        test.assertNotIn("gdn_chunk_bwd_fused", text)
    else:
        test.assertNotIn("gdn_chunk_wy_bwd", text)
    want = [x.shape for x in (q, k, v, g, beta, state) if x is not None]
    test.assertEqual([a.shape for a in exported.out_avals], want)


# Export variants: CI keeps two (K = V = 64 DeltaNet with GVA, K = V = 128 gated without);
# LoweringSlowTest runs the other fourteen.
_EXPORT_CI, _EXPORT_SLOW = kmg_test.split_variants(
    [dict(dk=64, dv=64, deltanet=True, gva=True),
     dict(dk=128, dv=128, deltanet=False, gva=False)],
    dk=(64, 128), dv=(64, 128), deltanet=(False, True), gva=(True, False))


class LoweringTest(parameterized.TestCase):
    """The op and its backward export for CUDA on any host (the whole Pallas-to-Mosaic-GPU
    lowering of the three forward and four backward kernels runs)."""

    @parameterized.named_parameters(*_EXPORT_CI)
    def test_grad_exports_for_cuda(self, **variant):
        _check_grad_exports(self, **variant)

    def test_fused_backward_grad_exports_for_cuda(self):
        """``backward="fused"`` and ``"fused_ws"``, K = V = 128 gated with GVA (the other
        variants of the kernel are ``kernel_mosaic_gdn_bwd_fused_test.py``'s)."""
        for backward in ("fused", "fused_ws"):
            _check_grad_exports(self, dk=128, dv=128, deltanet=False, gva=True,
                                backward=backward)

    def test_fold_dv_local_grad_exports_for_cuda(self):
        """``dv_local="fold"`` (MOSAIC_GPU.md Sec. 32): six kernels, no ``gdn_chunk_dv_local``;
        K = V = 128 gated with GVA under ``fused_ws``, K = V = 64 DeltaNet under ``split``."""
        _check_grad_exports(self, dk=128, dv=128, deltanet=False, gva=True, backward="fused_ws",
                            dv_local="fold")
        _check_grad_exports(self, dk=64, dv=64, deltanet=True, gva=False, dv_local="fold")

    def test_dh_w_t0_grad_exports_for_cuda(self):
        """``dh_w="t0"`` (MOSAIC_GPU.md Sec. 51): the ``T0`` kernel writes no ``W``; K = V = 128
        gated, K = V = 64 DeltaNet."""
        _check_dh_w_t0_exports(self, dk=128, dv=128, deltanet=False)
        _check_dh_w_t0_exports(self, dk=64, dv=64, deltanet=True)

    def test_dh_w_t0_with_the_default_forward_exports_for_cuda(self):
        """The default forward, ``"fused_rs"`` (MOSAIC_GPU.md Sec. 63), falls back to
        ``"fused_t0"`` under differentiation and keeps ``dh_w="t0"`` there (before 2026-12-08
        ``resolve_dh_w`` gave ``"stored"`` for it without ``RS_RESIDUALS``)."""
        self.assertEqual(mosaic_vjp.DEFAULT_FORWARD, "fused_rs")
        self.assertFalse(mosaic_vjp.RS_RESIDUALS)
        self.assertEqual(mosaic_vjp.resolve_dh_w("t0", "fused_rs", "fold", 8, 16, 128, 4096),
                         "t0")
        with mock.patch.object(mosaic_vjp, "RS_PIECES", True):  # S2 as pieces: "stored"
            self.assertEqual(
                mosaic_vjp.resolve_dh_w("t0", "fused_rs", "fold", 1, 16, 128, 32768), "stored")
        _check_dh_w_t0_exports(self, dk=64, dv=64, deltanet=False,
                               forward=mosaic_vjp.DEFAULT_FORWARD)


# Slow (out of CI): the other K, V, gate and GVA combinations of LoweringTest (1.9 to 2.4 s
# each, about 30 s for the 14: seven kernels each). The mark is on the class: absl's
# parameterized copies of a method do not keep a method-level mark.
@pytest.mark.slow
class LoweringSlowTest(parameterized.TestCase):

    @parameterized.named_parameters(*_EXPORT_SLOW)
    def test_grad_exports_for_cuda(self, **variant):
        _check_grad_exports(self, **variant)


# Slow (out of CI): jax.grad of the op with backward="fused" and "fused_ws" at every K, V, gate
# and GVA combination (2 to 3 s each, 32 in all); LoweringTest keeps one of each in CI.
_, _EXPORT_FUSED = kmg_test.split_variants(
    [], dk=(64, 128), dv=(64, 128), deltanet=(False, True), gva=(True, False),
    backward=("fused", "fused_ws"))


@pytest.mark.slow
class FusedLoweringSlowTest(parameterized.TestCase):

    @parameterized.named_parameters(*_EXPORT_FUSED)
    def test_grad_exports_for_cuda(self, **variant):
        _check_grad_exports(self, **variant)


class ValidationTest(absltest.TestCase):

    def test_rejects_bad_beta(self):
        q, k, v, g, beta, *_ = bwd_test._pipeline_inputs(1, 64, 2, 1, 64, 64, 0.1, False, False,
                                                         None)
        with self.assertRaisesRegex(ValueError, "beta must be"):
            mosaic_vjp.gated_delta_rule_mosaic(q, k, v, g, beta[..., :1])
        with self.assertRaisesRegex(ValueError, "backward must be"):
            mosaic_vjp.gated_delta_rule_mosaic(q, k, v, g, beta, backward="merged")
        with self.assertRaisesRegex(ValueError, "dv_local must be one of"):
            mosaic_vjp.gated_delta_rule_mosaic(q, k, v, g, beta, dv_local="folded")
        self.assertEqual(mosaic_vjp.DEFAULT_DV_LOCAL, "fold")  # MOSAIC_GPU.md Sec. 32.2
        with self.assertRaisesRegex(ValueError, "dh_w must be one of"):
            mosaic_vjp.gated_delta_rule_mosaic(q, k, v, g, beta, dh_w="w")
        self.assertEqual(mosaic_vjp.DEFAULT_DH_W, "stored")  # MOSAIC_GPU.md Sec. 51
        # "t0" only with the fold and a fused T0 forward on whole rows (B 8, T 4096, H 16: S1)
        resolve = mosaic_vjp.resolve_dh_w
        self.assertEqual(resolve("t0", "fused_t0", "fold", 8, 16, 128, 4096), "t0")
        self.assertEqual(resolve("t0", "fused_t0_split", "fold", 8, 16, 128, 4096), "t0")
        self.assertEqual(resolve("t0", "fused_t0", "separate", 8, 16, 128, 4096), "stored")
        self.assertEqual(resolve("t0", "three_pass", "fold", 8, 16, 128, 4096), "stored")
        self.assertEqual(resolve("stored", "fused_t0", "fold", 8, 16, 128, 4096), "stored")
        if mosaic_vjp.FUSED_T0_FALLBACK and mosaic_vjp.FUSED_T0_PIECES:  # S2: pieces
            self.assertEqual(resolve("t0", "fused_t0", "fold", 1, 16, 128, 32768), "stored")
        self.assertEqual(mosaic_vjp.DEFAULT_BACKWARD, "fused_ws")  # MOSAIC_GPU.md Sec. 31.8
        self.assertEqual(mosaic_vjp.DEFAULT_FORWARD, "fused_rs")  # MOSAIC_GPU.md Sec. 63
        with self.assertRaisesRegex(ValueError, "forward must be one of"):
            mosaic_vjp.gated_delta_rule_mosaic(q, k, v, g, beta, forward="fused_t1")

    def test_rejects_bad_initial_state_on_every_path(self):
        # B 2, T 512, H 1, V 64: 2 CTAs, so "fused_t0" runs as sequence pieces (Sec. 42), whose
        # entry-state loop would otherwise fail with a shape error of its own
        q, k, v, g, beta, *_ = bwd_test._pipeline_inputs(2, 512, 1, 1, 64, 64, 0.1, False, False,
                                                         None)
        self.assertGreater(mosaic_vjp.fused_t0_pieces("fused_t0", 2, 1, 64, 512), 1)
        for shape in ((1, 1, 64, 64), (2, 1, 64, 32)):
            for forward in ("fused_t0", "three_pass"):
                with self.assertRaisesRegex(ValueError, r"initial_state must be \[B, H, K, V\] "
                                                        r"= \(2, 1, 64, 64\)"):
                    mosaic_vjp.gated_delta_rule_mosaic(q, k, v, g, beta, forward=forward,
                                                       initial_state=jnp.ones(shape))

    def test_final_state_only_on_request(self):
        q, k, v, g, beta, *_ = bwd_test._pipeline_inputs(1, 64, 2, 1, 64, 64, 0.1, False, False,
                                                         None)
        out = jax.eval_shape(lambda *a: mosaic_vjp.gated_delta_rule_mosaic(*a), q, k, v, g, beta)
        self.assertEqual(out[0].shape, v.shape)
        self.assertIsNone(out[1])


if __name__ == "__main__":
    absltest.main()
