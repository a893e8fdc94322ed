r"""Where the ``T0`` kernel's time goes: its stage ablations timed in one run (issue 29).

``chunk_kkt_inverse_mosaic`` (``pallas_kernels/gated_delta_rule/kernel_mosaic_gpu.py``) takes
0.183 ms at S1 on the H200 against jla's 0.097 (2026-12-04), and replacing six of its
dependent ``wgmma`` rounds by an fp32 substitution saved only 0.003 ms (2026-12-04b), so the
cost is not where MOSAIC_GPU.md Sec. 13 estimated it. This binary times the kernel's
``stages`` ablations (``kernel_mosaic_gpu.KKT_STAGES``: ``io`` loads and stores only,
``gram`` adds ``K K^T`` and the ``A0`` masks, ``no_refine`` adds the inverse, ``full`` the
Newton step), each with the same grid, TMA ring, SMEM and output store, so the differences
between consecutive stages are the time of each part of the work (MOSAIC_GPU.md Sec. 14).
Two more do all of ``full``'s work: ``nobar`` without Pallas's automatic warpgroup barriers
around each register -> SMEM store (``unsafe_no_auto_barriers``; it should still return
``T0``, and is checked like ``full``), ``no_store`` with the TMA store of each CTA's last
chunk only; the table gives every variant's difference to the ``full`` of its inverse too.
An inverse may name the kernel's ``refine`` after a ``+`` (``kernel_mosaic_gpu.KKT_REFINES``;
default ``newton``): ``full:substitution+split_merge`` is the substitution with hi/lo split
merges and no Newton step (MOSAIC_GPU.md Sec. 15), checked like ``full`` and compared with
``full:substitution`` in the "delta vs full" column.

Each variant ``<stages>:<inverse>[+<refine>][:<chunks per CTA>]`` is jitted, compiled, run
once, then traced over ``--iters`` calls with ``jax.profiler``
(``benchmarks.common.trace_events``, the same kernel timing as ``bench_kernels.py``); its
record has the ``T0`` kernel's own device time (the kernel named ``gdn_chunk_kkt_inverse*``),
the call's total (XLA's padding and transposes too) and an estimate of cycles per chunk,
``kernel time x clock x CTA slots / chunk-heads`` (``--sm_count`` x ``--ctas_per_sm`` slots
at ``--clock_ghz``, default the 1.98 GHz boost clock; ``nvidia-smi``'s clock after each trace
is recorded beside it but not used: between calls it can already show the idle clock; the
kernel keeps two CTAs per SM at K 128). The ``full`` and ``nobar`` variants (of any inverse
and refine) are checked against a float64 inverse on the first batch row (relative RMS of
``T0 - I`` on the first ``--check_heads`` heads), so a broken build shows.
A variant that does not fit what is left of ``--deadline_s`` (its estimate: the slowest
finished variant's wall time) is skipped and reported as such; and if one variant is still
compiling or running when ``--deadline_s`` is up (a slow compile), a watchdog writes the
table of what finished, with that variant marked, and exits (status 3), so the call keeps
its results.

Outputs: ``<out>.jsonl`` (one record per variant, appended as each finishes) and ``<out>.md``
(the table, with each stage's difference to the one before it). Usage, on the GPU machine::

    python3 benchmarks/profile_t0.py --out=$OUT/t0_stages
    python3 benchmarks/profile_t0.py --variants=io:doubling,full:doubling \
        --chunks_per_cta=8,4,1 --out=$OUT/t0_cpc

Without a GPU (CPU) the kernels cannot run; ``--interpret`` runs them in Mosaic GPU interpret
mode at a tiny shape, to check the binary itself (no kernel times: the CPU trace has none).
``--static`` (CPU, jax 0.10.2, seconds) times nothing: it exports each variant for CUDA and
counts, in the serialized Mosaic GPU module (before LLVM, so an upper bound on what ptxas
keeps; the chunk loop's body appears once, so per chunk but for the prologue's copies and the
final wait), the synchronisation and tensor-core instructions: warpgroup barriers
(``bar.sync``), ``wgmma``, ``wgmma.wait_group``, async-proxy fences (``commit_smem``), TMA
loads and stores, SMEM loads and stores from registers, and all non-constant ops::

    JAX_PLATFORMS=cpu python benchmarks/profile_t0.py --static --out=/tmp/t0_static
"""

