"""Issue 32's trainer traps: Ctrl-C saves, short-run schedules warn, corrupted checkpoints fall
back, the run directory records each invocation, and a run directory does not depend on where
the clone lives."""

import os
import signal
import tempfile

from absl.testing import absltest

from configs import default as default_config
from lattn_jax import checkpoint as checkpoint_lib
from lattn_jax import config as config_lib
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


class ShortRunScheduleTest(absltest.TestCase):

    def test_warns_when_the_warm_up_leaves_no_room_for_decay(self):
        wsd = config_lib.OptimConfig(warmup_steps=20, schedule="wsd", decay_fraction=0.2)
        self.assertIsNone(train.schedule_warning(wsd, 200))
        text = train.schedule_warning(wsd, 20)
        self.assertRegex(text, r"optim.warmup_steps=20 .*train.total_steps=20.* never decays")
        self.assertRegex(train.schedule_warning(wsd, 22),
                         r"2 of the 4 decay steps")  # warm-up ends at 20, decay wanted from 18
        cosine = config_lib.OptimConfig(warmup_steps=20, schedule="cosine")
        self.assertIsNone(train.schedule_warning(cosine, 21))
        self.assertIsNotNone(train.schedule_warning(cosine, 20))

    def test_default_config_scales_the_warm_up_with_the_run(self):
        config = default_config.get_config()
        self.assertEqual((config.train.total_steps, config.optim.warmup_steps), (200, 20))
        config.train.total_steps = 20
        self.assertEqual(config.optim.warmup_steps, 2)
        exp = config_lib.experiment_from_config_dict(config)
        self.assertIsNone(train.schedule_warning(exp.optim, exp.train.total_steps))
        config.optim.warmup_steps = 5  # an explicit override still wins
        config.train.total_steps = 300
        self.assertEqual(config.optim.warmup_steps, 5)


if __name__ == "__main__":
    absltest.main()
