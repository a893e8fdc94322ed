"""Sweeps (lattn_jax/sweep.py): grid expansion and filters, run status and metrics from run
directories, and the sequential runner (skip, resume, failure, deadline) with a stand-in
trainer (a few lines of Python that write the trainer's files; the real trainer is run by
tests/experiments/sweep_test.py)."""

import dataclasses
import fcntl
import itertools
import json
import os
import random
import re
import signal
import sys
import tarfile
import textwrap
import threading
import time
from unittest import mock

import numpy as np
from absl.testing import absltest

from configs.sweeps import table2_small, table7_small
from lattn_jax import sweep, sweep_report

# A stand-in for experiments/train.py: it writes what the trainer writes (invocations.jsonl,
# console.log with the "model:" and "final:" lines, metrics.jsonl, checkpoints/<step>) and
# resumes from its newest checkpoint. --config.fake.mode: ok | fail (the trainer's one-line
# error, exit 1) | slow (40 steps of 0.05 s; SIGTERM saves a checkpoint and exits 143, as the
# trainer's preemption handler does). --config.fake.startup_s: seconds before it writes
# anything (SIGTERM then kills it, as it would the trainer while it imports).
# --config.fake.fail_alone=True: fails as mode=fail does, in a workdir named alone (the
# re-measurement of --remeasure_alone) only. With FAKE_RECORD_GPUS set in its environment, a
# run that ends normally writes <workdir>/fake_gpus.json: its CUDA_VISIBLE_DEVICES and
# XLA_PYTHON_CLIENT_MEM_FRACTION, and its start and end times (time.time()).
FAKE_TRAINER = textwrap.dedent('''
    import json, os, signal, sys, time
    t_start = time.time()
    args = sys.argv[1:]
    workdir = [a.split("=", 1)[1] for a in args if a.startswith("--workdir=")][0]
    opts = dict(a[len("--config."):].split("=", 1) for a in args if a.startswith("--config."))
    time.sleep(float(opts.get("fake.startup_s", os.environ.get("FAKE_STARTUP_S", "0"))))
    mode = opts.get("fake.mode", "ok")
    total = int(opts.get("train.total_steps", "40" if mode == "slow" else "4"))
    if mode == "fail":
        print("error: fake.mode='fail'; choose ok or slow", file=sys.stderr)
        sys.exit(1)
    if opts.get("fake.fail_alone") == "True" and os.path.basename(workdir) == "alone":
        print("error: fake.fail_alone=True: no re-measurement here", file=sys.stderr)
        sys.exit(1)
    os.makedirs(os.path.join(workdir, "checkpoints"), exist_ok=True)
    steps = sorted(int(n) for n in os.listdir(os.path.join(workdir, "checkpoints")))
    step = steps[-1] if steps else 0
    config = {"train": {"total_steps": total}, "data": {"batch_size": 2, "seq_len": 8},
              "model": {"vocab_size": 10, "d_model": 4, "tie_embeddings": False}}
    # A re-measurement records a device kind (the trainer records jax's; runs here: none).
    device = ({"devices": {"backend": "cpu", "count": 1, "kinds": ["fake alone kind"]}}
              if os.path.basename(workdir) == "alone" else {})
    with open(os.path.join(workdir, "invocations.jsonl"), "a") as f:
        f.write(json.dumps({"time": "2026-01-01T00:00:00Z", **device, "config": config})
                + "\\n")
    log = open(os.path.join(workdir, "console.log"), "a")
    log.write("model: 1,000 parameters, layers ['gdn'], d_model 4, backend cpu\\n")
    stop = []
    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
    metrics = open(os.path.join(workdir, "metrics.jsonl"), "a")
    while step < total:
        step += 1
        metrics.write(json.dumps({"step": step, "time": time.time(), "train_loss": 10.0 / step,
                                  "tokens_per_sec": 100.0 * step}) + "\\n")
        if step % 2 == 0 or step == total:
            metrics.write(json.dumps({"step": step, "time": time.time(),
                                      "val_loss": 11.0 / step}) + "\\n")
            os.makedirs(os.path.join(workdir, "checkpoints", str(step)), exist_ok=True)
        metrics.flush()
        if mode == "slow":
            time.sleep(0.05)
        if stop:
            os.makedirs(os.path.join(workdir, "checkpoints", str(step)), exist_ok=True)
            print(f"Stopping at step {step} of {total}", flush=True)
            sys.exit(143)
    if os.environ.get("FAKE_RECORD_GPUS"):
        with open(os.path.join(workdir, "fake_gpus.json"), "w") as f:
            json.dump({"gpus": os.environ.get("CUDA_VISIBLE_DEVICES"),
                       "mem_fraction": os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION"),
                       "t0": t_start, "t1": time.time()}, f)
    print(f"step {step} done", flush=True)
    log.write(f"final: step {step}  train_loss {10.0 / step:.4f}  val_loss {11.0 / step:.4f}\\n")
''')


def _eight_gpus():
    """``sweep_driver.machine_gpus`` of a host of 8 GPUs (the stand-in trainers run on any)."""
    return 8, "nvidia-smi -L lists 8 GPU(s)"


def _write_finished(root, runs, walls, concurrency):
    """Records each of ``runs`` as finished after ``walls`` seconds with that many runs at
    once (``concurrency``; above 1: the attempt's ``parallel=2`` concurrency fields)."""
    for run, wall, concurrent in zip(runs, walls, concurrency):
        workdir = sweep.run_dir(root, run)
        os.makedirs(workdir)
        with open(os.path.join(workdir, "console.log"), "w") as f:
            f.write("final: step 4\n")
        end = {"event": "end", "returncode": 0, "wall_s": wall}
        if concurrent > 1:
            end.update(parallel=2, concurrent=concurrent, shared_s=wall)
        with open(os.path.join(workdir, sweep.ATTEMPTS), "w") as f:
            f.write(json.dumps({"event": "start"}) + "\n" + json.dumps(end) + "\n")


def _stand_in_repo(root, config_dict):
    """``<root>/repo`` with the stand-in trainer as ``experiments/train.py`` and
    ``configs/fake.py`` returning ``ml_collections.ConfigDict(<config_dict>)`` (Python source
    text); returns its path."""
    repo = os.path.join(root, "repo")
    os.makedirs(os.path.join(repo, "experiments"))
    os.makedirs(os.path.join(repo, "configs"))
    with open(os.path.join(repo, "experiments", "train.py"), "w") as f:
        f.write(FAKE_TRAINER)
    with open(os.path.join(repo, "configs", "fake.py"), "w") as f:
        f.write(f"import ml_collections\ndef get_config(arg=None):\n"
                f"    return ml_collections.ConfigDict({config_dict})\n")
    return repo


def _config(**changes):
    config = dict(
        name="demo", train_config="configs/table2.py", arg=(("size", "small"),),
        overrides=(("train.tensorboard", False),),
        grid=((("arch", ("gdn", "softmax")), ("optim.learning_rate", (1e-3, 3e-3)),
               ("seed", (42, 43))),
              (("arch", ("kda",)), ("optim.learning_rate", (1e-3,)), ("seed", (42,)))),
        seed_axis="seed")
    config.update(changes)
    return config


class ExpandTest(absltest.TestCase):

    def test_blocks_in_order_last_axis_fastest(self):
        runs = sweep.expand(_config())
        self.assertEqual([r.name for r in runs[:3]], [
            "arch=gdn,optim.learning_rate=0.001,seed=42",
            "arch=gdn,optim.learning_rate=0.001,seed=43",
            "arch=gdn,optim.learning_rate=0.003,seed=42"])
        self.assertLen(runs, 9)
        self.assertEqual(runs[-1].name, "arch=kda,optim.learning_rate=0.001,seed=42")

    def test_arguments_and_overrides_are_split_by_the_dot(self):
        run = sweep.expand(_config())[1]
        self.assertEqual(run.arg, "size=small,arch=gdn,seed=43")
        self.assertEqual(run.overrides, (("train.tensorboard", False),
                                         ("optim.learning_rate", 1e-3)))
        self.assertEqual(run.group, "arch=gdn,optim.learning_rate=0.001")
        self.assertEqual(run.seed, 43)
        self.assertEqual(run.value("arch"), "gdn")

    def test_format_value(self):
        values = (3.6e-4, 1e-5, 3, True, None, "gdn", ("gdn", "attn"))
        self.assertEqual([sweep.format_value(v) for v in values],
                         ["0.00036", "1e-05", "3", "True", "None", "gdn", "('gdn', 'attn')"])

    def test_command(self):
        run = sweep.expand(_config())[0]
        cmd = sweep.command(run, config_path="/r/configs/table2.py", workdir="/w/x",
                            train_script="/r/experiments/train.py", python="py",
                            extra_overrides=(("train.micro_batch_size", "8"),))
        self.assertEqual(cmd, [
            "py", "/r/experiments/train.py",
            "--config=/r/configs/table2.py:size=small,arch=gdn,seed=42", "--workdir=/w/x",
            "--config.train.tensorboard=False", "--config.optim.learning_rate=0.001",
            "--config.train.micro_batch_size=8"])

    def test_bad_configs_name_the_option(self):
        cases = [
            (dict(grid=()), r"grid: no blocks"),
            (dict(train_config=""), r"^train_config: the training config file is missing$"),
            (dict(grid=((("arch", ()),),)), r"grid\[0\] axis 'arch': values must be"),
            (dict(grid=((("arch", ("a",)), ("arch", ("b",))),)), r"grid\[0\]: an axis appears"),
            (dict(grid=((("arch", ("a,b",)),),)), r"holds ','"),
            (dict(grid=((("corpus", ("/data/x",)),),)), r"holds '/'"),
            (dict(grid=((("arch", ("a",)),), (("arch", ("a",)),))),
             r"grid\[1\]: run 'arch=a' is already in grid\[0\]"),
            (dict(arg="size=small"), r"arg must be a tuple of \(name, value\) pairs"),
        ]
        for changes, message in cases:
            with self.subTest(message):
                with self.assertRaisesRegex(sweep.SweepConfigError, message):
                    sweep.expand(_config(**changes))

    def test_a_config_of_another_kind_is_named(self):
        # Newcomer pass: "train_config: the training config file is missing" for a training
        # config given to sweep.py.
        from configs import default
        with self.assertRaisesRegex(
                sweep.SweepConfigError,
                r"^--config is not a sweep config \(configs/sweeps/; it has no train_config or "
                r"grid\): it is a training config \(sections model, data, optim, train, mesh\), "
                r"which experiments/train\.py takes; a sweep config names one as its "
                r"train_config$"):
            sweep.expand(default.get_config())
        halo = {"teacher": {}, "hypenet": {}, "stage1": {}}
        with self.assertRaisesRegex(sweep.SweepConfigError,
                                    r"it is a HALO pipeline config .*, which "
                                    r"experiments/halo_pipeline\.py .* takes$"):
            sweep.expand(halo)


class CheckRootTest(absltest.TestCase):

    def test_another_sweeps_name_in_results_or_in_the_invocation_log_is_refused(self):
        root = self.create_tempdir().full_path
        sweep.check_root(root, {"name": "a"})  # empty root
        with open(os.path.join(root, "sweep.jsonl"), "w") as f:
            f.write(json.dumps({"command": "python sweep.py", "status": "complete"}) + "\n")
            f.write(json.dumps({"command": "python sweep.py", "sweep": "a"}) + "\n")
        sweep.check_root(root, {"name": "a"})  # lines without a name (older) and its own
        # results.json deleted, runs/ left: the invocation log still names the sweep.
        with self.assertRaisesRegex(sweep.SweepConfigError,
                                    r"holds the results of sweep 'a', not 'b' \(its "
                                    r"sweep\.jsonl\)"):
            sweep.check_root(root, {"name": "b"})
        with open(os.path.join(root, "results.json"), "w") as f:
            json.dump({"sweep": "a"}, f)
        with self.assertRaisesRegex(sweep.SweepConfigError, r"\(its results\.json\)"):
            sweep.check_root(root, {"name": "b"})
        # --report_only reads an existing sweep: a missing (mistyped) root is refused.
        sweep.check_root(root, {"name": "a"}, report_only=True)
        missing = os.path.join(root, "lr_scna")
        want = f"--root={missing}: no such directory (--report_only rebuilds the results"
        with self.assertRaisesRegex(sweep.SweepConfigError, "^" + re.escape(want)):
            sweep.check_root(missing, {"name": "a"}, report_only=True)
        self.assertFalse(os.path.exists(missing))
        sweep.check_root(missing, {"name": "a"})  # a new sweep may start there
        # No config name: the root's base name, as the report names it.
        self.assertEqual(sweep.sweep_name({}, os.path.join(root, "lr_scan")), "lr_scan")

    def test_a_sweeps_runs_folder_is_refused_as_the_root_naming_its_parent(self):
        # records.tar.gz extracts into runs/<name>/; --root=<that>/runs wrote a report of
        # "not started" runs into the runs folder (2026-12-06, a newcomer's rebuild).
        root = self.create_tempdir().full_path
        run = os.path.join(root, sweep.RUNS_DIR, "arch=gdn,seed=42")
        os.makedirs(run)
        with open(os.path.join(run, sweep.RUN_RECORD), "w") as f:
            json.dump({"name": "arch=gdn,seed=42"}, f)
        runs = os.path.join(root, sweep.RUNS_DIR)
        for report_only in (True, False):
            with self.assertRaisesRegex(
                    sweep.SweepConfigError,
                    f"^--root={re.escape(runs)} is a sweep's runs/ folder, not its root "
                    f"\\(arch=gdn,seed=42 in it has sweep_run.json\\): give its parent, "
                    f"{re.escape(root)} \\(nothing was written\\)$"):
                sweep.check_root(runs, {"name": "a"}, report_only=report_only)
        self.assertEqual(os.listdir(runs), ["arch=gdn,seed=42"])
        sweep.check_root(root, {"name": "a"}, report_only=True)  # the parent is the root

    def test_a_halo_workdir_is_refused_by_trains_check_with_and_without_report_only(self):
        # experiments/halo_pipeline.py's workdir (its config.json has a teacher section and no
        # model one): --report_only wrote results.{md,csv,json} into it, a sweep its runs.
        rng = random.Random(os.getpid())
        root = self.create_tempdir().full_path
        files = {"config.json": json.dumps({"teacher": {"kind": "gguf"}, "hypenet": {},
                                            "stage1": {"steps": rng.randint(1, 99)}}),
                 "pipeline.jsonl": json.dumps({"status": "complete",
                                               "wall_s": rng.random()}) + "\n",
                 os.path.join("stage1", "done.json"): json.dumps({"loss": rng.random()})}
        for name, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(root, name)), exist_ok=True)
            with open(os.path.join(root, name), "w") as f:
                f.write(text)
        path = re.escape(os.path.join(root, "config.json"))
        for report_only, doing in ((True, "--report_only would write the sweep's results "
                                          "files into "),
                                   (False, "the sweep would write its runs and results into ")):
            with self.assertRaisesRegex(
                    sweep.SweepConfigError,
                    f"^{path} is not a training run's config \\(it has no 'model' section; a "
                    f"HALO workdir\\): {re.escape(doing + root)}\\. Use another --root "
                    f"\\(nothing was written\\)$"):
                sweep.check_root(root, {"name": "a"}, report_only=report_only)
        for name, text in files.items():  # untouched, nothing added
            with open(os.path.join(root, name)) as f:
                self.assertEqual(f.read(), text)
        self.assertEqual(sorted(os.listdir(root)), ["config.json", "pipeline.jsonl", "stage1"])
        # A training run's config.json (a model section) is not a HALO workdir's, but it is a
        # training run's workdir, which train.py takes as its own: refused as that.
        with open(os.path.join(root, "config.json"), "w") as f:
            json.dump({"model": {"d_model": rng.randint(8, 64)}}, f)
        with self.assertRaisesRegex(
                sweep.SweepConfigError,
                f"^{re.escape(root)} is a training run's workdir \\(it has config.json with a "
                f"'model' section; experiments/train.py writes it\\)"):
            sweep.check_root(root, {"name": "a"}, report_only=True)


