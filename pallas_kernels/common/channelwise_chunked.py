"""Chunkwise form of the per-channel-decay delta rule in pure JAX, shared by KDA and GDN-2.

Paper "Linear Attention Architectures" (arXiv 2607.07953), KDA Eqs. 18-20 (spec §2.4) and GDN-2
Eqs. 21-24 (spec §2.6). The generic recurrence :func:`channelwise_delta_chunked` computes, with
a read key ``kr`` and a write value ``vw``::

    S~_t = Diag(exp g_t) S_{t-1},   u_t = vw_t - S~_t^T kr_t,   S_t = S~_t + k_t u_t^T,
    o_t  = scale * S_t^T q_t.

GDN-2 is ``kr = b * k``, ``vw = w * v`` (:mod:`pallas_kernels.gdn2.chunked`); KDA is
``kr = beta k``, ``vw = beta v`` (:mod:`pallas_kernels.kda.chunked`). Both call this function.

Chunk form. Per chunk of C tokens with entry state S_0, gamma_i in R^K the within-chunk cumsum of
g per key channel, and Gamma_ijc = exp(gamma_ic - gamma_jc) for i >= j::

    M_ij = sum_c kr_ic k_jc Gamma_ijc          (j < i)
    u    = (I + M)^{-1} (VW - (KR * e^gamma) S_0)          (unit lower-triangular solve)
    O_i  = scale * [S_0^T (e^{gamma_i} * q_i) + sum_{j <= i} (sum_c q_ic k_jc Gamma_ijc) u_j]
    S_C  = Diag(e^{gamma_C}) S_0 + sum_j (e^{gamma_C - gamma_j} * k_j) u_j^T

(Unrolling the token recurrence inside the chunk: S_i = Diag(e^{gamma_i}) S_0 +
sum_{j <= i} Diag(e^{gamma_i - gamma_j}) k_j u_j^T, and u_i = vw_i - S~_i^T kr_i reads it.)
Unlike scalar-decay GDN, Gamma has a key-channel axis, so the intra-chunk matrices cost a
``[C, C, K]`` tensor per chunk and head. To bound memory we build it inside a ``lax.scan`` over
chunks whose body is rematerialised in the backward pass (``jax.checkpoint``): peak memory holds
one chunk's ``[B, H, C, C, K]`` tensor, not ``N`` of them.

Numerics: all math is fp32 with ``Precision.HIGHEST``. The exponent gamma_i - gamma_j is masked
to ``i >= j`` BEFORE the exp, so a strong decay (``g = -20`` per token) never overflows, and every
other exponent (gamma_i, gamma_C - gamma_j) is ``<= 0``. Document boundaries (``segment_ids``)
are exact inside a chunk: intra-chunk terms are masked to pairs of tokens in the same document,
S_0 terms are kept only for tokens still in the document running when the chunk began, and S_C
only gathers tokens of the chunk's last document. Masks are zeros, never ``-inf`` log-decays.
"""

from typing import Optional, Tuple

import jax
import jax.numpy as jnp

from pallas_kernels.common import linalg, validation

_HIGHEST = jax.lax.Precision.HIGHEST


