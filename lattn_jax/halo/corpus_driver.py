"""The driver behind ``experiments/generate_corpus.py``: sample a teacher into token shards.

:func:`run` takes the binary's flags as one :class:`GenerateRequest` and does what one
invocation does: checks the options (each error a ``ValueError`` naming its flag), reads the
topics, builds the decontamination check (the bundled WikiText-2 test split plus
``eval_data``), loads the model (:func:`lattn_jax.halo.teacher_corpus.load_model`: a GGUF file
or a training workdir), wraps the prompts in its chat format, generates the plan's batches into
``output_dir`` (:func:`lattn_jax.data.generated.generate_corpus`: resumable, with a document,
token or time budget), optionally packs this run's new shards into compressed pieces
(:func:`~lattn_jax.data.generated.pack_new_shards`) and prints one summary line.

It lives in :mod:`lattn_jax.halo` next to :mod:`~lattn_jax.halo.teacher_corpus` because it joins
the model side to :mod:`lattn_jax.data.generated`, which is model-free (``lattn_jax.data`` does
not import the model packages).
"""

import dataclasses
import os
import shlex
import time
from typing import Callable, Optional, Sequence

import jax

from lattn_jax import assets
from lattn_jax.data import generated
from lattn_jax.data.corpora import build
from lattn_jax.halo import teacher_corpus

_D = generated.GenerationOptions()
# Exit status of a run that the deadline stopped: run the same command again.
EXIT_DEADLINE = 3


@dataclasses.dataclass(frozen=True, kw_only=True)
class GenerateRequest:
    """One invocation's options (the binary's flags, one field each, same names).

    Attributes:
      model: a GGUF file or a lattn-jax training workdir.
      output_dir: the token-shard directory (resumed).
      step: checkpoint step of a workdir (``None``: the newest); an error for a GGUF file.
      dtype: compute and parameter dtype, one of :data:`lattn_jax.halo.teacher_corpus.DTYPES`.
      topics: the topics file, one per line (UTF-8; an ``assets`` path is resolved).
      exclude_topics: a file of topics to drop (exact match, case-insensitive), or ``None``.
      templates: prompt templates, each with ``{topic}``.
      chat_format: one of :data:`lattn_jax.data.generated.CHAT_FORMATS`.
      system_prompt: the system message, or ``None`` (the template's).
      samples_per_prompt, seed, batch_size, prompt_len, max_new_tokens, min_tokens, top_k,
        temperature, top_p, drop_unfinished, source_name: the
        :class:`~lattn_jax.data.generated.GenerationOptions` fields.
      decode_chunk: decode steps per compiled call (> 0).
      max_documents, max_tokens: stop at this many kept documents / tokens (``None``: no limit).
      deadline_s: stop after the batch that ends this many seconds (wall clock) after the start
        of :func:`run` (> 0; ``None``: no deadline).
      eval_data: evaluation sets for the 13-gram check, besides the bundled WikiText-2 test.
      decontaminate: drop documents sharing a 13-gram with an evaluation set.
      resume_manifest: ``manifest.json`` of an earlier run of this plan elsewhere, or ``None``.
      pieces_dir: also pack this run's new shards into compressed pieces here, or ``None``.
      piece_mib: the largest piece, MiB (> 0).
      compilation_cache: persistent JAX compilation cache directory, or ``None`` / ``""``.
    """

    model: str
    output_dir: str
    step: Optional[int] = None
    dtype: str = "auto"
    topics: str = assets.BUNDLED + assets.VITAL_TOPICS
    exclude_topics: Optional[str] = None
    templates: Sequence[str] = _D.templates
    chat_format: str = "auto"
    system_prompt: Optional[str] = None
    samples_per_prompt: int = _D.samples_per_prompt
    seed: int = _D.seed
    batch_size: int = _D.batch_size
    prompt_len: int = _D.prompt_len
    max_new_tokens: int = _D.max_new_tokens
    min_tokens: int = _D.min_tokens
    top_k: int = _D.top_k
    temperature: float = _D.temperature
    top_p: float = _D.top_p
    drop_unfinished: bool = False
    source_name: str = _D.source_name
    decode_chunk: int = 16
    max_documents: Optional[int] = None
    max_tokens: Optional[int] = None
    deadline_s: Optional[float] = None
    eval_data: Sequence[str] = ()
    decontaminate: bool = True
    resume_manifest: Optional[str] = None
    pieces_dir: Optional[str] = None
    piece_mib: int = 16
    compilation_cache: Optional[str] = None


