r"""Model-level inference benchmark (issue 10): prefill time per input token, decode time per
output token and memory of a dense Transformer, a HypeNet hybrid and a pure Lightning model of
one width, batch 1, from 4K to 1M tokens of context, on one device.

Models (random weights: only time and memory are measured), by default 24 layers of width 1024,
SwiGLU 2816, vocabulary 32000 (tied head), bf16 weights and compute:

* ``dense``: every layer ``"attn"``: RoPE softmax attention, 16 query / 8 KV heads of 64 (GQA
  as in Qwen3), QK norm;
* ``hybrid``: HypeNet (arXiv 2601.22156): ``"attn_nope"`` (NoPE attention, output gate, logit
  scaling ``a = 500``) at every 4th layer, ``"lightning"`` (Lightning attention with RoPE, QK
  norm, output norm and gate, 16 heads of 64, no short convolution, as HALO builds it)
  elsewhere;
* ``pure``: every layer ``"lightning"``.

Reference (paper 2, Figs. 1 and 6): at 512K tokens HypeNet-2B decodes 3.0x and prefills 3.4x
faster than Qwen3-1.7B, and still runs at 1M tokens where the dense model runs out of memory.

Method (../shared/BENCHMARKS.md §5). Every prefill, decode-state allocation and decode step is
lowered on the main thread and compiled ahead of time in a thread pool before any timing.

* Prefill: one call of the model on a random prompt of ``context`` tokens with
  ``return_state=True`` (fresh KV caches of capacity ``context``, flash attention on a GPU;
  Lightning layers return their recurrent state) and ``last_logits_only=True`` (the next
  token's logits only). Reported: seconds per call (median of ``--prefill_iters`` after
  ``--prefill_warmup``; a call expected to take longer than ``--long_call_s`` is run once,
  without warm-up) and that time divided by ``context`` (time per input token).
* Decode: ``--decode_steps`` greedy one-token steps (after ``--decode_warmup`` untimed ones)
  from states whose KV caches have capacity ``context + warm-up + steps`` and are filled to
  ``length = context`` (Lightning states at position ``context``). The cost of a step does not
  depend on what the caches hold (attention reads the whole cache, masked by length), so the
  caches are zeros instead of a prefill's output, and decode is measured even where prefill is
  skipped. The states are donated to the step (updated in place). Reported: the median seconds
  per step (time per output token). With ``--decode_tokens_per_call=N`` each timed call runs
  N greedy steps in one program (``lax.fori_loop``, the host dispatching once per N tokens, as
  a serving loop would) and the time per token is the call's time / N.
* Memory: ``compiled`` = the executable's ``memory_analysis`` (arguments + outputs +
  temporaries - donated aliases: what the call needs, weights included); ``state`` = bytes of
  the decode states (KV caches + recurrent states); ``device peak`` = the allocator's
  high-water mark after the measurement (process-wide, never decreases along the sweep).
* An allocation failure is recorded as ``"out of memory"`` and the sweep goes on. Dense prefill
  above ``--max_dense_prefill`` tokens (default 512K: about 1-2 minutes at 1M on an H200) is
  recorded as ``"skipped (--max_dense_prefill)"``. With ``--time_budget_s``, a measurement whose
  cost, extrapolated from the previous context (quadratically for models with attention,
  linearly for the pure model), would overrun the budget is recorded as ``"skipped (time
  budget)"``, except those named by ``--always_run`` (default: the acceptance targets, dense
  and hybrid at 512K and the hybrid at 1M).

``<out>.json`` and ``<out>.md`` are rewritten after every measurement; ``<out>.png`` is drawn at
the end (``benchmarks/plot_model_bench.py``).

Usage::

    python benchmarks/bench_inference.py --out=benchmarks/results/inference-h200-<date>
    python benchmarks/bench_inference.py --tiny --out=/tmp/bench-inference-tiny   # CPU smoke
"""