class SelectTest(absltest.TestCase):

    def test_filters(self):
        runs = sweep.expand(_config())

        def names(*only):
            return [r.name for r in sweep.select(runs, only)]

        self.assertLen(names(), 9)
        self.assertEqual(names("arch=gdn,seed=43"), [
            "arch=gdn,optim.learning_rate=0.001,seed=43",
            "arch=gdn,optim.learning_rate=0.003,seed=43"])
        # Repeated filters are alternatives; globs on values and on the whole name.
        self.assertLen(names("arch=kda", "arch=soft*,optim.learning_rate=0.003"), 3)
        self.assertEqual(names("*kda*"), ["arch=kda,optim.learning_rate=0.001,seed=42"])
        with self.assertRaisesRegex(sweep.SweepConfigError, r"--only='opt=muon': no axis opt"):
            names("opt=muon")
        # A filter that matches nothing is a typo in a value: an error naming the values, not
        # an empty sweep reported as complete.
        with self.assertRaisesRegex(sweep.SweepConfigError,
                                    r"--only='arch=gdnn' matches no run of the grid "
                                    r"\(arch: gdn, kda, softmax\)"):
            names("arch=gdnn")
        with self.assertRaisesRegex(sweep.SweepConfigError, r"--only='\*mamba\*' matches no"):
            names("arch=gdn", "*mamba*")
        # Values that each occur but never in one run (the grid is not a full product: here
        # kda has only seed 42, as table2_small.py's groups have seed 43 only with seeds=2)
        # are said to be that; a typo keeps the short message.
        with self.assertRaisesRegex(sweep.SweepConfigError,
                                    r"--only='arch=kda,seed=43' matches no run of the grid "
                                    r"\(arch: gdn, kda, softmax; seed: 42, 43\); each of its "
                                    r"conditions matches some run, but no run meets them all"):
            names("arch=kda,seed=43")
        with self.assertRaisesRegex(sweep.SweepConfigError, r"\(arch: gdn, kda, softmax\)$"):
            names("arch=gdnn")


class RunDirTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.dir = self.create_tempdir().full_path

    def _write(self, name, lines):
        with open(os.path.join(self.dir, name), "a") as f:
            for line in lines:
                f.write((json.dumps(line) if isinstance(line, dict) else line) + "\n")

    def _invocation(self, total=4):
        self._write("invocations.jsonl", [{"time": "2026-01-01T00:00:00Z", "config": {
            "train": {"total_steps": total}, "data": {"batch_size": 2, "seq_len": 8},
            "model": {"vocab_size": 10, "d_model": 4, "tie_embeddings": False}}}])

    def test_not_started(self):
        self.assertEqual(sweep.run_state(os.path.join(self.dir, "none")).status,
                         sweep.Status.NOT_STARTED)

    def test_partial_failed_finished(self):
        self._write(sweep.ATTEMPTS, [{"event": "start"}])
        self.assertEqual(sweep.run_state(self.dir).status, sweep.Status.PARTIAL)  # sweep died
        self._write(sweep.ATTEMPTS, [{"event": "end", "returncode": 1,
                                      "error": "error: bad option"}])
        state = sweep.run_state(self.dir)
        self.assertEqual((state.status, state.error, state.attempts),
                         (sweep.Status.FAILED, "error: bad option", 1))
        # Killed by a signal, stopped by the sweep, Ctrl-C twice, a SIGTERM or a SIGHUP (an ssh
        # disconnect) held back until a checkpoint write was complete (143 or 129, not sent by
        # the sweep): resumable, not failed.
        for end in ({"returncode": -9}, {"returncode": -15, "stopped_by": "deadline"},
                    {"returncode": 130}, {"returncode": 1, "stopped_by": "interrupt"},
                    {"returncode": 143, "stopped_by": None},
                    {"returncode": 128 + signal.SIGHUP, "stopped_by": None}):
            self._write(sweep.ATTEMPTS, [{"event": "start"}, {"event": "end", **end}])
            self.assertEqual(sweep.run_state(self.dir).status, sweep.Status.PARTIAL, end)
        os.makedirs(os.path.join(self.dir, "checkpoints", "2"))
        os.makedirs(os.path.join(self.dir, "checkpoints", "3.orbax-checkpoint-tmp-1"))
        self._invocation(total=4)
        self._write("console.log", ["final: step 2  train_loss 1.0  val_loss 1.0"])
        state = sweep.run_state(self.dir)
        self.assertEqual((state.status, state.step, state.total_steps),
                         (sweep.Status.PARTIAL, 2, 4))  # finished an earlier, shorter run
        self._write("console.log", ["final: step 4  train_loss 1.0  val_loss 1.0"])
        self.assertEqual(sweep.run_state(self.dir).status, sweep.Status.FINISHED)

    def test_attempts_cut_short_by_a_kill_are_dropped_and_the_next_append_is_whole(self):
        path = os.path.join(self.dir, sweep.ATTEMPTS)
        sweep._append_jsonl(path, {"event": "start"})
        with open(path, "a") as f:
            f.write('{"event": "end", "wall')  # the sweep killed mid-record
        with self.assertLogs(level="WARNING") as logs:
            self.assertEqual(sweep.read_jsonl(path), [{"event": "start"}])
        self.assertLen(logs.output, 1)
        self.assertIn(f"{path}: dropped its last line, cut short", logs.output[0])
        sweep._append_jsonl(path, {"event": "start"})
        with open(path) as f:
            self.assertEqual([json.loads(line) for line in f], [{"event": "start"}] * 2)

    def test_collect(self):
        self._invocation(total=4)
        self._write("console.log", ["model: 1,000 parameters, layers ['gdn'], d_model 4"])
        self._write("metrics.jsonl", [
            {"step": 1, "time": 10.0, "train_loss": 5.0},
            {"step": 2, "time": 11.0, "train_loss": 4.0, "tokens_per_sec": 100.0, "mfu": 0.2},
            {"step": 2, "time": 11.0, "val_loss": 4.5},
            {"step": 3, "time": 12.0, "train_loss": 3.0, "tokens_per_sec": 300.0, "mfu": 0.4},
            # resumed from step 2: step 3 again (its newest record counts)
            {"step": 3, "time": 13.0, "train_loss": 3.5, "tokens_per_sec": 200.0, "mfu": 0.3},
            {"step": 4, "time": 14.0, "train_loss": 2.0, "tokens_per_sec": 10.0, "mfu": 0.01},
            {"step": 4, "time": 14.0, "val_loss": 4.7},
            "{\"step\": 5, \"tim",  # torn last line
        ])
        self._write(sweep.ATTEMPTS, [{"event": "start"}, {"event": "end", "wall_s": 5.0},
                                     {"event": "start"}, {"event": "end", "wall_s": 7.0}])
        r = sweep.collect(self.dir)
        self.assertEqual((r.final_val_loss, r.best_val_loss, r.best_val_step, r.last_val_step),
                         (4.7, 4.5, 2, 4))
        self.assertEqual((r.final_train_loss, r.step, r.tokens, r.tokens_per_step),
                         (2.0, 4, 64, 16))
        self.assertEqual((r.tokens_per_sec, r.mfu), (100.0, 0.2))  # medians of 100, 200, 10
        self.assertEqual((r.params, r.non_embedding_params), (1000, 1000 - 2 * 10 * 4))
        self.assertEqual(r.wall_s, 12.0)
        self.assertEqual(r.val_curve, [(32, 4.5), (64, 4.7)])
        self.assertEqual(r.train_curve[2], (48, 3.5))

    def test_describe_exit_names_a_stop_at_the_deadline(self):
        def words(returncode, stopped_by):
            return sweep._describe_exit(sweep.Attempt(returncode=returncode, wall_s=1.0,
                                                      stopped_by=stopped_by, error=None))

        # 143: the trainer saved and exited on the sweep's SIGTERM; -15: SIGTERM killed it
        # (still importing).
        for rc in (143, -signal.SIGTERM):
            self.assertEqual(words(rc, "deadline"), "stopped at the deadline")
        # Anything else keeps its real status: killed after the grace period, its own error.
        self.assertEqual(words(-signal.SIGKILL, "deadline"), "exit -9 after the deadline's SIGTERM")
        self.assertEqual(words(1, "deadline"), "exit 1 after the deadline's SIGTERM")
        self.assertEqual(words(0, "deadline"), "exit 0")
        for rc in (1, 143, -signal.SIGKILL):
            self.assertEqual(words(rc, None), f"exit {rc}")
        # The sweep's own Ctrl-C / SIGTERM passed on to the trainer: a stop, not a failure.
        for rc in (143, -signal.SIGTERM):
            self.assertEqual(words(rc, "interrupt"), "stopped at the sweep's interrupt")
        self.assertEqual(words(-signal.SIGKILL, "interrupt"),
                         "exit -9 after the SIGTERM of the sweep's interrupt")

    def test_error_line(self):
        self.assertEqual(sweep.error_line(["a\n", "error: x bad\n", "shutting down\n"]),
                         "error: x bad")
        self.assertEqual(sweep.error_line([
            "Traceback (most recent call last):\n", "  File 'x.py'\n",
            "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory\n", "\n"]),
            "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory")
        self.assertEqual(sweep.error_line(["Segmentation fault\n"]), "Segmentation fault")
        self.assertIsNone(sweep.error_line([]))


def _snapshot(root):
    """Every file under ``root`` with its contents (to assert that a call wrote nothing)."""
    out = {}
    for base, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(base, name), "rb") as f:
                out[os.path.join(base, name)] = f.read()
    return out


def _partial_run_without_checkpoint(workdir):
    """A run directory with a training record and an attempt, and no checkpoint."""
    os.makedirs(workdir)
    with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
        f.write(json.dumps({"step": 1, "train_loss": 99.0}) + "\n")
    with open(os.path.join(workdir, sweep.ATTEMPTS), "w") as f:
        f.write(json.dumps({"event": "start"}) + "\n")


class _FakeTrainerTestCase(absltest.TestCase):
    """A temporary root holding the stand-in trainer (``FAKE_TRAINER``), and the lines printed."""

    def setUp(self):
        super().setUp()
        self.root = self.create_tempdir().full_path
        self.trainer = os.path.join(self.root, "fake_train.py")
        with open(self.trainer, "w") as f:
            f.write(FAKE_TRAINER)
        self.lines = []


