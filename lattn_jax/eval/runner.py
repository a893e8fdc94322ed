"""One entry point for every evaluation: zero-shot tasks, NIAH and perplexity, to JSON + markdown.

``run_evaluation(model, tokenizer, tasks, options)`` first checks that the data files of every
requested task exist (:func:`check_data`: one error listing all missing files, before anything is
scored), then returns a results dict; ``write_results(results, output_dir)`` merges it into
``results.json`` (earlier tasks are kept, re-run tasks replaced; written atomically) and writes
``results.md`` and one NIAH heatmap PNG per NIAH task (``niah_single_2.png``, ...). Accuracies
carry their binomial standard error (``acc_stderr``, :func:`.tasks.binomial_stderr`). Task
names: :data:`lattn_jax.eval.tasks.TASK_NAMES`, :data:`lattn_jax.eval.niah.TASKS` and
``"perplexity"``; groups ``"zeroshot"``, ``"niah"`` and ``"all"`` expand to their members.
"""

import contextlib
import dataclasses
import json
import os
import shlex
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from absl import logging

from lattn_jax import assets
from lattn_jax import checkpoint as checkpoint_lib
from lattn_jax import config as config_lib
from lattn_jax import context_parallel
from lattn_jax import model as model_lib
from lattn_jax import sharding
from lattn_jax.data import config as data_config_lib
from lattn_jax.data import pipeline as data_pipeline
from lattn_jax.data import sources as data_sources
from lattn_jax.data import tokenizers as tok_lib
from lattn_jax.eval import fetch
from lattn_jax.eval import generate as gen_lib
from lattn_jax.eval import niah
from lattn_jax.eval import perplexity as ppl_lib
from lattn_jax.eval import scoring
from lattn_jax.eval import tasks as tasks_lib

GROUPS = {
    "zeroshot": tasks_lib.TASK_NAMES,
    "niah": niah.TASKS,
    "all": tasks_lib.TASK_NAMES + niah.TASKS + ("perplexity",),
}
ALL_TASKS = tasks_lib.TASK_NAMES + niah.TASKS + ("perplexity",)
# ``perplexity_files`` entry for the documents the run held out for validation.
VALIDATION = "validation"


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalOptions:
    """Evaluation settings.

    Attributes:
      data_dir: directory laid out as ``shared/data`` (``eval/``, ``niah/``, ``lm/``).
      limit: the first ``limit`` documents of every zero-shot task, in file order, as
        lm-evaluation-harness ``--limit N`` keeps them (so results compare item by item with
        the harness's); ``None``: all.
      sample_items: instead, a random subset of this many documents per zero-shot task, drawn
        with ``seed`` and kept in file order (:func:`lattn_jax.eval.tasks.subset_indices`);
        ``None``: no sampling. Exclusive with ``limit``.
      max_len: context window for log-likelihood scoring (left truncation).
      batch_size: sequences per forward pass (zero-shot tasks and NIAH).
      perplexity_batch_size: windows per forward pass of the ``perplexity`` task. Its windows
        are ``perplexity_window`` tokens long, so the fp32 logits of one pass take
        ``batch * window * vocab * 4`` bytes (1 GiB at batch 2, 2048 tokens and LLaMA-2's 32,000
        tokens; log-softmax doubles it); the result does not depend on it.
      niah_lengths: NIAH target lengths in tokens.
      niah_depths: NIAH needle depths in percent.
      niah_samples: prompts per (length, depth) cell.
      niah_max_new_tokens: generated answer tokens.
      perplexity_files: what the ``perplexity`` task scores: ``"validation"`` (default), the
        documents the checkpoint's run held out for validation (:func:`validation_documents`;
        needs ``training_data``), and/or text files, relative to ``data_dir`` or absolute. A
        file among the run's training paths is scored but flagged (``trained_on`` in its result,
        a warning): its perplexity is a training perplexity. The default config trains on both
        bundled WikiText-2 files (valid and test), so ``lm/wikitext-2-raw/wiki.test.raw`` is not
        held out for it.
      perplexity_max_docs: score only the first this many documents of each file. A result
        that covers fewer than all of a file's documents is stored under its own key
        (:func:`perplexity_key`, ``perplexity:<file>@<N>_docs``), never under the full
        file's.
      perplexity_window: window length in tokens.
      perplexity_stride: new tokens per window (``== window``: disjoint windows).
      route: evaluate with the cross-layer routing contributions (spec §8: the training forward).
      seed: the seed of ``sample_items``.
      training_data: the checkpoint's ``config.data`` (``restore.load(...).config.data``); needed
        for ``"validation"`` and the trained-on check.
      context: split every sequence over this many devices (context parallelism,
        :mod:`lattn_jax.context_parallel`; the remaining devices split the batch). Padded
        lengths become multiples of it (large enough that each shard holds the short
        convolution's halo, ``context_parallel.padding_bucket``), so ``max_len`` must be one.

    Raises:
      ValueError: ``limit``, ``sample_items`` or ``perplexity_max_docs`` below 1, or ``limit``
        and ``sample_items`` both given.
    """

    data_dir: str
    limit: Optional[int] = None
    sample_items: Optional[int] = None
    max_len: int = 2048
    batch_size: int = 16
    perplexity_batch_size: int = 2
    niah_lengths: Tuple[int, ...] = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144)
    niah_depths: Tuple[float, ...] = (0.0, 25.0, 50.0, 75.0, 100.0)
    niah_samples: int = 1
    niah_max_new_tokens: int = 32
    perplexity_files: Tuple[str, ...] = (VALIDATION,)
    perplexity_max_docs: Optional[int] = None
    perplexity_window: int = 2048
    perplexity_stride: int = 2048
    route: bool = True
    seed: int = 1234
    training_data: Optional[data_config_lib.DataConfig] = None
    context: int = 1

    def __post_init__(self):
        for name, unit in (("limit", "items"), ("sample_items", "items"),
                           ("perplexity_max_docs", "documents")):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be a positive number of {unit}, got {value}")
        if self.limit is not None and self.sample_items is not None:
            raise ValueError(f"limit={self.limit} (the first N documents, as lm-evaluation-"
                             f"harness --limit) and sample_items={self.sample_items} (a seeded "
                             f"random subset) are exclusive; give one")


