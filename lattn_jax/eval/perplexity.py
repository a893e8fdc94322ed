"""Perplexity of held-out text with a sliding window (lm-eval ``loglikelihood_rolling`` style).

A document's tokens ``x_1 .. x_N`` are preceded by one prefix token (EOS: our models see EOS
before every document, spec §6) and scored in windows of at most ``max_len`` predicted tokens.
Window ``j`` predicts the tokens ``[j * stride, j * stride + stride)`` given up to
``max_len - stride`` earlier tokens of context (the first window predicts ``max_len`` tokens).
``stride == max_len`` gives disjoint windows (lm-eval's rolling windows with no overlap);
smaller strides give every token more context, at more compute.

Metrics (lm-eval ``perplexity`` tasks): with ``NLL`` the summed negative log-likelihood in
nats over all documents,

* ``token_perplexity = exp(NLL / tokens)``;
* ``word_perplexity = exp(NLL / words)`` with words counted by ``re.split(r"\\s+", doc)``;
* ``byte_perplexity = exp(NLL / bytes)`` with UTF-8 bytes;
* ``bits_per_byte = NLL / (bytes * ln 2)``.
"""

import math
import re
from typing import Dict, List, Sequence, Tuple

import numpy as np

from lattn_jax.data import tokenizers as tok_lib
from lattn_jax.eval import scoring


def rolling_windows(tokens: Sequence[int], prefix_id: int, max_len: int,
                    stride: int) -> List[Tuple[List[int], List[int], int]]:
    """Splits a document into scoring windows.

    Args:
      tokens: the document's ids ``x_1 .. x_N`` (N >= 1).
      prefix_id: the token fed before ``x_1``.
      max_len: the most tokens a window reads.
      stride: new tokens predicted per window after the first, ``1 <= stride <= max_len``.

    Returns:
      ``(inputs, targets, n_scored)`` triples: ``inputs`` and ``targets`` have equal length
      ``<= max_len`` and the last ``n_scored`` targets are new; every ``x_i`` is scored exactly
      once.

    Raises:
      ValueError: for an empty document or a bad ``stride``.
    """
    if not tokens:
        raise ValueError("cannot score an empty document")
    if not 1 <= stride <= max_len:
        raise ValueError(f"stride must be in [1, max_len], got {stride=} {max_len=}")
    seq = [prefix_id] + list(tokens)  # seq[i] predicts seq[i + 1]
    n = len(tokens)
    windows = []
    end = min(max_len, n)  # targets x_1 .. x_end
    windows.append((seq[:end], seq[1:end + 1], end))
    while end < n:
        new_end = min(end + stride, n)
        start = max(0, new_end - max_len)
        windows.append((seq[start:new_end], seq[start + 1:new_end + 1], new_end - end))
        end = new_end
    return windows


def evaluate(scorer: scoring.Scorer, tokenizer: tok_lib.Tokenizer, documents: Sequence[str],
             *, max_len: int, stride: int) -> Dict[str, float]:
    """Perplexities of ``documents`` (see the module docstring for the definitions).

    Args:
      scorer: computes token log-probabilities.
      tokenizer: encodes the documents (no BOS/EOS); its EOS is the prefix token.
      documents: non-empty texts.
      max_len, stride: the window (see :func:`rolling_windows`).

    Returns:
      ``{"token_perplexity", "word_perplexity", "byte_perplexity", "bits_per_byte", "tokens",
      "words", "bytes", "documents"}``.

    Raises:
      ValueError: if there is no document, or one encodes to no tokens.
    """
    if not documents:
        raise ValueError("no documents to score")
    ids, n_words, n_bytes = [], 0, 0
    for doc in documents:
        ids.append(tokenizer.encode(doc))
        n_words += len(re.split(r"\s+", doc))
        n_bytes += len(doc.encode("utf-8"))
    nll, n_tok = token_nll(scorer, ids, tokenizer.eos_id, max_len=max_len, stride=stride)
    return {"token_perplexity": math.exp(nll / n_tok), "word_perplexity": math.exp(nll / n_words),
            "byte_perplexity": math.exp(nll / n_bytes),
            "bits_per_byte": nll / (n_bytes * math.log(2)), "tokens": n_tok, "words": n_words,
            "bytes": n_bytes, "documents": len(documents)}


def token_nll(scorer: scoring.Scorer, documents: Sequence[Sequence[int]], prefix_id: int, *,
              max_len: int, stride: int) -> Tuple[float, int]:
    """Summed negative log-likelihood (nats, fp64 sum) of tokenised documents.

    Each document is scored on its own in :func:`rolling_windows` (``prefix_id`` before its
    first token), the windows batched ``scorer.batch_size`` at a time and padded to a multiple
    of ``scorer.bucket``.

    Args:
      scorer: computes token log-probabilities.
      documents: the documents' ids, each non-empty.
      prefix_id: the token fed before every document (EOS for our models).
      max_len, stride: the window (see :func:`rolling_windows`).

    Returns:
      ``(nll, tokens)``: the summed NLL and the number of scored tokens.

    Raises:
      ValueError: a document with no tokens, or a bad ``stride``.
    """
    windows = []
    n_tok = 0
    for ids in documents:
        windows += rolling_windows(ids, prefix_id, max_len, stride)
        n_tok += len(ids)
    nll = 0.0
    bs = scorer.batch_size
    for i in range(0, len(windows), bs):
        chunk = windows[i:i + bs]
        t = max(len(w[0]) for w in chunk)
        t = -(-t // scorer.bucket) * scorer.bucket
        inputs = np.zeros((bs, t), np.int32)
        targets = np.zeros((bs, t), np.int32)
        for r, (inp, tgt, _) in enumerate(chunk):
            inputs[r, :len(inp)], targets[r, :len(tgt)] = inp, tgt
        lp, _ = scorer.token_logprobs(inputs, targets)
        for r, (inp, _, k) in enumerate(chunk):
            nll -= float(lp[r, len(inp) - k:len(inp)].sum(dtype=np.float64))
    return nll, n_tok


def evaluate_tokens(scorer: scoring.Scorer, documents: Sequence[Sequence[int]], prefix_id: int,
                    *, max_len: int, stride: int) -> Dict[str, float]:
    """Token perplexity ``exp(NLL / tokens)`` of tokenised documents (e.g. a token-shard
    corpus's validation split), windows as in :func:`evaluate`.

    Returns:
      ``{"token_perplexity", "nll_per_token", "tokens", "documents"}`` (NLL in nats).

    Raises:
      ValueError: no document, an empty document or a bad ``stride``.
    """
    if not len(documents):
        raise ValueError("no documents to score")
    nll, n_tok = token_nll(scorer, documents, prefix_id, max_len=max_len, stride=stride)
    return {"token_perplexity": math.exp(nll / n_tok), "nll_per_token": nll / n_tok,
            "tokens": n_tok, "documents": len(documents)}
