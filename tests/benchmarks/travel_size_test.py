"""benchmarks/travel_size.py: the bytes one GPU-machine call would carry, on a small git
checkout built here (tracked, untracked, ignored and carried files of known sizes)."""

import contextlib
import io
import os
import subprocess

from absl.testing import absltest

from benchmarks import travel_size


class TravelSizeTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.repo = self.create_tempdir().full_path
        subprocess.run(["git", "init", "-q", self.repo], check=True)
        sizes = {"tracked.txt": 1000, "sub/untracked.bin": 300, "ignored/piece.000": 5000,
                 "ignored/piece.001": 7, ".gitignore": 0}
        for name, size in sizes.items():
            os.makedirs(os.path.dirname(os.path.join(self.repo, name)), exist_ok=True)
            with open(os.path.join(self.repo, name), "wb") as f:
                f.write(os.urandom(size) if size else b"/ignored/\n")
        subprocess.run(["git", "-C", self.repo, "add", "tracked.txt", ".gitignore"], check=True)

    def test_tree_counts_tracked_and_untracked_but_not_ignored_files(self):
        tree, carried = travel_size.travel(self.repo, ["ignored/piece.000", "ignored"])
        self.assertEqual(tree, 1000 + 300 + len(b"/ignored/\n"))
        self.assertEqual(carried, [("ignored/piece.000", 5000), ("ignored", 7)])  # no double count

    def test_links_shared_and_tracked_carry_are_not_counted_twice(self):
        os.symlink(os.path.join(self.repo, "ignored", "piece.000"),
                   os.path.join(self.repo, "ignored", "link"))
        os.makedirs(os.path.join(self.repo, "shared"))
        with open(os.path.join(self.repo, "shared", "data"), "wb") as f:
            f.write(os.urandom(40))
        with open(os.path.join(self.repo, ".gitignore"), "a") as f:
            f.write("/shared/\n")
        tree, carried = travel_size.travel(
            self.repo, ["ignored/link", "tracked.txt", "ignored", "ignored/piece.001"])
        self.assertEqual(tree, 1000 + 300 + len(b"/ignored/\n/shared/\n") + 40)
        self.assertEqual(carried, [("ignored/link", 0), ("tracked.txt", 0), ("ignored", 5007),
                                   ("ignored/piece.001", 0)])

    def test_verdict_and_exit_status(self):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.assertEqual(travel_size.main(["--repo", self.repo, "ignored"]), 0)
        self.assertIn("fits", out.getvalue())
        big = os.path.join(self.repo, "ignored", "big")
        with open(big, "wb") as f:
            f.truncate(travel_size.LIMIT_BYTES)  # sparse: 64 MiB of size, no disk
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.assertEqual(travel_size.main(["--repo", self.repo, "ignored/big"]), 1)
        self.assertIn("does NOT fit", out.getvalue())
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            self.assertEqual(travel_size.main(["--repo", self.repo, "nope"]), 1)
        self.assertIn("error: carry nope: no such file or folder", err.getvalue())
        for outside in ("..", "/etc/hostname"):
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                self.assertEqual(travel_size.main(["--repo", self.repo, outside]), 1)
            self.assertIn(f"error: carry {outside}: not a path inside the repository",
                          err.getvalue())
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            self.assertEqual(travel_size.main(["--repo", self.create_tempdir().full_path]), 1)
        self.assertIn("not a git checkout", err.getvalue())


if __name__ == "__main__":
    absltest.main()
