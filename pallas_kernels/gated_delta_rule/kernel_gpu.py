"""Chunked Pallas GPU kernels (Triton lowering) for the scalar-decay linear-attention family.

One set of kernels serves Gated DeltaNet (paper arXiv 2607.07953, Sec. 3.2, Eqs. 15-17),
DeltaNet (Eq. 14, ``g = 0``) and, with the delta rule switched off (``delta=False``), simple GLA,
Lightning and plain linear attention (HypeNet, arXiv 2601.22156, Sec. 3). Forward and backward
are ``jax.custom_vjp`` rules; the backward recomputes nothing it can cheaply store.

Chunk form (C = 64 tokens per chunk, entry state S_0 in R^{K x V}, gamma the within-chunk
cumulative sum of the log-decay g, computed in fp32 by XLA before the kernels)::

    D_ij  = exp(gamma_i - gamma_j) [j <= i, same document]         (C x C decay mask)
    L     = strict_tril(diag(beta) (K K^T) * D)
    A     = (I + L)^{-1}                                            (unit lower triangular)
    W     = A diag(beta * e_in) K,    U = A diag(beta) V            (WY/UT form, delta only)
    Vn    = U - W S_0                 (= V when delta is off)       ("v_new", the residual u)
    O     = scale [diag(e_in) Q S_0 + (Q K^T * D) Vn]
    S_C   = e_all S_0 + (diag(e_out) K)^T Vn

with ``e_in_i = exp(gamma_i)``, ``e_out_j = exp(gamma_C - gamma_j)`` and ``e_all = exp(gamma_C)``,
each zeroed where a document boundary cuts the path (segment ids: tokens of a new document do
not see S_0, tokens of an earlier document do not reach S_C).

Kernels (grid in brackets):

* ``prepare`` [chunks, B*H]: builds L, inverts I + L blockwise with whole-tile products
  (:func:`_unit_lower_inverse`), then writes W and U (input dtype) and A (tensor-core operand
  dtype, kept for the backward, which uses it only as an operand of A^T dVn).
* ``forward`` [B*H, V/BV]: the sequential pass over chunks with the fp32 state in registers;
  writes O, the final state, and on request Vn and every chunk's entry state (for the backward).
* With ``TUNING["split_forward"]`` (default off) ``forward`` is replaced by two kernels, as in
  FLA, so that the sequential loop carries only what the next chunk depends on:

  - ``forward_state`` [B*H, V/BV]: the sequential pass computing per chunk only Vn and the state
    update S_C (no Q K^T, no C x C decay mask); writes Vn (delta rule only; otherwise Vn = V),
    every chunk's entry state S_0 and the final state;
  - ``forward_output`` [chunks, B*H, V/BVO] (BVO = min(V, 64), :data:`OUTPUT_BLOCK_V`): O of
    each chunk from Q, K, gamma, the documents, its entry state and Vn, all chunks in parallel.

  Both paths give the backward the same residuals (Vn in the input dtype, the entry states
  ``[B, H, chunks, K, V]`` in the tensor-core operand dtype) and the same numerics: the state
  recurrence is the same code, and the read-out products see the same operand-dtype values of
  S_0 and Vn, so O differs only by fp32 accumulation order (final state, Vn and gradients are
  bitwise equal in interpret mode). The split path always writes the entry states (also in a
  forward without gradient): B*H*chunks*K*V elements of the operand dtype.
* Sequence parallelism (``TUNING["segments"]``, :func:`num_segments`): the sequential kernels
  run only B*H*V/BV programs, too few for the GPU when rows are long and few (one 32K row: 8-32
  programs for 132 SMs). Each row is then cut into P segments, which the kernels see as rows of
  a pseudo-batch ``[B*P, T/P]`` (a free reshape; the document masks come from the whole row).
  The chunk update is affine in the entry state, ``S_C = M_n S_0 + X_n`` with
  ``M_n = e_all I - (diag(e_out) K)^T W`` and ``X_n = (diag(e_out) K)^T U``, so

  - ``segment_transitions`` [B*P*H, (K+V)/64] (the ``forward_state`` kernel on the columns
    ``[I | 0]`` -> inputs ``[0 | U]``) gives every segment's map ``[M | X]``, fp32;
  - a ``lax.scan`` over the P segments (fp32 products) gives their entry states, and the
    forward kernels run on the pseudo-batch from those;
  - backward: the reverse pass from a zero exit gradient gives each segment's ``Y``
    (``dS_entry = M^T dS_exit + Y``), a reverse ``lax.scan`` the exit gradients, and the
    reverse pass runs again from those. Every kernel then sees its true entry state and exit
    gradient, so outputs and gradients equal the unsegmented kernels' up to fp32 rounding.
* ``backward_state`` [B*H, V/BV]: the reverse pass; carries dS (fp32), writes every chunk's
  exit-state gradient dS_C, the gradient of Vn (dVn, in the operand dtype: it is only ever an
  operand) and the initial-state gradient.
* ``backward_chunk`` [chunks, B*H, K/BK]: all parameter gradients of one chunk from S_0, dS_C,
  dO, Vn and dVn: dq, dk, dv, dbeta and d gamma (XLA turns d gamma into dg by the cumsum
  transpose), looping over value tiles so that no whole [C, V] or [K, V] block is held.

Backward algebra (per chunk; P = Q K^T * D, Kb = diag(beta e_in) K, Vb = diag(beta) V)::

    dVn = scale P^T dO + diag(e_out) K dS_C        dS_0 = e_all dS_C + scale (e_in Q)^T dO - W^T dVn
    dP  = scale dO Vn^T   ->  dQ += (dP * D) K,  dK += (dP * D)^T Q,  dD += dP * (Q K^T)
    dQ += scale diag(e_in) dO S_0^T;   dK += diag(e_out) Vn dS_C^T
    dW  = -dVn S_0^T;  dA = dVn Vb^T + dW Kb^T;  dVb = A^T dVn;  dKb = A^T dW
    dL  = -strict_tril(A^T dA A^T);  dK += (G + G^T) K with G = dL * diag(beta) D;
    dD += dL * diag(beta) (K K^T)

and the decay factors pass their gradients to gamma through d exp(x) = exp(x) dx.

Without a decay (``g=None``: DeltaNet, linear attention) the kernels are specialised statically:
D is the causal 0/1 mask, the edge factors are the document masks, no ``exp`` is taken and the
gradient kernel skips every d gamma term (one [C, K] x [K, C] product and its reductions).

Numerics: states, decays, the triangular inverse and every accumulation are fp32. The big
products run on tensor cores in the input dtype (bf16 inputs: bf16 operands, fp32 accumulate,
as FLA does); fp32 inputs run every product in IEEE fp32, so the kernels then match the fp32
reference to rounding. Exponents are masked to ``j <= i`` before ``exp``.

All kernels also run under ``interpret=True`` (Pallas interpret mode) on any backend; the test
suite checks them that way on CPU.
"""

