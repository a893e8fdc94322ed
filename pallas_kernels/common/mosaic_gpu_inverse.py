"""The T0 kernel's blocked inverse helpers, shared by Mosaic GPU kernels of several ops.

Moved from :mod:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu` (which keeps its old names
as aliases) so that :mod:`pallas_kernels.common.channelwise_local_mosaic_gpu` can use them
without ``pallas_kernels/common`` importing an op package (MOSAIC_GPU.md Secs. 12, 13, 15, 62):

* :func:`kkt_diag_solve`: the inverses of the 16 x 16 diagonal blocks of ``I + A`` (``A``
  strictly lower, fp32 ``[64, 64]``, WGMMA layout) by fp32 forward substitution
  (``inline_mgpu`` on the GPU, plain ``jnp`` when interpreting);
* :func:`kkt_block_merge`: the ``s = 32`` and ``s = 64`` merges to ``(I + A)^{-1}``, with
  optional hi/lo splits (``refine="split_merge"``);
* the 32-byte-swizzled 16-bit SMEM tiles they use (:func:`kkt_smem`), column-block slices
  (:func:`kkt_blk`, :func:`kkt_cols`) and grouped ``[64, 16]`` products
  (:func:`block_products`).
"""

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.common import mosaic_gpu_lib as mgl

CHUNK = mgl.CHUNK
MERGE_DTYPE = jnp.float16  # operand dtype of the inverse's merge products (chunk_wy_mosaic)


# The T0 kernel's inverse works on 16-column blocks of the chunk: its SMEM operand tiles use
# a 32-byte swizzle ([8, 16] 16-bit tiles), so every 16-row or 16-column slice is whole tiles.
KKT_BLOCK = 16


