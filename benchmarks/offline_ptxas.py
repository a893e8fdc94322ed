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
``--kernels=t0`` reruns that comparison (the H200's figures are printed beside ours). Fifteen
more kernels from the H200's logs of 12-04d to 12-04f (MOSAIC_GPU.md Sec. 23.1: the ``T0``
kernel at two shapes, ``dv_local``, the state passes, the split and two-warpgroup fused
``T0`` forwards): the same verdict in all, registers within 3, the same advisories; but the
fused ``T0`` forward spills 1.05 to 1.41 times the H200's bytes here, so the bytes are no
lower bound either (within about -35 % / +40 %).

What it cannot see: jaxlib 0.11.2's lowering on the GPU machine (ours is 0.10.2's) and the
exact LLVM of that jaxlib (the likely causes of the offsets above); runtime behaviour, bank
conflicts, occupancy. With ``setmaxnreg`` (warp-specialised kernels) "Used N registers" is
the launch allocation (65536 / threads, rounded down to 8: 168 at 384 threads) or, at 256
threads, the compute warpgroups' ``setmaxnreg`` budget (232), not each warpgroup's use. At
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
    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/offline_ptxas.py --site=/tmp/ptx-site \
        --kernels=all [--dk=64 --dv=64]                # every Mosaic GPU kernel (about 1 min)

