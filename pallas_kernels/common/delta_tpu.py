"""Chunked Pallas TPU (Mosaic) kernels shared by the delta-rule family: GDN, DeltaNet, KDA, GDN-2.

One generic recurrence covers every variant (paper arXiv 2607.07953, Sec. 3.2, Eqs. 14-24),
with a read key ``kr``, a write value ``vw`` and a log-decay g that is either scalar per token
(GDN, DeltaNet: ``g = 0``) or per key channel (KDA, GDN-2)::

    S~_t = Diag(exp g_t) S_{t-1},  u_t = vw_t - S~_t^T kr_t,  S_t = S~_t + k_t u_t^T,
    o_t  = scale * S_t^T q_t.

GDN/DeltaNet/KDA use ``kr = beta k``, ``vw = beta v``; GDN-2 uses ``kr = b * k``, ``vw = w * v``.
With the delta rule off (``delta=False``: ``u_t = v_t``) it is simple GLA / Lightning.

Chunk form (C tokens per chunk, entry state S_0 in R^{K x V}, gamma the within-chunk cumsum of g
computed in fp32 by XLA; the same algebra as
``common/channelwise_chunked.py::channelwise_delta_chunked`` and the module docstring of
``gated_delta_rule/kernel_gpu.py``)::

    M_ij = sum_c kr_ic k_jc exp(gamma_ic - gamma_jc)          (j < i, same document)
    P_ij = scale sum_c q_ic k_jc exp(gamma_ic - gamma_jc)     (j <= i, same document)
    A    = (I + M)^{-1};   W = A (KR * e_in);   U = A VW       (delta rule only)
    Vn   = U - W S_0                                           (the residual u, "v_new")
    O    = Qin S_0 + P Vn,             Qin = scale Q * e_in
    S_C  = Diag(e_all) S_0 + Kout^T Vn, Kout = K * e_out

with ``e_in = exp(gamma_i)``, ``e_out = exp(gamma_C - gamma_i)``, ``e_all = exp(gamma_C)``, each
zeroed where a document boundary (segment ids) cuts the path.

Kernels (grid in brackets; ``P`` = parallel, ``A`` = arbitrary, i.e. sequential):

* ``prepare`` [B P, H P, N P]: per chunk, M, P, the triangular inverse A, W, U, Qin, Kout and
  e_all (all fp32 math). The intra-chunk matrices are matmuls on the MXU with every exponent
  ``<= 0``: for a per-channel decay, the pairs (i, j) in different 16-row sub-blocks use the
  last token r of j's sub-block as a reference point,
  ``exp(gamma_i - gamma_j) = exp(gamma_i - gamma_r) exp(gamma_r - gamma_j)`` (both factors
  ``<= 1``), one full ``[C, K] x [K, C]`` product per sub-block; pairs inside a diagonal 16 x 16
  sub-block use the elementwise ``[16, 16, K]`` form, placed into ``[C, C]`` by 0/1 selection
  matmuls (no lane-unaligned slicing). A scalar decay is one ``[C, C]`` mask. Exponents are
  masked (multiplied by a 0/1 mask) before ``exp``, so strong decay cannot overflow.
  ``(I + M)^{-1}`` is blocked over 16-row diagonal blocks, all matmuls
  (:func:`_unit_lower_inverse`).
* ``forward`` [B P, H P, V/BV P, N A]: the fp32 state ``[K, BV]`` lives in a VMEM scratch
  across the sequential chunk axis; writes O, Vn, the final state and each chunk's entry state.
* ``backward_state`` [B P, H P, V/BV P, N A]: the reverse pass (chunks visited N-1..0 by the
  index maps) with the fp32 state gradient in VMEM scratch::

      dVn = P^T dO + Kout dS_C (+ the cotangent of the returned residual)
      dS_0 = Diag(e_all) dS_C + Qin^T dO - W^T dVn

  writes dVn, each chunk's exit-state gradient dS_C and dh0.
* ``backward_chunk`` [B P, H P, N P]: the cotangents of the prepared tensors
  (dQin = dO S_0^T, dP = dO Vn^T, dW = -dVn S_0^T, dU = dVn, dKout = Vn dS_C^T,
  de_all = rowsum(S_0 * dS_C)), then pulled back to q, k, kr, vw and gamma by ``jax.vjp`` of the
  very function the prepare kernel runs (:func:`_prepare_chunk`), traced inside the kernel: the
  gradient is the exact derivative of the forward's math, with no separately derived formulae.

Numerics: states, decays, the inverse and all accumulations are fp32; the state-pass products
take bf16 operands when q, k, v are bf16 (fp32 accumulation), fp32 at ``Precision.HIGHEST``
otherwise. Layout: the wrapper transposes ``[B, T, H, X]`` to ``[B, H, T, X]`` so every block is
a ``[C, X]`` tile (C a multiple of 8, X = 64 or 128 = the full dim); 1-D per-token vectors travel
as ``[.., C, 1]`` columns or ``[.., 1, C]`` rows (last two block dims equal the array dims).

The gradients w.r.t. the gates (beta, b, w, g) come from XLA autodiff of the cheap elementwise
maps outside the custom VJP (``kr = beta k``, the chunk cumsum of g, transposes, padding).
"""

