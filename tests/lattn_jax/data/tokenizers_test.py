"""Tests for lattn_jax.data.tokenizers."""

from absl.testing import absltest

from lattn_jax import assets
from lattn_jax.data import tokenizers


class ByteTokenizerTest(absltest.TestCase):

    def test_round_trip(self):
        tok = tokenizers.ByteTokenizer()
        text = "Hello, wörld! ✓ 日本\n\ttabs"
        ids = tok.encode(text)
        self.assertEqual(ids, list(text.encode("utf-8")))
        self.assertTrue(all(0 <= i < 256 for i in ids))
        self.assertEqual(tok.decode(ids), text)
        self.assertEqual(tok.decode(ids + [tok.eos_id]), text)  # EOS produces no text

    def test_special_ids(self):
        tok = tokenizers.ByteTokenizer()
        self.assertEqual((tok.vocab_size, tok.eos_id, tok.bos_id), (257, 256, None))
        with self.assertRaisesRegex(ValueError, "outside"):
            tok.decode([257])


class SentencePieceTokenizerTest(absltest.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.tok = tokenizers.SentencePieceTokenizer(assets.asset_path(assets.LLAMA2_TOKENIZER))

    def test_llama2_ids(self):
        self.assertEqual(self.tok.encode("Hello world"), [15043, 3186])
        self.assertEqual(self.tok.encode_batch(["Hello world", ""]), [[15043, 3186], []])
        self.assertEqual(self.tok.decode([15043, 3186, self.tok.eos_id]), "Hello world")

    def test_llama2_specials(self):
        self.assertEqual((self.tok.vocab_size, self.tok.eos_id, self.tok.bos_id), (32000, 2, 1))

    def test_make_tokenizer(self):
        self.assertIsInstance(tokenizers.make_tokenizer("byte"), tokenizers.ByteTokenizer)
        tok = tokenizers.make_tokenizer("sentencepiece")  # bundled LLaMA-2 model by default
        self.assertEqual(tok.encode("Hello world"), [15043, 3186])
        with self.assertRaisesRegex(ValueError, "unknown tokenizer"):
            tokenizers.make_tokenizer("gpt2")
        with self.assertRaisesRegex(FileNotFoundError, "/no/such/tokenizer.model"):
            tokenizers.make_tokenizer("sentencepiece", "/no/such/tokenizer.model")


if __name__ == "__main__":
    absltest.main()
