"""Chunkwise form of scalar-decay linear attention ("simple GLA") in pure JAX.

Recurrence (FLA layout S in R^{K x V}): ``S_t = exp(g_t) S_{t-1} + k_t v_t^T``,
``o_t = scale * S_t^T q_t``. Plain linear attention (arXiv 2607.07953, Eqs. 4-10) is g = 0;
Lightning Attention (arXiv 2601.22156, spec ``hypenet-halo.md`` §1.5) is a fixed per-head g. The
chunk form follows spec ``hypenet-halo.md`` §1.11 (FLA ``chunk_simple_gla``): per chunk of C
tokens with entry state S_0, gamma the within-chunk cumulative sum of g and
D_ij = exp(gamma_i - gamma_j) for i >= j (else 0)::

    O   = (Q * e^gamma) S_0 + (Q K^T * D) V             (Q already multiplied by scale)
    S_C = e^{gamma_C} S_0 + (K * e^{gamma_C - gamma})^T V

The intra-chunk term ``(Q K^T * D) V`` and each chunk's state increment do not depend on S_0, so
they are computed for all chunks at once; a ``lax.scan`` over chunks only carries the state
(``S_C = a_n S_0 + dS_n``) and returns the entry state of every chunk, from which the inter-chunk
term is one batched matmul. Gradients come from JAX autodiff.

gamma_i - gamma_j is computed as the segment sum sum_{j < s <= i} g_s (Mamba-2's ``segsum``),
never as a difference of cumulative sums nor as the factorisation gamma^i * gamma^(-j) (spec
§1.11: exp(+63 * 0.7) ~ 2e19): there is no cancellation of large |gamma| under strong decay (in
the value or, through the cumsum transpose, in dg), the diagonal is exactly 0, and the exponent
is never positive, so exp cannot overflow (masking happens before exp, without -inf log-decays).

Document boundaries (``segment_ids``) are exact, also inside a chunk: D is restricted to pairs in
the same document, the S_0 term is kept only for tokens still in the document that was running
when the chunk began, and S_C only gathers tokens of the chunk's last document.
"""

from typing import Optional, Tuple

import jax
import jax.numpy as jnp

from pallas_kernels import common

_HIGHEST = jax.lax.Precision.HIGHEST


