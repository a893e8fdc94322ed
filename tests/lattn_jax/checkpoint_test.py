"""Checkpointer: a readable checkpoint of a different model is reported as such, not as
unreadable, and nothing is renamed."""

import json
import os
from unittest import mock

import jax
import jax.numpy as jnp
from absl.testing import absltest

from lattn_jax import checkpoint as checkpoint_lib


def _state(width):
    return {"params": {"embed": jnp.zeros((3, width)), "out": jnp.ones((width,))},
            "step": jnp.zeros((), jnp.int32)}


def _abstract(state):
    return jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), state)


class MismatchTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.workdir = self.create_tempdir().full_path
        ckpt = checkpoint_lib.Checkpointer(self.workdir, async_save=False)
        for step in (2, 4):
            ckpt.save(step, _state(4))
        ckpt.close()
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
        dropped, discarded = checkpoint_lib.drop_records_after(path, 3)
        self.assertEqual((dropped, discarded), (2, f"{path}.discarded-3"))
        records.append_record(path, {"step": 4, "train_loss": 2.6})
        self.assertEqual([r["step"] for r in records.read_records(path)], [1, 2, 3, 4])


if __name__ == "__main__":
    absltest.main()
