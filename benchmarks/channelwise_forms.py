r"""Times variants of the per-channel-decay (KDA / GDN-2) forward kernels one stage at a time.

The whole-op tables (``benchmarks/bench_kernels.py``) and the launch sweep
(``benchmarks/tune_kernels.py``) time a pass end to end; this binary isolates two forward
stages of ``pallas_kernels/common/channelwise_gpu.py`` and times them under ``TUNING`` variants:

* ``intra``: the diagonal 16 x 16 blocks of Mk and Mq (``channelwise_gpu._intra``, the
  token-parallel kernel) with ``intra_token_heads`` heads per program at most and the
  ``intra_token`` launch; since 2026-11-30 (commit cd67293) the kernel also writes each token's
  qg, kg and krg rows, which its time includes (not comparable with earlier intra rows) but
  the comparison leaves out (only Mk and Mq's diagonal blocks are compared);
* ``prepare``: ``channelwise_gpu._prepare`` (``intra``, then the ``prepare`` kernel on 16 x 16
  sub-blocks and the ``wu`` kernel) under the ``prepare`` launch and key-block width
  (``prepare_k``) and the ``wu`` launch.

(Until 2026-11-30 the stages also compared kernel forms: the column loop and quad levels of
``intra``, a ``products`` kernel for prepare's off-diagonal blocks, prepare on whole
``[64, 64]`` tiles, prepare with W and U in the same kernel, its column blocks as a loop; those
lost on the H200 and were deleted, see the history above ``channelwise_gpu.TUNING``.)

Each variant is a set of TUNING overrides; every variant's outputs are compared with the first
variant of its stage (max abs difference over the entries the stage defines, which should be
rounding: the variants compute the same sums, in another order at most; records also carry
``max_abs``, the largest output magnitude, to scale it: bf16 outputs can differ by one bf16
step of it). Inputs: bf16 q, k (unit-norm scale), v, fp32 beta (the read-key and write-value
scale, as KDA) and fp32 gamma, the within-chunk cumsum of
``logsigmoid(N(0, 1))`` per channel (the tune_kernels KDA inputs). Times: median of
``--iters`` synced calls and the mean of ``--iters`` back-to-back calls with one sync
(``loop``), after three untimed calls (the first compiles), in ms. A variant that fails is
recorded with its error; if the stage's first variant fails, the others get no difference
(``None``).

Usage (H200)::

    python benchmarks/channelwise_forms.py --shape=8,4096,16,128 \
        --out=benchmarks/results/channelwise-forms-h200-<date>

``--interpret`` runs the kernels in Pallas interpret mode (any backend; for tests only: the
times then say nothing about GPU speed).
"""

import argparse
import json
import os
import sys
import time
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from benchmarks import common as bench  # noqa: E402
from pallas_kernels.common import channelwise_gpu  # noqa: E402

# (label, TUNING overrides) per stage; the first of each stage is the comparison baseline.
VARIANTS = {
    "intra": [
        *((f"tokens, {nh} head{'s' * (nh > 1)}, {w} warp{'s' * (w > 1)}, "
           f"{st} stage{'s' * (st > 1)}", {"intra_token_heads": nh, "intra_token": (w, st)})
          for nh, w, st in ((2, 1, 3), (1, 1, 3), (4, 1, 3), (4, 2, 3), (2, 2, 3), (4, 4, 1))),
    ],
    "prepare": [
        *((f"prepare {w}x{st} BK {bk}, wu {a[0]}x{a[1]}",
           {"prepare": (w, st), "prepare_k": bk, "wu": a})
          for (w, st, bk, a) in ((1, 3, 16, (4, 3)), (1, 3, 32, (4, 3)), (1, 2, 16, (4, 3)),
                                 (2, 3, 16, (4, 3)), (1, 3, 16, (4, 2)), (1, 3, 16, (2, 3)))),
    ],
}


def parse_shape(text):
    """``"B,T,H,D"`` -> a 4-tuple of ints.

    Raises:
      ValueError: naming ``--shape`` if it is not four positive ints with D in (64, 128) and T a
        multiple of the chunk size.
    """
    try:
        shape = tuple(int(x) for x in text.split(","))
    except ValueError:
        shape = ()
    if len(shape) != 4 or min(shape) < 1 or shape[3] not in (64, 128):
        raise ValueError(f"--shape: expected B,T,H,D with D in 64/128, got {text!r}")
    if shape[1] % channelwise_gpu.CHUNK:
        raise ValueError(f"--shape: T = {shape[1]} is not a multiple of {channelwise_gpu.CHUNK}")
    return shape


