"""Public Gated DeltaNet and DeltaNet ops: validation, GVA expansion and dispatch.

Paper "Linear Attention Architectures" (arXiv 2607.07953), Sec. 3.2: DeltaNet is Eq. 14 and Gated
DeltaNet Eqs. 15-17. With the FLA state layout S in R^{K x V}:

    S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,    o_t = scale * S_t^T q_t,

equivalently u_t = beta_t (v_t - exp(g_t) S_{t-1}^T k_t) and S_t = exp(g_t) S_{t-1} + k_t u_t^T.
DeltaNet is g == 0. The read-out includes token t.

Implementations (``implementation=``):

* ``"mosaic_gpu"``: the Pallas Mosaic GPU kernels for Hopper and newer (wgmma, TMA;
  :func:`pallas_kernels.gated_delta_rule.mosaic_vjp.gated_delta_rule_mosaic`), forward and
  backward, GVA without expanding ``q, k``; ``"mosaic_gpu_interpret"`` runs them in Mosaic GPU
  interpret mode (tests). ``"auto"`` picks them for ``gated_delta_rule`` where they can run
  (since 2026-12-06: 1.46-1.60x the Triton kernels' fwd+bwd speed at S1, S2, P1 on an H100),
  not yet for ``delta_rule`` (``mosaic_gpu.AUTO_OFF`` says why, logged once):
  :func:`pallas_kernels.common.mosaic_gpu.choose_implementation` decides;
* ``"pallas"`` (default for ``None``/``"auto"`` on a GPU where supported): the chunked Pallas
  kernels in ``kernel_gpu.py``, forward and backward; ``"pallas_interpret"`` runs them in Pallas
  interpret mode on any backend;
* ``"pallas_tpu"`` (default for ``None``/``"auto"`` on a TPU where supported): the Pallas TPU
  (Mosaic) kernels in ``kernel_tpu.py``, forward and backward; on other backends they run in
  Pallas TPU interpret mode (slow; tests);
* ``"chunked"`` (the ``"auto"`` choice elsewhere): the chunkwise WY/UT form in ``chunked.py``;
* ``"reference"``: the token-serial ``lax.scan`` in ``reference.py`` (ground truth, slow);
* ``"associative_scan"``: the exact parallel scan over affine state maps in ``associative.py``
  (``O(T K^3)`` work; for checking and composing states).

Example::

    import jax
    import jax.numpy as jnp
    from pallas_kernels import gated_delta_rule as gdr

    B, T, HK, H, K, V = 2, 100, 2, 4, 32, 64
    kq, kk, kv, kg, kb = jax.random.split(jax.random.key(0), 5)
    l2 = lambda x: x / jnp.linalg.norm(x, axis=-1, keepdims=True)
    q = l2(jax.random.normal(kq, (B, T, HK, K)))
    k = l2(jax.random.normal(kk, (B, T, HK, K)))
    v = jax.random.normal(kv, (B, T, H, V), jnp.bfloat16)
    g = -jax.nn.softplus(jax.random.normal(kg, (B, T, H)))  # log-decay <= 0
    beta = jax.nn.sigmoid(jax.random.normal(kb, (B, T, H)))
    o, state = gdr.gated_delta_rule(q, k, v, g, beta, output_final_state=True)
    # o: [2, 100, 4, 64] bf16, state: [2, 4, 32, 64] fp32. Continue from `state`:
    o2, _ = gdr.gated_delta_rule(q, k, v, g, beta, initial_state=state)
    o_dn, _ = gdr.delta_rule(q, k, v, beta)  # DeltaNet, no decay
"""

import functools
from typing import Optional, Tuple, Union

import jax
import jax.numpy as jnp

from pallas_kernels import common
from pallas_kernels.common import mosaic_gpu, pallas_gpu, pallas_tpu
from pallas_kernels.gated_delta_rule import associative
from pallas_kernels.gated_delta_rule import chunked
from pallas_kernels.gated_delta_rule import kernel_gpu, kernel_tpu
from pallas_kernels.gated_delta_rule import mosaic_vjp
from pallas_kernels.gated_delta_rule import reference

# Concrete forms of this op, best first: None/"auto" resolve to the first entry.
_IMPLEMENTATIONS = {
    "chunked": chunked.gated_delta_rule_chunked,
    "reference": reference.gated_delta_rule_reference,
    "associative_scan": associative.gated_delta_rule_associative,
}

