"""The XLA glue around the Gated DeltaNet Mosaic GPU op, from a CUDA lowering on CPU.

Lowers ``jax.jit`` of one training step of
:func:`pallas_kernels.gated_delta_rule.mosaic_vjp.gated_delta_rule_mosaic` (forward and
``jax.vjp`` backward, the ``fwdbwd`` pass of ``benchmarks/bench_kernels.py``: ``q, k, v`` bf16
``[B, T, H, K]``, ``g`` and ``beta`` fp32 ``[B, T, H]``, cotangent ``do`` bf16) for CUDA with
``jax.ShapeDtypeStruct`` arguments (no data, no GPU), and lists every StableHLO op outside the
Mosaic GPU custom calls that touches a tensor of at least ``--min_mb`` MB, with its shapes,
dtypes, the bytes it reads and writes (operands plus results, as an unfused op would move
them) and the source line of this repository that makes it (the innermost frame of its
location in ``pallas_kernels/``).

This is the pre-fusion module: XLA fuses chains of elementwise ops, reshapes and broadcasts,
so the byte counts are what each op moves on its own (an upper bound on the fused traffic;
``reshape`` is a free bitcast after layout assignment and is left out). MOSAIC_GPU.md Sec. 27
has the table and how to read it.

    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/glue_inventory.py            # S1
    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/glue_inventory.py --packed   # documents
    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/glue_inventory.py --forward=fused_t0

``--forward`` and ``--backward`` pass the op's ``forward=`` and ``backward=`` (default: the op's
defaults); MOSAIC_GPU.md Sec. 36 compares the ``three_pass`` and ``fused_t0`` steps.

``--op=kda`` lowers KDA's step instead (``kda_pallas``, per-channel gates; ``--tuning`` a JSON of
``channelwise_gpu.TUNING`` overrides); its source lines all name the jitted core's call, so the
op and the types say what each row is (MOSAIC_GPU.md Sec. 43.3)::

    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/glue_inventory.py --op=kda --min_mb=8
    # K2's step: the same with --tuning='{"grad_pass": "mosaic_fused", "state_pass": "mosaic"}'
"""

import argparse
import collections
import os
import re
import sys
from typing import Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# Ops that move no bytes of their own (structure, constants, free views) or are the kernels.
_SKIP = {"func.func", "func.return", "stablehlo.constant", "stablehlo.custom_call",
         "stablehlo.reshape", "stablehlo.return", "stablehlo.iota", "builtin.module",
         "stablehlo.optimization_barrier", "func.call"}
_TYPE_RE = re.compile(r"tensor<([0-9x]*)x?([a-z][a-z0-9]*)>")
_FRAME_RE = re.compile(r'"([^"]*pallas_kernels/[^"]+\.py)":(\d+)')
_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "i32": 4, "i1": 1, "i64": 8, "f64": 8, "i8": 1,
          "ui32": 4, "ui8": 1}


def tensor_bytes(type_str: str):
    """``(shape, dtype, bytes)`` of an MLIR ``tensor<...>`` type string (``None`` if not one)."""
    m = _TYPE_RE.fullmatch(type_str.strip())
    if m is None:
        return None
    dims = tuple(int(d) for d in m.group(1).split("x") if d)
    n = 1
    for d in dims:
        n *= d
    return dims, m.group(2), n * _BYTES.get(m.group(2), 4)


def source_line(location: str) -> str:
    """The innermost ``pallas_kernels/...py:line`` frame of an MLIR location, or ``"?"``."""
    frames = _FRAME_RE.findall(location)
    if not frames:
        return "?"
    path, line = frames[0]
    return f"{path[path.index('pallas_kernels/'):]}:{line}"


