"""Gated DeltaNet sequence pieces: the maps ``M_p`` and the passes from zero ``X_p`` in one kernel.

MOSAIC_GPU.md Sec. 57 (issue 29, Sec. 49 finding 2). The fused ``T0`` forward on rows with few
CTAs (``mosaic_vjp.FUSED_T0_PIECES``, Sec. 42) cuts each row into ``P`` sequence pieces; piece
``p`` maps its entry state as ``S -> M_p S + X_p``. Without this module the two come from two
launches: ``M_p`` from the maps kernel
(:func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu.chunk_delta_piece_maps_mosaic`,
the ``[K, K]`` chain from the identity, ``gdn_chunk_delta_h_maps``) and ``X_p`` from a second
run of the fused ``T0`` kernel on the pieces from zero (``summary=True``,
``gdn_chunk_delta_fused_t0_fwd_summary``). :func:`chunk_delta_piece_maps_x_mosaic` forms both
in one launch (kernel ``gdn_chunk_delta_h_maps_x``): per CTA ``(piece row, value head h,
64-column block iv)`` three warpgroups,

* the memory warpgroup streams chunk ``n``'s ``k`` (key head ``h // group``), ``W`` and
  ``T0`` rows (head ``h``), the ``v`` columns ``iv`` and the gate, ``beta`` and document
  vectors into one two-stage TMA ring, read by both chains (the ``k`` and ``W`` reads shared);
* the maps warpgroup carries columns ``iv`` of ``M`` (``[K, 64]`` fp32, from the identity's),
  per chunk exactly the maps kernel's step (``A_c = keep e^{G_L} I - K^T diag(last
  e^{G_L - G}) W``, the same operands and roundings, so ``M_p`` is bit-equal to that kernel's)::

      M <- keep e^{G_L} M - K^T (last e^{G_L - G} * (W M))

* the local warpgroup carries columns ``iv`` of ``X`` (``[K, 64]`` fp32, from zero) with
  ``v_new`` in the three-pass form ``U - W X``, where ``U = Ag V`` and ``Ag = T0 * D * beta_j``
  (``D`` the decayed causal same-document mask; the fused ``T0`` kernel's ``Ag``, formed from
  ``T0`` in registers as two 16-bit terms). ``W = Ag diag(conn e^G) K`` (the ``T0`` kernel's
  ``return_w``), so ``U - W X = Ag (V - diag(conn e^G) K X)``, the fused ``T0`` kernel's
  ``v_new`` (module docstring of
  :mod:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu_fused`)::

      X <- keep e^{G_L} X + K^T (last e^{G_L - G} * (Ag V - W X))

  ``Ag V`` does not depend on ``X``: it is issued with ``W X`` (one wait), so the local chain
  has the maps chain's depth (two dependent ``wgmma`` rounds per chunk) instead of the summary
  pass's three (``K S``, then ``Ag X``, then the update). Not bit-equal to the summary pass:
  its ``X = V - diag(conn e^G) K S`` is rounded to 16 bits before ``Ag X``, here ``W`` (16-bit,
  as the maps use it) and fp32 ``Ag V`` are; the same order of error (Sec. 57's tests).

The grid's value axis has ``max(K, V) / 64`` blocks: block ``iv`` carries ``M`` columns ``iv``
when ``iv < K / 64`` and ``X`` columns ``iv`` when ``iv < V / 64``; with ``K != V`` the
warpgroup without columns only releases the ring's stages (no product, nothing stored). At
``K = V`` (every measured shape) each CTA runs both chains over the same ``N / P`` chunks, so
the work per CTA is equal (Sec. 57 says why this grid rather than ``(K + V) / 64`` blocks of
one chain each).

``piece_skip`` (MOSAIC_GPU.md Sec. 52): with ``piece_cuts`` (int32 ``[B * P]``, the piece-local
chunk of the piece's last document start or ``-1``), a cut piece's ``M_p`` is exactly zero (the
maps warpgroup runs no chunk and stores zeros) and its ``X_p`` depends only on the chunks from
the cut on (the ring and the local chain start there). Exact up to the sign of zeros.

Equations: arXiv 2607.07953 Sec. 3.2, Eqs. 14-17 (the chunk form), jla's ``[I | 0]``
augmented map pass and FLA's ``chunk_gated_delta_rule_fwd_h`` (the per-chunk state map).
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
BLOCK_V = mgl.BLOCK_V
STAGES = mgl.STAGES
_IN_COPIES = 11  # k, w, v, t0, g rows, g cols, beta cols, doc rows, doc cols, last, conn
KERNEL_NAME = "gdn_chunk_delta_h_maps_x"


def _maps_x_kernel(k_ref, w_ref, v_ref, t0_ref, g_ref, beta_ref, doc_ref, last_ref, conn_ref,
                   eye_ref, *rest, num_chunks: int, group: int, dk: int, dv: int,
                   skip: bool, interpret: bool):
    """Kernel body of :func:`chunk_delta_piece_maps_x_mosaic`; refs are GMEM.

    ``rest`` = ``[cut_ref,] maps_ref, x_ref`` then the scratch. ``eye_ref`` the fp32
    ``[K, K]`` identity (the maps chain's entry, TMA-copied by column block). ``skip``:
    ``cut_ref`` int32 ``[B * P]``; the ring and the local chain start at ``max(cut, 0)``, the
    maps chain runs only where ``cut < 0``.
    """
    rest = list(rest)
    cut_ref = rest.pop(0) if skip else None
    maps_ref, x_ref = rest.pop(0), rest.pop(0)
    (k_s, w_s, v_s, t0_s, g_row_s, g_col_s, b_col_s, doc_row_s, doc_col_s, last_s, conn_s,
     sbm_s, vdm_s, stm_s, sbx_s, vdx_s, stx_s, in_bar, in_free, io_bar, done, *shim) = rest
    ktm_s, ktx_s, hi_s, lo_s = shim if interpret else (None,) * 4
    ring = (k_s, w_s, v_s, t0_s, g_row_s, g_col_s, b_col_s, doc_row_s, doc_col_s, last_s,
            conn_s)
    b, h, iv = lax.axis_index("b"), lax.axis_index("h"), lax.axis_index("v")
    hk = lax.div(h, group)  # GVA: value head h reads key head h // group
    cols = pl.ds(iv * BLOCK_V, BLOCK_V)
    # the v columns the ring loads (clamped into [0, V): a block past V runs no local chain)
    v_cols = cols if dv >= dk else pl.ds(jnp.minimum(iv, dv // BLOCK_V - 1) * BLOCK_V, BLOCK_V)
    wg = lax.axis_index("wg")
    dtype = v_s.dtype
    sq = (CHUNK, CHUNK)
    tile = (CHUNK, BLOCK_V)
    blocks = max(dk, dv) // BLOCK_V
    # which chains this CTA carries (static True where every block carries one)
    maps_on = True if dk // BLOCK_V == blocks else iv < dk // BLOCK_V
    x_on = True if dv // BLOCK_V == blocks else iv < dv // BLOCK_V
    cut = None if cut_ref is None else cut_ref[b]
    lo = 0 if cut is None else jnp.maximum(cut, 0)  # the ring's and the local chain's start

    def when(flag, fn):
        if flag is True:
            fn()
        else:
            pl.when(flag)(fn)

    @pl.when(wg == 2)
    def _memory():
        plgpu.set_max_registers(40, action="decrease")

        def issue(n, slot):
            rows = pl.ds(n * CHUNK, CHUNK)
            srcs = (k_ref.at[b, rows, hk], w_ref.at[b, rows, h], v_ref.at[b, rows, h, v_cols],
                    t0_ref.at[b, rows, h], g_ref.at[b, h, rows], g_ref.at[b, h, rows],
                    beta_ref.at[b, h, rows], doc_ref.at[b, rows], doc_ref.at[b, rows],
                    last_ref.at[b, rows], conn_ref.at[b, rows])
            for src, dst in zip(srcs, ring, strict=True):
                plgpu.copy_gmem_to_smem(src, dst.at[slot], in_bar.at[slot])

        if cut is None:
            mgl.ring_producer(issue, num_chunks, in_free)
        else:
            mgl.ring_producer_from(issue, lo, num_chunks, in_free)

    def release(lo_n):  # a chain without columns here: chunks lo_n .. only released
        @pl.loop(lo_n, num_chunks)
        def _release(n):
            slot = lax.rem(n, STAGES)
            plgpu.barrier_wait(in_bar.at[slot])
            plgpu.barrier_arrive(in_free.at[slot])

    def chain(step, s0, run, start):
        """``step`` over chunks ``start ..`` where ``run`` (else none), then the stages left
        released; the final state (zero where it did not run)."""
        if run is True:
            return lax.fori_loop(start, num_chunks, step, s0)
        hi = jnp.where(run, num_chunks, start)
        s = lax.fori_loop(start, hi, step, s0)
        release(hi)
        return s

    @pl.when(wg == 0)
    def _maps():
        plgpu.set_max_registers(232, action="increase")
        run = maps_on if cut is None else jnp.logical_and(maps_on, cut < 0)
        if run is True:
            s0 = mgl.entry_state(eye_ref.at[:, cols], stm_s, io_bar, (dk, BLOCK_V), interpret)
        else:  # identity columns outside [0, K) are never loaded (no chain runs there)
            blk = jnp.minimum(iv, dk // BLOCK_V - 1)
            s0 = mgl.entry_state(eye_ref.at[:, pl.ds(blk * BLOCK_V, BLOCK_V)], stm_s, io_bar,
                                 (dk, BLOCK_V), interpret)

        def step(n, s):  # _delta_state_kernel's step with zero_u, no stores (bit-equal M)
            slot = lax.rem(n, STAGES)
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)
            sbm_s[...] = s.astype(sbm_s.dtype)
            plgpu.commit_smem()
            plgpu.barrier_wait(in_bar.at[slot])

            def w_state(acc):
                plgpu.wgmma(acc, w_s.at[slot], sbm_s)  # W M, [C, 64]
                return acc[...]

            ws = lax.optimization_barrier(pl.run_scoped(w_state, plgpu.ACC(tile)))
            vn = -ws
            g = mgl.load_rows(g_row_s.at[slot], interpret)
            g_last = g_row_s[slot, CHUNK - 1]
            k_decay = jnp.exp(g_last - g) * mgl.load_rows(last_s.at[slot], interpret)
            s_decay = jnp.exp(g_last) * conn_s[slot, CHUNK - 1]
            vdm_s[...] = (vn * mgl.by_row(k_decay, vn.shape)).astype(vdm_s.dtype)
            plgpu.commit_smem()
            k_t = mgl.transposed(k_s.at[slot], ktm_s, interpret)

            def update(acc):
                plgpu.wgmma(acc, k_t, vdm_s)  # K^T (decayed -W M), [K, 64]
                return acc[...]

            kv = lax.optimization_barrier(pl.run_scoped(update, plgpu.ACC((dk, BLOCK_V))))
            plgpu.barrier_arrive(in_free.at[slot])
            return s * s_decay + kv

        s = chain(step, s0, run, lo)
        if run is not True:
            s = s * run.astype(jnp.float32)  # a cut piece's map is zero (Sec. 52)
        when(maps_on, lambda: mgl.store_state(s, stm_s, maps_ref.at[b, h, :, cols]))

    @pl.when(wg == 1)
    def _local():
        plgpu.set_max_registers(232, action="increase")
        i, j = mgl.iota(sq, 0, interpret), mgl.iota(sq, 1, interpret)
        s0 = mgl.zeros_acc((dk, BLOCK_V), interpret)

        def step(n, s):
            slot = lax.rem(n, STAGES)
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)
            sbx_s[...] = s.astype(sbx_s.dtype)  # X in 16 bits: the operand of W X
            plgpu.commit_smem()
            plgpu.barrier_wait(in_bar.at[slot])
            g_i = mgl.load_rows(g_row_s.at[slot], interpret)
            g_j = mgl.load_cols(g_col_s.at[slot], interpret)
            d_i = mgl.load_rows(doc_row_s.at[slot], interpret)
            d_j = mgl.load_cols(doc_col_s.at[slot], interpret)
            g_last = g_row_s[slot, CHUNK - 1]
            decay = mgl.causal_decay(i, j, g_i, g_j, d_i, d_j)
            t0 = mgl.load_tile(t0_s.at[slot], interpret).astype(jnp.float32)
            beta_j = lax.broadcast_in_dim(mgl.load_cols(b_col_s.at[slot], interpret), sq, [1])
            ag = t0 * decay * beta_j  # the gated inverse times diag(beta), fp32
            a_hi = ag.astype(dtype)  # two 16-bit terms: only T0's own rounding remains
            a_lo = (ag - a_hi.astype(jnp.float32)).astype(dtype)

            def products(ws_acc, u_acc):  # issued together: one wait for both
                plgpu.wgmma(ws_acc, w_s.at[slot], sbx_s)  # W X, [C, 64]
                plgpu.wgmma(u_acc, mgl.lhs_operand(a_hi, hi_s, interpret), v_s.at[slot])
                plgpu.wgmma(u_acc, mgl.lhs_operand(a_lo, lo_s, interpret), v_s.at[slot])
                return ws_acc[...], u_acc[...]

            ws, u = lax.optimization_barrier(pl.run_scoped(products, plgpu.ACC(tile),
                                                           plgpu.ACC(tile)))
            vn = u - ws  # v_new = Ag V - W X, fp32
            k_decay = jnp.exp(g_last - g_i) * mgl.load_rows(last_s.at[slot], interpret)
            s_decay = jnp.exp(g_last) * conn_s[slot, CHUNK - 1]
            vdx_s[...] = (vn * mgl.by_row(k_decay, tile)).astype(vdx_s.dtype)
            plgpu.commit_smem()
            k_t = mgl.transposed(k_s.at[slot], ktx_s, interpret)

            def update(acc):
                plgpu.wgmma(acc, k_t, vdx_s)  # K^T (decayed v_new), [K, 64]
                return acc[...]

            kv = lax.optimization_barrier(pl.run_scoped(update, plgpu.ACC((dk, BLOCK_V))))
            plgpu.barrier_arrive(in_free.at[slot])
            return s * s_decay + kv

        s = chain(step, s0, x_on, lo)
        when(x_on, lambda: mgl.store_state(s, stx_s, x_ref.at[b, h, :, cols]))

    # All warpgroups leave together (an early exit while another issues wgmma is unsafe).
    plgpu.barrier_arrive(done)
    plgpu.barrier_wait(done)


@functools.partial(jax.jit, static_argnames=("pieces", "interpret", "piece_skip"))
def chunk_delta_piece_maps_x_mosaic(
    k: jax.Array,
    v: jax.Array,
    t0: jax.Array,
    w: jax.Array,
    g: Optional[jax.Array],
    beta: jax.Array,
    *,
    pieces: int,
    segment_ids: Optional[jax.Array] = None,
    gate_cumsum: Optional[jax.Array] = None,
    doc_vecs: Optional[Tuple[jax.Array, jax.Array, jax.Array]] = None,
    interpret: bool = False,
    piece_skip: bool = False,
    piece_cuts: Optional[jax.Array] = None,
) -> Tuple[jax.Array, jax.Array]:
    """The pieces' state maps ``M_p`` and passes from zero ``X_p`` in one launch.

    Piece ``p`` of each row (chunks ``p N / P .. (p + 1) N / P - 1``) maps its entry state as
    ``S -> M_p S + X_p``: ``M_p`` is the product over its chunks of ``A_c = keep_c e^{G_L} I -
    K_c^T diag(last_c e^{G_L - G}) W_c``, ``X_p`` the state chain from zero
    ``X <- keep e^{G_L} X + K^T diag(last e^{G_L - G}) (Ag V - W X)`` (module docstring;
    MOSAIC_GPU.md Sec. 29, 42, 57). One kernel (``gdn_chunk_delta_h_maps_x``, with
    ``piece_skip`` ``..._skip``) in place of
    :func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu.chunk_delta_piece_maps_mosaic`
    plus the fused ``T0`` kernel's ``summary=True`` launch.

    Args:
        k: keys ``[B, T, Hk, K]``, bf16 or fp16 (``H % Hk == 0``), K in {64, 128}.
        v: values ``[B, T, H, V]`` in k's dtype, V in {64, 128}.
        t0: the gate-free inverse ``T0`` ``[B, T, H, 64]`` in k's dtype
            (:func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu.chunk_kkt_inverse_mosaic`).
        w: ``W = T diag(beta conn e^G) K`` ``[B, T, H, K]`` in k's dtype (that kernel's
            ``return_w``).
        g: per-token log-decay ``[B, T, H]`` (natural log, ``<= 0``) or ``None`` (DeltaNet).
        beta: ``[B, T, H]``.
        pieces: static; ``P``, a divisor of the chunk count ``ceil(T / 64)``.
        segment_ids, gate_cumsum, doc_vecs, interpret: as
            :func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu.chunk_delta_h_mosaic`
            (the vectors formed on whole rows).
        piece_skip: static (MOSAIC_GPU.md Sec. 52); with documents, a piece in which a
            document starts stores ``M_p = 0`` without running its maps chain, and its local
            chain (and the ring) starts at the chunk of its last document start (kernel
            ``..._skip``). Without documents it changes nothing.
        piece_cuts: optional int32 ``[B * P]``
            (:func:`pallas_kernels.common.mosaic_gpu_lib.piece_cuts`), read only with
            ``piece_skip``; ``None``: formed here.

    Returns:
        ``(maps, x_local)``: ``[B, P, H, K, K]`` and ``[B, P, H, K, V]``, fp32. Exact up to
        the 16-bit rounding of the ``wgmma`` operands (``W``, ``K``, ``V``, ``Ag`` as two
        terms, the states in ``W S``, the decayed ``v_new``) with fp32 accumulation; ``maps``
        bit-equal to ``chunk_delta_piece_maps_mosaic``'s.

    Raises:
        ValueError: on mismatched shapes, unsupported head dims or dtypes, ``H`` not a
            multiple of ``Hk``, ``pieces`` not a positive divisor of the chunk count, or a bad
            ``piece_cuts``.
    """
    batch, seq_len, kv_heads, dk = k.shape
    heads, dv = v.shape[2], v.shape[3]
    mgl.check_kv_gates(k, v, g, segment_ids)
    if w.shape != (batch, seq_len, heads, dk) or w.dtype != k.dtype:
        raise ValueError(f"w must be [B, T, H, K] = {(batch, seq_len, heads, dk)} in k's dtype "
                         f"{k.dtype}, got {w.shape=} {w.dtype=}")
    if t0.shape != (batch, seq_len, heads, CHUNK) or t0.dtype != k.dtype:
        raise ValueError(f"t0 must be [B, T, H, 64] = {(batch, seq_len, heads, CHUNK)} in k's "
                         f"dtype {k.dtype}, got {t0.shape=} {t0.dtype=}")
    if beta.shape != (batch, seq_len, heads):
        raise ValueError(f"beta must be [B, T, H] = {(batch, seq_len, heads)}, got {beta.shape=}")
    num_chunks = -(-seq_len // CHUNK)
    pieces = mgl.given_pieces(pieces, num_chunks)
    rows = batch * pieces
    # Padding tokens have k = w = v = 0, T0 rows = 0, beta = 0 and g = 0: v_new = 0 there and
    # the states are unchanged (keep e^{G_L} = 1 unless a document starts).
    k, v, t0, w = (mgl.pad_time(x, num_chunks) for x in (k, v, t0, w))
    gc = mgl.chunk_cumsum(g, (batch, seq_len, heads), num_chunks, gate_cumsum)  # [B, H, Tp]
    beta_hm = jnp.moveaxis(mgl.pad_time(beta.astype(jnp.float32), num_chunks), 1, 2)
    doc, conn, last = mgl.doc_vectors(segment_ids, batch, num_chunks, doc_vecs)  # [B, Tp]
    cut = None
    if piece_skip and (segment_ids is not None or doc_vecs is not None):
        cut = mgl.checked_piece_cuts(conn, pieces, piece_cuts)
    split = functools.partial(mgl.split_rows, pieces=pieces)
    kp, vp, t0p, wp, docp, connp, lastp = (split(x) for x in (k, v, t0, w, doc, conn, last))
    gp, betap = (mgl.split_head_major(x, pieces) for x in (gc, beta_hm))
    eye = jnp.eye(dk, dtype=jnp.float32)
    kernel = functools.partial(_maps_x_kernel, num_chunks=num_chunks // pieces,
                               group=heads // kv_heads, dk=dk, dv=dv, skip=cut is not None,
                               interpret=interpret)
    dtype = v.dtype
    vec = plgpu.SMEM((STAGES, CHUNK), jnp.float32)
    swz = mgl.swizzled_smem
    # SMEM at K = V = 128, bf16: the ring 2 x (16 + 16 + 8 + 8) KB + 7 vectors (1 KB each,
    # aligned); per chain a 16-bit state (16), the decayed v_new (8), the fp32 staging (32):
    # 96 + 7 + 2 x 56 = 215 KB; Mosaic GPU's count, barriers included, is 220,208 bytes of the
    # 232,448 (offline_ptxas.py, MOSAIC_GPU.md Sec. 57).
    scratch = [
        swz((STAGES, CHUNK, dk), k.dtype),  # k_s
        swz((STAGES, CHUNK, dk), w.dtype),  # w_s
        swz((STAGES, CHUNK, BLOCK_V), dtype),  # v_s
        swz((STAGES, CHUNK, CHUNK), t0.dtype),  # t0_s
        vec, vec, vec, vec, vec, vec, vec,  # g rows, g cols, beta cols, doc rows, doc cols,
        # last, conn
        swz((dk, BLOCK_V), dtype),  # sbm_s: M in 16 bits, the operand of W M
        swz((CHUNK, BLOCK_V), dtype),  # vdm_s: the maps chain's decayed -W M
        swz((dk, BLOCK_V), jnp.float32),  # stm_s: staging of the identity, M_p
        swz((dk, BLOCK_V), dtype),  # sbx_s: X in 16 bits, the operand of W X
        swz((CHUNK, BLOCK_V), dtype),  # vdx_s: the local chain's decayed v_new
        swz((dk, BLOCK_V), jnp.float32),  # stx_s: staging of X_p
        plgpu.Barrier(num_arrivals=_IN_COPIES, num_barriers=STAGES),  # in_bar
        plgpu.Barrier(num_arrivals=2, num_barriers=STAGES),  # in_free: both chains released
        plgpu.Barrier(num_arrivals=1),  # io_bar: the identity's columns landed
        plgpu.Barrier(num_arrivals=3),  # done: all warpgroups finished
    ]
    if interpret:  # SMEM copies of what the GPU reads as a transposed view or registers
        scratch += [plgpu.SMEM((dk, CHUNK), k.dtype),  # ktm_s: k^T (maps chain)
                    plgpu.SMEM((dk, CHUNK), k.dtype),  # ktx_s: k^T (local chain)
                    swz((CHUNK, CHUNK), dtype),  # hi_s: Ag's 16-bit high term
                    swz((CHUNK, CHUNK), dtype)]  # lo_s: its low term
    call = plgpu.kernel(
        kernel,
        out_type=(jax.ShapeDtypeStruct((rows, heads, dk, dk), jnp.float32),
                  jax.ShapeDtypeStruct((rows, heads, dk, dv), jnp.float32)),
        scratch_types=scratch,
        grid=(rows, heads, max(dk, dv) // BLOCK_V),
        grid_names=("b", "h", "v"),
        num_threads=3,
        thread_name="wg",
        compiler_params=mgl.compiler_params(),
        interpret=mgl.interpret_params() if interpret else None,
        kernel_name=KERNEL_NAME + ("" if cut is None else "_skip"),
    )
    with jax.named_scope("gdn_chunk_delta_piece_maps_x_mosaic"):
        maps, x_local = call(kp, wp, vp, t0p, gp, betap, docp, lastp, connp, eye,
                             *(() if cut is None else (cut,)))
    return (maps.reshape(batch, pieces, heads, dk, dk),
            x_local.reshape(batch, pieces, heads, dk, dv))
