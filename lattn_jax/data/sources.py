"""Reading documents (one ``str`` each) from text, JSONL and Parquet files, with bad input counted.

Formats (chosen per file by ``file_format``):

- ``"text"``: plain UTF-8 text, cut into documents by a ``doc_split`` rule (see ``DataConfig``).
  Line ends are normalised like universal newlines (``"\\r\\n"`` and ``"\\r"`` become ``"\\n"``),
  so the CRLF line ends of the bundled WikiText files disappear.
- ``"jsonl"``: one JSON object per line, the document in ``text_field``; plain, gzip (``.gz``) or
  Zstandard (``.zst``) compressed, decompressed as a stream.
- ``"parquet"``: a string column ``text_field`` (FineWeb-Edu's schema has ``text``), read one row
  group at a time through pyarrow (other columns are never read), so a file is never loaded whole.

Bad input is never a silent skip nor a crash deep inside a library. It is handled as follows, and
counted in a ``ReadStats`` (which ``build_datasets`` and ``prepare_data`` report):

- a missing path: ``FileNotFoundError`` naming it;
- an unreadable file (I/O error, corrupt gzip/zstd/Parquet data): ``DataFileError`` naming it;
- invalid UTF-8: replaced by U+FFFD and counted (``invalid_utf8``, ``invalid_utf8_files``);
- an empty or whitespace-only document: skipped and counted (``empty_documents``; for plain
  text only with ``doc_split`` ``"file"`` or ``"line"``, since with ``"blank_line"`` and
  ``"wikitext"`` blank text is a separator, not a document);
- a JSONL line that is not valid JSON or not an object: skipped, counted (``malformed_lines``)
  and logged with its file and line number (the first few are also kept in
  ``ReadStats.examples``);
- a JSONL record or Parquet file without ``text_field``, or with a non-string value there:
  ``ValueError`` naming the file (and line), because it means ``data.text_field`` is wrong.
  ``read_jsonl(..., skip_missing_field=True)`` skips and counts such records instead
  (``missing_field``), and ``on_skip`` lets the caller stop once too many were skipped.

*Bad records* (JSONL lines that are not a JSON object, records without a string in
``text_field``) have one limit, :class:`BadRecordLimit`, shared by ``prepare_corpus``
(``--max_bad_fraction``) and ``read_documents``, the trainer's reader
(``data.max_bad_fraction``): the read stops with one line naming the file, the share of bad
records and the option as soon as they exceed ``max_fraction`` of the records read so far
(counting at least ``MIN_RECORDS``, so up to 10 bad records always pass at the default 1%).
:func:`check_text_field` refuses a JSONL file before it is read, with one line naming the
file and its first record's fields, when ``text_field`` names no field of its head (a wrong
option rather than bad records). ``read_documents`` also stops at a JSONL file whose every
record is bad.

Messages name the options the way the caller's user wrote them: ``OptionNames`` (the training
config's ``data.paths``/``data.text_field``/``data.format`` by default; ``prepare_data.py``
passes its flags). ``sniff_binary`` tells binary files from text by their first bytes.
"""

import codecs
import dataclasses
import gzip
import io
import json
import os
import re
from collections.abc import Callable, Iterator, Sequence

from absl import logging

__all__ = [
    "BadRecordLimit",
    "DATA_EXTENSIONS",
    "DEFAULT_MAX_BAD_FRACTION",
    "DataFileError",
    "FieldProbe",
    "MIN_RECORDS",
    "OptionNames",
    "ReadStats",
    "WIKITEXT_TITLE",
    "check_text_field",
    "decode_utf8",
    "duplicate_files",
    "file_format",
    "first_same_real_path",
    "list_files",
    "probe_text_field",
    "read_documents",
    "read_file",
    "read_jsonl",
    "read_parquet",
    "read_text",
    "sniff_binary",
    "split_text",
]

# Extensions picked up when a directory is given in `DataConfig.paths`.
_JSONL_EXTENSIONS = (".jsonl", ".jsonl.gz", ".json.gz", ".jsonl.zst", ".json.zst")
_PARQUET_EXTENSIONS = (".parquet",)
_TEXT_EXTENSIONS = (".txt", ".raw", ".text")
DATA_EXTENSIONS = _TEXT_EXTENSIONS + _JSONL_EXTENSIONS + _PARQUET_EXTENSIONS

# A WikiText article heading: " = Title = " with exactly one '=' on each side. Section headings
# (" = = Section = = ") have two or more and do not start a document.
WIKITEXT_TITLE = re.compile(r"^ = [^=](?:.*[^=])? = $")