import json
import os
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

from absl import app, flags

if __name__ == "__main__":  # python benchmarks/profile_t0.py from the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DEFAULT_VARIANTS = ("io:doubling", "gram:doubling", "no_refine:doubling", "full:doubling",
                    "nobar:doubling", "no_store:doubling", "no_refine:substitution",
                    "full:substitution", "nobar:substitution", "full:substitution+split_merge",
                    "nobar:substitution+split_merge")


def _define_flags() -> None:
    """Defines the flags (only when run as a program: ``bench_kernels.py`` defines some of
    the same names in absl's global registry, and the tests import both modules)."""
    global _BATCH, _SEQ_LEN, _HEADS, _KV_HEADS, _DK, _DTYPE
    global _DOCS, _VARIANTS, _CHUNKS_PER_CTA, _ITERS, _CHECK_HEADS, _SM_COUNT
    global _CTAS_PER_SM, _CLOCK_GHZ, _DEADLINE_S, _INTERPRET, _STATIC, _OUT
    from benchmarks import common
    shared = common.define_profile_flags(
        heads_help="Value heads H.", dtype_help="k's dtype.", variants_default=DEFAULT_VARIANTS,
        variants_help="Variants <stages>:<inverse>[+<refine>][:<chunks per CTA>] (stages in "
                      "KKT_STAGES, inverse in KKT_INVERSES, refine in KKT_REFINES, default "
                      "newton; chunks per CTA default: --chunks_per_cta, else the kernel's "
                      "rule).",
        check_heads_help="Heads of batch row 0 checked against float64 for the full variants "
                         "(0: no check).", dv=False,
        iters_help="Traced calls per variant (0: no trace, e.g. under ncu, whose counters and "
                   "jax.profiler's do not mix).",
        static_help="Count instructions in the lowered modules (CPU; no kernel runs; see the "
                    "module docstring).")
    flags.adopt_module_key_flags(common)  # in --help with this binary's own
    (_BATCH, _SEQ_LEN, _HEADS, _DK, _DTYPE, _VARIANTS, _ITERS, _CHECK_HEADS, _DEADLINE_S,
     _INTERPRET, _STATIC, _OUT) = shared.holders()
    _KV_HEADS = flags.DEFINE_integer("kv_heads", 16, "Key heads Hk (H % Hk == 0).")
    _DOCS = flags.DEFINE_integer("doc_len", 0, "If > 0, documents of this many tokens "
                                 "(segment_ids); 0: one document per row.")
    _CHUNKS_PER_CTA = flags.DEFINE_list(
        "chunks_per_cta", [], "Chunks per CTA for each variant that names none: the variant is "
        "run once per value (in this order); empty: once, with the kernel's rule.")
    _SM_COUNT = flags.DEFINE_integer("sm_count", 132, "SMs, for the cycles estimate.")
    _CTAS_PER_SM = flags.DEFINE_integer("ctas_per_sm", 2, "Resident CTAs per SM, for the cycles "
                                        "estimate.")
    _CLOCK_GHZ = flags.DEFINE_float(
        "clock_ghz", None, "SM clock (GHz) for the cycles estimate; default 1.98 (the boost "
        "clock; nvidia-smi's clocks.sm after each trace is recorded as sm_clock_smi).")


KERNEL_PREFIX = "gdn_chunk_kkt_inverse"
DEFAULT_CLOCK_GHZ = 1.98  # the H200's boost clock (nvidia-smi clocks.max.sm 1980 MHz)
CHECKED_STAGES = ("full", "nobar")  # the stages whose output is T0
DEADLINE_EXIT = 3  # exit status when the watchdog ends a run at --deadline_s


