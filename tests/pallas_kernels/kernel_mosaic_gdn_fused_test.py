"""The fused GDN / DeltaNet forward kernel (state pass + output in one Mosaic GPU kernel).

``pallas_kernels/gated_delta_rule/kernel_mosaic_gpu_fused.py`` (issue 29, not dispatched) has
:func:`chunk_delta_fused_fwd_mosaic`, wired into
:func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu.gated_delta_rule_fwd_mosaic` and
:func:`pallas_kernels.gated_delta_rule.mosaic_vjp.gated_delta_rule_mosaic` as
``forward="fused"``.

* ``FusedInterpretTest`` (``slow``) runs the kernel in Mosaic GPU interpret mode
  (``InterpretGPUParams`` with race detection) on the WY factors of the fp32 XLA form rounded
  to bf16 and checks ``o``, the final state, ``v_new`` and the stored chunk states ``h``
  against the fp32 token-serial reference (``kernel_mosaic_gdn_test.py``'s cases: packed
  documents with starts at, inside and after chunk boundaries, strong decay, partial last
  chunk, GVA, ``initial_state``, DeltaNet), with that file's gate (relative RMS < 5e-3 plus
  ``assert_allclose`` at the bf16 forward tolerance). It also checks that the optional stores
  change nothing else, and that the whole forward with ``forward="fused"`` equals the
  three-pass forward (``final_state`` and ``v_new`` exactly, ``o`` up to one ulp on a few
  elements: :func:`_check_forward`) and matches the reference.
* ``VjpInterpretTest`` (``slow``): ``jax.vjp`` of the differentiable op with
  ``forward="fused"`` (its forward stores ``h`` and ``v_new`` for the unchanged backward)
  against ``jax.vjp`` of the fp32 chunk form, with ``kernel_mosaic_gdn_vjp_test.py``'s gates.
* ``LoweringTest`` (CI) lowers the kernel, the forward and the op's gradient for CUDA on the
  CPU host (two variants each; ``LoweringSlowTest``, ``slow``, the others): the layout
  branch that interpret mode replaces.
* Every check runs both kernel structures: two warpgroups (``forward="fused"``) and the
  read-out on its own warpgroup (``split_output=True``, ``forward="fused_split"``; the
  ``split_`` cases).
* ``GpuTest`` (``gpu``) runs the compiled kernel on a Hopper GPU at realistic rows.

A failing interpreted kernel may hang instead of raising; run one test at a time under
``timeout`` (``pallas_kernels/common/MOSAIC_GPU.md``, "Interpreter hang seen"). Passing kernels
hang too on a 2-core host: ``split_gva_packed_T192_K128_V128`` (three warpgroups) hung in 3 of 3
pytest runs and as a plain script, with the signature recorded in MOSAIC_GPU.md (every
warpgroup thread inside its nested XLA execution, two XLA threads blocked in the interpreter's
``_barrier_wait`` callback): XLA's CPU thread pool, one thread per core, is used up by blocking
barrier callbacks. jaxlib sizes that pool from ``PJRT_NPROC`` (else ``NPROC``) when it is set;
with ``NPROC=16`` the same case passed in 10 s, and the whole interpreted set of this file ran
in one process. So run them as
``NPROC=16 python -m pytest -m slow tests/pallas_kernels/kernel_mosaic_gdn_fused_test.py``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest, parameterized

from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu as kgd
from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu_fused as kfused
from pallas_kernels.gated_delta_rule import mosaic_vjp
from tests import tolerances
from tests.pallas_kernels import kernel_mosaic_gdn_bwd_test as bwd_test
from tests.pallas_kernels import kernel_mosaic_gdn_test as gdn_test
from tests.pallas_kernels import kernel_mosaic_gpu_test as kmg_test

_assert_close = gdn_test._assert_close
_VJP_NAMES = ("dq", "dk", "dv", "dg", "dbeta", "dh0")


def _check_kernel(test, batch, seq_len, heads, kv_heads, dk, dv, decay, h0, docs,
                  split_output=False, *, seed=0, interpret=True, allclose=True):
    """The fused kernel (all stores on) against the token-serial reference."""
    q, k, v, g, beta, state, seg = gdn_test._inputs(batch, seq_len, heads, kv_heads, dk, dv,
                                                    decay=decay, h0=h0, docs=docs, seed=seed)
    w, u = gdn_test._wy(k, v, g, beta, seg)
    scale = dk ** -0.5
    o, final, v_new, h = kfused.chunk_delta_fused_fwd_mosaic(
        q, k, w, u, g, scale=scale, initial_state=state, segment_ids=seg, store_v_new=True,
        store_h=True, split_output=split_output, interpret=interpret)
    want_o, want_final, want_u = gdn_test._reference(q, k, v, g, beta, state, seg, scale)
    want_h = gdn_test._reference_chunk_states(k, v, g, beta, state, seg)
    test.assertEqual((o.shape, o.dtype), (v.shape, v.dtype))
    test.assertEqual((final.shape, final.dtype), (want_final.shape, jnp.float32))
    test.assertEqual((v_new.shape, v_new.dtype), (v.shape, v.dtype))
    test.assertEqual((h.shape, h.dtype), (want_h.shape, v.dtype))
    for name, got, want in (("o", o, want_o), ("final_state", final, want_final),
                            ("v_new", v_new, want_u), ("h", h, want_h)):
        _assert_close(test, name, got, want, allclose=allclose)


# ``o`` of a fused forward against the three-pass one, interpreted: at most this many ulps of
# the output dtype apart, on at most this fraction of the elements (see _check_forward).
_O_MAX_ULPS, _O_MAX_FRACTION = 1, 1e-4


def _ulp_distance(x, y):
    """Elementwise distance of two float arrays of one 16- or 32-bit dtype in ulps (steps
    between representable values; +0 and -0 are 0 apart)."""
    def ordered(a):
        a = np.asarray(a)
        int_type = {2: np.int16, 4: np.int32}[a.dtype.itemsize]
        bits = a.view(int_type).astype(np.int64)
        return np.where(bits < 0, -(bits & np.iinfo(int_type).max), bits)
    return np.abs(ordered(x) - ordered(y))


def _check_forward(test, batch, seq_len, heads, kv_heads, dk, dv, decay, h0, docs,
                   forward="fused", *, seed=0, interpret=True, exact=True):
    """``gated_delta_rule_fwd_mosaic(forward=forward)`` (a fused one) against the three-pass
    forward (when ``exact``: equal, but ``o`` within ``_O_MAX_ULPS`` on ``_O_MAX_FRACTION`` of
    its elements; else within 1e-3 relative RMS) and the reference (5e-3).

    Why ``o`` is not checked for equality. Both forwards round the same operands (the state
    pass of both works on 64 value columns per CTA, so ``final_state`` and ``v_new`` come from
    identical products and stay exactly equal), but the read-out's products differ in shape:
    the fused kernels form ``Q S_c`` and ``P v_new`` for 64 value columns, the three-pass
    read-out (``chunk_output_mosaic``, one CTA per chunk) for all ``dv`` columns at once.
    Neither ``wgmma`` nor the interpreter fixes the order of the fp32 sum inside one output
    element: the interpreter's ``wgmma`` is ``np.matmul`` (OpenBLAS sgemm), whose blocking and
    thread split depend on the matrix width. Measured (2026-12-03, numpy 2.4.6, OpenBLAS
    0.3.31, 2 cores): of random bf16 ``[64, 64] x [64, 128]`` products, 7.5 % of the elements
    differ in the last fp32 bits from the same columns computed 64 at a time (2.0 % with
    ``OPENBLAS_NUM_THREADS=1``). In ``gva_h0_packed_partial_T150_K64_V128`` (``dv`` 128, both
    fused forwards) one element of ``Q S_c`` (chunk 0, head 1, token 47, column 83) is one
    fp32 ulp apart (0.8835953 vs 0.8835952); there ``o`` nearly cancels (``scale (0.625
    Q S - 0.552)``), and ``o`` rounds to bf16 one ulp apart: 5.0068e-06 vs 5.0366e-06
    (2.98e-8), 1 of 38,400 elements, every other element equal. With a width-independent
    ``np.matmul`` (one column at a time) patched into the interpreter, or with
    ``OPENBLAS_NUM_THREADS=1``, all three outputs were equal; ``PJRT_NPROC`` (XLA's CPU
    thread pool; 2, 8, 16) and the ``--xla_cpu_use_fusion_emitters`` flag did not change the
    element; ``jax_disable_most_optimizations`` off (other roundings of the shared inputs
    upstream) hid it. Only the inter-chunk part differs: with only ``Q S_c`` formed 64
    columns at a time in the three-pass read-out, ``o`` was equal; with only ``P v_new`` so,
    it was not. Seeds 0-5 of that case, both fused forwards: one element 1 ulp apart (seeds 0-3)
    or none (4, 5); the bound allows 3 of its 38,400 (1e-4). Cases with
    ``dv`` 64 compute identical products and stay equal.
    """
    q, k, v, g, beta, state, seg = gdn_test._inputs(batch, seq_len, heads, kv_heads, dk, dv,
                                                    decay=decay, h0=h0, docs=docs, seed=seed)
    scale = dk ** -0.5

    def run(forward):
        return kgd.gated_delta_rule_fwd_mosaic(
            q, k, v, g, beta, scale=scale, initial_state=state, segment_ids=seg,
            return_residual=True, forward=forward, interpret=interpret)

    fused, three = run(forward), run("three_pass")
    want = gdn_test._reference(q, k, v, g, beta, state, seg, scale)
    for name, got, other, ref in zip(("o", "final_state", "v_new"), fused, three, want):
        test.assertEqual((got.shape, got.dtype), (other.shape, other.dtype), msg=name)
        if exact and name == "o":
            ulps = _ulp_distance(got, other)
            test.assertLessEqual(int(ulps.max()), _O_MAX_ULPS, msg="o vs three-pass: ulps")
            test.assertLessEqual(int(np.count_nonzero(ulps)), _O_MAX_FRACTION * ulps.size,
                                 msg="o vs three-pass: elements not equal")
        elif exact:
            np.testing.assert_array_equal(np.asarray(got, np.float32),
                                          np.asarray(other, np.float32), err_msg=name)
        else:
            err = tolerances.rel_err(got, other)
            test.assertLess(err, 1e-3, msg=f"{name} vs three-pass: relative RMS {err:.2e}")
        _assert_close(test, name, got, ref, allclose=False)


def _check_vjp(test, case_args, interpret, forward="fused"):
    """``jax.vjp`` of the op with a fused ``forward`` against the fp32 chunk form's."""
    q, k, v, g, beta, state, seg, do, dht, scale = case_args

    def fn(q, k, v, g, beta, h0):
        return mosaic_vjp.gated_delta_rule_mosaic(q, k, v, g, beta, scale=scale,
                                                  initial_state=h0, segment_ids=seg,
                                                  output_final_state=True, forward=forward,
                                                  interpret=interpret)

    (o, final), vjp = jax.vjp(fn, q, k, v, g, beta, state)
    got = vjp((do.astype(o.dtype), jnp.zeros_like(final) if dht is None else dht))
    want = bwd_test._chunked_grads(*case_args)
    for name, x, y, inp in zip(_VJP_NAMES, got, want, (q, k, v, g, beta, state)):
        if inp is None:
            test.assertIsNone(x, msg=name)
            continue
        test.assertEqual((x.shape, x.dtype), (inp.shape, inp.dtype), msg=name)
        err = tolerances.rel_err(x.astype(jnp.float32), y)
        test.assertLess(err, 1e-2 if name in ("dg", "dbeta") else 5e-3,
                        msg=f"{name}: relative RMS error {err:.2e}")