import argparse
import gc
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Grow device memory on demand (BENCHMARKS.md §5.1) up to 95% of the device, so that the
# out-of-memory boundary is the device's, not the allocator's default 75%.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from benchmarks import common as bench  # noqa: E402
from lattn_jax import config as config_lib  # noqa: E402
from lattn_jax import flops as flops_lib  # noqa: E402
from lattn_jax import model as model_lib  # noqa: E402

MODELS = ("dense", "hybrid", "pure")
# Paper 2, Figs. 1 and 6 (HypeNet-2B vs Qwen3-1.7B).
PAPER = dict(context=524288, prefill_ratio=3.4, decode_ratio=3.0, hybrid_runs_at=1048576)
SKIPPED_CAP = "skipped (--max_dense_prefill)"

_DEFAULTS = dict(contexts=[4096, 16384, 65536, 262144, 524288, 1048576], d_model=1024,
                 num_layers=24, num_heads=16, num_kv_heads=8, head_dim=64, mlp_hidden=2816,
                 vocab_size=32000, dtype="bfloat16", decode_steps=16, decode_warmup=2,
                 prefill_warmup=1, prefill_iters=3)
_TINY_DEFAULTS = dict(contexts=[64, 128], d_model=64, num_layers=4, num_heads=4,
                      num_kv_heads=2, head_dim=16, mlp_hidden=128, vocab_size=256,
                      dtype="float32", decode_steps=2, decode_warmup=1, prefill_warmup=1,
                      prefill_iters=2)


def parse_args(argv=None) -> argparse.Namespace:
    """Command-line options (``argv`` without the program name; ``None``: ``sys.argv[1:]``).

    Raises:
      SystemExit: on a bad option (argparse prints the reason).
    """
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True,
                   help="output prefix: writes <out>.json, <out>.md and <out>.png")
    p.add_argument("--models", default=",".join(MODELS),
                   help=f"comma-separated subset of {', '.join(MODELS)}")
    p.add_argument("--contexts", type=bench.int_list, default=None,
                   help="comma-separated context lengths, integers with an optional K (x 1024) "
                        "or M (x 1048576) suffix (default 4K,16K,64K,256K,512K,1M; tiny: 64,128)")
    for name, kind in (("d_model", int), ("num_layers", int), ("num_heads", int),
                       ("num_kv_heads", int), ("head_dim", int), ("mlp_hidden", int),
                       ("vocab_size", int)):
        p.add_argument(f"--{name}", type=kind, default=None,
                       help=f"model {name} (default {_DEFAULTS[name]})")
    p.add_argument("--dtype", default=None, choices=("bfloat16", "float32"),
                   help="weights and compute (default bfloat16; tiny: float32)")
    p.add_argument("--attention_every", type=int, default=4,
                   help="the hybrid's softmax layers: every N-th layer, N >= 2 (HypeNet: 4)")
    p.add_argument("--decode_steps", type=int, default=None, help="timed decode steps (16)")
    p.add_argument("--decode_warmup", type=int, default=None, help="untimed decode steps (2)")
    p.add_argument("--decode_tokens_per_call", type=int, default=1,
                   help="greedy tokens per jitted decode call (lax.fori_loop when > 1); the "
                        "steps and warm-up above count calls")
    p.add_argument("--prefill_iters", type=int, default=None, help="timed prefill calls (3)")
    p.add_argument("--prefill_warmup", type=int, default=None, help="untimed prefill calls (1)")
    p.add_argument("--long_call_s", type=float, default=2.0,
                   help="a prefill expected to take longer runs once, without warm-up")
    p.add_argument("--max_dense_prefill", type=int, default=524288,
                   help="skip dense prefill above this context (0: no cap)")
    bench.add_sweep_args(
        p, tiny_help="CPU-sized models, two short contexts, few steps",
        always_run="hybrid:524288,dense:524288,hybrid:1048576",
        always_run_help="model:context pairs never skipped for the time budget (the targets)")
    args = p.parse_args(argv)
    bench.finish_sweep_args(p, args, defaults=_DEFAULTS, tiny_defaults=_TINY_DEFAULTS,
                            names="models", allowed=MODELS, pair_example="hybrid:1048576")
    if not args.contexts:
        p.error("--contexts: give at least one context length")
    bad = [f"--contexts={','.join(str(c) for c in args.contexts)}"] if min(args.contexts) < 1 \
        else []
    bad += [f"--{name}={getattr(args, name)}" for name in
            ("decode_steps", "decode_tokens_per_call", "prefill_iters") if getattr(args, name) < 1]
    if bad:
        p.error(f"{', '.join(bad)}: must be >= 1")
    _check_model_args(p, args)
    return args


