"""K1 and K2: the per-channel family's chunk gradients on Mosaic GPU (Hopper ``wgmma``/TMA).

**Status: right on the GPU since 2026-12-07c; K2 is the default.** Compiled on an H100
(2026-12-06f) both gave wrong ``dq``, ``dk``, ``dg`` and ``dbeta`` while every interpreted test
passed (``MOSAIC_GPU.md`` Sec. 41; located with ``benchmarks/diag_grad.py``, Sec. 43: a
32-bit shifted SMEM load and a column-sum race). With Sec. 43's fixes their ``gpu`` tests pass
on an H100, and ``TUNING["grad_pass"]`` is ``"mosaic_fused"`` (K2; Sec. 46).

:func:`channelwise_grad_intra_mosaic` is a drop-in for the Triton ``grad_blocks`` kernel of
:mod:`pallas_kernels.common.channelwise_gpu` (``_grad_blocks_kernel`` / ``_grad_blocks``; issue
29, ``pallas_kernels/common/MOSAIC_GPU.md`` Sec. 19.4 and 20): the share of ``dq``, ``dkr`` and
``dk`` that flows through the decayed intra-chunk products ``Mq`` and ``Mk`` of KDA and Gated
DeltaNet-2 (paper arXiv 2607.07953, Eqs. 18-24; the chunk form in ``channelwise_gpu``'s module
docstring). Per chunk of C = 64 tokens, with ``gamma [C, K]`` the fp32 within-chunk cumsum of
the log-decay (non-increasing, since ``g <= 0``), ``e_ijc = exp(gamma_ic - gamma_jc)`` and
``dR = A^T dVn`` (``channelwise_gpu._chunk_dr``)::

    dMq = scale mask_incl(dO Vn^T);  dMk = -mask_strict(dR Vn^T)     (same document only)
    dq_ic  = sum_j dMq_ij k_jc e_ijc;   dkr_ic = sum_j dMk_ij k_jc e_ijc
    dk_jc  = sum_i (dMq_ij q_ic + dMk_ij kr_ic) e_ijc

Every pair ``j <= i`` takes exactly one of three routes (Sec. 19.4.2; the float64 model of this
split is ``tests/pallas_kernels/channelwise_grad_split_test.py``):

* **band**, ``i - j <= 7`` (across 16-row block edges too): exact in fp32, from the
  coefficients ``c_d[i] = dM[i, i - d]`` (d = 0..7) and ``exp(gamma_i - gamma_{i-d})`` of
  row-shifted loads of ``k``, ``gamma`` and the left factor from padded SMEM buffers;
* **past**, the 16-row blocks ``I > J`` and ``i - j >= 8``: through ``r_J``, gamma at the last
  row of block J, as ``grad_blocks``: the row direction is
  ``e^{gamma_i - r_J} (dM[:, J] @ (k_J e^{r_J - gamma_J}))``, one ``wgmma`` ``[64, 16] @
  [16, 32]`` per column block J = 0..2 with the row factor's exponent masked to ``-inf`` on the
  rows of blocks ``<= J``; the column direction ``e^{r_J - gamma_j} (dM^T @ (X e^{gamma -
  r_J}))`` ``[64, 64]^T @ [64, 32]``, keeping block J's rows;
* **quadrant**, one block, ``i`` in its second half and ``j`` in its first, ``i - j >= 8``:
  through ``m_J``, gamma at row 7 of the block, one ``[64, 64] @ [64, 32]`` product per
  direction on a quadrant-only copy of ``dM``.

The tensor cores read 16-bit copies of ``dM`` with the band zeroed (a band-free copy and a
quadrant-only copy), so each pair is counted once. Every exponent is a difference of two
fp32 gamma values and never positive; document masks are applied to ``dM`` in fp32 before any
rounding and before the band coefficients are taken.

Kernel: grid ``(N * K / 64, H, B)`` (chunks first, against CUDA's 65535 cap on grid y/z): one
chunk and one 64-channel key half per CTA (K = 128 has two halves, whose ``dO, Vn, dR`` reads
are adjacent). Two warpgroups run one copy of the code with the warpgroup index ``w`` traced
(jla's ``bwd_intra`` found a copy per warpgroup 1.5x slower, instruction cache). Warpgroup 0
issues the TMA copies at entry on two barriers in the order of use (``dO, dR, Vn`` and the
document vector; then ``q, k, kr, gamma`` of the half and the block marks: gamma at rows 7,
15, .., 63, from a ``[B, T / 8, 8, H, K]`` view of gamma into an untiled buffer, since one row
of a tiled SMEM tile cannot be indexed in the lowering).

* Phase 1: warpgroup ``w`` forms ``dMq`` (w = 0) or ``dMk`` (w = 1): one ``wgmma`` ``[64, V] @
  Vn^T`` (a transposed SMEM view), the sign / scale, the causal (inclusive / strict) and
  same-document masks in fp32, then the band-free and the quadrant-only 16-bit copies and the
  fp32 band coefficients (row direction ``c_d[i]``, column direction ``c_d[j + d]`` by a
  shifted load). A CTA barrier ends the phase.
* Phase 2: warpgroup ``w`` owns 32 channels of the half, as one slab (``slab=32``, the
  default here and ``channelwise_gpu.TUNING``'s since 2026-12-07c) or two (``slab=16``: fewer
  live registers; ptxas spills at 32 and not at 16, MOSAIC_GPU.md Sec. 23-24, yet 32 ran 5-10 %
  faster on an H100, Sec. 46). It forms
  each slab's shared operands once (``k e^{r - gamma}`` per block, ``k e^{m - gamma}`` on
  first-half rows, the padded shift buffers of ``k`` and ``gamma``) and runs both matrices on
  it; each direction issues its four products before one wait. The band takes 7 shifted
  steps.
* ``dq``, ``dkr`` and ``dk`` of the slab go out as fp32 ``[64, slab]`` tiles straight from the
  registers.

Roundings: ``dO, dR, Vn, q, k, kr`` are the 16-bit inputs (K2 reads ``k`` and forms ``kr =
k ks`` in registers instead, the fp32 product rounded once to the operand dtype as the forward
forms it: the same 16-bit values); ``dM`` is fp32 (``wgmma``
accumulation), rounded to the operand dtype only for the tensor-core routes, whose decayed
right operands are rounded too (pairs at least 8 apart, weight at most ``e^{8 g}`` of the
band's); the band and all accumulation are fp32. The Triton kernel runs every route in TF32
instead, so the two agree to the bf16 rounding of the far pairs, not bit for bit.

SMEM (Mosaic GPU's count of the CUDA export, jax 0.10.2; K does not change it, a CTA holds one
64-channel half): 203,808 bytes at V = 128 and 187,424 at V = 64 with ``slab=32``, 175,136 at
V = 128 with ``slab=16``, of the 232,448 a block may have; pinned by
``tests/pallas_kernels/kernel_mosaic_channelwise_grad_test.py``, MOSAIC_GPU.md Sec. 20. The
``y`` tiles of phase 2 share a ``plgpu.RefUnion`` with ``dO, dR, Vn`` (dead after phase 1).

**K2**, :func:`channelwise_grad_chunk_mosaic` (``grad_pass="mosaic_fused"``; MOSAIC_GPU.md Sec.
19.4.4 and 21): the same kernel with an epilogue that does the Triton ``backward_chunk``
kernel's work and the XLA chain rule through ``kr = k ks`` on K1's fp32 partials while they are
still in registers. K2 takes no ``kr`` (MOSAIC_GPU.md Sec. 44.2): it copies ``ks`` (per token,
``[64]`` fp32, or the half's channels) with ``q, k, gamma`` and forms ``kr = round(k ks)``
(fp32 product, one rounding to the operand dtype) in registers wherever K1 loads ``kr`` (the
``dMk`` pass's operand, the band's ``d = 0`` term, the epilogue's ``dgam``), each time from
fresh SMEM loads of ``k`` and ``ks`` (:func:`_kr_tile`); so no ``kr`` buffer (8 KB less SMEM)
and no ``kr`` read from HBM. ``slab=32``: each warpgroup holds its 32 channels' partials.
``slab=16`` (``TUNING``'s default until 2026-12-07c; the layout ptxas compiles without spills,
MOSAIC_GPU.md Sec. 24): phase 2 is a loop over the two slabs, as K1's; the first slab's
partials wait in an fp32 SMEM buffer (``park``, 24 KB), the last slab's come out of the loop in
registers, and the epilogue runs per slab (the last first), with the band's ``d = 0`` term
reading ``k`` and ``a`` again from SMEM. After phase 2 a CTA barrier; warpgroup 0 copies ``dO,
dR, Vn`` again (their SMEM held the ``y`` tiles) and the half's rows of ``S_0`` and ``dS_C``
(``hs``, ``dhs``; where the ``dM`` copies were, a second RefUnion). Each of these groups starts
1 KB past the buffers it aliases, so no ``wgmma`` descriptor or address of phase 1 or 2 equals
one of the epilogue (LLVM would otherwise keep them live across phase 2: spills). Per warpgroup
and slab, four ``wgmma`` ``[64, V] @ [V, slab]``: ``dO S_0^T``, ``dR S_0^T``, ``Vn dS_C^T`` and
``dS_C S_0^T``, whose diagonal is ``de_all = rowsum(S_0 * dS_C)`` (exact products, fp32 sums,
as ``backward_chunk``'s fp32 row sum). Then ``backward_chunk``'s elementwise formulas in its
order (``E_in``, ``E_out``, ``e_all`` with the document masks ``conn``, ``last``), and ``dg``,
the within-chunk reverse cumsum of ``backward_chunk``'s ``dgam``, on the tensor cores: ``dg = U
@ dgam' + L @ s - s`` with ``U_ij = [j >= i]``, ``L = U^T`` (exact in bf16; ``L`` a transposed
view of ``U``'s SMEM), ``x_de`` the ``de_all e_all conn_last`` terms left on the diagonal rows
of ``dS_C S_0^T``, ``s = k dk_S + x_de`` and ``dgam' = dgam + k dk_S + x_de`` without its
last-row terms (row ``i`` gets ``sum_{j >= i} dgam_j`` plus the last-row ``colsum(k dk_S) +
de_all e_all``, which needs non-decreasing document ids: ``conn_r last_r = conn_last``): so no
column sum runs over the rows (a cross-warp reduction, whose Mosaic GPU scratch both warpgroups
would share; MOSAIC_GPU.md Sec. 43). Each product runs on three bf16 pieces that sum to its
operand exactly (:func:`_split3`), so every product term is exact and only the fp32
accumulation rounds (the pieces and ``U`` share SMEM with the band's shift buffers, a third
RefUnion; ``U`` is a TMA copy of a constant made in the wrapper, so no index tile of phase 1
stays live for it). The chain rule keeps the Triton path's roundings: ``dkr`` and ``dk``
rounded to the operand dtype, then ``dk + ks dkr`` in fp32, rounded once; ``dks = k dkr`` in
fp32, per channel (GDN-2's ``[B, T, H, K]`` scale) or summed per token over each slab's
channels (KDA's ``[B, T, H, 1]`` beta; the ``K / slab`` partials per token are summed in XLA).
``dkr`` is never written. SMEM at K = V = 128: 200,760 bytes (``slab=32``) and 196,664
(``slab=16``) with a per-token ``ks``; 216,120 and 212,024 with an fp32 per-channel ``ks``
(8,192 each below the counts with a ``kr`` buffer); pinned by
``kernel_mosaic_channelwise_grad_chunk_test.py`` (in ``tests/pallas_kernels``).

Two options of K2 serve ``channelwise_gpu``'s backward (MOSAIC_GPU.md Secs. 47.2, 47.5; both
without SMEM of their own, the counts above unchanged): ``dr_heads_first`` reads ``dR`` as
``[B, H, T, V]``, the layout XLA's per-chunk product ``A^T dVn`` comes out in, and stores the
epilogue's SMEM copy back as ``dvw`` ``[B, T, H, V]`` (one TMA store per chunk, by key half 0),
so XLA never transposes the product; ``g`` (the log-decay before ``LOG_DECAY_FLOOR``) makes the
epilogue read each ``[64, slab]`` tile of ``g`` from GMEM and return ``dg`` through the floor
(``jax.grad`` of ``validation.floor_log_decay``'s values), so no XLA pass over ``g`` and ``dg``
follows the kernel.

CPU testing as the other Mosaic GPU kernels (MOSAIC_GPU.md Sec. 1): GPU interpret mode with
the shims of ``mosaic_gpu_lib`` (transposed operands copied into SMEM, plain loads; no
``RefUnion`` there) and lowering for CUDA through ``jax.export``. fp32 inputs are refused
(``wgmma`` has no IEEE fp32 product); ``channelwise_gpu`` keeps ``grad_blocks`` for them.
"""

