"""Zero-shot tasks with lm-evaluation-harness (v0.4) prompts and metrics, read from local files.

Every task turns a document into log-likelihood requests ``(context, continuation)``
(:mod:`lattn_jax.eval.scoring`) and the scores into metrics. Files are read from ``data_dir``
with the layout of ``shared/data/eval`` (see its ``SOURCES.md``); nothing is downloaded.

=============  ==========================  ==============================  =====================
task           file (under data_dir)       context -> continuations        metrics
=============  ==========================  ==============================  =====================
hellaswag      hellaswag/hellaswag_val_    ``preprocess(label: ctx)`` ->   acc, acc_norm
               full.txt.bz2 (validation)   ``" " + preprocess(ending_i)``
piqa           piqa/valid.jsonl +          ``"Question: {goal}\\nAnswer:"``  acc, acc_norm
               valid-labels.lst            -> ``" " + sol_i``
winogrande     winogrande/winogrande_dev.  ``sentence[:blank] + option_i`` acc
               llmfoundry.jsonl (dev)      -> ``" " + text after blank``
                                           (partial scoring)
arc_easy,      arc/ARC-{Easy,Challenge}-   ``"Question: {stem}\\nAnswer:"``  acc, acc_norm
arc_challenge  Test.jsonl                  -> ``" " + choice_i``
openbookqa     openbookqa/test.tsv         ``question_stem`` ->            acc, acc_norm
                                           ``" " + choice_i``
boolq          boolq/val.jsonl             ``"{passage}\\nQuestion:          acc
                                           {question}?\\nAnswer:"`` ->
                                           ``" no"`` / ``" yes"``
lambada_openai lambada/lambada_test.jsonl  text without its last word ->   acc (greedy), perplexity
                                           ``" " + last word``
=============  ==========================  ==============================  =====================

Metrics (lm-eval ``ConfigurableTask.process_results``):

* ``acc``: ``argmax_i ll_i == gold``;
* ``acc_norm``: ``argmax_i ll_i / len(choice_i) == gold`` with ``len`` the length of the choice
  string without the leading space, as lm-eval computes it: ``len(str)``, characters, not UTF-8
  bytes (lm-eval's documentation calls it byte-length normalisation; its separate ``acc_bytes``
  metric divides by bytes). The two differ on non-ASCII choices (curly quotes, accents, ...):
  62 of PIQA's 3,676 choices, 199 of HellaSwag's 40,168, 28 of ARC-Easy's 9,501 and 27 of
  ARC-Challenge's 4,687; OpenBookQA's 2,000 are all ASCII;
* WinoGrande partial scoring (Sakaguchi et al. 2020; lm-eval ``winogrande``): the two options
  fill the blank in the *context*, and the shared suffix is scored given each;
* LAMBADA (OpenAI detokenised test set, Radford et al. 2019): ``acc`` = every token of the last
  word is the greedy choice; ``perplexity = exp(-mean_doc ll(last word))``.

Every accuracy ``p`` over ``n`` documents comes with its binomial standard error
``acc_stderr = sqrt(p (1 - p) / n)`` (lm-eval reports the same quantity with ``n - 1``), so that
a score can be read against chance: PIQA at 0.40 with ``n = 20`` is 0.40 +- 0.11, within one
standard error of two of the chance level 0.50.

Chance: ``mean_doc 1 / num_choices`` for multiple choice (BoolQ's majority class, "yes", is
62.2% of its validation set); 0 for LAMBADA accuracy and the vocabulary size for its perplexity.
Beside it, ``acc_majority``: the share of the scored documents whose gold answer is the most
common gold index among them, i.e. the accuracy of always answering that choice; on a
``--limit`` subset or a task with unbalanced labels (BoolQ) it is the fairer baseline.

Deviations forced by the local files (SOURCES.md): HellaSwag comes from llama.cpp's text
rendering of the validation set, whose context is ``activity_label + ": " + ctx`` with
lm-eval's bracket markers already removed; lm-eval capitalises the first letter of ``ctx_b``,
which this rendering no longer separates, so those letters stay as in ``ctx``. WinoGrande comes
from llm-foundry's schema files, which hold exactly lm-eval's partial contexts and suffix.
"""

import bz2
import collections
import csv
import dataclasses
import json
import math
import os
import re
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

TASK_NAMES = ("hellaswag", "piqa", "winogrande", "arc_easy", "arc_challenge", "lambada_openai",
              "openbookqa", "boolq")


