"""Tests for lattn_jax.data.config."""

import os
import tempfile

import numpy as np
from absl.testing import absltest

from lattn_jax import assets
from lattn_jax.data import config as config_lib


class DataConfigTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.root = self.enterContext(tempfile.TemporaryDirectory())
        self.data = os.path.join(self.root, "corpus.txt")
        with open(self.data, "w", encoding="utf-8") as f:
            f.write("a\n\nb\n")

    def _make(self, **overrides):
        kwargs = dict(paths=(self.data,), tokenizer="byte", seq_len=8, batch_size=2)
        kwargs.update(overrides)
        return config_lib.DataConfig(**kwargs)

    def test_defaults(self):
        cfg = self._make(tokenizer="sentencepiece", paths=self.data)
        self.assertEqual(cfg.paths, (self.data,))  # a single string is wrapped
        self.assertEqual(cfg.tokenizer_path, assets.asset_path(assets.LLAMA2_TOKENIZER))
        self.assertEqual((cfg.format, cfg.val_fraction, cfg.seed), ("auto", 0.01, 0))
        # prepare_data.py's --max_bad_fraction default: the same limit on both data paths.
        self.assertEqual(cfg.max_bad_fraction, 0.01)

    def test_missing_data_file(self):
        missing = os.path.join(self.root, "nope", "x.txt")
        with self.assertRaises(FileNotFoundError) as cm:
            self._make(paths=(self.data, missing))
        self.assertEqual(str(cm.exception), f"data.paths: no such file or directory: {missing}")

    def test_missing_tokenizer_file(self):
        with self.assertRaisesRegex(FileNotFoundError,
                                    "data.tokenizer_path: no such file: /no/tok.model"):
            self._make(tokenizer="sentencepiece", tokenizer_path="/no/tok.model")

    def test_a_tokenizer_directory_is_named_as_one(self):
        # --config.data.tokenizer_path=<dir holding vocab.json> said "no such file: <dir>".
        directory = os.path.join(self.root, f"tok{np.random.randint(1000)}")
        os.makedirs(directory)
        for name in ("vocab.json", "merges.txt"):
            open(os.path.join(directory, name), "w").close()
        with self.assertRaises(FileNotFoundError) as cm:
            self._make(tokenizer="huggingface", tokenizer_path=directory)
        self.assertEqual(str(cm.exception), (
            f"data.tokenizer_path: {directory} is a directory; give the tokenizer file in it "
            f"(a tokenizer.json, .model or .gguf file; it holds merges.txt, vocab.json)"))

    def test_bad_values_name_the_field(self):
        for field, value in (("seq_len", 0), ("batch_size", -1), ("val_fraction", 1.0),
                             ("val_fraction", 0.0), ("format", "csv"), ("doc_split", "para"),
                             ("tokenizer", "gpt2"), ("max_val_batches", 0), ("seed", -1),
                             ("text_field", ""), ("paths", ()), ("max_bad_fraction", -0.1),
                             ("max_bad_fraction", 1.5), ("max_bad_fraction", "0.1"),
                             ("max_bad_fraction", True)):
            with self.subTest(field=field, value=value):
                with self.assertRaisesRegex(ValueError, f"^data.{field}:"):
                    self._make(**{field: value})
        with self.assertRaisesRegex(ValueError, "^data.tokenizer_path:"):
            self._make(tokenizer_path=self.data)  # byte tokenizer takes no model

    def test_frozen(self):
        cfg = self._make()
        with self.assertRaises(AttributeError):
            cfg.seq_len = 4


if __name__ == "__main__":
    absltest.main()
