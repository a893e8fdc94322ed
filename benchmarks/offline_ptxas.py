r"""ptxas's registers and spills for our Pallas Mosaic GPU kernels (sm_90a), without a GPU.

jaxlib compiles a Mosaic GPU kernel only when the ``mosaic_gpu_v2`` custom call is first run
on a GPU (``jaxlib/mosaic/gpu/custom_call.cc``, in the CUDA PJRT plugin: it asks the CUDA
driver for the compute capability, so it cannot run here). This binary redoes that
compilation offline with public tools:

1. ``jax.export`` for CUDA on this CPU host (MOSAIC_GPU.md Sec. 1) gives each kernel's
   serialized Mosaic GPU module (the custom call's ``module``); jaxlib's own MLIR reads it
   back (the ``mosaic_gpu-serde`` pass, ``serialize=false``, as the plugin does) and prints it.
2. An upstream MLIR with every pass registered and LLVM's NVPTX back end, from the pip
   package ``numba-cuda-mlir`` (0.6.0: MLIR/LLVM of 2026-10; its Python bindings only, not
   numba), parses that text and runs the plugin's pipeline (jaxlib 0.10.2 and 0.11.2 have the
   same one): ``arith-expand, canonicalize, mosaic-gpu-sink-memref-descriptors,
   convert-nvgpu-to-nvvm, gpu-kernel-outlining, ..., nvvm-attach-target{chip=sm_90a O=3},
   ..., gpu.module(convert-gpu-to-nvvm), ..., mosaic-byval-insertion,
   mosaic-llvm-attr-insertion, ..., convert-math-to-llvm``, then LLVM -O3 to PTX with
   libdevice linked (``gpu-module-to-binary{format=isa}``: the same ``ModuleToObject`` path
   as Mosaic's ``mosaic-gpu-module-to-assembly``). Mosaic's own passes are redone here in
   Python, from their source: the descriptor sinking (constants, ``llvm.insertvalue`` /
   ``undef`` and casts cloned into the ``gpu.launch`` body), the ``byval`` TMA descriptor
   parameters (``llvm.byval``, ``nvvm.grid_constant``, 64-byte alignment) and
   ``nvvm.minctasm = 1`` with 16-byte alignment on pointer parameters. Its lowering of 1-D
   ``vector.extract_strided_slice`` (in ``mosaic-convert-gpu-to-llvm``; K2 has one) is
   replaced by upstream ``convert-vector-to-llvm`` on the ``gpu.module`` (a shuffle instead
   of an extract/insert chain: the same after LLVM's instcombine). The trivial-location pass
   and the debug-scope pass do not change the code and are left out (checked: the same
   ptxas figures with the debug-scope pass).
3. ``ptxas -arch=sm_90a -v`` (default -O3, as the plugin's compilation provider) on the PTX.

Validation (MOSAIC_GPU.md Sec. 23): the nine T0 stage ablations measured on the H200 on
2026-12-04c (jax 0.11.2, CUDA 13) against this binary (jax 0.10.2; ptxas 12.9 and 13.0 give
the same on this PTX): every kernel on the same side of the 255-register cap and of "spills /
no spills", the same C7514 warnings, registers within 8 (45 vs 37, 85 vs 89, 172 vs 167, 219
vs 216), spill bytes 20 to 35 % lower here (92 vs 60, 80 vs 52, 300 vs 236). So: a kernel
that spilled here spilled on the H200 too (nine of nine), with more bytes there; one near the
cap may spill there and not here; rank variants rather than trust an absolute byte count.
``--kernels=t0`` reruns that comparison (the H200's figures are printed beside ours).

What it cannot see: jaxlib 0.11.2's lowering on the GPU machine (ours is 0.10.2's) and the
exact LLVM of that jaxlib (the likely causes of the offsets above); runtime behaviour, bank
conflicts, occupancy. With ``setmaxnreg`` (warp-specialised kernels) "Used N registers" is
the launch allocation (65536 / threads, rounded down to 8), not each warpgroup's share. At
256 threads (K1, K2) ptxas takes up to 255 registers whenever that helps its schedule, so 255
without spills says little about pressure; spills are what matter, and near the cap their
bytes move with ptxas's scheduling (K2 with ``no_band`` spills more than K2 itself).

Setup (once; the packages go to a directory of their own, not the project's .venv)::

    .venv/bin/pip install --no-deps --target /tmp/ptx-site \
        numba-cuda-mlir==0.6.0 nvidia-cuda-nvcc-cu12==12.9.86

Usage::

    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/offline_ptxas.py --site=/tmp/ptx-site
    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/offline_ptxas.py --site=/tmp/ptx-site \
        --kernels=k1:16,k2 --out_dir=/tmp/ptx-out     # keeps the MLIR, PTX and ptxas logs
    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/offline_ptxas.py --site=/tmp/ptx-site \
        --kernels=t0                                   # the validation against the H200

Kernels (``--kernels``; default ``state_fwd,state_bwd,k1:32,k1:16,k2:32,k2:16``): ``state_fwd``
(``channelwise_forward_mosaic`` with ``v_new`` and ``h`` stored, the training forward),
``state_fwd_nostore`` (inference), ``state_bwd`` (``channelwise_backward_state_mosaic`` with
``dvn_in``), ``k1:<slab>`` (``channelwise_grad_intra_mosaic``, slab 16 or 32), ``k2:<slab>``
(``channelwise_grad_chunk_mosaic``, KDA's per-token ``ks``; ``k2`` is ``k2:32``),
``k2gdn2:<slab>`` (the same with GDN-2's per-channel fp32 ``ks``),
``t0:<stages>:<inverse>`` (``chunk_kkt_inverse_mosaic`` at S1 with the Newton step) or
``t0`` (the nine H200 variants). ``k1`` and ``k2`` take stage ablations after ``+``
(``k1:32+no_band``, ``k2+no_mma+no_state``; MOSAIC_GPU.md Sec. 22). KDA shapes: ``--batch``,
``--seq_len``, ``--heads``, ``--dk``, ``--dv``, ``--dtype``, document ids unless ``--nodocs``
(registers and spills do not depend on the shape: T = 200, H = 2 gives the same).
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import types
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from absl import app, flags

if __name__ == "__main__":  # python benchmarks/offline_ptxas.py from the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

CHIP = "sm_90a"
DEFAULT_KERNELS = ("state_fwd", "state_bwd", "k1:32", "k1:16", "k2:32", "k2:16")
KDA_SLABS = (16, 32)
# The T0 stage ablations measured on the H200, 2026-12-04c (MOSAIC_GPU.md Sec. 14; jax 0.11.2,
# benchmarks/results/mosaic-gpu-h200-2026-12-04c): (registers, spill store bytes).
H200_T0 = {
    "io:doubling": (45, 0), "gram:doubling": (85, 0), "no_refine:doubling": (172, 0),
    "full:doubling": (255, 92), "nobar:doubling": (255, 92), "no_store:doubling": (255, 80),
    "no_refine:substitution": (219, 0), "full:substitution": (255, 300),
    "nobar:substitution": (255, 300),
}
HBM_ALIGNMENT = 16  # Mosaic's kExpectedHbmAlignment (mosaic-llvm-attr-insertion)
TMA_ALIGNMENT = 64  # mosaic-byval-insertion's alignment of the descriptor parameters
# Mosaic's mosaic-gpu-sink-memref-descriptors clones these (and constants) into gpu.launch.
_SINKABLE = frozenset(("arith.constant", "llvm.mlir.constant", "llvm.mlir.undef",
                       "llvm.insertvalue", "builtin.unrealized_conversion_cast"))
_PIPELINE_A = "arith-expand,canonicalize"
_PIPELINE_B = (
    "convert-nvgpu-to-nvvm,gpu-kernel-outlining{{data-layout-str=}},"
    "convert-vector-to-scf{{full-unroll=false lower-tensors=false target-rank=1}},"
    "convert-scf-to-cf,convert-nvvm-to-llvm,expand-strided-metadata,"
    "nvvm-attach-target{{O=3 chip={chip} fast=false features=+ptx{ptx} ftz=false "
    "triple=nvptx64-nvidia-cuda l={libdevice}}},"
    "lower-affine,convert-arith-to-llvm{{index-bitwidth=0}},"
    "convert-index-to-llvm{{index-bitwidth=64}},canonicalize,cse,"
    "gpu.module(convert-gpu-to-nvvm{{has-redux=false index-bitwidth=64 "
    "use-bare-ptr-memref-call-conv=false}}),gpu.module(canonicalize),gpu.module(cse)")
_PIPELINE_C = ("gpu.module(convert-vector-to-llvm),gpu.module(reconcile-unrealized-casts),"
               "convert-math-to-llvm{approximate-log1p=true}")


class ToolchainError(RuntimeError):
    """The MLIR bindings, ptxas or libdevice are not where ``--site`` / ``--cuda_root`` say."""


# ------------------------------------------------------------------ 1. the Mosaic GPU modules

def mosaic_modules(exported_mlir: str) -> List[str]:
    """The Mosaic GPU modules of every ``mosaic_gpu`` custom call in ``exported_mlir``
    (``jax.export``'s ``mlir_module()`` for CUDA), read back with jaxlib's ``mosaic_gpu-serde``
    pass (``serialize=false``, what the CUDA plugin runs first) and printed as MLIR text."""
    from jax._src.interpreters import mlir as jax_mlir
    from jax._src.lib import mosaic_gpu_dialect
    from jax._src.lib.mlir import ir, passmanager
    ctx = jax_mlir.make_ir_context()
    mosaic_gpu_dialect.register_dialect(ctx)
    ctx.allow_unregistered_dialects = True
    texts = []
    with ctx:
        blobs = []

        def walk(op):
            if op.operation.name == "stablehlo.custom_call" and "mosaic_gpu" in str(
                    op.operation.attributes["call_target_name"]):
                config = ir.DictAttr(op.operation.attributes["mhlo.backend_config"])
                blobs.append(ir.StringAttr(config["module"]).value_bytes)
            for region in op.operation.regions:
                for block in region.blocks:
                    for inner in block.operations:
                        walk(inner)

        walk(ir.Module.parse(exported_mlir))
        for raw in blobs:
            module = ir.Module.parse(raw)
            passmanager.PassManager.parse(
                "builtin.module(mosaic_gpu-serde{serialize=false})").run(module.operation)
            texts.append(module.operation.get_asm())
    return texts


def export_modules(fn: Callable, *args, **kwargs) -> List[str]:
    """:func:`mosaic_modules` of ``jax.jit(fn)(*args, **kwargs)`` exported for CUDA."""
    import jax
    exported = jax.export.export(jax.jit(fn), platforms=["cuda"])(*args, **kwargs)
    return mosaic_modules(exported.mlir_module())


def dynamic_smem(module_text: str) -> Optional[int]:
    """The ``dynamic_shared_memory_size`` of the module's ``gpu.launch`` (bytes; what Mosaic
    requests at launch), or ``None`` if it is not a constant."""
    use = re.search(r"gpu\.launch\b[^\n]*dynamic_shared_memory_size (%[\w.]+)", module_text)
    if not use:
        return None
    define = re.search(re.escape(use.group(1)) + r" = arith\.constant (\d+)", module_text)
    return int(define.group(1)) if define else None


# ------------------------------------------------------------------------ 2. MLIR -> PTX

def load_mlir(site: str):
    """``(ir, passmanager, gpu dialect)`` of numba-cuda-mlir's MLIR bindings under ``site``,
    without numba-cuda-mlir's own ``__init__`` (which wants the CUDA driver bindings)."""
    root = os.path.join(site, "numba_cuda_mlir")
    if not os.path.isdir(os.path.join(root, "_mlir")):
        raise ToolchainError(f"no numba_cuda_mlir/_mlir under {site!r}; install it with "
                             f"pip install --no-deps --target {site} numba-cuda-mlir==0.6.0")
    if "numba_cuda_mlir" not in sys.modules:
        stub = types.ModuleType("numba_cuda_mlir")
        stub.__path__ = [root]
        sys.modules["numba_cuda_mlir"] = stub
    from numba_cuda_mlir._mlir import ir, passmanager
    from numba_cuda_mlir._mlir.dialects import gpu
    return ir, passmanager, gpu