# Bad records may be up to ``max_fraction`` of at least this many records (BadRecordLimit).
MIN_RECORDS = 1000
DEFAULT_MAX_BAD_FRACTION = 0.01  # prepare_data.py's --max_bad_fraction, data.max_bad_fraction

_MAX_EXAMPLES = 20  # malformed-input messages kept in ReadStats.examples / logged per run
_REPLACEMENT = "\ufffd"
_REPLACEMENT_UTF8 = _REPLACEMENT.encode("utf-8")


class DataFileError(OSError):
    """A data file exists but cannot be read or decoded (the message names the file)."""


@dataclasses.dataclass(frozen=True)
class OptionNames:
    """How messages name the options given to the readers.

    The defaults are the training config's fields; a tool passes its own flag names (e.g.
    ``OptionNames(paths="--input", text_field="--text_field", format="--format",
    max_bad_fraction="--max_bad_fraction")``).
    """

    paths: str = "data.paths"
    text_field: str = "data.text_field"
    format: str = "data.format"
    max_bad_fraction: str = "data.max_bad_fraction"


_CONFIG_NAMES = OptionNames()


@dataclasses.dataclass
class ReadStats:
    """Counters of what the readers saw, including the bad input they skipped or repaired.

    Attributes:
        files: files read to the end.
        documents: non-empty documents yielded.
        empty_documents: empty or whitespace-only documents skipped.
        invalid_utf8: invalid UTF-8 byte sequences replaced by U+FFFD.
        invalid_utf8_files: files that had at least one of them.
        malformed_lines: JSONL lines skipped because they are not a JSON object.
        missing_field: JSONL records skipped because ``text_field`` is absent or not a string
            (only with ``read_jsonl(..., skip_missing_field=True)``; otherwise they raise).
        examples: the first few ``"<file>:<line>: <problem>"`` messages, for reports.
        empty_files: the files read to the end that yielded no document (empty, whitespace
            only, or every record skipped), for the error of a corpus with too few documents;
            not a counter (left out of :meth:`counters`).
    """

    files: int = 0
    documents: int = 0
    empty_documents: int = 0
    invalid_utf8: int = 0
    invalid_utf8_files: int = 0
    malformed_lines: int = 0
    missing_field: int = 0
    examples: list[str] = dataclasses.field(default_factory=list)
    empty_files: list[str] = dataclasses.field(default_factory=list)

    def note(self, message: str) -> None:
        """Logs ``message`` as a warning and keeps it, up to ``_MAX_EXAMPLES`` of them."""
        if len(self.examples) < _MAX_EXAMPLES:
            self.examples.append(message)
            logging.warning("data: %s", message)

    def merge(self, other: "ReadStats") -> None:
        """Adds ``other``'s counters (and examples, up to the cap) to this one."""
        for field in ("files", "documents", "empty_documents", "invalid_utf8",
                      "invalid_utf8_files", "malformed_lines", "missing_field"):
            setattr(self, field, getattr(self, field) + getattr(other, field))
        room = _MAX_EXAMPLES - len(self.examples)
        self.examples.extend(other.examples[:max(room, 0)])
        self.empty_files.extend(other.empty_files)

    def counters(self) -> dict[str, int]:
        """The integer counters as a dict (no examples), e.g. for a manifest."""
        out = dataclasses.asdict(self)
        out.pop("examples")
        out.pop("empty_files")
        return out

    @property
    def bad_records(self) -> int:
        """Records skipped as unusable: malformed JSONL lines plus records without the text."""
        return self.malformed_lines + self.missing_field

    @property
    def records(self) -> int:
        """Every record (document) met: the ones yielded, the empty ones and the bad ones."""
        return self.documents + self.empty_documents + self.bad_records

    def summary(self) -> str:
        """One line: documents read and every kind of bad input met."""
        missing = (f", {self.missing_field} records without the text field"
                   if self.missing_field else "")
        return (f"{self.documents} documents from {self.files} files; skipped "
                f"{self.empty_documents} empty documents{missing} and {self.malformed_lines} "
                f"malformed JSON lines; replaced {self.invalid_utf8} invalid UTF-8 sequences in "
                f"{self.invalid_utf8_files} files")