import functools
from typing import Optional, Tuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.common import mosaic_gpu_lib as mgl
from pallas_kernels.common import validation

CHUNK = mgl.CHUNK
SUB = 16  # rows per block of the past route (the reference r_J is gamma at its last row)
HALF = SUB // 2  # band width: pairs at most HALF - 1 apart are exact; also the mid row m_J
NSUB = CHUNK // SUB
KEY_HALF = 64  # key channels per CTA
WG_KEYS = KEY_HALF // 2  # key channels per warpgroup
SLAB = WG_KEYS  # key channels per phase-2 step (the default; 16: two steps per warpgroup)
SLABS = (16, 32)
PAD_COLS = 8  # extra columns of the unswizzled shift buffers (against bank conflicts)
KERNEL_NAME = "channelwise_grad_intra_mosaic"
K2_KERNEL_NAME = "channelwise_grad_chunk_mosaic"
F32 = jnp.float32
# Timing ablations (``ablations``, MOSAIC_GPU.md Sec. 22): static, benchmark-only switches that
# cut one cost centre out of the kernel and so compute wrong numbers by design; only
# ``benchmarks/profile_grad.py`` passes them (never the op or TUNING). Each keeps the grid, the
# warpgroups, the SMEM buffers, the TMA copies and barriers of the stages it does not name.
K1_ABLATIONS = (
    "no_band",  # phase 2: skip the band's 7 shifted fp32 steps (d = 0 is kept)
    "no_mma",  # phase 2: skip the 2 x 2 wgmma groups (operand stores kept; the loaded k / a
    # stand in for the products)
    "no_factors",  # phase 2: unit decay factors (no exp, no per-block selects; band unmasked)
    "no_store",  # the GMEM stores replaced by one fp32 SMEM store of the outputs' sum
)
# Diagnostic taps (``ablations`` of K1 only; MOSAIC_GPU.md Sec. 41): phase 2 writes what it
# read or formed into K1's three outputs instead of the gradients and skips both matrix passes
# (only ``benchmarks/diag_grad.py`` passes them; it compares them with NumPy on the GPU).
K1_TAPS = (
    "tap_inputs",  # (k, gamma, r_J): the tiles as loaded, gamma at the end of each row's block
    "tap_factors",  # (e^{r_J - gamma}, the mid factor, sum_J of the masked e^{gamma - r_J})
    "tap_band",  # sums over d = 1..7 of the shifted k, of the masked band factor and of the
    # dMq band coefficients (row minus column)
    "tap_dm",  # phase 1's 16-bit copies as phase 2 reads them: columns [first, first + slab)
    # of the band-free dMq, the quadrant-only dMq and the band-free dMk
)
K2_ABLATIONS = K1_ABLATIONS + (
    "no_state",  # epilogue: skip the second TMA copies and the 4 state products (K1's
    # partials stand in for them; the elementwise formulas run)
    "no_cumsum",  # epilogue: skip the two splits and the 6 U / L products (dg = dgam', not
    # backward_chunk's dgam; timings of it before 2026-12-07 had 3 products)
)
_WGMMA = plgpu.Layout.WGMMA
_ROWS = plgpu.Layout.WGMMA.reduce(1)
_COLS = plgpu.Layout.WGMMA.reduce(0)


def _load(ref, layout, interpret: bool):
    """``ref`` (SMEM) in ``layout``, unoptimized (shifted, unswizzled views); plain when
    interpreting."""
    if interpret:
        return ref[...]
    if mgl._LOAD_NEEDS_IDX:
        return plgpu.load(ref, (), layout=layout, optimized=False)
    return plgpu.load(ref, layout=layout, optimized=False)


def _load_padded(ref, width, interpret: bool):
    """``ref[:, :width]`` of a ``[64, slab + PAD_COLS]`` view of a padded shift buffer in
    the WGMMA layout (unoptimized). The whole rows are loaded and the pad columns dropped in
    registers (their loads are dead code): jax 0.11's layout inference checks an untiled
    ``[64, w]`` view as one ``[64, w]`` tile, which needs the row stride to be a multiple of
    ``w`` (``Stride 24 is not divisible by 16``), and ``slab + PAD_COLS`` is one of itself."""
    return lax.slice(_load(ref, _WGMMA, interpret), (0, 0), (CHUNK, width))


def _store_padded(ref, x):
    """``ref[:, :n] = x`` for ``x`` ``[64, n]`` (WGMMA layout) into a view of a padded shift
    buffer (row stride ``slab + PAD_COLS``), as ``n / PAD_COLS`` column pieces: each piece's
    width divides the row stride (see :func:`_load_padded`); the same stores as one."""
    for c in range(0, x.shape[1], PAD_COLS):
        ref.at[:, pl.ds(c, PAD_COLS)][...] = lax.slice(x, (0, c), (CHUNK, c + PAD_COLS))


def _split_bits(x):
    """fp32 ``x`` as its two 16-bit halves ``(hi, lo)``, each in a bf16 container (bit moves,
    no rounding): :func:`_join_bits` gives ``x`` back exactly, NaN and denormal patterns
    included. The band's gamma shift buffer holds these halves: on the H100 (jax 0.11.2) the
    fp32 shift buffer read back wrong (its stores or its shifted loads: not isolated) while the
    16-bit one of ``k``, through the same code at the same offsets, was exact (MOSAIC_GPU.md
    Sec. 43)."""
    u = lax.bitcast_convert_type(x, jnp.uint32)
    hi = lax.bitcast_convert_type((u >> 16).astype(jnp.uint16), BF16)
    lo = lax.bitcast_convert_type((u & 0xFFFF).astype(jnp.uint16), BF16)
    return hi, lo


def _join_bits(hi, lo):
    """The fp32 value of :func:`_split_bits`'s halves (exact)."""
    u_hi = lax.bitcast_convert_type(hi, jnp.uint16).astype(jnp.uint32)
    u_lo = lax.bitcast_convert_type(lo, jnp.uint16).astype(jnp.uint32)
    return lax.bitcast_convert_type((u_hi << 16) | u_lo, F32)


def _store_gamma(gpad, g):
    """gamma ``[64, slab]`` fp32 into rows ``[HALF, HALF + 64)`` of ``gpad`` ``[2, rows,
    pitch]`` (its two 16-bit halves, :func:`_split_bits`)."""
    for part, bits in enumerate(_split_bits(g)):
        _store_padded(gpad.at[part, pl.ds(HALF, CHUNK)], bits)


def _load_gamma(gpad, start, slab, interpret: bool):
    """gamma's rows ``[start, start + 64)`` of ``gpad`` (traced ``start``), fp32 ``[64,
    slab]``: the two 16-bit halves loaded as ``k``'s shifted rows are and joined."""
    return _join_bits(*(_load_padded(gpad.at[part, pl.ds(start, CHUNK)], slab, interpret)
                        for part in range(2)))


def _tile16(shape, dtype):
    """16-bit SMEM in ``[8, 16]`` tiles, 32-byte swizzle: every 16-row or 16-column slice is a
    valid ``wgmma`` operand (all phase-2 operands use it)."""
    return plgpu.SMEM(shape, dtype, transforms=(plgpu.TilingTransform((8, 16)),
                                                plgpu.SwizzleTransform(32)))


def _slab_smem(shape, dtype, slab):
    """SMEM in ``[8, slab]`` tiles, so each phase-2 slab of ``slab`` channels is tile aligned."""
    swizzle = slab * jnp.dtype(dtype).itemsize
    return plgpu.SMEM(shape, dtype, transforms=(plgpu.TilingTransform((8, slab)),
                                                plgpu.SwizzleTransform(swizzle)))


def _masked_exp(x, mask):
    """``exp(x)`` where ``mask``, exactly 0 elsewhere (the exponent is masked first)."""
    return jnp.exp(jnp.where(mask, x, -jnp.inf))


def _cols(x, shape):
    return lax.broadcast_in_dim(x, shape, [1])


def _per_block(blocks, values, shape):
    """Row ``i`` takes ``values[blocks[i]]`` (per-column vectors)."""
    out = _cols(values[-1], shape)
    for blk in reversed(range(len(values) - 1)):
        out = jnp.where(blocks == blk, _cols(values[blk], shape), out)
    return out


def _products(shape, pairs):
    """``[a @ b for a, b in pairs]``: every ``wgmma`` issued before one wait (fp32)."""

    def scoped(*accs):
        for acc, (a, b) in zip(accs, pairs, strict=True):
            plgpu.wgmma(acc, a, b)
        return [acc[...] for acc in accs]

    # The barrier keeps the arithmetic after the accumulator reads (MOSAIC_GPU.md Sec. 2).
    return lax.optimization_barrier(
        pl.run_scoped(scoped, *(plgpu.ACC(shape, F32) for _ in pairs)))


def _ks_tile(sc, cols, shape, ks_channels: bool, interpret: bool):
    """K2's kr scale for channels ``cols`` of the half, fp32 ``shape`` = ``[64, slab]`` in the
    WGMMA layout: the per-token ``[64]`` ``ks`` broadcast along the rows, or the per-channel
    ``ks`` tile (any of bf16, fp16, fp32 in SMEM; exact in fp32)."""
    if ks_channels:
        return _load(sc["ks"].at[:, cols], _WGMMA, interpret).astype(F32)
    return mgl.by_row(mgl.load_rows(sc["ks"], interpret), shape)


