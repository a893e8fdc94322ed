r"""The optimizer update alone, leaf by leaf against ``optim.flatten`` (flat vectors).

The HALO Stage-2 step's AdamW update took 9.5 ms per step on an H200 when jitted alone
(``results/profile-halo-stage2-2026-12-03.md``), against a memory floor of about 0.8 ms (read
``p, g, m, v`` and write ``p, m, v``: 28 bytes per fp32 parameter): launch-bound, several small
kernels per leaf. ``optim.flatten=True`` runs the same AdamW on raveled vectors
(``lattn_jax.optim.adamw_transform``). This binary times both on the HALO student's parameter
tree.

What it builds: the parameter shapes of the stage's student as ``profile_halo_step.py`` builds
it (``configs/halo_smollm2.py`` with ``--config_arg``, the teacher shape
``profile_halo_step.SMOLLM2_135M`` cast to ``hypenet.dtype``, ``experiment.student_config``
with ``--attention_layers``; ``loaders.abstract_params``), filled with random normals (values do
not change the cost), and gradient-shaped random inputs. The optimizer is the stage's
(``experiment.stage_cfgs``: ``optim`` and ``train.total_steps``), optionally with its ``name``
(``--names``) and ``weight_decay`` (``--weight_decays``) replaced; each is timed with
``flatten`` off and on.

What it times, per variant: ``jax.jit(update, donate_argnums=(1, 2))`` with ``update(grads,
opt_state, params) = (optax.apply_updates(params, u), opt_state')``, ``(u, opt_state') =
tx.update(grads, opt_state, params)``: after ``--warmup`` calls, ``--rounds`` rounds of
``--iters`` calls each synced with ``block_until_ready`` (``benchmarks.common.time_calls``),
the variants alternating round by round (BENCHMARKS.md §5.1); reported: the median of the round
medians, the minimum, a back-to-back figure (``--iters`` calls, one sync), the compile time,
and, on a GPU, the device kernels per call and their summed time from a ``jax.profiler`` trace of
``--trace_calls`` calls. Also the floor ``28 B x N / --hbm_tbps`` and a correctness gate: three
updates from the same start with ``flatten`` off and on, max abs difference of the params.

Outputs: ``<out>.json`` and ``<out>.md``. ``--tiny`` replaces the teacher by a 4-layer, width-64
model of the same kind (a CPU smoke run in seconds).

Usage (H200, from the repository root)::

    python benchmarks/bench_optimizer.py --weight_decays=0,0.1 \
        --out=benchmarks/results/optimizer-flatten-h200-<date>
"""

import dataclasses
import os
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from absl import app, flags  # noqa: E402

from benchmarks import common as bench  # noqa: E402
from benchmarks import profile_halo_step as phs  # noqa: E402
from configs import halo_smollm2  # noqa: E402
from lattn_jax import config as config_lib  # noqa: E402
from lattn_jax import optim  # noqa: E402
from lattn_jax.halo import experiment  # noqa: E402
from lattn_jax.halo import loaders  # noqa: E402

# The --tiny teacher: SmolLM2-135M's kind of model (tied embeddings, GQA, RoPE) at width 64.
TINY_TEACHER = config_lib.ModelConfig(
    vocab_size=256, d_model=64, layer_pattern=("attn",) * 4, mlp_hidden=128,
    tie_embeddings=True, use_segment_ids=False,
    attention=config_lib.AttentionConfig(num_heads=4, num_kv_heads=2, head_dim=16,
                                         rope_theta=1e5, qk_norm=False))
TINY_ATTENTION_LAYERS = (1,)
# Bytes per fp32 parameter of the ideal AdamW update: read p, g, m, v; write p, m, v.
BYTES_PER_PARAM = 28
# Gate on the params after 3 updates, flatten off vs on (fp32 last-bit differences only).
GATE_ATOL = 1e-5

_FLAGS: Dict[str, Any] = {}


