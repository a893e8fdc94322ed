"""Gated DeltaNet / DeltaNet on Pallas Mosaic GPU kernels (Hopper): forward, reverse state pass.

The public op runs these kernels for ``implementation="mosaic_gpu"`` through
:mod:`pallas_kernels.gated_delta_rule.mosaic_vjp` (and for ``"auto"`` on Hopper since 2026-12-06f;
DeltaNet's ``"auto"`` keeps the Triton kernels of ``kernel_gpu.py`` while ``mosaic_gpu.AUTO_OFF``
names it). The forward, :func:`gated_delta_rule_fwd_mosaic`, is the chunk form of
:func:`pallas_kernels.gated_delta_rule.chunked.gated_delta_rule_chunked` (paper "Linear Attention
Architectures", arXiv 2607.07953, Sec. 3.2, Eqs. 14-17; FLA's ``chunk_gated_delta_rule``,
``fla/ops/gated_delta_rule/chunk.py``) in three stages:

1. **WY preparation** (:func:`chunk_wy_mosaic`, FLA's ``chunk_scaled_dot_kkt_fwd`` +
   ``solve_tril`` + ``recompute_w_u_fwd``), a Mosaic GPU kernel: per chunk of 64 tokens and
   value head, with ``G`` the chunk-local inclusive cumsum of the log-decay (fp32),
   ``T = (I + strict_tril(diag(beta) (K K^T) * Gamma))^{-1}`` (masked to same-document pairs),
   ``W = T diag(beta conn e^G) K`` and ``U = T diag(beta) V``, in the input dtype (they are
   ``wgmma`` operands and TMA inputs of the state pass). ``K K^T``, the inverse (doubling
   merges of its diagonal blocks, fp16 operands) and the two products (the fp32 left factor
   split into ``hi + lo``) run on the tensor cores; see its docstring. With
   ``wy_implementation="xla"`` the forward uses the fp32 XLA form
   :func:`pallas_kernels.gated_delta_rule.chunked.wy_representation` instead, rounded once.
2. **The delta state pass** (:func:`chunk_delta_h_mosaic`, FLA's ``chunk_gated_delta_rule_fwd_h``),
   a Mosaic GPU kernel: per batch row, value head and 64 value columns, sequentially over
   chunks ``c`` with entry state ``S_c`` (``[K, V]`` fp32)::

       v_new_c = U_c - W_c S_c                                            ([64, V], fp32)
       S_{c+1} = keep_c e^{G_L} S_c + K_c^T (last_c * e^{G_L - G} * v_new_c)

   ``keep_c`` is 0 when a document starts inside the chunk and ``last_c`` is 1 on the tokens of
   the chunk's last document, exactly as in the scalar-decay state pass
   (:func:`pallas_kernels.simple_gla.kernel_mosaic_gpu.chunk_states_mosaic`); the rows of ``W``
   of tokens that do not see ``S_c`` are already zero (``conn`` in ``W``, and ``T`` is masked
   to same-document pairs), so ``v_new = U`` there.
3. **The output** (:func:`pallas_kernels.simple_gla.kernel_mosaic_gpu.chunk_output_mosaic`,
   FLA's ``chunk_fwd_o``) with ``v_new`` in place of ``v``::

       o_t = scale ( conn_t e^{G_t} S_c^T q_t
                     + sum_{s <= t in chunk c, doc(s) = doc(t)} (q_t . k_s) e^{G_t - G_s} v_new_s )

   which is the GDN read-out of the chunk form (``O = scale [diag(e_in) Q S_0 + (Q K^T * D) Vn]``
   in ``kernel_gpu.py``'s notation): the same gates, the same causal same-document mask, the
   same ``conn`` factor; only ``v`` becomes ``v_new``. So the simple-GLA kernel is reused as is.

With ``forward="fused"`` (or ``"fused_split"``), stages 2 and 3 run as one kernel,
:func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu_fused.chunk_delta_fused_fwd_mosaic`
(one CTA per ``(b, h, 64 value columns)`` walking the chunks; the state entering a chunk feeds
both ``W S`` and the read-out ``Q S`` from registers, so ``h`` never reaches HBM and ``v_new``
only as the residual). Same equations and roundings; see that module. With
``forward="fused_t0"`` the preparation is split as jla splits it: :func:`chunk_kkt_inverse_mosaic`
forms only the gate-free inverse ``T0 = (I + A0)^{-1}`` (``A0_ij = beta_i k_i . k_j``), and
:func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu_fused.chunk_delta_fused_t0_fwd_mosaic`
forms ``v_new = (T0 * e^{G_i - G_j} * beta_j) (V - diag(conn e^G) K S)`` itself (that module's
docstring derives it).

Kernel structure of the state pass (as the scalar-decay one, see
``pallas_kernels/common/MOSAIC_GPU.md``): one CTA per ``(b, h, 64 value columns)``, two
warpgroups. The memory warpgroup streams each chunk's ``k`` (key head ``h // group``), ``w``,
``u`` (value head ``h``) and the gate, ``last`` and ``conn`` vectors into a two-stage SMEM ring
with TMA copies. The state warpgroup keeps ``S`` (``[K, 64]`` fp32) in registers; per chunk it
stores ``S`` (the state entering the chunk) to HBM through a 16-bit SMEM tile that is also the
right operand of ``wgmma(W, S)``, forms ``v_new = U - W S`` in fp32, stores ``v_new`` (input
dtype) through another SMEM tile, writes ``last e^{G_L - G} v_new`` to a swizzled 16-bit tile
and adds ``wgmma(K^T, that)`` to ``keep e^{G_L} S``.

Sequence pieces (rows with few CTAs, e.g. B 1, H 16, V 128: 32 CTAs for 132 SMs): the delta
state map of a run of chunks is affine in ``S`` with a ``[K, K]`` matrix (per chunk
``keep e^{G_L} I - (diag(last e^{G_L - G}) K)^T W``), not a scalar as in the scalar-decay pass,
so each row is cut into ``P`` pieces run as rows, and the pieces' maps ``M_p`` come from the
same kernel on ``K`` columns from the identity with ``U = 0`` (the Triton kernels' ``segments``
and jla's ``[I | 0]`` augmented pass do the same); :func:`chunk_delta_h_mosaic`'s docstring and
MOSAIC_GPU.md Sec. 29 give the launches. The reverse pass uses ``M_p^T``.

Backward: :func:`chunk_delta_dh_mosaic` is the reverse delta state pass (FLA's
``chunk_gated_delta_rule_bwd_dhu``, ``kernel_gpu.py``'s ``_backward_state``): the gradients of
the states leaving every chunk, the total ``v_new`` gradient and ``dh0``, same kernel structure
in reverse chunk order; with ``fold_dv_local`` a third warpgroup forms the chunk-local
``dv_local`` in the pass itself (MOSAIC_GPU.md Sec. 32), and with ``w_from_t0`` also ``W`` from
the gate-free inverse ``T0`` (Sec. 51). The parameter gradients and the
``custom_vjp`` are in :mod:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu_bwd`,
:mod:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu_wy_bwd` and
:mod:`pallas_kernels.gated_delta_rule.mosaic_vjp`.

CPU testing as in the scalar-decay module: interpret mode (``k^T`` copied into SMEM, plain
vector loads) and lowering for CUDA; see that module's docstring.
"""

import functools
from typing import Optional, Tuple, Union

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.common import mosaic_gpu_inverse as mgi
from pallas_kernels.common import mosaic_gpu_lib as mgl
from pallas_kernels.common import validation
from pallas_kernels.gated_delta_rule import chunked
from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu_bwd as kbwd
from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu_fused as kfused
from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu_rs as krs
from pallas_kernels.simple_gla import kernel_mosaic_gpu as sg

CHUNK = mgl.CHUNK
BLOCK_V = mgl.BLOCK_V  # value columns per CTA: the state tile is [K, BLOCK_V] fp32 in registers
STAGES = mgl.STAGES  # depth of the TMA input ring


def _delta_state_kernel(k_ref, w_ref, u_ref, g_ref, last_ref, conn_ref, *rest, num_chunks: int,
                        group: int, has_h0: bool, share_operand: bool, pieces: int, store: bool,
                        zero_u: bool, interpret: bool, skip: bool = False):
    """Kernel body of :func:`chunk_delta_h_mosaic`; refs are GMEM.

    ``rest`` = ``[h0_ref,] [cut_ref,] [h_ref, vn_ref,] ht_ref`` then the scratch (``h``,
    ``v_new`` only
    with ``store``). With ``share_operand`` (``h`` stored in the input dtype) the staging tile
    of ``h`` is also the ``wgmma`` operand ``S`` of ``W S``; otherwise ``S`` gets its own 16-bit
    tile. With ``pieces = P > 1`` the inputs are ``P`` pieces of ``num_chunks`` chunks per row
    as ``B * P`` rows (grid axis ``b`` is ``row * P + piece``): ``h0``, ``ht`` and ``v_new``
    are per piece, ``h`` is written at the row's global chunk index. ``zero_u``: ``U`` is
    taken as zero and ``u_ref`` is not read (the piece maps of :func:`_piece_maps`).
    ``skip`` (with ``zero_u``, MOSAIC_GPU.md Sec. 52): ``cut_ref`` int32 ``[B * P]``
    (:func:`pallas_kernels.common.mosaic_gpu_lib.piece_cuts`); a row with ``cut >= 0`` (a
    document starts inside the piece, so its map is exactly zero) loads nothing, runs no chunk
    and stores zeros.
    """
    rest = list(rest)
    h0_ref = rest.pop(0) if has_h0 else None
    cut_ref = rest.pop(0) if skip else None
    h_ref, vn_ref = (rest.pop(0), rest.pop(0)) if store else (None, None)
    (ht_ref, k_s, w_s, u_s, g_s, last_s, conn_s, vd_s, vn_s, state_s, hst_s,
     in_bar, in_free, io_bar, done, *extra) = rest
    sb_s = hst_s if share_operand else extra.pop(0)  # S in 16 bits, the right operand of W S
    kt_s = extra.pop(0) if interpret else None
    b, h, iv = lax.axis_index("b"), lax.axis_index("h"), lax.axis_index("v")
    b_out, n_base = lax.div(b, pieces), lax.rem(b, pieces) * num_chunks  # h's row, 1st chunk
    hk = lax.div(h, group)  # GVA: value head h reads key head h // group
    cols = pl.ds(iv * BLOCK_V, BLOCK_V)
    wg = lax.axis_index("wg")
    dk = k_s.shape[-1]
    run_chain = None if cut_ref is None else cut_ref[b] < 0  # skip: no document start inside

    @pl.when(wg == 1)
    def _memory():
        plgpu.set_max_registers(40, action="decrease")

        def issue(n, slot):
            rows = pl.ds(n * CHUNK, CHUNK)
            bar = in_bar.at[slot]
            plgpu.copy_gmem_to_smem(k_ref.at[b, rows, hk], k_s.at[slot], bar)
            plgpu.copy_gmem_to_smem(w_ref.at[b, rows, h], w_s.at[slot], bar)
            if not zero_u:
                plgpu.copy_gmem_to_smem(u_ref.at[b, rows, h, cols], u_s.at[slot], bar)
            plgpu.copy_gmem_to_smem(g_ref.at[b, h, rows], g_s.at[slot], bar)
            plgpu.copy_gmem_to_smem(last_ref.at[b, rows], last_s.at[slot], bar)
            plgpu.copy_gmem_to_smem(conn_ref.at[b, rows], conn_s.at[slot], bar)

        if run_chain is None:
            mgl.ring_producer(issue, num_chunks, in_free)
        else:
            pl.when(run_chain)(lambda: mgl.ring_producer(issue, num_chunks, in_free))

    @pl.when(wg == 0)
    def _state():
        plgpu.set_max_registers(232, action="increase")
        h0 = h0_ref.at[b, h, :, cols] if has_h0 else None
        s0 = mgl.entry_state(h0, state_s, io_bar, (dk, BLOCK_V), interpret)

        def step(n, s):
            slot = lax.rem(n, STAGES)
            rows = pl.ds(n * CHUNK, CHUNK)
            # The stores of chunk n - 1 (h, v_new) must have read their tiles; the wgmma of
            # chunk n - 1 that read sb_s finished when its accumulator was read.
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)
            if store or share_operand:  # the staging tile of h (and, 16-bit, the W S operand)
                hst_s[...] = s.astype(hst_s.dtype)
            if not share_operand:
                sb_s[...] = s.astype(sb_s.dtype)
            plgpu.commit_smem()
            if store:  # the state entering chunk n goes to HBM while the chunk's inputs land
                plgpu.copy_smem_to_gmem(hst_s, h_ref.at[b_out, h, n_base + n, :, cols])
            plgpu.barrier_wait(in_bar.at[slot])

            def w_state(acc):
                plgpu.wgmma(acc, w_s.at[slot], sb_s)  # W S, [C, 64], fp32 accumulation
                return acc[...]

            # The barrier keeps the subtraction after the accumulator read (jla's pitfall).
            ws = lax.optimization_barrier(pl.run_scoped(w_state, plgpu.ACC((CHUNK, BLOCK_V))))
            if zero_u:
                vn = -ws
            else:
                vn = mgl.load_tile(u_s.at[slot], interpret).astype(jnp.float32) - ws  # fp32
            g = mgl.load_rows(g_s.at[slot], interpret)  # chunk-local cumsum of log-decay, fp32
            g_last = g_s[slot, CHUNK - 1]
            # exp(G_L - G_i) <= 1 (g <= 0); tokens before the chunk's last document start do not
            # reach the next chunk (last = 0).
            k_decay = jnp.exp(g_last - g) * mgl.load_rows(last_s.at[slot], interpret)
            s_decay = jnp.exp(g_last) * conn_s[slot, CHUNK - 1]  # 0 if a document starts inside
            if store:
                vn_s[...] = vn.astype(vn_s.dtype)
            vd_s[...] = (vn * mgl.by_row(k_decay, vn.shape)).astype(vd_s.dtype)
            plgpu.commit_smem()
            if store:
                plgpu.copy_smem_to_gmem(vn_s, vn_ref.at[b, rows, h, cols])

            k_t = mgl.transposed(k_s.at[slot], kt_s, interpret)  # k^T (a copy if interpreting)

            def update(acc):
                plgpu.wgmma(acc, k_t, vd_s)  # K^T (decayed v_new), fp32 accumulation
                return acc[...]

            # A fresh accumulator plus the decayed state (no run_state in the 0.10.2
            # interpreter); the barrier keeps the add after the accumulator read.
            kv = lax.optimization_barrier(pl.run_scoped(update, plgpu.ACC((dk, BLOCK_V))))
            plgpu.barrier_arrive(in_free.at[slot])
            return s * s_decay + kv

        if run_chain is None:
            s = lax.fori_loop(0, num_chunks, step, s0)
        else:  # no chunk where a document starts inside the piece; its map is then zero
            s = lax.fori_loop(0, jnp.where(run_chain, num_chunks, 0), step, s0)
            s = s * run_chain.astype(jnp.float32)
        mgl.store_state(s, state_s, ht_ref.at[b, h, :, cols])

    # Both warpgroups leave together (an early exit while another issues wgmma is unsafe).
    plgpu.barrier_arrive(done)
    plgpu.barrier_wait(done)


def _check_delta_inputs(k, w, u, g, segment_ids) -> None:
    """``k [B, T, Hk, K]``, ``w [B, T, H, K]``, ``u [B, T, H, V]`` (``H % Hk == 0``), one 16-bit
    dtype, K and V in {64, 128}, ``g [B, T, H]``, ``segment_ids [B, T]``.

    Raises:
        ValueError: naming the argument and the shape or dtype it needs.
    """
    batch, seq_len, kv_heads, dk = k.shape
    heads = u.shape[2]
    if w.shape != (batch, seq_len, heads, dk) or w.dtype != k.dtype:
        raise ValueError(f"w must be [B, T, H, K] = {(batch, seq_len, heads, dk)} in k's dtype "
                         f"{k.dtype}, got {w.shape=} {w.dtype=}")
    mgl.check_kv_gates(k, u, g, segment_ids, names=("k", "u"))


@functools.partial(jax.jit,
                   static_argnames=("states_dtype", "pieces", "return_maps", "interpret"))
