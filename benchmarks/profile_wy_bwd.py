r"""Where the WY backward's time goes: ``chunk_wy_bwd_mosaic``'s stage ablations in one run.

``chunk_wy_bwd_mosaic`` (``pallas_kernels/gated_delta_rule/kernel_mosaic_gpu_wy_bwd.py``;
MOSAIC_GPU.md Sec. 8, 25) is the largest kernel of the Gated DeltaNet backward on Mosaic GPU
(0.887 ms at S1 on the H200, 2026-12-05). It takes a static ``ablations`` tuple
(``WY_BWD_ABLATIONS``: ``io``, ``no_inverse``, ``no_split``, ``no_mma``, ``no_store``,
``no_exp``; MOSAIC_GPU.md Sec. 26): timing ablations that each cut one stage out of the kernel
and keep the rest's data flow. An ablated kernel computes wrong numbers by design; only this
binary passes them, never the op (``mosaic_vjp``). This binary times the full kernel and its
ablated variants at one shape (default S1: B 8, T 4,096, H = Hk 16, K = V = 128, bf16, one
document per row), so each variant's difference to the full kernel is what the ablated stage
costs (an upper bound on what removing it would save: what is left may overlap differently).

Variants (``--variants``): ``full`` (no ablation) or ``<ablation>[+<ablation>...]`` (e.g.
``no_split``, ``no_exp+no_mma``; ``io`` only alone). Each is jitted, compiled, run once, then
traced over ``--iters`` calls with ``jax.profiler`` (``benchmarks.common.trace_events``); its
record has the kernel's own device time (kernel ``gdn_chunk_wy_bwd*``; an ablated variant's
name carries ``_abl_<ablations>``) and the call's total (XLA's padding, the in-chunk reverse
cumsum of ``dg``). The full variant is gated against the kernel tests' reference, ``jax.vjp``
of the fp32 ``chunked.wy_representation`` (matmul precision ``highest``), on the first
``--check_heads`` heads of batch row 0 (relative RMS of each output below ``--gate``); ablated
variants are not gated. Variants that would not fit what is left of ``--deadline_s`` are
skipped and listed; a variant still compiling or running at the deadline ends the run (status
3) after the table of the finished ones is written (``benchmarks.common.run_variants``).

Outputs: ``<out>.jsonl`` (one record per variant, appended as each finishes) and ``<out>.md``
(the table: variant, kernel ms, delta vs full, call total ms, gate, compile s). On the GPU
(with ``MOSAIC_GPU_DUMP_PTXAS=1`` for ptxas's lines; MOSAIC_GPU.md Sec. 26 has the command)::

    python3 benchmarks/profile_wy_bwd.py --deadline_s=90 --out=$OUT/wy_bwd_abl

Without a GPU: ``--interpret`` runs the variants in Mosaic GPU interpret mode at a tiny shape
(checks this binary and the gate; no kernel times, the CPU trace has none), and ``--static``
exports each variant for CUDA and counts instructions in its Mosaic GPU module
(``profile_t0.static_counts``). With ``JAX_PLATFORMS=cpu``::

    python benchmarks/profile_wy_bwd.py --interpret --batch=1 --seq_len=64 --heads=1 --dk=64
        --dv=64 --iters=1 --check_heads=1 --out=/tmp/wy_interp      (one command line)
    python benchmarks/profile_wy_bwd.py --static --batch=1 --seq_len=128 --heads=1
        --out=/tmp/wy_static                                          (one command line)
"""

import os
import sys
import time
from typing import Dict, List, Sequence, Tuple

from absl import app, flags

if __name__ == "__main__":  # python benchmarks/profile_wy_bwd.py from the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

