"""The Gated DeltaNet WY backward Mosaic GPU kernel ``chunk_wy_bwd_mosaic``, on CPU and GPU.

``pallas_kernels/gated_delta_rule/kernel_mosaic_gpu_wy_bwd.py`` (issue 29, not dispatched) gives
``dk``, ``dv``, ``dbeta`` and ``dg`` through the WY factors ``W, U`` from their cotangents. The
reference is ``jax.vjp`` of the fp32 XLA form
:func:`pallas_kernels.gated_delta_rule.chunked.wy_representation` w.r.t. ``k`` (repeated to the
value heads, then summed over each GVA group), ``v``, ``g`` and ``beta``, on the same bf16
inputs and random fp32 cotangents. The kernel keeps about 16 significant bits in every
computed ``wgmma`` operand (hi + lo splits), so the gate is a relative RMS error of 1e-3
(measured 5e-6 to 1.1e-4 on random keys; 2.5e-3 on correlated keys, where the recomputed ``X``
carries the forward's fp16-merge error: ``dk`` 1.1e-3 to 1.3e-3).

``PipelineInterpretTest`` runs the whole GDN backward on Mosaic stages only (the forward's
``chunk_wy_mosaic`` and state pass, ``dv_local``, the reverse state pass, the chunk-local
gradients and this kernel) against every gradient of ``jax.vjp`` of
:func:`pallas_kernels.gated_delta_rule.chunked.gated_delta_rule_chunked`.

The interpreted classes are marked ``slow`` (interpreted Mosaic GPU kernels can hang instead of
failing, ``pallas_kernels/common/MOSAIC_GPU.md``); ``LoweringTest`` exports the kernel for CUDA
with ``jax.export`` (two variants; ``LoweringSlowTest``, ``slow``, the other six); ``GpuTest``
(marked ``gpu``) runs the compiled kernels on a Hopper GPU.
"""

import inspect

import jax
import jax.numpy as jnp
import pytest
from absl.testing import absltest, parameterized

from pallas_kernels.gated_delta_rule import chunked
from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu as kgd
from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu_bwd as kbwd
from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu_wy_bwd as kwb
from pallas_kernels.gated_delta_rule import mosaic_vjp
from tests import tolerances
from tests.pallas_kernels import kernel_mosaic_gdn_bwd_test as bwd_test
from tests.pallas_kernels import kernel_mosaic_gdn_test as gdn_test
from tests.pallas_kernels import kernel_mosaic_channelwise_grad_test as cwg_test
from tests.pallas_kernels import kernel_mosaic_channelwise_test as kmc_test
from tests.pallas_kernels import kernel_mosaic_gdn_wy_test as wy_test
from tests.pallas_kernels import kernel_mosaic_gpu_test as kmg_test

_MAX_ERR = 1e-3
# Correlated keys (k_i . k_j about 0.9): the recomputed X carries the forward's fp16-merge error
# (about 1e-3 relative there, MOSAIC_GPU.md Sec. 6); dk measured 1.1e-3 to 1.3e-3.
_MAX_ERR_CORRELATED = 2.5e-3
_NAMES = ("dk", "dv", "dbeta", "dg")


def _case(batch, seq_len, heads, kv_heads, dk, dv, decay, docs, correlated, seed=0,
          du_dtype=jnp.float32):
    """Kernel inputs ``(k, v, g, beta, dw, du)``, ``segment_ids`` and the fp32 reference
    ``(dk, dv, dbeta, dg)`` by ``jax.vjp`` of ``chunked.wy_representation`` (``du`` rounded to
    ``du_dtype`` first, in the inputs and the reference)."""
    k, v, g, beta, seg = wy_test._inputs(batch, seq_len, heads, kv_heads, dk, dv, decay=decay,
                                         docs=docs, correlated=correlated, seed=seed)
    keys = jax.random.split(jax.random.key(seed + 21), 2)
    dw = jax.random.normal(keys[0], (batch, seq_len, heads, dk))
    du = jax.random.normal(keys[1], (batch, seq_len, heads, dv))
    du = du.astype(du_dtype).astype(jnp.float32)

    def wy(kf, vf, gf, bf):
        return chunked.wy_representation(kf, vf, None if g is None else gf, bf,
                                         segment_ids=seg)

    gf = jnp.zeros(beta.shape) if g is None else g
    (w_p, _), vjp = jax.vjp(wy, gdn_test._expand(k, heads), v.astype(jnp.float32), gf, beta)
    pad = ((0, 0), (0, w_p.shape[1] - seq_len), (0, 0), (0, 0))
    dk_, dv_, dg, dbeta = vjp((jnp.pad(dw, pad), jnp.pad(du, pad)))
    want = (kbwd._group_sum(dk_, kv_heads), dv_, dbeta, None if g is None else dg)
    return (k, v, g, beta, dw, du), seg, want


