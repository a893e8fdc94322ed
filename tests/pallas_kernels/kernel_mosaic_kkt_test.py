"""Several chunks per CTA and the blocked inverse of the ``T0`` kernel
:func:`chunk_kkt_inverse_mosaic`.

``pallas_kernels/gated_delta_rule/kernel_mosaic_gpu.py``'s gate-free inverse
``T0 = (I + A0)^{-1}`` walks ``chunks_per_cta`` consecutive chunks of one ``(b, h)`` per CTA,
the next chunk's ``k``, ``beta`` and document vectors prefetched by TMA into a 2-slot ring,
and inverts in 16-column blocks with restricted products (``kkt_block_inverse``,
``kkt_block_refine``; issue 29, MOSAIC_GPU.md Sec. 12; not run on a GPU yet). The six ``T0``
cases of ``kernel_mosaic_gdn_t0_test.py`` (one chunk per CTA there) check the same kernel.

* ``ChunksPerCtaRuleTest`` (CI): the default ``chunks_per_cta`` rule and the argument check.
* ``KktLoweringTest`` (CI): the kernel exports for CUDA on the CPU host with several chunks
  per CTA, a partial last group included (about 2 s each on 2 cores).
* ``KktGroupsInterpretTest`` (``slow``): interpreted, against the float64 inverse of
  ``kernel_mosaic_gdn_t0_test`` (the same gate: 10 % above the float64 inverse's own rounding
  to the input dtype, exact zeros above the diagonal and between documents) with 2, 3 and 8
  chunks per CTA: partial last groups, a partial last chunk, documents packed across chunk
  and group boundaries, GVA, fp16, correlated keys; and bit-equal to one chunk per CTA (each
  chunk's arithmetic is unchanged by the grouping).
* ``stages`` (MOSAIC_GPU.md Sec. 14, timing ablations): ``KktStagesTest`` (CI) exports every
  stage for CUDA under its own kernel name at K 128 and K 64, checks that ``"full"`` is the
  default's jaxpr and that ``"nobar"``'s differs from it only in the auto-barrier flag and the
  kernel name, and that the interpreted ``"gram"`` stage stores ``A0`` (about 1 s);
  ``KktNoStoreInterpretTest`` (CI, about 4 s) checks that the interpreted ``"no_store"``
  stores each CTA's last chunk as ``"full"`` does, and only that chunk.
* ``inverse="substitution"`` (MOSAIC_GPU.md Sec. 13: the 16 x 16 diagonal blocks by fp32
  forward substitution, ``inline_mgpu`` on the GPU): ``KktLoweringTest`` exports it (CI);
  ``KktSubstitutionInterpretTest`` (``slow``, about 90 s) runs the six ``T0`` cases and the
  four group cases above against float64 with the same gate (interpreted, the substitution is
  its plain-``jnp`` form: the interpreter cannot run ``inline_mgpu``; the ``inline_mgpu`` code
  itself is checked by ``kernel_mosaic_gdn_t0_test.GpuTest``).
* ``refine="split_merge"`` (MOSAIC_GPU.md Sec. 15: no Newton step; the merges' ``X A`` takes
  ``A`` as ``A_hi + A_lo``, and for fp16 outputs ``X`` and ``Y`` split too, extra ``wgmma``
  into the same accumulators): ``KktLoweringTest`` exports it (CI), ``ChunksPerCtaRuleTest``
  checks the argument, ``KktStagesTest`` that each inverse's default ``refine`` is its
  jaxpr (``split_merge`` for the substitution, the default inverse since the H200 run of
  2026-12-04d; ``newton`` for the doubling);
  ``KktSplitMergeInterpretTest`` (``slow``, about 25 s) runs the same ten cases against
  float64 with the same gate.

Run the interpreted ones with a larger XLA CPU pool (MOSAIC_GPU.md Sec. 10):
``PJRT_NPROC=8 timeout 1500 python -m pytest -q -m slow
tests/pallas_kernels/kernel_mosaic_kkt_test.py``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest, parameterized

from pallas_kernels.common import mosaic_gpu_inverse as mgi
from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu as kgd
from tests.pallas_kernels import kernel_mosaic_gdn_t0_test as t0_test

C = kgd.CHUNK


class ChunksPerCtaRuleTest(absltest.TestCase):

    def test_default_rule(self):
        rule = kgd.kkt_chunks_per_cta
        self.assertEqual(rule(8, 16, 64), 8)  # S1: B 8, H 16, T 4096 -> 1024 CTAs
        self.assertEqual(rule(2, 16, 64), 2)  # 4 would leave 512 CTAs, 2 leaves 1024
        self.assertEqual(rule(1, 16, 64), 1)  # even 2 would leave only 512 CTAs
        self.assertEqual(rule(1, 1, 3), 1)  # tiny problems keep one chunk per CTA
        self.assertEqual(rule(64, 32, 2), 2)  # never more chunks per CTA than chunks
        for batch, heads, chunks in ((8, 16, 64), (1, 16, 64), (4, 8, 300), (64, 32, 2)):
            cpc = rule(batch, heads, chunks)
            self.assertIn(cpc, (1, 2, 4, 8))
            if cpc > 1:
                self.assertGreaterEqual(batch * heads * -(-chunks // cpc), kgd.KKT_MIN_CTAS)

    def test_rejects_unknown_inverse(self):
        k = jnp.zeros((1, 128, 1, 64), jnp.bfloat16)
        beta = jnp.zeros((1, 128, 1), jnp.float32)
        with self.assertRaisesRegex(ValueError, "inverse must be one of"):
            jax.eval_shape(lambda k, b: kgd.chunk_kkt_inverse_mosaic(k, b, inverse="lu"),
                           k, beta)
        self.assertIn(kgd.KKT_DEFAULT_INVERSE, kgd.KKT_INVERSES)
        self.assertEqual(kgd.T0_OPTIONS, {})  # the forwards' call sites use the defaults

    def test_rejects_unknown_or_unsupported_refine(self):
        k = jnp.zeros((1, 128, 1, 64), jnp.bfloat16)
        beta = jnp.zeros((1, 128, 1), jnp.float32)
        for kw, msg in ((dict(refine="lu"), "refine must be one of"),
                        (dict(refine="split_merge", inverse="doubling"),
                         "needs inverse='substitution'")):
            with self.assertRaisesRegex(ValueError, msg):
                jax.eval_shape(lambda k, b, kw=kw: kgd.chunk_kkt_inverse_mosaic(k, b, **kw),
                               k, beta)
        self.assertEqual(kgd.KKT_DEFAULT_INVERSE, "substitution")

    def test_rejects_unknown_stages(self):
        k = jnp.zeros((1, 128, 1, 64), jnp.bfloat16)
        beta = jnp.zeros((1, 128, 1), jnp.float32)
        with self.assertRaisesRegex(ValueError, "stages must be one of .*'full'.*got 'kkt'"):
            jax.eval_shape(lambda k, b: kgd.chunk_kkt_inverse_mosaic(k, b, stages="kkt"), k, beta)
        self.assertEqual(kgd.KKT_STAGES[0], "full")  # the default stays first

    def test_rejects_zero_chunks_per_cta(self):
        k = jnp.zeros((1, 128, 1, 64), jnp.bfloat16)
        beta = jnp.zeros((1, 128, 1), jnp.float32)
        with self.assertRaisesRegex(ValueError, "chunks_per_cta"):
            jax.eval_shape(lambda k, b: kgd.chunk_kkt_inverse_mosaic(k, b, chunks_per_cta=0),
                           k, beta)


def _export(test, dk, seq_len, chunks_per_cta, dtype=jnp.bfloat16, inverse="doubling",
            stages="full", refine="newton"):
    _, k, _, _, beta, _, seg = t0_test._inputs(1, seq_len, 2, 1, dk, 64, 0.2, False, (70, 30),
                                               dtype)

    def fn(k, beta, seg):
        return kgd.chunk_kkt_inverse_mosaic(k, beta, segment_ids=seg,
                                            chunks_per_cta=chunks_per_cta, inverse=inverse,
                                            stages=stages, refine=refine)

    exported = jax.export.export(jax.jit(fn), platforms=["cuda"])(k, beta, seg)
    text = exported.mlir_module()
    test.assertEqual(text.count("custom_call @mosaic_gpu"), 1)
    test.assertIn("gdn_chunk_kkt_inverse", text)
    test.assertEqual("gdn_chunk_kkt_inverse_subst" in text, inverse == "substitution")
    test.assertEqual(f"_abl_{stages}" in text, stages != "full")
    test.assertEqual("gdn_chunk_kkt_inverse_subst_split" in text, refine == "split_merge")
    test.assertEqual([(a.shape, a.dtype) for a in exported.out_avals],
                     [((1, seq_len, 2, C), k.dtype)])


class DiagSolveTest(absltest.TestCase):
    """The shared inverse helpers (:mod:`pallas_kernels.common.mosaic_gpu_inverse`), which the
    T0 kernel and KDA's chunk-local kernel both use."""

    def test_interpreted_diag_solve_inverts_each_diagonal_block(self):
        rng = np.random.default_rng(3)
        a = np.tril(0.3 * rng.normal(size=(64, 64)), -1).astype(np.float32)  # strictly lower
        cols = mgi.kkt_diag_solve(jnp.asarray(a), None, interpret=True)
        x = np.concatenate([np.asarray(c) for c in cols], axis=1)
        for c in range(4):  # fp32 substitution against the float64 inverse of I + A's block
            blk = slice(16 * c, 16 * (c + 1))
            want = np.linalg.inv(np.eye(16) + a[blk, blk].astype(np.float64))
            err = np.abs(x[blk, blk] - want).max() / np.abs(want).max()
            self.assertLess(err, 1e-5, msg=f"block {c}")
        off = np.kron(np.eye(4), np.ones((16, 16))) == 0
        self.assertEqual(float(np.abs(x[off]).max()), 0.0)  # zero outside the blocks
        # the GDN module's names are these helpers, not copies
        self.assertIs(kgd.kkt_diag_solve, mgi.kkt_diag_solve)
        self.assertIs(kgd.kkt_block_merge, mgi.kkt_block_merge)


