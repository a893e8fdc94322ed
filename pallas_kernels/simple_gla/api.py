"""Public scalar-decay linear-attention ops: plain linear attention and Lightning Attention.

With the FLA state layout S in R^{K x V} (key-major) and a scalar log-decay g_t per head::

    S_t = exp(g_t) S_{t-1} + k_t v_t^T,        o_t = scale * S_t^T q_t   (inclusive of token t),

i.e. ``o_t = scale * sum_{s <= t} exp(g_{s+1} + ... + g_t) (q_t . k_s) v_s`` (FLA's
``simple_gla``). There is no normaliser (no denominator).

* Plain linear attention (paper "Linear Attention Architectures", arXiv 2607.07953, Eqs. 4-10,
  the "additive memory"; spec ``linear-attention-architectures.md`` §2.3): ``g = 0``, see
  :func:`linear_attention`.
* Lightning Attention as used by HypeNet (paper "Hybrid Linear Attention Done Right", arXiv
  2601.22156; spec ``hypenet-halo.md`` §1.5 items 5-6, §1.11): a fixed per-head decay
  ``g_t,h = log(gamma_h) = -slope_h`` with ALiBi slopes, see :func:`lightning_attention` and
  :func:`lightning_log_decay`. The spec gives no equation number for it.

The scale multiplies the read-out (FLA multiplies q, equivalently; spec §1.5 item 6), so the state
is unscaled and can be carried between calls unchanged.

Implementations (``implementation=``):

* ``"mosaic_gpu"`` (default for ``None``/``"auto"`` on a Hopper-or-newer GPU where supported:
  16-bit ``q, k, v`` of one dtype, K and V 64 or 128, chunk size 64, ``T >= 64``): the Pallas
  Mosaic GPU kernels (``kernel_mosaic_gpu.py``, wgmma and TMA), differentiable through their own
  backward kernels; ``"mosaic_gpu_interpret"`` runs them in Mosaic GPU interpret mode (tests).
  The decision is :func:`pallas_kernels.common.mosaic_gpu.choose_implementation`'s, logged;
* ``"pallas"`` (default for ``None``/``"auto"`` on other GPUs where supported): the Pallas GPU
  kernels of the scalar-decay family (``gated_delta_rule/kernel_gpu.py``) with the delta rule off;
  ``"pallas_interpret"`` runs them in Pallas interpret mode on any backend;
* ``"pallas_tpu"`` (default for ``None``/``"auto"`` on a TPU where supported): the Pallas TPU
  kernels of the same family (``gated_delta_rule/kernel_tpu.py``) with the delta rule off; on
  other backends they run in Pallas TPU interpret mode (slow; tests);
* ``"chunked"`` (the ``"auto"`` choice elsewhere): the chunkwise form in ``chunked.py``;
* ``"reference"``: the token-serial ``lax.scan`` in ``reference.py`` (ground truth, slow);
* ``"associative_scan"``: the exact parallel form over scalar-decay affine maps, also in
  ``reference.py`` (``O(T K V log T)`` work, every state materialised).

Example::

    import jax
    import jax.numpy as jnp
    from pallas_kernels import simple_gla as sg

    B, T, HK, H, K, V = 2, 100, 2, 4, 32, 64
    kq, kk, kv = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(kq, (B, T, HK, K))
    k = jax.random.normal(kk, (B, T, HK, K))
    v = jax.random.normal(kv, (B, T, H, V), jnp.bfloat16)
    log_decay = sg.lightning_log_decay(H)  # [H] fp32, HypeNet's fixed decays
    o, state = sg.lightning_attention(q, k, v, log_decay, output_final_state=True)
    # o: [2, 100, 4, 64] bf16, state: [2, 4, 32, 64] fp32. Continue from `state`:
    o2, _ = sg.lightning_attention(q, k, v, log_decay, initial_state=state)
    o_la, _ = sg.linear_attention(q, k, v)  # no decay
"""