def decode_utf8(data: bytes, stats: ReadStats | None = None) -> tuple[str, int]:
    """Decodes UTF-8, replacing invalid sequences by U+FFFD.

    Args:
        data: the raw bytes.
        stats: if given, ``stats.invalid_utf8`` is increased by the number of replacements.

    Returns:
        ``(text, replaced)``: the text and the number of invalid sequences replaced.
    """
    try:
        return data.decode("utf-8"), 0
    except UnicodeDecodeError:
        text = data.decode("utf-8", errors="replace")
        replaced = text.count(_REPLACEMENT) - data.count(_REPLACEMENT_UTF8)
        if stats is not None:
            stats.invalid_utf8 += replaced
        return text, replaced


def directory_listing(path: str, most: int = 6) -> str:
    """What directory ``path`` holds, for an error that names a directory given where a file
    was expected: its first ``most`` entries in sorted order (``"a, b, ..."`` when there are
    more), or ``"nothing"``."""
    inside = sorted(os.listdir(path))
    return ", ".join(inside[:most]) + (", ..." if len(inside) > most else "") or "nothing"


def file_format(path: str, fmt: str = "auto") -> str:
    """Resolves ``"auto"`` by file name to ``"jsonl"``, ``"parquet"`` or ``"text"``.

    Any other ``fmt`` is returned unchanged.
    """
    if fmt != "auto":
        return fmt
    lower = path.lower()
    if lower.endswith(_JSONL_EXTENSIONS):
        return "jsonl"
    if lower.endswith(_PARQUET_EXTENSIONS):
        return "parquet"
    return "text"


def list_files(paths: Sequence[str], names: OptionNames = _CONFIG_NAMES) -> list[str]:
    """Expands ``paths`` into a list of data files, in a deterministic order, each file once.

    Files are kept in the order given. A directory contributes its files (recursively, sorted by
    relative path, hidden files and directories skipped) whose names end in one of
    ``DATA_EXTENSIONS``. A file met again (the same ``os.path.realpath``: a directory and a file
    in it, a symlink, a path given twice) is dropped, so that no document is read twice
    (:func:`duplicate_files` names the dropped ones). Messages name the option ``names.paths``.

    Raises:
        FileNotFoundError: a path does not exist, or a directory holds no data file.
    """
    return [f for f, kept in _expand_files(paths, names) if kept is None]


def duplicate_files(paths: Sequence[str],
                    names: OptionNames = _CONFIG_NAMES) -> list[tuple[str, str]]:
    """The files :func:`list_files` drops from ``paths`` as duplicates, in the order met.

    Returns:
        ``[(dropped, kept), ...]``: each dropped path with the earlier path of the same real
        file, which is read instead.

    Raises:
        FileNotFoundError: as :func:`list_files`.
    """
    return [(f, kept) for f, kept in _expand_files(paths, names, keep_dropped=True)
            if kept is not None]


def _expand_files(paths: Sequence[str], names: OptionNames,
                  keep_dropped: bool = False) -> list[tuple[str, str | None]]:
    """``(file, None)`` for every file of ``paths`` read, and with ``keep_dropped``
    ``(file, kept)`` for every duplicate dropped (see :func:`list_files`).

    Raises:
        FileNotFoundError: as :func:`list_files`.
    """
    files = []
    for path in paths:
        path = os.fspath(path)
        if os.path.isfile(path):
            files.append(path)
        elif os.path.isdir(path):
            found = []
            for root, dirs, file_names in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                found.extend(
                    os.path.join(root, n) for n in file_names
                    if not n.startswith(".") and n.lower().endswith(DATA_EXTENSIONS))
            if not found:
                raise FileNotFoundError(
                    f"{names.paths}: directory {path} holds no data file (looked for "
                    f"{', '.join(DATA_EXTENSIONS)})")
            files.extend(sorted(found, key=lambda f: os.path.relpath(f, path)))
        else:
            raise FileNotFoundError(f"{names.paths}: no such file or directory: {path}")
    return [(f, None if k == i else files[k])
            for i, (f, k) in enumerate(zip(files, first_same_real_path(files)))
            if k == i or keep_dropped]


def first_same_real_path(paths: Sequence[str]) -> list[int]:
    """For each of ``paths``, the index of the first one with its ``os.path.realpath`` (its own
    index unless it repeats an earlier path: named twice, through a symlink, a file of a
    directory given too); :func:`list_files` and ``shards.open_corpus`` read each once."""
    first: dict[str, int] = {}
    return [first.setdefault(os.path.realpath(p), i) for i, p in enumerate(paths)]