class ExecuteTest(_FakeTrainerTestCase):
    """The runner with the stand-in trainer: a few seconds in all."""

    def _execute(self, modes, **kwargs):
        config = _config(grid=((("fake.mode", modes),),), seed_axis=None)
        runs = sweep.expand(config)
        return runs, sweep.execute(runs, self.root, config_path="cfg.py",
                                   train_script=self.trainer, cwd=self.root,
                                   print_fn=self.lines.append, **kwargs)

    def test_failure_does_not_stop_the_sweep_and_finished_runs_are_skipped(self):
        runs, summary = self._execute(("fail", "ok"))
        self.assertEqual(summary.status, "complete")
        self.assertEqual(summary.launched, [r.name for r in runs])
        failed, ok = (sweep.run_state(sweep.run_dir(self.root, r)) for r in runs)
        self.assertEqual((failed.status, failed.error),
                         (sweep.Status.FAILED, "error: fake.mode='fail'; choose ok or slow"))
        self.assertEqual(ok.status, sweep.Status.FINISHED)
        self.assertEqual(sweep.collect(sweep.run_dir(self.root, runs[1])).final_val_loss, 11 / 4)
        with open(os.path.join(sweep.run_dir(self.root, runs[0]), sweep.RUN_LOG)) as f:
            self.assertIn("error: fake.mode='fail'", f.read())
        self.assertRegex("\n".join(self.lines),  # a real failure keeps its exit status
                         rf"--- {re.escape(runs[0].name)}: failed after \d+ s \(exit 1\): "
                         rf"error: fake\.mode='fail'")
        # Again: nothing runs; the failed run is retried only when asked.
        _, summary = self._execute(("fail", "ok"))
        self.assertEqual((summary.launched, sorted(summary.skipped.values())),
                         ([], ["failed: error: fake.mode='fail'; choose ok or slow",
                               "finished"]))
        _, summary = self._execute(("fail", "ok"), retry_failed=True)
        self.assertEqual(summary.launched, [runs[0].name])

    def test_deadline_stops_the_trainer_and_the_next_call_resumes(self):
        runs, summary = self._execute(("slow",), deadline=time.time() + 1.5, stop_margin_s=0.5)
        workdir = sweep.run_dir(self.root, runs[0])
        state = sweep.run_state(workdir)
        self.assertEqual((summary.status, state.status), ("deadline", sweep.Status.PARTIAL))
        self.assertGreater(state.step, 0)
        attempts = sweep.read_jsonl(os.path.join(workdir, sweep.ATTEMPTS))
        self.assertEqual((attempts[-1]["stopped_by"], attempts[-1]["returncode"]),
                         ("deadline", 143))
        # The sweep's own SIGTERM: said as such, not as an "exit 143" that reads as a failure.
        ended = [x for x in self.lines if x.startswith(f"--- {runs[0].name}: partial after ")]
        self.assertLen(ended, 1, self.lines)
        self.assertRegex(ended[0], r"^--- \S+: partial after \d+ s \(stopped at the deadline\)")
        self.assertNotIn("143", ended[0])
        resumed_from = state.step
        # Too little time left for --min_run_s: the partial run is named as partial, not
        # "not started" (2026-12-04: a window's last call printed that of a partial run).
        _, summary = self._execute(("slow",), deadline=time.time() + 30, min_run_s=60)
        self.assertEqual((summary.status, summary.launched), ("deadline", []))
        self.assertIn(f"--- fake.mode=slow: partial at step {resumed_from}/40; not launched: ",
                      self.lines[-1])
        self.assertIn("under --min_run_s 60", self.lines[-1])
        # More than --min_run_s left, but less once the stop margin is taken off: the trainer
        # would train for ~40 s of the 60 asked (it was launched: the rehearsal of 2026-12-04).
        _, summary = self._execute(("slow",), deadline=time.time() + 70, min_run_s=60,
                                   stop_margin_s=30)
        self.assertEqual((summary.status, summary.launched), ("deadline", []))
        self.assertRegex(self.lines[-1], r"not launched: (39|40) s left before the trainer's "
                                         r"stop \(30 s before the deadline\), under --min_run_s 60")
        _, summary = self._execute(("ok",), max_runs=1)
        self.assertEqual(summary.status, "complete")
        self.assertIn("--- fake.mode=ok: starting", self.lines)
        # The "slow" run is not in this grid: run it again through its own grid.
        _, summary = self._execute(("slow",))
        self.assertEqual(summary.status, "complete")
        self.assertIn(f"--- fake.mode=slow: resuming from step {resumed_from}", self.lines)
        self.assertEqual(sweep.run_state(workdir).status, sweep.Status.FINISHED)

    def test_finish_by_deadline_holds_back_a_run_that_would_not_finish(self):
        config = _config(grid=((("fake.mode", ("slow",)), ("train.total_steps", (8, 9, 10))),),
                         seed_axis=None)
        runs = sweep.expand(config)

        def execute(**kwargs):
            return sweep.execute(runs, self.root, config_path="cfg.py",
                                 train_script=self.trainer, cwd=self.root,
                                 print_fn=self.lines.append, stop_margin_s=0.5, **kwargs)

        self.assertIsNone(sweep.estimated_run_s(self.root, runs, sweep.RunState(
            sweep.Status.NOT_STARTED)))
        self.assertLen(execute(max_runs=2).launched, 2)
        walls = [sweep.collect(sweep.run_dir(self.root, r)).wall_s for r in runs[:2]]
        full = (walls[0] + walls[1]) / 2
        self.assertAlmostEqual(sweep.estimated_run_s(
            self.root, runs, sweep.RunState(sweep.Status.NOT_STARTED)), full)
        self.assertAlmostEqual(sweep.estimated_run_s(
            self.root, runs, sweep.RunState(sweep.Status.PARTIAL, 5, 10)), 0.6 * full)
        # Less time left than the median run needs: held back only with the flag.
        summary = execute(deadline=time.time() + 0.5 + 0.25 * full, finish_by_deadline=True)
        self.assertEqual((summary.status, summary.launched), ("deadline", []))
        self.assertIn("needs about", self.lines[-1])
        summary = execute(deadline=time.time() + 30, finish_by_deadline=True)
        self.assertEqual((summary.status, summary.launched), ("complete", [runs[2].name]))

    def test_stop_event_and_max_runs(self):
        stop = threading.Event()
        stop.set()
        _, summary = self._execute(("ok",), stop=stop)
        self.assertEqual((summary.status, summary.launched), ("interrupted", []))
        _, summary = self._execute(("ok", "slow"), max_runs=1)
        self.assertEqual((summary.status, len(summary.launched)), ("max_runs", 1))

    def test_ctrl_c_lets_the_trainer_stop_on_its_own_sigint(self):
        # Ctrl-C reaches the whole process group: the trainer saves and exits on its own
        # SIGINT; the sweep's SIGTERM on top of it killed it while it exited (-15, "killed by
        # SIGTERM (last line: ... checkpoint saved ...)"). Now it gets a grace period first.
        script = os.path.join(self.root, "ctrl_c_trainer.py")
        pid_file = os.path.join(self.root, "pid")
        with open(script, "w") as f:
            f.write(textwrap.dedent(f'''
                import os, signal, sys, time
                def on_int(signum, frame):
                    print("Stopping at step 229: checkpoint saved", flush=True)
                    time.sleep(1.5)  # the exit after the save: SIGTERM here kills it
                    sys.exit(130)
                signal.signal(signal.SIGINT, on_int)
                with open({pid_file!r} + ".tmp", "w") as f:
                    f.write(str(os.getpid()))
                os.rename({pid_file!r} + ".tmp", {pid_file!r})
                while True:
                    time.sleep(0.05)
            '''))
        stop = sweep.StopEvent()

        def ctrl_c():
            while not os.path.exists(pid_file):
                time.sleep(0.05)
            with open(pid_file) as f:
                os.kill(int(f.read()), signal.SIGINT)  # the terminal's, to the trainer
            stop.set_by(signal.SIGINT)  # the sweep's own handler

        threading.Thread(target=ctrl_c, daemon=True).start()
        workdir = os.path.join(self.root, "run")
        attempt = sweep.launch([sys.executable, script], workdir, cwd=self.root, stop=stop,
                               print_fn=self.lines.append, stop_margin_s=10)
        self.assertEqual((attempt.returncode, attempt.stopped_by), (130, "interrupt"))
        self.assertEqual(sweep._describe_exit(attempt), "stopped at the sweep's interrupt")
        self.assertFalse(any("SIGTERM to the trainer" in line for line in self.lines),
                         self.lines)
        end = sweep.read_jsonl(os.path.join(workdir, sweep.ATTEMPTS))[-1]
        self.assertEqual(end["returncode"], 130)
        # A trainer the Ctrl-C did not reach still gets SIGTERM after the grace period.
        stop = sweep.StopEvent()
        stop.set_by(signal.SIGINT)
        attempt = sweep.launch([sys.executable, "-c", "import time; time.sleep(30)"], workdir,
                               cwd=self.root, stop=stop, print_fn=self.lines.append,
                               stop_margin_s=10, interrupt_grace_s=0.5)
        self.assertEqual((attempt.returncode, attempt.stopped_by), (-signal.SIGTERM, "interrupt"))

    def test_a_second_ctrl_c_stops_the_trainer_at_once_without_saving(self):
        # README: a second Ctrl-C stops a trainer at once, without saving. Two that reached
        # the trainer during one step merged into one (Python runs the handler once), so it
        # saved and the sweep waited out the grace; the sweep's own handler counts them.
        rng = np.random.default_rng()
        save_s = float(rng.uniform(20, 40))
        script = os.path.join(self.root, "merging_trainer.py")
        pid_file = os.path.join(self.root, "pid")
        with open(script, "w") as f:
            f.write(textwrap.dedent(f'''
                import os, signal, sys, time
                def on_int(signum, frame):  # the trainer's: the next Ctrl-C interrupts
                    signal.signal(signal.SIGINT, signal.default_int_handler)
                    print("Ctrl-C: saving a checkpoint", flush=True)
                    time.sleep({save_s})
                    print("checkpoint saved", flush=True)
                    sys.exit(130)
                signal.signal(signal.SIGINT, on_int)
                with open({pid_file!r} + ".tmp", "w") as f:
                    f.write(str(os.getpid()))
                os.rename({pid_file!r} + ".tmp", {pid_file!r})
                try:
                    while True:
                        time.sleep(0.05)
                except KeyboardInterrupt:
                    print("second Ctrl-C: stopped without saving", flush=True)
                    sys.exit(130)
            '''))
        stop = sweep.StopEvent()

        def two_ctrl_cs():
            while not os.path.exists(pid_file):
                time.sleep(0.05)
            with open(pid_file) as f:
                os.kill(int(f.read()), signal.SIGINT)  # the terminal's two, merged into one
            for _ in range(2):
                stop.set_by(signal.SIGINT)  # the sweep's own handler, twice
                time.sleep(float(rng.uniform(0.0, 0.3)))

        threading.Thread(target=two_ctrl_cs, daemon=True).start()
        workdir = os.path.join(self.root, "run")
        t0 = time.time()
        attempt = sweep.launch([sys.executable, script], workdir, cwd=self.root, stop=stop,
                               print_fn=self.lines.append, stop_margin_s=60)
        self.assertLess(time.time() - t0, save_s / 2)  # not the save, nor the 60 s grace
        self.assertEqual(stop.interrupts, 2)
        self.assertEqual((attempt.returncode, attempt.stopped_by), (130, "interrupt"))
        self.assertIn("second Ctrl-C: stopped without saving", self.lines)
        self.assertNotIn("checkpoint saved", self.lines)
        self.assertIn("sweep: second Ctrl-C; Ctrl-C to the trainer until it exits (it stops at "
                      "once, without saving)", self.lines)
        self.assertFalse(any("SIGTERM to the trainer" in line for line in self.lines))
        self.assertEqual(sweep._describe_exit(attempt), "stopped at the sweep's interrupt")
        # One Ctrl-C is still one: the count, and no SIGINT from the sweep.
        once = sweep.StopEvent()
        once.set_by(signal.SIGTERM)
        once.set_by(signal.SIGINT)
        self.assertEqual((once.interrupts, once.signum), (1, signal.SIGINT))

    def test_plan_is_what_execute_launches(self):
        # finished, failed, then three to run: the plan (the --dry_run) and what execute does.
        modes = ("ok", "fail", "slow", "ok2", "ok3")
        config = _config(grid=((("fake.mode", modes),),), seed_axis=None)
        runs = sweep.expand(config)
        sweep.execute(runs[:2], self.root, config_path="cfg.py", train_script=self.trainer,
                      cwd=self.root, print_fn=self.lines.append)

        def plan(**kwargs):
            return [(p.action, p.why, p.launch, p.at_once) for p in sweep.plan(
                runs, self.root, config_path="cfg.py", **kwargs)]

        skipped = [("skip", "finished", None, False),
                   ("skip", "failed before (error: fake.mode='fail'; choose ok or slow); "
                            "--retry_failed runs it again", None, False)]
        self.assertEqual(plan(parallel=2, max_runs=2), skipped + [
            ("launch", "starting", 1, True), ("launch", "starting", 2, True),
            ("hold", "--max_runs=2 reached", None, False)])
        self.assertEqual(plan(max_runs=2, retry_failed=True), skipped[:1] + [
            ("launch", "starting over", 1, True), ("launch", "starting", 2, False),
            ("hold", "--max_runs=2 reached", None, False),
            ("hold", "--max_runs=2 reached", None, False)])
        self.assertEqual(plan(deadline_s=40.0, min_run_s=20.0), skipped + [
            ("hold", "the deadline: 10 s before the trainer's stop, under --min_run_s 20",
             None, False)] * 3)
        with self.assertRaisesRegex(ValueError, r"^parallel=0"):
            plan(parallel=0)
        console = os.path.join(sweep.run_dir(self.root, runs[1]), "console.log")
        with open(console, "w") as f:  # trainer records, no checkpoint: set aside by execute
            f.write("model: 1,000 parameters\n")
        self.assertEqual(plan(max_runs=1, retry_failed=True)[1][:2], (
            "launch", "starting over (no checkpoint; its records are first set aside as "
                      ".restarted-<time>)"))
        os.remove(console)
        self.lines.clear()
        summary = sweep.execute(runs, self.root, config_path="cfg.py",
                                train_script=self.trainer, cwd=self.root, parallel=2,
                                max_runs=2, print_fn=self.lines.append)
        self.assertEqual((summary.status, summary.launched),
                         ("max_runs", [r.name for r in runs[2:4]]))
        self.assertIn(f"--- {runs[2].name}: starting (1 of 2 in flight)", self.lines)
        self.assertIn(f"--- {runs[3].name}: starting (2 of 2 in flight)", self.lines)

    def test_run_without_checkpoint_starts_over_in_a_clean_directory(self):
        config = _config(grid=((("fake.mode", ("ok",)),),), seed_axis=None)
        run = sweep.expand(config)[0]
        workdir = sweep.run_dir(self.root, run)
        _partial_run_without_checkpoint(workdir)
        self._execute(("ok",))
        self.assertEqual(sweep.collect(workdir).train_curve[0], (16, 10.0))
        aside = [n for n in os.listdir(os.path.dirname(workdir)) if ".restarted-" in n]
        self.assertLen(aside, 1)
        self.assertEqual([r.name for r in sweep.recorded_runs(self.root)], [run.name])

    def test_a_workdir_a_live_trainer_holds_is_neither_moved_nor_launched(self):
        # A trainer left running by a killed sweep (or another sweep's): its run has records
        # and no checkpoint, which would otherwise be set aside and started over under it.
        config = _config(grid=((("fake.mode", ("ok",)),),), seed_axis=None)
        run = sweep.expand(config)[0]
        workdir = sweep.run_dir(self.root, run)
        _partial_run_without_checkpoint(workdir)
        pid = str(10_000 + os.getpid() % 5_000)
        with open(os.path.join(workdir, sweep.TRAINER_LOCK), "w") as held:
            held.write(pid + "\n")
            held.flush()
            fcntl.flock(held.fileno(), fcntl.LOCK_EX)
            self.assertEqual(sweep.trainer_lock_owner(workdir), pid)
            planned, = sweep.plan([run], self.root, config_path="cfg.py")  # the dry run's view
            self.assertEqual((planned.action, planned.why),
                             ("skip", f"in use by a trainer (pid {pid})"))
            _, summary = self._execute(("ok",))
        self.assertEqual((summary.launched, summary.skipped),
                         ([], {run.name: f"in use by a trainer (pid {pid})"}))
        self.assertIn(f"--- {run.name}: its workdir is in use by a trainer this call did not "
                      f"start (pid {pid}; {workdir}/.train.lock); not launched, nothing moved: "
                      f"run the sweep again once it has ended", self.lines)
        self.assertEqual(os.listdir(os.path.dirname(workdir)), [os.path.basename(workdir)])
        self.assertEqual(sweep.collect(workdir).train_curve, [(1, 99.0)])  # untouched
        self.assertIsNone(sweep.trainer_lock_owner(workdir))  # released: the next call runs it
        _, summary = self._execute(("ok",))
        self.assertEqual(summary.launched, [run.name])

    def test_identical_finished_runs_of_another_sweep_are_reused_not_run(self):
        # Table 7's host runs (route=none) build exactly Table 2's GDN hybrid + Muon runs
        # (tests/configs/sweeps_test.py); here with the CPU variants, the stand-in trainer, and
        # the config each source's trainer would record written into its invocations.
        repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        t2, t7 = table2_small.get_config("tiny"), table7_small.get_config("tiny")
        file2, file7 = (os.path.join(repo, c.train_config) for c in (t2, t7))
        runs2 = [r for r in sweep.expand(t2) if "stack=hybrid,opt=muon" in r.name]
        runs7 = sweep.expand(t7)
        root_a, root_b = (os.path.join(self.root, n) for n in ("table2", "table7"))

        def execute(runs, root, config_path, **kwargs):
            return sweep.execute(runs, root, config_path=config_path, train_script=self.trainer,
                                 cwd=self.root, print_fn=self.lines.append, **kwargs)

        self.assertLen(execute(runs2, root_a, file2).launched, 2)
        cache = {}
        for run in runs2:  # what the real trainer records (its resolved config)
            path = os.path.join(sweep.run_dir(root_a, run), "invocations.jsonl")
            records = sweep.read_jsonl(path)
            for r in records:
                r["config"] = sweep.resolved_config(file2, run.arg, run.overrides, cache)
                r["git"] = {"commit": "abc123", "dirty": False}
                if run is runs2[0]:  # recorded by a trainer older than data.max_bad_fraction
                    del r["config"]["data"]["max_bad_fraction"]
            with open(path, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in records)
        # The sweep's own root is never a source.
        self.assertEqual(sweep.reuse_identical_runs(runs2, root_a, config_path=file2,
                                                    train_script=self.trainer,
                                                    roots=[root_a]), {})
        summary = execute(runs7, root_b, file7, reuse_from=[root_a], max_runs=0)
        sources = {n: os.path.basename(src) for n, src in summary.reused.items()}
        self.assertEqual(sources, {"route=none,seed=42": runs2[0].name,
                                   "route=none,seed=43": runs2[1].name})
        self.assertEqual(summary.launched, [])  # reused before max_runs stopped the launches
        reused = sweep.run_dir(root_b, runs7[0])
        self.assertEqual(sweep.run_state(reused).status, sweep.Status.FINISHED)
        self.assertEqual(sweep.collect(reused).final_val_loss, 11 / 4)
        with open(os.path.join(reused, sweep.RUN_RECORD)) as f:
            record = json.load(f)
        self.assertEqual((record["arg"], record["reused_commit"]),
                         (runs7[0].arg, {"commit": "abc123", "dirty": False}))
        self.assertFalse(os.path.exists(os.path.join(reused, "checkpoints")))
        self.assertFalse(os.path.exists(reused + ".reuse-tmp"))
        page = sweep_report.markdown(sweep_report.build(t7, root_b))
        self.assertIn(f"the same training as table2/runs/{runs2[0].name} (its records; not run "
                      f"again)", page)
        # Not reused: another override in this call; a reused run as the source (root_b's);
        # a source resumed once with other settings; an unfinished source.
        root_c = os.path.join(self.root, "c")
        for kwargs in (dict(reuse_from=[root_a], extra_overrides=(("train.log_every", 3),)),
                       dict(reuse_from=[root_b])):
            self.assertEqual(execute(runs7[:1], root_c, file7, max_runs=0, **kwargs).reused,
                             {})
        source = sweep.run_dir(root_a, runs2[0])
        path = os.path.join(source, "invocations.jsonl")
        first = sweep.read_jsonl(path)[0]
        changed = json.loads(json.dumps(first))
        changed["config"]["train"]["log_every"] += 1
        with open(path, "a") as f:
            f.write(json.dumps(changed) + "\n")
        summary = execute(runs7[:1], root_c, file7, max_runs=0, reuse_from=[root_a])
        self.assertEqual(summary.reused, {})
        with open(path, "w") as f:
            f.write(json.dumps(first) + "\n")
        log = os.path.join(source, "console.log")
        with open(log) as f:
            kept = [line for line in f if not line.startswith("final:")]
        with open(log, "w") as f:
            f.writelines(kept)
        self.assertEqual(sweep.run_state(source).status, sweep.Status.PARTIAL)
        summary = execute(runs7[:1], root_c, file7, max_runs=0, reuse_from=[root_a])
        self.assertEqual(summary.reused, {})

    def test_changed_settings_under_the_same_name_conflict(self):
        runs, _ = self._execute(("ok",))
        self.assertEqual(sweep.conflicts(runs, self.root), [])
        changed = sweep.expand(_config(
            grid=((("fake.mode", ("ok",)),),), seed_axis=None,
            arg=(("size", "small"), ("corpus", "/elsewhere"), ("lr", 0.1)),
            overrides=(("train.tensorboard", True),)))
        self.assertEqual(sweep.conflicts(changed, self.root, local_args=("corpus",)), [
            "fake.mode=ok: argument lr: None -> '0.1'; override train.tensorboard: False -> "
            "True"])

    def test_missing_local_paths(self):
        present = self.create_tempdir().full_path
        runs = sweep.expand(_config(
            grid=((("lr", (0.1, 0.2)),),), seed_axis=None,
            arg=(("size", "small"), ("corpus", os.path.join(present, "absent")),
                 ("tokenizer", os.path.join(present, "absent_too")))))
        # Each missing path once, and only for the arguments named local.
        self.assertEqual(sweep.missing_local_paths(runs, ("corpus",)),
                         [f"corpus={os.path.join(present, 'absent')}"])
        self.assertEqual(sweep.missing_local_paths(runs), [])
        here = sweep.expand(_config(grid=((("lr", (0.1,)),),), seed_axis=None,
                                    arg=(("corpus", present),)))
        self.assertEqual(sweep.missing_local_paths(here, ("corpus",)), [])

    def test_export_copies_records_not_checkpoints(self):
        runs, _ = self._execute(("ok",))
        out = os.path.join(self.root, "export")
        with open(os.path.join(self.root, "results.md"), "w") as f:
            f.write("# demo\n")
        n = sweep.export(self.root, out, extra_files=("results.md", "missing.csv"))
        copied = os.path.join(out, sweep.RUNS_DIR, runs[0].name)
        self.assertEqual(sorted(os.listdir(copied)), sorted(
            [sweep.RUN_RECORD, sweep.ATTEMPTS, sweep.RUN_LOG, "metrics.jsonl", "console.log",
             "invocations.jsonl"]))
        self.assertEqual(n, 7)
        self.assertEqual(sweep.run_state(copied).status, sweep.Status.FINISHED)
        # As one archive: the same files, unpacked into a fresh root.
        packed = os.path.join(self.root, "packed")
        self.assertEqual(sweep.export(self.root, packed, extra_files=("results.md",),
                                      archive=True), 7)
        self.assertEqual(sorted(os.listdir(packed)), ["records.tar.gz", "results.md"])
        fresh = os.path.join(self.root, "fresh")
        with tarfile.open(os.path.join(packed, "records.tar.gz")) as tar:
            tar.extractall(fresh)
        unpacked = os.path.join(fresh, sweep.RUNS_DIR, runs[0].name)
        self.assertEqual(sorted(os.listdir(unpacked)), sorted(os.listdir(copied)))
        for file in os.listdir(copied):
            with open(os.path.join(copied, file), "rb") as a, \
                    open(os.path.join(unpacked, file), "rb") as b:
                self.assertEqual(a.read(), b.read(), file)
        self.assertEqual(sweep.run_state(unpacked).status, sweep.Status.FINISHED)