import functools
import math
import numbers
from typing import Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels import common
from pallas_kernels.common import mosaic_gpu, pallas_gpu, pallas_tpu
from pallas_kernels.gated_delta_rule import kernel_gpu, kernel_tpu
from pallas_kernels.simple_gla import chunked
from pallas_kernels.simple_gla import kernel_mosaic_gpu
from pallas_kernels.simple_gla import reference

# Concrete forms of this op, best first: None/"auto" resolve to the first entry.
_IMPLEMENTATIONS = {
    "chunked": chunked.simple_gla_chunked,
    "reference": reference.simple_gla_reference,
    "associative_scan": reference.simple_gla_associative,
}

Output = Tuple[jax.Array, Optional[jax.Array]]


def _validate(q, k, v, g, initial_state, segment_ids, chunk_size, scale=None) -> None:
    """Checks ranks, shapes and dtypes at the public boundary; raises ``ValueError``."""
    gates = (("g", g, "BTH"),)
    common.check_op_inputs(q, k, v, gates, initial_state, segment_ids, chunk_size,
                           scale=scale)


@functools.partial(jax.jit, static_argnames=("implementation", "chunk_size"))
def _forward(q, k, v, g, scale, initial_state, segment_ids, *, implementation, chunk_size):
    """Expands GVA heads, runs the chosen form in fp32 and casts o back to ``v.dtype``.

    ``chunk_size`` is the effective chunk size for ``"chunked"`` and ``None`` otherwise.
    """
    f32 = jnp.float32
    q, k = common.expand_key_heads(q, k, v.shape[2])  # fp32 [B, T, H, K]
    g = None if g is None else g.astype(f32)
    kwargs = dict(scale=scale, initial_state=initial_state, segment_ids=segment_ids)
    if implementation == "chunked":
        kwargs["chunk_size"] = chunk_size
    o, final_state = _IMPLEMENTATIONS[implementation](q, k, v.astype(f32), g, **kwargs)
    return o.astype(v.dtype), final_state


@functools.partial(jax.jit, static_argnames=("scale", "interpret"))
def _forward_pallas(q, k, v, g, initial_state, segment_ids, *, scale, interpret):
    """The Pallas kernels with the delta rule off (``beta=None``); GVA heads expanded here."""
    q, k = common.expand_key_heads(q, k, v.shape[2], dtype=None)
    o, final_state, _ = kernel_gpu.scalar_decay_pallas(
        q, k, v, g, None, scale=scale, initial_state=initial_state, segment_ids=segment_ids,
        return_residual=False, interpret=interpret,
    )
    return o.astype(v.dtype), final_state


@functools.partial(jax.jit, static_argnames=("scale", "chunk_size"))
def _forward_tpu(q, k, v, g, initial_state, segment_ids, *, scale, chunk_size):
    """The Pallas TPU kernels with the delta rule off (``beta=None``); GVA heads expanded."""
    q, k = common.expand_key_heads(q, k, v.shape[2], dtype=None)
    o, final_state, _ = kernel_tpu.scalar_decay_tpu(
        q, k, v, g, None, scale=scale, initial_state=initial_state, segment_ids=segment_ids,
        chunk_size=chunk_size,
    )
    return o, final_state