def split_text(text: str, doc_split: str) -> Iterator[str]:
    """Cuts plain text into documents.

    Every document is stripped of leading and trailing whitespace; empty documents are skipped
    (``read_text`` counts them).

    Args:
        text: the file contents with ``"\\n"`` line ends.
        doc_split: ``"wikitext"``, ``"blank_line"``, ``"line"`` or ``"file"`` (see ``DataConfig``).

    Yields:
        The documents, in file order.

    Raises:
        ValueError: unknown ``doc_split``.
    """
    for piece in split_pieces(text, doc_split):
        piece = piece.strip()
        if piece:
            yield piece


def split_pieces(text: str, doc_split: str) -> list[str]:
    """The raw pieces :func:`split_text` cuts ``text`` into: unstripped, empty ones included.

    Raises:
        ValueError: unknown ``doc_split``.
    """
    if doc_split == "file":
        return [text]
    if doc_split == "line":
        return text.split("\n")
    if doc_split == "blank_line":
        return re.split(r"\n[ \t\r\f\v]*\n", text)
    if doc_split == "wikitext":
        pieces, current = [], []
        for line in text.splitlines(keepends=True):
            if WIKITEXT_TITLE.match(line.rstrip("\n")):
                pieces.append("".join(current))
                current = []
            current.append(line)
        pieces.append("".join(current))
        return pieces
    raise ValueError(f"unknown doc_split {doc_split!r}")


def _open_binary(path: str):
    """Opens ``path`` for binary reading, decompressing ``.gz`` and ``.zst`` as a stream."""
    lower = path.lower()
    if lower.endswith(".gz"):
        return gzip.open(path, "rb")
    if lower.endswith(".zst"):
        import zstandard  # optional dependency (setup.cfg extra "data")
        raw = open(path, "rb")
        reader = zstandard.ZstdDecompressor().stream_reader(raw, closefd=True)
        return io.BufferedReader(reader)
    return open(path, "rb")


_SNIFF_BYTES = 1 << 16
_MAX_NOT_TEXT = 0.1  # share of non-text bytes (invalid UTF-8, C0 controls) of a text file's head
_TEXT_CONTROLS = frozenset(b"\t\n\r\f\v\x1b")


# Invalid UTF-8 bytes as ``surrogateescape`` decodes them (byte b -> U+DC00 + b), and the
# longest run of 0xA0-0xFF bytes that sniff_binary takes for Latin-1 letters.
_ESCAPED_RUN = re.compile("[\udc80-\udcff]+")
_LATIN1_RUN = 2


def sniff_binary(path: str, size: int = _SNIFF_BYTES) -> str | None:
    """Why ``path`` looks like binary data rather than text, or ``None`` if it looks like text.

    Looks at the first ``size`` bytes (after decompressing ``.gz``/``.zst``): binary if they
    hold a NUL byte (UTF-8 text never does; UTF-16 and every binary format do), or if more than
    10% of them are invalid UTF-8 or C0 control characters. Invalid bytes that read as Latin-1
    letters or signs (``0xA0``-``0xFF``), one or two between valid characters (``é`` in
    ``café``, ``üß`` in ``Grüße``), do not count: Latin-1 text is read as text (those bytes
    replaced and counted, ``invalid_utf8``) whatever its size, where a few short accented lines
    would exceed the 10%; binary bytes come in longer runs or include 0x80-0x9F.

    Raises:
        DataFileError: the file cannot be read or decompressed (named).
    """
    with _reading(path):
        with _open_binary(path) as f:
            head = f.read(size)
    if not head:
        return None
    nul = head.count(0)
    if nul:
        return f"{nul} NUL bytes in its first {len(head):,} bytes"
    # surrogateescape: each invalid byte b becomes U+DC00 + b, one character per byte.
    decoder = codecs.getincrementaldecoder("utf-8")(errors="surrogateescape")
    text = decoder.decode(head, final=False)  # a character cut at the end is not an error
    invalid = sum(len(run) for run in _ESCAPED_RUN.findall(text)
                  if len(run) > _LATIN1_RUN or min(run) < "\udca0")
    controls = sum(1 for c in text if c < " " and ord(c) not in _TEXT_CONTROLS)
    share = (invalid + controls) / len(head)
    if share > _MAX_NOT_TEXT:
        return (f"{share:.0%} of its first {len(head):,} bytes are invalid UTF-8 or control "
                "characters")
    return None