class KktLoweringTest(parameterized.TestCase):
    """Several chunks per CTA export for CUDA (layouts, swizzles, the ring's slot views)."""

    @parameterized.named_parameters(
        ("cpc2_T256_K128", 128, 256, 2),
        # fp16: the Newton step's A X also has the A_hi X_lo term
        ("cpc3_partial_group_fp16_T300_K64", 64, 300, 3, jnp.float16),
    )
    def test_exports_for_cuda(self, dk, seq_len, chunks_per_cta, dtype=jnp.bfloat16):
        _export(self, dk, seq_len, chunks_per_cta, dtype)

    @parameterized.named_parameters(
        ("cpc2_T256_K128", 128, 256, 2),
        ("cpc3_partial_group_fp16_T300_K64", 64, 300, 3, jnp.float16),
    )
    def test_substitution_exports_for_cuda(self, dk, seq_len, chunks_per_cta,
                                           dtype=jnp.bfloat16):
        # inverse="substitution": the inline_mgpu forward substitution (padded fp32 buffer, a
        # strided view of it) lowers inside the chunk loop.
        _export(self, dk, seq_len, chunks_per_cta, dtype, inverse="substitution")

    @parameterized.named_parameters(
        ("cpc2_T256_K128", 128, 256, 2),
        # fp16: X and Y split too (X_lo in xl_s, Y_lo a second register operand)
        ("cpc3_partial_group_fp16_T300_K64", 64, 300, 3, jnp.float16),
        ("nobar_cpc2_T256_K128", 128, 256, 2, jnp.bfloat16, "nobar"),
    )
    def test_split_merge_exports_for_cuda(self, dk, seq_len, chunks_per_cta,
                                          dtype=jnp.bfloat16, stages="full"):
        # refine="split_merge": A_lo (and X_lo) tiles, two to three wgmma per accumulator.
        _export(self, dk, seq_len, chunks_per_cta, dtype, inverse="substitution",
                stages=stages, refine="split_merge")


