"""Multi-device training: data, FSDP and tensor parallel runs against one device.

Runs the real trainer (``experiments/train.py``) on the same preset, data stream and *global*
batch with different meshes, then compares each run's loss curve with the one-device run and
reports tokens/s per device and the scaling efficiency (strong scaling: the same global batch
spread over N devices, efficiency = tokens/s / (N x one-device tokens/s)). Runs:

* ``1dev``: one device (the reference curve);
* ``1dev_repeat``: one device again, on the *last* device, so that it can run beside ``1dev``
  in a second invocation; the two one-device curves show the run-to-run noise of the kernels
  (atomics, reduction order) next to which the sharded curves are judged;
* ``dp`` / ``fsdp`` / ``tp``: all devices as ``mesh = (N, 1, 1)`` / ``(1, N, 1)`` /
  ``(1, 1, N)`` (``--config.mesh.data/fsdp/tensor``);
* ``restore_1dev``: the checkpoint that ``fsdp`` saved on N devices, restored on one device by
  the trainer (the workdir's checkpoints copied; ``total_steps`` already reached, so the trainer
  evaluates the restored model): its validation loss must equal the N-device run's.

A sharded run passes when every logged window's training loss and every validation loss lies
within ``--rel_tol`` (relative) of the one-device run's; the report also prints the
``1dev_repeat`` differences as the noise floor.

Devices: on GPUs each run gets ``CUDA_VISIBLE_DEVICES`` (first k, or the last one for
``1dev_repeat``); with ``--cpu_devices=N`` each run gets N (or 1) simulated host devices
(``--xla_force_host_platform_device_count``), for a smoke run on a CPU.

The report is built from the run directories on disk (``<out>/<run>/metrics.jsonl`` and
``<out>/<run>.run.json``), so several invocations into the same ``--out`` (e.g. the two
one-device runs side by side on two GPUs, then the sharded ones) make one table; ``--runs=``
(empty) only rewrites it. Example (the command behind ``benchmarks/results/multi-gpu-*.md``)::

    python benchmarks/multi_gpu.py --out=/tmp/mg --runs=1dev &
    python benchmarks/multi_gpu.py --out=/tmp/mg --runs=1dev_repeat; wait
    python benchmarks/multi_gpu.py --out=/tmp/mg --runs=dp,fsdp,tp,restore_1dev
"""

import argparse
import datetime
import json
import os
import shlex
import shutil
import subprocess
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _ROOT)

from benchmarks import common as bench  # noqa: E402  (imports jax; starts no backend)
from benchmarks import train_throughput as tt  # noqa: E402
from lattn_jax import records  # noqa: E402  (json and absl logging only)

RUNS = ("1dev", "1dev_repeat", "dp", "fsdp", "tp", "restore_1dev")
_MESH = {"dp": (-1, 1, 1), "fsdp": (1, -1, 1), "tp": (1, 1, -1)}


def _parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--runs", default=",".join(RUNS),
                        help=f"comma-separated subset of {', '.join(RUNS)}, run in this order")
    parser.add_argument("--preset", default="arch=gdn,stack=hybrid,opt=muon",
                        help="configs/table2.py argument")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch_size", type=int, default=8, help="global rows per step")
    parser.add_argument("--seq_len", type=int, default=4096)
    parser.add_argument("--log_every", type=int, default=5)
    parser.add_argument("--eval_every", type=int, default=50)
    parser.add_argument("--skip_windows", type=int, default=2,
                        help="logging windows left out of tokens/s (compile, warm-up)")
    parser.add_argument("--rel_tol", type=float, default=0.01,
                        help="relative loss difference a sharded run may have")
    parser.add_argument("--num_devices", type=int, default=None,
                        help="devices of the sharded runs (default: the GPUs nvidia-smi lists)")
    parser.add_argument("--cpu_devices", type=int, default=None,
                        help="smoke run on simulated CPU devices: N for the sharded runs")
    parser.add_argument("--tiny", action="store_true", help="the tiny preset (CPU smoke run)")
    parser.add_argument("--extra", default="", help="extra flags for experiments/train.py")
    return parser.parse_args(argv)


def _gpu_count() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def _env(k: int, args, *, last: bool = False) -> dict:
    """The child's environment for a run on ``k`` devices (all of NCCL's settings kept)."""
    env = dict(os.environ)
    if args.cpu_devices:
        env["JAX_PLATFORMS"] = "cpu"
        flags = [f for f in env.get("XLA_FLAGS", "").split()
                 if not f.startswith("--xla_force_host_platform_device_count")]
        env["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={k}"])
    else:
        n = args.num_devices
        first = n - k if last else 0
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(first, first + k))
    return env


