"""lattn_jax.records: a last line cut short is dropped with a warning, others are errors."""

import fcntl
import json
import multiprocessing
import os
import random
import re
from unittest import mock

from absl import logging
from absl.testing import absltest

from lattn_jax import records

WHOLE = '{"a": 1}\n\n[2]\n'
CUT = '{"layer": 3, "csr": 0.5'  # a record cut mid-way by a killed writer


class ReadRecordsTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.path = os.path.join(self.create_tempdir().full_path, "r.jsonl")

    def write(self, text, mode="w"):
        with open(self.path, mode) as f:
            f.write(text)

    def read(self, **kw):
        with self.assertLogs(logging.get_absl_logger(), "WARNING") as logs:
            got = records.read_records(self.path, **kw)
        return got, logs.output

    def test_missing_and_whole_files(self):
        self.assertEqual(records.read_records(self.path), [])
        self.write(WHOLE)
        self.assertEqual(records.read_records(self.path), [{"a": 1}, [2]])

    def test_a_last_line_cut_short_is_dropped_with_one_warning_naming_the_file(self):
        self.write(WHOLE + CUT)
        got, warnings = self.read()
        self.assertEqual(got, [{"a": 1}, [2]])
        self.assertLen(warnings, 1)
        self.assertIn(f"{self.path}: dropped its last line, cut short", warnings[0])

    def test_the_same_cut_warns_once_per_process_and_a_new_cut_again(self):
        # A sweep re-reads its files often: the warning for one cut was repeated at every read.
        rng = random.Random(7)
        recs = [{"step": i, "loss": rng.uniform(1, 5)} for i in range(rng.randrange(1, 6))]
        self.write("".join(json.dumps(r) + "\n" for r in recs) + CUT[:rng.randrange(2, 20)])
        got, warnings = self.read()
        self.assertEqual((got, len(warnings)), (recs, 1))
        with self.assertNoLogs(logging.get_absl_logger(), "WARNING"):
            self.assertEqual(records.read_records(self.path), recs)
            # The same cut seen through another spelling of the path: still the same file.
            self.assertEqual(records.read_records(os.path.join(
                os.path.dirname(self.path), ".", os.path.basename(self.path))), recs)
        records.append_record(self.path, {"step": len(recs)})  # removes the cut line
        self.assertEqual(records.read_records(self.path), recs + [{"step": len(recs)}])
        self.write(CUT, "a")  # a new cut, at a new offset
        got, warnings = self.read()
        self.assertEqual((got, len(warnings)), (recs + [{"step": len(recs)}], 1))
        self.assertIn(f"{self.path}: dropped its last line, cut short ({len(CUT)} bytes",
                      warnings[0])
        with self.assertNoLogs(logging.get_absl_logger(), "WARNING"):
            records.read_records(self.path)
        self.write("x", "a")  # the cut line grew (another writer still writing): a new cut
        self.assertLen(self.read()[1], 1)
        # Another file with the same contents has its own warning.
        other = self.path + ".copy"
        with open(self.path) as src, open(other, "w") as dst:
            dst.write(src.read())
        with self.assertLogs(logging.get_absl_logger(), "WARNING") as logs:
            records.read_records(other)
        self.assertLen(logs.output, 1)
        self.assertIn(other, logs.output[0])

    def test_lenient_warns_once_for_the_same_skipped_lines(self):
        self.write(WHOLE + CUT + '{"b": 2}\n{"c": 3}\n')
        self.assertLen(self.read(lenient=True)[1], 1)
        with self.assertNoLogs(logging.get_absl_logger(), "WARNING"):
            self.assertEqual(records.read_records(self.path, lenient=True),
                             [{"a": 1}, [2], {"c": 3}])
        self.write('{oops}\n', "a")  # more bad lines: the file changed
        self.assertLen(self.read(lenient=True)[1], 1)

    def test_a_bad_line_elsewhere_is_an_error_naming_the_line(self):
        for text, line in ((WHOLE + CUT + "\n" + '{"b": 2}\n', 4), (WHOLE + CUT + "\n", 4),
                           ("{oops}\n" + WHOLE, 1)):
            self.write(text)
            with self.assertRaisesRegex(records.RecordsError, rf"^{re.escape(self.path)}, line "
                                                              rf"{line}: not valid JSON \(.+\)$"):
                records.read_records(self.path)
        self.write(b'{"a": "\xff"}\n', "wb")
        with self.assertRaisesRegex(records.RecordsError, r": not UTF-8 text"):
            records.read_records(self.path)

    def test_lenient_skips_bad_lines_anywhere_with_one_warning(self):
        self.write(WHOLE + CUT + '{"b": 2}\n{"c": 3}\n' + CUT)
        got, warnings = self.read(lenient=True)
        self.assertEqual(got, [{"a": 1}, [2], {"c": 3}])
        self.assertLen(warnings, 2)  # the cut last line, and the glued one (line 4)
        self.assertIn(f"{self.path}: skipped 1 line(s) that are not valid JSON (first: line 4)",
                      warnings[1])


