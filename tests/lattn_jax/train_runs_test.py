"""Issue 32's trainer traps: Ctrl-C saves, short-run schedules warn, corrupted checkpoints fall
back, the run directory records each invocation, and a run directory does not depend on where
the clone lives."""

import os
import signal
import tempfile

from absl.testing import absltest

from lattn_jax import checkpoint as checkpoint_lib
from lattn_jax import train
from tests.lattn_jax.train_test import tiny_experiment, write_corpus


class _TmpTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = self._tmp.name
        self.corpus = write_corpus(self.tmp)

    def tearDown(self):
        self._tmp.cleanup()
        super().tearDown()


class InterruptTest(_TmpTest):

    def test_sigint_saves_a_checkpoint_like_sigterm(self):
        workdir = os.path.join(self.tmp, "w")

        def sigint_at_2(line):
            if line.startswith("step     2  train_loss"):
                os.kill(os.getpid(), signal.SIGINT)

        lines = []
        handler = signal.getsignal(signal.SIGINT)
        out = train.train_and_evaluate(
            tiny_experiment(self.corpus, total_steps=6, log_every=1, checkpoint_every=5),
            workdir, print_fn=lambda s: (lines.append(s), sigint_at_2(s)))
        self.assertTrue(out["preempted"])
        self.assertEqual(out["step"], 2)
        self.assertTrue(any("SIGINT" in line for line in lines), lines)
        self.assertEqual(signal.getsignal(signal.SIGINT), handler)  # handler restored
        ckpt = checkpoint_lib.Checkpointer(workdir)
        self.assertEqual(ckpt.latest_step(), 2)
        ckpt.close()

    def test_a_second_sigint_exits_at_once(self):
        with train._PreemptionWatcher(True) as watcher:
            os.kill(os.getpid(), signal.SIGINT)
            self.assertTrue(watcher.requested)
            with self.assertRaises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)


if __name__ == "__main__":
    absltest.main()
