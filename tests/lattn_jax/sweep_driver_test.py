"""The sweep driver (lattn_jax/sweep_driver.py) in process: option checks, the dry run's
plan, --report_only with --export (the binary end to end: tests/experiments/sweep_test.py)."""

import json
import os
import random
import re
import signal
import tarfile
import threading
from unittest import mock

from absl.testing import absltest
import numpy as np

from lattn_jax import sweep
from lattn_jax import sweep_driver

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CONFIG = dict(name="demo", train_config="configs/table2.py",
              arg=(("arch", "softmax"), ("tiny", True)),
              grid=((("train.keep_checkpoints", (2, 3, 4)),),), seed_axis=None)


def fake_nvidia_smi(directory: str, count: int, status: int = 0) -> str:
    """Writes ``<directory>/nvidia-smi``, which prints ``count`` lines of ``nvidia-smi -L``
    (each GPU with one MIG line under it) and exits with ``status``; returns ``directory``."""
    lines = "".join(f'echo "GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i}a)"\n'
                    f'echo "  MIG 1g.10gb Device 0: (UUID: MIG-{i}b)"\n' for i in range(count))
    if status:
        lines += 'echo "NVIDIA-SMI has failed because it couldn\'t communicate with the driver"\n'
    path = os.path.join(directory, "nvidia-smi")
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\n{lines}exit {status}\n")
    os.chmod(path, 0o755)
    return directory


class SweepDriverTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.tmp = self.create_tempdir().full_path
        self.root = os.path.join(self.tmp, "root")
        self.lines = []

    def _run(self, **options):
        return sweep_driver.run(CONFIG, sweep_driver.SweepOptions(root=self.root, **options),
                                repo_root=REPO, argv=["sweep.py"], print_fn=self.lines.append)

    def test_overrides_and_hint(self):
        self.assertEqual(sweep_driver.parse_overrides(["train.a=1", " b =x=y"]),
                         [("train.a", "1"), ("b", "x=y")])
        for bad in ("micro_batch", "=3"):
            with self.assertRaisesRegex(sweep.SweepConfigError,
                                        rf"^--override='{bad}': expected field=value"):
                sweep_driver.parse_overrides([bad])
        self.assertEqual(sweep_driver.override_hint("train", ["s", "--config.train.steps=3"]),
                         "--config is the sweep's config: a field of every run's experiment "
                         "config goes in --override=train.steps=3")
        self.assertEqual(sweep_driver.parallel_note({}, 1), "")
        self.assertEqual(sweep_driver.parallel_note({}, 2),
                         "; up to 2 runs at once, sharing the machine "
                         "(XLA_PYTHON_CLIENT_MEM_FRACTION=0.45 each, on a GPU)")

    def test_a_field_given_twice_is_refused_naming_both_values(self):
        # The trainer's last --config.<field> flag won silently (2026-12-06 newcomer probe).
        rng = random.Random(1206)
        first, second = rng.sample(range(2, 500), 2)
        texts = ["optim.warmup_steps=1", f"train.total_steps={first}",
                 f" train.total_steps ={second}"]
        with self.assertRaisesRegex(sweep.SweepConfigError,
                                    rf"^--override gives train\.total_steps twice "
                                    rf"\(train\.total_steps={first}, then  train\.total_steps "
                                    rf"={second}\): give it once"):
            sweep_driver.parse_overrides(texts)
        with self.assertRaisesRegex(sweep.SweepConfigError, r"gives train\.total_steps twice"):
            self._run(dry_run=True, overrides=texts[1:])
        self.assertFalse(os.path.exists(self.root))
        self.assertEqual(sweep_driver.parse_overrides(texts[:2]),
                         [("optim.warmup_steps", "1"), ("train.total_steps", str(first))])

    def test_bad_options_raise_before_anything_is_written(self):
        cases = ((dict(finish_by_deadline=True), "--finish_by_deadline needs --deadline_s"),
                 (dict(reuse_from=[self.tmp]), f"--reuse_from={self.tmp} holds no runs/"),
                 (dict(export=os.path.join(self.root, "x")), "is inside --root"),
                 (dict(only=["arch=gdn"]), "--only='arch=gdn': no axis arch"),
                 (dict(overrides=["train.total_stepz=3"]), r"train\.total_stepz: no such field "
                  r"in .*\); did you mean \"train\.total_steps\"\?$"),
                 (dict(overrides=["trian.total_steps=3"]), r"trian\.total_steps: no such field "
                  r"in .*\); did you mean \"train\.total_steps\"\?$"),
                 (dict(report_only=True), "no such directory"))
        for options, message in cases:
            with self.assertRaisesRegex(sweep.SweepConfigError, message):
                self._run(**options)
        self.assertFalse(os.path.exists(self.root))
        # Paths that cannot be written: found before anything runs, in one line.
        a_file = os.path.join(self.tmp, "a_file")
        with open(a_file, "w") as f:
            f.write("x")
        with self.assertRaisesRegex(sweep.SweepConfigError,
                                    rf"^--export={a_file}/out: {a_file} is a file, not a "
                                    rf"directory$"):
            self._run(export=os.path.join(a_file, "out"))
        root = os.path.join(a_file, "root")
        with self.assertRaisesRegex(sweep.SweepConfigError,
                                    rf"^--root={root}: {a_file} is a file, not a directory "
                                    rf"\(nothing was written\)$"):
            sweep_driver.run(CONFIG, sweep_driver.SweepOptions(root=root), repo_root=REPO,
                             argv=["sweep.py"], print_fn=self.lines.append)
        self.assertFalse(os.path.exists(self.root))

    def test_only_with_report_only_is_refused_not_ignored(self):
        # --report_only --only=... rewrote results.md with every run, ignoring the filter.
        value = random.choice((2, 3, 4))
        only = f"train.keep_checkpoints={value}"
        workdir = os.path.join(self.root, "runs", "train.keep_checkpoints=2")
        os.makedirs(workdir)
        with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
            f.write(json.dumps({"step": 4, "time": 1.0, "val_loss": random.random()}) + "\n")
        with self.assertRaises(sweep.SweepConfigError) as cm:
            self._run(report_only=True, only=[only])
        self.assertEqual(str(cm.exception), (
            f"--only={only} does not apply to --report_only: the results always cover every "
            f"run under --root; drop --only (--dry_run --only={only} lists the selected runs)"))
        self.assertFalse(os.path.exists(os.path.join(self.root, "results.md")))
        self.assertEqual(self._run(report_only=True), 0)  # without --only: the whole report
        self.assertTrue(os.path.exists(os.path.join(self.root, "results.md")))

    def test_a_dry_run_says_a_missing_corpus_would_stop_the_call(self):
        # --dry_run planned "3 would be launched" where the same call refuses to run.
        corpus = os.path.join(self.tmp, f"corpus{random.randint(0, 999)}")
        config = dict(CONFIG, arg=CONFIG["arg"] + (("corpus", corpus),), local_args=("corpus",))

        def run(**options):
            return sweep_driver.run(config, sweep_driver.SweepOptions(root=self.root, **options),
                                    repo_root=REPO, argv=["sweep.py"],
                                    print_fn=self.lines.append)

        line = (f"--config argument corpus={corpus}: no such file or directory on this machine "
                f"(every run would fail reading it)")
        self.assertEqual(run(dry_run=True), 0)
        self.assertEqual(self.lines[0], f"dry run: the call would refuse to run here; {line}")
        self.assertTrue(self.lines[1].startswith("dry run of sweep demo: 3 run(s) selected"))
        with self.assertRaises(sweep.SweepConfigError) as cm:
            run()
        self.assertEqual(str(cm.exception), line)
        self.assertFalse(os.path.exists(self.root))
        os.makedirs(corpus)  # present: no such line
        self.lines.clear()
        self.assertEqual(run(dry_run=True), 0)
        self.assertTrue(self.lines[0].startswith("dry run of sweep demo"))

    def test_an_override_of_a_grid_axis_is_refused(self):
        # A field axis: the trainer got both flags (last wins) while the run names kept the
        # grid's value; refused before anything runs, naming the field.
        with self.assertRaisesRegex(sweep.SweepConfigError,
                                    r"^--override: train\.keep_checkpoints is an axis of the "
                                    r"sweep's grid \(its values name the runs\); .*--only.*"):
            self._run(overrides=["train.keep_checkpoints=5"], dry_run=True)
        with self.assertRaisesRegex(sweep.SweepConfigError, r"train\.keep_checkpoints is an "
                                                            r"axis"):
            self._run(overrides=["train.keep_checkpoints=5"], only=["train.keep_checkpoints=2"])
        # A field that an argument axis sets (seed=42 / 43: train.seed): the same.
        config = dict(CONFIG, grid=((("seed", (42, 43)),),))
        with self.assertRaisesRegex(sweep.SweepConfigError,
                                    r"^--override: train\.seed is set by the sweep's grid "
                                    r"\(its argument axis seed, whose values name the runs\); .*"):
            sweep_driver.run(config, sweep_driver.SweepOptions(
                root=self.root, overrides=["train.seed=1"], dry_run=True), repo_root=REPO,
                argv=["sweep.py"], print_fn=self.lines.append)
        # An argument axis of one value (table2_small's lr=0.003, the file's default too):
        # the field follows another value of it.
        config = dict(CONFIG, grid=((("lr", (0.003,)), ("seed", (42,))),))
        with self.assertRaisesRegex(sweep.SweepConfigError,
                                    r"^--override: optim\.learning_rate is set by the sweep's "
                                    r"grid \(its argument axis lr, whose values name the runs\)"):
            sweep_driver.run(config, sweep_driver.SweepOptions(
                root=self.root, overrides=["optim.learning_rate=0.01"], dry_run=True),
                repo_root=REPO, argv=["sweep.py"], print_fn=self.lines.append)
        # A text argument axis of one value, the file's default (arch=gdn, opt=muon): the field
        # follows the values the file's error lists (it was not seen: no other value to try).
        rng = np.random.default_rng()
        for axis, value, field, override in (
                ("arch", "gdn", "model.layer_pattern",
                 repr(tuple(rng.choice(["gdn", "attn"], size=int(rng.integers(2, 5)))))),
                ("opt", "muon", "optim.name", str(rng.choice(["adamw", "muon"])))):
            config = dict(CONFIG, arg=(("tiny", True),), grid=(((axis, (value,)),),))
            with self.subTest(axis=axis), self.assertRaisesRegex(
                    sweep.SweepConfigError,
                    rf"^--override: {re.escape(field)} is set by the sweep's grid \(its argument "
                    rf"axis {axis}, whose values name the runs\)"):
                sweep_driver.run(config, sweep_driver.SweepOptions(
                    root=self.root, overrides=[f"{field}={override}"], dry_run=True),
                    repo_root=REPO, argv=["sweep.py"], print_fn=self.lines.append)
        self.assertFalse(os.path.exists(self.root))
        # A field no axis sets is still an override, with a text axis of one value too.
        config = dict(CONFIG, arg=(("tiny", True),), grid=((("arch", ("gdn",)),),))
        self.assertEqual(sweep_driver.run(config, sweep_driver.SweepOptions(
            root=self.root, overrides=["train.total_steps=3"], dry_run=True), repo_root=REPO,
            argv=["sweep.py"], print_fn=self.lines.append), 0)
        self.assertEqual(self._run(overrides=["train.total_steps=3"], dry_run=True), 0)

    def test_a_bad_name_names_where_it_came_from(self):
        cases = ((dict(CONFIG, grid=((("train.keep_checkpointz", (2, 3)),),)), (),
                  r"^the sweep's grid axis train\.keep_checkpointz: no such field in table2\.py "
                  r"\(2 of 2 runs"),
                 (dict(CONFIG, overrides=(("train.total_stepz", 3),)), (),
                  r"^the sweep config's overrides: train\.total_stepz: no such field"),
                 (CONFIG, ["train.total_stepz=3"],
                  r"^--override: train\.total_stepz: no such field"),
                 (dict(CONFIG, grid=((("sede", (1, 2)),),)), (),
                  r"^the sweep's grid \(argument axes, arg\): table2\.py:arch=softmax,tiny=True,"
                  r"sede=1: unknown config argument 'sede'"))
        for config, overrides, message in cases:
            with self.assertRaisesRegex(sweep.SweepConfigError, message):
                sweep_driver.run(config, sweep_driver.SweepOptions(
                    root=self.root, overrides=list(overrides), dry_run=True), repo_root=REPO,
                    argv=["sweep.py"], print_fn=self.lines.append)
        self.assertFalse(os.path.exists(self.root))

    def test_gpus_groups_and_bad_values_in_one_line(self):
        self.assertEqual(sweep_driver.parse_gpus("0,1,2,3"), ["0", "1", "2", "3"])
        self.assertEqual(sweep_driver.parse_gpus("0+1, 2 + 3"), ["0,1", "2,3"])
        self.assertEqual(sweep_driver.parse_gpus("7"), ["7"])
        cases = (("", r"empty GPU group or id in ''"),
                 ("0,,1", r"empty GPU group or id in ''"),
                 ("0,1+", r"empty GPU group or id in '1\+'"),
                 ("0,a", r"'a' is not a GPU id \(a non-negative integer\)"),
                 ("0,1.5", r"'1\.5' is not a GPU id"),
                 ("GPU-3f2a", r"'GPU-3f2a' is not a GPU id"),
                 ("0,-1", r"'-1' is a negative GPU id"),
                 ("0,1,0", r"GPU 0 is given twice"),
                 ("0+1,1+2", r"GPU 1 is given twice"),
                 ("3,03", r"GPU 3 is given twice"))
        for text, message in cases:
            with self.subTest(gpus=text):
                with self.assertRaisesRegex(sweep.SweepConfigError,
                                            rf"^--gpus={re.escape(repr(text))}: {message}[^\n]*$"):
                    self._run(gpus=text)
        with self.assertRaisesRegex(sweep.SweepConfigError,
                                    r"^--parallel=3 is above the 2 GPU group\(s\) of "
                                    r"--gpus=0\+1,2\+3 \(one run per group at a time\)"):
            self._run(gpus="0+1,2+3", parallel=3)
        self.assertFalse(os.path.exists(self.root))  # refused before anything was written
        # --parallel: the number of groups by default, fewer if asked, 1 without --gpus.
        resolve = sweep_driver.resolve
        self.assertEqual(resolve(sweep_driver.SweepOptions(root="r", gpus="0,1,2",
                                                           parallel=None)).parallel, 3)
        self.assertEqual(resolve(sweep_driver.SweepOptions(root="r", gpus="0,1,2",
                                                           parallel=2)).parallel, 2)
        self.assertEqual(resolve(sweep_driver.SweepOptions(root="r", parallel=None)).parallel, 1)
        self.assertEqual(sweep_driver.parallel_note({}, 2, ["0,1", "2,3"]),
                         "; up to 2 run(s) at once, one per GPU group, each alone on it "
                         "(CUDA_VISIBLE_DEVICES 0,1 | 2,3)")

    def test_gpus_the_machine_lacks_are_refused_naming_what_it_has(self):
        # A CPU-only machine given --gpus=0,1 ran two trainers at once on the CPU, each one's
        # tokens/s reported as measured alone (2026-12-06 newcomer probe).
        count = random.Random(1206).randint(2, 7)
        bin_dir = fake_nvidia_smi(self.create_tempdir().full_path, count)
        no_driver = os.path.join(self.tmp, "no-proc")
        proc_gpus = self.create_tempdir().full_path
        for i in range(3):
            os.makedirs(os.path.join(proc_gpus, f"0000:{i + 10:02x}:00.0"))
        failing = fake_nvidia_smi(self.create_tempdir().full_path, 0, status=9)
        cases = ((bin_dir, no_driver, f"0,{count}", rf"^--gpus=0,{count}: GPU {count} is not on "
                  rf"this machine \(nvidia-smi -L lists {count} GPU\(s\), ids 0-{count - 1}\): "
                  r"name GPUs it has, or leave --gpus out \(--parallel=N runs N at once, "
                  r"sharing the machine, and the results mark them\)$"),
                 (bin_dir, no_driver, f"{count + 1}+{count},1", rf"GPUs {count}, {count + 1} "
                  rf"are not on this machine"),
                 (self.tmp, no_driver, "0,1", r"^--gpus=0,1: GPUs 0, 1 are not on this machine "
                  rf"\(no nvidia-smi on PATH and no {no_driver}: no NVIDIA driver\)"),
                 (self.tmp, proc_gpus, "2,3", rf"^--gpus=2,3: GPU 3 is not on this machine "
                  rf"\({proc_gpus} lists 3 GPU\(s\) \(no nvidia-smi on PATH\), ids 0-2\)"),
                 (failing, no_driver, "0", r"^--gpus=0: GPU 0 is not on this machine "
                  r"\(nvidia-smi -L failed with status 9: NVIDIA-SMI has failed because it "
                  r"couldn't communicate with the driver\)"))
        for path, proc, gpus, message in cases:
            with self.subTest(gpus=gpus, path=path), mock.patch.dict(os.environ, PATH=path), \
                    mock.patch.object(sweep_driver, "NVIDIA_PROC_GPUS", proc):
                with self.assertRaisesRegex(sweep.SweepConfigError, message):
                    self._run(gpus=gpus)
                self.lines.clear()  # a dry run plans it (for another machine) and says so
                self.assertEqual(self._run(dry_run=True, gpus=gpus), 0)
                self.assertRegex(self.lines[0], "^dry run: the call would refuse to run here; "
                                 + (message[1:] if message[0] == "^" else ".*" + message))
                self.assertTrue(self.lines[1].startswith("dry run of sweep demo:"),
                                self.lines[1])
        self.assertFalse(os.path.exists(self.root))
        with mock.patch.dict(os.environ, PATH=bin_dir):  # every GPU it has: planned
            self.assertEqual(self._run(dry_run=True, gpus=f"{count - 1},0+1"), 0)
        with mock.patch.dict(os.environ, PATH=self.tmp), \
                mock.patch.object(sweep_driver, "NVIDIA_PROC_GPUS", proc_gpus):
            self.assertEqual(self._run(dry_run=True, gpus="2,0+1"), 0)
        # An unreadable count (nvidia-smi hung) is not refused; without --gpus nothing is read.
        sweep_driver.check_gpus_exist(sweep_driver.SweepOptions(root="r", gpus="0,1"),
                                      gpus=lambda: (None, "nvidia-smi -L did not answer"))
        sweep_driver.check_gpus_exist(sweep_driver.SweepOptions(root="r"), gpus=None)

    def test_deadline_holds_back_a_launch_shorter_than_a_start_up_by_default(self):
        # With --min_run_s=0, the default, a trainer was launched half a second before its
        # SIGTERM: it stopped during its start-up (2026-12-06 newcomer probe).
        rng = random.Random(1206)
        margin = rng.uniform(5.0, 40.0)
        left = rng.uniform(0.5, sweep_driver.DEFAULT_MIN_RUN_S - 10.0)  # before the SIGTERM
        deadline = dict(deadline_s=margin + left, stop_margin_s=margin, max_runs=1)
        self.assertEqual(self._run(dry_run=True, **deadline), 0)
        held = re.fullmatch(r"train\.keep_checkpoints=2: not started \(step 0\); not launched: "
                            r"the deadline: (\d+) s before the trainer's stop, under "
                            r"--min_run_s 60", self.lines[1].split("\n")[0])
        self.assertIsNotNone(held, self.lines[1])
        self.assertLessEqual(abs(int(held.group(1)) - left), 1.0)
        self.assertTrue(self.lines[0].endswith("0 would be launched, in this order"),
                        self.lines[0])
        self.lines.clear()  # an explicit --min_run_s keeps its meaning, 0 included
        self.assertEqual(self._run(dry_run=True, min_run_s=0.0, **deadline), 0)
        self.assertEqual(self.lines[1].split("\n")[0],
                         "train.keep_checkpoints=2: not started (step 0); launch 1: starting")
        self.lines.clear()
        self.assertEqual(self._run(dry_run=True, min_run_s=left + 5.0, **deadline), 0)
        self.assertIn(f"under --min_run_s {left + 5.0:g}\n", self.lines[1])
        self.assertFalse(os.path.exists(self.root))
        resolve = sweep_driver.resolve
        self.assertEqual(resolve(sweep_driver.SweepOptions(root="r")).min_run_s,
                         sweep_driver.DEFAULT_MIN_RUN_S)
        self.assertEqual(resolve(sweep_driver.SweepOptions(root="r", min_run_s=left)).min_run_s,
                         left)

    def test_dry_run_with_gpus_names_the_groups(self):
        bin_dir = fake_nvidia_smi(self.create_tempdir().full_path, 8)
        with mock.patch.dict(os.environ, PATH=bin_dir):  # the GPUs of an 8-GPU machine
            self.assertEqual(self._run(dry_run=True, gpus="4,6", parallel=None), 0)
        self.assertFalse(os.path.exists(self.root))
        self.assertEqual([line.split("\n")[0] for line in self.lines], [
            "dry run of sweep demo: 3 run(s) selected; 3 would be launched, in this order; up "
            "to 2 at once: launches 1-2 at the start, each later one when a trainer exits; one "
            "run per GPU group, each alone on it (CUDA_VISIBLE_DEVICES 4 | 6)",
            "train.keep_checkpoints=2: not started (step 0); launch 1: starting, at the start, "
            "on CUDA_VISIBLE_DEVICES=4",
            "train.keep_checkpoints=3: not started (step 0); launch 2: starting, at the start, "
            "on CUDA_VISIBLE_DEVICES=6",
            "train.keep_checkpoints=4: not started (step 0); launch 3: starting, when a "
            "trainer exits, on the GPU group it frees"])

    def test_a_second_call_on_a_root_in_use_is_refused(self):
        os.makedirs(self.root)
        with sweep.root_lock(self.root):
            with self.assertRaisesRegex(
                    sweep.SweepConfigError,
                    rf"^--root={self.root} is in use by another sweep call \(pid {os.getpid()}; "
                    rf"{self.root}/\.sweep\.lock\): wait for it to end, or use another --root$"):
                self._run(max_runs=0)
            self.assertEqual(os.listdir(self.root), [sweep.ROOT_LOCK])  # nothing else written
        self.assertEqual(self._run(max_runs=0), sweep_driver.EXIT_STOPPED)  # released
        self.assertIn("sweep demo: 3 run(s) selected (3 not started); no deadline", self.lines)

    def test_dry_run_and_report_only_with_export(self):
        self.assertEqual(self._run(dry_run=True, parallel=2, max_runs=1), 0)
        self.assertFalse(os.path.exists(self.root))
        self.assertEqual([line.split("\n")[0] for line in self.lines], [
            "dry run of sweep demo: 3 run(s) selected; 1 would be launched, in this order",
            "train.keep_checkpoints=2: not started (step 0); launch 1: starting, at the start",
            "train.keep_checkpoints=3: not started (step 0); not launched: --max_runs=1 reached",
            "train.keep_checkpoints=4: not started (step 0); not launched: --max_runs=1 "
            "reached"])
        workdir = os.path.join(self.root, "runs", "train.keep_checkpoints=2")
        os.makedirs(workdir)
        with open(os.path.join(workdir, "console.log"), "w") as f:
            f.write("final: step 4\n")
        with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
            f.write(json.dumps({"step": 4, "time": 1.0, "val_loss": 2.0}) + "\n")
        export = os.path.join(self.tmp, "export")
        self.lines.clear()
        self.assertEqual(self._run(report_only=True, export=export), 0)
        self.assertEqual(self.lines, [f"wrote {self.root}/results.md",
                                      f"exported 6 files to {export}"])
        with tarfile.open(os.path.join(export, sweep.RECORDS_ARCHIVE)) as tar:
            self.assertLen(tar.getnames(), 2)
        # Neither --dry_run nor --report_only is logged: sweep.jsonl lists the calls that ran
        # the sweep (the module docstring).
        self.assertFalse(os.path.exists(os.path.join(self.root, "sweep.jsonl")))
        # A run of a wider grid (records rebuilt without the argument that made them, as
        # Table 2's second seeds without seeds=2): said once, with the way out.
        other = os.path.join(self.root, "runs", "train.keep_checkpoints=9")
        os.makedirs(other)
        with open(os.path.join(other, sweep.RUN_RECORD), "w") as f:
            json.dump({"name": "train.keep_checkpoints=9",
                       "values": [["train.keep_checkpoints", 9]]}, f)
        self.lines.clear()
        self.assertEqual(self._run(report_only=True), 0)
        self.assertEqual(self.lines, [
            f"wrote {self.root}/results.md",
            "note: 1 run(s) under --root are not in this grid (results.md marks them \"(not in "
            "this grid)\"; e.g. train.keep_checkpoints=9): if they belong to this sweep, give "
            "the config argument they were run with (the config file's docstring lists the "
            "arguments, e.g. seeds=)"])

    def test_a_second_ctrl_c_is_counted_and_said(self):
        # Both Ctrl-Cs set one stop flag: the second, which stops a trainer at once without
        # saving, was not seen as a second (sweep.launch then waited out the grace period).
        seen = []

        def execute(runs, root, *, stop, **kw):
            del runs, root, kw
            handler = signal.getsignal(signal.SIGINT)
            for _ in range(2):
                handler(signal.SIGINT, None)
            seen.append((stop.is_set(), stop.interrupts))
            return sweep.ExecutionSummary(status="interrupted")

        with mock.patch.object(sweep, "execute", side_effect=execute):
            self.assertEqual(self._run(max_runs=1), sweep_driver.EXIT_STOPPED)
        self.assertEqual(seen, [(True, 2)])
        self.assertIn("sweep: SIGINT; stopping after the current run's checkpoint", self.lines)
        self.assertIn("sweep: second Ctrl-C; stopping every trainer in flight at once, without "
                      "saving", self.lines)

    def test_the_signal_handlers_before_the_call_are_restored(self):
        # _execute installed its SIGTERM and Ctrl-C handlers and left them installed: an
        # in-process caller's Ctrl-C then only set a stale sweep's stop flag.
        def mine(signum, frame):
            del signum, frame

        seen = []

        def execute(runs, root, *, stop, **kw):
            del runs, root, kw
            handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
            self.assertNotIn(mine, handlers.values())
            for signum, handler in handlers.items():  # the driver's: the stop flag is set
                stop.clear()
                handler(signum, None)
                seen.append(stop.is_set())
            if len(seen) > 2:
                raise RuntimeError("trainer could not start")
            return sweep.ExecutionSummary(status="interrupted")

        before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            signal.signal(signal.SIGTERM, mine)
            with mock.patch.object(sweep, "execute", side_effect=execute):
                self.assertEqual(self._run(max_runs=1), sweep_driver.EXIT_STOPPED)
                self.assertEqual(signal.getsignal(signal.SIGTERM), mine)
                self.assertEqual(signal.getsignal(signal.SIGINT), before[signal.SIGINT])
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                with self.assertRaisesRegex(RuntimeError, "^trainer could not start$"):
                    self._run(max_runs=1)  # raising: restored as well
                self.assertEqual(signal.getsignal(signal.SIGTERM), mine)
                self.assertEqual(signal.getsignal(signal.SIGINT), signal.SIG_IGN)
                # Another thread cannot install handlers: the sweep runs without them.
                codes = []
                thread = threading.Thread(target=lambda: codes.append(
                    self._run(max_runs=1)))
                with mock.patch.object(sweep, "execute",
                                       return_value=sweep.ExecutionSummary(status="complete")):
                    thread.start()
                    thread.join()
                self.assertEqual(codes, [0])
        finally:
            for signum, handler in before.items():
                signal.signal(signum, handler)
        self.assertEqual(seen, [True] * 4)
        self.assertIn("sweep: SIGTERM; stopping after the current run's checkpoint", self.lines)

    def test_sighup_stops_every_run_like_sigterm_unless_ignored(self):
        # A closed terminal or ssh session (SIGHUP) ended the sweep under the default handler
        # at once, its trainers' attempts left unrecorded. Now it sets the stop flag, as
        # SIGTERM does; the lines it prints after it go nowhere (the terminal is gone: EIO)
        # instead of raising; and a SIGHUP ignored before the call (nohup) stays ignored.
        def mine(signum, frame):
            del signum, frame

        hung_up = []

        def print_fn(line):
            if hung_up:
                raise OSError(5, "Input/output error")
            self.lines.append(line)

        def execute(runs, root, *, stop, print_fn, **kw):
            del runs, root, kw
            seen.append(signal.getsignal(signal.SIGHUP))
            if seen[-1] is not signal.SIG_IGN:
                hung_up.append(1)
                os.kill(os.getpid(), signal.SIGHUP)
                for _ in range(100):  # (the handler runs between bytecodes of this thread)
                    if stop.is_set():
                        break
                print_fn("[run] Stopping at step 2 of 4")
            return sweep.ExecutionSummary(status="interrupted" if stop.is_set() else "complete")

        before = signal.getsignal(signal.SIGHUP)
        try:
            for previous, status in ((mine, sweep_driver.EXIT_STOPPED), (signal.SIG_IGN, 0)):
                seen, hung_up[:] = [], []
                signal.signal(signal.SIGHUP, previous)
                with mock.patch.object(sweep, "execute", side_effect=execute):
                    self.assertEqual(sweep_driver.run(
                        CONFIG, sweep_driver.SweepOptions(root=self.root, max_runs=1),
                        repo_root=REPO, argv=["sweep.py"], print_fn=print_fn), status)
                self.assertEqual(signal.getsignal(signal.SIGHUP), previous)  # restored
                self.assertLen(seen, 1)
                if previous is signal.SIG_IGN:
                    self.assertIs(seen[0], signal.SIG_IGN)  # left ignored
                else:
                    self.assertNotIn(seen[0], (mine, signal.SIG_IGN, signal.SIG_DFL))
        finally:
            signal.signal(signal.SIGHUP, before)


if __name__ == "__main__":
    absltest.main()
