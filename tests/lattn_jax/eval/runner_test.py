"""``lattn_jax.eval.runner``: held-out documents for perplexity."""

import dataclasses
import hashlib
import json
import math
import os
import random
import re
import shlex
import shutil
import tempfile

import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from flax import nnx

from lattn_jax.data import config as data_config
from lattn_jax.data import pipeline
from lattn_jax.data import sources as data_sources
from lattn_jax.data import tokenizers as tok_lib
from lattn_jax.eval import niah
from lattn_jax.eval import perplexity as ppl_lib
from lattn_jax.eval import runner
from lattn_jax.eval import scoring
from lattn_jax.eval import tasks


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

    def test_invalid_utf8_is_replaced_with_a_warning_naming_the_file(self):
        path = os.path.join(self.tmp, "latin1.txt")
        with open(path, "wb") as f:
            f.write("A caf\u00e9 serves cr\u00e8me br\u00fbl\u00e9e to everyone.\n"
                    .encode("latin-1"))
        with self.assertLogs("absl", level="WARNING") as logs:
            docs = runner.read_documents(path, None)
        self.assertEqual(docs, ["A caf\ufffd serves cr\ufffdme br\ufffdl\ufffde to everyone.\n"])
        self.assertEqual(len(logs.output), 1)
        self.assertIn(f"{path}: replaced 4 invalid UTF-8 sequence(s) by U+FFFD", logs.output[0])

    def test_a_binary_file_is_refused_naming_it(self):
        path = os.path.join(self.tmp, "image.png")
        with open(path, "wb") as f:
            f.write(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
        with self.assertRaisesRegex(ValueError, f"^--perplexity_files: {path} looks binary"):
            runner.read_documents(path, None)


FIXTURES = os.path.join(os.path.dirname(__file__), "testdata", "eval_data")


class Bigram(nnx.Module):
    """``logits[b, t] = table[tokens[b, t]]`` over bytes: a model that runs in milliseconds."""

    def __init__(self, seed=0, vocab=257):
        table = np.random.default_rng(seed).normal(size=(vocab, vocab)) * 2
        self.table = nnx.Param(jnp.asarray(table, jnp.float32))

    def __call__(self, tokens, route=True):
        return jnp.take(self.table[...], tokens, axis=0)


def _options(data_dir, **kw):
    return runner.EvalOptions(data_dir=data_dir, max_len=1024, batch_size=2, **kw)


class NiahGridTest(absltest.TestCase):

    def test_flag_entries_are_parsed_and_a_bad_one_is_named(self):
        self.assertEqual(runner.parse_niah_grid(["1024", " 2048"], ["0", "50", "100"]),
                         ((1024, 2048), (0.0, 50.0, 100.0)))
        for lengths, depths, message in (
                (["1024", "0"], ["50"], "--niah_lengths=1024,0: '0' is not a positive integer "
                                        "(a length in tokens)"),
                (["-5"], ["50"], "--niah_lengths=-5: '-5' is not a positive integer"),
                (["1024", "1k"], ["50"], "--niah_lengths=1024,1k: '1k' is not a positive"),
                (["1.5"], ["50"], "--niah_lengths=1.5: '1.5' is not a positive integer"),
                (["1024"], ["50", "150"], "--niah_depths=50,150: '150' is not a number in "
                                          "[0, 100] (a depth in percent)"),
                (["1024"], ["half"], "--niah_depths=half: 'half' is not a number")):
            with self.subTest(message):
                with self.assertRaisesRegex(ValueError, "^" + re.escape(message)):
                    runner.parse_niah_grid(lengths, depths)


def _moved_corpus(path):
    """The data config of a run whose corpus was at ``path`` (since moved away)."""
    with data_config.unchecked_data_paths():
        return data_config.DataConfig(paths=(path,), seq_len=8, batch_size=1)


class PreflightTest(absltest.TestCase):
    """Issue 32, trap 4: every requested task's files are checked before anything is scored."""

    def test_missing_second_task_fails_before_scoring_the_first(self):
        data = tempfile.mkdtemp()
        shutil.copytree(os.path.join(FIXTURES, "eval", "piqa"), os.path.join(data, "eval", "piqa"))
        logged = []
        with self.assertRaises(FileNotFoundError) as ctx:
            runner.run_evaluation(Bigram(), tok_lib.ByteTokenizer(), ["piqa", "hellaswag"],
                                  _options(data), log=logged.append)
        self.assertIn("hellaswag_val_full.txt.bz2", str(ctx.exception))
        self.assertNotIn("valid.jsonl", str(ctx.exception))
        self.assertEqual(logged, [])  # piqa was not scored

    def test_a_niah_length_too_short_for_the_prompt_names_the_flag_before_scoring(self):
        # evaluate.py --tasks=piqa,niah_single_1 --niah_lengths=<short>: the error came after
        # piqa was scored, without naming the flag.
        rng = random.Random(7)
        tok = tok_lib.ByteTokenizer()
        long_enough = rng.randint(600, 900)
        short = rng.randint(40, 300)  # the byte tokenizer's empty prompt is ~350 tokens
        needles = random.Random(42)  # run()'s seed; the short length's sample is drawn second
        niah._draw_needles("niah_single_1", needles)
        key, value, _ = niah._draw_needles("niah_single_1", needles)
        empty = len(tok.encode(niah.build_prompt("niah_single_1", 0, 0.0, key, value).prompt))
        logged = []
        options = _options(FIXTURES, limit=2, niah_lengths=(long_enough, short),
                           niah_depths=(0.0,), niah_max_new_tokens=32)
        with self.assertRaises(ValueError) as ctx:
            runner.run_evaluation(Bigram(), tok, ["piqa", "niah_single_1"], options,
                                  log=logged.append)
        self.assertEqual(
            str(ctx.exception),
            f"--niah_lengths={long_enough},{short}: {short} is too short for niah_single_1: "
            f"its prompt without haystack has {empty} tokens, plus 32 answer tokens; give "
            f"lengths of at least {empty + 32} (nothing was scored)")
        self.assertEqual(logged, [])  # piqa was not scored
        # The samples run() builds itself are the ones built beforehand.
        kw = dict(lengths=(long_enough,), depths=(0.0, 50.0), max_new_tokens=32)
        self.assertEqual(niah.build_samples("niah_single_1", tok, **kw),
                         [[niah.make_sample("niah_single_1", tok, long_enough, d, r, None, 32)
                           for r in [random.Random(42)] for d in (0.0, 50.0)]])

    def test_a_max_len_shorter_than_a_continuation_names_the_flag_and_the_task(self):
        # It was the scorer's "request 0: continuation of N tokens exceeds max_len=M".
        tok = tok_lib.ByteTokenizer()
        docs = tasks.load_task("piqa", os.path.join(FIXTURES, "eval"), None, 0)[:2]
        longest = max(len(scoring.encode_pair(tok, c, x)[1]) for d in docs for c, x in d.requests)
        max_len = random.Random(3).randint(2, longest - 1)
        logged = []
        with self.assertRaises(ValueError) as ctx:
            runner.run_evaluation(
                Bigram(), tok, ["piqa"],
                dataclasses.replace(_options(FIXTURES, limit=2), max_len=max_len),
                log=logged.append)
        self.assertEqual(str(ctx.exception),
                         f"--max_len={max_len}: piqa has a continuation of {longest} tokens, "
                         f"which does not fit; give --max_len >= {longest}")
        self.assertEqual(logged, [])
        result = runner.run_evaluation(
            Bigram(), tok, ["piqa"], dataclasses.replace(_options(FIXTURES, limit=2),
                                                         max_len=longest))
        self.assertEqual(result["piqa"]["n"], 2)

    def test_every_missing_file_is_listed(self):
        data = tempfile.mkdtemp()
        with self.assertRaises(FileNotFoundError) as ctx:
            runner.check_data(["piqa", "arc_easy", "niah_single_2"], _options(data))
        for name in ("valid.jsonl", "valid-labels.lst", "ARC-Easy-Test.jsonl",
                     "PaulGrahamEssays"):
            self.assertIn(name, str(ctx.exception))
        # The first line names the option and the directory it was given (not "shared/data").
        self.assertIn(f"evaluation data missing under --data_dir={data} (nothing was scored",
                      str(ctx.exception).splitlines()[0])

    def test_a_moved_training_corpus_names_the_recorded_path_not_data_dir(self):
        data = tempfile.mkdtemp()
        moved = os.path.join(data, "moved", "small")
        options = _options(data, training_data=_moved_corpus(moved))
        with self.assertRaises(FileNotFoundError) as ctx:
            runner.check_data(["perplexity"], options)
        message = str(ctx.exception)
        self.assertEqual(message,
                         f"perplexity 'validation' (the run's held-out documents): the run's "
                         f"corpus is missing (nothing was scored): its config records "
                         f"data.paths={moved}, and {moved} does not exist; restore the corpus "
                         f"there, or pass --perplexity_files=<text files> to score other text "
                         f"(--data_dir does not change it)")
        self.assertNotIn("set --data_dir", message)

    def test_a_missing_perplexity_file_names_the_option(self):
        data = tempfile.mkdtemp()
        with self.assertRaises(FileNotFoundError) as ctx:
            runner.check_data(["perplexity"], _options(
                data, perplexity_files=("/nonexistent.txt", "lm/none.txt")))
        self.assertEqual(str(ctx.exception),
                         "--perplexity_files entry not found (nothing was scored; pass existing "
                         "text files, absolute or relative to --data_dir): /nonexistent.txt, "
                         f"lm/none.txt (relative to --data_dir={data}): {data}/lm/none.txt")

    def test_a_binary_perplexity_file_is_refused_before_scoring(self):
        data = tempfile.mkdtemp()
        path = os.path.join(data, "weights.bin")
        with open(path, "wb") as f:
            f.write(bytes(range(256)) * 4)
        with self.assertRaises(ValueError) as ctx:
            runner.check_data(["perplexity"], _options(data, perplexity_files=(path,)))
        message = str(ctx.exception)
        self.assertEqual(len(message.splitlines()), 1, message)
        self.assertTrue(message.startswith(f"--perplexity_files: {path} looks binary, not text ("),
                        message)

    def test_a_perplexity_directory_names_the_flag_and_asks_for_files(self):
        # Was "--perplexity_files entry not found" for a directory that exists.
        data = tempfile.mkdtemp()
        names = sorted(f"t{i}.txt" for i in random.sample(range(100), 4))
        os.makedirs(os.path.join(data, "lm", "sub"))  # a directory in it is not offered
        for n in names:
            with open(os.path.join(data, "lm", n), "w") as f:
                f.write("Some text.\n")
        for entry, where in ((os.path.join(data, "lm"), os.path.join(data, "lm")),
                             ("lm", f"lm (relative to --data_dir={data}): {data}/lm")):
            with self.subTest(entry=entry):
                with self.assertRaises(ValueError) as ctx:
                    runner.check_data(["perplexity"], _options(data, perplexity_files=(entry,)))
                shown = ",".join(os.path.join(entry, n) for n in names[:3])
                self.assertEqual(str(ctx.exception),
                                 f"--perplexity_files: {where} is a directory; each entry must "
                                 f"be a text file: pass the files to score (e.g. "
                                 f"--perplexity_files={shown})")
        empty = os.path.join(data, "empty")
        os.makedirs(empty)
        with self.assertRaisesRegex(ValueError, rf"^--perplexity_files: {empty} is a directory; "
                                                r"each entry must be a text file: pass the files "
                                                r"to score$"):
            runner.check_data(["perplexity"], _options(data, perplexity_files=(empty,)))

    def test_the_perplexity_files_example_is_quoted_for_the_shell(self):
        data = os.path.join(tempfile.mkdtemp(), "eval data é")
        os.makedirs(data)
        with open(os.path.join(data, "a.txt"), "w") as f:
            f.write("Some text.\n")
        with self.assertRaises(ValueError) as ctx:
            runner.check_data(["perplexity"], _options(data, perplexity_files=(data,)))
        example = os.path.join(data, "a.txt")
        self.assertTrue(str(ctx.exception).endswith(
            f"(e.g. --perplexity_files={shlex.quote(example)})"), str(ctx.exception))

    def test_missing_items_of_several_origins_are_each_named(self):
        data = tempfile.mkdtemp()
        with self.assertRaises(FileNotFoundError) as ctx:
            runner.check_data(["piqa", "perplexity"], _options(
                data, perplexity_files=("/nonexistent.txt", runner.VALIDATION),
                training_data=_moved_corpus("/gone/small")))
        lines = str(ctx.exception).splitlines()
        self.assertTrue(lines[0].startswith(f"evaluation data missing under --data_dir={data}"))
        self.assertIn("piqa: ", lines[1])
        self.assertTrue(lines[-2].startswith("--perplexity_files entry not found"), lines)
        self.assertIn("the run's corpus is missing", lines[-1])

    def test_complete_fixture_layout_passes(self):
        runner.check_data(runner.expand_tasks(["zeroshot", "niah"]), _options(FIXTURES))


class StandardErrorTest(absltest.TestCase):
    """Issue 32, trap 4: every accuracy has its binomial standard error sqrt(p (1 - p) / n)."""

    def test_results_and_markdown_carry_standard_errors(self):
        results = runner.run_evaluation(Bigram(), tok_lib.ByteTokenizer(), ["piqa", "arc_easy"],
                                        _options(FIXTURES), log=lambda *a: None)
        for task in ("piqa", "arc_easy"):
            r = results[task]
            for m in ("acc", "acc_norm"):
                self.assertAlmostEqual(r[f"{m}_stderr"],
                                       math.sqrt(r[m] * (1 - r[m]) / r["n"]), places=12)
        table = runner.markdown({"piqa": dict(results["piqa"], acc=0.4, acc_stderr=0.1095)})
        self.assertIn("| stderr |", table)
        self.assertIn("| 0.4000 | 0.1095 |", table)
        self.assertNotIn("step", table)  # no checkpoint step recorded: no column
        # Beside chance, the scored items' majority-answer rate, and a note saying which is which.
        piqa = results["piqa"]
        self.assertIn(f"| {piqa['acc_chance']:.4f} | {piqa['acc_majority']:.4f} | {piqa['n']} |",
                      table)
        self.assertIn("chance: mean 1 / number of choices; majority: ", table)
        older = {k: v for k, v in piqa.items() if not k.endswith("_majority")}  # older results
        self.assertIn(f"| {piqa['acc_chance']:.4f} |  | {piqa['n']} |",
                      runner.markdown({"piqa": older}))
        # Merged results of two checkpoints: each row says which step it scored.
        table = runner.markdown({"piqa": dict(results["piqa"], step=150),
                                 "arc_easy": dict(results["arc_easy"], step=200)})
        self.assertIn("| chance | majority | n | step |", table)
        rows = [line for line in table.splitlines() if line.startswith(("| piqa", "| arc_easy"))]
        self.assertLen(rows, 4)
        for row in rows:
            self.assertTrue(row.endswith(" 150 |" if row.startswith("| piqa") else " 200 |"),
                            row)


class LimitTest(absltest.TestCase):
    """Issue 33: ``limit`` keeps the first N documents (lm-evaluation-harness ``--limit``),
    ``sample_items`` a seeded random subset."""

    HARNESS_DATA = os.path.join(os.path.dirname(__file__), "testdata", "harness_data")

    def _piqa(self, log=lambda *a: None, **kw):
        scored = []

        class Recording(scoring.Scorer):
            def loglikelihood(self, requests):
                scored.extend(requests)
                return super().loglikelihood(requests)

        original = scoring.Scorer
        scoring.Scorer = Recording
        self.addCleanup(setattr, scoring, "Scorer", original)
        result = runner.run_evaluation(Bigram(), tok_lib.ByteTokenizer(), ["piqa"],
                                       _options(self.HARNESS_DATA, **kw), log=log)
        return result["piqa"], scored

    def _pairs(self, docs):
        tok = tok_lib.ByteTokenizer()
        return [scoring.encode_pair(tok, c, x) for d in docs for c, x in d.requests]

    def test_limit_is_the_first_n_documents(self):
        docs = tasks.load_task("piqa", os.path.join(self.HARNESS_DATA, "eval"))
        result, scored = self._piqa(limit=7)
        self.assertEqual(result["n"], 7)
        self.assertEqual(scored, self._pairs(docs[:7]))

    def test_sample_items_is_the_seeded_subset(self):
        eval_dir = os.path.join(self.HARNESS_DATA, "eval")
        result, scored = self._piqa(sample_items=7, seed=3)
        self.assertEqual(result["n"], 7)
        self.assertEqual(scored, self._pairs(tasks.load_task("piqa", eval_dir, limit=7, seed=3)))
        self.assertNotEqual(scored, self._pairs(tasks.load_task("piqa", eval_dir)[:7]))

    def test_sample_items_above_the_task_scores_it_whole_and_says_so(self):
        # It scored the whole task silently (only n told; 2026-12-06 newcomer probe).
        eval_dir = os.path.join(self.HARNESS_DATA, "eval")
        docs = tasks.load_task("piqa", eval_dir)
        size = len(docs)
        above = random.Random(1206).randint(size + 1, 10 * size)
        lines = []
        result, scored = self._piqa(sample_items=above, seed=5, log=lines.append)
        self.assertEqual(result["n"], size)
        self.assertEqual(scored, self._pairs(docs))
        self.assertIn(f"piqa: --sample_items={above} is above the task's {size} items: scoring "
                      f"all {size} (n={size})", lines)
        lines.clear()  # at or below the size: a subset, no note
        for n in (size, random.Random(6).randint(1, size - 1)):
            result, _ = self._piqa(sample_items=n, seed=5, log=lines.append)
            self.assertEqual(result["n"], n)
        self.assertEmpty([line for line in lines if "--sample_items" in line])

    def test_bad_limits_name_the_option(self):
        with self.assertRaisesRegex(ValueError, "limit=5 .* and sample_items=5 .* are exclusive"):
            _options("x", limit=5, sample_items=5)
        for name, unit in (("limit", "items"), ("sample_items", "items"),
                           ("perplexity_max_docs", "documents")):
            with self.assertRaisesRegex(ValueError, f"^{name} must be a positive number of "
                                                    f"{unit}, got 0$"):
                _options("x", **{name: 0})
        with self.assertRaisesRegex(ValueError, "perplexity_max_docs must be a positive"):
            _options("x", perplexity_max_docs=-3)


class MergeResultsTest(absltest.TestCase):
    """Issue 32, trap 4: results.json keeps earlier tasks and replaces re-run ones."""

    def test_runs_merge_per_task(self):
        out = tempfile.mkdtemp()
        runner.write_results({"piqa": {"acc": 0.4, "acc_stderr": 0.1, "acc_chance": 0.5,
                                       "n": 20}}, out)
        runner.write_results({"boolq": {"acc": 0.6, "acc_stderr": 0.1, "acc_chance": 0.5,
                                        "n": 20}}, out)
        runner.write_results({"piqa": {"acc": 0.55, "acc_stderr": 0.1, "acc_chance": 0.5,
                                       "n": 20}}, out)
        with open(os.path.join(out, "results.json")) as f:
            merged = json.load(f)
        self.assertEqual(set(merged), {"piqa", "boolq"})
        self.assertEqual(merged["piqa"]["acc"], 0.55)
        self.assertEqual(merged["boolq"]["acc"], 0.6)
        with open(os.path.join(out, "results.md")) as f:
            md = f.read()
        self.assertIn("| boolq |", md)
        self.assertIn("0.5500", md)
        self.assertEqual([f for f in os.listdir(out) if f.startswith(".")], [])  # no temp left

    def test_a_damaged_results_file_is_named_and_kept(self):
        out = tempfile.mkdtemp()
        self.assertEqual(runner.read_results(out), {})
        path = os.path.join(out, "results.json")
        for text, problem in (('{"piqa": {"acc": 0.5', "is not valid JSON"),
                              ("[1, 2]", "does not hold a JSON object")):
            with open(path, "w") as f:
                f.write(text)
            with self.assertRaisesRegex(ValueError, f"^{path} {problem}"):
                runner.read_results(out)
            with self.assertRaisesRegex(ValueError, f"^{path} {problem}"):
                runner.write_results({"piqa": {"acc": 0.4, "n": 1}}, out)
            with open(path) as f:
                self.assertEqual(f.read(), text)  # not replaced


class PerplexityKeyTest(absltest.TestCase):
    """Perplexity files named alike (two test.txt) each keep their own results.json entry, which
    records the file scored (was one key perplexity:test.txt, the last score, and no path)."""

    def setUp(self):
        super().setUp()
        self.tmp = tempfile.mkdtemp()
        self.files = []
        for sub, text in (("pa", "alpha beta gamma . " * 8), ("pb", "delta , delta . " * 5)):
            os.makedirs(os.path.join(self.tmp, sub))
            self.files.append(os.path.join(self.tmp, sub, "test.txt"))
            with open(self.files[-1], "w") as f:
                f.write(text)
        self.kw = dict(perplexity_window=32, perplexity_stride=32)

    def score(self, files, existing=None):
        return runner.run_evaluation(Bigram(), tok_lib.ByteTokenizer(), ["perplexity"],
                                     _options(self.tmp, perplexity_files=tuple(files), **self.kw),
                                     log=lambda *a: None, existing=existing)

    def test_two_files_of_one_name_in_one_run_get_two_entries_with_their_paths(self):
        results = self.score(self.files)
        out = os.path.join(self.tmp, "eval")
        runner.write_results(results, out)
        with open(os.path.join(out, "results.json")) as f:
            stored = json.load(f)
        self.assertEqual(sorted(stored), sorted(f"perplexity:{p}" for p in self.files))
        for p in self.files:
            entry = stored[f"perplexity:{p}"]
            self.assertEqual(entry["path"], p)
            self.assertEqual(entry["size"], os.path.getsize(p))
            with open(p, "rb") as f:
                self.assertEqual(entry["sha256"], hashlib.sha256(f.read()).hexdigest()[:16])
        self.assertNotEqual(*(stored[f"perplexity:{p}"]["token_perplexity"] for p in self.files))

    def test_a_later_run_on_another_file_of_the_name_keeps_the_earlier_entry(self):
        out = os.path.join(self.tmp, "eval")
        first = self.score(self.files[:1])
        self.assertEqual(list(first), ["perplexity:test.txt"])  # unique: the base name
        runner.write_results(first, out)
        second = self.score(self.files[1:], runner.read_results(out))
        self.assertEqual(list(second), [f"perplexity:{self.files[1]}"])
        runner.write_results(second, out)
        again = self.score(self.files[:1], runner.read_results(out))  # the same file: replaced
        self.assertEqual(list(again), ["perplexity:test.txt"])
        runner.write_results(again, out)
        stored = runner.read_results(out)
        self.assertCountEqual(stored, ["perplexity:test.txt", f"perplexity:{self.files[1]}"])
        self.assertEqual(stored["perplexity:test.txt"]["path"], self.files[0])
        self.assertIn(f"perplexity:{self.files[1]}", runner.markdown(stored))

    def test_an_old_entry_without_a_path_is_replaced_with_a_note(self):
        old = {"perplexity:test.txt": {"token_perplexity": 9.0, "documents": 1}}
        logged = []
        results = runner.run_evaluation(
            Bigram(), tok_lib.ByteTokenizer(), ["perplexity"],
            _options(self.tmp, perplexity_files=(self.files[0],), **self.kw),
            log=logged.append, existing=old)
        self.assertEqual(list(results), ["perplexity:test.txt"])
        self.assertTrue(any("records no path" in m for m in logged), logged)

    def test_an_empty_file_is_named_before_scoring(self):
        empty = os.path.join(self.tmp, "empty.txt")
        with open(empty, "w") as f:
            f.write(" \n\n ")
        with self.assertRaisesRegex(ValueError, f"^--perplexity_files: {empty} has no documents "
                                                f"to score"):
            runner.check_data(["perplexity"], _options(self.tmp, perplexity_files=(empty,)))


class PerplexityBatchTest(absltest.TestCase):
    """Issue 32, trap 6: perplexity is batched memory-safely by default, same numbers."""

    def test_default_perplexity_batch_is_small(self):
        self.assertLessEqual(runner.EvalOptions(data_dir="x").perplexity_batch_size, 2)

    def test_batch_size_does_not_change_perplexity(self):
        docs = runner.read_documents(
            os.path.join(FIXTURES, "lm", "wikitext-2-raw", "wiki.test.raw"), None)
        tok = tok_lib.ByteTokenizer()
        got = [ppl_lib.evaluate(scoring.Scorer(Bigram(), max_len=64, batch_size=b, bucket=32),
                                tok, docs, max_len=64, stride=48) for b in (1, 2, 16)]
        for r in got[1:]:
            self.assertAlmostEqual(r["token_perplexity"], got[0]["token_perplexity"], places=4)
            self.assertEqual(r["tokens"], got[0]["tokens"])


class HeldOutPerplexityTest(absltest.TestCase):
    """Issue 32, trap 5: perplexity defaults to text the checkpoint did not train on."""

    def setUp(self):
        super().setUp()
        self.tmp = tempfile.mkdtemp()
        articles = "".join(f" = Article {i} = \n \n Text of article {i} , number {i} . \n \n"
                           for i in range(10))
        self.corpus = os.path.join(self.tmp, "wiki.corpus.raw")
        with open(self.corpus, "w") as f:
            f.write(articles)
        self.data = data_config.DataConfig(paths=(self.corpus,), doc_split="wikitext",
                                           tokenizer="byte", seq_len=16, batch_size=2,
                                           val_fraction=0.3, seed=3)

    def test_default_is_the_runs_validation_documents(self):
        self.assertEqual(runner.EvalOptions(data_dir="x").perplexity_files, ("validation",))

    def test_validation_documents_are_the_pipelines_held_out_split(self):
        docs = runner.validation_documents(self.data)
        all_docs = list(data_sources.read_documents((self.corpus,), doc_split="wikitext"))
        train_idx, val_idx = pipeline.split_documents(len(all_docs), 0.3, 3)
        self.assertEqual(docs, [all_docs[i] for i in sorted(val_idx)])
        self.assertEqual(len(docs), 3)
        self.assertFalse(set(docs) & {all_docs[i] for i in train_idx})

    def test_validation_perplexity_runs_and_training_files_are_flagged(self):
        logged = []
        options = _options(self.tmp, perplexity_files=("validation", self.corpus),
                           perplexity_window=32, perplexity_stride=32, training_data=self.data)
        results = runner.run_evaluation(Bigram(), tok_lib.ByteTokenizer(), ["perplexity"],
                                        options, log=logged.append)
        self.assertEqual(results["perplexity:validation"]["documents"], 3)
        self.assertFalse(results["perplexity:validation"]["trained_on"])
        self.assertTrue(results["perplexity:wiki.corpus.raw"]["trained_on"])
        self.assertEqual(sum("trains on" in str(m) and "wiki.corpus.raw" in str(m)
                             for m in logged), 1)
        self.assertIn("trained on", runner.markdown(results))

    def test_a_document_subset_gets_its_own_key_and_keeps_the_full_result(self):
        # --perplexity_max_docs=N scores the first N documents; the entry must say so and not
        # replace (in results.json) the full-file number under the plain key.
        rng = np.random.default_rng(7)
        words = [" ".join(rng.choice(["alpha", "beta", "gamma", "delta", ","], size=12))
                 for _ in range(8)]
        other = os.path.join(self.tmp, "wiki.other.raw")
        with open(other, "w") as f:
            f.write("".join(f" = Title {i} = \n \n {w} . \n \n" for i, w in enumerate(words)))
        n = int(rng.integers(1, 8))
        logged = []
        kw = dict(perplexity_files=(other,), perplexity_window=32, perplexity_stride=32)
        full = runner.run_evaluation(Bigram(), tok_lib.ByteTokenizer(), ["perplexity"],
                                     _options(self.tmp, **kw), log=logged.append)
        subset = runner.run_evaluation(
            Bigram(), tok_lib.ByteTokenizer(), ["perplexity"],
            _options(self.tmp, perplexity_max_docs=n, **kw), log=logged.append)
        self.assertEqual(list(full), ["perplexity:wiki.other.raw"])
        self.assertEqual(full["perplexity:wiki.other.raw"]["documents"], 8)
        self.assertEqual(list(subset), [f"perplexity:wiki.other.raw@{n}_docs"])
        entry = subset[f"perplexity:wiki.other.raw@{n}_docs"]
        self.assertEqual((entry["documents"], entry["documents_total"], entry["max_docs"]),
                         (n, 8, n))
        self.assertIn(f"perplexity {other}: scored the first {n} of 8 documents "
                      f"(--perplexity_max_docs={n})", logged)
        out = tempfile.mkdtemp()
        runner.write_results(full, out)
        runner.write_results(subset, out)
        merged = runner.read_results(out)
        self.assertEqual(merged["perplexity:wiki.other.raw"], full["perplexity:wiki.other.raw"])
        self.assertEqual(merged[f"perplexity:wiki.other.raw@{n}_docs"]["documents"], n)
        self.assertIn(f"first {n} of 8 documents", runner.markdown(merged))
        # A limit at or above the file's documents scores the whole file: the plain key.
        whole = runner.run_evaluation(
            Bigram(), tok_lib.ByteTokenizer(), ["perplexity"],
            _options(self.tmp, perplexity_max_docs=8 + n, **kw), log=logged.append)
        self.assertEqual(list(whole), ["perplexity:wiki.other.raw"])
        self.assertAlmostEqual(whole["perplexity:wiki.other.raw"]["token_perplexity"],
                               full["perplexity:wiki.other.raw"]["token_perplexity"], places=6)

    def test_a_copy_of_a_training_file_is_flagged(self):
        # shared/data's WikiText-2 files are byte-identical to the bundled training corpus.
        copy = os.path.join(tempfile.mkdtemp(), "copy.txt")
        shutil.copyfile(self.corpus, copy)
        self.assertTrue(runner.trained_on(copy, self.data))
        with open(copy, "a") as f:
            f.write("more\n")
        self.assertFalse(runner.trained_on(copy, self.data))
        self.assertFalse(runner.trained_on(copy, None))

    def test_validation_needs_the_runs_corpus_before_scoring(self):
        # A run restored elsewhere (restore.load_config does not require data.paths to exist).
        with data_config.unchecked_data_paths():
            moved = dataclasses.replace(self.data, paths=("/no/such/corpus.raw",))
        options = _options(self.tmp, training_data=moved)
        with self.assertRaisesRegex(FileNotFoundError, "held-out documents.*/no/such/corpus"):
            runner.run_evaluation(Bigram(), tok_lib.ByteTokenizer(), ["piqa", "perplexity"],
                                  dataclasses.replace(options, data_dir=FIXTURES),
                                  log=lambda *a: None)

    def test_validation_needs_the_runs_data_config(self):
        with self.assertRaisesRegex(ValueError, "validation"):
            runner.run_evaluation(Bigram(), tok_lib.ByteTokenizer(), ["perplexity"],
                                  _options(self.tmp), log=lambda *a: None)


if __name__ == "__main__":
    absltest.main()
