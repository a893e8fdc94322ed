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
import json
import os
import random
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lattn_jax import config as config_lib
from lattn_jax import model as model_lib
from lattn_jax import train as train_lib
from lattn_jax.eval import generate as gen_lib
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
                 return_state: bool = False, last_logits_only: bool = False):
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

        Returns:
          fp32 logits ``[B, T, S]`` (``[B, 1, S]``), or ``(logits, new_states)``.

        Raises:
          ValueError: if ``state`` does not have one entry per layer.
        """
        del route
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


class Interrupted(Exception):
    """The sweep stopped before its last layer (``should_stop``); run it again to resume."""


def sweep(num_layers: int, evaluate_layer: Callable[[int], Tuple[float, float]],
          results_path: Optional[str] = None,
          print_fn: Callable[[str], None] = print,
          should_stop: Optional[Callable[[], bool]] = None) -> Tuple[np.ndarray, np.ndarray]:
    """Runs the single-replacement sweep, one layer at a time, resuming from ``results_path``.

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
    done: Dict[int, Tuple[float, float]] = {}
    if results_path and os.path.exists(results_path):
        for rec in read_jsonl(results_path):
            done[int(rec["layer"])] = (float(rec["csr"]), float(rec["recall"]))
    for layer in range(num_layers):
        if layer in done:
            continue
        if should_stop is not None and should_stop():
            raise Interrupted(f"stopped before layer {layer} of {num_layers}")
        c, r = evaluate_layer(layer)
        done[layer] = (c, r)
        print_fn(f"layer {layer:3d}: csr {c:.4f}  recall {r:.4f}")
        if results_path:
            with open(results_path, "a") as f:
                f.write(json.dumps({"layer": layer, "csr": c, "recall": r}) + "\n")
    csr = np.array([done[i][0] for i in range(num_layers)])
    recall = np.array([done[i][1] for i in range(num_layers)])
    return csr, recall
