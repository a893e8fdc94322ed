"""Context parallelism: one sequence split over the ``context`` mesh axis.

With ``mesh.context = n > 1`` the sequence axis of every activation (logical name ``act_len``)
is split into ``n`` contiguous shards of ``T / n`` tokens. Per-token layers (projections, norms,
MLPs, the loss) need nothing; the three places where tokens meet run here, inside
``jax.shard_map`` over the mesh (batch rows over ``data``/``fsdp``, heads or channels over
``tensor`` when they divide, the sequence over ``context``):

* **Linear recurrences** (GDN, DeltaNet, KDA, GDN-2, simple GLA / Lightning / linear attention;
  :func:`linear_recurrence`). Every such layer has a state ``S [K, V]`` per head whose update is
  affine in the previous state, ``S_t = A_t S_{t-1} + B_t`` with ``A_t [K, K]`` independent of
  ``S`` and of the values (``A_t = exp(g_t)(I - beta_t k_t k_t^T)`` for GDN, paper 1 Eq. 16;
  ``(I - k_t (b_t * k_t)^T) Diag(exp g_t)`` for GDN-2, Eq. 24; ``Diag(exp g_t)(I - beta k k^T)``
  for KDA; ``exp(g_t) I`` for simple GLA). A shard's whole effect is therefore the affine map
  ``S_exit = M S_entry + X`` (``M = A_T' ... A_1``), and every output is affine in the entry
  state too: ``o_t = o_t(0) + S_entry^T oI_t`` with ``oI_t = scale M_{<=t}^T q_t``. Each shard
  runs the existing op (Pallas on GPU/TPU, chunked elsewhere) twice on its own tokens: once on
  its values from a zero state (``o(0)``, ``X``) and once with zero values from the identity
  state (``oI``, ``M``: the same recurrence with ``V = K``). The summaries ``(M, X)`` are
  combined across shards by a Hillis-Steele prefix of ``ceil(log2 n)`` ``ppermute`` steps,
  ``(M_2, X_2) o (M_1, X_1) = (M_2 M_1, M_2 X_1 + X_2)``, each moving ``H K (K + V)`` fp32
  values per row whatever ``T``; the entry state is the previous shard's inclusive prefix, and
  the outputs are corrected by one ``[T, K] x [K, V]`` product per head. The backward pass is
  JAX's transpose of the same program (``ppermute`` runs backwards), so gradients with respect
  to every input, gate and the initial state are exact.
* **Short convolutions** (:func:`short_conv`): each shard receives the last ``W - 1`` inputs
  (and their segment ids) of the previous shard by one ``ppermute`` (the halo) and convolves
  its tokens with them in front; taps never cross a document start.
* **Softmax attention** (:func:`attention`): keys, values and document indices are gathered over
  ``context`` and each shard attends its queries over them block by block with an online
  softmax in fp32 (peak memory ``[B, H, T / n, T / n]`` scores per block, not ``[T, T]``); the
  causal mask uses global positions and tokens attend only within their document.

Packed documents: a document boundary that falls on a shard edge is detected by comparing the
first segment id of a shard with the last one of the previous shard; a document may span any
number of shards. Semantics equal the single-device ops exactly (an ``initial_state`` applies
to the row's first document; the final state belongs to its last document).

Cost model (per linear layer, per row, per step; BUILD.md "Context parallelism"):
``2 ceil(log2 n)`` messages of ``H K (K + V)`` fp32 values forward (twice that with the
backward) plus a ``(W - 1) C`` halo, against ``(n - 1)/n T (2 H K + H V)`` activation values
for an all-gather of q, k, v. Compute: the op runs twice on ``V`` and ``K`` columns (about 2x
the recurrence's FLOPs for ``K = V``) plus ``2 T H K V`` for the correction.
"""