Output = Union[
    Tuple[jax.Array, Optional[jax.Array]],
    Tuple[jax.Array, Optional[jax.Array], jax.Array],
]


def _validate(q, k, v, g, beta, initial_state, segment_ids, chunk_size, scale=None) -> None:
    """Checks ranks, shapes and dtypes at the public boundary; raises ``ValueError``."""
    gates = (("g", g, "BTH"), ("beta", beta, "BTH"))
    common.check_op_inputs(q, k, v, gates, initial_state, segment_ids, chunk_size,
                           scale=scale)


@functools.partial(jax.jit, static_argnames=("implementation", "chunk_size"))
def _forward(q, k, v, g, beta, scale, initial_state, segment_ids, *, implementation, chunk_size):
    """Expands GVA heads, runs the chosen form in fp32 and casts o, u back to ``v.dtype``.

    ``chunk_size`` is the effective chunk size for ``"chunked"`` and ``None`` otherwise.
    """
    f32 = jnp.float32
    q, k = common.expand_key_heads(q, k, v.shape[2])  # fp32 [B, T, H, K]
    g = None if g is None else g.astype(f32)
    kwargs = dict(scale=scale, initial_state=initial_state, segment_ids=segment_ids)
    if implementation == "chunked":
        kwargs["chunk_size"] = chunk_size
    o, final_state, u = _IMPLEMENTATIONS[implementation](
        q, k, v.astype(f32), g, beta.astype(f32), **kwargs
    )
    return o.astype(v.dtype), final_state, u.astype(v.dtype)


@functools.partial(jax.jit, static_argnames=("scale", "interpret", "return_residual"))
def _forward_pallas(q, k, v, g, beta, initial_state, segment_ids, *, scale, interpret,
                    return_residual):
    """The Pallas kernels (``kernel_gpu.py``) in the input dtype; GVA heads expanded here."""
    q, k = common.expand_key_heads(q, k, v.shape[2], dtype=None)
    o, final_state, u = kernel_gpu.scalar_decay_pallas(
        q, k, v, g, beta, scale=scale, initial_state=initial_state, segment_ids=segment_ids,
        return_residual=return_residual, interpret=interpret,
    )
    return o.astype(v.dtype), final_state, None if u is None else u.astype(v.dtype)


@functools.partial(jax.jit, static_argnames=("scale", "chunk_size"))
def _forward_tpu(q, k, v, g, beta, initial_state, segment_ids, *, scale, chunk_size):
    """The Pallas TPU kernels (``kernel_tpu.py``); GVA heads expanded here."""
    q, k = common.expand_key_heads(q, k, v.shape[2], dtype=None)
    return kernel_tpu.scalar_decay_tpu(
        q, k, v, g, beta, scale=scale, initial_state=initial_state, segment_ids=segment_ids,
        chunk_size=chunk_size,
    )


