"""Append-only JSON-lines record files: one reader and one writer for every resumable record;
the small file-system guards the record writers share (:func:`pid_lock`, a run's or a
sweep's one-writer lock; :func:`unwritable_dir`, an output directory checked before the work);
and :func:`field_diffs`, how two recorded configs differ.

A program killed mid-write (SIGKILL, an OOM, a machine taken back) can leave the last line of a
file it appends to cut short. :func:`read_records` drops such a line (the last line, not valid
JSON and without its newline) with one warning naming the file (once per process for the same
cut: a sweep re-reads its files often), so that the program resumes
from the records before it; a bad line anywhere else is an error (:class:`RecordsError`), since
no killed writer leaves one there when every append goes through :func:`append_record`, which
first removes a cut-short last line (the one the reader dropped) instead of writing after it
(a plain ``open(path, "a")`` would glue the next record to it, into one bad line in the middle).

``lenient=True`` is for files that may hold lines written before every writer went through
:func:`append_record` (the trainer's ``metrics.jsonl`` and ``invocations.jsonl`` of older runs,
where a plain append glued a record to a cut-short line): bad lines anywhere are skipped, with
one warning per file saying how many (likewise once per process for the same file contents).
"""

import contextlib
import fcntl
import json
import os
import threading
from typing import Any, Hashable, List, Optional, Tuple

from absl import logging

# What this process has warned about (_warn_once): re-reading a file with the same cut (or the
# same skipped lines) says nothing new.
_WARNED = set()
_WARNED_LOCK = threading.Lock()


def _warn_once(key: Hashable, message: str, *args: Any) -> None:
    """absl ``logging.warning(message, *args)`` the first time this process sees ``key``."""
    with _WARNED_LOCK:
        if key in _WARNED:
            return
        _WARNED.add(key)
    logging.warning(message, *args)


class RecordsError(ValueError):
    """A record file with a bad line that is not a cut-short last line; the message names the
    file and the line (``<path>, line <n>: not valid JSON (...)``)."""