# Slow (out of CI): interpreted Mosaic GPU kernels can hang instead of failing (MOSAIC_GPU.md,
# "Interpreter hang seen"). The mark is on the class: absl's parameterized copies of a method
# do not keep a method-level mark. Run one at a time: pytest -m slow <file> -k <case>.
@pytest.mark.slow
class FusedInterpretTest(parameterized.TestCase):

    # B, T, H, Hk, K, V, decay (None: DeltaNet), h0, document lengths (the rest one more),
    # split_output (the read-out on its own warpgroup)
    @parameterized.named_parameters(
        *gdn_test._CPU_CASES,
        ("split_gva_h0_packed_partial_T150_K64_V128", 1, 150, 2, 1, 64, 128, 0.02, True,
         (64, 36, 30), True),
        ("split_strong_decay_h0_partial_T65_K128_V64", 2, 65, 1, 1, 128, 64, 5.0, True, None,
         True),
        ("split_deltanet_h0_T100_K64_V64", 1, 100, 1, 1, 64, 64, None, True, None, True),
        ("split_gva_packed_T192_K128_V128", 1, 192, 2, 1, 128, 128, 0.1, True, (70, 30), True),
    )
    def test_fused_kernel_matches_reference(self, *case):
        _check_kernel(self, *case)

    def test_optional_stores_change_nothing_else(self):
        q, k, v, g, beta, state, seg = gdn_test._inputs(1, 150, 2, 1, 64, 64, decay=0.05,
                                                        h0=True, docs=(64, 36, 30))
        w, u = gdn_test._wy(k, v, g, beta, seg)

        def run(store):
            return kfused.chunk_delta_fused_fwd_mosaic(
                q, k, w, u, g, scale=0.125, initial_state=state, segment_ids=seg,
                store_v_new=store, store_h=store, interpret=True)

        _check_optional_stores(run)

    @parameterized.named_parameters(
        ("gva_h0_packed_partial_T150_K64_V128", 1, 150, 2, 1, 64, 128, 0.02, True,
         (64, 36, 30)),
        ("strong_decay_h0_partial_T65_K128_V64", 2, 65, 1, 1, 128, 64, 5.0, True, None),
        ("deltanet_packed_T128_K64_V64", 1, 128, 1, 1, 64, 64, None, False, (10, 60)),
        ("split_gva_h0_packed_partial_T150_K64_V128", 1, 150, 2, 1, 64, 128, 0.02, True,
         (64, 36, 30), "fused_split"),
    )
    def test_forward_fused_equals_three_pass(self, *case):
        _check_forward(self, *case)