def parse_niah_grid(lengths: Sequence[str],
                    depths: Sequence[str]) -> Tuple[Tuple[int, ...], Tuple[float, ...]]:
    """The ``--niah_lengths`` and ``--niah_depths`` entries (strings) as numbers, checked.

    Args:
      lengths: NIAH target lengths in tokens, each a positive integer.
      depths: needle depths in percent, each a number in [0, 100].

    Returns:
      ``(lengths, depths)`` for :class:`EvalOptions`.

    Raises:
      ValueError: naming the flag, its value and the first bad entry (one that is not a
        positive integer, or not a number in [0, 100]).
    """
    def parse(flag, values, kind, ok, requirement):
        out = []
        for text in values:
            try:
                number = kind(text)
            except ValueError:
                number = None
            if number is None or not ok(number):
                raise ValueError(f"--{flag}={','.join(values)}: {text.strip()!r} is not "
                                 f"{requirement}")
            out.append(number)
        return tuple(out)

    return (parse("niah_lengths", lengths, int, lambda n: n >= 1,
                  "a positive integer (a length in tokens)"),
            parse("niah_depths", depths, float, lambda d: 0 <= d <= 100,
                  "a number in [0, 100] (a depth in percent)"))


def expand_tasks(names: Sequence[str]) -> List[str]:
    """Expands groups and checks names; keeps the first occurrence of each task.

    Raises:
      ValueError: naming an unknown task.
    """
    out: List[str] = []
    for name in names:
        name = name.strip()
        if not name:
            continue
        members = GROUPS.get(name, (name,))
        for m in members:
            if m not in ALL_TASKS:
                raise ValueError(f"unknown task {m!r}; choose from {', '.join(ALL_TASKS)} or a "
                                 f"group ({', '.join(GROUPS)})")
            if m not in out:
                out.append(m)
    return out


def _perplexity_path(f: str, data_dir: str) -> str:
    path = f if os.path.isabs(f) else os.path.join(data_dir, f)
    if not os.path.isfile(path) and f.startswith("lm/wikitext-2-raw/"):
        # The WikiText-2 raw splits ship in the package (lattn_jax/assets/corpus).
        bundled = assets.asset_path("corpus/wikitext-2-raw/" + os.path.basename(f))
        if os.path.isfile(bundled):
            return bundled
    return path


