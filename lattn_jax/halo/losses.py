"""HALO losses (arXiv 2601.22156; spec ``hypenet-halo.md`` §3.1, §3.3, §3.4, §6 items 1-2, 17).

* Stage 1, :func:`layer_mse`: mean squared error between every student mixer output and the
  teacher attention output of the same layer, averaged over ``(L, B, T, D)`` with equal weight
  per layer (``F.mse_loss`` on the stacked outputs).
* Stage 2, :func:`forward_kl`: ``KL(p_T || p_S) = sum_v p_T(v) (log p_T(v) - log p_S(v))`` per
  token at temperature ``tau`` (1 in HALO), averaged over the (unmasked) tokens; computed in fp32
  and in token chunks to bound memory (spec §6 item 2). When the two vocabularies differ the
  logits are truncated to the shared (smaller) width.
* Stage 3: the usual next-token cross-entropy (:func:`lattn_jax.train.cross_entropy_loss`).

Fused head + loss (:func:`chunked_forward_kl`, :func:`chunked_cross_entropy`): the same two
losses computed from the LM head's input ``[B, T, D]`` and the head ``[D, S]``
(``LanguageModel(..., return_hidden=True)`` and ``LanguageModel.head_kernel()``), ``chunk_size``
tokens at a time under ``jax.checkpoint``, so the fp32 ``[B T, S]`` logits are never stored, in
the forward or for the backward (at ``S = 49,152`` and ``B T = 49,152`` they would take 9.7 GB
per model).
"""

import functools
import operator
from typing import Optional, Tuple

import jax
import jax.numpy as jnp

from lattn_jax.typing import Array


def layer_mse(student: Array, teacher: Array) -> Array:
    """Stage-1 loss ``mean((y_S - y_T)^2)`` over all elements (spec §3.1), fp32 scalar.

    Args:
      student: ``[L, B, T, D]`` student mixer outputs (after the output projection).
      teacher: ``[L, B, T, D]`` teacher attention outputs on the same inputs.

    Raises:
      ValueError: if the shapes differ.
    """
    if student.shape != teacher.shape:
        raise ValueError(f"{student.shape=} != {teacher.shape=}")
    diff = student.astype(jnp.float32) - teacher.astype(jnp.float32)
    return jnp.mean(jnp.square(diff))


def _token_kl(t_logits: Array, s_logits: Array, temperature: float) -> Array:
    """Per-token ``KL(softmax(t / tau) || softmax(s / tau))``, fp32 ``[N]``."""
    log_pt = jax.nn.log_softmax(t_logits.astype(jnp.float32) / temperature, axis=-1)
    log_ps = jax.nn.log_softmax(s_logits.astype(jnp.float32) / temperature, axis=-1)
    return jnp.sum(jnp.exp(log_pt) * (log_pt - log_ps), axis=-1)


def forward_kl(teacher_logits: Array, student_logits: Array, weights: Optional[Array] = None,
               *, temperature: float = 1.0, chunk_size: Optional[int] = None) -> Array:
    """Stage-2 loss: the token-mean forward KL divergence ``KL(teacher || student)``.

    ``loss = sum_n w_n KL_n / max(sum_n w_n, 1)`` with
    ``KL_n = sum_v p_T(v|n) (log p_T(v|n) - log p_S(v|n))`` and ``p = softmax(logits / tau)``
    (spec §3.3; the fixed, all-token mean of §6 item 1). Without ``weights`` every position
    counts (the authors' ``/ (B T)``); with them, padding (weight 0) is masked.

    Args:
      teacher_logits: ``[B, T, V_T]`` any float dtype (no gradient is taken through it by the
        caller's ``stop_gradient``).
      student_logits: ``[B, T, V_S]``.
      weights: optional ``[B, T]`` (1 real token, 0 padding).
      temperature: ``tau > 0`` (HALO: 1).
      chunk_size: if set, tokens are processed ``chunk_size`` at a time with ``lax.map`` so that
        only ``chunk_size x V`` fp32 softmaxes live at once.

    Returns:
      fp32 scalar.

    Raises:
      ValueError: on mismatched ``[B, T]``, ``temperature <= 0`` or ``chunk_size < 1``.
    """
    if teacher_logits.shape[:-1] != student_logits.shape[:-1]:
        raise ValueError(f"{teacher_logits.shape=} and {student_logits.shape=} differ in [B, T]")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    vocab = min(teacher_logits.shape[-1], student_logits.shape[-1])
    t = teacher_logits[..., :vocab].reshape(-1, vocab)  # [N, V]
    s = student_logits[..., :vocab].reshape(-1, vocab)
    n = t.shape[0]
    w = (jnp.ones((n,), jnp.float32) if weights is None
         else weights.reshape(-1).astype(jnp.float32))
    if chunk_size is None or chunk_size >= n:
        kl = _token_kl(t, s, temperature)
    else:
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        pad = (-n) % chunk_size
        tp = jnp.pad(t, ((0, pad), (0, 0))).reshape(-1, chunk_size, vocab)  # [N/C, C, V]
        sp = jnp.pad(s, ((0, pad), (0, 0))).reshape(-1, chunk_size, vocab)
        kl = jax.lax.map(lambda ab: _token_kl(ab[0], ab[1], temperature), (tp, sp))
        kl = kl.reshape(-1)[:n]
    return jnp.sum(kl * w) / jnp.maximum(jnp.sum(w), 1.0)


