r"""Registers, spills and shared memory of the Pallas GPU kernels on the H200, without a GPU.

Method: the op is exported for CUDA with ``jax.export`` (``platforms=("cuda",)``; it works on
CPU-only hosts: the forward, or the forward plus its VJP). Every Pallas kernel in the exported
StableHLO is a ``__gpu$xla.gpu.triton`` custom call (jaxlib <= 0.10.2) whose backend config
carries the kernel's Triton IR (``tt`` dialect, as MLIR bytecode) and its ``num_warps`` and
``num_stages``. The bytecode is parsed with jaxlib's bundled MLIR (Triton dialect registered),
written out as TTIR text and compiled by the pip ``triton`` package for
``GPUTarget("cuda", 90, 32)`` (PTX for sm_90a) with those launch parameters. ``ptxas -v
--gpu-name=sm_90a`` on that PTX (default optimisation level) gives registers per thread and
the spill bytes; shared memory is Triton's dynamic allocation (``metadata.shared``). Only the
shapes and dtypes matter, so no input values are made.

Needs: jax/jaxlib 0.10.2 (the version that still emits ``__gpu$xla.gpu.triton``; later
jaxlibs compile Triton at lowering time) plus ``pip install triton`` (tested: 3.4.0, 3.6.0 and
3.9.0; each wheel ships its own ptxas: 12.8 in 3.4, 12.9 in 3.6, 13.x in 3.9 for sm_90) and
absl-py, in one environment. If ``--ptxas`` is older than the PTX version Triton emits, the
``.version`` line is lowered to what that ptxas accepts.

Limits: the numbers are the pip Triton's TTIR -> TTGIR -> LLVM -> PTX pipeline plus that
ptxas, not the Triton XLA/jaxlib bundles and the ptxas it runs on the device, so take them as
an estimate for comparing variants of a kernel rather than as the device's exact figures
(across Triton 3.4/3.6/3.9 the GDN forward's spill stores ranged 336-604 bytes). A
``wgmma serialized`` note means ptxas reported (C7512) that register pressure serialised the
Hopper wgmma instructions.

Usage::

    python benchmarks/kernel_registers.py --op=gdn --shape=8,4096,16,128 --pass=fwdbwd
    python benchmarks/kernel_registers.py --op=kda --shape=8,4096,16,128   # or gdn2, deltanet
    python benchmarks/kernel_registers.py --tuning='{"backward_chunk": [8, 2]}'
"""

import json
import os
import re
import subprocess
import sys
import tempfile

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton's default; silences a warning
os.environ.setdefault("JAX_PLATFORMS", "cpu")  # lowering without a GPU targets sm_90

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax._src.interpreters import mlir as jax_mlir  # noqa: E402
from jax._src.lib.mlir import ir  # noqa: E402
from jaxlib.triton import dialect as tt_dialect  # noqa: E402

from pallas_kernels.common import channelwise_gpu  # noqa: E402
from pallas_kernels.gated_delta_rule import kernel_gpu  # noqa: E402
from pallas_kernels.gdn2 import kernel_gpu as gdn2_kernel_gpu  # noqa: E402

CAPABILITY = 90  # H200 (sm_90a)

_OP = flags.DEFINE_enum("op", "gdn", ["gdn", "deltanet", "kda", "gdn2"],
                        "Op whose kernels to compile.")
_SHAPE = flags.DEFINE_list("shape", ["8", "4096", "16", "128"], "B,T,H,D of q, k and v.")
_PASS = flags.DEFINE_enum("pass", "fwdbwd", ["fwd", "fwdbwd"], "Forward, or forward + VJP.")
_SEGMENTS = flags.DEFINE_bool(
    "segments", False, "kda and gdn2: with int32 segment_ids [B, T] (packed documents, the "
    "benchmark's P1), so the kernels compile their document-mask paths.")
_SPLIT = flags.DEFINE_bool("split_forward", None,
                           "Override kernel_gpu.TUNING['split_forward'] (default: as set).")
_PTXAS = flags.DEFINE_string("ptxas", None, "ptxas binary (default: the one pip triton uses).")
_TUNING = flags.DEFINE_string(
    "tuning", None, "JSON overrides of the op's kernel-module TUNING, e.g. "
    "'{\"backward_chunk\": [8, 1], \"block_k\": 64}' (launches as [num_warps, num_stages]).")