def lowered_module(batch, seq_len, heads, kv_heads, dim, packed, forward="three_pass",
                   backward=None):
    """The StableHLO text (with locations) of the op's ``fwdbwd`` step lowered for CUDA
    (``backward``: the op's ``backward=``; ``None``, its default)."""
    import jax
    import jax.numpy as jnp
    from pallas_kernels.gated_delta_rule import mosaic_vjp

    def step(q, k, v, g, beta, do, seg):
        def f(q, k, v, g, beta):
            return mosaic_vjp.gated_delta_rule_mosaic(
                q, k, v, g, beta, scale=dim ** -0.5, segment_ids=seg, forward=forward,
                backward=backward or mosaic_vjp.DEFAULT_BACKWARD)[0]
        o, vjp = jax.vjp(f, q, k, v, g, beta)
        return vjp(do) + (o,)

    sds = jax.ShapeDtypeStruct
    bf = jnp.bfloat16
    args = (sds((batch, seq_len, kv_heads, dim), bf), sds((batch, seq_len, kv_heads, dim), bf),
            sds((batch, seq_len, heads, dim), bf), sds((batch, seq_len, heads), jnp.float32),
            sds((batch, seq_len, heads), jnp.float32), sds((batch, seq_len, heads, dim), bf),
            sds((batch, seq_len), jnp.int32) if packed else None)
    lowered = jax.jit(step).trace(*args).lower(lowering_platforms=("cuda",))
    return lowered.as_text(debug_info=True)


def lowered_module_kda(batch, seq_len, heads, dim, packed, tuning=None):
    """The StableHLO text of KDA's ``fwdbwd`` step (``kda_pallas``: ``q, k, v`` bf16 ``[B, T,
    H, K]``, ``g`` fp32 ``[B, T, H, K]``, ``beta`` bf16 ``[B, T, H]``, cotangent ``do``) lowered
    for CUDA on a patched Hopper GPU (the Mosaic passes lower only there) with
    ``channelwise_gpu.TUNING`` overridden by ``tuning`` (e.g. ``{"grad_pass": "mosaic_fused",
    "state_pass": "mosaic"}``). The op's backward is a ``custom_vjp`` inside one jitted core,
    so every glue op's location is the core's call (``channelwise_gpu.py``): read ``op`` and
    ``types``, not ``line``."""
    import contextlib
    from unittest import mock

    import jax
    import jax.numpy as jnp
    from pallas_kernels.common import channelwise_gpu, mosaic_gpu, pallas_gpu
    from pallas_kernels.kda import kernel_gpu as kda_kernel

    def step(q, k, v, g, beta, do, seg):
        def f(q, k, v, g, beta):
            return kda_kernel.kda_pallas(q, k, v, g, beta, scale=dim ** -0.5,
                                         segment_ids=seg)[0]
        o, vjp = jax.vjp(f, q, k, v, g, beta)
        return vjp(do) + (o,)

    sds = jax.ShapeDtypeStruct
    bf = jnp.bfloat16
    tok = sds((batch, seq_len, heads, dim), bf)
    args = (tok, tok, tok, sds((batch, seq_len, heads, dim), jnp.float32),
            sds((batch, seq_len, heads), bf), tok,
            sds((batch, seq_len), jnp.int32) if packed else None)
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.dict(channelwise_gpu.TUNING, tuning or {}))
        stack.enter_context(mock.patch.object(mosaic_gpu, "compute_capability",
                                              return_value=(9, 0)))
        stack.enter_context(pallas_gpu.abstract_gpu_target())
        jax.clear_caches()  # the core's trace reads TUNING
        lowered = jax.jit(step).trace(*args).lower(lowering_platforms=("cuda",))
    jax.clear_caches()
    return lowered.as_text(debug_info=True)


