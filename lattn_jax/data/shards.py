"""Pre-tokenized token shards on disk: the format ``prepare_data`` writes and the pipeline maps.

A token-shard directory holds, for every shard ``<name>`` (one per input file):

- ``<name>.tokens.bin``: the token ids of all its documents, concatenated, no EOS, as raw
  little-endian unsigned integers of ``manifest["dtype"]`` (``"uint16"`` when the vocabulary has
  at most 65536 ids, else ``"uint32"``); memory-mapped, never read whole;
- ``<name>.offsets.npy``: int64 ``[documents + 1]``, document ``i`` is
  ``tokens[offsets[i]:offsets[i + 1]]`` (``offsets[0] == 0``, non-decreasing, no empty documents);

and one ``manifest.json``::

    {"format": "lattn-token-shards", "version": 1, "dtype": "uint16",
     "tokenizer": {"kind", "name", "file", "sha256", "vocab_size", "eos_id", "bos_id"},
     "options": {"format", "text_field", "doc_split"},
     "shards": [{"name", "source", "source_sha256", "source_bytes", "source_mtime_ns",
                 "documents", "tokens", "token_file", "offsets_file", "read_stats": {...}}, ...],
     "totals": {"documents", "tokens", "shards", "files", "empty_documents",
                "malformed_lines", "invalid_utf8", "invalid_utf8_files"}}

Files are written under a ``.tmp`` name and renamed when complete, and the manifest is rewritten
(atomically) after every finished shard, so an interrupted ``prepare_data`` leaves only complete
shards listed.
"""

import dataclasses
import json
import os
from collections.abc import Sequence

import numpy as np

from lattn_jax.data import sources

__all__ = [
    "FORMAT",
    "MANIFEST",
    "MappedTokens",
    "ShardWriter",
    "TokenCorpus",
    "is_token_dir",
    "open_corpus",
    "read_manifest",
    "token_dtype",
    "write_manifest",
]

FORMAT = "lattn-token-shards"
VERSION = 1
MANIFEST = "manifest.json"


