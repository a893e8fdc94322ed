"""Filters, deduplication and the contamination check of the corpus builder.

Everything here is deterministic: the same documents in the same order give the same decisions.

- Paragraph filters (prose only): a paragraph whose non-space characters are less than half
  letters (tables of numbers, symbol soup, most code listings) is dropped.
- Paragraph deduplication (prose only): a paragraph of at least ``min_chars`` characters seen
  before, anywhere in the corpus (exact match after normalisation), is dropped: the repeated
  boilerplate of generated documentation (javadoc's "Methods inherited from class
  java.lang.Object", Sphinx footers, license blurbs). Shorter paragraphs (headings, labels) stay,
  except runs of three or more short paragraphs that each recur on at least half of one
  source's documents (its navigation menus).
- Document quality (Gopher rules, Rae et al. 2021, appendix A.1.1, adapted to technical text):
  at least ``min_words`` words and at most 20M (whole books stay whole); mean word length in
  [2.5, 12]; at least 60% of words with a letter; at most 10% of words ``#``/``...``-like
  symbols; English: at least 5% of words among a list of common English function words
  (German, French and the other languages of multilingual manuals score under 1%). Code is
  checked only for size.
- Exact document deduplication: sha256 of the normalised text.
- Near-duplicate documents: MinHash over 5-word shingles with LSH (``datasketch``); a document
  whose estimated Jaccard similarity with an earlier kept one reaches the threshold is dropped.
- Contamination: every word ``n``-gram (GPT-3's n = 13; lower-cased letters and digits) of
  every evaluation item; items shorter than ``n`` words but at least 8 words contribute their
  8-grams. A training paragraph that shares one is dropped and counted per evaluation set.
"""

import collections
import hashlib
import re
from collections.abc import Iterable, Sequence

import numpy as np

__all__ = [
    "ContaminationIndex",
    "NearDuplicateIndex",
    "ParagraphDeduper",
    "doc_fraction",
    "document_quality",
    "drop_menus",
    "english_fraction",
    "frequent_short_paragraphs",
    "keep_paragraph",
    "length_histogram",
    "paragraphs",
    "stable_hash",
    "word_ngrams",
]

_WORD = re.compile(r"[a-z0-9]+")
_LETTER = re.compile(r"[^\W\d_]")
_SYMBOL_WORD = re.compile(r"^(#+|\.\.\.|…)$")
# Frequent English function words, without those that are also common words of German, Dutch,
# Italian, French or Spanish ("in", "an", "is", "was", "will", "also", "all").
_ENGLISH = frozenset(
    "the of and to that it for as with on be by this are or from at which not have has but "
    "were if can would their there been they its when one more you your we our these those "
    "into than then only such may should what".split())


def stable_hash(text: str) -> int:
    """A 64-bit hash of ``text`` that is the same in every process and on every machine."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


def paragraphs(text: str) -> list[str]:
    """``text``'s paragraphs (blocks separated by blank lines), non-empty."""
    return [p for p in text.split("\n\n") if p.strip()]


def keep_paragraph(paragraph: str) -> bool:
    """Whether a prose paragraph passes the letter-fraction filter (>= 50% of non-space chars)."""
    chars = len(paragraph) - paragraph.count(" ") - paragraph.count("\n")
    if chars <= 0:
        return False
    return len(_LETTER.findall(paragraph)) >= 0.5 * chars


def english_fraction(words: Sequence[str]) -> float:
    """Fraction of ``words`` (any case) that are frequent English function words."""
    if not words:
        return 0.0
    return sum(w.lower() in _ENGLISH for w in words) / len(words)


def document_quality(text: str, kind: str, min_words: int) -> str | None:
    """Why a document fails the quality rules, or ``None`` if it passes.

    Args:
        text: the normalised document.
        kind: the source's kind (``"general"``, ``"technical"``, ``"code"``).
        min_words: minimum number of white-space separated words.

    Returns:
        ``None``, or a short reason (``"too_short"``, ``"too_long"``, ``"word_length"``,
        ``"few_letters"``, ``"symbols"``, ``"not_english"``) used as a counter name.
    """
    words = text.split()
    if len(words) < min_words:
        return "too_short"
    if len(words) > 20_000_000:
        return "too_long"
    if kind == "code":
        return None
    mean_len = sum(map(len, words)) / len(words)
    if not 2.5 <= mean_len <= 12:
        return "word_length"
    if sum(bool(_LETTER.search(w)) for w in words) < 0.6 * len(words):
        return "few_letters"
    if sum(bool(_SYMBOL_WORD.match(w)) for w in words) > 0.1 * len(words):
        return "symbols"
    if english_fraction(words) < 0.05:
        return "not_english"
    return None