class VariantError(ValueError):
    """A ``--variants`` entry that is not ``<stages>:<inverse>[+<refine>][:<chunks per
    CTA>]``."""


def kernel_options(inverse: str) -> Dict[str, str]:
    """``chunk_kkt_inverse_mosaic``'s keyword arguments for a variant's inverse field:
    ``"substitution+split_merge"`` -> ``{"inverse": "substitution", "refine": "split_merge"}``,
    ``"doubling"`` -> ``{"inverse": "doubling", "refine": "newton"}``: without ``+`` the
    Newton step, as the variant names of the 12-04b/c tables meant (the kernel's own default
    became ``split_merge`` for the substitution on 2026-12-04d). No checks
    (:func:`parse_variant` makes them)."""
    base, _, refine = inverse.partition("+")
    return dict(inverse=base, refine=refine or "newton")


def parse_variant(text: str) -> Tuple[str, str, Optional[int]]:
    """``"gram:doubling:4"`` -> ``("gram", "doubling", 4)``; chunks per CTA ``None`` if absent.
    The inverse field may carry a ``refine`` (``"full:substitution+split_merge"`` ->
    ``("full", "substitution+split_merge", None)``; :func:`kernel_options` splits it).

    Raises:
      VariantError: naming the entry and what is wrong with it (an unknown stage, inverse or
        refine, ``split_merge`` with an inverse other than ``substitution``, a bad chunks per
        CTA).
    """
    from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu as kgd
    parts = text.strip().split(":")
    if len(parts) not in (2, 3):
        raise VariantError(f"--variants entry {text!r}: expected <stages>:<inverse>[+<refine>]"
                           "[:<chunks per CTA>]")
    stages, inverse = parts[0], parts[1]
    if stages not in kgd.KKT_STAGES:
        raise VariantError(f"--variants entry {text!r}: stages {stages!r} not in "
                           f"{kgd.KKT_STAGES}")
    options = kernel_options(inverse)
    if options["inverse"] not in kgd.KKT_INVERSES:
        raise VariantError(f"--variants entry {text!r}: inverse {options['inverse']!r} not in "
                           f"{kgd.KKT_INVERSES}")
    refine = options["refine"]
    if refine not in kgd.KKT_REFINES:
        raise VariantError(f"--variants entry {text!r}: refine {refine!r} not in "
                           f"{kgd.KKT_REFINES}")
    if refine == "split_merge" and options["inverse"] != "substitution":
        raise VariantError(f"--variants entry {text!r}: refine 'split_merge' needs inverse "
                           "'substitution'")
    cpc = None
    if len(parts) == 3:
        try:
            cpc = int(parts[2])
        except ValueError:
            cpc = 0
        if cpc < 1:
            raise VariantError(f"--variants entry {text!r}: chunks per CTA must be an int >= 1")
    return stages, inverse, cpc


def expand_variants(texts: Sequence[str], chunks_per_cta: Sequence[str]
                    ) -> List[Tuple[str, str, str, Optional[int]]]:
    """``(label, stages, inverse, chunks per CTA)`` per run: each entry of ``texts`` (see
    :func:`parse_variant`) once per value of ``chunks_per_cta`` unless it names its own
    (label ``<stages>:<inverse>:<cpc>`` then), once with the kernel's rule if that is empty.

    Raises:
      VariantError: on a malformed entry, or a ``chunks_per_cta`` value that is not an
        int >= 1.
    """
    cpcs: List[Optional[int]] = []
    for item in chunks_per_cta:
        try:
            value = int(item)
        except ValueError:
            value = 0
        if value < 1:
            raise VariantError(f"--chunks_per_cta entry {item!r}: must be an int >= 1")
        cpcs.append(value)
    runs = []
    for text in texts:
        stages, inverse, cpc = parse_variant(text)
        label = text.strip()
        if cpc is not None or not cpcs:
            runs.append((label, stages, inverse, cpc))
        else:
            runs.extend((f"{label}:{v}", stages, inverse, v) for v in cpcs)
    return runs


