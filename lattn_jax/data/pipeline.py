"""Grain pipeline: documents -> EOS-terminated token streams -> fixed windows -> batches.

Implements the data recipe of the paper (spec §6; Megatron ``preprocess_data.py --append-eod`` plus
``GPTDataset``): every document is tokenized once without BOS and gets EOS appended; documents are
split into train and validation BY DOCUMENT with a seeded permutation (at least one document on
each side); each split is concatenated, in permutation order, into one token stream that is cut
into windows of ``seq_len + 1`` tokens (consecutive windows share one token; the remainder is
dropped). Each window gives one example::

    inputs      int32   [seq_len]  w[:-1]
    targets     int32   [seq_len]  w[1:]
    segment_ids int32   [seq_len]  document of each INPUT token, renumbered 0, 1, ... per window
    positions   int32   [seq_len]  position of each input token in its document; restarts at 0 at
                                   every document start inside the window. For the first
                                   document of a window it counts from the window start (so
                                   positions are always in [0, seq_len)), as in packed examples.
    weights     float32 [seq_len]  1.0 (0.0 only in the padding rows of the last val batch)

An EOS belongs to the document it ends, so an EOS input has the segment id of the document before
it and its target is the first token of the next document. Like the paper we neither mask the loss
at EOS nor reset attention/state there; ``segment_ids``/``positions`` let a model opt in.

Training: windows are shuffled (grain ``MapDataset.shuffle``, reseeded every epoch; in stream
order with ``data.shuffle=False``), repeated
forever and batched to ``[batch_size // process_count, seq_len]``; ``Datasets.train_iter`` is a
``grain.DatasetIterator`` with ``get_state``/``set_state``. To save it inside an orbax checkpoint::

    mngr.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        data_iter=grain.checkpoint.CheckpointSave(datasets.train_iter)))
    # restore into a fresh iterator:
    it = iter(datasets.train_dataset)
    mngr.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state),
        data_iter=grain.checkpoint.CheckpointRestore(it)))

Validation: ``Datasets.val_batches`` is a fixed sequence of batches over the validation windows (in
stream order, last batch padded with zero-weight rows, capped at ``max_val_batches``).

With ``jax.process_count() > 1`` each process keeps every ``process_count``-th window
(``grain.sharding.ShardByJaxProcess``) after dropping the few windows that do not divide evenly,
and yields its ``batch_size // process_count`` rows of each global batch.

Mixture weights: with token shards, ``data.source_weights`` repeats (or subsamples) the
training documents of named shards before the stream is packed (:func:`weighted_documents`).

Sources: text, JSONL and Parquet files are read and tokenized when the pipeline is built and
held in memory (int32), which suits small corpora. A large corpus is tokenized once by
``experiments/prepare_data.py`` into token shards (``lattn_jax.data.shards``) and given as
``paths=(shard_dir,)`` (``format="tokens"``, or ``"auto"``, which recognises the manifest): its
documents are memory-mapped, and only the per-document index (a few int64 per document) is held
in memory. Both kinds go through the same ``PackedWindowSource``, so the windows of a corpus are
the same whether it was tokenized on the fly or prepared into shards.
"""

import collections.abc
import dataclasses
import math
import os
from collections.abc import Sequence

import grain
import numpy as np
from absl import logging

from lattn_jax.data import config as config_lib
from lattn_jax.data import shards
from lattn_jax.data import sources
from lattn_jax.data import tokenizers

__all__ = [
    "BATCH_KEYS",
    "DataStats",
    "Datasets",
    "LazyBatches",
    "PackedWindowSource",
    "WindowSource",
    "build_datasets",
    "check_disjoint_splits",
    "pack_documents",
    "split_documents",
    "tokenize_documents",
    "unigram_cross_entropy",
    "unigram_entropy",
    "weighted_documents",
]

# Keys of every example/batch; all int32 except "weights" (float32).
BATCH_KEYS = ("inputs", "targets", "segment_ids", "positions", "weights")

# Reading a window is a few numpy slices, so a small thread pool and buffer suffice. The buffer
# counts batches, so keep it small: one batch of 128 x 4096 is ~10 MB.
_READ_OPTIONS = grain.ReadOptions(num_threads=2, prefetch_buffer_size=8)
_TOKENIZE_CHUNK = 1024  # documents per batched tokenizer call
# Unigram statistics read at most this many tokens of each split's stream (exact below it).
_STATS_TOKENS = 1 << 24


