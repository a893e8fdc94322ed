"""Teacher-generated documents as token shards: prompts, the batch loop, filters, resume.

HALO distils a student from a teacher on a corpus; ours is mostly technical text, and the
registries hold little more general prose (``lattn_jax/data/corpora/DATASHEET.md``). Text that
the teacher itself writes about many topics is general prose at any scale.
``experiments/generate_corpus.py`` drives this module with a model (``lattn_jax.halo
.teacher_corpus``); everything here is model-free, so the model enters as a function
(:data:`GenerateFn`).

**Prompts.** Every (topic, template) pair of a topics file (one topic per line) and the
templates (each holds ``{topic}``) gives one prompt: the template with the topic put in,
wrapped in the model's chat format (:class:`ChatFormat`; for SmolLM2-Instruct the GGUF's
``tokenizer.chat_template``), tokenized. Topics are read as UTF-8, stripped, blank lines
skipped; a repeated topic (case-insensitive) is kept once; topics of the exclude file (exact
match after stripping, case-insensitive) are dropped. Prompts longer than ``prompt_len``
tokens are dropped and counted.

**Plan.** The work items are (topic, template, sample) for ``samples_per_prompt`` samples of
every prompt: sample 0 of every prompt in a seeded random order, then sample 1 of every prompt
in the same order, and so on, so that a run cut short by a budget has covered the topics evenly.
Batch ``b`` holds items ``[b * B, (b + 1) * B)``; the last batch is filled up with copies of its
first prompt, whose outputs are discarded (one compiled shape: every batch is ``[B,
prompt_len]``, left-padded). Batch ``b`` is sampled with the seed :func:`batch_seed` ``(seed,
b)``, so the samples of one prompt differ, and a batch gives the same documents whenever and
wherever it runs (on the same backend and dtype).

**Sampling defaults** (:class:`GenerationOptions`). Temperature 1.0: the student is distilled
towards the teacher's distribution, so the text should be a sample of that distribution, not of
a sharpened one; lower temperatures give blander, more repetitive text (less diversity per
prompt, the same phrases across prompts), which a student would learn as if it were the
teacher's. Top-p 0.95 (Holtzman et al. 2020): a 135M teacher puts a few percent of its mass on
a long tail of unlikely tokens, and one draw from it can derail the rest of a document (wrong
language, broken words); cutting the last 5% of the mass keeps almost all of the distribution
and removes most of those derailments. No top-k (the nucleus already adapts to the entropy).
``max_new_tokens`` 512 bounds the decode steps of a batch (every batch runs until its longest
row stops): SmolLM2-135M-Instruct sampled so rarely stops on its own (7 of 8 expository answers
ran past 768 tokens, on CPU, 2026-12-02) and drifts off topic after a few hundred tokens, so a
longer limit buys mostly incoherent text and a larger KV cache. ``min_tokens`` 64 drops
refusals and one-line answers.

**Documents.** A row's document is its continuation only (no prompt tokens), without the stop
token that ended it (the pipeline appends EOS after every document, ``pipeline.pack_documents``,
as for every other corpus). Then, in this order, a row is dropped and counted when it did not
stop before ``max_new_tokens`` and ``drop_unfinished`` is set (``unfinished``), when it has
fewer than ``min_tokens`` tokens (``short``), or when one of its paragraphs shares a word
13-gram with an evaluation set (``contaminated``: the corpus builder's check,
:class:`Decontaminator`). Unfinished rows are kept by default (counted as
``unfinished_kept``): they are cut mid-sentence, like any document cut at a length limit.

**Output.** A token-shard directory (``lattn_jax.data.shards``): batch ``b``'s kept documents
are the shard ``<source_name>-<b:06d>`` (``.tokens.bin`` + ``.offsets.npy``, plus
``.prompts.npy``: int32 ``[documents, 3]``, the (topic, template, sample) of each document,
:func:`read_prompts`; every shard's manifest ``name`` is ``source_name``, so
``data.source_weights={source_name: w}`` weighs all of them), and ``manifest.json`` has the
usual fields plus ``generation``: the plan (model file and sha256, tokenizer, chat format,
templates, sampling, seed, batch size, topics file sha256, evaluation files and their sha256),
counts, and one record per run. Each shard entry records its batch, seed, rows, generated
tokens and drop counts. Read it with ``open_corpus`` or as ``data.paths`` next to the corpus.

**Resume.** Shards are written as batches finish (temporary names, renamed when complete; the
manifest rewritten atomically after each), so a run stopped at any point (a kill, an error,
``deadline``) keeps every finished batch, and a rerun with the same plan skips them and
continues: the shards equal those of an uninterrupted run. A different plan in the same
directory is refused, naming the fields that differ. ``max_documents`` / ``max_tokens`` (kept
documents / tokens over all runs) stop after the batch that reaches them; a rerun with a larger
budget continues. ``resume_manifest`` (the manifest of a run on another machine, whose shards
came back separately) counts its batches as done here too, so calls on fresh machines continue
one plan; :func:`pack_new_shards` sends each run's new shards as compressed pieces.
"""

