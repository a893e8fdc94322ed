"""HALO attention-layer selection (arXiv 2601.22156; spec ``hypenet-halo.md`` §3.2, §5, §6.7-10).

For every layer ``l`` the teacher with only layer ``l``'s mixer replaced by its Stage-1 Lightning
student (RoPE attention elsewhere, no gates) is evaluated on commonsense (CSR, ``C_l``) and recall
(``R_l``). The score (authors' ``layer_analysis.py`` HALO mode) is::

    score_l = min(50, (max_j R_j - R_l) / (max_j C_j - C_l + 1e-10))

(a layer matters if replacing it costs much recall per unit of CSR lost; the reference is the best
single-replacement model, not the teacher), and the top ``floor(L / 4)`` layers by descending
score (``np.argsort(score)[::-1]``) stay softmax attention.

Probes (the paper uses lm-eval's HellaSwag, ARC-E, ARC-C ``acc_norm`` and FDA, SWDE,
RULER-QA-SQuAD ``contains``). The sweep's defaults are teacher-forced and batched, one forward
per fixed-shape batch and no generation (:func:`prepare_continuations`, a :data:`TargetScorer`
such as :meth:`ReplacementSweep.target_logprobs`, which computes the LM head only at the
scored positions):

* :class:`CsrProbe` on :func:`heldout_csr_items`: lm-eval ``acc_norm`` (as the report computes
  it, :func:`lattn_jax.eval.tasks.process_results`) of ARC-Easy / ARC-Challenge *Dev* items
  and HellaSwag validation items outside the report's seeded subsets, so that the selection
  never sees what the report scores; ``C_l`` = the mean over tasks;
* :class:`RecallProbe` on :func:`niah_recall_prompts`: RULER NIAH prompts
  (:func:`lattn_jax.eval.niah.make_sample`, e.g. ``niah_single_2`` / ``niah_multikey_1`` at
  2K and 4K tokens) followed by the gold needle value; ``R_l`` = the mean over prompts of the
  mean per-token probability of the answer tokens. It is continuous on purpose: the discrete
  "all answer tokens are the argmax" accuracy (recorded too) saturates, and saturated recall
  gives equal HALO scores (23 of 30 layers tied at 0 with a ~500-token probe).

Per-item and generation-based evaluations (the legacy ``"items"`` / ``"synthetic"`` probes):

* :func:`acc_norm`: multiple choice, ``argmax_i loglik(choice_i | context) / len(choice_i)``
  (characters), one forward per choice (the per-item reference);
* :func:`recall_contains`: greedy generation, correct iff the answer occurs in the output
  (case-insensitive), lm-eval's ``contains``; decoded with per-layer states (a prefill, then one
  ``T == 1`` step per token through :class:`lattn_jax.eval.generate.Generator`), prompts batched;
  :func:`greedy_generate_full` is the full-recomputation reference it is tested against;
* :func:`synthetic_recall_items`: a built-in needle-in-a-haystack key/value recall task for when no
  recall data is available (and for CPU tests).

The sweep itself runs on :class:`SingleReplacementModel`: the teacher plus every layer's Stage-1
student, with the replaced layer's index held in a variable rather than in the graph, so the
``L`` single-replacement models share one compiled forward, prefill and decode step
(:class:`ReplacementSweep`) instead of compiling ``L`` models.
"""

import dataclasses
import os
import random
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lattn_jax import config as config_lib
from lattn_jax import model as model_lib
from lattn_jax import records
from lattn_jax import train as train_lib
from lattn_jax.eval import generate as gen_lib
from lattn_jax.eval import niah as niah_lib
from lattn_jax.eval import scoring
from lattn_jax.eval import tasks as tasks_lib
from lattn_jax.mixers import attention as attention_lib
from lattn_jax.mixers import lightning
from lattn_jax.typing import Array, PyTree

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


def _resample_means(values: np.ndarray, ix: np.ndarray, resamples: int,
                    rng: np.random.Generator) -> np.ndarray:
    """``[B, L]``: the means of ``values[:, ix]`` (``values [L, N]``) over ``len(ix)`` items
    drawn with replacement from ``ix``, the same draw for every layer (paired)."""
    n = len(ix)
    counts = rng.multinomial(n, np.full(n, 1.0 / n), size=resamples)  # [B, n]
    return counts @ values[:, ix].T / n