def inventory(text: str, min_bytes: int) -> List[Dict]:
    """One dict per StableHLO op executed by ``@main`` of ``text`` (``func.call`` followed into
    its callee, once per call) outside :data:`_SKIP` that reads or writes a tensor of at least
    ``min_bytes``: ``op``, ``types`` (operand and result types), ``bytes`` (sum of operand and
    result sizes), ``noop`` (a ``pad`` by zero on every side: XLA's algebraic simplifier
    replaces it by its operand, so it moves nothing), ``where`` (the chain of called
    functions, e.g. ``chunk_wy_bwd_mosaic/_pad``, and the op's name location), ``line``
    (:func:`source_line`; the backward of a ``custom_vjp`` carries the primal call's
    location, so ``where`` is the finer key there)."""
    from jax._src.interpreters import mlir as jax_mlir
    from jax._src.lib.mlir import ir
    rows = []
    with jax_mlir.make_ir_context():
        module = ir.Module.parse(text)
        funcs = {}
        for op in module.body.operations:
            if op.operation.name == "func.func":
                funcs[ir.StringAttr(op.operation.attributes["sym_name"]).value] = op

        def walk(op, chain):
            name = op.operation.name
            if name == "func.call":
                callee = ir.FlatSymbolRefAttr(op.operation.attributes["callee"]).value
                for block in funcs[callee].operation.regions[0].blocks:
                    for inner in block.operations:
                        walk(inner, chain + (callee,))
                return
            if name not in _SKIP:
                values = list(op.operation.operands) + list(op.operation.results)
                sizes = [tensor_bytes(str(v.type)) for v in values]
                sizes = [s for s in sizes if s is not None]
                if sizes and max(s[2] for s in sizes) >= min_bytes:
                    loc = str(op.operation.location)
                    attrs = op.operation.attributes
                    noop = name == "stablehlo.pad" and all(
                        not any(ir.DenseI64ArrayAttr(attrs[a]))
                        for a in ("edge_padding_low", "edge_padding_high", "interior_padding"))
                    label = re.match(r'loc\("([^"]*)"', loc)
                    n_in = len(op.operation.operands)
                    rows.append(dict(
                        op=name.replace("stablehlo.", ""),
                        types=" -> ".join(
                            ", ".join(f"{'x'.join(map(str, s[0]))} {s[1]}" for s in part)
                            for part in (sizes[:n_in], sizes[n_in:])),
                        bytes=sum(s[2] for s in sizes), noop=noop,
                        where="/".join(chain + ((label.group(1).split("/")[-1],)
                                                if label else ())),
                        line=source_line(loc)))
            for region in op.operation.regions:
                for block in region.blocks:
                    for inner in block.operations:
                        walk(inner, chain)

        for block in funcs["main"].operation.regions[0].blocks:
            for inner in block.operations:
                walk(inner, ())
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="8x4096x16", help="BxTxH (S1 by default)")
    parser.add_argument("--kv_heads", type=int, default=None, help="Hk (GVA); default H")
    parser.add_argument("--dim", type=int, default=128, help="K = V")
    parser.add_argument("--packed", action="store_true", help="with segment_ids")
    parser.add_argument("--forward", default="three_pass",
                        help="the op's forward= (three_pass, fused_t0, ...)")
    parser.add_argument("--backward", default=None, help="the op's backward= (default: its own)")
    parser.add_argument("--min_mb", type=float, default=1.0,
                        help="list ops touching a tensor of at least this many MB")
    parser.add_argument("--op", default="gdn", choices=("gdn", "kda"),
                        help="gdn: the Mosaic GDN op (--forward, --backward); kda: kda_pallas "
                             "(--tuning)")
    parser.add_argument("--tuning", default="{}",
                        help='kda: JSON overrides of channelwise_gpu.TUNING, e.g. '
                             '\'{"grad_pass": "mosaic_fused", "state_pass": "mosaic"}\'')
    args = parser.parse_args(argv)
    batch, seq_len, heads = (int(x) for x in args.shape.lower().split("x"))
    if args.op == "kda":
        import json
        text = lowered_module_kda(batch, seq_len, heads, args.dim, args.packed,
                                  tuning=json.loads(args.tuning))
    else:
        text = lowered_module(batch, seq_len, heads, args.kv_heads or heads, args.dim,
                              args.packed, forward=args.forward, backward=args.backward)
    rows = inventory(text, int(args.min_mb * 1e6))
    groups = collections.OrderedDict()
    for r in rows:
        key = (r["where"], r["line"], r["op"] + (" (no-op)" if r["noop"] else ""), r["types"])
        groups.setdefault(key, []).append(r["bytes"])
    print("| called from | source line | op | operands -> results | count | MB moved |")
    print("|---|---|---|---|---:|---:|")
    for (where, line, op, types), sizes in groups.items():
        print(f"| `{where}` | `{line}` | {op} | {types} | {len(sizes)} | "
              f"{sum(sizes) / 1e6:,.1f} |")
    real = [r for r in rows if not r["noop"]]
    total = sum(r["bytes"] for r in real)
    print(f"\ntotal {total / 1e6:,.1f} MB over {len(real)} ops, {len(rows) - len(real)} no-op "
          f"pads left out (pre-fusion; {total / 4.8e12 * 1e3:.3f} ms at 4.8 TB/s)")


if __name__ == "__main__":
    main()