@dataclasses.dataclass(frozen=True)
class DataStats:
    """Sizes of the two splits and unigram baselines.

    Attributes:
        train_documents: documents in the train split.
        val_documents: documents in the validation split.
        train_tokens: tokens in the train stream, EOS included.
        val_tokens: tokens in the validation stream, EOS included.
        train_windows: train windows over all processes (``(train_tokens - 1) // seq_len``).
        val_windows: validation windows over all processes.
        unigram_entropy: entropy (nats/token) of the empirical unigram distribution of the train
            tokens: the loss of the best context-free model on the train set.
        val_unigram_xent: cross-entropy (nats/token) of the validation tokens under the
            add-one-smoothed train unigram distribution (over the full vocabulary); a model's
            validation loss should end up well below it.
            Both are computed on the first ``2**24`` tokens of each split's stream (all of them
            for smaller corpora), so that a multi-billion-token corpus is not read to build them.
        empty_documents: empty documents skipped while reading (for token shards: while they
            were prepared); likewise ``malformed_lines`` (JSONL lines skipped),
            ``missing_field`` (JSONL records skipped for lack of a string in ``text_field``),
            ``invalid_utf8`` (invalid UTF-8 sequences replaced by U+FFFD) and
            ``invalid_utf8_files`` (files that had some). See ``sources.ReadStats``.
    """

    train_documents: int
    val_documents: int
    train_tokens: int
    val_tokens: int
    train_windows: int
    val_windows: int
    unigram_entropy: float
    val_unigram_xent: float
    empty_documents: int = 0
    malformed_lines: int = 0
    missing_field: int = 0
    invalid_utf8: int = 0
    invalid_utf8_files: int = 0


@dataclasses.dataclass
class Datasets:
    """What ``build_datasets`` returns.

    Attributes:
        tokenizer: the tokenizer used (``vocab_size``, ``eos_id``, ``decode``).
        train_dataset: the infinite, shuffled, batched train ``grain.IterDataset``;
            ``iter(train_dataset)`` gives a fresh iterator at step 0 (e.g. to restore into).
        train_iter: an iterator of ``train_dataset``: yields dicts of numpy arrays
            ``[batch_size // process_count, seq_len]`` keyed by ``BATCH_KEYS``; supports
            ``get_state``/``set_state`` and ``grain.checkpoint.CheckpointSave/Restore``.
        val_batches: validation batches (same keys and shapes), deterministic; a ``LazyBatches``
            sequence that builds each batch when it is read.
        stats: split sizes and unigram baselines.
        config: the config this was built from.
    """

    tokenizer: tokenizers.Tokenizer
    train_dataset: grain.IterDataset
    train_iter: grain.DatasetIterator
    val_batches: "LazyBatches"
    stats: DataStats
    config: config_lib.DataConfig