def read_text(path: str, doc_split: str, stats: ReadStats | None = None) -> Iterator[str]:
    """Yields the documents of one UTF-8 text file (``.gz``/``.zst`` are decompressed).

    Args:
        path: the file.
        doc_split: see ``split_text``.
        stats: counters to update (invalid UTF-8, empty documents, documents, files).

    Raises:
        DataFileError: the file cannot be read or decompressed.
    """
    stats = ReadStats() if stats is None else stats
    with _reading(path):
        with _open_binary(path) as f:
            data = f.read()
    text, replaced = decode_utf8(data, stats)
    if replaced:
        stats.invalid_utf8_files += 1
        stats.note(f"{path}: replaced {replaced} invalid UTF-8 sequence(s) by U+FFFD")
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    for piece in split_pieces(text, doc_split):
        piece = piece.strip()
        if piece:
            stats.documents += 1
            yield piece
        elif doc_split in ("file", "line"):
            # With "blank_line" and "wikitext" an empty piece is only the text around a separator.
            stats.empty_documents += 1
    stats.files += 1


def read_jsonl(path: str, text_field: str = "text", stats: ReadStats | None = None, *,
               skip_missing_field: bool = False,
               on_skip: Callable[[ReadStats], None] | None = None,
               names: OptionNames = _CONFIG_NAMES) -> Iterator[str]:
    """Yields ``record[text_field]`` for every record of a JSONL file (plain, ``.gz``, ``.zst``).

    Blank lines are ignored. Records whose text is empty or whitespace-only are skipped and
    counted; lines that are not a JSON object are skipped, counted and logged with file and line.
    The text is otherwise kept as is.

    Args:
        path: the file.
        text_field: the key of the text.
        stats: counters to update.
        skip_missing_field: skip, count (``missing_field``) and log a record without a string
            ``text_field``, like a malformed line, instead of raising.
        on_skip: called with ``stats`` after every skipped bad record (malformed or, with
            ``skip_missing_field``, without text); it may raise to stop reading.
        names: how messages name the options (``names.text_field``).

    Raises:
        DataFileError: the file cannot be read or decompressed.
        ValueError: a record lacks ``text_field`` or has a non-string value there (unless
            ``skip_missing_field``); the message names the file and line number.
    """
    stats = ReadStats() if stats is None else stats
    bad_utf8 = 0
    with _reading(path):
        with _open_binary(path) as f:
            for lineno, raw in enumerate(f, start=1):
                if not raw.strip():
                    continue
                line, replaced = decode_utf8(raw, stats)
                bad_utf8 += replaced
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    stats.malformed_lines += 1
                    stats.note(f"{path}:{lineno}: skipped a line that is not valid JSON ({e})")
                    if on_skip is not None:
                        on_skip(stats)
                    continue
                if not isinstance(record, dict):
                    stats.malformed_lines += 1
                    stats.note(f"{path}:{lineno}: skipped a JSON {type(record).__name__}, "
                               "expected an object")
                    if on_skip is not None:
                        on_skip(stats)
                    continue
                text = record.get(text_field)
                if not isinstance(text, str):
                    problem = (f"record has no field {text_field!r}" if text_field not in record
                               else f"field {text_field!r} is {type(text).__name__}, "
                               "expected str")
                    problem += f" ({names.text_field}={text_field!r})"
                    if not skip_missing_field:
                        raise ValueError(f"{path}:{lineno}: {problem}")
                    stats.missing_field += 1
                    stats.note(f"{path}:{lineno}: skipped: {problem}")
                    if on_skip is not None:
                        on_skip(stats)
                    continue
                text, replaced = _repair_surrogates(text, stats)
                bad_utf8 += replaced
                if text.strip():
                    stats.documents += 1
                    yield text
                else:
                    stats.empty_documents += 1
    if bad_utf8:
        stats.invalid_utf8_files += 1
        stats.note(f"{path}: replaced {bad_utf8} invalid UTF-8 sequence(s) by U+FFFD")
    stats.files += 1


@dataclasses.dataclass(frozen=True)
class FieldProbe:
    """What :func:`probe_text_field` saw at the head of a JSONL file.

    Attributes:
        found: a record with a string in ``text_field`` was read.
        missing: JSON object records before it (or before the end or the cap) without one.
        ended: the file ended before a record with the field and before the cap.
        first: ``"line N: <problem>; its fields: a, b"`` of the first record without it
            (``""`` when ``missing == 0``).
    """

    found: bool
    missing: int
    ended: bool
    first: str = ""


