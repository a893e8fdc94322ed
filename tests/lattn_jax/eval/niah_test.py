"""NIAH: the needle lands at the requested depth, prompts fit the length, the scorer is lenient."""

import os
import random
import re
import zlib

import numpy as np
from absl.testing import absltest, parameterized

from configs import halo_smollm2

from lattn_jax.data import tokenizers as tok_lib
from lattn_jax.eval import niah

ESSAYS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "shared", "data", "niah",
                      "PaulGrahamEssays")
WORDS = ("Startups are hard. Most of them fail! Why do they fail? Because founders give up. "
         "Persistence matters more than brilliance. " * 40).split()


GGUF = os.environ.get("SMOLLM2_GGUF") or halo_smollm2.smollm2_gguf_path()


class WordTokenizer(tok_lib.ByteTokenizer):
    """GPT-2-like pre-tokens (``" ?word"``, ``" ?punctuation"``, whitespace runs), one id each:
    multi-character tokens whose counts add up over pieces like a byte-level BPE's."""

    _PRE = re.compile(r" ?\w+| ?[^\w\s]+|\s+(?!\S)|\s+")

    def encode(self, text):
        return [zlib.crc32(m.encode()) % 5000 for m in self._PRE.findall(text)]


class PairTokenizer(tok_lib.ByteTokenizer):
    """One id per two bytes: not additive over pieces of odd length."""

    def encode(self, text):
        b = text.encode()
        return [int.from_bytes(b[i:i + 2], "big") for i in range(0, len(b), 2)]


def _after_draws(task, seed):
    rng = random.Random(seed)
    niah._draw_needles(task, rng)
    return rng.random()


