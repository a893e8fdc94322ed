"""benchmarks/profile_grad.py (K1 / K2 stage ablations, MOSAIC_GPU.md Sec. 22): variant parsing
and its refusals, the float64 reference against the kernel tests' own, the gate (full variants
only), the table, and one ``--static`` run of the binary on CPU (the timing needs a GPU)."""

import json
import os
import sys

import numpy as np
from absl.testing import absltest

from benchmarks import profile_grad
from pallas_kernels.common import channelwise_grad_mosaic_gpu as cgm
from tests import binary_runs

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


class ProfileGradTest(absltest.TestCase):

    def test_parse_variant_and_refusals(self):
        self.assertEqual(profile_grad.parse_variant("k1"), ("k1", ()))
        self.assertEqual(profile_grad.parse_variant(" k2:no_state+no_band"),
                         ("k2", ("no_band", "no_state")))
        self.assertEqual(profile_grad.parse_variant("k1:no_store"), ("k1", ("no_store",)))
        for bad, msg in (("k3", "kernel 'k3'"), ("k1:no_state", "ablation 'no_state' not in"),
                         ("k2:nope", "ablation 'nope'"), ("k1:", "ablation ''"),
                         ("k2:no_band+no_band", "named twice"), ("k1:no_band:x", "expected")):
            with self.assertRaisesRegex(profile_grad.VariantError, msg):
                profile_grad.parse_variant(bad)
        runs = profile_grad.parse_variants(profile_grad.DEFAULT_VARIANTS)
        self.assertEqual(len(runs), len(profile_grad.DEFAULT_VARIANTS))
        # Every ablation of each kernel alone is in the defaults, after its full variant, and
        # last the "rest": all of them but no_store.
        for kernel, allowed in (("k1", cgm.K1_ABLATIONS), ("k2", cgm.K2_ABLATIONS)):
            mine = [a for _, k, a in runs if k == kernel]
            self.assertEqual(mine[0], ())
            self.assertEqual(sorted(a[0] for a in mine[1:-1] if len(a) == 1), sorted(allowed))
            self.assertEqual(mine[-1], tuple(sorted(set(allowed) - {"no_store"})))
        with self.assertRaisesRegex(profile_grad.VariantError, "same variant twice"):
            profile_grad.parse_variants(["k2:no_band", "k2:no_band"])
        with self.assertRaisesRegex(profile_grad.VariantError, "empty"):
            profile_grad.parse_variants([])

    def test_slabs(self):
        self.assertEqual(profile_grad.parse_slabs(["16", "32"]), (16, 32))
        for bad, msg in ((["24"], "not one of"), (["x"], "not one of"), (["16", "16"], "twice"),
                         ([], "empty")):
            with self.assertRaisesRegex(profile_grad.VariantError, msg):
                profile_grad.parse_slabs(bad)
        runs = profile_grad.parse_variants(["k2", "k1:no_band"])
        # Each variant at every slab before the next; one slab keeps the plain labels.
        self.assertEqual(profile_grad.with_slabs(runs, (16, 32)),
                         [("k2@16", "k2", (), 16), ("k2@32", "k2", (), 32),
                          ("k1:no_band@16", "k1", ("no_band",), 16),
                          ("k1:no_band@32", "k1", ("no_band",), 32)])
        self.assertEqual([r[0] for r in profile_grad.with_slabs(runs, (16,))],
                         ["k2", "k1:no_band"])

    def test_float64_reference_matches_the_kernel_tests(self):
        from tests.pallas_kernels import kernel_mosaic_channelwise_grad_chunk_test as k2_test
        from tests.pallas_kernels import kernel_mosaic_channelwise_grad_test as k1_test
        rng = np.random.default_rng(0)
        t, h, dk, dv, n = 128, 2, 16, 8, 2
        q, k, kr = (rng.standard_normal((1, t, h, dk)) for _ in range(3))
        g = -0.3 * rng.uniform(size=(1, t, h, dk))
        gamma = np.cumsum(g.reshape(1, n, 64, h, dk), axis=2).reshape(1, t, h, dk)
        do, vn, dr = (rng.standard_normal((1, t, h, dv)) for _ in range(3))
        ks = rng.uniform(size=(1, t, h, 1))
        hs, dhs = (rng.standard_normal((1, h, n, dk, dv)) for _ in range(2))
        args = (q, k, kr, gamma, do, vn, dr)
        got = profile_grad.grad_float64(q[0], k[0], kr[0], ks[0], gamma[0], hs[0], dhs[0],
                                        do[0], vn[0], dr[0], scale=0.3, heads=h)
        for name, want in zip(("dq_m", "dk_m", "dkr_m"), k1_test.reference(args, None, 0.3)):
            np.testing.assert_allclose(got[name], want[0], rtol=1e-10, atol=1e-10)
        for name, want in zip(("dq", "dk", "dks", "dg"),
                              k2_test.reference(args, ks, hs, dhs, (), 0.3)):
            np.testing.assert_allclose(got[name], want[0], rtol=1e-10, atol=1e-10)
        one = profile_grad.grad_float64(q[0], k[0], kr[0], ks[0], gamma[0], hs[0], dhs[0],
                                        do[0], vn[0], dr[0], scale=0.3, heads=1)
        np.testing.assert_array_equal(one["dg"], got["dg"][:, :1])

    def test_gate_record(self):
        want = {"dq_m": np.ones((64, 1, 4)), "dk_m": np.ones((64, 1, 4)),
                "dkr_m": np.ones((64, 1, 4))}
        good = [np.ones((1, 64, 2, 4), np.float32)] * 3
        rec = profile_grad.gate_record("k1", good, want, 1, 5e-3)
        self.assertEqual(rec["gate"], "pass")
        self.assertEqual(set(rec["rel_rms"]), {"dq", "dk", "dkr"})
        bad = [good[0], 1.1 * good[1], np.full_like(good[2], np.nan)]
        rec = profile_grad.gate_record("k1", bad, want, 1, 5e-3)
        self.assertEqual(rec["gate"], "FAIL (dk, dkr >= 0.005)")
        self.assertAlmostEqual(rec["rel_rms"]["dk"], 0.1, places=6)

    def test_table(self):
        recs = [dict(variant="k2", kernel="k2", ablations=[], kernel_ms=2.0, total_ms=2.2,
                     gate="pass", rel_rms={"dq": 1e-3, "dg": 2e-3}, compile_s=9.0),
                dict(variant="k2:no_band", kernel="k2", ablations=["no_band"], kernel_ms=1.5,
                     total_ms=1.7, gate=profile_grad.SKIPPED_GATE, compile_s=8.0),
                dict(variant="k1:no_band", kernel="k1", ablations=["no_band"], kernel_ms=1.0,
                     gate=profile_grad.SKIPPED_GATE),
                dict(variant="k2:no_mma", kernel="k2", ablations=["no_mma"], error="boom"),
                dict(variant="k1", kernel="k1", ablations=[], skipped="deadline")]
        lines = profile_grad.render(recs, "# head").splitlines()
        self.assertEqual(lines[0], "# head")
        self.assertEqual(lines[4], "| k2 | 2.000 | – | 2.200 | pass, max rel. RMS 2.00e-03 | "
                                   "9.0 |")
        self.assertEqual(lines[5], "| k2:no_band | 1.500 | -0.500 | 1.700 | skipped (ablated: "
                                   "wrong by design) | 8.0 |")
        self.assertIn("| k1:no_band | 1.000 | – |", lines[6])  # no k1 full measured
        self.assertEqual(lines[7], "| k2:no_mma | failed: boom | | | | |")
        self.assertEqual(lines[8], "| k1 | skipped: deadline | | | | |")

    def test_table_deltas_per_slab(self):
        recs = [dict(variant="k2@16", kernel="k2", ablations=[], slab=16, kernel_ms=2.0),
                dict(variant="k2@32", kernel="k2", ablations=[], slab=32, kernel_ms=3.0),
                dict(variant="k2:no_band@16", kernel="k2", ablations=["no_band"], slab=16,
                     kernel_ms=1.5),
                dict(variant="k2:no_band@32", kernel="k2", ablations=["no_band"], slab=32,
                     kernel_ms=2.0)]
        lines = profile_grad.render(recs, "# head").splitlines()
        self.assertIn("| k2:no_band@16 | 1.500 | -0.500 |", lines[6])
        self.assertIn("| k2:no_band@32 | 2.000 | -1.000 |", lines[7])

    def test_static_run_and_refusal_of_the_binary(self):
        out = os.path.join(self.create_tempdir().full_path, "g")
        env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
        cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "profile_grad.py"),
               "--static", "--batch=1", "--seq_len=128", "--heads=1", f"--out={out}"]
        res = binary_runs.run(cmd + ["--variants=k2,k2:no_state,k1:no_mma", "--slabs=32"],
                              env=env)
        self.assertEqual(res.returncode, 0, res.stderr[-2000:])
        recs = [json.loads(x) for x in open(out + ".jsonl")]
        self.assertEqual([r["variant"] for r in recs], ["k2", "k2:no_state", "k1:no_mma"])
        # The ablations remove what they name: K2's 4 state products, K1's phase-2 wgmma.
        self.assertEqual(recs[0]["static"]["wgmma"] - recs[1]["static"]["wgmma"], 32)
        self.assertEqual(recs[2]["static"]["wgmma"], 8)  # phase 1's [64, 128] @ [128, 64]
        self.assertIn("| k2:no_state |", open(out + ".md").read())
        res = binary_runs.run(cmd + ["--variants=k1:no_state"], env=env)
        self.assertNotEqual(res.returncode, 0)
        self.assertIn("ablation 'no_state' not in", res.stderr)


if __name__ == "__main__":
    absltest.main()
