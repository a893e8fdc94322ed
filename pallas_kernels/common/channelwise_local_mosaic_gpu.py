"""The per-channel family's chunk-local forward as one Mosaic GPU kernel (MOSAIC_GPU.md Sec. 62).

:func:`channelwise_local_mosaic` replaces the four Triton launches that
:mod:`pallas_kernels.common.channelwise_gpu` runs before its state pass (``gamma``, ``intra``,
``prepare``, ``wu``: ``_gamma`` + ``_prepare``) with one kernel per chunk, grid ``(N, H, B)``,
one warpgroup, for KDA (per-token scales ``ks = vs = beta``; GDN-2's per-channel write gate is
not supported here: see :func:`unsupported_reason`). It returns exactly what the state passes and
the backward consume, in the same layouts and dtypes: ``qg, kg, w, u`` (operand dtype ``[B, Tp,
H, K or V]``), ``mq`` and optionally ``a`` (operand dtype ``[B, H, N, C, C]``, zero above the
diagonal), ``e`` (fp32 ``[B, H, N, K]``) and ``gam`` (fp32 ``[B, Tp, H, K]``).

Equations (``channelwise_gpu``'s module docstring; paper arXiv 2607.07953, Eqs. 18-24), per
chunk of C = 64 tokens, ``g`` floored at ``validation.LOG_DECAY_FLOOR`` (NaN kept)::

    gamma = cumsum(g) (within the chunk, fp32),   kr = round(k ks),   vw = round(v vs)
    Mk_ij = sum_c kr_ic k_jc e^{gamma_ic - gamma_jc}   (j <  i, same document)
    Mq_ij = sum_c q_ic  k_jc e^{gamma_ic - gamma_jc}   (j <= i, same document)
    A = (I + Mk)^{-1},  W = round(A) round(kr E_in),  U = round(A) vw
    qg = round(q E_in), kg = round(k E_out), e = e^{gamma_C} conn_C
    E_in = e^{gamma} conn,  E_out = e^{gamma_C - gamma} last

How the kernel computes them (one CTA, one warpgroup, one chunk; every product a ``wgmma``
with fp32 accumulation):

* **Cumsums on the tensor cores, exact terms.** ``g`` (fp32) is split into three 16-bit pieces
  of the operand dtype whose sum is ``g`` (exactly for bf16: ``hi``, ``mid``, ``lo``);
  ``gamma = L g`` with ``L`` the inclusive lower-triangular ones (exact in 16 bits): three
  ``[64, 64] x [64, K]`` products, so every term is exact and only the fp32 accumulation
  rounds (the Triton ``gamma`` kernel's sequential fp32 scan rounds in another order: the two
  agree to fp32 rounding, not bit for bit). ``gamma_C``
  (``gamma``'s last row, a column sum of that row alone: exact) gives ``E_out``'s exponent
  ``gamma_C - gamma`` as the Triton ``intra`` kernel forms it (a difference of two fp32
  sums).
* **Mk and Mq by levels, every exponent <= 0.** Instead of ``prepare``'s 16 x 16 sub-blocks
  with the reference at the first row of each row block (off-diagonal) and ``intra``'s
  elementwise diagonal blocks, every pair ``j < i`` is taken at the one level ``s`` in
  ``2, 4, .., 64`` where ``i`` and ``j`` share an ``s``-row block with ``i`` in its second half
  and ``j`` in its first. With ``m`` the last row of the first half, ``e^{gamma_i - gamma_j} =
  e^{gamma_i - gamma_m} e^{gamma_m - gamma_j}``, both exponents ``<= 0`` (the same exact,
  overflow-free factorisation as ``prepare``'s, with the reference at the middle of each
  block). The exponents are sums of ``g`` over row ranges, ``E_s = P_s g`` on the tensor cores
  (``P_s`` 0/1, ``g`` as its ``hi + mid`` pieces: relative error about ``2^-17``, below the
  operands' rounding), so no row of ``gamma`` is gathered. Per level: ``X' = X e^{E_s}`` on
  second-half rows (0 elsewhere), ``Y' = k e^{E_s}`` on first-half rows, rounded to the operand
  dtype, and ``Mk += mask_s (kr' Y'^T)``, ``Mq += mask_s (q' Y'^T)``; ``Mq``'s diagonal is
  ``q k^T``'s (exact operands). The Triton path runs the off-diagonal products in TF32 and the
  diagonal blocks in fp32 elementwise; here every decayed operand is rounded to the operand
  dtype, so ``Mk``, ``Mq`` agree with it to that rounding (as K1 / K2 do with
  ``grad_blocks``).
* **A** from the masked ``Mk``: the inverses of the 16 x 16 diagonal blocks by fp32 forward
  substitution (the Triton ``prepare``'s method; ``mosaic_gpu_inverse.kkt_diag_solve``, the T0
  kernel's ``inline_mgpu`` on the GPU), then the T0 kernel's block merges with ``Mk`` split into
  fp16 ``hi + lo`` (``kkt_block_merge``, ``refine="split_merge"``; MOSAIC_GPU.md Secs. 13, 15)
  where ``prepare`` uses TF32 block products. Masking ``Mk`` before the inverse gives the same
  ``A`` as ``prepare``'s masking after it (documents are contiguous runs; exact zeros stay
  zeros).
* ``W = round(A) krg`` and ``U = round(A) vw`` as the Triton ``wu`` kernel: operands in the
  operand dtype, fp32 accumulation, rounded once.

Documents: each token's chunk-local document start (``channelwise_gpu._doc_starts``), ``conn``
and ``last`` (:func:`pallas_kernels.common.pallas_gpu.docs_from_segment_ids`), as rows; ``e``
takes ``conn_C`` as the minimum of ``conn`` over the chunk (``conn`` is a prefix of ones).

SMEM (Mosaic GPU's count of the CUDA export, jax 0.10.2 and 0.11.2): 223,240 bytes at K = V =
128 bf16 with documents (one CTA per SM), 146,440 at K = V = 64 fp16 without; pinned by
``tests/pallas_kernels/kernel_mosaic_channelwise_local_test.py``. Offline ptxas at S1, K = V =
128 (MOSAIC_GPU.md Sec. 62): 255 registers, 40 bytes of spill stores (the levels unrolled
spilled 864 and serialised the ``wgmma``: hence the rolled loop). Inputs are read once by TMA
and outputs written once by TMA; no ring (one chunk per CTA).

CPU testing as the other Mosaic GPU kernels (MOSAIC_GPU.md Sec. 1): GPU interpret mode with
``mosaic_gpu_lib``'s shims (register operands and transposed operands through SMEM) and
lowering for CUDA through ``jax.export``.
"""

