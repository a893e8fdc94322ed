"""HALO training stages and the calibration of ``a`` (arXiv 2601.22156; spec §3, §3.7, §7).

* Stage 1 (:func:`run_stage1`, spec §3.1): every layer gets a Lightning student initialised from
  its attention (:func:`lattn_jax.halo.hypenet.lightning_from_attention`). The teacher runs
  unchanged; each student reads the teacher's normalised input of its layer and is trained to
  reproduce the teacher attention output (after ``o_proj``) with :func:`losses.layer_mse`. All
  layers train in parallel; only the students' parameters are trainable.
* Stage 2 (:func:`run_stage2`, spec §3.3): the HypeNet student (Stage-1 Lightning layers at the
  recurrent positions, the teacher's attention, NoPE + gate, at the selected ones) is trained end
  to end on ``KL(teacher || student)`` at temperature 1 (:func:`losses.forward_kl`).
* Stage 3 (:func:`run_stage3`, spec §3.4): next-token cross-entropy on long windows;
  optionally (``kl_weight > 0``, not in HALO) plus the teacher's forward KL on each
  window's first ``kl_len`` positions (:func:`stage3_loss_fn`).
* :func:`calibrate_logit_scaling` (spec §1.6, §3.7): the validation loss of the final model for
  each candidate ``a`` of ``s_t = log_a(t + a)``, the best one chosen.

Every stage trains through :func:`train_loop`: ``optim.make_optimizer`` (AdamW, clipping, warm-up
+ cosine), a jitted step, and :class:`lattn_jax.checkpoint.Checkpointer` in ``workdir``; a stage
run again in the same ``workdir`` resumes from its newest checkpoint (and the grain iterator's
position). Master weights and moments are fp32 (spec §6 item 3: the original is pure bf16).
"""

import dataclasses
import math
import os
import time
from typing import (Any, Callable, Dict, Iterator, List, Mapping, NamedTuple, Optional,
                    Sequence, Tuple)

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from lattn_jax import checkpoint as checkpoint_lib
from lattn_jax import config as config_lib
from lattn_jax import flops as flops_lib
from lattn_jax import model as model_lib
from lattn_jax import optim
from lattn_jax import records
from lattn_jax.halo import hypenet
from lattn_jax.halo import loaders
from lattn_jax.halo import losses
from lattn_jax.mixers import lightning
from lattn_jax.typing import PyTree

Batch = Dict[str, Any]


class ModelFn:
    """Rebuilds an NNX module of a fixed config from a pure-dict parameter tree (under jit).

    Args:
      make: ``rngs -> nnx.Module`` constructor (run only under ``nnx.eval_shape``).
    """

    def __init__(self, make: Callable[[nnx.Rngs], nnx.Module]):
        abstract = nnx.eval_shape(lambda: make(nnx.Rngs(0)))
        self.graphdef, self._abstract = nnx.split(abstract, nnx.Param)

    def __call__(self, params: PyTree) -> nnx.Module:
        state = jax.tree_util.tree_map(lambda x: x, self._abstract)
        nnx.replace_by_pure_dict(state, params)
        return nnx.merge(self.graphdef, state)


def language_model_fn(cfg: config_lib.ModelConfig) -> ModelFn:
    """:class:`ModelFn` of ``LanguageModel(cfg)``."""
    return ModelFn(lambda rngs: model_lib.LanguageModel(cfg, rngs=rngs))


def random_teacher(cfg: config_lib.ModelConfig, seed: int = 0) -> PyTree:
    """Randomly initialised teacher params (for tiny CPU runs and tests; no download)."""
    model = model_lib.LanguageModel(cfg, rngs=nnx.Rngs(seed))
    return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def _write_metrics(workdir: str, record: Mapping[str, Any]) -> None:
    records.append_record(os.path.join(workdir, "metrics.jsonl"),
                          {k: (float(v) if isinstance(v, (np.floating, jax.Array)) else v)
                           for k, v in record.items()})