def _walk(op, visit):
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                visit(inner.operation)
                _walk(inner.operation, visit)


def _strictly_inside(op, ancestor) -> bool:
    if op == ancestor:
        return False
    while op is not None:
        if op == ancestor:
            return True
        op = op.parent
    return False


def _owner_op(value):
    """The operation that defines ``value``, or ``None`` for a block argument."""
    owner = value.owner
    return owner.operation if hasattr(owner, "operation") else None


def sink_descriptors(ir, module) -> int:
    """Mosaic's ``mosaic-gpu-sink-memref-descriptors``: clones the constants, casts and
    ``llvm.insertvalue`` / ``undef`` chains that a ``gpu.launch`` body uses from outside into
    the body, so outlining passes no memref descriptor pieces as kernel parameters. Returns
    the number of operations cloned."""
    launches = []
    _walk(module.operation, lambda op: launches.append(op) if op.name == "gpu.launch" else None)
    cloned = 0
    for launch in launches:
        body = []
        _walk(launch, body.append)
        sources = []
        for op in body:
            for value in op.operands:
                source = _owner_op(value)
                if (source is not None and source not in sources
                        and not _strictly_inside(source, launch) and source != launch):
                    sources.append(source)
        to_sink: List = []

        def collect(op):
            if op in to_sink or op.name not in _SINKABLE:
                return
            for value in op.operands:
                source = _owner_op(value)
                if source is not None:
                    collect(source)
            to_sink.append(op)

        for source in sources:
            collect(source)
        first = launch.regions[0].blocks[0].operations[0]
        mapping = {}
        for op in to_sink:
            with ir.InsertionPoint(first):
                clone = op.clone()
            for i, value in enumerate(list(clone.operands)):
                if value in mapping:
                    clone.operands[i] = mapping[value]
            for old, new in zip(op.results, clone.results):
                mapping[old] = new
                for use in list(old.uses):
                    user = use.owner.operation if hasattr(use.owner, "operation") else use.owner
                    if user != clone and _strictly_inside(user, launch):
                        user.operands[use.operand_number] = new
        cloned += len(to_sink)
    return cloned


