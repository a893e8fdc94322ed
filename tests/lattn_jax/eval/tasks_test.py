"""Task subsets: ``write_subset`` keeps exactly the documents ``load_task(limit=...)`` keeps."""

import bz2
import csv
import json
import os
import random
import re

from absl.testing import absltest

from lattn_jax.eval import tasks
from lattn_jax.halo import selection

SHARED_EVAL = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "shared", "data",
                           "eval")


def write_full_data(root, n=10):
    """Small files in the original formats of piqa, hellaswag, arc_easy and openbookqa."""
    os.makedirs(os.path.join(root, "piqa"))
    with open(os.path.join(root, "piqa", "valid.jsonl"), "w") as f:
        f.writelines(json.dumps({"goal": f"goal {i}", "sol1": f"a{i}", "sol2": f"b{i}"}) + "\n"
                     for i in range(n))
    with open(os.path.join(root, "piqa", "valid-labels.lst"), "w") as f:
        f.writelines(f"{i % 2}\n" for i in range(n))
    os.makedirs(os.path.join(root, "hellaswag"))
    with bz2.open(os.path.join(root, "hellaswag", "hellaswag_val_full.txt.bz2"), "wt") as f:
        f.write("\n".join(line for i in range(n) for line in
                          (f"Act {i}: ctx {i}", str(i % 4), "e0", "e1", "e2", f"e3 {i}")) + "\n")
    os.makedirs(os.path.join(root, "arc"))
    with open(os.path.join(root, "arc", "ARC-Easy-Test.jsonl"), "w") as f:
        for i in range(n):
            choices = [{"text": f"c{j}", "label": "ABCD"[j]} for j in range(4)]
            f.write(json.dumps({"question": {"stem": f"q{i}", "choices": choices},
                                "answerKey": "ABCD"[i % 4]}) + "\n")
    os.makedirs(os.path.join(root, "openbookqa"))
    with open(os.path.join(root, "openbookqa", "test.tsv"), "w", newline="") as f:
        w = csv.writer(f, delimiter="\t", lineterminator="\n")
        w.writerow(["ID", "Question Stem", "Choices", "Complete Question", "Answer Key"])
        for i in range(n):
            w.writerow([str(i), f"stem {i}", "(A) w (B) x (C) y (D) z", "-", "ABCD"[i % 4]])


