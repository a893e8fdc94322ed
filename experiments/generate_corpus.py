"""Samples documents from a teacher into a token-shard directory, for ``data.paths``.

Usage (SmolLM2-135M-Instruct on a GPU: bf16, the bundled Vital Article topics, 3 expository
templates; the same command again continues where it stopped)::

    python experiments/generate_corpus.py --model=SmolLM2-135M-Instruct.Q4_1.gguf \\
        --output_dir=/data/gen/teacher-smollm2 --batch_size=1024 --samples_per_prompt=4 \\
        --max_tokens=30000000 --deadline_s=480 --eval_data=../shared/data/eval
    # HALO on the corpus plus the generated text (Stages 1-2 read it 3 times per pass, Stage 3
    # leaves it out; configs/halo_smollm2.py):
    python experiments/halo_pipeline.py --workdir=runs/halo_gen \\
        --config=configs/halo_smollm2.py:h200,corpus=/data/open/prose-smollm2,teacher_text=/data/gen/teacher-smollm2

``--model`` is a GGUF file (its own tokenizer and chat template) or a lattn-jax training workdir.
Every (topic, template) prompt is wrapped in the chat format (``--chat_format=auto``: the GGUF's
``tokenizer.chat_template``) and sampled ``--samples_per_prompt`` times; a document is the
continuation only, without its stop token. Short documents (``--min_tokens``) and documents
sharing a word 13-gram with an evaluation set (the bundled WikiText-2 test split plus
``--eval_data``, the corpus builder's check) are dropped and counted in ``manifest.json``. Shards
are written as batches finish; ``--max_documents`` / ``--max_tokens`` / ``--deadline_s`` stop
cleanly. ``--pieces_dir`` also packs this run's new shards and the manifest into ``tar.xz``
pieces of at most ``--piece_mib`` MiB (join them, in run order, with ``experiments/
corpus_pieces.py --mode=join``). The library: ``lattn_jax/halo/corpus_driver.py`` (this
binary's steps), ``lattn_jax/data/generated.py`` (the plan, filters, resume; defaults explained
there) and ``lattn_jax/halo/teacher_corpus.py`` (the model).

Exit status: 0 when the plan or the budget is done, 3 when ``--deadline_s`` stopped the run (run
the same command again), 1 on an error (one line on stderr, naming the flag).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags, logging  # noqa: E402

from lattn_jax import assets  # noqa: E402
from lattn_jax import flag_errors  # noqa: E402
from lattn_jax.data import generated  # noqa: E402
from lattn_jax.halo import corpus_driver, teacher_corpus  # noqa: E402

_D = generated.GenerationOptions()
_MODEL = flags.DEFINE_string("model", None, "A GGUF file or a lattn-jax training workdir.")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (workdirs; default the newest).")
_DTYPE = flags.DEFINE_enum("dtype", "auto", teacher_corpus.DTYPES, "Compute and parameter "
                           "dtype; auto: bfloat16 on a GPU, float32 on CPU.")
_OUTPUT_DIR = flags.DEFINE_string("output_dir", None, "The token-shard directory (resumed).")
_TOPICS = flags.DEFINE_string("topics", assets.BUNDLED + assets.VITAL_TOPICS,
                              "Topics file, one per line (UTF-8).")
_EXCLUDE = flags.DEFINE_string("exclude_topics", None, "Topics to drop, one per line "
                               "(exact match, case-insensitive).")
_TEMPLATES = flags.DEFINE_multi_string("template", list(_D.templates), "Prompt template with "
                                       "{topic} (repeat for several).")
_CHAT = flags.DEFINE_string("chat_format", "auto", "auto (the GGUF's chat template, else "
                            "none), gguf, chatml or none.")
_SYSTEM = flags.DEFINE_string("system_prompt", None, "System message (default: the template's).")
_INT_FLAGS = {name: flags.DEFINE_integer(name, getattr(_D, name), help_) for name, help_ in (
    ("samples_per_prompt", "Samples of every (topic, template) prompt, each in its own batch."),
    ("seed", "Seed of the item order and of each batch's sampling."),
    ("batch_size", "Rows per batch (one compiled shape)."),
    ("prompt_len", "Prompts are left-padded to this many tokens; longer ones are dropped."),
    ("max_new_tokens", "The most tokens generated per document."),
    ("min_tokens", "Documents with fewer tokens are dropped."),
    ("top_k", "Keep the k most likely tokens (0: all)."))}
_TEMPERATURE = flags.DEFINE_float("temperature", _D.temperature, "Sampling temperature (> 0).")
_TOP_P = flags.DEFINE_float("top_p", _D.top_p, "Nucleus sampling mass.")
_DROP_UNFINISHED = flags.DEFINE_bool("drop_unfinished", False, "Drop documents that hit "
                                     "--max_new_tokens (default: keep them).")
_SOURCE = flags.DEFINE_string("source_name", _D.source_name, "The shards' name (for "
                              "data.source_weights).")
_DECODE_CHUNK = flags.DEFINE_integer("decode_chunk", 16, "Decode steps per compiled call.")
_MAX_DOCS = flags.DEFINE_integer("max_documents", None, "Stop at this many kept documents.")
_MAX_TOKENS = flags.DEFINE_integer("max_tokens", None, "Stop at this many kept tokens.")
_DEADLINE = flags.DEFINE_float("deadline_s", None, "Stop after the batch that ends this many "
                               "seconds after the start.")
_EVAL_DATA = flags.DEFINE_multi_string("eval_data", [], "Evaluation sets for the 13-gram "
                                       "check, besides the bundled WikiText-2 test split.")
_DECONTAMINATE = flags.DEFINE_bool("decontaminate", True, "Drop documents that share an "
                                   "n-gram with an evaluation set.")
_RESUME = flags.DEFINE_string("resume_manifest", None, "manifest.json of an earlier run of this "
                              "plan elsewhere: its batches count as done.")
_PIECES = flags.DEFINE_string("pieces_dir", None, "Also pack this run's new shards into "
                              "compressed pieces here.")
_PIECE_MIB = flags.DEFINE_integer("piece_mib", 16, "Largest piece, MiB.")
_CACHE = flags.DEFINE_string("compilation_cache", None, "Persistent JAX compilation cache.")
flags.mark_flags_as_required(["model", "output_dir"])


def main(argv):
    flag_errors.reject_arguments(argv)  # one line, not the help text
    logging.set_verbosity(logging.WARNING)
    request = corpus_driver.GenerateRequest(
        model=_MODEL.value, output_dir=_OUTPUT_DIR.value, step=_STEP.value, dtype=_DTYPE.value,
        topics=_TOPICS.value, exclude_topics=_EXCLUDE.value, templates=_TEMPLATES.value,
        chat_format=_CHAT.value, system_prompt=_SYSTEM.value, temperature=_TEMPERATURE.value,
        top_p=_TOP_P.value, drop_unfinished=_DROP_UNFINISHED.value, source_name=_SOURCE.value,
        decode_chunk=_DECODE_CHUNK.value, max_documents=_MAX_DOCS.value,
        max_tokens=_MAX_TOKENS.value, deadline_s=_DEADLINE.value, eval_data=_EVAL_DATA.value,
        decontaminate=_DECONTAMINATE.value, resume_manifest=_RESUME.value,
        pieces_dir=_PIECES.value, piece_mib=_PIECE_MIB.value, compilation_cache=_CACHE.value,
        **{k: f.value for k, f in _INT_FLAGS.items()})
    try:
        status = corpus_driver.run(request, argv=sys.argv)
    except (ValueError, OSError) as e:
        sys.exit(f"error: {e}")
    if status:
        sys.exit(status)


if __name__ == "__main__":
    app.run(main, flags_parser=flag_errors.parse_flags)
