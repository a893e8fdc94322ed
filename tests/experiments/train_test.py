"""The absl binary: bad options end with one clear line naming the option or file."""

import os
import subprocess
import sys

import pytest
from absl.testing import absltest, parameterized

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def run_train(*flags):
    cmd = [sys.executable, os.path.join(ROOT, "experiments", "train.py"),
           "--config=" + os.path.join(ROOT, "configs", "default.py"), *flags]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)


@pytest.mark.entry
class TrainBinaryTest(parameterized.TestCase):

    @parameterized.named_parameters(
        ("missing_file", "--config.data.paths=('/no/such/file.txt',)",
         "error: data.paths: no such file or directory: /no/such/file.txt"),
        ("option_typo", "--config.train.total_step=20",
         "error: unknown config option 'train.total_step'. Did you mean \"total_steps\""),
    )
    def test_bad_option_gives_one_clear_line(self, flag, message):
        self.check_one_clear_line(flag, message)

    @pytest.mark.slow  # ~12 s per case on 2 cores (a subprocess each); two cases run in CI
    @parameterized.named_parameters(
        ("unknown_mixer", "--config.model.layer_pattern=('gdn','foo')",
         "error: model.layer_pattern[1]='foo' is not a known mixer"),
        ("width", "--config.model.d_model=130",
         "error: model.d_model=130 is not divisible by model.attention.num_heads=4"),
        ("chunk_size", "--config.model.gdn.chunk_size=48",
         "error: model.gdn.chunk_size must be a positive power of two, got 48"),
        # An explicitly named GPU kernel on this CPU machine: raised while tracing the step.
        ("gpu_kernel_on_cpu", "--config.model.gdn.implementation=pallas",
         "error: gated_delta_rule: implementation='pallas' cannot run this call"),
    )
    def test_more_bad_options_give_one_clear_line(self, flag, message):
        self.check_one_clear_line(flag, message)

    @pytest.mark.slow  # ~12 s on 2 cores (a subprocess)
    def test_binary_data_file_gives_one_clear_line(self):
        path = os.path.join(self.create_tempdir().full_path, "binary.txt")
        with open(path, "wb") as f:
            f.write(bytes(range(256)) * 64)
        self.check_one_clear_line(f"--config.data.paths=('{path}',)",
                                  f"error: data.paths: {path} looks binary")

    @parameterized.named_parameters(
        ("absent", "--step=5", "error: no checkpoint for step 5 in {}/checkpoints (steps: none)"),
        ("negative", "--step=-5", "error: flag --step=-5: -5 is not a non-negative integer"),
    )
    def test_bad_step_on_a_fresh_workdir_is_one_line_and_writes_nothing(self, flag, message):
        workdir = os.path.join(self.create_tempdir().full_path, "fresh")
        result = run_train("--workdir=" + workdir, flag)
        self.assertEqual(result.returncode, 1, result.stderr)
        # No orbax "cannot schedule new futures" traceback after it, no files left behind.
        self.assertEqual(result.stderr.strip().splitlines(), [message.format(workdir)])
        self.assertFalse(os.path.exists(workdir))

    def test_a_sweep_root_as_workdir_is_one_line_and_left_alone(self):
        # train.py trained into experiments/sweep.py's root (sweep.jsonl, runs/<name>/ ...).
        root = self.create_tempdir().full_path
        with open(os.path.join(root, "sweep.jsonl"), "w") as f:
            f.write('{"sweep": "tiny", "argv": ["sweep.py"]}\n')
        os.makedirs(os.path.join(root, "runs", "seed=0"))
        before = sorted(os.listdir(root))
        result = run_train("--workdir=" + root)
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertEqual(result.stderr.strip().splitlines(), [
            f"error: {root} is a sweep root (it has sweep.jsonl and runs/; experiments/sweep.py "
            f"writes it), not a training run's workdir: training would overwrite it. Use "
            f"another --workdir"])
        self.assertEqual(sorted(os.listdir(root)), before)
        self.assertEqual(os.listdir(os.path.join(root, "runs")), ["seed=0"])

    def test_config_file_without_get_config_is_one_line_naming_it(self):
        # Was "error: module 'config_config' has no attribute 'get_config'".
        workdir = os.path.join(self.create_tempdir().full_path, "fresh")
        path = os.path.join(ROOT, "configs", "common.py")
        cmd = [sys.executable, os.path.join(ROOT, "experiments", "train.py"),
               f"--config={path}", f"--workdir={workdir}"]
        result = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertEqual(result.stderr.strip().splitlines(), [
            f"error: --config={path}: {path} has no get_config() (a config file defines "
            f"get_config(), returning the experiment's ConfigDict)"])
        self.assertFalse(os.path.exists(workdir))

    def check_one_clear_line(self, flag, message):
        result = run_train("--workdir=" + self.create_tempdir().full_path, flag)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn(message, result.stderr)
        self.assertNotIn("Traceback", result.stderr)


if __name__ == "__main__":
    absltest.main()
