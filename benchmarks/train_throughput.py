"""Training throughput of the paper-1 presets through the real trainer: tokens/s and MFU.

Runs ``experiments/train.py`` (data pipeline, jitted train step, optimizer, metrics; the whole
trainer) for each preset for ``--steps`` steps at ``--seq_len`` tokens per row, then reads each
run's ``metrics.jsonl``: the per-window tokens/s, step time and MFU the trainer logs (its FLOP
model, :mod:`lattn_jax.flops`, counts the mixers' real work) averaged over the windows after
``--skip_windows`` (compilation and warm-up excluded). Results are normalised to GDN pure, as the
speed column of paper 1's Table 2 (arXiv 2607.07953): softmax dense 79.7%, GDN hybrid 89.5%,
KDA hybrid 70.9% (Muon).

Example (the command behind ``benchmarks/results/train-throughput-h200-*.md``)::

    python benchmarks/train_throughput.py --out=/tmp/tp --steps=200 --batch_size=8

The small models of issue 28's Table 2 sweep (``configs/sweeps/table2_small.py``: d 512, 6
layers, 16 x 4,096 tokens a step) on its corpus, every stack in one run on one GPU (the
sweep's own runs may have trained on different GPU kinds, whose tokens/s do not compare)::

    python benchmarks/train_throughput.py --out=/tmp/tp --size=small --batch_size=16 \\
        --corpus=/tmp/corpus/prose-llama2 --presets=all --steps=120

``--swiglu_packed=on`` / ``=off`` sets ``model.swiglu_packed`` in every run (the packed SwiGLU
of ``pallas_kernels/common/MOSAIC_GPU.md`` Sec. 46.2; default: the config's, off), recorded in
the JSON (``swiglu_packed``, also per run) and the report; an A/B is two invocations into two
``--out`` directories.

Each run writes to ``<out>/<preset>/``; the table is rewritten after every preset
(``<out>/train_throughput.{md,json}``), so a run cut short keeps what it measured, and a later
invocation into the same ``--out`` adds its presets to the table (e.g. a preset run with fewer
``--steps``; each row records its own steps).
"""

import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _ROOT)

from benchmarks import common as bench  # noqa: E402  (imports jax; starts no backend)
from lattn_jax import records  # noqa: E402  (json and absl logging only)
# name -> (table2 config argument, paper Table 2 speed relative to GDN pure, Muon; None: n/a)
PRESETS = {
    "softmax_dense": ("arch=softmax,stack=dense", 0.797),
    "gdn_pure": ("arch=gdn,stack=pure", 1.0),
    "gdn_hybrid": ("arch=gdn,stack=hybrid", 0.895),
    "kda_hybrid": ("arch=kda,stack=hybrid", 0.709),
    "deltanet_pure": ("arch=deltanet,stack=pure", None),
    "deltanet_hybrid": ("arch=deltanet,stack=hybrid", None),
    "kda_pure": ("arch=kda,stack=pure", None),
    "gdn2_pure": ("arch=gdn2,stack=pure", None),
    "gdn2_hybrid": ("arch=gdn2,stack=hybrid", None),
}
# configs/sweeps/common.py's LOSS_CHUNK (the sweeps' fused LM head and loss; the authors use
# cut-cross-entropy, spec §3.4), not imported: this module starts no config machinery.
LOSS_CHUNK_SIZE = 8192
# The four the paper's speed column has: the default of --presets ("all": every preset).
PAPER_PRESETS = ("softmax_dense", "gdn_pure", "gdn_hybrid", "kda_hybrid")


# option -> (default, default with --tiny)
_DEFAULTS = {"steps": (200, 8), "batch_size": (8, 2), "seq_len": (4096, 128),
             "log_every": (10, 2), "skip_windows": (2, 1)}


def _on_off(text: str) -> bool:
    """``"on"`` -> True, ``"off"`` -> False (argparse type); else ``ArgumentTypeError``."""
    if text not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"expected on or off, got {text!r}")
    return text == "on"


