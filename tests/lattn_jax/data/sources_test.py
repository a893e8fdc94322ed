"""Tests for lattn_jax.data.sources and lattn_jax.assets."""

import gzip
import json
import os
import tempfile

from absl.testing import absltest

from lattn_jax import assets
from lattn_jax.data import sources


def _write(path, text, mode="w", newline=None):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, mode, encoding="utf-8", newline=newline) as f:
        f.write(text)
    return path


class SplitTextTest(absltest.TestCase):

    def test_wikitext_crlf(self):
        text = (" = First = \r\n \r\n Body one . \r\n \r\n = = Section = = \r\n \r\n More . \r\n"
                " = Second = \r\n \r\n Body two . \r\n")
        root = self.enterContext(tempfile.TemporaryDirectory())
        path = _write(os.path.join(root, "w.raw"), text, newline="")
        docs = list(sources.read_text(path, "wikitext"))
        self.assertEqual(docs, ["= First = \n \n Body one . \n \n = = Section = = \n \n More .",
                                "= Second = \n \n Body two ."])
        self.assertNotIn("\r", "".join(docs))

    def test_wikitext_title_regex(self):
        self.assertTrue(sources.WIKITEXT_TITLE.match(" = Robert Boulter = "))
        self.assertTrue(sources.WIKITEXT_TITLE.match(" = X = "))
        self.assertFalse(sources.WIKITEXT_TITLE.match(" = = Career = = "))
        self.assertFalse(sources.WIKITEXT_TITLE.match(" = = = Sub = = = "))

    def test_other_splits(self):
        text = "a b\nc\n\n  \n\nd\n\ne\n"
        self.assertEqual(list(sources.split_text(text, "blank_line")), ["a b\nc", "d", "e"])
        self.assertEqual(list(sources.split_text(text, "line")), ["a b", "c", "d", "e"])
        self.assertEqual(list(sources.split_text(text, "file")), ["a b\nc\n\n  \n\nd\n\ne"])
        self.assertEqual(list(sources.split_text("  \n\n", "file")), [])


class ReadDocumentsTest(absltest.TestCase):

    def test_jsonl_plain_gz_and_directory(self):
        root = self.enterContext(tempfile.TemporaryDirectory())
        records = [{"text": "one"}, {"text": "  "}, {"text": "two", "id": 2}]
        _write(os.path.join(root, "a.jsonl"), "\n".join(json.dumps(r) for r in records) + "\n")
        with gzip.open(os.path.join(root, "b.jsonl.gz"), "wt", encoding="utf-8") as f:
            f.write(json.dumps({"body": "three"}) + "\n")
        _write(os.path.join(root, "sub", "c.txt"), "four\n\nfive\n")
        _write(os.path.join(root, "LICENSE.md"), "not data\n")
        self.assertEqual(list(sources.read_documents([os.path.join(root, "a.jsonl")])),
                         ["one", "two"])
        self.assertEqual(
            list(sources.read_documents([os.path.join(root, "b.jsonl.gz")], text_field="body")),
            ["three"])
        with self.assertRaisesRegex(ValueError, r"b\.jsonl\.gz:1: record has no field 'text'"):
            list(sources.read_documents([root]))
        os.remove(os.path.join(root, "b.jsonl.gz"))
        # Directory: sorted data files only (LICENSE.md is skipped), each with its own format.
        self.assertEqual(list(sources.read_documents([root])), ["one", "two", "four", "five"])

    def test_missing_path(self):
        with self.assertRaisesRegex(FileNotFoundError,
                                    "data.paths: no such file or directory: /no/such/file"):
            list(sources.read_documents(["/no/such/file"]))


class AssetsTest(absltest.TestCase):

    def test_bundled_files(self):
        for rel in ("corpus/wikitext-2-raw/wiki.valid.raw", "corpus/wikitext-2-raw/wiki.test.raw",
                    "corpus/wikitext-2-raw/LICENSE.md", assets.TINYSHAKESPEARE,
                    "corpus/tinyshakespeare/LICENSE.md", assets.LLAMA2_TOKENIZER,
                    "tokenizers/llama2/LICENSE.md"):
            path = assets.asset_path(rel)
            self.assertTrue(os.path.isabs(path) and os.path.isfile(path), path)
        self.assertEqual(os.path.getsize(assets.asset_path("corpus/wikitext-2-raw/wiki.valid.raw")),
                         1150606)

    def test_missing_asset(self):
        with self.assertRaisesRegex(FileNotFoundError, "nope/missing.txt"):
            assets.asset_path("nope/missing.txt")
        with self.assertRaises(ValueError):
            assets.asset_path("../setup.cfg")


if __name__ == "__main__":
    absltest.main()