def probe_text_field(path: str, text_field: str, max_missing: int) -> FieldProbe:
    """Reads the head of a JSONL file up to the first record with a string in ``text_field``,
    or ``max_missing`` JSON object records without one, whichever comes first.

    Lines that are not a JSON object are passed over here (the reader reports them); nothing
    is logged. ``prepare_data.py`` uses it to refuse a wrong ``--text_field`` with one line
    before a file is read.

    Raises:
        DataFileError: the file cannot be read or decompressed.
    """
    missing, first = 0, ""
    with _reading(path):
        with _open_binary(path) as f:
            for lineno, raw in enumerate(f, start=1):
                if not raw.strip():
                    continue
                try:
                    record = json.loads(decode_utf8(raw)[0])
                except json.JSONDecodeError:
                    continue
                if not isinstance(record, dict):
                    continue
                text = record.get(text_field)
                if isinstance(text, str):
                    return FieldProbe(found=True, missing=missing, ended=False, first=first)
                if not first:
                    keys = list(record)
                    shown = ", ".join(map(repr, keys[:12])) + (", ..." if len(keys) > 12 else "")
                    problem = (f"no field {text_field!r}" if text_field not in record
                               else f"field {text_field!r} is {type(text).__name__}")
                    first = f"line {lineno}: {problem}; its fields: {shown or 'none'}"
                missing += 1
                if missing >= max_missing:
                    return FieldProbe(found=False, missing=missing, ended=False, first=first)
    return FieldProbe(found=False, missing=missing, ended=True, first=first)


class BadRecordLimit:
    """Stops a read (``ValueError``) once its bad records exceed ``max_fraction`` of its records.

    Bad records are JSONL lines that are not a JSON object and records without a string in
    ``text_field`` (``ReadStats.bad_records``); they are counted over every file of a read,
    against at least ``MIN_RECORDS`` records, so a few bad records at the head of a corpus
    pass. ``done`` holds the counters of the files finished earlier in the read (the caller
    merges each file's ``ReadStats`` into it); ``check`` is the ``on_skip`` of the reader of the
    current file.

    Args:
        max_fraction: the share of bad records allowed, in ``[0, 1]`` (``1`` never stops).
        text_field: the JSONL key of the text, as messages name it.
        names: how messages name the options (``names.text_field``,
            ``names.max_bad_fraction``).

    Raises:
        ValueError: ``max_fraction`` is not a number in ``[0, 1]`` (named as
            ``names.max_bad_fraction``).
    """

    def __init__(self, max_fraction: float, text_field: str,
                 names: OptionNames = _CONFIG_NAMES):
        if (isinstance(max_fraction, bool) or not isinstance(max_fraction, (int, float))
                or not 0 <= max_fraction <= 1):
            raise ValueError(f"{names.max_bad_fraction} must be a number in [0, 1], got "
                             f"{max_fraction!r}")
        self.max_fraction, self.text_field, self.names = max_fraction, text_field, names
        self.done = ReadStats()

    def check(self, current: ReadStats, path: str = "") -> None:
        """Raises once the bad records of ``done`` and ``current`` exceed the limit.

        Args:
            current: the counters of the file being read.
            path: that file, named in the message.

        Raises:
            ValueError: one line naming ``path``, the bad records and their share of the
                records read, ``names.max_bad_fraction`` and the first bad record.
        """
        bad = self.done.bad_records + current.bad_records
        records = self.done.records + current.records
        if bad <= self.max_fraction * max(records, MIN_RECORDS):
            return
        malformed = self.done.malformed_lines + current.malformed_lines
        missing = self.done.missing_field + current.missing_field
        first = (current.examples or self.done.examples or ["?"])[0]
        where = f"{path}: " if path else ""
        raise ValueError(
            f"{where}stopped: {bad} of the {records} records read so far are bad "
            f"({bad / records:.0%}: {malformed} not JSON objects, {missing} without a string in "
            f"{self.names.text_field}={self.text_field!r}), more than "
            f"{self.names.max_bad_fraction}={self.max_fraction:g} allows (of at least "
            f"{MIN_RECORDS} records); first: {first}")

    def on_skip(self, path: str) -> Callable[[ReadStats], None]:
        """``check`` for the reader of ``path`` (``read_file(..., on_skip=...)``)."""
        return lambda current: self.check(current, path)

    def tolerated(self) -> int:
        """How many more records without the text field pass, were no good one read (at
        most ``MIN_RECORDS``; each also counts as a record read)."""
        done = self.done
        n = 0
        while n < MIN_RECORDS and (done.bad_records + n + 1
                                   <= self.max_fraction * max(done.records + n + 1,
                                                              MIN_RECORDS)):
            n += 1
        return n


