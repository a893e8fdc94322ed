r"""Issue 29's acceptance table from ``bench_kernels.py`` records.

Reads the ``.jsonl`` (one record per line, as a run appends them) and ``.json`` (``{"records":
[...]}``) files ``bench_kernels.py --out=...`` writes, from one or several processes of one
device window (the GPU queue's ``tab_*`` items run one process per op and shape, and fla in its
own: ``benchmarks/windows/issue29_queue.sh``), and prints a markdown table: per op, shape and
pass our kernel time (``ours``, the ``auto`` dispatch; ``--ours=mosaic`` takes the ``mosaic``
peer instead), jla's and fla's, and the verdicts of the issue's criteria:

- ``0.95x jla``: ours <= 0.95 * jla (kernel ms); else "missed by" ``ours - 0.95 jla`` ms;
- ``fla``: ours <= fla; else missed by ``ours - fla``;
- GDN forward+backward at S1 at most ``--gdn_s1_target_ms`` (1.23 ms).

Kernel time is the record's ``kernel_ms`` (the summed device time of one call's kernels). A
record whose correctness gate is red gives ``RED`` instead of a verdict: a fast wrong kernel
meets nothing. Where a peer has no record the verdict is ``not measured``. When several
records share ``(op, shape, pass, peer)`` the last one read wins (files in argument order).

Usage::

    python benchmarks/acceptance.py results/tab_gdn/*.jsonl results/tab_fla/fla.jsonl

Raises (one-line ``SystemExit``): no files, a file that is missing or not JSON records.
"""
import argparse
import json
import os
import sys

JLA_FACTOR = 0.95
GDN_S1_TARGET_MS = 1.23
_OPS = ("gdn", "deltanet", "lightning", "kda", "gdn2")
_SHAPES = ("S1", "S2", "P1")
_PASSES = ("fwd", "fwdbwd")


def read_records(paths):
    """The records of ``paths`` (``.jsonl`` lines or a ``.json`` ``{"records": [...]}``), in
    order. Raises ``SystemExit`` naming a missing or unreadable file."""
    records = []
    for path in paths:
        if not os.path.isfile(path):
            raise SystemExit(f"acceptance: no file {path}")
        try:
            with open(path) as f:
                text = f.read()
            if path.endswith(".jsonl"):
                records += [json.loads(line) for line in text.splitlines() if line.strip()]
            else:
                records += json.loads(text)["records"]
        except (ValueError, KeyError, TypeError) as e:
            raise SystemExit(f"acceptance: {path} is not bench_kernels records ({e})") from None
    return records


def _verdict(ours, peer, factor):
    """``"met"``, ``"missed by X"`` (ms) or ``"not measured"``, for ours <= factor * peer."""
    if ours is None or peer is None:
        return "not measured"
    bound = factor * peer
    return "met" if ours <= bound else f"missed by {ours - bound:.3f}"


def table(records, ours_peer="ours", gdn_s1_target_ms=GDN_S1_TARGET_MS):
    """The acceptance table's markdown lines for ``records`` (see the module docstring)."""
    by = {}
    for r in records:
        by[(r.get("op"), r.get("shape"), r.get("pass_"), r.get("peer"))] = r
    lines = [f"| op | shape | pass | {ours_peer} ms | jla ms | fla ms | {ours_peer}/jla "
             f"| {JLA_FACTOR}x jla | fla |", "|---|---|---|---:|---:|---:|---:|---|---|"]
    ops = [o for o in _OPS if any(k[0] == o for k in by)]
    ops += sorted({k[0] for k in by} - set(ops) - {None})
    shapes = [s for s in _SHAPES if any(k[1] == s for k in by)]
    shapes += sorted({k[1] for k in by} - set(shapes) - {None})
    for op in ops:
        for shape in shapes:
            for pas in _PASSES:
                mine = by.get((op, shape, pas, ours_peer))
                jla, fla = by.get((op, shape, pas, "jla")), by.get((op, shape, pas, "fla"))
                if not (mine or jla or fla):
                    continue
                ms = [r.get("kernel_ms") if r else None for r in (mine, jla, fla)]
                cells = ["-" if m is None else f"{m:.3f}" for m in ms]
                ratio = "-" if None in ms[:2] else f"{ms[0] / ms[1]:.3f}"
                if mine is not None and not mine.get("gate", True):
                    v_jla = v_fla = "RED (gate)"
                else:
                    v_jla = _verdict(ms[0], ms[1], JLA_FACTOR)
                    v_fla = _verdict(ms[0], ms[2], 1.0)
                lines.append(f"| {op} | {shape} | {pas} | " + " | ".join(cells)
                             + f" | {ratio} | {v_jla} | {v_fla} |")
    gdn = by.get(("gdn", "S1", "fwdbwd", ours_peer))
    if gdn and gdn.get("kernel_ms") is not None:
        lines += ["", f"GDN S1 fwd+bwd: {gdn['kernel_ms']:.3f} ms against at most "
                      f"{gdn_s1_target_ms} ms: "
                      + _verdict(gdn["kernel_ms"], gdn_s1_target_ms, 1.0) + "."]
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", help="bench_kernels .jsonl / .json files")
    parser.add_argument("--ours", default="ours", choices=("ours", "mosaic"),
                        help="the peer whose records are ours (default: ours = auto)")
    parser.add_argument("--gdn_s1_target_ms", type=float, default=GDN_S1_TARGET_MS)
    args = parser.parse_args(argv)
    if not args.paths:
        raise SystemExit("acceptance: give at least one bench_kernels .jsonl or .json file")
    print("\n".join(table(read_records(args.paths), args.ours, args.gdn_s1_target_ms)))


if __name__ == "__main__":
    sys.exit(main())
