"""A failure on one process of a multi-process run ends every process at once."""

import io
import os
import socket
import subprocess
import sys

import pytest
from absl.testing import absltest, parameterized

from lattn_jax import multihost

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


class FakeClient:
    """The key-value part of ``jax.distributed``'s client."""

    def __init__(self, store=None):
        self.store = dict(store or {})

    def key_value_set(self, key, value):
        self.store[key] = value

    def key_value_dir_get(self, prefix):
        return [(k, v) for k, v in self.store.items() if k.startswith(prefix)]


class Exited(Exception):
    pass


class PublishTest(parameterized.TestCase):

    def setUp(self):
        super().setUp()
        self.client = FakeClient()
        self.me = 1
        self.enter_context(absltest.mock.patch.object(multihost, "_client",
                                                      lambda: self.client))
        self.enter_context(absltest.mock.patch.object(multihost.jax, "process_index",
                                                      lambda: self.me))
        self.enter_context(absltest.mock.patch.object(multihost.jax, "process_count",
                                                      lambda: 3))
        self.enter_context(absltest.mock.patch.object(multihost, "COORDINATOR_LINGER_S", 0))
        self.exits = []

        def exit_now(code):
            self.exits.append(code)
            raise Exited

        self.enter_context(absltest.mock.patch.object(multihost, "_exit_now", exit_now))

    @parameterized.named_parameters(
        ("error_line", SystemExit("error: the data file /x/y.bin is cut short"),
         "the data file /x/y.bin is cut short", 1),
        ("status", SystemExit(143), "exit status 143", 143),
        ("exception", RuntimeError("disk on fire\nsecond line"), "RuntimeError: disk on fire", 1),
        ("empty_message", ValueError(), "ValueError", 1),
        ("ctrl_c", KeyboardInterrupt(), "interrupted (Ctrl-C)", 130),
    )
    def test_a_failure_is_published_and_ends_the_process_with_its_status(self, e, line, status):
        with self.assertRaises(Exited):
            multihost.publish_failure_and_exit(e)
        self.assertEqual(self.client.store, {"lattn_jax/failed/1": line})
        self.assertEqual(self.exits, [status])

    @parameterized.parameters(SystemExit(0), SystemExit(None))
    def test_a_clean_exit_publishes_nothing(self, e):
        multihost.publish_failure_and_exit(e)
        self.assertEqual((self.client.store, self.exits), ({}, []))

    def test_a_coordinated_stop_publishes_nothing_and_keeps_its_status(self):
        # experiments/train.py after a preemption every process saved (status 143): published
        # as process 1's failure, it ended process 0 with status 1.
        multihost.publish_failure_and_exit(multihost.StopExit(143))
        self.assertEqual((self.client.store, self.exits), ({}, []))
        stopped = []
        self.enter_context(absltest.mock.patch.object(multihost, "stop_watching",
                                                      lambda: stopped.append(1)))
        wrapped = multihost.fail_fast(
            lambda argv: (_ for _ in ()).throw(multihost.StopExit(129)))
        with self.assertRaises(SystemExit) as raised:
            wrapped(["prog"])
        self.assertEqual((raised.exception.code, stopped, self.client.store), (129, [1], {}))

    def test_a_failure_after_another_process_failed_names_that_process(self):
        self.client.store["lattn_jax/failed/2"] = "RuntimeError: bad shard on host 2"
        err = self.enter_context(absltest.mock.patch.object(sys, "stderr", new=io.StringIO()))
        with self.assertRaises(Exited):
            multihost.publish_failure_and_exit(RuntimeError("Gloo all-reduce failed"))
        self.assertEqual(self.exits, [1])
        self.assertEqual(err.getvalue().strip(), (
            "error: process 2 of 3 failed: RuntimeError: bad shard on host 2; process 1 stops "
            "too (RuntimeError: Gloo all-reduce failed)"))
        self.assertNotIn("lattn_jax/failed/1", self.client.store)

    def test_single_process_runs_are_left_alone(self):
        self.enter_context(absltest.mock.patch.object(multihost, "_client", lambda: None))
        multihost.publish_failure_and_exit(RuntimeError("x"))
        self.assertEqual(self.exits, [])
        wrapped = multihost.fail_fast(lambda argv: (_ for _ in ()).throw(ValueError("y")))
        with self.assertRaisesRegex(ValueError, "y"):
            wrapped(["prog"])
        self.assertFalse(multihost.watch_peers())

    def test_the_watcher_ends_this_process_on_another_ones_failure_only(self):
        self.client.store["lattn_jax/failed/1"] = "its own failure"  # this process (me = 1)
        err = self.enter_context(absltest.mock.patch.object(sys, "stderr", new=io.StringIO()))
        multihost._stop.clear()
        calls = []

        def wait(timeout):
            calls.append(timeout)
            if len(calls) == 3:
                self.client.store["lattn_jax/failed/0"] = "OSError: no space left on device"
            return len(calls) > 5

        self.enter_context(absltest.mock.patch.object(multihost._stop, "wait", wait))
        with self.assertRaises(Exited):
            multihost._watch(self.client, 1, 3, 0.25)
        self.assertEqual((len(calls), self.exits), (3, [1]))
        self.assertEqual(calls[0], 0.25)
        self.assertEqual(err.getvalue().strip(), (
            "error: process 0 of 3 failed: OSError: no space left on device; process 1 stops too "
            "(nothing saved since the last checkpoint)"))


