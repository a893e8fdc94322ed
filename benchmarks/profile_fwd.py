r"""Where the fused ``T0`` forward kernel's time goes: its stage ablations timed in one run.

``chunk_delta_fused_t0_fwd_mosaic`` (two warpgroups; ``pallas_kernels/gated_delta_rule/
kernel_mosaic_gpu_fused.py``) took 0.421 ms of the 0.528 ms GDN forward at S1 on the H200
(2026-12-04, issue 29; target: the whole forward at 0.315 ms, so this kernel at about
0.21 ms). MOSAIC_GPU.md Sec. 14 showed that estimates of per-step costs can be off tenfold,
so this binary measures by ablation (Sec. 16): the kernel's ``stages``
(``kernel_mosaic_gpu_fused.FUSED_T0_STAGES``), cumulative along the state chain: ``io`` (the
memory warpgroup's eleven copies per chunk, the ring's waits and releases, ``o`` stored; no
``wgmma``), ``v_new`` (+ ``S`` to SMEM, ``K S``, ``X``, ``Ag`` and ``v_new = Ag X``),
``state`` (+ the state update: the whole serial chain), ``full`` (+ the read-out ``Q S``,
``Q K^T``, ``P v_new``), and two variants that do all of ``full``'s work: ``no_store`` (the
TMA store of ``o`` for each row's last chunk only) and ``nobar`` (without Pallas's automatic
warpgroup barriers, ``unsafe_no_auto_barriers``). Each has the same grid, warpgroups, ring
and SMEM, and its own kernel name, so consecutive differences are the time of each part of
the work as the kernel runs it (overlaps included).

Each variant is jitted, compiled, run once, then traced over ``--iters`` calls with
``jax.profiler`` (``benchmarks.common.trace_events``, the kernel timing of
``bench_kernels.py``); its record has the fused kernel's own device time (kernels named
``gdn_chunk_delta_fused_t0_fwd*``), the call's total (XLA's padding, cumsum and transposes
too) and cycles per chunk, ``kernel time x clock / (waves x chunks)``: each CTA walks the
``N`` chunks of one ``(b, h, 64 value columns)`` in order and ``B H V / 64`` CTAs run in
``ceil(CTAs / (--sm_count x --ctas_per_sm))`` waves (S1: 256 CTAs, one per SM, 2 waves), at
``--clock_ghz`` (default the 1.98 GHz boost clock). ``T0`` is an input, formed once beforehand
in XLA (``kernel_mosaic_gpu.kkt_inverse_xla``, rounded to the input dtype), so no ``T0``
kernel is timed. ``full`` and ``nobar`` are checked against a float64 token-serial recurrence
on batch row 0 (relative RMS of ``o`` on the first ``--check_heads`` heads; bf16 about 3e-3),
so a broken build shows. The table's header gives the HBM-bytes and tensor-core floors of the
shape (:func:`floors`). A variant that does not fit what is left of ``--deadline_s`` (its
estimate: the slowest finished variant's wall time) is skipped; one still compiling or running
at the deadline is marked, the table of the finished ones is written and the run exits with
status 3.

The three-warpgroup kernel (``split_output=True``; MOSAIC_GPU.md Sec. 39): ``--split_order``
(one of ``SPLIT_ORDERS``; default empty, the two-warpgroup kernel) and ``--split_stages`` (the
TMA ring's depth, 2 or 3) profile ``chunk_delta_fused_t0_fwd_mosaic(split_output=True, ...)``
instead, with its ablations ``kernel_mosaic_gpu_fused.SPLIT_T0_STAGES`` (``--variants``
default :data:`SPLIT_DEFAULT_VARIANTS`): ``io`` (the ring only), ``state`` (the state
warpgroup's chain alone, the output warpgroup only releasing), ``readout`` (the output
warpgroup's read-out alone on a frozen chain), ``full``, ``no_store``, ``nobar``; ``state``
and ``readout`` need ``--split_order=state_ag``. Those are not cumulative: the table's
"delta vs previous" of ``readout`` is the read-out alone minus the chain alone (positive: the
output warpgroup is the longer side), and ``full`` minus the larger of the two is what the
coupling of the warpgroups costs. The floors count the split kernel's products (``Ag X`` once).

``--rs_stages=3`` (or 2) profiles ``forward="fused_rs"``'s kernel instead
(``kernel_mosaic_gpu_rs.chunk_delta_fused_rs_fwd_mosaic`` with that ring depth; MOSAIC_GPU.md
Sec. 56). Its variants are ``kernel_mosaic_gpu_rs.RS_ABLATIONS`` (``--variants``, default
``full`` alone): ``state`` (the chain, and the output warpgroup's ``Ag`` it needs, without the
read-out), ``readout`` (the output warpgroup whole on a chain frozen at the entry state) and
``full`` (checked against float64 as above). As with the split kernel, ``full`` minus the
larger of the two sides is what the coupling costs.

Outputs: ``<out>.jsonl`` (one record per variant, appended as each finishes; each names its
``kernel``, ``stages``, ``split_order`` and ``split_stages``) and ``<out>.md``.
Usage, on the GPU machine::

    python3 benchmarks/profile_fwd.py --deadline_s=80 --out=$OUT/fwd_stages
    python3 benchmarks/profile_fwd.py --split_order=state_ag --split_stages=3 \
        --deadline_s=80 --out=$OUT/split_stages

Without a GPU, ``--interpret`` runs the variants in Mosaic GPU interpret mode at a tiny shape
(checks of this binary; no kernel times), and ``--static`` (CPU, seconds) exports each variant
for CUDA and counts instructions in the lowered Mosaic GPU module as ``profile_t0.py --static``
does (one chunk-loop body per module: per chunk but for the prologue and epilogue)::

    JAX_PLATFORMS=cpu python benchmarks/profile_fwd.py --static --out=/tmp/fwd_static
    JAX_PLATFORMS=cpu python benchmarks/profile_fwd.py --static --split_order=state_ag \
        --split_stages=3 --out=/tmp/split_static
"""

