"""``benchmarks/hlo_fusions.py``: the fusion lookup on hand-written optimized HLO text, and the
binary end to end on the CPU (the chunked peer, a small shape)."""

import os
import subprocess
import sys

from absl.testing import absltest

from benchmarks import hlo_fusions

_HLO = """HloModule jit_fwdbwd

%fused_computation.7 (param_0.1: bf16[2,64,4,128]) -> bf16[2,4,64,128] {
  %param_0.1 = bf16[2,64,4,128]{3,2,1,0} parameter(0)
  ROOT %transpose.3 = bf16[2,4,64,128]{3,2,1,0} transpose(%param_0.1), dimensions={0,2,1,3}, \
metadata={op_name="jit(fwdbwd)/transpose(jvp(f))/dvn" source_file="/x/channelwise_gpu.py" \
source_line=725}
}

%fused_computation.9 (param_0.2: f32[8]) -> f32[8] {
  %param_0.2 = f32[8]{0} parameter(0)
  ROOT %negate.1 = f32[8]{0} negate(%param_0.2)
}

ENTRY %main.5 (p: bf16[2,64,4,128], q: f32[8]) -> (bf16[2,4,64,128], f32[8]) {
  %p = bf16[2,64,4,128]{3,2,1,0} parameter(0)
  %q = f32[8]{0} parameter(1)
  %loop_transpose_fusion = bf16[2,4,64,128]{3,2,1,0} fusion(%p), kind=kLoop, \
calls=%fused_computation.7
  %loop_negate_fusion = f32[8]{0} fusion(%q), kind=kLoop, calls=%fused_computation.9
  ROOT %tuple = (bf16[2,4,64,128]{3,2,1,0}, f32[8]{0}) tuple(%loop_transpose_fusion, \
%loop_negate_fusion)
}
"""


class HloFusionsTest(absltest.TestCase):

    def test_finds_the_matching_fusion_and_its_computation(self):
        found = hlo_fusions.fusions(_HLO, "transpose")
        self.assertEqual(list(found), ["loop_transpose_fusion"])
        call, lines = found["loop_transpose_fusion"]
        self.assertIn("calls=%fused_computation.7", call)
        self.assertLen(lines, 2)
        self.assertIn("transpose(%param_0.1), dimensions={0,2,1,3}", lines[1])
        self.assertEqual(hlo_fusions._sources(lines),
                         ["channelwise_gpu.py:725  jit(fwdbwd)/transpose(jvp(f))/dvn"])
        self.assertEqual(sorted(hlo_fusions.fusions(_HLO, "fusion")),
                         ["loop_negate_fusion", "loop_transpose_fusion"])

    def test_binary_on_the_cpu(self):
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=root)
        out = subprocess.run(
            [sys.executable, os.path.join(root, "benchmarks", "hlo_fusions.py"), "--op=kda",
             "--peer=chunked", "--shape=1x128x2", "--names=transpose", "--max_lines=2"],
            capture_output=True, text=True, env=env, timeout=300, check=False)
        self.assertEqual(out.returncode, 0, out.stderr[-2000:])
        self.assertIn("kda chunked 1x128x2 fwdbwd on cpu", out.stdout)
        self.assertRegex(out.stdout, r"\n== \w*transpose\w*")


if __name__ == "__main__":
    absltest.main()