KERNEL = "wy_bwd"  # the records' "kernel" (profile_grad.render's delta is per kernel)
FULL = "full"
# Every stage but the stores ("rest" in the table): the loads, K K^T, the row sums and the
# SMEM staging are what is left.
REST = "no_exp+no_inverse+no_mma+no_split"
# The priority order (the deadline skips from the end).
DEFAULT_VARIANTS = (FULL, "io", "no_mma", "no_inverse", "no_split", "no_exp", "no_store", REST)
# Relative RMS against the fp32 reference: the kernel tests gate at 1e-3 on random keys
# (measured 5e-6 to 1.1e-4); a broken build reads 0.1 to 1.
DEFAULT_GATE = 1e-3
DEADLINE_EXIT = 3  # exit status when the watchdog ends a run at --deadline_s
SKIPPED_GATE = "skipped (ablated: wrong by design)"
NAMES = ("dk", "dv", "dbeta", "dg")


def _define_flags() -> None:
    """Defines the flags (only when run as a program: other benchmark modules define some of
    the same names in absl's global registry, and the tests import them all)."""
    global _BATCH, _SEQ_LEN, _HEADS, _DK, _DV, _DTYPE, _VARIANTS, _ITERS, _CHECK_HEADS
    global _GATE, _DEADLINE_S, _INTERPRET, _STATIC, _OUT
    from benchmarks import common
    shared = common.define_profile_flags(
        heads_help="Heads H (= key heads Hk).", dtype_help="Operand dtype.",
        variants_default=DEFAULT_VARIANTS,
        variants_help="Variants: 'full' or <ablation>[+<ablation>...] (names in "
                      "WY_BWD_ABLATIONS of kernel_mosaic_gpu_wy_bwd), in this order.",
        check_heads_help="Heads of batch row 0 the full variant is checked on (0: none).",
        interpret_help="Mosaic GPU interpret mode (CPU checks of this binary; use a tiny shape; "
                       "no kernel times).")
    flags.adopt_module_key_flags(common)  # in --help with this binary's own
    (_BATCH, _SEQ_LEN, _HEADS, _DK, _DV, _DTYPE, _VARIANTS, _ITERS, _CHECK_HEADS, _DEADLINE_S,
     _INTERPRET, _STATIC, _OUT) = shared.holders()
    _GATE = flags.DEFINE_float("gate", DEFAULT_GATE, "Relative RMS gate of the full variant.")


class VariantError(ValueError):
    """A ``--variants`` entry that is not ``full`` or ``<ablation>[+<ablation>...]``."""


def parse_variant(text: str) -> Tuple[str, ...]:
    """``"full"`` -> ``()``; ``"no_split+no_exp"`` -> ``("no_exp", "no_split")`` (sorted, as
    the kernel names them).

    Raises:
      VariantError: naming the entry and what is wrong: an empty or unknown ablation, a
        repeated one, or ``io`` with another.
    """
    from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu_wy_bwd as kwb
    text = text.strip()
    if text == FULL:
        return ()
    names = tuple(text.split("+"))
    try:
        return kwb.check_ablations(names)
    except ValueError as e:
        raise VariantError(f"--variants entry {text!r}: {e}") from None


def parse_variants(texts: Sequence[str]) -> List[Tuple[str, Tuple[str, ...]]]:
    """``(label, ablations)`` per ``--variants`` entry (see :func:`parse_variant`).

    Raises:
      VariantError: on a malformed entry, a repeated variant or an empty list.
    """
    runs, seen = [], set()
    for text in texts:
        ablations = parse_variant(text)
        if ablations in seen:
            raise VariantError(f"--variants entry {text!r}: the same variant twice")
        seen.add(ablations)
        runs.append((text.strip(), ablations))
    if not runs:
        raise VariantError("--variants is empty")
    return runs


def reference(k, v, g, beta, dw, du):
    """The kernel tests' reference: ``(dk, dv, dbeta, dg)`` of ``jax.vjp`` of the fp32
    ``chunked.wy_representation`` (one document, ``H = Hk``), matmul precision ``highest``."""
    import jax
    import jax.numpy as jnp
    from pallas_kernels.gated_delta_rule import chunked
    f32 = jnp.float32
    with jax.default_matmul_precision("highest"):
        (w_p, _), vjp = jax.vjp(lambda *a: chunked.wy_representation(*a), k.astype(f32),
                                v.astype(f32), g, beta)
        pad = ((0, 0), (0, w_p.shape[1] - k.shape[1]), (0, 0), (0, 0))
        dk, dv, dg, dbeta = vjp((jnp.pad(dw, pad), jnp.pad(du, pad)))
    return dk, dv, dbeta, dg