def _check_optional_stores(run):
    """``run(store)`` -> ``(o, final_state, v_new, h)`` of a fused forward with
    ``store_v_new = store_h = store``: without the stores ``v_new`` and ``h`` are ``None`` and
    ``o`` and ``final_state`` are bit-equal to the run with them."""
    bare, full = run(False), run(True)
    if bare[2] is not None or bare[3] is not None:
        raise AssertionError("v_new or h stored without being asked for")
    for name, x, y in zip(("o", "final_state"), bare[:2], full[:2]):
        np.testing.assert_array_equal(np.asarray(x, np.float32), np.asarray(y, np.float32),
                                      err_msg=name)


@pytest.mark.slow
class VjpInterpretTest(parameterized.TestCase):

    @parameterized.named_parameters(
        # B, T, H, Hk, K, V, decay (None: DeltaNet), h0, dht, document lengths
        ("gva_h0_dht_packed_partial_T150_K64_V64", 1, 150, 2, 1, 64, 64, 0.05, True, True,
         (64, 36, 30)),
        ("deltanet_dht_T128_K64_V64", 1, 128, 1, 1, 64, 64, None, False, True, None),
        ("split_gva_h0_dht_packed_partial_T150_K64_V64", 1, 150, 2, 1, 64, 64, 0.05, True,
         True, (64, 36, 30), "fused_split"),
    )
    def test_vjp_fused_matches_chunked_vjp(self, *case):
        *case, forward = case if isinstance(case[-1], str) else (*case, "fused")
        _check_vjp(self, bwd_test._pipeline_inputs(*case), True, forward)