import json
import os
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

from absl import app, flags

if __name__ == "__main__":  # python benchmarks/profile_fwd.py from the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import profile_t0  # noqa: E402  (after the path set-up above)

DEFAULT_VARIANTS = ("io", "v_new", "state", "full", "no_store", "nobar")
# With --split_order (kernel_mosaic_gpu_fused.SPLIT_T0_STAGES): each side alone, then the kernel.
SPLIT_DEFAULT_VARIANTS = ("io", "state", "readout", "full", "no_store", "nobar")
KERNEL_PREFIX = "gdn_chunk_delta_fused_t0_fwd"
RS_KERNEL_PREFIX = "gdn_chunk_delta_fused_rs_fwd"  # --rs_stages (MOSAIC_GPU.md Sec. 56)
CHECKED_STAGES = ("full", "nobar")  # the stages whose first output is o
DEADLINE_EXIT = profile_t0.DEADLINE_EXIT
DEFAULT_CLOCK_GHZ = profile_t0.DEFAULT_CLOCK_GHZ
HBM_TB_S = 4.8  # H200 HBM3e peak, TB/s
TENSOR_TFLOPS = 989.0  # H200 dense bf16 / fp16 peak with fp32 accumulation, TFLOP/s
BLOCK_V = 64  # value columns per CTA (kernel_mosaic_gpu_fused.BLOCK_V)


