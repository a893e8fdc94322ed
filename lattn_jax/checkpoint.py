"""Checkpoints through orbax's ``CheckpointManager``: train state plus the data iterator's state.

Layout under ``<workdir>/checkpoints/<step>/``: ``state`` (params, optimizer state and step, as
an orbax ``StandardSave`` pytree) and ``data_iter`` (the grain iterator's state, through grain's
own orbax handler). Orbax writes each step into a temporary directory and renames it only when
complete, so a crash in the middle of a save leaves the previous checkpoint restorable; leftover
temporary directories are removed when the next writer (``cleanup_tmp=True``, the trainer) opens
the directory. Readers (evaluation) leave them alone: one may be a save still in progress. A save
that cannot be written (a full disk, no permission) raises :class:`CheckpointWriteError` naming
its step and the OS's reason, also when it was asynchronous (from the next ``save``, ``wait`` or
``close``).

Retention: the ``keep`` newest checkpoints, plus (``keep_best``) the one with the lowest
``val_loss`` among those saved with metrics (orbax writes them into the checkpoint, so a
restarted run keeps the best saved before the restart). Saves are asynchronous by default:
``save`` returns once the arrays are copied off the devices, and the files are written in the
background.

Unreadable checkpoints: :meth:`Checkpointer.restore_latest` tries the newest step and, if it
cannot be read (a truncated array file, a missing ``_METADATA``, a missing data-iterator file,
...), reports it in one line and falls back to the next older step. Nothing is deleted: the
writer (``set_aside=True``, the trainer) renames an unreadable step's directory to
``<step>.unreadable-<time>``, out of orbax's listing, so that the run can save that step again.
A readable checkpoint whose parameter tree or shapes differ from the state to restore into (a
different model) is not unreadable: it raises :class:`CheckpointMismatchError` at once, with no
fallback to older steps and nothing renamed (unreadable steps newer than it are named in the same
message, and left in place too).

Restoring onto another mesh or device count: the arrays are saved with their global shapes, and
``restore`` reads them into the shardings of ``abstract_state`` (``jax.ShapeDtypeStruct`` leaves
with a ``sharding``), whatever the mesh they were saved from.
"""

import gc
import errno
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import grain
import jax
import orbax.checkpoint as ocp
from etils import epath
from orbax.checkpoint.checkpoint_managers import preservation_policy

from lattn_jax.typing import PyTree


class CheckpointError(ValueError):
    """A checkpoint cannot be read, or none can (the message is one line naming the steps and
    reasons). A ``ValueError``: the binaries report bad inputs of that type in one line."""


class CheckpointMismatchError(CheckpointError):
    """A checkpoint holds a different model: its saved tree of arrays (paths or shapes) does
    not match the state it is restored into. The files are intact; the config is the cause."""


class CheckpointWriteError(CheckpointError):
    """A checkpoint could not be written (a full disk, no permission, an I/O error). Orbax
    writes a step into a temporary directory and renames it only once complete, so the
    checkpoints before it are intact; the writer's :meth:`Checkpointer.close` removes the
    partial one (or the next writer's start-up cleanup does).

    Attributes:
      step: the step whose write failed.
    """

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


_OS_ERROR_CODE = re.compile(r"os_error_code='?(\d+)")


def describe_write_error(error: BaseException) -> str:
    """Why a write failed, short: the OS's reason when the error carries one (tensorstore's
    messages end in ``[os_error_code='28']`` after a long path: ``"No space left on device"``),
    else :func:`describe_error`."""
    cause = error
    while cause is not None:
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror + (f": {cause.filename}" if cause.filename else "")
        found = _OS_ERROR_CODE.search(str(cause))
        if found:
            return os.strerror(int(found.group(1)))
        cause = cause.__cause__
    return describe_error(error)


def _is_write_failure(error: BaseException) -> bool:
    """Whether ``error`` from an orbax save is the storage refusing the write: an ``OSError``,
    or tensorstore's ``ValueError`` that carries an OS error code; not orbax's own argument
    checks (``StepAlreadyExistsError`` and the like are ``ValueError`` s too) nor running out
    of device memory."""
    if is_out_of_memory(error):
        return False
    cause = error
    while cause is not None:
        if isinstance(cause, OSError) or _OS_ERROR_CODE.search(str(cause)):
            return True
        cause = cause.__cause__
    return False


