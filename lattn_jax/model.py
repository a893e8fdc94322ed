"""The language model: embedding, a pattern of pre-norm blocks, final RMSNorm and LM head.

Block (paper 1 §1, Megatron ``TransformerLayer``)::

    h <- h + Mixer(RMSNorm(h))
    h <- h + SwiGLU(RMSNorm(h))

No absolute positions: RoPE lives inside the softmax layers. The embedding and the head use
``N(0, 0.02^2)``; the head is tied to the embedding when ``tie_embeddings`` is set.

Cross-layer routing (paper 1 §4; spec §4; ``model_config.routing``, :mod:`lattn_jax.routing`):

* value-space CLER: a side channel ``r`` runs alongside ``h``; each GDN/DeltaNet layer reads the
  ``r`` of the nearest lower routing layer into its value target and replaces it with its own;
  softmax layers carry it on unchanged (spec §4.2 "latest" mode with carry-through);
* CLER-H / CLVR and the controls: after routing layer ``l``'s MLP residual add,
  ``h <- h + P_l s_l`` (spec §4.3);
* AttnRes (spec §4.4): the stack keeps the list of sub-layer contributions and feeds each
  sub-layer (and the final norm) a softmax mix of them instead of the residual sum.

``model(tokens, route=False)`` switches CLER / CLER-H / CLVR contributions off (for evaluating a
routed checkpoint as its host; spec §8 warns that CLVR checkpoints depend on the route). AttnRes
is part of the architecture and stays on.
"""

import functools
import math
from typing import Any, List, Optional, Sequence, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lattn_jax import config as config_lib
from lattn_jax import layers
from lattn_jax import mixers
from lattn_jax import routing
from lattn_jax import sharding
from lattn_jax.typing import Array
from pallas_kernels.common import validation