import collections
import dataclasses
import functools
import hashlib
import json
import math
import os
import re
import time
from collections.abc import Callable, Sequence

import numpy as np

from lattn_jax.data import shards
from lattn_jax.data import tokenizers
from lattn_jax.data.corpora import build as build_lib
from lattn_jax.data.corpora import clean
from lattn_jax.data.corpora import fetch
from lattn_jax.data.corpora import pieces as pieces_lib

__all__ = [
    "CHAT_FORMATS",
    "DEFAULT_TEMPLATES",
    "ChatFormat",
    "Decontaminator",
    "GenerateFn",
    "GenerationOptions",
    "Topics",
    "batch_seed",
    "build_prompts",
    "generate_corpus",
    "load_topics",
    "pack_new_shards",
    "plan_items",
    "read_prompts",
    "stop_token_ids",
]

# Expository prompts: encyclopedic and textbook registers, the kind of general text that the
# corpus lacks and WikiText-2 measures. ``{topic}`` is replaced by the topic.
DEFAULT_TEMPLATES = (
    "Write an encyclopedia article about {topic}. Explain what it is, its history and why it "
    "matters.",
    "Explain {topic} to a curious high-school student in a few well-organised paragraphs.",
    "Write a section of a textbook about {topic}, with clear explanations and examples.",
)

CHAT_FORMATS = ("auto", "gguf", "chatml", "none")
# Special-token markers that end a turn or a document; those that are single tokens of the
# tokenizer stop a row, besides EOS.
_CHATML_MARKERS = ("<|im_end|>", "<|im_start|>", "<|endoftext|>")

# (prompt ids [B, P] int32, mask [B, P] bool, seed) -> (tokens per row, finished per row): the
# row's generated ids up to and including the stop token that ended it, and whether one did.
GenerateFn = Callable[[np.ndarray, np.ndarray, int], tuple[list[list[int]], list[bool]]]


@dataclasses.dataclass(frozen=True, kw_only=True)
class GenerationOptions:
    """What to generate and how; every field is part of the plan (see the module docstring).

    Attributes:
      templates: prompt templates, each holding ``{topic}`` (``--template``).
      samples_per_prompt: samples of every (topic, template) prompt (``--samples_per_prompt``).
      seed: seed of the item order and of every batch's sampling (``--seed``).
      batch_size: rows per batch, ``B`` (``--batch_size``).
      prompt_len: the padded prompt length ``P`` in tokens; longer prompts are dropped
        (``--prompt_len``).
      max_new_tokens: the most tokens generated per row (``--max_new_tokens``).
      min_tokens: documents with fewer tokens are dropped (``--min_tokens``).
      drop_unfinished: drop rows that hit ``max_new_tokens`` (``--drop_unfinished``).
      temperature: sampling temperature, a finite number > 0 (``--temperature``).
      top_p: nucleus mass in ``(0, 1]`` (``--top_p``).
      top_k: keep the ``k`` most likely tokens (0: all) (``--top_k``).
      source_name: the shards' manifest name, for ``data.source_weights`` (``--source_name``).

    Raises:
      ValueError: naming the flag, for an out-of-range value or a template without ``{topic}``.
    """

    templates: tuple[str, ...] = DEFAULT_TEMPLATES
    samples_per_prompt: int = 1
    seed: int = 0
    batch_size: int = 64
    prompt_len: int = 96
    max_new_tokens: int = 512
    min_tokens: int = 64
    drop_unfinished: bool = False
    temperature: float = 1.0
    top_p: float = 0.95
    top_k: int = 0
    source_name: str = "teacher"

    def __post_init__(self):
        object.__setattr__(self, "templates", tuple(self.templates))
        if not self.templates:
            raise ValueError("--template: give at least one prompt template")
        for t in self.templates:
            if "{topic}" not in t:
                raise ValueError(f"--template: {t!r} has no {{topic}} placeholder")
        for flag, value, low in (("samples_per_prompt", self.samples_per_prompt, 1),
                                 ("batch_size", self.batch_size, 1),
                                 ("prompt_len", self.prompt_len, 1),
                                 ("max_new_tokens", self.max_new_tokens, 1),
                                 ("min_tokens", self.min_tokens, 1),
                                 ("top_k", self.top_k, 0), ("seed", self.seed, 0)):
            if not isinstance(value, (int, np.integer)) or value < low:
                raise ValueError(f"--{flag} must be an integer >= {low}, got {value!r}")
        t = self.temperature
        # inf was accepted (and sampled uniformly over the vocabulary: noise for a corpus).
        if (isinstance(t, bool) or not isinstance(t, (int, float, np.integer, np.floating))
                or not (math.isfinite(t) and t > 0)):
            raise ValueError(f"--temperature must be a finite number > 0 (sampling; greedy "
                             f"decoding would give one document per prompt), got {t!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"--top_p must be in (0, 1], got {self.top_p}")
        if not self.source_name or not all(c.isalnum() or c in "_.-" for c in self.source_name):
            raise ValueError(f"--source_name must be letters, digits, '_', '.' or '-', got "
                             f"{self.source_name!r}")

    def sampling(self) -> dict:
        """The sampling fields as a dict (for the manifest and the model side)."""
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                "max_new_tokens": self.max_new_tokens}