class KktStagesTest(parameterized.TestCase):
    """The timing ablations of MOSAIC_GPU.md Sec. 14 (``stages``): each exports for CUDA under
    its own kernel name, and the interpreted ``"gram"`` stores ``A0`` itself."""

    @parameterized.named_parameters(
        ("no_refine_cpc2_T256_K128", "no_refine", 128, 256, 2),
        ("gram_cpc2_T256_K128", "gram", 128, 256, 2),
        ("io_cpc2_T256_K128", "io", 128, 256, 2),
        ("no_store_cpc2_T256_K128", "no_store", 128, 256, 2),
        ("nobar_cpc2_T256_K128", "nobar", 128, 256, 2),
        ("no_refine_subst_fp16_cpc3_T300_K64", "no_refine", 64, 300, 3, jnp.float16,
         "substitution"),
        ("gram_cpc3_T300_K64", "gram", 64, 300, 3),
        ("io_fp16_cpc3_T300_K64", "io", 64, 300, 3, jnp.float16),
        ("no_store_subst_cpc3_T300_K64", "no_store", 64, 300, 3, jnp.bfloat16, "substitution"),
        ("nobar_subst_fp16_cpc3_T300_K64", "nobar", 64, 300, 3, jnp.float16, "substitution"),
    )
    def test_stage_exports_for_cuda(self, stages, dk, seq_len, chunks_per_cta,
                                    dtype=jnp.bfloat16, inverse="doubling"):
        _export(self, dk, seq_len, chunks_per_cta, dtype, inverse=inverse, stages=stages)

    def test_full_is_the_default_and_nobar_only_drops_the_barriers(self):
        k = jnp.zeros((1, 300, 1, 64), jnp.bfloat16)
        beta = jnp.zeros((1, 300, 2), jnp.float32)
        seg = jnp.zeros((1, 300), jnp.int32)
        for inverse in kgd.KKT_INVERSES:
            def jaxpr(**kw):
                return str(jax.make_jaxpr(lambda k, b, s: kgd.chunk_kkt_inverse_mosaic(
                    k, b, segment_ids=s, chunks_per_cta=3, **kw))(k, beta, seg))

            # Each inverse's default refine: split merges for the substitution (the default
            # inverse since 2026-12-04d), the Newton step for the doubling.
            best = "split_merge" if inverse == "substitution" else "newton"
            default = jaxpr(inverse=inverse)
            self.assertEqual(jaxpr(inverse=inverse, stages="full"), default)
            self.assertEqual(jaxpr(inverse=inverse, refine=best), default)
            if inverse == kgd.KKT_DEFAULT_INVERSE:
                self.assertEqual(jaxpr(), default)
            self.assertIn("unsafe_no_auto_barriers=False", default)
            nobar = jaxpr(inverse=inverse, stages="nobar")
            self.assertNotEqual(nobar, default)
            self.assertEqual(nobar.replace("unsafe_no_auto_barriers=True",
                                           "unsafe_no_auto_barriers=False")
                             .replace("_abl_nobar", ""), default)

    def test_gram_stage_stores_a0(self):
        # 3 chunks (the last partial), GVA 2:1, two documents meeting inside chunk 1.
        rng = np.random.default_rng(7)
        batch, seq_len, heads, kv_heads, dk = 1, 150, 2, 1, 64
        k = rng.standard_normal((batch, seq_len, kv_heads, dk))
        k = jnp.asarray(k / np.linalg.norm(k, axis=-1, keepdims=True), jnp.bfloat16)
        beta = jnp.asarray(rng.uniform(0.2, 1.0, (batch, seq_len, heads)), jnp.float32)
        seg = jnp.asarray(np.repeat([3, 5], [70, 80])[None], jnp.int32)
        out = kgd.chunk_kkt_inverse_mosaic(k, beta, segment_ids=seg, stages="gram",
                                           chunks_per_cta=2, interpret=True)
        kf = np.asarray(k.astype(jnp.float32), np.float64)
        b, s = np.asarray(beta, np.float64), np.asarray(seg)
        want = np.zeros((batch, seq_len, heads, C))
        for h in range(heads):
            for i in range(seq_len):
                for j in range(i - i % C, i):  # earlier tokens of i's chunk
                    if s[0, i] == s[0, j]:
                        want[0, i, h, j % C] = b[0, i, h] * kf[0, i, 0] @ kf[0, j, 0]
        got = np.asarray(out.astype(jnp.float32), np.float64)
        self.assertEqual(out.shape, (batch, seq_len, heads, C))
        np.testing.assert_allclose(got, want, rtol=8e-3, atol=2e-3)  # bf16 output rounding
        self.assertTrue(np.all(got[want == 0] == 0))  # masks exact: above the diagonal, docs
        self.assertGreater(np.abs(want).max(), 0.1)


