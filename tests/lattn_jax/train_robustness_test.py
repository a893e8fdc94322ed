"""Robust training: checkpoint retention and crash safety, the NaN guard, kill / SIGTERM and
resume with identical losses, TensorBoard and throughput metrics."""

import dataclasses
import errno
import glob
import json
import os
import re
import signal
import tempfile
import time
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as orbax_checkpoint
import pytest
from absl.testing import absltest

from lattn_jax import checkpoint as checkpoint_lib
from lattn_jax import data as data_lib
from lattn_jax import train
from tests.lattn_jax.train_test import CorpusTestCase, tiny_experiment


def step_losses(workdir):
    """``{step: train_loss}`` from metrics.jsonl; a step logged twice keeps its last record."""
    out = {}
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        for line in f:
            record = json.loads(line)
            if "train_loss" in record:
                out[record["step"]] = record["train_loss"]
    return out


OOM_TEXT = "RESOURCE_EXHAUSTED: Out of memory allocating 123456789 bytes.\nmore detail"
OOM_ADVICE = ("lower data.batch_size or data.seq_len, or set a smaller train.micro_batch_size "
              "(gradient accumulation; same batch per step)")


class _FailedLoss:
    """A step's loss whose computation ran out of device memory after its dispatch returned:
    reading it raises, as the results of an asynchronously dispatched step in error do."""

    def block_until_ready(self):
        raise jax.errors.JaxRuntimeError(OOM_TEXT)

    def copy_to_host_async(self):
        pass

    def __array__(self, *args, **kwargs):
        raise jax.errors.JaxRuntimeError(OOM_TEXT)


class _Crash(Exception):
    """Stands in for the process dying (no final save, no clean exit)."""


class CheckpointerTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()
        super().tearDown()

    def test_crash_mid_save_leaves_the_previous_checkpoint_restorable(self):
        state = {"w": jnp.arange(6.0).reshape(2, 3), "step": jnp.array(1)}
        ckpt = checkpoint_lib.Checkpointer(self.tmp, async_save=False)
        ckpt.save(1, state)
        ckpt.close()
        # What a process killed while writing step 2 leaves behind: orbax's temporary directory
        # (renamed to "2" only once complete), holding partial files.
        partial = os.path.join(self.tmp, "checkpoints", "2.orbax-checkpoint-tmp-1700000000")
        os.makedirs(os.path.join(partial, "state"))
        with open(os.path.join(partial, "state", "partial.bin"), "wb") as f:
            f.write(b"\0" * 10)
        # A reader (evaluation) must not delete it: it could be a save still in progress.
        reader = checkpoint_lib.Checkpointer(self.tmp)
        self.assertEqual(reader.latest_step(), 1)
        reader.close()
        self.assertTrue(os.path.exists(partial))
        # The writer of the next run cleans it up on open.
        ckpt = checkpoint_lib.Checkpointer(self.tmp, cleanup_tmp=True)
        self.assertEqual(ckpt.latest_step(), 1)
        restored = ckpt.restore(1, {"w": jnp.zeros((2, 3)), "step": jnp.array(0)})
        ckpt.close()
        np.testing.assert_array_equal(restored["w"], state["w"])
        # Orbax may delete it from a background thread: allow it a while on a loaded machine.
        deadline = time.monotonic() + 30.0
        while os.path.exists(partial) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.assertFalse(os.path.exists(partial))

    def test_close_waits_for_the_start_up_cleanup(self):
        # orbax's close() did not wait for it: a run refused right after opening exited with the
        # cleanup thread running ("cannot schedule new futures after interpreter shutdown").
        partial = os.path.join(self.tmp, "checkpoints", "3.orbax-checkpoint-tmp-1700000000")
        os.makedirs(os.path.join(partial, "state"))
        ckpt = checkpoint_lib.Checkpointer(self.tmp, cleanup_tmp=True)
        ckpt.close()
        self.assertFalse(os.path.exists(partial))  # done by the time close() returns

    def test_saved_steps_reads_the_directory_names_only(self):
        self.assertEqual(checkpoint_lib.saved_steps(self.tmp), [])
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "checkpoints")))  # not created
        for name in ("10", "2", "4.orbax-checkpoint-tmp-1700000000", "6.unreadable-20261203"):
            os.makedirs(os.path.join(self.tmp, "checkpoints", name))
        self.assertEqual(checkpoint_lib.saved_steps(self.tmp), [2, 10])

    def test_keeps_the_newest_and_the_best(self):
        ckpt = checkpoint_lib.Checkpointer(self.tmp, keep=1, keep_best=True, async_save=False)
        for step, val_loss in [(1, 3.0), (2, 1.0), (3, 2.0), (4, None)]:
            metrics = None if val_loss is None else {"val_loss": val_loss}
            ckpt.save(step, {"w": jnp.full((2,), float(step))}, metrics=metrics)
        self.assertEqual(sorted(ckpt.all_steps()), [2, 4])
        self.assertEqual(ckpt.best_step(), 2)
        ckpt.close()

    def test_keeps_the_best_across_a_restart(self):
        # orbax wrote no metrics to disk (BestN without best_fn): a resumed run knew no best
        # and deleted the best checkpoint saved before the restart at its next saves.
        losses = np.random.default_rng().permutation([1.0, 2.0, 3.0])
        best = 1 + int(np.argmin(losses))
        ckpt = checkpoint_lib.Checkpointer(self.tmp, keep=1, keep_best=True, async_save=False)
        for step, val_loss in zip((1, 2, 3), losses):
            ckpt.save(step, {"w": jnp.full((2,), float(step))},
                      metrics={"val_loss": float(val_loss)})
        ckpt.close()
        ckpt = checkpoint_lib.Checkpointer(self.tmp, keep=1, keep_best=True, async_save=False)
        self.assertEqual(ckpt.best_step(), best)
        for step in (4, 5):
            ckpt.save(step, {"w": jnp.full((2,), float(step))})
        self.assertEqual(sorted(ckpt.all_steps()), [best, 5])
        ckpt.close()
        plain = checkpoint_lib.Checkpointer(self.tmp, keep=1, async_save=False)
        self.assertIsNone(plain.best_step())  # without keep_best: no best
        plain.close()


