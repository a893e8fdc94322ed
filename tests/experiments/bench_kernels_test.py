"""experiments/bench_kernels.py's CPU-testable parts: the kernel-time parse and the report."""

import numpy as np
from absl.testing import absltest

from experiments import bench_kernels


def _trace(durations_us, device="/device:GPU:0 (H200)"):
    """Chrome-trace events: a device process with ``durations_us`` kernels and a host process."""
    events = [dict(ph="M", name="process_name", pid=1, args=dict(name=device)),
              dict(ph="M", name="process_name", pid=2, args=dict(name="/host:CPU")),
              dict(ph="X", pid=2, name="host_work", dur=10_000.0)]
    events += [dict(ph="X", pid=1, name=f"kernel_{i}", dur=d) for i, d in enumerate(durations_us)]
    return events


class DeviceTimeTest(absltest.TestCase):

    def test_sums_device_kernels_per_call(self):
        rng = np.random.default_rng(0)
        durs = rng.uniform(5.0, 900.0, size=12)
        got = bench_kernels.device_ms_from_trace(_trace(durs), calls=3)
        self.assertAlmostEqual(got, float(np.sum(durs)) / 1e3 / 3, places=9)

    def test_no_device_events_is_none(self):
        self.assertIsNone(bench_kernels.device_ms_from_trace(_trace([], "/host:CPU"), calls=2))
        self.assertIsNone(bench_kernels.device_ms_from_trace(
            _trace([100.0], device="/host:CPU"), calls=1))


class MarkdownTest(absltest.TestCase):

    def test_ratios_on_kernel_time_never_mixed_with_wall(self):
        rec = dict(op="gdn", shape="S1", pass_="fwdbwd")
        records = [
            dict(rec, peer="ours", ms=3.2, ms_loop=3.0, kernel_ms=2.5,
                 gate_errors={"o": 3e-3}),
            dict(rec, peer="fla", ms=2.9, kernel_ms=2.75),
            dict(rec, peer="jla", ms=1.6),  # a wall time only
        ]
        md = bench_kernels.markdown(records, {"date": "2026-11-29", "gpu": "H200"}, "cmd")
        row = [line for line in md.splitlines() if line.startswith("| gdn | S1 | fwdbwd")][0]
        cells = [c.strip() for c in row.strip("|").split("|")]
        # ours kernel, fla kernel, jla kernel, ours wall, ours loop, fla wall, jla wall, ...
        self.assertEqual(cells[3:10], ["2.500", "2.750", "–", "3.200", "3.000", "2.900",
                                       "1.600"])
        self.assertEqual(cells[11], "1.10")  # fla/ours on kernel time: 2.75 / 2.5
        self.assertEqual(cells[12], "–")  # jla has no kernel time: no ratio against ours' kernel
        self.assertEqual(cells[14], f"{100 * 0.371 / 2.5:.0f}%")


if __name__ == "__main__":
    absltest.main()
