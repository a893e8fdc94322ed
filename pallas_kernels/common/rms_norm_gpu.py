"""One-pass RMSNorm forward and backward as Pallas GPU kernels (Triton lowering).

RMSNorm (Zhang & Sennrich 2019) over the last axis of ``x [..., D]``::

    r = 1 / sqrt(mean(x^2) + eps),    y = x r scale
    d x = r (gs - xh mean(gs xh)),    d scale = sum over rows of dy xh

with ``xh = x r`` and ``gs = dy scale``, every statistic and product in fp32, ``y`` and ``dx``
rounded once to ``x.dtype``: the same quantities, in the same precision, as the XLA form
:func:`lattn_jax.layers.rms_norm` (only the order of the fp32 row sums differs).

Why: XLA cannot fuse a row reduction with the broadcasting consumer that follows it, so its
forward reads ``x`` twice and its backward reads ``x`` and ``dy`` about twice; on the 350M
GDN step (H100, 2026-12-07c) the norms took ~226 ms of 2,354 (MOSAIC_GPU.md Sec. 46). These
kernels read each input once:

* forward (``rms_norm_fwd``): one program per :func:`block_rows` rows, whole rows of ``D``
  (padded to a power of two with masks) in registers; writes ``y`` and ``r`` (fp32 ``[rows]``,
  the residual, with ``x``).
* backward (``rms_norm_bwd``): one program per ``TUNING["bwd_program_rows"]`` rows, a loop over
  blocks of :func:`block_rows` rows; writes ``dx`` and the program's fp32 partial of
  ``d scale`` (``[n_programs, D]``), summed in XLA (fp32) and cast to ``scale``'s dtype.

The kernels take the rows as one flat ``[N, D]`` array (the leading axes are merged by a
reshape), so under GSPMD sharding of the leading axes they are not partitioned by themselves;
callers on several devices wrap them in ``shard_map`` (not done yet: the option that selects
them, ``model.norm_implementation``, is for the one-card A/B, MOSAIC_GPU.md Sec. 47).
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

from pallas_kernels.common import pallas_gpu

F32 = jnp.float32

# Launch tuning (not yet measured on a card): elements of one row block held in registers,
# the rows one backward program covers (its d scale partial is one fp32 row of the
# [n_programs, D] array summed in XLA), and warps per program. Offline estimate
# (benchmarks/kernel_registers.py's method: pip triton 3.9, ptxas for sm_90a, 2026-12-07),
# registers per thread with no spills: bf16 D = 1024 forward 56, backward 128; D = 128: 32, 80;
# D = 4096: 72, 167; fp32 D = 1024: 56, 149.
TUNING = {"block_elements": 4096, "max_block_rows": 16, "bwd_program_rows": 32, "num_warps": 4}


def padded_dim(dim: int) -> int:
    """``dim`` rounded up to a power of two (Triton blocks are powers of two)."""
    return 1 << max(0, (dim - 1).bit_length())


def block_rows(dim: int) -> int:
    """Rows per register block: ``TUNING["block_elements"] // padded_dim(dim)``, clipped to
    ``[1, TUNING["max_block_rows"]]`` (a power of two)."""
    return max(1, min(TUNING["max_block_rows"], TUNING["block_elements"] // padded_dim(dim)))


def _check(x, scale):
    """Raises ``ValueError`` naming the argument for a non-float or misshapen input."""
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"x must be a float array, got dtype {x.dtype}")
    if x.ndim < 1 or x.shape[-1] < 1:
        raise ValueError(f"x must have shape [..., D] with D >= 1, got {x.shape}")
    if not jnp.issubdtype(scale.dtype, jnp.floating):
        raise ValueError(f"scale must be a float array, got dtype {scale.dtype}")
    if scale.shape != (x.shape[-1],):
        raise ValueError(f"scale must have shape [D] = ({x.shape[-1]},) for x of shape "
                         f"{x.shape}, got {scale.shape}")


def _row_block(start, rows, n_rows, dim, dp):
    """Index and mask of the ``[rows, dp]`` block at row ``start`` (rows past ``n_rows`` and
    columns past ``dim`` masked)."""
    row_ids = start + jax.lax.broadcasted_iota(jnp.int32, (rows, dp), 0)
    col_ids = jax.lax.broadcasted_iota(jnp.int32, (rows, dp), 1)
    mask = (row_ids < n_rows) & (col_ids < dim)
    return (pl.ds(start, rows), pl.ds(0, dp)), mask


def _row_mask(start, rows, n_rows):
    """Mask of the ``[rows]`` row vector at row ``start``."""
    return start + jax.lax.broadcasted_iota(jnp.int32, (rows,), 0) < n_rows


def _load_row_block(ref, start, rows, n_rows, dim, dp):
    """fp32 ``[rows, dp]`` block of ``ref`` at row ``start``, 0 outside the array."""
    idx, mask = _row_block(start, rows, n_rows, dim, dp)
    return pl_triton.load(ref.at[idx], mask=mask, other=0).astype(F32)


def _load_scale(scale_ref, dim, dp):
    """fp32 ``[1, dp]`` scale, 0 in the padded columns."""
    cols = jax.lax.broadcasted_iota(jnp.int32, (dp,), 0)
    return pl_triton.load(scale_ref.at[pl.ds(0, dp)], mask=cols < dim,
                          other=0).astype(F32)[None, :]


def _fwd_kernel(x_ref, scale_ref, y_ref, r_ref, *, n_rows, dim, dp, rows, eps):
    """Forward: rows ``rows * i ..`` of program ``i``; ``r = rsqrt(sum(x^2) / D + eps)``,
    ``y = ((x r) scale)`` rounded once to ``y``'s dtype."""
    start = pl.program_id(0) * rows
    x = _load_row_block(x_ref, start, rows, n_rows, dim, dp)
    r = jax.lax.rsqrt(jnp.sum(x * x, axis=1) / F32(dim) + F32(eps))
    y = (x * r[:, None]) * _load_scale(scale_ref, dim, dp)
    idx, mask = _row_block(start, rows, n_rows, dim, dp)
    pl_triton.store(y_ref.at[idx], y.astype(y_ref.dtype), mask=mask)
    pl_triton.store(r_ref.at[pl.ds(start, rows)], r, mask=_row_mask(start, rows, n_rows))


