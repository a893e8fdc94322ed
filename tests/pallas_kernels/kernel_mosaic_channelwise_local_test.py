"""The per-channel family's chunk-local forward as one Mosaic GPU kernel (MOSAIC_GPU.md Sec. 62).

``pallas_kernels/common/channelwise_local_mosaic_gpu.py`` has :func:`channelwise_local_mosaic`,
a drop-in for ``channelwise_gpu``'s ``_gamma`` + ``_prepare`` (the ``gamma``, ``intra``,
``prepare`` and ``wu`` Triton kernels) for KDA, switched by ``TUNING["chunk_local"] =
"mosaic"`` (off by default).

* ``KernelInterpretTest``: the kernel in Mosaic GPU interpret mode against the Triton kernels
  in Pallas interpret mode on the same random inputs (unit-norm q, k; per-channel log-decays;
  beta), every output: ``gam`` (fp32, to fp32 rounding), ``qg``, ``kg``, ``e`` (the same
  elementwise formulas), ``mq``, ``a``, ``w``, ``u`` (the decayed products' operands are
  rounded to the operand dtype here and TF32 / fp32 there: relative RMS gates by dtype), and
  ``a`` / ``w`` / ``u`` also against a float64 NumPy model of the equations. Cases: documents
  with a start inside a chunk, strong decay (``g`` down to about -20 per token and the floor
  -128), K = V = 64 and 128, bf16 and fp16, ``save_a`` off. One case runs in CI (about 5 s);
  the others are ``slow`` (``tests/ci_slow.py``).
* ``LoweringTest`` (CI): the kernel exports for CUDA on the CPU host (``jax.export``) at K = V
  = 128 bf16 with documents and ``A`` stored (the largest SMEM) and K = V = 64 fp16; the SMEM
  counts are pinned (:data:`SMEM_COUNTS`, MOSAIC_GPU.md Sec. 62); the whole KDA forward +
  backward exports with ``chunk_local="mosaic"`` (a mocked Hopper), the kernel in place of
  ``gamma``, ``intra``, ``prepare`` and ``wu``. (The K = V = 64 fp16 export is in
  ``tests/ci_slow.py``: CI keeps the other two; the CI tests take about 8 s.)
* ``ValidationTest`` (CI): refusals (GDN-2's per-channel scales, fp32 operands, head dims)
  and the op's fallback to Triton for per-channel scales under ``chunk_local="mosaic"``.
* ``OpInterpretTest`` (``slow``): the whole KDA op (forward and every gradient; a partial last
  chunk, documents) with ``chunk_local`` on against off, both interpreted.
* ``GpuTest`` (``gpu``, never run yet): on a Hopper GPU, the compiled kernel against the
  compiled Triton kernels and float64 (K = V = 128 and 64, B 2, T 1024, H 4, documents), and
  the KDA op with ``chunk_local`` on and off against the fp32 reference and each other.

Run the slow ones with ``PJRT_NPROC=8 python -m pytest -q -m slow`` on this file.
"""

from unittest import mock

import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest, parameterized

from pallas_kernels.common import channelwise_gpu, pallas_gpu
from pallas_kernels.common import channelwise_local_mosaic_gpu as clm
from tests import tolerances
from tests.pallas_kernels import kernel_gpu_channelwise_test as cw_test
from tests.pallas_kernels import kernel_mosaic_channelwise_test as cwm_test
from tests.pallas_kernels import kernel_mosaic_gpu_test as kmg_test