class KktNoStoreInterpretTest(absltest.TestCase):
    """``stages="no_store"`` (interpreted, about 4 s): each CTA's last chunk goes out as
    ``"full"``'s, and the others do not go out."""

    def test_last_chunk_of_each_group_matches_full(self):
        rng = np.random.default_rng(11)
        seq_len, cpc = 5 * C - 20, 2  # groups of chunks (0, 1), (2, 3), (4): 4 partial
        k = rng.standard_normal((1, seq_len, 1, 64))
        k = jnp.asarray(k / np.linalg.norm(k, axis=-1, keepdims=True), jnp.bfloat16)
        beta = jnp.asarray(rng.uniform(0.2, 1.0, (1, seq_len, 1)), jnp.float32)
        full, no_store = (np.asarray(kgd.chunk_kkt_inverse_mosaic(
            k, beta, chunks_per_cta=cpc, stages=stages, interpret=True).astype(jnp.float32))
            for stages in ("full", "no_store"))
        for n in (1, 3, 4):  # the last chunk of each group
            rows = slice(n * C, min((n + 1) * C, seq_len))
            np.testing.assert_array_equal(no_store[:, rows], full[:, rows])
        for n in (0, 2):  # not stored: whatever the output buffer held, not T0
            rows = slice(n * C, (n + 1) * C)
            self.assertFalse(np.array_equal(no_store[:, rows], full[:, rows]))


