"""Tests for lattn_jax.data.sources and lattn_jax.assets."""

import contextlib
import gzip
import json
import os
import re
import tempfile

from absl.testing import absltest
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from lattn_jax import assets
from lattn_jax.data import sources
from tests.lattn_jax.data import corpus


def _write(path, text, mode="w", newline=None):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, mode, encoding="utf-8", newline=newline) as f:
        f.write(text)
    return path


def _write_bytes(path, data):
    with open(path, "wb") as f:
        f.write(data)
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
        # b.jsonl.gz's only record lacks data.text_field: refused before it is read, naming
        # the file and the fields it has.
        with self.assertRaisesRegex(ValueError, r"data\.text_field='text': none of the 1 JSON "
                                    r"records of .*b\.jsonl\.gz has a string in that field "
                                    r"\(line 1: no field 'text'; its fields: 'body'\)"):
            list(sources.read_documents([root]))
        os.remove(os.path.join(root, "b.jsonl.gz"))
        # Directory: sorted data files only (LICENSE.md is skipped), each with its own format.
        self.assertEqual(list(sources.read_documents([root])), ["one", "two", "four", "five"])

    def test_missing_path(self):
        with self.assertRaisesRegex(FileNotFoundError,
                                    "data.paths: no such file or directory: /no/such/file"):
            list(sources.read_documents(["/no/such/file"]))

    def test_binary_file_given_as_text_is_refused(self):
        root = self.enterContext(tempfile.TemporaryDirectory())
        png = os.path.join(root, "loss.txt")  # an image saved under a text name
        rng = np.random.default_rng(0)
        with open(png, "wb") as f:
            f.write(b"\x89PNG\r\n\x1a\n" + rng.integers(0, 256, 4096, np.uint8).tobytes())
        with self.assertRaisesRegex(sources.DataFileError,
                                    f"^data.paths: {png} looks binary, not text"):
            list(sources.read_documents([png]))

    def test_directory_without_data_files_names_option_and_directory(self):
        root = self.enterContext(tempfile.TemporaryDirectory())
        _write(os.path.join(root, "README.md"), "not data\n")
        _write(os.path.join(root, "sub", "loss.png"), "not data either\n")
        with self.assertRaisesRegex(FileNotFoundError,
                                    f"^data.paths: directory {root} holds no data file"):
            list(sources.read_documents([root]))


class DuplicateFilesTest(absltest.TestCase):
    """A file named twice (a directory and a file in it, a symlink) is read once."""

    def test_each_real_file_is_listed_once_and_the_dropped_ones_named(self):
        root = self.enterContext(tempfile.TemporaryDirectory())
        rng = np.random.default_rng()
        names = [f"part{i}.txt" for i in rng.permutation(int(rng.integers(2, 6)))]
        for n in names:
            _write(os.path.join(root, n), f"{n}\n\nsecond of {n}\n")
        files = sorted(os.path.join(root, n) for n in names)
        twice = str(rng.choice(files))
        link = os.path.join(self.enterContext(tempfile.TemporaryDirectory()), "link.txt")
        os.symlink(twice, link)
        paths = [root, twice, link, root + "/", twice]
        self.assertEqual(sources.list_files(paths), files)
        self.assertEqual(
            sources.duplicate_files(paths),
            [(twice, twice), (link, twice)] + [(f, f) for f in sorted(
                os.path.join(root + "/", n) for n in names)] + [(twice, twice)])
        # Read once: each document of the directory once, in the directory's order.
        self.assertEqual(list(sources.read_documents(paths)), list(sources.read_documents([root])))

    def test_distinct_files_drop_nothing(self):
        root = self.enterContext(tempfile.TemporaryDirectory())
        a = _write(os.path.join(root, "a", "x.txt"), "one\n")
        b = _write(os.path.join(root, "b", "x.txt"), "one\n")  # same contents, another file
        self.assertEqual(sources.list_files([a, b]), [a, b])
        self.assertEqual(sources.duplicate_files([a, b]), [])


def _jsonl_bytes(records) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode("utf-8")