def bootstrap_selection(csr_per_doc: Mapping[str, Any], recall_per_prompt: Any,
                        recall_cells: Sequence[str], k: int, *, resamples: int = 1000,
                        seed: int = 0) -> Dict[str, Any]:
    """How stable the selection is under the probes' item sampling (a paired bootstrap).

    Each resample draws, with replacement and the same draw for every layer, the CSR items of
    every task (``n_t`` of ``n_t``) and the recall prompts of every cell (``n_c`` of ``n_c``),
    recomputes ``C_l`` (the mean over tasks of each task's mean ``acc_norm``) and ``R_l`` (the
    mean over all prompts, each cell keeping its size), the scores
    (:func:`halo_scores`) and the top ``k`` (:func:`select_attention_layers`). A layer's
    frequency in the top ``k`` near 1 or 0 is decided by the probes; near 0.5 it is a coin
    flip of which items were drawn.

    Args:
      csr_per_doc: ``{task: [L, n_t]}`` 0/1 ``acc_norm`` per layer and item.
      recall_per_prompt: ``[L, P]`` per-prompt recall per layer.
      recall_cells: ``[P]`` each prompt's cell (``"{task}@{length}"``); resampled within cells.
      k: attention layers kept.
      resamples: ``B`` (>= 1); seed: the generator's seed.

    Returns:
      ``{"resamples", "seed", "top_k_frequency": [L] floats, "selected": the full-data
      selection, "selected_frequency": the share of resamples that pick exactly it,
      "sets": [[layers, share], ...] the five most frequent sets}``.

    Raises:
      ValueError: shapes that disagree, no CSR task, ``resamples < 1`` or ``k`` outside
        ``[0, L]``.
    """
    if resamples < 1:
        raise ValueError(f"select.bootstrap_resamples must be >= 1, got {resamples}")
    if not csr_per_doc:
        raise ValueError("bootstrap_selection needs at least one CSR task")
    csr = {t: np.asarray(v, np.float64) for t, v in csr_per_doc.items()}
    recall = np.asarray(recall_per_prompt, np.float64)
    num_layers = recall.shape[0] if recall.ndim == 2 else -1
    bad = [t for t, v in csr.items() if v.ndim != 2 or v.shape[0] != num_layers]
    if recall.ndim != 2 or bad or len(recall_cells) != recall.shape[1]:
        raise ValueError(f"bootstrap_selection: recall must be [L, P] with P cells and every "
                         f"CSR task [L, n]; got recall {recall.shape}, {len(recall_cells)} "
                         f"cells, CSR {({t: v.shape for t, v in csr.items()})}")
    if not 0 <= k <= num_layers:
        raise ValueError(f"k={k} is outside [0, {num_layers}]")
    rng = np.random.default_rng(seed)
    c = np.zeros((resamples, num_layers))
    for values in csr.values():  # the mean over tasks of each task's resampled mean
        c += _resample_means(values, np.arange(values.shape[1]), resamples, rng)
    c /= len(csr)
    cells = np.asarray(list(recall_cells))
    r = np.zeros((resamples, num_layers))  # the mean over all prompts, as RecallProbe's
    for name in dict.fromkeys(recall_cells):
        g = np.flatnonzero(cells == name)
        r += _resample_means(recall, g, resamples, rng) * len(g) / len(cells)
    freq = np.zeros(num_layers)
    sets: Dict[Tuple[int, ...], int] = {}
    for b in range(resamples):
        chosen = tuple(select_attention_layers(halo_scores(c[b], r[b]), k))
        freq[list(chosen)] += 1
        sets[chosen] = sets.get(chosen, 0) + 1
    full_c = np.mean([v.mean(axis=1) for v in csr.values()], axis=0)
    selected = select_attention_layers(halo_scores(full_c, recall.mean(axis=1)), k)
    top = sorted(sets.items(), key=lambda kv: (-kv[1], kv[0]))[:5]
    return {"resamples": int(resamples), "seed": int(seed),
            "top_k_frequency": (freq / resamples).tolist(), "selected": selected,
            "selected_frequency": sets.get(tuple(selected), 0) / resamples,
            "sets": [[list(s), n / resamples] for s, n in top]}


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
    # On the host: eager slices of a device array would compile once per length.
    logits = np.asarray(model(jnp.asarray(tokens)), np.float32)[0, :n - 1]  # [n-1, V]
    shifted = logits - logits.max(axis=-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return logp[np.arange(n - 1), np.asarray(ids[1:])]


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


def greedy_generate_full(model: Callable[[Array], Array], ids: Sequence[int],
                         max_new_tokens: int, stop_id: Optional[int] = None) -> List[int]:
    """Greedy continuation of one prompt by full recomputation (the slow reference).

    Every new token re-runs ``model`` on the whole sequence (right-padded to a multiple of 64;
    the model is causal, so the padding is never read).

    Args:
      model: ``tokens int32 [1, T] -> logits [1, T, V]``.
      ids: the prompt's token ids (non-empty).
      max_new_tokens: the most tokens generated.
      stop_id: generation ends before this id (it is not returned).

    Returns:
      The generated ids, without the stop id.
    """
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


def decoding_model(model: model_lib.LanguageModel) -> model_lib.LanguageModel:
    """``model`` sharing its parameters, with ``use_segment_ids`` on, for padded generation.

    ``LanguageModel`` drops ``segment_ids`` on a stateless call of a model trained without them
    (HALO teachers and students), and the Generator's prefill is such a call, so left padding
    would be read by the prompt. With ``use_segment_ids`` on, the prefill keeps the padding in
    its own document; nothing else changes (no call without a state passes ``segment_ids``).
    """
    if model.config.use_segment_ids:
        return model
    out = nnx.clone(model)
    out.config = dataclasses.replace(model.config, use_segment_ids=True)
    return out


def greedy_generate(model: Union[gen_lib.Generator, nnx.Module], prompts: Sequence[Sequence[int]],
                    max_new_tokens: int, stop_id: Optional[int] = None, *,
                    batch_size: int = 16, bucket: int = 16) -> List[List[int]]:
    """Greedy continuations decoded with per-layer states: one prefill, then ``T == 1`` steps.

    Prompts are left-padded to a common multiple of ``bucket`` and generated ``batch_size`` at
    a time (padding is a separate document, so a row gives the tokens of its prompt alone).

    Args:
      model: a :class:`~lattn_jax.eval.generate.Generator` (reused: its compiled prefill and
        step), or a module with ``LanguageModel``'s call contract (``state``/``return_state``,
        ``grow_state``), e.g. a ``LanguageModel`` or :class:`SingleReplacementModel`.
      prompts: token-id lists, each non-empty.
      max_new_tokens: the most tokens generated per prompt (>= 1).
      stop_id: a row ends before this id (it is not returned).
      batch_size: prompts per generation call.
      bucket: padding multiple of a new Generator (ignored for a Generator).

    Returns:
      Per prompt, the generated ids without the stop id: for a causal model, the tokens of
      :func:`greedy_generate_full` (up to numerical ties).

    Raises:
      ValueError: for an empty prompt or ``max_new_tokens < 1``.
    """
    if isinstance(model, gen_lib.Generator):
        generator = model
    else:
        if isinstance(model, model_lib.LanguageModel):
            model = decoding_model(model)
        generator = gen_lib.Generator(model, pad_id=0 if stop_id is None else stop_id,
                                      bucket=bucket)
    stops = [] if stop_id is None else [stop_id]
    out: List[List[int]] = []
    for i in range(0, len(prompts), batch_size):
        res = generator.generate(prompts[i:i + batch_size], max_new_tokens=max_new_tokens,
                                 stop_tokens=stops)
        for toks, finished in zip(res.tokens, res.finished):
            out.append(list(toks[:-1]) if finished else list(toks))
    return out


def recall_contains(model, tokenizer, items: Sequence[Mapping], *, max_new_tokens: int = 16,
                    batch_size: int = 16) -> float:
    """Greedy-generation recall: the fraction of items whose answer occurs in the output.

    Args:
      model: a :class:`~lattn_jax.eval.generate.Generator` or a module with ``LanguageModel``'s
        call contract (decoded with per-layer states, :func:`greedy_generate`), or any
        ``tokens [1, T] -> logits [1, T, V]`` function (full recomputation per token,
        :func:`greedy_generate_full`).
      tokenizer: with ``encode``, ``decode`` and ``eos_id``.
      items: dicts ``{"prompt": str, "answer": str}``.
      max_new_tokens: generation budget per item.
      batch_size: prompts decoded together (state decoding only).

    Returns:
      Accuracy in ``[0, 1]`` (``nan`` for no items).

    Raises:
      ValueError: an item misses a field.
    """
    for i, item in enumerate(items):
        if "prompt" not in item or "answer" not in item:
            raise ValueError(f"recall item {i} needs 'prompt' and 'answer'")
    if not items:
        return float("nan")
    stop = getattr(tokenizer, "eos_id", None)
    prompts = [tokenizer.encode(item["prompt"]) for item in items]
    if isinstance(model, (gen_lib.Generator, nnx.Module)):
        outs = greedy_generate(model, prompts, max_new_tokens, stop, batch_size=batch_size)
    else:
        outs = [greedy_generate_full(model, p, max_new_tokens, stop) for p in prompts]
    correct = sum(int(str(item["answer"]).lower() in tokenizer.decode(out).lower())
                  for item, out in zip(items, outs))
    return correct / len(items)


# ---------------------------------------------------------------------------------------------
# The single-replacement model of the sweep
# ---------------------------------------------------------------------------------------------

class ReplacedLayer(nnx.Variable):
    """The index of the layer whose mixer is the Lightning student (``-1``: none)."""


class SingleReplacementModel(nnx.Module):
    """The teacher with layer ``replaced`` mixed by its Stage-1 Lightning student.

    Every block computes both its teacher attention and its student on the same normalised input
    and keeps ``student if l == replaced else attention`` (``jnp.where``), so the model equals the
    sweep's converted model (``hypenet_config(teacher, all layers but l, attention_rope=True,
    attention_gate=False)`` with layer ``l``'s Stage-1 params) for every ``l``, while ``replaced``
    is a variable: one compiled program serves all ``L`` layers. The extra student per block
    costs about half a block's FLOPs.

    Same call contract as :class:`~lattn_jax.model.LanguageModel` (``segment_ids``, ``state``,
    ``return_state``, ``grow_state``), so :class:`lattn_jax.eval.generate.Generator` decodes it;
    a layer's state is the pair ``(KVCache or None, LightningState)``.

    Args:
      teacher_cfg: the teacher's config (all ``"attn"`` layers).
      student_cfg: a HypeNet config whose ``lightning`` section builds the students.
      rngs: NNX rngs (use under ``nnx.eval_shape``; :func:`build_sweep_model` fills the params).

    Attributes:
      teacher: the teacher ``LanguageModel``.
      students: ``L`` :class:`~lattn_jax.mixers.lightning.LightningAttention` modules.
      replaced: :class:`ReplacedLayer`, int32 scalar.
    """

    def __init__(self, teacher_cfg: config_lib.ModelConfig,
                 student_cfg: config_lib.ModelConfig, *, rngs: nnx.Rngs):
        self.config = teacher_cfg
        self.teacher = model_lib.LanguageModel(teacher_cfg, rngs=rngs)
        self.students = nnx.List([lightning.LightningAttention(student_cfg, rngs=rngs)
                                  for _ in range(teacher_cfg.num_layers)])
        self.replaced = ReplacedLayer(jnp.asarray(-1, jnp.int32))

    @staticmethod
    def grow_state(states: Sequence[Tuple[Any, Any]], max_len: int) -> List[Tuple[Any, Any]]:
        """Per-layer states with each KV cache's capacity raised to ``max_len``."""
        return [(attention_lib.grow_cache(a, max_len), s) for a, s in states]

    def __call__(self, tokens: Array, *, segment_ids: Optional[Array] = None,
                 route: bool = True, state: Optional[Sequence[Tuple[Any, Any]]] = None,
                 return_state: bool = False, last_logits_only: bool = False,
                 positions: Optional[Array] = None):
        """Logits of the single-replacement model, optionally continuing per-layer states.

        Args:
          tokens: int ``[B, T]``.
          segment_ids: optional int ``[B, T]``, used whenever states are involved (padding in a
            prefill) or when the teacher config sets ``use_segment_ids``.
          route: ignored (no routing in a HALO teacher); accepted for the Generator.
          state: optional list of ``(attention state, Lightning state)`` per layer.
          return_state: also return the new states (``state=None``: fresh ones, the attention
            caches of capacity ``T``, see :meth:`grow_state`).
          last_logits_only: compute the logits of the last position only (``[B, 1, S]``).
          positions: optional int ``[B, P]``: compute the logits of these positions only
            (``[B, P, S]``; the teacher-forced probes read a few positions of long rows, and
            the full fp32 ``[B, T, S]`` logits would take ``4 B T S`` bytes).

        Returns:
          fp32 logits ``[B, T, S]`` (``[B, 1, S]``, ``[B, P, S]``), or ``(logits, new_states)``.

        Raises:
          ValueError: if ``state`` does not have one entry per layer, or both
            ``last_logits_only`` and ``positions`` are given.
        """
        del route
        if last_logits_only and positions is not None:
            raise ValueError("pass last_logits_only or positions, not both")
        teacher = self.teacher
        stateful = return_state or state is not None
        if not stateful and not self.config.use_segment_ids:
            segment_ids = None
        if state is not None and len(state) != len(teacher.blocks):
            raise ValueError(f"state has {len(state)} entries for {len(teacher.blocks)} layers")
        b = tokens.shape[0]
        replaced = self.replaced[...]
        h = jnp.take(teacher.embed[...], tokens, axis=0).astype(teacher.dtype)  # [B, T, D]
        new_states = []
        for i, (block, student) in enumerate(zip(teacher.blocks, self.students)):
            x = block.mixer_norm(h)
            if stateful:
                a_st, s_st = (None, student.init_state(b)) if state is None else state[i]
                y_a, a_st = block.mixer(x, segment_ids=segment_ids, state=a_st,
                                        return_state=True)
                y_s, s_st = student(x, segment_ids=segment_ids, state=s_st, return_state=True)
                new_states.append((a_st, s_st))
            else:
                y_a = block.mixer(x, segment_ids=segment_ids)
                y_s = student(x, segment_ids=segment_ids)
            h = h + jnp.where(replaced == i, y_s.astype(h.dtype), y_a.astype(h.dtype))
            h = h + block.mlp(block.mlp_norm(h)).astype(h.dtype)
        if last_logits_only:
            h = h[:, -1:]
        elif positions is not None:
            h = jnp.take_along_axis(h, jnp.asarray(positions, jnp.int32)[:, :, None],
                                    axis=1)  # [B, P, D]
        h = teacher.final_norm(h)
        if teacher.head is None:
            logits = jnp.einsum("btd,sd->bts", h, teacher.embed[...].astype(teacher.dtype))
        else:
            logits = teacher.head(h)
        logits = logits.astype(jnp.float32)
        return (logits, new_states) if return_state else logits


def build_sweep_model(teacher_cfg: config_lib.ModelConfig, teacher_params: PyTree,
                      student_cfg: config_lib.ModelConfig,
                      lightning_params: Mapping[int, PyTree]) -> SingleReplacementModel:
    """A :class:`SingleReplacementModel` holding the teacher's and the Stage-1 students' params.

    Args:
      teacher_cfg, teacher_params: the teacher (pure-dict ``LanguageModel`` params).
      student_cfg: the Stage-1 student config (its ``lightning`` section).
      lightning_params: ``{layer: LightningAttention params}`` for every layer (Stage 1's
        ``params["mixers"]``).

    Returns:
      The model with ``replaced = -1`` (the teacher); params in ``teacher_cfg.param_dtype``.

    Raises:
      ValueError: if a layer has no student params.
    """
    missing = [i for i in range(teacher_cfg.num_layers) if i not in lightning_params]
    if missing:
        raise ValueError(f"no Stage-1 student params for layers {missing}")
    abstract = nnx.eval_shape(lambda: SingleReplacementModel(teacher_cfg, student_cfg,
                                                             rngs=nnx.Rngs(0)))
    graphdef, params, rest = nnx.split(abstract, nnx.Param, ...)
    dtype = jnp.dtype(teacher_cfg.param_dtype)
    tree = {"teacher": teacher_params,
            "students": {i: lightning_params[i] for i in range(teacher_cfg.num_layers)}}
    nnx.replace_by_pure_dict(params, jax.tree_util.tree_map(lambda x: jnp.asarray(x, dtype),
                                                            tree))
    model = nnx.merge(graphdef, params, rest)
    model.replaced.set_value(jnp.asarray(-1, jnp.int32))
    return model


class ReplacementSweep:
    """Compiled evaluations of a :class:`SingleReplacementModel` for any replaced layer.

    ``select(l)`` swaps the layer index into the captured state; the forward, the loss and the
    Generator's prefill and step are compiled once for all layers (per input shape).

    Args:
      model: the sweep model (:func:`build_sweep_model`).
      pad_id: the Generator's padding id.
      bucket: the Generator's prompt-length multiple.
    """

    def __init__(self, model: SingleReplacementModel, *, pad_id: int = 0, bucket: int = 64):
        self.model = model
        self.graphdef, self.state = nnx.split(model)
        self.generator = gen_lib.Generator(model, pad_id=pad_id, bucket=bucket)
        graphdef = self.graphdef
        self._forward = jax.jit(lambda st, t: nnx.merge(graphdef, st)(t))

        def loss_sums(st, batch):
            logits = nnx.merge(graphdef, st)(batch["inputs"])
            return train_lib.cross_entropy_loss(logits, batch["targets"], batch["weights"])[1:]

        self._loss_sums = jax.jit(loss_sums)

        def target_logprobs(st, tokens, positions, targets):
            logits = nnx.merge(graphdef, st)(tokens, positions=positions)  # fp32 [B, P, S]
            return gathered_target_logprobs(logits, targets)

        self._target_logprobs = jax.jit(target_logprobs)

    def select(self, layer: int) -> None:
        """Makes ``layer`` (``-1``: none) the replaced one for every later call."""
        self.model.replaced.set_value(jnp.asarray(layer, jnp.int32))
        _, self.state = nnx.split(self.model)
        # The Generator's compiled functions take the parameter state as an argument.
        self.generator.params = self.state

    def logits(self, tokens: Array) -> Array:
        """``tokens int [B, T] -> fp32 logits [B, T, S]`` of the selected model."""
        return self._forward(self.state, jnp.asarray(tokens, jnp.int32))

    def loss_sums(self, batch: Mapping[str, Any]) -> Tuple[float, float]:
        """``(sum of token cross-entropies in nats, sum of weights)`` of one batch
        (``inputs``, ``targets`` int ``[B, T]``, ``weights`` ``[B, T]``)."""
        total, count = self._loss_sums(self.state, {
            "inputs": jnp.asarray(batch["inputs"], jnp.int32),
            "targets": jnp.asarray(batch["targets"], jnp.int32),
            "weights": jnp.asarray(batch["weights"], jnp.float32)})
        return float(total), float(count)

    def target_logprobs(self, tokens: np.ndarray, positions: np.ndarray,
                        targets: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """A :data:`TargetScorer` of the selected model (one compiled program per shape).

        Args:
          tokens: int ``[B, T]`` inputs (right padding is never read by earlier positions).
          positions: int ``[B, P]`` positions whose next-token distribution is read.
          targets: int ``[B, P]`` the token expected after each of them.

        Returns:
          ``(log p(targets | tokens[:, :positions + 1]) fp32 [B, P], argmax == targets bool
          [B, P])``.
        """
        lp, greedy = self._target_logprobs(self.state, jnp.asarray(tokens, jnp.int32),
                                           jnp.asarray(positions, jnp.int32),
                                           jnp.asarray(targets, jnp.int32))
        return np.asarray(lp), np.asarray(greedy)


# ---------------------------------------------------------------------------------------------
# Teacher-forced probes: batched, fixed shapes, no generation
# ---------------------------------------------------------------------------------------------

# ``(tokens int [B, T], positions int [B, P], targets int [B, P]) -> (log p fp32 [B, P],
# argmax == target bool [B, P])``: the next-token log-probability of ``targets[b, p]`` after
# ``tokens[b, :positions[b, p] + 1]``, and whether it is the argmax there.
TargetScorer = Callable[[np.ndarray, np.ndarray, np.ndarray], Tuple[np.ndarray, np.ndarray]]


def gathered_target_logprobs(logits: Array, targets: Array) -> Tuple[Array, Array]:
    """``log_softmax(logits)[..., target]`` in fp32 and ``argmax(logits) == target``.

    Args:
      logits: ``[B, P, S]`` (any float dtype; the softmax runs in fp32).
      targets: int ``[B, P]``.

    Returns:
      ``(fp32 [B, P], bool [B, P])``.
    """
    logits = logits.astype(jnp.float32)
    logp = jax.nn.log_softmax(logits, axis=-1)
    targets = jnp.asarray(targets, jnp.int32)
    lp = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return lp, jnp.argmax(logits, axis=-1) == targets


def logits_scorer(model: Callable[[Array], Array]) -> TargetScorer:
    """A :data:`TargetScorer` of any ``tokens int [B, T] -> logits [B, T, S]`` function.

    The full logits are computed and the requested positions gathered (the sweep's own
    :meth:`ReplacementSweep.target_logprobs` computes the head at those positions only).
    """
    def score(tokens, positions, targets):
        logits = model(jnp.asarray(tokens, jnp.int32))  # [B, T, S]
        at = jnp.take_along_axis(logits, jnp.asarray(positions, jnp.int32)[:, :, None],
                                 axis=1)  # [B, P, S]
        lp, greedy = gathered_target_logprobs(at, targets)
        return np.asarray(lp), np.asarray(greedy)

    return score


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


@dataclasses.dataclass(frozen=True)
class ContinuationBatches:
    """``(context, continuation)`` token requests packed into fixed-shape batches, once.

    Built by :func:`prepare_continuations`; every evaluation (one per replaced layer) runs the
    same arrays, so a sweep compiles one program per distinct ``(B, T, P)``.

    Attributes:
      batches: per batch ``(tokens int32 [B, T], positions int32 [B, P], targets int32 [B, P],
        valid bool [B, P], rows int64 [B])``; ``rows[b]`` is the request index of row ``b``
        (``-1``: a padding row), ``valid`` marks the continuation tokens.
      cont_lengths: tokens scored per request.
    """

    batches: Tuple[Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray], ...]
    cont_lengths: Tuple[int, ...]

    @property
    def tokens(self) -> int:
        """Token positions forwarded per evaluation, padding included (``sum B T``)."""
        return int(sum(b[0].size for b in self.batches))

    @property
    def shapes(self) -> List[Tuple[int, int, int]]:
        """The distinct ``(B, T, P)`` (one compiled program each)."""
        return sorted({(b[0].shape[0], b[0].shape[1], b[1].shape[1]) for b in self.batches})


def prepare_continuations(requests: Sequence[Tuple[Sequence[int], Sequence[int]]], *,
                          batch_size: int, bucket: int, max_len: int,
                          cont_bucket: int = 8) -> ContinuationBatches:
    """Packs requests into right-padded batches with :class:`~lattn_jax.eval.scoring.Scorer`'s
    semantics (the report's scorer: same truncation, order and padding).

    Each request reads ``inputs = (ctx + cont)[-(max_len + 1):][:-1]`` (left truncation);
    its ``len(cont)`` continuation tokens are predicted at the last ``len(cont)`` positions of
    ``inputs``. Rows are sorted by length (longest first), ``batch_size`` per batch (a smaller
    single batch when there are fewer requests), each batch padded to a multiple of ``bucket``
    (at most ``max_len``); ``P`` is the longest continuation over ALL requests rounded up to
    ``cont_bucket``, so batches differ only in ``T``. The model is causal: right padding is
    never read by the scored positions.

    Args:
      requests: ``(context ids, continuation ids)``, both non-empty (e.g. from
        :func:`lattn_jax.eval.scoring.encode_pair`).
      batch_size, bucket, max_len, cont_bucket: positive ints.

    Returns:
      A :class:`ContinuationBatches`.

    Raises:
      ValueError: for an empty context or continuation, a continuation longer than
        ``max_len``, or a non-positive size.
    """
    if min(batch_size, bucket, max_len, cont_bucket) < 1:
        raise ValueError(f"batch_size, bucket, max_len and cont_bucket must be >= 1, got "
                         f"{batch_size=} {bucket=} {max_len=} {cont_bucket=}")
    rows = []
    for i, (ctx, cont) in enumerate(requests):
        if not len(ctx) or not len(cont):
            raise ValueError(f"request {i}: context and continuation must be non-empty")
        if len(cont) > max_len:
            raise ValueError(f"request {i}: continuation of {len(cont)} tokens exceeds "
                             f"max_len={max_len}")
        whole = (list(ctx) + list(cont))[-(max_len + 1):]
        rows.append((whole[:-1], whole[1:], len(cont)))
    if not rows:
        return ContinuationBatches(batches=(), cont_lengths=())
    p = _round_up(max(r[2] for r in rows), cont_bucket)
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i][0]))
    b = batch_size if len(order) > batch_size else len(order)
    batches = []
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        t = max(len(rows[i][0]) for i in idx)
        t = min(_round_up(t, bucket), max(max_len, t))
        tokens = np.zeros((b, t), np.int32)
        positions = np.zeros((b, p), np.int32)
        targets = np.zeros((b, p), np.int32)
        valid = np.zeros((b, p), bool)
        row_ids = np.full((b,), -1, np.int64)
        for r, i in enumerate(idx):
            inp, tgt, n_cont = rows[i]
            n = len(inp)
            tokens[r, :n] = inp
            positions[r, :n_cont] = np.arange(n - n_cont, n)
            targets[r, :n_cont] = tgt[n - n_cont:]
            valid[r, :n_cont] = True
            row_ids[r] = i
        batches.append((tokens, positions, targets, valid, row_ids))
    return ContinuationBatches(batches=tuple(batches),
                               cont_lengths=tuple(r[2] for r in rows))


