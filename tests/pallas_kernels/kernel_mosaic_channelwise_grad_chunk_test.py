"""K2, K1 + ``backward_chunk`` + the kr chain rule on Mosaic GPU (KDA, GDN-2; issue 29).

``pallas_kernels/common/channelwise_grad_mosaic_gpu.py`` has
:func:`channelwise_grad_chunk_mosaic` (K2, ``grad_pass="mosaic_fused"``; MOSAIC_GPU.md Sec.
19.4.4 and 21). Its inputs come from the real forward as in K1's tests
(``kernel_mosaic_channelwise_grad_test.grad_inputs``, Pallas interpret mode), plus the chunks'
entry states ``hs``, exit cotangents ``dhs`` and the kr scale ``ks``.

* ``LoweringTest`` (CI): K2 exports for CUDA at K, V in {64, 128}, bf16 / fp16, per-token and
  per-channel ``ks``, with and without documents; the SMEM counts pinned (the limit is
  232,448 bytes); the KDA and GDN-2 forward + backward with ``grad_pass="mosaic_fused"``
  export with K2 and neither ``grad_blocks`` nor ``backward_chunk``.
* ``Jax011LoweringTest`` (CI where the test process has jax >= 0.11, skipped below): K2 with
  and without documents at K = V in {64, 128} and both slabs, and with GDN-2's fp32
  per-channel ``ks``, the layout search on a small fuel (MOSAIC_GPU.md Sec. 24.2).
* ``AblationTest`` (CI): the timing ablations (MOSAIC_GPU.md Sec. 22) export for CUDA under
  their kernel names; the default equals ``ablations=()``; bad names are refused.
* ``ValidationTest`` (CI): the ValueErrors and the fp32 fallback to Triton.
* ``InterpretTest`` (``slow``, one case per test): K2 in Mosaic GPU interpret mode
  (``detect_races=True``) and the Triton path (``_grad_blocks`` + ``backward_chunk`` in Pallas
  interpret mode, then ``_kr_chain``) on identical inputs, each against a float64 NumPy
  evaluation of the same equations; and the two against each other.
* ``OpInterpretTest`` (``slow``): the whole KDA and GDN-2 ops with ``"mosaic_fused"`` against
  ``"triton"`` and the fp32 token-serial reference.
* ``GpuTest`` (``gpu``): the compiled K2 against float64 and the compiled Triton path; the whole
  ops against the fp32 reference.

Interpret tests, one at a time on a 2-core host: ``PJRT_NPROC=8 timeout 900 python -m pytest
-q -m slow tests/pallas_kernels/kernel_mosaic_channelwise_grad_chunk_test.py``.
"""

import collections
import contextlib
import functools
import inspect
import io
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest, parameterized
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.common import channelwise_gpu
from pallas_kernels.common import channelwise_grad_mosaic_gpu as k2
from pallas_kernels.common import channelwise_mosaic_gpu as cwm
from pallas_kernels.common import validation
from tests import tolerances
from tests.pallas_kernels import kernel_gpu_channelwise_test as cw_test
from tests.pallas_kernels import kernel_mosaic_channelwise_grad_test as k1_test
from tests.pallas_kernels import kernel_mosaic_channelwise_test as kmc_test
from tests.pallas_kernels import kernel_mosaic_gpu_test as kmg_test

C = k2.CHUNK
_REF_GATE = 5e-3  # relative RMS against float64, K2 and the Triton path alike
_PAIR_GATE = 4e-3  # K2 against the Triton path (the op tests' gate)
_SMEM_LIMIT = 227 * 1024
# Mosaic GPU's own count of the CUDA export (jax 0.10.2), MOSAIC_GPU.md Sec. 21, 24 and 44.2
# (8 KB below the counts with a kr buffer: 208,952, 224,312, 204,856, 220,216).
_SMEM_K128_V128 = 200_760  # per-token ks (KDA), documents or not; slab 32
_SMEM_K128_V128_KS_F32 = 216_120  # per-channel fp32 ks (GDN-2); slab 32
_SMEM_K128_V128_SLAB16 = 196_664  # slab 16 (the parked partials, 24 KB)
_SMEM_K128_V128_KS_F32_SLAB16 = 212_024
_NAMES = ("dq", "dk", "dks", "dg")


def triton_path(cfg, args, ks, hs, dhs, doc_arrays):
    """``(dq, dk, dks, dg)`` as the Triton path hands them on: ``_grad_blocks``, the
    ``backward_chunk`` kernel, then ``channelwise_gpu._kr_chain`` (K2's contract)."""
    q, k, kr, gam, do, vn, dr = args

    @jax.jit
    def run(q, k, kr, gam, do, vn, dr, ks, hs, dhs):
        dqd, dkd, dkrd = channelwise_gpu._grad_blocks(cfg, q, k, kr, gam, doc_arrays, do, vn,
                                                      dr)
        # _backward_chunk without its own _chunk_dr and grad_blocks: the same kernel call.
        outs = _backward_chunk_kernel_only(cfg, q, k, kr, gam, doc_arrays, hs, dhs, do, vn, dr,
                                           dqd, dkd, dkrd)
        dq, dk, dkr, dg = outs
        dk, dks = channelwise_gpu._kr_chain(k, ks, dk, dkr)
        return dq, dk, dks, dg

    return run(q, k, kr, gam, do, vn, dr, ks, hs, dhs)


