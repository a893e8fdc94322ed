"""benchmarks/profile_train_step.py: the kernel classes, the trace breakdown, a tiny CPU run."""

import os
from unittest import mock

import numpy as np
import pytest
from absl.testing import absltest

from benchmarks import hlo_source
from benchmarks import profile_train_step as pts


def _trace(kernels, args=None):
    """Chrome-trace events: a GPU process with a Stream thread and a CUPTI line, and a host;
    ``args[i]`` (a dict, if given) are the ``i``-th kernel's event args."""
    events = [dict(ph="M", name="process_name", pid=1, args=dict(name="/device:GPU:0")),
              dict(ph="M", name="thread_name", pid=1, tid=7, args=dict(name="Stream #13(...)")),
              dict(ph="M", name="thread_name", pid=1, tid=8, args=dict(name="CUPTI overhead")),
              dict(ph="M", name="process_name", pid=2, args=dict(name="/host:CPU")),
              dict(ph="X", pid=2, tid=1, name="gemm_on_host?", dur=5e4),
              dict(ph="X", pid=1, tid=8, name="cupti", dur=7e4)]
    kernels = [dict(ph="X", pid=1, tid=7, name=n, ts=1000.0 * i, dur=d)
               for i, (n, d) in enumerate(kernels)]
    for e, a in zip(kernels, args or ()):
        if a is not None:
            e["args"] = a
    return events + kernels


# The optimized HLO of a step (as Compiled.as_text() prints it): a loop fusion XLA emits once
# and reuses for an identical instruction, a concatenate, a cuBLAS custom call.
LAYERS = os.path.join(hlo_source.ROOT, "lattn_jax", "layers.py")
STEP_HLO = f"""HloModule jit_step, is_scheduled=true

%fused_computation.1 (param_0.1: f32[4]) -> f32[4] {{
  %param_0.1 = f32[4]{{0}} parameter(0)
  ROOT %multiply.3 = f32[4]{{0}} multiply(%param_0.1, %param_0.1), metadata={{op_name="jit(step)/jvp(mlp)/mul" source_file="{LAYERS}" source_line=226}}
}}

ENTRY %main (p: f32[4]) -> f32[8] {{
  %p = f32[4]{{0}} parameter(0)
  %loop_multiply_fusion.44 = f32[4]{{0}} fusion(%p), kind=kLoop, calls=%fused_computation.1, metadata={{op_name="jit(step)/jvp(mlp)/mul" source_file="{LAYERS}" source_line=226}}
  %loop_multiply_fusion.45 = f32[4]{{0}} fusion(%loop_multiply_fusion.44), kind=kLoop, calls=%fused_computation.1, metadata={{op_name="jit(step)/transpose(jvp(mlp))/mul" source_file="{LAYERS}" source_line=230}}
  %custom-call.7 = f32[4]{{0}} custom-call(%p), custom_call_target="__cublas$gemm", metadata={{op_name="jit(step)/jvp(mlp)/dot_general" source_file="{LAYERS}" source_line=240}}
  ROOT %wrapped_concatenate.76 = f32[8]{{0}} concatenate(%loop_multiply_fusion.45, %custom-call.7), dimensions={{0}}, metadata={{op_name="jit(step)/concatenate" source_file="{LAYERS}" source_line=12}}
}}
"""  # noqa: E501 (HLO lines)
KERNELS = [("loop_multiply_fusion_44", 100.0), ("loop_multiply_fusion_44", 300.0),
           ("nvjet_sm90_tst_128x160", 50.0), ("wrapped_concatenate_76", 20.0)]
# What jax.profiler writes for XLA:GPU launches (the CUPTI collector's annotation stats).
KERNEL_ARGS = [dict(hlo_op="loop_multiply_fusion.44", hlo_module="jit_step",
                    name="jvp(mlp)/mul", correlation_id="11"),
               dict(hlo_op="loop_multiply_fusion.45", hlo_module="jit_step", correlation_id="12"),
               dict(long_name="XlaModule:#hlo_module=jit_step,program_id=3#::"
                              "Thunk:#name=jvp(mlp)/dot_general,hlo_op=custom-call.7#"),
               None]


