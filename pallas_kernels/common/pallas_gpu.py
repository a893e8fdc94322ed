"""Shared pieces of the Pallas GPU (Triton lowering) kernels.

* :func:`compiler_params`: Triton launch parameters, across the jax releases we support
  (0.10.x and 0.11.x both expose ``jax.experimental.pallas.triton.CompilerParams``).
* :func:`mm`, :func:`mm_tn`, :func:`mm_nt`: 2-D matrix products ``a @ b``, ``a^T @ b`` and
  ``a @ b^T`` with fp32 accumulation. The operand dtype is chosen by the caller: the input dtype
  (bf16/fp16 tensor cores) for the big products, fp32 for the small solves. fp32 operands run
  with ``Precision.HIGHEST`` (IEEE fp32 on GPU, never TF32), so a kernel fed fp32 inputs matches
  the fp32 reference to rounding.
* :func:`unsupported_reason`: why a call cannot use the GPU kernels (backend, head dims,
  chunk size, dtype), or ``None`` when it can. The ops' ``implementation="auto"`` falls back to
  the chunked form on a reason (logged once), and an explicit ``"pallas"`` raises it.
"""

from typing import Optional, Sequence

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

from pallas_kernels.common import validation

# Names of the kernel implementations: "pallas" runs the GPU kernels compiled by Triton;
# "pallas_interpret" runs the same kernels in Pallas interpret mode on any backend (slow; tests).
PALLAS_IMPLEMENTATIONS = ("pallas", "pallas_interpret")

_HIGHEST = jax.lax.Precision.HIGHEST
SUPPORTED_HEAD_DIMS = (64, 128)
KERNEL_CHUNK_SIZE = 64
INVERSE_BLOCK = 16  # diagonal-block rows of the blocked triangular inverse


def compiler_params(num_warps: int, num_stages: int = 1):
    """Returns the Triton ``CompilerParams`` for ``pl.pallas_call``."""
    return pl_triton.CompilerParams(num_warps=num_warps, num_stages=num_stages)


def resolve_launch(value, dk: int):
    """``(num_warps, num_stages)`` from a TUNING launch entry: a pair, or a dict from key head
    dim to pair (e.g. ``{64: (4, 2), 128: (8, 2)}``).

    Raises:
      ValueError: for a dict without ``dk`` or a value that is not a pair.
    """
    if isinstance(value, dict):
        if dk not in value:
            raise ValueError(f"launch {value!r} has no entry for head dim {dk}")
        value = value[dk]
    if len(value) != 2:
        raise ValueError(f"launch {value!r} is not a (num_warps, num_stages) pair")
    return (int(value[0]), int(value[1]))


def check_block_widths(block_v: int, block_k: int, dk: int, dv: int) -> None:
    """Raises ``ValueError`` unless the block widths divide (and fit) the head dims."""
    for name, block, dim in (("block_v", block_v, dv), ("block_k", block_k, dk)):
        if block < 16 or block > dim or dim % block:
            raise ValueError(f"TUNING[{name!r}]={block} must divide the head dim {dim} "
                             "(and be >= 16)")


def abstract_gpu_target(device_kind: str = "NVIDIA H200"):
    """Context manager: lower Pallas Triton kernels for ``device_kind`` on a host without a GPU.

    jaxlib <= 0.10.x emits Triton IR at lowering time and needs no device; later jaxlibs compile
    it then and read the target from the current device, or from an abstract mesh's
    ``AbstractDevice``, which this enters (a no-op on versions without one). For export/lowering
    only (``jax.export`` with ``platforms=["cuda"]``, ``lower(lowering_platforms=("cuda",))``).
    """
    import contextlib
    from jax._src import mesh as mesh_lib
    device_cls = getattr(mesh_lib, "AbstractDevice", None)
    if device_cls is None or not hasattr(jax.sharding, "use_abstract_mesh"):
        return contextlib.nullcontext()
    try:
        mesh = jax.sharding.AbstractMesh(
            (1,), ("x",), axis_types=(jax.sharding.AxisType.Auto,),
            abstract_device=device_cls(device_kind=device_kind, num_cores=None, platform="gpu"))
    except TypeError:  # an AbstractMesh without abstract devices
        return contextlib.nullcontext()
    return jax.sharding.use_abstract_mesh(mesh)