def simple_gla(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: Optional[jax.Array],
    *,
    scale: Optional[float] = None,
    initial_state: Optional[jax.Array] = None,
    output_final_state: bool = False,
    segment_ids: Optional[jax.Array] = None,
    chunk_size: int = 64,
    implementation: Optional[str] = None,
) -> Output:
    """Linear attention with a scalar (per token, per head) decay: FLA's "simple GLA".

    Computes, per batch row and value head, with the state S_t in R^{K x V} (FLA layout)::

        S_t = exp(g_t) S_{t-1} + k_t v_t^T,        o_t = scale * S_t^T q_t

    (inclusive of token t, no normaliser). All state math, decay cumsums and reductions run in
    fp32 with ``Precision.HIGHEST`` whatever the input dtype; ``o`` is cast back to ``v.dtype``.
    Gradients w.r.t. every array argument (including ``initial_state``) come from JAX autodiff
    of the chosen form.

    GVA/GQA: when ``H > HK``, value head ``h`` uses key/query head ``h // (H // HK)`` (q and k
    are ``jnp.repeat``-ed along the head axis, like FLA's ``repeat_interleave``).

    Args:
        q: queries ``[B, T, HK, K]``, any float dtype.
        k: keys ``[B, T, HK, K]``, any float dtype.
        v: values ``[B, T, H, V]``, any float dtype; ``H`` must be a multiple of ``HK``.
        g: per-token log-decay ``[B, T, H]`` in natural-log units (the decay is
            ``exp(g_t)``, so ``g <= 0``), any float dtype (converted to fp32), or ``None`` for
            no decay (plain linear attention).
            ``-inf`` (a hard reset) is allowed: every implementation but ``"reference"``
            raises values under ``common.LOG_DECAY_FLOOR`` (-128) to it, a decay of 0 in
            fp32 either way (:func:`pallas_kernels.common.floor_log_decay`).
        scale: read-out scale; ``None`` means ``K ** -0.5``.
        initial_state: ``[B, H, K, V]`` state before the first token (fp32 recommended), or
            ``None`` for zeros. With ``segment_ids`` it applies to the first document of each
            row only.
        output_final_state: whether to return the state after the last token.
        segment_ids: optional integer ``[B, T]`` for packed rows. A new document starts wherever
            ``segment_ids[:, t] != segment_ids[:, t - 1]``, and the state is reset to zero there
            (exactly, also inside a chunk).
        chunk_size: chunk length C of the chunked form, a power of two (64 matches FLA). It is
            clipped to ``T`` when ``T`` is shorter (one unpadded chunk).
        implementation: ``None``/``"auto"``, ``"mosaic_gpu"``, ``"mosaic_gpu_interpret"``,
            ``"pallas"``, ``"pallas_interpret"``, ``"pallas_tpu"``, ``"chunked"``,
            ``"reference"`` or ``"associative_scan"``; ``"auto"`` picks the Mosaic GPU kernels
            on a GPU of compute capability 9.x (Hopper) when ``q, k, v`` share a 16-bit dtype,
            K and V are 64 or 128, the chunk size is 64 and ``T >= 64`` (see
            :func:`pallas_kernels.common.mosaic_gpu.choose_implementation`), else the Triton
            kernels on a GPU when K and V are 64 or 128, the chunk size is
            64 and ``T >= 64``, and the TPU kernels on a TPU when K and V are 64 or 128, the
            chunk size 64 or 128 and ``T`` fills a chunk (see
            :func:`pallas_kernels.common.pallas_gpu.choose_implementation` and
            :func:`pallas_kernels.common.pallas_tpu.choose_implementation`). ``"pallas_tpu"``
            runs in Pallas TPU interpret mode off a TPU.

    Returns:
        ``(o, final_state)``: ``o`` ``[B, T, H, V]`` in ``v.dtype``; ``final_state``
        ``[B, H, K, V]`` fp32 if ``output_final_state`` else ``None``.

    Raises:
        TypeError: naming an array argument that is not a ``jax.Array`` or
            ``numpy.ndarray`` (a list, a tuple: convert it with ``jnp.asarray``).
        ValueError: on a wrong rank or shape (naming the argument), ``H % HK != 0``, ``T == 0``,
            non-float inputs, non-integer ``segment_ids``, a ``chunk_size`` that is not a power
            of two, an unknown ``implementation``, or an explicit ``"pallas"`` that cannot run
            the call (no GPU, head dims other than 64/128, another chunk size), or an explicit
            ``"mosaic_gpu"`` that cannot (no Hopper GPU, inputs not one 16-bit dtype), with
            the reason.
    """
    return _simple_gla_op(
        "simple_gla", q, k, v, g,
        scale=scale, initial_state=initial_state, output_final_state=output_final_state,
        segment_ids=segment_ids, chunk_size=chunk_size, implementation=implementation,
    )