def gated_delta_rule(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: Optional[jax.Array],
    beta: jax.Array,
    *,
    scale: Optional[float] = None,
    initial_state: Optional[jax.Array] = None,
    output_final_state: bool = False,
    segment_ids: Optional[jax.Array] = None,
    chunk_size: int = 64,
    implementation: Optional[str] = None,
    return_residual: bool = False,
    use_qk_l2norm: bool = False,
) -> Output:
    """Gated DeltaNet token mixing (paper arXiv 2607.07953, Sec. 3.2, Eqs. 15-17).

    Computes, per batch row and value head, with the state S_t in R^{K x V} (FLA layout)::

        u_t = beta_t (v_t - exp(g_t) S_{t-1}^T k_t)
        S_t = exp(g_t) S_{t-1} + k_t u_t^T   ( = exp(g_t)(I - beta_t k_t k_t^T) S_{t-1}
                                                 + beta_t k_t v_t^T )
        o_t = scale * S_t^T q_t              (inclusive of token t)

    All state math, gate cumsums and reductions run in fp32 whatever the input dtype (the
    Pallas kernels run their large products on bf16 tensor cores with fp32 accumulation when
    the inputs are bf16); ``o`` and ``u`` are cast back to ``v.dtype``. q and k are used as
    given (L2-normalise them beforehand, as the Flax module does) unless ``use_qk_l2norm``.
    Gradients w.r.t. every array argument (including ``initial_state``) come from the kernels'
    custom VJP (``"pallas"``) or JAX autodiff of the chosen form.

    GVA/GQA: when ``H > HK``, value head ``h`` uses key/query head ``h // (H // HK)`` (q and k
    are ``jnp.repeat``-ed along the head axis, like FLA's ``repeat_interleave``).

    Args:
        q: queries ``[B, T, HK, K]``, any float dtype.
        k: keys ``[B, T, HK, K]``, any float dtype.
        v: values ``[B, T, H, V]``, any float dtype; ``H`` must be a multiple of ``HK``.
        g: per-token log-decay ``[B, T, H]`` in natural-log units (the decay is
            ``alpha_t = exp(g_t)``, so ``g <= 0``), any float dtype (converted to fp32), or
            ``None`` for no decay (DeltaNet).
            ``-inf`` (a hard reset) is allowed: every implementation but ``"reference"``
            raises values under ``common.LOG_DECAY_FLOOR`` (-128) to it, a decay of 0 in
            fp32 either way (:func:`pallas_kernels.common.floor_log_decay`).
        beta: write strengths ``[B, T, H]`` in ``(0, 1)``.
        scale: read-out scale; ``None`` means ``K ** -0.5``.
        initial_state: ``[B, H, K, V]`` state before the first token (fp32 recommended), or
            ``None`` for zeros. With ``segment_ids`` it applies to the first document of each
            row only.
        output_final_state: whether to return the state after the last token.
        segment_ids: optional integer ``[B, T]`` for packed rows. A new document starts wherever
            ``segment_ids[:, t] != segment_ids[:, t - 1]``, and the state is reset to zero there.
        chunk_size: chunk length C of the chunked form, a power of two (64 matches FLA). It is
            clipped to ``T`` when ``T`` is shorter (one unpadded chunk).
        implementation: ``None``/``"auto"``, ``"mosaic_gpu"``, ``"mosaic_gpu_interpret"``,
            ``"pallas"``, ``"pallas_interpret"``, ``"pallas_tpu"``, ``"chunked"``,
            ``"reference"`` or ``"associative_scan"``. ``"mosaic_gpu"`` runs the Mosaic GPU
            kernels (compute capability 9.x (Hopper), ``q, k, v`` one 16-bit dtype, K and V 64
            or 128, chunk size 64); ``"auto"`` picks them for ``gated_delta_rule`` where they
            can run, not yet for ``delta_rule`` (module docstring). Otherwise ``"auto"``
            runs the Pallas GPU kernels (``kernel_gpu.py``) on a GPU when K and V are 64 or
            128, the chunk size is 64 and ``T >= 64``; on a TPU it runs the Pallas TPU
            kernels (``kernel_tpu.py``) when K and V are 64 or 128, the chunk size is 64 or 128
            and ``T`` fills a chunk; the chunked form otherwise (logging why, once).
            ``"pallas_interpret"`` runs the GPU kernels in Pallas interpret mode anywhere;
            ``"pallas_tpu"`` runs the TPU kernels, in TPU interpret mode off a TPU.
        return_residual: whether to also return the per-token residuals ``u`` (FLA's
            ``v_new``), which cross-layer routing consumes.
        use_qk_l2norm: L2-normalise q and k over the head dim first (in fp32, eps 1e-6, as
            FLA's ``use_qk_l2norm_in_kernel``); gradients flow through the normalisation.

    Returns:
        ``(o, final_state)``, or ``(o, final_state, u)`` if ``return_residual``:
        ``o`` ``[B, T, H, V]`` in ``v.dtype``; ``final_state`` ``[B, H, K, V]`` fp32 if
        ``output_final_state`` else ``None``; ``u`` ``[B, T, H, V]`` in ``v.dtype``.

    Raises:
        TypeError: naming an array argument that is not a ``jax.Array`` or
            ``numpy.ndarray`` (a list, a tuple: convert it with ``jnp.asarray``).
        ValueError: on a wrong rank or shape (naming the argument), ``H % HK != 0``, ``T == 0``,
            non-float inputs, non-integer ``segment_ids``, a ``chunk_size`` that is not a power
            of two, an unknown ``implementation``, or an explicit ``"pallas"``,
            ``"pallas_tpu"`` or ``"mosaic_gpu"`` that cannot run the call (no GPU, no Hopper
            GPU, head dims other than 64/128, another chunk size, inputs not one 16-bit
            dtype), with the reason.
    """
    return _delta_rule_op(
        "gated_delta_rule", q, k, v, g, beta,
        scale=scale, initial_state=initial_state, output_final_state=output_final_state,
        segment_ids=segment_ids, chunk_size=chunk_size, implementation=implementation,
        return_residual=return_residual, use_qk_l2norm=use_qk_l2norm,
    )


