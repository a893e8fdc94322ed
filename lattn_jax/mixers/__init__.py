"""Token mixers, one module per variant, and the registry that maps layer-pattern names to them.

A layer pattern (``ModelConfig.layer_pattern``) names one mixer per layer:

* ``"attn"``: causal softmax attention (:class:`attention.Attention`), MHA/GQA, RoPE, optional
  QK norm, output gate and HypeNet logit scaling;
* ``"attn_nope"``: the same without RoPE (:class:`attention.NoPEAttention`, HypeNet's NoPE
  layers);
* ``"gdn"``: Gated DeltaNet (:class:`gated_deltanet.GatedDeltaNet`);
* ``"deltanet"``: DeltaNet (:class:`deltanet.DeltaNet`);
* ``"kda"``: Kimi Delta Attention (:class:`kda.KimiDeltaAttention`);
* ``"gdn2"``: Gated DeltaNet-2 (:class:`gdn2.GatedDeltaNet2`);
* ``"lightning"``: HypeNet's Lightning Attention (:class:`lightning.LightningAttention`);
* ``"linear_attn"``: plain linear attention (:class:`linear_attention.LinearAttention`).

Every mixer is built as ``Mixer(model_config, rngs=rngs)`` and called as
``mixer(x, segment_ids=segment_ids)`` with ``x: [B, T, D]``, returning ``[B, T, D]``. For
decoding, ``mixer(x, segment_ids=..., state=state, return_state=True)`` returns ``(y, new_state)``
with an explicit NamedTuple state from ``mixer.init_state(batch)`` (softmax attention:
``init_state(batch, max_len)``, a KV cache); a call with ``T == 1`` is one decoding step.
"""

from typing import Dict, Type

from flax import nnx

from lattn_jax import config as config_lib
from lattn_jax.mixers import attention
from lattn_jax.mixers import deltanet
from lattn_jax.mixers import gated_deltanet
from lattn_jax.mixers import gdn2
from lattn_jax.mixers import kda
from lattn_jax.mixers import lightning
from lattn_jax.mixers import linear_attention

REGISTRY: Dict[str, Type[nnx.Module]] = {
    "attn": attention.Attention,
    "gdn": gated_deltanet.GatedDeltaNet,
    "deltanet": deltanet.DeltaNet,
    "kda": kda.KimiDeltaAttention,
    "gdn2": gdn2.GatedDeltaNet2,
    "lightning": lightning.LightningAttention,
    "linear_attn": linear_attention.LinearAttention,
    "attn_nope": attention.NoPEAttention,
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