def _simple_gla_op(op, q, k, v, g, *, scale, initial_state, output_final_state, segment_ids,
                   chunk_size, implementation) -> Output:
    """:func:`simple_gla` (and :func:`linear_attention`, :func:`lightning_attention`); ``op`` is
    the public function's name, which the dispatch's errors and log lines name
    (``"linear_attention: implementation='pallas' cannot run this call: ..."``)."""
    _validate(q, k, v, g, initial_state, segment_ids, chunk_size, scale=scale)
    batch, seq_len, _, dk = q.shape
    heads, dv = v.shape[2:]
    impl = pallas_tpu.choose_implementation(
        op, implementation, tuple(_IMPLEMENTATIONS), (q, k, v), (dk, dv), chunk_size,
        seq_len, fallback=mosaic_gpu.choose_implementation,
    )
    if scale is None:
        scale = dk ** -0.5
    if impl != "reference" and g is not None:  # the token-serial ground truth takes g as is
        g = common.floor_log_decay(g)
    if impl in mosaic_gpu.MOSAIC_IMPLEMENTATIONS:
        o, final_state = kernel_mosaic_gpu.simple_gla_mosaic(  # g, h0 read as fp32 there
            q, k, v, g, scale=float(scale), initial_state=initial_state,
            segment_ids=segment_ids, interpret=impl == "mosaic_gpu_interpret")
        return o, (final_state if output_final_state else None)
    if impl == "pallas_tpu":
        o, final_state = _forward_tpu(q, k, v, g, initial_state, segment_ids,
                                      scale=float(scale), chunk_size=chunk_size)
        return o, (final_state if output_final_state else None)
    if impl in pallas_gpu.PALLAS_IMPLEMENTATIONS:
        o, final_state = _forward_pallas(
            q, k, v, g, initial_state, segment_ids, scale=float(scale),
            interpret=impl == "pallas_interpret",
        )
        return o, (final_state if output_final_state else None)
    if initial_state is None:
        # Zeros rather than a None branch: one compiled program serves both cases.
        initial_state = jnp.zeros((batch, heads, dk, dv), jnp.float32)
    # Normalise the static chunk size so that equivalent calls share one compiled program.
    chunk = common.effective_chunk_size(chunk_size, seq_len) if impl == "chunked" else None
    o, final_state = _forward(
        q, k, v, g, scale, initial_state, segment_ids, implementation=impl, chunk_size=chunk,
    )
    return o, (final_state if output_final_state else None)


def linear_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    scale: Optional[float] = None,
    initial_state: Optional[jax.Array] = None,
    output_final_state: bool = False,
    segment_ids: Optional[jax.Array] = None,
    chunk_size: int = 64,
    implementation: Optional[str] = None,
) -> Output:
    """Plain (additive) linear attention, paper arXiv 2607.07953, Eqs. 4-10: no decay.

    ``S_t = S_{t-1} + k_t v_t^T``, ``o_t = scale * S_t^T q_t = scale * sum_{s <= t} (q_t . k_s)
    v_s``, with no normaliser (spec ``linear-attention-architectures.md`` §2.3). This is
    :func:`simple_gla` with ``g=None``: the arguments, shapes, dtypes, returns and errors are the
    same.
    """
    return _simple_gla_op(
        "linear_attention", q, k, v, None,
        scale=scale, initial_state=initial_state, output_final_state=output_final_state,
        segment_ids=segment_ids, chunk_size=chunk_size, implementation=implementation,
    )


