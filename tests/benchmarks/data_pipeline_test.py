"""benchmarks/data_pipeline.py: a missing --corpus is one usage line, not a traceback."""

import contextlib
import io

from absl.testing import absltest

from benchmarks import data_pipeline


class ParseArgsTest(absltest.TestCase):

    def test_missing_corpus_is_one_usage_line(self):
        # 2026-12-05 newcomer pass: the module docstring's --corpus=../shared/data/lm does not
        # exist on a fresh clone; the run ended in a FileNotFoundError from prepare_corpus.
        here = self.create_tempdir().full_path
        err = io.StringIO()
        with contextlib.redirect_stderr(err), self.assertRaises(SystemExit) as exit_:
            data_pipeline._parse_args([f"--corpus={here}", "--corpus=/nonexistent/lm"])
        self.assertEqual(exit_.exception.code, 2)
        last = err.getvalue().strip().splitlines()[-1]
        self.assertTrue(last.endswith(": error: --corpus: no such file or directory: "
                                      "/nonexistent/lm"), last)
        self.assertEqual(data_pipeline._parse_args([f"--corpus={here}"]).corpus, [here])


if __name__ == "__main__":
    absltest.main()
