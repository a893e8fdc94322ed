"""Log-likelihood scoring with lm-evaluation-harness semantics.

A request is a ``(context, continuation)`` pair of strings. Following lm-evaluation-harness
(``HFLM._encode_pair`` and ``_loglikelihood_tokens``, v0.4):

* trailing spaces of the context move to the start of the continuation;
* ``whole = encode(context + continuation)``, ``ctx = encode(context)``,
  ``cont = whole[len(ctx):]`` (so a tokenizer that merges across the boundary is handled the
  same way as in the harness);
* an empty context is replaced by one prefix token (the EOS id; our models are trained without
  BOS, with EOS between documents, spec §6);
* the model reads ``(ctx + cont)[-(max_len + 1):][:-1]`` (left truncation) and the result is
  ``(sum of log p(cont_i | ...), is_greedy)`` where ``is_greedy`` says whether every continuation
  token is the argmax of its position.

Each request gets its own full forward pass (no cache), right-padded in the batch: causal
models never look at the pads.
"""

from typing import List, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lattn_jax import model as model_lib
from lattn_jax.data import tokenizers as tok_lib

TokenPair = Tuple[List[int], List[int]]


def encode_pair(tokenizer: tok_lib.Tokenizer, context: str,
                continuation: str) -> TokenPair:
    """Splits ``context + continuation`` into context and continuation ids, lm-eval style.

    Args:
      tokenizer: encodes without BOS/EOS.
      context: the conditioning text (may be empty).
      continuation: the scored text, usually with a leading space.

    Returns:
      ``(context_ids, continuation_ids)``; ``context_ids`` is ``[eos_id]`` when the context is
      empty.

    Raises:
      ValueError: if the continuation encodes to no tokens.
    """
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = tokenizer.encode(context + continuation)
    ctx = tokenizer.encode(context) if context else []
    cont = whole[len(ctx):]
    if not cont:
        raise ValueError(f"continuation {continuation!r} encodes to no tokens after "
                         f"context {context[-50:]!r}")
    return (ctx or [tokenizer.eos_id]), cont


class Scorer:
    """Batched, compiled continuation log-likelihoods for one model.

    Args:
      model: the :class:`~lattn_jax.model.LanguageModel` (parameters captured as they are now).
      max_len: the model's context window ``L``; longer inputs are truncated on the left.
      batch_size: requests per forward pass.
      bucket: padded lengths are rounded up to a multiple of this (fewer recompilations).
      route: run the cross-layer routing contributions (the training forward, spec §8).

    Raises:
      ValueError: for a non-positive ``max_len``, ``batch_size`` or ``bucket``.
    """

    def __init__(self, model: model_lib.LanguageModel, *, max_len: int = 2048,
                 batch_size: int = 16, bucket: int = 32, route: bool = True):
        if min(max_len, batch_size, bucket) < 1:
            raise ValueError(f"max_len, batch_size and bucket must be >= 1, got {max_len=} "
                             f"{batch_size=} {bucket=}")
        self.graphdef, self.params = nnx.split(model)
        self.max_len, self.batch_size, self.bucket, self.route = max_len, batch_size, bucket, route
        self._forward = jax.jit(self._forward_impl)

    def _forward_impl(self, params, inputs, targets):
        model = nnx.merge(self.graphdef, params)
        logits = model(inputs, route=self.route)  # fp32 [B, T, S]
        logp = jax.nn.log_softmax(logits, axis=-1)
        target_logp = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]  # [B, T]
        greedy = jnp.argmax(logits, axis=-1) == targets  # [B, T]
        return target_logp, greedy

    def token_logprobs(self, inputs: np.ndarray, targets: np.ndarray) -> Tuple[np.ndarray,
                                                                               np.ndarray]:
        """``log p(targets[b, t] | inputs[b, :t+1])`` fp32 ``[B, T]`` and argmax-equal ``[B, T]``.

        Args:
          inputs, targets: int ``[B, T]`` (right padding is harmless: the model is causal).
        """
        lp, greedy = self._forward(self.params, jnp.asarray(inputs, jnp.int32),
                                   jnp.asarray(targets, jnp.int32))
        return np.asarray(lp), np.asarray(greedy)

    def loglikelihood(self, requests: Sequence[TokenPair]) -> List[Tuple[float, bool]]:
        """Scores ``(context_ids, continuation_ids)`` pairs.

        Args:
          requests: pairs from :func:`encode_pair`; contexts must be non-empty.

        Returns:
          Per request, ``(sum_i log p(cont_i | context, cont_<i), is_greedy)`` in request order.

        Raises:
          ValueError: for an empty context or continuation, or a continuation longer than
            ``max_len``.
        """
        rows = []
        for i, (ctx, cont) in enumerate(requests):
            if not ctx or not cont:
                raise ValueError(f"request {i}: context and continuation must be non-empty")
            if len(cont) > self.max_len:
                raise ValueError(f"request {i}: continuation of {len(cont)} tokens exceeds "
                                 f"max_len={self.max_len}")
            whole = (list(ctx) + list(cont))[-(self.max_len + 1):]
            rows.append((whole[:-1], whole[1:], len(cont)))
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i][0]))
        results: List[Tuple[float, bool]] = [None] * len(rows)  # type: ignore[list-item]
        for start in range(0, len(order), self.batch_size):
            idx = order[start:start + self.batch_size]
            t = max(len(rows[i][0]) for i in idx)
            t = min(-(-t // self.bucket) * self.bucket, max(self.max_len, t))
            b = self.batch_size if len(order) > self.batch_size else len(idx)
            inputs = np.zeros((b, t), np.int32)
            targets = np.zeros((b, t), np.int32)
            for r, i in enumerate(idx):
                inp, tgt, _ = rows[i]
                inputs[r, :len(inp)] = inp
                targets[r, :len(tgt)] = tgt
            lp, greedy = self.token_logprobs(inputs, targets)
            for r, i in enumerate(idx):
                n, n_cont = len(rows[i][0]), rows[i][2]
                sl = slice(n - n_cont, n)
                results[i] = (float(lp[r, sl].sum(dtype=np.float64)), bool(greedy[r, sl].all()))
        return results
