"""Sweep results (lattn_jax/sweep_report.py): rank statistics, seed spread, the table built
from run directories (finished, partial, failed and not-started runs), the paper's numbers,
conclusions, a scan, and the files written."""

import csv
import io
import json
import os
import shutil

import numpy as np
from absl.testing import absltest

from lattn_jax import sweep
from lattn_jax import sweep_report


def write_run(root, run, *, final=None, partial_at=None, error=None, total=10, tps=1000.0,
              params=5000, nan_evals=(), concurrent=None, devices=None):
    """Writes the files the trainer and the sweep leave in a run directory: a finished run
    (``final``: its last validation loss), a partial one (``partial_at``: the checkpoint step)
    or a failed one (``error``); evaluations at the steps in ``nan_evals`` record NaN;
    ``concurrent``: the attempt ran with that many runs at once (``--parallel=2``);
    ``devices``: one device kind per trainer invocation (recorded as the trainer does)."""
    workdir = sweep.run_dir(root, run)
    os.makedirs(workdir, exist_ok=True)

    def append(name, *records):
        with open(os.path.join(workdir, name), "a") as f:
            for r in records:
                f.write((json.dumps(r) if isinstance(r, dict) else r) + "\n")

    with open(os.path.join(workdir, sweep.RUN_RECORD), "w") as f:
        json.dump({"name": run.name, "values": [list(p) for p in run.values],
                   "group": run.group, "seed": run.seed, "arg": run.arg, "overrides": []}, f)
    append(sweep.ATTEMPTS, {"event": "start"})
    if error:
        append(sweep.ATTEMPTS, {"event": "end", "returncode": 1, "wall_s": 3.0, "error": error})
        return
    config = {"train": {"total_steps": total}, "data": {"batch_size": 4, "seq_len": 8},
              "model": {"vocab_size": 100, "d_model": 8, "tie_embeddings": False}}
    for kind in devices or (None,):
        device = {} if kind is None else {"devices": {"backend": "gpu", "count": 1,
                                                      "kinds": [kind], "processes": 1}}
        append("invocations.jsonl", {"time": "2026-01-01T00:00:00Z", **device,
                                     "config": config})
    append("console.log", f"model: {params:,} parameters, layers ['gdn'], d_model 8")
    last = partial_at or total
    for step in range(1, last + 1):
        loss = (final or 3.0) + (total - step) * 0.1
        append("metrics.jsonl", {"step": step, "time": float(step), "train_loss": loss + 0.05,
                                 "tokens_per_sec": tps, "mfu": 0.25})
        if step % 5 == 0:
            val = float("nan") if step in nan_evals else loss
            append("metrics.jsonl", {"step": step, "time": float(step), "val_loss": val})
    os.makedirs(os.path.join(workdir, "checkpoints", str(last)))
    if partial_at is None:
        append("console.log", f"final: step {total}  train_loss 1  val_loss {final}")
    shared = {} if concurrent is None else {"parallel": 2, "concurrent": concurrent,
                                            "shared_s": 55.0}
    append(sweep.ATTEMPTS, {"event": "end", "returncode": 0, "wall_s": 60.0, **shared})


class StatisticsTest(absltest.TestCase):

    def test_rank_and_spearman(self):
        np.testing.assert_array_equal(sweep_report.rank([3.0, 1.0, 3.0, 2.0]), [3.5, 1, 3.5, 2])
        # 1 - 6 sum d^2 / (n (n^2 - 1)) without ties: d = (0, 1, -1, 0) -> 1 - 12/60 = 0.8.
        self.assertAlmostEqual(sweep_report.spearman([1, 2, 3, 4], [10, 30, 20, 40]), 0.8)
        self.assertAlmostEqual(sweep_report.spearman([1, 2, 3], [3, 2, 1]), -1.0)
        # Ties: the Pearson correlation of the average ranks.
        rx, ry = np.array([1, 2.5, 2.5, 4]), np.array([1, 2, 3, 4])
        want = np.corrcoef(rx, ry)[0, 1]
        self.assertAlmostEqual(sweep_report.spearman([1, 2, 2, 5], [7, 8, 9, 10]), want)
        self.assertIsNone(sweep_report.spearman([1], [2]))
        self.assertIsNone(sweep_report.spearman([1, 1], [2, 3]))
        with self.assertRaisesRegex(ValueError, "2 values against 3"):
            sweep_report.spearman([1, 2], [1, 2, 3])

    def test_seed_spread_and_close_pairs(self):
        a = sweep_report.Group("a", (), losses=[3.00, 3.02], mean=3.01)
        b = sweep_report.Group("b", (), losses=[3.10, 3.14], mean=3.12)
        c = sweep_report.Group("c", (), losses=[3.13], mean=3.13)
        spread, used = sweep_report.seed_spread([a, b, c])
        # (0.01^2 * 2 + 0.02^2 * 2) / 2 = 0.0005
        self.assertAlmostEqual(spread, np.sqrt(0.0005))
        self.assertEqual(used, 2)
        pairs = sweep_report.close_pairs([a, b, c], spread)
        self.assertEqual([(x, y) for x, y, _ in pairs], [("b", "c")])  # 0.11 > 3 sigma = 0.067
        self.assertEqual(sweep_report.seed_spread([c]), (None, 0))
        self.assertEqual(sweep_report.close_pairs([a, b], None), [])


class BuildTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.root = self.create_tempdir().full_path
        self.config = dict(
            name="demo", train_config="configs/table2.py", arg=(("size", "small"),),
            grid=((("arch", ("gdn", "softmax", "kda")), ("opt", ("adamw", "muon")),
                   ("seed", (42, 43))),),
            seed_axis="seed",
            references=(
                dict(name="losses", source="spec §9.3", metric="final_val_loss",
                     values=(("arch=gdn,opt=muon", 2.70), ("arch=softmax,opt=muon", 2.72),
                             ("arch=gdn,opt=adamw", 2.85), ("arch=kda,opt=muon", 2.90))),
                dict(name="speed", source="Table 2", metric="tokens_per_sec",
                     normalise_to="arch=gdn,opt=muon",
                     values=(("arch=gdn,opt=muon", 1.0), ("arch=softmax,opt=muon", 0.8)))),
            claims=(dict(claim="muon beats adamw (gdn)", source="§9.3", paper=-0.15,
                         better="arch=gdn,opt=muon", worse="arch=gdn,opt=adamw"),
                    dict(claim="gdn beats softmax (muon)", source="§9.3", paper=-0.01,
                         better="arch=gdn,opt=muon", worse="arch=softmax,opt=muon"),
                    dict(claim="kda beats gdn", source="x", paper=None,
                         better="arch=kda,opt=adamw", worse="arch=gdn,opt=adamw")))
        runs = {r.name: r for r in sweep.expand(self.config)}
        write_run(self.root, runs["arch=gdn,opt=muon,seed=42"], final=3.00, tps=2000.0)
        write_run(self.root, runs["arch=gdn,opt=muon,seed=43"], final=3.02, tps=2000.0)
        write_run(self.root, runs["arch=gdn,opt=adamw,seed=42"], final=3.20)
        write_run(self.root, runs["arch=softmax,opt=muon,seed=42"], final=3.03, tps=1500.0)
        write_run(self.root, runs["arch=softmax,opt=adamw,seed=42"], partial_at=5)
        write_run(self.root, runs["arch=kda,opt=adamw,seed=42"],
                  error="error: model.kda.chunk_size must be a positive power of two, got 48")
        # A run of an earlier grid of the same sweep, recorded under the root.
        old = sweep.Run(name="arch=gdn2,opt=muon,seed=42", values=(
            ("arch", "gdn2"), ("opt", "muon"), ("seed", 42)), arg="", overrides=(),
            group="arch=gdn2,opt=muon", seed=42)
        write_run(self.root, old, final=3.50)
        self.report = sweep_report.build(self.config, self.root)

    def test_statuses_ranking_and_spread(self):
        statuses = {e.run.name: e.state.status for e in self.report.entries}
        self.assertEqual(statuses["arch=softmax,opt=adamw,seed=42"], sweep.Status.PARTIAL)
        self.assertEqual(statuses["arch=kda,opt=adamw,seed=42"], sweep.Status.FAILED)
        self.assertEqual(statuses["arch=kda,opt=muon,seed=43"], sweep.Status.NOT_STARTED)
        self.assertLen(self.report.entries, 13)  # 12 in the grid + 1 recorded
        self.assertFalse(self.report.entries[-1].in_grid)
        self.assertEqual([g.name for g in self.report.ranking],
                         ["arch=gdn,opt=muon", "arch=softmax,opt=muon", "arch=gdn,opt=adamw",
                          "arch=gdn2,opt=muon"])
        self.assertAlmostEqual(self.report.ranking[0].mean, 3.01)
        self.assertAlmostEqual(self.report.spread, np.std([3.00, 3.02], ddof=1))
        # softmax (3.03) is 0.02 behind gdn (3.01) < 3 sigma = 0.042: it needs a second seed.
        self.assertEqual(self.report.needs_seed, ["arch=softmax,opt=muon"])

    def test_a_partial_run_shows_the_step_it_resumes_from(self):
        # Logged to step 5, checkpointed at 7 (the trainer's stop saved after its last log):
        # the step and tokens are the checkpoint's, which run_state and --dry_run resume from;
        # the losses stay the last logged ones and the note says at which step.
        runs = {r.name: r for r in sweep.expand(self.config)}
        run = runs["arch=softmax,opt=adamw,seed=42"]
        os.makedirs(os.path.join(sweep.run_dir(self.root, run), "checkpoints", "7"))
        report = sweep_report.build(self.config, self.root)
        entry = next(e for e in report.entries if e.run.name == run.name)
        self.assertEqual(entry.state.step, 7)
        self.assertEqual((entry.result.step, entry.result.tokens, entry.result.logged_step),
                         (7, 7 * 32, 5))
        row = next(line for line in sweep_report.markdown(report).splitlines()
                   if line.startswith(f"| {run.name} |"))
        self.assertIn("| partial | 7/10 |", row)
        self.assertIn("losses at the last logged step 5 (resumes from step 7)", row)
        row = next(r for r in csv.DictReader(io.StringIO(sweep_report.csv_text(report)))
                   if r["run"] == run.name)
        self.assertEqual((row["step"], row["logged_step"]), ("7", "5"))
        # A finished run's step is its last (final) one, as before.
        finished = next(e for e in report.entries if e.run.name == "arch=gdn,opt=muon,seed=42")
        self.assertEqual((finished.result.step, finished.result.logged_step), (10, None))

    def test_references_and_claims(self):
        losses, speed = self.report.references
        self.assertEqual([r["ours"] for r in losses["rows"]][:3], [3.01, 3.03, 3.20])
        self.assertIsNone(losses["rows"][3]["ours"])  # kda muon: not run
        self.assertEqual(losses["n"], 3)
        self.assertAlmostEqual(losses["spearman"], 1.0)
        self.assertEqual([r["ours"] for r in speed["rows"]], [1.0, 0.75])
        # Ranked from the best: the fastest first, ours and the paper's alike.
        self.assertEqual([(r["paper_rank"], r["ours_rank"]) for r in speed["rows"]],
                         [(1, 1), (2, 2)])
        self.assertEqual([r["paper_rank"] for r in losses["rows"][:3]], [1, 2, 3])
        verdicts = [c["verdict"] for c in self.report.claims]
        self.assertEqual(verdicts[0], "holds")
        self.assertTrue(verdicts[1].startswith("holds (gap below 3 sigma"), verdicts[1])
        self.assertEqual(verdicts[2], "not run yet")
        self.assertAlmostEqual(self.report.claims[0]["ours"], 3.01 - 3.20)

    def test_claims_pair_the_seeds_both_groups_finished(self):
        # gdn/muon 3.00 (42), 3.02 (43); gdn/adamw 3.20 (42) and now 3.21 (43): differences
        # -0.20 and -0.19 seed by seed. softmax/muon 3.03 (42) and now 2.99 (43): against
        # gdn/muon -0.03 at 42, +0.03 at 43, so only one seed has the mean's sign.
        runs = {r.name: r for r in sweep.expand(self.config)}
        write_run(self.root, runs["arch=gdn,opt=adamw,seed=43"], final=3.21)
        write_run(self.root, runs["arch=softmax,opt=muon,seed=43"], final=2.99)
        report = sweep_report.build(self.config, self.root)
        muon, gdn, kda = report.claims
        self.assertEqual([s for s, _ in muon["per_seed"]], ["42", "43"])
        np.testing.assert_allclose([d for _, d in muon["per_seed"]], [-0.20, -0.19])
        self.assertIn(f"; paired by seed: mean -0.1950, sd {np.std([0.2, 0.19], ddof=1):.2g}, "
                      "the sign of the mean in 2 of 2 seeds", muon["verdict"])
        np.testing.assert_allclose([d for _, d in gdn["per_seed"]], [-0.03, 0.03], atol=1e-12)
        self.assertIn("the sign of the mean in 1 of 2 seeds", gdn["verdict"])
        self.assertEqual(kda["per_seed"], [])
        md = sweep_report.markdown(report)
        self.assertIn("| -0.1950 | 42: -0.2000, 43: -0.1900 | holds; paired by seed", md)
        # One common seed: the difference is listed, no paired statistics.
        self.assertEqual(len(self.report.claims[0]["per_seed"]), 1)
        self.assertNotIn("paired", self.report.claims[0]["verdict"])

    def test_written_files(self):
        paths = sweep_report.write(self.report)
        self.assertEqual(sorted(paths), ["csv", "json", "md", "png"])
        with open(paths["md"]) as f:
            md = f.read()
        self.assertIn("| arch=kda,opt=adamw,seed=42 | failed |", md)
        self.assertIn("error: model.kda.chunk_size must be a positive power of two, got 48", md)
        self.assertIn("| 1 | arch=gdn,opt=muon | 2 | 3.0100 ± 0.0141 | +0.0000 |", md)
        self.assertIn("Spearman rank correlation over 3 rows: +1.000.", md)
        self.assertIn("--only='arch=softmax,opt=muon'", md)
        self.assertIn("arch=gdn2,opt=muon,seed=42 (not in this grid)", md)
        with open(paths["csv"]) as f:
            rows = list(csv.DictReader(f))
        self.assertLen(rows, 13)
        first = rows[0]
        self.assertEqual((first["run"], first["status"], first["final_val_loss"],
                          first["tokens"], first["non_embedding_params"]),
                         ("arch=gdn,opt=adamw,seed=42", "finished", "3.2", "320",
                          str(5000 - 2 * 100 * 8)))
        with open(paths["json"]) as f:
            data = json.load(f)
        self.assertEqual(data["needs_second_seed"], ["arch=softmax,opt=muon"])
        self.assertGreater(os.path.getsize(paths["png"]), 10_000)

    def test_a_changed_config_is_marked_in_the_ranking_and_the_csv(self):
        # A group's mean included a run trained with another config, unmarked in the ranking
        # (and results.csv did not say it at all).
        changed = "arch=gdn,opt=muon,seed=43"
        report = sweep_report.build(self.config, self.root,
                                    config_changes={changed: "optim.warmup_steps 1 -> 10"})
        md = sweep_report.markdown(report)
        mark = sweep_report.CONFIG_MARK
        self.assertIn(f"| 1 | arch=gdn,opt=muon {mark} | 2 | 3.0100 ± 0.0141 |", md)
        self.assertIn("| 2 | arch=softmax,opt=muon | 1 |", md)  # its runs unchanged
        ranking = md.split("## Ranking")[1].split("## Runs")[0]
        self.assertIn(f"\n{mark} The group has a run trained with another experiment config",
                      ranking)
        rows = {r["run"]: r for r in csv.DictReader(io.StringIO(sweep_report.csv_text(report)))}
        self.assertEqual(rows[changed]["config_changed"], "optim.warmup_steps 1 -> 10")
        self.assertEqual(rows["arch=gdn,opt=muon,seed=42"]["config_changed"], "")
        groups = {g["group"]: g for g in sweep_report.json_dict(report)["groups"]}
        self.assertEqual((groups["arch=gdn,opt=muon"]["config_changed"],
                          groups["arch=softmax,opt=muon"]["config_changed"]), (True, False))
        # Nothing changed: no mark, no footnote, the column empty.
        md = sweep_report.markdown(self.report)
        self.assertNotIn(mark, md)
        self.assertEqual({r["config_changed"] for r in
                          csv.DictReader(io.StringIO(sweep_report.csv_text(self.report)))}, {""})

    def test_a_reference_note_counts_the_groups_of_this_sweep(self):
        # "for 6 of our groups" was printed by a tiny sweep of 4 groups: the note's counts are
        # of the groups the sweep has ({groups}: 6 of the grid + gdn2 recorded) and of those
        # the reference's rows pick ({matched}: gdn/muon, softmax/muon, gdn/adamw, kda/muon).
        refs = list(self.config["references"])
        refs[0] = dict(refs[0], note="The nearest numbers, for {matched} of our {groups} "
                                     "groups.")
        md = sweep_report.markdown(sweep_report.build(dict(self.config, references=refs),
                                                      self.root))
        self.assertIn("\nThe nearest numbers, for 4 of our 7 groups.\n", md)

    def test_bad_report_options_are_named(self):
        cases = [(dict(references=(dict(metric="loss", values=()),)),
                  r"references\[0\].metric='loss'; choose from final_val_loss"),
                 (dict(claims=(dict(claim="x", better="arch=gdn"),)),
                  r"claims\[0\]: worse missing"),
                 (dict(scan=dict(by=("opt",))), r"scan: axis missing")]
        for changes, message in cases:
            with self.subTest(message):
                with self.assertRaisesRegex(sweep.SweepConfigError, message):
                    sweep_report.build(dict(self.config, **changes), self.root)

    def test_scan(self):
        config = dict(name="scan", train_config="x.py", seed_axis=None,
                      grid=((("arch", ("a", "b")), ("opt", ("adamw",)),
                             ("lr", (1e-3, 3e-3, 1e-2))),),
                      scan=dict(axis="lr", by=("opt",)))
        losses = {("a", 1e-3): 3.3, ("a", 3e-3): 3.1, ("a", 1e-2): 3.4,
                  ("b", 1e-3): 3.2, ("b", 3e-3): 3.0}  # b at 1e-2 not run
        for run in sweep.expand(config):
            key = (run.value("arch"), run.value("lr"))
            if key in losses:
                write_run(os.path.join(self.root, "scan"), run, final=losses[key])
        root = os.path.join(self.root, "scan")
        scan = sweep_report.build(config, root).scan
        block = scan["blocks"][0]
        self.assertEqual(block["by"], [["opt", "adamw"]])
        self.assertEqual(block["columns"], ["arch=a", "arch=b"])
        self.assertEqual([r["mean"] for r in block["rows"]], [3.25, 3.05, 3.4])
        self.assertEqual((block["best"], block["edge"], block["complete"]), (3e-3, False, True))
        md = sweep_report.markdown(sweep_report.build(config, root))
        self.assertIn("Best lr: 0.003.", md)

    def test_nan_evaluations(self):
        """NaN validation losses (2026-12-03's scan: 4 of 16 runs had some, with finite
        training losses) neither poison the best of a run, nor the ranking's order, nor the
        scan's choice; they are named in the runs table."""
        config = dict(name="nan", train_config="x.py", seed_axis=None,
                      grid=((("arch", ("a", "b")), ("lr", (1e-3, 3e-3, 1e-2))),),
                      scan=dict(axis="lr", by=()))
        root = os.path.join(self.root, "nan")
        nan = float("nan")
        # lr 1e-3 comes first and its mean is NaN: a bare min() over (mean, lr) pairs keeps
        # the first element whenever a comparison with NaN is False, so it would pick 1e-3.
        finals = {("a", 1e-3): nan, ("b", 1e-3): 3.0, ("a", 3e-3): 3.2, ("b", 3e-3): 3.1,
                  ("a", 1e-2): 3.6, ("b", 1e-2): 3.5}
        for run in sweep.expand(config):
            key = (run.value("arch"), run.value("lr"))
            write_run(root, run, final=3.0 if key == ("a", 1e-3) else finals[key],
                      nan_evals=(5, 10) if key == ("a", 1e-3) else ())
        report = sweep_report.build(config, root)
        results = {e.run.name: e.result for e in report.entries}
        a = results["arch=a,lr=0.001"]
        self.assertTrue(np.isnan(a.final_val_loss))
        self.assertIsNone(a.best_val_loss)  # both evaluations NaN
        self.assertEqual(a.nonfinite_val_evals, 2)
        self.assertEqual(results["arch=b,lr=0.001"].best_val_loss, 3.0)
        ranked = [g.name for g in report.ranking]
        self.assertEqual(ranked[0], "arch=b,lr=0.001")
        self.assertEqual(ranked[-1], "arch=a,lr=0.001")
        block = report.scan["blocks"][0]
        self.assertAlmostEqual(block["rows"][1]["mean"], 3.15)
        self.assertEqual(block["best"], 3e-3)
        md = sweep_report.markdown(report)
        self.assertIn("2 of 2 evaluations NaN/inf", md)
        # results.json is strict JSON: the NaN losses are null there.
        paths = sweep_report.write(report)

        def refuse(name):
            raise ValueError(f"non-standard JSON constant {name}")

        with open(paths["json"]) as f:
            data = json.loads(f.read(), parse_constant=refuse)
        runs = {r["run"]: r for r in data["runs"]}
        self.assertIsNone(runs["arch=a,lr=0.001"]["final_val_loss"])
        # One NaN evaluation of two: the best is the finite one.
        run = [r for r in sweep.expand(config) if r.name == "arch=b,lr=0.01"][0]
        shutil.rmtree(sweep.run_dir(root, run))
        write_run(root, run, final=3.5, nan_evals=(10,))
        got = sweep.collect(sweep.run_dir(root, run))
        self.assertEqual((got.best_val_loss, got.best_val_step, got.nonfinite_val_evals),
                         (3.5 + 0.5, 5, 1))


