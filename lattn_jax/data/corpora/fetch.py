"""Fetching pinned packages with the registries' ordinary clients, and unpacking them.

``fetch_package`` downloads one ``recipe.Package`` into a cache directory (``apt-get download``
for Debian, ``pip download`` for PyPI, ``npm pack`` for npm), checks its sha256 and returns the
file's path; a file already in the cache with the right sha256 is not downloaded again.
``unpack_members`` writes the members of a ``.deb`` (``ar`` + ``data.tar.*``), a wheel (zip), an
sdist or npm tarball (``.tar.gz``/``.tgz``) that a predicate selects, under a directory, and
returns their relative paths, sorted.

Every failure raises ``FetchError`` with one line naming the package (and the source, when the
caller passes it): the version no longer in the registry, a download that failed, a sha256
mismatch, a corrupt archive. Nothing already in the cache is deleted on failure.
"""

import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable

from lattn_jax.data import tokenizers
from lattn_jax.data.corpora import recipe as recipe_lib

__all__ = ["FetchError", "fetch_package", "relative_files", "sha256_file", "unpack_members"]


class FetchError(RuntimeError):
    """A package could not be fetched, verified or unpacked; the message names it."""


sha256_file = tokenizers.file_sha256  # hex sha256 of a file's bytes, read in chunks


def relative_files(root: str) -> list[str]:
    """Every file below ``root`` as a ``/``-separated path relative to it, sorted."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        out += [os.path.relpath(os.path.join(dirpath, f), root).replace(os.sep, "/")
                for f in filenames]
    return sorted(out)


def _run(cmd: list[str], cwd: str, what: str, timeout: float) -> str:
    try:
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as e:
        raise FetchError(f"{what}: the client {cmd[0]!r} is not installed ({e})") from e
    except subprocess.TimeoutExpired as e:
        raise FetchError(f"{what}: `{' '.join(cmd)}` timed out after {timeout:.0f} s") from e
    if done.returncode != 0:
        lines = [ln for ln in (done.stderr + done.stdout).splitlines() if ln.strip()]
        found = [ln.strip() for ln in lines
                 if re.search(r"(?i)error|can't|cannot|not found|no matching|404", ln)]
        fallback = lines[-1].strip() if lines else f"exit {done.returncode}"
        reason = " / ".join(found[:2]) or fallback
        raise FetchError(f"{what}: `{' '.join(cmd)}` failed: {reason}")
    return done.stdout


def _wheel_tags(filename: str) -> list[str]:
    """pip options that select exactly the wheel ``filename`` whatever this Python is."""
    parts = filename[:-len(".whl")].split("-")
    if len(parts) < 5:
        raise FetchError(f"{filename}: not a wheel file name")
    python, abi, platform = parts[-3], parts[-2], parts[-1]
    args = ["--only-binary=:all:"]
    for plat in platform.split("."):
        args += ["--platform", plat]
    match = re.match(r"(cp|py)(\d)(\d+)?", python.split(".")[0])
    if match and match.group(3):
        args += ["--python-version", f"{match.group(2)}.{match.group(3)}"]
        args += ["--implementation", match.group(1)]
    if abi != "none":
        args += ["--abi", abi]
    return args


def _download(package: recipe_lib.Package, tmp: str, what: str, timeout: float) -> str:
    """Downloads ``package`` into the empty directory ``tmp``; returns the file's path."""
    if package.registry == "debian":
        try:
            _run(["apt-get", "download", f"{package.name}={package.version}"], tmp, what, timeout)
        except FetchError as e:
            if "not found" not in str(e) and "Unable to locate" not in str(e):
                raise
            raise FetchError(f"{e} (Debian's archive keeps only the newest revision of a "
                             "package in a suite: the pin must move to the current one, `apt-cache"
                             f" policy {package.name}`; run `apt-get update` first)") from e
    elif package.registry == "pypi":
        if not package.filename:
            raise FetchError(f"{what}: a PyPI package needs its filename (wheel or sdist)")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "-q", "-d", tmp, f"{package.name}=={package.version}"]
        if package.filename.endswith(".whl"):
            cmd += _wheel_tags(package.filename)
        else:
            cmd += ["--no-binary=:all:"]
        _run(cmd, tmp, what, timeout)
    elif package.registry == "npm":
        _run(["npm", "pack", "--loglevel=error", f"{package.name}@{package.version}"], tmp, what,
             timeout)
    elif package.registry == "local":
        if not os.path.isfile(package.filename):
            raise FetchError(f"{what}: no such file: {package.filename}")
        shutil.copyfile(package.filename, os.path.join(tmp, os.path.basename(package.filename)))
    else:
        raise FetchError(f"{what}: unknown registry {package.registry!r}")
    files = sorted(os.listdir(tmp))
    if package.filename:
        wanted = os.path.basename(package.filename)
        if wanted not in files:
            raise FetchError(f"{what}: expected {wanted}, the client gave {files}")
        return os.path.join(tmp, wanted)
    if len(files) != 1:
        raise FetchError(f"{what}: expected one downloaded file, got {files}")
    return os.path.join(tmp, files[0])


