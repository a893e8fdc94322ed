"""Tests of the corpus filters, deduplication and contamination check on hand-made cases."""

import numpy as np
import pytest

from lattn_jax.data.corpora import clean

ENGLISH = ("The committee met on Tuesday to discuss the budget, and it was decided that the "
           "new library would be built with the money that had been saved over the last two "
           "years by the town and its citizens. ")


def test_keep_paragraph_letter_fraction():
    assert clean.keep_paragraph("A sentence of ordinary words, with punctuation.")
    assert not clean.keep_paragraph("| 1.0 | 2.5 | 3.75 | 4.0 | 10 | 12 |")
    assert not clean.keep_paragraph("{}[]()<>;;;;;==++--")
    assert not clean.keep_paragraph("   ")


@pytest.mark.parametrize("text,kind,reason", [
    ("too few words here", "general", "too_short"),
    (ENGLISH * 3, "general", None),
    (ENGLISH * 3, "technical", None),
    ("Der Ausschuss hat am Dienstag den Haushalt besprochen und beschlossen, dass die neue "
     "Bibliothek mit dem Geld gebaut wird, das die Stadt und ihre Bürger in den letzten zwei "
     "Jahren gespart haben. " * 3, "general", "not_english"),
    ("2019 2020 3.14 1.618 1024 the data 4096 8192 65536 " * 8, "general", "few_letters"),
    ("the quick ### brown fox of and ... over the " * 8, "general", "symbols"),
    ("x " * 80, "general", "word_length"),
    ("x = 1\ny = 2\n" * 30, "code", None),
])
def test_document_quality(text, kind, reason):
    assert clean.document_quality(text, kind, min_words=50) == reason


def test_english_fraction_counts_function_words():
    assert clean.english_fraction("the cat and the dog".split()) == pytest.approx(3 / 5)
    assert clean.english_fraction([]) == 0.0


def test_paragraph_deduper_keeps_first_long_paragraph_only():
    dedup = clean.ParagraphDeduper(min_chars=20)
    long = "Methods inherited from class java.lang.Object"
    assert dedup.keep(long)
    assert not dedup.keep(long)
    assert dedup.keep(long + ".")  # a different paragraph
    assert dedup.keep("Parameters") and dedup.keep("Parameters")  # short: always kept


def test_near_duplicate_index():
    index = clean.NearDuplicateIndex(threshold=0.8, num_perm=128)
    words = (ENGLISH * 4).split()
    base = " ".join(f"{w}{i}" for i, w in enumerate(words))
    assert index.add_if_new(base)
    # One word of ~150 changed: Jaccard of 5-shingles ~0.97, a near-duplicate.
    changed = base.replace(f"{words[40]}40", "changed")
    assert not index.add_if_new(changed)
    other = " ".join(f"{w}{i + 1000}" for i, w in enumerate(words))
    assert index.add_if_new(other)


def test_stable_hash_and_doc_fraction_are_fixed():
    assert clean.stable_hash("abc") == clean.stable_hash("abc") != clean.stable_hash("abd")
    # Values pinned: a change of hash would silently move documents between splits.
    assert clean.stable_hash("abc") == 6455300059550759896
    fractions = np.array([clean.doc_fraction(f"doc{i}") for i in range(4000)])
    assert 0.0 <= fractions.min() and fractions.max() < 1.0
    assert abs(fractions.mean() - 0.5) < 0.02


def test_contamination_index_finds_long_and_short_items():
    item = ("the quick brown fox jumps over the lazy dog while the farmer sleeps under the old "
            "oak tree")
    short = "which tool is best for cutting thin wooden dowels"  # 9 words: 8-grams
    tiny = "hammer or saw"  # 3 words: uncheckable
    index = clean.ContaminationIndex([("setA", item), ("setB", short), ("setB", tiny)], n=13)
    assert index.uncheckable["setB"] == 1
    assert not index.contaminated("A paragraph about something else entirely, with no overlap "
                                  "with any of the evaluation items at all in any way.")
    assert index.contaminated("He said: The QUICK brown fox jumps over the lazy dog, while the "
                              "farmer sleeps under the old oak tree! And more.")
    assert index.contaminated("Asked which tool is best for cutting thin wooden dowels, he "
                              "laughed.")
    report = index.report()
    assert report["setA"]["items_found_in_training_text"] == 1
    assert report["setB"]["training_paragraphs_dropped"] == 1
    assert report["setB"]["uncheckable_items"] == 1


def test_length_histogram():
    lengths = np.array([100] * 9 + [20000])
    hist = clean.length_histogram(lengths)
    assert hist["documents"] == 10 and hist["tokens"] == 20900
    assert hist["docs_over_16384"] == 1
    assert hist["tokens_in_docs_over_8192"] == 20000
    assert hist["token_share_in_docs_over_8192"] == pytest.approx(20000 / 20900, abs=1e-4)


def test_frequent_short_paragraphs_are_navigation_not_headings():
    pages = [f"Language\n\nContainers library\n\nParameters\n\nPage {i} says something."
             if i % 3 == 0 else f"Language\n\nContainers library\n\nPage {i} text."
             for i in range(60)]
    found = clean.frequent_short_paragraphs(pages, min_count=20, min_doc_share=0.5)
    assert found == {"Language", "Containers library"}  # "Parameters" is on a third of them
    assert clean.frequent_short_paragraphs(pages[:10], min_count=20) == set()  # too few pages


def test_drop_menus_keeps_lone_headings():
    frequent = {"Language", "Containers library", "Algorithms library", "NAME"}
    paras = ["Language", "Containers library", "Algorithms library", "NAME", "ls - list",
             "NAME", "text", "Language", "Containers library", "more"]
    # The first run of four goes; the lone NAME heading and the run of two stay.
    assert clean.drop_menus(paras, frequent) == [
        "ls - list", "NAME", "text", "Language", "Containers library", "more"]
