r"""Where a training step's time goes: one preset's step split into parts and kernel classes.

Issue 7 asks for > 40% MFU on GDN pure; ``benchmarks/train_throughput.py`` measures the MFU, this
binary explains it. For a Table 2 preset (``benchmarks/bench_train.py``'s presets, the
trainer's own jitted step with its optimizer, bf16 compute and fp32 master weights) on one
device it reports, in ms per step:

* ``step``: the trainer's whole jitted step (forward, backward, gradient norm, optimizer, NaN
  guard; state donated), median of ``--iters`` synced calls;
* ``fwd_bwd``: the trainer's loss and gradients alone (``Trainer.loss_and_grads``: one pass,
  or the micro-batches of ``train.micro_batch_size``), jitted on its own;
* ``optimizer``: ``tx.update`` + ``apply_updates`` alone on gradient-shaped inputs (for Muon: the
  Newton-Schulz iterations, NorMuon and the AdamW group);
* from a ``jax.profiler`` trace of ``--trace_steps`` whole steps: summed kernel time per step by
  kernel class (Pallas mixer kernels, matmuls, attention, collectives, copies, other XLA
  fusions), the device-busy fraction of the step's wall time (the union of the kernels'
  intervals, so concurrent streams count once; idle = host dispatch, syncs, gaps), and the
  longest kernels by name;
* the model FLOPs of a step (``lattn_jax.flops``) and the MFU of ``step`` and of ``fwd_bwd``.

Each part is compiled before it is timed (compilation is excluded). On a CPU backend the
profiler has no device plane, so the class table is empty; ``--tiny`` (tiny model, short rows)
exists for that smoke run.

Usage (H200)::

    python benchmarks/profile_train_step.py --preset=gdn_pure --opt=muon \
        --out=benchmarks/results/profile-train-step-gdn-pure-h200-<date>
"""

import argparse
import collections
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from benchmarks import bench_train  # noqa: E402
from benchmarks import common as bench  # noqa: E402
from lattn_jax import flops as flops_lib  # noqa: E402
from lattn_jax import sharding  # noqa: E402
from lattn_jax import train as train_lib  # noqa: E402

# Kernel classes, first match wins (lower-cased substrings of the device kernel's name).
CLASSES = (
    ("pallas mixer", ("gdn_", "channelwise_", "lightning_", "deltanet_", "simple_gla_")),
    ("attention", ("fmha", "flash", "cudnn", "attention")),
    ("matmul", ("gemm", "cutlass", "cublas", "nvjet", "xmma", "sm90_", "wgmma", "triton_dot",
                "__dot", "dot_")),
    ("collective", ("nccl", "all-reduce", "all_reduce", "allreduce", "all-gather",
                    "reduce-scatter", "collective")),
    ("copy", ("memcpy", "memset", "copy")),
)
OTHER = "other XLA (fusions, reductions, transposes)"


def classify(name: str) -> str:
    """The kernel class of a device kernel named ``name`` (:data:`CLASSES`, else :data:`OTHER`)."""
    low = name.lower()
    for label, keys in CLASSES:
        if any(k in low for k in keys):
            return label
    return OTHER


