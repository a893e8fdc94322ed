"""Typed configuration of the language-model data pipeline.

The recipe follows the paper's data section (spec §6): LLaMA-2 SentencePiece ids, EOS appended to
every document, no BOS, documents concatenated and cut into fixed windows of ``seq_len + 1``
tokens, and a document-level train/validation split (99/1 by default).

``DataConfig`` is built once from the experiment ``ConfigDict`` (``config.data``) and validates
itself in ``__post_init__``: a bad option raises ``ValueError`` naming the option, and a missing
data or tokenizer file raises ``FileNotFoundError`` naming the option and the file, before any
tokenization or training starts.

Bundled files are named ``"bundled:<path below lattn_jax/assets>"`` (``configs/common.py``'s
WikiText-2 text, the default tokenizer) and resolved to this package's files here; a run
directory stores the names (:func:`portable_dict`), so that it does not depend on where the
clone lives. Restoring a model for evaluation needs no training data:
:func:`unchecked_data_paths`.
"""

import contextlib
import dataclasses
import math
import numbers
import os
from typing import Any, Dict, Iterator, Literal

from lattn_jax import assets
from lattn_jax.data import shards
from lattn_jax.data import sources

__all__ = ["DataConfig", "DocSplit", "Format", "TokenizerKind", "portable_dict", "resolved_format",
           "unchecked_data_paths"]

Format = Literal["auto", "text", "jsonl", "parquet", "tokens"]
DocSplit = Literal["wikitext", "blank_line", "line", "file"]
TokenizerKind = Literal["sentencepiece", "huggingface", "gguf", "byte"]

_FORMATS = ("auto", "text", "jsonl", "parquet", "tokens")
_DOC_SPLITS = ("wikitext", "blank_line", "line", "file")
_TOKENIZERS = ("sentencepiece", "huggingface", "gguf", "byte")
_PATH_OPTIONS = ("paths", "val_paths", "tokenizer_path")
_check_data_paths = True


@contextlib.contextmanager
def unchecked_data_paths() -> Iterator[None]:
    """Within it, a ``DataConfig`` accepts ``paths``/``val_paths`` that do not exist (kept as
    given; bundled names still resolved). For restoring a model from a run directory when the
    training corpus is elsewhere: only the tokenizer is needed, and it is still checked."""
    global _check_data_paths
    previous, _check_data_paths = _check_data_paths, False
    try:
        yield
    finally:
        _check_data_paths = previous