import functools
from typing import Optional, Tuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels.common import pallas_gpu
from pallas_kernels.common.pallas_gpu import mm, mm_nt, mm_tn

F32 = jnp.float32
# Triton launch parameters per kernel: (num_warps, num_stages), the value-block width of the
# sequential kernels (None: :func:`auto_block_v`) and the key-block width of backward_chunk
# (None: the whole K). Swept on the H200 with benchmarks/tune_kernels.py
# (benchmarks/results/history/tune-gdn-h200-2026-11-29.md): block_v is the only knob that moved
# the objective beyond noise, and only where few programs run (see auto_block_v).
# split_forward: run the forward as forward_state (sequential) + forward_output (parallel)
# instead of the single forward kernel (module docstring); not yet measured on the GPU, so off.
# forward_state / forward_output are those two kernels' launch parameters (unswept guesses:
# forward's for the sequential kernel, prepare's for the loop-free parallel one).
# segments: P, the segments each row is cut into (None: num_segments, by occupancy; 1: never).
# A launch entry may also be a dict {head dim K: (num_warps, num_stages)} (launch_for): the
# gradient kernel wants 4 warps at K = 64 and 8 at K = 128
# (benchmarks/results/history/tune-backward-h200-2026-11-29.md).
TUNING = {
    "prepare": (4, 1),
    "forward": (4, 2),
    "backward_state": (4, 2),
    "backward_chunk": {64: (4, 2), 128: (8, 2)},
    "block_v": None,
    "block_k": None,
    "split_forward": False,
    "forward_state": (4, 2),
    "forward_output": (4, 1),
    "segments": None,
}
CHUNK = pallas_gpu.KERNEL_CHUNK_SIZE  # C
# Value-block width of the parallel forward_output kernel (min(V, this)): it has chunks*B*H
# programs per value block already, so a wide block mainly saves recomputing Q K^T and D.
OUTPUT_BLOCK_V = 64
# Value-tile width of backward_chunk's loop over the value channels (min(V, this)).
GRAD_BLOCK_V = 64


# The sequential kernels run B*H*(V/block_v) programs; below this many (about the H200's 132
# SMs) a narrower value block buys parallelism. Measured at S2 (B=1, T=32768, H=16, V=128: 32
# programs at block_v=64): block_v=32 runs the forward 1.38x and forward+backward 1.20x faster;
# at S1 (B=8, T=4096, H=16: 256 programs) it is 2-17% slower, so it stays 64 there.
MIN_SEQUENTIAL_PROGRAMS = 128
# Sequence parallelism (num_segments): rows are cut into segments until the sequential kernels
# run SEGMENT_TARGET_PROGRAMS programs, each segment at least MIN_SEGMENT_CHUNKS chunks long.
# Measured on the H200 (benchmarks/results/history/tune-segments-h200-2026-11-29.md), kernel
# fwd+bwd: one 32K row with 8 heads of 64 (8 programs) 2.2x faster at P=16 (1.52 ms) than uncut
# (3.36 ms), 2.0x at P=32; S2 (32 programs) 1.17x at P=4, 1.20x at P=8. B=8 x 4K x 8 heads of 64
# (64 programs) gains nothing in the kernel benchmark (1.26 ms uncut, 1.39 ms at P=4), but the
# 350M GDN trainer step at that shape takes 0.1542 s uncut and 0.1461 s at P=2 or 4
# (train-h200-2026-11-29.md), so it is cut too.
SEGMENT_TARGET_PROGRAMS = 128
MIN_SEGMENT_CHUNKS = 8