@pytest.mark.gpu
class GpuTest(kmg_test.HopperTestCase):
    """The compiled fused kernel (wgmma, TMA) on bf16 inputs against the fp32 references."""

    @parameterized.named_parameters(
        # B, T, H, Hk, K, V, decay (None: DeltaNet), h0, document lengths (the rest one more)
        ("plain_T2048_K128_V128", 2, 2048, 4, 4, 128, 128, 0.05, False, None),
        ("gva_h0_packed_T4096_K128_V128", 1, 4096, 4, 2, 128, 128, 0.05, True,
         (700, 1, 64, 999, 1200)),
        ("strong_decay_h0_partial_T1000_K64_V128", 2, 1000, 2, 1, 64, 128, 5.0, True, None),
        ("packed_T3000_K128_V64", 1, 3000, 3, 3, 128, 64, 0.2, False, (10, 54, 500, 2000)),
        ("deltanet_h0_packed_T2048_K64_V64", 1, 2048, 2, 2, 64, 64, None, True, (300, 700)),
        ("split_gva_h0_packed_T4096_K128_V128", 1, 4096, 4, 2, 128, 128, 0.05, True,
         (700, 1, 64, 999, 1200), True),
        ("split_strong_decay_h0_partial_T1000_K64_V128", 2, 1000, 2, 1, 64, 128, 5.0, True,
         None, True),
        ("split_deltanet_h0_packed_T2048_K64_V64", 1, 2048, 2, 2, 64, 64, None, True,
         (300, 700), True),
    )
    def test_fused_kernel_matches_reference(self, *case):
        _check_kernel(self, *case, seed=5, interpret=False, allclose=False)

    @parameterized.named_parameters(
        ("gva_h0_packed_T4096_K128_V128", 2, 4096, 4, 2, 128, 128, 0.05, True,
         (700, 1, 64, 999, 1200)),
        ("deltanet_h0_partial_T1000_K128_V128", 1, 1000, 2, 2, 128, 128, None, True, None),
        ("split_gva_h0_packed_T4096_K128_V128", 2, 4096, 4, 2, 128, 128, 0.05, True,
         (700, 1, 64, 999, 1200), "fused_split"),
    )
    def test_forward_fused_matches_three_pass(self, *case):
        _check_forward(self, *case, seed=3, interpret=False, exact=False)

    @parameterized.parameters("fused", "fused_split")
    def test_vjp_fused_matches_chunked_vjp(self, forward):
        _check_vjp(self, bwd_test._pipeline_inputs(1, 2048, 4, 2, 128, 128, 0.05, True, True,
                                                   (700, 1, 64, 999), seed=11), False, forward)


