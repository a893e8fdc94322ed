"""Batched generation with per-layer caches: prefill once, then decode token by token.

Every layer keeps an explicit decoding state (:meth:`lattn_jax.model.LanguageModel.init_state`):
a KV cache for softmax-attention layers, the fp32 recurrent state ``S [B, H, K, V]`` plus the
short-convolution inputs ``[B, W - 1, C]`` for linear layers. A generation is

1. **prefill**: one forward pass over the whole (left-padded) prompt batch, which fills every
   layer's state and gives the logits of the first new token;
2. **decode**: one ``T == 1`` forward per new token, consuming and returning the states
   (recurrentgemma's "sampling mode", MaxText ``test_autoregression``).

Padding. Prompts of different lengths are left-padded to a common length (right-padded input is
re-aligned per row first, :func:`left_align`). The padding is a separate *document*
(``segment_ids`` 0 for pads, 1 for the prompt), so every mixer treats the prompt's first token as
a document start: recurrent and convolution states restart there (pads never reach them), RoPE
positions and HypeNet's logit-scaling ``t`` start at 0 on the first real token, and attention
masks the pad slots of the KV cache for the whole generation. A padded row therefore produces
exactly the tokens of the same prompt generated alone (``tests/lattn_jax/eval/generate_test.py``).

Sampling (:func:`sample_logits`): greedy (``temperature == 0``), or temperature, then top-k, then
top-p (nucleus; Holtzman et al. 2020, :func:`nucleus_mask`) filtering of the fp32 logits before a
categorical draw.
Generation of a row stops after it emits a stop token (kept in its output), after
``max_new_tokens``, or when an optional ``stop_fn`` says so (checked on the host after each
compiled decode call, e.g. for stop *strings* such as lm-evaluation-harness's ``until``).
"""

import dataclasses
import math
from typing import Callable, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lattn_jax import model as model_lib
from lattn_jax.typing import Array