def byval_and_attrs(ir, module) -> None:
    """Mosaic's ``mosaic-byval-insertion`` and ``mosaic-llvm-attr-insertion`` on the kernels
    (``llvm.func`` with a body inside a ``gpu.module``): array parameters (TMA descriptors)
    become ``byval`` / ``nvvm.grid_constant`` pointers aligned to 64 bytes, other pointers get
    16-byte alignment, and the kernel ``nvvm.minctasm = 1``."""
    funcs = []
    _walk(module.operation, lambda op: funcs.append(op) if (
        op.name == "llvm.func" and len(op.regions[0].blocks)
        and op.parent.name == "gpu.module") else None)
    i32 = ir.IntegerType.get_signless(32)
    ptr = ir.Type.parse("!llvm.ptr")
    for func in funcs:
        args = list(func.regions[0].blocks[0].arguments)
        old = func.attributes["arg_attrs"] if "arg_attrs" in func.attributes else None
        attrs = []
        for i, arg in enumerate(args):
            entries = {}
            if old is not None:
                for named in ir.DictAttr(old[i]):
                    entries[named.name] = named.attr
            if str(arg.type).startswith("!llvm.array"):
                entries["llvm.byval"] = ir.TypeAttr.get(arg.type)
                entries["nvvm.grid_constant"] = ir.UnitAttr.get()
                entries["llvm.align"] = ir.IntegerAttr.get(i32, TMA_ALIGNMENT)
                arg.set_type(ptr)
            elif str(arg.type) == "!llvm.ptr" and "llvm.align" not in entries:
                entries["llvm.align"] = ir.IntegerAttr.get(i32, HBM_ALIGNMENT)
            attrs.append(ir.DictAttr.get(entries))
        func.attributes["arg_attrs"] = ir.ArrayAttr.get(attrs)
        func.attributes["function_type"] = ir.TypeAttr.get(ir.Type.parse(
            "!llvm.func<void (" + ", ".join(str(a.type) for a in args) + ")>"))
        func.attributes["nvvm.minctasm"] = ir.IntegerAttr.get(i32, 1)