def _backward_chunk_kernel_only(cfg, q, k, kr, gam, docs, hs, dhs, do, vn, dr, dqd, dkd,
                                dkrd):
    bsz, tp, heads, dk = q.shape
    tok_k = jax.ShapeDtypeStruct((bsz, tp, heads, dk), q.dtype)
    outs = channelwise_gpu._pallas(
        channelwise_gpu._backward_chunk_kernel, cfg,
        inputs=[("q_ref", q), ("k_ref", k), ("kr_ref", kr), ("gam_ref", gam)]
        + channelwise_gpu._doc_inputs(docs)
        + [("hs_ref", hs), ("dhs_ref", dhs), ("do_ref", do), ("vn_ref", vn), ("dr_ref", dr),
           ("dqd_ref", dqd), ("dkd_ref", dkd), ("dkrd_ref", dkrd)],
        outputs=[("dq_ref", tok_k), ("dk_ref", tok_k), ("dkr_ref", tok_k),
                 ("dgam_ref", jax.ShapeDtypeStruct((bsz, tp, heads, dk), jnp.float32))],
        grid=(cfg["n_chunks"], bsz * heads, dk // cfg["block_k"]), tune="backward_chunk",
        name="channelwise_backward_chunk")
    return outs["dq_ref"], outs["dk_ref"], outs["dkr_ref"], outs["dgam_ref"]


def reference(args, ks, hs, dhs, doc_arrays, scale):
    """float64 NumPy ``(dq, dk, dks, dg)`` of K2's equations (``backward_chunk`` on K1's
    float64 partials, then the kr chain), no rounding anywhere."""
    doc = doc_arrays[0] if doc_arrays else None
    dq_m, dk_m, dkr_m = k1_test.reference(args, doc, scale)
    q, k, kr, gam, do, vn, dr = (np.asarray(x, np.float64) for x in args)
    ks, hs, dhs = (np.asarray(x, np.float64) for x in (ks, hs, dhs))
    batch, tp, heads, dk = q.shape
    n = tp // C

    def chunks(x):
        return x.reshape(batch, n, C, heads, -1)

    q, k, kr, gam, do, vn, dr, dq_m, dk_m, dkr_m = (
        chunks(x) for x in (q, k, kr, gam, do, vn, dr, dq_m, dk_m, dkr_m))
    if doc_arrays:
        conn, last = (np.asarray(x, np.float64).reshape(batch, n, C, 1, 1)
                      for x in doc_arrays[1:])
    else:
        conn = last = np.ones((batch, n, C, 1, 1))
    g_last = gam[:, :, -1:]
    e_in = np.exp(gam) * conn
    e_out = np.exp(g_last - gam) * last
    e_all = np.exp(g_last[:, :, 0]) * conn[:, :, -1]  # [B, N, H, K]
    dq_s = scale * np.einsum("bnihv,bhnkv->bnihk", do, hs) * e_in
    dkr_s = -np.einsum("bnihv,bhnkv->bnihk", dr, hs) * e_in
    dk_s = np.einsum("bnihv,bhnkv->bnihk", vn, dhs) * e_out
    de_all = np.transpose(np.sum(hs * dhs, axis=-1), (0, 2, 1, 3))  # [B, N, H, K]
    dk_o = k * dk_s
    dgam = q * dq_s + kr * dkr_s - dk_o
    dgam[:, :, -1] += np.sum(dk_o, axis=2) + de_all * e_all
    dgam += q * dq_m + kr * dkr_m - k * dk_m
    dg = np.flip(np.cumsum(np.flip(dgam, 2), axis=2), 2)
    dq, dkr, dkk = dq_s + dq_m, dkr_s + dkr_m, dk_s + dk_m
    ks_c = chunks(ks)
    dk_out = dkk + ks_c * dkr
    dks = k * dkr
    if ks.shape[-1] == 1:
        dks = np.sum(dks, axis=-1, keepdims=True)
    return tuple(x.reshape(batch, tp, heads, -1) for x in (dq, dk_out, dks, dg))


def _check_kernel(test, case, *, interpret=True, slab=k2.SLAB):
    seed, batch, seq_len, heads, dk, dv, dtype, docs, decay, h0, gdn2 = case
    cfg, args, doc_arrays, (ks, hs, dhs) = k1_test.grad_inputs(
        seed, batch, seq_len, heads, dk, dv, jnp.dtype(dtype), docs=docs, decay=decay, h0=h0,
        gdn2=gdn2, interpret=interpret, full=True)
    doc = doc_arrays[0] if doc_arrays else None
    q, k, kr, gam, do, vn, dr = args
    log = io.StringIO()
    with contextlib.redirect_stdout(log):  # the interpreter prints the races it detects
        got = jax.block_until_ready(k2.channelwise_grad_chunk_mosaic(  # K2 forms kr itself
            q, k, ks, gam, hs, dhs, do, vn, dr, scale=cfg["scale"], doc=doc, slab=slab,
            interpret=interpret))
    races = log.getvalue()
    test.assertFalse("RACE DETECTED" in races, races[:600])
    tri = triton_path(cfg, args, ks, hs, dhs, doc_arrays)
    want = reference(args, ks, hs, dhs, doc_arrays, cfg["scale"])
    errs = {}
    for name, a, t, e in zip(_NAMES, got, tri, want):
        test.assertEqual((a.shape, a.dtype), (t.shape, t.dtype), name)
        test.assertFalse(np.isnan(np.asarray(a, np.float32)).any(), f"{name}: NaN")
        errs[name] = (tolerances.rel_err(a, e), tolerances.rel_err(t, e),
                      tolerances.rel_err(a, t))
        test.assertLess(errs[name][0], _REF_GATE, f"K2 {name} vs float64")
        test.assertLess(errs[name][1], _REF_GATE, f"Triton {name} vs float64")
        test.assertLess(errs[name][2], _PAIR_GATE, f"K2 {name} vs Triton")
    print("rel RMS (K2 vs float64, Triton vs float64, K2 vs Triton):", errs)


def _check_floor_g(test, case, slab, interpret):
    """K2 with ``g`` (the unfloored log-decay, MOSAIC_GPU.md Sec. 47.5): ``dg`` bit for bit
    ``validation.floor_log_decay_grad(g, dg)`` of the kernel without it (``dg`` above the floor,
    half at it, 0 below), the other outputs unchanged. ``g``: random, with tokens at -inf,
    -1e8, exactly the floor and just above it on some channels."""
    seed, batch, seq_len, heads, dk, dv, dtype, docs, decay, h0, gdn2 = case
    cfg, args, doc_arrays, (ks, hs, dhs) = k1_test.grad_inputs(
        seed, batch, seq_len, heads, dk, dv, jnp.dtype(dtype), docs=docs, decay=decay, h0=h0,
        gdn2=gdn2, interpret=interpret, full=True)
    q, k, _, gam, do, vn, dr = args
    rng = np.random.default_rng(seed)
    g = -np.abs(rng.standard_normal(q.shape)).astype(np.float32)
    for t, value in zip((3, 40, 64, 70), (-np.inf, -1e8, -128.0, -127.99999)):
        if t < g.shape[1]:
            g[:, t, :, : dk // 2] = value
    g = jnp.asarray(g)
    kw = dict(scale=cfg["scale"], doc=doc_arrays[0] if doc_arrays else None, slab=slab,
              interpret=interpret)
    want = k2.channelwise_grad_chunk_mosaic(q, k, ks, gam, hs, dhs, do, vn, dr, **kw)
    got = k2.channelwise_grad_chunk_mosaic(q, k, ks, gam, hs, dhs, do, vn, dr, g=g, **kw)
    expect = tuple(want[:3]) + (validation.floor_log_decay_grad(g, want[3]),)
    for name, a, e in zip(_NAMES, got, expect):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(e, np.float32),
                                      err_msg=name)
    below = np.asarray(g) < -128.0
    test.assertTrue(below.any())
    np.testing.assert_array_equal(np.asarray(got[3])[below], 0.0)


# K1's cases (kernel_mosaic_channelwise_grad_test._CASES): documents at, just after and inside
# chunk boundaries, log-decays to about -20 per token, fp16, partial chunks, GDN-2.
_CASES = k1_test._CASES


@pytest.mark.slow
class InterpretTest(parameterized.TestCase):
    """K2 in Mosaic GPU interpret mode and the Triton path in Pallas interpret mode."""

    @parameterized.named_parameters(*_CASES)
    def test_kernel_and_triton_match_float64(self, *case):
        _check_kernel(self, case)

    # Two 16-channel steps per warpgroup (TUNING's default, no spills; MOSAIC_GPU.md Sec. 24):
    # K1's cases again (per-token and per-channel ks, K 64 and 128, V 64 and 128).
    @parameterized.named_parameters(*[(name + "_slab16", *rest) for name, *rest in _CASES])
    def test_slab16_matches_float64_and_triton(self, *case):
        _check_kernel(self, case, slab=16)

    def test_unpadded_length_pads_inside(self):
        # T = 100 given directly: the kernel zero-pads and returns the first T rows.
        cfg, args, doc_arrays, (ks, hs, dhs) = k1_test.grad_inputs(
            4, 1, 100, 1, 64, 64, jnp.bfloat16, docs=(70,), full=True)
        doc = doc_arrays[0]
        cut = [x.at[:, 100:].set(0) for x in args]
        ks = ks.at[:, 100:].set(0)
        q, k, _, gam, do, vn, dr = cut
        full = k2.channelwise_grad_chunk_mosaic(q, k, ks, gam, hs, dhs, do, vn, dr,
                                                scale=cfg["scale"], doc=doc, interpret=True)
        q, k, _, gam, do, vn, dr = (x[:, :100] for x in cut)
        part = k2.channelwise_grad_chunk_mosaic(q, k, ks[:, :100], gam, hs, dhs, do, vn, dr,
                                                scale=cfg["scale"], doc=doc[:, :100],
                                                interpret=True)
        for name, a, e in zip(_NAMES, part, full):
            np.testing.assert_array_equal(a, e[:, :100], err_msg=name)

    @parameterized.named_parameters(("slab32", _CASES[0], 32), ("slab16_gdn2", _CASES[1], 16))
    def test_unfloored_g_takes_dg_through_the_floor(self, case, slab):
        _check_floor_g(self, case[1:], slab, interpret=True)

    # K = 128 (two key halves: only half 0 stores dvw), documents, a partial last chunk; and
    # slab 16 (the first slab the epilogue runs is the one that issues the store).
    @parameterized.named_parameters(("slab32", _CASES[0], 32), ("slab16_K64", _CASES[2], 16))
    def test_heads_first_dr_gives_the_same_bits_and_dvw(self, case, slab):
        """``dr_heads_first``: dR read as ``[B, H, T, V]`` and written back as ``dvw`` ``[B, T,
        H, V]`` (MOSAIC_GPU.md Sec. 47.2): the four outputs bit for bit those of the
        ``[B, T, H, V]`` kernel, and ``dvw`` equal to ``dr``."""
        seed, batch, seq_len, heads, dk, dv, dtype, docs, decay, h0, gdn2 = case[1:]
        cfg, args, doc_arrays, (ks, hs, dhs) = k1_test.grad_inputs(
            seed, batch, seq_len, heads, dk, dv, jnp.dtype(dtype), docs=docs, decay=decay,
            h0=h0, gdn2=gdn2, interpret=True, full=True)
        doc = doc_arrays[0] if doc_arrays else None
        q, k, _, gam, do, vn, dr = (x[:, :seq_len] for x in args)  # T not a chunk multiple
        ks = ks[:, :seq_len]
        kw = dict(scale=cfg["scale"], doc=None if doc is None else doc[:, :seq_len],
                  slab=slab, interpret=True)
        want = k2.channelwise_grad_chunk_mosaic(q, k, ks, gam, hs, dhs, do, vn, dr, **kw)
        log = io.StringIO()
        with contextlib.redirect_stdout(log):
            got = jax.block_until_ready(k2.channelwise_grad_chunk_mosaic(
                q, k, ks, gam, hs, dhs, do, vn, jnp.transpose(dr, (0, 2, 1, 3)),
                dr_heads_first=True, **kw))
        self.assertNotIn("RACE DETECTED", log.getvalue())
        self.assertLen(got, 5)
        for name, a, e in zip(_NAMES + ("dvw",), got, want + (dr,)):
            self.assertEqual((a.shape, a.dtype), (e.shape, e.dtype), name)
            np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(e, np.float32),
                                          err_msg=name)