class SourceTypesTest(absltest.TestCase):
    """Every source type on small real files made from the shared corpora."""

    def setUp(self):
        super().setUp()
        self.root = self.enterContext(tempfile.TemporaryDirectory())
        self.docs = corpus.shakespeare_paragraphs(60)

    def test_text_directory(self):
        for i in range(3):  # three files, 20 speeches each, plus a file that is not data
            _write(os.path.join(self.root, "d", f"part{i}.txt"),
                   "\n\n".join(self.docs[20 * i:20 * (i + 1)]) + "\n")
        _write(os.path.join(self.root, "d", "README.md"), "not data")
        stats = sources.ReadStats()
        docs = list(sources.read_documents([os.path.join(self.root, "d")], stats=stats))
        self.assertEqual(docs, self.docs)
        self.assertEqual((stats.files, stats.documents), (3, 60))

    def test_jsonl_plain_gz_zst(self):
        records = [{"id": i, "content": d} for i, d in enumerate(self.docs)]
        data = _jsonl_bytes(records)
        paths = [os.path.join(self.root, n) for n in ("a.jsonl", "b.jsonl.gz", "c.jsonl.zst")]
        with open(paths[0], "wb") as f:
            f.write(data)
        with gzip.open(paths[1], "wb") as f:
            f.write(data)
        with open(paths[2], "wb") as f:
            f.write(zstandard.ZstdCompressor().compress(data))
        for path in paths:
            with self.subTest(path=os.path.basename(path)):
                self.assertEqual(sources.file_format(path), "jsonl")
                stats = sources.ReadStats()
                self.assertEqual(list(sources.read_documents([path], text_field="content",
                                                             stats=stats)), self.docs)
                self.assertEqual((stats.files, stats.documents, stats.malformed_lines), (1, 60, 0))

    def test_parquet_fineweb_schema_by_row_group(self):
        # FineWeb-Edu's columns (text, id, dump, url, ..., score, int_score, token_count).
        n = len(self.docs)
        table = pa.table({
            "text": self.docs, "id": [f"<urn:{i}>" for i in range(n)],
            "dump": ["CC-MAIN-2024-10"] * n, "url": [f"https://x/{i}" for i in range(n)],
            "score": [3.5] * n, "int_score": [4] * n,
            "token_count": [len(d) // 4 for d in self.docs]})
        path = os.path.join(self.root, "000_00000.parquet")
        pq.write_table(table, path, row_group_size=16)  # 4 row groups
        self.assertEqual(pq.ParquetFile(path).num_row_groups, 4)
        stats = sources.ReadStats()
        self.assertEqual(list(sources.read_documents([self.root], stats=stats)), self.docs)
        self.assertEqual(stats.documents, n)
        with self.assertRaisesRegex(ValueError, r"000_00000\.parquet: Parquet file has no "
                                                r"column 'body' \(data.text_field\)"):
            list(sources.read_parquet(path, "body"))
        with self.assertRaisesRegex(ValueError, "column 'score' has type double"):
            list(sources.read_parquet(path, "score"))


class BadInputTest(absltest.TestCase):
    """Bad input is counted and reported: never a silent skip, never a crash without a name."""

    def setUp(self):
        super().setUp()
        self.root = self.enterContext(tempfile.TemporaryDirectory())
        self.docs = corpus.wikitext_lines(5)

    def test_missing_file_names_it(self):
        missing = os.path.join(self.root, "gone.jsonl")
        with self.assertRaisesRegex(FileNotFoundError, f"no such file or directory: {missing}"):
            list(sources.read_file(missing))

    def test_unreadable_files_name_the_file(self):
        cases = {"bad.jsonl.gz": b"this is not gzip data" * 10,
                 "bad.jsonl.zst": b"this is not zstd data" * 10,
                 "bad.parquet": b"PAR1 this is not parquet PAR1"}
        for name, data in cases.items():
            path = os.path.join(self.root, name)
            with open(path, "wb") as f:
                f.write(data)
            with self.subTest(name=name):
                with self.assertRaisesRegex(sources.DataFileError,
                                            f"cannot read data file {path}: "):
                    list(sources.read_documents([path]))
        os.makedirs(os.path.join(self.root, "dir.txt"))
        with self.assertRaisesRegex(sources.DataFileError, "dir.txt"):
            list(sources.read_text(os.path.join(self.root, "dir.txt"), "file"))

    def test_invalid_utf8_is_replaced_and_counted(self):
        good = self.docs[0].encode("utf-8")
        text_path = os.path.join(self.root, "t.txt")
        with open(text_path, "wb") as f:
            f.write(good + b" \xff\xfe end\n\n" + self.docs[1].encode() + b" \xc3\n")
        stats = sources.ReadStats()
        docs = list(sources.read_text(text_path, "blank_line", stats))
        self.assertEqual(docs, [self.docs[0] + " \ufffd\ufffd end", self.docs[1] + " \ufffd"])
        self.assertEqual((stats.invalid_utf8, stats.invalid_utf8_files), (3, 1))
        self.assertIn(f"{text_path}: replaced 3 invalid UTF-8", stats.examples[0])
        # JSONL: raw invalid bytes inside a string, and an escaped lone surrogate.
        jsonl_path = os.path.join(self.root, "j.jsonl")
        with open(jsonl_path, "wb") as f:
            line = json.dumps({"text": "café " + self.docs[0]}, ensure_ascii=False).encode()
            f.write(line.replace("é".encode(), b"\xe9") + b'\n{"text": "x \\udc80 y"}\n')
        stats = sources.ReadStats()
        docs = list(sources.read_jsonl(jsonl_path, "text", stats))
        self.assertEqual(docs, ["caf\ufffd " + self.docs[0], "x \ufffd y"])
        self.assertEqual((stats.invalid_utf8, stats.invalid_utf8_files), (2, 1))
        # Parquet: a binary column with invalid UTF-8.
        pq_path = os.path.join(self.root, "p.parquet")
        pq.write_table(pa.table({"text": pa.array([good + b"\x80", good], pa.binary())}), pq_path)
        stats = sources.ReadStats()
        self.assertEqual(list(sources.read_parquet(pq_path, "text", stats)),
                         [self.docs[0] + "\ufffd", self.docs[0]])
        self.assertEqual(stats.invalid_utf8, 1)

    def test_empty_documents_are_skipped_and_counted(self):
        path = _write(os.path.join(self.root, "e.jsonl"), "".join(
            json.dumps({"text": t}) + "\n" for t in [self.docs[0], "", "  \n ", self.docs[1]]))
        stats = sources.ReadStats()
        self.assertEqual(list(sources.read_jsonl(path, "text", stats)), self.docs[:2])
        self.assertEqual((stats.documents, stats.empty_documents), (2, 2))
        pq_path = os.path.join(self.root, "e.parquet")
        pq.write_table(pa.table({"text": [self.docs[2], None, " "]}), pq_path)
        stats = sources.ReadStats()
        self.assertEqual(list(sources.read_parquet(pq_path, "text", stats)), self.docs[2:3])
        self.assertEqual(stats.empty_documents, 2)
        empty = _write(os.path.join(self.root, "empty.txt"), "\n  \n")
        stats = sources.ReadStats()
        self.assertEqual(list(sources.read_text(empty, "file", stats)), [])
        self.assertEqual(stats.empty_documents, 1)

    def test_malformed_json_lines_are_skipped_with_file_and_line(self):
        lines = [json.dumps({"text": self.docs[0]}), '{"text": "unterminated',
                 json.dumps(["a", "list"]), json.dumps({"text": self.docs[1]}), "{oops}"]
        path = _write(os.path.join(self.root, "m.jsonl"), "\n".join(lines) + "\n")
        stats = sources.ReadStats()
        with self.assertLogs(level="WARNING") as logs:
            docs = list(sources.read_jsonl(path, "text", stats))
        self.assertEqual(docs, self.docs[:2])
        self.assertEqual(stats.malformed_lines, 3)
        self.assertEqual([e.split(": ")[0] for e in stats.examples],
                         [f"{path}:2", f"{path}:3", f"{path}:5"])
        self.assertIn(f"{path}:2: skipped a line that is not valid JSON", "\n".join(logs.output))
        self.assertIn("3 malformed JSON lines", stats.summary())
        # A missing text field is a configuration error, not bad input: it stops with the line.
        path = _write(os.path.join(self.root, "n.jsonl"), json.dumps({"body": "x"}) + "\n")
        with self.assertRaisesRegex(ValueError, r"n\.jsonl:1: record has no field 'text'"):
            list(sources.read_jsonl(path, "text"))

    def test_records_without_text_can_be_skipped(self):
        # The training readers raise naming data.text_field; prepare_data skips, counts and
        # checks after each skip (on_skip), naming its own flag.
        lines = [json.dumps({"body": "x"}), json.dumps({"text": self.docs[0]}),
                 json.dumps({"text": 3}), "{oops"]
        path = _write(os.path.join(self.root, "s.jsonl"), "\n".join(lines) + "\n")
        with self.assertRaisesRegex(ValueError, r"no field 'text' \(data\.text_field='text'\)"):
            list(sources.read_file(path))
        stats, seen = sources.ReadStats(), []
        names = sources.OptionNames(text_field="--text_field")
        docs = list(sources.read_file(path, stats=stats, skip_missing_field=True, names=names,
                                      on_skip=lambda s: seen.append(s.bad_records)))
        self.assertEqual(docs, self.docs[:1])
        self.assertEqual((stats.missing_field, stats.malformed_lines, stats.records), (2, 1, 4))
        self.assertEqual(seen, [1, 2, 3])
        self.assertEqual(stats.examples[0],
                         f"{path}:1: skipped: record has no field 'text' (--text_field='text')")
        self.assertIn("2 records without the text field", stats.summary())

    def test_read_documents_skips_records_without_text_like_malformed_lines(self):
        # One {"txt": ...} among 300 good records stopped a training run; malformed lines were
        # only warned about. Both are now skipped, counted and logged with file and line.
        path = os.path.join(self.root, "a.jsonl.gz")
        lines = [json.dumps({"text": f"doc {i}"}) for i in range(300)]
        lines[150:150] = [json.dumps({"txt": "no text"}), "{oops"]
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        stats = sources.ReadStats()
        with self.assertLogs(level="WARNING") as logs:
            docs = list(sources.read_documents([self.root], stats=stats))
        self.assertEqual(docs, [f"doc {i}" for i in range(300)])
        self.assertEqual((stats.missing_field, stats.malformed_lines, stats.files), (1, 1, 1))
        self.assertIn(f"{path}:151: skipped: record has no field 'text' "
                      "(data.text_field='text')", "\n".join(logs.output))
        # A file without the field at all (a wrong data.text_field) is refused before it is
        # read, naming the file; one whose every line is malformed stops after it.
        bad = _write(os.path.join(self.root, "b.jsonl"),
                     json.dumps({"body": "x"}) + "\n{oops\n" + json.dumps({"body": "y"}) + "\n")
        with self.assertRaisesRegex(ValueError, re.escape(
                f"data.text_field='text': none of the 2 JSON records of {bad} has a string in "
                "that field (line 1: no field 'text'; its fields: 'body')")):
            list(sources.read_documents([self.root]))
        _write(bad, "{oops\n[1, 2]\n")
        with self.assertRaisesRegex(ValueError, re.escape(
                f"{bad}: all 2 records are bad, so it holds no document (0 without a string in "
                f"data.text_field='text', 2 not JSON objects); first: {bad}:1: skipped a line "
                "that is not valid JSON")):
            list(sources.read_documents([self.root]))

    def test_bad_records_log_the_first_per_file_as_the_readme_says(self):
        # README "Data at scale" said one summary warning; each of a file's first
        # _MAX_EXAMPLES bad records has its own line (the rest are counted).
        cap = sources._MAX_EXAMPLES
        lines = [json.dumps({"text": f"doc {i}"}) for i in range(3000)]
        lines += ["{oops"] * (cap + 5)  # at the end: within the 1% limit of the records read
        path = _write(os.path.join(self.root, "a.jsonl"), "\n".join(lines) + "\n")
        stats = sources.ReadStats()
        with self.assertLogs(level="WARNING") as logs:
            list(sources.read_documents([path], stats=stats))
        self.assertEqual(stats.malformed_lines, cap + 5)
        self.assertLen([m for m in logs.output if "skipped a line" in m], cap)
        with open(os.path.join(os.path.dirname(__file__), "..", "..", "..", "README.md"),
                  encoding="utf-8") as f:
            readme = " ".join(f.read().split())
        self.assertIn(f"one warning line for each of a file's first {cap} bad records", readme)

    def test_read_documents_stops_once_bad_records_pass_max_bad_fraction(self):
        # A corpus that was 90% broken trained silently on the rest. Random corpora of good,
        # empty and bad records over two files, against a record-by-record count.
        bad_kinds = ["{oops", "[1, 2]", json.dumps({"body": "x"}), json.dumps({"text": 3})]
        outcomes = set()
        for seed in range(12):
            rng = np.random.default_rng(seed)
            fraction = float(rng.choice([0.0, 0.005, 0.01, 0.02, 0.5]))
            rate = float(rng.uniform(0, 0.04))
            root = self.enterContext(tempfile.TemporaryDirectory())
            files, kinds = [], []
            for name in ("a.jsonl", "b.jsonl.gz"):
                n = int(rng.integers(200, 900))
                row = ["good"] + [("bad" if rng.random() < rate else
                                   "empty" if rng.random() < 0.05 else "good")
                                  for _ in range(n - 1)]
                lines = [json.dumps({"text": f"{name} doc {i}"}) if k == "good" else
                         json.dumps({"text": " "}) if k == "empty" else
                         bad_kinds[int(rng.integers(len(bad_kinds)))]
                         for i, k in enumerate(row)]
                path = os.path.join(root, name)
                with (gzip.open if name.endswith(".gz") else open)(
                        path, "wt", encoding="utf-8") as f:
                    f.write("\n".join(lines) + "\n")
                files.append(path)
                kinds.append([(k, lines[i], f"{name} doc {i}") for i, k in enumerate(row)])
            # Reference: the documents before the first bad record that takes the bad records
            # past `fraction` of the records read (of at least MIN_RECORDS).
            want, stop, bad, records = [], None, 0, 0
            for path, row in zip(files, kinds):
                for kind, _, doc in row:
                    records += 1
                    if kind == "good":
                        want.append(doc)
                    elif kind == "bad":
                        bad += 1
                        if bad > fraction * max(records, sources.MIN_RECORDS):
                            stop = (path, bad, records)
                            break
                if stop:
                    break
            got = []
            with self.subTest(seed=seed, fraction=fraction, rate=rate):
                with self.assertLogs(level="WARNING") if bad else contextlib.nullcontext():
                    reader = sources.read_documents([root], max_bad_fraction=fraction)
                    if stop is None:
                        got.extend(reader)
                    else:
                        path, n_bad, n_records = stop
                        with self.assertRaises(ValueError) as cm:
                            for doc in reader:
                                got.append(doc)
                        message = str(cm.exception)
                        self.assertNotIn("\n", message)
                        self.assertTrue(message.startswith(
                            f"{path}: stopped: {n_bad} of the {n_records} records read so far "
                            f"are bad ({n_bad / n_records:.0%}: "), message)
                        self.assertIn(f"more than data.max_bad_fraction={fraction:g} allows",
                                      message)
                self.assertEqual(got, want)
            outcomes.add(stop is None)
        self.assertEqual(outcomes, {True, False})  # both sides of the limit were met

    def test_sniff_binary(self):
        rng = np.random.default_rng(0)
        noise = _write_bytes(os.path.join(self.root, "n.txt"),
                             rng.integers(0, 256, 4096, dtype=np.uint8).tobytes())
        self.assertRegex(sources.sniff_binary(noise), r"NUL bytes in its first 4,096 bytes")
        utf16 = _write_bytes(os.path.join(self.root, "u.txt"), self.docs[0].encode("utf-16"))
        self.assertRegex(sources.sniff_binary(utf16), "NUL")
        high = _write_bytes(os.path.join(self.root, "h.txt"), bytes(range(0x80, 0x100)) * 8)
        self.assertRegex(sources.sniff_binary(high), "invalid UTF-8")
        prose = "Il était une fois un roi qui avait trois filles; la plus jeune était très belle. "
        latin1 = _write_bytes(os.path.join(self.root, "l.txt"), (prose * 200).encode("latin-1"))
        self.assertIsNone(sources.sniff_binary(latin1))
        # A multi-byte character cut by the 64 KiB window is not counted as invalid.
        cut = _write_bytes(os.path.join(self.root, "c.txt"), "é".encode() * 40_000)
        self.assertIsNone(sources.sniff_binary(cut, size=3))
        self.assertIsNone(sources.sniff_binary(_write_bytes(os.path.join(self.root, "e"), b"")))

    def test_read_stats_merge(self):
        a = sources.ReadStats(files=1, documents=2, malformed_lines=1, examples=["x"])
        a.merge(sources.ReadStats(files=2, documents=3, invalid_utf8=4, examples=["y"]))
        self.assertEqual(a.counters(), {"files": 3, "documents": 5, "empty_documents": 0,
                                        "invalid_utf8": 4, "invalid_utf8_files": 0,
                                        "malformed_lines": 1, "missing_field": 0})
        self.assertEqual(a.examples, ["x", "y"])


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
