"""benchmarks/diag_grad.py (MOSAIC_GPU.md Sec. 41): the probes, the routes, the float64
references with a pair mask, where an error is and which route explains it, the flag refusals,
and (slow) one interpreted run of the binary: the same code path as on the GPU."""

import json
import os
import sys

import numpy as np
import pytest
from absl.testing import absltest

from benchmarks import diag_grad, profile_grad
from tests import binary_runs

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SHAPES = dict(tk=(1, 128, 2, 16), tv=(1, 128, 2, 64), ks=(1, 128, 2, 1), hs=(1, 2, 2, 16, 64))


class DiagGradTest(absltest.TestCase):

    def test_routes_partition_the_causal_pairs(self):
        masks = diag_grad.route_masks()
        i, j = np.indices((64, 64))
        np.testing.assert_array_equal(sum(masks.values()), (j <= i) * 1.0)
        self.assertEqual(masks["band"][10, 3], 1.0)  # 7 apart, same block
        self.assertEqual(masks["past"][16, 8], 1.0)  # 8 apart, other block
        self.assertEqual(masks["quad"][15, 7], 1.0)  # 8 apart, same block
        self.assertEqual(masks["band"][16, 9], 1.0)  # 7 apart across a block edge

    def test_route_probe_puts_dm_on_its_pairs_only(self):
        for name in diag_grad.ROUTE_PROBES:
            q, k, kr, ks, gamma, hs, dhs, do, vn, dr = diag_grad.make_probe(name, SHAPES)
            chunk = slice(64, 128)  # the second chunk of batch row 0, head 1
            dm = do[0, chunk, 1] @ vn[0, chunk, 1].T
            np.testing.assert_array_equal(dm, do[0, chunk, 1, :64])
            route = diag_grad.route_masks()[name.rstrip("0")]
            np.testing.assert_array_equal(dm != 0, route != 0)
            self.assertEqual(np.any(gamma), not name.endswith("0"))
            self.assertFalse(np.any(hs) or np.any(dhs))
            np.testing.assert_allclose(kr, k * ks)
            self.assertTrue(np.all(np.diff(gamma[0, :64], axis=0) <= 0))
        _, _, _, _, gamma, *_ = diag_grad.make_probe("nodecay", SHAPES)
        self.assertFalse(np.any(gamma))
        self.assertFalse(np.any(diag_grad.make_probe("dmq", SHAPES)[-1]))
        self.assertFalse(np.any(diag_grad.make_probe("state", SHAPES)[8]))
        with self.assertRaisesRegex(ValueError, "probe 'x'"):
            diag_grad.make_probe("x", SHAPES)

    def test_route_shares_add_up_and_a_missing_route_is_named(self):
        host = diag_grad.make_probe("random", SHAPES)
        full = diag_grad.reference(host, 0.25)
        zero = diag_grad.reference(host, 0.25, np.zeros((64, 64)))
        shares = {r: diag_grad.reference(host, 0.25, m)
                  for r, m in diag_grad.route_masks().items()}
        for name in ("dq", "dk", "dks", "dg", "dk_m"):
            total = zero[name] + sum(s[name] - zero[name] for s in shares.values())
            np.testing.assert_allclose(total, full[name], rtol=1e-9, atol=1e-9)
        one = profile_grad.grad_float64(*(x[0] for x in host), scale=0.25, heads=2)
        np.testing.assert_array_equal(one["dg"], full["dg"][0])
        share = {r: s["dq_m"] - zero["dq_m"] for r, s in shares.items()}
        got = full["dq_m"] - share["quad"]
        self.assertRegex(diag_grad.explain(got, full["dq_m"], share), r"^quad missing \(")
        got = full["dq_m"] + share["past"]
        self.assertRegex(diag_grad.explain(got, full["dq_m"], share), r"^past doubled")
        self.assertEqual(diag_grad.explain(full["dq_m"] * 1.3, full["dq_m"], share), "")

    def test_locate_finds_rows_channels_and_non_finite(self):
        want = np.ones((2, 128, 2, 32))
        got = want.copy()
        got[1, 64 + 9, 0, 20] = np.inf
        got[:, 8:16, :, 16:] += 1.0  # rows 8-15 of chunk 0, channel group 1
        loc = diag_grad.locate(got, want, 1e-2)
        self.assertEqual(loc["rows_over_tol"], "8-15")
        self.assertEqual(loc["worst"][:4], [1, 73, 0, 20])
        self.assertGreater(loc["by_col16"][1], 1e20)
        self.assertLess(loc["by_col16"][0], 1e-2 * loc["by_col16"][1])
        self.assertEqual(len(loc["by_row16"]), 16)
        self.assertEqual(diag_grad._ranges([0, 1, 2, 5, 7, 8]), "0-2,5,7-8")

    def test_selected_and_refusals(self):
        runs, probes = diag_grad.selected(["k1", "k2:no_band"], ["16", "32"], ["band", "past"])
        self.assertEqual([r[0] for r in runs], ["k1@16", "k1@32", "k2:no_band@16",
                                                "k2:no_band@32"])
        self.assertEqual(probes, ["band", "past"])
        runs, probes = diag_grad.selected(list(diag_grad.DEFAULT_VARIANTS), ["16", "32"],
                                          list(diag_grad.PROBES))
        self.assertLen(runs, 16)
        self.assertIn(("k1:tap_band@32", "k1", ("tap_band",), 32), runs)
        for variants, slabs, probes, msg in ((["k1:no_mma"], ["16"], ["band"], "reference"),
                                             (["k2:tap_band"], ["16"], ["band"], "K1's"),
                                             (["k1:tap_band", "k1:tap_band"], ["16"], ["band"],
                                              "twice"),
                                             (["k1"], ["24"], ["band"], "not one of"),
                                             (["k1"], ["16"], ["bandx"], "--probes entry"),
                                             (["k1"], ["16"], ["band", "band"], "each probe")):
            with self.assertRaisesRegex(profile_grad.VariantError, msg):
                diag_grad.selected(variants, slabs, probes)

    def test_tap_references_follow_the_kernel_equations(self):
        host = diag_grad.make_probe("kda", SHAPES)
        k, gamma = host[1], host[4]
        got = diag_grad.tap_reference("tap_inputs", host, 0.25)
        np.testing.assert_array_equal(got["k"], k)
        np.testing.assert_array_equal(got["r_end"][0, 64 + 16:64 + 32], np.broadcast_to(
            gamma[0, 64 + 31], (16, 2, 16)))  # block 1 of chunk 1: gamma at its row 31
        f = diag_grad.tap_reference("tap_factors", host, 0.25)
        i, c = 64 + 40, 3  # chunk 1, block 2, second half; head 0
        g = gamma[0, 64:128, 0, c]
        self.assertAlmostEqual(f["to_end"][0, i, 0, c], np.exp(g[47] - g[40]))
        self.assertAlmostEqual(f["halfway"][0, i, 0, c], np.exp(g[40] - g[39]))
        self.assertAlmostEqual(f["past"][0, i, 0, c],
                               np.exp(g[40] - g[15]) + np.exp(g[40] - g[31]))
        for name in ("to_end", "halfway", "past"):
            self.assertLessEqual(np.max(f[name]), 3.0 + 1e-12)  # every exponent <= 0
        band = diag_grad.tap_reference("tap_band", host, 0.25)
        do, vn = host[7][0, 64:128, 1], host[8][0, 64:128, 1]
        dmq = 0.25 * np.tril(do @ vn.T)
        r = 20
        want = sum(dmq[r, r - d] - dmq[r + d, r] for d in range(1, 8))
        self.assertAlmostEqual(band["coef"][0, 64 + r, 1, 5], want)
        self.assertAlmostEqual(band["k_shift"][0, 64 + 3, 1, 5], sum(k[0, 64:67, 1, 5]))
        kk = diag_grad.tap_reference("tap_band", host, 0.25)["band_exp"][0, 64 + 2, 1, 5]
        g = gamma[0, 64:128, 1, 5]
        self.assertAlmostEqual(kk, np.exp(g[2] - g[1]) + np.exp(g[2] - g[0]))

    def test_tap_dm_reference_is_phase_one_copies(self):
        host = diag_grad.make_probe("random", SHAPES)
        dm = diag_grad.tap_reference("tap_dm", host, 0.25)
        do, vn = host[7][0, 64:128, 1], host[8][0, 64:128, 1]
        dmq = 0.25 * np.tril(do @ vn.T)
        i, j = 40, 3  # 37 apart: band-free, not a quadrant pair
        self.assertAlmostEqual(dm["free_q"][0, 64 + i, 1, j], dmq[i, j], delta=1e-2 * abs(
            dmq[i, j]))  # bf16 rounding
        self.assertEqual(dm["quad_q"][0, 64 + i, 1, j], 0.0)
        self.assertEqual(dm["free_q"][0, 64 + 10, 1, 4], 0.0)  # the band is zeroed
        self.assertNotEqual(dm["quad_q"][0, 64 + 12, 1, 3], 0.0)  # a quadrant pair
        self.assertEqual(dm["free_k"][0, 64 + 3, 1, 3], 0.0)

    def test_taps_export_for_cuda_and_run_alone(self):
        import jax
        import jax.numpy as jnp
        from pallas_kernels.common import channelwise_grad_mosaic_gpu as cgm
        spec = jax.ShapeDtypeStruct
        tk, tv = spec((1, 64, 1, 128), jnp.bfloat16), spec((1, 64, 1, 128), jnp.bfloat16)
        args = (tk, tk, tk, spec((1, 64, 1, 128), jnp.float32), tv, tv, tv)
        self.assertEqual(cgm.K1_TAPS, tuple(diag_grad.TAP_OUTPUTS))
        for tap in cgm.K1_TAPS:
            fn = jax.jit(lambda *a, tap=tap: cgm.channelwise_grad_intra_mosaic(
                *a, scale=0.1, slab=16, ablations=(tap,)))
            text = jax.export.export(fn, platforms=["cuda"])(*args).mlir_module()
            self.assertIn(f"channelwise_grad_intra_mosaic_abl_{tap}", text)
        with self.assertRaisesRegex(ValueError, "tap runs alone"):
            cgm.channelwise_grad_intra_mosaic(*(jnp.zeros(a.shape, a.dtype) for a in args),
                                              scale=0.1, ablations=("tap_band", "no_band"))
        with self.assertRaisesRegex(ValueError, "not in"):
            cgm.channelwise_grad_chunk_mosaic(
                *(jnp.zeros(a.shape, a.dtype) for a in args[:2]), jnp.zeros((1, 64, 1, 1)),
                jnp.zeros((1, 64, 1, 128)), *(jnp.zeros((1, 1, 1, 128, 128), jnp.bfloat16),) * 2,
                *(jnp.zeros(a.shape, a.dtype) for a in args[4:]), scale=0.1,
                ablations=("tap_band",))

    @pytest.mark.slow  # Mosaic GPU interpret mode, about 30 s on 2 cores
    def test_interpreted_run_of_the_binary(self):
        out = os.path.join(self.create_tempdir().full_path, "d")
        env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, PJRT_NPROC="8")
        cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "diag_grad.py"), "--interpret",
               "--batch=1", "--seq_len=64", "--heads=1", "--dk=64", "--dv=64",
               "--probes=random,quad,state", "--variants=k1,k2:no_band,k1:tap_factors",
               "--slabs=16",
               f"--out={out}"]
        res = binary_runs.run(cmd, env=env)
        self.assertEqual(res.returncode, 0, res.stderr[-3000:])
        recs = [json.loads(x) for x in open(out + ".jsonl")]
        self.assertEqual([(r["variant"], r["probe"], r["status"]) for r in recs],
                         [(v, p, "PASS") for v in ("k1", "k2:no_band", "k1:tap_factors")
                          for p in ("random", "quad", "state")])
        self.assertIn("diag k2:no_band quad PASS dq", res.stdout)
        self.assertTrue(recs[2]["outputs"]["dq"]["absolute"])  # K1 on "state": reference 0


if __name__ == "__main__":
    absltest.main()
