"""benchmarks/profile_t0.py: variant parsing and expansion over ``--chunks_per_cta``, the
float64 check, the clock and cycles estimate, the table, one interpreted run of the binary on
CPU (the kernels' timing needs a GPU) and its deadline watchdog."""

import json
import os
import subprocess
import sys

import numpy as np
from absl.testing import absltest

from benchmarks import profile_t0
from tests import binary_runs

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


class ProfileT0Test(absltest.TestCase):

    def test_parse_variant(self):
        self.assertEqual(profile_t0.parse_variant("gram:doubling"), ("gram", "doubling", None))
        self.assertEqual(profile_t0.parse_variant(" full:substitution:4"),
                         ("full", "substitution", 4))
        self.assertEqual(profile_t0.parse_variant("nobar:substitution+split_merge:2"),
                         ("nobar", "substitution+split_merge", 2))
        self.assertEqual(profile_t0.kernel_options("substitution+split_merge"),
                         {"inverse": "substitution", "refine": "split_merge"})
        self.assertEqual(profile_t0.kernel_options("doubling"),
                         {"inverse": "doubling", "refine": "newton"})
        self.assertEqual(profile_t0.kernel_options("substitution"),
                         {"inverse": "substitution", "refine": "newton"})
        for bad, msg in (("gram", "expected"), ("kkt:doubling", "stages 'kkt'"),
                         ("full:lu", "inverse 'lu'"), ("full:doubling:0", "chunks per CTA"),
                         ("full:substitution+lu", "refine 'lu'"),
                         ("full:lu+split_merge", "inverse 'lu'"),
                         ("full:doubling+split_merge", "needs inverse 'substitution'"),
                         ("full:doubling:x", "chunks per CTA"), ("a:b:c:d", "expected")):
            with self.assertRaisesRegex(profile_t0.VariantError, msg):
                profile_t0.parse_variant(bad)

    def test_expand_variants_over_chunks_per_cta(self):
        self.assertEqual(profile_t0.expand_variants(["io:doubling", "full:doubling:2"], []),
                         [("io:doubling", "io", "doubling", None),
                          ("full:doubling:2", "full", "doubling", 2)])
        self.assertEqual(profile_t0.expand_variants(["io:doubling", "full:doubling:2"],
                                                    ["8", "1"]),
                         [("io:doubling:8", "io", "doubling", 8),
                          ("io:doubling:1", "io", "doubling", 1),
                          ("full:doubling:2", "full", "doubling", 2)])  # names its own
        for bad in ("0", "x", "-2"):
            with self.assertRaisesRegex(profile_t0.VariantError, "--chunks_per_cta entry"):
                profile_t0.expand_variants(["io:doubling"], [bad])
        with self.assertRaisesRegex(profile_t0.VariantError, "stages 'kkt'"):
            profile_t0.expand_variants(["kkt:doubling"], ["2"])
        self.assertEqual(len(profile_t0.expand_variants(profile_t0.DEFAULT_VARIANTS, [])),
                         len(profile_t0.DEFAULT_VARIANTS))  # the defaults all parse

    def test_cycles_per_chunk_matches_hand_computation(self):
        # 0.183 ms over 8,192 chunk-heads on 132 x 2 slots at 1.98 GHz: 11,677 cycles.
        got = profile_t0.cycles_per_chunk(0.183, 8 * 16 * 64, sm_count=132, ctas_per_sm=2,
                                          clock_ghz=1.98)
        self.assertAlmostEqual(got, 0.183e-3 * 1.98e9 * 264 / 8192, places=6)
        self.assertAlmostEqual(got, 11677.0, delta=0.1)

    def test_t0_float64_inverts_each_chunk_within_documents(self):
        rng = np.random.default_rng(3)
        t, heads = 100, 2
        k = rng.standard_normal((1, t, 1, 8))
        beta = rng.uniform(0.1, 1.0, (1, t, heads))
        seg = np.repeat([0, 1], [40, 60])[None]
        out = profile_t0.t0_float64(k, beta, seg, heads)
        self.assertEqual(out.shape, (t, heads, 64))
        for h in range(heads):
            for c0, n in ((0, 64), (64, 36)):
                kc, bc, sc = k[0, c0:c0 + n, 0], beta[0, c0:c0 + n, h], seg[0, c0:c0 + n]
                m = np.eye(n) + np.tril(bc[:, None] * (kc @ kc.T), -1) * (sc[:, None] == sc)
                np.testing.assert_allclose(m @ out[c0:c0 + n, h, :n], np.eye(n), atol=1e-9)
                self.assertTrue(np.all(out[c0:c0 + n, h, n:] == 0))
        self.assertTrue(np.all(out[45, 0, :40] == 0))  # token 45 is in the second document
        self.assertEqual(profile_t0.relative_rms(out, out), 0.0)
        noisy = out + 1e-3 * rng.standard_normal(out.shape)
        self.assertGreater(profile_t0.relative_rms(noisy, out), 0.0)

    def test_render_gives_each_stage_its_difference(self):
        d, s = "doubling", "substitution"
        recs = [dict(variant="io:doubling", stages="io", inverse=d, kernel_ms=0.05,
                     total_ms=0.06),
                dict(variant="gram:doubling", stages="gram", inverse=d, kernel_ms=0.08,
                     total_ms=0.09),
                dict(variant="full:doubling", stages="full", inverse=d,
                     skipped="deadline (3 s left, last took 9)"),
                dict(variant="full:substitution", stages="full", inverse=s, kernel_ms=0.18,
                     rel_rms=1.6e-3),
                dict(variant="nobar:substitution", stages="nobar", inverse=s, kernel_ms=0.12,
                     rel_rms=1.7e-3),
                dict(variant="nobar:substitution:4", stages="nobar", inverse=s,
                     chunks_per_cta=4, kernel_ms=0.13),
                dict(variant="no_store:substitution", stages="no_store", inverse=s,
                     error="error: TypeError: unexpected keyword"),
                dict(variant="full:substitution+split_merge", stages="full",
                     inverse=s + "+split_merge", kernel_ms=0.10, rel_rms=1.7e-3)]
        text = profile_t0.render(recs, "# head")
        self.assertIn("| gram:doubling | 0.080 | +0.030 | – |", text)  # no full:doubling
        self.assertIn("| full:doubling | skipped: deadline", text)
        self.assertIn("| full:substitution | 0.180 | +0.100 | – |", text)  # skips don't reset
        self.assertIn("| nobar:substitution | 0.120 | -0.060 | -0.060 |", text)
        self.assertIn("| nobar:substitution:4 | 0.130 | +0.010 | – |", text)  # other cpc
        self.assertIn("1.600e-03", text)
        self.assertIn("| no_store:substitution | failed: error: TypeError: unexpected", text)
        # refine="split_merge" is compared with the Newton kernel of its inverse
        self.assertIn("| full:substitution+split_merge | 0.100 | -0.030 | -0.080 |", text)

    def test_interpreted_run_writes_records_and_checks_the_full_variant(self):
        out = self.create_tempdir().full_path + "/t0"
        cmd = [sys.executable, "benchmarks/profile_t0.py", "--interpret", "--batch=1",
               "--seq_len=100", "--heads=2", "--kv_heads=1", "--dk=64", "--doc_len=40",
               "--iters=1", "--variants=gram:doubling,full:doubling:1,nobar:doubling",
               "--chunks_per_cta=2", f"--out={out}"]
        result = binary_runs.run(cmd, env={**os.environ, "JAX_PLATFORMS": "cpu"})
        self.assertEqual(result.returncode, 0, result.stderr[-2000:])
        with open(out + ".jsonl") as f:
            recs = [json.loads(line) for line in f]
        self.assertEqual([r["variant"] for r in recs],
                         ["gram:doubling:2", "full:doubling:1", "nobar:doubling:2"])
        self.assertEqual([r["chunks_per_cta"] for r in recs], [2, 1, 2])
        self.assertLess(recs[1]["rel_rms"], 2e-3)  # bf16 output rounding, Sec. 13's level
        self.assertLess(recs[2]["rel_rms"], 2e-3)  # nobar returns T0 too
        self.assertNotIn("rel_rms", recs[0])  # only T0 is checked
        with open(out + ".md") as f:
            self.assertIn("| full:doubling:1 |", f.read())

    def test_static_counts_of_the_lowered_stages(self):
        import jax
        import jax.numpy as jnp
        from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu as kgd
        k = jnp.zeros((1, 256, 1, 64), jnp.bfloat16)
        beta = jnp.zeros((1, 256, 2), jnp.float32)
        counts = {}
        for stages in ("io", "gram", "full", "nobar", "full:substitution+split_merge"):
            # Without an inverse: the doubling with the Newton step (the numbers below).
            stage, _, inverse = stages.partition(":")
            fn = jax.jit(lambda k, b, stage=stage, inverse=inverse: kgd.chunk_kkt_inverse_mosaic(
                k, b, stages=stage, chunks_per_cta=2,
                **profile_t0.kernel_options(inverse or "doubling")))
            text = jax.export.export(fn, platforms=["cuda"])(k, beta).mlir_module()
            counts[stages] = profile_t0.static_counts(profile_t0.mosaic_module_text(text))
        # K 64: K K^T is 4 wgmma (k steps of 16); the inverse 35 and the Newton step 30 more.
        self.assertEqual([counts[s]["wgmma"] for s in ("io", "gram", "full", "nobar")],
                         [0, 4, 69, 69])
        self.assertEqual(counts["io"]["tma_load"], 8)  # prologue + prefetch, 4 copies each
        self.assertEqual(counts["full"]["tma_store"], 1)
        self.assertEqual(counts["full"]["fence_proxy"], 8)  # commit_smem: 3 + 2 + 2 + 1
        # The auto barriers: two per register -> SMEM store and one per TMA load issue.
        self.assertGreater(counts["full"]["bar_sync"], 60)
        self.assertEqual(counts["nobar"]["bar_sync"], 10)
        # split_merge (K 64, bf16): K K^T 4, the merges 11 (a [64, 16, 32] product is two
        # wgmma), 6 more for A_lo in the X A products; no Newton step: 3 commit_smem, 9 waits.
        split = counts["full:substitution+split_merge"]
        self.assertEqual((split["wgmma"], split["wgmma_wait"], split["fence_proxy"]),
                         (4 + 11 + 6, 9, 3))
        self.assertLess(counts["io"]["ops"], counts["gram"]["ops"])
        self.assertLess(counts["gram"]["ops"], counts["full"]["ops"])
        text = profile_t0.render_static([dict(variant="full:doubling", static=counts["full"])],
                                        "# h")
        self.assertIn("| full:doubling | ", text)
        with self.assertRaisesRegex(ValueError, "one mosaic_gpu custom call, found 0"):
            profile_t0.mosaic_module_text(jax.export.export(jax.jit(jnp.sin),
                                                            platforms=["cuda"])(beta)
                                          .mlir_module())

    def test_deadline_watchdog_keeps_the_table(self):
        # A deadline that passes during the imports or the first (interpreted) compile: the
        # watchdog writes the table of what finished and exits with DEADLINE_EXIT.
        out = self.create_tempdir().full_path + "/t0"
        cmd = [sys.executable, "benchmarks/profile_t0.py", "--interpret", "--batch=1",
               "--seq_len=64", "--heads=1", "--kv_heads=1", "--dk=64", "--iters=1",
               "--variants=full:doubling", "--deadline_s=0.01", f"--out={out}"]
        result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                                env={**os.environ, "JAX_PLATFORMS": "cpu"})
        self.assertEqual(result.returncode, profile_t0.DEADLINE_EXIT, result.stderr[-2000:])
        with open(out + ".md") as f:
            self.assertIn("| variant | T0 kernel ms |", f.read())

    def test_bad_variant_is_one_usage_line(self):
        result = binary_runs.run([sys.executable, "benchmarks/profile_t0.py", "--out=/tmp/x",
                                 "--variants=gram:lu"])
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("inverse 'lu' not in", result.stderr)
        self.assertNotIn("Traceback", result.stderr)


if __name__ == "__main__":
    absltest.main()
