"""What one GPU-machine call would carry, against the 64 MiB limit, before the call is made.

A call of the device tool sends the checkout's tracked files, its untracked files that git does
not ignore, and the ignored paths named in ``carry``; over 64 MiB in all it is refused (BUILD.md,
"Moving a corpus to a machine without registries"). 2026-12-04 lost a call and 94 s of device
time to a 48 MiB corpus piece beside a tree that had grown to 16.0 MiB. Run this here first::

    python benchmarks/travel_size.py .corpus_pieces/prose-llama2/prose-llama2.tar.xz.000
    python benchmarks/travel_size.py .whl .gpu/d0          # folders count whole

It prints the tree's size, each carried path's and the total in MiB (1 MiB = 2^20 bytes), and
exits 0 if the total fits, 1 if it does not (or a named path does not exist).
"""

import argparse
import os
import subprocess
import sys
from typing import Iterable, List, Tuple

LIMIT_BYTES = 64 << 20


def tree_bytes(repo: str) -> int:
    """Bytes of the files a call sends besides ``carry``: tracked files (as they are on disk)
    and untracked files that git does not ignore, under ``repo``.

    Raises:
      subprocess.CalledProcessError: if ``repo`` is not a git checkout.
    """
    out = subprocess.run(["git", "-C", repo, "ls-files", "-z", "--cached", "--others",
                          "--exclude-standard"], check=True, capture_output=True).stdout
    total = 0
    for name in {n for n in out.decode().split("\0") if n}:
        path = os.path.join(repo, name)
        if os.path.isfile(path) and not os.path.islink(path):
            total += os.path.getsize(path)
    return total


def path_bytes(path: str) -> int:
    """Bytes of a file, or of every file under a folder (links not followed).

    Raises:
      FileNotFoundError: naming ``path`` if it does not exist.
    """
    if not os.path.lexists(path):
        raise FileNotFoundError(f"{path}: no such file or folder")
    if os.path.isfile(path):
        return os.path.getsize(path)
    total = 0
    for base, _, files in os.walk(path):
        for f in files:
            p = os.path.join(base, f)
            if not os.path.islink(p):
                total += os.path.getsize(p)
    return total


def travel(repo: str, carry: Iterable[str]) -> Tuple[int, List[Tuple[str, int]]]:
    """``(tree bytes, [(carried path, bytes), ...])`` for one call from ``repo``.

    Raises:
      FileNotFoundError: a carried path (relative to ``repo``) does not exist.
    """
    carried = []
    for p in carry:
        try:
            carried.append((p, path_bytes(os.path.join(repo, p))))
        except FileNotFoundError:
            raise FileNotFoundError(f"{p}: no such file or folder under {repo}") from None
    return tree_bytes(repo), carried


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("carry", nargs="*", help="paths the call names in carry (relative to "
                        "the repository root)")
    parser.add_argument("--repo", default=os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), help="the checkout the calls send (default: this one)")
    args = parser.parse_args(argv)
    try:
        tree, carried = travel(args.repo, args.carry)
    except FileNotFoundError as e:
        print(f"error: carry {e}", file=sys.stderr)
        return 1
    mib = 1 << 20
    print(f"tree (tracked and untracked-not-ignored files): {tree / mib:.2f} MiB")
    for path, size in carried:
        print(f"carry {path}: {size / mib:.2f} MiB")
    total = tree + sum(size for _, size in carried)
    verdict = "fits" if total <= LIMIT_BYTES else "does NOT fit: carry less or split it"
    print(f"total {total / mib:.2f} of {LIMIT_BYTES / mib:.0f} MiB: {verdict} "
          f"({(LIMIT_BYTES - total) / mib:+.2f} MiB left)")
    return 0 if total <= LIMIT_BYTES else 1


if __name__ == "__main__":
    sys.exit(main())