def _parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--presets", default=",".join(PAPER_PRESETS),
                        help=f"comma-separated subset of {', '.join(PRESETS)}, or all")
    parser.add_argument("--size", default="350m", choices=["350m", "small"],
                        help="configs/table2.py's size: the 350M presets or the small models "
                        "of configs/sweeps/table2_small.py")
    parser.add_argument("--corpus", default=None,
                        help="a prepared corpus directory (configs/table2.py's corpus=; "
                        "default: the bundled WikiText-2 text)")
    parser.add_argument("--opt", default="muon", choices=["muon", "adamw"])
    # Defaults: (GPU, --tiny): a tiny run's batch of 8 x 4096 tokens needed ~22 GB on a CPU.
    for name, what in (("steps", ""), ("batch_size", "rows per step; "), ("seq_len", ""),
                       ("log_every", ""), ("skip_windows", "logging windows dropped at the "
                                                           "start (compile, warm-up); ")):
        gpu, tiny = _DEFAULTS[name]
        parser.add_argument(f"--{name}", type=int, default=None,
                            help=f"{what}default {gpu} ({tiny} with --tiny)")
    parser.add_argument("--micro_batch_size", type=int, default=None,
                        help="gradient accumulation: rows per data-parallel replica per "
                        "micro-step (train.micro_batch_size; default: none)")
    parser.add_argument("--loss_chunk_size", type=int, default=LOSS_CHUNK_SIZE,
                        help="the training loss's LM head and cross-entropy fused in chunks of "
                        "this many tokens (train.loss_chunk_size), as the Table 2 and Table 7 "
                        f"sweeps run them (default {LOSS_CHUNK_SIZE}); 0: the plain head "
                        "(fp32 logits of the whole batch)")
    parser.add_argument("--swiglu_packed", type=_on_off, default=None,
                        help="on or off: model.swiglu_packed in every run (default: the "
                        "config's, off), the packed SwiGLU A/B of MOSAIC_GPU.md Sec. 46.2")
    parser.add_argument("--tiny", action="store_true",
                        help="CPU smoke run of the tiny presets (and small batch, sequence "
                        "and step defaults)")
    parser.add_argument("--extra", default="", help="extra flags for experiments/train.py")
    args = parser.parse_args(argv)
    if args.loss_chunk_size < 0:
        parser.error(f"--loss_chunk_size must be >= 0 (0: the plain head), got "
                     f"{args.loss_chunk_size}")
    for name, (gpu, tiny) in _DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, tiny if args.tiny else gpu)
    return args


def summarise(metrics_path: str, skip_windows: int) -> dict:
    """Mean tokens/s, step time and MFU over a run's logged windows after ``skip_windows``.

    Args:
      metrics_path: the trainer's ``metrics.jsonl``, read with
        :func:`lattn_jax.records.read_records` (a last line cut short by a killed trainer is
        dropped with a warning).

    Returns:
      ``{"tokens_per_sec", "step_time", "mfu" (None without a peak FLOP/s), "windows",
      "first_loss", "last_loss", "val_loss"}``.

    Raises:
      FileNotFoundError: if the file is missing; ValueError: if no window is left to average
        (``records.RecordsError``, a ``ValueError``, for a bad line other than the last).
    """
    if not os.path.exists(metrics_path):
        raise FileNotFoundError(f"{metrics_path}: no such file (the trainer wrote no metrics)")
    rows = records.read_records(metrics_path)
    train = [r for r in rows if r.get("tokens_per_sec") is not None]
    timed = train[skip_windows:]
    if not timed:
        raise ValueError(f"{metrics_path}: {len(train)} timed windows, none left after skipping "
                         f"{skip_windows}")
    mean = lambda key: sum(r[key] for r in timed) / len(timed)  # noqa: E731
    mfu = mean("mfu") if all(r.get("mfu") is not None for r in timed) else None
    losses = [r["train_loss"] for r in rows if "train_loss" in r]
    vals = [r["val_loss"] for r in rows if "val_loss" in r]
    return {"tokens_per_sec": mean("tokens_per_sec"), "step_time": mean("step_time"), "mfu": mfu,
            "windows": len(timed), "first_loss": losses[0] if losses else None,
            "last_loss": losses[-1] if losses else None, "val_loss": vals[-1] if vals else None}