def channelwise_delta_chunked(
    q: jax.Array,
    k: jax.Array,
    k_read: jax.Array,
    v_write: jax.Array,
    g: jax.Array,
    *,
    scale: float,
    initial_state: Optional[jax.Array] = None,
    segment_ids: Optional[jax.Array] = None,
    chunk_size: int = 64,
) -> Tuple[jax.Array, jax.Array, jax.Array]:
    """Chunkwise delta rule with per-key-channel decay and separate read key / write value.

    Computes ``u_t = vw_t - (Diag(e^{g_t}) S_{t-1})^T kr_t``,
    ``S_t = Diag(e^{g_t}) S_{t-1} + k_t u_t^T`` and ``o_t = scale * S_t^T q_t`` (module
    docstring). Any ``T >= 1`` works: time is padded to a multiple of the chunk size with inert
    tokens (``k = kr = vw = 0``, ``g = 0``, same document as the last real token), and the chunk
    size is clipped to ``T`` when ``T`` is shorter (one unpadded chunk).

    Args:
        q: queries ``[B, T, H, K]`` (already expanded to the value heads).
        k: keys ``[B, T, H, K]`` used for the write ``k_t u_t^T``.
        k_read: read keys ``kr`` ``[B, T, H, K]`` (GDN-2: ``b * k``; KDA: ``beta * k``).
        v_write: write values ``vw`` ``[B, T, H, V]`` (GDN-2: ``w * v``; KDA: ``beta * v``).
        g: per-key-channel log-decay ``[B, T, H, K]`` in natural-log units (``<= 0``).
        scale: read-out scale applied to ``S_t^T q_t`` (usually ``K ** -0.5``).
        initial_state: ``[B, H, K, V]`` state before the first token, or ``None`` for zeros. It
            applies to the first document of each row only.
        segment_ids: optional int ``[B, T]``; the state is reset to zero wherever
            ``segment_ids[:, t] != segment_ids[:, t - 1]``.
        chunk_size: chunk length C, a power of two (validated by the public ops).

    Returns:
        ``(o, final_state, u)``, all fp32: ``o`` ``[B, T, H, V]``, the state after the last token
        of each row ``[B, H, K, V]``, and the residuals ``u`` ``[B, T, H, V]``.
    """
    f32 = jnp.float32
    batch, seq_len, heads, dk = k.shape
    dv = v_write.shape[-1]
    chunk = validation.effective_chunk_size(chunk_size, seq_len)
    padded_len = -(-seq_len // chunk) * chunk
    n_chunks = padded_len // chunk
    if initial_state is None:
        initial_state = jnp.zeros((batch, heads, dk, dv), f32)

    def to_chunks(x):  # [B, T, H, X] -> [N, B, H, C, X]; zero padding is inert.
        x = validation.pad_time(x.astype(f32), chunk)
        x = x.reshape(batch, n_chunks, chunk, heads, x.shape[-1])
        return jnp.transpose(x, (1, 0, 3, 2, 4))

    with jax.named_scope("channelwise_delta_chunk_prepare"):
        q_c = to_chunks(q) * scale  # [N, B, H, C, K]
        k_c = to_chunks(k)  # [N, B, H, C, K]
        kr_c = to_chunks(k_read)  # [N, B, H, C, K]
        vw_c = to_chunks(v_write)  # [N, B, H, C, V]
        # Within-chunk cumulative log-decay per key channel, fp32, non-increasing in time.
        gamma = jnp.cumsum(to_chunks(g), axis=-2)  # [N, B, H, C, K]
        if segment_ids is None:
            masks = None
        else:
            # Pad with the last document index so padding tokens join the row's last document.
            doc = validation.document_index(segment_ids)
            doc = jnp.pad(doc, ((0, 0), (0, padded_len - seq_len)), mode="edge")
            doc = jnp.swapaxes(doc.reshape(batch, n_chunks, chunk), 0, 1)  # [N, B, C]
            # Document running at the chunk start: that of the previous chunk's last token.
            prev_doc = jnp.concatenate([doc[:1, :, :1], doc[:-1, :, -1:]], axis=0)  # [N, B, 1]
            masks = (
                doc[..., :, None] == doc[..., None, :],  # [N, B, C, C]: same document
                doc == prev_doc,  # [N, B, C]: token i still sees S_0
                doc == doc[..., -1:],  # [N, B, C]: token i contributes to S_C
            )

    idx = jnp.arange(chunk)
    causal = idx[:, None] >= idx[None, :]  # [C, C], i >= j (inclusive)
    causal_strict = idx[:, None] > idx[None, :]  # [C, C], i > j

    def step(state, xs):
        q_n, k_n, kr_n, vw_n, gamma_n, masks_n = xs  # [B, H, C, K|V], state [B, H, K, V]
        incl, strict = causal, causal_strict
        e_in = jnp.exp(gamma_n)  # [B, H, C, K]: e^{gamma_i}
        e_out = jnp.exp(gamma_n[..., -1:, :] - gamma_n)  # [B, H, C, K]: e^{gamma_C - gamma_i}
        e_all = jnp.exp(gamma_n[..., -1, :])  # [B, H, K]: e^{gamma_C}
        if masks_n is not None:
            same, connected, last_doc = masks_n
            incl = incl & same[:, None]  # [B, 1, C, C]
            strict = strict & same[:, None]
            e_in = e_in * connected[:, None, :, None]
            e_out = e_out * last_doc[:, None, :, None]
            e_all = e_all * connected[:, None, -1:]

        # Gamma_ijc = exp(gamma_ic - gamma_jc), with the exponent masked to i >= j BEFORE the exp:
        # for i < j it is positive and overflows under strong decay, and an inf in a discarded
        # branch would still poison the gradient.
        diff = gamma_n[..., :, None, :] - gamma_n[..., None, :, :]  # [B, H, C, C, K]
        decay = jnp.exp(jnp.where(causal[..., None], diff, 0.0))  # [B, H, C, C, K]
        m = jnp.einsum("bhijk,bhjk->bhij", kr_n[..., :, None, :] * decay, k_n, precision=_HIGHEST)
        m = jnp.where(strict, m, 0.0)  # [B, H, C, C], strictly lower
        attn = jnp.einsum("bhijk,bhjk->bhij", q_n[..., :, None, :] * decay, k_n, precision=_HIGHEST)
        attn = jnp.where(incl, attn, 0.0)  # [B, H, C, C], inclusive of the diagonal

        rhs = vw_n - jnp.einsum("bhck,bhkv->bhcv", kr_n * e_in, state, precision=_HIGHEST)
        u = linalg.solve_unit_lower(m, rhs)  # [B, H, C, V]
        o = jnp.einsum("bhck,bhkv->bhcv", q_n * e_in, state, precision=_HIGHEST)
        o = o + jnp.einsum("bhij,bhjv->bhiv", attn, u, precision=_HIGHEST)
        state = e_all[..., :, None] * state + jnp.einsum(
            "bhck,bhcv->bhkv", k_n * e_out, u, precision=_HIGHEST
        )
        return state, (o, u)

    with jax.named_scope("channelwise_delta_chunk_scan"):
        # Rematerialise each chunk in the backward pass, so autodiff stores no [C, C, K] tensors
        # (prevent_cse=False is safe, and faster, under scan).
        xs = (q_c, k_c, kr_c, vw_c, gamma, masks)
        step = jax.checkpoint(step, prevent_cse=False)
        final_state, (o, u) = jax.lax.scan(step, initial_state.astype(f32), xs)

    def from_chunks(x):  # [N, B, H, C, V] -> [B, T, H, V]
        x = jnp.transpose(x, (1, 0, 3, 2, 4))  # [B, N, C, H, V]
        return x.reshape(batch, padded_len, heads, dv)[:, :seq_len]

    return from_chunks(o), final_state, from_chunks(u)
