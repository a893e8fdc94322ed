"""Training and evaluation loop: ``train_and_evaluate(config, workdir)``.

Stages, in order:

1. data: tokenizer, grain training iterator and validation batches (``lattn_jax.data``);
2. mesh, model and optimizer: the ``("data", "fsdp", "tensor")`` mesh from ``config.mesh`` (none
   on one device); the NNX model is split into a static graph and a pytree of parameters; the
   train state is the pytree ``{"params", "opt_state", "step"}``, created sharded;
3. checkpoint order: resume from the newest readable checkpoint in ``<workdir>/checkpoints``
   (or ``step``) if there is one (restoring the data iterator too, onto the current mesh; an
   unreadable newer one is reported in one line and renamed, never deleted), else start from
   scratch;
4. the loop: a jit-compiled train step (token-mean cross-entropy, clipped AdamW or Muon, a
   NaN/inf guard), periodic validation, metrics (loss, LR, gradient norm, tokens/s, step time,
   MFU) to stdout, ``<workdir>/metrics.jsonl``, ``loss.png`` and TensorBoard, a tqdm bar, async
   checkpoints (the newest N and the best), a checkpoint on SIGTERM (preemption), SIGHUP (a
   closed terminal or ssh session; left ignored under ``nohup``) or Ctrl-C (SIGINT; a second
   Ctrl-C stops at once, or, while a checkpoint is being written, once it is complete; so does
   a SIGTERM or SIGHUP during the stop's own or the final save), and a final evaluation and
   checkpoint. Running out of device memory, in the
   first step or a later one, ends the run with one line naming the options to lower, the step
   that ran out (and, after the first step or in a resumed run, the intact checkpoint the same
   command resumes from).
"""

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import (Any, Callable, Dict, Iterable, List, Mapping, NamedTuple, Optional,
                    Sequence, Tuple)

import jax
import jax.numpy as jnp
import numpy as np
import optax
import tqdm
from flax import nnx
from jax.sharding import NamedSharding

from lattn_jax import assets
from lattn_jax import checkpoint as checkpoint_lib
from lattn_jax import config as config_lib
from lattn_jax import context_parallel
from lattn_jax import data as data_lib
from lattn_jax.data import config as data_config_lib
from lattn_jax.data import pipeline as pipeline_lib
from lattn_jax.data import shards as shards_lib
from lattn_jax.data import sources as sources_lib
from lattn_jax import flops as flops_lib
from lattn_jax.halo import losses as halo_losses
from lattn_jax import model as model_lib
from lattn_jax import optim
from lattn_jax import records as records_lib
from lattn_jax import sharding
from lattn_jax.typing import PyTree

Batch = Dict[str, Any]


def cross_entropy_loss(logits: jax.Array, targets: jax.Array, weights: jax.Array):
    """Token-weighted mean next-token cross-entropy in nats.

    Args:
      logits: fp32 ``[B, T, S]``.
      targets: int ``[B, T]``.
      weights: fp32 ``[B, T]`` (0 masks a position).

    Returns:
      ``(mean_loss, sum_loss, sum_weights)`` fp32 scalars. A position of weight 0 adds
      nothing to ``sum_loss``, also where its loss is NaN or inf (the all-zero padding rows of a
      last validation batch; a plain ``sum(ce * weights)`` would turn ``0 x NaN`` into a NaN
      validation loss).
    """
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)  # [B, T]
    total = halo_losses.weighted_sum(ce, weights)
    count = jnp.sum(weights)
    return total / jnp.maximum(count, 1.0), total, count


class WorkdirWriteError(RuntimeError):
    """A run record (``metrics.jsonl``, ``console.log``, ``loss.png``, ...) could not be written
    into the workdir during training (a full disk, no permission, an I/O error); the message
    names the file, the reason and the checkpoint the same command resumes from."""


def _is_workdir_write_error(error: BaseException, workdir: str) -> bool:
    """Whether ``error`` is an ``OSError`` about a file in ``workdir`` (a failed write)."""
    if not isinstance(error, OSError) or not error.filename or not error.strerror:
        return False
    path = os.path.abspath(os.fsdecode(error.filename))
    return path.startswith(os.path.join(os.path.abspath(workdir), ""))


class NonFiniteError(RuntimeError):
    """A step's loss or gradient norm was NaN/inf under ``train.nonfinite_policy="stop"``."""