def named_pallas_call(kernel, cfg, *, inputs, outputs, grid, launch, name):
    """Calls ``kernel(**refs, cfg=cfg)`` with every named input/output ref (``None`` if absent).

    Lets one kernel body serve several static configurations (with or without segment ids,
    delta rule on or off) without positional-ref bookkeeping.

    Args:
      kernel: the kernel body, taking every name below as a keyword argument plus ``cfg``.
      cfg: the static configuration dict (``cfg["interpret"]`` selects interpret mode).
      inputs: ``(name, array or None)`` pairs; ``None`` inputs are not passed.
      outputs: ``(name, ShapeDtypeStruct or None)`` pairs; ``None`` outputs are not produced.
      grid: the launch grid.
      launch: ``(num_warps, num_stages)`` for Triton (ignored in interpret mode).
      name: the kernel's name in profiles.

    Returns:
      ``{name: array}`` for the produced outputs.
    """
    in_names = [n for n, a in inputs if a is not None]
    out_names = [n for n, s in outputs if s is not None]
    all_names = [n for n, _ in inputs] + [n for n, _ in outputs]

    def wrapped(*refs):
        given = dict(zip(in_names + out_names, refs))
        kernel(**{n: given.get(n) for n in all_names}, cfg=cfg)

    results = pl.pallas_call(
        wrapped,
        out_shape=[s for _, s in outputs if s is not None],
        grid=grid,
        interpret=cfg["interpret"],
        compiler_params=None if cfg["interpret"] else compiler_params(*launch),
        name=name,
    )(*[a for _, a in inputs if a is not None])
    return dict(zip(out_names, results))


def _dot(a, b, dims):
    precision = _HIGHEST if a.dtype == jnp.float32 else None
    return jax.lax.dot_general(
        a, b, (dims, ((), ())), precision=precision, preferred_element_type=jnp.float32
    )


def mm(a: jax.Array, b: jax.Array, dtype) -> jax.Array:
    """``a @ b`` for ``a [M, K]``, ``b [K, N]`` with operands cast to ``dtype``; fp32 result."""
    return _dot(a.astype(dtype), b.astype(dtype), ((1,), (0,)))


def mm_tn(a: jax.Array, b: jax.Array, dtype) -> jax.Array:
    """``a^T @ b`` for ``a [K, M]``, ``b [K, N]``; fp32 result."""
    return _dot(a.astype(dtype), b.astype(dtype), ((0,), (0,)))


def mm_nt(a: jax.Array, b: jax.Array, dtype) -> jax.Array:
    """``a @ b^T`` for ``a [M, K]``, ``b [N, K]``; fp32 result."""
    return _dot(a.astype(dtype), b.astype(dtype), ((1,), (1,)))


def unsupported_reason(
    arrays: Sequence[jax.Array], head_dims: Sequence[int], chunk_size: int, interpret: bool
) -> Optional[str]:
    """Returns why the GPU kernels cannot run this call, or ``None`` if they can.

    Args:
      arrays: the float inputs whose dtype picks the tensor-core operand type.
      head_dims: the key and value head dims (each must be 64 or 128).
      chunk_size: the requested chunk size (the kernels use 64).
      interpret: whether the kernels run in Pallas interpret mode (any backend).
    """
    if not interpret and jax.default_backend() != "gpu":
        return f"the Pallas GPU kernels need a GPU backend, not {jax.default_backend()!r}"
    for d in head_dims:
        if d not in SUPPORTED_HEAD_DIMS:
            return f"head dim {d} is not one of the kernel head dims {SUPPORTED_HEAD_DIMS}"
    if chunk_size != KERNEL_CHUNK_SIZE:
        return f"chunk_size={chunk_size}; the kernels use chunk_size={KERNEL_CHUNK_SIZE}"
    dtypes = {jnp.dtype(a.dtype) for a in arrays}
    allowed = {jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16), jnp.dtype(jnp.float32)}
    if not dtypes <= allowed:
        return f"input dtypes {sorted(map(str, dtypes))} are not all bf16/fp16/fp32"
    return None