def run_trainer(cmd, log_path: str, *, label: str, env=None):
    """Runs one trainer command, echoing its output lines and keeping them in ``log_path``.

    Args:
      cmd: the ``experiments/train.py`` argument list (``sys.executable`` first).
      log_path: file for the whole output (progress-bar redraws included).
      label: name printed before the command.
      env: the child's environment (default: this process's).

    Returns:
      ``(exit status, parameter count from the trainer's "model:" line or None, wall seconds)``.
    """
    print(f"== {label}: {' '.join(shlex.quote(c) for c in cmd)}", flush=True)
    t0 = time.perf_counter()
    params = None
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, cwd=_ROOT, env=env)
        for line in proc.stdout:
            log.write(line)
            if "\r" not in line:
                print(f"   {line.rstrip()}", flush=True)
            if line.startswith("model: ") and " parameters" in line:
                params = int(line.split()[1].replace(",", ""))
        rc = proc.wait()
    return rc, params, time.perf_counter() - t0


def _micro_text(result: dict) -> str:
    """The report's gradient-accumulation note ("" without ``micro_batch_size``). The trainer's
    micro-batch is per data-parallel replica, so the micro-batch count per step is stated for
    one device (the mesh is the trainer's, not recorded here)."""
    micro = result.get("micro_batch_size")
    if not micro:
        return ""
    return (f" (gradient accumulation: micro-batches of {micro} rows per data-parallel replica, "
            f"{result['batch_size'] // micro} per step on one device)")


def _head_text(result: dict) -> str:
    """The report's note on the LM head and loss (``loss_chunk_size``; absent in records made
    before the option: the plain head)."""
    chunk = result.get("loss_chunk_size")
    if not chunk:
        return "the plain LM head (the whole micro-batch's fp32 logits, then the loss)"
    return (f"the LM head and cross-entropy fused in chunks of {chunk:,} tokens "
            f"(train.loss_chunk_size, as the Table 2/7 sweeps run)")


def _corpus_text(result: dict) -> str:
    corpus = result.get("corpus")
    return f"the corpus `{corpus}`" if corpus else "the bundled WikiText-2 corpus"


def _options_lines(result: dict) -> list:
    """The report's line on the model options the runs were given (none when every run kept
    the config's: ``swiglu_packed`` None or absent, as in records made before the option)."""
    packed = result.get("swiglu_packed")
    if packed is None:
        return []
    return [f"- model.swiglu_packed={'on' if packed else 'off'} (--swiglu_packed: the packed "
            f"SwiGLU, MOSAIC_GPU.md Sec. 46.2)."]