def module_to_ptx(module_text: str, site: str, cuda_root: str, ptx_isa: int = 87,
                  llvm_out: Optional[str] = None) -> List[str]:
    """PTX of each kernel of a Mosaic GPU module (the plugin's pipeline, module docstring).
    ``llvm_out``: if given, the LLVM-dialect module is written there before LLVM runs."""
    ir, passmanager, gpu = load_mlir(site)
    libdevice = os.path.join(cuda_root, "nvvm", "libdevice", "libdevice.10.bc")
    if not os.path.exists(libdevice):
        raise ToolchainError(f"no libdevice at {libdevice}")
    ctx = ir.Context()
    module = ir.Module.parse(module_text, ctx)

    def run(pipeline):
        passmanager.PassManager.parse(f"builtin.module({pipeline})", ctx).run(module.operation)

    run(_PIPELINE_A)
    with ctx:
        sink_descriptors(ir, module)
    run(_PIPELINE_B.format(chip=CHIP, ptx=ptx_isa, libdevice=libdevice))
    with ctx:
        byval_and_attrs(ir, module)
    run(_PIPELINE_C)
    if llvm_out:
        with open(llvm_out, "w") as f:
            f.write(str(module))
    run(f"gpu-module-to-binary{{format=isa toolkit={cuda_root}}}")
    out = []
    _walk(module.operation, lambda op: out.append(
        gpu.ObjectAttr(op.attributes["objects"][0]).object) if op.name == "gpu.binary" else None)
    return [p.decode() if isinstance(p, bytes) else p for p in out]