def _check_chunk_size(chunk_size) -> int:
    """``chunk_size`` as a Python int ``>= 1``, else ``ValueError``."""
    try:
        value = operator.index(chunk_size)
    except TypeError:
        value = None
    if value is None or isinstance(chunk_size, bool) or value < 1:
        raise ValueError(f"chunk_size must be an int >= 1, got {chunk_size!r}")
    return value


def _check_hidden_head(hidden_name: str, hidden: Array, head_name: str, head: Array) -> None:
    """``hidden`` must be float ``[B, T, D]`` and ``head`` float ``[D, S]``, else ``ValueError``."""
    if hidden.ndim != 3 or not jnp.issubdtype(hidden.dtype, jnp.floating):
        raise ValueError(f"{hidden_name} must be a float [B, T, D] array, got shape "
                         f"{hidden.shape} dtype {hidden.dtype}")
    if (head.ndim != 2 or head.shape[0] != hidden.shape[-1]
            or not jnp.issubdtype(head.dtype, jnp.floating)):
        raise ValueError(f"{head_name} must be a float [D, S] array with D = "
                         f"{hidden_name}.shape[-1] = {hidden.shape[-1]}, got shape {head.shape} "
                         f"dtype {head.dtype}")


def _check_weights(weights: Optional[Array], bt: Tuple[int, int]) -> None:
    """``weights`` must be ``None`` or ``[B, T]``, else ``ValueError``."""
    if weights is not None and tuple(weights.shape) != tuple(bt):
        raise ValueError(f"weights must be [B, T] = {tuple(bt)}, got shape {weights.shape}")


def _chunks(x: Array, chunk: int, num_chunks: int) -> Array:
    """``[N, ...]`` -> ``[num_chunks, chunk, ...]``, zero-padded at the end."""
    pad = num_chunks * chunk - x.shape[0]
    x = jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1))
    return x.reshape((num_chunks, chunk) + x.shape[1:])