def check_options(request: GenerateRequest) -> generated.GenerationOptions:
    """Checks the options that need no file or model; returns the generation options.

    Args:
      request: the invocation's options.

    Returns:
      The :class:`~lattn_jax.data.generated.GenerationOptions` of ``request``.

    Raises:
      ValueError: one line naming the flag: ``--decode_chunk``, ``--piece_mib`` or
        ``--deadline_s`` not > 0, a generation option out of range or a template without
        ``{topic}``, an unknown ``--chat_format``.
    """
    for flag, value in (("decode_chunk", request.decode_chunk),
                        ("piece_mib", request.piece_mib), ("deadline_s", request.deadline_s)):
        if value is not None and value <= 0:
            raise ValueError(f"--{flag} must be > 0, got {value}")
    options = generated.GenerationOptions(
        templates=request.templates, temperature=request.temperature, top_p=request.top_p,
        drop_unfinished=request.drop_unfinished, source_name=request.source_name,
        samples_per_prompt=request.samples_per_prompt, seed=request.seed,
        batch_size=request.batch_size, prompt_len=request.prompt_len,
        max_new_tokens=request.max_new_tokens, min_tokens=request.min_tokens,
        top_k=request.top_k)
    if request.chat_format not in generated.CHAT_FORMATS:
        raise ValueError(f"--chat_format: expected one of "
                         f"{', '.join(generated.CHAT_FORMATS)}, got {request.chat_format!r}")
    return options


def summary_line(result: dict, output_dir: str) -> str:
    """The run's last line: its status, this run's tokens and speed, the directory's counts.

    Args:
      result: what :func:`lattn_jax.data.generated.generate_corpus` returned.
      output_dir: the token-shard directory (named in the line).

    Returns:
      ``"<status>: this run N tokens generated in S s, R tokens/s while sampling (...);
      <output_dir>: b/B batches, D documents, T tokens (dropped: ...)"``.
    """
    counts = result["manifest"]["generation"]["counts"]
    return (f"{result['status']}: this run {result['generated_tokens']:,} tokens generated in "
            f"{result['seconds']:.0f} s, {result['tokens_per_s']:,.0f} tokens/s while sampling "
            f"({result['tokens_per_s_after_first_batch'] or 0:,.0f} after the first batch); "
            f"{output_dir}: {counts['batches_done']}/{counts['batches_total']} batches, "
            f"{counts['kept_documents']:,} documents, {counts['kept_tokens']:,} tokens (dropped: "
            f"{counts['dropped_short']} short, {counts['dropped_unfinished']} unfinished, "
            f"{counts['dropped_contaminated']} contaminated)")


def run(request: GenerateRequest, *, argv: Sequence[str],
        print_fn: Callable[[str], None] = print) -> int:
    """Runs one invocation (see the module docstring); prints the per-batch and summary lines.

    Args:
      request: the invocation's options.
      argv: the command line (``sys.argv``), recorded in the manifest's run record.
      print_fn: where the progress lines go.

    Returns:
      The exit status: 0 when the plan or the budget is done, :data:`EXIT_DEADLINE` (3) when
      ``deadline_s`` stopped the run (run the same command again).

    Raises:
      ValueError: a bad option (:func:`check_options`), topics file, template, model path or
        ``step``, or an output directory or resume manifest of another plan; one line naming
        the flag.
      OSError: a file that cannot be read or written.
    """
    start = time.time()
    options = check_options(request)
    topics = generated.load_topics(assets.resolve(request.topics), request.exclude_topics)
    decon = (generated.Decontaminator([build.bundled_wikitext_test(), *request.eval_data])
             if request.decontaminate else None)
    if request.compilation_cache:
        jax.config.update("jax_compilation_cache_dir",
                          os.path.abspath(request.compilation_cache))
    loaded = teacher_corpus.load_model(request.model, step=request.step, dtype=request.dtype)
    chat = generated.ChatFormat.make(request.chat_format, loaded.chat_template,
                                     request.system_prompt)
    sampler = teacher_corpus.Sampler(
        loaded.model, pad_id=loaded.tokenizer.eos_id, **options.sampling(),
        stop_tokens=generated.stop_token_ids(loaded.tokenizer, chat),
        decode_chunk=request.decode_chunk)
    result = generated.generate_corpus(
        sampler, loaded.tokenizer, topics, request.output_dir, options=options, chat=chat,
        model=loaded.info, decontaminator=decon, max_documents=request.max_documents,
        max_tokens=request.max_tokens, resume_manifest=request.resume_manifest,
        deadline=start + request.deadline_s if request.deadline_s else None,
        run_info={"command": shlex.join(argv), **teacher_corpus.device_info()},
        print_fn=print_fn)
    if request.pieces_dir:
        packed = generated.pack_new_shards(
            request.output_dir, result["new_files"], request.pieces_dir,
            new_batches=result["new_batches"], piece_bytes=request.piece_mib << 20)
        print_fn(f"pieces: {len(packed['pieces'])} of {packed['bytes'] / 2**20:.1f} MiB in "
                 f"{request.pieces_dir} ({packed['archive']}; join in run order)")
    print_fn(summary_line(result, request.output_dir))
    return EXIT_DEADLINE if result["status"] == "deadline" else 0