# B, T, H, Hk, K, V, decay, h0, document lengths (the rest one more), dtype, correlated,
# chunks per CTA.
_GROUP_CASES = (
    # 5 chunks in groups of 2: the last group has one chunk; starts at 64 (a chunk and group
    # boundary), 100 (inside chunk 1), 200 (inside chunk 3, a document over the group boundary
    # at 128) and 290 (inside the partial chunk 4)
    ("cpc2_gva_packed_partial_T300_K64", 1, 300, 2, 1, 64, 64, 0.1, False, (64, 36, 100, 90),
     jnp.bfloat16, 0.0, 2),
    # 4 chunks in groups of 3 (the last group one chunk of 3); one document over chunks 0-2
    ("cpc3_packed_T256_K128", 2, 256, 2, 2, 128, 64, 0.1, False, (150, 60), jnp.bfloat16, 0.0,
     3),
    # more chunks per CTA than chunks: one group of 3, the last chunk partial
    ("cpc8_fp16_packed_partial_T150_K128", 1, 150, 1, 1, 128, 64, 0.1, False, (10, 100),
     jnp.float16, 0.0, 8),
    # keys sharing one direction, beta near 1, 2 chunks per CTA
    ("cpc2_correlated_T256_K128", 1, 256, 1, 1, 128, 64, 0.01, False, (90,), jnp.bfloat16, 3.0,
     2),
)


# Slow (out of CI): interpreted Mosaic GPU kernels. The mark is on the class: absl's
# parameterized copies of a method do not keep a method-level mark.
@pytest.mark.slow
class KktGroupsInterpretTest(parameterized.TestCase):

    @parameterized.named_parameters(*_GROUP_CASES)
    def test_t0_matches_float64_and_one_chunk_per_cta(self, batch, seq_len, heads, kv_heads, dk,
                                                      dv, decay, h0, docs, dtype, correlated,
                                                      chunks_per_cta):
        _, k, _, _, beta, _, seg = t0_test._inputs(batch, seq_len, heads, kv_heads, dk, dv,
                                                   decay, h0, docs, dtype,
                                                   correlated=correlated)
        # The doubling (Sec. 12); the substitution's group cases are below.
        t0 = kgd.chunk_kkt_inverse_mosaic(k, beta, segment_ids=seg, inverse="doubling",
                                          chunks_per_cta=chunks_per_cta, interpret=True)
        self.assertEqual(t0.dtype, k.dtype)
        err, max_err = t0_test._check_t0(self, k, beta, seg, t0)
        print(f"T0 {self.id()}: relative RMS {err:.3e}, max abs {max_err:.3e}")
        one = kgd.chunk_kkt_inverse_mosaic(k, beta, segment_ids=seg, chunks_per_cta=1,
                                           inverse="doubling", interpret=True)
        np.testing.assert_array_equal(np.asarray(t0, np.float32), np.asarray(one, np.float32))


