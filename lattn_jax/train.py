"""Training and evaluation loop: ``train_and_evaluate(config, workdir)``.

Stages, in order:

1. data: tokenizer, grain training iterator and validation batches (``lattn_jax.data``);
2. model and optimizer: the NNX model is split into a static graph and a pytree of parameters;
   the train state is the pytree ``{"params", "opt_state", "step"}``;
3. checkpoint order: resume from the newest checkpoint in ``<workdir>/checkpoints`` if there is
   one (restoring the data iterator too), else start from scratch;
4. the loop: a jit-compiled train step (token-mean cross-entropy, clipped AdamW), periodic
   validation, metrics to stdout and ``<workdir>/metrics.jsonl``, a tqdm bar with tokens/s,
   periodic checkpoints, and a final evaluation and checkpoint.
"""

import dataclasses
import json
import math
import os
import time
from typing import Any, Callable, Dict, Iterable

import jax
import jax.numpy as jnp
import numpy as np
import optax
import tqdm
from flax import nnx

from lattn_jax import checkpoint as checkpoint_lib
from lattn_jax import config as config_lib
from lattn_jax import model as model_lib
from lattn_jax import optim
from lattn_jax import data as data_lib
from lattn_jax.typing import PyTree

Batch = Dict[str, Any]


def cross_entropy_loss(logits: jax.Array, targets: jax.Array, weights: jax.Array):
    """Token-weighted mean next-token cross-entropy in nats.

    Args:
      logits: fp32 ``[B, T, S]``.
      targets: int ``[B, T]``.
      weights: fp32 ``[B, T]`` (0 masks a position).

    Returns:
      ``(mean_loss, sum_loss, sum_weights)`` fp32 scalars.
    """
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)  # [B, T]
    total = jnp.sum(ce * weights)
    count = jnp.sum(weights)
    return total / jnp.maximum(count, 1.0), total, count


class Trainer:
    """Owns the model graph, optimizer and the jitted step functions for one configuration.

    Args:
      config: a validated :class:`~lattn_jax.config.ExperimentConfig`.
    """

    def __init__(self, config: config_lib.ExperimentConfig):
        self.config = config
        self.tx = optim.make_optimizer(config.optim, config.train.total_steps)
        self.schedule = optim.learning_rate_schedule(config.optim, config.train.total_steps)
        abstract_model = nnx.eval_shape(
            lambda: model_lib.LanguageModel(config.model, rngs=nnx.Rngs(0)))
        self.graphdef, abstract_params = nnx.split(abstract_model, nnx.Param)
        self._abstract_params = abstract_params
        self.train_step = jax.jit(self._train_step, donate_argnums=(0,))
        self.eval_step = jax.jit(self._eval_step)

    # -- state ---------------------------------------------------------------------------------
    def init_state(self, seed: int) -> PyTree:
        """Fresh parameters (from ``seed``), optimizer state and ``step = 0``."""
        def init():
            model = model_lib.LanguageModel(self.config.model, rngs=nnx.Rngs(seed))
            params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
            return {"params": params, "opt_state": self.tx.init(params),
                    "step": jnp.zeros((), jnp.int32)}
        return jax.jit(init)()

    def abstract_state(self) -> PyTree:
        """The state's structure as ``jax.ShapeDtypeStruct`` leaves (for restoring)."""
        return jax.eval_shape(lambda: self.init_state(0))

    def model(self, params: PyTree) -> model_lib.LanguageModel:
        """Rebuilds the NNX model from a pure-dict parameter tree."""
        state = jax.tree_util.tree_map(lambda x: x, self._abstract_params)
        nnx.replace_by_pure_dict(state, params)
        return nnx.merge(self.graphdef, state)

    # -- steps ---------------------------------------------------------------------------------
    def loss(self, params: PyTree, batch: Batch):
        model = self.model(params)
        logits = model(batch["inputs"], segment_ids=batch.get("segment_ids"))
        return cross_entropy_loss(logits, batch["targets"], batch["weights"])

    def _train_step(self, state: PyTree, batch: Batch):
        def loss_fn(params):
            mean, _, _ = self.loss(params, batch)
            return mean
        loss, grads = jax.value_and_grad(loss_fn)(state["params"])
        updates, opt_state = self.tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        metrics = {"loss": loss, "grad_norm": optax.global_norm(grads),
                   "lr": self.schedule(state["step"])}
        return {"params": params, "opt_state": opt_state, "step": state["step"] + 1}, metrics

    def _eval_step(self, params: PyTree, batch: Batch):
        _, total, count = self.loss(params, batch)
        return total, count

    def evaluate(self, params: PyTree, batches: Iterable[Batch]) -> float:
        """Token-mean validation loss (nats) over ``batches``; ``nan`` if there are none."""
        total, count = 0.0, 0.0
        for batch in batches:
            t, c = self.eval_step(params, batch)
            total += float(t)
            count += float(c)
        return total / count if count else float("nan")


