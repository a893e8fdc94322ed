"""benchmarks/bench_kernels.py's CPU-testable parts: the kernel-time parse and the report."""

import re

import numpy as np
from absl.testing import absltest

from benchmarks import bench_kernels


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


class BreakdownTest(absltest.TestCase):

    def test_per_name_sums_largest_first_rest_as_other(self):
        rng = np.random.default_rng(1)
        names = [f"k{i}" for i in range(12)]
        launches = [(names[int(i)], float(d))
                    for i, d in zip(rng.integers(0, 12, 200), rng.uniform(1.0, 500.0, 200))]
        calls = 4
        got = bench_kernels.kernel_breakdown(launches, calls, top=5)
        want = {}
        for name, dur in launches:
            want[name] = want.get(name, 0.0) + dur / 1e3 / calls
        ranked = sorted(want.items(), key=lambda kv: -kv[1])
        self.assertEqual(list(got)[:5], [name for name, _ in ranked[:5]])
        for name, ms in ranked[:5]:
            self.assertAlmostEqual(got[name], ms, places=9)
        self.assertAlmostEqual(got["(other)"], sum(ms for _, ms in ranked[5:]), places=9)
        self.assertAlmostEqual(sum(got.values()), sum(d for _, d in launches) / 1e3 / calls,
                               places=9)
        few = bench_kernels.kernel_breakdown(launches[:3], 1, top=5)
        self.assertNotIn("(other)", few)
        self.assertIsNone(bench_kernels.kernel_breakdown([], 1))
        self.assertIsNone(bench_kernels.kernel_breakdown([("k", 0.0)], 1))

    def test_breakdown_top_flag_names_that_many_kernels(self):
        """``--breakdown_top``: the records' breakdown names that many kernels (default
        :data:`BREAKDOWN_TOP`, 8), the rest as "(other)"; the total is unchanged; below 1 is
        refused."""
        from absl import flags
        from absl.testing import flagsaver
        if not flags.FLAGS.is_parsed():
            flags.FLAGS.mark_as_parsed()
        launches = [(f"k{i}", 100.0 * (i + 1)) for i in range(12)]
        self.assertEqual(bench_kernels._BREAKDOWN_TOP.value, bench_kernels.BREAKDOWN_TOP)
        ms, got = bench_kernels._kernel_time(launches, 2)
        self.assertLen(got, bench_kernels.BREAKDOWN_TOP + 1)
        with flagsaver.flagsaver(breakdown_top=16):
            ms16, got16 = bench_kernels._kernel_time(launches, 2)
        self.assertLen(got16, 12)
        self.assertNotIn("(other)", got16)
        with flagsaver.flagsaver(breakdown_top=3):
            ms3, got3 = bench_kernels._kernel_time(launches, 2)
        self.assertEqual(list(got3), ["k11", "k10", "k9", "(other)"])
        for total, breakdown in ((ms, got), (ms16, got16), (ms3, got3)):
            self.assertAlmostEqual(total, sum(100.0 * (i + 1) for i in range(12)) / 1e3 / 2)
            self.assertAlmostEqual(sum(breakdown.values()), total, places=9)
        with self.assertRaises(flags.IllegalFlagValueError):
            flags.FLAGS.breakdown_top = 0

    def test_listed_below_the_table(self):
        rec = dict(op="kda", shape="S1", pass_="fwd")
        records = [dict(rec, peer="ours", kernel_ms=2.0, ms=2.2,
                        kernels={"channelwise_prepare": 1.25, "channelwise_intra": 0.75}),
                   dict(rec, peer="fla", kernel_ms=1.8, kernels={"chunk_kda_fwd": 1.8}),
                   dict(rec, peer="jla", ms=1.5)]
        md = bench_kernels.markdown(records, {"date": "2026-11-30", "gpu": "H200"}, "cmd")
        lines = md.splitlines()
        table_end = max(i for i, line in enumerate(lines) if line.startswith("| kda |"))
        ours = lines.index("- kda S1 fwd, ours: channelwise_prepare 1.250, "
                           "channelwise_intra 0.750")
        self.assertGreater(ours, table_end)
        self.assertIn("- kda S1 fwd, fla: chunk_kda_fwd 1.800", lines)
        self.assertFalse(any(line.startswith("- kda S1 fwd, jla") for line in lines))
        self.assertNotIn("Per-kernel", bench_kernels.markdown(records[2:], {"date": "d"}, "c"))


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

    def test_mosaic_passes_follow_the_wy_flag(self):
        from absl import flags
        from absl.testing import flagsaver
        if not flags.FLAGS.is_parsed():
            flags.FLAGS.mark_as_parsed()
        self.assertEqual(bench_kernels._mosaic_passes("gdn"), ("fwd", "fwdbwd"))
        self.assertEqual(bench_kernels._mosaic_passes("kda"), ())
        recs = [dict(peer="mosaic", op="lightning", shape="S1", pass_="fwd", ms=0.5,
                     kernel_ms=0.2, gate_errors={}, mosaic_forward="fused")]
        self.assertIn("Forward: `fused` (`--mosaic_forward`).",
                      "\n".join(bench_kernels.mosaic_lines(recs)))
        with flagsaver.flagsaver(mosaic_wy="xla"):  # the XLA WY path has no backward
            self.assertEqual(bench_kernels._mosaic_passes("deltanet"), ("fwd",))
            self.assertEqual(bench_kernels._mosaic_passes("lightning"), ("fwd", "fwdbwd"))

    def _assert_refused_before_running(self, refused, **base):
        """Each ``(flags, message)`` of ``refused`` (on top of ``--peers=mosaic --ops=gdn``
        and the flags ``base``) makes ``main`` raise a ``UsageError`` matching ``message``
        before any op runs."""
        from absl import app
        from absl.testing import flagsaver
        for extra, message in refused:
            with flagsaver.flagsaver(**{"peers": ["mosaic"], "ops": ["gdn"], **base, **extra}):
                with absltest.mock.patch.object(bench_kernels, "run_jax") as run:
                    with self.assertRaisesRegex(app.UsageError, message):
                        bench_kernels.main([])
                self.assertFalse(run.called)

    def test_bad_mosaic_forward_refused_before_running(self):
        from absl import app, flags
        from absl.testing import flagsaver
        if not flags.FLAGS.is_parsed():
            flags.FLAGS.mark_as_parsed()
        with flagsaver.flagsaver(peers=["mosaic"], ops=["lightning"], mosaic_forward="bogus"):
            with absltest.mock.patch.object(bench_kernels, "run_jax") as run:
                with self.assertRaisesRegex(app.UsageError, "--mosaic_forward=bogus: op "
                                                            "lightning takes one of two_pass"):
                    bench_kernels.main([])
            self.assertFalse(run.called)
        # GDN's forwards are not Lightning's; either op alone takes its own.
        with flagsaver.flagsaver(peers=["mosaic"], ops=["lightning", "gdn"],
                                 mosaic_forward="three_pass"):
            with self.assertRaisesRegex(app.UsageError, "op lightning"):
                bench_kernels.main([])
        with flagsaver.flagsaver(peers=["mosaic"], ops=["gdn"], mosaic_forward="three_pass"):
            bench_kernels._check_mosaic_forward()
        # An op with no Mosaic forward: the flag would apply to nothing (it exited 0 with an
        # empty table, 2026-12-03 newcomer pass).
        with flagsaver.flagsaver(peers=["mosaic"], ops=["kda"], mosaic_forward="fused_t0"):
            with self.assertRaisesRegex(app.UsageError, r"--mosaic_forward=fused_t0 applies to "
                                                        r"ops lightning, gdn, deltanet only "
                                                        r"\(--ops=kda\)"):
                bench_kernels._check_mosaic_forward()
        with flagsaver.flagsaver(peers=["mosaic"], ops=["gdn"], mosaic_wy="xla",
                                 mosaic_forward="two_pass"):
            with self.assertRaisesRegex(app.UsageError, "op gdn takes one of three_pass"):
                bench_kernels._check_mosaic_forward()

    def test_mosaic_forward_fused_t0_selects_the_t0_forward(self):
        # fused_t0 and fused_t0_split (chunk_kkt_inverse_mosaic + the T0 fused kernel, two or
        # three warpgroups) are GDN / DeltaNet forwards only, and reach the differentiable op
        # as given.
        from absl import app, flags
        from absl.testing import flagsaver
        from pallas_kernels.gated_delta_rule import mosaic_vjp
        if not flags.FLAGS.is_parsed():
            flags.FLAGS.mark_as_parsed()
        for forward in ("fused_t0", "fused_t0_split"):
            with flagsaver.flagsaver(peers=["mosaic"], ops=["gdn", "deltanet"],
                                     mosaic_forward=forward):
                bench_kernels._check_mosaic_forward()
            with flagsaver.flagsaver(peers=["mosaic"], ops=["lightning"],
                                     mosaic_forward=forward):
                with self.assertRaisesRegex(app.UsageError, "op lightning takes one of two_pass"):
                    bench_kernels._check_mosaic_forward()
            x = np.zeros((1, 64, 1, 64), np.float32)
            with flagsaver.flagsaver(mosaic_wy="mosaic", mosaic_forward=forward):
                with absltest.mock.patch.object(mosaic_vjp, "gated_delta_rule_mosaic",
                                                return_value=(x, None)) as op:
                    bench_kernels._jax_fn("gdn", "mosaic", None)(x, x, x, g=x[..., 0],
                                                                 beta=x[..., 0])
            self.assertEqual(op.call_args.kwargs["forward"], forward)

    def test_mosaic_t0_flags_set_the_t0_options_or_are_refused(self):
        # --mosaic_t0_inverse / --mosaic_t0_refine / --mosaic_t0_chunks_per_cta reach
        # chunk_kkt_inverse_mosaic through kernel_mosaic_gpu.T0_OPTIONS, only where the T0
        # kernel runs.
        from absl import flags
        from absl.testing import flagsaver
        from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu as gdr_mosaic
        if not flags.FLAGS.is_parsed():
            flags.FLAGS.mark_as_parsed()
        self.addCleanup(gdr_mosaic.T0_OPTIONS.clear)
        with flagsaver.flagsaver(peers=["mosaic"], ops=["gdn"]):
            self.assertEqual(bench_kernels._apply_mosaic_t0(), {})
            self.assertEqual(gdr_mosaic.T0_OPTIONS, {})
        for forward in ("fused_t0", "fused_t0_split"):
            with flagsaver.flagsaver(peers=["mosaic"], ops=["gdn"], mosaic_forward=forward,
                                     mosaic_t0_inverse="substitution",
                                     mosaic_t0_chunks_per_cta=4):
                want = {"inverse": "substitution", "chunks_per_cta": 4}
                self.assertEqual(bench_kernels._apply_mosaic_t0(), want)
                self.assertEqual(gdr_mosaic.T0_OPTIONS, want)
        with flagsaver.flagsaver(peers=["mosaic"], ops=["gdn"], mosaic_forward="fused_t0",
                                 mosaic_t0_inverse="substitution",
                                 mosaic_t0_refine="split_merge"):
            want = {"inverse": "substitution", "refine": "split_merge"}
            self.assertEqual(bench_kernels._apply_mosaic_t0(), want)
            self.assertEqual(gdr_mosaic.T0_OPTIONS, want)
        # split_merge alone: the default inverse is the substitution (2026-12-04d).
        with flagsaver.flagsaver(peers=["mosaic"], ops=["gdn"], mosaic_forward="fused_t0",
                                 mosaic_t0_refine="split_merge"):
            self.assertEqual(bench_kernels._apply_mosaic_t0(), {"refine": "split_merge"})
        refused = (
            (dict(mosaic_forward="fused_split", mosaic_t0_inverse="substitution"),
             r"--mosaic_t0_inverse=substitution applies to --mosaic_forward=fused_t0 or "
             r"fused_t0_split or fused_rs only"),
            (dict(mosaic_forward="fused_t0", mosaic_t0_inverse="bogus"),
             "the T0 kernel takes one of doubling, substitution"),
            (dict(mosaic_forward="fused_t0", mosaic_t0_chunks_per_cta=0), "must be >= 1"),
            (dict(mosaic_forward="fused_t0", mosaic_t0_refine="lu"),
             "the T0 kernel takes one of newton, split_merge"),
            (dict(mosaic_forward="fused_t0", mosaic_t0_refine="split_merge",
                  mosaic_t0_inverse="doubling"),
             "--mosaic_t0_refine=split_merge needs --mosaic_t0_inverse=substitution"),
            (dict(mosaic_forward="fused_split", mosaic_t0_refine="split_merge",
                  mosaic_t0_inverse="substitution"), "applies to --mosaic_forward=fused_t0"),
            (dict(mosaic_forward="fused_t0", mosaic_wy="xla", mosaic_t0_chunks_per_cta=2),
             "--mosaic_wy=mosaic only"),
        )
        self._assert_refused_before_running(refused)

    def test_mosaic_t0_split_order_sets_the_split_options_or_is_refused(self):
        # --mosaic_t0_split_order reaches chunk_delta_fused_t0_fwd_mosaic through
        # kernel_mosaic_gpu.SPLIT_T0_OPTIONS, with --mosaic_forward=fused_t0_split only.
        from absl import flags
        from absl.testing import flagsaver
        from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu as gdr_mosaic
        if not flags.FLAGS.is_parsed():
            flags.FLAGS.mark_as_parsed()
        self.addCleanup(gdr_mosaic.SPLIT_T0_OPTIONS.clear)
        self.addCleanup(gdr_mosaic.T0_OPTIONS.clear)
        with flagsaver.flagsaver(peers=["mosaic"], ops=["gdn"], mosaic_forward="fused_t0_split"):
            self.assertEqual(bench_kernels._apply_mosaic_t0(), {})
            self.assertEqual(gdr_mosaic.SPLIT_T0_OPTIONS, {})
        for wy in ("mosaic", "xla"):  # the order needs no T0 kernel
            with flagsaver.flagsaver(peers=["mosaic"], ops=["gdn"], mosaic_wy=wy,
                                     mosaic_forward="fused_t0_split",
                                     mosaic_t0_split_order="prepare_first"):
                want = {"split_order": "prepare_first"}
                self.assertEqual(bench_kernels._apply_mosaic_t0(), want)
                self.assertEqual(gdr_mosaic.SPLIT_T0_OPTIONS, want)
                self.assertEqual(gdr_mosaic.T0_OPTIONS, {})
        with flagsaver.flagsaver(peers=["mosaic"], ops=["gdn"], mosaic_forward="fused_t0_split",
                                 mosaic_t0_split_order="prepare_mid", mosaic_t0_split_stages=3):
            want = {"split_order": "prepare_mid", "split_stages": 3}
            self.assertEqual(bench_kernels._apply_mosaic_t0(), want)
            self.assertEqual(gdr_mosaic.SPLIT_T0_OPTIONS, want)
        with flagsaver.flagsaver(peers=["mosaic"], ops=["gdn"], mosaic_forward="fused_t0_split",
                                 mosaic_t0_split_stages=3):  # the default order, three stages
            self.assertEqual(bench_kernels._apply_mosaic_t0(), {"split_stages": 3})
        self.addCleanup(gdr_mosaic.SPLIT_T0_OPTIONS.pop, "state_layout", None)
        with flagsaver.flagsaver(peers=["mosaic"], ops=["gdn"], mosaic_forward="fused_t0_split",
                                 mosaic_t0_split_order="state_ag",
                                 mosaic_t0_split_state_layout=["vk", "kv"]):  # Sec. 35
            # validated here; each layout is a variant of its own (run_jax)
            want = {"split_order": "state_ag"}
            self.assertEqual(bench_kernels._apply_mosaic_t0(), want)
            self.assertEqual(gdr_mosaic.SPLIT_T0_OPTIONS, want)
            self.assertEqual(bench_kernels._split_state_layout_variants("gdn", "mosaic"),
                             ["vk", "kv"])
            self.assertEqual(bench_kernels._split_state_layout_variants("gdn", "jla"), [None])
            self.assertEqual([v[-1] for v in bench_kernels._variants("gdn", "mosaic")],
                             ["vk", "kv"])
            bench_kernels._set_split_state_layout("vk")
            self.assertEqual(gdr_mosaic.SPLIT_T0_OPTIONS, {**want, "state_layout": "vk"})
            bench_kernels._set_split_state_layout(None)
            self.assertEqual(gdr_mosaic.SPLIT_T0_OPTIONS, want)
        refused = (
            (dict(mosaic_forward="fused_t0", mosaic_t0_split_order="prepare_first"),
             "--mosaic_t0_split_order applies to --mosaic_forward=fused_t0_split only"),
            (dict(mosaic_forward="fused_t0_split", mosaic_t0_split_order="bogus"),
             "takes one of readout_first, prepare_first, prepare_mid"),
            (dict(mosaic_forward="fused_t0", mosaic_t0_split_stages=3),
             "--mosaic_t0_split_stages applies to --mosaic_forward=fused_t0_split only"),
            (dict(mosaic_forward="fused_t0_split", mosaic_t0_split_stages=4),
             "--mosaic_t0_split_stages=4: takes one of 2, 3"),
            (dict(mosaic_forward="fused_t0", mosaic_t0_split_state_layout=["vk"]),
             "--mosaic_t0_split_state_layout applies to --mosaic_forward=fused_t0_split only"),
            (dict(mosaic_forward="fused_t0_split", mosaic_t0_split_state_layout=["vk", "kt"]),
             "--mosaic_t0_split_state_layout=kt: takes values of kv, vk"),
        )
        self._assert_refused_before_running(refused)

    def test_mosaic_t0_split_protocol_sets_the_split_options_or_is_refused(self):
        # --mosaic_t0_split_protocol (MOSAIC_GPU.md Sec. 40) reaches
        # chunk_delta_fused_t0_fwd_mosaic through kernel_mosaic_gpu.SPLIT_T0_OPTIONS, beside
        # the order and the depth, with --mosaic_forward=fused_t0_split only.
        from absl import flags
        from absl.testing import flagsaver
        from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu as gdr_mosaic
        if not flags.FLAGS.is_parsed():
            flags.FLAGS.mark_as_parsed()
        self.addCleanup(gdr_mosaic.SPLIT_T0_OPTIONS.clear)
        self.addCleanup(gdr_mosaic.T0_OPTIONS.clear)
        for protocol in ("early_s", "joint"):
            with flagsaver.flagsaver(peers=["mosaic"], ops=["gdn"],
                                     mosaic_forward="fused_t0_split",
                                     mosaic_t0_split_order="state_ag", mosaic_t0_split_stages=3,
                                     mosaic_t0_split_protocol=protocol):
                want = {"split_order": "state_ag", "split_stages": 3,
                        "split_protocol": protocol}
                self.assertEqual(bench_kernels._apply_mosaic_t0(), want)
                self.assertEqual(gdr_mosaic.SPLIT_T0_OPTIONS, want)
                self.assertEqual(gdr_mosaic.T0_OPTIONS, {})
        with flagsaver.flagsaver(peers=["mosaic"], ops=["gdn"], mosaic_forward="fused_t0_split",
                                 mosaic_t0_split_protocol="early_s",
                                 mosaic_t0_split_state_layout=["kv"]):
            self.assertEqual(bench_kernels._apply_mosaic_t0(), {"split_protocol": "early_s"})
        refused = (
            (dict(mosaic_forward="fused_t0", mosaic_t0_split_protocol="early_s"),
             "--mosaic_t0_split_protocol applies to --mosaic_forward=fused_t0_split only"),
            (dict(mosaic_forward="fused_t0_split", mosaic_t0_split_protocol="late_s"),
             "--mosaic_t0_split_protocol=late_s: takes one of joint, early_s"),
            (dict(mosaic_forward="fused_t0_split", mosaic_t0_split_protocol="early_s",
                  mosaic_t0_split_state_layout=["kv", "vk"]),
             "--mosaic_t0_split_protocol=early_s is built for the kv state layout only"),
        )
        self._assert_refused_before_running(refused)

    def test_mosaic_forward_without_the_mosaic_peer_is_refused(self):
        from absl import app, flags
        from absl.testing import flagsaver
        if not flags.FLAGS.is_parsed():
            flags.FLAGS.mark_as_parsed()
        with flagsaver.flagsaver(peers=["ours", "jla"], ops=["lightning"],
                                 mosaic_forward="fused"):
            with self.assertRaisesRegex(app.UsageError, "applies to peer mosaic only"):
                bench_kernels._check_mosaic_forward()

    def test_mosaic_gla_residual_h_refused_where_it_would_not_apply(self):
        from absl import flags
        from absl.testing import flagsaver
        if not flags.FLAGS.is_parsed():
            flags.FLAGS.mark_as_parsed()
        base = dict(peers=["mosaic"], ops=["lightning"], passes=["fwdbwd"])
        refused = (
            (dict(peers=["ours", "jla"]), "mosaic_gla_residual_h applies to peer mosaic only"),
            (dict(ops=["gdn"]), "applies to op lightning only"),
            (dict(passes=["fwd"]), "applies to pass fwdbwd only"),
            (dict(mosaic_forward="two_pass"), "not --mosaic_forward=two_pass"),
        )
        for value in (True, False):
            self._assert_refused_before_running(refused, **base, mosaic_gla_residual_h=value)
        for forward in (None, "fused", "auto"):
            with flagsaver.flagsaver(**base, mosaic_forward=forward, mosaic_gla_residual_h=True):
                bench_kernels._check_mosaic_gla_residual_h()

    def test_mosaic_gla_residual_h_reaches_simple_gla_mosaic(self):
        from absl import flags
        from absl.testing import flagsaver
        from pallas_kernels.simple_gla import kernel_mosaic_gpu as kmg
        if not flags.FLAGS.is_parsed():
            flags.FLAGS.mark_as_parsed()
        x = np.zeros((1, 64, 1, 64), np.float32)
        for value in (None, True):
            with flagsaver.flagsaver(mosaic_gla_residual_h=value, mosaic_forward="fused"):
                with absltest.mock.patch.object(kmg, "simple_gla_mosaic",
                                                return_value=(x, None)) as fn:
                    bench_kernels._jax_fn("lightning", "mosaic", None)(
                        x, x, x, g_gamma=np.zeros((1,), np.float32))
            self.assertIs(fn.call_args.kwargs["residual_h"], value)
            self.assertEqual(fn.call_args.kwargs["forward"], "fused")
        recs = [dict(peer="mosaic", op="lightning", shape="S1", pass_="fwdbwd", ms=0.5,
                     kernel_ms=0.2, gate_errors={}, mosaic_gla_residual_h=True)]
        self.assertIn("(`--mosaic_gla_residual_h`)", "\n".join(bench_kernels.mosaic_lines(recs)))

    def test_mosaic_gla_stages_refused_where_it_would_not_apply_and_reaches_the_kernel(self):
        from absl import flags
        from absl.testing import flagsaver
        from pallas_kernels.simple_gla import kernel_mosaic_gpu as kmg
        if not flags.FLAGS.is_parsed():
            flags.FLAGS.mark_as_parsed()
        base = dict(peers=["mosaic"], ops=["lightning"], mosaic_gla_stages=3)
        refused = (
            (dict(peers=["ours", "jla"]), "mosaic_gla_stages=3 applies to peer mosaic only"),
            (dict(ops=["gdn"]), "applies to op lightning only"),
            (dict(mosaic_forward="two_pass"), "not --mosaic_forward=two_pass"),
            (dict(mosaic_gla_stages=1), "at least 2 stages"),
        )
        self._assert_refused_before_running(refused, **base)
        self.assertNotIn("stages", kmg.FUSED_OPTIONS)
        x = np.zeros((1, 64, 1, 64), np.float32)
        try:
            with flagsaver.flagsaver(**base, mosaic_forward="fused"):
                bench_kernels._check_mosaic_gla_stages()
                self.assertEqual(kmg.FUSED_OPTIONS, {"stages": 3})
                with absltest.mock.patch.object(kmg, "simple_gla_fused_fwd_mosaic",
                                                return_value=(x, None)) as fn:
                    kmg.simple_gla_fwd_mosaic(x, x, x, None, forward="fused")
                self.assertEqual(fn.call_args.kwargs["stages"], 3)
            with flagsaver.flagsaver(mosaic_gla_stages=None):  # unset: the kernel's default
                bench_kernels._check_mosaic_gla_stages()
                self.assertEqual(kmg.FUSED_OPTIONS, {})
        finally:
            kmg.FUSED_OPTIONS.clear()

    def test_mosaic_rs_stages_refused_where_it_would_not_apply_and_reaches_options(self):
        # MOSAIC_GPU.md Sec. 56: --mosaic_forward=fused_rs is accepted, --mosaic_rs_stages
        # only with it; the value lands in mosaic_vjp.RS_OPTIONS (read by the op's call).
        from absl import flags
        from absl.testing import flagsaver
        from pallas_kernels.gated_delta_rule import mosaic_vjp
        if not flags.FLAGS.is_parsed():
            flags.FLAGS.mark_as_parsed()
        with flagsaver.flagsaver(peers=["mosaic"], ops=["gdn"], mosaic_forward="fused_rs"):
            bench_kernels._check_mosaic_forward()
        base = dict(peers=["mosaic"], ops=["gdn"], mosaic_forward="fused_rs",
                    mosaic_rs_stages=2)
        refused = (
            # --mosaic_forward=fused_rs is refused there first (_check_mosaic_forward)
            (dict(peers=["ours", "jla"]), "applies to peer mosaic only"),
            (dict(ops=["lightning"]), "op lightning takes one of"),
            (dict(mosaic_forward="fused_t0"), "applies to --mosaic_forward=fused_rs only"),
            (dict(mosaic_rs_stages=4), "takes one of 2, 3"),
        )
        self._assert_refused_before_running(refused, **base)
        try:
            with flagsaver.flagsaver(**base):
                bench_kernels._check_mosaic_rs_stages()
                self.assertEqual(mosaic_vjp.RS_OPTIONS, {"stages": 2})
            with flagsaver.flagsaver(mosaic_rs_stages=None):
                bench_kernels._check_mosaic_rs_stages()
                self.assertEqual(mosaic_vjp.RS_OPTIONS, {})
        finally:
            mosaic_vjp.RS_OPTIONS.clear()

    def test_mosaic_rs_protocol_refused_where_it_would_not_apply_and_reaches_options(self):
        # MOSAIC_GPU.md Sec. 64: --mosaic_rs_protocol only with --mosaic_forward=fused_rs; the
        # value lands in mosaic_vjp.RS_OPTIONS["protocol"] (read by the op's call).
        from absl import flags
        from absl.testing import flagsaver
        from pallas_kernels.gated_delta_rule import mosaic_vjp
        if not flags.FLAGS.is_parsed():
            flags.FLAGS.mark_as_parsed()
        base = dict(peers=["mosaic"], ops=["gdn"], mosaic_forward="fused_rs",
                    mosaic_rs_protocol="ag_ahead")
        refused = (
            (dict(peers=["ours", "jla"]), "applies to peer mosaic only"),
            (dict(mosaic_forward="fused_t0"), "applies to --mosaic_forward=fused_rs only"),
        )
        self._assert_refused_before_running(refused, **base)
        with self.assertRaises(flags.IllegalFlagValueError):
            flags.FLAGS["mosaic_rs_protocol"].parse("early_s")
        try:
            with flagsaver.flagsaver(**base):
                bench_kernels._check_mosaic_rs_protocol()
                self.assertEqual(mosaic_vjp.RS_OPTIONS, {"protocol": "ag_ahead"})
            with flagsaver.flagsaver(mosaic_rs_protocol=None):
                bench_kernels._check_mosaic_rs_protocol()
                self.assertEqual(mosaic_vjp.RS_OPTIONS, {})
        finally:
            mosaic_vjp.RS_OPTIONS.clear()

    def test_mosaic_rs_residuals_refused_where_it_would_not_apply_and_sets_the_switch(self):
        # MOSAIC_GPU.md Sec. 58: --mosaic_rs_residuals only with --mosaic_forward=fused_rs; the
        # value lands in mosaic_vjp.RS_RESIDUALS (read at trace time by the op).
        from absl import app, flags
        from absl.testing import flagsaver
        from pallas_kernels.gated_delta_rule import mosaic_vjp
        if not flags.FLAGS.is_parsed():
            flags.FLAGS.mark_as_parsed()
        base = dict(peers=["mosaic"], ops=["gdn"], mosaic_forward="fused_rs",
                    mosaic_rs_residuals=True)
        refused = (
            (dict(peers=["ours", "jla"]), "applies to peer mosaic only"),
            (dict(mosaic_forward="fused_t0"), "applies to --mosaic_forward=fused_rs only"),
        )
        self._assert_refused_before_running(refused, **base)
        try:
            with flagsaver.flagsaver(**base):
                bench_kernels._check_mosaic_rs_residuals()
                self.assertTrue(mosaic_vjp.RS_RESIDUALS)
            with flagsaver.flagsaver(mosaic_rs_residual_from="state", **base):
                bench_kernels._check_mosaic_rs_residuals()
                self.assertEqual(mosaic_vjp.RS_OPTIONS, {"residual_from": "state"})
            with flagsaver.flagsaver(mosaic_rs_residuals=None):
                bench_kernels._check_mosaic_rs_residuals()
                self.assertFalse(mosaic_vjp.RS_RESIDUALS)
                self.assertEqual(mosaic_vjp.RS_OPTIONS, {})
            with flagsaver.flagsaver(mosaic_rs_residual_from="state"):
                with self.assertRaisesRegex(app.UsageError, "--mosaic_rs_residuals only"):
                    bench_kernels._check_mosaic_rs_residuals()
        finally:
            mosaic_vjp.RS_RESIDUALS = False
            mosaic_vjp.RS_OPTIONS.clear()

    def test_mosaic_rs_pieces_refused_where_it_would_not_apply_and_sets_the_switch(self):
        # MOSAIC_GPU.md Sec. 60: --mosaic_rs_pieces only with --mosaic_forward=fused_rs and
        # sequence pieces on; the value lands in mosaic_vjp.RS_PIECES.
        from absl import app, flags
        from absl.testing import flagsaver
        from pallas_kernels.gated_delta_rule import mosaic_vjp
        if not flags.FLAGS.is_parsed():
            flags.FLAGS.mark_as_parsed()
        base = dict(peers=["mosaic"], ops=["gdn"], mosaic_forward="fused_rs",
                    mosaic_rs_pieces=True)
        refused = (
            (dict(peers=["ours", "jla"]), "applies to peer mosaic only"),
            (dict(ops=["lightning"]), "applies to ops gdn, deltanet only"),
            (dict(mosaic_forward="fused_t0"), "applies to --mosaic_forward=fused_rs only"),
            (dict(mosaic_t0_pieces=False), "--mosaic_t0_pieces=false"),
        )
        for extra, message in refused:
            with flagsaver.flagsaver(**{**base, **extra}):
                with self.assertRaisesRegex(app.UsageError, message):
                    bench_kernels._check_mosaic_rs_pieces()
        try:
            with flagsaver.flagsaver(**base):
                bench_kernels._check_mosaic_rs_pieces()
                self.assertTrue(mosaic_vjp.RS_PIECES)
            with flagsaver.flagsaver(mosaic_rs_pieces=None):
                bench_kernels._check_mosaic_rs_pieces()
                self.assertFalse(mosaic_vjp.RS_PIECES)
        finally:
            mosaic_vjp.RS_PIECES = False

    def test_mosaic_forward_reaches_the_xla_wy_path(self):
        # --mosaic_wy=xla's forward-only GDN call got no forward=, yet its records named it.
        from absl import flags
        from absl.testing import flagsaver
        from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu as gdr_mosaic
        if not flags.FLAGS.is_parsed():
            flags.FLAGS.mark_as_parsed()
        x = np.zeros((1, 64, 1, 64), np.float32)
        with flagsaver.flagsaver(mosaic_wy="xla", mosaic_forward="fused_split"):
            with absltest.mock.patch.object(gdr_mosaic, "gated_delta_rule_fwd_mosaic",
                                            return_value=(x, None)) as fwd:
                bench_kernels._jax_fn("gdn", "mosaic", None)(x, x, x, g=x[..., 0],
                                                             beta=x[..., 0])
        self.assertEqual(fwd.call_args.kwargs["forward"], "fused_split")
        self.assertEqual(fwd.call_args.kwargs["wy_implementation"], "xla")

    def test_mosaic_peer_gets_its_own_table(self):
        rec = dict(op="lightning", shape="S1", pass_="fwd")
        records = [dict(rec, peer="ours", ms=0.9, kernel_ms=0.8, gate_errors={"o": 2e-3}),
                   dict(rec, peer="jla", ms=0.5, kernel_ms=0.45),
                   dict(rec, peer="mosaic", ms=0.7, kernel_ms=0.6, gate_errors={"o": 3e-3})]
        md = bench_kernels.markdown(records, {"date": "2026-12-02", "gpu": "H200"}, "cmd")
        row = [line for line in md.splitlines() if line.startswith("| lightning | S1 | fwd")]
        self.assertLen(row, 2)  # the main table's row and the Mosaic GPU table's row
        cells = [c.strip() for c in row[1].strip("|").split("|")]
        self.assertEqual(cells[3:], ["0.600", "0.800", "0.450", "0.700", "1.33", "0.75"])
        self.assertIn("- gate, lightning (mosaic vs the fp32 reference): o 3.00e-03", md)
        self.assertNotIn("mosaic kernel", bench_kernels.markdown(records[:2], {"date": "d"}, "c"))


