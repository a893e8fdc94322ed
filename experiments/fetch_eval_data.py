"""Downloads the evaluation data (zero-shot sets, NIAH essays, WikiText-2) into ``--data_dir``.

Usage::

    python experiments/fetch_eval_data.py                      # all groups, default --data_dir
    python experiments/fetch_eval_data.py --data_dir=data --groups=eval,niah
    python experiments/fetch_eval_data.py --list               # origins, sizes, checksums
    python experiments/fetch_eval_data.py --mirror=/mnt/copy   # from a local copy (or file://...)

Every file comes from a pinned commit of a public repository (or the dataset's own host) and is
written only after its size and sha256 match (``lattn_jax/eval/fetch.py``); files already present
and verified are kept, corrupt ones replaced. ``experiments/evaluate.py`` reads the same default
directory (``$LATTN_DATA_DIR``, else ``~/.cache/lattn_jax/data``).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

from lattn_jax import flag_errors  # noqa: E402
from lattn_jax.eval import fetch  # noqa: E402

_DATA_DIR = flags.DEFINE_string("data_dir", fetch.DEFAULT_DATA_DIR,
                                "Where the layout goes (evaluate.py --data_dir).")
_GROUPS = flags.DEFINE_list("groups", list(fetch.GROUPS),
                            "eval (zero-shot sets), niah (haystack essays), lm (WikiText-2).")
_MIRROR = flags.DEFINE_string("mirror", None, "Base URL of a copy of the layout to read instead "
                              "of the origins (e.g. file:///path/to/data), or a plain directory "
                              "path; still checksummed.")
_LIST = flags.DEFINE_bool("list", False, "Print the files' origins and checksums; fetch nothing.")


def main(argv):
    flag_errors.reject_arguments(argv)  # one line, not the help text
    if _LIST.value:
        print(fetch.sources_table(), end="")
        return
    try:
        status = fetch.fetch(_DATA_DIR.value, groups=_GROUPS.value, mirror=_MIRROR.value)
    except (ValueError, fetch.FetchError, OSError) as e:
        sys.exit(f"error: {e}")
    counts = {s: sum(v == s for v in status.values()) for s in ("present", "fetched", "replaced")}
    print(f"{_DATA_DIR.value}: {len(status)} files verified "
          f"({', '.join(f'{n} {s}' for s, n in counts.items())})")


if __name__ == "__main__":
    app.run(main, flags_parser=flag_errors.parse_flags)