@dataclasses.dataclass(frozen=True)
class ChatFormat:
    """How a user prompt becomes the model's input text.

    Attributes:
      name: ``"gguf"`` (``template`` is the model file's Jinja ``tokenizer.chat_template``),
        ``"chatml"`` (``<|im_start|>user\\n...<|im_end|>\\n<|im_start|>assistant\\n``) or
        ``"none"`` (the prompt as it is: base models).
      template: the Jinja source for ``"gguf"``.
      system_prompt: a system message (``None``: the template's default, if any).
    """

    name: str
    template: str | None = None
    system_prompt: str | None = None

    def render(self, prompt: str) -> str:
        """The input text for one user ``prompt`` (with the assistant turn opened)."""
        messages = ([{"role": "system", "content": self.system_prompt}]
                    if self.system_prompt else []) + [{"role": "user", "content": prompt}]
        if self.name == "none":
            return prompt
        if self.name == "chatml":
            return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n"
                           for m in messages) + "<|im_start|>assistant\n"
        return _jinja(self.template).render(messages=messages, add_generation_prompt=True,
                                            bos_token="", eos_token="")

    def describe(self) -> dict:
        return {"name": self.name, "template": self.template,
                "system_prompt": self.system_prompt}

    @classmethod
    def make(cls, kind: str, gguf_template: str | None = None,
             system_prompt: str | None = None) -> "ChatFormat":
        """The format for ``--chat_format=kind``.

        ``"auto"`` is ``"gguf"`` when the model file carries ``tokenizer.chat_template``, else
        ``"none"``.

        Raises:
          ValueError: an unknown kind, ``"gguf"`` without a template, or a system prompt with
            ``"none"`` (naming ``--chat_format`` / ``--system_prompt``).
        """
        if kind not in CHAT_FORMATS:
            raise ValueError(f"--chat_format: expected one of {', '.join(CHAT_FORMATS)}, got "
                             f"{kind!r}")
        if kind == "auto":
            kind = "gguf" if gguf_template else "none"
        if kind == "gguf" and not gguf_template:
            raise ValueError("--chat_format=gguf: the model file has no tokenizer.chat_template "
                             "(use chatml or none)")
        if kind == "none" and system_prompt:
            raise ValueError("--system_prompt needs a chat format (--chat_format=gguf/chatml)")
        fmt = cls(kind, gguf_template if kind == "gguf" else None, system_prompt or None)
        fmt.render("{topic}")  # a template that does not render fails here, not mid-run
        return fmt


@functools.lru_cache(maxsize=8)
def _jinja(source: str):
    """The compiled chat template, in the sandbox Hugging Face renders chat templates in
    (compiled once: compiling costs about 5 ms, 150 s for the 30,000 prompts of a plan)."""
    try:
        from jinja2 import sandbox
    except ImportError as e:
        raise ImportError("--chat_format=gguf renders the GGUF's chat template with jinja2: "
                          "pip install -e '.[data]'") from e

    def raise_exception(message):
        raise ValueError(f"--chat_format=gguf: the chat template raised: {message}")

    env = sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(source)