def fetch_package(package: recipe_lib.Package, cache_dir: str, *, source: str = "",
                  timeout: float = 1800.0) -> str:
    """The path of ``package``'s file in ``cache_dir``, downloaded if not there yet.

    The file is kept as ``<cache_dir>/<package.key>/<file name>``. A cached file is re-hashed and
    used if its sha256 matches; otherwise it is downloaded again into a temporary directory and
    moved into place only after its sha256 matched.

    Args:
        package: what to fetch.
        cache_dir: the download cache (created if missing).
        source: the recipe source that needs it (named in errors).
        timeout: seconds one client call may take.

    Returns:
        The absolute path of the verified file.

    Raises:
        FetchError: the client failed (version gone, no network, no such package) or the file's
            sha256 differs from the pinned one; one line naming the source and the package.
    """
    what = f"source {source}: {package.describe()}" if source else package.describe()
    directory = os.path.join(os.path.abspath(cache_dir), package.key)
    if os.path.isdir(directory):
        for name in sorted(os.listdir(directory)):
            path = os.path.join(directory, name)
            if not name.endswith(".part") and sha256_file(path) == package.sha256.lower():
                return path
    os.makedirs(directory, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory, suffix=".part") as tmp:
        path = _download(package, tmp, what, timeout)
        digest = sha256_file(path)
        if digest != package.sha256.lower():
            raise FetchError(f"{what}: sha256 of {os.path.basename(path)} is {digest}, the recipe "
                             f"pins {package.sha256} (for a new pin, check the file and pin "
                             "this digest; for an old one, the registry now serves another file "
                             "under this version)")
        final = os.path.join(directory, os.path.basename(path))
        os.replace(path, final)
    return final


def _deb_data_tar(path: str) -> tarfile.TarFile:
    """The ``data.tar.*`` member of a Debian ``ar`` archive, opened."""
    with open(path, "rb") as f:
        if f.read(8) != b"!<arch>\n":
            raise FetchError(f"{path}: not a Debian package (no ar header)")
        while header := f.read(60):
            if len(header) < 60:
                break
            name = header[:16].decode("ascii", "replace").strip().rstrip("/")
            size = int(header[48:58].decode("ascii").strip())
            data = f.read(size)
            if size % 2:
                f.read(1)
            if name.startswith("data.tar"):
                if name.endswith(".zst"):
                    import zstandard  # the [data] extra; only zstd-compressed debs need it
                    data = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)).read()
                return tarfile.open(fileobj=io.BytesIO(data), mode="r:*")
    raise FetchError(f"{path}: Debian package without a data.tar member")


def _members(path: str):
    """``(relative path, read())`` of every regular file of the archive, in archive order."""
    if path.endswith(".deb"):
        archive = _deb_data_tar(path)
    elif path.endswith(".whl") or path.endswith(".zip"):
        with zipfile.ZipFile(path) as z:
            for info in z.infolist():
                if not info.is_dir():
                    yield info.filename, (lambda i=info: z.read(i))
        return
    else:
        archive = tarfile.open(path, mode="r:*")
    with archive:
        for member in archive:
            if member.isfile():
                yield member.name, (lambda m=member: archive.extractfile(m).read())


def unpack_members(path: str, dest: str, keep: Callable[[str], bool], *,
                   strip: str = "") -> list[str]:
    """Writes the archive's regular files that ``keep`` selects under ``dest``.

    Member paths are normalised (leading ``./`` and ``strip`` prefix removed; ``..`` refused)
    before ``keep`` sees them. Links and devices are skipped.

    Args:
        path: a ``.deb``, ``.whl``/``.zip``, or tar archive (``.tar.gz``, ``.tgz``, ``.tar.xz``).
        dest: output directory (created).
        keep: predicate on the normalised relative path.
        strip: a leading directory to remove (npm tarballs put everything under ``package/``).

    Returns:
        The relative paths written, sorted.

    Raises:
        FetchError: the archive is corrupt or a member escapes ``dest`` (named).
    """
    written = []
    try:
        for name, read in _members(path):
            rel = name[2:] if name.startswith("./") else name
            if strip and rel.startswith(strip):
                rel = rel[len(strip):]
            rel = rel.lstrip("/")
            if not rel or ".." in rel.split("/") or not keep(rel):
                continue
            out = os.path.join(dest, rel)
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with open(out, "wb") as f:
                f.write(read())
            written.append(rel)
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError, ValueError) as e:
        raise FetchError(f"{path}: corrupt archive: {e}") from e
    return sorted(written)