class Trainer:
    """Owns the model graph, optimizer and the jitted step functions for one configuration.

    On a mesh (STYLE item 24) the train state is created sharded: its shapes come from
    ``jax.eval_shape`` of the init function, its shardings from the parameters' logical axis
    names and the rules table (:func:`lattn_jax.sharding.state_shardings`), and a jitted init
    with those ``out_shardings`` materialises each shard on its device. Batches are split over
    ``("data", "fsdp")``; every trace runs under :func:`lattn_jax.sharding.activate`, which
    turns on the activation constraints and the mixers' ``shard_map``.

    Mixed precision: the model computes in ``model.dtype`` (e.g. bfloat16) and keeps its
    parameters, hence gradients and optimizer state, in ``model.param_dtype`` (float32 master
    weights by default); logits and the loss are fp32.

    Args:
      config: a validated :class:`~lattn_jax.config.ExperimentConfig`.
      mesh: the device mesh, or ``None`` for the plain single-device path.
    """

    def __init__(self, config: config_lib.ExperimentConfig,
                 mesh: Optional[jax.sharding.Mesh] = None):
        self.config = config
        self.mesh = mesh
        self.rules = config.mesh.rules
        self.accum_steps = accumulation_steps(config, mesh)
        self.tx = optim.make_optimizer(config.optim, config.train.total_steps)
        self.schedule = optim.learning_rate_schedule(config.optim, config.train.total_steps)
        abstract_model = nnx.eval_shape(
            lambda: model_lib.LanguageModel(config.model, rngs=nnx.Rngs(0)))
        self.graphdef, abstract_params = nnx.split(abstract_model, nnx.Param)
        self._abstract_params = abstract_params
        self._abstract_state = jax.eval_shape(self._init_fn, 0)
        if mesh is None:
            device = jax.local_devices()[0]
            self.state_shardings = jax.tree_util.tree_map(
                lambda _: jax.sharding.SingleDeviceSharding(device), self._abstract_state)
            self._train_step_jit = jax.jit(self._train_step, donate_argnums=(0,))
            self._init_jit = jax.jit(self._init_fn)
        else:
            self.state_shardings = sharding.state_shardings(self._abstract_state, mesh,
                                                            self.rules)
            optim.check_flatten_sharding(config.optim, self.state_shardings["params"])
            self._train_step_jit = jax.jit(self._train_step, donate_argnums=(0,),
                                           out_shardings=(self.state_shardings, None))
            self._init_jit = jax.jit(self._init_fn, out_shardings=self.state_shardings)
        self._eval_step_jit = jax.jit(self._eval_step)

    # -- state ---------------------------------------------------------------------------------
    def _init_fn(self, seed):
        # nnx.Rngs(int) is nnx.Rngs(jax.random.key(int)); the key form also takes a traced seed.
        model = model_lib.LanguageModel(self.config.model,
                                        rngs=nnx.Rngs(jax.random.key(seed)))
        params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
        return {"params": params, "opt_state": self.tx.init(params),
                "step": jnp.zeros((), jnp.int32)}

    def init_state(self, seed: int) -> PyTree:
        """Fresh parameters (from ``seed``), optimizer state and ``step = 0``, sharded."""
        with sharding.activate(self.mesh, self.rules):
            return self._init_jit(seed)

    def abstract_state(self) -> PyTree:
        """The state as ``jax.ShapeDtypeStruct`` leaves carrying this trainer's shardings (the
        restore target: a checkpoint from any mesh lands on this one)."""
        return jax.tree_util.tree_map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
            self._abstract_state, self.state_shardings)

    def model(self, params: PyTree) -> model_lib.LanguageModel:
        """Rebuilds the NNX model from a pure-dict parameter tree."""
        state = jax.tree_util.tree_map(lambda x: x, self._abstract_params)
        nnx.replace_by_pure_dict(state, params)
        return nnx.merge(self.graphdef, state)

    def put_batch(self, batch: Batch) -> Batch:
        """This process's rows of a batch (numpy ``[rows, T]`` arrays) -> global device arrays,
        split over the batch mesh axes.

        With P processes the data pipeline gives each ``data.batch_size / P`` rows of every
        global batch (:mod:`lattn_jax.data`: every P-th window), so the global ``[P * rows, T]``
        array is assembled from the processes' local rows (process 0's first;
        ``jax.make_array_from_process_local_data``), which requires the batch mesh axes to
        split the rows evenly over the processes' devices (each process's devices own a
        contiguous block of rows). With one process, ``batch`` is the whole batch.
        """
        if self.mesh is None:
            return _to_jax(batch)
        out = {}
        processes = jax.process_count()
        for key, value in batch.items():
            value = np.asarray(value)
            shape = (value.shape[0] * processes,) + value.shape[1:]
            spec = sharding.logical_to_spec(_batch_names(value.ndim), shape, self.mesh,
                                            self.rules)
            out[key] = jax.make_array_from_process_local_data(NamedSharding(self.mesh, spec),
                                                              value, shape)
        return out

    # -- steps ---------------------------------------------------------------------------------
    def logits(self, params: PyTree, batch: Batch) -> jax.Array:
        """fp32 ``[B, T, S]`` logits of ``batch["inputs"]`` (with its ``segment_ids``)."""
        model = self.model(params)
        logits = model(batch["inputs"], segment_ids=batch.get("segment_ids"))
        return sharding.constrain(logits, sharding.ACT_BTS)

    def loss(self, params: PyTree, batch: Batch):
        """``(mean, sum, count)`` of the batch's token losses (:func:`cross_entropy_loss`), or
        with ``train.loss_chunk_size`` the fused head's (``losses.chunked_cross_entropy``)."""
        chunk = self.config.train.loss_chunk_size
        if chunk is None:
            return cross_entropy_loss(self.logits(params, batch), batch["targets"],
                                      batch["weights"])
        model = self.model(params)
        hidden = model(batch["inputs"], segment_ids=batch.get("segment_ids"),
                       return_hidden=True)  # [B, T, D] compute dtype
        return halo_losses.chunked_cross_entropy(
            hidden, model.head_kernel(), batch["targets"],
            batch["weights"].astype(jnp.float32), chunk_size=chunk)

    def micro_batches(self, batch: Batch) -> Batch:
        """``[B, ...]`` arrays -> ``[n, B / n, ...]``, ``n = self.accum_steps``: micro-batch i
        takes rows ``i, i + n, i + 2n, ...``, so each stays split evenly over the batch mesh axes
        (every replica's block of rows feeds every micro-batch; no data moves)."""
        n = self.accum_steps

        def split(x):
            x = x.reshape((x.shape[0] // n, n) + x.shape[1:])
            return jnp.moveaxis(x, 1, 0)

        return {k: split(v) for k, v in batch.items()}

    def loss_and_grads(self, params: PyTree, batch: Batch):
        """``(mean loss, gradients)`` of one batch (traced under the mesh by the caller).

        The loss is the token-weighted mean cross-entropy over the whole batch. With
        ``train.micro_batch_size`` set (gradient accumulation, :func:`accumulation_steps`), the
        batch runs as ``n`` micro-batches (:meth:`micro_batches`) in a ``lax.scan``; each
        contributes ``(sum of its token losses) / (the whole batch's token count)`` and that
        term's gradient, summed in fp32 (in the parameters' dtype if wider), so the loss and
        gradients equal the one-pass ones up to summation order, while activations live for one
        micro-batch at a time.

        Args:
          params: the parameter tree.
          batch: ``inputs``/``targets`` int ``[B, T]``, ``weights`` fp32 ``[B, T]``, optional
            ``segment_ids`` int ``[B, T]`` (B the global batch).

        Returns:
          ``(loss, grads)``: the fp32 scalar loss in nats per token and a tree shaped like
          ``params``, in its dtypes.
        """
        count = jnp.maximum(jnp.sum(batch["weights"].astype(jnp.float32)), 1.0)

        def loss_fn(p, micro):
            _, total, _ = self.loss(p, micro)
            return total / count

        grad_fn = jax.value_and_grad(loss_fn)
        if self.accum_steps == 1:
            return grad_fn(params, batch)

        def body(carry, micro):
            loss, grads = carry
            loss_i, grads_i = grad_fn(params, _constrain_batch(micro))
            grads = jax.tree_util.tree_map(lambda a, g: a + g.astype(a.dtype), grads, grads_i)
            return (loss + loss_i, grads), None

        zeros = jax.tree_util.tree_map(
            lambda p: jnp.zeros(p.shape, jnp.promote_types(p.dtype, jnp.float32)), params)
        (loss, grads), _ = jax.lax.scan(body, (jnp.zeros((), jnp.float32), zeros),
                                        self.micro_batches(batch))
        return loss, jax.tree_util.tree_map(lambda g, p: g.astype(p.dtype), grads, params)

    def _train_step(self, state: PyTree, batch: Batch):
        loss, grads = self.loss_and_grads(state["params"], batch)
        grad_norm = optax.tree.norm(grads)
        updates, opt_state = self.tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        # NaN/inf guard: a non-finite step keeps the previous parameters and optimizer state
        # (the batch is consumed and the step counter advances either way).
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        keep = functools.partial(jnp.where, finite)
        params = jax.tree_util.tree_map(keep, params, state["params"])
        opt_state = jax.tree_util.tree_map(keep, opt_state, state["opt_state"])
        metrics = {"loss": loss, "grad_norm": grad_norm, "finite": finite,
                   "lr": self.schedule(state["step"])}
        return {"params": params, "opt_state": opt_state, "step": state["step"] + 1}, metrics

    def train_step(self, state: PyTree, batch: Batch):
        """One optimizer step; ``state`` is donated. Returns ``(new_state, metrics)``."""
        with sharding.activate(self.mesh, self.rules):
            return self._train_step_jit(state, self.put_batch(batch))

    def _eval_counts(self, params: PyTree, batch: Batch):
        ce = optax.softmax_cross_entropy_with_integer_labels(
            self.logits(params, batch), batch["targets"])  # [B, T] fp32
        weights = batch["weights"].astype(jnp.float32)
        real, bad = weights != 0, ~jnp.isfinite(ce)
        return (halo_losses.weighted_sum(ce, weights), jnp.sum(weights),
                jnp.sum(real & bad, dtype=jnp.int32), jnp.sum(~real & bad, dtype=jnp.int32))

    def _eval_step(self, params: PyTree, batch: Batch):
        if self.accum_steps == 1:
            return self._eval_counts(params, batch)

        def body(carry, micro):
            out = self._eval_counts(params, _constrain_batch(micro))
            return tuple(a + b for a, b in zip(carry, out)), None

        zero, izero = jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32)
        return jax.lax.scan(body, (zero, zero, izero, izero), self.micro_batches(batch))[0]

    def eval_step(self, params: PyTree, batch: Batch):
        """One validation batch's sums.

        Args:
          params: the parameter tree.
          batch: as for :meth:`loss_and_grads`; rows of weight 0 (padding) are left out.

        Returns:
          ``(total, count, nonfinite, nonfinite_padding)``: the sum of the weighted token
          losses (fp32, nats; positions of weight 0 add nothing, also where their loss is not
          finite), the sum of the weights (fp32), and int32 counts of the positions whose loss
          is NaN or inf: those of nonzero weight (they make ``total`` non-finite) and those of
          weight 0 (left out; counted so that a NaN there is seen, not hidden).
        """
        with sharding.activate(self.mesh, self.rules):
            return self._eval_step_jit(params, self.put_batch(batch))

    def evaluate_counts(self, params: PyTree, batches: Iterable[Batch],
                        should_stop: Optional[Callable[[], bool]] = None) -> "EvalResult":
        """:class:`EvalResult` over ``batches`` (loss ``nan`` if there are none).

        Args:
          params: the model parameters.
          batches: the validation batches.
          should_stop: polled before each batch (e.g. "a SIGTERM arrived"); when it returns
            ``True`` the pass ends there.

        Raises:
          EvaluationStopped: ``should_stop`` returned ``True`` (its ``batches_done`` says after
            how many batches); no partial result is returned.
        """
        total, count, nonfinite, padding = 0.0, 0.0, 0, 0
        for done, batch in enumerate(batches):
            if should_stop is not None and should_stop():
                raise EvaluationStopped(done)
            t, c, n, p = self.eval_step(params, batch)
            total += float(t)
            count += float(c)
            nonfinite += int(n)
            padding += int(p)
        return EvalResult(total / count if count else float("nan"), count, nonfinite, padding)

    def evaluate(self, params: PyTree, batches: Iterable[Batch]) -> float:
        """Token-mean validation loss (nats) over ``batches``; ``nan`` if there are none."""
        return self.evaluate_counts(params, batches).loss


class EvaluationStopped(Exception):
    """A validation pass ended early by :meth:`Trainer.evaluate_counts`'s ``should_stop``
    (``batches_done``: the batches evaluated before it)."""

    def __init__(self, batches_done: int):
        super().__init__(f"stopped after {batches_done} batches")
        self.batches_done = batches_done


class EvalResult(NamedTuple):
    """A validation pass (:meth:`Trainer.evaluate_counts`).

    Attributes:
      loss: token-weighted mean loss in nats (``nan`` without tokens; non-finite if any token
        of nonzero weight had a non-finite loss).
      tokens: the sum of the weights.
      nonfinite: positions of nonzero weight whose loss was NaN or inf.
      nonfinite_padding: positions of weight 0 (padding rows) whose loss was NaN or inf; they
        are left out of ``loss``.
    """

    loss: float
    tokens: float
    nonfinite: int
    nonfinite_padding: int


def _to_jax(batch: Batch) -> Batch:
    return {k: jnp.asarray(v) for k, v in batch.items()}


def _batch_names(ndim: int) -> tuple:
    """Logical axis names of a ``[B, T, ...]`` batch array: rows and length, the rest none."""
    return sharding.ACT_BT + (None,) * (ndim - 2)


def _constrain_batch(batch: Batch) -> Batch:
    """Batch arrays constrained to the batch mesh axes (rows) under the active mesh."""
    return {k: sharding.constrain(v, _batch_names(v.ndim)) for k, v in batch.items()}


def accumulation_steps(config: config_lib.ExperimentConfig,
                       mesh: Optional[jax.sharding.Mesh]) -> int:
    """Micro-batches per optimizer step: ``data.batch_size / (train.micro_batch_size x the
    mesh's data x fsdp)``, or 1 when ``train.micro_batch_size`` is ``None``.

    Raises:
      ConfigError: if ``data.batch_size`` is not a multiple of that product.
    """
    micro = config.train.micro_batch_size
    if micro is None:
        return 1
    replicas = 1 if mesh is None else mesh.shape["data"] * mesh.shape["fsdp"]
    rows = micro * replicas
    if config.data.batch_size % rows:
        raise config_lib.ConfigError(
            f"data.batch_size={config.data.batch_size} must be a multiple of "
            f"train.micro_batch_size x (mesh data x fsdp) = {micro} x {replicas}")
    return config.data.batch_size // rows


def schedule_warning(ocfg: config_lib.OptimConfig, total_steps: int) -> Optional[str]:
    """A warning when the warm-up leaves the learning rate no (or too little) room to decay.

    WSD decays over the last ``optim.decay_fraction`` of the run and cosine over everything
    after the warm-up (:func:`lattn_jax.optim.learning_rate_schedule`); a warm-up reaching into
    that window shortens the decay. A warm-up at least as long as the run is clamped to it: the
    learning rate then rises over the whole run, to ``(T - 1) / T`` of the peak at the last of
    its ``T`` steps (it never reaches the peak), and never decays.

    A warm-up the configs derive from the run (``configs/default.py`` and the paper presets'
    ``tiny`` variants: a tenth of ``train.total_steps``) follows a lowered
    ``--config.train.total_steps``, so this fires for a warm-up set outright
    (``--config.optim.warmup_steps``) or fixed by a recipe (``configs.common.BUDGETS``), where
    the user has to lower one or raise the other.

    Returns:
      One line naming the options, or ``None`` when the schedule decays as configured.
    """
    warmup = ocfg.warmup_steps
    if warmup >= total_steps:
        last = ocfg.learning_rate * (total_steps - 1) / total_steps
        clamped = (f"the warm-up is clamped to the run's {total_steps} steps, so "
                   if warmup > total_steps else "")
        return (f"optim.warmup_steps={warmup} >= train.total_steps={total_steps}: {clamped}the "
                f"learning rate rises linearly over the whole run, to {last:g} at the last step "
                f"(the peak, {ocfg.learning_rate:g}, is never reached), and never decays; lower "
                f"--config.optim.warmup_steps or raise --config.train.total_steps")
    if ocfg.schedule == "cosine":
        return None
    wanted = max(int(round(ocfg.decay_fraction * total_steps)), 1)
    if total_steps - wanted >= warmup:
        return None
    return (f"optim.warmup_steps={warmup} with train.total_steps={total_steps}: the warm-up "
            f"leaves {total_steps - warmup} of the {wanted} decay steps "
            f"(optim.decay_fraction={ocfg.decay_fraction:g}); lower --config.optim.warmup_steps "
            f"or raise --config.train.total_steps")


def check_mesh(config: config_lib.ExperimentConfig) -> None:
    """Checks ``config.mesh`` against ``jax.device_count()`` and the batch and sequence it
    splits (config and device count only: :func:`train_and_evaluate` calls it before anything
    is written or any data is read).

    Raises:
      ConfigError: if the mesh does not fit the devices (e.g. ``"mesh data x fsdp x context x
        tensor = 2 x 1 x 1 x 1 needs 2 devices, but there are 1"``), the batch does not split
        over it, or the sequence does not split over ``mesh.context``.
    """
    num_devices = jax.device_count()
    shape = dict(zip(config_lib.MESH_AXES, config.mesh.shape(num_devices)))
    if num_devices == 1:
        return
    data, fsdp, context = shape["data"], shape["fsdp"], shape["context"]
    if config.data.batch_size % (data * fsdp):
        raise config_lib.ConfigError(
            f"data.batch_size={config.data.batch_size} must be a multiple of mesh data x fsdp "
            f"= {data} x {fsdp}")
    context_parallel.check_sequence_length(config.data.seq_len, context, config.model)


def check_backend_dtypes(config: config_lib.ExperimentConfig) -> None:
    """Checks ``config.model``'s dtypes against the default backend (config and backend only:
    :func:`train_and_evaluate` calls it before anything is written or any data is read).

    XLA's CPU backend has no float16 matrix product with a float32 result (``dot_general``
    precision ``F16_F16_F32``): a ``float16`` model failed at its first step with a 40-line
    traceback.

    Raises:
      ConfigError: ``model.dtype`` or ``model.param_dtype`` is ``"float16"`` on the CPU
        backend (naming the option and the dtypes that work there).
    """
    if jax.default_backend() != "cpu":
        return
    for name in ("dtype", "param_dtype"):
        if getattr(config.model, name) == "float16":
            raise config_lib.ConfigError(
                f"model.{name}=float16 is not supported on the CPU backend (XLA's CPU matrix "
                f"product has no float16 x float16 -> float32); use float32 or bfloat16 here, "
                f"float16 on a GPU")


def make_mesh(config: config_lib.ExperimentConfig) -> Optional[jax.sharding.Mesh]:
    """The run's mesh from ``config.mesh``, or ``None`` on a single device.

    Raises:
      ConfigError: if the mesh does not fit the devices, the batch does not split over it, or
        the sequence does not split over ``mesh.context`` (:func:`check_mesh`).
    """
    check_mesh(config)
    if jax.device_count() == 1:
        return None
    return sharding.make_mesh(config.mesh)


def _evaluation_missed(writer: "MetricsWriter", resumed_from: int,
                       tcfg: config_lib.TrainConfig) -> bool:
    """Whether the run resumes at a periodic evaluation step (``train.eval_every``; not the
    last step, whose evaluation is the final one) that its ``metrics.jsonl`` holds no
    ``val_loss`` for: the stopped run's evaluation there was cut short and not recorded.
    Single process only (the others could not read the file, and every process must run the
    evaluation's batches together); ``False`` when metrics are not written."""
    if (resumed_from <= 0 or resumed_from >= tcfg.total_steps
            or resumed_from % tcfg.eval_every or not writer.enabled
            or jax.process_count() > 1):
        return False
    records = records_lib.read_records(writer.path, lenient=True)
    return not any(isinstance(r, dict) and r.get("step") == resumed_from and "val_loss" in r
                   for r in records)


class MetricsWriter:
    """Appends one JSON object per line to ``<workdir>/metrics.jsonl`` and, optionally, writes
    the same scalars as TensorBoard events under ``<workdir>/tensorboard`` (tensorboardX, no
    TensorFlow needed). Only process 0 writes."""

    def __init__(self, workdir: str, *, tensorboard: bool = False):
        self.path = os.path.join(workdir, "metrics.jsonl")
        self.enabled = jax.process_index() == 0
        self._tb = None
        if tensorboard and self.enabled:
            import tensorboardX  # imported here: only runs that log to TensorBoard pay for it
            self._tb = tensorboardX.SummaryWriter(logdir=os.path.join(workdir, "tensorboard"))

    def write(self, step: int, **metrics: Optional[float]) -> None:
        if not self.enabled:
            return
        values = {k: float(v) for k, v in metrics.items() if v is not None}
        record = {"step": int(step), "time": time.time(), **values}
        # A line cut short by a killed writer is removed first (records.append_record).
        records_lib.append_record(self.path, record)
        if self._tb is not None:
            for key, value in values.items():
                self._tb.add_scalar(key, value, int(step))

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None


class Terminated(BaseException):
    """SIGTERM or SIGHUP came while a checkpoint was being written where no watcher turns it
    into a stop request (the stop path's save, the final save, a run with
    ``train.save_on_preemption`` off): raised once the write is complete
    (:meth:`PreemptionWatcher.defer_signals`), with a one-line message naming that checkpoint;
    or in the final evaluation, after the trained state is saved. A ``BaseException``, as
    ``KeyboardInterrupt``: ``except Exception`` handlers let it through.

    Args:
      message: the one line (``str(e)``).
      signum: the signal (default SIGTERM).

    Attributes:
      signum: the signal, a :class:`signal.Signals`.
      signal_name: its name, ``"SIGTERM"`` or ``"SIGHUP"``.
      exit_status: the shell's status for it, ``128 + signum``: 143 for SIGTERM, 129 for
        SIGHUP (``experiments/train.py`` exits with it; the sweep counts neither as a failed
        run, :mod:`lattn_jax.sweep`).
    """

    def __init__(self, message: str = "", signum: int = signal.SIGTERM):
        super().__init__(message)
        self.signum = signal.Signals(signum)

    @property
    def signal_name(self) -> str:
        return self.signum.name

    @property
    def exit_status(self) -> int:
        return 128 + int(self.signum)


# The signals that end a process by default and that the trainer turns into "save, then stop":
# SIGTERM (a scheduler's preemption) and SIGHUP (the terminal or ssh session went away).
_TERMINATING = (signal.SIGTERM, signal.SIGHUP)


def _hangup_ignored() -> bool:
    """Whether SIGHUP is ignored (``SIG_IGN``: ``nohup``, or a parent that set it so): the run
    was started to outlive its terminal, and the trainer leaves SIGHUP ignored."""
    return signal.getsignal(signal.SIGHUP) == signal.SIG_IGN


def _stop_signals() -> tuple:
    """SIGTERM, SIGINT and SIGHUP (unless ignored, :func:`_hangup_ignored`)."""
    return (signal.SIGTERM, signal.SIGINT) + (() if _hangup_ignored() else (signal.SIGHUP,))


def _notice(text: str) -> None:
    """One line on stderr from a signal handler; a stderr that cannot be written (the terminal
    of a SIGHUP is gone: ``EIO``) is skipped, since an error raised in a handler would land in
    whatever it interrupted (a checkpoint write)."""
    try:
        print(text, file=sys.stderr, flush=True)
    except (OSError, ValueError):  # ValueError: a closed stream
        pass


class PreemptionWatcher:
    """Turns SIGTERM, SIGHUP and SIGINT (Ctrl-C) into a flag the loop polls, so that it can save
    before exiting.

    SIGHUP (the terminal or ssh session that started the run closed) is treated as SIGTERM:
    save after the current step and stop, and held back during checkpoint writes. A SIGHUP
    that is ignored when the watcher starts (``nohup``, :func:`_hangup_ignored`) stays ignored:
    the run was started to outlive its terminal.

    The first Ctrl-C asks for a save at the end of the current step and installs Python's
    default SIGINT handler, so that a second Ctrl-C interrupts at once (``KeyboardInterrupt``,
    nothing saved), except while a checkpoint is being written (:meth:`defer_signals`): then it
    stops once the write is complete. A SIGTERM while a checkpoint is being written outside the
    watched loop (the stop path's or the final save) is held back the same way. Installed only
    from the main thread (Python's rule for signal handlers); the previous handlers are restored
    on exit.

    Multi-process runs with JAX's preemption service (:func:`preemption_service_active`): the
    processes must stop at the same step, which a flag per process does not give (one process
    left the loop for its save while the others waited in the next step's collectives: both
    hung). There the watcher leaves SIGTERM to the service's own handler (a Python handler
    replaced it, so the service never heard of the signal), and a first Ctrl-C is passed to
    the service as a SIGTERM of this process; the loop stops at the step the service agrees
    on (``Checkpointer.reached_preemption``), and ``requested`` stays ``False``. A SIGHUP is
    passed on the same way (its default handler would end this process alone, and the others
    would hang in the next collective), once: the first of SIGINT and SIGHUP is forwarded.
    Public: the HALO pipeline (``experiments/halo_pipeline.py``) stops its stages with it too.

    Args:
      enabled: install the handlers (``train.save_on_preemption``).
      multi_process: the multi-process mode above; ``None``: whether ``jax.process_count() >
        1`` with the preemption service active.

    Attributes:
      requested: a signal arrived (poll it, then save and stop); single-process mode only.
      signal_name: the first signal's name (``"SIGTERM"``, ``"SIGHUP"``, ``"SIGINT"``), or
        ``None``.
    """

    # Every signal it may handle (which ones it does: _signals).
    SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

    def __init__(self, enabled: bool, *, multi_process: Optional[bool] = None):
        self.requested = False
        self.signal_name = None
        self._previous = {}
        self._forwarded = False
        self._enabled = enabled and threading.current_thread() is threading.main_thread()
        if multi_process is None:
            multi_process = jax.process_count() > 1 and preemption_service_active()
        self.multi_process = multi_process

    def _signals(self) -> tuple:
        """The signals to handle now: SIGTERM belongs to JAX's preemption notifier in a
        multi-process run; an ignored SIGHUP (``nohup``) stays ignored."""
        return tuple(s for s in _stop_signals()
                     if not (self.multi_process and s == signal.SIGTERM))

    def __enter__(self):
        if self._enabled:
            for signum in self._signals():
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum, frame):
        del frame
        if self.signal_name is None:
            self.signal_name = signal.Signals(signum).name
        if self.multi_process:
            # The service agrees on a step with every process and the loop stops there.
            if not self._forwarded:
                self._forwarded = True
                os.kill(os.getpid(), signal.SIGTERM)
        else:
            self.requested = True
        if signum == signal.SIGINT:
            # Python's own Ctrl-C handler (whatever was installed before, e.g. SIG_IGN by a
            # library), so that the next Ctrl-C raises KeyboardInterrupt at once.
            signal.signal(signal.SIGINT, signal.default_int_handler)
            _notice("\nCtrl-C: saving a checkpoint after this step (Ctrl-C again to stop at "
                    "once, without saving)")

    def __exit__(self, *exc):
        if self._enabled:
            for signum, previous in self._previous.items():
                signal.signal(signum, previous)
        return False

    @contextlib.contextmanager
    def defer_signals(self, what: str, *, finish: Optional[Callable[[], None]] = None,
                      raise_after: bool = True):
        """Holds back a Ctrl-C, SIGTERM or SIGHUP that would interrupt the block (a checkpoint
        write) until the block is done, so that the checkpoint is complete and no
        ``KeyboardInterrupt`` lands inside orbax. One that did (orbax 0.12.8) left the step's
        temporary directory behind, or logged orbax's "Save Finalize thread (save_finalize)
        failed" traceback (the step was then complete, while the binary said nothing was
        saved), or hung the process; a SIGTERM (or SIGHUP) under its default handler killed the
        process mid-write, so that the run resumed from the checkpoint before (losing the steps
        since).

        Inside the block, a signal the watcher's own handler receives (its first Ctrl-C, any
        SIGTERM or SIGHUP while the loop watches) only asks for a stop, as :meth:`_handle`
        does. Any other Ctrl-C, SIGTERM or SIGHUP (a second Ctrl-C; any after the watcher's
        exit or without it) prints one line (skipped if stderr cannot be written, as after a
        hang-up) and is deferred: when the block ends, ``finish`` (e.g. waiting for the
        asynchronous write) runs, still deferring, and then, with ``raise_after``,
        ``Terminated`` (a SIGTERM or SIGHUP came: the first of them) or ``KeyboardInterrupt``
        is raised with a one-line message saying that ``what`` is complete. A multi-process
        run's SIGTERM is left to JAX's preemption service (it only notifies it); an ignored
        SIGHUP (``nohup``) stays ignored. A block that raises restores the handlers and
        propagates its own error. Does nothing outside the main thread.

        Args:
          what: the checkpoint being written, for the messages (e.g. ``"the checkpoint at step
            6 (<dir>/6)"``).
          finish: called after the block when a signal was deferred, before raising.
          raise_after: raise for the deferred signal after the block (``False``: the caller is
            ending anyway, e.g. closing the checkpointer in a ``finally``).

        Raises:
          Terminated: after the block (and ``finish``), if a SIGTERM or SIGHUP was deferred
            and ``raise_after`` (``signum``: the first of them).
          KeyboardInterrupt: likewise for a deferred Ctrl-C (and no SIGTERM or SIGHUP).
        """
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        signals = self._signals()
        previous = {s: signal.getsignal(s) for s in signals}
        watched = {s: h == self._handle for s, h in previous.items()}  # no such signal seen yet
        first, deferred = [], []

        def hold(signum, frame):
            if signum == signal.SIGINT and watched[signum] and not first:
                first.append(signum)
                self._handle(signum, frame)  # the first Ctrl-C: a stop after this step
                signal.signal(signal.SIGINT, hold)  # and still deferring the next one
                return
            if not deferred:
                name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
                _notice(f"\n{name} while {what} is being written: stopping once it is complete "
                        f"(interrupting the write would leave it incomplete)")
            deferred.append(signum)

        signal.signal(signal.SIGINT, hold)
        # The watcher's own handler only flags a stop; a multi-process run's SIGTERM only
        # notifies JAX's preemption service (the process is not ended): not in ``signals``.
        held = [s for s in _TERMINATING if s in signals and not watched[s]]
        for signum in held:
            signal.signal(signum, hold)
        try:
            yield
            if deferred and finish is not None:
                finish()
        finally:
            # After a first Ctrl-C in the block, the next one interrupts (as after _handle).
            signal.signal(signal.SIGINT,
                          signal.default_int_handler if first else previous[signal.SIGINT])
            for signum in held:
                signal.signal(signum, previous[signum])
        if deferred and raise_after:
            ended = [s for s in deferred if s in _TERMINATING]
            if ended:
                name = signal.Signals(ended[0]).name
                raise Terminated(f"{what} is complete; stopped there on {name}: run the same "
                                 f"command again to resume from it", ended[0])
            raise KeyboardInterrupt(f"{what} is complete; stopped there on Ctrl-C: run the same "
                                    f"command again to resume from it")


