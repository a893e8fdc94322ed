"""``lattn_jax.eval.runner``: held-out documents for perplexity."""

import os
import tempfile

from absl.testing import absltest

from lattn_jax.eval import runner


class ReadDocumentsTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.tmp = tempfile.mkdtemp()

    def write(self, name, text):
        path = os.path.join(self.tmp, name)
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        return path

    def test_wikitext_is_split_into_articles_with_lf_line_ends(self):
        text = (" \r\n = Alpha = \r\n \r\n Alpha text . \r\n = = Section = = \r\n more . \r\n"
                " = Beta = \r\n Beta text . \r\n")
        docs = runner.read_documents(self.write("wiki.test.raw", text), None)
        self.assertEqual(len(docs), 2)
        self.assertTrue(docs[0].startswith(" = Alpha = \n"))
        self.assertIn(" = = Section = = \n", docs[0])  # subsections stay in their article
        self.assertTrue(docs[1].startswith(" = Beta = \n"))
        self.assertNotIn("\r", "".join(docs))
        self.assertEqual(runner.read_documents(self.write("wiki.x.raw", text), 1), docs[:1])

    def test_other_files_are_one_document(self):
        text = "First line.\n\nSecond paragraph.\n"
        self.assertEqual(runner.read_documents(self.write("essay.txt", text), None), [text])

    def test_missing_file_is_named(self):
        missing = os.path.join(self.tmp, "nope.txt")
        with self.assertRaisesRegex(FileNotFoundError, "nope.txt"):
            runner.read_documents(missing, None)


if __name__ == "__main__":
    absltest.main()