def _check(test, got, want, max_err=_MAX_ERR):
    for name, x, y in zip(_NAMES, got, want):
        if y is None:
            test.assertIsNone(x, msg=name)
            continue
        test.assertEqual((x.shape, x.dtype), (y.shape, jnp.float32), msg=name)
        err = tolerances.rel_err(x, y)
        test.assertLess(err, max_err, msg=f"{name}: relative RMS error {err:.2e}")


# B, T, H, Hk, K, V, decay (None: DeltaNet), document lengths (the rest one more), correlated
_CPU_CASES = (
    ("plain_T128_K64_V64", 1, 128, 1, 1, 64, 64, 0.1, None, 0.0),
    # starts at 64 (a chunk boundary), 100 (inside chunk 1) and 130 (inside the partial chunk 2)
    ("gva_packed_partial_T150_K64_V128", 1, 150, 2, 1, 64, 128, 0.02, (64, 36, 30), 0.0),
    ("strong_decay_partial_T65_K128_V64", 2, 65, 1, 1, 128, 64, 5.0, None, 0.0),
    ("packed_T128_K64_V64", 1, 128, 1, 1, 64, 64, 0.2, (10, 60), 0.0),
    ("deltanet_packed_T100_K64_V64", 1, 100, 1, 1, 64, 64, None, (10, 60), 0.0),
    ("gva_packed_T192_K128_V128", 1, 192, 4, 2, 128, 128, 0.1, (70, 30), 0.0),
    ("correlated_T128_K128_V128", 1, 128, 2, 1, 128, 128, 0.01, None, 3.0),
    ("correlated_deltanet_packed_T150_K64_V64", 1, 150, 1, 1, 64, 64, None, (40,), 3.0),
)


# Slow (out of CI): see the module docstring. The mark is on the class: absl's parameterized
# copies of a method do not keep a method-level mark.
@pytest.mark.slow
class WyBwdInterpretTest(parameterized.TestCase):

    @parameterized.named_parameters(*_CPU_CASES)
    def test_chunk_wy_bwd_matches_autodiff(self, *case):
        args, seg, want = _case(*case)
        got = kwb.chunk_wy_bwd_mosaic(*args, segment_ids=seg, interpret=True)
        _check(self, got, want, _MAX_ERR_CORRELATED if case[-1] else _MAX_ERR)