def portable_dict(values: Dict[str, Any]) -> Dict[str, Any]:
    """A data section (``dataclasses.asdict`` of a :class:`DataConfig`, or a saved
    ``config.json``'s) with bundled files as names (``"bundled:..."``, also for absolute paths
    into another clone's assets) and other paths as given: what a run directory stores, and
    what run identity compares."""
    out = dict(values)
    for key in _PATH_OPTIONS:
        value = out.get(key)
        if isinstance(value, (list, tuple)):
            out[key] = [assets.portable(p) if isinstance(p, str) else p for p in value]
        elif isinstance(value, str):
            out[key] = assets.portable(value)
    return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Where the text comes from and how it becomes ``[batch_size, seq_len]`` batches.

    Attributes:
        paths: data files and/or directories. A directory is searched recursively for files ending
            in ``.txt``, ``.raw``, ``.text``, ``.jsonl``, ``.jsonl.gz``, ``.json.gz``,
            ``.jsonl.zst``, ``.json.zst`` or ``.parquet`` (sorted, hidden files skipped; so
            ``LICENSE.md`` next to the data is not read). A file named explicitly is read whatever
            its extension. A file met twice (a directory and a file in it, a symlink; by
            ``os.path.realpath``) is read once. A directory holding a ``manifest.json`` is a
            token-shard directory
            written by ``experiments/prepare_data.py``. A single string is wrapped in a tuple.
            ``"bundled:<relative path>"`` names a file of ``lattn_jax/assets`` (resolved here to
            its absolute path; so is ``tokenizer_path``).
        format: ``"text"``, ``"jsonl"``, ``"parquet"``, ``"tokens"`` (token-shard directories),
            or ``"auto"``: token shards if every path is a token-shard directory, else per file by
            name (``.jsonl[.gz|.zst]``/``.json.gz``/``.json.zst`` are JSONL, ``.parquet`` is
            Parquet, everything else is plain text).
        text_field: JSONL key / Parquet column that holds the document text.
        max_bad_fraction: the share of bad JSONL records (lines that are not a JSON object,
            records without a string in ``text_field``) that is skipped and counted, in
            ``[0, 1]``; once the bad records exceed it (counting at least
            ``sources.MIN_RECORDS`` records, so up to 10 pass at the default 1%) the read stops
            with one line naming the file, their share and this option, before training starts.
            ``experiments/prepare_data.py --max_bad_fraction`` is the same limit with the same
            default (``sources.BadRecordLimit``); token shards were checked by it when made.
        doc_split: how plain text is cut into documents. ``"wikitext"``: a new document starts at
            every line ``" = Title = "`` (exactly one ``=`` on each side; ``" = = Section = = "``
            does not start one); ``"blank_line"``: documents are separated by one or more blank
            lines; ``"line"``: one document per line; ``"file"``: one document per file. Ignored for
            JSONL (one document per record).
        tokenizer: ``"sentencepiece"``, ``"huggingface"`` (a ``tokenizer.json``), ``"gguf"`` (the
            vocabulary embedded in a ``.gguf`` model file) or ``"byte"`` (UTF-8 bytes, EOS 256,
            vocabulary 257). With token shards it must be the tokenizer they were made with.
        tokenizer_path: the tokenizer's file. ``None`` with ``"sentencepiece"`` selects the
            bundled LLaMA-2 model (``lattn_jax/assets/tokenizers/llama2/tokenizer.model``);
            required with ``"huggingface"`` and ``"gguf"``; must be ``None`` with ``"byte"``.
        seq_len: tokens per example (inputs and targets each have ``seq_len`` tokens).
        batch_size: global batch size (examples per step over all processes); must be divisible by
            ``jax.process_count()`` (checked when the pipeline is built).
        val_fraction: fraction of DOCUMENTS held out for validation, in ``(0, 1)``; at least one
            document is always held out and at least one kept for training. Not used when
            ``val_paths`` is given.
        val_paths: ``None`` (validation documents are split off ``paths``), or files/directories
            of their own holding the validation documents (read like ``paths``; e.g. the
            ``validation`` token-shard directory of a corpus built by
            ``experiments/build_corpus.py``); then every document of ``paths`` is trained on.
            A file (or token-shard directory) of both ``paths`` and ``val_paths`` is refused
            when the pipeline is built.
        seed: seed of the document split and of the window shuffle.
        shuffle: shuffle the train windows (reshuffled every epoch); ``False`` reads them in
            stream order (documents still in the seeded split order).
        max_val_batches: cap on the number of validation batches, ``None`` for all of them.
        source_weights: ``None``, or ``{shard name: weight}`` for token-shard corpora: how many
            times each named shard's training documents enter the training order (the shard
            names of ``manifest.json``; ``experiments/build_corpus.py`` names them after their
            sources, e.g. ``{"gutenberg": 4.0, "gcide": 0.5}``). A weight ``w >= 0`` keeps every
            document ``floor(w)`` times plus a seeded ``w - floor(w)`` fraction of them once more
            (``w < 1`` keeps that fraction only; ``w = 0`` leaves the shard out of training, e.g.
            one stage of a multi-stage recipe); the weighted order is permuted with ``seed``.
            Unnamed shards keep weight 1; validation documents are never reweighted. This is
            upsampling as in data-mixture recipes: a weight of 4 means four epochs of that
            source per pass over the training split.

    Raises:
        ValueError: an option has a bad value; the message starts with ``data.<option>``.
        FileNotFoundError: a path in ``paths`` or ``tokenizer_path`` does not exist; the message
            reads ``data.paths: no such file or directory: <path>`` (or ``data.tokenizer_path``).
    """

    paths: tuple[str, ...]
    format: Format = "auto"
    text_field: str = "text"
    max_bad_fraction: float = sources.DEFAULT_MAX_BAD_FRACTION
    doc_split: DocSplit = "blank_line"
    tokenizer: TokenizerKind = "sentencepiece"
    tokenizer_path: str | None = None
    seq_len: int
    batch_size: int
    val_fraction: float = 0.01
    val_paths: tuple[str, ...] | None = None
    seed: int = 0
    max_val_batches: int | None = None
    shuffle: bool = True
    source_weights: Dict[str, float] | None = None

    def __post_init__(self):
        object.__setattr__(self, "paths", _existing_paths("paths", self.paths))
        if self.val_paths is not None:
            object.__setattr__(self, "val_paths", _existing_paths("val_paths", self.val_paths))

        _check_choice("format", self.format, _FORMATS)
        _check_choice("doc_split", self.doc_split, _DOC_SPLITS)
        _check_choice("tokenizer", self.tokenizer, _TOKENIZERS)
        if not isinstance(self.text_field, str) or not self.text_field:
            raise ValueError(
                f"data.text_field: expected a non-empty string, got {self.text_field!r}")
        if (isinstance(self.max_bad_fraction, bool)
                or not isinstance(self.max_bad_fraction, numbers.Real)
                or not 0 <= self.max_bad_fraction <= 1):
            raise ValueError(f"data.max_bad_fraction: expected a number in [0, 1], got "
                             f"{self.max_bad_fraction!r}")

        if self.tokenizer == "byte":
            if self.tokenizer_path is not None:
                raise ValueError(
                    "data.tokenizer_path: must be None for tokenizer='byte', got "
                    f"{self.tokenizer_path!r}")
        else:
            path = self.tokenizer_path
            if path is None and self.tokenizer != "sentencepiece":
                raise ValueError(f"data.tokenizer_path: required for tokenizer="
                                 f"{self.tokenizer!r} (a tokenizer.json or .gguf file)")
            if path is None:
                path = assets.asset_path(assets.LLAMA2_TOKENIZER)
            try:
                path = assets.resolve(path)
            except FileNotFoundError as e:
                raise FileNotFoundError(f"data.tokenizer_path: {e}") from e
            if os.path.isdir(path):  # "no such file" for an existing directory misled
                raise FileNotFoundError(
                    f"data.tokenizer_path: {path} is a directory; give the tokenizer file in it "
                    f"(a tokenizer.json, .model or .gguf file; it holds "
                    f"{sources.directory_listing(path)})")
            if not os.path.isfile(path):
                raise FileNotFoundError(f"data.tokenizer_path: no such file: {path}")
            object.__setattr__(self, "tokenizer_path", path)

        _check_int("seq_len", self.seq_len, minimum=1)
        _check_int("batch_size", self.batch_size, minimum=1)
        _check_int("seed", self.seed, minimum=0)
        if self.max_val_batches is not None:
            _check_int("max_val_batches", self.max_val_batches, minimum=1)
        if (isinstance(self.val_fraction, bool) or not isinstance(self.val_fraction, (int, float))
                or not 0.0 < self.val_fraction < 1.0):
            raise ValueError(f"data.val_fraction: expected a number in (0, 1), got "
                             f"{self.val_fraction!r}")
        if not isinstance(self.shuffle, bool):
            raise ValueError(f"data.shuffle: expected True or False, got {self.shuffle!r}")
        if self.source_weights is not None:
            object.__setattr__(self, "source_weights", _source_weights(self.source_weights))
        if not _check_data_paths:
            return
        fmt = resolved_format(self)  # token-shard directories: all or none, with a manifest
        if self.source_weights is not None and fmt != "tokens":
            raise ValueError("data.source_weights: only token-shard corpora (data.format "
                             "'tokens') have named shards to weight; data.paths are read as "
                             f"{fmt!r}")
        if self.val_paths is not None:
            try:
                resolved_format(dataclasses.replace(self, paths=self.val_paths, val_paths=None))
            except (ValueError, FileNotFoundError) as e:
                raise type(e)(str(e).replace("data.paths", "data.val_paths")) from e


def resolved_format(config: DataConfig) -> str:
    """``"tokens"`` if ``config.paths`` are token-shard directories, else ``config.format``.

    Raises:
        FileNotFoundError: ``format="tokens"`` and a path has no ``manifest.json`` (named).
        ValueError: token-shard directories mixed with other sources, or given with a text
            format.
    """
    is_tokens = [shards.is_token_dir(p) for p in config.paths]
    if config.format == "tokens":
        for path, ok in zip(config.paths, is_tokens):
            if not ok:
                raise FileNotFoundError(
                    f"data.paths: {path} is not a token-shard directory (no "
                    f"{os.path.join(path, shards.MANIFEST)}; make one with "
                    "experiments/prepare_data.py)")
        return "tokens"
    if any(is_tokens):
        if config.format != "auto" or not all(is_tokens):
            raise ValueError(
                "data.paths: token-shard directories (with a manifest.json) cannot be mixed with "
                f"text sources or read with data.format={config.format!r}: {config.paths}")
        return "tokens"
    return config.format


def _source_weights(value) -> Dict[str, float]:
    """``value`` as a plain ``{name: weight}`` dict of finite weights >= 0.

    Raises:
        ValueError: not a mapping of names to non-negative numbers (``data.source_weights``
            named).
    """
    items = value.items() if hasattr(value, "items") else None
    if items is None:
        raise ValueError(f"data.source_weights: expected a mapping {{shard name: weight}}, got "
                         f"{value!r}")
    out = {}
    for name, weight in items:
        if not isinstance(name, str) or not name:
            raise ValueError(f"data.source_weights: shard names must be non-empty strings, got "
                             f"{name!r}")
        if (isinstance(weight, bool) or not isinstance(weight, numbers.Real)
                or not math.isfinite(weight) or weight < 0):
            raise ValueError(f"data.source_weights: the weight of {name!r} must be a finite "
                             f"number >= 0, got {weight!r}")
        out[name] = float(weight)
    return out


def _existing_paths(name: str, value) -> tuple[str, ...]:
    """``value`` (one path or a sequence of them) as a non-empty tuple of existing paths,
    bundled names resolved (existence not checked within :func:`unchecked_data_paths`).

    Raises:
        ValueError: not paths, or none (the message starts with ``data.<name>``).
        FileNotFoundError: a path does not exist (named).
    """
    paths = (value,) if isinstance(value, (str, os.PathLike)) else value
    try:
        paths = tuple(os.fspath(p) for p in paths)
    except TypeError as e:
        raise ValueError(f"data.{name}: expected a sequence of paths, got {value!r}") from e
    if not paths:
        raise ValueError(f"data.{name}: at least one file or directory is required")
    try:
        paths = tuple(assets.resolve(p) for p in paths)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"data.{name}: {e}") from e
    for path in paths:
        if _check_data_paths and not os.path.exists(path):
            raise FileNotFoundError(f"data.{name}: no such file or directory: {path}")
    return paths


def _check_choice(name: str, value, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"data.{name}: expected one of {choices}, got {value!r}")


def _check_int(name: str, value, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"data.{name}: expected an integer >= {minimum}, got {value!r}")
