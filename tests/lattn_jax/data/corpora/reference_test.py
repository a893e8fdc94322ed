"""Tests of the reference-work extractors on cuts of real files (see fixtures/LICENSE.md)."""

import gzip
import json
import os
import shutil
import struct
import zlib

import pytest

from lattn_jax.data.corpora.extractors import ExtractError
from lattn_jax.data.corpora.extractors import get_extractor
from lattn_jax.data.corpora.extractors.reference import decode_dictd_number
from lattn_jax.data.corpora.extractors.reference import extract_brown
from lattn_jax.data.corpora.extractors.reference import extract_dictd
from lattn_jax.data.corpora.extractors.reference import extract_fortune
from lattn_jax.data.corpora.extractors.reference import extract_json_text
from lattn_jax.data.corpora.extractors.reference import extract_sword
from lattn_jax.data.corpora.extractors.reference import extract_wordnet
from lattn_jax.data.corpora.extractors.reference import strip_sword_markup

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


def fixture(*parts: str) -> str:
    return os.path.join(FIXTURES, *parts)


def _no_markup(text: str) -> None:
    for bad in ("<", ">", "{", "}", "\x00", "\\", "strong:"):
        assert bad not in text, (bad, text[:200])


# ------------------------------------------------------------------------------------ dictd


def test_decode_dictd_number_hand_computed():
    assert decode_dictd_number("A") == 0
    assert decode_dictd_number("/") == 63
    assert decode_dictd_number("BA") == 64
    assert decode_dictd_number("dE") == 29 * 64 + 4
    assert decode_dictd_number("/q") == 63 * 64 + 42
    # From gcide.index: "Say\tB1r+f\tdu".
    assert decode_dictd_number("B1r+f") == 64**4 + 53 * 64**3 + 43 * 64**2 + 62 * 64 + 31
    with pytest.raises(ValueError):
        decode_dictd_number("a-b")
    with pytest.raises(ValueError):
        decode_dictd_number("")


def test_dictd_gcide():
    docs = list(extract_dictd(fixture("dictd", "gcide.index")))
    names = [d.name for d in docs]
    assert not any(n.startswith("00-database") for n in names)
    # "It is said" and "Say" share one entry (dE/du): emitted once, under the first headword.
    assert names.count("It is said") == 1
    assert names.count("Say") == 6
    # "Jequirity" and "Jequirity bean" point to one entry.
    assert "Jequirity" in names and "Jequirity bean" not in names
    assert names[:3] == ["Ab", "Abaca", "Abacinate"]
    texts = {d.name: d.text for d in docs}
    assert texts["Abaca"].startswith("Abaca, n. [The native name.]")
    assert "The Manila-hemp plant (Musa textilis); also, its fiber." in texts["Abaca"]
    assert "See\nManila hemp under Manila." in texts["Abaca"]
    for doc in docs:
        _no_markup(doc.text)
        assert "[1913 Webster]" not in doc.text and "[a^]" not in doc.text
        assert "[PJC]" not in doc.text
    said = texts["It is said"]
    assert "Sw. s\u00e4ga" in said  # [aum] -> ä
    assert docs == list(extract_dictd(fixture("dictd", "gcide.index")))


def test_dictd_foldoc_plain_dict():
    docs = list(extract_dictd(fixture("dictd", "foldoc.index")))
    assert [d.name for d in docs] == ["actor", "actor", "compiler", "kompiler"]
    assert docs[0].text.startswith("Actor\n\n(language) An object-oriented language for Microsoft")
    assert docs[1].text.startswith("actor\n\n1. (programming) In object-oriented programming, an "
                                   "object\nwhich exists as a concurrent process.")
    for doc in docs:
        _no_markup(doc.text)


def test_dictd_errors(tmp_path):
    shutil.copy(fixture("dictd", "foldoc.dict"), tmp_path / "x.dict")
    (tmp_path / "x.index").write_text("word\tA$\tB\n")
    with pytest.raises(ExtractError, match="x.index:1"):
        list(extract_dictd(str(tmp_path / "x.index")))
    (tmp_path / "x.index").write_text("word\tZZZZ\tB\n")
    with pytest.raises(ExtractError, match="past the end"):
        list(extract_dictd(str(tmp_path / "x.index")))
    (tmp_path / "y.index").write_text("word\tA\tB\n")
    with pytest.raises(ExtractError, match="y.index"):
        list(extract_dictd(str(tmp_path / "y.index")))
    (tmp_path / "z.dict.dz").write_bytes(b"\x1f\x8b\x08\x00 not gzip")
    (tmp_path / "z.index").write_text("word\tA\tB\n")
    with pytest.raises(ExtractError, match="z.dict.dz"):
        list(extract_dictd(str(tmp_path / "z.index")))


