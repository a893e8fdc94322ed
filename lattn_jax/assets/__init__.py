"""Data files shipped inside the ``lattn_jax`` package.

Layout (each folder has a ``LICENSE.md`` with origin, sha256 and license):

- ``corpus/wikitext-2-raw/{wiki.valid.raw,wiki.test.raw}``: WikiText-2 raw validation and test
  splits (CC BY-SA 3.0; CRLF line ends).
- ``corpus/tinyshakespeare/input.txt``: tiny shakespeare (public-domain text, MIT repository).
- ``tokenizers/llama2/tokenizer.model``: the LLaMA-2 SentencePiece model (Llama 2 Community
  License Agreement).
- ``topics/vital_articles_l4_en.txt``: titles of the English Wikipedia's Level-4 Vital Articles
  without WikiText-2's test articles, one per line (the topics of teacher-generated text,
  ``experiments/generate_corpus.py``).

Example::

    from lattn_jax import assets
    path = assets.asset_path("tokenizers/llama2/tokenizer.model")

Configs refer to bundled files by name, ``"bundled:<relative path>"`` (:data:`BUNDLED`), and
:func:`resolve` turns a name into the file of the package that runs; a run directory's
``config.json`` stores names (:func:`portable`), so that it does not depend on where the clone
lives.
"""

import os
import re
from typing import Optional

__all__ = ["ASSETS_DIR", "BUNDLED", "LLAMA2_TOKENIZER", "TINYSHAKESPEARE", "VITAL_TOPICS",
           "WIKITEXT2_DIR", "asset_path", "bundled_name", "portable", "resolve"]

ASSETS_DIR = os.path.dirname(os.path.abspath(__file__))

# Relative paths of the bundled files, for use with `asset_path`.
LLAMA2_TOKENIZER = "tokenizers/llama2/tokenizer.model"
WIKITEXT2_DIR = "corpus/wikitext-2-raw"
TINYSHAKESPEARE = "corpus/tinyshakespeare/input.txt"
VITAL_TOPICS = "topics/vital_articles_l4_en.txt"


def asset_path(relative: str) -> str:
    """Returns the absolute path of a bundled asset.

    Args:
        relative: path below ``lattn_jax/assets``, with ``/`` separators, e.g.
            ``"corpus/wikitext-2-raw/wiki.valid.raw"``. Files and directories are both accepted.

    Returns:
        The absolute path inside the installed package.

    Raises:
        ValueError: if ``relative`` is absolute or leaves the assets directory (``..``).
        FileNotFoundError: if nothing exists at that path; the message names the full path.
    """
    if os.path.isabs(relative):
        raise ValueError(f"asset_path expects a path relative to {ASSETS_DIR}, got {relative!r}")
    path = os.path.normpath(os.path.join(ASSETS_DIR, *relative.split("/")))
    if os.path.commonpath([path, ASSETS_DIR]) != ASSETS_DIR:
        raise ValueError(f"asset path {relative!r} leaves the assets directory {ASSETS_DIR}")
    if not os.path.exists(path):
        raise FileNotFoundError(f"bundled asset not found: {path} (asset_path({relative!r}))")
    return path


BUNDLED = "bundled:"
# An absolute path into some clone's (or installation's) assets directory.
_ASSETS_PATH = re.compile(r"^.*[/\\]lattn_jax[/\\]assets[/\\](?P<rel>.+)$")


def bundled_name(path) -> Optional[str]:
    """The bundled name (``"bundled:<relative>"``) that ``path`` stands for, or ``None``.

    ``path`` is a name already, or a path into this package's assets directory, or (written by
    an older version, in a clone that has since moved) a path ending in
    ``lattn_jax/assets/<relative>`` whose ``<relative>`` is bundled here.
    """
    path = os.fspath(path)
    if path.startswith(BUNDLED):
        return path
    if os.path.isabs(path):
        real = os.path.realpath(path)
        if os.path.commonpath([real, os.path.realpath(ASSETS_DIR)]) == os.path.realpath(
                ASSETS_DIR):
            rel = os.path.relpath(real, os.path.realpath(ASSETS_DIR))
            return BUNDLED + rel.replace(os.sep, "/")
    match = _ASSETS_PATH.match(path)
    if match and os.path.exists(os.path.join(ASSETS_DIR, *re.split(r"[/\\]", match["rel"]))):
        return BUNDLED + match["rel"].replace("\\", "/")
    return None


def resolve(path) -> str:
    """A config's path as a file to open: ``"bundled:<relative>"`` becomes
    :func:`asset_path` of it; a missing path into another clone's ``lattn_jax/assets`` becomes
    the same file of this package; anything else is returned as given.

    Raises:
        FileNotFoundError: a bundled name that this package does not hold.
    """
    path = os.fspath(path)
    if path.startswith(BUNDLED):
        return asset_path(path[len(BUNDLED):])
    if not os.path.exists(path):
        name = bundled_name(path)
        if name is not None:
            return asset_path(name[len(BUNDLED):])
    return path


def portable(path):
    """``path`` as stored in a run directory: the bundled name of a bundled file, else as
    given (``None`` stays ``None``)."""
    if path is None:
        return None
    return bundled_name(path) or os.fspath(path)