def lightning_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    log_decay: jax.Array,
    *,
    scale: Optional[float] = None,
    initial_state: Optional[jax.Array] = None,
    output_final_state: bool = False,
    segment_ids: Optional[jax.Array] = None,
    chunk_size: int = 64,
    implementation: Optional[str] = None,
) -> Output:
    """Lightning Attention with a fixed per-head decay (HypeNet, arXiv 2601.22156, spec §1.5).

    ``S_t = gamma_h S_{t-1} + k_t v_t^T``, ``o_t = scale * S_t^T q_t = scale * sum_{s <= t}
    gamma_h^{t-s} (q_t . k_s) v_s`` with ``gamma_h = exp(log_decay[h])`` for every batch row and
    token (spec ``hypenet-halo.md`` §1.5 item 6; HypeNet uses ``scale = K ** -0.5``, the default,
    and no normaliser). This is :func:`simple_gla` with ``g = log_decay`` broadcast over
    ``[B, T]``; gradients flow to ``log_decay`` (HypeNet keeps it fixed).

    Args:
        q, k, v: as in :func:`simple_gla`.
        log_decay: ``[H]`` per-value-head ``log(gamma_h) <= 0``, any float dtype (converted to
            fp32), e.g. from :func:`lightning_log_decay`; an array-like (a list of floats, a
            NumPy array) is converted with ``jnp.asarray``.
        scale, initial_state, output_final_state, segment_ids, chunk_size, implementation: as
            in :func:`simple_gla`.

    Returns:
        ``(o, final_state)`` as in :func:`simple_gla`.

    Raises:
        TypeError: if ``log_decay`` is not an array-like (e.g. ``None``, a string, a ragged
            list), naming it, or ``q``, ``k``, ``v`` or another array argument is not a
            ``jax.Array`` or ``numpy.ndarray`` (as in :func:`simple_gla`).
        ValueError: if ``log_decay`` is not a float array of shape ``[H]``, and in every case
            listed by :func:`simple_gla`.
    """
    for name, x in (("q", q), ("k", k), ("v", v)):  # before v.shape[2] below
        common.check_array(name, x)
    common.check_rank("q", q, ("B", "T", "HK", "K"))
    common.check_rank("v", v, ("B", "T", "H", "V"))
    if not isinstance(log_decay, jax.Array):  # a list raised AttributeError at .dtype
        try:
            log_decay = jnp.asarray(log_decay)
        except (TypeError, ValueError) as e:
            raise TypeError(f"log_decay must be an array-like of floats of shape [H], got "
                            f"{type(log_decay).__name__} ({e})") from None
    common.check_shape("log_decay", log_decay, (v.shape[2],))
    if not jnp.issubdtype(log_decay.dtype, jnp.floating):
        raise ValueError(f"log_decay must have a floating dtype, got {log_decay.dtype=}")
    g = jnp.broadcast_to(log_decay.astype(jnp.float32), v.shape[:3])  # [B, T, H]
    return _simple_gla_op(
        "lightning_attention", q, k, v, g,
        scale=scale, initial_state=initial_state, output_final_state=output_final_state,
        segment_ids=segment_ids, chunk_size=chunk_size, implementation=implementation,
    )


def _alibi_slopes(num_heads: int, max_bias: float = 8.0) -> list:
    """ALiBi head slopes (Press et al. 2022), as HypeNet builds them (spec §1.5 item 5).

    For a power of two ``n``: ``slope_h = 2^(-b (h + 1) / n)``, ``h = 0 .. n - 1``, with the
    ALiBi maximum bias ``b = max_bias`` (8 in ALiBi and HypeNet). Otherwise the standard ALiBi
    interleaving: the slopes of the largest power of two ``m < n``, followed by the
    even-indexed slopes of ``2m`` heads, truncated to ``n - m`` entries.
    """
    if num_heads & (num_heads - 1) == 0:
        return [2.0 ** (-max_bias * (h + 1) / num_heads) for h in range(num_heads)]
    closest = 2 ** math.floor(math.log2(num_heads))
    return (_alibi_slopes(closest, max_bias)
            + _alibi_slopes(2 * closest, max_bias)[0::2][: num_heads - closest])


