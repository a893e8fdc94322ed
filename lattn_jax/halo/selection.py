"""HALO attention-layer selection (arXiv 2601.22156; spec ``hypenet-halo.md`` §3.2, §5, §6.7-10).

For every layer ``l`` the teacher with only layer ``l``'s mixer replaced by its Stage-1 Lightning
student (RoPE attention elsewhere, no gates) is evaluated on commonsense (CSR, ``C_l``) and recall
(``R_l``). The score (authors' ``layer_analysis.py`` HALO mode) is::

    score_l = min(50, (max_j R_j - R_l) / (max_j C_j - C_l + 1e-10))

(a layer matters if replacing it costs much recall per unit of CSR lost; the reference is the best
single-replacement model, not the teacher), and the top ``floor(L / 4)`` layers by descending
score (``np.argsort(score)[::-1]``) stay softmax attention.

Evaluations, on whatever item files the config names (the paper uses lm-eval's HellaSwag,
ARC-E, ARC-C ``acc_norm`` and FDA, SWDE, RULER-QA-SQuAD ``contains``):

* :func:`acc_norm`: multiple choice, ``argmax_i loglik(choice_i | context) / len(choice_i)``
  (characters), lm-eval's ``acc_norm``;
* :func:`recall_contains`: greedy generation, correct iff the answer occurs in the output
  (case-insensitive), lm-eval's ``contains``;
* :func:`synthetic_recall_items`: a built-in needle-in-a-haystack key/value recall task for when no
  recall data is available (and for CPU tests).
"""

import json
import os
import random
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from lattn_jax.typing import Array

SCORE_CAP = 50.0


def halo_scores(csr: Sequence[float], recall: Sequence[float], *, cap: float = SCORE_CAP,
                eps: float = 1e-10) -> np.ndarray:
    """The per-layer HALO importance scores (spec §3.2 item 4).

    ``score_l = min(cap, (max_j R_j - R_l) / (max_j C_j - C_l + eps))``.

    Args:
      csr: ``[L]`` commonsense accuracy of each single-replacement model.
      recall: ``[L]`` recall accuracy of each single-replacement model.

    Returns:
      float64 ``[L]``.

    Raises:
      ValueError: if the lengths differ or are zero.
    """
    c = np.asarray(csr, np.float64)
    r = np.asarray(recall, np.float64)
    if c.shape != r.shape or c.ndim != 1 or c.size == 0:
        raise ValueError(f"csr and recall must be equal-length 1-D, got {c.shape} and {r.shape}")
    return np.minimum(cap, (r.max() - r) / (c.max() - c + eps))


def rank_layers(scores: Sequence[float]) -> List[int]:
    """Layers by descending score, as ``np.argsort(score)[::-1]`` (authors' order for ties)."""
    return [int(i) for i in np.argsort(np.asarray(scores))[::-1]]


def select_attention_layers(scores: Sequence[float], k: int) -> List[int]:
    """The ``k`` highest-scoring layers, sorted by index (the layers kept as attention).

    Raises:
      ValueError: unless ``0 <= k <= L``.
    """
    if not 0 <= k <= len(scores):
        raise ValueError(f"k={k} is outside [0, {len(scores)}]")
    return sorted(rank_layers(scores)[:k])


# ---------------------------------------------------------------------------------------------
# Evaluations
# ---------------------------------------------------------------------------------------------

