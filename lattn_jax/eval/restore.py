"""Loads a model and its tokenizer for evaluation: a training workdir, a HALO workdir's student,
an HF directory, a GGUF file.

``lattn_jax.train.train_and_evaluate`` writes ``<workdir>/config.json`` (the resolved
:class:`~lattn_jax.config.ExperimentConfig`) and orbax checkpoints under
``<workdir>/checkpoints/<step>`` (:mod:`lattn_jax.checkpoint`). :func:`load` rebuilds the config,
restores the train state through :class:`~lattn_jax.checkpoint.Checkpointer` and returns the NNX
model with the parameters of the requested step.

:func:`load_model` is the one entry point of the evaluators (``experiments/evaluate.py``, the
lm-evaluation-harness adapter :mod:`lattn_jax.eval.lm_eval_adapter`): given a path it tells the
four kinds of model apart (:func:`model_kind`) and loads

* a lattn-jax training workdir (``config.json`` of an ``ExperimentConfig``) with :func:`load`;
* a HALO workdir (``experiments/halo.py``'s ``--workdir``: ``config.json`` of a HALO pipeline
  config, a ``stage2`` or ``stage3`` checkpoint): its converted student, as the pipeline's
  report stage measures it (:func:`lattn_jax.halo.experiment.load_student`);
* a Hugging Face Llama / Qwen3 directory (``config.json`` with a ``model_type``, safetensors
  weights and ``tokenizer.json``) with :func:`lattn_jax.halo.loaders.load_hf`;
* a llama.cpp ``.gguf`` file (recognised by its ``GGUF`` magic bytes) with
  :func:`lattn_jax.halo.loaders.load_gguf`, tokenizer from its metadata.

HF and GGUF models are rebuilt in fp32 with ``use_segment_ids`` on, so that left-padded batched
generation keeps the padding in its own segment (:mod:`lattn_jax.eval.generate`); scoring calls,
which pass no segment ids, are unchanged by it. Nothing is downloaded: every path is local.
"""

import dataclasses
import json
import os
import shlex
import sys
from typing import Callable, Literal, Optional

from lattn_jax import checkpoint as checkpoint_lib
from lattn_jax import config as config_lib
from lattn_jax import model as model_lib
from lattn_jax import train as train_lib
from lattn_jax.data import config as data_config_lib
from lattn_jax.data import tokenizers as tok_lib
from lattn_jax.halo import loaders

ModelKind = Literal["lattn_jax", "halo", "hf", "gguf"]
# What the evaluators accept, for error messages.
ACCEPTED = ("a lattn-jax training workdir (config.json + checkpoints/), a HALO workdir "
            "(experiments/halo.py's --workdir, after its stage2), a Hugging Face checkpoint "
            "directory (config.json with a model_type, safetensors, tokenizer.json) or a .gguf "
            "file")
_KIND_NAMES = {"lattn_jax": "lattn-jax training workdir", "halo": "HALO workdir",
               "hf": "Hugging Face directory", "gguf": "GGUF file"}
# Kinds whose checkpoints have steps (``--step``).
STEPPED_KINDS = ("lattn_jax", "halo")


