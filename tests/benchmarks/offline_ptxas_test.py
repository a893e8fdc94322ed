"""benchmarks/offline_ptxas.py: ptxas log parsing, the SMEM look-up, the kernel list, the
Mosaic modules read back from an export, and (only where the toolchain is installed under
``$OFFLINE_PTXAS_SITE``, default /tmp/ptx-site) one kernel compiled end to end."""

import os

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


class OfflinePtxasTest(absltest.TestCase):

    def test_parse_ptxas(self):
        big, small = offline_ptxas.parse_ptxas(LOG)
        self.assertEqual(big, dict(kernel="big_kernel", regs=255, stack=96, spill_st=92,
                                   spill_ld=96, smem_static=1, c7514=True))
        self.assertEqual(small, dict(kernel="small_kernel", regs=45, stack=0, spill_st=0,
                                     spill_ld=0, smem_static=1, c7514=False))

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

    def test_mosaic_modules_of_an_export(self):
        # The T0 io stage (the smallest kernel): one deserialized module, plain Mosaic GPU ops
        # (no stable_mosaic_gpu.* serialization names), Sec. 14's SMEM.
        (text,) = offline_ptxas.kernel_modules("t0:io:doubling")
        self.assertIn("gpu.launch", text)
        self.assertNotIn("stable_mosaic_gpu", text)
        self.assertEqual(offline_ptxas.dynamic_smem(text), 85008)

    def test_unknown_kernel(self):
        with self.assertRaisesRegex(ValueError, "unknown kernel"):
            offline_ptxas.kernel_modules("k3")
        with self.assertRaisesRegex(ValueError, "slab"):
            offline_ptxas.kernel_modules("k1:8")
        with self.assertRaisesRegex(ValueError, "slab"):
            offline_ptxas.kernel_modules("k2:8")

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
