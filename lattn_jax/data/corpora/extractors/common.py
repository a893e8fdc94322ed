"""What every extractor shares: the document type, compressed-file reading and text normalisation.

An extractor turns one file of a package (an HTML page, a dictd database, a man page, a SWORD
module's ``.conf``) into documents. Its contract (``Extractor``):

- ``extract(path, **options)`` yields ``Document(name, text)`` in a deterministic order
  (the same file gives the same documents, byte for byte, on every run and machine);
- ``name`` identifies the document inside the file (``""`` when the file is one document; an
  entry's headword, a book's name otherwise); the builder prefixes it with the source and file;
- ``text`` is ``normalize_text``-ed: paragraphs separated by exactly one blank line, lines of a
  paragraph by ``"\\n"``, no trailing spaces, no control characters; empty documents are not
  yielded;
- a file it cannot parse raises ``ExtractError`` (a ``ValueError``) naming the file and what is
  wrong; the builder adds the source's name.
"""

import bz2
import gzip
import lzma
import re
import unicodedata
from collections.abc import Callable, Iterator
from typing import NamedTuple, Protocol

__all__ = [
    "Document",
    "ExtractError",
    "Extractor",
    "normalize_text",
    "read_bytes",
    "read_text",
]


class Document(NamedTuple):
    """One extracted document.

    Attributes:
        name: the document's name inside its file (``""`` for a whole-file document).
        text: normalised text (see ``normalize_text``), never empty.
    """

    name: str
    text: str


class ExtractError(ValueError):
    """A file that its extractor cannot parse; the message names the file."""


class Extractor(Protocol):
    """``extract(path, **options) -> Iterator[Document]``; see the module docstring."""

    def __call__(self, path: str, **options) -> Iterator[Document]:
        ...


_OPENERS: dict[str, Callable] = {".gz": gzip.open, ".dz": gzip.open, ".bz2": bz2.open,
                                 ".xz": lzma.open, ".lzma": lzma.open}


def read_bytes(path: str) -> bytes:
    """The bytes of ``path``, decompressed when it ends in ``.gz``/``.dz``/``.bz2``/``.xz``.

    dictzip (``.dz``) files are gzip members, read here as plain gzip.

    Raises:
        ExtractError: the file is corrupt (the compressed stream does not decode).
        OSError: the file cannot be read.
    """
    for suffix, opener in _OPENERS.items():
        if path.endswith(suffix):
            try:
                with opener(path, "rb") as f:
                    return f.read()
            except (OSError, EOFError, lzma.LZMAError) as e:
                if isinstance(e, FileNotFoundError):
                    raise
                raise ExtractError(f"{path}: corrupt {suffix} stream: {e}") from e
    with open(path, "rb") as f:
        return f.read()


def read_text(path: str, encoding: str = "utf-8") -> str:
    """The text of ``path`` (decompressed as in ``read_bytes``).

    Bytes that are not valid ``encoding`` are replaced by U+FFFD (``normalize_text`` drops them),
    so a stray Latin-1 byte in a UTF-8 page costs one character, not the page.
    """
    return read_bytes(path).decode(encoding, errors="replace")


_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ufffd\u200b\ufeff]")
_SPACES = re.compile(r"[ \t\u00a0\u2000-\u200a\u202f\u205f\u3000]+")
_BLANKS = re.compile(r"\n{3,}")


def normalize_text(text: str, *, keep_indent: bool = False) -> str:
    """Canonical form of extracted text: the form every extractor returns.

    Steps: Unicode NFC; ``\\r\\n`` and ``\\r`` to ``\\n``; form feeds to blank lines; control
    characters, zero-width spaces, BOMs and U+FFFD removed; runs of spaces/tabs (and other
    horizontal spaces) to one space and each line stripped (with ``keep_indent``, for source code
    and preformatted text, only trailing white space is stripped and tabs are kept); runs of
    blank lines to one blank line; leading/trailing blank lines removed.

    Args:
        text: any string.
        keep_indent: keep each line's leading white space and inner runs of spaces.

    Returns:
        The normalised string (``""`` if nothing printable is left).
    """
    text = unicodedata.normalize("NFC", text)
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\f", "\n\n")
    text = _CONTROL.sub("", text)
    if keep_indent:
        lines = [line.rstrip() for line in text.split("\n")]
    else:
        lines = [_SPACES.sub(" ", line).strip() for line in text.split("\n")]
    return _BLANKS.sub("\n\n", "\n".join(lines)).strip("\n")
