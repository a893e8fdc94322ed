"""Chunk-local Gated DeltaNet backward in jla's value-space form, in pure JAX (no Pallas).

The math check of ``pallas_kernels/common/MOSAIC_GPU.md`` Sec. 31.4 step 1: the equations that
the planned fused kernel ``gdn_chunk_bwd_fused`` (Sec. 31.3) will run, written out here in the
input precision (fp32, or fp64 under ``jax.enable_x64``), vectorised over chunks with einsums,
so that ``tests/pallas_kernels/bwd_value_space_test.py`` can compare them with ``jax.vjp`` of
the chunk form (:func:`pallas_kernels.gated_delta_rule.chunked.gated_delta_rule_chunked`).

Forward per chunk of ``C`` tokens (local index ``t``, last token ``L = C - 1``; the chunk form of
``chunked.py`` and ``mosaic_vjp.py``), with ``G`` the chunk-local inclusive cumsum of ``g``,
``S`` the state entering the chunk (``h``, ``[K, V]``) and the document vectors ``conn_t`` (token
``t`` is in the document that was open when the chunk began), ``last_t`` (token ``t`` is in the
chunk's last document), ``same_ts`` (same document)::

    D_ts     = e^{G_t - G_s} [s <= t] same_ts        (DeltaNet: the mask alone)
    Gamma_t  = conn_t e^{G_t},  Gamma_r,s = last_s e^{G_L - G_s},  gamma = conn_L e^{G_L}
    A0_ts    = beta_t (k_t . k_s) [s < t] same_ts,   T0 = (I + A0)^{-1}
    Ag       = T0 * D * beta_s  (= X diag(beta), X = T0 * D the gated inverse)
    U'       = Gamma K S,  Wv = V - U',  v_new = Ag Wv   (= U - W S)
    O        = scale (Gamma Q S + (Q K^T * D) v_new)
    S'       = gamma S + (Gamma_r K)^T v_new

Backward (MOSAIC_GPU.md Sec. 31.3, as corrected there), with ``dv_new`` the total gradient of
``v_new`` (the reverse state pass's output: the chunk's read-out, the state, a ``du``) and
``dS'`` the gradient of the state leaving the chunk (``dh``)::

    dP     = scale (dO v_new^T) * D
    dq     = scale Gamma (dO S^T) + dP K
    dk_loc = Gamma_r (v_new dS'^T) + dP^T Q
    dv     = Ag^T dv_new,   dAg = dv_new Wv^T
    dA0    = -T0^T (dAg * D * beta_s) T0^T  on the strict same-document mask,  R = diag(beta) dA0
    dk     = dk_loc - Gamma (dv S^T) + R K + R^T K
    dbeta_t = sum_s dA0_ts (k_t . k_s) + sum_s dAg_st T0_st D_st
    dL/dG_t = q_t . dq_t - k_t . dk_loc,t + (F 1 - F^T 1)_t - dv_t . U'_t + [t = L] <S', dS'>,
              F = dAg * Ag
    dg_t   = sum_{s >= t, s in t's chunk} dL/dG_s

The boundary term ``[t = L] <S', dS'>`` is counted once: either in ``dL/dG_L`` (here) or, as the
kernels do, as the 64 partials ``bnd_s`` added to every ``dg_t`` after the cumsum, not both
(Sec. 31.3 as first written had both). ``S'`` is the state leaving the chunk (the next chunk's
``h``, or the final state), ``gamma S + (Gamma_r K)^T v_new``, formed here from ``h``.
"""

from typing import Optional, Tuple

import jax
import jax.numpy as jnp

from pallas_kernels import common

_HI = jax.lax.Precision.HIGHEST