@dataclasses.dataclass(frozen=True)
class Doc:
    """One evaluation item as log-likelihood requests.

    Attributes:
      requests: ``(context, continuation)`` string pairs, one per choice (LAMBADA: one).
      gold: index of the correct request (LAMBADA: 0).
      choices: the strings whose lengths normalise ``acc_norm`` (lm-eval ``doc_to_choice``).
    """

    requests: Tuple[Tuple[str, str], ...]
    gold: int
    choices: Tuple[str, ...]


def _path(data_dir: str, *parts: str) -> str:
    path = os.path.join(data_dir, *parts)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"evaluation file not found: {path} (the data directory must "
                                f"be laid out as shared/data; experiments/fetch_eval_data.py "
                                f"writes it)")
    return path


class EvalDataError(ValueError):
    """An evaluation file that is there but does not read or parse (truncated, not UTF-8, bad
    JSON, a bad label); the message names the file, and the line where there is one."""


def read_jsonl(path: str) -> List[dict]:
    """The records of a JSON-lines file, strictly: blank lines skipped, any bad line an error.

    For evaluation items (this module's tasks, the HALO selection's ``select.csr_items`` and
    ``recall_items``). Record files a program appends to (the HALO selection's sweep results,
    run records) are read with :func:`lattn_jax.records.read_records` instead, which drops a
    last line cut short by a killed writer.

    Args:
      path: the file.

    Returns:
      One parsed JSON value per non-blank line, in file order.

    Raises:
      FileNotFoundError: ``path`` does not exist (``<path>: no such evaluation file``).
      EvalDataError: a line is not JSON (``<path>, line <n>: not valid JSON (...)``) or the
        file is not UTF-8 text (``<path>: not UTF-8 text (...)``).
    """
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such evaluation file")
    records = []
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        records.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise EvalDataError(f"{path}, line {n}: not valid JSON ({e})") from e
    except UnicodeDecodeError as e:
        raise EvalDataError(f"{path}: not UTF-8 text ({e})") from e
    return records


def hellaswag_preprocess(text: str) -> str:
    """lm-eval ``hellaswag.utils.preprocess``: strip, ``" [title]"`` -> ``". "``, drop
    ``[...]`` markers, collapse double spaces."""
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    return text.replace("  ", " ")


def _mc(context: str, choices: Sequence[str], gold: int) -> Doc:
    return Doc(requests=tuple((context, " " + c) for c in choices), gold=gold,
               choices=tuple(choices))


def load_hellaswag(data_dir: str) -> List[Doc]:
    """HellaSwag validation (10,042 items, 4 endings) from the llama.cpp text rendering.

    Raises:
      FileNotFoundError: the file is missing.
      EvalDataError: a truncated or damaged ``.bz2`` file, or a gold label that is not a number
        (naming the file and line).
    """
    path = _path(data_dir, "hellaswag", "hellaswag_val_full.txt.bz2")
    try:
        with bz2.open(path, "rt", encoding="utf-8") as f:
            lines = f.read().split("\n")
    except (EOFError, OSError, UnicodeDecodeError) as e:  # cut short, not bz2, not UTF-8
        raise EvalDataError(f"{path}: not a readable bz2 text file "
                            f"({type(e).__name__}: {e})") from e
    docs = []
    for i in range(0, len(lines) - 5, 6):
        ctx, endings = lines[i], lines[i + 2:i + 6]
        try:
            gold = int(lines[i + 1])
        except ValueError as e:
            raise EvalDataError(f"{path}, line {i + 2}: the gold ending {lines[i + 1]!r} is "
                                f"not a number") from e
        docs.append(_mc(hellaswag_preprocess(ctx), [hellaswag_preprocess(e) for e in endings],
                        gold))
    return docs


def load_piqa(data_dir: str) -> List[Doc]:
    """PIQA validation (1,838 items): ``"Question: {goal}\\nAnswer:"`` -> ``" " + sol``.

    Raises:
      FileNotFoundError: a file is missing.
      EvalDataError: bad JSON, a label that is not a number, or not as many labels as items
        (each naming its file).
    """
    items_path = _path(data_dir, "piqa", "valid.jsonl")
    items = read_jsonl(items_path)
    labels_path = _path(data_dir, "piqa", "valid-labels.lst")
    try:
        with open(labels_path, encoding="utf-8") as f:
            words = f.read().split()
        labels = [int(x) for x in words]
    except (ValueError, UnicodeDecodeError) as e:
        raise EvalDataError(f"{labels_path}: not a list of 0/1 labels ({e})") from e
    if len(labels) != len(items):
        raise EvalDataError(f"piqa: {len(items)} items in {items_path} but {len(labels)} labels "
                            f"in {labels_path}")
    return [_mc(f"Question: {d['goal']}\nAnswer:", [d["sol1"], d["sol2"]], y)
            for d, y in zip(items, labels)]