def _micro_batches(batch: Batch, n: int) -> Batch:
    """``[B, ...]`` arrays -> ``[n, B / n, ...]`` (micro-batch ``i`` takes rows ``i, i + n,
    ...``)."""
    def split(x):
        x = x.reshape((x.shape[0] // n, n) + x.shape[1:])
        return jnp.moveaxis(x, 1, 0)
    return {k: split(v) for k, v in batch.items()}


def _block(tree) -> None:
    jax.block_until_ready(tree)


class TrainStep(NamedTuple):
    """What :func:`make_train_step` builds (the pieces of :func:`train_loop`'s step).

    Attributes:
      tx: the optimizer (``optim.make_optimizer``).
      schedule: the learning-rate schedule, ``step -> lr``.
      init_state: ``params -> {"params", "opt_state", "step" (int32 0)}``.
      loss_and_grads: ``(params, frozen, batch) -> (fp32 loss, grads)`` (micro-batched).
      step: the jitted ``(state, frozen, batch) -> (state, {"loss", "grad_norm", "lr", ...})``,
        plus the loss's terms when ``loss_fn`` has ``with_terms`` (:func:`make_train_step`).
    """
    tx: optax.GradientTransformation
    schedule: Callable[[jax.Array], jax.Array]
    init_state: Callable[[PyTree], PyTree]
    loss_and_grads: Callable[[PyTree, PyTree, Batch], Any]
    step: Callable[[PyTree, PyTree, Batch], Any]


def scale_updates(scales: PyTree) -> optax.GradientTransformation:
    """Multiplies each leaf's update by its float in ``scales`` (a tree of Python floats with
    the params' structure): after AdamW with weight decay 0, a per-group learning rate
    ``lr x scale`` (the schedule's shape is shared). ``optax.multi_transform`` of one
    ``optax.scale`` per distinct value."""
    values = sorted(set(jax.tree_util.tree_leaves(scales)))
    return optax.multi_transform({repr(v): optax.scale(v) for v in values},
                                 jax.tree_util.tree_map(repr, scales))


def check_copied_lr_scale(copied_lr_scale: Any) -> None:
    """Raises ``ValueError`` unless ``copied_lr_scale`` (Stage 2's
    :func:`stage2_update_scales`) is a finite number > 0."""
    if isinstance(copied_lr_scale, bool) or not isinstance(copied_lr_scale, (int, float)) \
            or not 0 < copied_lr_scale < float("inf"):
        raise ValueError(f"copied_lr_scale must be a finite number > 0, got {copied_lr_scale!r}")


def stage2_update_scales(student_cfg: config_lib.ModelConfig, params: PyTree,
                         copied_lr_scale: float) -> PyTree:
    """Per-leaf update scales of Stage 2 with two learning-rate groups (outside the spec, which
    trains the whole student at one rate, §3.3): 1.0 for the Lightning mixers
    (``blocks[i]["mixer"]`` of every ``"lightning"`` layer, trained only since Stage 1), and
    ``copied_lr_scale`` for everything the student copied from the teacher (embeddings and
    head, norms, MLPs, the attention layers; the attention output gate, new in Stage 2, sits in
    the attention's fused ``qkv_proj`` kernel and goes with it).

    Args:
      student_cfg: the HypeNet config (its ``layer_pattern``).
      params: the student's pure-dict params (any leaf type; only the structure is read).
      copied_lr_scale: a finite float > 0.

    Returns:
      A tree of Python floats with ``params``' structure.

    Raises:
      ValueError: ``copied_lr_scale`` not a finite number > 0.
    """
    check_copied_lr_scale(copied_lr_scale)
    lightning_layers = {str(i) for i, name in enumerate(student_cfg.layer_pattern)
                        if name == "lightning"}

    def scale(path, leaf):
        del leaf
        names = [optim._key_name(k) for k in path]
        new = (len(names) >= 3 and names[0] == "blocks" and names[1] in lightning_layers
               and names[2] == "mixer")
        return 1.0 if new else float(copied_lr_scale)

    return jax.tree_util.tree_map_with_path(scale, params)


def make_train_step(loss_fn: Callable[[PyTree, PyTree, Batch], jax.Array],
                    optim_cfg: config_lib.OptimConfig, total_steps: int, *,
                    micro_batch_size: Optional[int] = None,
                    update_scales: Optional[PyTree] = None) -> TrainStep:
    """The jitted training step of :func:`train_loop` (and of ``benchmarks/profile_halo_step.py``,
    which times it).

    ``step(state, frozen, batch)``: ``loss, grads = loss_and_grads(params, frozen, batch)``
    (one pass, or the mean over ``B / micro_batch_size`` micro-batches in a ``lax.scan``,
    gradients accumulated in fp32 and cast back to the params' dtype), then
    ``tx.update`` + ``optax.apply_updates`` and ``step + 1``; metrics ``loss``,
    ``grad_norm = optax.global_norm(grads)`` and ``lr = schedule(step)``, and, when ``loss_fn``
    has an attribute ``with_terms`` (``(params, frozen, batch) -> (loss, {name: fp32 scalar})``,
    the same loss with its parts, e.g. Stage 3's ``ce`` and ``kl``), those parts (the mean over
    micro-batches, as the loss). The state is not donated.

    Args:
      loss_fn: ``(params, frozen, batch) -> fp32 scalar``, differentiated w.r.t. ``params``.
      optim_cfg: the optimizer (``optim.make_optimizer``, ``optim.learning_rate_schedule``).
      total_steps: the schedule's length.
      micro_batch_size: rows per forward/backward pass (``None``: the whole batch).
      update_scales: optional tree of floats with the params' structure, each leaf's update
        multiplied by its float after the optimizer (:func:`scale_updates`; per-group learning
        rates, e.g. :func:`stage2_update_scales`). ``None``: the optimizer alone (its state
        then has the same structure as before this option existed).

    Returns:
      A :class:`TrainStep`. Its ``loss_and_grads`` raises ``ValueError`` (at trace time) when
      ``micro_batch_size`` does not divide the batch's rows.
    """
    tx = optim.make_optimizer(optim_cfg, total_steps)
    if update_scales is not None:
        tx = optax.chain(tx, scale_updates(update_scales))
    schedule = optim.learning_rate_schedule(optim_cfg, total_steps)

    def init_state(params):
        return {"params": params, "opt_state": tx.init(params), "step": jnp.zeros((), jnp.int32)}

    with_terms = getattr(loss_fn, "with_terms", None)
    if with_terms is None:
        def with_terms(params, frozen, batch):
            return loss_fn(params, frozen, batch), {}
    grad_fn = jax.value_and_grad(with_terms, has_aux=True)

    def loss_terms_and_grads(params, frozen, batch):
        rows = batch["inputs"].shape[0]
        if micro_batch_size is None or micro_batch_size >= rows:
            (loss, terms), grads = grad_fn(params, frozen, batch)
            return loss, terms, grads
        if rows % micro_batch_size:
            raise ValueError(f"micro_batch_size={micro_batch_size} does not divide the batch "
                             f"of {rows} rows")
        n = rows // micro_batch_size

        def body(carry, micro):
            loss, terms, grads = carry
            (loss_i, terms_i), grads_i = grad_fn(params, frozen, micro)
            grads = jax.tree_util.tree_map(lambda a, g: a + g.astype(a.dtype), grads, grads_i)
            terms = jax.tree_util.tree_map(lambda a, t: a + t.astype(jnp.float32), terms,
                                           terms_i)
            return (loss + loss_i, terms, grads), None

        zeros = jax.tree_util.tree_map(lambda p: jnp.zeros(p.shape, jnp.promote_types(
            p.dtype, jnp.float32)), params)
        first = _micro_batches(batch, n)
        term_shapes = jax.eval_shape(with_terms, params, frozen,
                                     jax.tree_util.tree_map(lambda x: x[0], first))[1]
        term_zeros = jax.tree_util.tree_map(lambda t: jnp.zeros(t.shape, jnp.float32),
                                            term_shapes)
        (loss, terms, grads), _ = jax.lax.scan(
            body, (jnp.zeros((), jnp.float32), term_zeros, zeros), first)
        return (loss / n, jax.tree_util.tree_map(lambda t: t / n, terms),
                jax.tree_util.tree_map(lambda g, p: (g / n).astype(p.dtype), grads, params))

    def loss_and_grads(params, frozen, batch):
        loss, _, grads = loss_terms_and_grads(params, frozen, batch)
        return loss, grads

    @jax.jit
    def step_fn(state, frozen, batch):
        loss, terms, grads = loss_terms_and_grads(state["params"], frozen, batch)
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        metrics = {**terms, "loss": loss, "grad_norm": optax.global_norm(grads),
                   "lr": schedule(state["step"])}
        return {"params": params, "opt_state": opt_state, "step": state["step"] + 1}, metrics

    return TrainStep(tx=tx, schedule=schedule, init_state=init_state,
                     loss_and_grads=loss_and_grads, step=step_fn)


def train_loop(*, workdir: str, init_params: PyTree,
               loss_fn: Callable[[PyTree, PyTree, Batch], jax.Array],
               optim_cfg: config_lib.OptimConfig, train_cfg: config_lib.TrainConfig,
               batches: Iterator[Batch], frozen: PyTree = None,
               print_fn: Callable[[str], None] = print,
               deadline: Optional[float] = None, micro_batch_size: Optional[int] = None,
               flops_per_token: Optional[float] = None,
               update_scales: Optional[PyTree] = None) -> Dict[str, Any]:
    """Trains ``init_params`` on ``loss_fn``, resuming from ``<workdir>/checkpoints``.

    Resume order: the newest checkpoint in ``workdir`` (params, optimizer state, step and, for a
    grain iterator, its position), else ``init_params`` at step 0. On a resume, the
    ``metrics.jsonl`` records of steps after the checkpoint (logged by a run stopped after it)
    are dropped (kept in ``metrics.jsonl.discarded-<step>``), since those steps run again. The
    step's loss stays on the device until a log step, so the host never waits on the device
    between log steps (the next batch is read and copied while the device runs the current
    step).

    Throughput: every log line reports tokens/s over the steps since the previous log line
    (the first step, which compiles, is timed on its own as ``first_step_s``), and, with
    ``flops_per_token``, the model FLOP utilisation ``MFU = flops_per_token x tokens/s /
    peak`` (peak: :func:`lattn_jax.flops.peak_flops_per_device`, the bf16 dense rate). Every
    invocation appends its totals to ``<workdir>/throughput.jsonl``.

    Args:
      workdir: the stage's directory (checkpoints, ``metrics.jsonl``, ``throughput.jsonl``).
      init_params: the trainable pure-dict parameters at step 0.
      loss_fn: ``(params, frozen, batch) -> fp32 scalar`` (a token mean),
        differentiated w.r.t. ``params``.
      optim_cfg: the optimizer (``optim.make_optimizer``; HALO: AdamW (0.9, 0.95), wd 0,
        clip 1, warm-up 50, cosine to ``min_lr_ratio``).
      train_cfg: ``total_steps``, ``checkpoint_every``, ``keep_checkpoints``, ``log_every``,
        ``max_steps_per_run``.
      batches: an iterator of batches (a grain ``DatasetIterator`` is checkpointed too).
      frozen: a pytree passed unchanged to ``loss_fn`` (the teacher's params).
      print_fn: progress lines.
      deadline: a ``time.time()`` value (or an object comparing as one, as
        ``experiments/halo_pipeline.py``'s); the first step that ends after it is the last of
        this run (checkpointed, resumable), as with ``max_steps_per_run``. Its ``stop_reason``
        attribute, where it has one (e.g. ``"stopped by SIGTERM"``; ``None``: the deadline),
        names what stopped the run in the stop line (default ``"deadline reached"``).
      micro_batch_size: rows per forward/backward pass (gradient accumulation over
        ``B / micro_batch_size`` passes in a ``lax.scan``; ``None``: the whole batch). The loss
        and gradients are the mean over the equal-sized micro-batches, equal to the one-pass
        token mean when every micro-batch holds the same number of weighted tokens (HALO's
        packed windows: all of them).
      flops_per_token: model FLOPs per trained token of one step (teacher forward included),
        for the MFU; ``None``: tokens/s only.
      update_scales: per-leaf update scales (:func:`make_train_step`); ``None``: none.

    Returns:
      ``{"params", "step", "losses" (this run's per-step losses), "resumed_from", "complete"
      (``step == total_steps``), "throughput" (this run's totals)}``.

    Raises:
      ValueError: ``micro_batch_size`` does not divide the batch.
    """
    os.makedirs(workdir, exist_ok=True)
    train_step = make_train_step(loss_fn, optim_cfg, train_cfg.total_steps,
                                 micro_batch_size=micro_batch_size, update_scales=update_scales)
    init_state, step_fn = train_step.init_state, train_step.step

    ckpt = checkpoint_lib.Checkpointer(workdir, keep=train_cfg.keep_checkpoints,
                                       cleanup_tmp=True)
    data_iter = batches if hasattr(batches, "get_state") else None
    latest = ckpt.latest_step()
    if latest is not None:
        state = ckpt.restore(latest, jax.eval_shape(init_state, init_params), data_iter)
        print_fn(f"resuming from the checkpoint at step {latest} in {ckpt.directory}")
        dropped, discarded = checkpoint_lib.drop_records_after(
            os.path.join(workdir, "metrics.jsonl"), latest)
        if dropped:
            print_fn(f"dropped {dropped} metrics.jsonl records after step {latest} (logged "
                     f"after the last checkpoint of a stopped run; logged again now), kept in "
                     f"{discarded}")
        resumed_from = latest
    else:
        state = jax.jit(init_state)(init_params)
        resumed_from = -1

    peak = None if flops_per_token is None else flops_lib.peak_flops_per_device()

    step = int(state["step"])
    stop_at = train_cfg.total_steps
    if train_cfg.max_steps_per_run is not None:
        stop_at = min(stop_at, step + train_cfg.max_steps_per_run)
    pending: List[jax.Array] = []  # this run's losses, on the device until a log step
    run_losses: List[float] = []
    last_saved = resumed_from
    tokens_per_step = None
    first_step_s = None
    timed_steps, timed_s = 0, 0.0
    t_run = time.perf_counter()
    t_window, window_steps = None, 0

    def next_batch():
        return {k: jnp.asarray(v) for k, v in next(batches).items()}

    batch = next_batch() if step < stop_at else None
    while step < stop_at:
        if tokens_per_step is None:
            tokens_per_step = int(np.prod(batch["inputs"].shape))
        t_step = time.perf_counter()
        state, metrics = step_fn(state, frozen, batch)
        step += 1
        pending.append(metrics["loss"])
        if first_step_s is None:  # compile + first step, timed alone
            _block(metrics["loss"])
            first_step_s = time.perf_counter() - t_step
            t_window, window_steps = time.perf_counter(), 0
        else:
            window_steps += 1
        log_now = step % train_cfg.log_every == 0 or step == stop_at
        save_now = step % train_cfg.checkpoint_every == 0 or step == stop_at
        stop_now = deadline is not None and time.time() >= deadline and step < stop_at
        # The next batch is read while the device runs this step, except before a save: the
        # data iterator's saved position must be the state's step.
        batch = next_batch() if step < stop_at and not (save_now or stop_now) else None
        if log_now or save_now or stop_now:
            run_losses.extend(float(x) for x in jax.device_get(pending))
            pending = []
            now = time.perf_counter()
            rec = {"step": step, "loss": run_losses[-1], "grad_norm": metrics["grad_norm"],
                   "lr": metrics["lr"], "time": now - t_run}
            terms = {k: float(v) for k, v in metrics.items()
                     if k not in ("loss", "grad_norm", "lr")}  # this step's, as grad_norm
            rec.update(terms)
            if window_steps:
                window_s = now - t_window
                timed_steps, timed_s = timed_steps + window_steps, timed_s + window_s
                rec["tokens_per_s"] = window_steps * tokens_per_step / window_s
                if peak:
                    rec["mfu"] = flops_per_token * rec["tokens_per_s"] / peak
            if log_now:
                _write_metrics(workdir, rec)
                extra = (f"  {rec['tokens_per_s']:,.0f} tok/s" if "tokens_per_s" in rec else "")
                extra += f"  MFU {rec['mfu']:.1%}" if "mfu" in rec else ""
                parts = "".join(f"  {k} {v:.5f}" for k, v in terms.items())
                print_fn(f"step {step:6d}  loss {rec['loss']:.5f}{parts}  "
                         f"lr {float(rec['lr']):.2e}  grad_norm {float(rec['grad_norm']):.3f}"
                         f"{extra}")
            if save_now or stop_now:
                ckpt.save(step, state, data_iter)
                last_saved = step
            if batch is None and step < stop_at and not stop_now:
                batch = next_batch()
            t_window, window_steps = time.perf_counter(), 0  # saving is not timed
        if stop_now:
            reason = getattr(deadline, "stop_reason", None) or "deadline reached"
            print_fn(f"{reason} at step {step}; checkpointing (run again to resume)")
            break
    if last_saved != step and step > 0:
        ckpt.save(step, state, data_iter)
    ckpt.close()
    throughput = {"started_step": resumed_from if resumed_from >= 0 else 0, "step": step,
                  "tokens_per_step": tokens_per_step, "first_step_s": first_step_s,
                  "timed_steps": timed_steps, "timed_s": timed_s,
                  "tokens_per_s": (timed_steps * tokens_per_step / timed_s) if timed_s else None,
                  "flops_per_token": flops_per_token, "peak_flops": peak,
                  "wall_s": time.perf_counter() - t_run}
    if throughput["tokens_per_s"] and peak and flops_per_token:
        throughput["mfu"] = flops_per_token * throughput["tokens_per_s"] / peak
    if tokens_per_step is not None:
        records.append_record(os.path.join(workdir, "throughput.jsonl"), throughput)
    return {"params": state["params"], "step": step, "losses": run_losses,
            "resumed_from": resumed_from, "complete": step >= train_cfg.total_steps,
            "throughput": throughput}


def latest_params(workdir: str, init_params: PyTree) -> PyTree:
    """The params of the newest checkpoint of a finished stage in ``workdir``.

    Only the params are read (:meth:`Checkpointer.restore_part`), so the optimizer state's
    layout (``optim.flatten``) of the stage that wrote them does not matter.

    Args:
      workdir: the stage's directory (``<workdir>/<stage>``).
      init_params: params (or ``jax.ShapeDtypeStruct`` leaves) with the saved params'
        structure, shapes and dtypes.

    Returns:
      The restored params pytree.

    Raises:
      FileNotFoundError: there is no checkpoint in ``workdir`` (run that stage first).
    """
    ckpt = checkpoint_lib.Checkpointer(workdir, keep=1000)
    latest = ckpt.latest_step()
    if latest is None:
        ckpt.close()
        raise FileNotFoundError(f"{ckpt.directory}: no checkpoint; run the previous stage first")
    abstract = jax.eval_shape(lambda p: p, init_params)
    try:
        params = ckpt.restore_part(latest, {"params": abstract})["params"]
    finally:
        ckpt.close()
    return params


# ---------------------------------------------------------------------------------------------
# Stage 1
# ---------------------------------------------------------------------------------------------

def stage1_student_config(teacher_cfg: config_lib.ModelConfig, **kwargs
                          ) -> config_lib.ModelConfig:
    """The all-Lightning HypeNet config whose ``lightning`` section the Stage-1 students use."""
    return hypenet.hypenet_config(teacher_cfg, (), **kwargs)


def stage1_init(teacher_cfg: config_lib.ModelConfig, teacher_params: PyTree,
                student_cfg: config_lib.ModelConfig, seed: int = 0) -> PyTree:
    """Stage-1 trainable params ``{"mixers": {l: Lightning params}}`` from the teacher."""
    keys = jax.random.split(jax.random.key(seed), teacher_cfg.num_layers)
    mixers = {i: hypenet.lightning_from_attention(teacher_params["blocks"][i]["mixer"],
                                                  teacher_cfg, student_cfg, keys[i])
              for i in range(teacher_cfg.num_layers)}
    dtype = jnp.dtype(student_cfg.param_dtype)
    return jax.tree_util.tree_map(lambda x: jnp.asarray(x, dtype), {"mixers": mixers})


def stage1_loss_fn(teacher_cfg: config_lib.ModelConfig, student_cfg: config_lib.ModelConfig
                   ) -> Callable[[PyTree, PyTree, Batch], jax.Array]:
    """``(student_params, teacher_params, batch) -> MSE`` of spec §3.1.

    Per layer ``l``: ``x_l = RMSNorm_in(h_l)`` of the teacher, ``y_T = Attn_l(x_l)``,
    ``y_S = Lightning_l(stop_grad(x_l))``; the teacher stream continues with ``y_T``; the loss is
    the mean over layers of ``mean((y_S - y_T)^2)``, i.e. :func:`losses.layer_mse` of the stacks.
    """
    teacher_fn = language_model_fn(teacher_cfg)
    mixer_fn = ModelFn(lambda rngs: lightning.LightningAttention(student_cfg, rngs=rngs))

    def loss_fn(params, teacher_params, batch):
        teacher = teacher_fn(jax.lax.stop_gradient(teacher_params))
        tokens = batch["inputs"]
        h = jnp.take(teacher.embed[...], tokens, axis=0).astype(teacher.dtype)  # [B, T, D]
        total = jnp.zeros((), jnp.float32)
        for i, block in enumerate(teacher.blocks):
            x = block.mixer_norm(h)
            y_t = block.mixer(x)
            y_s = mixer_fn(params["mixers"][i])(jax.lax.stop_gradient(x))
            total = total + losses.layer_mse(y_s[None], jax.lax.stop_gradient(y_t)[None])
            h = h + y_t.astype(h.dtype)
            h = h + block.mlp(block.mlp_norm(h)).astype(h.dtype)
        return total / len(teacher.blocks)

    return loss_fn


def run_stage1(*, workdir: str, teacher_cfg: config_lib.ModelConfig, teacher_params: PyTree,
               student_cfg: config_lib.ModelConfig, optim_cfg: config_lib.OptimConfig,
               train_cfg: config_lib.TrainConfig, batches: Iterator[Batch],
               print_fn: Callable[[str], None] = print,
               deadline: Optional[float] = None, micro_batch_size: Optional[int] = None,
               seq_len: Optional[int] = None) -> Dict[str, Any]:
    """Stage 1 in ``workdir`` (resumable; ``deadline``, ``micro_batch_size`` as in
    :func:`train_loop`; ``seq_len`` given: MFU logged, :func:`stage_flops_per_token`); returns
    :func:`train_loop`'s result."""
    init = stage1_init(teacher_cfg, teacher_params, student_cfg, seed=train_cfg.seed)
    flops = None if seq_len is None else stage_flops_per_token(
        "stage1", seq_len, teacher_cfg=teacher_cfg, teacher_params=teacher_params,
        student_cfg=student_cfg, student_params=init)
    return train_loop(workdir=workdir, init_params=init,
                      loss_fn=stage1_loss_fn(teacher_cfg, student_cfg), optim_cfg=optim_cfg,
                      train_cfg=train_cfg, batches=batches, frozen=teacher_params,
                      print_fn=print_fn, deadline=deadline, micro_batch_size=micro_batch_size,
                      flops_per_token=flops)


# ---------------------------------------------------------------------------------------------
# Stage 2 and 3
# ---------------------------------------------------------------------------------------------

def stage2_init(teacher_cfg: config_lib.ModelConfig, teacher_params: PyTree,
                student_cfg: config_lib.ModelConfig, stage1_params: Optional[PyTree],
                seed: int = 0) -> PyTree:
    """The Stage-2 student (spec §2.4 Stage 1 -> 2 surgery): Stage-1 Lightning layers at the
    recurrent positions, the teacher's attention (+ new gate) at the others, the rest copied."""
    lightning_params = None if stage1_params is None else stage1_params["mixers"]
    return hypenet.convert(teacher_params, teacher_cfg, student_cfg, seed=seed,
                           lightning_params=lightning_params)


def stage2_loss_fn(teacher_cfg: config_lib.ModelConfig, student_cfg: config_lib.ModelConfig,
                   *, temperature: float = 1.0, chunk_size: Optional[int] = None
                   ) -> Callable[[PyTree, PyTree, Batch], jax.Array]:
    """``(student_params, teacher_params, batch) -> KL(teacher || student)`` (spec §3.3),
    masked by ``batch["weights"]`` when present, vocabularies truncated to the shared width.

    Both models stop at their final norm (``return_hidden``); the LM heads and the KL run in
    token chunks (:func:`losses.chunked_forward_kl`), so ``[tokens, vocab]`` fp32 logits
    exist for one chunk at a time, in the backward pass too. ``chunk_size`` ``None``: 2048.
    """
    teacher_fn = language_model_fn(teacher_cfg)
    student_fn = language_model_fn(student_cfg)
    chunk = 2048 if chunk_size is None else chunk_size

    def loss_fn(params, teacher_params, batch):
        teacher = teacher_fn(jax.lax.stop_gradient(teacher_params))
        t_hidden = jax.lax.stop_gradient(teacher(batch["inputs"], return_hidden=True))
        t_head = jax.lax.stop_gradient(teacher.head_kernel())
        student = student_fn(params)
        s_hidden = student(batch["inputs"], return_hidden=True)
        return losses.chunked_forward_kl(t_hidden, t_head, s_hidden, student.head_kernel(),
                                         batch.get("weights"), temperature=temperature,
                                         chunk_size=chunk)

    return loss_fn


def check_stage3_kl_options(kl_weight: float, kl_len: Optional[int], *,
                            prefix: str = "") -> None:
    """Checks Stage 3's teacher-KL values alone (no teacher needed: a config check before any
    stage runs, :func:`lattn_jax.halo.experiment.check_options`).

    Args:
      kl_weight, kl_len: as :func:`stage3_loss_fn`.
      prefix: put before the option names in the messages (e.g. ``"stage3."``).

    Raises:
      ValueError: naming the option, if ``kl_weight`` is not a finite number ``>= 0``,
        ``kl_len`` is given and is not an int ``>= 1``, or ``kl_weight > 0`` without
        ``kl_len``.
    """
    if isinstance(kl_weight, bool) or not isinstance(kl_weight, (int, float, np.number)) \
            or not 0 <= kl_weight < math.inf:
        raise ValueError(f"{prefix}kl_weight must be a finite number >= 0, got {kl_weight!r}")
    if kl_len is not None and (isinstance(kl_len, bool)
                               or not isinstance(kl_len, (int, np.integer)) or kl_len < 1):
        raise ValueError(f"{prefix}kl_len must be an int >= 1, got {kl_len!r}")
    if kl_weight > 0 and kl_len is None:
        raise ValueError(f"{prefix}kl_weight={kl_weight} > 0 needs {prefix}kl_len (the "
                         f"positions of each window the KL covers, e.g. the teacher's context)")


def check_stage3_kl(teacher_cfg: Optional[config_lib.ModelConfig], kl_weight: float,
                    kl_len: Optional[int]) -> None:
    """Checks Stage 3's teacher-KL options (:func:`stage3_loss_fn`).

    Raises:
      ValueError: naming the option, as :func:`check_stage3_kl_options`, or ``kl_weight > 0``
        without ``teacher_cfg``.
    """
    check_stage3_kl_options(kl_weight, kl_len)
    if kl_weight > 0 and teacher_cfg is None:
        raise ValueError(f"kl_weight={kl_weight} > 0 needs teacher_cfg (the teacher whose "
                         f"KL anchors Stage 3)")


def stage3_loss_fn(student_cfg: config_lib.ModelConfig, *, chunk_size: Optional[int] = None,
                   teacher_cfg: Optional[config_lib.ModelConfig] = None,
                   kl_weight: float = 0.0, kl_len: Optional[int] = None
                   ) -> Callable[[PyTree, PyTree, Batch], jax.Array]:
    """``(params, teacher_params, batch) -> loss`` of Stage 3 (spec §3.4), fp32 scalar in nats
    per token.

    ``kl_weight == 0`` (HALO): ``loss = CE``, the token-mean next-token cross-entropy over every
    position of the ``[B, T]`` windows (``batch["inputs"]``, ``batch["targets"]``, optional
    ``batch["weights"]``); the second argument is ignored (no teacher forward).

    ``kl_weight = w > 0`` (an anchor to the teacher, not in HALO)::

        loss = CE(positions t < T) + w * KL(teacher || student)(positions t < K),
        K = min(kl_len, T)

    the KL the token mean of :func:`losses.chunked_forward_kl` at temperature 1 over the first
    ``K`` positions of every window (masked by ``weights[:, :K]``). The teacher is causal, so
    its logits there are those of the teacher run on ``inputs[:, :K]`` alone: only that prefix
    is run (under ``stop_gradient``, as in :func:`stage2_loss_fn`). The intent: CE over the
    whole long window teaches long context, the KL keeps the student near the teacher where the
    teacher is valid (its training context, ``kl_len``). The returned function's attribute
    ``with_terms`` gives ``(loss, {"ce", "kl"})``, which :func:`train_loop` logs apart.

    Both the CE and the KL compute the LM heads in token chunks of ``chunk_size`` (``None``:
    2048; :func:`losses.chunked_cross_entropy`, :func:`losses.chunked_forward_kl`), so the
    student's head runs twice on the first ``K`` positions.

    Args:
      student_cfg: the student.
      chunk_size: tokens per LM-head chunk.
      teacher_cfg: the teacher (needed when ``kl_weight > 0``).
      kl_weight: ``w >= 0``.
      kl_len: ``K``'s bound (``>= 1``; needed when ``kl_weight > 0``); ``kl_len > T`` covers
        the whole window.

    Raises:
      ValueError: the options, as :func:`check_stage3_kl`.
    """
    check_stage3_kl(teacher_cfg, kl_weight, kl_len)
    student_fn = language_model_fn(student_cfg)
    chunk = 2048 if chunk_size is None else chunk_size

    if not kl_weight > 0:
        def loss_fn(params, _, batch):
            student = student_fn(params)
            hidden = student(batch["inputs"], return_hidden=True)
            return losses.chunked_cross_entropy(hidden, student.head_kernel(), batch["targets"],
                                                batch.get("weights"), chunk_size=chunk)[0]

        return loss_fn

    teacher_fn = language_model_fn(teacher_cfg)
    weight = float(kl_weight)

    def loss_terms(params, teacher_params, batch):
        student = student_fn(params)
        hidden = student(batch["inputs"], return_hidden=True)  # [B, T, D_S]
        head = student.head_kernel()
        weights = batch.get("weights")
        ce = losses.chunked_cross_entropy(hidden, head, batch["targets"], weights,
                                          chunk_size=chunk)[0]
        k = min(int(kl_len), batch["inputs"].shape[1])
        teacher = teacher_fn(jax.lax.stop_gradient(teacher_params))
        t_hidden = jax.lax.stop_gradient(
            teacher(batch["inputs"][:, :k], return_hidden=True))  # [B, K, D_T]
        t_head = jax.lax.stop_gradient(teacher.head_kernel())
        kl = losses.chunked_forward_kl(t_hidden, t_head, hidden[:, :k], head,
                                       None if weights is None else weights[:, :k],
                                       chunk_size=chunk)
        return ce + weight * kl, {"ce": ce, "kl": kl}

    def loss_with_kl(params, teacher_params, batch):
        return loss_terms(params, teacher_params, batch)[0]

    loss_with_kl.with_terms = loss_terms  # logged apart by train_loop (make_train_step)
    return loss_with_kl


def run_stage2(*, workdir: str, teacher_cfg: config_lib.ModelConfig, teacher_params: PyTree,
               student_cfg: config_lib.ModelConfig, stage1_params: Optional[PyTree],
               optim_cfg: config_lib.OptimConfig, train_cfg: config_lib.TrainConfig,
               batches: Iterator[Batch], temperature: float = 1.0,
               kl_chunk_size: Optional[int] = None,
               print_fn: Callable[[str], None] = print,
               deadline: Optional[float] = None, micro_batch_size: Optional[int] = None,
               seq_len: Optional[int] = None, copied_lr_scale: float = 1.0) -> Dict[str, Any]:
    """Stage 2 in ``workdir`` (resumable; ``deadline``, ``micro_batch_size`` as in
    :func:`train_loop`; ``seq_len`` given: MFU logged, :func:`stage_flops_per_token`); returns
    :func:`train_loop`'s result. ``copied_lr_scale != 1`` trains what the student copied from
    the teacher at ``copied_lr_scale`` times the Lightning mixers' rate
    (:func:`stage2_update_scales`; 1.0: the spec's one rate).

    Raises:
      ValueError: ``copied_lr_scale`` not a finite number > 0.
    """
    check_copied_lr_scale(copied_lr_scale)
    init = stage2_init(teacher_cfg, teacher_params, student_cfg, stage1_params,
                       seed=train_cfg.seed)
    scales = None
    if copied_lr_scale != 1.0:
        scales = stage2_update_scales(student_cfg, init, copied_lr_scale)
    flops = None if seq_len is None else stage_flops_per_token(
        "stage2", seq_len, teacher_cfg=teacher_cfg, teacher_params=teacher_params,
        student_cfg=student_cfg, student_params=init)
    return train_loop(workdir=workdir, init_params=init,
                      loss_fn=stage2_loss_fn(teacher_cfg, student_cfg, temperature=temperature,
                                             chunk_size=kl_chunk_size),
                      optim_cfg=optim_cfg, train_cfg=train_cfg, batches=batches,
                      frozen=teacher_params, print_fn=print_fn, deadline=deadline,
                      micro_batch_size=micro_batch_size, flops_per_token=flops,
                      update_scales=scales)


def run_stage3(*, workdir: str, student_cfg: config_lib.ModelConfig, init_params: PyTree,
               optim_cfg: config_lib.OptimConfig, train_cfg: config_lib.TrainConfig,
               batches: Iterator[Batch], print_fn: Callable[[str], None] = print,
               deadline: Optional[float] = None, micro_batch_size: Optional[int] = None,
               ce_chunk_size: Optional[int] = None,
               seq_len: Optional[int] = None,
               teacher_cfg: Optional[config_lib.ModelConfig] = None,
               teacher_params: Optional[PyTree] = None, kl_weight: float = 0.0,
               kl_len: Optional[int] = None) -> Dict[str, Any]:
    """Stage 3 in ``workdir`` (resumable; ``deadline``, ``micro_batch_size`` as in
    :func:`train_loop`; ``seq_len`` given: MFU logged) from the Stage-2 params; returns
    :func:`train_loop`'s result.

    ``kl_weight > 0`` adds the teacher's KL on each window's first ``kl_len`` positions
    (:func:`stage3_loss_fn`): the teacher (``teacher_cfg``, ``teacher_params``) is then passed
    to every step and its forward on that prefix counted in the MFU
    (:func:`stage_flops_per_token`'s ``teacher_len``); ``kl_weight == 0`` never uses it. The
    logged loss is the sum ``CE + kl_weight x KL`` (:func:`train_loop` logs one scalar).

    Raises:
      ValueError: a bad KL option (:func:`check_stage3_kl`) or ``kl_weight > 0`` without
        ``teacher_params``.
    """
    loss_fn = stage3_loss_fn(student_cfg, chunk_size=ce_chunk_size, teacher_cfg=teacher_cfg,
                             kl_weight=kl_weight, kl_len=kl_len)
    use_teacher = kl_weight > 0
    if use_teacher and teacher_params is None:
        raise ValueError(f"kl_weight={kl_weight} > 0 needs teacher_params")
    flops = None
    if seq_len is not None:
        flops = stage_flops_per_token(
            "stage3", seq_len, student_cfg=student_cfg, student_params=init_params,
            teacher_cfg=teacher_cfg if use_teacher else None,
            teacher_params=teacher_params if use_teacher else None,
            teacher_len=min(kl_len, seq_len) if use_teacher else None)
    return train_loop(workdir=workdir, init_params=init_params, loss_fn=loss_fn,
                      optim_cfg=optim_cfg, train_cfg=train_cfg, batches=batches,
                      frozen=teacher_params if use_teacher else None,
                      print_fn=print_fn, deadline=deadline, micro_batch_size=micro_batch_size,
                      flops_per_token=flops)


def stage_flops_per_token(stage: str, seq_len: int, *,
                          teacher_cfg: Optional[config_lib.ModelConfig] = None,
                          teacher_params: Optional[PyTree] = None,
                          student_cfg: Optional[config_lib.ModelConfig] = None,
                          student_params: Optional[PyTree] = None,
                          teacher_len: Optional[int] = None) -> float:
    """Model FLOPs per trained token of one HALO step (:mod:`lattn_jax.flops` conventions:
    ``2 x`` matmul weights per token forward, the mixers' token-mixing work, causal attention
    halved, backward ``= 2 x`` forward).

    * ``stage1``: the teacher's blocks forward (no LM head: Stage 1 never needs logits) plus
      every layer's Lightning student forward and backward (``student_params`` is Stage 1's
      ``{"mixers": {l: ...}}``, ``student_cfg`` the all-Lightning config);
    * ``stage2``: the whole teacher forward (LM head included) plus the student's forward and
      backward;
    * ``stage3``: the student's forward and backward; with ``teacher_len`` ``K`` (Stage 3's
      teacher KL on each window's first ``K`` positions), plus the teacher's forward on that
      prefix, spread over the window's ``seq_len`` tokens: ``(K / seq_len) x`` the teacher's
      forward FLOPs per token at length ``K`` (causal attention at ``K``). The student's second
      LM-head pass on the prefix (the KL's) is not counted, like any recomputation.

    Raises:
      ValueError: an unknown ``stage``, a missing model, or ``teacher_len`` outside ``stage3``
        or not in ``[1, seq_len]``.
    """
    if teacher_len is not None and (stage != "stage3" or not 1 <= teacher_len <= seq_len):
        raise ValueError(f"teacher_len={teacher_len} is for stage3 only, in [1, seq_len="
                         f"{seq_len}] (got stage {stage!r})")
    if stage == "stage1":
        if teacher_cfg is None or student_cfg is None:
            raise ValueError("stage1 FLOPs need the teacher and the student config")
        names = teacher_cfg.layer_pattern
        teacher = 2.0 * flops_lib.matmul_params(teacher_params["blocks"], False)
        teacher += sum(flops_lib.mixer_flops_per_token(teacher_cfg, n, seq_len) for n in names)
        students = 2.0 * flops_lib.matmul_params(student_params, False)
        students += len(names) * flops_lib.mixer_flops_per_token(student_cfg, "lightning",
                                                                 seq_len)
        return teacher + 3.0 * students
    if stage not in ("stage2", "stage3"):
        raise ValueError(f"no FLOP model for stage {stage!r}")
    if student_cfg is None:
        raise ValueError(f"{stage} FLOPs need the student config and params")
    total = flops_lib.flops_per_token(student_cfg, student_params, seq_len, training=True)
    if stage == "stage2":
        if teacher_cfg is None:
            raise ValueError("stage2 FLOPs need the teacher")
        total += flops_lib.flops_per_token(teacher_cfg, teacher_params, seq_len,
                                           training=False)
    if stage == "stage3" and teacher_len is not None:
        if teacher_cfg is None:
            raise ValueError("stage3 FLOPs with teacher_len need the teacher")
        total += (teacher_len / seq_len) * flops_lib.flops_per_token(
            teacher_cfg, teacher_params, teacher_len, training=False)
    return total


# ---------------------------------------------------------------------------------------------
# Calibration of a
# ---------------------------------------------------------------------------------------------

def doubling_buckets(train_len: int, seq_len: int) -> List[Tuple[int, int]]:
    """Position buckets for :func:`calibrate_logit_scaling`: ``[0, L)``, ``[L, 2L)``,
    ``[2L, 4L)``, ... up to ``seq_len`` (the last one cut there), ``L = train_len``.

    ``L`` is the longest window the student was trained on (Stage 3's), so the first bucket is
    in distribution and each later one twice as far beyond it.

    Raises:
      ValueError: if ``train_len`` or ``seq_len`` is not an int ``>= 1``.
    """
    for name, v in (("train_len", train_len), ("seq_len", seq_len)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    edges = [0, min(train_len, seq_len)]
    while edges[-1] < seq_len:
        edges.append(min(2 * edges[-1], seq_len))
    return list(zip(edges[:-1], edges[1:]))


def calibrate_logit_scaling(student_cfg: config_lib.ModelConfig, params: PyTree,
                            batches: Sequence[Batch], candidates: Sequence[Optional[float]],
                            print_fn: Callable[[str], None] = print, *,
                            position_buckets: Optional[Sequence[Tuple[int, int]]] = None,
                            chunk_size: int = 4096) -> Dict[str, Any]:
    """Picks ``a`` of the inference-time logit scaling ``s_t = log_a(t + a)`` (spec §1.6, §3.7).

    The model is evaluated with ``AttentionConfig.logit_scaling_base = a`` for every candidate
    (``None`` = no scaling) on the same (long-context) batches; the lowest token-mean
    cross-entropy over the whole windows wins (the paper: "choose a after training using
    document loss"). The scaling exists for positions beyond the training length (NoPE
    attention over more keys than it was trained on, spec §1.6 item 4), so the windows should
    reach past it: the ``h200`` config calibrates on 64K windows, four times Stage 3's 16K.

    The loss is also reported per position bucket ``[start, stop)`` (0-based positions within
    the window; e.g. :func:`doubling_buckets`): ``CE_bucket = sum_{n in bucket} w_n CE_n /
    sum w_n`` in nats, with ``CE_n`` from :func:`losses.chunked_cross_entropy` on the final
    hidden states (fp32 logits per chunk of ``chunk_size`` tokens, never the whole window's).

    Args:
      student_cfg: the trained HypeNet config (its attention layers are NoPE).
      params: its params.
      batches: evaluation batches with ``inputs`` / ``targets`` int ``[B, T]`` and optional
        ``weights`` ``[B, T]``, all of one ``T``.
      candidates: values of ``a`` (each ``> 1``) and/or ``None``.
      position_buckets: disjoint ``(start, stop)`` pairs covering ``[0, T)`` in order; ``None``
        is one bucket ``[(0, T)]``.
      chunk_size: tokens per chunk of the fused head (``>= 1``).

    Returns:
      ``{"best": a, "losses": {str(a): whole-window loss}, "position_buckets": [[start,
      stop], ...], "bucket_losses": {str(a): [loss per bucket]}, "bucket_tokens": [weighted
      token count per bucket]}`` (a bucket with no weight has loss ``None``).

    Raises:
      ValueError: no candidates or no batches, batches of different lengths, buckets that do
        not tile ``[0, T)`` (or ``a <= 1``, from the config).
    """
    if not candidates or not batches:
        raise ValueError("calibration needs at least one candidate and one batch")
    lengths = {int(np.shape(b["inputs"])[1]) for b in batches}
    if len(lengths) != 1:
        raise ValueError(f"calibration batches must share one length T, got {sorted(lengths)}")
    (t_len,) = lengths
    buckets = [(0, t_len)] if position_buckets is None else [
        (int(a), int(b)) for a, b in position_buckets]
    if (not buckets or buckets[0][0] != 0 or buckets[-1][1] != t_len
            or any(b <= a for a, b in buckets)
            or any(buckets[i][1] != buckets[i + 1][0] for i in range(len(buckets) - 1))):
        raise ValueError(f"position_buckets must tile [0, {t_len}) in order, got {buckets}")
    results, per_bucket, tokens = {}, {}, None
    for a in candidates:
        cfg = dataclasses.replace(student_cfg, attention=dataclasses.replace(
            student_cfg.attention, logit_scaling_base=a))
        model = loaders.build_model(cfg, params)

        @nnx.jit
        def eval_step(model, batch):
            hidden = model(batch["inputs"], return_hidden=True)  # [B, T, D]
            head = model.head_kernel()  # [D, S]
            w = batch.get("weights")
            w = jnp.ones(batch["targets"].shape, jnp.float32) if w is None else w
            sums, counts = [], []
            for start, stop in buckets:
                _, total, count = losses.chunked_cross_entropy(
                    hidden[:, start:stop], head, batch["targets"][:, start:stop],
                    w[:, start:stop], chunk_size=chunk_size)
                sums.append(total)
                counts.append(count)
            return jnp.stack(sums), jnp.stack(counts)

        sums = np.zeros(len(buckets), np.float64)
        counts = np.zeros(len(buckets), np.float64)
        for batch in batches:
            s_b, c_b = eval_step(model, {k: jnp.asarray(v) for k, v in batch.items()})
            sums, counts = sums + np.asarray(s_b, np.float64), counts + np.asarray(c_b, np.float64)
        results[a] = float(sums.sum() / max(counts.sum(), 1.0))
        per_bucket[a] = [float(s / c) if c > 0 else None for s, c in zip(sums, counts)]
        tokens = [float(c) for c in counts]
        shown = ", ".join(f"[{b0}, {b1}) {v:.5f}" for (b0, b1), v in zip(buckets, per_bucket[a])
                          if v is not None)
        print_fn(f"a={a}: loss {results[a]:.5f}" + (f" ({shown})" if len(buckets) > 1 else ""))
    best = min(results, key=results.get)
    return {"best": best, "losses": {str(k): v for k, v in results.items()},
            "position_buckets": [list(b) for b in buckets],
            "bucket_losses": {str(k): v for k, v in per_bucket.items()},
            "bucket_tokens": tokens}
