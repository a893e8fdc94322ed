"""Benchmark of the data pipeline alone, in tokens per second (no model, no accelerator).

Two stages are timed on a local corpus:

1. ``prepare``: ``experiments/prepare_data.py``'s work (read, tokenize in ``--prepare_workers``
   processes, write token shards), in corpus tokens per second;
2. ``load``: the training input pipeline over those shards (``build_datasets``: memory-mapped
   documents, packing into ``seq_len + 1`` windows with segment ids and positions, shuffling,
   batching), in batch tokens per second, with the grain iterator's default threads
   (``--loader_workers=0``) or ``N`` grain worker processes (``mp_prefetch``).

Stage 2 is what runs during training; it must deliver well above the training step's token rate
(the 350M preset: 128 x 4096 = 524,288 tokens per step). Stage 1 runs once per corpus.

Works offline. Example (the command behind ``benchmarks/results/data-pipeline-cpu-*.md``)::

    python benchmarks/data_pipeline.py --corpus=../shared/data/lm --prepare_workers=0,1,2 \\
        --loader_workers=0,1,2 --json=/tmp/data_pipeline.json

Prints a markdown table and writes the numbers, hardware and versions as JSON.
"""

import argparse
import datetime
import json
import os
import platform
import shlex
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import grain  # noqa: E402
import numpy as np  # noqa: E402
from absl import flags  # noqa: E402

from benchmarks import common as bench  # noqa: E402
from lattn_jax import assets  # noqa: E402
from lattn_jax.data import config as config_lib  # noqa: E402
from lattn_jax.data import pipeline  # noqa: E402
from lattn_jax.data import prepare  # noqa: E402

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SHARED_LM = os.path.join(os.path.dirname(_ROOT), "shared", "data", "lm")


def _int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _parse_args(argv):
    default_corpus = (_SHARED_LM if os.path.isdir(_SHARED_LM)
                      else assets.asset_path("corpus"))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", action="append",
                        help=f"corpus file or directory (repeatable; default {default_corpus})")
    parser.add_argument("--tokenizer", default="sentencepiece",
                        choices=["sentencepiece", "huggingface", "gguf", "byte"])
    parser.add_argument("--tokenizer_path", default=None)
    parser.add_argument("--doc_split", default="blank_line")
    parser.add_argument("--prepare_workers", type=_int_list, default=[0, 1, 2],
                        help="comma-separated tokenizer process counts to time")
    parser.add_argument("--loader_workers", type=_int_list, default=[0, 1, 2],
                        help="comma-separated grain worker process counts (0: threads only)")
    parser.add_argument("--seq_len", type=int, default=4096)
    parser.add_argument("--batch_size", type=int, default=128)
    parser.add_argument("--batches", type=int, default=40, help="batches timed per setting")
    parser.add_argument("--shard_dir", default=None,
                        help="keep the prepared shards here (default: a temporary directory)")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)
    args.corpus = args.corpus or [default_corpus]
    missing = [c for c in args.corpus if not os.path.exists(c)]
    if missing:  # was a FileNotFoundError traceback from inside prepare_corpus
        parser.error(f"--corpus: no such file or directory: {', '.join(missing)}")
    return args


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def bench_prepare(args, workers: int, out_dir: str) -> dict:
    start = time.perf_counter()
    manifest = prepare.prepare_corpus(
        args.corpus, out_dir, tokenizer=args.tokenizer, tokenizer_path=args.tokenizer_path,
        doc_split=args.doc_split, workers=workers, progress=False, print_fn=lambda _: None)
    seconds = time.perf_counter() - start
    tokens = manifest["totals"]["tokens"]
    return {"stage": "prepare", "workers": workers, "tokens": tokens, "seconds": seconds,
            "tokens_per_s": tokens / seconds, "documents": manifest["totals"]["documents"]}


def bench_load(args, workers: int, shard_dir: str) -> dict:
    cfg = config_lib.DataConfig(paths=(shard_dir,), tokenizer=args.tokenizer,
                                tokenizer_path=args.tokenizer_path, seq_len=args.seq_len,
                                batch_size=args.batch_size, val_fraction=0.01, seed=0)
    start = time.perf_counter()
    ds = pipeline.build_datasets(cfg)
    build_s = time.perf_counter() - start
    dataset = ds.train_dataset
    if workers > 0:
        dataset = dataset.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))
    it = iter(dataset)
    for _ in range(3):  # warm-up: thread pools, worker processes, page cache
        next(it)
    start = time.perf_counter()
    checksum = 0
    for _ in range(args.batches):
        batch = next(it)
        checksum += int(batch["inputs"][0, 0])
    seconds = time.perf_counter() - start
    tokens = args.batches * args.batch_size * args.seq_len
    assert batch["inputs"].shape == (args.batch_size, args.seq_len)
    assert batch["inputs"].dtype == np.int32
    return {"stage": "load", "workers": workers, "tokens": tokens, "seconds": seconds,
            "tokens_per_s": tokens / seconds, "build_seconds": build_s,
            "batches_per_s": args.batches / seconds}


def main(argv=None):
    args = _parse_args(argv)
    if not flags.FLAGS.is_parsed():  # grain's worker processes read absl flags (defaults here)
        flags.FLAGS(sys.argv[:1])
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        shard_dir = args.shard_dir or os.path.join(tmp, "shards")
        for i, workers in enumerate(args.prepare_workers):
            # The first run writes shard_dir; the others write (and time) fresh copies.
            out = shard_dir if i == 0 else os.path.join(tmp, f"prep{i}")
            if i == 0 and os.path.exists(os.path.join(out, "manifest.json")):
                out = os.path.join(tmp, "prep0")
            results.append(bench_prepare(args, workers, out))
            print(f"prepare workers={workers}: {results[-1]['tokens_per_s']:,.0f} tokens/s",
                  file=sys.stderr)
        if not args.prepare_workers:
            bench_prepare(args, 0, shard_dir)
        for workers in args.loader_workers:
            results.append(bench_load(args, workers, shard_dir))
            print(f"load workers={workers}: {results[-1]['tokens_per_s']:,.0f} tokens/s",
                  file=sys.stderr)

    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
        "hardware": {"cpu": _cpu_name(), "logical_cpus": os.cpu_count(),
                     "machine": platform.machine()},
        "versions": bench.package_versions("numpy", "grain", "sentencepiece", "tokenizers",
                                           "pyarrow", "zstandard", "jax"),
        "settings": {"corpus": args.corpus, "tokenizer": args.tokenizer,
                     "seq_len": args.seq_len, "batch_size": args.batch_size,
                     "batches": args.batches},
        "results": results,
    }
    print(f"\nCPU: {report['hardware']['cpu']} ({report['hardware']['logical_cpus']} logical), "
          f"seq_len {args.seq_len}, batch {args.batch_size}, tokenizer {args.tokenizer}\n")
    print("| stage | worker processes | tokens/s | tokens timed | seconds |")
    print("|---|---:|---:|---:|---:|")
    for r in results:
        label = "prepare (tokenize + write shards)" if r["stage"] == "prepare" else (
            "load (mmap, pack, shuffle, batch)")
        workers = r["workers"] if r["workers"] else "0 (in process)"
        print(f"| {label} | {workers} | {r['tokens_per_s']:,.0f} | {r['tokens']:,} | "
              f"{r['seconds']:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