def _bwd_kernel(x_ref, r_ref, scale_ref, dy_ref, dx_ref, ds_ref, *, n_rows, dim, dp, rows,
                program_rows):
    """Backward: rows ``program_rows * i ..`` of program ``i`` in blocks of ``rows``;
    ``dx = r (gs - xh sum(gs xh) / D)`` per row, and the program's fp32 partial
    ``sum dy xh`` of ``d scale`` written to row ``i`` of ``ds_ref``."""
    i = pl.program_id(0)
    scale = _load_scale(scale_ref, dim, dp)

    def body(j, acc):
        start = i * program_rows + j * rows
        x = _load_row_block(x_ref, start, rows, n_rows, dim, dp)
        dy = _load_row_block(dy_ref, start, rows, n_rows, dim, dp)
        r = pl_triton.load(r_ref.at[pl.ds(start, rows)], mask=_row_mask(start, rows, n_rows),
                           other=0)[:, None]
        xh = x * r
        gs = dy * scale
        dx = r * (gs - xh * (jnp.sum(gs * xh, axis=1, keepdims=True) / F32(dim)))
        idx, mask = _row_block(start, rows, n_rows, dim, dp)
        pl_triton.store(dx_ref.at[idx], dx.astype(dx_ref.dtype), mask=mask)
        return acc + jnp.sum(dy * xh, axis=0)

    acc = jax.lax.fori_loop(0, program_rows // rows, body, jnp.zeros((dp,), F32))
    cols = jax.lax.broadcasted_iota(jnp.int32, (dp,), 0)
    pl_triton.store(ds_ref.at[i, pl.ds(0, dp)], acc, mask=cols < dim)


def _call(kernel, *, inputs, out_shape, grid, interpret, name):
    """``pl.pallas_call`` of ``kernel`` on whole-array refs with the :data:`TUNING` launch."""
    return pl.pallas_call(
        kernel, out_shape=out_shape, grid=grid, interpret=interpret,
        compiler_params=None if interpret else pallas_gpu.compiler_params(
            TUNING["num_warps"], 1),
        name=name)(*inputs)


def _forward(x2, scale, eps, interpret):
    """``(y [N, D] x.dtype, r [N] fp32)`` of the flat rows ``x2``."""
    n_rows, dim = x2.shape
    dp, rows = padded_dim(dim), block_rows(dim)
    kernel = functools.partial(_fwd_kernel, n_rows=n_rows, dim=dim, dp=dp, rows=rows, eps=eps)
    return _call(kernel, inputs=(x2, scale),
                 out_shape=(jax.ShapeDtypeStruct(x2.shape, x2.dtype),
                            jax.ShapeDtypeStruct((n_rows,), F32)),
                 grid=(pl.cdiv(n_rows, rows),), interpret=interpret, name="rms_norm_fwd")


def _backward(x2, r, scale, dy2, interpret):
    """``(dx [N, D] x.dtype, d scale [D] fp32)`` of the flat rows."""
    n_rows, dim = x2.shape
    dp, rows = padded_dim(dim), block_rows(dim)
    program_rows = max(rows, TUNING["bwd_program_rows"])
    if program_rows % rows:
        raise ValueError(f"TUNING['bwd_program_rows']={program_rows} must be a multiple of "
                         f"the block rows {rows}")
    n_programs = pl.cdiv(n_rows, program_rows)
    kernel = functools.partial(_bwd_kernel, n_rows=n_rows, dim=dim, dp=dp, rows=rows,
                               program_rows=program_rows)
    dx, partial = _call(kernel, inputs=(x2, r, scale, dy2),
                        out_shape=(jax.ShapeDtypeStruct(x2.shape, x2.dtype),
                                   jax.ShapeDtypeStruct((n_programs, dim), F32)),
                        grid=(n_programs,), interpret=interpret, name="rms_norm_bwd")
    return dx, jnp.sum(partial, axis=0)


def rms_norm_pallas(x: jax.Array, scale: jax.Array, eps: float, *,
                    interpret: bool = False) -> jax.Array:
    """RMSNorm ``y = x r scale``, ``r = 1 / sqrt(mean(x^2) + eps)`` over the last axis (Zhang &
    Sennrich 2019), by the one-pass Pallas GPU kernels of this module.

    Statistics and products in fp32, ``y`` rounded once to ``x.dtype``; differentiable
    (``jax.custom_vjp``): ``d x = r (gs - xh mean(gs xh))`` and ``d scale = sum dy xh`` over all
    leading axes (``xh = x r``, ``gs = dy scale``, fp32), from ``x`` and ``r`` saved by the
    forward; the same math as :func:`lattn_jax.layers.rms_norm`.

    Args:
      x: ``[..., D]`` any float dtype (the leading axes are flattened to rows).
      scale: ``[D]`` any float dtype (fp32 master weights in mixed precision).
      eps: added to the mean square (static).
      interpret: run the kernels in Pallas interpret mode (any backend; slow, for tests).

    Returns:
      ``[..., D]`` in ``x.dtype``; gradients in the dtypes of ``x`` and ``scale``.

    Raises:
      ValueError: ``x`` or ``scale`` is not a float array, or ``scale`` is not ``[D]``.
    """
    _check(x, scale)
    return _rms_norm(x, scale, float(eps), bool(interpret))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _rms_norm(x, scale, eps, interpret):
    return _rms_norm_fwd(x, scale, eps, interpret)[0]


def _rms_norm_fwd(x, scale, eps, interpret):
    y, r = _forward(x.reshape(-1, x.shape[-1]), scale, eps, interpret)
    return y.reshape(x.shape), (x, r, scale)


def _rms_norm_bwd(eps, interpret, res, dy):
    del eps
    x, r, scale = res
    dim = x.shape[-1]
    dx, d_scale = _backward(x.reshape(-1, dim), r, scale, dy.reshape(-1, dim), interpret)
    return dx.reshape(x.shape), d_scale.astype(scale.dtype)


_rms_norm.defvjp(_rms_norm_fwd, _rms_norm_bwd)
