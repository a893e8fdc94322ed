"""Gated DeltaNet / DeltaNet backward on Pallas Mosaic GPU (Hopper): one fused chunk-local kernel.

:func:`chunk_bwd_fused_mosaic` (kernel ``gdn_chunk_bwd_fused``) replaces stages 3 and 4 of
:mod:`pallas_kernels.gated_delta_rule.mosaic_vjp`'s backward
(:func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu_bwd.chunk_delta_grads_partials_mosaic`
and :func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu_wy_bwd.chunk_wy_bwd_mosaic`): from
``q, k, v, do, v_new, dv_new``, the gate-free inverse ``T0`` and the states ``h``, ``dh`` it
gives ``(dq, dk, dv, dbeta, dg)`` in one launch, with no fp32 intermediate through HBM, no
recomputed inverse and hi/lo operand splits only in ``dA0``'s two products. Math: jla's
value-space form (``pallas_kernels/common/MOSAIC_GPU.md`` Sec. 31.3, corrected 2026-12-05;
jla 0.1.0's ``chunk_grads``; checked in fp64 by
:mod:`pallas_kernels.gated_delta_rule.bwd_value_space`, which is also this kernel's test
oracle).

Per batch row, value head and chunk of ``C = 64`` tokens (notation of ``bwd_value_space``:
``G`` the chunk-local inclusive fp32 cumsum of ``g``, 0 for DeltaNet; ``conn_t``, ``last_t``
the document vectors; ``S`` the state entering the chunk, ``[K, V]``; ``dS'`` the gradient of
the state leaving it)::

    D_ts    = e^{G_t - G_s} [s <= t, same document]          (DeltaNet: the mask)
    Gamma_t = conn_t e^{G_t},  Gamma_r,s = last_s e^{G_L - G_s},  gamma = conn_L e^{G_L}
    X = T0 * D,  Ag = X diag(beta),  U' = Gamma K S,  Wv = V - U'
    dP      = scale (dO v_new^T) * D
    dq      = scale Gamma (dO S^T) + dP K
    dks     = Gamma_r (v_new dS'^T),   dk_loc = dks + dP^T Q
    Z       = X^T dv_new,   dv = Ag^T dv_new = diag(beta) Z
    dAg     = dv_new Wv^T
    dA0     = -T0^T (dAg * D * beta_s) T0^T on the strict lower part,   R = diag(beta) dA0
    dk      = dk_loc - Gamma (dv S^T) + R K + R^T K
    dbeta_t = sum_s dA0_ts (k_t . k_s) + Wv_t . Z_t
    dL/dG_t = q_t . dq_t - k_t . dk_loc,t + sum_s dAg_ts Ag_ts - dv_t . v_t
    dg_t    = sum_{s >= t in the chunk} dL/dG_s + <S', dS'>,
    <S', dS'> = gamma <S, dS'> + sum_s k_s . dks_s

Two identities take Sec. 31.3's column sums off the kernel (no cross-warp column reduction,
no transposed products): the column sums of ``dAg * T0 * D`` are
``sum_t dAg_ts X_ts = Wv_s . (X^T dv_new)_s = Wv_s . Z_s`` (``dbeta``'s second term), and
those of ``F = dAg * Ag`` are ``beta_s Wv_s . Z_s = dv_s . Wv_s``, so Sec. 31.3's
``-(F^T 1)_t - dv_t . U'_t`` is ``-dv_t . (Wv_t + U'_t) = -dv_t . v_t``. In the kernel the
gate's two sums of ``F`` use the 16-bit ``X`` and ``Wv`` that the ``Z`` and ``dAg`` products
read (``F 1`` from ``X``'s tile, ``F^T 1 = dv . Wv16``), so that they cancel over the chunk
to fp32 rounding: with the fp32 ``Wv`` the reverse cumsum gathered their rounding into a
bias of ``dg`` (1.1e-2 relative RMS against the oracle; 3.8e-4 so). The boundary term
``<S', dS'>`` is counted once: as the per-row partials ``bnd_s`` added to every ``dg_t`` after
the in-chunk reverse cumsum (not also in ``dL/dG_L``).

Structure (2026-12-05, first version): one warpgroup per CTA, grid ``(N, H, B)`` (chunks
first), one accumulator and one wait at a time, in the order ``dP``, ``Z``, ``U'`` (then
``dv`` leaves), ``dAg``, ``M = dT0 T0^T``, ``dA0 = -T0^T M``, ``K K^T`` (then ``dbeta``),
``dO S^T`` then ``+ dP K`` (then ``dq``), ``dks`` then ``+ dP^T Q`` then
``+ R K + R^T K + (-Gamma dv) S^T`` (then ``dk`` and ``dg``): 16 ``wgmma``, 36 units of
``64^3`` at K = V = 128 (Sec. 31.3's 36, less its transposed ``dAg^T`` product, plus two lo
terms). Seventeen TMA copies on one
barrier. All operands are 16-bit with fp32 accumulation; the row scalings (``Gamma``,
``Gamma_r``, ``beta``, ``scale``) are applied in fp32 to the accumulators, except
``-Gamma dv``, a 16-bit operand (from the 16-bit ``dv``, over ``v_new``'s tile once ``dks``
has read it) so that ``dk``'s last three terms share one accumulator; the gate and ``dbeta``
terms are fp32 row sums. On the GPU the chains ``dq`` and ``dk`` are one accumulator each
(``ACC.init`` with the fp32 value so far, through ``pl.run_state``); the 0.10.2 interpreter
cannot run ``run_state``, so there a fresh accumulator and an fp32 add (the same sums). Only
``dT0`` and ``M`` (the two inputs of ``dA0``'s products) are split into hi + lo 16-bit terms
(Sec. 31.3's fallback, +2 units): with one term each, ``dbeta``'s error on correlated keys
was 2e-2 (``M``) and 3e-3 (``dT0``) relative RMS against the oracle. Offline ptxas (S1,
bf16, K = V = 128): 255 registers and 140 B of spill stores (MOSAIC_GPU.md Sec. 31.6).

``warpgroups=3`` (:func:`_fused_kernel_ws`, kernel ``gdn_chunk_bwd_fused_ws``, MOSAIC_GPU.md
Sec. 31.7): the same math, tiles and
products over three warpgroups (384 threads): WG0 the forward side (``dP``, ``X``, ``Z``,
``U'``, ``Wv``, ``dv``, ``-Gamma dv``, ``dq``), WG1 the inverse side (``dAg``, ``dT0``, ``M``,
``dA0``, ``K K^T``, ``R``, then ``dbeta`` and ``dg``), WG2 the key side (``dks``,
``<S', dS'>``, ``dk``), handing results over in SMEM behind nine one-shot barriers;
``setmaxnreg`` :data:`WS_REGISTERS` (240 / 96 / 168, chosen by offline ptxas: 16 B of spill
stores at K = V = 128). Products per warpgroup (units of ``64^3`` at K = V = 128): 14, 8, 14.
``gva_loop`` (three warpgroups, K = 64; on by default there since 2026-12-05, MOSAIC_GPU.md
Sec. 33): with GVA one CTA per key head runs its value heads in turn and sums ``dq``, ``dk``
in fp32 SMEM tiles, so both leave once, ``[B, T, Hk, K]`` in the input dtype, and XLA's
group sum is gone. Two things keep its registers down (offline ptxas, K = V = 64, S1 with
Hk = H / 2: 492 B of spill stores in Sec. 31.7's first form, 16 B now): the sums live in SMEM,
not in registers across the loop, and every tile is indexed in the loop by an opaque 0
(``min(int(conn_0), 0)``, read after the head's barrier), which is also added to the mask
iotas, so LLVM cannot hoist the tiles' addresses, ``wgmma`` descriptors and masks out of the
loop and keep them live across it; plus :data:`GVA_LOOP_REGISTERS`. Not yet run on a GPU.

SMEM at K = V = 128, bf16: 226,312 B as Mosaic GPU counts it (each buffer aligned to 1 KB,
Pallas' 2 KB reduction scratch; :data:`SMEM_LIMIT` 232,448), with or without GVA:
``q, k, v, do, v_new, dv_new, Wv`` 16 KB each, ``h, dh`` 32 KB each, ``T0, dP`` and three
``[64, 64]`` work tiles (``dT0`` hi then ``R``; ``X`` then ``M`` hi; the lo terms) 8 KB each,
the eleven fp32 vectors in one ``[11, 64]`` buffer. ``dv`` leaves through ``v``'s tile,
``dq`` and then ``dk`` through one staging tile that shares its bytes (``RefUnion``) with
``dv_new`` and ``Wv`` (both dead by then). With GVA
(``Hk < H``) and no ``gva_loop`` (K = 128, or one warpgroup) ``dq`` and ``dk`` leave per value
head in fp32 and XLA sums each group and rounds once (Sec. 27.5's contract). Three
warpgroups: 227,416 B (three more vectors, ten more barriers); with the GVA loop at
K = V = 64 153,704 B (two fp32 ``[64, 64]`` sums, two barriers).

CPU testing: interpret mode with the shims of :mod:`pallas_kernels.common.mosaic_gpu_lib`
(transposed operands copied into SMEM scratch; no ``RefUnion``, separate tiles), and
``jax.export`` for CUDA (``tests/pallas_kernels/kernel_mosaic_gdn_bwd_fused_test.py``).
Status (2026-12-05): CPU only, not run on a GPU.
"""

