"""Issue 32's trainer traps: Ctrl-C saves, short-run schedules warn, corrupted checkpoints fall
back, the run directory records each invocation, and a run directory does not depend on where
the clone lives."""

import dataclasses
import glob
import io
import json
import os
import re
import shlex
import shutil
import signal
import sys
import tempfile
import time
from unittest import mock

import numpy as np
import pytest
import tqdm
from absl.testing import absltest

from configs import default as default_config
from lattn_jax import assets
from lattn_jax import checkpoint as checkpoint_lib
from lattn_jax import config as config_lib
from lattn_jax import data as data_lib
from lattn_jax import optim
from lattn_jax import train
from lattn_jax.eval import restore
from tests.lattn_jax.train_test import CorpusTestCase, tiny_experiment


class InterruptTest(CorpusTestCase):

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

    def test_output_closed_by_its_reader_neither_stops_the_run_nor_loses_the_ctrl_c_save(self):
        # `train.py ... | tee log` and a Ctrl-C that ends tee too: every write to the process's
        # output then raises BrokenPipeError. Here stdout and stderr are a pipe whose read end
        # is closed; the progress lines go through tqdm.write (the default print_fn) and the
        # bar writes to stderr. Before the guard the run stopped at its first line, unsaved.
        read_end, write_end = os.pipe()
        os.close(read_end)
        stream = os.fdopen(write_end, "w", buffering=1)
        self.addCleanup(stream.close)
        with self.assertRaises(BrokenPipeError):  # the stream is broken indeed
            stream.write("x\n")
        workdir = os.path.join(self.tmp, "w")

        def print_fn(line):
            tqdm.tqdm.write(line)  # sys.stdout looked up now: the guard
            if line.startswith("step     2  train_loss"):
                os.kill(os.getpid(), signal.SIGINT)

        with mock.patch.object(sys, "stdout", stream), mock.patch.object(sys, "stderr", stream):
            out = train.train_and_evaluate(
                tiny_experiment(self.corpus, total_steps=6, log_every=1, checkpoint_every=5),
                workdir, print_fn=print_fn)
            self.assertIs(sys.stdout, stream)  # restored after the run
        self.assertTrue(out["preempted"])
        self.assertEqual(out["step"], 2)
        ckpt = checkpoint_lib.Checkpointer(workdir)
        self.assertEqual(ckpt.latest_step(), 2)
        ckpt.close()
        with open(os.path.join(workdir, train.CONSOLE_LOG)) as f:
            log = f.read()
        self.assertIn("note: standard output closed by its reader", log)
        self.assertIn("step     2  train_loss", log)
        self.assertIn("SIGINT", log)
        stream.write("after\n")  # its descriptor now points at /dev/null: no error, no output

    def test_a_second_sigint_exits_at_once(self):
        # Whatever handler was there before (SIG_IGN here), the second Ctrl-C interrupts.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        self.addCleanup(signal.signal, signal.SIGINT, previous)
        with train.PreemptionWatcher(True) as watcher:
            os.kill(os.getpid(), signal.SIGINT)
            self.assertTrue(watcher.requested)
            with self.assertRaises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
        self.assertEqual(signal.getsignal(signal.SIGINT), signal.SIG_IGN)  # restored on exit

    def test_multi_process_leaves_sigterm_to_the_preemption_service(self):
        # A Python SIGTERM handler replaced JAX's preemption notifier, so the processes of a
        # multi-process run did not agree on the step to stop at (and hung). The first Ctrl-C
        # is passed on as a SIGTERM (the service's), and no local flag stops the loop.
        forwarded = []
        previous = signal.signal(signal.SIGTERM, lambda s, f: forwarded.append(s))
        self.addCleanup(signal.signal, signal.SIGTERM, previous)
        notifier = signal.getsignal(signal.SIGTERM)
        with mock.patch.object(train.jax, "process_count", return_value=2), \
                mock.patch.object(train, "preemption_service_active", return_value=True):
            watcher = train.PreemptionWatcher(True)
        self.assertTrue(watcher.multi_process)
        with watcher, mock.patch.object(sys, "stderr", io.StringIO()):
            self.assertIs(signal.getsignal(signal.SIGTERM), notifier)  # left alone
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            self.assertEqual(forwarded, [signal.SIGTERM])
            self.assertFalse(watcher.requested)
            self.assertEqual(watcher.signal_name, "SIGINT")
            with watcher.defer_signals("the checkpoint at step 2"):
                self.assertIs(signal.getsignal(signal.SIGTERM), notifier)
        self.assertIs(signal.getsignal(signal.SIGTERM), notifier)
        # A SIGHUP (an ssh disconnect of one host) is passed on too, not left to its default
        # handler (which ended that process alone, the others hanging); once, as for Ctrl-C.
        forwarded.clear()
        hangup = signal.signal(signal.SIGHUP, _kill)  # stands in for the default handler
        self.addCleanup(signal.signal, signal.SIGHUP, hangup)
        with mock.patch.object(train.jax, "process_count", return_value=2), \
                mock.patch.object(train, "preemption_service_active", return_value=True):
            watcher = train.PreemptionWatcher(True)
        with watcher:
            for _ in range(2):
                os.kill(os.getpid(), signal.SIGHUP)
                time.sleep(0.05)
            self.assertEqual(forwarded, [signal.SIGTERM])
            self.assertEqual((watcher.requested, watcher.signal_name), (False, "SIGHUP"))
            with watcher.defer_signals("the checkpoint at step 2"):
                self.assertIs(signal.getsignal(signal.SIGTERM), notifier)
        self.assertEqual(signal.getsignal(signal.SIGHUP), _kill)
        # Outside the watcher, a SIGHUP during a write is held back (SIGTERM still is not).
        with self.assertRaises(train.Terminated) as raised:
            with watcher.defer_signals("the checkpoint at step 3"):
                self.assertIs(signal.getsignal(signal.SIGTERM), notifier)
                with mock.patch.object(sys, "stderr", io.StringIO()):
                    os.kill(os.getpid(), signal.SIGHUP)
                    time.sleep(0.05)
        self.assertEqual(raised.exception.exit_status, 129)
        with mock.patch.object(train.jax, "process_count", return_value=1):
            self.assertFalse(train.PreemptionWatcher(True).multi_process)

    def test_a_second_sigint_during_the_save_waits_for_the_checkpoint(self):
        # It raised KeyboardInterrupt inside orbax's save: step 2's checkpoint was never
        # written (orbax logged its own tracebacks), and the binary said "nothing saved".
        workdir = os.path.join(self.tmp, "w")
        real_save = checkpoint_lib.Checkpointer.save

        def sigint_at_2(line):
            if line.startswith("step     2  train_loss"):
                os.kill(os.getpid(), signal.SIGINT)  # the first Ctrl-C: stop after step 2

        def save_with_sigint(ckpt, step, *args, **kwargs):
            os.kill(os.getpid(), signal.SIGINT)  # the second Ctrl-C, while step 2 is saved
            time.sleep(0.05)
            return real_save(ckpt, step, *args, **kwargs)

        handler = signal.getsignal(signal.SIGINT)
        cfg = tiny_experiment(self.corpus, total_steps=6, log_every=1, checkpoint_every=5)
        with mock.patch.object(checkpoint_lib.Checkpointer, "save", save_with_sigint):
            # Python's sys.stderr (the notices, absl logging) and file descriptor 2 (threads).
            with _stderr_fd() as stderr, mock.patch.object(sys, "stderr", io.StringIO()) as err:
                with self.assertRaises(KeyboardInterrupt) as raised:
                    train.train_and_evaluate(cfg, workdir, print_fn=sigint_at_2)
        path = os.path.join(os.path.abspath(workdir), "checkpoints")
        self.assertEqual(str(raised.exception), (
            f"the checkpoint at step 2 ({path}/2) is complete; stopped there on Ctrl-C: run the "
            f"same command again to resume from it"))
        self.assertIn(f"Ctrl-C while the checkpoint at step 2 ({path}/2) is being written: "
                      f"stopping once it is complete", err.getvalue())
        self.assertNotIn("Traceback", err.getvalue() + stderr.text())
        self.assertEqual(signal.getsignal(signal.SIGINT), handler)  # handler restored
        self.assertEqual(os.listdir(path), ["2"])  # complete, no temporary directory
        result = train.train_and_evaluate(cfg, workdir, print_fn=lambda s: None)
        self.assertEqual((result["resumed_from"], result["step"]), (2, 6))

    def test_a_first_sigint_during_a_periodic_save_stops_after_it(self):
        workdir = os.path.join(self.tmp, "w")
        real_save = checkpoint_lib.Checkpointer.save

        def save_with_sigint(ckpt, step, *args, **kwargs):
            if step == 2:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)
            return real_save(ckpt, step, *args, **kwargs)

        cfg = tiny_experiment(self.corpus, total_steps=6, log_every=1, checkpoint_every=2)
        with mock.patch.object(checkpoint_lib.Checkpointer, "save", save_with_sigint):
            out = train.train_and_evaluate(cfg, workdir, print_fn=lambda s: None)
        self.assertTrue(out["preempted"])
        self.assertEqual(out["step"], 2)
        self.assertEqual(os.listdir(os.path.join(workdir, "checkpoints")), ["2"])

    def _sigterm_in_save(self, at_step, signum=signal.SIGTERM, **overrides):
        """Runs a tiny config whose save at ``at_step`` gets a SIGTERM (or ``signum``), under a
        handler of it that raises ``_Killed`` (standing in for the default one, which ends the
        process)."""
        workdir = os.path.join(self.tmp, "w")
        real_save = checkpoint_lib.Checkpointer.save
        name = signal.Signals(signum).name

        def save_with_sigterm(ckpt, step, *args, **kwargs):
            if step == at_step:
                os.kill(os.getpid(), signum)
                time.sleep(0.05)
            return real_save(ckpt, step, *args, **kwargs)

        def killed(signum, frame):
            raise _Killed()

        previous = signal.signal(signum, killed)
        self.addCleanup(signal.signal, signum, previous)
        cfg = tiny_experiment(self.corpus, log_every=1, **overrides)
        with mock.patch.object(checkpoint_lib.Checkpointer, "save", save_with_sigterm):
            with mock.patch.object(sys, "stderr", io.StringIO()) as err:
                with self.assertRaises(train.Terminated) as raised:
                    train.train_and_evaluate(cfg, workdir, print_fn=lambda s: None)
        self.assertEqual(signal.getsignal(signum), killed)  # handler restored
        path = os.path.join(os.path.abspath(workdir), "checkpoints")
        self.assertEqual(str(raised.exception), (
            f"the checkpoint at step {at_step} ({path}/{at_step}) is complete; stopped there on "
            f"{name}: run the same command again to resume from it"))
        self.assertEqual((raised.exception.signum, raised.exception.signal_name,
                          raised.exception.exit_status), (signum, name, 128 + signum))
        self.assertIn(f"{name} while the checkpoint at step {at_step} ({path}/{at_step}) is "
                      f"being written: stopping once it is complete", err.getvalue())
        return workdir, cfg

    def test_a_sigterm_during_the_stop_path_save_waits_for_the_checkpoint(self):
        # The stop path (max_steps_per_run, or after a first signal) saved after the watcher
        # had restored the default SIGTERM handler: a SIGTERM then (a cluster's preemption)
        # killed the process mid-write, and the run resumed from the checkpoint before.
        workdir, cfg = self._sigterm_in_save(2, total_steps=4, checkpoint_every=5,
                                             max_steps_per_run=2)
        self.assertEqual(os.listdir(os.path.join(workdir, "checkpoints")), ["2"])
        result = train.train_and_evaluate(cfg, workdir, print_fn=lambda s: None)
        self.assertEqual((result["resumed_from"], result["step"]), (2, 4))

    def test_a_sighup_during_the_stop_path_save_waits_for_the_checkpoint(self):
        # An ssh disconnect (SIGHUP, whose default handler ends the process) killed the run
        # mid-write like a SIGTERM did; it is held back the same way (exit status 129).
        workdir, cfg = self._sigterm_in_save(2, signal.SIGHUP, total_steps=4,
                                             checkpoint_every=5, max_steps_per_run=2)
        self.assertEqual(os.listdir(os.path.join(workdir, "checkpoints")), ["2"])
        result = train.train_and_evaluate(cfg, workdir, print_fn=lambda s: None)
        self.assertEqual((result["resumed_from"], result["step"]), (2, 4))

    def test_a_sighup_in_the_loop_saves_and_stops_like_sigterm(self):
        workdir = os.path.join(self.tmp, "w")
        at = int(np.random.default_rng().integers(1, 5))

        def sighup_at(line):
            lines.append(line)
            if line.startswith(f"step {at:5d}  train_loss"):
                os.kill(os.getpid(), signal.SIGHUP)

        def killed(signum, frame):
            raise _Killed()

        previous = signal.signal(signal.SIGHUP, killed)  # stands in for the default handler
        self.addCleanup(signal.signal, signal.SIGHUP, previous)
        lines = []
        out = train.train_and_evaluate(
            tiny_experiment(self.corpus, total_steps=6, log_every=1, checkpoint_every=5),
            workdir, print_fn=sighup_at)
        self.assertEqual((out["preempted"], out["step"]), (True, at))
        self.assertIn(f"Stopping at step {at} of 6 (SIGHUP (the terminal or ssh session "
                      f"closed)); checkpoint saved, run again to resume.", lines)
        self.assertEqual(signal.getsignal(signal.SIGHUP), killed)  # restored
        self.assertIn(str(at), os.listdir(os.path.join(workdir, "checkpoints")))

    def test_an_ignored_sighup_stays_ignored(self):
        # nohup: the run was started to outlive its terminal; a hang-up must not stop it.
        previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
        self.addCleanup(signal.signal, signal.SIGHUP, previous)
        with train.PreemptionWatcher(True, multi_process=False) as watcher:
            self.assertEqual(signal.getsignal(signal.SIGHUP), signal.SIG_IGN)
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(0.05)
            self.assertFalse(watcher.requested)
            with watcher.defer_signals("the checkpoint at step 1"):
                self.assertEqual(signal.getsignal(signal.SIGHUP), signal.SIG_IGN)
                os.kill(os.getpid(), signal.SIGHUP)
                time.sleep(0.05)
        self.assertIsNone(watcher.signal_name)
        with train._stop_on_signals():
            self.assertEqual(signal.getsignal(signal.SIGHUP), signal.SIG_IGN)

    def test_a_deferred_sighup_with_its_terminal_gone_still_completes_the_write(self):
        # After a hang-up, writing to the terminal fails (EIO): the handler's notice must not
        # raise into the checkpoint write it interrupted.
        class Gone(io.StringIO):
            def write(self, text):
                raise OSError(5, "Input/output error")

        previous = signal.signal(signal.SIGHUP, _kill)  # stands in for the default handler
        self.addCleanup(signal.signal, signal.SIGHUP, previous)
        watcher = train.PreemptionWatcher(True, multi_process=False)
        written = []
        with mock.patch.object(sys, "stderr", Gone()):
            with self.assertRaises(train.Terminated) as raised:
                with watcher.defer_signals("the checkpoint at step 3"):
                    os.kill(os.getpid(), signal.SIGHUP)
                    time.sleep(0.05)
                    os.kill(os.getpid(), signal.SIGTERM)  # the first one names the stop
                    time.sleep(0.05)
                    written.append(3)
        self.assertEqual(written, [3])
        self.assertEqual((raised.exception.signal_name, raised.exception.exit_status),
                         ("SIGHUP", 129))
        self.assertEqual(signal.getsignal(signal.SIGHUP), _kill)

    def test_a_signal_during_a_periodic_evaluation_ends_it_and_saves_at_once(self):
        # The periodic evaluation ran to its end before the loop saw the stop request: minutes
        # on a large validation set, longer than a preemption's grace period.
        signum = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)[
            np.random.default_rng().integers(3)]
        name = signal.Signals(signum).name
        workdir = os.path.join(self.tmp, "w")
        real_step, calls = train.Trainer.eval_step, []

        def eval_step(trainer, params, batch):
            calls.append(1)
            if len(calls) == 6:  # the second of four batches of the evaluation at step 4
                os.kill(os.getpid(), signum)
            return real_step(trainer, params, batch)

        lines = []
        cfg = tiny_experiment(self.corpus, total_steps=8, log_every=1, checkpoint_every=8,
                              eval_every=2)
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, max_val_batches=4))
        with mock.patch.object(train.Trainer, "eval_step", eval_step):
            out = train.train_and_evaluate(cfg, workdir, print_fn=lines.append)
        self.assertEqual((out["preempted"], out["step"]), (True, 4), lines)
        self.assertIn(f"the evaluation at step 4 stopped after 2 of 4 validation batches "
                      f"({name}); not recorded", lines)
        self.assertLen(calls, 4 + 2)  # step 2's four batches, then two of step 4's
        records = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
        self.assertEqual([r["step"] for r in records if "val_loss" in r], [2])
        self.assertEqual(os.listdir(os.path.join(workdir, "checkpoints")), ["4"])
        # Resumed, the run evaluates step 4 first (the curve had a hole there), once.
        lines, calls = [], []

        def count_eval_step(trainer, params, batch):
            calls.append(1)
            return real_step(trainer, params, batch)

        with mock.patch.object(train.Trainer, "eval_step", count_eval_step):
            out = train.train_and_evaluate(cfg, workdir, print_fn=lines.append)
        self.assertEqual(out["step"], 8)
        missed = [x for x in lines if "the evaluation the stopped run did not finish" in x]
        self.assertLen(missed, 1, lines)
        self.assertTrue(missed[0].startswith("step     4  val_loss "), missed)
        self.assertLess(lines.index(missed[0]), min(
            i for i, x in enumerate(lines) if x.startswith("step     5  train_loss")))
        self.assertLen(calls, 3 * 4)  # steps 4, 6 and 8, four batches each
        records = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
        vals = {r["step"]: r["val_loss"] for r in records if "val_loss" in r}
        self.assertEqual(sorted(vals), [2, 4, 6, 8])
        self.assertTrue(np.isfinite(vals[4]) and vals[4] > 0, vals)

    def test_a_resume_after_a_recorded_evaluation_does_not_evaluate_again(self):
        workdir = os.path.join(self.tmp, "w")
        cfg = tiny_experiment(self.corpus, total_steps=6, log_every=1, checkpoint_every=2,
                              eval_every=2)
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, max_val_batches=2),
                                  train=dataclasses.replace(cfg.train, max_steps_per_run=4))
        train.train_and_evaluate(cfg, workdir, print_fn=lambda _: None)
        lines = []
        out = train.train_and_evaluate(cfg, workdir, print_fn=lines.append)
        self.assertEqual(out["step"], 6)
        self.assertFalse([x for x in lines if "did not finish" in x], lines)
        records = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
        self.assertEqual([r["step"] for r in records if "val_loss" in r], [2, 4, 6])

    def test_should_stop_ends_an_evaluation_pass_between_batches(self):
        cfg = tiny_experiment(self.corpus)
        trainer = train.Trainer(cfg)
        stops = iter([False, False, True])
        seen = []
        fake = mock.Mock(side_effect=lambda params, batch: (seen.append(batch),
                                                            (1.0, 2.0, 0, 0))[1])
        with mock.patch.object(trainer, "eval_step", fake):
            with self.assertRaises(train.EvaluationStopped) as raised:
                trainer.evaluate_counts(None, ["a", "b", "c", "d"],
                                        should_stop=lambda: next(stops))
            self.assertEqual((raised.exception.batches_done, seen), (2, ["a", "b"]))
            got = trainer.evaluate_counts(None, ["a", "b"], should_stop=lambda: False)
        self.assertEqual((got.loss, got.tokens), (0.5, 4.0))

    def test_a_sigterm_during_the_final_save_waits_for_the_checkpoint(self):
        workdir, _ = self._sigterm_in_save(2, total_steps=2, checkpoint_every=5, eval_every=5)
        self.assertEqual(os.listdir(os.path.join(workdir, "checkpoints")), ["2"])

    def test_a_sigterm_during_the_final_evaluation_saves_the_trained_state(self):
        # The watcher had restored the default handler: the process ended in the final
        # evaluation with the steps since the last checkpoint unsaved.
        workdir = os.path.join(self.tmp, "w")
        real_eval = train.Trainer.evaluate_counts

        def eval_with_sigterm(trainer, params, batches, should_stop=None):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            return real_eval(trainer, params, batches, should_stop)

        def killed(signum, frame):
            raise _Killed()

        previous = signal.signal(signal.SIGTERM, killed)
        self.addCleanup(signal.signal, signal.SIGTERM, previous)
        cfg = tiny_experiment(self.corpus, total_steps=3, log_every=1, checkpoint_every=2,
                              eval_every=5)
        with mock.patch.object(train.Trainer, "evaluate_counts", eval_with_sigterm):
            with self.assertRaises(train.Terminated) as raised:
                train.train_and_evaluate(cfg, workdir, print_fn=lambda s: None)
        self.assertEqual(signal.getsignal(signal.SIGTERM), killed)  # handler restored
        path = os.path.join(os.path.abspath(workdir), "checkpoints")
        self.assertEqual(str(raised.exception), (
            f"the checkpoint at step 3 ({path}/3) is complete; stopped there on SIGTERM, in the "
            f"final evaluation: run the same command again to evaluate it"))
        self.assertCountEqual(os.listdir(path), ["2", "3"])
        lines = []
        result = train.train_and_evaluate(cfg, workdir, print_fn=lines.append)
        self.assertEqual((result["resumed_from"], result["step"]), (3, 3))
        self.assertTrue(any(line.startswith("Training was already complete at step 3")
                            for line in lines), lines)
        # Evaluated and recorded now: the same call again does nothing (it appended a second
        # val_loss record at step 3).
        lines.clear()
        again = train.train_and_evaluate(cfg, workdir, print_fn=lines.append)
        self.assertEqual((again["already_finished"], again["val_loss"]),
                         (True, result["val_loss"]))
        self.assertTrue(lines[-1].startswith("run already finished at step 3 "), lines)
        self.assertFalse([line for line in lines if line.startswith("final:")], lines)
        with open(os.path.join(workdir, "metrics.jsonl")) as f:
            val_steps = [json.loads(line)["step"] for line in f if "val_loss" in line]
        self.assertEqual(val_steps, [3])
        # Called with a lower total (the run is past it): also finished, nothing recorded (it
        # evaluated the restored model again and appended a second final record).
        lower = tiny_experiment(self.corpus, total_steps=2, log_every=1, checkpoint_every=2,
                                eval_every=5)
        lines.clear()
        again = train.train_and_evaluate(lower, workdir, print_fn=lines.append)
        self.assertEqual((again["already_finished"], again["step"], again["val_loss"]),
                         (True, 3, result["val_loss"]))
        self.assertTrue(lines[-1].startswith("run already finished at step 3 "), lines)
        with open(os.path.join(workdir, "metrics.jsonl")) as f:
            val_steps = [json.loads(line)["step"] for line in f if "val_loss" in line]
        self.assertEqual(val_steps, [3])

    def test_a_sigterm_in_the_last_step_saves_before_the_final_evaluation(self):
        workdir = os.path.join(self.tmp, "w")
        evaluated = []

        def sigterm_at_3(line):
            if line.startswith("step     3  train_loss"):
                os.kill(os.getpid(), signal.SIGTERM)

        cfg = tiny_experiment(self.corpus, total_steps=3, log_every=1, checkpoint_every=2,
                              eval_every=5)
        with mock.patch.object(train.Trainer, "evaluate_counts",
                               side_effect=lambda *a, **k: evaluated.append(1)):
            with self.assertRaises(train.Terminated) as raised:
                train.train_and_evaluate(cfg, workdir, print_fn=sigterm_at_3)
        path = os.path.join(os.path.abspath(workdir), "checkpoints")
        self.assertEqual(str(raised.exception), (
            f"the checkpoint at step 3 ({path}/3) is complete; stopped there on SIGTERM, before "
            f"the final evaluation: run the same command again to evaluate it"))
        self.assertEqual(evaluated, [])
        self.assertCountEqual(os.listdir(path), ["2", "3"])


