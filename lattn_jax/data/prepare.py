"""Tokenizes a corpus once, in parallel, into token shards plus a manifest (``shards`` format).

``prepare_corpus`` is what ``experiments/prepare_data.py`` runs. Every input file (text, JSONL
plain/gzip/zstd, Parquet) becomes one shard, ``shard-<index>``, written by the main process while
a pool of worker processes tokenizes chunks of its documents (at most ``2 * workers`` chunks in
flight, so memory stays bounded whatever the file size). The manifest records the tokenizer (name,
file and sha256), every source file (path, size, mtime, sha256) and the document, token and
bad-input counts of every shard.

Bad input has one policy. Invalid UTF-8 is replaced and counted, empty documents are skipped
and counted, and *bad records* (JSONL lines that are not a JSON object, records without a string
in ``text_field``) are skipped and counted alike; the run stops, with one line naming
``--max_bad_fraction``, as soon as the bad records exceed that fraction of the records read so
far (counting at least ``MIN_RECORDS``, so up to 10 bad records always pass at the default 1%).
A wrong ``--text_field`` is refused before a JSONL file is read, with one line naming the file
and its first record's fields, when none of the records at its head has the field (more of them
than the limit tolerates, or all of the file's), rather than after one warning per record. A file
read as text or JSONL whose first 64 KiB look binary (NUL bytes, or over 10% invalid UTF-8 or
control characters, ``sources.sniff_binary``) is refused before reading, naming it. Messages name
``prepare_data.py``'s flags (``--input``, ``--text_field``, ``--format``).

Re-running with the same output directory skips every shard whose source file is unchanged (same
path and sha256; the hash is recomputed only if size or mtime changed) and whose files are
complete; an interrupted run therefore resumes at the first unfinished shard. A finished run
removes the shard files (``shard-<index>.tokens.bin`` / ``.offsets.npy``, nothing else) that its
manifest does not list, left by an earlier run with more inputs, naming them in one line: the
directory then holds exactly the corpus of the inputs given (shards are derived data, remade by
running with those inputs again; refusing would leave the stale files to whatever reads the
folder: ``corpus_pieces.py --mode=split`` packs the whole directory).
"""

import collections
import functools
import multiprocessing
import os
import re
import signal
import time
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import tqdm

from lattn_jax import records
from lattn_jax.data import shards
from lattn_jax.data import sources
from lattn_jax.data import tokenizers

__all__ = ["MIN_RECORDS", "prepare_corpus", "tokenizer_pool"]

# Bad records may be up to ``max_bad_fraction`` of at least this many records.
MIN_RECORDS = sources.MIN_RECORDS
# prepare_data.py's flags, as messages name them.
_FLAG_NAMES = sources.OptionNames(paths="--input", text_field="--text_field", format="--format",
                                  max_bad_fraction="--max_bad_fraction")

_worker_tokenizer = None


def _init_worker(kind: str, path: str | None) -> None:
    global _worker_tokenizer
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one process per core already
    # Ctrl-C reaches the whole process group: the parent stops (and terminates the pool);
    # the workers ignore it rather than each printing a KeyboardInterrupt traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _worker_tokenizer = tokenizers.make_tokenizer(kind, path)
    impl = getattr(_worker_tokenizer, "_impl", _worker_tokenizer)  # GGUF wraps another one
    if isinstance(impl, tokenizers.SentencePieceTokenizer):
        impl.num_threads = 1


def _encode_chunk(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray, int]:
    """Tokenizes ``texts`` with the worker's tokenizer.

    Returns:
        ``(flat, lengths, empty)``: the ids of the documents that gave at least one token,
        concatenated (int64), their lengths, and how many gave none.
    """
    encoded = _worker_tokenizer.encode_batch(texts)
    kept = [ids for ids in encoded if len(ids)]
    lengths = np.array([len(ids) for ids in kept], np.int64)
    flat = (np.concatenate([np.asarray(ids, np.int64) for ids in kept]) if kept
            else np.zeros((0,), np.int64))
    return flat, lengths, len(encoded) - len(kept)


