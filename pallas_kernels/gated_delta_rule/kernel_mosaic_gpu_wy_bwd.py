"""Gated DeltaNet / DeltaNet backward on Pallas Mosaic GPU (Hopper): the WY backward.

Nothing dispatches here yet. Stage 4 of the backward in
:mod:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu_bwd` (FLA's ``prepare_wy_repr_bwd``,
``fla/ops/gated_delta_rule/wy_fast.py``; paper "Gated Delta Networks", arXiv 2412.06464,
Sec. 3.3 and its chunkwise algorithm; paper "Linear Attention Architectures", arXiv 2607.07953,
Sec. 3.2, Eqs. 15-17): the gradients of ``k``, ``v``, ``beta`` and the gate through the WY
factors ``W``, ``U`` that :func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu.chunk_wy_mosaic`
forms, given their cotangents ``dW`` (``dw`` of
:func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu_bwd.chunk_delta_grads_mosaic`) and
``dU = dv_new`` (the reverse state pass's total ``v_new`` gradient, since ``v_new = U - W S``).

Math, per batch row, value head and chunk of ``C = 64`` tokens, with ``G`` the chunk-local
inclusive cumulative log-decay (fp32; 0 for DeltaNet), ``conn_t`` 1 on the tokens of the
document open before the chunk, ``M_ij = [j < i, doc(j) = doc(i)]`` and
``E_ij = e^{G_i - G_j} M_ij``::

    A  = diag(beta) (K K^T) * E,   X = (I + A)^{-1},   Dw = diag(beta conn e^G),   Db = diag(beta)
    W  = X Dw K,   U = X Db V

Differentiating (``dX`` for ``dL/dX`` etc.; ``d(X) = -X d(A) X`` gives ``dA = -X^T dX X^T``)::

    dX   = dW (Dw K)^T + dU (Db V)^T = (dW K^T) Dw + (dU V^T) Db     (Dw, Db scale columns)
    Y    = X^T dW,   Z = X^T dU                                  (d(Dw K) = Y, d(Db V) = Z)
    dA   = -X^T dX X^T, kept on M (A's entries off M are constants 0)
    R    = dA * diag(beta) E         (dL/d(K K^T) on M, row i scaled by beta_i)
    dk   = Dw Y + R K + R^T K                                     (through Dw K and K K^T)
    dv   = Db Z
    dbeta_i = sum_j dA_ij (k_i . k_j) E_ij + conn_i e^{G_i} (k_i . Y_i) + (v_i . Z_i)
    dL/dG_i = sum_j P_ij - sum_j P_ji + Dw_ii (k_i . Y_i),   P = dA * A = R * (K K^T)
            = k_i . (R K)_i - k_i . (R^T K)_i + Dw_ii (k_i . Y_i)

(``A_ij`` carries ``e^{G_i}`` and ``e^{-G_j}``; ``sum_i R_ij (k_i . k_j) = k_j . (R^T K)_j``, so
no column sum is needed.) ``dg``, the gradient of the per-token log-decay, is the reverse
cumulative sum of ``dL/dG`` inside each chunk (``G_t = sum_{s <= t} g_s``), done in the kernel
since 2026-12-05 (a masked ``[64, 64]`` row sum in fp32; it was XLA's, as in
``chunk_delta_grads_mosaic``). These are exactly what ``jax.vjp`` of
:func:`pallas_kernels.gated_delta_rule.chunked.wy_representation` gives (the tests check that).

Choice: the kernel **recomputes** ``X`` with the forward's in-kernel inverse
(:func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu.wy_inverse`, the shared helper of
``chunk_wy_mosaic``) rather than reading an ``X`` the forward stored: 10 ``[64, 64]``
products per chunk against 8 KB (bf16) or 16 KB (fp32) per chunk and head written and read
back, a residual the ``custom_vjp`` would have to keep alive, and a different forward kernel;
``K K^T`` is needed here anyway.

Status (2026-12-03): CPU only, not run on a GPU. Tested in interpret mode against ``jax.vjp``
of ``chunked.wy_representation`` and composed with the other Mosaic stages against
``jax.vjp`` of ``chunked.gated_delta_rule_chunked``
(``tests/pallas_kernels/kernel_mosaic_gdn_wy_bwd_test.py``), and exported for CUDA.
2026-12-05: reordered so that ptxas (offline, ``benchmarks/offline_ptxas.py``) needs no spills
at K = V = 128 or 64 (836 B and a serialised ``wgmma`` before; MOSAIC_GPU.md Sec. 25).
"""

import functools
from typing import Optional, Tuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.common import mosaic_gpu_lib as mgl
from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu as kgd
from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu_bwd as kbwd

CHUNK = mgl.CHUNK
KERNEL_NAME = "gdn_chunk_wy_bwd"
# Timing ablations (``ablations``, MOSAIC_GPU.md Sec. 26): static, benchmark-only switches that
# cut one stage out of the kernel and so compute wrong numbers by design; only
# ``benchmarks/profile_wy_bwd.py`` passes them (never the op, ``mosaic_vjp``). Each keeps the
# grid, the SMEM buffers, the TMA copies and barriers and the data flow of what it does not name.
WY_BWD_ABLATIONS = (
    "io",  # only the 12 TMA loads and the 4 output stores (the loaded dW, dU, beta, G go out)
    "no_inverse",  # X = A instead of the recomputed (I + A)^{-1} (no doubling, its 10 products)
    "no_split",  # no lo terms: X, dW, dU, dX, dX X^T, R as one 16-bit term each, one product
    # per pair instead of three (two for dW K^T, dU V^T; R K + R^T K two instead of four)
    "no_mma",  # the 21 wgmma after the inverse skipped: an SMEM tile or the split operands of
    # the right shape stand in for each product (the loads, splits and stores all run)
    "no_store",  # the 4 TMA stores to GMEM skipped (the SMEM staging of dk, dv, ... kept)
    "no_exp",  # E = the masked exponent G_i - G_j (no exp of the [64, 64] decay matrix, twice)
)