class GuardAndResumeTest(CorpusTestCase):

    @pytest.mark.slow  # ~16 s on 2 cores; the killed/preempted resume test runs in CI
    def test_skip_policy_keeps_the_previous_parameters(self):
        cfg = tiny_experiment(self.corpus, nonfinite_policy="skip")
        # No warm-up: a skipped step does not advance the optimizer's own step count, so with
        # warm-up the next good step would still run at learning rate 0.
        cfg = dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, warmup_steps=0))
        trainer = train.Trainer(cfg)
        state = trainer.init_state(0)
        batch = next(data_lib.build_datasets(cfg.data).train_iter)
        before = np.array(state["params"]["embed"], copy=True)  # the state is donated
        poisoned = dict(batch, weights=np.full_like(batch["weights"], np.nan))
        state, metrics = trainer.train_step(state, poisoned)
        self.assertFalse(bool(metrics["finite"]))
        np.testing.assert_array_equal(state["params"]["embed"], before)
        self.assertEqual(int(state["step"]), 1)
        state, metrics = trainer.train_step(state, batch)
        self.assertTrue(bool(metrics["finite"]))
        self.assertFalse(np.array_equal(np.asarray(state["params"]["embed"]), before))

    def test_stop_policy_saves_the_last_good_state_and_says_why(self):
        workdir = os.path.join(self.tmp, "nan")
        original = train.Trainer.train_step
        calls = []

        def poison_third(self, state, batch):
            calls.append(1)
            if len(calls) == 3:
                batch = dict(batch, weights=np.full_like(batch["weights"], np.nan))
            return original(self, state, batch)

        cfg = tiny_experiment(self.corpus, checkpoint_every=2, total_steps=6, eval_every=2)
        with mock.patch.object(train.Trainer, "train_step", poison_third):
            with self.assertRaisesRegex(train.NonFiniteError,
                                        r"step 3: non-finite loss .*last good parameters.*"
                                        r" The checkpoint with the lowest validation loss is "
                                        r"step 2 \(--step=2 resumes from it\)\.$"):
                train.train_and_evaluate(cfg, workdir, print_fn=lambda s: None)
        ckpt = checkpoint_lib.Checkpointer(workdir)
        trainer = train.Trainer(cfg)
        at2 = ckpt.restore(2, trainer.abstract_state())
        at3 = ckpt.restore(3, trainer.abstract_state())
        ckpt.close()
        self.assertEqual(int(at3["step"]), 3)
        np.testing.assert_array_equal(at3["params"]["embed"], at2["params"]["embed"])

    @pytest.mark.entry
    def test_killed_and_preempted_runs_resume_with_identical_losses(self):
        overrides = dict(total_steps=8, log_every=1, checkpoint_every=2, eval_every=4,
                         peak_flops_per_device=1e12)
        straight_dir = os.path.join(self.tmp, "straight")
        straight = train.train_and_evaluate(tiny_experiment(self.corpus, **overrides),
                                            straight_dir, print_fn=lambda s: None)

        workdir = os.path.join(self.tmp, "interrupted")

        def crash_at_5(line):
            if line.startswith("step     5  train_loss"):
                raise _Crash()

        with self.assertRaises(_Crash):  # dies after step 5; the last checkpoint is step 4
            train.train_and_evaluate(tiny_experiment(self.corpus, **overrides), workdir,
                                     print_fn=crash_at_5)

        def sigterm_at_7(line):
            if line.startswith("step     7  train_loss"):
                os.kill(os.getpid(), signal.SIGTERM)

        lines = []
        handler = signal.getsignal(signal.SIGTERM)
        preempted = train.train_and_evaluate(
            tiny_experiment(self.corpus, **overrides), workdir,
            print_fn=lambda s: (lines.append(s), sigterm_at_7(s)))
        self.assertEqual(preempted["resumed_from"], 4)
        self.assertTrue(preempted["preempted"])
        self.assertEqual(preempted["step"], 7)
        self.assertTrue(any("SIGTERM" in line for line in lines), lines)
        self.assertEqual(signal.getsignal(signal.SIGTERM), handler)  # handler restored

        resumed = train.train_and_evaluate(tiny_experiment(self.corpus, **overrides), workdir,
                                           print_fn=lambda s: None)
        self.assertEqual(resumed["resumed_from"], 7)
        self.assertEqual(resumed["step"], 8)
        self.assertEqual(step_losses(workdir), step_losses(straight_dir))  # exactly
        self.assertEqual(resumed["val_loss"], straight["val_loss"])

        # Metrics: throughput and MFU in the JSONL, the same scalars as TensorBoard events.
        with open(os.path.join(straight_dir, "metrics.jsonl")) as f:
            records = [json.loads(line) for line in f]
        logged = [r for r in records if "train_loss" in r and r["step"] > 1]
        for key in ("tokens_per_sec", "step_time", "mfu", "grad_norm", "lr"):
            self.assertIn(key, logged[0])
        self.assertGreater(logged[0]["mfu"], 0)
        self.assertTrue(glob.glob(os.path.join(straight_dir, "tensorboard", "events.out.*")))

    def test_resume_drops_the_metrics_logged_after_the_restored_checkpoint(self):
        # A hard stop after the checkpoint at step 2 (SIGKILL, a second Ctrl-C): steps 3 and 4
        # are logged but never saved; the resumed run logs them again.
        cfg = tiny_experiment(self.corpus, total_steps=4, log_every=1, checkpoint_every=2,
                              eval_every=100)
        workdir = os.path.join(self.tmp, "killed")

        def crash_at_4(line):
            if line.startswith("step     4  train_loss"):
                raise _Crash()

        with self.assertRaises(_Crash):
            train.train_and_evaluate(cfg, workdir, print_fn=crash_at_4)
        path = os.path.join(workdir, "metrics.jsonl")
        with open(path) as f:
            stale = [line for line in f if json.loads(line)["step"] > 2]
        self.assertEqual([json.loads(line)["step"] for line in stale], [3, 4])

        lines = []
        result = train.train_and_evaluate(cfg, workdir, print_fn=lines.append)
        self.assertEqual(result["resumed_from"], 2)
        self.assertIn("metrics.jsonl: dropped 2 records after step 2 (logged after the "
                      "restored checkpoint by a stopped run; ", "\n".join(lines))
        with open(path) as f:
            steps = [json.loads(line)["step"] for line in f if "train_loss" in line]
        self.assertEqual(steps, [1, 2, 3, 4])  # strictly increasing, no stale repeats
        with open(path + ".discarded-2") as f:
            self.assertEqual(f.readlines(), stale)  # nothing lost

    def test_out_of_memory_in_the_first_step_names_the_options_to_lower(self):
        # --config.data.batch_size=10000 ended with a 34-line RESOURCE_EXHAUSTED traceback.
        def oom(self, state, batch):
            raise jax.errors.JaxRuntimeError(
                "RESOURCE_EXHAUSTED: Out of memory allocating 123456789 bytes.\nmore detail")

        cfg = tiny_experiment(self.corpus)
        workdir = os.path.join(self.tmp, "oom")
        with mock.patch.object(train.Trainer, "train_step", oom):
            with self.assertRaises(train.config_lib.ConfigError) as raised:
                train.train_and_evaluate(cfg, workdir, print_fn=lambda s: None)
        self.assertEqual(str(raised.exception), (
            "out of device memory in the first training step (data.batch_size=4, "
            "data.seq_len=32, train.micro_batch_size=None): lower data.batch_size or "
            "data.seq_len, or set a smaller train.micro_batch_size (gradient accumulation; "
            "same batch per step). XLA: RESOURCE_EXHAUSTED: Out of memory allocating "
            "123456789 bytes."))

        def other(self, state, batch):  # any other runtime error is not translated
            raise jax.errors.JaxRuntimeError("INTERNAL: something else")

        with mock.patch.object(train.Trainer, "train_step", other):
            with self.assertRaisesRegex(jax.errors.JaxRuntimeError, "^INTERNAL: something"):
                train.train_and_evaluate(cfg, workdir, print_fn=lambda s: None)

    def test_out_of_memory_at_a_later_step_names_it_and_the_intact_checkpoint(self):
        # An OOM after the first step (a longer eval batch, fragmentation) ended in a traceback.
        cfg = tiny_experiment(self.corpus, total_steps=6, log_every=1, checkpoint_every=2,
                              eval_every=100)
        workdir = os.path.join(self.tmp, "oom_later")
        real_step, calls = train.Trainer.train_step, []

        def oom_at_5(self, state, batch):
            calls.append(None)
            if len(calls) == 5:
                raise jax.errors.JaxRuntimeError(OOM_TEXT)
            return real_step(self, state, batch)

        with mock.patch.object(train.Trainer, "train_step", oom_at_5):
            with self.assertRaises(train.config_lib.ConfigError) as raised:
                train.train_and_evaluate(cfg, workdir, print_fn=lambda s: None)
        ckpt_dir = os.path.join(workdir, "checkpoints")
        self.assertEqual(str(raised.exception), (
            f"out of device memory in train step 5 (data.batch_size=4, data.seq_len=32, "
            f"train.micro_batch_size=None); the last checkpoint, step 4 in {ckpt_dir}/4, is "
            f"intact: running the same command again resumes from it. To fit: {OOM_ADVICE}; a "
            f"resumed run keeps data.batch_size and data.seq_len (changing them needs a new "
            f"--workdir). XLA: RESOURCE_EXHAUSTED: Out of memory allocating 123456789 bytes."))
        # Nothing lost: the steps logged stay, both checkpoints are complete (no temporary
        # directory), and the same call resumes from step 4 and finishes.
        self.assertEqual(sorted(step_losses(workdir)), [1, 2, 3, 4])
        self.assertEqual(sorted(os.listdir(ckpt_dir)), ["2", "4"])
        with open(os.path.join(workdir, "console.log")) as f:
            self.assertIn("stopped: ConfigError: out of device memory in train step 5",
                          f.read())
        result = train.train_and_evaluate(cfg, workdir, print_fn=lambda s: None)
        self.assertEqual((result["resumed_from"], result["step"]), (4, 6))

    def test_out_of_memory_surfacing_steps_later_names_the_step_that_ran_out(self):
        # Without a per-step read (nonfinite_policy="skip"), step 3's error surfaced in step
        # 4's dispatch, and the message named step 4.
        cfg = tiny_experiment(self.corpus, total_steps=6, log_every=4, checkpoint_every=2,
                              eval_every=100, nonfinite_policy="skip")
        workdir = os.path.join(self.tmp, "oom_async")
        real_step, calls = train.Trainer.train_step, []

        def oom_in_3_seen_in_4(self, state, batch):
            calls.append(None)
            if len(calls) == 4:  # the dispatch of the step after: its input is in error
                raise jax.errors.JaxRuntimeError(OOM_TEXT)
            state, metrics = real_step(self, state, batch)
            if len(calls) == 3:
                metrics = dict(metrics, loss=_FailedLoss())
            return state, metrics

        with mock.patch.object(train.Trainer, "train_step", oom_in_3_seen_in_4):
            with self.assertRaises(train.config_lib.ConfigError) as raised:
                train.train_and_evaluate(cfg, workdir, print_fn=lambda s: None)
        ckpt_dir = os.path.join(workdir, "checkpoints")
        self.assertEqual(str(raised.exception), (
            f"out of device memory in train step 3 (it surfaced in train step 4: dispatch is "
            f"asynchronous; data.batch_size=4, data.seq_len=32, train.micro_batch_size=None); "
            f"the last checkpoint, step 2 in {ckpt_dir}/2, is intact: running the same command "
            f"again resumes from it. To fit: {OOM_ADVICE}; a resumed run keeps data.batch_size "
            f"and data.seq_len (changing them needs a new --workdir). XLA: RESOURCE_EXHAUSTED: "
            f"Out of memory allocating 123456789 bytes."))

    def test_out_of_memory_in_a_resumed_first_step_names_the_checkpoint(self):
        # It got the fresh start's message: no checkpoint named, no word that a resumed run
        # keeps its batch size and sequence length.
        cfg = tiny_experiment(self.corpus, total_steps=4, log_every=1, checkpoint_every=2,
                              eval_every=100, max_steps_per_run=2)
        workdir = os.path.join(self.tmp, "oom_resumed")
        train.train_and_evaluate(cfg, workdir, print_fn=lambda s: None)

        def oom(self, state, batch):
            raise jax.errors.JaxRuntimeError(OOM_TEXT)

        with mock.patch.object(train.Trainer, "train_step", oom):
            with self.assertRaises(train.config_lib.ConfigError) as raised:
                train.train_and_evaluate(cfg, workdir, print_fn=lambda s: None)
        ckpt_dir = os.path.join(workdir, "checkpoints")
        self.assertEqual(str(raised.exception), (
            f"out of device memory in step 3, the first after resuming from step 2 "
            f"(data.batch_size=4, data.seq_len=32, train.micro_batch_size=None); the last "
            f"checkpoint, step 2 in {ckpt_dir}/2, is intact: running the same command again "
            f"resumes from it. To fit: {OOM_ADVICE}; a resumed run keeps data.batch_size and "
            f"data.seq_len (changing them needs a new --workdir). XLA: RESOURCE_EXHAUSTED: Out "
            f"of memory allocating 123456789 bytes."))
        self.assertEqual(os.listdir(ckpt_dir), ["2"])

    def test_out_of_memory_creating_or_restoring_the_state_is_one_line(self):
        # A traceback when creating it; when restoring, the checkpoint was called unreadable.
        cfg = tiny_experiment(self.corpus, total_steps=2, checkpoint_every=5, eval_every=5)
        workdir = os.path.join(self.tmp, "oom_state")
        advice = ("The parameters and optimizer state do not fit the devices as sharded: free "
                  "them (another process on them?) or shard the state over more devices "
                  "(--config.mesh.fsdp)")
        oom = jax.errors.JaxRuntimeError(OOM_TEXT)
        with mock.patch.object(train.Trainer, "init_state", side_effect=oom):
            with self.assertRaises(train.config_lib.ConfigError) as raised:
                train.train_and_evaluate(cfg, workdir, print_fn=lambda s: None)
        self.assertEqual(str(raised.exception), (
            f"out of device memory creating the parameters and optimizer state. {advice}. XLA: "
            f"RESOURCE_EXHAUSTED: Out of memory allocating 123456789 bytes."))
        train.train_and_evaluate(cfg, workdir, print_fn=lambda s: None)
        with mock.patch.object(checkpoint_lib.Checkpointer, "restore", side_effect=oom):
            with self.assertRaises(train.config_lib.ConfigError) as raised:
                train.train_and_evaluate(cfg, workdir, print_fn=lambda s: None)
        ckpt_dir = os.path.join(workdir, "checkpoints")
        self.assertEqual(str(raised.exception), (
            f"out of device memory restoring the checkpoint at step 2 in {ckpt_dir} (it is "
            f"intact; nothing was renamed): JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory "
            f"allocating 123456789 bytes. {advice}"))
        self.assertEqual(os.listdir(ckpt_dir), ["2"])

    def test_out_of_memory_in_an_evaluation_names_it_and_the_intact_checkpoint(self):
        cfg = tiny_experiment(self.corpus, total_steps=6, log_every=1, checkpoint_every=2,
                              eval_every=4)
        workdir = os.path.join(self.tmp, "oom_eval")

        def oom(self, params, batches, should_stop=None):
            raise jax.errors.JaxRuntimeError(OOM_TEXT)

        with mock.patch.object(train.Trainer, "evaluate_counts", oom):
            with self.assertRaises(train.config_lib.ConfigError) as raised:
                train.train_and_evaluate(cfg, workdir, print_fn=lambda s: None)
        ckpt_dir = os.path.join(workdir, "checkpoints")
        self.assertRegex(str(raised.exception), (
            f"^out of device memory in evaluation at step 4 \\(data.batch_size=4, .*\\); the "
            f"last checkpoint, step 2 in {re.escape(ckpt_dir)}/2, is intact: running the same "
            f"command again resumes from it. To fit: {re.escape(OOM_ADVICE)}; .* XLA: "
            f"RESOURCE_EXHAUSTED: Out of memory allocating 123456789 bytes.$"))
        self.assertEqual(sorted(step_losses(workdir)), [1, 2, 3, 4])
        self.assertEqual(os.listdir(ckpt_dir), ["2"])

        # Before any checkpoint: the message says so (and the records stay).
        workdir = os.path.join(self.tmp, "oom_eval_early")
        with mock.patch.object(train.Trainer, "evaluate_counts", oom):
            with self.assertRaisesRegex(
                    train.config_lib.ConfigError,
                    f"^out of device memory in evaluation at step 1 .*; no checkpoint was saved "
                    f"yet in {re.escape(workdir)}/checkpoints: running the same command again "
                    f"starts from scratch. To fit: "):
                train.train_and_evaluate(dataclasses.replace(
                    cfg, train=dataclasses.replace(cfg.train, eval_every=1)), workdir,
                    print_fn=lambda s: None)
        self.assertEqual(sorted(step_losses(workdir)), [1])