import functools
from typing import Dict, Optional, Tuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.common import mosaic_gpu_inverse as mgi
from pallas_kernels.common import mosaic_gpu_lib as mgl
from pallas_kernels.common import validation

F32 = jnp.float32
CHUNK = mgl.CHUNK
LEVELS = (2, 4, 8, 16, 32, 64)  # the pair levels of Mk and Mq (module docstring)
# Key channels per part of steps 1-4 and 6 (a [64, PART] tile of each operand live at a time).
# Offline ptxas at S1, K = V = 128 (MOSAIC_GPU.md Sec. 62): 64 spills more than 128 (the whole
# K: one part), so 128 (parts of min(PART, K) channels).
PART = 128
KERNEL_NAME = "channelwise_local_mosaic"


def _split3(x, dtype):
    """fp32 ``x`` as three 16-bit pieces of ``dtype`` whose fp32 sum is ``x``: exactly for
    bf16 and normal values (3 x 8 mantissa bits); for fp16 up to the pieces' underflow
    (below ``2^-24``, far under ``x``'s own rounding for the log-decays here)."""
    hi = x.astype(dtype)
    r = x - hi.astype(F32)
    mid = r.astype(dtype)
    lo = (r - mid.astype(F32)).astype(dtype)
    return hi, mid, lo


def _product(terms, shape):
    """``sum lhs @ rhs`` over ``terms`` into one fp32 accumulator of ``shape``, read after a
    barrier (the arithmetic stays after the accumulator read, jla's pitfall)."""
    def body(acc):
        for lhs, rhs in terms:
            plgpu.wgmma(acc, lhs, rhs)
        return acc[...]

    return lax.optimization_barrier(pl.run_scoped(body, plgpu.ACC(shape)))


