"""Gated DeltaNet / DeltaNet forward: the delta state pass fused with the output (Mosaic GPU).

:func:`chunk_delta_fused_fwd_mosaic` does in one kernel what
:func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu.chunk_delta_h_mosaic` (the delta state
pass) and :func:`pallas_kernels.simple_gla.kernel_mosaic_gpu.chunk_output_mosaic` (the read-out
on ``v_new``) do in two (issue 29). The three-pass forward writes the state entering every chunk
``h`` (``[B, H, N, K, V]``) and ``v_new`` to HBM and reads both back in a second kernel (one CTA
per chunk); here each CTA walks the chunks of one ``(b, h, 64 value columns)`` in order and forms
the outputs from the state it already holds, so neither ``h`` nor ``v_new`` has to reach HBM
(they are stored only when asked: ``store_h`` for the backward, ``store_v_new`` for the
residual). Per chunk ``c`` with entry state ``S_c`` (``[K, V]`` fp32), ``G`` the chunk-local
inclusive cumulative log-decay (fp32), ``G_L`` its last entry (paper "Linear Attention
Architectures", arXiv 2607.07953, Sec. 3.2, Eqs. 15-17; FLA's ``chunk_gated_delta_rule_fwd``,
``fla/ops/gated_delta_rule/chunk.py``: ``chunk_gated_delta_rule_fwd_h`` then ``chunk_fwd_o``)::

    v_new_c = U_c - W_c S_c
    o_c     = scale ( diag(conn e^G) Q_c S_c + (Q_c K_c^T * D) v_new_c )
    S_{c+1} = keep_c e^{G_L} S_c + K_c^T (last_c * e^{G_L - G} * v_new_c)

with ``D_ts = e^{G_t - G_s}`` on causal (``s <= t``) same-document pairs, ``conn_t`` 1 on the
tokens of the document open before the chunk, ``last_s`` 1 on the chunk's last document and
``keep_c`` (``conn`` of the chunk's last token) 0 when a document starts inside the chunk: the
conventions of the two kernels it replaces, whose docstrings derive them. ``W, U`` are
:func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu.chunk_wy_mosaic`'s WY factors (rows of
``W`` of tokens that do not see ``S_c`` are already zero).

Kernel structure (by default two warpgroups, as the state passes;
``pallas_kernels/common/MOSAIC_GPU.md``):

* the memory warpgroup (``setmaxnreg 40``) streams each chunk's ``q``, ``k`` (key head
  ``h // group``), ``w``, ``u`` (value head ``h``, 64 value columns) and the gate (row and column
  copies), document (row and column copies), ``last`` and ``conn`` vectors with TMA into a
  two-stage SMEM ring (ten copies per stage, ``mosaic_gpu_lib.ring_producer``);
* the compute warpgroup (``setmaxnreg 232``) keeps ``S`` (``[K, 64]`` fp32) in registers. Per
  chunk it writes ``S`` in the input dtype to one SMEM tile (the right operand of both ``W S``
  and ``Q S``; also the staging tile of ``h`` when ``store_h``), then issues three ``wgmma`` as
  one group: ``W S``, ``Q S`` (``[64, 64]``) and ``Q K^T`` (``[64, 64]``, ``K^T`` a transposed
  SMEM view). In fp32 registers: ``v_new = U - W S``, the decayed causal same-document mask
  ``P = (Q K^T) * D`` (rounded to 16 bits, a register operand), ``last e^{G_L - G} v_new``.
  ``v_new`` (input dtype) and its decayed copy go to SMEM, and a second group of two ``wgmma``
  gives ``P v_new`` (``[64, 64]``) and ``K^T (decayed v_new)`` (``[K, 64]``, the state update,
  ``K^T`` again the transposed view of the same ``k`` tile). Then
  ``o = scale (Q S * conn e^G + P v_new)`` leaves through an SMEM tile by TMA, and
  ``S <- keep e^{G_L} S + K^T (...)``.

So the roundings are those of the three-pass forward (``S`` to the input dtype as the operand
of ``W S`` and ``Q S``, ``v_new`` to the input dtype as the operand of ``P v_new``, ``P`` and
``last e^{G_L - G} v_new`` to 16 bits; fp32 accumulation); only HBM traffic and the kernel
count change. The order of the fp32 sums is not the same, though: the three-pass read-out
(``chunk_output_mosaic``) forms ``Q S`` and ``P v_new`` for all value columns of a chunk in one
``wgmma``, this kernel for 64, and neither ``wgmma`` nor the interpreter's ``np.matmul``
(OpenBLAS: blocking and thread split depend on the width) fixes the summation order inside an
element. So ``o`` can differ in the last bits when ``V > 64`` (interpreted: 1 bf16 ulp on 1 of
38,400 elements in one test case, ``kernel_mosaic_gdn_fused_test._check_forward``);
``v_new``, ``h`` and the final state come from the same 64-column products as in the three-pass
state pass.

With ``split_output=True`` (``forward="fused_split"`` in the callers) the read-out moves to its
own warpgroup, as in jla's fused forward (``jla.ops.mosaic_gpu.scalar_gate_fused``,
MOSAIC_GPU.md Sec. 2; FlashQLA's Hopper forward), so the state warpgroup runs only the serial
chain. Three warpgroups:

* the state warpgroup (``setmaxnreg 232``) publishes ``S_c`` (16 bits) in a double-buffered
  SMEM tile, forms ``v_new = U - W S_c`` (one ``wgmma``), publishes it (double-buffered), signals
  ``s_ready``, and adds ``K^T (last e^{G_L - G} v_new)`` to ``keep e^{G_L} S``. Before
  overwriting a published tile it waits on ``s_free`` of the chunk two back;
* the output warpgroup (``setmaxnreg 232``) computes ``Q K^T`` and the mask ``P`` while the state
  warpgroup works, waits on ``s_ready``, issues ``Q S_c`` and ``P v_new`` as one group, signals
  ``s_free`` and stores ``o`` through a double-buffered tile (one store left in flight);
* the memory warpgroup (``setmaxnreg 40``) as above; a ring stage is released when both
  consumers arrive on ``in_free``.

The products and roundings are the same as with two warpgroups (interpreted, the results are
equal). jla also forms ``W, U`` inside the kernel from the gate-free inverse ``T0`` of its
``kkt_fwd`` (``v_new = T (diag(beta) (V - diag(conn e^G) K S))`` with
``T = T0 * e^{G_i - G_j}``), so it never reads ``W, U``; here they come from
:func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu.chunk_wy_mosaic`, except with
``forward="fused_t0"`` (:func:`chunk_delta_fused_t0_fwd_mosaic`, below).

SMEM at K = V = 128 (bf16): the ring ``2 x 57.5`` KB, the fp32 ``h0``/final-state tile 32 KB,
and the ``S``, ``v_new``, decayed ``v_new`` and ``o`` tiles: 40 KB (two warpgroups, about
187 KB in all) or 72 KB double-buffered (split, about 219 KB of the 227 KB an SM allows). One
CTA per SM either way.

CPU testing as the other Mosaic GPU kernels: interpret mode (``k^T`` and ``P`` copied into SMEM,
plain vector loads; ``mosaic_gpu_lib``'s shims) and lowering for CUDA.

The split preparation (``forward="fused_t0"``; issue 29). jla's ``kkt_fwd`` (read from the
jla 0.1.0 wheel, not measured here: 0.097 ms at B 8, T 4,096, H 16, K = V = 128 on the H200,
against 0.242 ms for ``chunk_wy_mosaic``) computes only the gate-free inverse
``T0 = (I + A0)^{-1}``, ``A0_ij = beta_i k_i . k_j`` (``j < i``, same document), and the gates
and ``beta`` go on in the fused kernel. Now done here, in our own code:

* :func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu.chunk_kkt_inverse_mosaic` writes
  ``T0`` ``[B, T, H, 64]`` in the input dtype; per chunk and head it reads ``k`` and writes
  8 KB (``chunk_wy_mosaic`` reads ``k, v`` and writes ``W, U``, 64 KB at K = V = 128). Unlike
  jla it keeps ``chunk_wy_mosaic``'s inverse (``wy_inverse``: exact 2 x 2 blocks, five
  doubling merges, ten ``[64, 64, 64]`` products with fp16 operands) and adds one Newton step
  with split operands (``refine_inverse``, four products), so ``T0`` is its float64 value
  rounded once to the input dtype (interpreted); about 4.2 M multiply-adds with ``K K^T`` at
  K = 128, jla's fp32 forward substitution on 16 x 16 blocks and two merges about 1.6 M. One
  chunk per CTA (no prefetch of the next chunk's keys).
* :func:`chunk_delta_fused_t0_fwd_mosaic` (two warpgroups, as :func:`_fused_kernel`) reads
  ``v`` and ``T0`` instead of ``w`` and ``u``. The algebra, checked against the token-serial
  reference (``u_t = beta_t (v_t - e^{g_t} S_{t-1}^T k_t)``): inside a chunk,
  ``(I + A) v_new = diag(beta) (V - diag(conn e^G) K S_c)`` with
  ``A_ij = beta_i k_i . k_j e^{G_i - G_j}`` on causal same-document pairs; ``conn_t`` (1 on the
  document open before the chunk, which is the one ``initial_state`` enters in chunk 0) is the
  only place the entering state appears, and a document starting inside the chunk has its own
  block of ``A`` (same-document mask) and no ``S_c`` term. As ``A = Gamma A0 Gamma^{-1}``
  (``Gamma = diag(e^G)``), ``(I + A)^{-1} = Gamma T0 Gamma^{-1}``, so::

      Ag_ij  = T0_ij e^{G_i - G_j} beta_j      (causal same-document pairs)
      v_new  = Ag (V - diag(conn e^G) K S_c)

  exactly (the gates enter ``A`` as a diagonal similarity). Per chunk and 64 value columns:
  ``K S`` joins ``Q S`` and ``Q K^T`` in the first ``wgmma`` group; ``X = V - diag(conn e^G)
  K S`` (fp32, then 16 bits in SMEM); ``Ag`` in fp32 registers split into ``hi + lo`` (two
  16-bit register operands, so only ``T0``'s storage rounding remains of the left factor); one
  more group ``v_new = hi X + lo X``; then the read-out and state update of
  :func:`_fused_kernel`. One extra dependent ``wgmma`` group per chunk, against the ``W S``
  of the ``W, U`` kernel that was free in the first group.
* ``forward="fused_t0"`` in ``gated_delta_rule_fwd_mosaic`` and ``mosaic_vjp``; the backward
  reads ``W``, which under differentiation the ``T0`` kernel forms from its fp32 ``T0``
  (``chunk_kkt_inverse_mosaic(return_w=True)``, ``W_i = e^{G_i} sum_j T0_ij beta_j conn_j k_j``,
  rounded once; MOSAIC_GPU.md Sec. 36; before, in XLA:
  :func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu.w_from_t0`).

* ``forward="fused_t0_split"`` (:func:`chunk_delta_fused_t0_fwd_mosaic` with
  ``split_output=True``, :func:`_split_t0_kernel`): three warpgroups in jla's arrangement
  (``fused_fwd_wy``, MOSAIC_GPU.md Sec. 2), written for our contracts. ``Ag`` needs no
  product: it is ``T0`` times the mask ``D`` and ``beta_j``, elementwise. Per chunk ``n``:

  - the output warpgroup (``setmaxnreg 232``) reads out chunk ``n`` as
    :func:`_split_kernel`'s output warpgroup (``Q K^T`` and ``P`` while the state warpgroup
    works; on ``s_ready``, ``Q S_n`` and ``P v_new`` as one group; ``s_free``; ``o`` through
    a double-buffered tile), then, one chunk ahead, waits for chunk ``n + 1``'s stage, forms
    the strictly lower part ``Ag_<`` of ``Ag = T0 * D * beta_j`` in fp32 registers and writes
    it, rounded once to the input dtype, over ``T0`` in the ring stage (``t0_s[slot]``), then
    arrives on ``ag_ready[slot]``. Three products per chunk. That is
    ``split_order="readout_first"`` (:data:`SPLIT_ORDERS`, the default since 2026-12-04f:
    0.358 ms on the H200 at S1 against 0.520); ``"prepare_first"`` forms ``Ag`` of chunk
    ``n + 1`` before reading out chunk ``n`` (a whole TMA round trip per chunk in the output
    warpgroup, MOSAIC_GPU.md Sec. 16); ``"prepare_mid"`` forms it between the state-free and
    the state-dependent halves of the read-out of chunk ``n``, so that the state warpgroup
    never waits for a read-out, and ``split_stages=3`` deepens the TMA ring to three stages
    so that chunk ``n + 1``'s copies have landed by then; ``"state_ag"`` leaves the output
    warpgroup the read-out only and has the state warpgroup form ``Ag`` of chunk ``n`` while
    its ``K S`` product runs (Sec. 17; neither timed yet);
  - the state warpgroup (``setmaxnreg 232``, ``S`` ``[K, 64]`` fp32 in registers) publishes
    ``S_c`` in 16 bits (double-buffered; waits on ``s_free`` of the chunk two back), then::

        X      = V - diag(conn e^G) (K S_c)     (one wgmma; fp32, then 16 bits in SMEM)
        v_new  = Ag_< X + diag(beta) X          (one wgmma, Ag_< from SMEM after ag_ready;
                                                 the diagonal term in fp32 registers)
        S_{c+1} = keep e^{G_L} S_c + K^T (last e^{G_L - G} v_new)   (one wgmma)

    publishing ``v_new`` (double-buffered) and arriving on ``s_ready`` before the update; it
    releases the stage (``in_free``, which also frees ``Ag``) after the update;
  - the memory warpgroup as in :func:`_fused_t0_kernel` (eleven copies per stage); a stage is
    refilled once both consumers arrived on ``in_free``, so ``Ag`` is double-buffered by the
    two-stage ring with no tile of its own.

  Three dependent products on the state chain (``K S``, ``Ag X``, ``K^T v_new``) against two
  in ``forward="fused_split"`` (``W S``, ``K^T v_new``), and no ``W, U`` preparation kernel.
  ``T0``'s unit diagonal (``Ag_ii = beta_i``, ``D_ii = 1``) is taken exactly: the term
  ``beta_i X_i``, most of ``v_new``, keeps neither ``Ag``'s nor ``X``'s rounding. The
  roundings are otherwise the two-warpgroup kernel's except ``Ag_<``: one 16-bit rounding of
  the fp32 ``T0 * D * beta_j`` (of the once-rounded ``T0``) instead of the ``hi + lo`` pair
  (interpreted, on the eight kernel cases of the test file, the errors against the fp32
  reference are 0.76 to 1.03 times the two-warpgroup kernel's; rounding the whole ``Ag``
  once, diagonal included, gave 1.06 to 1.43 times: MOSAIC_GPU.md Sec. 11). SMEM at
  K = V = 128 (bf16): the ring ``2 x 49.75`` KB (``q, k`` 16 KB each, ``v`` 8, ``T0``/``Ag``
  8, seven vectors); ``S`` 2 x 16 KB, ``X`` 8, ``v_new`` 2 x 8, decayed ``v_new`` 8, ``o``
  2 x 8, the fp32 state 32: about 211.5 KB of the 227 KB an SM allows (one CTA per SM).
  Registers (estimated, not compiled with ptxas): the state warpgroup holds ``S`` (64 fp32
  per thread), the ``[K, 64]`` update accumulator (64) and ``[C, 64]`` tiles (32 each; ``X``
  stays live across ``Ag_< X`` for the diagonal term); the output warpgroup's peak is
  ``Q K^T``, ``D`` and the two read-out accumulators (32 each), both under 232.

  Two timing options of this layout (MOSAIC_GPU.md Sec. 35; CPU only so far):
  ``state_layout="vk"`` (:func:`_state_vk_step`) carries ``S^T`` ``[64, K]`` in the state
  warpgroup as jla does, so its three products take the left operand from registers and the
  chain stores and fences no operand (only the published ``S^T`` and ``v_new^T``, one
  fence; ``V^T`` from an exact ``I V^T`` product, as jax 0.10.2 cannot load a transposed
  swizzled tile); ``split_order="shared_mask"`` is jla's output order, one mask ``D`` per
  chunk for both ``Ag`` and ``P``. A third (Sec. 40, CPU only so far):
  ``split_protocol="early_s"`` announces ``S_c`` on its own barrier (``s_pub``) as soon as it
  is published, so the output warpgroup issues ``Q S_c`` while the state warpgroup still forms
  ``v_new``, and only ``P v_new`` waits for ``s_ready``.

  It replaces a first three-warpgroup layout (2026-12-03 g) in which the output warpgroup
  formed ``U = Ag V`` and ``W = Ag diag(conn e^G) K`` (``Ag`` as ``hi + lo``, four products)
  one chunk ahead and the state chain was ``fused_split``'s ``v_new = U - W S_c``. On the H200
  (benchmarks/results/mosaic-gpu-h200-2026-12-03g.md; B 8, T 4,096, H 16, K = V = 128, bf16,
  kernel ms) it took 0.637, against 0.422 for the two-warpgroup ``fused_t0`` kernel (plus
  0.170 for ``T0``), 0.206 for ``fused_split``'s state and output kernel (plus 0.243 for
  ``W, U``) and jla's ``fused_fwd_wy`` 0.221 (plus 0.097 for its ``kkt_fwd``): its output
  warpgroup, seven products per chunk, had become the serial path.

Tested on CPU (interpret mode against the fp32 ``lax.scan`` reference and float64, and CUDA
export; ``tests/pallas_kernels/kernel_mosaic_gdn_t0_test.py``): errors on par with the ``W, U``
kernels' (MOSAIC_GPU.md Sec. 11). The two-warpgroup ``fused_t0`` kernel and the first split
layout were timed on the H200 (above); the present ``fused_t0_split`` layout has not yet run
on a GPU.
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
BLOCK_V = mgl.BLOCK_V  # value columns per CTA: the state tile is [K, BLOCK_V] fp32 in registers
STAGES = mgl.STAGES  # depth of the TMA input ring
_IN_COPIES = 10  # TMA copies per ring stage (q, k, w, u, g x2, doc x2, last, conn)


def _issuer(gmem, ring, in_bar, b, h, hk, cols):
    """``issue(n, slot)`` of the memory warpgroup: the ten TMA copies of chunk ``n`` (``q, k``
    of key head ``hk``; ``w`` and the value columns ``cols`` of ``u`` of value head ``h``; the
    gate and document vectors twice, as row and column views need different register layouts;
    ``last``, ``conn``) from ``gmem`` into ``ring[.][slot]``, on ``in_bar[slot]``."""
    q_ref, k_ref, w_ref, u_ref, g_row, g_col, doc_row, doc_col, last_ref, conn_ref = gmem

    def issue(n, slot):
        rows = pl.ds(n * CHUNK, CHUNK)
        srcs = (q_ref.at[b, rows, hk], k_ref.at[b, rows, hk], w_ref.at[b, rows, h],
                u_ref.at[b, rows, h, cols], g_row.at[b, h, rows], g_col.at[b, h, rows],
                doc_row.at[b, rows], doc_col.at[b, rows], last_ref.at[b, rows],
                conn_ref.at[b, rows])
        for src, dst in zip(srcs, ring, strict=True):
            plgpu.copy_gmem_to_smem(src, dst.at[slot], in_bar.at[slot])

    return issue


def _fused_kernel(q_ref, k_ref, w_ref, u_ref, g_ref, doc_ref, last_ref, conn_ref, *rest,
                  num_chunks: int, group: int, scale: float, has_h0: bool, store_v_new: bool,
                  store_h: bool, interpret: bool):
    """Kernel body of :func:`chunk_delta_fused_fwd_mosaic`; refs are GMEM.

    ``rest`` = ``[h0_ref,] o_ref, ht_ref, [vn_ref,] [h_ref,]`` then the scratch; ``shim``
    (interpret mode only) = ``kt_s`` (``k^T``), ``p_s`` (``P``), the SMEM copies of what the GPU
    reads as a transposed view or from registers.
    """
    rest = list(rest)
    h0_ref = rest.pop(0) if has_h0 else None
    o_ref, ht_ref = rest.pop(0), rest.pop(0)
    vn_ref = rest.pop(0) if store_v_new else None
    h_ref = rest.pop(0) if store_h else None
    (q_s, k_s, w_s, u_s, g_row_s, g_col_s, doc_row_s, doc_col_s, last_s, conn_s, sb_s, vn_s,
     vd_s, o_s, state_s, in_bar, in_free, io_bar, done, *shim) = rest
    kt_s, p_s = shim if interpret else (None, None)
    gmem = (q_ref, k_ref, w_ref, u_ref, g_ref, g_ref, doc_ref, doc_ref, last_ref, conn_ref)
    ring = (q_s, k_s, w_s, u_s, g_row_s, g_col_s, doc_row_s, doc_col_s, last_s, conn_s)
    b, h, iv = lax.axis_index("b"), lax.axis_index("h"), lax.axis_index("v")
    hk = lax.div(h, group)  # GVA: value head h reads query/key head h // group
    cols = pl.ds(iv * BLOCK_V, BLOCK_V)
    wg = lax.axis_index("wg")
    dk = k_s.shape[-1]
    sq = (CHUNK, CHUNK)
    tile = (CHUNK, BLOCK_V)

    @pl.when(wg == 1)
    def _memory():
        plgpu.set_max_registers(40, action="decrease")
        mgl.ring_producer(_issuer(gmem, ring, in_bar, b, h, hk, cols), num_chunks, in_free)

    @pl.when(wg == 0)
    def _compute():
        plgpu.set_max_registers(232, action="increase")
        h0 = h0_ref.at[b, h, :, cols] if has_h0 else None
        s0 = mgl.entry_state(h0, state_s, io_bar, (dk, BLOCK_V), interpret)
        i, j = mgl.iota(sq, 0, interpret), mgl.iota(sq, 1, interpret)

        def step(n, s):
            slot = lax.rem(n, STAGES)
            rows = pl.ds(n * CHUNK, CHUNK)
            # The stores of chunk n - 1 (o, v_new, h) must have read their tiles; its wgmma
            # that read sb_s, vn_s, vd_s finished when their accumulators were read.
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)
            sb_s[...] = s.astype(sb_s.dtype)  # S_c in 16 bits: the operand of W S and Q S
            plgpu.commit_smem()
            if store_h:  # the state entering chunk n goes to HBM while the inputs land
                plgpu.copy_smem_to_gmem(sb_s, h_ref.at[b, h, n, :, cols])
            plgpu.barrier_wait(in_bar.at[slot])
            k_t = mgl.transposed(k_s.at[slot], kt_s, interpret)  # k^T (a copy if interpreting)

            def first(ws_acc, qs_acc, qk_acc):  # issued together: one wait for the three
                plgpu.wgmma(ws_acc, w_s.at[slot], sb_s)  # W S, [C, 64]
                plgpu.wgmma(qs_acc, q_s.at[slot], sb_s)  # Q S, [C, 64]
                plgpu.wgmma(qk_acc, q_s.at[slot], k_t)  # Q K^T, [C, C]
                return ws_acc[...], qs_acc[...], qk_acc[...]

            # The barrier keeps the arithmetic after the accumulator reads (jla's pitfall).
            ws, qs, qk = lax.optimization_barrier(pl.run_scoped(
                first, plgpu.ACC(tile), plgpu.ACC(tile), plgpu.ACC(sq)))
            vn = mgl.load_tile(u_s.at[slot], interpret).astype(jnp.float32) - ws  # v_new, fp32
            g_i = mgl.load_rows(g_row_s.at[slot], interpret)  # chunk-local cumsum, fp32
            g_j = mgl.load_cols(g_col_s.at[slot], interpret)
            d_i = mgl.load_rows(doc_row_s.at[slot], interpret)
            d_j = mgl.load_cols(doc_col_s.at[slot], interpret)
            g_last = g_row_s[slot, CHUNK - 1]
            # D_ij = e^{G_i - G_j} on causal same-document pairs; the exponent is masked before
            # exp, so D <= 1 (no overflow above the diagonal, where G_i - G_j >= 0).
            decay = mgl.causal_decay(i, j, g_i, g_j, d_i, d_j)
            p = (qk * decay).astype(vn_s.dtype)  # 16-bit, the left wgmma operand (registers)
            # Token s reaches the next chunk as last_s e^{G_L - G_s} (<= 1); the entering state
            # reaches token t as conn_t e^{G_t}; keep e^{G_L} is 0 if a document starts inside.
            k_decay = jnp.exp(g_last - g_i) * mgl.load_rows(last_s.at[slot], interpret)
            q_decay = jnp.exp(g_i) * mgl.load_rows(conn_s.at[slot], interpret)
            s_decay = jnp.exp(g_last) * conn_s[slot, CHUNK - 1]
            vn_s[...] = vn.astype(vn_s.dtype)
            vd_s[...] = (vn * mgl.by_row(k_decay, tile)).astype(vd_s.dtype)
            plgpu.commit_smem()
            if store_v_new:
                plgpu.copy_smem_to_gmem(vn_s, vn_ref.at[b, rows, h, cols])

            def second(pv_acc, kv_acc):  # issued together
                plgpu.wgmma(pv_acc, mgl.lhs_operand(p, p_s, interpret), vn_s)  # P v_new
                plgpu.wgmma(kv_acc, k_t, vd_s)  # K^T (decayed v_new), [K, 64]
                return pv_acc[...], kv_acc[...]

            pv, kv = lax.optimization_barrier(pl.run_scoped(
                second, plgpu.ACC(tile), plgpu.ACC((dk, BLOCK_V))))
            plgpu.barrier_arrive(in_free.at[slot])  # the chunk's SMEM inputs are consumed
            o = scale * (qs * mgl.by_row(q_decay, tile) + pv)
            o_s[...] = o.astype(o_s.dtype)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(o_s, o_ref.at[b, rows, h, cols])
            # A fresh accumulator plus the decayed state (no run_state in the 0.10.2
            # interpreter).
            return s * s_decay + kv

        s = lax.fori_loop(0, num_chunks, step, s0)
        mgl.store_state(s, state_s, ht_ref.at[b, h, :, cols])

    # Both warpgroups leave together (an early exit while another issues wgmma is unsafe).
    plgpu.barrier_arrive(done)
    plgpu.barrier_wait(done)


def _split_kernel(q_ref, k_ref, w_ref, u_ref, g_ref, doc_ref, last_ref, conn_ref, *rest,
                  num_chunks: int, group: int, scale: float, has_h0: bool, store_v_new: bool,
                  store_h: bool, interpret: bool):
    """Kernel body of :func:`chunk_delta_fused_fwd_mosaic` with ``split_output``: three
    warpgroups (state, output, memory); refs are GMEM.

    ``rest`` = ``[h0_ref,] o_ref, ht_ref, [vn_ref,] [h_ref,]`` then the scratch; ``shim``
    (interpret mode only) = ``kt0_s``, ``kt1_s`` (``k^T`` for the state and the output
    warpgroup), ``p_s`` (``P``).

    With ``state_layout="vk"`` the state warpgroup carries ``S^T`` (``[64, K]`` fp32) and runs
    the transposed chain (:func:`_state_vk_step`); ``h0_ref`` / ``ht_ref`` / ``h_ref`` are then
    ``[..., V, K]`` and ``vn_ref`` ``[B, H, V, Tp]`` (the wrapper transposes), the published
    tiles hold ``S^T`` and ``v_new^T`` and the output warpgroup reads them as transposed views;
    the interpret shim adds ``agt_s`` (``Ag^T``), ``st_s`` (``S``), ``vnt_s`` (``v_new``) and
    the left-operand copies ``sl_s``, ``xt_s``, ``vdt_s``.
    """
    rest = list(rest)
    h0_ref = rest.pop(0) if has_h0 else None
    o_ref, ht_ref = rest.pop(0), rest.pop(0)
    vn_ref = rest.pop(0) if store_v_new else None
    h_ref = rest.pop(0) if store_h else None
    (q_s, k_s, w_s, u_s, g_row_s, g_col_s, doc_row_s, doc_col_s, last_s, conn_s, sb_s, vn_s,
     vd_s, o_s, state_s, in_bar, in_free, s_ready, s_free, io_bar, done, *shim) = rest
    kt0_s, kt1_s, p_s = shim if interpret else (None, None, None)
    gmem = (q_ref, k_ref, w_ref, u_ref, g_ref, g_ref, doc_ref, doc_ref, last_ref, conn_ref)
    ring = (q_s, k_s, w_s, u_s, g_row_s, g_col_s, doc_row_s, doc_col_s, last_s, conn_s)
    b, h, iv = lax.axis_index("b"), lax.axis_index("h"), lax.axis_index("v")
    hk = lax.div(h, group)  # GVA: value head h reads query/key head h // group
    cols = pl.ds(iv * BLOCK_V, BLOCK_V)
    wg = lax.axis_index("wg")
    dk = k_s.shape[-1]
    sq = (CHUNK, CHUNK)
    tile = (CHUNK, BLOCK_V)

    @pl.when(wg == 2)
    def _memory():
        plgpu.set_max_registers(40, action="decrease")
        mgl.ring_producer(_issuer(gmem, ring, in_bar, b, h, hk, cols), num_chunks, in_free)

    @pl.when(wg == 0)
    def _state():
        plgpu.set_max_registers(232, action="increase")
        h0 = h0_ref.at[b, h, :, cols] if has_h0 else None
        s0 = mgl.entry_state(h0, state_s, io_bar, (dk, BLOCK_V), interpret)

        def step(n, s):
            slot, half = lax.rem(n, STAGES), lax.rem(n, 2)
            rows = pl.ds(n * CHUNK, CHUNK)

            @pl.when(n >= 2)
            def _():  # the output warpgroup has read the tiles published two chunks ago
                plgpu.barrier_wait(s_free.at[half])

            # This warpgroup's stores (h, v_new) of chunk n - 2 must have read their tiles.
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)
            sb_s.at[half][...] = s.astype(sb_s.dtype)  # S_c in 16 bits, published
            plgpu.commit_smem()
            if store_h:
                plgpu.copy_smem_to_gmem(sb_s.at[half], h_ref.at[b, h, n, :, cols])
            plgpu.barrier_wait(in_bar.at[slot])

            def w_state(acc):
                plgpu.wgmma(acc, w_s.at[slot], sb_s.at[half])  # W S, [C, 64]
                return acc[...]

            ws = lax.optimization_barrier(pl.run_scoped(w_state, plgpu.ACC(tile)))
            vn = mgl.load_tile(u_s.at[slot], interpret).astype(jnp.float32) - ws  # v_new, fp32
            g_i = mgl.load_rows(g_row_s.at[slot], interpret)
            g_last = g_row_s[slot, CHUNK - 1]
            k_decay = jnp.exp(g_last - g_i) * mgl.load_rows(last_s.at[slot], interpret)
            s_decay = jnp.exp(g_last) * conn_s[slot, CHUNK - 1]
            vn_s.at[half][...] = vn.astype(vn_s.dtype)
            vd_s[...] = (vn * mgl.by_row(k_decay, tile)).astype(vd_s.dtype)
            plgpu.commit_smem()
            plgpu.barrier_arrive(s_ready.at[half])  # S_c and v_new published
            if store_v_new:
                plgpu.copy_smem_to_gmem(vn_s.at[half], vn_ref.at[b, rows, h, cols])
            k_t = mgl.transposed(k_s.at[slot], kt0_s, interpret)

            def update(acc):
                plgpu.wgmma(acc, k_t, vd_s)  # K^T (decayed v_new), [K, 64]
                return acc[...]

            kv = lax.optimization_barrier(pl.run_scoped(update, plgpu.ACC((dk, BLOCK_V))))
            plgpu.barrier_arrive(in_free.at[slot])
            return s * s_decay + kv

        s = lax.fori_loop(0, num_chunks, step, s0)
        for n in range(max(num_chunks - 2, 0), num_chunks):  # observe the last releases
            plgpu.barrier_wait(s_free.at[n % 2])
        mgl.store_state(s, state_s, ht_ref.at[b, h, :, cols])

    @pl.when(wg == 1)
    def _output():
        plgpu.set_max_registers(232, action="increase")
        i, j = mgl.iota(sq, 0, interpret), mgl.iota(sq, 1, interpret)

        def step(n, carry):
            slot, half = lax.rem(n, STAGES), lax.rem(n, 2)
            rows = pl.ds(n * CHUNK, CHUNK)
            plgpu.barrier_wait(in_bar.at[slot])
            k_t = mgl.transposed(k_s.at[slot], kt1_s, interpret)

            def scores(acc):
                plgpu.wgmma(acc, q_s.at[slot], k_t)  # Q K^T, [C, C], while S_c is formed
                return acc[...]

            qk = lax.optimization_barrier(pl.run_scoped(scores, plgpu.ACC(sq)))
            g_i = mgl.load_rows(g_row_s.at[slot], interpret)
            g_j = mgl.load_cols(g_col_s.at[slot], interpret)
            d_i = mgl.load_rows(doc_row_s.at[slot], interpret)
            d_j = mgl.load_cols(doc_col_s.at[slot], interpret)
            decay = mgl.causal_decay(i, j, g_i, g_j, d_i, d_j)
            p = (qk * decay).astype(vn_s.dtype)
            q_decay = jnp.exp(g_i) * mgl.load_rows(conn_s.at[slot], interpret)
            p_op = mgl.lhs_operand(p, p_s, interpret)
            plgpu.barrier_wait(s_ready.at[half])

            def read_out(qs_acc, pv_acc):  # issued together
                plgpu.wgmma(qs_acc, q_s.at[slot], sb_s.at[half])  # Q S, [C, 64]
                plgpu.wgmma(pv_acc, p_op, vn_s.at[half])  # P v_new, [C, 64]
                return qs_acc[...], pv_acc[...]

            qs, pv = lax.optimization_barrier(pl.run_scoped(
                read_out, plgpu.ACC(tile), plgpu.ACC(tile)))
            plgpu.barrier_arrive(s_free.at[half])
            plgpu.barrier_arrive(in_free.at[slot])
            o = scale * (qs * mgl.by_row(q_decay, tile) + pv)
            plgpu.wait_smem_to_gmem(1, wait_read_only=True)  # o_s[half] of chunk n - 2 was read
            o_s.at[half][...] = o.astype(o_s.dtype)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(o_s.at[half], o_ref.at[b, rows, h, cols])
            return carry

        lax.fori_loop(0, num_chunks, step, 0)
        plgpu.wait_smem_to_gmem(0)

    # All warpgroups leave together (an early exit while another issues wgmma is unsafe).
    plgpu.barrier_arrive(done)
    plgpu.barrier_wait(done)


def check_fused_inputs(q, k, w, u, g, segment_ids, initial_state) -> None:
    """The input contract of :func:`chunk_delta_fused_fwd_mosaic`.

    Raises:
        ValueError: naming the argument and the shape or dtype it needs.
    """
    batch, seq_len, kv_heads, dk = k.shape
    heads, dv = u.shape[2], u.shape[3]
    mgl.check_kv_gates(k, u, g, segment_ids, names=("k", "u"))
    if q.shape != k.shape or q.dtype != k.dtype:
        raise ValueError(f"q must have k's shape {k.shape} and dtype {k.dtype}, got {q.shape=} "
                         f"{q.dtype=}")
    if w.shape != (batch, seq_len, heads, dk) or w.dtype != k.dtype:
        raise ValueError(f"w must be [B, T, H, K] = {(batch, seq_len, heads, dk)} in k's dtype "
                         f"{k.dtype}, got {w.shape=} {w.dtype=}")
    if initial_state is not None and initial_state.shape != (batch, heads, dk, dv):
        raise ValueError(f"initial_state must be [B, H, K, V] = {(batch, heads, dk, dv)}, got "
                         f"{initial_state.shape=}")


@functools.partial(jax.jit, static_argnames=("scale", "store_v_new", "store_h", "split_output",
                                             "interpret"))
def chunk_delta_fused_fwd_mosaic(
    q: jax.Array,
    k: jax.Array,
    w: jax.Array,
    u: jax.Array,
    g: Optional[jax.Array],
    *,
    scale: float,
    initial_state: Optional[jax.Array] = None,
    segment_ids: Optional[jax.Array] = None,
    store_v_new: bool = False,
    store_h: bool = False,
    split_output: bool = False,
    interpret: bool = False,
) -> Tuple[jax.Array, jax.Array, Optional[jax.Array], Optional[jax.Array]]:
    """The delta state pass and the output of every chunk in one Mosaic GPU kernel.

    Per batch row, value head and chunk ``c`` of 64 tokens (module docstring; paper arXiv
    2607.07953, Eqs. 15-17; FLA's ``chunk_gated_delta_rule_fwd_h`` + ``chunk_fwd_o``), with
    ``G`` the chunk-local inclusive cumulative log-decay (fp32), ``G_L`` its last entry::

        v_new_c = U_c - W_c S_c
        o_c     = scale ( diag(conn e^G) Q_c S_c + (Q_c K_c^T * D) v_new_c )
        S_{c+1} = keep_c e^{G_L} S_c + K_c^T (last_c * e^{G_L - G} * v_new_c)

    from ``S_0 = initial_state``: the results of
    :func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu.chunk_delta_h_mosaic` (with
    ``states_dtype`` the input dtype) followed by
    :func:`pallas_kernels.simple_gla.kernel_mosaic_gpu.chunk_output_mosaic` on ``v_new``, with
    the same roundings, in one kernel that writes neither ``h`` nor ``v_new`` unless asked. With
    ``W, U`` from :func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu.chunk_wy_mosaic` this
    is the Gated DeltaNet forward: ``o_t = scale S_t^T q_t`` of
    :func:`pallas_kernels.gated_delta_rule.reference.gated_delta_rule_reference`, ``v_new`` its
    residual ``u``.

    Args:
        q: queries ``[B, T, Hk, K]``, bf16 or fp16; ``H % Hk == 0`` (value head ``h`` reads
            query/key head ``h // (H // Hk)``); used as given (L2-normalise beforehand).
        k: keys ``[B, T, Hk, K]``, q's shape and dtype.
        w: ``W = T diag(beta conn e^G) K`` ``[B, T, H, K]`` per value head, k's dtype.
        u: ``U = T diag(beta) V`` ``[B, T, H, V]``, k's dtype. ``K, V`` in {64, 128}.
        g: per-token log-decay ``[B, T, H]`` (natural log, ``<= 0``), or ``None`` (DeltaNet).
        scale: read-out scale (static).
        initial_state: ``[B, H, K, V]`` state before the first token (read as fp32), or
            ``None`` for zeros; it applies to the first document of each row only.
        segment_ids: optional int ``[B, T]``; the state resets to zero wherever the id changes.
        store_v_new: also write ``v_new`` (static; the residual ``u`` of the routing layers and
            of the backward).
        store_h: also write the state entering every chunk (static; the backward's ``h``).
        split_output: run the read-out on its own warpgroup (static; module docstring):
            three warpgroups (state, output, memory) with ``S`` and ``v_new`` published
            through double-buffered SMEM tiles, instead of two (compute, memory). Same
            products, same roundings, same results.
        interpret: run the kernel in Mosaic GPU interpret mode (CPU; slow, for tests).

    Returns:
        ``(o, final_state, v_new, h)``: ``o`` ``[B, T, H, V]`` in the input dtype;
        ``final_state`` ``[B, H, K, V]`` fp32, the state after token ``T - 1``; ``v_new``
        ``[B, T, H, V]`` in the input dtype, or ``None`` without ``store_v_new``; ``h``
        ``[B, H, N, K, V]`` in the input dtype (``N = ceil(T / 64)``, the layout of
        ``chunk_delta_h_mosaic``'s ``h``), or ``None`` without ``store_h``. Exact up to the
        16-bit rounding of the ``wgmma`` operands (``W``, ``U``, ``S``, ``P``, ``v_new``,
        ``last e^{G_L - G} v_new``) with fp32 accumulation.

    Raises:
        ValueError: on mismatched shapes or dtypes of ``q, k, w, u``, unsupported head dims or
            dtypes, ``H`` not a multiple of ``Hk``, a bad ``g``, ``segment_ids`` or
            ``initial_state`` shape.
    """
    batch, seq_len, kv_heads, dk = k.shape
    heads, dv = u.shape[2], u.shape[3]
    check_fused_inputs(q, k, w, u, g, segment_ids, initial_state)

    num_chunks = -(-seq_len // CHUNK)
    padded = num_chunks * CHUNK
    # Padding tokens have q = k = w = u = 0 and g = 0: v_new = 0 and o = 0 there, the state is
    # unchanged (they are the last tokens, so they reach no real token).
    q, k, w, u = (mgl.pad_time(x, num_chunks) for x in (q, k, w, u))
    gc = mgl.chunk_cumsum(g, (batch, seq_len, heads), num_chunks)  # [B, H, Tp]
    doc, conn, last = mgl.doc_vectors(segment_ids, batch, num_chunks)  # [B, Tp] each
    has_h0 = initial_state is not None
    body = _split_kernel if split_output else _fused_kernel
    kernel = functools.partial(body, num_chunks=num_chunks, group=heads // kv_heads,
                               scale=float(scale), has_h0=has_h0, store_v_new=store_v_new,
                               store_h=store_h, interpret=interpret)
    dtype = u.dtype
    out_type = [jax.ShapeDtypeStruct((batch, padded, heads, dv), dtype),  # o
                jax.ShapeDtypeStruct((batch, heads, dk, dv), jnp.float32)]  # final state
    if store_v_new:
        out_type.append(jax.ShapeDtypeStruct((batch, padded, heads, dv), dtype))
    if store_h:
        out_type.append(jax.ShapeDtypeStruct((batch, heads, num_chunks, dk, dv), dtype))
    vec = plgpu.SMEM((STAGES, CHUNK), jnp.float32)
    swz = mgl.swizzled_smem
    pub = (2,) if split_output else ()  # published tiles: double-buffered between warpgroups
    scratch = [
        swz((STAGES, CHUNK, dk), q.dtype),  # q_s
        swz((STAGES, CHUNK, dk), k.dtype),  # k_s
        swz((STAGES, CHUNK, dk), w.dtype),  # w_s
        swz((STAGES, CHUNK, BLOCK_V), dtype),  # u_s
        vec, vec, vec, vec, vec, vec,  # g_row_s, g_col_s, doc_row_s, doc_col_s, last_s, conn_s
        swz(pub + (dk, BLOCK_V), dtype),  # sb_s: S in 16 bits (operand of W S, Q S; h staging)
        swz(pub + (CHUNK, BLOCK_V), dtype),  # vn_s: v_new, operand of P v_new (and staging)
        swz((CHUNK, BLOCK_V), dtype),  # vd_s: last e^{G_L - G} v_new, the wgmma operand
        swz(pub + (CHUNK, BLOCK_V), dtype),  # o_s: staging of the output tile
        swz((dk, BLOCK_V), jnp.float32),  # state_s: staging of h0, final state
        plgpu.Barrier(num_arrivals=_IN_COPIES, num_barriers=STAGES),  # in_bar: copies landed
        # in_free: a stage may be refilled (released by each consuming warpgroup)
        plgpu.Barrier(num_arrivals=2 if split_output else 1, num_barriers=STAGES),
    ]
    if split_output:
        scratch += [plgpu.Barrier(num_arrivals=1, num_barriers=2),  # s_ready: S, v_new published
                    plgpu.Barrier(num_arrivals=1, num_barriers=2)]  # s_free: both were read
    scratch += [plgpu.Barrier(num_arrivals=1),  # io_bar: h0 landed
                plgpu.Barrier(num_arrivals=3 if split_output else 2)]  # done: all finished
    if interpret:  # SMEM copies of what the GPU reads as a transposed view or from registers
        scratch += [plgpu.SMEM((dk, CHUNK), k.dtype)] * (2 if split_output else 1)  # k^T
        scratch += [swz((CHUNK, CHUNK), dtype)]  # p_s: P
    call = plgpu.kernel(
        kernel,
        out_type=tuple(out_type),
        scratch_types=scratch,
        grid=(batch, heads, dv // BLOCK_V),
        grid_names=("b", "h", "v"),
        num_threads=3 if split_output else 2,
        thread_name="wg",
        compiler_params=mgl.compiler_params(),
        interpret=mgl.interpret_params() if interpret else None,
        kernel_name="gdn_chunk_delta_fused_fwd_split" if split_output else
        "gdn_chunk_delta_fused_fwd",
    )
    h0 = () if initial_state is None else (initial_state.astype(jnp.float32),)
    with jax.named_scope("gdn_chunk_delta_fused_fwd_mosaic"):
        outs = list(call(q, k, w, u, gc, doc, last, conn, *h0))
    o, final_state = outs.pop(0), outs.pop(0)
    v_new = outs.pop(0)[:, :seq_len] if store_v_new else None
    h = outs.pop(0) if store_h else None
    return o[:, :seq_len], final_state, v_new, h


# ----------------------------------------------------------------------------------------------
# forward="fused_t0": v_new formed from v and the gate-free inverse T0 inside the kernel.

_T0_IN_COPIES = 11  # TMA copies per ring stage (q, k, v, t0, g x2, beta, doc x2, last, conn)
# Timing ablations of the two-warpgroup fused_t0 kernel's per-chunk body (``stages`` of
# chunk_delta_fused_t0_fwd_mosaic; MOSAIC_GPU.md Sec. 16), cumulative along the state chain:
# "io" waits for each chunk's eleven copies (the memory warpgroup and ring unchanged), releases
# the stage and stores the landed v tile as o (no wgmma, the state stays the entering one);
# "v_new" adds S_c to SMEM, K S, X, Ag and v_new = Ag X (jla's u, w step; o = v_new, no state
# update); "state" adds the decayed v_new and the update S <- keep e^{G_L} S + K^T (...) (the
# whole serial chain, what a state warpgroup of a split kernel does; o = v_new); "full" is the
# kernel (adds Q S, Q K^T, P and P v_new, the read-out). Two more do all of "full"'s work:
# "no_store" issues the TMA store of o for each row's last chunk only (the other rows of o are
# left unwritten), "nobar" is "full" compiled with CompilerParams(unsafe_no_auto_barriers=True)
# (no warpgroup barriers around register -> SMEM stores; it should still return o). The grid,
# warpgroups, ring, SMEM allocation and the final-state store are the same in all; every stage
# but "full" and "nobar" writes something that is NOT the forward's o.
FUSED_T0_STAGES = ("full", "io", "v_new", "state", "no_store", "nobar")
# Timing ablations of the three-warpgroup fused_t0_split kernel (``stages`` with
# split_output=True; MOSAIC_GPU.md Sec. 39), cut around its warpgroups rather than along one
# program: what bounds a split kernel is the slower of two concurrent warpgroups (the state
# chain, the read-out) plus what couples them (s_ready / s_free, the ring's two releases), so
# the cuts run each side alone with the other reduced to its barrier duties. The memory
# warpgroup (eleven copies per chunk into the split_stages-deep ring), the grid, the SMEM
# allocation (aliases included), every barrier and the final-state store are those of "full"
# in all; each barrier a warpgroup waits on is waited on for every phase, and each is arrived
# as often as in "full" or not at all (no phase is lapped: _SPLIT_PROTOCOL's induction holds
# with the waits and arrivals listed here).
#   "io": state and output warpgroups wait for each chunk's stage (in_bar) and release it
#     (in_free); the output warpgroup stores the landed v tile as o through o_s (no wgmma, no
#     s_ready / s_free, the state stays the entering one). The floor of the structure: the
#     copies, the ring at this depth, the o stores, one CTA per SM.
#   "state": the state warpgroup's whole per-chunk program (publish S_c, K S with Ag formed
#     beside it, X, Ag X, the v_new publish and s_ready, the update, in_free); the output
#     warpgroup only waits s_ready, stores the published v_new tile as o by TMA, waits for that
#     store's read and arrives on s_free and in_free (no product, no mask). Its time is the
#     serial chain's, with the ring and the double-buffered publish as in "full".
#   "readout": the output warpgroup's whole per-chunk program (in_bar, Q K^T, the mask, P,
#     s_ready, Q S_c + P v_new, s_free, in_free, o); the state warpgroup publishes S once
#     (the entering state, in both halves) and per chunk only copies the landed v tile into
#     the published v_new tile (waits s_free two back and in_bar; arrives s_ready, in_free):
#     no product, no Ag. o is the read-out of a chain frozen at the entering state with
#     v_new = v: scale (diag(conn e^G) Q S_0 + (Q K^T * D) v), S_0 and P in 16 bits.
#   "full": the kernel. "no_store": full with the TMA store of o for each row's last chunk
#     only (other rows unwritten). "nobar": full compiled with unsafe_no_auto_barriers.
# "state" and "readout" need split_order="state_ag" (in the other orders the output warpgroup
# forms Ag for the state warpgroup, so neither side runs alone); "io", "no_store" and "nobar"
# take any order. All need state_layout="kv" and no store_v_new / store_h. Kernel names add
# _abl_<stages> to the split kernel's (e.g. gdn_chunk_delta_fused_t0_fwd_split_sa_s3_abl_state).
# Differences: state - io is the chain's own cost over the floor, readout - io the read-out's;
# full - max(state, readout) is what the coupling adds (a warpgroup waiting for the other).
SPLIT_T0_STAGES = ("full", "io", "state", "readout", "no_store", "nobar")
_SPLIT_STATE_AG_STAGES = ("state", "readout")  # the stages that need split_order="state_ag"
# The order of the output warpgroup's two tasks per chunk in the three-warpgroup fused_t0_split
# kernel (a timing choice; same arithmetic, same barriers): "readout_first" (the default since
# 2026-12-04f; H200, S1: 0.358 ms) reads out chunk n (releasing its stage), then forms Ag of
# chunk n + 1; "prepare_first" (the default before; 0.520 ms) forms Ag of chunk n + 1, waiting
# for its stage, then reads out chunk n (MOSAIC_GPU.md Sec. 16). Kernel names:
# gdn_chunk_delta_fused_t0_fwd_split_ro and gdn_chunk_delta_fused_t0_fwd_split, as before.
# "prepare_mid" (2026-12-04f, not yet timed; MOSAIC_GPU.md Sec. 17) runs the state-free half of
# chunk n's read-out (Q K^T, P), then Ag of chunk n + 1, then the state-dependent half (on
# s_ready: Q S, P v_new, o), so Ag of chunk n + 1 no longer waits for a read-out; it is meant
# for split_stages=3, with which chunk n + 1's copies are issued a chunk earlier. "state_ag"
# (2026-12-04f, not yet timed) has the state warpgroup form Ag itself, while its K S product
# runs, and leaves the output warpgroup the read-out only: the state warpgroup then never waits
# for the output warpgroup except through the double-buffered s_free (and the ring's in_free).
# Kernel name suffixes _pm and _sa; split_stages=3 appends _s3.
SPLIT_ORDERS = ("readout_first", "prepare_first", "prepare_mid", "state_ag", "shared_mask")
SPLIT_DEFAULT_ORDER = "readout_first"
_SPLIT_ORDER_SUFFIX = {"readout_first": "_ro", "prepare_first": "", "prepare_mid": "_pm",
                       "state_ag": "_sa", "shared_mask": "_sm"}
# Depths of the split kernel's TMA input ring (split_stages): 2 (the default, STAGES) or 3.
SPLIT_STAGES = (2, 3)
# How the split kernel's state warpgroup carries the fp32 state (state_layout; MOSAIC_GPU.md
# Sec. 35): "kv" (the default) S [K, 64], the right operand of K S and the output of
# K^T (decayed v_new), so S, X and the decayed v_new go to SMEM (16 KB + 8 + 8, three fences)
# on the serial chain; "vk" S^T [64, K] as jla's fused_fwd_wy carries it: the three products
# S^T K^T, X^T Ag^T and (decayed v_new)^T K all take their left operand from registers, and
# only the published S^T and v_new^T (for the output warpgroup) are stored.
SPLIT_STATE_LAYOUTS = ("kv", "vk")
# How the split kernel's state warpgroup tells the output warpgroup that a chunk's published
# tiles are ready (split_protocol; MOSAIC_GPU.md Sec. 40): "joint" (the default) one barrier,
# s_ready, once S_c and v_new are both published, so the output warpgroup issues Q S_c and
# P v_new together after v_new; "early_s" a second barrier pair, s_pub, arrived as soon as S_c
# is published (before K S), so the output warpgroup issues Q S_c while the state warpgroup
# still forms X and v_new, and only P v_new waits for s_ready. The output warpgroup then
# arrives s_free one product (Q S_c, 64 x 64 x K) sooner after s_ready. Same arithmetic, bit
# for bit; 16 bytes of SMEM (two mbarriers). Kernel name suffix _es after _s3. "kv" layout
# and the stages that run both sides ("full", "no_store", "nobar") only; every split_order.
SPLIT_PROTOCOLS = ("joint", "early_s")
SPLIT_DEFAULT_PROTOCOL = "joint"
_SPLIT_PROTOCOL_SUFFIX = {"joint": "", "early_s": "_es"}
# SMEM of the split kernel at K = V = 128, bf16 (Mosaic GPU aligns every buffer to 1 KB; the
# limit is 227 KB = 232,448 bytes per block on the H100 / H200). One ring stage: q 16 KB, k 16,
# v 8, T0 / Ag 8, seven fp32 [64] vectors 0.25 each (49.75 KB). Tiles: S in 16 bits 2 x 16 KB,
# X 8, v_new 2 x 8, decayed v_new 8, o 2 x 8, the fp32 h0 / final state 32 (112 KB); barriers
# 128 bytes. Two stages: 99.5 + 112 = 211.5 KB. Three stages need 149.25 + 112 = 261.25 KB, so
# split_stages=3 aliases two pairs of tiles whose lifetimes are disjoint: the decayed v_new
# takes X's tile (X is dead once the Ag X product was read, and the next X is written after
# the state update's product was read: both in the state warpgroup's program order), and the
# fp32 state staging shares a RefUnion with the published S (h0 is loaded into registers
# before the first S is written, with the automatic warpgroup barrier before that store; the
# final state is written after the state warpgroup observed s_free of the last two chunks and
# waited for its own h stores). 149.25 + 32 + 8 + 16 + 16 = 221.25 KB; Mosaic GPU's own count
# (every buffer aligned to 1 KB, so each 0.5 or 0.75 KB vector takes 1 KB, plus the barriers)
# is 220,256 bytes (215.1 KB) for two stages and 228,472 (223.1 KB) for three, checked by the
# CUDA export (Mosaic GPU raises above 227 KB; LoweringTest).
#
# _SPLIT_PROTOCOL: why the split kernel cannot deadlock, in every order and at either ring
# depth R >= 2. Waits (W) and arrivals (A) per chunk n, on barriers indexed by slot = n mod R
# (in_bar, in_free, ag_ready) or half = n mod 2 (s_ready, s_free):
#   memory  issue(n): n >= R: W in_free[n - R] (2 arrivals), then the copies arrive in_bar[n].
#   state   step(n): n >= 2: W s_free[n - 2]; W in_bar[n]; W ag_ready[n] (not with
#           "state_ag", which forms Ag itself); A s_ready[n]; A in_free[n].
#   output  prepare(m): W in_bar[m]; A ag_ready[m]. read_scores(n): no wait (prepare(n)
#           waited for the stage; "state_ag": W in_bar[n] instead). read_state(n):
#           W s_ready[n]; A s_free[n]; A in_free[n]. Program order: prepare(0), then per n:
#           read_scores(n), prepare(n + 1) and read_state(n) in the order's sequence
#           (prepare(n + 1) before or after either half; "state_ag": no prepare;
#           "shared_mask": prepare(n), read_scores(n), read_state(n) per n, which is
#           readout_first's sequence of events with prepare(0) in the first step).
# (tests/pallas_kernels/kernel_mosaic_gdn_t0_test.py runs this protocol, with the SMEM buffers
# it guards, under random schedules: LoweringTest.test_split_protocol_cannot_deadlock.)
# Induction on n: assume every event of chunks < n happened (state steps, output halves,
# prepares up to prepare(n)). Then issue(n + 1) can happen (it waits for in_free of chunk
# n + 1 - R <= n - 1), so prepare(n + 1) can (in_bar[n + 1]); state step(n) can run to its end
# (s_free of n - 2, in_bar[n], ag_ready[n] from prepare(n): none waits for anything of chunk
# n); then read_state(n) can (s_ready[n]). Every wait of chunk n therefore names an arrival of
# chunk n - 1 or earlier, of chunk n from a warpgroup that does not wait for chunk n in
# between, or issue(n + 1), which needs only chunks <= n + 1 - R: the waits-for relation
# strictly decreases (chunk, warpgroup) and has no cycle, whatever the output warpgroup's
# order. No barrier slot is reused before its last use was observed: in_bar / in_free by the
# ring (a slot is refilled after both consumers released it); s_ready[n mod 2] is arrived
# again only after the state warpgroup waited s_free[n], which follows the output's
# W s_ready[n]; s_free likewise; ag_ready[m mod R] is arrived again by prepare(m + R), which
# comes after read_state(m + R - 2) (R = 2 and 3 and every order: prepare(m + R) is in step
# m + R - 1 and follows read_state(m + R - 2) of step m + R - 2), whose W s_ready[m + R - 2]
# follows the state warpgroup's W ag_ready[m] (m + R - 2 >= m).
# split_protocol="early_s" adds one barrier pair, s_pub (half = n mod 2): the state step(n)
# arrives A s_pub[n] right after publishing S_c (after its W s_free[n - 2], before W in_bar[n]),
# and read_state(n) becomes W s_pub[n]; (Q S_c issued); W s_ready[n]; (P v_new issued); A
# s_free[n]; A in_free[n]. The induction is unchanged: W s_pub[n] names an arrival of chunk n by
# the state warpgroup, which waits for nothing of chunk n before it (s_free of n - 2 only);
# s_pub[n mod 2] is arrived again by step(n + 2) only after its W s_free[n], which follows the
# output's W s_pub[n]. The published S is read from W s_pub[n] until s_free[n], as before; the
# published v_new is written before A s_ready[n] and read only after W s_ready[n].


def fused_t0_kernel_name(*, split_output: bool = False, split_order: str = SPLIT_DEFAULT_ORDER,
                         split_stages: int = STAGES, state_layout: str = "kv",
                         stages: str = "full",
                         split_protocol: str = SPLIT_DEFAULT_PROTOCOL) -> str:
    """The Mosaic GPU kernel name of :func:`chunk_delta_fused_t0_fwd_mosaic` with these static
    options, as a profile lists it: ``gdn_chunk_delta_fused_t0_fwd`` (two warpgroups), or with
    ``split_output`` ``..._split`` plus the order's suffix (``_ro``, ``_pm``, ``_sa``, ``_sm``;
    none for ``prepare_first``), ``_s3`` for three ring stages, ``_es`` for
    ``split_protocol="early_s"`` and ``_vk`` for the transposed
    state; then ``_abl_<stages>`` for a timing ablation (``stages`` other than ``"full"``).
    No validation (the function's own checks raise first)."""
    if split_output:
        name = ("gdn_chunk_delta_fused_t0_fwd_split" + _SPLIT_ORDER_SUFFIX[split_order]
                + ("" if split_stages == STAGES else f"_s{split_stages}")
                + _SPLIT_PROTOCOL_SUFFIX[split_protocol]
                + ("_vk" if state_layout == "vk" else ""))
    else:
        name = "gdn_chunk_delta_fused_t0_fwd"
    return name + ("" if stages == "full" else f"_abl_{stages}")


def _t0_issuer(gmem, ring, in_bar, b, h, hk, cols):
    """``issue(n, slot)`` of the memory warpgroup of :func:`_fused_t0_kernel`: the eleven TMA
    copies of chunk ``n`` (``q, k`` of key head ``hk``; the value columns ``cols`` of ``v`` and
    the ``T0`` rows of value head ``h``; the gate twice (row and column views), ``beta``
    (column view), the document vector twice, ``last``, ``conn``)."""
    (q_ref, k_ref, v_ref, t0_ref, g_row, g_col, beta_col, doc_row, doc_col, last_ref,
     conn_ref) = gmem

    def issue(n, slot):
        rows = pl.ds(n * CHUNK, CHUNK)
        srcs = (q_ref.at[b, rows, hk], k_ref.at[b, rows, hk], v_ref.at[b, rows, h, cols],
                t0_ref.at[b, rows, h], g_row.at[b, h, rows], g_col.at[b, h, rows],
                beta_col.at[b, h, rows], doc_row.at[b, rows], doc_col.at[b, rows],
                last_ref.at[b, rows], conn_ref.at[b, rows])
        for src, dst in zip(srcs, ring, strict=True):
            plgpu.copy_gmem_to_smem(src, dst.at[slot], in_bar.at[slot])

    return issue


def _fused_t0_kernel(q_ref, k_ref, v_ref, t0_ref, g_ref, beta_ref, doc_ref, last_ref, conn_ref,
                     *rest, num_chunks: int, group: int, scale: float, has_h0: bool,
                     store_v_new: bool, store_h: bool, interpret: bool, stages: str = "full",
                     pieces: int = 1, summary: bool = False, piece_skip: bool = False):
    """Kernel body of :func:`chunk_delta_fused_t0_fwd_mosaic`; refs are GMEM.

    ``rest`` = ``[h0_ref,] [start_ref,] [o_ref,] ht_ref, [vn_ref,] [h_ref,]`` then the
    scratch (no ``o_ref``
    with ``summary``: the state chain alone, only the final state stored, for a sequence
    piece's pass from zero). With ``pieces = P > 1`` the grid's rows are ``P`` pieces of
    ``num_chunks`` chunks per batch row and ``h`` is stored at the batch row ``b // P`` and
    global chunk ``(b mod P) num_chunks + n`` (MOSAIC_GPU.md Sec. 42). ``shim``
    (interpret mode only) = ``kt_s`` (``k^T``), ``p_s`` (``P``), ``hi_s``, ``lo_s`` (the two
    terms of ``Ag``), the SMEM copies of what the GPU reads as a transposed view or from
    registers. ``stages`` (:data:`FUSED_T0_STAGES`): a timing ablation that cuts each chunk's
    work short (``"full"``: the kernel; ``"nobar"`` only changes the compiler parameters).
    ``piece_skip`` (with ``summary``, MOSAIC_GPU.md Sec. 52): ``start_ref`` int32 ``[B * P]``;
    row ``b`` loads and runs only its chunks ``start[b] ..`` from a zero state (the chunk of
    the piece's last document start: nothing entering it reaches the exit).
    """
    rest = list(rest)
    h0_ref = rest.pop(0) if has_h0 else None
    start_ref = rest.pop(0) if piece_skip else None
    o_ref = None if summary else rest.pop(0)
    ht_ref = rest.pop(0)
    vn_ref = rest.pop(0) if store_v_new else None
    h_ref = rest.pop(0) if store_h else None
    (q_s, k_s, v_s, t0_s, g_row_s, g_col_s, b_col_s, doc_row_s, doc_col_s, last_s, conn_s,
     sb_s, x_s, vn_s, vd_s, o_s, state_s, in_bar, in_free, io_bar, done, *shim) = rest
    if summary:
        stages = "state"  # the state chain without the read-out; no o stored (below)
    kt_s, p_s, hi_s, lo_s = shim if interpret else (None,) * 4
    gmem = (q_ref, k_ref, v_ref, t0_ref, g_ref, g_ref, beta_ref, doc_ref, doc_ref, last_ref,
            conn_ref)
    ring = (q_s, k_s, v_s, t0_s, g_row_s, g_col_s, b_col_s, doc_row_s, doc_col_s, last_s,
            conn_s)
    b, h, iv = lax.axis_index("b"), lax.axis_index("h"), lax.axis_index("v")
    hk = lax.div(h, group)  # GVA: value head h reads query/key head h // group
    cols = pl.ds(iv * BLOCK_V, BLOCK_V)
    # h's row and chunk (pieces as rows); one piece: the grid's row and n, as before
    b_out = b if pieces == 1 else lax.div(b, pieces)

    def h_chunk(n):
        return n if pieces == 1 else lax.rem(b, pieces) * num_chunks + n
    wg = lax.axis_index("wg")
    dk = k_s.shape[-1]
    dtype = v_s.dtype
    sq = (CHUNK, CHUNK)
    tile = (CHUNK, BLOCK_V)

    lo = None if start_ref is None else start_ref[b]  # piece_skip: the chain's first chunk

    @pl.when(wg == 1)
    def _memory():
        plgpu.set_max_registers(40, action="decrease")
        issue = _t0_issuer(gmem, ring, in_bar, b, h, hk, cols)
        if lo is None:
            mgl.ring_producer(issue, num_chunks, in_free)
        else:
            mgl.ring_producer_from(issue, lo, num_chunks, in_free)

    @pl.when(wg == 0)
    def _compute():
        plgpu.set_max_registers(232, action="increase")
        h0 = h0_ref.at[b, h, :, cols] if has_h0 else None
        s0 = mgl.entry_state(h0, state_s, io_bar, (dk, BLOCK_V), interpret)
        i, j = mgl.iota(sq, 0, interpret), mgl.iota(sq, 1, interpret)
        output = stages not in ("v_new", "state")  # the read-out's products (Q S, Q K^T, P v)

        def by_col(x):
            return lax.broadcast_in_dim(x, sq, [1])

        def store_o(rows, n):  # o_s (written and committed) to the output rows of chunk n
            if summary:  # no output: the pass keeps only its final state
                return
            if stages == "no_store":  # the TMA store only for the row's last chunk
                @pl.when(n + 1 == num_chunks)
                def _store_last():
                    plgpu.copy_smem_to_gmem(o_s, o_ref.at[b, rows, h, cols])
            else:
                plgpu.copy_smem_to_gmem(o_s, o_ref.at[b, rows, h, cols])

        def step(n, s):
            slot = lax.rem(n, STAGES)
            rows = pl.ds(n * CHUNK, CHUNK)
            # The stores of chunk n - 1 (o, v_new, h) must have read their tiles; its wgmma
            # that read sb_s, x_s, vn_s, vd_s finished when their accumulators were read.
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)
            if stages == "io":  # no wgmma, no state: the landed v tile goes out as o
                plgpu.barrier_wait(in_bar.at[slot])
                o = mgl.load_tile(v_s.at[slot], interpret)
                plgpu.barrier_arrive(in_free.at[slot])
                o_s[...] = o.astype(o_s.dtype)
                plgpu.commit_smem()
                store_o(rows, n)
                return s
            sb_s[...] = s.astype(sb_s.dtype)  # S_c in 16 bits: the operand of K S and Q S
            plgpu.commit_smem()
            if store_h:  # the state entering chunk n goes to HBM while the inputs land
                plgpu.copy_smem_to_gmem(sb_s, h_ref.at[b_out, h, h_chunk(n), :, cols])
            plgpu.barrier_wait(in_bar.at[slot])
            k_t = mgl.transposed(k_s.at[slot], kt_s, interpret)  # k^T (a copy if interpreting)

            def first(ks_acc, qs_acc, qk_acc):  # issued together: one wait for the three
                plgpu.wgmma(ks_acc, k_s.at[slot], sb_s)  # K S, [C, 64]
                plgpu.wgmma(qs_acc, q_s.at[slot], sb_s)  # Q S, [C, 64]
                plgpu.wgmma(qk_acc, q_s.at[slot], k_t)  # Q K^T, [C, C]
                return ks_acc[...], qs_acc[...], qk_acc[...]

            def first_ks(ks_acc):  # the state chain's K S alone (stages without the output)
                plgpu.wgmma(ks_acc, k_s.at[slot], sb_s)
                return ks_acc[...]

            # The barrier keeps the arithmetic after the accumulator reads (jla's pitfall).
            if output:
                ks, qs, qk = lax.optimization_barrier(pl.run_scoped(
                    first, plgpu.ACC(tile), plgpu.ACC(tile), plgpu.ACC(sq)))
            else:
                ks = lax.optimization_barrier(pl.run_scoped(first_ks, plgpu.ACC(tile)))
            g_i = mgl.load_rows(g_row_s.at[slot], interpret)  # chunk-local cumsum, fp32
            g_j = mgl.load_cols(g_col_s.at[slot], interpret)
            d_i = mgl.load_rows(doc_row_s.at[slot], interpret)
            d_j = mgl.load_cols(doc_col_s.at[slot], interpret)
            g_last = g_row_s[slot, CHUNK - 1]
            # The entering state reaches token t as conn_t e^{G_t}: in the read-out and in the
            # right-hand side X = V - diag(conn e^G) K S of the WY solve.
            q_decay = jnp.exp(g_i) * mgl.load_rows(conn_s.at[slot], interpret)
            x = (mgl.load_tile(v_s.at[slot], interpret).astype(jnp.float32)
                 - ks * mgl.by_row(q_decay, tile))
            x_s[...] = x.astype(x_s.dtype)  # 16-bit, the right operand of Ag X
            plgpu.commit_smem()
            # D_ij = e^{G_i - G_j} on causal same-document pairs (the exponent masked before
            # exp, so D <= 1); Ag = T0 * D * beta_j is the gated inverse times diag(beta).
            decay = mgl.causal_decay(i, j, g_i, g_j, d_i, d_j)
            t0 = mgl.load_tile(t0_s.at[slot], interpret).astype(jnp.float32)
            ag = t0 * decay * by_col(mgl.load_cols(b_col_s.at[slot], interpret))
            hi = ag.astype(dtype)  # Ag as two 16-bit terms: only T0's own rounding remains
            lo = (ag - hi.astype(jnp.float32)).astype(dtype)

            def solve(acc):  # v_new = Ag X, [C, 64], one accumulator for hi and lo
                plgpu.wgmma(acc, mgl.lhs_operand(hi, hi_s, interpret), x_s)
                plgpu.wgmma(acc, mgl.lhs_operand(lo, lo_s, interpret), x_s)
                return acc[...]

            vn = lax.optimization_barrier(pl.run_scoped(solve, plgpu.ACC(tile)))  # fp32
            if stages == "v_new":  # no state update, no read-out: v_new goes out as o
                o_s[...] = vn.astype(o_s.dtype)
                plgpu.commit_smem()
                plgpu.barrier_arrive(in_free.at[slot])
                store_o(rows, n)
                return s
            if stages == "state":  # the state chain without the read-out: v_new goes out as o
                k_decay = jnp.exp(g_last - g_i) * mgl.load_rows(last_s.at[slot], interpret)
                s_decay = jnp.exp(g_last) * conn_s[slot, CHUNK - 1]
                vd_s[...] = (vn * mgl.by_row(k_decay, tile)).astype(vd_s.dtype)
                if not summary:
                    o_s[...] = vn.astype(o_s.dtype)
                plgpu.commit_smem()
                store_o(rows, n)

                def update(kv_acc):
                    plgpu.wgmma(kv_acc, k_t, vd_s)  # K^T (decayed v_new), [K, 64]
                    return kv_acc[...]

                kv = lax.optimization_barrier(pl.run_scoped(update, plgpu.ACC((dk, BLOCK_V))))
                plgpu.barrier_arrive(in_free.at[slot])
                return s * s_decay + kv
            p = (qk * decay).astype(vn_s.dtype)  # 16-bit, the left wgmma operand (registers)
            # Token s reaches the next chunk as last_s e^{G_L - G_s} (<= 1); keep e^{G_L} is 0
            # if a document starts inside the chunk.
            k_decay = jnp.exp(g_last - g_i) * mgl.load_rows(last_s.at[slot], interpret)
            s_decay = jnp.exp(g_last) * conn_s[slot, CHUNK - 1]
            vn_s[...] = vn.astype(vn_s.dtype)
            vd_s[...] = (vn * mgl.by_row(k_decay, tile)).astype(vd_s.dtype)
            plgpu.commit_smem()
            if store_v_new:
                plgpu.copy_smem_to_gmem(vn_s, vn_ref.at[b, rows, h, cols])

            def second(pv_acc, kv_acc):  # issued together
                plgpu.wgmma(pv_acc, mgl.lhs_operand(p, p_s, interpret), vn_s)  # P v_new
                plgpu.wgmma(kv_acc, k_t, vd_s)  # K^T (decayed v_new), [K, 64]
                return pv_acc[...], kv_acc[...]

            pv, kv = lax.optimization_barrier(pl.run_scoped(
                second, plgpu.ACC(tile), plgpu.ACC((dk, BLOCK_V))))
            plgpu.barrier_arrive(in_free.at[slot])
            o = scale * (qs * mgl.by_row(q_decay, tile) + pv)
            o_s[...] = o.astype(o_s.dtype)
            plgpu.commit_smem()
            store_o(rows, n)
            return s * s_decay + kv

        s = lax.fori_loop(0 if lo is None else lo, num_chunks, step, s0)
        mgl.store_state(s, state_s, ht_ref.at[b, h, :, cols])

    # Both warpgroups leave together (an early exit while another issues wgmma is unsafe).
    plgpu.barrier_arrive(done)
    plgpu.barrier_wait(done)


def _state_vk_step(n, s, *, refs, eye, depth, interpret, form_ag, store_h, store_v_new):
    """One chunk of the split kernel's state warpgroup with ``state_layout="vk"``: the state
    carried transposed, ``S^T`` ``[64, K]`` fp32 (64 value columns of one head), as jla's
    ``fused_fwd_wy`` carries it (MOSAIC_GPU.md Sec. 2, Sec. 35). The equations of
    :func:`_split_t0_kernel`'s state warpgroup, transposed::

        X^T     = V^T - (S^T K^T) diag(conn e^G)          (S^T in 16 bits, from registers)
        v_new^T = X^T Ag_<^T + X^T diag(beta)             (X^T in 16 bits, from registers;
                                                           Ag_<^T a transposed SMEM view)
        S^T    <- keep e^{G_L} S^T + (v_new^T diag(last e^{G_L - G})) K   (16 bits, registers)

    so no product waits for an SMEM store and fence of its left operand: per chunk only the
    published ``S^T`` (16 bits, for the output warpgroup's ``Q S``) and ``v_new^T`` (its
    ``P v_new``) are stored, with one ``commit_smem`` before ``s_ready`` (and one after the
    ``S^T`` store when ``store_h`` sends it to HBM). The roundings are those of the ``"kv"``
    layout (the same 16-bit operands, transposed; fp32 accumulation), so the results agree
    with it up to the summation order inside the ``wgmma``.

    ``V^T`` comes from one more ``wgmma``, ``I V^T`` (exact), issued with ``S^T K^T``: jax
    0.10.2 cannot load a transposed swizzled tile into registers (jla, on 0.11.2, does).

    ``s``: ``S^T`` entering chunk ``n``; returns ``S^T`` leaving it. ``eye``: the 16-bit
    ``[64, 64]`` identity in the WGMMA layout (formed once). ``refs``: the SMEM ring and
    tiles, the barriers and (interpreting) the shim
    ``(kt0_s, agt_s, sl_s, xt_s, vdt_s, vt_s, eye_s)``.
    ``form_ag(slot)``: forms ``Ag_<`` here (``split_order="state_ag"``) instead of waiting
    on ``ag_ready``; ``store_h(n, half)`` / ``store_v_new(n, half)``: the optional TMA stores
    of the published tiles, or ``None``.
    """
    r = refs
    slot, half = lax.rem(n, depth), lax.rem(n, 2)
    kt0_s, agt_s, sl_s, xt_s, vdt_s, vt_s, eye_s = r["shim"] if interpret else (None,) * 7
    dtype = r["vn_s"].dtype
    tile_t = r["vn_s"].shape[1:]  # [64, C]
    dk = r["k_s"].shape[-1]

    def by_col(x, shape):
        return lax.broadcast_in_dim(x, shape, [1])

    @pl.when(n >= 2)
    def _():  # the output warpgroup has read the tiles published two chunks ago
        plgpu.barrier_wait(r["s_free"].at[half])

    # This warpgroup's stores (h, v_new) of chunk n - 2 must have read their tiles.
    plgpu.wait_smem_to_gmem(0, wait_read_only=True)
    s_lo = s.astype(dtype)  # S^T in 16 bits: the left operand of S^T K^T, and published
    r["sb_s"].at[half][...] = s_lo
    if store_h:
        plgpu.commit_smem()
        store_h(n, half)
    plgpu.barrier_wait(r["in_bar"].at[slot])
    k_t = mgl.transposed(r["k_s"].at[slot], kt0_s, interpret)  # [K, C]
    v_t = mgl.transposed(r["v_s"].at[slot], vt_s, interpret)  # [64, C]
    s_op = mgl.lhs_operand(s_lo, sl_s, interpret)
    eye_op = mgl.lhs_operand(eye, eye_s, interpret)

    def state_in(ks_acc, v_acc):  # issued together: one wait for both
        # V^T in the WGMMA layout, exactly (16-bit values times 1, fp32 sums of one term):
        # jax 0.10.2 cannot load a transposed swizzled tile into registers ("Can't transpose
        # the swizzled dimension"), but wgmma reads one as its right operand.
        plgpu.wgmma(v_acc, eye_op, v_t)  # I V^T, [64, C]
        plgpu.wgmma(ks_acc, s_op, k_t)  # S^T K^T, [64, C]
        if form_ag is not None:  # Ag of chunk n while the products are on the tensor cores
            form_ag(slot)
        return ks_acc[...], v_acc[...]

    # The barrier keeps the arithmetic after the accumulator read (jla's pitfall).
    ks_t, v_tr = lax.optimization_barrier(pl.run_scoped(
        state_in, plgpu.ACC(tile_t), plgpu.ACC(tile_t)))
    g_j = mgl.load_cols(r["g_col_s"].at[slot], interpret)  # chunk-local cumsum, fp32
    g_last = r["g_row_s"][slot, CHUNK - 1]
    # The entering state reaches token t as conn_t e^{G_t} (<= 1), a column scale here.
    q_decay = jnp.exp(g_j) * mgl.load_cols(r["conn_s"].at[slot], interpret)
    x_t = v_tr - ks_t * by_col(q_decay, tile_t)  # X^T, fp32
    if form_ag is None:  # Ag of chunk n, over T0 in the ring stage
        plgpu.barrier_wait(r["ag_ready"].at[slot])
    x_op = mgl.lhs_operand(x_t.astype(dtype), xt_s, interpret)
    ag_t = mgl.transposed(r["t0_s"].at[slot], agt_s, interpret)  # Ag_<^T, [C, C]

    def solve(acc):
        plgpu.wgmma(acc, x_op, ag_t)  # v_new^T = X^T Ag_<^T, [64, C]
        return acc[...]

    vn_t = lax.optimization_barrier(pl.run_scoped(solve, plgpu.ACC(tile_t)))  # fp32
    # The unit diagonal of T0 in fp32: Ag_ii X_i = beta_i X_i, unrounded (a column scale).
    vn_t = vn_t + x_t * by_col(mgl.load_cols(r["b_col_s"].at[slot], interpret), tile_t)
    # Token s reaches the next chunk as last_s e^{G_L - G_s} (<= 1); keep e^{G_L} is 0 if a
    # document starts inside the chunk.
    k_decay = jnp.exp(g_last - g_j) * mgl.load_cols(r["last_s"].at[slot], interpret)
    s_decay = jnp.exp(g_last) * r["conn_s"][slot, CHUNK - 1]
    r["vn_s"].at[half][...] = vn_t.astype(dtype)
    plgpu.commit_smem()
    plgpu.barrier_arrive(r["s_ready"].at[half])  # S^T and v_new^T published
    if store_v_new:
        store_v_new(n, half)
    vd_op = mgl.lhs_operand((vn_t * by_col(k_decay, tile_t)).astype(dtype), vdt_s, interpret)

    def update(acc):
        plgpu.wgmma(acc, vd_op, r["k_s"].at[slot])  # (decayed v_new)^T K, [64, K]
        return acc[...]

    kv = lax.optimization_barrier(pl.run_scoped(update, plgpu.ACC((tile_t[0], dk))))
    plgpu.barrier_arrive(r["in_free"].at[slot])  # k, v, Ag (the stage) no longer read here
    return s * s_decay + kv


def _split_t0_kernel(q_ref, k_ref, v_ref, t0_ref, g_ref, beta_ref, doc_ref, last_ref, conn_ref,
                     *rest, num_chunks: int, group: int, scale: float, has_h0: bool,
                     store_v_new: bool, store_h: bool, interpret: bool,
                     split_order: str = SPLIT_DEFAULT_ORDER, depth: int = STAGES,
                     state_layout: str = "kv", stages: str = "full",
                     protocol: str = SPLIT_DEFAULT_PROTOCOL):
    """Kernel body of :func:`chunk_delta_fused_t0_fwd_mosaic` with ``split_output``: three
    warpgroups (state, output, memory) in jla's arrangement (MOSAIC_GPU.md Sec. 2); refs are
    GMEM.

    The output warpgroup reads out chunk ``n`` (``Q K^T``, ``P``, ``Q S_n``, ``P v_new``), then
    forms ``Ag_<``, the strictly lower part of ``Ag = T0 * D * beta_j``, of chunk ``n + 1``
    elementwise in fp32 registers and writes it, rounded once to 16 bits, over ``T0`` in the
    ring stage (``t0_s[slot]``; ``ag_ready[slot]``; the stage's ``in_free`` frees it); ``Ag``
    of chunk 0 is formed before the loop. That is ``split_order="readout_first"`` (the
    default, :data:`SPLIT_ORDERS`); with ``"prepare_first"`` ``Ag`` of chunk ``n + 1`` comes
    before the read-out of chunk ``n``, with ``"prepare_mid"`` between its state-free half
    (``read_scores``) and its state-dependent half (``read_state``); with ``"state_ag"`` the
    state warpgroup forms ``Ag`` of chunk ``n`` (``form_ag``) between issuing ``K S_c`` and
    reading it, and the output warpgroup only reads out; with ``"shared_mask"`` (jla's
    order) the output warpgroup forms ``Ag`` of chunk ``n`` and then reads chunk ``n`` out
    with the same mask ``D``. ``depth`` is the TMA
    ring's (``split_stages``; with 3, ``vd_s`` is ``x_s`` and ``state_s`` shares a
    ``RefUnion`` with ``sb_s``, except when interpreting). The state
    warpgroup per chunk: publishes ``S_c``; ``K S_c``; ``X = V - diag(conn e^G) K S_c`` (fp32,
    and to SMEM in 16 bits); ``v_new = Ag_< X + diag(beta) X`` (``Ag_<`` from SMEM, the unit
    diagonal of ``T0`` in fp32); publishes ``v_new``; ``K^T (last e^{G_L - G} v_new)``.
    ``rest`` = ``[h0_ref,] o_ref, ht_ref, [vn_ref,] [h_ref,]`` then the scratch; ``shim``
    (interpret mode only) = ``kt0_s``, ``kt1_s`` (``k^T`` for the state and the output
    warpgroup), ``p_s`` (``P``).

    With ``state_layout="vk"`` the state warpgroup carries ``S^T`` (``[64, K]`` fp32) and runs
    the transposed chain (:func:`_state_vk_step`); ``h0_ref`` / ``ht_ref`` / ``h_ref`` are then
    ``[..., V, K]`` and ``vn_ref`` ``[B, H, V, Tp]`` (the wrapper transposes), the published
    tiles hold ``S^T`` and ``v_new^T`` and the output warpgroup reads them as transposed views;
    the interpret shim adds ``agt_s`` (``Ag^T``), ``st_s`` (``S``), ``vnt_s`` (``v_new``) and
    the left-operand copies ``sl_s``, ``xt_s``, ``vdt_s``.

    ``stages`` (:data:`SPLIT_T0_STAGES`, ``"kv"`` layout only): a timing ablation that runs one
    warpgroup's side alone (``"io"``, ``"state"``, ``"readout"``) or drops the ``o`` stores
    but the last (``"no_store"``); ``"full"`` and ``"nobar"`` trace the kernel.

    ``protocol`` (:data:`SPLIT_PROTOCOLS`, ``"kv"`` layout, stages ``"full"``, ``"no_store"``,
    ``"nobar"``): with ``"early_s"`` the state warpgroup arrives ``s_pub`` (one more barrier
    pair, after ``s_free`` in the scratch) as soon as ``S_c`` is published, and the output
    warpgroup issues ``Q S_c`` on it, waiting for ``s_ready`` (``v_new``) only before
    ``P v_new``.
    """
    early = protocol == "early_s"
    rest = list(rest)
    h0_ref = rest.pop(0) if has_h0 else None
    o_ref, ht_ref = rest.pop(0), rest.pop(0)
    vn_ref = rest.pop(0) if store_v_new else None
    h_ref = rest.pop(0) if store_h else None
    ring, rest = tuple(rest[:_T0_IN_COPIES]), rest[_T0_IN_COPIES:]
    (q_s, k_s, v_s, t0_s, g_row_s, g_col_s, b_col_s, doc_row_s, doc_col_s, last_s,
     conn_s) = ring
    vk = state_layout == "vk"
    x_s = vd_s = None
    if vk:  # S^T and v_new^T published; no X or decayed v_new tile (registers)
        if depth == STAGES:
            sb_s, vn_s, o_s, state_s, *rest = rest
        elif interpret:
            sb_s, state_s, vn_s, o_s, *rest = rest
        else:
            (sb_s, state_s), vn_s, o_s, *rest = rest
    elif depth == STAGES:  # the two-stage layout: every tile of its own
        sb_s, x_s, vn_s, vd_s, o_s, state_s, *rest = rest
    else:  # split_stages=3: two aliases pay for the third stage (SMEM note at SPLIT_STAGES)
        if interpret:  # the interpreter has no RefUnion: state_s apart (no SMEM limit there)
            sb_s, state_s, *rest = rest
        else:  # one RefUnion: S in 16 bits (the loop) and the fp32 h0 / final state (outside)
            (sb_s, state_s), *rest = rest
        x_s, vn_s, o_s, *rest = rest
        vd_s = x_s  # X is dead once Ag X was read; the decayed v_new takes its tile
    in_bar, in_free, ag_ready, s_ready, s_free, *rest = rest
    s_pub = rest.pop(0) if early else None  # "early_s": S_c published (the read-out's Q S_c)
    io_bar, done, *shim = rest
    kt0_s, kt1_s, p_s, *shim_vk = shim if interpret else (None,) * (11 if vk else 3)
    gmem = (q_ref, k_ref, v_ref, t0_ref, g_ref, g_ref, beta_ref, doc_ref, doc_ref, last_ref,
            conn_ref)
    b, h, iv = lax.axis_index("b"), lax.axis_index("h"), lax.axis_index("v")
    hk = lax.div(h, group)  # GVA: value head h reads query/key head h // group
    cols = pl.ds(iv * BLOCK_V, BLOCK_V)
    wg = lax.axis_index("wg")
    dk = k_s.shape[-1]
    dtype = v_s.dtype
    sq = (CHUNK, CHUNK)
    tile = (CHUNK, BLOCK_V)

    def chunk_mask(slot, i, j):
        """D_ij = e^{G_i - G_j} on causal same-document pairs (exponent masked before exp, so
        D <= 1), and the rows of G; ``i, j``: the row and column iotas of a [C, C] tile."""
        g_i = mgl.load_rows(g_row_s.at[slot], interpret)
        g_j = mgl.load_cols(g_col_s.at[slot], interpret)
        d_i = mgl.load_rows(doc_row_s.at[slot], interpret)
        d_j = mgl.load_cols(doc_col_s.at[slot], interpret)
        return mgl.causal_decay(i, j, g_i, g_j, d_i, d_j), g_i

    def form_ag(slot, i, j):
        """Ag_<, the strictly lower part of Ag = T0 * D * beta_j, of the chunk in ring stage
        ``slot`` (elementwise, no product), written over T0 in the stage and committed for
        the state warpgroup's wgmma. Nothing here depends on the state. Returns
        :func:`chunk_mask`'s ``(D, G rows)`` (``"shared_mask"`` reuses them for ``P``)."""
        mask = chunk_mask(slot, i, j)
        decay = mask[0]
        beta_j = lax.broadcast_in_dim(mgl.load_cols(b_col_s.at[slot], interpret), sq, [1])
        t0 = mgl.load_tile(t0_s.at[slot], interpret).astype(jnp.float32)
        # T diag(beta) below the diagonal, rounded once to 16 bits (jla: hi/lo splits did not
        # change the end-to-end error); the diagonal beta_i is the state warpgroup's, in fp32.
        # Only the warpgroup that forms Ag reads T0, and it reads it before the write.
        ag = jnp.where(j < i, t0 * decay * beta_j, 0.0)
        t0_s.at[slot][...] = ag.astype(t0_s.dtype)
        plgpu.commit_smem()
        return mask

    @pl.when(wg == 2)
    def _memory():
        plgpu.set_max_registers(40, action="decrease")
        mgl.ring_producer(_t0_issuer(gmem, ring, in_bar, b, h, hk, cols), num_chunks, in_free,
                          stages=depth)

    def _only(flag):  # pl.when(wg == 0) for the state layout's body; the other is not traced
        return pl.when(wg == 0) if flag else (lambda f: f)

    @_only(vk)
    def _state_vk():
        plgpu.set_max_registers(232, action="increase")
        h0 = h0_ref.at[b, h, cols, :] if has_h0 else None  # S^T, [64, K]
        s0 = mgl.entry_state(h0, state_s, io_bar, (BLOCK_V, dk), interpret)
        ij = ((mgl.iota(sq, 0, interpret), mgl.iota(sq, 1, interpret))
              if split_order == "state_ag" else None)
        refs = dict(k_s=k_s, v_s=v_s, t0_s=t0_s, g_row_s=g_row_s, g_col_s=g_col_s,
                    b_col_s=b_col_s, last_s=last_s, conn_s=conn_s, sb_s=sb_s, vn_s=vn_s,
                    in_bar=in_bar, in_free=in_free, ag_ready=ag_ready, s_ready=s_ready,
                    s_free=s_free, shim=(kt0_s, *shim_vk[:1], *shim_vk[3:]) if interpret
                    else None)
        vsq = (BLOCK_V, BLOCK_V)
        ii, jj = mgl.iota(vsq, 0, interpret), mgl.iota(vsq, 1, interpret)
        eye = (ii == jj).astype(dtype)  # loop-invariant, 16 registers a thread
        step = functools.partial(
            _state_vk_step, refs=refs, eye=eye, depth=depth, interpret=interpret,
            form_ag=(lambda slot: form_ag(slot, *ij)) if ij is not None else None,
            store_h=(lambda n, half: plgpu.copy_smem_to_gmem(
                sb_s.at[half], h_ref.at[b, h, n, cols, :])) if store_h else None,
            store_v_new=(lambda n, half: plgpu.copy_smem_to_gmem(
                vn_s.at[half], vn_ref.at[b, h, cols, pl.ds(n * CHUNK, CHUNK)]))
            if store_v_new else None)
        s = lax.fori_loop(0, num_chunks, step, s0)
        for n in range(max(num_chunks - 2, 0), num_chunks):  # observe the last releases
            plgpu.barrier_wait(s_free.at[n % 2])
        mgl.store_state(s, state_s, ht_ref.at[b, h, cols, :])

    @_only(not vk)
    def _state():
        plgpu.set_max_registers(232, action="increase")
        h0 = h0_ref.at[b, h, :, cols] if has_h0 else None
        s0 = mgl.entry_state(h0, state_s, io_bar, (dk, BLOCK_V), interpret)
        if split_order == "state_ag":  # this warpgroup forms Ag (the iotas live in the loop)
            i, j = mgl.iota(sq, 0, interpret), mgl.iota(sq, 1, interpret)

        def io_step(n, s):  # stages="io": the ring's wait and release only
            slot = lax.rem(n, depth)
            plgpu.barrier_wait(in_bar.at[slot])
            plgpu.barrier_arrive(in_free.at[slot])
            return s

        def readout_step(n, s):  # stages="readout": S frozen (published once), v_new = v
            slot, half = lax.rem(n, depth), lax.rem(n, 2)

            @pl.when(n >= 2)
            def _():  # the output warpgroup has read the v tile published two chunks ago
                plgpu.barrier_wait(s_free.at[half])

            plgpu.barrier_wait(in_bar.at[slot])
            vn_s.at[half][...] = mgl.load_tile(v_s.at[slot], interpret).astype(vn_s.dtype)
            plgpu.commit_smem()
            plgpu.barrier_arrive(s_ready.at[half])
            plgpu.barrier_arrive(in_free.at[slot])
            return s

        def step(n, s):
            slot, half = lax.rem(n, depth), lax.rem(n, 2)
            rows = pl.ds(n * CHUNK, CHUNK)

            @pl.when(n >= 2)
            def _():  # the output warpgroup has read the tiles published two chunks ago
                plgpu.barrier_wait(s_free.at[half])

            # This warpgroup's stores (h, v_new) of chunk n - 2 must have read their tiles.
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)
            sb_s.at[half][...] = s.astype(sb_s.dtype)  # S_c in 16 bits: published, and K S's
            plgpu.commit_smem()
            if early:  # the output warpgroup may issue Q S_c now, before v_new exists
                plgpu.barrier_arrive(s_pub.at[half])
            if store_h:
                plgpu.copy_smem_to_gmem(sb_s.at[half], h_ref.at[b, h, n, :, cols])
            plgpu.barrier_wait(in_bar.at[slot])

            def state_in(acc):
                plgpu.wgmma(acc, k_s.at[slot], sb_s.at[half])  # K S, [C, 64]
                if split_order == "state_ag":  # Ag of chunk n while K S is on the tensor cores
                    form_ag(slot, i, j)
                return acc[...]

            # The barrier keeps the arithmetic after the accumulator read (jla's pitfall).
            ks = lax.optimization_barrier(pl.run_scoped(state_in, plgpu.ACC(tile)))
            g_i = mgl.load_rows(g_row_s.at[slot], interpret)  # chunk-local cumsum, fp32
            g_last = g_row_s[slot, CHUNK - 1]
            # The entering state reaches token t as conn_t e^{G_t} (<= 1): the right-hand side
            # X = V - diag(conn e^G) K S of the WY solve, fp32, then 16 bits in SMEM.
            q_decay = jnp.exp(g_i) * mgl.load_rows(conn_s.at[slot], interpret)
            x = (mgl.load_tile(v_s.at[slot], interpret).astype(jnp.float32)
                 - ks * mgl.by_row(q_decay, tile))
            x_s[...] = x.astype(x_s.dtype)
            plgpu.commit_smem()
            if split_order != "state_ag":  # Ag of chunk n, over T0 in the ring stage
                plgpu.barrier_wait(ag_ready.at[slot])

            def solve(acc):
                plgpu.wgmma(acc, t0_s.at[slot], x_s)  # v_new = Ag X, [C, 64]
                return acc[...]

            vn = lax.optimization_barrier(pl.run_scoped(solve, plgpu.ACC(tile)))  # fp32
            # The unit diagonal of T0 in fp32: Ag_ii X_i = beta_i X_i, unrounded.
            vn = vn + x * mgl.by_row(mgl.load_rows(b_col_s.at[slot], interpret), tile)
            # Token s reaches the next chunk as last_s e^{G_L - G_s} (<= 1); keep e^{G_L} is 0
            # if a document starts inside the chunk.
            k_decay = jnp.exp(g_last - g_i) * mgl.load_rows(last_s.at[slot], interpret)
            s_decay = jnp.exp(g_last) * conn_s[slot, CHUNK - 1]
            vn_s.at[half][...] = vn.astype(vn_s.dtype)
            vd_s[...] = (vn * mgl.by_row(k_decay, tile)).astype(vd_s.dtype)
            plgpu.commit_smem()
            plgpu.barrier_arrive(s_ready.at[half])  # S_c and v_new published
            if store_v_new:
                plgpu.copy_smem_to_gmem(vn_s.at[half], vn_ref.at[b, rows, h, cols])
            k_t = mgl.transposed(k_s.at[slot], kt0_s, interpret)

            def update(acc):
                plgpu.wgmma(acc, k_t, vd_s)  # K^T (decayed v_new), [K, 64]
                return acc[...]

            kv = lax.optimization_barrier(pl.run_scoped(update, plgpu.ACC((dk, BLOCK_V))))
            plgpu.barrier_arrive(in_free.at[slot])  # k, v, Ag (the stage) no longer read here
            return s * s_decay + kv

        if stages == "readout":  # S_0 in 16 bits in both published tiles, for every chunk
            for half in range(2):
                sb_s.at[half][...] = s0.astype(sb_s.dtype)
            plgpu.commit_smem()
        body = {"io": io_step, "readout": readout_step}.get(stages, step)
        s = lax.fori_loop(0, num_chunks, body, s0)
        if stages != "io":  # "io" publishes nothing: no s_free arrivals
            for n in range(max(num_chunks - 2, 0), num_chunks):  # observe the last releases
                plgpu.barrier_wait(s_free.at[n % 2])
        mgl.store_state(s, state_s, ht_ref.at[b, h, :, cols])

    def io_out(n, carry):  # stages="io": the landed v tile goes out as o (no wgmma)
        slot, half = lax.rem(n, depth), lax.rem(n, 2)
        plgpu.barrier_wait(in_bar.at[slot])
        o = mgl.load_tile(v_s.at[slot], interpret)
        plgpu.barrier_arrive(in_free.at[slot])
        plgpu.wait_smem_to_gmem(1, wait_read_only=True)  # o_s[half] of chunk n - 2 was read
        o_s.at[half][...] = o.astype(o_s.dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_s.at[half], o_ref.at[b, pl.ds(n * CHUNK, CHUNK), h, cols])
        return carry

    def state_out(n, carry):  # stages="state": the published v_new goes out as o, then release
        slot, half = lax.rem(n, depth), lax.rem(n, 2)
        plgpu.barrier_wait(s_ready.at[half])
        plgpu.copy_smem_to_gmem(vn_s.at[half], o_ref.at[b, pl.ds(n * CHUNK, CHUNK), h, cols])
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # v_new[half] read before s_free
        plgpu.barrier_arrive(s_free.at[half])
        plgpu.barrier_arrive(in_free.at[slot])
        return carry

    @pl.when(wg == 1)
    def _output():
        plgpu.set_max_registers(232, action="increase")
        if stages in ("io", "state"):  # no read-out: SPLIT_T0_STAGES
            lax.fori_loop(0, num_chunks, io_out if stages == "io" else state_out, 0)
            plgpu.wait_smem_to_gmem(0)
            return
        i, j = mgl.iota(sq, 0, interpret), mgl.iota(sq, 1, interpret)

        def prepare(m):
            """Waits for chunk m's stage, forms Ag_< of chunk m over T0 (form_ag), signals
            ag_ready. Nothing here depends on the state, so it runs while the state warpgroup
            works on chunk m - 1."""
            slot = lax.rem(m, depth)
            plgpu.barrier_wait(in_bar.at[slot])
            mask = form_ag(slot, i, j)
            plgpu.barrier_arrive(ag_ready.at[slot])
            return mask

        def read_scores(n, mask=None):
            """The state-free half of chunk n's read-out: Q K^T, P = (Q K^T * D) in 16 bits
            (the left operand of P v_new) and the rows' decay conn e^G; ``mask``: chunk n's
            ``(D, G rows)`` when prepare(n) formed them ("shared_mask"), else formed here."""
            slot = lax.rem(n, depth)
            k_t = mgl.transposed(k_s.at[slot], kt1_s, interpret)

            def scores(acc):
                plgpu.wgmma(acc, q_s.at[slot], k_t)  # Q K^T, [C, C], while S_c is formed
                return acc[...]

            qk = lax.optimization_barrier(pl.run_scoped(scores, plgpu.ACC(sq)))
            decay, g_i = chunk_mask(slot, i, j) if mask is None else mask
            p = (qk * decay).astype(dtype)  # 16-bit, the left wgmma operand (registers)
            q_decay = jnp.exp(g_i) * mgl.load_rows(conn_s.at[slot], interpret)
            return mgl.lhs_operand(p, p_s, interpret), q_decay

        def read_state(n, p_op, q_decay):
            """The state-dependent half: on s_ready, Q S_c and P v_new; releases s_free and
            the stage; o to GMEM through the double-buffered o_s."""
            slot, half = lax.rem(n, depth), lax.rem(n, 2)
            rows = pl.ds(n * CHUNK, CHUNK)
            # "early_s": S_c has its own barrier; v_new's (s_ready) is waited for below.
            plgpu.barrier_wait((s_pub if early else s_ready).at[half])

            if vk:  # S^T and v_new^T were published: read them as transposed views
                s_op = mgl.transposed(sb_s.at[half], shim_vk[1] if interpret else None,
                                      interpret)
                vn_op = mgl.transposed(vn_s.at[half], shim_vk[2] if interpret else None,
                                       interpret)
            else:
                s_op, vn_op = sb_s.at[half], vn_s.at[half]

            def out(qs_acc, pv_acc):  # issued together
                plgpu.wgmma(qs_acc, q_s.at[slot], s_op)  # Q S, [C, 64]
                if early:  # Q S_c runs while the state warpgroup forms v_new
                    plgpu.barrier_wait(s_ready.at[half])
                plgpu.wgmma(pv_acc, p_op, vn_op)  # P v_new, [C, 64]
                return qs_acc[...], pv_acc[...]

            qs, pv = lax.optimization_barrier(pl.run_scoped(
                out, plgpu.ACC(tile), plgpu.ACC(tile)))
            plgpu.barrier_arrive(s_free.at[half])
            plgpu.barrier_arrive(in_free.at[slot])
            o = scale * (qs * mgl.by_row(q_decay, tile) + pv)
            plgpu.wait_smem_to_gmem(1, wait_read_only=True)  # o_s[half] of chunk n - 2 was read
            o_s.at[half][...] = o.astype(o_s.dtype)
            plgpu.commit_smem()
            if stages == "no_store":  # the TMA store only for the row's last chunk
                @pl.when(n + 1 == num_chunks)
                def _store_last():
                    plgpu.copy_smem_to_gmem(o_s.at[half], o_ref.at[b, rows, h, cols])
            else:
                plgpu.copy_smem_to_gmem(o_s.at[half], o_ref.at[b, rows, h, cols])

        # Every order keeps every barrier's waits and arrivals: prepare(m) (which waits for
        # chunk m's stage) always precedes read_scores(m), which relies on that wait. Why no
        # order can deadlock, at either ring depth: _SPLIT_PROTOCOL.
        if split_order not in ("state_ag", "shared_mask"):
            prepare(0)

        def step(n, carry):
            if split_order == "shared_mask":
                # jla's order: Ag of chunk n, then its read-out with the same mask D (formed
                # once per chunk, not twice as in readout_first, whose task sequence this
                # otherwise is: prepare(n) follows read_state(n - 1) in both).
                mask = prepare(n)
                read_state(n, *read_scores(n, mask))
                return carry
            if split_order == "state_ag":
                # Only the read-out here: the state warpgroup forms Ag; this warpgroup waits
                # for the stage itself (prepare(n) did elsewhere).
                plgpu.barrier_wait(in_bar.at[lax.rem(n, depth)])
                read_state(n, *read_scores(n))
                return carry
            if split_order == "readout_first":
                # Chunk n's read-out first: it releases chunk n's stage and s_free without
                # waiting for chunk n + 1's copies, which were issued a read-out earlier.
                read_state(n, *read_scores(n))
            elif split_order == "prepare_mid":
                # Only the state-free half first: Ag of chunk n + 1 is then formed before the
                # wait for s_ready of chunk n, so the state warpgroup never waits on a read-out.
                scores_n = read_scores(n)

            @pl.when(n + 1 < num_chunks)
            def _():  # Ag of the next chunk
                prepare(n + 1)

            if split_order == "prepare_first":
                read_state(n, *read_scores(n))
            elif split_order == "prepare_mid":
                read_state(n, *scores_n)
            return carry

        lax.fori_loop(0, num_chunks, step, 0)
        plgpu.wait_smem_to_gmem(0)

    # All warpgroups leave together (an early exit while another issues wgmma is unsafe).
    plgpu.barrier_arrive(done)
    plgpu.barrier_wait(done)


def check_fused_t0_inputs(q, k, v, t0, g, beta, segment_ids, initial_state) -> None:
    """The input contract of :func:`chunk_delta_fused_t0_fwd_mosaic`.

    Raises:
        ValueError: naming the argument and the shape or dtype it needs.
    """
    batch, seq_len, _, dk = k.shape
    heads, dv = v.shape[2], v.shape[3]
    mgl.check_kv_gates(k, v, g, segment_ids)
    if q.shape != k.shape or q.dtype != k.dtype:
        raise ValueError(f"q must have k's shape {k.shape} and dtype {k.dtype}, got {q.shape=} "
                         f"{q.dtype=}")
    if t0.shape != (batch, seq_len, heads, CHUNK) or t0.dtype != k.dtype:
        raise ValueError(f"t0 must be [B, T, H, 64] = {(batch, seq_len, heads, CHUNK)} in k's "
                         f"dtype {k.dtype}, got {t0.shape=} {t0.dtype=}")
    if beta.shape != (batch, seq_len, heads):
        raise ValueError(f"beta must be [B, T, H] = {(batch, seq_len, heads)}, got {beta.shape=}")
    if initial_state is not None and initial_state.shape != (batch, heads, dk, dv):
        raise ValueError(f"initial_state must be [B, H, K, V] = {(batch, heads, dk, dv)}, got "
                         f"{initial_state.shape=}")


@functools.partial(jax.jit, static_argnames=("scale", "store_v_new", "store_h", "split_output",
                                             "interpret", "stages", "split_order",
                                             "split_stages", "state_layout",
                                             "split_protocol", "pieces", "summary"))
def chunk_delta_fused_t0_fwd_mosaic(
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
    store_v_new: bool = False,
    store_h: bool = False,
    split_output: bool = False,
    interpret: bool = False,
    stages: str = "full",
    split_order: str = SPLIT_DEFAULT_ORDER,
    split_stages: int = STAGES,
    state_layout: str = "kv",
    split_protocol: str = SPLIT_DEFAULT_PROTOCOL,
    gate_cumsum: Optional[jax.Array] = None,
    doc_vecs: Optional[Tuple[jax.Array, jax.Array, jax.Array]] = None,
    pieces: int = 1,
    summary: bool = False,
    piece_cuts: Optional[jax.Array] = None,
) -> Tuple[Optional[jax.Array], jax.Array, Optional[jax.Array], Optional[jax.Array]]:
    """The fused forward of :func:`chunk_delta_fused_fwd_mosaic`, reading ``v`` and the
    gate-free inverse ``T0`` instead of ``W, U`` (``forward="fused_t0"``).

    Per batch row, value head and chunk ``c`` of 64 tokens with entry state ``S_c``, ``G`` the
    chunk-local inclusive cumulative log-decay (fp32) and ``G_L`` its last entry (module
    docstring, "fused_t0")::

        Ag_ij   = T0_ij e^{G_i - G_j} beta_j        (causal same-document pairs, else 0)
        v_new_c = Ag (V_c - diag(conn e^G) K_c S_c)
        o_c     = scale ( diag(conn e^G) Q_c S_c + (Q_c K_c^T * D) v_new_c )
        S_{c+1} = keep_c e^{G_L} S_c + K_c^T (last_c * e^{G_L - G} * v_new_c)

    from ``S_0 = initial_state``, with ``T0`` from
    :func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu.chunk_kkt_inverse_mosaic`. As
    ``T = (I + A)^{-1} = diag(e^G) T0 diag(e^{-G})``, ``Ag = T diag(beta)`` and
    ``v_new = U - W S_c`` of :func:`chunk_delta_fused_fwd_mosaic` exactly (``U = T diag(beta)
    V``, ``W = T diag(beta conn e^G) K``): the chunk form of the token recurrence
    ``u_t = beta_t (v_t - e^{g_t} S_{t-1}^T k_t)``, ``S_t = e^{g_t} S_{t-1} + k_t u_t^T``,
    ``o_t = scale S_t^T q_t`` of
    :func:`pallas_kernels.gated_delta_rule.reference.gated_delta_rule_reference`
    (paper arXiv 2607.07953, Eqs. 15-17).

    Kernel structure (default): :func:`chunk_delta_fused_fwd_mosaic`'s two warpgroups,
    with eleven TMA copies per ring stage (``q, k, v`` (64 value columns), ``T0`` rows, gate
    rows and columns, ``beta`` columns, document rows and columns, ``last``, ``conn``). Per
    chunk the compute warpgroup issues ``K S``, ``Q S`` and ``Q K^T`` as one group; forms
    ``X = V - diag(conn e^G) (K S)`` in fp32 and stores it in 16 bits to SMEM; forms ``Ag`` in
    fp32 registers from ``T0`` and splits it into two 16-bit terms ``hi + lo`` (register
    operands); one group of two ``wgmma`` gives ``v_new = hi X + lo X``; then the read-out
    and the state update as in the ``W, U`` kernel. One dependent ``wgmma`` group more per
    chunk than that kernel; at K = V = 128 (bf16) the ring is ``2 x 49.75`` KB and the tiles
    80 KB (``S``, ``X``, ``v_new``, decayed ``v_new``, ``o``, the fp32 state), about 180 KB of
    SMEM.

    With ``split_output=True`` (``forward="fused_t0_split"``; module docstring): three
    warpgroups in jla's arrangement. The output warpgroup reads out a chunk (``Q K^T``,
    ``P``, ``Q S_c``, ``P v_new``), then forms the strictly lower part ``Ag_<`` of
    ``Ag = T0 * D * beta_j`` of the next chunk elementwise (no product), rounded once to the
    input dtype, over ``T0`` in the ring stage (``split_order`` below); the state warpgroup runs
    ``X = V - diag(conn e^G) K S_c``, ``v_new = Ag_< X + diag(beta) X`` (``T0``'s unit diagonal
    in fp32) and the state update (three ``wgmma`` per chunk). About 211.5 KB of SMEM at
    K = V = 128 (bf16).

    Args:
        q: queries ``[B, T, Hk, K]``, bf16 or fp16; ``H % Hk == 0`` (value head ``h`` reads
            query/key head ``h // (H // Hk)``); used as given (L2-normalise beforehand).
        k: keys ``[B, T, Hk, K]``, q's shape and dtype.
        v: values ``[B, T, H, V]``, k's dtype. ``K, V`` in {64, 128}.
        t0: the gate-free inverse ``[B, T, H, 64]`` in k's dtype (finite; zero above the
            diagonal and between documents, as ``chunk_kkt_inverse_mosaic`` writes it; unit
            diagonal, which ``split_output`` takes as exactly 1 without reading it).
        g: per-token log-decay ``[B, T, H]`` (natural log, ``<= 0``), or ``None`` (DeltaNet).
        beta: write strengths ``[B, T, H]``, any float dtype (read as fp32).
        scale: read-out scale (static).
        initial_state: ``[B, H, K, V]`` state before the first token (read as fp32), or
            ``None`` for zeros; it applies to the first document of each row only.
        segment_ids: optional int ``[B, T]``; the state resets to zero wherever the id changes.
        store_v_new: also write ``v_new`` (static; the residual ``u``).
        store_h: also write the state entering every chunk (static; the backward's ``h``).
        split_output: three warpgroups (static; ``forward="fused_t0_split"``, above) instead
            of two. Same equations; ``Ag``'s strictly lower part rounded once to 16 bits
            instead of ``hi + lo``, its diagonal ``beta`` applied in fp32.
        gate_cumsum, doc_vecs: ``g``'s chunk-local cumsum (fp32 ``[B, H, Tp]``) and the
            document vectors (three fp32 ``[B, Tp]``), formed once by a caller that runs
            several kernels (``mosaic_vjp``, MOSAIC_GPU.md Sec. 27 and 36), as
            :func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu.chunk_wy_mosaic` takes
            them; ``None``: formed here.
        interpret: run the kernel in Mosaic GPU interpret mode (CPU; slow, for tests).
        stages: a timing ablation (static; benchmarks only, no ``store_v_new`` /
            ``store_h``). Two warpgroups, one of :data:`FUSED_T0_STAGES`: ``"full"`` (default)
            is the kernel; ``"io"``, ``"v_new"`` and ``"state"`` cut each chunk's work short
            after the loads, ``v_new`` and the state update, and return a first output that is NOT
            ``o`` (the loaded ``v``, ``v_new``, ``v_new``; ``"io"`` and ``"v_new"`` also a final
            state equal to the initial one); ``"no_store"`` stores ``o`` for each row's last
            chunk only (the other rows are unwritten, arbitrary); ``"nobar"`` compiles
            ``"full"`` with ``CompilerParams(unsafe_no_auto_barriers=True)``. Each has its own
            kernel name (``gdn_chunk_delta_fused_t0_fwd_abl_<stages>``) so that a profile
            lists it apart (MOSAIC_GPU.md Sec. 16). With ``split_output`` (``"kv"`` layout)
            one of :data:`SPLIT_T0_STAGES` (MOSAIC_GPU.md Sec. 39): ``"io"`` (the ring only;
            returns ``v`` and the initial state), ``"state"`` (the state warpgroup alone;
            returns ``v_new`` as the first output and the final state), ``"readout"`` (the
            output warpgroup alone on a chain frozen at the initial state with ``v_new = v``;
            returns that read-out and the initial state) need ``split_order="state_ag"`` for
            the last two; ``"no_store"`` and ``"nobar"`` as above; kernel names
            :func:`fused_t0_kernel_name` (``..._split_sa_s3_abl_<stages>``).
        split_order: with ``split_output`` only (static, one of :data:`SPLIT_ORDERS`; a
            timing choice, same results bit for bit): ``"readout_first"`` (default since
            2026-12-04f) has the output warpgroup read out chunk ``n`` before forming ``Ag``
            of chunk ``n + 1`` (kernel name ``gdn_chunk_delta_fused_t0_fwd_split_ro``);
            ``"prepare_first"`` forms ``Ag`` first (``gdn_chunk_delta_fused_t0_fwd_split``;
            MOSAIC_GPU.md Sec. 16); ``"prepare_mid"`` forms it between the read-out's
            state-free half (``Q K^T``, ``P``) and its state-dependent half (``Q S_c``,
            ``P v_new``, ``o``; kernel name ``..._split_pm``; Sec. 17), so that the state
            warpgroup never waits for a read-out; meant for ``split_stages=3``;
            ``"state_ag"`` has the state warpgroup form ``Ag`` itself while its ``K S``
            product runs, the output warpgroup only reads out (``..._split_sa``; Sec. 17);
            ``"shared_mask"`` is jla's order: per chunk the output warpgroup forms the mask
            ``D`` once, for ``Ag`` and then for ``P`` of the same chunk (``readout_first``'s
            task sequence with one mask per chunk instead of two; ``..._split_sm``;
            Sec. 35).
        split_stages: with ``split_output`` only (static, one of :data:`SPLIT_STAGES`; a
            timing choice, same results bit for bit): the depth of the TMA input ring, 2
            (default) or 3. With 3 the decayed ``v_new`` reuses ``X``'s tile and the fp32
            state staging shares SMEM with the published ``S`` (221.25 KB at K = V = 128 in
            bf16 against 211.5; kernel name suffix ``_s3``; Sec. 17).
        state_layout: with ``split_output`` only (static, one of :data:`SPLIT_STATE_LAYOUTS`;
            a timing choice, same equations and roundings): ``"kv"`` (default) carries ``S``
            ``[K, 64]`` in the state warpgroup; ``"vk"`` carries ``S^T`` ``[64, K]`` as jla
            does, so that ``S^T K^T``, ``X^T Ag_<^T`` and ``(decayed v_new)^T K`` take their
            left operand from registers and the serial chain has no SMEM store and fence of
            ``S``, ``X`` or the decayed ``v_new`` (:func:`_state_vk_step`; MOSAIC_GPU.md
            Sec. 35; kernel name suffix ``_vk``). ``initial_state`` and the final state are
            transposed in XLA around the kernel (``[B, H, V, K]`` inside), as are ``h``
            (``store_h``) and ``v_new`` (``store_v_new``). Results equal the default's up to
            the summation order inside the ``wgmma`` (not bit for bit).
        split_protocol: with ``split_output`` only (static, one of :data:`SPLIT_PROTOCOLS`; a
            timing choice, same results bit for bit): ``"joint"`` (default) has the state
            warpgroup arrive one barrier per chunk (``s_ready``) once ``S_c`` (``[K, 64]``) and
            ``v_new`` (``[64, 64]``, both in the input dtype) are published, after which the
            output warpgroup issues ``Q S_c`` and ``P v_new``; ``"early_s"`` adds a barrier
            pair ``s_pub`` (16 bytes of SMEM) arrived as soon as ``S_c`` is published, so that
            the output warpgroup issues ``Q S_c`` while the state warpgroup forms ``X`` and
            ``v_new``, and only ``P v_new`` waits for ``s_ready`` (MOSAIC_GPU.md Sec. 40;
            kernel name suffix ``_es`` after ``_s3``). ``"kv"`` layout and ``stages`` in
            ``"full"``, ``"no_store"``, ``"nobar"`` only; every ``split_order`` and
            ``split_stages``.
        pieces: static (two warpgroups only); ``P > 1`` says the batch rows given are
            sequence pieces, ``P`` consecutive rows per batch row (``[B * P, T / P, ...]``, as
            :func:`pallas_kernels.common.mosaic_gpu_lib.split_rows` cuts them, each piece a
            whole number of chunks, ``gate_cumsum`` and ``doc_vecs`` formed on whole rows and
            split), each run from its own entry state (``initial_state`` ``[B * P, H, K, V]``).
            Only ``h`` (``store_h``) changes: it is written ``[B, H, N, K, V]`` at each
            piece's global chunk indices. Used by :func:`pallas_kernels.gated_delta_rule.
            mosaic_vjp.gated_delta_rule_mosaic` for rows with few CTAs (MOSAIC_GPU.md Sec. 42).
        summary: static (two warpgroups, ``stages="full"``, no ``store_v_new`` / ``store_h``):
            run only the state chain (no read-out products) and store only the final state
            (kernel name ``gdn_chunk_delta_fused_t0_fwd_summary``); the first output is
            ``None``. A sequence piece's pass from a zero state, ``X_p`` of ``S -> M_p S +
            X_p``.
        piece_cuts: optional int32 ``[B]`` (``B`` the rows here, the pieces as rows), only with
            ``summary`` and no ``initial_state``: per row the chunk of its last document start
            or ``-1`` (:func:`pallas_kernels.common.mosaic_gpu_lib.piece_cuts`); row ``b`` then
            runs its chain from zero on chunks ``max(cut_b, 0) ..`` only (kernel
            ``gdn_chunk_delta_fused_t0_fwd_summary_skip``, MOSAIC_GPU.md Sec. 52). Exact: the
            state entering the chunk of a document start does not reach its exit (``keep = 0``,
            and ``conn = 0`` on the rows that ``last`` keeps), so the final state equals the
            whole chain's up to the sign of zeros. ``None``: every chunk (the default).

    Returns:
        ``(o, final_state, v_new, h)`` as :func:`chunk_delta_fused_fwd_mosaic` (``o`` is
        ``None`` with ``summary``). Exact up to the
        16-bit roundings of the ``wgmma`` operands (``S``, ``X``, ``T0``'s storage, ``P``,
        ``v_new``, ``last e^{G_L - G} v_new``; ``Ag`` is carried as ``hi + lo``) with fp32
        accumulation; with ``split_output``, ``Ag``'s strictly lower part rounded once to 16
        bits and its diagonal term ``beta X`` unrounded.

    Raises:
        ValueError: on mismatched shapes or dtypes of ``q, k, v, t0``, unsupported head dims
            or dtypes, ``H`` not a multiple of ``Hk``, a bad ``g``, ``beta``, ``segment_ids``
            or ``initial_state`` shape; ``stages`` not in :data:`FUSED_T0_STAGES` (two
            warpgroups) or :data:`SPLIT_T0_STAGES` (``split_output``), other than ``"full"``
            with ``store_v_new`` or ``store_h``, ``"state"`` / ``"readout"`` with a
            ``split_order`` other than ``"state_ag"``, or other than ``"full"`` with
            ``state_layout="vk"``;
            ``split_order`` not in :data:`SPLIT_ORDERS`, or other than the default
            ``"readout_first"`` without ``split_output``; ``split_stages`` not in
            :data:`SPLIT_STAGES`, or other than 2 without ``split_output``;
            ``state_layout`` not in :data:`SPLIT_STATE_LAYOUTS`, or ``"vk"`` without
            ``split_output``; ``split_protocol`` not in :data:`SPLIT_PROTOCOLS`, or
            ``"early_s"`` without ``split_output``, with ``state_layout="vk"`` or with
            ``stages`` ``"io"``, ``"state"`` or ``"readout"``; ``pieces`` not a positive
            divisor of the batch rows, other than 1 with ``split_output`` or with ``T`` not a
            multiple of 64; ``summary``
            with ``split_output``, ``store_v_new``, ``store_h`` or ``stages`` other than
            ``"full"``.
    """
    batch, seq_len, kv_heads, dk = k.shape
    heads, dv = v.shape[2], v.shape[3]
    check_fused_t0_inputs(q, k, v, t0, g, beta, segment_ids, initial_state)
    if stages not in FUSED_T0_STAGES + SPLIT_T0_STAGES:
        raise ValueError(f"stages must be one of {FUSED_T0_STAGES} (two warpgroups) or "
                         f"{SPLIT_T0_STAGES} (split_output), got {stages!r}")
    if stages != "full" and (store_v_new or store_h):
        raise ValueError(f"stages={stages!r} is a timing ablation without extra outputs; got "
                         f"{store_v_new=}, {store_h=}")
    if not split_output and stages not in FUSED_T0_STAGES:
        raise ValueError(f"stages={stages!r} is an ablation of the three-warpgroup kernel: it "
                         f"needs split_output=True (two warpgroups: {FUSED_T0_STAGES})")
    if split_output and stages not in SPLIT_T0_STAGES:
        raise ValueError(f"stages={stages!r} is an ablation of the two-warpgroup kernel: with "
                         f"split_output=True stages must be one of {SPLIT_T0_STAGES}")
    if split_output and stages in _SPLIT_STATE_AG_STAGES and split_order != "state_ag":
        raise ValueError(f"stages={stages!r} runs one warpgroup's side alone, which needs "
                         f"split_order='state_ag' (in {split_order!r} the output warpgroup forms "
                         f"Ag for the state warpgroup)")
    if split_output and stages != "full" and state_layout != "kv":
        raise ValueError(f"stages={stages!r} is an ablation of the state_layout='kv' split "
                         f"kernel, got {state_layout=}")
    if split_order not in SPLIT_ORDERS:
        raise ValueError(f"split_order must be one of {SPLIT_ORDERS}, got {split_order!r}")
    if split_stages not in SPLIT_STAGES:
        raise ValueError(f"split_stages must be one of {SPLIT_STAGES}, got {split_stages!r}")
    if split_stages != STAGES and not split_output:
        raise ValueError(f"split_stages={split_stages!r} is the ring depth of the "
                         f"three-warpgroup kernel: it needs split_output=True")
    if state_layout not in SPLIT_STATE_LAYOUTS:
        raise ValueError(f"state_layout must be one of {SPLIT_STATE_LAYOUTS}, "
                         f"got {state_layout!r}")
    if state_layout != "kv" and not split_output:
        raise ValueError(f"state_layout={state_layout!r} is the layout of the three-warpgroup "
                         f"kernel's state warpgroup: it needs split_output=True")
    if split_order != SPLIT_DEFAULT_ORDER and not split_output:
        raise ValueError(f"split_order={split_order!r} orders the three-warpgroup kernel's "
                         f"output warpgroup: it needs split_output=True")
    if split_protocol not in SPLIT_PROTOCOLS:
        raise ValueError(f"split_protocol must be one of {SPLIT_PROTOCOLS}, "
                         f"got {split_protocol!r}")
    if split_protocol != SPLIT_DEFAULT_PROTOCOL:
        if not split_output:
            raise ValueError(f"split_protocol={split_protocol!r} is a barrier protocol of the "
                             f"three-warpgroup kernel: it needs split_output=True")
        if state_layout != "kv":
            raise ValueError(f"split_protocol={split_protocol!r} is built for "
                             f"state_layout='kv' only, got {state_layout=}")
        if stages in ("io", "state", "readout"):
            raise ValueError(f"split_protocol={split_protocol!r} needs both sides of the "
                             f"split kernel: stages 'full', 'no_store' or 'nobar', got "
                             f"{stages=}")

    mgl.check_piece_rows(pieces, batch, seq_len)
    if pieces > 1 and split_output:
        raise ValueError(f"pieces={pieces} is built for the two-warpgroup kernel only: it needs "
                         f"split_output=False")
    if summary and (split_output or store_v_new or store_h or stages != "full"):
        raise ValueError(f"summary=True runs the two-warpgroup state chain and stores only the "
                         f"final state: it needs split_output=False, store_v_new=False, "
                         f"store_h=False and stages='full', got {split_output=}, "
                         f"{store_v_new=}, {store_h=}, {stages=}")
    if piece_cuts is not None and (not summary or initial_state is not None
                                   or piece_cuts.shape != (batch,)
                                   or piece_cuts.dtype != jnp.int32):
        raise ValueError(f"piece_cuts must be int32 [B] = {(batch,)} for summary=True without "
                         f"initial_state, got {piece_cuts.shape} {piece_cuts.dtype}, "
                         f"{summary=}, initial_state given: {initial_state is not None}")

    num_chunks = -(-seq_len // CHUNK)
    padded = num_chunks * CHUNK
    # Padding tokens have q = k = v = 0, T0 rows = 0, beta = 0 and g = 0: Ag is zero on their
    # rows and columns, so v_new = 0 and o = 0 there and the state is unchanged.
    q, k, v, t0 = (mgl.pad_time(x, num_chunks) for x in (q, k, v, t0))
    gc = mgl.chunk_cumsum(g, (batch, seq_len, heads), num_chunks, gate_cumsum)  # [B, H, Tp]
    beta_hm = jnp.moveaxis(mgl.pad_time(beta.astype(jnp.float32), num_chunks), 1, 2)  # [B, H, Tp]
    doc, conn, last = mgl.doc_vectors(segment_ids, batch, num_chunks, doc_vecs)  # [B, Tp] each
    has_h0 = initial_state is not None
    kernel = functools.partial(_split_t0_kernel if split_output else _fused_t0_kernel,
                               num_chunks=num_chunks,
                               group=heads // kv_heads, scale=float(scale), has_h0=has_h0,
                               store_v_new=store_v_new, store_h=store_h, interpret=interpret,
                               **({} if stages == "full" else {"stages": stages}),
                               **({"split_order": split_order, "depth": split_stages}
                                  if split_output else {}),
                               **({"state_layout": state_layout} if state_layout != "kv"
                                  else {}),
                               **({"protocol": split_protocol}
                                  if split_protocol != SPLIT_DEFAULT_PROTOCOL else {}),
                               **({"pieces": pieces} if pieces > 1 else {}),
                               **({"summary": True} if summary else {}),
                               **({} if piece_cuts is None else {"piece_skip": True}))
    vk = state_layout == "vk"
    dtype = v.dtype
    sk = (dv, dk) if vk else (dk, dv)  # the state's layout inside the kernel
    out_type = [jax.ShapeDtypeStruct((batch, padded, heads, dv), dtype),  # o
                jax.ShapeDtypeStruct((batch, heads) + sk, jnp.float32)]  # final state
    if summary:  # the final state alone
        out_type.pop(0)
    if store_v_new:  # "vk": v_new^T, [B, H, V, Tp]
        out_type.append(jax.ShapeDtypeStruct(
            (batch, heads, dv, padded) if vk else (batch, padded, heads, dv), dtype))
    if store_h:  # pieces: [B, H, P N, ...] at global chunk indices
        out_type.append(jax.ShapeDtypeStruct(
            (batch // pieces, heads, pieces * num_chunks) + sk, dtype))
    depth = split_stages if split_output else STAGES  # of the TMA input ring
    vec = plgpu.SMEM((depth, CHUNK), jnp.float32)
    swz = mgl.swizzled_smem
    ring = [
        swz((depth, CHUNK, dk), q.dtype),  # q_s
        swz((depth, CHUNK, dk), k.dtype),  # k_s
        swz((depth, CHUNK, BLOCK_V), dtype),  # v_s
        swz((depth, CHUNK, CHUNK), t0.dtype),  # t0_s
        vec, vec, vec, vec, vec, vec, vec,  # g rows, g cols, beta cols, doc rows, doc cols,
        # last, conn
    ]
    if vk:
        sb = swz((2, BLOCK_V, dk), dtype)  # sb_s: S^T in 16 bits, published
        state = swz((BLOCK_V, dk), jnp.float32)  # state_s: staging of h0^T, final state^T
        vn = swz((2, BLOCK_V, CHUNK), dtype)  # vn_s: v_new^T, published
        o_tiles = swz((2, CHUNK, BLOCK_V), dtype)  # o_s: staging of the output tile (two)
        if depth == STAGES:
            tiles = [sb, vn, o_tiles, state]
        else:  # 3 x 49.75 + 32 + 32 + 16 + 16 KB is over 227 KB: S^T and the state share
            tiles = ([sb, state] if interpret else [plgpu.RefUnion(sb, state)]) + [vn, o_tiles]
    if split_output:
        sb = swz((2, dk, BLOCK_V), dtype)  # sb_s: S in 16 bits, published (double-buffered)
        state = swz((dk, BLOCK_V), jnp.float32)  # state_s: staging of h0, final state
        x = swz((CHUNK, BLOCK_V), dtype)  # x_s: X = V - diag(conn e^G) K S, operand of Ag X
        vn = swz((2, CHUNK, BLOCK_V), dtype)  # vn_s: v_new, published (double-buffered)
        vd = swz((CHUNK, BLOCK_V), dtype)  # vd_s: last e^{G_L - G} v_new, the wgmma operand
        o_tiles = swz((2, CHUNK, BLOCK_V), dtype)  # o_s: staging of the output tile (two)
        if vk:
            pass  # the tiles above
        elif depth == STAGES:
            tiles = [sb, x, vn, vd, o_tiles, state]
        else:  # a third stage fits in 227 KB only with two aliases (_SPLIT_SMEM)
            tiles = ([sb, state] if interpret else [plgpu.RefUnion(sb, state)]) + [
                x, vn, o_tiles]  # vd_s is x_s
        scratch = ring + tiles + [
            plgpu.Barrier(num_arrivals=_T0_IN_COPIES, num_barriers=depth),  # in_bar
            # in_free: both consumers released the stage (for t0_s: Ag was read)
            plgpu.Barrier(num_arrivals=2, num_barriers=depth),
            plgpu.Barrier(num_arrivals=1, num_barriers=depth),  # ag_ready: Ag over T0 written
            plgpu.Barrier(num_arrivals=1, num_barriers=2),  # s_ready: S, v_new published
            plgpu.Barrier(num_arrivals=1, num_barriers=2),  # s_free: both were read
        ] + ([plgpu.Barrier(num_arrivals=1, num_barriers=2)]  # s_pub: S published ("early_s")
             if split_protocol != SPLIT_DEFAULT_PROTOCOL else []) + [
            plgpu.Barrier(num_arrivals=1),  # io_bar: h0 landed
            plgpu.Barrier(num_arrivals=3),  # done: all warpgroups finished
        ]
        if interpret:  # SMEM copies of what the GPU reads as a transposed view or registers
            scratch += [plgpu.SMEM((dk, CHUNK), k.dtype)] * 2  # kt0_s, kt1_s: k^T
            scratch += [swz((CHUNK, CHUNK), dtype)]  # p_s: P
            if vk:  # agt_s (Ag^T), st_s (S), vnt_s (v_new); sl_s, xt_s, vdt_s (registers)
                scratch += [swz((CHUNK, CHUNK), dtype), swz((dk, BLOCK_V), dtype),
                            swz((CHUNK, BLOCK_V), dtype), swz((BLOCK_V, dk), dtype),
                            swz((BLOCK_V, CHUNK), dtype), swz((BLOCK_V, CHUNK), dtype),
                            swz((BLOCK_V, CHUNK), dtype), swz((BLOCK_V, BLOCK_V), dtype)]
                # ... and vt_s (V^T), eye_s (the identity)
    else:
        scratch = ring + [
            swz((dk, BLOCK_V), dtype),  # sb_s: S in 16 bits (operand of K S, Q S; h staging)
            swz((CHUNK, BLOCK_V), dtype),  # x_s: X = V - diag(conn e^G) K S, operand of Ag X
            swz((CHUNK, BLOCK_V), dtype),  # vn_s: v_new, operand of P v_new (and staging)
            swz((CHUNK, BLOCK_V), dtype),  # vd_s: last e^{G_L - G} v_new, the wgmma operand
            swz((CHUNK, BLOCK_V), dtype),  # o_s: staging of the output tile
            swz((dk, BLOCK_V), jnp.float32),  # state_s: staging of h0, final state
            plgpu.Barrier(num_arrivals=_T0_IN_COPIES, num_barriers=STAGES),  # in_bar
            plgpu.Barrier(num_arrivals=1, num_barriers=STAGES),  # in_free: a stage may be refilled
            plgpu.Barrier(num_arrivals=1),  # io_bar: h0 landed
            plgpu.Barrier(num_arrivals=2),  # done: both warpgroups finished
        ]
        if interpret:  # SMEM copies of what the GPU reads as a transposed view or registers
            scratch += [plgpu.SMEM((dk, CHUNK), k.dtype),  # kt_s: k^T
                        swz((CHUNK, CHUNK), dtype),  # p_s: P
                        swz((CHUNK, CHUNK), dtype),  # hi_s
                        swz((CHUNK, CHUNK), dtype)]  # lo_s
    call = plgpu.kernel(
        kernel,
        out_type=tuple(out_type),
        scratch_types=scratch,
        grid=(batch, heads, dv // BLOCK_V),
        grid_names=("b", "h", "v"),
        num_threads=3 if split_output else 2,
        thread_name="wg",
        compiler_params=mgl.compiler_params(
            **({"unsafe_no_auto_barriers": True} if stages == "nobar" else {})),
        interpret=mgl.interpret_params() if interpret else None,
        kernel_name=("gdn_chunk_delta_fused_t0_fwd_summary"
                     + ("" if piece_cuts is None else "_skip") if summary else
                     fused_t0_kernel_name(split_output=split_output, split_order=split_order,
                                          split_stages=split_stages, state_layout=state_layout,
                                          stages=stages, split_protocol=split_protocol)),
    )
    h0 = () if initial_state is None else (initial_state.astype(jnp.float32),)
    if vk:  # the kernel carries S^T: [B, H, V, K] in and out
        h0 = tuple(jnp.swapaxes(x, -1, -2) for x in h0)
    with jax.named_scope("gdn_chunk_delta_fused_t0_fwd_mosaic"):
        starts = () if piece_cuts is None else (jnp.maximum(piece_cuts, 0),)
        outs = list(call(q, k, v, t0, gc, beta_hm, doc, last, conn, *h0, *starts))
    o = None if summary else outs.pop(0)
    final_state = outs.pop(0)
    v_new = outs.pop(0) if store_v_new else None
    h = outs.pop(0) if store_h else None
    if vk:
        final_state = jnp.swapaxes(final_state, -1, -2)
        h = None if h is None else jnp.swapaxes(h, -1, -2)
        v_new = None if v_new is None else jnp.transpose(v_new, (0, 3, 1, 2))
    v_new = None if v_new is None else v_new[:, :seq_len]
    return None if o is None else o[:, :seq_len], final_state, v_new, h
