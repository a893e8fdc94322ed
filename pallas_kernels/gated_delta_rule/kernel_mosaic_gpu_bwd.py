"""Gated DeltaNet / DeltaNet backward on Pallas Mosaic GPU (Hopper): the chunk-local gradients.

Nothing dispatches here yet. The GDN backward of the chunk form (paper "Gated Delta Networks:
Improving Mamba2 with Delta Rule", arXiv 2412.06464, Sec. 3.3 and App. on the chunkwise
algorithm; paper "Linear Attention Architectures", arXiv 2607.07953, Sec. 3.2, Eqs. 15-17; FLA's
``chunk_gated_delta_rule_bwd``, ``fla/ops/gated_delta_rule/chunk.py``) has four stages:

1. ``dv_local`` (FLA's ``chunk_bwd_dv_local``): ``v_new``'s gradient through its own chunk's
   read-out, ``scale (Q K^T * D)^T dO`` per chunk. Here: :func:`chunk_dv_local_mosaic`, or
   formed inside stage 2 (``chunk_delta_dh_mosaic(fold_dv_local=True)``, MOSAIC_GPU.md
   Sec. 32), which reuses :func:`_intra_chunk_decay`.
2. The reverse state pass (FLA's ``chunk_gated_delta_rule_bwd_dhu``):
   :func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu.chunk_delta_dh_mosaic` gives the
   gradient ``dS'`` of the state leaving every chunk and the total ``dv_new``.
3. The chunk-local gradients (FLA's ``chunk_bwd_dqkwg``): ``dq``, the part of ``dk`` through
   ``q . k`` and the state, ``dw`` and the explicit part of the gate gradient, from the stored
   states ``h``, ``dS'``, ``v_new``, ``do`` and ``dv_new``. Here: :func:`chunk_delta_grads_mosaic`.
4. The WY backward (FLA's ``prepare_wy_repr_bwd``): from ``dw`` and ``dU = dv_new`` through
   ``W = T diag(beta conn e^G) K``, ``U = T diag(beta) V`` and the unit-lower inverse ``T``
   to ``dk``, ``dv``, ``dbeta`` and the rest of ``dg``. Here:
   :func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu_wy_bwd.chunk_wy_bwd_mosaic`. The
   ``custom_vjp`` that composes the stages is not written yet.

Notation (as in :mod:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu`): per batch row, value
head ``h`` and chunk ``c`` of ``C = 64`` tokens, ``G`` is the chunk-local inclusive cumulative
log-decay (fp32; 0 for DeltaNet), ``G_L`` its last entry, ``S = S_c`` the state entering the
chunk (``[K, V]``), ``S'`` the state leaving it, ``conn_t`` is 1 on the tokens of the document
open before the chunk, ``last_s`` 1 on the tokens of the chunk's last document,
``keep = conn_L`` (0 when a document starts inside the chunk), and
``D_ts = e^{G_t - G_s}`` on causal (``s <= t``) same-document pairs, else 0. The forward of the
chunk, with ``W, U`` the WY factors, is::

    v_new = U - W S                                                               (a)
    o_t   = scale ( conn_t e^{G_t} S^T q_t + sum_s D_ts (q_t . k_s) v_new_s )          (b)
    S'    = keep e^{G_L} S + sum_s last_s e^{G_L - G_s} k_s v_new_s^T                  (c)

Status (2026-12-03): CPU only, not run on a GPU. Tested
(``tests/pallas_kernels/kernel_mosaic_gdn_bwd_test.py``) in interpret mode against ``jax.vjp``
of fp32 chunk forms, including the composed pipeline (forward state pass, stages 1-3 and an
XLA WY backward by ``jax.vjp`` of ``chunked.wy_representation``) against every gradient of
``chunked.gated_delta_rule_chunked``, and exported for CUDA at K, V in {64, 128}.

CPU testing as in the other Mosaic GPU modules (``pallas_kernels/common/MOSAIC_GPU.md``):
interpret mode with the ``interpret`` shims of :mod:`pallas_kernels.common.mosaic_gpu_lib`
(transposed operands copied into SMEM scratch, plain vector loads), and lowering for CUDA.
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


def _intra_chunk_decay(g_row_s, g_col_s, doc_row_s, doc_col_s, interpret: bool, *,
                       transpose: bool = False):
    """``(D, G)``: ``D`` ``[C, C]`` fp32 with ``D_ts = e^{G_t - G_s}`` for ``s <= t`` in the
    same document (row ``t``, column ``s``), else 0, and ``G`` ``[C]`` in the row layout.

    With ``transpose`` it is ``D^T`` (row ``s``, column ``t``). ``G`` and the document ids come
    as a row copy and a column copy in SMEM (the two views need different register layouts).
    The mask is applied to the exponent before ``exp``, so ``D <= 1`` (no overflow where
    ``G_t - G_s > 0``).
    """
    shape = (CHUNK, CHUNK)
    g_r, g_c = mgl.load_rows(g_row_s, interpret), mgl.load_cols(g_col_s, interpret)
    d_r, d_c = mgl.load_rows(doc_row_s, interpret), mgl.load_cols(doc_col_s, interpret)
    r, c = mgl.iota(shape, 0, interpret), mgl.iota(shape, 1, interpret)

    def by_col(x):
        return lax.broadcast_in_dim(x, shape, [1])

    same_doc = mgl.by_row(d_r, shape) == by_col(d_c)
    if transpose:  # row s, column t: t >= s, exponent G_t - G_s
        mask, expo = (r <= c) & same_doc, by_col(g_c) - mgl.by_row(g_r, shape)
    else:  # row t, column s: s <= t
        mask, expo = (c <= r) & same_doc, mgl.by_row(g_r, shape) - by_col(g_c)
    return jnp.exp(jnp.where(mask, expo, -jnp.inf)), g_r


def _copy_vectors(g_ref, doc_ref, b, h, rows, vecs, bar):
    """Row and column copies of the chunk's gate cumsum and document ids (4 TMA copies)."""
    g_row_s, g_col_s, doc_row_s, doc_col_s = vecs
    plgpu.copy_gmem_to_smem(g_ref.at[b, h, rows], g_row_s, bar)
    plgpu.copy_gmem_to_smem(g_ref.at[b, h, rows], g_col_s, bar)
    plgpu.copy_gmem_to_smem(doc_ref.at[b, rows], doc_row_s, bar)
    plgpu.copy_gmem_to_smem(doc_ref.at[b, rows], doc_col_s, bar)