# The ModelConfig fields (and stack_pattern arguments) set by a flag of this script.
_CONFIG_FLAGS = {"attention_freq": "--attention_every", "vocab_size": "--vocab_size",
                 "d_model": "--d_model", "num_layers": "--num_layers",
                 "num_kv_heads": "--num_kv_heads", "num_heads": "--num_heads",
                 "head_dim": "--head_dim", "head dimension": "--head_dim",
                 "mlp_hidden": "--mlp_hidden", "dtype": "--dtype"}


def _check_model_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The model flags' constraints (lattn_jax/config.py's checks for the models built here),
    as one ``p.error`` line naming the flag(s); then every chosen model is built, and a
    remaining ConfigError is reported under the flags its message names.

    Raises:
      SystemExit: through ``p.error``.
    """
    for name in ("d_model", "num_layers", "num_heads", "num_kv_heads", "head_dim", "mlp_hidden"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.vocab_size < 2:
        p.error(f"--vocab_size must be >= 2, got {args.vocab_size}")
    if args.num_heads % args.num_kv_heads:
        p.error(f"--num_heads={args.num_heads} must be a multiple of "
                f"--num_kv_heads={args.num_kv_heads}")
    if args.head_dim % 2:  # every model has RoPE layers (dense: attention; others: Lightning)
        p.error(f"--head_dim must be even (RoPE), got {args.head_dim}")
    if "hybrid" in args.models and args.attention_every < 2:
        p.error(f"--attention_every must be >= 2, got {args.attention_every}")
    for kind in args.models:
        try:
            model_config(kind, args)
        except config_lib.ConfigError as e:
            message = str(e)
            named = []
            for field, flag in _CONFIG_FLAGS.items():
                if re.search(rf"\b{field}\b", message) and flag not in named:
                    named.append(flag)
            p.error(f"{', '.join(named) or 'model options'}: invalid for the {kind} model "
                    f"({message})")


def model_config(kind: str, args: argparse.Namespace) -> config_lib.ModelConfig:
    """The ``dense``, ``hybrid`` or ``pure`` model of the benchmark (see the module docstring).

    Raises:
      ValueError: for an unknown kind; ConfigError for inconsistent sizes.
    """
    n = args.num_layers
    if kind == "dense":
        pattern = ("attn",) * n
    elif kind == "hybrid":
        pattern = config_lib.stack_pattern("hybrid", n, "lightning",
                                           attention_freq=args.attention_every,
                                           attention="attn_nope")
    elif kind == "pure":
        pattern = ("lightning",) * n
    else:
        raise ValueError(f"unknown model {kind!r}; choose from {', '.join(MODELS)}")
    attention = config_lib.AttentionConfig(
        num_heads=args.num_heads, num_kv_heads=args.num_kv_heads, head_dim=args.head_dim,
        rope_theta=1_000_000.0, qk_norm=True, output_gate=kind == "hybrid",
        logit_scaling_base=500.0 if kind == "hybrid" else None)
    lightning = config_lib.LightningConfig(
        num_heads=args.num_heads, num_kv_heads=args.num_heads, head_dim=args.head_dim,
        rope_theta=1_000_000.0, qk_norm=True, output_norm=True, output_gate=True,
        scale="1/sqrt(d)", conv_width=0, chunk_size=16 if args.tiny else 64)
    return config_lib.ModelConfig(
        vocab_size=args.vocab_size, d_model=args.d_model, layer_pattern=pattern,
        mlp_hidden=args.mlp_hidden, tie_embeddings=True, dtype=args.dtype,
        param_dtype=args.dtype, use_segment_ids=False, attention=attention,
        lightning=lightning)


class InferenceModel:
    """One benchmark model: its parameters on the device and the jitted functions to time.

    Args:
      config: the model configuration.
      seed: parameter initialisation seed.
      tokens_per_call: greedy tokens generated by one call of :attr:`step` (a
        ``lax.fori_loop`` over single steps when > 1).

    Attributes:
      init_params: ``jit(seed int32 [] -> nnx.State)``, the parameters created on the device.
      params: the parameters once created (``None`` before).
      prefill: ``jit((params, tokens int32 [1, T]) -> (logits fp32 [1, 1, S], states))``.
      init_decode: ``jit(capacity, length)``-specialised builders of decode states (see
        :meth:`decode_state_fn`).
      step: ``jit((params, token int32 [1], states) -> (next int32 [1], states))``, states
        donated; ``tokens_per_call`` greedy steps, returning the last token.
    """

    def __init__(self, config: config_lib.ModelConfig, seed: int = 0,
                 tokens_per_call: int = 1):
        self.config = config
        self.tokens_per_call = tokens_per_call

        def init(seed):
            # The seed is an argument, not a constant: with a constant key XLA constant-folds
            # the whole random initialisation at compile time (113 s for the dense model on the
            # H200, 2026-11-29).
            key = jax.random.key(seed)
            return nnx.split(model_lib.LanguageModel(config, rngs=nnx.Rngs(key)))[1]

        self._abstract_model = nnx.eval_shape(
            lambda: model_lib.LanguageModel(config, rngs=nnx.Rngs(seed)))
        self.graphdef, self.abstract_params = nnx.split(self._abstract_model)
        self.num_params = sum(int(np.prod(x.shape))
                              for x in jax.tree_util.tree_leaves(self.abstract_params))
        self.seed = seed
        self.init_params = jax.jit(init)
        self.params = None
        self.prefill = jax.jit(self._prefill)
        self.step = jax.jit(self._step if tokens_per_call == 1 else self._steps,
                            donate_argnums=(2,))

    def _model(self, params):
        return nnx.merge(self.graphdef, params)

    def _prefill(self, params, tokens):
        return self._model(params)(tokens, return_state=True, last_logits_only=True)

    def _step(self, params, token, states):
        logits, states = self._model(params)(token[:, None], state=states, return_state=True)
        return jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32), states

    def _steps(self, params, token, states):
        return jax.lax.fori_loop(
            0, self.tokens_per_call, lambda _, carry: self._step(params, *carry),
            (token, states))

    def decode_state_fn(self, capacity: int, length: int):
        """A jitted zero-argument function returning batch-1 decode states: KV caches of
        ``capacity`` slots filled to ``length`` (zeros), recurrent states at position
        ``length``."""
        def build():
            states = self._abstract_model.init_state(1, capacity)  # needs no parameters
            out = []
            for st in states:
                fields = getattr(st, "_fields", ())
                if "length" in fields:
                    st = st._replace(length=jnp.full_like(st.length, length))
                if "position" in fields:
                    st = st._replace(position=jnp.full_like(st.position, length))
                out.append(st)
            return out
        return jax.jit(build)

    def prefill_flops(self, context: int) -> float:
        """Model FLOPs of one prefill of ``context`` tokens (LM head on the last token only)."""
        per_token = flops_lib.flops_per_token(self.config, self.abstract_params, context,
                                              training=False)
        head = 2.0 * self.config.d_model * self.config.vocab_size
        return per_token * context - head * (context - 1)


def _nbytes(tree) -> int:
    return sum(int(np.prod(x.shape)) * jnp.dtype(x.dtype).itemsize
               for x in jax.tree_util.tree_leaves(tree))


def run(args: argparse.Namespace) -> dict:
    """Runs the sweep; returns the payload also written to ``<args.out>.json``.

    Returns:
      ``dict(environment, settings, records, summary)``; ``records`` has one entry per
      (context, model) with ``prefill`` and ``decode`` sub-records, each with a ``status``
      (``"ok"``, ``"out of memory"``, ``"skipped (...)"`` or ``"error: ..."``); times in
      seconds, memory in bytes.
    """
    budget = bench.TimeBudget(args.time_budget_s)
    env = bench.environment(["benchmarks/bench_inference.py"] + list(args.argv))
    print(f"bench_inference on {env['device_kind']} ({env['backend']}), jax {env['jax']}",
          flush=True)
    settings = {k: getattr(args, k) for k in (
        "models", "contexts", "d_model", "num_layers", "num_heads", "num_kv_heads", "head_dim",
        "mlp_hidden", "vocab_size", "dtype", "attention_every", "decode_steps", "decode_warmup",
        "prefill_iters", "prefill_warmup", "long_call_s", "max_dense_prefill", "time_budget_s",
        "tiny", "decode_tokens_per_call")}
    settings["always_run"] = sorted(f"{m}:{c}" for m, c in args.always_run)
    payload = dict(environment=env, settings=settings, records=[], summary={})
    models = {kind: InferenceModel(model_config(kind, args), args.seed,
                                   args.decode_tokens_per_call) for kind in args.models}
    peak = flops_lib.peak_flops_per_device()
    tokens_per_call = args.decode_tokens_per_call
    n_decode = (args.decode_warmup + args.decode_steps) * tokens_per_call  # tokens cached

    # -- lower everything on this thread, compile in a pool -------------------------------------
    # Execution order: contexts ascending; per context the hybrid first (the acceptance target),
    # then pure, then dense (whose prefill is the most expensive).
    order = [k for k in ("hybrid", "pure", "dense") if k in models]
    keys = [(c, k) for c in args.contexts for k in order]
    tasks = {(0, kind, "params"): (lambda m=models[kind]: m.init_params.lower(
        jax.ShapeDtypeStruct((), jnp.int32))) for kind in order}
    for context, kind in keys:
        m = models[kind]
        if not (kind == "dense" and 0 < args.max_dense_prefill < context):
            tasks[(context, kind, "prefill")] = (
                lambda m=m, c=context: m.prefill.lower(
                    m.abstract_params, jax.ShapeDtypeStruct((1, c), jnp.int32)))
        init_fn = m.decode_state_fn(context + n_decode, context)
        tasks[(context, kind, "init")] = init_fn.lower
        tasks[(context, kind, "decode")] = (
            lambda m=m, f=init_fn: m.step.lower(
                m.abstract_params, jax.ShapeDtypeStruct((1,), jnp.int32), jax.eval_shape(f)))
    t0 = time.perf_counter()
    compiled = bench.compile_concurrently(tasks, max_workers=args.compile_workers,
                                          log=lambda s: print(s, flush=True))
    settings["compile_wall_s"] = round(time.perf_counter() - t0, 2)
    print(f"lowered and compiled {len(tasks)} functions in {settings['compile_wall_s']} s",
          flush=True)

    # -- measure, one after another -------------------------------------------------------------
    last_prefill, last_decode = {}, {}  # kind -> (context, seconds per call / per step)
    for context, kind in keys:
        m = models[kind]
        rec = dict(model=kind, context=context, layers=m.config.num_layers,
                   attention_layers=sum(n in config_lib.ATTENTION_MIXERS
                                        for n in m.config.layer_pattern),
                   params=m.num_params)
        payload["records"].append(rec)
        if m.params is None:  # created on the device by the precompiled init
            init_exe, status, _ = compiled[(0, kind, "params")]
            if init_exe is not None:
                m.params, status = bench.guarded(init_exe, jnp.int32(m.seed))
            if m.params is None:
                rec["prefill"] = {"status": f"no parameters ({status})"}
                rec["decode"] = {"status": f"no parameters ({status})"}
                print(f"{kind}: no parameters ({status})", flush=True)
                continue
        forced = (kind, context) in args.always_run
        has_attention = rec["attention_layers"] > 0

        # Prefill.
        pre = rec["prefill"] = {}
        if (context, kind, "prefill") not in compiled:
            pre["status"] = SKIPPED_CAP
        else:
            exe, status, compile_s = compiled[(context, kind, "prefill")]
            pre.update(status=status, compile_s=round(compile_s, 2),
                       memory=bench.compiled_memory(exe) if exe is not None else None)
            prev = last_prefill.get(kind)
            per_call = None if prev is None else bench.scaled_estimate(
                prev[1], prev[0], context, 2.0 if has_attention else 1.0)
            long_call = per_call is not None and per_call > args.long_call_s
            warm, iters = (0, 1) if long_call else (args.prefill_warmup, args.prefill_iters)
            estimate = None if per_call is None else per_call * (warm + iters)
            if status == bench.OK and not forced and not budget.allows(estimate):
                pre.update(status=bench.SKIPPED_BUDGET, estimate_s=round(estimate, 2))
            elif status == bench.OK:
                tokens = jnp.asarray(np.random.default_rng(args.seed).integers(
                    0, args.vocab_size, (1, context), dtype=np.int32))
                times, status = bench.guarded(
                    bench.time_calls, lambda: exe(m.params, tokens), warmup=warm, iters=iters)
                del tokens
                gc.collect()
                pre["status"] = status
                if times is not None:
                    med = float(np.median(times))
                    flops = m.prefill_flops(context)
                    pre.update(s=med, min_s=float(np.min(times)), times_s=times,
                               us_per_token=1e6 * med / context, warmup=warm, iters=iters,
                               tflops=flops / med / 1e12,
                               mfu=None if peak is None else flops / med / peak)
                    last_prefill[kind] = (context, med)
                pre["device_memory"] = bench.device_memory()
        print(_progress(rec, "prefill"), flush=True)
        payload["summary"] = summarize(payload["records"])
        bench.write_report(args.out, payload, markdown(payload))

        # Decode.
        dec = rec["decode"] = {}
        init_exe, init_status, _ = compiled[(context, kind, "init")]
        exe, status, compile_s = compiled[(context, kind, "decode")]
        status = init_status if init_status != bench.OK else status
        dec.update(status=status, compile_s=round(compile_s, 2), steps=args.decode_steps,
                   tokens_per_call=tokens_per_call,
                   warmup=args.decode_warmup, capacity=context + n_decode,
                   memory=bench.compiled_memory(exe) if exe is not None else None)
        prev = last_decode.get(kind)
        estimate = None if prev is None else n_decode * bench.scaled_estimate(
            prev[1], prev[0], context, 1.0)
        if status == bench.OK and not forced and not budget.allows(estimate):
            dec.update(status=bench.SKIPPED_BUDGET, estimate_s=round(estimate, 2))
        elif status == bench.OK:
            holder = {}

            def measure():
                holder["states"] = init_exe()
                holder["token"] = jnp.zeros((1,), jnp.int32)
                dec["state_bytes"] = _nbytes(holder["states"])

                def one_step():
                    holder["token"], holder["states"] = exe(m.params, holder["token"],
                                                            holder["states"])
                    return holder["token"], holder["states"]
                return bench.time_calls(one_step, warmup=args.decode_warmup,
                                        iters=args.decode_steps)

            times, status = bench.guarded(measure)
            holder.clear()
            gc.collect()
            dec["status"] = status
            if times is not None:
                med = float(np.median(times)) / tokens_per_call
                dec.update(ms_per_token=1e3 * med,
                           min_ms=1e3 * float(np.min(times)) / tokens_per_call, times_s=times)
                last_decode[kind] = (context, med)
            dec["device_memory"] = bench.device_memory()
        print(_progress(rec, "decode"), flush=True)
        payload["summary"] = summarize(payload["records"])
        bench.write_report(args.out, payload, markdown(payload))
    if not args.no_plot:
        from benchmarks import plot_model_bench
        _, status = bench.guarded(plot_model_bench.plot_inference, payload, args.out + ".png")
        print(f"plot {args.out}.png: {status}", flush=True)
    return payload


def _progress(rec, part) -> str:
    r = rec[part]
    head = f"{rec['model']:>6} context={rec['context']:8d} {part:7}:"
    if part == "prefill" and r.get("s") is not None:
        return (f"{head} {r['s']:.4f} s ({r['us_per_token']:.3f} us/token, "
                f"{r['tflops']:.3g} TFLOP/s), compiled in {r['compile_s']} s")
    if part == "decode" and r.get("ms_per_token") is not None:
        return (f"{head} {r['ms_per_token']:.3f} ms/token, state "
                f"{bench.gib(r.get('state_bytes'))} GiB, compiled in {r['compile_s']} s")
    return f"{head} {r['status']}"


def summarize(records) -> dict:
    """Dense / hybrid and dense / pure ratios of prefill and decode time at every context,
    and the acceptance checks at 512K and 1M.

    Returns:
      ``{"ratios": {context: {"prefill dense/hybrid": r, ...}}, "targets": {...}}`` where the
      targets hold the measured 512K ratios, the paper's (3.4x prefill, 3.0x decode), whether
      they are met, and whether the hybrid ran (prefill and decode) at 1M.
    """
    get = {}
    for r in records:
        get[(r["model"], r["context"], "prefill")] = (r.get("prefill") or {}).get("s")
        get[(r["model"], r["context"], "decode")] = (r.get("decode") or {}).get("ms_per_token")
    ratios = {}
    for context in sorted({r["context"] for r in records}):
        row = {}
        for part in ("prefill", "decode"):
            for other in ("hybrid", "pure"):
                a, b = get.get(("dense", context, part)), get.get((other, context, part))
                if a and b:
                    row[f"{part} dense/{other}"] = a / b
        if row:
            ratios[context] = row
    at = ratios.get(PAPER["context"], {})
    pre, dec = at.get("prefill dense/hybrid"), at.get("decode dense/hybrid")
    big = [r for r in records if r["model"] == "hybrid" and r["context"] == PAPER["hybrid_runs_at"]]
    runs = None
    if big and "decode" in big[0]:
        runs = all((big[0].get(p) or {}).get("status") == bench.OK for p in ("prefill", "decode"))
    targets = {"context": PAPER["context"], "prefill dense/hybrid": pre,
               "paper prefill": PAPER["prefill_ratio"],
               "prefill meets paper": None if pre is None else pre >= PAPER["prefill_ratio"],
               "decode dense/hybrid": dec, "paper decode": PAPER["decode_ratio"],
               "decode meets paper": None if dec is None else dec >= PAPER["decode_ratio"],
               "hybrid runs at 1M": runs}
    return dict(ratios=ratios, targets=targets)


def markdown(payload) -> str:
    """The markdown report of a payload from :func:`run`."""
    env, s = payload["environment"], payload["settings"]
    lines = [f"# Inference benchmark ({env['date_utc']})", "",
             f"Hardware: {env['nvidia_smi'] or env['device_kind']} ({env['backend']}, "
             f"{env['device_count']} device(s); {env['host']}). Versions: python "
             f"{env['python']}, jax {env['jax']}, jaxlib {env['jaxlib']}, flax {env['flax']}, "
             f"optax {env['optax']}.", "", f"Command: `{env['command']}`", "",
             f"Models: {s['num_layers']} layers, d_model {s['d_model']}, {s['num_heads']} query "
             f"/ {s['num_kv_heads']} KV heads of {s['head_dim']}, SwiGLU {s['mlp_hidden']}, "
             f"vocabulary {s['vocab_size']}, {s['dtype']}; dense = all RoPE attention, hybrid = "
             f"NoPE attention every {s['attention_every']} layers + Lightning, pure = all "
             "Lightning. Batch 1, random weights.", "",
             "Prefill: one call on the whole prompt (fresh caches, last-token logits); time per "
             "input token = prefill time / context. Decode: median time of one greedy step from "
             f"caches filled to the context ({s['decode_steps']} timed calls after "
             f"{s['decode_warmup']}, {s.get('decode_tokens_per_call', 1)} token(s) per jitted "
             "call; time per token = call time / tokens per call). Memory: `compiled` = the "
             "executable's memory_analysis (arguments + outputs + temporaries - donated "
             "aliases, weights included); `state` = decode caches + recurrent states; "
             "`device peak` = allocator high-water mark after the measurement (process-wide, "
             "never decreases; – on CPU).", "",
             "| model | context | prefill (s) | prefill (us/token) | prefill TFLOP/s | prefill "
             "compiled (GiB) | decode (ms/token) | decode compiled (GiB) | state (GiB) | device "
             "peak (GiB) | prefill status | decode status |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in sorted(payload["records"], key=lambda r: (MODELS.index(r["model"]), r["context"])):
        pre, dec = r.get("prefill") or {}, r.get("decode") or {}
        dev = [(x.get("device_memory") or {}).get("peak_bytes_in_use") for x in (pre, dec)]
        dev = max([d for d in dev if d is not None], default=None)
        lines.append(
            f"| {r['model']} | {r['context']} | {bench.fmt(pre.get('s'), '.4f')} | "
            f"{bench.fmt(pre.get('us_per_token'), '.3f')} | {bench.fmt(pre.get('tflops'), '.3g')}"
            f" | {bench.gib((pre.get('memory') or {}).get('peak_estimate'))} | "
            f"{bench.fmt(dec.get('ms_per_token'), '.3f')} | "
            f"{bench.gib((dec.get('memory') or {}).get('peak_estimate'))} | "
            f"{bench.gib(dec.get('state_bytes'))} | {bench.gib(dev)} | "
            f"{pre.get('status', '–')} | {dec.get('status', '–')} |")
    ratios = payload["summary"].get("ratios", {})
    if ratios:
        lines += ["", "Time ratios (> 1: the linear model is faster):", "",
                  "| context | prefill dense/hybrid | decode dense/hybrid | prefill dense/pure | "
                  "decode dense/pure |", "|---:|---:|---:|---:|---:|"]
        for context, row in ratios.items():
            lines.append(f"| {context} | " + " | ".join(
                bench.fmt(row.get(k), ".2f") for k in (
                    "prefill dense/hybrid", "decode dense/hybrid", "prefill dense/pure",
                    "decode dense/pure")) + " |")
    t = payload["summary"].get("targets", {})

    def verdict(key, paper):
        if t.get(key) is None:
            return "not measured"
        return f"{t[key]:.2f}x ({'meets' if t[key] >= paper else 'below'} {paper}x)"

    runs = {None: "not measured", True: "yes", False: "no"}[t.get("hybrid runs at 1M")]
    lines += ["", f"Targets (paper 2, Figs. 1 and 6, at {PAPER['context']} tokens): prefill "
                  f"dense/hybrid {verdict('prefill dense/hybrid', PAPER['prefill_ratio'])}; "
                  f"decode dense/hybrid {verdict('decode dense/hybrid', PAPER['decode_ratio'])}; "
                  f"hybrid runs at {PAPER['hybrid_runs_at']} tokens: {runs}.", ""]
    return "\n".join(lines)


def main(argv=None) -> dict:
    """Entry point: parses ``argv`` (``None``: ``sys.argv[1:]``), runs, returns the payload."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    args.argv = argv
    return run(args)


if __name__ == "__main__":
    main()