def check_data(task_names: Sequence[str], options: EvalOptions) -> None:
    """Checks that every file the tasks read exists (and a perplexity file is text), before
    anything is scored.

    Every missing item is reported with where it comes from, so the message names what fixes
    it: task data under ``data_dir`` (``--data_dir``), a ``perplexity_files`` entry
    (``--perplexity_files``; a relative one is looked up under ``data_dir``), or the corpus the
    run's config records (``training_data``: its ``val_paths``, else ``paths``; restore it
    there, or score other text files).

    Raises:
      ValueError: an unknown task, or a ``perplexity_files`` entry that looks binary, is a
        directory or has no document (empty or only whitespace; one line each, naming the flag
        and the path; an entry is one text file).
        FileNotFoundError: listing every missing file, grouped by the option or recorded config
        path it comes from.
    """
    under_data_dir, ppl_files, corpus, binary = [], [], [], []
    eval_dir = os.path.join(options.data_dir, "eval")
    for name in expand_tasks(task_names):
        if name in tasks_lib.TASK_NAMES:
            under_data_dir += [f"{name}: {p}" for p in tasks_lib.missing_files(name, eval_dir)]
        elif name in niah.TASKS and name != "niah_single_1":
            essays = os.path.join(options.data_dir, "niah", "PaulGrahamEssays")
            if not (os.path.isdir(essays) and any(f.endswith(".txt") for f in os.listdir(essays))):
                under_data_dir.append(f"{name}: {essays}/*.txt")
        elif name == "perplexity":
            for f in options.perplexity_files:
                if f == VALIDATION:
                    continue
                path = _perplexity_path(f, options.data_dir)
                if os.path.isdir(path):  # was "entry not found", though it exists
                    binary.append(_directory_error(f, path, options.data_dir))
                elif not os.path.isfile(path):
                    ppl_files.append(path if os.path.isabs(f) else
                                     f"{f} (relative to --data_dir={options.data_dir}): {path}")
                else:
                    reason = binary_reason(path)
                    if reason:
                        binary.append(reason)
                    elif not _has_text(path):
                        binary.append(f"--perplexity_files: {path} has no documents to score "
                                      f"(it is empty or only whitespace)")
            data = options.training_data
            if VALIDATION in options.perplexity_files and data is not None:
                held_out = data.val_paths if data.val_paths is not None else data.paths
                corpus += [p for p in held_out if not os.path.exists(p)]
    groups = []
    if under_data_dir:
        groups.append(
            f"evaluation data missing under --data_dir={options.data_dir} (nothing was scored; "
            f"set --data_dir to a directory with eval/, niah/ and lm/, as "
            f"experiments/fetch_eval_data.py writes it):\n  " + "\n  ".join(under_data_dir))
    if ppl_files:
        groups.append("--perplexity_files entry not found (nothing was scored; pass existing "
                      "text files, absolute or relative to --data_dir): " + ", ".join(ppl_files))
    if corpus:
        data = options.training_data
        field = "data.val_paths" if data.val_paths is not None else "data.paths"
        groups.append(
            f"perplexity {VALIDATION!r} (the run's held-out documents): the run's corpus is "
            f"missing (nothing was scored): its config records "
            f"{field}={','.join(getattr(data, field[5:]))}, and "
            f"{', '.join(corpus)} does not exist; restore the corpus there, or pass "
            f"--perplexity_files=<text files> to score other text (--data_dir does not change it)")
    if groups:
        raise FileNotFoundError("\n".join(groups + binary))
    if binary:
        raise ValueError("\n".join(binary))


def _has_text(path: str) -> bool:
    """Whether the file holds anything but whitespace (so :func:`read_documents` finds a
    document); reads only up to the first such byte."""
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 16), b""):
            if block.strip():
                return True
    return False


def _directory_error(entry: str, path: str, data_dir: str) -> str:
    """The one-line error for a ``--perplexity_files`` entry that is a directory: each entry is
    one text file, so the line names the flag, the path and up to three files in it to pass."""
    where = path if os.path.isabs(entry) else (f"{entry} (relative to --data_dir={data_dir}): "
                                               f"{path}")
    try:
        files = sorted(n for n in os.listdir(path) if os.path.isfile(os.path.join(path, n)))
    except OSError:
        files = []
    example = shlex.quote(",".join(os.path.join(entry, n) for n in files[:3]))
    hint = f" (e.g. --perplexity_files={example})" if files else ""
    return (f"--perplexity_files: {where} is a directory; each entry must be a text file: pass "
            f"the files to score{hint}")


def validation_documents(data: data_config_lib.DataConfig) -> List[str]:
    """The documents a run held out for validation, as text, in corpus order.

    With ``data.val_paths`` every document of those paths; otherwise the documents of
    ``data.paths`` that :func:`lattn_jax.data.pipeline.split_documents` (``val_fraction``,
    ``seed``) keeps out of training, read as the pipeline reads them.

    Raises:
      ValueError: token-shard data (no text to read back; score text files instead).
    """
    paths = data.val_paths if data.val_paths is not None else data.paths
    if data_config_lib.resolved_format(dataclasses.replace(data, paths=paths,
                                                           val_paths=None)) == "tokens":
        raise ValueError(f"perplexity {VALIDATION!r}: the run reads token shards "
                         f"({', '.join(paths)}), whose text cannot be recovered; pass held-out "
                         "text files with --perplexity_files")
    docs = list(data_sources.read_documents(paths, fmt=data.format, text_field=data.text_field,
                                            doc_split=data.doc_split,
                                            max_bad_fraction=data.max_bad_fraction))
    if data.val_paths is not None:
        return docs
    _, val_idx = data_pipeline.split_documents(len(docs), data.val_fraction, data.seed)
    return [docs[i] for i in sorted(val_idx)]