def _define_flags() -> None:
    """Defines the flags (only when run as a program: other benchmark modules define some of
    the same names in absl's global registry, and the tests import several of them)."""
    global _BATCH, _SEQ_LEN, _HEADS, _KV_HEADS, _DK, _DV, _DTYPE, _DOCS, _VARIANTS, _ITERS
    global _CHECK_HEADS, _SM_COUNT, _CTAS_PER_SM, _CLOCK_GHZ, _DEADLINE_S, _INTERPRET
    global _STATIC, _OUT, _SPLIT_ORDER, _SPLIT_STAGES, _RS_STAGES, _RS_PROTOCOL
    from benchmarks import common
    shared = common.define_profile_flags(
        heads_help="Value heads H.", dtype_help="q, k, v dtype.",
        variants_default=DEFAULT_VARIANTS,
        variants_help="Stages to time, in this order (FUSED_T0_STAGES; with --split_order "
                      "SPLIT_T0_STAGES, default " + ",".join(SPLIT_DEFAULT_VARIANTS) + ").",
        check_heads_help="Heads of batch row 0 checked against float64 for full and nobar "
                         "(0: no check).")
    flags.adopt_module_key_flags(common)  # in --help with this binary's own
    (_BATCH, _SEQ_LEN, _HEADS, _DK, _DV, _DTYPE, _VARIANTS, _ITERS, _CHECK_HEADS, _DEADLINE_S,
     _INTERPRET, _STATIC, _OUT) = shared.holders()
    _KV_HEADS = flags.DEFINE_integer("kv_heads", 16, "Query/key heads Hk (H % Hk == 0).")
    _DOCS = flags.DEFINE_integer("doc_len", 0, "If > 0, documents of this many tokens "
                                 "(segment_ids); 0: one document per row.")
    _SM_COUNT = flags.DEFINE_integer("sm_count", 132, "SMs, for the waves and cycles.")
    _CTAS_PER_SM = flags.DEFINE_integer("ctas_per_sm", 1, "Resident CTAs per SM (SMEM: one at "
                                        "K = V = 128).")
    _CLOCK_GHZ = flags.DEFINE_float("clock_ghz", None, "SM clock (GHz) for the cycles; default "
                                    "1.98 (nvidia-smi's clocks.sm is recorded beside it).")
    _SPLIT_ORDER = flags.DEFINE_string(
        "split_order", "", "Profile the three-warpgroup kernel (split_output=True) in this "
        "order (kernel_mosaic_gpu_fused.SPLIT_ORDERS; state and readout need state_ag); empty: "
        "the two-warpgroup kernel.")
    _SPLIT_STAGES = flags.DEFINE_integer("split_stages", 2, "TMA ring depth of the "
                                         "three-warpgroup kernel (2 or 3; with --split_order).")
    _RS_STAGES = flags.DEFINE_integer(
        "rs_stages", 0, "If > 0, profile the fused_rs kernel (kernel_mosaic_gpu_rs, MOSAIC_GPU.md "
        "Sec. 56) with this TMA ring depth (2 or 3; --variants from its RS_ABLATIONS: state, "
        "readout, full; default full) instead of the fused T0 kernels; not with --split_order.")
    _RS_PROTOCOL = flags.DEFINE_enum(
        "rs_protocol", "joint", ["joint", "ag_ahead"], "With --rs_stages: the fused_rs "
        "kernel's protocol= (kernel_mosaic_gpu_rs.RS_PROTOCOLS; ag_ahead: the output warpgroup "
        "prepares chunk n + 1 before chunk n's read-out, MOSAIC_GPU.md Sec. 64).")


class VariantError(ValueError):
    """A ``--variants`` entry that is not one of ``FUSED_T0_STAGES`` (``SPLIT_T0_STAGES`` for
    the three-warpgroup kernel), or a bad ``--split_order`` / ``--split_stages``."""


def parse_variants(texts: Sequence[str], split_order: str = "") -> List[str]:
    """The stripped ``--variants`` entries, in order; ``split_order`` (``--split_order``,
    empty for the two-warpgroup kernel) picks the stages allowed.

    Raises:
      VariantError: naming an entry that is not in ``FUSED_T0_STAGES`` (with ``split_order``:
        ``SPLIT_T0_STAGES``, and ``state`` / ``readout`` only with ``state_ag``) or is repeated.
    """
    from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu_fused as kfused
    allowed = kfused.SPLIT_T0_STAGES if split_order else kfused.FUSED_T0_STAGES
    out: List[str] = []
    for text in texts:
        stages = text.strip()
        if stages not in allowed:
            raise VariantError(f"--variants entry {text!r}: not in {allowed}")
        if split_order not in ("", "state_ag") and stages in ("state", "readout"):
            raise VariantError(f"--variants entry {text!r} runs one warpgroup alone: it needs "
                               f"--split_order=state_ag, got {split_order!r}")
        if stages in out:
            raise VariantError(f"--variants entry {text!r} is repeated")
        out.append(stages)
    return out


