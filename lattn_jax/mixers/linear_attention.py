"""Plain (additive) linear attention mixer (paper 1 arXiv 2607.07953, Eqs. 4-10; spec §2.3).

The authors' "Linear Transformer" (LT): DeltaNet's shell (spec §2.2) with the additive rule. Per
layer, from the normalised stream ``x``:

* one fused projection ``D -> 2 HK K + H V (+ H)`` laid out ``[q | k | v (| beta)]``; the
  ``beta`` rows are computed by the authors but never used (spec §10 item 14) and are kept only
  when ``dead_beta_proj`` is set, so that parameter counts match spec §3;
* a causal depthwise short convolution (width 4, no bias) over ``[q; k; v]`` followed by SiLU
  (``conv_width = 0`` removes it);
* ``q, k <- q / ||q||, k / ||k||`` per head (eps 1e-6);
* ``S_t = S_{t-1} + k_t v_t^T``, ``o_t = S_t^T q_t / sqrt(K)``: no decay and no normaliser
  (``pallas_kernels.simple_gla.linear_attention``);
* a per-head RMSNorm over ``V`` (one weight shared by all heads), no gate, and the output
  projection ``H V -> D``.
"""

import functools
import math
from typing import Optional, Tuple, Union

import jax.numpy as jnp
from flax import nnx

from lattn_jax import config as config_lib
from lattn_jax import context_parallel
from lattn_jax import layers
from lattn_jax.typing import Array
from pallas_kernels.simple_gla import api as sg


class LinearAttention(nnx.Module):
    """The plain linear-attention token mixer.

    Decoding: ``state = module.init_state(B)``, then ``y, state = module(x, state=state,
    return_state=True)`` for a prompt (any ``T``) and for each new token (``T == 1``).

    Args:
      model_config: the model's :class:`~lattn_jax.config.ModelConfig` (reads ``d_model``,
        ``linear_attn``, ``init_std``, ``num_layers``, dtypes).
      rngs: NNX rngs.

    Attributes:
      in_proj: fused ``[D, 2 HK K + H V (+ H)]`` projection, ``N(0, init_std^2)``.
      conv: short convolution over the ``2 HK K + H V`` q/k/v channels, or ``None``.
      o_norm: RMSNorm over ``V``, shared across heads.
      out_proj: ``[H V, D]`` output projection, ``N(0, (init_std / sqrt(2 L))^2)``.
    """

    def __init__(self, model_config: config_lib.ModelConfig, *, rngs: nnx.Rngs):
        cfg = model_config.linear_attn
        self.cfg = cfg
        self.dtype = jnp.dtype(model_config.dtype)
        param_dtype = jnp.dtype(model_config.param_dtype)
        d = self.d_model = model_config.d_model
        self.qk_dim = cfg.num_k_heads * cfg.head_k_dim
        self.v_dim = cfg.num_v_heads * cfg.head_v_dim
        width = 2 * self.qk_dim + self.v_dim + (cfg.num_v_heads if cfg.dead_beta_proj else 0)
        self.in_proj = layers.Dense(d, width, std=model_config.init_std, rngs=rngs,
                                    dtype=self.dtype, param_dtype=param_dtype)
        if cfg.conv_width > 0:
            self.conv = layers.ShortConv(2 * self.qk_dim + self.v_dim, cfg.conv_width, rngs=rngs,
                                         dtype=self.dtype, param_dtype=param_dtype)
        else:
            self.conv = None
        self.o_norm = layers.RMSNorm(
            cfg.head_v_dim, eps=cfg.norm_eps, param_dtype=param_dtype,
            implementation=model_config.norm_implementation)
        out_std = model_config.init_std / math.sqrt(2 * model_config.num_layers)
        self.out_proj = layers.Dense(self.v_dim, d, std=out_std, rngs=rngs, dtype=self.dtype,
                                     param_dtype=param_dtype)

    def init_state(self, batch: int) -> layers.RecurrentState:
        """Zero decoding state: conv ``[B, W - 1, 2 HK K + H V]`` (or ``None``), fp32 S.

        Raises:
          ValueError: ``batch`` is not a positive integer
            (:func:`~lattn_jax.layers.check_init_state_batch`).
        """
        layers.check_init_state_batch(batch)
        return layers.zero_recurrent_state(self.cfg, batch, self.dtype,
                                           conv=self.conv is not None)

    def __call__(self, x: Array, *, segment_ids: Optional[Array] = None,
                 state: Optional[layers.RecurrentState] = None,
                 return_state: bool = False) -> Union[Array, Tuple[Array, layers.RecurrentState]]:
        """Mixes a sequence, or continues one from ``state``.

        Args:
          x: ``[B, T, D]`` normalised hidden states.
          segment_ids: optional int ``[B, T]``; the state resets at each document start. With a
            ``state``, the call's first document continues it and the returned state belongs to
            the row's last document.
          state: optional :class:`~lattn_jax.layers.RecurrentState`; ``None``
            starts from zeros.
          return_state: also return the state after the last token.

        Returns:
          ``y`` ``[B, T, D]`` in the compute dtype, or ``(y, new_state)`` if ``return_state``.

        Raises:
          ValueError: if ``x`` is not ``[B, T, d_model]`` or ``segment_ids`` is not ``[B, T]``
            like ``x`` (naming the argument and the expected shape; static shapes, checked
            first); if ``state`` was built for another batch size.
        """
        cfg = self.cfg
        layers.check_mixer_input(x, self.d_model, segment_ids)
        b, t, _ = x.shape
        layers.check_state_batch(state, b)
        # The dead beta rows (if any) are dropped here, as in the authors' code.
        qkv = self.in_proj(x)[..., :2 * self.qk_dim + self.v_dim]
        conv_state = None
        if self.conv is not None:
            qkv, conv_state = layers.conv_silu(
                self.conv, qkv, segment_ids, None if state is None else state.conv_state)
        q, k, v = layers.split_qkv_heads(qkv, cfg)  # [B, T, HK, K] x2, [B, T, H, V]
        o, recurrent = context_parallel.linear_recurrence(
            functools.partial(sg.linear_attention, chunk_size=cfg.chunk_size,
                              implementation=cfg.implementation),
            q, k, v, (), (), segment_ids=segment_ids,
            initial_state=None if state is None else state.recurrent,
            output_final_state=return_state)  # [B, T, H, V], fp32 [B, H, K, V]
        y = self.out_proj(self.o_norm(o).reshape(b, t, self.v_dim))
        if return_state:
            return y, layers.RecurrentState(conv_state=conv_state, recurrent=recurrent)
        return y
