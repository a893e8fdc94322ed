"""Gated DeltaNet / DeltaNet forward with the transposed state in registers (Mosaic GPU).

``forward="fused_rs"`` of :func:`pallas_kernels.gated_delta_rule.mosaic_vjp.gated_delta_rule_mosaic`
(off by default; MOSAIC_GPU.md Sec. 56). Same inputs, equations and output contract as
:func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu_fused.chunk_delta_fused_t0_fwd_mosaic`
(the gate-free inverse ``T0`` from
:func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu.chunk_kkt_inverse_mosaic`, ``v``, the
gates and the document vectors), but the primal only: ``o`` and the final state, no ``h`` and no
``v_new``. Per batch row, value head and chunk ``c`` of 64 tokens with entry state ``S_c``
(``[K, V]`` fp32), ``G`` the chunk-local inclusive cumulative log-decay and ``G_L`` its last
entry (paper arXiv 2607.07953, Eqs. 15-17; FLA ``chunk_gated_delta_rule_fwd``)::

    Ag_ij   = T0_ij e^{G_i - G_j} beta_j        (causal same-document pairs, else 0)
    v_new_c = Ag (V_c - diag(conn e^G) K_c S_c)
    o_c     = scale ( diag(conn e^G) Q_c S_c + (Q_c K_c^T * D) v_new_c )
    S_{c+1} = keep_c e^{G_L} S_c + K_c^T (last_c e^{G_L - G} v_new_c)

with ``D_ts = e^{G_t - G_s}`` on causal same-document pairs and ``conn``, ``last``, ``keep`` the
document vectors of :func:`pallas_kernels.common.mosaic_gpu_lib.doc_vectors` (their derivation:
``kernel_mosaic_gpu_fused``'s module docstring).

The schedule is the one MOSAIC_GPU.md Sec. 35.1 describes for jla's fused forward (jla 0.1.0,
``scalar_gate_fused.fused_fwd_wy``), written here for our inputs. Three warpgroups:

* memory (``setmaxnreg 40``): the eleven TMA copies per chunk of the ``fused_t0`` kernels
  (``kernel_mosaic_gpu_fused._t0_issuer``) into a ring of :func:`rs_ring_depth` stages (3 at
  every supported shape: the fp32 staging tile of ``h0`` / the final state shares SMEM with the
  published state, which is dead before the first and after the last chunk);
* state (``setmaxnreg 232``): carries ``S^T`` (``[64, K]`` fp32, 64 value columns) in registers.
  Per chunk, with every left ``wgmma`` operand a 16-bit register tile::

      X^T     = V^T - (S^T K^T) diag(conn e^G)
      v_new^T = X^T Ag_<^T + X^T diag(beta)          (Ag_<: the strictly lower part of Ag)
      S^T    <- keep e^{G_L} S^T + (v_new^T diag(last e^{G_L - G})) K

  The last product accumulates into ``keep e^{G_L} S^T`` (``plgpu.ACC.init``), so no second
  ``[64, K]`` fp32 tile lives beside the state. The only SMEM stores are the publications for
  the output warpgroup, ``S^T`` and ``v_new^T`` (16 bits, double-buffered), behind one
  ``commit_smem`` per chunk; no product waits for a store of its own operand;
* output (``setmaxnreg 232``): per chunk issues ``Q K^T``, and while it runs forms the mask
  ``D`` once and ``Ag_< = T0 * D * beta_j`` over ``T0`` in the ring stage (``ag_ready``); then
  ``P = (Q K^T) * D`` (16 bits, registers) and, once ``S^T`` and ``v_new^T`` are published,
  ``Q S`` and ``P v_new`` (transposed views of the published tiles) in one group, and ``o``
  through a double-buffered SMEM tile by TMA.

Residual form (``store_h`` / ``store_v_new``; MOSAIC_GPU.md Sec. 58; ``mosaic_vjp.RS_RESIDUALS``
runs it under differentiation): the backward's ``h`` (``[B, H, N, K, V]``, the state entering
each chunk) and ``v_new`` (``[B, T, H, V]``), in the layouts and dtypes of ``fused_t0``'s
residuals. TMA cannot transpose, and the state warpgroup's tiles are transposed (``S^T``,
``v_new^T``), so the output warpgroup, right after it issued ``Q S`` and ``P v_new`` from the
published tiles, loads them back transposed into registers (jax >= 0.11; on 0.10.2 the exact
products ``I S``, ``I v_new``), writes ``S`` and ``v_new`` into double-buffered staging tiles
and sends them out by TMA, committed with ``o`` as one bulk group per chunk. The state chain
is unchanged (its module and roundings), and the values stored are exactly the 16-bit
operands the read-out uses. The staging tiles (48 KB at ``K = 128``) leave room for a
two-stage ring only there (:func:`rs_ring_depth`).

Every decay is an ``exp2`` of gates scaled by ``log2 e`` per vector element (the ``[64, 64]``
mask needs no multiply per element). ``V^T`` is loaded into registers through a transposed
view on jax >= 0.11 (:data:`TRANSPOSED_V_LOAD`); jax 0.10.2 cannot load a transposed swizzled
tile ("Can't transpose the swizzled dimension") and forms it as the exact product ``I V^T``
issued with ``S^T K^T`` instead.

Barriers and why nothing deadlocks: those of ``kernel_mosaic_gpu_fused._split_t0_kernel`` in
its ``"shared_mask"`` order (``in_bar``/``in_free`` per ring stage, ``ag_ready`` per stage,
``s_ready``/``s_free`` per published half; ``_SPLIT_PROTOCOL`` there). ``protocol="ag_ahead"``
(:data:`RS_PROTOCOLS`, MOSAIC_GPU.md Sec. 64) only reorders the output warpgroup: chunk
``n + 1``'s ``Q K^T``, mask, ``Ag_<`` and ``P`` before chunk ``n``'s read-out. The exact
happens-before models of both orders are in
``tests/pallas_kernels/mosaic_protocol_rs_maps_x_test.py``.

Interpret mode (CPU, tests): the Mosaic GPU interpreter's ``wgmma`` takes SMEM refs only and
has no ``run_state``, so register operands and transposed views go through SMEM copies
(``mgl.lhs_operand``, ``mgl.transposed``) and the accumulating update is a fresh accumulator
plus an add (MOSAIC_GPU.md Sec. 1 and 56).
"""

import functools
from typing import Optional, Tuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.common import mosaic_gpu_lib as mgl
from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu_fused as kfused