def _define_flags() -> None:
    """Defines the binary's flags; only when run as a program, so that importing the module
    (its test) cannot clash with another module's flags in the same process."""
    _FLAGS.update(
        config_arg=flags.DEFINE_string("config_arg", "h200,stage2_len=2048",
                                       "configs/halo_smollm2.py's argument."),
        stage=flags.DEFINE_enum("stage", "stage2", list(phs.STAGES),
                                "Whose optimizer settings (the student is the Stage-2/3 one; "
                                "stage1 uses the Stage-1 student, no attention layers)."),
        attention_layers=flags.DEFINE_list(
            "attention_layers", None, "Attention layers of the student (default "
            f"{','.join(map(str, phs.ATTENTION_LAYERS))}; --tiny: "
            f"{','.join(map(str, TINY_ATTENTION_LAYERS))})."),
        names=flags.DEFINE_list("names", [], "optim.name values to time (adamw, muon); "
                                "empty: the stage config's."),
        weight_decays=flags.DEFINE_list("weight_decays", [], "optim.weight_decay values to "
                                        "time; empty: the stage config's (HALO: 0, one flat "
                                        "group; > 0: the decay / no_decay groups)."),
        warmup=flags.DEFINE_integer("warmup", 5, "Untimed calls per round."),
        iters=flags.DEFINE_integer("iters", 100, "Timed calls per round."),
        rounds=flags.DEFINE_integer("rounds", 2, "Rounds; the variants alternate."),
        trace_calls=flags.DEFINE_integer("trace_calls", 3, "Calls under the profiler for the "
                                         "kernel count (GPU; 0: no trace)."),
        hbm_tbps=flags.DEFINE_float("hbm_tbps", 4.8, "Memory bandwidth of the floor, TB/s "
                                    "(H200: 4.8)."),
        tiny=flags.DEFINE_bool("tiny", False, "Tiny teacher shape (CPU smoke run)."),
        seed=flags.DEFINE_integer("seed", 0, "Random params and gradients."),
        out=flags.DEFINE_string("out", None, "Output path prefix for .json and .md."),
    )


def student_setup(config_arg: str, stage: str, attention_layers: Optional[Sequence[int]],
                  tiny: bool):
    """The student's abstract parameters and the stage's optimizer settings.

    Args:
      config_arg: ``configs/halo_smollm2.get_config``'s argument.
      stage: ``"stage1"``, ``"stage2"`` or ``"stage3"``.
      attention_layers: the student's attention layers (``None``: the default; ignored for
        ``stage1``).
      tiny: :data:`TINY_TEACHER` instead of SmolLM2-135M's shape.

    Returns:
      ``(abstract_params, optim_cfg, total_steps, attention_layers)``: a pure dict of
      ``jax.ShapeDtypeStruct``, an ``OptimConfig``, an int and a tuple.

    Raises:
      ValueError: unknown ``stage`` or ``config_arg``, or an attention layer out of range.
    """
    if stage not in phs.STAGES:
        raise ValueError(f"stage={stage!r}; choose from {', '.join(phs.STAGES)}")
    config = halo_smollm2.get_config(config_arg)
    teacher_cfg = loaders.cast_config(TINY_TEACHER if tiny else phs.SMOLLM2_135M,
                                      dtype=config.hypenet.dtype)
    if stage == "stage1":
        layers = ()
    elif attention_layers is None:
        layers = TINY_ATTENTION_LAYERS if tiny else phs.ATTENTION_LAYERS
    else:
        layers = tuple(int(i) for i in attention_layers)
    student_cfg = experiment.student_config(config, teacher_cfg, layers)
    optim_cfg, train_cfg = experiment.stage_cfgs(config[stage])
    return loaders.abstract_params(student_cfg), optim_cfg, train_cfg.total_steps, layers


def random_tree(abstract: Any, seed: int, scale: float = 0.02) -> Any:
    """``scale x N(0, 1)`` arrays of ``abstract``'s shapes and dtypes, on the default device."""
    leaves, treedef = jax.tree_util.tree_flatten(abstract)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return jax.tree_util.tree_unflatten(treedef, [
        (scale * jax.random.normal(k, a.shape, jnp.float32)).astype(a.dtype)
        for k, a in zip(keys, leaves)])


def make_update(tx: optax.GradientTransformation, donate: bool = True):
    """``jit((grads, opt_state, params) -> (params', opt_state'))``, donating the state and the
    params (arguments 1 and 2) when ``donate``."""
    def update(grads, opt_state, params):
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state
    return jax.jit(update, donate_argnums=(1, 2) if donate else ())