Kernels (``--kernels``; default ``state_fwd,state_bwd,k1:32,k1:16,k2:32,k2:16``): ``state_fwd``
(``channelwise_forward_mosaic`` with ``v_new`` and ``h`` stored, the training forward),
``state_fwd_nostore`` (inference), ``state_bwd`` (``channelwise_backward_state_mosaic`` with
``dvn_in``), ``state_fwd_pieces[:<P>]`` / ``state_bwd_pieces[:<P>]`` (the same with ``P``
sequence pieces, default 4, at any shape: one line per launch, ``.maps``, ``.pieces``,
``.stored``; MOSAIC_GPU.md Sec. 30), ``k1:<slab>`` (``channelwise_grad_intra_mosaic``, slab
16 or 32), ``k2:<slab>`` (``channelwise_grad_chunk_mosaic``, KDA's per-token ``ks``; ``k2`` is
``k2:32``),
``k2gdn2:<slab>`` (the same with GDN-2's per-channel fp32 ``ks``),
``local`` / ``local:infer`` (``channelwise_local_mosaic``, the chunk-local forward with /
without ``A`` stored; MOSAIC_GPU.md Sec. 62),
``t0:<stages>:<inverse>`` (``chunk_kkt_inverse_mosaic`` at S1 with the Newton step) or
``t0`` (the nine H200 variants). ``k1`` and ``k2`` take stage ablations after ``+``
(``k1:32+no_band``, ``k2+no_mma+no_state``; MOSAIC_GPU.md Sec. 22), and so does
``gdn_wy_bwd`` (``gdn_wy_bwd+no_split``: ``chunk_wy_bwd_mosaic`` exported directly, ``H = Hk``,
with its ablation; MOSAIC_GPU.md Sec. 26). KDA shapes: ``--batch``,
``--seq_len``, ``--heads``, ``--dk``, ``--dv``, ``--dtype``, document ids unless ``--nodocs``
(the default is S1's B 8, T 4096, H 16; see "Shapes" below).

The ops' kernels (``--kernels=all`` runs them with the ones above, ``k2gdn2`` and the split
kernel's orders: :data:`ALL_KERNELS`) are exported through the differentiable ops' real call
paths, a training step (``jax.vjp`` of ``o`` and its backward, documents, no initial state, the
default ``TUNING``), each entry picking its kernels from that export; an entry that gives
several kernels prints one line per kernel, ``<entry>.<kernel>`` (``gla_fwd.states.2``: the
second module of that name, here the backward's recompute; a module already compiled is not
compiled again, its line says "same module as"). Simple GLA / Lightning / linear attention
(``simple_gla_mosaic``): ``gla_fwd`` (``forward="two_pass"``: ``chunk_states_mosaic``,
``chunk_output_mosaic``), ``gla_fused`` (``simple_gla_fused_fwd_mosaic``), ``gla_bwd``
(``chunk_dstates_mosaic``, ``chunk_grads_mosaic``). Gated DeltaNet / DeltaNet
(``gated_delta_rule_mosaic``): ``gdn_wy`` (``chunk_wy_mosaic``), ``gdn_delta_h``
(``chunk_delta_h_mosaic``), ``gdn_output`` (simple GLA's output kernel on ``v_new``),
``gdn_fused`` / ``gdn_fused_split`` (``chunk_delta_fused_fwd_mosaic``), ``gdn_t0``
(``chunk_kkt_inverse_mosaic`` with its defaults; in the training step its ``return_w`` form,
``_w``, MOSAIC_GPU.md Sec. 36; ``gdn_t0:infer`` the plain kernel), ``gdn_fused_t0`` /
``gdn_fused_t0_split`` (``chunk_delta_fused_t0_fwd_mosaic``), ``gdn_fused_rs:infer``
(``kernel_mosaic_gpu_rs``, the primal only; Sec. 56), ``gdn_fused_rs_res`` (its residual
form in the training step, ``mosaic_vjp.RS_RESIDUALS`` on: ``store_h``, ``store_v_new``;
Sec. 58; ``gdn_fused_rs_res_st`` with ``residual_from="state"``, Sec. 58.5, jax >= 0.11 only:
``offline_ptxas_jax011.py``), ``gdn_fused_rs_ah:infer`` / ``gdn_fused_rs_ah_s3:infer``
(``protocol="ag_ahead"``, two and three stages; ``gdn_fused_rs_s3:infer`` the default protocol
at three; Sec. 64), ``gdn_fused_rs_pieces:infer`` / ``gdn_fused_rs_pieces_res``
(``mosaic_vjp.RS_PIECES``: the same kernel as the sequence pieces' last launch, ``pieces=P``,
rows with few CTAs only, e.g. ``--batch=1 --seq_len=32768``; ``_res`` with ``RS_RESIDUALS`` in
the training step; Sec. 60), ``gdn_bwd_dv_local``, ``gdn_bwd_dh``
(``chunk_delta_dh_mosaic``), ``gdn_bwd_dh_fold`` / ``gdn_bwd_dh_fold_pieces`` (the same with
``dv_local="fold"``, three warpgroups: MOSAIC_GPU.md Sec. 32; the pieces' launch only at rows
with few CTAs, e.g. ``--batch=1 --seq_len=32768``), ``gdn_bwd_dh_fold_t0`` (the same with
``dh_w="t0"`` under ``forward="fused_t0"``: ``W`` formed from ``T0`` in the pass, Sec. 51),
``gdn_bwd_grads``
(``chunk_delta_grads_mosaic``), ``gdn_wy_bwd`` (``chunk_wy_bwd_mosaic``). Options after ``:``:
``infer`` (the primal alone: the fused GDN kernels then store neither ``h`` nor ``v_new``),
``nog`` (``g=None``: the same modules, the ops pass zero gates), and for
``gdn_fused_t0_split`` a ``split_order``, ``s3`` (``split_stages=3``), ``vk``
(``state_layout="vk"``, Sec. 35) and ``es`` (``split_protocol="early_s"``, Sec. 40):
``gdn_fused_t0_split:prepare_mid:s3``. ``k2gdn2``: K2
as GDN-2 calls it (``ks`` per channel, fp32 ``[B, T, H, K]``). ``--dk=64 --dv=64`` runs them
at K = V = 64; an entry the kernels do not take prints "not exported". Where the H200's ptxas
figures exist for an entry at the run's shape (:data:`H200_ENTRIES`), its line shows them.

Shapes: registers and spills barely depend on B, T and H, but not never. The ``T0`` kernel's
chunks per CTA follow ``B H`` (``kkt_chunks_per_cta``: 8 at S1, 1 at B 1; 222 registers
against 154), simple GLA's state passes split into pieces below 132 CTAs (more kernels at B 1),
and near the register cap the spill bytes move with the grid's constants alone (K2: 428 B at B
8, 376 at B 1; ``gdn_fused:infer`` 100 against 176). So the default is S1.
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
    that it serializes ``wgmma`` because other instructions read their accumulators).

    A block cut short (a log of a process stopped mid-compile, as ``benchmarks/gpu_tests.py``
    reads) gives ``None`` for the figures it lacks; the log may have other text around and
    between ptxas's lines (a test runner's)."""
    records = []
    for block in re.split(r"(?=ptxas info\s*: Compiling entry function)", log)[1:]:
        name = re.search(r"entry function '([^'\n]+)'", block)
        if not name:  # a line cut before the kernel's name
            continue
        frame = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, "
                          r"(\d+) bytes spill loads", block)
        used = re.search(r"Used (\d+) registers", block)
        smem = re.search(r"(\d+) bytes smem", block)
        name = name.group(1)
        records.append(dict(kernel=name, regs=int(used.group(1)) if used else None,
                            stack=int(frame.group(1)) if frame else None,
                            spill_st=int(frame.group(2)) if frame else None,
                            spill_ld=int(frame.group(3)) if frame else None,
                            smem_static=int(smem.group(1)) if smem else 0,
                            c7514=name in re.findall(r"\(C7514\)[^\n]*function '([^']+)'",
                                                     log)))
    return records


def advisories(log: str) -> Dict[str, Dict[str, int]]:
    """ptxas's numbered advisories per function in ``log``: ``{kernel: {code: count}}``, e.g.
    C7514 / C7512 (``wgmma`` serialized: accumulators read early / too few registers) and
    C7519 (``warpgroup.arrive`` injected to use registers in a ``wgmma``)."""
    out: Dict[str, Dict[str, int]] = {}
    for code, kernel in re.findall(r"\((C\d+)\)[^\n]*?function '([^']+)'", log):
        codes = out.setdefault(kernel, {})
        codes[code] = codes.get(code, 0) + 1
    return out


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
    if ablations and kind not in ("k1", "k2", "k2gdn2", "gdn_wy_bwd"):
        raise ValueError(f"{name!r}: only k1, k2 and gdn_wy_bwd take ablations")
    abl = dict(ablations=tuple(ablations)) if ablations else {}
    if kind in ("state_fwd", "state_fwd_nostore", "state_bwd", "state_fwd_pieces",
                "state_bwd_pieces"):
        from pallas_kernels.common import channelwise_mosaic_gpu as cwm
        tok = [s["tok_k"]] * 3
        # The sequence pieces' launches (MOSAIC_GPU.md Sec. 30): P = arg (default 4), each
        # row as P pieces whatever the shape (P must divide the chunk count).
        pieces = (int(arg) if arg else 4) if kind.endswith("_pieces") else 1

        def fn(qg, kg, w, u, mq, e_all, h0):
            if kind.startswith("state_bwd"):  # u stands for dO and dvn_in (same shape)
                return cwm.channelwise_backward_state_mosaic(
                    qg, kg, w, mq, e_all, u, scale=0.1, dvn_in=u, dht=h0, pieces=pieces)
            stores = kind in ("state_fwd", "state_fwd_pieces")
            return cwm.channelwise_forward_mosaic(qg, kg, w, u, mq, e_all, scale=0.1,
                                                  initial_state=h0, store_v_new=stores,
                                                  store_h=stores, pieces=pieces,
                                                  return_maps=pieces > 1)

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

        def fn(q, k, ks, gamma, hs, dhs, do, vn, dr, doc=None):  # K2 forms kr = k ks
            return k2.channelwise_grad_chunk_mosaic(q, k, ks, gamma, hs, dhs, do, vn, dr,
                                                    scale=0.1, doc=doc, slab=slab, **abl)

        return export_modules(fn, *[s["tok_k"]] * 2, s["ks"], s["gamma"], s["states"],
                              s["states"], *[s["tok_v"]] * 3, doc=doc)
    if kind == "local":  # the chunk-local forward (MOSAIC_GPU.md Sec. 62); :infer: no A
        from pallas_kernels.common import channelwise_local_mosaic_gpu as clm
        from pallas_kernels.common import pallas_gpu
        if arg not in ("", "infer"):
            raise ValueError(f"local takes no option but infer, got {arg!r}")
        tp = -(-seq_len // clm.CHUNK) * clm.CHUNK
        pad = dict(tok_k=(batch, tp, heads, dk), tok_v=(batch, tp, heads, dv),
                   gamma=(batch, tp, heads, dk), ks=(batch, tp, heads, 1))
        p = {n: jax.ShapeDtypeStruct(shape, s[n].dtype) for n, shape in pad.items()}

        def fn(q, k, v, ks, g, seg=None):
            docs = () if seg is None else pallas_gpu.docs_from_segment_ids(seg, tp)
            return clm.channelwise_local_mosaic(q, k, v, ks, ks, g, docs, save_a=arg != "infer")

        seg = None if doc is None else jax.ShapeDtypeStruct((batch, tp), jnp.int32)
        return export_modules(fn, p["tok_k"], p["tok_k"], p["tok_v"], p["ks"], p["gamma"],
                              seg=seg)
    if kind == "gdn_wy_bwd":  # only with ablations here (else the op's export has it)
        from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu_wy_bwd as kwb
        gate = jax.ShapeDtypeStruct(s["tok_k"].shape[:3], jnp.float32)

        def fn(k, v, g, beta, dw, du, seg=None):
            return kwb.chunk_wy_bwd_mosaic(k, v, g, beta, dw, du, segment_ids=seg, **abl)

        return export_modules(fn, s["tok_k"], s["tok_v"], gate, gate,
                              jax.ShapeDtypeStruct(s["tok_k"].shape, jnp.float32),
                              jax.ShapeDtypeStruct(s["tok_v"].shape, jnp.float32), seg=doc)
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
    """``t0`` -> the nine H200 variants (``t0:<stages>:<inverse>``), ``all`` ->
    :data:`ALL_KERNELS`; others unchanged."""
    out = []
    for name in names:
        if name == "all":
            out.extend(ALL_KERNELS)
            continue
        out.extend(f"t0:{v}" for v in H200_T0) if name == "t0" else out.append(name)
    return out


# ------------------------------------------------- the ops' kernels (GLA, GDN, GDN-2's K2)

# Kernel entries exported through the differentiable ops' real call paths (the training step:
# forward under jax.vjp, then the backward, as benchmarks/bench_kernels.py's fwdbwd with
# documents and no initial state). Each entry names the op configuration (``forward``) and the
# kernels of that export it reports (the Mosaic module's ``func.func @<kernel>_mosaic_gpu``;
# a name ending in "*" matches every kernel name starting with it).
OP_KERNELS = {
    # simple GLA / Lightning / linear attention (simple_gla_mosaic; Lightning's constant
    # decay is a g array too, linear attention is g=None: ":nog")
    "gla_fwd": ("gla", "two_pass", ("simple_gla_chunk_states", "simple_gla_chunk_output")),
    "gla_fused": ("gla", "fused", ("simple_gla_fused_fwd",)),
    "gla_bwd": ("gla", "two_pass", ("simple_gla_chunk_dstates", "simple_gla_chunk_grads")),
    # Gated DeltaNet / DeltaNet (gated_delta_rule_mosaic; DeltaNet is g=None: ":nog")
    "gdn_wy": ("gdn", "three_pass", ("gdn_chunk_wy",)),
    "gdn_delta_h": ("gdn", "three_pass", ("gdn_chunk_delta_h",)),
    "gdn_output": ("gdn", "three_pass", ("simple_gla_chunk_output",)),
    "gdn_fused": ("gdn", "fused", ("gdn_chunk_delta_fused_fwd",)),
    "gdn_fused_split": ("gdn", "fused_split", ("gdn_chunk_delta_fused_fwd_split",)),
    "gdn_t0": ("gdn", "fused_t0", ("gdn_chunk_kkt_inverse*",)),
    "gdn_fused_t0": ("gdn", "fused_t0", ("gdn_chunk_delta_fused_t0_fwd",)),
    "gdn_fused_t0_split": ("gdn", "fused_t0_split", ("gdn_chunk_delta_fused_t0_fwd_split*",)),
    # forward="fused_rs" (MOSAIC_GPU.md Sec. 56): the primal only, so with ":infer" (the
    # training step runs fused_t0 instead)
    "gdn_fused_rs": ("gdn", "fused_rs", ("gdn_chunk_delta_fused_rs_fwd*",)),
    # its residual form in the training step (mosaic_vjp.RS_RESIDUALS on, MOSAIC_GPU.md
    # Sec. 58): stores h and v_new, kernel ..._fused_rs_fwd_s2_res at K = 128
    "gdn_fused_rs_res": ("gdn", "fused_rs_res", ("gdn_chunk_delta_fused_rs_fwd*",)),
    # the primal with protocol="ag_ahead" (MOSAIC_GPU.md Sec. 64), two stages (PRIMAL_STAGES)
    # and three; "gdn_fused_rs_s3" the default protocol with three stages (":infer")
    "gdn_fused_rs_ah": ("gdn", "fused_rs_ah", ("gdn_chunk_delta_fused_rs_fwd*",)),
    "gdn_fused_rs_ah_s3": ("gdn", "fused_rs_ah_s3", ("gdn_chunk_delta_fused_rs_fwd*",)),
    "gdn_fused_rs_s3": ("gdn", "fused_rs_s3", ("gdn_chunk_delta_fused_rs_fwd*",)),
    # ... with residual_from="state" (Sec. 58.5: no staging tiles; lowers on jax >= 0.11 only)
    "gdn_fused_rs_res_st": ("gdn", "fused_rs_res_st", ("gdn_chunk_delta_fused_rs_fwd*",)),
    # fused_rs as the sequence pieces' last launch (mosaic_vjp.RS_PIECES, MOSAIC_GPU.md
    # Sec. 60; rows with few CTAs only, e.g. --batch=1 --seq_len=32768): the primal (":infer")
    # and, with RS_RESIDUALS, the residual form in the training step
    "gdn_fused_rs_pieces": ("gdn", "fused_rs_pieces", ("gdn_chunk_delta_fused_rs_fwd*",)),
    "gdn_fused_rs_pieces_res": ("gdn", "fused_rs_pieces_res",
                                ("gdn_chunk_delta_fused_rs_fwd*",)),
    # the fused T0 forward as sequence pieces (mosaic_vjp.FUSED_T0_PIECES, MOSAIC_GPU.md
    # Sec. 42): the summary pass and the pieces' stored pass; rows with few CTAs only (e.g.
    # --batch=1 --seq_len=32768), at S1 the plain kernel
    "gdn_fused_t0_pieces": ("gdn", "fused_t0_pieces", ("gdn_chunk_delta_fused_t0_fwd",
                                                       "gdn_chunk_delta_fused_t0_fwd_summary")),
    # their maps launch, and both launches with mosaic_vjp.PIECE_SKIP (documents: a piece
    # with a document start writes M_p = 0 without its chain, the summary starts at the
    # piece's last document start; MOSAIC_GPU.md Sec. 52)
    "gdn_fused_t0_pieces_maps": ("gdn", "fused_t0_pieces", ("gdn_chunk_delta_h_maps",)),
    "gdn_fused_t0_pieces_skip": ("gdn", "fused_t0_pieces_skip",
                                 ("gdn_chunk_delta_h_maps_skip",
                                  "gdn_chunk_delta_fused_t0_fwd_summary_skip")),
    # the maps and the passes from zero in one launch (mosaic_vjp.MAPS_CARRY_X, MOSAIC_GPU.md
    # Sec. 57: no summary launch), and with PIECE_SKIP
    "gdn_fused_t0_pieces_x": ("gdn", "fused_t0_pieces_x", ("gdn_chunk_delta_h_maps_x",)),
    "gdn_fused_t0_pieces_x_skip": ("gdn", "fused_t0_pieces_x_skip",
                                   ("gdn_chunk_delta_h_maps_x_skip",)),
    "gdn_bwd_dv_local": ("gdn", "three_pass", ("gdn_chunk_dv_local",)),
    "gdn_bwd_dh": ("gdn", "three_pass", ("gdn_chunk_delta_dh",)),
    # the sequence pieces' launches of both state passes (rows with few CTAs, e.g.
    # --batch=1 --seq_len=32768: MOSAIC_GPU.md Sec. 29); absent at S1
    "gdn_delta_h_pieces": ("gdn", "three_pass", ("gdn_chunk_delta_h_maps",
                                                 "gdn_chunk_delta_h_pieces")),
    "gdn_bwd_dh_pieces": ("gdn", "three_pass", ("gdn_chunk_delta_dh_pieces",)),
    "gdn_bwd_grads": ("gdn", "three_pass", ("gdn_chunk_grads",)),
    "gdn_wy_bwd": ("gdn", "three_pass", ("gdn_chunk_wy_bwd",)),
    # backward="fused": stages 3 and 4 in one kernel (MOSAIC_GPU.md Sec. 31, OP_BACKWARDS)
    "gdn_bwd_fused": ("gdn", "three_pass", ("gdn_chunk_bwd_fused",)),
    "gdn_bwd_fused_ws": ("gdn", "three_pass", ("gdn_chunk_bwd_fused_ws",)),
    # dv_local="fold": the reverse state pass forms dv_local (MOSAIC_GPU.md Sec. 32, OP_DV_LOCALS)
    "gdn_bwd_dh_fold": ("gdn", "three_pass", ("gdn_chunk_delta_dh_fold",)),
    "gdn_bwd_dh_fold_pieces": ("gdn", "three_pass", ("gdn_chunk_delta_dh_fold_pieces",)),
    # its launch with mosaic_vjp.PIECE_SKIP (from each piece's first document start down,
    # MOSAIC_GPU.md Sec. 52)
    "gdn_bwd_dh_fold_pieces_skip": ("gdn", "fused_t0_pieces_skip",
                                    ("gdn_chunk_delta_dh_fold_pieces_skip",)),
    # dh_w="t0": the folded pass forms W from T0 (MOSAIC_GPU.md Sec. 51, OP_DH_WS); the fused
    # T0 forward on whole rows, whose T0 kernel then writes no W
    "gdn_bwd_dh_fold_t0": ("gdn", "fused_t0", ("gdn_chunk_delta_dh_fold_t0",)),
}
# The backward= of gated_delta_rule_mosaic for the OP_KERNELS entries of one backward (its
# default is "fused_ws" since 2026-12-05, MOSAIC_GPU.md Sec. 31.8; stages 3 and 4 are "split"'s).
OP_BACKWARDS = {"gdn_bwd_fused": "fused", "gdn_bwd_fused_ws": "fused_ws",
                "gdn_bwd_grads": "split", "gdn_wy_bwd": "split"}
# The dv_local= of gated_delta_rule_mosaic for the OP_KERNELS entries of one reverse state pass
# (its default is "fold" since 2026-12-06, MOSAIC_GPU.md Sec. 32.2; the separate stage-1 kernel
# and the unfolded pass are "separate"'s).
OP_DV_LOCALS = {"gdn_bwd_dh_fold": "fold", "gdn_bwd_dh_fold_pieces": "fold",
                "gdn_bwd_dh_fold_pieces_skip": "fold",
                "gdn_bwd_dv_local": "separate", "gdn_bwd_dh": "separate",
                "gdn_bwd_dh_pieces": "separate"}
# The dh_w= of gated_delta_rule_mosaic for the OP_KERNELS entries that set it (its default is
# "stored"; MOSAIC_GPU.md Sec. 51).
OP_DH_WS = {"gdn_bwd_dh_fold_t0": "t0"}
# Options after ":" (any order): "infer" (the primal alone, as at inference: the fused GDN
# kernels then store neither h nor v_new), "nog" (g=None: linear attention, DeltaNet), and for
# gdn_fused_t0_split a split order of kernel_mosaic_gpu_fused.SPLIT_ORDERS, "s3" (three ring
# stages), "vk" (state_layout="vk": the state carried transposed, MOSAIC_GPU.md Sec. 35) and
# "es" (split_protocol="early_s": S_c announced on its own barrier, Sec. 40).
OP_OPTIONS = ("infer", "nog", "s3", "vk", "es")
# --kernels=all: every kernel in the ops' default configurations, plus the inference forwards
# of the fused GDN kernels, the split kernel's other orders and GDN-2's K2 (per-channel fp32
# ks). Not ":nog": with g=None the ops pass zero gates (mosaic_gpu_lib.chunk_cumsum), so DeltaNet
# and linear attention export the same Mosaic modules as GDN and simple GLA (checked 2026-12-05).
ALL_KERNELS = (
    "state_fwd", "state_fwd_nostore", "state_bwd", "k1:32", "k1:16", "k2:32", "k2:16",
    "k2gdn2:32", "k2gdn2:16", "local", "local:infer",
    "gla_fwd", "gla_fused", "gla_bwd",
    "gdn_wy", "gdn_delta_h", "gdn_output", "gdn_fused", "gdn_fused:infer", "gdn_fused_split",
    "gdn_t0", "gdn_t0:infer", "gdn_fused_t0", "gdn_fused_t0:infer", "gdn_fused_t0_split",
    "gdn_fused_t0_split:prepare_first", "gdn_fused_t0_split:prepare_mid:s3",
    "gdn_fused_t0_split:state_ag", "gdn_fused_t0_split:state_ag:s3",
    "gdn_bwd_dv_local", "gdn_bwd_dh", "gdn_bwd_grads", "gdn_wy_bwd", "gdn_bwd_fused",
    "gdn_bwd_fused_ws", "gdn_bwd_dh_fold")
# ptxas's figures on the H200 for entries of this binary (MOSAIC_GPU_DUMP_PTXAS logs under
# benchmarks/results/mosaic-gpu-h200-*; jax 0.11.2, bf16, K = V = 128): entry -> ((B, T, H),
# registers, spill store bytes, run) per shape measured. S1 is (8, 4096, 16); (2, 2048, 4) is
# bench_kernels' correctness gate (--gate_shape), which compiles before S1: the 12-04f logs
# hold the gate's kernels (its S1 forwards were cut by their timeout; the T0 kernel's 154
# registers are its one-chunk-per-CTA form, which S1's eight-chunk form is not; the state
# passes' may be S1's, the same here at both shapes). 12-04e ran
# the fused kernel alone, storing neither h nor v_new (profile_fwd.py), hence ":infer".
# The H200's 168 registers of the 384-thread kernels are setmaxnreg's launch allocation.
_S1, _GATE = (8, 4096, 16), (2, 2048, 4)
H200_ENTRIES = {
    "state_fwd": ((_GATE, 168, 0, "12-04f"),),
    "state_bwd": ((_GATE, 168, 0, "12-04f"),),
    # the plain T0 kernel (the training step's is the return_w form since Sec. 36: "_w")
    "gdn_t0:infer": ((_S1, 225, 0, "12-04d"), (_GATE, 154, 0, "12-04f")),
    "gdn_fused_t0:infer": ((_S1, 232, 184, "12-04e"),),
    "gdn_fused_t0_split": ((_GATE, 168, 0, "12-04f"),),
    "gdn_fused_t0_split:prepare_mid:s3": ((_GATE, 168, 0, "12-04f"),),
    "gdn_fused_t0_split:state_ag": ((_GATE, 168, 0, "12-04f"),),
    "gdn_fused_t0_split:state_ag:s3": ((_GATE, 168, 0, "12-04f"),),
    "gdn_bwd_dv_local": ((_GATE, 106, 0, "12-04f"),),
}


def h200_note(entry: str, batch: int, seq_len: int, heads: int, dk: int, dv: int) -> str:
    """The H200's figures for ``entry`` (:data:`H200_ENTRIES`) at this shape, or ``""``."""
    if (dk, dv) != (128, 128):
        return ""
    return "; ".join(f"H200 {run}: {regs} regs, {spill} B spill st"
                     for shape, regs, spill, run in H200_ENTRIES.get(entry, ())
                     if shape == (batch, seq_len, heads))