CHUNK = mgl.CHUNK
BLOCK_V = mgl.BLOCK_V
RS_STAGES = (2, 3)  # ring depths the kernel takes
# The primal's ring depth by K when no stages are named (MOSAIC_GPU.md Sec. 63, Sec. 56.4's
# rule): at K = 128 two stages, 0.2546 ms against three's 0.2636 on an H100 at S1 (bit-equal
# results, the `gpu` test test_fused_rs_two_stages_and_fused_t0_agree); K = 64 is untimed and
# keeps the deepest ring that fits (rs_ring_depth). The residual forms always take the deepest.
PRIMAL_STAGES = {128: 2}
# Timing ablations (benchmarks/profile_fwd.py --rs_stages; MOSAIC_GPU.md Sec. 56): "full" is the
# kernel; "state" keeps the state warpgroup's chain and the output warpgroup's Ag (the chain
# needs it) but no read-out (o is not written); "readout" keeps the output warpgroup whole on a
# chain frozen at the entry state with v_new = 0 (no state products): o = scale diag(conn e^G)
# Q S_0 in every chunk and the final state is the entry state.
RS_ABLATIONS = ("full", "state", "readout")
# Which warpgroup untransposes the residual form's h and v_new (MOSAIC_GPU.md Sec. 58.5):
# "output" (default), the output warpgroup loads the published S^T / v_new^T back transposed
# into staging tiles (48 KB more SMEM at K = 128: two stages); "state", the state warpgroup
# publishes S and v_new untransposed (stores through a transposed view, jax >= 0.11 only) and
# TMA-stores the published tiles themselves (no staging: three stages fit).
RS_RESIDUAL_FROM = ("output", "state")
# The output warpgroup's order per chunk (MOSAIC_GPU.md Sec. 64; a timing choice, same values bit
# for bit): "joint" (default), chunk n's Ag_< (ag_ready) and P are formed after the read-out of
# chunk n - 1, so the state warpgroup's W ag_ready[n] waits for that read-out (the edge that
# couples the two warpgroups); "ag_ahead", the output warpgroup forms chunk n + 1's Q K^T, mask,
# Ag_< (ag_ready[n + 1]) and P before it waits s_ready[n] for chunk n's read-out (a software
# pipeline of one chunk; P carried in registers), so the state chain waits for read-out n - 2.
RS_PROTOCOLS = ("joint", "ag_ahead")
_LOG2E = 1.4426950408889634
_SMEM_LIMIT = 227 * 1024  # Hopper's dynamic SMEM per block
_BARRIER_BYTES = 1024  # the barriers' SMEM, rounded up
_IN_COPIES = kfused._T0_IN_COPIES  # TMA copies per ring stage
_WGMMA = plgpu.Layout.WGMMA
# jax 0.11 loads a transposed swizzled 16-bit tile into the WGMMA layout; 0.10.2 raises
# "Can't transpose the swizzled dimension" (MOSAIC_GPU.md Sec. 35.2, Sec. 56).
TRANSPOSED_V_LOAD = tuple(jax.__version_info__[:2]) >= (0, 11)


def rs_smem_bytes(dk: int, dtype, depth: int, store_h: bool = False,
                  store_v_new: bool = False, residual_from: str = "output") -> int:
    """SMEM of the kernel (not interpreting) with a ``depth``-deep ring, in bytes: per stage
    ``q, k`` (``[64, K]``), ``v``, ``T0`` (``[64, 64]``) and seven fp32 vectors of 64; then the
    published ``S^T`` (two ``[64, K]``, 16 bits) sharing its bytes with the fp32 staging tile of
    the entry / final state (``[64, K]``), the published ``v_new^T`` and the ``o`` tiles (two
    ``[64, 64]`` each), and the barriers. The residual form (MOSAIC_GPU.md Sec. 58) adds the
    staging tiles of the stores, double-buffered: ``S`` (two ``[K, 64]``, ``store_h``) and
    ``v_new`` (two ``[64, 64]``, ``store_v_new``), 16 bits; none with
    ``residual_from="state"`` (the published tiles are stored)."""
    isz = jnp.dtype(dtype).itemsize
    per_stage = 2 * CHUNK * dk * isz + 2 * CHUNK * CHUNK * isz + 7 * CHUNK * 4
    fixed = max(2 * BLOCK_V * dk * isz, BLOCK_V * dk * 4) + 4 * CHUNK * BLOCK_V * isz
    if residual_from == "output":
        fixed += (2 * dk * BLOCK_V * isz if store_h else 0) + (
            2 * CHUNK * BLOCK_V * isz if store_v_new else 0)
    return depth * per_stage + fixed + _BARRIER_BYTES


def rs_ring_depth(dk: int, dtype, store_h: bool = False, store_v_new: bool = False,
                  residual_from: str = "output") -> int:
    """The deepest ring of :data:`RS_STAGES` whose :func:`rs_smem_bytes` fits in 227 KB: 3 for
    every supported ``K`` and dtype without stores (219,392 bytes by this count at ``K = 128``
    in 16 bits, 220,280 by ptxas); with ``store_h`` at ``K = 128`` 2 (the residual tiles add
    48 KB: 3 stages would need 268,544); 3 with ``residual_from="state"``."""
    fits = [d for d in RS_STAGES
            if rs_smem_bytes(dk, dtype, d, store_h, store_v_new, residual_from) <= _SMEM_LIMIT]
    return max(fits) if fits else min(RS_STAGES)


def rs_kernel_name(depth: int, ablation: str = "full", store_h: bool = False,
                   store_v_new: bool = False, residual_from: str = "output",
                   protocol: str = "joint") -> str:
    """The kernel's name (profiles list it apart): ``gdn_chunk_delta_fused_rs_fwd_s<depth>``,
    plus ``_abl_<ablation>`` for an ablation other than ``"full"``, plus ``_res`` for the
    residual form (``store_h``; MOSAIC_GPU.md Sec. 58) or ``_vn`` (``store_v_new`` alone), then
    ``_st`` with ``residual_from="state"``; ``_ah`` right after ``_s<depth>`` with
    ``protocol="ag_ahead"``."""
    stores = store_h or store_v_new
    return f"gdn_chunk_delta_fused_rs_fwd_s{depth}" + (
        "_ah" if protocol == "ag_ahead" else "") + (
        "" if ablation == "full" else f"_abl_{ablation}") + (
        "_res" if store_h else "_vn" if store_v_new else "") + (
        "_st" if stores and residual_from == "state" else "")