def _copy(tree):
    return jax.tree_util.tree_map(jnp.copy, tree)


class Variant:
    """One optimizer setting: its compiled, donating update and the live (params, state)."""

    def __init__(self, label: str, cfg: config_lib.OptimConfig, total_steps: int, params,
                 grads):
        self.label, self.cfg, self.grads = label, cfg, grads
        self.tx = optim.make_optimizer(cfg, total_steps)
        self.params = _copy(params)
        self.state = jax.jit(self.tx.init)(self.params)
        fn = make_update(self.tx)
        t0 = time.perf_counter()
        self.compiled = fn.lower(grads, self.state, self.params).compile()
        self.compile_s = time.perf_counter() - t0
        self.round_ms: List[float] = []
        self.all_ms: List[float] = []

    def call(self):
        self.params, self.state = self.compiled(self.grads, self.state, self.params)
        return self.params

    def state_info(self) -> Dict[str, int]:
        leaves = jax.tree_util.tree_leaves(self.state)
        return {"state_leaves": len(leaves),
                "state_bytes": int(sum(x.size * x.dtype.itemsize for x in leaves))}


def gate(cfg: config_lib.OptimConfig, total_steps: int, params, grads, steps: int = 3
         ) -> float:
    """Max abs difference of the params after ``steps`` updates with ``flatten`` off and on
    (the same start and gradients)."""
    out = []
    for flat in (False, True):
        c = dataclasses.replace(cfg, flatten=flat)
        tx = optim.make_optimizer(c, total_steps)
        fn = make_update(tx, donate=False)
        p, s = params, tx.init(params)
        for _ in range(steps):
            p, s = fn(grads, s, p)
        out.append(p)
    return max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(
        jax.tree_util.tree_leaves(out[0]), jax.tree_util.tree_leaves(out[1])))


def kernel_profile(variant: Variant, calls: int) -> Dict[str, Optional[float]]:
    """Device kernels per call and their summed time per call (ms) from a trace of ``calls``
    calls; ``None`` values when the backend records no device kernels (CPU)."""
    if calls < 1:
        return {"kernels_per_call": None, "kernel_ms_per_call": None}
    events = bench.device_kernel_events(bench.trace_events(variant.call, calls))
    if not events:
        return {"kernels_per_call": None, "kernel_ms_per_call": None}
    return {"kernels_per_call": len(events) / calls,
            "kernel_ms_per_call": sum(e[2] for e in events) / calls / 1e3}


