r"""Where K1's and K2's time goes: their stage ablations timed in one run (issue 29).

K1 (``channelwise_grad_intra_mosaic``) and K2 (``channelwise_grad_chunk_mosaic``), the
per-channel family's backward kernels on Mosaic GPU (``pallas_kernels/common/
channelwise_grad_mosaic_gpu.py``; MOSAIC_GPU.md Sec. 20, 21), take a static ``ablations``
tuple: timing ablations that each cut one cost centre out of the kernel and keep the rest
(``K1_ABLATIONS``: ``no_band``, ``no_mma``, ``no_factors``, ``no_store``; K2 adds
``no_state`` and ``no_cumsum``; MOSAIC_GPU.md Sec. 22). An ablated kernel computes wrong
numbers by design; only this binary passes them, never the op or ``TUNING``. This binary
times the full kernel and its ablated variants at one shape (default S1 for KDA: B 8, T 4,096,
H 16, K = V = 128, bf16, a per-token ``ks``, one document per row), so each variant's
difference to the full kernel of its kind is what the ablated part costs (an upper bound on
what removing it would save: what is left may overlap differently).

Each variant ``<kernel>[:<ablation>[+<ablation>...]]`` (kernel ``k1`` or ``k2``; e.g. ``k2``,
``k2:no_band``, ``k1:no_band+no_factors``) is jitted, compiled, run once, then traced over
``--iters`` calls with ``jax.profiler`` (``benchmarks.common.trace_events``, the kernel timing
of ``bench_kernels.py``); its record has the kernel's own device time (the kernel named
``channelwise_grad_intra_mosaic*`` or ``channelwise_grad_chunk_mosaic*``; an ablated variant's
name carries ``_abl_<ablations>``) and the call's total (XLA's padding and the ``dks`` sum
too). The full variants (no ablation) are gated against a float64 NumPy evaluation of the
kernel's equations on the first ``--check_heads`` heads of batch row 0 (relative RMS of each
output below ``--gate``); ablated variants are not gated (wrong by design: the table says
``skipped (ablated)``). Variants that would not fit what is left of ``--deadline_s`` are
skipped and listed; a variant still compiling or running at the deadline ends the run (status
3) after the table of the finished ones is written (``benchmarks.common.run_variants``).

Every variant runs at each phase-2 slab of ``--slabs`` (key channels per step: ``16``, what
``channelwise_gpu.TUNING`` ships because ptxas compiles it without spills, and ``32``, half as
many ``wgmma`` of twice the width that spill; MOSAIC_GPU.md Sec. 24), each variant at every
slab before the next variant; with more than one slab the labels end in ``@<slab>`` (``k2@16``)
and "delta vs full" is against the full kernel of the same kind and slab.

Outputs: ``<out>.jsonl`` (one record per variant, appended as each finishes) and ``<out>.md``
(the table: variant, kernel ms, delta vs the full kernel of its kind, call total ms, gate,
compile s). Usage, on the GPU machine::

    python3 benchmarks/profile_grad.py --out=$OUT/k2_ablations
    python3 benchmarks/profile_grad.py --variants=k1,k1:no_band --out=$OUT/k1_ablations
    python3 benchmarks/profile_grad.py --variants=k2,k1 --slabs=16,32 --out=$OUT/slabs

Without a GPU the kernels cannot run; ``--interpret`` runs them in Mosaic GPU interpret mode
at a tiny shape, to check the binary itself (the gate too; no kernel times: the CPU trace has
none). ``--static`` (CPU, seconds) times nothing; it exports each variant for CUDA
and counts instructions in its serialized Mosaic GPU module (``profile_t0.static_counts``:
warpgroup barriers, ``wgmma``, their waits, fences, TMA copies, SMEM loads and stores, all
non-constant ops)::

    JAX_PLATFORMS=cpu python benchmarks/profile_grad.py --static --seq_len=128 --batch=1 \
        --heads=1 --out=/tmp/grad_static
"""

