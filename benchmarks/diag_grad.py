r"""Where K1 and K2 go wrong: the compiled kernels against float64 on probe inputs (issue 29).

K1 (``channelwise_grad_intra_mosaic``) and K2 (``channelwise_grad_chunk_mosaic``) pass every
interpreted test on CPU and were wrong on the H100 (MOSAIC_GPU.md Sec. 41). This binary runs
each ``--variants`` entry (``profile_grad.py``'s syntax: ``k1``, ``k2``, ``k1:no_band``, ...)
at each of ``--slabs`` on a set of probe inputs at one small shape (default B 2, T 256, H 2,
K = V = 128, bf16, a per-token ``ks``, one document per row). Every variant is compiled once;
the probes are only new inputs. Each output is compared with the float64 evaluation of the
kernel's equations (``profile_grad.grad_float64``; for ``no_band`` the same with the band's
pairs ``1 <= i - j <= 7`` removed, which is what that ablation computes; the other timing
ablations have no reference and are refused). K1's diagnostic taps (``k1:tap_inputs``,
``k1:tap_factors``, ``k1:tap_band``, ``k1:tap_dm``; ``channelwise_grad_mosaic_gpu.K1_TAPS``)
write phase-2 values instead of gradients; they are compared with NumPy formulas of the same
values (:func:`tap_reference`): the k and gamma tiles and each row's block-end gamma as
loaded; the decay factors; the band's shifted k, band factor and coefficients; phase 1's
16-bit copies of ``dM`` (band-free ``dMq``, quadrant ``dMq``, band-free ``dMk``) as phase 2
loads them.

The probes (``--probes``; all use a chunk of 64 tokens and 16-row blocks as the kernels do):

* ``random``: ``profile_grad.py``'s inputs (log-decays in ``[-0.1, 0]`` per token);
* ``nodecay``: the same with gamma = 0 (every decay factor is 1: a wrong gamma read or a wrong
  exponent sign cannot show; the products, masks and coefficients still can);
* ``kda``: ``bench_kernels.py``'s gates (``logsigmoid(N(0, 1))`` per token and channel);
* ``diag``, ``band``, ``past``, ``quad``: one route of the kernels' split each (the pairs
  ``i = j``; ``1 <= i - j <= 7``; other 16-row block and ``i - j >= 8``; same block and
  ``i - j >= 8``): ``Vn`` one-hot (``Vn[t] = e_{t mod 64}``), so ``dMq = scale dO[:, :64]``
  and ``dMk = -dR[:, :64]`` (masked), with ``dO``, ``dR`` zero off the route's pairs and no
  state terms (``S_0 = dS_C = 0``); mild decays as ``random``;
* ``band0``, ``past0``, ``quad0``: the same routes with gamma = 0 (a route that fails with
  decays and passes without them points at its decay factors, not at its products);
* ``dmq`` (``dR = 0``: only ``dMq``, phase 1 of warpgroup 0) and ``dmk`` (``dO = 0``);
* ``state``: ``Vn = 0``, so ``dM = 0`` and only K2's epilogue (state terms, ``dg``) is left
  (K1's reference is 0: its absolute error is printed).

Interpret mode runs a warpgroup as one thread and reads SMEM as plain arrays, so it cannot
show what these runs look for (fences, swizzles, layouts); on CPU it checks this binary and
its references (every variant passes there).

Per variant and probe one line ``diag <variant> <probe> PASS|FAIL`` with each output's relative
RMS and its count of non-finite values; per failing output a line ``  at`` with where the error
is: the rows of the 64-row chunk above ``--tol`` (relative RMS per row), the RMS per 16-row
block, per key channel group of 16 (K = 128: half 0 / 1, warpgroup 0 / 1, slab 0 / 1), per
chunk, head and batch row, the worst element (b, t, h, c, got, want) and, for the full and
``no_band`` variants, ``expl``: the best of "route r missing / doubled / negated" (the
reference with route r's share removed, added again, or subtracted twice) where it explains the
error at least 10x better than the reference. Records: ``<out>.jsonl``. Usage, on the GPU::

    python3 benchmarks/diag_grad.py --out=$OUT/cw_diag/diag

On CPU ``--interpret`` runs the same path in Mosaic GPU interpret mode (tiny shape)::

    PJRT_NPROC=8 JAX_PLATFORMS=cpu python benchmarks/diag_grad.py --interpret --batch=1 \
        --seq_len=64 --heads=1 --dk=64 --dv=64 --probes=random,band --variants=k1,k2 \
        --slabs=16 --out=/tmp/diag
"""