def check_text_field(path: str, text_field: str, limit: BadRecordLimit) -> None:
    """Refuses a JSONL file, with one line, when ``text_field`` names no field of it: no
    record at its head has a string there, over more records than ``limit`` tolerates (the
    read would stop there, after one warning per record) or over the whole file (the read
    would find no document).

    Raises:
        ValueError: naming the option (``limit.names.text_field``), the file and the first
            record's fields.
        DataFileError: the file cannot be read.
    """
    tolerated = limit.tolerated()
    probe = probe_text_field(path, text_field, tolerated + 1)
    if probe.found or probe.missing == 0 or not (probe.ended or probe.missing > tolerated):
        return
    scope = "" if probe.ended else "first "
    raise ValueError(
        f"{limit.names.text_field}={text_field!r}: none of the {scope}{probe.missing} JSON "
        f"records of {path} has a string in that field ({probe.first}); give the key that "
        "holds the text")


def _repair_surrogates(text: str, stats: ReadStats) -> tuple[str, int]:
    """Replaces lone surrogates (JSON ``"\\udc80"`` escapes, not encodable as UTF-8)."""
    try:
        text.encode("utf-8")
        return text, 0
    except UnicodeEncodeError:
        replaced = sum(1 for c in text if "\ud800" <= c <= "\udfff")
        fixed = "".join(_REPLACEMENT if "\ud800" <= c <= "\udfff" else c for c in text)
        stats.invalid_utf8 += replaced
        return fixed, replaced


def read_parquet(path: str, text_field: str = "text", stats: ReadStats | None = None, *,
                 names: OptionNames = _CONFIG_NAMES) -> Iterator[str]:
    """Yields the ``text_field`` column of a Parquet file, one row group at a time.

    Only that column is read (FineWeb-Edu files also hold ids, URLs, scores, ...). Values are
    read as raw bytes and decoded here, so invalid UTF-8 is replaced and counted; null and empty
    values are skipped and counted as empty documents.

    Raises:
        DataFileError: the file is not readable Parquet.
        ValueError: the file has no column ``text_field``, or it is not a string/binary column.
    """
    import pyarrow as pa  # optional dependency (setup.cfg extra "data")
    import pyarrow.parquet as pq

    stats = ReadStats() if stats is None else stats
    bad_utf8 = 0
    with _reading(path):
        pf = pq.ParquetFile(path)
        schema = pf.schema_arrow
        if text_field not in schema.names:
            raise ValueError(f"{path}: Parquet file has no column {text_field!r} "
                             f"({names.text_field}); columns: {', '.join(schema.names)}")
        kind = schema.field(text_field).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)
                or pa.types.is_binary(kind) or pa.types.is_large_binary(kind)):
            raise ValueError(f"{path}: column {text_field!r} has type {kind}, expected string")
        for group in range(pf.num_row_groups):
            table = pf.read_row_group(group, columns=[text_field])
            column = table.column(0).cast(pa.large_binary())
            for value in column.to_pylist():  # bytes or None
                if value is None:
                    stats.empty_documents += 1
                    continue
                text, replaced = decode_utf8(value, stats)
                bad_utf8 += replaced
                if text.strip():
                    stats.documents += 1
                    yield text
                else:
                    stats.empty_documents += 1
    if bad_utf8:
        stats.invalid_utf8_files += 1
        stats.note(f"{path}: replaced {bad_utf8} invalid UTF-8 sequence(s) by U+FFFD")
    stats.files += 1


class _reading:
    """Context manager turning low-level read failures into a ``DataFileError`` naming ``path``.

    ``FileNotFoundError``, ``ValueError`` and ``DataFileError`` pass through unchanged.
    """

    def __init__(self, path: str):
        self.path = path

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is None or isinstance(exc, (FileNotFoundError, DataFileError, GeneratorExit)):
            return False
        if isinstance(exc, (OSError, EOFError)) or _is_codec_error(exc):
            raise DataFileError(f"cannot read data file {self.path}: "
                                f"{type(exc).__name__}: {exc}") from exc
        return False


def _is_codec_error(exc: BaseException) -> bool:
    """Errors raised by the zstandard and pyarrow readers for corrupt input."""
    module = type(exc).__module__ or ""
    return (module.startswith("zstandard") or module.startswith("pyarrow")
            or type(exc).__name__ in ("ZstdError", "ArrowInvalid", "ArrowIOError"))