class _FlagsParsedTestCase(absltest.TestCase):
    """Tests that read the benchmark's absl flags (under pytest nobody parses them)."""

    def setUp(self):
        super().setUp()
        from absl import flags
        if not flags.FLAGS.is_parsed():
            flags.FLAGS.mark_as_parsed()


class ChannelwiseStatePassTest(_FlagsParsedTestCase):
    """``--channelwise_state_pass``: checked before anything runs, one run of peer ours per
    value for kda / gdn2 (TUNING["state_pass"] set, JAX's caches cleared), a table of its own."""

    def test_bad_values_and_misplaced_flag_refused(self):
        from absl import app
        from absl.testing import flagsaver
        for extra in (dict(channelwise_state_pass=["cuda"]),
                      dict(channelwise_state_pass=["mosaic", "mosaic"]),
                      dict(channelwise_state_pass=["mosaic"], ops=["gdn"]),
                      dict(channelwise_state_pass=["mosaic"], peers=["fla"])):
            flags_ = dict(dict(peers=["ours"], ops=["kda", "gdn2"]), **extra)
            with flagsaver.flagsaver(**flags_):
                with self.assertRaises(app.UsageError, msg=str(extra)):
                    bench_kernels._check_channelwise_state_pass()
        with flagsaver.flagsaver(peers=["ours"], ops=["kda", "gdn"],
                                 channelwise_state_pass=["triton", "mosaic"]):
            bench_kernels._check_channelwise_state_pass()

    def test_variants_set_the_tuning_entry(self):
        from absl.testing import flagsaver

        from pallas_kernels.common import channelwise_gpu
        with flagsaver.flagsaver(channelwise_state_pass=["triton", "mosaic"]):
            self.assertEqual(bench_kernels._state_pass_variants("kda", "ours"),
                             ["triton", "mosaic"])
            self.assertEqual(bench_kernels._state_pass_variants("gdn2", "ours"),
                             ["triton", "mosaic"])
            self.assertEqual(bench_kernels._state_pass_variants("gdn", "ours"), [None])
            self.assertEqual(bench_kernels._state_pass_variants("kda", "fla"), [None])
        with flagsaver.flagsaver(channelwise_state_pass=[]):
            self.assertEqual(bench_kernels._state_pass_variants("kda", "ours"), [None])
        with absltest.mock.patch.dict(channelwise_gpu.TUNING):
            bench_kernels._set_state_pass("mosaic")
            self.assertEqual(channelwise_gpu.TUNING["state_pass"], "mosaic")
            bench_kernels._set_state_pass(None)
            self.assertEqual(channelwise_gpu.TUNING["state_pass"], "mosaic")
        self.assertEqual(channelwise_gpu.TUNING["state_pass"], "mosaic")

    def test_state_pass_table(self):
        rec = dict(op="kda", shape="S1", pass_="fwd", peer="ours", gate=True)
        records = [
            dict(rec, channelwise_state_pass="triton", ms=2.0, kernel_ms=1.7,
                 kernels={"channelwise_forward": 0.436, "channelwise_prepare": 0.5}),
            dict(rec, channelwise_state_pass="mosaic", ms=1.9, kernel_ms=1.5,
                 kernels={"channelwise_state_fwd_mosaic": 0.25, "channelwise_prepare": 0.5}),
            dict(rec, pass_="fwdbwd", channelwise_state_pass="mosaic", ms=5.0, kernel_ms=4.5,
                 kernels={"channelwise_state_fwd_mosaic": 0.3,
                          "channelwise_state_bwd_mosaic": 0.28})]
        md = bench_kernels.markdown(records, {"date": "2026-12-05", "gpu": "H200"}, "cmd")
        rows = [line for line in md.splitlines()
                if re.match(r"\| kda \| S1 \| fwd(bwd)? \| (triton|mosaic) ", line)]
        cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
        self.assertEqual(cells, [["kda", "S1", "fwd", "triton", "1.700", "0.436", "–",
                                  "2.000", "green"],
                                 ["kda", "S1", "fwd", "mosaic", "1.500", "0.250", "–", "1.900",
                                  "green"],
                                 ["kda", "S1", "fwdbwd", "mosaic", "4.500", "0.300", "0.280",
                                  "5.000", "green"]])
        self.assertNotIn("state-pass kernel",
                         bench_kernels.markdown([dict(rec, ms=1.0)], {"date": "d"}, "c"))