class PreemptionServicePinTest(absltest.TestCase):
    """train.preemption_service_active reads a private jax attribute (the public API does not
    say whether the service runs); a rename would make it ``False`` for ever, silently bringing
    back the per-process stop flag that hung multi-process runs."""

    def test_the_installed_jax_has_the_attribute_it_reads(self):
        from jax._src import distributed  # noqa: PLC0415 - the private module it reads
        state = distributed.global_state
        self.assertTrue(
            hasattr(state, "preemption_sync_manager"),
            f"jax {train.jax.__version__}: jax._src.distributed.global_state has no "
            f"preemption_sync_manager any more; update train.preemption_service_active")
        self.assertIsNone(state.preemption_sync_manager)  # no jax.distributed here
        self.assertFalse(train.preemption_service_active())
        # ...and that attribute is what it reads: set, the service counts as running.
        with mock.patch.object(state, "preemption_sync_manager", object()):
            self.assertTrue(train.preemption_service_active())
        self.assertFalse(train.preemption_service_active())


class _Killed(BaseException):
    """What a test's SIGTERM handler raises in place of the process ending."""


def _kill(signum, frame):
    """A stand-in for a signal's default handler (which ends the process): raises _Killed."""
    del signum, frame
    raise _Killed()


class ShortRunScheduleTest(absltest.TestCase):

    def test_warns_when_the_warm_up_leaves_no_room_for_decay(self):
        wsd = config_lib.OptimConfig(warmup_steps=20, schedule="wsd", decay_fraction=0.2)
        self.assertIsNone(train.schedule_warning(wsd, 200))
        text = train.schedule_warning(wsd, 20)
        self.assertRegex(text, r"optim.warmup_steps=20 .*train.total_steps=20.* never decays")
        # What the schedule does (it said "the run ends at the peak"): the warm-up clamped to
        # the run, the last step's LR below the peak.
        self.assertIn("rises linearly over the whole run, to 0.000285 at the last step (the "
                      "peak, 0.0003, is never reached)", text)
        self.assertNotIn("clamped", text)
        sched = optim.learning_rate_schedule(wsd, 20)
        self.assertAlmostEqual(float(sched(19)), 0.000285, places=9)
        text = train.schedule_warning(dataclasses.replace(wsd, warmup_steps=50), 20)
        self.assertIn("optim.warmup_steps=50 >= train.total_steps=20: the warm-up is clamped to "
                      "the run's 20 steps, so the learning rate rises linearly over the whole "
                      "run, to 0.000285 at the last step", text)
        self.assertAlmostEqual(float(optim.learning_rate_schedule(
            dataclasses.replace(wsd, warmup_steps=50), 20)(19)), 0.000285, places=9)
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