def _bucket(n: int, multiple: int = 64) -> int:
    return max(multiple, -(-n // multiple) * multiple)


def _logprobs(model: Callable[[Array], Array], ids: Sequence[int]) -> np.ndarray:
    """``log p(ids[t+1] | ids[:t+1])`` for every ``t``, right-padded to a bucket (causal, so the
    padding does not change earlier positions), fp32 ``[len(ids) - 1]``."""
    n = len(ids)
    tokens = np.zeros((1, _bucket(n)), np.int32)
    tokens[0, :n] = ids
    logits = model(jnp.asarray(tokens))[0, :n - 1]  # [n-1, V]
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return np.asarray(jnp.take_along_axis(logp, jnp.asarray(ids[1:])[:, None], axis=-1)[:, 0])


def acc_norm(model: Callable[[Array], Array], tokenizer, items: Sequence[Mapping]) -> float:
    """Length-normalised multiple-choice accuracy (lm-eval ``acc_norm``).

    Args:
      model: ``tokens [1, T] -> logits [1, T, V]`` (e.g. a jitted ``LanguageModel``).
      tokenizer: with ``encode(str) -> list[int]``.
      items: dicts ``{"context": str, "choices": [str, ...], "label": int}``; each choice is
        scored by the sum of its tokens' log-probabilities after the context, divided by its
        length in characters.

    Returns:
      Accuracy in ``[0, 1]`` (``nan`` for no items).

    Raises:
      ValueError: an item misses a field or has an empty context.
    """
    correct = 0
    for i, item in enumerate(items):
        try:
            ctx, choices, label = item["context"], item["choices"], int(item["label"])
        except KeyError as e:
            raise ValueError(f"CSR item {i} has no {e}") from None
        ctx_ids = tokenizer.encode(ctx)
        if not ctx_ids:
            raise ValueError(f"CSR item {i} has an empty context")
        scores = []
        for choice in choices:
            cont = tokenizer.encode(choice)
            lp = _logprobs(model, ctx_ids + cont)[len(ctx_ids) - 1:]
            scores.append(float(np.sum(lp)) / max(len(choice), 1))
        correct += int(np.argmax(scores) == label)
    return correct / len(items) if items else float("nan")


def greedy_generate(model: Callable[[Array], Array], ids: Sequence[int], max_new_tokens: int,
                    stop_id: Optional[int] = None) -> List[int]:
    """Greedy continuation of ``ids`` (full recomputation per token on a bucketed buffer)."""
    total = len(ids) + max_new_tokens
    tokens = np.zeros((1, _bucket(total)), np.int32)
    tokens[0, :len(ids)] = ids
    out = []
    for n in range(len(ids), total):
        nxt = int(jnp.argmax(model(jnp.asarray(tokens))[0, n - 1]))
        if stop_id is not None and nxt == stop_id:
            break
        tokens[0, n] = nxt
        out.append(nxt)
    return out


def recall_contains(model: Callable[[Array], Array], tokenizer, items: Sequence[Mapping], *,
                    max_new_tokens: int = 16) -> float:
    """Greedy-generation recall: the fraction of items whose answer occurs in the output.

    Args:
      model: ``tokens [1, T] -> logits [1, T, V]``.
      tokenizer: with ``encode``, ``decode`` and ``eos_id``.
      items: dicts ``{"prompt": str, "answer": str}``.
      max_new_tokens: generation budget per item.

    Returns:
      Accuracy in ``[0, 1]`` (``nan`` for no items).

    Raises:
      ValueError: an item misses a field.
    """
    correct = 0
    for i, item in enumerate(items):
        if "prompt" not in item or "answer" not in item:
            raise ValueError(f"recall item {i} needs 'prompt' and 'answer'")
        out = greedy_generate(model, tokenizer.encode(item["prompt"]), max_new_tokens,
                              getattr(tokenizer, "eos_id", None))
        correct += int(str(item["answer"]).lower() in tokenizer.decode(out).lower())
    return correct / len(items) if items else float("nan")


_FILLER = ("The grass is green. The sky is blue. The sun is yellow. Here we go. "
           "There and back again. ")
_KEYS = ("apple", "river", "stone", "cloud", "tiger", "piano", "maple", "ocean", "candle",
         "violet", "harbor", "falcon")


def synthetic_recall_items(n: int, *, filler_repeats: int = 4, seed: int = 0) -> List[Dict]:
    """Needle-in-a-haystack key/value recall items (RULER ``niah_single_1``-like, spec §4.2).

    Each prompt hides "The special magic number for <key> is <7 digits>." at a random depth of
    ``filler_repeats`` copies of RULER's "repeat" haystack and asks for it.

    Returns:
      ``n`` dicts ``{"prompt", "answer"}``.
    """
    rng = random.Random(seed)
    items = []
    for _ in range(n):
        key = rng.choice(_KEYS)
        value = str(rng.randrange(1_000_000, 10_000_000))
        blocks = [_FILLER] * filler_repeats
        blocks.insert(rng.randrange(filler_repeats + 1),
                      f"The special magic number for {key} is {value}. ")
        prompt = ("".join(blocks) + f"What is the special magic number for {key}? "
                  f"The special magic number for {key} is")
        items.append({"prompt": prompt, "answer": value})
    return items


def read_jsonl(path: str) -> List[Dict]:
    """Reads evaluation items, one JSON object per line.

    Raises:
      FileNotFoundError: ``path`` does not exist.
      ValueError: a line is not valid JSON (names the file and line).
    """
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such evaluation file")
    items = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                try:
                    items.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{lineno}: {e}") from None
    return items


def sweep(num_layers: int, evaluate_layer: Callable[[int], Tuple[float, float]],
          results_path: Optional[str] = None,
          print_fn: Callable[[str], None] = print) -> Tuple[np.ndarray, np.ndarray]:
    """Runs the single-replacement sweep, one layer at a time, resuming from ``results_path``.

    Args:
      num_layers: ``L``.
      evaluate_layer: ``l -> (csr, recall)`` of the model with only layer ``l`` replaced.
      results_path: a JSONL file; each finished layer appends ``{"layer", "csr", "recall"}`` and
        layers already in it are not re-evaluated.

    Returns:
      ``(csr [L], recall [L])`` float64.
    """
    done: Dict[int, Tuple[float, float]] = {}
    if results_path and os.path.exists(results_path):
        for rec in read_jsonl(results_path):
            done[int(rec["layer"])] = (float(rec["csr"]), float(rec["recall"]))
    for layer in range(num_layers):
        if layer in done:
            continue
        c, r = evaluate_layer(layer)
        done[layer] = (c, r)
        print_fn(f"layer {layer:3d}: csr {c:.4f}  recall {r:.4f}")
        if results_path:
            with open(results_path, "a") as f:
                f.write(json.dumps({"layer": layer, "csr": c, "recall": r}) + "\n")
    csr = np.array([done[i][0] for i in range(num_layers)])
    recall = np.array([done[i][1] for i in range(num_layers)])
    return csr, recall
