"""experiments/build_corpus.py and corpus_pieces.py: one-line errors and the pieces round trip;
the shared tokenizer pool of prepare_corpus."""

import json
import os
import sys

import numpy as np
import pytest

from lattn_jax.data import prepare
from tests import binary_runs

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _run(script, *args):
    return binary_runs.run([sys.executable, os.path.join(ROOT, "experiments", script), *args])


@pytest.mark.slow  # ~11 s on 2 cores (subprocesses)
def test_unknown_recipe_and_mixture_are_one_line_errors(tmp_path):
    done = _run("build_corpus.py", "--recipe=nope", f"--output_dir={tmp_path}")
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == (
        "error: --recipe: unknown recipe 'nope'; known: open_offline")
    done = _run("build_corpus.py", "--mixtures=nope", f"--output_dir={tmp_path}")
    assert done.stderr.strip().splitlines()[-1].startswith(
        "error: --mixtures: recipe open_offline has no mixture 'nope'")
    assert not os.listdir(tmp_path)  # nothing fetched or written before the check


def test_pieces_binary_round_trip_and_missing_piece(tmp_path):
    src = tmp_path / "corpus"
    (src / "train").mkdir(parents=True)
    data = np.random.default_rng(0).integers(0, 32000, 400_000, dtype=np.uint16).tobytes()
    (src / "train" / "x.tokens.bin").write_bytes(data)
    done = _run("corpus_pieces.py", "--mode=split", f"--directory={src}",
                f"--pieces_dir={tmp_path / 'p'}", "--piece_mib=1")
    assert done.returncode == 0, done.stderr
    manifest = json.loads((tmp_path / "p" / "corpus.pieces.json").read_text())
    assert len(manifest["pieces"]) == 1
    done = _run("corpus_pieces.py", "--mode=join",
                f"--manifest={tmp_path / 'p' / 'corpus.pieces.json'}",
                f"--output_dir={tmp_path / 'out'}")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "corpus" / "train" / "x.tokens.bin").read_bytes() == data
    (tmp_path / "p" / manifest["pieces"][0]["file"]).unlink()
    done = _run("corpus_pieces.py", "--mode=join",
                f"--manifest={tmp_path / 'p' / 'corpus.pieces.json'}",
                f"--output_dir={tmp_path / 'out2'}")
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1].startswith("error: missing piece ")


def test_corpus_pieces_missing_or_bad_flags_are_one_line(tmp_path):
    # A missing --pieces_dir printed the whole help text (27 lines) before its message, and
    # --piece_mib=0 was reported as "piece_bytes must be at least 1 MiB, got 0".
    mib = -int(np.random.default_rng().integers(0, 5))
    for args, line in (
            (["--mode=split", f"--directory={tmp_path}"],
             "error: --mode=split needs --directory and --pieces_dir"),
            (["--mode=join", f"--manifest={tmp_path / 'x.pieces.json'}"],
             "error: --mode=join needs --manifest and --output_dir"),
            (["--mode=split", f"--directory={tmp_path}", f"--pieces_dir={tmp_path / 'p'}",
              f"--piece_mib={mib}"], f"error: --piece_mib={mib}: at least 1 (MiB per piece)")):
        done = _run("corpus_pieces.py", *args)
        assert done.returncode == 1, done.stderr
        assert done.stderr.strip().splitlines() == [line]
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("kind", ["sentencepiece"])
def test_shared_tokenizer_pool_gives_the_same_shards(tmp_path, kind):
    path = tmp_path / "docs.jsonl"
    rng = np.random.default_rng(1)
    words = "the river ran past the mill while the miller slept".split()
    path.write_text("".join(json.dumps({"text": " ".join(rng.choice(words, 50))}) + "\n"
                            for _ in range(40)))
    inline = prepare.prepare_corpus([str(path)], str(tmp_path / "a"), tokenizer=kind,
                                    fmt="jsonl", workers=0, progress=False,
                                    print_fn=lambda *_: None)
    pool = prepare.tokenizer_pool(kind, None, 1)  # None: the bundled LLaMA-2 model
    try:
        pooled = prepare.prepare_corpus([str(path)], str(tmp_path / "b"), tokenizer=kind,
                                        fmt="jsonl", workers=1, progress=False,
                                        print_fn=lambda *_: None, pool=pool, chunk_docs=7)
    finally:
        pool.terminate()
        pool.join()
    assert pooled["totals"]["tokens"] == inline["totals"]["tokens"] > 0
    for name in ("shard-00000.tokens.bin", "shard-00000.offsets.npy"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
