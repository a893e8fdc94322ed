"""Tokenizes a corpus into token shards plus a manifest, for ``data.paths=(<output_dir>,)``.

Usage (FineWeb-Edu Parquet files, LLaMA-2 SentencePiece, 16 tokenizer processes)::

    python experiments/prepare_data.py --input=/data/fineweb-edu/sample/10BT \\
        --output_dir=/data/fineweb-edu-llama2 --workers=16
    python experiments/train.py --config=configs/default.py --workdir=runs/x \\
        --config.data.paths="('/data/fineweb-edu-llama2',)"

One shard per input file (text, JSONL plain/.gz/.zst, Parquet); running it again skips the shards
already finished, and a finished run removes the shard files its manifest does not list (an
earlier run's with more inputs), naming them. Inputs with no text are refused, the output
directory left as it was. The shard format is described in ``lattn_jax/data/shards.py``.

Bad input: malformed JSONL lines and records without ``--text_field`` are skipped and counted (the
run stops once they exceed ``--max_bad_fraction`` of the records read), a ``--text_field`` that
none of the records at a JSONL file's head has is refused before the file is read, and a file
that looks binary is refused; each with one line naming it (``lattn_jax/data/prepare.py``).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags, logging  # noqa: E402

from lattn_jax import config as config_lib  # noqa: E402
from lattn_jax import flag_errors  # noqa: E402
from lattn_jax.data import prepare  # noqa: E402
from lattn_jax.data import sources  # noqa: E402

_INPUT = flags.DEFINE_multi_string("input", None, "Input file or directory (repeatable).")
_OUTPUT_DIR = flags.DEFINE_string("output_dir", None, "Where the shards and manifest go.")
_TOKENIZER = flags.DEFINE_enum("tokenizer", "sentencepiece",
                               ["sentencepiece", "huggingface", "gguf", "byte"], "Tokenizer kind.")
_TOKENIZER_PATH = flags.DEFINE_string(
    "tokenizer_path", None, "Tokenizer file (default: the bundled LLaMA-2 SentencePiece model).")
_FORMAT = flags.DEFINE_enum("format", "auto", ["auto", "text", "jsonl", "parquet"],
                            "Input format; auto: by file extension.")
_TEXT_FIELD = flags.DEFINE_string("text_field", "text", "JSONL key / Parquet column of the text.")
_DOC_SPLIT = flags.DEFINE_enum("doc_split", "blank_line",
                               ["wikitext", "blank_line", "line", "file"],
                               "How plain text is cut into documents.")
_WORKERS = flags.DEFINE_integer("workers", os.cpu_count() or 1,
                                "Tokenizer processes (0: in the main process).")
_CHUNK_DOCS = flags.DEFINE_integer("chunk_docs", 256, "Documents per task sent to a worker.")
_MAX_BAD_FRACTION = flags.DEFINE_float(
    "max_bad_fraction", 0.01, "Bad records (malformed JSONL lines, records without "
    "--text_field) are skipped and counted; stop once they exceed this fraction of the records "
    f"read (of at least {prepare.MIN_RECORDS}).")
flags.mark_flags_as_required(["input", "output_dir"])


def _remove_if_unused(output_dir, created):
    """Removes ``output_dir`` and the parents up to ``created`` (the outermost directory this
    run created) while they are empty; a directory that existed before the run, or that holds
    anything, is left alone."""
    if created is None:
        return
    path = os.path.abspath(output_dir)
    while True:
        try:
            os.rmdir(path)  # only an empty directory
        except OSError:
            return
        if path == created:
            return
        path = os.path.dirname(path)


def main(argv):
    """Runs :func:`lattn_jax.data.prepare.prepare_corpus` on the flags.

    Raises:
      SystemExit: one line, ``error: <what>`` (status 1), for bad options and input files; on
        Ctrl-C one line saying that a rerun resumes (status 130). Either way an
        ``--output_dir`` this run created and left empty is removed.
    """
    flag_errors.reject_arguments(argv)  # one line, not the help text
    logging.set_verbosity(logging.WARNING)
    created = config_lib.first_missing_dir(_OUTPUT_DIR.value)  # None: it existed before this run
    try:
        manifest = prepare.prepare_corpus(
            _INPUT.value, _OUTPUT_DIR.value, tokenizer=_TOKENIZER.value,
            tokenizer_path=_TOKENIZER_PATH.value, fmt=_FORMAT.value,
            text_field=_TEXT_FIELD.value, doc_split=_DOC_SPLIT.value, workers=_WORKERS.value,
            chunk_docs=_CHUNK_DOCS.value, max_bad_fraction=_MAX_BAD_FRACTION.value)
    except (ValueError, FileNotFoundError, sources.DataFileError) as e:
        _remove_if_unused(_OUTPUT_DIR.value, created)
        sys.exit(f"error: {e}")
    except KeyboardInterrupt:
        _remove_if_unused(_OUTPUT_DIR.value, created)
        print(f"interrupted (Ctrl-C): prepare_data.py stopped; the shards finished in "
              f"{_OUTPUT_DIR.value} are kept, and running the same command again resumes "
              f"(it skips them)", file=sys.stderr)
        sys.exit(130)
    except BaseException:
        _remove_if_unused(_OUTPUT_DIR.value, created)
        raise
    totals = manifest["totals"]
    print(f"{_OUTPUT_DIR.value}: {totals['shards']} shards, {totals['documents']:,} documents, "
          f"{totals['tokens']:,} tokens ({manifest['tokenizer']['name']}); skipped "
          f"{totals.get('empty_documents', 0)} empty documents, "
          f"{totals.get('malformed_lines', 0)} malformed JSON lines and "
          f"{totals.get('missing_field', 0)} records without the text field; replaced "
          f"{totals.get('invalid_utf8', 0)} invalid UTF-8 sequences")


if __name__ == "__main__":
    app.run(main, flags_parser=flag_errors.parse_flags)
