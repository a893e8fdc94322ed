r"""What XLA's named fusions in one op's compiled step are: the optimized HLO of
``bench_kernels``' forward or forward + backward function for one op, peer and shape, and
for every fusion whose name matches ``--names`` its fused computation (shapes, layouts, the
ops it runs) and the JAX source lines its metadata names.

Why: ``bench_kernels --breakdown_top`` names kernels by the profiler's fusion names
(``loop_transpose_fusion``: 0.09 ms at KDA S1 fwd+bwd on an H100, 2026-12-07), which say
neither what the fusion moves nor which line of ours asked for it (MOSAIC_GPU.md Sec. 48).
Needs a GPU (the HLO is the one XLA compiles for it); nothing is timed.

    python benchmarks/hlo_fusions.py --op=kda --shape=S1 --pass_=fwdbwd \
        --names='loop_transpose_fusion|loop_convert_fusion|input_transpose_fusion'

Prints, per matching fusion: ``== <name>``, its calling instruction (result shape and layout,
operands), then the fused computation's instructions (at most ``--max_lines``) and the
distinct ``source_file:source_line`` / ``op_name`` pairs of its metadata.

Raises (as flag errors): an unknown ``--op``, ``--peer`` or ``--pass_``; ``--shape`` as
``bench_kernels --shapes`` takes it.
"""

import re

from absl import app, flags

from benchmarks import bench_kernels as bk

_OP = flags.DEFINE_enum("op", "kda", ["gdn", "deltanet", "lightning", "kda", "gdn2"],
                        "Op, as bench_kernels --ops.")
_PEER = flags.DEFINE_enum("peer", "ours", ["ours", "mosaic", "jla", "chunked"],
                          "Peer, as bench_kernels --peers.")
_SHAPE = flags.DEFINE_string("shape", "S1", "S1, S2, P1 or BxTxH, as bench_kernels --shapes.")
_PASS = flags.DEFINE_enum("pass_", "fwdbwd", ["fwd", "fwdbwd"], "Which function to compile.")
_NAMES = flags.DEFINE_string("names", "transpose|convert|copy",
                             "Regex on fusion names (the profiler's kernel names).")
_MAX_LINES = flags.DEFINE_integer("max_lines", 12, "Instructions shown per fused computation.")


def fusions(hlo: str, pattern: str):
    """``{fusion name: (calling line, [fused computation lines])}`` of the optimized HLO text
    ``hlo`` for the fusion instructions whose name matches ``pattern`` (``re.search``)."""
    computations, current, body = {}, None, []
    for line in hlo.splitlines():
        head = re.match(r"^\s*(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$", line)
        if head and not line.startswith(" " * 4):
            current, body = head.group(1), []
            computations[current] = body
        elif line.strip() == "}":
            current = None
        elif current is not None and line.strip():
            body.append(line.strip())
    found = {}
    for lines in computations.values():
        for line in lines:
            m = re.match(r"^(?:ROOT\s+)?%?([\w.\-]+)\s*=.*\bfusion\(.*calls=%?([\w.\-]+)", line)
            if m and re.search(pattern, m.group(1)):
                found[m.group(1)] = (line, computations.get(m.group(2), []))
    return found


def _sources(lines):
    """The distinct ``file:line op_name`` of the metadata in ``lines``."""
    out = []
    for line in lines:
        f = re.search(r'source_file="([^"]+)" source_line=(\d+)', line)
        o = re.search(r'op_name="([^"]+)"', line)
        item = (f"{f.group(1).split('/')[-1]}:{f.group(2)}" if f else "?") + (
            f"  {o.group(1)[-120:]}" if o else "")
        if (f or o) and item not in out:
            out.append(item)
    return out


def main(argv):
    del argv
    import jax
    batch, seq_len, heads = bk._shape(_SHAPE.value)
    op = _OP.value
    inputs = bk.make_inputs(op, batch, seq_len, heads, 128, packed=_SHAPE.value.startswith("P"))
    (q, k, v, do), gates, seg = bk._to_jax(inputs, op)
    names = () if op == "lightning" else tuple(gates)
    fn = bk._jax_passes(bk._jax_fn(op, _PEER.value, seg), names)[_PASS.value]
    hlo = fn.lower(q, k, v, do, **gates).compile().as_text()
    print(f"{op} {_PEER.value} {_SHAPE.value} {_PASS.value} on {jax.devices()[0].device_kind}: "
          f"{len(hlo.splitlines())} HLO lines")
    for name, (call, lines) in sorted(fusions(hlo, _NAMES.value).items()):
        print(f"== {name}\n  {call[:400]}")
        for line in lines[:_MAX_LINES.value]:
            print(f"    {re.sub(r', metadata=.*$', '', line)[:300]}")
        for src in _sources([call] + lines):
            print(f"    @ {src}")


if __name__ == "__main__":
    app.run(main)