def chunk_delta_h_mosaic(
    k: jax.Array,
    w: jax.Array,
    u: jax.Array,
    g: Optional[jax.Array],
    *,
    initial_state: Optional[jax.Array] = None,
    segment_ids: Optional[jax.Array] = None,
    gate_cumsum: Optional[jax.Array] = None,
    doc_vecs: Optional[Tuple[jax.Array, jax.Array, jax.Array]] = None,
    states_dtype=jnp.float32,
    pieces: Optional[int] = None,
    return_maps: bool = False,
    interpret: bool = False,
) -> Tuple[jax.Array, ...]:
    """The delta-rule state pass: states entering every chunk, ``v_new`` and the final state.

    The counterpart of FLA's ``chunk_gated_delta_rule_fwd_h`` (``fla/ops/common/chunk_delta_h.py``)
    as a Mosaic GPU kernel (module docstring). Per batch row, value head and chunk ``c`` of 64
    tokens, with ``G`` the chunk-local inclusive cumulative log-decay (fp32) and ``G_L`` its last
    entry::

        v_new_c = U_c - W_c S_c
        S_{c+1} = keep_c e^{G_L} S_c + K_c^T (last_c * e^{G_L - G} * v_new_c)     (fp32)

    from ``S_0 = initial_state``; ``keep_c`` (0 when a document starts inside chunk ``c``) and
    ``last_c`` (1 on the tokens of its last document) come from ``segment_ids``, as in
    :func:`pallas_kernels.simple_gla.kernel_mosaic_gpu.chunk_states_mosaic`. This is the chunk
    form of the token recurrence ``u_t = beta_t (v_t - e^{g_t} S_{t-1}^T k_t)``,
    ``S_t = e^{g_t} S_{t-1} + k_t u_t^T`` of
    :func:`pallas_kernels.gated_delta_rule.reference.gated_delta_rule_reference` when ``w, u``
    are :func:`pallas_kernels.gated_delta_rule.chunked.wy_representation`'s ``W, U`` (then
    ``v_new`` is the per-token residual ``u_t``).

    Args:
        k: keys ``[B, T, Hk, K]``, bf16 or fp16; ``H % Hk == 0`` (value head ``h`` reads key
            head ``h // (H // Hk)``).
        w: ``W = T diag(beta conn e^G) K`` ``[B, T, H, K]`` per value head, k's dtype.
        u: ``U = T diag(beta) V`` ``[B, T, H, V]``, k's dtype. ``K, V`` in {64, 128}.
        g: per-token log-decay ``[B, T, H]`` (natural log, ``<= 0``), or ``None`` (DeltaNet).
        initial_state: ``[B, H, K, V]`` state before the first token (read as fp32), or
            ``None`` for zeros; it applies to the first document of each row only.
        segment_ids: optional int ``[B, T]``; the state resets to zero wherever the id changes.
        states_dtype: dtype of the stored ``h`` (static): fp32 (default) or the input dtype
            (when ``h`` only feeds ``wgmma`` operands, as in
            :func:`gated_delta_rule_fwd_mosaic`). The carried state is fp32 in registers
            either way; the ``W S`` product reads it rounded to the input dtype.
        doc_vecs: optional ``(doc, conn, last)``, fp32 ``[B, Tp]`` each, as
            :func:`pallas_kernels.common.mosaic_gpu_lib.doc_vectors` gives them for
            ``segment_ids``, formed once by a caller that runs several kernels (``mosaic_vjp``);
            ``None``: formed here.
        gate_cumsum: optional fp32 ``[B, H, Tp]`` (``Tp = 64 ceil(T / 64)``), ``g``'s
            chunk-local cumsum as :func:`pallas_kernels.common.mosaic_gpu_lib.chunk_cumsum`
            gives it, computed once by a caller that runs several kernels on one ``g``
            (``mosaic_vjp``); ``None``: computed here.
        pieces: static; the sequence pieces ``P`` each row is cut into (``None``: chosen by
            :func:`pallas_kernels.common.mosaic_gpu_lib.num_pieces`, 1 unless
            ``B * H * V / 64`` CTAs would leave the GPU idle: ``P = 4`` at B 1, H 16, V 128,
            T 32K). It must divide ``ceil(T / 64)``. With ``P > 1`` the pass is exact in three
            launches, each over ``B * P`` rows of ``N / P`` chunks (the state map of a piece is
            affine with a ``[K, K]`` matrix, ``S -> M_p S + X_p``): one from the identity with
            ``U = 0`` on ``K`` columns gives every ``M_p`` (:func:`_piece_maps`), one from
            zero gives every ``X_p``, both storing nothing else; an XLA loop over the pieces
            (fp32 ``[K, K] x [K, V]`` products) gives their entry states; the third launch
            stores ``h`` (at global chunk indices, no copy) and ``v_new``. Each CTA's serial
            chain is ``N / P`` chunks instead of ``N``, for three launches instead of one
            (MOSAIC_GPU.md Sec. 29).
        return_maps: static; also return the piece maps ``M`` ``[B, P, H, K, K]`` fp32
            (``None`` when ``P = 1``), which :func:`chunk_delta_dh_mosaic` reuses.
        interpret: run the kernel in Mosaic GPU interpret mode (CPU; slow, for tests).

    Returns:
        ``(h, v_new, final_state)``, plus ``maps`` with ``return_maps``: ``h``
        ``[B, H, N, K, V]`` in ``states_dtype``
        (``N = ceil(T / 64)``; head-major like ``chunk_states_mosaic``'s, the layout
        ``chunk_output_mosaic`` reads; FLA's is ``[B, N, H, K, V]``), the state entering chunk
        ``n``; ``v_new`` ``[B, T, H, V]`` in the input dtype; ``final_state`` ``[B, H, K, V]``
        fp32, the state after token ``T - 1``. Exact up to the 16-bit rounding of the ``wgmma``
        operands (``W``, ``U``, ``S`` in ``W S``, ``last e^{G_L - G} v_new``) with fp32
        accumulation.

    Raises:
        ValueError: on mismatched shapes, unsupported head dims or dtypes, ``H`` not a multiple
            of ``Hk``, a bad ``initial_state`` shape or ``states_dtype``, or ``pieces`` not a
            positive divisor of ``ceil(T / 64)``.
    """
    batch, seq_len, kv_heads, dk = k.shape
    heads, dv = u.shape[2], u.shape[3]
    _check_delta_inputs(k, w, u, g, segment_ids)
    states_dtype = mgl.check_states_dtype(states_dtype, k.dtype)
    if initial_state is not None and initial_state.shape != (batch, heads, dk, dv):
        raise ValueError(f"initial_state must be [B, H, K, V] = {(batch, heads, dk, dv)}, got "
                         f"{initial_state.shape=}")

    num_chunks = -(-seq_len // CHUNK)
    pieces = mgl.num_pieces(pieces, batch * heads * (dv // BLOCK_V), num_chunks)
    # Padding tokens have k = w = u = 0 and g = 0: v_new = 0 there, the state is unchanged.
    k, w, u = (mgl.pad_time(x, num_chunks) for x in (k, w, u))
    gc = mgl.chunk_cumsum(g, (batch, seq_len, heads), num_chunks, gate_cumsum)  # [B, H, Tp]
    _, conn, last = mgl.doc_vectors(segment_ids, batch, num_chunks, doc_vecs)  # [B, Tp] each
    h0 = None if initial_state is None else initial_state.astype(jnp.float32)
    run = functools.partial(_delta_h_call, group=heads // kv_heads, pieces=pieces,
                            states_dtype=states_dtype, interpret=interpret)
    with jax.named_scope("gdn_chunk_delta_h_mosaic"):
        if pieces == 1:
            h, vn, final_state = run(k, w, u, gc, last, conn, h0)
            maps = None
        else:
            # Sequence pieces (rows with few CTAs): each piece's affine map S -> M_p S + X_p
            # from two launches that store nothing else, the entry states by a loop over the
            # pieces, then the pieces as rows from their entry states. conn of a piece's first
            # chunk gates its entry state like any chunk's (formed on whole rows).
            kp, wp, up, lastp, connp = (mgl.split_rows(x, pieces) for x in (k, w, u, last, conn))
            gp = mgl.split_head_major(gc, pieces)
            maps = _piece_maps(kp, wp, gp, lastp, connp, run, pieces)  # [B, P, H, K, K]
            (x_local,) = run(kp, wp, up, gp, lastp, connp, None, store=False)
            entries = mgl.scan_piece_maps(maps, x_local.reshape(batch, pieces, heads, dk, dv),
                                          h0, reverse=False)
            h, vn, finals = run(kp, wp, up, gp, lastp, connp,
                                entries.reshape(batch * pieces, heads, dk, dv))
            vn = vn.reshape(batch, num_chunks * CHUNK, heads, dv)
            final_state = finals.reshape(batch, pieces, heads, dk, dv)[:, -1]
    out = (h, vn[:, :seq_len], final_state)
    return out + (maps,) if return_maps else out


def _delta_h_call(k, w, u, gc, last, conn, h0, *, group, pieces, states_dtype, interpret,
                  store=True, zero_u=False, cut=None):
    """One launch of the delta state pass over ``[B * P]`` rows (pieces as rows; see
    :func:`_delta_state_kernel`). Returns ``(h, v_new, ht)`` (``h`` ``[B, H, P * Nq, K, V]``
    in ``states_dtype``, ``v_new`` ``[B * P, Tq, H, V]`` in the input dtype, ``ht``
    ``[B * P, H, K, V]`` fp32), or ``(ht,)`` without ``store``. With ``zero_u`` ``u`` is a
    placeholder of the value width (not read); ``cut`` (int32 ``[B * P]``, only with
    ``zero_u``): skip the rows whose map a document start zeroes (``_skip`` kernel, Sec. 52)."""
    rows, tq, _, dk = k.shape
    heads, dv = u.shape[2], u.shape[3]
    num_chunks = tq // CHUNK
    has_h0 = h0 is not None
    share = states_dtype == jnp.dtype(k.dtype)
    kernel = functools.partial(_delta_state_kernel, num_chunks=num_chunks, group=group,
                               has_h0=has_h0, share_operand=share, pieces=pieces, store=store,
                               zero_u=zero_u, interpret=interpret,
                               **({} if cut is None else {"skip": True}))
    vec = plgpu.SMEM((STAGES, CHUNK), jnp.float32)
    swz = mgl.swizzled_smem
    out_type = _state_pass_out_type(rows, tq, heads, dk, dv, pieces, states_dtype, u.dtype,
                                    store)
    copies = 5 if zero_u else 6
    call = plgpu.kernel(
        kernel,
        out_type=out_type,
        scratch_types=[
            swz((STAGES, CHUNK, dk), k.dtype),  # k_s
            swz((STAGES, CHUNK, dk), w.dtype),  # w_s
            swz((STAGES, CHUNK, BLOCK_V), u.dtype),  # u_s (unused with zero_u)
            vec, vec, vec,  # g_s, last_s, conn_s
            swz((CHUNK, BLOCK_V), u.dtype),  # vd_s: last e^{G_L - G} v_new, the wgmma operand
            swz((CHUNK, BLOCK_V), u.dtype),  # vn_s: staging of v_new
            swz((dk, BLOCK_V), jnp.float32),  # state_s: staging of h0, final state
            swz((dk, BLOCK_V), states_dtype),  # hst_s: staging of h (and S of W S if 16-bit)
            plgpu.Barrier(num_arrivals=copies, num_barriers=STAGES),  # in_bar: a stage landed
            plgpu.Barrier(num_arrivals=1, num_barriers=STAGES),  # in_free: a stage may be refilled
            plgpu.Barrier(num_arrivals=1),  # io_bar: h0 landed
            plgpu.Barrier(num_arrivals=2),  # done: both warpgroups finished
        ] + ([] if share else [swz((dk, BLOCK_V), k.dtype)])  # sb_s: S, operand of W S
        + ([plgpu.SMEM((dk, CHUNK), k.dtype)] if interpret else []),  # kt_s: k^T, interpret
        grid=(rows, heads, dv // BLOCK_V),
        grid_names=("b", "h", "v"),
        num_threads=2,
        thread_name="wg",
        compiler_params=mgl.compiler_params(),
        interpret=mgl.interpret_params() if interpret else None,
        kernel_name="gdn_chunk_delta_h" + ("" if store else "_maps" if zero_u else "_pieces")
        + ("" if cut is None else "_skip"),
    )
    return call(k, w, u, gc, last, conn, *(() if h0 is None else (h0,)),
                *(() if cut is None else (cut,)))


def _state_pass_out_type(rows, tq, heads, dk, dv, pieces, states_dtype, value_dtype, store):
    """The outputs of one launch of either delta state pass over ``rows = B * P`` rows of
    ``tq`` tokens: the per-chunk states ``[B, H, P * Nq, K, V]`` (``states_dtype``, global chunk
    indices), the per-token values ``[B * P, tq, H, V]`` (``value_dtype``) and the fp32 per-row
    state ``[B * P, H, K, V]``; only the last without ``store``."""
    last = jax.ShapeDtypeStruct((rows, heads, dk, dv), jnp.float32)
    if not store:
        return (last,)
    return (jax.ShapeDtypeStruct((rows // pieces, heads, pieces * (tq // CHUNK), dk, dv),
                                 states_dtype),
            jax.ShapeDtypeStruct((rows, tq, heads, dv), value_dtype), last)


def _piece_maps(kp, wp, gp, lastp, connp, run, pieces, cut=None):
    """The ``[K, K]`` state maps ``M_p`` of the pieces, ``[B, P, H, K, K]`` fp32: the delta
    state pass on ``K`` columns from the identity with ``U = 0`` (``S -> keep e^{G_L} S
    - K^T diag(last e^{G_L - G}) W S`` per chunk), run on the pieces as rows (``kp``, ``wp``,
    ``gp``, ``lastp``, ``connp`` split as :func:`chunk_delta_h_mosaic` splits them), storing
    only each piece's final state. ``run`` is :func:`_delta_h_call` with the static options
    bound. Documents: a reset inside a piece zeroes ``M_p`` (``keep``, ``conn`` in ``W``);
    ``cut`` (int32 ``[B * P]``, :func:`pallas_kernels.common.mosaic_gpu_lib.piece_cuts`, or
    ``None``): such pieces skip their chain and write the zeros directly (Sec. 52)."""
    rows, _, heads, dk = wp.shape
    eye = jnp.broadcast_to(jnp.eye(dk, dtype=jnp.float32), (rows, heads, dk, dk))
    (maps,) = run(kp, wp, wp, gp, lastp, connp, eye, store=False, zero_u=True,
                  **({} if cut is None else {"cut": cut}))
    return maps.reshape(rows // pieces, pieces, heads, dk, dk)


@functools.partial(jax.jit, static_argnames=("pieces", "interpret", "piece_skip"))
def chunk_delta_piece_maps_mosaic(
    k: jax.Array,
    w: jax.Array,
    g: Optional[jax.Array],
    *,
    pieces: int,
    segment_ids: Optional[jax.Array] = None,
    gate_cumsum: Optional[jax.Array] = None,
    doc_vecs: Optional[Tuple[jax.Array, jax.Array, jax.Array]] = None,
    interpret: bool = False,
    piece_skip: bool = False,
    piece_cuts: Optional[jax.Array] = None,
) -> jax.Array:
    """The state maps ``M_p`` of ``pieces`` sequence pieces per row, ``[B, P, H, K, K]`` fp32.

    Piece ``p`` (chunks ``p N / P`` to ``(p + 1) N / P - 1``) maps its entry state to its exit
    state as ``S -> M_p S + X_p``; ``M_p`` is the product over its chunks of ``A_c = keep_c
    e^{G_L} I - K_c^T diag(last_c e^{G_L - G}) W_c`` (MOSAIC_GPU.md Sec. 29). One launch of the
    delta state pass (``gdn_chunk_delta_h_maps``) on ``K`` columns from the identity with
    ``U = 0``, storing only each piece's final state: what :func:`chunk_delta_h_mosaic` forms
    for its own pieces, for a forward that has ``W`` but runs another state pass (the fused
    ``T0`` forward with pieces, MOSAIC_GPU.md Sec. 42). A document starting inside a piece
    zeroes its ``M_p``.

    Args:
        k: keys ``[B, T, Hk, K]``, bf16 or fp16 (``H % Hk == 0``).
        w: ``W = T diag(beta conn e^G) K`` ``[B, T, H, K]`` in k's dtype (as
            :func:`chunk_wy_mosaic` or :func:`chunk_kkt_inverse_mosaic` with ``return_w``
            write it).
        g: per-token log-decay ``[B, T, H]`` (natural log, ``<= 0``) or ``None`` (DeltaNet).
        pieces: static; ``P``, a divisor of the chunk count ``ceil(T / 64)``.
        segment_ids, gate_cumsum, doc_vecs, interpret: as :func:`chunk_delta_h_mosaic`.
        piece_skip: static (MOSAIC_GPU.md Sec. 52); with documents (``segment_ids`` or
            ``doc_vecs``), a piece in which a document starts (``keep_c = 0`` for one of its
            chunks) writes its map, exactly zero, without running its chain or loading its
            inputs (kernel ``gdn_chunk_delta_h_maps_skip``). Without documents it changes
            nothing (the launch is the plain one).
        piece_cuts: optional int32 ``[B * P]``,
            :func:`pallas_kernels.common.mosaic_gpu_lib.piece_cuts` of the documents' ``conn``
            formed once by the caller (only read with ``piece_skip``); ``None``: formed here.

    Returns:
        ``[B, P, H, K, K]`` fp32.

    Raises:
        ValueError: as :func:`chunk_delta_h_mosaic` for ``k``, ``w`` (its ``u``), ``g`` and
            ``segment_ids``; ``pieces`` not a positive divisor of the chunk count.
    """
    batch, seq_len, kv_heads, _ = k.shape
    heads = w.shape[2]
    _check_delta_inputs(k, w, w, g, segment_ids)
    num_chunks = -(-seq_len // CHUNK)
    pieces = mgl.given_pieces(pieces, num_chunks)
    k, w = (mgl.pad_time(x, num_chunks) for x in (k, w))
    gc = mgl.chunk_cumsum(g, (batch, seq_len, heads), num_chunks, gate_cumsum)  # [B, H, Tp]
    _, conn, last = mgl.doc_vectors(segment_ids, batch, num_chunks, doc_vecs)  # [B, Tp] each
    kp, wp, lastp, connp = (mgl.split_rows(x, pieces) for x in (k, w, last, conn))
    run = functools.partial(_delta_h_call, group=heads // kv_heads, pieces=pieces,
                            states_dtype=k.dtype, interpret=interpret)
    cut = None
    if piece_skip and (segment_ids is not None or doc_vecs is not None):
        cut = mgl.checked_piece_cuts(conn, pieces, piece_cuts)
    with jax.named_scope("gdn_chunk_delta_piece_maps_mosaic"):
        return _piece_maps(kp, wp, mgl.split_head_major(gc, pieces), lastp, connp, run, pieces,
                           cut)


# ----------------------------------------------------------------------------------------------
# WY preparation: W and U of every chunk (K K^T, the unit-lower inverse, the two products).

MERGE_DTYPE = mgi.MERGE_DTYPE  # operand dtype of the inverse's merge products (chunk_wy_mosaic)
KKT_BLOCK = mgi.KKT_BLOCK
KKT_SOLVE_PAD = mgi.KKT_SOLVE_PAD
_kkt_smem = mgi.kkt_smem
_blk = mgi.kkt_blk
_cols = mgi.kkt_cols
_block_products = mgi.block_products
kkt_block_merge = mgi.kkt_block_merge
kkt_diag_solve = mgi.kkt_diag_solve
WY_IMPLEMENTATIONS = ("mosaic", "xla")
# How gated_delta_rule_fwd_mosaic runs the state pass and the output: two kernels
# (chunk_delta_h_mosaic, then chunk_output_mosaic reading h back) or one
# (kernel_mosaic_gpu_fused.chunk_delta_fused_fwd_mosaic; "fused_split" with the read-out on its
# own warpgroup, split_output=True); "fused_t0" prepares only the gate-free inverse T0
# (chunk_kkt_inverse_mosaic) and forms v_new from v and T0 inside the fused kernel
# (kernel_mosaic_gpu_fused.chunk_delta_fused_t0_fwd_mosaic); "fused_t0_split" is the same with
# three warpgroups (split_output=True: jla's layout, Ag = T0 * D * beta formed off the chain).
# "fused_rs" (mosaic_vjp.DEFAULT_FORWARD since 2026-12-08; MOSAIC_GPU.md Sec. 56, 63) is the
# primal-only forward from T0 with the transposed state in registers
# (kernel_mosaic_gpu_rs.chunk_delta_fused_rs_fwd_mosaic: jla's schedule); where a residual is asked
# for it runs "fused_t0" instead (RS_FALLBACK_REASON).
FORWARDS = ("three_pass", "fused", "fused_split", "fused_t0", "fused_t0_split", "fused_rs")
# Why forward="fused_rs" runs "fused_t0" (logged once per reason, pallas_kernels.common.
# validation.log_once): its kernel stores neither v_new nor h.
RS_FALLBACK_REASON = ("forward='fused_rs' stores no residuals (v_new, h): running "
                      "forward='fused_t0' for this call ({why})")


def rs_fallback(why: str) -> str:
    """Logs (once per reason) that ``forward="fused_rs"`` runs ``"fused_t0"`` because of
    ``why``, and returns ``"fused_t0"``."""
    validation.log_once("gated_delta_rule_mosaic", RS_FALLBACK_REASON.format(why=why))
    return "fused_t0"


def wy_inverse(a, l_s, x_s, y_s, interpret: bool):
    """``X = (I + A)^{-1}`` (fp32, ``[64, 64]``, WGMMA layout) of a strictly lower ``A`` (fp32).

    In-kernel helper of :func:`chunk_wy_mosaic` and of the WY backward
    (:mod:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu_wy_bwd`). By doubling: the 2 x 2
    diagonal blocks are exact (``I - A`` there), then blocks of ``s/2`` merge into blocks of
    ``s`` (``s = 4, ..., 64``): ``X <- X - (X A)|_s X``, where ``|_s`` keeps the lower-left
    quarter of each ``s``-block (for a block-diagonal ``X``, ``(X A)`` there is ``X_22 A_21``,
    so this is ``[[X_11, 0], [-X_22 A_21 X_11, X_22]]``). Ten ``wgmma``s with operands in
    :data:`MERGE_DTYPE`: ``l_s`` holds ``A`` (the right operand of every ``X A``), ``x_s`` the
    running ``X`` (left of ``X A``, right of ``Y X``); ``y_s`` is the interpret-mode copy of the
    register operand ``Y`` (``None`` on the GPU). Both tiles are swizzled ``[64, 64]``.
    """
    sq = (CHUNK, CHUNK)
    i, j = mgl.iota(sq, 0, interpret), mgl.iota(sq, 1, interpret)
    x = jnp.where(i == j, 1.0, 0.0) - jnp.where(lax.div(i, 2) == lax.div(j, 2), a, 0.0)
    l_s[...] = a.astype(l_s.dtype)
    for size in (4, 8, 16, 32, 64):
        half = size // 2
        x_s[...] = x.astype(x_s.dtype)
        plgpu.commit_smem()

        def left(acc):
            plgpu.wgmma(acc, x_s, l_s)  # X A, [C, C]
            return acc[...]

        xa = lax.optimization_barrier(pl.run_scoped(left, plgpu.ACC(sq)))
        quarter = ((lax.div(i, size) == lax.div(j, size)) & (lax.rem(i, size) >= half)
                   & (lax.rem(j, size) < half))
        y = jnp.where(quarter, xa, 0.0).astype(x_s.dtype)

        def right(acc, y=y):
            plgpu.wgmma(acc, mgl.lhs_operand(y, y_s, interpret), x_s)  # Y X, [C, C]
            return acc[...]

        x = x - lax.optimization_barrier(pl.run_scoped(right, plgpu.ACC(sq)))
    return x


def _wy_kernel(k_ref, v_ref, g_ref, beta_ref, doc_ref, conn_ref, w_ref, u_ref, k_s, v_s,
               g_row_s, g_col_s, b_row_s, b_col_s, doc_row_s, doc_col_s, conn_s, l_s, x_s,
               in_bar, *shim, group: int, interpret: bool):
    """Kernel body of :func:`chunk_wy_mosaic`: one chunk of one ``(b, h)`` per CTA.

    ``shim`` (interpret mode only): ``kt_s`` (``k^T``), ``y_s`` (the merge's left operand),
    ``hi_s``, ``lo_s`` (the final products' left operands), the SMEM copies of what the GPU
    reads as a transposed view or from registers.
    """
    n, h, b = lax.axis_index("n"), lax.axis_index("h"), lax.axis_index("b")
    hk = lax.div(h, group)  # GVA: value head h reads key head h // group
    rows = pl.ds(n * CHUNK, CHUNK)
    plgpu.copy_gmem_to_smem(k_ref.at[b, rows, hk], k_s, in_bar)
    plgpu.copy_gmem_to_smem(v_ref.at[b, rows, h], v_s, in_bar)
    # Row and column views of one vector need different register layouts: separate copies.
    plgpu.copy_gmem_to_smem(g_ref.at[b, h, rows], g_row_s, in_bar)
    plgpu.copy_gmem_to_smem(g_ref.at[b, h, rows], g_col_s, in_bar)
    plgpu.copy_gmem_to_smem(beta_ref.at[b, h, rows], b_row_s, in_bar)
    plgpu.copy_gmem_to_smem(beta_ref.at[b, h, rows], b_col_s, in_bar)
    plgpu.copy_gmem_to_smem(doc_ref.at[b, rows], doc_row_s, in_bar)
    plgpu.copy_gmem_to_smem(doc_ref.at[b, rows], doc_col_s, in_bar)
    plgpu.copy_gmem_to_smem(conn_ref.at[b, rows], conn_s, in_bar)
    plgpu.barrier_wait(in_bar)
    kt_s, y_s, hi_s, lo_s = shim if interpret else (None,) * 4
    sq = (CHUNK, CHUNK)
    dtype = k_s.dtype

    def gram(acc):
        plgpu.wgmma(acc, k_s, mgl.transposed(k_s, kt_s, interpret))  # K K^T, [C, C]
        return acc[...]

    # The barrier keeps the arithmetic after the accumulator read (jla's pitfall).
    kk = lax.optimization_barrier(pl.run_scoped(gram, plgpu.ACC(sq)))
    i, j = mgl.iota(sq, 0, interpret), mgl.iota(sq, 1, interpret)

    def by_col(x):
        return lax.broadcast_in_dim(x, sq, [1])

    g_i, g_j = mgl.load_rows(g_row_s, interpret), mgl.load_cols(g_col_s, interpret)
    b_i, b_j = mgl.load_rows(b_row_s, interpret), mgl.load_cols(b_col_s, interpret)
    d_i, d_j = mgl.load_rows(doc_row_s, interpret), mgl.load_cols(doc_col_s, interpret)
    # A_ij = beta_i (k_i . k_j) e^{G_i - G_j} on j < i in the same document, else 0; the
    # exponent is masked before exp, so e^{...} <= 1 and nothing overflows above the diagonal.
    strict = (j < i) & (mgl.by_row(d_i, sq) == by_col(d_j))
    decay = jnp.exp(jnp.where(strict, mgl.by_row(g_i, sq) - by_col(g_j), -jnp.inf))
    a = kk * mgl.by_row(b_i, sq) * decay
    x = wy_inverse(a, l_s, x_s, y_s, interpret)  # X = (I + A)^{-1} by doubling, fp16 merges

    def product(t, rhs_s, out_shape):
        """``t @ rhs`` with ``t`` (fp32 registers) split into two 16-bit terms hi + lo."""
        hi = t.astype(dtype)
        lo = (t - hi.astype(jnp.float32)).astype(dtype)

        def body(acc):
            plgpu.wgmma(acc, mgl.lhs_operand(hi, hi_s, interpret), rhs_s)
            plgpu.wgmma(acc, mgl.lhs_operand(lo, lo_s, interpret), rhs_s)
            return acc[...]

        return lax.optimization_barrier(pl.run_scoped(body, plgpu.ACC(out_shape)))

    # W = X diag(beta conn e^G) K and U = X diag(beta) V: the diagonal scalings go on X's
    # columns, so K and V are read exactly as loaded.
    w_scale = b_j * mgl.load_cols(conn_s, interpret) * jnp.exp(g_j)
    w = product(x * by_col(w_scale), k_s, k_s.shape)
    k_s[...] = w.astype(k_s.dtype)  # the W product has read k_s (its accumulator was read)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(k_s, w_ref.at[b, rows, h])
    u = product(x * by_col(b_j), v_s, v_s.shape)
    v_s[...] = u.astype(v_s.dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(v_s, u_ref.at[b, rows, h])
    plgpu.wait_smem_to_gmem(0)


@functools.partial(jax.jit, static_argnames=("interpret",))
def chunk_wy_mosaic(
    k: jax.Array,
    v: jax.Array,
    g: Optional[jax.Array],
    beta: jax.Array,
    *,
    segment_ids: Optional[jax.Array] = None,
    gate_cumsum: Optional[jax.Array] = None,
    doc_vecs: Optional[Tuple[jax.Array, jax.Array, jax.Array]] = None,
    interpret: bool = False,
) -> Tuple[jax.Array, jax.Array]:
    """The WY factors ``W`` and ``U`` of every chunk of 64 tokens, by a Mosaic GPU kernel.

    The counterpart of FLA's ``chunk_scaled_dot_kkt_fwd`` + ``solve_tril`` +
    ``recompute_w_u_fwd`` (``fla/ops/gated_delta_rule/wy_fast.py``) and of
    :func:`pallas_kernels.gated_delta_rule.chunked.wy_representation` (same equations, fp32 in
    XLA). Per batch row, value head and chunk, with ``G`` the chunk-local inclusive cumulative
    log-decay (fp32) and ``[.]`` the same-document mask (paper arXiv 2607.07953, Sec. 3.2,
    Eqs. 15-17; Yang et al. 2024, arXiv 2406.06484, Eqs. 10-11 for the UT transform)::

        A_ij = beta_i (k_i . k_j) e^{G_i - G_j} [j < i, doc(j) = doc(i)]
        X    = (I + A)^{-1}                                (unit lower-triangular, [64, 64])
        W    = X diag(beta conn e^G) K,    U = X diag(beta) V

    ``conn_t`` is 1 on the tokens of the document open before the chunk (the others do not see
    the entering state, so their rows of ``W`` are exactly zero). These are the ``w, u`` that
    :func:`chunk_delta_h_mosaic` takes.

    One CTA per ``(chunk, value head, batch row)``, one warpgroup, no ring (several CTAs share
    an SM: about 50 KB of SMEM at K = V = 128). Nine TMA copies on one barrier (``k`` of key head
    ``h // group``, ``v``, row and column copies of the gate, ``beta`` and document vectors,
    ``conn``). On the tensor cores (fp32 accumulation): ``K K^T`` (``k^T`` a transposed SMEM
    view); the inverse, by doubling from its exact 2 x 2 diagonal blocks, five merges
    ``X <- X - (X A)|_s X`` (two ``[64, 64]`` products each, operands rounded to fp16,
    :data:`MERGE_DTYPE`); then ``W`` and ``U`` as ``(X diag(.)) K`` and ``(X diag(.)) V`` with
    the fp32 left factor split into two 16-bit terms ``hi + lo`` (four products). In fp32
    registers: the masks and decays, ``A``, the running ``X`` and the scalings. ``W`` and ``U``
    overwrite the ``k`` and ``v`` tiles in SMEM and leave by TMA.

    Accuracy (a numpy model of the kernel's roundings against a float64 inverse, 64-token
    chunks of L2-normalised bf16 keys, ``pallas_kernels/common/MOSAIC_GPU.md`` Sec. 6): the
    doubling never forms powers of ``A``. The product form ``prod_m (I + (-A)^{2^m})`` does,
    and lost everything to cancellation on correlated keys (relative error above 1e5). fp16
    merges keep ``X`` within about 1e-3 relative even on strongly correlated keys (bf16
    merges: 8e-3). The ``hi + lo`` split keeps the 16-bit rounding of ``X`` out of ``W`` and
    ``U``, which then differ from the fp32 factors by little more than their own rounding to
    the input dtype (interpret tests: 1.55e-3 to 1.7e-3 relative RMS, the rounding alone
    1.55e-3 to 1.68e-3).

    Args:
        k: keys ``[B, T, Hk, K]``, bf16 or fp16, L2-normalised (as the op requires: the fp16
            merge operands need ``|X_ij|`` below 65504); ``H % Hk == 0`` (value head ``h``
            reads key head ``h // (H // Hk)``).
        v: values ``[B, T, H, V]``, k's dtype. ``K, V`` in {64, 128}.
        g: per-token log-decay ``[B, T, H]`` (natural log, ``<= 0``), or ``None`` (DeltaNet).
        beta: write strengths ``[B, T, H]``, any float dtype (read as fp32).
        segment_ids: optional int ``[B, T]``; documents start wherever the id changes.
        doc_vecs: optional ``(doc, conn, last)``, fp32 ``[B, Tp]`` each, as
            :func:`pallas_kernels.common.mosaic_gpu_lib.doc_vectors` gives them for
            ``segment_ids``, formed once by a caller that runs several kernels (``mosaic_vjp``);
            ``None``: formed here.
        gate_cumsum: optional fp32 ``[B, H, Tp]`` (``Tp = 64 ceil(T / 64)``), ``g``'s
            chunk-local cumsum as :func:`pallas_kernels.common.mosaic_gpu_lib.chunk_cumsum`
            gives it, computed once by a caller that runs several kernels on one ``g``
            (``mosaic_vjp``); ``None``: computed here.
        interpret: run the kernel in Mosaic GPU interpret mode (CPU; slow, for tests).

    Returns:
        ``(w, u)``: ``[B, T, H, K]`` and ``[B, T, H, V]`` in the input dtype, per value head.

    Raises:
        ValueError: on mismatched shapes, unsupported head dims or dtypes, ``H`` not a
            multiple of ``Hk``, or a ``g``, ``beta`` or ``segment_ids`` that is not
            ``[B, T, H]`` / ``[B, T]``.
    """
    batch, seq_len, kv_heads, dk = k.shape
    heads, dv = v.shape[2], v.shape[3]
    mgl.check_kv_gates(k, v, g, segment_ids)
    if beta.shape != (batch, seq_len, heads):
        raise ValueError(f"beta must be [B, T, H] = {(batch, seq_len, heads)}, got {beta.shape=}")

    num_chunks = -(-seq_len // CHUNK)
    padded = num_chunks * CHUNK
    # Padding tokens have k = v = 0, beta = 0 and g = 0: their rows and columns of A are zero
    # and their rows of W and U too.
    k, v = mgl.pad_time(k, num_chunks), mgl.pad_time(v, num_chunks)
    gc = mgl.chunk_cumsum(g, (batch, seq_len, heads), num_chunks, gate_cumsum)  # [B, H, Tp]
    beta_hm = jnp.moveaxis(mgl.pad_time(beta.astype(jnp.float32), num_chunks), 1, 2)  # [B, H, Tp]
    doc, conn, _ = mgl.doc_vectors(segment_ids, batch, num_chunks, doc_vecs)  # [B, Tp] each
    vec = plgpu.SMEM((CHUNK,), jnp.float32)
    swz = mgl.swizzled_smem
    call = plgpu.kernel(
        functools.partial(_wy_kernel, group=heads // kv_heads, interpret=interpret),
        out_type=(jax.ShapeDtypeStruct((batch, padded, heads, dk), k.dtype),
                  jax.ShapeDtypeStruct((batch, padded, heads, dv), v.dtype)),
        scratch_types=[
            swz((CHUNK, dk), k.dtype),  # k_s: k, then the staging of W
            swz((CHUNK, dv), v.dtype),  # v_s: v, then the staging of U
            vec, vec, vec, vec, vec, vec, vec,  # g, beta, doc (rows, columns), conn (columns)
            swz((CHUNK, CHUNK), MERGE_DTYPE),  # l_s: A, the right operand of X A
            swz((CHUNK, CHUNK), MERGE_DTYPE),  # x_s: X, left of X A and right of Y X
            plgpu.Barrier(num_arrivals=9),  # in_bar: the 9 input copies landed
        ] + ([plgpu.SMEM((dk, CHUNK), k.dtype),  # kt_s: k^T, interpret only
              swz((CHUNK, CHUNK), MERGE_DTYPE),  # y_s: Y
              swz((CHUNK, CHUNK), k.dtype),  # hi_s
              swz((CHUNK, CHUNK), k.dtype)] if interpret else []),  # lo_s
        grid=(num_chunks, heads, batch),  # chunks first: CUDA caps grid y and z at 65535
        grid_names=("n", "h", "b"),
        compiler_params=mgl.compiler_params(),
        interpret=mgl.interpret_params() if interpret else None,
        kernel_name="gdn_chunk_wy",
    )
    with jax.named_scope("gdn_chunk_wy_mosaic"):
        w, u = call(k, v, gc, beta_hm, doc, conn)
    return w[:, :seq_len], u[:, :seq_len]


# ----------------------------------------------------------------------------------------------
# Gate-free WY inverse T0 (the split preparation of forward="fused_t0").


def refine_inverse(x, a, l_s, x_s, y_s, z_s, interpret: bool):
    """One Newton step for ``X ~ (I + A)^{-1}`` (fp32, ``[64, 64]``, WGMMA layout)::

        R = I - (I + A) X,    X <- X + X R

    which squares the relative error of ``X`` (``I - (I + A) X' = R^2``). ``A X`` must be
    accurate beyond ``X``'s error, so both factors are split into two fp16 terms
    (``A X ~ A_hi X_hi + A_hi X_lo + A_lo X_hi``, one accumulator, three ``wgmma``); ``R`` is
    small, so ``X R`` takes one product of fp16 operands (``X_hi R``). ``R`` is strictly lower
    and zero between documents (exact zeros stay zeros), so ``X`` keeps its structure. Tiles:
    ``x_s`` (``X_hi``) and ``l_s`` (``X_lo``, then ``R``) are swizzled ``[64, 64]`` fp16 SMEM;
    ``y_s``, ``z_s`` are the interpret-mode copies of the register operands (``None`` on the
    GPU).
    """
    sq = (CHUNK, CHUNK)
    dt = MERGE_DTYPE
    i, j = mgl.iota(sq, 0, interpret), mgl.iota(sq, 1, interpret)
    x_hi = x.astype(dt)
    a_hi = a.astype(dt)
    a_lo = (a - a_hi.astype(jnp.float32)).astype(dt)
    x_s[...] = x_hi
    l_s[...] = (x - x_hi.astype(jnp.float32)).astype(dt)
    plgpu.commit_smem()

    def product(acc):  # A X, split
        a_hi_op = mgl.lhs_operand(a_hi, y_s, interpret)
        plgpu.wgmma(acc, a_hi_op, x_s)
        plgpu.wgmma(acc, a_hi_op, l_s)
        plgpu.wgmma(acc, mgl.lhs_operand(a_lo, z_s, interpret), x_s)
        return acc[...]

    ax = lax.optimization_barrier(pl.run_scoped(product, plgpu.ACC(sq)))
    r = jnp.where(i == j, 1.0, 0.0) - x - ax  # the products that read l_s have finished
    l_s[...] = r.astype(dt)
    plgpu.commit_smem()

    def correct(acc):  # X R
        plgpu.wgmma(acc, mgl.lhs_operand(x_hi, y_s, interpret), l_s)
        return acc[...]

    return x + lax.optimization_barrier(pl.run_scoped(correct, plgpu.ACC(sq)))


# The T0 kernel's 16-column inverse helpers (KKT_BLOCK, _kkt_smem, _blk, _cols,
# _block_products, kkt_block_merge, kkt_diag_solve) live in pallas_kernels/common/
# mosaic_gpu_inverse.py (shared with channelwise_local_mosaic_gpu); the names here are aliases.


def kkt_block_inverse(a, l_s, x_s, y_s, interpret: bool):
    """``X = (I + A)^{-1}`` of a strictly lower fp32 ``A`` (``[64, 64]``, WGMMA layout) as four
    ``[64, 16]`` column blocks (fp32), with products restricted to where ``X`` can change.

    :func:`wy_inverse`'s doubling (exact 2 x 2 diagonal blocks, then ``X <- X - (X A)|_s X``)
    in column blocks ``c`` of 16 (rows and columns ``[16 c, 16 c + 16)``):

    * ``s = 4, 8, 16`` (inside the 16 x 16 diagonal blocks): ``X`` is block-diagonal, so
      column block ``c`` of ``X A`` restricted to the diagonal block needs only
      ``X[:, c] A[c, c]``, and of ``Y X`` only ``Y[:, c] X[c, c]``: eight ``[64, 16, 16]``
      products per level (four accumulators per ``wgmma`` batch), not two ``[64, 64, 64]``.
    * ``s = 32``: for ``c = 0, 2`` (``u = c + 1``), ``Y_c = X[:, u] A[u, c]`` then
      ``X[:, c] -= Y_c X[c, c]``: four ``[64, 16, 16]`` products.
    * ``s = 64``: for ``c = 0, 1``, ``Y_c = (X[:, 32:] A[32:, c])`` on rows 32..63, then
      ``X[:, 0] -= Y_0 X[0, 0] + Y_1 X[1, 0]`` and ``X[:, 1] -= Y_1 X[1, 1]``: two
      ``[64, 16, 32]`` and three ``[64, 16, 16]`` products.

    Same operand roundings as :func:`wy_inverse` (:data:`MERGE_DTYPE` operands, fp32
    accumulation), about 0.57 M multiply-adds instead of 2.6 M. ``l_s`` (``A``), ``x_s``
    (``X``) are ``[64, 64]`` 16-bit tiles with a 32-byte swizzle (:func:`_kkt_smem`);
    ``y_s`` (the same) is the interpret-mode copy of the register operands ``Y`` (``None`` on
    the GPU).
    """
    dt = MERGE_DTYPE
    shape = (CHUNK, KKT_BLOCK)
    i = mgl.iota(shape, 0, interpret)
    j0 = mgl.iota(shape, 1, interpret)
    l_s[...] = a.astype(dt)
    xs = []
    for c in range(4):
        j = j0 + c * KKT_BLOCK
        a_c = a[:, c * KKT_BLOCK:(c + 1) * KKT_BLOCK]
        xs.append(jnp.where(i == j, 1.0, 0.0) - jnp.where(lax.div(i, 2) == lax.div(j, 2), a_c,
                                                          0.0))

    def store(c):
        x_s.at[:, _blk(c)][...] = xs[c].astype(dt)

    def lhs(y, c):
        return mgl.lhs_operand(y, None if y_s is None else y_s.at[:, _blk(c)], interpret)

    for size in (4, 8, 16):
        half = size // 2
        for c in range(4):
            store(c)
        plgpu.commit_smem()
        xa = _block_products([[(x_s.at[:, _blk(c)], l_s.at[_blk(c), _blk(c)])]
                              for c in range(4)])
        ys = []
        for c in range(4):
            j = j0 + c * KKT_BLOCK
            quarter = ((lax.div(i, size) == lax.div(j, size)) & (lax.rem(i, size) >= half)
                       & (lax.rem(j, size) < half))
            ys.append(jnp.where(quarter, xa[c], 0.0).astype(dt))
        yx = _block_products([[(lhs(ys[c], c), x_s.at[_blk(c), _blk(c)])] for c in range(4)])
        xs = [x - p for x, p in zip(xs, yx)]
    return kkt_block_merge(xs, l_s, x_s, y_s, interpret, rows=i)


def kkt_block_refine(xs, a, l_s, al_s, x_s, xl_s, interpret: bool, *, split_x: bool = True):
    """One Newton step (:func:`refine_inverse`'s) on the column blocks ``xs`` of
    :func:`kkt_block_inverse`, with the products restricted by triangularity.

    ``R = I - (I + A) X``, ``X <- X + X R``; ``A X`` with both factors split into fp16 terms
    (``A_hi X_hi + A_hi X_lo + A_lo X_hi``; without ``split_x`` only ``A_hi X_hi + A_lo X_hi``),
    ``X R`` as ``X_hi R``. ``X`` and ``R`` are lower triangular, so column block ``c`` of
    ``A X`` and of ``X R`` only needs rows (of the right factor) from ``16 c``: products
    ``[64, 16, 64 - 16 c]`` (0.66 M multiply-adds instead of 1.05 M; 0.49 M without
    ``split_x``). The ``A_lo`` term is what brings the error down to the output rounding (the
    doubling's error comes mostly from ``A`` rounded to fp16); ``X_lo`` matters only for fp16
    outputs (MOSAIC_GPU.md Sec. 12). All operands are SMEM tiles with a 32-byte swizzle:
    ``l_s`` (``A_hi``, as left by :func:`kkt_block_inverse`), ``al_s`` (``A_lo``), ``x_s``
    (``X_hi``), ``xl_s`` (``X_lo``, then ``R``). Returns the refined column blocks (fp32).
    """
    dt = MERGE_DTYPE
    shape = (CHUNK, KKT_BLOCK)
    i, j0 = mgl.iota(shape, 0, interpret), mgl.iota(shape, 1, interpret)
    a_hi = a.astype(dt)
    al_s[...] = (a - a_hi.astype(jnp.float32)).astype(dt)  # l_s holds A_hi already
    for c in range(4):
        x_hi = xs[c].astype(dt)
        x_s.at[:, _blk(c)][...] = x_hi
        if split_x:
            xl_s.at[:, _blk(c)][...] = (xs[c] - x_hi.astype(jnp.float32)).astype(dt)
    plgpu.commit_smem()

    def tail(c):  # rows (or columns) 16 c .. 63
        return _blk(c, 4 - c)

    ax = _block_products([[(l_s.at[:, tail(c)], x_s.at[tail(c), _blk(c)]),
                           (al_s.at[:, tail(c)], x_s.at[tail(c), _blk(c)])]
                          + ([(l_s.at[:, tail(c)], xl_s.at[tail(c), _blk(c)])] if split_x else [])
                          for c in range(4)])
    # R = I - X - A X; the products that read xl_s have finished (accumulators read).
    for c in range(4):
        eye = jnp.where(i == j0 + c * KKT_BLOCK, 1.0, 0.0)
        xl_s.at[:, _blk(c)][...] = (eye - xs[c] - ax[c]).astype(dt)
    plgpu.commit_smem()
    xr = _block_products([[(x_s.at[:, tail(c)], xl_s.at[tail(c), _blk(c)])] for c in range(4)])
    return [x + p for x, p in zip(xs, xr)]


# Chunks per CTA of chunk_kkt_inverse_mosaic (its docstring has the rule): at most
# KKT_MAX_CHUNKS_PER_CTA, and no fewer than KKT_MIN_CTAS CTAs in the grid (4 per SM of the
# 132-SM H200), so that small problems still fill the GPU.
KKT_MAX_CHUNKS_PER_CTA = 8
KKT_MIN_CTAS = 4 * 132
# How chunk_kkt_inverse_mosaic inverts the 16 x 16 diagonal blocks of I + A0: "doubling"
# (kkt_block_inverse's merges 2 -> 4 -> 8 -> 16 on the tensor cores) or "substitution"
# (kkt_diag_solve: fp32 forward substitution, MOSAIC_GPU.md Sec. 13; the default since the H200
# run of 2026-12-04d: with split merges 0.091 ms at S1 against the doubling's 0.183, Sec. 15).
KKT_INVERSES = ("doubling", "substitution")
KKT_DEFAULT_INVERSE = "substitution"
# What brings chunk_kkt_inverse_mosaic's inverse from the merges' fp16 rounding down to the
# output's (MOSAIC_GPU.md Sec. 15): "newton" (the doubling's default: kkt_block_refine, one
# Newton step, two more dependent wgmma rounds) or "split_merge" (the substitution's default;
# inverse="substitution" only: hi/lo splits
# of the merges' fp16 operands, kkt_block_merge's al_s / xl_s, extra wgmma into the same
# accumulators and no Newton step: A for bf16 outputs; A, X and Y for fp16 outputs).
KKT_REFINES = ("newton", "split_merge")
# Timing ablations of chunk_kkt_inverse_mosaic's per-chunk body (``stages``; MOSAIC_GPU.md
# Sec. 14): "full" is the kernel; the others cut it short and store something that is NOT T0,
# with the same grid, TMA ring, SMEM allocation and output store, so that the time each one
# saves is the time of the work it removes: "no_refine" stores the inverse before the Newton
# step, "gram" stores A0 (no inverse), "io" stores a product of the loaded beta and document
# vectors (no wgmma; the k copies still land, since the barrier waits for them). Two more do
# all of "full"'s work: "no_store" writes and commits the staging tile as usual but issues the
# TMA store only for a CTA's last chunk (the other chunks' rows of the output are left
# unwritten), and "nobar" is "full" compiled with CompilerParams(unsafe_no_auto_barriers=True):
# without the warpgroup barrier Pallas puts before and after every register -> SMEM store
# (about 64 of the 82 bar.sync per chunk of the lowered doubling kernel, Sec. 14), relying on
# the kernel's own commit_smem / wait_smem_to_gmem barriers; it should still return T0.
KKT_STAGES = ("full", "no_refine", "gram", "io", "no_store", "nobar")
# Keyword arguments of chunk_kkt_inverse_mosaic at the forwards' call sites
# (gated_delta_rule_fwd_mosaic and mosaic_vjp's forward with forward="fused_t0" or
# "fused_t0_split"): empty, the defaults. For timing variants only (benchmarks/bench_kernels.py
# --mosaic_t0_inverse, --mosaic_t0_chunks_per_cta set it before anything is traced; it is read
# at trace time, so a change after a function was traced does not reach it).
T0_OPTIONS: dict = {}
# Keyword arguments of chunk_delta_fused_t0_fwd_mosaic at the same call sites with
# forward="fused_t0_split" only: empty, the defaults. For timing variants only
# (benchmarks/bench_kernels.py --mosaic_t0_split_order / --mosaic_t0_split_stages /
# --mosaic_t0_split_protocol set split_order, split_stages, split_protocol; read at trace time).
SPLIT_T0_OPTIONS: dict = {}


def kkt_chunks_per_cta(batch: int, heads: int, num_chunks: int) -> int:
    """The default ``chunks_per_cta`` of :func:`chunk_kkt_inverse_mosaic`: the largest power
    of two up to :data:`KKT_MAX_CHUNKS_PER_CTA` (8) and ``num_chunks`` whose grid
    ``batch * heads * ceil(num_chunks / cpc)`` has at least :data:`KKT_MIN_CTAS` CTAs; 1 if
    none has."""
    cpc = KKT_MAX_CHUNKS_PER_CTA
    while cpc > 1:
        if cpc <= num_chunks and batch * heads * (-(-num_chunks // cpc)) >= KKT_MIN_CTAS:
            return cpc
        cpc //= 2
    return 1


def _kkt_inverse_w_kernel(k_ref, beta_ref, doc_ref, g_ref, conn_ref, t0_ref, w_ref, k_s,
                          b_row_s, doc_row_s, doc_col_s, l_s, al_s, x_s, xl_s, t0_s, in_bar,
                          g_row_s, b_col_s, conn_col_s, *shim, interpret: bool, **kw):
    """:func:`_kkt_inverse_kernel` with ``W`` (``return_w=True`` of
    :func:`chunk_kkt_inverse_mosaic`): the extra inputs (``G`` ``[B, H, Tp]``, ``conn``
    ``[B, Tp]``), output and vectors (2-slot rings of ``G`` as rows, ``beta`` and ``conn`` as
    columns) passed on as ``w_refs``; ``shim`` ends, in interpret mode, with the two ``[64, 64]``
    tiles of the ``W`` product's left operands (``T0_hi``, ``T0_lo``)."""
    shim, w_shim = (shim[:-2], shim[-2:]) if interpret else (shim, (None, None))
    _kkt_inverse_kernel(k_ref, beta_ref, doc_ref, t0_ref, k_s, b_row_s, doc_row_s, doc_col_s,
                        l_s, al_s, x_s, xl_s, t0_s, in_bar, *shim, interpret=interpret,
                        w_refs=(g_ref, conn_ref, w_ref, g_row_s, b_col_s, conn_col_s) + w_shim,
                        **kw)


def _kkt_inverse_kernel(k_ref, beta_ref, doc_ref, t0_ref, k_s, b_row_s, doc_row_s, doc_col_s,
                        l_s, al_s, x_s, xl_s, t0_s, in_bar, *shim, group: int, num_chunks: int,
                        chunks_per_cta: int, interpret: bool, inverse: str = "doubling",
                        stages: str = "full", refine: str = "newton", w_refs=None):
    """Kernel body of :func:`chunk_kkt_inverse_mosaic`: ``chunks_per_cta`` consecutive chunks
    of one ``(b, h)`` per CTA, one warpgroup.

    The inputs of each chunk (``k``, ``beta``, two copies of the document vector) go by TMA
    into a 2-slot ring (``k_s``, ``b_row_s``, ``doc_row_s``, ``doc_col_s``, ``in_bar``
    indexed by slot): chunk ``c + 1``'s copies are issued before chunk ``c`` is computed, into
    the slot chunk ``c - 1`` used. Every read of that slot by chunk ``c - 1`` happened before
    chunk ``c - 1``'s ``commit_smem`` (a warpgroup barrier and an async-proxy fence): the
    ``wgmma`` that read ``k_s`` finished when its accumulator was read, the vectors were loaded
    into registers. ``T0`` leaves through a 2-slot staging tile ``t0_s``: before writing a slot,
    the store issued from it two chunks earlier must have read it. Chunks past ``num_chunks``
    (the partial last group) are skipped; they are the group's last, so the ring's barrier
    phases of the earlier chunks are unaffected.

    ``shim``: in interpret mode ``kt_s`` (``k^T``) and ``y_s`` (left operands of the merges),
    the SMEM copies of what the GPU reads as a transposed view or from registers; on the GPU
    with ``inverse="substitution"``, ``solve_s``, the fp32 buffer of :func:`kkt_diag_solve`.
    ``inverse`` (:data:`KKT_INVERSES`): how the 16 x 16 diagonal blocks are inverted.
    ``refine`` (:data:`KKT_REFINES`): the Newton step after the merges, or hi/lo splits in
    them (``"split_merge"``, with the substitution only: ``al_s`` holds ``A_lo``, and for fp16
    outputs ``xl_s`` holds ``X_lo``).
    ``stages`` (:data:`KKT_STAGES`): where a timing ablation cuts the chunk's work short
    (``"no_store"``: which chunks' staging tiles go out; ``"nobar"`` is ``"full"``'s body).
    ``w_refs`` (``return_w``, :func:`_kkt_inverse_w_kernel`; ``stages="full"`` only): after
    ``T0`` is stored, ``W = diag(e^G) (T0 diag(beta conn)) K`` from the fp32 ``T0`` (read
    back from SMEM as its rounding plus an fp16 remainder), scaled and split into 16-bit
    ``hi + lo`` register operands (two ``[64, 64] x [64, K]`` ``wgmma`` into one accumulator,
    ``K`` the loaded slot), staged over the key slot (its product has read it) and stored by
    TMA. Three more copies per chunk (``G`` rows, ``beta`` and ``conn``
    columns); before a slot is refilled, the ``W`` store from it must have read it.
    """
    grp, h, b = lax.axis_index("n"), lax.axis_index("h"), lax.axis_index("b")
    hk = lax.div(h, group)  # GVA: value head h reads key head h // group
    first = grp * chunks_per_cta
    kt_s, y_s = shim[:2] if interpret else (None, None)
    solve_s = shim[0] if inverse == "substitution" and not interpret else None
    sq = (CHUNK, CHUNK)
    if w_refs is not None:
        g_ref, conn_ref, w_ref, g_row_s, b_col_s, conn_col_s, wh_s, wl_s = w_refs

    def issue(n, slot):
        rows = pl.ds(n * CHUNK, CHUNK)
        bar = in_bar.at[slot]
        plgpu.copy_gmem_to_smem(k_ref.at[b, rows, hk], k_s.at[slot], bar)
        plgpu.copy_gmem_to_smem(beta_ref.at[b, h, rows], b_row_s.at[slot], bar)
        # Row and column views of one vector need different register layouts: separate copies.
        plgpu.copy_gmem_to_smem(doc_ref.at[b, rows], doc_row_s.at[slot], bar)
        plgpu.copy_gmem_to_smem(doc_ref.at[b, rows], doc_col_s.at[slot], bar)
        if w_refs is not None:
            plgpu.copy_gmem_to_smem(g_ref.at[b, h, rows], g_row_s.at[slot], bar)
            plgpu.copy_gmem_to_smem(beta_ref.at[b, h, rows], b_col_s.at[slot], bar)
            plgpu.copy_gmem_to_smem(conn_ref.at[b, rows], conn_col_s.at[slot], bar)

    issue(first, 0)  # the group's first chunk exists (grid = ceil(num_chunks / cpc))

    def store_w(xs, n, slot):
        """``W`` of chunk ``n`` from ``T0``'s fp32 column blocks ``xs``, out through the
        key slot (see ``w_refs`` above). ``T0 = hi + lo``: ``hi`` is the rounded ``T0`` just
        staged in ``t0_s``, ``lo`` goes to ``x_s`` (free once the merges are done; the next
        chunk's merges overwrite it after this load), both read back as one ``[64, 64]`` tile
        (the ``wgmma`` of ``[64, 16]`` column blocks would need ``K`` in steps of 16, which the
        key tile's 128-byte swizzle does not allow)."""
        k_c = k_s.at[slot]
        for c in range(4):
            x_s.at[:, _blk(c)][...] = (
                xs[c] - xs[c].astype(t0_s.dtype).astype(jnp.float32)).astype(x_s.dtype)
        plgpu.commit_smem()
        t0 = (mgl.load_tile(t0_s.at[slot], interpret).astype(jnp.float32)
              + mgl.load_tile(x_s, interpret).astype(jnp.float32))
        b_j = mgl.load_cols(b_col_s.at[slot], interpret)
        t = t0 * lax.broadcast_in_dim(b_j * mgl.load_cols(conn_col_s.at[slot], interpret),
                                      sq, [1])
        hi = t.astype(k_c.dtype)
        lo = (t - hi.astype(jnp.float32)).astype(k_c.dtype)
        hi, lo = mgl.lhs_operand(hi, wh_s, interpret), mgl.lhs_operand(lo, wl_s, interpret)

        def product(acc):  # (T0 diag(beta conn)) K, hi + lo
            plgpu.wgmma(acc, hi, k_c)
            plgpu.wgmma(acc, lo, k_c)
            return acc[...]

        # The barrier keeps the arithmetic after the accumulator read (jla's pitfall).
        w = lax.optimization_barrier(pl.run_scoped(product, plgpu.ACC(k_c.shape)))
        g_i = mgl.load_rows(g_row_s.at[slot], interpret)
        k_c[...] = (w * mgl.by_row(jnp.exp(g_i), w.shape)).astype(k_c.dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(k_c, w_ref.at[b, pl.ds(n * CHUNK, CHUNK), h])

    def step(c, carry):
        n = first + c
        slot = lax.rem(c, 2)

        @pl.when((c + 1 < chunks_per_cta) & (n + 1 < num_chunks))
        def _prefetch():
            if w_refs is not None:  # the W store of chunk n - 1 from that slot has read it
                plgpu.wait_smem_to_gmem(0, wait_read_only=True)
            issue(n + 1, 1 - slot)

        if stages == "no_store":  # the TMA store only for the CTA's last chunk
            last_chunk = (c + 1 == chunks_per_cta) | (n + 1 == num_chunks)

        def store_t0(xs):  # four [64, 16] fp32 column blocks out through the staging ring
            plgpu.wait_smem_to_gmem(1, wait_read_only=True)  # the store from this slot read it
            for c in range(4):
                t0_s.at[slot].at[:, _blk(c)][...] = xs[c].astype(t0_s.dtype)
            plgpu.commit_smem()
            if stages == "no_store":
                @pl.when(last_chunk)
                def _store_last():
                    plgpu.copy_smem_to_gmem(t0_s.at[slot],
                                            t0_ref.at[b, pl.ds(n * CHUNK, CHUNK), h])
            else:
                plgpu.copy_smem_to_gmem(t0_s.at[slot], t0_ref.at[b, pl.ds(n * CHUNK, CHUNK), h])

        @pl.when(n < num_chunks)
        def _compute():
            plgpu.barrier_wait(in_bar.at[slot])
            k_c = k_s.at[slot]
            if stages == "io":  # no wgmma: a [64, 64] of the loaded vectors goes out
                b_i = mgl.load_rows(b_row_s.at[slot], interpret)
                d_j = mgl.load_cols(doc_col_s.at[slot], interpret)
                x = mgl.by_row(b_i, sq) * lax.broadcast_in_dim(d_j, sq, [1])
                store_t0([x[:, _cols(c)] for c in range(4)])
                return

            def gram(acc):
                plgpu.wgmma(acc, k_c, mgl.transposed(k_c, kt_s, interpret))  # K K^T, [C, C]
                return acc[...]

            # The barrier keeps the arithmetic after the accumulator read (jla's pitfall).
            kk = lax.optimization_barrier(pl.run_scoped(gram, plgpu.ACC(sq)))
            i, j = mgl.iota(sq, 0, interpret), mgl.iota(sq, 1, interpret)
            b_i = mgl.load_rows(b_row_s.at[slot], interpret)
            d_i = mgl.load_rows(doc_row_s.at[slot], interpret)
            d_j = mgl.load_cols(doc_col_s.at[slot], interpret)
            # A0_ij = beta_i (k_i . k_j) on j < i in the same document, else 0 (no gates).
            strict = (j < i) & (mgl.by_row(d_i, sq) == lax.broadcast_in_dim(d_j, sq, [1]))
            a0 = jnp.where(strict, kk * mgl.by_row(b_i, sq), 0.0)
            if stages == "gram":
                store_t0([a0[:, _cols(c)] for c in range(4)])
                return
            if inverse == "substitution":  # diagonal blocks by fp32 substitution, then merges
                a_hi = a0.astype(l_s.dtype)
                l_s[...] = a_hi
                if refine == "split_merge":  # A_hi + A_lo in the merges (+ X, Y splits: fp16)
                    al_s[...] = (a0 - a_hi.astype(jnp.float32)).astype(al_s.dtype)
                    split = dict(al_s=al_s, xl_s=xl_s if t0_s.dtype == jnp.float16 else None)
                else:
                    split = {}
                xs = kkt_diag_solve(a0, solve_s, interpret)
                xs = kkt_block_merge(xs, l_s, x_s, y_s, interpret, **split)
            else:
                xs = kkt_block_inverse(a0, l_s, x_s, y_s, interpret)  # T0 by blocked doubling
            if stages != "no_refine" and refine == "newton":
                # The merges' error squared; X_lo only for fp16 outputs (bf16 rounding hides it).
                xs = kkt_block_refine(xs, a0, l_s, al_s, x_s, xl_s, interpret,
                                      split_x=t0_s.dtype == jnp.float16)
            store_t0(xs)
            if w_refs is not None:
                store_w(xs, n, slot)

        return carry

    lax.fori_loop(0, chunks_per_cta, step, 0)
    plgpu.wait_smem_to_gmem(0)


def _check_kkt_inputs(k, beta, segment_ids) -> None:
    """``k [B, T, Hk, K]`` (16-bit, ``K`` in {64, 128}), ``beta [B, T, H]`` with
    ``H % Hk == 0``, ``segment_ids [B, T]``.

    Raises:
        ValueError: naming the argument and the shape or dtype it needs.
    """
    batch, seq_len, kv_heads, dk = k.shape
    if beta.ndim != 3 or beta.shape[:2] != (batch, seq_len) or beta.shape[2] % kv_heads:
        raise ValueError(f"beta must be [B, T, H] = ({batch}, {seq_len}, H) with H a multiple "
                         f"of k's {kv_heads} key heads, got {beta.shape=}")
    if dk not in mgl.SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head dims must be in {mgl.SUPPORTED_HEAD_DIMS}, got {k.shape=}")
    if k.dtype not in mgl.SUPPORTED_DTYPES:
        raise ValueError(f"k must have a 16-bit dtype (wgmma operands), got {k.dtype=}")
    if segment_ids is not None and segment_ids.shape != (batch, seq_len):
        raise ValueError(f"segment_ids must be [B, T] = {(batch, seq_len)}, got "
                         f"{segment_ids.shape=}")


@functools.partial(jax.jit, static_argnames=("chunks_per_cta", "inverse", "stages", "refine",
                                             "return_w", "interpret"))
def chunk_kkt_inverse_mosaic(
    k: jax.Array,
    beta: jax.Array,
    *,
    segment_ids: Optional[jax.Array] = None,
    chunks_per_cta: Optional[int] = None,
    inverse: str = KKT_DEFAULT_INVERSE,
    stages: str = "full",
    refine: Optional[str] = None,
    return_w: bool = False,
    g: Optional[jax.Array] = None,
    gate_cumsum: Optional[jax.Array] = None,
    doc_vecs: Optional[Tuple[jax.Array, jax.Array, jax.Array]] = None,
    interpret: bool = False,
) -> Union[jax.Array, Tuple[jax.Array, jax.Array]]:
    """The gate-free WY inverse ``T0`` of every chunk of 64 tokens, by a Mosaic GPU kernel.

    The first half of jla's split of the WY preparation (``kkt_fwd``; read from the jla 0.1.0
    wheel, own code), the counterpart of FLA's ``chunk_scaled_dot_kkt_fwd`` + ``solve_tril``
    without the gates. Per batch row, value head and chunk, with ``[.]`` the same-document
    mask::

        A0_ij = beta_i (k_i . k_j) [j < i, doc(j) = doc(i)]
        T0    = (I + A0)^{-1}                                (unit lower-triangular, [64, 64])

    The gated inverse of :func:`chunk_wy_mosaic` is ``T = (I + A)^{-1}`` with
    ``A = Gamma A0 Gamma^{-1}``, ``Gamma = diag(e^G)`` (``G`` the chunk-local cumulative
    log-decay): a diagonal similarity, so ``T = Gamma T0 Gamma^{-1}``, i.e.
    ``T_ij = T0_ij e^{G_i - G_j}`` exactly, and the gates and ``beta`` can go on later, in
    :func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu_fused.chunk_delta_fused_t0_fwd_mosaic`
    (``forward="fused_t0"``). ``T0`` is zero above the diagonal and between documents (``A0``
    is block-diagonal by document, and so is its inverse).

    One CTA per ``chunks_per_cta`` consecutive chunks of one ``(value head, batch row)``, one
    warpgroup, grid ``(ceil(N / chunks_per_cta), H, B)``. Each chunk's inputs are four TMA
    copies on one barrier (``k`` of key head ``h // group``, ``beta`` rows, row and column
    copies of the document vector) into a 2-slot ring: chunk ``c + 1``'s copies are issued
    before chunk ``c`` is computed, so their latency overlaps the inverse; ``T0`` leaves in
    the input dtype through a 2-slot staging tile by TMA. SMEM about 81 KB at K = 128 (65 KB
    at K = 64): 2 x 16 KB of ``k``, four 8 KB fp16 operand tiles, 2 x 8 KB of staging.
    ``K K^T`` on the tensor cores (fp32 accumulation, ``k^T`` a transposed SMEM view); ``A0``
    in fp32 registers; the inverse (by default the substitution and split merges of
    ``inverse`` and ``refine`` below; what follows is ``inverse="doubling"``) by
    :func:`kkt_block_inverse`: :func:`wy_inverse`'s
    doubling (exact 2 x 2 diagonal blocks, merges 4 -> ... -> 64, fp16 operands,
    :data:`MERGE_DTYPE`, fp32 accumulation), computed in four 16-column blocks with every
    product restricted to the blocks it can change (the 16 x 16 diagonal blocks by
    ``[64, 16, 16]`` products, then the 16 -> 32 -> 64 merges), then one Newton step,
    :func:`kkt_block_refine` (``A0 X`` as ``A_hi X_hi + A_lo X_hi``, plus ``A_hi X_lo`` for
    fp16 outputs), with products restricted by triangularity, which squares the merges'
    error. Multiply-adds per chunk and head (issued ``wgmma`` sizes, M = 64): ``K K^T``
    0.52 M (K = 128), inverse 0.57 M, Newton step 0.49 M (fp16 0.66 M), in all 1.59 M at
    K = 128 (fp16 1.75 M; K = 64: 1.33 M, 1.49 M); the unrestricted doubling and Newton step
    took 4.19 M (jla: about 1.6 M, its 16 x 16 diagonal blocks solved by fp32 forward
    substitution in ``inline_mgpu``, which the interpreter cannot run, and no Newton step).
    Interpreted, the error against a float64 inverse is within 0.3 % of that of the float64
    inverse rounded to the input dtype (relative RMS of ``T0 - I``: bf16 1.39e-3 to 1.68e-3,
    fp16 1.79e-4 to 2.04e-4, correlated keys included; without the Newton step 2.2e-3 and
    1.4e-3 on correlated keys); MOSAIC_GPU.md Sec. 12. Per chunk and head it reads ``k``
    and writes 8 KB (``chunk_wy_mosaic``: reads ``k, v``, writes ``W, U``, 64 KB at
    K = V = 128).

    Args:
        k: keys ``[B, T, Hk, K]``, bf16 or fp16, L2-normalised (the fp16 merge operands need
            ``|T0_ij|`` below 65504); ``K`` in {64, 128}.
        beta: write strengths ``[B, T, H]``, any float dtype (read as fp32); ``H % Hk == 0``
            (value head ``h`` reads key head ``h // (H // Hk)``).
        segment_ids: optional int ``[B, T]``; documents start wherever the id changes.
        chunks_per_cta: chunks per CTA (static, >= 1; the last CTA of a row may get fewer).
            ``None`` picks :func:`kkt_chunks_per_cta`: the largest of 8, 4, 2, 1 that leaves
            at least :data:`KKT_MIN_CTAS` (4 per SM of an H200) CTAs in the grid, so small
            problems keep enough CTAs (B 8, H 16, T 4096: 8 chunks per CTA, 1024 CTAs).
        inverse: how the 16 x 16 diagonal blocks of ``I + A0`` are inverted (static, one of
            :data:`KKT_INVERSES`): ``"substitution"`` (default since the H200 run of
            2026-12-04d, MOSAIC_GPU.md Sec. 15) or ``"doubling"`` (above),
            :func:`kkt_diag_solve`'s fp32 forward substitution (``inline_mgpu`` on the GPU,
            one thread per column; plain ``jnp`` when interpreting), then the same 16 -> 32 ->
            64 merges and Newton step: 7 dependent ``wgmma`` rounds per chunk instead of 13
            and 22 ``wgmma`` instead of 46, for an fp32 SMEM buffer of 18 KB (about 99.5 KB
            per CTA at K = 128, still two CTAs per SM); MOSAIC_GPU.md Sec. 13.
        refine: what takes the merges' error (their :data:`MERGE_DTYPE` operands) down to
            the output rounding (static, one of :data:`KKT_REFINES`, or ``None``, the default:
            ``"split_merge"`` with the substitution, ``"newton"`` with the doubling):
            ``"newton"`` (above: :func:`kkt_block_refine`, two more dependent ``wgmma``
            rounds) or
            ``"split_merge"`` (``inverse="substitution"`` only): no Newton step; instead the
            merges' ``X A`` product takes ``A`` as ``A_hi + A_lo`` (two fp16 tiles, two
            ``wgmma`` into one accumulator), and for fp16 outputs ``X`` (``X_hi + X_lo``)
            and ``Y`` too, so the chunk has 5 dependent ``wgmma`` rounds instead of 7.
            Interpreted, at most 1.025 times the float64 inverse's own rounding to the output
            dtype on the 10 test cases (bf16: A split only; fp16: all three); MOSAIC_GPU.md
            Sec. 15. Kernel name ``gdn_chunk_kkt_inverse_subst_split``. On the H200 at S1
            (B 8, T 4096, H 16, K 128, bf16; 2026-12-04d) 0.091 ms against 0.179 with the
            Newton step and 0.183 for the doubling (jla's ``kkt_fwd`` 0.097), relative RMS
            1.671e-3 against float64 (the Newton step's 1.659e-3).
        stages: a timing ablation (static, one of :data:`KKT_STAGES`; benchmarks only):
            ``"full"`` (default) is the kernel above; ``"no_refine"`` returns the inverse
            before the Newton step, ``"gram"`` returns ``A0`` itself, ``"io"`` returns
            ``beta_i doc(j)`` (no ``wgmma``), each with the same grid, input copies, SMEM and
            output store, so their times split the kernel's (MOSAIC_GPU.md Sec. 14).
            ``"no_store"`` does all the work but the TMA stores of all chunks except each
            CTA's last (the other rows of the result are undefined); ``"nobar"`` is
            ``"full"`` compiled without Pallas's automatic warpgroup barriers around
            register -> SMEM stores (``CompilerParams(unsafe_no_auto_barriers=True)``), which
            should still return ``T0`` (check it). ``"full"`` returns ``T0``.
        return_w: also form the WY factor ``W`` of the backward (static; ``stages="full"``
            only; MOSAIC_GPU.md Sec. 36), in the kernel, from the fp32 ``T0`` before its
            rounding::

                W_i = e^{G_i} sum_j T0_ij beta_j conn_j k_j,   i.e. W = T diag(beta conn e^G) K

            (``conn``: 1 on the tokens of the document open before the chunk), the ``W`` of
            :func:`chunk_wy_mosaic` and of :func:`w_from_t0` (which rounds ``T0`` first). The
            fp32 ``T0`` (its rounding, staged for the output, plus the remainder in fp16) is
            scaled by ``beta conn`` per column and split into 16-bit ``hi + lo`` register
            operands; ``W = diag(e^G) (hi + lo) K`` (two ``[64, 64] x [64, K]`` ``wgmma``, fp32
            accumulation) is rounded once to k's dtype and leaves by TMA through the key slot
            of the ring. Three more TMA copies per chunk (``G`` as rows,
            ``beta`` and ``conn`` as columns, 768 bytes); no more SMEM on the GPU (1.5 KB of
            vectors). Kernel name suffix ``_w``.
        g: log-decay ``[B, T, H]`` or ``None`` (DeltaNet, ``G = 0``); read only with
            ``return_w``.
        gate_cumsum, doc_vecs: ``g``'s chunk-local cumsum and the document vectors, formed
            once by a caller that runs several kernels (``mosaic_vjp``), as
            :func:`chunk_wy_mosaic` takes them; ``None``: formed here (``gate_cumsum`` is
            read only with ``return_w``).
        interpret: run the kernel in Mosaic GPU interpret mode (CPU; slow, for tests).

    Returns:
        ``t0`` ``[B, T, H, 64]`` in k's dtype: row ``t`` holds ``T0[t, :]`` of token ``t``'s
        chunk (column ``j`` is the chunk's token ``j``); with ``return_w``, ``(t0, w)``, ``w``
        ``[B, T, H, K]`` in k's dtype, per value head.

    Raises:
        ValueError: on a ``beta`` that is not ``[B, T, H]`` with ``H % Hk == 0``, an
            unsupported head dim or dtype, a ``segment_ids`` that is not ``[B, T]``, a
            ``chunks_per_cta`` below 1, an ``inverse`` not in :data:`KKT_INVERSES`, a
            ``stages`` not in :data:`KKT_STAGES`, a ``refine`` not in :data:`KKT_REFINES`,
            ``refine="split_merge"`` with ``inverse="doubling"``, or ``return_w`` with a
            ``stages`` other than ``"full"`` or a ``g`` that is not ``[B, T, H]``.
    """
    batch, seq_len, kv_heads, dk = k.shape
    _check_kkt_inputs(k, beta, segment_ids)
    if inverse not in KKT_INVERSES:
        raise ValueError(f"inverse must be one of {KKT_INVERSES}, got {inverse!r}")
    if stages not in KKT_STAGES:
        raise ValueError(f"stages must be one of {KKT_STAGES}, got {stages!r}")
    if refine is None:  # each inverse's best (MOSAIC_GPU.md Sec. 15)
        refine = "split_merge" if inverse == "substitution" else "newton"
    if refine not in KKT_REFINES:
        raise ValueError(f"refine must be one of {KKT_REFINES}, got {refine!r}")
    if refine == "split_merge" and inverse != "substitution":
        raise ValueError(f"refine='split_merge' needs inverse='substitution' (the doubling's "
                         f"diagonal levels would need their own splits), got {inverse=}")
    heads = beta.shape[2]
    if return_w and stages != "full":
        raise ValueError(f"return_w needs stages='full' (an ablation returns no T0), got "
                         f"{stages=}")
    if return_w and g is not None and g.shape != beta.shape:
        raise ValueError(f"g must be [B, T, H] = {beta.shape}, got {g.shape=}")
    num_chunks = -(-seq_len // CHUNK)
    if chunks_per_cta is None:
        chunks_per_cta = kkt_chunks_per_cta(batch, heads, num_chunks)
    if chunks_per_cta < 1:
        raise ValueError(f"chunks_per_cta must be >= 1, got {chunks_per_cta=}")
    chunks_per_cta = min(chunks_per_cta, num_chunks)
    num_groups = -(-num_chunks // chunks_per_cta)
    padded = num_chunks * CHUNK
    # Padding tokens have k = 0 and beta = 0: their rows and columns of A0 are zero (T0 = I
    # there; the rows are cut off below).
    k = mgl.pad_time(k, num_chunks)
    beta_hm = jnp.moveaxis(mgl.pad_time(beta.astype(jnp.float32), num_chunks), 1, 2)  # [B, H, Tp]
    doc, conn, _ = mgl.doc_vectors(segment_ids, batch, num_chunks, doc_vecs)  # [B, Tp]
    vec = plgpu.SMEM((2, CHUNK), jnp.float32)
    swz = mgl.swizzled_smem
    t0_type = jax.ShapeDtypeStruct((batch, padded, heads, CHUNK), k.dtype)
    call = plgpu.kernel(
        functools.partial(_kkt_inverse_w_kernel if return_w else _kkt_inverse_kernel,
                          group=heads // kv_heads, num_chunks=num_chunks,
                          chunks_per_cta=chunks_per_cta, interpret=interpret,
                          inverse=inverse, stages=stages,
                          refine=refine),
        out_type=((t0_type, jax.ShapeDtypeStruct((batch, padded, heads, dk), k.dtype))
                  if return_w else t0_type),
        scratch_types=[
            swz((2, CHUNK, dk), k.dtype),  # k_s: the 2-slot ring of keys
            vec, vec, vec,  # beta (rows), doc (rows, columns), 2 slots each
            _kkt_smem((CHUNK, CHUNK), MERGE_DTYPE),  # l_s: A0 (A_hi), right of X A0, left of A X
            _kkt_smem((CHUNK, CHUNK), MERGE_DTYPE),  # al_s: A_lo
            _kkt_smem((CHUNK, CHUNK), MERGE_DTYPE),  # x_s: X (X_hi)
            _kkt_smem((CHUNK, CHUNK), MERGE_DTYPE),  # xl_s: X_lo, then R
            _kkt_smem((2, CHUNK, CHUNK), k.dtype),  # t0_s: 2-slot staging of T0
            # in_bar: a slot's 4 copies landed (7 with return_w)
            plgpu.Barrier(num_arrivals=7 if return_w else 4, num_barriers=2),
        ] + ([vec, vec, vec] if return_w else [])  # G (rows), beta, conn (columns): return_w
        + ([plgpu.SMEM((dk, CHUNK), k.dtype),  # kt_s: k^T, interpret only
            _kkt_smem((CHUNK, CHUNK), MERGE_DTYPE)] if interpret else [])  # y_s: Y
        # solve_s: kkt_diag_solve's fp32 buffer, padded rows (GPU only)
        + ([plgpu.SMEM((CHUNK, CHUNK + KKT_SOLVE_PAD), jnp.float32)]
           if inverse == "substitution" and not interpret else [])
        # W's left operands hi, lo (interpret only; registers on the GPU)
        + ([swz((CHUNK, CHUNK), k.dtype)] * 2 if return_w and interpret else []),
        grid=(num_groups, heads, batch),  # groups first: CUDA caps grid y and z at 65535
        grid_names=("n", "h", "b"),
        compiler_params=mgl.compiler_params(
            **({"unsafe_no_auto_barriers": True} if stages == "nobar" else {})),
        interpret=mgl.interpret_params() if interpret else None,
        kernel_name=("gdn_chunk_kkt_inverse" + ("_subst" if inverse == "substitution" else "")
                     + ("_split" if refine == "split_merge" else "")
                     + ("_w" if return_w else "")
                     + ("" if stages == "full" else f"_abl_{stages}")),
    )
    if not return_w:
        with jax.named_scope("gdn_chunk_kkt_inverse_mosaic"):
            t0 = call(k, beta_hm, doc)
        return t0[:, :seq_len]
    gc = mgl.chunk_cumsum(g, (batch, seq_len, heads), num_chunks, gate_cumsum)  # [B, H, Tp]
    with jax.named_scope("gdn_chunk_kkt_inverse_mosaic"):
        t0, w = call(k, beta_hm, doc, gc, conn)
    return t0[:, :seq_len], w[:, :seq_len]


def _chunked_heads(x, num_chunks):
    """``[B, T, H, D]`` zero-padded in time to ``[B, N, 64, H, D]`` fp32."""
    x = mgl.pad_time(x.astype(jnp.float32), num_chunks)
    return x.reshape(x.shape[0], num_chunks, CHUNK, *x.shape[2:])


def kkt_inverse_xla(k: jax.Array, beta: jax.Array, *,
                    segment_ids: Optional[jax.Array] = None) -> jax.Array:
    """fp32 ``T0 = (I + A0)^{-1}`` ``[B, T, H, 64]`` in XLA: :func:`chunk_kkt_inverse_mosaic`'s
    equations with a triangular solve, unrounded (``forward="fused_t0"`` with
    ``wy_implementation="xla"`` rounds it to the input dtype).

    Raises:
        ValueError: as :func:`chunk_kkt_inverse_mosaic`.
    """
    batch, seq_len, kv_heads, _ = k.shape
    _check_kkt_inputs(k, beta, segment_ids)
    heads = beta.shape[2]
    num_chunks = -(-seq_len // CHUNK)
    kc = _chunked_heads(jnp.repeat(k, heads // kv_heads, axis=2), num_chunks)  # [B, N, C, H, K]
    bc = _chunked_heads(beta[..., None], num_chunks)[..., 0]  # [B, N, C, H]
    doc, _, _ = mgl.doc_vectors(segment_ids, batch, num_chunks)
    doc = doc.reshape(batch, num_chunks, CHUNK)
    kk = jnp.einsum("bnihk,bnjhk->bnhij", kc, kc, precision=lax.Precision.HIGHEST)
    idx = jnp.arange(CHUNK)
    strict = (idx[None, :] < idx[:, None]) & (doc[..., :, None] == doc[..., None, :])
    a0 = jnp.where(strict[:, :, None], kk * jnp.moveaxis(bc, 2, 3)[..., None], 0.0)
    eye = jnp.broadcast_to(jnp.eye(CHUNK, dtype=jnp.float32), a0.shape)
    t0 = jax.scipy.linalg.solve_triangular(eye + a0, eye, lower=True, unit_diagonal=True)
    t0 = jnp.moveaxis(t0, 2, 3)  # [B, N, C (row i), H, C (column j)]
    return t0.reshape(batch, num_chunks * CHUNK, heads, CHUNK)[:, :seq_len]


def w_from_t0(k: jax.Array, t0: jax.Array, g: Optional[jax.Array], beta: jax.Array, *,
              segment_ids: Optional[jax.Array] = None) -> jax.Array:
    """``W = T diag(beta conn e^G) K`` from the gate-free inverse, in XLA (fp32, rounded once).

    With ``T = diag(e^G) T0 diag(e^{-G})`` (:func:`chunk_kkt_inverse_mosaic`), per chunk::

        W_i = e^{G_i} sum_j T0_ij beta_j conn_j k_j

    the ``W`` of :func:`chunk_wy_mosaic` (up to the rounding of ``T0``), which the Mosaic
    backward reads (``mosaic_vjp``'s residual for ``forward="fused_t0"``). ``k [B, T, Hk, K]``,
    ``t0 [B, T, H, 64]``, ``g [B, T, H]`` or ``None``, ``beta [B, T, H]``; returns
    ``[B, T, H, K]`` in k's dtype.
    """
    batch, seq_len, kv_heads, _ = k.shape
    heads = t0.shape[2]
    num_chunks = -(-seq_len // CHUNK)
    gc = mgl.chunk_cumsum(g, (batch, seq_len, heads), num_chunks)  # [B, H, Tp]
    _, conn, _ = mgl.doc_vectors(segment_ids, batch, num_chunks)  # [B, Tp]
    kc = _chunked_heads(jnp.repeat(k, heads // kv_heads, axis=2), num_chunks)  # [B, N, C, H, K]
    col = _chunked_heads(beta[..., None], num_chunks)[..., 0]  # [B, N, C, H]
    col = col * conn.reshape(batch, num_chunks, CHUNK, 1)
    w = jnp.einsum("bnihj,bnjhk->bnihk", _chunked_heads(t0, num_chunks), kc * col[..., None],
                   precision=lax.Precision.HIGHEST)
    w = w.reshape(batch, num_chunks * CHUNK, heads, -1) * jnp.exp(jnp.moveaxis(gc, 1, 2))[..., None]
    return w[:, :seq_len].astype(k.dtype)


@functools.partial(jax.jit, static_argnames=("scale", "return_residual", "wy_implementation",
                                             "forward", "interpret"))
def gated_delta_rule_fwd_mosaic(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: Optional[jax.Array],
    beta: jax.Array,
    *,
    scale: Optional[float] = None,
    initial_state: Optional[jax.Array] = None,
    segment_ids: Optional[jax.Array] = None,
    return_residual: bool = False,
    wy_implementation: str = "mosaic",
    forward: str = "three_pass",
    interpret: bool = False,
):
    """Forward of Gated DeltaNet (``g``) or DeltaNet (``g=None``): the WY preparation
    (:func:`chunk_wy_mosaic`, or XLA), then :func:`chunk_delta_h_mosaic` and the scalar-decay
    :func:`pallas_kernels.simple_gla.kernel_mosaic_gpu.chunk_output_mosaic` on ``v_new``
    (module docstring).

    Computes, per batch row and value head (paper arXiv 2607.07953, Eqs. 15-17)::

        u_t = beta_t (v_t - e^{g_t} S_{t-1}^T k_t),   S_t = e^{g_t} S_{t-1} + k_t u_t^T,
        o_t = scale * S_t^T q_t

    with the state reset to zero at document starts.

    Args:
        q, k: ``[B, T, Hk, K]``, bf16 or fp16 (GVA when ``Hk < H``: value head ``h`` reads
            query/key head ``h // (H // Hk)``); used as given (L2-normalise them beforehand).
        v: ``[B, T, H, V]``, same dtype; ``K, V`` in {64, 128}.
        g: log-decay ``[B, T, H]`` (natural log, ``<= 0``; fp32 preferred) or ``None``.
        beta: write strengths ``[B, T, H]`` in ``(0, 1)``, any float dtype (used in fp32).
        scale: read-out scale (static); ``None`` means ``K ** -0.5``.
        initial_state: ``[B, H, K, V]`` or ``None`` (zeros); first document of each row only.
        segment_ids: optional int ``[B, T]`` (packed documents).
        return_residual: also return ``v_new`` (the residual ``u`` of the reference).
        wy_implementation: how ``W`` and ``U`` (``T0`` with ``forward="fused_t0"``) are
            formed (static): ``"mosaic"`` (default),
            the kernel :func:`chunk_wy_mosaic`; ``"xla"``, the fp32
            :func:`pallas_kernels.gated_delta_rule.chunked.wy_representation` in XLA (GVA keys
            repeated first) rounded to the input dtype, kept for comparison (at B 8, T 4,096,
            H 16, K = V = 128 it took 4.7 ms of the forward's 5.1 ms on an H200).
        forward: how the state pass and the output run after the WY preparation (static):
            ``"three_pass"`` (default), :func:`chunk_delta_h_mosaic` (writes ``h`` and
            ``v_new``) then ``chunk_output_mosaic`` (reads them back); ``"fused"``, one kernel,
            :func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu_fused.chunk_delta_fused_fwd_mosaic`
            (``h`` never reaches HBM, ``v_new`` only with ``return_residual``);
            ``"fused_split"``, the same kernel with the read-out on its own warpgroup
            (``split_output=True``). Same math and roundings. ``"fused_t0"``: the preparation
            forms only the gate-free inverse ``T0`` (:func:`chunk_kkt_inverse_mosaic`; with
            ``wy_implementation="xla"``, :func:`kkt_inverse_xla` rounded to the input dtype)
            and
            :func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu_fused.chunk_delta_fused_t0_fwd_mosaic`
            forms ``v_new = (T0 * e^{G_i - G_j} * beta_j) (V - diag(conn e^G) K S)`` inside
            (same math; ``T0`` rounded to the input dtype instead of ``W`` and ``U``).
            ``"fused_t0_split"``: the same with three warpgroups (``split_output=True``; the
            output warpgroup forms ``Ag = T0 * e^{G_i - G_j} * beta_j`` a chunk ahead,
            elementwise, rounded once to the input dtype). ``"fused_rs"`` (MOSAIC_GPU.md
            Sec. 56): the ``T0`` preparation, then
            :func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu_rs.chunk_delta_fused_rs_fwd_mosaic`
            (the state carried transposed in registers, jla's schedule; the roundings of
            ``"fused_t0_split"`` with ``state_layout="vk"``); with ``return_residual`` it runs
            ``"fused_t0"`` instead and logs why (:func:`rs_fallback`).
        interpret: Mosaic GPU interpret mode (CPU, tests).

    Returns:
        ``(o, final_state)``, or ``(o, final_state, v_new)`` with ``return_residual``: ``o`` and
        ``v_new`` ``[B, T, H, V]`` in the input dtype, ``final_state`` ``[B, H, K, V]`` fp32, as
        :func:`pallas_kernels.gated_delta_rule.reference.gated_delta_rule_reference` up to the
        16-bit rounding of ``W``, ``U``, ``v_new``, the chunk states and ``o``.

    Raises:
        ValueError: on a ``beta`` that is not ``[B, T, H]``, an unknown
            ``wy_implementation`` or ``forward``, and as :func:`chunk_wy_mosaic`,
            :func:`chunk_delta_h_mosaic` and ``chunk_output_mosaic`` (or the fused kernel).
    """
    batch, seq_len, kv_heads, dk = k.shape
    heads = v.shape[2]
    if scale is None:
        scale = dk ** -0.5
    if beta.shape != (batch, seq_len, heads):
        raise ValueError(f"beta must be [B, T, H] = {(batch, seq_len, heads)}, got {beta.shape=}")
    if wy_implementation not in WY_IMPLEMENTATIONS:
        raise ValueError(f"wy_implementation must be one of {WY_IMPLEMENTATIONS}, got "
                         f"{wy_implementation!r}")
    if forward not in FORWARDS:
        raise ValueError(f"forward must be one of {FORWARDS}, got {forward!r}")
    mgl.check_kv_gates(k, v, g, segment_ids)
    if forward == "fused_rs" and return_residual:
        forward = rs_fallback("return_residual=True")
    if forward in ("fused_t0", "fused_t0_split", "fused_rs"):
        if wy_implementation == "mosaic":
            t0 = chunk_kkt_inverse_mosaic(k, beta, segment_ids=segment_ids, interpret=interpret,
                                          **T0_OPTIONS)
        else:
            with jax.named_scope("gdn_kkt_inverse"):
                t0 = kkt_inverse_xla(k, beta, segment_ids=segment_ids).astype(k.dtype)
        if forward == "fused_rs":
            return krs.chunk_delta_fused_rs_fwd_mosaic(
                q, k, v, t0, g, beta, scale=scale, initial_state=initial_state,
                segment_ids=segment_ids, interpret=interpret)
        o, final_state, v_new, _ = kfused.chunk_delta_fused_t0_fwd_mosaic(
            q, k, v, t0, g, beta, scale=scale, initial_state=initial_state,
            segment_ids=segment_ids, store_v_new=return_residual,
            split_output=forward == "fused_t0_split", interpret=interpret,
            **(SPLIT_T0_OPTIONS if forward == "fused_t0_split" else {}))
        return (o, final_state, v_new) if return_residual else (o, final_state)
    if wy_implementation == "mosaic":
        w, u = chunk_wy_mosaic(k, v, g, beta, segment_ids=segment_ids, interpret=interpret)
    else:
        with jax.named_scope("gdn_wy_prepare"):
            # W and U per value head in fp32 (GVA keys repeated, as FLA's repeat_interleave),
            # then rounded once to the input dtype: they are TMA inputs and wgmma operands.
            k_heads = jnp.repeat(k, heads // kv_heads, axis=2)
            w, u = chunked.wy_representation(k_heads, v, g, beta, segment_ids=segment_ids,
                                             chunk_size=CHUNK)
            w, u = w[:, :seq_len].astype(k.dtype), u[:, :seq_len].astype(v.dtype)
    if forward != "three_pass":
        o, final_state, v_new, _ = kfused.chunk_delta_fused_fwd_mosaic(
            q, k, w, u, g, scale=scale, initial_state=initial_state, segment_ids=segment_ids,
            store_v_new=return_residual, split_output=forward == "fused_split",
            interpret=interpret)
        return (o, final_state, v_new) if return_residual else (o, final_state)
    # h only feeds chunk_output_mosaic's wgmma: stored in the input dtype.
    h, v_new, final_state = chunk_delta_h_mosaic(k, w, u, g, initial_state=initial_state,
                                                 segment_ids=segment_ids,
                                                 states_dtype=v.dtype, interpret=interpret)
    o = sg.chunk_output_mosaic(q, k, v_new, g, h, scale=scale, segment_ids=segment_ids,
                               interpret=interpret)
    return (o, final_state, v_new) if return_residual else (o, final_state)


# ----------------------------------------------------------------------------------------------
# Backward: the reverse delta state pass.


def _delta_dstate_kernel(q_ref, k_ref, w_ref, do_ref, *rest, num_chunks: int, group: int,
                         scale: float, has_dht: bool, fp32_states: bool, pieces: int, store: bool,
                         fold: bool, has_du: bool, interpret: bool, w_t0: bool = False,
                         skip: bool = False):
    """Kernel body of :func:`chunk_delta_dh_mosaic`; refs are GMEM.

    ``rest`` = ``[dvl_ref,] g_ref, last_ref, conn_ref, [doc_ref,] [dht_ref,] [dh_ref,
    dvn_ref,] dh0_ref`` then the scratch (``dh``, ``dv_new`` only with ``store``; ``dvl_ref``
    is ``dv_local`` without ``fold``, the residual's cotangent ``du`` with ``fold`` and
    ``has_du``, absent otherwise; ``doc_ref`` only with ``fold``). ``ds_s`` (``dS`` in 16 bits)
    is the right operand of ``K dS``; it is also the staging tile of ``dh`` when ``dh`` is
    stored in the input dtype, while fp32 ``dh`` goes out through ``state_s``. With
    ``pieces = P > 1`` the inputs are ``P`` pieces of ``num_chunks`` chunks per row as
    ``B * P`` rows (grid axis ``b`` is ``row * P + piece``): ``dht``, ``dh0`` and ``dv_new`` are
    per piece, ``dh`` is written at the row's global chunk index.

    With ``fold`` (MOSAIC_GPU.md Sec. 32) a third warpgroup (``wg == 2``) forms ``dv_local``
    of every chunk itself, ``scale (Q K^T * D)^T do`` for the CTA's 64 value columns (plus
    ``du``, in fp32), and publishes it rounded to the input dtype in the ring's ``dvl_s`` slot
    (where ``du`` landed, or the TMA copy of ``dv_local`` lands without ``fold``) on
    ``dvl_ready[slot]``; the state warpgroup reads it there as before.

    With ``w_t0`` (``fold`` only; MOSAIC_GPU.md Sec. 51) ``w_ref`` is the gate-free inverse
    ``T0`` ``[B, Tp, H, 64]`` and ``rest`` holds ``bc_ref`` (``beta conn``, fp32 ``[B, H, Tp]``)
    after ``conn_ref``: the ring carries ``T0`` (``t0_s``) and ``beta conn`` as columns
    (``bcc_s``) instead of ``W``, and the third warpgroup, after publishing ``dv_local``, forms
    ``W = diag(e^G) (T0 diag(beta conn)) K`` (the product's left factor split into 16-bit
    ``hi + lo`` register operands, fp32 accumulation, rounded once), writes it into the ring's
    ``w_s`` slot and arrives on ``w_ready[slot]``; the state warpgroup waits there before its
    ``W^T dv_new`` product. The slot is rewritten only after both warpgroups released the
    stage (as ``dvl_s``).

    ``skip`` (MOSAIC_GPU.md Sec. 52): ``lo_ref`` int32 ``[B * P]`` follows the inputs; row
    ``b`` loads and runs only its steps ``lo[b] ..`` (chunks ``N - 1 - lo[b]`` down to 0) from
    its exit gradient (with ``store=False``, a piece's ``Y_p`` from zero: nothing leaving the
    chunk of its first document start reaches its entry).
    """
    rest = list(rest)
    dvl_ref = rest.pop(0) if (has_du or not fold) else None
    g_ref, last_ref, conn_ref = rest.pop(0), rest.pop(0), rest.pop(0)
    bc_ref = rest.pop(0) if w_t0 else None
    doc_ref = rest.pop(0) if fold else None
    dht_ref = rest.pop(0) if has_dht else None
    lo_ref = rest.pop(0) if skip else None
    dh_ref, dvn_ref = (rest.pop(0), rest.pop(0)) if store else (None, None)
    (dh0_ref, q_s, k_s, w_s, do_s, dvl_s, g_s, last_s, conn_s, dod_s, dvn_s,
     dvneg_s, state_s, ds_s, in_bar, in_free, io_bar, done, *extra) = rest
    if fold:  # g's column copy, doc's row and column copies, dvl_ready
        gcol_s, docr_s, docc_s, dvl_ready, *extra = extra
    if w_t0:  # the T0 ring, beta conn as columns, w_ready (W formed by wg 2 into w_s)
        t0_s, bcc_s, w_ready, *extra = extra
    qt_s, wt_s = extra[:2] if interpret else (None, None)
    qt2_s, pt_s = extra[2:4] if interpret and fold else (None, None)  # wg 2's shims
    wh_s, wl_s = extra[4:6] if interpret and w_t0 else (None, None)  # W's left operands
    dhst_s = state_s if fp32_states else ds_s  # staging of the stored dh
    b, h, iv = lax.axis_index("b"), lax.axis_index("h"), lax.axis_index("v")
    b_out, n_base = lax.div(b, pieces), lax.rem(b, pieces) * num_chunks  # dh's row, 1st chunk
    hk = lax.div(h, group)  # GVA: value head h reads query/key head h // group
    cols = pl.ds(iv * BLOCK_V, BLOCK_V)
    wg = lax.axis_index("wg")
    dk = q_s.shape[-1]
    lo = 0 if lo_ref is None else lo_ref[b]  # skip: the first step (all warpgroups)

    @pl.when(wg == 1)
    def _memory():
        plgpu.set_max_registers(DH_FOLD_REGISTERS[1] if fold else 40, action="decrease")

        def issue(i, slot):  # step i reads chunk N - 1 - i
            rows = pl.ds((num_chunks - 1 - i) * CHUNK, CHUNK)
            bar = in_bar.at[slot]
            plgpu.copy_gmem_to_smem(q_ref.at[b, rows, hk], q_s.at[slot], bar)
            plgpu.copy_gmem_to_smem(k_ref.at[b, rows, hk], k_s.at[slot], bar)
            if w_t0:  # T0 and beta conn (columns); wg 2 forms W into w_s
                plgpu.copy_gmem_to_smem(w_ref.at[b, rows, h], t0_s.at[slot], bar)
                plgpu.copy_gmem_to_smem(bc_ref.at[b, h, rows], bcc_s.at[slot], bar)
            else:
                plgpu.copy_gmem_to_smem(w_ref.at[b, rows, h], w_s.at[slot], bar)
            plgpu.copy_gmem_to_smem(do_ref.at[b, rows, h, cols], do_s.at[slot], bar)
            if dvl_ref is not None:  # dv_local, or (fold) du into the slot wg 2 publishes in
                plgpu.copy_gmem_to_smem(dvl_ref.at[b, rows, h, cols], dvl_s.at[slot], bar)
            plgpu.copy_gmem_to_smem(g_ref.at[b, h, rows], g_s.at[slot], bar)
            plgpu.copy_gmem_to_smem(last_ref.at[b, rows], last_s.at[slot], bar)
            plgpu.copy_gmem_to_smem(conn_ref.at[b, rows], conn_s.at[slot], bar)
            if fold:  # the row / column copies of the gate and document ids for D^T
                plgpu.copy_gmem_to_smem(g_ref.at[b, h, rows], gcol_s.at[slot], bar)
                plgpu.copy_gmem_to_smem(doc_ref.at[b, rows], docr_s.at[slot], bar)
                plgpu.copy_gmem_to_smem(doc_ref.at[b, rows], docc_s.at[slot], bar)

        if lo_ref is None:
            mgl.ring_producer(issue, num_chunks, in_free)
        else:
            mgl.ring_producer_from(issue, lo, num_chunks, in_free)

    if fold:
        @pl.when(wg == 2)
        def _dv_local():
            plgpu.set_max_registers(DH_FOLD_REGISTERS[2], action="increase")

            def _form_w(slot):
                """``W = diag(e^G) (T0 diag(beta conn)) K`` into ``w_s[slot]``: the
                ``T0`` kernel's ``W`` (``_kkt_inverse_kernel``'s ``store_w``) from the
                rounded ``T0``; ``hi + lo`` keeps ``T0_ij beta_j conn_j`` to 16 more bits."""
                k_c = k_s.at[slot]
                t = mgl.load_tile(t0_s.at[slot], interpret).astype(jnp.float32)
                bc = mgl.load_cols(bcc_s.at[slot], interpret)
                t = t * lax.broadcast_in_dim(bc, t.shape, [1])
                hi = t.astype(k_c.dtype)
                lo = (t - hi.astype(jnp.float32)).astype(k_c.dtype)
                hi = mgl.lhs_operand(hi, wh_s, interpret)
                lo = mgl.lhs_operand(lo, wl_s, interpret)

                def w_product(acc):  # (T0 diag(beta conn)) K, hi + lo, [C, K]
                    plgpu.wgmma(acc, hi, k_c)
                    plgpu.wgmma(acc, lo, k_c)
                    return acc[...]

                # The barrier keeps the arithmetic after the accumulator read (jla's pitfall).
                w = lax.optimization_barrier(pl.run_scoped(w_product, plgpu.ACC((CHUNK, dk))))
                g_i = mgl.load_rows(g_s.at[slot], interpret)
                w_s[slot] = (w * mgl.by_row(jnp.exp(g_i), w.shape)).astype(w_s.dtype)
                plgpu.commit_smem()
                plgpu.barrier_arrive(w_ready.at[slot])

            @pl.loop(lo, num_chunks)
            def _step(i):
                slot = lax.rem(i, STAGES)
                plgpu.barrier_wait(in_bar.at[slot])
                q_t = mgl.transposed(q_s.at[slot], qt2_s, interpret)

                def scores(acc):
                    plgpu.wgmma(acc, k_s.at[slot], q_t)  # K Q^T = (Q K^T)^T, [C, C]
                    return acc[...]

                # The barrier keeps the arithmetic after the accumulator read (jla's pitfall).
                kq = lax.optimization_barrier(pl.run_scoped(scores, plgpu.ACC((CHUNK, CHUNK))))
                decay_t, _ = kbwd._intra_chunk_decay(g_s.at[slot], gcol_s.at[slot],
                                                     docr_s.at[slot], docc_s.at[slot],
                                                     interpret, transpose=True)
                pt = (kq * (scale * decay_t)).astype(do_s.dtype)  # P^T, the left operand

                def product(acc):
                    plgpu.wgmma(acc, mgl.lhs_operand(pt, pt_s, interpret), do_s.at[slot])
                    return acc[...]

                dvl = lax.optimization_barrier(
                    pl.run_scoped(product, plgpu.ACC((CHUNK, BLOCK_V))))  # P^T do, fp32
                if has_du:  # du landed in the slot; the sum is rounded once
                    dvl = dvl + mgl.load_tile(dvl_s.at[slot], interpret).astype(jnp.float32)
                dvl_s[slot] = dvl.astype(dvl_s.dtype)
                plgpu.commit_smem()
                plgpu.barrier_arrive(dvl_ready.at[slot])
                if w_t0:  # W of this chunk from T0, off the state warpgroup's chain
                    _form_w(slot)
                plgpu.barrier_arrive(in_free.at[slot])  # q, k, do, the vectors read

    @pl.when(wg == 0)
    def _state():
        plgpu.set_max_registers(DH_FOLD_REGISTERS[0] if fold else 232, action="increase")
        if has_dht:
            plgpu.copy_gmem_to_smem(dht_ref.at[b, h, :, cols], state_s, io_bar)
            plgpu.barrier_wait(io_bar)
            d0 = mgl.load_tile(state_s, interpret)
        else:
            d0 = mgl.zeros_acc((dk, BLOCK_V), interpret)

        def step(i, d):
            n = num_chunks - 1 - i
            slot = lax.rem(i, STAGES)
            rows = pl.ds(n * CHUNK, CHUNK)
            # The stores of step i - 1 (dh, dv_new) must have read their tiles; its wgmma
            # reading ds_s, dvneg_s and dod_s finished when their accumulators were read.
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)
            ds_s[...] = d.astype(ds_s.dtype)
            if fp32_states and store:
                state_s[...] = d
            plgpu.commit_smem()
            if store:  # dS', the gradient of the state leaving chunk n, goes to HBM as dh[n]
                plgpu.copy_smem_to_gmem(dhst_s, dh_ref.at[b_out, h, n_base + n, :, cols])
            plgpu.barrier_wait(in_bar.at[slot])

            def k_dstate(acc):
                plgpu.wgmma(acc, k_s.at[slot], ds_s)  # K dS', [C, 64], fp32 accumulation
                return acc[...]

            # The barrier keeps the arithmetic after the accumulator read (jla's pitfall).
            kds = lax.optimization_barrier(pl.run_scoped(k_dstate, plgpu.ACC((CHUNK, BLOCK_V))))
            g = mgl.load_rows(g_s.at[slot], interpret)  # chunk-local cumsum of log-decay, fp32
            g_last = g_s[slot, CHUNK - 1]
            # Token s reaches the state leaving the chunk as last_s e^{G_L - G_s} (<= 1); the
            # incoming state reaches token t as conn_t e^{G_t}.
            k_decay = jnp.exp(g_last - g) * mgl.load_rows(last_s.at[slot], interpret)
            q_decay = scale * jnp.exp(g) * mgl.load_rows(conn_s.at[slot], interpret)
            d_decay = jnp.exp(g_last) * conn_s[slot, CHUNK - 1]  # keep: 0 if a document starts
            if fold:  # wg 2 has published this chunk's dv_local (+ du) in the slot
                plgpu.barrier_wait(dvl_ready.at[slot])
            dvl = mgl.load_tile(dvl_s.at[slot], interpret).astype(jnp.float32)
            dvn = dvl + kds * mgl.by_row(k_decay, kds.shape)  # total dv_new, fp32
            do = mgl.load_tile(do_s.at[slot], interpret).astype(jnp.float32)
            if store:
                dvn_s[...] = dvn.astype(dvn_s.dtype)
            dvneg_s[...] = (-dvn).astype(dvneg_s.dtype)
            dod_s[...] = (do * mgl.by_row(q_decay, do.shape)).astype(dod_s.dtype)
            plgpu.commit_smem()
            if store:
                plgpu.copy_smem_to_gmem(dvn_s, dvn_ref.at[b, rows, h, cols])
            q_t = mgl.transposed(q_s.at[slot], qt_s, interpret)  # copies if interpreting
            if w_t0:  # wg 2 has written this chunk's W into the slot
                plgpu.barrier_wait(w_ready.at[slot])
            w_t = mgl.transposed(w_s.at[slot], wt_s, interpret)

            def update(acc):
                plgpu.wgmma(acc, q_t, dod_s)  # scale Q^T (conn e^G do)
                plgpu.wgmma(acc, w_t, dvneg_s)  # - W^T dv_new, same accumulator
                return acc[...]

            # A fresh accumulator plus the decayed carry (no run_state in the 0.10.2
            # interpreter); the barrier keeps the add after the accumulator read.
            upd = lax.optimization_barrier(pl.run_scoped(update, plgpu.ACC((dk, BLOCK_V))))
            plgpu.barrier_arrive(in_free.at[slot])
            return d * d_decay + upd

        d = lax.fori_loop(lo, num_chunks, step, d0)
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)
        state_s[...] = d
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(state_s, dh0_ref.at[b, h, :, cols])
        plgpu.wait_smem_to_gmem(0)

    # All warpgroups leave together (an early exit while another issues wgmma is unsafe).
    plgpu.barrier_arrive(done)
    plgpu.barrier_wait(done)


# setmaxnreg of the folded reverse pass's warpgroups (state, memory, dv_local): the launch
# share at 384 threads is 168, and the three sum to 3 x 168 (MOSAIC_GPU.md Sec. 32).
DH_FOLD_REGISTERS = (232, 40, 232)


@functools.partial(jax.jit, static_argnames=("scale", "states_dtype", "pieces", "fold_dv_local",
                                             "w_from_t0", "interpret", "piece_skip"))
def chunk_delta_dh_mosaic(
    q: jax.Array,
    k: jax.Array,
    w: jax.Array,
    do: jax.Array,
    dv_local: Optional[jax.Array],
    g: Optional[jax.Array],
    *,
    scale: float,
    final_state_grad: Optional[jax.Array] = None,
    segment_ids: Optional[jax.Array] = None,
    gate_cumsum: Optional[jax.Array] = None,
    doc_vecs: Optional[Tuple[jax.Array, jax.Array, jax.Array]] = None,
    states_dtype=jnp.float32,
    pieces: Optional[int] = None,
    piece_maps: Optional[jax.Array] = None,
    fold_dv_local: bool = False,
    residual_grad: Optional[jax.Array] = None,
    w_from_t0: bool = False,
    beta: Optional[jax.Array] = None,
    interpret: bool = False,
    piece_skip: bool = False,
) -> Tuple[jax.Array, jax.Array, jax.Array]:
    """The reverse delta state pass: state gradients of every chunk, total ``dv_new``, ``dh0``.

    The backward of :func:`chunk_delta_h_mosaic` with the read-out, as a Mosaic GPU kernel: the
    counterpart of FLA's ``chunk_gated_delta_rule_bwd_dhu`` (``fla/ops/common/chunk_delta_h.py``)
    and of ``_backward_state_kernel`` in :mod:`pallas_kernels.gated_delta_rule.kernel_gpu`
    (the Triton reverse pass; same terms, same masks). In the chunk form (module docstring;
    ``kernel_gpu.py``'s "Backward algebra"), per batch row, value head and chunk ``c`` of 64
    tokens with entry state ``S_c``, ``G`` the chunk-local inclusive cumulative log-decay (fp32)
    and ``G_L`` its last entry::

        v_new_c = U_c - W_c S_c
        o_c     = scale (diag(conn e^G) Q_c S_c + (Q_c K_c^T * D) v_new_c)
        S_{c+1} = keep_c e^{G_L} S_c + (diag(last e^{G_L - G}) K_c)^T v_new_c

    so with ``dS'_c = dL/dS_{c+1}`` (the gradient of the state *leaving* chunk ``c``;
    ``final_state_grad`` for the last chunk) the chain rule runs, for ``c = N - 1, ..., 0``::

        dv_new_c = dv_local_c + diag(last e^{G_L - G}) K_c dS'_c                   ([64, V])
        dS'_{c-1} = keep_c e^{G_L} dS'_c + scale (diag(conn e^G) Q_c)^T do_c - W_c^T dv_new_c

    (all fp32), where ``dv_local_c = dL/dv_new_c`` through the chunk's own read-out, i.e.
    ``scale (Q_c K_c^T * D)^T do_c``, plus any direct cotangent of the returned residual
    ``v_new`` (``kernel_gpu.py``'s ``dvn_in``): the caller forms it (it needs the ``[C, C]``
    mask, a parallel per-chunk product). ``D_ts = e^{G_t - G_s}`` on causal same-document
    pairs; ``conn_t`` is 1 on the tokens of the document open before the chunk, ``last_s`` 1
    on the chunk's last document, ``keep_c = conn`` of its last token (0 when a document starts
    inside the chunk). ``W``'s rows already carry ``conn`` (``W = T diag(beta conn e^G) K``), so
    ``-W^T dv_new`` needs no mask. ``dS'_{-1}`` is the gradient w.r.t. ``initial_state``, which
    reaches only the first document. ``dv_new`` is the total gradient of ``v_new``, from
    which the caller gets ``dU`` (``= dv_new``) and ``dW = -dv_new S_c^T``; the per-chunk
    ``dS'`` gives ``dk += last e^{G_L - G} v_new dS'^T`` etc. (``kernel_gpu.py``'s
    ``_backward_chunk_kernel``). All are per value head; GVA sums over a group are the
    caller's.

    Kernel structure, :func:`chunk_delta_h_mosaic`'s in reverse chunk order: one CTA per
    ``(b, h, 64 value columns)``, two warpgroups. The memory warpgroup streams ``q``, ``k``
    (key head ``h // group``), ``w``, ``do``, ``dv_local`` (value head ``h``) and the gate,
    ``last`` and ``conn`` vectors of chunks ``N - 1, ..., 0`` into a two-stage TMA ring (8
    copies per stage). The state warpgroup keeps ``dS'`` (``[K, 64]`` fp32) in registers; per
    chunk it stores it as ``dh[c]`` through an SMEM tile (the 16-bit one is also the right
    operand of ``wgmma(K, dS')``), forms ``dv_new`` in fp32 (the ``last e^{G_L - G}`` row
    factor is applied to the fp32 product, not to ``K``), stores it (input dtype), and adds
    ``wgmma(Q^T, scale conn e^G do) + wgmma(W^T, -dv_new)`` (one accumulator; ``Q^T``,
    ``W^T`` transposed SMEM operands, copies when interpreting) to ``keep e^{G_L} dS'``.
    SMEM at K = V = 128: about 200 KB.

    With ``fold_dv_local`` (MOSAIC_GPU.md Sec. 32; jla's ``state_bwd_wy`` does the same in a
    second warpgroup) the pass forms ``dv_local`` itself instead of reading it:
    ``dv_local_c = scale (Q_c K_c^T * D)^T do_c + du_c`` (FLA's ``chunk_bwd_dv_local``, as
    :func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu_bwd.chunk_dv_local_mosaic`
    computes it), so that kernel's launch and its ``[B, T, H, V]`` round trip through HBM go
    away. A third warpgroup, fed by the same ring (plus the row and column copies of the gate
    and document vectors for ``D``), runs per chunk ``wgmma(K, Q^T)`` (``[64, 64]``, fp32),
    ``P^T = K Q^T * scale D^T`` rounded once to the input dtype (a register operand),
    ``wgmma(P^T, do)`` for the CTA's 64 value columns, adds ``du`` (``residual_grad``, TMA'd
    into the ring slot) in fp32, and publishes the sum rounded once to the input dtype in that
    slot: the same roundings as the separate kernel, so ``dv_new``, ``dh`` and ``dh0`` match
    the unfolded pass up to the order of fp32 sums. 384 threads, ``setmaxnreg``
    :data:`DH_FOLD_REGISTERS`. With ``V = 128`` each of the two value-column CTAs forms
    ``K Q^T`` (2 x 64x64xK more products than the separate kernel).

    With ``w_from_t0`` (and ``fold_dv_local``; MOSAIC_GPU.md Sec. 51; jla's ``state_bwd``
    likewise reads only ``T0``) the ``w`` argument is the gate-free inverse ``T0``
    ``[B, T, H, 64]`` of :func:`chunk_kkt_inverse_mosaic` and the pass forms ``W`` per chunk
    itself, in the ``dv_local`` warpgroup after it published ``dv_local``::

        W_i = e^{G_i} sum_j T0_ij beta_j conn_j k_j      (W = T diag(beta conn e^G) K)

    the definition of ``chunk_kkt_inverse_mosaic(return_w=True)``: ``T0 diag(beta conn)`` in
    fp32 split into 16-bit ``hi + lo`` register operands, two ``[64, 64] x [64, K]``
    ``wgmma`` into one fp32 accumulator, rows scaled by ``e^G``, rounded once to the input
    dtype into the ring's ``w_s`` slot (a new barrier ``w_ready`` per stage; the state
    warpgroup waits on it just before ``W^T dv_new``). The one difference from that kernel's
    ``W``: it starts from the fp32 ``T0``, this from ``T0`` rounded to the input dtype (the
    residual), i.e. :func:`w_from_t0`'s ``W`` (interpreted, relative RMS against the fp32 WY
    factor 1.735e-3 against 1.677e-3 at bf16, MOSAIC_GPU.md Sec. 36). The ring reads 8 KB of
    ``T0`` per chunk instead of ``K / 64`` x 8 KB of ``W``, plus one 256-byte vector; the
    forward's ``T0`` kernel need not write ``W`` (0.058 ms at S1 on an H100). Two more
    ``[64, 64] x [64, K]`` products per chunk in the ``dv_local`` warpgroup (per value-column
    CTA). SMEM +16.5 KB (the ``T0`` ring; ``w_s`` stays, written by the warpgroup).

    Args:
        q: queries ``[B, T, Hk, K]``, bf16 or fp16; ``H % Hk == 0`` (value head ``h`` reads
            query/key head ``h // (H // Hk)``).
        k: keys ``[B, T, Hk, K]``, q's shape and dtype.
        w: ``W = T diag(beta conn e^G) K`` ``[B, T, H, K]`` per value head, q's dtype (the
            forward's operand, :func:`chunk_delta_h_mosaic`).
        do: output gradient ``[B, T, H, V]``, q's dtype. ``K, V`` in {64, 128}.
        dv_local: ``[B, T, H, V]``, q's dtype: the gradient of ``v_new`` through the chunk's
            own read-out (and the residual's cotangent), see above; ``None`` with
            ``fold_dv_local`` (required then).
        g: per-token log-decay ``[B, T, H]`` (natural log, ``<= 0``), or ``None`` (DeltaNet).
        scale: read-out scale of the forward (static).
        final_state_grad: ``[B, H, K, V]`` gradient w.r.t. the final state (read as fp32), or
            ``None`` for zeros.
        segment_ids: optional int ``[B, T]``; documents start wherever the id changes.
        states_dtype: dtype of the stored ``dh`` (static): fp32 (default) or the input dtype
            (when ``dh`` only feeds ``wgmma`` operands). The carried ``dS'`` is fp32 in
            registers either way; ``K dS'`` reads it rounded to the input dtype.
        doc_vecs: optional ``(doc, conn, last)``, fp32 ``[B, Tp]`` each, as
            :func:`pallas_kernels.common.mosaic_gpu_lib.doc_vectors` gives them for
            ``segment_ids``, formed once by a caller that runs several kernels (``mosaic_vjp``);
            ``None``: formed here.
        gate_cumsum: optional fp32 ``[B, H, Tp]`` (``Tp = 64 ceil(T / 64)``), ``g``'s
            chunk-local cumsum as :func:`pallas_kernels.common.mosaic_gpu_lib.chunk_cumsum`
            gives it, computed once by a caller that runs several kernels on one ``g``
            (``mosaic_vjp``); ``None``: computed here.
        pieces: static; sequence pieces ``P`` per row, as :func:`chunk_delta_h_mosaic`'s
            (``None``: the same choice, :func:`pallas_kernels.common.mosaic_gpu_lib.num_pieces`).
            With ``P > 1`` the reverse pass of a piece maps its exit gradient affinely,
            ``d -> M_p^T d + Y_p`` (``M_p`` the forward piece map): one launch from zero exit
            gradients gives every ``Y_p`` (storing nothing else), an XLA loop from the last
            piece the exit gradients, and a second launch stores ``dh`` and ``dv_new``.
        piece_maps: the forward's piece maps ``[B, P, H, K, K]`` fp32
            (:func:`chunk_delta_h_mosaic` with ``return_maps``), or ``None`` to compute them
            here (one more launch); ignored when ``P = 1``.
        fold_dv_local: static; form ``dv_local`` in the pass (above) instead of reading it.
            Covers gated and DeltaNet, GVA, documents, ``final_state_grad`` and the sequence
            pieces (both launches form it).
        residual_grad: optional ``[B, T, H, V]`` in ``do``'s dtype, the cotangent ``du`` of the
            residual ``u = v_new``, added to the folded ``dv_local`` in fp32; only with
            ``fold_dv_local`` (without it, add it to ``dv_local``, as
            ``chunk_dv_local_mosaic(residual_grad=)`` does).
        w_from_t0: static; ``w`` is ``T0`` ``[B, T, H, 64]`` (q's dtype) and the pass forms
            ``W`` from it (above). Needs ``fold_dv_local`` and ``beta``; with sequence pieces
            (``P > 1``) also ``piece_maps`` (the maps would need ``W``).
        beta: write strengths ``[B, T, H]`` (read as fp32), only with ``w_from_t0``.
        interpret: run the kernel in Mosaic GPU interpret mode (CPU; slow, for tests).
        piece_skip: static (MOSAIC_GPU.md Sec. 52); with sequence pieces and documents
            (``segment_ids`` or ``doc_vecs``): the launch from a zero exit gradient (``Y_p``)
            runs each piece's chunks from the one of its first document start down to its
            first chunk only (kernel ``..._pieces_skip``; nothing leaving that chunk reaches
            the piece's entry: ``A_c^T = 0`` there), and maps formed here skip as
            :func:`chunk_delta_piece_maps_mosaic` does. Exact up to the sign of zeros.

    Returns:
        ``(dh, dv_new, dh0)``: ``dh`` ``[B, H, N, K, V]`` in ``states_dtype`` (the layout of
        the forward's ``h``; ``N = ceil(T / 64)``), ``dh[:, :, c]`` the gradient w.r.t. the
        state *leaving* chunk ``c`` (paired with ``h[:, :, c]``, the state entering it, as in
        FLA and ``kernel_gpu.py``; ``final_state_grad`` or zeros for the last chunk);
        ``dv_new`` ``[B, T, H, V]`` in the input dtype, the total gradient of ``v_new``;
        ``dh0`` ``[B, H, K, V]`` fp32, the gradient w.r.t. ``initial_state``. Exact up to the
        16-bit rounding of the ``wgmma`` operands (``dS'`` in ``K dS'``,
        ``scale conn e^G do``, ``dv_new``) with fp32 accumulation.

    Raises:
        ValueError: on mismatched shapes or dtypes of ``q, k, w, do, dv_local``, unsupported
            head dims or dtypes, ``H`` not a multiple of ``Hk``, a bad ``g``,
            ``segment_ids``, ``final_state_grad`` or ``piece_maps`` shape, a ``states_dtype``
            that is neither fp32 nor the input dtype, ``pieces`` not a positive divisor of
            ``ceil(T / 64)``, a ``dv_local`` given with ``fold_dv_local`` or missing without it,
            or a ``residual_grad`` without ``fold_dv_local`` or not of ``do``'s shape and dtype,
            ``w_from_t0`` without ``fold_dv_local``, without a ``[B, T, H]`` ``beta`` or (with
            ``P > 1``) without ``piece_maps``, or a ``beta`` without ``w_from_t0``.
    """
    batch, seq_len, kv_heads, dk = q.shape
    heads, dv = do.shape[2], do.shape[3]
    mgl.check_kv_gates(q, do, g, segment_ids, names=("q", "do"))
    if k.shape != q.shape or k.dtype != q.dtype:
        raise ValueError(f"k must have q's shape {q.shape} and dtype {q.dtype}, got {k.shape=} "
                         f"{k.dtype=}")
    w_cols, w_name = (CHUNK, "T0 (w_from_t0)") if w_from_t0 else (dk, "K")
    if w.shape != (batch, seq_len, heads, w_cols) or w.dtype != q.dtype:
        raise ValueError(f"w must be [B, T, H, {w_name}] = {(batch, seq_len, heads, w_cols)} in "
                         f"q's dtype {q.dtype}, got {w.shape=} {w.dtype=}")
    if w_from_t0 and not fold_dv_local:
        raise ValueError("w_from_t0=True forms W in the dv_local warpgroup: it needs "
                         "fold_dv_local=True")
    if w_from_t0 and (beta is None or beta.shape != (batch, seq_len, heads)):
        raise ValueError(f"w_from_t0=True needs beta [B, T, H] = {(batch, seq_len, heads)}, got "
                         f"{None if beta is None else beta.shape}")
    if beta is not None and not w_from_t0:
        raise ValueError("beta is read only with w_from_t0=True")
    if fold_dv_local and dv_local is not None:
        raise ValueError("fold_dv_local=True forms dv_local in the pass: pass dv_local=None "
                         "(and the residual's cotangent as residual_grad)")
    if not fold_dv_local and dv_local is None:
        raise ValueError("dv_local is required unless fold_dv_local=True")
    if not fold_dv_local and residual_grad is not None:
        raise ValueError("residual_grad needs fold_dv_local=True (else add it to dv_local)")
    dvl_in = residual_grad if fold_dv_local else dv_local  # what the ring loads, or None
    if dvl_in is not None and (dvl_in.shape != do.shape or dvl_in.dtype != do.dtype):
        name = "residual_grad" if fold_dv_local else "dv_local"
        raise ValueError(f"{name} must have do's shape {do.shape} and dtype {do.dtype}, got "
                         f"{dvl_in.shape=} {dvl_in.dtype=}")
    states_dtype = mgl.check_states_dtype(states_dtype, q.dtype)
    if final_state_grad is not None and final_state_grad.shape != (batch, heads, dk, dv):
        raise ValueError(f"final_state_grad must be [B, H, K, V] = {(batch, heads, dk, dv)}, "
                         f"got {final_state_grad.shape=}")

    num_chunks = -(-seq_len // CHUNK)
    pieces = mgl.num_pieces(pieces, batch * heads * (dv // BLOCK_V), num_chunks)
    maps_shape = (batch, pieces, heads, dk, dk)
    if pieces > 1 and piece_maps is not None and piece_maps.shape != maps_shape:
        raise ValueError(f"piece_maps must be [B, P, H, K, K] = {maps_shape}, got "
                         f"{piece_maps.shape=}")
    if pieces > 1 and w_from_t0 and piece_maps is None:
        raise ValueError("w_from_t0=True with sequence pieces needs piece_maps (the forward's; "
                         "forming them here would need W)")
    # Padding tokens have q = k = w = do = dv_local = 0 and g = 0: dv_new = 0 there and dS'
    # passes through unchanged.
    q, k, w, do = (mgl.pad_time(x, num_chunks) for x in (q, k, w, do))
    dvl_in = None if dvl_in is None else mgl.pad_time(dvl_in, num_chunks)
    gc = mgl.chunk_cumsum(g, (batch, seq_len, heads), num_chunks, gate_cumsum)  # [B, H, Tp]
    doc, conn, last = mgl.doc_vectors(segment_ids, batch, num_chunks, doc_vecs)  # [B, Tp] each
    doc = doc if fold_dv_local else None  # the same-document mask of D, folded pass only
    # w_from_t0: beta conn, head-major [B, H, Tp] fp32 (one fusion with beta's transpose)
    bc = (jnp.moveaxis(mgl.pad_time(beta.astype(jnp.float32), num_chunks), 1, 2)
          * conn[:, None, :]) if w_from_t0 else None
    dht = None if final_state_grad is None else final_state_grad.astype(jnp.float32)
    run = functools.partial(_delta_dh_call, group=heads // kv_heads, scale=float(scale),
                            pieces=pieces, states_dtype=states_dtype, interpret=interpret)
    with jax.named_scope("gdn_chunk_delta_dh_mosaic"):
        if pieces == 1:
            dh, dvn, dh0 = run(q, k, w, do, dvl_in, gc, last, conn, doc, dht, bc=bc)
            return dh, dvn[:, :seq_len], dh0
        # Sequence pieces: each piece's reverse map d -> M_p^T d + Y_p (Y_p from a zero exit
        # gradient, storing nothing else), the exit gradients by a loop from the last piece,
        # then the pieces as rows from their exit gradients.
        qp, kp, wp, dop, lastp, connp = (mgl.split_rows(x, pieces)
                                         for x in (q, k, w, do, last, conn))
        dvlp, docp = (None if x is None else mgl.split_rows(x, pieces) for x in (dvl_in, doc))
        gp = mgl.split_head_major(gc, pieces)
        bcp = None if bc is None else mgl.split_head_major(bc, pieces)
        skip = piece_skip and (segment_ids is not None or doc_vecs is not None)
        if piece_maps is None:
            h_run = functools.partial(_delta_h_call, group=heads // kv_heads, pieces=pieces,
                                      states_dtype=q.dtype, interpret=interpret)
            piece_maps = _piece_maps(kp, wp, gp, lastp, connp, h_run, pieces,
                                     mgl.piece_cuts(conn, pieces) if skip else None)
        # skip: step N/P - 1 - f of a piece reads chunk f, its first document start (Sec. 52)
        lo = None
        if skip:
            first = mgl.piece_cuts(conn, pieces, first=True)
            lo = jnp.where(first >= 0, num_chunks // pieces - 1 - first, 0).astype(jnp.int32)
        (y_local,) = run(qp, kp, wp, dop, dvlp, gp, lastp, connp, docp, None, store=False,
                         bc=bcp, **({} if lo is None else {"lo": lo}))
        exits = mgl.scan_piece_maps(piece_maps, y_local.reshape(batch, pieces, heads, dk, dv),
                                    dht, reverse=True)
        dh, dvn, dh0s = run(qp, kp, wp, dop, dvlp, gp, lastp, connp, docp,
                            exits.reshape(batch * pieces, heads, dk, dv), bc=bcp)
        dvn = dvn.reshape(batch, num_chunks * CHUNK, heads, dv)
        return dh, dvn[:, :seq_len], dh0s.reshape(batch, pieces, heads, dk, dv)[:, 0]


def _delta_dh_call(q, k, w, do, dvl_in, gc, last, conn, doc, dht, *, group, scale, pieces,
                   states_dtype, interpret, store=True, bc=None, lo=None):
    """One launch of the reverse delta state pass over ``[B * P]`` rows (pieces as rows; see
    :func:`_delta_dstate_kernel`). ``doc`` (the document ids) given: the folded pass
    (``fold_dv_local``), with ``dvl_in`` the residual's cotangent or ``None``; else ``dvl_in``
    is ``dv_local``. ``bc`` (``beta conn``, fp32 ``[B * P, H, Tq]``) given (folded pass only):
    ``w`` is ``T0`` ``[B * P, Tq, H, 64]`` and the pass forms ``W`` (``w_from_t0``). Returns
    ``(dh, dv_new, dh0)`` (``dh`` ``[B, H, P * Nq, K, V]`` in ``states_dtype``, ``dv_new``
    ``[B * P, Tq, H, V]``, ``dh0`` ``[B * P, H, K, V]`` fp32), or ``(dh0,)`` without
    ``store``. ``lo`` (int32 ``[B * P]``): each row's first step (``_skip`` kernel, Sec. 52)."""
    rows, tq, kv_heads, dk = q.shape
    heads, dv = do.shape[2], do.shape[3]
    num_chunks = tq // CHUNK
    fp32_states = states_dtype == jnp.dtype(jnp.float32)
    fold = doc is not None
    has_du = fold and dvl_in is not None
    w_t0 = bc is not None
    assert fold or not w_t0, "w_from_t0 needs the folded pass"
    kernel = functools.partial(_delta_dstate_kernel, num_chunks=num_chunks, group=group,
                               scale=scale, has_dht=dht is not None, fp32_states=fp32_states,
                               pieces=pieces, store=store, fold=fold, has_du=has_du,
                               interpret=interpret, w_t0=w_t0,
                               **({} if lo is None else {"skip": True}))
    vec = plgpu.SMEM((STAGES, CHUNK), jnp.float32)
    swz = mgl.swizzled_smem
    out_type = _state_pass_out_type(rows, tq, heads, dk, dv, pieces, states_dtype, do.dtype,
                                    store)
    # Copies per stage: q, k, w (or T0), do, the gate, last, conn; dv_local (or du); fold: 3
    # vectors; w_from_t0: beta conn (columns).
    copies = 7 + (dvl_in is not None) + 3 * fold + w_t0
    fold_scratch = [vec, vec, vec,  # gcol_s, docr_s, docc_s: D's row / column copies
                    plgpu.Barrier(num_arrivals=1, num_barriers=STAGES)]  # dvl_ready
    if w_t0:
        fold_scratch += [swz((STAGES, CHUNK, CHUNK), w.dtype),  # t0_s: the T0 ring
                         vec,  # bcc_s: beta conn as columns
                         plgpu.Barrier(num_arrivals=1, num_barriers=STAGES)]  # w_ready
    shim = [plgpu.SMEM((dk, CHUNK), q.dtype)] * 2  # qt_s, wt_s
    if fold:
        shim += [plgpu.SMEM((dk, CHUNK), q.dtype),  # qt2_s: wg 2's Q^T
                 plgpu.SMEM((CHUNK, CHUNK), do.dtype)]  # pt_s: P^T as the left operand
    if w_t0:
        shim += [plgpu.SMEM((CHUNK, CHUNK), q.dtype)] * 2  # wh_s, wl_s: W's left operands
    call = plgpu.kernel(
        kernel,
        out_type=out_type,
        scratch_types=[
            swz((STAGES, CHUNK, dk), q.dtype),  # q_s
            swz((STAGES, CHUNK, dk), k.dtype),  # k_s
            swz((STAGES, CHUNK, dk), q.dtype),  # w_s (w_from_t0: written by wg 2)
            swz((STAGES, CHUNK, BLOCK_V), do.dtype),  # do_s
            swz((STAGES, CHUNK, BLOCK_V), do.dtype),  # dvl_s: dv_local (fold: wg 2's, du in)
            vec, vec, vec,  # g_s, last_s, conn_s
            swz((CHUNK, BLOCK_V), do.dtype),  # dod_s: scale conn e^G do, the wgmma operand
            swz((CHUNK, BLOCK_V), do.dtype),  # dvn_s: staging of dv_new
            swz((CHUNK, BLOCK_V), do.dtype),  # dvneg_s: -dv_new, the wgmma operand
            swz((dk, BLOCK_V), jnp.float32),  # state_s: dht, dh0 (and fp32 dh) staging
            swz((dk, BLOCK_V), q.dtype),  # ds_s: dS' in 16 bits (operand; 16-bit dh staging)
            plgpu.Barrier(num_arrivals=copies, num_barriers=STAGES),  # in_bar: a stage landed
            # in_free: a stage may be refilled (fold: the state and dv_local warpgroups)
            plgpu.Barrier(num_arrivals=1 + fold, num_barriers=STAGES),
            plgpu.Barrier(num_arrivals=1),  # io_bar: dht landed
            plgpu.Barrier(num_arrivals=2 + fold),  # done: every warpgroup finished
        ] + (fold_scratch if fold else []) + (shim if interpret else []),
        grid=(rows, heads, dv // BLOCK_V),
        grid_names=("b", "h", "v"),
        num_threads=2 + fold,
        thread_name="wg",
        compiler_params=mgl.compiler_params(),
        interpret=mgl.interpret_params() if interpret else None,
        kernel_name=("gdn_chunk_delta_dh" + ("_fold" if fold else "") + ("_t0" if w_t0 else "")
                     + ("" if store else "_pieces") + ("" if lo is None else "_skip")),
    )
    args = (q, k, w, do) + (() if dvl_in is None else (dvl_in,)) + (gc, last, conn)
    args += () if bc is None else (bc,)
    args += (() if doc is None else (doc,)) + (() if dht is None else (dht,))
    args += () if lo is None else (lo,)
    return call(*args)