C = clm.CHUNK
_BF16, _FP16 = jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)
# Relative RMS of the kernel's outputs against the Triton path's on the same inputs. gam, qg,
# kg, e: the same formulas (gam's sums in another order; qg, kg then round identically or by
# one ulp where an fp32 exponent differs in its last bit). mq, a, w, u: the decayed operands
# of Mk and Mq are rounded to the operand dtype here (TF32 / fp32 elementwise there), then A's
# merges run on fp16 splits (TF32 there): measured 2.5e-3 (mq) and under 1e-3 (a, w, u) for
# bf16 at the cases below; the gates leave about 2x.
_GATES = {
    _BF16: {"gam": 1e-6, "qg_ref": 1e-4, "kg_ref": 2e-4, "e_ref": 1e-5, "mq_ref": 5e-3,
            "a_ref": 2e-3, "w_ref": 2e-3, "u_ref": 2e-3},
    _FP16: {"gam": 1e-6, "qg_ref": 2e-5, "kg_ref": 2e-5, "e_ref": 1e-5, "mq_ref": 2e-3,
            "a_ref": 1e-3, "w_ref": 1e-3, "u_ref": 1e-3},
}
# Against float64 (a, w, u from the rounded inputs): the operand-dtype rounding of the outputs.
_REF_GATE = {_BF16: 6e-3, _FP16: 1.5e-3}
_SMEM_LIMIT = 227 * 1024
# Mosaic GPU's SMEM count of the CUDA export (jax 0.10.2; 0.11.2 gives the same), quoted in
# MOSAIC_GPU.md Sec. 62 and the module docstring: K = V = 128 bf16 with documents and A
# stored; K = V = 64 fp16 without documents.
SMEM_COUNTS = {(128, 128, True): 223_240, (64, 64, False): 146_440}


def _case(seed, batch, seq_len, heads, dk, dv, dtype, *, decay=1.0, docs=None):
    """Random padded inputs of ``_prepare`` (``[B, Tp, H, .]``) and the ``docs`` tuple."""
    rng = np.random.default_rng(seed)

    def l2(x):
        return x / np.linalg.norm(x, axis=-1, keepdims=True)

    q = jnp.asarray(l2(rng.standard_normal((batch, seq_len, heads, dk))), dtype)
    k = jnp.asarray(l2(rng.standard_normal((batch, seq_len, heads, dk))), dtype)
    v = jnp.asarray(rng.standard_normal((batch, seq_len, heads, dv)), dtype)
    g = decay * -np.logaddexp(0.0, -(rng.standard_normal((batch, seq_len, heads, dk)) + 1.5))
    if decay > 1.0:  # a few channels at and below the floor
        g[..., :2] = -200.0
    beta = 1.0 / (1.0 + np.exp(-rng.standard_normal((batch, seq_len, heads, 1))))
    doc = ()
    if docs is not None:  # document lengths, row 0 (others: one document)
        seg = np.zeros((batch, seq_len), np.int32)
        seg[0] = np.repeat(np.arange(len(docs)), docs)
        doc = pallas_gpu.docs_from_segment_ids(jnp.asarray(seg), seq_len)
    return (q, k, v, jnp.asarray(beta, jnp.float32), jnp.asarray(g, jnp.float32)), doc


def _triton(inputs, doc, save_a=True):
    """``_gamma`` + ``_prepare`` (Pallas interpret mode): ``(outs, gam)``."""
    q, k, v, beta, g = inputs
    bsz, tp, heads, dk = k.shape
    cfg = channelwise_gpu._config(
        batch=bsz, heads=heads, n_chunks=tp // C, dk=dk, dv=v.shape[-1], scale=1.0,
        has_docs=bool(doc), mm_dtype=q.dtype, interpret=True, return_residual=True)
    gam = channelwise_gpu._gamma(cfg, g)
    return channelwise_gpu._prepare(cfg, q, k, v, beta, beta, gam, doc, save_a=save_a), gam


def _mosaic(inputs, doc, save_a=True):
    q, k, v, beta, g = inputs
    return clm.channelwise_local_mosaic(q, k, v, beta, beta, g, doc, save_a=save_a,
                                        interpret=True)


