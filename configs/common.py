"""Shared helpers for config files: ``parse_arg`` and the default bundled-corpus data section.

A config file defines ``get_config(arg=None)`` returning an ``ml_collections.ConfigDict``. The
``arg`` string (after the colon in ``--config=configs/x.py:arg``) is a comma-separated list of
``key=value`` pairs or bare flags, parsed by :func:`parse_arg`.
"""

import ast

import ml_collections
from ml_collections import config_dict

from lattn_jax import assets


class ConfigArgError(ValueError):
    """A bad ``--config=file.py:arg`` argument string."""


def parse_arg(arg, **defaults):
    """Parses ``"a=1,b=x,flag"`` into a ConfigDict, starting from ``defaults``.

    Values are read as Python literals when possible (``1``, ``0.5``, ``True``), else kept as
    strings; a bare name sets that flag to ``True``.

    Raises:
      ValueError: for a key that is not in ``defaults``.
    """
    out = ml_collections.ConfigDict(defaults)
    if not arg:
        return out
    for item in arg.split(","):
        key, sep, value = item.partition("=")
        key = key.strip()
        if key not in defaults:
            raise ConfigArgError(
                f"unknown config argument {key!r}; known: {', '.join(defaults)}")
        if not sep:
            out[key] = True
            continue
        try:
            out[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[key] = value
    return out


def bundled_wikitext_data(seq_len: int, batch_size: int) -> ml_collections.ConfigDict:
    """Data section for the WikiText-2 raw validation + test text bundled in the package.

    Documents are Wikipedia articles; tokens are LLaMA-2 SentencePiece ids (the paper's), with EOS
    after every article and no BOS.
    """
    return ml_collections.ConfigDict(dict(
        # A tuple, so that it can be overridden: --config.data.paths="('/data/a.txt',)".
        paths=(assets.asset_path("corpus/wikitext-2-raw/wiki.valid.raw"),
               assets.asset_path("corpus/wikitext-2-raw/wiki.test.raw")),
        format="auto",  # per file: .jsonl / .jsonl.gz / .json.gz are JSONL, the rest text
        text_field="text",
        doc_split="wikitext",
        tokenizer="sentencepiece",
        # None: the bundled LLaMA-2 model (paper 1's tokenizer); set a path for another
        # SentencePiece model, or --config.data.tokenizer=byte for bytes.
        tokenizer_path=config_dict.placeholder(str),
        seq_len=seq_len,
        batch_size=batch_size,
        val_fraction=0.05,
        seed=0,
        max_val_batches=config_dict.placeholder(int),
    ))
