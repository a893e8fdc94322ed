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

Per position bucket (``position_nll``): a scored target's *position* is its 0-based index in
the window that scores it, so the target at position ``p`` is predicted from the window's
``p + 1`` inputs ``inputs[0 .. p]`` (the prefix token included when the window starts the
document). Only a window's new targets are scored, and every window after a document's first
reads ``max_len`` tokens (:func:`rolling_windows`), so its ``k`` new targets sit at positions
``max_len - k .. max_len - 1``: with ``stride == max_len`` the document's tokens
``x_1 .. x_{max_len}`` are at positions ``0 .. max_len - 1``, and so are those of every full
later window, but a last window of ``k < max_len`` new tokens scores them at the end
(with ``max_len - k`` tokens of context it read before); with ``stride < max_len`` windows after
the first contribute positions ``>= max_len - stride`` only. So the early buckets hold the
tokens near a document's start (and those of short documents). For bucket ``[a, b)``, with
``NLL_ab`` the summed NLL and ``n_ab`` the number of scored targets at positions
``a <= p < b``, ``mean_nll = NLL_ab / n_ab`` and ``perplexity = exp(mean_nll)`` (both ``None``
where ``n_ab = 0``); ``sum_ab n_ab = tokens`` and ``sum_ab NLL_ab = NLL`` (fp64 on the host).
"""

import math
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

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


def default_position_buckets(max_len: int) -> Tuple[int, ...]:
    """Default bucket edges for :func:`position_nll`: ``0`` and ``max_len // d`` for
    ``d = 32, 8, 4, 2, 1`` (duplicates and zeros dropped).

    For ``max_len = 2048``: ``(0, 64, 256, 512, 1024, 2048)``.

    Args:
      max_len: the window ``L`` (int ``>= 1``).

    Returns:
      Strictly increasing int edges from ``0`` to ``max_len``.

    Raises:
      ValueError: ``max_len < 1``.
    """
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len=}")
    return tuple(sorted({0} | {max_len // d for d in (32, 8, 4, 2, 1)}))


def check_position_buckets(position_buckets: Optional[Sequence[int]],
                           max_len: int) -> Tuple[int, ...]:
    """Validates bucket edges (``None``: :func:`default_position_buckets`).

    Args:
      position_buckets: edges ``e_0 < e_1 < ... < e_K`` (ints) with ``e_0 = 0`` and
        ``e_K = max_len``; bucket ``k`` holds positions ``e_k <= p < e_{k+1}``.
      max_len: the window ``L``.

    Returns:
      The edges as a tuple of Python ints.

    Raises:
      ValueError: edges that are not ints, fewer than two, not strictly increasing, or not
        from ``0`` to ``max_len``.
    """
    if position_buckets is None:
        return default_position_buckets(max_len)
    edges = tuple(position_buckets)
    ok = (len(edges) >= 2
          and all(isinstance(e, (int, np.integer)) and not isinstance(e, bool) for e in edges)
          and edges[0] == 0 and edges[-1] == max_len
          and all(a < b for a, b in zip(edges[:-1], edges[1:])))
    if not ok:
        raise ValueError(f"position_buckets must be strictly increasing ints from 0 to "
                         f"max_len={max_len}, got {position_buckets!r}")
    return tuple(int(e) for e in edges)


def position_nll(nll_sum: np.ndarray, counts: np.ndarray,
                 edges: Sequence[int]) -> List[Dict[str, Any]]:
    """Mean NLL per position bucket (see the module docstring).

    Args:
      nll_sum: fp64 ``[L]``, the summed NLL (nats) of the targets at each window position.
      counts: int ``[L]``, the number of scored targets at each position.
      edges: validated edges (:func:`check_position_buckets`), ``edges[-1] == L``.

    Returns:
      One ``{"start", "stop", "tokens", "mean_nll", "perplexity"}`` per bucket ``[start,
      stop)``: ``mean_nll = sum(nll_sum[start:stop]) / sum(counts[start:stop])`` (fp64) and
      ``perplexity = exp(mean_nll)``; both ``None`` for an empty bucket.

    Raises:
      ValueError: ``nll_sum`` and ``counts`` not both of length ``edges[-1]``.
    """
    if len(nll_sum) != edges[-1] or len(counts) != edges[-1]:
        raise ValueError(f"nll_sum and counts must have length {edges[-1]}, got "
                         f"{len(nll_sum)} and {len(counts)}")
    out = []
    for a, b in zip(edges[:-1], edges[1:]):
        n = int(np.sum(counts[a:b], dtype=np.int64))
        mean = float(np.sum(nll_sum[a:b], dtype=np.float64)) / n if n else None
        out.append({"start": int(a), "stop": int(b), "tokens": n, "mean_nll": mean,
                    "perplexity": math.exp(mean) if n else None})
    return out


def evaluate(scorer: scoring.Scorer, tokenizer: tok_lib.Tokenizer, documents: Sequence[str],
             *, max_len: int, stride: int,
             position_buckets: Optional[Sequence[int]] = None) -> Dict[str, Any]:
    """Perplexities of ``documents`` (see the module docstring for the definitions).

    Args:
      scorer: computes token log-probabilities.
      tokenizer: encodes the documents (no BOS/EOS); its EOS is the prefix token.
      documents: non-empty texts.
      max_len, stride: the window (see :func:`rolling_windows`).
      position_buckets: edges of the position buckets (:func:`check_position_buckets`;
        default :func:`default_position_buckets` of ``max_len``).

    Returns:
      ``{"token_perplexity", "word_perplexity", "byte_perplexity", "bits_per_byte", "tokens",
      "words", "bytes", "documents", "position_nll"}``; ``position_nll`` is the list of
      :func:`position_nll` (positions as in the module docstring).

    Raises:
      ValueError: if there is no document, one encodes to no tokens, or bad
        ``position_buckets``.
    """
    if not documents:
        raise ValueError("no documents to score")
    edges = check_position_buckets(position_buckets, max_len)
    ids, n_words, n_bytes = [], 0, 0
    for doc in documents:
        ids.append(tokenizer.encode(doc))
        n_words += len(re.split(r"\s+", doc))
        n_bytes += len(doc.encode("utf-8"))
    nll, n_tok, pos_sum, pos_n = _score(scorer, ids, tokenizer.eos_id, max_len=max_len,
                                        stride=stride)
    return {"token_perplexity": math.exp(nll / n_tok), "word_perplexity": math.exp(nll / n_words),
            "byte_perplexity": math.exp(nll / n_bytes),
            "bits_per_byte": nll / (n_bytes * math.log(2)), "tokens": n_tok, "words": n_words,
            "bytes": n_bytes, "documents": len(documents),
            "position_nll": position_nll(pos_sum, pos_n, edges)}


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
    nll, n_tok, _, _ = _score(scorer, documents, prefix_id, max_len=max_len, stride=stride)
    return nll, n_tok


def _score(scorer: scoring.Scorer, documents: Sequence[Sequence[int]], prefix_id: int, *,
           max_len: int, stride: int) -> Tuple[float, int, np.ndarray, np.ndarray]:
    """:func:`token_nll` plus, per window position ``p`` (module docstring), the summed NLL
    (fp64 ``[max_len]``) and the count (int64 ``[max_len]``) of the targets scored there."""
    windows = []
    n_tok = 0
    for ids in documents:
        windows += rolling_windows(ids, prefix_id, max_len, stride)
        n_tok += len(ids)
    nll = 0.0
    pos_sum = np.zeros(max_len, np.float64)
    pos_n = np.zeros(max_len, np.int64)
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
            scored = slice(len(inp) - k, len(inp))  # positions of the new targets
            nll -= float(lp[r, scored].sum(dtype=np.float64))
            pos_sum[scored] -= lp[r, scored].astype(np.float64)
            pos_n[scored] += 1
    return nll, n_tok, pos_sum, pos_n


def evaluate_tokens(scorer: scoring.Scorer, documents: Sequence[Sequence[int]], prefix_id: int,
                    *, max_len: int, stride: int,
                    position_buckets: Optional[Sequence[int]] = None) -> Dict[str, Any]:
    """Token perplexity ``exp(NLL / tokens)`` of tokenised documents (e.g. a token-shard
    corpus's validation split), windows and position buckets as in :func:`evaluate`.

    Returns:
      ``{"token_perplexity", "nll_per_token", "tokens", "documents", "position_nll"}`` (NLL in
      nats; ``position_nll`` as in :func:`evaluate`).

    Raises:
      ValueError: no document, an empty document, a bad ``stride`` or bad
        ``position_buckets``.
    """
    if not len(documents):
        raise ValueError("no documents to score")
    edges = check_position_buckets(position_buckets, max_len)
    nll, n_tok, pos_sum, pos_n = _score(scorer, documents, prefix_id, max_len=max_len,
                                        stride=stride)
    return {"token_perplexity": math.exp(nll / n_tok), "nll_per_token": nll / n_tok,
            "tokens": n_tok, "documents": len(documents),
            "position_nll": position_nll(pos_sum, pos_n, edges)}
