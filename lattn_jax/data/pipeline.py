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

Training: windows are shuffled (grain ``MapDataset.shuffle``, reseeded every epoch), repeated
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

Validation: ``Datasets.val_batches`` is a fixed list of batches over the validation windows (in
stream order, last batch padded with zero-weight rows, capped at ``max_val_batches``).

With ``jax.process_count() > 1`` each process keeps every ``process_count``-th window
(``grain.sharding.ShardByJaxProcess``) after dropping the few windows that do not divide evenly,
and yields its ``batch_size // process_count`` rows of each global batch.

Everything is held in memory (numpy int32), which suits the small bundled corpora; a
multi-billion-token corpus needs a pre-tokenized on-disk source instead.
"""

import dataclasses
import math
from collections.abc import Sequence

import grain
import numpy as np

from lattn_jax.data import config as config_lib
from lattn_jax.data import sources
from lattn_jax.data import tokenizers

__all__ = [
    "BATCH_KEYS",
    "DataStats",
    "Datasets",
    "WindowSource",
    "build_datasets",
    "pack_documents",
    "split_documents",
    "tokenize_documents",
    "unigram_cross_entropy",
    "unigram_entropy",
]

# Keys of every example/batch; all int32 except "weights" (float32).
BATCH_KEYS = ("inputs", "targets", "segment_ids", "positions", "weights")

# Reading a window is a few numpy slices, so a small thread pool and buffer suffice. The buffer
# counts batches, so keep it small: one batch of 128 x 4096 is ~10 MB.
_READ_OPTIONS = grain.ReadOptions(num_threads=2, prefetch_buffer_size=8)
_TOKENIZE_CHUNK = 1024  # documents per batched tokenizer call


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
    """

    train_documents: int
    val_documents: int
    train_tokens: int
    val_tokens: int
    train_windows: int
    val_windows: int
    unigram_entropy: float
    val_unigram_xent: float


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
        val_batches: validation batches (same keys and shapes), deterministic.
        stats: split sizes and unigram baselines.
        config: the config this was built from.
    """

    tokenizer: tokenizers.Tokenizer
    train_dataset: grain.IterDataset
    train_iter: grain.DatasetIterator
    val_batches: list[dict[str, np.ndarray]]
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
        length = self._seq_len
        start = index * length
        window = self._tokens[start:start + length + 1]  # [seq_len + 1]
        docs = self._doc_ids[start:start + length]  # [seq_len], documents of the inputs
        segment_ids = docs - docs[0]
        # Offset of the first token of each segment inside the window (0 for the first one).
        seg_starts = np.concatenate([[0], np.flatnonzero(np.diff(docs)) + 1]).astype(np.int32)
        positions = np.arange(length, dtype=np.int32) - seg_starts[segment_ids]
        return {
            "inputs": window[:-1].copy(),
            "targets": window[1:].copy(),
            "segment_ids": segment_ids.astype(np.int32),
            "positions": positions,
            "weights": np.ones((length,), np.float32),
        }

    def __repr__(self) -> str:
        return f"WindowSource(tokens={len(self._tokens)}, seq_len={self._seq_len}, len={self._len})"


def tokenize_documents(documents: Sequence[str],
                       tokenizer: tokenizers.Tokenizer) -> list[np.ndarray]:
    """Tokenizes every document once (no BOS, no EOS); returns one int32 array per document."""
    out = []
    for lo in range(0, len(documents), _TOKENIZE_CHUNK):
        for ids in tokenizer.encode_batch(documents[lo:lo + _TOKENIZE_CHUNK]):
            out.append(np.asarray(ids, dtype=np.int32))
    return out


def split_documents(num_documents: int, val_fraction: float,
                    seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Splits document indices into train and validation by a seeded permutation.

    Args:
        num_documents: number of documents (>= 2).
        val_fraction: fraction in ``(0, 1)``; ``round(val_fraction * n)`` documents are held out,
            clipped to ``[1, n - 1]``.
        seed: permutation seed.

    Returns:
        ``(train_indices, val_indices)``, int64 arrays in permutation order, disjoint, together
        covering ``range(num_documents)``.

    Raises:
        ValueError: fewer than two documents.
    """
    if num_documents < 2:
        raise ValueError(
            f"need at least 2 documents for a train/validation split, got {num_documents} "
            "(check data.paths and data.doc_split)")
    num_val = min(max(1, round(val_fraction * num_documents)), num_documents - 1)
    order = np.random.default_rng(seed).permutation(num_documents)
    return order[num_val:], order[:num_val]


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


def build_datasets(config: config_lib.DataConfig) -> Datasets:
    """Reads, tokenizes, splits and packs the corpus; returns the train iterator and val batches.

    Args:
        config: the data options.

    Returns:
        ``Datasets`` with the tokenizer, the train dataset and iterator, the validation batches and
        statistics.

    Raises:
        FileNotFoundError: a data path or the tokenizer model is missing (named in the message).
        ValueError: fewer than two documents, a split too short for one window, or ``batch_size``
            not divisible by ``jax.process_count()``.
    """
    shard = _process_shard()
    if config.batch_size % shard.shard_count:
        raise ValueError(f"data.batch_size: {config.batch_size} is not divisible by the number of "
                         f"processes ({shard.shard_count})")
    host_batch = config.batch_size // shard.shard_count

    tokenizer = tokenizers.make_tokenizer(config.tokenizer, config.tokenizer_path)
    documents = list(sources.read_documents(
        config.paths, fmt=config.format, text_field=config.text_field,
        doc_split=config.doc_split))
    encoded = tokenize_documents(documents, tokenizer)
    train_idx, val_idx = split_documents(len(encoded), config.val_fraction, config.seed)
    train_tokens, train_docs = pack_documents([encoded[i] for i in train_idx], tokenizer.eos_id)
    val_tokens, val_docs = pack_documents([encoded[i] for i in val_idx], tokenizer.eos_id)

    train_source = WindowSource(train_tokens, train_docs, config.seq_len)
    val_source = WindowSource(val_tokens, val_docs, config.seq_len)
    for name, source, n in (("train", train_source, len(train_tokens)),
                            ("validation", val_source, len(val_tokens))):
        if len(source) < shard.shard_count:
            raise ValueError(
                f"the {name} split has {n} tokens, too few for {shard.shard_count} window(s) of "
                f"data.seq_len + 1 = {config.seq_len + 1} tokens (use more data, a smaller "
                "seq_len or a larger val_fraction)")

    train_ds = (
        _shard(grain.MapDataset.source(train_source), shard)
        .shuffle(seed=int(config.seed))  # reseeded with the epoch number by repeat()
        .repeat(None)
        .batch(host_batch, drop_remainder=True)
        .to_iter_dataset(_READ_OPTIONS))

    val_ds = _shard(grain.MapDataset.source(val_source), shard).batch(host_batch)
    num_val = len(val_ds)
    if config.max_val_batches is not None:
        num_val = min(num_val, config.max_val_batches)
    val_batches = [_pad_batch(val_ds[i], host_batch) for i in range(num_val)]

    stats = DataStats(
        train_documents=len(train_idx),
        val_documents=len(val_idx),
        train_tokens=len(train_tokens),
        val_tokens=len(val_tokens),
        train_windows=len(train_source),
        val_windows=len(val_source),
        unigram_entropy=unigram_entropy(train_tokens),
        val_unigram_xent=unigram_cross_entropy(val_tokens, train_tokens, tokenizer.vocab_size),
    )
    return Datasets(tokenizer=tokenizer, train_dataset=train_ds, train_iter=iter(train_ds),
                    val_batches=val_batches, stats=stats, config=config)
