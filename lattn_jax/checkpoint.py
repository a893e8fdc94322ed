"""Checkpoints through orbax's ``CheckpointManager``: train state plus the data iterator's state.

Layout under ``<workdir>/checkpoints/<step>/``: ``state`` (params, optimizer state and step, as
an orbax ``StandardSave`` pytree) and ``data_iter`` (the grain iterator's state, through grain's
own orbax handler). Orbax writes each step into a temporary directory and renames it only when
complete, so a crash in the middle of a save leaves the previous checkpoint restorable; leftover
temporary directories are removed when the next writer (``cleanup_tmp=True``, the trainer) opens
the directory. Readers (evaluation) leave them alone: one may be a save still in progress.

Retention: the ``keep`` newest checkpoints, plus (``keep_best``) the one with the lowest
``val_loss`` among those saved with metrics. Saves are asynchronous by default: ``save`` returns
once the arrays are copied off the devices, and the files are written in the background.

Restoring onto another mesh or device count: the arrays are saved with their global shapes, and
``restore`` reads them into the shardings of ``abstract_state`` (``jax.ShapeDtypeStruct`` leaves
with a ``sharding``), whatever the mesh they were saved from.
"""

import os
from typing import Any, Dict, Optional

import grain
import orbax.checkpoint as ocp
from orbax.checkpoint.checkpoint_managers import preservation_policy

from lattn_jax.typing import PyTree


class Checkpointer:
    """Saves and restores ``(train_state, data_iterator)`` pairs in ``<workdir>/checkpoints``.

    Args:
      workdir: the run's directory (created if missing).
      keep: how many most recent checkpoints to keep.
      keep_best: also keep the checkpoint with the lowest ``metrics["val_loss"]``.
      async_save: write in a background thread (``wait()`` blocks until done).
      cleanup_tmp: remove temporary directories left by an interrupted save. Only the process
        that writes the run should set it; a reader could delete a save in progress.
    """

    def __init__(self, workdir: str, *, keep: int = 2, keep_best: bool = False,
                 async_save: bool = True, cleanup_tmp: bool = False):
        self.directory = os.path.join(os.path.abspath(workdir), "checkpoints")
        policies = [preservation_policy.LatestN(n=keep)]
        if keep_best:
            # Sorted by descending loss, BestN keeps the last n: the lowest loss.
            policies.append(preservation_policy.BestN(
                get_metric_fn=lambda m: m["val_loss"], reverse=True, n=1,
                keep_checkpoints_without_metrics=False))
        options = ocp.CheckpointManagerOptions(
            create=True, enable_async_checkpointing=async_save, cleanup_tmp_directories=cleanup_tmp,
            preservation_policy=preservation_policy.AnyPreservationPolicy(policies))
        self.manager = ocp.CheckpointManager(
            self.directory, options=options, item_names=("state", "data_iter"))

    def latest_step(self) -> Optional[int]:
        """The newest complete checkpoint's step, or ``None``."""
        return self.manager.latest_step()

    def save(self, step: int, state: PyTree, data_iter: Any = None, *,
             metrics: Optional[Dict[str, float]] = None, force: bool = True) -> bool:
        """Saves ``state`` (a pytree of arrays) and, if given, the grain iterator at ``step``.

        ``metrics`` (e.g. ``{"val_loss": 3.2}``) rank the checkpoint for ``keep_best``.
        """
        items = {"state": ocp.args.StandardSave(state)}
        if data_iter is not None:
            items["data_iter"] = grain.checkpoint.CheckpointSave(data_iter)
        metrics = None if metrics is None else {k: float(v) for k, v in metrics.items()}
        return self.manager.save(step, args=ocp.args.Composite(**items), metrics=metrics,
                                 force=force)

    def restore(self, step: int, abstract_state: PyTree, data_iter: Any = None) -> PyTree:
        """Restores the state saved at ``step``.

        Args:
          step: a step returned by :meth:`latest_step` or listed by :meth:`all_steps`.
          abstract_state: pytree of ``jax.ShapeDtypeStruct`` with the structure of the saved
            state; their ``sharding`` (any mesh or device count) is where the arrays land.
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

    def reached_preemption(self, step: int) -> bool:
        """Whether a multi-host preemption notice asks every process to save at ``step``."""
        return self.manager.reached_preemption(step)

    def wait(self) -> None:
        """Blocks until pending asynchronous saves are on disk."""
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()