# ---------------------------------------------------------------------------------- WordNet


def test_wordnet_groups_and_lines():
    docs = list(extract_wordnet(fixture("wordnet", "data.noun"), group=12))
    assert [len(d.text.split("\n")) for d in docs] == [12, 12, 6]
    assert docs[0].name == "00001740"
    lines = docs[0].text.split("\n")
    assert lines[0] == ("entity: that which is perceived or known or inferred to have its own "
                        "distinct existence (living or nonliving)")
    assert lines[1].startswith("physical entity: an entity that has physical existence")
    assert lines[2].startswith("abstraction, abstract entity: a general concept")
    for doc in docs:
        assert "|" not in doc.text and "_" not in doc.text
        assert "Princeton" not in doc.text  # the license header
    assert len(list(extract_wordnet(fixture("wordnet", "data.noun")))) == 1


def test_wordnet_bad_line(tmp_path):
    path = tmp_path / "data.noun"
    path.write_text("  1 header\n00001740 03 n zz entity 0 000 | gloss\n")
    with pytest.raises(ExtractError, match="data.noun:2"):
        list(extract_wordnet(str(path)))


# ---------------------------------------------------------------------------------- fortune


def test_fortune():
    (doc,) = extract_fortune(fixture("fortune", "wisdom"))
    assert doc.name == ""
    entries = doc.text.split("\n\n")
    assert len(entries) == 12
    assert entries[0].startswith("(1) Avoid fried meats which angry up the blood.")
    assert entries[0].endswith("-- S. Paige, c. 1951")
    assert entries[3] == ("A dream will always triumph over reality, once it is given the "
                          "chance.\n-- Stanislaw Lem")
    assert "%" not in doc.text and "\t" not in doc.text


def test_fortune_binary(tmp_path):
    path = tmp_path / "wisdom.dat"
    path.write_bytes(b"\x00\x00\x00\x02\x00\x00\x01\x00")
    with pytest.raises(ExtractError, match="wisdom.dat"):
        list(extract_fortune(str(path)))


# ------------------------------------------------------------------------------------ SWORD

# KJV verse-index positions (module header, testament header, book intro, chapter intro, ...).
GEN_1_1, GEN_1_2, GEN_2_1, EXOD_1_1, OT_ENTRIES = 4, 5, 36, 1588, 24115
JUDE_INTRO, NT_ENTRIES = 7792, 8246  # Jude: where the real mhcc module stores it


def _write_zverse(root, conf: str, testament: str, entries: int, records: dict,
                  blocks: list[bytes], record_size: int = 10, letter: str = "b",
                  raw: bool = False) -> str:
    """A SWORD zText/zCom module in the on-disk format (``records``: index -> (block, start,
    size); ``blocks``: uncompressed blocks, or compressed ones when ``raw``)."""
    name = conf.split("]")[0][1:]
    os.makedirs(root / "mods.d", exist_ok=True)
    (root / "mods.d" / f"{name.lower()}.conf").write_text(conf)
    data_dir = root / "modules" / "data" / name.lower()
    os.makedirs(data_dir, exist_ok=True)
    fmt = "<IIH" if record_size == 10 else "<III"
    index = bytearray(entries * record_size)
    for i, record in records.items():
        struct.pack_into(fmt, index, i * record_size, *record)
    block_index, data = b"", b""
    for block in blocks:
        packed = block if raw else zlib.compress(block)
        block_index += struct.pack("<III", len(data), len(packed), len(block))
        data += packed
    (data_dir / f"{testament}.{letter}zv").write_bytes(bytes(index))
    (data_dir / f"{testament}.{letter}zs").write_bytes(block_index)
    (data_dir / f"{testament}.{letter}zz").write_bytes(data)
    return str(root / "mods.d" / f"{name.lower()}.conf")


