"""HypeNet's Lightning Attention mixer (arXiv 2601.22156; spec ``hypenet-halo.md`` §1.5, §7).

Per layer, from the normalised stream ``x`` (spec §1.5 items 1-10, §7 item 2):

* bias-free projections ``q = x W_q`` (``H dh``), ``k = x W_k``, ``v = x W_v`` (``G dh`` each);
* optionally (``conv_width > 0``, off in HypeNet) a short causal conv + SiLU over [q; k; v];
* QK RMSNorm per head over ``dh`` (one weight shared by all heads), then RoPE on q and k
  (rotate-half, base 1e6): HypeNet's "HyPE", RoPE in the linear layers and NoPE in softmax ones;
* GQA: when ``G < H`` the K/V heads are repeated (head ``j`` serves heads ``j g .. j g + g - 1``);
* the fixed per-head log-decay ``log(gamma_h) = -2^(-8 (h + 1) / H)`` (ALiBi slopes, same in every
  layer, not a parameter; ``LightningConfig.alibi_max_bias`` replaces the 8 as an ablation),
  and in fp32 the decayed linear attention without normaliser
  ``S_t = gamma_h S_{t-1} + k_t v_t^T``, ``o_t = scale S_t^T q_t`` with ``scale = dh^-1/2``
  (``pallas_kernels.simple_gla.lightning_attention``; the scale multiplies the read-out, i.e. the
  q.k products, which is the same as scaling the keys);
* ``o`` back in the compute dtype, flattened to ``[B, T, H dh]``, an RMSNorm over ALL heads jointly
  (one ``H dh`` weight), the sigmoid output gate ``o <- o * sigmoid(x W_z)``, and ``y = o W_o``.

Init (from scratch; HypeNet converts these weights from Qwen3): ``W_q, W_k, W_v`` ``N(0, 0.02^2)``,
``W_z`` PyTorch's ``nn.Linear`` default ``U(-1/sqrt(D), 1/sqrt(D))`` (spec §2.3), ``W_o``
``N(0, (0.02 / sqrt(2 L))^2)`` (this codebase's output-projection rule), norms 1.
"""

import functools
import math
from typing import NamedTuple, Optional, Tuple, Union

import jax
import jax.numpy as jnp
from flax import nnx

from lattn_jax import config as config_lib
from lattn_jax import context_parallel
from lattn_jax import layers
from lattn_jax.typing import Array
from pallas_kernels.simple_gla import api as sg


class LightningState(NamedTuple):
    """Decoding state of a Lightning Attention layer.

    Attributes:
      conv_state: ``[B, W - 1, (H + 2 G) dh]`` compute dtype, or ``None`` without a convolution.
      recurrent: fp32 ``[B, H, dh, dh]`` state ``S`` (FLA layout).
      position: int32 ``[B]``, position of the next token inside the row's current document
        (the RoPE phase).
    """

    conv_state: Optional[Array]
    recurrent: Array
    position: Array


