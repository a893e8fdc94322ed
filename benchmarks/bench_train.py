r"""Model-level training benchmark (issue 10): iteration time, tokens/s and peak memory of the
350M-class softmax dense, GDN hybrid and GDN pure presets (``configs/table2.py``) against the
sequence length, at a fixed number of tokens per batch, on one device.

An iteration is the trainer's own jitted step (``lattn_jax.train.Trainer``: forward, backward,
gradient clipping and the presets' optimizer, AdamW by default, with the NaN guard), in the
presets' precision: bf16 compute, fp32 master weights and optimizer state. Rows are full causal
windows of random tokens (no packing, no segment ids). Reference (paper 1, Fig. 6, 32K tokens):
softmax 3.37 s, GDN hybrid 1.56 s, GDN pure 0.96 s per iteration, i.e. softmax / GDN pure =
3.51.

Method (../shared/BENCHMARKS.md §5): every (preset, length) step is lowered on the main thread
and compiled ahead of time in a thread pool (XLA releases the GIL), all before any timing; then
each configuration runs ``--warmup`` untimed and ``--iters`` timed steps, each synchronised with
``block_until_ready``. Reported: the median (and minimum) wall-clock seconds per iteration,
tokens/s = tokens per batch / median, model TFLOP/s and MFU from ``lattn_jax.flops``, and two
memory figures: the compiled step's own estimate (``memory_analysis``: arguments + outputs +
temporaries - donated aliases) and the device allocator's high-water mark after the
configuration (process-wide, so it never decreases along the sweep). An out-of-memory failure is
recorded as ``"out of memory"`` and the sweep goes on; with ``--time_budget_s`` a configuration
whose cost, extrapolated from the previous length, would overrun the budget is recorded as
``"skipped (time budget)"``, except the ``--always_run`` pairs (default: every preset at 32K).
``<out>.json`` and ``<out>.md`` are rewritten after every configuration; ``<out>.png`` is drawn
at the end (``benchmarks/plot_model_bench.py``).

Usage::

    python benchmarks/bench_train.py --out=benchmarks/results/train-h200-<date>
    python benchmarks/bench_train.py --tiny --out=/tmp/bench-train-tiny     # CPU smoke run
"""

import argparse
import gc
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Grow device memory on demand (BENCHMARKS.md §5.1) up to 95% of the device, so that the
# allocator's high-water mark means something and large configurations are not refused early.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import common as bench  # noqa: E402
from configs import table2  # noqa: E402
from lattn_jax import config as config_lib  # noqa: E402
from lattn_jax import flops as flops_lib  # noqa: E402
from lattn_jax import train as train_lib  # noqa: E402

# Preset name -> configs/table2.py argument (the optimizer is appended from --opt).
PRESETS = {"softmax": "arch=softmax,stack=dense", "gdn_hybrid": "arch=gdn,stack=hybrid",
           "gdn_pure": "arch=gdn,stack=pure"}
# Paper 1, Fig. 6: seconds per training iteration at 32K tokens.
PAPER_32K_S = {"softmax": 3.37, "gdn_hybrid": 1.56, "gdn_pure": 0.96}
PAPER_LENGTH = 32768
PAPER_RATIO = PAPER_32K_S["softmax"] / PAPER_32K_S["gdn_pure"]  # 3.51

_DEFAULTS = dict(lengths=[2048, 4096, 8192, 16384, 32768], tokens_per_batch=32768, warmup=2,
                 iters=5)
_TINY_DEFAULTS = dict(lengths=[16, 32], tokens_per_batch=64, warmup=1, iters=2)


def parse_args(argv=None) -> argparse.Namespace:
    """Command-line options (``argv`` without the program name; ``None``: ``sys.argv[1:]``).

    Raises:
      SystemExit: on a bad option (argparse prints the reason).
    """
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True,
                   help="output prefix: writes <out>.json, <out>.md and <out>.png")
    p.add_argument("--presets", default=",".join(PRESETS),
                   help=f"comma-separated subset of {', '.join(PRESETS)}")
    p.add_argument("--lengths", type=bench.int_list, default=None,
                   help="sequence lengths, K/M suffixes allowed (default 2048,...,32768, "
                        "i.e. 2K,...,32K; tiny: 16,32)")
    p.add_argument("--tokens_per_batch", type=int, default=None,
                   help="tokens per batch, batch = tokens_per_batch / length (default 32768)")
    p.add_argument("--opt", default="adamw", choices=("adamw", "muon"),
                   help="the presets' optimizer recipe")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps (default 2)")
    p.add_argument("--iters", type=int, default=None, help="timed steps (default 5)")
    p.add_argument("--num_layers", type=int, default=None,
                   help="keep only the first N layers of each preset (quick checks)")
    bench.add_sweep_args(
        p, tiny_help="the presets' CPU-sized variants, two short lengths, 1 + 2 steps",
        always_run="softmax:32768,gdn_hybrid:32768,gdn_pure:32768",
        always_run_help="preset:length pairs never skipped for the time budget (the targets)")
    args = p.parse_args(argv)
    bench.finish_sweep_args(p, args, defaults=_DEFAULTS, tiny_defaults=_TINY_DEFAULTS,
                            names="presets", allowed=tuple(PRESETS), pair_example="softmax:32768")
    bad = [t for t in args.lengths if t < 1 or args.tokens_per_batch % t]
    if bad:
        p.error(f"--tokens_per_batch={args.tokens_per_batch} is not a multiple of length(s) {bad}")
    return args


