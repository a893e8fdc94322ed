"""benchmarks/profile_train_step.py: the kernel classes, the trace breakdown, a tiny CPU run."""

from unittest import mock

import numpy as np
import pytest
from absl.testing import absltest

from benchmarks import profile_train_step as pts


def _trace(kernels):
    """Chrome-trace events: a GPU process with a Stream thread and a CUPTI line, and a host."""
    events = [dict(ph="M", name="process_name", pid=1, args=dict(name="/device:GPU:0")),
              dict(ph="M", name="thread_name", pid=1, tid=7, args=dict(name="Stream #13(...)")),
              dict(ph="M", name="thread_name", pid=1, tid=8, args=dict(name="CUPTI overhead")),
              dict(ph="M", name="process_name", pid=2, args=dict(name="/host:CPU")),
              dict(ph="X", pid=2, tid=1, name="gemm_on_host?", dur=5e4),
              dict(ph="X", pid=1, tid=8, name="cupti", dur=7e4)]
    return events + [dict(ph="X", pid=1, tid=7, name=n, ts=1000.0 * i, dur=d)
                     for i, (n, d) in enumerate(kernels)]


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
        for flag in ("--batch=0", "--iters=0", "--warmup=-1"):
            with self.assertRaises(SystemExit):
                pts.parse_args([flag])

    @pytest.mark.slow  # ~55 s on 2 cores
    def test_tiny_cpu_run(self):
        payload = pts.main(["--tiny", "--batch=2", "--length=64", "--iters=1", "--warmup=1",
                            "--trace_steps=1"])
        for part in ("step", "fwd_bwd", "optimizer"):
            self.assertGreater(payload["ms"][part], 0.0)
        self.assertEqual(payload["device_ms_per_step_by_class"], {})  # CPU: no device plane
        self.assertIn("| optimizer |", pts.markdown(payload))


if __name__ == "__main__":
    absltest.main()