def render(result: dict) -> str:
    """The markdown report of :func:`main`'s JSON result."""
    lines = [f"# Training throughput, paper-1 presets ({result['date'][:10]})", "",
             f"- Date: {result['date']}. Device: {result['device']}.",
             f"- Versions: {json.dumps(result['versions'])}.",
             f"- Setup: {result['opt']}, size {result.get('size', '350m')}, {result['steps']} "
             f"steps of {result['batch_size']} x {result['seq_len']} tokens"
             f"{_micro_text(result)}, {_head_text(result)}, bf16 compute with fp32 master "
             f"weights, {_corpus_text(result)} through the real data pipeline; tokens/s, step "
             f"time and MFU are the trainer's logged windows of {result['log_every']} steps "
             f"averaged after dropping the first {result['skip_windows']} (compilation, "
             f"warm-up). MFU = model FLOPs (lattn_jax.flops, mixers' real work, causal attention "
             f"halved) / (989 TFLOP/s bf16 dense peak x devices).",
             f"- Command: `{result['command']}`", *_options_lines(result), "",
             "| preset | params | steps | tokens/s | step time (s) | MFU | speed vs GDN pure | "
             "paper (Muon) | loss first -> last | wall (s) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    base = result["runs"].get("gdn_pure", {}).get("tokens_per_sec")
    for name, run in result["runs"].items():
        if "error" in run:
            lines.append(f"| {name} | | | failed: {run['error']} | | | | | | |")
            continue
        rel = f"{100 * run['tokens_per_sec'] / base:.1f}%" if base else "n/a"
        paper = PRESETS[name][1]
        paper = "n/a" if paper is None else f"{100 * paper:.1f}%"
        mfu = "n/a" if run["mfu"] is None else f"{100 * run['mfu']:.1f}%"
        params = f"{run['params'] / 1e6:.1f}M" if run.get("params") else ""
        lines.append(
            f"| {name} | {params} | {run.get('steps', '')} | {run['tokens_per_sec']:,.0f} | "
            f"{run['step_time']:.3f} | {mfu} | {rel} | {paper} | "
            f"{run['first_loss']:.3f} -> {run['last_loss']:.3f} | {run['wall_s']:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    os.makedirs(args.out, exist_ok=True)
    names = list(PRESETS) if args.presets == "all" else [n for n in args.presets.split(",") if n]
    for n in names:
        if n not in PRESETS:
            raise SystemExit(f"error: --presets: unknown preset {n!r}; choose from "
                             f"{', '.join(PRESETS)}")
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "device": bench.device_summary(),
              "versions": bench.package_versions("jax", "jaxlib", "flax", "optax",
                                                 "orbax-checkpoint", "grain"), "opt": args.opt,
              "steps": args.steps, "batch_size": args.batch_size, "seq_len": args.seq_len,
              "micro_batch_size": args.micro_batch_size, "size": args.size,
              "loss_chunk_size": args.loss_chunk_size,
              "swiglu_packed": args.swiglu_packed,  # None: the config's (off)
              "corpus": args.corpus,
              "log_every": args.log_every, "skip_windows": args.skip_windows,
              "command": "python " + " ".join(shlex.quote(a) for a in
                                              ["benchmarks/train_throughput.py"] + sys.argv[1:]),
              "runs": {}}
    previous = os.path.join(args.out, "train_throughput.json")
    if os.path.exists(previous):  # a second invocation into the same --out adds its presets
        with open(previous) as f:
            result["runs"] = {k: v for k, v in json.load(f)["runs"].items() if k not in names}
    for name in names:
        workdir = os.path.join(args.out, name)
        arg = (PRESETS[name][0] + f",opt={args.opt},size={args.size}"
               + (f",corpus={args.corpus}" if args.corpus else "") + (",tiny" if args.tiny else ""))
        cmd = [sys.executable, os.path.join(_ROOT, "experiments", "train.py"),
               f"--config={os.path.join(_ROOT, 'configs', 'table2.py')}:{arg}",
               f"--workdir={workdir}", f"--config.train.total_steps={args.steps}",
               f"--config.data.batch_size={args.batch_size}",
               f"--config.data.seq_len={args.seq_len}",
               f"--config.train.log_every={args.log_every}",
               f"--config.train.eval_every={args.steps}",
               f"--config.train.checkpoint_every={args.steps}",
               "--config.train.nonfinite_policy=skip", "--config.train.tensorboard=False",
               "--config.data.max_val_batches=2"] + shlex.split(args.extra)
        if args.micro_batch_size:
            cmd.append(f"--config.train.micro_batch_size={args.micro_batch_size}")
        if args.loss_chunk_size:
            cmd.append(f"--config.train.loss_chunk_size={args.loss_chunk_size}")
        if args.swiglu_packed is not None:
            cmd.append(f"--config.model.swiglu_packed={args.swiglu_packed}")
        log_path = os.path.join(workdir + ".log")
        rc, params, wall = run_trainer(cmd, log_path, label=name)
        if rc:
            result["runs"][name] = {"error": f"exit {rc}, see {os.path.basename(log_path)}",
                                    "wall_s": wall}
        else:
            try:
                run = summarise(os.path.join(workdir, "metrics.jsonl"), args.skip_windows)
            except (OSError, ValueError) as e:
                run = {"error": str(e)}
            run.update(wall_s=wall, params=params, steps=args.steps,
                       swiglu_packed=args.swiglu_packed)
            result["runs"][name] = run
        with open(os.path.join(args.out, "train_throughput.json"), "w") as f:
            json.dump(result, f, indent=1)
        with open(os.path.join(args.out, "train_throughput.md"), "w") as f:
            f.write(render(result))
        print(render(result), flush=True)
    return result


if __name__ == "__main__":
    main()
