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
  longest kernels by name, each with its source line (:func:`add_sources`: the HLO instruction
  that launched it, from the trace's ``hlo_op`` event arg, else the instruction the kernel is
  named after, located in the step's optimized HLO by ``benchmarks/hlo_source.py``) and,
  when the trace names the launching instructions, the longest HLO instructions (XLA reuses
  one kernel for identical instructions, so one kernel name can stand for many);
* the model FLOPs of a step (``lattn_jax.flops``) and the MFU of ``step`` and of ``fwd_bwd``.

Each part is compiled before it is timed (compilation is excluded). On a CPU backend the
profiler has no device plane, so the class table is empty; ``--tiny`` (tiny model, short rows)
exists for that smoke run.

Usage (H200)::

    python benchmarks/profile_train_step.py --preset=gdn_pure --opt=muon \
        --out=benchmarks/results/profile-train-step-gdn-pure-h200-<date>

``--swiglu_packed=on`` / ``=off`` overrides ``model.swiglu_packed`` (the SwiGLU's ``fc1`` as one
product and ``lattn_jax.layers.swiglu_packed``: ``MOSAIC_GPU.md`` Sec. 46.2's experiment); the
A/B is two invocations on the same machine, e.g. with the 350M step's ``--batch=128
--set=train.micro_batch_size=8``, one per value. The report records the value the step ran
with (``payload["model_options"]``), as it does ``model.norm_implementation`` (``xla`` or
``pallas``, the one-pass Pallas RMSNorm kernels: MOSAIC_GPU.md Sec. 47's A/B, by
``--set=model.norm_implementation=...``).
"""

import argparse
import collections
import os
import re
import sys
import time
from typing import Any, List, Mapping, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from benchmarks import bench_train  # noqa: E402
from benchmarks import common as bench  # noqa: E402
from benchmarks import hlo_source  # noqa: E402
from configs.sweeps import common as sweeps_common  # noqa: E402
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


_HLO_KEY_RE = re.compile(r"\b(hlo_op|hlo_module)=([^,#\s]+)")


def hlo_op_of(args: Mapping[str, Any]) -> Optional[Tuple[str, str]]:
    """``(hlo_module, hlo_op)`` of a device kernel event's ``args``, or ``None``.

    XLA:GPU runs each kernel under the annotation ``XlaModule:#hlo_module=M,...#`` ::
    ``Thunk:#name=<op name>,hlo_op=<instruction>#`` and jax.profiler's CUPTI collector turns its
    ``key=value`` pairs into the kernel event's stats, which the Chrome trace writes as ``args``:
    ``hlo_op`` names the HLO instruction that launched the kernel even when XLA reuses one kernel
    (one name) for several identical instructions. Also accepted: the raw annotation text in any
    string arg (``...hlo_op=fusion.3...``). ``hlo_module`` is ``""`` when absent.
    """
    op, module = args.get("hlo_op"), args.get("hlo_module")
    if not op:
        for value in args.values():
            if isinstance(value, str) and "hlo_op=" in value:
                found = dict(_HLO_KEY_RE.findall(value))
                op, module = found.get("hlo_op"), module or found.get("hlo_module")
                break
    if not op or not isinstance(op, str):
        return None
    return (str(module or ""), op)


def instruction_breakdown(events, steps: int, top: Optional[int] = 25) -> List[dict]:
    """The ``top`` (``None``: all) longest HLO instructions of Chrome-trace ``events`` of
    ``steps`` steps.

    Groups the device kernel launches (:func:`benchmarks.common.device_kernel_events`) by the
    instruction that launched them (:func:`hlo_op_of`); launches without one are left out.

    Returns:
      ``[{"hlo_module", "hlo_op", "kernel" (the kernel name with the most time), "kernels"
      (names, most time first), "cls", "ms_per_step", "calls_per_step", "trace_op_name" (the
      annotation's op name, ``""`` if absent)}]``, longest first; ``[]`` when no launch names
      its instruction (a CPU backend, or a trace format without ``hlo_op``).
    """
    time, calls = collections.Counter(), collections.Counter()
    kernels = collections.defaultdict(collections.Counter)
    op_names = {}
    for name, _, dur, args in bench.device_kernel_events(events, with_args=True):
        key = hlo_op_of(args)
        if key is None:
            continue
        time[key] += dur
        calls[key] += 1
        kernels[key][name] += dur
        if isinstance(args.get("name"), str):
            op_names.setdefault(key, args["name"])
    rows = []
    for key, us in time.most_common(top):
        names = [n for n, _ in kernels[key].most_common()]
        rows.append(dict(hlo_module=key[0], hlo_op=key[1], kernel=names[0], kernels=names,
                         cls=classify(names[0]), ms_per_step=us / 1e3 / steps,
                         calls_per_step=calls[key] / steps,
                         trace_op_name=op_names.get(key, "")))
    return rows


def _source_text(attr: Optional[Mapping[str, Any]], more: int = 0) -> str:
    """``"<op> at <path:line> < <caller path:line> (<op name tail>)"`` of
    :meth:`HloIndex.attribute`'s dict (the first caller in the repository, if any), with
    ``"; +N other lines"`` for ``more``; ``""`` for ``None`` or no op name and no source."""
    if not attr or not (attr.get("op_name") or attr.get("source")):
        return ""
    op = attr["op_name"].split("/")[-1] if attr.get("op_name") else attr.get("opcode", "")
    text = f"{op} at {attr['source'] or '?'}"
    if attr.get("callers"):
        text += f" < {attr['callers'][0]}"
    tail = hlo_source.op_tail(attr.get("op_name", ""), 3)
    if tail and tail != op:
        text += f" ({tail})"
    if more:
        text += f"; +{more} other line{'s' if more > 1 else ''}"
    return text


def source_attribution(events, steps: int, longest, hlo_text: Optional[str],
                       top: int = 25) -> dict:
    """Attributes the longest kernels and the longest HLO instructions to source lines.

    Args:
      events: the Chrome-trace events :func:`kernel_breakdown` read.
      steps: steps in the trace.
      longest: :func:`kernel_breakdown`'s ``[(name, class, ms, calls)]``.
      hlo_text: the traced executable's optimized HLO (``Compiled.as_text()``), or ``None``.
      top: instructions listed.

    Returns:
      ``{"kernels": {kernel name: {"source", "op_name", "hlo_ops" (up to 8, most time first),
      "n_hlo_ops", "via"}}, "instructions": [:func:`instruction_breakdown` rows plus
      "opcode", "op_name", "source", "sources"], "hlo_module", "per_instruction" (whether the
      trace named the launching instructions), "error"}``. ``via`` is ``"trace"`` (the launches'
      ``hlo_op``), ``"name"`` (the HLO instruction the kernel is named after: a kernel XLA reuses
      for identical instructions then stands for its first one only) or ``""`` (no source).
      Source strings are :func:`_source_text`'s; a kernel not named after an instruction and
      without ``hlo_op`` (cuBLAS, cuDNN, Pallas without a trace's ``hlo_op``) gets ``""``.
      Never raises for a bad ``hlo_text``: ``error`` says why the HLO was not read.
    """
    index, error = None, None
    if hlo_text:
        try:
            index = hlo_source.parse_hlo(hlo_text)
        except Exception as e:  # noqa: BLE001 -- the profile stands without sources
            error = f"{type(e).__name__}: {e}"
    else:
        error = "no HLO text"

    def attribute(module, op):
        if index is None or (module and index.module and module != index.module):
            return None
        return index.attribute(op)

    instructions = instruction_breakdown(events, steps, top=None)
    by_kernel = collections.defaultdict(list)  # kernel -> [(ms, module, op, name)] (trace)
    for r in instructions:
        if is_command_buffer(r["hlo_op"]):
            continue  # a CUDA graph of many instructions: attribute its kernels by name
        for k in r["kernels"]:
            by_kernel[k].append((r["ms_per_step"], r["hlo_module"], r["hlo_op"],
                                 r["trace_op_name"]))
    kernels = {}
    for name, *_ in longest:
        ops, via = sorted(by_kernel.get(name, ()), reverse=True), "trace"
        if ops:
            attrs = [attribute(m, o) or dict(op_name=t, source="", opcode="")
                     for _, m, o, t in ops]
            op_list = [o for _, _, o, _ in ops]
        elif index is not None:
            insts = index.kernel_instructions(name)
            attrs = [index.attribute(i.name) for i in insts]
            op_list, via = [i.name for i in insts], "name"
        else:
            attrs, op_list, via = [], [], ""
        known = [a for a in attrs if a and (a["op_name"] or a["source"])]
        if not known and not ops:
            via = ""
        lines = {a["source"] for a in known}
        main = known[0] if known else None
        kernels[name] = dict(source=_source_text(main, len(lines) - 1 if main else 0),
                             op_name=main["op_name"] if main else "", hlo_ops=op_list[:8],
                             n_hlo_ops=len(op_list), via=via)
    rows = []
    for r in instructions[:top]:
        a = attribute(r["hlo_module"], r["hlo_op"]) or {}
        rows.append(dict(r, opcode=a.get("opcode", ""), op_name=a.get("op_name", ""),
                         source=_source_text(a) or r["trace_op_name"],
                         sources=a.get("sources", [])))
    total = sum(r["ms_per_step"] for r in instructions)
    in_buffers = sum(r["ms_per_step"] for r in instructions if is_command_buffer(r["hlo_op"]))
    return dict(kernels=kernels, instructions=rows,
                hlo_module=index.module if index is not None else None,
                per_instruction=bool(instructions), error=error,
                command_buffer_fraction=in_buffers / total if total else 0.0)


def is_command_buffer(hlo_op: str) -> bool:
    """Whether a trace's ``hlo_op`` is an XLA GPU command buffer (a CUDA graph that launches
    the kernels of many HLO instructions, ``command_buffer_<n>``) rather than one
    instruction."""
    return hlo_op.startswith("command_buffer")


def add_sources(payload: dict, events, steps: int, hlo_text: Optional[str], top: int) -> None:
    """Adds :func:`source_attribution` to a report's ``payload`` in place: each
    ``payload["longest_kernels"]`` row gains ``source``, ``op_name``, ``hlo_ops``, ``n_hlo_ops``
    and ``source_via``; ``payload["longest_hlo_instructions"]`` (``[]`` without ``hlo_op`` in
    the trace) and ``payload["source_attribution"]`` (``hlo_module``, ``per_instruction``,
    ``error``) are set."""
    longest = [(r["name"], r["cls"], r["ms_per_step"], r["calls_per_step"])
               for r in payload["longest_kernels"]]
    att = source_attribution(events, steps, longest, hlo_text, top)
    for r in payload["longest_kernels"]:
        k = att["kernels"].get(r["name"], {})
        r.update(source=k.get("source", ""), op_name=k.get("op_name", ""),
                 hlo_ops=k.get("hlo_ops", []), n_hlo_ops=k.get("n_hlo_ops", 0),
                 source_via=k.get("via", ""))
    payload["longest_hlo_instructions"] = att["instructions"]
    payload["source_attribution"] = {k: att[k] for k in ("hlo_module", "per_instruction",
                                                         "error", "command_buffer_fraction")}


def kernel_tables(payload: Mapping[str, Any]) -> List[str]:
    """Markdown lines: the longest-kernels table (with a ``source`` column when the payload has
    sources, :func:`add_sources`) and, when the trace named the launching instructions, the
    ``longest HLO instructions`` table."""
    with_src = any("source" in r for r in payload["longest_kernels"])
    lines = ["| longest kernels | class | ms per step | calls per step |"
             + (" source |" if with_src else ""),
             "|---|---|---:|---:|" + ("---|" if with_src else "")]
    for r in payload["longest_kernels"]:
        line = (f"| `{r['name'][:80]}` | {r['cls']} | {r['ms_per_step']:.3f} | "
                f"{r['calls_per_step']:.0f} |")
        if with_src:
            src = r.get("source", "")
            if r.get("n_hlo_ops", 0) > 1:
                src += f" [{r['n_hlo_ops']} HLO instructions]"
            line += f" {_md_cell(src)} |"
        lines.append(line)
    att = payload.get("source_attribution") or {}
    if with_src:
        note = (f"Sources from the step's optimized HLO (module `{att.get('hlo_module')}`)"
                if att.get("hlo_module") else
                f"No HLO sources ({att.get('error') or 'no HLO text'})")
        note += ("; kernels attributed per launch by the trace's `hlo_op`." if
                 att.get("per_instruction") else
                 "; the trace names no launching instruction (`hlo_op`): a kernel is attributed "
                 "to the instruction it is named after, and one XLA reuses for identical "
                 "instructions stands for the first of them only.")
        share = att.get("command_buffer_fraction") or 0.0
        if share > 0:
            note += (f" {share:.0%} of the traced kernel time was launched from XLA command "
                     "buffers (CUDA graphs, `command_buffer_<n>`), whose kernels are attributed "
                     "by name as above; for per-launch sources run with "
                     "`XLA_FLAGS=--xla_gpu_enable_command_buffer=` (no command buffers; the "
                     "step's time may change a little).")
        lines += ["", note]
    rows = payload.get("longest_hlo_instructions") or []
    if rows:
        lines += ["", "| longest HLO instructions | kernel | ms per step | launches per step "
                  "| source |", "|---|---|---:|---:|---|"]
        for r in rows:
            extra = len(r["kernels"]) - 1
            kernel = f"`{r['kernel'][:60]}`" + (f" (+{extra})" if extra else "")
            lines.append(f"| `{r['hlo_op']}` | {kernel} | {r['ms_per_step']:.3f} | "
                         f"{r['calls_per_step']:.0f} | {_md_cell(r['source'])} |")
    return lines


def _md_cell(text: str) -> str:
    """``text`` safe in a markdown table cell (``|`` escaped)."""
    return text.replace("|", "\\|")


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
    p.add_argument("--loss_chunk_size", type=int,
                   default=dict(sweeps_common.LOSS_CHUNK)["train.loss_chunk_size"],
                   help="train.loss_chunk_size: the LM head and cross-entropy fused in chunks of "
                   "this many tokens, as the Table 2/7 sweeps run them (configs/sweeps/common.py's "
                   "LOSS_CHUNK); 0: the plain head (the whole batch's fp32 logits)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="config override (repeatable), e.g. model.split_projections=true")
    p.add_argument("--swiglu_packed", type=_on_off, default=None,
                   help="on or off: model.swiglu_packed (default: the preset's, off), the "
                        "packed SwiGLU A/B of MOSAIC_GPU.md Sec. 46.2; applied after --set")
    p.add_argument("--out", default=None, help="output prefix for .json and .md")
    args = p.parse_args(argv)
    for name in ("batch", "length", "iters", "trace_steps", "top"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0:
        p.error(f"--warmup must be >= 0, got {args.warmup}")
    if args.loss_chunk_size < 0:
        p.error(f"--loss_chunk_size must be >= 0 (0: the plain head), got {args.loss_chunk_size}")
    return args


def _on_off(text: str) -> bool:
    """``"on"`` -> True, ``"off"`` -> False (argparse type); else ``ArgumentTypeError``."""
    if text not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"expected on or off, got {text!r}")
    return text == "on"


def config_overrides(args: argparse.Namespace) -> List[str]:
    """The ``"section.key=value"`` overrides of the profiled config, in order (a later one
    wins): the batch shape, ``--loss_chunk_size``, every ``--set``, then ``--swiglu_packed``
    (``model.swiglu_packed=true`` / ``false``; none when the flag is not given)."""
    swiglu = getattr(args, "swiglu_packed", None)
    return ([f"data.batch_size={args.batch}", f"data.seq_len={args.length}"]
            + ([f"train.loss_chunk_size={args.loss_chunk_size}"] if args.loss_chunk_size else [])
            + list(args.set)
            + ([] if swiglu is None else [f"model.swiglu_packed={str(bool(swiglu)).lower()}"]))


def run(args: argparse.Namespace) -> dict:
    """Measures everything above; returns the payload also written to ``<args.out>.json``."""
    # The config's batch is the profiled one, so train.micro_batch_size splits it as in a run.
    cfg = bench_train.experiment_config(args.preset, args.opt, tiny=args.tiny,
                                        overrides=config_overrides(args))
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
                   model_tflop_per_step=flops_step / 1e12,
                   # The model options the step ran with that the A/Bs switch (config values,
                   # after --set and --swiglu_packed).
                   model_options=dict(split_projections=bool(cfg.model.split_projections),
                                      swiglu_packed=bool(cfg.model.swiglu_packed),
                                      norm_implementation=cfg.model.norm_implementation))
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
        # Compiled once, here: the timed calls run this executable and its HLO text names the
        # traced kernels' sources.
        step_exe = trainer._train_step_jit.lower(state, batch).compile()

        def step():
            holder["state"], metrics = step_exe(holder["state"], batch)
            return metrics

        times["step"] = bench.time_calls(step, warmup=max(args.warmup, 1), iters=args.iters)
        events = bench.trace_events(step, args.trace_steps)
        hlo_text = step_hlo_text(step_exe)
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
    add_sources(payload, events, args.trace_steps, hlo_text, args.top)
    return payload


def step_hlo_text(compiled) -> Optional[str]:
    """The optimized HLO text of a ``jax.stages.Compiled``; ``None`` if it fails (printed: the
    profile stands without sources)."""
    try:
        return compiled.as_text()
    except Exception as e:  # noqa: BLE001
        print(f"no HLO text for the sources: {type(e).__name__}: {e}")
        return None


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
    options = payload.get("model_options")
    if options:  # before the table
        lines[-2:-2] = ["Model options: " + ", ".join(
            f"model.{k}={('on' if v else 'off') if isinstance(v, bool) else v}"
            for k, v in options.items()) + ".", ""]
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
        lines += [""] + kernel_tables(payload)
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