import os
import sys
import time
from typing import Dict, List, Sequence, Tuple

from absl import app, flags

if __name__ == "__main__":  # python benchmarks/profile_grad.py from the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

KERNELS = ("k1", "k2")
# The priority order (K2 first: the candidate for TUNING; the deadline skips from the end).
# Each kernel: the full one, one variant per ablation, then the "rest" (every ablation but
# no_store: phase 1, the copies, the operand stores, barriers and the outputs' stores).
K2_REST = "k2:no_band+no_cumsum+no_factors+no_mma+no_state"
K1_REST = "k1:no_band+no_factors+no_mma"
DEFAULT_VARIANTS = ("k2", "k2:no_band", "k2:no_mma", "k2:no_factors", "k2:no_state",
                    "k2:no_cumsum", "k2:no_store", K2_REST, "k1", "k1:no_band", "k1:no_mma",
                    "k1:no_factors", "k1:no_store", K1_REST)
# Relative RMS against float64: a broken build shows at 0.1 to 1 (the hand mutations of
# MOSAIC_GPU.md Sec. 20); on these random inputs the kernels read 1.5e-3 (K1) to 3.3e-3 (K2's
# dg) in interpret mode, so the kernel tests' 5e-3 would leave little margin here.
DEFAULT_GATE = 1e-2
DEADLINE_EXIT = 3  # exit status when the watchdog ends a run at --deadline_s
SKIPPED_GATE = "skipped (ablated: wrong by design)"


def _define_flags() -> None:
    """Defines the flags (only when run as a program: other benchmark modules define some of
    the same names in absl's global registry, and the tests import them all)."""
    global _BATCH, _SEQ_LEN, _HEADS, _DK, _DV, _DTYPE, _VARIANTS, _ITERS, _CHECK_HEADS
    global _GATE, _DEADLINE_S, _INTERPRET, _STATIC, _OUT, _SLABS
    from benchmarks import common
    shared = common.define_profile_flags(
        heads_help="Heads H.", dtype_help="Operand dtype.", variants_default=DEFAULT_VARIANTS,
        variants_help="Variants <kernel>[:<ablation>[+<ablation>...]] (kernel k1 or k2; "
                      "ablations in K1_ABLATIONS / K2_ABLATIONS of channelwise_grad_mosaic_gpu), "
                      "in this order.",
        check_heads_help="Heads of batch row 0 the full variants are checked on against "
                         "float64 (0: none).",
        interpret_help="Mosaic GPU interpret mode (CPU checks of this binary; use a tiny shape; "
                       "no kernel times).",
        static_help="Count instructions in the lowered modules (CPU; no kernel runs; see the "
                    "module docstring).")
    flags.adopt_module_key_flags(common)  # in --help with this binary's own
    (_BATCH, _SEQ_LEN, _HEADS, _DK, _DV, _DTYPE, _VARIANTS, _ITERS, _CHECK_HEADS, _DEADLINE_S,
     _INTERPRET, _STATIC, _OUT) = shared.holders()
    _GATE = flags.DEFINE_float("gate", DEFAULT_GATE, "Relative RMS gate of the full variants.")
    _SLABS = flags.DEFINE_list("slabs", ["16", "32"], "Phase-2 slabs each variant runs at "
                               "(16: TUNING's, no spills; 32: one step per warpgroup); with "
                               "more than one, labels end in @<slab>.")


class VariantError(ValueError):
    """A ``--variants`` entry that is not ``<kernel>[:<ablation>[+<ablation>...]]``."""