def stop_token_ids(tokenizer: tokenizers.Tokenizer, chat: ChatFormat) -> list[int]:
    """The ids that end a row: EOS, and with a chat format the turn and document markers
    (``<|im_end|>``, ``<|im_start|>``, ``<|endoftext|>`` and any ``<|...|>`` marker of the
    template) that are single tokens of ``tokenizer``. Sorted."""
    stop = {int(tokenizer.eos_id)}
    if chat.name != "none":
        markers = set(_CHATML_MARKERS) | set(re.findall(r"<\|[A-Za-z0-9_]+\|>",
                                                        chat.template or ""))
        for m in sorted(markers):
            ids = tokenizer.encode(m)
            if len(ids) == 1:
                stop.add(int(ids[0]))
    return sorted(stop)


@dataclasses.dataclass
class Topics:
    """The topics of a plan.

    Attributes:
      topics: the topics, in file order, after de-duplication and exclusion.
      info: the file's name and sha256, and the counts (lines, blank, duplicates, excluded),
        with the exclude file's name, sha256 and entries.
    """

    topics: list[str]
    info: dict


def _read_lines(path: str, flag: str) -> list[str]:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{flag}: no such file: {path}")
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().splitlines()
    except UnicodeDecodeError as e:
        raise ValueError(f"{flag}: {path} is not UTF-8 text: {e}") from e


def load_topics(path: str, exclude_path: str | None = None) -> Topics:
    """Reads a topics file (one topic per line) and drops the topics of ``exclude_path``.

    Args:
      path: UTF-8 text, one topic per line (``--topics``).
      exclude_path: optional UTF-8 text, one topic per line (``--exclude_topics``); a topic
        equal to one of them after stripping, ignoring case (``str.casefold``), is dropped.

    Returns:
      :class:`Topics`.

    Raises:
      FileNotFoundError: a file is missing. ValueError: not UTF-8, or no topic left (named).
    """
    lines = _read_lines(path, "--topics")
    seen, topics, duplicates, blank = set(), [], 0, 0
    for line in lines:
        t = line.strip()
        if not t:
            blank += 1
        elif t.casefold() in seen:
            duplicates += 1
        else:
            seen.add(t.casefold())
            topics.append(t)
    info = {"file": os.path.basename(path), "sha256": fetch.sha256_file(path),
            "lines": len(lines), "blank": blank, "duplicates": duplicates, "excluded": 0}
    if exclude_path:
        excluded = {t.strip().casefold() for t in _read_lines(exclude_path, "--exclude_topics")
                    if t.strip()}
        kept = [t for t in topics if t.casefold() not in excluded]
        info.update(excluded=len(topics) - len(kept), exclude_file=os.path.basename(exclude_path),
                    exclude_sha256=fetch.sha256_file(exclude_path), exclude_entries=len(excluded))
        topics = kept
    if not topics:
        raise ValueError(f"--topics: no topic left in {path} ({info})")
    info["topics"] = len(topics)
    return Topics(topics=topics, info=info)


def build_prompts(topics: Sequence[str], templates: Sequence[str], chat: ChatFormat,
                  tokenizer: tokenizers.Tokenizer, prompt_len: int
                  ) -> tuple[dict[tuple[int, int], list[int]], list[tuple[int, int]]]:
    """Tokenized prompts of every (topic, template) pair.

    Returns:
      ``(prompts, too_long)``: ``{(topic index, template index): ids}`` for prompts of at most
      ``prompt_len`` tokens, and the pairs of the longer ones (dropped).
    """
    pairs = [(i, j) for i in range(len(topics)) for j in range(len(templates))]
    texts = [chat.render(templates[j].replace("{topic}", topics[i])) for i, j in pairs]
    prompts, too_long = {}, []
    for pair, ids in zip(pairs, tokenizer.encode_batch(texts)):
        if len(ids) > prompt_len:
            too_long.append(pair)
        else:
            prompts[pair] = [int(i) for i in ids]
    return prompts, too_long


def plan_items(pairs: Sequence[tuple[int, int]], samples: int, seed: int
               ) -> list[tuple[int, int, int]]:
    """The work items ``(topic, template, sample)``: every pair once per sample, the pairs in
    one seeded random order (``numpy.random.default_rng([seed, 1])``), sample by sample."""
    pairs = sorted(pairs)
    order = np.random.default_rng([int(seed), 1]).permutation(len(pairs))
    return [(*pairs[k], s) for s in range(samples) for k in order]


def batch_seed(seed: int, batch: int) -> int:
    """The sampling seed of batch ``batch``: ``SeedSequence([seed, batch])``'s first uint32."""
    return int(np.random.SeedSequence([int(seed), int(batch)]).generate_state(1)[0])