def _chunks(items: Iterable[str], size: int) -> Iterator[list[str]]:
    chunk = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _bounded_imap(pool, fn, items: Iterable, in_flight: int) -> Iterator:
    """Like ``pool.imap`` (ordered) but reads ``items`` only ``in_flight`` ahead."""
    pending = collections.deque()
    for item in items:
        pending.append(pool.apply_async(fn, (item,)))
        if len(pending) >= in_flight:
            yield pending.popleft().get()
    while pending:
        yield pending.popleft().get()


def _source_info(path: str, previous: dict | None) -> dict:
    stat = os.stat(path)
    info = {"source": path, "source_bytes": stat.st_size, "source_mtime_ns": stat.st_mtime_ns}
    if (previous and previous.get("source") == path
            and previous.get("source_bytes") == stat.st_size
            and previous.get("source_mtime_ns") == stat.st_mtime_ns):
        info["source_sha256"] = previous["source_sha256"]
    else:
        info["source_sha256"] = tokenizers.file_sha256(path)
    return info


def _is_complete(directory: str, entry: dict, dtype: np.dtype) -> bool:
    token_path = os.path.join(directory, entry["token_file"])
    offsets_path = os.path.join(directory, entry["offsets_file"])
    return (os.path.isfile(token_path) and os.path.isfile(offsets_path)
            and os.path.getsize(token_path) == entry["tokens"] * dtype.itemsize)


def _totals(entries: list[dict]) -> dict:
    totals = {"shards": len(entries), "documents": 0, "tokens": 0}
    for entry in entries:
        totals["documents"] += entry["documents"]
        totals["tokens"] += entry["tokens"]
        for key, value in entry["read_stats"].items():
            if key != "documents":
                totals[key] = totals.get(key, 0) + value
    return totals


@functools.lru_cache(maxsize=4)
def _cached_tokenizer(kind: str, path: str | None, size: int, mtime_ns: int):
    return tokenizers.make_tokenizer(kind, path)


def _main_tokenizer(kind: str, path: str | None) -> tokenizers.Tokenizer:
    """The tokenizer of this process, built once per file (building a GGUF vocabulary takes
    seconds, and a corpus build prepares hundreds of small inputs with one tokenizer)."""
    if path is None or not os.path.isfile(path):
        return tokenizers.make_tokenizer(kind, path)  # raises the usual errors
    stat = os.stat(path)
    return _cached_tokenizer(kind, os.path.abspath(path), stat.st_size, stat.st_mtime_ns)


def tokenizer_pool(kind: str, path: str | None, workers: int):
    """A pool of ``workers`` tokenizer processes for ``prepare_corpus(..., pool=...)``.

    Starting the processes costs seconds (each imports the tokenizer); a caller that prepares
    many small inputs with one tokenizer starts one pool and passes it to every call. Use it as a
    context manager (``with tokenizer_pool(...) as pool:``) so that it is terminated after use.
    """
    context = multiprocessing.get_context("spawn")  # no fork of a (possibly) threaded parent
    return context.Pool(workers, initializer=_init_worker, initargs=(kind, path))