def read_file(path: str, *, fmt: str = "auto", text_field: str = "text",
              doc_split: str = "blank_line", stats: ReadStats | None = None,
              skip_missing_field: bool = False,
              on_skip: Callable[[ReadStats], None] | None = None,
              names: OptionNames = _CONFIG_NAMES) -> Iterator[str]:
    """Yields the non-empty documents of one file, whatever its format.

    Args:
        path: the file.
        fmt: ``"auto"``, ``"text"``, ``"jsonl"`` or ``"parquet"``.
        text_field: JSONL key / Parquet column holding the text.
        doc_split: how plain text is cut into documents (see ``split_text``).
        stats: counters to update.
        skip_missing_field, on_skip: the bad-record policy of JSONL files (see ``read_jsonl``).
        names: how messages name the options.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        DataFileError: ``path`` cannot be read.
        ValueError: unknown ``fmt``, or a missing ``text_field`` (see the readers).
    """
    if not os.path.exists(path):
        raise FileNotFoundError(f"{names.paths}: no such file or directory: {path}")
    kind = file_format(path, fmt)
    if kind == "jsonl":
        return read_jsonl(path, text_field, stats, skip_missing_field=skip_missing_field,
                          on_skip=on_skip, names=names)
    if kind == "parquet":
        return read_parquet(path, text_field, stats, names=names)
    if kind == "text":
        return read_text(path, doc_split, stats)
    raise ValueError(f"{names.format}: unknown format {fmt!r} for {path}")


def read_documents(paths: Sequence[str], *, fmt: str = "auto", text_field: str = "text",
                   doc_split: str = "blank_line", stats: ReadStats | None = None,
                   max_bad_fraction: float = DEFAULT_MAX_BAD_FRACTION) -> Iterator[str]:
    """Yields every non-empty document of ``paths`` (files or directories), in a fixed order.

    Args:
        paths: files and/or directories (see ``list_files``).
        fmt: ``"auto"``, ``"text"``, ``"jsonl"`` or ``"parquet"``.
        text_field: JSONL key / Parquet column holding the text.
        doc_split: how plain text is cut into documents (see ``split_text``).
        stats: counters of documents and bad input, updated as the documents are read.
        max_bad_fraction: the share of bad JSONL records allowed over the read
            (``data.max_bad_fraction``, see :class:`BadRecordLimit`).

    A JSONL record without a string in ``text_field`` is skipped and counted
    (``stats.missing_field``, logged with its file and line) like a line that is not a JSON
    object (``stats.malformed_lines``), until they exceed ``max_bad_fraction`` of the records
    read (of at least ``MIN_RECORDS``). A JSONL file whose head has no record with the field
    (:func:`check_text_field`) is refused before it is read, and one whose every record is bad
    stops the read, since it holds no document (most likely ``data.text_field`` is wrong).

    Yields:
        Documents as ``str``.

    Raises:
        FileNotFoundError: see ``list_files``.
        DataFileError: a file cannot be read, or a text/JSONL file looks binary (``sniff_binary``:
            an image or archive given as text), named in the message.
        ValueError: one line naming the file: too many bad records (with their share and
            ``data.max_bad_fraction``), a JSONL file without ``text_field`` at its head or
            whose every record is bad, a Parquet file without ``text_field``; or
            ``max_bad_fraction`` outside ``[0, 1]``, an unknown ``fmt``/``doc_split``.
    """
    stats = ReadStats() if stats is None else stats
    limit = BadRecordLimit(max_bad_fraction, text_field)
    for path in list_files(paths):
        kind = file_format(path, fmt)
        if kind in ("text", "jsonl"):
            reason = sniff_binary(path)
            if reason:
                raise DataFileError(f"{_CONFIG_NAMES.paths}: {path} looks binary, not text "
                                    f"({reason}); the data pipeline reads UTF-8 text, JSONL "
                                    f"(plain, .gz, .zst), Parquet and token shards")
        if kind == "jsonl":
            check_text_field(path, text_field, limit)
        # Per-file counters (merged into ``stats`` after the file) tell a file of bad records.
        file_stats = ReadStats()
        yield from read_file(path, fmt=fmt, text_field=text_field, doc_split=doc_split,
                             stats=file_stats, skip_missing_field=True,
                             on_skip=limit.on_skip(path))
        if not file_stats.documents:
            file_stats.empty_files.append(path)
        stats.merge(file_stats)
        limit.done.merge(file_stats)
        if file_stats.bad_records and file_stats.bad_records == file_stats.records:
            first = next((e for e in file_stats.examples if ": skipped" in e), "?")
            raise ValueError(
                f"{path}: all {file_stats.records} records are bad, so it holds no document "
                f"({file_stats.missing_field} without a string in "
                f"{_CONFIG_NAMES.text_field}={text_field!r}, {file_stats.malformed_lines} not "
                f"JSON objects); first: {first}")
