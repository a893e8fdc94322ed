"""benchmarks/offline_ptxas_jax011.py: the textual rewrites of jax 0.11's Mosaic GPU modules for
numba-cuda-mlir 0.6.0's parser (MOSAIC_GPU.md Sec. 24.2), on lines as jaxlib 0.11.2 prints
them in generic op form."""

from absl.testing import absltest

from benchmarks import offline_ptxas_jax011 as wrapper

BEFORE = """\
    %2 = "builtin.unrealized_conversion_cast"(%1) {layout = #mosaic_gpu.WGSplatFragLayout\
<[64, 16]>} : (i32) -> vector<64x16xi32>
    %3 = "builtin.unrealized_conversion_cast"(%v) {transforms = [#mosaic_gpu.tile<[8, 64]>, \
#mosaic_gpu.swizzle<128 : i32>]} : (memref<8x64xbf16>) -> memref<64x64xbf16>
    %4 = "builtin.unrealized_conversion_cast"(%w) : (memref<1xi64>) -> \
memref<1x!mosaic_gpu.barrier>
    %5 = "gpu.thread_id"() <{dimension = #gpu.dim<x>}> : () -> index
    %6 = "nvvm.shfl.sync"(%a, %b, %c, %d) <{kind = #nvvm.shfl_kind<bfly>}> : (i32, i32, i32, \
i32) -> i32
    "gpu.barrier"() <{scope = #gpu.barrier_scope<workgroup>}> : () -> ()
    "gpu.launch"(%g, %g, %g, %t, %t, %t, %s) <{operandSegmentSizes = array<i32: 0, 1, 1, 1, 1, \
1, 1, 0, 0, 0, 1, 0>}> ({
"""

AFTER = """\
    %2 = "builtin.unrealized_conversion_cast"(%1) : (i32) -> vector<64x16xi32>
    %3 = "builtin.unrealized_conversion_cast"(%v) : (memref<8x64xbf16>) -> memref<64x64xbf16>
    %4 = "builtin.unrealized_conversion_cast"(%w) : (memref<1xi64>) -> memref<1xi64>
    %5 = "gpu.thread_id"() <{dimension = #gpu<dim x>}> : () -> index
    %6 = "nvvm.shfl.sync"(%a, %b, %c, %d) <{kind = #nvvm<shfl_kind bfly>}> : (i32, i32, i32, \
i32) -> i32
    "gpu.barrier"() : () -> ()
    "gpu.launch"(%g, %g, %g, %t, %t, %t, %s) <{operandSegmentSizes = array<i32: 0, 1, 1, 1, 1, \
1, 1, 0, 0, 0, 1>}> ({
"""


class RewriteTest(absltest.TestCase):

    def test_rewrites_each_construct(self):
        self.assertEqual(wrapper.rewrite_for_upstream(BEFORE), AFTER)

    def test_leaves_upstream_text_alone(self):
        self.assertEqual(wrapper.rewrite_for_upstream(AFTER), AFTER)

    def test_captured_modules_are_taken_once(self):
        wrapper._CAPTURED.extend(["a #gpu.dim<y>", "b"])
        self.assertEqual(wrapper.captured_modules("ignored"), ["a #gpu<dim y>", "b"])
        self.assertEqual(wrapper.captured_modules("ignored"), [])


if __name__ == "__main__":
    absltest.main()