import math
from typing import Callable, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from lattn_jax import config as config_lib
from lattn_jax.causal_conv import causal_conv1d
from lattn_jax import sharding
from lattn_jax.typing import Array
from pallas_kernels.common import validation

CONTEXT_AXIS = "context"
_HIGHEST = jax.lax.Precision.HIGHEST


# -------------------------------------------------------------------------------------------
# Where the sequence is split
# -------------------------------------------------------------------------------------------


def check_sequence_length(seq_len: int, context: int,
                          model_config: Optional[config_lib.ModelConfig] = None) -> None:
    """Refuses a sequence length that ``mesh.context`` shards cannot hold.

    Args:
      seq_len: tokens per row (``data.seq_len``).
      context: the resolved ``mesh.context`` size.
      model_config: optional; its short convolutions need shards of at least ``W - 1`` tokens.

    Raises:
      ConfigError: if ``seq_len`` is not a multiple of ``context``, or a shard is shorter than a
        convolution's halo.
    """
    if context <= 1:
        return
    if seq_len % context:
        raise config_lib.ConfigError(
            f"data.seq_len={seq_len} is not a multiple of mesh.context={context}: context "
            f"parallelism splits every sequence into {context} equal shards")
    halo = conv_halo(model_config)
    if seq_len // context < max(halo, 1):
        raise config_lib.ConfigError(
            f"data.seq_len={seq_len} over mesh.context={context} leaves {seq_len // context} "
            f"tokens per shard, fewer than the short convolution's {halo}-token halo")


def conv_halo(model_config: Optional[config_lib.ModelConfig]) -> int:
    """The longest short-convolution halo (``conv_width - 1``) of the model's linear mixer
    sections, 0 without a model config or without convolutions."""
    widths = [getattr(getattr(model_config, name, None), "conv_width", 0) or 0
              for name in ("gdn", "deltanet", "kda", "gdn2", "linear_attn", "lightning")]
    return max(max(widths, default=0) - 1, 0)


