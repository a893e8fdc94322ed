"""Kimi Delta Attention mixer (paper 1 arXiv 2607.07953, Eqs. 18-20; spec §2.4).

Per layer, from the normalised stream ``x`` (the authors' separate input RMSNorm is the block's
``mixer_norm``; mathematically the same as a fused one):

* one fused projection ``D -> 2 HK K + H V + H`` laid out ``[q | k | v | beta]``;
* a causal depthwise short convolution (width 4, no bias) over ``[q; k; v]`` followed by SiLU,
  and ``q, k <- q / ||q||, k / ||k||`` per head (FLA ``use_qk_l2norm_in_kernel``, eps 1e-6);
* a low-rank gate trunk ``bottleneck_proj: D -> 2 r`` (``r = head_v_dim`` by default) split
  into ``f_hidden`` and ``g_hidden``;
* per value head ``h`` and KEY channel ``c`` the log-decay (FLA ``kda_gate``, fp32)
  ``g_{t,h,c} = -exp(A_log_h) softplus(f_{t,h,c} + dt_bias_{h,c})`` with
  ``f = f_out_proj(f_hidden)``: ``[B, T, H, K]``;
* ``beta_t = sigmoid(beta-logit)`` per value head, fp32;
* the KDA rule ``S_t = (I - beta_t k_t k_t^T) Diag(exp g_t) S_{t-1} + beta_t k_t v_t^T``,
  ``o_t = S_t^T q_t / sqrt(K)`` (``pallas_kernels.kda``), value head ``h`` reading key head
  ``h // (H / HK)``;
* FLA ``FusedRMSNormGated(activation="sigmoid")``: per-head RMSNorm over ``V`` (one shared
  weight) times ``sigmoid(g_out_proj(g_hidden) + g_out_bias)``, then the output projection.

Init (KDA ``reset_parameters``): linears ``N(0, 0.02^2)``, ``g_out_bias = 0``,
``A_log = log U(1, 16)``, ``dt_bias`` the Mamba inverse-softplus init of
``dt = exp(U(log 1e-3, log 1e-1))`` clamped at 1e-4 (:func:`mamba_dt_bias`). The 350M layer has
1,783,880 parameters with its input RMSNorm (spec §2.4).
"""

import functools
import math
from typing import Optional, Tuple, Union

import jax
import jax.numpy as jnp
from flax import nnx

from lattn_jax import config as config_lib
from lattn_jax import context_parallel
from lattn_jax import layers
from lattn_jax.typing import Array, PRNGKey
from pallas_kernels.kda import api as kda_ops


def mamba_dt_bias(key: PRNGKey, shape: Tuple[int, ...], dt_min: float, dt_max: float,
                  dt_floor: float) -> Array:
    """Mamba's ``dt_bias`` init: ``softplus^-1(dt)``, ``dt = max(exp(U(log dt_min, log dt_max)),
    dt_floor)``, fp32 (spec §2.4; ``dt + log(-expm1(-dt))`` is the inverse softplus).

    Args:
      key: PRNG key.
      shape: parameter shape.
      dt_min, dt_max: range of ``dt`` (log-uniform).
      dt_floor: lower clamp of ``dt``.
    """
    u = jax.random.uniform(key, shape, jnp.float32, math.log(dt_min), math.log(dt_max))
    dt = jnp.maximum(jnp.exp(u), dt_floor)
    return dt + jnp.log(-jnp.expm1(-dt))


def a_log_init(key: PRNGKey, shape: Tuple[int, ...]) -> Array:
    """``A_log = log U(1, 16)``, fp32 (GDN/KDA/GDN-2 ``reset_parameters``)."""
    return jnp.log(jax.random.uniform(key, shape, jnp.float32, 1.0, 16.0))


