"""Plots of the model-level benchmarks (issue 10), from their JSON results.

* :func:`plot_train` (``benchmarks/bench_train.py``): iteration time, the softmax / GDN
  iteration-time ratios against the paper's 3.51x (pure) and 2.16x (hybrid), and peak memory,
  against the sequence length; the paper's 32K points (Fig. 6: 3.37, 1.56, 0.96 s, measured on
  other hardware) are drawn as hollow markers.
* :func:`plot_inference` (``benchmarks/bench_inference.py``): prefill time per input token,
  decode time per output token, the dense / hybrid ratios against the paper's 3.4x (prefill) and
  3.0x (decode) at 512K, and memory, against the context (log-log); "out of memory" and skipped
  measurements are marked on the top edge of the panels.

The benchmarks call these at the end of a run; to redraw from saved results::

    python benchmarks/plot_model_bench.py --train=benchmarks/results/train-h200-<date>.json \\
        --inference=benchmarks/results/inference-h200-<date>.json

writes ``<name>.png`` next to each JSON file.
"""

import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
from matplotlib import pyplot as plt  # noqa: E402
from matplotlib import ticker  # noqa: E402

COLORS = {"softmax": "tab:red", "gdn_hybrid": "tab:purple", "gdn_pure": "tab:blue",
          "dense": "tab:red", "hybrid": "tab:purple", "pure": "tab:blue"}
# Paper 1, Fig. 6 (seconds per iteration at 32K tokens) and paper 2, Figs. 1 and 6.
PAPER_TRAIN_32K = {"softmax": 3.37, "gdn_hybrid": 1.56, "gdn_pure": 0.96}
PAPER_INFERENCE = dict(context=524288, prefill=3.4, decode=3.0)


def _label_tokens(n: int) -> str:
    if n >= 2**20 and n % 2**20 == 0:
        return f"{n // 2**20}M"
    if n >= 1024 and n % 1024 == 0:
        return f"{n // 1024}K"
    return str(n)


def _x_axis(ax, values, label):
    ax.set_xscale("log", base=2)
    ax.set_xticks(values)
    ax.set_xticklabels([_label_tokens(v) for v in values])
    ax.minorticks_off()
    ax.set_xlabel(label)
    ax.grid(True, which="major", alpha=0.3)


def _log_y(ax):
    """Log y axis with labels at 1, 2 and 5 times each power of ten (short ranges too)."""
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda y, _: f"{y:g}"))
    ax.yaxis.set_minor_formatter(ticker.NullFormatter())


def _mark_failures(ax, points, color):
    """Marks (x, status) failures on the top edge of ``ax``: "OOM", "skip" or "err"."""
    for x, status in points:
        text = ("OOM" if status == "out of memory" else
                "skip" if status.startswith("skip") else "err")
        ax.annotate(text, (x, 1.0), xycoords=("data", "axes fraction"), color=color,
                    ha="center", va="bottom", fontsize=7, annotation_clip=False)
        ax.plot([x], [0.98], marker="x", color=color, transform=ax.get_xaxis_transform(),
                clip_on=False)


