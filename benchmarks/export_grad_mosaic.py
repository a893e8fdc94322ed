r"""Export K1 and K2 alone for CUDA on this (CPU) host and time each export (issue 29).

K1 (``channelwise_grad_intra_mosaic``) and K2 (``channelwise_grad_chunk_mosaic``), the
per-channel family's backward kernels on Mosaic GPU (``pallas_kernels/common/
channelwise_grad_mosaic_gpu.py``; MOSAIC_GPU.md Sec. 20, 21), are exported with
``jax.export`` for ``platforms=["cuda"]``: the whole Pallas -> Mosaic GPU lowering runs on the
CPU, with jax 0.11's layout inference (a backtracking search with fuel, MOSAIC_GPU.md
Sec. 24.2). This is the reproduction of Sec. 24.2: on jax 0.11.2 before that fix, K1 / K2 with
document ids ran the search for about 10 minutes until its fuel ran out, and K2 without
documents failed in the dialect lowering. Each case runs in a subprocess of its own under
``--timeout_s`` (a search that runs away is cut there and reported as ``timeout``), with the
interpreter running this binary (``sys.executable``), so the same command checks either jax.

Cases: every ``--kernels`` x ``--dims`` (K = V) x ``--slabs``, with document ids unless
``--nodocs``, bf16, one chunk (B 1, T 64, H 1: the smallest shape on the kernels' real code
path; registers and layouts do not depend on B, T and H). One line per case: ``OK`` with the
export time (seconds, the lowering alone, in the child process), or ``FAIL`` / ``timeout``
with the error's last line. Exit status 1 if any case did not export.

Usage (from the repository root)::

    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/export_grad_mosaic.py        # jax 0.10.2
    PYTHONPATH=$PWD JAX_PLATFORMS=cpu /tmp/jax011/bin/python \
        benchmarks/export_grad_mosaic.py --timeout_s=120                      # jax 0.11.2
    ... --kernels=k1 --dims=128 --slabs=16 --debug   # one case, layout-inference DEBUG log

``--debug`` sets ``jax.experimental.mosaic.gpu.layout_inference``'s logger to DEBUG (on 0.11
it prints the fuel the search consumed, ``consumed N/100000 fuel``).
"""

import logging
import os
import subprocess
import sys
import time
from typing import List, Tuple

from absl import app, flags

if __name__ == "__main__":  # python benchmarks/export_grad_mosaic.py from the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

_KERNELS = _DIMS = _SLABS = _NODOCS = _TIMEOUT = _DEBUG = _CHILD = None


def _define_flags() -> None:
    """Defines the flags (only when run as a program, as ``offline_ptxas.py``)."""
    global _KERNELS, _DIMS, _SLABS, _NODOCS, _TIMEOUT, _DEBUG, _CHILD
    _KERNELS = flags.DEFINE_list("kernels", ["k1", "k2"], "k1 and/or k2")
    _DIMS = flags.DEFINE_list("dims", ["64", "128"], "K = V head dims")
    _SLABS = flags.DEFINE_list("slabs", ["16", "32"], "phase-2 slabs")
    _NODOCS = flags.DEFINE_bool("nodocs", False, "no document ids")
    _TIMEOUT = flags.DEFINE_integer("timeout_s", 300, "seconds per case (its subprocess)")
    _DEBUG = flags.DEFINE_bool("debug", False, "layout inference's DEBUG log (one process)")
    _CHILD = flags.DEFINE_string("child", "", "internal: run one case, 'k1:128:16:1'")


