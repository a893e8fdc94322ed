"""Moving a corpus in pieces: a deterministic ``tar.xz`` of a directory cut into bounded files.

For machines that take files only in bounded transfers (the GPU machine here takes at most
64 MiB per command and reaches no registry): ``split_directory`` packs a directory into
``<name>.tar.xz.000``, ``.001``, ... of at most ``piece_bytes`` each plus ``<name>.pieces.json``
(every piece's size and sha256, the whole stream's sha256, and every packed file's size and
sha256); ``join_pieces`` checks each piece, streams them through xz and tar into a directory and
checks every file's sha256 against the list. The archive is deterministic (files sorted, mtime
0, owner 0, mode 0644), so the same directory always gives the same pieces.
"""

import hashlib
import io
import json
import lzma
import os
import tarfile
from collections.abc import Sequence

from lattn_jax.data.corpora import fetch

__all__ = ["PieceError", "join_pieces", "split_directory"]

# With the repository (16 MiB of tracked files on 2026-12-04; 8 MiB on 12-01) and the wheels
# (7.1 MiB), one piece fits a 64 MiB call. 48 MiB stopped fitting on 2026-12-04 (48 + 16.0 MiB
# refused): a 32 MiB piece alone leaves room for the tree to grow to 32 MiB.
DEFAULT_PIECE_BYTES = 32 << 20


class PieceError(RuntimeError):
    """A piece is missing or corrupt, or a joined file does not match its sha256 (named)."""


class _PieceWriter(io.RawIOBase):
    """A write-only stream that rolls over to a new piece file every ``piece_bytes`` bytes."""

    def __init__(self, out_dir: str, stem: str, piece_bytes: int):
        self.out_dir, self.stem, self.piece_bytes = out_dir, stem, piece_bytes
        self.pieces: list[dict] = []
        self.whole = hashlib.sha256()
        self._file = None
        self._hash = None
        self._size = 0

    def writable(self) -> bool:
        return True

    def _roll(self) -> None:
        self._close_piece()
        name = f"{self.stem}.{len(self.pieces):03d}"
        self._file = open(os.path.join(self.out_dir, name + ".tmp"), "wb")
        self._hash, self._size = hashlib.sha256(), 0
        self.pieces.append({"file": name})

    def _close_piece(self) -> None:
        if self._file is not None:
            self._file.close()
            piece = self.pieces[-1]
            path = os.path.join(self.out_dir, piece["file"])
            os.replace(path + ".tmp", path)
            piece.update(bytes=self._size, sha256=self._hash.hexdigest())
            self._file = None

    def write(self, data) -> int:
        data = memoryview(data).cast("B")
        self.whole.update(data)
        done = 0
        while done < len(data):
            if self._file is None or self._size == self.piece_bytes:
                self._roll()
            take = min(len(data) - done, self.piece_bytes - self._size)
            chunk = data[done:done + take]
            self._file.write(chunk)
            self._hash.update(chunk)
            self._size += take
            done += take
        return len(data)

    def close(self) -> None:
        self._close_piece()
        super().close()