def _kr_tile(sc, cols, shape, ks_channels: bool, interpret: bool):
    """K2's read key ``kr = k ks`` for channels ``cols`` of the half, fp32 ``[64, slab]``
    (WGMMA layout), formed from fresh SMEM loads of the 16-bit ``k`` and of ``ks``: the fp32
    product rounded once to ``k``'s dtype, as the forward (and XLA's ``kr`` of the Triton path)
    forms it, so the same bits; then widened to fp32 for the products. Loaded anew at each
    use rather than kept live (register pressure, see ``matrix_pass``)."""
    kf = _load(sc["k"].at[:, cols], _WGMMA, interpret).astype(F32)
    ksf = _ks_tile(sc, cols, shape, ks_channels, interpret)
    return (kf * ksf).astype(sc["k"].dtype).astype(F32)


def _bind(names, refs, out):
    """``out[name] = ref`` along ``names``, a tree of strings whose tuples match how the refs
    arrive (a ``plgpu.RefUnion`` unpacks into its member trees)."""
    for name, ref in zip(names, refs, strict=True):
        if isinstance(name, tuple):
            _bind(name, ref, out)
        else:
            out[name] = ref


def _kernel(q_ref, k_ref, kr_ref, g_ref, g8_ref, do_ref, vn_ref, dr_ref, *rest, halves: int,
            scale: float, has_docs: bool, slab: int, interpret: bool, names: Tuple[str, ...],
            fused: bool = False, ks_channels: bool = False, dr_heads_first: bool = False,
            floor_g: bool = False, ablations: frozenset = frozenset()):
    """Kernel body of :func:`channelwise_grad_intra_mosaic` (K1) and, with ``fused``, of
    :func:`channelwise_grad_chunk_mosaic` (K2; module docstring); refs are GMEM.

    ``g8_ref`` is gamma viewed as ``[B, T / 8, 8, H, K]`` (row 7 of each 8 rows: the block
    marks). ``kr_ref`` is ``None`` for K2 (:func:`_kernel_k2`), which forms ``kr = k ks`` in
    registers from the SMEM ``k`` and ``ks`` (:func:`_kr_tile`) and has no ``kr`` buffer. K1:
    ``rest`` = ``[doc_ref,] dq_ref, dk_ref, dkr_ref`` then the scratch. K2:
    ``hs_ref, dhs_ref, ks_ref, u_ref, [g_ref,] [doc_ref, conn_ref, last_ref,] dq_ref, dk_ref,
    dks_ref, dg_ref[, dvw_ref]`` then the scratch (``u_ref``: the cumsum's ``U``; ``dvw_ref`` with
    ``dr_heads_first``). ``names`` names the scratch refs (a tree: one tuple per RefUnion).
    ``dr_heads_first`` (K2 only): ``dr_ref`` is ``[B, H, T, V]`` (the layout of XLA's per-chunk
    product ``A^T dVn``, no transpose) and the kernel writes it back as ``dvw`` ``[B, T, H,
    V]`` (a TMA store from the epilogue's SMEM copy, by key half 0). ``floor_g`` (K2 only):
    ``g_ref``, the unfloored log-decay ``[B, T, H, K]`` fp32, is read (from GMEM, in the
    epilogue) and ``dg`` taken through ``max(g, LOG_DECAY_FLOOR)`` before it is stored.
    ``ablations``: the timing ablations (:data:`K1_ABLATIONS`, :data:`K2_ABLATIONS`; empty for
    the real kernel, whose code is then unchanged by them).
    """
    rest = list(rest)
    hs_ref = dhs_ref = ks_ref = u_ref = conn_ref = last_ref = graw_ref = None
    if fused:
        hs_ref, dhs_ref, ks_ref, u_ref = rest[:4]
        rest = rest[4:]
        if floor_g:
            graw_ref = rest.pop(0)
    doc_ref = rest.pop(0) if has_docs else None
    if fused and has_docs:
        conn_ref, last_ref = rest[:2]
        rest = rest[2:]
    n_out = (5 if dr_heads_first else 4) if fused else 3
    out_refs, rest = rest[:n_out], rest[n_out:]
    sc = {}
    _bind(names, rest, sc)
    if fused:
        dq_ref, dk_ref, dks_ref, dg_ref = out_refs[:4]
        dvw_ref = out_refs[4] if dr_heads_first else None
        dkr_ref = None
    else:
        dq_ref, dk_ref, dkr_ref = out_refs
        dvw_ref = None
    lhs_s, vn_s, y_s = sc["lhs"], sc["vn"], sc["y"]
    sc.setdefault("kr", None)  # K2 has no kr buffer
    (q_s, k_s, kr_s, g_s, marks_s, doc_s, free_s, quad_s, coef_s, x_s, x2_s, kpad_s, gpad_s,
     apad_s, in_bar, qk_bar, sync, done) = (sc[n] for n in _K1_NAMES)
    vnt_s, mt_s = (sc["vnt"], sc["mt"]) if interpret else (None, None)
    dtype = k_s.dtype
    wg = lax.axis_index("wg")
    cell, h, b = lax.axis_index("n"), lax.axis_index("h"), lax.axis_index("b")
    n, half = lax.div(cell, halves), lax.rem(cell, halves)
    tok = pl.ds(n * CHUNK, CHUNK)
    keys = pl.ds(half * KEY_HALF, KEY_HALF)
    dr_rows = dr_ref.at[b, h, tok] if dr_heads_first else dr_ref.at[b, tok, h]

    @pl.when(wg == 0)
    def _copies():  # in the order of use
        plgpu.copy_gmem_to_smem(do_ref.at[b, tok, h], lhs_s.at[0], in_bar)
        plgpu.copy_gmem_to_smem(dr_rows, lhs_s.at[1], in_bar)
        plgpu.copy_gmem_to_smem(vn_ref.at[b, tok, h], vn_s, in_bar)
        if has_docs:
            plgpu.copy_gmem_to_smem(doc_ref.at[b, tok], doc_s, in_bar)
        pairs = ((q_ref, q_s), (k_ref, k_s), (kr_ref, kr_s), (g_ref, g_s))
        for src, dst in pairs if not fused else pairs[:2] + pairs[3:]:  # K2: no kr copy
            plgpu.copy_gmem_to_smem(src.at[b, tok, h, keys], dst, qk_bar)
        # gamma at rows 7, 15, .., 63: the mid (even) and end (odd) rows of the 16-row blocks.
        marks = pl.ds(n * (CHUNK // HALF), CHUNK // HALF)
        plgpu.copy_gmem_to_smem(g8_ref.at[b, marks, HALF - 1, h, keys], marks_s, qk_bar)
        if fused:  # K2: the kr scale and the document masks of the decay factors
            if ks_channels:
                plgpu.copy_gmem_to_smem(ks_ref.at[b, tok, h, keys], sc["ks"], qk_bar)
            else:
                plgpu.copy_gmem_to_smem(ks_ref.at[b, h, tok], sc["ks"], qk_bar)
            if has_docs:
                plgpu.copy_gmem_to_smem(conn_ref.at[b, tok], sc["conn"], qk_bar)
                plgpu.copy_gmem_to_smem(last_ref.at[b, tok], sc["last"], qk_bar)

    # Phase 1: warpgroup w forms dMq (w = 0) or dMk (w = 1) and its three copies.
    full = (CHUNK, CHUNK)
    plgpu.barrier_wait(in_bar)
    vn_t = mgl.transposed(vn_s, vnt_s.at[wg] if interpret else None, interpret)
    (m,) = _products(full, [(lhs_s.at[wg], vn_t)])  # dO Vn^T or dR Vn^T, fp32
    m = m * jnp.where(wg == 0, F32(scale), F32(-1.0))
    i, j = mgl.iota(full, 0, interpret), mgl.iota(full, 1, interpret)
    keep = i - j >= wg  # j <= i for dMq, j < i for dMk
    if has_docs:
        doc_i = mgl.by_row(mgl.load_rows(doc_s, interpret), full)
        # The columns' load reads a (whole) subview, not ``doc_s`` itself: jax 0.11 merges two
        # loads of one ref into one ``vector_load`` with two ``layout_cast``s, and no layout
        # relays to both rows and columns (the search runs out of fuel; MOSAIC_GPU.md
        # Sec. 24.2).
        doc_j = _cols(mgl.load_cols(doc_s.at[pl.ds(0, CHUNK)], interpret), full)
        keep = keep & (doc_i == doc_j)
    m = jnp.where(keep, m, 0.0)  # masks in fp32, before any rounding
    band = i - j < HALF
    # Outside the band as a comparison, not ``~band``: jax 0.11's Mosaic GPU lowers
    # ``logical_not`` through an i32 -> i1 ``trunci`` that the WGMMA layout cannot take
    # (``Register bitwidth ... divisible by 8, got 2``; MOSAIC_GPU.md Sec. 24.2).
    quad = (((i // SUB) == (j // SUB)) & (i % SUB >= HALF) & (j % SUB < HALF)
            & (i - j >= HALF))
    free_s.at[wg][...] = jnp.where(band, 0.0, m).astype(dtype)
    quad_s.at[wg][...] = jnp.where(quad, m, 0.0).astype(dtype)
    for d in range(HALF):  # row direction: c_d[i] = dM[i, i - d]
        coef_s.at[wg, 0, d, pl.ds(0, CHUNK)][...] = jnp.sum(jnp.where(j == i - d, m, 0.0),
                                                            axis=1)
    plgpu.commit_smem()
    for d in range(HALF):  # column direction: dM[j + d, j] = c_d[j + d] (past the chunk: unused)
        coef_s.at[wg, 1, d, pl.ds(0, CHUNK)][...] = _load(coef_s.at[wg, 0, d, pl.ds(d, CHUNK)],
                                                          _ROWS, interpret)
    plgpu.commit_smem()
    plgpu.barrier_arrive(sync)
    plgpu.barrier_wait(sync)  # both matrices staged; dO, dR, Vn are dead from here

    # Phase 2: warpgroup w takes channels [32 w, 32 w + 32) of the half in slabs of ``slab``
    # channels, both matrices on each.
    shape = (CHUNK, slab)
    rows = mgl.iota(shape, 0, interpret)
    blocks = rows // SUB
    second = rows % SUB >= HALF
    blk_sl = [pl.ds(SUB * blk, SUB) for blk in range(NSUB - 1)]
    x_w, x2_w, y_w = x_s.at[wg], x2_s.at[wg], y_s.at[wg]
    kpad, gpad, apad = kpad_s.at[wg], gpad_s.at[wg], apad_s.at[wg]

    def slab_pass(first):
        """Channels ``[first, first + slab)`` of the half (this warpgroup's)."""
        cols = pl.ds(pl.multiple_of(first, slab), slab)
        g = _load(g_s.at[:, cols], _WGMMA, interpret)
        kf = _load(k_s.at[:, cols], _WGMMA, interpret).astype(F32)
        ends = [_load(marks_s.at[2 * blk + 1, cols], _COLS, interpret) for blk in range(NSUB)]
        mids = [_load(marks_s.at[2 * blk, cols], _COLS, interpret) for blk in range(NSUB)]
        if "no_factors" in ablations:  # timing ablation: unit factors (wrong numbers)
            to_end, past, halfway = 1.0, [1.0] * (NSUB - 1), 1.0
        else:
            to_end = jnp.exp(_per_block(blocks, ends, shape) - g)  # e^{r_J - gamma}, J's rows
            past = [_masked_exp(g - _cols(ends[blk], shape), blocks > blk)
                    for blk in range(NSUB - 1)]
            mid = _per_block(blocks, mids, shape)
            halfway = jnp.exp(jnp.where(second, g - mid, mid - g))  # both exponents <= 0
        taps = [t for t in K1_TAPS if t in ablations]
        if not taps:
            x_w[...] = (kf * to_end).astype(dtype)
            x2_w[...] = jnp.where(second, 0.0, kf * halfway).astype(dtype)
        _store_padded(kpad.at[pl.ds(HALF, CHUNK)], kf.astype(dtype))
        _store_gamma(gpad, g)
        if taps:  # diagnostic taps (MOSAIC_GPU.md Sec. 41): no gradients
            return _tap(taps[0], dq_ref, dk_ref, dkr_ref, out=pl.ds(half * KEY_HALF + first, slab),
                        tok=tok, h=h, b=b, kf=kf, g=g, ends=ends, to_end=to_end, past=past,
                        halfway=halfway, rows=rows, blocks=blocks, kpad=kpad, gpad=gpad,
                        coef_s=coef_s, free_s=free_s, quad_s=quad_s, first=first, slab=slab,
                        interpret=interpret)

        def matrix_pass(mat, a):
            """``(da, db)`` of matrix ``mat`` (0: dMq, a = q; 1: dMk, a = kr) on this slab."""
            for blk in range(NSUB - 1):
                y_w.at[blk][...] = (a * past[blk]).astype(dtype)
            y_w.at[NSUB - 1][...] = jnp.where(second, a * halfway, 0.0).astype(dtype)
            _store_padded(apad.at[pl.ds(0, CHUNK)], a.astype(dtype))
            plgpu.commit_smem()
            free, quad_m = free_s.at[mat], quad_s.at[mat]
            # K2: the band's d = 0 term reads k (and below a) again from SMEM, the same 16-bit
            # values, instead of keeping them live through the products: ptxas then fits K2 at
            # slab 16 without spills (MOSAIC_GPU.md Sec. 24; K1 is left as it was).
            kf_0 = _load(k_s.at[:, cols], _WGMMA, interpret).astype(F32) if fused else kf
            # Row direction: da_i = sum_J e^{gamma_i - r_J} (dM_iJ X_J), then the quadrants.
            if "no_mma" in ablations:  # timing ablation: no wgmma (k stands in, wrong)
                prods = [kf] * NSUB
            else:
                prods = _products(shape, [(free.at[:, blk_sl[blk]], x_w.at[blk_sl[blk]])
                                          for blk in range(NSUB - 1)] + [(quad_m, x2_w)])
            da = past[0] * prods[0]
            for blk in range(1, NSUB - 1):
                da = da + past[blk] * prods[blk]
            da = da + jnp.where(second, prods[-1] * halfway, 0.0)
            # Column direction: db_j = e^{r_J - gamma_j} sum_i dM_ij a_i e^{gamma_i - r_J}.
            free_t = mgl.transposed(free, mt_s.at[wg, 0] if interpret else None, interpret)
            quad_t = mgl.transposed(quad_m, mt_s.at[wg, 1] if interpret else None, interpret)
            if "no_mma" in ablations:  # timing ablation: no wgmma (a stands in, wrong)
                prods = [a] * NSUB
            else:
                prods = _products(shape, [(free_t, y_w.at[blk]) for blk in range(NSUB - 1)]
                                  + [(quad_t, y_w.at[NSUB - 1])])
            db = jnp.where(blocks == 0, prods[0], 0.0)
            for blk in range(1, NSUB - 1):
                db = db + jnp.where(blocks == blk, prods[blk], 0.0)
            db = db * to_end + jnp.where(second, 0.0, prods[-1] * halfway)
            # The band, exact in fp32: d = 0, then 7 row-shifted steps.
            c0 = mgl.by_row(_load(coef_s.at[mat, 0, 0, pl.ds(0, CHUNK)], _ROWS, interpret),
                            shape)
            da = da + c0 * kf_0
            if not fused:
                a_0 = a
            elif mat == 0:
                a_0 = _load(q_s.at[:, cols], _WGMMA, interpret).astype(F32)
            else:  # kr = k ks again from the SMEM k and ks (as the first time: bit-identical)
                a_0 = _kr_tile(sc, cols, shape, ks_channels, interpret)
            db = db + c0 * a_0

            def step(d, carry):
                da, db = carry
                back, fwd = rows >= d, rows + d < CHUNK
                k_prev = _load_padded(kpad.at[pl.ds(HALF - d, CHUNK)], slab, interpret)
                g_prev = _load_gamma(gpad, HALF - d, slab, interpret)
                g_next = _load_gamma(gpad, HALF + d, slab, interpret)
                a_next = _load_padded(apad.at[pl.ds(d, CHUNK)], slab, interpret)
                c_row, c_col = (mgl.by_row(_load(coef_s.at[mat, side, d, pl.ds(0, CHUNK)],
                                                 _ROWS, interpret), shape) for side in (0, 1))
                if "no_factors" in ablations:  # timing ablation: unit factors (wrong)
                    da = da + jnp.where(back, c_row * k_prev.astype(F32), 0.0)
                    db = db + jnp.where(fwd, c_col * a_next.astype(F32), 0.0)
                    return da, db
                # Shifted-out rows read the pads: masked after the product (no 0 * garbage).
                da = da + jnp.where(back, c_row * k_prev.astype(F32)
                                    * _masked_exp(g - g_prev, back), 0.0)
                db = db + jnp.where(fwd, c_col * a_next.astype(F32)
                                    * _masked_exp(g_next - g, fwd), 0.0)
                return da, db

            if "no_band" in ablations:  # timing ablation: d = 0 only (wrong numbers)
                return da, db
            return lax.fori_loop(1, HALF, step, (da, db))

        qf = _load(q_s.at[:, cols], _WGMMA, interpret).astype(F32)
        dq, dk_q = matrix_pass(0, qf)
        plgpu.commit_smem()  # the first pass's operand buffers may be overwritten
        if fused:  # K2: kr = k ks formed here, from the SMEM k and ks
            krf = _kr_tile(sc, cols, shape, ks_channels, interpret)
        else:
            krf = _load(kr_s.at[:, cols], _WGMMA, interpret).astype(F32)
        dkr, dk_k = matrix_pass(1, krf)
        if fused:  # K2: the partials stay in registers for the epilogue
            return dq, dkr, dk_q + dk_k
        if "no_store" in ablations:  # timing ablation: one SMEM store keeps the work alive
            _store_padded(sc["sink"].at[wg], dq + dkr + (dk_q + dk_k))
            return None
        out = pl.ds(half * KEY_HALF + first, slab)
        dq_ref.at[b, tok, h, out][...] = dq
        dkr_ref.at[b, tok, h, out][...] = dkr
        dk_ref.at[b, tok, h, out][...] = dk_q + dk_k

    plgpu.barrier_wait(qk_bar)
    if fused and slab == WG_KEYS:  # K2: the partials stay in registers for the epilogue
        partials = [slab_pass(wg * WG_KEYS)]
    elif fused:  # K2 with slabs: a loop as K1's; the last slab's partials come out in registers
        steps = WG_KEYS // slab

        def _slab_step(i, _):
            plgpu.commit_smem()  # the previous slab's operand buffers may be overwritten
            part = slab_pass(wg * WG_KEYS + i * slab)

            @pl.when(i < steps - 1)
            def _park():  # the others wait in SMEM (registers for the next slabs)
                for t, x in enumerate(part):
                    sc["park"].at[wg, 3 * i + t][...] = x

            return tuple(part)

        zero = jnp.zeros(shape, F32)
        if not interpret:
            zero = plgpu.layout_cast(zero, _WGMMA)
        last = lax.fori_loop(0, steps, _slab_step, (zero,) * 3)
        partials = [None] * (steps - 1) + [list(last)]
    if fused:
        _epilogue(sc, partials, hs_ref, dhs_ref, u_ref, do_ref, vn_ref, dr_rows, dq_ref, dk_ref,
                  dks_ref, dg_ref, dvw_ref, graw_ref, wg=wg, n=n, h=h, b=b, half=half, scale=scale,
                  slab=slab, has_docs=has_docs, ks_channels=ks_channels, interpret=interpret,
                  ablations=ablations)
    elif slab == WG_KEYS:  # K1
        slab_pass(wg * WG_KEYS)
    else:
        @pl.loop(0, WG_KEYS // slab)
        def _slabs(i):
            plgpu.commit_smem()  # the previous slab's operand buffers may be overwritten
            slab_pass(wg * WG_KEYS + i * slab)

    if dvw_ref is not None and "no_state" not in ablations:
        @pl.when((wg == 0) & (half == 0))
        def _dvw_stored():  # the thread that issued dvw's store (_epilogue_slab) waits for it
            plgpu.wait_smem_to_gmem(0)

    # Both warpgroups leave together (an early exit while another issues wgmma is unsafe).
    plgpu.barrier_arrive(done)
    plgpu.barrier_wait(done)


def _kernel_k2(q_ref, k_ref, g_ref, g8_ref, do_ref, vn_ref, dr_ref, *rest, **kwargs):
    """K2's kernel body: :func:`_kernel` with ``fused=True`` (in ``kwargs``) and no ``kr``
    input (``kr_ref=None``: the kernel forms ``kr = k ks`` itself)."""
    return _kernel(q_ref, k_ref, None, g_ref, g8_ref, do_ref, vn_ref, dr_ref, *rest, **kwargs)


def _tap(tap, dq_ref, dk_ref, dkr_ref, *, out, tok, h, b, kf, g, ends, to_end, past, halfway,
         rows, blocks, kpad, gpad, coef_s, free_s, quad_s, first, slab, interpret):
    """K1's diagnostic taps (:data:`K1_TAPS`): phase-2 values into the outputs' slab."""
    shape = (CHUNK, slab)
    if tap == "tap_dm":  # columns of the tiled 16-bit copies, loaded as phase 2's tiles are
        cols = pl.ds(pl.multiple_of(first, slab), slab)
        vals = tuple(_load(ref.at[:, cols], _WGMMA, interpret).astype(F32)
                     for ref in (free_s.at[0], quad_s.at[0], free_s.at[1]))
    elif tap == "tap_inputs":
        vals = (kf, g, _per_block(blocks, ends, shape))
    elif tap == "tap_factors":
        vals = (to_end, halfway, past[0] + past[1] + past[2])
    else:  # tap_band: the band's shifted loads, as its loop reads them (d traced)
        plgpu.commit_smem()  # the shift buffers' stores before the shifted loads

        def step(d, carry):
            ks, es, cs = carry
            back, fwd = rows >= d, rows + d < CHUNK
            k_prev = _load_padded(kpad.at[pl.ds(HALF - d, CHUNK)], slab, interpret)
            g_prev = _load_gamma(gpad, HALF - d, slab, interpret)
            c_row, c_col = (mgl.by_row(_load(coef_s.at[0, side, d, pl.ds(0, CHUNK)], _ROWS,
                                             interpret), shape) for side in (0, 1))
            ks = ks + jnp.where(back, k_prev.astype(F32), 0.0)
            es = es + _masked_exp(g - g_prev, back)
            cs = cs + jnp.where(back, c_row, 0.0) - jnp.where(fwd, c_col, 0.0)
            return ks, es, cs

        zero = jnp.zeros(shape, F32)
        if not interpret:
            zero = plgpu.layout_cast(zero, _WGMMA)
        vals = lax.fori_loop(1, HALF, step, (zero,) * 3)
    for ref, x in zip((dq_ref, dk_ref, dkr_ref), vals, strict=True):
        ref.at[b, tok, h, out][...] = x


_K1_NAMES = ("q", "k", "kr", "g", "marks", "doc", "free", "quad", "coef", "x", "x2", "kpad",
             "gpad", "apad", "in_bar", "qk_bar", "sync", "done")
BF16 = jnp.bfloat16


def _split3(x):
    """``x`` (fp32) as three bf16 pieces ``(hi, mid, lo)`` with ``hi + mid + lo == x`` exactly
    (8 significand bits each: 24 in all; bf16 has fp32's exponent range), as long as ``lo``
    is a normal number (``|x|`` above about 1e-33)."""
    hi = x.astype(BF16)
    r = x - hi.astype(F32)
    mid = r.astype(BF16)
    return hi, mid, (r - mid.astype(F32)).astype(BF16)


def _epilogue(sc, partials, hs_ref, dhs_ref, u_ref, do_ref, vn_ref, dr_rows, dq_ref, dk_ref,
              dks_ref, dg_ref, dvw_ref, graw_ref, *, wg, n, h, b, half, scale, slab, has_docs,
              ks_channels, interpret, ablations=frozenset()):
    """K2's epilogue for warpgroup ``wg``'s 32 channels (``backward_chunk`` + the kr chain).

    ``partials``: per slab of ``slab`` channels (one at 32, two at 16), ``(dq_M, dkr_M,
    dk_M)``, K1's fp32 results in registers. Equations: module docstring (K2). The phase-1
    inputs ``dO, dR, Vn`` are copied again (their SMEM held the y tiles) and ``S_0``, ``dS_C``
    of the half land where the dM copies were, so a CTA barrier first waits until both
    warpgroups have left phase 2. Then each slab runs :func:`_epilogue_slab`. ``ablations``:
    as :func:`_kernel`'s (``no_state``, ``no_cumsum``, ``no_store`` act here). ``dr_rows``:
    this chunk's ``[64, V]`` GMEM view of ``dR`` (either layout); ``dvw_ref``: ``None``, or
    the ``[B, T, H, V]`` output that key half 0 copies ``dR`` into from SMEM (with
    ``dr_heads_first``); ``graw_ref``: ``None`` or the unfloored ``g`` (``floor_g``).
    """
    lhs_s, vn_s, s0_s, dsc_s, epi_bar = (sc["lhs_e"], sc["vn_e"], sc["s0"], sc["dsc"],
                                         sc["epi_bar"])
    tok = pl.ds(n * CHUNK, CHUNK)
    keys = pl.ds(half * KEY_HALF, KEY_HALF)
    plgpu.commit_smem()  # generic-proxy writes of phase 2 before the TMA overwrites
    plgpu.barrier_arrive(sc["epi_sync"])
    plgpu.barrier_wait(sc["epi_sync"])

    if "no_state" not in ablations:
        @pl.when(wg == 0)
        def _copies():
            plgpu.copy_gmem_to_smem(do_ref.at[b, tok, h], lhs_s.at[0], epi_bar)
            plgpu.copy_gmem_to_smem(dr_rows, lhs_s.at[1], epi_bar)
            plgpu.copy_gmem_to_smem(vn_ref.at[b, tok, h], vn_s, epi_bar)
            plgpu.copy_gmem_to_smem(hs_ref.at[b, h, n, keys], s0_s, epi_bar)
            plgpu.copy_gmem_to_smem(dhs_ref.at[b, h, n, keys], dsc_s, epi_bar)

    if "no_cumsum" not in ablations:
        @pl.when(wg == 0)
        def _copy_u():  # U for the cumsum, where the shift buffers were
            plgpu.copy_gmem_to_smem(u_ref, sc["upper"], sc["u_bar"])

    # The last slab first: its partials are the ones in registers; the parked ones are loaded
    # when their slab's turn comes.
    for step, part in reversed(list(enumerate(partials))):
        if step < len(partials) - 1:
            plgpu.commit_smem()  # the previous slab's cumsum pieces may be overwritten
        _epilogue_slab(sc, part, dq_ref, dk_ref, dks_ref, dg_ref, dvw_ref, graw_ref, step=step,
                       wg=wg, tok=tok, h=h, b=b, half=half, scale=scale, slab=slab,
                       has_docs=has_docs, ks_channels=ks_channels, interpret=interpret,
                       ablations=ablations)


def _epilogue_slab(sc, partials, dq_ref, dk_ref, dks_ref, dg_ref, dvw_ref, graw_ref, *, step, wg,
                   tok, h, b, half, scale, slab, has_docs, ks_channels, interpret, ablations):
    """K2's epilogue on slab ``step`` of warpgroup ``wg``, channels ``[first, first + slab)``
    of the half: the four state products, ``backward_chunk``'s formulas, the chain rule, the
    stores and the ``U`` / ``L`` cumsum (:func:`_epilogue`; the first slab waits for the state
    copies)."""
    per_wg = WG_KEYS // slab
    first = pl.multiple_of(wg * WG_KEYS + step * slab if step else wg * WG_KEYS, slab)
    if partials is None:  # parked in SMEM by phase 2 (ordered by the epi_sync barrier)
        partials = [_load(sc["park"].at[wg, 3 * step + t], _WGMMA, interpret)
                    for t in range(3)]
    dq_m, dkr_m, dk_m = partials
    lhs_s, vn_s, s0_s, dsc_s = sc["lhs_e"], sc["vn_e"], sc["s0"], sc["dsc"]
    shape = (CHUNK, slab)
    cols = pl.ds(first, slab)
    no_state = "no_state" in ablations  # timing ablation: no copies, no state products
    if no_state:  # K1's partials stand in for the products (wrong numbers)
        p_dq, p_dkr, p_dk, p_de = dq_m, dkr_m, dk_m, dk_m
    else:
        if step == per_wg - 1:  # the first slab the epilogue runs
            plgpu.barrier_wait(sc["epi_bar"])
            if dvw_ref is not None:
                @pl.when((wg == 0) & (half == 0))
                def _store_dvw():  # dR (= dvw) in [B, T, H, V], read from SMEM by TMA while
                    # the products below read it too; waited for at the kernel's end
                    plgpu.copy_smem_to_gmem(lhs_s.at[1], dvw_ref.at[b, tok, h])
        s0_w = mgl.transposed(s0_s.at[cols], sc["s0t"].at[wg] if interpret else None,
                              interpret)
        dsc_w = mgl.transposed(dsc_s.at[cols], sc["dsct"].at[wg] if interpret else None,
                               interpret)
        # dO S_0^T, dR S_0^T, Vn dS_C^T ([64, V] @ [V, slab]) and dS_C S_0^T, whose diagonal
        # is de_all = rowsum(S_0 * dS_C) of these channels (exact products, fp32 sums).
        p_dq, p_dkr, p_dk, p_de = _products(shape, [(lhs_s.at[0], s0_w), (lhs_s.at[1], s0_w),
                                                    (vn_s, dsc_w), (dsc_s, s0_w)])
    rows, chan = mgl.iota(shape, 0, interpret), mgl.iota(shape, 1, interpret)
    g = _load(sc["g"].at[:, cols], _WGMMA, interpret)
    g_last = _load(sc["marks"].at[2 * NSUB - 1, cols], _COLS, interpret)  # gamma at row 63
    e_in = jnp.exp(g)
    e_out = jnp.exp(_cols(g_last, shape) - g)
    # de_all e_all conn_last, left on the diagonal of dS_C S_0^T (row first + c of column c):
    # no column sum here (see the cumsum below).
    x_de = jnp.where(rows == chan + first, p_de, 0.0) * _cols(jnp.exp(g_last), shape)
    if has_docs:
        conn = mgl.by_row(mgl.load_rows(sc["conn"], interpret), shape)
        last = mgl.by_row(mgl.load_rows(sc["last"], interpret), shape)
        e_in = e_in * conn
        e_out = e_out * last
        # conn_r last_r = conn_last on every row r: document ids are non-decreasing, so a row
        # in both the first and the last document of the chunk means one document throughout.
        x_de = x_de * (conn * last)
    qf = _load(sc["q"].at[:, cols], _WGMMA, interpret).astype(F32)
    kf = _load(sc["k"].at[:, cols], _WGMMA, interpret).astype(F32)
    krf = _kr_tile(sc, cols, shape, ks_channels, interpret)  # kr = k ks, formed here
    # backward_chunk's formulas, in its order.
    dq_s = F32(scale) * p_dq * e_in  # dqg E_in
    dkr_s = -p_dkr * e_in  # d(kr E_in) E_in
    dk_s = p_dk * e_out  # dkg E_out
    dk_o = kf * dk_s
    # backward_chunk's dgam, less its -dk_o and its row-63 terms (colsum(dk_o) + de_all e_all
    # conn_last), plus x_de: those reach dg through the cumsum's second product (below).
    dgam = qf * dq_s + krf * dkr_s + x_de
    dgam = dgam + qf * dq_m + krf * dkr_m - kf * dk_m
    spread = dk_o + x_de
    dtype = sc["k"].dtype
    dq = (dq_s + dq_m).astype(dtype)
    # The chain through kr = k ks as the Triton path's XLA does it, with its roundings: dkr
    # and dk in the operand dtype, then dk + ks dkr in fp32, rounded once; dks = k dkr (fp32).
    dkr = (dkr_s + dkr_m).astype(dtype).astype(F32)
    dk = (dk_s + dk_m).astype(dtype).astype(F32)
    ksf = _ks_tile(sc, cols, shape, ks_channels, interpret)
    dk_out = (dk + ksf * dkr).astype(dtype)
    dks = kf * dkr
    out = pl.ds(half * KEY_HALF + first, slab)
    no_store = "no_store" in ablations
    if no_store:  # timing ablation: one SMEM store of the sum keeps the work alive
        dks_t = dks if ks_channels else mgl.by_row(jnp.sum(dks, axis=1), shape)
        sink = sc["sink"].at[wg]
        _store_padded(sink, dq.astype(F32) + dk_out.astype(F32) + dks_t)
    else:
        dq_ref.at[b, tok, h, out][...] = dq  # stored before the cumsum: fewer live registers
        dk_ref.at[b, tok, h, out][...] = dk_out
        if ks_channels:
            dks_ref.at[b, tok, h, out][...] = dks
        else:  # per token: this slab's channels, summed in XLA over the partials
            dks_ref.at[b, h, (2 * half + wg) * per_wg + step if per_wg > 1 else 2 * half + wg,
                       tok][...] = jnp.sum(dks, axis=1)
    if "no_cumsum" in ablations:  # timing ablation: dg = dgam (wrong numbers)
        if no_store:
            _store_padded(sink, dgam)
        else:
            dg_ref.at[b, tok, h, out][...] = dgam
        return
    # dg: the within-chunk reverse cumsum of backward_chunk's dgam. Its column sums (of dk_o
    # and of the diagonal de terms) are not formed as sums over rows: in a kernel of two
    # warpgroups Mosaic GPU's cross-warp reduction scratch is one SMEM buffer both use at once
    # (wrong dg on the H100, MOSAIC_GPU.md Sec. 43). Instead, with U_ij = [j >= i] and
    # L = U^T (a transposed view of the same SMEM), dg = U @ dgam + L @ spread - spread with
    # dgam (this one) = A + x_de, spread = dk_o + x_de: row i gets sum_{j >= i} A_j +
    # sum_{j < i} dk_o_j + sum_j x_de_j, which is backward_chunk's sum_{j >= i} (A_j - dk_o_j)
    # + colsum(dk_o) + de_all e_all conn_last.
    # Each product runs on the three exact bf16 pieces (_split3): every product term is exact,
    # the sums fp32.
    piece, upper = sc["piece"].at[wg], sc["upper"]
    for t, x in enumerate(_split3(dgam)):
        piece.at[t][...] = x
    plgpu.commit_smem()
    if step == per_wg - 1:  # the first slab the epilogue runs
        plgpu.barrier_wait(sc["u_bar"])
    lo, mid, hi = _products(shape, [(upper, piece.at[t]) for t in (2, 1, 0)])
    dg = (lo + mid) + hi
    for t, x in enumerate(_split3(spread)):  # the pieces' products have completed
        piece.at[t][...] = x
    plgpu.commit_smem()
    lower = mgl.transposed(upper, sc["lower"].at[wg] if interpret else None, interpret)
    lo, mid, hi = _products(shape, [(lower, piece.at[t]) for t in (2, 1, 0)])
    dg = dg + ((lo + mid) + hi - spread)
    if graw_ref is not None:  # through max(g, LOG_DECAY_FLOOR), g's tile read from GMEM
        graw = _load(graw_ref.at[b, tok, h, out], _WGMMA, interpret)
        dg = validation.floor_log_decay_grad(graw, dg)
    if no_store:
        _store_padded(sink, dg)
    else:
        dg_ref.at[b, tok, h, out][...] = dg


def _scratch(dtype, dv, slab, has_docs, interpret, fused=False, ks_smem=None, sink=False):
    """``(scratch_types, names)`` of the kernel: the SMEM buffers and barriers (K1's, in K1's
    order; K2 unions two groups with its epilogue buffers and appends its own) and their
    names as the kernel receives them (a tuple of member names per RefUnion). ``sink``: the
    ``no_store`` ablation's fp32 ``[64, slab]`` buffer per warpgroup, appended last."""
    pitch = slab + PAD_COLS  # row pitch of the unswizzled shift buffers
    phase1 = [mgl.swizzled_smem((2, CHUNK, dv), dtype),  # lhs: dO, dR
              mgl.swizzled_smem((CHUNK, dv), dtype)]  # vn
    y_tiles = _tile16((2, NSUB, CHUNK, slab), dtype)  # y: per warpgroup, the column operands
    dms = [_tile16((2, CHUNK, CHUNK), dtype),  # free: dMq, dMk without the band
           _tile16((2, CHUNK, CHUNK), dtype)]  # quad: only the quadrants, without the band
    pads = [plgpu.SMEM((2, HALF + CHUNK, pitch), dtype),  # kpad: k, 8 leading pad rows
            # gpad: gamma as two 16-bit halves (_split_bits), 8 pad rows each side
            plgpu.SMEM((2, 2, HALF + CHUNK + HALF, pitch), BF16),
            plgpu.SMEM((2, CHUNK + HALF, pitch), dtype)]  # apad: q or kr, 8 trailing pad rows
    # K2's epilogue: S_0, dS_C rows of the half where the dM copies were; the three bf16
    # pieces of dgam and the upper-triangular ones where the shift buffers were.
    states = [mgl.swizzled_smem((KEY_HALF, dv), dtype),  # s0
              mgl.swizzled_smem((KEY_HALF, dv), dtype)]  # dsc
    cumsum = [_tile16((2, 3, CHUNK, slab), BF16),  # piece: hi, mid, lo per warpgroup
              _tile16((CHUNK, CHUNK), BF16)]  # upper: U_ij = [j >= i] (a TMA copy)

    def union(*groups):
        """``(refs, names)`` groups sharing SMEM (separate buffers when interpreting: no
        RefUnion); a group of one ref is that ref."""
        if interpret:
            for refs, group_names in groups:
                scratch.extend(refs)
                names.extend(group_names)
        else:
            members = [tuple(r) if len(r) > 1 else r[0] for r, _ in groups]
            scratch.append(plgpu.RefUnion(*members))
            names.append(tuple(n if len(n) > 1 else n[0] for _, n in groups))

    scratch, names = [], []
    if fused:  # the epilogue's dO, dR, Vn copies 1 KB past phase 1's (see _epilogue)
        epi = [plgpu.SMEM((1024,), jnp.int8), mgl.swizzled_smem((2, CHUNK, dv), dtype),
               mgl.swizzled_smem((CHUNK, dv), dtype)]
        union((phase1, ("lhs", "vn")), ([y_tiles], ("y",)), (epi, ("epad", "lhs_e", "vn_e")))
    else:
        union((phase1, ("lhs", "vn")), ([y_tiles], ("y",)))
    scratch += [
        _slab_smem((CHUNK, KEY_HALF), dtype, slab),  # q
        _slab_smem((CHUNK, KEY_HALF), dtype, slab),  # k
    ]
    names += ["q", "k"]
    if not fused:  # K1 reads kr; K2 forms it from k and ks (_kr_tile)
        scratch.append(_slab_smem((CHUNK, KEY_HALF), dtype, slab))  # kr
        names.append("kr")
    scratch += [
        _slab_smem((CHUNK, KEY_HALF), F32, slab),  # g: gamma
        plgpu.SMEM((CHUNK // HALF, KEY_HALF), F32),  # marks: gamma at rows 7, 15, .., 63
        plgpu.SMEM((CHUNK,), F32),  # doc
    ]
    names += ["g", "marks", "doc"]
    if fused:
        union((dms, ("free", "quad")),
              ([plgpu.SMEM((1024,), jnp.int8)] + states, ("spad", "s0", "dsc")))
    else:
        scratch += dms
        names += ["free", "quad"]
    scratch += [
        plgpu.SMEM((2, 2, HALF, CHUNK + HALF), F32),  # coef: band coefficients (row, col)
        _tile16((2, CHUNK, slab), dtype),  # x: k e^{r_J - gamma}, per warpgroup
        _tile16((2, CHUNK, slab), dtype),  # x2: k e^{m_J - gamma} on first-half rows
    ]
    names += ["coef", "x", "x2"]
    if fused:
        union((pads, ("kpad", "gpad", "apad")),
              ([plgpu.SMEM((1024,), jnp.int8)] + cumsum, ("cpad", "piece", "upper")))
    else:
        scratch += pads
        names += ["kpad", "gpad", "apad"]
    # qk_bar: q, k, kr (K1), gamma, the marks; K2: no kr, but ks (, conn, last)
    qk_copies = (4 + 1 + 2 * int(has_docs)) if fused else 5
    scratch += [
        plgpu.Barrier(num_arrivals=3 + int(has_docs)),  # in_bar: dO, dR, Vn (, doc) landed
        plgpu.Barrier(num_arrivals=qk_copies),  # qk_bar: the copies above landed
        plgpu.Barrier(num_arrivals=2),  # sync: both matrices staged
        plgpu.Barrier(num_arrivals=2),  # done: both warpgroups finished
    ]
    names += ["in_bar", "qk_bar", "sync", "done"]
    if fused and slab < WG_KEYS:  # park: every slab's partials but the last, fp32
        scratch.append(_slab_smem((2, 3 * (WG_KEYS // slab - 1), CHUNK, slab), F32, slab))
        names.append("park")
    if fused:
        scratch += [ks_smem,  # ks: the kr scale (per token, or the half's channels)
                    plgpu.SMEM((CHUNK,), F32),  # conn
                    plgpu.SMEM((CHUNK,), F32),  # last
                    plgpu.Barrier(num_arrivals=2),  # epi_sync: both left phase 2
                    plgpu.Barrier(num_arrivals=5),  # epi_bar: dO, dR, Vn, S_0, dS_C landed
                    plgpu.Barrier(num_arrivals=1)]  # u_bar: U landed
        names += ["ks", "conn", "last", "epi_sync", "epi_bar", "u_bar"]
    if interpret:  # the SMEM copies of what the GPU reads as transposed views
        scratch += [plgpu.SMEM((2, dv, CHUNK), dtype),  # vnt: Vn^T per warpgroup
                    plgpu.SMEM((2, 2, CHUNK, CHUNK), dtype)]  # mt: dM^T (free, quadrant)
        names += ["vnt", "mt"]
        if fused:
            scratch += [plgpu.SMEM((2, dv, slab), dtype),  # s0t: S_0^T rows per warpgroup
                        plgpu.SMEM((2, dv, slab), dtype),  # dsct: dS_C^T
                        plgpu.SMEM((2, CHUNK, CHUNK), BF16)]  # lower: U^T per warpgroup
            names += ["s0t", "dsct", "lower"]
    if sink:  # the no_store ablation's target (20 KB at slab 32; only in that variant)
        scratch.append(plgpu.SMEM((2, CHUNK, slab + PAD_COLS), F32))
        names.append("sink")
    return scratch, tuple(names)


def check_ablations(ablations, allowed) -> Tuple[str, ...]:
    """``ablations`` (a tuple of names from ``allowed``, :data:`K1_ABLATIONS` or
    :data:`K2_ABLATIONS`) sorted; ``()`` is the real kernel.

    Raises:
        ValueError: ``ablations`` not a tuple, a name not in ``allowed``, or a name twice.
    """
    if not isinstance(ablations, tuple):
        raise ValueError(f"ablations must be a tuple of names in {allowed}, got {ablations!r}")
    for name in ablations:
        if name not in allowed:
            raise ValueError(f"ablation {name!r} not in {allowed} (timing ablations, "
                             "MOSAIC_GPU.md Sec. 22)")
    if len(set(ablations)) != len(ablations):
        raise ValueError(f"ablations must not repeat a name, got {ablations!r}")
    return tuple(sorted(ablations))


def ablated_name(base: str, ablations: Tuple[str, ...]) -> str:
    """The kernel name of an ablated variant: ``base`` for ``()``, else
    ``base + "_abl_" + "_".join(sorted names)`` (the profiler lists each variant apart)."""
    return base if not ablations else base + "_abl_" + "_".join(sorted(ablations))


def _launch(kernel, out_type, scratch, grid, name: str, interpret: bool):
    """K1's and K2's ``plgpu.kernel``: grid ``(chunks x halves, H, B)`` named ``("n", "h",
    "b")``, two warpgroups (``"wg"``), GPU interpret mode when ``interpret``."""
    return plgpu.kernel(
        kernel,
        out_type=out_type,
        scratch_types=scratch,
        grid=grid,
        grid_names=("n", "h", "b"),
        num_threads=2,
        thread_name="wg",
        compiler_params=mgl.compiler_params(),
        interpret=mgl.interpret_params() if interpret else None,
        kernel_name=name,
    )


def check_inputs(q, k, kr, gamma, do, vn, dr, doc) -> None:
    """The input contract of :func:`channelwise_grad_intra_mosaic` (``kr=None``: K2's, which
    takes no ``kr``).

    Raises:
        ValueError: naming the argument and the shape or dtype it needs: ``q``, ``k``, ``kr``
            not ``[B, T, H, K]`` of one 16-bit dtype (fp32 inputs: use the Triton
            ``grad_blocks``, ``grad_pass='triton'``); ``gamma`` not a float ``[B, T, H, K]``;
            ``do``, ``vn``, ``dr`` not ``[B, T, H, V]`` in that dtype; K or V not 64 or 128;
            ``doc`` not ``[B, T]``.
    """
    if q.ndim != 4 or do.ndim != 4:
        raise ValueError(f"q must be [B, T, H, K] and do [B, T, H, V], got {q.shape=} "
                         f"{do.shape=}")
    batch, seq_len, heads, dk = q.shape
    dv = do.shape[-1]
    dtype = jnp.dtype(q.dtype)
    if dtype not in mgl.SUPPORTED_DTYPES:
        shared = "q, k, do, vn, dr" if kr is None else "q, k, kr, do, vn, dr"
        raise ValueError(f"{shared} must share a 16-bit dtype (bf16 or fp16: wgmma "
                         f"operands), got q.dtype={dtype}; fp32 inputs take the Triton "
                         f"grad_blocks kernel (channelwise_gpu, grad_pass='triton')")
    if dk not in mgl.SUPPORTED_HEAD_DIMS or dv not in mgl.SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head dims must be in {mgl.SUPPORTED_HEAD_DIMS}, got K={dk} (q) "
                         f"V={dv} (do)")
    for name, x in (("k", k), ("kr", kr)):
        if x is None:
            continue
        if x.shape != q.shape or x.dtype != dtype:
            raise ValueError(f"{name} must have q's shape {q.shape} and dtype {dtype}, got "
                             f"{x.shape} {x.dtype}")
    if gamma.shape != q.shape or not jnp.issubdtype(gamma.dtype, jnp.floating):
        raise ValueError(f"gamma must be a float [B, T, H, K] = {q.shape}, got {gamma.shape} "
                         f"{gamma.dtype}")
    for name, x in (("do", do), ("vn", vn), ("dr", dr)):
        if x is None:  # K2's heads-first dr: check_chunk_inputs checks it
            continue
        if x.shape != (batch, seq_len, heads, dv) or x.dtype != dtype:
            raise ValueError(f"{name} must be [B, T, H, V] = {(batch, seq_len, heads, dv)} in "
                             f"q's dtype {dtype}, got {x.shape} {x.dtype}")
    if doc is not None and doc.shape != (batch, seq_len):
        raise ValueError(f"doc must be [B, T] = {(batch, seq_len)}, got {doc.shape}")


@functools.partial(jax.jit, static_argnames=("scale", "slab", "interpret", "ablations"))
def channelwise_grad_intra_mosaic(
    q: jax.Array,
    k: jax.Array,
    kr: jax.Array,
    gamma: jax.Array,
    do: jax.Array,
    vn: jax.Array,
    dr: jax.Array,
    *,
    scale: float,
    doc: Optional[jax.Array] = None,
    slab: int = SLAB,
    interpret: bool = False,
    ablations: Tuple[str, ...] = (),
) -> Tuple[jax.Array, jax.Array, jax.Array]:
    """The gradients through ``Mq`` and ``Mk`` of KDA / GDN-2 in one Mosaic GPU kernel (K1).

    A drop-in for ``channelwise_gpu._grad_blocks`` (same inputs, outputs and layouts; module
    docstring). Per batch row, head and chunk of C = 64 tokens (paper arXiv 2607.07953, Eqs.
    18-24; ``grad_blocks`` in ``channelwise_gpu``'s module docstring), with
    ``e_ijc = exp(gamma_ic - gamma_jc)``::

        dMq = scale mask_incl(dO Vn^T);  dMk = -mask_strict(dR Vn^T)   (same document only)
        dq_ic  = sum_j dMq_ij k_jc e_ijc;   dkr_ic = sum_j dMk_ij k_jc e_ijc
        dk_jc  = sum_i (dMq_ij q_ic + dMk_ij kr_ic) e_ijc

    Pairs at most 7 tokens apart are exact in fp32; the others take bf16 (fp16) tensor-core
    products with fp32 accumulation (module docstring, MOSAIC_GPU.md Sec. 19.4.2).

    Args:
        q: queries ``[B, T, H, K]``, bf16 or fp16.
        k: keys ``[B, T, H, K]``, q's dtype.
        kr: read keys ``k * k_scale`` ``[B, T, H, K]``, q's dtype. K in {64, 128}.
        gamma: the within-chunk cumsum of the log-decay ``[B, T, H, K]`` (read as fp32;
            non-increasing within each chunk of 64 tokens, i.e. ``g <= 0``).
        do: the output's cotangent ``[B, T, H, V]``, q's dtype. V in {64, 128}.
        vn: ``Vn`` (``v_new``) of the forward ``[B, T, H, V]``, q's dtype.
        dr: ``dR = A^T dVn`` ``[B, T, H, V]``, q's dtype.
        scale: read-out scale (static).
        doc: the document index of every token ``[B, T]`` (int; exact up to 2**24 as fp32),
            or ``None`` for one document per row.
        slab: key channels per phase-2 step, 32 (one step per warpgroup; the default here) or
            16 (two; fewer live registers: ptxas spills at 32 and not at 16, MOSAIC_GPU.md
            Sec. 23-24; ``channelwise_gpu.TUNING["mosaic_grad_slab"]`` ships 16). Same results
            up to fp32 summation order (static).
        interpret: run in Mosaic GPU interpret mode (CPU; slow, for tests).
        ablations: timing ablations, names in :data:`K1_ABLATIONS` (static; benchmarks only,
            ``benchmarks/profile_grad.py``, MOSAIC_GPU.md Sec. 22). ``()``, the default, is the
            real kernel; any other value returns wrong numbers by design: ``no_band`` skips
            the band's 7 shifted steps, ``no_mma`` phase 2's ``wgmma`` groups, ``no_factors``
            the decay factors (unit factors), ``no_store`` the GMEM stores (the outputs are
            then left unwritten: garbage). Or one diagnostic tap of :data:`K1_TAPS` alone
            (``benchmarks/diag_grad.py``, MOSAIC_GPU.md Sec. 41): the outputs then hold
            phase-2 values instead of gradients.

    Returns:
        ``(dq, dk, dkr)``: fp32 ``[B, T, H, K]`` each, the partials ``backward_chunk`` adds.
        A ``T`` that is not a multiple of 64 is zero-padded inside.

    Raises:
        ValueError: as :func:`check_inputs` (shapes, 16-bit dtype, head dims), for a
            ``slab`` not in (16, 32), or as :func:`check_ablations`.
    """
    check_inputs(q, k, kr, gamma, do, vn, dr, doc)
    ablations = check_ablations(ablations, K1_ABLATIONS + K1_TAPS)
    if set(ablations) & set(K1_TAPS) and len(ablations) > 1:
        raise ValueError(f"a diagnostic tap runs alone, got {ablations!r}")
    if slab not in SLABS:
        raise ValueError(f"slab must be one of {SLABS}, got {slab!r}")
    batch, seq_len, heads, dk = q.shape
    dv = do.shape[-1]
    num_chunks = -(-seq_len // CHUNK)
    padded = num_chunks * CHUNK
    q, k, kr, do, vn, dr = (mgl.pad_time(x, num_chunks) for x in (q, k, kr, do, vn, dr))
    gamma = mgl.pad_time(gamma.astype(F32), num_chunks)
    has_docs = doc is not None
    extra = ()
    if has_docs:
        doc = jnp.pad(doc, ((0, 0), (0, padded - seq_len)), mode="edge")
        extra = (doc.astype(F32),)
    halves = dk // KEY_HALF
    dtype = q.dtype
    scratch, names = _scratch(dtype, dv, slab, has_docs, interpret,
                              sink="no_store" in ablations)
    extra_kw = dict(ablations=frozenset(ablations)) if ablations else {}
    kernel = functools.partial(_kernel, halves=halves, scale=float(scale), has_docs=has_docs,
                               slab=slab, interpret=interpret, names=names, **extra_kw)
    tok = jax.ShapeDtypeStruct((batch, padded, heads, dk), F32)
    call = _launch(kernel, (tok, tok, tok), scratch, (num_chunks * halves, heads, batch),
                   ablated_name(KERNEL_NAME, ablations), interpret)
    with jax.named_scope(KERNEL_NAME):
        g8 = gamma.reshape(batch, padded // HALF, HALF, heads, dk)  # a view (no copy)
        dq, dk_out, dkr = call(q, k, kr, gamma, g8, do, vn, dr, *extra)
    return dq[:, :seq_len], dk_out[:, :seq_len], dkr[:, :seq_len]


def check_chunk_inputs(q, k, ks, gamma, hs, dhs, do, vn, dr, doc,
                       dr_heads_first: bool = False) -> None:
    """The input contract of :func:`channelwise_grad_chunk_mosaic`: :func:`check_inputs`
    without ``kr`` (K2 forms it; ``k`` is checked as there: q's shape and dtype), and

    Raises:
        ValueError: as :func:`check_inputs` for ``q``, ``k``, ``gamma``, ``do``, ``vn``,
            ``dr``, ``doc`` (``dr`` ``[B, H, T, V]`` with ``dr_heads_first``); ``ks`` not a
            float ``[B, T, H, 1]`` or ``[B, T, H, K]``; ``hs`` or ``dhs`` not ``[B, H, N, K,
            V]`` (N = ceil(T / 64)) in q's dtype.
    """
    check_inputs(q, k, None, gamma, do, vn, None if dr_heads_first else dr, doc)
    batch, seq_len, heads, dk = q.shape
    dv = do.shape[-1]
    if dr_heads_first and (dr.shape != (batch, heads, seq_len, dv) or dr.dtype != q.dtype):
        raise ValueError(f"dr must be [B, H, T, V] = {(batch, heads, seq_len, dv)} in q's "
                         f"dtype {q.dtype} (dr_heads_first=True), got {dr.shape} {dr.dtype}")
    if ks.shape not in ((batch, seq_len, heads, 1), q.shape) or not jnp.issubdtype(
            ks.dtype, jnp.floating):
        raise ValueError(f"ks must be a float [B, T, H, 1] or [B, T, H, K] = {q.shape}, got "
                         f"{ks.shape} {ks.dtype}")
    want = (batch, heads, -(-seq_len // CHUNK), dk, dv)
    for name, x in (("hs", hs), ("dhs", dhs)):
        if x.shape != want or x.dtype != q.dtype:
            raise ValueError(f"{name} must be [B, H, N, K, V] = {want} in q's dtype "
                             f"{q.dtype}, got {x.shape} {x.dtype}")


@functools.partial(jax.jit, static_argnames=("scale", "slab", "interpret", "ablations",
                                             "dr_heads_first"))
def channelwise_grad_chunk_mosaic(
    q: jax.Array,
    k: jax.Array,
    ks: jax.Array,
    gamma: jax.Array,
    hs: jax.Array,
    dhs: jax.Array,
    do: jax.Array,
    vn: jax.Array,
    dr: jax.Array,
    *,
    scale: float,
    doc: Optional[jax.Array] = None,
    slab: int = SLAB,
    interpret: bool = False,
    ablations: Tuple[str, ...] = (),
    dr_heads_first: bool = False,
    g: Optional[jax.Array] = None,
) -> Tuple[jax.Array, ...]:
    """K2: K1, ``backward_chunk`` and the ``kr`` chain rule in one Mosaic GPU kernel.

    Replaces ``channelwise_gpu._grad_blocks`` (or K1), the Triton ``backward_chunk`` and the
    XLA chain rule through ``kr = k ks`` in ``channelwise_gpu``'s backward (module docstring,
    MOSAIC_GPU.md Sec. 19.4.4 and 21), so K1's fp32 partials ``dq_M, dk_M, dkr_M`` never
    leave the registers. Per chunk (``backward_chunk``'s equations; ``E_in = e^gamma conn``,
    ``E_out = e^{gamma_C - gamma} last``, ``e_all = e^{gamma_C} conn_C``)::

        dq   = scale (dO S_0^T) E_in + dq_M
        dkr  = -(dR S_0^T) E_in + dkr_M
        dk   = (Vn dS_C^T) E_out + dk_M
        de_all = rowsum(S_0 * dS_C)                   (the diagonal of dS_C S_0^T)
        dgam = q dq + kr dkr - k dk            + [last row] (colsum(k (Vn dS_C^T) E_out)
               + de_all e_all)                  (the state-term shares, then the M shares)
        dg   = the within-chunk reverse cumsum of dgam (U @ dgam' + L @ s - s on three
               exact bf16 pieces each: module docstring)
        dk_out = round(round(dk) + ks round(dkr));  dks = k round(dkr)

    with ``round`` to the operand dtype: the roundings of the Triton path (``backward_chunk``
    writes dk, dkr in the operand dtype; the chain rule adds in fp32). The read key ``kr = k
    ks`` is not an input: the kernel forms it from ``k`` and ``ks``, in fp32 and rounded once
    to the operand dtype as the forward does (the same bits as the Triton path's ``kr``).

    Args:
        q, k, gamma, do, vn, dr, doc, scale: as :func:`channelwise_grad_intra_mosaic`;
            here ``doc`` must also be non-decreasing along each row (as
            ``validation.document_index`` makes it: the epilogue reads ``conn_last`` as
            ``conn_r last_r``; not checked, the ids are traced).
        ks: the read key's scale ``[B, T, H, 1]`` (KDA's beta: ``dks`` summed per token) or
            ``[B, T, H, K]`` (GDN-2's per-channel b); any float dtype (read as fp32: bf16,
            fp16 and fp32 as they are, others converted); ``kr = round(k ks)`` in-kernel.
        hs: the chunks' entry states ``S_0`` ``[B, H, N, K, V]`` in q's dtype (the forward's
            ``hs``), N = ceil(T / 64).
        dhs: the chunks' exit-state cotangents ``dS_C`` ``[B, H, N, K, V]`` in q's dtype
            (``backward_state``'s).
        slab: key channels per phase-2 step, 32 (the default here) or 16 (two steps per
            warpgroup, the first slab's partials parked in SMEM; no register spills,
            MOSAIC_GPU.md Sec. 24; ``channelwise_gpu.TUNING["mosaic_grad_slab"]`` ships 16).
            The same values up to the fp32 summation order of KDA's per-token ``dks``
            (static).
        interpret: run in Mosaic GPU interpret mode (CPU; slow, for tests).
        ablations: timing ablations, names in :data:`K2_ABLATIONS` (static; benchmarks only,
            MOSAIC_GPU.md Sec. 22; ``()``, the default, is the real kernel, anything else
            returns wrong numbers by design): K1's four (:func:`channelwise_grad_intra_mosaic`;
            ``no_store`` also skips the epilogue's stores and needs 20 KB more SMEM, too much
            with an fp32 per-channel ``ks`` at V = 128), ``no_state`` (the epilogue's second
            TMA copies and its four state products skipped, K1's partials in their place) and
            ``no_cumsum`` (``dg = dgam``: no split, no ``U`` products).
        dr_heads_first: ``dr`` is ``[B, H, T, V]``, the layout XLA's per-chunk product
            ``A^T dVn`` comes out in (``channelwise_gpu._chunk_dr(..., heads_first=True)``),
            and K2 also returns it as ``dvw`` ``[B, T, H, V]``: key half 0 of each chunk
            stores the ``[64, V]`` rows its epilogue copied into SMEM (a TMA store), so the
            value-scale chain reads ``dvw`` without XLA's transpose of the product (0.75 ms
            of KDA's backward at S1 on an H100, fused with that chain; MOSAIC_GPU.md Sec.
            47.2). The same values as with ``[B, T, H, V]`` (static).
        g: ``None``, or the log-decay before its floor, float ``[B, T, H, K]`` (``gamma`` is
            the within-chunk cumsum of ``max(g, LOG_DECAY_FLOOR)``): ``dg`` is then returned
            through that floor as ``jax.grad`` of ``validation.floor_log_decay`` takes it
            (``dg`` above the floor, ``dg / 2`` at it, 0 below or for NaN), each CTA reading
            its ``[64, slab]`` tiles of ``g`` from GMEM in the epilogue: no XLA pass over
            ``g`` and ``dg`` after the kernel (0.255 ms at S1 on an H100, MOSAIC_GPU.md Sec.
            47.5).

    Returns:
        ``(dq, dk, dks, dg)``, and ``dvw`` last with ``dr_heads_first``: ``dq`` and ``dk``
        (the chain rule applied) ``[B, T, H, K]`` in q's dtype; ``dks`` fp32, ks's shape;
        ``dg`` fp32 ``[B, T, H, K]`` (the gradient of the log-decay g); ``dvw`` ``[B, T, H,
        V]`` in q's dtype (``dr``'s values).

    Raises:
        ValueError: as :func:`check_chunk_inputs` or :func:`check_ablations`, or for a
            ``slab`` not in (16, 32).
    """
    check_chunk_inputs(q, k, ks, gamma, hs, dhs, do, vn, dr, doc, dr_heads_first)
    if g is not None and (g.shape != q.shape or not jnp.issubdtype(g.dtype, jnp.floating)):
        raise ValueError(f"g must be a float [B, T, H, K] = {q.shape}, got {g.shape} {g.dtype}")
    ablations = check_ablations(ablations, K2_ABLATIONS)
    if slab not in SLABS:
        raise ValueError(f"slab must be one of {SLABS}, got {slab!r}")
    batch, seq_len, heads, dk = q.shape
    dv = do.shape[-1]
    num_chunks = -(-seq_len // CHUNK)
    padded = num_chunks * CHUNK
    q, k, do, vn = (mgl.pad_time(x, num_chunks) for x in (q, k, do, vn))
    if dr_heads_first:  # [B, H, T, V]: time is axis 2
        dr = jnp.pad(dr, ((0, 0), (0, 0), (0, padded - seq_len), (0, 0)))
    else:
        dr = mgl.pad_time(dr, num_chunks)
    gamma = mgl.pad_time(gamma.astype(F32), num_chunks)
    halves = dk // KEY_HALF
    ks_channels = ks.shape[-1] != 1
    if ks_channels:
        if jnp.dtype(ks.dtype) not in (jnp.dtype(BF16), jnp.dtype(jnp.float16), jnp.dtype(F32)):
            ks = ks.astype(F32)
        ks_in = mgl.pad_time(ks, num_chunks)
        ks_smem = _slab_smem((CHUNK, KEY_HALF), ks_in.dtype, slab)
    else:  # [B, H, Tp]: one contiguous 64-token row per chunk
        ks_in = jnp.transpose(mgl.pad_time(ks.astype(F32), num_chunks)[..., 0], (0, 2, 1))
        ks_smem = plgpu.SMEM((CHUNK,), F32)
    has_docs = doc is not None
    extra = ()
    if has_docs:
        doc = jnp.pad(doc, ((0, 0), (0, padded - seq_len)), mode="edge")
        dc = doc.reshape(batch, num_chunks, CHUNK)
        prev = jnp.concatenate([dc[:, :1, :1], dc[:, :-1, -1:]], axis=1)  # doc before a chunk
        conn = (dc == prev).astype(F32).reshape(batch, padded)  # as docs_from_segment_ids
        last = (dc == dc[:, :, -1:]).astype(F32).reshape(batch, padded)
        extra = (doc.astype(F32), conn, last)
    dtype = q.dtype
    scratch, names = _scratch(dtype, dv, slab, has_docs, interpret, fused=True,
                              ks_smem=ks_smem, sink="no_store" in ablations)
    extra_kw = dict(ablations=frozenset(ablations)) if ablations else {}
    kernel = functools.partial(_kernel_k2, halves=halves, scale=float(scale), has_docs=has_docs,
                               slab=slab, interpret=interpret, names=names, fused=True,
                               ks_channels=ks_channels, dr_heads_first=dr_heads_first,
                               floor_g=g is not None, **extra_kw)
    tok = jax.ShapeDtypeStruct((batch, padded, heads, dk), dtype)
    dks_type = (jax.ShapeDtypeStruct((batch, padded, heads, dk), F32) if ks_channels
                else jax.ShapeDtypeStruct((batch, heads, dk // slab, padded), F32))
    out_type = (tok, tok, dks_type, jax.ShapeDtypeStruct((batch, padded, heads, dk), F32))
    if dr_heads_first:
        out_type += (jax.ShapeDtypeStruct((batch, padded, heads, dv), dtype),)  # dvw
    call = _launch(kernel, out_type, scratch, (num_chunks * halves, heads, batch),
                   ablated_name(K2_KERNEL_NAME, ablations), interpret)
    with jax.named_scope(K2_KERNEL_NAME):
        g8 = gamma.reshape(batch, padded // HALF, HALF, heads, dk)  # a view (no copy)
        upper = jnp.triu(jnp.ones((CHUNK, CHUNK), BF16))  # U_ij = [j >= i], for the cumsum
        graw = () if g is None else (mgl.pad_time(g.astype(F32), num_chunks),)
        outs = call(q, k, gamma, g8, do, vn, dr, hs, dhs, ks_in, upper, *graw, *extra)
        dq, dk_out, dks, dg = outs[:4]
        if not ks_channels:  # the per-slab partials, summed here: [B, T, H, 1]
            dks = jnp.transpose(jnp.sum(dks, axis=2), (0, 2, 1))[..., None]
    return tuple(x[:, :seq_len] for x in (dq, dk_out, dks, dg) + tuple(outs[4:]))