def score_continuations(scorer: TargetScorer, prepared: ContinuationBatches
                        ) -> List[Tuple[np.ndarray, np.ndarray]]:
    """Teacher-forced continuation scores of every request.

    Args:
      scorer: a :data:`TargetScorer` (:meth:`ReplacementSweep.target_logprobs`,
        :func:`logits_scorer`).
      prepared: from :func:`prepare_continuations`.

    Returns:
      Per request, in request order, ``(log p of each continuation token fp32 [n_cont],
      is-argmax bool [n_cont])``.
    """
    out: List[Optional[Tuple[np.ndarray, np.ndarray]]] = [None] * len(prepared.cont_lengths)
    for tokens, positions, targets, valid, row_ids in prepared.batches:
        lp, greedy = scorer(tokens, positions, targets)
        lp, greedy = np.asarray(lp, np.float32), np.asarray(greedy, bool)
        for r, i in enumerate(row_ids):
            if i >= 0:
                n = prepared.cont_lengths[i]
                out[i] = (lp[r, :n], greedy[r, :n])
    return out  # type: ignore[return-value]


def continuation_loglikelihoods(scorer: TargetScorer, prepared: ContinuationBatches
                                ) -> List[Tuple[float, bool]]:
    """Per request ``(sum_i log p(cont_i | ...), every token greedy)``: the result of
    :meth:`lattn_jax.eval.scoring.Scorer.loglikelihood` (sums in fp64 of fp32 log-probs)."""
    return [(float(lp.sum(dtype=np.float64)), bool(g.all()))
            for lp, g in score_continuations(scorer, prepared)]