def export_case(kernel: str, dim: int, slab: int, docs: bool) -> Tuple[float, int]:
    """Exports ``kernel`` (``"k1"`` or ``"k2"``) for CUDA at K = V = ``dim`` and ``slab``, bf16
    inputs of B 1, T 64, H 1 (``[1, 64, 1, dim]``; gamma fp32; K2's ``hs`` / ``dhs`` bf16
    ``[1, 1, 1, dim, dim]``, its ``ks`` per token fp32 ``[1, 64, 1, 1]``), int32 document ids
    ``[1, 64]`` if ``docs``. Returns ``(seconds, number of Mosaic GPU custom calls)``; raises
    what the lowering raises."""
    import jax
    import jax.numpy as jnp

    from pallas_kernels.common import channelwise_grad_mosaic_gpu as kernels

    spec = jax.ShapeDtypeStruct
    batch, seq_len, heads, dtype = 1, 64, 1, jnp.bfloat16
    tok = (batch, seq_len, heads)
    doc = spec((batch, seq_len), jnp.int32) if docs else None
    if kernel == "k1":
        args = ([spec(tok + (dim,), dtype)] * 3 + [spec(tok + (dim,), jnp.float32)]
                + [spec(tok + (dim,), dtype)] * 3)

        def fn(*args, doc=None):
            return kernels.channelwise_grad_intra_mosaic(*args, scale=0.1, doc=doc, slab=slab)
    elif kernel == "k2":
        states = (batch, heads, seq_len // 64, dim, dim)
        args = ([spec(tok + (dim,), dtype)] * 2  # q, k (K2 forms kr = k ks itself)
                + [spec(tok + (1,), jnp.float32), spec(tok + (dim,), jnp.float32)]
                + [spec(states, dtype)] * 2 + [spec(tok + (dim,), dtype)] * 3)

        def fn(*args, doc=None):
            return kernels.channelwise_grad_chunk_mosaic(*args, scale=0.1, doc=doc, slab=slab)
    else:
        raise ValueError(f"kernel must be k1 or k2, got {kernel!r}")
    start = time.perf_counter()
    exported = jax.export.export(jax.jit(fn), platforms=["cuda"])(*args, doc=doc)
    text = exported.mlir_module()
    return time.perf_counter() - start, text.count("custom_call @mosaic_gpu")


def _run_child(case: str) -> int:
    kernel, dim, slab, docs = case.split(":")
    if _DEBUG.value:
        logging.basicConfig(level=logging.INFO)
        logging.getLogger("jax.experimental.mosaic.gpu.layout_inference").setLevel(
            logging.DEBUG)
    seconds, calls = export_case(kernel, int(dim), int(slab), docs == "1")
    print(f"EXPORTED {seconds:.1f} {calls}", flush=True)
    return 0


def _cases() -> List[Tuple[str, int, int]]:
    return [(k, int(d), int(s)) for k in _KERNELS.value for d in _DIMS.value
            for s in _SLABS.value]


def main(argv: List[str]) -> None:
    del argv
    if _CHILD.value:
        sys.exit(_run_child(_CHILD.value))
    import jax
    docs = not _NODOCS.value
    print(f"jax {jax.__version__}, {'with' if docs else 'without'} document ids, "
          f"timeout {_TIMEOUT.value} s per case", flush=True)
    failed = 0
    for kernel, dim, slab in _cases():
        case = f"{kernel}:{dim}:{slab}:{int(docs)}"
        cmd = [sys.executable, os.path.abspath(__file__), f"--child={case}"]
        cmd += ["--debug"] if _DEBUG.value else []
        start = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=_TIMEOUT.value)
        except subprocess.TimeoutExpired:
            failed += 1
            print(f"timeout {kernel} K=V={dim} slab={slab}: still lowering after "
                  f"{_TIMEOUT.value} s", flush=True)
            continue
        wall = time.perf_counter() - start
        done = [line for line in proc.stdout.splitlines() if line.startswith("EXPORTED")]
        if _DEBUG.value:
            print(proc.stdout + proc.stderr, end="")
        if proc.returncode == 0 and done:
            seconds, calls = done[-1].split()[1:]
            print(f"OK {kernel} K=V={dim} slab={slab}: export {seconds} s "
                  f"({wall:.1f} s with the process), {calls} Mosaic GPU call(s)", flush=True)
        else:
            failed += 1
            last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
            print(f"FAIL {kernel} K=V={dim} slab={slab} ({wall:.1f} s): {last[:300]}",
                  flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    _define_flags()
    app.run(main)
