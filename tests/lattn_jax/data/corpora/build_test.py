"""End-to-end tests of the corpus builder on small local packages: determinism, manifests,
resume after a failure, and training-pipeline use of the result."""

import builtins
import dataclasses
import errno
import os
import io
import json
import tarfile
import zipfile

import numpy as np
import pytest

from lattn_jax.data import config as data_config
from lattn_jax.data import pipeline
from lattn_jax.data import shards
from lattn_jax.data.corpora import build
from lattn_jax.data.corpora import fetch
from lattn_jax.data.corpora import recipe as recipe_lib

_WORDS = ("the river ran past the mill and the miller watched it with his daughter while the "
          "town slept under a grey sky that promised rain before the evening bell").split()


def _prose(seed: int, paragraphs: int = 6) -> str:
    rng = np.random.default_rng(seed)
    return "\n\n".join(" ".join(rng.choice(_WORDS, 60)) + "." for _ in range(paragraphs))


def _tgz(path: str, files: dict[str, str]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, text in sorted(files.items()):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            tar.addfile(info, io.BytesIO(data))


def _whl(path: str, files: dict[str, str]) -> None:
    with zipfile.ZipFile(path, "w") as z:
        for name, text in sorted(files.items()):
            z.writestr(zipfile.ZipInfo(name, (1980, 1, 1, 0, 0, 0)), text)


def _package(path: str, name: str) -> recipe_lib.Package:
    return recipe_lib.Package("local", name, "1.0", fetch.sha256_file(path), "CC0-1.0", path)


@pytest.fixture
def packages(tmp_path):
    books = str(tmp_path / "books.tgz")
    texts = {f"texts/book{i}.txt": _prose(i) for i in range(12)}
    texts["texts/copy.txt"] = texts["texts/book0.txt"]  # exact duplicate
    texts["texts/german.txt"] = ("Der Fluss lief an der Mühle vorbei und der Müller sah ihm "
                                 "mit seiner Tochter zu, während die Stadt schlief. ") * 10
    _tgz(books, texts)
    wheel = str(tmp_path / "lib.whl")
    modules = {f"lib/m{i}.py": '"""' + _prose(100 + i, 2) + '"""\n\n\ndef f(x):\n    """'
               + _prose(200 + i, 1) + f'"""\n    return x + {i}\n' for i in range(12)}
    modules["lib/zcopy.py"] = modules["lib/m0.py"]  # exact duplicate
    _whl(wheel, modules)
    return _package(books, "books"), _package(wheel, "lib")


def _recipe(books, lib, **changes) -> recipe_lib.Recipe:
    sources = (
        recipe_lib.Source("books", books, "plain", ("texts/*.txt",), "general"),
        recipe_lib.Source("lib-docstrings", lib, "python_docstrings", ("lib/*.py",),
                          "technical", min_words=20),
        recipe_lib.Source("lib-code", lib, "source_code", ("lib/*.py",), "code", min_words=5),
    )
    mixtures = (recipe_lib.Mixture("prose", {"books": 1.0, "lib-docstrings": 1.0}),
                recipe_lib.Mixture("mixed", {"books": 1.0, "lib-docstrings": 1.0,
                                             "lib-code": 0.5}))
    recipe = recipe_lib.Recipe("test", sources, mixtures,
                               (recipe_lib.TokenizerSpec("byte", "byte"),), val_fraction=0.25)
    return dataclasses.replace(recipe, **changes)


def _build(recipe, out, **kwargs):
    return build.build_corpus(recipe, str(out), workers=0, print_fn=lambda *_: None, **kwargs)


def test_build_is_deterministic_and_documented(packages, tmp_path):
    books, lib = packages
    recipe = _recipe(books, lib)
    first = _build(recipe, tmp_path / "a")
    second = _build(recipe, tmp_path / "b")
    assert set(first) == {"prose-byte", "mixed-byte"}
    for name in first:
        assert first[name]["shard_sha256"] == second[name]["shard_sha256"]
        assert first[name]["fingerprint"] == second[name]["fingerprint"]
    info = first["mixed-byte"]
    assert info["sources"]["books"]["package"]["license"] == "CC0-1.0"
    assert info["sources"]["books"]["package"]["sha256"] == books.sha256
    cleaning = info["cleaning"]
    # The copied book loses every paragraph to paragraph deduplication (then it is too short);
    # code is not deduplicated by paragraph, so the copied module is an exact duplicate.
    assert cleaning["books"]["dropped_too_short"] == 1
    assert cleaning["books"]["dropped_not_english"] == 1
    assert cleaning["lib-code"]["dropped_exact_duplicate"] == 1
    # Weight 0.5 takes about half of the code files; every document is in train or validation.
    code = info["sources"]["lib-code"]
    assert 0 < code["train_documents"] + code["validation_documents"] < 12
    prose = first["prose-byte"]
    total = sum(v["train_tokens"] + v["validation_tokens"] for v in prose["sources"].values())
    assert total == prose["totals"]["train"]["tokens"] + prose["totals"]["validation"]["tokens"]
    assert info["tokens_by_kind"]["code"] > 0 and prose["tokens_by_kind"].get("code", 0) == 0
    with open(tmp_path / "a" / "prose-byte" / "corpus.json") as f:
        assert json.load(f)["fingerprint"] == prose["fingerprint"]
    summary = (tmp_path / "a" / "mixed-byte" / "corpus.md").read_text()
    assert "# mixed-byte (recipe test)" in summary
    assert "| lib-code | code | local: lib | 1.0 | CC0-1.0 | 0.5 |" in summary
    # The manifests are ordinary token-shard manifests; the train and validation documents differ.
    train = shards.open_corpus([str(tmp_path / "a" / "prose-byte" / "train")])
    val = shards.open_corpus([str(tmp_path / "a" / "prose-byte" / "validation")])
    assert train.num_documents == prose["totals"]["train"]["documents"] > 0
    assert val.num_documents == prose["totals"]["validation"]["documents"] > 0
    train_docs = {bytes(np.asarray(train.document(i))) for i in range(train.num_documents)}
    assert not any(bytes(np.asarray(val.document(i))) in train_docs
                   for i in range(val.num_documents))


def test_pipeline_reads_train_and_validation_paths(packages, tmp_path):
    books, lib = packages
    _build(_recipe(books, lib), tmp_path / "a", mixtures=["prose"])
    root = tmp_path / "a" / "prose-byte"
    cfg = data_config.DataConfig(paths=(str(root / "train"),),
                                 val_paths=(str(root / "validation"),), tokenizer="byte",
                                 seq_len=64, batch_size=2)
    ds = pipeline.build_datasets(cfg)
    assert ds.stats.train_documents == shards.open_corpus([str(root / "train")]).num_documents
    assert ds.stats.val_documents == shards.open_corpus([str(root / "validation")]).num_documents
    assert next(ds.train_iter)["inputs"].shape == (2, 64)
    with pytest.raises(FileNotFoundError, match="data.val_paths: no such"):
        data_config.DataConfig(paths=(str(root / "train"),), val_paths=(str(tmp_path / "x"),),
                               tokenizer="byte", seq_len=64, batch_size=2)


def test_failed_source_is_named_and_build_resumes(packages, tmp_path):
    books, lib = packages
    good = _recipe(books, lib)
    reference = _build(good, tmp_path / "ref")
    bad_lib = dataclasses.replace(lib, sha256="0" * 64)
    broken = _recipe(books, bad_lib)
    out = tmp_path / "out"
    with pytest.raises(build.BuildError, match=r"source lib-docstrings: local package lib==1\.0: "
                                               r"sha256 .* the recipe pins 0000"):
        _build(broken, out)
    finished = out / "work" / "extracted" / "books.jsonl"
    assert finished.is_file()
    mtime = finished.stat().st_mtime_ns
    resumed = _build(good, out)
    assert finished.stat().st_mtime_ns == mtime  # the finished source was not redone
    for name in reference:
        assert resumed[name]["fingerprint"] == reference[name]["fingerprint"]


def test_changed_recipe_rebuilds_like_a_fresh_build(packages, tmp_path):
    # A new cleaning pass in an old output directory (here: another split fraction) must leave
    # nothing stale behind, mixture subsets included.
    books, lib = packages
    _build(_recipe(books, lib), tmp_path / "out")
    changed = _recipe(books, lib, val_fraction=0.5)
    again = _build(changed, tmp_path / "out")
    fresh = _build(changed, tmp_path / "fresh")
    for name in fresh:
        assert again[name]["fingerprint"] == fresh[name]["fingerprint"]


def test_disk_full_names_source_and_resumes(packages, tmp_path, monkeypatch):
    books, lib = packages
    recipe = _recipe(books, lib)
    reference = _build(recipe, tmp_path / "ref")

    def full_disk_open(path, mode="r", *args, **kwargs):
        if "w" in mode and str(path).endswith("lib-docstrings.jsonl.tmp"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return builtins.open(path, mode, *args, **kwargs)

    monkeypatch.setattr(build, "open", full_disk_open, raising=False)
    with pytest.raises(build.BuildError, match="source lib-docstrings: .*No space left"):
        _build(recipe, tmp_path / "out")
    monkeypatch.undo()
    assert (tmp_path / "out" / "work" / "extracted" / "books.jsonl").is_file()
    assert not list((tmp_path / "out" / "work" / "extracted").glob("*.tmp"))
    resumed = _build(recipe, tmp_path / "out")
    assert resumed["mixed-byte"]["fingerprint"] == reference["mixed-byte"]["fingerprint"]


def test_extractor_failure_names_source(packages, tmp_path):
    books, _ = packages
    bad = str(tmp_path / "bad.tgz")
    _tgz(bad, {"mods.d/x.conf": "not a sword conf"})
    recipe = recipe_lib.Recipe(
        "t", (recipe_lib.Source("books", books, "plain", ("texts/*.txt",), "general"),
              recipe_lib.Source("broken", _package(bad, "bad"), "sword", ("mods.d/*.conf",),
                                "general")),
        (recipe_lib.Mixture("m", {"books": 1.0}),), (recipe_lib.TokenizerSpec("byte", "byte"),))
    with pytest.raises(build.BuildError, match="source broken: "):
        _build(recipe, tmp_path / "o")
    assert (tmp_path / "o" / "work" / "extracted" / "books.jsonl").is_file()


def test_missing_files_and_unknown_names(packages, tmp_path):
    books, lib = packages
    recipe = _recipe(books, lib)
    with pytest.raises(ValueError, match="has no mixture 'nope'"):
        _build(recipe, tmp_path / "o", mixtures=["nope"])
    empty = dataclasses.replace(recipe, sources=(
        recipe_lib.Source("books", books, "plain", ("nothing/*.txt",), "general"),),
        mixtures=())
    with pytest.raises(build.BuildError, match=r"source books: no file .* matches"):
        _build(empty, tmp_path / "o")


def test_eval_items_read_every_format(tmp_path):
    (tmp_path / "eval" / "piqa").mkdir(parents=True)
    (tmp_path / "eval" / "piqa" / "valid.jsonl").write_text(
        json.dumps({"goal": "a b", "sol1": "c", "nested": {"x": ["d"]}}) + "\n")
    (tmp_path / "eval" / "piqa" / "valid-labels.lst").write_text("0\n")
    (tmp_path / "wiki.test.raw").write_text(" = A = \r\n text a \r\n = B = \r\n text b \r\n")
    items = list(build.read_eval_items([str(tmp_path / "eval"), str(tmp_path / "wiki.test.raw")]))
    assert items[0] == ("piqa", "a b c d")
    assert [name for name, _ in items] == ["piqa", "wiki.test.raw", "wiki.test.raw"]
    with pytest.raises(FileNotFoundError, match="--eval_data"):
        list(build.read_eval_items([str(tmp_path / "none")]))


def test_recipe_mistakes_are_refused_when_written(packages):
    books, _ = packages
    with pytest.raises(ValueError, match="source b: unknown extractor 'dict'; known: "):
        recipe_lib.Source("b", books, "dict", ("x",), "general")
    with pytest.raises(ValueError, match="mixture name '../out'"):
        recipe_lib.Mixture("../out", {"b": 1.0})
    with pytest.raises(ValueError, match="mixture m: no sources"):
        recipe_lib.Mixture("m", {})
    with pytest.raises(ValueError, match="tokenizer t: unknown kind 'spm'"):
        recipe_lib.TokenizerSpec("t", "spm")


def test_bad_paths_are_refused_before_anything_is_fetched(packages, tmp_path):
    books, lib = packages
    recipe = _recipe(books, lib)
    with pytest.raises(FileNotFoundError, match="--eval_data: no such file or directory"):
        _build(recipe, tmp_path / "out", eval_data=[str(tmp_path / "none")])
    assert not (tmp_path / "out").exists()
    (tmp_path / "file").write_text("x")
    with pytest.raises(build.BuildError, match="--output_dir: .* is not a directory"):
        _build(recipe, tmp_path / "file")


def test_metadata_edits_and_weight_changes_leave_nothing_stale(packages, tmp_path):
    books, lib = packages
    recipe = _recipe(books, lib)
    first = _build(recipe, tmp_path / "out")
    assert [f for f, _ in first["prose-byte"]["contamination_eval_files"]] == ["wiki.test.raw"]
    extracted = tmp_path / "out" / "work" / "extracted" / "books.jsonl"
    mtime = extracted.stat().st_mtime_ns
    relabelled = dataclasses.replace(recipe, sources=tuple(
        dataclasses.replace(s, description="new words") for s in recipe.sources))
    again = _build(relabelled, tmp_path / "out")
    assert extracted.stat().st_mtime_ns == mtime  # a description is not worth re-extracting
    assert again["mixed-byte"]["fingerprint"] == first["mixed-byte"]["fingerprint"]
    quarter = dataclasses.replace(recipe, mixtures=(recipe_lib.Mixture(
        "mixed", {"books": 1.0, "lib-docstrings": 1.0, "lib-code": 0.25}),))
    _build(quarter, tmp_path / "out")
    names = sorted(os.listdir(tmp_path / "out" / "mixed-byte" / "train"))
    assert "lib-code@0.25.tokens.bin" in names and "lib-code@0.5.tokens.bin" not in names
