"""Exact token-level forms of scalar-decay linear attention ("simple GLA"): the ground truth.

Per batch row and head, with the state S_t in R^{K x V} (FLA layout, key-major)::

    S_t = exp(g_t) S_{t-1} + k_t v_t^T,        o_t = scale * S_t^T q_t   (inclusive of token t).

Plain linear attention (paper "Linear Attention Architectures", arXiv 2607.07953, Eqs. 4-10; spec
``linear-attention-architectures.md`` §2.3, "additive" rule, no normaliser) is g = 0. Lightning
Attention (HypeNet, arXiv 2601.22156; spec ``hypenet-halo.md`` §1.5 items 5-6) is a fixed per-head
g_t = log(gamma_h). This is FLA's ``simple_gla`` (``fla/ops/simple_gla/naive.py``).

Two exact forms live here (no chunk approximation):

* :func:`simple_gla_reference`: the token-serial ``lax.scan`` recurrence, written for clarity;
* :func:`simple_gla_associative`: the same states from ``jax.lax.associative_scan``. Each token
  is the affine map ``S -> a_t S + B_t`` with a *scalar* ``a_t = exp(g_t)`` and
  ``B_t = k_t v_t^T``; maps compose as ``(a2, B2) o (a1, B1) = (a2 a1, a2 B1 + B2)``, so the
  diagonal-decay case needs no ``K x K`` matrices (unlike
  :func:`pallas_kernels.common.associative.affine_associative_scan`).

Everything runs in fp32 with ``Precision.HIGHEST``. Input validation, GVA head expansion and the
output dtype are handled by :func:`pallas_kernels.simple_gla.api.simple_gla`.
"""

from typing import Optional, Tuple

import jax
import jax.numpy as jnp

from pallas_kernels import common

_HIGHEST = jax.lax.Precision.HIGHEST


def _document_starts(segment_ids: Optional[jax.Array], shape: Tuple[int, int]) -> jax.Array:
    """bool ``[B, T]``: true where a new document starts (never at ``t = 0``)."""
    if segment_ids is None:
        return jnp.zeros(shape, bool)
    doc = common.document_index(segment_ids)  # [B, T]
    return jnp.concatenate([jnp.zeros_like(doc[:, :1], bool), doc[:, 1:] != doc[:, :-1]], axis=1)


def simple_gla_reference(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: Optional[jax.Array],
    *,
    scale: float,
    initial_state: Optional[jax.Array] = None,
    segment_ids: Optional[jax.Array] = None,
) -> Tuple[jax.Array, jax.Array]:
    """Runs ``S_t = exp(g_t) S_{t-1} + k_t v_t^T`` one token at a time with ``lax.scan``.

    Args:
        q: queries ``[B, T, H, K]`` (already expanded to the value heads).
        k: keys ``[B, T, H, K]``.
        v: values ``[B, T, H, V]``.
        g: per-token, per-head log-decay ``[B, T, H]`` in natural-log units (``<= 0``), or
            ``None`` for no decay (plain linear attention).
        scale: read-out scale applied to ``S_t^T q_t`` (usually ``K ** -0.5``).
        initial_state: ``[B, H, K, V]`` state before the first token, or ``None`` for zeros. It
            applies to the first document of each row only.
        segment_ids: optional int ``[B, T]``. A new document starts wherever
            ``segment_ids[:, t] != segment_ids[:, t - 1]``; the state is reset to zero there.

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
    if initial_state is None:
        initial_state = jnp.zeros((batch, heads, dk, dv), f32)
    resets = _document_starts(segment_ids, (batch, seq_len))

    def step(state, xs):
        q_t, k_t, v_t, g_t, reset_t = xs  # [B, H, K], [B, H, K], [B, H, V], [B, H] | None, [B]
        state = jnp.where(reset_t[:, None, None, None], 0.0, state)  # new document: zero state
        if g_t is not None:
            state = jnp.exp(g_t)[..., None, None] * state
        state = state + k_t[..., :, None] * v_t[..., None, :]
        o_t = scale * jnp.einsum("bhk,bhkv->bhv", q_t, state, precision=_HIGHEST)
        return state, o_t

    def time_major(x):
        return None if x is None else jnp.moveaxis(x.astype(f32), 1, 0)

    xs = (time_major(q), time_major(k), time_major(v), time_major(g), jnp.moveaxis(resets, 1, 0))
    final_state, o = jax.lax.scan(step, initial_state.astype(f32), xs)
    return jnp.moveaxis(o, 0, 1), final_state


def _compose(earlier, later):
    """Returns ``later o earlier`` = ``(a2 a1, a2 B1 + B2)`` for scalar-decay affine steps."""
    a1, b1 = earlier  # [..., H], [..., H, K, V]
    a2, b2 = later
    return a2 * a1, a2[..., None, None] * b1 + b2


def simple_gla_associative(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: Optional[jax.Array],
    *,
    scale: float,
    initial_state: Optional[jax.Array] = None,
    segment_ids: Optional[jax.Array] = None,
) -> Tuple[jax.Array, jax.Array]:
    """Computes every state with ``jax.lax.associative_scan`` over scalar-decay affine maps.

    Token t is the map ``S -> a_t S + B_t`` with ``a_t = exp(g_t)`` (0 at a document start,
    which forgets everything before it) and ``B_t = k_t v_t^T``. The composed decays are
    products of ``a_t`` in linear space: under strong decay they underflow to exactly 0, which
    is the correct limit (no ``inf``/``nan``, unlike a ratio of cumulative products). Work is
    ``O(T K V log T)`` and memory ``O(T K V)`` per head (every state is materialised), so this
    form is meant for checking, short sequences and composing shard states.

    Args:
        q: queries ``[B, T, H, K]`` (already expanded to the value heads).
        k: keys ``[B, T, H, K]``.
        v: values ``[B, T, H, V]``.
        g: log-decay ``[B, T, H]`` (``<= 0``), or ``None`` for no decay.
        scale: read-out scale applied to ``S_t^T q_t``.
        initial_state: ``[B, H, K, V]`` state before the first token, or ``None`` for zeros. It
            applies to the first document of each row only.
        segment_ids: optional int ``[B, T]``; the state is reset to zero wherever
            ``segment_ids[:, t] != segment_ids[:, t - 1]``.

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
    q, k, v = (jnp.asarray(x, f32) for x in (q, k, v))  # jax.Arrays (b.at below), NumPy too
    batch, seq_len, heads, dk = k.shape
    resets = _document_starts(segment_ids, (batch, seq_len))  # [B, T]

    a = jnp.ones((batch, seq_len, heads), f32) if g is None else jnp.exp(g.astype(f32))
    a = jnp.where(resets[:, :, None], 0.0, a)  # [B, T, H]
    b = k[..., :, None] * v[..., None, :]  # [B, T, H, K, V]
    if initial_state is not None:
        # Fold S_{-1} into the first step, S_0 = a_0 S_{-1} + B_0; the composed a's are then
        # never applied to a state, so this is exact.
        b = b.at[:, 0].add(a[:, 0, :, None, None] * initial_state.astype(f32))
    _, states = jax.lax.associative_scan(_compose, (a, b), axis=1)  # [B, T, H, K, V]
    o = scale * jnp.einsum("bthkv,bthk->bthv", states, q, precision=_HIGHEST)
    return o, states[:, -1]