# ------------------------------------------------------------------------------ 3. ptxas

def parse_ptxas(log: str) -> List[Dict]:
    """One record per entry function in ``ptxas -v``'s log: ``kernel``, ``regs``,
    ``spill_st``, ``spill_ld``, ``stack`` (bytes), ``smem_static`` and ``c7514`` (ptxas warned
    that it serializes ``wgmma`` because other instructions read their accumulators)."""
    records = []
    for block in re.split(r"(?=ptxas info\s*: Compiling entry function)", log)[1:]:
        name = re.search(r"entry function '([^']+)'", block).group(1)
        frame = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, "
                          r"(\d+) bytes spill loads", block)
        used = re.search(r"Used (\d+) registers", block)
        smem = re.search(r"(\d+) bytes smem", block)
        records.append(dict(kernel=name, regs=int(used.group(1)),
                            stack=int(frame.group(1)), spill_st=int(frame.group(2)),
                            spill_ld=int(frame.group(3)),
                            smem_static=int(smem.group(1)) if smem else 0,
                            c7514=name in re.findall(r"\(C7514\)[^\n]*function '([^']+)'",
                                                     log)))
    return records


def run_ptxas(ptxas: str, ptx: str, path: str) -> Tuple[List[Dict], str]:
    """``ptxas -arch=sm_90a -v`` on ``ptx`` (written to ``path``): ``(records, log)``."""
    with open(path, "w") as f:
        f.write(ptx)
    proc = subprocess.run([ptxas, f"-arch={CHIP}", "-v", path, "-o", path + ".cubin"],
                          capture_output=True, text=True)
    log = proc.stdout + proc.stderr
    if proc.returncode:
        raise RuntimeError(f"ptxas failed on {path}:\n{log}")
    return parse_ptxas(log), log


