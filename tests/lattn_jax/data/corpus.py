"""Small real corpora for the data tests, cut from ``../shared/data/lm`` (or the bundled copies).

The shared folder sits next to the repository on development machines and in CI; when it is
absent the same texts bundled in ``lattn_jax/assets`` are used.
"""

import os

from lattn_jax import assets

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
SHARED_LM = os.path.join(os.path.dirname(ROOT), "shared", "data", "lm")
SHARED_TOKENIZERS = os.path.join(os.path.dirname(ROOT), "shared", "data", "tokenizers")


def lm_file(name: str) -> str:
    """``tinyshakespeare/input.txt`` or ``wikitext-2-raw/wiki.valid.raw`` (shared or bundled)."""
    shared = os.path.join(SHARED_LM, name)
    if os.path.isfile(shared):
        return shared
    return assets.asset_path("corpus/" + name)


def shakespeare_paragraphs(count: int, start: int = 0) -> list[str]:
    """``count`` non-empty speeches of tiny Shakespeare (blank-line separated), from ``start``."""
    with open(lm_file("tinyshakespeare/input.txt"), encoding="utf-8") as f:
        text = f.read()
    paragraphs = [p.strip() for p in text.split("\n\n") if p.strip()]
    return paragraphs[start:start + count]


def wikitext_lines(count: int) -> list[str]:
    """The first ``count`` non-empty, non-heading lines of WikiText-2 validation."""
    with open(lm_file("wikitext-2-raw/wiki.valid.raw"), encoding="utf-8") as f:
        lines = [line.strip() for line in f]
    return [line for line in lines if line and not line.startswith("=")][:count]
