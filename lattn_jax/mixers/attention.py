"""Causal softmax attention mixer: MHA/GQA, RoPE or NoPE, QK norm, output gate, logit scaling.

Paper 1 (arXiv 2607.07953) §2 / spec §2.5: one fused projection ``D -> (H [+ H] + 2G) * d_h``
laid out as ``[q | gate | k | v]``, scale ``1/sqrt(d_h)``, RoPE (base 5e5, rotate-half) on q and
k, ``o <- o * sigmoid(gate)`` before the output projection when the gate is on, no biases.

HypeNet (arXiv 2601.22156; spec ``hypenet-halo.md`` §1.6) uses the same layer with QK RMSNorm,
NoPE (layer name ``"attn_nope"``, :class:`NoPEAttention`), the output gate, and at inference the
position-dependent logit scaling ``q_t <- s_t q_t``, ``s_t = log_a(t + a)``
(``AttentionConfig.logit_scaling_base``).

Attention itself goes through ``jax.nn.dot_product_attention``: cuDNN's flash attention on a
GPU in bf16/fp16 (``AttentionConfig.implementation="auto"``), XLA otherwise. Packed documents
are separated by a block-diagonal mask built from ``segment_ids``, and RoPE positions (and ``t``
of the logit scaling) restart at every document.

Decoding uses an explicit KV cache (:class:`KVCache`, from :meth:`Attention.init_state`): a call
with a cache writes its keys and values at the next free slots and attends over the valid prefix
of the row's current document.
"""

import itertools
import math
from typing import NamedTuple, Optional, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lattn_jax import config as config_lib
from lattn_jax import context_parallel
from lattn_jax import layers
from lattn_jax.typing import Array
from pallas_kernels.common import validation


class KVCache(NamedTuple):
    """Key/value cache of one softmax-attention layer.

    Attributes:
      k: ``[B, S, G, dh]`` keys in the compute dtype, after QK norm and RoPE; ``S`` is the cache
        capacity (``max_len``). Slots at or past ``length`` hold zeros or stale values and are
        never attended.
      v: ``[B, S, G, dh]`` values.
      length: int32 ``[B]``, number of filled slots (every row advances by the same ``T``).
      doc_start: int32 ``[B]``, slot at which the row's current document begins; the position of
        the next token (RoPE phase, ``t`` of the logit scaling) is ``length - doc_start``.
    """

    k: Array
    v: Array
    length: Array
    doc_start: Array


def logit_scale(positions: Array, base: float) -> Array:
    """HypeNet's query scale ``s_t = log_a(t + a) = ln(t + a) / ln(a)``, fp32 ``[B, T]``.

    Spec ``hypenet-halo.md`` §1.6 item 4 (authors' ``modeling_qwen3.py:230-250``), with ``t`` the
    0-based position, so ``s_0 = 1`` (spec §6 item 16). E.g. ``a = 500``: ``s_511 = 1.113``.

    Args:
      positions: int ``[B, T]`` positions ``t >= 0``.
      base: ``a > 1``.
    """
    return jnp.log(positions.astype(jnp.float32) + base) / math.log(base)