import json
import os
import sys
import time
from typing import Dict, List, Sequence

from absl import app, flags

if __name__ == "__main__":  # python benchmarks/diag_grad.py from the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

CHUNK, SUB, HALF = 64, 16, 8
NSUB = CHUNK // SUB
PROBES = ("random", "nodecay", "kda", "diag", "band", "past", "quad", "band0", "past0",
          "quad0", "dmq", "dmk", "state")
ROUTE_PROBES = ("diag", "band", "past", "quad", "band0", "past0", "quad0")
DEFAULT_VARIANTS = ("k1", "k2", "k1:tap_inputs", "k1:tap_factors", "k1:tap_band", "k1:tap_dm",
                    "k1:no_band", "k2:no_band")
# K1's diagnostic taps (channelwise_grad_mosaic_gpu.K1_TAPS): the names of their three outputs.
TAP_OUTPUTS = {"tap_inputs": ("k", "gamma", "r_end"),
               "tap_factors": ("to_end", "halfway", "past"),
               "tap_band": ("k_shift", "band_exp", "coef"),
               "tap_dm": ("free_q", "quad_q", "free_k")}
# Ablations with a float64 reference (pairs removed): no_band keeps d = 0 and the far pairs.
REFERENCED = {(): None, ("no_band",): "no_band"}
COMPILE_EST_S = 12.0  # a variant's compile plus its probes on the GPU (about 4-6 s compile)