PAD_SEGMENT = 0
PROMPT_SEGMENT = 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingConfig:
    """How the next token is drawn from the logits.

    Attributes:
      temperature: ``0`` is greedy (argmax); otherwise logits are divided by it.
      top_k: keep the ``top_k`` largest logits (``0``: all).
      top_p: keep the smallest set of tokens whose probability sums to at least ``top_p``
        (``1.0``: all).

    Raises:
      ValueError: for a negative or non-finite temperature, a negative top_k, or top_p outside
        ``(0, 1]`` (NaN included).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


def sample_logits(logits: Array, rng: Array, sampling: SamplingConfig) -> Array:
    """Draws one token per row.

    Args:
      logits: fp32 ``[B, S]``.
      rng: a PRNG key (unused when greedy).
      sampling: the :class:`SamplingConfig` (static).

    Returns:
      int32 ``[B]``: ``argmax`` when ``temperature == 0``; else a draw from
      ``softmax(filter(logits / temperature))`` where top-k keeps the ``k`` largest logits and
      top-p keeps the tokens whose preceding cumulative probability (descending order) is below
      ``p`` (so at least the most likely token survives).
    """
    logits = logits.astype(jnp.float32)
    if sampling.temperature == 0.0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    logits = logits / sampling.temperature
    neg = jnp.finfo(jnp.float32).min
    if sampling.top_k and sampling.top_k < logits.shape[-1]:
        kth = jax.lax.top_k(logits, sampling.top_k)[0][:, -1:]  # [B, 1]
        logits = jnp.where(logits < kth, neg, logits)
    if sampling.top_p < 1.0:
        logits = jnp.where(nucleus_mask(logits, sampling.top_p), logits, neg)
    return jax.random.categorical(rng, logits, axis=-1).astype(jnp.int32)


def nucleus_mask(logits: Array, top_p: float) -> Array:
    """The tokens of the top-``p`` nucleus (Holtzman et al. 2020), without sorting.

    The nucleus is the smallest set of most likely tokens whose probability reaches ``top_p``:
    every token with ``p_i >= tau``, where ``tau`` is the largest probability such that
    ``sum(p_j for p_j >= tau) >= top_p`` (a token whose more likely tokens already hold
    ``top_p`` is out). ``tau`` is found by bisection on the int32 bit patterns of the fp32
    probabilities (monotonic for non-negative floats): 32 masked fp32 sums over ``[B, S]``
    instead of a sort of every row, which costs about 20x less on CPU at ``S = 49152``
    (SmolLM2's vocabulary) and reads ``[B, S]`` 32 times on a GPU. Tokens tied with ``tau``
    are all kept. Up to fp32 rounding of the masses this is the sorted rule "keep a token if
    the mass of the tokens before it, in descending order, is below ``top_p``".

    Args:
      logits: fp32 ``[B, S]`` (``-inf`` / very negative entries get probability 0).
      top_p: the nucleus mass in ``(0, 1)``.

    Returns:
      bool ``[B, S]``, at least the most likely token of each row.
    """
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)  # [B, S]
    bits = jax.lax.bitcast_convert_type(probs, jnp.int32)

    def body(_, bounds):
        # Invariant: the mass of {bits >= lo} reaches top_p, the mass of {bits >= hi} does not.
        lo, hi = bounds
        mid = lo + (hi - lo) // 2
        mass = jnp.sum(jnp.where(bits >= mid[:, None], probs, 0.0), axis=-1)  # fp32 [B]
        ok = mass >= top_p
        return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid)

    lo = jnp.zeros(bits.shape[:1], jnp.int32)
    hi = jnp.max(bits, axis=-1) + 1
    lo, _ = jax.lax.fori_loop(0, 32, body, (lo, hi))  # hi - lo <= 2^31 halves 32 times
    return bits >= lo[:, None]  # lo <= the row's largest bits: its top token stays


def left_align(tokens: np.ndarray, mask: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Moves each row's real tokens to the right end (left padding), whatever the input side.

    Args:
      tokens: int ``[B, T]``.
      mask: bool ``[B, T]``, ``True`` on real tokens; each row's real tokens must be contiguous
        (left padding, right padding, or none).

    Returns:
      ``(tokens, mask)`` ``[B, T]`` with every row's real tokens at positions ``T - n .. T - 1``
      and pads (the row's original pad values moved left) before them.

    Raises:
      ValueError: on mismatched shapes, a row without real tokens, or non-contiguous real tokens.
    """
    tokens, mask = np.asarray(tokens), np.asarray(mask, bool)
    if tokens.shape != mask.shape or tokens.ndim != 2:
        raise ValueError(f"tokens and mask must both be [B, T], got {tokens.shape=} {mask.shape=}")
    out_t, out_m = np.zeros_like(tokens), np.zeros_like(mask)
    for i, (row, m) in enumerate(zip(tokens, mask)):
        idx = np.flatnonzero(m)
        if idx.size == 0:
            raise ValueError(f"row {i} has no real tokens")
        if idx[-1] - idx[0] + 1 != idx.size:
            raise ValueError(f"row {i}: real tokens must be contiguous, got mask {m.astype(int)}")
        n = idx.size
        out_t[i, -n:] = row[idx]
        out_m[i, -n:] = True
    return out_t, out_m


@dataclasses.dataclass
class GenerationOutput:
    """The result of :meth:`Generator.generate`.

    Attributes:
      tokens: per row, the generated ids (up to and including the first stop token).
      finished: per row, whether it stopped on a stop token or by ``stop_fn`` (else it hit
        ``max_new_tokens``).
      prompt_lengths: per row, the number of real prompt tokens.
    """

    tokens: List[List[int]]
    finished: List[bool]
    prompt_lengths: List[int]


def continuation_text(tokenizer, prompt_ids: Sequence[int], ids: Sequence[int]) -> str:
    """The text that generated ``ids`` add after ``prompt_ids``.

    Decoded together with the prompt, then the prompt's own text cut off, because
    SentencePiece-style tokenizers drop the leading space of a text decoded on its own ("The
    history of" + "1" instead of " 1"). Falls back to decoding ``ids`` alone where the prompt's
    text is not a prefix of the whole (a tokenizer that merges across the boundary).

    Args:
      tokenizer: anything with ``decode(list[int]) -> str``.
      prompt_ids: the prompt's token ids.
      ids: the generated token ids.

    Returns:
      The continuation as a string.
    """
    head = tokenizer.decode(list(prompt_ids))
    full = tokenizer.decode(list(prompt_ids) + list(ids))
    return full[len(head):] if full.startswith(head) else tokenizer.decode(list(ids))


class Generator:
    """Compiled prefill and decode-step functions for one model.

    Args:
      model: a :class:`~lattn_jax.model.LanguageModel` (its parameters are captured as they are
        now).
      pad_id: the id written into padding slots (never read by the model).
      bucket: prompts are left-padded to a multiple of this length, so that batches of similar
        length share one compiled prefill.
      route: evaluate with the cross-layer routing contributions (the training forward).
      decode_chunk: tokens generated per compiled call in :meth:`generate` (a ``lax.scan`` of
        single steps on the device; stop tokens are checked between calls, so up to
        ``decode_chunk - 1`` steps past a row's stop token are computed and dropped). One call
        per token costs a host round trip per token: at batch 1 that was over half of the
        decode time of a 24-layer model on an H200
        (``benchmarks/results/inference-decode16-h200-2026-11-29.md``). The tokens do not
        depend on it (the same random draws in the same order).

    Raises:
      ValueError: for ``bucket < 1`` or ``decode_chunk < 1``.
    """

    def __init__(self, model: model_lib.LanguageModel, *, pad_id: int = 0, bucket: int = 16,
                 route: bool = True, decode_chunk: int = 8):
        if bucket < 1:
            raise ValueError(f"bucket must be >= 1, got {bucket=}")
        if decode_chunk < 1:
            raise ValueError(f"decode_chunk must be >= 1, got {decode_chunk=}")
        self.decode_chunk = int(decode_chunk)
        self.graphdef, self.params = nnx.split(model)
        self.pad_id = int(pad_id)
        self.bucket = bucket
        self.route = route
        self._prefill = jax.jit(self._prefill_impl, static_argnums=(3,))
        # The states are donated: a step updates the KV caches in place instead of copying
        # them (a copy per token would cost as much as reading the whole cache again).
        self._step = jax.jit(self._step_impl, static_argnums=(4,), donate_argnums=(2,))
        self._steps = jax.jit(self._steps_impl, static_argnums=(4, 5), donate_argnums=(2,))
        self._sample = jax.jit(sample_logits, static_argnums=(2,))

    def _model(self, params):
        return nnx.merge(self.graphdef, params)

    def _prefill_impl(self, params, tokens, segment_ids, max_len):
        model = self._model(params)
        # A fresh prefill runs attention on the training kernel (flash attention on a GPU), then
        # the caches grow to max_len for decoding.
        logits, state = model(tokens, segment_ids=segment_ids, return_state=True,
                              route=self.route, last_logits_only=True)
        return logits[:, -1], model.grow_state(state, max_len)  # [B, S], per-layer states

    def _step_impl(self, params, token, state, rng, sampling):
        model = self._model(params)
        logits, state = model(token[:, None], state=state, return_state=True, route=self.route)
        return sample_logits(logits[:, 0], rng, sampling), logits[:, 0], state

    def _steps_impl(self, params, token, state, rng, sampling, n):
        def body(carry, _):
            token, state, rng = carry
            rng, sub = jax.random.split(rng)  # the draws of n calls of step(), in order
            token, _, state = self._step_impl(params, token, state, sub, sampling)
            return (token, state, rng), token

        (token, state, rng), tokens = jax.lax.scan(body, (token, state, rng), None, length=n)
        return tokens.T, state, rng  # [B, n]

    def prefill(self, tokens: np.ndarray, mask: np.ndarray, max_len: int):
        """Runs the prompt through the model.

        Args:
          tokens: int ``[B, T]`` prompts, left- or right-padded.
          mask: bool ``[B, T]``, ``True`` on real tokens.
          max_len: KV-cache capacity, at least the padded prompt length plus the tokens to come.

        Returns:
          ``(last_logits fp32 [B, S], states)``; ``states`` is the per-layer list for
          :meth:`step`.
        """
        tokens, mask = left_align(tokens, mask)
        seg = np.where(mask, PROMPT_SEGMENT, PAD_SEGMENT).astype(np.int32)
        tokens = np.where(mask, tokens, self.pad_id).astype(np.int32)
        return self._prefill(self.params, jnp.asarray(tokens), jnp.asarray(seg), max_len)

    def step(self, token: Array, states, rng: Array, sampling: SamplingConfig):
        """One decoding step.

        Args:
          token: int ``[B]`` the tokens to feed.
          states: the per-layer states from :meth:`prefill` or a previous step. They are
            donated (the KV caches are updated in place): use only the returned states after
            the call.
          rng: PRNG key of the draw.
          sampling: the :class:`SamplingConfig`.

        Returns:
          ``(next int32 [B], logits fp32 [B, S] of the fed position, new states)``.
        """
        return self._step(self.params, token, states, rng, sampling)

    def generate(self, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
                 sampling: SamplingConfig = SamplingConfig(),
                 stop_tokens: Sequence[int] = (), seed: int = 0,
                 stop_fn: Optional[Callable[[int, List[int]], bool]] = None
                 ) -> GenerationOutput:
        """Generates continuations of a batch of prompts.

        Args:
          prompts: ``B`` token-id lists, each non-empty (lengths may differ; they are left-padded
            to a multiple of ``bucket``).
          max_new_tokens: the most tokens generated per row (>= 1).
          sampling: greedy by default.
          stop_tokens: ids that end a row (the stop token is kept in its output).
          seed: PRNG seed of the sampling.
          stop_fn: optional ``stop_fn(row, tokens) -> bool``, called on the host with a row's
            generated ids so far after each compiled decode call (every ``decode_chunk`` tokens;
            after the first token too); ``True`` ends the row there, keeping those tokens (the
            caller cuts them, e.g. at a stop string). A row's tokens do not depend on when
            other rows end, so ending early only saves compute.

        Returns:
          A :class:`GenerationOutput`.

        Raises:
          ValueError: for an empty batch, an empty prompt or ``max_new_tokens < 1``.
        """
        if not prompts:
            raise ValueError("no prompts to generate from")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens=}")
        lengths = [len(p) for p in prompts]
        if min(lengths) == 0:
            raise ValueError(f"prompt {lengths.index(0)} is empty; give it at least one token")
        t = -(-max(lengths) // self.bucket) * self.bucket
        tokens = np.full((len(prompts), t), self.pad_id, np.int32)
        mask = np.zeros((len(prompts), t), bool)
        for i, p in enumerate(prompts):
            tokens[i, t - len(p):] = p
            mask[i, t - len(p):] = True
        return self.generate_padded(tokens, mask, max_new_tokens=max_new_tokens,
                                    sampling=sampling, stop_tokens=stop_tokens, seed=seed,
                                    stop_fn=stop_fn)

    def generate_padded(self, tokens: np.ndarray, mask: np.ndarray, *, max_new_tokens: int,
                        sampling: SamplingConfig = SamplingConfig(),
                        stop_tokens: Sequence[int] = (), seed: int = 0,
                        stop_fn: Optional[Callable[[int, List[int]], bool]] = None
                        ) -> GenerationOutput:
        """:meth:`generate` for an already padded batch.

        Args:
          tokens: int ``[B, T]``; each row's real tokens are contiguous, padded on either side.
          mask: bool ``[B, T]``, ``True`` on real tokens.
          max_new_tokens, sampling, stop_tokens, seed, stop_fn: as for :meth:`generate`.

        Returns:
          A :class:`GenerationOutput`.

        Raises:
          ValueError: from :func:`left_align` on a bad mask, or ``max_new_tokens < 1``.
        """
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens=}")
        mask = np.asarray(mask, bool)
        b, t = mask.shape
        rng = jax.random.key(seed)
        n = self.decode_chunk
        calls = -(-(max_new_tokens - 1) // n)  # decode calls after the prefill's token
        logits, states = self.prefill(tokens, mask, t + 1 + calls * n)
        rng, sub = jax.random.split(rng)
        token = self._sample(logits, sub, sampling)
        stop = np.asarray(sorted(set(int(s) for s in stop_tokens)), np.int32)
        out = np.zeros((b, max_new_tokens), np.int32)
        done = np.zeros((b,), bool)
        n_out = np.zeros((b,), np.int32)
        pending = np.asarray(token)[:, None]  # tokens not yet recorded, [B, k]
        i = 0
        while True:
            for tok in pending.T:
                active = ~done
                out[active, i] = tok[active]
                n_out[active] += 1
                done |= np.isin(tok, stop) & active
                i += 1
                if done.all() or i == max_new_tokens:
                    break
            if stop_fn is not None and not (done.all() or i == max_new_tokens):
                for r in np.flatnonzero(~done):
                    done[r] = bool(stop_fn(int(r), out[r, :n_out[r]].tolist()))
            if done.all() or i == max_new_tokens:
                break
            new, states, rng = self._steps(self.params, jnp.asarray(pending[:, -1]), states,
                                           rng, sampling, n)
            pending = np.asarray(new)
        return GenerationOutput(tokens=[out[r, :n_out[r]].tolist() for r in range(b)],
                                finished=done.tolist(), prompt_lengths=mask.sum(1).tolist())