def _float64_wu(inputs, doc, gam):
    """float64 ``A``, ``W``, ``U`` ([B, H, N, C, C], [B, Tp, H, K / V]) from the rounded
    inputs and ``gam`` (the kernel's, checked separately), unrounded."""
    q, k, v, beta, g = (np.asarray(x, np.float64) for x in inputs)
    gam = np.asarray(gam, np.float64)
    bsz, tp, heads, dk = k.shape
    nc = tp // C
    kr = k * beta  # the kernels round kr to the operand dtype
    kr = np.asarray(jnp.asarray(kr, inputs[0].dtype), np.float64)
    vw = np.asarray(jnp.asarray(v * beta, inputs[0].dtype), np.float64)
    if doc:
        docid, conn = np.asarray(doc[0]), np.asarray(doc[1], np.float64)
    else:
        docid, conn = np.zeros((bsz, tp), np.int64), np.ones((bsz, tp))
    a = np.zeros((bsz, heads, nc, C, C))
    w = np.zeros(k.shape)
    u = np.zeros(v.shape)
    for b in range(bsz):
        for h in range(heads):
            for n in range(nc):
                sl = slice(n * C, (n + 1) * C)
                gm = gam[b, sl, h]
                dec = np.exp(gm[:, None, :] - gm[None, :, :])  # [i, j, K]
                mk = np.einsum("ic,jc,ijc->ij", kr[b, sl, h], k[b, sl, h],
                               np.where(np.tril(np.ones((C, C)), -1)[..., None] > 0, dec, 0))
                d = docid[b, sl]
                mk = np.where(np.tril(np.ones((C, C)), -1) * (d[:, None] == d[None, :]) > 0,
                              mk, 0.0)
                am = np.linalg.inv(np.eye(C) + mk)
                a[b, h, n] = am
                krg = kr[b, sl, h] * np.exp(gm) * conn[b, sl, None]
                w[b, sl, h] = am @ krg
                u[b, sl, h] = am @ vw[b, sl, h]
    return a, w, u


def _check(test, inputs, doc, save_a=True, float64=False):
    dtype = jnp.dtype(inputs[0].dtype)
    got, gam = _mosaic(inputs, doc, save_a)
    want, want_gam = _triton(inputs, doc, save_a)
    test.assertEqual(set(got), set(want))
    test.assertLess(tolerances.rel_err(gam, want_gam), _GATES[dtype]["gam"], "gam")
    test.assertEqual(gam.dtype, want_gam.dtype)
    for name in sorted(want):
        test.assertEqual((got[name].shape, got[name].dtype),
                         (want[name].shape, want[name].dtype), name)
        err = tolerances.rel_err(got[name], want[name])
        test.assertLess(err, _GATES[dtype][name], name)
    # zeros above the diagonal, as prepare stores them
    upper = np.triu(np.ones((C, C), bool), 1)
    for name in ("mq_ref", "a_ref") if save_a else ("mq_ref",):
        test.assertEqual(float(np.abs(np.asarray(got[name], np.float32)[..., upper]).max()), 0.0)
    if float64:
        a, w, u = _float64_wu(inputs, doc, gam)
        for name, ref in (("a_ref", a), ("w_ref", w), ("u_ref", u)):
            test.assertLess(tolerances.rel_err(got[name], ref), _REF_GATE[dtype], name)


class KernelInterpretTest(parameterized.TestCase):
    """The kernel against the Triton kernels (and float64), Mosaic GPU interpret mode."""

    def test_k64_bf16_documents(self):  # the CI case (about 5 s)
        inputs, doc = _case(0, 1, 128, 1, 64, 64, jnp.bfloat16, docs=(40, 88))
        _check(self, inputs, doc, float64=True)

    @parameterized.named_parameters(
        ("K128_bf16_documents", 1, 128, 128, _BF16, 1.0, (100, 5, 23), True),
        ("K128_V64_bf16", 1, 128, 64, _BF16, 1.0, None, True),
        ("K64_fp16_strong_decay", 2, 64, 64, _FP16, 20.0, (10, 54, 64), True),
        ("K128_bf16_strong_decay", 1, 128, 128, _BF16, 20.0, None, True),
        ("K64_bf16_no_a", 1, 64, 64, _BF16, 1.0, (30, 98), False),
    )
    def test_matches_triton(self, batch, dk, dv, dtype, decay, docs, save_a):
        inputs, doc = _case(1, batch, 128, 2, dk, dv, dtype, decay=decay, docs=docs)
        _check(self, inputs, doc, save_a=save_a, float64=save_a)