def _to_jax(batch: Batch) -> Batch:
    return {k: jnp.asarray(v) for k, v in batch.items()}


class MetricsWriter:
    """Appends one JSON object per line to ``<workdir>/metrics.jsonl`` and logs it."""

    def __init__(self, workdir: str):
        self.path = os.path.join(workdir, "metrics.jsonl")

    def write(self, step: int, **metrics: float) -> None:
        record = {"step": int(step), "time": time.time(),
                  **{k: float(v) for k, v in metrics.items()}}
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")


# Data options that may change between a run and its resumption: they do not move the
# iterator's windows. Every other data option changes which batch comes next.
_RESUMABLE_DATA_OPTIONS = ("max_val_batches",)


def _check_resume_compatible(workdir: str, config: config_lib.ExperimentConfig,
                             has_checkpoint: bool) -> None:
    """Refuses to resume a checkpoint written with a different model or data stream.

    The model options must match for the parameters to load, and the data options for the
    restored iterator position to mean the same batches. ``config.json`` is (re)written only
    when there is no checkpoint yet or the check passes.

    Raises:
      ConfigError: naming every option that differs from the saved run.
    """
    path = os.path.join(workdir, "config.json")
    current = json.loads(json.dumps(dataclasses.asdict(config), default=str))
    if has_checkpoint and os.path.exists(path):
        with open(path) as f:
            saved = json.load(f)
        diffs = _diff(saved.get("model", {}), current["model"], "model.")
        saved_data = {k: v for k, v in saved.get("data", {}).items()
                      if k not in _RESUMABLE_DATA_OPTIONS}
        current_data = {k: v for k, v in current["data"].items()
                        if k not in _RESUMABLE_DATA_OPTIONS}
        diffs += _diff(saved_data, current_data, "data.")
        if diffs:
            raise config_lib.ConfigError(
                f"workdir {workdir} holds a checkpoint of a different run; options that "
                f"differ: {', '.join(diffs)}. Use a new --workdir or the saved settings.")
    with open(path, "w") as f:
        json.dump(current, f, indent=2)


def _diff(a, b, prefix):
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += _diff(a.get(k), b.get(k), f"{prefix}{k}.")
        return out
    return [] if a == b else [f"{prefix.rstrip('.')} ({a!r} -> {b!r})"]