import functools
from typing import Optional, Tuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.common import pallas_tpu, validation
from pallas_kernels.common.pallas_tpu import mm, mm_nt, mm_tn

F32 = jnp.float32
SUB = 16  # rows of the diagonal sub-blocks (inverse and per-channel decay)


def _iota(shape, dim):
    return jax.lax.broadcasted_iota(jnp.int32, shape, dim)


def _unit_lower_inverse(strict: jax.Array) -> jax.Array:
    """``(I + L)^{-1}`` of a strictly lower ``[C, C]`` fp32 matrix, by whole-tile matmuls.

    With L = L_d + L_o (16 x 16 block-diagonal and strictly block-lower parts):
    ``X_d = (I + L_d)^{-1} = (I - L_d)(I + L_d^2)(I + L_d^4)(I + L_d^8)`` (L_d^16 = 0), refined
    by one Newton step ``X_d <- X_d - X_d ((I + L_d) X_d - I)``; then ``N = X_d L_o`` is
    nilpotent of index C/16 and ``(I + L)^{-1} = (I - N)(I + N^2)(I + N^4)... X_d``. Every
    identity holds for all strictly lower L, so autodiff of this function is the exact
    derivative ``-A dL A`` up to rounding.
    """
    c = strict.shape[0]
    rows, cols = _iota((c, c), 0), _iota((c, c), 1)
    eye = jnp.where(rows == cols, 1.0, 0.0).astype(F32)
    same_block = jax.lax.div(rows, SUB) == jax.lax.div(cols, SUB)  # no jnp // (sign op)
    ld = jnp.where(same_block, strict, 0.0)
    lo = strict - ld
    x = eye - ld
    p = mm(ld, ld)
    for _ in range(3):
        x = x + mm(x, p)
        p = mm(p, p)
    x = x - mm(x, x + mm(ld, x) - eye)
    nmat = mm(x, lo)
    y = eye - nmat
    p = mm(nmat, nmat)
    power = 2
    while power < c // SUB:
        y = y + mm(y, p)
        p = mm(p, p)
        power *= 2
    return mm(y, x)