class LoweringTest(parameterized.TestCase):
    """The layout branch the interpreter replaces, lowered for CUDA on the CPU host."""

    @parameterized.named_parameters(
        ("K128_V128_bf16_docs", 128, 128, _BF16, True),
        ("K64_V64_fp16", 64, 64, _FP16, False),
    )
    def test_kernel_exports_for_cuda(self, dk, dv, dtype, has_docs):
        bsz, tp, heads = 1, 128, 2

        def z(d, t=dtype):
            return jnp.zeros((bsz, tp, heads, d), t)

        doc = (pallas_gpu.docs_from_segment_ids(jnp.zeros((bsz, tp), jnp.int32), tp)
               if has_docs else ())
        text, smem = cwm_test.export_cuda_counting_smem(
            lambda *a: clm.channelwise_local_mosaic(*a, save_a=has_docs), z(dk), z(dk), z(dv),
            z(1, jnp.float32), z(1, jnp.float32), z(dk, jnp.float32), doc)
        self.assertEqual(text.count("custom_call @mosaic_gpu"), 1)
        self.assertIn(clm.KERNEL_NAME, text)
        self.assertLessEqual(smem, _SMEM_LIMIT)
        self.assertEqual(smem, SMEM_COUNTS[dk, dv, has_docs])

    def test_kda_fwd_bwd_exports_with_chunk_local_mosaic(self):
        # The whole op lowered for CUDA with the switch on (on a mocked Hopper): the new kernel
        # replaces gamma, intra, prepare and wu; the state passes and K2 as by default.
        text = cwm_test.kda_fwd_bwd_cuda_text({"chunk_local": "mosaic"})
        self.assertIn(clm.KERNEL_NAME, text)
        for name in ("gamma", "intra", "prepare", "wu"):
            self.assertNotIn(f'name = "channelwise_{name}"', text)


class ValidationTest(parameterized.TestCase):

    def test_refusals(self):
        (q, k, v, beta, g), _ = _case(0, 1, 64, 1, 64, 64, jnp.bfloat16)
        wide = jnp.ones(k.shape, jnp.float32)
        for args, match in (((q, k, v, wide, wide), "per-channel"),
                            ((q.astype(jnp.float32), k, v, beta, beta), "16-bit"),
                            ((q[..., :32], k[..., :32], v, beta, beta), "64 or 128")):
            self.assertIsNotNone(clm.unsupported_reason(*args))
            with self.assertRaisesRegex(ValueError, match):
                clm.channelwise_local_mosaic(*args, g=g[..., :args[1].shape[-1]],
                                             interpret=True)

    def test_bad_tuning_value(self):
        with mock.patch.dict(channelwise_gpu.TUNING, {"chunk_local": "cuda"}):
            with self.assertRaisesRegex(ValueError, "chunk_local"):
                channelwise_gpu._config(
                    batch=1, heads=1, n_chunks=1, dk=64, dv=64, scale=1.0, has_docs=False,
                    mm_dtype=jnp.bfloat16, interpret=True, return_residual=True)

    def test_per_channel_scales_keep_triton(self):
        cfg = dict(chunk_local="mosaic")
        (q, k, v, beta, _), _ = _case(0, 1, 64, 1, 64, 64, jnp.bfloat16)
        wide = jnp.ones(k.shape, jnp.float32)
        self.assertTrue(channelwise_gpu._local_mosaic(cfg, q, k, v, beta, beta))
        self.assertFalse(channelwise_gpu._local_mosaic(cfg, q, k, v, wide, wide))
        self.assertFalse(channelwise_gpu._local_mosaic(dict(chunk_local="triton"), q, k, v,
                                                       beta, beta))


@pytest.mark.slow
class OpInterpretTest(parameterized.TestCase):
    """The whole KDA op (``pallas_interpret``) with ``chunk_local`` on against off."""

    @parameterized.parameters((64, 150), (128, 100))
    def test_kda_chunk_local_mosaic_matches_triton(self, dim, seq_len):
        inputs, cot_key = cw_test._inputs(5, 1, seq_len, 2, 2, dim, dtype=jnp.bfloat16)
        seg = jnp.asarray(np.repeat(np.arange(3), [30, seq_len - 50, 20])[None], jnp.int32)

        def run(local):
            with cw_test._tuning({"chunk_local": local, "state_pass": "mosaic",
                                  "grad_pass": "triton"}):
                return cw_test._outputs_and_grads("kda", "pallas_interpret", inputs, seg,
                                                  cot_key, False)

        want, got = run("triton"), run("mosaic")
        for name, a, e in zip(("o", "final_state"), got[0], want[0]):
            self.assertLess(tolerances.rel_err(a, e), 4e-3, name)
        for name in cw_test._DIFF_ARGS["kda"]:
            self.assertLess(tolerances.rel_err(got[1][name], want[1][name]), 6e-3, f"d{name}")


