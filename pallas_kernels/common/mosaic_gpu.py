"""Dispatch to the Pallas Mosaic GPU kernels (Hopper and newer), issue 29.

The ops whose kernels exist in Mosaic GPU (``plgpu``) form resolve ``implementation=`` here
first: the scalar-decay family (:mod:`pallas_kernels.simple_gla.kernel_mosaic_gpu`: simple
GLA, Lightning Attention, plain linear attention) and Gated DeltaNet / DeltaNet
(:mod:`pallas_kernels.gated_delta_rule.mosaic_vjp`). This is the one place that decides
between Mosaic GPU, the Pallas Triton kernels (:func:`pallas_kernels.common.pallas_gpu.
choose_implementation`, which A100-class GPUs keep using) and the chunked form. Each decision
is logged once per op and reason.

``None``/``"auto"`` picks ``"mosaic_gpu"`` when :data:`AUTO_SELECT` is on, the op is not in
:data:`AUTO_OFF` (ops whose Mosaic kernels are not yet timed faster than the Triton ones: an
explicit ``"mosaic_gpu"`` still runs them), the default backend
is a Hopper GPU (compute capability 9.x: the kernels are built on Hopper's ``wgmma``, which
sm_100 and newer GPUs do not have), ``q, k, v`` share a 16-bit dtype (wgmma has
no IEEE fp32), ``K`` and ``V`` are 64 or 128, the chunk size is 64 and ``T`` fills a chunk.
Otherwise it logs the reason and hands over to the Triton dispatch. An explicit
``"mosaic_gpu"`` that cannot run raises a ``ValueError`` with the reason.
``"mosaic_gpu_interpret"`` runs the same kernels in jax's Mosaic GPU interpret mode on any
backend. It is slow and meant for tests; ``pallas_kernels/common/MOSAIC_GPU.md`` lists its
caveats.

KDA and GDN-2 choose Mosaic GPU kernels inside their Pallas path instead, pass by pass
(``channelwise_gpu.TUNING["state_pass"]`` / ``["grad_pass"]``, or ``state_pass=`` /
``grad_pass=`` per call); :func:`resolve_pass` decides those by the same rules: a ``TUNING``
value falls back to the Triton kernels (logged) where an ``"auto"`` would, a per-call value
raises where an explicit ``"mosaic_gpu"`` would.

Measured (H200, Lightning, bf16, kernel time; ``benchmarks/results/
mosaic-gpu-h200-2026-12-02b.md``): forward+backward 1.51x faster than the Triton kernels at
S1 and 1.70x at S2/P1. The forward alone is 1.44x faster at S2/P1 but 0.76x at S1.
Gated DeltaNet (H100, bf16, kernel time; ``benchmarks/results/mosaic-gpu-h100-2026-12-06f.md``):
forward+backward 1.60x / 1.51x / 1.46x and forward 1.53x / 1.36x / 1.43x the Triton kernels'
speed at S1 / S2 / P1.
"""

from typing import Optional, Sequence

import jax
import jax.numpy as jnp

from pallas_kernels.common import pallas_gpu, validation

MOSAIC_IMPLEMENTATIONS = ("mosaic_gpu", "mosaic_gpu_interpret")
# "auto" tries the Mosaic GPU kernels first on Hopper-or-newer GPUs; off: straight to Triton.
AUTO_SELECT = True
# op name -> why "auto" does not pick its Mosaic GPU kernels yet (logged once); an explicit
# implementation="mosaic_gpu" runs them. Drop an entry when a Hopper GPU's same-run table
# (benchmarks/bench_kernels.py) times the op faster than its Triton kernels, fwd and fwd+bwd,
# at S1, S2 and P1, and its `gpu`-marked tests (benchmarks/gpu_tests.py) pass on that code.
# Gated DeltaNet left on 2026-12-06 (H100, benchmarks/results/mosaic-gpu-h100-2026-12-06f.md:
# fwd+bwd 1.60x / 1.51x / 1.46x, fwd 1.53x / 1.36x / 1.43x the Triton kernels' speed at S1 /
# S2 / P1; the 14 gpu tests of the op and its VJP passed).
_DELTANET_NOT_TIMED = (
    "DeltaNet's Mosaic GPU op (Gated DeltaNet's kernels without the decay) passes its gpu-marked "
    "tests but is not yet timed against its Triton kernels at S1, S2 and P1 (Gated DeltaNet's "
    "is, and is auto's choice: benchmarks/results/mosaic-gpu-h100-2026-12-06f.md)")