class NiahTest(parameterized.TestCase):

    @parameterized.product(task=niah.TASKS, depth=(0.0, 25.0, 50.0, 100.0))
    def test_needle_at_requested_depth_and_length_fits(self, task, depth):
        tok = tok_lib.ByteTokenizer()
        s = niah.make_sample(task, tok, 1024, depth, random.Random(0), WORDS, max_new_tokens=32)
        self.assertLessEqual(s.num_tokens + 32, 1024)
        self.assertGreater(s.num_tokens + 32, 1024 - 120)  # the haystack fills the budget
        needle = f"for {s.key} is: {s.value}."
        self.assertEqual(s.prompt.count(s.value), 1)
        self.assertIn(needle, s.prompt[s.needle_char:s.needle_char + 200])
        start, end = s.context_chars
        sentence = len(f"One of the special magic xs for {s.key} is: {s.value}.") + 1
        rel = (s.needle_char - start) / (end - start - sentence)  # 0 = first, 1 = last
        self.assertAlmostEqual(rel, depth / 100.0, delta=0.1)
        self.assertTrue(s.prompt.endswith("mentioned in the provided text is"))
        if task == "niah_single_3":
            self.assertLen(s.value, 36)
        else:
            self.assertLen(s.value, 7)

    @parameterized.parameters(0.0, 40.0, 100.0)
    def test_multikey_needles(self, depth):
        tok = tok_lib.ByteTokenizer()
        s = niah.make_sample("niah_multikey_1", tok, 4096, depth, random.Random(1), WORDS, 32)
        self.assertLessEqual(s.num_tokens + 32, 4096)
        self.assertEqual(s.prompt.count("One of the special magic numbers for "),
                         niah.MULTIKEY_NEEDLES)
        self.assertEqual(s.prompt.count(s.value), 1)
        self.assertEqual(s.prompt.count(f"for {s.key} is: "), 1)  # distractor keys differ
        self.assertIn(f"for {s.key} is: {s.value}.", s.prompt[s.needle_char:s.needle_char + 200])
        start, end = s.context_chars
        self.assertAlmostEqual((s.needle_char - start) / (end - start), depth / 100.0,
                               delta=0.1)
        # The question asks for the first key.
        self.assertTrue(s.prompt.endswith(f"for {s.key} mentioned in the provided text is"))

    def test_start_units_hint_gives_the_same_sample(self):
        tok = tok_lib.ByteTokenizer()
        for task in ("niah_single_1", "niah_single_2", "niah_multikey_1"):
            ref = niah.make_sample(task, tok, 2048, 50.0, random.Random(3), WORDS)
            self.assertGreater(ref.haystack_units, 8)
            for hint in (1, ref.haystack_units // 2, ref.haystack_units,
                         ref.haystack_units + 1, 3 * ref.haystack_units):
                s = niah.make_sample(task, tok, 2048, 50.0, random.Random(3), WORDS,
                                     start_units=hint)
                self.assertEqual(s, ref, msg=f"{task=} {hint=}")

    @parameterized.parameters("byte", "words")
    def test_sample_builder_gives_make_samples_prompts_and_ids(self, kind):
        tok = tok_lib.ByteTokenizer() if kind == "byte" else WordTokenizer()
        builder = niah.SampleBuilder(tok, WORDS)
        self.assertTrue(builder.exact)
        draw = random.Random(11)
        for task in niah.ALL_TASKS:
            for _ in range(6):
                length = draw.randint(700 if kind == "byte" else 200, 5000)
                depth = draw.choice([0.0, 100.0, round(draw.uniform(0, 100), 1)])
                seed = draw.randrange(1000)
                ref = niah.make_sample(task, tok, length, depth, random.Random(seed), WORDS, 16)
                for hint in (None, ref.haystack_units, ref.haystack_units + draw.randint(1, 9),
                             max(1, ref.haystack_units - draw.randint(1, 9))):
                    rng = random.Random(seed)
                    s, ids = builder.make_sample(task, length, depth, rng, 16, hint)
                    msg = f"{task=} {length=} {depth=} {hint=}"
                    self.assertEqual(s, ref, msg=msg)
                    self.assertEqual(ids.dtype, np.int32)
                    self.assertEqual(ids.tolist(), tok.encode(s.prompt), msg=msg)
                    # The key and value draws leave rng where make_sample leaves it.
                    self.assertEqual(rng.random(), _after_draws(task, seed))

    def test_sample_builder_falls_back_where_pieces_do_not_add_up(self):
        tok = PairTokenizer()
        builder = niah.SampleBuilder(tok, WORDS)
        self.assertFalse(builder.exact)  # "abc" + " d" is not "abc d" in byte pairs
        for task in ("niah_single_1", "niah_single_2"):
            ref = niah.make_sample(task, tok, 800, 40.0, random.Random(2), WORDS, 16)
            s, ids = builder.make_sample(task, 800, 40.0, random.Random(2), 16)
            self.assertEqual(s, ref)
            self.assertEqual(ids.tolist(), tok.encode(s.prompt))

    def test_piece_tokenizer(self):
        tok = WordTokenizer()
        pieces = niah.PieceTokenizer(tok)
        for text in ("a b\nc d", " lead and  double  spaces\n end ", "", "x", "one. Two!\n\nThree"):
            np.testing.assert_array_equal(pieces.encode(text), tok.encode(text))
            self.assertEqual(pieces.count(text), len(tok.encode(text)))
        self.assertTrue(pieces.matches(["a b", "c  d"]))
        self.assertFalse(niah.PieceTokenizer(PairTokenizer()).matches(["abc d"]))

    @absltest.skipIf(not (GGUF and os.path.isdir(ESSAYS)), "no SmolLM2 GGUF or essays")
    def test_sample_builder_with_the_smollm2_tokenizer(self):
        tok = tok_lib.make_tokenizer("gguf", GGUF)
        words = niah.load_essays(ESSAYS)
        builder = niah.SampleBuilder(tok, words)
        self.assertTrue(builder.exact)
        for task in niah.ALL_TASKS:
            for length, depth in ((1500, 0.0), (3000, 63.0), (4096, 100.0)):
                ref = niah.make_sample(task, tok, length, depth, random.Random(length), words, 48)
                s, ids = builder.make_sample(task, length, depth, random.Random(length), 48)
                self.assertEqual(s, ref, msg=f"{task=} {length=}")
                self.assertEqual(ids.tolist(), tok.encode(s.prompt))

    def test_scorer_accepts_right_value_and_rejects_wrong_one(self):
        self.assertEqual(niah.string_match_all(" 1234567. The end", ["1234567"]), 1.0)
        self.assertEqual(niah.string_match_all(" 1234568.", ["1234567"]), 0.0)
        uid = "0c5b9a3e-57f4-4c1e-9d2c-3b1a8e7f6d54"
        self.assertEqual(niah.string_match_all(uid.upper(), [uid]), 1.0)

    def test_run_with_an_oracle(self):
        tok = tok_lib.ByteTokenizer()

        def oracle(prompts, n):  # answers with the needle value found in the prompt
            out = []
            for p in prompts:
                text = tok.decode(p)
                value = text.split(" is: ")[1].split(".")[0]
                out.append(tok.encode(" " + value))
            return out

        res = niah.run(oracle, tok, tasks=("niah_single_1",), lengths=(512,), depths=(0, 50),
                       essay_words=WORDS)
        self.assertEqual(res["niah_single_1"]["grid"], [[1.0, 1.0]])

    def test_errors(self):
        with self.assertRaisesRegex(ValueError, "unknown NIAH task"):
            niah.build_prompt("niah_single_9", 1, 0, "k", "v")
        with self.assertRaisesRegex(FileNotFoundError, "no haystack essays"):
            niah.load_essays("/nonexistent")

    @absltest.skipIf(not os.path.isdir(ESSAYS), "shared/data/niah not present")
    def test_essays(self):
        words = niah.load_essays(ESSAYS)
        self.assertGreater(len(words), 100_000)


class AnswerModeTest(absltest.TestCase):

    def test_modes_of_hand_made_answers(self):
        rng = random.Random(7)
        for task in ("niah_single_2", "niah_single_3"):
            value = niah.needle_value(task, rng)
            half = value[:-(-len(value) // 2)]
            cases = {f" {value}. It is": "value_first", f': "{value.upper()}"': "value_first",
                     f" the number is {value}": "value_later",
                     f" {half} and more": "partial_value",
                     f" {value[-len(half):]}": "no_value",  # its second half only
                     " the uuid for brave-anchor.": "no_value"}
            for answer, want in cases.items():
                self.assertEqual(niah.answer_mode(answer, value), want, (task, answer))
                # A hit exactly when string_match_all scores one.
                self.assertEqual(want.startswith("value_"),
                                 niah.string_match_all(answer, [value]) == 1.0, answer)
        with self.assertRaisesRegex(ValueError, "non-empty needle value"):
            niah.answer_mode("x", "")


if __name__ == "__main__":
    absltest.main()