class ChannelwiseGradPassTest(_FlagsParsedTestCase):
    """``--channelwise_grad_pass``: checked before anything runs, one run of peer ours per value
    (times each state-pass value) for kda / gdn2 (TUNING["grad_pass"] set), a table of its
    own."""

    def test_bad_values_and_misplaced_flag_refused(self):
        from absl import app
        from absl.testing import flagsaver
        for extra in (dict(channelwise_grad_pass=["cuda"]),
                      dict(channelwise_grad_pass=["mosaic", "mosaic"]),
                      dict(channelwise_grad_pass=["mosaic"], ops=["gdn"]),
                      dict(channelwise_grad_pass=["mosaic"], peers=["fla"]),
                      dict(channelwise_grad_pass=["mosaic"], passes=["fwd"])):
            flags_ = dict(dict(peers=["ours"], ops=["kda", "gdn2"], passes=["fwd", "fwdbwd"]),
                          **extra)
            with flagsaver.flagsaver(**flags_):
                with self.assertRaises(app.UsageError, msg=str(extra)):
                    bench_kernels._check_channelwise_grad_pass()
        with flagsaver.flagsaver(peers=["ours"], ops=["kda", "gdn"], passes=["fwdbwd"],
                                 channelwise_grad_pass=["triton", "mosaic", "mosaic_fused"]):
            bench_kernels._check_channelwise_grad_pass()

    def test_variants_set_the_tuning_entry(self):
        from absl.testing import flagsaver

        from pallas_kernels.common import channelwise_gpu
        with flagsaver.flagsaver(channelwise_state_pass=["mosaic"],
                                 channelwise_grad_pass=["triton", "mosaic"]):
            self.assertEqual(bench_kernels._channelwise_variants("kda", "ours"),
                             [("mosaic", "triton"), ("mosaic", "mosaic")])
            self.assertEqual(bench_kernels._channelwise_variants("gdn", "ours"), [(None, None)])
            self.assertEqual(bench_kernels._channelwise_variants("kda", "jla"), [(None, None)])
        with flagsaver.flagsaver(channelwise_state_pass=[], channelwise_grad_pass=["mosaic"]):
            self.assertEqual(bench_kernels._channelwise_variants("gdn2", "ours"),
                             [(None, "mosaic")])
        with absltest.mock.patch.dict(channelwise_gpu.TUNING):
            bench_kernels._set_grad_pass("mosaic")
            self.assertEqual(channelwise_gpu.TUNING["grad_pass"], "mosaic")
            bench_kernels._set_grad_pass(None)
            self.assertEqual(channelwise_gpu.TUNING["grad_pass"], "mosaic")
        self.assertEqual(channelwise_gpu.TUNING["grad_pass"], "mosaic_fused")

    def test_grad_pass_table(self):
        rec = dict(op="kda", shape="S1", pass_="fwdbwd", peer="ours", gate=True)
        records = [
            dict(rec, channelwise_state_pass="mosaic", channelwise_grad_pass="triton", ms=8.0,
                 kernel_ms=7.2, kernels={"channelwise_grad_blocks": 3.073,
                                         "channelwise_backward_chunk": 1.5}),
            dict(rec, channelwise_grad_pass="mosaic", ms=6.5, kernel_ms=5.9, gate=False,
                 kernels={"channelwise_grad_intra_mosaic": 1.8}),
            dict(rec, channelwise_grad_pass="mosaic_fused", ms=5.5, kernel_ms=4.9,
                 kernels={"channelwise_grad_chunk_mosaic": 2.25})]
        md = bench_kernels.markdown(records, {"date": "2026-12-05", "gpu": "H200"}, "cmd")
        table = md.split("Channelwise grad passes")[1]  # (the state-pass table comes first)
        rows = [line for line in table.splitlines()
                if re.match(r"\| kda \| S1 \| fwdbwd \| (mosaic|default) \| ", line)]
        cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
        self.assertEqual(cells, [["kda", "S1", "fwdbwd", "mosaic", "triton", "7.200", "3.073",
                                  "4.573", "8.000", "green"],
                                 ["kda", "S1", "fwdbwd", "default", "mosaic", "5.900", "1.800",
                                  "1.800", "6.500", "RED"],
                                 ["kda", "S1", "fwdbwd", "default", "mosaic_fused", "4.900",
                                  "2.250", "2.250", "5.500", "green"]])
        self.assertNotIn("grad-pass kernel",
                         bench_kernels.markdown([dict(rec, ms=1.0)], {"date": "d"}, "c"))