@pytest.mark.gpu
class GpuTest(kmg_test.HopperTestCase):
    """The compiled kernel (wgmma, TMA, the ``inline_mgpu`` substitution) on a Hopper GPU.
    Never run yet (MOSAIC_GPU.md Sec. 62: queue item ``kda_local``)."""

    @parameterized.parameters((128, 128), (64, 64))
    def test_kernel_matches_compiled_triton(self, dk, dv):
        # B 2, T 1024, H 4, documents of kernel_gpu_channelwise_test's GPU cases (padded):
        # every output against the compiled Triton kernels, and A, W, U against float64.
        inputs, _ = _case(3, 2, 1024, 4, dk, dv, jnp.bfloat16)
        seg = np.pad(np.asarray(cw_test._gpu_case_segment_ids(True)), ((0, 0), (0, 24)),
                     mode="edge")
        doc = pallas_gpu.docs_from_segment_ids(jnp.asarray(seg), 1024)
        q, k, v, beta, g = inputs
        got, gam = clm.channelwise_local_mosaic(q, k, v, beta, beta, g, doc, save_a=True)
        bsz, tp, heads, _ = k.shape
        cfg = channelwise_gpu._config(
            batch=bsz, heads=heads, n_chunks=tp // C, dk=dk, dv=dv, scale=1.0, has_docs=True,
            mm_dtype=q.dtype, interpret=False, return_residual=True)
        want_gam = channelwise_gpu._gamma(cfg, g)
        want = channelwise_gpu._prepare(cfg, q, k, v, beta, beta, want_gam, doc, save_a=True)
        self.assertLess(tolerances.rel_err(gam, want_gam), _GATES[_BF16]["gam"], "gam")
        for name in sorted(want):
            self.assertLess(tolerances.rel_err(got[name], want[name]), _GATES[_BF16][name], name)
        a, w, u = _float64_wu(inputs, doc, gam)
        for name, ref in (("a_ref", a), ("w_ref", w), ("u_ref", u)):
            self.assertLess(tolerances.rel_err(got[name], ref), _REF_GATE[_BF16], name)

    @parameterized.parameters((True, 128), (False, 64))
    def test_kda_with_chunk_local_on_and_off_against_fp32_reference(self, packed, dim):
        # kernel_mosaic_channelwise_test.GpuTest's case and gates: o, final state and every
        # gradient against the fp32 reference with chunk_local on and off, then on against off.
        segment_ids = cw_test._gpu_case_segment_ids(packed)
        inputs, cot_key = cw_test._inputs(0, 2, 1000, 2, 4, dim, dtype=jnp.bfloat16)
        want = cw_test._outputs_and_grads("kda", None, inputs, segment_ids, cot_key, False)
        got = {}
        for local in ("mosaic", "triton"):
            with cw_test._tuning({"chunk_local": local}):
                got[local] = cw_test._outputs_and_grads("kda", "pallas", inputs, segment_ids,
                                                        cot_key, False)
        for local, (outs, grads) in got.items():
            for i, name in enumerate(("o", "final_state")):
                self.assertLess(tolerances.rel_err(outs[i], want[0][i]), 5e-3, f"{local} {name}")
            for name in cw_test._DIFF_ARGS["kda"]:
                limit = 2e-2 if name in ("g", "beta") else 8e-3
                self.assertLess(tolerances.rel_err(grads[name], want[1][name]), limit,
                                f"{local} d{name}")
        for i, name in enumerate(("o", "final_state")):
            self.assertLess(tolerances.rel_err(got["mosaic"][0][i], got["triton"][0][i]), 4e-3,
                            f"{name}: on vs off")
        for name in cw_test._DIFF_ARGS["kda"]:
            self.assertLess(tolerances.rel_err(got["mosaic"][1][name], got["triton"][1][name]),
                            6e-3, f"d{name}: on vs off")


if __name__ == "__main__":
    absltest.main()
