"""Cuts a corpus directory into bounded, checksummed pieces, and joins them back.

For a machine that takes files only in bounded transfers (the GPU machine takes at most 64 MiB
per command): split on the machine that built the corpus, carry the pieces over (one or two per
command), join on the other side::

    python experiments/corpus_pieces.py --mode=split \\
        --directory=/data/open/prose-llama2 --pieces_dir=.corpus_pieces/prose-llama2
    python experiments/corpus_pieces.py --mode=join \\
        --manifest=.corpus_pieces/prose-llama2/prose-llama2.pieces.json --output_dir=/tmp/corpus

``join`` checks every piece's sha256 before unpacking and every unpacked file's sha256 after;
a missing or damaged piece is named. The format: ``lattn_jax/data/corpora/pieces.py``.
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

from lattn_jax import flag_errors  # noqa: E402
from lattn_jax.data.corpora import pieces  # noqa: E402

_MODE = flags.DEFINE_enum("mode", None, ["split", "join"], "split a directory or join pieces.")
_DIRECTORY = flags.DEFINE_string("directory", None, "split: the directory to pack.")
_PIECES_DIR = flags.DEFINE_string("pieces_dir", None, "split: where the pieces go.")
_PIECE_MIB = flags.DEFINE_integer("piece_mib", pieces.DEFAULT_PIECE_BYTES >> 20,
                                  "split: maximum piece size in MiB.")
_MANIFEST = flags.DEFINE_string("manifest", None, "join: the <name>.pieces.json file.")
_OUTPUT_DIR = flags.DEFINE_string("output_dir", None, "join: where the directory is unpacked.")
flags.mark_flag_as_required("mode")


def main(argv):
    flag_errors.reject_arguments(argv)  # one line, not the help text
    start = time.perf_counter()
    try:
        if _MODE.value == "split":
            if not _DIRECTORY.value or not _PIECES_DIR.value:  # one line, not the help text
                sys.exit("error: --mode=split needs --directory and --pieces_dir")
            if _PIECE_MIB.value < 1:
                sys.exit(f"error: --piece_mib={_PIECE_MIB.value}: at least 1 (MiB per piece)")
            manifest = pieces.split_directory(_DIRECTORY.value, _PIECES_DIR.value,
                                              piece_bytes=_PIECE_MIB.value << 20)
            total = sum(f["bytes"] for f in manifest["files"].values())
            print(f"{manifest['name']}: {len(manifest['files'])} files, {total / 2**20:.1f} MiB "
                  f"-> {len(manifest['pieces'])} pieces, {manifest['bytes'] / 2**20:.1f} MiB "
                  f"({time.perf_counter() - start:.0f} s); sha256 {manifest['sha256']}")
        else:
            if not _MANIFEST.value or not _OUTPUT_DIR.value:
                sys.exit("error: --mode=join needs --manifest and --output_dir")
            done = pieces.join_pieces(_MANIFEST.value, _OUTPUT_DIR.value)
            print(f"{done['directory']}: {done['files']} files, {done['bytes'] / 2**20:.1f} MiB, "
                  f"every sha256 checked ({time.perf_counter() - start:.0f} s)")
    except (pieces.PieceError, ValueError, OSError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    app.run(main, flags_parser=flag_errors.parse_flags)