def experiment_config(preset: str, opt: str, *, tiny: bool = False, num_layers=None,
                      overrides=()) -> config_lib.ExperimentConfig:
    """The Table 2 preset as a validated config (``num_layers`` truncates its layer pattern;
    ``overrides``: ``"section.key=value"`` strings, the value parsed as JSON when it parses,
    e.g. ``"model.split_projections=true"``, else taken as a string).

    Raises:
      ValueError: for an unknown preset, ``num_layers`` outside ``[1, L]``, or an override
        that is not ``path=value`` or names a key the config does not have.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
    arg = f"{PRESETS[preset]},opt={opt}" + (",tiny" if tiny else "")
    cfg = table2.get_config(arg)
    if num_layers is not None:
        pattern = tuple(cfg.model.layer_pattern)
        if not 1 <= num_layers <= len(pattern):
            raise ValueError(f"num_layers={num_layers} must be in [1, {len(pattern)}]")
        cfg.model.layer_pattern = pattern[:num_layers]
    for item in overrides:
        path, sep, text = item.partition("=")
        *parents, key = path.split(".")
        node = cfg
        for name in parents:
            node = node.get(name) if hasattr(node, "get") else None
        if not sep or node is None or key not in node:
            raise ValueError(f"override {item!r}: expected section.key=value naming an existing "
                             "config key")
        try:
            node[key] = json.loads(text)
        except json.JSONDecodeError:
            node[key] = text
    return config_lib.experiment_from_config_dict(cfg)


def _abstract_batch(batch: int, length: int):
    shape = (batch, length)
    return {"inputs": jax.ShapeDtypeStruct(shape, jnp.int32),
            "targets": jax.ShapeDtypeStruct(shape, jnp.int32),
            "weights": jax.ShapeDtypeStruct(shape, jnp.float32)}


def make_batch(batch: int, length: int, vocab_size: int, seed: int):
    """A batch of full causal rows of uniformly random tokens, on the default device.

    Returns:
      ``{"inputs", "targets"}`` int32 ``[B, T]`` and ``"weights"`` fp32 ``[B, T]`` (all ones).
    """
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab_size, (batch, length + 1), dtype=np.int32)
    return {"inputs": jnp.asarray(tokens[:, :-1]), "targets": jnp.asarray(tokens[:, 1:]),
            "weights": jnp.ones((batch, length), jnp.float32)}


def _is_deleted(tree) -> bool:
    return any(getattr(x, "is_deleted", lambda: False)() for x in jax.tree_util.tree_leaves(tree))


def run(args: argparse.Namespace) -> dict:
    """Runs the sweep; returns the payload also written to ``<args.out>.json``.

    Returns:
      ``dict(environment, settings, records, summary)``; ``records`` has one entry per (length,
      preset) with ``status`` ``"ok"``, ``"out of memory"``, ``"skipped (time budget)"`` or
      ``"error: ..."``; times in seconds, memory in bytes.
    """
    budget = bench.TimeBudget(args.time_budget_s)
    env = bench.environment(["benchmarks/bench_train.py"] + list(args.argv))
    print(f"bench_train on {env['device_kind']} ({env['backend']}), jax {env['jax']}",
          flush=True)
    settings = dict(presets=args.presets, lengths=args.lengths,
                    tokens_per_batch=args.tokens_per_batch, opt=args.opt, warmup=args.warmup,
                    iters=args.iters, tiny=args.tiny, num_layers=args.num_layers,
                    time_budget_s=args.time_budget_s,
                    always_run=sorted(f"{m}:{t}" for m, t in args.always_run))
    payload = dict(environment=env, settings=settings, records=[], summary={})
    peak = flops_lib.peak_flops_per_device()

    # -- build the trainers; lower every step on this thread, compile them all in a pool ------
    trainers, configs = {}, {}
    for preset in args.presets:
        configs[preset] = experiment_config(preset, args.opt, tiny=args.tiny,
                                            num_layers=args.num_layers)
        trainers[preset] = train_lib.Trainer(configs[preset])
    t0 = time.perf_counter()

    def lower(preset, length):
        trainer = trainers[preset]
        batch = _abstract_batch(args.tokens_per_batch // length, length)
        # The trainer's own jitted step (state donated), compiled ahead of time.
        return lambda: trainer._train_step_jit.lower(trainer.abstract_state(), batch)

    keys = [(length, preset) for length in args.lengths for preset in args.presets]
    tasks = {k: lower(k[1], k[0]) for k in keys}
    for preset in args.presets:  # the initial train states (parameters + optimizer state)
        tasks[("init", preset)] = lambda t=trainers[preset]: t._init_jit.lower(args.seed)
    compiled = bench.compile_concurrently(tasks, max_workers=args.compile_workers,
                                          log=lambda s: print(s, flush=True))
    payload["settings"]["compile_wall_s"] = round(time.perf_counter() - t0, 2)
    print(f"lowered and compiled {len(tasks)} functions in "
          f"{payload['settings']['compile_wall_s']} s", flush=True)

    # -- time them, one after another ---------------------------------------------------------
    states = {}
    last = {}  # preset -> (length, seconds per iteration) of the previous measured length
    for length, preset in keys:
        trainer, cfg = trainers[preset], configs[preset]
        batch_size = args.tokens_per_batch // length
        exe, status, compile_s = compiled[(length, preset)]
        params = trainer.abstract_state()["params"]
        n_params = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params))
        flops_iter = flops_lib.flops_per_token(cfg.model, params, length) * args.tokens_per_batch
        rec = dict(preset=preset, config=f"{PRESETS[preset]},opt={args.opt}",
                   layers=cfg.model.num_layers, params=n_params, seq_len=length,
                   batch=batch_size, tokens=args.tokens_per_batch, status=status,
                   compile_s=round(compile_s, 2), model_tflop_per_iter=flops_iter / 1e12,
                   memory=bench.compiled_memory(exe) if exe is not None else None)
        has_attention = any(n in config_lib.ATTENTION_MIXERS for n in cfg.model.layer_pattern)
        prev = last.get(preset)
        estimate = None if prev is None else (args.warmup + args.iters) * bench.scaled_estimate(
            prev[1], prev[0], length, 1.0 if has_attention else 0.0)
        forced = (preset, length) in args.always_run
        if status == bench.OK and not forced and not budget.allows(estimate):
            rec["status"] = bench.SKIPPED_BUDGET
            rec["estimate_s"] = round(estimate, 2)
        elif status == bench.OK:
            if preset not in states or _is_deleted(states[preset]):
                states.pop(preset, None)
                gc.collect()
                init_exe, status, _ = compiled[("init", preset)]
                state = None
                if init_exe is not None:
                    state, status = bench.guarded(init_exe, args.seed)
                if state is not None:
                    states[preset] = state
            if preset in states:
                batch = make_batch(batch_size, length, cfg.model.vocab_size, args.seed + length)
                holder = {"state": states[preset]}

                def step(holder=holder, exe=exe, batch=batch):
                    holder["state"], metrics = exe(holder["state"], batch)
                    return holder["state"], metrics

                times, status = bench.guarded(bench.time_calls, step, warmup=args.warmup,
                                              iters=args.iters)
                states[preset] = holder["state"]
                del batch
                if times is not None:
                    med = float(np.median(times))
                    rec.update(iter_s=med, iter_min_s=float(np.min(times)),
                               iter_mean_s=float(np.mean(times)), times_s=times,
                               tokens_per_s=args.tokens_per_batch / med,
                               tflops=flops_iter / med / 1e12,
                               mfu=None if peak is None else flops_iter / med / peak)
                    last[preset] = (length, med)
            rec["status"] = status
            rec["device_memory"] = bench.device_memory()
        payload["records"].append(rec)
        payload["summary"] = summarize(payload["records"])
        print(_progress(rec), flush=True)
        bench.write_report(args.out, payload, markdown(payload))
    states.clear()
    if not args.no_plot:
        from benchmarks import plot_model_bench
        _, status = bench.guarded(plot_model_bench.plot_train, payload, args.out + ".png")
        print(f"plot {args.out}.png: {status}", flush=True)
    return payload


def _progress(rec) -> str:
    if rec.get("iter_s") is None:
        return f"{rec['preset']:>10} T={rec['seq_len']:6d} B={rec['batch']:3d}: {rec['status']}"
    return (f"{rec['preset']:>10} T={rec['seq_len']:6d} B={rec['batch']:3d}: "
            f"{rec['iter_s']:.4f} s/iter, {rec['tokens_per_s']:,.0f} tok/s, "
            f"{rec['tflops']:.3g} TFLOP/s, compiled in {rec['compile_s']} s")


def summarize(records) -> dict:
    """Iteration-time ratios softmax / GDN pure and softmax / GDN hybrid at every length.

    Returns:
      ``{"ratios": {length: {"softmax/gdn_pure": r, "softmax/gdn_hybrid": r}}, "at_32k":
      {"softmax/gdn_pure": r or None, "paper": 3.51, "meets_paper": bool or None}}``.
    """
    times = {(r["preset"], r["seq_len"]): r.get("iter_s") for r in records}
    ratios = {}
    for length in sorted({r["seq_len"] for r in records}):
        row = {}
        for other in ("gdn_pure", "gdn_hybrid"):
            a, b = times.get(("softmax", length)), times.get((other, length))
            if a and b:
                row[f"softmax/{other}"] = a / b
        if row:
            ratios[length] = row
    at = ratios.get(PAPER_LENGTH, {}).get("softmax/gdn_pure")
    return dict(ratios=ratios, at_32k={"softmax/gdn_pure": at, "paper": PAPER_RATIO,
                                       "meets_paper": None if at is None else at >= PAPER_RATIO})


def markdown(payload) -> str:
    """The markdown report of a payload from :func:`run`."""
    env, s = payload["environment"], payload["settings"]
    lines = [f"# Training benchmark ({env['date_utc']})", "",
             f"Hardware: {env['nvidia_smi'] or env['device_kind']} ({env['backend']}, "
             f"{env['device_count']} device(s); {env['host']}). Versions: python "
             f"{env['python']}, jax {env['jax']}, jaxlib {env['jaxlib']}, flax {env['flax']}, "
             f"optax {env['optax']}.", "", f"Command: `{env['command']}`", "",
             f"One iteration = forward + backward + {s['opt']} update of one batch of "
             f"{s['tokens_per_batch']:,} tokens (batch = tokens / length), the trainer's jitted "
             f"step; median of {s['iters']} timed steps after {s['warmup']} warm-up steps. "
             "Memory: `compiled` = the step's `memory_analysis` (arguments + outputs + "
             "temporaries - donated aliases); `device peak` = the allocator's high-water mark "
             "after the configuration (process-wide, never decreases along the sweep; – on "
             "CPU). TFLOP/s and MFU use `lattn_jax.flops` (model FLOPs, 3x forward).", "",
             "| preset | layers | params | length | batch | iteration (s) | min (s) | tokens/s "
             "| TFLOP/s | MFU | compiled (GiB) | device peak (GiB) | compile (s) | status |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in payload["records"]:
        mem = (r.get("memory") or {}).get("peak_estimate")
        dev = (r.get("device_memory") or {}).get("peak_bytes_in_use")
        mfu = None if r.get("mfu") is None else 100 * r["mfu"]
        lines.append(
            f"| {r['preset']} | {r['layers']} | {r['params'] / 1e6:.1f}M | {r['seq_len']} | "
            f"{r['batch']} | {bench.fmt(r.get('iter_s'), '.4f')} | "
            f"{bench.fmt(r.get('iter_min_s'), '.4f')} | {bench.fmt(r.get('tokens_per_s'), ',.0f')}"
            f" | {bench.fmt(r.get('tflops'), '.3g')} | {bench.fmt(mfu, '.1f')}"
            f"{'%' if mfu is not None else ''} | {bench.gib(mem)} | {bench.gib(dev)} | "
            f"{r['compile_s']} | {r['status']} |")
    ratios = payload["summary"].get("ratios", {})
    if ratios:
        lines += ["", "Iteration-time ratios (> 1: the linear model is faster):", "",
                  "| length | softmax / GDN pure | softmax / GDN hybrid |", "|---:|---:|---:|"]
        for length, row in ratios.items():
            lines.append(f"| {length} | {bench.fmt(row.get('softmax/gdn_pure'), '.2f')} | "
                         f"{bench.fmt(row.get('softmax/gdn_hybrid'), '.2f')} |")
    at = payload["summary"].get("at_32k", {})
    verdict = ("not measured" if at.get("softmax/gdn_pure") is None else
               f"{at['softmax/gdn_pure']:.2f}x, "
               f"{'meets' if at['meets_paper'] else 'below'} the paper's {PAPER_RATIO:.2f}x")
    lines += ["", f"Target (paper 1, Fig. 6: softmax 3.37 s, GDN hybrid 1.56 s, GDN pure 0.96 s "
                  f"at 32K tokens): softmax / GDN pure at length {PAPER_LENGTH} >= "
                  f"{PAPER_RATIO:.2f}x: {verdict}.", ""]
    return "\n".join(lines)


def main(argv=None) -> dict:
    """Entry point: parses ``argv`` (``None``: ``sys.argv[1:]``), runs, returns the payload."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    args.argv = argv
    return run(args)


if __name__ == "__main__":
    main()