def _check_kernel_lowers(test, dk, dv, stores, split_output):
    q, k, v, g, beta, state, seg = gdn_test._inputs(1, 200, 2, 1, dk, dv, decay=0.2, h0=True,
                                                    docs=(70, 30))
    w, u = gdn_test._wy(k, v, g, beta, seg)

    def fn(q, k, w, u, g, state, seg):
        return kfused.chunk_delta_fused_fwd_mosaic(q, k, w, u, g, scale=0.1,
                                                   initial_state=state, segment_ids=seg,
                                                   store_v_new=stores, store_h=stores,
                                                   split_output=split_output)

    text = (jax.jit(fn).trace(q, k, w, u, g, state, seg)
            .lower(lowering_platforms=("cuda",)).as_text())
    test.assertEqual(text.count("custom_call @mosaic_gpu"), 1)
    test.assertIn("gdn_chunk_delta_fused_fwd_split" if split_output
                  else "gdn_chunk_delta_fused_fwd", text)


def _check_forward_lowers(test, dk, dv, deltanet, forward):
    q, k, v, g, beta, state, seg = gdn_test._inputs(1, 200, 2, 1, dk, dv,
                                                    decay=None if deltanet else 0.2, h0=True,
                                                    docs=(70, 30))

    def fn(q, k, v, g, beta, state, seg):
        return kgd.gated_delta_rule_fwd_mosaic(q, k, v, g, beta, initial_state=state,
                                               segment_ids=seg, return_residual=True,
                                               forward=forward)

    text = (jax.jit(fn).trace(q, k, v, g, beta, state, seg)
            .lower(lowering_platforms=("cuda",)).as_text())
    # WY preparation, then the fused kernel: no separate state pass or read-out.
    test.assertEqual(text.count("custom_call @mosaic_gpu"), 2)
    test.assertIn("gdn_chunk_wy", text)
    test.assertIn("gdn_chunk_delta_fused_fwd", text)
    test.assertNotIn("gdn_chunk_delta_h", text)
    test.assertNotIn("simple_gla_chunk_output", text)