import functools
from typing import Optional, Tuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.common import mosaic_gpu_lib as mgl

CHUNK = mgl.CHUNK
KERNEL_NAME = "gdn_chunk_bwd_fused"
SMEM_LIMIT = 232_448  # bytes of SMEM one CTA may use on Hopper (227 KiB)
# Test-only wrong variants (``mutations``): each drops or doubles one term of the math, so the
# interpret tests can show that the references see it (MOSAIC_GPU.md Sec. 31.4 step 1). Never
# passed by the op.
MUTATIONS = (
    "no_strict_mask",  # dA0 masked by document only: its upper triangle (and diagonal) kept
    "no_rt_k",  # dk without R^T K
    "no_col_term",  # dL/dG without -(F^T 1) (the column sums of dAg * Ag): -dv.U' only
    "no_dv_u_term",  # dL/dG without -dv.U': -(F^T 1) only
    "no_cumsum",  # dg = dL/dG (+ the boundary), no in-chunk reverse cumsum
    "boundary_twice",  # <S', dS'> in dL/dG_L and again after the cumsum
)
_VECS = 11  # G, beta, doc rows and columns; conn, last; dL/dG, bnd, dbeta staging
_IN_COPIES = 17  # q, k, v, do, v_new, dv_new, T0, h, dh; G, beta, doc rows and columns; conn, last


def _make_ops(interpret: bool, mutations, g_row_s, g_col_s, b_row_s, b_col_s, doc_row_s,
              doc_col_s, zero=None):
    """The helpers both kernel bodies use (closures over the SMEM vectors): ``matmul``,
    ``matmul_add``, ``tr``, ``tile``, ``rows_of``, ``by_col``, ``row_dot``, ``iotas``,
    ``decay``, ``strict``, ``beta_rows``, ``beta_cols``, in that order. ``zero``: an int32 0
    the compiler cannot fold (the GVA loop's, :func:`_fused_kernel_ws`), added to the iotas so
    that the masks are formed where used, not hoisted out of the loop; ``None``: plain iotas."""
    f32 = jnp.float32
    sq = (CHUNK, CHUNK)

    def matmul(terms, shape):
        """Sum of ``wgmma(lhs, rhs)`` over ``terms`` in one fresh fp32 accumulator; the barrier
        keeps the arithmetic after the accumulator read (jla's pitfall, MOSAIC_GPU.md Sec. 2)."""
        def body(acc):
            for lhs, rhs in terms:
                plgpu.wgmma(acc, lhs, rhs)
            return acc[...]

        return lax.optimization_barrier(pl.run_scoped(body, plgpu.ACC(shape)))

    def matmul_add(init, terms):
        """``init + sum(wgmma(lhs, rhs))``: on the GPU one accumulator initialised with ``init``
        (``ACC.init``), so no second fp32 tile is live; the 0.10.2 interpreter cannot run
        ``ACC.init`` (``run_state``), so there a fresh accumulator and an add."""
        if interpret:
            return init + matmul(terms, init.shape)

        def body(acc):
            for lhs, rhs in terms:
                plgpu.wgmma(acc, lhs, rhs)

        return lax.optimization_barrier(pl.run_state(body)(plgpu.ACC.init(init)))

    def tr(ref, scratch):
        return mgl.transposed(ref, scratch, interpret)

    def tile(ref):
        return mgl.load_tile(ref, interpret).astype(f32)

    def rows_of(x, shape):
        return mgl.by_row(x, shape)

    def by_col(x, shape=sq):
        return lax.broadcast_in_dim(x, shape, [1])

    def row_dot(a, c):
        return jnp.sum(a * c, axis=1)

    # The [64, 64] masks and D are formed again wherever they are used (from the SMEM vectors),
    # not kept live across the products: registers are the limit.
    def iotas():
        i, j = mgl.iota(sq, 0, interpret), mgl.iota(sq, 1, interpret)
        return (i, j) if zero is None else (i + zero, j + zero)

    def decay():
        """D, fp32 [64, 64]: e^{G_t - G_s} on s <= t, same document, else 0."""
        i, j = iotas()
        return mgl.causal_decay(i, j, mgl.load_rows(g_row_s, interpret),
                                mgl.load_cols(g_col_s, interpret),
                                mgl.load_rows(doc_row_s, interpret),
                                mgl.load_cols(doc_col_s, interpret))

    def strict():
        """dA0's mask: s < t in the same document (``no_strict_mask``: the document only)."""
        i, j = iotas()
        same = (rows_of(mgl.load_rows(doc_row_s, interpret), sq)
                == by_col(mgl.load_cols(doc_col_s, interpret)))
        return same if "no_strict_mask" in mutations else same & (j < i)

    def beta_rows():
        return mgl.load_rows(b_row_s, interpret)

    def beta_cols():
        return by_col(mgl.load_cols(b_col_s, interpret))

    return (matmul, matmul_add, tr, tile, rows_of, by_col, row_dot, iotas, decay, strict,
            beta_rows, beta_cols)


def _ref_taker(refs):
    """``take(n)``: the next ``n`` of a kernel's ``refs``, in the order its docstring gives
    (``take(None)``: all the rest)."""
    refs = list(refs)

    def take(n):
        out = refs[:n]
        del refs[:n]
        return out

    return take


def _staging_refs(take, interpret):
    """``(dvn_s, wv_s, st_s)`` from ``take``: three refs when interpreting (the interpreter has
    no RefUnion: the staging tile of its own), else one RefUnion of ``(dvn_s, wv_s)`` and
    ``st_s`` sharing SMEM."""
    if interpret:
        return tuple(take(3))
    ((dvn_s, wv_s), st_s), = take(1)
    return dvn_s, wv_s, st_s


