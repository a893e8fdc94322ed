"""benchmarks/profile_wy_bwd.py (the WY backward's stage ablations, MOSAIC_GPU.md Sec. 26):
variant parsing and its refusals, the reference against the kernel tests' own, the gate (full
variant only), the table, and one ``--interpret`` run of the binary on CPU at a tiny shape (the
timing needs a GPU)."""

import json
import os
import sys

import jax.numpy as jnp
import numpy as np
from absl.testing import absltest

from benchmarks import profile_grad, profile_wy_bwd
from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu_wy_bwd as kwb
from tests import binary_runs
from tests.pallas_kernels import kernel_mosaic_gdn_wy_bwd_test as wy_bwd_test

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


class ProfileWyBwdTest(absltest.TestCase):

    def test_parse_variants_and_refusals(self):
        self.assertEqual(profile_wy_bwd.parse_variant("full"), ())
        self.assertEqual(profile_wy_bwd.parse_variant(" no_split+no_exp "),
                         ("no_exp", "no_split"))
        for bad, msg in (("nope", "not in"), ("no_mma+no_mma", "repeat"),
                         ("io+no_mma", "alone"), ("", "not in"), ("no_mma+", "not in")):
            with self.assertRaisesRegex(profile_wy_bwd.VariantError, msg):
                profile_wy_bwd.parse_variant(bad)
        with self.assertRaisesRegex(profile_wy_bwd.VariantError, "twice"):
            profile_wy_bwd.parse_variants(["no_exp+no_mma", "no_mma+no_exp"])
        with self.assertRaisesRegex(profile_wy_bwd.VariantError, "empty"):
            profile_wy_bwd.parse_variants([])
        # The default list: the full kernel first, then every ablation alone, then the rest.
        runs = profile_wy_bwd.parse_variants(profile_wy_bwd.DEFAULT_VARIANTS)
        self.assertEqual(runs[0], ("full", ()))
        self.assertEqual(sorted(a for _, a in runs[1:] if len(a) == 1),
                         sorted((n,) for n in kwb.WY_BWD_ABLATIONS))
        self.assertEqual(runs[-1][1], ("no_exp", "no_inverse", "no_mma", "no_split"))

    def test_reference_is_the_kernel_tests_reference(self):
        args, seg, want = wy_bwd_test._case(1, 100, 2, 2, 64, 64, 0.1, None, 0.0)
        self.assertIsNone(seg)
        got = profile_wy_bwd.reference(*args)
        for name, x, y in zip(profile_wy_bwd.NAMES, got, want):
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-4, atol=2e-5,
                                       err_msg=name)

    def test_gate_record(self):
        want = [np.ones((1, 64, 2, 8)), np.ones((1, 64, 2, 8)), np.ones((1, 64, 2)),
                np.ones((1, 64, 2))]
        outs = [jnp.concatenate([x[:, :, :1], 5 * x[:, :, 1:]], axis=2)
                for x in map(jnp.asarray, want)]
        rec = profile_wy_bwd.gate_record(outs, want, 2, 1e-3)
        self.assertEqual(rec["gate"], "FAIL (dk, dv, dbeta, dg >= 0.001)")  # head 1 is 5x
        rec = profile_wy_bwd.gate_record(outs, [x[:, :, :1] for x in want], 1, 1e-3)
        self.assertEqual(rec["gate"], "pass")
        outs[3] = outs[3] * np.nan
        rec = profile_wy_bwd.gate_record(outs, [x[:, :, :1] for x in want], 1, 1e-3)
        self.assertEqual(rec["gate"], "FAIL (dg >= 0.001)")

    def test_table(self):
        recs = [dict(variant="full", kernel="wy_bwd", ablations=[], kernel_ms=0.9,
                     total_ms=1.0, compile_s=3.0, gate="pass", rel_rms=dict(dk=1e-4)),
                dict(variant="no_split", kernel="wy_bwd", ablations=["no_split"],
                     kernel_ms=0.6, gate=profile_wy_bwd.SKIPPED_GATE),
                dict(variant="io", kernel="wy_bwd", ablations=["io"], skipped="deadline")]
        lines = profile_grad.render(recs, "# head").splitlines()
        self.assertIn("| full | 0.900 | – | 1.000 | pass, max rel. RMS 1.00e-04 | 3.0 |",
                      lines[4])
        self.assertIn("| no_split | 0.600 | -0.300 |", lines[5])
        self.assertIn("| io | skipped: deadline |", lines[6])

    def test_interpret_run_and_refusal_of_the_binary(self):
        out = os.path.join(self.create_tempdir().full_path, "w")
        env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
        cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "profile_wy_bwd.py"),
               "--interpret", "--batch=1", "--seq_len=64", "--heads=1", "--dk=64", "--dv=64",
               "--iters=0", "--check_heads=1", f"--out={out}"]
        res = binary_runs.run(cmd + ["--variants=full,no_split+no_mma", "--deadline_s=200"],
                              env=env)
        self.assertEqual(res.returncode, 0, res.stderr[-2000:])
        recs = [json.loads(x) for x in open(out + ".jsonl")]
        self.assertEqual([r["variant"] for r in recs], ["full", "no_split+no_mma"])
        self.assertEqual(recs[0]["gate"], "pass", recs[0])
        self.assertLess(max(recs[0]["rel_rms"].values()), 1e-3)
        self.assertEqual(recs[1]["gate"], profile_wy_bwd.SKIPPED_GATE)
        self.assertIn("| no_split+no_mma |", open(out + ".md").read())
        res = binary_runs.run(cmd + ["--variants=io+no_mma"], env=env)
        self.assertNotEqual(res.returncode, 0)
        self.assertIn("use it alone", res.stderr)


if __name__ == "__main__":
    absltest.main()