def gate_record(outs, want, heads: int, gate: float) -> Dict:
    """``{"rel_rms": {output: relative RMS}, "gate": "pass" | "FAIL (...)"}`` of the full
    variant's ``outs`` against ``want`` (:func:`reference` on batch row 0, heads
    ``[0, heads)``)."""
    import numpy as np
    from benchmarks import profile_grad
    rms = {}
    for name, x, y in zip(NAMES, outs, want, strict=True):
        got = np.asarray(x[:1, :, :heads], np.float64)
        rms[name] = profile_grad.relative_rms(got, np.asarray(y, np.float64))
    bad = [n for n, r in rms.items() if not r < gate]  # NaN fails
    return dict(rel_rms=rms, gate="pass" if not bad else f"FAIL ({', '.join(bad)} >= {gate:g})")


def _shapes() -> Dict[str, Tuple]:
    b, t, h = _BATCH.value, _SEQ_LEN.value, _HEADS.value
    return dict(tk=(b, t, h, int(_DK.value)), tv=(b, t, h, int(_DV.value)), th=(b, t, h))


def _call(ablations: Tuple[str, ...], interpret: bool = False):
    """The jitted variant: ``fn(k, v, g, beta, dw, du)``."""
    import jax
    from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu_wy_bwd as kwb
    return jax.jit(lambda k, v, g, beta, dw, du: kwb.chunk_wy_bwd_mosaic(
        k, v, g, beta, dw, du, interpret=interpret, ablations=ablations))


def _inputs(dtype, seed=0):
    """GDN-like inputs on the device (``jax.random``: fast at S1): L2-normalised keys, values,
    per-token log-decays in ``[-0.1, 0]``, ``beta`` in (0, 1), fp32 cotangents ``dW``, ``dU``."""
    import jax
    import jax.numpy as jnp
    s = _shapes()
    keys = jax.random.split(jax.random.PRNGKey(seed), 6)

    @jax.jit
    def make(keys):
        k = jax.random.normal(keys[0], s["tk"], jnp.float32)
        k = k / jnp.linalg.norm(k, axis=-1, keepdims=True)
        v = jax.random.normal(keys[1], s["tv"], jnp.float32)
        g = -0.1 * jax.random.uniform(keys[2], s["th"], jnp.float32)
        beta = jax.random.uniform(keys[3], s["th"], jnp.float32)
        dw = jax.random.normal(keys[4], s["tk"], jnp.float32)
        du = jax.random.normal(keys[5], s["tv"], jnp.float32)
        return k.astype(dtype), v.astype(dtype), g, beta, dw, du

    return jax.block_until_ready(make(keys))


_WANT: Dict[str, object] = {}  # the reference, computed once (at the full variant)


def _measure(rec: Dict, want, ablations: Tuple[str, ...], args):
    """Compiles, runs, gates (the full variant only) and traces one variant, filling ``rec``."""
    import jax
    from benchmarks import common
    from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu_wy_bwd as kwb
    del want
    t0 = time.perf_counter()
    compiled = _call(ablations, _INTERPRET.value).lower(*args).compile()
    rec["compile_s"] = time.perf_counter() - t0
    outs = jax.block_until_ready(compiled(*args))
    if ablations:
        rec["gate"] = SKIPPED_GATE
    elif _CHECK_HEADS.value > 0:
        heads = min(_CHECK_HEADS.value, _HEADS.value)
        if "ref" not in _WANT:
            _WANT["ref"] = jax.block_until_ready(
                reference(*(x[:1, :, :heads] for x in args)))
        rec.update(gate_record(outs, _WANT["ref"], heads, _GATE.value))
    if _ITERS.value <= 0:
        return None
    events = common.trace_events(lambda: compiled(*args), _ITERS.value)
    kernels = common.device_kernel_events(events)
    own = sum(d for name, _, d in kernels if name.startswith(kwb.KERNEL_NAME))
    total = sum(d for _, _, d in kernels)
    if total > 0:
        rec["kernel_ms"] = own / 1e3 / _ITERS.value
        rec["total_ms"] = total / 1e3 / _ITERS.value
        rec["kernel_names"] = sorted({n for n, _, _ in kernels
                                      if n.startswith(kwb.KERNEL_NAME)})
    return None