class _SpeedSweepTestCase(absltest.TestCase):
    """A sweep of three architectures x two seeds with the paper's tokens/s (absolute and
    relative to softmax) as references."""

    def setUp(self):
        super().setUp()
        self.root = self.create_tempdir().full_path
        speed = dict(name="speed", source="Table 2", metric="tokens_per_sec",
                     values=(("arch=gdn", 150.0), ("arch=softmax", 140.0), ("arch=kda", 130.0)))
        self.config = dict(
            name="demo", train_config="configs/table2.py", arg=(),
            grid=((("arch", ("gdn", "softmax", "kda")), ("seed", (42, 43))),),
            seed_axis="seed",
            references=(speed, dict(speed, name="relative", normalise_to="arch=softmax")))
        self.runs = {r.name: r for r in sweep.expand(self.config)}


class SharedThroughputTest(_SpeedSweepTestCase):
    """Runs measured while sharing the GPU (``--parallel=2``): marked, and left out of the
    throughput comparisons; their losses count as any."""

    def _report(self):
        return sweep_report.build(self.config, self.root)

    def test_marks_and_comparisons(self):
        write_run(self.root, self.runs["arch=gdn,seed=42"], final=3.0, tps=1000.0)
        write_run(self.root, self.runs["arch=gdn,seed=43"], final=3.1, tps=3000.0,
                  concurrent=2)  # not in gdn's throughput (a run measured alone is)
        write_run(self.root, self.runs["arch=softmax,seed=42"], final=3.2, tps=800.0)
        write_run(self.root, self.runs["arch=kda,seed=42"], final=3.3, tps=5000.0,
                  concurrent=2)
        report = self._report()
        groups = {g.name: g for g in report.groups}
        self.assertEqual((groups["arch=gdn"].tokens_per_sec, groups["arch=gdn"].mean),
                         (1000.0, 3.05))  # both seeds' losses
        self.assertEqual((groups["arch=kda"].tokens_per_sec, groups["arch=kda"].mfu,
                          groups["arch=kda"].throughput_shared), (5000.0, 0.25, True))
        self.assertIsNone(groups["arch=kda"].metric("tokens_per_sec"))
        speed, relative = report.references
        self.assertEqual([r["ours"] for r in speed["rows"]], [1000.0, 800.0, None])
        self.assertEqual([r["shared"] for r in speed["rows"]], [False, False, True])
        self.assertEqual((speed["n"], speed["shared_left_out"]), (2, 1))
        self.assertEqual([r["ours"] for r in relative["rows"]], [1.25, 1.0, None])
        paths = sweep_report.write(report)
        with open(paths["md"]) as f:
            md = f.read()
        self.assertIn("- † 2 run(s) shared the GPU with other runs of this sweep (`--parallel` "
                      "up to 2)", md)
        self.assertIn("| arch=kda,seed=42 | finished | 10/10 | 3.3000 | 3.3000 | 3.3500 | 320 "
                      "| 5,000 † | 25.0% † | 0.01M | 0.00M | 60 s † |  | shared GPU (parallel=2, "
                      "up to 2 runs at once) |", md)
        self.assertIn("| arch=gdn,seed=42 | finished | 10/10 | 3.0000 | 3.0000 | 3.0500 | 320 "
                      "| 1,000 | 25.0% | 0.01M | 0.00M | 60 s |  |  |", md)
        self.assertIn("| 3 | arch=kda | 1 | 3.3000 | +0.2500 | 3.3000 | 320 | 5,000 † | 25.0% † "
                      "|", md)
        self.assertIn("| arch=kda | 130.0 | † shared GPU only |  |  |", md)
        self.assertIn("† 1 row(s) left out: measured only while sharing the GPU (`--parallel` "
                      "> 1); the ranks and the correlation use the runs measured alone.", md)
        with open(paths["csv"]) as f:
            rows = {r["run"]: r for r in csv.DictReader(f)}
        self.assertEqual([(rows[n]["concurrent"], rows[n]["parallel"]) for n in (
            "arch=gdn,seed=42", "arch=gdn,seed=43", "arch=softmax,seed=43")],
            [("1", "1"), ("2", "2"), ("1", "1")])
        with open(paths["json"]) as f:
            data = json.load(f)
        self.assertEqual({g["group"]: g["throughput_shared"] for g in data["groups"]},
                         {"arch=gdn": False, "arch=softmax": False, "arch=kda": True})

    def test_runs_on_cpus_shared_the_machine_not_a_gpu(self):
        for name, tps in (("arch=gdn,seed=42", 1000.0), ("arch=kda,seed=42", 900.0)):
            write_run(self.root, self.runs[name], final=3.0, tps=tps, concurrent=2,
                      devices=["cpu"])
        md = sweep_report.markdown(self._report())
        self.assertIn("| shared the machine (parallel=2, up to 2 runs at once) |", md)
        self.assertIn("- † 2 run(s) shared the machine with other runs of this sweep", md)
        self.assertIn("† Measured while the run shared the machine with other runs", md)
        self.assertNotIn("shared GPU (", md)
        self.assertNotIn("shared the GPU with", md)

    def test_an_early_shared_attempt_marks_the_wall_time_only(self):
        # The first attempt shared the GPU and was stopped before any record (t 100-101), the
        # run then trained alone (records at t 1..10): tokens/s and MFU unmarked, the wall time
        # (which adds every attempt) marked, with a note saying why.
        name = "arch=gdn,seed=42"
        write_run(self.root, self.runs[name], final=3.0)
        path = os.path.join(sweep.run_dir(self.root, self.runs[name]), sweep.ATTEMPTS)
        with open(path) as f:
            alone = f.read()
        with open(path, "w") as f:
            f.write(json.dumps({"event": "start", "parallel": 2}) + "\n")
            f.write(json.dumps({"event": "end", "returncode": -15, "wall_s": 0.5,
                                "stopped_by": "deadline", "parallel": 2, "concurrent": 2,
                                "shared_s": 0.5, "t0": 100.0, "t1": 100.5}) + "\n")
            f.write(alone)
        md = sweep_report.markdown(self._report())
        self.assertIn("| 1,000 | 25.0% | 0.01M | 0.00M | 60 s † |  | wall time includes an attempt "
                      "that shared the GPU (parallel=2, up to 2 runs at once) |", md)

    def test_no_group_measured_alone_is_said(self):
        for name in ("arch=gdn,seed=42", "arch=softmax,seed=42"):
            write_run(self.root, self.runs[name], final=3.0, concurrent=2)
        md = sweep_report.markdown(self._report())
        self.assertIn("† No comparison: none of these groups was measured alone (2 measured "
                      "only while sharing the GPU, `--parallel` > 1)", md)
        self.assertIn("† No comparison: the group it is relative to (`arch=softmax`) was "
                      "measured only while sharing the GPU", md)
        self.assertIn("Spearman rank correlation over 0 rows: n/a", md)

    def _write_alone(self, name, tps, mfu, steps):
        record = {"steps": steps, "tokens_per_sec": tps, "mfu": mfu, "windows": steps // 10,
                  "date": "2026-12-05T12:00:00Z", "command": ["python", "train.py"]}
        with open(os.path.join(sweep.run_dir(self.root, self.runs[name]),
                               sweep.THROUGHPUT_ALONE), "w") as f:
            json.dump(record, f)

    def test_a_measurement_alone_replaces_the_shared_throughput_marked(self):
        rng = np.random.default_rng()
        gdn, softmax, kda = (float(x) for x in rng.uniform(500.0, 5000.0, 3))
        kda_mfu, steps = float(rng.uniform(0.05, 0.5)), int(rng.integers(20, 79)) * 10
        write_run(self.root, self.runs["arch=gdn,seed=42"], final=3.0, tps=gdn)
        write_run(self.root, self.runs["arch=softmax,seed=42"], final=3.2, tps=7777.0,
                  concurrent=2)
        write_run(self.root, self.runs["arch=kda,seed=42"], final=3.3, tps=9999.0,
                  concurrent=2)
        self._write_alone("arch=kda,seed=42", kda, kda_mfu, steps)
        self._write_alone("arch=softmax,seed=42", softmax, None, steps)
        # (a run measured alone keeps its own throughput: a stray record is not used)
        self._write_alone("arch=gdn,seed=42", 1.0, 0.9, steps)
        report = self._report()
        groups = {g.name: g for g in report.groups}
        self.assertEqual([(groups[n].tokens_per_sec, groups[n].throughput_shared,
                           groups[n].throughput_remeasured)
                          for n in ("arch=gdn", "arch=softmax", "arch=kda")],
                         [(gdn, False, False), (softmax, False, True), (kda, False, True)])
        self.assertAlmostEqual(groups["arch=kda"].mfu, kda_mfu)
        speed, relative = report.references
        self.assertEqual([r["ours"] for r in speed["rows"]], [gdn, softmax, kda])
        self.assertEqual([r["remeasured"] for r in speed["rows"]], [False, True, True])
        self.assertEqual((speed["n"], speed["shared_left_out"]), (3, 0))
        want = -np.argsort(np.argsort([gdn, softmax, kda])) + 3
        self.assertEqual([r["ours_rank"] for r in speed["rows"]], list(map(float, want)))
        np.testing.assert_allclose([r["ours"] for r in relative["rows"]],
                                   [gdn / softmax, 1.0, kda / softmax])
        self.assertTrue(relative["base_remeasured"])
        paths = sweep_report.write(report)
        with open(paths["md"]) as f:
            md = f.read()
        footnote = (f"‡ Measured alone in a {steps}-step run after training shared the GPU "
                    f"(`experiments/sweep.py --remeasure_alone`")
        self.assertEqual(md.count(footnote), 4)  # ranking, runs, two references
        self.assertIn(f"- ‡ 2 of them had their tokens/s and MFU measured again alone, in a "
                      f"{steps}-step run after training", md)
        self.assertIn(f"| 3 | arch=kda | 1 | 3.3000 | +0.3000 | 3.3000 | 320 | {kda:,.0f} ‡ "
                      f"| {100 * kda_mfu:.1f}% ‡ |", md)
        self.assertIn(f"| {kda:,.0f} ‡ | {100 * kda_mfu:.1f}% ‡ | 0.01M | 0.00M | 60 s † |  | "
                      f"wall time includes an attempt that shared the GPU (parallel=2, up to 2 "
                      f"runs at once); tokens/s, MFU measured alone in a {steps}-step run on "
                      f"2026-12-05 (while sharing: 9,999 tokens/s, MFU 25.0%) |", md)
        self.assertIn(f"| arch=gdn,seed=42 | finished | 10/10 | 3.0000 | 3.0000 | 3.0500 | 320 "
                      f"| {gdn:,.0f} | 25.0% | 0.01M | 0.00M | 60 s |  |  |", md)
        self.assertIn(f"| arch=kda | 130.0 | {kda:,.0f} ‡ |", md)
        self.assertIn(f"| arch=gdn | 150.0 | {gdn / softmax:.3f} ‡ |", md)  # (its base's)
        self.assertIn("The group it is relative to (`arch=softmax`) is one of them.", md)
        self.assertNotIn("shared GPU only", md)
        self.assertNotIn("row(s) left out", md)
        with open(paths["csv"]) as f:
            rows = {r["run"]: r for r in csv.DictReader(f)}
        got = [(rows[n]["concurrent"], rows[n]["alone_steps"], rows[n]["shared_tokens_per_sec"])
               for n in ("arch=gdn,seed=42", "arch=kda,seed=42")]
        self.assertEqual(got, [("1", "", ""), ("1", str(steps), "9999.0")])
        with open(paths["json"]) as f:
            data = json.load(f)
        self.assertEqual({g["group"]: g["throughput_remeasured"] for g in data["groups"]},
                         {"arch=gdn": False, "arch=softmax": True, "arch=kda": True})

    def test_nothing_changes_without_shared_runs(self):
        write_run(self.root, self.runs["arch=gdn,seed=42"], final=3.0)
        md = sweep_report.markdown(self._report())
        self.assertNotIn(sweep_report.SHARED_MARK, md)
        self.assertNotIn("shared GPU", md)
        self.assertNotIn("--parallel", md)
        self.assertNotIn(sweep_report.ALONE_MARK, md)


