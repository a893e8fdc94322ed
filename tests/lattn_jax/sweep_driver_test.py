"""The sweep driver (lattn_jax/sweep_driver.py) in process: option checks, the dry run's
plan, --report_only with --export (the binary end to end: tests/experiments/sweep_test.py)."""

import json
import os
import tarfile

from absl.testing import absltest

from lattn_jax import sweep
from lattn_jax import sweep_driver

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CONFIG = dict(name="demo", train_config="configs/table2.py",
              arg=(("arch", "softmax"), ("tiny", True)),
              grid=((("train.keep_checkpoints", (2, 3, 4)),),), seed_axis=None)


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
                         "; up to 2 runs at once (XLA_PYTHON_CLIENT_MEM_FRACTION=0.45 each)")

    def test_bad_options_raise_before_anything_is_written(self):
        cases = ((dict(finish_by_deadline=True), "--finish_by_deadline needs --deadline_s"),
                 (dict(reuse_from=[self.tmp]), f"--reuse_from={self.tmp} holds no runs/"),
                 (dict(export=os.path.join(self.root, "x")), "is inside --root"),
                 (dict(only=["arch=gdn"]), "--only='arch=gdn': no axis arch"),
                 (dict(overrides=["train.total_stepz=3"]), "train.total_stepz: no such field"),
                 (dict(report_only=True), "no such directory"))
        for options, message in cases:
            with self.assertRaisesRegex(sweep.SweepConfigError, message):
                self._run(**options)
        self.assertFalse(os.path.exists(self.root))

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


if __name__ == "__main__":
    absltest.main()
