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
tokens at a time, so the fp32 ``[B T, S]`` logits are never stored (at ``S = 49,152`` and
``B T = 49,152`` they would take 9.7 GB per model). Under differentiation each chunk's gradient
is formed in the same pass as its loss (the loss is a sum over tokens, so ``dL/dz`` of a chunk
needs only that chunk's softmax): the logits cotangent ``dz`` (fp32) is rounded to the matmul's
dtype and multiplied by the head (hidden gradient) and the hidden states (head gradient, fp32
accumulation), and the backward pass only scales the stored gradients by the incoming
cotangent. Four ``[C, D] x [D, S]``-sized matmuls per chunk (KL: two logits, two gradients),
against six for recomputing the logits in a checkpointed backward, whose logits cotangent was
moreover fp32 and ran the two gradient matmuls in fp32 (TF32 on Hopper: 23 of the 78 ms of the
Stage-2 head at the SmolLM2 shape, ``benchmarks/results/profile-halo-stage2-2026-12-03.md``).
"""

import functools
import math
import operator
from typing import Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

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


def weighted_sum(values: Array, weights: Array) -> Array:
    """``sum_n w_n x_n`` over all elements, where a position of weight 0 adds nothing even if
    its ``x_n`` is NaN or inf (padding rows; ``0 x NaN`` would be NaN). Where ``x_n`` is finite
    the sum and its gradients are those of ``sum(x * w)`` (``d/dw_n = x_n`` at weight 0 too).

    Args:
      values, weights: the same shape (``[N]`` or ``[B, T]``), float; fp32 in the losses.

    Returns:
      scalar in ``jnp.result_type(values, weights)``.
    """
    return jnp.sum(jnp.where(jnp.isfinite(values) | (weights != 0), values * weights, 0.0))


@jax.custom_jvp
def logsumexp_one_pass(z: Array) -> Array:
    """``log sum_v exp(z_v)`` over the last axis in one read of ``z`` (online log-sum-exp).

    ``jax.nn.logsumexp`` reads ``z`` twice (its maximum, then ``sum exp(z - max)``); at HALO's
    head (``[4096, 49152]`` fp32 per chunk) each read is a memory-bound pass (2026-12-03h
    profile: 2.2 ms per pass over Stage 2's 12 chunks, four such passes per step for the
    teacher's and the student's log-softmax). Here one variadic ``lax.reduce`` carries the
    pair ``(m, s)`` = (running maximum, sum of ``exp(z - m)``) and merges two pairs as

        m = max(m1, m2),   s = s1 exp(m1 - m) + s2 exp(m2 - m)

    (Milakov & Gimelshein 2018, "Online normalizer calculation for softmax", Alg. 3), which is
    associative, so XLA may reduce in any order. A pair with ``s = 0`` (the identity
    ``(finfo.min, 0)``, and every ``-inf`` element, which enters as ``(-inf, 0)``) adds nothing
    whatever its ``m``: its term is taken as 0 rather than ``0 x exp(-inf + inf) = NaN``, so
    two ``-inf`` elements may also meet first. Exact in real arithmetic; in fp32 it differs from
    the two-pass form by rounding only (for ``|z|`` near fp32's largest values, where the sum
    rounds away, the derivative below is not a normalised softmax).

    Args:
      z: ``[..., S]`` fp32 (other floats are computed in fp32), finite: a row that is entirely
        ``-inf`` gives ``finfo.min + log 0 = -inf`` as the two-pass form does, but ``+inf`` or
        NaN entries give NaN.

    Returns:
      fp32 ``[...]``; differentiable (its JVP is ``sum_v softmax(z)_v dz_v``: ``lax.reduce``
      with a custom merge has no derivative rule of its own).
    """
    z = z.astype(jnp.float32)
    lowest = jnp.finfo(jnp.float32).min

    def merge(a, b):
        m = jnp.maximum(a[0], b[0])

        def term(pair):
            return jnp.where(pair[1] == 0, 0.0, pair[1] * jnp.exp(pair[0] - m))

        return m, term(a) + term(b)

    ones = jnp.where(z == -jnp.inf, 0.0, 1.0).astype(jnp.float32)
    m, total = jax.lax.reduce((z, ones), (jnp.float32(lowest), jnp.float32(0.0)), merge,
                              (z.ndim - 1,))
    return m + jnp.log(total)


@logsumexp_one_pass.defjvp
def _logsumexp_one_pass_jvp(primals, tangents):
    (z,), (dz,) = primals, tangents
    lse = logsumexp_one_pass(z)
    p = jnp.exp(z.astype(jnp.float32) - lse[..., None])
    return lse, jnp.sum(p * dz.astype(jnp.float32), axis=-1)


def check_temperature(temperature) -> None:
    """Raises ``ValueError`` unless the distillation temperature ``tau`` is a finite number
    > 0 (an infinite one made both distributions uniform: a zero KL)."""
    if (isinstance(temperature, bool) or not isinstance(temperature, (int, float, np.number))
            or not (math.isfinite(temperature) and temperature > 0)):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature}")


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
      ValueError: on mismatched ``[B, T]``, a ``temperature`` that is not a finite number > 0,
        or ``chunk_size < 1``.
    """
    if teacher_logits.shape[:-1] != student_logits.shape[:-1]:
        raise ValueError(f"{teacher_logits.shape=} and {student_logits.shape=} differ in [B, T]")
    check_temperature(temperature)
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
    ``chunk_size`` tokens (the last padded with weight-0 tokens) and reduced by ``lax.scan``:
    each chunk's logits are computed by one matmul ``jnp.dot(h, W,
    preferred_element_type=float32)`` (bf16 operands stay bf16, accumulation is fp32) and
    reduced to a scalar. Under differentiation the same pass forms the chunk's gradients
    (module docstring): ``dz_n = w_n (softmax(z_n) - onehot(y_n))`` in fp32, rounded to the
    matmul dtype, then ``dh = dz W^T`` and ``dW += h^T dz`` (fp32 accumulation); ``dw_n =
    CE_n``. Memory: about ``chunk_size x S x 4`` bytes of fp32 logits per live chunk (plus
    same-sized XLA temporaries) instead of ``N x S x 4``, and the stored ``[N, D]`` fp32
    hidden gradient.

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
      Gradients flow to ``hidden`` and ``head`` (in their dtypes; with bf16 operands they are
      those of bf16-rounded ``dz``) and to ``weights``.

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
    static = (chunk, num_chunks, jnp.result_type(hidden.dtype, head.dtype), hidden.dtype,
              head.dtype)
    total = _ce_total(static, hidden.reshape(n, d), head, targets.reshape(n).astype(jnp.int32),
                      w)
    return total / jnp.maximum(count, 1.0), total, count


