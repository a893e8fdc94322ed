"""experiments/sweep.py end to end with the real trainer (a one-layer tiny model, 6 steps on the
bundled text): a run stopped half-way resumes to the same final loss as an uninterrupted one,
a failing run is reported with its error line while the others finish, a second call skips
what is done, and the table is rebuilt from the run directories alone."""

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import textwrap

import numpy as np
import pytest
from absl.testing import absltest

from lattn_jax import sweep
from tests import binary_runs

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

# Three runs of one tiny model that differ only in train.nonfinite_policy: "stop" and "skip"
# train identically (no step is non-finite), "bogus" is refused by the config check.
SWEEP_CONFIG = textwrap.dedent('''
    import ml_collections

    def get_config(arg=None):
        return ml_collections.ConfigDict(dict(
            name="entry", train_config="configs/table2.py",
            arg=(("arch", "softmax"), ("opt", "muon"), ("tiny", True)),
            overrides=(("model.layer_pattern", ("attn",)), ("train.total_steps", 6),
                       ("train.eval_every", 3), ("train.checkpoint_every", 3),
                       ("train.log_every", 1), ("optim.warmup_steps", 1),
                       ("data.seq_len", 32), ("data.batch_size", 2),
                       ("data.tokenizer", "byte"), ("model.vocab_size", 257),
                       ("data.max_val_batches", 2), ("train.tensorboard", False)),
            grid=((("train.nonfinite_policy", ("stop", "skip", "bogus")),),),
            seed_axis=None))
''')
REF, RESUMED, BAD = (f"train.nonfinite_policy={p}" for p in ("stop", "skip", "bogus"))
# --parallel: three runs that train identically (train.keep_checkpoints changes no step; 6 steps
# keep at most 2 checkpoints) and the refused one.
PARALLEL_GRID = ('grid=((("train.keep_checkpoints", (2, 3, 4)),), '
                 '(("train.nonfinite_policy", ("bogus",)),)),')
SOLO, SHARED_A, SHARED_B = (f"train.keep_checkpoints={k}" for k in (2, 3, 4))