class ParallelTest(_FakeTrainerTestCase):
    """``execute(parallel=2)`` with the stand-in trainer (a few seconds in all; the real
    trainer: tests/experiments/sweep_test.py)."""

    def setUp(self):
        super().setUp()
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("XLA_PYTHON_CLIENT_", "XLA_CLIENT_"))}

    def _execute(self, grid, **kwargs):
        runs = sweep.expand(_config(grid=grid, seed_axis=None))
        kwargs.setdefault("parallel", 2)
        return runs, sweep.execute(runs, self.root, config_path="cfg.py",
                                   train_script=self.trainer, cwd=self.root, env=self.env,
                                   print_fn=self.lines.append, **kwargs)

    def _attempts(self, run):
        return sweep.read_jsonl(os.path.join(sweep.run_dir(self.root, run), sweep.ATTEMPTS))

    def test_runs_in_order_two_at_a_time_a_failure_stops_only_itself(self):
        # A slow run (60 steps of 0.05 s) holds one slot throughout; the others take the second
        # one in turn, each when the one before it has exited.
        grid = ((("fake.mode", ("slow",)), ("train.total_steps", (60,))),
                (("fake.mode", ("fail", "ok")),),
                (("fake.mode", ("ok",)), ("train.total_steps", (5,))))
        runs, summary = self._execute(grid)
        names = [r.name for r in runs]
        self.assertEqual((summary.status, summary.launched), ("complete", names))
        states = [sweep.run_state(sweep.run_dir(self.root, r)) for r in runs]
        self.assertEqual([s.status for s in states], [sweep.Status.FINISHED, sweep.Status.FAILED,
                                                      sweep.Status.FINISHED,
                                                      sweep.Status.FINISHED])
        self.assertEqual(states[1].error, "error: fake.mode='fail'; choose ok or slow")
        starts = [line for line in self.lines if line.startswith("--- ") and "starting" in line]
        self.assertEqual(starts, [f"--- {names[0]}: starting (1 of 2 in flight)"]
                         + [f"--- {name}: starting (2 of 2 in flight)" for name in names[1:]])
        ended = [line.split(":")[0][4:] for line in self.lines
                 if line.startswith("--- ") and " after " in line]
        self.assertEqual(ended, names[1:] + names[:1])
        for run in runs:
            start, end = self._attempts(run)
            self.assertEqual((start["parallel"], end["parallel"], end["concurrent"]), (2, 2, 2),
                             run.name)
            self.assertGreater(end["shared_s"], 0.0, run.name)
            self.assertLessEqual(end["shared_s"], end["wall_s"] + 0.01, run.name)
            result = sweep.collect(sweep.run_dir(self.root, run))
            # (the failed run wrote no throughput: nothing of it to mark as shared)
            self.assertEqual((result.concurrent, result.attempts_concurrent),
                             (1 if run is runs[1] else 2, 2), run.name)
        # The slow run shared the machine for about as long as the other three ran.
        self.assertAlmostEqual(self._attempts(runs[0])[-1]["shared_s"],
                               sum(self._attempts(r)[-1]["wall_s"] for r in runs[1:]), delta=0.5)
        # The trainers' lines behind their run's name; the losses as one at a time gives them.
        self.assertIn(f"[{names[2]}] step 4 done", self.lines)
        self.assertIn(f"[{names[0]}] step 60 done", self.lines)
        self.assertEqual(sweep.collect(sweep.run_dir(self.root, runs[3])).final_val_loss, 11 / 5)
        # Again: every run skipped (the failed one unless retried).
        _, summary = self._execute(grid)
        self.assertEqual((summary.status, summary.launched), ("complete", []))
        _, summary = self._execute(grid, retry_failed=True)
        self.assertEqual(summary.launched, [names[1]])

    def test_stop_reaches_every_trainer_in_flight_and_the_next_call_resumes_them(self):
        grid = ((("fake.mode", ("slow",)), ("train.total_steps", (40, 41, 42))),)
        runs = sweep.expand(_config(grid=grid, seed_axis=None))
        stop = threading.Event()

        def stop_when_both_saved():  # (as SIGTERM to the sweep sets it)
            first = [os.path.join(sweep.run_dir(self.root, r), "checkpoints", "2")
                     for r in runs[:2]]
            deadline = time.time() + 30
            while not all(map(os.path.isdir, first)) and time.time() < deadline:
                time.sleep(0.05)
            stop.set()

        watcher = threading.Thread(target=stop_when_both_saved, daemon=True)
        watcher.start()
        runs, summary = self._execute(grid, stop=stop)
        watcher.join()
        self.assertEqual((summary.status, summary.launched),
                         ("interrupted", [r.name for r in runs[:2]]))
        steps = []
        for run in runs[:2]:
            state = sweep.run_state(sweep.run_dir(self.root, run))
            end = self._attempts(run)[-1]
            self.assertEqual((state.status, end["stopped_by"], end["returncode"]),
                             (sweep.Status.PARTIAL, "interrupt", 143), run.name)
            self.assertGreater(state.step, 0)
            steps.append(state.step)
        self.assertFalse(os.path.exists(sweep.run_dir(self.root, runs[2])))
        _, summary = self._execute(grid)
        self.assertEqual(summary.status, "complete")
        for run, step in zip(runs[:2], steps):
            self.assertIn(f"--- {run.name}: resuming from step {step} (", "\n".join(self.lines))
        self.assertEqual([sweep.run_state(sweep.run_dir(self.root, r)).status for r in runs],
                         [sweep.Status.FINISHED] * 3)

    def test_deadline_stops_both_and_launches_nothing_after(self):
        grid = ((("fake.mode", ("slow",)), ("train.total_steps", (60, 61))),
                (("fake.mode", ("ok",)),))
        runs, summary = self._execute(grid, deadline=time.time() + 2.5, stop_margin_s=0.5)
        self.assertEqual((summary.status, summary.launched),
                         ("deadline", [r.name for r in runs[:2]]))
        for run in runs[:2]:
            self.assertEqual(self._attempts(run)[-1]["stopped_by"], "deadline")
            self.assertEqual(sweep.run_state(sweep.run_dir(self.root, run)).status,
                             sweep.Status.PARTIAL)

    def test_a_shared_attempt_that_wrote_no_records_leaves_the_throughput_unmarked(self):
        # Two runs launched together, stopped 0.5 s later while still starting (no record
        # written), then run again one at a time: their tokens/s were measured alone. (Both
        # were marked "shared GPU" from the first attempt's concurrency.)
        grid = ((("fake.mode", ("ok",)), ("train.total_steps", (4, 5))),)
        stop = threading.Event()
        threading.Timer(0.5, stop.set).start()
        runs, summary = self._execute(grid, stop=stop,
                                      extra_overrides=(("fake.startup_s", "30"),))
        self.assertEqual(summary.status, "interrupted")
        for run in runs:
            start, end = self._attempts(run)
            self.assertEqual((end["concurrent"], end["stopped_by"]), (2, "interrupt"))
            self.assertEqual(sorted(os.listdir(sweep.run_dir(self.root, run))),
                             sorted([sweep.ATTEMPTS, sweep.RUN_RECORD, sweep.RUN_LOG]))
        _, summary = self._execute(grid, parallel=1)
        self.assertEqual(summary.status, "complete")
        for run in runs:
            result = sweep.collect(sweep.run_dir(self.root, run))
            self.assertIsNotNone(result.tokens_per_sec)
            self.assertEqual(result.concurrent, 1, run.name)
            self.assertEqual((result.attempts_concurrent, result.parallel), (2, 2), run.name)
        config = _config(grid=grid, seed_axis=None)
        md = sweep_report.markdown(sweep_report.build(config, self.root))
        # tokens/s and MFU unmarked; the wall time, which adds the shared attempt, is marked.
        self.assertIn("| 250 |  | 0.00M | 0.00M | 1 s † |  | wall time includes an attempt that "
                      "shared the GPU (parallel=2, up to 2 runs at once) |", md)
        self.assertNotIn("| 250 † |", md)
        self.assertNotIn("| 300 † |", md)

        # Records written while sharing stay marked, also after an alone resume.
        grid = ((("fake.mode", ("slow",)), ("train.total_steps", (30, 31))),)
        stop = threading.Event()
        threading.Timer(0.8, stop.set).start()
        runs, summary = self._execute(grid, stop=stop)
        self.assertEqual(summary.status, "interrupted")
        _, summary = self._execute(grid, parallel=1)
        self.assertEqual(summary.status, "complete")
        for run in runs:
            self.assertEqual(sweep.collect(sweep.run_dir(self.root, run)).concurrent, 2)

    def test_throughput_concurrency_by_record_time(self):
        attempts = [{"event": "start", "parallel": 2, "t0": 100.0},
                    {"event": "end", "parallel": 2, "concurrent": 2, "t0": 100.0, "t1": 110.0},
                    {"event": "start", "time": "1970-01-01T00:03:20Z"},
                    {"event": "end", "time": "1970-01-01T00:05:00Z", "wall_s": 100.0}]
        at = [{"time": t} for t in (105.0, 250.0)]
        self.assertEqual(sweep.throughput_concurrency(attempts, at[:1]), 2)
        self.assertEqual(sweep.throughput_concurrency(attempts, at[1:]), 1)
        self.assertEqual(sweep.throughput_concurrency(attempts, at), 2)
        self.assertEqual(sweep.throughput_concurrency(attempts, []), 1)
        # Older records: the end's whole-second time minus its wall time, a second wider.
        old = [{"event": "start"}, {"event": "end", "time": "1970-01-01T00:01:50Z",
                                    "wall_s": 10.0, "parallel": 2, "concurrent": 2}]
        self.assertEqual(sweep.throughput_concurrency(old, [{"time": 99.5}]), 2)
        self.assertEqual(sweep.throughput_concurrency(old, [{"time": 250.0}]), 1)
        # Without times (or a record without one): shared, as the attempt says.
        self.assertEqual(sweep.throughput_concurrency(
            [{"event": "end", "concurrent": 3}], [{"time": 250.0}]), 3)
        self.assertEqual(sweep.throughput_concurrency(attempts, [{"step": 1}]), 2)
        # A sweep that died mid-attempt: its parallel, until the next attempt's start.
        died = [{"event": "start", "parallel": 2, "t0": 100.0},
                {"event": "start", "time": "1970-01-01T00:03:20Z"},
                {"event": "end", "time": "1970-01-01T00:05:00Z", "wall_s": 100.0}]
        self.assertEqual(sweep.throughput_concurrency(died, [{"time": 150.0}]), 2)
        self.assertEqual(sweep.throughput_concurrency(died, [{"time": 250.0}]), 1)

    def test_one_at_a_time_records_and_environment_are_unchanged(self):
        runs, summary = self._execute(((("fake.mode", ("ok",)),),), parallel=1)
        self.assertEqual(summary.status, "complete")
        start, end = self._attempts(runs[0])
        self.assertEqual(sorted(start), ["command", "event", "time"])
        self.assertEqual(sorted(end), ["error", "event", "returncode", "stopped_by", "time",
                                       "wall_s"])
        self.assertIn("--- fake.mode=ok: starting", self.lines)
        self.assertIs(sweep.parallel_env(self.env, 1), self.env)
        self.assertIsNone(sweep.parallel_env(None, 1))
        with self.assertRaisesRegex(ValueError, r"^parallel=0: must be at least 1"):
            self._execute(((("fake.mode", ("ok",)),),), parallel=0)

    def test_finish_by_deadline_estimate_per_concurrency(self):
        grid = ((("fake.mode", ("ok",)), ("train.total_steps", (4, 5, 6, 7))),)
        runs = sweep.expand(_config(grid=grid, seed_axis=None))
        _write_finished(self.root, runs[:3], (10.0, 20.0, 50.0), (1, 1, 2))
        new = sweep.RunState(sweep.Status.NOT_STARTED)
        # The same concurrency's median when there is one (alone: 10 and 20; two at once: 50).
        self.assertEqual(sweep.estimated_run_s(self.root, runs, new), 15.0)
        self.assertEqual(sweep.estimated_run_s(self.root, runs, new, concurrent=2), 50.0)
        self.assertEqual(sweep.estimated_run_s(
            self.root, runs, sweep.RunState(sweep.Status.PARTIAL, 5, 10), concurrent=2), 30.0)
        # None at 3: every run scaled as if sharing gained nothing: 10 x 3, 20 x 3, 50 x 3/2.
        self.assertEqual(sweep.estimated_run_s(self.root, runs, new, concurrent=3), 60.0)
        # Alone with no run measured alone: a shared run's wall time, not scaled down.
        self.assertEqual(sweep.estimated_run_s(self.root, runs[2:3], new), 50.0)
        # A run whose sweep died mid-attempt counts its recorded parallel.
        self.assertEqual(sweep._run_concurrency([{"event": "start", "parallel": 2}]), 2)
        self.assertEqual(sweep._run_concurrency([{"event": "start"}]), 1)


