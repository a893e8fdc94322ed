"""Loads a trained model and its tokenizer from a training workdir, for evaluation.

``lattn_jax.train.train_and_evaluate`` writes ``<workdir>/config.json`` (the resolved
:class:`~lattn_jax.config.ExperimentConfig`) and orbax checkpoints under
``<workdir>/checkpoints/<step>`` (:mod:`lattn_jax.checkpoint`). This module rebuilds the config,
restores the train state through :class:`~lattn_jax.checkpoint.Checkpointer` and returns the NNX
model with the parameters of the requested step.
"""

import dataclasses
import json
import os
import sys
from typing import Callable, Optional

from lattn_jax import checkpoint as checkpoint_lib
from lattn_jax import config as config_lib
from lattn_jax import model as model_lib
from lattn_jax import train as train_lib
from lattn_jax.data import config as data_config_lib
from lattn_jax.data import tokenizers as tok_lib


@dataclasses.dataclass
class Restored:
    """A restored model.

    Attributes:
      model: the :class:`~lattn_jax.model.LanguageModel` with the checkpoint's parameters.
      tokenizer: the run's tokenizer (``config.data.tokenizer`` / ``tokenizer_path``).
      config: the run's :class:`~lattn_jax.config.ExperimentConfig`.
      step: the checkpoint's step.
    """

    model: model_lib.LanguageModel
    tokenizer: tok_lib.Tokenizer
    config: config_lib.ExperimentConfig
    step: int


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def load_config(workdir: str) -> config_lib.ExperimentConfig:
    """The run's config from ``<workdir>/config.json``.

    Bundled files are resolved in this package (``"bundled:..."`` names, or absolute paths
    into the assets of the clone that wrote the run); ``data.paths`` and ``data.val_paths``
    need not exist.

    Raises:
      FileNotFoundError: if the workdir or its config.json, or the tokenizer, is missing.
      ValueError: if the saved config does not validate.
    """
    path = os.path.join(workdir, "config.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no config.json in checkpoint directory {workdir} (expected a "
                                f"workdir written by experiments/train.py)")
    with open(path) as f, data_config_lib.unchecked_data_paths():
        # The training corpus need not exist here (another machine, a copied run): restoring
        # needs the model config and the tokenizer only.
        return config_lib.experiment_from_config_dict(json.load(f))


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
      FileNotFoundError: no config.json, no checkpoint, or no checkpoint at ``step``.
      CheckpointError: no checkpoint can be read.
      ValueError: the saved config or parameters do not match the code.
    """
    config = load_config(workdir)
    ckpt = checkpoint_lib.Checkpointer(workdir, async_save=False)
    try:
        trainer = train_lib.Trainer(config)
        if step is None:
            step, state = ckpt.restore_latest(trainer.abstract_state(), report=report)
        else:
            state = ckpt.restore_step(step, trainer.abstract_state())
    finally:
        ckpt.close()
    model = trainer.model(state["params"])
    tokenizer = tok_lib.make_tokenizer(config.data.tokenizer, config.data.tokenizer_path)
    return Restored(model=model, tokenizer=tokenizer, config=config, step=int(step))
