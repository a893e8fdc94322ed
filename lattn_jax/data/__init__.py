"""Data pipeline for language-model training: tokenizers, document sources and grain batches.

Typical use::

    from lattn_jax import data
    cfg = data.DataConfig(paths=(data_dir,), doc_split="wikitext", seq_len=512, batch_size=8)
    ds = data.build_datasets(cfg)
    batch = next(ds.train_iter)  # dict of numpy arrays [8, 512]; keys in data.BATCH_KEYS

For a large corpus, tokenize once into token shards (``experiments/prepare_data.py``, or
``data.prepare_corpus``) and pass the shard directory in ``paths``.
"""

# Configuration.
from lattn_jax.data.config import DataConfig

# Tokenizers.
from lattn_jax.data.tokenizers import ByteTokenizer
from lattn_jax.data.tokenizers import GGUFTokenizer
from lattn_jax.data.tokenizers import HuggingFaceTokenizer
from lattn_jax.data.tokenizers import make_tokenizer
from lattn_jax.data.tokenizers import SentencePieceTokenizer
from lattn_jax.data.tokenizers import Tokenizer

# Document sources and their bad-input counters.
from lattn_jax.data.sources import DataFileError
from lattn_jax.data.sources import read_documents
from lattn_jax.data.sources import ReadStats

# Pre-tokenized token shards (written by experiments/prepare_data.py).
from lattn_jax.data.prepare import prepare_corpus
from lattn_jax.data.shards import open_corpus
from lattn_jax.data.shards import TokenCorpus

# Pipeline entry point, its results and the unigram baselines.
from lattn_jax.data.pipeline import BATCH_KEYS
from lattn_jax.data.pipeline import build_datasets
from lattn_jax.data.pipeline import Datasets
from lattn_jax.data.pipeline import DataStats
from lattn_jax.data.pipeline import unigram_cross_entropy
from lattn_jax.data.pipeline import unigram_entropy

__all__ = [
    "BATCH_KEYS",
    "ByteTokenizer",
    "DataConfig",
    "DataFileError",
    "DataStats",
    "Datasets",
    "GGUFTokenizer",
    "HuggingFaceTokenizer",
    "ReadStats",
    "SentencePieceTokenizer",
    "TokenCorpus",
    "Tokenizer",
    "build_datasets",
    "make_tokenizer",
    "open_corpus",
    "prepare_corpus",
    "read_documents",
    "unigram_cross_entropy",
    "unigram_entropy",
]
