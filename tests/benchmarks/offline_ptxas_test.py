"""benchmarks/offline_ptxas.py: ptxas log parsing, the SMEM look-up, the kernel list, the
Mosaic modules read back from an export, and (only where the toolchain is installed under
``$OFFLINE_PTXAS_SITE``, default /tmp/ptx-site) one kernel compiled end to end."""

import os
import unittest

import jax
from absl.testing import absltest

from benchmarks import offline_ptxas

LOG = """ptxas info    : 0 bytes gmem
ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are \
serialized due to non wgmma instructions reading accumulator registers of  a wgmma between \
start and end of the pipeline stage in the function 'big_kernel'
ptxas warning : Registers are spilled to local memory in function 'big_kernel', 92 bytes \
spill stores, 96 bytes spill loads
ptxas info    : Compiling entry function 'big_kernel' for 'sm_90a'
ptxas info    : Function properties for big_kernel
    96 bytes stack frame, 92 bytes spill stores, 96 bytes spill loads
ptxas info    : Used 255 registers, used 2 barriers, 96 bytes cumulative stack size, 1 bytes smem
ptxas info    : Compile time = 278.714 ms
ptxas info    : Compiling entry function 'small_kernel' for 'sm_90a'
ptxas info    : Function properties for small_kernel
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 45 registers, used 2 barriers, 1 bytes smem
"""


# jaxlib 0.11 cannot parse the serialized Mosaic GPU module back in Python ("#gpu<dim x>":
# expected '<'): offline_ptxas.py reads modules from jax 0.10's exports only, and
# benchmarks/offline_ptxas_jax011.py takes them before serialization on 0.11 (its own tests).
_READS_MODULES = unittest.skipIf(
    jax.__version_info__ >= (0, 11),
    "offline_ptxas.py reads exported Mosaic GPU modules back, which jaxlib 0.11 cannot parse "
    "(offline_ptxas_jax011.py is the 0.11 path)")