def parse_split(split_order: str, split_stages: int) -> Dict:
    """``chunk_delta_fused_t0_fwd_mosaic``'s kernel options for ``--split_order`` and
    ``--split_stages``: ``{}`` for the two-warpgroup kernel (empty order, 2 stages), else
    ``split_output``, ``split_order`` and ``split_stages``.

    Raises:
      VariantError: an order not in ``SPLIT_ORDERS``, a depth not in ``SPLIT_STAGES``, or a
        depth other than 2 without an order.
    """
    from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu_fused as kfused
    if split_stages not in kfused.SPLIT_STAGES:
        raise VariantError(f"--split_stages={split_stages}: not in {kfused.SPLIT_STAGES}")
    if not split_order:
        if split_stages != kfused.STAGES:
            raise VariantError(f"--split_stages={split_stages} is the three-warpgroup kernel's "
                               f"ring depth: it needs --split_order")
        return {}
    if split_order not in kfused.SPLIT_ORDERS:
        raise VariantError(f"--split_order={split_order!r}: not in {kfused.SPLIT_ORDERS}")
    return dict(split_output=True, split_order=split_order, split_stages=split_stages)


def parse_rs(rs_stages: int, split_order: str, variants: Sequence[str],
             protocol: str = "joint") -> Dict:
    """The options of ``--rs_stages`` (``{}`` when 0): ``{"rs_stages": N}``, plus
    ``"rs_protocol"`` when ``--rs_protocol`` is not ``joint`` (MOSAIC_GPU.md Sec. 64).

    Raises:
      VariantError: a depth not in ``kernel_mosaic_gpu_rs.RS_STAGES``, with ``--split_order``,
        or a ``variants`` entry not in ``kernel_mosaic_gpu_rs.RS_ABLATIONS`` or repeated; a
        ``protocol`` not in ``kernel_mosaic_gpu_rs.RS_PROTOCOLS``, or other than ``joint``
        without ``--rs_stages``.
    """
    from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu_rs as krs
    if protocol not in krs.RS_PROTOCOLS:
        raise VariantError(f"--rs_protocol={protocol}: not in {krs.RS_PROTOCOLS}")
    if not rs_stages:
        if protocol != "joint":
            raise VariantError(f"--rs_protocol={protocol} applies to --rs_stages only")
        return {}
    if rs_stages not in krs.RS_STAGES:
        raise VariantError(f"--rs_stages={rs_stages}: not in {krs.RS_STAGES}")
    if split_order:
        raise VariantError(f"--rs_stages={rs_stages} profiles the fused_rs kernel: not with "
                           f"--split_order={split_order}")
    for i, text in enumerate(variants):
        if text not in krs.RS_ABLATIONS or text in variants[:i]:
            raise VariantError(f"--rs_stages={rs_stages}: --variants entry {text!r} is not one "
                               f"of {krs.RS_ABLATIONS} or is repeated")
    return {"rs_stages": rs_stages, **({} if protocol == "joint" else {"rs_protocol": protocol})}


def kernel_name(stages: str, split: Dict) -> str:
    """The Mosaic GPU kernel name a variant's profile lists (``split``: :func:`parse_split`,
    or :func:`parse_rs`'s options)."""
    from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu_fused as kfused
    from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu_rs as krs
    if "rs_stages" in split:
        return krs.rs_kernel_name(split["rs_stages"], stages,
                                  protocol=split.get("rs_protocol", "joint"))
    return kfused.fused_t0_kernel_name(stages=stages, **split)


