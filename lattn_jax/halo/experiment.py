"""The HALO pipeline driver behind ``experiments/halo.py``: one stage per invocation.

``run(config, workdir, stage)`` with ``stage`` one of :data:`STAGES`; each stage works in
``<workdir>/<stage>`` and reads what earlier stages left there (spec ``hypenet-halo.md`` §3):

1. ``stage1``: per-layer MSE alignment of a Lightning student for every layer (resumable);
2. ``select``: the single-replacement sweep with the Stage-1 students, the HALO score and the
   top ``floor(L / 4)`` layers, written to ``select/selection.json`` (resumable per layer);
3. ``stage2``: KL distillation of the HypeNet student (attention layers from
   ``config.hypenet.attention_layers`` or ``select/selection.json``) (resumable);
4. ``stage3``: long-context cross-entropy fine-tuning from the Stage-2 params (resumable);
5. ``calibrate``: the validation loss for each candidate ``a`` of the logit scaling, written to
   ``calibrate/calibration.json``.

The config (a ``ConfigDict``, see ``configs/halo_smollm2.py``) has sections ``teacher``, ``data``,
``hypenet``, ``stage1``, ``select``, ``stage2``, ``stage3`` and ``calibrate``; the stage sections
hold ``seq_len``, ``batch_size``, ``optim`` (an :class:`~lattn_jax.config.OptimConfig`) and
``train`` (a :class:`~lattn_jax.config.TrainConfig`). The teacher is read from a local GGUF file
or Hugging Face directory (never downloaded), or, with ``teacher.kind = "random"``, initialised
at random from ``teacher.random_model`` (tiny CPU runs).
"""

import dataclasses
import json
import math
import os
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import jax
import jax.numpy as jnp
from flax import nnx

from lattn_jax import config as config_lib
from lattn_jax import data as data_lib
from lattn_jax import train as train_lib
from lattn_jax.halo import hypenet
from lattn_jax.halo import loaders
from lattn_jax.halo import selection
from lattn_jax.halo import stages

STAGES = ("stage1", "select", "stage2", "stage3", "calibrate")


def _to_dict(section: Any) -> Dict[str, Any]:
    return section.to_dict() if hasattr(section, "to_dict") else dict(section)


def _build(cls, values: Mapping[str, Any], where: str):
    """A frozen config dataclass from a mapping; unknown keys raise ``ConfigError`` naming them."""
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - fields)
    if unknown:
        names = ", ".join(f"{where}.{k}" for k in unknown)
        raise config_lib.ConfigError(f"unknown option(s) {names}")
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


def load_teacher(config) -> Tuple[config_lib.ModelConfig, Any, Any]:
    """``(teacher_config, teacher_params, tokenizer_or_None)`` from ``config.teacher``.

    Raises:
      FileNotFoundError: the teacher file or directory is missing.
      ValueError: an unsupported checkpoint or ``teacher.kind``.
    """
    t = config.teacher
    if t.kind == "random":
        r = _to_dict(t.random_model)
        cfg = config_lib.ModelConfig(
            vocab_size=r["vocab_size"], d_model=r["d_model"],
            layer_pattern=("attn",) * r["num_layers"], mlp_hidden=r["mlp_hidden"],
            tie_embeddings=r.get("tie_embeddings", True), norm_eps=1e-6, use_segment_ids=False,
            attention=config_lib.AttentionConfig(
                num_heads=r["num_heads"], num_kv_heads=r["num_kv_heads"],
                head_dim=r.get("head_dim"), rope_theta=r.get("rope_theta", 1e4),
                qk_norm=r.get("qk_norm", True)))
        return cfg, stages.random_teacher(cfg, seed=r.get("seed", 0)), None
    if not t.path:
        raise config_lib.ConfigError("teacher.path is required (a .gguf file or an HF directory)")
    teacher = loaders.load_teacher(t.path, t.kind)
    cfg = loaders.cast_config(teacher.model_config, dtype=config.hypenet.dtype)
    return cfg, teacher.params, teacher.tokenizer