class LightningAttention(nnx.Module):
    """The Lightning Attention token mixer.

    Decoding: ``state = module.init_state(B)``, then ``y, state = module(x, state=state,
    return_state=True)`` for a prompt (any ``T``) and for each new token (``T == 1``).

    Args:
      model_config: the model's :class:`~lattn_jax.config.ModelConfig` (reads ``d_model``,
        ``lightning``, ``init_std``, ``num_layers``, ``norm_eps``, dtypes).
      rngs: NNX rngs.

    Attributes:
      q_proj: ``[D, H dh]``; k_proj, v_proj: ``[D, G dh]``.
      conv: short convolution over ``(H + 2 G) dh`` channels, or ``None``.
      q_norm, k_norm: RMSNorm over ``dh`` (or ``None`` without QK norm).
      o_norm: RMSNorm over ``H dh`` (or ``None``).
      z_proj: ``[D, H dh]`` output-gate projection (or ``None``).
      out_proj: ``[H dh, D]``.
    """

    def __init__(self, model_config: config_lib.ModelConfig, *, rngs: nnx.Rngs):
        cfg = model_config.lightning
        self.cfg = cfg
        self.num_heads = cfg.num_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = model_config.lightning_head_dim
        self.dtype = jnp.dtype(model_config.dtype)
        param_dtype = jnp.dtype(model_config.param_dtype)
        d = self.d_model = model_config.d_model
        std = model_config.init_std
        dense = dict(rngs=rngs, dtype=self.dtype, param_dtype=param_dtype)
        q_width = self.num_heads * self.head_dim
        kv_width = self.num_kv_heads * self.head_dim
        self.q_proj = layers.Dense(d, q_width, std=std, **dense)
        self.k_proj = layers.Dense(d, kv_width, std=std, **dense)
        self.v_proj = layers.Dense(d, kv_width, std=std, **dense)
        if cfg.conv_width > 0:
            self.conv = layers.ShortConv(q_width + 2 * kv_width, cfg.conv_width, **dense)
        else:
            self.conv = None
        if cfg.qk_norm:
            self.q_norm = layers.RMSNorm(self.head_dim, eps=model_config.norm_eps,
                                         param_dtype=param_dtype,
                                         implementation=model_config.norm_implementation)
            self.k_norm = layers.RMSNorm(self.head_dim, eps=model_config.norm_eps,
                                         param_dtype=param_dtype,
                                         implementation=model_config.norm_implementation)
        else:
            self.q_norm = self.k_norm = None
        if cfg.output_norm:
            self.o_norm = layers.RMSNorm(q_width, eps=model_config.norm_eps,
                                         param_dtype=param_dtype,
                                         implementation=model_config.norm_implementation)
        else:
            self.o_norm = None
        if cfg.output_gate:
            self.z_proj = layers.Dense(d, q_width, std=std, **dense)
            bound = 1.0 / math.sqrt(d)
            self.z_proj.kernel[...] = jax.random.uniform(
                rngs.params(), (d, q_width), param_dtype, -bound, bound)
        else:
            self.z_proj = None
        out_std = std / math.sqrt(2 * model_config.num_layers)
        self.out_proj = layers.Dense(q_width, d, std=out_std, **dense)
        self.scale = {"1/sqrt(d)": self.head_dim ** -0.5, "1/d": 1.0 / self.head_dim,
                      "1": 1.0}[cfg.scale]

    def log_decay(self) -> Array:
        """The fixed ``log(gamma_h) = -2^(-b (h + 1) / H)``, fp32 ``[H]`` (spec §1.5 item 5;
        ``b = cfg.alibi_max_bias``, 8 in HypeNet).

        Behind an optimization barrier: the decay is a compile-time constant, and without the
        barrier XLA constant-folds the ops' ``[B, T, H]`` gate broadcasts and cumsums at compile
        time (over a minute per program at long T on the H200, 2026-11-29).
        """
        return jax.lax.optimization_barrier(
            sg.lightning_log_decay(self.num_heads, max_bias=self.cfg.alibi_max_bias))

    def init_state(self, batch: int) -> LightningState:
        """Zero decoding state at position 0.

        Raises:
          ValueError: ``batch`` is not a positive integer
            (:func:`~lattn_jax.layers.check_init_state_batch`).
        """
        layers.check_init_state_batch(batch)
        conv_state = None
        if self.conv is not None:
            width = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
            conv_state = jnp.zeros((batch, self.cfg.conv_width - 1, width), self.dtype)
        return LightningState(
            conv_state=conv_state,
            recurrent=jnp.zeros((batch, self.num_heads, self.head_dim, self.head_dim),
                                jnp.float32),
            position=jnp.zeros((batch,), jnp.int32),
        )

    def __call__(self, x: Array, *, segment_ids: Optional[Array] = None,
                 state: Optional[LightningState] = None,
                 return_state: bool = False) -> Union[Array, Tuple[Array, LightningState]]:
        """Mixes a sequence, or continues one from ``state``.

        Args:
          x: ``[B, T, D]`` normalised hidden states.
          segment_ids: optional int ``[B, T]``; the state resets and RoPE positions restart at
            each document start. With a ``state``, the call's first document continues it
            (positions go on from ``state.position``) and the returned state belongs to the
            row's last document.
          state: optional :class:`LightningState`; ``None`` starts from zeros at position 0.
          return_state: also return the state after the last token.

        Returns:
          ``y`` ``[B, T, D]`` in the compute dtype, or ``(y, new_state)`` if ``return_state``.

        Raises:
          ValueError: if ``x`` is not ``[B, T, d_model]`` or ``segment_ids`` is not ``[B, T]``
            like ``x`` (naming the argument and the expected shape; static shapes, checked
            first); if ``state`` was built for another batch size.
        """
        layers.check_mixer_input(x, self.d_model, segment_ids)
        b, t, _ = x.shape
        h, g, dh = self.num_heads, self.num_kv_heads, self.head_dim
        layers.check_state_batch(state, b)
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        conv_state = None
        if self.conv is not None:
            qkv, conv_state = layers.conv_silu(
                self.conv, jnp.concatenate([q, k, v], axis=-1), segment_ids,
                None if state is None else state.conv_state)
            q, k, v = jnp.split(qkv, [h * dh, (h + g) * dh], axis=-1)
        q = q.reshape(b, t, h, dh)  # [B, T, H, dh]
        k = k.reshape(b, t, g, dh)  # [B, T, G, dh]
        v = v.reshape(b, t, g, dh)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        positions = layers.positions_from_segment_ids(
            segment_ids, b, t, None if state is None else state.position)  # [B, T]
        if self.cfg.rope_theta is not None:
            q = layers.apply_rope(q, positions, self.cfg.rope_theta)
            k = layers.apply_rope(k, positions, self.cfg.rope_theta)
        # GQA: K/V head j serves query heads j*g' .. j*g' + g' - 1 (repeat_interleave).
        k = jnp.repeat(k, h // g, axis=2)  # [B, T, H, dh]
        v = jnp.repeat(v, h // g, axis=2)
        o, recurrent = context_parallel.linear_recurrence(
            functools.partial(sg.lightning_attention, scale=self.scale,
                              chunk_size=self.cfg.chunk_size,
                              implementation=self.cfg.implementation),
            q, k, v, (self.log_decay(),), ("h",), segment_ids=segment_ids,
            initial_state=None if state is None else state.recurrent,
            output_final_state=return_state)  # [B, T, H, dh] fp32 math, fp32 [B, H, dh, dh]
        o = o.reshape(b, t, h * dh)
        if self.o_norm is not None:
            o = self.o_norm(o)
        if self.z_proj is not None:
            o = o * jax.nn.sigmoid(self.z_proj(x).astype(jnp.float32)).astype(o.dtype)
        y = self.out_proj(o)
        if return_state:
            new_state = LightningState(conv_state=conv_state, recurrent=recurrent,
                                       position=positions[:, -1] + 1)
            return y, new_state
        return y