class RestoreOutOfMemoryError(CheckpointError):
    """The devices ran out of memory while a checkpoint was restored onto them. The files are
    intact: the checkpoint is not called unreadable, nothing is renamed and no older step is
    tried (it would not fit either).

    Attributes:
      step: the step being restored.
    """

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error``, or an exception it was raised from, is XLA's out-of-device-memory
    error (a ``JaxRuntimeError`` with ``RESOURCE_EXHAUSTED``)."""
    while error is not None:
        if isinstance(error, jax.errors.JaxRuntimeError) and "RESOURCE_EXHAUSTED" in str(error):
            return True
        error = error.__cause__
    return False


# Advice ending a CheckpointMismatchError: the trainer's (the config comes from the options).
MISMATCH_ADVICE = "use the options it was trained with or a new --workdir"
UNREADABLE_ADVICE = "Move the directory away or use a new --workdir."


def _key_name(key: Any) -> str:
    """One pytree path entry as a name (dict key, sequence index or attribute)."""
    for attr in ("key", "idx", "name"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def _leaf_shapes(tree: PyTree) -> Dict[str, Tuple[int, ...]]:
    """``{"params/blocks/0/...": shape}`` for every leaf of ``tree`` that has a shape."""
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if getattr(leaf, "shape", None) is not None:
            out["/".join(_key_name(k) for k in path)] = tuple(leaf.shape)
    return out


def describe_mismatch(saved: Dict[str, Tuple[int, ...]],
                      wanted: Dict[str, Tuple[int, ...]]) -> Optional[str]:
    """The first difference between two ``{path: shape}`` maps, as words, or ``None``.

    Args:
      saved: the checkpoint's leaves (``"params/blocks/0/mixer/out_proj/kernel": (64, 64)``).
      wanted: the leaves of the state to restore into, keyed the same way.

    Returns:
      E.g. ``"params/embed/embedding has shape (257, 64) there, (257, 32) here"`` (``params``
      entries first, then the optimizer state's), with ``" (and 7 more)"`` when there are
      others; ``None`` when the maps are equal.
    """
    diffs = []
    for path in sorted(set(saved) | set(wanted), key=lambda p: (not p.startswith("params/"), p)):
        if path not in saved:
            diffs.append(f"{path} {wanted[path]} is missing there")
        elif path not in wanted:
            diffs.append(f"{path} {saved[path]} is there but not in this config")
        elif saved[path] != wanted[path]:
            diffs.append(f"{path} has shape {saved[path]} there, {wanted[path]} here")
    if not diffs:
        return None
    return diffs[0] + (f" (and {len(diffs) - 1} more)" if len(diffs) > 1 else "")


def describe_error(error: BaseException, limit: int = 240) -> str:
    """``error`` as one short line: the type and the first line of the message of the innermost
    exception it was raised from (orbax wraps tensorstore's precise reason)."""
    while error.__cause__ is not None:
        error = error.__cause__
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


class _QuietFailedReads:
    """Holds back what a checkpoint read writes to stderr (file descriptor 2), and drops it if
    the read fails: orbax reads the arrays in parallel and, when one read fails, the others
    still in flight end in hundreds of tracebacks ("Event loop is closed", "Future exception was
    never retrieved", "Exception ignored in: <coroutine ...>"), printed from tensorstore's
    threads and the garbage collector. The one-line report replaces them. After a successful
    read the held-back output (warnings) is written out.

    Usage: ``with _QuietFailedReads() as quiet: ...; quiet.failed = True``.
    """

    DRAIN_SECONDS = 1.0  # for the reads still in flight to finish and print into the void

    def __init__(self):
        self.failed = False

    def __enter__(self):
        self._logger = logging.getLogger("asyncio")
        self._level = self._logger.level
        self._logger.setLevel(logging.CRITICAL + 1)
        self._saved_fd = None
        try:
            sys.stderr.flush()
            self._held = tempfile.TemporaryFile()
            self._saved_fd = os.dup(2)
            os.dup2(self._held.fileno(), 2)
        except (OSError, ValueError, AttributeError):  # no usable fd 2: nothing to hold back
            self._saved_fd = None
        return self

    def __exit__(self, *exc):
        if self.failed or exc[0] is not None:
            gc.collect()
            time.sleep(self.DRAIN_SECONDS)
            gc.collect()
        self._logger.setLevel(self._level)
        if self._saved_fd is None:
            return False
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        os.dup2(self._saved_fd, 2)
        os.close(self._saved_fd)
        if not self.failed and exc[0] is None:
            self._held.seek(0)
            text = self._held.read()
            if text:
                os.write(2, text)
        self._held.close()
        return False


class _HeldSaveErrors(logging.Filter):
    """Holds back the errors orbax logs from its background save threads while an asynchronous
    save is in flight, so that a write that fails (a full disk, no permission) ends in the one
    line of :class:`CheckpointWriteError` instead of that line after a few hundred lines of
    orbax's own tracebacks (one per thread that saw the failure: "``_SignalingThread.run()``
    raised an exception", "Failed to run 3 Handler Commit operations", "Save Finalize thread
    failed"). When the save completes, or fails in a way this module does not translate, the
    held records are logged as they would have been (:meth:`release`); when the failure becomes
    a :class:`CheckpointWriteError`, they are dropped (:meth:`drop`), and so are those that
    threads still in flight log in the next :data:`LATE_S` seconds. Records of level ERROR and
    above from orbax's source files, and asyncio's ("Task exception was never retrieved") whose
    exception is a failed write; everything else passes.

    One instance, on absl's logger (orbax logs through ``absl.logging``) and asyncio's,
    installed by the first :class:`Checkpointer` (:func:`_install_save_error_filters`).
    """

    LATE_S = 5.0

    def __init__(self):
        super().__init__()
        self.holding = 0
        self.held: List[logging.LogRecord] = []
        self.quiet_until = 0.0

    @staticmethod
    def _concerns_a_save(record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            return False
        if record.name == "asyncio":
            error = record.exc_info[1] if record.exc_info else None
            return error is not None and _is_write_failure(error)
        return f"{os.sep}orbax{os.sep}" in (record.pathname or "")

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "_lattn_released", False) or not self._concerns_a_save(record):
            return True
        if self.holding:
            self.held.append(record)
            return False
        return time.monotonic() >= self.quiet_until  # late: after a drop, dropped too

    def hold(self) -> None:
        self.holding += 1

    def release(self) -> None:
        self.holding = max(0, self.holding - 1)
        records, self.held = self.held, []
        for record in records:
            record._lattn_released = True
            logging.getLogger(record.name).handle(record)

    def drop(self) -> None:
        self.holding = max(0, self.holding - 1)
        self.held = []
        self.quiet_until = time.monotonic() + self.LATE_S


_SAVE_ERRORS = _HeldSaveErrors()


def _is_closed_loop_noise(unraisable) -> bool:
    """Whether an unraisable exception is the "Event loop is closed" ``RuntimeError`` that
    tensorstore's completion callbacks raise into orbax's closed asyncio loop after a failed
    write (or read): one per array still in flight, printed as a traceback each (160 on a full
    disk with the default model), with no object to name."""
    return (unraisable.object is None and unraisable.exc_type is RuntimeError
            and str(unraisable.exc_value) == "Event loop is closed")


def _no_metrics_notice(record: logging.LogRecord) -> bool:
    """``False`` for orbax's warning on a save without metrics while ``best_fn`` is set
    (``keep_best``): most saves have none by design (only those after an evaluation do)."""
    return not (record.levelno == logging.WARNING and f"{os.sep}orbax{os.sep}" in (
        record.pathname or "") and "did not provide metrics" in record.getMessage())


def _install_save_error_filters() -> None:
    """Installs, once per process, :data:`_SAVE_ERRORS` on the absl and asyncio loggers,
    :func:`_no_metrics_notice` on absl's, and a ``sys.unraisablehook`` that drops
    :func:`_is_closed_loop_noise` (every other unraisable exception goes to the hook that was
    there before)."""
    for name in ("absl", "asyncio"):
        logger = logging.getLogger(name)
        if _SAVE_ERRORS not in logger.filters:
            logger.addFilter(_SAVE_ERRORS)
    absl_logger = logging.getLogger("absl")
    if _no_metrics_notice not in absl_logger.filters:
        absl_logger.addFilter(_no_metrics_notice)
    previous = sys.unraisablehook
    if getattr(previous, "_lattn_closed_loop_filter", False):
        return

    def hook(unraisable):
        if not _is_closed_loop_noise(unraisable):
            previous(unraisable)

    hook._lattn_closed_loop_filter = True
    sys.unraisablehook = hook


def drop_records_after(path: str, step: int) -> Tuple[int, Optional[str]]:
    """Removes from the per-step JSONL file ``path`` (``metrics.jsonl``, ...) the records whose
    ``"step"`` is beyond ``step`` (the step a run resumes from): a run stopped hard after its
    last checkpoint (SIGKILL, a second Ctrl-C, a fallback from an unreadable checkpoint) logged
    them, and the resumed run logs those steps again. Nothing is lost: the dropped lines go to
    ``<path>.discarded-<step>`` (appended to, if it exists), then ``path`` is rewritten
    atomically (a temporary file, renamed over it). Lines that are not JSON objects with a
    numeric ``"step"`` are kept in place, except a last line cut short by a killed writer (not
    valid JSON, no newline): a rewrite leaves it out, since a newline after it would make it a
    bad line in the middle of the file (``lattn_jax.records``); without a rewrite the next
    :func:`lattn_jax.records.append_record` removes it.

    Returns ``(number of dropped records, the discarded file or None)``.

    Raises:
      OSError: ``path`` or its directory cannot be read or written.
    """
    if not os.path.exists(path):
        return 0, None
    with open(path) as f:
        lines = f.readlines()
    keep, dropped = [], []
    for n, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except ValueError:
            if n == len(lines) and not line.endswith("\n"):
                continue  # cut short by a killed writer: never kept mid-file
            record = None
        record_step = record.get("step") if isinstance(record, dict) else None
        late = isinstance(record_step, (int, float)) and record_step > step
        (dropped if late else keep).append(line if line.endswith("\n") else line + "\n")
    if not dropped:
        return 0, None
    discarded = f"{path}.discarded-{step}"
    with open(discarded, "a") as f:
        f.writelines(dropped)
        f.flush()
        os.fsync(f.fileno())
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)),
                               prefix=os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.writelines(keep)
            f.flush()
            os.fsync(f.fileno())
        # mkstemp's file is 0600: the rewrite keeps the record's own permissions (0644 under
        # the usual umask), so collaborators who could read the run's metrics still can.
        os.chmod(tmp, os.stat(path).st_mode & 0o7777)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return len(dropped), discarded