class GpusTest(_FakeTrainerTestCase):
    """``execute(gpus=...)``: one trainer per GPU group, each alone on it (stand-in trainer,
    which records the CUDA_VISIBLE_DEVICES it saw; a few seconds in all)."""

    def setUp(self):
        super().setUp()
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("XLA_PYTHON_CLIENT_", "XLA_CLIENT_", "CUDA_VISIBLE"))}

    def _execute(self, grid, **kwargs):
        runs = sweep.expand(_config(grid=grid, seed_axis=None))
        return runs, sweep.execute(runs, self.root, config_path="cfg.py",
                                   train_script=self.trainer, cwd=self.root, env=self.env,
                                   print_fn=self.lines.append, **kwargs)

    def test_each_run_alone_on_its_group_never_two_on_one(self):
        # Four runs, two at a time on groups "0" and "1"; each sleeps 1 s first, so that the
        # runs in flight overlap however loaded the machine.
        self.env.update(FAKE_RECORD_GPUS="1", FAKE_STARTUP_S="1")
        grid = ((("fake.mode", ("ok",)), ("train.total_steps", (4, 5, 6, 7))),)
        runs, summary = self._execute(grid, parallel=2, gpus=["0", "1"])
        self.assertEqual((summary.status, summary.launched), ("complete", [r.name for r in runs]))
        seen = []
        for run in runs:
            workdir = sweep.run_dir(self.root, run)
            with open(os.path.join(workdir, "fake_gpus.json")) as f:
                seen.append(json.load(f))
            self.assertIn(seen[-1]["gpus"], ("0", "1"), run.name)
            self.assertIsNone(seen[-1]["mem_fraction"], run.name)  # no parallel_env
            start, end = sweep.read_jsonl(os.path.join(workdir, sweep.ATTEMPTS))
            self.assertEqual(start["gpus"], seen[-1]["gpus"], run.name)
            self.assertEqual(sorted(start), ["command", "event", "gpus", "time"], run.name)
            self.assertEqual(sorted(end), ["error", "event", "returncode", "stopped_by", "time",
                                           "wall_s"], run.name)
            result = sweep.collect(workdir)
            self.assertEqual((result.concurrent, result.attempts_concurrent, result.parallel),
                             (1, 1, 1), run.name)
        self.assertEqual({s["gpus"] for s in seen}, {"0", "1"})
        overlapping = [(a, b) for a, b in itertools.combinations(seen, 2)
                       if a["t0"] < b["t1"] and b["t0"] < a["t1"]]
        self.assertNotEmpty(overlapping)  # (else the check below would prove nothing)
        for a, b in overlapping:
            self.assertNotEqual(a["gpus"], b["gpus"], (a, b))
        # The first two launches take the groups in order; the console names them.
        starts = [line for line in self.lines if line.startswith("--- ") and "starting" in line]
        self.assertEqual(starts[:2], [
            f"--- {runs[0].name}: starting (1 of 2 in flight, CUDA_VISIBLE_DEVICES=0)",
            f"--- {runs[1].name}: starting (2 of 2 in flight, CUDA_VISIBLE_DEVICES=1)"])
        # The results treat their tokens/s as measured alone: nothing marked shared.
        report = sweep_report.build(_config(grid=grid, seed_axis=None), self.root)
        self.assertEqual([e.result.concurrent for e in report.entries], [1] * 4)
        md = sweep_report.markdown(report)
        self.assertIn("| 400 |", md)  # (the stand-in's median tokens/s of a 7-step run)
        self.assertNotIn(sweep_report.SHARED_MARK, md)
        self.assertNotIn("shared GPU", md)

    def test_parallel_above_the_groups_and_bad_groups_raise_before_any_launch(self):
        grid = ((("fake.mode", ("ok",)),),)
        cases = ((dict(parallel=3, gpus=["0", "1"]),
                  r"^parallel=3 is above the 2 GPU group\(s\) of gpus=\['0', '1'\]"),
                 (dict(gpus=[]), r"^gpus=\[\]: expected a non-empty list"),
                 (dict(gpus="0,1"), r"^gpus='0,1': expected a non-empty list"),
                 (dict(gpus=["0", ""]), r"expected a non-empty list"),
                 (dict(gpus=["0", "0"]), r"a GPU group appears twice"))
        for kwargs, message in cases:
            with self.subTest(kwargs=kwargs):
                with self.assertRaisesRegex(ValueError, message):
                    self._execute(grid, **kwargs)
                runs = sweep.expand(_config(grid=grid, seed_axis=None))
                with self.assertRaisesRegex(ValueError, message):
                    sweep.plan(runs, self.root, config_path="cfg.py", **kwargs)
        self.assertEqual(os.listdir(self.root), ["fake_train.py"])  # nothing launched
        # One group, one run at a time: it still runs there.
        self.env["FAKE_RECORD_GPUS"] = "1"
        runs, summary = self._execute(grid, gpus=["2,3"])
        self.assertEqual(summary.status, "complete")
        with open(os.path.join(sweep.run_dir(self.root, runs[0]), "fake_gpus.json")) as f:
            self.assertEqual(json.load(f)["gpus"], "2,3")
        self.assertIn(f"--- {runs[0].name}: starting (CUDA_VISIBLE_DEVICES=2,3)", self.lines)

    def test_plan_names_the_groups_and_estimates_each_run_alone(self):
        grid = ((("fake.mode", ("ok",)), ("train.total_steps", (4, 5, 6, 7, 8))),)
        runs = sweep.expand(_config(grid=grid, seed_axis=None))
        # Finished: two alone (10 s, 20 s) and one two at a time (50 s).
        _write_finished(self.root, runs[:3], (10.0, 20.0, 50.0), (1, 1, 2))

        def plan(**kwargs):
            return [(p.action, p.gpus) for p in sweep.plan(
                runs, self.root, config_path="cfg.py", deadline_s=30.0, stop_margin_s=0.0,
                finish_by_deadline=True, parallel=2, **kwargs)][3:]

        # Sharing the GPU, each needs ~50 s (> 30 s left): held; alone on a group, ~15 s.
        self.assertEqual(plan(), [("hold", None)] * 2)
        self.assertEqual(plan(gpus=["3", "5"]), [("launch", "3"), ("launch", "5")])
        self.assertEqual(plan(gpus=["3", "5", "7"]), [("launch", "3"), ("launch", "5")])
        # Beyond the launches at the start: the group a trainer frees (not known beforehand).
        planned = sweep.plan(runs, self.root, config_path="cfg.py", gpus=["0"], parallel=1,
                             retry_failed=True)
        self.assertEqual([p.gpus for p in planned if p.action == "launch"], ["0", None])

    def test_the_driver_runs_one_per_group_and_says_so(self):
        from lattn_jax import sweep_driver  # noqa: PLC0415
        repo = _stand_in_repo(self.root, "dict(train=dict(total_steps=4))")
        config = dict(name="demo", train_config="configs/fake.py", arg=(),
                      grid=((("train.total_steps", (4, 5, 6)),),), seed_axis=None)
        root = os.path.join(self.root, "sweep")
        self.env["FAKE_RECORD_GPUS"] = "1"
        with mock.patch.object(sweep_driver, "machine_gpus", _eight_gpus):  # a GPU host's
            status = sweep_driver.run(config, sweep_driver.SweepOptions(
                root=root, gpus="1+2,5", parallel=None, compilation_cache=""), repo_root=repo,
                argv=["sweep.py", "--gpus=1+2,5"], env=self.env, print_fn=self.lines.append)
        self.assertEqual(status, 0)
        self.assertIn("sweep demo: 3 run(s) selected (3 not started); no deadline; up to 2 "
                      "run(s) at once, one per GPU group, each alone on it "
                      "(CUDA_VISIBLE_DEVICES 1,2 | 5)", self.lines)
        seen = []
        for run in sweep.expand(config):
            with open(os.path.join(sweep.run_dir(root, run), "fake_gpus.json")) as f:
                seen.append(json.load(f)["gpus"])
        self.assertEqual(seen[:2], ["1,2", "5"])  # the first launches, in the groups' order
        self.assertIn(seen[2], ("1,2", "5"))
        log = sweep.read_jsonl(os.path.join(root, "sweep.jsonl"))
        self.assertEqual([(r["parallel"], r["gpus"]) for r in log], [(2, ["1,2", "5"])])

    def test_gpu_pool_gives_the_first_free_group_and_waits_for_one(self):
        pool = sweep.GpuPool(["0,1", "2,3", "4"])
        self.assertEqual([pool.take(), pool.take()], ["0,1", "2,3"])
        pool.give("0,1")
        self.assertEqual(pool.take(), "0,1")
        self.assertEqual(pool.take(), "4")
        got = []
        taker = threading.Thread(target=lambda: got.append(pool.take()), daemon=True)
        taker.start()
        taker.join(0.3)
        self.assertEqual(got, [])  # none free: it waits
        pool.give("2,3")
        taker.join(5)
        self.assertEqual(got, ["2,3"])


