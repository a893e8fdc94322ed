"""benchmarks/windows/table2_window.sh: the record restore and the start-up errors.

The script's sweeps are tested where they live (tests/experiments/sweep_test.py); here its own
shell logic runs under ``WINDOW_TMP`` with a budget too short for any phase, so nothing trains.
"""

import json
import os
import re
import subprocess
import sys

from absl.testing import absltest

from tests import binary_runs
from tests.benchmarks import window_shims

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "benchmarks", "windows", "table2_window.sh")
RUN = "arch=softmax,stack=dense,opt=adamw,lr=0.001,seed=42"


def run(tmp, budget="100", **env):
    return subprocess.run(["bash", SCRIPT, budget], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "WINDOW_TMP": tmp, "OUT": os.path.join(tmp, "out"),
                               **env}, timeout=120)


class Table2WindowTest(absltest.TestCase):

    def test_records_are_restored_once_also_when_the_corpus_was_joined_by_hand(self):
        tmp = self.create_tempdir().full_path
        os.makedirs(os.path.join(tmp, "corpus", "prose-llama2"))  # joined by an earlier command
        result = run(tmp)
        self.assertIn("restored sweeps/table2", result.stdout, result.stderr)
        self.assertIn("table2: not started, ", result.stdout)
        metrics = os.path.join(tmp, "sweeps", "table2", "runs", RUN, "metrics.jsonl")
        self.assertTrue(os.path.isfile(metrics))
        self.assertTrue(os.path.isfile(os.path.join(tmp, "sweeps", "table2", "sweep.jsonl")))
        with open(metrics, "w") as f:
            f.write("newer\n")  # this window's own records
        result = run(tmp)
        self.assertNotIn("restored", result.stdout)
        with open(metrics) as f:
            self.assertEqual(f.read(), "newer\n")

    def test_missing_pieces_are_named_with_their_own_exit_status(self):
        tmp = self.create_tempdir().full_path
        result = run(tmp)
        self.assertEqual(result.returncode, 6)
        self.assertIn(os.path.join(tmp, "pieces", "prose-llama2.tar.xz.000"), result.stderr)
        self.assertFalse(os.path.exists(os.path.join(tmp, "sweeps")))

    def test_a_budget_that_is_not_a_number_prints_the_usage(self):
        tmp = self.create_tempdir().full_path
        for arg in ("--help", "9m"):
            result = run(tmp, budget=arg)
            self.assertEqual(result.returncode, 2)
            self.assertIn("Usage, on the", result.stderr)
            self.assertIn(f"<budget_s> is a whole number of seconds, not '{arg}'", result.stderr)
        self.assertEqual(os.listdir(tmp), [])

    def test_every_phase_command_parses_and_its_sweep_selects_runs(self):
        """All four phases with a python3 that records its arguments (nothing trains), then each
        sweep again with --dry_run (its --config, --only, --reuse_from) and train_throughput.py's
        arguments through its parser: a typo fails here, not in a GPU window."""
        tmp = self.create_tempdir().full_path
        os.makedirs(os.path.join(tmp, "corpus", "prose-llama2"))  # as joined (dry runs only)
        calls = os.path.join(tmp, "calls.jsonl")
        bin_dir = window_shims.install(tmp, calls)
        result = run(tmp, budget="5000", PHASES="ps t7 tp t2",
                     PATH=f"{bin_dir}:{os.environ['PATH']}")
        self.assertEqual(result.returncode, 0, result.stdout[-2000:] + result.stderr[-2000:])
        with open(calls) as f:
            argvs = [json.loads(line) for line in f]
        sweeps = [a[1:] for a in argvs if a[0] == "experiments/sweep.py"]
        self.assertLen(sweeps, 3)  # t7, ps, t2
        env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
        # (one process imports sweep.py's modules; each dry run is a fork of it, and so is the
        # parse of train_throughput.py's arguments below)
        dries = [binary_runs.run([sys.executable, os.path.join(ROOT, "experiments", "sweep.py"),
                                  *a, "--dry_run"], env=env) for a in sweeps]
        for argv, dry in zip(sweeps, dries):
            self.assertEqual(dry.returncode, 0, dry.stderr[-3000:])
            selected = re.search(r"(\d+) run\(s\) selected", dry.stdout)
            self.assertIsNotNone(selected, dry.stdout[-2000:])
            self.assertGreater(int(selected.group(1)), 0, argv)
        throughput = [a[1:] for a in argvs if a[0] == "benchmarks/train_throughput.py"]
        self.assertLen(throughput, 9)
        check = ("import json, sys\nfrom benchmarks import train_throughput as t\n"
                 "for argv in json.loads(sys.argv[1]):\n"
                 "    a = t._parse_args(argv)\n"
                 "    assert all(p in t.PRESETS for p in a.presets.split(',')), a.presets\n"
                 "print('OK')")
        path = os.path.join(self.create_tempdir().full_path, "check_throughput_args.py")
        with open(path, "w") as f:
            f.write(check)
        parsed = binary_runs.run([sys.executable, path, json.dumps(throughput)], env=env,
                                 timeout=300)
        self.assertEqual(parsed.stdout.strip(), "OK", parsed.stderr[-3000:])


if __name__ == "__main__":
    absltest.main()