class Block(nnx.Module):
    """One pre-norm residual block: a token mixer then a SwiGLU MLP, plus its routing parts.

    ``h <- h + Mixer(RMSNorm(h)); h <- h + SwiGLU(RMSNorm(h))`` (paper 1 §1); a routing layer
    (GDN/DeltaNet with ``model_config.routing.mode != "none"``) then adds ``P_l s_l``
    (residual-stream modes) or emits its error into the value-space side channel (``"cler"``).

    Args:
      mixer_name: a name from ``lattn_jax.mixers.REGISTRY``.
      model_config: the model configuration.
      rngs: NNX rngs.
      layer_index: 0-based position in the stack; the first layer's mixer reads the embedding
        directly under AttnRes and has no pseudo-query.

    Attributes:
      route: the :class:`~lattn_jax.routing.HiddenRoute` ``P_l`` of a residual-stream routing
        layer, else ``None``.
      attn_res_mixer_query, attn_res_mlp_query: ``[D]`` zero-initialised AttnRes pseudo-queries
        of the two sub-layers (only with ``routing.attn_res``; none for layer 0's mixer).
    """

    def __init__(self, mixer_name: str, model_config: config_lib.ModelConfig, *, rngs: nnx.Rngs,
                 layer_index: int = 0):
        pdt = jnp.dtype(model_config.param_dtype)
        dt = jnp.dtype(model_config.dtype)
        d = model_config.d_model
        self.mixer_name = mixer_name
        norm = functools.partial(layers.RMSNorm, d, eps=model_config.norm_eps, param_dtype=pdt,
                                 implementation=model_config.norm_implementation)
        self.mixer_norm = norm()
        self.mixer = mixers.build_mixer(mixer_name, model_config, rngs=rngs)
        self.mlp_norm = norm()
        self.mlp = layers.SwiGLU(
            d, model_config.mlp_hidden, std=model_config.init_std,
            out_std=model_config.init_std / math.sqrt(2 * model_config.num_layers),
            rngs=rngs, dtype=dt, param_dtype=pdt,
            split_products=model_config.split_projections, packed=model_config.swiglu_packed)
        cfg = model_config.routing
        self.routes = mixer_name in config_lib.ROUTABLE_MIXERS and cfg.mode != "none"
        self.value_routing = self.routes and cfg.mode == "cler"
        if self.routes and cfg.mode in config_lib.HIDDEN_ROUTING_MODES:
            host = getattr(model_config, mixer_name)
            self.route = routing.HiddenRoute(cfg, num_heads=host.num_v_heads,
                                             head_dim=host.head_v_dim, d_model=d, rngs=rngs,
                                             dtype=dt, param_dtype=pdt)
        else:
            self.route = None
        if cfg.attn_res:
            if layer_index > 0:
                self.attn_res_mixer_query = nnx.Param(jnp.zeros((d,), pdt))
            self.attn_res_mlp_query = nnx.Param(jnp.zeros((d,), pdt))

    def mix(self, x: Array, *, segment_ids: Optional[Array] = None,
            side: Optional[Array] = None, route: bool = True,
            state=None, return_state: bool = False) -> Tuple:
        """The mixer sub-layer's contribution ``Mixer(RMSNorm(x))``.

        Args:
          x: ``[B, T, D]`` the sub-layer input.
          segment_ids: optional int ``[B, T]``.
          side: optional ``[B, T, H, V]`` value-space CLER residual of the nearest lower routing
            layer (used only by a ``"cler"`` routing layer and only when ``route``).
          route: apply value-space injection.
          state: optional decoding state of the mixer (its ``init_state`` NamedTuple).
          return_state: also return the mixer's new decoding state.

        Returns:
          ``(c [B, T, D] in x.dtype, signals)``, or ``(c, signals, new_state)`` with
          ``return_state``; ``signals`` is the layer's
          :class:`~lattn_jax.routing.RouteSignals` for a routing layer, else ``None``.

        Raises:
          UnsupportedImplementationError: (``pallas_kernels.common.validation``) the mixer's
            explicitly named kernel cannot run here, naming the config option
            (``"model.gdn.implementation='pallas' is not supported here: <the op's error>"``;
            softmax attention's names ``model.attention.implementation`` itself).
        """
        try:
            return self._mix(x, segment_ids=segment_ids, side=side, route=route, state=state,
                             return_state=return_state)
        except validation.UnsupportedImplementationError as e:
            if str(e).startswith("model.") or self.mixer_name.startswith("attn"):
                raise  # softmax attention's: named already (model.attention.implementation)
            # A linear mixer's op names itself (gated_delta_rule, ...): its option is the
            # model section of the mixer's name (model.gdn, model.linear_attn, ...).
            option = f"model.{self.mixer_name}.implementation"
            raise validation.UnsupportedImplementationError(
                f"{option}={self.mixer.cfg.implementation!r} is not supported here: {e}"
            ) from None

    def _mix(self, x: Array, *, segment_ids: Optional[Array], side: Optional[Array],
             route: bool, state, return_state: bool) -> Tuple:
        """:meth:`mix` without the naming of an unsupported implementation's option."""
        xn = self.mixer_norm(x)
        kw = dict(state=state, return_state=True) if return_state else {}
        if not self.routes:
            out = self.mixer(xn, segment_ids=segment_ids, **kw)
            c, new_state = out if return_state else (out, None)
            signals = None
        else:
            route_in = side if (route and self.value_routing) else None
            out = self.mixer(xn, segment_ids=segment_ids, route_in=route_in,
                             return_route=True, **kw)
            c, new_state, signals = out if return_state else (out[0], None, out[1])
        if return_state:
            return c.astype(x.dtype), signals, new_state
        return c.astype(x.dtype), signals

    def next_side(self, side: Optional[Array],
                  signals: Optional[routing.RouteSignals]) -> Optional[Array]:
        """The value-space side channel after this layer: its own error if it is a ``"cler"``
        routing layer, else ``side`` unchanged (softmax layers pass it on, spec §4.2)."""
        return signals.error if self.value_routing else side

    def __call__(self, h: Array, *, segment_ids: Optional[Array] = None,
                 side: Optional[Array] = None, route: bool = True,
                 return_side: bool = False, state=None,
                 return_state: bool = False) -> Union[Array, Tuple]:
        """Applies the block (standard residual stream; AttnRes lives in the model).

        Args:
          h: ``[B, T, D]`` residual stream.
          segment_ids: optional int ``[B, T]``.
          side: optional ``[B, T, H, V]`` value-space CLER side channel.
          route: apply this layer's routing contributions (value injection, ``P_l s_l``).
          return_side: also return the side channel for the next layer.
          state: optional decoding state of the mixer (KV cache or recurrent state).
          return_state: also return the mixer's new decoding state (last element).

        Returns:
          ``h`` ``[B, T, D]`` (same dtype), ``(h, side)`` with ``return_side``, and the new
          mixer state appended with ``return_state``.
        """
        if return_state:
            c, signals, new_state = self.mix(h, segment_ids=segment_ids, side=side, route=route,
                                             state=state, return_state=True)
        else:
            c, signals = self.mix(h, segment_ids=segment_ids, side=side, route=route)
        h = h + c
        h = h + self.mlp(self.mlp_norm(h)).astype(h.dtype)
        if self.route is not None and route:
            h = h + self.route(signals, h).astype(h.dtype)
        out = (h,) + ((self.next_side(side, signals),) if return_side else ())
        out += (new_state,) if return_state else ()
        return out[0] if len(out) == 1 else out


