"""The fused chunk-local GDN backward Mosaic GPU kernel ``chunk_bwd_fused_mosaic``, on CPU and GPU.

``pallas_kernels/gated_delta_rule/kernel_mosaic_gpu_bwd_fused.py`` (MOSAIC_GPU.md Sec. 31.3)
gives ``(dq, dk, dv, dbeta, dg)`` from ``q, k, v, do, v_new, dv_new, T0, h, dh`` in one kernel.
Two references, both on the kernel's own (bf16) inputs:

* the assembled fp32 references of the stages it replaces: ``jax.vjp`` of the chunk form of
  ``kernel_mosaic_gdn_bwd_test.py`` (stage 3's: ``dq``, the state/score part of ``dk``, ``dw``,
  the explicit ``dg``, and the ``h``, ``v_new``, ``dh``, ``dv_new`` the kernel reads) plus
  ``jax.vjp`` of ``chunked.wy_representation`` at the cotangents ``(dw, dv_new)`` (stage 4's:
  the WY part of ``dk``, ``dg`` and all of ``dv``, ``dbeta``), so the reference never uses the
  value-space equations;
* the value-space oracle :func:`pallas_kernels.gated_delta_rule.bwd_value_space.
  chunk_bwd_value_space` (the kernel's own equations in fp32, exact against ``jax.vjp`` in
  fp64; ``tests/pallas_kernels/bwd_value_space_test.py``) with the same bf16 ``T0``.

Gates (relative RMS): 5e-3 for ``dq, dk, dv``, 1e-2 for ``dbeta, dg`` (Sec. 31.4 step 1);
correlated keys 1e-2 for every gradient against the assembled reference (the bf16 ``T0``
carries the inverse's rounding there; Sec. 31.3's risk). ``MutationTest`` runs the test-only
wrong variants (``mutations``) and requires each to fail a gate. ``LoweringTest`` exports the
kernel for CUDA with ``jax.export`` and checks Mosaic GPU's SMEM count (two variants in CI,
``LoweringSlowTest`` the other fourteen); ``GpuTest`` (``gpu``) runs the compiled kernel.

Interpreted cases take 2 to 6 s each on the 2-core host (one warpgroup, no barriers between
warpgroups, so none of the interpreter hangs of the multi-warpgroup kernels); the CI run keeps
two of them (``InterpretTest``), the rest are ``slow``::

    timeout 900 python -m pytest -q -m slow tests/pallas_kernels/kernel_mosaic_gdn_bwd_fused_test.py
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest, parameterized

from pallas_kernels.gated_delta_rule import bwd_value_space
from pallas_kernels.gated_delta_rule import chunked
from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu as kgd
from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu_bwd as kbwd
from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu_bwd_fused as kfb
from tests import tolerances
from tests.pallas_kernels import kernel_mosaic_channelwise_test as kmc_test
from tests.pallas_kernels import kernel_mosaic_gdn_bwd_test as bwd_test
from tests.pallas_kernels import kernel_mosaic_gdn_test as gdn_test
from tests.pallas_kernels import kernel_mosaic_gpu_test as kmg_test

C = kfb.CHUNK
_NAMES = ("dq", "dk", "dv", "dbeta", "dg")
_GATES = {"dq": 5e-3, "dk": 5e-3, "dv": 5e-3, "dbeta": 1e-2, "dg": 1e-2}
_CORRELATED_GATE = 1e-2


def _case(batch, seq_len, heads, kv_heads, dk, dv, decay, docs, correlated=0.0, seed=0):
    """``(args, kwargs, assembled, oracle)``: the kernel's positional inputs
    ``(q, k, v, do, v_new, dv_new, t0, g, beta, h, dh)`` (bf16 where the GPU pipeline stores
    16 bits), its keyword inputs, the assembled fp32 reference of stages 3 + 4 and the
    value-space oracle on the same inputs, each ``(dq, dk, dv, dbeta, dg)``."""
    q, k, v, g, beta, state, seg = gdn_test._inputs(batch, seq_len, heads, kv_heads, dk, dv,
                                                    decay=decay, h0=True, docs=docs, seed=seed)
    if correlated:  # as kernel_mosaic_gdn_wy_test._inputs: entries of A0 near 0.9
        # (numpy's generator: a jax.random call on a new shape compiles a program)
        rng = np.random.default_rng(seed + 50)
        base = rng.standard_normal((batch, 1, kv_heads, dk))
        kf = rng.standard_normal(k.shape) + correlated * base
        k = jnp.asarray(kf / np.linalg.norm(kf, axis=-1, keepdims=True), jnp.bfloat16)
        beta = jnp.asarray(rng.uniform(0.8, 1.0, beta.shape), jnp.float32)
    do, dht = bwd_test._cotangents(seed + 11, v.shape, (batch, heads, dk, dv), True)
    args, assembled, oracle = _references(q, k, v, g, beta, state, seg, do, dht,
                                          kv_heads=kv_heads)
    return args, dict(scale=dk ** -0.5, segment_ids=seg), assembled, oracle


@functools.partial(jax.jit, static_argnames=("kv_heads",))
def _references(q, k, v, g, beta, state, seg, do, dht, kv_heads):
    """:func:`_case`'s kernel inputs and its two references, as one compiled program (op by op
    they compiled ~180 small programs a case)."""
    batch, seq_len, _, dk = k.shape
    heads, dv = v.shape[2], v.shape[3]
    w, u = gdn_test._wy(k, v, g, beta, seg)
    scale = dk ** -0.5
    n_chunks = -(-seq_len // C)
    qf, kf = gdn_test._expand(q, heads), gdn_test._expand(k, heads)
    e0 = jnp.zeros((batch, heads, n_chunks, dk, dv))
    f0 = jnp.zeros((batch, seq_len, heads, dv))
    gf = jnp.zeros((batch, seq_len, heads)) if g is None else g

    def stage3(qf, kf, wf, gf, e, f):  # gf unused for DeltaNet (g None): its gradient is 0
        return bwd_test._chunk_form(qf, kf, wf, u.astype(jnp.float32), None if g is None else gf,
                                    seg, state, e, f, scale)

    _, vjp, (h, v_new) = jax.vjp(stage3, qf, kf, w.astype(jnp.float32), gf, e0, f0,
                                 has_aux=True)
    dq3, dk3, dw, dg3, dh, dvn = vjp((do.astype(jnp.float32), dht))

    def wy(kf, vf, gf, bf):
        return chunked.wy_representation(kf, vf, None if g is None else gf, bf,
                                         segment_ids=seg)

    bf16 = jnp.bfloat16
    dvn16 = dvn.astype(bf16)
    (w_p, _), vjp_wy = jax.vjp(wy, kf, v.astype(jnp.float32), gf, beta)
    pad = ((0, 0), (0, w_p.shape[1] - seq_len), (0, 0), (0, 0))
    dk4, dv4, dg4, dbeta4 = vjp_wy((jnp.pad(dw, pad), jnp.pad(dvn16.astype(jnp.float32), pad)))
    assembled = (kbwd._group_sum(dq3, kv_heads), kbwd._group_sum(dk3 + dk4, kv_heads), dv4,
                 dbeta4, None if g is None else dg3 + dg4)
    t0 = kgd.kkt_inverse_xla(k, beta, segment_ids=seg).astype(bf16)
    args = (q, k, v, do, v_new.astype(bf16), dvn16, t0, g, beta, h.astype(bf16),
            dh.astype(bf16))
    kwargs = dict(scale=scale, segment_ids=seg)
    f32 = [x if x is None else x.astype(jnp.float32) for x in args]
    q_, k_, v_, do_, vn_, dvn_, t0_, g_, beta_, h_, dh_ = f32
    oracle = bwd_value_space.chunk_bwd_value_space(q_, k_, v_, g_, beta_, do_, vn_, dvn_, t0_,
                                                   h_, dh_, **kwargs)
    return args, assembled, oracle


def _inputs_only(batch, seq_len, heads, kv_heads, dk, dv, decay):
    """:func:`_case`'s ``(args, kwargs)`` for one document without its references (~7 s of
    CPU): ``q, k, v, g, beta`` as there, the rest zeros of the shapes and dtypes it gives them.
    For checks that read only shapes and dtypes."""
    q, k, v, g, beta, _, seg = gdn_test._inputs(batch, seq_len, heads, kv_heads, dk, dv,
                                                decay=decay, h0=True, docs=None)
    bf16 = jnp.bfloat16
    n_chunks = -(-seq_len // C)
    like_v = jnp.zeros(v.shape, bf16)
    t0 = jnp.zeros((batch, seq_len, heads, C), bf16)
    h = jnp.zeros((batch, heads, n_chunks, dk, dv), bf16)
    args = (q, k, v, like_v, like_v, like_v, t0, g, beta, h, h)
    return args, dict(scale=dk ** -0.5, segment_ids=seg)


def _errors(got, want):
    """``{name: relative RMS error}`` of ``got`` against ``want`` (``None`` entries skipped)."""
    out = {}
    for name, x, y in zip(_NAMES, got, want):
        if y is not None:
            out[name] = float(tolerances.rel_err(x.astype(jnp.float32), y))
    return out


def _check(test, args, got, assembled, oracle, correlated=False):
    q, k, v, _, _, _, _, g = args[:8]
    for name, x, inp in zip(_NAMES, got, (q, k, v, None, None)):
        if name == "dg" and g is None:
            test.assertIsNone(x)
            continue
        want_dtype = jnp.float32 if inp is None else inp.dtype
        want_shape = args[8].shape if inp is None else inp.shape
        test.assertEqual((x.shape, x.dtype), (want_shape, want_dtype), msg=name)
    for ref_name, want in (("assembled", assembled), ("oracle", oracle)):
        for name, err in _errors(got, want).items():
            gate = _CORRELATED_GATE if correlated and ref_name == "assembled" else _GATES[name]
            test.assertLess(err, gate, msg=f"{name} vs {ref_name}: relative RMS error {err:.2e}")


# B, T, H, Hk, K, V, decay (None: DeltaNet), document lengths (the rest one more), correlated
_CASES = (
    ("plain_T128_K64_V64", 1, 128, 1, 1, 64, 64, 0.1, None, 0.0),
    # starts at 64 (a chunk boundary), 100 (inside chunk 1) and 130 (inside the partial chunk 2)
    ("gva_packed_partial_T150_K64_V128", 1, 150, 2, 1, 64, 128, 0.02, (64, 36, 30), 0.0),
    ("strong_decay_partial_T65_K128_V64", 2, 65, 1, 1, 128, 64, 5.0, None, 0.0),
    # starts at 10 and 70: chunk 0's incoming state reaches its first 10 tokens only
    ("packed_T128_K64_V64", 1, 128, 1, 1, 64, 64, 0.2, (10, 60), 0.0),
    ("deltanet_packed_T100_K64_V64", 1, 100, 1, 1, 64, 64, None, (10, 60), 0.0),
    ("gva4_2_packed_T192_K128_V128", 1, 192, 4, 2, 128, 128, 0.1, (70, 30), 0.0),
    ("correlated_T128_K128_V128", 1, 128, 2, 1, 128, 128, 0.01, None, 3.0),
    ("correlated_deltanet_packed_T150_K64_V64", 1, 150, 1, 1, 64, 64, None, (40,), 3.0),
)
_CI = ("plain_T128_K64_V64", "deltanet_packed_T100_K64_V64")


def _run(case, mutations=(), warpgroups=1, **options):
    args, kwargs, assembled, oracle = _case(*case)
    got = kfb.chunk_bwd_fused_mosaic(*args, **kwargs, interpret=True, mutations=mutations,
                                     warpgroups=warpgroups, **options)
    return args, got, assembled, oracle


def _races_found():
    """Whether the Mosaic GPU interpreter's race detection (``detect_races=True``,
    ``mosaic_gpu_lib.interpret_params``) saw a race in the last interpreted kernel."""
    from jax._src.pallas.mosaic_gpu.interpret import interpret_pallas_call
    return interpret_pallas_call.get_races().races_found


class InterpretTest(parameterized.TestCase):
    """Two interpreted cases in CI (about 5 s each with their references)."""

    @parameterized.named_parameters(*[c for c in _CASES if c[0] in _CI])
    def test_matches_references(self, *case):
        args, got, assembled, oracle = _run(case)
        _check(self, args, got, assembled, oracle)


# Slow (out of CI): the other six cases; InterpretTest keeps two in CI. The mark is on the class:
# absl's parameterized copies of a method do not keep a method-level mark.
@pytest.mark.slow
class InterpretSlowTest(parameterized.TestCase):

    @parameterized.named_parameters(*[c for c in _CASES if c[0] not in _CI])
    def test_matches_references(self, *case):
        args, got, assembled, oracle = _run(case)
        _check(self, args, got, assembled, oracle, correlated=bool(case[-1]))


# Slow (out of CI): warpgroups=3 (MOSAIC_GPU.md Sec. 31.7), interpreted with three warpgroup
# threads and nine barriers between them, 10 to 35 s a case on the 2-core host; run with
# PJRT_NPROC=8 (the interpreter can otherwise run out of XLA CPU threads and hang, as the other
# multi-warpgroup kernels' tests say):
#   PJRT_NPROC=8 timeout 900 python -m pytest -q -m slow <this file> -k Warpgroups
_WS_CASES = ("plain_T128_K64_V64", "gva_packed_partial_T150_K64_V128",
             "strong_decay_partial_T65_K128_V64", "deltanet_packed_T100_K64_V64",
             "correlated_T128_K128_V128")


@pytest.mark.slow
class ThreeWarpgroupsInterpretTest(parameterized.TestCase):
    """``warpgroups=3``: the same gates against both references, and no race seen by the
    interpreter's race detection."""

    @parameterized.named_parameters(*[c for c in _CASES if c[0] in _WS_CASES])
    def test_matches_references_without_races(self, *case):
        args, got, assembled, oracle = _run(case, warpgroups=3)
        self.assertFalse(_races_found())
        _check(self, args, got, assembled, oracle, correlated=bool(case[-1]))

    def test_gate_partials_of_every_warpgroup_count(self):
        """Two mutations whose terms live in different warpgroups (WG0's ``-dv.U'``, WG2's
        ``R^T K``) still fail with three warpgroups: the partials are summed, not dropped."""
        case = [c for c in _CASES if c[0] == "gva_packed_partial_T150_K64_V128"][0][1:]
        _, got, assembled, _ = _run(case, ("no_dv_u_term", "no_rt_k"), warpgroups=3)
        errs = _errors(got, assembled)
        self.assertGreater(errs["dg"], 10 * _GATES["dg"])
        self.assertGreater(errs["dk"], 10 * _GATES["dk"])


