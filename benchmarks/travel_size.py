"""What one GPU-machine call would carry, against the 64 MiB limit, before the call is made.

A call of the device tool sends the checkout's tracked files, its untracked files that git does
not ignore, and the ignored paths named in ``carry``; over 64 MiB in all it is refused (BUILD.md,
"Moving a corpus to a machine without registries"). 2026-12-04 lost a call and 94 s of device
time to a 48 MiB corpus piece beside a tree that had grown to 16.0 MiB. Run this here first::

    python benchmarks/travel_size.py .corpus_pieces/prose-llama2/prose-llama2.tar.xz.000
    python benchmarks/travel_size.py .whl .gpu/d0          # folders count whole

It prints the tree's size, each carried path's and the total in MiB (1 MiB = 2^20 bytes), and
exits 0 if the total fits, 1 if it does not (or a named path does not exist). A carried
link counts as a link (no bytes), a carried file that the tree already holds once, and a
``shared/`` folder inside the checkout travels always (the device tool's rules).
"""

import argparse
import os
import subprocess
import sys
from typing import Iterable, List, Set, Tuple

LIMIT_BYTES = 64 << 20


WARN_BYTES = 1 << 20  # closer than this to the limit: say so (sizes here are not the tool's)


def _files(path: str) -> Set[str]:
    """Real paths of the plain files at or under ``path``; links count as themselves (the tool
    sends a link as a link), so they add no bytes here."""
    if os.path.islink(path):
        return set()
    if os.path.isfile(path):
        return {os.path.realpath(path)}
    out = set()
    for base, _, files in os.walk(path):
        for f in files:
            p = os.path.join(base, f)
            if not os.path.islink(p) and os.path.isfile(p):
                out.add(os.path.realpath(p))
    return out


def tree_files(repo: str) -> Set[str]:
    """The files a call sends besides ``carry``: tracked files (as they are on disk), untracked
    files that git does not ignore, and a ``shared/`` folder inside the checkout (it travels
    whether ignored or not).

    Args:
      repo: the root of a git checkout.

    Returns:
      Their real paths.

    Raises:
      subprocess.CalledProcessError: if ``repo`` is not a git checkout.
    """
    out = subprocess.run(["git", "-C", repo, "ls-files", "-z", "--cached", "--others",
                          "--exclude-standard"], check=True, capture_output=True).stdout
    files = set()
    for name in os.fsdecode(out).split("\0"):
        if name:
            files |= _files(os.path.join(repo, name))
    if os.path.isdir(os.path.join(repo, "shared")):
        files |= _files(os.path.join(repo, "shared"))
    return files


def _bytes(files: Iterable[str]) -> int:
    return sum(os.path.getsize(f) for f in files)


def travel(repo: str, carry: Iterable[str]) -> Tuple[int, List[Tuple[str, int]]]:
    """``(tree bytes, [(carried path, bytes), ...])`` for one call from ``repo``.

    A carried path's bytes leave out files already counted (the tree's, or an earlier carried
    path's), and links (sent as links).

    Args:
      repo: the checkout the call sends.
      carry: the call's ``carry`` paths, relative to ``repo``.

    Raises:
      FileNotFoundError: a carried path does not exist (named).
      ValueError: a carried path is absolute or leads outside ``repo``.
      subprocess.CalledProcessError: ``repo`` is not a git checkout.
    """
    seen = tree_files(repo)
    tree = _bytes(seen)
    carried = []
    top = os.path.realpath(repo)
    for p in carry:
        full = os.path.join(repo, p)
        inside = os.path.realpath(os.path.dirname(os.path.abspath(full)))
        if os.path.isabs(p) or not (inside == top or inside.startswith(top + os.sep)):
            raise ValueError(f"{p}: not a path inside the repository {repo} (carry names "
                             f"paths relative to its root)")
        if not os.path.lexists(full):
            raise FileNotFoundError(f"{p}: no such file or folder under {repo}")
        new = _files(full) - seen
        seen |= new
        carried.append((p, _bytes(new)))
    return tree, carried


def main(argv=None) -> int:
    """The command line (module docstring); returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("carry", nargs="*", help="paths the call names in carry (relative to "
                        "the repository root)")
    parser.add_argument("--repo", default=os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), help="the checkout the calls send (default: this one)")
    args = parser.parse_args(argv)
    try:
        tree, carried = travel(args.repo, args.carry)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: carry {e}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError:
        print(f"error: --repo={args.repo}: not a git checkout", file=sys.stderr)
        return 1
    mib = 1 << 20
    print(f"tree (tracked and untracked-not-ignored files): {tree / mib:.2f} MiB")
    for path, size in carried:
        print(f"carry {path}: {size / mib:.2f} MiB")
    total = tree + sum(size for _, size in carried)
    verdict = ("does NOT fit: carry less or split it" if total > LIMIT_BYTES else
               "fits, but within 1 MiB of the limit (the tool's own count may differ)"
               if total > LIMIT_BYTES - WARN_BYTES else "fits")
    print(f"total {total / mib:.2f} of {LIMIT_BYTES / mib:.0f} MiB: {verdict} "
          f"({(LIMIT_BYTES - total) / mib:+.2f} MiB left)")
    return 0 if total <= LIMIT_BYTES else 1


if __name__ == "__main__":
    sys.exit(main())