def _header(env: Dict) -> str:
    b, t, h, dk = _shapes()["tk"]
    return (f"# WY backward (chunk_wy_bwd_mosaic) stage ablations, {env['date_utc']}\n\n"
            f"Device: {env['device_kind']} ({env['nvidia_smi']}); jax {env['jax']}.\n"
            f"Command: `{env['command']}`\n\n"
            f"Shape B {b}, T {t}, H = Hk {h}, K {dk}, V {_DV.value}, {_DTYPE.value}, one "
            f"document per row; {_ITERS.value} traced calls per variant. Ablated variants "
            f"compute wrong numbers by design and are not gated; 'delta vs full' is against "
            f"the full kernel in this run (MOSAIC_GPU.md Sec. 26).")


def _static_main(variants, env: Dict) -> None:
    import json

    import jax
    import jax.numpy as jnp
    from benchmarks import profile_t0
    s = _shapes()
    dt = jnp.dtype(_DTYPE.value)
    spec = jax.ShapeDtypeStruct
    args = (spec(s["tk"], dt), spec(s["tv"], dt), spec(s["th"], jnp.float32),
            spec(s["th"], jnp.float32), spec(s["tk"], jnp.float32), spec(s["tv"], jnp.float32))
    records = []
    for text, ablations in variants:
        exported = jax.export.export(_call(ablations), platforms=["cuda"])(*args)
        module = profile_t0.mosaic_module_text(exported.mlir_module())
        records.append(dict(variant=text, kernel=KERNEL, ablations=list(ablations),
                            jax=env["jax"], static=profile_t0.static_counts(module)))
        print(json.dumps(records[-1]), flush=True)
    header = (f"# WY backward: instructions in the lowered Mosaic GPU modules (static, "
              f"{env['date_utc']})\n\nK {s['tk'][-1]}, V {s['tv'][-1]}, {_DTYPE.value}, "
              f"jax {env['jax']}.")
    profile_t0.write_static(records, header, _OUT.value)


def main(argv: List[str]) -> None:
    del argv
    start = time.perf_counter()  # --deadline_s counts from here (imports included)
    try:
        variants = parse_variants(_VARIANTS.value)
    except VariantError as e:
        raise app.UsageError(str(e)) from None
    from benchmarks import common
    env = common.environment()
    os.makedirs(os.path.dirname(os.path.abspath(_OUT.value)), exist_ok=True)
    if _STATIC.value:
        _static_main(variants, env)
        return
    import jax.numpy as jnp
    from benchmarks import profile_grad
    args = _inputs(jnp.dtype(_DTYPE.value))
    header = _header(env)
    runs = [(dict(variant=text, kernel=KERNEL, ablations=list(ablations),
                  shape=list(_shapes()["tk"]) + [int(_DV.value)], dtype=_DTYPE.value,
                  date_utc=env["date_utc"], device=env["device_kind"], jax=env["jax"]),
             (ablations, args))
            for text, ablations in variants]
    common.run_profile(_OUT.value, runs, _measure,
                       render=lambda recs: profile_grad.render(recs, header),
                       deadline_s=_DEADLINE_S.value, start=start, deadline_exit=DEADLINE_EXIT)


if __name__ == "__main__":
    _define_flags()
    from lattn_jax import flag_errors  # one-line flag errors (absl only)
    app.run(main, flags_parser=flag_errors.parse_flags)
