"""The evaluate / generate binaries: bad input ends with one clear line naming it."""

import os
import subprocess
import sys

import pytest
from absl.testing import absltest, parameterized

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def run(binary, *flags):
    cmd = [sys.executable, os.path.join(ROOT, "experiments", binary), *flags]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)


@pytest.mark.entry
class EvaluateBinaryTest(parameterized.TestCase):

    @parameterized.named_parameters(
        ("unknown_task", "evaluate.py", ["--checkpoint=/tmp", "--tasks=piqa,hellaswg"],
         "error: unknown task 'hellaswg'"),
        ("missing_checkpoint", "evaluate.py", ["--checkpoint=/no/such/run", "--tasks=piqa"],
         "error: no config.json in checkpoint directory /no/such/run"),
        ("generate_missing_checkpoint", "generate.py",
         ["--checkpoint=/no/such/run", "--prompt=hi"],
         "error: no config.json in checkpoint directory /no/such/run"),
        ("bad_top_p", "generate.py", ["--checkpoint=/no/such/run", "--prompt=hi", "--top_p=2"],
         "error: top_p must be in (0, 1]"),
        ("bad_stop_token", "generate.py",
         ["--checkpoint=/no/such/run", "--prompt=hi", "--stop_token=abc"],
         "error: --stop_token=abc: token ids are integers"),
    )
    def test_bad_input_gives_one_clear_line(self, binary, flags, message):
        result = run(binary, *flags)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn(message, result.stderr)
        self.assertNotIn("Traceback", result.stderr)


class EvaluateFlagsTest(absltest.TestCase):

    def test_perplexity_is_batched_memory_safely_by_default(self):
        # Issue 32, trap 6: batch 16 of 2048-token windows took 8.7 GB on a CPU.
        result = run("evaluate.py", "--helpfull")
        self.assertIn("--perplexity_batch_size", result.stdout)
        flag = result.stdout.split("--perplexity_batch_size")[1].split("--")[0]
        self.assertIn("(default: '2')", " ".join(flag.split()))


if __name__ == "__main__":
    absltest.main()
