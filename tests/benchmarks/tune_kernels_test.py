"""The kernel launch-parameter sweep (benchmarks/tune_kernels.py): CPU smoke runs in Pallas
interpret mode on a tiny shape (GDN's kernels, and with --op=kda the per-channel-decay kernels of
pallas_kernels/common/channelwise_gpu.py), TUNING restored afterwards, the launch check on traced
programs, and clear errors for bad options."""

import contextlib
import functools
import io
import json
import os
import subprocess
import sys
from unittest import mock

import jax
import jax.numpy as jnp
import pytest
from absl import app
from absl.testing import absltest

from benchmarks import common as bench
from benchmarks import tune_kernels
from pallas_kernels.common import channelwise_gpu
from pallas_kernels.gated_delta_rule import kernel_gpu

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SHAPE = (1, 128, 2, 64)  # B, T, H, D: two kernel chunks
CW_PATH = "pallas_kernels/common/channelwise_gpu.py"


def _kda_launch_table(program, args, tuning):
    """The launch table of ``program`` traced with kda's ``TUNING`` set to ``tuning``; TUNING is
    restored afterwards (and checked to be)."""
    before = dict(channelwise_gpu.TUNING)
    try:
        tune_kernels.set_tuning(tuning, "kda")
        return tune_kernels.launch_table(jax.jit(program).trace(*args).jaxpr)
    finally:
        tune_kernels.set_tuning(before, "kda")
        assert channelwise_gpu.TUNING == before