# Held-out commonsense items ------------------------------------------------------------------

# Tasks the report scores, with the split the selection reads instead: ARC's Dev files (the
# report reads Test) and the HellaSwag validation items outside the report's seeded subsets.
HELDOUT_CSR_TASKS = ("arc_easy", "arc_challenge", "hellaswag")


@dataclasses.dataclass(frozen=True)
class HeldOutItems:
    """Multiple-choice items of one task that the report does not score.

    Attributes:
      task: ``"arc_easy"``, ``"arc_challenge"`` or ``"hellaswag"``.
      source: the file read.
      indices: the items' indices in ``source`` (sorted).
      docs: :class:`lattn_jax.eval.tasks.Doc` in lm-eval's prompt format (as the report).
    """

    task: str
    source: str
    indices: Tuple[int, ...]
    docs: Tuple[tasks_lib.Doc, ...]


def load_arc_split(eval_dir: str, task: str,
                   split: str = "Dev") -> Tuple[str, List[tasks_lib.Doc]]:
    """ARC items of one split in lm-eval's format (``tasks.load_task("arc_*")`` reads Test).

    ``"Question: {stem}\\nAnswer:"`` -> ``" " + choice_i``, gold = index of ``answerKey``.

    Args:
      eval_dir: directory laid out as ``shared/data/eval``.
      task: ``"arc_easy"`` or ``"arc_challenge"``.
      split: ``"Dev"``, ``"Test"`` or ``"Train"`` (``arc/ARC-{Easy,Challenge}-{split}.jsonl``).

    Returns:
      ``(path, docs)``.

    Raises:
      ValueError: for another task. FileNotFoundError: naming the missing file.
    """
    names = {"arc_easy": "Easy", "arc_challenge": "Challenge"}
    if task not in names:
        raise ValueError(f"{task!r} is not an ARC task; choose arc_easy or arc_challenge")
    path = os.path.join(eval_dir, "arc", f"ARC-{names[task]}-{split}.jsonl")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no ARC {split} file (the selection's held-out "
                                f"commonsense items; set select.data_dir or report.data_dir to "
                                f"the directory laid out as shared/data)")
    docs = []
    for d in read_jsonl(path):
        q = d["question"]
        labels = [c["label"] for c in q["choices"]]
        texts = [c["text"] for c in q["choices"]]
        docs.append(tasks_lib.Doc(requests=tuple((f"Question: {q['stem']}\nAnswer:", " " + t)
                                                 for t in texts),
                                  gold=labels.index(d["answerKey"]), choices=tuple(texts)))
    return path, docs