# What --static counts in the Mosaic GPU module (generic MLIR form, ops prefixed with
# "stable_mosaic_gpu."): name -> regex.
STATIC_PATTERNS = {
    "bar_sync": r"bar\.sync \$0, 128;",
    "wgmma": r"wgmma\.mma_async",
    "wgmma_wait": r"nvvm\.wgmma\.wait\.group",
    "fence_proxy": r"nvvm\.fence\.proxy",
    "tma_load": r"cp\.async\.bulk\.tensor\.shared\.cluster\.global",
    "tma_store": r"cp\.async\.bulk\.tensor\.global\.shared",
    "mbarrier_wait": r"nvvm\.mbarrier\.try_wait",
    "llvm_store": r"\"stable_mosaic_gpu\.llvm\.store\"",
    "llvm_load": r"\"stable_mosaic_gpu\.llvm\.load\"",
}


def mosaic_module_text(exported_mlir: str) -> str:
    """The Mosaic GPU kernel module (generic MLIR text) of the one ``mosaic_gpu_v2`` custom
    call in ``exported_mlir`` (``jax.export``'s ``mlir_module()`` for CUDA).

    Raises:
      ValueError: if there is not exactly one such custom call.
    """
    from jax._src.interpreters import mlir as jax_mlir
    from jax._src.lib import mosaic_gpu_dialect
    from jax._src.lib.mlir import ir
    ctx = jax_mlir.make_ir_context()
    mosaic_gpu_dialect.register_dialect(ctx)
    ctx.allow_unregistered_dialects = True
    with ctx:
        module = ir.Module.parse(exported_mlir)
        blobs = []

        def walk(op):
            if op.operation.name == "stablehlo.custom_call" and "mosaic_gpu" in str(
                    op.operation.attributes["call_target_name"]):
                blobs.append(ir.DictAttr(op.operation.attributes["mhlo.backend_config"]))
            for region in op.operation.regions:
                for block in region.blocks:
                    for inner in block.operations:
                        walk(inner)

        walk(module)
        if len(blobs) != 1:
            raise ValueError(f"expected one mosaic_gpu custom call, found {len(blobs)}")
        raw = ir.StringAttr(blobs[0]["module"]).value_bytes
        return str(ir.Module.parse(raw))


def static_counts(module_text: str) -> Dict[str, int]:
    """Counts of :data:`STATIC_PATTERNS` in a Mosaic GPU module's text, plus ``ops``: its
    operations other than constants."""
    import re
    counts = {name: len(re.findall(pat, module_text)) for name, pat in STATIC_PATTERNS.items()}
    ops = re.findall(r'"stable_mosaic_gpu\.([a-z_]+\.[a-z_.0-9]+)"', module_text)
    counts["ops"] = sum(1 for op in ops if not op.endswith("constant"))
    return counts


def render_static(records: Sequence[Dict], header: str) -> str:
    """The markdown table of ``--static`` records (one column per count)."""
    names = list(STATIC_PATTERNS) + ["ops"]
    lines = [header, "", "| variant | " + " | ".join(names) + " |",
             "|---|" + "---:|" * len(names)]
    for r in records:
        lines.append(f"| {r['variant']} | " + " | ".join(str(r["static"][n]) for n in names)
                     + " |")
    return "\n".join(lines) + "\n"


