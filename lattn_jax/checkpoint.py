"""Checkpoints through orbax's ``CheckpointManager``: train state plus the data iterator's state.

Layout under ``<workdir>/checkpoints/<step>/``: ``state`` (params, optimizer state and step, as
an orbax ``StandardSave`` pytree) and ``data_iter`` (the grain iterator's state, through grain's
own orbax handler). Orbax writes each step into a temporary directory and renames it only when
complete, so a crash in the middle of a save leaves the previous checkpoint restorable.
"""

import os
from typing import Any, Optional

import grain
import orbax.checkpoint as ocp

from lattn_jax.typing import PyTree


class Checkpointer:
    """Saves and restores ``(train_state, data_iterator)`` pairs in ``<workdir>/checkpoints``.

    Args:
      workdir: the run's directory (created if missing).
      keep: how many most recent checkpoints to keep.
      async_save: write in a background thread (``wait()`` blocks until done).
    """

    def __init__(self, workdir: str, *, keep: int = 2, async_save: bool = True):
        self.directory = os.path.join(os.path.abspath(workdir), "checkpoints")
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, create=True, enable_async_checkpointing=async_save)
        self.manager = ocp.CheckpointManager(
            self.directory, options=options, item_names=("state", "data_iter"))

    def latest_step(self) -> Optional[int]:
        """The newest complete checkpoint's step, or ``None``."""
        return self.manager.latest_step()

    def save(self, step: int, state: PyTree, data_iter: Any = None, *, force: bool = True) -> bool:
        """Saves ``state`` (a pytree of arrays) and, if given, the grain iterator at ``step``."""
        items = {"state": ocp.args.StandardSave(state)}
        if data_iter is not None:
            items["data_iter"] = grain.checkpoint.CheckpointSave(data_iter)
        return self.manager.save(step, args=ocp.args.Composite(**items), force=force)

    def restore(self, step: int, abstract_state: PyTree, data_iter: Any = None) -> PyTree:
        """Restores the state saved at ``step``.

        Args:
          step: a step returned by :meth:`latest_step` or listed by :meth:`all_steps`.
          abstract_state: pytree of ``jax.ShapeDtypeStruct`` (from ``jax.eval_shape``) with the
            structure of the saved state.
          data_iter: if given, a grain iterator whose position is restored in place.

        Returns:
          The restored state pytree.

        Raises:
          FileNotFoundError: if no checkpoint exists at ``step``.
          ValueError: from orbax, if the saved tree does not match ``abstract_state``.
        """
        if step not in self.manager.all_steps():
            raise FileNotFoundError(f"no checkpoint for step {step} in {self.directory}")
        items = {"state": ocp.args.StandardRestore(abstract_state)}
        if data_iter is not None:
            items["data_iter"] = grain.checkpoint.CheckpointRestore(data_iter)
        restored = self.manager.restore(step, args=ocp.args.Composite(**items))
        return restored["state"]

    def all_steps(self):
        return self.manager.all_steps()

    def wait(self) -> None:
        """Blocks until pending asynchronous saves are on disk."""
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()
