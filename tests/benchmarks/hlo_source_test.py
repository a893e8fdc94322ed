"""benchmarks/hlo_source.py: the optimized-HLO parser on a real CPU-compiled function (its
concatenate and reduction mapped to this file's lines) and on hand-written module text."""

import os

import jax
import jax.numpy as jnp
from absl.testing import absltest

from benchmarks import hlo_source

HERE = os.path.abspath(__file__)
REL = os.path.relpath(HERE, hlo_source.ROOT)


def _line_of(marker: str) -> int:
    """The line of this file that holds ``marker`` in a comment."""
    with open(HERE) as f:
        for i, line in enumerate(f, 1):
            if line.rstrip().endswith("# " + marker):
                return i
    raise AssertionError(marker)


def _inner(z):
    return jnp.sum(jnp.sin(z) * 3.0, axis=1)  # REDUCE


def _f(x, y):
    z = jnp.concatenate([x, y], axis=0)  # CONCAT
    return _inner(z), z.T @ z  # CALL


def _compiled_text():
    x, y = jnp.ones((8, 16), jnp.float32), jnp.ones((4, 16), jnp.float32)
    return jax.jit(_f).lower(x, y).compile().as_text()


HAND_WRITTEN = """HloModule jit_step, is_scheduled=true, entry_computation_layout={(f32[4]{0})->f32[8]{0}}

fused_computation.1 {
  param_0.1 = f32[4]{0} parameter(0)
  constant.2 = f32[] constant(2)
  broadcast.2 = f32[4]{0} broadcast(constant.2), dimensions={}
  ROOT multiply.3 = f32[4]{0} multiply(param_0.1, broadcast.2), metadata={op_name="jit(step)/jvp(mlp)/mul" source_file="/elsewhere/lattn_jax/layers.py" source_line=226}
}

%fused_computation.2 (param_0.2: f32[4]) -> f32[4] {
  %param_0.2 = f32[4]{0} parameter(0)
  ROOT %multiply.4 = f32[4]{0} multiply(%param_0.2, %param_0.2), metadata={op_name="jit(step)/a|b/mul" source_file="x.py" source_line=7}
}

ENTRY %main (p: f32[4]) -> f32[8] {
  %p = f32[4]{0} parameter(0), metadata={op_name="p"}
  %loop_multiply_fusion.44 = f32[4]{0} fusion(%p), kind=kLoop, calls=%fused_computation.1, metadata={op_name="jit(step)/jvp(mlp)/mul" source_file="/elsewhere/lattn_jax/layers.py" source_line=226}
  %loop_multiply_fusion.45 = f32[4]{0} fusion(%loop_multiply_fusion.44), kind=kLoop, calls=%fused_computation.1, metadata={op_name="jit(step)/jvp(mlp)/mul" source_file="/elsewhere/lattn_jax/layers.py" source_line=230 deduplicated_name="loop_multiply_fusion.44"}
  %fusion.9 = f32[4]{0} fusion(%loop_multiply_fusion.45), kind=kLoop, calls=%fused_computation.2
  ROOT %wrapped_concatenate.76 = f32[8]{0} concatenate(%fusion.9, %p), dimensions={0}, metadata={op_name="jit(step)/concatenate" source_file="/repo/lattn_jax/layers.py" source_line=12}
}
"""  # noqa: E501 (HLO lines)