def token_dtype(vocab_size: int) -> np.dtype:
    """``uint16`` for vocabularies of at most 65536 ids, else ``uint32``."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def is_token_dir(path: str) -> bool:
    """Whether ``path`` is a directory holding a token-shard ``manifest.json``."""
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, MANIFEST))


def read_manifest(directory: str) -> dict:
    """Reads and checks ``<directory>/manifest.json``.

    Raises:
        FileNotFoundError: there is no manifest.
        ValueError: the manifest is not valid JSON or not of this format/version (named).
    """
    path = os.path.join(directory, MANIFEST)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no token-shard manifest: {path}")
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: unreadable manifest: {e}") from e
    if (not isinstance(manifest, dict) or manifest.get("format") != FORMAT
            or manifest.get("version") != VERSION):
        raise ValueError(f"{path}: not a {FORMAT} v{VERSION} manifest")
    return manifest


# The manifest key listing the input files a prepare_data run has not tokenized yet (present
# only while it runs, or after it failed); a corpus with any is refused by open_corpus.
PENDING_KEY = "pending_inputs"


def write_manifest(directory: str, manifest: dict) -> None:
    """Writes ``manifest`` to ``<directory>/manifest.json`` atomically (temp file + rename)."""
    path = os.path.join(directory, MANIFEST)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
    os.replace(tmp, path)


class ShardWriter:
    """Appends documents to one shard; ``finish()`` makes the files final.

    Args:
        directory: the output directory.
        name: shard name (file prefix).
        dtype: token dtype of the shard (see ``token_dtype``).

    Example::

        w = ShardWriter(out, "shard-00000", np.uint16)
        w.add(np.array([5, 6, 7]))
        entry = w.finish()  # {"name", "documents", "tokens", "token_file", "offsets_file"}
    """

    def __init__(self, directory: str, name: str, dtype):
        self.directory = directory
        self.name = name
        self.dtype = np.dtype(dtype)
        self.token_file = f"{name}.tokens.bin"
        self.offsets_file = f"{name}.offsets.npy"
        self._tmp = os.path.join(directory, self.token_file + ".tmp")
        self._f = open(self._tmp, "wb")
        self._lengths = []

    def add(self, ids: np.ndarray) -> None:
        """Appends one non-empty document (int ids without EOS).

        Raises:
            ValueError: an empty document, or ids that do not fit the dtype.
        """
        ids = np.asarray(ids)
        if ids.size == 0:
            raise ValueError(f"shard {self.name}: empty document")
        if ids.min() < 0 or ids.max() > np.iinfo(self.dtype).max:
            raise ValueError(f"shard {self.name}: ids outside the range of {self.dtype}")
        self._f.write(ids.astype(self.dtype.newbyteorder("<"), copy=False).tobytes())
        self._lengths.append(ids.size)

    def add_many(self, flat: np.ndarray, lengths: np.ndarray) -> None:
        """Appends several documents given as concatenated ids and their (positive) lengths."""
        lengths = np.asarray(lengths, np.int64)
        if lengths.size == 0:
            return
        if lengths.min() <= 0 or lengths.sum() != len(flat):
            raise ValueError(f"shard {self.name}: bad document lengths")
        if len(flat) and (flat.min() < 0 or flat.max() > np.iinfo(self.dtype).max):
            raise ValueError(f"shard {self.name}: ids outside the range of {self.dtype}")
        self._f.write(np.asarray(flat).astype(self.dtype.newbyteorder("<"), copy=False).tobytes())
        self._lengths.extend(lengths.tolist())

    def finish(self) -> dict:
        """Closes the shard, renames its files into place; returns its manifest fields."""
        self._f.close()
        offsets = np.zeros((len(self._lengths) + 1,), np.int64)
        np.cumsum(self._lengths, out=offsets[1:])
        tmp = os.path.join(self.directory, self.offsets_file + ".tmp.npy")
        np.save(tmp, offsets)
        os.replace(tmp, os.path.join(self.directory, self.offsets_file))
        os.replace(self._tmp, os.path.join(self.directory, self.token_file))
        return {"name": self.name, "documents": len(self._lengths), "tokens": int(offsets[-1]),
                "token_file": self.token_file, "offsets_file": self.offsets_file}

    def abort(self) -> None:
        """Closes and deletes the unfinished files."""
        self._f.close()
        if os.path.exists(self._tmp):
            os.remove(self._tmp)


class MappedTokens:
    """A read-only, lazily memory-mapped 1-D token file that pickles as its path.

    ``np.memmap`` pickles as a full in-memory copy, which grain worker processes must not get;
    this wrapper maps the file on first access in each process.

    Args:
        path: the raw token file.
        dtype: its (little-endian) dtype.
        length: number of tokens in it.
    """

    def __init__(self, path: str, dtype, length: int):
        self.path = path
        self.dtype = np.dtype(dtype)
        self.length = int(length)
        self._map = None

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index):
        if self._map is None:
            self._map = np.memmap(self.path, dtype=self.dtype, mode="r", shape=(self.length,))
        return self._map[index]

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_map"] = None
        return state

    def __repr__(self) -> str:
        return f"MappedTokens({self.path!r}, {self.dtype}, {self.length})"


@dataclasses.dataclass
class TokenCorpus:
    """Documents of one or more token-shard directories (or of in-memory arrays).

    Attributes:
        shards: one 1-D integer array per shard (``MappedTokens`` for files), documents without
            EOS.
        doc_shard: int32 ``[D]``, shard of every document.
        doc_start: int64 ``[D]``, offset of every document in its shard.
        doc_len: int64 ``[D]``, length of every document (> 0).
        tokenizer: the tokenizer description from the manifest (``None`` in memory).
        read_stats: summed ``read_stats`` counters of the manifests.
        shard_names: every shard's ``name`` in its manifest (``experiments/build_corpus.py``
            names a shard after its source, e.g. ``"gutenberg"``), ``None`` in memory.
    """

    shards: list[np.ndarray]
    doc_shard: np.ndarray
    doc_start: np.ndarray
    doc_len: np.ndarray
    tokenizer: dict | None = None
    read_stats: dict = dataclasses.field(default_factory=dict)
    shard_names: list[str] | None = None

    @property
    def num_documents(self) -> int:
        return len(self.doc_len)

    def document(self, index: int) -> np.ndarray:
        """The ids of document ``index`` (a view into its shard)."""
        start = self.doc_start[index]
        return self.shards[self.doc_shard[index]][start:start + self.doc_len[index]]

    @classmethod
    def from_documents(cls, documents: Sequence[np.ndarray]) -> "TokenCorpus":
        """An in-memory corpus: the documents concatenated into one int32 shard."""
        lengths = np.array([len(d) for d in documents], np.int64)
        starts = np.zeros_like(lengths)
        if len(lengths):
            np.cumsum(lengths[:-1], out=starts[1:])
        flat = (np.concatenate(documents).astype(np.int32, copy=False) if len(documents)
                else np.zeros((0,), np.int32))
        return cls(shards=[flat], doc_shard=np.zeros(len(lengths), np.int32), doc_start=starts,
                   doc_len=lengths)


def duplicate_dirs(directories: Sequence[str]) -> list[tuple[str, str]]:
    """``[(dropped, kept), ...]``: each directory of ``directories`` that is the same real
    directory (``os.path.realpath``: named twice, or through a symlink) as the earlier
    ``kept``, in the order met; :func:`open_corpus` reads it once, as
    :func:`lattn_jax.data.sources.list_files` reads a file named twice once."""
    first = sources.first_same_real_path(directories)
    return [(directories[i], directories[k]) for i, k in enumerate(first) if k != i]


def open_corpus(directories: Sequence[str]) -> TokenCorpus:
    """Memory-maps the shards of one or more token-shard directories, in order; a directory
    named again (:func:`duplicate_dirs`) is read once, at its first place.

    Raises:
        FileNotFoundError: a manifest or a shard file listed in it is missing (named).
        ValueError: a malformed manifest or shard, directories made with different
            tokenizers (named), or a directory whose ``prepare_data`` run stopped before its
            last input file (the manifest's :data:`PENDING_KEY`; named, with the way to
            finish it).
    """
    shards, doc_shard, doc_start, doc_len, shard_names = [], [], [], [], []
    tokenizer, stats = None, {}
    first = sources.first_same_real_path(directories)
    for i, directory in enumerate(directories):
        if first[i] != i:  # the same directory again: its documents once
            continue
        manifest = read_manifest(directory)
        pending = manifest.get(PENDING_KEY) or []
        if pending:
            raise ValueError(
                f"{directory}: its prepare_data.py run stopped before it finished ({len(pending)} "
                f"input file(s) not tokenized, the first {pending[0]}); run prepare_data.py "
                f"again with the same --output_dir to finish it")
        if tokenizer is None:
            tokenizer = manifest["tokenizer"]
        elif manifest["tokenizer"]["sha256"] != tokenizer["sha256"]:
            raise ValueError(f"{directory}: made with tokenizer {manifest['tokenizer']['name']}, "
                             f"but an earlier directory with {tokenizer['name']}")
        dtype = np.dtype(manifest["dtype"]).newbyteorder("<")
        for key, value in manifest.get("totals", {}).items():
            if key not in ("tokens", "shards"):
                stats[key] = stats.get(key, 0) + int(value)
        for entry in manifest["shards"]:
            token_path = os.path.join(directory, entry["token_file"])
            offsets_path = os.path.join(directory, entry["offsets_file"])
            for path in (token_path, offsets_path):
                if not os.path.isfile(path):
                    raise FileNotFoundError(f"token shard file listed in "
                                            f"{os.path.join(directory, MANIFEST)} is missing: "
                                            f"{path}")
            offsets = np.load(offsets_path)
            size = os.path.getsize(token_path)
            if (offsets.ndim != 1 or offsets[0] != 0 or offsets[-1] != entry["tokens"]
                    or size != entry["tokens"] * dtype.itemsize or np.any(np.diff(offsets) <= 0)):
                raise ValueError(f"token shard {token_path} does not match its offsets/manifest "
                                 "(truncated or modified?)")
            if entry["tokens"] == 0:
                continue
            index = len(shards)
            shards.append(MappedTokens(token_path, dtype, entry["tokens"]))
            shard_names.append(str(entry["name"]))
            n = len(offsets) - 1
            doc_shard.append(np.full((n,), index, np.int32))
            doc_start.append(offsets[:-1])
            doc_len.append(np.diff(offsets))
    if not shards:
        raise ValueError(f"no tokens in {', '.join(directories)}")
    return TokenCorpus(shards=shards, doc_shard=np.concatenate(doc_shard),
                       doc_start=np.concatenate(doc_start), doc_len=np.concatenate(doc_len),
                       tokenizer=tokenizer, read_stats=stats, shard_names=shard_names)
