"""Checkpointer: a readable checkpoint of a different model is reported as such, not as
unreadable, and nothing is renamed."""

import json
import logging
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import types
from unittest import mock

import jax
import jax.numpy as jnp
from absl.testing import absltest

from lattn_jax import checkpoint as checkpoint_lib
from tests import binary_runs


def _state(width):
    return {"params": {"embed": jnp.zeros((3, width)), "out": jnp.ones((width,))},
            "step": jnp.zeros((), jnp.int32)}


def _abstract(state):
    return jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), state)


class MismatchTest(absltest.TestCase):
    """Each test gets a copy of one workdir with checkpoints of ``_state(4)`` at steps 2 and 4,
    saved once for the class."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls._saved = tempfile.TemporaryDirectory()
        ckpt = checkpoint_lib.Checkpointer(cls._saved.name, async_save=False)
        for step in (2, 4):
            ckpt.save(step, _state(4))
        ckpt.close()

    @classmethod
    def tearDownClass(cls):
        cls._saved.cleanup()
        super().tearDownClass()

    def setUp(self):
        super().setUp()
        self.workdir = os.path.join(self.create_tempdir().full_path, "run")
        shutil.copytree(self._saved.name, self.workdir)
        self.directory = os.path.join(self.workdir, "checkpoints")

    def restore_latest(self, abstract, **kwargs):
        ckpt = checkpoint_lib.Checkpointer(self.workdir, async_save=False)
        try:
            return ckpt.restore_latest(abstract, report=self.fail, set_aside=True, **kwargs)
        finally:
            ckpt.close()

    def test_other_shapes_name_the_first_difference_and_rename_nothing(self):
        with self.assertRaises(checkpoint_lib.CheckpointMismatchError) as cm:
            self.restore_latest(_abstract(_state(8)))
        self.assertEqual(str(cm.exception), (
            f"the checkpoint at step 4 in {self.directory} is of a different model (its "
            f"parameter tree/shapes do not match this config: params/embed has shape (3, 4) "
            f"there, (3, 8) here (and 1 more)); use the options it was trained with or a new "
            f"--workdir"))
        self.assertNotIn("unreadable", str(cm.exception))
        self.assertNotIn("Move the directory away", str(cm.exception))
        self.assertCountEqual(os.listdir(self.directory), ["2", "4"])  # nothing set aside

    def test_another_tree_names_the_missing_entry_and_the_given_advice(self):
        state = _state(4)
        state["params"]["extra"] = jnp.zeros((2,))
        with self.assertRaisesRegex(
                checkpoint_lib.CheckpointMismatchError,
                r"step 4 .* different model .*: params/extra \(2,\) is missing there\); "
                r"config.json is wrong$"):
            self.restore_latest(_abstract(state), mismatch_advice="config.json is wrong")
        self.assertCountEqual(os.listdir(self.directory), ["2", "4"])

    def test_a_newer_unreadable_step_is_named_with_the_mismatch_and_left_in_place(self):
        # Only the mismatch of step 2 was reported: step 4's state was silently not resumed.
        os.remove(os.path.join(self.directory, "4", "state", "_METADATA"))
        with self.assertRaises(checkpoint_lib.CheckpointMismatchError) as cm:
            self.restore_latest(_abstract(_state(8)))
        self.assertEqual(str(cm.exception), (
            f"the checkpoint at step 2 in {self.directory} is of a different model (its "
            f"parameter tree/shapes do not match this config: params/embed has shape (3, 4) "
            f"there, (3, 8) here (and 1 more)); use the options it was trained with or a new "
            f"--workdir. Newer and unreadable: step 4 (state/_METADATA is missing), left in "
            f"place (a run with the checkpoint's options sets it aside and resumes from step "
            f"2)"))
        self.assertCountEqual(os.listdir(self.directory), ["2", "4"])  # nothing set aside

    def test_out_of_memory_while_restoring_is_not_unreadable(self):
        # A full device (another process on it) read as "unreadable": the newest step was set
        # aside after an older one fitted, or the run ended in "no readable checkpoint ...
        # Move the directory away".
        oom = jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 96 "
                                         "bytes.\nmore")
        with mock.patch.object(checkpoint_lib.Checkpointer, "restore", side_effect=oom):
            with self.assertRaises(checkpoint_lib.RestoreOutOfMemoryError) as cm:
                self.restore_latest(_abstract(_state(4)))
        self.assertEqual(str(cm.exception), (
            f"out of device memory restoring the checkpoint at step 4 in {self.directory} (it "
            f"is intact; nothing was renamed): JaxRuntimeError: RESOURCE_EXHAUSTED: Out of "
            f"memory allocating 96 bytes."))
        self.assertEqual(cm.exception.step, 4)
        self.assertCountEqual(os.listdir(self.directory), ["2", "4"])

    def test_restore_step_reports_the_mismatch_too(self):
        ckpt = checkpoint_lib.Checkpointer(self.workdir, async_save=False)
        try:
            with self.assertRaisesRegex(checkpoint_lib.CheckpointMismatchError,
                                        r"^the checkpoint at step 2 in .* different model"):
                ckpt.restore_step(2, _abstract(_state(8)))
        finally:
            ckpt.close()

    def test_a_matching_state_restores(self):
        step, state = self.restore_latest(_abstract(_state(4)))
        self.assertEqual(step, 4)
        self.assertEqual(state["params"]["out"].shape, (4,))

    def test_describe_mismatch_of_equal_maps_is_none(self):
        self.assertIsNone(checkpoint_lib.describe_mismatch({"a": (1,)}, {"a": (1,)}))


class WriteErrorTest(absltest.TestCase):

    def test_a_failed_asynchronous_write_names_its_step_and_the_os_reason(self):
        workdir = self.create_tempdir().full_path
        ckpt = checkpoint_lib.Checkpointer(workdir)
        ckpt.save(2, _state(4))
        full = ValueError("RESOURCE_EXHAUSTED: Error writing ... Failed to write 745125 bytes to "
                          "file 8: No space left on device [os_error_code='28']")
        real_wait = ckpt.manager.wait_until_finished
        with mock.patch.object(ckpt.manager, "wait_until_finished", side_effect=full):
            with self.assertRaises(checkpoint_lib.CheckpointWriteError) as cm:
                ckpt.save(4, _state(4))  # waits for step 2's write first
        real_wait()
        ckpt.close()
        self.assertEqual(str(cm.exception), (
            f"the checkpoint at step 2 in {workdir}/checkpoints could not be written (No space "
            f"left on device)"))
        self.assertEqual(cm.exception.step, 2)

    def test_the_writer_removes_a_failed_step_s_partial_files_at_close(self):
        # They stayed until the next start; on a full disk they hold the space.
        workdir = self.create_tempdir().full_path
        ckpt = checkpoint_lib.Checkpointer(workdir, async_save=False, cleanup_tmp=True)
        ckpt.save(2, _state(4))
        ckpt.wait()
        directory = os.path.join(workdir, "checkpoints")
        for name in ("4.orbax-checkpoint-tmp", "6.orbax-checkpoint-tmp-1700000000"):
            os.makedirs(os.path.join(directory, name, "state"))  # 6: another writer's
        with mock.patch.object(ckpt.manager, "save", side_effect=OSError(28, "No space left "
                                                                         "on device")):
            with self.assertRaisesRegex(checkpoint_lib.CheckpointWriteError,
                                        r"step 4 .* \(No space left on device\)$"):
                ckpt.save(4, _state(4))
        ckpt.close()
        self.assertCountEqual(os.listdir(directory), ["2", "6.orbax-checkpoint-tmp-1700000000"])

    def test_describe_write_error_prefers_the_os_reason(self):
        self.assertEqual(checkpoint_lib.describe_write_error(
            PermissionError(13, "Permission denied", "/w/x")), "Permission denied: /w/x")
        self.assertEqual(checkpoint_lib.describe_write_error(ValueError("INTERNAL: odd")),
                         "ValueError: INTERNAL: odd")

    def test_write_problem_names_a_checkpoint_directory_that_refuses_entries(self):
        # A chattr +i checkpoints/ made orbax hang 5 minutes at the first save; tests run as
        # root (chmod would not stop them), so the refusal is the kernel's EPERM, mocked.
        workdir = self.create_tempdir().full_path
        self.assertIsNone(checkpoint_lib.write_problem(workdir))  # no checkpoints/ yet
        directory = os.path.join(workdir, "checkpoints")
        os.makedirs(os.path.join(directory, "2"))
        self.assertIsNone(checkpoint_lib.write_problem(workdir))  # writable
        self.assertEqual(os.listdir(directory), ["2"])  # the probe is gone
        refused = PermissionError(1, "Operation not permitted", os.path.join(directory, "x"))
        with mock.patch.object(checkpoint_lib.tempfile, "mkdtemp", side_effect=refused):
            self.assertEqual(checkpoint_lib.write_problem(workdir),
                             f"cannot write the checkpoint directory {directory} (Operation "
                             f"not permitted)")

    def test_write_problem_names_a_checkpoints_file(self):
        # A plain file named checkpoints: orbax printed ~35 lines of traceback at start and the
        # run failed at its first save with a bare "Not a directory" (newcomer, 2026-12-07d).
        workdir = self.create_tempdir().full_path
        path = os.path.join(workdir, "checkpoints")
        with open(path, "w") as f:
            f.write("not a directory")
        self.assertEqual(checkpoint_lib.write_problem(workdir),
                         f"cannot write the checkpoint directory {path} (it exists and is not "
                         f"a directory)")
        with open(path) as f:  # nothing lost
            self.assertEqual(f.read(), "not a directory")

    def test_a_directory_made_read_only_since_the_start_fails_the_save_at_once(self):
        # Orbax waited 5 minutes for the step directory it could not create, then raised a
        # TimeoutError that hid the cause.
        workdir = self.create_tempdir().full_path
        ckpt = checkpoint_lib.Checkpointer(workdir, async_save=False, cleanup_tmp=True)
        ckpt.save(2, _state(2))
        directory = os.path.join(workdir, "checkpoints")
        refused = PermissionError(1, "Operation not permitted", directory)
        with mock.patch.object(checkpoint_lib.tempfile, "mkdtemp", side_effect=refused), \
                mock.patch.object(ckpt.manager, "save",
                                  side_effect=AssertionError("orbax was asked to save")):
            with self.assertRaises(checkpoint_lib.CheckpointWriteError) as cm:
                ckpt.save(4, _state(4))
        self.assertEqual(str(cm.exception),
                         f"the checkpoint at step 4 in {directory} could not be written "
                         f"(Operation not permitted: {directory})")
        self.assertEqual(cm.exception.step, 4)
        ckpt.close()
        self.assertEqual(os.listdir(directory), ["2"])

    def test_orbax_argument_errors_are_not_called_failed_writes(self):
        # orbax's own checks raise ValueErrors too (StepAlreadyExistsError): they are bugs of
        # the caller, not a full disk, and keep their type and traceback.
        workdir = self.create_tempdir().full_path
        ckpt = checkpoint_lib.Checkpointer(workdir, async_save=False)
        ckpt.save(1, _state(4))
        ckpt.wait()
        with self.assertRaises(ValueError) as cm:
            ckpt.save(1, _state(4))
        ckpt.close()
        self.assertNotIsInstance(cm.exception, checkpoint_lib.CheckpointWriteError)
        self.assertIn("already exists", str(cm.exception))


class DropRecordsAfterTest(absltest.TestCase):

    def test_a_cut_short_last_line_is_not_kept_mid_file_by_the_rewrite(self):
        from lattn_jax import records  # noqa: PLC0415
        path = os.path.join(self.create_tempdir().full_path, "metrics.jsonl")
        with open(path, "w") as f:
            for step in range(1, 6):
                f.write(json.dumps({"step": step, "train_loss": 3.0 - 0.1 * step}) + "\n")
            f.write('{"step": 6, "tra')  # the trainer killed mid-record
        os.chmod(path, 0o644)
        dropped, discarded = checkpoint_lib.drop_records_after(path, 3)
        self.assertEqual((dropped, discarded), (2, f"{path}.discarded-3"))
        self.assertEqual(os.stat(path).st_mode & 0o777, 0o644)  # not mkstemp's 0600
        records.append_record(path, {"step": 4, "train_loss": 2.6})
        self.assertEqual([r["step"] for r in records.read_records(path)], [1, 2, 3, 4])


ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


# A logger of the tests' own: absl's carries the process-wide filter of any Checkpointer made.
LOGGER = "lattn_jax.tests.orbax_like"


def _orbax_record(message, level=logging.ERROR):
    path = os.path.join(os.sep, "site-packages", "orbax", "checkpoint", "future.py")
    return logging.LogRecord(LOGGER, level, path, 387, message, None, None)


class SaveErrorFilterTest(absltest.TestCase):
    """orbax's own error logs of a failed asynchronous save give way to the one line."""

    def setUp(self):
        super().setUp()
        self.filt = checkpoint_lib._HeldSaveErrors()
        self.emitted = []
        handler = logging.Handler()
        handler.emit = lambda record: self.emitted.append(record.getMessage())
        self.logger = logging.getLogger(LOGGER)
        self.logger.propagate = False
        self.logger.addHandler(handler)
        self.logger.addFilter(self.filt)
        self.addCleanup(self.logger.removeHandler, handler)
        self.addCleanup(self.logger.removeFilter, self.filt)

    def log(self, record):
        self.logger.handle(record)

    def test_held_during_a_save_then_released_or_dropped(self):
        self.filt.hold()
        self.log(_orbax_record("thread A failed"))
        self.log(_orbax_record("a warning", logging.WARNING))  # below ERROR: passes
        other = logging.LogRecord(LOGGER, logging.ERROR, "/x/lattn_jax/train.py", 1, "ours",
                                  None, None)
        self.log(other)  # not orbax's: passes
        self.assertEqual(self.emitted, ["a warning", "ours"])
        self.filt.release()  # the save completed: logged as it would have been
        self.assertEqual(self.emitted, ["a warning", "ours", "thread A failed"])
        self.filt.hold()
        self.log(_orbax_record("thread B failed"))
        self.filt.drop()  # became a CheckpointWriteError's one line
        self.log(_orbax_record("a late thread failed"))  # within LATE_S: dropped too
        self.assertEqual(self.emitted, ["a warning", "ours", "thread A failed"])
        self.filt.quiet_until = 0.0  # LATE_S later
        self.log(_orbax_record("a later error"))
        self.assertEqual(self.emitted[-1], "a later error")

    def test_asyncio_records_are_held_only_for_failed_writes(self):
        self.filt.hold()
        for error, held in ((ValueError("Failed writing [os_error_code='28']"), True),
                            (ValueError("a bug"), False)):
            record = logging.LogRecord("asyncio", logging.ERROR, "/x/asyncio/base_events.py",
                                       1, "Task exception was never retrieved", None,
                                       (type(error), error, None))
            self.assertEqual(self.filt.filter(record), not held)

    def test_only_the_closed_loop_noise_is_dropped_from_unraisable_exceptions(self):
        seen = []
        self.enter_context(mock.patch.object(sys, "unraisablehook", seen.append))
        checkpoint_lib._install_save_error_filters()
        checkpoint_lib._install_save_error_filters()  # once: not wrapped twice
        hook = sys.unraisablehook
        self.assertTrue(hook._lattn_closed_loop_filter)

        def event(error, obj=None):
            return types.SimpleNamespace(exc_type=type(error), exc_value=error, object=obj,
                                         exc_traceback=None, err_msg=None)

        hook(event(RuntimeError("Event loop is closed")))
        kept = [event(RuntimeError("Event loop is closed"), obj="a coroutine"),
                event(RuntimeError("something else")), event(ValueError("Event loop is closed"))]
        for e in kept:
            hook(e)
        self.assertEqual(seen, kept)