def _check_grad_exports(test, dk, dv, deltanet, forward):
    q, k, v, g, beta, state, seg, _, _, scale = bwd_test._pipeline_inputs(
        1, 200, 2, 1, dk, dv, None if deltanet else 0.2, True, True, (70, 30))

    def loss(q, k, v, g, beta, h0, seg):
        o, final = mosaic_vjp.gated_delta_rule_mosaic(
            q, k, v, g, beta, scale=scale, initial_state=h0, segment_ids=seg,
            output_final_state=True, forward=forward)
        return jnp.sum(o.astype(jnp.float32) ** 2) + jnp.sum(final)

    argnums = (0, 1, 2, 4, 5) if deltanet else (0, 1, 2, 3, 4, 5)
    fn = jax.jit(jax.grad(loss, argnums=argnums))
    exported = jax.export.export(fn, platforms=["cuda"])(q, k, v, g, beta, state, seg)
    text = exported.mlir_module()
    # forward: WY, fused; backward (the defaults, "fused_ws" and dv_local "fold"): the reverse
    # pass forming dv_local, T0, the fused chunk-local kernel
    test.assertEqual(text.count("custom_call @mosaic_gpu"), 5)
    test.assertIn("gdn_chunk_delta_dh_fold", text)
    test.assertIn("gdn_chunk_delta_fused_fwd", text)
    test.assertNotIn("simple_gla_chunk_output", text)
    want = [x.shape for x in (q, k, v, g, beta, state) if x is not None]
    test.assertEqual([a.shape for a in exported.out_avals], want)


# Lowering variants: CI keeps two per check (K = V = 64 and K = V = 128, each with one of the
# options), LoweringSlowTest runs the other ones.
_KERNEL_CI, _KERNEL_SLOW = kmg_test.split_variants(
    [dict(dk=64, dv=64, stores=False, split_output=False),
     dict(dk=128, dv=128, stores=True, split_output=True)],
    dk=(64, 128), dv=(64, 128), stores=(False, True), split_output=(False, True))
_FWD_CI, _FWD_SLOW = kmg_test.split_variants(
    [dict(dk=64, dv=64, deltanet=True, forward="fused"),
     dict(dk=128, dv=128, deltanet=False, forward="fused_split")],
    dk=(64, 128), dv=(64, 128), deltanet=(False, True), forward=("fused", "fused_split"))
_GRAD_CI, _GRAD_SLOW = kmg_test.split_variants(
    [dict(dk=64, dv=64, deltanet=False, forward="fused_split"),
     dict(dk=128, dv=128, deltanet=True, forward="fused")],
    dk=(64, 128), dv=(64, 128), deltanet=(False, True), forward=("fused", "fused_split"))


class LoweringTest(parameterized.TestCase):

    @parameterized.named_parameters(*_KERNEL_CI)
    def test_fused_kernel_lowers_for_cuda(self, **variant):
        _check_kernel_lowers(self, **variant)

    @parameterized.named_parameters(*_FWD_CI)
    def test_forward_fused_lowers_for_cuda(self, **variant):
        _check_forward_lowers(self, **variant)

    @parameterized.named_parameters(*_GRAD_CI)
    def test_grad_fused_exports_for_cuda(self, **variant):
        _check_grad_exports(self, **variant)