def _acc_plus(init, lhs, rhs, interpret: bool):
    """``init + lhs @ rhs`` (fp32, WGMMA layout): on the GPU the accumulator starts from
    ``init`` (``plgpu.ACC.init``), so no second fp32 tile of ``init``'s size is live; the
    interpreter has no ``run_state``: a fresh accumulator plus an add there."""
    if interpret:
        def fresh(acc):
            plgpu.wgmma(acc, lhs, rhs)
            return acc[...]
        return init + lax.optimization_barrier(pl.run_scoped(fresh, plgpu.ACC(init.shape)))

    def body(acc):
        plgpu.wgmma(acc, lhs, rhs)

    # The barrier keeps the arithmetic on the result after the accumulator's wait.
    return lax.optimization_barrier(pl.run_state(body)(plgpu.ACC.init(init)))


def _rs_kernel(q_ref, k_ref, v_ref, t0_ref, g_ref, beta_ref, doc_ref, last_ref, conn_ref, *rest,
               num_chunks: int, group: int, scale: float, has_h0: bool, depth: int,
               interpret: bool, ablation: str = "full", store_h: bool = False,
               store_v_new: bool = False, residual_from: str = "output", pieces: int = 1,
               protocol: str = "joint"):
    """Kernel body of :func:`chunk_delta_fused_rs_fwd_mosaic` (module docstring); refs are GMEM.

    ``rest`` = ``[h0_ref,] o_ref, ht_ref, [vn_ref,] [h_ref,]`` then the scratch: the ring
    (eleven tiles), the published ``S^T`` (``sb_s``) and the fp32 staging tile (``state_s``; one
    ``RefUnion`` on the GPU), ``vn_s`` (``v_new^T``), ``o_s``, the barriers ``in_bar, in_free,
    ag_ready, s_ready, s_free, io_bar, done``, the residual form's staging tiles ``hr_s``
    (``S``, ``[2, K, 64]``, ``store_h``) and ``vr_s`` (``v_new``, ``[2, 64, 64]``,
    ``store_v_new``) and, interpreting only, the SMEM copies of what the GPU
    reads from registers or as transposed views (``kt0_s, kt1_s`` ``K^T`` for each consumer,
    ``p_s``, ``agt_s`` ``Ag^T``, ``st_s`` ``S``, ``vnt_s`` ``v_new``, ``sl_s``, ``xt_s``,
    ``vdt_s`` the state products' left operands). ``h0_ref`` and ``ht_ref`` are ``[B, H, V, K]``
    (transposed by the wrapper), ``h_ref`` ``[B, H, N, K, V]`` and ``vn_ref`` ``[B, Tp, H, V]``
    (the layouts of ``fused_t0``'s residuals). ``ablation``: :data:`RS_ABLATIONS`.
    ``residual_from="state"`` (with a store; :data:`RS_RESIDUAL_FROM`): ``sb_s`` and ``vn_s``
    hold ``S`` (``[2, K, 64]``) and ``v_new`` (``[2, 64, 64]``) untransposed, TMA-stored by the
    state warpgroup; no ``hr_s`` / ``vr_s``. ``pieces = P > 1`` (MOSAIC_GPU.md Sec. 60): the
    grid's rows are ``P`` sequence pieces of ``num_chunks`` chunks per batch row, each from its
    own entry state (``h0_ref`` per piece); only ``h``'s indices change: batch row ``b // P``,
    global chunk ``(b mod P) num_chunks + n`` (as ``kernel_mosaic_gpu_fused._fused_t0_kernel``).
    ``protocol``: :data:`RS_PROTOCOLS` (the output warpgroup's order only).
    """
    rest = list(rest)
    h0_ref = rest.pop(0) if has_h0 else None
    o_ref, ht_ref = rest.pop(0), rest.pop(0)
    vn_ref = rest.pop(0) if store_v_new else None
    h_ref = rest.pop(0) if store_h else None
    ring, rest = tuple(rest[:_IN_COPIES]), rest[_IN_COPIES:]
    (q_s, k_s, v_s, t0_s, g_row_s, g_col_s, b_col_s, doc_row_s, doc_col_s, last_s,
     conn_s) = ring
    if interpret:  # the interpreter has no RefUnion (and no SMEM limit)
        sb_s, state_s, *rest = rest
    else:
        (sb_s, state_s), *rest = rest
    vn_s, o_s, in_bar, in_free, ag_ready, s_ready, s_free, io_bar, done, *shim = rest
    # residual_from="state": S and v_new are published untransposed and stored from there
    res_state = (store_h or store_v_new) and residual_from == "state"
    hr_s = shim.pop(0) if store_h and not res_state else None
    vr_s = shim.pop(0) if store_v_new and not res_state else None

    def publish(dst, x_t):
        """``dst[...] = x_t`` (the transposed tile as the state warpgroup holds it) or, with
        ``res_state``, ``dst[...] = x_t^T`` through a transposed view (jax >= 0.11)."""
        if not res_state:
            dst[...] = x_t
        elif interpret:
            dst[...] = x_t.T
        else:
            dst.transpose((1, 0))[...] = x_t
    (kt0_s, kt1_s, p_s, agt_s, st_s, vnt_s, sl_s, xt_s,
     vdt_s) = shim if interpret else (None,) * 9
    gmem = (q_ref, k_ref, v_ref, t0_ref, g_ref, g_ref, beta_ref, doc_ref, doc_ref, last_ref,
            conn_ref)
    b, h, iv = lax.axis_index("b"), lax.axis_index("h"), lax.axis_index("v")
    hk = lax.div(h, group)  # GVA: value head h reads query/key head h // group
    cols = pl.ds(iv * BLOCK_V, BLOCK_V)
    # h's row and chunk (pieces as rows, Sec. 60); one piece: the grid's row and n, as before
    b_out = b if pieces == 1 else lax.div(b, pieces)

    def h_at(n):
        """``h_ref``'s tile of chunk ``n`` of this row (global chunk index with pieces)."""
        chunk = n if pieces == 1 else lax.rem(b, pieces) * num_chunks + n
        return h_ref.at[b_out, h, chunk, :, cols]
    wg = lax.axis_index("wg")
    dk = k_s.shape[-1]
    dtype = v_s.dtype
    sq = (CHUNK, CHUNK)
    tile = (CHUNK, BLOCK_V)  # o, Q S, P v_new
    tile_t = (BLOCK_V, CHUNK)  # X^T, v_new^T, S^T K^T

    def by_col(x, shape):
        return lax.broadcast_in_dim(x, shape, [1])

    @pl.when(wg == 2)
    def _memory():
        plgpu.set_max_registers(40, action="decrease")
        mgl.ring_producer(kfused._t0_issuer(gmem, ring, in_bar, b, h, hk, cols), num_chunks,
                          in_free, stages=depth)

    @pl.when(wg == 0)
    def _state():
        plgpu.set_max_registers(232, action="increase")
        h0 = h0_ref.at[b, h, cols, :] if has_h0 else None  # S^T, [64, K]
        s0 = mgl.entry_state(h0, state_s, io_bar, (BLOCK_V, dk), interpret)
        if interpret or TRANSPOSED_V_LOAD:
            eye = None
        else:  # I V^T instead of a transposed load (jax 0.10.2); 16 registers a thread
            vsq = (BLOCK_V, BLOCK_V)
            eye = (mgl.iota(vsq, 0, False) == mgl.iota(vsq, 1, False)).astype(dtype)

        def step(n, s):
            slot, half = lax.rem(n, depth), lax.rem(n, 2)

            @pl.when(n >= 2)
            def _():  # the output warpgroup has read the tiles published two chunks ago
                plgpu.barrier_wait(s_free.at[half])

            if res_state:  # ... and the TMA stores of chunk n - 2 have read them
                plgpu.wait_smem_to_gmem(1, wait_read_only=True)
            s_lo = s.astype(dtype)  # S^T in 16 bits: the left operand of S^T K^T, published
            publish(sb_s.at[half], s_lo)  # fenced with v_new^T below (one fence per chunk)
            plgpu.barrier_wait(in_bar.at[slot])
            k_t = mgl.transposed(k_s.at[slot], kt0_s, interpret)  # [K, C]
            s_op = mgl.lhs_operand(s_lo, sl_s, interpret)

            if eye is not None:  # jax 0.10.2: V^T as the exact product I V^T, issued with
                # S^T K^T (16-bit values times 1, one term per fp32 sum)
                def state_in(ks_acc, v_acc):
                    plgpu.wgmma(ks_acc, s_op, k_t)  # S^T K^T, [64, C]
                    plgpu.wgmma(v_acc, eye, v_s.at[slot].transpose((1, 0)))
                    return ks_acc[...], v_acc[...]

                ks_t, v_t = lax.optimization_barrier(pl.run_scoped(
                    state_in, plgpu.ACC(tile_t), plgpu.ACC(tile_t)))
            else:
                def state_in(ks_acc):
                    plgpu.wgmma(ks_acc, s_op, k_t)  # S^T K^T, [64, C]
                    if interpret:
                        v_t = v_s.at[slot][...].T
                    else:  # the transposed load runs while S^T K^T is on the tensor cores
                        v_t = mgl.load(v_s.at[slot].transpose((1, 0)), _WGMMA)
                    return ks_acc[...], v_t.astype(jnp.float32)

                ks_t, v_t = lax.optimization_barrier(pl.run_scoped(
                    state_in, plgpu.ACC(tile_t)))
            # log2 units: exp2 of differences of scaled vectors (one multiply per element of
            # a vector, none per element of a tile)
            g_j = mgl.load_cols(g_col_s.at[slot], interpret) * _LOG2E
            g_last = g_row_s[slot, CHUNK - 1] * _LOG2E
            # The entering state reaches token t as conn_t e^{G_t} (<= 1): a column scale.
            q_decay = jnp.exp2(g_j) * mgl.load_cols(conn_s.at[slot], interpret)
            x_t = v_t - ks_t * by_col(q_decay, tile_t)  # X^T, fp32
            plgpu.barrier_wait(ag_ready.at[slot])  # Ag_< of chunk n over T0 in the stage
            x_op = mgl.lhs_operand(x_t.astype(dtype), xt_s, interpret)
            ag_t = mgl.transposed(t0_s.at[slot], agt_s, interpret)  # Ag_<^T, [C, C]

            def solve(acc):
                plgpu.wgmma(acc, x_op, ag_t)  # X^T Ag_<^T, [64, C]
                return acc[...]

            vn_t = lax.optimization_barrier(pl.run_scoped(solve, plgpu.ACC(tile_t)))
            # T0's unit diagonal in fp32: Ag_ii X_i = beta_i X_i, unrounded (a column scale).
            vn_t = vn_t + x_t * by_col(mgl.load_cols(b_col_s.at[slot], interpret), tile_t)
            publish(vn_s.at[half], vn_t.astype(dtype))
            plgpu.commit_smem()  # the chunk's one fence: S^T and v_new^T
            plgpu.barrier_arrive(s_ready.at[half])
            if res_state:  # the residuals from the published tiles, one bulk group a chunk
                rows = pl.ds(n * CHUNK, CHUNK)
                if store_h:
                    plgpu.copy_smem_to_gmem(sb_s.at[half], h_at(n),
                                            commit_group=not store_v_new)
                if store_v_new:
                    plgpu.copy_smem_to_gmem(vn_s.at[half], vn_ref.at[b, rows, h, cols])
            # Token s reaches the next chunk as last_s e^{G_L - G_s} (<= 1); keep e^{G_L} is
            # 0 when a document starts inside the chunk (conn of its last token).
            k_decay = jnp.exp2(g_last - g_j) * mgl.load_cols(last_s.at[slot], interpret)
            s_decay = jnp.exp2(g_last) * conn_s[slot, CHUNK - 1]
            vd_op = mgl.lhs_operand((vn_t * by_col(k_decay, tile_t)).astype(dtype), vdt_s,
                                    interpret)
            s_new = _acc_plus(s * s_decay, vd_op, k_s.at[slot], interpret)  # [64, K]
            plgpu.barrier_arrive(in_free.at[slot])  # k, v, Ag of the stage no longer read here
            return s_new

        def frozen_step(n, s):  # ablation="readout": S^T frozen, v_new^T = 0, no products
            slot, half = lax.rem(n, depth), lax.rem(n, 2)

            @pl.when(n >= 2)
            def _():
                plgpu.barrier_wait(s_free.at[half])

            sb_s.at[half][...] = s.astype(dtype)
            vn_s.at[half][...] = mgl.zeros_acc(tile_t, interpret).astype(dtype)
            plgpu.barrier_wait(in_bar.at[slot])
            plgpu.barrier_wait(ag_ready.at[slot])
            plgpu.commit_smem()
            plgpu.barrier_arrive(s_ready.at[half])
            plgpu.barrier_arrive(in_free.at[slot])
            return s

        s = lax.fori_loop(0, num_chunks, frozen_step if ablation == "readout" else step, s0)
        for n in range(max(num_chunks - 2, 0), num_chunks):  # the last publications were read
            plgpu.barrier_wait(s_free.at[n % 2])
        # state_s shares SMEM with sb_s on the GPU: free once both halves were read (above),
        # with res_state also by the TMA stores (wait_stores)
        mgl.store_state(s, state_s, ht_ref.at[b, h, cols, :], wait_stores=res_state)

    @pl.when(wg == 1)
    def _output():
        plgpu.set_max_registers(232, action="increase")
        i, j = mgl.iota(sq, 0, interpret), mgl.iota(sq, 1, interpret)

        def form_ag(slot):
            """The chunk's mask D (log2 units) and Ag_< over T0 (committed, ag_ready);
            returns D and the rows of G (log2 units)."""
            g_i = mgl.load_rows(g_row_s.at[slot], interpret) * _LOG2E
            g_j = mgl.load_cols(g_col_s.at[slot], interpret) * _LOG2E
            d_i = mgl.load_rows(doc_row_s.at[slot], interpret)
            d_j = mgl.load_cols(doc_col_s.at[slot], interpret)
            keep = (j <= i) & (mgl.by_row(d_i, sq) == by_col(d_j, sq))
            # masked before exp2: D <= 1, nothing overflows above the diagonal
            decay = jnp.exp2(jnp.where(keep, mgl.by_row(g_i, sq) - by_col(g_j, sq), -jnp.inf))
            beta_j = by_col(mgl.load_cols(b_col_s.at[slot], interpret), sq)
            t0 = mgl.load_tile(t0_s.at[slot], interpret).astype(jnp.float32)
            # Ag_<: T0 D diag(beta) below the diagonal, rounded once to 16 bits, over T0 (only
            # this warpgroup reads T0, before this write); the diagonal is the state
            # warpgroup's, in fp32.
            t0_s.at[slot][...] = jnp.where(j < i, t0 * decay * beta_j, 0.0).astype(dtype)
            plgpu.commit_smem()
            plgpu.barrier_arrive(ag_ready.at[slot])
            return decay, g_i

        def state_only_prepare(n):  # ablation="state": Ag for the chain, no read-out
            slot = lax.rem(n, depth)
            plgpu.barrier_wait(in_bar.at[slot])
            form_ag(slot)
            return jnp.int32(0)

        def state_only_finish(n, carry):
            slot, half = lax.rem(n, depth), lax.rem(n, 2)
            plgpu.barrier_wait(s_ready.at[half])
            plgpu.barrier_arrive(s_free.at[half])
            plgpu.barrier_arrive(in_free.at[slot])

        stores = (store_h or store_v_new) and not res_state  # this warpgroup's stores
        if stores and not (interpret or TRANSPOSED_V_LOAD):  # jax 0.10.2: S, v_new as I S
            # and I v_new (exact: 16-bit values times 1), 16 registers a thread
            eye_o = (i == j).astype(dtype)
        else:
            eye_o = None

        def untransposed(src_t, dst):
            """``dst[...] = src_t^T`` (16 bits) for a published tile ``src_t`` ``[64, W]``
            (``W`` a multiple of 64) through registers: a transposed load (jax >= 0.11), or on
            0.10.2 the exact products ``I (src_t[:, 64 block])^T``, one per 64 rows of
            ``dst``."""
            if eye_o is None:
                dst[...] = mgl.load(src_t.transpose((1, 0)), _WGMMA)
                return
            for jb in range(src_t.shape[1] // CHUNK):
                def block(acc, jb=jb):
                    plgpu.wgmma(acc, eye_o, src_t.at[:, pl.ds(jb * CHUNK, CHUNK)].transpose(
                        (1, 0)))
                    return acc[...]

                part = lax.optimization_barrier(pl.run_scoped(block, plgpu.ACC(sq)))
                dst.at[pl.ds(jb * CHUNK, CHUNK), :][...] = part.astype(dtype)

        def store_residuals(n, half, s_op, vn_op):
            """The backward's residuals of chunk ``n`` (MOSAIC_GPU.md Sec. 58): ``S_n`` to
            ``h[b, h, n, :, cols]`` and ``v_new`` to ``v_new[b, rows, h, cols]``, untransposed
            from the published tiles into ``hr_s`` / ``vr_s`` (double-buffered: the caller
            waited for chunk ``n - 2``'s stores to be read), then TMA; committed with ``o``'s
            store (one bulk group per chunk)."""
            rows = pl.ds(n * CHUNK, CHUNK)
            # interpreting, s_op and vn_op are S and v_new in SMEM already (mgl.transposed)
            for flag, dst, src_t, op in ((store_h, hr_s, sb_s, s_op),
                                         (store_v_new, vr_s, vn_s, vn_op)):
                if not flag:
                    continue
                if interpret:
                    dst.at[half][...] = op[...]
                else:
                    untransposed(src_t.at[half], dst.at[half])
            plgpu.commit_smem()
            if store_h:
                plgpu.copy_smem_to_gmem(hr_s.at[half], h_at(n),
                                        commit_group=False)
            if store_v_new:
                plgpu.copy_smem_to_gmem(vr_s.at[half], vn_ref.at[b, rows, h, cols],
                                        commit_group=False)

        def prepare(n):
            """Chunk ``n`` up to ``s_ready``: ``Q K^T``, under it the mask and ``Ag_<``
            (``ag_ready``); returns ``P`` (16 bits, registers) and the rows of ``G``."""
            slot = lax.rem(n, depth)
            plgpu.barrier_wait(in_bar.at[slot])
            k_t = mgl.transposed(k_s.at[slot], kt1_s, interpret)

            def scores(acc):
                plgpu.wgmma(acc, q_s.at[slot], k_t)  # Q K^T, [C, C]
                # While it runs: the mask D once per chunk (for Ag here, for P below).
                decay, g_i = form_ag(slot)
                return acc[...], decay, g_i

            qk, decay, g_i = lax.optimization_barrier(pl.run_scoped(scores, plgpu.ACC(sq)))
            return (qk * decay).astype(dtype), g_i  # P, the rows of G (log2 units)

        def finish(n, prepared):
            """Chunk ``n``'s read-out from ``s_ready`` on, ``prepared`` = ``prepare(n)``."""
            slot, half = lax.rem(n, depth), lax.rem(n, 2)
            rows = pl.ds(n * CHUNK, CHUNK)
            p, g_i = prepared
            p_op = mgl.lhs_operand(p, p_s, interpret)  # P, registers
            q_decay = jnp.exp2(g_i) * mgl.load_rows(conn_s.at[slot], interpret)
            plgpu.barrier_wait(s_ready.at[half])
            if res_state:  # published untransposed
                s_op, vn_op = sb_s.at[half], vn_s.at[half]
                if interpret:  # as mgl.transposed's copies fence in the other forms: without
                    # a fence here the interpreter's race detector reports the ring's refill
                    # against this warpgroup's row loads (MOSAIC_GPU.md Sec. 58.5)
                    plgpu.commit_smem()
            else:
                s_op = mgl.transposed(sb_s.at[half], st_s, interpret)  # S, [K, 64]
                vn_op = mgl.transposed(vn_s.at[half], vnt_s, interpret)  # v_new, [C, 64]

            if stores:  # o_s, hr_s, vr_s [half] of chunk n - 2 were read (one group a chunk)
                plgpu.wait_smem_to_gmem(1, wait_read_only=True)

            def out(qs_acc, pv_acc):  # issued together
                plgpu.wgmma(qs_acc, q_s.at[slot], s_op)  # Q S, [C, 64]
                plgpu.wgmma(pv_acc, p_op, vn_op)  # P v_new, [C, 64]
                if stores:  # while they run: the residuals, off the state chain
                    store_residuals(n, half, s_op, vn_op)
                return qs_acc[...], pv_acc[...]

            qs, pv = lax.optimization_barrier(pl.run_scoped(
                out, plgpu.ACC(tile), plgpu.ACC(tile)))
            plgpu.barrier_arrive(s_free.at[half])
            plgpu.barrier_arrive(in_free.at[slot])
            o = scale * (qs * mgl.by_row(q_decay, tile) + pv)
            if not stores:  # o_s[half] of chunk n - 2 was read
                plgpu.wait_smem_to_gmem(1, wait_read_only=True)
            o_s.at[half][...] = o.astype(o_s.dtype)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(o_s.at[half], o_ref.at[b, rows, h, cols])

        prep, fin = ((state_only_prepare, state_only_finish) if ablation == "state"
                     else (prepare, finish))
        if protocol == "joint":  # chunk n prepared after chunk n - 1's read-out
            def step(n, carry):
                fin(n, prep(n))
                return carry

            lax.fori_loop(0, num_chunks, step, 0)
        else:  # "ag_ahead": chunk n + 1 prepared before chunk n's read-out (Sec. 64)
            def step_ahead(n, p):
                p_next = prep(n + 1)
                fin(n, p)
                return p_next

            p = lax.fori_loop(0, num_chunks - 1, step_ahead, prep(0))
            fin(num_chunks - 1, p)
        plgpu.wait_smem_to_gmem(0)

    # All warpgroups leave together (an early exit while another issues wgmma is unsafe).
    plgpu.barrier_arrive(done)
    plgpu.barrier_wait(done)


@functools.partial(jax.jit, static_argnames=("scale", "interpret", "stages", "ablation",
                                             "store_h", "store_v_new", "residual_from",
                                             "pieces", "protocol"))
def chunk_delta_fused_rs_fwd_mosaic(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    t0: jax.Array,
    g: Optional[jax.Array],
    beta: jax.Array,
    *,
    scale: float,
    initial_state: Optional[jax.Array] = None,
    segment_ids: Optional[jax.Array] = None,
    interpret: bool = False,
    stages: Optional[int] = None,
    ablation: str = "full",
    gate_cumsum: Optional[jax.Array] = None,
    doc_vecs: Optional[Tuple[jax.Array, jax.Array, jax.Array]] = None,
    store_h: bool = False,
    store_v_new: bool = False,
    residual_from: str = "output",
    pieces: int = 1,
    protocol: str = "joint",
) -> Tuple[jax.Array, ...]:
    """The forward of the gated delta rule from ``T0`` with ``S^T`` in registers (module
    docstring): ``o`` and the final state, and in the residual form (``store_h`` /
    ``store_v_new``, MOSAIC_GPU.md Sec. 58) the backward's ``h`` and ``v_new`` as
    :func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu_fused.chunk_delta_fused_t0_fwd_mosaic`
    writes them.

    Computes per batch row and value head the token recurrence
    ``u_t = beta_t (v_t - e^{g_t} S_{t-1}^T k_t)``, ``S_t = e^{g_t} S_{t-1} + k_t u_t^T``,
    ``o_t = scale S_t^T q_t`` (state reset to zero where ``segment_ids`` changes;
    :func:`pallas_kernels.gated_delta_rule.reference.gated_delta_rule_reference`, paper
    arXiv 2607.07953 Eqs. 15-17) in its chunk form (module docstring).

    Args:
        q: queries ``[B, T, Hk, K]``, bf16 or fp16; ``H % Hk == 0`` (value head ``h`` reads
            query/key head ``h // (H // Hk)``, GVA); used as given (L2-normalise beforehand).
        k: keys ``[B, T, Hk, K]``, q's shape and dtype.
        v: values ``[B, T, H, V]``, k's dtype. ``K, V`` in {64, 128}.
        t0: the gate-free inverse ``[B, T, H, 64]`` in k's dtype, as
            :func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu.chunk_kkt_inverse_mosaic`
            writes it (its unit diagonal is taken as exactly 1 and not read).
        g: per-token log-decay ``[B, T, H]`` (natural log, ``<= 0``), or ``None`` (DeltaNet).
        beta: write strengths ``[B, T, H]``, any float dtype (read as fp32).
        scale: read-out scale (static).
        initial_state: ``[B, H, K, V]`` state before the first token (read as fp32), or
            ``None`` for zeros; it applies to the first document of each row only.
        segment_ids: optional int ``[B, T]``; documents may start anywhere, also inside a
            chunk (exact: the masks and the document vectors).
        interpret: Mosaic GPU interpret mode (CPU; slow, for tests).
        stages: the TMA ring's depth (static, one of :data:`RS_STAGES`), or ``None``: for
            the primal (no stores, any ablation) :data:`PRIMAL_STAGES` where it names ``K``
            (2 at ``K = 128``), else :func:`rs_ring_depth` (3 at every supported shape
            without stores).
        ablation: a timing ablation (static, one of :data:`RS_ABLATIONS`; benchmarks only):
            ``"full"`` (default) is the kernel; ``"state"`` returns an unwritten (arbitrary)
            ``o`` and the final state; ``"readout"`` returns
            ``o_t = scale conn_t e^{G_t} S_0^T q_t`` (``S_0`` in 16 bits, ``G`` chunk-local)
            and the initial state. Kernel name :func:`rs_kernel_name`.
        gate_cumsum, doc_vecs: ``g``'s chunk-local cumsum (fp32 ``[B, H, Tp]``) and the
            document vectors (three fp32 ``[B, Tp]``) when the caller formed them already
            (``mosaic_vjp``), else ``None``.
        store_h: also write the state entering every chunk (static; the backward's ``h``):
            the published ``S^T`` tile (16 bits), untransposed by the output warpgroup after
            it issued ``Q S`` and ``P v_new`` (a transposed SMEM load on jax >= 0.11, exact
            products ``I S`` on 0.10.2) into a staging tile, then TMA. Off the state chain;
            the ring is then :func:`rs_ring_depth` with the staging tiles (2 at ``K = 128``).
        store_v_new: also write ``v_new`` (static; the backward's residual and the op's ``u``),
            the published ``v_new^T`` untransposed in the same way.
        residual_from: static, one of :data:`RS_RESIDUAL_FROM` (a timing choice, same values
            bit for bit; ignored without a store): ``"output"`` (default) as above;
            ``"state"``, the state warpgroup publishes ``S`` and ``v_new`` untransposed
            (stores through a transposed SMEM view: jax >= 0.11 on the GPU) and TMA-stores
            the published tiles; no staging tiles, so three stages fit at ``K = 128``
            (kernel name suffix ``_st``; MOSAIC_GPU.md Sec. 58.5).
        pieces: static; ``P > 1`` says the batch rows given are sequence pieces, ``P``
            consecutive rows per batch row (``[B * P, T / P, ...]`` as
            :func:`pallas_kernels.common.mosaic_gpu_lib.split_rows` cuts them, each piece a
            whole number of chunks, ``gate_cumsum`` and ``doc_vecs`` formed on whole rows and
            split, so a piece's first chunk's ``conn`` gates its entry state), each run from
            its own entry state (``initial_state`` ``[B * P, H, K, V]``), exactly as
            ``chunk_delta_fused_t0_fwd_mosaic(pieces=P)``. Only ``h`` (``store_h``) changes:
            ``[B, H, P N, K, V]`` at each piece's global chunk indices (``o``, ``v_new`` and
            the final states stay per piece row). Used by
            :func:`pallas_kernels.gated_delta_rule.mosaic_vjp.gated_delta_rule_mosaic` with
            ``RS_PIECES`` on rows with few CTAs (MOSAIC_GPU.md Sec. 60).
        protocol: static, one of :data:`RS_PROTOCOLS` (a timing choice, same values bit for
            bit, every form and ablation): ``"joint"`` (default) or ``"ag_ahead"``, the output
            warpgroup prepares chunk ``n + 1`` (``Q K^T``, mask, ``Ag_<``, ``P``) before chunk
            ``n``'s read-out, so the state chain no longer waits for a read-out on
            ``ag_ready`` (MOSAIC_GPU.md Sec. 64; kernel name suffix ``_ah``).

    Returns:
        ``(o, final_state)`` without stores: ``o`` ``[B, T, H, V]`` in v's dtype,
        ``final_state`` ``[B, H, K, V]`` fp32. With ``store_h`` or ``store_v_new``:
        ``(o, final_state, v_new, h)`` as ``chunk_delta_fused_t0_fwd_mosaic`` returns them:
        ``v_new`` ``[B, T, H, V]`` in v's dtype (``None`` without ``store_v_new``), ``h``
        ``[B, H, ceil(T / 64), K, V]`` in v's dtype (``None`` without ``store_h``; with
        ``pieces = P``, ``[B / P, H, P T / 64, K, V]``), both
        the 16-bit values the read-out's ``wgmma`` reads (the published tiles).
        The roundings of ``fused_t0_split``'s ``state_layout="vk"``:
        16-bit ``wgmma`` operands (``S``, ``X``, ``Ag_<``, ``P``, ``v_new``, the decayed
        ``v_new``) with fp32 accumulation, ``Ag``'s diagonal ``beta X`` unrounded.

    Raises:
        ValueError: as :func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu_fused.
            check_fused_t0_inputs` (shapes, dtypes, head dims, ``H`` not a multiple of ``Hk``,
            ``g``, ``beta``, ``segment_ids``, ``initial_state``); ``stages`` not ``None`` or in
            :data:`RS_STAGES`; ``ablation`` not in :data:`RS_ABLATIONS`, or other than
            ``"full"`` with ``store_h`` / ``store_v_new``; ``residual_from`` not in
            :data:`RS_RESIDUAL_FROM`, or ``"state"`` on the GPU with jax < 0.11; a ``stages``
            whose SMEM
            (:func:`rs_smem_bytes`) is over 227 KB (not interpreting; ``stages=3`` with
            ``store_h`` at ``K = 128``); ``pieces`` not a positive divisor of the batch rows,
            or ``pieces > 1`` with ``T`` not a multiple of 64 or an ``ablation``.
    """
    batch, seq_len, kv_heads, dk = k.shape
    heads, dv = v.shape[2], v.shape[3]
    kfused.check_fused_t0_inputs(q, k, v, t0, g, beta, segment_ids, initial_state)
    if stages is not None and stages not in RS_STAGES:
        raise ValueError(f"stages must be None or one of {RS_STAGES}, got {stages!r}")
    if ablation not in RS_ABLATIONS:
        raise ValueError(f"ablation must be one of {RS_ABLATIONS}, got {ablation!r}")
    stores = store_h or store_v_new
    if stores and ablation != "full":
        raise ValueError(f"ablation={ablation!r} is a timing ablation without residuals; got "
                         f"{store_h=}, {store_v_new=}")
    if residual_from not in RS_RESIDUAL_FROM:
        raise ValueError(f"residual_from must be one of {RS_RESIDUAL_FROM}, "
                         f"got {residual_from!r}")
    residual_from = residual_from if stores else "output"  # ignored without a store
    if residual_from == "state" and not (interpret or TRANSPOSED_V_LOAD):
        raise ValueError("residual_from='state' stores through a transposed swizzled SMEM view, "
                         f"which jax {jax.__version__} cannot lower (needs >= 0.11; "
                         "MOSAIC_GPU.md Sec. 56.1)")
    mgl.check_piece_rows(pieces, batch, seq_len)
    if protocol not in RS_PROTOCOLS:
        raise ValueError(f"protocol must be one of {RS_PROTOCOLS}, got {protocol!r}")
    if pieces > 1 and ablation != "full":
        raise ValueError(f"pieces={pieces} with ablation={ablation!r}: the ablations time "
                         "whole rows only")
    res = (store_h, store_v_new, residual_from)
    if stages is None and not stores and dk in PRIMAL_STAGES:
        stages = PRIMAL_STAGES[dk]
    depth = rs_ring_depth(dk, v.dtype, *res) if stages is None else stages
    need = rs_smem_bytes(dk, v.dtype, depth, *res)
    if not interpret and need > _SMEM_LIMIT:  # e.g. stages=3 with store_h at K = 128
        raise ValueError(f"stages={depth} with {store_h=}, {store_v_new=} needs {need} bytes of "
                         f"SMEM at K = {dk}, over {_SMEM_LIMIT}: use stages=None "
                         f"({rs_ring_depth(dk, v.dtype, *res)})")
    res_state = stores and residual_from == "state"
    num_chunks = -(-seq_len // CHUNK)
    padded = num_chunks * CHUNK
    # Padding tokens: q = k = v = 0, T0 rows = 0, beta = 0, g = 0: v_new = 0, o = 0 there and
    # the state unchanged.
    q, k, v, t0 = (mgl.pad_time(x, num_chunks) for x in (q, k, v, t0))
    gc = mgl.chunk_cumsum(g, (batch, seq_len, heads), num_chunks, gate_cumsum)  # [B, H, Tp]
    beta_hm = jnp.moveaxis(mgl.pad_time(beta.astype(jnp.float32), num_chunks), 1, 2)
    doc, conn, last = mgl.doc_vectors(segment_ids, batch, num_chunks, doc_vecs)
    dtype = v.dtype
    vec = plgpu.SMEM((depth, CHUNK), jnp.float32)
    swz = mgl.swizzled_smem
    ring = [swz((depth, CHUNK, dk), q.dtype), swz((depth, CHUNK, dk), k.dtype),
            swz((depth, CHUNK, BLOCK_V), dtype), swz((depth, CHUNK, CHUNK), t0.dtype),
            vec, vec, vec, vec, vec, vec, vec]  # g rows, g cols, beta, doc x2, last, conn
    # sb_s: S^T in 16 bits, published (two halves); S with residual_from="state"
    sb = swz((2, dk, BLOCK_V) if res_state else (2, BLOCK_V, dk), dtype)
    state = swz((BLOCK_V, dk), jnp.float32)  # state_s: staging of h0^T and the final S^T
    scratch = ring + ([sb, state] if interpret else [plgpu.RefUnion(sb, state)]) + [
        swz((2, BLOCK_V, CHUNK), dtype),  # vn_s: v_new^T, published (two; v_new "state")
        swz((2, CHUNK, BLOCK_V), dtype),  # o_s: staging of the output tile (two)
        plgpu.Barrier(num_arrivals=_IN_COPIES, num_barriers=depth),  # in_bar
        plgpu.Barrier(num_arrivals=2, num_barriers=depth),  # in_free: both consumers done
        plgpu.Barrier(num_arrivals=1, num_barriers=depth),  # ag_ready: Ag_< over T0 written
        plgpu.Barrier(num_arrivals=1, num_barriers=2),  # s_ready: S^T, v_new^T published
        plgpu.Barrier(num_arrivals=1, num_barriers=2),  # s_free: both were read
        plgpu.Barrier(num_arrivals=1),  # io_bar: h0 landed
        plgpu.Barrier(num_arrivals=3),  # done: all warpgroups finished
    ]
    if store_h and not res_state:
        scratch.append(swz((2, dk, BLOCK_V), dtype))  # hr_s: S, staging of h (two)
    if store_v_new and not res_state:
        scratch.append(swz((2, CHUNK, BLOCK_V), dtype))  # vr_s: v_new, staging (two)
    if interpret:  # SMEM copies of register operands and transposed views
        scratch += [plgpu.SMEM((dk, CHUNK), k.dtype)] * 2  # kt0_s, kt1_s
        scratch += [swz(sq, dtype) for sq in (
            (CHUNK, CHUNK), (CHUNK, CHUNK), (dk, BLOCK_V), (CHUNK, BLOCK_V),  # p, agt, st, vnt
            (BLOCK_V, dk), (BLOCK_V, CHUNK), (BLOCK_V, CHUNK))]  # sl, xt, vdt
    kernel = functools.partial(_rs_kernel, num_chunks=num_chunks, group=heads // kv_heads,
                               scale=float(scale), has_h0=initial_state is not None,
                               depth=depth, interpret=interpret,
                               **({} if ablation == "full" else {"ablation": ablation}),
                               **({"store_h": True} if store_h else {}),
                               **({"store_v_new": True} if store_v_new else {}),
                               **({"residual_from": "state"} if res_state else {}),
                               **({"pieces": pieces} if pieces > 1 else {}),
                               **({"protocol": protocol} if protocol != "joint" else {}))
    out_type = [jax.ShapeDtypeStruct((batch, padded, heads, dv), dtype),  # o
                jax.ShapeDtypeStruct((batch, heads, dv, dk), jnp.float32)]  # final S^T
    if store_v_new:
        out_type.append(jax.ShapeDtypeStruct((batch, padded, heads, dv), dtype))
    if store_h:  # pieces: [B, H, P N, K, V] at global chunk indices
        out_type.append(jax.ShapeDtypeStruct(
            (batch // pieces, heads, pieces * num_chunks, dk, dv), dtype))
    call = plgpu.kernel(
        kernel,
        out_type=tuple(out_type),
        scratch_types=scratch,
        grid=(batch, heads, dv // BLOCK_V),
        grid_names=("b", "h", "v"),
        num_threads=3,
        thread_name="wg",
        compiler_params=mgl.compiler_params(),
        interpret=mgl.interpret_params() if interpret else None,
        kernel_name=rs_kernel_name(depth, ablation, *res, protocol=protocol),
    )
    # The kernel carries S^T: [B, H, V, K] in and out (transposed here, in XLA).
    h0 = () if initial_state is None else (
        jnp.swapaxes(initial_state.astype(jnp.float32), -1, -2),)
    with jax.named_scope("gdn_chunk_delta_fused_rs_fwd_mosaic"):
        o, final_t, *res = call(q, k, v, t0, gc, beta_hm, doc, last, conn, *h0)
    o, final_state = o[:, :seq_len], jnp.swapaxes(final_t, -1, -2)
    if not stores:
        return o, final_state
    v_new = res.pop(0)[:, :seq_len] if store_v_new else None
    h = res.pop(0) if store_h else None
    return o, final_state, v_new, h
