"""Causal softmax attention mixer: MHA/GQA, RoPE, optional QK norm and sigmoid output gate.

Paper 1 (arXiv 2607.07953) §2 / spec §2.5: one fused projection ``D -> (H [+ H] + 2G) * d_h``
laid out as ``[q | gate | k | v]``, scale ``1/sqrt(d_h)``, RoPE (base 5e5, rotate-half) on q and
k, ``o <- o * sigmoid(gate)`` before the output projection when the gate is on, no biases.

Attention itself goes through ``jax.nn.dot_product_attention`` (the XLA implementation on CPU,
cuDNN where available). Packed documents are separated by a block-diagonal mask built from
``segment_ids``, and RoPE positions restart at every document.
"""

import itertools
import math
from typing import Optional

import jax
import jax.numpy as jnp
from flax import nnx

from lattn_jax import config as config_lib
from lattn_jax import layers
from lattn_jax.typing import Array
from pallas_kernels.common import validation


class Attention(nnx.Module):
    """Causal multi-head / grouped-query softmax attention.

    ``o_t = softmax(q_t K_{<=t}^T / sqrt(d_h)) V_{<=t}`` per head (Vaswani et al. 2017, Eq. 1),
    query head ``n`` reading key/value group ``n // (H / G)``.

    Args:
      model_config: the model's :class:`~lattn_jax.config.ModelConfig` (reads ``d_model``,
        ``attention``, ``init_std``, ``num_layers``, ``norm_eps``, dtypes).
      rngs: NNX rngs.

    Raises:
      ValueError: from the config, if ``d_model`` is not divisible by ``num_heads`` (and no
        ``head_dim`` is given) or ``num_heads`` is not a multiple of ``num_kv_heads``.
    """

    def __init__(self, model_config: config_lib.ModelConfig, *, rngs: nnx.Rngs):
        cfg = model_config.attention
        self.num_heads = cfg.num_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = model_config.attention_head_dim
        self.rope_theta = cfg.rope_theta
        self.output_gate = cfg.output_gate
        self.dtype = jnp.dtype(model_config.dtype)
        param_dtype = jnp.dtype(model_config.param_dtype)
        d = model_config.d_model
        q_width = self.num_heads * self.head_dim
        kv_width = self.num_kv_heads * self.head_dim
        gate_width = q_width if self.output_gate else 0
        self.qkv_proj = layers.Dense(
            d, q_width + gate_width + 2 * kv_width, std=model_config.init_std, rngs=rngs,
            dtype=self.dtype, param_dtype=param_dtype)
        out_std = model_config.init_std / math.sqrt(2 * model_config.num_layers)
        self.out_proj = layers.Dense(q_width, d, std=out_std, rngs=rngs, dtype=self.dtype,
                                     param_dtype=param_dtype)
        if cfg.qk_norm:
            self.q_norm = layers.RMSNorm(self.head_dim, eps=model_config.norm_eps,
                                         param_dtype=param_dtype)
            self.k_norm = layers.RMSNorm(self.head_dim, eps=model_config.norm_eps,
                                         param_dtype=param_dtype)
        else:
            self.q_norm = self.k_norm = None

    def __call__(self, x: Array, *, segment_ids: Optional[Array] = None) -> Array:
        """Mixes a sequence.

        Args:
          x: ``[B, T, D]`` normalised hidden states.
          segment_ids: optional int ``[B, T]``; tokens attend only within their own document.

        Returns:
          ``[B, T, D]`` in the compute dtype.
        """
        b, t, _ = x.shape
        h, g, dh = self.num_heads, self.num_kv_heads, self.head_dim
        proj = self.qkv_proj(x)
        sizes = [h * dh] + ([h * dh] if self.output_gate else []) + [g * dh, g * dh]
        parts = jnp.split(proj, list(itertools.accumulate(sizes))[:-1], axis=-1)
        if self.output_gate:
            q, gate, k, v = parts
        else:
            (q, k, v), gate = parts, None
        q = q.reshape(b, t, h, dh)  # [B, T, H, dh]
        k = k.reshape(b, t, g, dh)  # [B, T, G, dh]
        v = v.reshape(b, t, g, dh)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rope_theta is not None:
            positions = layers.positions_from_segment_ids(segment_ids, b, t)
            q = layers.apply_rope(q, positions, self.rope_theta)
            k = layers.apply_rope(k, positions, self.rope_theta)
        mask = None
        if segment_ids is not None:
            doc = validation.document_index(segment_ids)
            mask = (doc[:, :, None] == doc[:, None, :])[:, None, :, :]  # [B, 1, T, T]
        o = jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=True,
                                         scale=1.0 / math.sqrt(dh))  # [B, T, H, dh]
        o = o.reshape(b, t, h * dh)
        if gate is not None:
            o = o * jax.nn.sigmoid(gate.astype(jnp.float32)).astype(o.dtype)
        return self.out_proj(o)