def _ce_chunks(static, hidden, head, targets, w, with_grad):
    """Scan of :func:`chunked_cross_entropy` over ``[N, D]`` tokens: the CE sum and, if
    ``with_grad``, the per-token CE ``[N]``, ``d sum / d hidden`` ``[N, D]`` fp32 and
    ``d sum / d head`` ``[D, S]`` fp32."""
    chunk, num_chunks, cdt = static[:3]
    n, d = hidden.shape
    head_c = head.astype(cdt)  # [D, S]
    xs = (_chunks(hidden, chunk, num_chunks),  # [N/C, C, D]
          _chunks(targets, chunk, num_chunks),  # [N/C, C]
          _chunks(w, chunk, num_chunks))  # [N/C, C]

    def body(carry, x):
        h, y, wc = x
        h = h.astype(cdt)
        z = jnp.dot(h, head_c, preferred_element_type=jnp.float32)  # [C, S] fp32
        lse = logsumexp_one_pass(z)  # [C]
        hit = jnp.arange(z.shape[-1])[None, :] == y[:, None]  # [C, S]
        target = jnp.sum(jnp.where(hit, z, 0.0), axis=-1)  # [C]
        ce = lse - target
        total = carry[0] + weighted_sum(ce, wc)
        if not with_grad:
            return (total,), None
        dz = wc[:, None] * (jnp.exp(z - lse[:, None]) - hit)  # [C, S] fp32
        dz = dz.astype(cdt)
        dh = jnp.dot(dz, head_c.T, preferred_element_type=jnp.float32)  # [C, D]
        dw = carry[1] + jnp.dot(h.T, dz, preferred_element_type=jnp.float32)  # [D, S]
        return (total, dw), (ce, dh)

    if not with_grad:
        (total,), _ = jax.lax.scan(body, (jnp.zeros((), jnp.float32),), xs)
        return total
    init = (jnp.zeros((), jnp.float32), jnp.zeros(head.shape, jnp.float32))
    (total, dw), (ce, dh) = jax.lax.scan(body, init, xs)
    return total, ce.reshape(-1)[:n], dh.reshape(-1, d)[:n], dw


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _ce_total(static, hidden, head, targets, w):
    return _ce_chunks(static, hidden, head, targets, w, with_grad=False)