def waves(batch: int, heads: int, dv: int, *, sm_count: int, ctas_per_sm: int) -> int:
    """Waves of the kernel's ``batch x heads x dv / 64`` CTAs over ``sm_count x ctas_per_sm``
    slots (each CTA walks all chunks of its row, so a wave lasts one CTA's whole loop)."""
    ctas = batch * heads * (dv // BLOCK_V)
    return -(-ctas // (sm_count * ctas_per_sm))


def cycles_per_chunk(kernel_ms: float, num_chunks: int, num_waves: int, clock_ghz: float
                     ) -> float:
    """SM cycles one CTA spends per chunk: ``kernel_ms`` over ``num_waves`` waves of CTAs that
    each walk ``num_chunks`` chunks, at ``clock_ghz``."""
    return kernel_ms * 1e-3 * clock_ghz * 1e9 / (num_waves * num_chunks)


def floors(batch: int, seq_len: int, heads: int, kv_heads: int, dk: int, dv: int,
           itemsize: int = 2, split: bool = False) -> Dict[str, float]:
    """HBM-bytes and tensor-core floors of the fused ``T0`` kernel at a shape.

    ``hbm_bytes``: what must cross HBM once: ``q, k`` (key heads), ``v``, ``T0``
    (``[B, T, H, 64]``) and ``o`` in the input dtype, the fp32 gate cumsum and ``beta``
    (head-major), three fp32 per-token document vectors and the fp32 final state, ``T``
    padded to chunks of 64; the second value-column CTA of a ``(b, h)`` (grid minor axis,
    launched beside the first) is assumed to read ``q, k, T0`` from L2. ``mac``: the
    multiply-adds of the products as issued, per ``(b, h, chunk, 64 value columns)``
    ``64 x 64 x (4 K + 3 x 64)`` (``K S``, ``Q S``, ``Q K^T``, ``K^T v_new``, ``Ag X`` as
    ``hi + lo``, ``P v_new``); ``split`` (the three-warpgroup kernel, whose ``Ag_<`` is one
    16-bit operand): ``64 x 64 x (4 K + 2 x 64)``. ``hbm_ms`` and ``tensor_ms`` at
    :data:`HBM_TB_S` and :data:`TENSOR_TFLOPS`.
    """
    n = -(-seq_len // 64)
    tp = n * 64
    hbm = (2 * batch * tp * kv_heads * dk * itemsize  # q, k
           + 2 * batch * tp * heads * dv * itemsize  # v, o
           + batch * tp * heads * 64 * itemsize  # T0
           + 2 * batch * heads * tp * 4  # gate cumsum, beta
           + 3 * batch * tp * 4  # doc, last, conn
           + batch * heads * dk * dv * 4)  # final state
    mac = batch * heads * n * (dv // BLOCK_V) * 64 * 64 * (4 * dk + (2 if split else 3) * 64)
    return dict(hbm_bytes=float(hbm), hbm_ms=hbm / HBM_TB_S / 1e9, mac=float(mac),
                tensor_ms=2 * mac / TENSOR_TFLOPS / 1e9)


def o_float64(q, k, v, g, beta, segment_ids, scale: float, heads: int):
    """float64 ``o`` ``[T, heads, V]`` of batch row 0, heads ``[0, heads)``, by the token
    recurrence ``u_t = beta_t (v_t - e^{g_t} S_{t-1}^T k_t)``,
    ``S_t = e^{g_t} S_{t-1} + k_t u_t^T``, ``o_t = scale S_t^T q_t`` from ``S = 0``, the state
    reset to zero where ``segment_ids`` changes (GVA: head ``h`` reads key head
    ``h // (H / Hk)``); ``g`` ``None`` is DeltaNet (``g = 0``)."""
    import numpy as np
    q, k = (np.asarray(x, np.float64)[0] for x in (q, k))  # [T, Hk, K]
    v = np.asarray(v, np.float64)[0]  # [T, H, V]
    beta = np.asarray(beta, np.float64)[0]
    g = np.zeros_like(beta) if g is None else np.asarray(g, np.float64)[0]
    seq_len = k.shape[0]
    seg = np.zeros(seq_len, np.int64) if segment_ids is None else np.asarray(segment_ids)[0]
    group = v.shape[1] // k.shape[1]
    out = np.zeros((seq_len, heads, v.shape[2]))
    for h in range(heads):
        s = np.zeros((k.shape[2], v.shape[2]))
        for t in range(seq_len):
            if t > 0 and seg[t] != seg[t - 1]:
                s[:] = 0.0
            kt, qt = k[t, h // group], q[t, h // group]
            s *= np.exp(g[t, h])
            u = beta[t, h] * (v[t, h] - s.T @ kt)
            s += np.outer(kt, u)
            out[t, h] = scale * (s.T @ qt)
    return out


def relative_rms(got, want) -> float:
    """``rms(got - want) / rms(want)``."""
    import numpy as np
    return float(np.sqrt(np.mean((got - want) ** 2)) / np.sqrt(np.mean(want ** 2)))


def render(records: Sequence[Dict], header: str) -> str:
    """The markdown table of ``records``: kernel ms, its difference to the previous record and
    to ``full``, the call's total, cycles per chunk, the checked variants' error, compile s."""
    lines = [header, "", "| variant | fused kernel ms | delta vs previous | delta vs full | "
             "call total ms | cycles per chunk | rel. RMS of o vs float64 | compile s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    full = next((r["kernel_ms"] for r in records if r.get("stages") == "full"
                 and r.get("kernel_ms") is not None), None)
    prev = None

    def f(x, spec=".3f"):
        return "–" if x is None else format(x, spec)

    for r in records:
        if r.get("skipped") or r.get("error"):
            why = f"skipped: {r['skipped']}" if r.get("skipped") else f"failed: {r['error']}"
            lines.append(f"| {r['variant']} | {why} | | | | | | |")
            continue
        ms = r.get("kernel_ms")
        delta = None if prev is None or ms is None else ms - prev
        vs_full = (None if full is None or ms is None or r.get("stages") == "full"
                   else ms - full)
        lines.append(f"| {r['variant']} | {f(ms)} | "
                     f"{'–' if delta is None else format(delta, '+.3f')} | "
                     f"{'–' if vs_full is None else format(vs_full, '+.3f')} | "
                     f"{f(r.get('total_ms'))} | {f(r.get('cycles_per_chunk'), ',.0f')} | "
                     f"{f(r.get('rel_rms'), '.3e')} | {f(r.get('compile_s'), '.1f')} |")
        prev = ms if ms is not None else prev
    return "\n".join(lines) + "\n"


def _inputs(batch, seq_len, heads, kv_heads, dk, dv, dtype, doc_len, seed=0):
    """``bench_kernels``'s GDN inputs: unit-norm ``q, k``, normal ``v``, ``g = logsigmoid(N(0,
    1))``, ``beta = sigmoid(N(0, 1))`` (fp32), documents of ``doc_len`` tokens if > 0; and
    ``T0`` from ``kkt_inverse_xla`` rounded to ``dtype``."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu as kgd
    rng = np.random.default_rng(seed)

    def unit(shape):
        x = rng.standard_normal(shape).astype(np.float32)
        return x / np.linalg.norm(x, axis=-1, keepdims=True)

    q = jnp.asarray(unit((batch, seq_len, kv_heads, dk)), dtype)
    k = jnp.asarray(unit((batch, seq_len, kv_heads, dk)), dtype)
    v = jnp.asarray(rng.standard_normal((batch, seq_len, heads, dv)).astype(np.float32), dtype)
    g = jax.nn.log_sigmoid(jnp.asarray(rng.standard_normal((batch, seq_len, heads)),
                                       jnp.float32))
    beta = jax.nn.sigmoid(jnp.asarray(rng.standard_normal((batch, seq_len, heads)),
                                      jnp.float32))
    seg = None
    if doc_len > 0:
        seg = jnp.asarray(np.broadcast_to(np.arange(seq_len) // doc_len, (batch, seq_len)),
                          jnp.int32)
    t0 = jax.jit(lambda k, b, s: kgd.kkt_inverse_xla(k, b, segment_ids=s).astype(k.dtype))(
        k, beta, seg)
    return q, k, v, t0, g, beta, seg


def _kernel_fn(stages: str, scale: float, interpret: bool, split: Optional[Dict] = None):
    """The jitted kernel call of one variant, returning ``(first output, final state)``;
    ``split``: :func:`parse_split`'s options (``None`` or ``{}``: two warpgroups)."""
    import jax
    from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu_fused as kfused
    from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu_rs as krs
    split = split or {}
    if "rs_stages" in split:  # --rs_stages: fused_rs's kernel and its ablations
        return jax.jit(lambda q, k, v, t0, g, beta, seg: krs.chunk_delta_fused_rs_fwd_mosaic(
            q, k, v, t0, g, beta, scale=scale, segment_ids=seg, interpret=interpret,
            stages=split["rs_stages"], ablation=stages,
            protocol=split.get("rs_protocol", "joint")))
    return jax.jit(lambda q, k, v, t0, g, beta, seg: kfused.chunk_delta_fused_t0_fwd_mosaic(
        q, k, v, t0, g, beta, scale=scale, segment_ids=seg, stages=stages,
        interpret=interpret, **split)[:2])


def _kernel_label(split: Dict) -> str:
    if "rs_stages" in split:
        return (f"fused_rs forward kernel (S^T in registers, {split['rs_stages']} ring stages, "
                f"protocol {split.get('rs_protocol', 'joint')}: "
                f"{kernel_name('full', split)})")
    if not split:
        return "Fused T0 forward kernel (two warpgroups)"
    return (f"Fused T0 forward kernel, three warpgroups (split_order={split['split_order']}, "
            f"split_stages={split['split_stages']}: {kernel_name('full', split)})")


def _header(env: Dict, shape: Dict, split: Dict) -> str:
    fl = floors(**shape, split=bool(split))
    nw = waves(shape["batch"], shape["heads"], shape["dv"], sm_count=_SM_COUNT.value,
               ctas_per_sm=_CTAS_PER_SM.value)
    return (f"# {_kernel_label(split)}: stage ablations, {env['date_utc']}\n\n"
            f"Device: {env['device_kind']} ({env['nvidia_smi']}); jax {env['jax']}.\n"
            f"Command: `{env['command']}`\n\n"
            f"Shape B {shape['batch']}, T {shape['seq_len']}, H {shape['heads']}, "
            f"Hk {shape['kv_heads']}, K {shape['dk']}, V {shape['dv']}, {_DTYPE.value}, "
            f"{'documents of ' + str(_DOCS.value) if _DOCS.value else 'one document per row'}"
            f"; {_ITERS.value} traced calls per variant; cycles per chunk over {nw} wave(s) of "
            f"CTAs ({_SM_COUNT.value} SMs x {_CTAS_PER_SM.value}) at "
            f"{_CLOCK_GHZ.value or DEFAULT_CLOCK_GHZ} GHz. Floors: HBM "
            f"{fl['hbm_bytes'] / 1e6:,.0f} MB = {fl['hbm_ms']:.3f} ms at {HBM_TB_S} TB/s; "
            f"{fl['mac'] / 1e9:.1f} G multiply-adds = {fl['tensor_ms']:.3f} ms at "
            f"{TENSOR_TFLOPS:.0f} TFLOP/s.")


def _measure(rec: Dict, want, stages: str, args, scale: float, num_chunks: int,
             num_waves: int, split: Dict):
    """Compiles, runs, checks (``want``: the float64 ``o`` once computed, else ``None``) and
    traces one variant (``split``: :func:`parse_split`'s options), filling ``rec``; returns
    ``want``."""
    import jax
    import numpy as np
    from benchmarks import common
    t0 = time.perf_counter()
    compiled = _kernel_fn(stages, scale, _INTERPRET.value, split).lower(*args).compile()
    rec["compile_s"] = time.perf_counter() - t0
    o, _ = jax.block_until_ready(compiled(*args))
    if stages in CHECKED_STAGES and _CHECK_HEADS.value > 0:
        heads = min(_CHECK_HEADS.value, _HEADS.value)
        if want is None:
            q, k, v, _, g, beta, seg = args
            want = o_float64(*(np.asarray(x.astype(np.float32)) for x in (q, k, v)), g, beta,
                             seg, scale, heads)
        rec["rel_rms"] = relative_rms(np.asarray(o[0, :, :heads].astype(np.float32),
                                                 np.float64), want)
    if _ITERS.value <= 0:
        return want
    events = common.trace_events(lambda: compiled(*args), _ITERS.value)
    kernels = common.device_kernel_events(events)
    prefixes = (KERNEL_PREFIX, RS_KERNEL_PREFIX)
    own = sum(d for name, _, d in kernels if name.startswith(prefixes))
    total = sum(d for _, _, d in kernels)
    if total > 0:
        rec["sm_clock_smi"] = common.nvidia_smi("clocks.sm")
        clock = _CLOCK_GHZ.value or DEFAULT_CLOCK_GHZ
        rec["clock_ghz"] = clock
        rec["kernel_ms"] = own / 1e3 / _ITERS.value
        rec["total_ms"] = total / 1e3 / _ITERS.value
        rec["kernel_names"] = sorted({n for n, _, _ in kernels if n.startswith(prefixes)})
        rec["cycles_per_chunk"] = cycles_per_chunk(rec["kernel_ms"], num_chunks, num_waves,
                                                   clock)
    return want


def _static_main(variants: Sequence[str], args, scale: float, env: Dict, shape: Dict,
                 split: Dict) -> None:
    import jax
    records = []
    for stages in variants:
        exported = jax.export.export(_kernel_fn(stages, scale, False, split),
                                     platforms=["cuda"])(*args)
        text = profile_t0.mosaic_module_text(exported.mlir_module())
        records.append(dict(variant=stages, stages=stages, kernel=kernel_name(stages, split),
                            **_split_fields(split), jax=env["jax"], **shape,
                            static=profile_t0.static_counts(text)))
        print(json.dumps(records[-1]), flush=True)
    header = (f"# {_kernel_label(split)}: instructions in the lowered Mosaic GPU modules "
              f"(static, {env['date_utc']})\n\nK {shape['dk']}, V {shape['dv']}, "
              f"{_DTYPE.value}, jax {env['jax']}; one chunk-loop body per module (every "
              f"warpgroup's code, each once), plus the prologue and epilogue.")
    profile_t0.write_static(records, header, _OUT.value)


def _split_fields(split: Dict) -> Dict:
    """A record's ``split_order`` (``None``: two warpgroups), ``split_stages`` and
    ``rs_stages`` (``None`` unless ``--rs_stages``) and ``rs_protocol`` (with it)."""
    return dict(split_order=split.get("split_order"),
                split_stages=split.get("split_stages", 2), rs_stages=split.get("rs_stages"),
                **({"rs_protocol": split.get("rs_protocol", "joint")}
                   if "rs_stages" in split else {}))


def selected_variants() -> Tuple[Dict, List[str]]:
    """From the parsed flags: :func:`parse_split`'s kernel options and the stages to time
    (``--variants``, or :data:`SPLIT_DEFAULT_VARIANTS` with ``--split_order`` when
    ``--variants`` is not given).

    With ``--rs_stages``: :func:`parse_rs`'s options and ``--variants`` (default ``["full"]``).

    Raises:
      VariantError: as :func:`parse_split`, :func:`parse_variants` and :func:`parse_rs`.
    """
    if _RS_STAGES.value or _RS_PROTOCOL.value != "joint":  # the fused_rs kernel: "full"
        # unless --variants says otherwise
        texts = [t.strip() for t in _VARIANTS.value] if _VARIANTS.present else ["full"]
        return parse_rs(_RS_STAGES.value, _SPLIT_ORDER.value, texts, _RS_PROTOCOL.value), texts
    split = parse_split(_SPLIT_ORDER.value, _SPLIT_STAGES.value)
    texts = SPLIT_DEFAULT_VARIANTS if split and not _VARIANTS.present else _VARIANTS.value
    return split, parse_variants(texts, _SPLIT_ORDER.value)


def main(argv: List[str]) -> None:
    del argv
    start = time.perf_counter()  # --deadline_s counts from here (imports included)
    from benchmarks import common
    try:
        split, variants = selected_variants()
    except VariantError as e:
        raise app.UsageError(str(e)) from None
    if _HEADS.value % _KV_HEADS.value:
        raise app.UsageError(f"--heads={_HEADS.value} must be a multiple of "
                             f"--kv_heads={_KV_HEADS.value}")
    shape = dict(batch=_BATCH.value, seq_len=_SEQ_LEN.value, heads=_HEADS.value,
                 kv_heads=_KV_HEADS.value, dk=int(_DK.value), dv=int(_DV.value))
    args = _inputs(*shape.values(), _DTYPE.value, _DOCS.value)
    scale = shape["dk"] ** -0.5
    num_chunks = -(-shape["seq_len"] // 64)
    num_waves = waves(shape["batch"], shape["heads"], shape["dv"], sm_count=_SM_COUNT.value,
                      ctas_per_sm=_CTAS_PER_SM.value)
    env = common.environment()
    if _STATIC.value:
        _static_main(variants, args, scale, env, shape, split)
        return
    header = _header(env, shape, split)
    variants = [
        (dict(variant=stages, stages=stages, kernel=kernel_name(stages, split),
              **_split_fields(split), **shape, dtype=_DTYPE.value, doc_len=_DOCS.value,
              date_utc=env["date_utc"], device=env["device_kind"], jax=env["jax"]),
         (stages, args, scale, num_chunks, num_waves, split))
        for stages in variants]
    common.run_profile(_OUT.value, variants, _measure, render=lambda recs: render(recs, header),
                       deadline_s=_DEADLINE_S.value, start=start, deadline_exit=DEADLINE_EXIT)


if __name__ == "__main__":
    _define_flags()
    from lattn_jax import flag_errors  # one-line flag errors (absl only)
    app.run(main, flags_parser=flag_errors.parse_flags)