def heldout_csr_items(eval_dir: str, *, tasks: Sequence[str] = HELDOUT_CSR_TASKS,
                      per_task: int = 200, seed: int = 0,
                      hellaswag_exclude: Sequence[Tuple[int, int]] = ((1000, 1234),)
                      ) -> Dict[str, HeldOutItems]:
    """The selection's commonsense items, disjoint from what the report scores.

    * ``arc_easy`` / ``arc_challenge``: ``per_task`` items of ``ARC-*-Dev.jsonl`` (the report
      reads ``ARC-*-Test.jsonl``), the seeded subsample
      :func:`lattn_jax.eval.tasks.subset_indices` ``(n, per_task, seed)``;
    * ``hellaswag``: ``per_task`` validation items drawn (same rule) from those NOT in any
      ``load_task("hellaswag", eval_dir, limit, seed)`` subset for ``(limit, seed)`` in
      ``hellaswag_exclude`` (the report's ``(csr_limit, csr_seed)``).

    Args:
      eval_dir: directory laid out as ``shared/data/eval``.
      tasks: a subset of :data:`HELDOUT_CSR_TASKS`.
      per_task: items per task (all of them if fewer).
      seed: subsampling seed.
      hellaswag_exclude: ``(limit, seed)`` pairs of the report's HellaSwag subsets (``limit``
        ``None``: every item).

    Returns:
      ``{task: HeldOutItems}`` in ``tasks`` order.

    Raises:
      ValueError: for a task without a held-out split, ``per_task < 1``, or no HellaSwag item
        left outside the excluded subsets.
      FileNotFoundError: naming a missing data file.
    """
    bad = [t for t in tasks if t not in HELDOUT_CSR_TASKS]
    if bad:
        raise ValueError(f"select.csr_tasks: {bad} have no held-out split here; choose from "
                         f"{', '.join(HELDOUT_CSR_TASKS)}")
    if per_task < 1:
        raise ValueError(f"select.csr_items_per_task must be >= 1, got {per_task}")
    out = {}
    for task in tasks:
        if task == "hellaswag":
            docs = tasks_lib.load_task("hellaswag", eval_dir)
            source = os.path.join(eval_dir, "hellaswag", "hellaswag_val_full.txt.bz2")
            excluded = set()
            for limit, ex_seed in hellaswag_exclude:
                excluded.update(int(i) for i in tasks_lib.subset_indices(
                    len(docs), None if limit is None else int(limit), int(ex_seed)))
            candidates = np.array([i for i in range(len(docs)) if i not in excluded], np.int64)
            if not len(candidates):
                raise ValueError(f"no HellaSwag validation items are left outside the report's "
                                 f"subsets {list(hellaswag_exclude)} (a limit of None scores "
                                 f"all of them): lower report.csr_limit or select.csr_exclude")
        else:
            source, docs = load_arc_split(eval_dir, task, "Dev")
            candidates = np.arange(len(docs))
        keep = candidates[tasks_lib.subset_indices(len(candidates), per_task, seed)]
        out[task] = HeldOutItems(task=task, source=source,
                                 indices=tuple(int(i) for i in keep),
                                 docs=tuple(docs[int(i)] for i in keep))
    return out