def padding_bucket(base: int, context: int,
                   model_config: Optional[config_lib.ModelConfig] = None) -> int:
    """The length that evaluation and generation pad a batch to a multiple of under
    ``--context``: a multiple of ``lcm(base, context)`` whose ``context`` shards each hold at
    least the short convolution's halo (:func:`conv_halo`), so that a short prompt still
    splits (``base = 16, context = 8`` and a width-4 convolution give 32, not 16).

    Raises:
      ValueError: if ``base`` or ``context`` is below 1.
    """
    if base < 1 or context < 1:
        raise ValueError(f"padding_bucket: base={base} and context={context} must be >= 1")
    bucket = math.lcm(base, context)
    if context == 1:
        return bucket
    shards = -(-conv_halo(model_config) * context // bucket)  # buckets needed, at least 1
    return bucket * max(shards, 1)


def _sequence_axes(length: int) -> Tuple[str, ...]:
    """Mesh axes (size > 1) that the active rules put on ``act_len``; () without a mesh.

    Raises:
      ValueError: if they do not divide ``length`` (a length of 1, one decoding step, is
        never split).
    """
    mesh = sharding.active_mesh()
    if mesh is None or length == 1:
        return ()
    axes = tuple(a for a in sharding.rule_axes("act_len") if mesh.shape[a] > 1)
    size = int(np.prod([mesh.shape[a] for a in axes])) if axes else 1
    if axes and length % size:
        raise ValueError(f"a sequence of {length} tokens does not split over mesh.context="
                         f"{size}; pad it to a multiple of {size}")
    return axes


def is_active(length: int) -> bool:
    """Whether a call over ``length`` tokens runs context-parallel (a mesh with context > 1 is
    active and the call is not a single decoding step).

    Raises:
      ValueError: if the length does not split over the context axis.
    """
    return bool(_sequence_axes(length))


def _layout(letters: str, sizes: dict) -> Tuple[Optional[str], ...]:
    """Spec entries for an array whose dimensions are named by ``letters``: b (rows), t
    (sequence), h (heads or channels); any other letter is an unsplit dimension."""
    return tuple(sizes.get(letter) for letter in letters)


def _spec_axes(b: int, t: int, heads: Sequence[int]) -> dict:
    """Mesh axes for the letters b (rows), t (sequence), h (heads, only if every head count in
    ``heads`` divides) under the active mesh and rules."""
    mesh = sharding.active_mesh()
    out = {}

    def fit(name, sizes):
        kept, divisor = [], 1
        for axis in sharding.rule_axes(name):
            n = mesh.shape[axis]
            if n > 1 and all(s % (divisor * n) == 0 for s in sizes):
                kept.append(axis)
                divisor *= n
        return None if not kept else kept[0] if len(kept) == 1 else tuple(kept)

    out["b"] = fit("act_batch", [b])
    seq = _sequence_axes(t)
    out["t"] = seq[0] if len(seq) == 1 else seq
    out["h"] = fit("act_heads", list(heads))
    return out


def _single_axis(length: int) -> Tuple[str, int]:
    axes = _sequence_axes(length)
    if len(axes) != 1:
        raise ValueError(f"context parallelism needs act_len on exactly one mesh axis, got "
                         f"{axes}")
    return axes[0], sharding.active_mesh().shape[axes[0]]


# -------------------------------------------------------------------------------------------
# Collectives over the context axis
# -------------------------------------------------------------------------------------------


def _from_previous(x: Array, axis: str, n: int, shift: int = 1) -> Array:
    """``x`` of shard ``i - shift`` on shard ``i`` (zeros on the first ``shift`` shards)."""
    return jax.lax.ppermute(x, axis, [(j, j + shift) for j in range(n - shift)])


def _starts_new_document(segment_ids: Optional[Array], axis: str, n: int) -> Array:
    """bool ``[B]``: the shard's first token starts a document (never on shard 0)."""
    if segment_ids is None:
        return jnp.zeros((), bool)
    previous_last = _from_previous(segment_ids[:, -1], axis, n)
    return (jax.lax.axis_index(axis) > 0) & (segment_ids[:, 0] != previous_last)


def affine_prefix(m: Array, x: Array, axis: str, n: int) -> Array:
    """Inclusive prefix of the shards' affine state maps over ``axis``.

    Shard ``i`` holds ``(M_i, X_i)`` with ``S_i = M_i S_{i-1} + X_i``; the result on shard
    ``i`` is ``X_0..i``, the state after shard ``i`` when the state before shard 0 is zero
    (fold a nonzero one into ``X_0``). Hillis-Steele: ``ceil(log2 n)`` steps, each receiving
    ``(M, X)`` from ``d`` shards back and composing ``(M, X) <- (M M', M X' + X)``.

    Args:
      m: fp32 ``[B, H, K, K]``.
      x: fp32 ``[B, H, K, V]``.
      axis: the mesh axis name (inside ``shard_map``).
      n: its size.

    Returns:
      fp32 ``[B, H, K, V]``.
    """
    index = jax.lax.axis_index(axis)
    d = 1
    while d < n:
        m_prev = _from_previous(m, axis, n, d)
        x_prev = _from_previous(x, axis, n, d)
        take = index >= d
        x = jnp.where(take, jnp.einsum("bhij,bhjv->bhiv", m, x_prev, precision=_HIGHEST) + x, x)
        if 2 * d < n:
            m = jnp.where(take, jnp.einsum("bhij,bhjk->bhik", m, m_prev, precision=_HIGHEST), m)
        d *= 2
    return x


# -------------------------------------------------------------------------------------------
# Linear recurrences
# -------------------------------------------------------------------------------------------


def linear_recurrence(op: Callable, q: Array, k: Array, v: Array, gates: Sequence[Array],
                      gate_layouts: Sequence[str], *, segment_ids: Optional[Array] = None,
                      initial_state: Optional[Array] = None, output_final_state: bool = False,
                      return_residual: bool = False) -> Tuple:
    """Runs a linear-recurrence op on a sequence split over the ``context`` mesh axis.

    Without an active context axis (no mesh, ``mesh.context = 1``, or a one-token call) this
    is exactly ``op(q, k, v, *gates, segment_ids=..., initial_state=...,
    output_final_state=...)``.

    Args:
      op: ``op(q, k, v, *gates, segment_ids=, initial_state=, output_final_state=)`` returning
        ``(o, final_state)`` (or ``(o, final_state, u)`` with ``return_residual``), e.g.
        ``functools.partial(gated_delta_rule, chunk_size=64)``. Its state update must be affine
        in the state with a transition independent of the values (every op of
        ``pallas_kernels``), and its output and residual linear in the state.
      q: ``[B, T, HK, K]``.
      k: ``[B, T, HK, K]``.
      v: ``[B, T, H, V]``.
      gates: the op's further arrays, in order.
      gate_layouts: one string per gate naming its dimensions: ``"bth"`` (per token and head),
        ``"bthk"`` (key side), ``"bthv"`` (value side: replaced by ones of width ``K`` in the
        identity pass, where the values are zero), ``"h"`` (per head, constant).
      segment_ids: optional int ``[B, T]``; the state resets at each document start.
      initial_state: optional fp32 ``[B, H, K, V]`` state before the row's first document.
      output_final_state: return the state after the row's last token (its last document).
      return_residual: the op returns the residual ``u [B, T, H, V]`` (affine in the state too).

    Returns:
      ``(o, final_state)`` or ``(o, final_state, u)``: ``o`` and ``u`` ``[B, T, H, V]`` in
      ``v.dtype``, ``final_state`` fp32 ``[B, H, K, V]`` or ``None``.

    Raises:
      ValueError: if ``T`` does not split over the context axis, a gate layout is unknown, or
        from the op.
    """
    b, t, hk, dk = q.shape
    h, dv = v.shape[2:]
    if not is_active(t):
        return op(q, k, v, *gates, segment_ids=segment_ids, initial_state=initial_state,
                  output_final_state=output_final_state)
    for layout in gate_layouts:
        if layout not in ("bth", "bthk", "bthv", "h"):
            raise ValueError(f"unknown gate layout {layout!r}; use bth, bthk, bthv or h")
    axis, n = _single_axis(t)
    sizes = _spec_axes(b, t, (h, hk))
    spec = lambda letters: jax.sharding.PartitionSpec(*_layout(letters, sizes))  # noqa: E731
    has_state = initial_state is not None
    has_seg = segment_ids is not None

    def body(q, k, v, segment_ids, initial_state, *gates):
        index = jax.lax.axis_index(axis)
        rows, heads = v.shape[0], v.shape[2]
        local_init = None
        if has_state:
            local_init = jnp.where(index == 0, initial_state.astype(jnp.float32), 0.0)
        outs = op(q, k, v, *gates, segment_ids=segment_ids, initial_state=local_init,
                  output_final_state=True)
        # The identity pass: zero values from S = I give M (final state) and oI, uI.
        ones_k = lambda g: jnp.ones(g.shape[:-1] + (dk,), g.dtype)  # noqa: E731
        gates_i = [ones_k(g) if lay == "bthv" else g for g, lay in zip(gates, gate_layouts)]
        v_i = jnp.zeros(v.shape[:3] + (dk,), v.dtype)
        eye = jnp.broadcast_to(jnp.eye(dk, dtype=jnp.float32), (rows, heads, dk, dk))
        outs_i = op(q, k, v_i, *gates_i, segment_ids=segment_ids, initial_state=eye,
                    output_final_state=True)
        fresh = _starts_new_document(segment_ids if has_seg else None, axis, n)  # [B] or ()
        fresh = jnp.reshape(fresh, (-1, 1, 1, 1)) if fresh.ndim else fresh
        m = jnp.where(fresh | (index == 0), 0.0, outs_i[1])
        inclusive = affine_prefix(m, outs[1].astype(jnp.float32), axis, n)
        entry = jnp.where(fresh, 0.0, _from_previous(inclusive, axis, n))  # [B, H, K, V]

        def correct(y0, y_i):
            fix = jnp.einsum("bthk,bhkv->bthv", y_i.astype(jnp.float32), entry,
                             precision=_HIGHEST)
            return (y0.astype(jnp.float32) + fix).astype(y0.dtype)

        o = correct(outs[0], outs_i[0])
        final = jax.lax.psum(jnp.where(index == n - 1, inclusive, 0.0), axis)
        result = (o, final)
        if return_residual:
            result += (correct(outs[2], outs_i[2]),)
        return result

    seg_arg = segment_ids if has_seg else jnp.zeros((b, t), jnp.int32)
    init_arg = initial_state if has_state else jnp.zeros((b, h, dk, dv), jnp.float32)
    in_specs = (spec("bthc"), spec("bthc"), spec("bthc"), spec("bt"), spec("bhcc"),
                *[spec(lay) for lay in gate_layouts])
    out_specs = (spec("bthc"), spec("bhcc")) + ((spec("bthc"),) if return_residual else ())
    result = jax.shard_map(body, mesh=sharding.active_mesh(), in_specs=in_specs,
                           out_specs=out_specs, check_vma=False)(
        q, k, v, seg_arg, init_arg, *gates)
    if not output_final_state:
        result = (result[0], None) + tuple(result[2:])
    return result


# -------------------------------------------------------------------------------------------
# Short convolution
# -------------------------------------------------------------------------------------------


def short_conv(conv, x: Array, segment_ids: Optional[Array],
               conv_state: Optional[Array], *,
               activation: Optional[str] = None) -> Tuple[Array, Array]:
    """:class:`~lattn_jax.layers.ShortConv` over a sequence split over ``context``.

    Each shard prepends the last ``W - 1`` inputs of the previous shard (shard 0: the incoming
    ``conv_state``, or zeros) with their segment ids, so taps that reach back across the shard
    edge see exactly what the unsplit convolution sees (and nothing across a document start).
    Without an active context axis this is ``conv(x, segment_ids=, conv_state=, activation=)``.

    Args:
      conv: the ``ShortConv`` module (kernel ``[W, C]``).
      x: ``[B, T, C]``.
      segment_ids: optional int ``[B, T]``.
      conv_state: optional ``[B, W - 1, C]`` inputs before ``x`` (they continue the first
        document).
      activation: ``None`` or ``"silu"`` (:func:`lattn_jax.causal_conv.causal_conv1d`).

    Returns:
      ``(y [B, T, C], new_conv_state [B, W - 1, C])`` in the conv's dtype, as ``conv`` returns.

    Raises:
      ValueError: if ``T`` does not split over the context axis or a shard is shorter than
        ``W - 1`` tokens, or ``conv_state`` is not ``[B, W - 1, C]``.
    """
    b, t, c = x.shape
    halo = conv.width - 1
    if not is_active(t) or halo == 0:
        return conv(x, segment_ids=segment_ids, conv_state=conv_state,  # (checks conv_state)
                    activation=activation)
    conv.check_conv_state(conv_state, b, c)
    axis, n = _single_axis(t)
    if t // n < halo:
        raise ValueError(f"{t // n} tokens per context shard are fewer than the convolution's "
                         f"{halo}-token halo")
    sizes = _spec_axes(b, t, (c,))
    spec = lambda letters: jax.sharding.PartitionSpec(*_layout(letters, sizes))  # noqa: E731
    has_seg = segment_ids is not None
    dtype = conv.dtype
    state = (jnp.zeros((b, halo, c), dtype) if conv_state is None
             else conv_state.astype(dtype))

    def body(x, segment_ids, state, kernel):
        index = jax.lax.axis_index(axis)
        x = x.astype(dtype)
        prev_x = _from_previous(x[:, -halo:], axis, n)
        prev_x = jnp.where(index == 0, state, prev_x)
        x_ext = jnp.concatenate([prev_x, x], axis=1)
        seg_ext = None
        if has_seg:
            prev_seg = _from_previous(segment_ids[:, -halo:], axis, n)
            first = jnp.broadcast_to(segment_ids[:, :1], prev_seg.shape)
            prev_seg = jnp.where(index == 0, first, prev_seg)
            seg_ext = jnp.concatenate([prev_seg, segment_ids], axis=1)
        doc = None if seg_ext is None else validation.document_index(seg_ext)
        return causal_conv1d(x_ext, kernel.astype(dtype), doc, activation)

    kernel = conv.kernel[...]
    seg_arg = segment_ids if has_seg else jnp.zeros((b, t), jnp.int32)
    y = jax.shard_map(
        body, mesh=sharding.active_mesh(),
        in_specs=(spec("bth"), spec("bt"), spec("b.h"), spec(".h")),
        out_specs=spec("bth"), check_vma=False)(x, seg_arg, state, kernel)
    new_state = jnp.concatenate([state, x.astype(dtype)[:, -halo:]], axis=1)[:, -halo:]
    return y, new_state


# -------------------------------------------------------------------------------------------
# Softmax attention
# -------------------------------------------------------------------------------------------


def attention(q: Array, k: Array, v: Array, segment_ids: Optional[Array], *,
              scale: float) -> Array:
    """Causal softmax attention of a sequence split over ``context`` (all-gather keys/values).

    ``o_t = softmax(scale q_t K_{s <= t, doc(s) = doc(t)}^T) V`` per query head (Vaswani et al.
    2017, Eq. 1), query head ``n`` reading group ``n // (H / G)``. Each shard gathers keys,
    values and segment ids over ``context`` and visits the ``n`` key blocks with an online
    softmax (Milakov & Gimelshein 2018) in fp32, masking by global position and document.

    Args:
      q: ``[B, T, H, dh]``.
      k: ``[B, T, G, dh]``.
      v: ``[B, T, G, dh]``.
      segment_ids: optional int ``[B, T]``.
      scale: logit scale (``1 / sqrt(dh)``).

    Returns:
      ``[B, T, H, dh]`` in ``q.dtype``.

    Raises:
      ValueError: if ``T`` does not split over the context axis.
    """
    b, t, h, dh = q.shape
    g = k.shape[2]
    axis, n = _single_axis(t)
    sizes = _spec_axes(b, t, (h, g))
    spec = lambda letters: jax.sharding.PartitionSpec(*_layout(letters, sizes))  # noqa: E731
    seg_arg = jnp.zeros((b, t), jnp.int32) if segment_ids is None else segment_ids

    def body(q, k, v, segment_ids):
        index = jax.lax.axis_index(axis)
        rows, tl, heads, _ = q.shape
        groups = k.shape[2]
        k_all = jax.lax.all_gather(k, axis, axis=1, tiled=True)  # [B, T, G, dh]
        v_all = jax.lax.all_gather(v, axis, axis=1, tiled=True)
        doc_all = validation.document_index(
            jax.lax.all_gather(segment_ids, axis, axis=1, tiled=True))  # [B, T]
        doc_q = jax.lax.dynamic_slice_in_dim(doc_all, index * tl, tl, axis=1)  # [B, Tl]
        pos_q = index * tl + jnp.arange(tl)
        qf = q.astype(jnp.float32).reshape(rows, tl, groups, heads // groups, dh) * scale
        m = jnp.full((rows, groups, heads // groups, tl), -jnp.inf, jnp.float32)
        denom = jnp.zeros_like(m)
        acc = jnp.zeros(m.shape + (dh,), jnp.float32)
        for j in range(n):
            kj = k_all[:, j * tl:(j + 1) * tl].astype(jnp.float32)
            vj = v_all[:, j * tl:(j + 1) * tl].astype(jnp.float32)
            s = jnp.einsum("bqgrd,bkgd->bgrqk", qf, kj, precision=_HIGHEST)
            pos_k = j * tl + jnp.arange(tl)
            mask = (pos_k[None, :] <= pos_q[:, None])[None] & (
                doc_all[:, None, j * tl:(j + 1) * tl] == doc_q[:, :, None])  # [B, Tl, Tl]
            s = jnp.where(mask[:, None, None], s, -jnp.inf)
            # The running maximum is a constant of the math (the softmax does not depend on
            # it), so no gradient flows through it.
            m_new = jnp.maximum(m, jax.lax.stop_gradient(jnp.max(s, axis=-1)))
            base = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
            p = jnp.exp(s - base[..., None])
            carry = jnp.exp(m - base)
            denom = denom * carry + jnp.sum(p, axis=-1)
            acc = acc * carry[..., None] + jnp.einsum("bgrqk,bkgd->bgrqd", p, vj,
                                                      precision=_HIGHEST)
            m = m_new
        o = acc / denom[..., None]  # every query sees itself: denom > 0
        return o.transpose(0, 3, 1, 2, 4).reshape(rows, tl, heads, dh).astype(q.dtype)

    return jax.shard_map(
        body, mesh=sharding.active_mesh(),
        in_specs=(spec("bthc"), spec("bthc"), spec("bthc"), spec("bt")),
        out_specs=spec("bthc"), check_vma=False)(q, k, v, seg_arg)


def check_context(context: int, num_devices: Optional[int] = None) -> None:
    """Checks the ``--context`` flag of the evaluation and generation binaries against the
    device count (default: ``jax.device_count()``), before any model is loaded.

    Raises:
      ValueError: ``"--context=2 needs a multiple of 2 devices; there is 1"``, or
        ``"--context=0 must be >= 1"``.
    """
    num_devices = jax.device_count() if num_devices is None else num_devices
    if context < 1:
        raise ValueError(f"--context={context} must be >= 1")
    if num_devices % context:
        raise ValueError(f"--context={context} needs a multiple of {context} devices; there "
                         f"{'is' if num_devices == 1 else 'are'} {num_devices}")


def evaluation_mesh(context: int, devices: Optional[Sequence] = None):
    """The mesh for evaluation and generation with sequences split over ``context`` devices.

    ``data x context`` over ``devices`` (default: all): ``context`` devices per sequence, the
    remaining factor splits the batch. ``context = 1`` gives ``None`` (the plain path).

    Raises:
      ValueError: if ``context < 1`` or it does not divide the number of devices
        (:func:`check_context`).
    """
    devices = list(jax.devices() if devices is None else devices)
    check_context(context, len(devices))
    if context == 1:
        return None
    return sharding.make_mesh(config_lib.MeshConfig(data=-1, context=context), devices)


def replicate(model, mesh):
    """``model`` (an NNX module) with every parameter replicated over ``mesh``; the module
    itself when ``mesh`` is ``None``."""
    if mesh is None:
        return model
    from flax import nnx  # local: the op-level code above does not need Flax

    graphdef, state = nnx.split(model)
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    return nnx.merge(graphdef, jax.device_put(state, replicated))


def halo_bytes(heads: int, head_k_dim: int, head_v_dim: int, context: int) -> int:
    """fp32 bytes one row sends per linear layer in the forward prefix: ``ceil(log2 n)`` steps of
    ``H K (K + V)`` values (BUILD.md's cost model)."""
    steps = math.ceil(math.log2(context)) if context > 1 else 0
    return 4 * steps * heads * head_k_dim * (head_k_dim + head_v_dim)