GENESIS = [
    '<div type="book" osisID="Gen"/><title type="main">The First Book of Moses</title>',
    '<w lemma="strong:H07225" morph="x">In the beginning</w> <w lemma="strong:H0430">God</w> '
    'created the heaven and the earth.<note type="study">A note to drop.</note>',
    '<w lemma="strong:H0776">And the earth</w> was without form, and void.',
    'Thus the heavens and the earth were finished, &amp; all the host of them.',
    'Now these are the names of the children of Israel.',
]


def _genesis_module(tmp_path, driver: str, record_size: int, versification: str = "") -> str:
    block = "".join(GENESIS).encode()
    offsets, at = [], 0
    for piece in GENESIS:
        offsets.append((at, len(piece.encode())))
        at += len(piece.encode())
    records = {2: (0, *offsets[0]), GEN_1_1: (0, *offsets[1]), GEN_1_2: (0, *offsets[2]),
               GEN_2_1: (0, *offsets[3]), EXOD_1_1: (1, 0, offsets[4][1])}
    conf = (f"[Test]\nDataPath=./modules/data/test/\nModDrv={driver}\nSourceType=OSIS\n"
            f"BlockType=BOOK\nCompressType=ZIP\nEncoding=UTF-8\n{versification}")
    return _write_zverse(tmp_path, conf, "ot", OT_ENTRIES, records,
                         [block, GENESIS[4].encode()], record_size)


@pytest.mark.parametrize("driver,record_size", [("zText", 10), ("zText4", 12), ("zText4", 10)])
def test_sword_ztext_books(tmp_path, driver, record_size):
    conf = _genesis_module(tmp_path, driver, record_size)
    docs = list(extract_sword(conf))
    assert [d.name for d in docs] == ["Genesis", "Exodus"]
    assert docs[0].text == (
        "The First Book of Moses\n\n"
        "In the beginning God created the heaven and the earth. And the earth was without form, "
        "and void.\n\n"
        "Thus the heavens and the earth were finished, & all the host of them.")
    assert docs[1].text == "Now these are the names of the children of Israel."
    assert docs == list(extract_sword(conf))


def test_sword_zcom_paragraphs_and_links(tmp_path):
    conf = _genesis_module(tmp_path, "zCom", 10)
    # A commentary entry shared by two verses (a linked range) is given once.
    with open(tmp_path / "modules" / "data" / "test" / "ot.bzv", "r+b") as f:
        f.seek(GEN_1_1 * 10)
        record = f.read(10)
        f.seek((GEN_1_2 + 1) * 10)
        f.write(record)
    docs = list(extract_sword(conf))
    assert docs[0].text.split("\n\n") == [
        "The First Book of Moses",
        "In the beginning God created the heaven and the earth.",
        "And the earth was without form, and void.",
        "Thus the heavens and the earth were finished, & all the host of them."]


def test_sword_unknown_versification_chunks(tmp_path):
    conf = _genesis_module(tmp_path, "zText", 10, "Versification=Leningrad\n")
    docs = list(extract_sword(conf))
    assert [d.name for d in docs] == ["OT 1", "OT 2"]
    assert docs[0].text.startswith("The First Book of Moses\n\nIn the beginning God created")