def write_static(records: Sequence[Dict], header: str, out: str) -> None:
    """Writes ``--static`` records to ``<out>.jsonl`` and their table (:func:`render_static`)
    to ``<out>.md``, and prints the table."""
    with open(out + ".jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    text = render_static(records, header)
    with open(out + ".md", "w") as f:
        f.write(text)
    print(text)


def cycles_per_chunk(kernel_ms: float, chunk_heads: int, *, sm_count: int, ctas_per_sm: int,
                     clock_ghz: float) -> float:
    """Estimated SM cycles one CTA spends per chunk: ``kernel_ms`` of ``chunk_heads`` chunks
    spread over ``sm_count x ctas_per_sm`` concurrent CTA slots at ``clock_ghz``."""
    return kernel_ms * 1e-3 * clock_ghz * 1e9 * sm_count * ctas_per_sm / chunk_heads


def t0_float64(k, beta, segment_ids, heads: int):
    """float64 ``T0 = (I + A0)^{-1}`` of batch row 0, heads ``[0, heads)``: ``[T, heads, 64]``
    laid out as the kernel's output (row ``t`` holds ``T0[t, :]`` of ``t``'s chunk)."""
    import numpy as np
    chunk = 64
    k = np.asarray(k, np.float64)[0]  # [T, Hk, K]
    beta = np.asarray(beta, np.float64)[0]  # [T, H]
    seg = np.zeros(k.shape[0], np.int64) if segment_ids is None else np.asarray(segment_ids)[0]
    group = beta.shape[1] // k.shape[1]
    out = np.zeros((k.shape[0], heads, chunk))
    for h in range(heads):
        for c0 in range(0, k.shape[0], chunk):
            rows = slice(c0, min(c0 + chunk, k.shape[0]))
            kc, bc, sc = k[rows, h // group], beta[rows, h], seg[rows]
            n = kc.shape[0]
            a0 = np.tril(bc[:, None] * (kc @ kc.T), -1) * (sc[:, None] == sc[None, :])
            out[rows, h, :n] = np.linalg.inv(np.eye(n) + a0)
    return out


def relative_rms(got, want) -> float:
    """``rms(got - want) / rms(want - I)`` over ``[T, heads, 64]`` (the kernel gate's
    measure, relative to the off-diagonal part)."""
    import numpy as np
    eye = np.zeros_like(want)
    t = np.arange(want.shape[0])
    eye[t, :, t % 64] = 1.0
    return float(np.sqrt(np.mean((got - want) ** 2)) / np.sqrt(np.mean((want - eye) ** 2)))


def render(records: Sequence[Dict], header: str) -> str:
    """The markdown table of ``records`` (kernel ms, its difference to the previous record and
    to the ``full`` record of the same inverse (with the default ``refine``: a
    ``substitution+split_merge`` variant is compared with ``full:substitution``) and chunks per
    CTA, total ms, cycles per chunk, the checked variants' error, compile s)."""
    lines = [header, "", "| variant | T0 kernel ms | delta vs previous | delta vs full | "
             "call total ms | cycles per chunk (est.) | rel. RMS vs float64 | compile s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]

    def is_ref(r):  # the full kernel with the default refine
        return r.get("stages") == "full" and "+" not in (r.get("inverse") or "")

    full = {(r.get("inverse"), r.get("chunks_per_cta")): r["kernel_ms"] for r in records
            if is_ref(r) and r.get("kernel_ms") is not None}
    prev = None

    def f(x, spec=".3f"):
        return "–" if x is None else format(x, spec)

    for r in records:
        if r.get("skipped") or r.get("error"):
            why = f"skipped: {r['skipped']}" if r.get("skipped") else f"failed: {r['error']}"
            lines.append(f"| {r['variant']} | {why} | | | | | | |")
            continue
        delta = (None if prev is None or r.get("kernel_ms") is None
                 else r["kernel_ms"] - prev)
        ref = full.get(((r.get("inverse") or "").partition("+")[0], r.get("chunks_per_cta")))
        vs_full = (None if ref is None or r.get("kernel_ms") is None or is_ref(r)
                   else r["kernel_ms"] - ref)
        lines.append(f"| {r['variant']} | {f(r.get('kernel_ms'))} | "
                     f"{'–' if delta is None else format(delta, '+.3f')} | "
                     f"{'–' if vs_full is None else format(vs_full, '+.3f')} | "
                     f"{f(r.get('total_ms'))} | {f(r.get('cycles_per_chunk'), ',.0f')} | "
                     f"{f(r.get('rel_rms'), '.3e')} | {f(r.get('compile_s'), '.1f')} |")
        prev = r.get("kernel_ms", prev)
    return "\n".join(lines) + "\n"


def _inputs(batch, seq_len, heads, kv_heads, dk, dtype, doc_len, seed=0):
    import jax.numpy as jnp
    import numpy as np
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((batch, seq_len, kv_heads, dk)).astype(np.float32)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)  # the kernel's contract: L2-normalised keys
    beta = rng.uniform(0.0, 1.0, (batch, seq_len, heads)).astype(np.float32)
    seg = None
    if doc_len > 0:
        seg = jnp.asarray(np.broadcast_to(np.arange(seq_len) // doc_len, (batch, seq_len)),
                          jnp.int32)
    return jnp.asarray(k, dtype), jnp.asarray(beta), seg


def _header(env: Dict, dk: int) -> str:
    return (f"# T0 kernel stage ablations, {env['date_utc']}\n\n"
            f"Device: {env['device_kind']} ({env['nvidia_smi']}); jax {env['jax']}.\n"
            f"Command: `{env['command']}`\n\n"
            f"Shape B {_BATCH.value}, T {_SEQ_LEN.value}, H {_HEADS.value}, "
            f"Hk {_KV_HEADS.value}, K {dk}, {_DTYPE.value}, "
            f"{'documents of ' + str(_DOCS.value) if _DOCS.value else 'one document per row'}"
            f"; {_ITERS.value} traced calls per variant; cycles per chunk over "
            f"{_SM_COUNT.value} x {_CTAS_PER_SM.value} CTA slots at "
            f"{_CLOCK_GHZ.value or DEFAULT_CLOCK_GHZ} GHz.")


def _measure(rec: Dict, want, stages: str, inverse: str, cpc: Optional[int], k, beta, seg,
             chunk_heads: int):
    """Compiles, runs, checks (``want``: the float64 ``T0`` once computed, else ``None``) and
    traces one variant, filling ``rec``; returns ``want``."""
    import jax
    import numpy as np
    from benchmarks import common
    from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu as kgd
    t0 = time.perf_counter()
    fn = jax.jit(lambda k, b, s, stages=stages, options=kernel_options(inverse), cpc=cpc:
                 kgd.chunk_kkt_inverse_mosaic(k, b, segment_ids=s, chunks_per_cta=cpc,
                                              stages=stages, interpret=_INTERPRET.value,
                                              **options))
    compiled = fn.lower(k, beta, seg).compile()
    rec["compile_s"] = time.perf_counter() - t0
    out = jax.block_until_ready(compiled(k, beta, seg))
    if stages in CHECKED_STAGES and _CHECK_HEADS.value > 0:
        heads = min(_CHECK_HEADS.value, _HEADS.value)
        if want is None:
            want = t0_float64(np.asarray(k.astype(np.float32)), beta, seg, heads)
        got = np.asarray(out[0, :, :heads].astype(np.float32), np.float64)
        rec["rel_rms"] = relative_rms(got, want)
    if _ITERS.value <= 0:
        return want
    events = common.trace_events(lambda: compiled(k, beta, seg), _ITERS.value)
    kernels = common.device_kernel_events(events)
    own = sum(d for name, _, d in kernels if name.startswith(KERNEL_PREFIX))
    total = sum(d for _, _, d in kernels)
    if total > 0:
        smi = common.nvidia_smi("clocks.sm")
        rec["sm_clock_smi"] = smi
        # The boost clock unless --clock_ghz says otherwise: nvidia-smi read after the trace
        # may already show the idle clock (2026-12-04b read 345 MHz between calls), a 6x error.
        clock = _CLOCK_GHZ.value or DEFAULT_CLOCK_GHZ
        rec["clock_ghz"] = clock
        rec["kernel_ms"] = own / 1e3 / _ITERS.value
        rec["total_ms"] = total / 1e3 / _ITERS.value
        rec["kernel_names"] = sorted({n for n, _, _ in kernels
                                      if n.startswith(KERNEL_PREFIX)})
        rec["cycles_per_chunk"] = cycles_per_chunk(
            rec["kernel_ms"], chunk_heads, sm_count=_SM_COUNT.value,
            ctas_per_sm=_CTAS_PER_SM.value, clock_ghz=clock)
    return want


def _static_main(variants, k, beta, seg, env: Dict, dk: int) -> None:
    import jax
    from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu as kgd
    records = []
    for text, stages, inverse, cpc in variants:
        fn = jax.jit(lambda k, b, s, stages=stages, options=kernel_options(inverse), cpc=cpc:
                     kgd.chunk_kkt_inverse_mosaic(k, b, segment_ids=s, chunks_per_cta=cpc,
                                                  stages=stages, **options))
        exported = jax.export.export(fn, platforms=["cuda"])(k, beta, seg)
        records.append(dict(variant=text, stages=stages, inverse=inverse, chunks_per_cta=cpc,
                            dk=dk, jax=env["jax"],
                            static=static_counts(mosaic_module_text(exported.mlir_module()))))
        print(json.dumps(records[-1]), flush=True)
    header = (f"# T0 kernel: instructions in the lowered Mosaic GPU modules (static, "
              f"{env['date_utc']})\n\nK {dk}, {_DTYPE.value}, jax {env['jax']}; one chunk-loop "
              f"body per module, plus the first chunk's copies (4 bar.sync, 4 TMA loads) and "
              f"the final wait (1 bar.sync).")
    write_static(records, header, _OUT.value)


def main(argv: List[str]) -> None:
    del argv
    start = time.perf_counter()  # --deadline_s counts from here (imports included)
    from benchmarks import common
    from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu as kgd

    try:
        variants = expand_variants(_VARIANTS.value, _CHUNKS_PER_CTA.value)
    except VariantError as e:
        raise app.UsageError(str(e)) from None
    if _HEADS.value % _KV_HEADS.value:
        raise app.UsageError(f"--heads={_HEADS.value} must be a multiple of "
                             f"--kv_heads={_KV_HEADS.value}")
    dk = int(_DK.value)
    k, beta, seg = _inputs(_BATCH.value, _SEQ_LEN.value, _HEADS.value, _KV_HEADS.value, dk,
                           _DTYPE.value, _DOCS.value)
    chunk_heads = _BATCH.value * _HEADS.value * -(-_SEQ_LEN.value // kgd.CHUNK)
    env = common.environment()
    header = _header(env, dk)
    if _STATIC.value:
        _static_main(variants, k, beta, seg, env, dk)
        return
    variants = [
        (dict(variant=text, stages=stages, inverse=inverse, chunks_per_cta=cpc,
              bthk=[_BATCH.value, _SEQ_LEN.value, _HEADS.value, _KV_HEADS.value, dk],
              dtype=_DTYPE.value, doc_len=_DOCS.value, date_utc=env["date_utc"],
              device=env["device_kind"], jax=env["jax"]),
         (stages, inverse, cpc, k, beta, seg, chunk_heads))
        for text, stages, inverse, cpc in variants]
    common.run_profile(_OUT.value, variants, _measure,
                       render=lambda recs: render(recs, header),
                       deadline_s=_DEADLINE_S.value, start=start, deadline_exit=DEADLINE_EXIT)


if __name__ == "__main__":
    _define_flags()
    from lattn_jax import flag_errors  # one-line flag errors (absl only)
    app.run(main, flags_parser=flag_errors.parse_flags)