class CsrProbe:
    """Batched ``acc_norm`` (lm-eval semantics, as the report) of multiple-choice docs.

    Every choice of every doc is one request ``encode_pair(context, continuation)``
    (:func:`lattn_jax.eval.scoring.encode_pair`); all requests are packed once
    (:func:`prepare_continuations`) and each evaluation runs them through a
    :data:`TargetScorer`. Per task ``acc_norm = mean_doc [argmax_i ll_i / len(choice_i) ==
    gold]`` (:func:`lattn_jax.eval.tasks.process_results`, ``len`` in characters), and the
    probe's CSR is the mean over tasks (spec §3.2 item 3: ``C_l`` = mean of the task
    ``acc_norm``).

    Args:
      docs: ``{task: docs}`` (task names select lm-eval's metric set; non-empty).
      tokenizer: with ``encode`` and ``eos_id``.
      batch_size, bucket, max_len: as for :func:`prepare_continuations`.

    Raises:
      ValueError: no docs, or a continuation that encodes to nothing.
    """

    def __init__(self, docs: Mapping[str, Sequence[tasks_lib.Doc]], tokenizer, *,
                 batch_size: int = 64, bucket: int = 64, max_len: int = 1024):
        if not docs or not all(len(d) for d in docs.values()):
            raise ValueError("the CSR probe needs at least one doc per task")
        self.docs = {name: list(d) for name, d in docs.items()}
        requests, self._spans = [], {}
        for name, task_docs in self.docs.items():
            start = len(requests)
            for doc in task_docs:
                requests += [scoring.encode_pair(tokenizer, c, x) for c, x in doc.requests]
            self._spans[name] = (start, len(requests))
        self.prepared = prepare_continuations(requests, batch_size=batch_size, bucket=bucket,
                                              max_len=max_len)

    @property
    def num_items(self) -> Dict[str, int]:
        return {name: len(d) for name, d in self.docs.items()}

    def evaluate(self, scorer: TargetScorer) -> Dict[str, Any]:
        """``{"csr": mean_task acc_norm, "per_task": {task: acc_norm}, "per_doc": {task:
        [0 or 1 per doc, acc_norm]}}`` (the per-doc values feed
        :func:`bootstrap_selection`)."""
        results = continuation_loglikelihoods(scorer, self.prepared)
        per_task, per_doc_correct = {}, {}
        for name, task_docs in self.docs.items():
            start, _ = self._spans[name]
            per_doc, k = [], start
            for doc in task_docs:
                per_doc.append(results[k:k + len(doc.requests)])
                k += len(doc.requests)
            metrics = tasks_lib.process_results(name, task_docs, per_doc)
            per_task[name] = float(metrics["acc_norm"])
            _, norm = tasks_lib.doc_accuracies(task_docs, per_doc)
            per_doc_correct[name] = [int(x) for x in norm]
        return {"csr": float(np.mean(list(per_task.values()))), "per_task": per_task,
                "per_doc": per_doc_correct}