def trained_on(path: str, data: Optional[data_config_lib.DataConfig]) -> bool:
    """Whether the run of ``data`` trains on the file ``path``: it is one of the files of
    ``data.paths``, or a byte-identical copy of one (e.g. ``shared/data``'s WikiText-2 files,
    which equal the bundled ones)."""
    if data is None:
        return False
    try:
        files = [f for f in data_sources.list_files(data.paths) if os.path.isfile(f)]
    except (OSError, ValueError):
        return False
    real = os.path.realpath(path)
    if real in {os.path.realpath(f) for f in files}:
        return True
    size = os.path.getsize(path)
    same_size = [f for f in files if os.path.getsize(f) == size]
    return bool(same_size) and fetch.sha256_of(path) in {fetch.sha256_of(f) for f in same_size}


def binary_reason(path: str) -> Optional[str]:
    """The one-line error for a ``--perplexity_files`` entry that looks binary, else ``None``.

    Raises:
      ValueError: the file cannot be read (named).
    """
    try:
        reason = data_sources.sniff_binary(path)
    except data_sources.DataFileError as e:
        raise ValueError(f"--perplexity_files: {e}") from e
    if not reason:
        return None
    return (f"--perplexity_files: {path} looks binary, not text ({reason}); perplexity scores "
            f"UTF-8 text files")