class LanguageModel(nnx.Module):
    """Decoder-only LM whose layers follow ``model_config.layer_pattern``.

    Args:
      model_config: a validated :class:`~lattn_jax.config.ModelConfig`.
      rngs: NNX rngs.

    Raises:
      TypeError: ``model_config`` is not a ``ModelConfig`` (a ``ConfigDict`` or ``dict``): the
        message names the constructors that make one.

    Attributes:
      attn_res_final_query: ``[D]`` AttnRes pseudo-query of the final norm (with
        ``routing.attn_res`` only).
    """

    def __init__(self, model_config: config_lib.ModelConfig, *, rngs: nnx.Rngs):
        if not isinstance(model_config, config_lib.ModelConfig):  # a ConfigDict or dict
            raise TypeError(
                f"LanguageModel: model_config must be a lattn_jax.config.ModelConfig, got "
                f"{type(model_config).__name__}; build one with "
                f"lattn_jax.config.experiment_from_config_dict(config).model (a whole config "
                f"file's ConfigDict) or lattn_jax.config.ModelConfig(**options) (a mapping of "
                f"the model section's options)")
        self.config = model_config
        pdt = jnp.dtype(model_config.param_dtype)
        self.dtype = jnp.dtype(model_config.dtype)
        self.embed = nnx.Param(layers.normal_init(model_config.init_std)(
            rngs.params(), (model_config.vocab_size, model_config.d_model), pdt))
        self.blocks = nnx.List(
            [Block(name, model_config, rngs=rngs, layer_index=i)
             for i, name in enumerate(model_config.layer_pattern)])
        self.final_norm = layers.RMSNorm(model_config.d_model, eps=model_config.norm_eps,
                                         param_dtype=pdt,
                                         implementation=model_config.norm_implementation)
        if model_config.tie_embeddings:
            self.head = None
        else:
            self.head = layers.Dense(model_config.d_model, model_config.vocab_size,
                                     std=model_config.init_std, rngs=rngs, dtype=self.dtype,
                                     param_dtype=pdt)
        if model_config.routing.attn_res:
            self.attn_res_final_query = nnx.Param(jnp.zeros((model_config.d_model,), pdt))

    def init_state(self, batch: int, max_len: int) -> List[Any]:
        """Empty per-layer decoding states, one per block in ``layer_pattern`` order.

        Softmax-attention layers get a :class:`~lattn_jax.mixers.attention.KVCache` of capacity
        ``max_len`` (compute dtype); linear layers their recurrent state (fp32 ``S`` plus the
        short-convolution inputs in the compute dtype), whose size does not depend on
        ``max_len``.

        Args:
          batch: ``B``.
          max_len: KV-cache capacity: the prompt plus every token to be generated.

        Raises:
          ValueError: if ``batch < 1`` or ``max_len < 1`` (the latter from the attention
            cache).
        """
        layers.check_init_state_batch(batch)
        states = []
        for block in self.blocks:
            if isinstance(block.mixer, mixers.attention.Attention):
                states.append(block.mixer.init_state(batch, max_len))
            else:
                states.append(block.mixer.init_state(batch))
        return states

    @staticmethod
    def grow_state(states: Sequence[Any], max_len: int) -> List[Any]:
        """Per-layer states with every KV cache's capacity raised to ``max_len`` (recurrent
        states unchanged), e.g. after ``model(prompt, return_state=True)`` built caches of the
        prompt's length, before decoding.

        Raises:
          ValueError: if ``max_len`` is below a cache's capacity.
        """
        return [mixers.attention.grow_cache(st, max_len)
                if isinstance(st, mixers.attention.KVCache) else st for st in states]

    def _check_state_kinds(self, state: Sequence[Any]) -> None:
        """Raises ``ValueError`` naming the first entry of ``state`` whose kind does not fit its
        layer (a list reordered or taken from a model of another ``layer_pattern``): a
        ``KVCache`` for softmax attention, a ``LightningState`` for ``"lightning"``, a
        ``RecurrentState`` for the other linear mixers; ``None`` (a fresh state) fits any. Such
        a state failed inside the mixer with an ``AttributeError``."""
        for i, (block, st) in enumerate(zip(self.blocks, state)):
            if st is None:
                continue
            if isinstance(block.mixer, mixers.attention.Attention):
                want = mixers.attention.KVCache
            elif isinstance(block.mixer, mixers.lightning.LightningAttention):
                want = mixers.lightning.LightningState
            else:
                want = layers.RecurrentState
            if not isinstance(st, want):
                raise ValueError(
                    f"state[{i}] is a {type(st).__name__}, but layer {i} "
                    f"({self.config.layer_pattern[i]!r}) needs a {want.__name__}: pass the "
                    f"list from init_state() or a previous call, in layer_pattern order "
                    f"{tuple(self.config.layer_pattern)}")

    def __call__(self, tokens: Array, *, segment_ids: Optional[Array] = None,
                 route: bool = True, state: Optional[Sequence[Any]] = None,
                 return_state: bool = False, last_logits_only: bool = False,
                 return_hidden: bool = False) -> Union[Array, Tuple[Array, List[Any]]]:
        """Computes next-token logits (or the head's input), optionally continuing from states.

        Shapes use the letters of :mod:`lattn_jax.typing`: ``B`` batch, ``T`` tokens, ``D`` the
        model width, ``S`` the vocabulary size (``model_config.vocab_size``).

        Args:
          tokens: int ``[B, T]`` token ids, each in ``[0, vocab_size)``. Called eagerly (concrete
            ``tokens``, not a ``jax.core.Tracer``) the values are checked (one small device
            reduction and transfer). Under ``jit`` (or ``eval_shape``) they cannot be: the ids
            must then be in ``[0, vocab_size)``, as the embedding lookup (``jnp.take``, default
            ``"fill"`` mode) gives NaN embeddings, hence NaN logits, for an id ``>= vocab_size``
            or ``< -vocab_size``, and wraps ``[-vocab_size, -1]`` to the last rows silently.
            Check ids where they enter, on the host (the trainer refuses at start-up a
            ``model.vocab_size`` below the tokenizer's vocabulary, and token shards made with
            another tokenizer).
          segment_ids: optional int ``[B, T]`` document ids of a packed window; used only when
            ``model_config.use_segment_ids`` is set, or whenever a ``state`` is given or
            returned (decoding uses them to keep padding out of every layer's state,
            :mod:`lattn_jax.eval`). With a ``state``, the call's first document continues the
            cached one whatever its id (a new document cannot start on the call's first
            token: start it in a fresh state); later documents see none of the cache.
          route: apply the cross-layer routing contributions (CLER, CLER-H, CLVR, controls);
            ``False`` evaluates the host model with the same parameters.
          state: optional list of per-layer states from :meth:`init_state` or a previous call;
            the call continues them (a ``T == 1`` call is one decoding step). ``None`` with
            ``return_state`` starts fresh states, with KV caches of capacity ``T`` (a prefill on
            the training kernels; see :meth:`grow_state`).
          return_state: also return the list of new per-layer states.
          last_logits_only: compute the final norm and the LM head on the last position only
            and return logits ``[B, 1, S]`` (a prefill needs just the next token's logits; at
            ``T = 1M`` the full fp32 ``[B, T, S]`` logits would take ``4 T S`` bytes per row).
          return_hidden: return the LM head's input instead of the logits: the final-normed
            hidden states ``[B, T, D]`` (``[B, 1, D]`` with ``last_logits_only``) in the compute
            dtype ``model_config.dtype``, with ``logits == hidden @ head_kernel()`` up to the
            fp32 cast. For losses that apply the head chunk by chunk
            (:func:`lattn_jax.halo.losses.chunked_cross_entropy`,
            :func:`lattn_jax.halo.losses.chunked_forward_kl`) so that the fp32 ``[B, T, S]``
            logits never exist.

        Returns:
          fp32 logits ``[B, T, S]`` over the ``S = model_config.vocab_size`` token ids
          (``[B, 1, S]`` with ``last_logits_only``), or the hidden
          states ``[B, T, D]`` in the compute dtype with ``return_hidden``; as
          ``(logits_or_hidden, new_states)`` with ``return_state``.

        Raises:
          ValueError: if ``tokens`` is not an integer ``[B, T]`` array (``"tokens must be
            integer token ids [batch, seq_len], got float32 (2, 16, 32)"``), ``segment_ids``
            is given but not ``[B, T]`` like ``tokens`` (both static checks, made first), or
            ``state`` does not have one entry per layer or an entry of the wrong kind for its
            layer (a ``KVCache`` for a linear layer, ...) (and from the mixers, on a state of
            another batch size or a full KV cache); and, called eagerly, if an id is outside
            ``[0, vocab_size)`` (``"tokens must be ids in [0, vocab_size=257), got min -1, max
            300"``).
        """
        _check_tokens(tokens, segment_ids)
        _check_token_range(tokens, self.config.vocab_size)
        if not self.config.use_segment_ids and state is None and not return_state:
            segment_ids = None
        if state is not None and len(state) != len(self.blocks):
            raise ValueError(f"state has {len(state)} entries for {len(self.blocks)} layers")
        if state is not None:
            self._check_state_kinds(state)
        if return_state and state is None:
            # Attention layers start a cache of capacity T on the training path's kernel
            # (flash attention on a GPU); linear layers start from their zero state.
            state = [None if isinstance(block.mixer, mixers.attention.Attention)
                     else block.mixer.init_state(tokens.shape[0]) for block in self.blocks]
        h = jnp.take(self.embed[...], tokens, axis=0).astype(self.dtype)  # [B, T, D]
        new_states = []
        if self.config.routing.attn_res:
            h = self._attn_res_stack(h, segment_ids, route, state, new_states)
        elif return_state or state is not None:
            side = None
            for block, st in zip(self.blocks, state):
                h, side, st = block(h, segment_ids=segment_ids, side=side, route=route,
                                    return_side=True, state=st, return_state=True)
                new_states.append(st)
        else:
            def apply(blk, x, side):
                return blk(x, segment_ids=segment_ids, side=side, route=route, return_side=True)

            if self.config.remat:
                apply = nnx.remat(apply, policy=remat_policy(self.config.remat_policy))
            side = None
            for block in self.blocks:
                h = sharding.constrain(h, sharding.ACT_BTD)  # block boundary, [B, T, D]
                h, side = apply(block, h, side)
        if last_logits_only:
            h = h[:, -1:]  # [B, 1, D]
        h = self.final_norm(h)
        if return_hidden:
            h = h.astype(self.dtype)  # [B, T, D] the LM head's input
            return (h, new_states) if return_state else h
        if self.head is None:
            logits = jnp.einsum("btd,sd->bts", h, self.embed[...].astype(self.dtype))
        else:
            logits = self.head(h)
        if return_state:
            return logits.astype(jnp.float32), new_states
        return logits.astype(jnp.float32)

    def head_kernel(self) -> Array:
        """The LM head as one ``[D, S]`` matrix in the compute dtype ``model_config.dtype``.

        ``embed.T`` when the head is tied to the embedding (``self.head is None``), else the
        head :class:`~lattn_jax.layers.Dense`'s ``kernel`` (stored ``[D, S]``), both cast from
        ``param_dtype``; ``model(x) == model(x, return_hidden=True) @ head_kernel()`` up to the
        fp32 cast of the logits. Differentiable: gradients flow back to the embedding (tied) or
        the head's kernel.
        """
        if self.head is None:
            return self.embed[...].astype(self.dtype).T  # [D, S]
        return self.head.kernel[...].astype(self.dtype)  # [D, S]

    def _attn_res_stack(self, h: Array, segment_ids: Optional[Array], route: bool,
                        states: Optional[Sequence[Any]] = None,
                        new_states: Optional[List[Any]] = None) -> Array:
        """Full Attention Residuals (spec §4.4): returns the final norm's input ``[B, T, D]``.

        Contributions ``[h_0, c_1, c_2, ...]`` (embedding, then each attention and MLP output);
        sub-layer ``m >= 1`` reads ``attn_res_combine(w_m, contributions)``, ``m = 0`` reads
        ``h_0``. A residual-stream route ``P_l s_l`` is added to layer ``l``'s MLP
        contribution (spec §4.3, TB l.1106-1124).
        """
        contributions = [h]
        side = None
        for i, block in enumerate(self.blocks):
            x = h if i == 0 else routing.attn_res_combine(block.attn_res_mixer_query[...],
                                                          contributions)
            if states is None:
                c, signals = block.mix(x, segment_ids=segment_ids, side=side, route=route)
            else:
                c, signals, st = block.mix(x, segment_ids=segment_ids, side=side, route=route,
                                           state=states[i], return_state=True)
                new_states.append(st)
            contributions.append(c)
            x = routing.attn_res_combine(block.attn_res_mlp_query[...], contributions)
            c = block.mlp(block.mlp_norm(x)).astype(h.dtype)
            if block.route is not None and route:
                c = c + block.route(signals, x + c).astype(h.dtype)
            contributions.append(c)
            side = block.next_side(side, signals)
        return routing.attn_res_combine(self.attn_res_final_query[...], contributions)