# Runs experiments/train.py as __main__ with Trainer.train_step raising at its sixth call.
FAIL_AT_STEP_6 = """
import runpy, sys
from lattn_jax import train
real, calls = train.Trainer.train_step, []
def step(self, *a, **k):
    calls.append(1)
    if len(calls) == 6:
        raise RuntimeError("injected failure at step 6")
    return real(self, *a, **k)
train.Trainer.train_step = step
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def free_port() -> int:
    """A TCP port free on localhost now (for a test's jax.distributed coordinator)."""
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


def one_device_cpu_env() -> dict:
    """The environment of one process of a two-process CPU test run (one device each)."""
    return dict(os.environ, JAX_PLATFORMS="cpu", JAX_DISABLE_MOST_OPTIMIZATIONS="true",
                XLA_FLAGS="--xla_force_host_platform_device_count=1")


@pytest.mark.slow  # two processes of one JAX distributed run (~10 s alone on 2 cores)
class TwoProcessTest(parameterized.TestCase):

    @parameterized.named_parameters(("worker_fails", 1), ("coordinator_fails", 0))
    def test_a_failure_on_one_process_ends_both_at_once(self, failing):
        # Before: the failing process waited in jax.distributed's shutdown barrier and the other
        # in the next step's all-reduce; both aborted with a C++ check failure after 311 s.
        workdir = os.path.join(self.create_tempdir().full_path, "run")
        port, env = free_port(), one_device_cpu_env()
        procs, logs = [], []
        for pid in range(2):
            args = [os.path.join(ROOT, "experiments", "train.py"),
                    "--config=" + os.path.join(ROOT, "configs", "default.py"),
                    "--workdir=" + workdir, f"--coordinator_address=localhost:{port}",
                    "--num_processes=2", f"--process_id={pid}",
                    "--config.model.layer_pattern=('attn',)", "--config.model.vocab_size=257",
                    "--config.data.tokenizer=byte", "--config.data.seq_len=32",
                    "--config.data.batch_size=2", "--config.data.max_val_batches=1",
                    "--config.train.total_steps=100000", "--config.train.checkpoint_every=50000",
                    "--config.train.eval_every=100000", "--config.train.log_every=1",
                    "--config.optim.warmup_steps=1"]
            cmd = [sys.executable, *(["-c", FAIL_AT_STEP_6] if pid == failing else []), *args]
            log = os.path.join(self.create_tempdir().full_path, "log")
            with open(log, "w") as out:
                procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                              cwd=ROOT, env=env))
            logs.append(log)
        try:
            for proc in procs:
                proc.wait(timeout=200)  # TimeoutExpired: they hang (311 s before)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
        texts = []
        for log in logs:
            with open(log) as f:
                texts.append(f.read())
        self.assertEqual([p.returncode for p in procs], [1, 1], texts[1 - failing][-3000:])
        self.assertIn("RuntimeError: injected failure at step 6", texts[failing])
        other = texts[1 - failing].strip().splitlines()
        # Its watcher saw the line first, or its all-reduce lost the peer first (named inside).
        self.assertStartsWith(other[-1], (
            f"error: process {failing} of 2 failed: RuntimeError: injected failure at step 6; "
            f"process {1 - failing} stops too ("))
        for text in texts:
            self.assertNotIn("Check failure", text)
            self.assertNotIn("Fatal Python error", text)


if __name__ == "__main__":
    absltest.main()