@pytest.mark.entry
class SweepBinaryTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        tmp = self.create_tempdir().full_path
        self.config = os.path.join(tmp, "entry_sweep.py")
        with open(self.config, "w") as f:
            f.write(SWEEP_CONFIG)
        self.root = os.path.join(tmp, "root")

    def sweep(self, *flags):
        env = dict(os.environ, JAX_DISABLE_MOST_OPTIMIZATIONS="true")  # compile time (CPU)
        # The sweep's own memory settings are under test: none inherited from this process
        # (importing a benchmark module, e.g. bench_inference, sets them in os.environ).
        for name in ("XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION",
                     "XLA_CLIENT_MEM_FRACTION"):
            env.pop(name, None)
        cmd = [sys.executable, os.path.join(ROOT, "experiments", "sweep.py"),
               f"--config={self.config}", f"--root={self.root}", *flags]
        # A fork of one process per environment that imported the binary's modules
        # (tests/binary_runs.py); the trainers it starts are processes of their own.
        return binary_runs.run(cmd, env=env)

    def state(self, name):
        return sweep.run_state(os.path.join(self.root, "runs", name))

    def result(self, name):
        return sweep.collect(os.path.join(self.root, "runs", name))

    # ~45 s on 2 cores (three trainer subprocesses); the library's grid, skip, failure and
    # table tests run in CI.
    @pytest.mark.slow
    def test_resume_failure_skip_and_table(self):
        # About 35 s on 2 cores: three trainer starts (the first compiles; the others hit the
        # sweep's compilation cache), the failing run's config check, two calls that only read.
        out = self.sweep(f"--only={REF}")
        self.assertEqual(out.returncode, 0, out.stdout[-3000:] + out.stderr[-3000:])
        self.assertEqual(self.state(REF).status, sweep.Status.FINISHED)

        # Stopped half-way (the trainer's own limit): partial, exit 3 ("run it again").
        out = self.sweep(f"--only={RESUMED}", "--override=train.max_steps_per_run=3")
        self.assertEqual(out.returncode, 3, out.stdout[-3000:] + out.stderr[-3000:])
        state = self.state(RESUMED)
        self.assertEqual((state.status, state.step), (sweep.Status.PARTIAL, 3))

        # The whole grid: the finished run is skipped, the partial one resumes from step 3,
        # the bad one fails and the sweep still completes; a run it launched failed: exit 4.
        out = self.sweep()
        self.assertEqual(out.returncode, 4, out.stdout[-3000:] + out.stderr[-3000:])
        self.assertIn(f"1 of the 2 run(s) launched failed ({BAD})", out.stdout)
        self.assertIn(f"--- {REF}: finished, skipped", out.stdout)
        self.assertIn(f"--- {RESUMED}: resuming from step 3", out.stdout)
        self.assertIn("Resuming from the checkpoint at step 3", out.stdout)
        error = "error: train.nonfinite_policy='bogus'; choose from stop, skip"
        self.assertEqual((self.state(BAD).status, self.state(BAD).error),
                         (sweep.Status.FAILED, error))
        ref, resumed = self.result(REF), self.result(RESUMED)
        self.assertEqual((ref.step, resumed.step), (6, 6))
        np.testing.assert_allclose(resumed.final_val_loss, ref.final_val_loss, rtol=1e-6)
        np.testing.assert_allclose([loss for _, loss in resumed.train_curve],
                                   [loss for _, loss in ref.train_curve], rtol=1e-6)

        with open(os.path.join(self.root, "results.md")) as f:
            md = f.read()
        self.assertIn(f"| {BAD} | failed |", md)
        self.assertIn(error, md)
        with open(os.path.join(self.root, "results.csv")) as f:
            rows = {r["run"]: r for r in csv.DictReader(f)}
        self.assertEqual([rows[n]["status"] for n in (REF, RESUMED, BAD)],
                         ["finished", "finished", "failed"])
        self.assertTrue(os.path.exists(os.path.join(self.root, "curves.png")))

        # Again, exporting the records: nothing is launched.
        attempts = [len(sweep.read_jsonl(os.path.join(self.root, "runs", n, sweep.ATTEMPTS)))
                    for n in (REF, RESUMED, BAD)]
        export = os.path.join(os.path.dirname(self.root), "export")
        out = self.sweep(f"--export={export}")
        self.assertEqual(out.returncode, 0, out.stdout[-3000:] + out.stderr[-3000:])
        self.assertIn(f"--- {BAD}: failed before ({error}); skipped", out.stdout)
        # The last line says so too (2026-12-03b: a window lost a call to that skip).
        self.assertIn("0 run(s) launched; 1 failed run(s) skipped, not retried "
                      "(--retry_failed runs them)", out.stdout)
        self.assertEqual(attempts, [
            len(sweep.read_jsonl(os.path.join(self.root, "runs", n, sweep.ATTEMPTS)))
            for n in (REF, RESUMED, BAD)])
        with open(os.path.join(self.root, "sweep.jsonl")) as f:
            statuses = [json.loads(line)["status"] for line in f]
        self.assertEqual(statuses, ["complete", "incomplete", "complete", "complete"])

        # The table from the exported records alone (no checkpoints): the same runs.
        self.assertEqual(sorted(os.listdir(export)), [
            "curves.png", "records.tar.gz", "results.csv", "results.json", "results.md",
            "sweep.jsonl"])
        with tarfile.open(os.path.join(export, "records.tar.gz")) as tar:
            tar.extractall(export)
        self.assertFalse(os.path.exists(os.path.join(export, "runs", REF, "checkpoints")))
        shutil.rmtree(self.root)
        self.root = export
        os.remove(os.path.join(export, "results.csv"))
        out = self.sweep("--report_only")
        self.assertEqual(out.returncode, 0, out.stdout[-3000:] + out.stderr[-3000:])
        with open(os.path.join(export, "results.csv")) as f:
            rebuilt = {r["run"]: r for r in csv.DictReader(f)}
        for name in (REF, RESUMED, BAD):
            for key in ("status", "final_val_loss", "best_val_loss", "tokens", "params"):
                self.assertEqual(rebuilt[name][key], rows[name][key], (name, key))

    # ~50 s on 2 cores (six trainer starts, two pairs of them at once); the scheduling, records
    # and report of --parallel are tested with the stand-in trainer in CI
    # (tests/lattn_jax/sweep_test.py ParallelTest, sweep_report_test.py SharedThroughputTest).
    @pytest.mark.slow
    def test_parallel_two_trains_as_one_at_a_time_does(self):
        with open(self.config, "w") as f:
            f.write(SWEEP_CONFIG.replace(
                'grid=((("train.nonfinite_policy", ("stop", "skip", "bogus")),),),',
                PARALLEL_GRID))
        out = self.sweep(f"--only={SOLO}")  # the reference, one at a time
        self.assertEqual(out.returncode, 0, out.stdout[-3000:] + out.stderr[-3000:])

        # Two at once, each stopped half-way by the trainer's own limit; the refused run
        # takes the first free slot and fails alone; the finished one is skipped.
        out = self.sweep("--parallel=2", "--override=train.max_steps_per_run=3")
        self.assertEqual(out.returncode, 3, out.stdout[-3000:] + out.stderr[-3000:])
        self.assertIn("up to 2 runs at once, sharing the machine "
                      "(XLA_PYTHON_CLIENT_MEM_FRACTION=0.45 each, on a GPU)", out.stdout)
        self.assertIn(f"--- {SOLO}: finished, skipped", out.stdout)
        self.assertIn(f"--- {SHARED_A}: starting (1 of 2 in flight)", out.stdout)
        self.assertIn(f"--- {SHARED_B}: starting (2 of 2 in flight)", out.stdout)
        # (when a slot frees: the other run may have exited by then, or not; its attempt
        # record says which, below)
        bad_start = re.search(rf"--- {re.escape(BAD)}: starting \(([12]) of 2 in flight\)",
                              out.stdout)
        self.assertIsNotNone(bad_start, out.stdout[-3000:])
        self.assertIn(f"[{SHARED_B}] Stopping", out.stdout)
        for name in (SHARED_A, SHARED_B):
            state = self.state(name)
            self.assertEqual((state.status, state.step), (sweep.Status.PARTIAL, 3), name)
        error = "error: train.nonfinite_policy='bogus'; choose from stop, skip"
        self.assertEqual((self.state(BAD).status, self.state(BAD).error),
                         (sweep.Status.FAILED, error))
        # Whether the failing run's trainer overlapped the other one's: a race (it is launched
        # when the first of the two exits; the second exits about then). Its attempt record
        # says how it went, and the report below is checked for that case.
        bad_end, = [a for a in sweep.read_jsonl(os.path.join(self.root, "runs", BAD,
                                                             sweep.ATTEMPTS))
                    if a["event"] == "end"]
        self.assertEqual(bad_end["parallel"], 2)
        self.assertIn(bad_end["concurrent"], (1, 2))
        overlapped = bad_end["concurrent"] == 2
        if bad_start.group(1) == "1":  # the other had ended and been collected: alone
            self.assertFalse(overlapped)

        # Again: both resume from their checkpoints at once; the failed run is skipped.
        out = self.sweep("--parallel=2")
        self.assertEqual(out.returncode, 0, out.stdout[-3000:] + out.stderr[-3000:])
        self.assertIn(f"--- {SHARED_A}: resuming from step 3 (1 of 2 in flight)", out.stdout)
        self.assertIn(f"--- {SHARED_B}: resuming from step 3 (2 of 2 in flight)", out.stdout)
        self.assertIn(f"--- {BAD}: failed before ({error}); skipped", out.stdout)
        solo = self.result(SOLO)
        for name in (SHARED_A, SHARED_B):
            shared = self.result(name)
            self.assertEqual((shared.step, shared.concurrent, shared.parallel), (6, 2, 2), name)
            # Equal to the bit on CPU (XLA's CPU programs do not depend on another process).
            self.assertEqual(shared.final_val_loss, solo.final_val_loss, name)
            self.assertEqual(shared.train_curve, solo.train_curve, name)
            for end in [a for a in sweep.read_jsonl(os.path.join(
                    self.root, "runs", name, sweep.ATTEMPTS)) if a["event"] == "end"]:
                self.assertEqual((end["parallel"], end["concurrent"]), (2, 2), name)
        self.assertEqual(solo.concurrent, 1)

        with open(os.path.join(self.root, "results.md")) as f:
            md = f.read()
        self.assertIn(f"| {SHARED_A} | finished | 6/6 |", md)
        # (on CPU: the machine, not a GPU, as the trainers recorded their devices)
        self.assertIn("shared the machine (parallel=2, up to 2 runs at once)", md)
        shared_bad = "wall time includes an attempt that shared the GPU (parallel=2, up to 2"
        if overlapped:
            # The failing run shared the machine too: 3 runs. It recorded no devices (it
            # failed before the trainer started jax), and sweep_report._shared_what words the
            # header "the GPU" unless every run counted recorded CPUs only.
            self.assertIn("- † 3 run(s) shared the GPU with other runs", md)
            self.assertIn(shared_bad, md)
        else:
            self.assertIn("- † 2 run(s) shared the machine with other runs", md)
            self.assertNotIn(shared_bad, md)
        with open(os.path.join(self.root, "results.csv")) as f:
            rows = {r["run"]: r for r in csv.DictReader(f)}
        self.assertEqual([rows[n]["concurrent"] for n in (SOLO, SHARED_A, SHARED_B)],
                         ["1", "2", "2"])
        with open(os.path.join(self.root, "sweep.jsonl")) as f:
            self.assertEqual([json.loads(line).get("parallel") for line in f], [None, 2, 2])

    # ~55 s on 2 cores (four trainer starts): the real trainer takes the re-measurement's
    # overrides; its scheduling, records and report are tested with the stand-in trainer in CI
    # (tests/lattn_jax/sweep_test.py RemeasureAloneTest, sweep_report_test.py).
    @pytest.mark.slow
    def test_remeasure_alone_with_the_real_trainer(self):
        with open(self.config, "w") as f:
            f.write(SWEEP_CONFIG.replace(
                'grid=((("train.nonfinite_policy", ("stop", "skip", "bogus")),),),',
                PARALLEL_GRID))
        only = (f"--only={SHARED_A}", f"--only={SHARED_B}")
        out = self.sweep("--parallel=2", *only)
        self.assertEqual(out.returncode, 0, out.stdout[-3000:] + out.stderr[-3000:])
        before = {n: self.result(n) for n in (SHARED_A, SHARED_B)}
        self.assertEqual([r.concurrent for r in before.values()], [2, 2])
        out = self.sweep("--remeasure_alone=5", *only)
        self.assertEqual(out.returncode, 0, out.stdout[-3000:] + out.stderr[-3000:])
        self.assertIn("0 run(s) launched, 2 re-measured alone", out.stdout)
        for name in (SHARED_A, SHARED_B):
            workdir = os.path.join(self.root, "runs", name)
            record = sweep.read_throughput_alone(workdir)
            self.assertEqual((record["steps"], record["windows"]), (5, 4), name)
            self.assertGreater(record["tokens_per_sec"], 0.0, name)
            train = sweep.last_config(os.path.join(workdir, sweep.ALONE_DIR))["train"]
            self.assertEqual((train["total_steps"], train["eval_every"],
                              train["checkpoint_every"]), (5, 5, 5), name)
            after = self.result(name)  # the run itself: as it was
            self.assertEqual((after.step, after.final_val_loss, after.concurrent),
                             (6, before[name].final_val_loss, 2), name)
        with open(os.path.join(self.root, "results.md")) as f:
            md = f.read()
        self.assertIn("‡ Measured alone in a 5-step run after training shared the GPU", md)
        out = self.sweep("--remeasure_alone=5", *only)  # again: nothing to do
        self.assertIn("0 run(s) launched, 0 re-measured alone", out.stdout)

    def test_dry_run_shows_what_max_runs_and_parallel_would_launch(self):
        # (it listed every run's status only: not which --max_runs / --parallel would launch)
        with open(self.config, "w") as f:
            f.write(SWEEP_CONFIG.replace(
                'grid=((("train.nonfinite_policy", ("stop", "skip", "bogus")),),),',
                PARALLEL_GRID))
        os.makedirs(os.path.join(self.root, "runs", SOLO))
        with open(os.path.join(self.root, "runs", SOLO, "console.log"), "w") as f:
            f.write("final: step 6\n")
        out = self.sweep("--dry_run", "--parallel=2", "--max_runs=2")
        self.assertEqual(out.returncode, 0, out.stderr)
        lines = [line for line in out.stdout.splitlines() if not line.startswith("  ")]
        self.assertEqual(lines, [
            "dry run of sweep entry: 4 run(s) selected; 2 would be launched, in this order; up "
            "to 2 at once: launches 1-2 at the start, each later one when a trainer exits",
            f"{SOLO}: finished (step 6); skipped: finished",
            f"{SHARED_A}: not started (step 0); launch 1: starting, at the start",
            f"{SHARED_B}: not started (step 0); launch 2: starting, at the start",
            f"{BAD}: not started (step 0); not launched: --max_runs=2 reached"])
        out = self.sweep("--dry_run", "--max_runs=2", "--deadline_s=100", "--min_run_s=80")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn(f"{SHARED_A}: not started (step 0); not launched: the deadline: 70 s "
                      f"before the trainer's stop, under --min_run_s 80", out.stdout)
        self.assertEqual(os.listdir(self.root), ["runs"])  # nothing written
        self.assertEqual(os.listdir(os.path.join(self.root, "runs")), [SOLO])

    def test_report_only_writes_the_export(self):
        # --report_only --export=DIR wrote the results but no export.
        workdir = os.path.join(self.root, "runs", REF)
        os.makedirs(os.path.join(workdir, "checkpoints", "6"))
        with open(os.path.join(workdir, "console.log"), "w") as f:
            f.write("final: step 6\n")
        with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
            f.write(json.dumps({"step": 6, "time": 1.0, "train_loss": 2.0, "val_loss": 2.5})
                    + "\n")
        with open(os.path.join(self.root, "sweep.jsonl"), "w") as f:
            f.write(json.dumps({"sweep": "entry", "status": "complete"}) + "\n")
        export = os.path.join(os.path.dirname(self.root), "export")
        out = self.sweep("--report_only", f"--export={export}")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn(f"exported 7 files to {export}", out.stdout)
        self.assertEqual(sorted(os.listdir(export)), [
            "curves.png", "records.tar.gz", "results.csv", "results.json", "results.md",
            "sweep.jsonl"])
        with tarfile.open(os.path.join(export, "records.tar.gz")) as tar:
            self.assertEqual(sorted(tar.getnames()), [f"runs/{REF}/console.log",
                                                      f"runs/{REF}/metrics.jsonl"])

    def test_help_lists_every_flag_of_the_binary(self):
        # --accept_config_changes is defined in lattn_jax.sweep_driver (the binary is at its
        # length limit); --help listed only the binary's own flags, so README's flag was
        # missing from it (2026-12-06).
        out = self.sweep("--help")
        for flag in ("--[no]accept_config_changes", "--[no]report_only", "--reuse_from"):
            self.assertIn(flag, out.stdout)

    def test_bad_flags_give_one_line(self):
        # A misspelled override field: every run would fail on it; refused before the root.
        out = self.sweep("--override=train.total_stepz=3")
        self.assertEqual(out.returncode, 1, out.stderr)
        self.assertEqual(len(out.stderr.strip().splitlines()), 1, out.stderr)
        self.assertRegex(out.stderr, r"error: --override: "
                                     r"train\.total_stepz: no such field in \S+\.py \((\d+) of "
                                     r"\1 runs, e\.g\. .*\); did you mean "
                                     r"\"train\.total_steps\"\?$")
        self.assertFalse(os.path.exists(self.root))
        # A value the field's type cannot take, and a whole section: the same, before the root.
        for override, want in (("train.total_steps=abc", "train.total_steps: cannot take 'abc' "
                                                         "(int: "),
                               ("train=3", "train: is a section, not a field in ")):
            out = self.sweep(f"--override={override}")
            self.assertEqual(out.returncode, 1, out.stderr)
            self.assertIn(want, out.stderr)
            self.assertFalse(os.path.exists(self.root))
        # A value the trainer's config check refuses: every run would fail on it; one line.
        out = self.sweep("--override=optim.learning_rate=-1")
        self.assertEqual(out.returncode, 1, out.stderr)
        self.assertEqual(out.stderr.strip().splitlines(), [
            "error: --override: optim.learning_rate must be > 0, got -1.0 (the training "
            "config's check, as each run's trainer makes it; nothing was run)"])
        self.assertFalse(os.path.exists(self.root))
        out = self.sweep("--only=arch=gdn")
        self.assertEqual(out.returncode, 1)
        self.assertIn("error: --only='arch=gdn': no axis arch; the axes are "
                      "train.nonfinite_policy", out.stderr)
        out = self.sweep("--override=micro_batch")
        self.assertIn("error: --override='micro_batch': expected field=value", out.stderr)
        self.assertNotIn("Traceback", out.stderr)
        # A --root that is a file: one line, the file kept.
        with open(self.root, "w") as f:
            f.write("kept\n")
        out = self.sweep("--report_only")
        self.assertEqual(out.returncode, 1, out.stderr)
        self.assertEqual(out.stderr.strip(),
                         f"error: --root={self.root} exists and is not a directory")
        with open(self.root) as f:
            self.assertEqual(f.read(), "kept\n")
        os.remove(self.root)
        # A run directory recorded with other settings under the same name.
        os.makedirs(os.path.join(self.root, "runs", REF))
        with open(os.path.join(self.root, "runs", REF, sweep.RUN_RECORD), "w") as f:
            json.dump({"name": REF, "arg": "arch=softmax,opt=adamw,tiny=True",
                       "overrides": []}, f)
        out = self.sweep(f"--only={REF}")
        self.assertEqual(out.returncode, 1)
        self.assertIn("error: run directories under --root hold runs of other settings", out.stderr)
        self.assertIn(f"{REF}: argument opt: 'adamw' -> 'muon'; override data.batch_size: None "
                      f"-> 2", out.stderr)

    def test_config_file_and_field_errors_are_one_readable_line(self):
        cases = [([f"--config={os.path.join(self.root, 'nope.py')}"],
                  f"error: cannot load --config={os.path.join(self.root, 'nope.py')}: No such "
                  "file or directory"),
                 (["--config.train_confg=x"],  # was '\\'train_confg\\'\\nDid you mean ...'
                  "error: unknown config option 'train_confg'. Did you mean \"train_config\" "
                  "instead of \"train_confg\"?"),
                 (["--config=configs/sweeps/table2_small.py:bad_arg=1"],
                  "error: flag --config=configs/sweeps/table2_small.py: unknown config argument "
                  "'bad_arg'; known: corpus, adamw_lr, muon_lr, rates_from, seeds, tiny"),
                 (["--config=configs/sweeps/lr_scan_small.py:corpus"],
                  "error: flag --config=configs/sweeps/lr_scan_small.py: config argument "
                  "'corpus' needs a value: corpus=... (the default is None)"),
                 # A field of the runs' experiment config given as --config.<field>: the
                 # message said only "unknown config option 'train'" (newcomer 2026-12-04).
                 (["--config.train.total_steps=3"],
                  "error: unknown config option 'train.total_steps' (this config has no "
                  "section train) (--config is the sweep's config: a field of every run's "
                  "experiment config goes in --override=train.total_steps=3)"),
                 (["--deadline_s=-1"],  # was accepted: the root made, exit 3 ("run again")
                  "error: flag --deadline_s=-1.0: must be above 0 seconds"),
                 (["--max_runs=0"], "error: flag --max_runs=0: 0 is not a positive integer"),
                 (["--parallel=0"], "error: flag --parallel=0: must be at least 1 (trainer "
                                    "subprocesses at once; 1 runs them one after another)"),
                 (["--report_only"],  # a mistyped root was created, holding an empty report
                  f"error: --root={self.root}: no such directory (--report_only rebuilds the "
                  f"results of an existing sweep; nothing was created)"),
                 # A mistyped --reuse_from was ignored (the runs ran again); a file, a traceback.
                 ([f"--reuse_from={self.root}-typo"],
                  f"error: --reuse_from={self.root}-typo does not exist"),
                 ([f"--reuse_from={self.config}"],
                  f"error: --reuse_from={self.config} is not a directory"),
                 # --export was checked only after every run (a traceback at the window's end).
                 ([f"--export={self.config}"],
                  f"error: --export={self.config} exists and is not a directory"),
                 ([f"--export={self.root}/out"],
                  f"error: --export={self.root}/out is inside --root={self.root}: name a "
                  f"directory outside it"),
                 # A train_config that is not a .py file: a traceback (newcomer 2026-12-04).
                 (["--config.train_config=README.md"],
                  f"error: train_config: {os.path.join(ROOT, 'README.md')} is not a Python "
                  f"config file (.py; configs/, e.g. configs/table2.py)"),
                 (["--config.train_config=configs"],
                  f"error: train_config: a directory, not a file: {os.path.join(ROOT, 'configs')}"),
                 (["--finish_by_deadline"],  # was silently a no-op
                  "error: --finish_by_deadline needs --deadline_s (the deadline it plans to)"),
                 (["--dry_run"], None)]  # lists the runs and writes nothing (it wrote results)
        # One process imports the binary's modules, a fork of it runs each command line
        # (tests/binary_runs.py: 17 launches cost 44 s of 2-core CI time, this one ~6 s); the
        # process this worker's other calls in os.environ use (binary_runs.run), not one more.
        results = [binary_runs.run([sys.executable, os.path.join(ROOT, "experiments", "sweep.py"),
                                    f"--config={self.config}", f"--root={self.root}", *flags_])
                   for flags_, _ in cases]
        for (flags_, want), result in zip(cases, results):
            with self.subTest(flags=flags_):
                if want is None:
                    self.assertEqual(result.returncode, 0, result.stderr)
                    self.assertIn(": not started (step 0)", result.stdout + result.stderr)
                    continue
                self.assertEqual(result.returncode, 1, result.stderr)
                self.assertEqual(result.stderr.strip().splitlines(), [want])
        self.assertFalse(os.path.exists(self.root))

    def test_bad_gpus_are_one_line_before_anything_is_written(self):
        cases = [("--gpus=0,,1", "error: --gpus='0,,1': empty GPU group or id in '' (expected "
                  "GPU ids joined by ',' between runs and '+' within one run's group, e.g. "
                  "0,1,2,3 or 0+1,2+3)"),
                 ("--gpus=0,x", "error: --gpus='0,x': 'x' is not a GPU id (a non-negative "
                  "integer)"),
                 ("--gpus=-1", "error: --gpus='-1': '-1' is a negative GPU id"),
                 ("--gpus=0+1,1", "error: --gpus='0+1,1': GPU 1 is given twice (each GPU "
                  "belongs to one group)"),
                 ("--gpus=", "error: --gpus='': empty GPU group or id in '' (expected GPU ids "
                  "joined by ',' between runs and '+' within one run's group, e.g. 0,1,2,3 or "
                  "0+1,2+3)")]
        argvs = [[f"--config={self.config}", f"--root={self.root}", flag] for flag, _ in cases]
        argvs.append([f"--config={self.config}", f"--root={self.root}", "--gpus=0,1",
                      "--parallel=3"])
        argvs.append([f"--config={self.config}", f"--root={self.root}", "--gpus=0,4",
                      "--dry_run"])
        argvs.append([f"--config={self.config}", f"--root={self.root}", "--gpus=0,4"])
        argvs.append([f"--config={self.config}", f"--root={self.root}", "--gpus=0+1,2+3",
                      "--dry_run"])
        # A machine of 4 GPUs, as nvidia-smi -L lists them (here a script that prints them).
        bin_dir = self.create_tempdir().full_path
        with open(os.path.join(bin_dir, "nvidia-smi"), "w") as f:
            lines = [f'echo "GPU {i}: NVIDIA H100 (UUID: GPU-{i})"\n' for i in range(4)]
            f.write("#!/bin/sh\n" + "".join(lines))
        os.chmod(os.path.join(bin_dir, "nvidia-smi"), 0o755)
        env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))
        results = binary_runs.run_many("experiments/sweep.py", argvs,
                                       self.create_tempdir().full_path, env=env)
        for (flag, want), result in zip(cases, results):
            with self.subTest(flag=flag):
                self.assertEqual(result.returncode, 1, result.stderr)
                self.assertEqual(result.stderr.strip().splitlines(), [want])
        self.assertEqual(results[-4].returncode, 1, results[-4].stderr)
        self.assertEqual(results[-4].stderr.strip().splitlines(), [
            "error: --parallel=3 is above the 2 GPU group(s) of --gpus=0,1 (one run per group "
            "at a time): leave --parallel out, or name more groups"])
        # A GPU the machine does not have: its trainer would run on the CPU, measured as alone.
        refusal = ("--gpus=0,4: GPU 4 is not on this machine (nvidia-smi -L lists 4 GPU(s), "
                   "ids 0-3): name GPUs it has, or leave --gpus out (--parallel=N runs N at "
                   "once, sharing the machine, and the results mark them)")
        self.assertEqual(results[-2].returncode, 1, results[-2].stderr)
        self.assertEqual(results[-2].stderr.strip().splitlines(), ["error: " + refusal])
        # A dry run plans it anyway (a plan for another machine) and says so first.
        self.assertEqual(results[-3].returncode, 0, results[-3].stderr)
        self.assertEqual(results[-3].stdout.splitlines()[0],
                         "dry run: the call would refuse to run here; " + refusal)
        # Without --parallel: one run per group, two at once, each on its group.
        self.assertEqual(results[-1].returncode, 0, results[-1].stderr)
        self.assertIn("; up to 2 at once: launches 1-2 at the start, each later one when a "
                      "trainer exits; one run per GPU group, each alone on it "
                      "(CUDA_VISIBLE_DEVICES 0,1 | 2,3)", results[-1].stdout)
        self.assertIn(f"{REF}: not started (step 0); launch 1: starting, at the start, on "
                      f"CUDA_VISIBLE_DEVICES=0,1", results[-1].stdout)
        self.assertFalse(os.path.exists(self.root))

    @pytest.mark.slow  # ~19 s of binaries; the CI keeps the one-line flag and config errors
    def test_another_sweeps_root_is_refused_and_left_alone(self):
        def run(config, *flags_):
            cmd = [sys.executable, os.path.join(ROOT, "experiments", "sweep.py"),
                   f"--config={config}", f"--root={self.root}", *flags_]
            return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)

        os.makedirs(self.root)  # --report_only reads an existing root
        out = run(self.config, "--report_only")  # sweep "entry" records itself in the root
        self.assertEqual(out.returncode, 0, out.stderr)
        with open(os.path.join(self.root, "results.json")) as f:
            before = f.read()
        for flags_ in (["--report_only"], ["--dry_run"], []):
            out = run("configs/sweeps/table7_small.py:tiny", *flags_)
            self.assertEqual(out.returncode, 1, out.stderr)
            self.assertEqual(out.stderr.strip().splitlines(), [
                f"error: --root {self.root} holds the results of sweep 'entry', not "
                f"'table7_small_tiny' (its results.json); use another --root for "
                f"'table7_small_tiny'"])
        with open(os.path.join(self.root, "results.json")) as f:
            self.assertEqual(f.read(), before)  # the report was not overwritten
        self.assertEqual(sorted(os.listdir(self.root)),
                         ["results.csv", "results.json", "results.md"])  # nothing launched
        out = run(self.config, "--dry_run", "--retry_failed")  # the same sweep again: fine
        self.assertEqual(out.returncode, 0, out.stderr)

    def test_a_halo_workdir_as_root_is_one_line_and_left_alone(self):
        # --report_only into experiments/halo_pipeline.py's workdir wrote results.{md,csv,json}
        # there; a sweep, its runs, sweep.jsonl and jax_cache. Refused as train.py refuses it.
        rng = np.random.default_rng()
        files = {"config.json": json.dumps({"teacher": {"kind": "gguf"}, "hypenet": {},
                                            "stage1": {"steps": int(rng.integers(1, 99))}}),
                 "pipeline.jsonl": json.dumps({"status": "deadline",
                                               "wall_s": float(rng.random())}) + "\n"}
        os.makedirs(self.root)
        for name, text in files.items():
            with open(os.path.join(self.root, name), "w") as f:
                f.write(text)
        config_json = os.path.join(self.root, "config.json")
        for flags_, doing in ((["--report_only"], "--report_only would write the sweep's "
                                                  "results files into"),
                              ([], "the sweep would write its runs and results into"),
                              (["--dry_run"], "the sweep would write its runs and results into")):
            result = binary_runs.run([sys.executable, os.path.join(ROOT, "experiments", "sweep.py"),
                                      f"--config={self.config}", f"--root={self.root}", *flags_])
            out, err = result.stdout, result.stderr
            self.assertEqual(result.returncode, 1, (flags_, out, err))
            self.assertEqual(err.strip().splitlines(), [
                f"error: {config_json} is not a training run's config (it has no 'model' "
                f"section; a HALO workdir): {doing} {self.root}. Use another --root (nothing "
                f"was written)"], flags_)
        self.assertEqual(sorted(os.listdir(self.root)), sorted(files))
        for name, text in files.items():
            with open(os.path.join(self.root, name)) as f:
                self.assertEqual(f.read(), text)

    def test_a_training_workdir_as_root_is_one_line_and_left_alone(self):
        # sweep.py wrote its runs/, sweep.jsonl and results into experiments/train.py's workdir.
        files = {"config.json": json.dumps({"model": {"d_model": 64}, "train": {}}),
                 "metrics.jsonl": json.dumps({"step": 1, "train_loss": 5.0}) + "\n"}
        os.makedirs(os.path.join(self.root, "checkpoints", "1"))
        for name, text in files.items():
            with open(os.path.join(self.root, name), "w") as f:
                f.write(text)
        for flags_, doing in ((["--report_only"], "--report_only would write the sweep's "
                                                  "results files into"),
                              ([], "the sweep would write its runs and results into")):
            result = self.sweep(*flags_)
            self.assertEqual(result.returncode, 1, (flags_, result.stdout, result.stderr))
            self.assertEqual(result.stderr.strip().splitlines(), [
                f"error: {self.root} is a training run's workdir (it has config.json with a "
                f"'model' section, checkpoints/ and metrics.jsonl; experiments/train.py writes "
                f"it), not a sweep root: {doing} {self.root}. Use another --root (nothing was "
                f"written)"], flags_)
        self.assertEqual(sorted(os.listdir(self.root)), sorted([*files, "checkpoints"]))
        self.assertEqual(os.listdir(os.path.join(self.root, "checkpoints")), ["1"])

    def test_a_training_workdir_without_checkpoints_yet_is_refused_too(self):
        # A run stopped before its first checkpoint (Ctrl-C while reading the data) holds the
        # trainer's lock and records only: the sweep wrote its runs/ and sweep.jsonl there,
        # after which train.py refused its own workdir as a sweep root.
        files = {".train.lock": "1234\n", "console.log": "==== 2026-12-04T00:00:00Z  train.py\n",
                 "invocations.jsonl": json.dumps({"argv": ["train.py"], "config": {}}) + "\n"}
        os.makedirs(self.root)
        for name, text in files.items():
            with open(os.path.join(self.root, name), "w") as f:
                f.write(text)
        result = self.sweep("--dry_run")
        self.assertEqual(result.returncode, 1, (result.stdout, result.stderr))
        self.assertEqual(result.stderr.strip().splitlines(), [
            f"error: {self.root} is a training run's workdir (it has .train.lock, "
            f"invocations.jsonl and console.log; experiments/train.py writes it), not a sweep "
            f"root: the sweep would write its runs and results into {self.root}. Use another "
            f"--root (nothing was written)"])
        self.assertEqual(sorted(os.listdir(self.root)), sorted(files))

    def test_missing_corpus_is_one_error_before_any_run(self):
        missing = os.path.join(self.root, "no_corpus")
        with open(self.config, "w") as f:
            f.write(SWEEP_CONFIG.replace('("tiny", True)),', f'("tiny", True), ("corpus", '
                                         f'{missing!r})), local_args=("corpus",),'))
        out = self.sweep()
        self.assertEqual(out.returncode, 1, out.stderr)
        self.assertIn(f"error: --config argument corpus={missing}: no such file or directory",
                      out.stderr)
        self.assertNotIn("Traceback", out.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.root, "runs")))

    def test_an_edited_training_config_is_refused_unless_accepted(self):
        # A finished run whose trainer recorded optim.warmup_steps=2, which the training
        # config (configs/table2.py, unchanged command) now gives as 1: as if edited since.
        namespace = {}
        exec(SWEEP_CONFIG, namespace)  # noqa: S102 - the test's own config text
        run = [r for r in sweep.expand(namespace["get_config"]()) if r.name == REF][0]
        recorded = sweep.resolved_config(os.path.join(ROOT, "configs", "table2.py"), run.arg,
                                         run.overrides, {})
        self.assertEqual(recorded["optim"]["warmup_steps"], 1)
        recorded["optim"]["warmup_steps"] = 2
        workdir = os.path.join(self.root, "runs", REF)
        os.makedirs(os.path.join(workdir, "checkpoints", "6"))
        with open(os.path.join(workdir, "console.log"), "w") as f:
            f.write("final: step 6\n")
        with open(os.path.join(workdir, "invocations.jsonl"), "w") as f:
            f.write(json.dumps({"config": recorded}) + "\n")
        out = self.sweep(f"--only={REF}")
        self.assertEqual(out.returncode, 1, out.stderr)
        self.assertIn("error: run directories under --root were trained with another "
                      "experiment config than configs/table2.py gives them now", out.stderr)
        self.assertIn(f"\n  {REF}: optim.warmup_steps 2 -> 1\n", out.stderr)
        self.assertNotIn("Traceback", out.stderr)
        self.assertEqual(sorted(os.listdir(self.root)), ["runs"])  # nothing written
        out = self.sweep(f"--only={REF}", "--accept_config_changes")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn(f"--- {REF}: finished, skipped", out.stdout)
        with open(os.path.join(self.root, "results.md")) as f:
            self.assertIn(f"| {REF} \u00b6 | finished |", f.read())


if __name__ == "__main__":
    absltest.main()