def simple_gla_chunked(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: Optional[jax.Array],
    *,
    scale: float,
    initial_state: Optional[jax.Array] = None,
    segment_ids: Optional[jax.Array] = None,
    chunk_size: int = 64,
) -> Tuple[jax.Array, jax.Array]:
    """Computes scalar-decay linear attention with the chunkwise form.

    Any ``T >= 1`` works: the time axis is padded up to a multiple of the chunk size with tokens
    that leave the state unchanged (``k = v = 0``, ``g = 0``, same document as the last real
    token). A sequence shorter than the chunk size is one unpadded chunk of ``T`` tokens, so a
    decode step (``T == 1``) is a single recurrent step with no padding.

    Args:
        q: queries ``[B, T, H, K]`` (already expanded to the value heads).
        k: keys ``[B, T, H, K]``.
        v: values ``[B, T, H, V]``.
        g: per-token, per-head log-decay ``[B, T, H]`` in natural-log units (``<= 0``), or
            ``None`` for no decay (plain linear attention).
        scale: read-out scale applied to ``S_t^T q_t`` (usually ``K ** -0.5``).
        initial_state: ``[B, H, K, V]`` state before the first token, or ``None`` for zeros. It
            applies to the first document of each row only.
        segment_ids: optional int ``[B, T]``; the state is reset to zero wherever
            ``segment_ids[:, t] != segment_ids[:, t - 1]``.
        chunk_size: chunk length C, a power of two (validated by the public op).

    Returns:
        ``(o, final_state)``, fp32: ``o`` ``[B, T, H, V]`` and the state after the last token of
        each row ``[B, H, K, V]``.

    Raises:
        TypeError: naming the first array argument that is not a ``jax.Array`` or
            ``numpy.ndarray`` (a Python list, say), as the public ops do
            (:func:`pallas_kernels.common.check_arrays`).
    """
    common.check_arrays(q=q, k=k, v=v, g=g, initial_state=initial_state, segment_ids=segment_ids)
    f32 = jnp.float32
    batch, seq_len, heads, dk = k.shape
    dv = v.shape[-1]
    chunk = common.effective_chunk_size(chunk_size, seq_len)
    padded_len = -(-seq_len // chunk) * chunk
    n_chunks = padded_len // chunk

    if initial_state is None:
        initial_state = jnp.zeros((batch, heads, dk, dv), f32)

    def to_chunks(x):  # [B, T, H, ...] -> [B, H, N, C, ...]; zero padding is inert.
        x = common.pad_time(x.astype(f32), chunk)
        x = x.reshape((batch, n_chunks, chunk, heads) + x.shape[3:])
        return jnp.moveaxis(x, 3, 1)

    with jax.named_scope("simple_gla_chunk_prepare"):
        q_c = to_chunks(q) * scale  # [B, H, N, C, K]
        k_c = to_chunks(k)  # [B, H, N, C, K]
        v_c = to_chunks(v)  # [B, H, N, C, V]

        idx = jnp.arange(chunk)
        causal = idx[:, None] >= idx[None, :]  # [C, C], i >= j (inclusive read-out)
        connected = last_doc = None
        if segment_ids is not None:
            # Pad with the last document index so padding tokens join the row's last document.
            doc = common.document_index(segment_ids)
            doc = jnp.pad(doc, ((0, 0), (0, padded_len - seq_len)), mode="edge")
            doc = doc.reshape(batch, 1, n_chunks, chunk)  # [B, 1, N, C]
            causal = causal & (doc[..., :, None] == doc[..., None, :])  # [B, 1, N, C, C]
            # Document running at the chunk start: the one of the previous chunk's last token.
            prev_doc = jnp.concatenate([doc[..., :1, :1], doc[..., :-1, -1:]], axis=-2)
            connected = doc == prev_doc  # [B, 1, N, C]: token i still sees S_0
            last_doc = doc == doc[..., -1:]  # [B, 1, N, C]: token i contributes to S_C

        if g is None:
            # Plain linear attention: gamma == 0, so every decay factor is 1 (or a mask).
            ones = jnp.ones((batch, heads, n_chunks, chunk), f32)
            decay_ij = causal.astype(f32)
            decay_in, decay_out = ones, ones  # e^{gamma_i}, e^{gamma_C - gamma_i}
            decay_all = ones[..., 0]  # e^{gamma_C}
        else:
            g_c = to_chunks(g)  # [B, H, N, C], fp32
            gamma = jnp.cumsum(g_c, axis=-1)  # [B, H, N, C], non-increasing
            # seg[i, j] = sum_{j < s <= i} g_s for i > j, and 0 for i <= j (module docstring).
            lower = idx[:, None] > idx[None, :]  # [C, C], i > j
            seg = jnp.cumsum(jnp.where(lower, g_c[..., :, None], 0.0), axis=-2)  # [B,H,N,C,C]
            decay_ij = jnp.where(causal, jnp.exp(seg), 0.0)  # D (* same document)
            decay_in = jnp.exp(gamma)  # e^{gamma_i}
            decay_out = jnp.exp(seg[..., -1, :])  # e^{gamma_C - gamma_i}
            decay_all = jnp.exp(gamma[..., -1])  # e^{gamma_C}
        if connected is not None:
            decay_in = decay_in * connected
            decay_out = decay_out * last_doc
            decay_all = decay_all * connected[..., -1]

    with jax.named_scope("simple_gla_chunk_intra"):
        attn = jnp.einsum("bhnik,bhnjk->bhnij", q_c, k_c, precision=_HIGHEST) * decay_ij
        o_intra = jnp.einsum("bhnij,bhnjv->bhniv", attn, v_c, precision=_HIGHEST)
        # The state increment of every chunk, sum_j e^{gamma_C - gamma_j} k_j v_j^T.
        k_out = k_c * decay_out[..., None]  # [B, H, N, C, K]
        d_state = jnp.einsum("bhnck,bhncv->bhnkv", k_out, v_c, precision=_HIGHEST)

    def step(state, xs):
        a_n, d_state_n = xs  # [B, H], [B, H, K, V]
        return a_n[..., None, None] * state + d_state_n, state

    with jax.named_scope("simple_gla_chunk_scan"):
        decay_all = jnp.broadcast_to(decay_all, (batch, heads, n_chunks))
        xs = (jnp.moveaxis(decay_all, 2, 0), jnp.moveaxis(d_state, 2, 0))  # chunk-major
        final_state, entry = jax.lax.scan(step, initial_state.astype(f32), xs)
        entry = jnp.moveaxis(entry, 0, 2)  # [B, H, N, K, V]: S_0 of every chunk

    with jax.named_scope("simple_gla_chunk_inter"):
        q_in = q_c * decay_in[..., None]  # [B, H, N, C, K]
        o = o_intra + jnp.einsum("bhnck,bhnkv->bhncv", q_in, entry, precision=_HIGHEST)

    o = jnp.moveaxis(o, 1, 3).reshape(batch, padded_len, heads, dv)  # [B, T_pad, H, V]
    return o[:, :seq_len], final_state