class AppendRecordTest(absltest.TestCase):

    def test_appends_whole_lines_and_removes_a_cut_short_last_line_first(self):
        path = os.path.join(self.create_tempdir().full_path, "r.jsonl")
        records.append_record(path, {"a": 1})
        with open(path, "a") as f:
            f.write(CUT)
        records.append_record(path, {"b": 2}, sync=True)
        with open(path) as f:
            self.assertEqual(f.read(), '{"a": 1}\n{"b": 2}\n')
        with open(path, "w") as f:
            f.write(CUT)  # the only line
        records.append_record(path, {"c": 3})
        self.assertEqual(records.read_records(path), [{"c": 3}])
        records.append_record(path, {"d": object})  # not JSON: written as str
        self.assertEqual(records.read_records(path)[-1], {"d": str(object)})
        self.assertEqual(json.loads(json.dumps(records.read_records(path))), [
            {"c": 3}, {"d": str(object)}])

    def test_a_whole_last_record_without_its_newline_is_kept(self):
        # A file written by another tool (or an editor) without the final newline.
        path = os.path.join(self.create_tempdir().full_path, "r.jsonl")
        with open(path, "w") as f:
            f.write('{"step": 1}\n{"step": 2}')
        records.append_record(path, {"step": 3})
        self.assertEqual(records.read_records(path), [{"step": 1}, {"step": 2}, {"step": 3}])
        with open(path, "w") as f:
            f.write('{"only": 1}')  # the only line, whole
        records.append_record(path, {"next": 2})
        self.assertEqual(records.read_records(path), [{"only": 1}, {"next": 2}])

    def test_two_appenders_after_a_cut_short_line_keep_both_records(self):
        # Both open the file while its last line is cut short; the lock serialises the check,
        # the truncation and the write, so the second cannot cut the first's record.
        import threading  # noqa: PLC0415
        path = os.path.join(self.create_tempdir().full_path, "r.jsonl")
        with open(path, "w") as f:
            f.write('{"a": 1}\n' + CUT)
        threads = [threading.Thread(target=records.append_record, args=(path, {"n": n}))
                   for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        got = records.read_records(path)
        self.assertEqual(got[0], {"a": 1})
        self.assertCountEqual(got[1:], [{"n": n} for n in range(8)])


def _take_and_check(directory, tries):
    """:meth:`PidLockTest.test_processes_racing_for_the_lock_never_hold_it_together`'s worker:
    ``tries`` times, takes ``<directory>/.train.lock`` (``remove=True``) and, while holding it,
    creates ``<directory>/holder`` exclusively (deleted again before the release). Returns
    ``(locks taken, times another process held the lock too: the file was there)``."""
    lock, marker = os.path.join(directory, ".train.lock"), os.path.join(directory, "holder")
    taken = together = 0
    for _ in range(tries):
        try:
            with records.pid_lock(lock, remove=True):
                taken += 1
                try:
                    os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                except FileExistsError:
                    together += 1
                    continue
                os.unlink(marker)
        except records.LockHeld:
            pass
    return taken, together


class PidLockTest(absltest.TestCase):
    """pid_lock(remove=True) deletes its file when the block ends; a taker that opened the file
    before that (the race a deleted lock file opens) never becomes a second holder."""

    def setUp(self):
        super().setUp()
        self.path = os.path.join(self.create_tempdir().full_path, ".train.lock")
        self.pid = str(os.getpid())

    def opened_before_the_release(self, n=1):
        """Open files of ``self.path`` (``n`` of them, each its own open file description)
        taken while a remove=True holder holds it, which it then deleted on release: what a
        taker that lost the race has open. One file for ``n=1``, else a list."""
        with records.pid_lock(self.path, remove=True):
            stale = [open(self.path, "a+") for _ in range(n)]
        for f in stale:
            self.addCleanup(f.close)
        self.assertFalse(os.path.exists(self.path))  # deleted; they still have it open
        return stale[0] if n == 1 else stale

    def open_first(self, stale):
        """``records.open`` answering the next call with ``stale`` (the taker's own open of the
        path, made before the holder deleted it), then opening files as usual."""
        pending = [stale]

        def fake_open(*args, **kwargs):
            return pending.pop() if pending else open(*args, **kwargs)

        return mock.patch.object(records, "open", fake_open, create=True)

    def test_remove_deletes_the_file_when_the_block_ends_however_it_ends(self):
        with records.pid_lock(self.path, remove=True):
            with open(self.path) as f:
                self.assertEqual(f.read(), self.pid + "\n")
            self.assertEqual(records.lock_owner(self.path), self.pid)
        self.assertFalse(os.path.exists(self.path))
        self.assertIsNone(records.lock_owner(self.path))
        with self.assertRaises(KeyError):
            with records.pid_lock(self.path, remove=True):
                raise KeyError("x")
        self.assertFalse(os.path.exists(self.path))
        with records.pid_lock(self.path):  # without remove: kept (the sweep root's lock)
            pass
        self.assertTrue(os.path.exists(self.path))
        self.assertIsNone(records.lock_owner(self.path))

    def test_a_file_a_killed_holder_left_is_taken_over_and_deleted(self):
        with open(self.path, "w") as f:
            f.write("4242\n")  # no lock: its process is gone
        self.assertIsNone(records.lock_owner(self.path))
        with records.pid_lock(self.path, remove=True):
            self.assertEqual(records.lock_owner(self.path), self.pid)
        self.assertFalse(os.path.exists(self.path))

    def test_a_held_lock_is_refused_and_its_file_left_alone(self):
        with open(self.path, "w") as held:
            fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            held.write("4242\n")
            held.flush()
            with self.assertRaises(records.LockHeld) as raised:
                with records.pid_lock(self.path, remove=True):
                    self.fail("took a held lock")
            self.assertEqual(raised.exception.owner, "4242")
            self.assertTrue(os.path.exists(self.path))  # the holder's, not deleted

    def test_a_taker_that_opened_the_deleted_file_defers_to_the_new_holder(self):
        # The race: B opened the lock file, its holder A ended (deleting it, then unlocking),
        # C created a new file and locked it; B's flock on the deleted file then succeeds.
        stale = self.opened_before_the_release()
        with records.pid_lock(self.path, remove=True):  # C
            with self.open_first(stale), self.assertRaises(records.LockHeld) as raised:
                with records.pid_lock(self.path, remove=True):  # B
                    self.fail("a second holder: B locked the deleted file")
            self.assertEqual(raised.exception.owner, self.pid)  # C's pid
            self.assertTrue(os.path.exists(self.path))  # C's file, not deleted by B
            self.assertEqual(records.lock_owner(self.path), self.pid)
        self.assertFalse(os.path.exists(self.path))

    def test_a_taker_that_opened_the_deleted_file_locks_the_one_at_the_path(self):
        # No new holder: B creates the file at the path and holds that one, which the next
        # taker (and the sweep's lock_owner) then sees held.
        stale = self.opened_before_the_release()
        with self.open_first(stale):
            with records.pid_lock(self.path, remove=True):  # B
                self.assertTrue(os.path.exists(self.path))
                self.assertEqual(records.lock_owner(self.path), self.pid)
                with self.assertRaises(records.LockHeld):
                    with records.pid_lock(self.path, remove=True):
                        self.fail("a second holder")
        self.assertFalse(os.path.exists(self.path))

    def test_a_deleted_file_locked_by_another_loser_is_no_refusal(self):
        # B and D both opened the file before its holder deleted it; D locked the deleted file
        # (for the instant before it sees so): B's flock fails, but nobody holds the path's
        # lock, so B takes it instead of being refused in the ended holder's name.
        stale, other = self.opened_before_the_release(2)
        fcntl.flock(other.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # D
        with self.open_first(stale):
            with records.pid_lock(self.path, remove=True):  # B
                self.assertEqual(records.lock_owner(self.path), self.pid)
        self.assertFalse(os.path.exists(self.path))

    def test_processes_racing_for_the_lock_never_hold_it_together(self):
        # The race itself, between processes (~1 s on 2 cores). A version that only deleted
        # the file on release (no inode check) gave two holders 157 times in these 4 x 1500.
        directory = os.path.dirname(self.path)
        with multiprocessing.get_context("spawn").Pool(4) as pool:  # (no fork of jax)
            results = pool.starmap(_take_and_check, [(directory, 1500)] * 4)
        self.assertGreater(sum(taken for taken, _ in results), 0)
        self.assertEqual([together for _, together in results], [0] * 4)
        self.assertEqual(os.listdir(directory), [])  # the last holder deleted the file

    def test_lock_owner_looks_past_a_deleted_file_it_opened(self):
        # The sweep's probe opened the file before its holder deleted it: a flock on the
        # deleted file (free, or held by a losing taker) says nothing of the path's holder.
        stale, other = self.opened_before_the_release(2)
        with self.open_first(stale):
            self.assertIsNone(records.lock_owner(self.path))  # no file at the path now
        stale, other = self.opened_before_the_release(2)
        fcntl.flock(other.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # a losing taker's lock
        with self.open_first(stale):
            self.assertIsNone(records.lock_owner(self.path))
        stale, _ = self.opened_before_the_release(2)
        with records.pid_lock(self.path, remove=True):  # a new holder
            with self.open_first(stale):
                self.assertEqual(records.lock_owner(self.path), self.pid)


if __name__ == "__main__":
    absltest.main()