class ParagraphDeduper:
    """Keeps the first occurrence of every paragraph of at least ``min_chars`` characters.

    Args:
        min_chars: shorter paragraphs are never dropped.
    """

    def __init__(self, min_chars: int = 40):
        self.min_chars = min_chars
        self._seen: set[int] = set()

    def keep(self, paragraph: str) -> bool:
        """Whether ``paragraph`` is new (and remembers it)."""
        if len(paragraph) < self.min_chars:
            return True
        h = stable_hash(paragraph)
        if h in self._seen:
            return False
        self._seen.add(h)
        return True


def frequent_short_paragraphs(texts: Iterable[str], *, max_chars: int = 40,
                              min_count: int = 20, min_doc_share: float = 0.5) -> set[str]:
    """Short paragraphs that recur on most documents of one source: navigation boilerplate.

    Generated documentation repeats its short menu lines on every page ("Language", "Containers
    library", "Class List by Category"); ``ParagraphDeduper`` keeps short paragraphs (headings),
    so these are found per source instead: a paragraph of fewer than ``max_chars`` characters
    that occurs in at least ``min_doc_share`` of the source's documents, and at least ``min_count``
    times.

    Args:
        texts: the source's documents.
        max_chars: only paragraphs shorter than this are considered.
        min_count: minimum number of documents it occurs in.
        min_doc_share: minimum fraction of the source's documents it occurs in.

    Returns:
        The set of such paragraphs (exact strings).
    """
    doc_count: collections.Counter = collections.Counter()
    documents = 0
    for text in texts:
        documents += 1
        doc_count.update({p for p in paragraphs(text) if len(p) < max_chars})
    limit = max(min_count, min_doc_share * documents)
    return {p for p, c in doc_count.items() if c >= limit}


def drop_menus(paras: Sequence[str], frequent: set[str], min_run: int = 3) -> list[str]:
    """``paras`` without the runs of at least ``min_run`` consecutive ``frequent`` paragraphs.

    A menu is several frequent short lines in a row; a frequent heading ("DESCRIPTION",
    "Parameters:") stands alone between content paragraphs and is kept.
    """
    out, run = [], []
    for p in list(paras) + [None]:
        if p is not None and p in frequent:
            run.append(p)
            continue
        if len(run) < min_run:
            out += run
        run = []
        if p is not None:
            out.append(p)
    return out


def word_ngrams(words: Sequence[str], n: int) -> Iterable[tuple[str, ...]]:
    """The ``n``-grams of ``words`` as tuples (none if fewer than ``n`` words)."""
    return zip(*(words[i:] for i in range(n)))


class NearDuplicateIndex:
    """MinHash-LSH index of kept documents (``datasketch.MinHashLSH``).

    Args:
        threshold: Jaccard similarity at which a document counts as a near-duplicate.
        num_perm: MinHash permutations (fixed seed 1: the same signatures in every run).
        shingle: words per shingle.
    """

    def __init__(self, threshold: float = 0.8, num_perm: int = 128, shingle: int = 5):
        import datasketch  # the [corpus] extra
        self._datasketch = datasketch
        self.num_perm = num_perm
        self.shingle = shingle
        self._lsh = datasketch.MinHashLSH(threshold=threshold, num_perm=num_perm)
        self._count = 0

    def signature(self, text: str):
        """The document's MinHash (over lower-cased word shingles)."""
        words = text.lower().split()
        grams = {" ".join(g).encode("utf-8") for g in word_ngrams(words, self.shingle)}
        if not grams:
            grams = {" ".join(words).encode("utf-8")}
        m = self._datasketch.MinHash(num_perm=self.num_perm, seed=1)
        m.update_batch(sorted(grams))
        return m

    def add_if_new(self, text: str) -> bool:
        """Whether ``text`` has no near-duplicate among the kept documents; if so it is kept."""
        m = self.signature(text)
        if self._lsh.query(m):
            return False
        self._lsh.insert(str(self._count), m)
        self._count += 1
        return True