def plot_train(payload: dict, path: str) -> str:
    """Draws the training benchmark's figure.

    Args:
      payload: the ``bench_train`` JSON payload (``records`` with ``preset``, ``seq_len``,
        ``iter_s``, ``status``, ``memory``).
      path: the PNG to write.

    Returns:
      ``path``.

    Raises:
      OSError: if the file cannot be written.
    """
    records = payload["records"]
    lengths = sorted({r["seq_len"] for r in records})
    presets = list(dict.fromkeys(r["preset"] for r in records))
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    ax_t, ax_r, ax_m = axes
    for preset in presets:
        rows = sorted((r for r in records if r["preset"] == preset), key=lambda r: r["seq_len"])
        ok = [r for r in rows if r.get("iter_s") is not None]
        color = COLORS.get(preset)
        ax_t.plot([r["seq_len"] for r in ok], [r["iter_s"] for r in ok], "o-", color=color,
                  label=f"{preset} (ours)")
        mem = [(r["seq_len"], (r.get("memory") or {}).get("peak_estimate")) for r in rows]
        mem = [(x, y / 2**30) for x, y in mem if y is not None]
        if mem:
            ax_m.plot(*zip(*mem), "o-", color=color, label=preset)
        _mark_failures(ax_t, [(r["seq_len"], r["status"]) for r in rows
                              if r.get("iter_s") is None], color)
        if preset in PAPER_TRAIN_32K and 32768 in lengths:
            ax_t.plot([32768], [PAPER_TRAIN_32K[preset]], marker="*", markersize=13,
                      markerfacecolor="none", color=color, linestyle="none",
                      label=f"{preset}, paper Fig. 6 (other hardware)")
    _log_y(ax_t)
    ax_t.set_ylabel("seconds per iteration (fwd + bwd + optimizer)")
    tokens = payload.get("settings", {}).get("tokens_per_batch")
    ax_t.set_title(f"Training iteration, {tokens:,} tokens per batch" if tokens else
                   "Training iteration")
    _x_axis(ax_t, lengths, "sequence length")
    ax_t.legend(fontsize=7)

    ratios = payload.get("summary", {}).get("ratios", {})
    for key, color, paper in (("softmax/gdn_pure", COLORS["gdn_pure"], 3.37 / 0.96),
                              ("softmax/gdn_hybrid", COLORS["gdn_hybrid"], 3.37 / 1.56)):
        pts = sorted((int(length), row[key]) for length, row in ratios.items() if key in row)
        if pts:
            ax_r.plot(*zip(*pts), "o-", color=color, label=f"{key} (ours)")
        ax_r.axhline(paper, color=color, linestyle="--", linewidth=1,
                     label=f"{key}, paper at 32K: {paper:.2f}x")
        at = dict(pts).get(32768)
        if at is not None:
            ax_r.annotate(f"{at:.2f}x", (32768, at), textcoords="offset points", xytext=(-8, 6),
                          ha="right", fontsize=8, color=color)
    ax_r.set_ylabel("iteration-time ratio (> 1: linear faster)")
    ax_r.set_title("Speed-up over softmax")
    _x_axis(ax_r, lengths, "sequence length")
    ax_r.legend(fontsize=7)

    ax_m.set_ylabel("GiB (compiled step: args + outputs + temps - aliases)")
    ax_m.set_title("Peak memory of the step")
    _x_axis(ax_m, lengths, "sequence length")
    ax_m.legend(fontsize=7)
    env = payload.get("environment", {})
    fig.suptitle(f"bench_train on {env.get('device_kind', '?')}, {env.get('date_utc', '')}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_inference(payload: dict, path: str) -> str:
    """Draws the inference benchmark's figure.

    Args:
      payload: the ``bench_inference`` JSON payload (``records`` with ``model``, ``context``,
        ``prefill``/``decode`` sub-records).
      path: the PNG to write.

    Returns:
      ``path``.

    Raises:
      OSError: if the file cannot be written.
    """
    records = payload["records"]
    contexts = sorted({r["context"] for r in records})
    models = [m for m in ("dense", "hybrid", "pure") if any(r["model"] == m for r in records)]
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    (ax_p, ax_d), (ax_r, ax_m) = axes
    for model in models:
        rows = sorted((r for r in records if r["model"] == model), key=lambda r: r["context"])
        color = COLORS.get(model)
        for ax, part, key, scale in ((ax_p, "prefill", "us_per_token", 1.0),
                                     (ax_d, "decode", "ms_per_token", 1.0)):
            sub = [(r["context"], r.get(part) or {}) for r in rows]
            pts = [(x, d[key] * scale) for x, d in sub if d.get(key) is not None]
            if pts:
                ax.plot(*zip(*pts), "o-", color=color, label=model)
            _mark_failures(ax, [(x, d.get("status", "")) for x, d in sub
                                if d.get(key) is None and d.get("status")], color)
        mem = [(r["context"], ((r.get("prefill") or {}).get("memory") or {}).get("peak_estimate"))
               for r in rows]
        mem = [(x, y / 2**30) for x, y in mem if y is not None]
        if mem:
            ax_m.plot(*zip(*mem), "o-", color=color, label=f"{model} prefill (compiled)")
        state = [(r["context"], (r.get("decode") or {}).get("state_bytes")) for r in rows]
        state = [(x, y / 2**30) for x, y in state if y]
        if state:
            ax_m.plot(*zip(*state), "s--", color=color, label=f"{model} decode state",
                      markerfacecolor="none")
    ax_p.set_title("Prefill time per input token")
    ax_p.set_ylabel("microseconds per token")
    ax_d.set_title("Decode time per output token (batch 1)")
    ax_d.set_ylabel("milliseconds per token")
    for ax in (ax_p, ax_d, ax_m):
        _log_y(ax)
        _x_axis(ax, contexts, "context (tokens)")
        ax.legend(fontsize=7)

    ratios = payload.get("summary", {}).get("ratios", {})
    paper_x = PAPER_INFERENCE["context"]
    for key, color, paper in (("prefill dense/hybrid", "tab:green", PAPER_INFERENCE["prefill"]),
                              ("decode dense/hybrid", "tab:orange", PAPER_INFERENCE["decode"])):
        pts = sorted((int(c), row[key]) for c, row in ratios.items() if key in row)
        if pts:
            ax_r.plot(*zip(*pts), "o-", color=color, label=f"{key} (ours)")
        ax_r.plot([paper_x], [paper], marker="*", markersize=13, markerfacecolor="none",
                  color=color, linestyle="none", label=f"{key}, paper at 512K: {paper}x")
        ax_r.axhline(paper, color=color, linestyle=":", linewidth=1)
        at = dict(pts).get(paper_x)
        if at is not None:
            ax_r.annotate(f"{at:.2f}x", (paper_x, at), textcoords="offset points",
                          xytext=(-8, 6), ha="right", fontsize=8, color=color)
    ax_r.set_title("Speed-up of the hybrid over dense")
    ax_r.set_ylabel("time ratio dense / hybrid (> 1: hybrid faster)")
    _x_axis(ax_r, sorted(set(contexts) | {paper_x}), "context (tokens)")
    ax_r.legend(fontsize=7)
    ax_m.set_title("Memory")
    ax_m.set_ylabel("GiB")
    env = payload.get("environment", {})
    fig.suptitle(f"bench_inference on {env.get('device_kind', '?')}, {env.get('date_utc', '')}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv=None):
    """Redraws the figures from saved JSON results (``--train`` and/or ``--inference``)."""
    p = argparse.ArgumentParser(description="Redraw the model-benchmark figures from JSON.")
    p.add_argument("--train", help="bench_train JSON; writes <name>.png beside it")
    p.add_argument("--inference", help="bench_inference JSON; writes <name>.png beside it")
    p.add_argument("--out_dir", help="write the PNGs here instead")
    args = p.parse_args(argv)
    if not (args.train or args.inference):
        p.error("give --train and/or --inference")
    for path, fn in ((args.train, plot_train), (args.inference, plot_inference)):
        if not path:
            continue
        with open(path) as f:
            payload = json.load(f)
        png = os.path.splitext(path)[0] + ".png"
        if args.out_dir:
            os.makedirs(args.out_dir, exist_ok=True)
            png = os.path.join(args.out_dir, os.path.basename(png))
        print(fn(payload, png))


if __name__ == "__main__":
    main()