class Decontaminator:
    """The corpus builder's contamination check (``clean.ContaminationIndex``: word 13-grams of
    every evaluation item, 8-grams of shorter items) applied to generated documents.

    Args:
      eval_paths: evaluation files or directories (``build.read_eval_items``: the set of a
        file is its first directory below the given path).
      ngram: n of the n-grams (the builder's 13).

    Raises:
      FileNotFoundError: a path does not exist (named).
    """

    def __init__(self, eval_paths: Sequence[str], ngram: int = 13):
        self.index = clean.ContaminationIndex(build_lib.read_eval_items(eval_paths), n=ngram)
        self.ngram = ngram
        files = []
        for top in eval_paths:
            names = ([top] if os.path.isfile(top)
                     else [os.path.join(top, r) for r in fetch.relative_files(top)])
            files += [[os.path.relpath(f, top) if f != top else os.path.basename(f),
                       fetch.sha256_file(f)] for f in names]
        self.files = sorted(files)

    def check(self, text: str) -> str | None:
        """The evaluation set that one of ``text``'s paragraphs shares an n-gram with, or
        ``None`` (the first paragraph that hits decides)."""
        for p in clean.paragraphs(text):
            before = collections.Counter(self.index.hits)
            if self.index.contaminated(p):
                return next(iter(self.index.hits - before))
        return None

    def describe(self) -> dict:
        return {"ngram": self.ngram, "eval_files": self.files,
                "sets": {name: {"items": self.index.items_per_set[name],
                                "uncheckable_items": self.index.uncheckable[name]}
                         for name in self.index.sets}}


def _plan_dict(options: GenerationOptions, model: dict, tokenizer: tokenizers.Tokenizer,
               chat: ChatFormat, stop: Sequence[int], topics: Topics,
               decontaminator: Decontaminator | None) -> dict:
    return {"model": model, "tokenizer": tokenizer.describe(), "chat": chat.describe(),
            "stop_tokens": list(stop), "templates": list(options.templates),
            "sampling": options.sampling(), "seed": options.seed,
            "samples_per_prompt": options.samples_per_prompt, "batch_size": options.batch_size,
            "prompt_len": options.prompt_len, "min_tokens": options.min_tokens,
            "drop_unfinished": options.drop_unfinished, "source_name": options.source_name,
            "topics": {k: v for k, v in topics.info.items()},
            "topics_sha256": hashlib.sha256("\n".join(topics.topics).encode()).hexdigest(),
            "item_order": "numpy default_rng([seed, 1]).permutation of the sorted (topic, "
                          "template) pairs, repeated per sample",
            "batch_seed": "numpy SeedSequence([seed, batch]).generate_state(1)[0]",
            "decontamination": decontaminator.describe() if decontaminator else None}


def _complete(directory: str, entry: dict, dtype: np.dtype) -> bool:
    tokens = os.path.join(directory, entry["token_file"])
    return (os.path.isfile(tokens)
            and os.path.getsize(tokens) == entry["tokens"] * dtype.itemsize
            and all(os.path.isfile(os.path.join(directory, entry[k]))
                    for k in ("offsets_file", "prompts_file")))


_COUNTS = ("rows", "generated_tokens", "finished_rows", "unfinished_kept", "dropped_unfinished",
           "dropped_short", "dropped_contaminated")


def _counts(entries: Sequence[dict], batches: int, prompts: int, too_long: int) -> dict:
    out = {"batches_total": batches, "batches_done": len(entries), "prompts": prompts,
           "prompts_too_long": too_long, "kept_documents": 0, "kept_tokens": 0}
    out.update({k: 0 for k in _COUNTS})
    contaminated = collections.Counter()
    for e in entries:
        out["kept_documents"] += e["documents"]
        out["kept_tokens"] += e["tokens"]
        for k in _COUNTS:
            out[k] += e[k]
        contaminated.update(e["contaminated_by"])
    out["contaminated_by_set"] = dict(sorted(contaminated.items()))
    return out


