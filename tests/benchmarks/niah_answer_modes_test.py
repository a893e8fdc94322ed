"""Tests of benchmarks/niah_answer_modes.py on a hand-made report directory (byte tokenizer)."""

import contextlib
import io
import json
import os

from absl.testing import absltest

from benchmarks import niah_answer_modes as nam
from lattn_jax.data import tokenizers as tok_lib
from lattn_jax.halo import report as report_lib

OPTIONS = dict(niah_tasks=["niah_single_1"], niah_lengths=[448, 640], niah_depths=[25.0, 75.0],
               niah_samples=2, niah_seed=5, niah_max_new_tokens=8, data_dir="/nonexistent")


class NiahAnswerModesTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.dir = self.create_tempdir().full_path
        self.tok = tok_lib.make_tokenizer("byte")
        with open(os.path.join(self.dir, report_lib.REPORT_JSON), "w") as f:
            json.dump({"options": OPTIONS}, f)
        # The prompts the report decoded (same seeds), answered by hand: per length, one value
        # first, one after other text, one half value, one without it.
        prompts = report_lib.niah_samples(
            self.tok, tasks=OPTIONS["niah_tasks"], lengths=OPTIONS["niah_lengths"],
            depths=OPTIONS["niah_depths"], samples_per_cell=OPTIONS["niah_samples"],
            essay_words=None, max_new_tokens=8, seed=OPTIONS["niah_seed"], check=False)
        self.values = []
        fingerprint = report_lib.options_fingerprint(OPTIONS)
        for i, length in enumerate(OPTIONS["niah_lengths"]):
            values = [p.sample.value for p in prompts["niah_single_1"][i]]
            self.assertLen(values, 4)
            self.values.append(values)
            texts = [f" {values[0]}.", f" it is {values[1]}", f" {values[2][:4]}x", " the"]
            answers = [self.tok.encode(t) for t in texts]
            report_lib.append_jsonl(os.path.join(self.dir, report_lib.NIAH_PARTS), dict(
                model="student", task="niah_single_1", length=length, fingerprint=fingerprint,
                n=4, accuracy=0.5, se=0.25, answers=answers))
        # A part under other options is not read.
        report_lib.append_jsonl(os.path.join(self.dir, report_lib.NIAH_PARTS), dict(
            model="student", task="niah_single_1", length=448, fingerprint="0" * 16, n=1,
            accuracy=1.0, se=0.0, answers=[[1, 2]]))

    def test_modes_per_cell(self):
        out = os.path.join(self.dir, "out", "modes")
        rows = nam.main([f"--parts={self.dir}:student", "--tokenizer=byte", f"--out={out}"])
        self.assertEqual([(r["task"], r["length"]) for r in rows],
                         [("niah_single_1", 448), ("niah_single_1", 640)])
        for r in rows:
            self.assertEqual(r["modes"], dict(value_first=1, value_later=1, partial_value=1,
                                              no_value=1))
            self.assertEqual((r["n"], r["accuracy"]), (4, 0.5))
            self.assertEqual(r["examples"]["no_value"], " the")
        with open(out + ".json") as f:
            self.assertEqual(json.load(f)["rows"], rows)
        with open(out + ".md") as f:
            self.assertIn("| student | niah_single_1 | 640 | 4 | 0.500 | 1 | 1 | 1 | 1 |", f.read())

    def test_bad_entries_name_the_entry(self):
        cases = ((["--parts=nocolon"], SystemExit),
                 ([f"--parts={self.dir}:nobody"], SystemExit))
        for flags, exc in cases:
            with self.assertRaises(exc, msg=flags):
                nam.parse_args(flags)
        for entry, want in ((f"{self.dir}:teacher", "no NIAH answers of teacher"),
                            (f"{self.dir}/missing:student", "no report.json")):
            with self.assertRaises(SystemExit) as cm:
                nam.main([f"--parts={entry}", "--tokenizer=byte"])
            self.assertIn(f"--parts={entry}: ", str(cm.exception.code))
            self.assertIn(want, str(cm.exception.code))

    def test_reused_teacher_points_at_its_report(self):
        with open(os.path.join(self.dir, report_lib.REPORT_JSON), "w") as f:
            json.dump({"options": dict(OPTIONS, teacher_report="runs/old/report/report.json")}, f)
        with self.assertRaises(SystemExit) as cm:
            nam.main([f"--parts={self.dir}:teacher", "--tokenizer=byte"])
        self.assertIn("reused the teacher results of runs/old/report/report.json",
                      str(cm.exception.code))

    def test_unwritable_out_fails_before_decoding(self):
        # --out under a file: one error naming --out, before any answers are decoded.
        blocker = self.create_tempfile("file").full_path
        err = io.StringIO()
        with self.assertRaises(SystemExit), contextlib.redirect_stderr(err):
            with absltest.mock.patch.object(nam, "answer_modes") as modes:
                nam.main([f"--parts={self.dir}:student", "--tokenizer=byte",
                          f"--out={blocker}/sub/modes"])
        self.assertFalse(modes.called)
        self.assertIn(f"--out={blocker}/sub/modes: cannot write there", err.getvalue())


if __name__ == "__main__":
    absltest.main()