# Slow (out of CI): the other K, V and option combinations of LoweringTest. The mark is on the
# class: absl's parameterized copies of a method do not keep a method-level mark.
@pytest.mark.slow
class LoweringSlowTest(parameterized.TestCase):

    @parameterized.named_parameters(*_KERNEL_SLOW)
    def test_fused_kernel_lowers_for_cuda(self, **variant):
        _check_kernel_lowers(self, **variant)

    @parameterized.named_parameters(*_FWD_SLOW)
    def test_forward_fused_lowers_for_cuda(self, **variant):
        _check_forward_lowers(self, **variant)

    @parameterized.named_parameters(*_GRAD_SLOW)
    def test_grad_fused_exports_for_cuda(self, **variant):
        _check_grad_exports(self, **variant)


class ValidationTest(absltest.TestCase):

    def test_rejects_what_the_kernel_cannot_run(self):
        q, k, v, g, beta, _, _ = gdn_test._inputs(1, 64, 2, 1, 64, 64, decay=0.1, h0=False,
                                                  docs=None)
        w, u = gdn_test._wy(k, v, g, beta, None)
        fused = kfused.chunk_delta_fused_fwd_mosaic
        with self.assertRaisesRegex(ValueError, "q must have"):
            fused(q[:, :32], k, w, u, g, scale=1.0)
        with self.assertRaisesRegex(ValueError, "w must be"):
            fused(q, k, w[:, :, :1], u, g, scale=1.0)
        with self.assertRaisesRegex(ValueError, "16-bit dtype"):
            fused(q, k, w, u.astype(jnp.float32), g, scale=1.0)
        with self.assertRaisesRegex(ValueError, "head dims"):
            fused(q, k, w, u[..., :32], g, scale=1.0)
        with self.assertRaisesRegex(ValueError, "g must be"):
            fused(q, k, w, u, g[:, :, :1], scale=1.0)
        with self.assertRaisesRegex(ValueError, "initial_state must be"):
            fused(q, k, w, u, g, scale=1.0, initial_state=jnp.zeros((1, 2, 64, 32)))
        with self.assertRaisesRegex(ValueError, "forward must be one of"):
            kgd.gated_delta_rule_fwd_mosaic(q, k, v, g, beta, forward="two_pass")
        with self.assertRaisesRegex(ValueError, "forward must be one of"):
            mosaic_vjp.gated_delta_rule_mosaic(q, k, v, g, beta, forward="two_pass")

    def test_stores_only_on_request(self):
        q, k, v, g, beta, state, _ = gdn_test._inputs(1, 100, 2, 1, 64, 64, decay=0.1,
                                                      h0=True, docs=None)
        w, u = gdn_test._wy(k, v, g, beta, None)
        for store_v_new, store_h in ((False, False), (True, False), (False, True)):
            out = jax.eval_shape(
                lambda *a, s0, sv=store_v_new, sh=store_h: kfused.chunk_delta_fused_fwd_mosaic(
                    *a, scale=1.0, initial_state=s0, store_v_new=sv, store_h=sh),
                q, k, w, u, g, s0=state)
            self.assertEqual(out[0].shape, v.shape)
            self.assertEqual((out[1].shape, out[1].dtype), ((1, 2, 64, 64), jnp.float32))
            self.assertEqual(out[2] is None, not store_v_new)
            self.assertEqual(out[3] is None, not store_h)
            if store_h:
                self.assertEqual((out[3].shape, out[3].dtype), ((1, 2, 2, 64, 64), v.dtype))
        two = jax.eval_shape(lambda *a: kgd.gated_delta_rule_fwd_mosaic(*a, forward="fused"),
                             q, k, v, g, beta)
        self.assertLen(two, 2)


if __name__ == "__main__":
    absltest.main()
