"""Gated DeltaNet-2 mixer (paper 1 arXiv 2607.07953, Eqs. 21-24; spec §2.6, v2 layout).

Per layer, from the normalised stream ``x``:

* one fused projection ``D -> 3 HK K + 2 H V`` laid out ``[q | k | v | b | w]`` (the authors' v2
  "faithful" layout, commit 4d335cd79): ``b`` is key-side (``HK K``), ``w`` value-side (``H V``);
* a causal depthwise short convolution (width 4, no bias) over ``[q; k; v]`` followed by SiLU,
  and ``q, k <- q / ||q||, k / ||k||`` per head (eps 1e-6);
* the erase gate ``b = sigmoid(b-logit)`` in (0,1)^K per key head and the write gate
  ``w = sigmoid(w-logit)`` in (0,1)^V per value head, fp32;
* the low-rank decay logits ``a = f_proj(x)``, ``f_proj = Linear(D -> r) then Linear(r -> HK K)``
  (no bias) and the per-key-channel log-decay ``g = -exp(A_log[key head]) softplus(a +
  dt_bias[key channel])``, fp32 ``[B, T, HK, K]``;
* key-side tensors (q, k, b, g) are repeat-interleaved to the value heads (value head ``h``
  reads key head ``h // (H / HK)``);
* the GDN-2 rule ``S_t = (I - k_t (b_t * k_t)^T) Diag(exp g_t) S_{t-1} + k_t (w_t * v_t)^T``,
  ``o_t = S_t^T q_t / sqrt(K)``: the erase gate acts on the read side only and the outer product
  of the write still uses ``k`` (Eqs. 21-24; ``pallas_kernels.gdn2``);
* the low-rank output gate ``z = g_proj(x)``, ``g_proj = Linear(D -> r) then Linear(r -> H V)``
  with a bias (init 0), and ``o <- RMSNorm_V(o) * SiLU(z)`` (one norm weight shared by all
  heads), then the output projection ``H V -> D``.

Choice (spec §10 item 11): the authors' v2 feeds ``f_proj``/``g_proj`` the UN-normalised residual
stream because their input RMSNorm is fused into ``in_proj`` only, which the spec calls probably
unintended. Here every projection reads the block's normalised input ``x`` (the mixer never sees
the raw stream). The v1 full-rank layout (``[q|k|v|z|b|w|a]``) is not implemented.

Init: linears ``N(0, 0.02^2)`` (output projection ``N(0, (0.02 / sqrt(2 L))^2)``), ``g_proj``
bias 0, ``A_log = log U(1, 16)`` per key head, ``dt_bias`` per key channel with the Mamba
inverse-softplus init (as KDA). The 20-layer 350M hybrid with 14 such layers has 296,235,448
parameters, the authors' logged 296.235M (spec §2.6).
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
from lattn_jax.mixers import kda
from lattn_jax.typing import Array
from pallas_kernels.gdn2 import api as gdn2_ops


class GatedDeltaNet2(nnx.Module):
    """The GDN-2 token mixer.

    Decoding: ``state = module.init_state(B)``, then ``y, state = module(x, state=state,
    return_state=True)`` for a prompt (any ``T``) and for each new token (``T == 1``).

    Args:
      model_config: the model's :class:`~lattn_jax.config.ModelConfig` (reads ``d_model``,
        ``gdn2``, ``init_std``, ``num_layers``, dtypes).
      rngs: NNX rngs.

    Attributes:
      in_proj: fused ``[D, 3 HK K + 2 H V]`` projection ``[q | k | v | b | w]``.
      conv: short convolution over the ``2 HK K + H V`` q/k/v channels.
      f_down, f_up: ``[D, r]`` and ``[r, HK K]``, the low-rank decay-logit projection.
      g_down, g_up: ``[D, r]`` and ``[r, H V]``, the low-rank output-gate projection, plus
        ``g_up_bias`` ``[H V]`` (init 0).
      A_log: fp32 ``[HK]``.
      dt_bias: fp32 ``[HK K]``.
      o_norm: RMSNorm over ``V``, shared across heads.
      out_proj: ``[H V, D]`` output projection.
    """

    def __init__(self, model_config: config_lib.ModelConfig, *, rngs: nnx.Rngs):
        cfg = model_config.gdn2
        self.cfg = cfg
        self.dtype = jnp.dtype(model_config.dtype)
        param_dtype = jnp.dtype(model_config.param_dtype)
        d = self.d_model = model_config.d_model
        std = model_config.init_std
        self.qk_dim = cfg.num_k_heads * cfg.head_k_dim
        self.v_dim = cfg.num_v_heads * cfg.head_v_dim
        self.rank = cfg.gate_rank or cfg.head_v_dim
        dense = dict(rngs=rngs, dtype=self.dtype, param_dtype=param_dtype)
        self.in_proj = layers.Dense(d, 3 * self.qk_dim + 2 * self.v_dim, std=std,
                                    split_products=model_config.split_projections, **dense)
        self.conv = layers.ShortConv(2 * self.qk_dim + self.v_dim, cfg.conv_width, **dense)
        self.f_down = layers.Dense(d, self.rank, std=std, **dense)
        self.f_up = layers.Dense(self.rank, self.qk_dim, std=std, **dense)
        self.g_down = layers.Dense(d, self.rank, std=std, **dense)
        self.g_up = layers.Dense(self.rank, self.v_dim, std=std, **dense)
        self.g_up_bias = nnx.Param(jnp.zeros((self.v_dim,), param_dtype))
        self.A_log = nnx.Param(kda.a_log_init(rngs.params(), (cfg.num_k_heads,)))
        self.dt_bias = nnx.Param(kda.mamba_dt_bias(rngs.params(), (self.qk_dim,), cfg.dt_min,
                                                   cfg.dt_max, cfg.dt_floor))
        self.o_norm = layers.RMSNorm(
            cfg.head_v_dim, eps=cfg.norm_eps, param_dtype=param_dtype,
            implementation=model_config.norm_implementation)
        out_std = std / math.sqrt(2 * model_config.num_layers)
        self.out_proj = layers.Dense(self.v_dim, d, std=out_std, **dense)

    def log_decay(self, a: Array) -> Array:
        """Per-key-channel log-decay ``g = -exp(A_log[hk]) softplus(a + dt_bias[hk, c])``.

        Args:
          a: ``[B, T, HK, K]`` decay logits, any float dtype.

        Returns:
          fp32 ``[B, T, HK, K]``, ``<= 0`` (per key head; repeat to value heads to use).
        """
        cfg = self.cfg
        dt_bias = self.dt_bias[...].reshape(cfg.num_k_heads, cfg.head_k_dim)  # [HK, K]
        rate = jnp.exp(self.A_log[...])[:, None]  # [HK, 1]
        return -rate * jax.nn.softplus(a.astype(jnp.float32) + dt_bias)

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
        hk, h, dk, dv = cfg.num_k_heads, cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim
        layers.check_state_batch(state, b)
        qkv, b_logit, w_logit = self.in_proj.split(
            x, [2 * self.qk_dim + self.v_dim, 3 * self.qk_dim + self.v_dim])
        qkv, conv_state = layers.conv_silu(
            self.conv, qkv, segment_ids, None if state is None else state.conv_state)
        q, k, v = layers.split_qkv_heads(qkv, cfg)  # [B, T, HK, K] x2, [B, T, H, V]
        group = h // hk
        # Key-side gates are per key head; value head j reads key head j // group.
        erase = jax.nn.sigmoid(b_logit.astype(jnp.float32)).reshape(b, t, hk, dk)
        erase = jnp.repeat(erase, group, axis=2)  # [B, T, H, K]
        write = jax.nn.sigmoid(w_logit.astype(jnp.float32)).reshape(b, t, h, dv)  # [B, T, H, V]
        a = self.f_up(self.f_down(x)).reshape(b, t, hk, dk)
        g = jnp.repeat(self.log_decay(a), group, axis=2)  # [B, T, H, K] fp32
        o, recurrent = context_parallel.linear_recurrence(
            functools.partial(gdn2_ops.gdn2, chunk_size=cfg.chunk_size,
                              implementation=cfg.implementation),
            q, k, v, (g, erase, write), ("bthk", "bthk", "bthv"), segment_ids=segment_ids,
            initial_state=None if state is None else state.recurrent,
            output_final_state=return_state)  # [B, T, H, V], fp32 [B, H, K, V]
        z = self.g_up(self.g_down(x)).astype(jnp.float32) + self.g_up_bias[...].astype(
            jnp.float32)
        z = jax.nn.silu(z).reshape(b, t, h, dv)
        o = self.o_norm(o) * z.astype(o.dtype)
        y = self.out_proj(o.reshape(b, t, self.v_dim))
        if return_state:
            return y, layers.RecurrentState(conv_state=conv_state, recurrent=recurrent)
        return y