class _stderr_fd:
    """Captures what is written to file descriptor 2 (also from threads and C code)."""

    def __enter__(self):
        sys.stderr.flush()
        self._file = tempfile.TemporaryFile()
        self._saved = os.dup(2)
        os.dup2(self._file.fileno(), 2)
        return self

    def __exit__(self, *exc):
        sys.stderr.flush()
        os.dup2(self._saved, 2)
        os.close(self._saved)
        return False

    def text(self):
        self._file.seek(0)
        return self._file.read().decode(errors="replace")


def _truncate_arrays(step_dir):
    for path in glob.glob(os.path.join(step_dir, "state", "ocdbt.process_0", "d", "*")):
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 2)


CORRUPTIONS = {
    "truncated array file": _truncate_arrays,
    "missing _METADATA": lambda d: os.remove(os.path.join(d, "state", "_METADATA")),
    "missing data-iterator file": lambda d: os.remove(
        os.path.join(d, "data_iter", "process_0-of-1.json")),
}


class CorruptCheckpointTest(CorpusTestCase):

    def _save_two(self, workdir, cfg):
        """Checkpoints at steps 1 and 2 of ``cfg``'s state and data iterator; returns the
        trainer and the iterator's next batch after step 1's save."""
        trainer = train.Trainer(cfg)
        ds = data_lib.build_datasets(cfg.data)
        state = trainer.init_state(0)
        ckpt = checkpoint_lib.Checkpointer(workdir, async_save=False)
        next(ds.train_iter)
        ckpt.save(1, state, ds.train_iter)
        expected = next(ds.train_iter)
        ckpt.save(2, state, ds.train_iter)
        ckpt.close()
        return trainer, expected

    def test_each_corruption_gives_one_line_and_the_previous_step(self):
        cfg = tiny_experiment(self.corpus)
        base = os.path.join(self.tmp, "base")
        trainer, expected = self._save_two(base, cfg)
        for name, corrupt in CORRUPTIONS.items():
            with self.subTest(name):
                workdir = os.path.join(self.tmp, name.replace(" ", "_"))
                shutil.copytree(base, workdir)
                corrupt(os.path.join(workdir, "checkpoints", "2"))
                lines = []
                ckpt = checkpoint_lib.Checkpointer(workdir, async_save=False)
                it = data_lib.build_datasets(cfg.data).train_iter
                with _stderr_fd() as stderr:
                    step, state = ckpt.restore_latest(trainer.abstract_state(), it,
                                                      report=lines.append)
                ckpt.close()
                self.assertEqual(stderr.text(), "")  # no orbax/asyncio tracebacks
                self.assertEqual(step, 1)
                self.assertEqual(len(lines), 1, lines)
                self.assertRegex(lines[0], r"^checkpoint at step 2 .* is unreadable \(.+\); "
                                           r"falling back to step 1$")
                self.assertNotIn("\n", lines[0])
                np.testing.assert_array_equal(next(it)["inputs"], expected["inputs"])
                self.assertTrue(os.path.isdir(os.path.join(workdir, "checkpoints", "2")))

    @pytest.mark.slow  # ~30 s on 2 cores; each corruption's one-line error runs in CI
    def test_training_resumes_from_the_previous_step_and_sets_the_bad_one_aside(self):
        workdir = os.path.join(self.tmp, "w")
        train.train_and_evaluate(tiny_experiment(self.corpus, total_steps=4, checkpoint_every=2,
                                                 keep_checkpoints=3), workdir,
                                 print_fn=lambda s: None)
        _truncate_arrays(os.path.join(workdir, "checkpoints", "4"))
        lines = []
        out = train.train_and_evaluate(tiny_experiment(self.corpus, total_steps=4,
                                                       checkpoint_every=2, keep_checkpoints=3),
                                       workdir, print_fn=lines.append)
        self.assertEqual(out["resumed_from"], 2)
        self.assertEqual(out["step"], 4)
        bad = [line for line in lines if "step 4" in line and "unreadable" in line]
        self.assertEqual(len(bad), 1, lines)
        self.assertRegex(bad[0], r"OUT_OF_RANGE.*\), set aside as 4\.unreadable-.*; falling back "
                                 r"to step 2$")
        dropped = [line for line in lines if line.startswith("metrics.jsonl: dropped")]
        self.assertLen(dropped, 1, lines)
        self.assertIn("records after step 2 (logged by the run whose newer checkpoint was "
                      "unreadable and set aside; those steps run again", dropped[0])
        names = os.listdir(os.path.join(workdir, "checkpoints"))
        self.assertIn("4", names)  # saved again by this run
        self.assertTrue([n for n in names if n.startswith("4.unreadable")], names)  # kept

        # --step: resume from an older step; the newer one is kept under another name.
        lines.clear()
        out = train.train_and_evaluate(tiny_experiment(self.corpus, total_steps=4,
                                                       checkpoint_every=2, keep_checkpoints=3),
                                       workdir, print_fn=lines.append, step=2)
        self.assertEqual((out["resumed_from"], out["step"]), (2, 4))
        names = os.listdir(os.path.join(workdir, "checkpoints"))
        self.assertTrue([n for n in names if n.startswith("4.after-step-2")], names)
        # The later records were logged by the run that went on past step 2, not by a stopped
        # run: the reason given is the --step the user chose.
        dropped = [line for line in lines if line.startswith("metrics.jsonl: dropped")]
        self.assertLen(dropped, 1, lines)
        self.assertIn("records after step 2 (logged by the run that went on past step 2; "
                      "--step 2 resumes from there, so those steps run again", dropped[0])
        self.assertNotIn("stopped run", dropped[0])
        with self.assertRaisesRegex(FileNotFoundError, r"no checkpoint for step 3 .*steps: 2, 4"):
            train.train_and_evaluate(tiny_experiment(self.corpus, total_steps=4), workdir,
                                     print_fn=lines.append, step=3)

    def test_all_checkpoints_unreadable_is_one_line_and_nothing_moves(self):
        cfg = tiny_experiment(self.corpus)
        workdir = os.path.join(self.tmp, "all")
        trainer, _ = self._save_two(workdir, cfg)
        for step in ("1", "2"):
            os.remove(os.path.join(workdir, "checkpoints", step, "state", "_METADATA"))
        ckpt = checkpoint_lib.Checkpointer(workdir, async_save=False, cleanup_tmp=True)
        with self.assertRaisesRegex(checkpoint_lib.CheckpointError,
                                    r"^no readable checkpoint in .*: step 2 .*; step 1 "):
            ckpt.restore_latest(trainer.abstract_state(), set_aside=True, report=print)
        ckpt.close()
        self.assertEqual(sorted(os.listdir(os.path.join(workdir, "checkpoints"))), ["1", "2"])