def split_directory(directory: str, out_dir: str, *, name: str | None = None,
                    piece_bytes: int = DEFAULT_PIECE_BYTES, preset: int = 6,
                    files: Sequence[str] | None = None, stem: str | None = None) -> dict:
    """Packs ``directory`` into xz-compressed tar pieces of at most ``piece_bytes`` bytes.

    Args:
        directory: what to pack (its files, recursively; the archive's paths are relative to
            it and start with ``name/``).
        out_dir: where the pieces and ``<stem>.pieces.json`` go (created).
        name: the directory's name in the archive (default: its base name); ``join_pieces``
            unpacks to ``<dest>/<name>/``.
        piece_bytes: maximum size of one piece in bytes (at least 1 MiB).
        preset: xz preset (0-9).
        files: only these files (``/``-separated paths relative to ``directory``; default:
            every file). Pieces of several subsets with the same ``name`` joined into one
            ``dest`` rebuild the directory piece by piece (``experiments/generate_corpus.py``
            sends each run's new shards so).
        stem: the file names' stem, ``<stem>.tar.xz.NNN`` and ``<stem>.pieces.json`` (default:
            ``name``).

    Returns:
        The pieces manifest (also written to ``<out_dir>/<stem>.pieces.json``).

    Raises:
        ValueError: ``piece_bytes`` below 1 MiB, ``directory`` holds no file, or a file of
            ``files`` is not in it.
    """
    if piece_bytes < 1 << 20:
        raise ValueError(f"piece_bytes must be at least 1 MiB, got {piece_bytes}")
    name = name or os.path.basename(os.path.normpath(directory))
    if not os.path.isdir(directory):
        raise ValueError(f"--directory: no such directory: {directory}")
    if files is None:
        files = fetch.relative_files(directory)
    else:
        files = sorted(set(files))
        missing = [f for f in files if not os.path.isfile(os.path.join(directory, f))]
        if missing:
            raise ValueError(f"{directory}: no such file(s) to pack: {', '.join(missing[:5])}")
    if not files:
        raise ValueError(f"{directory}: no file to pack")
    os.makedirs(out_dir, exist_ok=True)
    label = stem or name
    stem = f"{label}.tar.xz"
    for old in os.listdir(out_dir):
        if old.startswith(stem + "."):
            os.remove(os.path.join(out_dir, old))
    listing = {}
    writer = _PieceWriter(out_dir, stem, piece_bytes)
    with lzma.LZMAFile(writer, "wb", preset=preset) as xz:
        with tarfile.open(fileobj=xz, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for rel in files:
                path = os.path.join(directory, rel)
                info = tarfile.TarInfo(f"{name}/{rel}")
                info.size = os.path.getsize(path)
                info.mtime, info.mode, info.uid, info.gid = 0, 0o644, 0, 0
                info.uname = info.gname = ""
                with open(path, "rb") as f:
                    tar.addfile(info, f)
                listing[rel] = {"bytes": info.size, "sha256": fetch.sha256_file(path)}
    writer.close()
    manifest = {"name": name, "archive": stem, "piece_bytes": piece_bytes,
                "pieces": writer.pieces, "sha256": writer.whole.hexdigest(),
                "bytes": sum(p["bytes"] for p in writer.pieces), "files": listing}
    tmp = os.path.join(out_dir, f"{label}.pieces.json.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
    os.replace(tmp, os.path.join(out_dir, f"{label}.pieces.json"))
    return manifest


class _Concatenated(io.RawIOBase):
    """Reads the pieces one after the other as one stream."""

    def __init__(self, paths: list[str]):
        self._paths = list(paths)
        self._file = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while True:
            if self._file is None:
                if not self._paths:
                    return 0
                self._file = open(self._paths.pop(0), "rb")
            n = self._file.readinto(buffer)
            if n:
                return n
            self._file.close()
            self._file = None


def join_pieces(manifest_path: str, dest: str) -> dict:
    """Checks the pieces listed in ``manifest_path``, unpacks them under ``dest``, checks files.

    The pieces are looked for beside the manifest. The result is ``dest/<name>/...``.

    Args:
        manifest_path: a ``<name>.pieces.json`` written by ``split_directory``.
        dest: the directory to unpack into (created).

    Returns:
        ``{"name", "directory", "files", "bytes"}`` of what was unpacked and checked.

    Raises:
        PieceError: a piece is missing or its sha256 differs, the stream is corrupt, or an
            unpacked file's size or sha256 differs from the manifest (each named).
    """
    try:
        with open(manifest_path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise PieceError(f"{manifest_path}: unreadable pieces manifest: {e}") from e
    if not (isinstance(manifest, dict)
            and {"name", "pieces", "files"} <= set(manifest)):
        raise PieceError(f"{manifest_path} is not a pieces manifest (no name/pieces/files; "
                         "give the <name>.pieces.json that --mode=split wrote)")
    where = os.path.dirname(os.path.abspath(manifest_path))
    paths = []
    for piece in manifest["pieces"]:
        path = os.path.join(where, piece["file"])
        if not os.path.isfile(path):
            raise PieceError(f"missing piece {path} ({len(manifest['pieces'])} pieces listed in "
                             f"{manifest_path})")
        digest = fetch.sha256_file(path)
        if digest != piece["sha256"]:
            raise PieceError(f"piece {path}: sha256 {digest} differs from the manifest's "
                             f"{piece['sha256']} (truncated or damaged in transfer)")
        paths.append(path)
    os.makedirs(dest, exist_ok=True)
    try:
        with lzma.LZMAFile(io.BufferedReader(_Concatenated(paths), 1 << 20)) as xz:
            with tarfile.open(fileobj=xz, mode="r|") as tar:
                for member in tar:
                    rel = member.name
                    if (not member.isfile() or not rel.startswith(manifest["name"] + "/")
                            or ".." in rel.split("/")
                            or rel[len(manifest["name"]) + 1:] not in manifest["files"]):
                        raise PieceError(f"{manifest_path}: archive member {rel!r} is not "
                                         "listed in the manifest")
                    out = os.path.join(dest, rel)
                    os.makedirs(os.path.dirname(out), exist_ok=True)
                    with open(out, "wb") as f:
                        src = tar.extractfile(member)
                        while block := src.read(1 << 22):
                            f.write(block)
    except (lzma.LZMAError, tarfile.TarError, EOFError) as e:
        raise PieceError(f"{manifest_path}: corrupt archive stream: {e}") from e
    root = os.path.join(dest, manifest["name"])
    for rel, expected in manifest["files"].items():
        path = os.path.join(root, rel)
        if not os.path.isfile(path):
            raise PieceError(f"{path}: listed in {manifest_path} but not in the archive")
        digest = fetch.sha256_file(path)
        if digest != expected["sha256"]:
            raise PieceError(f"{path}: sha256 {digest} differs from the manifest's "
                             f"{expected['sha256']}")
    return {"name": manifest["name"], "directory": root, "files": len(manifest["files"]),
            "bytes": sum(v["bytes"] for v in manifest["files"].values())}