def generate_corpus(generate_fn: GenerateFn, tokenizer: tokenizers.Tokenizer,
                    topics: Topics, output_dir: str, *, options: GenerationOptions,
                    chat: ChatFormat, model: dict,
                    decontaminator: Decontaminator | None = None,
                    max_documents: int | None = None, max_tokens: int | None = None,
                    deadline: float | None = None, resume_manifest: str | None = None,
                    run_info: dict | None = None, print_fn=print) -> dict:
    """Generates the plan's batches into token shards in ``output_dir``, resuming.

    Args:
      generate_fn: samples a ``[B, P]`` batch (:data:`GenerateFn`).
      tokenizer: the model's tokenizer (prompts, stop tokens, the text of the contamination
        check; its sha256 goes into the manifest, and the data pipeline checks it).
      topics: from :func:`load_topics`.
      output_dir: the token-shard directory (created).
      options: the :class:`GenerationOptions`.
      chat: the :class:`ChatFormat`.
      model: the model's identity for the manifest (file name, sha256, dtype...).
      decontaminator: the evaluation-set check (``None``: no check, recorded as such).
      max_documents, max_tokens: stop once the kept documents / tokens (over all runs) reach
        these (after the batch that does).
      deadline: a ``time.time()`` value; stop after the batch that ends past it.
      resume_manifest: a manifest of the same plan written elsewhere; its batches count as
        done (their shards are not needed here, now or in later runs in ``output_dir``:
        ``generation.batches_elsewhere`` lists them).
      run_info: extra fields for this run's record (command line, devices).
      print_fn: where the per-batch lines go.

    Returns:
      ``{"status": "complete" | "budget" | "deadline", "manifest": ..., "new_files": [...],
      "new_batches": [...], "generated_tokens", "seconds", "tokens_per_s"}`` of this run.

    Raises:
      ValueError: ``output_dir`` or ``resume_manifest`` holds another plan (the differing
        fields named), or a bad budget.
    """
    for flag, value in (("max_documents", max_documents), ("max_tokens", max_tokens)):
        if value is not None and value < 1:
            raise ValueError(f"--{flag} must be >= 1, got {value}")
    started = time.time()
    stop = stop_token_ids(tokenizer, chat)
    stop_set = set(stop)
    prompts, too_long = build_prompts(topics.topics, options.templates, chat, tokenizer,
                                      options.prompt_len)
    if not prompts:
        raise ValueError(f"--prompt_len: every prompt is longer than {options.prompt_len} "
                         "tokens")
    items = plan_items(list(prompts), options.samples_per_prompt, options.seed)
    b_size = options.batch_size
    num_batches = -(-len(items) // b_size)
    plan = _plan_dict(options, model, tokenizer, chat, stop, topics, decontaminator)
    plan["prompts_too_long"] = len(too_long)
    dtype = shards.token_dtype(tokenizer.vocab_size)

    os.makedirs(output_dir, exist_ok=True)
    done: dict[int, dict] = {}
    runs: list = []
    # Batches whose shards another machine wrote (a resume manifest's, now or in an earlier
    # run here): done without their files here. Any other listed batch whose files are
    # missing or short is generated again.
    elsewhere: set[int] = set()
    sources = []
    if resume_manifest:
        sources.append((_read_json(resume_manifest), resume_manifest, False))
    if shards.is_token_dir(output_dir):
        sources.append((shards.read_manifest(output_dir), output_dir, True))
    for old, where, local in sources:  # the resume manifest first, then this directory's
        _check_plan(old, plan, where)
        runs = list(old["generation"].get("runs", [])) or runs
        if local:
            elsewhere.update(b for first, end in old["generation"].get("batches_elsewhere", [])
                             for b in range(first, end))
        for e in old["shards"]:
            if not local:
                elsewhere.add(e["batch"])
            if not local or e["batch"] in elsewhere or _complete(output_dir, e, dtype):
                done[e["batch"]] = e
    manifest = {"format": shards.FORMAT, "version": shards.VERSION, "dtype": dtype.name,
                "tokenizer": tokenizer.describe(), "options": {"format": "generated"},
                "shards": [], "totals": {}, "generation": {"plan": plan, "runs": runs}}
    if elsewhere:
        manifest["generation"]["batches_elsewhere"] = _ranges(elsewhere & set(done))

    def write():
        entries = [done[b] for b in sorted(done)]
        manifest["shards"] = entries
        manifest["totals"] = {"documents": sum(e["documents"] for e in entries),
                              "tokens": sum(e["tokens"] for e in entries),
                              "shards": len(entries)}
        manifest["generation"]["counts"] = _counts(entries, num_batches, len(prompts),
                                                   len(too_long))
        shards.write_manifest(output_dir, manifest)

    record = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
              **(run_info or {}), "batches": [], "generated_tokens": 0, "seconds": 0.0}
    runs.append(record)
    new_files, new_batches = [], []
    status = "complete"
    gen_tokens, gen_seconds, first = 0, 0.0, None
    print_fn(f"plan: {len(topics.topics):,} topics x {len(options.templates)} templates x "
             f"{options.samples_per_prompt} samples = {len(items):,} rows in {num_batches:,} "
             f"batches of {b_size} ({len(too_long)} prompts over {options.prompt_len} tokens "
             f"dropped); {len(done)} batches done before")
    for b in range(num_batches):
        if b in done:
            continue
        if ((max_documents is not None
             and sum(e["documents"] for e in done.values()) >= max_documents)
                or (max_tokens is not None
                    and sum(e["tokens"] for e in done.values()) >= max_tokens)):
            status = "budget"
            break
        if deadline is not None and time.time() >= deadline:
            status = "deadline"
            break
        batch = items[b * b_size:(b + 1) * b_size]
        rows = len(batch)
        tokens = np.full((b_size, options.prompt_len), tokenizer.eos_id, np.int32)
        mask = np.zeros((b_size, options.prompt_len), bool)
        for r in range(b_size):  # rows past the items repeat the first prompt (discarded)
            topic, template, _ = batch[r] if r < rows else batch[0]
            ids = prompts[(topic, template)]
            tokens[r, options.prompt_len - len(ids):] = ids
            mask[r, options.prompt_len - len(ids):] = True
        seed = batch_seed(options.seed, b)
        t0 = time.perf_counter()
        out_tokens, out_finished = generate_fn(tokens, mask, seed)
        seconds = time.perf_counter() - t0
        entry = _write_batch(output_dir, b, seed, batch, out_tokens[:rows], out_finished[:rows],
                             tokenizer, options, stop_set, decontaminator, dtype)
        entry["seconds"] = round(seconds, 3)
        done[b] = entry
        new_files += [entry["token_file"], entry["offsets_file"], entry["prompts_file"]]
        new_batches.append(b)
        gen_tokens += entry["generated_tokens"]
        gen_seconds += seconds
        first = first or (entry["generated_tokens"], seconds)  # includes the compilation
        steps = max((len(t) for t in out_tokens), default=0)
        record.update(batches=_ranges(new_batches), generated_tokens=gen_tokens,
                      seconds=round(time.time() - started, 1),
                      generate_seconds=round(gen_seconds, 1),
                      tokens_per_s=round(gen_tokens / gen_seconds, 1),
                      tokens_per_s_after_first_batch=(
                          round((gen_tokens - first[0]) / (gen_seconds - first[1]), 1)
                          if len(new_batches) > 1 else None))
        write()  # the batch is done from here on
        counts = manifest["generation"]["counts"]
        used = entry["generated_tokens"] / max(steps * b_size, 1)
        print_fn(f"batch {b + 1}/{num_batches}: {entry['generated_tokens']:,} tokens in "
                 f"{seconds:.1f} s = {entry['generated_tokens'] / max(seconds, 1e-9):,.0f} "
                 f"tokens/s ({steps} steps; {used:.0%} of the {b_size} x {steps} slots); kept "
                 f"{entry['documents']}/{rows} (short {entry['dropped_short']}, unfinished "
                 f"{entry['dropped_unfinished']}, contaminated {entry['dropped_contaminated']});"
                 f" total {counts['kept_documents']:,} documents, {counts['kept_tokens']:,} "
                 "tokens")
        if deadline is not None and time.time() >= deadline and len(done) < num_batches:
            status = "deadline"
            break
    record.update(status=status, seconds=round(time.time() - started, 1))
    write()
    return {"status": status, "manifest": manifest, "new_files": new_files,
            "new_batches": new_batches, "generated_tokens": gen_tokens,
            "seconds": round(time.time() - started, 1),
            "tokens_per_s": gen_tokens / gen_seconds if gen_seconds else 0.0,
            "tokens_per_s_after_first_batch": record.get("tokens_per_s_after_first_batch")}