class RunRecordTest(CorpusTestCase):

    @pytest.mark.slow  # ~18 s on 2 cores
    def test_run_directory_records_each_invocation_and_plots_the_losses(self):
        workdir = os.path.join(self.tmp, "w")
        seen = {}

        def watch(line):
            if line.startswith("step     2  val_loss"):
                seen["png_at_validation"] = os.path.exists(os.path.join(workdir, "loss.png"))

        argv = ["experiments/train.py", "--config=configs/default.py", f"--workdir={workdir}",
                "--config.model.layer_pattern=('gdn', 'attn')"]  # (recorded, not parsed here)
        lines = []
        cfg = tiny_experiment(self.corpus, total_steps=4, eval_every=2, checkpoint_every=2)
        cfg = dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, warmup_steps=4))
        with mock.patch.object(sys, "argv", argv):
            train.train_and_evaluate(cfg, workdir, print_fn=lambda s: (lines.append(s),
                                                                       watch(s)))
        # The short-run warning (trap 10) is printed.
        self.assertTrue(any(line.startswith("warning: optim.warmup_steps=4 >= train.total_steps"
                                            "=4") for line in lines), lines)
        self.assertTrue(seen["png_at_validation"])
        with open(os.path.join(workdir, "loss.png"), "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
        with open(os.path.join(workdir, "config.json")) as f:
            config_json = f.read()

        resumed_argv = argv + ["--config.train.total_steps=6"]
        with mock.patch.object(sys, "argv", resumed_argv):
            train.train_and_evaluate(tiny_experiment(self.corpus, total_steps=6, eval_every=2,
                                                     checkpoint_every=2),
                                     workdir, print_fn=lambda s: None)
        with open(os.path.join(workdir, "config.json")) as f:
            self.assertEqual(f.read(), config_json)  # the run's first config, not rewritten
        with open(os.path.join(workdir, "invocations.jsonl")) as f:
            records = [json.loads(line) for line in f]
        self.assertEqual([r["argv"] for r in records], [argv, resumed_argv])
        first = records[0]
        self.assertRegex(first["git"]["commit"], r"^[0-9a-f]{40}$")
        for package in ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "grain", "numpy"):
            self.assertIn(package, first["versions"])
        self.assertEqual(first["devices"]["backend"], "cpu")
        self.assertEqual(records[1]["config"]["train"]["total_steps"], 6)
        with open(os.path.join(workdir, "console.log")) as f:
            log = f.read()
        self.assertEqual(log.count("final: step"), 2, log)  # appended, not overwritten
        # The command line as a shell takes it back (quoted where it must be).
        headers = [line.split("  ", 1)[1] for line in log.splitlines()
                   if line.startswith("==== ")]
        self.assertEqual([shlex.split(h) for h in headers], [argv, resumed_argv])
        self.assertIn("Resuming from the checkpoint at step 4", log)