# What tensorstore raises when a checkpoint's array file cannot be written (a full disk).
DISK_FULL = ('RESOURCE_EXHAUSTED: Error writing "params.embed/0" in OCDBT database at local file '
             '"/w/checkpoints/4.orbax-checkpoint-tmp/state.orbax-checkpoint-tmp/ocdbt.process_0/'
             '": Failed writing: "/w/.../d/3a3f": Failed to write 745125 bytes to file 8: No '
             'space left on device [os_error_code=\'28\']')


class WriteFailureTest(CorpusTestCase):

    def test_a_checkpoint_that_cannot_be_written_is_one_line_naming_the_intact_one(self):
        # A full disk during a save ended in ~480 lines of orbax tracebacks.
        cfg = tiny_experiment(self.corpus, total_steps=6, log_every=1, checkpoint_every=2,
                              eval_every=100)
        workdir = os.path.join(self.tmp, "full")
        real_save = orbax_checkpoint.CheckpointManager.save

        def save(manager, step, *args, **kwargs):
            if step == 4:
                raise ValueError(DISK_FULL)
            return real_save(manager, step, *args, **kwargs)

        with mock.patch.object(orbax_checkpoint.CheckpointManager, "save", save):
            with self.assertRaises(checkpoint_lib.CheckpointWriteError) as raised:
                train.train_and_evaluate(cfg, workdir, print_fn=lambda s: None)
        ckpt_dir = os.path.join(workdir, "checkpoints")
        self.assertEqual(str(raised.exception), (
            f"the checkpoint at step 4 in {ckpt_dir} could not be written (No space left on "
            f"device); the last checkpoint, step 2 in {ckpt_dir}/2, is intact: running the same "
            f"command again resumes from it (the partial write is removed)"))
        self.assertEqual(raised.exception.step, 4)
        self.assertEqual(os.listdir(ckpt_dir), ["2"])
        result = train.train_and_evaluate(cfg, workdir, print_fn=lambda s: None)
        self.assertEqual((result["resumed_from"], result["step"]), (2, 6))

    def test_a_run_record_that_cannot_be_written_is_one_line_naming_the_checkpoint(self):
        cfg = tiny_experiment(self.corpus, total_steps=6, log_every=1, checkpoint_every=2,
                              eval_every=100)
        workdir = os.path.join(self.tmp, "full")
        real_write = train.MetricsWriter.write

        def write(writer, step, **metrics):
            if step == 3:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), writer.path)
            return real_write(writer, step, **metrics)

        with mock.patch.object(train.MetricsWriter, "write", write):
            with self.assertRaises(train.WorkdirWriteError) as raised:
                train.train_and_evaluate(cfg, workdir, print_fn=lambda s: None)
        self.assertEqual(str(raised.exception), (
            f"cannot write {workdir}/metrics.jsonl (No space left on device) in train step 3; "
            f"the last checkpoint, step 2 in {workdir}/checkpoints/2, is intact: running the "
            f"same command again resumes from it"))

    def test_a_config_json_write_cut_short_leaves_none(self):
        # A full disk while config.json was written left it truncated; every later start was
        # then refused ("config.json is not valid JSON").
        workdir = os.path.join(self.tmp, "cut")
        os.makedirs(workdir)  # kept after a failure (a workdir the call created is removed)

        def dump_then_fail(obj, f, **kwargs):
            f.write(json.dumps(obj, **kwargs)[:100])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), f.name)

        cfg = tiny_experiment(self.corpus, total_steps=2, checkpoint_every=5, eval_every=5)
        with mock.patch.object(train.json, "dump", dump_then_fail):
            with self.assertRaisesRegex(OSError, "No space left on device"):
                train.train_and_evaluate(cfg, workdir, print_fn=lambda s: None)
        self.assertEqual([n for n in os.listdir(workdir) if n.startswith("config.json")], [])
        result = train.train_and_evaluate(cfg, workdir, print_fn=lambda s: None)
        self.assertEqual(result["step"], 2)

    def test_a_read_only_workdir_is_one_line_and_nothing_is_written(self):
        # It ended in a traceback from opening the lock file.
        workdir = os.path.join(self.tmp, "ro")
        os.makedirs(workdir)
        real_open = open

        def read_only(path, mode="r", *args, **kwargs):
            if str(path).startswith(workdir) and set(mode) & set("wax+"):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
            return real_open(path, mode, *args, **kwargs)

        with mock.patch("builtins.open", read_only):
            with self.assertRaises(train.config_lib.ConfigError) as raised:
                train.train_and_evaluate(tiny_experiment(self.corpus), workdir,
                                         print_fn=lambda s: None)
        self.assertEqual(str(raised.exception), (
            f"--workdir={workdir}: cannot write there (Read-only file system: "
            f"{workdir}/.train.lock)"))
        self.assertEqual(os.listdir(workdir), [])

    def test_a_checkpoint_directory_that_refuses_writes_stops_the_start_in_one_line(self):
        # chattr +i <workdir>/checkpoints: the run trained to its first save, hung ~5 minutes in
        # orbax, then failed with a TimeoutError hiding the cause. Now: refused before the data
        # is read, the checkpoint there left alone. (Root ignores chmod: the refusal is mocked.)
        workdir = os.path.join(self.tmp, "frozen")
        directory = os.path.join(workdir, "checkpoints")
        os.makedirs(os.path.join(directory, "2"))
        real_mkdtemp = tempfile.mkdtemp

        def mkdtemp(*args, dir=None, **kwargs):
            if dir is not None and os.path.abspath(dir).startswith(directory):
                raise PermissionError(errno.EPERM, os.strerror(errno.EPERM), dir)
            return real_mkdtemp(*args, dir=dir, **kwargs)

        with mock.patch.object(checkpoint_lib.tempfile, "mkdtemp", mkdtemp), \
                mock.patch.object(data_lib, "build_datasets",
                                  side_effect=AssertionError("the data was read")):
            with self.assertRaises(train.config_lib.ConfigError) as raised:
                train.train_and_evaluate(tiny_experiment(self.corpus), workdir,
                                         print_fn=lambda s: None)
        self.assertEqual(str(raised.exception), (
            f"--workdir={workdir}: cannot write the checkpoint directory {directory} "
            f"(Operation not permitted)"))
        self.assertEqual(os.listdir(directory), ["2"])


