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

import contextlib
import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest, parameterized

from pallas_kernels.common import channelwise_gpu
from pallas_kernels.common import channelwise_grad_mosaic_gpu as k2
from tests import tolerances
from tests.pallas_kernels import kernel_mosaic_channelwise_grad_test as k1_test

C = k2.CHUNK
_REF_GATE = 5e-3  # relative RMS against float64, K2 and the Triton path alike
_PAIR_GATE = 4e-3  # K2 against the Triton path (the op tests' gate)
_SMEM_LIMIT = 227 * 1024
# Mosaic GPU's own count of the CUDA export (jax 0.10.2), MOSAIC_GPU.md Sec. 21.
_SMEM_K128_V128 = 206_896  # per-token ks (KDA), documents or not
_SMEM_K128_V128_KS_F32 = 222_256  # per-channel fp32 ks (GDN-2)
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


def _check_kernel(test, case, *, interpret=True):
    seed, batch, seq_len, heads, dk, dv, dtype, docs, decay, h0, gdn2 = case
    cfg, args, doc_arrays, (ks, hs, dhs) = k1_test.grad_inputs(
        seed, batch, seq_len, heads, dk, dv, jnp.dtype(dtype), docs=docs, decay=decay, h0=h0,
        gdn2=gdn2, interpret=interpret, full=True)
    doc = doc_arrays[0] if doc_arrays else None
    q, k, kr, gam, do, vn, dr = args
    log = io.StringIO()
    with contextlib.redirect_stdout(log):  # the interpreter prints the races it detects
        got = jax.block_until_ready(k2.channelwise_grad_chunk_mosaic(
            q, k, kr, ks, gam, hs, dhs, do, vn, dr, scale=cfg["scale"], doc=doc,
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


# seed, B, T, H, K, V, dtype, document lengths (row 0; the rest one more), decay, h0, GDN-2.
# Documents at a chunk boundary (64), just after one (65) and inside chunks; decay 10 reaches
# about -20 per token.
_CASES = (
    ("kda_bf16_strong_decay_T150_K128_V128", 0, 1, 150, 1, 128, 128, jnp.bfloat16,
     (64, 1, 40), 10.0, True, False),
    ("gdn2_bf16_T192_K64_V128", 1, 1, 192, 2, 64, 128, jnp.bfloat16, (30, 98, 1), 1.0, False,
     True),
    ("kda_fp16_strong_decay_partial_T65_K64_V64", 2, 2, 65, 1, 64, 64, jnp.float16, (63,),
     10.0, True, False),
    ("gdn2_fp16_T192_K128_V64", 3, 1, 192, 1, 128, 64, jnp.float16, (63, 2, 60), 1.0, True,
     True),
)


@pytest.mark.slow
class InterpretTest(parameterized.TestCase):
    """K2 in Mosaic GPU interpret mode and the Triton path in Pallas interpret mode."""

    @parameterized.named_parameters(*_CASES)
    def test_kernel_and_triton_match_float64(self, *case):
        _check_kernel(self, case)


if __name__ == "__main__":
    absltest.main()
