"""The short convolution's backward: ``causal_conv1d`` against autodiff of the tap loop, on a GPU.

``lattn_jax.causal_conv.causal_conv1d`` stores only its bf16 input between forward and backward
and writes the backward out (fp32 accumulation, one rounding). Before it, ShortConv was the tap
loop ``y = sum_i x_i.astype(f32) w_i`` rounded to bf16, then SiLU, differentiated by autodiff,
whose residuals are every tap's fp32 input and the bf16 pre-activation (XLA may fuse the taps
into the backward instead of storing them: only a GPU compile says). This times both in a
residual stack of ``--layers`` blocks ``h <- h + SiLU(conv(h P)) Q`` (the projections are
there so that each block's conv input is a fresh activation, as in a mixer) and reports the
compiled executable's temporary memory, which holds what the forward keeps for the backward.

    python benchmarks/bench_short_conv.py --batch=16 --length=4096 --out=/tmp/short-conv

Prints one JSON line per variant; writes ``<out>.json`` and ``<out>.md``.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import common as bench  # noqa: E402
from lattn_jax.causal_conv import causal_conv1d  # noqa: E402


def tap_loop(x_ext, w, doc):
    """ShortConv before ``causal_conv1d`` (commit ``c1bac61``), then SiLU: autodiff's backward."""
    width, t = w.shape[0], x_ext.shape[1] - w.shape[0] + 1
    y = jnp.zeros((x_ext.shape[0], t, x_ext.shape[2]), jnp.float32)
    for i in range(width):
        xi = x_ext[:, i:i + t]
        if doc is not None and i < width - 1:
            xi = jnp.where((doc[:, i:i + t] == doc[:, width - 1:])[..., None], xi, 0)
        y = y + xi.astype(jnp.float32) * w[i].astype(jnp.float32)
    return jax.nn.silu(y.astype(x_ext.dtype))


VARIANTS = {"tap_loop": tap_loop,
            "causal_conv1d": lambda x, w, doc: causal_conv1d(x, w, doc, "silu")}


def stack_loss(conv, layers: int, width: int):
    def loss(h, w, p, q, doc):
        b, _, c = h.shape
        for _ in range(layers):
            x = h @ p
            x_ext = jnp.concatenate([jnp.zeros((b, width - 1, x.shape[2]), x.dtype), x], 1)
            h = h + conv(x_ext, w, doc) @ q
        return jnp.sum(h.astype(jnp.float32))
    return loss


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--d_model", type=int, default=1024)
    ap.add_argument("--channels", type=int, default=1024,
                    help="conv channels (GDN 350M: 2 x 256 + 512)")
    ap.add_argument("--width", type=int, default=4)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", default="/tmp/short-conv")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    b, t, d, c, width = args.batch, args.length, args.d_model, args.channels, args.width
    h = jnp.asarray(rng.standard_normal((b, t, d)), jnp.bfloat16)
    w = jnp.asarray(rng.uniform(-0.5, 0.5, (width, c)), jnp.bfloat16)
    p = jnp.asarray(rng.standard_normal((d, c)) / np.sqrt(d), jnp.bfloat16)
    q = jnp.asarray(rng.standard_normal((c, d)) / np.sqrt(c) / args.layers, jnp.bfloat16)
    ids = np.sort(rng.integers(0, 8, size=(b, t)), axis=1)
    docs = jnp.asarray(np.concatenate([np.repeat(ids[:, :1], width - 1, 1), ids], 1), jnp.int32)
    payload = dict(environment=bench.environment(), settings=vars(args), records=[])
    grads = {}
    for docs_on in (False, True):
        for name, conv in VARIANTS.items():
            fn = jax.jit(jax.grad(stack_loss(conv, args.layers, width), argnums=(0, 1, 2, 3)))
            doc = docs if docs_on else None
            exe = fn.lower(h, w, p, q, doc).compile()
            ms = float(np.median(bench.time_calls(lambda: exe(h, w, p, q, doc), warmup=2,
                                                  iters=args.iters))) * 1e3
            grads[name] = exe(h, w, p, q, doc)
            mem = bench.compiled_memory(exe) or {}
            rec = dict(variant=name, documents=docs_on, fwd_bwd_ms=ms,
                       temp_bytes=mem.get("temp"), peak_estimate_bytes=mem.get("peak_estimate"))
            if name != "tap_loop":  # both differ from exact by bf16 roundings only
                ref, got = grads["tap_loop"], grads[name]
                rec["max_rel_diff_vs_tap_loop"] = [
                    float(jnp.max(jnp.abs(a.astype(jnp.float32) - r.astype(jnp.float32)))
                          / (float(jnp.max(jnp.abs(r.astype(jnp.float32)))) + 1e-30))
                    for a, r in zip(got, ref)]
            print(rec, flush=True)
            payload["records"].append(rec)
    lines = [f"# Short convolution backward ({payload['environment']['device_kind']})", "",
             f"`{payload['environment']['command']}`", "",
             "| variant | documents | fwd+bwd (ms) | temp (GiB) |", "|---|---|---:|---:|"]
    lines += [f"| {r['variant']} | {r['documents']} | {r['fwd_bwd_ms']:.3f} | "
              f"{bench.gib(r['temp_bytes'])} |" for r in payload["records"]]
    bench.write_report(args.out, payload, "\n".join(lines) + "\n")
    return payload


if __name__ == "__main__":
    main()