def _chunk_layout(n: int, chunk_size: int) -> Tuple[int, int]:
    """``(chunk, num_chunks)`` covering ``n`` tokens with ``chunk <= chunk_size``.

    ``num_chunks = ceil(n / chunk_size)`` and the chunks are balanced (``chunk =
    ceil(n / num_chunks)``), so at most ``num_chunks - 1`` padding tokens are added (``n = 10``,
    ``chunk_size = 2048`` is one chunk of 10, not 2048).
    """
    num_chunks = -(-n // chunk_size)
    return max(1, -(-n // max(num_chunks, 1))), num_chunks


def chunked_cross_entropy(hidden: Array, head: Array, targets: Array,
                          weights: Optional[Array] = None, *,
                          chunk_size: int = 2048) -> Tuple[Array, Array, Array]:
    """Stage-3 loss (spec §3.4): token-weighted mean next-token cross-entropy fused with the head.

    ``CE_n = logsumexp_v(z_n) - z_n[y_n]`` in nats with logits ``z_n = h_n W`` (fp32),
    ``sum = sum_n w_n CE_n``, ``count = sum_n w_n``, ``mean = sum / max(count, 1)``: the contract
    and values of :func:`lattn_jax.train.cross_entropy_loss` on the logits ``hidden @ head``
    (the authors use cut-cross-entropy, spec §3.4), without storing those logits.

    The ``N = B T`` tokens are split into ``ceil(N / chunk_size)`` equal chunks of at most
    ``chunk_size`` tokens (the last padded with weight-0 tokens) and reduced by ``lax.scan``
    whose body is under ``jax.checkpoint``: each chunk's logits are computed by one matmul
    ``jnp.dot(h, W, preferred_element_type=float32)`` (bf16 operands stay bf16, accumulation is
    fp32), reduced to a scalar, and recomputed in the backward pass. Memory: about
    ``chunk_size x S x 4`` bytes of fp32 logits per live chunk (plus same-sized XLA
    temporaries) instead of ``N x S x 4``; cost: one extra ``[C, D] x [D, S]`` matmul per chunk
    in the backward.

    Args:
      hidden: ``[B, T, D]`` any float dtype: the LM head's input
        (``LanguageModel(..., return_hidden=True)``).
      head: ``[D, S]`` any float dtype (``LanguageModel.head_kernel()``). The matmul runs in
        ``jnp.result_type(hidden, head)``; ``head``'s gradient is accumulated over the chunks in
        fp32 and cast to ``head.dtype`` once.
      targets: int ``[B, T]`` next-token ids in ``[0, S)``.
      weights: optional ``[B, T]`` (0 masks a position); ``None`` counts every position.
      chunk_size: maximum tokens per chunk (``>= 1``).

    Returns:
      ``(mean, sum, count)`` fp32 scalars (nats per token, nats, weighted token count).
      Gradients flow to ``hidden`` and ``head`` (and ``weights``).

    Raises:
      ValueError: naming the argument, if ``hidden`` is not float ``[B, T, D]``, ``head`` not
        float ``[D, S]`` with the same ``D``, ``targets`` not an int ``[B, T]`` array,
        ``weights`` not ``[B, T]``, or ``chunk_size`` not an int ``>= 1``.
    """
    _check_hidden_head("hidden", hidden, "head", head)
    b, t, d = hidden.shape
    if tuple(targets.shape) != (b, t) or not jnp.issubdtype(targets.dtype, jnp.integer):
        raise ValueError(f"targets must be an int [B, T] = {(b, t)} array, got shape "
                         f"{targets.shape} dtype {targets.dtype}")
    _check_weights(weights, (b, t))
    chunk_size = _check_chunk_size(chunk_size)
    n = b * t
    w = (jnp.ones((n,), jnp.float32) if weights is None
         else weights.reshape(-1).astype(jnp.float32))  # [N]
    count = jnp.sum(w)
    chunk, num_chunks = _chunk_layout(n, chunk_size)
    cdt = jnp.result_type(hidden.dtype, head.dtype)
    xs = (_chunks(hidden.reshape(n, d), chunk, num_chunks),  # [N/C, C, D]
          _chunks(targets.reshape(n), chunk, num_chunks),  # [N/C, C]
          _chunks(w, chunk, num_chunks))  # [N/C, C]
    head32 = head.astype(jnp.float32)  # the scan's gradient accumulator for head is fp32

    @functools.partial(jax.checkpoint, prevent_cse=False)
    def chunk_sum(head32, h, y, wc):
        z = jnp.dot(h.astype(cdt), head32.astype(cdt),
                    preferred_element_type=jnp.float32)  # [C, S] fp32
        lse = jax.nn.logsumexp(z, axis=-1)  # [C]
        target = jnp.take_along_axis(z, y[:, None].astype(jnp.int32), axis=-1)[:, 0]  # [C]
        return jnp.sum((lse - target) * wc)

    def body(total, x):
        return total + chunk_sum(head32, *x), None

    total, _ = jax.lax.scan(body, jnp.zeros((), jnp.float32), xs)
    return total / jnp.maximum(count, 1.0), total, count


def chunked_forward_kl(teacher_hidden: Array, teacher_head: Array, student_hidden: Array,
                       student_head: Array, weights: Optional[Array] = None, *,
                       temperature: float = 1.0, chunk_size: int = 2048) -> Array:
    """Stage-2 loss (spec §3.3): :func:`forward_kl` fused with both LM heads.

    ``loss = sum_n w_n KL_n / max(sum_n w_n, 1)`` with
    ``KL_n = sum_v p_T(v|n) (log p_T(v|n) - log p_S(v|n))`` in nats,
    ``p_T = softmax(h^T_n W_T / tau)``, ``p_S = softmax(h^S_n W_S / tau)`` over the shared
    vocabulary ``v < min(S_T, S_S)`` (the heads are truncated to it), all in fp32: the value of
    :func:`forward_kl` on the two models' logits (the authors' ``F.kl_div`` in 512-row chunks,
    divided by ``B T`` when ``weights`` is ``None``), without storing those logits.

    The ``N = B T`` tokens are split into ``ceil(N / chunk_size)`` equal chunks of at most
    ``chunk_size`` tokens (the last padded with weight-0 tokens) and reduced by ``lax.scan``
    whose body is under ``jax.checkpoint``: each chunk's logits are computed by
    ``jnp.dot(h, W, preferred_element_type=float32)`` (bf16 operands stay bf16, accumulation is
    fp32), reduced to a scalar, and recomputed in the backward pass. Memory: about
    ``2 x chunk_size x S x 4`` bytes of fp32 logits per live chunk (teacher and student, plus
    same-sized XLA temporaries) instead of ``2 x N x S x 4``; cost: the teacher's and the
    student's chunk matmuls are recomputed in the backward.

    Args:
      teacher_hidden: ``[B, T, D_T]`` any float dtype, the teacher's LM-head input; under
        ``stop_gradient`` (no gradient reaches it or ``teacher_head``).
      teacher_head: ``[D_T, S_T]`` any float dtype.
      student_hidden: ``[B, T, D_S]`` any float dtype, the student's LM-head input.
      student_head: ``[D_S, S_S]`` any float dtype; its gradient is accumulated over the chunks
        in fp32 and cast to ``student_head.dtype`` once (columns ``>= S_T`` get zero).
      weights: optional ``[B, T]`` (1 real token, 0 padding); ``None`` counts every position.
      temperature: ``tau > 0`` (HALO: 1).
      chunk_size: maximum tokens per chunk (``>= 1``).

    Returns:
      fp32 scalar (nats per token); differentiable in ``student_hidden`` and ``student_head``.

    Raises:
      ValueError: naming the argument, if a hidden array is not float ``[B, T, D]``, a head not
        float ``[D, S]`` with its hidden's ``D``, the two hidden arrays differ in ``[B, T]``,
        ``weights`` is not ``[B, T]``, ``temperature <= 0`` or ``chunk_size`` is not an int
        ``>= 1``.
    """
    _check_hidden_head("teacher_hidden", teacher_hidden, "teacher_head", teacher_head)
    _check_hidden_head("student_hidden", student_hidden, "student_head", student_head)
    if teacher_hidden.shape[:2] != student_hidden.shape[:2]:
        raise ValueError(f"student_hidden must have teacher_hidden's [B, T] = "
                         f"{teacher_hidden.shape[:2]}, got shape {student_hidden.shape}")
    b, t = student_hidden.shape[:2]
    _check_weights(weights, (b, t))
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    chunk_size = _check_chunk_size(chunk_size)
    n = b * t
    vocab = min(teacher_head.shape[1], student_head.shape[1])
    w = (jnp.ones((n,), jnp.float32) if weights is None
         else weights.reshape(-1).astype(jnp.float32))  # [N]
    chunk, num_chunks = _chunk_layout(n, chunk_size)
    t_dt = jnp.result_type(teacher_hidden.dtype, teacher_head.dtype)
    s_dt = jnp.result_type(student_hidden.dtype, student_head.dtype)
    t_head = jax.lax.stop_gradient(teacher_head[:, :vocab]).astype(t_dt)  # [D_T, V]
    s_head32 = student_head[:, :vocab].astype(jnp.float32)  # [D_S, V] fp32 grad accumulator
    t_hidden = jax.lax.stop_gradient(teacher_hidden).reshape(n, teacher_hidden.shape[-1])
    xs = (_chunks(t_hidden, chunk, num_chunks),  # [N/C, C, D_T]
          _chunks(student_hidden.reshape(n, student_hidden.shape[-1]), chunk,
                  num_chunks),  # [N/C, C, D_S]
          _chunks(w, chunk, num_chunks))  # [N/C, C]

    @functools.partial(jax.checkpoint, prevent_cse=False)
    def chunk_sum(t_head, s_head32, th, sh, wc):
        t_logits = jnp.dot(th.astype(t_dt), t_head,
                           preferred_element_type=jnp.float32)  # [C, V] fp32
        s_logits = jnp.dot(sh.astype(s_dt), s_head32.astype(s_dt),
                           preferred_element_type=jnp.float32)  # [C, V] fp32
        kl = _token_kl(jax.lax.stop_gradient(t_logits), s_logits, temperature)  # [C]
        return jnp.sum(kl * wc)

    def body(total, x):
        return total + chunk_sum(t_head, s_head32, *x), None

    total, _ = jax.lax.scan(body, jnp.zeros((), jnp.float32), xs)
    return total / jnp.maximum(jnp.sum(w), 1.0)