def parse_variant(text: str) -> Tuple[str, Tuple[str, ...]]:
    """``"k2:no_state+no_band"`` -> ``("k2", ("no_band", "no_state"))`` (ablations sorted, as
    the kernel names them); ``"k1"`` -> ``("k1", ())``, the full kernel.

    Raises:
      VariantError: naming the entry and what is wrong: an unknown kernel, an empty or
        unknown ablation (K2's ``no_state`` / ``no_cumsum`` on ``k1`` too), a repeated one,
        more than one ``:``.
    """
    from pallas_kernels.common import channelwise_grad_mosaic_gpu as cgm
    parts = text.strip().split(":")
    if len(parts) > 2:
        raise VariantError(f"--variants entry {text!r}: expected "
                           "<kernel>[:<ablation>[+<ablation>...]]")
    kernel = parts[0]
    if kernel not in KERNELS:
        raise VariantError(f"--variants entry {text!r}: kernel {kernel!r} not in {KERNELS}")
    if len(parts) == 1:
        return kernel, ()
    allowed = cgm.K1_ABLATIONS if kernel == "k1" else cgm.K2_ABLATIONS
    names = parts[1].split("+")
    for name in names:
        if name not in allowed:
            raise VariantError(f"--variants entry {text!r}: ablation {name!r} not in "
                               f"{allowed} (the {kernel} ablations)")
    if len(set(names)) != len(names):
        raise VariantError(f"--variants entry {text!r}: an ablation is named twice")
    return kernel, tuple(sorted(names))


def parse_variants(texts: Sequence[str]) -> List[Tuple[str, str, Tuple[str, ...]]]:
    """``(label, kernel, ablations)`` per ``--variants`` entry (see :func:`parse_variant`).

    Raises:
      VariantError: on a malformed entry, a repeated variant or an empty list.
    """
    runs, seen = [], set()
    for text in texts:
        kernel, ablations = parse_variant(text)
        if (kernel, ablations) in seen:
            raise VariantError(f"--variants entry {text!r}: the same variant twice")
        seen.add((kernel, ablations))
        runs.append((text.strip(), kernel, ablations))
    if not runs:
        raise VariantError("--variants is empty")
    return runs


def parse_slabs(texts: Sequence[str]) -> Tuple[int, ...]:
    """``["16", "32"]`` -> ``(16, 32)``.

    Raises:
      VariantError: a slab the kernels do not take, a repeated one or an empty list.
    """
    from pallas_kernels.common import channelwise_grad_mosaic_gpu as cgm
    slabs = []
    for text in texts:
        try:
            slab = int(text)
        except ValueError:
            slab = None
        if slab not in cgm.SLABS:
            raise VariantError(f"--slabs entry {text!r}: not one of {cgm.SLABS}")
        if slab in slabs:
            raise VariantError(f"--slabs entry {text!r}: named twice")
        slabs.append(slab)
    if not slabs:
        raise VariantError("--slabs is empty")
    return tuple(slabs)


def with_slabs(runs, slabs: Sequence[int]) -> List[Tuple[str, str, Tuple[str, ...], int]]:
    """``(label, kernel, ablations, slab)``: each of :func:`parse_variants`' ``runs`` at every
    slab (in that order); the label gains ``@<slab>`` when there is more than one slab."""
    return [(label if len(slabs) == 1 else f"{label}@{slab}", kernel, ablations, slab)
            for label, kernel, ablations in runs for slab in slabs]


def kernel_prefix(kernel: str) -> str:
    """The kernel name every variant of ``kernel`` (``"k1"``, ``"k2"``) starts with."""
    from pallas_kernels.common import channelwise_grad_mosaic_gpu as cgm
    return cgm.KERNEL_NAME if kernel == "k1" else cgm.K2_KERNEL_NAME


def relative_rms(got, want) -> float:
    """``rms(got - want) / rms(want)``."""
    import numpy as np
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.sqrt(np.mean((got - want) ** 2)) / np.sqrt(np.mean(want ** 2)))