class KimiDeltaAttention(nnx.Module):
    """The KDA token mixer.

    Decoding: ``state = module.init_state(B)``, then ``y, state = module(x, state=state,
    return_state=True)`` for a prompt (any ``T``) and for each new token (``T == 1``).

    Args:
      model_config: the model's :class:`~lattn_jax.config.ModelConfig` (reads ``d_model``,
        ``kda``, ``init_std``, ``num_layers``, dtypes).
      rngs: NNX rngs.

    Attributes:
      in_proj: fused ``[D, 2 HK K + H V + H]`` projection.
      conv: short convolution over the ``2 HK K + H V`` q/k/v channels.
      bottleneck_proj: ``[D, 2 r]`` gate trunk.
      f_out_proj: ``[r, H K]`` decay logits.
      g_out_proj: ``[r, H V]`` output-gate logits, plus ``g_out_bias`` ``[H V]`` (init 0).
      A_log: fp32 ``[H]``.
      dt_bias: fp32 ``[H K]``.
      o_norm: RMSNorm over ``V``, shared across heads.
      out_proj: ``[H V, D]`` output projection.
    """

    def __init__(self, model_config: config_lib.ModelConfig, *, rngs: nnx.Rngs):
        cfg = model_config.kda
        self.cfg = cfg
        self.dtype = jnp.dtype(model_config.dtype)
        param_dtype = jnp.dtype(model_config.param_dtype)
        d = self.d_model = model_config.d_model
        std = model_config.init_std
        self.qk_dim = cfg.num_k_heads * cfg.head_k_dim
        self.v_dim = cfg.num_v_heads * cfg.head_v_dim
        self.rank = cfg.gate_rank or cfg.head_v_dim
        dense = dict(rngs=rngs, dtype=self.dtype, param_dtype=param_dtype)
        self.in_proj = layers.Dense(d, 2 * self.qk_dim + self.v_dim + cfg.num_v_heads, std=std,
                                    split_products=model_config.split_projections, **dense)
        self.conv = layers.ShortConv(2 * self.qk_dim + self.v_dim, cfg.conv_width, **dense)
        self.bottleneck_proj = layers.Dense(d, 2 * self.rank, std=std, **dense)
        self.f_out_proj = layers.Dense(self.rank, cfg.num_v_heads * cfg.head_k_dim, std=std,
                                       **dense)
        self.g_out_proj = layers.Dense(self.rank, self.v_dim, std=std, **dense)
        self.g_out_bias = nnx.Param(jnp.zeros((self.v_dim,), param_dtype))
        self.A_log = nnx.Param(a_log_init(rngs.params(), (cfg.num_v_heads,)))
        self.dt_bias = nnx.Param(mamba_dt_bias(rngs.params(), (cfg.num_v_heads * cfg.head_k_dim,),
                                               cfg.dt_min, cfg.dt_max, cfg.dt_floor))
        self.o_norm = layers.RMSNorm(
            cfg.head_v_dim, eps=cfg.norm_eps, param_dtype=param_dtype,
            implementation=model_config.norm_implementation)
        out_std = std / math.sqrt(2 * model_config.num_layers)
        self.out_proj = layers.Dense(self.v_dim, d, std=out_std, **dense)

    def log_decay(self, f: Array) -> Array:
        """Per-key-channel log-decay ``g = -exp(A_log_h) softplus(f + dt_bias_{h,c})``.

        Args:
          f: ``[B, T, H, K]`` decay logits, any float dtype.

        Returns:
          fp32 ``[B, T, H, K]``, ``<= 0`` (natural-log decay per token and key channel).
        """
        cfg = self.cfg
        dt_bias = self.dt_bias[...].reshape(cfg.num_v_heads, cfg.head_k_dim)  # [H, K]
        a = jnp.exp(self.A_log[...])[:, None]  # [H, 1]
        return -a * jax.nn.softplus(f.astype(jnp.float32) + dt_bias)

    def init_state(self, batch: int) -> layers.RecurrentState:
        """Zero decoding state: conv ``[B, W - 1, 2 HK K + H V]`` (compute dtype), fp32 S.

        Raises:
          ValueError: ``batch`` is not a positive integer
            (:func:`~lattn_jax.layers.check_init_state_batch`).
        """
        layers.check_init_state_batch(batch)
        return layers.zero_recurrent_state(self.cfg, batch, self.dtype)

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
        qkv, beta_logit = self.in_proj.split(x, [2 * self.qk_dim + self.v_dim])
        qkv, conv_state = layers.conv_silu(
            self.conv, qkv, segment_ids, None if state is None else state.conv_state)
        q, k, v = layers.split_qkv_heads(qkv, cfg)  # [B, T, HK, K] x2, [B, T, H, V]
        f_hidden, g_hidden = jnp.split(self.bottleneck_proj(x), 2, axis=-1)  # [B, T, r] each
        f = self.f_out_proj(f_hidden).reshape(b, t, cfg.num_v_heads, cfg.head_k_dim)
        g = self.log_decay(f)  # [B, T, H, K] fp32
        beta = jax.nn.sigmoid(beta_logit.astype(jnp.float32))  # [B, T, H] fp32
        o, recurrent = context_parallel.linear_recurrence(
            functools.partial(kda_ops.kda, chunk_size=cfg.chunk_size,
                              implementation=cfg.implementation),
            q, k, v, (g, beta), ("bthk", "bth"), segment_ids=segment_ids,
            initial_state=None if state is None else state.recurrent,
            output_final_state=return_state)  # [B, T, H, V], fp32 [B, H, K, V]
        gate = self.g_out_proj(g_hidden).astype(jnp.float32) + self.g_out_bias[...].astype(
            jnp.float32)
        gate = jax.nn.sigmoid(gate).reshape(b, t, cfg.num_v_heads, cfg.head_v_dim)
        o = self.o_norm(o) * gate.astype(o.dtype)
        y = self.out_proj(o.reshape(b, t, self.v_dim))
        if return_state:
            return y, layers.RecurrentState(conv_state=conv_state, recurrent=recurrent)
        return y