class StoppedBeforeCheckpointsTest(CorpusTestCase):

    def test_both_binaries_take_it_for_a_training_workdir(self):
        # Ctrl-C while the data are read: the run has its records, no config.json or
        # checkpoints/. sweep.py took it for an empty sweep root (it looked for config.json
        # plus checkpoints/) and wrote runs/ there; train.py then refused it as a sweep root.
        from lattn_jax import sweep  # noqa: PLC0415 (the check sweep.py makes of --root)
        workdir = os.path.join(self.tmp, "w")
        with mock.patch.object(data_lib, "build_datasets", side_effect=KeyboardInterrupt):
            with self.assertRaises(KeyboardInterrupt):
                train.train_and_evaluate(tiny_experiment(self.corpus), workdir,
                                         print_fn=lambda s: None)
        # The records kept, nothing else (the lock file: deleted as the run ended).
        self.assertEqual(sorted(os.listdir(workdir)), sorted(
            [train.INVOCATIONS, train.CONSOLE_LOG]))
        self.assertIsNone(config_lib.saved_training_config(workdir))  # train.py: its own
        with self.assertRaisesRegex(
                sweep.SweepConfigError,
                f"^{re.escape(workdir)} is a training run's workdir \\(it has "
                f"invocations\\.jsonl and console\\.log; experiments/train\\.py writes it\\), "
                f"not a sweep root: "):
            sweep.check_root(workdir, {"name": "a"})
        # ... and with the lock file a killed trainer leaves (no Python cleanup) too.
        with open(os.path.join(workdir, train.WORKDIR_LOCK), "w") as f:
            f.write("4242\n")
        with self.assertRaisesRegex(sweep.SweepConfigError, r"it has \.train\.lock, "):
            sweep.check_root(workdir, {"name": "a"})
        # Every file the trainer writes first is one the check knows.
        for name in (train.WORKDIR_LOCK, train.INVOCATIONS, train.CONSOLE_LOG):
            self.assertIn(name, config_lib.TRAINING_WORKDIR_ENTRIES)
        # The run goes on from there (taking over the killed trainer's lock file).
        result = train.train_and_evaluate(tiny_experiment(self.corpus, total_steps=2),
                                          workdir, print_fn=lambda s: None)
        self.assertEqual((result["resumed_from"], result["step"]), (-1, 2))
        self.assertNotIn(train.WORKDIR_LOCK, os.listdir(workdir))