def read_documents(path: str, max_docs: Optional[int]) -> List[str]:
    """Documents of a held-out text file.

    WikiText raw files (name containing ``wiki``) are split into articles at their top-level
    `` = Title = `` headings, with CRLF turned into LF; any other file is one document.

    Invalid UTF-8 is replaced by U+FFFD with a warning naming the file and the count, as the
    training data pipeline does (``data.sources.decode_utf8``).

    Raises:
      FileNotFoundError: naming the missing file.
      ValueError: the file looks binary (``data.sources.sniff_binary``), naming it.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"perplexity file not found: {path}")
    binary = binary_reason(path)
    if binary:
        raise ValueError(binary)
    with open(path, "rb") as f:
        text, replaced = data_sources.decode_utf8(f.read())
    if replaced:
        logging.warning(f"{path}: replaced {replaced} invalid UTF-8 sequence(s) by U+FFFD")
    text = text.replace("\r\n", "\n")
    split = "wikitext" if "wiki" in os.path.basename(path) else "file"
    docs = [p for p in data_sources.split_pieces(text, split) if p.strip()]
    return docs[:max_docs] if max_docs else docs


def perplexity_key(path: str, max_docs: Optional[int], documents: int,
                   name: Optional[str] = None) -> str:
    """The ``results.json`` key of the perplexity of the file (or ``"validation"``) ``path``.

    ``perplexity:<name>`` when every one of its ``documents`` is scored;
    ``perplexity:<name>@<max_docs>_docs`` when ``max_docs`` (``--perplexity_max_docs``)
    keeps only the first ``max_docs < documents``, so a subset's number neither replaces nor
    reads as the full file's (:func:`merge_results` replaces entries key by key).

    Args:
      path: the scored file, or :data:`VALIDATION`.
      max_docs: the limit on documents (``None``: none).
      documents: the number of documents in the file.
      name: the file's name in the key (:func:`perplexity_names`; ``None``: its base name).
    """
    name = f"perplexity:{os.path.basename(path) if name is None else name}"
    return f"{name}@{max_docs}_docs" if max_docs is not None and max_docs < documents else name


def perplexity_names(paths: Sequence[str],
                     existing: Optional[Dict[str, dict]] = None) -> Dict[str, str]:
    """The name each perplexity file goes under in its ``results.json`` key
    (:func:`perplexity_key`), unique per file.

    A file's base name (``test.txt``) when no other file of ``paths`` has it and no entry of
    ``existing`` under it (``perplexity:test.txt``, or its ``@<N>_docs`` subsets) records a
    different ``path``; otherwise its absolute path, so two files named alike never overwrite
    each other's entry (in one run or across runs). An earlier entry that records no path
    (written before entries recorded one) is replaced, as before.

    Args:
      paths: the scored files (resolved, :func:`_perplexity_path`), or :data:`VALIDATION`.
      existing: the ``results.json`` entries already there (:func:`read_results`).

    Returns:
      ``{path: name}`` (:data:`VALIDATION` maps to itself).
    """
    existing = existing or {}
    absolute = {p: p if p == VALIDATION else os.path.abspath(p) for p in paths}
    bases: Dict[str, set] = {}
    for p in paths:
        bases.setdefault(os.path.basename(p), set()).add(absolute[p])
    names = {}
    for p in paths:
        base = os.path.basename(p)
        taken = {r.get("path") for k, r in existing.items()
                 if (k == f"perplexity:{base}" or k.startswith(f"perplexity:{base}@"))
                 and isinstance(r, dict) and r.get("path") is not None}
        unique = len(bases[base]) == 1 and not taken - {absolute[p]}
        names[p] = base if p == VALIDATION or unique else absolute[p]
    return names


def file_identity(path: str) -> Dict[str, object]:
    """What a perplexity entry records of its file: ``{"path": absolute path, "size": bytes,
    "sha256": the first 16 hex digits of its SHA-256}``.

    Raises:
      OSError: the file cannot be read.
    """
    return {"path": os.path.abspath(path), "size": os.path.getsize(path),
            "sha256": fetch.sha256_of(path)[:16]}


def score_task(scorer: scoring.Scorer, name: str, docs: Sequence[tasks_lib.Doc],
               pairs: Sequence) -> Dict[str, float]:
    """One multiple-choice task's metrics: every request scored, regrouped per document.

    Args:
      scorer: the model's :class:`~lattn_jax.eval.scoring.Scorer`.
      name: the task (``tasks.TASK_NAMES``).
      docs: its documents (``tasks.load_task``).
      pairs: the encoded ``(context, continuation)`` of every request of every document, in
        document order (``scoring.encode_pair``).

    Returns:
      ``tasks.process_results`` of the task (accuracy metrics in [0, 1]).
    """
    flat = scorer.loglikelihood(pairs)
    grouped, k = [], 0
    for d in docs:
        grouped.append(flat[k:k + len(d.requests)])
        k += len(d.requests)
    return tasks_lib.process_results(name, docs, grouped)


def run_evaluation(model: model_lib.LanguageModel, tokenizer: tok_lib.Tokenizer,
                   task_names: Sequence[str], options: EvalOptions, log=print,
                   on_result: Optional[Callable[[str, dict], None]] = None,
                   existing: Optional[Dict[str, dict]] = None) -> Dict[str, dict]:
    """Evaluates ``model`` on ``task_names``.

    Args:
      model: the language model.
      tokenizer: its tokenizer.
      task_names: task or group names (:func:`expand_tasks`).
      options: :class:`EvalOptions`.
      log: progress printer.
      on_result: called with ``(key, metrics)`` as soon as each entry is scored (a zero-shot
        task, a NIAH task, a perplexity file), so a caller can save the finished ones before a
        later task fails or is interrupted (``evaluate.py`` merges each into ``results.json``).
      existing: the ``results.json`` entries already in the output directory
        (:func:`read_results`): a perplexity file named like the file of an earlier entry
        goes under a distinct key (:func:`perplexity_names`).

    Returns:
      ``{task: metrics}``; zero-shot metrics come from
      :func:`lattn_jax.eval.tasks.process_results`, NIAH from :func:`lattn_jax.eval.niah.run`,
      perplexity from :func:`lattn_jax.eval.perplexity.evaluate` (one entry per file, under
      :func:`perplexity_key` and :func:`perplexity_names`, with ``trained_on``,
      ``documents_total`` (the file's documents), ``max_docs``
      (``options.perplexity_max_docs``) and, for a file, ``path``, ``size`` and ``sha256``
      (:func:`file_identity`) added; ``documents`` is the number scored, and a line is logged
      when it is fewer than ``documents_total``). A zero-shot task with fewer items than
      ``options.sample_items`` is scored whole (its ``n``), with a line logged that names the
      task, its size and ``--sample_items``.

    Raises:
      ValueError: unknown task, a ``context`` that does not divide the devices or
        ``max_len``, a perplexity file or validation split with no document (named), a NIAH
        length too short for its task's prompt (naming ``--niah_lengths``; every NIAH prompt
        is built before anything is scored), a zero-shot task with a continuation longer
        than ``max_len`` (naming ``--max_len``; the tasks before it were scored).
        FileNotFoundError: a missing data file.
      OutOfMemoryError: (a ``ValueError``) a zero-shot task, a NIAH length or a perplexity
        file ran out of device memory (see :func:`_run`); the tasks finished before it went
        to ``on_result``.
    """
    names = expand_tasks(task_names)
    check_data(names, options)
    if ("perplexity" in names and VALIDATION in options.perplexity_files
            and options.training_data is None):
        raise ValueError(f"perplexity {VALIDATION!r} scores the documents the run held out; it "
                         "needs the checkpoint's data config (EvalOptions.training_data)")
    mesh = context_parallel.evaluation_mesh(options.context)
    if options.max_len % options.context:
        raise ValueError(f"max_len={options.max_len} is not a multiple of context="
                         f"{options.context}")
    model = context_parallel.replicate(model, mesh)
    with sharding.activate(mesh, config_lib.DEFAULT_AXIS_RULES):
        return _run(model, tokenizer, names, options, log, on_result or (lambda k, r: None),
                    existing or {})


class OutOfMemoryError(ValueError):
    """A task ran out of device memory: ``advice`` names it and the flags to lower (one line);
    ``xla`` is the first line of XLA's ``RESOURCE_EXHAUSTED`` message. ``str()`` is both."""

    def __init__(self, advice: str, xla: str):
        super().__init__(f"{advice}. XLA: {xla}")
        self.advice, self.xla = advice, xla


