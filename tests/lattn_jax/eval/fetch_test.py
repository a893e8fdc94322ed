"""``lattn_jax.eval.fetch``: the pinned manifest and the download logic, offline.

Issue 32, trap 7: evaluation data could not be obtained from the repository. The download is
tested against the small committed fixtures (``testdata/eval_data``: the first items of each
real file, in the real formats) served as ``file://`` URLs, and the manifest against the layout
every loader reads.
"""

import hashlib
import os
import random
import re
import shutil
import tempfile

from absl.testing import absltest

from lattn_jax.eval import fetch
from lattn_jax.eval import niah
from lattn_jax.eval import runner
from lattn_jax.eval import tasks

FIXTURES = os.path.join(os.path.dirname(__file__), "testdata", "eval_data")
SHARED = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "..",
                                      "shared", "data"))


def fixture_manifest():
    """:data:`fetch.FILES` with the fixtures' bytes: same paths, ``file://`` origins."""
    out = []
    for entry in fetch.FILES:
        path = os.path.join(FIXTURES, *entry.path.split("/"))
        if not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            data = f.read()
        out.append(fetch.DataFile(path=entry.path, urls=("file://" + path,), size=len(data),
                                  sha256=hashlib.sha256(data).hexdigest(), group=entry.group,
                                  origin=entry.origin, license=entry.license))
    return out


class CountingFetcher:

    def __init__(self):
        self.urls = []

    def __call__(self, url):
        self.urls.append(url)
        return fetch.url_fetcher(url)


class ManifestTest(absltest.TestCase):

    def test_every_file_the_evaluation_reads_is_listed(self):
        paths = {f.path for f in fetch.FILES}
        for name in tasks.TASK_NAMES:
            for parts in tasks.TASK_FILES[name]:
                self.assertIn("eval/" + "/".join(parts), paths)
        for f in runner.EvalOptions(data_dir="x").perplexity_files:
            if f != runner.VALIDATION:
                self.assertIn(f, paths)
        self.assertIn("lm/wikitext-2-raw/wiki.test.raw", paths)
        self.assertEqual(sum(p.startswith("niah/PaulGrahamEssays/") for p in paths), 49)
        self.assertLen(paths, len(fetch.FILES))

    def test_origins_are_pinned_and_checksummed(self):
        for f in fetch.FILES:
            self.assertRegex(f.sha256, r"^[0-9a-f]{64}$")
            self.assertGreater(f.size, 0)
            github = [u for u in f.urls if "github" in u]
            self.assertTrue(github, f.path)
            for u in github:  # a commit, never a branch
                self.assertRegex(u, r"^https://raw\.githubusercontent\.com/[^/]+/[^/]+/"
                                    r"[0-9a-f]{40}/", f.path)
        self.assertIn(f"`{fetch.FILES[0].path}`", fetch.sources_table())

    @absltest.skipUnless(os.path.isdir(SHARED), "no local copy of the data")
    def test_checksums_match_the_local_copy(self):
        out = tempfile.mkdtemp()
        status = fetch.fetch(out, mirror="file://" + SHARED, log=lambda *a: None)
        self.assertEqual(set(status.values()), {"fetched"})
        runner.check_data(runner.expand_tasks(["all"]),
                          runner.EvalOptions(data_dir=out,
                                             perplexity_files=("lm/wikitext-2-raw/wiki.test.raw",)))


class WriteAtomicTest(absltest.TestCase):

    def test_the_file_gets_the_umask_s_mode_not_mkstemp_s(self):
        path = os.path.join(self.create_tempdir().full_path, "sub", "report.json")
        for mask, want in ((0o022, 0o644), (0o077, 0o600)):
            old = os.umask(mask)
            try:
                fetch.write_atomic(path, "{}" + str(mask))
            finally:
                os.umask(old)
            self.assertEqual(os.stat(path).st_mode & 0o777, want, oct(mask))
            with open(path) as f:
                self.assertEqual(f.read(), "{}" + str(mask))
        self.assertEqual(os.listdir(os.path.dirname(path)), ["report.json"])  # no temporaries


class FetchTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.out = tempfile.mkdtemp()
        self.files = fixture_manifest()

    def test_writes_the_layout_every_loader_reads(self):
        status = fetch.fetch(self.out, self.files, log=lambda *a: None)
        self.assertEqual(set(status.values()), {"fetched"})
        for name in tasks.TASK_NAMES:
            self.assertNotEmpty(tasks.load_task(name, os.path.join(self.out, "eval")))
        self.assertNotEmpty(niah.load_essays(os.path.join(self.out, "niah", "PaulGrahamEssays")))
        runner.check_data(runner.expand_tasks(["zeroshot", "niah"]),
                          runner.EvalOptions(data_dir=self.out))
        with open(os.path.join(self.out, "lm", "wikitext-2-raw", "wiki.test.raw"), "rb") as f:
            self.assertIn(b"\r\n", f.read())  # bytes kept as in the origin (CRLF)

    def test_present_files_are_kept_and_corrupt_ones_replaced(self):
        fetch.fetch(self.out, self.files, log=lambda *a: None)
        corrupt = os.path.join(self.out, "eval", "piqa", "valid-labels.lst")
        with open(corrupt, "w") as f:
            f.write("1\n")
        fetcher = CountingFetcher()
        status = fetch.fetch(self.out, self.files, fetcher=fetcher, log=lambda *a: None)
        self.assertEqual(status["eval/piqa/valid-labels.lst"], "replaced")
        self.assertLen(fetcher.urls, 1)
        self.assertEqual({v for k, v in status.items() if k != "eval/piqa/valid-labels.lst"},
                         {"present"})
        self.assertTrue(fetch.verified(corrupt, next(f for f in self.files
                                                     if f.path == "eval/piqa/valid-labels.lst")))

    def test_a_bad_checksum_writes_nothing_and_names_the_file(self):
        bad = [f for f in self.files if f.group == "lm"]
        bad[0] = fetch.DataFile(**dict(vars(bad[0]), sha256="0" * 64))
        with self.assertRaisesRegex(fetch.FetchError, re.escape(bad[0].path)) as ctx:
            fetch.fetch(self.out, bad, log=lambda *a: None)
        self.assertIn("sha256", str(ctx.exception))
        self.assertFalse(os.path.exists(os.path.join(self.out, *bad[0].path.split("/"))))
        self.assertTrue(os.path.exists(os.path.join(self.out, *bad[1].path.split("/"))))
        leftovers = [n for _, _, names in os.walk(self.out) for n in names if n.startswith(".")]
        self.assertEqual(leftovers, [])

    def test_falls_back_to_the_next_url_and_uses_a_mirror(self):
        entry = self.files[0]
        two = [fetch.DataFile(**dict(vars(entry), urls=("file:///no/such/file",) + entry.urls))]
        self.assertEqual(fetch.fetch(self.out, two, log=lambda *a: None),
                         {entry.path: "fetched"})
        mirror = tempfile.mkdtemp()
        shutil.copytree(FIXTURES, mirror, dirs_exist_ok=True)
        fetcher = CountingFetcher()
        fetch.fetch(tempfile.mkdtemp(), self.files, groups=["niah"], fetcher=fetcher,
                    mirror="file://" + mirror, log=lambda *a: None)
        self.assertTrue(fetcher.urls)
        self.assertTrue(all(u.startswith("file://" + mirror + "/niah/") for u in fetcher.urls))

    def test_a_plain_directory_path_is_a_mirror(self):
        # --mirror=/work/shared/data failed with "unknown url type" for every file.
        mirror = tempfile.mkdtemp()
        shutil.copytree(FIXTURES, mirror, dirs_exist_ok=True)
        fetcher = CountingFetcher()
        status = fetch.fetch(tempfile.mkdtemp(), self.files, groups=["niah"], fetcher=fetcher,
                             mirror=mirror, log=lambda *a: None)
        self.assertTrue(fetcher.urls)
        self.assertTrue(all(u.startswith("file://" + mirror + "/niah/") for u in fetcher.urls))
        self.assertEqual(set(status.values()), {"fetched"})
        self.assertEqual(fetch.mirror_url("https://example.org/copy"),
                         "https://example.org/copy")
        missing = os.path.join(mirror, "no_such_dir")
        with self.assertRaisesRegex(ValueError, f"^--mirror={missing}: no such directory"):
            fetch.fetch(self.out, self.files, mirror=missing, log=lambda *a: None)

    def test_a_missing_file_url_mirror_is_named_before_any_file(self):
        # --mirror=file:///tmp/nope failed every file, then advised passing --mirror=file://...
        missing = os.path.join(tempfile.mkdtemp(), f"copy{random.randint(0, 999)}")
        fetcher = CountingFetcher()
        with self.assertRaises(ValueError) as ctx:
            fetch.fetch(self.out, self.files, fetcher=fetcher, mirror="file://" + missing,
                        log=lambda *a: None)
        self.assertEqual(str(ctx.exception), (
            f"--mirror=file://{missing}: no such directory {missing} (a file:// URL names a "
            f"local copy of the layout)"))
        self.assertEqual(fetcher.urls, [])

    def test_no_network_gives_one_line_with_the_mirror_hint(self):
        def offline(url):
            raise OSError(f"[Errno -3] Temporary failure in name resolution: {url}")

        with self.assertRaises(fetch.FetchError) as ctx:
            fetch.fetch(self.out, self.files, fetcher=offline, log=lambda *a: None)
        message = str(ctx.exception)
        self.assertEqual(len(message.splitlines()), 1)
        self.assertRegex(message, rf"^no URL could be reached for {len(self.files)} file\(s\) "
                                  r"\(first error: .*name resolution.*--mirror=file://")

    def test_unknown_group(self):
        with self.assertRaisesRegex(ValueError, "unknown data group"):
            fetch.fetch(self.out, self.files, groups=["evals"])


if __name__ == "__main__":
    absltest.main()
