"""Reading documents (one ``str`` each) from plain-text and JSONL files.

Plain text is cut into documents by a ``doc_split`` rule (see ``DataConfig``); JSONL gives one
document per record, read from ``text_field``. Files are read with universal newlines, so the CRLF
line ends of the bundled WikiText files become ``"\\n"``. Empty documents are skipped.
"""

import gzip
import json
import os
import re
from collections.abc import Iterator, Sequence

__all__ = [
    "DATA_EXTENSIONS",
    "WIKITEXT_TITLE",
    "file_format",
    "list_files",
    "read_documents",
    "read_jsonl",
    "read_text",
    "split_text",
]

# Extensions picked up when a directory is given in `DataConfig.paths`.
DATA_EXTENSIONS = (".txt", ".raw", ".text", ".jsonl", ".jsonl.gz", ".json.gz")
_JSONL_EXTENSIONS = (".jsonl", ".jsonl.gz", ".json.gz")

# A WikiText article heading: " = Title = " with exactly one '=' on each side. Section headings
# (" = = Section = = ") have two or more and do not start a document.
WIKITEXT_TITLE = re.compile(r"^ = [^=](?:.*[^=])? = $")


def file_format(path: str, fmt: str = "auto") -> str:
    """Resolves ``"auto"`` to ``"jsonl"`` or ``"text"`` by file name; returns others unchanged."""
    if fmt != "auto":
        return fmt
    return "jsonl" if path.lower().endswith(_JSONL_EXTENSIONS) else "text"


def list_files(paths: Sequence[str]) -> list[str]:
    """Expands ``paths`` into a list of data files, in a deterministic order.

    Files are kept in the order given. A directory contributes its files (recursively, sorted by
    relative path, hidden files and directories skipped) whose names end in one of
    ``DATA_EXTENSIONS``.

    Raises:
        FileNotFoundError: a path does not exist, or a directory holds no data file.
    """
    files = []
    for path in paths:
        path = os.fspath(path)
        if os.path.isfile(path):
            files.append(path)
        elif os.path.isdir(path):
            found = []
            for root, dirs, names in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                found.extend(
                    os.path.join(root, n) for n in names
                    if not n.startswith(".") and n.lower().endswith(DATA_EXTENSIONS))
            if not found:
                raise FileNotFoundError(
                    f"data.paths: directory {path} holds no data file (looked for "
                    f"{', '.join(DATA_EXTENSIONS)})")
            files.extend(sorted(found, key=lambda f: os.path.relpath(f, path)))
        else:
            raise FileNotFoundError(f"data.paths: no such file or directory: {path}")
    return files


def split_text(text: str, doc_split: str) -> Iterator[str]:
    """Cuts plain text into documents.

    Every document is stripped of leading and trailing whitespace; empty documents are skipped.

    Args:
        text: the file contents with ``"\\n"`` line ends.
        doc_split: ``"wikitext"``, ``"blank_line"``, ``"line"`` or ``"file"`` (see ``DataConfig``).

    Yields:
        The documents, in file order.

    Raises:
        ValueError: unknown ``doc_split``.
    """
    if doc_split == "file":
        pieces = [text]
    elif doc_split == "line":
        pieces = text.split("\n")
    elif doc_split == "blank_line":
        pieces = re.split(r"\n[ \t\r\f\v]*\n", text)
    elif doc_split == "wikitext":
        pieces, current = [], []
        for line in text.splitlines(keepends=True):
            if WIKITEXT_TITLE.match(line.rstrip("\n")):
                pieces.append("".join(current))
                current = []
            current.append(line)
        pieces.append("".join(current))
    else:
        raise ValueError(f"unknown doc_split {doc_split!r}")
    for piece in pieces:
        piece = piece.strip()
        if piece:
            yield piece


def read_text(path: str, doc_split: str) -> Iterator[str]:
    """Yields the documents of one UTF-8 text file (universal newlines)."""
    with open(path, encoding="utf-8", newline=None) as f:
        text = f.read()
    yield from split_text(text, doc_split)


def read_jsonl(path: str, text_field: str = "text") -> Iterator[str]:
    """Yields ``record[text_field]`` for every record of a JSONL file (gzip if it ends in ``.gz``).

    Blank lines and records whose text is empty or whitespace-only are skipped; the text is
    otherwise kept as is.

    Raises:
        ValueError: a line is not valid JSON, is not an object, lacks ``text_field`` or has a
            non-string value there; the message names the file and line number.
    """
    opener = gzip.open if path.lower().endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: invalid JSON ({e})") from e
            if not isinstance(record, dict) or text_field not in record:
                raise ValueError(
                    f"{path}:{lineno}: record has no field {text_field!r} (data.text_field)")
            text = record[text_field]
            if not isinstance(text, str):
                raise ValueError(f"{path}:{lineno}: field {text_field!r} is "
                                 f"{type(text).__name__}, expected str")
            if text.strip():
                yield text


def read_documents(paths: Sequence[str], *, fmt: str = "auto", text_field: str = "text",
                   doc_split: str = "blank_line") -> Iterator[str]:
    """Yields every non-empty document of ``paths`` (files or directories), in a fixed order.

    Args:
        paths: files and/or directories (see ``list_files``).
        fmt: ``"auto"``, ``"text"`` or ``"jsonl"``.
        text_field: JSONL key holding the text.
        doc_split: how plain text is cut into documents (see ``split_text``).

    Yields:
        Documents as ``str``.

    Raises:
        FileNotFoundError: see ``list_files``.
        ValueError: malformed JSONL, or an unknown ``fmt``/``doc_split``.
    """
    for path in list_files(paths):
        kind = file_format(path, fmt)
        if kind == "jsonl":
            yield from read_jsonl(path, text_field)
        elif kind == "text":
            yield from read_text(path, doc_split)
        else:
            raise ValueError(f"unknown format {fmt!r}")