@contextlib.contextmanager
def _out_of_memory_as(advice: str):
    """Turns XLA's out-of-device-memory error in the block into :class:`OutOfMemoryError`
    (``advice`` and the error's first line); any other error propagates as is."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 - only the out-of-memory error is translated
        if not checkpoint_lib.is_out_of_memory(e):
            raise
        raise OutOfMemoryError(advice, _xla_line(e)) from None


def _xla_line(error: BaseException) -> str:
    """The first line of ``error``'s message (at most 200 characters), or its type's name."""
    text = str(error).strip()
    return text.splitlines()[0][:200] if text else type(error).__name__


def _bucket(base: int, options, model) -> int:
    """Padding multiple of a scorer or generator under ``options.context``
    (:func:`lattn_jax.context_parallel.padding_bucket`: every shard holds the convolution's
    halo)."""
    return context_parallel.padding_bucket(base, options.context, getattr(model, "config", None))


def _niah_samples(tasks: Sequence[str], tokenizer, options,
                  words: Optional[Sequence[str]]) -> Dict[str, list]:
    """Every NIAH prompt of ``tasks`` (:func:`lattn_jax.eval.niah.build_samples`), built before
    anything is scored, so that a length too short for a task's prompt stops the evaluation
    before any work.

    Raises:
      ValueError: naming ``--niah_lengths``, the task, the too-short length and the shortest
        one that fits.
    """
    out = {}
    for t in tasks:
        try:
            out[t] = niah.build_samples(
                t, tokenizer, lengths=options.niah_lengths, depths=options.niah_depths,
                samples_per_cell=options.niah_samples, essay_words=words,
                max_new_tokens=options.niah_max_new_tokens)
        except niah.PromptTooLong as e:
            lengths = ",".join(map(str, options.niah_lengths))
            raise ValueError(
                f"--niah_lengths={lengths}: {e.length} is too short for {e.task}: its prompt "
                f"without haystack has {e.empty} tokens, plus {e.max_new_tokens} answer tokens; "
                f"give lengths of at least {e.shortest} (nothing was scored)") from None
    return out


def _run(model, tokenizer, names, options, log, on_result, existing) -> Dict[str, dict]:
    """:func:`run_evaluation` inside its mesh.

    Raises:
      OutOfMemoryError: a zero-shot task (naming ``--batch_size`` and ``--max_len``), a NIAH
        length (naming it, ``--niah_lengths`` and ``--batch_size``) or a perplexity file
        (naming ``--perplexity_batch_size`` and ``--perplexity_window``) ran out of device
        memory; the tasks finished before it went to ``on_result``.
    """
    scorer = scoring.Scorer(model, max_len=options.max_len, batch_size=options.batch_size,
                            bucket=_bucket(32, options, model), route=options.route)
    results: Dict[str, dict] = {}
    eval_dir = os.path.join(options.data_dir, "eval")
    niah_tasks = [n for n in names if n in niah.TASKS]
    words = None
    if any(t != "niah_single_1" for t in niah_tasks):
        words = niah.load_essays(os.path.join(options.data_dir, "niah", "PaulGrahamEssays"))
    niah_samples = _niah_samples(niah_tasks, tokenizer, options, words)  # before any scoring
    for name in [n for n in names if n in tasks_lib.TASK_NAMES]:
        t0 = time.time()
        docs = tasks_lib.load_task(name, eval_dir, options.sample_items, options.seed)
        if options.sample_items is not None and options.sample_items > len(docs):
            log(f"{name}: --sample_items={options.sample_items} is above the task's "
                f"{len(docs)} items: scoring all {len(docs)} (n={len(docs)})")
        docs = docs[:options.limit]  # the first N (None: all), as the harness's --limit
        pairs = [scoring.encode_pair(tokenizer, c, x) for d in docs for c, x in d.requests]
        longest = max((len(x) for _, x in pairs), default=0)
        if longest > options.max_len:  # was the scorer's "request i: ..." naming no flag
            raise ValueError(f"--max_len={options.max_len}: {name} has a continuation of "
                             f"{longest} tokens, which does not fit; give --max_len >= {longest}")
        with _out_of_memory_as(
                f"{name} ran out of device memory with --batch_size={options.batch_size} "
                f"requests of up to --max_len={options.max_len} tokens per forward pass: rerun "
                f"with a smaller --batch_size (e.g. --batch_size="
                f"{max(1, options.batch_size // 2)})"):
            results[name] = score_task(scorer, name, docs, pairs)
        log(f"{name}: {results[name]} ({time.time() - t0:.0f} s)")
        on_result(name, results[name])
    if niah_tasks:
        t0 = time.time()
        generator = gen_lib.Generator(model, pad_id=tokenizer.eos_id,
                                      bucket=_bucket(64, options, model), route=options.route)

        def generate_fn(prompts, n):
            out = []
            for i in range(0, len(prompts), options.batch_size):
                out += generator.generate(prompts[i:i + options.batch_size], max_new_tokens=n,
                                          stop_tokens=[tokenizer.eos_id]).tokens
            return out

        for t in niah_tasks:  # one task at a time: each is saved before the next runs
            try:
                res = niah.run(generate_fn, tokenizer, tasks=[t], lengths=options.niah_lengths,
                               depths=options.niah_depths, samples_per_cell=options.niah_samples,
                               essay_words=words, max_new_tokens=options.niah_max_new_tokens,
                               samples=niah_samples)
            except niah.OutOfMemory as e:
                smaller = max(1, options.batch_size // 2)
                raise OutOfMemoryError(
                    f"{e.task} ran out of device memory at length {e.length} "
                    f"(--niah_lengths) with --batch_size={options.batch_size} prompts per "
                    f"forward pass: rerun with a smaller --batch_size (e.g. "
                    f"--batch_size={smaller}) or shorter --niah_lengths",
                    _xla_line(e.error)) from None
            results[t] = dict(res[t], chance=0.0)
            log(f"{t}: mean {res[t]['mean']:.3f} per length {res[t]['per_length']}")
            on_result(t, results[t])
        log(f"niah: {time.time() - t0:.0f} s")
    if "perplexity" in names:
        ppl_scorer = scoring.Scorer(model, max_len=options.perplexity_window,
                                    batch_size=options.perplexity_batch_size,
                                    bucket=_bucket(32, options, model), route=options.route)
        paths = [f if f == VALIDATION else _perplexity_path(f, options.data_dir)
                 for f in options.perplexity_files]
        names_of = perplexity_names(paths, existing)
        for f in options.perplexity_files:
            if f == VALIDATION:
                path, seen = VALIDATION, False
                docs = validation_documents(options.training_data)
            else:
                path = _perplexity_path(f, options.data_dir)
                docs = read_documents(path, None)
                seen = trained_on(path, options.training_data)
                if seen:
                    log(f"warning: the checkpoint trains on {path} (config.data.paths); its "
                        "perplexity is a training perplexity, not a held-out one")  # (once)
            if not docs:  # check_data refuses an empty file; the validation split can be one
                raise ValueError(f"perplexity {path}: no documents to score")
            key = perplexity_key(path, options.perplexity_max_docs, len(docs), names_of[path])
            earlier = existing.get(key)
            if isinstance(earlier, dict) and earlier.get("path") is None and path != VALIDATION:
                log(f"perplexity {path}: replaces the earlier {key} in results.json, which "
                    "records no path (scored before entries recorded one)")
            total, docs = len(docs), docs[:options.perplexity_max_docs]
            if len(docs) < total:
                log(f"perplexity {path}: scored the first {len(docs)} of {total} documents "
                    f"(--perplexity_max_docs={options.perplexity_max_docs})")
            with _out_of_memory_as(
                    f"perplexity {path} ran out of device memory with --perplexity_batch_size="
                    f"{options.perplexity_batch_size} windows of --perplexity_window="
                    f"{options.perplexity_window} tokens per forward pass: rerun with a smaller "
                    f"--perplexity_batch_size or --perplexity_window"):
                res = ppl_lib.evaluate(ppl_scorer, tokenizer, docs,
                                       max_len=options.perplexity_window,
                                       stride=options.perplexity_stride)
            res["token_perplexity_chance"] = float(tokenizer.vocab_size)
            res["trained_on"] = seen
            res["documents_total"] = total
            res["max_docs"] = options.perplexity_max_docs
            if path != VALIDATION:
                res.update(file_identity(path))
            results[key] = res
            log(f"perplexity {path}: {res}")
            on_result(key, res)
    return results


def markdown(results: Dict[str, dict], header: str = "") -> str:
    """A markdown report: one table for scores vs chance, one length x depth table per NIAH task.

    The ``chance`` column of a multiple-choice task is ``mean 1 / num_choices``; ``majority``
    beside it is the share of the ``n`` scored items whose answer is their most common answer
    choice (``acc_majority``, :func:`lattn_jax.eval.tasks.process_results`): the score of
    always answering it, the fairer baseline on a ``--limit`` subset or with unbalanced labels
    (BoolQ). A note under the table says so. Results without it (older ``results.json``
    entries) leave the cell empty.

    Results that carry a checkpoint ``step`` (``evaluate.py`` sets it; a merged file may hold
    tasks of several checkpoints) get a ``step`` column, so a score of an older checkpoint than
    the newest (a damaged newest one is skipped with a warning) shows which it is. A
    perplexity of the first documents of a file only (``--perplexity_max_docs``) says so in its
    task cell (``first N of M documents``).
    """
    steps = any(r.get("step") is not None for r in results.values())

    def step(r):  # the step cell of a row, when the table has the column
        return f" {'' if r.get('step') is None else r['step']} |" if steps else ""

    lines = [header, ""] if header else []
    lines += ["| task | metric | value | stderr | chance | majority | n |"
              + (" step |" if steps else ""),
              "|---|---|---:|---:|---:|---:|---:|" + ("---:|" if steps else "")]
    for name, r in results.items():
        if name in tasks_lib.TASK_NAMES:
            for m in ("acc", "acc_norm", "perplexity"):
                if m in r:
                    chance = r.get(f"{m}_chance")
                    if m == "perplexity":
                        chance = "vocab size"
                    chance = f"{chance:.4f}" if isinstance(chance, float) else chance
                    se = r.get(f"{m}_stderr")
                    se = f"{se:.4f}" if isinstance(se, float) else ""
                    majority = r.get(f"{m}_majority")
                    majority = f"{majority:.4f}" if isinstance(majority, float) else ""
                    lines.append(f"| {name} | {m} | {r[m]:.4f} | {se} | {chance} | {majority} "
                                 f"| {r['n']} |" + step(r))
        elif name in niah.TASKS:
            lines.append(f"| {name} | string_match_all (mean) | {r['mean']:.4f} | | 0.0000 | | "
                         f"{len(r['lengths']) * len(r['depths'])} cells |" + step(r))
        elif name.startswith("perplexity:"):
            label = f"{name} (trained on!)" if r.get("trained_on") else name
            if r.get("documents_total") is not None and r["documents"] < r["documents_total"]:
                label += f" (first {r['documents']} of {r['documents_total']} documents)"
            for m in ("token_perplexity", "word_perplexity", "bits_per_byte"):
                chance = f"{r['token_perplexity_chance']:.0f}" if m == "token_perplexity" else ""
                lines.append(f"| {label} | {m} | {r[m]:.4f} | | {chance} | | {r['tokens']} "
                             f"tokens |" + step(r))
    if any(f"{m}_majority" in r for r in results.values() for m in ("acc", "acc_norm")):
        lines += ["", "chance: mean 1 / number of choices; majority: the share of the n items "
                      "whose answer is their most common answer choice (the score of always "
                      "answering it)."]
    for name, r in results.items():
        if name not in niah.TASKS:
            continue
        lines += ["", f"### {name} (string_match_all; rows: length in tokens, columns: depth %)",
                  "", "| length | " + " | ".join(f"{d:g}%" for d in r["depths"]) + " | mean |",
                  "|---:|" + "---:|" * (len(r["depths"]) + 1)]
        for n, row in zip(r["lengths"], r["grid"]):
            lines.append(f"| {n} | " + " | ".join(f"{v:.2f}" for v in row)
                         + f" | {sum(row) / len(row):.2f} |")
    return "\n".join(lines) + "\n"


def read_results(output_dir: str) -> Dict[str, dict]:
    """The earlier results in ``<output_dir>/results.json`` (``{}`` when there is none).

    ``experiments/evaluate.py`` calls it before anything is scored, so that a damaged file is
    reported before the evaluation rather than after it (when the new scores would be lost).

    Raises:
      ValueError: naming the file, when it is not valid JSON or does not hold a JSON object.
    """
    path = os.path.join(output_dir, "results.json")
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        try:
            results = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON ({e}); move it away") from None
    if not isinstance(results, dict):
        raise ValueError(f"{path} does not hold a JSON object; move it away")
    return results


def merge_results(output_dir: str, results: Dict[str, dict]) -> Dict[str, dict]:
    """``results.json`` of ``output_dir`` (if any) updated with ``results``: tasks not re-run
    keep their earlier entries, re-run tasks are replaced.

    Raises:
      ValueError: an existing ``results.json`` that is not a JSON object (:func:`read_results`).
    """
    merged = read_results(output_dir)
    merged.update(results)
    return merged


def write_results(results: Dict[str, dict], output_dir: str, header: str = "") -> List[str]:
    """Merges ``results`` into ``results.json`` (:func:`merge_results`), writes ``results.md``
    for the merged results and ``<niah task>.png`` for the new ones; returns the paths.

    Both files are replaced atomically (written beside and renamed), so an interrupted run leaves
    the earlier files intact.
    """
    os.makedirs(output_dir, exist_ok=True)
    paths = result_paths(results, output_dir)
    merged = merge_results(output_dir, results)
    fetch.write_atomic(paths[0], json.dumps(merged, indent=2))
    fetch.write_atomic(paths[1], markdown(merged, header))
    for name, path in zip([n for n in results if n in niah.TASKS], paths[2:]):
        niah.heatmap_png(results[name], path, name)
    return paths


def result_paths(results: Dict[str, dict], output_dir: str) -> List[str]:
    """The files :func:`write_results` writes for ``results``: ``results.json``,
    ``results.md``, then ``<niah task>.png`` for each NIAH task in ``results``, in order."""
    return ([os.path.join(output_dir, "results.json"), os.path.join(output_dir, "results.md")]
            + [os.path.join(output_dir, f"{n}.png") for n in results if n in niah.TASKS])