class ForeignTrainerTest(_FakeTrainerTestCase):
    """A trainer no call of this sweep started (a killed call's, left running) holds one run:
    it counts against ``parallel`` and keeps its GPU group until it ends (stand-in trainer,
    the held lock taken in this process, released by a timer; a few seconds in all)."""

    def setUp(self):
        super().setUp()
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("XLA_PYTHON_CLIENT_", "XLA_CLIENT_", "CUDA_VISIBLE"))}
        self.runs = sweep.expand(_config(grid=((("fake.mode", ("ok",)),
                                                ("train.total_steps", (4, 5, 6))),),
                                         seed_axis=None))
        self.held_dir = sweep.run_dir(self.root, self.runs[0])
        os.makedirs(self.held_dir)
        self.pid = str(20_000 + os.getpid() % 5_000)
        self.enter_context(mock.patch.object(sweep, "FOREIGN_POLL_S", 0.05))

    def _hold(self, gpus=None):
        """Takes the held run's trainer lock (as a live trainer does) and writes its attempt's
        start record (naming ``gpus``); returns the open lock file (close it: the trainer
        ended)."""
        with open(os.path.join(self.held_dir, sweep.ATTEMPTS), "w") as f:
            f.write(json.dumps({"event": "start", "time": "t", "command": ["x"],
                                **({"gpus": gpus} if gpus else {})}) + "\n")
        held = open(os.path.join(self.held_dir, sweep.TRAINER_LOCK), "w")
        held.write(self.pid + "\n")
        held.flush()
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        return held

    def _execute(self, **kwargs):
        return sweep.execute(self.runs, self.root, config_path="cfg.py",
                             train_script=self.trainer, cwd=self.root, env=self.env,
                             print_fn=self.lines.append, **kwargs)

    def test_parallel_one_waits_for_it_then_runs_the_others_one_at_a_time(self):
        held = self._hold()
        self.assertEqual([p.at_once for p in sweep.plan(self.runs, self.root,
                                                        config_path="cfg.py")[1:]],
                         [False, False])  # the dry run: no slot at the start
        timer = threading.Timer(1.0, held.close)
        timer.start()
        t0 = time.monotonic()
        summary = self._execute()
        timer.join()
        self.assertGreaterEqual(time.monotonic() - t0, 1.0)
        self.assertEqual(summary.launched, [r.name for r in self.runs[1:]])
        self.assertEqual(summary.skipped,
                         {self.runs[0].name: f"in use by a trainer (pid {self.pid})"})
        self.assertIn(f"--- 1 run(s) held by a trainer this call did not start (pid "
                      f"{self.pid}): counted against --parallel=1 while they run", self.lines)
        waits = [x for x in self.lines if "waiting for a slot" in x]
        self.assertEqual(waits, [f"--- {self.runs[1].name}: not started; waiting for a slot: "
                                 f"1 trainer(s) this call did not start still run"])
        # the first launch only after the lock was released (the wait line comes before it)
        self.assertLess(self.lines.index(waits[0]),
                        self.lines.index(f"--- {self.runs[1].name}: starting"))
        for run in self.runs[1:]:
            self.assertEqual(sweep.run_state(sweep.run_dir(self.root, run)).status,
                             sweep.Status.FINISHED)

    def test_parallel_two_launches_one_beside_it_and_keeps_its_gpu_group(self):
        held = self._hold(gpus="0")
        planned = sweep.plan(self.runs, self.root, config_path="cfg.py", parallel=2,
                             gpus=["0", "1"])
        self.assertEqual([(p.action, p.at_once, p.gpus) for p in planned],
                         [("skip", False, None), ("launch", True, "1"),
                          ("launch", False, None)])
        self.env.update(FAKE_RECORD_GPUS="1")
        timer = threading.Timer(1.5, held.close)
        timer.start()
        summary = self._execute(parallel=2, gpus=["0", "1"])
        timer.join()
        self.assertEqual(summary.launched, [r.name for r in self.runs[1:]])
        self.assertIn(f"--- 1 run(s) held by a trainer this call did not start (pid "
                      f"{self.pid}): counted against --parallel=2 while they run, their GPU "
                      f"group(s) 0 kept", self.lines)
        self.assertIn(f"--- {self.runs[1].name}: starting (1 of 2 in flight, 1 not started "
                      f"here, CUDA_VISIBLE_DEVICES=1)", self.lines)
        with open(os.path.join(sweep.run_dir(self.root, self.runs[1]), "fake_gpus.json")) as f:
            self.assertEqual(json.load(f)["gpus"], "1")  # never the held trainer's group 0


