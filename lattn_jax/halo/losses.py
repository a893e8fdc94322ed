"""HALO losses (arXiv 2601.22156; spec ``hypenet-halo.md`` §3.1, §3.3, §3.4, §6 items 1-2, 17).

* Stage 1, :func:`layer_mse`: mean squared error between every student mixer output and the
  teacher attention output of the same layer, averaged over ``(L, B, T, D)`` with equal weight
  per layer (``F.mse_loss`` on the stacked outputs).
* Stage 2, :func:`forward_kl`: ``KL(p_T || p_S) = sum_v p_T(v) (log p_T(v) - log p_S(v))`` per
  token at temperature ``tau`` (1 in HALO), averaged over the (unmasked) tokens; computed in fp32
  and in token chunks to bound memory (spec §6 item 2). When the two vocabularies differ the
  logits are truncated to the shared (smaller) width.
* Stage 3: the usual next-token cross-entropy (:func:`lattn_jax.train.cross_entropy_loss`).
"""

from typing import Optional

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