@pytest.mark.entry
class TuneKernelsTest(absltest.TestCase):

    @pytest.mark.slow  # tuning tool, ~13 s on 2 cores
    def test_tiny_sweep_records_every_configuration_and_restores_tuning(self):
        before = dict(kernel_gpu.TUNING)
        out = os.path.join(self.create_tempdir().full_path, "tune")
        # Four knob values, one compile each at most (the suite's time): block_v=32 is the
        # baseline's effective value (None -> kernel_gpu.auto_block_v: 32 for so few programs),
        # block_v=128 is wider than D = 64, forward_state=8x1 is a kernel the unsplit forward
        # does not run (the same program as the baseline), and
        # backward_chunk=8x1 is a new program that reuses the baseline's forward program. The
        # check runs at the sweep shape, so it reuses the best's compiled programs.
        shape = ",".join(map(str, SHAPE))
        payload = tune_kernels.main([
            "--interpret", f"--shapes={shape}", "--iters=1", "--warmup=0",
            "--knobs=block_v=32/128,forward_state=8x1,backward_chunk=8x1",
            f"--check_shape={shape}",
            "--confirm_rounds=1", "--compile_workers=2", f"--out={out}"])
        self.assertEqual(kernel_gpu.TUNING, before)

        with open(out + ".json") as f:
            saved = json.load(f)
        self.assertEqual(saved["trials"], json.loads(json.dumps(payload["trials"])))
        trials = saved["trials"]
        tried = [(t["knob"], t["value"]) for t in trials]
        self.assertEqual(tried, [(None, None), ("block_v", 32), ("block_v", 128),
                                 ("forward_state", [8, 1]), ("backward_chunk", [8, 1])])
        name = "x".join(map(str, SHAPE))
        by = {(t["knob"], str(t["value"])): t for t in trials}
        for key in ((None, "None"), ("backward_chunk", "[8, 1]")):
            trial = by[key]
            self.assertEqual(trial["status"], bench.OK, trial)
            self.assertGreater(trial["shapes"][name]["fwd_ms"], 0)
            self.assertGreater(trial["shapes"][name]["fwdbwd_ms"], 0)
            self.assertEqual(trial["objective_ms"], trial["shapes"][name]["fwdbwd_ms"])
            self.assertEqual(trial["launch_check"], "ok")
        self.assertEqual(by[("block_v", "32")]["same_as"], 0)
        self.assertFalse(saved["baseline"]["tuning"]["split_forward"])
        self.assertEqual(by[("forward_state", "[8, 1]")]["same_as"], 0)
        self.assertIn("does not fit head dim 64", by[("block_v", "128")]["status"])
        # The backward knob leaves the forward program alone: its fwd time is the baseline's.
        self.assertEqual(by[("backward_chunk", "[8, 1]")]["shapes"][name]["fwd_from"], 0)
        self.assertEqual(by[("backward_chunk", "[8, 1]")]["tuning"],
                         {**saved["baseline"]["tuning"], "backward_chunk": [8, 1]})

        best = saved["best"]
        self.assertIn(best["tuning"], [t["tuning"] for t in trials if t["status"] == bench.OK])
        self.assertEqual(trials[best["trial"]]["tuning"], best["tuning"])
        self.assertEqual(best["objective_ms"],
                         min(t["objective_ms"] for t in trials if t["status"] == bench.OK))
        self.assertEqual(saved["baseline"]["tuning"], tune_kernels._jsonable(before))
        self.assertEqual([d["knob"] for d in saved["descent"]],
                         ["block_v", "forward_state", "backward_chunk"])
        self.assertTrue(saved["check"]["ok"], saved["check"])
        self.assertEqual(saved["check"]["reused_programs"], ["fwd", "fwdbwd"])
        if best["trial"] != 0:  # baseline and best re-timed side by side
            self.assertGreater(saved["confirm"]["objective_speedup"], 0)
        self.assertEqual(set(saved["check"]["errors"]), {"o", "dq", "dk", "dv", "dg", "dbeta"})
        for key in ("jax", "device_kind", "command"):
            self.assertIn(key, saved["environment"])
        with open(out + ".md") as f:
            md = f.read()
        # Interpret-mode timings are noise: no headline speed-up, no literal to paste.
        self.assertIn(tune_kernels.INTERPRET_NOTE, md)
        self.assertNotIn("TUNING = {", md)
        self.assertNotIn("Paste into", md)
        self.assertIn("| 2 | block_v | 128 |", md)
        self.assertIn("same as #0", md)

    def test_tuning_is_restored_when_the_sweep_fails(self):
        before = dict(kernel_gpu.TUNING)

        def failing_run(sweep):
            tune_kernels.set_tuning({**before, "forward": (8, 3), "block_v": 32})
            raise RuntimeError("boom")

        with mock.patch.object(tune_kernels.Sweep, "run", failing_run):
            with self.assertRaisesRegex(RuntimeError, "boom"):
                tune_kernels.main(["--interpret", "--shapes=1,64,1,64"])
        self.assertEqual(kernel_gpu.TUNING, before)

    def test_traced_program_carries_the_tuning(self):
        # Launch parameters are staged only outside interpret mode; tracing (no lowering) the
        # Triton path works on CPU. A fresh trace after set_tuning must carry the new values.
        before = dict(kernel_gpu.TUNING)
        shape = (1, 128, 1, 64)
        args = tune_kernels.make_inputs(shape, seed=0)
        fwdbwd = tune_kernels.programs(tune_kernels._kernel_op)["fwdbwd"]
        tuning = {**before, "backward_state": (8, 3), "block_v": 32, "block_k": 32}
        try:
            tune_kernels.set_tuning(tuning)
            table = tune_kernels.launch_table(jax.jit(fwdbwd).trace(*args).jaxpr)
        finally:
            tune_kernels.set_tuning(before)
        self.assertEqual(table["gdn_backward_state"], [dict(launch=(8, 3), grid=(1, 2))])
        self.assertEqual(table["gdn_backward_chunk"][0]["grid"], (2, 1, 2))
        tune_kernels.check_launches(table, tuning, shape, "fwdbwd")
        with self.assertRaisesRegex(RuntimeError, r"gdn_backward_state traced with launch "
                                                  r"\(8, 3\), expected \(4, 2\)"):
            tune_kernels.check_launches(table, {**tuning, "backward_state": (4, 2)}, shape,
                                        "fwdbwd")
        # The split forward: forward_state (sequential grid) + forward_output (chunks, B*H,
        # V/64) with their own launch parameters, and no forward kernel.
        split = {**tuning, "split_forward": True, "forward_state": (8, 2),
                 "forward_output": (2, 1)}
        try:
            tune_kernels.set_tuning(split)
            split_table = tune_kernels.launch_table(jax.jit(fwdbwd).trace(*args).jaxpr)
        finally:
            tune_kernels.set_tuning(before)
        self.assertNotIn("gdn_forward", split_table)
        self.assertEqual(split_table["gdn_forward_state"], [dict(launch=(8, 2), grid=(1, 2))])
        self.assertEqual(split_table["gdn_forward_output"], [dict(launch=(2, 1), grid=(2, 1, 1))])
        tune_kernels.check_launches(split_table, split, shape, "fwdbwd")
        with self.assertRaisesRegex(RuntimeError, "no pallas_call named gdn_forward "):
            tune_kernels.check_launches(split_table, tuning, shape, "fwd")
        with self.assertRaisesRegex(RuntimeError, "no pallas_call named gdn_forward_state"):
            tune_kernels.check_launches(table, split, shape, "fwd")
        # Two segments: a pseudo-batch of 2 rows of one chunk, the transitions kernel at
        # forward_state's launch over the K + V = 128 columns, the reverse pass run twice.
        cut = {**tuning, "segments": 2, "forward_state": (8, 1)}
        try:
            tune_kernels.set_tuning(cut)
            cut_table = tune_kernels.launch_table(jax.jit(fwdbwd).trace(*args).jaxpr)
        finally:
            tune_kernels.set_tuning(before)
        self.assertEqual(cut_table["gdn_segment_transitions"], [dict(launch=(8, 1), grid=(2, 2))])
        self.assertEqual(cut_table["gdn_prepare"][0]["grid"], (1, 2))
        self.assertEqual(len(cut_table["gdn_backward_state"]), 2)
        tune_kernels.check_launches(cut_table, cut, shape, "fwdbwd")
        with self.assertRaisesRegex(RuntimeError, r"gdn_prepare traced with grid \(2, 1\), "
                                                  r"expected \(1, 2\)"):
            tune_kernels.check_launches(table, cut, shape, "fwd")  # the unsegmented program
        # Launch knobs of kernels a configuration does not run leave its identity alone.
        shapes = {"s": shape}
        self.assertNotEqual(tune_kernels._key(cut, shapes),
                            tune_kernels._key({**cut, "forward_state": (4, 2)}, shapes))
        self.assertEqual(tune_kernels._key(split, shapes),
                         tune_kernels._key({**split, "forward": (8, 3)}, shapes))
        self.assertNotEqual(tune_kernels._key(split, shapes),
                            tune_kernels._key({**split, "forward_output": (8, 3)}, shapes))
        self.assertEqual(tune_kernels._key(tuning, shapes),
                         tune_kernels._key({**tuning, "forward_state": (2, 2)}, shapes))
        self.assertNotEqual(tune_kernels._fwd_key(tuning, shape),
                            tune_kernels._fwd_key(split, shape))
        # A program without this family's kernels (or an unknown jax format) is flagged, not
        # mistaken for a stale trace.
        with self.assertRaises(tune_kernels.LaunchCheckUnavailable):
            tune_kernels.check_launches({"other_kernel": []}, tuning, shape, "fwdbwd")

    @pytest.mark.slow  # tuning tool, ~17 s on 2 cores
    def test_kda_sweep_tunes_the_channelwise_kernels_and_restores_tuning(self):
        before, gdn_before = dict(channelwise_gpu.TUNING), dict(kernel_gpu.TUNING)
        out = os.path.join(self.create_tempdir().full_path, "tune")
        # Two values and no compile beyond the baseline's (the suite's time): block_v=64 is the
        # baseline's effective width (None -> min(D, 64), as channelwise_gpu._config resolves
        # it), block_v=128 is wider than D = 64. The check at the sweep shape reuses the
        # baseline's compiled programs and compares against kda's fp32 reference.
        # At H = 1 the intra kernel runs one head per program whatever the cap (>= 1), so
        # intra_token_heads=2 and 16 change nothing: 'same as' the baseline, too; and so does
        # the --start cap of 8, which is then no trial of its own.
        shape = "1,128,1,64"
        start = {**before, "intra_token_heads": 8}
        payload = tune_kernels.main([
            "--op=kda", "--interpret", f"--shapes={shape}", "--iters=1", "--warmup=0",
            "--knobs=block_v=64/128,intra_token_heads=2/16",
            '--start={"intra_token_heads": 8}', f"--check_shape={shape}",
            "--confirm_rounds=1", "--compile_workers=2", f"--out={out}"])
        self.assertEqual(channelwise_gpu.TUNING, before)
        self.assertEqual(kernel_gpu.TUNING, gdn_before)

        with open(out + ".json") as f:
            saved = json.load(f)
        self.assertEqual(saved["trials"], json.loads(json.dumps(payload["trials"])))
        self.assertEqual((saved["settings"]["op"], saved["settings"]["module"]), ("kda", CW_PATH))
        trials = saved["trials"]
        self.assertEqual([(t["knob"], t["value"]) for t in trials],
                         [(None, None), ("block_v", 64), ("block_v", 128),
                          ("intra_token_heads", 2), ("intra_token_heads", 16)])
        base = trials[0]
        self.assertEqual(base["status"], bench.OK, base)
        self.assertEqual(base["launch_check"], "ok")  # channelwise_* names and grids
        self.assertGreater(base["shapes"]["1x128x1x64"]["fwd_ms"], 0)
        self.assertEqual(base["objective_ms"], base["shapes"]["1x128x1x64"]["fwdbwd_ms"])
        self.assertEqual(trials[1]["same_as"], 0)
        self.assertIn("block_v=128 does not fit head dim 64", trials[2]["status"])
        self.assertEqual([t.get("same_as") for t in trials[3:]], [0, 0])
        self.assertEqual(saved["baseline"]["tuning"], tune_kernels._jsonable(before))
        self.assertEqual(saved["start"], tune_kernels._jsonable(start))
        self.assertIn("intra_tf32", saved["baseline"]["tuning"])
        self.assertNotIn("split_forward", saved["baseline"]["tuning"])
        self.assertEqual(saved["best"]["trial"], 0)
        self.assertIsNone(saved["confirm"])  # the best is the baseline
        self.assertTrue(saved["check"]["ok"], saved["check"])
        self.assertEqual(saved["check"]["reused_programs"], ["fwd", "fwdbwd"])
        self.assertEqual(set(saved["check"]["errors"]), {"o", "dq", "dk", "dv", "dg", "dbeta"})
        with open(out + ".md") as f:
            md = f.read()
        self.assertTrue(md.startswith("# Launch-parameter sweep: per-channel-decay Pallas GPU "
                                      f"kernels, KDA ({CW_PATH})\n"), md[:200])
        self.assertIn(tune_kernels.INTERPRET_NOTE, md)
        self.assertIn("| 2 | block_v | 128 |", md)
        # Outside interpret mode the literal names gdn2's module and pastes back there.
        saved["settings"]["interpret"] = False
        self.assertIn(f"Paste into `{CW_PATH}`:", tune_kernels.markdown(saved))
        scope = {}
        exec(saved["best"]["python"], scope)  # noqa: S102 - our own output
        self.assertEqual(scope["TUNING"], before)

    def test_traced_channelwise_program_carries_the_tuning(self):
        # As test_traced_program_carries_the_tuning, for common/channelwise_gpu.py (trace only).
        before = dict(channelwise_gpu.TUNING)
        shape = (1, 128, 1, 64)
        args = tune_kernels.make_inputs(shape, seed=0, op="kda")
        self.assertEqual([a.shape for a in args],
                         [shape] * 4 + [shape[:3], shape])  # q, k, v, g per channel, beta, do
        fwdbwd = tune_kernels.programs(tune_kernels.KERNEL_OPS["kda"])["fwdbwd"]
        tuning = {**before, "backward_state": (8, 3), "prepare": (2, 1), "block_v": 32,
                  "block_k": 32, "grad_blocks": (8, 2), "intra_token": (2, 2), "gamma": (2, 3),
                  "wu": (8, 1)}
        table = _kda_launch_table(fwdbwd, args, tuning)
        self.assertEqual(sorted(table), ["channelwise_" + k for k in sorted(
            tune_kernels.CW_KERNELS)])
        self.assertEqual(table["channelwise_backward_state"], [dict(launch=(8, 3), grid=(1, 2))])
        self.assertEqual(table["channelwise_prepare"], [dict(launch=(2, 1), grid=(2, 1))])
        self.assertEqual(table["channelwise_wu"], [dict(launch=(8, 1), grid=(2, 1))])
        self.assertEqual(table["channelwise_gamma"], [dict(launch=(2, 3), grid=(2, 1))])
        self.assertEqual(table["channelwise_grad_blocks"], [dict(launch=(8, 2), grid=(2, 1, 4))])
        # The intra kernel: a program per token and head group (B * T, H / 1), intra_token's
        # launch.
        self.assertEqual(table["channelwise_intra"], [dict(launch=(2, 2), grid=(128, 1))])
        self.assertEqual(table["channelwise_forward"][0]["grid"], (1, 2))
        self.assertEqual(table["channelwise_backward_chunk"][0]["grid"], (2, 1, 2))
        tune_kernels.check_launches(table, tuning, shape, "fwdbwd", op="kda")
        # Each mismatch between the traced program and the TUNING checked against, named.
        mismatches = [
            ({"backward_state": (4, 2)}, "fwdbwd",
             r"channelwise_backward_state traced with launch \(8, 3\), expected \(4, 2\)"),
            ({"block_k": None}, "fwdbwd",
             r"channelwise_backward_chunk traced with grid \(2, 1, 2\), expected \(2, 1, 1\)"),
            ({"grad_blocks": (4, 1)}, "fwdbwd",
             r"^fwdbwd: channelwise_grad_blocks traced with launch \(8, 2\), expected \(4, 1\)"),
            ({"gamma": (4, 1)}, "fwd",
             r"^fwd: channelwise_gamma traced with launch \(2, 3\), expected \(4, 1\)"),
            ({"intra_token": (8, 8)}, "fwdbwd",
             r"channelwise_intra traced with launch \(2, 2\), expected \(8, 8\)"),
            ({"wu": (4, 3)}, "fwd",
             r"^fwd: channelwise_wu traced with launch \(8, 1\), expected \(4, 3\)"),
        ]
        for override, pass_, message in mismatches:
            with self.subTest(override=override):
                with self.assertRaisesRegex(RuntimeError, message):
                    tune_kernels.check_launches(table, {**tuning, **override}, shape, pass_,
                                                op="kda")
        # At H = 1 every cap >= 1 resolves to one head per program: the same program.
        tune_kernels.check_launches(table, {**tuning, "intra_token_heads": 16}, shape, "fwdbwd",
                                    op="kda")
        # A kernel missing from the traced program.
        partial = {k: v for k, v in table.items() if k != "channelwise_grad_blocks"}
        with self.assertRaisesRegex(RuntimeError, "^fwdbwd: no pallas_call named "
                                                  "channelwise_grad_blocks in the traced "
                                                  "program"):
            tune_kernels.check_launches(partial, tuning, shape, "fwdbwd", op="kda")
        tune_kernels.check_launches(partial, tuning, shape, "fwd", op="kda")
        # Each family's check looks for its own kernels only.
        with self.assertRaises(tune_kernels.LaunchCheckUnavailable):
            tune_kernels.check_launches(table, kernel_gpu.TUNING, shape, "fwdbwd")
        # The backward knobs leave the forward program alone; block_k, prepare_k and intra_tf32
        # do not (gamma and wu loop over key blocks, prepare runs the intra-chunk products over
        # key blocks of prepare_k).
        fwd_key = functools.partial(tune_kernels._fwd_key, shape=shape, op="gdn2")
        key = functools.partial(tune_kernels._key, shapes={"s": shape}, op="kda")
        for knob, value in (("backward_chunk", (8, 2)), ("backward_state", (2, 1)),
                            ("grad_blocks", (2, 1))):
            self.assertEqual(fwd_key(tuning), fwd_key({**tuning, knob: value}), knob)
            self.assertNotEqual(key(tuning), key({**tuning, knob: value}), knob)
        for knob, value in (("block_k", 64), ("intra_tf32", False), ("gamma", (8, 1)),
                            ("intra_token", (8, 1)), ("prepare", (8, 1)), ("wu", (2, 1)),
                            ("prepare_k", 32), ("forward", (8, 1))):
            self.assertNotEqual(fwd_key(tuning), fwd_key({**tuning, knob: value}), knob)
        self.assertEqual(fwd_key({**tuning, "block_v": None}), fwd_key({**tuning, "block_v": 64}))
        self.assertEqual(fwd_key(tuning), fwd_key({**tuning, "intra_token_heads": 16}))
        self.assertEqual(key(tuning), key({**tuning, "intra_token_heads": 16}))
        # GDN-2's inputs: per-channel g and erase gate b [B, T, H, K], write gate w [B, T, H, V].
        args2 = tune_kernels.make_inputs(shape, seed=0, op="gdn2")
        self.assertEqual([a.shape for a in args2], [shape] * 7)
        fwd2 = tune_kernels.programs(tune_kernels.KERNEL_OPS["gdn2"])["fwd"]
        table2 = tune_kernels.launch_table(jax.jit(fwd2).trace(*args2).jaxpr)
        self.assertEqual(sorted(table2), ["channelwise_forward", "channelwise_gamma",
                                          "channelwise_intra", "channelwise_prepare",
                                          "channelwise_wu"])
        tune_kernels.check_launches(table2, before, shape, "fwd", op="gdn2")

    def test_intra_heads_launch_and_grid(self):
        # H = 6 with a cap of 4: two heads per program (channelwise_gpu.intra_heads), so the
        # intra kernel runs a (B * T, H / 2) grid with intra_token's launch.
        before = dict(channelwise_gpu.TUNING)
        shape = (1, 128, 6, 64)
        tuning = {**before, "intra_token_heads": 4, "intra_token": (8, 1)}
        eff = tune_kernels.effective(tuning, shape, "kda")
        self.assertEqual((eff["intra_token_heads"], eff["intra_token"]), (2, (8, 1)))
        args = tune_kernels.make_inputs(shape, seed=0, op="kda")
        fwd = tune_kernels.programs(tune_kernels.KERNEL_OPS["kda"])["fwd"]
        table = _kda_launch_table(fwd, args, tuning)
        self.assertEqual(table["channelwise_intra"], [dict(launch=(8, 1), grid=(128, 3))])
        tune_kernels.check_launches(table, tuning, shape, "fwd", op="kda")
        # A cap that resolves alike is the same program; another launch or head group is not.
        tune_kernels.check_launches(table, {**tuning, "intra_token_heads": 2}, shape, "fwd",
                                    op="kda")
        with self.assertRaisesRegex(RuntimeError, r"fwd: channelwise_intra traced with launch "
                                                  r"\(8, 1\), expected \(4, 3\)"):
            tune_kernels.check_launches(table, {**tuning, "intra_token": (4, 3)}, shape, "fwd",
                                        op="kda")
        with self.assertRaisesRegex(RuntimeError, r"fwd: channelwise_intra traced with grid "
                                                  r"\(128, 3\), expected \(128, 6\)"):
            tune_kernels.check_launches(table, {**tuning, "intra_token_heads": 1}, shape, "fwd",
                                        op="kda")

    def test_effective_resolves_the_intra_heads(self):
        base = dict(channelwise_gpu.TUNING, intra_token=(8, 2))

        def eff(cap, heads, dim=64):
            e = tune_kernels.effective({**base, "intra_token_heads": cap}, (1, 128, heads, dim),
                                       "gdn2")
            return e["intra_token_heads"], e["intra_token"]

        # The largest power of two dividing H and at most the cap.
        self.assertEqual(eff(4, 6), (2, (8, 2)))
        self.assertEqual(eff(4, 16), (4, (8, 2)))
        self.assertEqual(eff(5, 16), (4, (8, 2)))
        self.assertEqual(eff(16, 16), (16, (8, 2)))
        self.assertEqual(eff(8, 3), (1, (8, 2)))
        with self.assertRaisesRegex(ValueError, r'TUNING\["intra_token_heads"\].*got 0$'):
            eff(0, 16)
        with mock.patch.dict(base, intra_token={64: (4, 3), 128: (8, 1)}):
            self.assertEqual(eff(2, 2, 128), (2, (8, 1)))
        # Caps that resolve alike are one configuration; at H = 16 they are not.
        key = functools.partial(tune_kernels._key, op="kda")
        h6, h16 = {"s": (1, 128, 6, 64)}, {"s": (1, 128, 16, 64)}
        self.assertEqual(key({**base, "intra_token_heads": 4}, h6),
                         key({**base, "intra_token_heads": 8}, h6))
        self.assertNotEqual(key({**base, "intra_token_heads": 4}, h16),
                            key({**base, "intra_token_heads": 8}, h16))
        self.assertNotEqual(key({**base, "intra_token_heads": 4}, h6),
                            key({**base, "intra_token_heads": 4, "intra_token": (4, 1)}, h6))
        # The effective values are exactly the op's knobs.
        self.assertEqual(set(tune_kernels.effective(base, (1, 128, 6, 64), "kda")),
                         set(tune_kernels.CW_KNOBS))

    def test_channelwise_kernels_and_grids(self):
        # Every configuration runs the same kernels: five in the forward, eight in all.
        shape = (2, 200, 3, 64)  # T = 200: 4 chunks; B * H = 6 rows; H = 3: one head per program
        eff = tune_kernels.effective(channelwise_gpu.TUNING, shape, "kda")
        self.assertEqual(tune_kernels.channelwise_pass_kernels("fwd"),
                         ("gamma", "intra", "prepare", "wu", "forward"))
        self.assertEqual(tune_kernels.channelwise_pass_kernels("fwdbwd"),
                         ("gamma", "intra", "prepare", "wu", "forward", "grad_blocks",
                          "backward_state", "backward_chunk"))
        self.assertEqual(tune_kernels._channelwise_grids(eff, shape),
                         {"gamma": (4, 6), "intra": (2 * 4 * 64, 3), "prepare": (4, 6),
                          "wu": (4, 6), "forward": (6, 1), "grad_blocks": (4, 6, 4),
                          "backward_state": (6, 1), "backward_chunk": (4, 6, 1)})
        self.assertEqual(set(tune_kernels.CW_FWD_KNOBS) - {"intra_tf32", "intra_token_heads"}
                         - set(tune_kernels.BLOCK_KNOBS),
                         {"gamma", "intra_token", "prepare_k", "prepare", "wu", "forward"})
        self.assertEqual(set(tune_kernels.CW_KNOBS) - set(tune_kernels.CW_FWD_KNOBS),
                         {"grad_blocks", "backward_state", "backward_chunk"})
        with mock.patch.dict(channelwise_gpu.TUNING, grad_blocks={64: (4, 3), 128: (8, 1)}):
            eff = tune_kernels.effective(channelwise_gpu.TUNING, shape, "kda")
        self.assertEqual(eff["grad_blocks"], (4, 3))
        self.assertEqual(tune_kernels.parse_knobs("gamma=2x1,grad_blocks", "kda"),
                         {"gamma": [(2, 1)],
                          "grad_blocks": list(tune_kernels.CW_DEFAULT_VALUES["grad_blocks"])})

    def test_prepare_and_wu_knobs(self):
        # One prepare kernel (16 x 16 sub-blocks) with its launch and the key-block width
        # prepare_k of its products (None: block_k), then the wu kernel with a launch of its own.
        before = dict(channelwise_gpu.TUNING)
        self.assertEqual(
            tune_kernels.parse_knobs("prepare_k=16/32,wu=4x3/8x1", "kda"),
            {"prepare_k": [16, 32], "wu": [(4, 3), (8, 1)]})
        self.assertEqual(tune_kernels.parse_knobs("prepare_k=None/64", "gdn2"),
                         {"prepare_k": [None, 64]})
        # The default sweeps: prepare_k 16/32/64; prepare from 1 warp (its best is 1x3).
        self.assertEqual(tune_kernels.parse_knobs("prepare_k,prepare,wu", "kda"),
                         {"prepare_k": [16, 32, 64],
                          "prepare": [(w, s) for w in (1, 2, 4) for s in (1, 2, 3)],
                          "wu": [(w, s) for w in (4, 8) for s in (1, 2, 3)]})
        for bad in ("48", "8"):
            with self.assertRaisesRegex(app.UsageError, r"^--knobs: bad value in "
                                                        rf"'prepare_k=16/{bad}' \({bad} is not a "
                                                        r"power of two >= 16\); each value is a "
                                                        r"power of two >= 16 or None$"):
                tune_kernels.parse_knobs(f"prepare_k=16/{bad}", "kda")
        with self.assertRaisesRegex(app.UsageError, "bad value in 'wu=4'.*each value is WxS"):
            tune_kernels.parse_knobs("wu=4", "kda")
        for knob in ("prepare_k", "wu=4x3"):
            with self.assertRaisesRegex(app.UsageError, f"'{knob.split('=')[0]}' is a knob of "
                                                        "--op=kda/gdn2 only"):
                tune_kernels.parse_knobs(knob)
        # The prepare forms are gone with their knobs.
        for knob in ("prepare_form", "prepare_form=blocks", "prepare_blocks",
                     "prepare_blocks_k=32"):
            with self.assertRaisesRegex(app.UsageError, r"^--knobs: unknown knob "
                                                        f"'{knob.split('=')[0]}'; choose from "):
                tune_kernels.parse_knobs(knob, "kda")
        with self.assertRaisesRegex(app.UsageError, "^--start: unknown knob 'prepare_blocks'"):
            tune_kernels.parse_start('{"prepare_blocks": [2, 1]}', channelwise_gpu.TUNING, "kda")
        self.assertEqual(tune_kernels.parse_start('{"prepare_k": 32, "wu": [8, 1], "prepare": '
                                                  '[2, 3]}', channelwise_gpu.TUNING, "kda"),
                         {**before, "prepare_k": 32, "wu": (8, 1), "prepare": (2, 3)})
        self.assertEqual(tune_kernels.parse_start('{"prepare_k": null}', channelwise_gpu.TUNING,
                                                  "gdn2"),
                         {**before, "prepare_k": None})
        with self.assertRaisesRegex(app.UsageError, r"^--start: bad value 24 for 'prepare_k' "
                                                    r"\(24 is not a power of two >= 16\)$"):
            tune_kernels.parse_start('{"prepare_k": 24}', channelwise_gpu.TUNING, "kda")
        with self.assertRaisesRegex(app.UsageError, "^--start: bad value 4 for 'wu'"):
            tune_kernels.parse_start('{"wu": 4}', channelwise_gpu.TUNING, "kda")
        # The literal pastes back, in the module's key order.
        literal = tune_kernels.tuning_literal({**before, "prepare_k": 32, "wu": [8, 1]}, "kda")
        scope = {}
        exec(literal, scope)  # noqa: S102 - our own output
        self.assertEqual(scope["TUNING"], {**before, "prepare_k": 32, "wu": (8, 1)})
        self.assertEqual(list(scope["TUNING"]), list(before))

        shape = (1, 128, 1, 64)
        tuning = {**before, "block_k": 32, "prepare_k": None, "prepare": (2, 3), "wu": (8, 1)}
        eff = tune_kernels.effective(tuning, shape, "kda")
        self.assertEqual([eff[k] for k in ("block_k", "prepare_k", "prepare", "wu")],
                         [32, 32, (2, 3), (8, 1)])
        self.assertEqual(tune_kernels.effective({**tuning, "prepare_k": 16}, shape,
                                                "kda")["prepare_k"], 16)
        # A None prepare_k is the same program as the block_k it resolves to.
        key = functools.partial(tune_kernels._key, shapes={"s": shape}, op="kda")
        fwd_key = functools.partial(tune_kernels._fwd_key, shape=shape, op="kda")
        self.assertEqual(key(tuning), key({**tuning, "prepare_k": 32}))
        self.assertNotEqual(key(tuning), key({**tuning, "prepare_k": 16}))
        self.assertNotEqual(fwd_key(tuning), fwd_key({**tuning, "prepare_k": 64}))
        self.assertNotEqual(fwd_key(tuning), fwd_key({**tuning, "wu": (4, 3)}))
        self.assertEqual(tune_kernels.invalid_reason({**tuning, "prepare_k": 128},
                                                     {"s": shape}, "kda"),
                         "error: prepare_k=128 does not fit head dim 64 (s)")
        self.assertIsNone(tune_kernels.invalid_reason({**tuning, "prepare_k": 64}, {"s": shape},
                                                      "kda"))
        # The traced forward runs prepare and wu with their own launches, each on (N, B * H).
        args = tune_kernels.make_inputs(shape, seed=0, op="kda")
        fwd = tune_kernels.programs(tune_kernels.KERNEL_OPS["kda"])["fwd"]
        table = _kda_launch_table(fwd, args, tuning)
        self.assertEqual(table["channelwise_prepare"], [dict(launch=(2, 3), grid=(2, 1))])
        self.assertEqual(table["channelwise_wu"], [dict(launch=(8, 1), grid=(2, 1))])
        tune_kernels.check_launches(table, tuning, shape, "fwd", op="kda")
        with self.assertRaisesRegex(RuntimeError, r"^fwd: channelwise_wu traced with launch "
                                                  r"\(8, 1\), expected \(4, 3\)"):
            tune_kernels.check_launches(table, {**tuning, "wu": (4, 3)}, shape, "fwd", op="kda")
        with self.assertRaisesRegex(RuntimeError, r"^fwd: channelwise_prepare traced with launch "
                                                  r"\(2, 3\), expected \(1, 3\)"):
            tune_kernels.check_launches(table, {**tuning, "prepare": (1, 3)}, shape, "fwd",
                                        op="kda")
        wrong_grid = {**table, "channelwise_wu": [dict(launch=(8, 1), grid=(2, 2))]}
        with self.assertRaisesRegex(RuntimeError, r"^fwd: channelwise_wu traced with grid "
                                                  r"\(2, 2\), expected \(2, 1\)"):
            tune_kernels.check_launches(wrong_grid, tuning, shape, "fwd", op="kda")
        no_wu = {k: v for k, v in table.items() if k != "channelwise_wu"}
        with self.assertRaisesRegex(RuntimeError, "^fwd: no pallas_call named channelwise_wu "):
            tune_kernels.check_launches(no_wu, tuning, shape, "fwd", op="kda")

    def test_gdn_only_knobs_are_refused_for_the_channelwise_ops(self):
        with self.assertRaisesRegex(
                app.UsageError, r"^--knobs: 'split_forward' is a knob of --op=gdn only "
                r"\(pallas_kernels/gated_delta_rule/kernel_gpu.py\), not of --op=kda "
                r"\(pallas_kernels/common/channelwise_gpu.py\); choose from intra_tf32, "
                r"intra_token_heads, block_v, block_k, prepare_k, gamma, intra_token, prepare, "
                r"wu, forward, grad_blocks, backward_state, backward_chunk$"):
            tune_kernels.main(["--op=kda", "--knobs=block_v,split_forward", "--interpret"])
        for knob in ("segments", "forward_state", "forward_output=4x1"):
            with self.assertRaisesRegex(app.UsageError, "is a knob of --op=gdn only"):
                tune_kernels.parse_knobs(knob, "gdn2")
        with self.assertRaisesRegex(app.UsageError, "^--start: 'forward_state' is a knob of "
                                                    "--op=gdn only"):
            tune_kernels.parse_start('{"forward_state": [4, 2]}', channelwise_gpu.TUNING, "kda")
        with self.assertRaisesRegex(app.UsageError, "'intra_tf32' is a knob of --op=kda/gdn2 "
                                                    "only"):
            tune_kernels.parse_knobs("intra_tf32")
        with self.assertRaisesRegex(app.UsageError, "unknown knob 'block_x'; choose from "
                                                    "intra_tf32, intra_token_heads, block_v"):
            tune_kernels.parse_knobs("block_x", "kda")
        # The forms that lost on the H200 are gone with their knobs (and the two-loop intra_grad
        # before them; the prepare forms' knobs: test_prepare_and_wu_knobs).
        for knob in ("intra_levels", "prepare_products", "products", "split_grads",
                     "intra_grad", "gamma_kernel", "intra", "intra_grad_rows"):
            with self.assertRaisesRegex(app.UsageError, f"unknown knob '{knob}'"):
                tune_kernels.parse_knobs(knob, "kda")
        with self.assertRaisesRegex(app.UsageError, "--start: unknown knob 'split_grads'"):
            tune_kernels.parse_start('{"split_grads": true}', channelwise_gpu.TUNING, "kda")
        self.assertEqual(list(tune_kernels.parse_knobs(None, "kda")),
                         ["intra_tf32", "intra_token_heads", "block_v", "block_k", "prepare_k",
                          "gamma", "intra_token", "prepare", "wu", "forward", "grad_blocks",
                          "backward_state", "backward_chunk"])
        self.assertCountEqual(tune_kernels.CW_KNOBS + tune_kernels.CW_NOT_KNOBS,
                              channelwise_gpu.TUNING)
        self.assertEqual(tune_kernels.parse_knobs("intra_token_heads,intra_token", "kda"),
                         {"intra_token_heads": [1, 2, 4, 8, 16],
                          "intra_token": list(tune_kernels.CW_DEFAULT_VALUES["intra_token"])})
        self.assertEqual(tune_kernels.parse_knobs("intra_token_heads=1/2/8,intra_token=8x2",
                                                  "gdn2"),
                         {"intra_token_heads": [1, 2, 8], "intra_token": [(8, 2)]})
        for bad, why in (("0", "intra_token_heads: 0 is not >= 1"),
                         ("-1", "intra_token_heads: -1 is not >= 1"),
                         ("two", "intra_token_heads: 'two' is not an int"),
                         ("true", "intra_token_heads: 'true' is not an int")):
            with self.assertRaisesRegex(
                    app.UsageError, rf"^--knobs: bad value in 'intra_token_heads=4/{bad}' "
                    rf"\({why}\); each value is an int >= 1$"):
                tune_kernels.parse_knobs(f"intra_token_heads=4/{bad}", "kda")
        self.assertEqual(tune_kernels.parse_start('{"intra_token_heads": 8, "intra_token": '
                                                  '[8, 2]}', channelwise_gpu.TUNING, "gdn2"),
                         {**channelwise_gpu.TUNING, "intra_token_heads": 8,
                          "intra_token": (8, 2)})
        with self.assertRaisesRegex(app.UsageError, r"^--start: bad value 0 for "
                                                    r"'intra_token_heads' \(intra_token_heads: "
                                                    r"0 is not >= 1\)$"):
            tune_kernels.parse_start('{"intra_token_heads": 0}', channelwise_gpu.TUNING, "kda")
        with self.assertRaisesRegex(app.UsageError, "'intra_token_heads' is a knob of "
                                                    "--op=kda/gdn2 only"):
            tune_kernels.parse_knobs("intra_token_heads=2")
        # grad_blocks and gamma are launches.
        self.assertEqual(tune_kernels.parse_knobs("grad_blocks=8x1/2x2,gamma=4x1", "gdn2"),
                         {"grad_blocks": [(8, 1), (2, 2)], "gamma": [(4, 1)]})
        with self.assertRaisesRegex(app.UsageError, "bad value in 'grad_blocks=4'.*each value "
                                                    "is WxS"):
            tune_kernels.parse_knobs("grad_blocks=4", "kda")
        self.assertEqual(tune_kernels.parse_start('{"grad_blocks": [4, 2], "gamma": [2, 1]}',
                                                  channelwise_gpu.TUNING, "gdn2"),
                         {**channelwise_gpu.TUNING, "grad_blocks": (4, 2), "gamma": (2, 1)})
        with self.assertRaisesRegex(app.UsageError, "'grad_blocks' is a knob of --op=kda/gdn2 "
                                                    "only"):
            tune_kernels.parse_knobs("grad_blocks")
        with self.assertRaisesRegex(app.UsageError, "^--start: 'grad_blocks' is a knob of "
                                                    "--op=kda/gdn2 only"):
            tune_kernels.parse_start('{"grad_blocks": [4, 1]}', kernel_gpu.TUNING)
        self.assertEqual(list(tune_kernels.parse_knobs(None)), list(tune_kernels.KNOBS))
        self.assertEqual(tune_kernels.parse_knobs("intra_tf32=false,backward_chunk=8x2", "gdn2"),
                         {"intra_tf32": [False], "backward_chunk": [(8, 2)]})
        self.assertEqual(tune_kernels.parse_start('{"prepare": [8, 1], "block_k": null}',
                                                  channelwise_gpu.TUNING, "kda"),
                         {**channelwise_gpu.TUNING, "prepare": (8, 1), "block_k": None})
        self.assertEqual(tune_kernels.parse_flags(["--op=gdn2", "--interpret"]).op, "gdn2")
        with self.assertRaisesRegex(app.UsageError, "--op"):
            tune_kernels.parse_flags(["--op=gla", "--interpret"])
        # Launch entries per head dim resolve as in the kernels (pallas_gpu.resolve_launch).
        with mock.patch.dict(channelwise_gpu.TUNING, {"forward": {64: (8, 1), 128: (4, 2)}}):
            eff = tune_kernels.effective(channelwise_gpu.TUNING, (1, 128, 1, 64), "kda")
        self.assertEqual(eff["forward"], (8, 1))

    def test_bad_options_give_a_clear_error(self):
        with self.assertRaisesRegex(app.UsageError, "--knobs: unknown knob 'block_x'; choose "
                                                    "from split_forward, segments, block_v, "
                                                    "block_k, prepare, forward"):
            tune_kernels.main(["--knobs=block_v,block_x", "--interpret"])
        with self.assertRaisesRegex(app.UsageError, "bad value in 'forward=4-2'"):
            tune_kernels.parse_knobs("forward=4-2")
        with self.assertRaisesRegex(app.UsageError, "--start: unknown knob 'warps'"):
            tune_kernels.parse_start('{"warps": 4}', kernel_gpu.TUNING)
        with self.assertRaisesRegex(app.UsageError, "--shapes: 'S3' is neither"):
            tune_kernels.parse_shapes("S3")
        self.assertEqual(tune_kernels.parse_shapes("S1,1,128,2,64"),
                         {"S1": (8, 4096, 16, 128), "1x128x2x64": (1, 128, 2, 64)})
        self.assertEqual(tune_kernels.parse_knobs("block_k=None/64,prepare=8x2"),
                         {"block_k": [None, 64], "prepare": [(8, 2)]})
        self.assertEqual(tune_kernels.parse_start('{"forward": [8, 2]}', {"forward": (4, 2)}),
                         {"forward": (8, 2)})
        self.assertEqual(tune_kernels.parse_knobs("split_forward,forward_output=8x1"),
                         {"split_forward": [False, True], "forward_output": [(8, 1)]})
        self.assertEqual(list(tune_kernels.parse_knobs(tune_kernels.KNOBS[0] + ",block_v")),
                         ["split_forward", "block_v"])  # tried first by default
        self.assertEqual(tune_kernels.parse_start('{"split_forward": true}', {}),
                         {"split_forward": True})
        with self.assertRaisesRegex(app.UsageError, "each value is True or False"):
            tune_kernels.parse_knobs("split_forward=yes")
        # The binary: one line on stderr, no traceback.
        result = subprocess.run(
            [sys.executable, os.path.join(ROOT, "benchmarks", "tune_kernels.py"),
             "--knobs=block_x"], capture_output=True, text=True, cwd=ROOT, timeout=120)
        self.assertEqual(result.returncode, 2)
        self.assertIn("error: --knobs: unknown knob 'block_x'", result.stderr)
        self.assertNotIn("Traceback", result.stderr)

    def test_gpu_kernels_need_a_gpu_backend_or_interpret(self):
        with mock.patch.object(tune_kernels.jax, "default_backend", return_value="cpu"), \
                mock.patch.object(tune_kernels.Sweep, "__init__", side_effect=AssertionError):
            with self.assertRaisesRegex(
                    app.UsageError, r"^the Pallas GPU kernels need a GPU backend \(found cpu\); "
                                    r"pass --interpret for a CPU smoke run$"):
                tune_kernels.main(["--shapes=1,64,1,64"])
            stderr = io.StringIO()
            with mock.patch.object(sys, "argv", ["tune_kernels.py", "--shapes=1,64,1,64"]), \
                    contextlib.redirect_stderr(stderr), self.assertRaises(SystemExit) as cm:
                tune_kernels._cli()
        self.assertEqual(cm.exception.code, 2)
        self.assertEqual(stderr.getvalue(), "error: the Pallas GPU kernels need a GPU backend "
                         "(found cpu); pass --interpret for a CPU smoke run\n")
        # On a GPU backend, or with --interpret, the sweep starts.
        for backend, argv in (("gpu", []), ("cpu", ["--interpret"])):
            with mock.patch.object(tune_kernels.jax, "default_backend", return_value=backend), \
                    mock.patch.object(tune_kernels.Sweep, "run", return_value={"ran": True}):
                self.assertEqual(tune_kernels.main(["--shapes=1,64,1,64"] + argv), {"ran": True})

    def test_check_shape_errors_name_their_flag(self):
        with self.assertRaisesRegex(app.UsageError, "^--check_shape: 'abc' is neither"):
            tune_kernels.parse_flags(["--check_shape=abc", "--interpret"])
        with self.assertRaisesRegex(app.UsageError, "^--check_shape: need four integers"):
            tune_kernels.parse_flags(["--check_shape=1x64", "--interpret"])
        with self.assertRaisesRegex(app.UsageError, "^--shapes: 'abc' is neither"):
            tune_kernels.parse_flags(["--shapes=abc", "--interpret"])

    def _fake_sweep(self, argv, status=bench.OK):
        """Runs the sweep (through ``_cli``) with every measurement faked as ``status``, and
        no correctness check; returns ``(exit code or None, stderr, json, markdown)``."""

        def measure(sweep, batch):
            for trial in batch:
                trial["status"] = status
                if status == bench.OK:
                    ms = 2.0 - 0.5 * (trial["knob"] is not None)
                    trial["shapes"] = {n: dict(fwd_ms=ms / 2, fwdbwd_ms=ms)
                                       for n in sweep.shapes}
                    trial["objective_ms"] = ms * len(sweep.shapes)

        out = os.path.join(self.create_tempdir().full_path, "tune")
        stderr, code = io.StringIO(), None
        with mock.patch.object(tune_kernels.Sweep, "measure", measure), \
                mock.patch.object(tune_kernels.Sweep, "_check", return_value=None), \
                mock.patch.object(sys, "argv", ["tune_kernels.py", "--shapes=1,64,1,64",
                                                "--knobs=forward=8x1", f"--out={out}"] + argv), \
                contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(stderr):
            try:
                tune_kernels._cli()
            except SystemExit as e:
                code = e.code
        with open(out + ".json") as f, open(out + ".md") as g:
            return code, stderr.getvalue(), json.load(f), g.read()

    def test_failed_baseline_writes_the_report_and_exits_nonzero(self):
        code, stderr, saved, md = self._fake_sweep(
            ["--interpret"], status="error: RuntimeError: no kernel\n(detail)")
        self.assertEqual(code, 1)
        self.assertEqual(stderr, "error: the baseline configuration (trial #0) failed "
                         "(RuntimeError: no kernel (detail)); no speed-up can be measured "
                         "against it (the report lists every trial)\n")
        self.assertEqual([t["status"] for t in saved["trials"]],
                         ["error: RuntimeError: no kernel\n(detail)"] * 2)
        self.assertIn("| 0 | baseline |", md)
        code, stderr, saved, _ = self._fake_sweep(["--interpret"])
        self.assertIsNone(code)
        self.assertEqual(stderr, "")
        self.assertIsNone(tune_kernels.baseline_failure(None))

    def test_interpret_report_has_no_speedup_or_tuning_literal(self):
        _, _, saved, md = self._fake_sweep(["--interpret"])
        self.assertEqual(saved["best"]["trial"], 1)
        self.assertIn("## Best configuration\n\n" + tune_kernels.INTERPRET_NOTE + "\n", md)
        self.assertNotIn("TUNING = {", md)
        self.assertNotIn("speed-up 1.333x", md)
        # The same report outside interpret mode keeps the headline and the literal.
        saved["settings"]["interpret"] = False
        md = tune_kernels.markdown(saved)
        self.assertNotIn(tune_kernels.INTERPRET_NOTE, md)
        self.assertIn("speed-up 1.333x (sweep timings)", md)
        self.assertIn("Paste into `pallas_kernels/gated_delta_rule/kernel_gpu.py`:", md)
        self.assertIn("TUNING = {", md)

    def test_tuning_literal_pastes_back(self):
        literal = tune_kernels.tuning_literal({**kernel_gpu.TUNING, "forward": [8, 1]})
        scope = {}
        exec(literal, scope)  # noqa: S102 - our own output
        self.assertEqual(scope["TUNING"], {**kernel_gpu.TUNING, "forward": (8, 1)})
        self.assertAlmostEqual(tune_kernels.rel_rms(jnp.ones(4), 2 * jnp.ones(4)), 0.5)


if __name__ == "__main__":
    absltest.main()