class CutShortRecordsTest(absltest.TestCase):
    """A trainer killed mid-record leaves the last line of metrics.jsonl cut short."""

    def test_the_next_write_and_the_loss_plot_skip_a_cut_short_last_line(self):
        workdir = tempfile.mkdtemp()
        path = os.path.join(workdir, "metrics.jsonl")
        rng = np.random.default_rng(0)
        losses = rng.uniform(2.0, 6.0, size=3)
        with open(path, "w") as f:
            f.write(json.dumps({"step": 1, "time": 1.0, "train_loss": losses[0]}) + "\n")
            f.write('{"step": 2, "time": 2.0, "train_lo')  # killed mid-record
        writer = train.MetricsWriter(workdir)
        writer.write(2, train_loss=losses[1])
        writer.write(3, train_loss=losses[2], val_loss=losses[2] + 0.1)
        with open(path) as f:
            lines = f.read().splitlines()
        self.assertLen(lines, 3)  # the cut line is gone, not glued to the next record
        self.assertEqual([json.loads(line)["step"] for line in lines], [1, 2, 3])
        self.assertAlmostEqual(json.loads(lines[1])["train_loss"], float(losses[1]))
        self.assertEqual(train.plot_losses(workdir), os.path.join(workdir, train.LOSS_PLOT))

    def test_the_loss_plot_skips_a_glued_line_left_by_an_older_writer(self):
        workdir = tempfile.mkdtemp()
        with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
            f.write(json.dumps({"step": 1, "time": 1.0, "train_loss": 3.5}) + "\n")
            f.write('{"step": 2, "time": 2.0, "train_lo{"step": 2, "train_loss": 3.1}\n')
            f.write(json.dumps({"step": 3, "time": 3.0, "val_loss": 3.2}) + "\n")
        self.assertEqual(train.plot_losses(workdir), os.path.join(workdir, train.LOSS_PLOT))


if __name__ == "__main__":
    absltest.main()