def _wy_bwd_kernel(*refs, group: int, interpret: bool, du16: bool, dk16: bool, dv16: bool,
                   dk_in: bool, dg_in: bool, gated: bool, ablations: frozenset = frozenset(),
                   kv_loop: bool = False):
    """Kernel body of :func:`chunk_wy_bwd_mosaic`: one chunk of one ``(b, h)`` per CTA.

    ``refs``: the inputs ``k, v, dw, du, g, beta, doc, conn`` (then ``dk_in`` with ``dk_in``,
    ``dgt_in, bnd_in`` with ``dg_in``), the outputs ``dk, dv, dbeta, dg``, and the scratch of
    :func:`chunk_wy_bwd_mosaic` in its order (``uh_s, ul_s`` only without ``du16``,
    ``dgi_s, bnd_s`` only with ``dg_in``, ``dk_bar`` only with ``dk_in``, ``dkacc_s, k_bar``
    only with ``kv_loop``), then ``shim``.

    ``shim`` (interpret only): SMEM copies of what the GPU reads as transposed views (``k^T``,
    ``v^T``, ``X^T`` and ``R^T`` in two halves each) or from registers (the merge's ``Y``, the
    halves of ``dX`` and ``R``).

    Static flags: ``du16``: ``dU`` arrives in the input dtype and is its own ``hi`` term (its
    ``lo`` term is exactly 0, so the products with it are skipped); ``dk16``, ``dv16``: ``dk``,
    ``dv`` leave in the input dtype, rounded once from fp32 (staged in the 16-bit ``dW`` hi
    and ``dU`` hi tiles once their last product has been read); ``kv_loop`` (GVA, MOSAIC_GPU.md
    Sec. 27.5): the grid's ``h`` axis runs over key heads, ``k`` is loaded once (on ``k_bar``)
    and the CTA loops over the key head's ``group`` value heads ``hk * group + j``, adding each
    one's fp32 ``dk`` into the fp32 SMEM tile ``dkacc_s``; the sum leaves once after the loop,
    ``[B, Tp, Hk, K]``, rounded once (staged in ``wh_s``) with ``dk16``; ``dk_in``: an fp32
    partial ``dk`` (per value head) is loaded into the fp32 ``dk`` staging tile after ``dW``
    has been split out of it, and the kernel's ``dk`` is added to it; ``dg_in``: a per-token
    fp32 ``dL/dG`` partial and per-row boundary partials (``chunk_delta_grads_mosaic``'s
    ``dgt``, ``bnd``) are added in-kernel; ``gated``: ``dL/dG`` leaves as ``dL/dg``, its
    in-chunk reverse cumsum done here (``dg_t = sum_{s >= t} dL/dG_s + sum_s bnd_s``, a
    masked ``[64, 64]`` row sum in fp32).

    Register budget (MOSAIC_GPU.md Sec. 25): the fp32 ``[64, K]`` accumulators ``R K + R^T K``,
    ``Z`` and ``Y`` are formed one at a time, each stored to SMEM (the ``dk``, ``dv`` staging)
    and reduced to its row sums at once; ``dW``, ``dU`` are left operands from SMEM, not
    registers; nothing ``[64, 64]`` (``K K^T``, ``E``) is kept across the inverse (both are
    formed again for ``dA``).

    ``ablations`` (:data:`WY_BWD_ABLATIONS`; empty for the real kernel): timing ablations,
    wrong numbers by design.
    """
    refs = list(refs)

    def take(n):
        out = refs[:n]
        del refs[:n]
        return out

    k_ref, v_ref, dw_ref, du_ref, g_ref, beta_ref, doc_ref, conn_ref = take(8)
    dkin_ref, = take(1) if dk_in else (None,)
    dgin_ref, bndin_ref = take(2) if dg_in else (None, None)
    dk_ref, dv_ref, db_ref, dg_ref = take(4)
    (k_s, v_s, dw_s, du_s, g_row_s, g_col_s, b_row_s, b_col_s, doc_row_s, doc_col_s, c_row_s,
     c_col_s, l_s, x_s, xh_s, xl_s, wh_s, wl_s) = take(18)
    uh_s, ul_s = (du_s, None) if du16 else take(2)
    sh_s, sl_s, db_s, dg_s = take(4)
    dgi_s, bnd_s = take(2) if dg_in else (None, None)
    in_bar, = take(1)
    dk_bar, = take(1) if dk_in else (None,)
    dkacc_s, k_bar = take(2) if kv_loop else (None, None)
    shim = refs
    n, h, b = lax.axis_index("n"), lax.axis_index("h"), lax.axis_index("b")
    # GVA: value head h reads key head h // group; with kv_loop h is the key head.
    hk = h if kv_loop else lax.div(h, group)
    rows = pl.ds(n * CHUNK, CHUNK)

    def head(h, xl_s=xl_s, wl_s=wl_s, ul_s=ul_s, dg_s=dg_s):
        """One value head ``h`` of the chunk (``k_s`` loaded, or its copy issued on ``in_bar``,
        by the caller): ``dv``, ``dbeta``, ``dL/dG`` stored; ``dk`` stored, or with ``kv_loop``
        added into ``dkacc_s``. The keyword defaults: tiles the body rebinds (``None`` under
        ``no_split``; ``dg_s`` to the cumsum's output tile)."""
        plgpu.copy_gmem_to_smem(v_ref.at[b, rows, h], v_s, in_bar)
        plgpu.copy_gmem_to_smem(dw_ref.at[b, rows, h], dw_s, in_bar)
        plgpu.copy_gmem_to_smem(du_ref.at[b, rows, h], du_s, in_bar)
        # Row and column views of one vector need different register layouts: separate copies.
        for ref, row_s, col_s in ((g_ref.at[b, h], g_row_s, g_col_s),
                                  (beta_ref.at[b, h], b_row_s, b_col_s),
                                  (doc_ref.at[b], doc_row_s, doc_col_s),
                                  (conn_ref.at[b], c_row_s, c_col_s)):
            plgpu.copy_gmem_to_smem(ref.at[rows], row_s, in_bar)
            plgpu.copy_gmem_to_smem(ref.at[rows], col_s, in_bar)
        if dg_in:
            plgpu.copy_gmem_to_smem(dgin_ref.at[b, h, rows], dgi_s, in_bar)
            plgpu.copy_gmem_to_smem(bndin_ref.at[b, h, rows], bnd_s, in_bar)
        plgpu.barrier_wait(in_bar)
        if "io" in ablations:  # timing ablation: the loads, then the loaded tiles go out
            db_s[...] = mgl.load_rows(b_row_s, interpret)
            dg_s[...] = mgl.load_rows(g_row_s, interpret)
            plgpu.commit_smem()
            _store_outputs(dw_s, du_s, db_s, dg_s, dk_ref, dv_ref, db_ref, dg_ref, b, h, rows,
                           dk_head=hk if kv_loop else h)  # kv_loop: the group's last head's
            return
        no_split, no_mma = "no_split" in ablations, "no_mma" in ablations
        if interpret:
            kt_s, vt_s, t1_s, t2_s, t3_s, t4_s, y_s, q1_s, q2_s = shim
        else:
            kt_s = vt_s = t1_s = t2_s = t3_s = t4_s = y_s = q1_s = q2_s = None
        sq = (CHUNK, CHUNK)
        dtype = k_s.dtype
        f32 = jnp.float32

        def matmul(terms, shape, stand_in=None):
            """Sum of ``wgmma(lhs, rhs)`` over ``terms`` (one fp32 accumulator); the barrier keeps
            the arithmetic after the accumulator read (jla's pitfall). Terms with a ``None``
            operand (a lo term that is absent: ``no_split``, or a 16-bit ``dU``'s) are dropped;
            the ``no_mma`` ablation returns ``stand_in()``."""
            if no_mma and stand_in is not None:  # timing ablation: no product
                return stand_in()
            # A None operand is a lo term that is not there: under the no_split timing ablation,
            # or dU's with du16 (exactly 0). Its products are dropped.
            terms = [t for t in terms if t[0] is not None and t[1] is not None]

            def body(acc):
                for lhs, rhs in terms:
                    plgpu.wgmma(acc, lhs, rhs)
                return acc[...]

            return lax.optimization_barrier(pl.run_scoped(body, plgpu.ACC(shape)))

        def split(x):
            """fp32 ``x`` as two 16-bit terms ``hi + lo`` (about 16 significant bits together);
            ``lo`` is ``None`` under the ``no_split`` ablation."""
            hi = x.astype(dtype)
            if no_split:  # timing ablation: no lo term
                return hi, None
            return hi, (x - hi.astype(f32)).astype(dtype)

        def store(ref, x):
            """``ref[...] = x`` unless ``x`` is ``None`` (a lo term under ``no_split``)."""
            if x is not None:
                ref[...] = x

        def by_col(x):
            return lax.broadcast_in_dim(x, sq, [1])

        def lhs(x, scratch):
            return None if x is None else mgl.lhs_operand(x, scratch, interpret)

        def tr(ref, scratch):
            return None if ref is None else mgl.transposed(ref, scratch, interpret)

        def tile(*refs):
            """The fp32 sum of SMEM tiles: ``no_mma``'s stand-in for a product."""
            return sum(mgl.load_tile(r, interpret).astype(f32) for r in refs)

        def row_sum(ref, x):
            """``sum_c ref[:, c] x[:, c]`` (``ref``: a 16-bit SMEM tile, ``x``: fp32)."""
            return jnp.sum(mgl.load_tile(ref, interpret).astype(f32) * x, axis=1)

        def chunk_decay():
            """``E``: ``E_ij = e^{G_i - G_j}`` on ``M`` (j < i, same document), else 0 (masked in
            the exponent, so ``E <= 1``). ``E`` is the mask wherever one is needed (``A``, ``dA``
            on ``M``). Formed twice (``A``, then ``dA``) from the SMEM vectors rather than kept
            live across the inverse."""
            i, j = mgl.iota(sq, 0, interpret), mgl.iota(sq, 1, interpret)
            g_i, g_j = mgl.load_rows(g_row_s, interpret), mgl.load_cols(g_col_s, interpret)
            d_i, d_j = mgl.load_rows(doc_row_s, interpret), mgl.load_cols(doc_col_s, interpret)
            strict = (j < i) & (mgl.by_row(d_i, sq) == by_col(d_j))
            if "no_exp" in ablations:  # timing ablation: the masked exponent, no exp
                return jnp.where(strict, mgl.by_row(g_i, sq) - by_col(g_j), 0.0)
            return jnp.exp(jnp.where(strict, mgl.by_row(g_i, sq) - by_col(g_j), -jnp.inf))

        b_i = mgl.load_rows(b_row_s, interpret)
        a = matmul([(k_s, tr(k_s, kt_s))], sq) * (mgl.by_row(b_i, sq) * chunk_decay())  # A
        if "no_inverse" in ablations:  # timing ablation: A stands in for X
            x = a
        else:
            x = kgd.wy_inverse(a, l_s, x_s, y_s, interpret)  # X = (I + A)^{-1}, as the forward
        # X as hi + lo in SMEM: X^T is a left (Y, Z, dA) and a right (dX X^T) operand below.
        xh, xl = split(x)
        xh_s[...] = xh
        store(xl_s, xl)
        # dW, dU (fp32 from HBM) as hi + lo in SMEM, left and right operands from there. A 16-bit
        # dU (du16) is its own hi term, read in place; its lo term would be exactly 0.
        for src, hi_s, lo_s in ((dw_s, wh_s, wl_s),) + (() if du16 else ((du_s, uh_s, ul_s),)):
            hi, lo = split(mgl.load_tile(src, interpret))
            hi_s[...] = hi
            store(lo_s, lo)
        plgpu.commit_smem()
        if dk_in:  # dW has been read out of dw_s (the barrier above): the dk partial lands there
            plgpu.copy_gmem_to_smem(dkin_ref.at[b, rows, h], dw_s, dk_bar)
        if no_split:  # timing ablation: the lo tiles are not operands
            xl_s = wl_s = ul_s = None
        xt_h, xt_l = tr(xh_s, t1_s), tr(xl_s, t2_s)

        # dX = (dW K^T) Dw + (dU V^T) Db: the scalings go on the columns in fp32.
        b_j, c_j = mgl.load_cols(b_col_s, interpret), mgl.load_cols(c_col_s, interpret)
        g_j = mgl.load_cols(g_col_s, interpret)
        k_t, v_t = tr(k_s, kt_s), tr(v_s, vt_s)
        dx_w = matmul([(wh_s, k_t), (wl_s, k_t)], sq, lambda: tile(xh_s))
        dx_u = matmul([(uh_s, v_t), (ul_s, v_t)], sq, lambda: tile(xh_s))
        w_col = b_j * c_j * jnp.exp(g_j)  # Dw, columns
        dx = dx_w * by_col(w_col) + dx_u * by_col(b_j)
        # dX X^T, then dA = -X^T (dX X^T), kept on M.
        dxh, dxl = split(dx)
        dxh_op, dxl_op = lhs(dxh, q1_s), lhs(dxl, q2_s)
        dxxt = matmul([(dxh_op, xt_h), (dxl_op, xt_h), (dxh_op, xt_l)], sq,
                      lambda: sum(x.astype(f32) for x in (dxh, dxl) if x is not None))
        sh, sl = split(dxxt)
        sh_s[...] = sh
        store(sl_s, sl)
        plgpu.commit_smem()
        sl_op = None if no_split else sl_s
        # X^T (dX X^T) = -dA. On M: R' = dA * E (E is 0 off M; acc * -E, not -acc: jla saw a
        # negated fresh accumulator read as zeros, MOSAIC_GPU.md) and R = diag(beta) R'.
        da = matmul([(xt_h, sh_s), (xt_l, sh_s), (xt_h, sl_op)], sq, lambda: tile(sh_s))
        rp = da * (chunk_decay() * jnp.float32(-1.0))
        kk = matmul([(k_s, tr(k_s, kt_s))], sq,  # K K^T again (not kept across the inverse)
                    lambda: tile(xh_s))
        db_a = jnp.sum(rp * kk, axis=1)  # sum_j dA_ij (k_i . k_j) E_ij
        rh, rl = split(mgl.by_row(b_i, sq) * rp)
        sh_s[...] = rh  # the dA product has read sh_s, sl_s (its accumulator was read)
        store(sl_s, rl)
        plgpu.commit_smem()
        # R K + R^T K in one accumulator (dk's first terms, into dw_s). k_i . (R K)_i is
        # sum_j R_ij (k_i . k_j) = beta_i db_a_i, so k_i . (R^T K)_i is the row sum less that.
        rk = matmul([(lhs(rh, q1_s), k_s), (lhs(rl, q2_s), k_s),
                     (tr(sh_s, t3_s), k_s), (tr(sl_op, t4_s), k_s)], dw_s.shape,
                    lambda: tile(k_s))
        if not dk_in:
            dw_s[...] = rk
        k_rk = b_i * db_a  # k_i . (R K)_i
        k_rtk = row_sum(k_s, rk) - k_rk  # k_i . (R^T K)_i (this kernel's rk only)
        if dk_in:
            plgpu.barrier_wait(dk_bar)
            dw_s[...] = mgl.load_tile(dw_s, interpret) + rk  # plus the other kernel's fp32 dk
        # Z = X^T dU (hi hi + lo hi + hi lo), then at once dv = Db Z and v_i . Z_i = dL/dDb_ii.
        z_u = matmul([(xt_h, uh_s), (xt_l, uh_s), (xt_h, ul_s)], du_s.shape, lambda: tile(uh_s))
        dv_val = mgl.by_row(b_i, z_u.shape) * z_u
        dv_s = uh_s if dv16 else du_s  # Z's accumulator was read: uh_s is free (du_s if du16)
        dv_s[...] = dv_val.astype(dv_s.dtype)  # rounded once
        vdz = row_sum(v_s, z_u)
        # Y = X^T dW, then dk += Dw Y and k_i . Y_i = dL/dDw_ii.
        c_i, g_i = mgl.load_rows(c_row_s, interpret), mgl.load_rows(g_row_s, interpret)
        e_i = c_i * jnp.exp(g_i)  # conn e^G, rows
        w_row = b_i * e_i  # Dw, rows
        y_w = matmul([(xt_h, wh_s), (xt_l, wh_s), (xt_h, wl_s)], dw_s.shape, lambda: tile(wh_s))
        dk_val = mgl.load_tile(dw_s, interpret) + mgl.by_row(w_row, y_w.shape) * y_w
        if kv_loop:  # the group sum in fp32; each thread reads back what it wrote
            dk_s = None
            dkacc_s[...] = mgl.load_tile(dkacc_s, interpret) + dk_val
        else:
            dk_s = wh_s if dk16 else dw_s  # Y's accumulator was read: wh_s is free
            dk_s[...] = dk_val.astype(dk_s.dtype)  # rounded once
        kdy = row_sum(k_s, y_w)
        db_s[...] = db_a + e_i * kdy + vdz  # dbeta
        dlg = k_rk - k_rtk + w_row * kdy  # dL/dG
        if dg_in:
            dlg = dlg + mgl.load_rows(dgi_s, interpret)  # the chunk-local part, per token
        dg_s[...] = dlg
        plgpu.commit_smem()
        if gated:
            # dL/dg_t = sum_{s >= t} dL/dG_s (+ the boundary term <S', dS'> at s = L, whose
            # per-row partials bnd_s reach every t): one masked [64, 64] row sum, fp32.
            i, j = mgl.iota(sq, 0, interpret), mgl.iota(sq, 1, interpret)
            later = by_col(mgl.load_cols(dg_s, interpret))
            terms = jnp.where(j >= i, later, 0.0)
            if dg_in:
                terms = terms + by_col(mgl.load_cols(bnd_s, interpret))
            dg_fin = jnp.sum(terms, axis=1)
            out_g = dgi_s if dg_in else dg_s  # dgi_s was read before the last barrier
            if not dg_in:
                plgpu.commit_smem()  # every thread has read dg_s before it is overwritten
            out_g[...] = dg_fin
            plgpu.commit_smem()
            dg_s = out_g
        if "no_store" not in ablations:  # the no_store timing ablation skips the TMA stores
            _store_outputs(dk_s, dv_s, db_s, dg_s, dk_ref, dv_ref, db_ref, dg_ref, b, h, rows)

    if not kv_loop:
        plgpu.copy_gmem_to_smem(k_ref.at[b, rows, hk], k_s, in_bar)
        head(h)
        return
    # GVA (MOSAIC_GPU.md Sec. 27.5): the grid's h is the key head; k once, then its value heads.
    plgpu.copy_gmem_to_smem(k_ref.at[b, rows, hk], k_s, k_bar)
    dkacc_s[...] = mgl.zeros_acc(dkacc_s.shape, interpret)
    plgpu.barrier_wait(k_bar)

    def value_head(j, carry):
        plgpu.commit_smem()  # every thread is done with the previous head's tiles
        head(hk * group + j)
        return carry

    lax.fori_loop(0, group, value_head, None)
    dk_sum = mgl.load_tile(dkacc_s, interpret)
    if dk16:  # wh_s (16-bit [64, K]) is free after the last head's Y product
        wh_s[...] = dk_sum.astype(wh_s.dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(wh_s if dk16 else dkacc_s, dk_ref.at[b, rows, hk])
    plgpu.wait_smem_to_gmem(0)


def _store_outputs(dk_s, dv_s, db_s, dg_s, dk_ref, dv_ref, db_ref, dg_ref, b, h, rows,
                   dk_head=None):
    """The four TMA stores of the staged ``dk``, ``dv``, ``dbeta`` and ``dL/dG`` (``dk`` at head
    ``dk_head``, default ``h``; not stored when ``dk_s`` is ``None``: the GVA loop stores the
    group sum once)."""
    if dk_s is not None:
        plgpu.copy_smem_to_gmem(dk_s, dk_ref.at[b, rows, h if dk_head is None else dk_head])
    plgpu.copy_smem_to_gmem(dv_s, dv_ref.at[b, rows, h])
    plgpu.copy_smem_to_gmem(db_s, db_ref.at[b, h, rows])
    plgpu.copy_smem_to_gmem(dg_s, dg_ref.at[b, h, rows])
    plgpu.wait_smem_to_gmem(0)


def check_ablations(ablations) -> Tuple[str, ...]:
    """``ablations`` (a tuple of names in :data:`WY_BWD_ABLATIONS`) sorted; ``()`` is the real
    kernel.

    Raises:
        ValueError: not a tuple, an unknown or repeated name, or ``io`` with another name.
    """
    if not isinstance(ablations, tuple):
        raise ValueError(f"ablations must be a tuple of names in {WY_BWD_ABLATIONS}, got "
                         f"{ablations!r}")
    for name in ablations:
        if name not in WY_BWD_ABLATIONS:
            raise ValueError(f"ablation {name!r} not in {WY_BWD_ABLATIONS} (timing ablations, "
                             "MOSAIC_GPU.md Sec. 26)")
    if len(set(ablations)) != len(ablations):
        raise ValueError(f"ablations must not repeat a name, got {ablations!r}")
    if "io" in ablations and len(ablations) > 1:
        raise ValueError(f"ablation 'io' already skips every stage: use it alone, got "
                         f"{ablations!r}")
    return tuple(sorted(ablations))


def ablated_name(ablations: Tuple[str, ...]) -> str:
    """The kernel name of a variant: :data:`KERNEL_NAME` for ``()``, else
    ``KERNEL_NAME + "_abl_" + "_".join(sorted names)``."""
    return KERNEL_NAME if not ablations else KERNEL_NAME + "_abl_" + "_".join(sorted(ablations))


@functools.partial(jax.jit, static_argnames=("out_dtype", "gva_loop", "interpret", "ablations"))
def chunk_wy_bwd_mosaic(
    k: jax.Array,
    v: jax.Array,
    g: Optional[jax.Array],
    beta: jax.Array,
    dw: jax.Array,
    du: jax.Array,
    *,
    segment_ids: Optional[jax.Array] = None,
    gate_cumsum: Optional[jax.Array] = None,
    doc_vecs: Optional[Tuple[jax.Array, jax.Array, jax.Array]] = None,
    dk_partial: Optional[jax.Array] = None,
    dg_partial: Optional[Tuple[jax.Array, jax.Array]] = None,
    out_dtype=jnp.float32,
    gva_loop: bool = False,
    interpret: bool = False,
    ablations: Tuple[str, ...] = (),
) -> Tuple[jax.Array, jax.Array, jax.Array, Optional[jax.Array]]:
    """``dk``, ``dv``, ``dbeta`` and ``dg`` through the WY factors ``W``, ``U`` (module docstring).

    The counterpart of FLA's ``prepare_wy_repr_bwd`` (``fla/ops/gated_delta_rule/wy_fast.py``)
    and of ``jax.vjp`` of :func:`pallas_kernels.gated_delta_rule.chunked.wy_representation`, as
    a Mosaic GPU kernel: the backward of
    :func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu.chunk_wy_mosaic`, stage 4 of
    :mod:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu_bwd`. In the composed GDN backward,
    ``dk`` is added to ``chunk_delta_grads_mosaic``'s ``dk`` and ``dg`` to its ``dg`` (both are
    gradients of the same per-token inputs); ``dv`` and ``dbeta`` are the whole gradients.

    One CTA per ``(chunk, value head, batch row)``, one warpgroup, twelve TMA copies on one
    barrier (``k`` of key head ``h // group``, ``v``, ``dW`` and ``dU`` in fp32, row and column
    copies of the gate, ``beta``, document and ``conn`` vectors). On the tensor cores (fp32
    accumulation): ``K K^T``; ``X`` recomputed by the forward's doubling inverse (10 fp16
    products); then ``dW K^T``, ``dU V^T``, ``dX X^T``, ``X^T (dX X^T)``, ``K K^T`` again,
    ``R K + R^T K`` (one accumulator), ``Z = X^T dU`` and ``Y = X^T dW``, in that order, so that
    one fp32 ``[64, K]`` accumulator is live at a time (each goes to SMEM and to its row sums
    at once; no spills in ptxas at K = V = 128 or 64, MOSAIC_GPU.md Sec. 25). Every operand
    that is not an input (``X``, ``dW``, ``dU``, ``dX``, ``dX X^T``, ``R``) is split into two
    16-bit terms ``hi + lo``; products of two such operands use three terms
    (``hi hi + lo hi + hi lo``), so about 16 significant bits reach the fp32 accumulators: 21
    ``wgmma``s after the inverse. ``X^T`` and ``R^T`` are transposed SMEM views. The gate and
    ``beta`` terms are row sums in fp32 registers; ``dL/dG`` needs no column sum:
    ``k_i . (R K)_i = beta_i sum_j dA_ij (k_i . k_j) E_ij`` (``dbeta``'s ``A`` term, from the
    fp32 ``[64, 64]`` tiles) and ``k_i . (R^T K)_i`` is the row sum of ``K * (R K + R^T K)``
    less that. SMEM at K = V = 128: 225,288 B (one CTA per SM; the fp32 ``dW``, ``dU`` tiles
    stage ``dk``, ``dv`` on the way out).

    With GVA (``Hk < H``, ``G = H / Hk``) and ``gva_loop`` (MOSAIC_GPU.md Sec. 27.5; off by
    default, it spills) the CTA is one ``(chunk, key
    head, batch row)``: ``k`` is loaded once and the kernel above runs for the ``G`` value
    heads ``hk G + j`` in a loop, each head's fp32 ``dk`` (``dk_partial`` included) added into
    an fp32 ``[64, K]`` SMEM tile (+32 KB at K = 128); ``dk = sum_j dk_(hk G + j)`` leaves once,
    ``[B, T, Hk, K]``, rounded once to ``out_dtype``. Without GVA the kernel is unchanged.

    As ``mosaic_vjp`` calls it (MOSAIC_GPU.md Sec. 27): ``du`` in the input dtype is read in
    place (no fp32 copy, its zero ``lo`` products skipped; 178,192 B of SMEM at K = V = 128),
    the chunk-local ``dk`` (fp32, per value head) lands in the ``dW`` tile once ``dW`` is split
    out of it (a second barrier) and is added to ``R K + R^T K``, the chunk-local ``dL/dG``
    and boundary partials are added before the reverse cumsum, and ``dk``, ``dv`` leave in the
    input dtype (staged in the ``dW`` hi and ``dU`` hi tiles), so no XLA op touches them.

    Args:
        k: keys ``[B, T, Hk, K]``, bf16 or fp16, L2-normalised (as for ``chunk_wy_mosaic``);
            ``H % Hk == 0``.
        v: values ``[B, T, H, V]``, k's dtype. ``K, V`` in {64, 128}.
        g: per-token log-decay ``[B, T, H]`` (natural log, ``<= 0``), or ``None`` (DeltaNet).
        beta: write strengths ``[B, T, H]``, any float dtype (read as fp32).
        dw: ``dL/dW`` ``[B, T, H, K]``, any float dtype (read as fp32; the hi/lo split keeps
            about 16 bits; with fp16 inputs the terms are fp16, so very large or tiny gradients
            lose range).
        du: ``dL/dU`` ``[B, T, H, V]``, any float dtype: ``dv_new``. Read as it is (its own
            ``hi`` term, no fp32 copy) when in ``k``'s dtype and ``out_dtype`` is ``k``'s
            dtype, else read as fp32 (the same products: a 16-bit ``du``'s ``lo`` term is 0).
        segment_ids: optional int ``[B, T]``; documents start wherever the id changes.
        doc_vecs: optional ``(doc, conn, last)``, fp32 ``[B, Tp]`` each, as
            :func:`pallas_kernels.common.mosaic_gpu_lib.doc_vectors` gives them for
            ``segment_ids``, formed once by a caller that runs several kernels (``mosaic_vjp``);
            ``None``: formed here.
        gate_cumsum: optional fp32 ``[B, H, Tp]`` (``Tp = 64 ceil(T / 64)``), ``g``'s
            chunk-local cumsum as :func:`pallas_kernels.common.mosaic_gpu_lib.chunk_cumsum`
            gives it, computed once by a caller that runs several kernels on one ``g``
            (``mosaic_vjp``); ``None``: computed here.
        dk_partial: optional fp32 ``[B, T, H, K]``, a partial ``dL/dk`` per value head (the
            chunk-local ``dk`` of :func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu_bwd.
            chunk_delta_grads_partials_mosaic`), added to this kernel's ``dk`` in fp32 before
            the (in-kernel) GVA sum and the one rounding to ``out_dtype``.
        dg_partial: optional ``(dgt, bnd)``, fp32 ``[B, H, Tp]`` each (``Tp = 64 ceil(T / 64)``;
            the same function's per-token ``dL/dG`` and per-row boundary partials), added to
            ``dL/dG`` in-kernel before the in-chunk reverse cumsum: ``dg_t`` gains
            ``sum_{s >= t} dgt_s + sum_s bnd_s`` (sums over the chunk of ``t``). Ignored when
            ``g`` is ``None``.
        out_dtype: dtype of ``dk`` and ``dv`` (static): fp32 (default) or ``k``'s dtype (each
            rounded once from the fp32 result; ``dk`` summed over the GVA group in fp32 first,
            in the kernel with ``gva_loop``, else in XLA).
        gva_loop: with GVA (``Hk < H``; static), one CTA per key head loops over its value
            heads and sums ``dk`` in-kernel (the docstring above). Off by default: offline
            ptxas finds spills with it (MOSAIC_GPU.md Sec. 27.5). Ignored without GVA.
        interpret: run in Mosaic GPU interpret mode (CPU; slow, for tests).
        ablations: timing ablations, names in :data:`WY_BWD_ABLATIONS` (static; benchmarks
            only, ``benchmarks/profile_wy_bwd.py``; wrong numbers by design; MOSAIC_GPU.md
            Sec. 26). ``()``: the real kernel.

    Returns:
        ``(dk, dv, dbeta, dg)``: ``dk`` ``[B, T, Hk, K]`` (summed over each GVA group) and
        ``dv`` ``[B, T, H, V]`` in ``out_dtype``, fp32 ``dbeta`` ``[B, T, H]`` and fp32 ``dg``
        ``[B, T, H]``, the gradient w.r.t. the per-token log-decay ``g`` (the in-chunk reverse
        cumsum ``dg_t = sum_{s >= t} dL/dG_s`` done in-kernel, fp32), or ``None`` when ``g``
        is ``None``.

    Raises:
        ValueError: on mismatched shapes, unsupported head dims or dtypes, ``H`` not a
            multiple of ``Hk``, or a ``g``, ``beta``, ``dw``, ``du`` or ``segment_ids`` of the
            wrong shape; or as :func:`check_ablations`.
    """
    ablations = check_ablations(ablations)
    batch, seq_len, kv_heads, dk = k.shape
    heads, dv = v.shape[2], v.shape[3]
    mgl.check_kv_gates(k, v, g, segment_ids)
    if beta.shape != (batch, seq_len, heads):
        raise ValueError(f"beta must be [B, T, H] = {(batch, seq_len, heads)}, got {beta.shape=}")
    for name, x, d in (("dw", dw, dk), ("du", du, dv)):
        if x.shape != (batch, seq_len, heads, d):
            raise ValueError(f"{name} must be [B, T, H, {d}] = {(batch, seq_len, heads, d)}, "
                             f"got {name}.shape={x.shape}")

    f32 = jnp.float32
    out_dtype = jnp.dtype(out_dtype)
    if out_dtype not in (jnp.dtype(f32), jnp.dtype(k.dtype)):
        raise ValueError(f"out_dtype must be float32 or k's dtype {k.dtype}, got {out_dtype}")
    out16 = out_dtype != jnp.dtype(f32)
    if ablations and (out16 or dk_partial is not None or dg_partial is not None):
        raise ValueError("ablations time the kernel alone: no out_dtype, dk_partial or "
                         "dg_partial with them")
    num_chunks = -(-seq_len // CHUNK)
    padded = num_chunks * CHUNK
    if dk_partial is not None and dk_partial.shape != (batch, seq_len, heads, dk):
        raise ValueError(f"dk_partial must be [B, T, H, K] = {(batch, seq_len, heads, dk)}, "
                         f"got {dk_partial.shape=}")
    if g is None:
        dg_partial = None
    if dg_partial is not None and any(x.shape != (batch, heads, padded) for x in dg_partial):
        raise ValueError(f"dg_partial must be two [B, H, Tp] = {(batch, heads, padded)}, got "
                         f"{[x.shape for x in dg_partial]}")
    du16 = out16 and du.dtype == k.dtype
    # Padding tokens have k = v = dW = dU = 0, beta = 0 and g = 0: they contribute nothing.
    k, v = mgl.pad_time(k, num_chunks), mgl.pad_time(v, num_chunks)
    dw = mgl.pad_time(dw.astype(f32), num_chunks)
    du = mgl.pad_time(du if du16 else du.astype(f32), num_chunks)
    extra = []
    if dk_partial is not None:
        extra.append(mgl.pad_time(dk_partial.astype(f32), num_chunks))
    if dg_partial is not None:
        extra += [x.astype(f32) for x in dg_partial]
    group = heads // kv_heads
    kv_loop = gva_loop and group > 1  # one CTA per key head sums dk over its value heads
    dk_dtype = out_dtype if group == 1 or kv_loop else jnp.dtype(f32)  # else XLA's group sum
    gc = mgl.chunk_cumsum(g, (batch, seq_len, heads), num_chunks, gate_cumsum)  # [B, H, Tp]
    beta_hm = jnp.moveaxis(mgl.pad_time(beta.astype(f32), num_chunks), 1, 2)  # [B, H, Tp]
    doc, conn, _ = mgl.doc_vectors(segment_ids, batch, num_chunks, doc_vecs)  # [B, Tp] each
    vec = plgpu.SMEM((CHUNK,), f32)
    swz = mgl.swizzled_smem
    dtype = k.dtype
    sq_t = swz((CHUNK, CHUNK), dtype)
    shim = [plgpu.SMEM((dk, CHUNK), dtype),  # kt_s
            plgpu.SMEM((dv, CHUNK), dtype),  # vt_s
            plgpu.SMEM((CHUNK, CHUNK), dtype),  # t1_s: X^T hi
            plgpu.SMEM((CHUNK, CHUNK), dtype),  # t2_s: X^T lo
            plgpu.SMEM((CHUNK, CHUNK), dtype),  # t3_s: R^T hi
            plgpu.SMEM((CHUNK, CHUNK), dtype),  # t4_s: R^T lo
            swz((CHUNK, CHUNK), kgd.MERGE_DTYPE),  # y_s: the merges' Y
            sq_t, sq_t]  # q1_s, q2_s: dX hi, lo, then R hi, lo
    call = plgpu.kernel(
        functools.partial(_wy_bwd_kernel, group=group, interpret=interpret, du16=du16,
                          dk16=out16 and (group == 1 or kv_loop), dv16=out16,
                          dk_in=dk_partial is not None,
                          dg_in=dg_partial is not None, gated=g is not None,
                          **(dict(ablations=frozenset(ablations)) if ablations else {}),
                          **(dict(kv_loop=True) if kv_loop else {})),
        out_type=(jax.ShapeDtypeStruct((batch, padded, kv_heads if kv_loop else heads, dk),
                                       dk_dtype),  # dk (per value head without kv_loop)
                  jax.ShapeDtypeStruct((batch, padded, heads, dv), out_dtype),  # dv
                  jax.ShapeDtypeStruct((batch, heads, padded), f32),  # dbeta
                  jax.ShapeDtypeStruct((batch, heads, padded), f32)),  # dL/dG
        scratch_types=[
            swz((CHUNK, dk), dtype),  # k_s
            swz((CHUNK, dv), dtype),  # v_s
            swz((CHUNK, dk), f32),  # dw_s: dW, then dk_partial, then the fp32 staging of dk
            swz((CHUNK, dv), du.dtype),  # du_s: dU (its hi term if du16), then dv's staging
            vec, vec, vec, vec, vec, vec, vec, vec,  # g, beta, doc, conn (rows, columns)
            swz((CHUNK, CHUNK), kgd.MERGE_DTYPE),  # l_s: A for the inverse
            swz((CHUNK, CHUNK), kgd.MERGE_DTYPE),  # x_s: the inverse's running X
            sq_t, sq_t,  # xh_s, xl_s: X hi, lo
            swz((CHUNK, dk), dtype), swz((CHUNK, dk), dtype),  # wh_s, wl_s: dW hi, lo
        ] + ([] if du16 else [swz((CHUNK, dv), dtype), swz((CHUNK, dv), dtype)]) + [
            # uh_s, ul_s: dU hi, lo (not with du16); uh_s then stages a 16-bit dv, wh_s dk
            sq_t, sq_t,  # sh_s, sl_s: dX X^T hi, lo, then R hi, lo
            vec, vec,  # db_s, dg_s: staging of dbeta, dL/dG
        ] + ([vec, vec] if dg_partial is not None else []) + [  # dgi_s, bnd_s
            # in_bar: the 12 input copies (14 with dg_partial; k not among them with kv_loop)
            plgpu.Barrier(num_arrivals=12 + 2 * (dg_partial is not None) - kv_loop),
        ] + ([plgpu.Barrier(num_arrivals=1)] if dk_partial is not None else [])  # dk_bar
        + ([swz((CHUNK, dk), f32),  # dkacc_s: dk summed over the GVA group in fp32
            plgpu.Barrier(num_arrivals=1)] if kv_loop else [])  # k_bar: k landed
        + (shim if interpret else []),
        # chunks first: CUDA caps grid y and z at 65535; with kv_loop the key heads
        grid=(num_chunks, kv_heads if kv_loop else heads, batch),
        grid_names=("n", "h", "b"),
        compiler_params=mgl.compiler_params(),
        interpret=mgl.interpret_params() if interpret else None,
        kernel_name=ablated_name(ablations),
    )
    with jax.named_scope("gdn_chunk_wy_bwd_mosaic"):
        dk_, dv_, dbeta, dgc = call(k, v, dw, du, gc, beta_hm, doc, conn, *extra)
        dk_ = dk_[:, :seq_len] if kv_loop else kbwd._group_sum(
            dk_[:, :seq_len], kv_heads).astype(out_dtype)
        dbeta = jnp.moveaxis(dbeta, 1, 2)[:, :seq_len]
        dg = None
        if g is not None:  # dL/dg_t: the in-chunk reverse cumsum was done in the kernel
            dg = jnp.moveaxis(dgc, 1, 2)[:, :seq_len]
    return dk_, dv_[:, :seq_len], dbeta, dg