class RemeasureAloneTest(_FakeTrainerTestCase):
    """``remeasure_alone`` (``--remeasure_alone``) with the stand-in trainer, whose tokens/s
    at step s is 100 s: runs trained two at a time are measured again alone, once."""

    def setUp(self):
        super().setUp()
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("XLA_PYTHON_CLIENT_", "XLA_CLIENT_"))}
        self.rng = random.Random(os.getpid() ^ int(time.time()))

    def _runs(self, grid):
        return sweep.expand(_config(grid=grid, seed_axis=None))

    def _execute(self, runs, parallel):
        return sweep.execute(runs, self.root, config_path="cfg.py", train_script=self.trainer,
                             cwd=self.root, env=self.env, print_fn=self.lines.append,
                             parallel=parallel)

    def _remeasure(self, runs, steps, **kwargs):
        return sweep.remeasure_alone(runs, self.root, steps=steps, config_path="cfg.py",
                                     train_script=self.trainer, cwd=self.root, env=self.env,
                                     print_fn=self.lines.append, **kwargs)

    def _alone_attempts(self, run):
        return sweep.read_jsonl(os.path.join(sweep.run_dir(self.root, run), sweep.ALONE_DIR,
                                             sweep.ATTEMPTS))

    def test_a_shared_run_is_measured_again_once_a_run_measured_alone_never(self):
        total = self.rng.randint(4, 9)
        shared = self._runs(((("fake.mode", ("ok",)), ("train.total_steps", (total,)),
                              ("train.keep_checkpoints", (1, 2))),))
        solo = self._runs(((("fake.mode", ("ok",)), ("train.total_steps", (total + 1,))),))
        self.assertEqual(self._execute(shared, parallel=2).status, "complete")
        self.assertEqual(self._execute(solo, parallel=1).status, "complete")
        self.assertEqual([sweep.collect(sweep.run_dir(self.root, r)).concurrent
                          for r in shared + solo], [2, 2, 1])
        self.assertEqual([sweep.needs_remeasure(self.root, r) for r in shared + solo],
                         [True, True, False])
        steps = self.rng.randint(3, 12)
        summary = self._remeasure(shared + solo, steps)
        self.assertEqual((summary.status, summary.launched, summary.failed),
                         ("complete", [r.name for r in shared], {}))
        # The medians over the windows after the first: steps 2..N at 100 s tokens/s.
        want = 100.0 * float(np.median(np.arange(2, steps + 1)))
        for run in shared:
            workdir = sweep.run_dir(self.root, run)
            record = sweep.read_throughput_alone(workdir)
            self.assertEqual(record, summary.measured[run.name])
            self.assertEqual((record["steps"], record["tokens_per_sec"], record["mfu"],
                              record["windows"], record["devices"]),
                             (steps, want, None, steps - 1, ["fake alone kind"]))
            cmd = sweep.alone_command(run, root=self.root, steps=steps, config_path="cfg.py",
                                      train_script=self.trainer)
            self.assertEqual(record["command"], cmd)
            self.assertEqual(cmd[3], f"--workdir={os.path.join(workdir, 'alone')}")
            self.assertEqual(cmd[-3:], [f"--config.train.total_steps={steps}",
                                        f"--config.train.eval_every={steps}",
                                        f"--config.train.checkpoint_every={steps}"])
            self.assertEqual(cmd[:3] + cmd[4:-3], [
                c for i, c in enumerate(sweep.command(
                    run, config_path="cfg.py", workdir=workdir, train_script=self.trainer))
                if i != 3])
            self.assertRegex(record["date"], r"^\d{4}-\d\d-\d\dT")
            # The run itself is untouched: finished, its own losses.
            self.assertEqual(sweep.run_state(workdir).status, sweep.Status.FINISHED)
            self.assertEqual(sweep.collect(workdir).final_val_loss, 11.0 / total)
            self.assertFalse(sweep.needs_remeasure(self.root, run))
            self.assertLen(self._alone_attempts(run), 2)
        self.assertFalse(os.path.exists(os.path.join(sweep.run_dir(self.root, solo[0]),
                                                     sweep.ALONE_DIR)))
        self.assertIn(f"--- {shared[0].name}: re-measuring its throughput alone ({steps} "
                      f"steps)", self.lines)
        self.assertIn(f"[{shared[1].name} alone] step {steps} done", self.lines)
        # Again: nothing to re-measure, nothing launched.
        self.lines.clear()
        summary = self._remeasure(shared + solo, self.rng.randint(3, 12))
        self.assertEqual((summary.status, summary.launched), ("complete", []))
        self.assertEqual(self.lines, [])
        self.assertEqual([len(self._alone_attempts(r)) for r in shared], [2, 2])
        # Exported with the records.
        export = os.path.join(self.root, "export")
        sweep.export(self.root, export)
        for run in shared:
            self.assertTrue(os.path.isfile(os.path.join(export, "runs", run.name,
                                                        sweep.THROUGHPUT_ALONE)))

    def test_a_failing_re_measurement_is_reported_and_ends_only_itself(self):
        runs = self._runs(((("fake.mode", ("ok",)), ("fake.fail_alone", (True, False))),))
        self._execute(runs, parallel=2)
        self.assertEqual([sweep.needs_remeasure(self.root, r) for r in runs], [True, True])
        steps = self.rng.randint(3, 9)
        summary = self._remeasure(runs, steps)
        error = "error: fake.fail_alone=True: no re-measurement here"
        self.assertEqual((summary.status, summary.failed, list(summary.measured)),
                         ("complete", {runs[0].name: error}, [runs[1].name]))
        self.assertIn(f"--- {runs[0].name}: re-measurement alone failed (exit 1): {error}",
                      self.lines)
        self.assertIsNone(sweep.read_throughput_alone(sweep.run_dir(self.root, runs[0])))
        md = sweep_report.markdown(sweep_report.build(_config(
            grid=((("fake.mode", ("ok",)), ("fake.fail_alone", (True, False))),),
            seed_axis=None), self.root))
        self.assertIn(f"re-measurement alone failed: {error}", md)
        article = "an" if steps == 8 else "a"
        self.assertIn(f"‡ Measured alone in {article} {steps}-step run after training shared "
                      f"the GPU", md)
        # Again: the failed one is not tried again unless asked.
        summary = self._remeasure(runs, steps)
        self.assertEqual((summary.launched, summary.skipped),
                         ([], {runs[0].name: f"failed: {error}"}))
        summary = self._remeasure(runs, steps, retry_failed=True)
        self.assertEqual(summary.failed, {runs[0].name: error})

    def test_deadline_max_runs_and_stop(self):
        runs = self._runs(((("fake.mode", ("ok",)), ("train.keep_checkpoints", (1, 2))),))
        self._execute(runs, parallel=2)
        summary = self._remeasure(runs, 3, max_runs=1)
        self.assertEqual((summary.status, summary.launched), ("max_runs", [runs[0].name]))
        summary = self._remeasure(runs, 3, deadline=time.time() + 5.0, min_run_s=60.0)
        self.assertEqual((summary.status, summary.launched), ("deadline", []))
        stop = threading.Event()
        stop.set()
        summary = self._remeasure(runs, 3, stop=stop)
        self.assertEqual((summary.status, summary.launched), ("interrupted", []))
        self.assertTrue(sweep.needs_remeasure(self.root, runs[1]))
        with self.assertRaisesRegex(ValueError, r"^steps=1: a re-measurement needs at least 2"):
            self._remeasure(runs, 1)


class RemeasureAloneDriverTest(_FakeTrainerTestCase):
    """``experiments/sweep.py --remeasure_alone`` through the driver, in process, in a stand-in
    repository (the stand-in trainer as ``experiments/train.py``, a small training config)."""

    def test_the_call_re_measures_once_records_and_exports(self):
        from lattn_jax import sweep_driver  # noqa: PLC0415
        repo = _stand_in_repo(self.root, (
            "dict(train=dict(total_steps=4, eval_every=2, checkpoint_every=2, "
            "keep_checkpoints=1), fake=dict(mode='ok', fail_alone=False))"))
        config = dict(name="demo", train_config="configs/fake.py", arg=(),
                      grid=((("train.keep_checkpoints", (1, 2, 3, 4)),),), seed_axis=None)
        root = os.path.join(self.root, "sweep")
        names = [r.name for r in sweep.expand(config)]
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("XLA_PYTHON_CLIENT_", "XLA_CLIENT_"))}

        def call(**options):
            self.lines.clear()
            return sweep_driver.run(config, sweep_driver.SweepOptions(root=root, **options),
                                    repo_root=repo, argv=["sweep.py"], env=env,
                                    print_fn=self.lines.append)

        # The first two runs train two at a time; the dry run lists them (finished, shared).
        # Each sleeps 1 s first, so that they overlap however loaded the machine (a run that
        # ended before the other started was measured alone: no re-measurement, once seen).
        env["FAKE_STARTUP_S"] = "1"
        self.assertEqual(call(parallel=2, only=names[:2]), 0)
        del env["FAKE_STARTUP_S"]
        steps = random.Random(os.getpid()).randint(3, 9)
        self.assertEqual(call(remeasure_alone=steps, dry_run=True), 0)
        heads = [line.split("\n")[0] for line in self.lines]
        first = next(i for i, h in enumerate(heads) if h.startswith("dry run of sweep"))
        # The re-measurements come first, as in the call itself, then the runs.
        self.assertEqual(heads[first + 1:first + 3],
                         [f"{n}: before the runs, re-measure its throughput alone "
                          f"(--remeasure_alone={steps})" for n in names[:2]])
        self.assertTrue(self.lines[first + 2].endswith(
            f" --config.train.total_steps={steps} --config.train.eval_every={steps} "
            f"--config.train.checkpoint_every={steps}"))
        self.assertEqual([h.split(":")[0] for h in heads[first + 3:first + 7]], names)
        # They count against --max_runs as in the call: 2 re-measurements leave 1 launch.
        self.assertEqual(call(remeasure_alone=steps, dry_run=True, max_runs=3), 0)
        heads = [line.split("\n")[0] for line in self.lines]
        first = next(i for i, h in enumerate(heads) if h.startswith("dry run of sweep"))
        self.assertIn("1 would be launched", heads[first])
        self.assertEqual(heads[first + 1:first + 3],
                         [f"{n}: before the runs, re-measure its throughput alone "
                          f"(--remeasure_alone={steps}; launch {i} of --max_runs)"
                          for i, n in enumerate(names[:2], 1)])
        self.assertEqual([h.split("; ")[-1] for h in heads[first + 3:first + 7]],
                         ["skipped: finished", "skipped: finished", "launch 1: starting",
                          "not launched: --max_runs=3 reached (with the 2 re-measurement(s))"])
        self.assertFalse(os.path.exists(os.path.join(sweep.run_dir(root, sweep.expand(
            config)[0]), sweep.ALONE_DIR)))
        # Those two re-measured first, then the other two train two at a time and are
        # re-measured after them.
        export = os.path.join(self.root, "export")
        self.assertEqual(call(remeasure_alone=steps, parallel=2, export=export), 0)
        self.assertRegex(self.lines[-2], r"2 run\(s\) launched, 4 re-measured alone; results")
        order = [line.split(":")[0][4:] for line in self.lines
                 if line.startswith("--- ") and ("re-measuring its" in line or "starting" in line)]
        self.assertEqual(order, names[:2] + names[2:] + names[2:])
        log = sweep.read_jsonl(os.path.join(root, "sweep.jsonl"))
        self.assertEqual([r.get("remeasured_alone") for r in log], [None, names])
        with open(os.path.join(root, "results.md")) as f:
            self.assertIn(f"{steps}-step run after training shared the GPU", f.read())
        with tarfile.open(os.path.join(export, sweep.RECORDS_ARCHIVE)) as tar:
            members = tar.getnames()
        self.assertEqual(sorted(m for m in members if m.endswith(sweep.THROUGHPUT_ALONE)),
                         [f"runs/{n}/{sweep.THROUGHPUT_ALONE}" for n in names])
        # Again: nothing re-measured.
        self.assertEqual(call(remeasure_alone=steps), 0)
        self.assertEqual(sweep.read_jsonl(os.path.join(root, "sweep.jsonl"))[-1]
                         ["remeasured_alone"], [])
        self.assertFalse(any("re-measuring" in line for line in self.lines))
        with self.assertRaisesRegex(sweep.SweepConfigError, r"^--remeasure_alone=1: at least 2"):
            call(remeasure_alone=1)
        # With --gpus, a re-measurement runs on the first group (not on every GPU of the host).
        first_dir = sweep.run_dir(root, sweep.expand(config)[0])
        os.remove(os.path.join(first_dir, sweep.THROUGHPUT_ALONE))
        env["FAKE_RECORD_GPUS"] = "1"
        with mock.patch.object(sweep_driver, "machine_gpus", _eight_gpus):  # a GPU host's
            self.assertEqual(call(remeasure_alone=steps, gpus="3,4", only=names[:1]), 0)
        with open(os.path.join(first_dir, sweep.ALONE_DIR, "fake_gpus.json")) as f:
            self.assertEqual(json.load(f)["gpus"], "3")


class _DriverCallTestCase(_FakeTrainerTestCase):
    """``call(**options)``: ``sweep_driver.run`` of ``self.config`` on ``self.sweep_root``,
    its printed lines in ``self.lines``; subclasses set the three in ``setUp``."""

    def call(self, **options):
        from lattn_jax import sweep_driver  # noqa: PLC0415
        self.lines.clear()
        return sweep_driver.run(self.config,
                                sweep_driver.SweepOptions(root=self.sweep_root, **options),
                                repo_root=self.repo, argv=["sweep.py"],
                                print_fn=self.lines.append)


class ChangedOverrideTest(_DriverCallTestCase):
    """A changed ``--override`` on a root with runs of it is refused before anything is written
    (2026-12-05: ``--override=model.d_model=32`` on a finished root skipped every run and
    reported the old numbers as this call's); a call that launched a run that failed exits
    with ``EXIT_FAILED``. Through the driver, in process, in a stand-in repository."""

    def setUp(self):
        super().setUp()
        self.repo = _stand_in_repo(self.root, (
            "dict(train=dict(total_steps=4, eval_every=2, checkpoint_every=2, "
            "keep_checkpoints=1, max_steps_per_run=None), model=dict(d_model=64, "
            "swiglu_packed=False), fake=dict(mode='ok'))"))
        self.config = dict(name="demo", train_config="configs/fake.py", arg=(),
                           grid=((("train.eval_every", (1, 2)),),), seed_axis=None)
        self.sweep_root = os.path.join(self.root, "sweep")
        self.names = [r.name for r in sweep.expand(self.config)]

    def test_a_changed_override_is_refused_and_an_unchanged_call_resumes(self):
        self.assertEqual(self.call(), 0)
        before = _snapshot(self.sweep_root)
        for overrides, changed in (
                (["model.d_model=32"], "model.d_model 64 (default) -> 32"),
                (["train.total_steps=6"], "train.total_steps 4 (default) -> 6")):
            with self.subTest(overrides):
                with self.assertRaises(sweep.SweepConfigError) as e:
                    self.call(overrides=overrides)
                message = str(e.exception)
                for name in self.names:
                    self.assertIn(f"\n  {name}: {changed}\n", message + "\n")
                self.assertIn("use a new --root for these settings, or drop the --override",
                              message)
                # nothing written: no sweep.jsonl line
                self.assertEqual(_snapshot(self.sweep_root), before)
        # Only the selected runs are compared; the changed one is still refused alone.
        with self.assertRaisesRegex(sweep.SweepConfigError,
                                    rf"\n  {re.escape(self.names[1])}: model\.d_model"):
            self.call(overrides=["model.d_model=32"], only=[self.names[1]])
        # Unchanged (also with --only), the default given explicitly, a resume-free field:
        # the finished runs are skipped.
        for options in (dict(), dict(only=[self.names[0]]),
                        dict(overrides=["model.d_model=64", "train.max_steps_per_run=2",
                                        "train.keep_checkpoints=3",
                                        "model.swiglu_packed=true"])):
            with self.subTest(options):
                self.assertEqual(self.call(**options), 0)
                self.assertIn(f"--- {self.names[0]}: finished, skipped", self.lines)
        self.assertLen(sweep.read_jsonl(os.path.join(self.sweep_root, "sweep.jsonl")), 4)

    def test_flag_values_compare_as_the_trainer_reads_them(self):
        # "true" was compared as a string with a bool default: a change (newcomer, 12-07d).
        for text, value in (("true", True), ("False", False), ("TRUE", True), ("1e-3", 0.001),
                            ("64", 64), ("(1, 2)", (1, 2)), ("gdn", "gdn")):
            self.assertEqual(sweep._flag_value(text), value, text)
            self.assertIs(type(sweep._flag_value(text)), type(value), text)

    def test_a_dropped_override_is_a_change_too(self):
        self.assertEqual(self.call(overrides=["model.d_model=32"], only=[self.names[0]]), 0)
        with self.assertRaisesRegex(
                sweep.SweepConfigError,
                rf"\n  {re.escape(self.names[0])}: model\.d_model 32 -> 64 \(default\)\n"):
            self.call()

    def test_failed_runs_of_the_call_give_exit_failed(self):
        from lattn_jax import sweep_driver  # noqa: PLC0415
        self.assertEqual(self.call(overrides=["fake.mode=fail"]), sweep_driver.EXIT_FAILED)
        self.assertRegex(self.lines[-1], r"^sweep: complete after \d+ s; 2 run\(s\) launched; "
                         r"2 of the 2 run\(s\) launched failed \(")
        # Again: both failed before this call and are skipped, nothing launched: 0.
        self.assertEqual(self.call(overrides=["fake.mode=fail"]), 0)
        self.assertIn("2 failed run(s) skipped, not retried", self.lines[-1])
        # Retried, one of them: it failed in this call again.
        self.assertEqual(self.call(retry_failed=True, overrides=["fake.mode=fail"],
                                   only=[self.names[0]]), sweep_driver.EXIT_FAILED)
        # Another value for failed runs without a checkpoint: refused while they would be
        # skipped as failed, accepted when --retry_failed starts them over.
        with self.assertRaisesRegex(sweep.SweepConfigError,
                                    r": fake\.mode 'fail' -> 'ok' \(default\)\n"):
            self.call()
        self.assertEqual(self.call(retry_failed=True), 0)
        self.assertEqual({sweep.run_state(os.path.join(self.sweep_root, "runs", n)).status
                          for n in self.names}, {sweep.Status.FINISHED})