def _chunk_reverse_cumsum(x, seq_len):
    """``[B, H, Tp]`` to ``[B, T, H]``: ``y_t = sum_{s >= t in t's chunk} x_s`` (fp32)."""
    batch, heads, padded = x.shape
    c = x.reshape(batch, heads, padded // kwb.CHUNK, kwb.CHUNK)
    c = jnp.flip(jnp.cumsum(jnp.flip(c, -1), axis=-1), -1)
    return jnp.moveaxis(c.reshape(batch, heads, padded), 1, 2)[:, :seq_len]


# The cases of _CPU_CASES with a partial chunk, GVA, packed documents or DeltaNet.
_PARTIAL_CASES = tuple(c for c in _CPU_CASES if c[0].startswith(("gva", "strong", "deltanet")))


@pytest.mark.slow
class PartialsInterpretTest(parameterized.TestCase):
    """``dk_partial``, ``dg_partial`` and ``out_dtype`` (what ``mosaic_vjp`` passes,
    MOSAIC_GPU.md Sec. 27)."""

    def _partials(self, args, seed=5):
        k, v, g, beta, dw, _ = args
        batch, seq_len, heads, dk = dw.shape
        padded = -(-seq_len // kwb.CHUNK) * kwb.CHUNK
        keys = jax.random.split(jax.random.key(seed), 3)
        dk_p = jax.random.normal(keys[0], (batch, seq_len, heads, dk))
        dgt = jax.random.normal(keys[1], (batch, heads, padded))
        bnd = jax.random.normal(keys[2], (batch, heads, padded))
        return dk_p, dgt, bnd

    @parameterized.named_parameters(*_PARTIAL_CASES)
    def test_partials_are_added_in_kernel(self, *case):
        """fp32 outputs: ``dk = dk_WY + group_sum(dk_partial)``, ``dg = dg_WY +`` the in-chunk
        reverse cumsum of ``dgt`` ``+`` the chunk's sum of ``bnd``; ``dv``, ``dbeta`` as
        without partials."""
        args, seg, want = _case(*case)
        dk_p, dgt, bnd = self._partials(args)
        got = kwb.chunk_wy_bwd_mosaic(*args, segment_ids=seg, dk_partial=dk_p,
                                      dg_partial=(dgt, bnd), interpret=True)
        kv_heads, seq_len = args[0].shape[2], args[0].shape[1]
        dk_want = want[0] + kbwd._group_sum(dk_p, kv_heads)
        dg_want = None
        if want[3] is not None:
            per_chunk = jnp.sum(bnd.reshape(*bnd.shape[:2], -1, kwb.CHUNK), axis=-1)
            bnd_sum = jnp.repeat(per_chunk, kwb.CHUNK, axis=-1)  # [B, H, Tp]
            dg_want = (want[3] + _chunk_reverse_cumsum(dgt, seq_len)
                       + jnp.moveaxis(bnd_sum, 1, 2)[:, :seq_len])
        _check(self, got, (dk_want, want[1], want[2], dg_want),
               _MAX_ERR_CORRELATED if case[-1] else _MAX_ERR)

    @parameterized.named_parameters(*_PARTIAL_CASES)
    def test_16bit_outputs_are_the_fp32_ones_rounded_once(self, *case):
        """A bf16 ``du`` read in place and ``out_dtype=bf16``: ``dk``, ``dv`` equal the fp32
        kernel's (same bf16 ``du`` read as fp32) rounded once, bit for bit; ``dbeta``, ``dg``
        equal; and ``dk``, ``dv`` are within one bf16 rounding of the reference."""
        args, seg, want = _case(*case)
        k, v, g, beta, dw, du = args
        du16 = du.astype(k.dtype)
        dk_p, dgt, bnd = self._partials(args)
        kw = dict(segment_ids=seg, dk_partial=dk_p, dg_partial=(dgt, bnd), interpret=True)
        got16 = kwb.chunk_wy_bwd_mosaic(k, v, g, beta, dw, du16, out_dtype=k.dtype, **kw)
        got32 = kwb.chunk_wy_bwd_mosaic(k, v, g, beta, dw, du16, **kw)
        # an fp32 du with 16-bit outputs: read as fp32 (its hi / lo split), staged in 16 bits
        got16_f = kwb.chunk_wy_bwd_mosaic(k, v, g, beta, dw, du, out_dtype=k.dtype, **kw)
        got32_f = kwb.chunk_wy_bwd_mosaic(k, v, g, beta, dw, du, **kw)
        for pair16, pair32 in ((got16, got32), (got16_f, got32_f)):
            for name, x16, x32 in zip(_NAMES, pair16, pair32):
                if x32 is None:
                    self.assertIsNone(x16, msg=name)
                    continue
                want_dtype = k.dtype if name in ("dk", "dv") else jnp.float32
                self.assertEqual(x16.dtype, want_dtype, msg=name)
                diff = jnp.max(jnp.abs(x16.astype(jnp.float32)
                                       - x32.astype(want_dtype).astype(jnp.float32)))
                self.assertEqual(float(diff), 0.0, msg=name)
        # the reference with the bf16 du and the partials: dv is the complete gradient
        _, _, want16 = _case(*case, du_dtype=k.dtype)
        err = tolerances.rel_err(got16[1].astype(jnp.float32), want16[1])
        self.assertLess(err, 4e-3, msg=f"bf16 dv: relative RMS error {err:.2e}")


# GVA cases for gva_loop=True: G = 2 at K = 64 and 128 (documents, a partial chunk), G = 4.
_GVA_LOOP_CASES = tuple(c for c in _CPU_CASES if c[0].startswith("gva")) + (
    ("gva4_packed_partial_T150_K64_V64", 1, 150, 4, 1, 64, 64, 0.05, (64, 36, 30), 0.0),)


@pytest.mark.slow
class GvaLoopInterpretTest(parameterized.TestCase):
    """``gva_loop=True`` (MOSAIC_GPU.md Sec. 27.5): one CTA per key head loops over its value
    heads and sums ``dk`` (the partial included) in fp32 in-kernel."""

    @parameterized.named_parameters(*_GVA_LOOP_CASES)
    def test_in_kernel_group_sum(self, *case):
        """Against the fp32 reference (``dk = dk_WY + group_sum(dk_partial)``, ``dg`` with the
        partials); with ``out_dtype=bf16`` the ``[B, T, Hk, K]`` ``dk`` equals XLA's group sum
        of the per-value-head fp32 ``dk`` rounded once (bit for bit at ``G = 2``, within one
        bf16 ulp at ``G = 4``: another fp32 summation order), ``dv``, ``dbeta``, ``dg`` equal
        the per-value-head kernel's."""
        args, seg, want = _case(*case)
        k, v, g, beta, dw, du = args
        dk_p, dgt, bnd = PartialsInterpretTest()._partials(args)
        kw = dict(segment_ids=seg, dk_partial=dk_p, dg_partial=(dgt, bnd), interpret=True)
        got = kwb.chunk_wy_bwd_mosaic(*args, gva_loop=True, **kw)
        kv_heads, seq_len = k.shape[2], k.shape[1]
        dk_want = want[0] + kbwd._group_sum(dk_p, kv_heads)
        dg_want = None
        if want[3] is not None:
            per_chunk = jnp.sum(bnd.reshape(*bnd.shape[:2], -1, kwb.CHUNK), axis=-1)
            bnd_sum = jnp.repeat(per_chunk, kwb.CHUNK, axis=-1)
            dg_want = (want[3] + _chunk_reverse_cumsum(dgt, seq_len)
                       + jnp.moveaxis(bnd_sum, 1, 2)[:, :seq_len])
        self.assertEqual(got[0].shape, k.shape)
        _check(self, got, (dk_want, want[1], want[2], dg_want))
        du16 = du.astype(k.dtype)
        loop16 = kwb.chunk_wy_bwd_mosaic(k, v, g, beta, dw, du16, out_dtype=k.dtype,
                                         gva_loop=True, **kw)
        xla16 = kwb.chunk_wy_bwd_mosaic(k, v, g, beta, dw, du16, out_dtype=k.dtype, **kw)
        group = v.shape[2] // kv_heads
        for name, x, y in zip(_NAMES, loop16, xla16):
            if y is None:
                self.assertIsNone(x, msg=name)
                continue
            self.assertEqual((x.shape, x.dtype), (y.shape, y.dtype), msg=name)
            diff = jnp.abs(x.astype(jnp.float32) - y.astype(jnp.float32))
            if name == "dk" and group > 2:
                ulp = jnp.abs(y.astype(jnp.float32)) * 2.0 ** -7 + 1e-30
                self.assertLessEqual(float(jnp.max(diff / ulp)), 1.0, msg=name)
            else:
                self.assertEqual(float(jnp.max(diff)), 0.0, msg=name)


def _mosaic_pipeline_grads(q, k, v, g, beta, state, seg, do, dht, scale, interpret):
    """All gradients of the GDN backward on Mosaic stages only: ``chunk_wy_mosaic`` and the
    forward state pass (the residuals ``h``, ``v_new``), ``dv_local``, the reverse state pass,
    the chunk-local gradients and the WY backward. ``dk`` and ``dg`` are the sums of the
    chunk-local and the WY parts (both are gradients of the per-token ``k`` and ``g``).
    Returns fp32 ``(dq, dk, dv, dg, dbeta, dh0)`` as ``bwd_test._pipeline_grads``."""
    w, u = kgd.chunk_wy_mosaic(k, v, g, beta, segment_ids=seg, interpret=interpret)
    h, v_new, _ = kgd.chunk_delta_h_mosaic(k, w, u, g, initial_state=state, segment_ids=seg,
                                           states_dtype=q.dtype, interpret=interpret)
    dvl = kbwd.chunk_dv_local_mosaic(q, k, do, g, scale=scale, segment_ids=seg,
                                     interpret=interpret)
    dh, dvn, dh0 = kgd.chunk_delta_dh_mosaic(q, k, w, do, dvl, g, scale=scale,
                                             final_state_grad=dht, segment_ids=seg,
                                             states_dtype=q.dtype, interpret=interpret)
    dq, dk, dw, dg = kbwd.chunk_delta_grads_mosaic(q, k, v_new, do, dvn, g, h, dh,
                                                   scale=scale, segment_ids=seg,
                                                   interpret=interpret)
    dk_wy, dv, dbeta, dg_wy = kwb.chunk_wy_bwd_mosaic(k, v, g, beta, dw, dvn, segment_ids=seg,
                                                      interpret=interpret)
    return dq, dk + dk_wy, dv, None if g is None else dg + dg_wy, dbeta, dh0


@pytest.mark.slow
class PipelineInterpretTest(parameterized.TestCase):
    """The whole GDN backward on Mosaic kernels matches ``jax.vjp`` of the XLA chunk form
    (same gates as ``kernel_mosaic_gdn_bwd_test.PipelineInterpretTest``)."""

    @parameterized.named_parameters(
        ("gva_h0_dht_packed_partial_T150_K64_V64", 1, 150, 2, 1, 64, 64, 0.05, True, True,
         (64, 36, 30)),
        ("deltanet_dht_T128_K64_V64", 1, 128, 1, 1, 64, 64, None, False, True, None),
        ("strong_decay_h0_dht_packed_T128_K64_V128", 1, 128, 2, 2, 64, 128, 5.0, True, True,
         (10, 60)),
    )
    def test_grads_match_chunked_vjp(self, *case):
        args = bwd_test._pipeline_inputs(*case)
        bwd_test._check_pipeline(self, _mosaic_pipeline_grads(*args, True),
                                 bwd_test._chunked_grads(*args))


@pytest.mark.gpu
class GpuTest(kmg_test.HopperTestCase):
    """The compiled kernel (wgmma, TMA) against the fp32 autodiff reference."""

    @parameterized.named_parameters(
        ("gva_packed_T2048_K128_V128", 1, 2048, 4, 2, 128, 128, 0.05, (700, 1, 64, 999), 0.0),
        ("strong_decay_partial_T1000_K64_V128", 2, 1000, 2, 1, 64, 128, 5.0, None, 0.0),
        ("deltanet_packed_T1024_K128_V64", 1, 1024, 2, 2, 128, 64, None, (300, 200), 0.0),
        ("correlated_T2048_K128_V128", 1, 2048, 4, 2, 128, 128, 0.01, (300,), 3.0),
    )
    def test_chunk_wy_bwd_matches_autodiff(self, *case):
        args, seg, want = _case(*case, seed=5)
        _check(self, kwb.chunk_wy_bwd_mosaic(*args, segment_ids=seg), want,
               _MAX_ERR_CORRELATED if case[-1] else _MAX_ERR)

    @parameterized.named_parameters(
        ("gva_h0_dht_packed_T2048_K128_V128", 1, 2048, 4, 2, 128, 128, 0.05, True, True,
         (700, 1, 64, 999)),
        ("deltanet_partial_T1000_K64_V64", 2, 1000, 2, 2, 64, 64, None, False, True, None),
    )
    def test_mosaic_pipeline_grads_match_chunked_vjp(self, *case):
        args = bwd_test._pipeline_inputs(*case, seed=7)
        bwd_test._check_pipeline(self, _mosaic_pipeline_grads(*args, False),
                                 bwd_test._chunked_grads(*args))


def _check_chunk_wy_bwd_exports(test, dk, dv, deltanet):
    args, seg, _ = _case(1, 200, 2, 1, dk, dv, None if deltanet else 0.2, (70, 30), 0.0)

    def fn(k, v, g, beta, dw, du, seg):
        return kwb.chunk_wy_bwd_mosaic(k, v, g, beta, dw, du, segment_ids=seg)

    exported = jax.export.export(jax.jit(fn), platforms=["cuda"])(*args, seg)
    text = exported.mlir_module()
    test.assertEqual(text.count("custom_call @mosaic_gpu"), 1)
    test.assertIn("gdn_chunk_wy_bwd", text)
    shapes = [a.shape for a in exported.out_avals if a is not None]
    test.assertEqual(shapes[:3], [(1, 200, 1, dk), (1, 200, 2, dv), (1, 200, 2)])


# Export variants: LoweringTest has two (K = V = 64 DeltaNet, K = V = 128 gated), LoweringSlowTest
# the other six; tests/ci_slow.py moves the K = V = 128 gated one out of CI too (CI exports it
# within the whole backward: kernel_mosaic_gdn_vjp_test).
_EXPORT_CI, _EXPORT_SLOW = kmg_test.split_variants(
    [dict(dk=64, dv=64, deltanet=True), dict(dk=128, dv=128, deltanet=False)],
    dk=(64, 128), dv=(64, 128), deltanet=(False, True))


class LoweringTest(parameterized.TestCase):
    """The kernel exports for CUDA on any host: the whole Pallas-to-Mosaic-GPU lowering runs
    (layouts, swizzles, ``wgmma`` operand shapes and dtypes, transposed views); ptxas runs on
    the GPU only."""

    @parameterized.named_parameters(*_EXPORT_CI)
    def test_chunk_wy_bwd_exports_for_cuda(self, **variant):
        _check_chunk_wy_bwd_exports(self, **variant)


# Slow (out of CI): the other K, V and gate combinations of LoweringTest (0.8 to 2.2 s each,
# 7 s for the 6). The mark is on the class: absl's parameterized copies of a method do not
# keep a method-level mark.
@pytest.mark.slow
class LoweringSlowTest(parameterized.TestCase):

    @parameterized.named_parameters(*_EXPORT_SLOW)
    def test_chunk_wy_bwd_exports_for_cuda(self, **variant):
        _check_chunk_wy_bwd_exports(self, **variant)


_SMEM_LIMIT = 227 * 1024
_SMEM_K128_V128 = 225_288  # the docstring's count (K = V = 128, bf16)


def _export_ablated(ablations=None, dk=128, dv=128):
    """Exports the kernel for CUDA (gated, with documents); returns ``(mlir text, Mosaic GPU's
    SMEM count)``. ``ablations``: passed on unless ``None`` (then the kernel's default)."""
    batch, seq_len, heads = 1, 200, 2
    spec = jax.ShapeDtypeStruct
    args = (spec((batch, seq_len, heads, dk), jnp.bfloat16),
            spec((batch, seq_len, heads, dv), jnp.bfloat16),
            spec((batch, seq_len, heads), jnp.float32), spec((batch, seq_len, heads), jnp.float32),
            spec((batch, seq_len, heads, dk), jnp.float32),
            spec((batch, seq_len, heads, dv), jnp.float32))

    def fn(k, v, g, beta, dw, du, seg):
        return kwb.chunk_wy_bwd_mosaic(
            k, v, g, beta, dw, du, segment_ids=seg,
            **({} if ablations is None else dict(ablations=ablations)))

    return kmc_test.export_cuda_counting_smem(fn, *args, spec((batch, seq_len), jnp.int32))


class AblationTest(parameterized.TestCase):
    """The timing ablations (``ablations``, MOSAIC_GPU.md Sec. 26): each lowers for CUDA under
    its own kernel name and fits in SMEM; the default is ``()`` and its module is the real
    kernel's; bad values are refused; the op path never passes them."""

    @parameterized.parameters(*[(name,) for name in kwb.WY_BWD_ABLATIONS])
    def test_each_ablation_exports_under_its_name(self, name):
        text, smem = _export_ablated((name,))
        self.assertEqual(text.count("custom_call @mosaic_gpu"), 1)
        self.assertIn(f"{kwb.KERNEL_NAME}_abl_{name}\\00", text)  # the name, NUL-terminated
        self.assertLessEqual(smem, _SMEM_LIMIT)

    def test_default_is_the_real_kernel(self):
        (default, smem), (explicit, _) = cwg_test.default_and_explicit(_export_ablated)
        self.assertEqual(cwg_test.without_test_locations(explicit),
                         cwg_test.without_test_locations(default))  # the Mosaic module too
        self.assertNotIn("_abl_", default)
        self.assertIn(f"{kwb.KERNEL_NAME}\\00", default)
        self.assertEqual(smem, _SMEM_K128_V128)
        rest = _export_ablated(("no_split", "no_exp", "no_mma", "no_inverse"), dk=64, dv=64)[0]
        self.assertIn(f"{kwb.KERNEL_NAME}_abl_no_exp_no_inverse_no_mma_no_split\\00",
                      rest)  # sorted

    def test_rejects_bad_ablations_and_the_op_never_passes_them(self):
        (k, v, g, beta, dw, du), _, _ = _case(1, 64, 1, 1, 64, 64, 0.1, None, 0.0)
        for bad, msg in ((("nope",), "not in"), (("no_mma", "no_mma"), "repeat"),
                         ("no_mma", "tuple"), (("io", "no_mma"), "alone")):
            with self.assertRaisesRegex(ValueError, msg):
                kwb.chunk_wy_bwd_mosaic(k, v, g, beta, dw, du, ablations=bad)
        self.assertNotIn("ablation", inspect.getsource(mosaic_vjp))
        self.assertEqual(kwb.check_ablations(("no_split", "no_exp")),
                         ("no_exp", "no_split"))


class ValidationTest(absltest.TestCase):

    def test_rejects_what_the_kernel_cannot_run(self):
        (k, v, g, beta, dw, du), _, _ = _case(1, 64, 2, 1, 64, 64, 0.1, None, 0.0)
        with self.assertRaisesRegex(ValueError, "dw must be"):
            kwb.chunk_wy_bwd_mosaic(k, v, g, beta, dw[..., :32], du)
        with self.assertRaisesRegex(ValueError, "du must be"):
            kwb.chunk_wy_bwd_mosaic(k, v, g, beta, dw, du[:, :32])
        with self.assertRaisesRegex(ValueError, "beta must be"):
            kwb.chunk_wy_bwd_mosaic(k, v, g, beta[..., :1], dw, du)
        with self.assertRaisesRegex(ValueError, "head dims"):
            kwb.chunk_wy_bwd_mosaic(k, v[..., :32], g, beta, dw, du[..., :32])
        with self.assertRaisesRegex(ValueError, "16-bit dtype"):
            kwb.chunk_wy_bwd_mosaic(k, v.astype(jnp.float32), g, beta, dw, du)
        with self.assertRaisesRegex(ValueError, "out_dtype must be"):
            kwb.chunk_wy_bwd_mosaic(k, v, g, beta, dw, du, out_dtype=jnp.float16)
        with self.assertRaisesRegex(ValueError, "dk_partial must be"):
            kwb.chunk_wy_bwd_mosaic(k, v, g, beta, dw, du, dk_partial=dw[:, :32])
        with self.assertRaisesRegex(ValueError, "dg_partial must be"):
            kwb.chunk_wy_bwd_mosaic(k, v, g, beta, dw, du, dg_partial=(beta, beta))
        with self.assertRaisesRegex(ValueError, "gate_cumsum must be"):
            kwb.chunk_wy_bwd_mosaic(k, v, g, beta, dw, du, gate_cumsum=beta)
        with self.assertRaisesRegex(ValueError, "doc_vecs must be"):
            kwb.chunk_wy_bwd_mosaic(k, v, g, beta, dw, du, doc_vecs=(beta, beta, beta))
        with self.assertRaisesRegex(ValueError, "no out_dtype"):
            kwb.chunk_wy_bwd_mosaic(k, v, g, beta, dw, du, out_dtype=k.dtype,
                                    ablations=("no_exp",))


if __name__ == "__main__":
    absltest.main()