def write_problem(workdir: str) -> Optional[str]:
    """Why orbax could not write a checkpoint into ``<workdir>/checkpoints``, or ``None``.

    Orbax creates each step's directory in a background thread and waits for it with a
    5-minute timeout: in a directory that refuses new entries (``chattr +i``, a read-only
    mount, no permission) a run trained to its first save, hung there, then failed with a
    ``TimeoutError`` that hid the cause. The writer calls this at its start instead. The probe
    makes and removes a directory there, as orbax would (``os.access`` says yes to root,
    whatever the directory's attributes).

    Args:
      workdir: the run's directory (writable: the caller holds its lock file).

    Returns:
      ``"cannot write the checkpoint directory <dir> (Operation not permitted)"`` (or ``(it
      exists and is not a directory)``), or ``None``
      when the probe succeeded or ``<workdir>/checkpoints`` does not exist yet (orbax creates it
      in the writable workdir).
    """
    directory = os.path.join(workdir, "checkpoints")
    try:
        _probe_writable(directory)
    except OSError as e:
        return f"cannot write the checkpoint directory {directory} ({e.strerror or e})"
    return None


def _probe_writable(directory: str) -> None:
    """Makes and removes a directory in ``directory`` (nothing when it does not exist).

    Raises:
      OSError: the system's refusal (``Operation not permitted``, ``Read-only file system``),
        or ``ENOTDIR`` when ``directory`` exists and is no directory (a file named
        ``checkpoints``: orbax printed a long traceback at start and failed at the first save
        with a bare ``Not a directory``).
    """
    if os.path.lexists(directory) and not os.path.isdir(directory):
        raise NotADirectoryError(errno.ENOTDIR, "it exists and is not a directory", directory)
    if os.path.isdir(directory):
        os.rmdir(tempfile.mkdtemp(prefix=".write-probe-", dir=directory))


