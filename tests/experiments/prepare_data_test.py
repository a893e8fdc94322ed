"""experiments/prepare_data.py and lattn_jax.data.prepare: token shards, manifest, re-runs."""

import contextlib
import gzip
import io
import json
import os
import sys
import tempfile
from unittest import mock

from absl.testing import absltest
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lattn_jax.data import prepare
from lattn_jax.data import shards
from lattn_jax.data import sources
from lattn_jax.data import tokenizers
from tests import binary_runs
from tests.lattn_jax.data import corpus

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


class PrepareCorpusTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.root = self.enterContext(tempfile.TemporaryDirectory())
        self.inputs = os.path.join(self.root, "in")
        os.makedirs(self.inputs)
        self.docs = corpus.shakespeare_paragraphs(90)
        # Three sources of different types, 30 documents each, with some bad input.
        lines = [json.dumps({"text": d}) for d in self.docs[:30]]
        lines.insert(3, "{broken json")
        lines.insert(5, json.dumps({"text": "   "}))
        with gzip.open(os.path.join(self.inputs, "a.jsonl.gz"), "wt", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        pq.write_table(pa.table({"text": self.docs[30:60]}),
                       os.path.join(self.inputs, "b.parquet"), row_group_size=7)
        with open(os.path.join(self.inputs, "c.txt"), "wb") as f:
            f.write("\n\n".join(self.docs[60:90]).encode() + b"\xff\n")
        self.messages = []

    def _prepare(self, out, **kwargs):
        self.messages = []
        return prepare.prepare_corpus([self.inputs], out, progress=False,
                                      print_fn=self.messages.append, **kwargs)

    def test_a_run_that_failed_midway_is_refused_until_finished(self):
        # 2026-12-04 newcomer pass: a run that failed on its second file left a manifest of the
        # first, and training read half the corpus without a word.
        bad = os.path.join(self.inputs, "d.jsonl")
        with open(bad, "w", encoding="utf-8") as f:
            f.write("".join(json.dumps({"content": f"doc {i}"}) + "\n" for i in range(50)))
        out = os.path.join(self.root, "out")
        with self.assertRaisesRegex(ValueError, "text"):
            self._prepare(out, tokenizer="byte")
        manifest = shards.read_manifest(out)
        self.assertEqual(len(manifest["shards"]), 3)  # a, b, c finished
        self.assertEqual(manifest[shards.PENDING_KEY], [bad])
        with self.assertRaisesRegex(ValueError, rf"^{out}: its prepare_data.py run stopped "
                                                rf"before it finished \(1 input file\(s\) not "
                                                rf"tokenized, the first {bad}\); run "):
            shards.open_corpus([out])
        # Fixed and run again: resumes (the three shards skipped), complete, readable.
        os.remove(bad)
        manifest = self._prepare(out, tokenizer="byte")
        self.assertNotIn(shards.PENDING_KEY, manifest)
        self.assertEqual(shards.open_corpus([out]).num_documents, manifest["totals"]["documents"])
        self.assertTrue(any("unchanged, skipped" in m for m in self.messages))

    def test_shards_manifest_and_contents(self):
        out = os.path.join(self.root, "out")
        manifest = self._prepare(out)
        tok = tokenizers.make_tokenizer("sentencepiece")
        self.assertEqual(manifest["tokenizer"]["sha256"], tok.sha256)
        self.assertEqual(manifest["dtype"], "uint16")
        totals = manifest["totals"]
        self.assertEqual((totals["shards"], totals["documents"], totals["files"]), (3, 90, 3))
        self.assertEqual((totals["malformed_lines"], totals["empty_documents"],
                          totals["invalid_utf8"]), (1, 1, 1))
        for entry, name in zip(manifest["shards"], ("a.jsonl.gz", "b.parquet", "c.txt")):
            path = os.path.join(self.inputs, name)
            self.assertEqual(entry["source"], path)
            self.assertEqual(entry["source_sha256"], tokenizers.file_sha256(path))
        self.assertEqual(shards.read_manifest(out), manifest)
        # Every document comes back with exactly the ids of the tokenizer, in input order.
        documents = self.docs[:89] + [self.docs[89] + "\ufffd"]
        data = shards.open_corpus([out])
        self.assertEqual(data.num_documents, 90)
        for i, doc in enumerate(documents):
            np.testing.assert_array_equal(data.document(i), tok.encode(doc), err_msg=str(i))
        self.assertEqual(totals["tokens"], int(data.doc_len.sum()))

    def test_parallel_workers_give_the_same_shards(self):
        serial = self._prepare(os.path.join(self.root, "serial"), tokenizer="byte")
        parallel = self._prepare(os.path.join(self.root, "parallel"), tokenizer="byte",
                                 workers=2, chunk_docs=4)
        self.assertEqual(serial["totals"], parallel["totals"])
        for entry in serial["shards"]:
            a = os.path.join(self.root, "serial", entry["token_file"])
            b = os.path.join(self.root, "parallel", entry["token_file"])
            with open(a, "rb") as fa, open(b, "rb") as fb:
                self.assertEqual(fa.read(), fb.read())

    def test_rerun_skips_finished_shards(self):
        out = os.path.join(self.root, "out")
        first = self._prepare(out, tokenizer="byte")
        token_file = os.path.join(out, first["shards"][0]["token_file"])
        mtime = os.stat(token_file).st_mtime_ns
        second = self._prepare(out, tokenizer="byte")
        self.assertEqual(second["totals"], first["totals"])
        self.assertLen([m for m in self.messages if "unchanged, skipped" in m], 3)
        self.assertEqual(os.stat(token_file).st_mtime_ns, mtime)
        # A changed source is redone; an interrupted shard (file missing) is redone.
        with open(os.path.join(self.inputs, "c.txt"), "a", encoding="utf-8") as f:
            f.write("\n\nOne more speech.\n")
        os.remove(os.path.join(out, first["shards"][1]["token_file"]))
        third = self._prepare(out, tokenizer="byte")
        self.assertLen([m for m in self.messages if "unchanged, skipped" in m], 1)
        self.assertEqual(third["totals"]["documents"], 91)
        # Another tokenizer into the same directory is refused.
        with self.assertRaisesRegex(ValueError, "holds token shards made with byte"):
            self._prepare(out, tokenizer="sentencepiece")

    def test_inputs_without_text_are_refused_leaving_the_output_dir_as_it_was(self):
        # 2026-12-05 newcomer pass: a folder with one empty file gave "1 shards, 0 documents,
        # 0 tokens" and status 0; training failed later.
        empty_dir = os.path.join(self.root, "empty")
        os.makedirs(empty_dir)
        open(os.path.join(empty_dir, "e.txt"), "w").close()
        out = os.path.join(self.root, "out")
        with self.assertRaisesRegex(ValueError, rf"^--input={empty_dir}: no text to tokenize, "
                                                rf"every input file is empty \({empty_dir}/e\.txt"
                                                rf"\); --output_dir={out} left as it was$"):
            prepare.prepare_corpus([empty_dir], out, tokenizer="byte", progress=False)
        self.assertFalse(os.path.exists(out))  # refused before anything is written
        # Blank lines only, rerun into a finished corpus: found after reading; nothing of this
        # run is kept (its shard-00000 would have replaced the corpus's), the manifest stays.
        manifest = self._prepare(out, tokenizer="byte")
        listing = sorted(os.listdir(out))
        with open(os.path.join(empty_dir, "e.txt"), "w") as f:
            f.write("\n  \n")
        with self.assertRaisesRegex(ValueError, rf"^--input={empty_dir}: no documents in "
                                                rf"{empty_dir}/e\.txt \(blank or without text\); "
                                                rf"nothing kept, --output_dir={out} left as it "
                                                rf"was$"):
            prepare.prepare_corpus([empty_dir], out, tokenizer="byte", progress=False)
        self.assertEqual(sorted(os.listdir(out)), listing)
        self.assertEqual(shards.read_manifest(out), manifest)
        self.assertEqual(shards.open_corpus([out]).num_documents, 90)
        # A file without documents among others still gets its (empty) shard.
        os.rename(os.path.join(empty_dir, "e.txt"), os.path.join(self.inputs, "z.txt"))
        manifest = self._prepare(os.path.join(self.root, "mixed"), tokenizer="byte")
        self.assertEqual((manifest["totals"]["shards"], manifest["totals"]["documents"]), (4, 90))
        self.assertEqual(shards.open_corpus([os.path.join(self.root, "mixed")]).num_documents, 90)

    def test_a_rerun_with_fewer_inputs_removes_the_shards_it_does_not_list(self):
        # 2026-12-05 newcomer pass: shard-00001.* and shard-00002.* stayed beside the new
        # manifest, and corpus_pieces.py --mode=split packed them.
        out = os.path.join(self.root, "out")
        self._prepare(out, tokenizer="byte")
        other = os.path.join(out, "shard-notes.txt")  # not of the shard pattern: kept
        with open(other, "w") as f:
            f.write("mine\n")
        manifest = prepare.prepare_corpus([os.path.join(self.inputs, "c.txt")], out,
                                          tokenizer="byte", progress=False,
                                          print_fn=self.messages.append)
        self.assertEqual(manifest["totals"]["shards"], 1)
        self.assertEqual(sorted(os.listdir(out)), [
            "manifest.json", "shard-00000.offsets.npy", "shard-00000.tokens.bin",
            "shard-notes.txt"])
        self.assertEqual(self.messages[-1], (
            f"{out}: removed 4 shard file(s) of an earlier run that the new manifest does not "
            f"list: shard-00001.offsets.npy, shard-00001.tokens.bin, shard-00002.offsets.npy "
            f"and 1 more"))
        self.assertEqual(shards.open_corpus([out]).num_documents, 30)

    def test_bad_inputs_are_named(self):
        with self.assertRaisesRegex(FileNotFoundError, "/no/such/dir"):
            prepare.prepare_corpus(["/no/such/dir"], os.path.join(self.root, "x"),
                                   progress=False)
        with open(os.path.join(self.inputs, "d.jsonl.gz"), "wb") as f:
            f.write(b"not gzip at all")
        with self.assertRaisesRegex(sources.DataFileError, "d.jsonl.gz"):
            self._prepare(os.path.join(self.root, "y"), tokenizer="byte")
        # The shards finished before the bad file are kept and listed.
        self.assertLen(shards.read_manifest(os.path.join(self.root, "y"))["shards"], 3)

    def test_records_without_the_text_field_are_skipped_and_counted(self):
        # Like a malformed line: skipped, counted, reported; not fatal after the tokenizing.
        with open(os.path.join(self.inputs, "d.jsonl"), "w", encoding="utf-8") as f:
            f.write(json.dumps({"body": "no text here"}) + "\n")
            f.write(json.dumps({"text": None}) + "\n")
            f.write(json.dumps({"text": "The last speech."}) + "\n")
        manifest = self._prepare(os.path.join(self.root, "out"), tokenizer="byte")
        totals = manifest["totals"]
        self.assertEqual((totals["documents"], totals["missing_field"],
                          totals["malformed_lines"]), (91, 2, 1))
        self.assertIn("2 records without the text field", self.messages[-1])

    def _prepare_counting_reads(self, inputs, out):
        """``prepare_corpus`` of ``inputs``; returns ``(the error, the documents read)``."""
        read = []
        real_read_file = sources.read_file

        def counting_read_file(*args, **kwargs):
            for doc in real_read_file(*args, **kwargs):
                read.append(doc)
                yield doc

        with mock.patch.object(sources, "read_file", counting_read_file):
            with self.assertRaises(ValueError) as cm:
                prepare.prepare_corpus(inputs, out, tokenizer="byte", progress=False,
                                       print_fn=self.messages.append)
        return str(cm.exception), read

    def test_a_wrong_text_field_is_one_error_before_reading(self):
        # Newcomer pass: 11 warnings, one per record, then the bad-record limit's error.
        path = os.path.join(self.root, "wrong_field.jsonl")
        with open(path, "w", encoding="utf-8") as f:
            f.write("{broken\n")  # passed over by the check (the reader reports such lines)
            for i in range(5000):
                f.write(json.dumps({"content": f"document {i}", "id": i}) + "\n")
        out = os.path.join(self.root, "out")
        with self.assertNoLogs(level="WARNING"):
            message, read = self._prepare_counting_reads([path], out)
        self.assertEqual(message, f"--text_field='text': none of the first 11 JSON records of "
                                  f"{path} has a string in that field (line 2: no field 'text'; "
                                  f"its fields: 'content', 'id'); give the key that holds the "
                                  f"text")
        self.assertEqual(read, [])
        self.assertFalse(os.path.exists(os.path.join(out, "shard-00000.tokens")))
        # A file with fewer records than the limit tolerates: was an empty shard.
        small = os.path.join(self.root, "small", "few.jsonl")
        os.makedirs(os.path.dirname(small))
        with open(small, "w", encoding="utf-8") as f:
            f.write("".join(json.dumps({"text": [f"doc {i}"]}) + "\n" for i in range(3)))
        message, read = self._prepare_counting_reads([small], os.path.join(self.root, "o2"))
        self.assertRegex(message, r"^--text_field='text': none of the 3 JSON records of .*"
                                  r"few\.jsonl has a string in that field \(line 1: field 'text' "
                                  r"is list; its fields: 'text'\)")

    def test_a_wrong_text_field_is_refused_before_any_progress_bar(self):
        # Newcomer pass: an empty tqdm bar ("0doc [00:00, ?doc/s]") came before the error line.
        rng = np.random.default_rng(5)
        texts = [" ".join(rng.choice(["to", "be", "or", "not", "that"], size=rng.integers(3, 9)))
                 for _ in range(40)]
        jsonl = os.path.join(self.root, "body.jsonl")
        with open(jsonl, "w", encoding="utf-8") as f:
            f.write("".join(json.dumps({"body": t, "id": i}) + "\n" for i, t in enumerate(texts)))
        parquet = os.path.join(self.root, "body.parquet")
        pq.write_table(pa.table({"body": texts}), parquet, row_group_size=16)
        for path, message in ((jsonl, "--text_field='text': none of the first 11 JSON records"),
                              (parquet, "Parquet file has no column 'text' (--text_field)")):
            with self.subTest(os.path.basename(path)):
                err = io.StringIO()
                with contextlib.redirect_stderr(err), self.assertRaises(ValueError) as cm:
                    prepare.prepare_corpus([path], os.path.join(self.root, "out"),
                                           tokenizer="byte", progress=True,
                                           print_fn=self.messages.append)
                self.assertIn(message, str(cm.exception))
                self.assertIn(path, str(cm.exception))
                self.assertEqual(err.getvalue(), "")  # no progress bar before the error
                # The right field shows the bar (so the capture above would have seen one).
                err = io.StringIO()
                out = os.path.join(self.root, "out-" + os.path.basename(path))
                with contextlib.redirect_stderr(err):
                    manifest = prepare.prepare_corpus([path], out, tokenizer="byte",
                                                      text_field="body", progress=True,
                                                      print_fn=self.messages.append)
                self.assertEqual(manifest["totals"]["documents"], len(texts))
                self.assertIn(f"{len(texts)}doc", err.getvalue())

    def test_leading_records_without_the_field_pass_within_the_limit(self):
        # After 2000 good records, 20 more bad ones are within 1%: a file starting with 15
        # records without the field is read, not refused as a wrong --text_field.
        good, late = os.path.join(self.root, "a_good.jsonl"), os.path.join(self.root, "b.jsonl")
        with open(good, "w", encoding="utf-8") as f:
            f.write("".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(2000)))
        with open(late, "w", encoding="utf-8") as f:
            f.write("".join(json.dumps({"meta": i}) + "\n" for i in range(15)))
            f.write(json.dumps({"text": "the text"}) + "\n")
        manifest = prepare.prepare_corpus([good, late], os.path.join(self.root, "out"),
                                          tokenizer="byte", progress=False,
                                          print_fn=self.messages.append)
        self.assertEqual((manifest["totals"]["documents"], manifest["totals"]["missing_field"]),
                         (2001, 15))

    def test_too_many_bad_records_stop_early_naming_the_flags(self):
        path = os.path.join(self.root, "wrong_field.jsonl")
        with open(path, "w", encoding="utf-8") as f:
            f.write(json.dumps({"text": "the one document with text"}) + "\n")
            for i in range(5000):
                f.write(json.dumps({"content": f"document {i}"}) + "\n")
        read = []
        real_read_file = sources.read_file

        def counting_read_file(*args, **kwargs):
            for doc in real_read_file(*args, **kwargs):
                read.append(doc)
                yield doc

        out = os.path.join(self.root, "out")
        with mock.patch.object(sources, "read_file", counting_read_file):
            with self.assertRaises(ValueError) as cm:
                prepare.prepare_corpus([path], out, tokenizer="byte", progress=False,
                                       print_fn=self.messages.append)
        message = str(cm.exception)
        self.assertIn("--max_bad_fraction=0.01", message)
        self.assertIn("--text_field='text'", message)
        self.assertIn("wrong_field.jsonl:2", message)
        self.assertNotIn("data.text_field", message)
        # It stopped after a few records, not at the end of the file.
        self.assertRegex(message, r"11 of the 12 records")
        self.assertEqual(read, ["the one document with text"])
        self.assertFalse(os.path.exists(os.path.join(out, "shard-00000.tokens")))

    def test_bad_fraction_threshold(self):
        path = os.path.join(self.root, "some_bad.jsonl")
        with open(path, "w", encoding="utf-8") as f:
            for i in range(2000):
                f.write((json.dumps({"text": f"document {i}"}) if i % 20 else "{oops") + "\n")
        with self.assertRaisesRegex(ValueError, r"of the \d+ records read .* more than "
                                    r"--max_bad_fraction=0.01"):
            prepare.prepare_corpus([path], os.path.join(self.root, "a"), tokenizer="byte",
                                   progress=False, print_fn=self.messages.append)
        manifest = prepare.prepare_corpus([path], os.path.join(self.root, "b"),
                                          tokenizer="byte", progress=False,
                                          print_fn=self.messages.append, max_bad_fraction=0.1)
        self.assertEqual((manifest["totals"]["documents"],
                          manifest["totals"]["malformed_lines"]), (1900, 100))

    def test_a_small_latin1_file_is_read_as_a_large_one_is(self):
        # A few short Latin-1 lines were refused as binary (12% of 42 bytes invalid UTF-8),
        # while a long Latin-1 file is read with its accents replaced and counted.
        rng = np.random.default_rng()
        words = ["Café", "über", "Grüße", "très", "naïve", "Müll", "garçon", "déjà", "the", "au"]
        for size, name in ((3, "small.txt"), (3000, "large.txt")):
            lines = [" ".join(rng.choice(words, size=int(rng.integers(2, 5))))
                     for _ in range(size)]
            text = "\n".join(lines) + "\n"
            path = os.path.join(self.root, name)
            with open(path, "wb") as f:
                f.write(text.encode("latin-1"))
            accents = sum(ord(c) > 127 for c in text)
            manifest = prepare.prepare_corpus([path], os.path.join(self.root, "o-" + name),
                                              tokenizer="byte", progress=False,
                                              print_fn=self.messages.append)
            self.assertEqual(manifest["totals"]["invalid_utf8"], accents, name)
            # Every byte read (an accent as U+FFFD's 3 bytes), bar the newlines between lines.
            self.assertGreaterEqual(manifest["totals"]["tokens"],
                                    len(text) + 2 * accents - text.count("\n"), name)

    def test_binary_input_is_refused(self):
        rng = np.random.default_rng(0)
        noise = rng.integers(0, 256, 200_000, dtype=np.uint8).tobytes()
        for name in ("noise.txt", "noise.jsonl", "noise.jsonl.gz"):
            path = os.path.join(self.root, name)
            with (gzip.open if name.endswith(".gz") else open)(path, "wb") as f:
                f.write(noise)
            with self.assertRaisesRegex(sources.DataFileError,
                                        rf"{name} looks binary, not text \(.*NUL"):
                prepare.prepare_corpus([path], os.path.join(self.root, "o-" + name),
                                       tokenizer="byte", progress=False)
        # Mostly invalid UTF-8 without NUL bytes (e.g. a UTF-16 or Latin-1 mangle of binary).
        path = os.path.join(self.root, "high.txt")
        with open(path, "wb") as f:
            f.write(bytes(rng.integers(0x80, 0x100, 20_000, dtype=np.uint8)))
        with self.assertRaisesRegex(sources.DataFileError, r"high\.txt looks binary.*UTF-8"):
            prepare.prepare_corpus([path], os.path.join(self.root, "high"), tokenizer="byte",
                                   progress=False)
        # Short runs of high bytes among them, as a few Latin-1 letters: still binary.
        path = os.path.join(self.root, "short.txt")
        with open(path, "wb") as f:
            f.write(b"".join(bytes(rng.integers(0x80, 0x100, 3, dtype=np.uint8)) + b"ab"
                             for _ in range(20)))
        with self.assertRaisesRegex(sources.DataFileError, r"short\.txt looks binary.*UTF-8"):
            prepare.prepare_corpus([path], os.path.join(self.root, "short"), tokenizer="byte",
                                   progress=False)
        # Text with a little bad UTF-8 (the setUp files) is still read, with replacements.
        manifest = self._prepare(os.path.join(self.root, "ok"), tokenizer="byte")
        self.assertEqual(manifest["totals"]["invalid_utf8"], 1)