def _command(args, workdir: str, mesh) -> list:
    arg = args.preset + (",tiny" if args.tiny else "")
    data, fsdp, tensor = mesh
    return [sys.executable, os.path.join(_ROOT, "experiments", "train.py"),
            f"--config={os.path.join(_ROOT, 'configs', 'table2.py')}:{arg}",
            f"--workdir={workdir}", f"--config.train.total_steps={args.steps}",
            f"--config.data.batch_size={args.batch_size}", f"--config.data.seq_len={args.seq_len}",
            f"--config.train.log_every={args.log_every}",
            f"--config.train.eval_every={args.eval_every}",
            f"--config.train.checkpoint_every={args.steps}",
            f"--config.mesh.data={data}", f"--config.mesh.fsdp={fsdp}",
            f"--config.mesh.tensor={tensor}", "--config.train.tensorboard=False",
            "--config.data.max_val_batches=4"] + shlex.split(args.extra)


def _shown(cmd, env=None) -> str:
    """``cmd`` as a user would type it in the repository root, with the device variables
    (``CUDA_VISIBLE_DEVICES``, ``XLA_FLAGS``) that :func:`_env` set for it."""
    prefix = []
    for var in ("CUDA_VISIBLE_DEVICES", "XLA_FLAGS"):
        if env and env.get(var) and env.get(var) != os.environ.get(var):
            prefix.append(f"{var}={shlex.quote(env[var])}")
    parts = ["python"] + [c.replace(_ROOT + os.sep, "") for c in cmd[1:]]
    return " ".join(prefix + [shlex.quote(c) for c in parts])


def run_one(name: str, args) -> dict:
    """Runs one of :data:`RUNS` and writes ``<out>/<name>.run.json``; returns that record.

    Raises:
      SystemExit: ``restore_1dev`` without a finished ``fsdp`` checkpoint in ``--out``.
    """
    workdir = os.path.join(args.out, name)
    n = args.cpu_devices or args.num_devices
    if name in ("1dev", "1dev_repeat", "restore_1dev"):
        k, mesh = 1, (1, 1, 1)
    else:
        k, mesh = n, tuple(n if m == -1 else m for m in _MESH[name])
    if os.path.exists(workdir):
        shutil.rmtree(workdir)
    if name == "restore_1dev":
        src = os.path.join(args.out, "fsdp")
        if not os.path.isdir(os.path.join(src, "checkpoints")):
            raise SystemExit(f"error: --runs=restore_1dev needs the fsdp run's checkpoint in "
                             f"{src}; run fsdp first")
        os.makedirs(workdir)
        shutil.copytree(os.path.join(src, "checkpoints"), os.path.join(workdir, "checkpoints"))
        shutil.copy(os.path.join(src, "config.json"), workdir)
    cmd = _command(args, workdir, mesh)
    env = _env(k, args, last=name == "1dev_repeat")
    rc, params, wall = tt.run_trainer(cmd, workdir + ".log", label=name, env=env)
    record = {"name": name, "devices": k, "mesh": list(mesh), "rc": rc, "params": params,
              "wall_s": wall, "command": _shown(cmd, env)}
    with open(workdir + ".run.json", "w") as f:
        json.dump(record, f, indent=1)
    return record


def _curve(metrics_path: str):
    """``(train, val)``: step -> training loss and step -> validation loss of a run's
    ``metrics.jsonl`` (:func:`lattn_jax.records.read_records`: a last line cut short by a
    killed trainer is dropped with a warning; ``records.RecordsError`` for another bad line)."""
    rows = records.read_records(metrics_path)
    train = {r["step"]: r["train_loss"] for r in rows if "train_loss" in r}
    val = {r["step"]: r["val_loss"] for r in rows if "val_loss" in r}
    return train, val


def _max_rel(a: dict, b: dict):
    common = sorted(set(a) & set(b))
    if not common:
        return None
    return max(abs(a[s] - b[s]) / abs(b[s]) for s in common)