class InsideCheckpointsTest(CorpusTestCase):

    def test_a_runs_checkpoints_folder_is_refused_as_a_workdir(self):
        # train.py trained into <run>/checkpoints, writing config.json, metrics.jsonl and a
        # checkpoints/ of its own among the other run's step folders.
        workdir = os.path.join(self.tmp, "w")
        train.train_and_evaluate(tiny_experiment(self.corpus, total_steps=2), workdir,
                                 print_fn=lambda s: None)
        ckpts = os.path.join(workdir, "checkpoints")
        before = sorted(os.listdir(ckpts))
        for inner in (ckpts, os.path.join(ckpts, before[-1]), os.path.join(ckpts, "99")):
            with self.subTest(inner=inner):
                with self.assertRaisesRegex(config_lib.ConfigError, (
                        f"^{re.escape(inner)} is inside the checkpoints of the run in "
                        f"{re.escape(workdir)} .*Pass --workdir={re.escape(workdir)} to "
                        f"resume that run")):
                    train.train_and_evaluate(tiny_experiment(self.corpus, total_steps=2),
                                             inner, print_fn=lambda s: None)
                self.assertEqual(sorted(os.listdir(ckpts)), before)  # nothing written
        self.assertEqual(os.listdir(os.path.join(ckpts, before[-1])).count("config.json"), 0)