def kkt_smem(shape, dtype):
    """A 16-bit SMEM tile with 32-byte swizzle: sliceable in steps of :data:`KKT_BLOCK`."""
    dtype = jnp.dtype(dtype)
    tiling = plgpu.TilingTransform((8, 32 // dtype.itemsize))
    return plgpu.SMEM(shape, dtype, transforms=(tiling, plgpu.SwizzleTransform(32)))


def kkt_blk(c, n=1):
    """Rows or columns ``[16 c, 16 (c + n))``."""
    return pl.ds(c * KKT_BLOCK, n * KKT_BLOCK)


def kkt_cols(c):
    """Python slice ``[16 c, 16 c + 16)`` (of an array value; :func:`kkt_blk` is for refs)."""
    return slice(c * KKT_BLOCK, (c + 1) * KKT_BLOCK)


def block_products(terms):
    """``[sum of lhs @ rhs for (lhs, rhs) in t] for t in terms``: independent ``[64, 16]``
    products, one accumulator each, issued together and read together (one wait)."""
    def body(*accs):
        for acc, t in zip(accs, terms):
            for lhs, rhs in t:
                plgpu.wgmma(acc, lhs, rhs)
        return tuple(acc[...] for acc in accs)

    shape = (CHUNK, KKT_BLOCK)
    out = pl.run_scoped(body, *[plgpu.ACC(shape) for _ in terms])
    # The barrier keeps the arithmetic after the accumulator reads (jla's pitfall).
    return list(lax.optimization_barrier(tuple(out)))


def kkt_block_merge(xs, l_s, x_s, y_s, interpret: bool, *, rows=None, al_s=None, xl_s=None):
    """The ``s = 32`` and ``s = 64`` merges of :func:`kkt_block_inverse`: from the column
    blocks ``xs`` (``[64, 16]`` fp32) of the inverses of the 16 x 16 diagonal blocks of
    ``I + A`` (zero elsewhere) to the column blocks of ``(I + A)^{-1}``. ``l_s`` must hold
    ``A`` in :data:`MERGE_DTYPE`; ``x_s``, ``y_s`` as in :func:`kkt_block_inverse`; ``rows``
    the row iota ``[64, 16]`` if the caller has it.

    Each merge is ``Y = (X A)|_s`` (rows of the lower block), then ``X[:, c] -= Y X[c, c]``,
    with :data:`MERGE_DTYPE` operands and fp32 accumulation. Optional hi/lo splits
    (``refine="split_merge"`` of :func:`chunk_kkt_inverse_mosaic`, MOSAIC_GPU.md Sec. 15),
    extra ``wgmma`` into the same accumulators, so no extra dependent round:

    * ``al_s`` (a ``[64, 64]`` tile like ``l_s``, holding ``A_lo = fp16(A - A_hi)``, filled
      and committed by the caller with ``l_s``): ``X A = X_hi A_hi + X_hi A_lo``. ``A``
      rounded to fp16 is most of the merges' error on correlated keys.
    * ``xl_s`` (the same kind of tile; this function stores ``X_lo = fp16(X - X_hi)`` in it
      next to ``X_hi``; needs ``al_s``): also ``+ X_lo A_hi``, and
      ``Y X = Y_hi X_hi + Y_lo X_hi + Y_hi X_lo``. Needed for fp16 outputs only.

    Interpreted, the ``Y_lo`` register operands go through the column blocks of ``y_s`` that
    the ``Y_hi`` of the same merge does not use. Returns the four column blocks (fp32).

    Raises:
        ValueError: if ``xl_s`` is given without ``al_s``.
    """
    dt = MERGE_DTYPE
    i = mgl.iota((CHUNK, KKT_BLOCK), 0, interpret) if rows is None else rows
    xs = list(xs)
    split_xy = xl_s is not None
    if split_xy and al_s is None:
        raise ValueError("kkt_block_merge: xl_s (the X and Y splits) needs al_s (A_lo)")

    def store(c):
        x_hi = xs[c].astype(dt)
        x_s.at[:, kkt_blk(c)][...] = x_hi
        if split_xy:
            xl_s.at[:, kkt_blk(c)][...] = (xs[c] - x_hi.astype(jnp.float32)).astype(dt)

    def lhs(y, c):
        return mgl.lhs_operand(y, None if y_s is None else y_s.at[:, kkt_blk(c)], interpret)

    def xa(cols, u_rows, c):  # X[:, cols] A[u_rows, c]: [(lhs, rhs), ...] into one accumulator
        terms = [(x_s.at[:, cols], l_s.at[u_rows, kkt_blk(c)])]
        if al_s is not None:
            terms.append((x_s.at[:, cols], al_s.at[u_rows, kkt_blk(c)]))
        if split_xy:
            terms.append((xl_s.at[:, cols], l_s.at[u_rows, kkt_blk(c)]))
        return terms

    def y_ops(p, keep, c, c_lo):  # Y = p on the rows ``keep``; operands Y_hi (, Y_lo)
        if not split_xy:
            return lhs(jnp.where(keep, p, 0.0).astype(dt), c), None
        y = jnp.where(keep, p, 0.0)
        y_hi = y.astype(dt)
        return lhs(y_hi, c), lhs((y - y_hi.astype(jnp.float32)).astype(dt), c_lo)

    def yx(y_op, y_lo_op, r, c):  # Y X[r, c]
        terms = [(y_op, x_s.at[kkt_blk(r), kkt_blk(c)])]
        if split_xy:
            terms += [(y_lo_op, x_s.at[kkt_blk(r), kkt_blk(c)]),
                      (y_op, xl_s.at[kkt_blk(r), kkt_blk(c)])]
        return terms

    # s = 32: the lower-left 16 x 16 block of each 32-block, columns 0 and 2.
    for c in range(4):
        store(c)
    plgpu.commit_smem()
    xa_p = block_products([xa(kkt_blk(c + 1), kkt_blk(c + 1), c) for c in (0, 2)])
    if split_xy:
        ops = [y_ops(p, lax.div(i, KKT_BLOCK) == c + 1, c, c + 1) for c, p in zip((0, 2), xa_p)]
        yx_p = block_products([yx(y, y_lo, c, c) for c, (y, y_lo) in zip((0, 2), ops)])
    else:
        ys = [jnp.where(lax.div(i, KKT_BLOCK) == c + 1, p, 0.0).astype(dt)
              for c, p in zip((0, 2), xa_p)]
        yx_p = block_products([[(lhs(y, c), x_s.at[kkt_blk(c), kkt_blk(c)])]
                               for c, y in zip((0, 2), ys)])
    xs[0], xs[2] = xs[0] - yx_p[0], xs[2] - yx_p[1]
    # s = 64: the lower-left 32 x 32 block, columns 0 and 1.
    for c in (0, 2):
        store(c)
    plgpu.commit_smem()
    xa_p = block_products([xa(kkt_blk(2, 2), kkt_blk(2, 2), c) for c in (0, 1)])
    if split_xy:
        (y0_op, y0_lo), (y1_op, y1_lo) = (y_ops(p, i >= 2 * KKT_BLOCK, c, c + 2)
                                          for c, p in zip((0, 1), xa_p))
    else:
        y0, y1 = (jnp.where(i >= 2 * KKT_BLOCK, p, 0.0).astype(dt) for p in xa_p)
        (y0_op, y0_lo), (y1_op, y1_lo) = (lhs(y0, 0), None), (lhs(y1, 1), None)
    yx_p = block_products([yx(y0_op, y0_lo, 0, 0) + yx(y1_op, y1_lo, 1, 0),
                           yx(y1_op, y1_lo, 1, 1)])
    xs[0], xs[1] = xs[0] - yx_p[0], xs[1] - yx_p[1]
    return xs


# Inverses of the 16 x 16 diagonal blocks by fp32 forward substitution (inverse="substitution"
# of chunk_kkt_inverse_mosaic, MOSAIC_GPU.md Sec. 13). Rows of the fp32 SMEM buffer are padded
# by KKT_SOLVE_PAD floats: at 256-byte rows the WGMMA layout's row-strided stores and loads hit
# the same banks (jla measured 8-way conflicts there).
KKT_SOLVE_PAD = 8


def _kkt_diag_solve_mgpu(ctx, a, buf):
    """``inline_mgpu`` body of :func:`kkt_diag_solve` (GPU).

    ``a`` (fp32 ``[64, 64]``, WGMMA layout) goes to the plain fp32 SMEM view ``buf``; thread
    ``t`` (of 128; threads ``t`` and ``t + 64`` compute the same column, only the first writes)
    takes column ``l = t % 16`` of diagonal block ``b = t // 16 % 4`` and forms it row by row,
    ``x_i = [i = l] - sum_{j < i} A[16 b + i, 16 b + j] x_j`` (16 rows, 120 fp32 ``fma`` from
    zero: rows above ``l`` come out exactly zero, no branch), reading ``A`` as warp-broadcast
    scalar loads (the threads of one block read the same address). After a barrier (every
    read of ``A`` is done) it writes its 16 values over ``A`` at rows ``16 b + i``, column
    ``t``; the caller masks everything outside the diagonal blocks.
    """
    import jax.experimental.mosaic.gpu as mgpu
    from jax.experimental.mosaic.gpu import utils as mu
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import arith, memref
    from jaxlib.mlir.dialects import math as mlir_math

    del ctx
    a.store_untiled(buf, optimized=False)
    mu.warpgroup_barrier()  # A is in SMEM for every thread
    f32, i32, index = ir.F32Type.get(), ir.IntegerType.get_signless(32), ir.IndexType.get()
    tid = arith.remui(mu.thread_idx(), mu.c(128, i32))
    col_i32 = arith.remui(tid, mu.c(CHUNK, i32))  # the column this thread forms
    local = arith.remui(col_i32, mu.c(KKT_BLOCK, i32))  # its column inside the block
    col = arith.index_cast(index, col_i32)
    start = arith.index_cast(index, arith.subi(col_i32, local))  # first row of the block
    zero, one = mu.c(0.0, f32), mu.c(1.0, f32)
    rows = [arith.addi(start, mu.c(r, index)) for r in range(KKT_BLOCK)]
    neg_x = []  # -x_j of the rows done so far
    xs = []
    for r in range(KKT_BLOCK):
        acc = arith.select(arith.cmpi(arith.CmpIPredicate.eq, local, mu.c(r, i32)), one, zero)
        for j in range(r):
            a_rj = memref.load(buf, [rows[r], rows[j]])
            acc = mlir_math.fma(a_rj, neg_x[j], acc)
        xs.append(acc)
        neg_x.append(arith.negf(acc))
    mu.warpgroup_barrier()  # every read of A is done
    with mu.when(arith.cmpi(arith.CmpIPredicate.ult, tid, mu.c(CHUNK, i32))):
        for r in range(KKT_BLOCK):
            memref.store(xs[r], buf, [rows[r], col])
    mu.warpgroup_barrier()  # every column is written
    return mgpu.FragmentedArray.load_untiled(buf, layout=mgpu.WGMMA_LAYOUT, optimized=False)


def _kkt_diag_solve_xla(a):
    """:func:`kkt_diag_solve` for interpret mode (the interpreter cannot run ``inline_mgpu``):
    the same row-by-row fp32 substitution on the four blocks at once, ``[64, 64]`` fp32."""
    blocks = jnp.stack([a[kkt_cols(c), kkt_cols(c)] for c in range(4)])  # [4, 16, 16]
    eye = jnp.eye(KKT_BLOCK, dtype=jnp.float32)
    rows = []
    for r in range(KKT_BLOCK):
        x_r = jnp.broadcast_to(eye[r], (4, KKT_BLOCK))
        for j in range(r):
            x_r = x_r - blocks[:, r, j:j + 1] * rows[j]
        rows.append(x_r)
    inv = jnp.stack(rows, axis=1)  # [4, 16 (row), 16 (column)]
    x = jnp.zeros((CHUNK, CHUNK), jnp.float32)
    for c in range(4):
        x = x.at[kkt_cols(c), kkt_cols(c)].set(inv[c])
    return x


def kkt_diag_solve(a, solve_s, interpret: bool):
    """Column blocks (four ``[64, 16]`` fp32) of the inverses of the 16 x 16 diagonal blocks
    of ``I + A`` (``A`` strictly lower, fp32 ``[64, 64]``, WGMMA layout), zero elsewhere: the
    input of :func:`kkt_block_merge`, in place of :func:`kkt_block_inverse`'s doubling levels
    4, 8, 16 (six dependent ``wgmma`` rounds, 24 ``[64, 16, 16]`` products with fp16 operands).

    On the GPU by fp32 forward substitution in ``inline_mgpu`` (:func:`_kkt_diag_solve_mgpu`:
    one thread per column, 16 dependent rows, 120 ``fma``), through ``solve_s``, a fp32 SMEM
    buffer ``[64, 64 + KKT_SOLVE_PAD]``; interpreted, the same substitution in plain ``jnp``
    (``solve_s`` unused).
    """
    sq = (CHUNK, CHUNK)
    if interpret:
        x = _kkt_diag_solve_xla(a)
    else:
        solve = plgpu.inline_mgpu(
            arg_types=(plgpu.Layout.WGMMA, plgpu.RefType()),
            return_type=plgpu.ShapeDtypeStruct(sq, jnp.float32, layout=plgpu.Layout.WGMMA),
        )(_kkt_diag_solve_mgpu)
        x = solve(a, solve_s.at[:, :CHUNK])
    i, j = mgl.iota(sq, 0, interpret), mgl.iota(sq, 1, interpret)
    # Outside the diagonal blocks the buffer still holds A.
    x = jnp.where(lax.div(i, KKT_BLOCK) == lax.div(j, KKT_BLOCK), x, 0.0)
    return [x[:, kkt_cols(c)] for c in range(4)]