def kernel_breakdown(events, steps: int, top: int = 25):
    """From Chrome-trace ``events`` of ``steps`` steps: ``(per-class summed kernel ms per step,
    busy ms per step (the union of the kernels' intervals: concurrent streams counted once),
    [(name, class, ms per step, calls per step)] of the longest kernels)``."""
    by_class, by_name, calls = collections.Counter(), collections.Counter(), collections.Counter()
    kernels = bench.device_kernel_events(events)
    for name, _, dur in kernels:
        by_class[classify(name)] += dur
        by_name[name] += dur
        calls[name] += 1
    classes = {k: v / 1e3 / steps for k, v in by_class.items()}
    busy = bench.busy_time([(ts, dur) for _, ts, dur in kernels]) / 1e3 / steps
    longest = [(n, classify(n), us / 1e3 / steps, calls[n] / steps)
               for n, us in by_name.most_common(top)]
    return classes, busy, longest


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="gdn_pure", choices=sorted(bench_train.PRESETS))
    p.add_argument("--opt", default="muon", help="optimizer of the preset (muon or adamw)")
    p.add_argument("--batch", type=int, default=8, help="rows per step")
    p.add_argument("--length", type=int, default=4096, help="tokens per row")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--trace_steps", type=int, default=3, help="whole steps under the profiler")
    p.add_argument("--tiny", action="store_true", help="tiny model (CPU smoke run)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--top", type=int, default=25, help="longest kernels listed")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="config override (repeatable), e.g. model.split_projections=true")
    p.add_argument("--out", default=None, help="output prefix for .json and .md")
    args = p.parse_args(argv)
    for name in ("batch", "length", "iters", "trace_steps", "top"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0:
        p.error(f"--warmup must be >= 0, got {args.warmup}")
    return args


def run(args: argparse.Namespace) -> dict:
    """Measures everything above; returns the payload also written to ``<args.out>.json``."""
    # The config's batch is the profiled one, so train.micro_batch_size splits it as in a run.
    cfg = bench_train.experiment_config(
        args.preset, args.opt, tiny=args.tiny,
        overrides=[f"data.batch_size={args.batch}", f"data.seq_len={args.length}"] + args.set)
    trainer = train_lib.Trainer(cfg)
    batch = bench_train.make_batch(args.batch, args.length, cfg.model.vocab_size, args.seed)
    tokens = args.batch * args.length
    params_abs = trainer.abstract_state()["params"]
    flops_step = flops_lib.flops_per_token(cfg.model, params_abs, args.length) * tokens
    peak = flops_lib.peak_flops_per_device()
    payload = dict(environment=bench.environment(["benchmarks/profile_train_step.py"]
                                                 + list(args.argv)),
                   settings={k: v for k, v in vars(args).items() if k != "argv"},
                   tokens_per_step=tokens,
                   model_tflop_per_step=flops_step / 1e12)
    times = {}
    with sharding.activate(trainer.mesh, trainer.rules):
        state = trainer.init_state(args.seed)
        fwd_bwd = jax.jit(trainer.loss_and_grads)

        def opt_update(grads, opt_state, params):
            updates, opt_state = trainer.tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state

        opt_jit = jax.jit(opt_update)
        grads = jax.tree_util.tree_map(
            lambda p: jax.random.normal(jax.random.key(1), p.shape, p.dtype) * 1e-3,
            state["params"])
        parts = {
            "fwd_bwd": lambda: fwd_bwd(state["params"], batch),
            "optimizer": lambda: opt_jit(grads, state["opt_state"], state["params"]),
        }
        for name, fn in parts.items():
            times[name] = bench.time_calls(fn, warmup=max(args.warmup, 1), iters=args.iters)
        holder = {"state": state}

        def step():
            holder["state"], metrics = trainer._train_step_jit(holder["state"], batch)
            return metrics

        times["step"] = bench.time_calls(step, warmup=max(args.warmup, 1), iters=args.iters)
        events = bench.trace_events(step, args.trace_steps)
    ms = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
    payload["ms"] = ms
    payload["mfu"] = None if peak is None else {
        k: flops_step / (ms[k] / 1e3) / peak for k in ("step", "fwd_bwd")}
    classes, busy, longest = kernel_breakdown(events, args.trace_steps, args.top)
    payload["device_ms_per_step_by_class"] = classes
    payload["kernel_ms_per_step"] = sum(classes.values())
    payload["device_busy_ms_per_step"] = busy
    payload["device_busy_fraction"] = busy / ms["step"] if classes else None
    payload["longest_kernels"] = [dict(name=n, cls=c, ms_per_step=t, calls_per_step=k)
                                  for n, c, t, k in longest]
    return payload


def markdown(payload: dict) -> str:
    """The report as markdown."""
    env, s, ms = payload["environment"], payload["settings"], payload["ms"]
    mfu = payload["mfu"] or {}
    lines = [f"# Training-step profile: {s['preset']} ({s['opt']}), {env.get('date_utc', '')}", "",
             f"Device: {env.get('device_kind')} ({env.get('backend')}); jax {env.get('jax')}.",
             f"Command: `{env.get('command', '')}`", "",
             f"Batch {s['batch']} x {s['length']} tokens; model FLOPs per step "
             f"{payload['model_tflop_per_step']:.2f} TFLOP (lattn_jax.flops).", "",
             "| part | ms per step | MFU |", "|---|---:|---:|"]
    for k in ("step", "fwd_bwd", "optimizer"):
        m = mfu.get(k)
        lines.append(f"| {k} | {ms[k]:.2f} | {'' if m is None else f'{100 * m:.1f}%'} |")
    lines += ["", "MFU of fwd_bwd counts the whole step's model FLOPs (6 N per token: forward "
              "and backward) against the time of the forward and backward alone.", ""]
    classes = payload["device_ms_per_step_by_class"]
    if classes:
        lines += [f"Device busy (at least one kernel running) "
                  f"{payload['device_busy_ms_per_step']:.2f} ms of the {ms['step']:.2f} ms step "
                  f"({100 * payload['device_busy_fraction']:.1f}% of the synced step; the rest "
                  "is the device waiting on the host); kernels' summed time "
                  f"{payload['kernel_ms_per_step']:.2f} ms.", "",
                  "| kernel class | summed ms per step | share of summed |", "|---|---:|---:|"]
        total = payload["kernel_ms_per_step"]
        for k, v in sorted(classes.items(), key=lambda kv: -kv[1]):
            lines.append(f"| {k} | {v:.2f} | {100 * v / total:.1f}% |")
        lines += ["", "| longest kernels | class | ms per step | calls per step |",
                  "|---|---|---:|---:|"]
        for r in payload["longest_kernels"]:
            lines.append(f"| `{r['name'][:80]}` | {r['cls']} | {r['ms_per_step']:.3f} | "
                         f"{r['calls_per_step']:.0f} |")
    else:
        lines.append("No device kernels in the trace (a CPU backend): no class table.")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    args = parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    t0 = time.perf_counter()
    payload = run(args)
    payload["wall_s"] = time.perf_counter() - t0
    md = markdown(payload)
    print(md)
    if args.out:
        bench.write_report(args.out, payload, md)
    return payload


if __name__ == "__main__":
    main()