def read_records(path: str, *, lenient: bool = False) -> List[Any]:
    """The records of an append-only JSON-lines file, in file order.

    Blank lines are skipped. The last line, when it is not valid JSON and the file does not
    end with a newline (a writer killed mid-record), is dropped with one warning naming the
    file (absl ``logging.warning``). The warning is given once per process for one cut: a read
    of the same file (by absolute path) with the cut line at the same byte offset and the same
    file size warns no more; a new cut (after an append, or a longer cut line) warns again.
    The same holds for ``lenient``'s warning (same file size, same first skipped line).

    Args:
      path: the file; a missing file has no records.
      lenient: also skip bad lines elsewhere (one warning with their count) instead of raising.

    Returns:
      One parsed JSON value per kept line (``[]`` when ``path`` does not exist).

    Raises:
      RecordsError: (``lenient=False``) a line other than a cut-short last line is not valid
        JSON, or the file is not UTF-8 text.
      OSError: ``path`` exists but cannot be read.
    """
    if not os.path.exists(path):
        return []
    with open(path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        if not lenient:
            raise RecordsError(f"{path}: not UTF-8 text ({e})") from e
        text = data.decode("utf-8", errors="replace")
    lines = text.split("\n")  # the last item is "" when the file ends with a newline
    records, skipped = [], []
    where = os.path.abspath(path)
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            if n == len(lines):  # no newline after it: cut short by a killed writer
                cut = len(line.encode())
                _warn_once((where, "cut", len(data), len(data) - cut),
                           "%s: dropped its last line, cut short (%d bytes, not valid JSON; a "
                           "writer killed mid-record)", path, cut)
            elif lenient:
                skipped.append(n)
            else:
                raise RecordsError(f"{path}, line {n}: not valid JSON ({e})") from e
    if skipped:
        _warn_once((where, "skipped", len(data), skipped[0]),
                   "%s: skipped %d line(s) that are not valid JSON (first: line %d)",
                   path, len(skipped), skipped[0])
    return records


def append_record(path: str, record: Any, *, sync: bool = False) -> None:
    """Appends ``record`` as one JSON line to ``path`` (created if missing).

    A cut-short last line (no newline at the end of the file and not valid JSON: a writer
    killed mid-record, which :func:`read_records` drops with a warning) is removed first
    (logged at ``INFO``), so the file stays whole lines; a valid last record without its
    newline (a file written by another tool) is kept and the newline added. The file is
    locked (``flock``) while it is checked and written, so two appenders cannot remove each
    other's records.

    Args:
      path: the file.
      record: a JSON-serialisable value (values JSON cannot hold are written as ``str``).
      sync: also ``fsync`` the file (a record that must survive a power loss).

    Raises:
      OSError: the file cannot be written.
    """
    line = (json.dumps(record, default=str) + "\n").encode()
    with open(path, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)  # released when the file is closed
        end = f.seek(0, os.SEEK_END)
        if end > 0:
            f.seek(end - 1)
            if f.read(1) != b"\n":  # no newline at the end
                f.seek(0)
                data = f.read()
                start = data.rfind(b"\n") + 1
                try:
                    json.loads(data[start:])
                except ValueError:  # cut short: back to the newline before it (the reader
                    # warned when it dropped the line; here it is only logged)
                    logging.info("%s: removed its last line, cut short (%d bytes, not valid "
                                 "JSON; a writer killed mid-record)", path, end - start)
                    f.truncate(start)
                else:  # a whole record without its newline
                    line = b"\n" + line
        f.write(line)
        f.flush()
        if sync:
            os.fsync(f.fileno())


def field_diffs(recorded: Any, now: Any, prefix: str = "",
                missing: Any = None) -> List[Tuple[str, Any, Any]]:
    """``(field, recorded, now)`` for every leaf of two nested config dicts (a recorded
    ``config.json`` or invocation and the config now) that differs, in sorted field order;
    ``field`` is ``prefix`` (ending in ``.``) plus the dotted keys, and a key one side lacks
    holds ``missing`` there. Two values that are not both dicts are one leaf."""
    if not (isinstance(recorded, dict) and isinstance(now, dict)):
        return [] if recorded == now else [(prefix[:-1], recorded, now)]
    out = []
    for key in sorted(set(recorded) | set(now)):
        out += field_diffs(recorded.get(key, missing), now.get(key, missing),
                           f"{prefix}{key}.", missing)
    return out


def existing_ancestor(path: str) -> str:
    """``path`` made absolute, or its nearest ancestor that exists (``/`` at the latest)."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    return probe


def unwritable_dir(path: str) -> Optional[str]:
    """Why the directory ``path`` (existing or to be made) cannot be written, or ``None``: a
    part of it that is a file, or the nearest existing directory not writable (a read-only file
    system, no permission)."""
    probe = existing_ancestor(path)
    if not os.path.isdir(probe):
        return f"{probe} is a file, not a directory"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} cannot be written"
    return None


class LockHeld(Exception):
    """:func:`pid_lock`: another process holds the lock; ``owner`` is the pid its file records
    (``"unknown"`` when empty)."""

    def __init__(self, owner: str):
        super().__init__(owner)
        self.owner = owner


def _names_open_file(f, path: str) -> bool:
    """Whether ``path`` names the file ``f`` has open (the same device and inode): ``False``
    when ``path`` is gone or names another file (the one ``f`` has open was deleted)."""
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(f.fileno())
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


@contextlib.contextmanager
def pid_lock(path: str, *, remove: bool = False):
    """Holds an exclusive ``flock`` on the file ``path`` (created if missing, then holding this
    process's pid) for the ``with`` block. The kernel drops the lock when the process ends,
    however it ends, so a killed holder leaves no stale lock.

    With ``remove``, the holder deletes ``path`` when the block ends, however it ends (a
    return or an exception), before it releases the lock: the file exists only while a holder
    runs, or after a killed one (unlocked; the next taker takes it over). A taker that opened
    the file before it was deleted gets the lock on a deleted file once it is released, while
    a third process creates a new file at ``path`` and locks that one: two holders. So every
    taker, after locking, checks that ``path`` still names the file it locked
    (:func:`_names_open_file`) and otherwise opens ``path`` again (and a holder deletes only
    the file it holds).

    Args:
      path: the lock file.
      remove: delete ``path`` when the block ends (see above); ``False``: keep it.

    Raises:
      LockHeld: another process (or another open file of this one) holds it.
      OSError: the file cannot be opened or created (a read-only file system, no permission,
        a missing directory).
    """
    while True:
        f = open(path, "a+")
        try:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                locked = True
            except OSError:
                locked = False
            if _names_open_file(f, path):
                if locked:
                    break
                f.seek(0)
                raise LockHeld(f.read().strip() or "unknown")
        except BaseException:
            f.close()
            raise
        # A deleted file (locked or not: its taker opens path again too): open path again.
        f.close()
    try:
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        yield
    finally:
        if remove:
            with contextlib.suppress(OSError):  # best effort: the lock is released below anyway
                if _names_open_file(f, path):  # (not another taker's, should ours be gone)
                    os.unlink(path)
        f.close()  # releases the lock


def lock_owner(path: str) -> Optional[str]:
    """The pid recorded in the lock file ``path`` (``"unknown"`` when empty) while a process
    holds its :func:`pid_lock`, else ``None`` (no holder, or no file). Takes the lock for an
    instant to test it. A file deleted after this opened it (a holder with ``remove`` that
    ended) does not count: ``path`` is opened again."""
    while True:
        try:
            f = open(path, "r")
        except OSError:
            return None
        with f:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                if _names_open_file(f, path):
                    return f.read().strip() or "unknown"
                continue
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
            if _names_open_file(f, path):
                return None
