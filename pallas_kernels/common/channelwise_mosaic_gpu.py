"""The per-channel-decay family's state passes on Mosaic GPU (Hopper ``wgmma``/TMA).

:func:`channelwise_forward_mosaic` is a drop-in for the Triton ``forward`` kernel of
:mod:`pallas_kernels.common.channelwise_gpu` (``_forward_kernel`` / ``_forward``, issue 29): the
sequential pass over the chunks of KDA and Gated DeltaNet-2 (paper arXiv 2607.07953, Eqs.
18-24; the chunk form in ``channelwise_gpu``'s module docstring). Everything per-channel was
folded into its inputs by ``channelwise_gpu``'s ``intra``, ``prepare`` and ``wu`` kernels
(``Qg = q E_in``, ``Kg = k E_out``, ``W = A (kr E_in)``, ``U = A vw``, ``Mq`` masked to causal
same-document pairs and decayed, ``e_all = exp(gamma_C) conn_C``), so per chunk ``n`` of
C = 64 tokens, with the fp32 state ``S`` (``[K, 64]``, 64 value columns per CTA) in registers::

    Vn_n  = U_n - W_n S                        ([C, K] x [K, 64])
    O_n   = scale (Qg_n S + Mq_n Vn_n)          (Mq_n [C, C], from SMEM)
    S    <- diag(e_all_n) S + Kg_n^T Vn_n      (e_all_n [K] fp32: a per-key-row scale of S)

Documents need nothing more here: a document starting inside a chunk has zero rows of ``Qg``
and ``W`` before it sees the state (``conn`` in ``E_in``), zero rows of ``Kg`` for tokens that do
not reach the chunk's end (``last`` in ``E_out``), ``e_all = 0`` (``conn_C``) and no ``Mq``
entries across documents, exactly as the Triton kernel reads them.

Kernel structure, as the GDN ``split_output`` kernel
(:func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu_fused.chunk_delta_fused_fwd_mosaic`;
``pallas_kernels/common/MOSAIC_GPU.md`` Sec. 18). Grid ``(B, H, V / 64)``, three warpgroups:

* memory (``setmaxnreg 40``): a two-stage TMA ring of ``Qg, Kg, W`` (``[C, K]``), ``U``
  (``[C, 64]``), ``Mq`` (``[C, C]``) and ``e_all`` (``[K]`` fp32): six copies per stage
  (:func:`mosaic_gpu_lib.ring_producer`); a stage is refilled when both consumers released it;
* state (``setmaxnreg 232``): publishes ``S`` in the operand dtype (double-buffered SMEM tile,
  also the staging tile of ``hs``) and signals ``s_ready``; ``W S`` (one ``wgmma``);
  ``Vn = U - W S`` in fp32, published in the operand dtype (double-buffered; the staging tile of
  the ``Vn`` store) with ``v_ready``; ``Kg^T Vn`` (``Kg^T`` a transposed SMEM view); then
  ``S <- e_all[:, None] S + Kg^T Vn``. Before overwriting a published tile it waits on
  ``s_free`` of the chunk two back;
* output (``setmaxnreg 232``): on ``s_ready`` issues ``Qg S``, on ``v_ready`` ``Mq Vn`` (one
  ``wgmma`` group, so ``Qg S`` runs while the state warpgroup forms ``Vn``), signals
  ``s_free``, and stores ``O = scale (Qg S + Mq Vn)`` through a double-buffered tile.

Roundings are the Triton kernel's (``pallas_gpu.mm``: both operands in the operand dtype, fp32
accumulation): ``S`` to the operand dtype for ``W S`` and ``Qg S``, ``Vn`` for ``Mq Vn`` and
``Kg^T Vn``; the state, ``Vn`` before its rounding and every accumulator are fp32.

SMEM at K = V = 128 (bf16), Mosaic GPU aligning every buffer to 1 KB: a ring stage is ``Qg, Kg,
W`` 16 KB each, ``U`` 8, ``Mq`` 8 and ``e_all`` 0.5 KB (the two stages' ``e_all`` share one 1 KB
buffer), so the ring is 129 KB; the published ``S`` 2 x 16, ``Vn`` 2 x 8, the output tiles
2 x 8 and the fp32 ``h0`` / final-state staging 32 KB: 225 KB, **230,496 bytes** by Mosaic GPU's
own count (jax 0.10.2 CUDA export) of the 232,448 (227 KB) an SM gives one block, 1.9 KB to
spare. ``alias_staging=True`` lets the fp32 staging share a ``plgpu.RefUnion`` with the
published ``S`` (as ``split_stages=3`` of the GDN ``fused_t0_split`` kernel: ``h0`` is in
registers before the first ``S`` is published, and the final state is written after the state
warpgroup observed ``s_free`` of the last two chunks and its own ``hs`` stores): **197,728
bytes** (193 KB). The CUDA export checks both
(``tests/pallas_kernels/kernel_mosaic_channelwise_test.py``). The interpreter has no
``RefUnion``: interpreted, the staging tile is always a buffer of its own.

Reverse pass. :func:`channelwise_backward_state_mosaic` is a drop-in for the Triton
``backward_state`` kernel (``_backward_state_kernel`` / ``_backward_state``): per chunk ``n``
from last to first, with the fp32 state gradient ``dS`` (``[K, 64]``) in registers, from
``dS = dht``::

    dS_C[n] = dS                                  (stored as dhs[n], operand dtype)
    dVn_n   = scale Mq_n^T dO_n + Kg_n dS (+ dvn_in_n, the residual's cotangent)
    dS     <- diag(e_all_n) dS + scale Qg_n^T dO_n - W_n^T dVn_n
    dh0     = dS after chunk 0

(the reverse of the forward's equations; ``backward_state`` in ``channelwise_gpu``'s module
docstring). Grid ``(B, H, V / 64)``, three warpgroups with the forward's structure:

* memory: the two-stage ring of ``Qg, Kg, W`` (``[C, K]``), ``dO`` (``[C, 64]``), ``Mq``,
  ``e_all`` and, if given, ``dvn_in`` (``[C, 64]``): six or seven copies per stage, in reverse
  chunk order;
* state: publishes ``dS`` in the operand dtype (double-buffered; the staging tile of ``dhs``)
  and signals ``s_ready``; issues ``Qg^T dO`` (``[K, 64]``), waits on ``v_ready`` and issues
  ``W^T dVn`` in the same ``wgmma`` group (``Qg^T`` and ``W^T`` transposed SMEM views), then
  ``dS <- e_all[:, None] dS + scale Qg^T dO - W^T dVn`` (the Triton kernel's order);
* dVn: issues ``Mq^T dO`` (``Mq^T`` a transposed view; it needs no state, so it runs while the
  state warpgroup finishes the previous chunk), waits on ``s_ready`` and issues ``Kg dS``;
  ``dVn = scale Mq^T dO + Kg dS (+ dvn_in)`` in fp32, published in the operand dtype
  (double-buffered; the staging tile of the ``dvn`` store) with ``v_ready``.

The chain per chunk is ``dS`` published, ``Kg dS``, ``dVn`` published, ``W^T dVn``, ``dS``;
the two products on ``dO`` stay off it. The protocol needs no ``s_free``: ``v_ready`` of a
chunk also says that the dVn warpgroup has read its ``dS`` tile, and ``s_ready`` of the next
chunk that the state warpgroup has read the ``dVn`` tile, so the two alternate strictly. One
``state_pass`` setting switches both passes: each is a drop-in with the Triton kernel's
outputs and roundings, the reverse one reads nothing the forward one writes (``hs`` and ``Vn``
go to ``backward_chunk``), and no case has come up where only one should run.
Roundings are the Triton kernel's: ``dS`` rounded for ``Kg dS``, ``dVn`` for ``W^T dVn``
(and stored so), ``dO`` and the inputs in the operand dtype; ``dS``, ``dh0`` and every
accumulator fp32.

SMEM of the reverse pass at K = V = 128 bf16: a ring stage is ``Qg, Kg, W`` 16 KB each, ``dO``
8, ``Mq`` 8, ``dvn_in`` 8 (the two stages' ``e_all`` one 1 KB buffer): 145 KB; the published
``dS`` 2 x 16, ``dVn`` 2 x 8 and the fp32 ``dht`` / ``dh0`` staging 32: **230,480 bytes** by
Mosaic GPU's count (jax 0.10.2 CUDA export) of the 232,448; 214,096 without ``dvn_in``;
**197,712** with ``dvn_in`` and ``alias_staging=True`` (the staging in a
``RefUnion`` with the published ``dS``: ``dht`` is in registers before the first ``dS`` is
published, and ``dh0`` is written after the last ``v_ready``, i.e. after the last read of
``dS``, and after this warpgroup's ``dhs`` stores read their tiles).

Sequence pieces (rows with few CTAs, e.g. B 1, T 32K, H 16, V 128: 32 CTAs on 132 SMs, 512
chunks each; MOSAIC_GPU.md Sec. 30, after the delta passes' Sec. 29). The forward update is
affine in the state, per chunk ``n``::

    S <- A_n S + B_n,   A_n = diag(e_all_n) - Kg_n^T W_n   ([K, K]),   B_n = Kg_n^T U_n

(substitute ``Vn_n = U_n - W_n S`` into the update; ``e_all_n = e^{gamma_C} conn_C`` is the
per-key-channel decay ``e^{g_last}`` of the chunk where the scalar-decay delta pass has
``keep e^{G_L}``). A piece ``p`` of consecutive chunks maps ``S -> M_p S + X_p`` with ``M_p``
the product of its ``A_n`` (last chunk leftmost) and ``X_p`` its pass from zero. The reverse
pass is the transpose: ``dVn_n = scale Mq_n^T dO_n + Kg_n dS (+ dvn_in_n)`` into
``dS <- diag(e_all_n) dS + scale Qg_n^T dO_n - W_n^T dVn_n`` gives ``dS <- A_n^T dS + c_n``, so
a piece maps an exit gradient ``d -> M_p^T d + Y_p`` (``Y_p`` its reverse pass from zero). A
document starting inside chunk ``n`` makes ``A_n`` exactly zero, as it zeroes the state:
``e_all_n = 0`` (``conn_C``), and no token both sees the entering state (``W``'s rows carry
``conn``) and reaches the chunk's end (``Kg``'s rows carry ``last``), so every term of
``Kg_n^T W_n`` has a zero factor; a piece with such a chunk has ``M_p = 0``. With
``pieces = P > 1`` the rows run as ``B * P`` rows of ``N / P`` chunks (the token arrays split
by a free reshape, ``mq`` and ``e_all`` read whole at global chunk indices): the forward is a
maps launch (``..._maps``: ``K`` columns from the identity, ``U = 0``, no ``Qg``, ``Mq`` or
read-out), a launch from zero (``..._pieces``: no read-out), an fp32 scan over the pieces
(``mosaic_gpu_lib.scan_piece_maps``, ``HIGHEST``) for the entry states, and the stored launch
from them (``hs`` at global chunk indices); the reverse a launch from zero exit gradients
(``..._pieces``: no ``dvn``, ``dhs`` stores), the scan with ``M_p^T`` from the last piece, and
the stored launch. ``P = 1`` is the single launch as before (the same Mosaic module).

CPU testing as the other Mosaic GPU kernels (MOSAIC_GPU.md Sec. 1): GPU interpret mode
(``Kg^T`` and, in the reverse pass, ``Qg^T``, ``W^T`` and ``Mq^T`` copied into SMEM, plain
vector and tile loads: ``mosaic_gpu_lib``'s shims) and lowering for CUDA through
``jax.export``. fp32 inputs are refused (``wgmma`` has no IEEE fp32 product);
``channelwise_gpu`` keeps its Triton kernels for them.
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
# The forward pass's TMA ring, one copy per stage each: Qg, Kg, W, U, Mq, e_all (_ring_names).
_RING_NAMES = ("qg", "kg", "w", "u", "mq", "e")
KERNEL_NAME = "channelwise_state_fwd_mosaic"
_BWD_COPIES = 6  # TMA copies per ring stage of the reverse pass: Qg, Kg, W, dO, Mq, e_all
BWD_KERNEL_NAME = "channelwise_state_bwd_mosaic"


def _issuer(srcs, ring, in_bar, num_chunks: Optional[int] = None):
    """``issue(i, slot)`` of the memory warpgroup (:func:`mosaic_gpu_lib.ring_producer`): the
    TMA copies of the GMEM views ``srcs(n)`` (one per ``ring`` buffer) into ``ring[.][slot]``,
    on ``in_bar[slot]``. Step ``i`` is chunk ``n = i``, or ``n = num_chunks - 1 - i`` (the
    reverse pass) when ``num_chunks`` is given."""

    def issue(i, slot):
        n = i if num_chunks is None else num_chunks - 1 - i
        for src, dst in zip(srcs(n), ring, strict=True):
            plgpu.copy_gmem_to_smem(src, dst.at[slot], in_bar.at[slot])

    return issue


def _split_staging(rest, alias: bool, interpret: bool):
    """``(sb_s, state_s, rest)``: the published 16-bit state tiles and the fp32 staging tile off
    the front of the scratch refs ``rest``, one ``RefUnion`` when ``alias`` (GPU only)."""
    if alias and not interpret:  # one RefUnion: the 16-bit tiles (the loop), the fp32 staging
        (sb_s, state_s), *rest = rest
    else:  # separate tiles (the interpreter has no RefUnion)
        sb_s, state_s, *rest = rest
    return sb_s, state_s, rest


def _staging_scratch(dk: int, dtype, alias: bool, interpret: bool):
    """The scratch entries :func:`_split_staging` reads: ``sb_s`` (``[2, K, 64]`` in ``dtype``,
    double-buffered) and ``state_s`` (``[K, 64]`` fp32), in a ``plgpu.RefUnion`` when
    ``alias`` and not interpreting."""
    sb = mgl.swizzled_smem((2, dk, BLOCK_V), dtype)
    state = mgl.swizzled_smem((dk, BLOCK_V), jnp.float32)
    return [plgpu.RefUnion(sb, state)] if alias and not interpret else [sb, state]


def _ring_scratch(shapes, dtype, dk: int):
    """The TMA ring's buffers: a swizzled ``[STAGES, *shape]`` tile in ``dtype`` per shape of
    ``shapes`` (the 16-bit operands), then ``e_all`` as ``[STAGES, K]`` fp32."""
    return ([mgl.swizzled_smem((STAGES,) + shape, dtype) for shape in shapes]
            + [plgpu.SMEM((STAGES, dk), jnp.float32)])


def _launch(kernel, out_type, scratch, grid, name: str, interpret: bool):
    """``plgpu.kernel`` of three warpgroups (``wg``) over ``grid`` ``(b, h, v)``."""
    return plgpu.kernel(
        kernel,
        out_type=tuple(out_type),
        scratch_types=scratch,
        grid=grid,
        grid_names=("b", "h", "v"),
        num_threads=3,
        thread_name="wg",
        compiler_params=mgl.compiler_params(),
        interpret=mgl.interpret_params() if interpret else None,
        kernel_name=name,
    )


def _ring_names(store: bool, zero_u: bool) -> Tuple[str, ...]:
    """The forward pass's TMA ring buffers, in ring order: all six for the stored pass; the
    summary launches of sequence pieces (``store=False``: no read-out) leave out ``Qg`` and
    ``Mq``, and the maps launch (``zero_u``) ``U`` too."""
    return tuple(n for n in _RING_NAMES
                 if (store or n not in ("qg", "mq")) and not (zero_u and n == "u"))


def _global_chunk(b, n, pieces: int, num_chunks: int):
    """``(row, chunk)`` of the whole-row arrays (``mq``, ``e_all``, ``hs``, ``dhs``) for step
    chunk ``n`` of grid row ``b`` when the rows are ``P = pieces`` pieces of ``num_chunks``
    chunks each (grid row ``b = row * P + piece``); ``(b, n)`` itself when ``P = 1``."""
    if pieces == 1:
        return b, n
    return lax.div(b, pieces), lax.rem(b, pieces) * num_chunks + n


def _kernel(qg_ref, kg_ref, w_ref, u_ref, mq_ref, e_ref, *rest, num_chunks: int, scale: float,
            has_h0: bool, store_v_new: bool, store_h: bool, alias: bool, interpret: bool,
            pieces: int = 1, store: bool = True, zero_u: bool = False):
    """Kernel body of :func:`channelwise_forward_mosaic` (module docstring); refs are GMEM.

    ``rest`` = ``[h0_ref,] [o_ref,] ht_ref, [vn_ref,] [hs_ref,]`` then the scratch; ``kt_s``
    (interpret mode only) is the SMEM copy of ``Kg^T`` that the GPU reads as a transposed view.
    Sequence pieces (:func:`_forward_call`): with ``pieces = P > 1`` the token arrays are ``P``
    pieces of ``num_chunks`` chunks per row as ``B * P`` grid rows, ``mq``, ``e_all`` and
    ``hs`` are whole rows read / written at the global chunk index; ``store=False`` (the
    summary launches) writes only the final state (no ``o``: the output warpgroup idles, ``Qg``
    and ``Mq`` are not loaded); ``zero_u`` takes ``U = 0`` (``u_ref`` not read).
    """
    rest = list(rest)
    h0_ref = rest.pop(0) if has_h0 else None
    o_ref = rest.pop(0) if store else None
    ht_ref = rest.pop(0)
    vn_ref = rest.pop(0) if store_v_new else None
    hs_ref = rest.pop(0) if store_h else None
    names = _ring_names(store, zero_u)
    ring, rest = tuple(rest[:len(names)]), rest[len(names):]
    bufs = dict(zip(names, ring))
    qg_s, kg_s, w_s, u_s, mq_s, e_s = (bufs.get(n) for n in _RING_NAMES)
    sb_s, state_s, rest = _split_staging(rest, alias, interpret)  # S in 16 bits; fp32 h0 / ht
    vn_s = rest.pop(0)
    o_s = rest.pop(0) if store else None
    in_bar, in_free, s_ready, v_ready, s_free, io_bar, done, *shim = rest
    kt_s = shim[0] if interpret else None
    b, h, iv = lax.axis_index("b"), lax.axis_index("h"), lax.axis_index("v")
    cols = pl.ds(iv * BLOCK_V, BLOCK_V)

    def srcs(n):  # the GMEM views of chunk n's ring stage
        rows = pl.ds(n * CHUNK, CHUNK)
        bg, ng = _global_chunk(b, n, pieces, num_chunks)
        views = dict(qg=lambda: qg_ref.at[b, rows, h], kg=lambda: kg_ref.at[b, rows, h],
                     w=lambda: w_ref.at[b, rows, h], u=lambda: u_ref.at[b, rows, h, cols],
                     mq=lambda: mq_ref.at[bg, h, ng], e=lambda: e_ref.at[bg, h, ng])
        return tuple(views[name]() for name in names)

    wg = lax.axis_index("wg")
    dk = kg_s.shape[-1]
    tile = (CHUNK, BLOCK_V)

    @pl.when(wg == 2)
    def _memory():
        plgpu.set_max_registers(40, action="decrease")
        mgl.ring_producer(_issuer(srcs, ring, in_bar), num_chunks, in_free)

    @pl.when(wg == 0)
    def _state():
        plgpu.set_max_registers(232, action="increase")
        h0 = h0_ref.at[b, h, :, cols] if has_h0 else None
        s0 = mgl.entry_state(h0, state_s, io_bar, (dk, BLOCK_V), interpret)

        def step(n, s):
            slot, half = lax.rem(n, STAGES), lax.rem(n, 2)
            rows = pl.ds(n * CHUNK, CHUNK)

            if store:  # without the read-out this warpgroup is the tiles' only reader
                @pl.when(n >= 2)
                def _():  # the output warpgroup has read the tiles published two chunks ago
                    plgpu.barrier_wait(s_free.at[half])

            # This warpgroup's stores (hs, Vn) of chunk n - 2 must have read their tiles.
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)
            sb_s.at[half][...] = s.astype(sb_s.dtype)  # S entering chunk n, operand dtype
            plgpu.commit_smem()
            if store:
                plgpu.barrier_arrive(s_ready.at[half])  # the output warpgroup may issue Qg S
            if store_h:
                bg, ng = _global_chunk(b, n, pieces, num_chunks)
                plgpu.copy_smem_to_gmem(sb_s.at[half], hs_ref.at[bg, h, ng, :, cols])
            plgpu.barrier_wait(in_bar.at[slot])

            def w_state(acc):
                plgpu.wgmma(acc, w_s.at[slot], sb_s.at[half])  # W S, [C, 64]
                return acc[...]

            # The barrier keeps the arithmetic after the accumulator read (MOSAIC_GPU.md Sec. 2).
            ws = lax.optimization_barrier(pl.run_scoped(w_state, plgpu.ACC(tile)))
            if zero_u:  # the maps launch: U = 0
                vn = -ws
            else:
                vn = mgl.load_tile(u_s.at[slot], interpret).astype(jnp.float32) - ws  # fp32
            vn_s.at[half][...] = vn.astype(vn_s.dtype)
            plgpu.commit_smem()
            if store:
                plgpu.barrier_arrive(v_ready.at[half])  # the output warpgroup may issue Mq Vn
            if store_v_new:
                plgpu.copy_smem_to_gmem(vn_s.at[half], vn_ref.at[b, rows, h, cols])
            e_all = mgl.load_rows(e_s.at[slot], interpret)  # [K] fp32, one value per key row
            kg_t = mgl.transposed(kg_s.at[slot], kt_s, interpret)

            def update(acc):
                plgpu.wgmma(acc, kg_t, vn_s.at[half])  # Kg^T Vn, [K, 64]
                return acc[...]

            kv = lax.optimization_barrier(pl.run_scoped(update, plgpu.ACC((dk, BLOCK_V))))
            plgpu.barrier_arrive(in_free.at[slot])  # Kg, W, U, e_all of the stage consumed
            # A fresh accumulator plus the decayed state (no run_state in the 0.10.2
            # interpreter).
            return mgl.by_row(e_all, (dk, BLOCK_V)) * s + kv

        s = lax.fori_loop(0, num_chunks, step, s0)
        if store:
            for n in range(max(num_chunks - 2, 0), num_chunks):  # observe the last releases
                plgpu.barrier_wait(s_free.at[n % 2])
        mgl.store_state(s, state_s, ht_ref.at[b, h, :, cols])

    @pl.when(wg == 1)
    def _output():
        plgpu.set_max_registers(232, action="increase")
        if not store:  # the summary launches have no read-out
            return

        def step(n, carry):
            slot, half = lax.rem(n, STAGES), lax.rem(n, 2)
            rows = pl.ds(n * CHUNK, CHUNK)
            plgpu.barrier_wait(in_bar.at[slot])
            plgpu.barrier_wait(s_ready.at[half])

            def read_out(qs_acc, pv_acc):  # one group: Qg S runs while Vn is formed
                plgpu.wgmma(qs_acc, qg_s.at[slot], sb_s.at[half])  # Qg S, [C, 64]
                plgpu.barrier_wait(v_ready.at[half])
                plgpu.wgmma(pv_acc, mq_s.at[slot], vn_s.at[half])  # Mq Vn, [C, 64]
                return qs_acc[...], pv_acc[...]

            qs, pv = lax.optimization_barrier(pl.run_scoped(
                read_out, plgpu.ACC(tile), plgpu.ACC(tile)))
            plgpu.barrier_arrive(s_free.at[half])
            plgpu.barrier_arrive(in_free.at[slot])
            o = scale * (qs + pv)
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


def _check_operands(qg, keyed, valued, mq, e_all, state, state_name: str) -> None:
    """The checks both state passes share: ``qg`` ``[B, T, H, K]`` in a 16-bit dtype; the
    ``(name, array)`` pairs of ``keyed`` shaped and typed as ``qg``, those of ``valued``
    ``[B, T, H, V]`` in its dtype (V the first one's); K, V in {64, 128}; ``mq`` ``[B, H, N, 64,
    64]`` in that dtype; ``e_all`` a float ``[B, H, N, K]``; ``state`` (named ``state_name``)
    ``[B, H, K, V]`` or ``None``.

    Raises:
        ValueError: naming the argument and the shape or dtype it needs.
    """
    v_name, v0 = valued[0]
    if qg.ndim != 4 or v0.ndim != 4:
        raise ValueError(f"qg must be [B, T, H, K] and {v_name} [B, T, H, V], got {qg.shape=} "
                         f"{v_name}.shape={v0.shape}")
    batch, seq_len, heads, dk = qg.shape
    dv = v0.shape[-1]
    dtype = jnp.dtype(qg.dtype)
    names = ", ".join(n for n, _ in (("qg", qg),) + tuple(keyed) + tuple(valued)) + ", mq"
    if dtype not in mgl.SUPPORTED_DTYPES:
        raise ValueError(f"{names} must share a 16-bit dtype (bf16 or fp16: wgmma operands), "
                         f"got qg.dtype={dtype}; fp32 inputs take the Triton state pass "
                         f"(channelwise_gpu, state_pass='triton')")
    if dk not in mgl.SUPPORTED_HEAD_DIMS or dv not in mgl.SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head dims must be in {mgl.SUPPORTED_HEAD_DIMS}, got K={dk} (qg) "
                         f"V={dv} ({v_name})")
    for name, x in keyed:
        if x.shape != qg.shape or x.dtype != dtype:
            raise ValueError(f"{name} must have qg's shape {qg.shape} and dtype {dtype}, got "
                             f"{x.shape} {x.dtype}")
    for name, x in valued:
        if x.shape != (batch, seq_len, heads, dv) or x.dtype != dtype:
            raise ValueError(f"{name} must be [B, T, H, V] = {(batch, seq_len, heads, dv)} in "
                             f"qg's dtype {dtype}, got {x.shape} {x.dtype}")
    num_chunks = -(-seq_len // CHUNK)
    want = (batch, heads, num_chunks, CHUNK, CHUNK)
    if mq.shape != want or mq.dtype != dtype:
        raise ValueError(f"mq must be [B, H, N, C, C] = {want} in qg's dtype {dtype}, got "
                         f"{mq.shape} {mq.dtype}")
    want = (batch, heads, num_chunks, dk)
    if e_all.shape != want or not jnp.issubdtype(e_all.dtype, jnp.floating):
        raise ValueError(f"e_all must be a float [B, H, N, K] = {want}, got {e_all.shape} "
                         f"{e_all.dtype}")
    if state is not None and state.shape != (batch, heads, dk, dv):
        raise ValueError(f"{state_name} must be [B, H, K, V] = {(batch, heads, dk, dv)}, got "
                         f"{state.shape}")


def check_inputs(qg, kg, w, u, mq, e_all, initial_state) -> None:
    """The input contract of :func:`channelwise_forward_mosaic`.

    Raises:
        ValueError: naming the argument and the shape or dtype it needs: ``qg``, ``kg``, ``w``
            not ``[B, T, H, K]`` of one 16-bit dtype (fp32 inputs: use the Triton state pass);
            ``u`` not ``[B, T, H, V]`` in that dtype; K or V not 64 or 128; ``mq`` not
            ``[B, H, N, 64, 64]`` in that dtype (``N = ceil(T / 64)``); ``e_all`` not a float
            ``[B, H, N, K]``; ``initial_state`` not ``[B, H, K, V]``.
    """
    _check_operands(qg, (("kg", kg), ("w", w)), (("u", u),), mq, e_all, initial_state,
                    "initial_state")


@functools.partial(jax.jit, static_argnames=("scale", "store_v_new", "store_h", "alias_staging",
                                             "pieces", "return_maps", "interpret"))
def channelwise_forward_mosaic(
    qg: jax.Array,
    kg: jax.Array,
    w: jax.Array,
    u: jax.Array,
    mq: jax.Array,
    e_all: jax.Array,
    *,
    scale: float,
    initial_state: Optional[jax.Array] = None,
    store_v_new: bool = False,
    store_h: bool = False,
    alias_staging: bool = False,
    pieces: Optional[int] = None,
    return_maps: bool = False,
    interpret: bool = False,
) -> Tuple[Optional[jax.Array], ...]:
    """The forward state pass of KDA / GDN-2 in one Mosaic GPU kernel (module docstring).

    Per batch row, head and chunk ``n`` of C = 64 tokens, from ``S = initial_state`` (paper
    arXiv 2607.07953, Eqs. 18-24; the chunk form of ``channelwise_gpu``'s module docstring)::

        Vn_n = U_n - W_n S
        O_n  = scale (Qg_n S + Mq_n Vn_n)
        S   <- diag(e_all_n) S + Kg_n^T Vn_n

    with the Triton ``forward`` kernel's roundings (``S`` and ``Vn`` rounded to the operand
    dtype as ``wgmma`` operands, fp32 state and accumulation). The inputs are what
    ``channelwise_gpu._prepare`` returns (``qg_ref``, ``kg_ref``, ``w_ref``, ``u_ref``,
    ``mq_ref``, ``e_ref``), so its outputs are ``channelwise_gpu._forward``'s.

    Args:
        qg: ``q E_in`` ``[B, T, H, K]``, bf16 or fp16 (the decay-scaled queries).
        kg: ``k E_out`` ``[B, T, H, K]``, qg's dtype.
        w: ``W = A (kr E_in)`` ``[B, T, H, K]``, qg's dtype.
        u: ``U = A vw`` ``[B, T, H, V]``, qg's dtype. ``K, V`` in {64, 128}.
        mq: the decayed, causal, same-document ``Mq`` of every chunk ``[B, H, N, 64, 64]``
            (``N = ceil(T / 64)``), qg's dtype.
        e_all: ``exp(gamma_C) conn_C`` ``[B, H, N, K]``, read as fp32.
        scale: read-out scale (static).
        initial_state: ``[B, H, K, V]`` (read as fp32) or ``None`` for zeros.
        store_v_new: also return ``Vn`` (static; the residual and the backward's input).
        store_h: also return the state entering every chunk (static; the backward's ``hs``).
        alias_staging: let the fp32 ``h0`` / final-state staging tile share SMEM with the
            published ``S`` (a ``plgpu.RefUnion``; static): 193 KB instead of 225 KB at
            K = V = 128 bf16 (module docstring). Same results; ignored when interpreting.
        pieces: static; the sequence pieces ``P`` each row is cut into (``None``: chosen by
            :func:`pallas_kernels.common.mosaic_gpu_lib.num_pieces`, 1 unless
            ``B * H * V / 64`` CTAs would leave the GPU idle: ``P = 4`` at B 1, H 16, V 128,
            T 32K); it must divide ``N``. With ``P > 1`` a piece maps ``S -> M_p S + X_p``
            (``M_p`` the product of its chunks' ``diag(e_all_n) - Kg_n^T W_n``): three launches
            over ``B * P`` rows of ``N / P`` chunks (the maps from the identity with
            ``U = 0`` on ``K`` columns, the pieces from zero, both storing only final states;
            then, after an fp32 scan over the pieces for their entry states, the stored pass).
            Same results up to the 16-bit rounding of the maps' and entry states' ``wgmma``
            operands (MOSAIC_GPU.md Sec. 30).
        return_maps: static; also return the piece maps ``M`` ``[B, P, H, K, K]`` fp32
            (``None`` when ``P = 1``), which :func:`channelwise_backward_state_mosaic` takes as
            ``piece_maps``.
        interpret: run in Mosaic GPU interpret mode (CPU; slow, for tests).

    Returns:
        ``(o, final_state, vn, hs)``, plus ``maps`` with ``return_maps``: ``o``
        ``[B, T, H, V]`` in the input dtype; ``final_state`` ``[B, H, K, V]`` fp32; ``vn``
        ``[B, T, H, V]`` in the input dtype or ``None``; ``hs`` ``[B, H, N, K, V]`` in the
        input dtype or ``None``. A ``T`` that is not a multiple of 64 is zero-padded inside
        (the padded tokens add nothing).

    Raises:
        ValueError: as :func:`check_inputs` (shapes, 16-bit dtype, head dims), or naming
            ``pieces`` when it is not a positive divisor of ``N``.
    """
    check_inputs(qg, kg, w, u, mq, e_all, initial_state)
    batch, seq_len, heads, dk = qg.shape
    dv = u.shape[-1]
    num_chunks = mq.shape[2]
    padded = num_chunks * CHUNK
    pieces = mgl.num_pieces(pieces, batch * heads * (dv // BLOCK_V), num_chunks)
    qg, kg, w, u = (mgl.pad_time(x, num_chunks) for x in (qg, kg, w, u))
    e_all = e_all.astype(jnp.float32)
    h0 = None if initial_state is None else initial_state.astype(jnp.float32)
    run = functools.partial(_forward_call, scale=float(scale), pieces=pieces,
                            alias_staging=alias_staging, interpret=interpret)
    with jax.named_scope(KERNEL_NAME):
        if pieces == 1:
            o, final_state, vn, hs = run(qg, kg, w, u, mq, e_all, h0, store_v_new=store_v_new,
                                         store_h=store_h)
            maps = None
        else:
            # Sequence pieces (rows with few CTAs): each piece's affine map S -> M_p S + X_p
            # from two launches that store only final states, the entry states by an fp32 scan
            # over the pieces, then the pieces as rows from their entry states. The token
            # arrays split by a free reshape; mq and e_all are read whole at global chunk
            # indices, so conn of a piece's first chunk gates its entry state like any chunk's.
            qgp, kgp, wp, up = (mgl.split_rows(x, pieces) for x in (qg, kg, w, u))
            maps = _piece_maps(kgp, wp, mq, e_all, run, pieces)  # [B, P, H, K, K]
            (x_local,) = run(qgp, kgp, wp, up, mq, e_all, None, store=False)
            entries = mgl.scan_piece_maps(maps, x_local.reshape(batch, pieces, heads, dk, dv),
                                          h0, reverse=False)
            o, finals, vn, hs = run(qgp, kgp, wp, up, mq, e_all,
                                    entries.reshape(batch * pieces, heads, dk, dv),
                                    store_v_new=store_v_new, store_h=store_h)
            o = o.reshape(batch, padded, heads, dv)
            vn = None if vn is None else vn.reshape(batch, padded, heads, dv)
            final_state = finals.reshape(batch, pieces, heads, dk, dv)[:, -1]
    out = (o[:, :seq_len], final_state, None if vn is None else vn[:, :seq_len], hs)
    return out + (maps,) if return_maps else out


def _forward_call(qg, kg, w, u, mq, e_all, h0, *, scale, pieces, alias_staging, interpret,
                  store=True, zero_u=False, store_v_new=False, store_h=False):
    """One launch of the forward state pass (:func:`_kernel`) over ``R = B * P`` rows of
    ``Tq = N / P * 64`` tokens (the pieces as rows, ``P = pieces``; ``P = 1``: the rows as
    they are). ``qg, kg, w`` ``[R, Tq, H, K]``, ``u`` ``[R, Tq, H, V]`` in the operand dtype
    (with ``zero_u`` a placeholder of the state's column width, not read); ``mq``
    ``[B, H, N, 64, 64]`` and ``e_all`` ``[B, H, N, K]`` fp32 whole rows; ``h0`` ``[R, H, K,
    V]`` fp32 or ``None``. Returns ``(o, ht, vn, hs)`` (``o``, ``vn`` ``[R, Tq, H, V]``,
    ``ht`` ``[R, H, K, V]`` fp32, ``hs`` ``[B, H, N, K, V]`` at global chunk indices; ``vn``,
    ``hs`` ``None`` unless stored), or ``(ht,)`` without ``store`` (the summary launches,
    named ``..._maps`` with ``zero_u``, else ``..._pieces``)."""
    rows, tq, heads, dk = kg.shape
    dv = u.shape[-1]
    num_chunks = tq // CHUNK
    kernel = functools.partial(_kernel, num_chunks=num_chunks, scale=scale,
                               has_h0=h0 is not None, store_v_new=store_v_new, store_h=store_h,
                               alias=alias_staging, interpret=interpret, pieces=pieces,
                               store=store, zero_u=zero_u)
    dtype = kg.dtype
    out_type = [jax.ShapeDtypeStruct((rows, tq, heads, dv), dtype)] if store else []  # o
    out_type.append(jax.ShapeDtypeStruct((rows, heads, dk, dv), jnp.float32))  # final state
    if store_v_new:
        out_type.append(jax.ShapeDtypeStruct((rows, tq, heads, dv), dtype))
    if store_h:
        out_type.append(jax.ShapeDtypeStruct((rows // pieces, heads, pieces * num_chunks, dk,
                                              dv), dtype))
    swz = mgl.swizzled_smem
    # The ring (qg_s, kg_s, w_s, u_s, mq_s, e_s, less those _ring_names leaves out); then sb_s
    # (S in 16 bits, published, double-buffered) and state_s (staging of h0, final state).
    names = _ring_names(store, zero_u)
    shapes = dict(qg=(CHUNK, dk), kg=(CHUNK, dk), w=(CHUNK, dk), u=(CHUNK, BLOCK_V),
                  mq=(CHUNK, CHUNK))
    scratch = _ring_scratch(tuple(shapes[n] for n in names if n != "e"), dtype, dk)
    scratch += _staging_scratch(dk, dtype, alias_staging, interpret)
    scratch.append(swz((2, CHUNK, BLOCK_V), dtype))  # vn_s: Vn, published (double-buffered)
    if store:
        scratch.append(swz((2, CHUNK, BLOCK_V), dtype))  # o_s: staging of the output (two)
    scratch += [
        plgpu.Barrier(num_arrivals=len(names), num_barriers=STAGES),  # in_bar: copies landed
        plgpu.Barrier(num_arrivals=2 if store else 1,
                      num_barriers=STAGES),  # in_free: both consumers (or the state one) done
        plgpu.Barrier(num_arrivals=1, num_barriers=2),  # s_ready: S published
        plgpu.Barrier(num_arrivals=1, num_barriers=2),  # v_ready: Vn published
        plgpu.Barrier(num_arrivals=1, num_barriers=2),  # s_free: S and Vn were read
        plgpu.Barrier(num_arrivals=1),  # io_bar: h0 landed
        plgpu.Barrier(num_arrivals=3),  # done: all warpgroups finished
    ]
    if interpret:  # the SMEM copy of what the GPU reads as a transposed view
        scratch.append(plgpu.SMEM((dk, CHUNK), dtype))  # kt_s: Kg^T
    name = KERNEL_NAME + ("" if store else "_maps" if zero_u else "_pieces")
    call = _launch(kernel, out_type, scratch, (rows, heads, dv // BLOCK_V), name, interpret)
    outs = list(call(qg, kg, w, u, mq, e_all, *(() if h0 is None else (h0,))))
    if not store:
        return tuple(outs)
    o, final_state = outs.pop(0), outs.pop(0)
    vn = outs.pop(0) if store_v_new else None
    hs = outs.pop(0) if store_h else None
    return o, final_state, vn, hs


def _piece_maps(kgp, wp, mq, e_all, run, pieces):
    """The ``[K, K]`` state maps ``M_p`` of the pieces, ``[B, P, H, K, K]`` fp32: the forward
    pass on ``K`` columns from the identity with ``U = 0`` (``S -> (diag(e_all) - Kg^T W) S``
    per chunk), on the pieces as rows (``kgp``, ``wp`` split by
    :func:`pallas_kernels.common.mosaic_gpu_lib.split_rows`; ``mq``, ``e_all`` whole rows),
    storing only each piece's final state. ``run`` is :func:`_forward_call` with the static
    options bound. Documents: a start inside a piece zeroes ``M_p`` exactly (``e_all = 0``
    there, and no token both reaches the chunk's end through ``Kg`` and sees the entering
    state through ``W``)."""
    rows, _, heads, dk = wp.shape
    eye = jnp.broadcast_to(jnp.eye(dk, dtype=jnp.float32), (rows, heads, dk, dk))
    (maps,) = run(wp, kgp, wp, wp, mq, e_all, eye, store=False, zero_u=True)
    return maps.reshape(rows // pieces, pieces, heads, dk, dk)


# ----------------------------------------------------------------------------------------------
# The reverse state pass (module docstring, "Reverse pass").


def _bwd_kernel(qg_ref, kg_ref, w_ref, mq_ref, e_ref, do_ref, *rest, num_chunks: int,
                scale: float, has_dvn_in: bool, has_dht: bool, alias: bool, interpret: bool,
                pieces: int = 1, store: bool = True, dvn_heads_first: bool = False):
    """Kernel body of :func:`channelwise_backward_state_mosaic` (module docstring); refs are
    GMEM. ``rest`` = ``[dvn_in_ref,] [dht_ref,] [dvn_ref, dhs_ref,] dh0_ref`` then the
    scratch; ``qgt_s, wt_s, mqt_s`` (interpret mode only) are the SMEM copies of ``Qg^T, W^T,
    Mq^T`` that the GPU reads as transposed views. Step ``i`` is chunk ``n = N - 1 - i``.
    Sequence pieces: with ``pieces = P > 1`` the token arrays are ``P`` pieces per row as
    ``B * P`` grid rows, ``mq``, ``e_all`` and ``dhs`` whole rows at the global chunk index;
    ``store=False`` (the launch from zero exit gradients) writes only ``dh0``.
    ``dvn_heads_first``: ``dvn_ref`` is ``[B, H, P * Tq, V]`` (whole rows, global chunk index)."""
    rest = list(rest)
    dvn_in_ref = rest.pop(0) if has_dvn_in else None
    dht_ref = rest.pop(0) if has_dht else None
    dvn_ref, dhs_ref = (rest.pop(0), rest.pop(0)) if store else (None, None)
    dh0_ref = rest.pop(0)
    copies = _BWD_COPIES + int(has_dvn_in)
    ring, rest = tuple(rest[:copies]), rest[copies:]
    qg_s, kg_s, w_s, do_s, mq_s, e_s = ring[:_BWD_COPIES]
    din_s = ring[_BWD_COPIES] if has_dvn_in else None
    sb_s, state_s, rest = _split_staging(rest, alias, interpret)  # dS in 16 bits; fp32 dht/dh0
    vn_s, in_bar, in_free, s_ready, v_ready, io_bar, done, *shim = rest
    qgt_s, wt_s, mqt_s = shim if interpret else (None, None, None)
    b, h, iv = lax.axis_index("b"), lax.axis_index("h"), lax.axis_index("v")
    cols = pl.ds(iv * BLOCK_V, BLOCK_V)
    wg = lax.axis_index("wg")
    dk = kg_s.shape[-1]
    tile, state_shape = (CHUNK, BLOCK_V), (dk, BLOCK_V)

    def srcs(n):  # the GMEM views of chunk n's ring stage
        rows = pl.ds(n * CHUNK, CHUNK)
        bg, ng = _global_chunk(b, n, pieces, num_chunks)
        views = (qg_ref.at[b, rows, h], kg_ref.at[b, rows, h], w_ref.at[b, rows, h],
                 do_ref.at[b, rows, h, cols], mq_ref.at[bg, h, ng], e_ref.at[bg, h, ng])
        return views + ((dvn_in_ref.at[b, rows, h, cols],) if has_dvn_in else ())

    @pl.when(wg == 2)
    def _memory():
        plgpu.set_max_registers(40, action="decrease")
        mgl.ring_producer(_issuer(srcs, ring, in_bar, num_chunks), num_chunks, in_free)

    @pl.when(wg == 0)
    def _state():
        plgpu.set_max_registers(232, action="increase")
        dht = dht_ref.at[b, h, :, cols] if has_dht else None
        ds0 = mgl.entry_state(dht, state_s, io_bar, state_shape, interpret)

        def step(i, ds):
            n = num_chunks - 1 - i
            slot, half = lax.rem(i, STAGES), lax.rem(i, 2)
            # This warpgroup's dhs store of step i - 2 must have read sb_s[half]; the dVn
            # warpgroup's read of it ended before its v_ready of step i - 2, waited below.
            plgpu.wait_smem_to_gmem(1, wait_read_only=True)
            sb_s.at[half][...] = ds.astype(sb_s.dtype)  # dS_C of chunk n, operand dtype
            plgpu.commit_smem()
            plgpu.barrier_arrive(s_ready.at[half])  # the dVn warpgroup may issue Kg dS
            if store:
                bg, ng = _global_chunk(b, n, pieces, num_chunks)
                plgpu.copy_smem_to_gmem(sb_s.at[half], dhs_ref.at[bg, h, ng, :, cols])
            plgpu.barrier_wait(in_bar.at[slot])
            qg_t = mgl.transposed(qg_s.at[slot], qgt_s, interpret)
            w_t = mgl.transposed(w_s.at[slot], wt_s, interpret)

            def grads(qd_acc, wd_acc):  # one group: Qg^T dO runs while dVn is formed
                plgpu.wgmma(qd_acc, qg_t, do_s.at[slot])  # Qg^T dO, [K, 64]
                plgpu.barrier_wait(v_ready.at[half])
                plgpu.wgmma(wd_acc, w_t, vn_s.at[half])  # W^T dVn, [K, 64]
                return qd_acc[...], wd_acc[...]

            # The barrier keeps the arithmetic after the accumulator reads (MOSAIC_GPU.md Sec. 2).
            qd, wd = lax.optimization_barrier(pl.run_scoped(
                grads, plgpu.ACC(state_shape), plgpu.ACC(state_shape)))
            e_all = mgl.load_rows(e_s.at[slot], interpret)  # [K] fp32, one value per key row
            plgpu.barrier_arrive(in_free.at[slot])  # Qg, W, dO, e_all of the stage consumed
            # The Triton kernel's order: (e_all dS + scale Qg^T dO) - W^T dVn, all fp32.
            return mgl.by_row(e_all, state_shape) * ds + scale * qd - wd

        ds = lax.fori_loop(0, num_chunks, step, ds0)
        # The dVn warpgroup's last read of sb_s ended before the last v_ready, waited above.
        mgl.store_state(ds, state_s, dh0_ref.at[b, h, :, cols])

    @pl.when(wg == 1)
    def _dvn():
        plgpu.set_max_registers(232, action="increase")

        def step(i, carry):
            n = num_chunks - 1 - i
            slot, half = lax.rem(i, STAGES), lax.rem(i, 2)
            rows = pl.ds(n * CHUNK, CHUNK)
            plgpu.barrier_wait(in_bar.at[slot])
            mq_t = mgl.transposed(mq_s.at[slot], mqt_s, interpret)

            def products(md_acc, kd_acc):  # one group: Mq^T dO runs before dS is published
                plgpu.wgmma(md_acc, mq_t, do_s.at[slot])  # Mq^T dO, [C, 64]
                plgpu.barrier_wait(s_ready.at[half])
                plgpu.wgmma(kd_acc, kg_s.at[slot], sb_s.at[half])  # Kg dS, [C, 64]
                return md_acc[...], kd_acc[...]

            md, kd = lax.optimization_barrier(pl.run_scoped(
                products, plgpu.ACC(tile), plgpu.ACC(tile)))
            dvn = scale * md + kd  # fp32, the Triton kernel's order
            if has_dvn_in:
                dvn = dvn + mgl.load_tile(din_s.at[slot], interpret).astype(jnp.float32)
            plgpu.barrier_arrive(in_free.at[slot])  # Kg, Mq, dO, dvn_in of the stage consumed
            # vn_s[half] of step i - 2: its store has read it (this wait); the state
            # warpgroup's W^T dVn read ended before its s_ready of step i - 1, waited above.
            plgpu.wait_smem_to_gmem(1, wait_read_only=True)
            vn_s.at[half][...] = dvn.astype(vn_s.dtype)
            plgpu.commit_smem()
            plgpu.barrier_arrive(v_ready.at[half])  # the state warpgroup may issue W^T dVn
            if store and dvn_heads_first:  # [B, H, T, V]: whole rows, global chunk index
                bg, ng = _global_chunk(b, n, pieces, num_chunks)
                dst = dvn_ref.at[bg, h, pl.ds(ng * CHUNK, CHUNK), cols]
                plgpu.copy_smem_to_gmem(vn_s.at[half], dst)
            elif store:
                plgpu.copy_smem_to_gmem(vn_s.at[half], dvn_ref.at[b, rows, h, cols])
            return carry

        lax.fori_loop(0, num_chunks, step, 0)
        plgpu.wait_smem_to_gmem(0)

    # All warpgroups leave together (an early exit while another issues wgmma is unsafe).
    plgpu.barrier_arrive(done)
    plgpu.barrier_wait(done)


def check_backward_inputs(qg, kg, w, mq, e_all, do, dvn_in, dht) -> None:
    """The input contract of :func:`channelwise_backward_state_mosaic`.

    Raises:
        ValueError: naming the argument and the shape or dtype it needs: ``qg``, ``kg``, ``w``
            not ``[B, T, H, K]`` of one 16-bit dtype (fp32 inputs: use the Triton state pass);
            ``do`` (and ``dvn_in`` if given) not ``[B, T, H, V]`` in that dtype; K or V not 64
            or 128; ``mq`` not ``[B, H, N, 64, 64]`` in that dtype (``N = ceil(T / 64)``);
            ``e_all`` not a float ``[B, H, N, K]``; ``dht`` not ``[B, H, K, V]``.
    """
    valued = (("do", do),) + ((("dvn_in", dvn_in),) if dvn_in is not None else ())
    _check_operands(qg, (("kg", kg), ("w", w)), valued, mq, e_all, dht, "dht")


@functools.partial(jax.jit, static_argnames=("scale", "alias_staging", "pieces",
                                             "dvn_heads_first", "interpret"))
def channelwise_backward_state_mosaic(
    qg: jax.Array,
    kg: jax.Array,
    w: jax.Array,
    mq: jax.Array,
    e_all: jax.Array,
    do: jax.Array,
    *,
    scale: float,
    dvn_in: Optional[jax.Array] = None,
    dht: Optional[jax.Array] = None,
    alias_staging: bool = False,
    pieces: Optional[int] = None,
    piece_maps: Optional[jax.Array] = None,
    dvn_heads_first: bool = False,
    interpret: bool = False,
) -> Tuple[jax.Array, jax.Array, jax.Array]:
    """The reverse state pass of KDA / GDN-2 in one Mosaic GPU kernel (module docstring).

    Per batch row, head and chunk ``n`` of C = 64 tokens, last to first, from ``dS = dht``
    (the gradient of the final state), the reverse of :func:`channelwise_forward_mosaic`'s
    recurrence (paper arXiv 2607.07953, Eqs. 18-24; ``backward_state`` in
    ``channelwise_gpu``'s module docstring)::

        dS_C[n] = dS                                   (stored as dhs[n])
        dVn_n   = scale Mq_n^T dO_n + Kg_n dS (+ dvn_in_n)
        dS     <- diag(e_all_n) dS + scale Qg_n^T dO_n - W_n^T dVn_n
        dh0     = dS after chunk 0

    with the Triton ``backward_state`` kernel's roundings (``dS`` and ``dVn`` rounded to the
    operand dtype as ``wgmma`` operands, fp32 ``dS`` and accumulation). The inputs are what
    ``channelwise_gpu._prepare`` returns plus the cotangents, so its outputs are
    ``channelwise_gpu._backward_state``'s.

    Args:
        qg: ``q E_in`` ``[B, T, H, K]``, bf16 or fp16.
        kg: ``k E_out`` ``[B, T, H, K]``, qg's dtype.
        w: ``W = A (kr E_in)`` ``[B, T, H, K]``, qg's dtype. ``K, V`` in {64, 128}.
        mq: the decayed, causal, same-document ``Mq`` of every chunk ``[B, H, N, 64, 64]``
            (``N = ceil(T / 64)``), qg's dtype.
        e_all: ``exp(gamma_C) conn_C`` ``[B, H, N, K]``, read as fp32.
        do: the output's cotangent ``dO`` ``[B, T, H, V]``, qg's dtype.
        scale: read-out scale (static).
        dvn_in: the cotangent of the returned residual ``Vn`` ``[B, T, H, V]`` in qg's dtype
            (read as fp32), or ``None``.
        dht: the final state's cotangent ``[B, H, K, V]`` (read as fp32), or ``None`` for zeros.
        alias_staging: let the fp32 ``dht`` / ``dh0`` staging tile share SMEM with the
            published ``dS`` (a ``plgpu.RefUnion``; static; module docstring). Same results;
            ignored when interpreting.
        pieces: static; sequence pieces ``P`` per row, as :func:`channelwise_forward_mosaic`'s
            (``None``: the same choice). With ``P > 1`` the reverse pass of a piece maps its
            exit gradient ``d -> M_p^T d + Y_p``: one launch from zero exit gradients gives
            every ``Y_p`` (storing only ``dh0``), an fp32 scan from the last piece the exit
            gradients, and a second launch stores ``dvn`` and ``dhs``.
        piece_maps: the forward's piece maps ``[B, P, H, K, K]`` fp32
            (:func:`channelwise_forward_mosaic` with ``return_maps``), or ``None`` to form
            them here (one more launch, the forward's maps launch); ignored when ``P = 1``.
        dvn_heads_first: static; return ``dvn`` as ``[B, H, T, V]`` (the same values; the
            layout ``channelwise_gpu._chunk_dr``'s product reads without a transpose: XLA's
            0.09 ms transpose at KDA S1 on an H100, MOSAIC_GPU.md Sec. 48.2). The kernel's
            TMA stores write that layout directly.
        interpret: run in Mosaic GPU interpret mode (CPU; slow, for tests).

    Returns:
        ``(dvn, dhs, dh0)``: ``dvn`` ``[B, T, H, V]`` (``[B, H, T, V]`` with
        ``dvn_heads_first``) and ``dhs`` (the gradient of every
        chunk's exit state) ``[B, H, N, K, V]`` in the input dtype; ``dh0`` ``[B, H, K, V]``
        fp32. A ``T`` that is not a multiple of 64 is zero-padded inside.

    Raises:
        ValueError: as :func:`check_backward_inputs` (shapes, 16-bit dtype, head dims), or
            naming ``pieces`` (not a positive divisor of ``N``) or ``piece_maps`` (not fp32
            ``[B, P, H, K, K]``).
    """
    check_backward_inputs(qg, kg, w, mq, e_all, do, dvn_in, dht)
    batch, seq_len, heads, dk = qg.shape
    dv = do.shape[-1]
    num_chunks = mq.shape[2]
    padded = num_chunks * CHUNK
    pieces = mgl.num_pieces(pieces, batch * heads * (dv // BLOCK_V), num_chunks)
    maps_shape = (batch, pieces, heads, dk, dk)
    if pieces > 1 and piece_maps is not None and (
            piece_maps.shape != maps_shape or piece_maps.dtype != jnp.float32):
        raise ValueError(f"piece_maps must be [B, P, H, K, K] = {maps_shape} float32 (the "
                         f"forward's return_maps), got {piece_maps.shape} {piece_maps.dtype}")
    qg, kg, w, do = (mgl.pad_time(x, num_chunks) for x in (qg, kg, w, do))
    dvn_in = None if dvn_in is None else mgl.pad_time(dvn_in, num_chunks)
    e_all = e_all.astype(jnp.float32)
    dht = None if dht is None else dht.astype(jnp.float32)
    run = functools.partial(_backward_call, scale=float(scale), pieces=pieces,
                            alias_staging=alias_staging, interpret=interpret)
    stored = functools.partial(run, dvn_heads_first=dvn_heads_first)

    def cut(dvn):  # the first T tokens of dvn, in either layout
        return dvn[:, :, :seq_len] if dvn_heads_first else dvn[:, :seq_len]

    with jax.named_scope(BWD_KERNEL_NAME):
        if pieces == 1:
            dvn, dhs, dh0 = stored(qg, kg, w, mq, e_all, do, dvn_in, dht)
            return cut(dvn), dhs, dh0
        # Sequence pieces: each piece's reverse map d -> M_p^T d + Y_p (Y_p from a zero exit
        # gradient, storing only dh0), the exit gradients by an fp32 scan from the last piece,
        # then the pieces as rows from their exit gradients.
        qgp, kgp, wp, dop = (mgl.split_rows(x, pieces) for x in (qg, kg, w, do))
        dinp = None if dvn_in is None else mgl.split_rows(dvn_in, pieces)
        if piece_maps is None:
            fwd_run = functools.partial(_forward_call, scale=float(scale), pieces=pieces,
                                        alias_staging=alias_staging, interpret=interpret)
            piece_maps = _piece_maps(kgp, wp, mq, e_all, fwd_run, pieces)
        (y_local,) = run(qgp, kgp, wp, mq, e_all, dop, dinp, None, store=False)
        exits = mgl.scan_piece_maps(piece_maps, y_local.reshape(batch, pieces, heads, dk, dv),
                                    dht, reverse=True)
        dvn, dhs, dh0s = stored(qgp, kgp, wp, mq, e_all, dop, dinp,
                                exits.reshape(batch * pieces, heads, dk, dv))
        if not dvn_heads_first:  # heads-first is written as whole rows already
            dvn = dvn.reshape(batch, padded, heads, dv)
        return cut(dvn), dhs, dh0s.reshape(batch, pieces, heads, dk, dv)[:, 0]


def _backward_call(qg, kg, w, mq, e_all, do, dvn_in, dht, *, scale, pieces, alias_staging,
                   interpret, store=True, dvn_heads_first=False):
    """One launch of the reverse state pass (:func:`_bwd_kernel`) over ``R = B * P`` rows of
    ``Tq`` tokens (the pieces as rows; ``P = 1``: the rows as they are): ``qg, kg, w``
    ``[R, Tq, H, K]``, ``do`` and ``dvn_in`` (or ``None``) ``[R, Tq, H, V]``; ``mq``, ``e_all``
    (fp32) whole rows; ``dht`` ``[R, H, K, V]`` fp32 or ``None``. Returns ``(dvn, dhs, dh0)``
    (``dvn`` ``[R, Tq, H, V]``, ``dhs`` ``[B, H, N, K, V]`` at global chunk indices, ``dh0``
    ``[R, H, K, V]`` fp32), or ``(dh0,)`` without ``store`` (named ``..._pieces``);
    ``dvn_heads_first``: ``dvn`` ``[B, H, P * Tq, V]`` (whole rows)."""
    rows, tq, heads, dk = qg.shape
    dv = do.shape[-1]
    num_chunks = tq // CHUNK
    has_dvn_in, has_dht = dvn_in is not None, dht is not None
    kernel = functools.partial(_bwd_kernel, num_chunks=num_chunks, scale=scale,
                               has_dvn_in=has_dvn_in, has_dht=has_dht, alias=alias_staging,
                               interpret=interpret, pieces=pieces, store=store,
                               dvn_heads_first=dvn_heads_first)
    dtype = qg.dtype
    dvn_shape = ((rows // pieces, heads, pieces * tq, dv) if dvn_heads_first
                 else (rows, tq, heads, dv))
    out_type = [jax.ShapeDtypeStruct(dvn_shape, dtype),  # dvn
                jax.ShapeDtypeStruct((rows // pieces, heads, pieces * num_chunks, dk, dv),
                                     dtype)] if store else []  # dhs
    out_type.append(jax.ShapeDtypeStruct((rows, heads, dk, dv), jnp.float32))  # dh0
    # qg_s, kg_s, w_s, do_s, mq_s, e_s[, din_s]; sb_s (dS in 16 bits, published,
    # double-buffered; the dhs staging) and state_s (staging of dht and dh0).
    shapes = ((CHUNK, dk),) * 3 + ((CHUNK, BLOCK_V), (CHUNK, CHUNK))
    scratch = _ring_scratch(shapes, dtype, dk)
    if has_dvn_in:
        scratch.append(mgl.swizzled_smem((STAGES, CHUNK, BLOCK_V), dtype))  # din_s
    scratch += _staging_scratch(dk, dtype, alias_staging, interpret)
    copies = _BWD_COPIES + int(has_dvn_in)
    scratch += [
        mgl.swizzled_smem((2, CHUNK, BLOCK_V), dtype),  # vn_s: dVn, published (two)
        plgpu.Barrier(num_arrivals=copies, num_barriers=STAGES),  # in_bar: copies landed
        plgpu.Barrier(num_arrivals=2, num_barriers=STAGES),  # in_free: both consumers done
        plgpu.Barrier(num_arrivals=1, num_barriers=2),  # s_ready: dS published
        plgpu.Barrier(num_arrivals=1, num_barriers=2),  # v_ready: dVn published (dS read)
        plgpu.Barrier(num_arrivals=1),  # io_bar: dht landed
        plgpu.Barrier(num_arrivals=3),  # done: all warpgroups finished
    ]
    if interpret:  # the SMEM copies of what the GPU reads as transposed views
        scratch += [plgpu.SMEM((dk, CHUNK), dtype), plgpu.SMEM((dk, CHUNK), dtype),  # Qg^T, W^T
                    plgpu.SMEM((CHUNK, CHUNK), dtype)]  # Mq^T
    name = BWD_KERNEL_NAME + ("" if store else "_pieces")
    call = _launch(kernel, out_type, scratch, (rows, heads, dv // BLOCK_V), name, interpret)
    extra = () if dvn_in is None else (dvn_in,)
    extra += () if dht is None else (dht,)
    return tuple(call(qg, kg, w, mq, e_all, do, *extra))