def gdn(shape, with_vjp):
    """``(function, argument specs)`` of GDN: bf16 q, k, v ``[B, T, H, D]``, fp32 g, beta."""
    b, t, h, d = shape
    specs = ([jax.ShapeDtypeStruct((b, t, h, d), jnp.bfloat16)] * 3
             + [jax.ShapeDtypeStruct((b, t, h), jnp.float32)] * 2)

    def fwd(q, k, v, g, beta):
        return kernel_gpu.scalar_decay_pallas(q, k, v, g, beta, scale=d ** -0.5)[0]

    return _with_vjp(fwd, with_vjp), specs


def deltanet(shape, with_vjp):
    """DeltaNet (the scalar kernels without decay, ``g=None``): bf16 q, k, v, fp32 beta."""
    b, t, h, d = shape
    specs = ([jax.ShapeDtypeStruct((b, t, h, d), jnp.bfloat16)] * 3
             + [jax.ShapeDtypeStruct((b, t, h), jnp.float32)])

    def fwd(q, k, v, beta):
        return kernel_gpu.scalar_decay_pallas(q, k, v, None, beta, scale=d ** -0.5)[0]

    return _with_vjp(fwd, with_vjp), specs


def _with_vjp(fwd, with_vjp):
    def fwdbwd(*args):
        o, vjp = jax.vjp(fwd, *args)
        return vjp(o) + (o,)

    return fwdbwd if with_vjp else fwd


def _seg_specs(b, t):
    """``[int32 segment_ids [B, T]]`` with ``--segments``, else ``[]``."""
    return [jax.ShapeDtypeStruct((b, t), jnp.int32)] if _SEGMENTS.value else []


def _seg_kwargs(seg):
    """The op's ``segment_ids`` keyword for the traced ``seg`` (``()`` or ``(segment_ids,)``)."""
    return dict(segment_ids=seg[0]) if seg else {}


def kda(shape, with_vjp):
    """KDA (per-channel decay): bf16 q, k, v ``[B, T, H, D]``, fp32 g ``[B, T, H, D]``, beta."""
    b, t, h, d = shape
    specs = ([jax.ShapeDtypeStruct((b, t, h, d), jnp.bfloat16)] * 3
             + [jax.ShapeDtypeStruct((b, t, h, d), jnp.float32),
                jax.ShapeDtypeStruct((b, t, h), jnp.float32)])

    def fwd(q, k, v, g, beta, *seg):
        return channelwise_gpu.channelwise_delta_pallas(q, k, v, g, beta, beta,
                                                        scale=d ** -0.5, **_seg_kwargs(seg))[0]

    return _with_vjp(fwd, with_vjp), specs + _seg_specs(b, t)


def gdn2(shape, with_vjp):
    """GDN-2: bf16 q, k, v ``[B, T, H, D]``, fp32 g, b (erase), w (write) ``[B, T, H, D]``."""
    b, t, h, d = shape
    specs = ([jax.ShapeDtypeStruct((b, t, h, d), jnp.bfloat16)] * 3
             + [jax.ShapeDtypeStruct((b, t, h, d), jnp.float32)] * 3)

    def fwd(q, k, v, g, b_, w, *seg):
        return gdn2_kernel_gpu.gdn2_pallas(q, k, v, g, b_, w, scale=d ** -0.5,
                                           **_seg_kwargs(seg))[0]

    return _with_vjp(fwd, with_vjp), specs + _seg_specs(b, t)


OPS = {"gdn": gdn, "deltanet": deltanet, "kda": kda, "gdn2": gdn2}