# Slow (out of CI): interpreted. inverse="substitution" (MOSAIC_GPU.md Sec. 13): the 16 x 16
# diagonal blocks by fp32 forward substitution (interpreted: the plain-jnp form of the
# inline_mgpu code, which the interpreter cannot run), then the same merges and Newton step.
@pytest.mark.slow
class KktSubstitutionInterpretTest(parameterized.TestCase):

    @parameterized.named_parameters(*[(*case, None) for case in t0_test._T0_CASES])
    def test_t0_cases_match_float64(self, *case):
        _check_substitution(self, *case)

    @parameterized.named_parameters(*_GROUP_CASES)
    def test_group_cases_match_float64_and_one_chunk_per_cta(self, *case):
        t0 = _check_substitution(self, *case)
        *_, chunks_per_cta = case
        batch, seq_len, heads, kv_heads, dk, dv, decay, h0, docs, dtype, correlated = case[:11]
        _, k, _, _, beta, _, seg = t0_test._inputs(batch, seq_len, heads, kv_heads, dk, dv,
                                                   decay, h0, docs, dtype,
                                                   correlated=correlated)
        one = kgd.chunk_kkt_inverse_mosaic(k, beta, segment_ids=seg, chunks_per_cta=1,
                                           inverse="substitution", refine="newton",
                                           interpret=True)
        np.testing.assert_array_equal(np.asarray(t0, np.float32), np.asarray(one, np.float32))


# Slow (out of CI): interpreted, about 25 s with PJRT_NPROC=8. refine="split_merge" (MOSAIC_GPU.md
# Sec. 15): the substitution, then merges whose X A product takes A as A_hi + A_lo (fp16
# outputs: X and Y split too), no Newton step. Measured: 1.000 to 1.025 times the float64
# inverse's own rounding (the gate is 1.1); without the splits 2.03e-3 on correlated_T128_K128
# (1.41 times) and 1.14e-3 on correlated_fp16_packed_T150_K64 (6.4 times).
@pytest.mark.slow
class KktSplitMergeInterpretTest(parameterized.TestCase):

    @parameterized.named_parameters(*[(*case, None) for case in t0_test._T0_CASES])
    def test_t0_cases_match_float64(self, *case):
        _check_substitution(self, *case, refine="split_merge")

    @parameterized.named_parameters(*_GROUP_CASES)
    def test_group_cases_match_float64_and_one_chunk_per_cta(self, *case):
        t0 = _check_substitution(self, *case, refine="split_merge")
        batch, seq_len, heads, kv_heads, dk, dv, decay, h0, docs, dtype, correlated = case[:11]
        _, k, _, _, beta, _, seg = t0_test._inputs(batch, seq_len, heads, kv_heads, dk, dv,
                                                   decay, h0, docs, dtype,
                                                   correlated=correlated)
        one = kgd.chunk_kkt_inverse_mosaic(k, beta, segment_ids=seg, chunks_per_cta=1,
                                           inverse="substitution", refine="split_merge",
                                           interpret=True)
        np.testing.assert_array_equal(np.asarray(t0, np.float32), np.asarray(one, np.float32))


def _check_substitution(test, batch, seq_len, heads, kv_heads, dk, dv, decay, h0, docs, dtype,
                        correlated, chunks_per_cta, refine="newton"):
    """``inverse="substitution"`` (with ``refine``) against float64 (``t0_test._check_t0``'s
    gate and exact zeros). Returns ``T0``."""
    _, k, _, _, beta, _, seg = t0_test._inputs(batch, seq_len, heads, kv_heads, dk, dv, decay,
                                               h0, docs, dtype, correlated=correlated)
    t0 = kgd.chunk_kkt_inverse_mosaic(k, beta, segment_ids=seg, chunks_per_cta=chunks_per_cta,
                                      inverse="substitution", refine=refine, interpret=True)
    test.assertEqual(t0.dtype, k.dtype)
    err, max_err = t0_test._check_t0(test, k, beta, seg, t0)
    print(f"T0 substitution ({refine}) {test.id()}: relative RMS {err:.3e}, max abs "
          f"{max_err:.3e}")
    return t0


if __name__ == "__main__":
    absltest.main()