# Slow (out of CI), as ThreeWarpgroupsInterpretTest (PJRT_NPROC=8): gva_loop=True, one CTA per
# key head looping over its value heads (G = 2 with one key head; G = 2 with two key heads;
# G = 4 DeltaNet; G = 2 at K = V = 64, the GDN presets' dims, B 2, fp16), dq and dk summed
# in-kernel in fp32 SMEM and leaving [B, T, Hk, K] in the input dtype (MOSAIC_GPU.md Sec. 33).
_GVA_LOOP_CASES = (
    ("gva2_1_packed_partial_T150_K64_V128", 1, 150, 2, 1, 64, 128, 0.02, (64, 36, 30), 0.0),
    ("gva4_2_packed_partial_T130_K64_V64", 1, 130, 4, 2, 64, 64, 0.1, (70,), 0.0),
    ("gva4_1_deltanet_packed_T100_K64_V64", 1, 100, 4, 1, 64, 64, None, (10, 60), 0.0),
    ("gva2_2_B2_partial_T100_K64_V64", 2, 100, 4, 2, 64, 64, 0.05, None, 0.0),
)


def _ulps_apart(x, y):
    """Max distance in units of the last place of two 16-bit float arrays of one dtype."""
    ix, iy = (jnp.asarray(a).view(jnp.int16).astype(jnp.int32) for a in (x, y))
    # the sign-magnitude bit patterns to a monotone integer line
    ix, iy = (jnp.where(i < 0, -32768 - i, i) for i in (ix, iy))
    return int(jnp.max(jnp.abs(ix - iy)))