# Needle-in-a-haystack recall, teacher-forced -------------------------------------------------

@dataclasses.dataclass(frozen=True)
class RecallPrompt:
    """One teacher-forced recall prompt: the context, then the gold answer tokens.

    Attributes:
      task, length, depth: the RULER task, target length (tokens) and needle depth (percent).
      value: the needle value (the gold answer).
      context_ids: the prompt's ids (it ends with RULER's answer prefix "... is").
      answer_ids: the ids of ``" " + value`` after the context (lm-eval's split,
        :func:`lattn_jax.eval.scoring.encode_pair`).
    """

    task: str
    length: int
    depth: float
    value: str
    context_ids: Tuple[int, ...]
    answer_ids: Tuple[int, ...]

    @property
    def cell(self) -> str:
        return f"{self.task}@{self.length}"


def niah_recall_prompts(tokenizer, *, tasks: Sequence[str], lengths: Sequence[int],
                        depths: Sequence[float], count: int, seed: int,
                        essays_dir: Optional[str] = None,
                        answer_room: int = 16) -> List[RecallPrompt]:
    """RULER NIAH prompts (:func:`lattn_jax.eval.niah.make_sample`) as teacher-forced items.

    For each task and length, ``count`` prompts with depths ``depths[i % len(depths)]``; keys
    and values from one ``random.Random(seed)`` drawn in (task, length, prompt) order. Each
    prompt is the largest haystack with ``prompt + answer_room`` tokens within ``length``.

    Args:
      tokenizer: the teacher's (``encode``, ``eos_id``).
      tasks: names from :data:`lattn_jax.eval.niah.ALL_TASKS` (all but ``niah_single_1`` need
        ``essays_dir``).
      lengths: target lengths in tokens; depths: needle depths in percent.
      count: prompts per (task, length).
      seed: key/value seed (use another than the report's ``niah_seed``: other prompts).
      essays_dir: the Paul Graham essays (``<data_dir>/niah/PaulGrahamEssays``).
      answer_room: tokens left for the answer (>= the answer's tokens).

    Returns:
      ``len(tasks) * len(lengths) * count`` prompts.

    Raises:
      ValueError: an unknown task, empty ``depths``, ``count < 1``, a length too short for the
        prompt, or an answer longer than ``answer_room`` tokens.
      FileNotFoundError: no essays in ``essays_dir`` (or it is ``None``) for an essay task.
    """
    bad = [t for t in tasks if t not in niah_lib.ALL_TASKS]
    if bad:
        raise ValueError(f"select.recall_tasks: unknown NIAH task(s) {bad}; choose from "
                         f"{', '.join(niah_lib.ALL_TASKS)}")
    if not depths or count < 1:
        raise ValueError(f"select.recall_depths must be non-empty and select.recall_prompts "
                         f">= 1, got {depths=} {count=}")
    essays = None
    if any(t != "niah_single_1" for t in tasks):
        if essays_dir is None:
            raise FileNotFoundError("select.recall_tasks needs the essay haystack: no "
                                    "essays_dir (<data_dir>/niah/PaulGrahamEssays)")
        essays = niah_lib.load_essays(essays_dir)
    rng = random.Random(seed)
    out = []
    for task in tasks:
        for length in lengths:
            units = None
            for i in range(count):
                sample = niah_lib.make_sample(task, tokenizer, int(length),
                                              float(depths[i % len(depths)]), rng, essays,
                                              max_new_tokens=answer_room, start_units=units)
                units = sample.haystack_units
                ctx, cont = scoring.encode_pair(tokenizer, sample.prompt, " " + sample.value)
                if len(cont) > answer_room:
                    raise ValueError(f"select.recall_answer_room={answer_room} is below the "
                                     f"{len(cont)} tokens of the answer {sample.value!r}")
                out.append(RecallPrompt(task=task, length=int(length), depth=sample.depth,
                                        value=sample.value, context_ids=tuple(ctx),
                                        answer_ids=tuple(cont)))
    return out


class RecallProbe:
    """Teacher-forced recall of the gold answer: continuous and discrete, batched.

    For prompt ``i`` with answer tokens ``a_1 .. a_n`` after context ``c``:

    * ``recall_i = (1/n) sum_j p(a_j | c, a_<j)`` (mean per-token probability, fp32 softmax,
      fp64 means); the probe's recall is ``mean_i recall_i`` in ``[0, 1]``;
    * ``correct_i = [a_j == argmax p(. | c, a_<j) for every j]``; the accuracy is
      ``mean_i correct_i``.

    The continuous recall is what the HALO score uses in this port (lm-eval's ``contains`` is
    discrete: on easy prompts every replacement scores 1.0 and the scores tie at 0). All
    prompts are packed once into right-padded batches of ``batch_size`` rows, lengths rounded
    up to ``bucket`` (e.g. two shapes for lengths 2048 and 4096), and only the answer positions
    reach the LM head.

    Args:
      prompts: from :func:`niah_recall_prompts` (or hand-made, non-empty ids).
      batch_size: rows per forward pass; bucket: length multiple.

    Raises:
      ValueError: no prompts.
    """

    def __init__(self, prompts: Sequence[RecallPrompt], *, batch_size: int = 8,
                 bucket: int = 64):
        if not prompts:
            raise ValueError("the recall probe needs at least one prompt")
        self.prompts = list(prompts)
        # No truncation; batches of target-length rows pad to that length (e.g. 2048, 4096).
        max_len = max([len(p.context_ids) + len(p.answer_ids) - 1 for p in self.prompts]
                      + [p.length for p in self.prompts])
        self.prepared = prepare_continuations(
            [(p.context_ids, p.answer_ids) for p in self.prompts], batch_size=batch_size,
            bucket=bucket, max_len=max(max_len, 1))

    @property
    def num_items(self) -> Dict[str, int]:
        out: Dict[str, int] = {}
        for p in self.prompts:
            out[p.cell] = out.get(p.cell, 0) + 1
        return out

    def evaluate(self, scorer: TargetScorer) -> Dict[str, Any]:
        """``{"recall", "accuracy", "recall_by_cell", "accuracy_by_cell", "per_prompt"}``
        (cells ``"{task}@{length}"``; ``per_prompt``: each prompt's ``recall_i``, in the
        prompts' order, for :func:`bootstrap_selection`), floats in ``[0, 1]``."""
        scores = score_continuations(scorer, self.prepared)
        probs = np.array([np.exp(lp.astype(np.float64)).mean() for lp, _ in scores])
        correct = np.array([float(g.all()) for _, g in scores])
        cells = [p.cell for p in self.prompts]
        by_cell = {c: [i for i, x in enumerate(cells) if x == c] for c in dict.fromkeys(cells)}
        return {"recall": float(probs.mean()), "accuracy": float(correct.mean()),
                "recall_by_cell": {c: float(probs[ix].mean()) for c, ix in by_cell.items()},
                "accuracy_by_cell": {c: float(correct[ix].mean()) for c, ix in by_cell.items()},
                "per_prompt": probs.tolist()}