def prepare_corpus(inputs: Sequence[str], output_dir: str, *, tokenizer: str = "sentencepiece",
                   tokenizer_path: str | None = None, fmt: str = "auto",
                   text_field: str = "text", doc_split: str = "blank_line", workers: int = 0,
                   chunk_docs: int = 256, progress: bool = True, print_fn=print,
                   pool=None,
                   max_bad_fraction: float = sources.DEFAULT_MAX_BAD_FRACTION,
                   allow_empty: bool = False) -> dict:
    """Tokenizes ``inputs`` into token shards in ``output_dir``; returns the manifest.

    Args:
        inputs: files and/or directories (see ``sources.list_files``); one shard per file, a
            file named twice read once (said through ``print_fn``).
        output_dir: where the shards and ``manifest.json`` go (created if missing).
        tokenizer: tokenizer kind (see ``tokenizers.make_tokenizer``).
        tokenizer_path: its model file (``None``: bundled LLaMA-2 for ``"sentencepiece"``).
        fmt: ``"auto"``, ``"text"``, ``"jsonl"`` or ``"parquet"``.
        text_field: JSONL key / Parquet column holding the text.
        doc_split: how plain text is cut into documents (see ``sources.split_text``).
        workers: tokenizer processes; ``0`` tokenizes in this process.
        chunk_docs: documents per task sent to a worker.
        progress: show a tqdm progress bar (documents, tokens/s), from the first tokenised
            documents on (an input refused before them is reported with no bar).
        print_fn: where the per-shard summary lines go.
        pool: a ``tokenizer_pool`` of the same tokenizer to use instead of starting one
            (``workers`` is then the number of its processes); the caller terminates it.
        max_bad_fraction: stop once the bad records (malformed JSONL lines, records without
            ``text_field``) exceed this fraction of the records read (of at least
            ``MIN_RECORDS``); they are skipped and counted below it
            (``sources.BadRecordLimit``, the trainer's ``data.max_bad_fraction`` limit too).
        allow_empty: accept inputs of no documents (empty shards): a corpus build's split of
            a source may hold none (``lattn_jax.data.corpora.build``); else they are refused.

    Returns:
        The manifest dict (also written to ``<output_dir>/manifest.json``).

    Raises:
        FileNotFoundError: an input or the tokenizer file is missing (named).
        sources.DataFileError: an input cannot be read, or looks binary (named).
        ValueError: bad options (a ``"huggingface"`` or ``"gguf"`` tokenizer without
            ``tokenizer_path``, named as ``--tokenizer_path``), too many bad records, a
            Parquet source without ``text_field``, an ``output_dir`` that is a file, cannot
            be written or made, or holds shards of another tokenizer. Also when the inputs
            hold no text (unless ``allow_empty``): every file empty (refused before anything
            is written), or no file gave a document (then nothing of the run is kept: shards
            of no document are written last, the previous manifest is put back); the message
            names each ``--input`` and ``--output_dir``.
    """
    if workers < 0 or chunk_docs < 1:
        raise ValueError(f"--workers must be >= 0 and --chunk_docs >= 1, got {workers}, "
                         f"{chunk_docs}")
    if fmt not in ("auto", "text", "jsonl", "parquet"):
        raise ValueError(f"--format: expected auto, text, jsonl or parquet, got {fmt!r}")
    limit = sources.BadRecordLimit(max_bad_fraction, text_field, _FLAG_NAMES)  # checks it
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise ValueError(f"--output_dir={output_dir} exists and is not a directory")
    problem = records.unwritable_dir(output_dir)
    if problem:  # before tokenizing anything
        raise ValueError(f"--output_dir={output_dir} cannot be written ({problem})")
    if tokenizer in ("huggingface", "gguf") and tokenizer_path is None:
        raise ValueError(f"--tokenizer={tokenizer} needs its model file: pass "
                         f"--tokenizer_path=<file>")
    tok = _main_tokenizer(tokenizer, tokenizer_path)
    files = sources.list_files(inputs, _FLAG_NAMES)
    dropped = sources.duplicate_files(inputs, _FLAG_NAMES)
    if dropped:  # read once, one shard (as the trainer reads them)
        print_fn(f"{_FLAG_NAMES.paths}: read once, dropped as duplicates of an earlier entry "
                 f"(the same real file): {', '.join(d for d, _ in dropped)}")
    if not allow_empty and all(os.path.getsize(f) == 0 for f in files):  # before any write
        raise ValueError(f"{_inputs_flag(inputs)}: no text to tokenize, every input file is "
                         f"empty ({_some(files)}); --output_dir={output_dir} left as it was")
    before = set(os.listdir(output_dir)) if os.path.isdir(output_dir) else set()
    manifest_path = os.path.join(output_dir, shards.MANIFEST)
    old_manifest = None
    if os.path.isfile(manifest_path):
        with open(manifest_path, "rb") as f:
            old_manifest = f.read()
    os.makedirs(output_dir, exist_ok=True)
    dtype = shards.token_dtype(tok.vocab_size)
    options = {"format": fmt, "text_field": text_field, "doc_split": doc_split}

    previous = {}
    if shards.is_token_dir(output_dir):
        old = shards.read_manifest(output_dir)
        if old["tokenizer"]["sha256"] != tok.sha256 or old.get("options") != options:
            raise ValueError(
                f"{output_dir} holds token shards made with {old['tokenizer']['name']} and "
                f"options {old.get('options')}; use another output directory for "
                f"{tok.name} with {options}")
        previous = {e["name"]: e for e in old["shards"]}

    manifest = {"format": shards.FORMAT, "version": shards.VERSION, "dtype": dtype.name,
                "tokenizer": tok.describe(), "options": options, "shards": [], "totals": {}}
    own_pool = pool is None and workers > 0
    if own_pool:
        pool = tokenizer_pool(tok.kind, tok.path, workers)
    elif pool is None:
        global _worker_tokenizer
        _worker_tokenizer = tok
    # The bar starts with the first tokenised documents: a file refused before (a wrong
    # --text_field, a binary or unreadable file) is one error line, not an empty bar and it.
    bar = None
    start, done_tokens = time.perf_counter(), 0
    # Shards of files that gave no document: not written (nor an older shard of their name
    # replaced) until the corpus is known to hold some, so that a corpus of none is undone.
    empty_shards = []
    try:
        for index, path in enumerate(files):
            name = f"shard-{index:05d}"
            old = previous.get(name)
            info = _source_info(path, old)
            if (old and old["source"] == path and old["source_sha256"] == info["source_sha256"]
                    and _is_complete(output_dir, old, dtype)):
                manifest["shards"].append({**old, **info})
                limit.done.merge(sources.ReadStats(**{
                    k: v for k, v in old["read_stats"].items()
                    if k in sources.ReadStats.__dataclass_fields__}))
                print_fn(f"{name}: {path} unchanged, skipped ({old['tokens']:,} tokens)")
                continue
            kind = sources.file_format(path, fmt)
            if kind in ("text", "jsonl"):
                reason = sources.sniff_binary(path)
                if reason:
                    raise sources.DataFileError(
                        f"{path} looks binary, not text ({reason}); prepare_data.py reads UTF-8 "
                        f"text, JSONL (plain, .gz, .zst) and Parquet (--format={fmt})")
            if kind == "jsonl":
                sources.check_text_field(path, text_field, limit)
            stats = sources.ReadStats()
            docs = sources.read_file(path, fmt=fmt, text_field=text_field, doc_split=doc_split,
                                     stats=stats, skip_missing_field=True,
                                     on_skip=limit.on_skip(path),
                                     names=_FLAG_NAMES)
            writer = shards.ShardWriter(output_dir, name, dtype)
            written = 0
            try:
                chunks = _chunks(docs, chunk_docs)
                results = (_bounded_imap(pool, _encode_chunk, chunks, 2 * workers) if pool
                           else map(_encode_chunk, chunks))
                for flat, lengths, empty in results:
                    writer.add_many(flat, lengths)
                    written += len(lengths)
                    stats.documents -= empty
                    stats.empty_documents += empty
                    done_tokens += len(flat)
                    if bar is None:
                        bar = tqdm.tqdm(unit="doc", disable=not progress, dynamic_ncols=True,
                                        smoothing=0.1)
                    bar.update(len(lengths) + empty)
                    bar.set_postfix(
                        tok_s=f"{done_tokens / max(time.perf_counter() - start, 1e-9):,.0f}")
            except BaseException:
                writer.abort()
                raise
            limit.done.merge(stats)
            if written:
                entry = writer.finish()
            else:  # its (empty) files are written once some file gave documents: see below
                writer.abort()
                entry = {"name": name, "documents": 0, "tokens": 0,
                         "token_file": writer.token_file, "offsets_file": writer.offsets_file}
                empty_shards.append(name)
            entry = {**entry, **info, "read_stats": stats.counters()}
            manifest["shards"].append(entry)
            manifest["totals"] = _totals(manifest["shards"])
            # Until the last file is done the corpus is partial: shards.open_corpus refuses
            # it (a failed run's directory would otherwise train on the files before the
            # failure), and a rerun resumes.
            manifest[shards.PENDING_KEY] = list(files[index + 1:])
            shards.write_manifest(output_dir, manifest)
            print_fn(f"{name}: {path}: {entry['documents']:,} documents, {entry['tokens']:,} "
                     f"tokens; {stats.summary()}")
    finally:
        if bar is not None:
            bar.close()
        if own_pool:
            pool.terminate()
            pool.join()
    manifest["totals"] = _totals(manifest["shards"])
    if manifest["totals"]["tokens"] == 0 and not allow_empty:  # blank lines only: training fails
        _undo(output_dir, before, old_manifest)
        raise ValueError(f"{_inputs_flag(inputs)}: no documents in {_some(files)} (blank or "
                         f"without text); nothing kept, "
                         f"--output_dir={output_dir} left as it was")
    for name in empty_shards:
        shards.ShardWriter(output_dir, name, dtype).finish()
    manifest.pop(shards.PENDING_KEY, None)
    shards.write_manifest(output_dir, manifest)
    _remove_stale_shards(output_dir, manifest, print_fn)
    return manifest