def grad_float64(q, k, kr, ks, gamma, hs, dhs, do, vn, dr, *, scale: float, heads: int,
                 pair_mask=None) -> Dict[str, object]:
    """float64 NumPy evaluation of K1's and K2's equations (one document per row; module
    docstring of ``channelwise_grad_mosaic_gpu``) on batch row 0, heads ``[0, heads)``.

    Args are batch row 0 of the kernels' inputs (``[T, H, K]``, ``[T, H, V]``, ``ks [T, H,
    1]``, ``hs, dhs [H, N, K, V]``), T a multiple of 64. Returns a dict of ``[T, heads, K]``
    arrays: K1's ``dq_m, dk_m, dkr_m`` and K2's ``dq, dk, dg`` and ``dks [T, heads, 1]``.
    ``pair_mask``: an optional ``[64, 64]`` weight of the pairs ``(i, j)`` of each chunk in
    ``dMq``, ``dMk`` (e.g. one route of the kernels' split, for ``benchmarks/diag_grad.py``);
    ``None`` keeps every pair.
    """
    import numpy as np
    f = [np.asarray(x, np.float64) for x in (q, k, kr, ks, gamma, do, vn, dr)]
    q, k, kr, ks, gam, do, vn, dr = (x[:, :heads] for x in f)
    hs, dhs = (np.asarray(x, np.float64)[:heads] for x in (hs, dhs))
    seq_len, _, dk = q.shape
    chunk = 64
    i, j = np.indices((chunk, chunk))
    names = ("dq_m", "dk_m", "dkr_m", "dq", "dk", "dg")
    out = {n: np.zeros((seq_len, heads, dk)) for n in names}
    out["dks"] = np.zeros((seq_len, heads, 1))
    for h in range(heads):
        for n in range(seq_len // chunk):
            r = slice(n * chunk, (n + 1) * chunk)
            qc, kc, krc, g, doc_, vnc, drc = (x[r, h] for x in (q, k, kr, gam, do, vn, dr))
            dmq = scale * (doc_ @ vnc.T) * (i >= j)
            dmk = -(drc @ vnc.T) * (i > j)
            if pair_mask is not None:
                dmq, dmk = dmq * pair_mask, dmk * pair_mask
            e = np.exp(np.where((i >= j)[:, :, None], g[:, None, :] - g[None, :, :], -np.inf))
            dq_m = np.einsum("ij,jc,ijc->ic", dmq, kc, e)
            dk_m = (np.einsum("ij,ic,ijc->jc", dmq, qc, e)
                    + np.einsum("ij,ic,ijc->jc", dmk, krc, e))
            dkr_m = np.einsum("ij,jc,ijc->ic", dmk, kc, e)
            s0, dsc = hs[h, n], dhs[h, n]  # [K, V]
            g_last = g[-1]
            e_in, e_out = np.exp(g), np.exp(g_last - g)
            dq_s = scale * (doc_ @ s0.T) * e_in
            dkr_s = -(drc @ s0.T) * e_in
            dk_s = (vnc @ dsc.T) * e_out
            dk_o = kc * dk_s
            dgam = qc * dq_s + krc * dkr_s - dk_o
            dgam[-1] += np.sum(dk_o, axis=0) + np.sum(s0 * dsc, axis=-1) * np.exp(g_last)
            dgam += qc * dq_m + krc * dkr_m - kc * dk_m
            dkr = dkr_s + dkr_m
            for name, x in (("dq_m", dq_m), ("dk_m", dk_m), ("dkr_m", dkr_m),
                            ("dq", dq_s + dq_m), ("dk", dk_s + dk_m + ks[r, h] * dkr),
                            ("dg", np.flip(np.cumsum(np.flip(dgam, 0), axis=0), 0)),
                            ("dks", np.sum(kc * dkr, axis=-1, keepdims=True))):
                out[name][r, h] = x
    return out


# The outputs each kernel returns, in order, and the float64 entries they are gated against.
CHECKED = {"k1": (("dq", "dq_m"), ("dk", "dk_m"), ("dkr", "dkr_m")),
           "k2": (("dq", "dq"), ("dk", "dk"), ("dks", "dks"), ("dg", "dg"))}


def gate_record(kernel: str, outs, want: Dict[str, object], heads: int, gate: float) -> Dict:
    """``{"rel_rms": {output: relative RMS vs float64}, "gate": "pass" | "FAIL (...)"}`` of a
    full variant's outputs ``outs`` (batch row 0, heads ``[0, heads)`` are compared)."""
    import numpy as np
    rms = {}
    for (name, ref), x in zip(CHECKED[kernel], outs, strict=True):
        got = np.asarray(np.asarray(x[0, :, :heads], np.float32), np.float64)
        rms[name] = relative_rms(got, want[ref])
    bad = [n for n, v in rms.items() if not v < gate]  # NaN fails
    return dict(rel_rms=rms, gate="pass" if not bad else f"FAIL ({', '.join(bad)} >= {gate:g})")


def render(records: Sequence[Dict], header: str) -> str:
    """The markdown table of ``records``: variant, kernel ms, its difference to the full
    variant of the same kernel (``k1`` or ``k2``) in this run, the call's total ms, the gate
    (the full variants' largest relative RMS vs float64; ablated ones are not gated) and the
    compile seconds. The full variant of a record is the one of its kernel and ``slab``."""
    lines = [header, "", "| variant | kernel ms | delta vs full | call total ms | gate | "
             "compile s |", "|---|---:|---:|---:|---|---:|"]
    full = {(r["kernel"], r.get("slab")): r["kernel_ms"] for r in records
            if not r.get("ablations") and r.get("kernel_ms") is not None}

    def f(x, spec=".3f"):
        return "–" if x is None else format(x, spec)

    for r in records:
        if r.get("skipped") or r.get("error"):
            why = f"skipped: {r['skipped']}" if r.get("skipped") else f"failed: {r['error']}"
            lines.append(f"| {r['variant']} | {why} | | | | |")
            continue
        ms = r.get("kernel_ms")
        ref = full.get((r.get("kernel"), r.get("slab")))
        delta = None if ms is None or ref is None or not r.get("ablations") else ms - ref
        gate = r.get("gate", "–")
        if r.get("rel_rms"):
            gate += f", max rel. RMS {max(r['rel_rms'].values()):.2e}"
        lines.append(f"| {r['variant']} | {f(ms)} | "
                     f"{'–' if delta is None else format(delta, '+.3f')} | "
                     f"{f(r.get('total_ms'))} | {gate} | {f(r.get('compile_s'), '.1f')} |")
    return "\n".join(lines) + "\n"


def _shapes() -> Dict[str, Tuple]:
    b, t, h, dk, dv = (_BATCH.value, _SEQ_LEN.value, _HEADS.value, int(_DK.value),
                       int(_DV.value))
    n = -(-t // 64)
    return dict(tk=(b, t, h, dk), tv=(b, t, h, dv), ks=(b, t, h, 1), hs=(b, h, n, dk, dv))


def _call(kernel: str, ablations: Tuple[str, ...], scale: float, interpret: bool = False,
          slab: int = 32):
    """The jitted variant: ``fn(q, k, kr, ks, gamma, hs, dhs, do, vn, dr)`` (K2 ignores
    ``kr``: it forms ``kr = k ks`` itself, as :func:`_inputs` forms it)."""
    import jax
    from pallas_kernels.common import channelwise_grad_mosaic_gpu as cgm
    if kernel == "k1":
        return jax.jit(lambda q, k, kr, ks, g, hs, dhs, do, vn, dr: (
            cgm.channelwise_grad_intra_mosaic(q, k, kr, g, do, vn, dr, scale=scale, slab=slab,
                                              ablations=ablations, interpret=interpret)))
    return jax.jit(lambda q, k, kr, ks, g, hs, dhs, do, vn, dr: (
        cgm.channelwise_grad_chunk_mosaic(q, k, ks, g, hs, dhs, do, vn, dr, scale=scale,
                                          slab=slab, ablations=ablations,
                                          interpret=interpret)))


def _inputs(dtype, seed=0):
    """KDA-like inputs on the device (``jax.random``: fast at S1): L2-normalised keys,
    ``ks`` (beta) in (0, 1), ``kr = k ks`` (the operand-dtype ``k`` times ``ks`` in fp32,
    rounded once: as the op and K2 form it), gamma the within-chunk cumsum of log-decays in
    ``[-0.1, 0]``, random states and cotangents."""
    import jax
    import jax.numpy as jnp
    s = _shapes()
    keys = jax.random.split(jax.random.PRNGKey(seed), 9)

    @jax.jit
    def make(keys):
        q = jax.random.normal(keys[0], s["tk"], jnp.float32)
        k = jax.random.normal(keys[1], s["tk"], jnp.float32)
        k = k / jnp.linalg.norm(k, axis=-1, keepdims=True)
        ks = jax.random.uniform(keys[2], s["ks"], jnp.float32)
        g = -0.1 * jax.random.uniform(keys[3], s["tk"], jnp.float32)
        b, t, h, dk = s["tk"]
        n = -(-t // 64)
        g = jnp.pad(g, ((0, 0), (0, n * 64 - t), (0, 0), (0, 0)))
        gamma = jnp.cumsum(g.reshape(b, n, 64, h, dk), axis=2).reshape(b, n * 64, h, dk)[:, :t]
        hs, dhs = (0.1 * jax.random.normal(kk, s["hs"], jnp.float32) for kk in keys[4:6])
        do, vn, dr = (jax.random.normal(kk, s["tv"], jnp.float32) for kk in keys[6:9])
        cast = (lambda x: x.astype(dtype))
        kr = cast(cast(k).astype(jnp.float32) * ks)
        return (cast(q), cast(k), kr, ks, gamma, cast(hs), cast(dhs), cast(do), cast(vn),
                cast(dr))

    return jax.block_until_ready(make(keys))


_WANT: Dict[str, object] = {}  # the float64 reference, computed once (first full variant)


def _measure(rec: Dict, want, kernel: str, ablations: Tuple[str, ...], args, scale: float,
             slab: int = 32):
    """Compiles, runs, gates (full variants only) and traces one variant, filling ``rec``."""
    import jax
    import numpy as np
    from benchmarks import common
    del want
    t0 = time.perf_counter()
    compiled = _call(kernel, ablations, scale, _INTERPRET.value, slab).lower(*args).compile()
    rec["compile_s"] = time.perf_counter() - t0
    outs = jax.block_until_ready(compiled(*args))
    if ablations:
        rec["gate"] = SKIPPED_GATE
    elif _CHECK_HEADS.value > 0:
        heads = min(_CHECK_HEADS.value, _HEADS.value)
        if "ref" not in _WANT:
            host = [np.asarray(np.asarray(x[0], np.float32)) for x in args]
            _WANT["ref"] = grad_float64(*host, scale=scale, heads=heads)
        rec.update(gate_record(kernel, outs, _WANT["ref"], heads, _GATE.value))
    if _ITERS.value <= 0:
        return None
    events = common.trace_events(lambda: compiled(*args), _ITERS.value)
    kernels = common.device_kernel_events(events)
    prefix = kernel_prefix(kernel)
    own = sum(d for name, _, d in kernels if name.startswith(prefix))
    total = sum(d for _, _, d in kernels)
    if total > 0:
        rec["kernel_ms"] = own / 1e3 / _ITERS.value
        rec["total_ms"] = total / 1e3 / _ITERS.value
        rec["kernel_names"] = sorted({n for n, _, _ in kernels if n.startswith(prefix)})
    return None


def _header(env: Dict) -> str:
    s = _shapes()
    b, t, h, dk = s["tk"]
    return (f"# K1 / K2 stage ablations, {env['date_utc']}\n\n"
            f"Device: {env['device_kind']} ({env['nvidia_smi']}); jax {env['jax']}.\n"
            f"Command: `{env['command']}`\n\n"
            f"Shape B {b}, T {t}, H {h}, K {dk}, V {s['tv'][-1]}, {_DTYPE.value}, per-token ks "
            f"(KDA), one document per row; slabs {_SLABS.value}; {_ITERS.value} traced calls "
            f"per variant. Ablated "
            f"variants compute wrong numbers by design and are not gated; 'delta vs full' is "
            f"against the full kernel of the same kind in this run.")


def _static_main(variants, env: Dict, scale: float) -> None:
    import json

    import jax
    import jax.numpy as jnp
    from benchmarks import profile_t0
    s = _shapes()
    dt = jnp.dtype(_DTYPE.value)
    spec = jax.ShapeDtypeStruct
    args = (spec(s["tk"], dt), spec(s["tk"], dt), spec(s["tk"], dt), spec(s["ks"], jnp.float32),
            spec(s["tk"], jnp.float32), spec(s["hs"], dt), spec(s["hs"], dt),
            spec(s["tv"], dt), spec(s["tv"], dt), spec(s["tv"], dt))
    records = []
    for text, kernel, ablations, slab in variants:
        exported = jax.export.export(_call(kernel, ablations, scale, slab=slab),
                                     platforms=["cuda"])(*args)
        module = profile_t0.mosaic_module_text(exported.mlir_module())
        records.append(dict(variant=text, kernel=kernel, ablations=list(ablations), slab=slab,
                            jax=env["jax"], static=profile_t0.static_counts(module)))
        print(json.dumps(records[-1]), flush=True)
    header = (f"# K1 / K2: instructions in the lowered Mosaic GPU modules (static, "
              f"{env['date_utc']})\n\nK {s['tk'][-1]}, V {s['tv'][-1]}, {_DTYPE.value}, "
              f"jax {env['jax']}; one copy of the kernel body per module (the band's loop body "
              f"once).")
    profile_t0.write_static(records, header, _OUT.value)


def main(argv: List[str]) -> None:
    del argv
    start = time.perf_counter()  # --deadline_s counts from here (imports included)
    try:
        variants = with_slabs(parse_variants(_VARIANTS.value), parse_slabs(_SLABS.value))
    except VariantError as e:
        raise app.UsageError(str(e)) from None
    if _SEQ_LEN.value % 64:
        raise app.UsageError(f"--seq_len={_SEQ_LEN.value} must be a multiple of 64 (the "
                             "float64 check works on whole chunks)")
    from benchmarks import common
    env = common.environment()
    scale = int(_DK.value) ** -0.5
    os.makedirs(os.path.dirname(os.path.abspath(_OUT.value)), exist_ok=True)
    if _STATIC.value:
        _static_main(variants, env, scale)
        return
    import jax.numpy as jnp
    args = _inputs(jnp.dtype(_DTYPE.value))
    header = _header(env)
    runs = [(dict(variant=text, kernel=kernel, ablations=list(ablations), slab=slab,
                  shape=list(_shapes()["tk"]) + [int(_DV.value)], dtype=_DTYPE.value,
                  date_utc=env["date_utc"], device=env["device_kind"], jax=env["jax"]),
             (kernel, ablations, args, scale, slab))
            for text, kernel, ablations, slab in variants]
    common.run_profile(_OUT.value, runs, _measure, render=lambda recs: render(recs, header),
                       deadline_s=_DEADLINE_S.value, start=start, deadline_exit=DEADLINE_EXIT)


if __name__ == "__main__":
    _define_flags()
    from lattn_jax import flag_errors  # one-line flag errors (absl only)
    app.run(main, flags_parser=flag_errors.parse_flags)