def load_winogrande(data_dir: str) -> List[Doc]:
    """WinoGrande-xl dev (1,267 items), partial scoring: the options fill the context."""
    docs = []
    for d in read_jsonl(_path(data_dir, "winogrande", "winogrande_dev.llmfoundry.jsonl")):
        cont = " " + d["continuation"].strip()
        ctxs = tuple(d["context_options"])
        docs.append(Doc(requests=tuple((c, cont) for c in ctxs), gold=int(d["gold"]),
                        choices=ctxs))
    return docs


def _load_arc(data_dir: str, name: str) -> List[Doc]:
    docs = []
    for d in read_jsonl(_path(data_dir, "arc", f"ARC-{name}-Test.jsonl")):
        q = d["question"]
        labels = [c["label"] for c in q["choices"]]
        docs.append(_mc(f"Question: {q['stem']}\nAnswer:", [c["text"] for c in q["choices"]],
                        labels.index(d["answerKey"])))
    return docs


def load_openbookqa(data_dir: str) -> List[Doc]:
    """OpenBookQA main test (500 items): context ``question_stem``, 4 choices."""
    docs = []
    with open(_path(data_dir, "openbookqa", "test.tsv"), encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f, delimiter="\t"):
            parts = re.split(r"\(([A-D])\) ", row["Choices"])[1:]
            labels, texts = parts[0::2], [t.strip() for t in parts[1::2]]
            docs.append(_mc(row["Question Stem"], texts, labels.index(row["Answer Key"].strip())))
    return docs


def load_boolq(data_dir: str) -> List[Doc]:
    """BoolQ (SuperGLUE) validation (3,270 items): choices ``" no"``, ``" yes"``."""
    docs = []
    for d in read_jsonl(_path(data_dir, "boolq", "val.jsonl")):
        label = d["label"]
        gold = int(label if isinstance(label, bool) else str(label).lower() == "true")
        docs.append(_mc(f"{d['passage']}\nQuestion: {d['question']}?\nAnswer:", ["no", "yes"],
                        gold))
    return docs


def load_lambada(data_dir: str) -> List[Doc]:
    """LAMBADA OpenAI test (5,153 items): the last space-separated word is the target."""
    docs = []
    for d in read_jsonl(_path(data_dir, "lambada", "lambada_test.jsonl")):
        words = d["text"].split(" ")
        docs.append(Doc(requests=((" ".join(words[:-1]), " " + words[-1]),), gold=0,
                        choices=(words[-1],)))
    return docs


LOADERS: Dict[str, Callable[[str], List[Doc]]] = {
    "hellaswag": load_hellaswag,
    "piqa": load_piqa,
    "winogrande": load_winogrande,
    "arc_easy": lambda d: _load_arc(d, "Easy"),
    "arc_challenge": lambda d: _load_arc(d, "Challenge"),
    "lambada_openai": load_lambada,
    "openbookqa": load_openbookqa,
    "boolq": load_boolq,
}
# The files each task reads, relative to the data directory's ``eval/`` (checked before scoring).
TASK_FILES: Dict[str, Tuple[Tuple[str, str], ...]] = {
    "hellaswag": (("hellaswag", "hellaswag_val_full.txt.bz2"),),
    "piqa": (("piqa", "valid.jsonl"), ("piqa", "valid-labels.lst")),
    "winogrande": (("winogrande", "winogrande_dev.llmfoundry.jsonl"),),
    "arc_easy": (("arc", "ARC-Easy-Test.jsonl"),),
    "arc_challenge": (("arc", "ARC-Challenge-Test.jsonl"),),
    "lambada_openai": (("lambada", "lambada_test.jsonl"),),
    "openbookqa": (("openbookqa", "test.tsv"),),
    "boolq": (("boolq", "val.jsonl"),),
}


def missing_files(name: str, data_dir: str) -> List[str]:
    """The files task ``name`` reads under ``data_dir`` (laid out as ``shared/data/eval``) that
    are not there.

    Raises:
      ValueError: for an unknown task name.
    """
    if name not in TASK_FILES:
        raise ValueError(f"unknown task {name!r}; choose from {', '.join(TASK_NAMES)}")
    paths = [os.path.join(data_dir, *parts) for parts in TASK_FILES[name]]
    return [p for p in paths if not os.path.isfile(p)]