@dataclasses.dataclass
class Restored:
    """A restored model.

    Attributes:
      model: the :class:`~lattn_jax.model.LanguageModel` with the checkpoint's parameters.
      tokenizer: the run's tokenizer (``config.data.tokenizer`` / ``tokenizer_path``), or the
        HF directory's ``tokenizer.json`` / the GGUF file's vocabulary.
      config: the run's :class:`~lattn_jax.config.ExperimentConfig`; ``None`` for HALO
        students, HF and GGUF models.
      step: the checkpoint's step (a HALO student's: of its ``stage``); ``None`` for HF and
        GGUF models.
      kind: ``"lattn_jax"``, ``"halo"``, ``"hf"`` or ``"gguf"`` (:func:`model_kind`).
      path: what was loaded.
      stage: a HALO student's stage (``"stage3"`` or ``"stage2"``); ``None`` otherwise.
    """

    model: model_lib.LanguageModel
    tokenizer: tok_lib.Tokenizer
    config: Optional[config_lib.ExperimentConfig]
    step: Optional[int]
    kind: ModelKind = "lattn_jax"
    path: str = ""
    stage: Optional[str] = None

    @property
    def model_config(self) -> config_lib.ModelConfig:
        """The model's :class:`~lattn_jax.config.ModelConfig`."""
        return self.model.config

    @property
    def training_data(self):
        """The run's ``config.data`` (:class:`~lattn_jax.data.config.DataConfig`); ``None`` for
        HF and GGUF models, whose training data is unknown."""
        return None if self.config is None else self.config.data

    def describe(self) -> str:
        """One line for logs and report headers: ``"step 200"``, ``"HALO student, stage3 step
        400"`` or ``"GGUF file"``."""
        if self.kind == "lattn_jax":
            return f"step {self.step}"
        if self.kind == "halo":
            return f"HALO student, {self.stage} step {self.step}"
        return model_kind_name(self.kind)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def _where_hint(path: str) -> str:
    """``"; <hint>"`` for a directory without ``config.json`` that is part of a training run or a
    sweep (a ``<workdir>/checkpoints/<N>`` step folder, ``<workdir>/checkpoints``, a sweep root
    with ``runs/<name>`` workdirs or a ``sweep.jsonl``), naming the ``--checkpoint`` (and
    ``--step``) to pass instead; ``""`` otherwise."""
    path = os.path.normpath(path)
    parent, name = os.path.split(path)
    if name == "checkpoints" and os.path.isfile(os.path.join(parent, "config.json")):
        return f"; pass the workdir above it: --checkpoint={shlex.quote(parent)}"
    if name.isdigit() and os.path.basename(parent) == "checkpoints":
        return (f"; {path} is a checkpoint step folder: pass "
                f"--checkpoint={shlex.quote(os.path.dirname(parent))} --step={int(name)}")
    runs_dir = os.path.join(path, "runs")  # lattn_jax.sweep.RUNS_DIR (not imported: heavy)
    runs = sorted(n for n in (os.listdir(runs_dir) if os.path.isdir(runs_dir) else ())
                  if os.path.isfile(os.path.join(runs_dir, n, "config.json")))
    if runs:
        return (f"; {path} is a sweep root: pass one of {runs_dir}/<name> (e.g. "
                f"{', '.join(os.path.join(runs_dir, n) for n in runs[:2])})")
    if os.path.isfile(os.path.join(path, "sweep.jsonl")):  # sweep_report.SWEEP_LOG
        return f"; {path} is a sweep root, but none of its runs has a config.json yet"
    return ""


def _halo_stage_error(path: str) -> Optional[str]:
    """The one-line error for ``path`` when it is a stage's folder of a HALO workdir (its
    ``stage2``, ``stage3``, ... folder, their ``checkpoints`` or a checkpoint step folder;
    :func:`lattn_jax.halo.experiment.stage_folder`): what to pass instead, the HALO workdir
    (``--checkpoint``, and ``--step`` for a step of the student's stage), whose student the
    loader takes from its newest stage; ``None`` for any other path."""
    parent = os.path.dirname(os.path.normpath(os.path.abspath(path)))
    if not any(os.path.isfile(os.path.join(d, "config.json"))
               for d in (parent, os.path.dirname(parent),
                         os.path.dirname(os.path.dirname(parent)))):
        return None  # not inside a workdir: the HALO stages are not imported
    from lattn_jax.halo import experiment  # noqa: PLC0415 (heavy: the HALO stages)
    inside = experiment.stage_folder(path)
    if inside is None:
        return None
    workdir, stage, step = inside
    where = f"{path} is the {stage} folder of the HALO workdir {workdir}, not a model"
    arg = shlex.quote(workdir)  # the hints' --workdir / --checkpoint, pasted into a shell
    student = experiment.student_stage(workdir)
    if student is None:
        return (f"{where}, and that workdir has no converted student yet (no stage3 or stage2 "
                f"checkpoint): run experiments/halo.py --workdir={arg} --stage=stage2, "
                f"then pass --checkpoint={arg}")
    steps = checkpoint_lib.saved_steps(os.path.join(workdir, student))
    if stage != student:
        why = ("Stage 2's checkpoints are not loaded once Stage 3 has one" if stage == "stage2"
               else f"{stage} holds no student")
        return (f"{where}: pass the HALO workdir, --checkpoint={arg}, whose student is "
                f"{student}'s newest checkpoint (step {steps[-1]}; {why})")
    if step is not None:
        return (f"{where}: pass the HALO workdir and the step, --checkpoint={arg} "
                f"--step={step} ({student}'s checkpoints hold its student)")
    return (f"{where}: pass the HALO workdir, --checkpoint={arg} (its student: {student}'s "
            f"newest checkpoint, step {steps[-1]}; --step picks another of {student}'s)")


