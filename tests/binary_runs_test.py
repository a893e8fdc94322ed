"""tests/binary_runs.py: a binary run in a fork of the driver behaves as its own launch (exit
status, stdout, stderr), and a hung one is killed at its timeout without ending the driver."""

import os
import subprocess
import sys
import textwrap

import pytest

from tests import binary_runs

_BINARY = textwrap.dedent("""
    import sys
    import time

    mode = sys.argv[1]
    print("out:" + ",".join(sys.argv[1:]))
    print("err line", file=sys.stderr)
    if mode == "status":
        sys.exit(int(sys.argv[2]))
    if mode == "message":
        sys.exit("error: --flag: one readable line")
    if mode == "raise":
        raise ValueError("boom")
    if mode == "hang":
        sys.stdout.flush()
        time.sleep(600)
""")


@pytest.fixture(name="binary")
def _binary(tmp_path):
    path = tmp_path / "fake_binary.py"
    path.write_text(_BINARY)
    return str(path)


def test_statuses_and_outputs_as_separate_launches(tmp_path, binary):
    runs_dir = tmp_path / "runs"
    runs_dir.mkdir()
    with binary_runs.Runner(str(runs_dir)) as runner:
        ok = runner.run(binary, "ok", "--x=1")
        assert (ok.returncode, ok.stdout, ok.stderr) == (0, "out:ok,--x=1\n", "err line\n")
        code = 3 + os.getpid() % 50
        assert runner.run(binary, "status", str(code)).returncode == code
        message = runner.run(binary, "message")
        assert message.returncode == 1
        assert message.stderr.endswith("error: --flag: one readable line\n")
        raised = runner.run(binary, "raise")
        assert raised.returncode == 1 and raised.stderr.rstrip().endswith("ValueError: boom")
        assert raised.args == [sys.executable, binary, "raise"]
    assert os.listdir(runs_dir) == ["driver.err"]  # each child's output files read and removed


def test_a_hung_binary_is_killed_at_its_timeout_and_the_driver_goes_on(tmp_path, binary):
    with binary_runs.Runner(str(tmp_path)) as runner:
        with pytest.raises(subprocess.TimeoutExpired) as caught:
            runner.run(binary, "hang", timeout=1.5)
        assert caught.value.timeout == 1.5 and caught.value.output == "out:hang\n"
        after = runner.run(binary, "status", "0")
        assert (after.returncode, after.stdout) == (0, "out:status,0\n")


def test_run_refuses_another_interpreter(binary):
    with pytest.raises(ValueError, match="not a command line of this Python"):
        binary_runs.run(["/usr/bin/python2", binary, "ok"])