def _chunks(x, chunk, dtype):
    """``[B, T, H, ...]`` to ``[B, H, N, C, ...]`` in ``dtype``, zero-padded in time."""
    x = common.pad_time(x.astype(dtype), chunk)
    batch, padded, heads = x.shape[:3]
    x = x.reshape((batch, padded // chunk, chunk, heads) + x.shape[3:])
    return jnp.moveaxis(x, 3, 1)


def _unchunk(x, seq_len):
    """``[B, H, N, C, ...]`` back to ``[B, T, H, ...]``."""
    b, h, n, c = x.shape[:4]
    x = jnp.moveaxis(x, 1, 3).reshape((b, n * c, h) + x.shape[4:])
    return x[:, :seq_len]


def _doc_masks(segment_ids, batch, n_chunks, chunk):
    """``(same [B, 1, N, C, C], conn [B, 1, N, C], last [B, 1, N, C])`` booleans (all true
    without ``segment_ids``); padding tokens join the row's last document (as ``chunked.py``)."""
    if segment_ids is None:
        ones = jnp.ones((batch, 1, n_chunks, chunk), bool)
        return jnp.ones((batch, 1, n_chunks, chunk, chunk), bool), ones, ones
    doc = common.document_index(segment_ids)
    doc = jnp.pad(doc, ((0, 0), (0, n_chunks * chunk - segment_ids.shape[1])), mode="edge")
    doc = doc.reshape(batch, 1, n_chunks, chunk)
    prev = jnp.concatenate([doc[..., :1, :1], doc[..., :-1, -1:]], axis=-2)
    return doc[..., :, None] == doc[..., None, :], doc == prev, doc == doc[..., -1:]


def _check(q, k, v, g, beta, do, v_new, dv_new, t0, h, dh, chunk):
    batch, seq_len, kv_heads, dk = q.shape
    heads, dv = v.shape[2], v.shape[3]
    n_chunks = -(-seq_len // chunk)
    want = {
        "k": (k, (batch, seq_len, kv_heads, dk)),
        "v": (v, (batch, seq_len, heads, dv)),
        "beta": (beta, (batch, seq_len, heads)),
        "do": (do, (batch, seq_len, heads, dv)),
        "v_new": (v_new, (batch, seq_len, heads, dv)),
        "dv_new": (dv_new, (batch, seq_len, heads, dv)),
        "h": (h, (batch, heads, n_chunks, dk, dv)),
        "dh": (dh, (batch, heads, n_chunks, dk, dv)),
    }
    if g is not None:
        want["g"] = (g, (batch, seq_len, heads))
    if t0 is not None:
        want["t0"] = (t0, (batch, seq_len, heads, chunk))
    for name, (x, shape) in want.items():
        if x.shape != shape:
            raise ValueError(f"{name} must be {shape}, got {x.shape}")
    if heads % kv_heads:
        raise ValueError(f"H = {heads} must be a multiple of Hk = {kv_heads}")


def chunk_bwd_value_space(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: Optional[jax.Array],
    beta: jax.Array,
    do: jax.Array,
    v_new: jax.Array,
    dv_new: jax.Array,
    t0: Optional[jax.Array],
    h: jax.Array,
    dh: jax.Array,
    *,
    scale: float,
    segment_ids: Optional[jax.Array] = None,
    chunk_size: int = 64,
) -> Tuple[jax.Array, jax.Array, jax.Array, jax.Array, Optional[jax.Array]]:
    """Chunk-local gradients of Gated DeltaNet / DeltaNet by the value-space equations.

    The equations of the module docstring (MOSAIC_GPU.md Sec. 31.3, corrected), every chunk at
    once. The time axis is zero-padded to a multiple of ``chunk_size`` (padding tokens: ``beta
    = 0``, ``g = 0``, the last real token's document, as ``chunked.py`` and the Mosaic op pad),
    so ``dg`` of the last real tokens includes the padding's ``dL/dG`` (zero except the boundary
    term, which sits on the padded last row).

    Args:
        q, k: ``[B, T, Hk, K]`` (GVA when ``Hk < H``: value head ``h`` reads head
            ``h // (H // Hk)``; ``dq``, ``dk`` are summed over each group).
        v: values ``[B, T, H, V]``.
        g: log-decay ``[B, T, H]`` (natural log), or ``None`` (DeltaNet).
        beta: write strengths ``[B, T, H]``.
        do: output gradient ``[B, T, H, V]``.
        v_new: the forward's ``v_new = U - W S`` ``[B, T, H, V]``.
        dv_new: the total gradient of ``v_new`` ``[B, T, H, V]`` (reverse state pass).
        t0: gate-free inverse ``T0 = (I + A0)^{-1}`` ``[B, T, H, C]`` (row ``t`` of its chunk;
            ``kernel_mosaic_gpu.kkt_inverse_xla``'s layout), or ``None``: then solved here by
            a unit lower-triangular solve in the compute dtype.
        h: states entering each chunk ``[B, H, N, K, V]`` (``N = ceil(T / C)``).
        dh: gradients of the states leaving each chunk ``[B, H, N, K, V]``.
        scale: read-out scale.
        segment_ids: optional int ``[B, T]``; a document starts wherever the id changes.
        chunk_size: chunk length ``C`` (64 for the Mosaic kernels).

    Returns:
        ``(dq, dk, dv, dbeta, dg)``: ``dq, dk`` ``[B, T, Hk, K]``, ``dv`` ``[B, T, H, V]``,
        ``dbeta`` ``[B, T, H]``, ``dg`` ``[B, T, H]`` (after the in-chunk reverse cumsum) or
        ``None`` for DeltaNet; all in the compute dtype, the promotion of the inputs' dtypes
        with fp32 (fp64 under x64 with fp64 inputs).

    Raises:
        ValueError: on inconsistent shapes or ``H`` not a multiple of ``Hk``.
    """
    chunk = chunk_size
    _check(q, k, v, g, beta, do, v_new, dv_new, t0, h, dh, chunk)
    batch, seq_len, kv_heads, _ = q.shape
    heads = v.shape[2]
    f = jnp.result_type(jnp.float32, q, k, v, beta, do, v_new, dv_new, h, dh,
                        *([] if g is None else [g]))
    n_chunks = -(-seq_len // chunk)
    group = heads // kv_heads

    def ch(x):
        return _chunks(x, chunk, f)

    qc = ch(jnp.repeat(q, group, axis=2))  # [B, H, N, C, K]
    kc = ch(jnp.repeat(k, group, axis=2))
    vc, doc_, vn, dvn = ch(v), ch(do), ch(v_new), ch(dv_new)  # [B, H, N, C, V]
    bc = ch(beta)  # [B, H, N, C]
    s_in, ds_out = h.astype(f), dh.astype(f)  # [B, H, N, K, V]

    same, conn, last = _doc_masks(segment_ids, batch, n_chunks, chunk)
    idx = jnp.arange(chunk)
    incl = (idx[:, None] >= idx[None, :]) & same  # [B, 1, N, C, C], s <= t, same document
    strict = (idx[:, None] > idx[None, :]) & same
    conn, last = conn.astype(f), last.astype(f)
    if g is None:
        dmat = incl.astype(f)
        e_in = jnp.ones_like(bc)
        e_out = jnp.ones_like(bc)
        e_all = jnp.ones(bc.shape[:-1], f)
    else:
        gc = ch(g)
        big_g = jnp.cumsum(gc, axis=-1)  # [B, H, N, C]
        # G_t - G_s as the segment sum sum_{s < u <= t} g_u (chunked.py): no cancellation.
        seg = jnp.cumsum(jnp.where(idx[:, None] > idx[None, :], gc[..., :, None], 0.0), axis=-2)
        dmat = jnp.where(incl, jnp.exp(seg), 0.0)
        e_in = jnp.exp(big_g)
        e_out = jnp.exp(seg[..., -1, :])  # e^{G_L - G_s}
        e_all = jnp.exp(big_g[..., -1])
    gam_in = conn * e_in  # Gamma_t
    gam_out = last * e_out  # Gamma_r,s
    gam_all = conn[..., -1] * e_all  # gamma

    kk = jnp.einsum("bhntk,bhnsk->bhnts", kc, kc, precision=_HI)
    if t0 is None:
        a0 = jnp.where(strict, bc[..., :, None] * kk, 0.0)
        eye = jnp.broadcast_to(jnp.eye(chunk, dtype=f), a0.shape)
        t0c = jax.scipy.linalg.solve_triangular(eye + a0, eye, lower=True, unit_diagonal=True)
    else:
        t0c = ch(t0)  # [B, H, N, C (row t), C (column s)]

    with jax.named_scope("value_space_forward"):
        ag = t0c * dmat * bc[..., None, :]  # Ag = T0 * D * beta_s
        u_p = gam_in[..., None] * jnp.einsum("bhnck,bhnkv->bhncv", kc, s_in, precision=_HI)
        wv = vc - u_p

    with jax.named_scope("value_space_backward"):
        dp = scale * jnp.einsum("bhntv,bhnsv->bhnts", doc_, vn, precision=_HI) * dmat
        dq = (scale * gam_in[..., None]
              * jnp.einsum("bhncv,bhnkv->bhnck", doc_, s_in, precision=_HI)
              + jnp.einsum("bhnts,bhnsk->bhntk", dp, kc, precision=_HI))
        dks = gam_out[..., None] * jnp.einsum("bhncv,bhnkv->bhnck", vn, ds_out, precision=_HI)
        dk_loc = dks + jnp.einsum("bhnts,bhntk->bhnsk", dp, qc, precision=_HI)
        dvc = jnp.einsum("bhnts,bhntv->bhnsv", ag, dvn, precision=_HI)  # Ag^T dv_new
        dag = jnp.einsum("bhntv,bhnsv->bhnts", dvn, wv, precision=_HI)  # dv_new Wv^T
        dt0 = dag * dmat * bc[..., None, :]
        da0 = -jnp.einsum("bhnxt,bhnxy,bhnsy->bhnts", t0c, dt0, t0c, precision=_HI)
        da0 = jnp.where(strict, da0, 0.0)
        r = bc[..., :, None] * da0
        dkc = (dk_loc
               - gam_in[..., None] * jnp.einsum("bhncv,bhnkv->bhnck", dvc, s_in, precision=_HI)
               + jnp.einsum("bhnts,bhnsk->bhntk", r, kc, precision=_HI)
               + jnp.einsum("bhnst,bhnsk->bhntk", r, kc, precision=_HI))
        dbeta = (jnp.sum(da0 * kk, axis=-1)
                 + jnp.sum(dag * t0c * dmat, axis=-2))  # column sums of dAg * T0 * D

    dg = None
    if g is not None:
        with jax.named_scope("value_space_gate"):
            fm = dag * ag
            dldg = (jnp.sum(qc * dq, axis=-1) - jnp.sum(kc * dk_loc, axis=-1)
                    + jnp.sum(fm, axis=-1) - jnp.sum(fm, axis=-2)
                    - jnp.sum(dvc * u_p, axis=-1))
            s_out = (gam_all[..., None, None] * s_in
                     + jnp.einsum("bhnck,bhncv->bhnkv", gam_out[..., None] * kc, vn,
                                  precision=_HI))
            bnd = jnp.sum(s_out * ds_out, axis=(-2, -1))  # <S', dS'>
            dldg = dldg.at[..., -1].add(bnd)
            dgc = jnp.flip(jnp.cumsum(jnp.flip(dldg, -1), axis=-1), -1)
            dg = _unchunk(dgc, seq_len)

    def group_sum(x):  # [B, T, H, K] -> [B, T, Hk, K]
        return x.reshape(x.shape[:2] + (kv_heads, group) + x.shape[3:]).sum(axis=3)

    return (group_sum(_unchunk(dq, seq_len)), group_sum(_unchunk(dkc, seq_len)),
            _unchunk(dvc, seq_len), _unchunk(dbeta, seq_len), dg)