def load_config(workdir: str) -> config_lib.ExperimentConfig:
    """The run's config from ``<workdir>/config.json``.

    Bundled files are resolved in this package (``"bundled:..."`` names, or absolute paths
    into the assets of the clone that wrote the run); ``data.paths`` and ``data.val_paths``
    need not exist.

    Raises:
      FileNotFoundError: if the workdir or its config.json, or the tokenizer, is missing.
      ValueError: if the saved config is not valid JSON, is another kind of run's (a HALO
        pipeline's: naming the binary that evaluates it), or does not validate (naming it).
    """
    if not os.path.isdir(workdir):
        raise FileNotFoundError(f"no such checkpoint directory: {workdir} (expected a workdir "
                                f"written by experiments/train.py)")
    path = os.path.join(workdir, "config.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(_halo_stage_error(workdir) or (
            f"no config.json in checkpoint directory {workdir} (expected a workdir written by "
            f"experiments/train.py){_where_hint(workdir)}"))
    values = config_lib.read_run_config_json(path)
    kind = config_lib.config_kind(values)
    if kind == "halo":
        raise config_lib.ConfigError(
            f"{path} is a HALO pipeline's config, not a training run's: {workdir} is a HALO "
            f"workdir, whose student the pipeline's report stage evaluates "
            f"(experiments/halo_pipeline.py --stages=report) and load_model loads; expected a "
            f"workdir written by experiments/train.py")
    if "model" not in values:
        other = config_lib.describe_config_kind(values)
        raise config_lib.ConfigError(
            f"{path} is not a training run's config (it has no 'model' section"
            f"{'; ' + other if other else ''}); expected a workdir written by "
            f"experiments/train.py")
    with data_config_lib.unchecked_data_paths():
        # The training corpus need not exist here (another machine, a copied run): restoring
        # needs the model config and the tokenizer only.
        return config_lib.experiment_from_config_dict(values)


def _reused_from(workdir: str) -> Optional[str]:
    """The run directory a sweep's ``--reuse_from`` copied ``workdir``'s records from (the
    ``reused_from`` entry of its ``sweep_run.json``: :data:`lattn_jax.sweep.REUSED_KEY` in
    :data:`lattn_jax.sweep.RUN_RECORD`), else ``None``."""
    try:
        with open(os.path.join(workdir, "sweep_run.json")) as f:
            source = json.load(f).get("reused_from")
    except (OSError, ValueError, AttributeError):
        return None
    return source if isinstance(source, str) and source else None