def _delta_rule_op(op, q, k, v, g, beta, *, scale, initial_state, output_final_state,
                   segment_ids, chunk_size, implementation, return_residual,
                   use_qk_l2norm) -> Output:
    """:func:`gated_delta_rule` (and :func:`delta_rule`, ``g=None``); ``op`` is the public
    function's name, which the dispatch's errors and log lines name
    (``"delta_rule: implementation='mosaic_gpu' cannot run this call: ..."``)."""
    _validate(q, k, v, g, beta, initial_state, segment_ids, chunk_size, scale=scale)
    if use_qk_l2norm:
        q, k = common.l2_normalize(q), common.l2_normalize(k)
    batch, seq_len, _, dk = q.shape
    heads, dv = v.shape[2:]
    # g=None is DeltaNet whichever function was called: its own AUTO_OFF entry decides "auto"
    impl = pallas_tpu.choose_implementation(
        op, implementation, tuple(_IMPLEMENTATIONS), (q, k, v), (dk, dv),
        chunk_size, seq_len, fallback=functools.partial(
            mosaic_gpu.choose_implementation,
            auto_off_key="delta_rule" if g is None else None),
    )
    if scale is None:
        scale = dk ** -0.5
    if impl != "reference" and g is not None:  # the token-serial ground truth takes g as is
        g = common.floor_log_decay(g)
    if impl in mosaic_gpu.MOSAIC_IMPLEMENTATIONS:
        return mosaic_vjp.gated_delta_rule_mosaic(  # GVA heads read in-kernel, not expanded
            q, k, v, g, beta, scale=float(scale), initial_state=initial_state,
            segment_ids=segment_ids, output_final_state=output_final_state,
            interpret=impl == "mosaic_gpu_interpret", return_residual=return_residual)
    if impl == "pallas_tpu":
        o, final_state, u = _forward_tpu(q, k, v, g, beta, initial_state, segment_ids,
                                         scale=float(scale), chunk_size=chunk_size)
        final_state = final_state if output_final_state else None
        return (o, final_state, u) if return_residual else (o, final_state)
    if impl in pallas_gpu.PALLAS_IMPLEMENTATIONS:
        o, final_state, u = _forward_pallas(
            q, k, v, g, beta, initial_state, segment_ids, scale=float(scale),
            interpret=impl == "pallas_interpret", return_residual=return_residual,
        )
        final_state = final_state if output_final_state else None
        return (o, final_state, u) if return_residual else (o, final_state)
    if initial_state is None:
        # Zeros rather than a None branch: one compiled program serves both cases.
        initial_state = jnp.zeros((batch, heads, dk, dv), jnp.float32)
    # Normalise the static chunk size so that equivalent calls share one compiled program.
    chunk = common.effective_chunk_size(chunk_size, seq_len) if impl == "chunked" else None
    o, final_state, u = _forward(
        q, k, v, g, beta, scale, initial_state, segment_ids,
        implementation=impl, chunk_size=chunk,
    )
    if not output_final_state:
        final_state = None
    if return_residual:
        return o, final_state, u
    return o, final_state


def delta_rule(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    beta: jax.Array,
    *,
    scale: Optional[float] = None,
    initial_state: Optional[jax.Array] = None,
    output_final_state: bool = False,
    segment_ids: Optional[jax.Array] = None,
    chunk_size: int = 64,
    implementation: Optional[str] = None,
    return_residual: bool = False,
    use_qk_l2norm: bool = False,
) -> Output:
    """DeltaNet token mixing (paper arXiv 2607.07953, Sec. 3.2, Eq. 14): no decay.

    ``S_t = (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T``, ``o_t = scale * S_t^T q_t``,
    with residual ``u_t = beta_t (v_t - S_{t-1}^T k_t)``. This is :func:`gated_delta_rule` with
    ``g=None``: the arguments, shapes, dtypes, returns and errors are the same (the errors and
    the dispatch's log lines name ``delta_rule``).
    """
    return _delta_rule_op(
        "delta_rule", q, k, v, None, beta,
        scale=scale, initial_state=initial_state, output_final_state=output_final_state,
        segment_ids=segment_ids, chunk_size=chunk_size, implementation=implementation,
        return_residual=return_residual, use_qk_l2norm=use_qk_l2norm,
    )
