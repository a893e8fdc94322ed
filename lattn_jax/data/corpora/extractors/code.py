"""Extractors for source code: Python docstrings, and source files kept as they are.

- ``extract_python_docstrings``: a module's docstrings, parsed with ``ast``, as one document;
- ``extract_source_code``: any source file, indentation kept, unless it is binary, too large or
  looks generated/minified.

Both keep the contract of ``common``.
"""

import ast
import inspect
from collections.abc import Iterator

from lattn_jax.data.corpora.extractors.common import Document
from lattn_jax.data.corpora.extractors.common import ExtractError
from lattn_jax.data.corpora.extractors.common import normalize_text
from lattn_jax.data.corpora.extractors.common import read_bytes

__all__ = ["extract_python_docstrings", "extract_source_code", "looks_generated"]

_MIN_DOCSTRING_WORDS = 3
_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _docstring(node: ast.AST) -> str:
    """The cleaned docstring of ``node``, ``""`` if absent or trivial (fewer than 3 words)."""
    text = ast.get_docstring(node, clean=False)
    if not text:
        return ""
    text = inspect.cleandoc(text)
    return text if len(text.split()) >= _MIN_DOCSTRING_WORDS else ""


def _walk(body: list[ast.stmt], prefix: str, out: list[str]) -> None:
    """Append ``heading\\ndocstring`` for each definition of ``body``, depth first in source
    order (nested definitions inside functions and classes included)."""
    for node in body:
        if isinstance(node, _DEFINITIONS):
            name = f"{prefix}{node.name}"
            doc = _docstring(node)
            if doc:
                out.append(f"{name}\n\n{doc}")
            _walk(node.body, f"{name}.", out)
        elif isinstance(node, (ast.If, ast.Try, ast.With, ast.AsyncWith, ast.For, ast.While)):
            # Definitions under ``if TYPE_CHECKING:``, ``try: ... except ImportError:`` and the
            # like keep the enclosing scope's prefix.
            for field in ("body", "orelse", "finalbody"):
                _walk(getattr(node, field, []), prefix, out)
            for handler in getattr(node, "handlers", []):
                _walk(handler.body, prefix, out)


def extract_python_docstrings(path: str) -> Iterator[Document]:
    """The docstrings of a Python module, as one document (name ``""``).

    The module's docstring comes first, then, for each class and function (methods and nested
    definitions included, depth first in source order), a heading line with its dotted name
    inside the module (``Class.method``, ``outer.inner``) followed by a blank line and its
    docstring (``inspect.cleandoc``-ed). Docstrings of fewer than 3 words are skipped (as are
    definitions without one; their nested definitions are still visited). Inner indentation of
    docstrings is not kept (``normalize_text``).

    Files that do not parse (Python 2 modules, templates such as ``*.py_tpl``, files with a
    syntax error) yield nothing, without an error: packages ship such files routinely, and an
    empty result lets the builder count them as skipped rather than as failures.

    Raises:
        ExtractError: the file holds NUL bytes (not a Python source file).
    """
    data = read_bytes(path)
    if b"\x00" in data:
        raise ExtractError(f"{path}: binary file (NUL bytes), not Python source")
    try:
        tree = ast.parse(data, filename=path)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return
    parts = []
    module_doc = _docstring(tree)
    if module_doc:
        parts.append(module_doc)
    _walk(tree.body, "", parts)
    text = normalize_text("\n\n".join(parts))
    if text:
        yield Document("", text)


_MAX_MEAN_LINE = 200
_MAX_LINE = 2000


def looks_generated(text: str) -> bool:
    """Whether ``text`` looks generated or minified: mean line length over 200 characters or a
    line over 2000 characters."""
    lines = text.split("\n")
    if any(len(line) > _MAX_LINE for line in lines):
        return True
    return len(text) / max(len(lines), 1) > _MAX_MEAN_LINE


def extract_source_code(path: str, *, max_bytes: int = 1_000_000) -> Iterator[Document]:
    """A source file (any language) as one document (name ``""``), indentation kept.

    The text is decoded as UTF-8 (invalid bytes dropped) and normalised with
    ``normalize_text(text, keep_indent=True)``: tabs and leading white space kept, trailing white
    space and runs of blank lines reduced.

    Skipped (nothing yielded, no error: the builder counts them): files over ``max_bytes``
    (after decompression of ``.gz``/``.bz2``/``.xz``), binary files (a NUL byte) and files that
    look generated or minified (``looks_generated``).

    Raises:
        ExtractError: ``max_bytes`` < 1.
    """
    if max_bytes < 1:
        raise ExtractError(f"{path}: max_bytes must be >= 1, not {max_bytes}")
    data = read_bytes(path)
    if len(data) > max_bytes or b"\x00" in data:
        return
    text = data.decode("utf-8", errors="replace")
    if looks_generated(text):
        return
    text = normalize_text(text, keep_indent=True)
    if text:
        yield Document("", text)