def preemption_service_active() -> bool:
    """Whether JAX's preemption sync service runs in this process (``jax.distributed``
    initialised with ``jax_enable_preemption_service``): its handler then receives SIGTERM and
    :func:`jax.experimental.multihost_utils.reached_preemption_sync_point` tells every process
    the same step to save at."""
    try:
        from jax._src import distributed  # private: the public API does not say it
    except ImportError:
        return False
    return getattr(distributed.global_state, "preemption_sync_manager", None) is not None


def _note_signals_when_done(step: int) -> None:
    """For the rest of the process, SIGTERM and SIGHUP (unless ignored: ``nohup``) print one
    note on stderr and change nothing: called once a run completed (its final checkpoint at
    ``step`` written), so that a signal while it prints its results or the interpreter shuts
    down does not end it with status 143 (129) as if it had been stopped (a rerun said "run
    already finished"). Does nothing outside the main thread (Python's rule for handlers)."""
    if threading.current_thread() is not threading.main_thread():
        return

    def note(signum, frame):
        del frame
        _notice(f"{signal.Signals(signum).name} after the run completed at step {step} (its "
                f"final checkpoint is written): nothing to stop")

    for signum in _TERMINATING:
        if not (signum == signal.SIGHUP and _hangup_ignored()):
            signal.signal(signum, note)