# The files of a shard that prepare_corpus writes (``shard-<index>``, ``ShardWriter``).
_SHARD_FILE = re.compile(r"shard-\d{5,}\.(tokens\.bin|offsets\.npy)")


def _remove_stale_shards(output_dir: str, manifest: dict, print_fn) -> None:
    """Removes the shard files in ``output_dir`` that ``manifest`` does not list (an earlier run
    with more inputs left them; tools that read the directory's files would pack them), and
    says which in one line. Only names of the shard pattern are touched."""
    listed = {e[key] for e in manifest["shards"] for key in ("token_file", "offsets_file")}
    stale = sorted(name for name in os.listdir(output_dir)
                   if _SHARD_FILE.fullmatch(name) and name not in listed)
    for name in stale:
        os.remove(os.path.join(output_dir, name))
    if stale:
        print_fn(f"{output_dir}: removed {len(stale)} shard file(s) of an earlier run that the "
                 f"new manifest does not list: {_some(stale)}")


def _inputs_flag(inputs: Sequence[str]) -> str:
    """``--input=a --input=b``: the inputs as the command named them."""
    return " ".join(f"--input={path}" for path in inputs)


def _some(files: Sequence[str], limit: int = 3) -> str:
    """``a, b, c and 4 more``: the first ``limit`` of ``files`` for a one-line message."""
    more = f" and {len(files) - limit} more" if len(files) > limit else ""
    return ", ".join(files[:limit]) + more


def _undo(output_dir: str, before: set, old_manifest: bytes | None) -> None:
    """Removes the files this run added to ``output_dir`` (not in ``before``) and puts back its
    previous ``manifest.json`` (``old_manifest``; none: the run's own is removed)."""
    for name in set(os.listdir(output_dir)) - before:
        os.remove(os.path.join(output_dir, name))
    if old_manifest is not None:
        with open(os.path.join(output_dir, shards.MANIFEST), "wb") as f:
            f.write(old_manifest)