class ContaminationIndex:
    """Word n-grams of evaluation items, and the check of training paragraphs against them.

    Args:
        items: ``(set name, item text)`` pairs of every evaluation item.
        n: n-gram size for items of at least ``n`` words.
        short_n: n-gram size for items of ``short_n`` to ``n - 1`` words (shorter items are not
            checkable and are counted in ``uncheckable``).
    """

    def __init__(self, items: Iterable[tuple[str, str]], n: int = 13, short_n: int = 8):
        self.n, self.short_n = n, short_n
        self._long: dict[tuple[str, ...], int] = {}
        self._short: dict[tuple[str, ...], int] = {}
        self.sets: list[str] = []
        self.items_per_set: collections.Counter = collections.Counter()
        self.uncheckable: collections.Counter = collections.Counter()
        self._item_set: list[int] = []
        for set_name, text in items:
            if set_name not in self.sets:
                self.sets.append(set_name)
            words = _WORD.findall(text.lower())
            self.items_per_set[set_name] += 1
            item = len(self._item_set)
            self._item_set.append(self.sets.index(set_name))
            if len(words) >= n:
                for g in word_ngrams(words, n):
                    self._long.setdefault(g, item)
            elif len(words) >= short_n:
                for g in word_ngrams(words, short_n):
                    self._short.setdefault(g, item)
            else:
                self.uncheckable[set_name] += 1
        self.hits: collections.Counter = collections.Counter()  # paragraphs dropped, per set
        self.items_hit: set[int] = set()

    def __len__(self) -> int:
        return len(self._long) + len(self._short)

    def contaminated(self, paragraph: str) -> bool:
        """Whether ``paragraph`` shares an n-gram with an evaluation item (then counted)."""
        words = _WORD.findall(paragraph.lower())
        found = None
        if len(words) >= self.n and not self._long.keys().isdisjoint(word_ngrams(words, self.n)):
            found = next(self._long[g] for g in word_ngrams(words, self.n) if g in self._long)
        elif (self._short and len(words) >= self.short_n
              and not self._short.keys().isdisjoint(word_ngrams(words, self.short_n))):
            found = next(self._short[g] for g in word_ngrams(words, self.short_n)
                         if g in self._short)
        if found is None:
            return False
        self.hits[self.sets[self._item_set[found]]] += 1
        self.items_hit.add(found)
        return True

    def report(self) -> dict:
        """Per evaluation set: items, uncheckable items, items met in training text, paragraphs
        dropped."""
        met = collections.Counter(self.sets[self._item_set[i]] for i in self.items_hit)
        return {name: {"items": self.items_per_set[name],
                       "uncheckable_items": self.uncheckable[name],
                       "items_found_in_training_text": met[name],
                       "training_paragraphs_dropped": self.hits[name]}
                for name in self.sets}


def doc_fraction(doc_id: str) -> float:
    """A number in [0, 1) fixed by ``doc_id``: picks validation documents and mixture subsets."""
    return stable_hash(doc_id) / float(1 << 64)


def length_histogram(lengths: np.ndarray) -> dict:
    """Document-length distribution (tokens): quantiles and the tokens in long documents."""
    lengths = np.sort(np.asarray(lengths, np.int64))
    if lengths.size == 0:
        return {}
    total = int(lengths.sum())
    out = {"documents": int(lengths.size), "tokens": total,
           "quantiles": {f"p{q}": int(np.percentile(lengths, q)) for q in (10, 50, 90, 99)},
           "max": int(lengths[-1])}
    for limit in (2048, 4096, 8192, 16384, 32768):
        long = lengths[lengths > limit]
        out[f"docs_over_{limit}"] = int(long.size)
        out[f"tokens_in_docs_over_{limit}"] = int(long.sum())
        out[f"token_share_in_docs_over_{limit}"] = round(float(long.sum()) / max(total, 1), 4)
    return out