def lightning_log_decay(
    num_heads: int,
    layer_idx: Optional[int] = None,
    num_layers: Optional[int] = None,
    *,
    max_bias: float = 8.0,
) -> jax.Array:
    """The fixed per-head log-decays ``log(gamma_h)`` of Lightning Attention.

    HypeNet (the default, ``layer_idx = num_layers = None``): spec ``hypenet-halo.md`` §1.5
    item 5 (authors' ``lightning_attn.py:22-43, 252-257``), §6 item 5 and §7 item 3::

        log(gamma_h) = -slope_h,  slope_h = 2^(-8 (h + 1) / H),  h = 0 .. H - 1

    (head 0 decays fastest; ALiBi interleaving for ``H`` not a power of two), identical for
    every layer. E.g. ``H = 16``: ``gamma_0 = exp(-2^-0.5) = 0.4931``, ``gamma_15 =
    exp(-2^-8) = 0.99610``. ``max_bias`` replaces the 8 (``slope_h = 2^(-max_bias (h + 1) / H)``;
    not in the spec: an ablation of the longest memory, whose half-life ``ln 2 / slope_{H-1}``
    is ``ln 2 * 2^max_bias`` tokens for a power-of-two ``H``: 177 at 8, 2,839 at 12).

    MiniMax-01 (``layer_idx`` and ``num_layers`` given): the spec only notes that MiniMax
    "multiplies slopes by a layer-dependent factor" (§6 item 5) without giving it. We use the
    factor of MiniMax-Text-01's modelling code as mirrored by vLLM's
    ``MiniMaxText01LinearAttention``: ``slope_h * (1 - layer_idx / (num_layers - 1) + 1e-5)``,
    or ``slope_h * (1 + 1e-5)`` when ``num_layers == 1``; there ``layer_idx`` counts all layers
    of the model. (HF ``transformers``' ``MiniMaxLightningAttention.get_slope_rate`` puts an
    extra ``+ 1e-5`` in the denominator, a relative difference below 1e-5.) This is outside the
    spec.

    Args:
        num_heads: number of (value) heads ``H >= 1``.
        layer_idx: 0-based layer index for the MiniMax schedule, or ``None`` for HypeNet.
        num_layers: total number of layers for the MiniMax schedule, or ``None`` for HypeNet.
        max_bias: ALiBi's maximum bias ``b`` (HypeNet and ALiBi: 8), a finite real > 0 small
            enough that every slope stays > 0 in fp32.

    Returns:
        fp32 ``[H]`` array of ``log(gamma_h) < 0`` (slopes computed in float64, then rounded).

    Raises:
        ValueError: if ``num_heads < 1``, only one of ``layer_idx``/``num_layers`` is given,
            ``layer_idx`` is not in ``[0, num_layers)``, or ``max_bias`` is not a finite
            real > 0 or is so large that a slope underflows to 0 in fp32.
    """
    if not isinstance(num_heads, int) or num_heads < 1:
        raise ValueError(f"num_heads must be a positive int, got {num_heads=}")
    if (layer_idx is None) != (num_layers is None):
        raise ValueError(
            f"give both layer_idx and num_layers (MiniMax) or neither (HypeNet), got "
            f"{layer_idx=}, {num_layers=}"
        )
    if (isinstance(max_bias, (bool, np.bool_)) or not isinstance(max_bias, numbers.Real)
            or not math.isfinite(float(max_bias)) or float(max_bias) <= 0):
        raise ValueError(f"max_bias must be a finite number > 0, got {max_bias!r}")
    factor = 1.0
    if layer_idx is not None:
        if not 0 <= layer_idx < num_layers:
            raise ValueError(f"layer_idx must be in [0, num_layers), got {layer_idx=}, "
                             f"{num_layers=}")
        factor = 1.0 + 1e-5 if num_layers == 1 else 1.0 - layer_idx / (num_layers - 1) + 1e-5
    slopes = np.asarray(_alibi_slopes(num_heads, float(max_bias)), np.float64) * factor
    if not np.all(slopes.astype(np.float32) > 0):
        raise ValueError(f"max_bias={float(max_bias)!r} makes a slope 0 in fp32 (no decay): "
                         f"the slowest slope is 2^-max_bias (times the MiniMax factor), so "
                         f"max_bias must stay below about 149")
    return jnp.asarray(-slopes, jnp.float32)