class _StopRequested(BaseException):
    """A SIGTERM, SIGHUP or Ctrl-C under :func:`_stop_on_signals` (``signum``: which)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _stop_on_signals(enabled: bool = True):
    """Inside the block, SIGTERM, SIGHUP (unless ignored: ``nohup``) and Ctrl-C raise
    :class:`_StopRequested` at once (for work that writes nothing and may be cut short: the
    final evaluation), so that the caller can save and stop. The previous handlers are restored
    on exit; nothing changes outside the main thread or when not ``enabled``."""
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        del frame
        raise _StopRequested(signum)

    previous = {s: signal.signal(s, stop) for s in _stop_signals()}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


CONSOLE_LOG = "console.log"
INVOCATIONS = "invocations.jsonl"
LOSS_PLOT = "loss.png"
_VERSIONED_PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "grain", "numpy",
                       "ml-collections", "sentencepiece", "tensorboardX", "matplotlib",
                       "lattn-jax")


def _utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _git_state(root: Optional[str] = None) -> Optional[Dict[str, Any]]:
    """``{"commit", "dirty"}`` of the git checkout ``root`` (default: the one holding this
    package), or ``None`` (not a checkout, or no git). Read-only: ``--no-optional-locks`` keeps
    ``git status`` from taking the index lock to refresh the index, so a run never writes into
    the user's checkout (a run killed mid-write, or one under a file-size limit, once left a
    cut-short ``index.lock`` that blocked the next commit)."""
    root = root or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def git(*args):
        return subprocess.run(("git", "--no-optional-locks", "-C", root) + args,
                              capture_output=True, text=True, timeout=10,
                              check=True).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": dirty}


def _versions() -> Dict[str, Optional[str]]:
    out = {"python": sys.version.split()[0]}
    for name in _VERSIONED_PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def record_invocation(workdir: str, config: config_lib.ExperimentConfig,
                      argv: Optional[list] = None) -> Dict[str, Any]:
    """Appends this invocation to ``<workdir>/invocations.jsonl`` and returns the record: UTC
    time, command line (``argv``, default ``sys.argv``), working directory, git commit (and
    whether the checkout had uncommitted changes; ``None`` outside a checkout), package versions,
    device summary and the config as run."""
    devices = jax.devices()
    record = {
        "time": _utc_now(),
        "argv": list(sys.argv if argv is None else argv),
        "cwd": os.getcwd(),
        "git": _git_state(),
        "versions": _versions(),
        "devices": {"backend": jax.default_backend(), "count": len(devices),
                    "kinds": sorted({d.device_kind for d in devices}),
                    "processes": jax.process_count()},
        "config": config_lib.experiment_json_dict(config),
    }
    records_lib.append_record(os.path.join(workdir, INVOCATIONS), record)
    return record


def plot_losses(workdir: str) -> Optional[str]:
    """Writes ``<workdir>/loss.png``: training and validation loss against the step, from
    ``metrics.jsonl`` (a step logged twice keeps its last record, as after a resume from an
    older step). Returns the path, or ``None`` when there is nothing to plot."""
    from matplotlib.backends import backend_agg  # imported here: only the writer plots
    from matplotlib import figure

    curves = {"train_loss": {}, "val_loss": {}}
    try:  # lenient: a line cut short by a killed writer (or older runs' glued lines) is skipped
        lines = records_lib.read_records(os.path.join(workdir, "metrics.jsonl"), lenient=True)
    except OSError:
        return None
    for record in lines:
        if isinstance(record, dict) and "step" in record:
            for key, curve in curves.items():
                if key in record:
                    curve[record["step"]] = record[key]
    if not any(curves.values()):
        return None
    fig = figure.Figure(figsize=(7, 4.5), dpi=100)
    backend_agg.FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for key, label, style in (("train_loss", "train", "-"), ("val_loss", "validation", "o-")):
        steps = sorted(curves[key])
        if steps:
            ax.plot(steps, [curves[key][s] for s in steps], style, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(os.path.basename(os.path.abspath(workdir)))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = os.path.join(workdir, LOSS_PLOT)
    tmp = path + ".tmp.png"
    fig.savefig(tmp)
    os.replace(tmp, path)
    return path


# Data options that may change between a run and its resumption: they do not move the
# iterator's windows (max_bad_fraction only stops a read; a config.json older than it lacks
# it). Every other data option changes which batch comes next.
_RESUMABLE_DATA_OPTIONS = ("max_val_batches", "max_bad_fraction")
# Model options that change how the same parameters are computed with, not the parameters
# (split_projections and swiglu_packed: the same products formed otherwise, the same values;
# norm_implementation: the same norms by XLA or by Pallas kernels, equal up to fp32 rounding).
_RESUMABLE_MODEL_OPTIONS = ("dtype", "remat", "remat_policy", "split_projections",
                            "swiglu_packed", "norm_implementation")
# Optimizer options that can change the optimizer state's pytree (a checkpoint restores only
# into the layout that wrote it), with their values for a config.json older than the option.
# Whether a change of one does is decided by _optim_layout_diffs: grad_clip only between 0 and
# > 0, muon_variant only under name="muon", the weight decays only under flatten=True.
_STATE_LAYOUT_OPTIM_OPTIONS = {"name": "adamw", "flatten": False, "grad_clip": 1.0,
                               "muon_variant": "normuon", "weight_decay": 0.1,
                               "adamw_weight_decay": None}


def _optim_layout_diffs(saved: dict, current: dict) -> List[str]:
    """``"optim.<option> (saved -> now)"`` for every optimizer option whose change changes the
    optimizer state's pytree (:func:`lattn_jax.optim.make_optimizer`), so that a checkpoint
    written with ``saved`` cannot restore under ``current``.

    Args:
      saved: the run's ``config.json`` ``optim`` section (an option it lacks takes its value in
        ``_STATE_LAYOUT_OPTIM_OPTIONS``).
      current: this invocation's ``optim`` section.
    """
    a = {k: saved.get(k, d) for k, d in _STATE_LAYOUT_OPTIM_OPTIONS.items()}
    b = {k: current.get(k, d) for k, d in _STATE_LAYOUT_OPTIM_OPTIONS.items()}

    def layout(o):
        muon = o["name"] == "muon"
        # flatten=True: a decay rate of 0 makes the AdamW group one flat group, not two.
        decay = (o["adamw_weight_decay"] or 0) if muon else o["weight_decay"]
        return {"name": o["name"], "flatten": o["flatten"],
                "grad_clip": o["grad_clip"] > 0,  # clip_by_global_norm is a chain element
                "muon_variant": o["muon_variant"] if muon else None,  # NorMuon's moment2
                "weight_decay": decay > 0 if o["flatten"] and not muon else None,
                "adamw_weight_decay": decay > 0 if o["flatten"] and muon else None}

    if layout(a) == layout(b):
        return []
    # Named: the options that changed (muon_variant's layout role changes with name alone).
    return [f"optim.{k} ({a[k]!r} -> {b[k]!r})" for k in _STATE_LAYOUT_OPTIM_OPTIONS
            if a[k] != b[k] and (k in ("name", "flatten") or layout(a)[k] != layout(b)[k])]


def _check_resume_compatible(workdir: str, config: config_lib.ExperimentConfig,
                             has_checkpoint: bool,
                             derived: Optional[Mapping[str, Sequence[str]]] = None,
                             read_saved: Optional[Callable[[], Optional[dict]]] = None
                             ) -> List[str]:
    """Refuses to resume a checkpoint written with a different model, data stream or seed.

    The model options must match for the parameters to load, the data options for the
    restored iterator position to mean the same batches, ``train.seed`` because it seeds only
    the initial parameters (a resume would ignore a new one; a ``config.json`` without it is
    not compared), and the optimizer options that change
    the optimizer state's layout (``optim.name``, ``optim.flatten``; see
    :func:`_optim_layout_diffs`) for the optimizer state to load. Writes nothing:
    ``config.json`` is written once the run's state is restored or initialised
    (:func:`_write_start_config`) and then kept: each invocation's own config is in
    ``invocations.jsonl`` (:func:`record_invocation`).

    Other optimizer options and ``train.total_steps`` may change on resume (raising
    ``total_steps`` is how a finished run is continued), but the learning-rate schedule is then
    recomputed for the new values from the resumed step on (warm-up share, WSD decay start),
    so the rate can jump there: they are returned for the caller to report.

    Args:
      workdir: the run directory (its ``config.json``).
      config: this invocation's config.
      has_checkpoint: whether ``workdir`` holds a checkpoint (nothing is compared without).
      derived: the options the config computes from others
        (:func:`lattn_jax.config.derived_options`). One that changed only because an option
        it follows changed (``optim.warmup_steps``, a tenth of ``train.total_steps`` in the
        presets) is marked ``derived from <option>`` and listed after the options the user
        changed.
      read_saved: returns ``<workdir>/config.json`` as
        :func:`lattn_jax.config.saved_training_config` does (and raises as it does); the
        caller's, to read the file once for several checks. Default: read here.

    Returns:
      ``"option (start -> now)"`` for every such option that differs from the saved run
      (empty without a checkpoint); a derived one ``"option (start -> now, derived from
      <option>)"``.

    Raises:
      ConfigError: naming every option that differs from the saved run; or naming
        ``<workdir>/config.json`` when it is not valid JSON or is another kind of run's (no
        ``model`` section, e.g. a HALO pipeline's), which this run would overwrite.
    """
    changed: List[str] = []
    current = config_lib.experiment_json_dict(config)
    saved = (read_saved or functools.partial(config_lib.saved_training_config, workdir))()
    if has_checkpoint and saved is not None:
        saved_model = {k: v for k, v in saved.get("model", {}).items()
                       if k not in _RESUMABLE_MODEL_OPTIONS}
        current_model = {k: v for k, v in current["model"].items()
                         if k not in _RESUMABLE_MODEL_OPTIONS}
        diffs = _diff(saved_model, current_model, "model.")
        # Older config.json files hold absolute paths to bundled files (of the clone where the
        # run started): compared by name, as a run's identity excludes where the clone lives.
        saved_data = {k: v for k, v in data_config_lib.portable_dict(saved.get("data", {})).items()
                      if k not in _RESUMABLE_DATA_OPTIONS}
        current_data = {k: v for k, v in current["data"].items()
                        if k not in _RESUMABLE_DATA_OPTIONS}
        diffs += _diff(saved_data, current_data, "data.")
        # train.seed seeds only the initial parameters: a resume would ignore a new one. Older
        # config.json files without it are not compared.
        if "seed" in saved.get("train", {}):
            diffs += _diff(saved["train"]["seed"], current["train"]["seed"], "train.seed.")
        saved_optim = saved.get("optim", {})
        layout = _optim_layout_diffs(saved_optim, current["optim"])
        if diffs:
            raise config_lib.ConfigError(
                f"workdir {workdir} holds a checkpoint of a different run; options that "
                f"differ: {', '.join(diffs + layout)}. Use a new --workdir or the saved "
                f"settings.")
        if layout:
            raise config_lib.ConfigError(
                f"{', '.join(layout)} cannot change on resume (it changes the optimizer "
                f"state's layout), and workdir {workdir} holds a checkpoint; use a new "
                f"--workdir or the saved setting.")
        changed = _diff({**_STATE_LAYOUT_OPTIM_OPTIONS, **saved_optim}, current["optim"],
                        "optim.")
        changed += _diff(saved.get("train", {}).get("total_steps"),
                         current["train"]["total_steps"], "train.total_steps.")
        changed = _mark_derived(changed, derived or {})
    return changed


def _resume_free_changes(workdir: str, config: config_lib.ExperimentConfig,
                         read_saved: Optional[Callable[[], Optional[dict]]] = None
                         ) -> List[str]:
    """The :data:`_RESUMABLE_MODEL_OPTIONS` whose value differs from the run's start
    (``<workdir>/config.json``; ``read_saved()`` when given, as for
    :func:`_check_resume_compatible`), as ``"model.<option> (a -> b)"``; ``[]`` without a
    readable record. A resume accepts them (the same parameters, computed another way) and
    says so."""
    try:
        saved = (read_saved or functools.partial(config_lib.saved_training_config, workdir))()
    except config_lib.ConfigError:
        return []
    if not saved:
        return []
    current = config_lib.experiment_json_dict(config)["model"]
    saved_model = saved.get("model", {})
    return _diff({k: saved_model[k] for k in _RESUMABLE_MODEL_OPTIONS if k in saved_model},
                 {k: current[k] for k in _RESUMABLE_MODEL_OPTIONS if k in saved_model},
                 "model.")


def _mark_derived(changed: List[str], derived: Mapping[str, Sequence[str]]) -> List[str]:
    """``changed`` (:func:`_diff`'s ``"option (a -> b)"`` entries) with every option that
    follows a changed option (``derived``: :func:`lattn_jax.config.derived_options`) marked
    ``derived from <option>`` and moved after the others; one whose sources did not change
    (its change came from elsewhere) stays as it is."""
    names = [entry.split(" ", 1)[0] for entry in changed]
    own, follow = [], []
    for name, entry in zip(names, changed):
        sources = [s for s in derived.get(name, ()) if s in names]
        if sources:
            follow.append(f"{entry[:-1]}, derived from {' and '.join(sources)})")
        else:
            own.append(entry)
    return own + follow


# The data files' identity, recorded at a run's start and compared on resume: the iterator
# position restored from a checkpoint means the same batches only over the same contents.
DATA_FINGERPRINT = "data_fingerprint.json"
_FINGERPRINT_SPAN = 1 << 20  # bytes hashed at each end of a file
_SHARD_IDENTITY = ("name", "source_sha256", "documents", "tokens")  # of a manifest's shard
# 2: a gzip file's header time is left out of the hash (version 1 records are not compared).
_FINGERPRINT_VERSION = 2
_GZIP_MAGIC = b"\x1f\x8b"
# Set in the records of runs that read each real data file once (sources.list_files drops a
# file named twice); a run recorded without it may have read such a file twice.
_DISTINCT_FILES = "distinct_files"
# A JSON file's contents and ``None``, or ``None`` and the error that kept it from being read
# (:func:`_read_json_record`).
_JsonRecord = Tuple[Any, Optional[Exception]]


def _file_fingerprint(path: str) -> Dict[str, Any]:
    """``{"bytes", "sha256_head_tail"}``: the size, and the SHA-256 of the first and the last
    MiB (the whole file when it is at most 2 MiB): cheap on a corpus of any size, and unlike a
    modification time it does not change when the same contents are written again. A gzip
    file's header time (bytes 4-7, RFC 1952) is hashed as zeros: ``gzip`` writes the time of
    the write there, so a deterministic rebuild would otherwise differ."""
    size = os.path.getsize(path)
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        head = f.read(_FINGERPRINT_SPAN)
        if head[:2] == _GZIP_MAGIC and len(head) >= 8:
            head = head[:4] + bytes(4) + head[8:]
        digest.update(head)
        if size > _FINGERPRINT_SPAN:
            f.seek(max(_FINGERPRINT_SPAN, size - _FINGERPRINT_SPAN))
            digest.update(f.read())
    return {"bytes": size, "sha256_head_tail": digest.hexdigest()}


def _readable_fingerprint(path: str, option: str) -> Dict[str, Any]:
    """:func:`_file_fingerprint` of ``path``; a file that exists but cannot be read raises
    :class:`~lattn_jax.data.sources.DataFileError` naming ``option`` and the file (a missing
    one: ``FileNotFoundError`` as before)."""
    try:
        return _file_fingerprint(path)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise sources_lib.DataFileError(
            f"{option}: {path} cannot be read ({e.strerror or e})") from e


def data_fingerprints(data: data_lib.DataConfig) -> Dict[str, Dict[str, Dict[str, Any]]]:
    """The identity of the files a run reads its data from, by option (``"data.paths"``,
    ``"data.val_paths"``) and path (a bundled file by its ``bundled:`` name).

    A text, JSONL or Parquet file: :func:`_file_fingerprint`. A token-shard directory: its
    ``manifest.json`` (the SHA-256 of what identifies the shards: their names, sources'
    SHA-256, documents and tokens, the tokenizer's SHA-256 and the dtype; not the sources'
    paths or times), and each shard's token and offsets files as above.

    Raises:
      FileNotFoundError, ValueError: a path that cannot be listed, or a malformed manifest.
      DataFileError: (an ``OSError``) a file that cannot be read (no permission, a directory
        where a file is expected): one line naming the option and the file.
    """
    tokens = data_config_lib.resolved_format(data) == "tokens"
    out = {}
    for option, paths in (("data.paths", data.paths), ("data.val_paths", data.val_paths)):
        found = {}
        names = sources_lib.OptionNames(paths=option)
        for path in (paths or ()) if tokens else sources_lib.list_files(paths or (), names):
            if not tokens:
                found[assets.portable(path)] = _readable_fingerprint(path, option)
                continue
            manifest = shards_lib.read_manifest(path)
            identity = {"dtype": manifest.get("dtype"),
                        "tokenizer": manifest.get("tokenizer", {}).get("sha256"),
                        "shards": [[e.get(k) for k in _SHARD_IDENTITY]
                                   for e in manifest.get("shards", [])]}
            found[assets.portable(os.path.join(path, shards_lib.MANIFEST))] = {
                "sha256_identity": hashlib.sha256(
                    json.dumps(identity, sort_keys=True).encode()).hexdigest()}
            for entry in manifest.get("shards", []):
                for key in ("token_file", "offsets_file"):
                    name = os.path.join(path, entry[key])
                    found[assets.portable(name)] = _readable_fingerprint(name, option)
        if found:
            out[option] = found
    return out


def _fingerprint_change(saved: Dict[str, Any], now: Dict[str, Any]) -> str:
    """What differs between two fingerprints of one file, in words."""
    if saved.get("bytes") != now.get("bytes"):
        return f"size {saved.get('bytes')} -> {now.get('bytes')} bytes"
    if "bytes" in now:
        return (f"same size ({now['bytes']} bytes), other contents: the SHA-256 of its first "
                f"and last MiB differs")
    return "another corpus: the manifest's shards differ"


def _check_data_unchanged(workdir: str, current: Callable[[], Dict[str, Any]],
                          has_checkpoint: bool,
                          read_saved: Optional[Callable[[], _JsonRecord]] = None) -> None:
    """Refuses to resume a run whose data files changed since it started (rebuilt at the same
    path with other contents): the restored iterator position would continue on other data.
    Compares ``current()`` (:func:`data_fingerprints`, called only when there is something to
    compare it with) with ``<workdir>/data_fingerprint.json`` (written at the run's start); a
    run without that record, or with a record of another version (an older run), is not
    checked. ``read_saved()`` reads the record (:func:`_read_json_record`; default: read here), so
    that the caller can share one read with :func:`_write_data_fingerprint`.

    Raises:
      ConfigError: naming the option, the first changed file, what differs (and how many
        more files differ), and how to go on: a new ``--workdir``, the original file, or
        removing the record to resume on the new contents deliberately.
    """
    path = os.path.join(workdir, DATA_FINGERPRINT)
    if not has_checkpoint or not os.path.exists(path):
        return
    saved, e = (read_saved or functools.partial(_read_json_record, path))()
    if e is not None:
        raise config_lib.ConfigError(
            f"{path}: cannot be read ({e}); remove it to resume without checking the data "
            f"files") from None
    if not isinstance(saved, dict) or saved.get("version") != _FINGERPRINT_VERSION:
        return
    current = current()
    for option in ("data.paths", "data.val_paths"):
        change = _first_change(saved, current, option)
        if change:
            name, what, more = change
            consequence = ("train on other data" if option == "data.paths" else
                           "validate on other documents than its earlier evaluations")
            raise config_lib.ConfigError(
                f"{option}: {name} changed since the run in {workdir} started ({what}){more}; "
                f"resuming would {consequence}. Use a new --workdir or the original "
                f"file, or remove {path} to resume on the new contents deliberately.")


def _first_change(saved: Dict[str, Any], current: Dict[str, Any],
                  option: str) -> Optional[Tuple[str, str, str]]:
    """How the files of ``option`` differ between two fingerprint records: ``(the first
    changed file, what differs in words, " (and N more file(s))" or "")``; ``None`` when they
    do not."""
    before, now = saved.get(option) or {}, current.get(option) or {}
    diffs = []
    for name in list(before) + [n for n in now if n not in before]:
        if name not in now:
            diffs.append((name, "no longer among its files"))
        elif name not in before:
            diffs.append((name, "not among its files when it started"))
        elif before[name] != now[name]:
            diffs.append((name, _fingerprint_change(before[name], now[name])))
    if not diffs:
        return None
    more = f" (and {len(diffs) - 1} more file(s))" if len(diffs) > 1 else ""
    return diffs[0][0], diffs[0][1], more


def duplicate_data_files(data: data_lib.DataConfig) -> List[Tuple[str, str, str]]:
    """``(option, dropped, kept)`` for every file of ``data.paths`` or ``data.val_paths`` that
    the pipeline reads once although it is named twice (:func:`lattn_jax.data.sources.
    duplicate_files`: the same real path as the earlier ``kept``), and every token-shard
    directory named again (:func:`lattn_jax.data.shards.duplicate_dirs`: read once too).

    Raises:
      FileNotFoundError: a path that does not exist, or a directory without data files.
    """
    out = []
    for option, paths in (("data.paths", data.paths), ("data.val_paths", data.val_paths)):
        names = sources_lib.OptionNames(paths=option)
        token_dirs = [p for p in paths or () if shards_lib.is_token_dir(p)]
        out += [(option, d, k) for d, k in shards_lib.duplicate_dirs(token_dirs)]
        paths = [p for p in paths or () if not shards_lib.is_token_dir(p)]
        out += [(option, d, k) for d, k in sources_lib.duplicate_files(paths, names)]
    return out


def check_duplicate_files(workdir: str, data: data_lib.DataConfig, has_checkpoint: bool,
                          read_saved: Callable[[], _JsonRecord],
                          print_fn: Callable[[str], None], consequence: str) -> None:
    """Reports the data files read once although named twice (:func:`duplicate_data_files`),
    in one line, or refuses them for a run that may have read them twice: one with a
    checkpoint whose ``data_fingerprint.json`` (``read_saved()``) lacks the mark that its
    trainer read each file once (a run started before duplicates were dropped, or before
    the record existed). A record that cannot be read is left to
    :func:`_check_data_unchanged`.

    Args:
      consequence: what reading each file once now would do to the run, and what to do, for
        the refusal (e.g. ``"resuming would train on another document stream. Use a new
        --workdir."``).

    Raises:
      ConfigError: naming the option, the first duplicate, the file it repeats, the workdir
        and ``consequence``.
      FileNotFoundError: as :func:`duplicate_data_files`.
    """
    found = duplicate_data_files(data)
    if not found:
        return
    saved, error = read_saved()
    if has_checkpoint and (error is None or isinstance(error, FileNotFoundError)):
        if not (isinstance(saved, dict) and saved.get(_DISTINCT_FILES) is True):
            option, dropped, kept = found[0]
            more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
            same = "named twice" if dropped == kept else f"{kept} again (the same real file)"
            raise config_lib.ConfigError(
                f"{option}: {dropped} is {same}{more}; the run in "
                f"{workdir} started when such a file was read twice (its record "
                f"{os.path.join(workdir, DATA_FINGERPRINT)} does not say otherwise), and it "
                f"is now read once, so {consequence}")
    dropped = [f"{o} {d} (named twice)" if d == k else f"{o} {d} (= {k})" for o, d, k in found]
    print_fn(f"data: read once, dropped as duplicates of an earlier entry (the same real "
             f"file): {', '.join(dropped)}")


def check_held_out_data(workdir: str, data: data_lib.DataConfig,
                        print_fn: Callable[[str], None]) -> None:
    """Refuses to score the validation split of the run in ``workdir`` (config ``data``) when it
    would not be the documents the run held out: the files it is drawn from changed since the
    run started (``<workdir>/data_fingerprint.json``, the check a resume makes,
    :func:`_check_data_unchanged`; ``data.val_paths`` when the run has them, else
    ``data.paths``), a file the run may have read twice (:func:`check_duplicate_files`), or
    ``data.val_paths`` sharing a file with ``data.paths``
    (:func:`lattn_jax.data.pipeline.check_disjoint_splits`). A run recorded before data
    fingerprints (no record, or one of another version) is scored unchecked, with one line
    through ``print_fn`` saying so.

    Raises:
      ConfigError: one line naming the option and the file (the first changed one, the
        duplicate, or the shared ones), or the record when it cannot be read.
      FileNotFoundError: a data file of the run that does not exist.
      DataFileError: (an ``OSError``) a data file that cannot be read: one line naming the
        option and the file.
    """
    fix = "score other text with --perplexity_files=<text files>"
    try:
        pipeline_lib.check_disjoint_splits(data)
    except ValueError as e:
        raise config_lib.ConfigError(f"perplexity 'validation' of {workdir}: {e}; {fix}") from None
    path = os.path.join(workdir, DATA_FINGERPRINT)
    read_saved = functools.lru_cache(maxsize=None)(functools.partial(_read_json_record, path))
    check_duplicate_files(
        workdir, data, has_checkpoint=True, read_saved=read_saved, print_fn=print_fn,
        consequence=f"its validation split read now is not the one it held out (and copies of "
                    f"those documents were in its training split); {fix}")
    saved, error = read_saved()
    if error is not None and not isinstance(error, FileNotFoundError):
        raise config_lib.ConfigError(f"{path}: cannot be read ({error}), so the validation "
                                     f"split's data files cannot be checked; {fix}") from None
    if not isinstance(saved, dict) or saved.get("version") != _FINGERPRINT_VERSION:
        print_fn(f"note: {workdir} has no {DATA_FINGERPRINT} of version "
                 f"{_FINGERPRINT_VERSION} (a run recorded before data fingerprints): its "
                 f"validation split is scored without checking that its data files are unchanged")
        return
    option = "data.val_paths" if data.val_paths is not None else "data.paths"
    try:
        change = _first_change(saved, data_fingerprints(data), option)
    except ValueError as e:  # a malformed token-shard manifest
        raise config_lib.ConfigError(f"data: {e}") from e
    if change:
        name, what, more = change
        raise config_lib.ConfigError(
            f"{option}: {name} changed since the run in {workdir} started ({what}){more}; its "
            f"validation split would now hold other documents, possibly ones it trained on. "
            f"Restore the original file, or {fix}")


def _write_data_fingerprint(workdir: str, current: Callable[[], Dict[str, Any]],
                            has_checkpoint: bool,
                            read_saved: Optional[Callable[[], _JsonRecord]] = None) -> None:
    """Writes ``<workdir>/data_fingerprint.json`` (``current()``) at a fresh start, or for a
    resumed run that lacks one or has one of another version (as :func:`_write_start_config`
    writes ``config.json``; process 0 only, whole or not at all). ``read_saved()`` reads the record
    there (:func:`_read_json_record`; default: read here)."""
    if jax.process_index() != 0:
        return
    path = os.path.join(workdir, DATA_FINGERPRINT)
    if has_checkpoint and _fingerprint_version(
            (read_saved or functools.partial(_read_json_record, path))()) == _FINGERPRINT_VERSION:
        return
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            json.dump({"version": _FINGERPRINT_VERSION, _DISTINCT_FILES: True, **current()}, f,
                      indent=2)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)


def _read_json_record(path: str) -> _JsonRecord:
    """``(contents, None)`` of the JSON file at ``path``, or ``(None, error)`` when it cannot
    be read or parsed (``OSError``, ``ValueError``; a missing file included)."""
    try:
        with open(path) as f:
            return json.load(f), None
    except (OSError, ValueError) as e:
        return None, e


def _fingerprint_version(record: _JsonRecord) -> Optional[int]:
    """The ``version`` of a data fingerprint record read by :func:`_read_json_record`;
    ``None`` when it is missing or unreadable."""
    saved, error = record
    if error is not None:
        return None
    return saved.get("version") if isinstance(saved, dict) else None


def _write_start_config(workdir: str, config: config_lib.ExperimentConfig,
                        has_checkpoint: bool) -> None:
    """Writes ``<workdir>/config.json`` (the run's first config) for a fresh start, or for a
    resumed run that lacks one. Called only once the state is restored or initialised, so that
    a failed start (a checkpoint of a different model, an unreadable one) writes no config that
    would then refuse the right command (:func:`_check_resume_compatible`). Only process 0
    writes it (as every run record in the workdir): in a multi-process run the other processes
    would race on the same file of a shared workdir. Written whole or not at all (a temporary
    file renamed over it): a write cut short (a full disk, a kill) left a truncated config.json,
    which then refused every later start of the run as not valid JSON."""
    if jax.process_index() != 0:
        return
    path = os.path.join(workdir, "config.json")
    if not (has_checkpoint and os.path.exists(path)):
        tmp = f"{path}.tmp-{os.getpid()}"
        try:
            with open(tmp, "w") as f:
                json.dump(config_lib.experiment_json_dict(config), f, indent=2)
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)


def _diff(a, b, prefix):
    return [f"{field} ({x!r} -> {y!r})" for field, x, y in records_lib.field_diffs(a, b, prefix)]


def check_workdir_outside_data(config: config_lib.ExperimentConfig, workdir: str) -> None:
    """Refuses a ``workdir`` inside (or equal to) a directory named in ``data.paths`` or
    ``data.val_paths``: the scan of that directory would read the run's own records
    (``invocations.jsonl``, ``metrics.jsonl``, ``console.log``, ...) as data, and its data
    fingerprint would change with every run, refusing a resume. A workdir under a hidden
    folder there (which the scan skips) and a token-shard directory (read by its manifest)
    pass.

    Raises:
      ConfigError: naming ``--workdir``, the option (``data.paths`` or ``data.val_paths``) and
        the directory, before anything is written.
    """
    work = os.path.realpath(workdir)
    for option, paths in (("data.paths", config.data.paths),
                          ("data.val_paths", config.data.val_paths)):
        for path in paths or ():
            path = os.fspath(path)
            if not os.path.isdir(path) or shards_lib.is_token_dir(path):
                continue
            rel = os.path.relpath(work, os.path.realpath(path))
            parts = [] if rel == os.curdir else rel.split(os.sep)
            if parts[:1] == [os.pardir] or any(p.startswith(".") for p in parts):
                continue
            raise config_lib.ConfigError(
                f"--workdir={workdir} is inside the {option} directory {path}, whose scan "
                f"would read the run's own records (invocations.jsonl, metrics.jsonl, "
                f"console.log, ...) as data: use a --workdir outside it, or name the data "
                f"files themselves in {option}")


def train_and_evaluate(config: config_lib.ExperimentConfig, workdir: str,
                       *, print_fn: Callable[[str], None] = tqdm.tqdm.write,
                       step: Optional[int] = None,
                       derived: Optional[Mapping[str, Sequence[str]]] = None,
                       hold_signals_when_done: bool = False) -> Dict[str, float]:
    """Trains ``config`` in ``workdir``, resuming from its newest checkpoint if there is one.

    An unreadable newest checkpoint is reported in one line, renamed
    ``<step>.unreadable-<time>`` (kept) and the next older one restored
    (:meth:`~lattn_jax.checkpoint.Checkpointer.restore_latest`). The ``metrics.jsonl`` records
    of steps after the restored one (logged by a run stopped hard after its last checkpoint)
    move to ``metrics.jsonl.discarded-<step>``
    (:func:`~lattn_jax.checkpoint.drop_records_after`), since those steps run again.

    A finished run (:func:`finished_run`: its checkpoint at ``train.total_steps`` restored,
    its final evaluation recorded) is not evaluated again: one line says so and its final
    metrics are returned; ``metrics.jsonl`` and the checkpoints are left as they are (raise
    ``train.total_steps`` to train on).

    A call that fails with an exception (a refused option, missing data, ...; not Ctrl-C) in a
    ``workdir`` it created, before it saved a checkpoint or wrote ``metrics.jsonl``, removes
    that ``workdir`` again (its ``invocations.jsonl``, ``console.log``, ``config.json``, ...),
    and the parent directories it created if they are empty (:func:`_remove_unused_workdir`):
    a refused command leaves no files behind. A ``workdir`` that existed before the call is
    never cleaned up.

    Args:
      config: a validated :class:`~lattn_jax.config.ExperimentConfig`.
      workdir: the run directory: ``checkpoints/``, ``metrics.jsonl``, ``tensorboard/``,
        ``loss.png`` (train and validation curves, redrawn at every validation),
        ``config.json`` (the run's first config), ``data_fingerprint.json`` (its data files'
        sizes and hashes, :func:`data_fingerprints`), and per invocation (appended)
        ``invocations.jsonl`` (command line, git commit, package versions, devices, config) and
        ``console.log`` (the progress lines).
      print_fn: where the human-readable progress lines go (default: above the progress bar).
      step: resume from this checkpoint step instead of the newest; the newer steps are renamed
        ``<step>.after-step-<step>-<time>`` (kept, out of the way of this run's saves).
      derived: the options the config computes from others
        (:func:`lattn_jax.config.derived_options` of the ``ConfigDict`` it came from): on
        resume, the warning about changed optimizer/schedule options marks one that changed
        only with the option it follows (``optim.warmup_steps`` with ``train.total_steps``)
        as derived from it (:func:`_check_resume_compatible`).
      hold_signals_when_done: once the run completed its steps (the final checkpoint written,
        before the ``final:`` and ``checkpoint:`` lines), SIGTERM and SIGHUP (unless ignored:
        ``nohup``) only print a note on stderr, until the process exits
        (:func:`_note_signals_when_done`; ``experiments/train.py``: a scheduler's signal while
        the results are printed or the process ends does not turn a finished run into status
        143 or 129). Single process, main thread, ``train.save_on_preemption`` only. ``False``
        (in-process callers): the handlers are left as they were.

    Returns:
      Final metrics: ``train_loss`` (mean of the last logging window), ``val_loss``,
      ``unigram_entropy``, ``step``, ``resumed_from`` (-1 for a fresh start), ``preempted``
      (the run stopped early on SIGTERM, SIGHUP or SIGINT after saving) and ``stop_signal``
      (then its name, ``"SIGTERM"``, ``"SIGHUP"`` or ``"SIGINT"``, else ``None``;
      :func:`stop_exit_status` turns it into the command's exit status).

    Raises:
      TypeError: ``config`` is not an ``ExperimentConfig`` (a ``ConfigDict`` from a config
        file: the message names :func:`lattn_jax.config.experiment_from_config_dict`), before
        anything is written.
      FileNotFoundError: a data or tokenizer file named in ``config.data`` is missing, or
        there is no checkpoint at ``step``.
      CheckpointError: no checkpoint can be read, or the one at ``step`` cannot;
        ``CheckpointWriteError`` when one cannot be written (a full disk: naming the step, the
        reason and the intact checkpoint the same command resumes from).
      WorkdirWriteError: a run record (``metrics.jsonl``, ``console.log``, ...) cannot be
        written during training (naming the file, the reason and the intact checkpoint).
      ValueError: invalid or inconsistent options, named by their dotted path (a negative
        ``step`` too). ``step`` is checked before ``workdir`` is created or written to. Also
        (``ConfigError``) when another process is training in ``workdir`` (its lock file
        ``.train.lock``), before anything is written, and when ``workdir`` cannot be created
        (naming ``--workdir``, the path and the OS reason) or its existing ``checkpoints``
        directory cannot be written (:func:`lattn_jax.checkpoint.write_problem`: before the
        data is read); when the first training step
        runs out of device memory (naming ``data.batch_size``, ``data.seq_len`` and
        ``train.micro_batch_size``; in a resumed run also the checkpoint it resumed from;
        creating or restoring the state: what to free or shard),
        or a later one, an evaluation or a save does (naming also the step that ran out,
        where it surfaced when that was later, and the newest complete checkpoint, which is
        left as it is, as are the metrics written; nothing is saved); and when ``workdir`` is
        another kind of run's directory (a HALO workdir, a sweep root: ``sweep.jsonl`` or ``runs/``)
        or a training run's ``checkpoints`` folder or a step folder in it
        (:func:`lattn_jax.config.saved_training_config`), or inside a directory of
        ``data.paths``/``data.val_paths`` (:func:`check_workdir_outside_data`), before
        anything is written; and when
        a resumed run's data files changed since it started (a corpus rebuilt at the same
        path: naming the file and what differs; :func:`_check_data_unchanged`), before the
        data is read; and when
        ``config.mesh`` does not fit the devices, the batch or the sequence
        (:func:`check_mesh`), or ``float16`` is asked of the CPU backend
        (:func:`check_backend_dtypes`), before anything is written or read.
      NonFiniteError: a non-finite loss or gradient under ``nonfinite_policy="stop"`` (after
        saving a checkpoint of the last good parameters).
      KeyboardInterrupt: a second Ctrl-C (or one with ``train.save_on_preemption`` off); one
        that came while a checkpoint was being written is raised once the write is complete,
        with a message naming that checkpoint (:meth:`PreemptionWatcher.defer_signals`).
      Terminated: a SIGTERM or SIGHUP (its ``signum``) came while a checkpoint was being
        written outside the watched loop (the stop path's or the final save; any save with
        ``train.save_on_preemption`` off): raised once the write is complete, with a message
        naming that checkpoint; or in the final evaluation (or the last step), which then stops
        (is skipped) and the trained state is saved; the next run evaluates it (also a
        ``KeyboardInterrupt`` for a Ctrl-C).
    """
    if not isinstance(config, config_lib.ExperimentConfig):  # a ConfigDict: AttributeError later
        raise TypeError(
            f"train_and_evaluate: config must be a lattn_jax.config.ExperimentConfig, got "
            f"{type(config).__name__}; convert a ConfigDict (what configs/*.py get_config() "
            f"returns) with lattn_jax.config.experiment_from_config_dict(config)")
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        raise config_lib.ConfigError(f"workdir {workdir} exists and is not a directory")
    if step is not None:  # refused before anything is written (a fresh workdir stays absent)
        if step < 0:
            raise config_lib.ConfigError(f"--step={step}: a checkpoint step is >= 0")
        steps = checkpoint_lib.saved_steps(workdir)
        if step not in steps:
            raise FileNotFoundError(
                f"no checkpoint for step {step} in {os.path.join(workdir, 'checkpoints')} "
                f"(steps: {', '.join(map(str, steps)) or 'none'})")
    # Another kind of run's workdir, or inside a run's checkpoints: refused before any write.
    config_lib.saved_training_config(workdir)
    check_workdir_outside_data(config, workdir)  # its records would be read as data
    check_mesh(config)  # a mesh that does not fit the devices: before the data is read
    check_backend_dtypes(config)  # float16 on the CPU backend: before the data is read
    created = config_lib.first_missing_dir(workdir)  # None: the workdir exists (an earlier run's)
    try:
        os.makedirs(workdir, exist_ok=True)
    except OSError as e:  # e.g. a parent that cannot hold directories (/proc), no permission
        raise config_lib.ConfigError(
            f"--workdir={workdir}: cannot create the directory ({e.strerror}: {e.filename})"
        ) from None
    if jax.process_index() != 0:
        return _train_and_evaluate(config, workdir, _silent, step, derived)
    with _workdir_lock(workdir):
        # The checkpoint directory of an earlier run refusing writes: here, before the data is
        # read, not after training to the first save (orbax hung 5 minutes there).
        problem = checkpoint_lib.write_problem(workdir)
        if problem:
            raise config_lib.ConfigError(f"--workdir={workdir}: {problem}")
        try:
            return _train_and_evaluate_logged(config, workdir, print_fn, step, derived,
                                              hold_signals_when_done)
        except Exception:
            if created is not None:
                _remove_unused_workdir(workdir, created)
            raise


_FINAL_LINE = re.compile(r"^final: step (\d+)\b", re.MULTILINE)


def finished_run(workdir: str, config: config_lib.ExperimentConfig
                 ) -> Optional[Dict[str, Any]]:
    """Whether the run in ``workdir`` finished under ``config``, from its records alone (called
    once its newest checkpoint was restored: an unreadable one is set aside first, and the
    run falls back to an older step and trains on).

    Finished: the newest checkpoint is at ``train.total_steps`` or beyond (a finished run
    called again with a lower total), ``console.log``'s newest ``final: step N`` line (printed
    after the final evaluation and save) names that step, and ``metrics.jsonl`` holds that
    step's validation loss (a run stopped in its final evaluation has none, and a resume from
    an older ``--step`` moved it aside: both still evaluate).

    Returns:
      ``None``, or the final metrics: ``train_loss`` (the last logged), ``val_loss`` (the
      final evaluation's), ``unigram_entropy`` (``nan`` here: the caller has the data's),
      ``step`` and ``resumed_from`` (the newest checkpoint's step), ``preempted`` (``False``),
      ``stop_signal`` (``None``) and ``already_finished`` (``True``).
    """
    steps = checkpoint_lib.saved_steps(workdir)
    if not steps or steps[-1] < config.train.total_steps:
        return None
    total = steps[-1]
    try:
        with open(os.path.join(workdir, CONSOLE_LOG), errors="replace") as f:
            finals = _FINAL_LINE.findall(f.read())
    except FileNotFoundError:
        return None
    if not finals or int(finals[-1]) != total:
        return None
    val_loss = train_loss = None
    for record in records_lib.read_records(os.path.join(workdir, "metrics.jsonl"),
                                           lenient=True):
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            continue
        if record["step"] == total and "val_loss" in record:
            val_loss = float(record["val_loss"])
        if record["step"] <= total and "train_loss" in record:
            train_loss = float(record["train_loss"])
    if val_loss is None:
        return None
    return {"train_loss": float("nan") if train_loss is None else train_loss,
            "val_loss": val_loss, "unigram_entropy": float("nan"), "step": total,
            "resumed_from": total, "preempted": False, "stop_signal": None,
            "already_finished": True}


def _remove_unused_workdir(workdir: str, created: str) -> bool:
    """After a failed call that created ``workdir`` (and its parents up to ``created``, from
    :func:`lattn_jax.config.first_missing_dir`): removes ``workdir`` unless the call saved
    something of value (a checkpoint entry in ``checkpoints/`` or ``metrics.jsonl``), then each
    created parent that is empty. Best effort: an ``OSError`` stops it silently (the caller
    re-raises the call's own error). Returns whether ``workdir`` was removed."""
    checkpoints = os.path.join(workdir, "checkpoints")
    if (os.path.lexists(os.path.join(workdir, "metrics.jsonl"))
            or (os.path.isdir(checkpoints) and os.listdir(checkpoints))):
        return False
    with contextlib.suppress(OSError):  # best effort: the caller re-raises the call's error
        shutil.rmtree(workdir)
        path = os.path.abspath(workdir)
        while path != created and len(path) > len(created):
            path = os.path.dirname(path)
            os.rmdir(path)  # only an empty directory
    return not os.path.lexists(workdir)


WORKDIR_LOCK = ".train.lock"


@contextlib.contextmanager
def _workdir_lock(workdir: str):
    """Holds an exclusive ``flock`` on ``<workdir>/.train.lock`` (it holds the owner's pid)
    for the run: two runs on one workdir would interleave ``metrics.jsonl`` and save and delete
    each other's checkpoints. The kernel drops the lock when the process ends, however it ends,
    so a killed run leaves no stale lock. The file is deleted when the block ends (a finished
    run, a stop after a checkpoint, an error; ``records.pid_lock(remove=True)``, which keeps a
    second run from taking the lock while this one still writes): it is left only by a killed
    run, unlocked, and the next run takes it over.

    Raises:
      ConfigError: another process holds the lock, or ``workdir`` cannot be written (the lock
        file cannot be created; a read-only path), before anything is written.
    """
    path = os.path.join(workdir, WORKDIR_LOCK)
    stack = contextlib.ExitStack()
    try:
        stack.enter_context(records_lib.pid_lock(path, remove=True))
    except OSError as e:  # a read-only file system or directory, no permission
        raise config_lib.ConfigError(
            f"--workdir={workdir}: cannot write there ({e.strerror}: {e.filename})") from None
    except records_lib.LockHeld as e:
        raise config_lib.ConfigError(
            f"workdir {workdir} is in use by another run (pid {e.owner}; {path}): wait for "
            f"it to end or use another --workdir") from None
    with stack:
        yield


class _ClosedOutputGuard:
    """A text stream (``sys.stdout`` / ``sys.stderr``) that outlives its reader.

    When the reader of the process's output goes away (``train.py ... | tee log`` and a Ctrl-C
    that also ends ``tee``; a sweep killed while its trainers run), every later write raises
    ``BrokenPipeError``, and a run would stop at its next progress line without the checkpoint
    its stop path saves. This wrapper passes writes through until the first broken pipe, then
    points the stream's file descriptor at ``/dev/null`` (so the interpreter's last flush does
    not fail either), drops the rest and calls ``on_close`` once; ``console.log`` keeps every
    line.
    """

    def __init__(self, stream, on_close: Callable[[], None]):
        self._stream = stream
        self._on_close = on_close
        self.closed_by_reader = False

    def _broken(self) -> None:
        if self.closed_by_reader:
            return
        self.closed_by_reader = True
        with contextlib.suppress(OSError, ValueError, AttributeError):
            fd = self._stream.fileno()
            # stdout and stderr on the same pipe (`2>&1 | tee`): both go to /dev/null, so that
            # a line printed after the run (the binary's summary) does not fail either.
            same = [other for other in (1, 2) if other != fd and _same_open_file(fd, other)]
            null = os.open(os.devnull, os.O_WRONLY)
            try:
                for target in [fd] + same:
                    os.dup2(null, target)
            finally:
                os.close(null)
        self._on_close()

    def write(self, text):
        if self.closed_by_reader:
            return len(text)
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._broken()
            return len(text)

    def flush(self):
        if self.closed_by_reader:
            return
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._broken()

    def __getattr__(self, name):  # isatty, fileno, encoding, ...: the stream's own
        return getattr(self._stream, name)


def _same_open_file(fd: int, other: int) -> bool:
    """Whether the descriptors ``fd`` and ``other`` name the same open file (``False`` when
    ``other`` is not open)."""
    try:
        return os.path.sameopenfile(fd, other)
    except OSError:
        return False


@contextlib.contextmanager
def _survive_closed_output(note: Callable[[str], None]):
    """Runs the block with ``sys.stdout`` and ``sys.stderr`` in :class:`_ClosedOutputGuard` (the
    progress bar, created inside, writes through them too); ``note(stream name)`` is called
    once per stream whose reader went away. Restores both streams after the block."""
    saved = sys.stdout, sys.stderr
    sys.stdout = _ClosedOutputGuard(saved[0], lambda: note("standard output"))
    sys.stderr = _ClosedOutputGuard(saved[1], lambda: note("standard error"))
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def _train_and_evaluate_logged(config, workdir, print_fn, step, derived,
                               hold_signals_when_done=False):
    """:func:`train_and_evaluate` on process 0, under the workdir lock: the invocation recorded,
    the progress lines also in ``console.log``. A closed standard output or error (its reader
    gone: a pipe's ``tee`` ended by the same Ctrl-C, a killed sweep) does not stop the run: the
    lines go on in ``console.log`` only (:class:`_ClosedOutputGuard`), and a Ctrl-C still saves
    its checkpoint."""
    record_invocation(workdir, config)
    log_path = os.path.join(workdir, CONSOLE_LOG)
    with open(log_path, "a") as f:
        f.write(f"==== {_utc_now()}  {shlex.join(sys.argv)}\n")  # pastes back into a shell

    def logged(line: str) -> None:
        # (a print_fn holding its own stream, not sys.stdout, is past the guard below)
        with contextlib.suppress(BrokenPipeError):
            print_fn(line)
        with open(log_path, "a") as f:
            f.write(line + "\n")

    def closed(what: str) -> None:
        with contextlib.suppress(OSError):
            with open(log_path, "a") as f:
                f.write(f"note: {what} closed by its reader (a pipe's reader ended); the run "
                        f"goes on, its lines only in this file\n")

    try:
        with _survive_closed_output(closed):
            return _train_and_evaluate(config, workdir, logged, step, derived,
                                       hold_signals_when_done)
    except BaseException as e:
        with contextlib.suppress(OSError):  # a full disk: the error itself says it
            with open(log_path, "a") as f:
                f.write(f"stopped: {checkpoint_lib.describe_error(e)}\n")
        raise


# XLA's out-of-device-memory error (``RESOURCE_EXHAUSTED``), also when re-raised from.
_is_out_of_memory = checkpoint_lib.is_out_of_memory


def _xla_line(error: BaseException) -> str:
    """The first line of ``error``'s message (at most 200 characters), or its type's name."""
    text = str(error).strip()
    return text.splitlines()[0][:200] if text else type(error).__name__


_STATE_MEMORY_ADVICE = ("The parameters and optimizer state do not fit the devices as "
                        "sharded: free them (another process on them?) or shard the state over "
                        "more devices (--config.mesh.fsdp)")
_OUT_OF_MEMORY_ADVICE = ("lower data.batch_size or data.seq_len, or set a smaller "
                         "train.micro_batch_size (gradient accumulation; same batch per step)")


def _out_of_memory_error(error: BaseException, config: config_lib.ExperimentConfig,
                         where: str, checkpoint: Optional[str] = None, *,
                         note: Optional[str] = None) -> config_lib.ConfigError:
    """The one-line error for XLA's out-of-device-memory error ``error`` (the caller raises it).

    Args:
      error: the ``RESOURCE_EXHAUSTED`` error (:func:`_is_out_of_memory`); the first line of its
        message ends the text (at most 200 characters).
      config: the run's config (the options named).
      where: the step or phase, e.g. ``"the first training step"``, ``"train step 5"``,
        ``"evaluation at step 6"``.
      checkpoint: for a run that got past its first step or resumed, what running the same
        command again resumes from (:func:`_resume_point`); ``None`` for a fresh run's first
        step.
      note: said before the options, e.g. ``"it surfaced in evaluation at step 6: dispatch
        is asynchronous"``.

    Returns:
      A ``ConfigError`` naming ``where``, ``data.batch_size``, ``data.seq_len`` and
      ``train.micro_batch_size`` (the options to lower) and, when given, ``checkpoint``.
    """
    dcfg, micro = config.data, config.train.micro_batch_size
    first = _xla_line(error)
    options = (f"data.batch_size={dcfg.batch_size}, data.seq_len={dcfg.seq_len}, "
               f"train.micro_batch_size={micro}")
    if note:
        options = f"{note}; {options}"
    if checkpoint is None:
        return config_lib.ConfigError(
            f"out of device memory in {where} ({options}): {_OUT_OF_MEMORY_ADVICE}. XLA: "
            f"{first}")
    return config_lib.ConfigError(
        f"out of device memory in {where} ({options}); {checkpoint}. To fit: "
        f"{_OUT_OF_MEMORY_ADVICE}; a resumed run keeps data.batch_size and data.seq_len "
        f"(changing them needs a new --workdir). XLA: {first}")


def _resume_point(ckpt: checkpoint_lib.Checkpointer) -> str:
    """What running the same command again resumes from, after the run failed: the newest
    complete checkpoint (its step and path; pending asynchronous saves are waited for first,
    best effort), or a fresh start when there is none."""
    with contextlib.suppress(Exception):  # a failing wait leaves the previous complete step
        ckpt.wait()
    steps = checkpoint_lib.saved_steps(os.path.dirname(ckpt.directory))
    if not steps:
        return (f"no checkpoint was saved yet in {ckpt.directory}: running the same command "
                f"again starts from scratch")
    return (f"the last checkpoint, step {steps[-1]} in {ckpt.directory}/{steps[-1]}, is "
            f"intact: running the same command again resumes from it")


def _first_train_step(trainer: "Trainer", state: PyTree, batch: Batch,
                      config: config_lib.ExperimentConfig, *, resumed_from: int = -1,
                      resume_point: Optional[Callable[[], str]] = None):
    """The run's first :meth:`Trainer.train_step` (compiled here), waited for.

    Args:
      trainer: the run's trainer.
      state: the restored or initial state (donated).
      batch: the first batch.
      config: the run's config (the options an out-of-memory error names).
      resumed_from: the step of the checkpoint the run resumed from, -1 for a fresh start.
      resume_point: for a resumed run, what the same command resumes from
        (:func:`_resume_point`; called only on that error).

    Returns:
      ``(state, metrics)`` of :meth:`Trainer.train_step`, computed.

    Raises:
      ConfigError: the step ran out of device memory (XLA's ``RESOURCE_EXHAUSTED``), naming
        the options to lower: ``data.batch_size``, ``data.seq_len`` and
        ``train.micro_batch_size`` (gradient accumulation), and for a resumed run the step
        and the intact checkpoint it resumed from. Any other error propagates as is.
    """
    try:
        state, metrics = trainer.train_step(state, batch)
        jax.block_until_ready(metrics)
    except Exception as e:  # noqa: BLE001 - only XLA's out-of-memory error is translated
        if not _is_out_of_memory(e):
            raise
        if resumed_from < 0 or resume_point is None:
            raise _out_of_memory_error(e, config, "the first training step") from None
        raise _out_of_memory_error(
            e, config, f"step {resumed_from + 1}, the first after resuming from step "
            f"{resumed_from}", resume_point()) from None
    return state, metrics


def _first_failed_step(window: List[tuple]) -> tuple:
    """Which of the steps whose results were not read yet failed: ``window`` holds
    ``(step, loss, ...)`` of each, oldest first. A step that fails (out of device memory, say)
    leaves its outputs in error and the steps after it inherit that error, so the first loss
    that cannot be read is the failing step's; under asynchronous dispatch the error surfaces
    later (at a log line, an evaluation, a save or a later step's dispatch).

    Returns:
      ``(step, True)``: that step failed; ``(None, True)``: every loss was read, so the error
      is the operation's where it surfaced; ``(None, False)``: it could not be told.
    """
    for entry in window:
        try:
            jax.block_until_ready(entry[1])
        except Exception as e:  # noqa: BLE001 - any runtime error of that step
            return (entry[0], True) if _is_out_of_memory(e) else (None, False)
    return None, True


def _train_and_evaluate(config, workdir, print_fn, step, derived=None,
                        hold_signals_when_done=False):
    """:func:`train_and_evaluate` after the workdir is made and the invocation recorded."""
    tcfg = config.train
    # The run's config.json, read once for the resume checks here and below (nothing writes it
    # before _write_start_config). Read under the workdir lock, not taken over from
    # train_and_evaluate's check of the workdir's kind: that read came before the lock, and a
    # run that held the lock in between may have written the file since.
    read_saved_config = functools.lru_cache(maxsize=None)(
        functools.partial(config_lib.saved_training_config, workdir))
    # A resume with another model or data stream is refused before the data is read (minutes
    # for a large corpus); the check runs again below, where it reports the changed options.
    _check_resume_compatible(workdir, config,
                             has_checkpoint=bool(checkpoint_lib.saved_steps(workdir)),
                             read_saved=read_saved_config)

    # The data files' contents (a corpus rebuilt at the same path), likewise before the read;
    # computed once, and only when compared or written (it reads up to 4 MiB per file).
    @functools.lru_cache(maxsize=None)
    def fingerprints():
        try:
            return data_fingerprints(config.data)
        except ValueError as e:  # a malformed token-shard manifest: one line, as build_datasets'
            raise config_lib.ConfigError(f"data: {e}") from e

    # The saved record, likewise read once: compared here, its version consulted again before
    # the record is (re)written below.
    saved_fingerprints = functools.lru_cache(maxsize=None)(
        functools.partial(_read_json_record, os.path.join(workdir, DATA_FINGERPRINT)))
    # A file named twice is read once; a run that may have read it twice is not resumed.
    check_duplicate_files(workdir, config.data,
                          has_checkpoint=bool(checkpoint_lib.saved_steps(workdir)),
                          read_saved=saved_fingerprints, print_fn=print_fn,
                          consequence="resuming would train on another document stream. Use "
                          "a new --workdir.")
    _check_data_unchanged(workdir, fingerprints,
                          has_checkpoint=bool(checkpoint_lib.saved_steps(workdir)),
                          read_saved=saved_fingerprints)

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

    # -- mesh, model, optimizer, checkpoint order ----------------------------------------------
    mesh = make_mesh(config)
    if mesh is not None:
        print_fn(f"mesh: {dict(mesh.shape)} over {jax.device_count()} devices "
                 f"({jax.process_count()} processes)")
    ckpt = checkpoint_lib.Checkpointer(workdir, keep=tcfg.keep_checkpoints,
                                       keep_best=tcfg.keep_best_checkpoint,
                                       async_save=tcfg.async_checkpoints, cleanup_tmp=True)
    try:
        latest = ckpt.latest_step()
        if step is not None and step not in ckpt.all_steps():
            ckpt.restore_step(step, None)  # raises FileNotFoundError listing the steps
        changed = _check_resume_compatible(workdir, config, has_checkpoint=latest is not None,
                                           derived=derived, read_saved=read_saved_config)
        free = (_resume_free_changes(workdir, config, read_saved=read_saved_config)
                if latest is not None else [])
        if free and jax.process_index() == 0:
            print_fn(f"note: resuming with {', '.join(free)}: the same parameters, computed "
                     f"another way (config.json keeps the start's settings; invocations.jsonl "
                     f"records this command's).")
        if changed and jax.process_index() == 0:
            print_fn(f"warning: resuming with optimizer/schedule options other than the run's "
                     f"start ({', '.join(changed)}; the start's are in config.json): the "
                     f"learning-rate schedule is recomputed for them from the resumed step on, "
                     f"so the rate may jump there.")
        trainer = Trainer(config, mesh)
        train_iter = datasets.train_iter
        chosen_step, newest_saved = step, latest  # for the metrics.jsonl note below
        if latest is not None:
            writer = jax.process_index() == 0
            try:
                if step is None:
                    latest, state = ckpt.restore_latest(trainer.abstract_state(), train_iter,
                                                        report=print_fn, set_aside=writer)
                else:
                    state = ckpt.restore_step(step, trainer.abstract_state(), train_iter)
            except checkpoint_lib.RestoreOutOfMemoryError as e:  # the state does not fit
                raise config_lib.ConfigError(
                    f"{str(e).rstrip('.')}. {_STATE_MEMORY_ADVICE}") from None
            if step is not None:
                latest = step
                # The steps after it would collide with this run's saves: kept, renamed.
                for newer in sorted(s for s in ckpt.all_steps() if s > step):
                    name = ckpt.set_aside(newer, f"after-step-{step}") if writer else "?"
                    print_fn(f"step {newer}: set aside as {name} (resuming from --step {step})")
            print_fn(f"Resuming from the checkpoint at step {latest} in {ckpt.directory} "
                     f"(data iterator restored)")
            resumed_from = latest
        else:
            try:
                state = trainer.init_state(tcfg.seed)
            except Exception as e:  # noqa: BLE001 - only XLA's out-of-memory error is translated
                if not _is_out_of_memory(e):
                    raise
                raise config_lib.ConfigError(
                    f"out of device memory creating the parameters and optimizer state. "
                    f"{_STATE_MEMORY_ADVICE}. XLA: {_xla_line(e)}") from None
            print_fn(f"No checkpoint in {ckpt.directory}: starting from scratch")
            resumed_from = -1
        _write_start_config(workdir, config, has_checkpoint=latest is not None)
        _write_data_fingerprint(workdir, fingerprints, has_checkpoint=latest is not None,
                                read_saved=saved_fingerprints)
        # A finished run (its final evaluation recorded for the restored step): nothing to do.
        # Evaluating again appended a second final val_loss record.
        finished = (finished_run(workdir, config) if resumed_from >= tcfg.total_steps
                    else None)
    except BaseException:
        # A refused resume (or a failed restore) ends the run here: close the manager first,
        # so that its background threads do not outlive the interpreter's shutdown (orbax
        # then printed "cannot schedule new futures after interpreter shutdown").
        ckpt.close()
        raise
    if finished is not None:
        ckpt.close()
        print_fn(f"run already finished at step {resumed_from} (train.total_steps="
                 f"{tcfg.total_steps}; final val_loss {finished['val_loss']:.4f}, checkpoint "
                 f"{ckpt.directory}/{resumed_from}): nothing to do. Raise "
                 f"--config.train.total_steps to train on.")
        return dict(finished, unigram_entropy=stats.unigram_entropy)
    n_params = sum(x.size for x in jax.tree_util.tree_leaves(state["params"]))
    print_fn(f"model: {n_params:,} parameters, layers {list(config.model.layer_pattern)}, "
             f"d_model {config.model.d_model}, backend {jax.default_backend()}")
    ocfg = config.optim
    print_fn(f"optimizer: {ocfg.name}, peak lr {ocfg.learning_rate:g}, {ocfg.schedule} schedule, "
             f"warmup {ocfg.warmup_steps}, {config.train.total_steps} steps")
    warning = schedule_warning(ocfg, config.train.total_steps)
    if warning:
        print_fn(f"warning: {warning}")

    metrics_writer = MetricsWriter(workdir, tensorboard=tcfg.tensorboard)
    step = int(state["step"])
    if metrics_writer.enabled:
        # Records a hard-stopped run logged after this step: logged again from here on.
        dropped, discarded = checkpoint_lib.drop_records_after(metrics_writer.path, step)
        if dropped:
            if chosen_step is not None:
                why = (f"logged by the run that went on past step {step}; --step {step} "
                       f"resumes from there, so those steps run again and are logged anew")
            elif newest_saved is not None and newest_saved > step:
                why = ("logged by the run whose newer checkpoint was unreadable and set "
                       "aside; those steps run again and are logged anew")
            else:
                why = ("logged after the restored checkpoint by a stopped run; logged again "
                       "now")
            print_fn(f"metrics.jsonl: dropped {dropped} records after step {step} ({why}), "
                     f"kept in {discarded}")
    tokens_per_step = config.data.batch_size * config.data.seq_len
    flops_per_token = flops_lib.flops_per_token(config.model, state["params"],
                                                config.data.seq_len)
    peak = flops_lib.peak_flops_per_device(override=tcfg.peak_flops_per_device)
    window_losses = []
    last_train_loss = float("nan")
    val_loss = float("nan")
    skipped = 0

    def run_eval(step, should_stop=None):
        # ``should_stop``: the periodic evaluation ends early on a stop request (a preemption's
        # grace period is short; the validation set may take minutes): nothing is recorded.
        try:
            result = trainer.evaluate_counts(state["params"], datasets.val_batches,
                                             should_stop=should_stop)
        except EvaluationStopped as stopped:
            total = len(datasets.val_batches) if hasattr(datasets.val_batches, "__len__") else "?"
            print_fn(f"the evaluation at step {step} stopped after {stopped.batches_done} of "
                     f"{total} validation batches ({watcher.signal_name}); not recorded")
            return None
        loss = result.loss
        counts = {}
        if result.nonfinite:
            counts["val_nonfinite_tokens"] = result.nonfinite
            print_fn(f"warning: step {step}: {result.nonfinite} of {int(result.tokens)} "
                     f"validation tokens have a NaN/inf loss (val_loss {loss})")
        if result.nonfinite_padding:
            counts["val_nonfinite_padding"] = result.nonfinite_padding
            print_fn(f"warning: step {step}: {result.nonfinite_padding} padding positions "
                     f"(weight 0) of the validation batches have a NaN/inf loss; they are left "
                     f"out of val_loss")
        metrics_writer.write(step, val_loss=loss, **counts)
        if metrics_writer.enabled:
            plot_losses(workdir)
        return loss

    # A second Ctrl-C, or a SIGTERM or SIGHUP outside the watched loop, while a checkpoint is
    # being written waits for the write to complete (then stops, naming it).
    watcher = PreemptionWatcher(tcfg.save_on_preemption)

    def save(step, metrics=None):
        nonlocal phase
        phase = f"the checkpoint save at step {step}"
        with watcher.defer_signals(f"the checkpoint at step {step} ({ckpt.directory}/{step})",
                                   finish=ckpt.wait):
            ckpt.save(step, state, train_iter, metrics=metrics)
        return step

    def wait_for_save(step):
        # The asynchronous write of the checkpoint at ``step`` completed, signals deferred.
        with watcher.defer_signals(f"the checkpoint at step {step} ({ckpt.directory}/{step})"):
            ckpt.wait()

    bar = tqdm.tqdm(total=tcfg.total_steps, initial=step, unit="step", dynamic_ncols=True,
                    disable=None if jax.process_index() == 0 else True)
    t_last = time.perf_counter()
    steps_since = 0
    paused = 0.0  # seconds of evaluation and checkpointing inside the current logging window
    first_step = True
    last_saved = resumed_from
    preempted = False
    stop_at = tcfg.total_steps
    if tcfg.max_steps_per_run is not None:
        stop_at = min(stop_at, step + tcfg.max_steps_per_run)
    # Where an out-of-device-memory error surfaced. Dispatch is asynchronous: a train step's
    # error surfaces when its results are read (its log line, an evaluation or a save, a later
    # step's dispatch), which can be a few steps after the step that ran out; its one-line
    # message names that step (_first_failed_step, from window_losses: the steps not read yet).
    phase = "training"
    try:
        with watcher:
            if _evaluation_missed(metrics_writer, resumed_from, tcfg):
                # The stopped run's evaluation at this step was cut (a SIGTERM in it) and not
                # recorded: run it now, so the curve has every evaluation step.
                phase = f"evaluation at step {step}"
                loss_now = run_eval(step, lambda: watcher.requested)
                if loss_now is not None:
                    val_loss = loss_now
                    print_fn(f"step {step:5d}  val_loss {val_loss:.4f} (the evaluation the "
                             f"stopped run did not finish)")
            while step < stop_at:
                phase = f"train step {step + 1}"
                batch = next(train_iter)
                if first_step:  # compiles; out of device memory here: one line, what to lower
                    state, metrics = _first_train_step(
                        trainer, state, batch, config, resumed_from=resumed_from,
                        resume_point=lambda: _resume_point(ckpt))
                else:
                    state, metrics = trainer.train_step(state, batch)
                step += 1
                if tcfg.nonfinite_policy == "stop" and not bool(metrics["finite"]):
                    # The step kept the previous parameters: save them and stop.
                    save(step)
                    wait_for_save(step)
                    # The steps before it may have diverged already (finite, but no longer
                    # good): the checkpoint with the best validation loss is kept (keep_best).
                    best = ckpt.best_step()
                    best = (f" The checkpoint with the lowest validation loss is step {best} "
                            f"(--step={best} resumes from it)." if best not in (None, step)
                            else "")
                    raise NonFiniteError(
                        f"step {step}: non-finite loss ({float(metrics['loss'])}) or gradient "
                        f"norm ({float(metrics['grad_norm'])}); train.nonfinite_policy='stop'. "
                        f"Saved the last good parameters and optimizer state at step {step} in "
                        f"{ckpt.directory} (the data iterator is past the bad batch, so a "
                        f"resumed run skips it); set train.nonfinite_policy='skip' to continue "
                        f"past such steps.{best}")
                if first_step:
                    # Exclude the compilation from the throughput window.
                    jax.block_until_ready(metrics)
                    t_last, steps_since, first_step = time.perf_counter(), 0, False
                    paused = 0.0
                else:
                    steps_since += 1
                window_losses.append((step, metrics["loss"], metrics["finite"]))
                if step % tcfg.log_every == 0 or step == stop_at:
                    _, losses, finite = (np.asarray(x)
                                         for x in zip(*jax.device_get(window_losses)))
                    skipped += int(np.sum(~finite))
                    loss = float(np.mean(losses[finite])) if finite.any() else float("nan")
                    now = time.perf_counter()
                    step_time = tok_s = mfu = None
                    if steps_since:
                        step_time = (now - t_last - paused) / steps_since
                        tok_s = tokens_per_step / step_time
                        if peak:
                            mfu = tok_s * flops_per_token / (peak * jax.device_count())
                    t_last, steps_since, paused = now, 0, 0.0
                    last_train_loss = loss
                    window_losses = []
                    postfix = {"loss": f"{loss:.3f}"}
                    if tok_s:
                        postfix["tok_s"] = f"{tok_s:,.0f}"
                    bar.set_postfix(**postfix)
                    metrics_writer.write(step, train_loss=loss, grad_norm=metrics["grad_norm"],
                                         lr=metrics["lr"], tokens_per_sec=tok_s,
                                         step_time=step_time, mfu=mfu, skipped_steps=skipped)
                    speed = "" if tok_s is None else f"  {tok_s:,.0f} tok/s  {step_time:.3f} s/step"
                    speed += "" if mfu is None else f"  MFU {100 * mfu:.1f}%"
                    skip_text = f"  skipped {skipped}" if skipped else ""
                    print_fn(f"step {step:5d}  train_loss {loss:.4f}  lr "
                             f"{float(metrics['lr']):.2e}  grad_norm "
                             f"{float(metrics['grad_norm']):.3f}{speed}{skip_text}")
                bar.update(1)
                eval_now = step % tcfg.eval_every == 0 and step != tcfg.total_steps
                save_now = step % tcfg.checkpoint_every == 0 and step != tcfg.total_steps
                pause = eval_now or save_now
                if pause:
                    # Evaluation and checkpointing are not training: their time stays out of
                    # the throughput window (tokens/s, step time, MFU). The steps queued
                    # before them are waited for first, so their time stays in.
                    jax.block_until_ready(metrics)
                    pause_start = time.perf_counter()
                if eval_now:
                    phase = f"evaluation at step {step}"
                    # A SIGTERM / SIGHUP / Ctrl-C during it ends it (single process: the others
                    # of a multi-process run must run the same batches).
                    loss_now = run_eval(step, None if jax.process_count() > 1
                                        else lambda: watcher.requested)
                    if loss_now is None:
                        eval_now = False
                    else:
                        val_loss = loss_now
                        print_fn(f"step {step:5d}  val_loss {val_loss:.4f}")
                if save_now:
                    last_saved = save(step, {"val_loss": val_loss} if eval_now else None)
                if pause:
                    paused += time.perf_counter() - pause_start
                preempt = watcher.requested or (
                    jax.process_count() > 1 and ckpt.reached_preemption(step))
                if preempt and watcher.signal_name is None and watcher.multi_process:
                    watcher.signal_name = "SIGTERM"  # another process's, or the service's
                if preempt and tcfg.save_on_preemption:
                    preempted = True
                    break
        bar.close()

        if step < tcfg.total_steps:
            if last_saved != step:
                save(step)
            wait_for_save(step)
            if preempted:
                why = {"SIGINT": "Ctrl-C, SIGINT", "SIGTERM": "SIGTERM (preemption)",
                       "SIGHUP": "SIGHUP (the terminal or ssh session closed)"}.get(
                    watcher.signal_name, "a preemption notice")
            else:
                why = f"train.max_steps_per_run={tcfg.max_steps_per_run}"
            print_fn(f"Stopping at step {step} of {tcfg.total_steps} ({why}); checkpoint "
                     f"saved, run again to resume.")
            return {"train_loss": last_train_loss, "val_loss": val_loss,
                    "unigram_entropy": stats.unigram_entropy, "step": step,
                    "resumed_from": resumed_from, "preempted": preempted,
                    # a multi-process run's preemption notice is named SIGTERM above
                    "stop_signal": (watcher.signal_name or "SIGTERM") if preempted else None}
        if resumed_from >= tcfg.total_steps:
            print_fn(f"Training was already complete at step {step} (train.total_steps="
                     f"{tcfg.total_steps}); evaluating the restored model. Raise "
                     f"--config.train.total_steps to continue training (the LR schedule is "
                     f"then recomputed for the new total).")
        phase = f"the final evaluation at step {step}"
        try:
            # The watcher is gone: a signal here stops the evaluation (minutes on a large
            # validation set) and saves the trained state first, instead of ending the process
            # with it unsaved (a preemption then cost the steps since the last checkpoint).
            # (Not in a multi-process run: one process would stop alone; a SIGTERM there only
            # notifies JAX's preemption service, and the run completes.)
            with _stop_on_signals(tcfg.save_on_preemption and not watcher.multi_process):
                if preempted:  # a stop asked for in the last step: no evaluation first
                    raise _StopRequested(signal.Signals[watcher.signal_name]
                                         if watcher.signal_name else signal.SIGTERM)
                val_loss = run_eval(step)
        except _StopRequested as stop:
            if last_saved != step:
                save(step)
            wait_for_save(step)
            name = ("Ctrl-C" if stop.signum == signal.SIGINT
                    else signal.Signals(stop.signum).name)
            text = (f"the checkpoint at step {step} ({ckpt.directory}/{step}) is complete; "
                    f"stopped there on {name}, {'before' if preempted else 'in'} the final "
                    f"evaluation: run the same command again to evaluate it")
            if stop.signum == signal.SIGINT:
                raise KeyboardInterrupt(text) from None
            raise Terminated(text, stop.signum) from None
        if last_saved != step:
            save(step, {"val_loss": val_loss})
        wait_for_save(step)  # before the finally's close: a SIGTERM (SIGHUP) there stops
    except Exception as e:  # noqa: BLE001 - out of device memory and failed writes translated
        if isinstance(e, checkpoint_lib.CheckpointWriteError) or _is_workdir_write_error(
                e, workdir):
            # A full disk, no permission, an I/O error: one line, what the run resumes from.
            with watcher.defer_signals("the pending checkpoint writes", raise_after=False):
                resume_point = _resume_point(ckpt)
            if isinstance(e, checkpoint_lib.CheckpointWriteError):
                raise checkpoint_lib.CheckpointWriteError(
                    f"{e}; {resume_point} (the partial write is removed)", e.step) from None
            raise WorkdirWriteError(f"cannot write {e.filename} ({e.strerror}) in {phase}; "
                                    f"{resume_point}") from None
        # The first step's is translated by _first_train_step (a ConfigError, not one of these).
        if not _is_out_of_memory(e):
            raise
        # Nothing is saved (the donated state may be gone); what was written stays as it is.
        # Dispatch is asynchronous: the error surfaced in ``phase``; the step that failed is
        # the first of the steps not read yet whose loss cannot be read.
        failed, known = _first_failed_step(window_losses)
        where, note = phase, None
        if failed is not None:
            where = f"train step {failed}"
            if phase != where:
                note = f"it surfaced in {phase}: dispatch is asynchronous"
        elif not known:
            where = f"{phase} or a train step after step {window_losses[0][0] - 1}"
            note = "dispatch is asynchronous: it surfaced there"
        with watcher.defer_signals("the pending checkpoint writes", raise_after=False):
            resume_point = _resume_point(ckpt)
        raise _out_of_memory_error(e, config, where, resume_point, note=note) from None
    finally:
        bar.close()
        with watcher.defer_signals("the pending checkpoint writes", raise_after=False):
            ckpt.close()
        metrics_writer.close()
    if hold_signals_when_done and tcfg.save_on_preemption and jax.process_count() == 1:
        _note_signals_when_done(step)  # the run is complete: a late SIGTERM only says so
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
            "resumed_from": resumed_from, "preempted": False, "stop_signal": None}


def stop_exit_status(result: Dict[str, Any]) -> int:
    """The exit status of a training command whose :func:`train_and_evaluate` returned
    ``result``: 0 when it ran its steps (``train.total_steps``, or the
    ``train.max_steps_per_run`` it was asked to stop at), else the shell's status for the
    signal that stopped it early after a checkpoint, ``128 + signal``: 130 for Ctrl-C (SIGINT),
    143 for SIGTERM (or a multi-process preemption notice), 129 for SIGHUP, as
    :attr:`Terminated.exit_status`; the sweep counts none of them as a failed run
    (``lattn_jax.sweep``)."""
    if not result.get("preempted"):
        return 0
    return 128 + int(signal.Signals[result.get("stop_signal") or "SIGTERM"])


def _silent(_: str) -> None:
    """``print_fn`` of processes other than 0."""