def data_for(config, section) -> data_lib.Datasets:
    """The data pipeline of one stage: ``config.data`` with the stage's seq_len/batch_size."""
    values = _to_dict(config.data)
    values.update(seq_len=section.seq_len, batch_size=section.batch_size)
    return data_lib.build_datasets(_build(data_lib.DataConfig, values, "data"))


def _stage_cfgs(section) -> Tuple[config_lib.OptimConfig, config_lib.TrainConfig]:
    return (_build(config_lib.OptimConfig, _to_dict(section.optim), "optim"),
            _build(config_lib.TrainConfig, _to_dict(section.train), "train"))


def student_config(config, teacher_cfg, attention_layers, **kw) -> config_lib.ModelConfig:
    """The HypeNet config for ``attention_layers`` with ``config.hypenet``'s options."""
    h = config.hypenet
    return hypenet.hypenet_config(teacher_cfg, attention_layers, tie_embeddings=h.tie_embeddings,
                                  lightning_implementation=h.lightning_implementation,
                                  dtype=h.dtype, **kw)


def _stage1_params(config, workdir, teacher_cfg, teacher_params):
    s1_cfg = student_config(config, teacher_cfg, ())
    init = stages.stage1_init(teacher_cfg, teacher_params, s1_cfg)
    optim_cfg, train_cfg = _stage_cfgs(config.stage1)
    return stages.latest_params(os.path.join(workdir, "stage1"), init, optim_cfg,
                                train_cfg.total_steps)


def _attention_layers(config, workdir, num_layers):
    if config.hypenet.attention_layers is not None:
        return tuple(config.hypenet.attention_layers)
    path = os.path.join(workdir, "select", "selection.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no layer selection; run --stage=select first or set "
                                f"--config.hypenet.attention_layers")
    with open(path) as f:
        return tuple(json.load(f)["attention_layers"])


def _stage2_student(config, workdir, teacher_cfg, teacher_params):
    layers = _attention_layers(config, workdir, teacher_cfg.num_layers)
    cfg = student_config(config, teacher_cfg, layers)
    init = stages.stage2_init(teacher_cfg, teacher_params, cfg, None)
    return cfg, init


def _tokens_fn(model) -> Callable:
    graphdef, state = nnx.split(model)
    fn = jax.jit(lambda s, t: nnx.merge(graphdef, s)(t))
    return lambda tokens: fn(state, tokens)


