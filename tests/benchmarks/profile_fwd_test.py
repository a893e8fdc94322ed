"""benchmarks/profile_fwd.py: variant parsing, waves and cycles, the floors at S1, the float64
``o`` against the fp32 reference, the table, the static counts of the lowered stages, the
deadline watchdog; the same for the three-warpgroup kernel's ablations (``--split_order``,
``--split_stages``: parsing, kernel names, floors, static counts, usage errors); interpreted
runs of the binary (``slow``; the kernels' timing needs a GPU)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from absl.testing import absltest

from benchmarks import profile_fwd
from tests import binary_runs

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


class ProfileFwdTest(absltest.TestCase):

    def test_parse_variants(self):
        self.assertEqual(profile_fwd.parse_variants([" io", "state", "full"]),
                         ["io", "state", "full"])
        self.assertEqual(profile_fwd.parse_variants(profile_fwd.DEFAULT_VARIANTS),
                         list(profile_fwd.DEFAULT_VARIANTS))
        with self.assertRaisesRegex(profile_fwd.VariantError, "'gram': not in"):
            profile_fwd.parse_variants(["io", "gram"])
        with self.assertRaisesRegex(profile_fwd.VariantError, "repeated"):
            profile_fwd.parse_variants(["full", "full"])

    def test_parse_split_and_its_variants(self):
        self.assertEqual(profile_fwd.parse_split("", 2), {})
        self.assertEqual(profile_fwd.parse_split("state_ag", 3),
                         dict(split_output=True, split_order="state_ag", split_stages=3))
        with self.assertRaisesRegex(profile_fwd.VariantError, "needs --split_order"):
            profile_fwd.parse_split("", 3)
        with self.assertRaisesRegex(profile_fwd.VariantError, "--split_stages=4: not in"):
            profile_fwd.parse_split("state_ag", 4)
        with self.assertRaisesRegex(profile_fwd.VariantError, "'ahead': not in"):
            profile_fwd.parse_split("ahead", 2)
        self.assertEqual(profile_fwd.parse_variants(profile_fwd.SPLIT_DEFAULT_VARIANTS,
                                                    "state_ag"),
                         list(profile_fwd.SPLIT_DEFAULT_VARIANTS))
        self.assertEqual(profile_fwd.parse_variants(["io", "nobar"], "readout_first"),
                         ["io", "nobar"])
        with self.assertRaisesRegex(profile_fwd.VariantError, "'v_new': not in"):
            profile_fwd.parse_variants(["v_new"], "state_ag")
        with self.assertRaisesRegex(profile_fwd.VariantError, "'readout': not in"):
            profile_fwd.parse_variants(["readout"])  # two warpgroups
        with self.assertRaisesRegex(profile_fwd.VariantError, "needs --split_order=state_ag"):
            profile_fwd.parse_variants(["state"], "prepare_mid")

    def test_kernel_names(self):
        split = profile_fwd.parse_split("state_ag", 3)
        self.assertEqual(profile_fwd.kernel_name("full", split),
                         "gdn_chunk_delta_fused_t0_fwd_split_sa_s3")
        self.assertEqual(profile_fwd.kernel_name("readout", split),
                         "gdn_chunk_delta_fused_t0_fwd_split_sa_s3_abl_readout")
        self.assertEqual(profile_fwd.kernel_name("io", {}), "gdn_chunk_delta_fused_t0_fwd_abl_io")
        for stages in profile_fwd.SPLIT_DEFAULT_VARIANTS:
            self.assertTrue(profile_fwd.kernel_name(stages, split).startswith(
                profile_fwd.KERNEL_PREFIX))

    def test_rs_stages_profile_the_fused_rs_kernel(self):
        # --rs_stages (MOSAIC_GPU.md Sec. 56): the fused_rs kernel, its one variant full.
        self.assertEqual(profile_fwd.parse_rs(0, "", ["io"]), {})
        split = profile_fwd.parse_rs(3, "", ["full"])
        self.assertEqual(split, {"rs_stages": 3})
        self.assertEqual(profile_fwd.kernel_name("full", split),
                         "gdn_chunk_delta_fused_rs_fwd_s3")
        self.assertTrue(profile_fwd.kernel_name("full", split).startswith(
            profile_fwd.RS_KERNEL_PREFIX))
        self.assertEqual(profile_fwd._split_fields(split)["rs_stages"], 3)
        self.assertEqual(profile_fwd.kernel_name("readout", split),
                         "gdn_chunk_delta_fused_rs_fwd_s3_abl_readout")
        self.assertEqual(profile_fwd.parse_rs(2, "", ["state", "readout", "full"]),
                         {"rs_stages": 2})
        for args, message in (((4, "", ["full"]), "--rs_stages=4: not in"),
                              ((2, "state_ag", ["full"]), "not with --split_order"),
                              ((2, "", ["io", "full"]), "'io' is not one of"),
                              ((2, "", ["full", "full"]), "or is repeated")):
            with self.assertRaisesRegex(profile_fwd.VariantError, message):
                profile_fwd.parse_rs(*args)

    def test_rs_protocol_profiles_the_ag_ahead_kernel(self):
        # --rs_protocol=ag_ahead (MOSAIC_GPU.md Sec. 64): its kernel names and records.
        split = profile_fwd.parse_rs(3, "", ["state", "readout", "full"], "ag_ahead")
        self.assertEqual(split, {"rs_stages": 3, "rs_protocol": "ag_ahead"})
        self.assertEqual(profile_fwd.kernel_name("full", split),
                         "gdn_chunk_delta_fused_rs_fwd_s3_ah")
        self.assertEqual(profile_fwd.kernel_name("state", split),
                         "gdn_chunk_delta_fused_rs_fwd_s3_ah_abl_state")
        self.assertEqual(profile_fwd._split_fields(split)["rs_protocol"], "ag_ahead")
        self.assertEqual(profile_fwd._split_fields({"rs_stages": 2})["rs_protocol"], "joint")
        self.assertNotIn("rs_protocol", profile_fwd._split_fields({}))
        for args, message in (((0, "", ["full"], "ag_ahead"), "applies to --rs_stages only"),
                              ((2, "", ["full"], "early"), "not in")):
            with self.assertRaisesRegex(profile_fwd.VariantError, message):
                profile_fwd.parse_rs(*args)

    def test_waves_and_cycles_match_hand_computation(self):
        # S1: 8 x 16 x 2 = 256 CTAs on 132 SMs, one each: 2 waves; 0.421 ms over 2 x 64
        # chunks at 1.98 GHz is 6,512 cycles per chunk.
        self.assertEqual(profile_fwd.waves(8, 16, 128, sm_count=132, ctas_per_sm=1), 2)
        self.assertEqual(profile_fwd.waves(1, 16, 64, sm_count=132, ctas_per_sm=1), 1)
        self.assertEqual(profile_fwd.waves(8, 16, 128, sm_count=132, ctas_per_sm=2), 1)
        got = profile_fwd.cycles_per_chunk(0.421, 64, 2, 1.98)
        self.assertAlmostEqual(got, 0.421e-3 * 1.98e9 / 128, places=6)
        self.assertAlmostEqual(got, 6512.3, delta=0.1)

    def test_floors_at_s1(self):
        fl = profile_fwd.floors(8, 4096, 16, 16, 128, 128)
        tokens = 8 * 4096
        want = (tokens * 16 * 128 * 2 * 4  # q, k, v, o in bf16
                + tokens * 16 * 64 * 2  # T0
                + tokens * 16 * 4 * 2  # gate cumsum, beta
                + tokens * 4 * 3  # doc, last, conn
                + 8 * 16 * 128 * 128 * 4)  # final state
        self.assertEqual(fl["hbm_bytes"], want)
        self.assertAlmostEqual(fl["hbm_ms"], want / 4.8e12 * 1e3)
        # per (b, h, chunk, 64 columns): K S, Q S, Q K^T, K^T v_new at 64 x 64 x 128 each,
        # Ag X twice and P v_new at 64 x 64 x 64.
        self.assertEqual(fl["mac"], 8 * 16 * 64 * 2 * (4 * 64 * 64 * 128 + 3 * 64 ** 3))
        self.assertAlmostEqual(fl["tensor_ms"], 2 * fl["mac"] / 989e12 * 1e3)
        partial = profile_fwd.floors(1, 100, 2, 1, 64, 64)  # T padded to 128
        self.assertEqual(partial["mac"], 2 * 2 * 64 * 64 * (4 * 64 + 3 * 64))
        # the split kernel: Ag X once (one 16-bit Ag_<), the same bytes
        split = profile_fwd.floors(8, 4096, 16, 16, 128, 128, split=True)
        self.assertEqual(split["mac"], 8 * 16 * 64 * 2 * (4 * 64 * 64 * 128 + 2 * 64 ** 3))
        self.assertEqual(split["hbm_bytes"], fl["hbm_bytes"])

    def test_o_float64_matches_the_fp32_reference(self):
        import jax.numpy as jnp
        from pallas_kernels.gated_delta_rule import reference
        rng = np.random.default_rng(3)
        batch, seq_len, heads, kv_heads, dk, dv = 1, 90, 2, 1, 16, 8
        q = rng.standard_normal((batch, seq_len, kv_heads, dk)) / 4
        k = rng.standard_normal((batch, seq_len, kv_heads, dk))
        k /= np.linalg.norm(k, axis=-1, keepdims=True)
        v = rng.standard_normal((batch, seq_len, heads, dv))
        g = -rng.uniform(0.0, 0.5, (batch, seq_len, heads))
        beta = rng.uniform(0.1, 1.0, (batch, seq_len, heads))
        seg = np.repeat([0, 1, 2], [40, 5, 45])[None]
        got = profile_fwd.o_float64(q, k, v, g, beta, seg, 0.3, heads)
        qh, kh = (np.repeat(x, heads // kv_heads, axis=2) for x in (q, k))  # GVA expanded
        want = reference.gated_delta_rule_reference(
            *(jnp.asarray(x, jnp.float32) for x in (qh, kh, v, g, beta)), scale=0.3,
            segment_ids=jnp.asarray(seg, jnp.int32))[0]
        np.testing.assert_allclose(got, np.asarray(want)[0], rtol=1e-4, atol=1e-5)
        deltanet = profile_fwd.o_float64(q, k, v, None, beta, None, 0.3, 1)
        want = reference.gated_delta_rule_reference(
            *(jnp.asarray(x, jnp.float32) for x in (qh, kh, v)), None,
            jnp.asarray(beta, jnp.float32), scale=0.3)[0]
        np.testing.assert_allclose(deltanet, np.asarray(want)[0, :, :1], rtol=1e-4, atol=1e-5)
        self.assertAlmostEqual(profile_fwd.relative_rms(want * 1.01, want), 0.01, places=6)

    def test_render_gives_each_stage_its_difference(self):
        recs = [dict(variant="io", stages="io", kernel_ms=0.15, total_ms=0.16,
                     cycles_per_chunk=2320.3, compile_s=3.0),
                dict(variant="state", stages="state", kernel_ms=0.30),
                dict(variant="full", stages="full", kernel_ms=0.421, rel_rms=2.9e-3),
                dict(variant="nobar", stages="nobar", kernel_ms=0.411, rel_rms=2.9e-3),
                dict(variant="no_store", stages="no_store", skipped="deadline (3 s left)"),
                dict(variant="v_new", stages="v_new", error="failed: ValueError")]
        text = profile_fwd.render(recs, "# h")
        self.assertIn("| io | 0.150 | – | -0.271 | 0.160 | 2,320 | – | 3.0 |", text)
        self.assertIn("| state | 0.300 | +0.150 | -0.121 |", text)
        self.assertIn("| full | 0.421 | +0.121 | – | – | – | 2.900e-03 |", text)
        self.assertIn("| nobar | 0.411 | -0.010 | -0.010 |", text)
        self.assertIn("| no_store | skipped: deadline (3 s left) |", text)
        self.assertIn("| v_new | failed: failed: ValueError |", text)

    def test_static_counts_of_the_lowered_stages(self):
        import jax
        import jax.numpy as jnp
        from benchmarks import profile_t0
        qk = jnp.zeros((1, 128, 1, 64), jnp.bfloat16)
        vt = jnp.zeros((1, 128, 2, 64), jnp.bfloat16)  # v and T0 (K = V = 64)
        args = [qk, qk, vt, vt] + [jnp.zeros((1, 128, 2), jnp.float32)] * 2 + [None]
        counts = {}
        for stages in ("io", "v_new", "state", "full", "nobar"):
            text = jax.export.export(profile_fwd._kernel_fn(stages, 0.1, False),
                                     platforms=["cuda"])(*args).mlir_module()
            self.assertIn(f"{profile_fwd.KERNEL_PREFIX}", text)
            counts[stages] = profile_t0.static_counts(profile_t0.mosaic_module_text(text))
        # K = V = 64, k steps of 16: K S 4 (v_new adds hi X and lo X, 4 + 4); state adds
        # K^T v_new (4); full adds Q S (4), Q K^T (4) and P v_new (4).
        self.assertEqual([counts[s]["wgmma"] for s in ("io", "v_new", "state", "full", "nobar")],
                         [0, 12, 16, 28, 28])
        self.assertEqual({c["tma_load"] for c in counts.values()}, {33})  # 11 copies x 3
        self.assertEqual(counts["full"]["fence_proxy"] - counts["io"]["fence_proxy"], 3)
        self.assertLess(counts["nobar"]["bar_sync"], counts["full"]["bar_sync"] - 30)
        self.assertLess(counts["io"]["ops"], counts["v_new"]["ops"])
        self.assertLess(counts["v_new"]["ops"], counts["state"]["ops"])
        self.assertLess(counts["state"]["ops"], counts["full"]["ops"])

    def test_static_counts_of_the_lowered_split_stages(self):
        import jax
        import jax.numpy as jnp
        from benchmarks import profile_t0
        qk = jnp.zeros((1, 128, 1, 64), jnp.bfloat16)
        vt = jnp.zeros((1, 128, 2, 64), jnp.bfloat16)  # v and T0 (K = V = 64)
        args = [qk, qk, vt, vt] + [jnp.zeros((1, 128, 2), jnp.float32)] * 2 + [None]
        split = profile_fwd.parse_split("state_ag", 3)
        counts = {}
        for stages in ("io", "state", "readout", "full", "nobar"):
            text = jax.export.export(profile_fwd._kernel_fn(stages, 0.1, False, split),
                                     platforms=["cuda"])(*args).mlir_module()
            self.assertIn(profile_fwd.kernel_name(stages, split), text)
            counts[stages] = profile_t0.static_counts(profile_t0.mosaic_module_text(text))
        # K = V = 64, k steps of 16: the state warpgroup's K S, Ag X and K^T v_new (4 each),
        # the output warpgroup's Q K^T, Q S and P v_new (4 each); io has none.
        self.assertEqual([counts[s]["wgmma"] for s in ("io", "state", "readout", "full",
                                                       "nobar")], [0, 12, 12, 24, 24])
        self.assertEqual([counts[s]["wgmma_wait"] for s in ("io", "state", "readout", "full")],
                         [0, 3, 3, 6])
        self.assertEqual({c["tma_load"] for c in counts.values()}, {33})  # the same copies
        self.assertLess(counts["nobar"]["bar_sync"], counts["full"]["bar_sync"] - 30)
        self.assertLess(counts["io"]["ops"], counts["readout"]["ops"])
        self.assertLess(counts["state"]["ops"], counts["full"]["ops"])
        self.assertLess(counts["readout"]["ops"], counts["full"]["ops"])

    def test_deadline_watchdog_keeps_the_table(self):
        out = self.create_tempdir().full_path + "/fwd"
        cmd = [sys.executable, "benchmarks/profile_fwd.py", "--interpret", "--batch=1",
               "--seq_len=64", "--heads=1", "--kv_heads=1", "--dk=64", "--dv=64", "--iters=1",
               "--variants=full", "--deadline_s=0.01", f"--out={out}"]
        result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                                env={**os.environ, "JAX_PLATFORMS": "cpu"})
        self.assertEqual(result.returncode, profile_fwd.DEADLINE_EXIT, result.stderr[-2000:])
        with open(out + ".md") as f:
            self.assertIn("| variant | fused kernel ms |", f.read())

    def test_bad_variant_is_one_usage_line(self):
        result = binary_runs.run([sys.executable, "benchmarks/profile_fwd.py", "--out=/tmp/x",
                                 "--variants=gram"])
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("'gram': not in", result.stderr)
        self.assertNotIn("Traceback", result.stderr)

    def test_bad_split_flags_are_one_usage_line(self):
        # one process (the other refusals: test_parse_split_and_its_variants)
        result = binary_runs.run([sys.executable, "benchmarks/profile_fwd.py", "--out=/tmp/x",
                                  "--split_order=readout_first", "--variants=state"])
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("needs --split_order=state_ag", result.stderr)
        self.assertNotIn("Traceback", result.stderr)


@pytest.mark.slow
class ProfileFwdInterpretTest(absltest.TestCase):
    """Interpreted runs of the binary, two warpgroups and split (60 to 100 s each on 2 shared
    cores, ``PJRT_NPROC=8``)."""

    def test_interpreted_run_writes_records_and_checks_full(self):
        out = self.create_tempdir().full_path + "/fwd"
        cmd = [sys.executable, "benchmarks/profile_fwd.py", "--interpret", "--batch=1",
               "--seq_len=150", "--heads=2", "--kv_heads=1", "--dk=64", "--dv=64",
               "--doc_len=70", "--iters=1", "--variants=io,state,full", f"--out={out}"]
        result = binary_runs.run(cmd, env={**os.environ, "JAX_PLATFORMS": "cpu"})
        self.assertEqual(result.returncode, 0, result.stderr[-2000:])
        with open(out + ".jsonl") as f:
            recs = [json.loads(line) for line in f]
        self.assertEqual([r["variant"] for r in recs], ["io", "state", "full"])
        self.assertLess(recs[2]["rel_rms"], 5e-3)  # the bf16 forward gate
        self.assertNotIn("rel_rms", recs[0])
        with open(out + ".md") as f:
            self.assertIn("| full |", f.read())

    def test_interpreted_split_run_writes_records_and_checks_full(self):
        out = self.create_tempdir().full_path + "/split"
        cmd = [sys.executable, "benchmarks/profile_fwd.py", "--interpret", "--batch=1",
               "--seq_len=150", "--heads=2", "--kv_heads=1", "--dk=64", "--dv=64",
               "--doc_len=70", "--iters=1", "--split_order=state_ag", "--split_stages=3",
               "--variants=io,readout,full", f"--out={out}"]
        result = binary_runs.run(cmd, env={**os.environ, "JAX_PLATFORMS": "cpu"})
        self.assertEqual(result.returncode, 0, result.stderr[-2000:])
        with open(out + ".jsonl") as f:
            recs = [json.loads(line) for line in f]
        self.assertEqual([r["variant"] for r in recs], ["io", "readout", "full"])
        self.assertEqual([r["kernel"] for r in recs],
                         ["gdn_chunk_delta_fused_t0_fwd_split_sa_s3_abl_io",
                          "gdn_chunk_delta_fused_t0_fwd_split_sa_s3_abl_readout",
                          "gdn_chunk_delta_fused_t0_fwd_split_sa_s3"])
        self.assertEqual({(r["split_order"], r["split_stages"]) for r in recs},
                         {("state_ag", 3)})
        self.assertLess(recs[2]["rel_rms"], 5e-3)  # the bf16 forward gate
        self.assertNotIn("rel_rms", recs[1])
        with open(out + ".md") as f:
            text = f.read()
        self.assertIn("three warpgroups (split_order=state_ag, split_stages=3", text)
        self.assertIn("| readout |", text)


if __name__ == "__main__":
    absltest.main()