class OfflinePtxasTest(absltest.TestCase):

    def test_parse_ptxas(self):
        big, small = offline_ptxas.parse_ptxas(LOG)
        self.assertEqual(big, dict(kernel="big_kernel", regs=255, stack=96, spill_st=92,
                                   spill_ld=96, smem_static=1, c7514=True))
        self.assertEqual(small, dict(kernel="small_kernel", regs=45, stack=0, spill_st=0,
                                     spill_ld=0, smem_static=1, c7514=False))
        # A log cut mid-compile (a stopped process's), other text between ptxas's lines.
        cut = offline_ptxas.parse_ptxas("PASSED\n" + LOG.split("ptxas info    : Used 255")[0])
        self.assertEqual([(r["kernel"], r["regs"], r["spill_st"], r["spill_ld"]) for r in cut],
                         [("big_kernel", None, 92, 96)])

    def test_advisories(self):
        log = LOG + ("ptxas info    : (C7519) warpgroup.arrive is injected in around line 9 by "
                     "compiler to allow use of registers in GMMA in function 'small_kernel'\n"
                     "ptxas info    : (C7519) warpgroup.arrive is injected in around line 12 by "
                     "compiler to allow use of registers in GMMA in function 'small_kernel'\n")
        got = offline_ptxas.advisories(log)
        self.assertEqual(got, dict(big_kernel=dict(C7514=1), small_kernel=dict(C7519=2)))
        rec = dict(kernel="small_kernel", regs=45, spill_st=0, spill_ld=0, stack=0,
                   advisories=got["small_kernel"], threads=384, setmaxnreg=["dec 40"])
        row = offline_ptxas.render_row("state_fwd", rec, 1024)
        self.assertIn("C7519 x2; setmaxnreg dec 40", row)
        self.assertIn(" 384 ", row)

    def test_dynamic_smem(self):
        text = ("%c85008_i32 = arith.constant 85008 : i32\n"
                "%1 = gpu.launch async [%0] blocks(%a, %b, %c) in (%d = %c8) threads(%e) in "
                "(%f = %c128) dynamic_shared_memory_size %c85008_i32 {\n")
        self.assertEqual(offline_ptxas.dynamic_smem(text), 85008)
        self.assertIsNone(offline_ptxas.dynamic_smem("func.func @f() {}"))

    def test_expand_kernels(self):
        got = offline_ptxas.expand_kernels(["k1:16", "t0"])
        self.assertEqual(got[0], "k1:16")
        self.assertEqual(got[1:], [f"t0:{v}" for v in offline_ptxas.H200_T0])
        self.assertLen(got, 10)

    def test_row_names_h200_figures(self):
        rec = dict(kernel="k", regs=37, spill_st=0, spill_ld=0, stack=0, c7514=False)
        self.assertIn("H200 12-04c: 45 regs", offline_ptxas.render_row("t0:io:doubling", rec,
                                                                       85008))
        self.assertNotIn("H200", offline_ptxas.render_row("k1:16", rec, None))

    @_READS_MODULES
    def test_mosaic_modules_of_an_export(self):
        # The T0 io stage (the smallest kernel): one deserialized module, plain Mosaic GPU ops
        # (no stable_mosaic_gpu.* serialization names), Sec. 14's SMEM.
        (text,) = offline_ptxas.kernel_modules("t0:io:doubling")
        self.assertIn("gpu.launch", text)
        self.assertNotIn("stable_mosaic_gpu", text)
        self.assertEqual(offline_ptxas.dynamic_smem(text), 85008)

    def test_all_and_op_entries(self):
        got = offline_ptxas.expand_kernels(["all"])
        self.assertEqual(got, list(offline_ptxas.ALL_KERNELS))
        for name in got:  # every op entry of "all" parses
            if name.split(":")[0] in offline_ptxas.OP_KERNELS:
                offline_ptxas.parse_op_entry(name)
        op, forward, patterns, options = offline_ptxas.parse_op_entry(
            "gdn_fused_t0_split:prepare_mid:s3:infer")
        self.assertEqual((op, forward), ("gdn", "fused_t0_split"))
        self.assertEqual(options, dict(infer=True, nog=False, split=dict(
            split_order="prepare_mid", split_stages=3)))
        self.assertTrue(offline_ptxas._matches("gdn_chunk_delta_fused_t0_fwd_split_pm_s3",
                                               patterns))
        self.assertFalse(offline_ptxas._matches("gdn_chunk_delta_fused_t0_fwd", patterns))
        _, _, patterns, options = offline_ptxas.parse_op_entry(
            "gdn_fused_t0_split:state_ag:vk:infer")  # MOSAIC_GPU.md Sec. 35
        self.assertEqual(options["split"], dict(split_order="state_ag", state_layout="vk"))
        self.assertTrue(offline_ptxas._matches("gdn_chunk_delta_fused_t0_fwd_split_sa_vk",
                                               patterns))
        _, _, patterns, options = offline_ptxas.parse_op_entry(
            "gdn_fused_t0_split:state_ag:s3:es")  # MOSAIC_GPU.md Sec. 40
        self.assertEqual(options["split"], dict(split_order="state_ag", split_stages=3,
                                                split_protocol="early_s"))
        self.assertTrue(offline_ptxas._matches("gdn_chunk_delta_fused_t0_fwd_split_sa_s3_es",
                                               patterns))
        with self.assertRaisesRegex(ValueError, "unknown option"):
            offline_ptxas.parse_op_entry("gdn_fused_t0:es")
        with self.assertRaisesRegex(ValueError, "unknown option"):
            offline_ptxas.parse_op_entry("gdn_wy:s3")
        with self.assertRaisesRegex(ValueError, "unknown option"):
            offline_ptxas.parse_op_entry("gdn_fused_t0:vk")
        with self.assertRaisesRegex(ValueError, "no inference form"):
            offline_ptxas.parse_op_entry("gdn_bwd_dh:infer")
        with self.assertRaisesRegex(ValueError, "unknown kernel"):
            offline_ptxas.entry_modules("gdn_nothing")

    def test_module_facts(self):
        text = ("%c384 = arith.constant 384 : index\n%c1 = arith.constant 1 : index\n"
                "func.func @gdn_chunk_wy_mosaic_gpu(%arg0: i32) {\n"
                "%1 = gpu.launch async [%0] blocks(%a, %b, %c) in (%d = %c8, %e = %c1, %f = %c1) "
                "threads(%g, %h, %i) in (%j = %c384, %k = %c1, %l = %c1) "
                "dynamic_shared_memory_size %c9_i32 {\n")
        self.assertEqual(offline_ptxas.module_kernel_name(text), "gdn_chunk_wy")
        self.assertEqual(offline_ptxas.launch_threads(text), 384)
        ptx = ("\tsetmaxnreg.dec.sync.aligned.u32 40;\n\tsetmaxnreg.inc.sync.aligned.u32 232;\n"
               "\tsetmaxnreg.inc.sync.aligned.u32 232;\n")
        self.assertEqual(offline_ptxas.setmaxnreg(ptx), ["dec 40", "inc 232"])
        self.assertEqual(offline_ptxas.h200_note("gdn_t0:infer", 8, 4096, 16, 128, 128),
                         "H200 12-04d: 225 regs, 0 B spill st")
        self.assertEqual(offline_ptxas.h200_note("gdn_t0:infer", 8, 4096, 16, 64, 64), "")
        # the training step's T0 kernel forms W too (MOSAIC_GPU.md Sec. 36): no H200 figure
        self.assertEqual(offline_ptxas.h200_note("gdn_t0", 8, 4096, 16, 128, 128), "")

    @_READS_MODULES
    def test_op_export_and_entries(self):
        # The GDN training step (three_pass, the default backward "fused_ws" with dv_local
        # "fold") through gated_delta_rule_mosaic: six Mosaic GPU modules, one per kernel; an
        # entry picks its own (the split backward's stage-3 / stage-4 entries export with
        # backward="split", the separate dv_local's with dv_local="separate"), the two-kernel
        # GLA entry labels both.
        shape = dict(batch=1, seq_len=128, heads=2)
        texts = offline_ptxas.op_export("gdn", "three_pass", **shape)
        self.assertEqual(sorted(map(offline_ptxas.module_kernel_name, texts)), [
            "gdn_chunk_bwd_fused_ws", "gdn_chunk_delta_dh_fold", "gdn_chunk_delta_h",
            "gdn_chunk_kkt_inverse_subst_split", "gdn_chunk_wy", "simple_gla_chunk_output"])
        texts = offline_ptxas.op_export("gdn", "three_pass", dv_local="separate", **shape)
        for entry, kernel in (("gdn_bwd_grads", "gdn_chunk_grads"),
                              ("gdn_wy_bwd", "gdn_chunk_wy_bwd")):
            ((label, text),) = offline_ptxas.entry_modules(entry, **shape)
            self.assertEqual((label, offline_ptxas.module_kernel_name(text)), (entry, kernel))
        ((label, text),) = offline_ptxas.entry_modules("gdn_bwd_dv_local", **shape)
        self.assertEqual(label, "gdn_bwd_dv_local")
        self.assertIn(text, texts)
        self.assertEqual(offline_ptxas.launch_threads(text), 128)
        labels = [lab for lab, _ in offline_ptxas.entry_modules("gla_bwd", **shape)]
        self.assertEqual(labels, ["gla_bwd.dstates", "gla_bwd.grads"])

    @_READS_MODULES
    def test_fused_backward_entry(self):
        # gdn_bwd_fused exports the op with backward="fused" (OP_BACKWARDS): its kernel, no
        # stage-3 / stage-4 kernels in that export.
        shape = dict(batch=1, seq_len=128, heads=2)
        ((label, text),) = offline_ptxas.entry_modules("gdn_bwd_fused", **shape)
        self.assertEqual((label, offline_ptxas.module_kernel_name(text)),
                         ("gdn_bwd_fused", "gdn_chunk_bwd_fused"))
        texts = offline_ptxas.op_export("gdn", "three_pass", backward="fused", **shape)
        names = set(map(offline_ptxas.module_kernel_name, texts))
        self.assertNotIn("gdn_chunk_wy_bwd", names)
        self.assertIn("gdn_chunk_kkt_inverse_subst_split", names)
        ((label, text),) = offline_ptxas.entry_modules("gdn_bwd_fused_ws", **shape)
        self.assertEqual(offline_ptxas.module_kernel_name(text), "gdn_chunk_bwd_fused_ws")
        self.assertEqual(offline_ptxas.launch_threads(text), 384)

    def test_unknown_kernel(self):
        with self.assertRaisesRegex(ValueError, "unknown kernel"):
            offline_ptxas.kernel_modules("k3")
        with self.assertRaisesRegex(ValueError, "slab"):
            offline_ptxas.kernel_modules("k1:8")
        with self.assertRaisesRegex(ValueError, "slab"):
            offline_ptxas.kernel_modules("k2:8")
        with self.assertRaisesRegex(ValueError, "only k1, k2 and gdn_wy_bwd"):
            offline_ptxas.kernel_modules("state_fwd+no_mma")

    @_READS_MODULES
    def test_gdn_wy_bwd_ablations(self):
        (text,) = offline_ptxas.kernel_modules("gdn_wy_bwd+no_split+no_exp", batch=1,
                                               seq_len=128, heads=1)
        self.assertEqual(offline_ptxas.module_kernel_name(text),
                         "gdn_chunk_wy_bwd_abl_no_exp_no_split")
        with self.assertRaisesRegex(ValueError, "alone"):
            offline_ptxas.kernel_modules("gdn_wy_bwd+io+no_mma", batch=1, seq_len=128, heads=1)

    def test_end_to_end_if_installed(self):
        site = os.environ.get("OFFLINE_PTXAS_SITE", "/tmp/ptx-site")
        try:
            cuda_root = offline_ptxas.find_cuda_root(site, None)
            offline_ptxas.load_mlir(site)
        except offline_ptxas.ToolchainError as e:
            self.skipTest(str(e))
        (text,) = offline_ptxas.kernel_modules("t0:io:doubling")
        (ptx,) = offline_ptxas.module_to_ptx(text, site, cuda_root)
        self.assertIn(".target sm_90a", ptx)
        path = self.create_tempfile("k.ptx").full_path
        (rec,), _ = offline_ptxas.run_ptxas(os.path.join(cuda_root, "bin", "ptxas"), ptx, path)
        self.assertEqual(rec["kernel"], "gdn_chunk_kkt_inverse_abl_io_mosaic_gpu_kernel")
        self.assertEqual(rec["spill_st"], 0)
        self.assertBetween(rec["regs"], 30, 60)  # 37 here (2026-12-05), 45 on the H200


if __name__ == "__main__":
    absltest.main()