def _ce_total_fwd(static, hidden, head, targets, w):
    total, ce, dh, dw = _ce_chunks(static, hidden, head, targets, w, with_grad=True)
    return total, (ce, dh, dw)


def _ce_total_bwd(static, res, ct):
    ce, dh, dw = res
    hidden_dtype, head_dtype = static[3:]
    return ((ct * dh).astype(hidden_dtype), (ct * dw).astype(head_dtype),
            np.zeros(ce.shape, jax.dtypes.float0), ct * ce)


_ce_total.defvjp(_ce_total_fwd, _ce_total_bwd)


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
    ``chunk_size`` tokens (the last padded with weight-0 tokens) and reduced by ``lax.scan``:
    each chunk's logits are computed by ``jnp.dot(h, W, preferred_element_type=float32)``
    (bf16 operands stay bf16, accumulation is fp32) and reduced to a scalar. Under
    differentiation the same pass forms the student's gradients (module docstring):
    ``dz_n = w_n (p_S(.|n) - p_T(.|n)) / tau`` in fp32, rounded to the student's matmul dtype,
    then ``dh = dz W_S^T`` and ``dW_S += h^T dz`` (fp32 accumulation). Memory: about
    ``2 x chunk_size x S x 4`` bytes of fp32 logits per live chunk (teacher and student, plus
    same-sized XLA temporaries) instead of ``2 x N x S x 4``, and the stored ``[N, D_S]`` fp32
    hidden gradient.

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
      fp32 scalar (nats per token); differentiable in ``student_hidden`` and ``student_head``
      (gradients in their dtypes; with bf16 operands they are those of bf16-rounded ``dz``) and
      in ``weights``; the teacher's inputs get zero gradients.

    Raises:
      ValueError: naming the argument, if a hidden array is not float ``[B, T, D]``, a head not
        float ``[D, S]`` with its hidden's ``D``, the two hidden arrays differ in ``[B, T]``,
        ``weights`` is not ``[B, T]``, ``temperature`` is not a finite number > 0, or
        ``chunk_size`` is not an int ``>= 1``.
    """
    _check_hidden_head("teacher_hidden", teacher_hidden, "teacher_head", teacher_head)
    _check_hidden_head("student_hidden", student_hidden, "student_head", student_head)
    if teacher_hidden.shape[:2] != student_hidden.shape[:2]:
        raise ValueError(f"student_hidden must have teacher_hidden's [B, T] = "
                         f"{teacher_hidden.shape[:2]}, got shape {student_hidden.shape}")
    b, t = student_hidden.shape[:2]
    _check_weights(weights, (b, t))
    check_temperature(temperature)
    chunk_size = _check_chunk_size(chunk_size)
    n = b * t
    w = (jnp.ones((n,), jnp.float32) if weights is None
         else weights.reshape(-1).astype(jnp.float32))  # [N]
    chunk, num_chunks = _chunk_layout(n, chunk_size)
    static = (chunk, num_chunks, float(temperature),
              jnp.result_type(teacher_hidden.dtype, teacher_head.dtype),
              jnp.result_type(student_hidden.dtype, student_head.dtype),
              student_hidden.dtype, student_head.dtype, (n, teacher_hidden.shape[-1]),
              teacher_hidden.dtype, tuple(teacher_head.shape), teacher_head.dtype)
    total = _kl_total(static, jax.lax.stop_gradient(teacher_hidden).reshape(n, -1),
                      jax.lax.stop_gradient(teacher_head),
                      student_hidden.reshape(n, -1), student_head, w)
    return total / jnp.maximum(jnp.sum(w), 1.0)


def _kl_chunks(static, t_hidden, t_head, s_hidden, s_head, w, with_grad):
    """Scan of :func:`chunked_forward_kl` over ``[N, D]`` tokens: the weighted KL sum and, if
    ``with_grad``, the per-token KL ``[N]``, ``d sum / d s_hidden`` ``[N, D_S]`` fp32 and
    ``d sum / d s_head`` ``[D_S, S_S]`` fp32 (zero beyond the shared vocabulary)."""
    chunk, num_chunks, tau, t_dt, s_dt = static[:5]
    n, d_s = s_hidden.shape
    vocab = min(t_head.shape[1], s_head.shape[1])
    t_w = t_head[:, :vocab].astype(t_dt)  # [D_T, V]
    s_w = s_head[:, :vocab].astype(s_dt)  # [D_S, V]
    xs = (_chunks(t_hidden, chunk, num_chunks),  # [N/C, C, D_T]
          _chunks(s_hidden, chunk, num_chunks),  # [N/C, C, D_S]
          _chunks(w, chunk, num_chunks))  # [N/C, C]

    def body(carry, x):
        th, sh, wc = x
        sh = sh.astype(s_dt)
        t_logits = jnp.dot(th.astype(t_dt), t_w, preferred_element_type=jnp.float32)  # [C, V]
        s_logits = jnp.dot(sh, s_w, preferred_element_type=jnp.float32)  # [C, V] fp32
        t_logits, s_logits = t_logits / tau, s_logits / tau
        log_pt = t_logits - logsumexp_one_pass(t_logits)[:, None]
        log_ps = s_logits - logsumexp_one_pass(s_logits)[:, None]
        p_t = jnp.exp(log_pt)
        kl = jnp.sum(p_t * (log_pt - log_ps), axis=-1)  # [C]
        total = carry[0] + weighted_sum(kl, wc)
        if not with_grad:
            return (total,), None
        dz = ((wc / tau)[:, None] * (jnp.exp(log_ps) - p_t)).astype(s_dt)  # [C, V]
        dh = jnp.dot(dz, s_w.T, preferred_element_type=jnp.float32)  # [C, D_S]
        dw = carry[1] + jnp.dot(sh.T, dz, preferred_element_type=jnp.float32)  # [D_S, V]
        return (total, dw), (kl, dh)

    if not with_grad:
        (total,), _ = jax.lax.scan(body, (jnp.zeros((), jnp.float32),), xs)
        return total
    init = (jnp.zeros((), jnp.float32), jnp.zeros((d_s, vocab), jnp.float32))
    (total, dw), (kl, dh) = jax.lax.scan(body, init, xs)
    dw = jnp.pad(dw, ((0, 0), (0, s_head.shape[1] - vocab)))  # [D_S, S_S]
    return total, kl.reshape(-1)[:n], dh.reshape(-1, d_s)[:n], dw


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _kl_total(static, t_hidden, t_head, s_hidden, s_head, w):
    return _kl_chunks(static, t_hidden, t_head, s_hidden, s_head, w, with_grad=False)


def _kl_total_fwd(static, t_hidden, t_head, s_hidden, s_head, w):
    total, kl, dh, dw = _kl_chunks(static, t_hidden, t_head, s_hidden, s_head, w,
                                   with_grad=True)
    return total, (kl, dh, dw)


def _kl_total_bwd(static, res, ct):
    kl, dh, dw = res
    s_hidden_dtype, s_head_dtype, t_hidden_shape, t_hidden_dtype, t_head_shape, t_head_dtype = (
        static[5:])
    return (jnp.zeros(t_hidden_shape, t_hidden_dtype), jnp.zeros(t_head_shape, t_head_dtype),
            (ct * dh).astype(s_hidden_dtype), (ct * dw).astype(s_head_dtype), ct * kl)


_kl_total.defvjp(_kl_total_fwd, _kl_total_bwd)