def triton_calls(fn, specs):
    """``[(name, ttir_text, num_warps, num_stages)]`` of the Triton custom calls of ``fn``."""
    exported = jax.export.export(
        jax.jit(fn), platforms=["cuda"],
        disabled_checks=[jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")],
    )(*specs)
    ctx = jax_mlir.make_ir_context()
    tt_dialect.register_dialect(ctx)
    calls, seen = [], set()
    with ctx:
        module = ir.Module.parse(exported.mlir_module())

        def visit(op):
            if (op.name == "stablehlo.custom_call"
                    and "triton" in ir.StringAttr(op.attributes["call_target_name"]).value):
                if "mhlo.backend_config" not in op.attributes:
                    raise ValueError("Triton call without an IR (jaxlib > 0.10.2?)")
                cfg = ir.DictAttr(op.attributes["mhlo.backend_config"])
                code = ir.StringAttr(cfg["ir"]).value_bytes
                name = ir.StringAttr(cfg["name"]).value
                if (name, code) not in seen:
                    seen.add((name, code))
                    text = ir.Module.parse(code).operation.get_asm(enable_debug_info=False)
                    calls.append((name, text, ir.IntegerAttr(cfg["num_warps"]).value,
                                  ir.IntegerAttr(cfg["num_stages"]).value))
            return ir.WalkResult.ADVANCE

        module.operation.walk(visit)
    return calls


def default_ptxas():
    from triton.backends.nvidia import compiler as nv
    try:
        return nv.get_ptxas(CAPABILITY).path
    except TypeError:  # triton < 3.5
        return nv.get_ptxas().path


def run_ptxas(ptxas, ptx, workdir):
    """ptxas -v's log for ``ptx``; retries with an older ``.version`` if ptxas asks for one."""
    path = os.path.join(workdir, "kernel.ptx")
    for _ in range(2):
        with open(path, "w") as f:
            f.write(ptx)
        proc = subprocess.run([ptxas, "-v", f"--gpu-name=sm_{CAPABILITY}a", path, "-o",
                               path + ".o"], capture_output=True, text=True)
        old = re.search(r"Unsupported \.version \S+; current version is '(\S+)'", proc.stderr)
        if proc.returncode == 0 or not old:
            break
        ptx = re.sub(r"^\.version \S+", f".version {old.group(1)}", ptx, count=1, flags=re.M)
    if proc.returncode:
        raise RuntimeError(f"ptxas failed:\n{proc.stderr}")
    return proc.stderr


def compile_kernel(name, ttir, num_warps, num_stages, ptxas, workdir):
    """``{regs, spill_st, spill_ld, smem, note}`` of one kernel compiled for sm_90a."""
    import triton
    from triton.backends.compiler import GPUTarget

    path = os.path.join(workdir, f"{name}.ttir")
    with open(path, "w") as f:
        f.write(ttir)
    kernel = triton.compile(path, target=GPUTarget("cuda", CAPABILITY, 32),
                            options={"num_warps": num_warps, "num_stages": num_stages})
    log = run_ptxas(ptxas, kernel.asm["ptx"], workdir)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    return {"regs": int(re.search(r"Used (\d+) registers", log).group(1)),
            "spill_st": int(spills.group(1)), "spill_ld": int(spills.group(2)),
            "smem": kernel.metadata.shared,
            "note": "wgmma serialized" if "C7512" in log else ""}


def main(argv):
    del argv
    import triton

    if _SEGMENTS.value and _OP.value not in ("kda", "gdn2"):
        raise app.UsageError(f"--segments: only --op=kda or gdn2 take segment_ids here, not "
                             f"--op={_OP.value}")
    shape = tuple(int(s) for s in _SHAPE.value)
    fn, specs = OPS[_OP.value](shape, flags.FLAGS["pass"].value == "fwdbwd")
    module = kernel_gpu if _OP.value in ("gdn", "deltanet") else channelwise_gpu
    tuning = {} if _SPLIT.value is None else {"split_forward": _SPLIT.value}
    try:
        for key, value in json.loads(_TUNING.value or "{}").items():
            if key not in module.TUNING:
                raise app.UsageError(f"--tuning: {key!r} is not a TUNING key of "
                                     f"{module.__name__}; choose from {', '.join(module.TUNING)}")
            tuning[key] = tuple(value) if isinstance(value, list) else value
    except json.JSONDecodeError as e:
        raise app.UsageError(f"--tuning: not JSON ({e})") from None
    old = dict(module.TUNING)
    module.TUNING.update(tuning)
    try:
        calls = triton_calls(fn, specs)
    finally:
        module.TUNING.clear()
        module.TUNING.update(old)
    ptxas = _PTXAS.value or default_ptxas()
    version = subprocess.run([ptxas, "--version"], capture_output=True, text=True).stdout
    version = re.search(r"release (\S+),", version).group(1) if "release" in version else "?"
    print(f"{_OP.value} {flags.FLAGS['pass'].value} shape={shape} sm_{CAPABILITY}a "
          f"triton {triton.__version__}, ptxas {version}")
    header = ("kernel", "warps", "stages", "regs", "spill st B", "spill ld B", "smem B", "")
    row = "{:<28} {:>5} {:>6} {:>5} {:>10} {:>10} {:>8}  {}"
    print(row.format(*header))
    with tempfile.TemporaryDirectory() as workdir:
        for name, ttir, warps, stages in calls:
            r = compile_kernel(name, ttir, warps, stages, ptxas, workdir)
            print(row.format(name, warps, stages, r["regs"], r["spill_st"], r["spill_ld"],
                             r["smem"], r["note"]), flush=True)


if __name__ == "__main__":
    from lattn_jax import flag_errors  # one-line flag errors (absl only)
    app.run(main, flags_parser=flag_errors.parse_flags)
