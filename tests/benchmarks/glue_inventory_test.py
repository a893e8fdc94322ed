"""benchmarks/glue_inventory.py: type parsing, source lines, KDA's step (``--op=kda``), and the
glue of ``gated_delta_rule_mosaic``'s training step (CUDA lowering on CPU, MOSAIC_GPU.md
Sec. 27): no XLA op outside the kernels touches a ``[B, T, H, K]`` tensor any more, with or
without documents;
with GVA at K = 64 the split backward leaves only the fp32 group sum of ``dk`` (and its one
rounding): ``dq``'s is formed in the chunk-local gradient kernel (``gva_loop``, Sec. 27.5); the
default backward (``fused_ws``) forms both in its kernel (Sec. 33) and leaves none."""

from absl.testing import absltest, parameterized

from benchmarks import glue_inventory as gi

# B 1, T 256, H 2, K = V = 64: a full-size bf16 tensor is 64 KiB; the gate vectors are 2 KiB.
_SHAPE = dict(batch=1, seq_len=256, heads=2, dim=64)
_FULL_BF16 = 256 * 2 * 64 * 2


class GlueInventoryTest(parameterized.TestCase):

    def test_tensor_bytes(self):
        self.assertEqual(gi.tensor_bytes("tensor<8x4096x16x128xbf16>"),
                         ((8, 4096, 16, 128), "bf16", 8 * 4096 * 16 * 128 * 2))
        self.assertEqual(gi.tensor_bytes("tensor<f32>"), ((), "f32", 4))
        self.assertIsNone(gi.tensor_bytes("!stablehlo.token"))

    def test_source_line_takes_the_innermost_repository_frame(self):
        loc = ('loc(callsite("/x/pallas_kernels/gated_delta_rule/mosaic_vjp.py":135:4 at '
               '"/x/pallas_kernels/common/mosaic_gpu_lib.py":20:1))')
        self.assertEqual(gi.source_line(loc), "pallas_kernels/gated_delta_rule/mosaic_vjp.py:135")
        self.assertEqual(gi.source_line('loc("q")'), "?")

    @parameterized.named_parameters(("plain", False), ("packed", True))
    def test_no_full_size_glue_without_gva(self, packed):
        text = gi.lowered_module(kv_heads=2, packed=packed, backward="split", **_SHAPE)
        self.assertEqual(text.count("custom_call @mosaic_gpu"), 6)
        rows = gi.inventory(text, _FULL_BF16)
        self.assertEqual([r for r in rows if not r["noop"]], [])
        # one shared gate cumsum (a reduce_window over [B, N, 64, H]) is left, and with
        # documents one scan of segment_ids for the shared [B, Tp] document vectors (they were
        # formed once per kernel wrapper: seven of each, when dv_local had a kernel of its own)
        # (jax 0.10 lowers a cumsum to reduce_window, jax 0.11 to chlo.scan)
        small = [r for r in gi.inventory(text, 1) if not r["noop"]]
        scans = [r for r in small if r["op"] in ("reduce_window", "chlo.scan")]
        self.assertEqual(sum(r["types"].startswith("1x4x64x2 ") for r in scans), 1)
        self.assertEqual(len(scans), 1 + packed, scans)

    def test_gva_keeps_only_dk_group_sum(self):
        text = gi.lowered_module(kv_heads=1, packed=False, backward="split", **_SHAPE)
        rows = [r for r in gi.inventory(text, _FULL_BF16 // 2) if not r["noop"]]
        self.assertEqual(sorted(r["op"] for r in rows), ["convert", "reduce"], rows)
        self.assertTrue(all(r["where"].startswith("chunk_wy_bwd_mosaic") for r in rows), rows)

    def test_default_backward_glue(self):
        # The default backward, "fused_ws" (MOSAIC_GPU.md Sec. 31.8) with dv_local "fold"
        # (Sec. 32.2: six kernels, dv_local formed in the reverse pass): no full-size glue without
        # GVA; with documents, the recomputed inverse's kernel wrapper scans segment_ids once
        # more (a [B, Tp] int32 vector, 2 KiB here). With GVA at K = 64 the fused kernel's GVA
        # loop (Sec. 33) writes dq and dk [B, T, Hk, K] in bf16 itself: no group sum (reduce)
        # and no rounding (convert) of a per-value-head tensor is left in XLA, with or without
        # documents, G = 2 or 4 (before Sec. 33: two fp32 [B, T, H, K] reduces and their two
        # converts from chunk_bwd_fused_mosaic).
        text = gi.lowered_module(kv_heads=2, packed=True, **_SHAPE)
        self.assertEqual(text.count("custom_call @mosaic_gpu"), 6)
        self.assertEqual([r for r in gi.inventory(text, _FULL_BF16) if not r["noop"]], [])
        small = [r for r in gi.inventory(text, 1) if not r["noop"]]
        scans = [r for r in small if r["op"] in ("reduce_window", "chlo.scan")]
        self.assertEqual(sum("chunk_kkt_inverse_mosaic" in r["where"] for r in scans), 1, scans)
        self.assertLen(scans, 3)
        for heads, kv_heads, packed in ((2, 1, False), (2, 1, True), (4, 1, False)):
            shape = dict(_SHAPE, heads=heads)
            gva = gi.lowered_module(kv_heads=kv_heads, packed=packed, **shape)
            self.assertEqual(gva.count("custom_call @mosaic_gpu"), 6)
            # no op of a quarter of a full-size [B, T, Hk, K] bf16 tensor or more ...
            rows = [r for r in gi.inventory(gva, _FULL_BF16 * heads // 8) if not r["noop"]]
            self.assertEqual(rows, [], (heads, kv_heads, packed))
            # ... and no reduce at all from the fused kernel's wrapper (its converts left are
            # the pads' scalars)
            small = [r for r in gi.inventory(gva, 1) if not r["noop"]]
            self.assertEqual([r for r in small if r["op"] == "reduce"
                              and r["where"].startswith("chunk_bwd_fused_mosaic")], [],
                             (heads, kv_heads, packed))

    @parameterized.named_parameters(("plain", False), ("packed", True))
    def test_fused_t0_step_has_no_xla_product(self, packed):
        # forward="fused_t0" (MOSAIC_GPU.md Sec. 36): the backward's W comes from the T0
        # kernel (return_w), so the step is four kernels and no XLA op touches a full-size
        # tensor; before, w_from_t0's fp32 dot_general (a cuBLAS GEMM on the GPU), its operand
        # conversions and transposes and the rounding of W were XLA's.
        text = gi.lowered_module(kv_heads=2, packed=packed, forward="fused_t0", **_SHAPE)
        self.assertEqual(text.count("custom_call @mosaic_gpu"), 4)
        self.assertEqual([r for r in gi.inventory(text, _FULL_BF16) if not r["noop"]], [])
        small = [r for r in gi.inventory(text, 1) if not r["noop"]]
        self.assertEqual([r for r in small if r["op"] == "dot_general"], [])
        # one shared gate cumsum and, with documents, one scan of segment_ids: the T0 kernel
        # and the fused T0 forward take the op's (they formed their own before Sec. 36)
        scans = [r for r in small if r["op"] in ("reduce_window", "chlo.scan")]
        self.assertLen(scans, 1 + packed, scans)

    def test_forward_flag_reaches_the_op(self):
        # main() passes --forward / --backward through (the printed table names the T0 kernel's
        # wrapper only for the fused_t0 forward's step)
        import contextlib
        import io
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            gi.main(["--shape=1x256x2", "--dim=64", "--min_mb=0", "--forward=fused_t0"])
        self.assertIn("chunk_delta_fused_t0_fwd_mosaic", out.getvalue())
        self.assertNotIn("dot_general", out.getvalue())


class KdaGlueTest(absltest.TestCase):

    def test_kda_step_with_k2_and_mosaic_state_passes(self):
        # --op=kda: KDA's fwd+bwd with K2 and the Mosaic state passes lowers, its kernels are
        # Mosaic custom calls, and the glue table is non-empty (the op's chain rule through the
        # gates and beta and the dv product stay in XLA: MOSAIC_GPU.md Sec. 43.3).
        text = gi.lowered_module_kda(packed=True, tuning={"grad_pass": "mosaic_fused",
                                                          "state_pass": "mosaic"}, **_SHAPE)
        self.assertGreaterEqual(text.count("custom_call @mosaic_gpu"), 3)
        ops = {r["op"] for r in gi.inventory(text, _FULL_BF16) if not r["noop"]}
        self.assertIn("dot_general", ops)


if __name__ == "__main__":
    absltest.main()