def collect(out: str, skip_windows: int, rel_tol: float) -> dict:
    """Reads every run under ``out`` and compares it with ``1dev``; the report's JSON."""
    runs = {}
    for name in RUNS:
        meta_path = os.path.join(out, name + ".run.json")
        if not os.path.exists(meta_path):
            continue
        with open(meta_path) as f:
            run = json.load(f)
        metrics = os.path.join(out, name, "metrics.jsonl")
        if run["rc"] or not os.path.exists(metrics):
            run["error"] = f"exit {run['rc']}, see {name}.log"
            runs[name] = run
            continue
        run["train"], run["val"] = _curve(metrics)
        if name != "restore_1dev":
            try:
                run.update(tt.summarise(metrics, skip_windows))
            except ValueError as e:
                run["error"] = str(e)
        runs[name] = run
    ref = runs.get("1dev")
    if ref and "error" not in ref:
        for name, run in runs.items():
            if "error" in run:
                continue
            if name == "restore_1dev":
                with open(os.path.join(out, name + ".log")) as f:
                    run["resumed"] = "Resuming from the checkpoint at step" in f.read()
                src = runs.get("fsdp", {}).get("val", {})
                last = max(src) if src else None
                if last is not None and last in run["val"]:
                    diff = abs(run["val"][last] - src[last]) / abs(src[last])
                    run.update(restored_step=last, val_saved=src[last],
                               val_restored=run["val"][last], val_rel_diff=diff,
                               ok=run["resumed"] and diff <= rel_tol / 10)
                continue
            run["train_rel_diff"] = _max_rel(run["train"], ref["train"])
            run["val_rel_diff"] = _max_rel(run["val"], ref["val"])
            run["per_device_tokens_per_sec"] = run["tokens_per_sec"] / run["devices"]
            run["scaling_efficiency"] = run["per_device_tokens_per_sec"] / ref["tokens_per_sec"]
            if name not in ("1dev",):
                diffs = [d for d in (run["train_rel_diff"], run["val_rel_diff"]) if d is not None]
                run["ok"] = bool(diffs) and max(diffs) <= rel_tol
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": bench.device_summary(), "rel_tol": rel_tol, "skip_windows": skip_windows,
            "versions": bench.package_versions("jax", "jaxlib", "flax", "optax",
                                               "orbax-checkpoint", "grain"),
            "runs": runs}


def _pct(x):
    return "" if x is None else f"{100 * x:.2f}%"


def render(result: dict) -> str:
    """The markdown report of :func:`collect`'s result."""
    runs = result["runs"]
    lines = [f"# Multi-device training ({result['date'][:10]})", "",
             f"- Date: {result['date']}. Device: {result['device']}.",
             f"- Versions: {json.dumps(result['versions'])}.",
             "- Each run: the same preset, data stream and global batch; tokens/s averaged over "
             f"the logged windows after the first {result['skip_windows']}; scaling efficiency = "
             "tokens/s per device / one-device tokens/s (strong scaling). Loss differences are "
             "the largest relative difference to the one-device run over the logged training "
             f"windows and the validation points; a run passes within {_pct(result['rel_tol'])}.",
             "", "| run | devices | mesh (data, fsdp, tensor) | tokens/s | tokens/s per device | "
             "scaling efficiency | MFU | train loss first -> last | max rel. train loss diff | "
             "max rel. val loss diff | within tolerance |",
             "|---|---:|---|---:|---:|---:|---:|---|---:|---:|---|"]
    for name, run in runs.items():
        if name == "restore_1dev":
            continue
        if "error" in run:
            lines.append(f"| {name} | {run['devices']} | {tuple(run['mesh'])} | failed: "
                         f"{run['error']} | | | | | | | |")
            continue
        mfu = "n/a" if run.get("mfu") is None else f"{100 * run['mfu']:.1f}%"
        ok = "" if "ok" not in run else ("yes" if run["ok"] else "**no**")
        lines.append(
            f"| {name} | {run['devices']} | {tuple(run['mesh'])} | "
            f"{run['tokens_per_sec']:,.0f} | {run.get('per_device_tokens_per_sec', 0):,.0f} | "
            f"{_pct(run.get('scaling_efficiency'))} | {mfu} | "
            f"{run['first_loss']:.4f} -> {run['last_loss']:.4f} | "
            f"{_pct(run.get('train_rel_diff'))} | {_pct(run.get('val_rel_diff'))} | {ok} |")
    restore = runs.get("restore_1dev")
    if restore:
        lines.append("")
        if "error" in restore:
            lines.append(f"- Restore on one device: failed ({restore['error']}).")
        elif "val_saved" in restore:
            lines.append(
                f"- Checkpoint saved by `fsdp` on {runs['fsdp']['devices']} devices at step "
                f"{restore['restored_step']}, restored by the trainer on 1 device: validation "
                f"loss {restore['val_restored']:.6f} vs {restore['val_saved']:.6f}"
                f" on {runs['fsdp']['devices']} devices (relative difference "
                f"{restore['val_rel_diff']:.2e}; {'ok' if restore['ok'] else '**not equal**'}).")
    lines += ["", "Commands:", ""]
    lines += [f"- {name}: `{run['command']}`" for name, run in runs.items()]
    return "\n".join(lines) + "\n"