def _check_loop_equals_xla_sum(test, got, off, group, exact):
    """``got`` (the GVA loop) against ``off`` (``gva_loop=False``): ``dq``, ``dk`` within 0
    ulps at ``G = 2`` and 1 at larger ``G``; the other outputs bit for bit (``exact``, the
    interpreter) or within 1e-6 relative RMS (two compiled kernels)."""
    for name, x, y in zip(_NAMES, got, off):
        if y is None:
            test.assertIsNone(x, msg=name)
            continue
        test.assertEqual((x.shape, x.dtype), (y.shape, y.dtype), msg=name)
        if name in ("dq", "dk"):
            test.assertLessEqual(_ulps_apart(x, y), 0 if group == 2 and exact else 1, msg=name)
        elif exact:
            test.assertTrue(bool(jnp.array_equal(x, y)), msg=name)
        else:
            test.assertLess(float(tolerances.rel_err(x.astype(jnp.float32),
                                                     y.astype(jnp.float32))), 1e-6, msg=name)


@pytest.mark.slow
class GvaLoopInterpretTest(parameterized.TestCase):

    @parameterized.named_parameters(*_GVA_LOOP_CASES[:3])
    def test_in_kernel_group_sums(self, *case):
        args, got, assembled, oracle = _run(case, warpgroups=3, gva_loop=True)
        self.assertFalse(_races_found())
        _check(self, args, got, assembled, oracle)

    @parameterized.named_parameters(*_GVA_LOOP_CASES)
    def test_default_loop_equals_xla_group_sum(self, *case):
        """The default (``gva_loop=None``: the loop, at K = 64 on three warpgroups) against
        ``gva_loop=False`` (fp32 ``dq``, ``dk`` per value head, XLA's group sum, one rounding)
        on random inputs: ``dv``, ``dbeta``, ``dg`` are the same per-head code, bit for bit;
        ``dq``, ``dk`` the same fp32 sum in head order at ``G = 2`` (``0 + a + b``), so equal
        bit for bit after the one rounding, and at ``G = 4`` within one ulp (XLA's ``reduce``
        may add in another order). Both within the gates of both references."""
        args, kwargs, assembled, oracle = _case(*case)
        got = kfb.chunk_bwd_fused_mosaic(*args, **kwargs, interpret=True, warpgroups=3)
        self.assertFalse(_races_found())
        _check(self, args, got, assembled, oracle)
        self.assertEqual(got[0].shape[2], case[3])  # [B, T, Hk, K]
        off = kfb.chunk_bwd_fused_mosaic(*args, **kwargs, interpret=True, warpgroups=3,
                                         gva_loop=False)
        _check_loop_equals_xla_sum(self, got, off, case[2] // case[3], exact=True)


# Each mutation, the case where it shows, and the gradients that must then fail their gate.
_MUTATION_CASES = (
    ("no_strict_mask", ("dk", "dbeta")),
    ("no_rt_k", ("dk",)),
    ("no_col_term", ("dg",)),
    ("no_dv_u_term", ("dg",)),
    ("no_cumsum", ("dg",)),
    ("boundary_twice", ("dg",)),
)


@pytest.mark.slow
class MutationTest(parameterized.TestCase):
    """Every wrong variant of :data:`kfb.MUTATIONS` misses a gate by 10 times or more against
    both references (the GVA case with documents and a partial chunk; measured 2026-12-05: the
    smallest, ``no_strict_mask``'s ``dk``, 0.14; ``no_dv_u_term``'s ``dg`` 0.25, where the
    plain case without documents gave only 0.055): the tests see each term."""

    def test_every_mutation_is_listed(self):
        self.assertEqual(sorted(m for m, _ in _MUTATION_CASES), sorted(kfb.MUTATIONS))

    @parameterized.named_parameters(*[(m, m, names) for m, names in _MUTATION_CASES])
    def test_mutation_fails(self, mutation, names):
        case = [c for c in _CASES if c[0] == "gva_packed_partial_T150_K64_V128"][0][1:]
        _, got, assembled, oracle = _run(case, (mutation,))
        for want in (assembled, oracle):
            errs = _errors(got, want)
            for name in names:
                self.assertGreater(errs[name], 10 * _GATES[name], msg=f"{mutation}: {errs}")


def _check_exports(test, dk, dv, deltanet, gva, warpgroups=1, gva_loop=False,
                   return_smem_and_text=False):
    """Exports the kernel for CUDA (documents, a partial chunk); checks one Mosaic GPU custom
    call under the kernel's name and Mosaic GPU's SMEM count; returns the SMEM count (and the
    module text with ``return_smem_and_text``)."""
    batch, seq_len = 1, 200
    heads, kv_heads = (4, 2) if gva else (2, 2)
    n_chunks = -(-seq_len // C)
    spec = jax.ShapeDtypeStruct
    bf = jnp.bfloat16
    args = ([spec((batch, seq_len, kv_heads, dk), bf)] * 2
            + [spec((batch, seq_len, heads, dv), bf)] * 4
            + [spec((batch, seq_len, heads, C), bf), spec((batch, seq_len, heads), jnp.float32),
               spec((batch, seq_len, heads), jnp.float32)]
            + [spec((batch, heads, n_chunks, dk, dv), bf)] * 2
            + [spec((batch, seq_len), jnp.int32)])

    def fn(q, k, v, do, vn, dvn, t0, g, beta, h, dh, seg):
        return kfb.chunk_bwd_fused_mosaic(q, k, v, do, vn, dvn, t0, None if deltanet else g,
                                          beta, h, dh, scale=0.1, segment_ids=seg,
                                          warpgroups=warpgroups, gva_loop=gva_loop)

    text, smem = kmc_test.export_cuda_counting_smem(fn, *args)
    test.assertEqual(text.count("custom_call @mosaic_gpu"), 1)
    name = kfb.KERNEL_NAME + ("_ws" if warpgroups == 3 else "")
    test.assertIn(f"{name}\\00", text)
    test.assertLess(smem, kfb.SMEM_LIMIT)
    return (text, smem) if return_smem_and_text else smem


# Export variants: LoweringTest has three (K = V = 128 gated with GVA on one and on three
# warpgroups, K = V = 64 DeltaNet), LoweringSlowTest the other 29.
_EXPORT_CI, _EXPORT_SLOW = kmg_test.split_variants(
    [dict(dk=128, dv=128, deltanet=False, gva=True, warpgroups=1),
     dict(dk=128, dv=128, deltanet=False, gva=True, warpgroups=3),
     dict(dk=64, dv=64, deltanet=True, gva=False, warpgroups=1)],
    dk=(64, 128), dv=(64, 128), deltanet=(False, True), gva=(False, True), warpgroups=(1, 3))
# Mosaic GPU's SMEM count (bytes; each buffer aligned to 1 KB, plus Pallas' 2 KB reduction
# scratch), 2026-12-05, jax 0.10.2: K = V = 128 with or without GVA; three warpgroups: three
# more vectors and ten more barriers.
_SMEM_K128_V128 = {1: 226_312, 3: 227_416}
# With the GVA loop (three warpgroups, K = V = 64): two fp32 [64, 64] sums and two barriers.
_SMEM_GVA_LOOP_K64_V64 = 153_704


class LoweringTest(parameterized.TestCase):
    """The kernel exports for CUDA on any host: the whole Pallas-to-Mosaic-GPU lowering runs
    (layouts, swizzles, ``wgmma`` operand shapes, transposed views, the ``RefUnion``); ptxas
    runs on the GPU (or ``benchmarks/offline_ptxas.py``) only."""

    @parameterized.named_parameters(*_EXPORT_CI)
    def test_exports_for_cuda(self, **variant):
        smem = _check_exports(self, **variant)
        if variant["dk"] == variant["dv"] == 128:
            self.assertEqual(smem, _SMEM_K128_V128[variant["warpgroups"]])

    def test_rejects_bad_inputs(self):
        args, kwargs = _inputs_only(1, 64, 2, 1, 64, 64, 0.1)
        q, k, v, do, vn, dvn, t0, g, beta, h, dh = args
        for bad, msg in (((q, k, v, do, vn, dvn, t0[..., :32], g, beta, h, dh), "t0 must be"),
                         ((q, k, v, do, vn, dvn, t0, g, beta[..., :1], h, dh), "beta must be"),
                         ((q, k, v, do, vn, dvn, t0, g, beta, h, dh[..., :32]), "dh must be"),
                         ((q, k, v, do[..., :32], vn, dvn, t0, g, beta, h, dh), "do must"),
                         ((q[..., :32], k, v, do, vn, dvn, t0, g, beta, h, dh), "q and k")):
            with self.assertRaisesRegex(ValueError, msg):
                kfb.chunk_bwd_fused_mosaic(*bad, **kwargs)
        with self.assertRaisesRegex(ValueError, "mutations must be"):
            kfb.chunk_bwd_fused_mosaic(*args, **kwargs, mutations=("nope",))
        with self.assertRaisesRegex(ValueError, "warpgroups must be"):
            kfb.chunk_bwd_fused_mosaic(*args, **kwargs, warpgroups=2)
        with self.assertRaisesRegex(ValueError, "gva_loop needs warpgroups"):
            kfb.chunk_bwd_fused_mosaic(*args, **kwargs, gva_loop=True)
        args, kwargs = _inputs_only(1, 64, 2, 1, 128, 64, 0.1)
        with self.assertRaisesRegex(ValueError, "gva_loop needs K = 64"):
            kfb.chunk_bwd_fused_mosaic(*args, **kwargs, gva_loop=True, warpgroups=3)

    def test_gva_loop_is_the_default_at_k64(self):
        """With GVA at K = 64 on three warpgroups the kernel writes ``dq``, ``dk``
        ``[B, T, Hk, K]`` in bf16 itself (SMEM 153,704 B at K = V = 64: two fp32 sums more);
        no XLA group sum (``reduce``) is left in the export. With ``gva_loop=False``, at
        K = 128, or on one warpgroup the fp32 per-value-head outputs and the sum come back."""
        for dk, warpgroups, gva_loop, loop in ((64, 3, None, True), (64, 3, False, False),
                                               (64, 1, None, False), (128, 3, None, False)):
            text, smem = _check_exports(self, dk, 64, False, True, warpgroups, gva_loop,
                                        return_smem_and_text=True)
            msg = f"K={dk} warpgroups={warpgroups} gva_loop={gva_loop}"
            group_sum = re.search(r"stablehlo\.reduce(?!_window)", text) is not None
            self.assertEqual(group_sum, not loop, msg=msg)
            if loop:
                self.assertEqual(smem, _SMEM_GVA_LOOP_K64_V64, msg=msg)


@pytest.mark.slow
class LoweringSlowTest(parameterized.TestCase):

    @parameterized.named_parameters(*_EXPORT_SLOW)
    def test_exports_for_cuda(self, **variant):
        _check_exports(self, **variant)

    @parameterized.parameters((64, 64, False), (64, 128, True), (64, 128, False))
    def test_gva_loop_exports_for_cuda(self, dk, dv, deltanet):
        _check_exports(self, dk, dv, deltanet, gva=True, warpgroups=3, gva_loop=True)


@pytest.mark.gpu
class GpuTest(kmg_test.HopperTestCase):
    """The compiled kernel (wgmma, TMA, the RefUnion) against both references."""

    @parameterized.named_parameters(*[
        (f"{name}_wg{warpgroups}", warpgroups, *case)
        for name, *case in (
            ("gva4_2_packed_T2048_K128_V128", 1, 2048, 4, 2, 128, 128, 0.05,
             (700, 1, 64, 999), 0.0),
            ("strong_decay_partial_T1000_K64_V128", 2, 1000, 2, 1, 64, 128, 5.0, None, 0.0),
            ("deltanet_packed_T1024_K128_V64", 1, 1024, 2, 2, 128, 64, None, (300, 200), 0.0),
            ("correlated_T2048_K128_V128", 1, 2048, 4, 2, 128, 128, 0.01, (300,), 3.0))
        for warpgroups in (1, 3)])
    def test_matches_references(self, warpgroups, *case):
        args, kwargs, assembled, oracle = _case(*case, seed=5)
        got = kfb.chunk_bwd_fused_mosaic(*args, **kwargs, warpgroups=warpgroups)
        _check(self, args, got, assembled, oracle, correlated=bool(case[-1]))

    @parameterized.named_parameters(
        # the GDN presets' dims and group (K = V = 64, G = 2), and G = 4 DeltaNet at V = 128
        ("gva2_packed_T2048_K64_V64", 1, 2048, 16, 8, 64, 64, 0.05, (700, 1, 64, 999), 0.0),
        ("gva4_deltanet_partial_T1000_K64_V128", 2, 1000, 8, 2, 64, 128, None, None, 0.0),
    )
    def test_gva_loop_matches_references(self, *case):
        """The GVA loop (MOSAIC_GPU.md Sec. 33, the default at K = 64 on three warpgroups)
        compiled: both references' gates, and ``gva_loop=False`` (XLA's group sum) to an ulp."""
        args, kwargs, assembled, oracle = _case(*case, seed=5)
        got = kfb.chunk_bwd_fused_mosaic(*args, **kwargs, warpgroups=3)
        self.assertEqual(got[0].shape[2], case[3])  # [B, T, Hk, K]
        _check(self, args, got, assembled, oracle)
        off = kfb.chunk_bwd_fused_mosaic(*args, **kwargs, warpgroups=3, gva_loop=False)
        _check_loop_equals_xla_sum(self, got, off, case[2] // case[3], exact=False)


if __name__ == "__main__":
    absltest.main()