@pytest.mark.slow
class OpInterpretTest(parameterized.TestCase):
    """The whole op (``implementation="pallas_interpret"``) with ``grad_pass="mosaic_fused"``."""

    # The third: log-decays to about -20 per token and below (dg is jla's failure mode there).
    @parameterized.parameters(("kda", 64, 1.0), ("gdn2", 128, 1.0), ("kda", 64, 10.0))
    def test_fused_grad_pass_matches_triton_and_k1(self, op, dim, decay):
        inputs, cot_key = cw_test._inputs(4, 1, 150, 1, 1, dim, dtype=jnp.bfloat16,
                                          decay=decay)
        seg = jnp.asarray(np.repeat(np.arange(3), [30, 70, 50])[None], jnp.int32)
        run = k1_test._op_outputs_and_grads
        want = run(op, inputs, seg, cot_key, "triton", "pallas_interpret")
        k1_out = run(op, inputs, seg, cot_key, "mosaic", "pallas_interpret")
        got = run(op, inputs, seg, cot_key, "mosaic_fused", "pallas_interpret")
        for name, a, e in zip(("o", "final_state"), got[0], want[0]):  # the forward: unchanged
            np.testing.assert_array_equal(a, e, err_msg=f"{op} {name}")
        ref = cw_test._outputs_and_grads(op, None, inputs, seg, cot_key, False)
        errs = {}
        for name in cw_test._DIFF_ARGS[op]:
            errs[name] = (tolerances.rel_err(got[1][name], ref[1][name]),
                          tolerances.rel_err(want[1][name], ref[1][name]),
                          tolerances.rel_err(got[1][name], k1_out[1][name]))
            self.assertEqual(got[1][name].dtype, want[1][name].dtype, name)
            self.assertLess(tolerances.rel_err(got[1][name], want[1][name]), _PAIR_GATE,
                            f"{op} d{name}")
            # Against the fp32 token-serial reference: within 10 % of the Triton path's error
            # (MOSAIC_GPU.md Sec. 19.4.2's criterion).
            self.assertLessEqual(errs[name][0], 1.1 * errs[name][1] + 1e-5,
                                 f"{op} d{name} vs the fp32 reference")
            # K2 is K1 plus backward_chunk's arithmetic: only fp32 summation order (dg's
            # cumsum, dks's partials) and the roundings it flips differ (measured at most
            # 2e-6, dg; a cumsum of the bf16 piece alone reads about 1e-3 here).
            self.assertLess(errs[name][2], 2e-5, f"{op} d{name}: K2 vs K1")
        print(op, "rel RMS (K2 vs fp32 ref, Triton vs fp32 ref, K2 vs K1):", errs)