class _NoCheckpoints:
    """A process's checkpointer that saves nothing: orbax needs JAX's distributed runtime when
    ``jax.process_count()`` is above 1 (it writes every process's shards and finalizes on
    process 0; its own tests cover that)."""

    def __init__(self, workdir, **kwargs):
        del kwargs
        self.directory = os.path.join(os.path.abspath(workdir), "checkpoints")

    def latest_step(self):
        return None

    def all_steps(self):
        return []

    def save(self, *args, **kwargs):
        return True

    def wait(self):
        pass

    def close(self):
        pass

    def reached_preemption(self, step):
        return False


class MultiProcessTest(CorpusTestCase):

    def test_only_process_0_writes_the_run_records(self):
        # Every process wrote config.json into the shared workdir (a race on one file).
        workdir = os.path.join(self.tmp, "w")
        cfg = tiny_experiment(self.corpus, total_steps=2, log_every=1, eval_every=1,
                              checkpoint_every=1, tensorboard=True)
        with mock.patch.object(train.jax, "process_index", return_value=1), \
                mock.patch.object(train.jax, "process_count", return_value=2), \
                mock.patch.object(checkpoint_lib, "Checkpointer", _NoCheckpoints):
            result = train.train_and_evaluate(cfg, workdir, print_fn=self.fail)
        self.assertEqual(result["step"], 2)
        # config.json, invocations.jsonl, console.log, .train.lock, metrics.jsonl, loss.png,
        # tensorboard/: process 0's (checkpoints/: orbax writes each process's own shards).
        self.assertEqual(os.listdir(workdir), [])