def cut_tie(scores: Sequence[float], k: int) -> Dict[str, Any]:
    """Whether equal scores at the selection cut decide which layers are kept.

    The kept layers are the first ``k`` of :func:`rank_layers`; if the ``k``-th and the
    ``(k+1)``-th ranked scores are equal, the choice among the layers with that score is made
    by ``argsort``'s order (index), not by the scores.

    Returns:
      ``{"tie": bool, "cut_scores": [s_k, s_k+1] or None, "tied_layers": layers whose score
      equals s_k (sorted), "notice": str or None}``.
    """
    s = np.asarray(scores, np.float64)
    ranking = rank_layers(s)
    if not 0 < k < len(s):
        return {"tie": False, "cut_scores": None, "tied_layers": [], "notice": None}
    a, b = float(s[ranking[k - 1]]), float(s[ranking[k]])
    tied = sorted(int(i) for i in np.flatnonzero(s == a))
    tie = a == b
    notice = None
    if tie:
        kept = [i for i in ranking[:k] if i in tied]
        notice = (f"tie at the selection cut: layers {tied} all score {a:g}; rank {k} and "
                  f"{k + 1} are equal, so the kept ones ({sorted(kept)}) are chosen by index "
                  f"order, not by the score")
    return {"tie": tie, "cut_scores": [a, b], "tied_layers": tied, "notice": notice}


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


# Evaluation items: the strict reader (a bad line names the file and the line), shared with
# the zero-shot tasks. The sweep's own results (appended as layers finish): records.read_records,
# which drops a last line cut short by a killed process, so that the sweep resumes.
read_jsonl = tasks_lib.read_jsonl


class Interrupted(Exception):
    """The sweep stopped before its last layer (``should_stop``); run it again to resume."""


def sweep_records(layers: Sequence[int],
                  evaluate_layer: Callable[[int], Union[Tuple[float, float], Mapping[str, Any]]],
                  results_path: Optional[str] = None,
                  print_fn: Callable[[str], None] = print,
                  should_stop: Optional[Callable[[], bool]] = None,
                  probe: Optional[str] = None) -> Dict[int, Dict[str, Any]]:
    """Evaluates ``layers`` one at a time, resuming from ``results_path``.

    Args:
      layers: the replaced layers to evaluate in order (``-1``: the teacher itself).
      evaluate_layer: ``l -> (csr, recall)`` or ``l -> {"csr", "recall", ...extras}`` for the
        model with only layer ``l`` replaced (extras must be JSON-serialisable).
      results_path: a JSONL file; each finished layer appends ``{"layer", "csr", "recall",
        ...extras, "probe"}`` and layers already in it (with the same ``probe``) are not
        re-evaluated. A last line cut short (the process killed mid-record) is dropped with a
        warning, and its layer evaluated again (:func:`lattn_jax.records.read_records`).
      print_fn: progress lines.
      should_stop: asked before each layer still to evaluate; ``True`` stops the sweep.
      probe: a fingerprint of the evaluation settings; records written under another one (or
        none, when this one is set) are ignored, so a changed probe never mixes with old
        numbers. ``None``: every record counts (and none is written with a fingerprint).

    Returns:
      ``{layer: record}`` for every layer in ``layers``.

    Raises:
      Interrupted: ``should_stop`` returned ``True`` (finished layers are in ``results_path``).
      lattn_jax.records.RecordsError: a bad line in ``results_path`` other than a cut-short
        last line (a ``ValueError`` naming the file and the line).
    """
    done: Dict[int, Dict[str, Any]] = {}
    if results_path and os.path.exists(results_path):
        stale = 0
        for rec in records.read_records(results_path):
            if probe is not None and rec.get("probe") != probe:
                stale += 1
                continue
            done[int(rec["layer"])] = dict(rec)
        if stale:
            print_fn(f"{results_path}: ignoring {stale} record(s) of other probe settings")
    for layer in layers:
        if layer in done:
            continue
        if should_stop is not None and should_stop():
            raise Interrupted(f"stopped before layer {layer} ({len(done)} of {len(layers)} "
                              f"evaluated)")
        out = evaluate_layer(layer)
        rec = dict(out) if isinstance(out, Mapping) else {"csr": out[0], "recall": out[1]}
        rec = dict(layer=int(layer), **{k: v for k, v in rec.items() if k != "layer"})
        rec["csr"], rec["recall"] = float(rec["csr"]), float(rec["recall"])
        if probe is not None:
            rec["probe"] = probe
        done[layer] = rec
        name = "teacher" if layer < 0 else f"layer {layer:3d}"
        print_fn(f"{name}: csr {rec['csr']:.4f}  recall {rec['recall']:.4f}")
        if results_path:
            records.append_record(results_path, rec)
    return {layer: done[layer] for layer in layers}


def sweep(num_layers: int, evaluate_layer: Callable[[int], Tuple[float, float]],
          results_path: Optional[str] = None,
          print_fn: Callable[[str], None] = print,
          should_stop: Optional[Callable[[], bool]] = None) -> Tuple[np.ndarray, np.ndarray]:
    """Runs the single-replacement sweep over layers ``0 .. L-1`` (:func:`sweep_records`).

    Args:
      num_layers: ``L``.
      evaluate_layer: ``l -> (csr, recall)`` of the model with only layer ``l`` replaced.
      results_path: a JSONL file; each finished layer appends ``{"layer", "csr", "recall"}`` and
        layers already in it are not re-evaluated.
      print_fn: progress lines.
      should_stop: asked before each layer still to evaluate; ``True`` stops the sweep.

    Returns:
      ``(csr [L], recall [L])`` float64.

    Raises:
      Interrupted: ``should_stop`` returned ``True`` (finished layers are in ``results_path``).
    """
    recs = sweep_records(range(num_layers), evaluate_layer, results_path, print_fn,
                         should_stop)
    csr = np.array([recs[i]["csr"] for i in range(num_layers)])
    recall = np.array([recs[i]["recall"] for i in range(num_layers)])
    return csr, recall