def module_kernel_name(module_text: str) -> Optional[str]:
    """The kernel's name in a Mosaic GPU module (``func.func @<name>_mosaic_gpu``, or
    ``sym_name = "<name>_mosaic_gpu"`` in the generic op form that ``offline_ptxas_jax011``
    captures)."""
    found = (re.search(r"func\.func @(\w+?)_mosaic_gpu\b", module_text)
             or re.search(r'"func\.func"\(\) <\{[^\n]*?sym_name = "(\w+?)_mosaic_gpu"',
                          module_text))
    return found.group(1) if found else None


def launch_threads(module_text: str) -> Optional[int]:
    """Threads per block of the module's ``gpu.launch`` (product of the three sizes), or
    ``None`` if they are not constants."""
    use = re.search(r"gpu\.launch\b[^\n]*threads\([^)]*\) in \(([^)]*)\)", module_text)
    if not use:
        return None
    total = 1
    for value in re.findall(r"= (%[\w.]+)", use.group(1)):
        define = re.search(re.escape(value) + r" = arith\.constant (\d+)", module_text)
        if not define:
            return None
        total *= int(define.group(1))
    return total


def setmaxnreg(ptx: str) -> List[str]:
    """The ``setmaxnreg`` requests in ``ptx``, e.g. ``["dec 40", "inc 232"]`` (sorted)."""
    return sorted(set(f"{m.group(1)} {m.group(2)}" for m in re.finditer(
        r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+)", ptx)))


def parse_op_entry(name: str) -> Tuple[str, str, Tuple[str, ...], Dict]:
    """``(op, forward, kernel patterns, options)`` of an :data:`OP_KERNELS` entry with its
    ``:`` options (``infer``, ``nog``, a split order, ``s3``, ``vk``, ``es``)."""
    from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu_fused as kfused
    base, *opts = name.split(":")
    if base not in OP_KERNELS:
        raise ValueError(f"unknown kernel {name!r}")
    op, forward, patterns = OP_KERNELS[base]
    options: Dict = dict(infer=False, nog=False, split={})
    for opt in opts:
        if opt in ("infer", "nog"):
            options[opt] = True
        elif base == "gdn_fused_t0_split" and opt in kfused.SPLIT_ORDERS:
            options["split"]["split_order"] = opt
        elif base == "gdn_fused_t0_split" and opt == "s3":
            options["split"]["split_stages"] = 3
        elif base == "gdn_fused_t0_split" and opt == "vk":
            options["split"]["state_layout"] = "vk"
        elif base == "gdn_fused_t0_split" and opt == "es":
            options["split"]["split_protocol"] = "early_s"
        else:
            raise ValueError(f"{name!r}: unknown option {opt!r} (options: {OP_OPTIONS}, and "
                             f"for gdn_fused_t0_split {kfused.SPLIT_ORDERS})")
    if options["infer"] and "_bwd" in base:
        raise ValueError(f"{name!r}: a backward kernel has no inference form")
    return op, forward, patterns, options


def _matches(kernel: Optional[str], patterns: Sequence[str]) -> bool:
    return kernel is not None and any(
        kernel.startswith(p[:-1]) if p.endswith("*") else kernel == p for p in patterns)


def op_export(op: str, forward: str, *, infer: bool = False, nog: bool = False,
              split: Optional[Dict] = None, batch: int = 8, seq_len: int = 4096,
              heads: int = 16, dk: int = 128, dv: int = 128, dtype: str = "bfloat16",
              docs: bool = True, kv_heads: Optional[int] = None,
              backward: Optional[str] = None, dv_local: Optional[str] = None,
              dh_w: Optional[str] = None) -> List[str]:
    """The Mosaic GPU modules of one op configuration, exported through the op: the training
    step (``jax.vjp`` of ``o``, then its backward with a cotangent ``do``) or, with ``infer``,
    the primal alone. ``op``: ``"gla"`` (``simple_gla_mosaic``) or ``"gdn"``
    (``gated_delta_rule_mosaic``); ``split``: ``SPLIT_T0_OPTIONS`` for the export;
    ``kv_heads``: ``Hk`` of ``q, k`` ``[B, T, Hk, K]`` (GVA, ``gdn`` only; ``None``: ``H``);
    ``backward``, ``dv_local``, ``dh_w``: ``gated_delta_rule_mosaic``'s ``backward=``,
    ``dv_local=`` and ``dh_w=`` (``gdn`` only; ``None``: its default)."""
    import jax
    import jax.numpy as jnp
    from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu as kgd
    from pallas_kernels.gated_delta_rule import mosaic_vjp
    from pallas_kernels.simple_gla import kernel_mosaic_gpu as sg
    # "fused_t0" with FUSED_T0_PIECES (Sec. 42), "_skip" also with PIECE_SKIP (Sec. 52), "_x"
    # also with MAPS_CARRY_X (Sec. 57)
    skip = forward in ("fused_t0_pieces_skip", "fused_t0_pieces_x_skip")
    carry_x = forward in ("fused_t0_pieces_x", "fused_t0_pieces_x_skip")
    pieces = forward in ("fused_t0_pieces", "fused_t0_pieces_skip", "fused_t0_pieces_x",
                         "fused_t0_pieces_x_skip")
    forward = "fused_t0" if pieces else forward
    # fused_rs on the sequence pieces (RS_PIECES, Sec. 60), "_res" with RS_RESIDUALS
    rs_pieces = forward in ("fused_rs_pieces", "fused_rs_pieces_res")
    pieces = pieces or rs_pieces
    forward = {"fused_rs_pieces": "fused_rs",
               "fused_rs_pieces_res": "fused_rs_res"}.get(forward, forward)
    rs_res = forward in ("fused_rs_res", "fused_rs_res_st")  # RS_RESIDUALS (Sec. 58)
    rs_from = {"residual_from": "state"} if forward == "fused_rs_res_st" else {}
    # RS_OPTIONS of the primal's timing variants (Sec. 64): protocol and ring depth
    rs_from.update({"fused_rs_ah": dict(protocol="ag_ahead"),
                    "fused_rs_ah_s3": dict(protocol="ag_ahead", stages=3),
                    "fused_rs_s3": dict(stages=3)}.get(forward, {}))
    forward = "fused_rs" if rs_res or forward.startswith("fused_rs_") else forward
    spec = jax.ShapeDtypeStruct
    dt = jnp.dtype(dtype)
    qk = spec((batch, seq_len, kv_heads or heads, dk), dt)
    tok_v = spec((batch, seq_len, heads, dv), dt)
    gate = spec((batch, seq_len, heads), jnp.float32)
    seg = spec((batch, seq_len), jnp.int32) if docs else None

    def primal(q, k, v, g, beta, seg):
        g = None if nog else g
        if op == "gla":
            return sg.simple_gla_mosaic(q, k, v, g, segment_ids=seg, forward=forward)[0]
        return mosaic_vjp.gated_delta_rule_mosaic(
            q, k, v, g, beta, segment_ids=seg, forward=forward,
            **({} if backward is None else dict(backward=backward)),
            **({} if dv_local is None else dict(dv_local=dv_local)),
            **({} if dh_w is None else dict(dh_w=dh_w)))[0]

    def step(q, k, v, g, beta, do, seg=None):
        if infer:
            return primal(q, k, v, g, beta, seg)
        o, vjp = jax.vjp(lambda *a: primal(*a, seg), q, k, v, g, beta)
        return o, vjp(do)

    saved = dict(kgd.SPLIT_T0_OPTIONS)
    kgd.SPLIT_T0_OPTIONS.clear()
    kgd.SPLIT_T0_OPTIONS.update(split or {})
    # the forward named, also on rows where the op would run a fused T0 forward as three_pass
    # (mosaic_vjp.resolve_forward, MOSAIC_GPU.md Sec. 36), or as sequence pieces (Sec. 42)
    fallback, mosaic_vjp.FUSED_T0_FALLBACK = mosaic_vjp.FUSED_T0_FALLBACK, pieces
    as_pieces, mosaic_vjp.FUSED_T0_PIECES = mosaic_vjp.FUSED_T0_PIECES, pieces
    piece_skip, mosaic_vjp.PIECE_SKIP = mosaic_vjp.PIECE_SKIP, skip
    maps_x, mosaic_vjp.MAPS_CARRY_X = mosaic_vjp.MAPS_CARRY_X, carry_x
    rs_residuals, mosaic_vjp.RS_RESIDUALS = mosaic_vjp.RS_RESIDUALS, rs_res
    rs_as_pieces, mosaic_vjp.RS_PIECES = mosaic_vjp.RS_PIECES, rs_pieces
    rs_options = dict(mosaic_vjp.RS_OPTIONS)
    mosaic_vjp.RS_OPTIONS.update(rs_from)
    try:
        return export_modules(step, qk, qk, tok_v, gate, gate, tok_v, seg=seg)
    finally:
        kgd.SPLIT_T0_OPTIONS.clear()
        kgd.SPLIT_T0_OPTIONS.update(saved)
        mosaic_vjp.FUSED_T0_FALLBACK = fallback
        mosaic_vjp.FUSED_T0_PIECES = as_pieces
        mosaic_vjp.PIECE_SKIP = piece_skip
        mosaic_vjp.MAPS_CARRY_X = maps_x
        mosaic_vjp.RS_RESIDUALS = rs_residuals
        mosaic_vjp.RS_PIECES = rs_as_pieces
        mosaic_vjp.RS_OPTIONS.clear()
        mosaic_vjp.RS_OPTIONS.update(rs_options)


_EXPORTS: Dict = {}


def entry_modules(name: str, *, batch: int = 8, seq_len: int = 4096, heads: int = 16,
                  dk: int = 128, dv: int = 128, dtype: str = "bfloat16",
                  docs: bool = True, kv_heads: Optional[int] = None) -> List[Tuple[str, str]]:
    """``(label, Mosaic module)`` for every kernel of one ``--kernels`` entry: the
    :data:`OP_KERNELS` entries (one export per op configuration, cached, each kernel
    labelled ``<entry>.<kernel>`` when it gives several), and the rest through
    :func:`kernel_modules` (labelled by the entry, ``.<i>`` when it gives several).
    ``kv_heads`` (GVA): the ops' ``Hk``, only for the :data:`OP_KERNELS` entries."""
    shape = dict(batch=batch, seq_len=seq_len, heads=heads, dk=dk, dv=dv, dtype=dtype,
                 docs=docs)
    if kv_heads and kv_heads != heads:
        if name.split(":")[0] not in OP_KERNELS:
            raise ValueError(f"{name!r}: --kv_heads only for the ops' entries")
        shape["kv_heads"] = kv_heads
    if name.split(":")[0] not in OP_KERNELS:
        texts = kernel_modules(name, **shape)
        if name.split(":")[0] in ("state_fwd_pieces", "state_bwd_pieces"):  # by launch
            return [(f"{name}." + {"maps": "maps", "pieces": "pieces"}.get(
                (module_kernel_name(t) or "").rsplit("_", 1)[-1], "stored"), t) for t in texts]
        return [(name + (f".{i}" if len(texts) > 1 else ""), t) for i, t in enumerate(texts)]
    op, forward, patterns, options = parse_op_entry(name)
    backward = OP_BACKWARDS.get(name.split(":")[0])
    dv_local = OP_DV_LOCALS.get(name.split(":")[0])
    dh_w = OP_DH_WS.get(name.split(":")[0])
    key = (op, forward, options["infer"], options["nog"],
           tuple(sorted(options["split"].items())), tuple(sorted(shape.items())), backward,
           dv_local, dh_w)
    if key not in _EXPORTS:
        _EXPORTS[key] = op_export(op, forward, infer=options["infer"], nog=options["nog"],
                                  split=options["split"], backward=backward, dv_local=dv_local,
                                  dh_w=dh_w, **shape)
    picked = [(module_kernel_name(t), t) for t in _EXPORTS[key]]
    picked = [(k, t) for k, t in picked if _matches(k, patterns)]
    if not picked:
        raise ValueError(f"{name!r}: no kernel matching {patterns} in the export")
    if len(picked) == 1:
        return [(name, picked[0][1])]
    counts: Dict[str, int] = {}
    out = []
    for kernel, text in picked:
        counts[kernel] = counts.get(kernel, 0) + 1
        n = counts[kernel]
        short = re.sub(r"^(simple_gla_chunk_|simple_gla_|gdn_chunk_|gdn_)", "", kernel)
        out.append((f"{name}.{short}" + (f".{n}" if n > 1 else ""), text))
    return out


def render_row(name: str, rec: Dict, smem: Optional[int]) -> str:
    """One output line: name, kernel, threads, registers, spill stores / loads, stack, SMEM,
    notes (ptxas's advisories such as C7514, ``setmaxnreg``, the H200's figures where
    known)."""
    notes = []
    if rec.get("advisories"):
        notes.append(" ".join(code + (f" x{n}" if n > 1 else "")
                              for code, n in sorted(rec["advisories"].items())))
    elif rec.get("c7514"):
        notes.append("C7514")
    if rec.get("setmaxnreg"):
        notes.append("setmaxnreg " + " / ".join(rec["setmaxnreg"]))
    h200 = H200_T0.get(name[3:]) if name.startswith("t0:") else None
    if h200:
        notes.append(f"H200 12-04c: {h200[0]} regs, {h200[1]} B spill st")
    if rec.get("h200"):
        notes.append(rec["h200"])
    threads = rec.get("threads")
    return (f"{name:<36} {rec['kernel']:<58} {threads if threads else '?':>4} "
            f"{rec['regs']:>4} {rec['spill_st']:>8} {rec['spill_ld']:>8} {rec['stack']:>6} "
            f"{smem if smem is not None else '?':>8}  {'; '.join(notes)}")


HEADER = (f"{'entry':<36} {'kernel':<58} {'thr':>4} {'regs':>4} {'spill st':>8} "
          f"{'spill ld':>8} {'stack':>6} {'SMEM B':>8}  notes")


def _define_flags() -> None:
    """Defines the flags (only when run as a program)."""
    global _SITE, _CUDA_ROOT, _KERNELS, _BATCH, _SEQ_LEN, _HEADS, _DK, _DV, _DTYPE, _DOCS
    global _PTX_ISA, _OUT_DIR, _KV_HEADS
    _SITE = flags.DEFINE_string("site", "/tmp/ptx-site", "Directory holding numba_cuda_mlir "
                                "(and nvidia/cuda_nvcc unless --cuda_root): pip install "
                                "--no-deps --target <site> numba-cuda-mlir==0.6.0 "
                                "nvidia-cuda-nvcc-cu12==12.9.86.")
    _CUDA_ROOT = flags.DEFINE_string("cuda_root", None, "CUDA root with bin/ptxas and "
                                     "nvvm/libdevice/libdevice.10.bc; default "
                                     "<site>/nvidia/cuda_nvcc.")
    _KERNELS = flags.DEFINE_list("kernels", list(DEFAULT_KERNELS), "Kernels (module "
                                 "docstring): state_fwd, state_fwd_nostore, state_bwd, "
                                 "state_fwd_pieces[:<P>], state_bwd_pieces[:<P>], "
                                 "k1:<16|32>[+ablation...], k2[:<16|32>][+ablation...], "
                                 "k2gdn2[:<16|32>][+ablation...], local[:infer], "
                                 "gdn_wy_bwd+ablation[+ablation...], "
                                 "t0:<stages>:<inverse>, t0, the ops' kernels (gla_*, gdn_*, "
                                 "with :options), all.")
    _BATCH = flags.DEFINE_integer("batch", 8, "Batch rows B (all but t0, fixed at S1).")
    _SEQ_LEN = flags.DEFINE_integer("seq_len", 4096, "Tokens per row T (all but t0).")
    _HEADS = flags.DEFINE_integer("heads", 16, "Heads H (all but t0).")
    _KV_HEADS = flags.DEFINE_integer("kv_heads", None, "Key heads Hk of the ops' q, k (GVA: "
                                     "H / Hk value heads per key head; the gdn_* entries); "
                                     "default H.")
    _DK = flags.DEFINE_integer("dk", 128, "Key head dim K.")
    _DV = flags.DEFINE_integer("dv", 128, "Value head dim V.")
    _DTYPE = flags.DEFINE_enum("dtype", "bfloat16", ["bfloat16", "float16"], "Operand dtype.")
    _DOCS = flags.DEFINE_bool("docs", True, "Pass document ids (doc, segment_ids) to K1, K2 "
                              "and the ops.")
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
          f"{version.group(1) if version else '?'}; shapes B={_BATCH.value} "
          f"T={_SEQ_LEN.value} H={_HEADS.value} Hk={_KV_HEADS.value or _HEADS.value} "
          f"K={_DK.value} V={_DV.value} {_DTYPE.value}"
          f"{' with docs' if _DOCS.value else ''}")
    print(HEADER, flush=True)
    out_dir = _OUT_DIR.value
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
    records = []
    seen: Dict[str, Tuple[str, List[Dict]]] = {}  # module text -> (label, its records)
    shape = dict(batch=_BATCH.value, seq_len=_SEQ_LEN.value, heads=_HEADS.value, dk=_DK.value,
                 dv=_DV.value, dtype=_DTYPE.value, docs=_DOCS.value)
    with tempfile.TemporaryDirectory() as tmp:
        for name in expand_kernels(_KERNELS.value):
            try:
                labelled = entry_modules(name, kv_heads=_KV_HEADS.value, **shape)
            except ValueError as e:  # e.g. a head dim or option the kernel does not take
                if re.search(r"unknown kernel|unknown option|no inference form", str(e)):
                    raise
                print(f"{name:<36} not exported: {str(e).splitlines()[0][:160]}", flush=True)
                continue
            for label, text in labelled:
                if text in seen:  # the same kernel as an earlier entry: not compiled again
                    for rec in seen[text][1]:
                        rec = dict(rec, entry=label, same_as=seen[text][0],
                                   h200=h200_note(name, _BATCH.value, _SEQ_LEN.value,
                                                  _HEADS.value, _DK.value, _DV.value))
                        records.append(rec)
                        print(render_row(label, rec, rec["smem_dynamic"])
                              + f"; same module as {seen[text][0]}", flush=True)
                    continue
                stem = os.path.join(out_dir or tmp, re.sub(r"[^\w.-]", "_", label))
                if out_dir:
                    with open(stem + ".mosaic.mlir", "w") as f:
                        f.write(text)
                ptxs = module_to_ptx(text, site, cuda_root, _PTX_ISA.value,
                                     llvm_out=stem + ".llvm.mlir" if out_dir else None)
                mine = []
                for j, ptx in enumerate(ptxs):
                    recs, log = run_ptxas(ptxas, ptx, stem + (f".{j}" if j else "") + ".ptx")
                    if out_dir:
                        with open(stem + ".ptxas.log", "a") as f:
                            f.write(log)
                    for rec in recs:
                        rec.update(entry=label, smem_dynamic=dynamic_smem(text),
                                   threads=launch_threads(text), setmaxnreg=setmaxnreg(ptx),
                                   advisories=advisories(log).get(rec["kernel"], {}),
                                   h200=h200_note(name, _BATCH.value, _SEQ_LEN.value,
                                                  _HEADS.value, _DK.value, _DV.value))
                        mine.append(rec)
                        records.append(rec)
                        print(render_row(label, rec, rec["smem_dynamic"]), flush=True)
                seen[text] = (label, mine)
    if out_dir:
        with open(os.path.join(out_dir, "results.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)


if __name__ == "__main__":
    from lattn_jax import flag_errors  # one-line flag errors (absl only)
    _define_flags()
    app.run(main, flags_parser=flag_errors.parse_flags)