def load(workdir: str, step: Optional[int] = None, *,
         report: Callable[[str], None] = _stderr) -> Restored:
    """Restores the model of ``step`` (default: the newest readable checkpoint) from ``workdir``.

    Args:
      workdir: a training workdir.
      step: a checkpoint step; ``None`` takes the newest readable one (an unreadable newer one
        is reported in one line through ``report`` and skipped, not moved).
      report: where that line goes (default: stderr).

    Returns:
      A :class:`Restored`.

    Raises:
      FileNotFoundError: no config.json, no checkpoint (for a sweep run whose records
        ``--reuse_from`` copied, naming the run that holds them), or no checkpoint at ``step``.
      CheckpointError: no checkpoint can be read; ``CheckpointMismatchError`` when the one to
        restore holds another model than ``config.json`` describes (one line naming the first
        differing parameter path and shape).
      ValueError: the saved config or parameters do not match the code.
    """
    config = load_config(workdir)
    path = os.path.join(workdir, "config.json")
    reused = _reused_from(workdir)
    if reused and not checkpoint_lib.saved_steps(workdir):
        raise FileNotFoundError(
            f"no checkpoint in {os.path.join(workdir, 'checkpoints')}: a sweep's --reuse_from "
            f"copied this run's records from {reused}, not its checkpoints; load that run "
            f"instead")
    ckpt = checkpoint_lib.Checkpointer(workdir, async_save=False)
    try:
        trainer = train_lib.Trainer(config)
        advice = f"{path} does not describe the model it holds"
        if step is None:
            step, state = ckpt.restore_latest(
                trainer.abstract_state(), report=report, mismatch_advice=advice,
                unreadable_advice="There is no model to restore: copy its checkpoints back "
                                  "from a backup, or train it again.")
        else:
            state = ckpt.restore_step(step, trainer.abstract_state(), mismatch_advice=advice)
    finally:
        ckpt.close()
    model = trainer.model(state["params"])
    tokenizer = tok_lib.make_tokenizer(config.data.tokenizer, config.data.tokenizer_path)
    return Restored(model=model, tokenizer=tokenizer, config=config, step=int(step),
                    kind="lattn_jax", path=workdir)


def model_kind(path: str) -> ModelKind:
    """Which kind of model ``path`` holds, checked without loading any weights.

    A file is a GGUF file if it starts with the magic bytes ``GGUF``; a directory is a Hugging
    Face checkpoint if its ``config.json`` has a ``model_type`` (its ``tokenizer.json`` must be
    there too), a HALO workdir if its ``config.json`` is a HALO pipeline's (a ``stage2`` or
    ``stage3`` checkpoint must be there too), else a lattn-jax training workdir (its
    ``config.json`` must validate).

    Args:
      path: a local file or directory.

    Returns:
      ``"gguf"``, ``"hf"``, ``"halo"`` or ``"lattn_jax"``.

    Raises:
      FileNotFoundError: ``path`` does not exist, a directory without ``config.json`` (a
        stage's folder of a HALO workdir: naming the workdir to pass), an HF directory without
        ``tokenizer.json``, or a HALO workdir without a Stage-2/3 checkpoint (each message
        names the path).
      ConfigError: (a ``ValueError``) a file that is not GGUF, a ``config.json`` that is not
        a JSON object, or a lattn-jax config that does not validate.
    """
    if not os.path.exists(path):
        raise FileNotFoundError(f"no such checkpoint: {path} (expected {ACCEPTED})")
    if os.path.isfile(path):
        with open(path, "rb") as f:
            magic = f.read(4)
        if magic != b"GGUF":
            raise config_lib.ConfigError(f"{path} is a file but not a GGUF file (it starts with "
                                         f"{magic!r}, not b'GGUF'); expected {ACCEPTED}")
        return "gguf"
    config_path = os.path.join(path, "config.json")
    if not os.path.isfile(config_path):
        raise FileNotFoundError(_halo_stage_error(path) or (
            f"no config.json in checkpoint directory {path} (expected {ACCEPTED})"
            f"{_where_hint(path)}"))
    try:
        with open(config_path) as f:
            raw = json.load(f)
    except json.JSONDecodeError as e:
        raise config_lib.ConfigError(f"{config_path} is not valid JSON ({e})") from e
    if not isinstance(raw, dict):
        raise config_lib.ConfigError(f"{config_path} does not hold a JSON object")
    if "model_type" in raw:
        tokenizer = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(tokenizer):
            raise FileNotFoundError(f"{tokenizer}: no such file (the Hugging Face checkpoint's "
                                    f"tokenizer; evaluation needs it)")
        return "hf"
    if config_lib.config_kind(raw) == "halo":
        from lattn_jax.halo import experiment  # noqa: PLC0415 (heavy: the HALO stages)
        if experiment.student_stage(path) is None:
            raise FileNotFoundError(f"{path} is a HALO workdir without a converted student: no "
                                    f"stage3 or stage2 checkpoint; run experiments/halo.py "
                                    f"--stage=stage2 first")
        return "halo"
    load_config(path)  # a lattn-jax workdir: its config must validate
    return "lattn_jax"