def choose_implementation(
    op: str,
    implementation: Optional[str],
    concrete: Sequence[str],
    arrays: Sequence[jax.Array],
    head_dims: Sequence[int],
    chunk_size: int,
    seq_len: int,
) -> str:
    """Resolves an op's ``implementation=`` argument, kernels included.

    ``None``/``"auto"`` picks ``"pallas"`` where :func:`unsupported_reason` finds nothing
    against it and the sequence fills at least one kernel chunk (shorter calls, such as decode
    steps, are cheaper in the chunked form); otherwise ``concrete[0]``, logging the reason once
    when a GPU was available. An explicit ``"pallas"`` or ``"pallas_interpret"`` that cannot run
    raises instead of falling back.

    Args:
      op: the op's name, for messages.
      implementation: the user's choice.
      concrete: the op's non-kernel forms, best first.
      arrays: q, k, v (their dtypes pick the kernels' operand type).
      head_dims: ``(K, V)``.
      chunk_size: the requested chunk size.
      seq_len: ``T``.

    Returns:
      The implementation name to run.

    Raises:
      ValueError: for an unknown name, or a kernel implementation that cannot run this call,
        with the reason.
    """
    if implementation in PALLAS_IMPLEMENTATIONS:
        reason = unsupported_reason(arrays, head_dims, chunk_size,
                                    interpret=implementation == "pallas_interpret")
        return validation.require_runnable(op, implementation, reason, "'auto' or 'chunked'")
    if implementation is None or implementation == "auto":
        reason = validation.auto_kernel_reason(
            unsupported_reason(arrays, head_dims, chunk_size, interpret=False), seq_len,
            KERNEL_CHUNK_SIZE)
        if reason is None:
            return "pallas"
        if jax.default_backend() == "gpu":
            log_fallback(op, reason)
        return concrete[0]
    return validation.resolve_implementation(
        implementation, tuple(concrete) + PALLAS_IMPLEMENTATIONS, op)


def log_fallback(op: str, reason: str) -> None:
    """Logs (once per op and reason) that ``implementation="auto"`` fell back to chunked."""
    validation.log_once(op, f"using the chunked form instead of the Pallas kernel: {reason}")


def matmul_dtype(*arrays: jax.Array):
    """Tensor-core operand dtype: the inputs' dtype when all are bf16 (or all fp16), else fp32."""
    dtypes = {jnp.dtype(a.dtype) for a in arrays}
    half = {jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)}
    if len(dtypes) == 1 and dtypes <= half:
        return dtypes.pop()
    return jnp.dtype(jnp.float32)


# ---------------------------------------------------------------------------------------------
# In-kernel helpers shared by the GPU kernel modules (they operate on loaded values and refs).


LOG2_E = 1.4426950408889634  # log2(e)


def exp(x: jax.Array) -> jax.Array:
    """``e**x`` inside a kernel, computed as ``2**(x log2 e)`` (same shape and dtype as ``x``).

    Pallas' Triton lowering takes fp32 ``exp`` to libdevice's ``__nv_expf`` (an accurate
    range-reduced sequence of ~10 instructions) but ``exp2`` to ``__nv_exp2f``, the single
    ``ex2.approx`` instruction (2 ulp) that Triton's own ``tl.exp`` uses. Rounding the product
    (and log2 e) adds a relative error of about ``|x| * 2**-24`` (5e-6 at x = -80, where the
    result is ~2e-35); the kernels only exponentiate non-positive log-decay differences.
    """
    return jnp.exp2(x * LOG2_E)


def iota(shape, dim):
    """int32 ``broadcasted_iota`` (indices along ``dim``) usable inside Triton kernels."""
    return jax.lax.broadcasted_iota(jnp.int32, shape, dim)


def last_element(x, n):
    """``x[n - 1]`` of a 1-D ``[n]`` value, as a scalar (Triton cannot index registers)."""
    return jnp.sum(jnp.where(iota((n,), 0) == n - 1, x, 0.0))