def _read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"--resume_manifest: {path}: unreadable: {e}") from e
    if not isinstance(manifest, dict) or manifest.get("format") != shards.FORMAT:
        raise ValueError(f"--resume_manifest: {path} is not a token-shard manifest")
    return manifest


def _check_plan(old: dict, plan: dict, where: str) -> None:
    """Raises ``ValueError`` naming the plan fields that differ between ``old`` and ``plan``."""
    old_plan = (old.get("generation") or {}).get("plan")
    if old_plan is None:
        raise ValueError(f"{where} holds token shards that were not generated by "
                         "generate_corpus; use another --output_dir")
    current = json.loads(json.dumps(plan))  # tuples -> lists, as read back
    differ = sorted(k for k in set(old_plan) | set(current)
                    if old_plan.get(k) != current.get(k))
    if differ:
        raise ValueError(f"{where} holds documents of another plan (it differs in: "
                         f"{', '.join(differ)}); give the same flags and files to continue it, "
                         "or use another --output_dir")


def _ranges(batches: Sequence[int]) -> list[list[int]]:
    """Sorted batch indices as ``[first, end)`` runs."""
    out = []
    for b in sorted(batches):
        if out and out[-1][1] == b:
            out[-1][1] = b + 1
        else:
            out.append([b, b + 1])
    return out