def _export_kernel(dk, dv, dtype, docs=True, ks_channels=False, ks_dtype=jnp.float32,
                   ablations=None, slab=k2.SLAB, dr_heads_first=False, floor_g=False):
    """Exports K2 for CUDA; returns ``(mlir text, Mosaic GPU's SMEM count)``. ``ablations``:
    passed on unless ``None`` (then the kernel's default); ``dr_heads_first``: ``dr`` ``[B,
    H, T, V]`` and the ``dvw`` output; ``floor_g``: the unfloored ``g`` given."""
    batch, seq_len, heads = 1, 200, 2
    n = -(-seq_len // C)
    spec = jax.ShapeDtypeStruct
    args = ([spec((batch, seq_len, heads, dk), dtype)] * 2  # q, k (K2 forms kr)
            + [spec((batch, seq_len, heads, dk if ks_channels else 1), ks_dtype),
               spec((batch, seq_len, heads, dk), jnp.float32)]
            + [spec((batch, heads, n, dk, dv), dtype)] * 2
            + [spec((batch, seq_len, heads, dv), dtype)] * 2
            + [spec((batch, heads, seq_len, dv) if dr_heads_first else (batch, seq_len, heads, dv),
                    dtype)])
    doc = spec((batch, seq_len), jnp.int32) if docs else None

    g = spec((batch, seq_len, heads, dk), jnp.float32) if floor_g else None

    def fn(*args, doc=None, g=None):
        return k2.channelwise_grad_chunk_mosaic(
            *args, scale=0.1, doc=doc, slab=slab, dr_heads_first=dr_heads_first, g=g,
            **({} if ablations is None else dict(ablations=ablations)))

    return kmc_test.export_cuda_counting_smem(fn, *args, doc=doc, g=g)


class LoweringTest(parameterized.TestCase):
    """The layout branch the interpreter replaces, lowered for CUDA on the CPU host."""

    @parameterized.named_parameters(
        ("K128_V128_bf16_docs", 128, 128, jnp.bfloat16, True, False, jnp.float32,
         _SMEM_K128_V128),
        ("K128_V128_bf16_ks_channels_f32", 128, 128, jnp.bfloat16, True, True, jnp.float32,
         _SMEM_K128_V128_KS_F32),
        ("K64_V64_fp16", 64, 64, jnp.float16, False, False, jnp.float32, None),
        ("K128_V64_bf16_ks_channels_bf16", 128, 64, jnp.bfloat16, True, True, jnp.bfloat16,
         None),
        ("K64_V128_fp16_docs", 64, 128, jnp.float16, True, False, jnp.bfloat16, None),
        ("K128_V128_bf16_docs_slab16", 128, 128, jnp.bfloat16, True, False, jnp.float32,
         _SMEM_K128_V128_SLAB16, 16),
        ("K128_V128_bf16_ks_channels_f32_slab16", 128, 128, jnp.bfloat16, True, True,
         jnp.float32, _SMEM_K128_V128_KS_F32_SLAB16, 16),
        ("K64_V64_fp16_slab16", 64, 64, jnp.float16, False, False, jnp.float32, None, 16),
        ("K128_V64_bf16_ks_channels_bf16_slab16", 128, 64, jnp.bfloat16, True, True,
         jnp.bfloat16, None, 16),
    )
    def test_kernel_exports_for_cuda(self, dk, dv, dtype, docs, ks_channels, ks_dtype,
                                     smem_want, slab=k2.SLAB):
        text, smem = _export_kernel(dk, dv, dtype, docs, ks_channels, ks_dtype, slab=slab)
        self.assertEqual(text.count("custom_call @mosaic_gpu"), 1)
        self.assertIn(k2.K2_KERNEL_NAME, text)
        self.assertLessEqual(smem, _SMEM_LIMIT)
        if smem_want is not None:  # pinned: MOSAIC_GPU.md Sec. 21 and the docstring quote them
            self.assertEqual(smem, smem_want)

    @parameterized.parameters((False, _SMEM_K128_V128), (True, _SMEM_K128_V128_KS_F32))
    def test_unfloored_g_exports_with_the_same_smem(self, ks_channels, smem_want):
        # g's tiles are read from GMEM in the epilogue: no SMEM of their own.
        text, smem = _export_kernel(128, 128, jnp.bfloat16, True, ks_channels,
                                    dr_heads_first=True, floor_g=True)
        self.assertEqual(text.count("custom_call @mosaic_gpu"), 1)
        self.assertEqual(smem, smem_want)

    @parameterized.parameters((False, _SMEM_K128_V128), (True, _SMEM_K128_V128_KS_F32))
    def test_heads_first_dr_exports_with_the_same_smem(self, ks_channels, smem_want):
        # dR read as [B, H, T, V] and stored back as dvw by TMA: no SMEM of its own.
        text, smem = _export_kernel(128, 128, jnp.bfloat16, True, ks_channels,
                                    dr_heads_first=True)
        self.assertEqual(text.count("custom_call @mosaic_gpu"), 1)
        self.assertEqual(smem, smem_want)

    def test_kda_fwd_bwd_exports_without_grad_blocks_or_backward_chunk(self):
        names, mosaic, text = k1_test._export_op(
            "kda", {"grad_pass": "mosaic_fused", "state_pass": "triton"})
        self.assertEqual(mosaic, 1)
        self.assertIn(k2.K2_KERNEL_NAME, text)
        self.assertEqual(names, collections.Counter(
            ["gamma", "intra", "prepare", "wu", "forward", "backward_state"]))

    def test_gdn2_fwd_bwd_exports_with_every_mosaic_pass(self):
        tuning = {"grad_pass": "mosaic_fused", "state_pass": "mosaic"}
        names, mosaic, text = k1_test._export_op("gdn2", tuning)
        self.assertEqual(mosaic, 3)
        for name in (k2.K2_KERNEL_NAME, cwm.KERNEL_NAME, cwm.BWD_KERNEL_NAME):
            self.assertIn(name, text)
        self.assertEqual(names, collections.Counter(["gamma", "intra", "prepare", "wu"]))


@absltest.skipUnless(k1_test._JAX_011, f"needs {k1_test._NOT_011}")
class Jax011LoweringTest(parameterized.TestCase):
    """K2 lowers on jax >= 0.11 with document ids (KDA's per-token and GDN-2's per-channel
    ``ks``) and without, at both slabs (MOSAIC_GPU.md Sec. 24.2), the layout search on a small
    fuel (``k1_test.small_layout_fuel``)."""

    @parameterized.product(dim=(64, 128), slab=k2.SLABS, docs=(True, False))
    def test_exports(self, dim, slab, docs):
        with k1_test.small_layout_fuel():
            text, smem = _export_kernel(dim, dim, jnp.bfloat16, docs, slab=slab)
        self.assertEqual(text.count("custom_call @mosaic_gpu"), 1)
        self.assertLessEqual(smem, _SMEM_LIMIT)

    @parameterized.product(slab=k2.SLABS, ks_channels=(False, True))
    def test_exports_with_heads_first_dr_and_unfloored_g(self, slab, ks_channels):
        with k1_test.small_layout_fuel():
            text, smem = _export_kernel(128, 128, jnp.bfloat16, True, ks_channels, slab=slab,
                                        dr_heads_first=True, floor_g=True)
        self.assertEqual(text.count("custom_call @mosaic_gpu"), 1)
        self.assertLessEqual(smem, _SMEM_LIMIT)

    @parameterized.parameters(*k2.SLABS)
    def test_exports_with_per_channel_ks(self, slab):
        with k1_test.small_layout_fuel():
            text, smem = _export_kernel(128, 128, jnp.bfloat16, True, True, slab=slab)
        self.assertEqual(text.count("custom_call @mosaic_gpu"), 1)
        self.assertLessEqual(smem, _SMEM_LIMIT)


class AblationTest(parameterized.TestCase):
    """K2's timing ablations (``ablations``, MOSAIC_GPU.md Sec. 22) at S1's K = V = 128 with a
    per-token ``ks``: each lowers for CUDA under its own kernel name and fits in SMEM; the
    default is ``()`` and its module is the real kernel's; bad names are refused."""

    @parameterized.parameters(*[(name,) for name in k2.K2_ABLATIONS])
    def test_each_ablation_exports_under_its_name(self, name):
        text, smem = _export_kernel(128, 128, jnp.bfloat16, docs=False, ablations=(name,))
        self.assertEqual(text.count("custom_call @mosaic_gpu"), 1)
        self.assertIn(f'{k2.K2_KERNEL_NAME}_abl_{name}\\00', text)  # the name, NUL-terminated
        self.assertLessEqual(smem, _SMEM_LIMIT)

    def test_default_is_the_real_kernel(self):
        (default, smem), (explicit, _) = k1_test.default_and_explicit(
            functools.partial(_export_kernel, 128, 128, jnp.bfloat16, docs=False))
        self.assertEqual(k1_test.without_test_locations(explicit),
                         k1_test.without_test_locations(default))
        self.assertNotIn("_abl_", default)
        self.assertEqual(smem, _SMEM_K128_V128)

    def test_rejects_bad_ablations(self):
        args = ValidationTest()._args()
        for bad, msg in ((("nope",), "not in"), (("no_cumsum", "no_cumsum"), "repeat"),
                         ("no_state", "tuple")):
            with self.assertRaisesRegex(ValueError, msg):
                k2.channelwise_grad_chunk_mosaic(*args, scale=0.1, ablations=bad)


class FenceTest(parameterized.TestCase):
    """Every register -> SMEM store that a ``wgmma`` reads is fenced first (MOSAIC_GPU.md Sec.
    41; ``k1_test.unfenced_wgmma``), per-token and per-channel ``ks``."""

    @parameterized.parameters((16, False), (32, False), (16, True))
    def test_k2_fences_its_operand_stores(self, slab, ks_channels):
        exported = _export_kernel(128, 128, jnp.bfloat16, slab=slab, ks_channels=ks_channels)[0]
        text = k1_test.mosaic_module_or_skip(self, exported)
        self.assertGreater(text.count("wgmma.mma_async"), 54)
        self.assertEqual(k1_test.unfenced_wgmma(text), [])


class ValidationTest(parameterized.TestCase):

    def _args(self, dk=64, dv=64, dtype=jnp.bfloat16, seq_len=100, ks_dim=1):
        keyed = [jnp.zeros((1, seq_len, 2, dk), dtype) for _ in range(2)]  # q, k
        n = -(-seq_len // C)
        return (keyed + [jnp.zeros((1, seq_len, 2, ks_dim), jnp.float32),
                         jnp.zeros((1, seq_len, 2, dk), jnp.float32)]
                + [jnp.zeros((1, 2, n, dk, dv), dtype) for _ in range(2)]
                + [jnp.zeros((1, seq_len, 2, dv), dtype) for _ in range(3)])

    def check_raises(self, pattern, args, **kwargs):
        with self.assertRaisesRegex(ValueError, pattern):
            k2.channelwise_grad_chunk_mosaic(*args, scale=0.1, **kwargs)

    def test_rejects_what_the_kernel_cannot_take(self):
        self.check_raises("^q, k, do, vn, dr must share a 16-bit dtype.*grad_pass='triton'",
                          self._args(dtype=jnp.float32))  # names no kr: K2 takes none
        self.check_raises("head dims", self._args(dk=32))
        self.check_raises("head dims", self._args(dv=256))
        args = self._args()
        self.check_raises("^k must", args[:1] + [args[1].astype(jnp.float16)] + args[2:])
        self.check_raises("^k must", args[:1] + [args[1][..., :32]] + args[2:])
        self.check_raises("ks must", args[:2] + [args[2][:, :, :1]] + args[3:])
        self.check_raises("ks must", args[:2] + [jnp.zeros((1, 100, 2, 32))] + args[3:])
        self.check_raises("ks must", args[:2] + [args[2].astype(jnp.int32)] + args[3:])
        self.check_raises("gamma must", args[:3] + [args[3][..., :32]] + args[4:])
        self.check_raises("hs must", args[:4] + [args[4][:, :, :1]] + args[5:])
        self.check_raises("dhs must", args[:5] + [args[5].astype(jnp.float32)] + args[6:])
        self.check_raises("do must", args[:6] + [args[6][:, :50]] + args[7:])
        self.check_raises("doc must", args, doc=jnp.zeros((1, 64), jnp.int32))
        self.check_raises("slab must", args, slab=24)
        k2.check_chunk_inputs(*self._args(ks_dim=64), None)  # per-channel ks is fine

    def test_k2_has_no_kr_buffer_or_copy(self):
        # K2 forms kr = k ks in registers (_kr_tile): no kr SMEM buffer and no kr copy on
        # qk_bar (q, k, gamma, the marks, ks and, with documents, conn and last), while K1
        # keeps both (q, k, kr, gamma, the marks).
        def qk_arrivals(scratch, names):
            return scratch[list(names).index("qk_bar")].num_arrivals

        for docs in (False, True):
            k1_scratch, k1_names = k2._scratch(jnp.bfloat16, 64, 16, docs, True)
            k2_scratch, k2_names = k2._scratch(jnp.bfloat16, 64, 16, docs, True, fused=True,
                                               ks_smem=plgpu.SMEM((C,), jnp.float32))
            self.assertIn("kr", k1_names)
            self.assertNotIn("kr", k2_names)
            self.assertEqual(qk_arrivals(k1_scratch, k1_names), 5)
            self.assertEqual(qk_arrivals(k2_scratch, k2_names), 5 + 2 * docs)
        self.assertNotIn("kr", inspect.signature(
            k2.channelwise_grad_chunk_mosaic.__wrapped__).parameters)

    def test_split3_is_exact_and_the_cumsum_fp32(self):
        # dg = U @ (hi + mid + lo): the three bf16 pieces sum to dgam exactly, so each product
        # term is exact and only the fp32 accumulation rounds (the tensor-core reverse cumsum).
        rng = np.random.default_rng(0)
        # (exact while the lo piece stays a normal number: |x| above about 1e-33)
        x = (rng.standard_normal((64, 32)) * 10.0 ** rng.integers(-25, 25, (64, 32)))
        x = jnp.asarray(x, jnp.float32)
        pieces = k2._split3(x)
        self.assertTrue(all(p.dtype == jnp.bfloat16 for p in pieces))
        total = sum(np.asarray(p, np.float64) for p in pieces)
        np.testing.assert_array_equal(total, np.asarray(x, np.float64))
        y = jnp.asarray(rng.standard_normal((64, 32)), jnp.float32)
        upper = jnp.triu(jnp.ones((64, 64), jnp.bfloat16))
        lo, mid, hi = (jnp.dot(upper, p, preferred_element_type=jnp.float32)
                       for p in reversed(k2._split3(y)))
        want = np.flip(np.cumsum(np.flip(np.asarray(y, np.float64), 0), axis=0), 0)
        self.assertLess(tolerances.rel_err((lo + mid) + hi, want), 1e-6)

    def test_gamma_bit_halves_are_exact(self):
        # The band's gamma shift buffer holds fp32 bits as two 16-bit halves (MOSAIC_GPU.md
        # Sec. 43): every pattern comes back, denormals, signed zeros, infinities, NaN included.
        rng = np.random.default_rng(1)
        bits = rng.integers(0, 2 ** 32, (64, 32), dtype=np.uint64).astype(np.uint32)
        bits[0, :6] = np.array([0, 0x80000000, 0x00000001, 0x7F800000, 0xFF800000, 0x7FC00001],
                               np.uint32)
        x = jnp.asarray(bits.view(np.float32))
        hi, lo = k2._split_bits(x)
        self.assertEqual((hi.dtype, lo.dtype), (jnp.bfloat16, jnp.bfloat16))
        back = np.asarray(k2._join_bits(hi, lo)).view(np.uint32)
        np.testing.assert_array_equal(back, bits)
        g = -jnp.cumsum(jnp.asarray(rng.uniform(0.0, 1.0, (64, 32)), jnp.float32), axis=0)
        np.testing.assert_array_equal(np.asarray(k2._join_bits(*k2._split_bits(g))), g)

    def test_cumsum_without_column_sums_is_backward_chunks(self):
        # K2's dg = U @ (dgam0 + x_de) + L @ s - s (L = U^T), s = k dk_S + x_de (the de terms
        # on the diagonal rows), equals the reverse cumsum of backward_chunk's dgam = dgam0 -
        # k dk_S plus, on the last row, colsum(k dk_S) + de_all e_all (MOSAIC_GPU.md Sec. 43):
        # float64 values, so the identity alone is checked.
        rng = np.random.default_rng(2)
        rows, slab, first = 64, 16, 32
        dgam0, dk_o, p_de = (rng.standard_normal((rows, slab)) for _ in range(3))
        e_all = np.exp(-rng.uniform(0, 5, slab))
        diag = np.arange(rows)[:, None] == np.arange(slab)[None, :] + first
        x_de = np.where(diag, p_de, 0.0) * e_all
        upper = np.triu(np.ones((rows, rows)))
        spread = dk_o + x_de
        got = upper @ (dgam0 + x_de) + upper.T @ spread - spread
        de_all = p_de[first + np.arange(slab), np.arange(slab)]
        dgam = dgam0 - dk_o
        dgam[-1] += dk_o.sum(axis=0) + de_all * e_all
        want = np.flip(np.cumsum(np.flip(dgam, 0), axis=0), 0)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)

    def test_fused_grad_pass_option(self):
        base = dict(batch=1, heads=1, n_chunks=1, dk=64, dv=64, scale=0.1, has_docs=False,
                    interpret=True, return_residual=False)
        cfg = channelwise_gpu._config(**base, mm_dtype=jnp.bfloat16, grad_pass="mosaic_fused")
        self.assertEqual(cfg["grad_pass"], "mosaic_fused")
        # fp32 operands: the Mosaic kernels cannot take them, the Triton path runs.
        cfg = channelwise_gpu._config(**base, mm_dtype=jnp.float32, grad_pass="mosaic_fused")
        self.assertEqual(cfg["grad_pass"], "triton")
        self.assertEqual(channelwise_gpu.TUNING["grad_pass"], "mosaic_fused")  # MOSAIC_GPU Sec. 46

    def test_op_passes_the_tuned_slab(self):
        # TUNING["mosaic_grad_slab"] (32: faster on an H100, MOSAIC_GPU.md Sec. 46) reaches K2
        # as K1.
        seen = {}

        def record(*args, **kwargs):
            seen.update(kwargs)
            return ()

        base = dict(batch=1, heads=1, n_chunks=1, dk=64, dv=64, scale=0.1, has_docs=False,
                    interpret=True, return_residual=False)
        with mock.patch.object(k2, "channelwise_grad_chunk_mosaic", record):
            for slab in (16, 32):
                with mock.patch.dict(channelwise_gpu.TUNING, {"mosaic_grad_slab": slab}):
                    cfg = channelwise_gpu._config(**base, mm_dtype=jnp.bfloat16,
                                                  grad_pass="mosaic_fused")
                channelwise_gpu._grad_chunk_mosaic(cfg, *([None] * 11))
                self.assertEqual(seen["slab"], slab)
        self.assertEqual(channelwise_gpu.TUNING["mosaic_grad_slab"], 32)


@pytest.mark.gpu
class GpuTest(kmg_test.HopperTestCase):
    """The compiled kernel (wgmma, TMA) on a Hopper GPU."""

    @parameterized.named_parameters(
        ("kda_bf16_packed_T2048_K128_V128", 0, 1, 2048, 2, 128, 128, jnp.bfloat16,
         (700, 1, 64, 999), 1.0, True, False),
        ("gdn2_bf16_strong_decay_partial_T1000_K64_V128", 1, 2, 1000, 2, 64, 128, jnp.bfloat16,
         None, 10.0, False, True),
        ("kda_fp16_packed_T1500_K128_V64", 2, 1, 1500, 2, 128, 64, jnp.float16,
         (10, 54, 500), 0.5, True, False),
    )
    def test_kernel_matches_reference_and_triton(self, *case):
        _check_kernel(self, case, interpret=False)

    @parameterized.parameters((0, False), (1, True))
    def test_slab16_matches_slab32(self, seed, ks_channels):
        cfg, args, doc_arrays, (ks, hs, dhs) = k1_test.grad_inputs(
            seed, 2, 2048, 2, 128, 128, jnp.bfloat16, docs=(700, 1, 64), gdn2=ks_channels,
            interpret=False, full=True)
        q, k, _, gam, do, vn, dr = args
        wide, narrow = (k2.channelwise_grad_chunk_mosaic(
            q, k, ks, gam, hs, dhs, do, vn, dr, scale=cfg["scale"], doc=doc_arrays[0],
            slab=slab) for slab in (32, 16))
        for name, a, e in zip(_NAMES, narrow, wide):  # fp32 summation order at most
            self.assertLess(tolerances.rel_err(a, e), 1e-5, name)

    @parameterized.named_parameters(("kda", k1_test._CASES[0][1:], 32),
                                    ("gdn2_slab16", k1_test._CASES[1][1:], 16))
    def test_unfloored_g_takes_dg_through_the_floor(self, case, slab):
        _check_floor_g(self, case, slab, interpret=False)

    @parameterized.parameters((0, False, 32), (1, True, 16))
    def test_heads_first_dr_gives_the_same_bits_and_dvw(self, seed, ks_channels, slab):
        # MOSAIC_GPU.md Sec. 47.2: compiled, dR read as [B, H, T, V] and stored back as dvw
        # [B, T, H, V] by key half 0 (T not a chunk multiple, documents).
        cfg, args, doc_arrays, (ks, hs, dhs) = k1_test.grad_inputs(
            seed, 2, 1000, 2, 128, 128, jnp.bfloat16, docs=(700, 1, 64), gdn2=ks_channels,
            interpret=False, full=True)
        q, k, _, gam, do, vn, dr = (x[:, :1000] for x in args)
        kw = dict(scale=cfg["scale"], doc=doc_arrays[0][:, :1000], slab=slab)
        want = k2.channelwise_grad_chunk_mosaic(q, k, ks[:, :1000], gam, hs, dhs, do, vn, dr,
                                                **kw)
        got = k2.channelwise_grad_chunk_mosaic(q, k, ks[:, :1000], gam, hs, dhs, do, vn,
                                               jnp.transpose(dr, (0, 2, 1, 3)),
                                               dr_heads_first=True, **kw)
        self.assertLen(got, 5)
        for name, a, e in zip(_NAMES + ("dvw",), got, tuple(want) + (dr,)):
            self.assertEqual((a.shape, a.dtype), (e.shape, e.dtype), name)
            np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(e, np.float32),
                                          err_msg=name)

    @parameterized.parameters(("kda", True, 128), ("gdn2", False, 64))
    def test_op_with_fused_grad_pass_against_fp32_reference(self, op, packed, dim):
        # kernel_gpu_channelwise_test.GpuTest's case and gates (FLA's), K2 alone and with both
        # Mosaic state passes: o, final state and every gradient; and against the Triton path.
        seq_len = 1000
        segment_ids = cw_test._gpu_case_segment_ids(packed)
        inputs, cot_key = cw_test._inputs(0, 2, seq_len, 2, 4, dim, dtype=jnp.bfloat16)
        want = cw_test._outputs_and_grads(op, None, inputs, segment_ids, cot_key, False)
        run = k1_test._op_outputs_and_grads
        got = {(gp, sp): run(op, inputs, segment_ids, cot_key, gp, "pallas", state_pass=sp)
               for gp, sp in (("mosaic_fused", "triton"), ("triton", "triton"),
                              ("mosaic_fused", "mosaic"))}
        for key, (outs, grads) in got.items():
            for i, name in enumerate(("o", "final_state")):
                self.assertLess(tolerances.rel_err(outs[i], want[0][i]), 5e-3, f"{key} {name}")
            for name in cw_test._DIFF_ARGS[op]:
                limit = 2e-2 if name in ("g", "beta", "b", "w") else 8e-3
                self.assertLess(tolerances.rel_err(grads[name], want[1][name]), limit,
                                f"{key} d{name}")
        fused, triton = got[("mosaic_fused", "triton")], got[("triton", "triton")]
        for name in cw_test._DIFF_ARGS[op]:
            self.assertLess(tolerances.rel_err(fused[1][name], triton[1][name]), _PAIR_GATE,
                            f"d{name}: mosaic_fused vs triton grad pass")


if __name__ == "__main__":
    absltest.main()