def plot(result: dict, path: str) -> None:
    """Training-loss curves of every run (top) and their difference to ``1dev`` (bottom)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    runs = {n: r for n, r in result["runs"].items() if "train" in r and n != "restore_1dev"}
    if not any(r["train"] for r in runs.values()):
        return  # no run got as far as a logged step: nothing to draw
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 7), sharex=True)
    ref = {int(k): v for k, v in runs.get("1dev", {}).get("train", {}).items()}
    for i, (name, run) in enumerate(runs.items()):
        curve = sorted((int(k), v) for k, v in run["train"].items())
        steps = [s for s, _ in curve]
        top.plot(steps, [v for _, v in curve], color=f"C{i}",
                 label=f"{name} ({run['devices']} dev.)")
        if ref and name != "1dev":
            bottom.plot([s for s in steps if s in ref],
                        [100 * (v - ref[s]) / ref[s] for s, v in curve if s in ref],
                        color=f"C{i}", label=name)
    tol = 100 * result["rel_tol"]
    bottom.axhline(tol, color="gray", ls="--", lw=0.8)
    bottom.axhline(-tol, color="gray", ls="--", lw=0.8)
    top.set_ylabel("training loss (nats/token)")
    bottom.set_ylabel("difference to 1dev (%)")
    bottom.set_xlabel("step")
    top.legend()
    bottom.legend()
    top.set_title("Same global batch on 1 and N devices")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(out: str, args) -> dict:
    result = collect(out, args.skip_windows, args.rel_tol)
    with open(os.path.join(out, "multi_gpu.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(out, "multi_gpu.md"), "w") as f:
        f.write(render(result))
    if result["runs"]:
        plot(result, os.path.join(out, "multi_gpu.png"))
    return result


def main(argv=None):
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    names = [n for n in args.runs.split(",") if n]
    for n in names:
        if n not in RUNS:
            raise SystemExit(f"error: --runs: unknown run {n!r}; choose from {', '.join(RUNS)}")
    for flag in ("steps", "batch_size", "seq_len", "log_every", "eval_every"):
        if getattr(args, flag) < 1:
            raise SystemExit(f"error: --{flag} must be >= 1, got {getattr(args, flag)}")
    if args.cpu_devices is not None and args.cpu_devices < 1:
        raise SystemExit(f"error: --cpu_devices must be >= 1, got {args.cpu_devices}")
    if args.cpu_devices and args.num_devices is not None:
        raise SystemExit("error: --num_devices is for GPU runs; with --cpu_devices=N the runs "
                         "use N simulated devices")
    if not args.cpu_devices and args.num_devices is None:
        args.num_devices = _gpu_count()
    n = args.cpu_devices or args.num_devices
    if names and not n:
        raise SystemExit("error: no GPU found; pass --cpu_devices=N for a CPU smoke run")
    if n and n < 2 and any(x in names for x in _MESH):
        raise SystemExit(f"error: --runs={args.runs} needs at least 2 devices, found {n}")
    for mesh_name in (x for x in names if x in ("dp", "fsdp")):
        if args.batch_size % n:
            raise SystemExit(f"error: --batch_size={args.batch_size} does not split over the "
                             f"{n} devices of --runs={mesh_name}; use a multiple of {n}")
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as e:
        raise SystemExit(f"error: --out={args.out}: {e.strerror}")
    failed = None
    for name in names:
        record = run_one(name, args)
        write_report(args.out, args)
        if record["rc"]:
            failed = record
            break  # the next runs share the preset and options: they would fail alike
    result = write_report(args.out, args)
    print(render(result), flush=True)
    if failed:
        with open(os.path.join(args.out, failed["name"] + ".log")) as f:
            said = [line.strip() for line in f if line.lower().startswith(("error", "raise"))
                    or "Error:" in line]
        reason = said[-1] if said else f"exit {failed['rc']}"
        raise SystemExit(f"error: run {failed['name']} failed ({reason}); its output is in "
                         f"{os.path.join(args.out, failed['name'] + '.log')}")
    return result


if __name__ == "__main__":
    main()