class OverrideConfigErrorTest(absltest.TestCase):
    """A ``--override`` value the trainer's config check refuses is one error before any run
    (the real training config; about a second)."""

    def test_a_negative_learning_rate_is_named(self):
        runs = sweep.expand(table2_small.get_config("tiny"))
        path = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "table2.py")
        self.assertEqual(sweep.override_config_error(runs, path,
                                                     [("optim.learning_rate", "-1")]),
                         "optim.learning_rate must be > 0, got -1.0")
        self.assertIsNone(sweep.override_config_error(runs, path, [("model.d_model", "32")]))
        # A field that holds None is parsed by its declared type, as the trainer's flag is.
        self.assertIsNone(sweep.override_config_error(runs, path,
                                                      [("train.max_steps_per_run", "3")]))
        self.assertEqual(sweep.override_config_error(runs, path,
                                                     [("train.max_steps_per_run", "0")]),
                         "train.max_steps_per_run must be >= 1 or None, got 0")
        self.assertIsNone(sweep.override_config_error(runs, path, []))
        # A run whose own config is refused is left to fail as a run (reported in the table).
        bad = [dataclasses.replace(runs[0], overrides=tuple(runs[0].overrides) + (
            ("train.nonfinite_policy", "bogus"),))]
        self.assertIsNone(sweep.override_config_error(bad, path,
                                                      [("optim.learning_rate", "-1")]))


class ParallelEnvTest(absltest.TestCase):

    def test_each_trainer_gets_its_share_unless_the_environment_decides(self):
        self.assertEqual([sweep.memory_fraction(n) for n in (1, 2, 3, 4, 8)],
                         ["0.9", "0.45", "0.3", "0.225", "0.112"])
        base = {"PATH": "/bin"}
        self.assertEqual(sweep.parallel_env(base, 2),
                         {"PATH": "/bin", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.45"})
        self.assertEqual(base, {"PATH": "/bin"})  # not changed in place
        for own in ({"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.3"},
                    {"XLA_CLIENT_MEM_FRACTION": "0.3"},  # jaxlib refuses both names at once
                    {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"},
                    {"XLA_PYTHON_CLIENT_PREALLOCATE": "0"},
                    {"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"}):
            with self.subTest(own):
                self.assertEqual(sweep.parallel_env({**base, **own}, 3), {**base, **own})
        # Preallocation left on explicitly: the share is still needed.
        self.assertEqual(sweep.parallel_env({"XLA_PYTHON_CLIENT_PREALLOCATE": "true"}, 4),
                         {"XLA_PYTHON_CLIENT_PREALLOCATE": "true",
                          "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.225"})
        with self.assertRaisesRegex(ValueError, r"^parallel=0: must be at least 1$"):
            sweep.parallel_env(base, 0)

    def test_concurrency_counts_runs_in_flight_and_shared_seconds(self):
        c = sweep.Concurrency(2)
        a = c.enter(0.0)
        b = c.enter(10.0)
        self.assertEqual(c.in_flight(), 2)
        self.assertEqual(c.leave(a, 30.0), (2, 20.0))  # b in flight from 10 to 30
        d = c.enter(40.0)
        self.assertEqual(c.leave(b, 50.0), (2, 30.0))  # a over 10-30, d over 40-50
        self.assertEqual(c.leave(d, 60.0), (2, 10.0))
        e = c.enter(70.0)
        self.assertEqual(c.leave(e, 80.0), (1, 0.0))


class ConfigChangeTest(_DriverCallTestCase):
    """A training config file edited between calls on one root (the recorded commands stay the
    same: :func:`sweep.conflicts` and :func:`sweep.changed_overrides` see nothing) is refused
    before anything is written, unless accepted; ``report_only`` marks the runs and
    ``dry_run`` lists them. Through the driver, in process: the stand-in trainer, whose
    invocations then get the config the real trainer records (:func:`sweep.resolved_config`,
    and the command as its ``argv``), and a training config that wraps Table 2's tiny one."""

    WRAPPER = ("from configs import table2\nWARMUP = {}\n\n\ndef get_config(arg=None):\n"
               "    config = table2.get_config(arg)\n    config.optim.warmup_steps = WARMUP\n"
               "    return config\n")

    def setUp(self):
        super().setUp()
        self.repo = _stand_in_repo(self.root, "dict()")
        self.corpora = []
        for name in ("corpus_a", "corpus_b"):  # corpus_data's train/ and validation/
            for split in ("train", "validation"):
                os.makedirs(os.path.join(self.root, name, split))
            self.corpora.append(os.path.join(self.root, name))
        self.config_file = os.path.join(self.repo, "configs", "edited.py")
        self.edit(1)
        self.config = self.sweep_config(self.corpora[0])
        self.sweep_root = os.path.join(self.root, "sweep")
        self.names = [r.name for r in sweep.expand(self.config)]

    def sweep_config(self, corpus):
        return dict(name="demo", train_config="configs/edited.py",
                    arg=(("arch", "softmax"), ("opt", "adamw"), ("tiny", True),
                         ("corpus", corpus)),
                    overrides=(("train.total_steps", 4), ("train.tensorboard", False)),
                    grid=((("train.eval_every", (1, 2)),),), seed_axis=None,
                    local_args=("corpus",))

    def edit(self, warmup):
        """Writes the training config with ``optim.warmup_steps = warmup``."""
        with open(self.config_file, "w") as f:
            f.write(self.WRAPPER.format(warmup))

    def record_resolved(self, edit=None):
        """Gives every invocation of the runs the config the real trainer would have recorded
        from the config file as it is now (``edit``: a function changing it in place)."""
        cache = {}
        for run in sweep.expand(self.config):
            workdir = sweep.run_dir(self.sweep_root, run)
            with open(os.path.join(workdir, sweep.RUN_RECORD)) as f:
                cmd = json.load(f)["command"]
            path = os.path.join(workdir, "invocations.jsonl")
            records = sweep.read_jsonl(path)
            for r in records:
                r["config"] = sweep.resolved_config(self.config_file, run.arg, run.overrides,
                                                    cache)
                r["argv"] = cmd[1:]
                if edit:
                    edit(r["config"])
            with open(path, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in records)

    def test_an_edited_config_file_is_refused_marked_and_listed(self):
        self.assertEqual(self.call(), 0)
        self.record_resolved()
        self.assertEqual(self.call(), 0)  # unchanged: skipped
        self.assertIn(f"--- {self.names[0]}: finished, skipped", self.lines)
        self.edit(10)  # the warm-up edited between two calls (another size: a fresh .pyc)
        before = _snapshot(self.sweep_root)
        with self.assertRaises(sweep.SweepConfigError) as e:
            self.call()
        message = str(e.exception)
        for name in self.names:
            self.assertIn(f"\n  {name}: optim.warmup_steps 1 -> 10\n", message)
        self.assertIn("than configs/edited.py gives them now", message)
        self.assertIn("or pass --accept_config_changes", message)
        self.assertEqual(_snapshot(self.sweep_root), before)  # nothing written
        # --dry_run lists them (and writes nothing); --report_only marks them.
        self.assertEqual(self.call(dry_run=True), 0)
        self.assertRegex(self.lines[0], r"^dry run: the call would refuse to run")
        self.assertIn(f"\n  {self.names[1]}: optim.warmup_steps 1 -> 10", self.lines[0])
        self.assertEqual(_snapshot(self.sweep_root), before)
        self.assertEqual(self.call(report_only=True), 0)
        with open(os.path.join(self.sweep_root, sweep_report.RESULTS_MD)) as f:
            page = f.read()
        row = [line for line in page.splitlines() if line.startswith(f"| {self.names[0]} ")]
        self.assertLen(row, 1)
        self.assertIn(f"| {self.names[0]} {sweep_report.CONFIG_MARK} | finished |", row[0])
        self.assertIn("config changed since it ran: optim.warmup_steps 1 -> 10", row[0])
        with open(os.path.join(self.sweep_root, sweep_report.RESULTS_JSON)) as f:
            self.assertEqual(json.load(f)["runs"][1]["config_changed"],
                             "optim.warmup_steps 1 -> 10")
        # Accepted: skipped as they are, still marked.
        self.assertEqual(self.call(accept_config_changes=True), 0)
        self.assertIn(f"--- {self.names[1]}: finished, skipped", self.lines)
        with open(os.path.join(self.sweep_root, sweep_report.RESULTS_MD)) as f:
            self.assertIn(f"| {self.names[1]} {sweep_report.CONFIG_MARK} |", f.read())
        # The edit undone: nothing to refuse, nothing marked.
        self.edit(1)
        self.assertEqual(self.call(report_only=True), 0)
        with open(os.path.join(self.sweep_root, sweep_report.RESULTS_MD)) as f:
            self.assertNotIn(sweep_report.CONFIG_MARK, f.read())

    def test_a_partial_run_resumed_after_an_edit_is_refused(self):
        self.assertEqual(self.call(), 0)
        self.record_resolved()
        workdir = sweep.run_dir(self.sweep_root, sweep.expand(self.config)[0])
        log = os.path.join(workdir, "console.log")
        with open(log) as f:
            kept = [line for line in f if not line.startswith("final:")]
        with open(log, "w") as f:
            f.writelines(kept)  # stopped after its step-4 checkpoint: resumed next
        self.assertEqual(sweep.run_state(workdir).status, sweep.Status.PARTIAL)
        self.edit(10)
        before = _snapshot(self.sweep_root)
        with self.assertRaisesRegex(sweep.SweepConfigError,
                                    rf"\n  {re.escape(self.names[0])}: optim\.warmup_steps "
                                    rf"1 -> 10\n"):
            self.call(only=[self.names[0]])
        self.assertEqual(_snapshot(self.sweep_root), before)  # not resumed
        self.assertEqual(self.call(only=[self.names[0]], accept_config_changes=True), 0)
        self.assertEqual(sweep.run_state(workdir).status, sweep.Status.FINISHED)
        self.assertLen(sweep.read_jsonl(os.path.join(workdir, "invocations.jsonl")), 2)

    def test_a_local_path_or_an_option_added_since_is_no_change(self):
        self.assertEqual(self.call(), 0)

        def older_trainer(config):  # records of a trainer older than these options
            del config["data"]["max_bad_fraction"]
            del config["optim"]["flatten"]
            del config["train"]["loss_chunk_size"]
            del config["model"]["swiglu_packed"]
            del config["model"]["norm_implementation"]

        self.record_resolved(older_trainer)
        # Another machine: the corpus elsewhere (its paths are in data.paths / val_paths).
        self.config = self.sweep_config(self.corpora[1])
        self.assertEqual(self.call(), 0)
        self.assertIn(f"--- {self.names[0]}: finished, skipped", self.lines)
        runs = sweep.expand(self.config)
        config_path = self.config_file
        self.assertEqual(sweep.config_changes(runs, self.sweep_root, config_path=config_path,
                                              local_args=("corpus",)), {})
        # Not a local argument: the paths differ. An option added since, at another value than
        # it had before it existed: a change. Resume-free fields are none (model.swiglu_packed,
        # like split_projections and norm_implementation, computes the same parameters with
        # the same values).
        self.assertEqual(
            sweep.config_changes(runs[:1], self.sweep_root, config_path=config_path),
            {self.names[0]: f"data.paths {[os.path.join(self.corpora[0], 'train')]!r} -> "
                            f"{[os.path.join(self.corpora[1], 'train')]!r}; data.val_paths "
                            f"{[os.path.join(self.corpora[0], 'validation')]!r} -> "
                            f"{[os.path.join(self.corpora[1], 'validation')]!r}"})
        self.assertEqual(
            sweep.config_changes(runs[:1], self.sweep_root, config_path=config_path,
                                 local_args=("corpus",),
                                 extra_overrides=(("optim.flatten", True),
                                                  ("data.max_bad_fraction", 0.5),
                                                  ("model.swiglu_packed", True),
                                                  ("model.norm_implementation", "pallas"),
                                                  ("model.split_projections", True),
                                                  ("train.micro_batch_size", 1))),
            {self.names[0]: "optim.flatten False -> True"})


if __name__ == "__main__":
    absltest.main()