class PrepareDataBinaryTest(absltest.TestCase):

    def test_binary(self):
        root = self.enterContext(tempfile.TemporaryDirectory())
        src = os.path.join(root, "w.raw")
        with open(src, "w", encoding="utf-8") as f:
            f.write("\n".join(corpus.wikitext_lines(50)) + "\n")
        cmd = [sys.executable, os.path.join(ROOT, "experiments", "prepare_data.py"),
               f"--input={src}", f"--output_dir={root}/out", "--tokenizer=byte",
               "--doc_split=line", "--workers=0"]
        result = binary_runs.run(cmd)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("1 shards, 50 documents", result.stdout)
        result = binary_runs.run(cmd[:2] + ["--input=/no/such.jsonl", f"--output_dir={root}/o"])
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("error: --input: no such file or directory: /no/such.jsonl",
                      result.stderr)
        self.assertNotIn("Traceback", result.stderr)
        a_file = os.path.join(root, "a_file")
        with open(a_file, "w") as f:
            f.write("kept\n")
        result = binary_runs.run(cmd[:3] + [f"--output_dir={a_file}"] + cmd[4:])
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertEqual(result.stderr.strip(),
                         f"error: --output_dir={a_file} exists and is not a directory")
        with open(a_file) as f:
            self.assertEqual(f.read(), "kept\n")
        under = os.path.join(a_file, "out")  # a directory that cannot be made: no traceback
        result = binary_runs.run(cmd[:3] + [f"--output_dir={under}"] + cmd[4:])
        self.assertEqual((result.returncode, result.stderr.strip()), (1, (
            f"error: --output_dir={under} cannot be written ({a_file} is a file, not a "
            f"directory)")))

    def test_failures_are_one_line_and_leave_no_empty_output_dir(self):
        root = self.enterContext(tempfile.TemporaryDirectory())
        src = os.path.join(root, "p.jsonl")
        with open(src, "w", encoding="utf-8") as f:
            f.write("".join(json.dumps({"body": f"doc {i}"}) + "\n" for i in range(50)))
        out = os.path.join(root, "new", "out")
        cmd = [sys.executable, os.path.join(ROOT, "experiments", "prepare_data.py"),
               f"--input={src}", f"--output_dir={out}", "--workers=0"]
        # A tokenizer kind that needs a file, without one: the flag is named.
        result = binary_runs.run(cmd + ["--tokenizer=huggingface"])
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertEqual(result.stderr.strip().splitlines(), [
            "error: --tokenizer=huggingface needs its model file: pass --tokenizer_path=<file>"])
        # Refused after --output_dir was made (no record has --text_field): it is removed, with
        # the parent this run made; a directory that existed before is kept.
        result = binary_runs.run(cmd + ["--tokenizer=byte"])
        self.assertEqual(result.returncode, 1, result.stderr)
        error = result.stderr.strip().splitlines()
        self.assertLen(error, 1, result.stderr)  # no (empty) progress bar before it
        self.assertRegex(error[0], rf"^error: --text_field='text': .* of {src} has")
        self.assertFalse(os.path.exists(os.path.join(root, "new")))
        os.makedirs(out)
        result = binary_runs.run(cmd + ["--tokenizer=byte"])
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertTrue(os.path.isdir(out))

    def test_a_folder_of_one_empty_file_is_one_line_and_no_output_dir(self):
        root = self.enterContext(tempfile.TemporaryDirectory())
        os.makedirs(os.path.join(root, "in"))
        open(os.path.join(root, "in", "e.txt"), "w").close()
        out = os.path.join(root, "out")
        result = binary_runs.run([
            sys.executable, os.path.join(ROOT, "experiments", "prepare_data.py"),
            f"--input={root}/in", f"--output_dir={out}", "--tokenizer=byte", "--workers=0"])
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertEqual(result.stderr.strip().splitlines(), [
            f"error: --input={root}/in: no text to tokenize, every input file is empty "
            f"({root}/in/e.txt); --output_dir={out} left as it was"])
        self.assertFalse(os.path.exists(out))

    def test_ctrl_c_is_one_line_and_exit_130(self):
        root = self.enterContext(tempfile.TemporaryDirectory())
        out = os.path.join(root, "out")
        # prepare_corpus interrupted after it made --output_dir (a stand-in for Ctrl-C in it).
        script = (
            "import os, runpy, sys\n"
            "from lattn_jax.data import prepare\n"
            "def interrupted(inputs, output_dir, **kwargs):\n"
            "    os.makedirs(output_dir)\n"
            "    raise KeyboardInterrupt\n"
            "prepare.prepare_corpus = interrupted\n"
            f"sys.argv = ['prepare_data.py', '--input={root}', '--output_dir={out}']\n"
            "runpy.run_path('experiments/prepare_data.py', run_name='__main__')\n")
        path = os.path.join(self.create_tempdir().full_path, "interrupted_prepare_data.py")
        with open(path, "w") as f:
            f.write(script)
        # A fork of the binary_runs driver this file's other binary tests use (its imports
        # shared), not a python -c of its own.
        result = binary_runs.run([sys.executable, path], timeout=120)
        self.assertEqual(result.returncode, 130, result.stderr)
        self.assertEqual(result.stderr.strip().splitlines(), [
            f"interrupted (Ctrl-C): prepare_data.py stopped; the shards finished in {out} are "
            f"kept, and running the same command again resumes (it skips them)"])
        self.assertFalse(os.path.exists(out))  # made by this run, still empty: removed

    @pytest.mark.slow  # ~9 s on 2 cores (subprocesses)
    def test_messages_name_the_tools_flags(self):
        root = self.enterContext(tempfile.TemporaryDirectory())
        src = os.path.join(root, "p.jsonl")
        with open(src, "w", encoding="utf-8") as f:
            f.write("".join(json.dumps({"body": f"doc {i}"}) + "\n" for i in range(50)))
        cmd = [sys.executable, os.path.join(ROOT, "experiments", "prepare_data.py"),
               f"--input={src}", f"--output_dir={root}/out", "--tokenizer=byte", "--workers=0"]
        result = binary_runs.run(cmd)
        self.assertEqual(result.returncode, 1, result.stderr)
        error = result.stderr.strip().splitlines()[-1]
        self.assertRegex(error, r"^error: --text_field='text': none of the first 11 JSON "
                                r"records of .*p\.jsonl has a string in that field \(line 1: no "
                                r"field 'text'; its fields: 'body'\)")
        self.assertNotIn("data.", error)
        self.assertNotIn("Traceback", result.stderr)
        self.assertNotIn("skipped", result.stderr)  # was one warning per record
        result = binary_runs.run(cmd + ["--text_field=body"])
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("1 shards, 50 documents", result.stdout)
        self.assertIn("0 records without the text field", result.stdout)


if __name__ == "__main__":
    absltest.main()