AUTO_OFF = {
    # DeltaNet: dispatched under its own name, so that delta_rule's errors and log lines name it.
    "delta_rule": _DELTANET_NOT_TIMED,
}
MIN_COMPUTE_CAPABILITY = (9, 0)
# The kernels use Hopper's wgmma (sm_90a); Blackwell (10.x, 12.x) has other tensor-core
# instructions (tcgen05), so the Mosaic GPU kernels are built and tested for 9.x only.
MAX_COMPUTE_MAJOR = 9
SUPPORTED_HEAD_DIMS = (64, 128)
KERNEL_CHUNK_SIZE = 64


def compute_capability() -> Optional[tuple]:
    """``(major, minor)`` of the first default-backend device when it is a CUDA GPU, else
    ``None`` (CPU, TPU, ROCm, or a device that does not report one)."""
    if jax.default_backend() != "gpu":
        return None
    cc = getattr(jax.devices()[0], "compute_capability", None)
    if not cc:
        return None
    try:
        major, minor = (int(x) for x in str(cc).split(".")[:2])
    except ValueError:
        return None
    return major, minor


def device_reason(interpret: bool) -> Optional[str]:
    """Why this machine cannot run the Mosaic GPU kernels, or ``None`` when it can: always
    under ``interpret`` (Mosaic GPU interpret mode runs on any backend), else when the default
    backend is a CUDA GPU of compute capability :data:`MIN_COMPUTE_CAPABILITY` (9.0) up to
    major :data:`MAX_COMPUTE_MAJOR` (Hopper, 9.x).
    """
    if interpret:
        return None
    cc = compute_capability()
    if cc is None:
        return (f"the Mosaic GPU kernels need a CUDA GPU, the default backend is "
                f"{jax.default_backend()!r}")
    if cc < MIN_COMPUTE_CAPABILITY or cc[0] > MAX_COMPUTE_MAJOR:
        return (f"the Mosaic GPU kernels need compute capability "
                f"{MIN_COMPUTE_CAPABILITY[0]}.x (Hopper; they are built on its wgmma, which "
                f"older GPUs and sm_100+ lack), this GPU has {cc[0]}.{cc[1]}")
    return None


def _half_dtype_reason(dtypes, what: str) -> Optional[str]:
    """``None`` when ``dtypes`` is one 16-bit float dtype, else why not (naming ``what``)."""
    dtypes = {jnp.dtype(d) for d in dtypes}
    half = {jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)}
    if len(dtypes) != 1 or not dtypes <= half:
        return (f"{what} dtypes {sorted(map(str, dtypes))} are not one 16-bit dtype (the "
                f"Mosaic GPU kernels' wgmma operands)")
    return None


def unsupported_reason(arrays: Sequence[jax.Array], head_dims: Sequence[int], chunk_size: int,
                       interpret: bool) -> Optional[str]:
    """Why the Mosaic GPU kernels cannot run this call, or ``None`` when they can.

    Args:
      arrays: ``q, k, v``: they must share one 16-bit dtype (the ``wgmma`` operands).
      head_dims: ``(K, V)``, each 64 or 128.
      chunk_size: the requested chunk size (the kernels use 64).
      interpret: whether the kernels run in Mosaic GPU interpret mode (any backend).
    """
    reason = device_reason(interpret)
    if reason is not None:
        return reason
    for d in head_dims:
        if d not in SUPPORTED_HEAD_DIMS:
            return f"head dim {d} is not one of the Mosaic GPU head dims {SUPPORTED_HEAD_DIMS}"
    if chunk_size != KERNEL_CHUNK_SIZE:
        return f"chunk_size={chunk_size}; the Mosaic GPU kernels use {KERNEL_CHUNK_SIZE}"
    return _half_dtype_reason([a.dtype for a in arrays], "q, k, v")