# ----------------------------------------------------------------------------------------------
# Stage 1: dv_local, v_new's gradient through its own chunk's read-out.


def _dv_local_kernel(q_ref, k_ref, do_ref, g_ref, doc_ref, *rest, group: int, scale: float,
                     has_du: bool, interpret: bool):
    """Kernel body of :func:`chunk_dv_local_mosaic`: one chunk of one ``(b, h)`` per CTA.

    ``rest`` = ``[du_ref,] dvl_ref, q_s, k_s, do_s, g_row_s, g_col_s, doc_row_s, doc_col_s,
    out_s, [du_s,] in_bar`` then ``shim`` (interpret only): SMEM scratch for ``q^T`` and for
    ``P^T`` as a ``wgmma`` operand. With ``has_du`` the residual's cotangent ``du`` is added to
    the fp32 product before its one rounding.
    """
    rest = list(rest)
    du_ref = rest.pop(0) if has_du else None
    dvl_ref, q_s, k_s, do_s, g_row_s, g_col_s, doc_row_s, doc_col_s, out_s = rest[:9]
    rest = rest[9:]
    du_s = rest.pop(0) if has_du else None
    in_bar, shim = rest[0], rest[1:]
    n, h, b = lax.axis_index("n"), lax.axis_index("h"), lax.axis_index("b")
    hk = lax.div(h, group)  # GVA: value head h reads query/key head h // group
    rows = pl.ds(n * CHUNK, CHUNK)
    plgpu.copy_gmem_to_smem(q_ref.at[b, rows, hk], q_s, in_bar)
    plgpu.copy_gmem_to_smem(k_ref.at[b, rows, hk], k_s, in_bar)
    plgpu.copy_gmem_to_smem(do_ref.at[b, rows, h], do_s, in_bar)
    if has_du:
        plgpu.copy_gmem_to_smem(du_ref.at[b, rows, h], du_s, in_bar)
    _copy_vectors(g_ref, doc_ref, b, h, rows, (g_row_s, g_col_s, doc_row_s, doc_col_s), in_bar)
    plgpu.barrier_wait(in_bar)
    qt_s, pt_s = shim if interpret else (None, None)

    def scores(acc):
        plgpu.wgmma(acc, k_s, mgl.transposed(q_s, qt_s, interpret))  # K Q^T = (Q K^T)^T
        return acc[...]

    # The barrier keeps the arithmetic below after the accumulator read (jla's pitfall).
    kq = lax.optimization_barrier(pl.run_scoped(scores, plgpu.ACC((CHUNK, CHUNK))))
    decay_t, _ = _intra_chunk_decay(g_row_s, g_col_s, doc_row_s, doc_col_s, interpret,
                                    transpose=True)
    pt = (kq * (scale * decay_t)).astype(do_s.dtype)  # P^T, 16-bit: the left wgmma operand

    def product(acc):
        plgpu.wgmma(acc, mgl.lhs_operand(pt, pt_s, interpret), do_s)  # P^T dO, [C, V]
        return acc[...]

    dvl = lax.optimization_barrier(pl.run_scoped(product, plgpu.ACC((CHUNK, do_s.shape[-1]))))
    if has_du:
        dvl = dvl + mgl.load_tile(du_s, interpret).astype(jnp.float32)
    out_s[...] = dvl.astype(out_s.dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(out_s, dvl_ref.at[b, rows, h])
    plgpu.wait_smem_to_gmem(0)


@functools.partial(jax.jit, static_argnames=("scale", "interpret"))
def chunk_dv_local_mosaic(
    q: jax.Array,
    k: jax.Array,
    do: jax.Array,
    g: Optional[jax.Array],
    *,
    scale: float,
    segment_ids: Optional[jax.Array] = None,
    gate_cumsum: Optional[jax.Array] = None,
    doc_vecs: Optional[Tuple[jax.Array, jax.Array, jax.Array]] = None,
    residual_grad: Optional[jax.Array] = None,
    interpret: bool = False,
) -> jax.Array:
    """``dv_local = scale (Q K^T * D)^T dO`` per chunk: ``v_new``'s gradient through (b).

    The counterpart of FLA's ``chunk_bwd_dv_local`` (``fla/ops/common/chunk_o.py``), stage 1 of
    the module docstring: from (b), with ``v_new`` held fixed elsewhere,
    ``dL/dv_new_s = scale sum_{t >= s, doc(t) = doc(s)} e^{G_t - G_s} (q_t . k_s) do_t``
    within the chunk. It is the ``dv_local`` input of
    :func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu.chunk_delta_dh_mosaic`, which adds
    the state path ``diag(last e^{G_L - G}) K dS'``; a cotangent of the returned residual
    ``u = v_new`` (``residual_grad``) is added here, to the fp32 product before its rounding.

    Kernel structure (as :func:`pallas_kernels.simple_gla.kernel_mosaic_gpu.chunk_output_mosaic`):
    one CTA per ``(chunk, value head, batch row)``, one warpgroup, seven TMA copies on one
    barrier (``q, k`` of the key head, ``do``, row and column copies of the gate and document
    vectors; eight with ``residual_grad``). ``wgmma`` forms ``K Q^T`` (the transpose of the
    scores, so no ``[C, C]`` transpose is needed), the transposed decay ``D^T`` is applied
    with the mask in the exponent, and ``P^T`` (16-bit, a register operand on the GPU) times
    ``dO`` is the output, stored in ``do``'s dtype through a swizzled SMEM tile.

    Args:
        q: queries ``[B, T, Hk, K]``, bf16 or fp16; ``H % Hk == 0``.
        k: keys ``[B, T, Hk, K]``, q's shape and dtype.
        do: output gradient ``[B, T, H, V]``, q's dtype. ``K, V`` in {64, 128}.
        g: per-token log-decay ``[B, T, H]`` (natural log, ``<= 0``), or ``None`` (DeltaNet).
        scale: read-out scale of the forward (static).
        segment_ids: optional int ``[B, T]``; documents start wherever the id changes.
        doc_vecs: optional ``(doc, conn, last)``, fp32 ``[B, Tp]`` each, as
            :func:`pallas_kernels.common.mosaic_gpu_lib.doc_vectors` gives them for
            ``segment_ids``, formed once by a caller that runs several kernels (``mosaic_vjp``);
            ``None``: formed here.
        gate_cumsum: optional fp32 ``[B, H, Tp]`` (``Tp = 64 ceil(T / 64)``), ``g``'s
            chunk-local cumsum as :func:`pallas_kernels.common.mosaic_gpu_lib.chunk_cumsum`
            gives it, computed once by a caller that runs several kernels on one ``g``
            (``mosaic_vjp``); ``None``: computed here.
        residual_grad: optional ``[B, T, H, V]`` in ``do``'s dtype, the cotangent ``du`` of the
            residual ``u = v_new`` the op returns for routing; added to ``dv_local``.
        interpret: run in Mosaic GPU interpret mode (CPU; slow, for tests).

    Returns:
        ``dv_local`` (plus ``residual_grad``) ``[B, T, H, V]`` in ``do``'s dtype. Exact up to
        the 16-bit rounding of ``P^T`` (fp32 accumulation) and of the output.

    Raises:
        ValueError: on mismatched shapes or dtypes, unsupported head dims or dtypes, ``H`` not
            a multiple of ``Hk``, or ``g``, ``segment_ids``, ``residual_grad`` of the wrong
            shape or dtype.
    """
    batch, seq_len, kv_heads, dk = k.shape
    heads, dv = do.shape[2], do.shape[3]
    if q.shape != k.shape or q.dtype != k.dtype:
        raise ValueError(f"q and k must match: {q.shape=} {k.shape=} {q.dtype=} {k.dtype=}")
    mgl.check_kv_gates(k, do, g, segment_ids, names=("k", "do"))
    has_du = residual_grad is not None
    if has_du and (residual_grad.shape != do.shape or residual_grad.dtype != do.dtype):
        raise ValueError(f"residual_grad must have do's shape {do.shape} and dtype {do.dtype}, "
                         f"got {residual_grad.shape=} {residual_grad.dtype=}")
    num_chunks = -(-seq_len // CHUNK)
    padded = num_chunks * CHUNK
    q, k, do = (mgl.pad_time(x, num_chunks) for x in (q, k, do))
    du = (mgl.pad_time(residual_grad, num_chunks),) if has_du else ()
    gc = mgl.chunk_cumsum(g, (batch, seq_len, heads), num_chunks, gate_cumsum)  # [B, H, Tp]
    doc, _, _ = mgl.doc_vectors(segment_ids, batch, num_chunks, doc_vecs)  # [B, Tp]
    vec = plgpu.SMEM((CHUNK,), jnp.float32)
    swz = mgl.swizzled_smem
    shim = [plgpu.SMEM((dk, CHUNK), q.dtype),  # qt_s
            plgpu.SMEM((CHUNK, CHUNK), do.dtype)]  # pt_s
    call = plgpu.kernel(
        functools.partial(_dv_local_kernel, group=heads // kv_heads, scale=float(scale),
                          has_du=has_du, interpret=interpret),
        out_type=jax.ShapeDtypeStruct((batch, padded, heads, dv), do.dtype),
        scratch_types=[
            swz((CHUNK, dk), q.dtype),  # q_s
            swz((CHUNK, dk), k.dtype),  # k_s
            swz((CHUNK, dv), do.dtype),  # do_s
            vec, vec, vec, vec,  # g_row_s, g_col_s, doc_row_s, doc_col_s
            swz((CHUNK, dv), do.dtype),  # out_s: staging of dv_local
        ] + ([swz((CHUNK, dv), do.dtype)] if has_du else [])  # du_s
        + [plgpu.Barrier(num_arrivals=7 + has_du)]  # in_bar: the input copies landed
        + (shim if interpret else []),
        grid=(num_chunks, heads, batch),  # chunks first: CUDA caps grid y and z at 65535
        grid_names=("n", "h", "b"),
        compiler_params=mgl.compiler_params(),
        interpret=mgl.interpret_params() if interpret else None,
        kernel_name="gdn_chunk_dv_local",
    )
    with jax.named_scope("gdn_chunk_dv_local_mosaic"):
        dvl = call(q, k, do, gc, doc, *du)
    return dvl[:, :seq_len]


# ----------------------------------------------------------------------------------------------
# Stage 3: dq, dk, dw and the gate terms of every chunk.


def _grads_kernel(q_ref, k_ref, vn_ref, do_ref, dvn_ref, h_ref, dh_ref, g_ref, doc_ref, conn_ref,
                  last_ref, dq_ref, dk_ref, dw_ref, dgt_ref, bnd_ref, q_s, k_s, vn_s, do_s, dvn_s,
                  h_s, dh_s, g_row_s, g_col_s, doc_row_s, doc_col_s, conn_s, last_s, ds_s, out_s,
                  dgt_s, bnd_s, in_bar, *shim, group: int, scale: float, interpret: bool,
                  dq16: bool = False, kv_loop: bool = False):
    """Kernel body of :func:`chunk_delta_grads_mosaic`: one chunk of one ``(b, h)`` per CTA.

    ``shim``: with ``kv_loop`` (GVA, MOSAIC_GPU.md Sec. 27.5) first an fp32 ``[C, K]`` tile
    ``dqacc_s`` (the group sum of ``dq``) and a 2-arrival barrier for ``q, k``; else with
    ``dq16`` first a 16-bit ``[C, K]`` staging tile for ``dq`` (which then leaves in the input
    dtype, rounded once); then (interpret only) SMEM scratch for the transposed operands
    ``k^T``, ``v_new^T``, ``S^T``, ``dS'^T`` and ``dA^T`` (see :func:`mosaic_gpu_lib.transposed`).

    With ``kv_loop`` the grid's ``h`` axis runs over key heads: the CTA loads ``q, k`` of key
    head ``hk`` once and loops over its ``group`` value heads ``hk * group + j``, adding each
    one's fp32 ``dq`` into ``dqacc_s``; ``dq_ref`` is ``[B, Tp, Hk, K]`` and gets the group sum
    once, after the loop (in 16 bits staged in ``q_s``, free by then, with ``dq16``). ``dk``,
    ``dw`` and the gate partials stay per value head.
    """
    if kv_loop:
        dqacc_s, qk_bar, shim = shim[0], shim[1], shim[2:]
        dq16_s = None
    else:
        dq16_s, shim = (shim[0], shim[1:]) if dq16 else (None, shim)
    n, h, b = lax.axis_index("n"), lax.axis_index("h"), lax.axis_index("b")
    # GVA: value head h reads query/key head h // group; with kv_loop h is the key head.
    hk = h if kv_loop else lax.div(h, group)
    rows = pl.ds(n * CHUNK, CHUNK)
    dk = k_s.shape[-1]
    kt_s, vnt_s, ht_s, dht_s, dst_s = shim if interpret else (None,) * 5

    def head(h, accumulate):
        """One value head's chunk: ``dq`` (stored, or added into ``dqacc_s``), ``dk``, ``dw``
        and the gate partials. ``q_s``, ``k_s`` are loaded (or their copies issued on
        ``in_bar``) by the caller."""
        plgpu.copy_gmem_to_smem(vn_ref.at[b, rows, h], vn_s, in_bar)
        plgpu.copy_gmem_to_smem(do_ref.at[b, rows, h], do_s, in_bar)
        plgpu.copy_gmem_to_smem(dvn_ref.at[b, rows, h], dvn_s, in_bar)
        plgpu.copy_gmem_to_smem(h_ref.at[b, h, n], h_s, in_bar)
        plgpu.copy_gmem_to_smem(dh_ref.at[b, h, n], dh_s, in_bar)
        _copy_vectors(g_ref, doc_ref, b, h, rows, (g_row_s, g_col_s, doc_row_s, doc_col_s),
                      in_bar)
        plgpu.copy_gmem_to_smem(conn_ref.at[b, rows], conn_s, in_bar)
        plgpu.copy_gmem_to_smem(last_ref.at[b, rows], last_s, in_bar)
        plgpu.barrier_wait(in_bar)
        s_t = mgl.transposed(h_s, ht_s, interpret)  # S^T [V, K], read by the dq and dw products

        def scores(acc):
            plgpu.wgmma(acc, do_s, mgl.transposed(vn_s, vnt_s, interpret))  # do v_new^T, [C, C]
            return acc[...]

        # The barrier keeps the arithmetic below after the accumulator read (jla's pitfall).
        dp = lax.optimization_barrier(pl.run_scoped(scores, plgpu.ACC((CHUNK, CHUNK))))
        decay, g_i = _intra_chunk_decay(g_row_s, g_col_s, doc_row_s, doc_col_s, interpret)
        ds_s[...] = (dp * (scale * decay)).astype(ds_s.dtype)  # dA = scale (do v_new^T) * D
        plgpu.commit_smem()

        g_last = g_row_s[CHUNK - 1]
        # S reaches token t as conn_t e^{G_t}; token s reaches S' as last_s e^{G_L - G_s} (<= 1).
        in_scale = scale * jnp.exp(g_i) * mgl.load_rows(conn_s, interpret)
        out_scale = jnp.exp(g_last - g_i) * mgl.load_rows(last_s, interpret)

        def store(x, out_ref):
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the previous store read out_s
            out_s[...] = x
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(out_s, out_ref.at[b, rows, h])

        def dq_products(intra, inter):
            plgpu.wgmma(intra, ds_s, k_s)  # dA k, [C, K]
            plgpu.wgmma(inter, do_s, s_t)  # do S^T, [C, K]
            return intra[...], inter[...]

        intra, inter = lax.optimization_barrier(
            pl.run_scoped(dq_products, plgpu.ACC((CHUNK, dk)), plgpu.ACC((CHUNK, dk))))
        dq = intra + inter * mgl.by_row(in_scale, inter.shape)
        # Gate terms q_t . dq_t - k_t . dk_t in fp32, from the fp32 gradients before any rounding.
        dgt = jnp.sum(mgl.load_tile(q_s, interpret).astype(jnp.float32) * dq, axis=1)
        if accumulate:  # GVA: the group sum in fp32; each thread reads back what it wrote
            dqacc_s[...] = mgl.load_tile(dqacc_s, interpret) + dq
        elif dq16:  # its own staging tile: rounded once to the input dtype
            dq16_s[...] = dq.astype(dq16_s.dtype)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(dq16_s, dq_ref.at[b, rows, h])
        else:
            store(dq, dq_ref)

        def dk_products(intra, state):
            plgpu.wgmma(intra, mgl.transposed(ds_s, dst_s, interpret), q_s)  # dA^T q, [C, K]
            plgpu.wgmma(state, vn_s, mgl.transposed(dh_s, dht_s, interpret))  # v_new dS'^T
            return intra[...], state[...]

        intra, state = lax.optimization_barrier(
            pl.run_scoped(dk_products, plgpu.ACC((CHUNK, dk)), plgpu.ACC((CHUNK, dk))))
        dk_state = state * mgl.by_row(out_scale, state.shape)  # last_s e^{G_L - G_s} dS' v_new_s
        dk_total = intra + dk_state
        k_f = mgl.load_tile(k_s, interpret).astype(jnp.float32)
        dgt = dgt - jnp.sum(k_f * dk_total, axis=1)
        # <S', dS'> = keep e^{G_L} <S, dS'> + sum_s k_s . dk_state_s (from (c)); the first part
        # as row sums of 64-row slices of S * dS'. Per-row partials; XLA adds the chunk's 64.
        bnd = jnp.sum(k_f * dk_state, axis=1)
        carry = jnp.exp(g_last) * conn_s[CHUNK - 1]  # keep e^{G_L}
        for r in range(0, dk, CHUNK):
            rows_r = pl.ds(r, CHUNK)
            s_c = mgl.load_tile(h_s.at[rows_r], interpret).astype(jnp.float32)
            ds_next = mgl.load_tile(dh_s.at[rows_r], interpret).astype(jnp.float32)
            bnd = bnd + carry * jnp.sum(s_c * ds_next, axis=1)
        store(dk_total, dk_ref)
        dgt_s[...] = dgt
        bnd_s[...] = bnd
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(dgt_s, dgt_ref.at[b, h, rows])
        plgpu.copy_smem_to_gmem(bnd_s, bnd_ref.at[b, h, rows])

        def dw_product(acc):
            plgpu.wgmma(acc, dvn_s, s_t)  # dv_new S^T, [C, K]
            return acc[...]

        dw = lax.optimization_barrier(pl.run_scoped(dw_product, plgpu.ACC((CHUNK, dk))))
        # acc * -1, not -acc: jla saw a negated fresh accumulator read as zeros (MOSAIC_GPU.md).
        store(dw * jnp.float32(-1.0), dw_ref)
        plgpu.wait_smem_to_gmem(0)

    if not kv_loop:
        plgpu.copy_gmem_to_smem(q_ref.at[b, rows, hk], q_s, in_bar)
        plgpu.copy_gmem_to_smem(k_ref.at[b, rows, hk], k_s, in_bar)
        head(h, accumulate=False)
        return
    plgpu.copy_gmem_to_smem(q_ref.at[b, rows, hk], q_s, qk_bar)
    plgpu.copy_gmem_to_smem(k_ref.at[b, rows, hk], k_s, qk_bar)
    dqacc_s[...] = mgl.zeros_acc((CHUNK, dk), interpret)
    plgpu.barrier_wait(qk_bar)

    def value_head(j, carry):
        plgpu.commit_smem()  # every thread is done with the previous head's tiles
        head(hk * group + j, accumulate=True)
        return carry

    lax.fori_loop(0, group, value_head, None)
    dq = mgl.load_tile(dqacc_s, interpret)
    if dq16:  # q_s is free after the last head's dA^T q: the 16-bit staging tile
        q_s[...] = dq.astype(q_s.dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(q_s if dq16 else dqacc_s, dq_ref.at[b, rows, hk])
    plgpu.wait_smem_to_gmem(0)


def _check_grads_inputs(q, k, v_new, do, dv_new, g, h, dh, segment_ids) -> int:
    """Shapes and dtypes of :func:`chunk_delta_grads_mosaic`'s inputs; returns ``N``.

    Raises:
        ValueError: naming the argument and the shape or dtype it needs.
    """
    batch, seq_len, _, dk = k.shape
    heads, dv = v_new.shape[2], v_new.shape[3]
    num_chunks = -(-seq_len // CHUNK)
    if q.shape != k.shape or q.dtype != k.dtype:
        raise ValueError(f"q and k must match: {q.shape=} {k.shape=} {q.dtype=} {k.dtype=}")
    mgl.check_kv_gates(k, v_new, g, segment_ids, names=("k", "v_new"))
    for name, x in (("do", do), ("dv_new", dv_new)):
        if x.shape != v_new.shape or x.dtype != v_new.dtype:
            raise ValueError(f"{name} must have v_new's shape {v_new.shape} and dtype "
                             f"{v_new.dtype}, got {name}.shape={x.shape} {name}.dtype={x.dtype}")
    for name, x in (("h", h), ("dh", dh)):
        if x.shape != (batch, heads, num_chunks, dk, dv):
            raise ValueError(f"{name} must be [B, H, N, K, V] = "
                             f"{(batch, heads, num_chunks, dk, dv)}, got {name}.shape={x.shape}")
    return num_chunks


def _group_sum(x, kv_heads):
    """``[B, T, H, K]`` per value head to ``[B, T, Hk, K]``: the sum over each GVA group."""
    batch, seq_len, heads, dim = x.shape
    if heads == kv_heads:
        return x
    return jnp.sum(x.reshape(batch, seq_len, kv_heads, heads // kv_heads, dim), axis=3)


@functools.partial(jax.jit, static_argnames=("scale", "interpret"))
def chunk_delta_grads_mosaic(
    q: jax.Array,
    k: jax.Array,
    v_new: jax.Array,
    do: jax.Array,
    dv_new: jax.Array,
    g: Optional[jax.Array],
    h: jax.Array,
    dh: jax.Array,
    *,
    scale: float,
    segment_ids: Optional[jax.Array] = None,
    interpret: bool = False,
) -> Tuple[jax.Array, jax.Array, jax.Array, Optional[jax.Array]]:
    """``dq``, ``dk`` (through ``q . k`` and the state), ``dw`` and the chunk-local ``dg``.

    The counterpart of FLA's ``chunk_bwd_dqkwg`` (``fla/ops/common/chunk_o.py``) for the
    delta rule, as a Mosaic GPU kernel: stage 3 of the module docstring. It returns the partial
    derivatives of the loss w.r.t. ``q``, ``k``, ``W`` and the chunk-local cumulative gate
    ``G`` **through the forward equations (a)-(c) only, with ``W``, ``U`` held fixed** (the WY
    factors' own dependence on ``k``, ``beta`` and ``g`` is the WY backward's, stage 4). With
    ``do_t = dL/do_t``, ``dS' = dL/dS'`` (the gradient of the state leaving the chunk, from the
    reverse state pass), ``dv_new = dL/dv_new`` (its total, same source) and
    ``dA_ts = scale (do_t . v_new_s) D_ts``, differentiating (a)-(c) gives::

        dq_t = scale conn_t e^{G_t} S do_t + sum_s dA_ts k_s                   (dq = dA K + ...)
        dk_s = sum_t dA_ts q_t + last_s e^{G_L - G_s} dS' v_new_s               (dA^T Q + ...)
        dW   = -dv_new S^T                                                      (from (a))
        dL/dG_t = q_t . dq_t - k_t . dk_t + [t = L] <S', dS'>
        <S', dS'> = keep e^{G_L} <S, dS'> + sum_s k_s . (last_s e^{G_L - G_s} dS' v_new_s)

    The gate line: each term of ``o_t`` and ``S'`` is proportional to ``e^{G_t}`` (from (b))
    or ``e^{-G_s}`` (from ``D`` and (c)), so ``dL/dG_t`` collects ``q_t . dq_t`` from the first
    and ``-k_t . dk_t`` from the second; ``dS'/dG_L = S'`` at fixed ``S, v_new`` (every term of
    (c) carries ``e^{G_L}``). With ``G_t = sum_{s <= t} g_s`` inside the chunk,
    ``dL/dg_t = sum_{s >= t in the chunk} dL/dG_s`` (returned as ``dg``). These are the chunk
    form of GDN (arXiv 2412.06464, Sec. 3.3 "Chunkwise parallel form", hardware-efficient
    training algorithm; arXiv 2607.07953, Eqs. 15-17) differentiated, i.e. what ``jax.vjp`` of
    :func:`pallas_kernels.gated_delta_rule.chunked.gated_delta_rule_chunked`'s scan (with
    ``W = big_w``, ``U = big_u`` as independent inputs) gives for ``q``, ``k``, ``W`` and ``g``.
    The gradient w.r.t. ``S`` itself, and ``dv_new``, are the reverse state pass's. ``w``
    is not an input: ``dW`` needs only ``dv_new`` and ``S``.

    Kernel structure (as :func:`pallas_kernels.simple_gla.kernel_mosaic_gpu.chunk_grads_mosaic`):
    one CTA per ``(chunk, value head, batch row)``, one warpgroup, thirteen TMA copies on one
    barrier (``q, k`` of the key head, ``v_new, do, dv_new`` of the value head, ``S`` and
    ``dS'`` in the input dtype, row and column copies of the gate and document vectors,
    ``conn``, ``last``). ``wgmma`` (16-bit operands, fp32 accumulators): ``do v_new^T``; the
    masked decay applied in the exponent; ``dA`` to a swizzled 16-bit SMEM tile; then
    ``(dA K, do S^T)``, ``(dA^T Q, v_new dS'^T)`` as two groups and ``dv_new S^T``. Each
    gradient leaves in fp32 through one fp32 SMEM staging tile; the gate terms are formed in
    fp32 before any rounding. SMEM at K = V = 128: about 185 KB.

    With GVA (``Hk < H``, ``G = H / Hk``) and ``gva_loop`` (MOSAIC_GPU.md Sec. 27.5; on by
    default at ``K <= 64``) the CTA is one ``(chunk, key
    head, batch row)``: ``q, k`` are loaded once and the value heads ``hk G + j`` run in a loop,
    each adding its fp32 ``dq`` into an fp32 ``[64, K]`` SMEM tile (+32 KB at K = 128), so
    ``dq = sum_j dq_(hk G + j)`` leaves the kernel once, ``[B, T, Hk, K]``; ``dk``, ``dw`` and
    the gate partials stay per value head. Without GVA the kernel is unchanged.

    Args:
        q: queries ``[B, T, Hk, K]``, bf16 or fp16; ``H % Hk == 0`` (value head ``h`` reads
            query/key head ``h // (H // Hk)``). As the forward read them (L2-normalised if so).
        k: keys ``[B, T, Hk, K]``, q's shape and dtype.
        v_new: ``[B, T, H, V]``, q's dtype: the forward's ``v_new = U - W S`` (the residual
            :func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu.chunk_delta_h_mosaic`
            returns). ``K, V`` in {64, 128}.
        do: output gradient ``[B, T, H, V]``, v_new's dtype.
        dv_new: ``[B, T, H, V]``, v_new's dtype: the total gradient of ``v_new`` (the second
            output of :func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu.
            chunk_delta_dh_mosaic`).
        g: per-token log-decay ``[B, T, H]`` (natural log, ``<= 0``), or ``None`` (DeltaNet).
        h: ``[B, H, N, K, V]`` states entering each chunk (``N = ceil(T / 64)``), as
            ``chunk_delta_h_mosaic`` stores them; rounded to the input dtype (a ``wgmma``
            operand) unless already in it.
        dh: ``[B, H, N, K, V]`` gradients w.r.t. the states *leaving* each chunk, as
            ``chunk_delta_dh_mosaic`` stores them; rounded to the input dtype unless already
            in it.
        scale: read-out scale of the forward (static).
        segment_ids: optional int ``[B, T]``; documents start wherever the id changes.
        interpret: run in Mosaic GPU interpret mode (CPU; slow, for tests).

    Returns:
        ``(dq, dk, dw, dg)``, all fp32: ``dq, dk`` ``[B, T, Hk, K]`` (summed over each GVA
        group of ``H // Hk`` value heads in XLA; ``dk`` without the WY part), ``dw``
        ``[B, T, H, K]`` (per value head), and ``dg`` ``[B, T, H]``, the gradient of the
        per-token log-decay through (b) and (c), or ``None`` when ``g`` is ``None``. Exact up
        to the 16-bit rounding of the ``wgmma`` operands (``S``, ``dS'``, ``dA`` besides the
        inputs) with fp32 accumulation.

    Raises:
        ValueError: on mismatched shapes or dtypes, unsupported head dims or dtypes, ``H`` not
            a multiple of ``Hk``, or ``h``, ``dh``, ``g``, ``segment_ids`` of the wrong shape.
    """
    batch, seq_len, kv_heads, _ = k.shape
    heads = v_new.shape[2]
    num_chunks = -(-seq_len // CHUNK)
    dq, dk_, dw, dgt, bnd = chunk_delta_grads_partials_mosaic(
        q, k, v_new, do, dv_new, g, h, dh, scale=scale, segment_ids=segment_ids,
        interpret=interpret)
    with jax.named_scope("gdn_chunk_grads_mosaic"):
        dk_ = _group_sum(dk_, kv_heads)
        dg = None
        if g is not None:
            boundary = jnp.sum(bnd.reshape(batch, heads, num_chunks, CHUNK), axis=-1)
            dgc = dgt.reshape(batch, heads, num_chunks, CHUNK)
            dgc = dgc.at[..., -1].add(boundary)  # dL/dG_t
            dgc = jnp.flip(jnp.cumsum(jnp.flip(dgc, -1), axis=-1), -1)  # dL/dg_t, in-chunk
            dg = jnp.moveaxis(dgc.reshape(batch, heads, num_chunks * CHUNK), 1, 2)[:, :seq_len]
    return dq, dk_, dw, dg


@functools.partial(jax.jit, static_argnames=("scale", "dq_dtype", "gva_loop", "interpret"))
def chunk_delta_grads_partials_mosaic(
    q: jax.Array,
    k: jax.Array,
    v_new: jax.Array,
    do: jax.Array,
    dv_new: jax.Array,
    g: Optional[jax.Array],
    h: jax.Array,
    dh: jax.Array,
    *,
    scale: float,
    segment_ids: Optional[jax.Array] = None,
    gate_cumsum: Optional[jax.Array] = None,
    doc_vecs: Optional[Tuple[jax.Array, jax.Array, jax.Array]] = None,
    dq_dtype=jnp.float32,
    gva_loop: Optional[bool] = None,
    interpret: bool = False,
) -> Tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array]:
    """The kernel of :func:`chunk_delta_grads_mosaic` with its outputs as the kernel writes
    them, for a consumer that finishes ``dk`` and ``dg`` in its own kernel
    (:func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu_wy_bwd.chunk_wy_bwd_mosaic`'s
    ``dk_partial`` and ``dg_partial``) instead of in XLA.

    Same math and arguments as :func:`chunk_delta_grads_mosaic` (``q, k`` ``[B, T, Hk, K]``,
    ``v_new, do, dv_new`` ``[B, T, H, V]`` bf16 or fp16, ``g`` ``[B, T, H]`` or ``None``,
    ``h, dh`` ``[B, H, N, K, V]``), plus ``gate_cumsum`` (optional fp32 ``[B, H, Tp]``, ``g``'s
    chunk-local cumsum computed once by the caller,
    :func:`pallas_kernels.common.mosaic_gpu_lib.chunk_cumsum`; ``None``: computed here) and
    ``doc_vecs`` (optional ``(doc, conn, last)`` fp32 ``[B, Tp]``,
    :func:`pallas_kernels.common.mosaic_gpu_lib.doc_vectors` of ``segment_ids`` formed once by
    the caller; ``None``: formed here) and ``dq_dtype`` (static): fp32 (default) or ``q``'s
    dtype, the dtype ``dq`` is returned in (the kernel writes it in that dtype, rounded once
    from its fp32 value; with GVA the group sum, formed in fp32) and ``gva_loop`` (static;
    GVA only): whether one CTA per key head loops over its value heads and forms ``dq``'s group
    sum in-kernel (:func:`chunk_delta_grads_mosaic`); else the kernel writes fp32 ``dq`` per
    value head and XLA sums and rounds it. ``None`` (default): on at ``K <= 64`` (the model
    presets' head dim), off at ``K = 128``, where offline ptxas finds spills with it
    (MOSAIC_GPU.md Sec. 27.5).

    Returns:
        ``(dq, dk, dw, dgt, bnd)``: ``dq`` ``[B, T, Hk, K]`` in ``dq_dtype``
        (``dq_t = scale conn_t e^{G_t} S do_t + sum_s dA_ts k_s``); fp32 ``dk`` ``[B, T, H, K]``
        **per value head** (``dk_s = sum_t dA_ts q_t + last_s e^{G_L - G_s} dS' v_new_s``, not
        summed over GVA groups); fp32 ``dw`` ``[B, T, H, K]`` (``dW = -dv_new S^T``); fp32
        ``dgt`` ``[B, H, Tp]`` (``Tp = 64 N``), the per-token ``dL/dG_t = q_t . dq_t -
        k_t . dk_t`` before the boundary term and before any cumsum; fp32 ``bnd``
        ``[B, H, Tp]``, 64 partials per chunk (not per token) whose sum is the boundary term
        ``<S', dS'>`` of the chunk's last token. ``dgt`` is 0 on padding tokens (``t >= T``).

    Raises:
        ValueError: as :func:`chunk_delta_grads_mosaic`, or a ``dq_dtype`` other than fp32 and
            ``q``'s dtype.
    """
    batch, seq_len, kv_heads, dk = k.shape
    heads, dv = v_new.shape[2], v_new.shape[3]
    num_chunks = _check_grads_inputs(q, k, v_new, do, dv_new, g, h, dh, segment_ids)
    padded = num_chunks * CHUNK
    # Padding tokens have q = k = v_new = do = dv_new = 0 and g = 0: they contribute nothing.
    q, k, v_new, do, dv_new = (mgl.pad_time(x, num_chunks) for x in (q, k, v_new, do, dv_new))
    gc = mgl.chunk_cumsum(g, (batch, seq_len, heads), num_chunks, gate_cumsum)  # [B, H, Tp]
    doc, conn, last = mgl.doc_vectors(segment_ids, batch, num_chunks, doc_vecs)  # [B, Tp] each
    f32 = jnp.float32
    vec = plgpu.SMEM((CHUNK,), f32)
    swz = mgl.swizzled_smem
    dtype = k.dtype
    shim = [plgpu.SMEM((dk, CHUNK), dtype),  # kt_s
            plgpu.SMEM((dv, CHUNK), dtype),  # vnt_s
            plgpu.SMEM((dv, dk), dtype),  # ht_s
            plgpu.SMEM((dv, dk), dtype),  # dht_s
            plgpu.SMEM((CHUNK, CHUNK), dtype)]  # dst_s
    dq_dtype = jnp.dtype(dq_dtype)
    if dq_dtype not in (jnp.dtype(f32), jnp.dtype(dtype)):
        raise ValueError(f"dq_dtype must be float32 or q's dtype {dtype}, got {dq_dtype}")
    group = heads // kv_heads
    if gva_loop is None:
        gva_loop = dk <= 64  # no spills there (offline ptxas, MOSAIC_GPU.md Sec. 27.5)
    kv_loop = gva_loop and group > 1  # one CTA per key head loops over its value heads
    dq16 = dq_dtype != jnp.dtype(f32) and (group == 1 or kv_loop)  # else XLA's group sum
    call = plgpu.kernel(
        functools.partial(_grads_kernel, group=group, scale=float(scale),
                          interpret=interpret, dq16=dq16, kv_loop=kv_loop),
        out_type=(jax.ShapeDtypeStruct((batch, padded, kv_heads if kv_loop else heads, dk),
                                       dtype if dq16 else f32),  # dq, summed over the group
                  jax.ShapeDtypeStruct((batch, padded, heads, dk), f32),  # dk
                  jax.ShapeDtypeStruct((batch, padded, heads, dk), f32),  # dw
                  jax.ShapeDtypeStruct((batch, heads, padded), f32),  # dgt
                  jax.ShapeDtypeStruct((batch, heads, padded), f32)),  # bnd
        scratch_types=[
            swz((CHUNK, dk), dtype),  # q_s
            swz((CHUNK, dk), dtype),  # k_s
            swz((CHUNK, dv), dtype),  # vn_s
            swz((CHUNK, dv), dtype),  # do_s
            swz((CHUNK, dv), dtype),  # dvn_s
            swz((dk, dv), dtype),  # h_s: S in 16 bits
            swz((dk, dv), dtype),  # dh_s: dS' in 16 bits
            vec, vec, vec, vec, vec, vec,  # g_row_s, g_col_s, doc_row_s, doc_col_s, conn_s, last_s
            swz((CHUNK, CHUNK), dtype),  # ds_s: masked dA
            swz((CHUNK, dk), f32),  # out_s: staging of dq, then dk, then dw
            vec, vec,  # dgt_s, bnd_s: staging of the per-row gate terms
            # in_bar: the 13 input copies landed (11 per value head with kv_loop)
            plgpu.Barrier(num_arrivals=11 if kv_loop else 13),
        ] + ([swz((CHUNK, dk), f32),  # dqacc_s: dq summed over the group in fp32
              plgpu.Barrier(num_arrivals=2)] if kv_loop  # qk_bar: q, k landed
             else [swz((CHUNK, dk), dtype)] if dq16 else [])  # dq16_s: staging of a 16-bit dq
        + (shim if interpret else []),
        # chunks first: CUDA caps grid y and z at 65535; with kv_loop the key heads
        grid=(num_chunks, kv_heads if kv_loop else heads, batch),
        grid_names=("n", "h", "b"),
        compiler_params=mgl.compiler_params(),
        interpret=mgl.interpret_params() if interpret else None,
        kernel_name="gdn_chunk_grads",
    )
    with jax.named_scope("gdn_chunk_grads_mosaic"):
        dq, dk_, dw, dgt, bnd = call(q, k, v_new, do, dv_new, h.astype(dtype), dh.astype(dtype),
                                     gc, doc, conn, last)  # astype: free when 16-bit already
        dq = dq[:, :seq_len] if kv_loop else _group_sum(dq[:, :seq_len], kv_heads).astype(dq_dtype)
    return dq, dk_[:, :seq_len], dw[:, :seq_len], dgt, bnd
