"""Chunkwise (WY/UT) form of Gated DeltaNet and DeltaNet in pure JAX.

Paper "Linear Attention Architectures" (arXiv 2607.07953), Sec. 3.2: DeltaNet Eq. 14, Gated
DeltaNet Eqs. 15-17; the chunk form follows spec §2.1 (FLA ``chunk_gated_delta_rule`` and the
torch reference ``torch_chunk_gated_delta_rule``). Per chunk of C tokens with entry state S_0,
gamma the within-chunk cumulative sum of g and Gamma_ij = exp(gamma_i - gamma_j) for i >= j:

    T   = (I + strict_tril(diag(beta) (K K^T) * Gamma))^{-1}     (unit lower-triangular solve)
    U   = T diag(beta) V,    W = T diag(beta * e^gamma) K,    u = U - W S_0
    O   = scale * [(Q * e^gamma) S_0 + (Q K^T * Gamma * tril_incl) u]
    S_C = e^{gamma_C} S_0 + (K * e^{gamma_C - gamma})^T u

Only the last three lines depend on S_0, so everything else is computed for all chunks at once
and a ``lax.scan`` over chunks carries the state. Gradients come from JAX autodiff of this form.
gamma_i - gamma_j is computed as the segment sum sum_{j < s <= i} g_s (as Mamba-2's ``segsum``),
not as a difference of cumulative sums: this keeps the decays and dg accurate under strong decay
(g down to -20 per token), where the difference form loses dg entirely to cancellation.

Document boundaries (``segment_ids``) are handled exactly, also inside a chunk: the intra-chunk
matrices are masked to pairs of tokens in the same document, the S_0 terms are kept only for
tokens still in the document that was running when the chunk began, and S_C only gathers tokens
of the chunk's last document. Masks are applied as zeros, never as ``-inf`` log-decays (those
give ``exp(-inf - -inf) = nan``).
"""

from typing import Optional, Tuple

import jax
import jax.numpy as jnp

from pallas_kernels import common
from pallas_kernels.common import linalg

_HIGHEST = jax.lax.Precision.HIGHEST