def find_cuda_root(site: str, cuda_root: Optional[str]) -> str:
    """``cuda_root`` if given, else ``<site>/nvidia/cuda_nvcc`` (nvidia-cuda-nvcc-cu12)."""
    root = cuda_root or os.path.join(site, "nvidia", "cuda_nvcc")
    if not os.path.exists(os.path.join(root, "bin", "ptxas")):
        raise ToolchainError(f"no bin/ptxas under {root!r}; install nvidia-cuda-nvcc-cu12 "
                             f"into --site or pass --cuda_root")
    return root


# ------------------------------------------------------------------------------ kernels

def _kda_shapes(batch, seq_len, heads, dk, dv, dtype):
    import jax
    import jax.numpy as jnp
    from pallas_kernels.common import mosaic_gpu_lib as mgl
    spec = jax.ShapeDtypeStruct
    n = -(-seq_len // mgl.CHUNK)
    return dict(
        tok_k=spec((batch, seq_len, heads, dk), dtype),
        tok_v=spec((batch, seq_len, heads, dv), dtype),
        gamma=spec((batch, seq_len, heads, dk), jnp.float32),
        ks=spec((batch, seq_len, heads, 1), jnp.float32),
        states=spec((batch, heads, n, dk, dv), dtype),
        mq=spec((batch, heads, n, mgl.CHUNK, mgl.CHUNK), dtype),
        e_all=spec((batch, heads, n, dk), jnp.float32),
        h0=spec((batch, heads, dk, dv), jnp.float32),
        doc=spec((batch, seq_len), jnp.int32))


def kernel_modules(name: str, *, batch: int = 1, seq_len: int = 4096, heads: int = 16,
                   dk: int = 128, dv: int = 128, dtype: str = "bfloat16",
                   docs: bool = True) -> List[str]:
    """The Mosaic GPU module(s) of one ``--kernels`` entry (module docstring)."""
    import jax
    import jax.numpy as jnp
    dt = jnp.dtype(dtype)
    s = _kda_shapes(batch, seq_len, heads, dk, dv, dt)
    doc = s["doc"] if docs else None
    base, *ablations = name.split("+")
    kind, _, arg = base.partition(":")
    if ablations and kind not in ("k1", "k2", "k2gdn2"):
        raise ValueError(f"{name!r}: only k1 and k2 take ablations")
    abl = dict(ablations=tuple(ablations)) if ablations else {}
    if kind in ("state_fwd", "state_fwd_nostore", "state_bwd"):
        from pallas_kernels.common import channelwise_mosaic_gpu as cwm
        tok = [s["tok_k"]] * 3

        def fn(qg, kg, w, u, mq, e_all, h0):
            if kind == "state_bwd":  # u stands for dO and dvn_in (same shape)
                return cwm.channelwise_backward_state_mosaic(
                    qg, kg, w, mq, e_all, u, scale=0.1, dvn_in=u, dht=h0)
            stores = kind == "state_fwd"
            return cwm.channelwise_forward_mosaic(qg, kg, w, u, mq, e_all, scale=0.1,
                                                  initial_state=h0, store_v_new=stores,
                                                  store_h=stores)

        return export_modules(fn, *tok, s["tok_v"], s["mq"], s["e_all"], s["h0"])
    if kind == "k1":
        from pallas_kernels.common import channelwise_grad_mosaic_gpu as k1
        slab = int(arg or k1.SLAB)
        if slab not in KDA_SLABS:
            raise ValueError(f"k1 slab must be one of {KDA_SLABS}, got {slab}")

        def fn(q, k, kr, gamma, do, vn, dr, doc=None):
            return k1.channelwise_grad_intra_mosaic(q, k, kr, gamma, do, vn, dr, scale=0.1,
                                                    doc=doc, slab=slab, **abl)

        return export_modules(fn, *[s["tok_k"]] * 3, s["gamma"], *[s["tok_v"]] * 3, doc=doc)
    if kind in ("k2", "k2gdn2"):  # k2gdn2: GDN-2's per-channel fp32 ks
        from pallas_kernels.common import channelwise_grad_mosaic_gpu as k2
        slab = int(arg or k2.SLAB)
        if slab not in KDA_SLABS:
            raise ValueError(f"{kind} slab must be one of {KDA_SLABS}, got {slab}")
        if kind == "k2gdn2":
            s["ks"] = jax.ShapeDtypeStruct(s["gamma"].shape, jnp.float32)

        def fn(q, k, kr, ks, gamma, hs, dhs, do, vn, dr, doc=None):
            return k2.channelwise_grad_chunk_mosaic(q, k, kr, ks, gamma, hs, dhs, do, vn, dr,
                                                    scale=0.1, doc=doc, slab=slab, **abl)

        return export_modules(fn, *[s["tok_k"]] * 3, s["ks"], s["gamma"], s["states"],
                              s["states"], *[s["tok_v"]] * 3, doc=doc)
    if kind == "t0":
        from benchmarks import profile_t0
        from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu as kgd
        stages, _, inverse = arg.partition(":")
        k = jax.ShapeDtypeStruct((8, 4096, 16, 128), jnp.bfloat16)  # S1, as Sec. 14
        beta = jax.ShapeDtypeStruct((8, 4096, 16), jnp.float32)

        def fn(k, beta):
            return kgd.chunk_kkt_inverse_mosaic(k, beta, stages=stages,
                                                **profile_t0.kernel_options(inverse))

        return export_modules(fn, k, beta)
    raise ValueError(f"unknown kernel {name!r}")


def expand_kernels(names: Sequence[str]) -> List[str]:
    """``t0`` -> the nine H200 variants (``t0:<stages>:<inverse>``); others unchanged."""
    out = []
    for name in names:
        out.extend(f"t0:{v}" for v in H200_T0) if name == "t0" else out.append(name)
    return out


def render_row(name: str, rec: Dict, smem: Optional[int]) -> str:
    """One output line: name, registers, spill stores / loads, stack, SMEM, notes."""
    notes = []
    if rec.get("c7514"):
        notes.append("C7514")
    h200 = H200_T0.get(name[3:]) if name.startswith("t0:") else None
    if h200:
        notes.append(f"H200 12-04c: {h200[0]} regs, {h200[1]} B spill st")
    return (f"{name:<28} {rec['kernel']:<48} {rec['regs']:>4} {rec['spill_st']:>8} "
            f"{rec['spill_ld']:>8} {rec['stack']:>6} {smem if smem is not None else '?':>8}"
            f"  {'; '.join(notes)}")


HEADER = (f"{'entry':<28} {'kernel':<48} {'regs':>4} {'spill st':>8} {'spill ld':>8} "
          f"{'stack':>6} {'SMEM B':>8}  notes")


def _define_flags() -> None:
    """Defines the flags (only when run as a program)."""
    global _SITE, _CUDA_ROOT, _KERNELS, _BATCH, _SEQ_LEN, _HEADS, _DK, _DV, _DTYPE, _DOCS
    global _PTX_ISA, _OUT_DIR
    _SITE = flags.DEFINE_string("site", "/tmp/ptx-site", "Directory holding numba_cuda_mlir "
                                "(and nvidia/cuda_nvcc unless --cuda_root): pip install "
                                "--no-deps --target <site> numba-cuda-mlir==0.6.0 "
                                "nvidia-cuda-nvcc-cu12==12.9.86.")
    _CUDA_ROOT = flags.DEFINE_string("cuda_root", None, "CUDA root with bin/ptxas and "
                                     "nvvm/libdevice/libdevice.10.bc; default "
                                     "<site>/nvidia/cuda_nvcc.")
    _KERNELS = flags.DEFINE_list("kernels", list(DEFAULT_KERNELS), "Kernels (module "
                                 "docstring): state_fwd, state_fwd_nostore, state_bwd, "
                                 "k1:<16|32>[+ablation...], k2[:<16|32>][+ablation...], "
                                 "k2gdn2[:<16|32>][+ablation...], "
                                 "t0:<stages>:<inverse>, t0.")
    _BATCH = flags.DEFINE_integer("batch", 1, "Batch rows B (KDA kernels).")
    _SEQ_LEN = flags.DEFINE_integer("seq_len", 4096, "Tokens per row T (KDA kernels).")
    _HEADS = flags.DEFINE_integer("heads", 16, "Heads H (KDA kernels).")
    _DK = flags.DEFINE_integer("dk", 128, "Key head dim K.")
    _DV = flags.DEFINE_integer("dv", 128, "Value head dim V.")
    _DTYPE = flags.DEFINE_enum("dtype", "bfloat16", ["bfloat16", "float16"], "Operand dtype.")
    _DOCS = flags.DEFINE_bool("docs", True, "Pass document ids (doc) to K1 and K2.")
    _PTX_ISA = flags.DEFINE_integer("ptx_isa", 87, "PTX ISA version of the PTX (87: 8.7).")
    _OUT_DIR = flags.DEFINE_string("out_dir", None, "If set, keeps each kernel's Mosaic "
                                   "module, LLVM-dialect module, PTX, ptxas log and "
                                   "results.jsonl there.")


def main(argv: List[str]) -> None:
    del argv
    site = _SITE.value
    try:
        cuda_root = find_cuda_root(site, _CUDA_ROOT.value)
        load_mlir(site)
    except ToolchainError as e:
        raise app.UsageError(str(e)) from None
    ptxas = os.path.join(cuda_root, "bin", "ptxas")
    version = subprocess.run([ptxas, "--version"], capture_output=True, text=True).stdout
    version = re.search(r"release (\S+),", version)
    import jax
    print(f"offline ptxas, {CHIP}: jax {jax.__version__}, numba-cuda-mlir MLIR/LLVM, ptxas "
          f"{version.group(1) if version else '?'}; KDA shapes B={_BATCH.value} "
          f"T={_SEQ_LEN.value} H={_HEADS.value} K={_DK.value} V={_DV.value} {_DTYPE.value}"
          f"{' with docs' if _DOCS.value else ''}")
    print(HEADER, flush=True)
    out_dir = _OUT_DIR.value
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in expand_kernels(_KERNELS.value):
            texts = kernel_modules(name, batch=_BATCH.value, seq_len=_SEQ_LEN.value,
                                   heads=_HEADS.value, dk=_DK.value, dv=_DV.value,
                                   dtype=_DTYPE.value, docs=_DOCS.value)
            for i, text in enumerate(texts):
                stem = os.path.join(out_dir or tmp, re.sub(r"[^\w.-]", "_", name)
                                    + (f".{i}" if len(texts) > 1 else ""))
                if out_dir:
                    with open(stem + ".mosaic.mlir", "w") as f:
                        f.write(text)
                ptxs = module_to_ptx(text, site, cuda_root, _PTX_ISA.value,
                                     llvm_out=stem + ".llvm.mlir" if out_dir else None)
                for j, ptx in enumerate(ptxs):
                    recs, log = run_ptxas(ptxas, ptx, stem + (f".{j}" if j else "") + ".ptx")
                    if out_dir:
                        with open(stem + ".ptxas.log", "a") as f:
                            f.write(log)
                    for rec in recs:
                        rec.update(entry=name, smem_dynamic=dynamic_smem(text))
                        records.append(rec)
                        print(render_row(name, rec, rec["smem_dynamic"]), flush=True)
    if out_dir:
        with open(os.path.join(out_dir, "results.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)


if __name__ == "__main__":
    from lattn_jax import flag_errors  # one-line flag errors (absl only)
    _define_flags()
    app.run(main, flags_parser=flag_errors.parse_flags)