def run(config, workdir: str, stage: str, print_fn: Callable[[str], None] = print
        ) -> Dict[str, Any]:
    """Runs one HALO stage in ``<workdir>/<stage>``.

    Returns:
      The stage's summary (``losses``/``step`` for training stages, the selection or the
      calibration result otherwise).

    Raises:
      ValueError: an unknown ``stage`` or a bad option (named).
      FileNotFoundError: a missing teacher, data file or earlier stage's output.
    """
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; choose from {', '.join(STAGES)}")
    stage_dir = os.path.join(workdir, stage)
    os.makedirs(stage_dir, exist_ok=True)
    with open(os.path.join(workdir, "config.json"), "w") as f:
        f.write(config.to_json_best_effort(indent=2) if hasattr(config, "to_json_best_effort")
                else json.dumps(_to_dict(config), indent=2, default=str))
    teacher_cfg, teacher_params, tokenizer = load_teacher(config)
    print_fn(f"teacher: {teacher_cfg.num_layers} layers, d_model {teacher_cfg.d_model}, "
             f"vocab {teacher_cfg.vocab_size}")

    if stage == "stage1":
        ds = data_for(config, config.stage1)
        optim_cfg, train_cfg = _stage_cfgs(config.stage1)
        out = stages.run_stage1(workdir=stage_dir, teacher_cfg=teacher_cfg,
                                teacher_params=teacher_params,
                                student_cfg=student_config(config, teacher_cfg, ()),
                                optim_cfg=optim_cfg, train_cfg=train_cfg, batches=ds.train_iter,
                                print_fn=print_fn)
        return {"losses": out["losses"], "step": out["step"]}

    if stage == "select":
        return _select(config, workdir, stage_dir, teacher_cfg, teacher_params, tokenizer,
                       print_fn)

    if stage == "stage2":
        ds = data_for(config, config.stage2)
        optim_cfg, train_cfg = _stage_cfgs(config.stage2)
        cfg, _ = _stage2_student(config, workdir, teacher_cfg, teacher_params)
        s1 = _stage1_params(config, workdir, teacher_cfg, teacher_params)
        out = stages.run_stage2(workdir=stage_dir, teacher_cfg=teacher_cfg,
                                teacher_params=teacher_params, student_cfg=cfg, stage1_params=s1,
                                optim_cfg=optim_cfg, train_cfg=train_cfg, batches=ds.train_iter,
                                temperature=config.stage2.temperature,
                                kl_chunk_size=config.stage2.kl_chunk_size, print_fn=print_fn)
        return {"losses": out["losses"], "step": out["step"]}

    cfg, init = _stage2_student(config, workdir, teacher_cfg, teacher_params)
    optim2, train2 = _stage_cfgs(config.stage2)
    if stage == "stage3":
        params2 = stages.latest_params(os.path.join(workdir, "stage2"), init, optim2,
                                       train2.total_steps)
        ds = data_for(config, config.stage3)
        optim_cfg, train_cfg = _stage_cfgs(config.stage3)
        out = stages.run_stage3(workdir=stage_dir, student_cfg=cfg, init_params=params2,
                                optim_cfg=optim_cfg, train_cfg=train_cfg, batches=ds.train_iter,
                                print_fn=print_fn)
        return {"losses": out["losses"], "step": out["step"]}

    # calibrate: the final (Stage-3, else Stage-2) params.
    optim3, train3 = _stage_cfgs(config.stage3)
    try:
        params = stages.latest_params(os.path.join(workdir, "stage3"), init, optim3,
                                      train3.total_steps)
    except FileNotFoundError:
        params = stages.latest_params(os.path.join(workdir, "stage2"), init, optim2,
                                      train2.total_steps)
    ds = data_for(config, config.calibrate)
    batches = list(ds.val_batches)[:config.calibrate.max_batches]
    result = stages.calibrate_logit_scaling(cfg, params, batches,
                                            list(config.calibrate.candidates), print_fn=print_fn)
    with open(os.path.join(stage_dir, "calibration.json"), "w") as f:
        json.dump(result, f, indent=2)
    print_fn(f"best a: {result['best']}")
    return result


def _select(config, workdir, stage_dir, teacher_cfg, teacher_params, tokenizer, print_fn):
    """The single-replacement sweep, the HALO scores and the kept attention layers."""
    sel = config.select
    s1 = _stage1_params(config, workdir, teacher_cfg, teacher_params)
    ds = data_for(config, sel)
    tokenizer = tokenizer or ds.tokenizer
    csr_items = selection.read_jsonl(sel.csr_items) if sel.csr_items else None
    recall_items = (selection.read_jsonl(sel.recall_items) if sel.recall_items else
                    selection.synthetic_recall_items(sel.synthetic_recall, seed=0))
    val = list(ds.val_batches)[:sel.max_val_batches]
    all_layers = range(teacher_cfg.num_layers)

    def evaluate_layer(layer):
        cfg = student_config(config, teacher_cfg, [i for i in all_layers if i != layer],
                             attention_rope=True, attention_gate=False)
        params = hypenet.convert(teacher_params, teacher_cfg, cfg,
                                 lightning_params={layer: s1["mixers"][layer]})
        model = _tokens_fn(loaders.build_model(cfg, params))
        if csr_items is not None:
            csr = selection.acc_norm(model, tokenizer, csr_items)
        else:  # proxy: per-token likelihood exp(-CE) on validation windows
            total = count = 0.0
            for b in val:
                _, t, c = train_lib.cross_entropy_loss(model(jnp.asarray(b["inputs"])),
                                                       jnp.asarray(b["targets"]),
                                                       jnp.asarray(b["weights"]))
                total, count = total + float(t), count + float(c)
            csr = math.exp(-total / max(count, 1.0))
        recall = selection.recall_contains(model, tokenizer, recall_items,
                                           max_new_tokens=sel.max_new_tokens)
        return csr, recall

    csr, recall = selection.sweep(teacher_cfg.num_layers, evaluate_layer,
                                  os.path.join(stage_dir, "sweep.jsonl"), print_fn)
    scores = selection.halo_scores(csr, recall)
    k = sel.num_attention if sel.num_attention is not None else \
        hypenet.attention_layer_count(teacher_cfg.num_layers)
    result = {"attention_layers": selection.select_attention_layers(scores, k),
              "ranking": selection.rank_layers(scores), "scores": scores.tolist(),
              "csr": csr.tolist(), "recall": recall.tolist(),
              "csr_metric": "acc_norm" if csr_items is not None else "exp(-val_ce) proxy"}
    with open(os.path.join(stage_dir, "selection.json"), "w") as f:
        json.dump(result, f, indent=2)
    print_fn(f"attention layers: {result['attention_layers']}")
    return result