def route_masks() -> Dict[str, np.ndarray]:
    """The four routes of the kernels' split as ``[64, 64]`` 0/1 pair masks (``i`` row, ``j``
    column); together they are ``j <= i``."""
    i, j = np.indices((CHUNK, CHUNK))
    same = (i // SUB) == (j // SUB)
    return {"diag": (i == j) * 1.0, "band": ((i - j >= 1) & (i - j < HALF)) * 1.0,
            "past": (~same & (i - j >= HALF)) * 1.0, "quad": (same & (i - j >= HALF)) * 1.0}


def make_probe(name: str, shapes: Dict, seed: int = 0) -> List[np.ndarray]:
    """The probe's inputs ``(q, k, kr, ks, gamma, hs, dhs, do, vn, dr)`` as float64 NumPy
    arrays (module docstring); the caller rounds them to the operand dtype."""
    if name not in PROBES:
        raise ValueError(f"probe {name!r} not in {PROBES}")
    rng = np.random.default_rng(seed)
    b, t, h, dk = shapes["tk"]
    dv = shapes["tv"][-1]
    q = rng.standard_normal(shapes["tk"])
    k = rng.standard_normal(shapes["tk"])
    k = k / np.linalg.norm(k, axis=-1, keepdims=True)
    ks = rng.uniform(size=shapes["ks"])
    if name == "kda":
        x = rng.standard_normal(shapes["tk"])
        g = -np.logaddexp(0.0, -x)  # logsigmoid
    else:
        g = -0.1 * rng.uniform(size=shapes["tk"])
    if name == "nodecay" or name.endswith("0"):
        g = np.zeros_like(g)
    gamma = np.cumsum(g.reshape(b, t // CHUNK, CHUNK, h, dk), axis=2).reshape(shapes["tk"])
    hs, dhs = (0.1 * rng.standard_normal(shapes["hs"]) for _ in range(2))
    do, vn, dr = (rng.standard_normal(shapes["tv"]) for _ in range(3))
    if name in ROUTE_PROBES:
        mask = route_masks()[name.rstrip("0")]
        vn = np.zeros(shapes["tv"])
        rows = np.arange(t) % CHUNK
        vn[:, np.arange(t), :, rows] = 1.0  # Vn[t] = e_{t mod 64} (t first after the index)
        keep = np.zeros((t, dv))
        keep[:, :CHUNK] = mask[rows]
        do, dr = do * keep[None, :, None, :], dr * keep[None, :, None, :]
        hs, dhs = np.zeros_like(hs), np.zeros_like(dhs)
    if name == "dmq":
        dr = np.zeros_like(dr)
    if name == "dmk":
        do = np.zeros_like(do)
    if name == "state":
        vn = np.zeros_like(vn)
    return [q, k, k * ks, ks, gamma, hs, dhs, do, vn, dr]


def reference(host: Sequence[np.ndarray], scale: float, pair_mask=None) -> Dict[str, np.ndarray]:
    """``profile_grad.grad_float64`` over every batch row and head: ``[B, T, H, C]`` each."""
    from benchmarks import profile_grad
    heads = host[0].shape[2]
    rows = [profile_grad.grad_float64(*(x[r] for x in host), scale=scale, heads=heads,
                                      pair_mask=pair_mask) for r in range(host[0].shape[0])]
    return {n: np.stack([r[n] for r in rows]) for n in rows[0]}


def tap_reference(tap: str, host: Sequence[np.ndarray], scale: float,
                  dtype: str = "bfloat16") -> Dict[str, np.ndarray]:
    """float64 values of K1's tap ``tap`` (``[B, T, H, K]`` each, keyed by
    :data:`TAP_OUTPUTS`): what phase 2 should have read or formed (the kernel's equations;
    ``tap_dm``'s copies rounded to the operand ``dtype``)."""
    q, k, kr, ks, gamma, hs, dhs, do, vn, dr = host
    b, t, h, c = k.shape
    n = t // CHUNK
    g = gamma.reshape(b, n, CHUNK, h, c)
    kk = k.reshape(b, n, CHUNK, h, c)
    rows = np.arange(CHUNK)
    blk, second = rows // SUB, (rows % SUB >= HALF)[None, None, :, None, None]
    ends, mids = g[:, :, SUB * blk + SUB - 1], g[:, :, SUB * blk + HALF - 1]
    if tap == "tap_dm":
        import jax.numpy as jnp
        i, j = np.indices((CHUNK, CHUNK))
        dm = [f * np.einsum("bnihv,bnjhv->bnhij", x.reshape(b, n, CHUNK, h, -1),
                            vn.reshape(b, n, CHUNK, h, -1)) * keep
              for f, x, keep in ((scale, do, i >= j), (-1.0, dr, i > j))]
        quad = ((i // SUB == j // SUB) & (i % SUB >= HALF) & (j % SUB < HALF)) * (i - j >= HALF)
        mats = [np.where(i - j >= HALF, dm[0], 0.0), np.where(quad, dm[0], 0.0),
                np.where(i - j >= HALF, dm[1], 0.0)]
        cols = np.arange(c) % CHUNK  # channel c of either key half reads column c mod 64
        vals = tuple(np.moveaxis(np.asarray(jnp.asarray(m, dtype).astype(jnp.float32),
                                            np.float64)[..., cols], 2, 3) for m in mats)
    elif tap == "tap_inputs":
        vals = (kk, g, ends)
    elif tap == "tap_factors":
        past = sum(np.where((blk > j)[None, None, :, None, None],
                            np.exp(np.minimum(g - g[:, :, SUB * j + SUB - 1][:, :, None], 0.0)),
                            0.0) for j in range(NSUB - 1))
        vals = (np.exp(ends - g), np.exp(np.where(second, g - mids, mids - g)), past)
    else:
        dmq = scale * np.einsum("bnihv,bnjhv->bnhij", do.reshape(b, n, CHUNK, h, -1),
                                vn.reshape(b, n, CHUNK, h, -1)) * np.tri(CHUNK)
        ksum, esum, csum = (np.zeros_like(g) for _ in range(3))
        for d in range(1, HALF):
            ksum[:, :, d:] += kk[:, :, :-d]
            esum[:, :, d:] += np.exp(g[:, :, d:] - g[:, :, :-d])
            row = np.diagonal(dmq, -d, axis1=3, axis2=4)  # dMq[i, i - d] at i - d: [b, n, h, 64-d]
            csum[:, :, d:] += np.moveaxis(row, 2, 3)[..., None]
            csum[:, :, :-d] -= np.moveaxis(row, 2, 3)[..., None]
        vals = (ksum, esum, csum)
    return {name: v.reshape(b, t, h, c) for name, v in zip(TAP_OUTPUTS[tap], vals)}


def _ranges(idx: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    out, start = [], None
    for a, b in zip(idx, list(idx[1:]) + [None]):
        start = a if start is None else start
        if b != a + 1:
            out.append(str(start) if start == a else f"{start}-{a}")
            start = None
    return ",".join(out) or "-"


def _rms(x, axes) -> np.ndarray:
    return np.sqrt(np.mean(x * x, axis=axes))


def locate(got: np.ndarray, want: np.ndarray, tol: float) -> Dict:
    """Where ``got - want`` (``[B, T, H, C]``) is: relative RMS per row of the chunk, per
    16-row block, per channel group of 16, per chunk, head and batch row; the worst element."""
    bsz, t, h, c = want.shape
    err = np.nan_to_num(got - want, nan=1e30, posinf=1e30, neginf=-1e30)
    scale = float(_rms(want, None)) or 1.0
    e = err.reshape(bsz, t // CHUNK, CHUNK, h, c) / scale
    row = _rms(e, (0, 1, 3, 4))
    groups = max(c // 16, 1)
    worst = np.unravel_index(int(np.argmax(np.abs(err))), err.shape)
    return dict(rows_over_tol=_ranges([int(r) for r in np.nonzero(row > tol)[0]]),
                by_block=[float(x) for x in _rms(e.reshape(bsz, -1, NSUB, SUB, h, c),
                                                 (0, 1, 3, 4, 5))],
                by_row16=[float(x) for x in _rms(e.reshape(bsz, -1, NSUB, SUB, h, c),
                                                 (0, 1, 2, 4, 5))],
                by_col16=[float(x) for x in _rms(e.reshape(bsz, -1, CHUNK, h, groups,
                                                           c // groups), (0, 1, 2, 3, 5))],
                by_chunk=[float(x) for x in _rms(e, (0, 2, 3, 4))],
                by_head=[float(x) for x in _rms(e, (0, 1, 2, 4))],
                by_batch=[float(x) for x in _rms(e, (1, 2, 3, 4))],
                worst=[int(x) for x in worst] + [float(got[worst]), float(want[worst])])


def explain(got, want, shares: Dict[str, np.ndarray]) -> str:
    """The best of "route r missing / doubled / negated" (``want - s``, ``want + s``, ``want -
    2 s`` for route r's share ``s``) if it explains ``got`` 10x better than ``want`` (RMS of
    the difference over ``want``'s RMS); else ``""``."""
    norm = float(np.sqrt(np.mean(want * want))) or 1.0
    diff = np.nan_to_num(got - want, nan=1e30, posinf=1e30, neginf=-1e30)
    base = float(np.sqrt(np.mean(diff * diff))) / norm
    best = (base, "")
    for route, s in shares.items():
        for label, factor in (("missing", -1.0), ("doubled", 1.0), ("negated", -2.0)):
            d = diff - factor * s
            r = float(np.sqrt(np.mean(d * d))) / norm
            if r < best[0]:
                best = (r, f"{route} {label} ({r:.1e})")
    return best[1] if best[0] * 10 < base else ""


def _fmt(xs) -> str:
    return "/".join(f"{x:.0e}" for x in xs)


def check(label: str, probe: str, checked, outs, want, shares, tol: float) -> Dict:
    """One record (relative RMS, non-finite counts, where) and its printed lines. ``checked``:
    ``(output name, reference key)`` per kernel output (``profile_grad.CHECKED``)."""
    from benchmarks import profile_grad
    rec = dict(variant=label, probe=probe, outputs={})
    bad = []
    for (name, ref), x in zip(checked, outs, strict=True):
        got = np.asarray(np.asarray(x, np.float32), np.float64)
        w = want[ref]
        nonfinite = int(np.sum(~np.isfinite(got)))
        ref_rms = float(np.sqrt(np.mean(w * w)))
        rel = (profile_grad.relative_rms(got, w) if ref_rms > 0
               else float(np.sqrt(np.mean(np.nan_to_num(got, nan=1e30) ** 2))))
        o = dict(rel_rms=rel, nonfinite=nonfinite, absolute=ref_rms == 0)
        if not (rel < tol) or nonfinite:
            bad.append(name)
            o.update(locate(got, w, tol))
            if shares is not None and ref_rms > 0:
                o["expl"] = explain(got, w, {r: s[ref] for r, s in shares.items()})
        rec["outputs"][name] = o
    rec["status"] = "FAIL" if bad else "PASS"
    print(f"diag {label} {probe} {rec['status']} " + " ".join(
        f"{n} {o['rel_rms']:.2e}{'(abs)' if o['absolute'] else ''} nf {o['nonfinite']}"
        for n, o in rec["outputs"].items()), flush=True)
    for n in bad:
        o = rec["outputs"][n]
        print(f"  at {label} {probe} {n}: rows>{tol:g} {o['rows_over_tol']} blk "
              f"{_fmt(o['by_block'])} r%16 {_fmt(o['by_row16'])} c/16 {_fmt(o['by_col16'])} "
              f"chunk {_fmt(o['by_chunk'])} head {_fmt(o['by_head'])} batch "
              f"{_fmt(o['by_batch'])} worst {o['worst'][:4]} got {o['worst'][4]:.3g} want "
              f"{o['worst'][5]:.3g} expl {o.get('expl') or '-'}", flush=True)
    return rec


def _define_flags() -> None:
    """The flags (only when run as a program: other benchmark modules share names)."""
    global _BATCH, _SEQ_LEN, _HEADS, _DK, _DV, _DTYPE, _VARIANTS, _SLABS, _PROBES, _TOL
    global _DEADLINE_S, _INTERPRET, _OUT
    _BATCH = flags.DEFINE_integer("batch", 2, "Batch rows B.")
    _SEQ_LEN = flags.DEFINE_integer("seq_len", 256, "Tokens per row T (a multiple of 64).")
    _HEADS = flags.DEFINE_integer("heads", 2, "Heads H.")
    _DK = flags.DEFINE_enum("dk", "128", ["64", "128"], "Key head dim K.")
    _DV = flags.DEFINE_enum("dv", "128", ["64", "128"], "Value head dim V.")
    _DTYPE = flags.DEFINE_enum("dtype", "bfloat16", ["bfloat16", "float16"], "Operand dtype.")
    _VARIANTS = flags.DEFINE_list("variants", list(DEFAULT_VARIANTS),
                                  "profile_grad.py variants (ablations: only no_band, the "
                                  "others have no reference) and K1's taps (k1:tap_inputs, "
                                  "k1:tap_factors, k1:tap_band, k1:tap_dm).")
    _SLABS = flags.DEFINE_list("slabs", ["16", "32"], "Phase-2 slabs each variant runs at.")
    _PROBES = flags.DEFINE_list("probes", list(PROBES), f"Probe inputs, of {PROBES}.")
    _TOL = flags.DEFINE_float("tol", 1e-2, "Relative RMS that fails an output (and a row).")
    _DEADLINE_S = flags.DEFINE_float("deadline_s", 175.0, "Skip what would end after this "
                                     "(seconds from the start, imports included).")
    _INTERPRET = flags.DEFINE_boolean("interpret", False, "Mosaic GPU interpret mode (CPU).")
    _OUT = flags.DEFINE_string("out", None, "Output prefix: <out>.jsonl.", required=True)


def selected(variants: Sequence[str], slabs: Sequence[str], probes: Sequence[str]):
    """``(runs, probes)``: ``(label, kernel, ablations, slab)`` per variant and slab
    (:func:`profile_grad.with_slabs`; ``k1:<tap>`` for K1's taps, :data:`TAP_OUTPUTS`), and
    the probes.

    Raises:
      profile_grad.VariantError: a bad variant or slab, an ablation without a reference, an
        unknown or repeated probe.
    """
    from benchmarks import profile_grad as pg
    parsed, seen = [], set()
    for text in variants:
        kernel, _, rest = text.strip().partition(":")
        if rest in TAP_OUTPUTS:
            if kernel != "k1":
                raise pg.VariantError(f"--variants entry {text!r}: taps are K1's")
            run = (text.strip(), kernel, (rest,))
        else:
            run = (text.strip(),) + pg.parse_variant(text)
            if tuple(run[2]) not in REFERENCED:
                raise pg.VariantError(f"--variants entry {text!r}: only {sorted(REFERENCED)} "
                                      f"and the taps {sorted(TAP_OUTPUTS)} have a reference")
        if run[1:] in seen:
            raise pg.VariantError(f"--variants entry {text!r}: the same variant twice")
        seen.add(run[1:])
        parsed.append(run)
    if not parsed:
        raise pg.VariantError("--variants is empty")
    runs = pg.with_slabs(parsed, pg.parse_slabs(slabs))
    probes = [p.strip() for p in probes]
    for p in probes:
        if p not in PROBES:
            raise pg.VariantError(f"--probes entry {p!r}: not one of {PROBES}")
    if len(set(probes)) != len(probes) or not probes:
        raise pg.VariantError(f"--probes must name each probe once: {probes}")
    return runs, probes


class _Probe:
    """A probe's device inputs and its float64 references (made when first needed)."""

    def __init__(self, name, shapes, dtype, scale):
        import jax.numpy as jnp
        host = make_probe(name, shapes)
        f32 = (3, 4)  # ks, gamma
        self.args = [jnp.asarray(x, jnp.float32 if n in f32 else dtype)
                     for n, x in enumerate(host)]
        # kr as the op and K2 form it: the operand-dtype k times ks in fp32, rounded once (K2
        # forms it from k and ks; K1 and the references read this one).
        self.args[2] = (self.args[1].astype(jnp.float32) * self.args[3]).astype(dtype)
        self.host = [np.asarray(np.asarray(x, np.float32), np.float64) for x in self.args]
        self.scale, self.refs = scale, {}

    def ref(self, mask_key):
        if mask_key not in self.refs:
            masks = route_masks()
            mask = {"all": None, "zero": np.zeros((CHUNK, CHUNK)), "no_band": masks["diag"]
                    + masks["past"] + masks["quad"]}.get(mask_key, masks.get(mask_key))
            self.refs[mask_key] = reference(self.host, self.scale, mask)
        return self.refs[mask_key]

    def shares(self, ablations):
        """Route -> its share of each reference output (routes the variant computes)."""
        zero = self.ref("zero")
        routes = [r for r in route_masks() if not (r == "band" and "no_band" in ablations)]
        return {r: {n: self.ref(r)[n] - zero[n] for n in zero} for r in routes}


def main(argv: List[str]) -> None:
    del argv
    start = time.perf_counter()
    from benchmarks import profile_grad as pg
    try:
        runs, probes = selected(_VARIANTS.value, _SLABS.value, _PROBES.value)
    except pg.VariantError as e:
        raise app.UsageError(str(e)) from None
    if _SEQ_LEN.value % CHUNK:
        raise app.UsageError(f"--seq_len={_SEQ_LEN.value} must be a multiple of 64")
    import jax
    import jax.numpy as jnp
    b, t, h, dk, dv = (_BATCH.value, _SEQ_LEN.value, _HEADS.value, int(_DK.value),
                       int(_DV.value))
    shapes = dict(tk=(b, t, h, dk), tv=(b, t, h, dv), ks=(b, t, h, 1),
                  hs=(b, h, t // CHUNK, dk, dv))
    scale = dk ** -0.5
    os.makedirs(os.path.dirname(os.path.abspath(_OUT.value)), exist_ok=True)
    print(f"diag start: {jax.devices()[0].device_kind}, jax {jax.__version__}, B {b} T {t} H "
          f"{h} K {dk} V {dv} {_DTYPE.value}, interpret {_INTERPRET.value}, variants "
          f"{[r[0] for r in runs]}, probes {probes}", flush=True)
    cache = {}
    with open(_OUT.value + ".jsonl", "a") as out:
        for label, kernel, ablations, slab in runs:
            left = _DEADLINE_S.value - (time.perf_counter() - start)
            if left < COMPILE_EST_S:
                print(f"diag {label} skipped: {left:.0f} s left", flush=True)
                continue
            fn = pg._call(kernel, tuple(ablations), scale, _INTERPRET.value, slab)
            t0 = time.perf_counter()
            try:
                if "random" not in cache:
                    cache["random"] = _Probe("random", shapes, jnp.dtype(_DTYPE.value), scale)
                compiled = fn.lower(*cache["random"].args).compile()
            except Exception as e:  # noqa: BLE001 - reported, the next variant runs
                print(f"diag {label} compile ERROR {type(e).__name__}: {str(e)[:300]}",
                      flush=True)
                continue
            print(f"diag {label} compiled in {time.perf_counter() - t0:.1f} s", flush=True)
            for probe in probes:
                if time.perf_counter() - start > _DEADLINE_S.value:
                    print(f"diag {label} {probe} skipped: deadline", flush=True)
                    continue
                if probe not in cache:
                    cache[probe] = _Probe(probe, shapes, jnp.dtype(_DTYPE.value), scale)
                p = cache[probe]
                try:
                    outs = jax.block_until_ready(compiled(*p.args))
                except Exception as e:  # noqa: BLE001
                    print(f"diag {label} {probe} run ERROR {type(e).__name__}: {str(e)[:300]}",
                          flush=True)
                    continue
                tap = ablations[0] if ablations and ablations[0] in TAP_OUTPUTS else None
                if tap:
                    checked = [(n, n) for n in TAP_OUTPUTS[tap]]
                    want, shares = tap_reference(tap, p.host, scale, _DTYPE.value), None
                else:
                    checked = pg.CHECKED[kernel]
                    want = p.ref("no_band" if "no_band" in ablations else "all")
                    shares = p.shares(ablations)
                rec = check(label, probe, checked, outs, want, shares, _TOL.value)
                rec.update(kernel=kernel, ablations=list(ablations), slab=slab,
                           shape=[b, t, h, dk, dv], dtype=_DTYPE.value, jax=jax.__version__,
                           device=jax.devices()[0].device_kind)
                out.write(json.dumps(rec) + "\n")
                out.flush()
    print(f"diag done in {time.perf_counter() - start:.0f} s", flush=True)


if __name__ == "__main__":
    _define_flags()
    from lattn_jax import flag_errors  # one-line flag errors (absl only)
    app.run(main, flags_parser=flag_errors.parse_flags)