def parse_args(argv=None) -> argparse.Namespace:
    """The command line; a bad ``--shape`` or ``--stages`` exits with a message naming it."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="8,4096,16,128", help="B,T,H,D (D = K = V, 64 or 128)")
    p.add_argument("--iters", type=int, default=20, help="timed calls per variant")
    p.add_argument("--stages", default="intra,prepare", help="comma-separated: intra, prepare")
    p.add_argument("--out", default=None, help="output prefix for .md and .json")
    p.add_argument("--interpret", action="store_true", help="Pallas interpret mode (tests only)")
    args = p.parse_args(argv)
    try:
        args.shape = parse_shape(args.shape)
    except ValueError as e:
        p.error(str(e))
    args.stages = [x for x in args.stages.split(",") if x]
    for stage in args.stages:
        if stage not in VARIANTS:
            p.error(f"--stages: unknown stage {stage!r}; choose from {', '.join(VARIANTS)}")
    if args.iters < 1:
        p.error(f"--iters must be >= 1, got {args.iters}")
    return args


def make_inputs(shape, seed=0):
    """``(q, k, v, beta, gamma)`` at ``shape`` (T a multiple of 64): bf16 q, k (scale K^-0.5),
    v; fp32 beta ``[B, T, H, 1]`` (the KDA read-key and write-value scale) and gamma."""
    bsz, seq_len, heads, dim = shape
    ks = jax.random.split(jax.random.PRNGKey(seed), 6)
    bf = jnp.bfloat16
    q = jax.random.normal(ks[0], (bsz, seq_len, heads, dim)).astype(bf)
    k = (jax.random.normal(ks[1], (bsz, seq_len, heads, dim)) * dim ** -0.5).astype(bf)
    beta = jax.nn.sigmoid(jax.random.normal(ks[2], (bsz, seq_len, heads, 1)))
    v = jax.random.normal(ks[3], (bsz, seq_len, heads, dim)).astype(bf)
    g = jax.nn.log_sigmoid(jax.random.normal(ks[4], (bsz, seq_len, heads, dim)))
    n = seq_len // channelwise_gpu.CHUNK
    gam = jnp.cumsum(g.reshape(bsz, n, channelwise_gpu.CHUNK, heads, dim), axis=2)
    return q, k, v, beta, gam.reshape(g.shape)


def _stage_fn(stage, shape, interpret):
    bsz, seq_len, heads, dim = shape
    cfg = channelwise_gpu._config(
        batch=bsz, heads=heads, n_chunks=seq_len // channelwise_gpu.CHUNK, dk=dim, dv=dim,
        scale=dim ** -0.5, has_docs=False, mm_dtype=jnp.bfloat16, interpret=interpret,
        return_residual=False)
    if stage == "intra":
        def intra(q, k, v, beta, gam):  # the diagonal blocks (the decay-scaled rows aside)
            outs = channelwise_gpu._intra(cfg, q, k, beta, gam, ())
            return outs["mkd_ref"], outs["mqd_ref"]

        return jax.jit(intra)
    return jax.jit(lambda q, k, v, beta, gam: channelwise_gpu._prepare(
        cfg, q, k, v, beta, beta, gam, (), save_a=False))


def _written(stage, leaves):
    """The entries the stage defines: ``intra`` writes column j of row i of its ``[C, SUB]``
    diagonal-block rows only for j <= i mod SUB (the rest of its outputs is uninitialised
    memory), so those are zeroed before outputs are compared."""
    if stage != "intra":
        return leaves
    rows = jnp.arange(channelwise_gpu.CHUNK)[:, None] % channelwise_gpu.SUB
    keep = jnp.arange(channelwise_gpu.SUB)[None, :] <= rows
    return [jnp.where(keep, x, 0) for x in leaves]


def time_variants(stage, shape, iters, interpret=False):
    """Times every variant of ``stage``; returns a list of record dicts."""
    inputs = make_inputs(shape)
    records, base = [], None
    for index, (label, overrides) in enumerate(VARIANTS[stage]):
        rec = dict(stage=stage, variant=label, tuning=overrides)
        try:
            with mock.patch.dict(channelwise_gpu.TUNING, overrides):
                f = _stage_fn(stage, shape, interpret)
                out = jax.block_until_ready(f(*inputs))
                times = bench.time_calls(lambda: f(*inputs), warmup=2, iters=iters)
                rec["loop_ms"] = bench.time_back_to_back(lambda: f(*inputs), iters) * 1e3
                rec["ms"] = sorted(times)[len(times) // 2] * 1e3
            leaves = _written(stage, jax.tree_util.tree_leaves(out))
            if index == 0:
                base = leaves
            rec["max_abs_diff"] = None if base is None else max(
                float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32))))
                for a, b in zip(leaves, base))
            rec["max_abs"] = max(float(jnp.max(jnp.abs(a.astype(jnp.float32)))) for a in leaves)
        except Exception as e:  # a variant that fails to compile is recorded, not fatal
            rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        print(json.dumps(rec), flush=True)
        records.append(rec)
    return records


def markdown(records, shape, command, device):
    """The results table as markdown."""
    lines = [f"# Per-channel-decay forward stage forms, {time.strftime('%Y-%m-%d')}", "",
             f"Device: {device}; jax {jax.__version__}. Shape (B, T, H, D) = {shape}.", "",
             f"Command: `{command}`", "",
             "Times in ms: median of synced calls, and mean of back-to-back calls (loop). "
             "Diff: max abs difference of the outputs (the entries the stage writes) to the "
             "stage's first variant.", "",
             "| stage | variant | median | loop | diff |", "|---|---|---:|---:|---:|"]
    for r in records:
        if "error" in r:
            lines.append(f"| {r['stage']} | {r['variant']} | – | – | {r['error'][:80]} |")
        else:
            diff = "–" if r["max_abs_diff"] is None else f"{r['max_abs_diff']:.2e}"
            lines.append(f"| {r['stage']} | {r['variant']} | {r['ms']:.3f} | "
                         f"{r['loop_ms']:.3f} | {diff} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    args = parse_args(argv)
    records = []
    for stage in args.stages:
        records += time_variants(stage, args.shape, args.iters, args.interpret)
    device = jax.devices()[0].device_kind
    command = "python " + " ".join(sys.argv if argv is None else ["channelwise_forms.py"]
                                   + list(argv))
    md = markdown(records, args.shape, command, device)
    print(md)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out + ".md", "w") as f:
            f.write(md)
        with open(args.out + ".json", "w") as f:
            json.dump(dict(shape=args.shape, device=device, jax=jax.__version__,
                           command=command, records=records), f, indent=1)
    return records


if __name__ == "__main__":
    main()