def _fused_kernel(*refs, group: int, scale: float, gated: bool, out32: bool, interpret: bool,
                  mutations: frozenset = frozenset()):
    """Kernel body of :func:`chunk_bwd_fused_mosaic`: one chunk of one ``(b, h)`` per CTA.

    ``refs``: the inputs ``q, k, v, do, vn, dvn, t0, h, dh, gc, beta, doc, conn, last``; the
    outputs ``dq, dk, dv, dbeta, dg``; the scratch of :func:`_scratch` in its order; then
    (interpret only) the SMEM copies of the transposed operands. ``out32``: ``dq``, ``dk``
    leave in fp32 (GVA: XLA sums the groups), else in the input dtype.
    """
    take = _ref_taker(refs)
    (q_ref, k_ref, v_ref, do_ref, vn_ref, dvn_ref, t0_ref, h_ref, dh_ref, g_ref, beta_ref,
     doc_ref, conn_ref, last_ref) = take(14)
    dq_ref, dk_ref, dv_ref, db_ref, dg_ref = take(5)
    q_s, k_s, v_s, do_s, vn_s, t0_s, h_s, dh_s, vecs, dp_s, w1_s, w2_s, w3_s = take(13)
    # One fp32 [11, 64] buffer for the vectors (each separate buffer is aligned to 1 KB).
    (g_row_s, g_col_s, b_row_s, b_col_s, doc_row_s, doc_col_s, conn_s, last_s, dgt_s, bnd_s,
     db_s) = (vecs.at[r] for r in range(_VECS))
    dvn_s, wv_s, st_s = _staging_refs(take, interpret)
    in_bar, = take(1)
    if interpret:
        vnt_s, ht_s, xt_s, wvt_s, t0t_s, kt_s, dht_s, dpt_s, rt_s = take(None)
    else:
        vnt_s = ht_s = xt_s = wvt_s = t0t_s = kt_s = dht_s = dpt_s = rt_s = None

    n, h, b = lax.axis_index("n"), lax.axis_index("h"), lax.axis_index("b")
    hk = lax.div(h, group)  # GVA: value head h reads query/key head h // group
    rows = pl.ds(n * CHUNK, CHUNK)
    dk = k_s.shape[-1]
    dtype = k_s.dtype
    f32 = jnp.float32
    sq = (CHUNK, CHUNK)

    for src, dst in ((q_ref.at[b, rows, hk], q_s), (k_ref.at[b, rows, hk], k_s),
                     (v_ref.at[b, rows, h], v_s), (do_ref.at[b, rows, h], do_s),
                     (vn_ref.at[b, rows, h], vn_s), (dvn_ref.at[b, rows, h], dvn_s),
                     (t0_ref.at[b, rows, h], t0_s), (h_ref.at[b, h, n], h_s),
                     (dh_ref.at[b, h, n], dh_s),
                     (g_ref.at[b, h, rows], g_row_s), (g_ref.at[b, h, rows], g_col_s),
                     (beta_ref.at[b, h, rows], b_row_s), (beta_ref.at[b, h, rows], b_col_s),
                     (doc_ref.at[b, rows], doc_row_s), (doc_ref.at[b, rows], doc_col_s),
                     (conn_ref.at[b, rows], conn_s), (last_ref.at[b, rows], last_s)):
        plgpu.copy_gmem_to_smem(src, dst, in_bar)
    plgpu.barrier_wait(in_bar)

    (matmul, matmul_add, tr, tile, rows_of, by_col, row_dot, iotas, decay, strict, beta_rows,
     beta_cols) = _make_ops(interpret, mutations, g_row_s, g_col_s, b_row_s, b_col_s, doc_row_s,
                            doc_col_s)

    g_i = mgl.load_rows(g_row_s, interpret)
    g_last = vecs[0, CHUNK - 1]  # G_L (g_row_s)
    gam_in = mgl.load_rows(conn_s, interpret) * jnp.exp(g_i)  # Gamma_t = conn_t e^{G_t} (<= 1)
    # Gamma_r,s = last_s e^{G_L - G_s} (<= 1)
    gam_out = mgl.load_rows(last_s, interpret) * jnp.exp(g_last - g_i)
    # gamma = conn_L e^{G_L} (conn_s is row 6): 0 if a document starts inside the chunk
    gam_all = vecs[6, CHUNK - 1] * jnp.exp(g_last)

    # X = T0 * D (the gated inverse), the left operand of Z = X^T dv_new; in M's tile.
    x_s = w2_s
    x_s[...] = (tile(t0_s) * decay()).astype(dtype)
    # dP = scale (dO v_new^T) * D, a 16-bit operand of dq (dP K) and dk (dP^T Q).
    dp = matmul([(do_s, tr(vn_s, vnt_s))], sq)
    dp_s[...] = (dp * (scale * decay())).astype(dtype)
    plgpu.commit_smem()

    # Z = X^T dv_new; dv = diag(beta) Z.
    z = matmul([(tr(x_s, xt_s), dvn_s)], v_s.shape)
    vz = row_dot(tile(v_s), z)
    # U' = Gamma K S, Wv = V - U' (fp32, then 16 bits: dAg's operand).
    u_p = matmul([(k_s, h_s)], v_s.shape) * rows_of(gam_in, v_s.shape)
    uz = row_dot(u_p, z)
    wv16 = (tile(v_s) - u_p).astype(dtype)
    db_col = vz - uz  # sum_t dAg_ts T0_ts D_ts = Wv_s . Z_s (fp32 Wv: dbeta's term)
    # The gate's F^T 1 = dv . Wv with the Wv that dAg's product reads (the 16-bit one), so
    # that F 1 and F^T 1 cancel over the chunk to fp32 rounding (with the fp32 Wv, dg's reverse
    # cumsum gathered a bias: 1.1e-2 relative RMS; dbeta is better with the fp32 Wv).
    wz = row_dot(wv16.astype(f32), z)
    if "no_col_term" in mutations:  # -dv.U' only
        dlg = -beta_rows() * uz
    elif "no_dv_u_term" in mutations:  # -(F^T 1) only
        dlg = -beta_rows() * wz
    else:  # -(F^T 1) - dv.U' = -dv.(Wv + U')
        dlg = -beta_rows() * (wz + uz)
    wv_s[...] = wv16
    # dv in the input dtype over v (each thread overwrites what it read): the output, and
    # the source of -Gamma dv below.
    v_s[...] = (z * rows_of(beta_rows(), v_s.shape)).astype(dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(v_s, dv_ref.at[b, rows, h])

    # dAg = dv_new Wv^T; the gate's row sums of dAg * Ag; dT0 = dAg * D * beta_s (strict).
    dag = matmul([(dvn_s, tr(wv_s, wvt_s))], sq)
    # (F 1)_t, F = dAg * Ag, with the 16-bit X that Z's product read (as Wv above).
    dlg = dlg + row_dot(dag, tile(x_s) * beta_cols())
    # dT0 = dAg * D * beta_s (strict) and M = dT0 T0^T as hi + lo 16-bit terms: with one term
    # each, dbeta's error on correlated keys was 2e-2 (M) and 3e-3 (dT0) relative RMS.
    dt0 = jnp.where(strict(), dag * (decay() * beta_cols()), 0.0)
    dt0_hi = dt0.astype(dtype)
    w1_s[...] = dt0_hi
    w3_s[...] = (dt0 - dt0_hi.astype(f32)).astype(dtype)
    plgpu.commit_smem()
    # dA0 = -T0^T (dT0 T0^T), strict lower (its document mask is implied by T0's and D's).
    t0_t = tr(t0_s, t0t_s)
    m = matmul([(w1_s, t0_t), (w3_s, t0_t)], sq)
    m_hi = m.astype(dtype)
    w2_s[...] = m_hi  # X's last reader, dAg's row term, is done
    w3_s[...] = (m - m_hi.astype(f32)).astype(dtype)  # dT0's lo term was read
    plgpu.commit_smem()
    da0 = (matmul([(t0_t, w2_s), (t0_t, w3_s)], sq)
           * jnp.where(strict(), -1.0, 0.0))  # acc * -mask, not -acc (Sec. 2)
    kk = matmul([(k_s, tr(k_s, kt_s))], sq)
    db_s[...] = row_dot(da0, kk) + db_col  # dbeta: sum_s dA0_ts (k_t . k_s) + Wv_t . Z_t
    w1_s[...] = (rows_of(beta_rows(), sq) * da0).astype(dtype)  # R = diag(beta) dA0
    plgpu.commit_smem()

    # dq = scale Gamma (dO S^T) + dP K (the rows of the first product scaled in fp32, then the
    # second product into the same accumulator) and its gate term q . dq. dv_new and Wv are
    # dead (dAg read them): the staging tile is free.
    kshape = k_s.shape
    s_t = tr(h_s, ht_s)  # S^T [V, K]
    dq_val = matmul_add(matmul([(do_s, s_t)], kshape) * rows_of(scale * gam_in, kshape),
                        [(dp_s, k_s)])
    dlg = dlg + row_dot(tile(q_s), dq_val)
    st_s[...] = dq_val.astype(st_s.dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(st_s, dq_ref.at[b, rows, h])

    # dk: dks = Gamma_r (v_new dS'^T), dk_loc = dks + dP^T Q, then R K + R^T K - Gamma dv S^T.
    dks = matmul([(vn_s, tr(dh_s, dht_s))], kshape) * rows_of(gam_out, kshape)
    bnd = row_dot(tile(k_s), dks)  # sum_s k_s . dks_s: per-row partials of <S', dS'>
    for r in range(0, dk, CHUNK):  # + gamma <S, dS'> as row sums of 64-row slices
        rr = pl.ds(r, CHUNK)
        bnd = bnd + gam_all * row_dot(tile(h_s.at[rr]), tile(dh_s.at[rr]))
    bnd_s[...] = bnd
    # v_new's last reader was dks' product: its tile takes -Gamma dv (from the 16-bit dv, so
    # rounded twice), an operand of the dk accumulator below.
    vn_s[...] = (tile(v_s) * rows_of(-gam_in, v_s.shape)).astype(dtype)
    plgpu.commit_smem()
    dk_loc = matmul_add(dks, [(tr(dp_s, dpt_s), q_s)])
    dlg = dlg - row_dot(tile(k_s), dk_loc)
    dgt_s[...] = dlg
    r_terms = [(w1_s, k_s)] + ([] if "no_rt_k" in mutations else [(tr(w1_s, rt_s), k_s)])
    dk_val = matmul_add(dk_loc, r_terms + [(vn_s, s_t)])  # + R K + R^T K - Gamma dv S^T
    plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # dq's store has read st_s
    st_s[...] = dk_val.astype(st_s.dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(st_s, dk_ref.at[b, rows, h])
    plgpu.copy_smem_to_gmem(db_s, db_ref.at[b, h, rows])
    if gated:
        # dg_t = sum_{s >= t} dL/dG_s + sum_s bnd_s: one masked [64, 64] row sum, fp32.
        later = by_col(mgl.load_cols(dgt_s, interpret))
        bnd_j = by_col(mgl.load_cols(bnd_s, interpret))
        i, j = iotas()
        keep = (j == i) if "no_cumsum" in mutations else (j >= i)
        dg_fin = jnp.sum(jnp.where(keep, later, 0.0) + bnd_j, axis=1)
        if "boundary_twice" in mutations:  # also in dL/dG_L, which the cumsum takes to all t
            dg_fin = dg_fin + jnp.sum(bnd_j, axis=1)
        plgpu.commit_smem()  # every thread has read dgt_s before it is overwritten
        dgt_s[...] = dg_fin
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(dgt_s, dg_ref.at[b, h, rows])
    plgpu.wait_smem_to_gmem(0)


# Three warpgroups (``warpgroups=3``, MOSAIC_GPU.md Sec. 31.3's split, our assignment): the
# extra vectors of the per-warpgroup gate partials, the barriers between warpgroups and the
# registers per warpgroup (``setmaxnreg``; offline ptxas decides, Sec. 31.6).
_VECS_WS = 14  # _VECS, then WG0's dL/dG partial, WG0's dbeta column term, WG2's dL/dG partial
_WS_BARRIERS = ("dp_ready", "wv_ready", "vn_free", "gdv_ready", "g0_ready", "dag_done",
                "r_ready", "g2_ready", "st_free")
WS_REGISTERS = (240, 96, 168)  # WG0 (forward side), WG1 (inverse side), WG2 (key side)
# setmaxnreg with the GVA loop (``gva_loop``, K = 64), per V: offline ptxas, S1 with Hk = H / 2
# (K = V = 64) or H / 4 (V = 128), bf16, documents: 16 B and 52 B of spill stores (with
# WS_REGISTERS 148 B and 172 B; MOSAIC_GPU.md Sec. 33).
GVA_LOOP_REGISTERS = {64: (200, 104, 200), 128: (248, 104, 152)}
GVA_LOOP_K = 64  # the head dim K the GVA loop runs at (SMEM: 153,704 B at K = V = 64, bf16)


def _fused_kernel_ws(*refs, group: int, scale: float, gated: bool, out32: bool,
                     interpret: bool, mutations: frozenset = frozenset(),
                     registers: Tuple[int, int, int] = WS_REGISTERS, kv_loop: bool = False):
    """Kernel body of :func:`chunk_bwd_fused_mosaic` with ``warpgroups=3``: the same math and
    tiles as :func:`_fused_kernel`, split over three warpgroups that hand results over in SMEM
    behind one-shot barriers (each used once per CTA):

    - WG0 (forward side): issues the 17 copies; ``dP`` [``dp_ready``]; ``X``, ``Z``, ``U'``,
      ``Wv`` [``wv_ready``]; ``dv`` out; ``-Gamma dv`` over ``v_new`` once WG2 has read it
      [``vn_free`` -> ``gdv_ready``]; its gate and ``dbeta`` partials [``g0_ready``]; once WG1
      has read ``dv_new`` and ``Wv`` [``dag_done``], ``dq`` through the staging tile
      [``st_free`` once its store has read it].
    - WG1 (inverse side): ``dAg`` [``dag_done``], ``F 1``, ``dT0``, ``M``, ``dA0``, ``K K^T``,
      ``R`` [``r_ready``]; then, after ``g0_ready`` and ``g2_ready``, ``dbeta`` and the gate's
      sum and in-chunk reverse cumsum, out.
    - WG2 (key side): ``dks``, ``<S', dS'>`` partials [``vn_free``]; ``+ dP^T Q`` (after
      ``dp_ready``), its gate partial [``g2_ready``]; ``+ R K + R^T K`` (after ``r_ready``),
      ``+ (-Gamma dv) S^T`` (after ``gdv_ready``); ``dk`` through the staging tile after
      ``st_free``.

    All three meet on ``done`` before leaving (an early exit while another warpgroup issues
    ``wgmma`` is unsafe, MOSAIC_GPU.md Sec. 2). ``refs``: as :func:`_fused_kernel`, with
    :data:`_VECS_WS` vectors, the barriers of :data:`_WS_BARRIERS` and ``done`` after
    ``in_bar``; with ``kv_loop`` then ``qk_bar``, ``head_free`` and the fp32 ``[64, K]`` sums
    ``dqacc_s``, ``dkacc_s`` (every tile then ``[1, ...]``); and per-warpgroup transposition
    scratch when interpreting.

    ``kv_loop`` (the GVA loop, ``gva_loop``): the grid's ``h`` is the key head; per value head
    ``j`` of its group, after ``in_bar``, ``dqacc_s += dq_j`` (WG0) and ``dkacc_s += dk_j``
    (WG2) in fp32; after the loop both are rounded once and stored ``[B, Tp, Hk, K]``.
    """
    take = _ref_taker(refs)
    (q_ref, k_ref, v_ref, do_ref, vn_ref, dvn_ref, t0_ref, h_ref, dh_ref, g_ref, beta_ref,
     doc_ref, conn_ref, last_ref) = take(14)
    dq_ref, dk_ref, dv_ref, db_ref, dg_ref = take(5)
    q_s, k_s, v_s, do_s, vn_s, t0_s, h_s, dh_s, vecs, dp_s, w1_s, w2_s, w3_s = take(13)
    (g_row_s, g_col_s, b_row_s, b_col_s, doc_row_s, doc_col_s, conn_s, last_s, dgt_s, bnd_s,
     db_s, dgt0_s, dbc_s, dgt2_s) = (vecs.at[r] for r in range(_VECS_WS))
    dvn_s, wv_s, st_s = _staging_refs(take, interpret)
    in_bar, = take(1)
    bars = dict(zip(_WS_BARRIERS, take(len(_WS_BARRIERS))))
    done, = take(1)
    qk_bar, head_free = take(2) if kv_loop else (None, None)
    dqacc_s, dkacc_s = take(2) if kv_loop else (None, None)
    if interpret:
        (vnt_s, xt_s, ht0_s, wvt_s, t0t_s, kt_s, dht_s, dpt_s, rt_s, ht2_s) = take(None)
    else:
        vnt_s = xt_s = ht0_s = wvt_s = t0t_s = kt_s = dht_s = dpt_s = rt_s = ht2_s = None
    (matmul, matmul_add, tr, tile, rows_of, by_col, row_dot, iotas, decay, strict, beta_rows,
     beta_cols) = _make_ops(interpret, mutations, g_row_s, g_col_s, b_row_s, b_col_s, doc_row_s,
                            doc_col_s)
    # With kv_loop every per-CTA tile has a leading dimension of 1 (see :func:`_scratch`),
    # indexed in each value head's iteration by an index that is 0 but that the compiler cannot
    # prove is: so the tiles' addresses and wgmma descriptors are formed inside the loop where
    # they are used, not hoisted out of it and kept live across the whole body (MOSAIC_GPU.md
    # Sec. 27.5's diagnosis; Sec. 33).
    tiles = (q_s, k_s, v_s, do_s, vn_s, t0_s, h_s, dh_s, vecs, dp_s, w1_s, w2_s, w3_s, dvn_s,
             wv_s, st_s, dqacc_s, dkacc_s)

    def rebind(z):
        """Point the tile names (and the helpers of :func:`_make_ops`) at ``tiles[...].at[z]``."""
        nonlocal q_s, k_s, v_s, do_s, vn_s, t0_s, h_s, dh_s, vecs, dp_s, w1_s, w2_s, w3_s
        nonlocal dvn_s, wv_s, st_s, dqacc_s, dkacc_s
        nonlocal g_row_s, g_col_s, b_row_s, b_col_s, doc_row_s, doc_col_s, conn_s, last_s
        nonlocal dgt_s, bnd_s, db_s, dgt0_s, dbc_s, dgt2_s
        nonlocal matmul, matmul_add, tr, tile, rows_of, by_col, row_dot, iotas, decay, strict
        nonlocal beta_rows, beta_cols
        (q_s, k_s, v_s, do_s, vn_s, t0_s, h_s, dh_s, vecs, dp_s, w1_s, w2_s, w3_s, dvn_s,
         wv_s, st_s, dqacc_s, dkacc_s) = (t.at[z] for t in tiles)
        (g_row_s, g_col_s, b_row_s, b_col_s, doc_row_s, doc_col_s, conn_s, last_s, dgt_s,
         bnd_s, db_s, dgt0_s, dbc_s, dgt2_s) = (vecs.at[r] for r in range(_VECS_WS))
        (matmul, matmul_add, tr, tile, rows_of, by_col, row_dot, iotas, decay, strict,
         beta_rows, beta_cols) = _make_ops(interpret, mutations, g_row_s, g_col_s, b_row_s,
                                           b_col_s, doc_row_s, doc_col_s,
                                           None if isinstance(z, int) else z)

    def opaque_zero():
        """0, from the head's ``conn`` (0 or 1, just landed on ``in_bar``): ``min(int(conn_0),
        0)``, which the compiler cannot fold."""
        return jnp.minimum(tiles[8][0, 6, 0].astype(jnp.int32), 0)

    if kv_loop:
        rebind(0)

    n, h, b = lax.axis_index("n"), lax.axis_index("h"), lax.axis_index("b")
    wg = lax.axis_index("wg")
    hk = h if kv_loop else lax.div(h, group)  # with kv_loop the grid's h is the key head
    rows = pl.ds(n * CHUNK, CHUNK)
    dk = k_s.shape[-1]
    dtype = k_s.dtype
    f32 = jnp.float32
    sq = (CHUNK, CHUNK)
    kshape = k_s.shape

    def publish(name):
        plgpu.commit_smem()
        plgpu.barrier_arrive(bars[name])

    def gammas():
        g_i = mgl.load_rows(g_row_s, interpret)
        g_last = vecs[0, CHUNK - 1]
        gam_in = mgl.load_rows(conn_s, interpret) * jnp.exp(g_i)
        gam_out = mgl.load_rows(last_s, interpret) * jnp.exp(g_last - g_i)
        gam_all = vecs[6, CHUNK - 1] * jnp.exp(g_last)
        return gam_in, gam_out, gam_all

    def adjust(regs):  # setmaxnreg from the launch share (168 at 384 threads)
        if not interpret and regs != 168:
            plgpu.set_max_registers(regs, action="increase" if regs > 168 else "decrease")

    # With kv_loop (GVA at K <= 64) the grid's h is the key head: q, k are loaded once (on
    # qk_bar) and the CTA runs its `group` value heads one after another, each one's tiles
    # refilled once all three warpgroups are done with the previous one (head_free); WG0 sums
    # dq and WG2 dk over the heads in fp32 registers, and both leave once, after the loop.
    heads = group if kv_loop else 1

    def value_head(j):
        return hk * group + j if kv_loop else h

    def issue(j):
        """The per-head copies of value head ``value_head(j)`` on in_bar (q, k too without
        kv_loop)."""
        hv = value_head(j)
        copies = [] if kv_loop else [(q_ref.at[b, rows, hk], q_s), (k_ref.at[b, rows, hk], k_s)]
        copies += [(v_ref.at[b, rows, hv], v_s), (do_ref.at[b, rows, hv], do_s),
                   (vn_ref.at[b, rows, hv], vn_s), (dvn_ref.at[b, rows, hv], dvn_s),
                   (t0_ref.at[b, rows, hv], t0_s), (h_ref.at[b, hv, n], h_s),
                   (dh_ref.at[b, hv, n], dh_s),
                   (g_ref.at[b, hv, rows], g_row_s), (g_ref.at[b, hv, rows], g_col_s),
                   (beta_ref.at[b, hv, rows], b_row_s), (beta_ref.at[b, hv, rows], b_col_s),
                   (doc_ref.at[b, rows], doc_row_s), (doc_ref.at[b, rows], doc_col_s),
                   (conn_ref.at[b, rows], conn_s), (last_ref.at[b, rows], last_s)]
        for src, dst in copies:
            plgpu.copy_gmem_to_smem(src, dst, in_bar)

    def head_loop(body, carry):
        """``body(j, carry)`` for every value head (a fori_loop with kv_loop)."""
        if not kv_loop:
            return body(0, carry)
        return lax.fori_loop(0, heads, body, carry)

    def head_done():
        """This warpgroup is done with the head's tiles (its stores have read theirs)."""
        if kv_loop:
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)
            plgpu.barrier_arrive(head_free)

    @pl.when(wg == 0)
    def _forward_side():
        adjust(registers[0])
        if kv_loop:
            rebind(0)  # views made in this warpgroup's own trace
            plgpu.copy_gmem_to_smem(q_ref.at[b, rows, hk], q_s, qk_bar)
            plgpu.copy_gmem_to_smem(k_ref.at[b, rows, hk], k_s, qk_bar)
            plgpu.barrier_wait(qk_bar)
        issue(0)

        def head_body(jj, carry):
            hv = value_head(jj)
            plgpu.barrier_wait(in_bar)
            if kv_loop:
                rebind(opaque_zero())
            gam_in, _, _ = gammas()
            dp = matmul([(do_s, tr(vn_s, vnt_s))], sq)
            dp_s[...] = (dp * (scale * decay())).astype(dtype)
            publish("dp_ready")
            w2_s[...] = (tile(t0_s) * decay()).astype(dtype)  # X, until WG1 writes M there
            plgpu.commit_smem()
            z = matmul([(tr(w2_s, xt_s), dvn_s)], v_s.shape)
            vz = row_dot(tile(v_s), z)
            u_p = matmul([(k_s, h_s)], v_s.shape) * rows_of(gam_in, v_s.shape)
            uz = row_dot(u_p, z)
            wv16 = (tile(v_s) - u_p).astype(dtype)
            wv_s[...] = wv16
            publish("wv_ready")
            wz = row_dot(wv16.astype(f32), z)
            if "no_col_term" in mutations:
                dlg = -beta_rows() * uz
            elif "no_dv_u_term" in mutations:
                dlg = -beta_rows() * wz
            else:
                dlg = -beta_rows() * (wz + uz)
            v_s[...] = (z * rows_of(beta_rows(), v_s.shape)).astype(dtype)  # dv
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(v_s, dv_ref.at[b, rows, hv])
            plgpu.barrier_wait(bars["vn_free"])  # WG2's dks product has read v_new
            vn_s[...] = (tile(v_s) * rows_of(-gam_in, v_s.shape)).astype(dtype)
            publish("gdv_ready")
            s_t = tr(h_s, ht0_s)
            dq_val = matmul_add(
                matmul([(do_s, s_t)], kshape) * rows_of(scale * gam_in, kshape), [(dp_s, k_s)])
            dgt0_s[...] = dlg + row_dot(tile(q_s), dq_val)
            dbc_s[...] = vz - uz  # Wv . Z
            publish("g0_ready")
            plgpu.barrier_wait(bars["dag_done"])  # dv_new and Wv read: the staging tile is free
            if not kv_loop:
                return dq_val
            # the group sum in fp32 SMEM: each thread reads back what it wrote (the same
            # WGMMA layout), so no barrier; nothing is carried in registers across heads
            dqacc_s[...] = mgl.load_tile(dqacc_s, interpret) + dq_val
            head_done()

            @pl.when(jj + 1 < heads)
            def _():  # every warpgroup is done with head jj's tiles: the next head's copies
                plgpu.barrier_wait(head_free)
                issue(jj + 1)

            return carry

        if kv_loop:
            dqacc_s[...] = mgl.zeros_acc(kshape, interpret)
        dq_val = head_loop(head_body, None)
        if kv_loop:
            rebind(0)  # no tracer of the loop's index outlives it
            plgpu.barrier_wait(head_free)  # the last head: dv_new, Wv free for the staging
            dq_val = mgl.load_tile(dqacc_s, interpret)
        st_s[...] = dq_val.astype(st_s.dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(st_s, dq_ref.at[b, rows, hk if kv_loop else h])
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)
        plgpu.barrier_arrive(bars["st_free"])
        plgpu.wait_smem_to_gmem(0)

    @pl.when(wg == 1)
    def _inverse_side():
        adjust(registers[1])
        if kv_loop:  # views made in this warpgroup's own trace
            rebind(0)

        def head_body(jj, carry):
            hv = value_head(jj)
            plgpu.barrier_wait(in_bar)
            if kv_loop:
                rebind(opaque_zero())
            plgpu.barrier_wait(bars["wv_ready"])  # also: WG0's Z has read X
            dag = matmul([(dvn_s, tr(wv_s, wvt_s))], sq)
            plgpu.barrier_arrive(bars["dag_done"])
            dlg = row_dot(dag, tile(w2_s) * beta_cols())  # F 1 with the 16-bit X
            dt0 = jnp.where(strict(), dag * (decay() * beta_cols()), 0.0)
            dt0_hi = dt0.astype(dtype)
            w1_s[...] = dt0_hi
            w3_s[...] = (dt0 - dt0_hi.astype(f32)).astype(dtype)
            plgpu.commit_smem()
            t0_t = tr(t0_s, t0t_s)
            m = matmul([(w1_s, t0_t), (w3_s, t0_t)], sq)
            m_hi = m.astype(dtype)
            w2_s[...] = m_hi
            w3_s[...] = (m - m_hi.astype(f32)).astype(dtype)
            plgpu.commit_smem()
            da0 = matmul([(t0_t, w2_s), (t0_t, w3_s)], sq) * jnp.where(strict(), -1.0, 0.0)
            kk = matmul([(k_s, tr(k_s, kt_s))], sq)
            db_row = row_dot(da0, kk)
            w1_s[...] = (rows_of(beta_rows(), sq) * da0).astype(dtype)  # R
            publish("r_ready")
            plgpu.barrier_wait(bars["g0_ready"])
            plgpu.barrier_wait(bars["g2_ready"])
            db_s[...] = db_row + mgl.load_rows(dbc_s, interpret)
            dgt_s[...] = (dlg + mgl.load_rows(dgt0_s, interpret)
                          + mgl.load_rows(dgt2_s, interpret))
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(db_s, db_ref.at[b, hv, rows])
            if gated:
                later = by_col(mgl.load_cols(dgt_s, interpret))
                bnd_j = by_col(mgl.load_cols(bnd_s, interpret))
                i, j = iotas()
                keep = (j == i) if "no_cumsum" in mutations else (j >= i)
                dg_fin = jnp.sum(jnp.where(keep, later, 0.0) + bnd_j, axis=1)
                if "boundary_twice" in mutations:
                    dg_fin = dg_fin + jnp.sum(bnd_j, axis=1)
                plgpu.commit_smem()  # this warpgroup has read dgt_s before it is overwritten
                dgt_s[...] = dg_fin
                plgpu.commit_smem()
                plgpu.copy_smem_to_gmem(dgt_s, dg_ref.at[b, hv, rows])
            head_done()
            return carry

        if kv_loop:
            plgpu.barrier_wait(qk_bar)
        head_loop(head_body, None)
        if kv_loop:
            rebind(0)  # no tracer of the loop's index outlives it
        plgpu.wait_smem_to_gmem(0)

    @pl.when(wg == 2)
    def _key_side():
        adjust(registers[2])
        if kv_loop:  # views made in this warpgroup's own trace
            rebind(0)

        def head_body(jj, carry):
            plgpu.barrier_wait(in_bar)
            if kv_loop:
                rebind(opaque_zero())
            _, gam_out, gam_all = gammas()
            dks = matmul([(vn_s, tr(dh_s, dht_s))], kshape) * rows_of(gam_out, kshape)
            plgpu.barrier_arrive(bars["vn_free"])
            bnd = row_dot(tile(k_s), dks)
            for r in range(0, dk, CHUNK):
                rr = pl.ds(r, CHUNK)
                bnd = bnd + gam_all * row_dot(tile(h_s.at[rr]), tile(dh_s.at[rr]))
            bnd_s[...] = bnd
            plgpu.barrier_wait(bars["dp_ready"])
            dk_loc = matmul_add(dks, [(tr(dp_s, dpt_s), q_s)])
            dgt2_s[...] = -row_dot(tile(k_s), dk_loc)
            publish("g2_ready")
            plgpu.barrier_wait(bars["r_ready"])
            r_terms = [(w1_s, k_s)] + ([] if "no_rt_k" in mutations
                                       else [(tr(w1_s, rt_s), k_s)])
            dk_val = matmul_add(dk_loc, r_terms)
            plgpu.barrier_wait(bars["gdv_ready"])
            dk_val = matmul_add(dk_val, [(vn_s, tr(h_s, ht2_s))])
            if not kv_loop:
                return dk_val
            dkacc_s[...] = mgl.load_tile(dkacc_s, interpret) + dk_val
            head_done()
            return carry

        if kv_loop:
            dkacc_s[...] = mgl.zeros_acc(kshape, interpret)
            plgpu.barrier_wait(qk_bar)
        dk_val = head_loop(head_body, None)
        if kv_loop:
            rebind(0)  # no tracer of the loop's index outlives it
            dk_val = mgl.load_tile(dkacc_s, interpret)
        plgpu.barrier_wait(bars["st_free"])
        st_s[...] = dk_val.astype(st_s.dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(st_s, dk_ref.at[b, rows, hk if kv_loop else h])
        plgpu.wait_smem_to_gmem(0)

    plgpu.barrier_arrive(done)
    plgpu.barrier_wait(done)


def _scratch(dk: int, dv: int, dtype, out32: bool, interpret: bool, warpgroups: int = 1,
             kv_loop: bool = False):
    """The scratch list of the kernel, in :func:`_fused_kernel`'s (``warpgroups=1``) or
    :func:`_fused_kernel_ws`'s (``warpgroups=3``) order."""
    ws = warpgroups == 3
    f32 = jnp.float32
    # with kv_loop each tile gets a leading dimension of 1 (indexed by an opaque 0 in the loop)
    lead = (1,) if kv_loop else ()

    def swz(shape, dt):
        return mgl.swizzled_smem(lead + tuple(shape), dt)

    sq = swz((CHUNK, CHUNK), dtype)
    dvn, wv = swz((CHUNK, dv), dtype), swz((CHUNK, dv), dtype)
    st = swz((CHUNK, dk), f32 if out32 else dtype)  # staging of dk, then dq
    scratch = [
        swz((CHUNK, dk), dtype), swz((CHUNK, dk), dtype),  # q_s, k_s
        swz((CHUNK, dv), dtype),  # v_s: v, then dv (the output)
        swz((CHUNK, dv), dtype), swz((CHUNK, dv), dtype),  # do_s; vn_s: v_new, then -Gamma dv
        sq,  # t0_s
        swz((dk, dv), dtype), swz((dk, dv), dtype),  # h_s, dh_s: S, dS' in 16 bits
        plgpu.SMEM(lead + (_VECS_WS if ws else _VECS, CHUNK), f32),  # vecs: the fp32 vectors
        sq,  # dp_s: dP
        sq, sq, sq,  # w1_s: dT0 (hi), then R; w2_s: X = T0 * D, then M (hi); w3_s: lo terms
    ]
    if interpret:
        scratch += [dvn, wv, st]
    else:  # dv_new and Wv are dead once dAg is read: the staging tile reuses their bytes
        scratch.append(plgpu.RefUnion((dvn, wv), st))
    # in_bar: with kv_loop q, k come once, on qk_bar
    scratch.append(plgpu.Barrier(num_arrivals=_IN_COPIES - 2 * kv_loop))
    if ws:  # the one-shot barriers between warpgroups, then done (all three)
        scratch += [plgpu.Barrier(num_arrivals=1) for _ in _WS_BARRIERS]
        scratch.append(plgpu.Barrier(num_arrivals=3))
    if kv_loop:  # qk_bar: q, k landed; head_free: all three are done with a value head's tiles
        scratch += [plgpu.Barrier(num_arrivals=2), plgpu.Barrier(num_arrivals=3)]
        scratch += [swz((CHUNK, dk), f32), swz((CHUNK, dk), f32)]  # dqacc_s, dkacc_s: the sums
    if interpret and ws:  # per warpgroup: vnt, xt, ht0 (WG0); wvt, t0t, kt (WG1); dht, dpt,
        # rt, ht2 (WG2)
        t = (CHUNK, CHUNK)
        scratch += [plgpu.SMEM(shape, dtype) for shape in
                    ((dv, CHUNK), t, (dv, dk), (dv, CHUNK), t, (dk, CHUNK), (dv, dk), t, t,
                     (dv, dk))]
    elif interpret:
        scratch += [plgpu.SMEM((dv, CHUNK), dtype),  # vnt_s
                    plgpu.SMEM((dv, dk), dtype),  # ht_s
                    plgpu.SMEM((CHUNK, CHUNK), dtype),  # xt_s
                    plgpu.SMEM((dv, CHUNK), dtype),  # wvt_s
                    plgpu.SMEM((CHUNK, CHUNK), dtype),  # t0t_s
                    plgpu.SMEM((dk, CHUNK), dtype),  # kt_s
                    plgpu.SMEM((dv, dk), dtype),  # dht_s
                    plgpu.SMEM((CHUNK, CHUNK), dtype),  # dpt_s
                    plgpu.SMEM((CHUNK, CHUNK), dtype)]  # rt_s
    return scratch


def _check_inputs(q, k, v, do, v_new, dv_new, t0, g, beta, h, dh, segment_ids) -> int:
    """Shapes and dtypes of :func:`chunk_bwd_fused_mosaic`'s inputs; returns ``N``.

    Raises:
        ValueError: naming the argument and the shape or dtype it needs.
    """
    batch, seq_len, kv_heads, dk = k.shape
    heads, dv = v.shape[2], v.shape[3]
    num_chunks = -(-seq_len // CHUNK)
    if q.shape != k.shape or q.dtype != k.dtype:
        raise ValueError(f"q and k must match: {q.shape=} {k.shape=} {q.dtype=} {k.dtype=}")
    mgl.check_kv_gates(k, v, g, segment_ids)
    for name, x in (("do", do), ("v_new", v_new), ("dv_new", dv_new)):
        if x.shape != v.shape or x.dtype != v.dtype:
            raise ValueError(f"{name} must have v's shape {v.shape} and dtype {v.dtype}, got "
                             f"{name}.shape={x.shape} {name}.dtype={x.dtype}")
    if t0.shape != (batch, seq_len, heads, CHUNK):
        raise ValueError(f"t0 must be [B, T, H, 64] = {(batch, seq_len, heads, CHUNK)}, got "
                         f"{t0.shape=}")
    if beta.shape != (batch, seq_len, heads):
        raise ValueError(f"beta must be [B, T, H] = {(batch, seq_len, heads)}, got {beta.shape=}")
    for name, x in (("h", h), ("dh", dh)):
        if x.shape != (batch, heads, num_chunks, dk, dv):
            raise ValueError(f"{name} must be [B, H, N, K, V] = "
                             f"{(batch, heads, num_chunks, dk, dv)}, got {name}.shape={x.shape}")
    return num_chunks


def check_mutations(mutations) -> Tuple[str, ...]:
    """``mutations`` (a tuple of names in :data:`MUTATIONS`) sorted; ``()`` is the real kernel.

    Raises:
        ValueError: not a tuple, or an unknown name.
    """
    if not isinstance(mutations, tuple) or any(m not in MUTATIONS for m in mutations):
        raise ValueError(f"mutations must be a tuple of names in {MUTATIONS}, got {mutations!r}")
    return tuple(sorted(set(mutations)))


@functools.partial(jax.jit, static_argnames=("scale", "interpret", "mutations", "warpgroups",
                                             "gva_loop"))
def chunk_bwd_fused_mosaic(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    do: jax.Array,
    v_new: jax.Array,
    dv_new: jax.Array,
    t0: jax.Array,
    g: Optional[jax.Array],
    beta: jax.Array,
    h: jax.Array,
    dh: jax.Array,
    *,
    scale: float,
    segment_ids: Optional[jax.Array] = None,
    gate_cumsum: Optional[jax.Array] = None,
    doc_vecs: Optional[Tuple[jax.Array, jax.Array, jax.Array]] = None,
    interpret: bool = False,
    mutations: Tuple[str, ...] = (),
    warpgroups: int = 1,
    gva_loop: Optional[bool] = None,
) -> Tuple[jax.Array, jax.Array, jax.Array, jax.Array, Optional[jax.Array]]:
    """``(dq, dk, dv, dbeta, dg)``: the chunk-local GDN / DeltaNet backward in one kernel.

    The equations of the module docstring (MOSAIC_GPU.md Sec. 31.3), one CTA per
    ``(chunk, value head, batch row)``: stages 3 and 4 of ``mosaic_vjp``'s backward in one
    launch. ``dv_new`` and ``dh`` come from the reverse state pass
    (:func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu.chunk_delta_dh_mosaic`; a
    residual cotangent ``du`` is already inside ``dv_new``), ``T0`` from
    :func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu.chunk_kkt_inverse_mosaic` (or the
    ``fused_t0`` forwards' residual), ``h`` and ``v_new`` are the forward's residuals.

    Args:
        q, k: ``[B, T, Hk, K]``, bf16 or fp16, as the forward read them; ``H % Hk == 0``
            (value head ``h`` reads query/key head ``h // (H // Hk)``).
        v: values ``[B, T, H, V]``, k's dtype; ``K, V`` in {64, 128}.
        do: output gradient ``[B, T, H, V]``, v's dtype.
        v_new: the forward's ``v_new = U - W S`` ``[B, T, H, V]``, v's dtype.
        dv_new: the total gradient of ``v_new`` ``[B, T, H, V]``, v's dtype.
        t0: the gate-free inverse ``T0 = (I + A0)^{-1}`` ``[B, T, H, 64]`` (row ``t`` of its
            chunk; ``chunk_kkt_inverse_mosaic``'s layout), any float dtype (read in k's
            dtype: a ``wgmma`` operand).
        g: per-token log-decay ``[B, T, H]`` (natural log, ``<= 0``), or ``None`` (DeltaNet).
        beta: write strengths ``[B, T, H]``, any float dtype (read as fp32).
        h: states entering each chunk ``[B, H, N, K, V]`` (``N = ceil(T / 64)``), read in k's
            dtype.
        dh: gradients of the states leaving each chunk ``[B, H, N, K, V]``, read in k's dtype.
        scale: the forward's read-out scale (static).
        segment_ids: optional int ``[B, T]``; documents start wherever the id changes.
        gate_cumsum: optional fp32 ``[B, H, Tp]`` (``Tp = 64 N``), ``g``'s chunk-local cumsum
            (:func:`pallas_kernels.common.mosaic_gpu_lib.chunk_cumsum`) formed once by the
            caller; ``None``: formed here.
        doc_vecs: optional ``(doc, conn, last)`` fp32 ``[B, Tp]``
            (:func:`pallas_kernels.common.mosaic_gpu_lib.doc_vectors`) formed once by the
            caller; ``None``: formed here.
        interpret: Mosaic GPU interpret mode (CPU; slow, for tests).
        mutations: test-only wrong variants, names in :data:`MUTATIONS` (static); ``()``: the
            real kernel.
        warpgroups: 1 (default; :func:`_fused_kernel`) or 3 (static; :func:`_fused_kernel_ws`,
            the same math split over three warpgroups with barriers between them,
            MOSAIC_GPU.md Sec. 31.3 and 31.7; registers per warpgroup :data:`WS_REGISTERS`).
        gva_loop: with GVA (``Hk < H``) and ``warpgroups=3`` (static): one CTA per key head
            loads ``q, k`` once and runs the key head's ``G = H / Hk`` value heads in turn,
            adding each head's fp32 ``dq`` (WG0) and ``dk`` (WG2) into an fp32 SMEM tile
            (``dq = sum_j dq_j`` over the group, in head order, then rounded once), so they
            leave the kernel once, in the input dtype, ``[B, T, Hk, K]``, with no XLA group
            sum (MOSAIC_GPU.md Sec. 31.7, 33). Needs ``K = 64`` (the two fp32 tiles do not
            fit SMEM at ``K = 128``). ``None`` (default): on exactly where it can run
            (``warpgroups=3``, GVA, ``K = 64``); ``False``: ``dq``, ``dk`` leave per value head
            in fp32 and XLA sums each group and rounds once. Ignored without GVA (the kernel
            is then the same module either way).

    Returns:
        ``(dq, dk, dv, dbeta, dg)``: ``dq, dk`` ``[B, T, Hk, K]`` and ``dv`` ``[B, T, H, V]``
        in the input dtype (computed in fp32 and rounded once; with GVA the fp32 group sums
        ``dq = sum_{h in group} dq_h``, formed in the kernel with ``gva_loop``, else by XLA
        from the kernel's fp32 ``[B, T, H, K]``), fp32
        ``dbeta`` ``[B, T, H]`` and fp32 ``dg`` ``[B, T, H]``, the gradient of the per-token
        ``g`` (the in-chunk reverse cumsum done in the kernel), or ``None`` for DeltaNet.

    Raises:
        ValueError: on mismatched shapes or dtypes, unsupported head dims or dtypes, ``H`` not
            a multiple of ``Hk``, a ``t0``, ``beta``, ``h``, ``dh``, ``g`` or ``segment_ids``
            of the wrong shape, a ``gate_cumsum`` or ``doc_vecs`` of the wrong shape,
            unknown ``mutations``, ``warpgroups`` not 1 or 3, or ``gva_loop=True`` with
            ``warpgroups=1`` or with ``K != 64``.
    """
    mutations = check_mutations(mutations)
    if warpgroups not in (1, 3):
        raise ValueError(f"warpgroups must be 1 or 3, got {warpgroups!r}")
    if gva_loop and warpgroups != 3:
        raise ValueError("gva_loop needs warpgroups=3")
    batch, seq_len, kv_heads, dk = k.shape
    heads, dv = v.shape[2], v.shape[3]
    num_chunks = _check_inputs(q, k, v, do, v_new, dv_new, t0, g, beta, h, dh, segment_ids)
    if gva_loop and dk != GVA_LOOP_K:
        raise ValueError(f"gva_loop needs K = {GVA_LOOP_K} (its two fp32 [64, K] sums do not "
                         f"fit SMEM at K = 128), got K = {dk}")
    if gva_loop is None:  # on wherever it can run
        gva_loop = warpgroups == 3 and dk == GVA_LOOP_K
    padded = num_chunks * CHUNK
    dtype = k.dtype
    f32 = jnp.float32
    group = heads // kv_heads
    kv_loop = bool(gva_loop) and group > 1  # one CTA per key head sums dq, dk in-kernel
    out32 = group > 1 and not kv_loop
    # Padding tokens: q = k = v = do = v_new = dv_new = 0, T0 = 0, beta = 0, g = 0 (the last
    # document's): they contribute nothing, and their own gradients are cut off.
    q, k, v, do, v_new, dv_new = (mgl.pad_time(x, num_chunks)
                                  for x in (q, k, v, do, v_new, dv_new))
    t0 = mgl.pad_time(t0.astype(dtype), num_chunks)
    gc = mgl.chunk_cumsum(g, (batch, seq_len, heads), num_chunks, gate_cumsum)  # [B, H, Tp]
    beta_hm = jnp.moveaxis(mgl.pad_time(beta.astype(f32), num_chunks), 1, 2)  # [B, H, Tp]
    doc, conn, last = mgl.doc_vectors(segment_ids, batch, num_chunks, doc_vecs)  # [B, Tp]
    out_qk = f32 if out32 else dtype
    body = _fused_kernel if warpgroups == 1 else _fused_kernel_ws
    qk_heads = kv_heads if kv_loop else heads
    call = plgpu.kernel(
        functools.partial(body, group=group, scale=float(scale), gated=g is not None,
                          out32=out32, interpret=interpret,
                          **(dict(mutations=frozenset(mutations)) if mutations else {}),
                          **(dict(kv_loop=True, registers=GVA_LOOP_REGISTERS[dv])
                             if kv_loop else {})),
        # dq, dk per value head, or per key head (the group sums) with kv_loop
        out_type=(jax.ShapeDtypeStruct((batch, padded, qk_heads, dk), out_qk),
                  jax.ShapeDtypeStruct((batch, padded, qk_heads, dk), out_qk),
                  jax.ShapeDtypeStruct((batch, padded, heads, dv), dtype),  # dv
                  jax.ShapeDtypeStruct((batch, heads, padded), f32),  # dbeta
                  jax.ShapeDtypeStruct((batch, heads, padded), f32)),  # dg (dL/dg)
        scratch_types=_scratch(dk, dv, dtype, out32, interpret, warpgroups, kv_loop),
        **(dict(num_threads=3, thread_name="wg") if warpgroups == 3 else {}),
        grid=(num_chunks, qk_heads, batch),  # chunks first: CUDA caps grid y, z at 65535
        grid_names=("n", "h", "b"),
        compiler_params=mgl.compiler_params(),
        interpret=mgl.interpret_params() if interpret else None,
        kernel_name=KERNEL_NAME + ("_ws" if warpgroups == 3 else ""),
    )
    with jax.named_scope("gdn_chunk_bwd_fused_mosaic"):
        dq, dk_, dv_, dbeta, dgc = call(q, k, v, do, v_new, dv_new, t0, h.astype(dtype),
                                        dh.astype(dtype), gc, beta_hm, doc, conn, last)
        if out32:  # GVA: the group sums in fp32, rounded once
            dq, dk_ = (x.reshape(batch, padded, kv_heads, group, dk).sum(axis=3).astype(dtype)
                       for x in (dq, dk_))
        dbeta = jnp.moveaxis(dbeta, 1, 2)[:, :seq_len]
        dg = None if g is None else jnp.moveaxis(dgc, 1, 2)[:, :seq_len]
    return dq[:, :seq_len], dk_[:, :seq_len], dv_[:, :seq_len], dbeta, dg
