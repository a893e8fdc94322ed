"""Token mixers, one module per variant, and the registry that maps layer-pattern names to them.

A layer pattern (``ModelConfig.layer_pattern``) names one mixer per layer:

* ``"attn"``: causal softmax attention (:class:`attention.Attention`);
* ``"gdn"``: Gated DeltaNet (:class:`gated_deltanet.GatedDeltaNet`).

Every mixer is built as ``Mixer(model_config, rngs=rngs)`` and called as
``mixer(x, segment_ids=segment_ids)`` with ``x: [B, T, D]``.
"""

from typing import Dict, Type

from flax import nnx

from lattn_jax import config as config_lib
from lattn_jax.mixers import attention
from lattn_jax.mixers import gated_deltanet

REGISTRY: Dict[str, Type[nnx.Module]] = {
    "attn": attention.Attention,
    "gdn": gated_deltanet.GatedDeltaNet,
}

if tuple(REGISTRY) != config_lib.MIXER_NAMES:
    raise ImportError(f"mixer registry {tuple(REGISTRY)} != config.MIXER_NAMES "
                      f"{config_lib.MIXER_NAMES}; update both together")


def build_mixer(name: str, model_config: config_lib.ModelConfig, *, rngs: nnx.Rngs) -> nnx.Module:
    """Instantiates the mixer called ``name``.

    Raises:
      ValueError: if ``name`` is not in :data:`REGISTRY`.
    """
    if name not in REGISTRY:
        raise ValueError(f"unknown mixer {name!r}; choose from {', '.join(REGISTRY)}")
    return REGISTRY[name](model_config, rngs=rngs)