def auto_block_v(batch: int, heads: int, dv: int) -> int:
    """Value-block width of the sequential kernels when ``TUNING["block_v"]`` is ``None``.

    ``min(V, 64)``, halved to 32 when ``batch * heads * V / 64`` programs would leave most of the
    GPU idle (fewer than :data:`MIN_SEQUENTIAL_PROGRAMS`), e.g. one long row.
    """
    block = min(dv, 64)
    if block == 64 and batch * heads * (dv // 64) < MIN_SEQUENTIAL_PROGRAMS:
        block = 32
    return block


def num_segments(batch: int, heads: int, dv: int, n_chunks: int, tuning=None) -> int:
    """How many segments P each row's state passes are cut into (sequence parallelism).

    ``tuning["segments"]`` (default :data:`TUNING`) when set; otherwise (``None``) the smallest
    power of two for which the sequential kernels run at least
    :data:`SEGMENT_TARGET_PROGRAMS` programs (``batch * heads * P * V / 64``), keeping at least
    :data:`MIN_SEGMENT_CHUNKS` chunks per segment. 1 means no cut. A cut costs one more state
    pass over ``K + V`` columns forward and one more reverse pass backward (plus P small fp32
    products): it pays only where few rows would leave the GPU idle (long rows, small batch).
    """
    tuning = TUNING if tuning is None else tuning
    if tuning["segments"]:
        return int(tuning["segments"])
    programs = batch * heads * max(1, dv // 64)
    p = 1
    while (programs * p < SEGMENT_TARGET_PROGRAMS
           and n_chunks >= 2 * p * MIN_SEGMENT_CHUNKS):
        p *= 2
    return p


def launch_for(kernel: str, dk: int, tuning=None) -> Tuple[int, int]:
    """``(num_warps, num_stages)`` of ``kernel`` (a :data:`TUNING` key) at key head dim ``dk``.

    A TUNING launch entry is a pair, or a dict from head dim to pair.

    Raises:
      ValueError: for a dict entry without ``dk``, or an entry that is not a pair.
    """
    return pallas_gpu.resolve_launch((TUNING if tuning is None else tuning)[kernel], dk)


def block_widths(batch: int, heads: int, dk: int, dv: int, tuning=None) -> Tuple[int, int]:
    """``(block_v, block_k)`` the kernels run with: ``tuning``'s (default :data:`TUNING`)
    widths, ``None`` resolved to :func:`auto_block_v` and to the whole K."""
    tuning = TUNING if tuning is None else tuning
    return (tuning["block_v"] or auto_block_v(batch, heads, dv), tuning["block_k"] or dk)


def _config(*, batch, heads, n_chunks, dk, dv, scale, delta, has_docs, mm_dtype, interpret,
            return_residual, block_v=None, segments=1, decay=True):
    """The static configuration of one call (hashable once sorted into a tuple).

    ``batch`` and ``n_chunks`` are those of the pseudo-batch the kernels see (B * P rows of
    ``n_chunks`` chunks when the rows are cut into ``segments`` = P segments).
    """
    auto_v, block_k = block_widths(batch, heads, dk, dv)
    block_v = block_v or auto_v
    return dict(batch=batch, heads=heads, n_chunks=n_chunks, dk=dk, dv=dv, scale=scale,
                block_k=block_k, segments=segments,
                delta=delta, decay=decay, has_docs=has_docs, mm_dtype=jnp.dtype(mm_dtype),
                interpret=interpret, return_residual=return_residual, block_v=block_v,
                split_forward=bool(TUNING["split_forward"]),
                block_v_out=min(dv, OUTPUT_BLOCK_V), block_v_grad=min(dv, GRAD_BLOCK_V))


# Shared in-kernel helpers (pallas_kernels.common.pallas_gpu), under this module's short names.
_iota = pallas_gpu.iota
_last = pallas_gpu.last_element
_program_bh = pallas_gpu.program_batch_head
_doc_inputs = pallas_gpu.doc_inputs
_load_docs = pallas_gpu.load_docs
_docs_from_segment_ids = pallas_gpu.docs_from_segment_ids
_unit_lower_inverse = pallas_gpu.unit_lower_inverse
_dot_precise = pallas_gpu.dot_precise


# ----------------------------------------------------------------------------------------------
# In-kernel helpers (operate on loaded values).


def _decays(gam, doc, conn, last, decay=True):
    """Chunk decay factors from the within-chunk cumsum ``gam [C]`` (fp32).

    Returns ``(D [C, C] inclusive, e_in [C], e_out [C], e_all scalar, mask [C, C])``. Without
    ``decay`` (DeltaNet, linear attention: g = 0) D is the 0/1 mask and the edge factors are
    the document masks (or ones), with no ``exp``.
    """
    c = gam.shape[0]
    rows, cols = _iota((c, c), 0), _iota((c, c), 1)
    mask = rows >= cols
    if doc is not None:
        mask = mask & (doc[:, None] == doc[None, :])
    if decay:
        diff = jnp.where(mask, gam[:, None] - gam[None, :], 0.0)
        dmat = jnp.where(mask, jnp.exp(diff), 0.0)
    else:
        dmat = jnp.where(mask, 1.0, 0.0).astype(F32)
    e_in, e_out, e_all = _edge_decays(gam, doc, conn, last, decay)
    return dmat, e_in, e_out, e_all, mask


def _edge_decays(gam, doc, conn, last, decay=True):
    """``(e_in [C], e_out [C], e_all scalar)`` of :func:`_decays`, without the C x C mask."""
    c = gam.shape[0]
    if not decay:
        if doc is None:
            ones = jnp.ones((c,), F32)
            return ones, ones, jnp.ones((), F32)
        return conn, last, _last(conn, c)
    g_last = _last(gam, c)
    e_in = jnp.exp(gam)
    e_out = jnp.exp(g_last - gam)
    e_all = jnp.exp(g_last)
    if doc is not None:
        e_in = e_in * conn
        e_out = e_out * last
        e_all = e_all * _last(conn, c)
    return e_in, e_out, e_all


def _pallas(kernel, cfg, *, tune, **kwargs):
    """:func:`pallas_gpu.named_pallas_call` with the launch of :data:`TUNING` entry ``tune``."""
    return pallas_gpu.named_pallas_call(kernel, cfg, launch=launch_for(tune, cfg["dk"]),
                                        **kwargs)


# ----------------------------------------------------------------------------------------------
# Kernel 1: intra-chunk WY preparation (delta rule only).


def _prepare_kernel(k_ref, v_ref, beta_ref, gam_ref, doc_ref, conn_ref, last_ref,
                    w_ref, u_ref, a_ref, *, cfg):
    n = pl.program_id(0)
    b, h = _program_bh(cfg, 1)
    tsl = pl.ds(n * CHUNK, CHUNK)
    mdt = cfg["mm_dtype"]
    k = k_ref[b, tsl, h, :]
    v = v_ref[b, tsl, h, :]
    beta = beta_ref[b, h, tsl]
    gam = gam_ref[b, h, tsl]
    doc, conn, last = _load_docs(cfg, doc_ref, conn_ref, last_ref, b, tsl)
    dmat, e_in, _, _, mask = _decays(gam, doc, conn, last, cfg["decay"])
    rows, cols = _iota(mask.shape, 0), _iota(mask.shape, 1)
    strict = jnp.where(mask & (rows > cols), beta[:, None] * mm_nt(k, k, mdt) * dmat, 0.0)
    amat = _unit_lower_inverse(strict, mdt)
    a_ref[b, h, n, :, :] = amat.astype(a_ref.dtype)
    kb = k.astype(F32) * (beta * e_in)[:, None]
    vb = v.astype(F32) * beta[:, None]
    w_ref[b, tsl, h, :] = mm(amat, kb, mdt).astype(w_ref.dtype)
    u_ref[b, tsl, h, :] = mm(amat, vb, mdt).astype(u_ref.dtype)


def _prepare(cfg, k, v, beta, gam, docs):
    bsz, tp, heads, dk = k.shape
    dv = v.shape[-1]
    outs = _pallas(
        _prepare_kernel, cfg,
        inputs=[("k_ref", k), ("v_ref", v), ("beta_ref", beta), ("gam_ref", gam)]
        + _doc_inputs(docs),
        outputs=[
            ("w_ref", jax.ShapeDtypeStruct((bsz, tp, heads, dk), k.dtype)),
            ("u_ref", jax.ShapeDtypeStruct((bsz, tp, heads, dv), v.dtype)),
            ("a_ref", jax.ShapeDtypeStruct((bsz, heads, cfg["n_chunks"], CHUNK, CHUNK),
                                           cfg["mm_dtype"])),
        ],
        grid=(cfg["n_chunks"], bsz * heads), tune="prepare", name="gdn_prepare",
    )
    return outs["w_ref"], outs["u_ref"], outs["a_ref"]


# ----------------------------------------------------------------------------------------------
# Kernel 2: the sequential forward pass over chunks.


def _forward_kernel(q_ref, k_ref, u_ref, w_ref, gam_ref, doc_ref, conn_ref, last_ref, h0_ref,
                    o_ref, ht_ref, vn_ref, hs_ref, *, cfg):
    b, h = _program_bh(cfg, 0)
    v0 = pl.program_id(1) * cfg["block_v"]
    vsl = pl.ds(v0, cfg["block_v"])
    mdt = cfg["mm_dtype"]
    scale = cfg["scale"]

    def body(n, state):
        tsl = pl.ds(n * CHUNK, CHUNK)
        if hs_ref is not None:
            hs_ref[b, h, n, :, vsl] = state.astype(hs_ref.dtype)
        q = q_ref[b, tsl, h, :]
        k = k_ref[b, tsl, h, :]
        u = u_ref[b, tsl, h, vsl]
        gam = gam_ref[b, h, tsl]
        doc, conn, last = _load_docs(cfg, doc_ref, conn_ref, last_ref, b, tsl)
        dmat, e_in, e_out, e_all, _ = _decays(gam, doc, conn, last, cfg["decay"])
        if cfg["delta"]:
            vn = u.astype(F32) - mm(w_ref[b, tsl, h, :], state, mdt)
        else:
            vn = u.astype(F32)
        attn = mm_nt(q, k, mdt) * dmat
        o = mm(q.astype(F32) * e_in[:, None], state, mdt) + mm(attn, vn, mdt)
        o_ref[b, tsl, h, vsl] = (scale * o).astype(o_ref.dtype)
        if vn_ref is not None:
            vn_ref[b, tsl, h, vsl] = vn.astype(vn_ref.dtype)
        return e_all * state + mm_tn(k.astype(F32) * e_out[:, None], vn, mdt)

    state = h0_ref[b, h, :, vsl].astype(F32)
    state = jax.lax.fori_loop(0, cfg["n_chunks"], body, state)
    ht_ref[b, h, :, vsl] = state


def _forward(cfg, q, k, u, w, gam, docs, h0, *, save_vn, save_states):
    bsz, tp, heads, dk = q.shape
    dv = u.shape[-1]
    hs = jax.ShapeDtypeStruct((bsz, heads, cfg["n_chunks"], dk, dv), cfg["mm_dtype"])
    outs = _pallas(
        _forward_kernel, cfg,
        inputs=[("q_ref", q), ("k_ref", k), ("u_ref", u), ("w_ref", w), ("gam_ref", gam)]
        + _doc_inputs(docs) + [("h0_ref", h0)],
        outputs=[
            ("o_ref", jax.ShapeDtypeStruct((bsz, tp, heads, dv), u.dtype)),
            ("ht_ref", jax.ShapeDtypeStruct((bsz, heads, dk, dv), F32)),
            ("vn_ref", jax.ShapeDtypeStruct((bsz, tp, heads, dv), u.dtype) if save_vn else None),
            ("hs_ref", hs if save_states else None),
        ],
        grid=(bsz * heads, dv // cfg["block_v"]), tune="forward", name="gdn_forward",
    )
    return outs["o_ref"], outs["ht_ref"], outs.get("vn_ref"), outs.get("hs_ref")


# ----------------------------------------------------------------------------------------------
# Kernels 2a/2b (TUNING["split_forward"]): the sequential state pass and the parallel read-out.


def _forward_state_kernel(k_ref, u_ref, w_ref, gam_ref, doc_ref, conn_ref, last_ref, h0_ref,
                          ht_ref, vn_ref, hs_ref, *, cfg):
    """Kernel 2 without the read-out: per chunk only Vn and S_C (what the next chunk needs).

    ``hs_ref``/``vn_ref`` may be ``None`` (not written): the segment-transition pass
    (:func:`_segment_transitions`) needs only the final states.
    """
    b, h = _program_bh(cfg, 0)
    v0 = pl.program_id(1) * cfg["block_v"]
    vsl = pl.ds(v0, cfg["block_v"])
    mdt = cfg["mm_dtype"]

    def body(n, state):
        tsl = pl.ds(n * CHUNK, CHUNK)
        if hs_ref is not None:
            hs_ref[b, h, n, :, vsl] = state.astype(hs_ref.dtype)
        k = k_ref[b, tsl, h, :]
        u = u_ref[b, tsl, h, vsl]
        gam = gam_ref[b, h, tsl]
        doc, conn, last = _load_docs(cfg, doc_ref, conn_ref, last_ref, b, tsl)
        _, e_out, e_all = _edge_decays(gam, doc, conn, last, cfg["decay"])
        if cfg["delta"]:
            vn = u.astype(F32) - mm(w_ref[b, tsl, h, :], state, mdt)
            if vn_ref is not None:
                vn_ref[b, tsl, h, vsl] = vn.astype(vn_ref.dtype)
        else:
            vn = u.astype(F32)
        return e_all * state + mm_tn(k.astype(F32) * e_out[:, None], vn, mdt)

    state = h0_ref[b, h, :, vsl].astype(F32)
    state = jax.lax.fori_loop(0, cfg["n_chunks"], body, state)
    ht_ref[b, h, :, vsl] = state


def _forward_output_kernel(q_ref, k_ref, vn_ref, gam_ref, doc_ref, conn_ref, last_ref, hs_ref,
                           o_ref, *, cfg):
    """O = scale [diag(e_in) Q S_0 + (Q K^T * D) Vn] of one chunk and value block."""
    n = pl.program_id(0)
    b, h = _program_bh(cfg, 1)
    bv = cfg["block_v_out"]
    vsl = pl.ds(pl.program_id(2) * bv, bv)
    tsl = pl.ds(n * CHUNK, CHUNK)
    mdt = cfg["mm_dtype"]
    q = q_ref[b, tsl, h, :]
    k = k_ref[b, tsl, h, :]
    vn = vn_ref[b, tsl, h, vsl]
    s0 = hs_ref[b, h, n, :, vsl]  # [K, BVO]
    gam = gam_ref[b, h, tsl]
    doc, conn, last = _load_docs(cfg, doc_ref, conn_ref, last_ref, b, tsl)
    dmat, e_in, _, _, _ = _decays(gam, doc, conn, last, cfg["decay"])
    attn = mm_nt(q, k, mdt) * dmat
    o = mm(q.astype(F32) * e_in[:, None], s0, mdt) + mm(attn, vn, mdt)
    o_ref[b, tsl, h, vsl] = (cfg["scale"] * o).astype(o_ref.dtype)


def _forward_split(cfg, q, k, u, w, gam, docs, h0):
    """:func:`_forward` as two kernels; always returns Vn and the entry states (O needs them).

    Without the delta rule Vn = U = V, so nothing is written for it.
    """
    bsz, tp, heads, dk = q.shape
    dv = u.shape[-1]
    nc = cfg["n_chunks"]
    outs = _pallas(
        _forward_state_kernel, cfg,
        inputs=[("k_ref", k), ("u_ref", u), ("w_ref", w), ("gam_ref", gam)]
        + _doc_inputs(docs) + [("h0_ref", h0)],
        outputs=[
            ("ht_ref", jax.ShapeDtypeStruct((bsz, heads, dk, dv), F32)),
            ("vn_ref", jax.ShapeDtypeStruct((bsz, tp, heads, dv), u.dtype)
             if cfg["delta"] else None),
            ("hs_ref", jax.ShapeDtypeStruct((bsz, heads, nc, dk, dv), cfg["mm_dtype"])),
        ],
        grid=(bsz * heads, dv // cfg["block_v"]), tune="forward_state",
        name="gdn_forward_state",
    )
    vn = outs["vn_ref"] if cfg["delta"] else u
    hs = outs["hs_ref"]
    o = _pallas(
        _forward_output_kernel, cfg,
        inputs=[("q_ref", q), ("k_ref", k), ("vn_ref", vn), ("gam_ref", gam)]
        + _doc_inputs(docs) + [("hs_ref", hs)],
        outputs=[("o_ref", jax.ShapeDtypeStruct((bsz, tp, heads, dv), u.dtype))],
        grid=(nc, bsz * heads, dv // cfg["block_v_out"]), tune="forward_output",
        name="gdn_forward_output",
    )["o_ref"]
    return o, outs["ht_ref"], vn, hs


# ----------------------------------------------------------------------------------------------
# Sequence parallelism (segments): the state passes of one long row split into P segments.


def _segment_transitions(cfg, k, u, w, gam, docs):
    """Each segment's affine state map ``S_exit = M S_entry + X`` (fp32 ``[B', H, K, K + V]``).

    The chunk update is linear in the entry state: ``S_C = M_n S_0 + X_n`` with
    ``M_n = e_all I - (diag(e_out) K)^T W`` and ``X_n = (diag(e_out) K)^T U`` (module
    docstring; ``M_n = e_all I`` without the delta rule). The state columns evolve
    independently, so the forward state kernel run from ``[I | 0]`` on the inputs ``[0 | U]``
    (K zero value columns in front of U) ends each segment (a row of the pseudo-batch) with
    ``[M | X]``, the products of its chunks' maps, in one pass.
    """
    bsz, tp, heads, dk = k.shape
    dv = u.shape[-1]
    width = dk + dv
    u_ext = jnp.concatenate([jnp.zeros(u.shape[:-1] + (dk,), u.dtype), u], axis=-1)
    eye = jnp.broadcast_to(jnp.eye(dk, dtype=F32), (bsz, heads, dk, dk))
    h0_ext = jnp.concatenate([eye, jnp.zeros((bsz, heads, dk, dv), F32)], axis=-1)
    cfg_ext = dict(cfg, dv=width, block_v=min(64, width))
    outs = _pallas(
        _forward_state_kernel, cfg_ext,
        inputs=[("k_ref", k), ("u_ref", u_ext), ("w_ref", w), ("gam_ref", gam)]
        + _doc_inputs(docs) + [("h0_ref", h0_ext)],
        outputs=[("ht_ref", jax.ShapeDtypeStruct((bsz, heads, dk, width), F32)),
                 ("vn_ref", None), ("hs_ref", None)],
        grid=(bsz * heads, width // cfg_ext["block_v"]), tune="forward_state",
        name="gdn_segment_transitions",
    )
    return outs["ht_ref"]


def _segments_view(x, segments):
    """``[B * P, ...]`` pseudo-batch rows -> ``[P, B, ...]`` (segment-major, for ``lax.scan``)."""
    return jnp.moveaxis(x.reshape((-1, segments) + x.shape[1:]), 1, 0)


def _rows_view(x):
    """Inverse of :func:`_segments_view`: ``[P, B, ...]`` -> ``[B * P, ...]``."""
    x = jnp.moveaxis(x, 0, 1)
    return x.reshape((-1,) + x.shape[2:])


def _bmm(a, b):
    return jnp.einsum("bhij,bhjv->bhiv", a, b, precision=jax.lax.Precision.HIGHEST)


def _segment_entry_states(trans, h0, segments):
    """Entry state of every segment (``[B * P, H, K, V]`` fp32) from the maps and ``h0``.

    ``S_(p+1) = M_p S_p + X_p`` with ``S_0 = h0``: a ``lax.scan`` over the P segments of
    batched fp32 products (P is small; the chunks inside the segments ran in parallel).
    """
    dk = h0.shape[-2]
    trans = _segments_view(trans, segments)  # [P, B, H, K, K + V]

    def step(state, mx):
        return _bmm(mx[..., :dk], state) + mx[..., dk:], state

    last, entries = jax.lax.scan(step, h0, trans[:-1])  # S_0 .. S_(P-2); S_(P-1)
    return _rows_view(jnp.concatenate([entries, last[None]], axis=0))


def _segment_exit_grads(trans, y, dht, segments):
    """Exit-state gradient of every segment (``[B * P, H, K, V]`` fp32), the reverse combine.

    A segment maps its exit gradient to its entry gradient by ``dS_entry = M^T dS_exit + Y``,
    where ``Y`` is the reverse pass's result from a zero exit gradient (:func:`_backward_state`
    with ``state_only``). Segment p's exit gradient is segment p+1's entry gradient, and the
    last one's is ``dht``.
    """
    dk = dht.shape[-2]
    trans = _segments_view(trans, segments)
    y = _segments_view(y, segments)

    def step(dstate, my):
        m, yp = my
        return jnp.einsum("bhji,bhjv->bhiv", m, dstate,
                          precision=jax.lax.Precision.HIGHEST) + yp, dstate

    # Outputs: the exit gradients of segments 1 .. P-1; carry: segment 0's.
    first, exits = jax.lax.scan(step, dht, (trans[1:, ..., :dk], y[1:]), reverse=True)
    return _rows_view(jnp.concatenate([first[None], exits], axis=0))


# ----------------------------------------------------------------------------------------------
# Kernel 3: the reverse state pass.


def _backward_state_kernel(q_ref, k_ref, w_ref, do_ref, dvn_in_ref, gam_ref, doc_ref, conn_ref,
                           last_ref, dht_ref, dvn_ref, dhs_ref, dh0_ref, *, cfg):
    b, h = _program_bh(cfg, 0)
    v0 = pl.program_id(1) * cfg["block_v"]
    vsl = pl.ds(v0, cfg["block_v"])
    mdt = cfg["mm_dtype"]
    scale = cfg["scale"]
    nc = cfg["n_chunks"]

    def body(i, dstate):
        n = nc - 1 - i
        tsl = pl.ds(n * CHUNK, CHUNK)
        if dhs_ref is not None:
            dhs_ref[b, h, n, :, vsl] = dstate.astype(dhs_ref.dtype)
        q = q_ref[b, tsl, h, :]
        k = k_ref[b, tsl, h, :]
        do = do_ref[b, tsl, h, vsl]
        gam = gam_ref[b, h, tsl]
        doc, conn, last = _load_docs(cfg, doc_ref, conn_ref, last_ref, b, tsl)
        dmat, e_in, e_out, e_all, _ = _decays(gam, doc, conn, last, cfg["decay"])
        attn = mm_nt(q, k, mdt) * dmat
        dvn = scale * mm_tn(attn, do, mdt) + mm(k.astype(F32) * e_out[:, None], dstate, mdt)
        if dvn_in_ref is not None:
            dvn = dvn + dvn_in_ref[b, tsl, h, vsl].astype(F32)
        if dvn_ref is not None:
            dvn_ref[b, tsl, h, vsl] = dvn.astype(dvn_ref.dtype)
        dnew = e_all * dstate + scale * mm_tn(q.astype(F32) * e_in[:, None], do, mdt)
        if cfg["delta"]:
            dnew = dnew - mm_tn(w_ref[b, tsl, h, :], dvn, mdt)
        return dnew

    dstate = dht_ref[b, h, :, vsl].astype(F32)
    dstate = jax.lax.fori_loop(0, nc, body, dstate)
    dh0_ref[b, h, :, vsl] = dstate


def _backward_state(cfg, q, k, w, do, dvn_in, gam, docs, dht, *, state_only=False):
    """The reverse pass; ``state_only`` writes only dS_0 (the segments' backward transitions)."""
    bsz, tp, heads, dk = q.shape
    dv = do.shape[-1]
    dhs = jax.ShapeDtypeStruct((bsz, heads, cfg["n_chunks"], dk, dv), cfg["mm_dtype"])
    dvn = jax.ShapeDtypeStruct((bsz, tp, heads, dv), cfg["mm_dtype"])
    outs = _pallas(
        _backward_state_kernel, cfg,
        inputs=[("q_ref", q), ("k_ref", k), ("w_ref", w), ("do_ref", do),
                ("dvn_in_ref", dvn_in), ("gam_ref", gam)] + _doc_inputs(docs)
        + [("dht_ref", dht)],
        outputs=[
            ("dvn_ref", None if state_only else dvn),
            ("dhs_ref", None if state_only else dhs),
            ("dh0_ref", jax.ShapeDtypeStruct((bsz, heads, dk, dv), F32)),
        ],
        grid=(bsz * heads, dv // cfg["block_v"]), tune="backward_state", name="gdn_backward_state",
    )
    return outs.get("dvn_ref"), outs.get("dhs_ref"), outs["dh0_ref"]


# ----------------------------------------------------------------------------------------------
# Kernel 4: per-chunk parameter gradients.


def _backward_chunk_kernel(q_ref, k_ref, v_ref, beta_ref, gam_ref, doc_ref, conn_ref, last_ref,
                           a_ref, hs_ref, dhs_ref, do_ref, vn_ref, dvn_ref,
                           dq_ref, dk_ref, dv_ref, dbeta_ref, dgam_ref, *, cfg):
    """Parameter gradients of one chunk for one block of key channels (grid axis 2).

    With R = Vb - Kb S_0 we have Vn = A R, so dR = A^T dVn, dVb = dR, dKb = -dR S_0^T and
    dL = -A^T dA A^T = -strict_tril(dR Vn^T): no product with A beyond A^T dVn is needed.
    Every product that contracts over the value channels (dO S_0^T, dO Vn^T, Vn dS_C^T,
    dR S_0^T, dR Vn^T) is accumulated over value tiles of :data:`GRAD_BLOCK_V` columns in a
    loop, so the program holds [C, BK] and [C, C] accumulators plus one tile of each operand,
    never a whole [C, V] or [K, V] block (register pressure: the one-shot form spilled
    heavily and serialised the wgmma instructions). The [C, C] matrices (dO Vn^T, dR Vn^T,
    Q K^T, K K^T) are recomputed by every key block; dbeta and d gamma are written as
    per-key-block partial sums (``dbeta_ref``/``dgam_ref`` have a key-block axis) that XLA adds.
    The value-side outputs (dv and its dbeta term) come from key block 0.
    """
    n = pl.program_id(0)
    b, h = _program_bh(cfg, 1)
    kb_id = pl.program_id(2)
    first = kb_id == 0
    bk = cfg["block_k"]
    bv = cfg["block_v_grad"]
    ksl = pl.ds(kb_id * bk, bk)
    tsl = pl.ds(n * CHUNK, CHUNK)
    mdt = cfg["mm_dtype"]
    scale = cfg["scale"]
    delta = cfg["delta"]
    decay = cfg["decay"]
    beta = beta_ref[b, h, tsl] if delta else None
    amat = a_ref[b, h, n, :, :] if delta else None  # [C, C], operand dtype

    def value_tile(j, acc):
        vsl = pl.ds(j * bv, bv)
        do = do_ref[b, tsl, h, vsl]
        vn = vn_ref[b, tsl, h, vsl]
        s0 = hs_ref[b, h, n, ksl, vsl]  # [BK, BV]
        ds_c = dhs_ref[b, h, n, ksl, vsl]
        acc = dict(acc)
        acc["do_s0"] = acc["do_s0"] + mm_nt(do, s0, mdt)  # dO S_0^T  [C, BK]
        acc["dp"] = acc["dp"] + mm_nt(do, vn, mdt)  # dO Vn^T  [C, C]
        acc["vn_ds"] = acc["vn_ds"] + mm_nt(vn, ds_c, mdt)  # Vn dS_C^T  [C, BK]
        if decay:
            acc["de_all"] = acc["de_all"] + jnp.sum(s0.astype(F32) * ds_c.astype(F32))
        dvn = dvn_ref[b, tsl, h, vsl]
        if delta:
            dr = mm_tn(amat, dvn, mdt)  # A^T dVn  [C, BV]
            acc["dr_s0"] = acc["dr_s0"] + mm_nt(dr, s0, mdt)  # = -dKb  [C, BK]
            acc["dr_vn"] = acc["dr_vn"] + mm_nt(dr, vn, mdt)  # [C, C]
            acc["v_dr"] = acc["v_dr"] + jnp.sum(v_ref[b, tsl, h, vsl].astype(F32) * dr, axis=1)

            @pl.when(first)
            def _():
                dv_ref[b, tsl, h, vsl] = (dr * beta[:, None]).astype(dv_ref.dtype)
        else:
            @pl.when(first)
            def _():
                dv_ref[b, tsl, h, vsl] = dvn.astype(dv_ref.dtype)
        return acc

    c = CHUNK
    acc = dict(do_s0=jnp.zeros((c, bk), F32), dp=jnp.zeros((c, c), F32),
               vn_ds=jnp.zeros((c, bk), F32))
    if decay:
        acc["de_all"] = jnp.zeros((), F32)
    if delta:
        acc.update(dr_s0=jnp.zeros((c, bk), F32), dr_vn=jnp.zeros((c, c), F32),
                   v_dr=jnp.zeros((c,), F32))
    acc = jax.lax.fori_loop(0, cfg["dv"] // bv, value_tile, acc)

    gam = gam_ref[b, h, tsl]
    doc, conn, last = _load_docs(cfg, doc_ref, conn_ref, last_ref, b, tsl)
    dmat, e_in, e_out, e_all, mask = _decays(gam, doc, conn, last, cfg["decay"])
    q_blk = q_ref[b, tsl, h, ksl]
    k_blk = k_ref[b, tsl, h, ksl]
    kf = k_blk.astype(F32)

    # Read-out O = scale [diag(e_in) Q S_0 + (Q K^T * D) Vn]. The [C, C] terms of d gamma
    # (through D) are reduced to row and column sums as soon as they are formed, and count in
    # key block 0 only (Q K^T and K K^T are over the whole K there).
    # Without decay (g = 0) nothing flows to gamma: the d gamma terms are skipped.
    do_s0 = acc["do_s0"]
    dpd = (scale * acc["dp"]) * dmat
    dq = scale * e_in[:, None] * do_s0 + mm(dpd, k_blk, mdt)
    dq_ref[b, tsl, h, ksl] = dq.astype(dq_ref.dtype)
    dk = mm_tn(dpd, q_blk, mdt)
    if decay:
        de_in = scale * jnp.sum(q_blk.astype(F32) * do_s0, axis=1)
        m = dpd * mm_nt(q_ref[b, tsl, h, :], k_ref[b, tsl, h, :], mdt)  # dD * D, read-out
        m_rows, m_cols = jnp.sum(m, axis=1), jnp.sum(m, axis=0)

    # State update S_C = e_all S_0 + (diag(e_out) K)^T Vn.
    vn_ds = acc["vn_ds"]
    dk = dk + e_out[:, None] * vn_ds

    if delta:
        dr_s0 = acc["dr_s0"]
        kb_grad = jnp.sum(kf * dr_s0, axis=1)
        dk = dk - (beta * e_in)[:, None] * dr_s0
        dbeta = -e_in * kb_grad
        rows, cols = _iota(mask.shape, 0), _iota(mask.shape, 1)
        dld = jnp.where(mask & (rows > cols), -acc["dr_vn"], 0.0) * dmat  # dL * D
        gmat = beta[:, None] * dld
        dk = dk + mm(gmat, k_blk, mdt) + mm_tn(gmat, k_blk, mdt)
        # L = strict(diag(beta) (K K^T) * D): dbeta and dD (-> d gamma) through K K^T.
        t = dld * mm_nt(k_ref[b, tsl, h, :], k_ref[b, tsl, h, :], mdt)
        t_rows = jnp.sum(t, axis=1)
        if decay:
            de_in = de_in - beta * kb_grad
            m_rows = m_rows + beta * t_rows
            m_cols = m_cols + jnp.sum(beta[:, None] * t, axis=0)
        dbeta = dbeta + jnp.where(first, acc["v_dr"] + t_rows, 0.0)
        dbeta_ref[b, h, kb_id, tsl] = dbeta

    dk_ref[b, tsl, h, ksl] = dk.astype(dk_ref.dtype)
    if not decay:
        return

    # Decay factors -> gamma: d exp(x) = exp(x) dx.
    de_out = jnp.sum(kf * vn_ds, axis=1)
    is_last = _iota((c,), 0) == c - 1
    dgam = jnp.where(first, m_rows - m_cols, 0.0) + de_in * e_in - de_out * e_out
    dgam = dgam + jnp.where(is_last, jnp.sum(de_out * e_out) + acc["de_all"] * e_all, 0.0)
    dgam_ref[b, h, kb_id, tsl] = dgam


def _backward_chunk(cfg, q, k, v, beta, gam, docs, amat, hs, dhs, do, vn, dvn):
    bsz, tp, heads, dk = q.shape
    dv = v.shape[-1]
    delta = cfg["delta"]
    nk = dk // cfg["block_k"]
    outs = _pallas(
        _backward_chunk_kernel, cfg,
        inputs=[("q_ref", q), ("k_ref", k), ("v_ref", v), ("beta_ref", beta if delta else None),
                ("gam_ref", gam)] + _doc_inputs(docs)
        + [("a_ref", amat), ("hs_ref", hs), ("dhs_ref", dhs), ("do_ref", do), ("vn_ref", vn),
           ("dvn_ref", dvn)],
        outputs=[
            ("dq_ref", jax.ShapeDtypeStruct((bsz, tp, heads, dk), q.dtype)),
            ("dk_ref", jax.ShapeDtypeStruct((bsz, tp, heads, dk), k.dtype)),
            ("dv_ref", jax.ShapeDtypeStruct((bsz, tp, heads, dv), v.dtype)),
            ("dbeta_ref", jax.ShapeDtypeStruct((bsz, heads, nk, tp), F32) if delta else None),
            ("dgam_ref", jax.ShapeDtypeStruct((bsz, heads, nk, tp), F32)
             if cfg["decay"] else None),
        ],
        grid=(cfg["n_chunks"], bsz * heads, nk), tune="backward_chunk",
        name="gdn_backward_chunk",
    )
    dbeta = outs["dbeta_ref"].sum(axis=2) if delta else None
    # Without decay gamma is the caller's constant zeros: its cotangent is zero.
    dgam = outs["dgam_ref"].sum(axis=2) if cfg["decay"] else jnp.zeros_like(gam)
    return outs["dq_ref"], outs["dk_ref"], outs["dv_ref"], dbeta, dgam


# ----------------------------------------------------------------------------------------------
# custom_vjp wiring.


@functools.lru_cache(maxsize=None)
def _make_core(static):
    """Builds the ``custom_vjp`` op for one static configuration (cached)."""
    cfg = dict(static)
    delta = cfg["delta"]
    residual = cfg["return_residual"]

    segments = cfg["segments"]

    def forward(q, k, v, gam, beta, h0, docs, *, save):
        w = amat = maps = None
        if delta:
            w, u, amat = _prepare(cfg, k, v, beta, gam, docs)
        else:
            u = v
        entry = h0
        if segments > 1:  # rows of the pseudo-batch are segments: find their entry states
            trans = _segment_transitions(cfg, k, u, w, gam, docs)
            entry = _segment_entry_states(trans, h0, segments)
            maps = trans[..., :cfg["dk"]]
        if cfg["split_forward"]:
            o, ht, vn, hs = _forward_split(cfg, q, k, u, w, gam, docs, entry)
        else:
            o, ht, vn, hs = _forward(cfg, q, k, u, w, gam, docs, entry,
                                     save_vn=save or residual, save_states=save)
        if segments > 1:
            ht = _segments_view(ht, segments)[-1]  # the last segment's exit state
        return o, ht, vn, hs, w, amat, maps

    @jax.custom_vjp
    def core(q, k, v, gam, beta, h0, docs):
        o, ht, vn, _, _, _, _ = forward(q, k, v, gam, beta, h0, docs, save=False)
        return (o, ht, vn) if residual else (o, ht)

    def core_fwd(q, k, v, gam, beta, h0, docs):
        o, ht, vn, hs, w, amat, maps = forward(q, k, v, gam, beta, h0, docs, save=True)
        out = (o, ht, vn) if residual else (o, ht)
        return out, (q, k, v, gam, beta, docs, w, amat, hs, vn, maps)

    def core_bwd(res, cts):
        q, k, v, gam, beta, docs, w, amat, hs, vn, maps = res
        do, dht = cts[0], cts[1]
        dvn_out = cts[2] if residual else None
        dht_rows = dht
        if segments > 1:  # each segment's exit-state gradient, then the reverse pass per row
            zero = jnp.zeros((q.shape[0],) + dht.shape[1:], F32)
            _, _, y = _backward_state(cfg, q, k, w, do.astype(q.dtype), dvn_out, gam, docs,
                                      zero, state_only=True)
            dht_rows = _segment_exit_grads(maps, y, dht.astype(F32), segments)
        dvn, dhs, dh0 = _backward_state(cfg, q, k, w, do.astype(q.dtype), dvn_out, gam, docs,
                                        dht_rows)
        if segments > 1:
            dh0 = _segments_view(dh0, segments)[0]
        dq, dk, dv, dbeta, dgam = _backward_chunk(
            cfg, q, k, v, beta, gam, docs, amat, hs, dhs, do.astype(q.dtype), vn, dvn
        )
        dbeta = jnp.zeros_like(beta) if dbeta is None else dbeta
        ddocs = tuple(None for _ in docs)
        return (dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), dgam, dbeta, dh0,
                ddocs)

    core.defvjp(core_fwd, core_bwd)
    return core


def scalar_decay_pallas(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: Optional[jax.Array],
    beta: Optional[jax.Array],
    *,
    scale: float,
    initial_state: Optional[jax.Array] = None,
    segment_ids: Optional[jax.Array] = None,
    return_residual: bool = True,
    interpret: bool = False,
) -> Tuple[jax.Array, jax.Array, Optional[jax.Array]]:
    """Runs the scalar-decay family on the Pallas GPU kernels (module docstring).

    ``beta=None`` switches the delta rule off (simple GLA / Lightning / linear attention:
    ``S_t = exp(g_t) S_{t-1} + k_t v_t^T``); ``g=None`` means no decay (DeltaNet, linear
    attention). Gradients w.r.t. q, k, v, g, beta and ``initial_state`` come from the kernels'
    ``custom_vjp``.

    Args:
      q: queries ``[B, T, H, K]`` (already expanded to the value heads), bf16/fp16/fp32.
      k: keys ``[B, T, H, K]``, same dtype as q.
      v: values ``[B, T, H, V]``, same dtype as q.
      g: log-decay ``[B, T, H]`` (natural log, ``<= 0``) or ``None``.
      beta: write strengths ``[B, T, H]`` or ``None`` (no delta rule).
      scale: read-out scale.
      initial_state: ``[B, H, K, V]`` (fp32) or ``None`` for zeros.
      segment_ids: optional int ``[B, T]``; the state resets where the id changes.
      return_residual: whether to compute the residual ``u`` (``v_new``).
      interpret: run in Pallas interpret mode (any backend; slow).

    Returns:
      ``(o [B, T, H, V] in v.dtype, final_state [B, H, K, V] fp32, u [B, T, H, V] or None)``.

    Raises:
      ValueError: if K or V is not 64 or 128 (the caller dispatches those to the chunked form).
    """
    from pallas_kernels import common

    bsz, seq_len, heads, dk = q.shape
    dv = v.shape[-1]
    if dk not in pallas_gpu.SUPPORTED_HEAD_DIMS or dv not in pallas_gpu.SUPPORTED_HEAD_DIMS:
        raise ValueError(f"the Pallas kernels support head dims {pallas_gpu.SUPPORTED_HEAD_DIMS},"
                         f" got K={dk}, V={dv}")
    mdt = pallas_gpu.matmul_dtype(q, k, v)
    q, k, v = q.astype(mdt), k.astype(mdt), v.astype(mdt)
    segments = num_segments(bsz, heads, dv, -(-seq_len // CHUNK))
    # Padding is inert (k = v = 0, g = 0): it only extends the last segment's exit.
    padded = -(-seq_len // (CHUNK * segments)) * CHUNK * segments
    n_chunks = padded // CHUNK
    rows = bsz * segments  # the pseudo-batch: each row one segment of T / P tokens

    def to_rows(x):  # [B, Tp, ...] -> [B * P, Tp / P, ...] (a free reshape)
        x = common.pad_time(x, padded)
        return x.reshape((rows, padded // segments) + x.shape[2:])

    q, k, v = (to_rows(x) for x in (q, k, v))
    tr = padded // segments
    if g is None:
        gam = jnp.zeros((rows, heads, tr), F32)
    else:
        gpad = to_rows(g.astype(F32))  # [B * P, Tp / P, H]
        gam = jnp.cumsum(gpad.reshape(rows, tr // CHUNK, CHUNK, heads), axis=2)
        gam = jnp.transpose(gam.reshape(rows, tr, heads), (0, 2, 1))  # [B * P, H, Tp / P]
    delta = beta is not None
    if delta:
        beta_t = jnp.transpose(to_rows(beta.astype(F32)), (0, 2, 1))
    else:
        beta_t = jnp.zeros((rows, heads, tr), F32)
    if initial_state is None:
        initial_state = jnp.zeros((bsz, heads, dk, dv), F32)
    h0 = initial_state.astype(F32)
    docs = ()
    if segment_ids is not None:  # masks from the whole rows, so segments see their neighbours
        docs = tuple(x.reshape(rows, tr) for x in _docs_from_segment_ids(segment_ids, padded))
    static = tuple(sorted(_config(
        batch=rows, heads=heads, n_chunks=n_chunks // segments, dk=dk, dv=dv,
        scale=float(scale), delta=delta, decay=g is not None, has_docs=segment_ids is not None,
        mm_dtype=mdt,
        interpret=interpret, return_residual=return_residual, segments=segments,
    ).items()))
    outs = _make_core(static)(q, k, v, gam, beta_t, h0, docs)

    def from_rows(x):  # [B * P, Tp / P, ...] -> [B, T, ...]
        return x.reshape((bsz, padded) + x.shape[2:])[:, :seq_len]

    u = from_rows(outs[2]) if return_residual else None
    return from_rows(outs[0]), outs[1], u
