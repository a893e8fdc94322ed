"""Gated DeltaNet mixer (Yang et al. 2025; paper 1 arXiv 2607.07953 §3.3, Eqs. 15-17; spec §2.1).

Per layer, from the normalised stream ``x``:

* one fused projection ``D -> 2 HK K + 2 H V + 2 H`` laid out ``[q | k | v | z | beta | a]``;
* a causal depthwise short convolution (width 4, no bias) over ``[q; k; v]`` followed by SiLU;
* ``q, k <- q / ||q||, k / ||k||`` per head (FLA ``l2norm``, eps 1e-6); ``v`` is not normalised;
* ``beta_t = sigmoid(beta-logit)`` and the scalar per-head log-decay
  ``g_t = -exp(A_log) * softplus(a_t + dt_bias)``, both in fp32;
* the gated delta rule ``S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T``,
  ``o_t = S_t^T q_t / sqrt(K)`` (``pallas_kernels.gated_delta_rule``), value head ``h`` reading
  key head ``h // (H / HK)``;
* a per-head RMSNorm over ``V`` (one weight shared by all heads) times ``SiLU(z)``, then the output
  projection ``H V -> D``.

Init follows the authors' Megatron code: ``A_log = log U(1, 16)``, ``dt_bias = 1``.

Decoding and state. ``__call__(x, *, segment_ids=None, state=None, return_state=False)``: with
``return_state=True`` it returns ``(y, RecurrentState)``; a call with ``T == 1`` and a state is
one recurrent step of the same code and parameters (the op's chunk size clips to 1). The pieces all
linear-attention mixers share (:class:`~lattn_jax.layers.RecurrentState`,
:func:`~lattn_jax.layers.l2_normalize`, :func:`~lattn_jax.layers.conv_silu`) live in
``lattn_jax/layers.py``.

Cross-layer routing (spec §4, :mod:`lattn_jax.routing`): with ``return_route=True`` the mixer also
returns :class:`~lattn_jax.routing.RouteSignals`: the error ``r_t = u_t = beta_t (v_t - exp(g_t)
S_{t-1}^T k_t)`` (the op's decay-adjusted, beta-scaled residual, spec §4.1) and the post-conv value
``v_t``; ``route_in`` (value-space CLER, ``model.routing.mode="cler"``) adds ``gamma * r_src`` to
the value target before the kernel.
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
from lattn_jax import sharding
from lattn_jax.typing import Array
from pallas_kernels.gated_delta_rule import api as gdr


class GatedDeltaNet(nnx.Module):
    """The Gated DeltaNet token mixer.

    Args:
      model_config: the model's :class:`~lattn_jax.config.ModelConfig` (reads ``d_model``,
        ``gdn``, ``init_std``, ``num_layers``, dtypes).
      rngs: NNX rngs.

    Decoding: ``state = module.init_state(B)``, then ``y, state = module(x, state=state,
    return_state=True)`` for a prompt (any ``T``) and for each new token (``T == 1``).

    Attributes:
      in_proj: fused ``[D, 2 HK K + 2 H V + 2 H]`` projection.
      conv: short convolution over the ``2 HK K + H V`` q/k/v channels.
      A_log: fp32 ``[H]``, log of the decay rate ``A``.
      dt_bias: fp32 ``[H]``, bias inside the softplus of the decay.
      o_norm: RMSNorm over ``V``, shared across heads.
      out_proj: ``[H V, D]`` output projection.
      gamma: fp32 CLER gain (0-D, ``[H]`` or ``[H, V]``), only with ``routing.mode="cler"``.
    """

    def __init__(self, model_config: config_lib.ModelConfig, *, rngs: nnx.Rngs):
        cfg = model_config.gdn
        self.cfg = cfg
        self.dtype = jnp.dtype(model_config.dtype)
        param_dtype = jnp.dtype(model_config.param_dtype)
        d = self.d_model = model_config.d_model
        self.qk_dim = cfg.num_k_heads * cfg.head_k_dim
        self.v_dim = cfg.num_v_heads * cfg.head_v_dim
        width = 2 * self.qk_dim + 2 * self.v_dim + 2 * cfg.num_v_heads
        self.in_proj = layers.Dense(d, width, std=model_config.init_std, rngs=rngs,
                                    dtype=self.dtype, param_dtype=param_dtype,
                                    split_products=model_config.split_projections)
        self.conv = layers.ShortConv(2 * self.qk_dim + self.v_dim, cfg.conv_width, rngs=rngs,
                                     dtype=self.dtype, param_dtype=param_dtype)
        a = jax.random.uniform(rngs.params(), (cfg.num_v_heads,), jnp.float32, 1.0, 16.0)
        self.A_log = nnx.Param(jnp.log(a))
        self.dt_bias = nnx.Param(jnp.ones((cfg.num_v_heads,), jnp.float32))
        self.o_norm = layers.RMSNorm(
            cfg.head_v_dim, eps=cfg.norm_eps, param_dtype=param_dtype,
            implementation=model_config.norm_implementation)
        out_std = model_config.init_std / math.sqrt(2 * model_config.num_layers)
        self.out_proj = layers.Dense(self.v_dim, d, std=out_std, rngs=rngs, dtype=self.dtype,
                                     param_dtype=param_dtype)
        routing.add_gamma(self, model_config, cfg.num_v_heads, cfg.head_v_dim)

    def gates(self, beta_logit: Array, a: Array):
        """Write strength and log-decay, fp32.

        Args:
          beta_logit: ``[B, T, H]``.
          a: ``[B, T, H]`` decay logits.

        Returns:
          ``(beta, g)``: ``beta = sigmoid(beta_logit)`` in (0, 1) and
          ``g = -exp(A_log) * softplus(a + dt_bias)`` (natural-log decay per token, <= 0).
        """
        beta = jax.nn.sigmoid(beta_logit.astype(jnp.float32))
        g = -jnp.exp(self.A_log[...]) * jax.nn.softplus(a.astype(jnp.float32) + self.dt_bias[...])
        return beta, g

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
            ``state``, the call's first document continues it, and the returned state belongs to
            the row's last document (a packed prefill followed by decoding equals decoding the
            last document alone).
          state: optional :class:`RecurrentState` from :meth:`init_state` or a previous call;
            ``None`` starts from zeros.
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
            without value-space CLER (and from the op on bad shapes).
        """
        cfg = self.cfg
        layers.check_mixer_input(x, self.d_model, segment_ids)
        b, t, _ = x.shape
        layers.check_state_batch(state, b)
        qkv, z, beta_logit, a = self.in_proj.split(
            x,
            [2 * self.qk_dim + self.v_dim, 2 * self.qk_dim + 2 * self.v_dim,
             2 * self.qk_dim + 2 * self.v_dim + cfg.num_v_heads],
        )
        qkv, conv_state = layers.conv_silu(self.conv, qkv, segment_ids,
                                           None if state is None else state.conv_state)
        q, k, v = layers.split_qkv_heads(qkv, cfg)  # [B, T, HK, K] x2, [B, T, H, V]
        beta, g = self.gates(beta_logit, a)  # [B, T, H] each, fp32
        target = routing.value_target(self, v, route_in)  # [B, T, H, V]

        initial_state = None if state is None else state.recurrent
        # The residual u (FLA's v_new) only when routing reads it: without it the kernels
        # neither store u nor read its (zero) cotangent.
        if context_parallel.is_active(t):
            # The sequence is split over the context axis: the state passes between shards.
            o, recurrent, *u = context_parallel.linear_recurrence(
                functools.partial(gdr.gated_delta_rule, chunk_size=cfg.chunk_size,
                                  implementation=cfg.implementation,
                                  return_residual=return_route),
                q, k, target, (g, beta), ("bth", "bth"), segment_ids=segment_ids,
                initial_state=initial_state, output_final_state=return_state,
                return_residual=return_route)
        else:
            def op(q, k, v, g, beta, segment_ids, initial_state):
                return gdr.gated_delta_rule(
                    q, k, v, g, beta, segment_ids=segment_ids, chunk_size=cfg.chunk_size,
                    implementation=cfg.implementation, initial_state=initial_state,
                    output_final_state=return_state, return_residual=return_route)

            # Batch rows and heads are independent: on a mesh each shard runs the op on its
            # block.
            op = sharding.shard_map_op(
                op, in_names=(sharding.ACT_BTHK,) * 3 + (sharding.ACT_BTH,) * 2
                + (sharding.ACT_BT, sharding.ACT_BHKV),
                out_names=(sharding.ACT_BTHK, sharding.ACT_BHKV)
                + ((sharding.ACT_BTHK,) if return_route else ()))
            o, recurrent, *u = op(q, k, target, g, beta, segment_ids, initial_state)
        u = u[0] if u else None
        # [B, T, H, V], fp32 [B, H, K, V] (or None), [B, T, H, V] (or None)
        z = z.reshape(b, t, cfg.num_v_heads, cfg.head_v_dim)
        o = self.o_norm(o) * jax.nn.silu(z.astype(jnp.float32)).astype(o.dtype)
        y = self.out_proj(o.reshape(b, t, self.v_dim))
        new_state = layers.RecurrentState(conv_state=conv_state, recurrent=recurrent)
        return routing.mixer_outputs(y, new_state, routing.RouteSignals(error=u, value=v),
                                     return_state=return_state, return_route=return_route)