def program_batch_head(cfg, axis):
    """``(b, h)`` from the flattened batch*head program id on grid axis ``axis``."""
    bh = pl.program_id(axis)
    return bh // cfg["heads"], bh % cfg["heads"]


def doc_inputs(docs):
    """``(name, array)`` input pairs of the document masks (``None`` arrays when unpacked)."""
    doc, conn, last = docs if docs else (None, None, None)
    return [("doc_ref", doc), ("conn_ref", conn), ("last_ref", last)]


def load_docs(cfg, doc_ref, conn_ref, last_ref, b, sl):
    """Loads ``(doc, conn, last)`` of rows ``sl`` of batch row ``b``, or Nones when unpacked."""
    if not cfg["has_docs"]:
        return None, None, None
    return doc_ref[b, sl], conn_ref[b, sl], last_ref[b, sl]


def docs_from_segment_ids(segment_ids, padded_len):
    """``(doc int32 [B, Tp], conn fp32 [B, Tp], last fp32 [B, Tp])`` for the chunk masks."""
    doc = validation.document_index(segment_ids)
    doc = jnp.pad(doc, ((0, 0), (0, padded_len - doc.shape[1])), mode="edge").astype(jnp.int32)
    bsz = doc.shape[0]
    dc = doc.reshape(bsz, -1, KERNEL_CHUNK_SIZE)
    prev = jnp.concatenate([dc[:, :1, :1], dc[:, :-1, -1:]], axis=1)  # doc before each chunk
    conn = (dc == prev).astype(jnp.float32).reshape(bsz, padded_len)
    last = (dc == dc[:, :, -1:]).astype(jnp.float32).reshape(bsz, padded_len)
    return doc, conn, last


def unit_lower_inverse(strict, precision_dtype):
    """``(I + L)^{-1}`` of a strictly lower ``[C, C]`` fp32 matrix (C = 64) by whole-tile products.

    Blocked over 16 x 16 diagonal blocks, all on whole ``[C, C]`` tiles (Triton cannot slice
    registers). With L = L_d + L_o (block diagonal and strictly block-lower parts):

      X_d = (I + L_d)^{-1} = (I - L_d)(I + L_d^2)(I + L_d^4)(I + L_d^8)   (L_d^16 = 0),
            refined (fp32 inputs only) by a Newton step X_d <- X_d - X_d ((I + L_d) X_d - I);
      N   = X_d L_o (strictly block-lower, N^4 = 0), and
      (I + L)^{-1} = (I + N)^{-1} X_d = (I - N)(I + N^2) X_d.

    The powers stay bounded because each doubling acts on one 16-row block. Products run in
    ``precision_dtype``: fp32 (IEEE) for fp32 inputs; for bf16/fp16 inputs TF32, whose
    rounding is below that of the half-precision W and U the inverse feeds.
    """
    c = strict.shape[0]
    rows, cols = iota((c, c), 0), iota((c, c), 1)
    eye = jnp.where(rows == cols, 1.0, 0.0).astype(jnp.float32)
    same_block = (rows // INVERSE_BLOCK) == (cols // INVERSE_BLOCK)
    ld = jnp.where(same_block, strict, 0.0)
    lo = strict - ld

    def prod(a, b_):
        return dot_precise(a, b_, precision_dtype)

    x = eye - ld
    p = prod(ld, ld)
    x = x + prod(x, p)
    p = prod(p, p)
    x = x + prod(x, p)
    p = prod(p, p)
    x = x + prod(x, p)
    if precision_dtype == jnp.dtype(jnp.float32):
        x = x - prod(x, x + prod(ld, x) - eye)
    nmat = prod(x, lo)
    y = eye - nmat
    y = y + prod(y, prod(nmat, nmat))
    return prod(y, x)


def dot_precise(a, b, precision_dtype):
    """fp32 ``a @ b``: IEEE when ``precision_dtype`` is fp32, else TF32 tensor cores."""
    precision = (jax.lax.Precision.HIGHEST if precision_dtype == jnp.dtype(jnp.float32)
                 else jax.lax.Precision.DEFAULT)
    return jax.lax.dot_general(a, b, (((1,), (0,)), ((), ())), precision=precision,
                               preferred_element_type=jnp.float32)