class HloSourceTest(absltest.TestCase):

    def test_cpu_compiled_function_maps_to_its_lines(self):
        index = hlo_source.parse_hlo(_compiled_text())
        self.assertEqual(index.module, "jit__f")
        concat = [i for i in index.instructions.values() if i.opcode == "concatenate"]
        self.assertLen(concat, 1)
        self.assertEqual(index.source(concat[0]), f"{REL}:{_line_of('CONCAT')}")
        self.assertTrue(concat[0].op_name.endswith("concatenate"), concat[0].op_name)
        # The reduction is fused (with sin and mul) on the CPU: the fusion and its fused
        # instructions all come from _inner's line, and the fusion's kernel name finds it.
        reduce_line = f"{REL}:{_line_of('REDUCE')}"
        fusions = [i for i in index.instructions.values() if i.opcode == "fusion"
                   and any(f.opcode == "reduce" for f in index.fused_instructions(i.name))]
        self.assertLen(fusions, 1)
        attr = index.attribute(fusions[0].name)
        self.assertEqual(attr["source"], reduce_line)
        self.assertTrue(attr["op_name"].endswith("reduce_sum"), attr)
        self.assertEqual({s["source"] for s in attr["sources"]}, {reduce_line})
        self.assertGreaterEqual(sum(s["ops"] for s in attr["sources"]), 3)  # sin, mul, reduce
        self.assertEqual(index.kernel_instructions(hlo_source.sanitize(fusions[0].name)),
                         [fusions[0]])
        # The frames run innermost first: _inner's line, then _f's call of it.
        self.assertEqual(fusions[0].frames[0].function, "_inner")
        self.assertEqual([f.function for f in fusions[0].frames[:2]], ["_inner", "_f"])
        self.assertEqual(attr["callers"][0], f"{REL}:{_line_of('CALL')}")

    def test_hand_written_module(self):
        index = hlo_source.parse_hlo(HAND_WRITTEN, root="/repo")
        self.assertEqual(index.module, "jit_step")
        a = index.attribute("loop_multiply_fusion.44")
        self.assertEqual((a["opcode"], a["op_name"], a["source"]),
                         ("fusion", "jit(step)/jvp(mlp)/mul", "/elsewhere/lattn_jax/layers.py:226"))
        self.assertEqual(a["sources"], [dict(source="/elsewhere/lattn_jax/layers.py:226",
                                             op_name="jit(step)/jvp(mlp)/mul", ops=1)])
        self.assertEqual(index.attribute("wrapped_concatenate.76")["source"],
                         "lattn_jax/layers.py:12")  # under root: repo-relative
        # A fusion without metadata takes its fused root's.
        self.assertEqual(index.attribute("fusion.9")["source"], "x.py:7")
        self.assertEqual(index.attribute("fusion.9")["op_name"], "jit(step)/a|b/mul")
        # The reused kernel stands for both instructions (deduplicated_name), its own first.
        self.assertEqual([i.name for i in index.kernel_instructions("loop_multiply_fusion_44")],
                         ["loop_multiply_fusion.44", "loop_multiply_fusion.45"])
        self.assertEqual(index.kernel_instructions("nvjet_sm90_tst_128x160"), [])
        self.assertIsNone(index.attribute("no_such_op"))
        self.assertEqual(index.fused_instructions("no_such_op"), [])
        self.assertEqual(index.fused_instructions("p"), [])

    def test_stack_frame_tables(self):
        text = """HloModule m

FileNames
1 "/repo/lattn_jax/layers.py"
2 "/venv/lib/python3.12/site-packages/flax/linen/module.py"

FunctionNames
1 "__call__"
2 "_call_wrapped_method"

FileLocations
1 {file_name_id=1 function_name_id=1 line=226 end_line=226 column=8 end_column=30}
2 {file_name_id=2 function_name_id=2 line=1000 end_line=1000 column=1 end_column=2}

StackFrames
1 {file_location_id=1 parent_frame_id=1}
2 {file_location_id=2 parent_frame_id=2}


ENTRY %main (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  ROOT %sine.1 = f32[4]{0} sine(%p), metadata={op_name="jit(m)/sin" stack_frame_id=2}
}
"""
        index = hlo_source.parse_hlo(text, root="/repo")
        inst = index.instructions["sine.1"]
        self.assertEqual([f.line for f in inst.frames], [1000, 226])
        self.assertEqual(index.source(inst), "lattn_jax/layers.py:226")  # the repo's frame
        self.assertEqual(index.callers(inst), [])
        self.assertEqual(hlo_source.short_path(inst.frames[0].file, "/repo"),
                         "flax/linen/module.py")

    def test_helpers_and_errors(self):
        self.assertEqual(hlo_source.sanitize("loop_multiply_fusion.44"), "loop_multiply_fusion_44")
        self.assertEqual(hlo_source.sanitize("custom-call.3"), "custom_call_3")
        self.assertEqual(hlo_source.op_tail("jit(step)/jvp(f)/concatenate"),
                         "jvp(f)/concatenate")
        self.assertEqual(hlo_source.op_tail(""), "")
        self.assertEqual(len(hlo_source.parse_hlo("not hlo at all\n")), 0)
        with self.assertRaises(TypeError):
            hlo_source.parse_hlo(None)


if __name__ == "__main__":
    absltest.main()