def saved_steps(workdir: str) -> List[int]:
    """Steps of the checkpoints in ``<workdir>/checkpoints``, ascending, read from the directory
    names alone (no orbax manager, nothing created): an orbax step directory is named by its
    step; temporary and set-aside ones (``5.orbax-checkpoint-tmp-...``, ``5.unreadable-...``)
    are not steps. ``[]`` when the directory does not exist.
    """
    try:
        names = os.listdir(os.path.join(workdir, "checkpoints"))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(int(n) for n in names if n.isdigit())


def _val_loss(metrics: Dict[str, float]) -> float:
    """The metric ``keep_best`` ranks checkpoints by (lower is better)."""
    return metrics["val_loss"]


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
                get_metric_fn=_val_loss, reverse=True, n=1,
                keep_checkpoints_without_metrics=False))
        # best_fn: orbax writes a checkpoint's metrics to disk only when it is set (without
        # it BestN ranked the steps of this process alone: the best one saved before a
        # restart had no metrics, and the restarted run deleted it).
        best = dict(best_fn=_val_loss, best_mode="min") if keep_best else {}
        options = ocp.CheckpointManagerOptions(
            create=True, enable_async_checkpointing=async_save, cleanup_tmp_directories=cleanup_tmp,
            preservation_policy=preservation_policy.AnyPreservationPolicy(policies), **best)
        self.manager = ocp.CheckpointManager(
            self.directory, options=options, item_names=("state", "data_iter"))
        self._keep_best = keep_best  # (without best_fn, orbax's best_step is the latest)
        self._writing = None  # the step of the asynchronous save in flight, if any
        self._cleanup_tmp = cleanup_tmp
        _install_save_error_filters()  # a failed write: one line, not orbax's tracebacks
        self._failed = set()  # steps whose write failed: their partial files go at close()

    def _write_failed(self, step: int, error: Exception) -> CheckpointWriteError:
        self._failed.add(step)
        return CheckpointWriteError(
            f"the checkpoint at step {step} in {self.directory} could not be written "
            f"({describe_write_error(error)})", step)

    def _finish_writing(self) -> None:
        """Waits for the save in flight; its failure raised as :class:`CheckpointWriteError`."""
        step, self._writing = self._writing, None
        try:
            self.manager.wait_until_finished()
        except (OSError, ValueError) as e:  # tensorstore's failed writes are ValueErrors
            if step is None or isinstance(e, CheckpointError) or not _is_write_failure(e):
                if step is not None:
                    _SAVE_ERRORS.release()
                raise
            _SAVE_ERRORS.drop()  # the one line below says it
            raise self._write_failed(step, e) from e
        except BaseException:
            if step is not None:
                _SAVE_ERRORS.release()
            raise
        if step is not None:
            _SAVE_ERRORS.release()

    def latest_step(self) -> Optional[int]:
        """The newest complete checkpoint's step, or ``None``."""
        return self.manager.latest_step()

    def best_step(self) -> Optional[int]:
        """With ``keep_best``: the step of the checkpoint with the lowest ``val_loss`` among
        those saved with metrics (also before a restart: orbax keeps them on disk), or
        ``None`` when none has metrics; ``None`` without ``keep_best``."""
        return self.manager.best_step() if self._keep_best else None

    def save(self, step: int, state: PyTree, data_iter: Any = None, *,
             metrics: Optional[Dict[str, float]] = None, force: bool = True) -> bool:
        """Saves ``state`` (a pytree of arrays) and, if given, the grain iterator at ``step``.

        ``metrics`` (e.g. ``{"val_loss": 3.2}``) rank the checkpoint for ``keep_best``.

        Raises:
          CheckpointWriteError: this step, or the asynchronous save before it, could not be
            written (naming that step and the OS's reason).
        """
        items = {"state": ocp.args.StandardSave(state)}
        if data_iter is not None:
            items["data_iter"] = grain.checkpoint.CheckpointSave(data_iter)
        metrics = None if metrics is None else {k: float(v) for k, v in metrics.items()}
        self._finish_writing()  # the previous save's failure names its own step
        if self._cleanup_tmp and jax.process_index() == 0:
            # A directory made read-only since the start: one line now, not orbax's 5-minute
            # wait for the step directory it cannot create, then a TimeoutError.
            try:
                _probe_writable(self.directory)
            except OSError as e:
                raise self._write_failed(step, e) from e
        _SAVE_ERRORS.hold()  # until _finish_writing: released, or dropped for the one line
        try:
            saved = self.manager.save(step, args=ocp.args.Composite(**items), metrics=metrics,
                                      force=force)
        except (OSError, ValueError) as e:
            if not _is_write_failure(e):
                _SAVE_ERRORS.release()
                raise
            _SAVE_ERRORS.drop()
            raise self._write_failed(step, e) from e
        except BaseException:
            _SAVE_ERRORS.release()
            raise
        self._writing = step
        return saved

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

    def restore_part(self, step: int, abstract_part: Dict[str, PyTree]) -> Dict[str, PyTree]:
        """Restores only some top-level entries of the state saved at ``step``.

        E.g. ``{"params": abstract_params}`` reads the parameters of a ``{"params", "opt_state",
        "step"}`` state without knowing the optimizer state's layout (orbax's
        ``PyTreeRestore(partial_restore=True)``).

        Args:
          step: a saved step.
          abstract_part: ``{key: pytree of jax.ShapeDtypeStruct}`` for some keys of the saved
            state; a leaf without a ``sharding`` lands on the default device.

        Returns:
          ``{key: restored pytree}`` for the keys of ``abstract_part``.

        Raises:
          FileNotFoundError: if no checkpoint exists at ``step``.
          ValueError: from orbax, if a requested entry does not match the saved one.
        """
        if step not in self.manager.all_steps():
            raise FileNotFoundError(f"no checkpoint for step {step} in {self.directory}")
        default = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        restore_args = jax.tree_util.tree_map(
            lambda a: ocp.ArrayRestoreArgs(sharding=getattr(a, "sharding", None) or default,
                                           dtype=a.dtype), abstract_part)
        args = ocp.args.PyTreeRestore(item=abstract_part, restore_args=restore_args,
                                      partial_restore=True)
        restored = self.manager.restore(step, args=ocp.args.Composite(state=args))
        return {k: restored["state"][k] for k in abstract_part}

    def restore_step(self, step: int, abstract_state: PyTree, data_iter: Any = None, *,
                     mismatch_advice: str = MISMATCH_ADVICE) -> PyTree:
        """:meth:`restore`, with an unreadable checkpoint reported as one line.

        Raises:
          FileNotFoundError: if no checkpoint exists at ``step``.
          CheckpointMismatchError: if it is readable but of a different model (its tree of
            arrays differs from ``abstract_state``; :meth:`mismatch`), the message ending in
            ``mismatch_advice``.
          RestoreOutOfMemoryError: the devices ran out of memory restoring it.
          CheckpointError: if it cannot be read (naming the step and the reason).
        """
        if step not in self.manager.all_steps():
            steps = ", ".join(map(str, sorted(self.manager.all_steps()))) or "none"
            raise FileNotFoundError(f"no checkpoint for step {step} in {self.directory} "
                                    f"(steps: {steps})")
        why = self._missing_metadata(step)
        if not why:
            with _QuietFailedReads() as quiet:
                try:
                    return self.restore(step, abstract_state, data_iter)
                except Exception as e:  # noqa: BLE001 - orbax/grain/tensorstore raise many types
                    quiet.failed = True
                    self._raise_if_out_of_memory(step, e)
                    why = describe_error(e)
            self._raise_if_mismatch(step, abstract_state, mismatch_advice)
        raise CheckpointError(f"checkpoint at step {step} in {self.directory} is unreadable "
                              f"({why})")

    def restore_latest(self, abstract_state: PyTree, data_iter: Any = None, *,
                       report: Callable[[str], None] = print, set_aside: bool = False,
                       mismatch_advice: str = MISMATCH_ADVICE,
                       unreadable_advice: str = UNREADABLE_ADVICE) -> Tuple[int, PyTree]:
        """Restores the newest readable checkpoint, falling back past unreadable ones.

        Each unreadable step costs one ``report`` line naming the step and the reason. With
        ``set_aside`` (only the process that writes the run), the unreadable steps newer than
        the one restored are renamed ``<step>.unreadable-<time>`` (kept, never deleted), so that
        the resumed run can save those steps again. When no step can be read nothing is
        renamed: the cause may be the code or the target rather than the files. A step that is
        readable but of a different model (:meth:`mismatch`) ends the search at once: the config
        is wrong, not the files, so nothing is renamed and no older step is tried.

        Args:
          abstract_state: as for :meth:`restore`.
          data_iter: as for :meth:`restore`; restored with the same step's state.
          report: where the one-line notices go.
          set_aside: rename the unreadable steps newer than the restored one.
          mismatch_advice: what ends a :class:`CheckpointMismatchError`'s message.
          unreadable_advice: what ends the message when no step can be read (the trainer's
            default names ``--workdir``; a reader such as ``evaluate.py`` has none).

        Returns:
          ``(step, state)``.

        Raises:
          FileNotFoundError: if there is no checkpoint at all.
          CheckpointMismatchError: the newest step that is not unreadable holds a different
            model, e.g. "the checkpoint at step 4 in <dir> is of a different model (its
            parameter tree/shapes do not match this config: <first difference>); <advice>",
            followed, when newer steps were unreadable, by ". Newer and unreadable: step 6
            (<reason>), left in place (...)" (nothing is renamed).
          RestoreOutOfMemoryError: the devices ran out of memory restoring a step (it is not
            called unreadable; nothing is renamed, no older step tried).
          CheckpointError: if no checkpoint can be read (every step's reason, in one line).
        """
        steps = sorted(self.manager.all_steps(), reverse=True)
        if not steps:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        failures = []
        for step in steps:
            why = self._missing_metadata(step)
            if not why:
                with _QuietFailedReads() as quiet:
                    try:
                        state = self.restore(step, abstract_state, data_iter)
                    except Exception as e:  # noqa: BLE001 - orbax/grain/tensorstore: many types
                        quiet.failed = True
                        self._raise_if_out_of_memory(step, e)
                        why = describe_error(e)
                if why:
                    self._raise_if_mismatch(step, abstract_state, mismatch_advice, failures)
            if why:
                failures.append((step, why))
                continue
            for bad, why in failures:
                aside = f", set aside as {self.set_aside(bad, 'unreadable')}" if set_aside else ""
                report(f"checkpoint at step {bad} in {self.directory} is unreadable ({why})"
                       f"{aside}; falling back to step {step}")
            return step, state
        raise CheckpointError(
            f"no readable checkpoint in {self.directory}: " + "; ".join(
                f"step {step} ({why})" for step, why in failures) + ". " + unreadable_advice)

    def mismatch(self, step: int, abstract_state: PyTree) -> Optional[str]:
        """How step ``step``'s saved arrays differ from ``abstract_state`` in tree paths or
        shapes (:func:`describe_mismatch`), read from the checkpoint's metadata only; ``None``
        when they match or the metadata cannot be read (then the checkpoint is unreadable)."""
        if abstract_state is None:
            return None
        path = os.path.join(self.directory, str(step), "state")
        try:
            saved = ocp.StandardCheckpointHandler().metadata(epath.Path(path))
        except Exception:  # noqa: BLE001 - unreadable metadata: reported as unreadable
            return None
        return describe_mismatch(_leaf_shapes(getattr(saved, "tree", saved)),
                                 _leaf_shapes(abstract_state))

    def _raise_if_out_of_memory(self, step: int, error: Exception) -> None:
        if is_out_of_memory(error):
            raise RestoreOutOfMemoryError(
                f"out of device memory restoring the checkpoint at step {step} in "
                f"{self.directory} (it is intact; nothing was renamed): "
                f"{describe_error(error, limit=160)}", step) from error

    def _raise_if_mismatch(self, step: int, abstract_state: PyTree, advice: str,
                           newer_unreadable: List[Tuple[int, str]] = ()) -> None:
        why = self.mismatch(step, abstract_state)
        if not why:
            return
        newer = ""
        if newer_unreadable:  # both facts: the config to fix, and what the resume will skip
            steps = "; ".join(f"step {s} ({reason})" for s, reason in newer_unreadable)
            newer = (f". Newer and unreadable: {steps}, left in place (a run with the "
                     f"checkpoint's options sets "
                     f"{'it' if len(newer_unreadable) == 1 else 'them'} aside and resumes "
                     f"from step {step})")
        raise CheckpointMismatchError(
            f"the checkpoint at step {step} in {self.directory} is of a different model "
            f"(its parameter tree/shapes do not match this config: {why}); {advice}{newer}")

    def _missing_metadata(self, step: int) -> Optional[str]:
        """What orbax's own error would misreport (a missing ``_METADATA`` surfaces as a pytree
        structure mismatch), or ``None``."""
        path = os.path.join(self.directory, str(step), "state", "_METADATA")
        return None if os.path.exists(path) else "state/_METADATA is missing"

    def set_aside(self, step: int, why: str) -> str:
        """Renames step ``step``'s directory to ``<step>.<why>-<time>`` (out of orbax's
        listing; nothing is deleted) and returns the new name."""
        name = f"{step}.{why}-{time.strftime('%Y%m%d-%H%M%S')}"
        target, n = os.path.join(self.directory, name), 1
        while os.path.exists(target):
            n += 1
            target = os.path.join(self.directory, f"{name}-{n}")
        os.rename(os.path.join(self.directory, str(step)), target)
        self.manager.reload()
        return os.path.basename(target)

    def all_steps(self):
        return self.manager.all_steps()

    def reached_preemption(self, step: int) -> bool:
        """Whether a multi-host preemption notice asks every process to save at ``step``."""
        return self.manager.reached_preemption(step)

    def wait(self) -> None:
        """Blocks until pending asynchronous saves are on disk.

        Raises:
          CheckpointWriteError: the save in flight could not be written.
        """
        self._finish_writing()

    def close(self) -> None:
        """Waits for pending saves and the start-up cleanup of temporary directories, then
        closes the manager.

        orbax's ``close`` does not wait for that cleanup (``cleanup_tmp=True``), which runs in a
        background thread from the constructor on: a run refused right after the manager was made
        exited with it still running, and it printed "cannot schedule new futures after
        interpreter shutdown" (about 1 run in 5).

        A writer (``cleanup_tmp``) then removes the partial files of any save that could not
        be written (``<step>.orbax-checkpoint-tmp``; on a full disk that frees the space).

        Raises:
          CheckpointWriteError: the save in flight could not be written (the manager is
            closed all the same).
        """
        await_cleanup = getattr(self.manager, "_maybe_await_cleanup_tmp_directory", None)
        if await_cleanup is not None:  # a private orbax method: absent in other versions
            await_cleanup()
        try:
            self._finish_writing()
        finally:
            self.manager.close()
            self._remove_failed_writes()

    def _remove_failed_writes(self) -> None:
        """Removes the temporary directories of the steps whose write failed (what the next
        writer's start-up cleanup would remove), at once: on a full disk that frees the space.
        Only the writer (``cleanup_tmp``) on the primary process; best effort."""
        if not (self._cleanup_tmp and self._failed) or jax.process_index() != 0:
            return
        for name in os.listdir(self.directory):
            step = name.split(".", 1)[0]
            if ".orbax-checkpoint-tmp" in name and step.isdigit() and int(step) in self._failed:
                shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)