H200, H100 = "NVIDIA H200", "NVIDIA H100 80GB HBM3"


class DeviceKindsTest(_SpeedSweepTestCase):
    """A sweep split over windows on different GPU kinds: tokens/s compared on one kind."""

    def test_device_kinds_of_a_run(self):
        run = self.runs["arch=gdn,seed=42"]
        write_run(self.root, run, final=3.0, devices=(H200, H100, H200))
        self.assertEqual(sweep.device_kinds(sweep.run_dir(self.root, run)), (H100, H200))
        self.assertEqual(sweep.collect(sweep.run_dir(self.root, run)).devices, (H100, H200))
        other = self.runs["arch=gdn,seed=43"]
        write_run(self.root, other, final=3.0)  # records without a device: unknown
        self.assertEqual(sweep.device_kinds(sweep.run_dir(self.root, other)), ())

    def test_throughput_compared_on_the_most_common_kind_only(self):
        write_run(self.root, self.runs["arch=gdn,seed=42"], final=3.0, tps=1000.0,
                  devices=(H200,))
        # The same group on an H100: its loss counts, its tokens/s does not.
        write_run(self.root, self.runs["arch=gdn,seed=43"], final=3.1, tps=3000.0,
                  devices=(H100,))
        write_run(self.root, self.runs["arch=softmax,seed=42"], final=3.2, tps=800.0,
                  devices=(H200,))
        write_run(self.root, self.runs["arch=softmax,seed=43"], final=3.2, tps=820.0,
                  devices=(H200,))
        # Resumed on another kind: its windows mix both, so it is not on the H200 alone.
        write_run(self.root, self.runs["arch=kda,seed=42"], final=3.3, tps=5000.0,
                  devices=(H100, H200))
        report = sweep_report.build(self.config, self.root)
        self.assertEqual(report.device, H200)
        self.assertEqual(report.devices, {H200: 3, H100: 1, f"{H100} + {H200}": 1})
        groups = {g.name: g for g in report.groups}
        self.assertAlmostEqual(groups["arch=gdn"].mean, 3.05)  # both seeds' losses
        self.assertEqual((groups["arch=gdn"].tokens_per_sec,
                          groups["arch=gdn"].throughput_device), (1000.0, None))
        self.assertEqual((groups["arch=kda"].tokens_per_sec,
                          groups["arch=kda"].throughput_device), (5000.0, f"{H100} + {H200}"))
        self.assertIsNone(groups["arch=kda"].metric("tokens_per_sec"))
        speed, relative = report.references
        self.assertEqual([r["ours"] for r in speed["rows"]], [1000.0, 810.0, None])
        self.assertEqual([r["other_device"] for r in speed["rows"]],
                         [None, None, f"{H100} + {H200}"])
        self.assertEqual((speed["n"], speed["other_device_left_out"], speed["shared_left_out"]),
                         (2, 1, 0))
        np.testing.assert_allclose([r["ours"] for r in relative["rows"][:2]], [1000 / 810, 1])
        paths = sweep_report.write(report)
        with open(paths["md"]) as f:
            md = f.read()
        self.assertIn(f"- § The runs' throughput was measured on more than one kind of device: "
                      f"{H200} (3 runs), {H100} (1 run), {H100} + {H200} (1 run). Tokens/s and "
                      f"MFU are compared only between runs on {H200} (the most runs); the 2 "
                      f"other(s) are marked §", md)
        self.assertIn("| 3,000 § | 25.0% § | 0.01M | 0.00M | 60 s | H100 80GB HBM3 |  |", md)
        self.assertIn("| 1,000 | 25.0% | 0.01M | 0.00M | 60 s | H200 |  |", md)
        self.assertIn(f"| arch=kda | 130.0 | § {H100} + {H200} only |  |  |", md)
        self.assertIn(f"§ 1 row(s) left out: measured only on another device kind than {H200}",
                      md)
        self.assertIn("| 5,000 § | 25.0% § |", md)  # the ranking's kda row
        with open(paths["csv"]) as f:
            rows = {r["run"]: r for r in csv.DictReader(f)}
        self.assertEqual(rows["arch=gdn,seed=43"]["devices"], H100)
        with open(paths["json"]) as f:
            data = json.load(f)
        self.assertEqual(data["throughput_device"], H200)

    def test_one_kind_adds_only_the_device_column(self):
        for name, final in (("arch=gdn,seed=42", 3.0), ("arch=kda,seed=42", 3.3)):
            write_run(self.root, self.runs[name], final=final, devices=(H200,))
        report = sweep_report.build(self.config, self.root)
        md = sweep_report.markdown(report)
        self.assertNotIn("§", md)
        self.assertEqual(report.references[0]["n"], 2)
        self.assertEqual(report.devices, {H200: 2})

    def test_a_measurement_alone_counts_on_its_own_device(self):
        write_run(self.root, self.runs["arch=gdn,seed=42"], final=3.0, tps=1000.0,
                  devices=(H200,))
        write_run(self.root, self.runs["arch=softmax,seed=42"], final=3.2, tps=800.0,
                  devices=(H200,))
        # Trained on an H100 sharing the GPU, measured again alone on an H200: the H200's.
        kda = sweep.run_dir(self.root, self.runs["arch=kda,seed=42"])
        write_run(self.root, self.runs["arch=kda,seed=42"], final=3.3, tps=9999.0,
                  concurrent=2, devices=(H100,))
        with open(os.path.join(kda, sweep.THROUGHPUT_ALONE), "w") as f:
            json.dump({"steps": 300, "tokens_per_sec": 700.0, "mfu": 0.2, "windows": 30,
                       "date": "2026-12-05T12:00:00Z", "command": ["python", "train.py"],
                       "devices": [H200]}, f)
        report = sweep_report.build(self.config, self.root)
        self.assertEqual(report.devices, {H200: 3})
        groups = {g.name: g for g in report.groups}
        self.assertEqual((groups["arch=kda"].tokens_per_sec, groups["arch=kda"].throughput_device,
                          groups["arch=kda"].throughput_remeasured), (700.0, None, True))
        self.assertEqual(report.references[0]["n"], 3)


if __name__ == "__main__":
    absltest.main()