def base_config(*, teacher_path: Optional[str], teacher_kind: str, data: Dict[str, Any],
                stage_lengths: Dict[str, Tuple[int, int, int]], lrs: Dict[str, float],
                min_lrs: Dict[str, float], random_model: Optional[Dict[str, Any]] = None,
                checkpoint_every: int = 1000, log_every: int = 10,
                calibrate_candidates=(None, 100.0, 200.0, 362.0, 500.0, 1000.0, 2000.0)):
    """The HALO ConfigDict shared by ``configs/halo_*.py`` (spec §3.6 recipe).

    Args:
      teacher_path, teacher_kind: ``config.teacher``.
      data: the ``DataConfig`` fields except ``seq_len``/``batch_size``.
      stage_lengths: ``{stage: (seq_len, batch_size, total_steps)}`` for stage1/2/3.
      lrs, min_lrs: peak and final learning rate per training stage.
      random_model: the random teacher's shape (``teacher_kind == "random"``).
      checkpoint_every, log_every: cadence of every training stage.
      calibrate_candidates: values of ``a`` (``None`` = no scaling).
    """
    import ml_collections

    def stage(name, **extra):
        seq_len, batch, steps = stage_lengths[name]
        return dict(
            seq_len=seq_len, batch_size=batch,
            optim=dict(name="adamw", learning_rate=lrs[name],
                       min_lr_ratio=min(1.0, min_lrs[name] / lrs[name]),
                       warmup_steps=min(50, max(steps // 10, 0)), schedule="cosine", b1=0.9,
                       b2=0.95, eps=1e-8, weight_decay=0.0, grad_clip=1.0),
            train=dict(total_steps=steps, checkpoint_every=min(checkpoint_every, steps),
                       keep_checkpoints=2, log_every=min(log_every, steps), seed=0,
                       max_steps_per_run=None),
            **extra)

    s1_len, s1_batch, _ = stage_lengths["stage1"]
    s3_len, s3_batch, _ = stage_lengths["stage3"]
    cfg = dict(
        teacher=dict(path=teacher_path, kind=teacher_kind, random_model=random_model or {}),
        data=data,
        # dtype: compute dtype of teacher and student (params and Adam moments stay fp32, a
        # deliberate departure from the authors' pure-bf16 training, spec §6 item 3).
        hypenet=dict(attention_layers=None, tie_embeddings=None,
                     lightning_implementation="auto", dtype="float32"),
        stage1=stage("stage1"),
        select=dict(seq_len=s1_len, batch_size=s1_batch, num_attention=None, csr_items=None,
                    recall_items=None, synthetic_recall=20, max_new_tokens=12,
                    max_val_batches=8),
        stage2=stage("stage2", temperature=1.0, kl_chunk_size=512),
        stage3=stage("stage3"),
        calibrate=dict(seq_len=s3_len, batch_size=1, max_batches=8,
                       candidates=tuple(calibrate_candidates)),
    )
    return ml_collections.ConfigDict(cfg)
