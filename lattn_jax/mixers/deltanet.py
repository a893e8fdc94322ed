"""DeltaNet mixer (Yang et al. 2024; paper 1 arXiv 2607.07953 §3.2, Eq. 14; spec §2.2).

Per layer, from the normalised stream ``x``:

* one fused projection ``D -> 2 HK K + H V + H`` laid out ``[q | k | v | beta]``;
* a causal depthwise short convolution (width 4, no bias) over ``[q; k; v]`` followed by SiLU;
* ``q, k <- q / ||q||, k / ||k||`` per head (FLA ``l2norm``, eps 1e-6); ``v`` is not normalised;
* ``beta_t = sigmoid(beta-logit)`` per value head, fp32; no decay (no ``A_log``/``dt_bias``);
* the delta rule ``S_t = (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T``,
  ``o_t = S_t^T q_t / sqrt(K)`` (Eq. 14, ``pallas_kernels.gated_delta_rule.delta_rule``);
* a per-head RMSNorm over ``V`` (one weight shared by all heads) and NO output gate (the
  authors' config forbids it for DeltaNet), then the output projection ``H V -> D``.

The 350M layer (``d = 1024``, 4 heads of ``K = 64`` / ``V = 128``) has 1,582,208 parameters with
the fused input RMSNorm (spec §2.2).

Cross-layer routing (spec §4, :mod:`lattn_jax.routing`): with ``return_route=True`` the mixer also
returns :class:`~lattn_jax.routing.RouteSignals`: the error ``r_t = u_t = beta_t (v_t -
S_{t-1}^T k_t)`` (the op's beta-scaled residual, spec §4.1) and the post-conv value ``v_t``;
``route_in`` (value-space CLER) adds ``gamma * r_src`` to the value target before the kernel.
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
from lattn_jax import routing
from lattn_jax.typing import Array
from pallas_kernels.gated_delta_rule import api as gdr


class DeltaNet(nnx.Module):
    """The DeltaNet token mixer.

    Decoding: ``state = module.init_state(B)``, then ``y, state = module(x, state=state,
    return_state=True)`` for a prompt (any ``T``) and for each new token (``T == 1``).

    Args:
      model_config: the model's :class:`~lattn_jax.config.ModelConfig` (reads ``d_model``,
        ``deltanet``, ``init_std``, ``num_layers``, dtypes).
      rngs: NNX rngs.

    Attributes:
      in_proj: fused ``[D, 2 HK K + H V + H]`` projection, ``N(0, init_std^2)``.
      conv: short convolution over the ``2 HK K + H V`` q/k/v channels.
      o_norm: RMSNorm over ``V``, shared across heads.
      out_proj: ``[H V, D]`` output projection, ``N(0, (init_std / sqrt(2 L))^2)``.
      gamma: fp32 CLER gain (0-D, ``[H]`` or ``[H, V]``), only with ``routing.mode="cler"``.
    """

    def __init__(self, model_config: config_lib.ModelConfig, *, rngs: nnx.Rngs):
        cfg = model_config.deltanet
        self.cfg = cfg
        self.dtype = jnp.dtype(model_config.dtype)
        param_dtype = jnp.dtype(model_config.param_dtype)
        d = self.d_model = model_config.d_model
        self.qk_dim = cfg.num_k_heads * cfg.head_k_dim
        self.v_dim = cfg.num_v_heads * cfg.head_v_dim
        width = 2 * self.qk_dim + self.v_dim + cfg.num_v_heads
        self.in_proj = layers.Dense(d, width, std=model_config.init_std, rngs=rngs,
                                    dtype=self.dtype, param_dtype=param_dtype,
                                    split_products=model_config.split_projections)
        self.conv = layers.ShortConv(2 * self.qk_dim + self.v_dim, cfg.conv_width, rngs=rngs,
                                     dtype=self.dtype, param_dtype=param_dtype)
        self.o_norm = layers.RMSNorm(
            cfg.head_v_dim, eps=cfg.norm_eps, param_dtype=param_dtype,
            implementation=model_config.norm_implementation)
        out_std = model_config.init_std / math.sqrt(2 * model_config.num_layers)
        self.out_proj = layers.Dense(self.v_dim, d, std=out_std, rngs=rngs, dtype=self.dtype,
                                     param_dtype=param_dtype)
        routing.add_gamma(self, model_config, cfg.num_v_heads, cfg.head_v_dim)

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
                 return_state: bool = False, route_in: Optional[Array] = None,
                 return_route: bool = False) -> Union[Array, Tuple]:
        """Mixes a sequence, or continues one from ``state``.

        Args:
          x: ``[B, T, D]`` normalised hidden states.
          segment_ids: optional int ``[B, T]``; the state resets at each document start. With a
            ``state``, the call's first document continues it and the returned state belongs to
            the row's last document.
          state: optional :class:`~lattn_jax.layers.RecurrentState`; ``None``
            starts from zeros.
          return_state: also return the state after the last token.
          route_in: optional ``[B, T, H, V]`` residual of the nearest lower routing layer;
            the value target becomes ``v + gamma * norm?(route_in)`` (value-space CLER, paper 1
            Eq. 27, spec §4.2). Needs ``model.routing.mode="cler"``.
          return_route: also return the :class:`~lattn_jax.routing.RouteSignals` (error
            ``u_t``, computed from the injected value, and the value ``v_t`` before injection).

        Returns:
          ``y`` ``[B, T, D]`` in the compute dtype, followed by ``new_state`` if
          ``return_state`` and the route signals if ``return_route`` (a tuple when either is
          set).

        Raises:
          ValueError: if ``x`` is not ``[B, T, d_model]`` or ``segment_ids`` is not ``[B, T]``
            like ``x`` (naming the argument and the expected shape; static shapes, checked
            first); if ``state`` was built for another batch size, or ``route_in`` is given
            without value-space CLER.
        """
        cfg = self.cfg
        layers.check_mixer_input(x, self.d_model, segment_ids)
        b, t, _ = x.shape
        layers.check_state_batch(state, b)
        qkv, beta_logit = self.in_proj.split(x, [2 * self.qk_dim + self.v_dim])
        qkv, conv_state = layers.conv_silu(
            self.conv, qkv, segment_ids, None if state is None else state.conv_state)
        q, k, v = layers.split_qkv_heads(qkv, cfg)  # [B, T, HK, K] x2, [B, T, H, V]
        beta = jax.nn.sigmoid(beta_logit.astype(jnp.float32))  # [B, T, H] fp32
        target = routing.value_target(self, v, route_in)  # [B, T, H, V]
        # The residual u only when routing reads it (the kernels then skip it and its
        # cotangent): [B, T, H, V], fp32 [B, H, K, V] (or None), [[B, T, H, V]].
        o, recurrent, *u = context_parallel.linear_recurrence(
            functools.partial(gdr.delta_rule, chunk_size=cfg.chunk_size,
                              implementation=cfg.implementation,
                              return_residual=return_route),
            q, k, target, (beta,), ("bth",), segment_ids=segment_ids,
            initial_state=None if state is None else state.recurrent,
            output_final_state=return_state, return_residual=return_route)
        u = u[0] if u else None
        y = self.out_proj(self.o_norm(o).reshape(b, t, self.v_dim))
        new_state = layers.RecurrentState(conv_state=conv_state, recurrent=recurrent)
        return routing.mixer_outputs(y, new_state, routing.RouteSignals(error=u, value=v),
                                     return_state=return_state, return_route=return_route)
