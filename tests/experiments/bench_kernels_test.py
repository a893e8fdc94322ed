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
        self.assertIsNone(bench_kernels.device_ms_from_trace(_trace([0.0, 0.0]), calls=1))

    def test_only_stream_threads_count_where_threads_are_named(self):
        events = _trace([200.0, 300.0])
        for e in events:
            if e.get("pid") == 1 and e.get("ph") == "X":
                e["tid"] = 7
        events += [dict(ph="M", name="thread_name", pid=1, tid=7,
                        args=dict(name="Stream #7(Compute)")),
                   dict(ph="M", name="thread_name", pid=1, tid=99,
                        args=dict(name="CUPTI overhead")),
                   dict(ph="X", pid=1, tid=99, name="overhead", dur=5_000.0)]
        self.assertAlmostEqual(bench_kernels.device_ms_from_trace(events, calls=1), 0.5)


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
        self.assertEqual(cells[12], "0.50")  # jla has no kernel time: wall / wall, 1.6 / 3.2
        self.assertEqual(cells[14], f"{100 * 0.371 / 2.5:.0f}%")

    def test_peer_ratio_never_sets_kernel_against_wall(self):
        ratio = bench_kernels.peer_ratio
        self.assertEqual(ratio(dict(ms=3.2), dict(ms=2.0, kernel_ms=1.0)), "0.62")  # wall
        self.assertEqual(ratio(dict(kernel_ms=2.0), dict(ms=9.0)), "–")  # nothing comparable
        self.assertEqual(ratio(dict(ms=2.0, kernel_ms=1.5), dict(ms=3.0, kernel_ms=0.0)),
                         "1.50")  # a zero kernel time counts as missing: wall / wall
        self.assertEqual(ratio(dict(ms=2.0, kernel_ms=1.5), dict(ms=3.0, kernel_ms=3.0)),
                         "2.00")


if __name__ == "__main__":
    absltest.main()