def _channel_pair_matrices(q, k, kr, gam, delta):
    """Unmasked ``sum_c x_ic k_jc exp(gamma_ic - gamma_jc)`` for x = q and x = kr, j <= i.

    ``gam [C, K]`` is non-increasing in time. Entries with j > i are garbage-free zeros or
    values the caller masks. Returns ``(P_raw [C, C], M_raw [C, C] or None)``.
    """
    c, dk = k.shape
    rows = _iota((c, 1), 0)
    p_raw = jnp.zeros((c, c), F32)
    m_raw = jnp.zeros((c, c), F32) if delta else None
    # Pairs in different sub-blocks: reference point r = the last token of j's sub-block.
    for blk in range(c // SUB - 1):
        end = (blk + 1) * SUB
        ref = gam[end - 1:end, :]  # [1, K]
        after = (rows >= end).astype(F32)  # [C, 1]: rows i past the sub-block
        inside = ((rows >= end - SUB) & (rows < end)).astype(F32)  # [C, 1]: rows j in it
        left = jnp.exp((gam - ref) * after) * after  # [C, K], exponent <= 0
        right = jnp.exp((ref - gam) * inside) * inside * k  # [C, K], exponent <= 0
        p_raw = p_raw + mm_nt(q * left, right)
        if delta:
            m_raw = m_raw + mm_nt(kr * left, right)
    # Pairs inside one diagonal sub-block: elementwise [SUB, SUB, K], placed by selection.
    ii = _iota((SUB, SUB, 1), 0)
    jj = _iota((SUB, SUB, 1), 1)
    lower = (ii >= jj).astype(F32)  # [SUB, SUB, 1]
    for blk in range(c // SUB):
        sl = slice(blk * SUB, (blk + 1) * SUB)
        g_b, k_b = gam[sl], k[sl]  # [SUB, K]
        diff = (g_b[:, None, :] - g_b[None, :, :]) * lower  # [SUB, SUB, K], <= 0 where kept
        kdec = jnp.exp(diff) * k_b[None, :, :]  # [SUB, SUB, K]
        sel = (_iota((SUB, c), 1) == _iota((SUB, c), 0) + blk * SUB).astype(F32)  # [SUB, C]
        p_b = jnp.sum(q[sl][:, None, :] * kdec, axis=-1)  # [SUB, SUB]
        p_raw = p_raw + mm_tn(sel, mm(p_b, sel))
        if delta:
            m_b = jnp.sum(kr[sl][:, None, :] * kdec, axis=-1)
            m_raw = m_raw + mm_tn(sel, mm(m_b, sel))
    return p_raw, m_raw


def _prepare_chunk(q, k, kr, vw, gam_a, gam_b, doc_col, doc_row, conn, last, *, scale,
                   channelwise, delta):
    """The intra-chunk math of one chunk (module docstring), fp32; runs inside the kernels.

    Args:
      q, k: ``[C, K]``; kr: ``[C, K]`` or None (no delta rule); vw: ``[C, V]``.
      gam_a: ``[C, K]`` (per-channel decay) or ``[C, 1]`` (scalar decay, a column);
      gam_b: ``[1, C]`` (the same scalar cumsum as a row) or None.
      doc_col ``[C, 1]``, doc_row ``[1, C]`` int32, conn/last ``[C, 1]`` fp32, or all None.

    Returns:
      ``(w [C, K] or None, u [C, V], p [C, C], qin [C, K], kout [C, K], e_all [1, K])``.
    """
    c, dk = k.shape
    q = q.astype(F32) * scale
    k = k.astype(F32)
    kr = kr.astype(F32) if delta else None
    vw = vw.astype(F32)
    gam_a = gam_a.astype(F32)
    rows, cols = _iota((c, c), 0), _iota((c, c), 1)
    incl = rows >= cols
    if doc_col is not None:
        incl = incl & (doc_col == doc_row)
    strict = incl & (rows > cols)
    g_last = gam_a[c - 1:c, :]  # [1, K] or [1, 1]
    e_in = jnp.exp(gam_a)  # [C, K] or [C, 1]
    e_out = jnp.exp(g_last - gam_a)
    e_all = jnp.exp(g_last)
    if doc_col is not None:
        e_in = e_in * conn
        e_out = e_out * last
        e_all = e_all * conn[c - 1:c, :]
    e_all = jnp.broadcast_to(e_all, (1, dk))
    if channelwise:
        p_raw, m_raw = _channel_pair_matrices(q, k, kr, gam_a, delta)
        p = jnp.where(incl, p_raw, 0.0)
        m = jnp.where(strict, m_raw, 0.0) if delta else None
    else:
        mask = incl.astype(F32)
        dmat = jnp.exp((gam_a - gam_b.astype(F32)) * mask) * mask  # [C, C]
        p = mm_nt(q, k) * dmat
        m = jnp.where(strict, mm_nt(kr, k) * dmat, 0.0) if delta else None
    if delta:
        amat = _unit_lower_inverse(m)
        w = mm(amat, kr * e_in)
        u = mm(amat, vw)
    else:
        w, u = None, vw
    return w, u, p, q * e_in, k * e_out, e_all


# ----------------------------------------------------------------------------------------------
# pallas_call plumbing.


def _spec(block, index_map):
    return pl.BlockSpec(block, index_map)


def _run(kernel, cfg, *, grid, semantics, inputs, outputs, scratch=(), name):
    """``pl.pallas_call`` with named, optional operands.

    Args:
      inputs: ``(name, array or None, BlockSpec)``; ``None`` arrays are not passed and the
        kernel receives ``None`` for that name.
      outputs: ``(name, ShapeDtypeStruct or None, BlockSpec)``.
      scratch: VMEM scratch shapes, passed last as ``scratch``.

    Returns:
      ``{name: array}`` of the produced outputs.
    """
    ins = [(n, a, s) for n, a, s in inputs if a is not None]
    outs = [(n, a, s) for n, a, s in outputs if a is not None]
    names = [n for n, _, _ in inputs] + [n for n, _, _ in outputs]
    given = [n for n, _, _ in ins] + [n for n, _, _ in outs]

    def wrapped(*refs):
        bound = dict(zip(given, refs[:len(given)]))
        kernel(**{n: bound.get(n) for n in names}, scratch=refs[len(given):], cfg=cfg)

    results = pl.pallas_call(
        wrapped,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=0, grid=grid,
            in_specs=[s for _, _, s in ins], out_specs=[s for _, _, s in outs],
            scratch_shapes=list(scratch)),
        out_shape=[a for _, a, _ in outs],
        compiler_params=pallas_tpu.compiler_params(semantics),
        interpret=cfg["interpret"],
        name=name,
    )(*[a for _, a, _ in ins])
    return dict(zip([n for n, _, _ in outs], results))


def _load(ref):
    return None if ref is None else ref[...]


def _chunk_specs(cfg, grid_rank):
    """BlockSpecs of the per-chunk inputs for a grid ``(b, h, n)`` or ``(b, h, j, n)``.

    In the reverse pass (``cfg["reverse_index"]``) the chunk index is ``N - 1 - n``.
    """
    c, dk, nc = cfg["chunk"], cfg["dk"], cfg["n_chunks"]

    def chunk_of(idx):
        n = idx[-1]
        return nc - 1 - n if cfg.get("reverse_index") else n

    def tok(width):  # [B, H, Tp, width] -> [C, width]
        return _spec((None, None, c, width), lambda *i: (i[0], i[1], chunk_of(i), 0))

    def tok_v(width):  # value blocks follow grid axis 2 when present
        if grid_rank == 4:
            return _spec((None, None, c, width), lambda *i: (i[0], i[1], chunk_of(i), i[2]))
        return tok(width)

    def per_chunk(a, b_):  # [B, H, N, a, b] -> [a, b]
        return _spec((None, None, None, a, b_), lambda *i: (i[0], i[1], chunk_of(i), 0, 0))

    docs = dict(
        doc_col=_spec((None, c, 1), lambda *i: (i[0], chunk_of(i), 0)),
        doc_row=_spec((None, None, 1, c), lambda *i: (i[0], chunk_of(i), 0, 0)),
        conn=_spec((None, c, 1), lambda *i: (i[0], chunk_of(i), 0)),
        last=_spec((None, c, 1), lambda *i: (i[0], chunk_of(i), 0)),
    )
    return dict(tok=tok, tok_v=tok_v, per_chunk=per_chunk, docs=docs,
                gam_a=tok(dk if cfg["channelwise"] else 1), gam_b=per_chunk(1, c))


def _doc_inputs(docs, specs):
    names = ("doc_col", "doc_row", "conn", "last")
    arrays = docs if docs else (None,) * 4
    return [(n, a, specs["docs"][n]) for n, a in zip(names, arrays)]


# ----------------------------------------------------------------------------------------------
# Kernel 1: prepare (parallel over chunks).


def _prepare_kernel(q, k, kr, vw, gam_a, gam_b, doc_col, doc_row, conn, last,
                    w_out, u_out, p_out, qin_out, kout_out, eall_out, *, scratch, cfg):
    del scratch
    w, u, p, qin, kout, e_all = _prepare_chunk(
        q[...], k[...], _load(kr), vw[...], gam_a[...], _load(gam_b), _load(doc_col),
        _load(doc_row), _load(conn), _load(last),
        scale=cfg["scale"], channelwise=cfg["channelwise"], delta=cfg["delta"])
    if w_out is not None:
        w_out[...] = w
    u_out[...] = u
    p_out[...] = p
    qin_out[...] = qin
    kout_out[...] = kout
    eall_out[...] = e_all


def _prepare(cfg, q, k, kr, vw, gam_a, gam_b, docs):
    bsz, heads, tp, dk = k.shape
    dv, c, nc = vw.shape[-1], cfg["chunk"], cfg["n_chunks"]
    sp = _chunk_specs(cfg, 3)
    sds = jax.ShapeDtypeStruct
    outs = _run(
        _prepare_kernel, cfg, grid=(bsz, heads, nc), semantics=("parallel",) * 3,
        inputs=[("q", q, sp["tok"](dk)), ("k", k, sp["tok"](dk)), ("kr", kr, sp["tok"](dk)),
                ("vw", vw, sp["tok"](dv)), ("gam_a", gam_a, sp["gam_a"]),
                ("gam_b", gam_b, sp["gam_b"])] + _doc_inputs(docs, sp),
        outputs=[
            ("w_out", sds((bsz, heads, tp, dk), F32) if cfg["delta"] else None, sp["tok"](dk)),
            ("u_out", sds((bsz, heads, tp, dv), F32), sp["tok"](dv)),
            ("p_out", sds((bsz, heads, nc, c, c), F32), sp["per_chunk"](c, c)),
            ("qin_out", sds((bsz, heads, tp, dk), F32), sp["tok"](dk)),
            ("kout_out", sds((bsz, heads, tp, dk), F32), sp["tok"](dk)),
            ("eall_out", sds((bsz, heads, nc, 1, dk), F32), sp["per_chunk"](1, dk)),
        ],
        name="delta_tpu_prepare",
    )
    return (outs.get("w_out"), outs["u_out"], outs["p_out"], outs["qin_out"], outs["kout_out"],
            outs["eall_out"])


# ----------------------------------------------------------------------------------------------
# Kernel 2: the sequential forward state pass.


def _forward_kernel(w, u, p, qin, kout, eall, h0, o_out, vn_out, hs_out, ht_out, *, scratch,
                    cfg):
    (state,) = scratch
    n = pl.program_id(3)
    mdt = cfg["mm_dtype"]

    @pl.when(n == 0)
    def _():
        state[...] = h0[...]

    s0 = state[...]
    hs_out[...] = s0
    vn = u[...]
    if w is not None:
        vn = vn - mm(w[...], s0, mdt)
    o_out[...] = (mm(qin[...], s0, mdt) + mm(p[...], vn, mdt)).astype(o_out.dtype)
    vn_out[...] = vn
    state[...] = eall[...] * s0 + mm_tn(kout[...], vn, mdt)

    @pl.when(n == cfg["n_chunks"] - 1)
    def _():
        ht_out[...] = state[...]


def _forward(cfg, w, u, p, qin, kout, eall_col, h0):
    bsz, heads, tp, dk = qin.shape
    dv, nc, bv = u.shape[-1], cfg["n_chunks"], cfg["block_v"]
    sp = _chunk_specs(cfg, 4)
    sds = jax.ShapeDtypeStruct
    state_spec = _spec((None, None, dk, bv), lambda b, h, j, n: (b, h, 0, j))
    hs_spec = _spec((None, None, None, dk, bv), lambda b, h, j, n: (b, h, n, 0, j))
    outs = _run(
        _forward_kernel, cfg, grid=(bsz, heads, dv // bv, nc),
        semantics=("parallel", "parallel", "parallel", "arbitrary"),
        inputs=[("w", w, sp["tok"](dk)), ("u", u, sp["tok_v"](bv)),
                ("p", p, sp["per_chunk"](cfg["chunk"], cfg["chunk"])),
                ("qin", qin, sp["tok"](dk)), ("kout", kout, sp["tok"](dk)),
                ("eall", eall_col, sp["per_chunk"](dk, 1)), ("h0", h0, state_spec)],
        outputs=[
            ("o_out", sds((bsz, heads, tp, dv), cfg["out_dtype"]), sp["tok_v"](bv)),
            ("vn_out", sds((bsz, heads, tp, dv), F32), sp["tok_v"](bv)),
            ("hs_out", sds((bsz, heads, nc, dk, dv), F32), hs_spec),
            ("ht_out", sds((bsz, heads, dk, dv), F32), state_spec),
        ],
        scratch=[pltpu.VMEM((dk, bv), F32)],
        name="delta_tpu_forward",
    )
    return outs["o_out"], outs["vn_out"], outs["hs_out"], outs["ht_out"]


# ----------------------------------------------------------------------------------------------
# Kernel 3: the reverse state pass.


def _backward_state_kernel(w, p, qin, kout, eall, do, dvn_in, dht, dvn_out, dhs_out, dh0_out, *,
                           scratch, cfg):
    (dstate,) = scratch
    n = pl.program_id(3)
    mdt = cfg["mm_dtype"]

    @pl.when(n == 0)
    def _():
        dstate[...] = dht[...]

    dsc = dstate[...]
    dhs_out[...] = dsc
    d_o = do[...]
    dvn = mm_tn(p[...], d_o, mdt) + mm(kout[...], dsc, mdt) + dvn_in[...].astype(F32)
    dvn_out[...] = dvn
    ds0 = eall[...] * dsc + mm_tn(qin[...], d_o, mdt)
    if w is not None:
        ds0 = ds0 - mm_tn(w[...], dvn, mdt)
    dstate[...] = ds0

    @pl.when(n == cfg["n_chunks"] - 1)
    def _():
        dh0_out[...] = dstate[...]


def _backward_state(cfg, w, p, qin, kout, eall_col, do, dvn_in, dht):
    bsz, heads, tp, dk = qin.shape
    dv, nc, bv = do.shape[-1], cfg["n_chunks"], cfg["block_v"]
    rcfg = dict(cfg, reverse_index=True)
    sp = _chunk_specs(rcfg, 4)
    sds = jax.ShapeDtypeStruct
    state_spec = _spec((None, None, dk, bv), lambda b, h, j, n: (b, h, 0, j))
    dhs_spec = _spec((None, None, None, dk, bv), lambda b, h, j, n: (b, h, nc - 1 - n, 0, j))
    outs = _run(
        _backward_state_kernel, cfg, grid=(bsz, heads, dv // bv, nc),
        semantics=("parallel", "parallel", "parallel", "arbitrary"),
        inputs=[("w", w, sp["tok"](dk)),
                ("p", p, sp["per_chunk"](cfg["chunk"], cfg["chunk"])),
                ("qin", qin, sp["tok"](dk)), ("kout", kout, sp["tok"](dk)),
                ("eall", eall_col, sp["per_chunk"](dk, 1)), ("do", do, sp["tok_v"](bv)),
                ("dvn_in", dvn_in, sp["tok_v"](bv)), ("dht", dht, state_spec)],
        outputs=[
            ("dvn_out", sds((bsz, heads, tp, dv), F32), sp["tok_v"](bv)),
            ("dhs_out", sds((bsz, heads, nc, dk, dv), F32), dhs_spec),
            ("dh0_out", sds((bsz, heads, dk, dv), F32), state_spec),
        ],
        scratch=[pltpu.VMEM((dk, bv), F32)],
        name="delta_tpu_backward_state",
    )
    return outs["dvn_out"], outs["dhs_out"], outs["dh0_out"]


# ----------------------------------------------------------------------------------------------
# Kernel 4: per-chunk gradients through the prepare math (parallel over chunks).


def _backward_chunk_kernel(q, k, kr, vw, gam_a, gam_b, doc_col, doc_row, conn, last, hs, dhs,
                           do, vn, dvn, dq_out, dk_out, dkr_out, dvw_out, dgam_a_out,
                           dgam_b_out, *, scratch, cfg):
    del scratch
    delta = cfg["delta"]
    mdt = cfg["mm_dtype"]
    s0, dsc = hs[...], dhs[...]  # [K, V] fp32
    d_o, vn_v, dvn_v = do[...].astype(F32), vn[...], dvn[...]
    docs = (_load(doc_col), _load(doc_row), _load(conn), _load(last))

    def prep(q_, k_, kr_, vw_, gam_a_, gam_b_):
        return _prepare_chunk(q_, k_, kr_, vw_, gam_a_, gam_b_, *docs, scale=cfg["scale"],
                              channelwise=cfg["channelwise"], delta=delta)

    primals = (q[...].astype(F32), k[...].astype(F32),
               kr[...].astype(F32) if delta else None, vw[...].astype(F32),
               gam_a[...], _load(gam_b))
    _, pullback = jax.vjp(prep, *primals)
    dv = s0.shape[1]
    ones_v = jnp.ones((1, dv), F32)
    cts = (
        -mm_nt(dvn_v, s0, mdt) if delta else None,  # dW
        dvn_v,  # dU
        mm_nt(d_o, vn_v, mdt),  # dP
        mm_nt(d_o, s0, mdt),  # dQin
        mm_nt(vn_v, dsc, mdt),  # dKout
        mm_nt(ones_v, s0 * dsc),  # de_all [1, K]
    )
    dq_, dk_, dkr_, dvw_, dgam_a_, dgam_b_ = pullback(cts)
    dq_out[...] = dq_.astype(dq_out.dtype)
    dk_out[...] = dk_.astype(dk_out.dtype)
    if dkr_out is not None:
        dkr_out[...] = dkr_.astype(dkr_out.dtype)
    dvw_out[...] = dvw_.astype(dvw_out.dtype)
    dgam_a_out[...] = dgam_a_
    if dgam_b_out is not None:
        dgam_b_out[...] = dgam_b_


def _backward_chunk(cfg, q, k, kr, vw, gam_a, gam_b, docs, hs, dhs, do, vn, dvn):
    bsz, heads, tp, dk = k.shape
    dv, nc = vw.shape[-1], cfg["n_chunks"]
    sp = _chunk_specs(cfg, 3)
    sds = jax.ShapeDtypeStruct
    state = sp["per_chunk"](dk, dv)
    outs = _run(
        _backward_chunk_kernel, cfg, grid=(bsz, heads, nc), semantics=("parallel",) * 3,
        inputs=[("q", q, sp["tok"](dk)), ("k", k, sp["tok"](dk)), ("kr", kr, sp["tok"](dk)),
                ("vw", vw, sp["tok"](dv)), ("gam_a", gam_a, sp["gam_a"]),
                ("gam_b", gam_b, sp["gam_b"])] + _doc_inputs(docs, sp)
        + [("hs", hs, state), ("dhs", dhs, state), ("do", do, sp["tok"](dv)),
           ("vn", vn, sp["tok"](dv)), ("dvn", dvn, sp["tok"](dv))],
        outputs=[
            ("dq_out", sds(q.shape, q.dtype), sp["tok"](dk)),
            ("dk_out", sds(k.shape, k.dtype), sp["tok"](dk)),
            ("dkr_out", sds(kr.shape, kr.dtype) if kr is not None else None, sp["tok"](dk)),
            ("dvw_out", sds(vw.shape, vw.dtype), sp["tok"](dv)),
            ("dgam_a_out", sds(gam_a.shape, F32), sp["gam_a"]),
            ("dgam_b_out", sds(gam_b.shape, F32) if gam_b is not None else None, sp["gam_b"]),
        ],
        name="delta_tpu_backward_chunk",
    )
    return (outs["dq_out"], outs["dk_out"], outs.get("dkr_out"), outs["dvw_out"],
            outs["dgam_a_out"], outs.get("dgam_b_out"))


# ----------------------------------------------------------------------------------------------
# custom_vjp wiring.


@functools.lru_cache(maxsize=None)
def _make_core(static):
    """The ``custom_vjp`` op on ``[B, H, Tp, X]`` operands for one static configuration."""
    cfg = dict(static)

    def forward(q, k, kr, vw, gam_a, gam_b, h0, docs):
        w, u, p, qin, kout, eall = _prepare(cfg, q, k, kr, vw, gam_a, gam_b, docs)
        eall_col = jnp.swapaxes(eall, -1, -2)  # [B, H, N, K, 1]
        o, vn, hs, ht = _forward(cfg, w, u, p, qin, kout, eall_col, h0)
        return (o, ht, vn), (w, p, qin, kout, eall_col, hs, vn)

    @jax.custom_vjp
    def core(q, k, kr, vw, gam_a, gam_b, h0, docs):
        return forward(q, k, kr, vw, gam_a, gam_b, h0, docs)[0]

    def core_fwd(q, k, kr, vw, gam_a, gam_b, h0, docs):
        out, saved = forward(q, k, kr, vw, gam_a, gam_b, h0, docs)
        return out, (q, k, kr, vw, gam_a, gam_b, docs) + saved

    def core_bwd(res, cts):
        q, k, kr, vw, gam_a, gam_b, docs, w, p, qin, kout, eall_col, hs, vn = res
        do, dht, dvn_in = cts
        do = do.astype(cfg["mm_dtype"])
        dvn, dhs, dh0 = _backward_state(cfg, w, p, qin, kout, eall_col, do,
                                        dvn_in.astype(F32), dht.astype(F32))
        dq, dk, dkr, dvw, dgam_a, dgam_b = _backward_chunk(
            cfg, q, k, kr, vw, gam_a, gam_b, docs, hs, dhs, do, vn, dvn)
        return dq, dk, dkr, dvw, dgam_a, dgam_b, dh0, tuple(None for _ in docs)

    core.defvjp(core_fwd, core_bwd)
    return core


def _docs(segment_ids, padded_len, chunk):
    """``(doc_col [B, Tp, 1], doc_row [B, N, 1, C], conn [B, Tp, 1], last [B, Tp, 1])``."""
    doc = validation.document_index(segment_ids)
    doc = jnp.pad(doc, ((0, 0), (0, padded_len - doc.shape[1])), mode="edge").astype(jnp.int32)
    bsz = doc.shape[0]
    dc = doc.reshape(bsz, -1, chunk)
    prev = jnp.concatenate([dc[:, :1, :1], dc[:, :-1, -1:]], axis=1)  # doc before each chunk
    conn = (dc == prev).astype(F32).reshape(bsz, padded_len, 1)
    last = (dc == dc[:, :, -1:]).astype(F32).reshape(bsz, padded_len, 1)
    return doc[..., None], dc[:, :, None, :], conn, last


def delta_rule_tpu(
    q: jax.Array,
    k: jax.Array,
    k_read: Optional[jax.Array],
    v_write: jax.Array,
    g: Optional[jax.Array],
    *,
    scale: float,
    initial_state: Optional[jax.Array] = None,
    segment_ids: Optional[jax.Array] = None,
    chunk_size: int = 64,
    mm_dtype=None,
    out_dtype=None,
    interpret=None,
) -> Tuple[jax.Array, jax.Array, jax.Array]:
    """Runs the generic delta rule (module docstring) on the Pallas TPU kernels.

    ``u_t = vw_t - (Diag(e^{g_t}) S_{t-1})^T kr_t``, ``S_t = Diag(e^{g_t}) S_{t-1} + k_t u_t^T``,
    ``o_t = scale S_t^T q_t``; with ``k_read=None`` the delta rule is off (``u_t = vw_t``).
    Differentiable w.r.t. every array argument through the kernels' ``custom_vjp`` (plus XLA
    autodiff of the gate cumsum and layout changes). Any ``T >= 1``: time is padded to a
    multiple of the chunk with inert tokens (``k = kr = vw = 0``, ``g = 0``, same document).

    Args:
      q, k: ``[B, T, H, K]`` (value heads already expanded), bf16 or fp32.
      k_read: read keys ``[B, T, H, K]`` or ``None`` (no delta rule).
      v_write: write values ``[B, T, H, V]``.
      g: log-decay, scalar ``[B, T, H]`` or per key channel ``[B, T, H, K]`` (natural log,
        ``<= 0``), or ``None`` for no decay.
      scale: read-out scale.
      initial_state: ``[B, H, K, V]`` or ``None`` (zeros); first document of each row only.
      segment_ids: optional int ``[B, T]``; the state resets where the id changes.
      chunk_size: 64 or 128.
      mm_dtype: MXU operand dtype of the state passes and of the kernel inputs (default: bf16
        when q, k and ``v_write`` are all bf16, else fp32); the variants pass that of q, k, v.
      out_dtype: dtype of ``o`` (default ``v_write.dtype``).
      interpret: ``pl.pallas_call(interpret=...)``; ``None`` picks Mosaic on a TPU and TPU
        interpret mode elsewhere.

    Returns:
      ``(o [B, T, H, V] out_dtype, final_state [B, H, K, V] fp32, u [B, T, H, V] fp32)``.

    Raises:
      ValueError: for head dims, chunk size or dtypes the kernels do not support.
    """
    bsz, seq_len, heads, dk = q.shape
    dv = v_write.shape[-1]
    reason = pallas_tpu.unsupported_reason((q, k, v_write), (dk, dv), chunk_size)
    if reason is not None:
        raise ValueError(f"delta_rule_tpu: {reason}")
    chunk = chunk_size
    mdt = jnp.dtype(mm_dtype or pallas_tpu.matmul_dtype(q, k, v_write))
    out_dtype = jnp.dtype(out_dtype or v_write.dtype)
    padded = -(-seq_len // chunk) * chunk
    n_chunks = padded // chunk
    delta = k_read is not None
    channelwise = g is not None and g.ndim == 4

    def to_heads(x, dtype):  # [B, T, H, X] -> [B, H, Tp, X]
        return jnp.swapaxes(validation.pad_time(x.astype(dtype), chunk), 1, 2)

    q_t, k_t = to_heads(q, mdt), to_heads(k, mdt)
    kr_t = to_heads(k_read, mdt) if delta else None
    vw_t = to_heads(v_write, mdt)
    if g is None:
        g = jnp.zeros((bsz, seq_len, heads), F32)
    gpad = validation.pad_time(g.astype(F32), chunk)  # inert padding: g = 0
    gam = jnp.cumsum(gpad.reshape((bsz, n_chunks, chunk) + gpad.shape[2:]), axis=2)
    gam = jnp.swapaxes(gam.reshape((bsz, padded) + gpad.shape[2:]), 1, 2)  # [B, H, Tp(, K)]
    if channelwise:
        gam_a, gam_b = gam, None
    else:
        gam_a = gam[..., None]  # [B, H, Tp, 1]
        gam_b = gam.reshape(bsz, heads, n_chunks, 1, chunk)  # [B, H, N, 1, C]
    if initial_state is None:
        initial_state = jnp.zeros((bsz, heads, dk, dv), F32)
    docs = () if segment_ids is None else _docs(segment_ids, padded, chunk)
    static = tuple(sorted(dict(
        chunk=chunk, n_chunks=n_chunks, dk=dk, scale=float(scale), delta=delta,
        channelwise=channelwise, mm_dtype=jnp.dtype(mdt), out_dtype=out_dtype,
        block_v=min(dv, 128), interpret=pallas_tpu.interpret_params() if interpret is None
        else interpret,
    ).items(), key=lambda kv: kv[0]))
    o, ht, vn = _make_core(static)(q_t, k_t, kr_t, vw_t, gam_a, gam_b,
                                   initial_state.astype(F32), docs)
    o = jnp.swapaxes(o, 1, 2)[:, :seq_len]
    vn = jnp.swapaxes(vn, 1, 2)[:, :seq_len]
    return o, ht, vn