def _check_tokens(tokens: Array, segment_ids: Optional[Array]) -> None:
    """Raises ``ValueError`` unless ``tokens`` is an integer ``[B, T]`` array and
    ``segment_ids`` is ``None`` or ``[B, T]`` (static shapes and dtypes: free under ``jit``;
    the id values are not checked, see :meth:`LanguageModel.__call__`)."""
    shape = tuple(jnp.shape(tokens))
    dtype = getattr(tokens, "dtype", None)
    if len(shape) != 2 or dtype is None or not jnp.issubdtype(dtype, jnp.integer):
        got = type(tokens).__name__ if dtype is None else jnp.dtype(dtype).name
        raise ValueError(f"tokens must be integer token ids [batch, seq_len], got {got} {shape}")
    if 0 in shape:  # (a mixer named its own q: "the time axis must hold at least one token")
        raise ValueError(f"tokens must hold at least one row and one token, got shape {shape}")
    layers.check_segment_ids(segment_ids, shape, "tokens")


def _check_token_range(tokens: Array, vocab_size: int) -> None:
    """Raises ``ValueError`` naming ``tokens``, their min and max and ``vocab_size`` when a
    concrete ``tokens`` (not a tracer, nor used while tracing: under ``jit`` nothing can be
    checked) holds an id outside ``[0, vocab_size)``. The min and max are computed where the
    ids are (device or host) and fetched explicitly (``jax.device_get``, allowed under
    ``jax_transfer_guard="disallow"``)."""
    if isinstance(tokens, jax.core.Tracer) or math.prod(jnp.shape(tokens)) == 0:
        return
    if isinstance(tokens, jax.Array):
        lo, hi = jnp.min(tokens), jnp.max(tokens)
        if isinstance(lo, jax.core.Tracer):  # concrete ids closed over by a traced function
            return
        lo, hi = jax.device_get((lo, hi))
    else:  # NumPy or nested lists: on the host already
        lo, hi = np.min(tokens), np.max(tokens)
    if lo < 0 or hi >= vocab_size:
        raise ValueError(f"tokens must be ids in [0, vocab_size={vocab_size}), got min {int(lo)}, "
                         f"max {int(hi)}")


def remat_policy(name: str):
    """The ``jax.checkpoint_policies`` entry called ``name`` (``config.REMAT_POLICIES``)."""
    if name not in config_lib.REMAT_POLICIES:
        raise ValueError(f"unknown remat policy {name!r}; choose from "
                         f"{', '.join(config_lib.REMAT_POLICIES)}")
    return getattr(jax.checkpoint_policies, name)


def count_params(model: nnx.Module) -> int:
    """Number of scalar parameters in ``model``."""
    return sum(x.size for x in jax.tree_util.tree_leaves(nnx.state(model, nnx.Param)))