def train_and_evaluate(config: config_lib.ExperimentConfig, workdir: str,
                       *, print_fn: Callable[[str], None] = tqdm.tqdm.write) -> Dict[str, float]:
    """Trains ``config`` in ``workdir``, resuming from its newest checkpoint if there is one.

    Args:
      config: a validated :class:`~lattn_jax.config.ExperimentConfig`.
      workdir: directory for checkpoints, ``metrics.jsonl`` and ``config.json``.
      print_fn: where the human-readable progress lines go (default: above the progress bar).

    Returns:
      Final metrics: ``train_loss`` (mean of the last logging window), ``val_loss``,
      ``unigram_entropy``, ``step`` and ``resumed_from`` (-1 for a fresh start).

    Raises:
      FileNotFoundError: a data or tokenizer file named in ``config.data`` is missing.
      ValueError: invalid or inconsistent options, named by their dotted path.
    """
    os.makedirs(workdir, exist_ok=True)
    tcfg = config.train

    # -- data --------------------------------------------------------------------------------
    try:
        datasets = data_lib.build_datasets(config.data)
    except ValueError as e:  # bad corpus contents: too few documents, undecodable text, ...
        raise config_lib.ConfigError(f"data: {e}") from e
    tokenizer = datasets.tokenizer
    if config.model.vocab_size < tokenizer.vocab_size:
        raise config_lib.ConfigError(
            f"model.vocab_size={config.model.vocab_size} is smaller than the tokenizer's "
            f"vocabulary ({tokenizer.name}: {tokenizer.vocab_size})")
    stats = datasets.stats
    print_fn(f"data: {stats.train_documents} train / {stats.val_documents} validation documents, "
             f"{stats.train_tokens:,} / {stats.val_tokens:,} tokens ({tokenizer.name}); "
             f"unigram entropy of the training tokens {stats.unigram_entropy:.3f} nats/token, "
             f"unigram cross-entropy of the validation tokens {stats.val_unigram_xent:.3f}")

    # -- model, optimizer, checkpoint order ------------------------------------------------------
    ckpt = checkpoint_lib.Checkpointer(workdir, keep=tcfg.keep_checkpoints)
    latest = ckpt.latest_step()
    _check_resume_compatible(workdir, config, has_checkpoint=latest is not None)
    trainer = Trainer(config)
    train_iter = datasets.train_iter
    if latest is not None:
        state = ckpt.restore(latest, trainer.abstract_state(), train_iter)
        print_fn(f"Resuming from the checkpoint at step {latest} in {ckpt.directory} "
                 f"(data iterator restored)")
        resumed_from = latest
    else:
        state = trainer.init_state(tcfg.seed)
        print_fn(f"No checkpoint in {ckpt.directory}: starting from scratch")
        resumed_from = -1
    n_params = sum(x.size for x in jax.tree_util.tree_leaves(state["params"]))
    print_fn(f"model: {n_params:,} parameters, layers {list(config.model.layer_pattern)}, "
             f"d_model {config.model.d_model}, backend {jax.default_backend()}")

    metrics_writer = MetricsWriter(workdir)
    step = int(state["step"])
    tokens_per_step = config.data.batch_size * config.data.seq_len
    window_losses = []
    last_train_loss = float("nan")
    val_loss = float("nan")

    def run_eval(step):
        loss = trainer.evaluate(state["params"], (_to_jax(b) for b in datasets.val_batches))
        metrics_writer.write(step, val_loss=loss)
        return loss

    bar = tqdm.tqdm(total=tcfg.total_steps, initial=step, unit="step", dynamic_ncols=True,
                    disable=None)
    t_last = time.perf_counter()
    steps_since = 0
    last_saved = resumed_from
    stop_at = tcfg.total_steps
    if tcfg.max_steps_per_run is not None:
        stop_at = min(stop_at, step + tcfg.max_steps_per_run)
    while step < stop_at:
        batch = _to_jax(next(train_iter))
        state, metrics = trainer.train_step(state, batch)
        step += 1
        steps_since += 1
        window_losses.append(metrics["loss"])
        if step % tcfg.log_every == 0 or step == stop_at:
            loss = float(np.mean(jax.device_get(window_losses)))
            now = time.perf_counter()
            tok_s = steps_since * tokens_per_step / max(now - t_last, 1e-9)
            t_last, steps_since = now, 0
            last_train_loss = loss
            window_losses = []
            bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tok_s:,.0f}")
            metrics_writer.write(step, train_loss=loss, grad_norm=metrics["grad_norm"],
                                 lr=metrics["lr"], tokens_per_sec=tok_s)
            print_fn(f"step {step:5d}  train_loss {loss:.4f}  lr {float(metrics['lr']):.2e}  "
                     f"grad_norm {float(metrics['grad_norm']):.3f}  {tok_s:,.0f} tok/s")
        bar.update(1)
        if step % tcfg.eval_every == 0 and step != tcfg.total_steps:
            val_loss = run_eval(step)
            print_fn(f"step {step:5d}  val_loss {val_loss:.4f}")
        if step % tcfg.checkpoint_every == 0 and step != tcfg.total_steps:
            ckpt.save(step, state, train_iter)
            last_saved = step
    bar.close()

    if step < tcfg.total_steps:
        if last_saved != step:
            ckpt.save(step, state, train_iter)
        ckpt.close()
        print_fn(f"Stopping at step {step} of {tcfg.total_steps} (train.max_steps_per_run="
                 f"{tcfg.max_steps_per_run}); checkpoint saved, run again to resume.")
        return {"train_loss": last_train_loss, "val_loss": val_loss,
                "unigram_entropy": stats.unigram_entropy, "step": step,
                "resumed_from": resumed_from}
    if resumed_from >= tcfg.total_steps:
        print_fn(f"Training was already complete at step {step} (train.total_steps="
                 f"{tcfg.total_steps}); evaluating the restored model. Raise "
                 f"--config.train.total_steps to continue training.")
    val_loss = run_eval(step)
    if last_saved != step:
        ckpt.save(step, state, train_iter)
    ckpt.close()
    train_text = "n/a (no steps run)" if math.isnan(last_train_loss) else f"{last_train_loss:.4f}"
    print_fn(f"final: step {step}  train_loss {train_text}  val_loss {val_loss:.4f} "
             f"nats/token (perplexity {math.exp(min(val_loss, 50)):.1f})")
    print_fn(f"baselines: unigram entropy of the training tokens {stats.unigram_entropy:.4f} "
             f"(val_loss - entropy = {val_loss - stats.unigram_entropy:+.3f} nats); unigram "
             f"cross-entropy of the validation tokens {stats.val_unigram_xent:.4f} "
             f"(val_loss - cross-entropy = {val_loss - stats.val_unigram_xent:+.3f} nats)")
    print_fn(f"checkpoint: {ckpt.directory}/{step}")
    return {"train_loss": last_train_loss, "val_loss": val_loss,
            "unigram_entropy": stats.unigram_entropy, "step": step,
            "resumed_from": resumed_from}