def gated_delta_rule_chunked(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: Optional[jax.Array],
    beta: jax.Array,
    *,
    scale: float,
    initial_state: Optional[jax.Array] = None,
    segment_ids: Optional[jax.Array] = None,
    chunk_size: int = 64,
) -> Tuple[jax.Array, jax.Array, jax.Array]:
    """Computes Gated DeltaNet / DeltaNet with the chunkwise WY/UT form.

    Any ``T >= 1`` works: the time axis is padded up to a multiple of the chunk size with tokens
    that leave the state unchanged (``beta = 0``, ``g = 0``, same document as the last real
    token). A sequence shorter than the chunk size is one unpadded chunk of ``T`` tokens, so short
    inputs (a decode step, ``T == 1``) do not pay for padding.

    Args:
        q: queries ``[B, T, H, K]`` (already expanded to the value heads).
        k: keys ``[B, T, H, K]``, used as given (L2-normalise them beforehand).
        v: values ``[B, T, H, V]``.
        g: per-token log-decay ``[B, T, H]`` in natural-log units (expected ``<= 0``), or
            ``None`` for DeltaNet (no decay).
        beta: write strengths ``[B, T, H]`` in ``(0, 1)``.
        scale: read-out scale applied to ``S_t^T q_t`` (usually ``K ** -0.5``).
        initial_state: ``[B, H, K, V]`` state before the first token, or ``None`` for zeros. It
            applies to the first document of each row only.
        segment_ids: optional int ``[B, T]``; the state is reset to zero wherever
            ``segment_ids[:, t] != segment_ids[:, t - 1]``.
        chunk_size: chunk length C, a power of two (validated by the public op).

    Returns:
        ``(o, final_state, u)``, all fp32: ``o`` ``[B, T, H, V]``, the state after the last token
        of each row ``[B, H, K, V]``, and the residuals ``u`` ``[B, T, H, V]``.

    Raises:
        TypeError: naming the first array argument that is not a ``jax.Array`` or
            ``numpy.ndarray`` (a Python list, say), as the public ops do
            (:func:`pallas_kernels.common.check_arrays`).
    """
    common.check_arrays(q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state,
                        segment_ids=segment_ids)
    f32 = jnp.float32
    batch, seq_len, heads, dk = k.shape
    dv = v.shape[-1]
    chunk = common.effective_chunk_size(chunk_size, seq_len)
    padded_len = -(-seq_len // chunk) * chunk
    n_chunks = padded_len // chunk

    if initial_state is None:
        initial_state = jnp.zeros((batch, heads, dk, dv), f32)

    def to_chunks(x):  # [B, T, H, ...] -> [B, H, N, C, ...]; zero padding is inert (beta = 0).
        return _to_chunks(x, chunk)

    q_c = to_chunks(q) * scale  # [B, H, N, C, K]
    k_c = to_chunks(k)  # [B, H, N, C, K]
    big_u, big_w, decay_ij, decay_in, decay_out, decay_all = _chunk_wy(
        k_c, to_chunks(v), None if g is None else to_chunks(g), to_chunks(beta), segment_ids)

    with jax.named_scope("gdn_chunk_wy"):
        attn = jnp.einsum("bhnik,bhnjk->bhnij", q_c, k_c, precision=_HIGHEST) * decay_ij
        q_in = q_c * decay_in[..., None]  # [B, H, N, C, K]
        k_out = k_c * decay_out[..., None]  # [B, H, N, C, K]

    def step(state, xs):
        big_u_n, big_w_n, attn_n, q_in_n, k_out_n, decay_all_n = xs
        u = big_u_n - jnp.einsum("bhck,bhkv->bhcv", big_w_n, state, precision=_HIGHEST)
        o = jnp.einsum("bhck,bhkv->bhcv", q_in_n, state, precision=_HIGHEST)
        o = o + jnp.einsum("bhij,bhjv->bhiv", attn_n, u, precision=_HIGHEST)
        state = decay_all_n[..., None, None] * state + jnp.einsum(
            "bhck,bhcv->bhkv", k_out_n, u, precision=_HIGHEST
        )
        return state, (o, u)

    with jax.named_scope("gdn_chunk_scan"):
        decay_all = jnp.broadcast_to(decay_all, (batch, heads, n_chunks))
        xs = tuple(
            jnp.moveaxis(x, 2, 0) for x in (big_u, big_w, attn, q_in, k_out, decay_all)
        )  # chunk-major: [N, B, H, ...]
        final_state, (o, u) = jax.lax.scan(step, initial_state.astype(f32), xs)

    def from_chunks(x):  # [N, B, H, C, V] -> [B, T, H, V]
        x = jnp.transpose(x, (1, 0, 3, 2, 4))  # [B, N, C, H, V]
        x = x.reshape(batch, padded_len, heads, dv)
        return x[:, :seq_len]

    return from_chunks(o), final_state, from_chunks(u)


def _to_chunks(x, chunk):
    """``[B, T, H, ...]`` to fp32 ``[B, H, N, C, ...]``, zero-padded to ``N * C`` tokens."""
    x = common.pad_time(x.astype(jnp.float32), chunk)
    batch, padded_len, heads = x.shape[:3]
    x = x.reshape((batch, padded_len // chunk, chunk, heads) + x.shape[3:])
    return jnp.moveaxis(x, 3, 1)


def _chunk_wy(k_c, v_c, g_c, beta_c, segment_ids):
    """The decay factors and the WY/UT factors of every chunk (module docstring), fp32.

    Args:
        k_c: keys ``[B, H, N, C, K]`` fp32 (padding tokens zero).
        v_c: values ``[B, H, N, C, V]`` fp32.
        g_c: log-decay ``[B, H, N, C]`` fp32, or ``None`` (DeltaNet).
        beta_c: write strengths ``[B, H, N, C]`` fp32 (0 on padding, which makes it inert).
        segment_ids: optional int ``[B, T]`` with ``T <= N * C``; padding tokens join the
            row's last document.

    Returns:
        ``(U, W, decay_ij, decay_in, decay_out, decay_all)``: ``U = T diag(beta) V``
        ``[B, H, N, C, V]``, ``W = T diag(beta e_in) K`` ``[B, H, N, C, K]``,
        ``Gamma * tril_incl`` (same document) ``[B, H or 1, N, C, C]``, ``e_in = e^gamma``
        (times the ``connected`` mask) ``[B, H, N, C]``, ``e_out = e^{gamma_C - gamma}``
        (times ``last_doc``) ``[B, H, N, C]`` and ``e_all = e^{gamma_C}`` (times the last
        token's ``connected``) ``[B, H or 1, N]``.
    """
    f32 = jnp.float32
    batch, _, n_chunks, chunk = beta_c.shape
    padded_len = n_chunks * chunk
    with jax.named_scope("gdn_chunk_prepare"):
        idx = jnp.arange(chunk)
        causal = idx[:, None] >= idx[None, :]  # [C, C], i >= j (inclusive)
        if segment_ids is None:
            connected = last_doc = None
        else:
            # Pad with the last document index so padding tokens join the row's last document.
            doc = common.document_index(segment_ids)
            doc = jnp.pad(doc, ((0, 0), (0, padded_len - segment_ids.shape[1])), mode="edge")
            doc = doc.reshape(batch, 1, n_chunks, chunk)  # [B, 1, N, C]
            causal = causal & (doc[..., :, None] == doc[..., None, :])  # [B, 1, N, C, C]
            # Document running at the chunk start: the one of the previous chunk's last token.
            prev_doc = jnp.concatenate([doc[..., :1, :1], doc[..., :-1, -1:]], axis=-2)
            connected = doc == prev_doc  # [B, 1, N, C]: token i still sees S_0
            last_doc = doc == doc[..., -1:]  # [B, 1, N, C]: token i contributes to S_C

        if g_c is None:
            # DeltaNet: gamma == 0, so every decay factor is 1 (or a mask).
            decay_ij = causal.astype(f32)
            decay_in = jnp.ones_like(beta_c)  # e^{gamma_i}
            decay_out = jnp.ones_like(beta_c)  # e^{gamma_C - gamma_i}
            decay_all = jnp.ones(beta_c.shape[:-1], f32)  # e^{gamma_C}
        else:
            gamma = jnp.cumsum(g_c, axis=-1)  # [B, H, N, C], non-increasing
            # gamma_i - gamma_j as a segment sum, sum_{j < s <= i} g_s (0 for i <= j), rather
            # than a difference of cumsums: no cancellation of large |gamma| under strong decay
            # (in the value or, through the cumsum transpose, in dg), the diagonal is exactly 0
            # with no gradient path, and the exponent is never positive above the diagonal, so
            # exp cannot overflow there (masking before exp, without -inf log-decays).
            lower = idx[:, None] > idx[None, :]  # [C, C], i > j
            seg = jnp.cumsum(jnp.where(lower, g_c[..., :, None], 0.0), axis=-2)  # [B, H, N, C, C]
            decay_ij = jnp.where(causal, jnp.exp(seg), 0.0)  # Gamma * tril_incl (* same doc)
            decay_in = jnp.exp(gamma)  # e^{gamma_i}
            decay_out = jnp.exp(seg[..., -1, :])  # e^{gamma_C - gamma_i}
            decay_all = jnp.exp(gamma[..., -1])  # e^{gamma_C}
        if connected is not None:
            decay_in = decay_in * connected
            decay_out = decay_out * last_doc
            decay_all = decay_all * connected[..., -1]

    with jax.named_scope("gdn_chunk_wy"):
        dv = v_c.shape[-1]
        kk = jnp.einsum("bhnik,bhnjk->bhnij", k_c, k_c, precision=_HIGHEST)
        strict = jnp.tril(beta_c[..., :, None] * kk * decay_ij, -1)  # [B, H, N, C, C]
        # (I + strict) x = rhs, solved for both U (from V) and W (from K) at once.
        rhs = jnp.concatenate(
            [beta_c[..., None] * v_c, (beta_c * decay_in)[..., None] * k_c], axis=-1
        )  # [B, H, N, C, V + K]
        sol = linalg.solve_unit_lower(strict, rhs)
        big_u, big_w = sol[..., :dv], sol[..., dv:]  # [B, H, N, C, V], [B, H, N, C, K]
    return big_u, big_w, decay_ij, decay_in, decay_out, decay_all


def wy_representation(
    k: jax.Array,
    v: jax.Array,
    g: Optional[jax.Array],
    beta: jax.Array,
    *,
    segment_ids: Optional[jax.Array] = None,
    chunk_size: int = 64,
) -> Tuple[jax.Array, jax.Array]:
    """The per-chunk WY/UT factors ``W`` and ``U`` of the chunk form (module docstring).

    Per chunk of ``chunk_size`` tokens (FLA's ``recompute_w_u_fwd``), in fp32::

        T = (I + strict_tril(diag(beta) (K K^T) * Gamma))^{-1}
        W = T diag(beta * e_in) K,    U = T diag(beta) V

    with ``e_in = e^gamma`` zeroed on tokens of a document that starts inside the chunk, and
    ``Gamma`` masked to pairs in the same document. The state pass is then
    ``u = U - W S_0``, ``S_C = e_all S_0 + (e_out K)^T u`` (see
    :func:`gated_delta_rule_chunked`), which the Mosaic GPU kernels run.

    Args:
        k: keys ``[B, T, H, K]`` (already expanded to the value heads), any float dtype.
        v: values ``[B, T, H, V]``.
        g: log-decay ``[B, T, H]`` (natural log, ``<= 0``), or ``None`` (DeltaNet).
        beta: write strengths ``[B, T, H]``.
        segment_ids: optional int ``[B, T]``; documents start wherever the id changes.
        chunk_size: chunk length C (not clipped to ``T``: the time axis is zero-padded to a
            multiple of C, and padding tokens have ``beta = 0``, so ``W = U = 0`` there).

    Returns:
        ``(w, u)`` fp32, ``[B, Tp, H, K]`` and ``[B, Tp, H, V]`` with ``Tp`` the padded length.
    """
    def to_chunks(x):
        return _to_chunks(x, chunk_size)

    big_u, big_w, *_ = _chunk_wy(to_chunks(k), to_chunks(v),
                                 None if g is None else to_chunks(g), to_chunks(beta),
                                 segment_ids)

    def from_chunks(x):  # [B, H, N, C, D] -> [B, Tp, H, D]
        b, h, n, c, d = x.shape
        return jnp.moveaxis(x, 1, 3).reshape(b, n * c, h, d)

    return from_chunks(big_w), from_chunks(big_u)