def run(*, config_arg: str = "h200,stage2_len=2048", stage: str = "stage2",
        attention_layers: Optional[Sequence[int]] = None, names: Sequence[str] = (),
        weight_decays: Sequence[float] = (), warmup: int = 5, iters: int = 100,
        rounds: int = 2, trace_calls: int = 3, hbm_tbps: float = 4.8, tiny: bool = False,
        seed: int = 0, out: Optional[str] = None, argv: Optional[Sequence[str]] = None,
        log=print) -> Dict[str, Any]:
    """Builds, compiles and times every (name, weight decay, flatten) variant.

    Args: as the flags of the same names (``argv``: the command line for the report).

    Returns:
      The report's payload: ``environment``, ``settings``, ``num_params``, ``num_leaves``,
      ``floor_ms`` (``28 x num_params / hbm_tbps``), and ``results``, one dict per variant
      with ``name``, ``weight_decay``, ``flatten``, ``ms_median`` (median of the round medians),
      ``ms_min``, ``ms_back_to_back``, ``compile_s``, ``state_leaves``, ``state_bytes``,
      ``kernels_per_call`` and ``kernel_ms_per_call`` (GPU trace; else ``None``), ``speedup``
      (flatten on only: off's median / on's) and ``gate_max_abs_diff`` (on only).

    Raises:
      ValueError: ``iters``, ``rounds`` < 1, ``warmup``, ``trace_calls`` < 0, ``hbm_tbps``
        <= 0, a name other than adamw / muon, a negative weight decay, and what
        :func:`student_setup` raises; ``ConfigError`` for an invalid optimizer setting.
    """
    if iters < 1 or rounds < 1 or warmup < 0 or trace_calls < 0:
        raise ValueError(f"need iters, rounds >= 1 and warmup, trace_calls >= 0; got "
                         f"{iters=} {rounds=} {warmup=} {trace_calls=}")
    if not hbm_tbps > 0:
        raise ValueError(f"hbm_tbps must be > 0, got {hbm_tbps}")
    for name in names:
        if name not in (optim.ADAMW, optim.MUON):
            raise ValueError(f"names: {name!r}; choose adamw or muon")
    if any(not 0 <= float(wd) < float("inf") for wd in weight_decays):
        raise ValueError(f"weight_decays must be finite and >= 0, got {list(weight_decays)}")
    abstract, base_cfg, total_steps, layers = student_setup(config_arg, stage,
                                                            attention_layers, tiny)
    leaves = jax.tree_util.tree_leaves(abstract)
    num_params = int(sum(np.prod(a.shape) for a in leaves))
    floor_ms = BYTES_PER_PARAM * num_params / (hbm_tbps * 1e12) * 1e3
    log(f"student: {num_params:,} params in {len(leaves)} leaves; floor {floor_ms:.3f} ms")
    params = random_tree(abstract, seed)
    grads = random_tree(abstract, seed + 1, scale=1e-3)

    settings = []
    for name in (list(names) or [base_cfg.name]):
        for wd in (list(weight_decays) or [base_cfg.weight_decay]):
            settings.append(dataclasses.replace(
                base_cfg, name=name, weight_decay=float(wd)))
    variants = []
    for cfg in settings:
        for flat in (False, True):
            label = f"{cfg.name} wd={cfg.weight_decay:g} flatten={flat}"
            v = Variant(label, dataclasses.replace(cfg, flatten=flat),
                        total_steps, params, grads)
            log(f"compiled {label} in {v.compile_s:.1f} s")
            variants.append(v)

    for r in range(rounds):
        for v in variants:
            times = bench.time_calls(v.call, warmup=warmup, iters=iters)
            v.round_ms.append(float(np.median(times)) * 1e3)
            v.all_ms.extend(t * 1e3 for t in times)
            log(f"round {r + 1}/{rounds} {v.label}: {v.round_ms[-1]:.3f} ms")

    results = []
    for i, v in enumerate(variants):
        row = {"name": v.cfg.name, "weight_decay": v.cfg.weight_decay, "flatten": v.cfg.flatten,
               "ms_median": float(np.median(v.round_ms)), "ms_min": float(np.min(v.all_ms)),
               "ms_rounds": v.round_ms,
               "ms_back_to_back": bench.time_back_to_back(v.call, iters) * 1e3,
               "compile_s": v.compile_s, **v.state_info(), **kernel_profile(v, trace_calls)}
        if v.cfg.flatten:
            off = results[i - 1]
            row["speedup"] = off["ms_median"] / row["ms_median"]
            row["gate_max_abs_diff"] = gate(v.cfg, total_steps, params, grads)
        results.append(row)
    bad = [r for r in results if r.get("gate_max_abs_diff", 0.0) > GATE_ATOL]
    payload = {
        "environment": bench.environment(argv),
        "settings": dict(config_arg=config_arg, stage=stage, attention_layers=list(layers),
                         warmup=warmup, iters=iters, rounds=rounds, trace_calls=trace_calls,
                         hbm_tbps=hbm_tbps, tiny=tiny, seed=seed, total_steps=total_steps,
                         optim=dataclasses.asdict(base_cfg)),
        "num_params": num_params, "num_leaves": len(leaves), "floor_ms": floor_ms,
        "gate_atol": GATE_ATOL, "gate_failed": bool(bad), "results": results,
    }
    if out:
        bench.write_report(out, payload, markdown(payload))
        log(f"wrote {out}.json and {out}.md")
    return payload