class DamagedFileTest(absltest.TestCase):
    """A damaged evaluation file is one error naming it (and the line): an EOFError traceback,
    ``Expecting value: line 1 column 1 (char 0)`` and ``piqa: 10 items but 9 labels`` did not."""

    def test_the_error_names_the_file_and_line(self):
        rng = random.Random()
        root = self.create_tempdir().full_path
        n = rng.randrange(4, 12)
        write_full_data(root, n)
        hellaswag = os.path.join(root, "hellaswag", "hellaswag_val_full.txt.bz2")
        with open(hellaswag, "rb") as f:
            data = f.read()
        with open(hellaswag, "wb") as f:  # cut short anywhere after the bz2 header
            f.write(data[:rng.randrange(4, len(data) - 1)])
        with self.assertRaisesRegex(tasks.EvalDataError,
                                    rf"^{re.escape(hellaswag)}: not a readable bz2 text file"):
            tasks.load_task("hellaswag", root)
        # Bad JSON on a random line of piqa (the line named), then a missing label.
        piqa = os.path.join(root, "piqa", "valid.jsonl")
        with open(piqa) as f:
            lines = f.readlines()
        bad = rng.randrange(n)
        lines[bad] = "{not json\n"
        with open(piqa, "w") as f:
            f.writelines(lines)
        with self.assertRaisesRegex(tasks.EvalDataError,
                                    rf"^{re.escape(piqa)}, line {bad + 1}: not valid JSON"):
            tasks.load_task("piqa", root)
        labels = os.path.join(root, "piqa", "valid-labels.lst")
        lines[bad] = json.dumps({"goal": "g", "sol1": "a", "sol2": "b"}) + "\n"
        with open(piqa, "w") as f:
            f.writelines(lines)
        with open(labels, "w") as f:
            f.writelines(f"{i % 2}\n" for i in range(n - 1))
        with self.assertRaisesRegex(tasks.EvalDataError,
                                    rf"^piqa: {n} items in {re.escape(piqa)} but {n - 1} labels "
                                    rf"in {re.escape(labels)}$"):
            tasks.load_task("piqa", root)
        with open(labels, "w") as f:
            f.write("0\n1\nx\n")
        with self.assertRaisesRegex(tasks.EvalDataError, rf"^{re.escape(labels)}: not a list"):
            tasks.load_task("piqa", root)
        # BoolQ reads JSON lines too.
        os.makedirs(os.path.join(root, "boolq"))
        boolq = os.path.join(root, "boolq", "val.jsonl")
        with open(boolq, "w") as f:
            f.write(json.dumps({"passage": "p", "question": "q", "label": True}) + "\n\n"
                    + '{"passage": "p", "question"\n')
        with self.assertRaisesRegex(tasks.EvalDataError, rf"^{re.escape(boolq)}, line 3: "):
            tasks.load_task("boolq", root)

    def test_one_strict_jsonl_reader_for_tasks_and_the_halo_selection(self):
        # lattn_jax.halo.selection had its own reader: "<path>:<n>: <error>" and no UTF-8
        # check (a UnicodeDecodeError traceback); it is now this one.
        self.assertIs(selection.read_jsonl, tasks.read_jsonl)
        path = os.path.join(self.create_tempdir().full_path, "items.jsonl")
        with open(path, "w") as f:
            f.write('{"a": 1}\n\n[2]\n{"b": \n')
        with self.assertRaisesRegex(tasks.EvalDataError,
                                    rf"^{re.escape(path)}, line 4: not valid JSON \(.+\)$"):
            selection.read_jsonl(path)
        with open(path, "w") as f:
            f.write('{"a": 1}\n\n[2]\n')
        self.assertEqual(selection.read_jsonl(path), [{"a": 1}, [2]])
        with open(path, "wb") as f:
            f.write(b'{"a": "\xff"}\n')
        with self.assertRaisesRegex(tasks.EvalDataError, rf"^{re.escape(path)}: not UTF-8 text"):
            selection.read_jsonl(path)
        with self.assertRaisesRegex(FileNotFoundError, rf"^{re.escape(path)}x: no such "
                                                       rf"evaluation file$"):
            selection.read_jsonl(path + "x")


class SubsetTest(absltest.TestCase):

    def test_subset_loads_the_same_documents(self):
        src, dst = self.create_tempdir().full_path, self.create_tempdir().full_path
        write_full_data(src)
        for name in ("piqa", "hellaswag", "arc_easy", "openbookqa"):
            tasks.write_subset(name, src, dst, limit=4, seed=7)
            want = tasks.load_task(name, src, limit=4, seed=7)
            self.assertLen(want, 4)
            self.assertEqual(tasks.load_task(name, dst, limit=4, seed=7), want, msg=name)
            self.assertEqual(tasks.load_task(name, dst), want, msg=name)  # nothing else in it
        with self.assertRaisesRegex(ValueError, "unknown task"):
            tasks.write_subset("nope", src, dst, 4)

    @absltest.skipIf(not os.path.isdir(SHARED_EVAL), "shared/data/eval not present")
    def test_subset_of_the_shared_data(self):
        dst = self.create_tempdir().full_path
        for name in ("piqa", "hellaswag", "arc_easy", "winogrande"):
            tasks.write_subset(name, SHARED_EVAL, dst, limit=50)
            self.assertEqual(tasks.load_task(name, dst, limit=50),
                             tasks.load_task(name, SHARED_EVAL, limit=50), msg=name)


if __name__ == "__main__":
    absltest.main()