def _write_batch(output_dir, b, seed, batch, out_tokens, out_finished, tokenizer, options,
                 stop_set, decontaminator, dtype) -> dict:
    """Filters one batch's rows and writes the kept ones as shard ``<source>-<b>``."""
    writer = shards.ShardWriter(output_dir, f"{options.source_name}-{b:06d}", dtype)
    entry = {k: 0 for k in _COUNTS}
    contaminated = collections.Counter()
    kept_items = []
    try:
        for item, ids, finished in zip(batch, out_tokens, out_finished):
            ids = [int(i) for i in ids]
            entry["rows"] += 1
            entry["generated_tokens"] += len(ids)
            if finished and ids and ids[-1] in stop_set:
                ids = ids[:-1]
                entry["finished_rows"] += 1
            elif options.drop_unfinished:
                entry["dropped_unfinished"] += 1
                continue
            if len(ids) < options.min_tokens:
                entry["dropped_short"] += 1
                continue
            if decontaminator is not None:
                hit = decontaminator.check(tokenizer.decode(ids))
                if hit is not None:
                    entry["dropped_contaminated"] += 1
                    contaminated[hit] += 1
                    continue
            if not finished:
                entry["unfinished_kept"] += 1
            writer.add(np.asarray(ids, np.int64))
            kept_items.append(list(item))
    except BaseException:
        writer.abort()
        raise
    prompts_file = f"{writer.name}.prompts.npy"
    tmp = os.path.join(output_dir, prompts_file + ".tmp.npy")
    np.save(tmp, np.asarray(kept_items, np.int32).reshape(-1, 3))
    os.replace(tmp, os.path.join(output_dir, prompts_file))
    entry = {**writer.finish(), "prompts_file": prompts_file, "name": options.source_name,
             "batch": b, "batch_seed": seed, **entry,
             "contaminated_by": dict(sorted(contaminated.items()))}
    return entry


def read_prompts(directory: str, entry: dict) -> np.ndarray:
    """int32 ``[documents, 3]``: the (topic, template, sample) of each document of one shard
    (``entry`` of the manifest's ``shards``; topic and template index the plan's topics, after
    de-duplication and exclusion, and templates)."""
    return np.load(os.path.join(directory, entry["prompts_file"]))


def pack_new_shards(output_dir: str, new_files: Sequence[str], pieces_dir: str, *,
                    new_batches: Sequence[int], piece_bytes: int, preset: int = 0) -> dict:
    """Packs this run's new shard files and the manifest into compressed pieces.

    The pieces (``lattn_jax.data.corpora.pieces``: a deterministic ``tar.xz`` cut into files of
    at most ``piece_bytes``, plus a ``.pieces.json`` with every sha256) are named
    ``<dir>.<first>-<end>.tar.xz.NNN`` after the batches they hold (``<dir>.manifest`` when no
    batch is new). xz preset 0 by default: token ids compress little whatever the preset
    (about 0.67 of their size at 0, 0.63 at 6, on Zipf-distributed ids), and preset 6 packs
    only about 0.6 MB/s on one core (a minute for the 40 MB of a 20M-token call) against about
    5 MB/s at 0. ``experiments/corpus_pieces.py --mode=join`` of each run's
    ``.pieces.json``, in run order, into one directory rebuilds the whole shard directory (each
    run's manifest lists every shard so far).

    Returns:
      The pieces manifest.
    """
    name = os.path.basename(os.path.normpath(output_dir))
    stem = (f"{name}.{min(new_batches):06d}-{max(new_batches) + 1:06d}" if new_batches
            else f"{name}.manifest")
    return pieces_lib.split_directory(output_dir, pieces_dir, name=name, piece_bytes=piece_bytes,
                                      preset=preset, files=list(new_files) + [shards.MANIFEST],
                                      stem=stem)