class ProfileTrainStepTest(absltest.TestCase):

    def test_classify(self):
        cases = {"gdn_backward_chunk": "pallas mixer", "channelwise_intra": "pallas mixer",
                 "simple_gla_chunk_states": "pallas mixer",
                 "sm90_xmma_gemm_bf16bf16_bf16f32": "matmul", "nvjet_tst_128x256": "matmul",
                 "cudnn_generated_fort_native_sdpa": "attention",
                 "ncclDevKernel_AllReduce_Sum": "collective", "Memcpy DtoD": "copy",
                 "loop_add_fusion_3": pts.OTHER, "input_reduce_fusion": pts.OTHER}
        for name, want in cases.items():
            self.assertEqual(pts.classify(name), want, name)

    def test_breakdown_per_step(self):
        rng = np.random.default_rng(0)
        names = ["gdn_prepare", "nvjet_gemm_a", "loop_fusion", "nvjet_gemm_a"]
        durs = rng.uniform(10.0, 500.0, size=len(names))
        classes, busy, longest = pts.kernel_breakdown(_trace(zip(names, durs)), steps=2)
        self.assertAlmostEqual(busy, float(np.sum(durs)) / 1e3 / 2)  # no overlap (ts 1 ms apart)
        self.assertAlmostEqual(classes["matmul"], (durs[1] + durs[3]) / 1e3 / 2)
        self.assertAlmostEqual(classes["pallas mixer"], durs[0] / 1e3 / 2)
        self.assertAlmostEqual(sum(classes.values()), float(np.sum(durs)) / 1e3 / 2)
        self.assertNotIn("cupti", [n for n, *_ in longest])  # not a Stream thread
        top = max(longest, key=lambda r: r[2])
        self.assertEqual(top[0], max(("gdn_prepare", durs[0]), ("nvjet_gemm_a", durs[1] + durs[3]),
                                     ("loop_fusion", durs[2]), key=lambda r: r[1])[0])
        self.assertEqual(dict((n, c) for n, _, _, c in longest)["nvjet_gemm_a"], 1.0)

    def test_hlo_op_of_event_args(self):
        self.assertEqual(pts.hlo_op_of(KERNEL_ARGS[0]), ("jit_step", "loop_multiply_fusion.44"))
        self.assertEqual(pts.hlo_op_of(KERNEL_ARGS[2]), ("jit_step", "custom-call.7"))
        self.assertEqual(pts.hlo_op_of({"hlo_op": "fusion.3"}), ("", "fusion.3"))
        self.assertIsNone(pts.hlo_op_of({}))
        self.assertIsNone(pts.hlo_op_of({"kernel_details": "regs:32"}))

    def test_instruction_breakdown_groups_by_hlo_op(self):
        rows = pts.instruction_breakdown(_trace(KERNELS, KERNEL_ARGS), steps=2)
        # Two instructions share one kernel name; the unannotated launch is left out.
        self.assertEqual([(r["hlo_op"], r["kernel"]) for r in rows],
                         [("loop_multiply_fusion.45", "loop_multiply_fusion_44"),
                          ("loop_multiply_fusion.44", "loop_multiply_fusion_44"),
                          ("custom-call.7", "nvjet_sm90_tst_128x160")])
        self.assertAlmostEqual(rows[0]["ms_per_step"], 300.0 / 1e3 / 2)
        self.assertEqual(rows[0]["calls_per_step"], 0.5)
        self.assertEqual(rows[1]["trace_op_name"], "jvp(mlp)/mul")
        self.assertEqual(rows[2]["cls"], "matmul")
        self.assertEqual(pts.instruction_breakdown(_trace(KERNELS), steps=1), [])
        self.assertLen(pts.instruction_breakdown(_trace(KERNELS, KERNEL_ARGS), 1, top=1), 1)

    def test_sources_from_the_trace_hlo_op(self):
        events = _trace(KERNELS, KERNEL_ARGS)
        _, _, longest = pts.kernel_breakdown(events, steps=1)
        att = pts.source_attribution(events, 1, longest, STEP_HLO)
        self.assertTrue(att["per_instruction"])
        self.assertEqual((att["hlo_module"], att["error"]), ("jit_step", None))
        fusion = att["kernels"]["loop_multiply_fusion_44"]
        self.assertEqual(fusion["hlo_ops"], ["loop_multiply_fusion.45", "loop_multiply_fusion.44"])
        self.assertEqual((fusion["n_hlo_ops"], fusion["via"]), (2, "trace"))
        # The instruction with the most time first, the other line counted.
        self.assertEqual(fusion["source"], "mul at lattn_jax/layers.py:230 "
                                           "(jit(step)/transpose(jvp(mlp))/mul); +1 other line")
        self.assertEqual(att["kernels"]["nvjet_sm90_tst_128x160"]["source"],
                         "dot_general at lattn_jax/layers.py:240 (jit(step)/jvp(mlp)/dot_general)")
        # No hlo_op on its launch: found by its name.
        concat = att["kernels"]["wrapped_concatenate_76"]
        self.assertEqual((concat["via"], concat["hlo_ops"]), ("name", ["wrapped_concatenate.76"]))
        self.assertTrue(concat["source"].startswith("concatenate at lattn_jax/layers.py:12"))
        self.assertEqual([r["source"].split(" (")[0] for r in att["instructions"]],
                         ["mul at lattn_jax/layers.py:230", "mul at lattn_jax/layers.py:226",
                          "dot_general at lattn_jax/layers.py:240"])
        self.assertEqual(att["instructions"][0]["opcode"], "fusion")

    def test_sources_without_hlo_op_or_hlo(self):
        events = _trace(KERNELS)
        _, _, longest = pts.kernel_breakdown(events, steps=1)
        att = pts.source_attribution(events, 1, longest, STEP_HLO)
        self.assertFalse(att["per_instruction"])
        self.assertEqual(att["instructions"], [])
        fusion = att["kernels"]["loop_multiply_fusion_44"]
        self.assertEqual((fusion["via"], fusion["hlo_ops"]), ("name", ["loop_multiply_fusion.44"]))
        self.assertTrue(fusion["source"].startswith("mul at lattn_jax/layers.py:226"))
        self.assertEqual(att["kernels"]["nvjet_sm90_tst_128x160"],
                         dict(source="", op_name="", hlo_ops=[], n_hlo_ops=0, via=""))
        # No HLO text: the trace's own op names still name the instructions.
        att = pts.source_attribution(_trace(KERNELS, KERNEL_ARGS), 1, longest, None)
        self.assertEqual(att["error"], "no HLO text")
        self.assertEqual(att["instructions"][1]["source"], "jvp(mlp)/mul")
        self.assertEqual(att["kernels"]["loop_multiply_fusion_44"]["n_hlo_ops"], 2)
        # A module the HLO text is not: no source from it.
        other = [dict(a, hlo_module="jit_other") if a and "hlo_module" in a else a
                 for a in KERNEL_ARGS]
        att = pts.source_attribution(_trace(KERNELS, other), 1, longest, STEP_HLO)
        self.assertEqual(att["instructions"][0]["source"], "")

    def test_command_buffer_launches_fall_back_to_kernel_names(self):
        # XLA GPU launches most kernels of a step from command buffers (CUDA graphs): the
        # trace's hlo_op then names the buffer, not the instruction. Such kernels are found by
        # their names, and the buffer's share of the kernel time is reported.
        rng = np.random.default_rng(3)
        durs = rng.uniform(10.0, 400.0, size=len(KERNELS))
        kernels = [(n, float(d)) for (n, _), d in zip(KERNELS, durs)]
        args = [dict(hlo_op="command_buffer_1316", hlo_module="jit_step")] * 3 + [
            dict(hlo_op="wrapped_concatenate.76", hlo_module="jit_step")]
        events = _trace(kernels, args)
        _, _, longest = pts.kernel_breakdown(events, steps=1)
        att = pts.source_attribution(events, 1, longest, STEP_HLO)
        fusion = att["kernels"]["loop_multiply_fusion_44"]
        self.assertEqual((fusion["via"], fusion["hlo_ops"]), ("name", ["loop_multiply_fusion.44"]))
        self.assertTrue(fusion["source"].startswith("mul at lattn_jax/layers.py:226"))
        concat = att["kernels"]["wrapped_concatenate_76"]
        self.assertEqual((concat["via"], concat["hlo_ops"]), ("trace", ["wrapped_concatenate.76"]))
        self.assertAlmostEqual(att["command_buffer_fraction"],
                               float(np.sum(durs[:3]) / np.sum(durs)))
        self.assertTrue(pts.is_command_buffer("command_buffer_1"))
        self.assertFalse(pts.is_command_buffer("loop_multiply_fusion.44"))
        payload = dict(longest_kernels=[dict(name=n, cls=c, ms_per_step=t, calls_per_step=k)
                                        for n, c, t, k in longest])
        pts.add_sources(payload, events, 1, STEP_HLO, top=25)
        text = "\n".join(pts.kernel_tables(payload))
        self.assertIn(f"{att['command_buffer_fraction']:.0%} of the traced kernel time", text)
        self.assertIn("--xla_gpu_enable_command_buffer=", text)

    def test_markdown_tables_with_sources(self):
        events = _trace(KERNELS, KERNEL_ARGS)
        _, _, longest = pts.kernel_breakdown(events, steps=1)
        payload = dict(longest_kernels=[dict(name=n, cls=c, ms_per_step=t, calls_per_step=k)
                                        for n, c, t, k in longest])
        plain = pts.kernel_tables(payload)
        self.assertEqual(plain[0], "| longest kernels | class | ms per step | calls per step |")
        pts.add_sources(payload, events, 1, STEP_HLO, top=25)
        lines = pts.kernel_tables(payload)
        self.assertIn("| source |", lines[0])
        row = next(r for r in lines if r.startswith("| `loop_multiply_fusion_44`"))
        self.assertIn("lattn_jax/layers.py:230", row)
        self.assertIn("[2 HLO instructions]", row)
        self.assertIn("| longest HLO instructions | kernel | ms per step | launches per step "
                      "| source |", lines)
        self.assertTrue(any(r.startswith("| `custom-call.7` | `nvjet_sm90_tst_128x160` |")
                            for r in lines))
        self.assertEqual(payload["source_attribution"]["hlo_module"], "jit_step")
        self.assertLen(payload["longest_hlo_instructions"], 3)
        self.assertEqual(payload["longest_kernels"][0]["source_via"], "trace")

    def test_busy_time_counts_overlaps_once(self):
        # [0, 10) and [5, 20) overlap: 20; [30, 31) apart: 1; [2, 3) inside the first: 0.
        self.assertEqual(pts.bench.busy_time([(5.0, 15.0), (0.0, 10.0), (30.0, 1.0),
                                              (2.0, 1.0)]), 21.0)
        self.assertEqual(pts.bench.busy_time([]), 0.0)

    def test_time_back_to_back_calls_iters_times_and_syncs_once(self):
        calls = []

        def fn():
            calls.append(1)
            return len(calls)

        with mock.patch.object(pts.bench.jax, "block_until_ready") as sync:
            per_call = pts.bench.time_back_to_back(fn, 5)
        self.assertLen(calls, 5)
        sync.assert_called_once_with(5)  # the last call's result only
        self.assertGreaterEqual(per_call, 0.0)
        with self.assertRaisesRegex(ValueError, "iters >= 1"):
            pts.bench.time_back_to_back(fn, 0)

    def test_bad_flags_name_the_option(self):
        for flag in ("--batch=0", "--iters=0", "--warmup=-1", "--loss_chunk_size=-1"):
            with self.assertRaises(SystemExit):
                pts.parse_args([flag])

    def test_swiglu_packed_flag_overrides_the_config_last(self):
        # --swiglu_packed=on|off: model.swiglu_packed for the A/B of MOSAIC_GPU.md Sec. 46.2,
        # applied after --set (the flag wins); absent, the preset's (off) stands.
        self.assertIsNone(pts.parse_args([]).swiglu_packed)
        for bad in ("--swiglu_packed=yes", "--swiglu_packed=1", "--swiglu_packed"):
            with self.assertRaises(SystemExit):
                pts.parse_args([bad])
        for flag, want in (([], False), (["--swiglu_packed=on"], True),
                           (["--swiglu_packed=off", "--set=model.swiglu_packed=true"], False),
                           (["--set=model.swiglu_packed=true"], True)):
            args = pts.parse_args(["--tiny", "--batch=2", "--length=64",
                                   "--set=model.split_projections=false"] + flag)
            overrides = pts.config_overrides(args)
            self.assertEqual(overrides[:2], ["data.batch_size=2", "data.seq_len=64"])
            cfg = pts.bench_train.experiment_config(args.preset, args.opt, tiny=True,
                                                    overrides=overrides)
            self.assertIs(cfg.model.swiglu_packed, want, flag)
            self.assertIs(cfg.model.split_projections, False)

    def test_norm_implementation_by_set(self):
        # --set=model.norm_implementation=xla|pallas: the one-pass Pallas RMSNorm A/B
        # (MOSAIC_GPU.md Sec. 47; issue29_queue.sh's norm_ab); absent, the preset's xla.
        for flag, want in (([], "xla"), (["--set=model.norm_implementation=pallas"], "pallas"),
                           (["--set=model.norm_implementation=xla"], "xla")):
            args = pts.parse_args(["--tiny", "--batch=2", "--length=64"] + flag)
            cfg = pts.bench_train.experiment_config(args.preset, args.opt, tiny=True,
                                                    overrides=pts.config_overrides(args))
            self.assertEqual(cfg.model.norm_implementation, want, flag)

    @pytest.mark.slow  # ~55 s on 2 cores
    def test_tiny_cpu_run(self):
        payload = pts.main(["--tiny", "--batch=2", "--length=64", "--iters=1", "--warmup=1",
                            "--trace_steps=1", "--swiglu_packed=on"])
        for part in ("step", "fwd_bwd", "optimizer"):
            self.assertGreater(payload["ms"][part], 0.0)
        self.assertEqual(payload["device_ms_per_step_by_class"], {})  # CPU: no device plane
        self.assertEqual(payload["model_options"],
                         dict(split_projections=True, swiglu_packed=True,
                              norm_implementation="xla"))
        self.assertIs(payload["settings"]["swiglu_packed"], True)
        md = pts.markdown(payload)
        self.assertIn("| optimizer |", md)
        self.assertIn("Model options: model.split_projections=on, model.swiglu_packed=on, "
                      "model.norm_implementation=xla.", md)


if __name__ == "__main__":
    absltest.main()