def markdown(payload: Dict[str, Any]) -> str:
    """The report page of a :func:`run` payload."""
    env, s = payload["environment"], payload["settings"]
    lines = [
        "# Optimizer update: leaf by leaf vs optim.flatten",
        "",
        f"{env['date_utc']}; {env['device_kind']} ({env['backend']}); jax {env['jax']}, "
        f"optax {env['optax']}.",
        "",
        f"Command: `{env['command']}`",
        "",
        f"Parameters: the HALO {s['stage']} student (`{s['config_arg']}`"
        f"{', tiny teacher' if s['tiny'] else ''}, attention layers {s['attention_layers']}): "
        f"{payload['num_params']:,} in {payload['num_leaves']} leaves. Floor (28 B/param at "
        f"{s['hbm_tbps']:g} TB/s): {payload['floor_ms']:.3f} ms.",
        "",
        f"Jitted `tx.update` + `optax.apply_updates`, state and params donated; median of "
        f"{s['rounds']} round medians of {s['iters']} synced calls after {s['warmup']} warm-up "
        f"calls, variants alternating. Gate: params after 3 updates, flatten off vs on, max abs "
        f"difference <= {payload['gate_atol']:g}"
        f"{' — FAILED' if payload['gate_failed'] else ''}.",
        "",
        "| optimizer | weight decay | flatten | ms (median) | ms (min) | ms back to back | "
        "x floor | speed-up | kernels / call | kernel ms / call | state leaves | state GiB | "
        "compile s | gate max abs diff |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in payload["results"]:
        lines.append(
            f"| {r['name']} | {r['weight_decay']:g} | {'on' if r['flatten'] else 'off'} | "
            f"{r['ms_median']:.3f} | {r['ms_min']:.3f} | {r['ms_back_to_back']:.3f} | "
            f"{r['ms_median'] / payload['floor_ms']:.1f} | {bench.fmt(r.get('speedup'), '.2f')} | "
            f"{bench.fmt(r['kernels_per_call'], '.0f')} | "
            f"{bench.fmt(r['kernel_ms_per_call'])} | {r['state_leaves']} | "
            f"{bench.gib(r['state_bytes'])} | {r['compile_s']:.1f} | "
            f"{bench.fmt(r.get('gate_max_abs_diff'), '.2e')} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str]) -> int:
    if len(argv) > 1:
        print(f"bench_optimizer.py: unexpected arguments {list(argv[1:])}", file=sys.stderr)
        return 3
    f = {k: v.value for k, v in _FLAGS.items()}
    if not f["out"]:
        print("bench_optimizer.py: --out is required", file=sys.stderr)
        return 3
    try:
        layers = None if f["attention_layers"] is None else [int(i) for i in
                                                             f["attention_layers"]]
    except ValueError:
        print(f"bench_optimizer.py: --attention_layers={','.join(f['attention_layers'])}: "
              f"need comma-separated integers", file=sys.stderr)
        return 3
    try:
        wds = [float(w) for w in f["weight_decays"]]
    except ValueError:
        print(f"bench_optimizer.py: --weight_decays={','.join(f['weight_decays'])}: need "
              f"comma-separated numbers", file=sys.stderr)
        return 3
    # Before the (long) run: a report that cannot be written is an error now, not a traceback
    # at the end.
    out_dir = os.path.dirname(os.path.abspath(f["out"]))
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        print(f"bench_optimizer.py: --out={f['out']}: cannot create {out_dir}: "
              f"{e.strerror or e}", file=sys.stderr)
        return 3
    if not os.access(out_dir, os.W_OK):
        print(f"bench_optimizer.py: --out={f['out']}: {out_dir} is not writable",
              file=sys.stderr)
        return 3
    try:
        payload = run(config_arg=f["config_arg"], stage=f["stage"], attention_layers=layers,
                      names=f["names"], weight_decays=wds, warmup=f["warmup"],
                      iters=f["iters"], rounds=f["rounds"], trace_calls=f["trace_calls"],
                      hbm_tbps=f["hbm_tbps"], tiny=f["tiny"], seed=f["seed"], out=f["out"],
                      argv=sys.argv)
    except (ValueError, config_lib.ConfigError) as e:
        print(f"bench_optimizer.py: {e}", file=sys.stderr)
        return 3
    except OSError as e:
        print(f"bench_optimizer.py: --out={f['out']}: {e}", file=sys.stderr)
        return 3
    return 1 if payload["gate_failed"] else 0


if __name__ == "__main__":
    _define_flags()
    from lattn_jax import flag_errors  # one-line flag errors (absl only)
    app.run(main, flags_parser=flag_errors.parse_flags)