class WindowSource:
    """Random-access source of the examples of one token stream (``grain.MapDataset.source``).

    Args:
        tokens: int32 ``[N]``, the concatenated EOS-terminated documents.
        doc_ids: int32 ``[N]``, the document of every token, numbered 0, 1, ... in stream order.
        seq_len: example length; window ``i`` is ``tokens[i * seq_len : (i + 1) * seq_len + 1]``.

    Raises:
        ValueError: ``tokens`` and ``doc_ids`` differ in shape, or ``seq_len < 1``.
    """

    def __init__(self, tokens: np.ndarray, doc_ids: np.ndarray, seq_len: int):
        tokens = np.asarray(tokens, dtype=np.int32)
        doc_ids = np.asarray(doc_ids, dtype=np.int32)
        if tokens.ndim != 1 or tokens.shape != doc_ids.shape:
            raise ValueError(f"tokens {tokens.shape} and doc_ids {doc_ids.shape} must be equal 1-D")
        if seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {seq_len}")
        self._tokens = tokens
        self._doc_ids = doc_ids
        self._seq_len = seq_len
        self._len = max(0, (len(tokens) - 1) // seq_len)

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        if not 0 <= index < self._len:
            raise IndexError(f"window {index} out of range [0, {self._len})")
        start = index * self._seq_len
        window = self._tokens[start:start + self._seq_len + 1]  # [seq_len + 1]
        docs = self._doc_ids[start:start + self._seq_len]  # [seq_len], documents of the inputs
        return _example(window, docs)

    def __repr__(self) -> str:
        return f"WindowSource(tokens={len(self._tokens)}, seq_len={self._seq_len}, len={self._len})"


def _example(window: np.ndarray, docs: np.ndarray) -> dict[str, np.ndarray]:
    """One example from a window of ``seq_len + 1`` tokens and the documents of its inputs."""
    length = len(docs)
    segment_ids = (docs - docs[0]).astype(np.int32)
    # Offset of the first token of each segment inside the window (0 for the first one).
    seg_starts = np.concatenate([[0], np.flatnonzero(np.diff(docs)) + 1]).astype(np.int32)
    positions = np.arange(length, dtype=np.int32) - seg_starts[segment_ids]
    window = window.astype(np.int32, copy=False)
    return {
        "inputs": window[:-1].copy(),
        "targets": window[1:].copy(),
        "segment_ids": segment_ids,
        "positions": positions,
        "weights": np.ones((length,), np.float32),
    }


class PackedWindowSource:
    """Random-access windows of documents packed in a given order, read from a ``TokenCorpus``.

    The stream is ``doc[order[0]], EOS, doc[order[1]], EOS, ...`` and window ``i`` is
    ``stream[i * seq_len : (i + 1) * seq_len + 1]``, exactly as ``WindowSource`` over
    ``pack_documents([doc[j] for j in order])``, but the stream is never built: a window is
    gathered from the few documents it overlaps (found by binary search over the cumulative
    lengths), so the corpus can be memory-mapped shards of any size.

    Args:
        corpus: the documents (in memory or memory-mapped).
        order: int ``[M]``, indices of the documents of this split, in stream order.
        seq_len: example length (>= 1).
        eos_id: id appended after every document.

    Raises:
        ValueError: ``seq_len < 1`` or an index in ``order`` out of range.
    """

    def __init__(self, corpus: shards.TokenCorpus, order: np.ndarray, seq_len: int,
                 eos_id: int):
        if seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {seq_len}")
        order = np.asarray(order, np.int64)
        if order.size and (order.min() < 0 or order.max() >= corpus.num_documents):
            raise ValueError(f"document indices out of range [0, {corpus.num_documents})")
        self._corpus = corpus
        self._order = order
        self._seq_len = int(seq_len)
        self._eos = int(eos_id)
        lengths = corpus.doc_len[order] + 1  # with EOS
        self._ends = np.cumsum(lengths)  # int64 [M], stream end of each document
        self.num_tokens = int(self._ends[-1]) if len(order) else 0
        self._len = max(0, (self.num_tokens - 1) // self._seq_len)

    def __len__(self) -> int:
        return self._len

    def stream(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Tokens ``[start, stop)`` of the stream and their document numbers (in stream order).

        Returns:
            ``(tokens, docs)``: int32 ``[stop - start]`` each; ``docs`` counts documents in stream
            order (0 for ``order[0]``), the EOS belonging to the document it ends.
        """
        tokens = np.empty((stop - start,), np.int32)
        docs = np.empty((stop - start,), np.int32)
        j = int(np.searchsorted(self._ends, start, side="right"))
        pos = start
        corpus = self._corpus
        while pos < stop:
            doc = int(self._order[j])
            end = int(self._ends[j])
            begin = end - int(corpus.doc_len[doc]) - 1
            hi = min(end, stop)
            text_hi = min(hi, end - 1)  # the document's ids end at end - 1 (then EOS)
            if pos < text_hi:
                first = int(corpus.doc_start[doc]) + pos - begin
                tokens[pos - start:text_hi - start] = (
                    corpus.shards[corpus.doc_shard[doc]][first:first + text_hi - pos])
            if hi == end:
                tokens[end - 1 - start] = self._eos
            docs[pos - start:hi - start] = j
            pos = hi
            j += 1
        return tokens, docs

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        if not 0 <= index < self._len:
            raise IndexError(f"window {index} out of range [0, {self._len})")
        start = index * self._seq_len
        tokens, docs = self.stream(start, start + self._seq_len + 1)
        return _example(tokens, docs[:-1])

    def __repr__(self) -> str:
        return (f"PackedWindowSource(documents={len(self._order)}, tokens={self.num_tokens}, "
                f"seq_len={self._seq_len}, len={self._len})")


class LazyBatches(collections.abc.Sequence):
    """A fixed sequence of batches built on access from a batched ``grain.MapDataset``.

    Short batches are padded with all-zero rows (weights 0) to ``batch_size`` rows. ``+`` with a
    list gives a list.
    """

    def __init__(self, dataset: grain.MapDataset, length: int, batch_size: int):
        self._dataset = dataset
        self._length = length
        self._batch_size = batch_size

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._length))]
        if index < 0:
            index += self._length
        if not 0 <= index < self._length:
            raise IndexError(f"batch {index} out of range [0, {self._length})")
        return _pad_batch(self._dataset[index], self._batch_size)

    def __add__(self, other):
        return list(self) + list(other)

    def __radd__(self, other):
        return list(other) + list(self)


def tokenize_documents(documents: Sequence[str],
                       tokenizer: tokenizers.Tokenizer) -> list[np.ndarray]:
    """Tokenizes every document once (no BOS, no EOS); returns one int32 array per document."""
    out = []
    for lo in range(0, len(documents), _TOKENIZE_CHUNK):
        for ids in tokenizer.encode_batch(documents[lo:lo + _TOKENIZE_CHUNK]):
            out.append(np.asarray(ids, dtype=np.int32))
    return out


def split_documents(num_documents: int, val_fraction: float, seed: int,
                    empty_files: Sequence[str] = ()) -> tuple[np.ndarray, np.ndarray]:
    """Splits document indices into train and validation by a seeded permutation.

    Args:
        num_documents: number of documents (>= 2).
        val_fraction: fraction in ``(0, 1)``; ``round(val_fraction * n)`` documents are held out,
            clipped to ``[1, n - 1]``.
        seed: permutation seed.
        empty_files: the files that gave no document (``ReadStats.empty_files``), named in
            the error.

    Returns:
        ``(train_indices, val_indices)``, int64 arrays in permutation order, disjoint, together
        covering ``range(num_documents)``.

    Raises:
        ValueError: fewer than two documents (``... got 0; no documents in /x/empty.txt (check
            data.paths and data.doc_split)``, the first 3 such files named).
    """
    if num_documents < 2:
        named = ""
        if empty_files:
            more = f" and {len(empty_files) - 3} more" if len(empty_files) > 3 else ""
            named = f"; no documents in {', '.join(empty_files[:3])}{more}"
        raise ValueError(
            f"need at least 2 documents for a train/validation split, got {num_documents}"
            f"{named} (check data.paths and data.doc_split)")
    num_val = min(max(1, round(val_fraction * num_documents)), num_documents - 1)
    order = np.random.default_rng(seed).permutation(num_documents)
    return order[num_val:], order[:num_val]


def weighted_documents(corpus: shards.TokenCorpus, order: np.ndarray,
                       source_weights: dict[str, float], seed: int) -> np.ndarray:
    """The training order with every named shard's documents repeated ``weight`` times.

    A document of a shard with weight ``w`` appears ``floor(w)`` times, plus once more for a
    seeded ``round((w - floor(w)) * n)`` of the shard's ``n`` documents in ``order``; documents of
    unnamed shards appear once. The result is permuted with ``seed`` (so repeats are spread over
    the stream). Tokens of a shard in one pass: about ``w`` times its tokens.

    Args:
        corpus: a token-shard corpus (``shard_names`` set).
        order: int ``[M]``, the training documents (indices into ``corpus``).
        source_weights: ``{shard name: weight >= 0}`` (0: the shard's documents are left out).
        seed: seed of the fractional choice and of the permutation.

    Returns:
        int64 ``[M']``: document indices, each of ``order`` zero or more times.

    Raises:
        ValueError: ``corpus`` has no shard names (documents read from text), a name in
            ``source_weights`` is not one of its shards with tokens (the message lists them), or
            the weights leave no training document.
    """
    if corpus.shard_names is None:
        raise ValueError("data.source_weights: the corpus was read from text files, which have "
                         "no named shards; prepare token shards (experiments/prepare_data.py)")
    names = list(corpus.shard_names)
    unknown = sorted(set(source_weights) - set(names))
    if unknown:
        raise ValueError(f"data.source_weights: no shard with tokens is named "
                         f"{', '.join(map(repr, unknown))}; the shards are "
                         f"{', '.join(sorted(set(names)))}")
    order = np.asarray(order, np.int64)
    rng = np.random.default_rng([int(seed), 0x5eed])
    shard_weight = np.array([source_weights.get(n, 1.0) for n in names], np.float64)
    weight = shard_weight[corpus.doc_shard[order]]
    whole = np.floor(weight).astype(np.int64)
    parts = [np.repeat(order, whole)]
    for shard in np.flatnonzero(shard_weight != np.floor(shard_weight)):
        docs = order[corpus.doc_shard[order] == shard]
        extra = int(round((shard_weight[shard] - np.floor(shard_weight[shard])) * len(docs)))
        parts.append(rng.choice(docs, size=extra, replace=False))
    out = np.concatenate(parts)
    if not len(out):
        raise ValueError(f"data.source_weights: {source_weights} leaves no training document")
    return rng.permutation(out)


def pack_documents(documents: Sequence[np.ndarray], eos_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Concatenates documents into one stream, each followed by ``eos_id``.

    Args:
        documents: int token arrays (without EOS), in stream order.
        eos_id: the EOS id.

    Returns:
        ``(tokens, doc_ids)``: int32 ``[N]`` each, ``N = sum(len(d) + 1)``; ``doc_ids[t]`` is the
        index in ``documents`` of the document that token ``t`` (or the EOS ending it) belongs to.
    """
    lengths = np.array([len(d) + 1 for d in documents], dtype=np.int64)
    tokens = np.empty((int(lengths.sum()),), np.int32)
    ends = np.cumsum(lengths)
    offset = 0
    for doc, end in zip(documents, ends):
        tokens[offset:end - 1] = doc
        tokens[end - 1] = eos_id
        offset = int(end)
    doc_ids = np.repeat(np.arange(len(documents), dtype=np.int32), lengths)
    return tokens, doc_ids


def unigram_entropy(tokens: np.ndarray) -> float:
    """Entropy in nats of the empirical unigram distribution of ``tokens``.

    ``H = -sum_v p_v log p_v`` with ``p_v = count_v / N``.

    Args:
        tokens: non-negative integer ids, any shape.

    Returns:
        The entropy (0.0 for an empty or constant input).
    """
    counts = np.bincount(np.asarray(tokens, dtype=np.int64).ravel())
    total = counts.sum()
    if total == 0:
        return 0.0
    p = counts[counts > 0] / total
    return float(-(p * np.log(p)).sum())


def unigram_cross_entropy(tokens: np.ndarray, reference: np.ndarray, vocab_size: int) -> float:
    """Cross-entropy (nats/token) of ``tokens`` under the add-one-smoothed unigram of ``reference``.

    ``q_v = (count_ref(v) + 1) / (N_ref + vocab_size)``; returns ``-mean_t log q_{tokens_t}``.

    Raises:
        ValueError: an id is outside ``[0, vocab_size)``.
    """
    tokens = np.asarray(tokens, dtype=np.int64).ravel()
    reference = np.asarray(reference, dtype=np.int64).ravel()
    for name, arr in (("tokens", tokens), ("reference", reference)):
        if arr.size and (arr.min() < 0 or arr.max() >= vocab_size):
            raise ValueError(f"{name} has ids outside [0, {vocab_size})")
    if tokens.size == 0:
        return 0.0
    counts = np.bincount(reference, minlength=vocab_size)
    log_q = np.log(counts + 1.0) - math.log(reference.size + vocab_size)
    return float(-log_q[tokens].mean())


def _process_shard() -> grain.sharding.ShardOptions:
    return grain.sharding.ShardByJaxProcess(drop_remainder=True)


def _shard(ds: grain.MapDataset, shard: grain.sharding.ShardOptions) -> grain.MapDataset:
    """Keeps every ``shard_count``-th element, after trimming ``len(ds)`` to a multiple of it."""
    if shard.shard_count == 1:
        return ds
    usable = len(ds) - len(ds) % shard.shard_count
    return ds[:usable][shard.shard_index::shard.shard_count]


def _pad_batch(batch: dict[str, np.ndarray], batch_size: int) -> dict[str, np.ndarray]:
    """Pads a short final batch with all-zero rows (weights 0) up to ``batch_size`` rows."""
    missing = batch_size - batch["inputs"].shape[0]
    if missing == 0:
        return batch
    return {k: np.concatenate([v, np.zeros((missing,) + v.shape[1:], v.dtype)])
            for k, v in batch.items()}


def _load_corpus(config: config_lib.DataConfig, tokenizer: tokenizers.Tokenizer,
                 stats: sources.ReadStats) -> shards.TokenCorpus:
    """Maps prepared token shards, or reads and tokenizes the text sources in memory."""
    if config_lib.resolved_format(config) == "tokens":
        corpus = shards.open_corpus(config.paths)
        made_with = corpus.tokenizer
        if made_with["sha256"] != tokenizer.sha256:
            raise ValueError(
                f"data.tokenizer: the token shards in {', '.join(config.paths)} were made with "
                f"{made_with['name']} (sha256 {made_with['sha256'][:12]}...), but data.tokenizer"
                f"/data.tokenizer_path give {tokenizer.name} (sha256 {tokenizer.sha256[:12]}...)")
        for key, value in corpus.read_stats.items():
            if hasattr(stats, key) and key != "examples":
                setattr(stats, key, value)
        return corpus
    documents = list(sources.read_documents(
        config.paths, fmt=config.format, text_field=config.text_field,
        doc_split=config.doc_split, stats=stats, max_bad_fraction=config.max_bad_fraction))
    return shards.TokenCorpus.from_documents(tokenize_documents(documents, tokenizer))


def _real_files(paths: Sequence[str], option: str) -> dict[str, str]:
    """``{real path: path as listed}`` of the files (or token-shard directories) of
    ``paths``, the option ``option``."""
    out = {}
    names = sources.OptionNames(paths=option)
    for path in paths:
        listed = [path] if shards.is_token_dir(path) else sources.list_files([path], names)
        for f in listed:
            out.setdefault(os.path.realpath(f), f)
    return out


def check_disjoint_splits(config: config_lib.DataConfig) -> None:
    """Refuses a ``data.val_paths`` that shares a file with ``data.paths`` (by
    ``os.path.realpath``, directories expanded as :func:`lattn_jax.data.sources.list_files`
    expands them; a token-shard directory counts as one file): its documents would be both
    trained on and held out, so the validation loss would not be held out. Checks nothing
    without ``data.val_paths``.

    Raises:
        ValueError: one line naming the shared files (up to three, and how many more).
        FileNotFoundError: a path that does not exist (as ``list_files``).
    """
    if config.val_paths is None:
        return
    train = _real_files(config.paths, "data.paths")
    shared = [f for real, f in _real_files(config.val_paths, "data.val_paths").items()
              if real in train]
    if shared:
        more = f" (and {len(shared) - 3} more)" if len(shared) > 3 else ""
        raise ValueError(
            f"data.val_paths shares {len(shared)} file(s) with data.paths ({', '.join(shared[:3])}"
            f"{more}): their documents would be trained on and held out for validation at once; "
            f"give data.val_paths "
            f"files that data.paths does not read, or leave data.val_paths unset to hold out "
            f"data.val_fraction of data.paths' documents")


def build_datasets(config: config_lib.DataConfig) -> Datasets:
    """Reads, tokenizes (or maps), splits and packs the corpus; returns the train iterator and
    validation batches.

    Args:
        config: the data options.

    Returns:
        ``Datasets`` with the tokenizer, the train dataset and iterator, the validation batches and
        statistics (including the bad input met while reading, also logged as a warning).

    Raises:
        FileNotFoundError: a data path or the tokenizer model is missing (named in the message).
        sources.DataFileError: a data file cannot be read (named).
        ValueError: ``data.val_paths`` sharing a file with ``data.paths``
            (:func:`check_disjoint_splits`, before anything is read), more bad JSONL records
            than ``data.max_bad_fraction`` allows (the file
            named, see ``sources.read_documents``), fewer than two documents, a split too
            short for one window, token shards
            made with another tokenizer, or ``batch_size`` not divisible by
            ``jax.process_count()``.
    """
    shard = _process_shard()
    if config.batch_size % shard.shard_count:
        raise ValueError(f"data.batch_size: {config.batch_size} is not divisible by the number of "
                         f"processes ({shard.shard_count})")
    host_batch = config.batch_size // shard.shard_count
    check_disjoint_splits(config)  # before the (slow) read

    tokenizer = tokenizers.make_tokenizer(config.tokenizer, config.tokenizer_path)
    read_stats = sources.ReadStats()
    corpus = _load_corpus(config, tokenizer, read_stats)
    if config.val_paths is None:
        val_corpus = corpus
        train_idx, val_idx = split_documents(corpus.num_documents, config.val_fraction,
                                             config.seed, read_stats.empty_files)
    else:
        val_config = dataclasses.replace(config, paths=config.val_paths, val_paths=None)
        val_corpus = _load_corpus(val_config, tokenizer, read_stats)
        # Every document of each corpus, in a seeded order (as split_documents orders them).
        train_idx = np.random.default_rng(config.seed).permutation(corpus.num_documents)
        val_idx = np.random.default_rng(config.seed).permutation(val_corpus.num_documents)
    if config.source_weights is not None:
        before = int(corpus.doc_len[train_idx].sum())
        train_idx = weighted_documents(corpus, train_idx, config.source_weights, config.seed)
        logging.info("data: source_weights %s: %d -> %d training tokens per pass",
                     config.source_weights, before, int(corpus.doc_len[train_idx].sum()))
    if read_stats.empty_documents or read_stats.bad_records or read_stats.invalid_utf8:
        first = next((e for e in read_stats.examples if ": skipped" in e), None)
        logging.warning("data: %s%s", read_stats.summary(),
                        f"; first skipped record: {first}" if first else "")
    train_source = PackedWindowSource(corpus, train_idx, config.seq_len, tokenizer.eos_id)
    val_source = PackedWindowSource(val_corpus, val_idx, config.seq_len, tokenizer.eos_id)
    for name, source in (("train", train_source), ("validation", val_source)):
        if len(source) < shard.shard_count:
            raise ValueError(
                f"the {name} split has {source.num_tokens} tokens, too few for "
                f"{shard.shard_count} window(s) of data.seq_len + 1 = {config.seq_len + 1} "
                "tokens (use more data or a smaller seq_len"
                + (", or a larger data.val_fraction)" if name == "validation" else ")"))

    train_ds = _shard(grain.MapDataset.source(train_source), shard)
    if config.shuffle:
        train_ds = train_ds.shuffle(seed=int(config.seed))  # reseeded each epoch by repeat()
    train_ds = (train_ds
                .repeat(None)
                .batch(host_batch, drop_remainder=True)
                .to_iter_dataset(_READ_OPTIONS))

    val_ds = _shard(grain.MapDataset.source(val_source), shard).batch(host_batch)
    num_val = len(val_ds)
    if config.max_val_batches is not None:
        num_val = min(num_val, config.max_val_batches)
    val_batches = LazyBatches(val_ds, num_val, host_batch)

    train_sample, _ = train_source.stream(0, min(train_source.num_tokens, _STATS_TOKENS))
    val_sample, _ = val_source.stream(0, min(val_source.num_tokens, _STATS_TOKENS))
    stats = DataStats(
        train_documents=len(train_idx),
        val_documents=len(val_idx),
        train_tokens=train_source.num_tokens,
        val_tokens=val_source.num_tokens,
        train_windows=len(train_source),
        val_windows=len(val_source),
        unigram_entropy=unigram_entropy(train_sample),
        val_unigram_xent=unigram_cross_entropy(val_sample, train_sample, tokenizer.vocab_size),
        empty_documents=read_stats.empty_documents,
        malformed_lines=read_stats.malformed_lines,
        missing_field=read_stats.missing_field,
        invalid_utf8=read_stats.invalid_utf8,
        invalid_utf8_files=read_stats.invalid_utf8_files,
    )
    return Datasets(tokenizer=tokenizer, train_dataset=train_ds, train_iter=iter(train_ds),
                    val_batches=val_batches, stats=stats, config=config)