@absltest.skipUnless(hasattr(resource, "RLIMIT_FSIZE"), "needs RLIMIT_FSIZE")
class FailedWriteOutputTest(absltest.TestCase):

    def test_a_save_the_disk_refuses_ends_in_one_line(self):
        # A full disk (here: a file size limit, EFBIG) during an asynchronous save printed
        # 300 to 1,300 lines of orbax's and tensorstore's tracebacks before the one line.
        workdir = os.path.join(self.create_tempdir().full_path, "run")

        def limit_file_size():
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))

        result = subprocess.run(
            [sys.executable, os.path.join(ROOT, "experiments", "train.py"),
             "--config=" + os.path.join(ROOT, "configs", "default.py"), "--workdir=" + workdir,
             "--config.model.layer_pattern=('attn',)", "--config.model.vocab_size=257",
             "--config.data.tokenizer=byte", "--config.data.seq_len=32",
             "--config.data.batch_size=2", "--config.data.max_val_batches=1",
             "--config.train.total_steps=4", "--config.train.checkpoint_every=2",
             "--config.train.eval_every=100", "--config.train.log_every=1",
             "--config.optim.warmup_steps=1",
             # No TensorBoard writer: tensorboardX imports torch where installed (~1.7 s of
             # this process); the test is of the checkpoint save.
             "--config.train.tensorboard=False"],
            capture_output=True, text=True, cwd=ROOT, timeout=300,
            preexec_fn=limit_file_size,
            # Most XLA optimizations off: compile time on CPU; the test is of the save. (The
            # run's git read takes no index lock: lattn_jax/train.py's _git_state.)
            env=binary_runs.fast_compile_env(JAX_PLATFORMS="cpu"))
        self.assertEqual(result.returncode, 1, result.stderr[-3000:])
        directory = os.path.join(workdir, "checkpoints")
        self.assertEqual(result.stderr.strip().splitlines(), [
            f"error: the checkpoint at step 2 in {directory} could not be written (File too "
            f"large); no checkpoint was saved yet in {directory}: running the same command "
            f"again starts from scratch (the partial write is removed)"])


if __name__ == "__main__":
    absltest.main()
