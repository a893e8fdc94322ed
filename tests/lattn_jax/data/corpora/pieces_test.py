"""Tests of splitting a directory into checksummed pieces and joining them back."""

import json
import os

import numpy as np
import pytest

from lattn_jax.data.corpora import fetch
from lattn_jax.data.corpora import pieces


def _tree(root):
    rng = np.random.default_rng(0)
    os.makedirs(os.path.join(root, "train"))
    files = {
        "train/a.tokens.bin": rng.integers(0, 32000, 700_000, dtype=np.uint16).tobytes(),
        "train/a.offsets.npy": rng.integers(0, 1 << 40, 1000, dtype=np.int64).tobytes(),
        "corpus.json": json.dumps({"x": 1}).encode(),
    }
    for rel, data in files.items():
        with open(os.path.join(root, rel), "wb") as f:
            f.write(data)
    return files


def test_split_join_round_trip(tmp_path):
    src = tmp_path / "prose-byte"
    files = _tree(str(src))
    manifest = pieces.split_directory(str(src), str(tmp_path / "p"), piece_bytes=1 << 20,
                                      preset=0)
    assert len(manifest["pieces"]) >= 2  # 1.4 MB of random ids do not fit one 1 MiB piece
    assert all(p["bytes"] <= 1 << 20 for p in manifest["pieces"])
    assert manifest["files"]["train/a.tokens.bin"]["sha256"] == fetch.sha256_file(
        str(src / "train/a.tokens.bin"))
    done = pieces.join_pieces(str(tmp_path / "p" / "prose-byte.pieces.json"),
                              str(tmp_path / "out"))
    assert done["files"] == 3
    for rel, data in files.items():
        with open(tmp_path / "out" / "prose-byte" / rel, "rb") as f:
            assert f.read() == data


def test_split_is_deterministic(tmp_path):
    src = tmp_path / "c"
    _tree(str(src))
    first = pieces.split_directory(str(src), str(tmp_path / "p1"), piece_bytes=1 << 20, preset=0)
    os.utime(src / "corpus.json", (1, 1))  # mtimes do not enter the archive
    second = pieces.split_directory(str(src), str(tmp_path / "p2"), piece_bytes=1 << 20, preset=0)
    assert first["sha256"] == second["sha256"]
    assert [p["sha256"] for p in first["pieces"]] == [p["sha256"] for p in second["pieces"]]


def test_join_names_damaged_and_missing_pieces(tmp_path):
    src = tmp_path / "c"
    _tree(str(src))
    manifest = pieces.split_directory(str(src), str(tmp_path / "p"), piece_bytes=1 << 20,
                                      preset=0)
    path = str(tmp_path / "p" / "c.pieces.json")
    second = tmp_path / "p" / manifest["pieces"][1]["file"]
    data = second.read_bytes()
    second.write_bytes(data[:-10])  # truncated in transfer
    with pytest.raises(pieces.PieceError, match=manifest["pieces"][1]["file"] + ".*sha256"):
        pieces.join_pieces(path, str(tmp_path / "out"))
    second.unlink()
    with pytest.raises(pieces.PieceError, match="missing piece"):
        pieces.join_pieces(path, str(tmp_path / "out"))


def test_join_refuses_a_manifest_of_another_kind(tmp_path):
    (tmp_path / "corpus.json").write_text(json.dumps({"fingerprint": "x"}))
    with pytest.raises(pieces.PieceError, match="is not a pieces manifest"):
        pieces.join_pieces(str(tmp_path / "corpus.json"), str(tmp_path / "out"))
    with pytest.raises(ValueError, match="--directory: no such directory"):
        pieces.split_directory(str(tmp_path / "nope"), str(tmp_path / "p"))


def test_a_subset_under_its_own_stem_joins_into_the_same_directory(tmp_path):
    src = tmp_path / "gen"
    files = _tree(str(src))
    first = pieces.split_directory(str(src), str(tmp_path / "p"), files=["corpus.json"],
                                   stem="gen.part1", preset=0)
    second = pieces.split_directory(str(src), str(tmp_path / "p"),
                                    files=["train/a.offsets.npy", "corpus.json"],
                                    stem="gen.part2", preset=0)
    assert (first["name"], first["archive"]) == ("gen", "gen.part1.tar.xz")
    assert sorted(second["files"]) == ["corpus.json", "train/a.offsets.npy"]
    assert (tmp_path / "p" / "gen.part1.pieces.json").exists()
    assert (tmp_path / "p" / "gen.part2.tar.xz.000").exists()
    for stem in ("gen.part1", "gen.part2"):
        pieces.join_pieces(str(tmp_path / "p" / f"{stem}.pieces.json"), str(tmp_path / "out"))
    for rel in ("corpus.json", "train/a.offsets.npy"):
        assert (tmp_path / "out" / "gen" / rel).read_bytes() == files[rel]
    assert not (tmp_path / "out" / "gen" / "train" / "a.tokens.bin").exists()
    with pytest.raises(ValueError, match="no such file"):
        pieces.split_directory(str(src), str(tmp_path / "p"), files=["nope.bin"])