class RelocatableRunTest(CorpusTestCase):

    def _config(self, **train_overrides):
        cfg = tiny_experiment(self.corpus, **train_overrides)
        data = data_lib.DataConfig(
            paths=("bundled:corpus/wikitext-2-raw/wiki.valid.raw", self.corpus),
            doc_split="wikitext", tokenizer="sentencepiece", seq_len=32, batch_size=4,
            val_fraction=0.1, max_val_batches=1)
        model = dataclasses.replace(cfg.model, vocab_size=32000)
        return dataclasses.replace(cfg, data=data, model=model)

    @pytest.mark.slow  # ~21 s on 2 cores
    def test_a_moved_run_resumes_and_restores_without_the_training_corpus(self):
        cfg = self._config(total_steps=2, checkpoint_every=2, eval_every=2)
        self.assertEqual(cfg.data.paths[0],
                         assets.asset_path("corpus/wikitext-2-raw/wiki.valid.raw"))
        workdir = os.path.join(self.tmp, "run")
        train.train_and_evaluate(cfg, workdir, print_fn=lambda s: None)
        with open(os.path.join(workdir, "config.json")) as f:
            text = f.read()
        self.assertNotIn(assets.ASSETS_DIR, text)
        saved = json.loads(text)["data"]
        self.assertEqual(saved["paths"], ["bundled:corpus/wikitext-2-raw/wiki.valid.raw",
                                          self.corpus])  # user paths as given
        self.assertEqual(saved["tokenizer_path"], "bundled:" + assets.LLAMA2_TOKENIZER)

        # A run directory from a clone that has since moved, written before bundled names
        # (config.json holds absolute paths into the old clone's package).
        moved = os.path.join(self.tmp, "moved")
        shutil.copytree(workdir, moved)
        with open(os.path.join(moved, "config.json"), "w") as f:
            f.write(text.replace("bundled:", "/gone/old-clone/lattn_jax/assets/"))
        lines = []
        out = train.train_and_evaluate(self._config(total_steps=4, checkpoint_every=2,
                                                    eval_every=2),
                                       moved, print_fn=lines.append)
        self.assertEqual((out["resumed_from"], out["step"]), (2, 4), lines)

        # Evaluation and generation need the tokenizer and model config, not the corpus.
        os.remove(self.corpus)
        for run, step in ((workdir, 2), (moved, 4)):
            restored = restore.load(run)
            self.assertEqual(restored.step, step)
            self.assertEqual(restored.tokenizer.vocab_size, 32000)
            self.assertEqual(restored.config.data.paths[1], self.corpus)


if __name__ == "__main__":
    absltest.main()
