"""The language model: embedding, a pattern of pre-norm blocks, final RMSNorm and LM head.

Block (paper 1 §1, Megatron ``TransformerLayer``)::

    h <- h + Mixer(RMSNorm(h))
    h <- h + SwiGLU(RMSNorm(h))

No absolute positions: RoPE lives inside the softmax layers. The embedding and the head use
``N(0, 0.02^2)``; the head is tied to the embedding when ``tie_embeddings`` is set.
"""

import math
from typing import Optional

import jax
import jax.numpy as jnp
from flax import nnx

from lattn_jax import config as config_lib
from lattn_jax import layers
from lattn_jax import mixers
from lattn_jax.typing import Array


class Block(nnx.Module):
    """One pre-norm residual block: a token mixer then a SwiGLU MLP.

    Args:
      mixer_name: a name from ``lattn_jax.mixers.REGISTRY``.
      model_config: the model configuration.
      rngs: NNX rngs.
    """

    def __init__(self, mixer_name: str, model_config: config_lib.ModelConfig, *, rngs: nnx.Rngs):
        pdt = jnp.dtype(model_config.param_dtype)
        dt = jnp.dtype(model_config.dtype)
        d = model_config.d_model
        self.mixer_name = mixer_name
        self.mixer_norm = layers.RMSNorm(d, eps=model_config.norm_eps, param_dtype=pdt)
        self.mixer = mixers.build_mixer(mixer_name, model_config, rngs=rngs)
        self.mlp_norm = layers.RMSNorm(d, eps=model_config.norm_eps, param_dtype=pdt)
        self.mlp = layers.SwiGLU(
            d, model_config.mlp_hidden, std=model_config.init_std,
            out_std=model_config.init_std / math.sqrt(2 * model_config.num_layers),
            rngs=rngs, dtype=dt, param_dtype=pdt)

    def __call__(self, h: Array, *, segment_ids: Optional[Array] = None) -> Array:
        """``h``: ``[B, T, D]`` -> ``[B, T, D]`` (same dtype)."""
        h = h + self.mixer(self.mixer_norm(h), segment_ids=segment_ids).astype(h.dtype)
        return h + self.mlp(self.mlp_norm(h)).astype(h.dtype)


class LanguageModel(nnx.Module):
    """Decoder-only LM whose layers follow ``model_config.layer_pattern``.

    Args:
      model_config: a validated :class:`~lattn_jax.config.ModelConfig`.
      rngs: NNX rngs.
    """

    def __init__(self, model_config: config_lib.ModelConfig, *, rngs: nnx.Rngs):
        self.config = model_config
        pdt = jnp.dtype(model_config.param_dtype)
        self.dtype = jnp.dtype(model_config.dtype)
        self.embed = nnx.Param(layers.normal_init(model_config.init_std)(
            rngs.params(), (model_config.vocab_size, model_config.d_model), pdt))
        self.blocks = nnx.List(
            [Block(name, model_config, rngs=rngs) for name in model_config.layer_pattern])
        self.final_norm = layers.RMSNorm(model_config.d_model, eps=model_config.norm_eps,
                                         param_dtype=pdt)
        if model_config.tie_embeddings:
            self.head = None
        else:
            self.head = layers.Dense(model_config.d_model, model_config.vocab_size,
                                     std=model_config.init_std, rngs=rngs, dtype=self.dtype,
                                     param_dtype=pdt)

    def __call__(self, tokens: Array, *, segment_ids: Optional[Array] = None) -> Array:
        """Computes next-token logits.

        Args:
          tokens: int ``[B, T]`` token ids.
          segment_ids: optional int ``[B, T]`` document ids of a packed window; used only when
            ``model_config.use_segment_ids`` is set.

        Returns:
          fp32 logits ``[B, T, S]``.
        """
        if not self.config.use_segment_ids:
            segment_ids = None
        h = jnp.take(self.embed[...], tokens, axis=0).astype(self.dtype)  # [B, T, D]
        for block in self.blocks:
            if self.config.remat:
                h = nnx.remat(lambda blk, x: blk(x, segment_ids=segment_ids))(block, h)
            else:
                h = block(h, segment_ids=segment_ids)
        h = self.final_norm(h)
        if self.head is None:
            logits = jnp.einsum("btd,sd->bts", h, self.embed[...].astype(self.dtype))
        else:
            logits = self.head(h)
        return logits.astype(jnp.float32)


def count_params(model: nnx.Module) -> int:
    """Number of scalar parameters in ``model``."""
    return sum(x.size for x in jax.tree_util.tree_leaves(nnx.state(model, nnx.Param)))