class MosaicBackwardTest(_FlagsParsedTestCase):
    """``--mosaic_backward``: checked before anything runs, one run of peer mosaic per value for
    gdn / deltanet (the op's ``backward=``, read by ``_jax_fn`` at trace time), a table of its
    own."""

    def test_bad_values_and_misplaced_flag_refused(self):
        from absl import app
        from absl.testing import flagsaver
        for extra in (dict(mosaic_backward=["merged"]),
                      dict(mosaic_backward=["fused", "fused"]),
                      dict(mosaic_backward=["fused+folded"]),
                      dict(mosaic_backward=["fold"]),
                      dict(mosaic_backward=["fused"], ops=["kda"]),
                      dict(mosaic_backward=["fused"], peers=["ours"]),
                      dict(mosaic_backward=["fused"], passes=["fwd"]),
                      dict(mosaic_backward=["fused"], mosaic_wy="xla")):
            flags_ = dict(dict(peers=["mosaic"], ops=["gdn"], passes=["fwd", "fwdbwd"]),
                          **extra)
            with flagsaver.flagsaver(**flags_):
                with self.assertRaises(app.UsageError, msg=str(extra)):
                    bench_kernels._check_mosaic_backward()
        with flagsaver.flagsaver(peers=["mosaic", "jla"], ops=["gdn", "kda"],
                                 passes=["fwdbwd"], mosaic_backward=["split", "fused"]):
            bench_kernels._check_mosaic_backward()
        with flagsaver.flagsaver(peers=["mosaic"], ops=["gdn"], passes=["fwdbwd"],
                                 mosaic_backward=["fused_ws", "fused_ws+fold", "split+fold"]):
            bench_kernels._check_mosaic_backward()
        # "+t0w" (dh_w="t0", MOSAIC_GPU.md Sec. 51) only after "+fold"
        with flagsaver.flagsaver(peers=["mosaic"], ops=["gdn"], passes=["fwdbwd"],
                                 mosaic_backward=["fused_ws+fold", "fused_ws+fold+t0w"]):
            bench_kernels._check_mosaic_backward()
        with flagsaver.flagsaver(peers=["mosaic"], ops=["gdn"], passes=["fwdbwd"],
                                 mosaic_backward=["fused_ws+t0w"]):
            with self.assertRaises(app.UsageError):
                bench_kernels._check_mosaic_backward()

    def test_variants_and_the_op_call(self):
        from absl.testing import flagsaver

        from pallas_kernels.gated_delta_rule import mosaic_vjp
        with flagsaver.flagsaver(mosaic_backward=["split", "fused"]):
            # (state pass, grad pass, backward, split state layout)
            self.assertEqual(bench_kernels._variants("gdn", "mosaic"),
                             [(None, None, "split", None), (None, None, "fused", None)])
            self.assertEqual(bench_kernels._variants("deltanet", "mosaic")[1][2], "fused")
            self.assertEqual(bench_kernels._variants("gdn", "jla"), [(None, None, None, None)])
            self.assertEqual(bench_kernels._variants("lightning", "mosaic"),
                             [(None, None, None, None)])
        calls = []

        def fake(*args, **kwargs):
            calls.append((kwargs.get("backward"), kwargs.get("dv_local"))
                         + ((kwargs["dh_w"],) if "dh_w" in kwargs else ()))
            return (args[0],)

        with absltest.mock.patch.object(mosaic_vjp, "gated_delta_rule_mosaic", fake):
            fn = bench_kernels._jax_fn("gdn", "mosaic", None)
            try:
                for value in ("fused", "fused_ws+fold", None, "split+fold+t0w"):
                    bench_kernels._set_mosaic_backward(value)
                    fn(np.zeros((1, 64, 1, 64)), None, None, g=None, beta=None)
            finally:
                bench_kernels._set_mosaic_backward(None)
        # A plain value names "separate" (the op's default is "fold" since MOSAIC_GPU.md Sec. 32.2);
        # no value passes neither, so the op's defaults run.
        self.assertEqual(calls, [("fused", "separate"), ("fused_ws", "fold"), (None, None),
                                 ("split", "fold", "t0")])
        self.assertEqual(bench_kernels.mosaic_backward_base("fused_ws+fold+t0w"), "fused_ws")
        self.assertEqual(mosaic_vjp.DEFAULT_DV_LOCAL, "fold")

    def test_backward_table(self):
        rec = dict(op="gdn", shape="S1", pass_="fwdbwd", peer="mosaic", gate=True)
        records = [
            dict(rec, mosaic_backward="split", ms=2.6, kernel_ms=2.42,
                 kernels={"gdn_chunk_grads": 0.528, "gdn_chunk_wy_bwd": 0.819,
                          "gdn_chunk_dv_local": 0.129}),
            dict(rec, mosaic_backward="fused", ms=2.0, kernel_ms=1.8, gate=False,
                 kernels={"gdn_chunk_bwd_fused": 0.6, "gdn_chunk_kkt_inverse_subst_split": 0.091,
                          "gdn_chunk_dv_local": 0.129, "gdn_chunk_delta_dh": 0.392}),
            dict(rec, mosaic_backward="fused_ws+fold", ms=1.9, kernel_ms=1.7,
                 kernels={"gdn_chunk_bwd_fused_ws": 0.5, "gdn_chunk_kkt_inverse": 0.09,
                          "gdn_chunk_delta_dh_fold": 0.45})]
        md = bench_kernels.markdown(records, {"date": "2026-12-05", "gpu": "H200"}, "cmd")
        table = md.split("Mosaic GDN / DeltaNet backwards")[1]
        rows = [line for line in table.splitlines() if line.startswith("| gdn | S1 |")]
        cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
        self.assertEqual(cells, [["gdn", "S1", "fwdbwd", "split", "2.420", "1.347", "0.129",
                                  "2.600", "green"],
                                 ["gdn", "S1", "fwdbwd", "fused", "1.800", "0.691", "0.521",
                                  "2.000", "RED"],
                                 ["gdn", "S1", "fwdbwd", "fused_ws+fold", "1.700", "0.590",
                                  "0.450", "1.900", "green"]])
        self.assertNotIn("Mosaic GDN / DeltaNet backwards",
                         bench_kernels.markdown([dict(rec, ms=1.0)], {"date": "d"}, "c"))


if __name__ == "__main__":
    absltest.main()
