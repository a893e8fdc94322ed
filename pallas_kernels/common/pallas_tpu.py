"""Shared pieces of the Pallas TPU (Mosaic) kernels: dispatch, interpret mode and matmuls.

* :data:`TPU_IMPLEMENTATIONS`: the implementation name ``"pallas_tpu"``. On a TPU backend it
  compiles the kernels with Mosaic; on any other backend it runs the same kernels in Pallas TPU
  interpret mode (``pltpu.InterpretParams``), which simulates Mosaic's memory semantics on CPU
  (slow: tests and small shapes only).
* :func:`choose_implementation`: resolves an op's ``implementation=`` with the TPU kernels
  included. ``None``/``"auto"`` picks ``"pallas_tpu"`` on a TPU backend when
  :func:`unsupported_reason` finds nothing against the call; other backends are handed to a
  fallback resolver (the GPU dispatch, or plain name resolution).
* :func:`mm`, :func:`mm_nt`, :func:`mm_tn`: 2-D products with fp32 accumulation
  (``preferred_element_type=float32``); fp32 operands run at ``Precision.HIGHEST`` (full fp32 on
  the MXU), half-precision operands at the MXU's native bf16 rate.
"""

from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.common import validation

TPU_IMPLEMENTATIONS = ("pallas_tpu",)
SUPPORTED_HEAD_DIMS = (64, 128)
# Chunk sizes the TPU kernels accept: multiples of the 8-row sublane tile and of the 16-row
# blocks of the triangular inverse, small enough for a [C, C] fp32 tile in VMEM.
SUPPORTED_CHUNK_SIZES = (64, 128)
_HIGHEST = jax.lax.Precision.HIGHEST


def on_tpu() -> bool:
    """Whether JAX's default backend is a TPU."""
    return jax.default_backend() == "tpu"


def interpret_params():
    """``pl.pallas_call(interpret=...)``: ``False`` on a TPU, else TPU interpret mode."""
    return False if on_tpu() else pltpu.InterpretParams()


def compiler_params(dimension_semantics: Sequence[str]):
    """Mosaic ``CompilerParams`` with the grid's ``"parallel"``/``"arbitrary"`` axes."""
    return pltpu.CompilerParams(dimension_semantics=tuple(dimension_semantics))


def _dot(a, b, dims):
    precision = _HIGHEST if a.dtype == jnp.float32 else None
    return jax.lax.dot_general(
        a, b, (dims, ((), ())), precision=precision, preferred_element_type=jnp.float32
    )


def mm(a: jax.Array, b: jax.Array, dtype=jnp.float32) -> jax.Array:
    """``a @ b`` for ``a [M, K]``, ``b [K, N]``, operands cast to ``dtype``; fp32 result."""
    return _dot(a.astype(dtype), b.astype(dtype), ((1,), (0,)))


def mm_tn(a: jax.Array, b: jax.Array, dtype=jnp.float32) -> jax.Array:
    """``a^T @ b`` for ``a [K, M]``, ``b [K, N]``; fp32 result."""
    return _dot(a.astype(dtype), b.astype(dtype), ((0,), (0,)))


def mm_nt(a: jax.Array, b: jax.Array, dtype=jnp.float32) -> jax.Array:
    """``a @ b^T`` for ``a [M, K]``, ``b [N, K]``; fp32 result."""
    return _dot(a.astype(dtype), b.astype(dtype), ((1,), (1,)))


def matmul_dtype(*arrays: jax.Array):
    """MXU operand dtype of the state passes: bf16 when every input is bf16, else fp32."""
    dtypes = {jnp.dtype(a.dtype) for a in arrays}
    if dtypes == {jnp.dtype(jnp.bfloat16)}:
        return jnp.dtype(jnp.bfloat16)
    return jnp.dtype(jnp.float32)


def unsupported_reason(
    arrays: Sequence[jax.Array], head_dims: Sequence[int], chunk_size: int
) -> Optional[str]:
    """Returns why the TPU kernels cannot run this call, or ``None`` if they can.

    Any backend is fine (off a TPU the kernels run in interpret mode).

    Args:
      arrays: the float inputs (q, k, v); they must be bf16 or fp32.
      head_dims: the key and value head dims (each must be 64 or 128: lane-tile friendly).
      chunk_size: the requested chunk size (64 or 128).
    """
    for d in head_dims:
        if d not in SUPPORTED_HEAD_DIMS:
            return f"head dim {d} is not one of the TPU kernel head dims {SUPPORTED_HEAD_DIMS}"
    if chunk_size not in SUPPORTED_CHUNK_SIZES:
        return (f"chunk_size={chunk_size}; the TPU kernels use a chunk size in "
                f"{SUPPORTED_CHUNK_SIZES}")
    dtypes = {jnp.dtype(a.dtype) for a in arrays}
    if not dtypes <= {jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32)}:
        return f"input dtypes {sorted(map(str, dtypes))} are not all bf16/fp32"
    return None


def choose_implementation(
    op: str,
    implementation: Optional[str],
    concrete: Sequence[str],
    arrays: Sequence[jax.Array],
    head_dims: Sequence[int],
    chunk_size: int,
    seq_len: int,
    fallback: Optional[Callable[..., str]] = None,
) -> str:
    """Resolves an op's ``implementation=`` argument with the TPU kernels included.

    * ``"pallas_tpu"``: the TPU kernels (Mosaic on a TPU, interpret mode elsewhere); raises if
      :func:`unsupported_reason` objects.
    * ``None``/``"auto"`` on a TPU backend: ``"pallas_tpu"`` when supported and ``T`` fills at
      least one chunk (shorter calls, such as decode steps, are cheaper in the chunked form),
      else ``concrete[0]`` (the reason is logged once).
    * anything else: ``fallback(op, implementation, concrete + ("pallas_tpu",), arrays,
      head_dims, chunk_size, seq_len)`` when given (the GPU dispatch), else plain name
      resolution against ``concrete + ("pallas_tpu",)``.

    Raises:
      ValueError: for an unknown name, or an explicit ``"pallas_tpu"`` that cannot run this
        call (with the reason).
    """
    if implementation in TPU_IMPLEMENTATIONS:
        return validation.require_runnable(op, implementation,
                                           unsupported_reason(arrays, head_dims, chunk_size),
                                           "'auto' or 'chunked'")
    if (implementation is None or implementation == "auto") and on_tpu():
        reason = validation.auto_kernel_reason(unsupported_reason(arrays, head_dims, chunk_size),
                                               seq_len, chunk_size)
        if reason is None:
            return "pallas_tpu"
        validation.log_once(op, f"using the chunked form instead of the TPU kernels: {reason}")
        return concrete[0]
    extended = tuple(concrete) + TPU_IMPLEMENTATIONS
    if fallback is not None:
        return fallback(op, implementation, extended, arrays, head_dims, chunk_size, seq_len)
    return validation.resolve_implementation(implementation, extended, op)