METRICS = {"winogrande": ("acc",), "boolq": ("acc",), "lambada_openai": ("acc", "perplexity")}


def load_task(name: str, data_dir: str, limit: Optional[int] = None,
              seed: int = 1234) -> List[Doc]:
    """Loads a task's documents.

    Args:
      name: one of :data:`TASK_NAMES`.
      data_dir: directory laid out as ``shared/data/eval``.
      limit: keep a random subsample of this many documents, in file order (fixed ``seed``;
        ``None``: all). This is ``EvalOptions.sample_items`` (``--sample_items``) and HALO's
        ``csr_limit``; the harness's ``--limit``, the first N, is ``load_task(...)[:N]``.
      seed: subsampling seed.

    Raises:
      ValueError: for an unknown task name.
      FileNotFoundError: naming the missing file.
      EvalDataError: a file that does not read or parse (naming it, and the line).
    """
    if name not in LOADERS:
        raise ValueError(f"unknown task {name!r}; choose from {', '.join(TASK_NAMES)}")
    docs = LOADERS[name](data_dir)
    if limit is not None and limit < len(docs):
        docs = [docs[i] for i in subset_indices(len(docs), limit, seed)]
    return docs


# Per task: (files under data_dir, how items are stored) for write_subset.
_SUBSET_FILES = {
    "hellaswag": (("hellaswag", "hellaswag_val_full.txt.bz2"), "blocks6_bz2"),
    "piqa": (("piqa", "valid.jsonl"), "jsonl+labels"),
    "winogrande": (("winogrande", "winogrande_dev.llmfoundry.jsonl"), "jsonl"),
    "arc_easy": (("arc", "ARC-Easy-Test.jsonl"), "jsonl"),
    "arc_challenge": (("arc", "ARC-Challenge-Test.jsonl"), "jsonl"),
    "lambada_openai": (("lambada", "lambada_test.jsonl"), "jsonl"),
    "openbookqa": (("openbookqa", "test.tsv"), "tsv"),
    "boolq": (("boolq", "val.jsonl"), "jsonl"),
}


def subset_indices(num_docs: int, limit: Optional[int], seed: int = 1234) -> np.ndarray:
    """The sorted document indices :func:`load_task` keeps (all of them if ``limit`` is
    ``None`` or not below ``num_docs``)."""
    if limit is None or limit >= num_docs:
        return np.arange(num_docs)
    return np.sort(np.random.default_rng(seed).choice(num_docs, limit, replace=False))


def write_subset(name: str, src_dir: str, dst_dir: str, limit: Optional[int],
                 seed: int = 1234) -> List[str]:
    """Writes the documents ``load_task(name, src_dir, limit, seed)`` keeps, in the original
    file format, under ``dst_dir`` (same layout), so that ``load_task(name, dst_dir, limit,
    seed)`` returns the same documents from a small copy of the data.

    Args:
      name: one of :data:`TASK_NAMES`.
      src_dir: directory laid out as ``shared/data/eval``.
      dst_dir: where the subset goes (created).
      limit, seed: as for :func:`load_task`.

    Returns:
      The paths written.

    Raises:
      ValueError: for an unknown task name.
      FileNotFoundError: naming a missing source file.
    """
    if name not in _SUBSET_FILES:
        raise ValueError(f"unknown task {name!r}; choose from {', '.join(TASK_NAMES)}")
    parts, kind = _SUBSET_FILES[name]
    src = _path(src_dir, *parts)
    dst = os.path.join(dst_dir, *parts)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    written = [dst]
    if kind == "blocks6_bz2":
        with bz2.open(src, "rt", encoding="utf-8") as f:
            lines = f.read().split("\n")
        blocks = [lines[i:i + 6] for i in range(0, len(lines) - 5, 6)]
        keep = subset_indices(len(blocks), limit, seed)
        with bz2.open(dst, "wt", encoding="utf-8") as f:
            f.write("\n".join(line for i in keep for line in blocks[i]) + "\n")
    elif kind in ("jsonl", "jsonl+labels"):
        with open(src, encoding="utf-8") as f:
            items = [line.rstrip("\n") for line in f if line.strip()]
        keep = subset_indices(len(items), limit, seed)
        with open(dst, "w", encoding="utf-8") as f:
            f.writelines(items[i] + "\n" for i in keep)
        if kind == "jsonl+labels":
            with open(_path(src_dir, parts[0], "valid-labels.lst")) as f:
                labels = f.read().split()
            written.append(os.path.join(dst_dir, parts[0], "valid-labels.lst"))
            with open(written[-1], "w") as f:
                f.writelines(labels[i] + "\n" for i in keep)
    else:  # tsv with a header
        with open(src, encoding="utf-8", newline="") as f:
            rows = list(csv.reader(f, delimiter="\t"))
        keep = subset_indices(len(rows) - 1, limit, seed)
        with open(dst, "w", encoding="utf-8", newline="") as f:
            writer = csv.writer(f, delimiter="\t", lineterminator="\n")
            writer.writerow(rows[0])
            writer.writerows(rows[1 + i] for i in keep)
    return written