def choose_implementation(
    op: str,
    implementation: Optional[str],
    concrete: Sequence[str],
    arrays: Sequence[jax.Array],
    head_dims: Sequence[int],
    chunk_size: int,
    seq_len: int,
    *,
    auto_off_key: Optional[str] = None,
) -> str:
    """Resolves ``implementation=`` for an op that has Mosaic GPU kernels.

    Args and return as :func:`pallas_kernels.common.pallas_gpu.choose_implementation`, to
    which every case other than ``"mosaic_gpu"``, ``"mosaic_gpu_interpret"`` and a Mosaic
    GPU choice by ``"auto"`` is handed. ``auto_off_key`` (default ``op``) is the
    :data:`AUTO_OFF` entry that decides ``"auto"``: ``gated_delta_rule`` called with
    ``g=None`` runs DeltaNet's kernels and passes ``"delta_rule"``, while its log lines and
    errors keep naming ``op``.

    Raises:
      ValueError: for an unknown name, or a kernel implementation that cannot run this call,
        with the reason.
    """
    if implementation in MOSAIC_IMPLEMENTATIONS:
        reason = unsupported_reason(arrays, head_dims, chunk_size,
                                    interpret=implementation == "mosaic_gpu_interpret")
        return validation.require_runnable(op, implementation, reason, "'auto'")
    if implementation is None or implementation == "auto":
        if not AUTO_SELECT:
            reason = "mosaic_gpu.AUTO_SELECT is off"
        elif (auto_off_key or op) in AUTO_OFF:
            reason = AUTO_OFF[auto_off_key or op]
        else:
            reason = validation.auto_kernel_reason(
                unsupported_reason(arrays, head_dims, chunk_size, interpret=False), seq_len,
                KERNEL_CHUNK_SIZE)
        if reason is None:
            cc = compute_capability()
            validation.log_once(
                op, f"using the Mosaic GPU kernels (compute capability {cc[0]}.{cc[1]})")
            return "mosaic_gpu"
        if jax.default_backend() == "gpu":
            validation.log_once(op, f"not using the Mosaic GPU kernels: {reason}")
    elif implementation not in tuple(concrete) + pallas_gpu.PALLAS_IMPLEMENTATIONS:
        validation.resolve_implementation(
            implementation,
            tuple(concrete) + pallas_gpu.PALLAS_IMPLEMENTATIONS + MOSAIC_IMPLEMENTATIONS, op)
    return pallas_gpu.choose_implementation(op, implementation, concrete, arrays, head_dims,
                                            chunk_size, seq_len)


def resolve_pass(op: str, option: str, value: str, *, explicit: bool, dtype,
                 interpret: bool) -> str:
    """Resolves a per-pass switch that names Mosaic GPU kernels: KDA's and GDN-2's
    ``state_pass`` / ``grad_pass`` (:mod:`pallas_kernels.common.channelwise_gpu`, whose
    ``TUNING`` holds their defaults and whose ``channelwise_delta_pallas`` takes them per call).

    The Mosaic kernels run in interpret mode (any backend), or compiled on a Hopper GPU (compute
    capability 9.x, :func:`device_reason`); either way only with 16-bit operands (wgmma
    has no IEEE fp32 product). Otherwise the Triton kernels run, which A100-class GPUs keep:

    * fp32 (or mixed) operands take the Triton kernels whatever asked for Mosaic, with the
      reason logged once (the channelwise ops' documented contract: one switch serves a run
      whatever its dtypes).
    * A value from ``TUNING`` (``explicit=False``), a default meant for every GPU, falls back
      to ``"triton"`` on an older GPU (or without one), with the reason logged once, as
      ``implementation="auto"`` does in :func:`choose_implementation`.
    * A value passed per call (``explicit=True``) that this machine cannot run raises, as an
      explicit ``implementation="mosaic_gpu"`` does: the caller asked for Hopper kernels.

    Args:
      op: the function named in the log lines and the error (``"channelwise_delta_pallas"``).
      option: the switch, ``"state_pass"`` or ``"grad_pass"``.
      value: its value; ``"triton"`` is returned as is, any other names Mosaic GPU kernels
        (``"mosaic"``, ``"mosaic_fused"``; checked against the switch's values by the caller).
      explicit: whether the caller passed ``value`` (``True``) or it is ``TUNING``'s.
      dtype: the call's operand (matmul) dtype.
      interpret: whether the kernels run in interpret mode (Mosaic GPU interpret mode for the
        Mosaic ones).

    Returns:
      ``value`` where the Mosaic kernels can run this call, else ``"triton"``.

    Raises:
      UnsupportedImplementationError: (a ``ValueError``) for an explicit ``value`` outside
        interpret mode without a Hopper GPU (compute capability 9.x):
        ``"channelwise_delta_pallas: state_pass='mosaic' cannot run this call: the Mosaic GPU
        kernels need compute capability 9.x (Hopper; ...), this GPU has 8.0. Use
        state_pass='triton' (or None: TUNING's, which falls back to Triton where the Mosaic
        kernels cannot run)."``
    """
    if value == "triton":
        return value
    reason = _half_dtype_reason([dtype], "operand")
    if reason is None:
        reason = device_reason(interpret)
        if reason is not None and explicit:
            raise validation.UnsupportedImplementationError(
                f"{op}: {option}={value!r} cannot run this call: {reason}. Use "
                f"{option}='triton' (or None: TUNING's, which falls back to Triton where the "
                f"Mosaic kernels cannot run).")
    source = f"{option}={value!r}" if explicit else f"TUNING[{option!r}]={value!r}"
    if reason is not None:
        validation.log_once(op, f"{source}: using the Triton kernels: {reason}")
        return "triton"
    if not interpret:
        cc = compute_capability()
        validation.log_once(op, f"{source}: using the Mosaic GPU kernels (compute capability "
                                f"{cc[0]}.{cc[1]})")
    return value