def _kernel(*refs, dk: int, dv: int, has_docs: bool, save_a: bool, interpret: bool):
    """Kernel body of :func:`channelwise_local_mosaic` (module docstring); refs are GMEM, then
    the scratch (:func:`_scratch`'s order)."""
    refs = list(refs)
    q_ref, k_ref, v_ref, g_ref, ks_ref, vs_ref = refs[:6]
    del refs[:6]
    if has_docs:
        st_ref, conn_ref, last_ref = refs[:3]
        del refs[:3]
    qg_ref, kg_ref, w_ref, u_ref, mq_ref, e_ref, gam_ref = refs[:7]
    del refs[:7]
    a_ref = refs.pop(0) if save_a else None
    (q_s, k_s, v_s, g_s, gp_s, y_s, mq_s, a_s, l_s, al_s, x_s, xl_s, e_s, ks_s, vs_s,
     in_bar) = refs[:16]
    del refs[:16]
    if has_docs:
        st_s, conn_s, last_s = refs[:3]
        del refs[:3]
    if interpret:
        sq_sh, xk_sh, xq_sh, t_sh, my_s = refs  # register / transposed operands via SMEM
        solve_s = None
    else:
        (solve_s,) = refs
        sq_sh = xk_sh = xq_sh = t_sh = my_s = None

    n, h, b = lax.axis_index("n"), lax.axis_index("h"), lax.axis_index("b")
    rows = pl.ds(n * CHUNK, CHUNK)
    plgpu.copy_gmem_to_smem(q_ref.at[b, rows, h], q_s, in_bar)
    plgpu.copy_gmem_to_smem(k_ref.at[b, rows, h], k_s, in_bar)
    plgpu.copy_gmem_to_smem(v_ref.at[b, rows, h], v_s, in_bar)
    plgpu.copy_gmem_to_smem(g_ref.at[b, rows, h], g_s, in_bar)
    plgpu.copy_gmem_to_smem(ks_ref.at[b, h, rows], ks_s, in_bar)
    plgpu.copy_gmem_to_smem(vs_ref.at[b, h, rows], vs_s, in_bar)
    if has_docs:
        plgpu.copy_gmem_to_smem(st_ref.at[b, rows], st_s, in_bar)
        plgpu.copy_gmem_to_smem(conn_ref.at[b, rows], conn_s, in_bar)
        plgpu.copy_gmem_to_smem(last_ref.at[b, rows], last_s, in_bar)
    plgpu.barrier_wait(in_bar)

    mdt = q_s.dtype
    sq, tk, tv = (CHUNK, CHUNK), (CHUNK, dk), (CHUNK, dv)
    i, j = mgl.iota(sq, 0, interpret), mgl.iota(sq, 1, interpret)

    def rowv(ref):
        return mgl.by_row(mgl.load_rows(ref, interpret), tk)

    # Steps 1 to 3 (and 4, 6) run in parts of PART key channels: one [C, PART] tile of each
    # operand live at a time (registers).
    width = min(PART, dk)
    tp = (CHUNK, width)
    parts = [pl.ds(part * width, width) for part in range(dk // width)]
    # 1. g floored (validation.floor_log_decay's values, NaN kept), split into 16-bit pieces.
    floor = F32(validation.LOG_DECAY_FLOOR)
    for cols in parts:
        g = mgl.load_tile(g_s.at[:, cols], interpret)
        g = jnp.where(g < floor, floor, g)
        for p, piece in enumerate(_split3(g, mdt)):
            gp_s.at[p, :, cols][...] = piece
    plgpu.commit_smem()

    # 2. gamma = L g (exact terms), over g_s (its input has been read); gamma_C, its last row,
    # by a column sum of that row alone (exact). 3. kg = round(k E_out) (over gp_s[2], whose
    # lo piece the part's product has read) and e = e^{gamma_C} conn_C.
    lmat = mgl.lhs_operand(jnp.where(j <= i, 1.0, 0.0).astype(mdt), sq_sh, interpret)
    for cols in parts:
        gam = _product([(lmat, gp_s.at[p, :, cols]) for p in range(3)], tp)
        g_s.at[:, cols][...] = gam
        last_row = mgl.iota(tp, 0, interpret) == CHUNK - 1
        gam_c = lax.broadcast_in_dim(jnp.sum(jnp.where(last_row, gam, 0.0), axis=0), tp, [1])
        e_out = jnp.exp(gam_c - gam)
        e_rows = jnp.exp(gam_c)
        if has_docs:
            e_out = e_out * mgl.by_row(mgl.load_rows(last_s, interpret), tp)
            e_rows = e_rows * mgl.by_row(mgl.load_rows(conn_s, interpret), tp)
        kf = mgl.load_tile(k_s.at[:, cols], interpret).astype(F32)
        gp_s.at[2, :, cols][...] = (kf * e_out).astype(mdt)
        e_s.at[cols][...] = jnp.min(e_rows, axis=0)  # conn: a prefix of ones; row C - 1's
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(g_s, gam_ref.at[b, rows, h])
    plgpu.copy_smem_to_gmem(gp_s.at[2], kg_ref.at[b, rows, h])
    plgpu.copy_smem_to_gmem(e_s, e_ref.at[b, h, n])

    # 4. Mk and Mq by levels (module docstring), each level in parts of PART key channels
    # (E_s, k, kr, q of one part live at a time: registers), the parts' products summed in
    # fp32. q, k and kr are loaded from SMEM where used.
    mk = mgl.zeros_acc(sq, interpret)
    # Mq's diagonal: (q k^T)_ii, exact operands.
    qk = _product([(q_s, mgl.transposed(k_s, t_sh, interpret))], sq)
    i, j = mgl.iota(sq, 0, interpret), mgl.iota(sq, 1, interpret)
    mq = jnp.where(i == j, qk, 0.0)

    def level(lvl, carry):
        # A rolled loop over the levels, s = 2^(lvl + 1) traced: unrolled, ptxas spilled
        # (MOSAIC_GPU.md Sec. 62).
        mk, mq = carry
        s = lax.shift_left(jnp.int32(2), lvl)
        half = lax.shift_left(jnp.int32(1), lvl)
        i, j = mgl.iota(sq, 0, interpret), mgl.iota(sq, 1, interpret)
        mid = lax.div(i, s) * s + half - 1  # [C, C]: the row's reference m
        # P_s: second-half rows sum g over (m, i], first-half rows over (i, m]: E_s <= 0.
        p_s = jnp.where(lax.rem(i, s) >= half, (j > mid) & (j <= i), (j > i) & (j <= mid))
        pmat = jnp.where(p_s, 1.0, 0.0).astype(mdt)
        for cols in parts:
            pm = mgl.lhs_operand(pmat, sq_sh, interpret)
            ex = jnp.exp(_product([(pm, gp_s.at[0, :, cols]), (pm, gp_s.at[1, :, cols])], tp))
            # [C, PART]: rows in the second half of their s-block
            second = lax.rem(mgl.iota(tp, 0, interpret), s) >= half
            kf = mgl.load_tile(k_s.at[:, cols], interpret).astype(F32)
            y_s.at[:, cols][...] = jnp.where(second, 0.0, kf * ex).astype(mdt)
            plgpu.commit_smem()
            kr = (kf * mgl.by_row(mgl.load_rows(ks_s, interpret), tp)).astype(mdt)
            xk = jnp.where(second, kr.astype(F32) * ex, 0.0).astype(mdt)
            xk = mgl.lhs_operand(xk, xk_sh.at[:, cols] if interpret else None, interpret)
            qf = mgl.load_tile(q_s.at[:, cols], interpret).astype(F32)
            xq = mgl.lhs_operand(jnp.where(second, qf * ex, 0.0).astype(mdt),
                                 xq_sh.at[:, cols] if interpret else None, interpret)
            yt = mgl.transposed(y_s.at[:, cols], t_sh.at[cols] if interpret else None,
                                interpret)
            pk = _product([(xk, yt)], sq)
            pq = _product([(xq, yt)], sq)
            i, j = mgl.iota(sq, 0, interpret), mgl.iota(sq, 1, interpret)
            keep = ((lax.div(i, s) == lax.div(j, s)) & (lax.rem(i, s) >= half)
                    & (lax.rem(j, s) < half))
            mk = mk + jnp.where(keep, pk, 0.0)
            mq = mq + jnp.where(keep, pq, 0.0)
        return mk, mq

    mk, mq = lax.fori_loop(0, len(LEVELS), level, (mk, mq))
    i, j = mgl.iota(sq, 0, interpret), mgl.iota(sq, 1, interpret)
    if has_docs:  # column j shares row i's document iff j >= start_i
        same = j >= mgl.by_row(mgl.load_rows(st_s, interpret), sq)
        mk = jnp.where(same, mk, 0.0)
        mq = jnp.where(same, mq, 0.0)
    mq_s[...] = mq.astype(mdt)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(mq_s, mq_ref.at[b, h, n])

    # 5. A = (I + Mk)^{-1}: fp32 substitution of the diagonal blocks, split fp16 merges.
    a_hi = mk.astype(l_s.dtype)
    l_s[...] = a_hi
    al_s[...] = (mk - a_hi.astype(F32)).astype(al_s.dtype)
    split = dict(al_s=al_s, xl_s=xl_s if mdt == jnp.dtype(jnp.float16) else None)
    xs = mgi.kkt_diag_solve(mk, solve_s, interpret)
    xs = mgi.kkt_block_merge(xs, l_s, x_s, my_s, interpret, **split)
    for c in range(4):
        a_s.at[:, pl.ds(c * mgi.KKT_BLOCK, mgi.KKT_BLOCK)][...] = xs[c].astype(mdt)

    # 6. qg = round(q E_in) (over q_s, read by the products above), krg = round(kr E_in)
    # (over gp_s[0]), vw = round(v vs) (over v_s).
    for cols in parts:
        # gamma (its TMA store only reads g_s)
        e_in = jnp.exp(mgl.load_tile(g_s.at[:, cols], interpret))
        if has_docs:
            e_in = e_in * mgl.by_row(mgl.load_rows(conn_s, interpret), tp)
        qf = mgl.load_tile(q_s.at[:, cols], interpret).astype(F32)
        q_s.at[:, cols][...] = (qf * e_in).astype(mdt)
        kf = mgl.load_tile(k_s.at[:, cols], interpret).astype(F32)
        kr = (kf * mgl.by_row(mgl.load_rows(ks_s, interpret), tp)).astype(mdt).astype(F32)
        gp_s.at[0, :, cols][...] = (kr * e_in).astype(mdt)
    vf = mgl.load_tile(v_s, interpret).astype(F32)
    v_s[...] = (vf * mgl.by_row(mgl.load_rows(vs_s, interpret), tv)).astype(mdt)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(q_s, qg_ref.at[b, rows, h])
    if save_a:
        plgpu.copy_smem_to_gmem(a_s, a_ref.at[b, h, n])

    # 7. W = A krg, U = A vw; out through the operands' own tiles once the products read them.
    # A as a register operand on the GPU (its 32-byte swizzle is not the operands' 128).
    amat = a_s if interpret else mgl.load_tile(a_s, False)
    w = _product([(amat, gp_s.at[0])], tk)
    u = _product([(amat, v_s)], tv)
    plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # earlier stores have read their tiles
    gp_s.at[0][...] = w.astype(mdt)
    v_s[...] = u.astype(mdt)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(gp_s.at[0], w_ref.at[b, rows, h])
    plgpu.copy_smem_to_gmem(v_s, u_ref.at[b, rows, h])
    plgpu.wait_smem_to_gmem(0)


def _scratch(dk: int, dv: int, dtype, has_docs: bool, interpret: bool):
    """The kernel's SMEM, in :func:`_kernel`'s order."""
    swz = mgl.swizzled_smem
    vec = plgpu.SMEM((CHUNK,), F32)
    out = [
        swz((CHUNK, dk), dtype),  # q_s: q, then qg
        swz((CHUNK, dk), dtype),  # k_s
        swz((CHUNK, dv), dtype),  # v_s: v, then vw, then U
        swz((CHUNK, dk), F32),  # g_s: g, then gamma
        swz((3, CHUNK, dk), dtype),  # gp_s: g's pieces; then [2] kg, [0] krg, then W
        swz((CHUNK, dk), dtype),  # y_s: a level's Y'
        swz((CHUNK, CHUNK), dtype),  # mq_s
        mgi.kkt_smem((CHUNK, CHUNK), dtype),  # a_s: A (operand dtype), left of W and U
        mgi.kkt_smem((CHUNK, CHUNK), mgi.MERGE_DTYPE),  # l_s: Mk_hi
        mgi.kkt_smem((CHUNK, CHUNK), mgi.MERGE_DTYPE),  # al_s: Mk_lo
        mgi.kkt_smem((CHUNK, CHUNK), mgi.MERGE_DTYPE),  # x_s: X_hi
        mgi.kkt_smem((CHUNK, CHUNK), mgi.MERGE_DTYPE),  # xl_s: X_lo (fp16 outputs)
        plgpu.SMEM((dk,), F32),  # e_s
        vec, vec,  # ks_s, vs_s (rows)
        plgpu.Barrier(num_arrivals=9 if has_docs else 6),  # in_bar
    ]
    if has_docs:
        out += [plgpu.SMEM((CHUNK,), jnp.int32), vec, vec]  # starts, conn, last (rows)
    if interpret:
        out += [swz((CHUNK, CHUNK), dtype),  # sq_sh: L, P_s
                swz((CHUNK, dk), dtype), swz((CHUNK, dk), dtype),  # xk_sh, xq_sh
                plgpu.SMEM((dk, CHUNK), dtype),  # t_sh: k^T, Y'^T
                mgi.kkt_smem((CHUNK, CHUNK), mgi.MERGE_DTYPE)]  # my_s: the merges' Y
    else:
        out += [plgpu.SMEM((CHUNK, CHUNK + mgi.KKT_SOLVE_PAD), F32)]  # solve_s
    return out


def unsupported_reason(q, k, v, ks, vs) -> Optional[str]:
    """Why :func:`channelwise_local_mosaic` cannot take these operands, or ``None``.

    Args:
      q, k, v: ``[B, Tp, H, K or V]`` arrays; ks, vs: ``[B, Tp, H, 1 or K/V]`` scales.

    Returns:
      ``None`` when supported: q, k, v of one 16-bit dtype (bf16 / fp16), K and V in
      (64, 128), per-token scales (last dim 1: KDA's beta). Else a sentence naming the cause
      (GDN-2's per-channel write gate is not supported: MOSAIC_GPU.md Sec. 62).
    """
    if not (q.dtype == k.dtype == v.dtype) or jnp.dtype(q.dtype) not in mgl.SUPPORTED_DTYPES:
        return f"operands must share one 16-bit dtype, got {q.dtype}, {k.dtype}, {v.dtype}"
    if k.shape[-1] not in mgl.SUPPORTED_HEAD_DIMS or v.shape[-1] not in mgl.SUPPORTED_HEAD_DIMS:
        return f"K and V must be 64 or 128, got {k.shape[-1]}, {v.shape[-1]}"
    if ks.shape[-1] != 1 or vs.shape[-1] != 1:
        return ("per-channel scales (GDN-2's write gate) are not supported, only per-token "
                "scales (KDA's beta)")
    return None


@functools.partial(jax.jit, static_argnames=("save_a", "interpret"))
def channelwise_local_mosaic(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    ks: jax.Array,
    vs: jax.Array,
    g: jax.Array,
    docs: Tuple[jax.Array, ...] = (),
    *,
    save_a: bool = False,
    interpret: bool = False,
) -> Tuple[Dict[str, jax.Array], jax.Array]:
    """``channelwise_gpu._gamma`` + ``_prepare`` in one Mosaic GPU kernel.

    Per chunk of 64 tokens (paper arXiv 2607.07953, Eqs. 18-24; the module docstring has the
    equations and how the kernel forms them): ``gamma = cumsum(max(g, LOG_DECAY_FLOOR))``,
    ``Mk``, ``Mq`` (decayed, same document), ``A = (I + Mk)^{-1}``, ``W = A (kr E_in)``,
    ``U = A vw``, ``qg = q E_in``, ``kg = k E_out``, ``e = e^{gamma_C} conn_C``.

    Args:
      q, k: ``[B, Tp, H, K]``, v ``[B, Tp, H, V]``: the operands, one 16-bit dtype, ``Tp`` a
        multiple of 64 (``channelwise_delta_pallas`` pads).
      ks, vs: per-token scales ``[B, Tp, H, 1]`` (any float dtype, taken to fp32): ``kr = k
        ks``, ``vw = v vs``, each rounded once to the operand dtype.
      g: the log-decay ``[B, Tp, H, K]`` (fp32; floored at ``LOG_DECAY_FLOOR`` here).
      docs: ``()`` or ``(doc, conn, last)`` of
        :func:`pallas_kernels.common.pallas_gpu.docs_from_segment_ids` (``[B, Tp]``).
      save_a: also return ``a_ref`` (the backward's residual).
      interpret: Mosaic GPU interpret mode (CPU).

    Returns:
      ``(outs, gam)``: ``outs`` holds ``qg_ref``, ``kg_ref``, ``w_ref`` (operand dtype ``[B,
      Tp, H, K]``), ``u_ref`` (``[B, Tp, H, V]``), ``mq_ref`` (and with ``save_a``
      ``a_ref``; operand dtype ``[B, H, N, 64, 64]``, zero above the diagonal) and ``e_ref``
      (fp32 ``[B, H, N, K]``); ``gam`` is the within-chunk cumsum of the floored ``g``, fp32
      ``[B, Tp, H, K]``: what ``_prepare`` and ``_gamma`` return.

    Raises:
      ValueError: for operands :func:`unsupported_reason` refuses (named in the message), or
        ``Tp`` not a multiple of 64.
    """
    why = unsupported_reason(q, k, v, ks, vs)
    if why is not None:
        raise ValueError(f"channelwise_local_mosaic: {why}")
    bsz, tp, heads, dk = k.shape
    dv = v.shape[-1]
    if tp % CHUNK:
        raise ValueError(f"channelwise_local_mosaic: length {tp} is not a multiple of {CHUNK}")
    nc = tp // CHUNK
    mdt = q.dtype
    has_docs = bool(docs)

    def heads_major(x):
        return jnp.transpose(x[..., 0].astype(F32), (0, 2, 1))  # [B, H, Tp]

    ins = [q, k, v, g.astype(F32), heads_major(ks), heads_major(vs)]
    if has_docs:
        from pallas_kernels.common import channelwise_gpu

        doc, conn, last = docs
        starts = channelwise_gpu._doc_starts(doc)[..., 0]
        ins += [starts, conn.astype(F32), last.astype(F32)]
    tok = jax.ShapeDtypeStruct((bsz, tp, heads, dk), mdt)
    mats = jax.ShapeDtypeStruct((bsz, heads, nc, CHUNK, CHUNK), mdt)
    out_type = [tok, tok, tok, jax.ShapeDtypeStruct((bsz, tp, heads, dv), mdt), mats,
                jax.ShapeDtypeStruct((bsz, heads, nc, dk), F32),
                jax.ShapeDtypeStruct((bsz, tp, heads, dk), F32)]
    if save_a:
        out_type.append(mats)
    call = plgpu.kernel(
        functools.partial(_kernel, dk=dk, dv=dv, has_docs=has_docs, save_a=save_a,
                          interpret=interpret),
        out_type=tuple(out_type),
        scratch_types=_scratch(dk, dv, mdt, has_docs, interpret),
        grid=(nc, heads, bsz),  # chunks first: CUDA caps grid y and z at 65535
        grid_names=("n", "h", "b"),
        compiler_params=mgl.compiler_params(),
        interpret=mgl.interpret_params() if interpret else None,
        kernel_name=KERNEL_NAME,
    )
    with jax.named_scope(KERNEL_NAME):
        res = call(*ins)
    names = ["qg_ref", "kg_ref", "w_ref", "u_ref", "mq_ref", "e_ref"]
    outs = dict(zip(names, res[:6]))
    if save_a:
        outs["a_ref"] = res[7]
    return outs, res[6]