def test_sword_real_mhcc_jude_block(tmp_path):
    """The real mhcc conf (zCom4 declared, 10-byte records), records and compressed block."""
    src = fixture("sword", "mhcc-jude")
    with open(os.path.join(src, "jude.records"), "rb") as f:
        raw_records = f.read()
    with open(os.path.join(src, "jude.block"), "rb") as f:
        block = f.read()
    with open(os.path.join(src, "mhcc.conf"), encoding="utf-8") as f:
        conf_text = f.read()
    records = {}
    for k in range(len(raw_records) // 10):
        _, start, size = struct.unpack_from("<IIH", raw_records, k * 10)
        records[JUDE_INTRO + k] = (0, start, size)
    conf = _write_zverse(tmp_path, conf_text.replace("comments/zcom/mhcc", "data/mhcc"), "nt",
                         NT_ENTRIES, records, [block], raw=True)
    (doc,) = extract_sword(conf)
    assert doc.name == "Jude"
    assert doc.text.startswith("Jude\n\nThis epistle is addressed to all believers in the gospel.")
    assert "false teachers" in doc.text
    _no_markup(doc.text)
    assert 8000 < len(doc.text) < 13301


def test_sword_errors(tmp_path):
    conf = _genesis_module(tmp_path, "zText", 10)
    data = tmp_path / "modules" / "data" / "test" / "ot.bzz"
    data.write_bytes(b"\x78\x9c garbage" + data.read_bytes()[10:])
    with pytest.raises(ExtractError, match="ot.bzz: block 0"):
        list(extract_sword(conf))
    text = open(conf).read()
    for change, message in (("CompressType=LZSS", "CompressType"), ("ModDrv=RawGenBook", "ModDrv"),
                            ("CompressType=ZIP\nCipherKey=abc", "enciphered")):
        with open(conf, "w") as f:
            f.write(text.replace(change.split("=")[0] + "=" + {
                "CompressType": "ZIP", "ModDrv": "zText"}[change.split("=")[0]], change))
        with pytest.raises(ExtractError, match=f"test.conf: .*{message}"):
            list(extract_sword(conf))
    bad = tmp_path / "mods.d" / "none.conf"
    bad.write_text("DataPath=./x\n")
    with pytest.raises(ExtractError, match="none.conf"):
        list(extract_sword(str(bad)))


def test_sword_zld_real_nave():
    docs = list(extract_sword(fixture("sword", "nave", "mods.d", "nave.conf")))
    assert [d.name for d in docs][:4] == ["AARON", "ABADDON", "ABAGTHA", "ABANA"]
    assert len(docs) == 30
    aaron = docs[0].text
    assert "Lineage of Ex 6:16-20" in aaron
    assert "Meets, Moses in the wilderness and is made spokesman for Moses" in aaron
    for doc in docs:
        _no_markup(doc.text)


def test_strip_sword_markup():
    assert strip_sword_markup("In<WH7225> the beginning<WH430><RF>a note<Rf> God<CM>Next") == (
        "In the beginning God\n\nNext")
    assert strip_sword_markup('<scripRef passage="Gen 1:1">Ge 1:1</scripRef> &lt;sic&gt;') == (
        "Ge 1:1 <sic>")
    assert strip_sword_markup('<w lemma="strong:H1">Lord</w><note n="a">x</note><w>word</w>') == (
        "Lord word")
    assert strip_sword_markup('<l level="1"/>one,<l eID="x"/> <l sID="y"/>two') == "one,\ntwo"


# ------------------------------------------------------------------------------------ Brown


def test_brown():
    (doc,) = extract_brown(fixture("brown", "ca01"))
    paragraphs = doc.text.split("\n\n")
    assert paragraphs[0] == (
        "The Fulton County Grand Jury said Friday an investigation of Atlanta's recent primary "
        'election produced "no evidence" that any irregularities took place.')
    assert paragraphs[3].startswith('"Only a relative handful of such reports was received", '
                                    'the jury said, "considering')
    for bad in ("/at", "/nn", "``", "''", " ,", " ."):
        assert bad not in doc.text, bad


def test_brown_not_tagged(tmp_path):
    path = tmp_path / "cx01"
    path.write_text("\tThis is plain text, not tagged.\n")
    with pytest.raises(ExtractError, match="cx01:1"):
        list(extract_brown(str(path)))


# ------------------------------------------------------------------------------------- JSON


def test_json_sotu_and_moby_dick():
    (sotu,) = extract_json_text(fixture("json", "1790_george_washington_n.json"))
    assert sotu.text.startswith("Fellow-Citizens of the Senate and House of Representatives: "
                                "In meeting you again")
    (moby,) = get_extractor("json_text")(fixture("json", "chapter_1.json"), title_field="title")
    assert moby.text.startswith("Loomings.\n\nCall me Ishmael. Some years ago\u2014never mind")


def test_json_list_and_errors(tmp_path):
    path = tmp_path / "list.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump([{"body": "one", "head": "H"}, {"body": ""}, {"body": "three"}], f)
    docs = list(extract_json_text(str(path), fields=("body",), title_field="head"))
    assert [(d.name, d.text) for d in docs] == [("0", "H\n\none"), ("2", "three")]
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ExtractError, match="bad.json"):
        list(extract_json_text(str(bad)))
    bad.write_text('{"text": 3}')
    with pytest.raises(ExtractError, match="bad.json: field 'text'"):
        list(extract_json_text(str(bad)))
    bad.write_text("[1, 2]")
    with pytest.raises(ExtractError, match="bad.json"):
        list(extract_json_text(str(bad)))
