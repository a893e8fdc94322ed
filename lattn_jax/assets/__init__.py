"""Data files shipped inside the ``lattn_jax`` package.

Layout (each folder has a ``LICENSE.md`` with origin, sha256 and license):

- ``corpus/wikitext-2-raw/{wiki.valid.raw,wiki.test.raw}``: WikiText-2 raw validation and test
  splits (CC BY-SA 3.0; CRLF line ends).
- ``corpus/tinyshakespeare/input.txt``: tiny shakespeare (public-domain text, MIT repository).
- ``tokenizers/llama2/tokenizer.model``: the LLaMA-2 SentencePiece model (Llama 2 Community
  License Agreement).

Example::

    from lattn_jax import assets
    path = assets.asset_path("tokenizers/llama2/tokenizer.model")
"""

import os

__all__ = ["ASSETS_DIR", "LLAMA2_TOKENIZER", "TINYSHAKESPEARE", "WIKITEXT2_DIR", "asset_path"]

ASSETS_DIR = os.path.dirname(os.path.abspath(__file__))

# Relative paths of the bundled files, for use with `asset_path`.
LLAMA2_TOKENIZER = "tokenizers/llama2/tokenizer.model"
WIKITEXT2_DIR = "corpus/wikitext-2-raw"
TINYSHAKESPEARE = "corpus/tinyshakespeare/input.txt"


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