def _last_document_start(segment_ids: Optional[Array], batch: int, length: int) -> Array:
    """Index (within the call) of the first token of each row's last document, int32 ``[B]``."""
    if segment_ids is None:
        return jnp.zeros((batch,), jnp.int32)
    t = jnp.arange(length, dtype=jnp.int32)[None, :]
    starts = jnp.concatenate(
        [jnp.zeros((batch, 1), bool), segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1)
    return jnp.max(jnp.where(starts, t, 0), axis=1)


def resolve_implementation(implementation: str, dtype, head_dim: int) -> str:
    """The attention kernel behind ``AttentionConfig.implementation``: ``"xla"`` or ``"cudnn"``.

    ``"auto"`` picks cuDNN's flash attention when the default backend is a GPU, ``dtype`` is
    bf16 or fp16 and ``head_dim`` is a multiple of 8 up to 256 (cuDNN's flash conditions on
    Hopper), else XLA.

    Raises:
      ValueError: for ``"cudnn"`` on another backend, dtype or head dim (the reason named), or
        an unknown implementation.
    """
    dtype = jnp.dtype(dtype)
    reasons = []
    if jax.default_backend() != "gpu":
        reasons.append(f"the backend is {jax.default_backend()!r}, not 'gpu'")
    if dtype not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        reasons.append(f"the compute dtype is {dtype.name}, not bfloat16/float16")
    if head_dim % 8 or head_dim > 256:
        reasons.append(f"head_dim={head_dim} is not a multiple of 8 up to 256")
    if implementation == "auto":
        return "xla" if reasons else "cudnn"
    if implementation == "cudnn":
        if reasons:
            raise validation.UnsupportedImplementationError(
                "model.attention.implementation='cudnn' is not supported here: "
                + "; ".join(reasons))
        return "cudnn"
    if implementation == "xla":
        return "xla"
    raise ValueError(f"model.attention.implementation={implementation!r}; choose auto, xla or "
                     "cudnn")


def grow_cache(cache: "KVCache", max_len: int) -> "KVCache":
    """``cache`` with its capacity raised to ``max_len`` slots (zeros appended), e.g. after a
    prefill that built a cache of exactly the prompt's length.

    Raises:
      ValueError: if ``max_len`` is below the current capacity.
    """
    capacity = cache.k.shape[1]
    if max_len < capacity:
        raise ValueError(f"max_len={max_len} is below the cache's capacity {capacity}")
    pad = [(0, 0), (0, max_len - capacity), (0, 0), (0, 0)]
    return cache._replace(k=jnp.pad(cache.k, pad), v=jnp.pad(cache.v, pad))


def _concrete_max(x: Array) -> Optional[int]:
    """``max(x)`` as a Python int if ``x`` is concrete, else ``None`` (under ``jit``)."""
    try:
        return int(np.max(np.asarray(x)))
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return None


class Attention(nnx.Module):
    """Causal multi-head / grouped-query softmax attention.

    ``o_t = softmax(s_t q_t K_{<=t}^T / sqrt(d_h)) V_{<=t}`` per head (Vaswani et al. 2017,
    Eq. 1), query head ``n`` reading key/value group ``n // (H / G)``; ``s_t = 1`` unless
    ``logit_scaling_base`` is set.

    Decoding: ``cache = module.init_state(B, max_len)``, then ``y, cache = module(x, state=cache,
    return_state=True)`` for a prompt (any ``T``) and for each new token (``T == 1``).

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
        self.logit_scaling_base = cfg.logit_scaling_base
        self.dtype = jnp.dtype(model_config.dtype)
        self.implementation = resolve_implementation(cfg.implementation, self.dtype,
                                                     self.head_dim)
        param_dtype = jnp.dtype(model_config.param_dtype)
        d = self.d_model = model_config.d_model
        q_width = self.num_heads * self.head_dim
        kv_width = self.num_kv_heads * self.head_dim
        gate_width = q_width if self.output_gate else 0
        self.qkv_proj = layers.Dense(
            d, q_width + gate_width + 2 * kv_width, std=model_config.init_std, rngs=rngs,
            dtype=self.dtype, param_dtype=param_dtype,
            split_products=model_config.split_projections)
        out_std = model_config.init_std / math.sqrt(2 * model_config.num_layers)
        self.out_proj = layers.Dense(q_width, d, std=out_std, rngs=rngs, dtype=self.dtype,
                                     param_dtype=param_dtype)
        if cfg.qk_norm:
            self.q_norm = layers.RMSNorm(self.head_dim, eps=model_config.norm_eps,
                                         param_dtype=param_dtype,
                                         implementation=model_config.norm_implementation)
            self.k_norm = layers.RMSNorm(self.head_dim, eps=model_config.norm_eps,
                                         param_dtype=param_dtype,
                                         implementation=model_config.norm_implementation)
        else:
            self.q_norm = self.k_norm = None

    def init_state(self, batch: int, max_len: int) -> KVCache:
        """An empty cache for ``batch`` rows of up to ``max_len`` tokens (compute dtype).

        Raises:
          ValueError: ``batch`` is not a positive integer
            (:func:`~lattn_jax.layers.check_init_state_batch`), or ``max_len`` is not an
            integer >= 1 (a Python or NumPy int; a float or ``None`` failed inside
            ``jnp.zeros`` or the comparison).
        """
        layers.check_init_state_batch(batch)
        if (isinstance(max_len, (bool, np.bool_)) or not isinstance(max_len, (int, np.integer))
                or max_len < 1):
            raise ValueError(f"max_len must be an integer >= 1 (the KV-cache capacity), got "
                             f"{max_len=!r}")
        shape = (batch, max_len, self.num_kv_heads, self.head_dim)
        return KVCache(k=jnp.zeros(shape, self.dtype), v=jnp.zeros(shape, self.dtype),
                       length=jnp.zeros((batch,), jnp.int32),
                       doc_start=jnp.zeros((batch,), jnp.int32))

    def __call__(self, x: Array, *, segment_ids: Optional[Array] = None,
                 state: Optional[KVCache] = None,
                 return_state: bool = False) -> Union[Array, Tuple[Array, KVCache]]:
        """Mixes a sequence, or continues one from a KV cache.

        Args:
          x: ``[B, T, D]`` normalised hidden states.
          segment_ids: optional int ``[B, T]``; tokens attend only within their own document and
            positions restart at each document. With a ``state``, the call's first document
            continues the cached one; later documents see none of the cache, and the returned
            cache's current document is the row's last one (so decoding after a packed prefill
            equals decoding the last document alone; earlier documents stay in the cache but are
            masked).
          state: optional :class:`KVCache`. ``None`` with ``return_state`` starts a cache of
            capacity ``T`` (full after this call; attention runs on the training path's kernel,
            flash attention on a GPU); raise its capacity with :func:`grow_cache`, or pass a
            larger one from :meth:`init_state`, to keep decoding.
          return_state: also return the updated cache.

        Returns:
          ``y`` ``[B, T, D]`` in the compute dtype, or ``(y, new_cache)`` if ``return_state``.

        Raises:
          ValueError: if ``x`` is not ``[B, T, d_model]`` or ``segment_ids`` is not ``[B, T]``
            like ``x`` (naming the argument and the expected shape; static shapes, checked
            first); if the cache's batch differs from ``x``'s, or the tokens do not fit in the
            cache (checked when the lengths are concrete; under ``jit`` an overflowing write is
            clamped by ``dynamic_update_slice``, so size the cache for the whole generation).
        """
        layers.check_mixer_input(x, self.d_model, segment_ids)
        b, t, _ = x.shape
        h, g, dh = self.num_heads, self.num_kv_heads, self.head_dim
        fresh = state is None and return_state  # a new cache of capacity T: flash path
        if state is not None:
            self._check_cache(state, b, t)
        sizes = [h * dh] + ([h * dh] if self.output_gate else []) + [g * dh, g * dh]
        parts = self.qkv_proj.split(x, list(itertools.accumulate(sizes))[:-1])
        if self.output_gate:
            q, gate, k, v = parts
        else:
            (q, k, v), gate = parts, None
        q = q.reshape(b, t, h, dh)  # [B, T, H, dh]
        k = k.reshape(b, t, g, dh)  # [B, T, G, dh]
        v = v.reshape(b, t, g, dh)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        offset = None if state is None else state.length - state.doc_start
        if self.rope_theta is not None or self.logit_scaling_base is not None:
            positions = layers.positions_from_segment_ids(segment_ids, b, t, offset)  # [B, T]
        if self.rope_theta is not None:
            q = layers.apply_rope(q, positions, self.rope_theta)
            k = layers.apply_rope(k, positions, self.rope_theta)
        if self.logit_scaling_base is not None:
            # Only q is scaled: a per-query temperature on numerator and denominator alike.
            s = logit_scale(positions, self.logit_scaling_base)[:, :, None, None]  # [B, T, 1, 1]
            q = (q.astype(jnp.float32) * s).astype(q.dtype)
        if fresh:
            o = self._attend(q, k, v, segment_ids)
            new_state = KVCache(
                k=k.astype(self.dtype), v=v.astype(self.dtype),
                length=jnp.full((b,), t, jnp.int32),
                doc_start=_last_document_start(segment_ids, b, t).astype(jnp.int32))
        elif state is None:
            o = self._attend(q, k, v, segment_ids)
            new_state = None
        else:
            o, new_state = self._attend_cached(q, k, v, segment_ids, state)
        o = o.reshape(b, t, h * dh)
        if gate is not None:
            o = o * jax.nn.sigmoid(gate.astype(jnp.float32)).astype(o.dtype)
        y = self.out_proj(o)
        if return_state:
            return y, new_state
        return y

    def _check_cache(self, state: KVCache, batch: int, length: int) -> None:
        """Raises ``ValueError`` on a cache of the wrong batch, one of another layer's heads or
        head width (``k``/``v`` not ``[B, S, G, dh]``; it failed inside
        ``lax.dynamic_update_slice`` or ``dot_product_attention``), or one too small for the
        call."""
        capacity = state.k.shape[1]
        if state.k.shape[0] != batch:
            raise ValueError(f"the cache was built for batch {state.k.shape[0]}, but x has batch "
                             f"{batch}; build it with init_state({batch}, max_len)")
        want = (batch, capacity, self.num_kv_heads, self.head_dim)
        for name in ("k", "v"):
            got = tuple(jnp.shape(getattr(state, name)))
            if got != want:
                raise ValueError(
                    f"the cache's {name} must be [batch={batch}, max_len={capacity}, "
                    f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}] for this "
                    f"layer, got {got}; build it with this layer's init_state({batch}, max_len)")
        used = _concrete_max(state.length)
        if length > capacity or (used is not None and used + length > capacity):
            raise ValueError(f"{length} new tokens do not fit in the KV cache: capacity "
                             f"{capacity}, {used} slots already filled")

    def _attend(self, q: Array, k: Array, v: Array, segment_ids: Optional[Array]) -> Array:
        """Training path: causal, block-diagonal attention within the call, ``[B, T, H, dh]``.

        Under context parallelism (:mod:`lattn_jax.context_parallel`) the sequence is split
        over devices and keys/values are gathered (online softmax in fp32, XLA).
        """
        if context_parallel.is_active(q.shape[1]):
            return context_parallel.attention(q, k, v, segment_ids,
                                              scale=1.0 / math.sqrt(self.head_dim))
        mask = None
        if segment_ids is not None:
            doc = validation.document_index(segment_ids)
            mask = (doc[:, :, None] == doc[:, None, :])[:, None, :, :]  # [B, 1, T, T]
        return jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=True,
                                            scale=1.0 / math.sqrt(self.head_dim),
                                            implementation=self.implementation)

    def _attend_cached(self, q: Array, k: Array, v: Array, segment_ids: Optional[Array],
                       state: KVCache) -> Tuple[Array, KVCache]:
        """Writes k, v into the cache and attends over its valid part, ``[B, T, H, dh]``.

        Query ``i`` (slot ``length + i``) sees slot ``s`` iff ``s <= length + i`` and ``s`` holds
        a token of the same document: cached slots ``>= doc_start`` continue the call's first
        document, cached slots before it belong to finished documents.
        """
        b, t = q.shape[:2]
        capacity = state.k.shape[1]
        length = state.length.astype(jnp.int32)  # [B]

        def write(cache, new, start):
            return jax.lax.dynamic_update_slice(cache, new.astype(cache.dtype), (start, 0, 0))

        k_cache = jax.vmap(write)(state.k, k, length)  # [B, S, G, dh]
        v_cache = jax.vmap(write)(state.v, v, length)
        if segment_ids is None:
            doc_new = jnp.zeros((b, t), jnp.int32)
        else:
            doc_new = validation.document_index(segment_ids)  # [B, T], 0 = continuing document
        slot = jnp.arange(capacity, dtype=jnp.int32)[None, :]  # [1, S]
        rel = slot - length[:, None]  # [B, S], index into this call's tokens
        doc_cached = jnp.where(slot >= state.doc_start[:, None], 0, -1)
        doc_key = jnp.where(
            rel < 0, doc_cached,
            jnp.take_along_axis(doc_new, jnp.clip(rel, 0, t - 1), axis=1))  # [B, S]
        query_slot = length[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]  # [B, T]
        mask = (slot[:, None, :] <= query_slot[:, :, None]) & (
            doc_key[:, None, :] == doc_new[:, :, None])  # [B, T, S]
        o = jax.nn.dot_product_attention(q, k_cache, v_cache, mask=mask[:, None],
                                         scale=1.0 / math.sqrt(self.head_dim))
        last_start = _last_document_start(segment_ids, b, t)
        doc_start = jnp.where(doc_new[:, -1] > 0, length + last_start, state.doc_start)
        new_state = KVCache(k=k_cache, v=v_cache, length=length + t,
                            doc_start=doc_start.astype(jnp.int32))
        return o, new_state


class NoPEAttention(Attention):
    """:class:`Attention` without RoPE (NoPE), the layer name ``"attn_nope"``.

    HypeNet's softmax layers (spec ``hypenet-halo.md`` §1.6 item 2) use no positional encoding;
    this class lets RoPE and NoPE softmax layers share one ``AttentionConfig`` in a hybrid
    pattern. Everything else (QK norm, gate, logit scaling, cache) is :class:`Attention`'s.
    """

    def __init__(self, model_config: config_lib.ModelConfig, *, rngs: nnx.Rngs):
        super().__init__(model_config, rngs=rngs)
        self.rope_theta = None
