"""Times the GDN Mosaic backward's GVA group sums in-kernel against XLA's (MOSAIC_GPU.md 27.5, 33).

Stage 3 (``chunk_delta_grads_partials_mosaic``, ``dq_dtype`` = the input dtype) and stage 4
(``chunk_wy_bwd_mosaic`` with the op's ``dk_partial``, ``dg_partial``, ``out_dtype``) as
``gated_delta_rule_mosaic``'s backward calls them, each jitted with ``gva_loop=False`` (the
kernel writes fp32 ``dq`` / ``dk`` per value head ``[B, T, H, K]``; XLA sums each group of
``G = H / Hk`` and rounds) and ``gva_loop=True`` (one CTA per key head loops over its value
heads and writes the fp32 group sum rounded once, ``[B, T, Hk, K]``); and the default
backward's fused kernel (``chunk_bwd_fused_mosaic(warpgroups=3)``, ``backward="fused_ws"``,
Sec. 33) the same two ways (its loop needs K = 64: at ``--dim=128`` only ``gva_loop=False``).
``--kernels`` picks ``stages`` (3 and 4) and / or ``fused``. Inputs: ``q, k``
``[B, T, Hk, K]``, ``v_new, do, dv_new`` ``[B, T, H, V]`` bf16, ``g`` ``[B, T, H]`` fp32 (log
decays), ``h, dh`` ``[B, H, N, K, V]`` bf16, random, packed documents (``segment_ids``).
Prints one line per (stage, ``gva_loop``): median and min ms over ``--iters`` calls, each
including its XLA glue. GPU only (``--interpret`` runs it on CPU at a tiny shape, as a check
that it runs; those times mean nothing).

    python3 benchmarks/bench_gva_loop.py --shape=8x4096x16 --kv_heads=8 --dim=64
    python3 benchmarks/bench_gva_loop.py --kernels=fused --shape=8x4096x16 --kv_heads=8 --dim=64
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu_bwd as kbwd
from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu_bwd_fused as kbf
from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu_wy_bwd as kwb


def inputs(batch, seq_len, heads, kv_heads, dim, seed=0):
    """Random stage-3 and stage-4 inputs (module docstring), with two documents per row."""
    keys = iter(jax.random.split(jax.random.key(seed), 16))
    bf, f32 = jnp.bfloat16, jnp.float32
    chunks = -(-seq_len // kbwd.CHUNK)

    def normal(shape, dtype=bf, s=1.0):
        return (s * jax.random.normal(next(keys), shape)).astype(dtype)

    q = normal((batch, seq_len, kv_heads, dim), s=dim ** -0.5)
    k = normal((batch, seq_len, kv_heads, dim), s=dim ** -0.5)
    v, vn, do, dvn = (normal((batch, seq_len, heads, dim)) for _ in range(4))
    g = -jax.random.uniform(next(keys), (batch, seq_len, heads), f32, 0.0, 0.1)
    beta = jax.random.uniform(next(keys), (batch, seq_len, heads), f32, 0.1, 0.9)
    h, dh = (normal((batch, heads, chunks, dim, dim)) for _ in range(2))
    dw = normal((batch, seq_len, heads, dim), f32)
    seg = (jnp.arange(seq_len)[None, :] >= seq_len // 3).astype(jnp.int32)
    seg = jnp.broadcast_to(seg, (batch, seq_len))
    return q, k, v, vn, do, dvn, g, beta, h, dh, dw, seg


def timed(fn, args, iters, warmup):
    """``(median, min)`` ms of ``fn(*args)`` over ``iters`` calls after ``warmup``."""
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times)), float(np.min(times))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="8x4096x16", help="BxTxH (value heads)")
    parser.add_argument("--kv_heads", type=int, default=8, help="Hk (key heads)")
    parser.add_argument("--dim", type=int, default=64, help="K = V")
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--interpret", action="store_true", help="CPU check (tiny shapes)")
    parser.add_argument("--kernels", default="stages,fused",
                        help="comma-separated: stages (3 and 4), fused (chunk_bwd_fused_mosaic)")
    args = parser.parse_args(argv)
    kernels = set(args.kernels.split(","))
    if not kernels or kernels - {"stages", "fused"}:
        parser.error(f"--kernels: names in stages, fused; got {args.kernels!r}")
    batch, seq_len, heads = (int(x) for x in args.shape.lower().split("x"))
    q, k, v, vn, do, dvn, g, beta, h, dh, dw, seg = inputs(batch, seq_len, heads,
                                                           args.kv_heads, args.dim)
    interp = args.interpret
    scale = args.dim ** -0.5
    print(f"B={batch} T={seq_len} H={heads} Hk={args.kv_heads} K=V={args.dim} "
          f"({jax.devices()[0].device_kind})")
    if "fused" in kernels:
        t0 = (0.1 * jax.random.normal(jax.random.key(7), (batch, seq_len, heads, kbf.CHUNK))
              ).astype(q.dtype)
        for loop in (False, True):
            if loop and args.dim != kbf.GVA_LOOP_K:
                print(f"fused_ws             gva_loop=True   (needs K = {kbf.GVA_LOOP_K})")
                continue
            fused = jax.jit(lambda *a, loop=loop: kbf.chunk_bwd_fused_mosaic(
                *a[:-1], scale=scale, segment_ids=a[-1], warpgroups=3, gva_loop=loop,
                interpret=interp))
            med, best = timed(fused, (q, k, v, do, vn, dvn, t0, g, beta, h, dh, seg),
                              args.iters, args.warmup)
            print(f"fused_ws             gva_loop={loop!s:<5}  median {med:8.3f} ms  min "
                  f"{best:8.3f} ms")
    if "stages" not in kernels:
        return
    _, dk_loc, _, dgt, bnd = kbwd.chunk_delta_grads_partials_mosaic(
        q, k, vn, do, dvn, g, h, dh, scale=scale, segment_ids=seg, interpret=interp)
    for loop in (False, True):
        grads = jax.jit(lambda *a, loop=loop: kbwd.chunk_delta_grads_partials_mosaic(
            *a[:-1], scale=scale, segment_ids=a[-1], dq_dtype=q.dtype, gva_loop=loop,
            interpret=interp))
        med, best = timed(grads, (q, k, vn, do, dvn, g, h, dh, seg), args.iters, args.warmup)
        print(f"stage 3 chunk_grads  gva_loop={loop!s:<5}  median {med:8.3f} ms  min "
              f"{best:8.3f} ms")
    for loop in (False, True):
        wy = jax.jit(lambda *a, loop=loop: kwb.chunk_wy_bwd_mosaic(
            *a[:6], segment_ids=a[6], dk_partial=a[7], dg_partial=(a[8], a[9]),
            out_dtype=q.dtype, gva_loop=loop, interpret=interp))
        med, best = timed(wy, (k, v, g, beta, dw, dvn, seg, dk_loc, dgt, bnd), args.iters,
                          args.warmup)
        print(f"stage 4 wy_bwd       gva_loop={loop!s:<5}  median {med:8.3f} ms  min "
              f"{best:8.3f} ms")


if __name__ == "__main__":
    main()
