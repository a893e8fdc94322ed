"""Extractors: one per file format of the corpus sources, each turning a file into documents.

``get_extractor(name)`` returns the function registered under ``name`` (see ``common`` for the
contract every extractor keeps). Formats:

- ``html`` (``markup``): an HTML page (Sphinx, javadoc, rustdoc, DocBook, Texinfo), one document
  per page;
- ``man`` (``markup``): a roff man page (``.1``..``.9``, optionally ``.gz``), one per page;
- ``pod`` (``markup``): Perl POD, one per file;
- ``info`` (``markup``): a GNU Info file (optionally ``.gz``), one per file;
- ``rst`` (``markup``): reStructuredText, one per file;
- ``plain`` (``markup``): plain text, one per file (or per group of blank-line blocks);
- ``dictd`` (``reference``): a dictd database (``.index`` + ``.dict[.dz]``), one per headword;
- ``wordnet`` (``reference``): a WordNet 3.0 ``data.<pos>`` file, groups of synset glosses;
- ``fortune`` (``reference``): a fortune(6) file, one per file;
- ``sword`` (``reference``): a SWORD module (its ``mods.d/*.conf``), one per book or entry;
- ``brown`` (``reference``): a Brown-corpus ``word/tag`` file, one per file;
- ``json_text`` (``reference``): a JSON file with the text in named fields, one per object;
- ``python_docstrings`` (``code``): a Python module's docstrings, one document per module;
- ``source_code`` (``code``): a source file with its indentation, one per file.
"""

import importlib

from lattn_jax.data.corpora.extractors.common import Document
from lattn_jax.data.corpora.extractors.common import ExtractError
from lattn_jax.data.corpora.extractors.common import Extractor
from lattn_jax.data.corpora.extractors.common import normalize_text

__all__ = ["Document", "EXTRACTORS", "ExtractError", "Extractor", "get_extractor",
           "normalize_text"]

# name -> "module:function" under lattn_jax.data.corpora.extractors (imported on first use).
EXTRACTORS = {
    "html": "markup:extract_html",
    "man": "markup:extract_man",
    "pod": "markup:extract_pod",
    "info": "markup:extract_info",
    "rst": "markup:extract_rst",
    "plain": "markup:extract_plain",
    "dictd": "reference:extract_dictd",
    "wordnet": "reference:extract_wordnet",
    "fortune": "reference:extract_fortune",
    "sword": "reference:extract_sword",
    "brown": "reference:extract_brown",
    "json_text": "reference:extract_json_text",
    "python_docstrings": "code:extract_python_docstrings",
    "source_code": "code:extract_source_code",
}


def get_extractor(name: str) -> Extractor:
    """The extractor registered as ``name``.

    Raises:
        ValueError: no extractor has that name (the known names are listed).
    """
    if name not in EXTRACTORS:
        raise ValueError(f"unknown extractor {name!r}; known: {', '.join(sorted(EXTRACTORS))}")
    module, function = EXTRACTORS[name].split(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), function)