def model_kind_name(kind: ModelKind) -> str:
    """``"lattn-jax training workdir"``, ``"HALO workdir"``, ``"Hugging Face directory"`` or
    ``"GGUF file"``.

    Raises:
      KeyError: for a kind other than those of :func:`model_kind`.
    """
    return _KIND_NAMES[kind]


def load_model(path: str, step: Optional[int] = None, *,
               report: Callable[[str], None] = _stderr) -> Restored:
    """Loads a model and its tokenizer from any of the four kinds of :func:`model_kind`.

    Args:
      path: a lattn-jax training workdir, a HALO workdir, a Hugging Face checkpoint directory
        or a ``.gguf`` file (local; nothing is downloaded).
      step: a checkpoint step of a training workdir (``None``: the newest readable one) or of
        a HALO student's stage (``None``: its newest); must be ``None`` for HF and GGUF
        models.
      report: where :func:`load` reports a skipped unreadable checkpoint (default: stderr).

    Returns:
      A :class:`Restored`. HF and GGUF models come as fp32 all-attention
      :class:`~lattn_jax.model.LanguageModel` s (:mod:`lattn_jax.halo.loaders`) with
      ``use_segment_ids`` on (padding-safe batched generation), ``config=None`` and
      ``step=None``. A HALO student comes as the HypeNet model that the HALO report measures
      (:func:`lattn_jax.halo.experiment.load_student`: ``config.report``'s dtypes,
      ``use_segment_ids`` on, the calibrated logit scaling), with ``config=None``, its
      ``stage`` and ``step``.

    Raises:
      FileNotFoundError: from :func:`model_kind` (a missing path or file).
      ConfigError: (a ``ValueError``) from :func:`model_kind` (a file that is not a
        checkpoint), and a ``step`` given for an HF or GGUF model.
      FileNotFoundError: a HALO student's missing step or teacher file (named).
      ValueError: from the loaders (an unsupported architecture, a missing tensor, no
        checkpoint at ``step``; each names the file).
      ImportError: the ``gguf`` / ``safetensors`` package that the file needs is not installed
        (the message says which extra installs it).
      CheckpointError: no checkpoint of a workdir can be read.
    """
    kind = model_kind(path)
    if kind == "lattn_jax":
        return load(path, step, report=report)
    if kind == "halo":
        from lattn_jax.halo import experiment  # noqa: PLC0415 (heavy: the HALO stages)
        student = experiment.load_student(path, step)
        return Restored(model=loaders.build_model(student.model_config, student.params),
                        tokenizer=student.tokenizer, config=None, step=student.step,
                        kind="halo", path=path, stage=student.stage)
    if step is not None:
        raise config_lib.ConfigError(f"step={step}: a checkpoint step applies to lattn-jax "
                                     f"training and HALO workdirs only; {path} is a "
                                     f"{model_kind_name(kind)}")
    try:
        teacher = loaders.load_gguf(path) if kind == "gguf" else loaders.load_hf(path)
    except ModuleNotFoundError as e:
        raise ImportError(f"reading {path} needs the {e.name!r} package: pip install "
                          f"'lattn-jax[halo]' (or '.[data]' for gguf alone)") from e
    if teacher.tokenizer is None:  # model_kind checked tokenizer.json; GGUF always has one
        raise FileNotFoundError(f"{path}: no tokenizer found next to the weights")
    cfg = dataclasses.replace(teacher.model_config, use_segment_ids=True)
    return Restored(model=loaders.build_model(cfg, teacher.params), tokenizer=teacher.tokenizer,
                    config=None, step=None, kind=kind, path=path)