def doc_accuracies(docs: Sequence[Doc], results: Sequence[Sequence[Tuple[float, bool]]]
                   ) -> Tuple[np.ndarray, np.ndarray]:
    """Per-document multiple-choice correctness, lm-eval's ``acc`` and ``acc_norm``.

    ``acc_d = [argmax_i ll_i == gold]``, ``acc_norm_d = [argmax_i ll_i / len(choice_i) ==
    gold]`` with ``len`` in characters (lm-eval ``multiple_choice`` task semantics; ties go to
    the first choice, as ``np.argmax``).

    Args:
      docs: the documents (``choices`` and ``gold`` used).
      results: per document, one ``(ll, is_greedy)`` per request (choice).

    Returns:
      ``(acc, acc_norm)``: float64 ``[len(docs)]`` arrays of 0.0 / 1.0.
    """
    acc, acc_norm = [], []
    for doc, res in zip(docs, results):
        lls = np.array([ll for ll, _ in res])
        lens = np.array([float(len(c)) for c in doc.choices])
        acc.append(float(np.argmax(lls) == doc.gold))
        acc_norm.append(float(np.argmax(lls / lens) == doc.gold))
    return np.asarray(acc, np.float64), np.asarray(acc_norm, np.float64)


def process_results(name: str, docs: Sequence[Doc],
                    results: Sequence[Sequence[Tuple[float, bool]]]) -> Dict[str, float]:
    """Aggregates per-request ``(loglikelihood, is_greedy)`` into the task's metrics.

    Args:
      name: the task.
      docs: its documents.
      results: per document, one ``(ll, is_greedy)`` per request.

    Returns:
      ``{metric: value, metric + "_chance": value, "n": count}`` with the metrics of
      :data:`METRICS` (default ``acc`` and ``acc_norm``), ``metric + "_stderr"`` (the
      binomial standard error :func:`binomial_stderr`) for every accuracy, and for multiple
      choice ``metric + "_majority"``: the share of ``docs`` whose ``gold`` is their most
      common gold index (the accuracy of always answering it; BoolQ: the majority class).
    """
    metrics = METRICS.get(name, ("acc", "acc_norm"))
    out: Dict[str, float] = {"n": len(docs)}
    if name == "lambada_openai":
        lls = np.array([r[0][0] for r in results])
        out["acc"] = float(np.mean([r[0][1] for r in results]))
        out["perplexity"] = float(math.exp(-lls.mean()))
        out["acc_stderr"] = binomial_stderr(out["acc"], len(docs))
        out["acc_chance"] = 0.0
        return out
    acc, acc_norm = doc_accuracies(docs, results)
    chance = float(np.mean([1.0 / len(d.requests) for d in docs]))
    golds = collections.Counter(d.gold for d in docs)
    majority = max(golds.values()) / len(docs) if docs else float("nan")
    out["acc"] = float(np.mean(acc))
    out["acc_stderr"] = binomial_stderr(out["acc"], len(docs))
    out["acc_chance"] = chance
    out["acc_majority"] = majority
    if "acc_norm" in metrics:
        out["acc_norm"] = float(np.mean(acc_norm))
        out["acc_norm_stderr"] = binomial_stderr(out["acc_norm"], len(docs))
        out["acc_norm_chance"] = chance
        out["acc_norm_majority"] = majority
    return out


def binomial_stderr(p: float, n: int) -> float:
    """Standard error ``sqrt(p (1 - p) / n)`` of an accuracy ``p`` measured on ``n`` documents."""
    return math.sqrt(p * (1.0 - p) / n) if n > 0 else float("nan")
