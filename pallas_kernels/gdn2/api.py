"""Public Gated DeltaNet-2 (GDN-2) op: validation, GVA expansion and dispatch.

Paper "Linear Attention Architectures" (arXiv 2607.07953), Eqs. 21-24 (spec §2.6). With the FLA
state layout S in R^{K x V}, a per-key-channel log-decay g_t in R^K, an erase gate b_t in
(0,1)^K and a write gate w_t in (0,1)^V (no scalar beta)::

    S_t = (I - k_t (b_t * k_t)^T) Diag(exp g_t) S_{t-1} + k_t (w_t * v_t)^T,  o_t = scale S_t^T q_t,

equivalently S~_t = Diag(exp g_t) S_{t-1}, u_t = w_t * v_t - S~_t^T (b_t * k_t),
S_t = S~_t + k_t u_t^T. The read-out includes token t. KDA is the special case
``b = beta 1_K``, ``w = beta 1_V``.

Implementations (``implementation=``):

* ``"chunked"`` (default for ``None``/``"auto"`` where no kernel applies): the chunkwise form in
  ``chunked.py``;
* ``"pallas_tpu"`` (default for ``None``/``"auto"`` on a TPU where supported): the Pallas TPU
  (Mosaic) kernels in ``kernel_tpu.py``, forward and backward; on other backends they run in
  Pallas TPU interpret mode (slow; tests);
* ``"pallas"``: the chunked Pallas GPU (Triton) kernels in ``common/channelwise_gpu.py``
  (entered through ``kernel_gpu.py``), forward and backward (``custom_vjp``);
  ``"pallas_interpret"`` runs them in Pallas interpret mode on any backend (slow; tests).
  ``"auto"`` picks them on a GPU (switch: ``pallas_kernels.common.channelwise_gpu.AUTO_SELECT``);
* ``"reference"``: the token-serial ``lax.scan`` in ``reference.py`` (ground truth, slow);
* ``"associative_scan"``: the exact ``O(T K^3)`` parallel form in ``associative.py``.

Example::

    import jax
    import jax.numpy as jnp
    from pallas_kernels import gdn2 as gdn2_ops

    B, T, HK, H, K, V = 2, 100, 2, 4, 32, 64
    kq, kk, kv, kg, kb, kw = jax.random.split(jax.random.key(0), 6)
    l2 = lambda x: x / jnp.linalg.norm(x, axis=-1, keepdims=True)
    q = l2(jax.random.normal(kq, (B, T, HK, K)))
    k = l2(jax.random.normal(kk, (B, T, HK, K)))
    v = jax.random.normal(kv, (B, T, H, V), jnp.bfloat16)
    g = -jax.nn.softplus(jax.random.normal(kg, (B, T, H, K)))  # per-channel log-decay <= 0
    b = jax.nn.sigmoid(jax.random.normal(kb, (B, T, H, K)))  # erase gate
    w = jax.nn.sigmoid(jax.random.normal(kw, (B, T, H, V)))  # write gate
    o, state = gdn2_ops.gdn2(q, k, v, g, b, w, output_final_state=True)
    # o: [2, 100, 4, 64] bf16, state: [2, 4, 32, 64] fp32. Continue from `state`:
    o2, _ = gdn2_ops.gdn2(q, k, v, g, b, w, initial_state=state)
"""

import functools
from typing import Optional, Tuple, Union

import jax
import jax.numpy as jnp

from pallas_kernels import common
from pallas_kernels.common import channelwise_gpu, pallas_gpu, pallas_tpu
from pallas_kernels.gdn2 import associative
from pallas_kernels.gdn2 import chunked
from pallas_kernels.gdn2 import kernel_tpu
from pallas_kernels.gdn2 import kernel_gpu
from pallas_kernels.gdn2 import reference

# Concrete forms of this op, best first: None/"auto" resolve to the first entry.
_IMPLEMENTATIONS = {
    "chunked": chunked.gdn2_chunked,
    "reference": reference.gdn2_reference,
    "associative_scan": associative.gdn2_associative,
}

Output = Union[
    Tuple[jax.Array, Optional[jax.Array]],
    Tuple[jax.Array, Optional[jax.Array], jax.Array],
]


def _validate(q, k, v, g, b, w, initial_state, segment_ids, chunk_size, scale=None) -> None:
    """Checks ranks, shapes and dtypes at the public boundary; raises ``ValueError``."""
    gates = (("g", g, "BTHK"), ("b", b, "BTHK"), ("w", w, "BTHV"))
    common.check_op_inputs(q, k, v, gates, initial_state, segment_ids, chunk_size,
                           scale=scale)


@functools.partial(jax.jit, static_argnames=("implementation", "chunk_size"))
def _forward(q, k, v, g, b, w, scale, initial_state, segment_ids, *, implementation, chunk_size):
    """Expands GVA heads, runs the chosen form in fp32 and casts o, u back to ``v.dtype``."""
    f32 = jnp.float32
    q, k = common.expand_key_heads(q, k, v.shape[2])  # fp32 [B, T, H, K]
    kwargs = dict(scale=scale, initial_state=initial_state, segment_ids=segment_ids)
    if implementation == "chunked":
        kwargs["chunk_size"] = chunk_size
    o, final_state, u = _IMPLEMENTATIONS[implementation](
        q, k, v.astype(f32), g.astype(f32), b.astype(f32), w.astype(f32), **kwargs
    )
    return o.astype(v.dtype), final_state, u.astype(v.dtype)


@functools.partial(jax.jit, static_argnames=("scale", "interpret", "return_residual"))
def _forward_pallas(q, k, v, g, b, w, initial_state, segment_ids, *, scale, interpret,
                    return_residual):
    """The Pallas GPU kernels (``kernel_gpu.py``) in the input dtype; GVA heads expanded."""
    q, k = common.expand_key_heads(q, k, v.shape[2], dtype=None)
    return kernel_gpu.gdn2_pallas(
        q, k, v, g, b, w, scale=scale, initial_state=initial_state, segment_ids=segment_ids,
        return_residual=return_residual, interpret=interpret,
    )


@functools.partial(jax.jit, static_argnames=("scale", "chunk_size"))
def _forward_tpu(q, k, v, g, b, w, initial_state, segment_ids, *, scale, chunk_size):
    """The Pallas TPU kernels (``kernel_tpu.py``); GVA heads expanded here."""
    q, k = common.expand_key_heads(q, k, v.shape[2], dtype=None)
    return kernel_tpu.gdn2_tpu(
        q, k, v, g, b, w, scale=scale, initial_state=initial_state,
        segment_ids=segment_ids, chunk_size=chunk_size,
    )


def gdn2(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    b: jax.Array,
    w: jax.Array,
    *,
    scale: Optional[float] = None,
    initial_state: Optional[jax.Array] = None,
    output_final_state: bool = False,
    segment_ids: Optional[jax.Array] = None,
    chunk_size: int = 64,
    implementation: Optional[str] = None,
    return_residual: bool = False,
) -> Output:
    """Gated DeltaNet-2 token mixing (paper arXiv 2607.07953, Eqs. 21-24).

    Computes, per batch row and value head, with the state S_t in R^{K x V} (FLA layout)::

        S~_t = Diag(exp g_t) S_{t-1}                   (per-key-channel decay)
        u_t  = w_t * v_t - S~_t^T (b_t * k_t)          (erase-gated read, write-gated value)
        S_t  = S~_t + k_t u_t^T    ( = (I - k_t (b_t * k_t)^T) Diag(exp g_t) S_{t-1}
                                       + k_t (w_t * v_t)^T ; the write uses k, not b * k )
        o_t  = scale * S_t^T q_t   (inclusive of token t)

    All state math, gate cumsums and reductions run in fp32 with ``Precision.HIGHEST`` whatever
    the input dtype; ``o`` and ``u`` are cast back to ``v.dtype``. q and k are used as given:
    L2-normalise them beforehand. Gates are inputs (the reference GDN-2 kernel is called with
    ``use_gate_in_kernel=False``). Gradients w.r.t. every array argument (including
    ``initial_state``) come from JAX autodiff of the chosen form.

    GVA/GQA: when ``H > HK``, value head ``h`` uses key/query head ``h // (H // HK)`` (q and k
    are ``jnp.repeat``-ed along the head axis). ``g``, ``b`` and ``w`` are per value head.

    Args:
        q: queries ``[B, T, HK, K]``, any float dtype.
        k: keys ``[B, T, HK, K]``, any float dtype.
        v: values ``[B, T, H, V]``, any float dtype; ``H`` must be a multiple of ``HK``.
        g: per-key-channel log-decay ``[B, T, H, K]`` in natural-log units (the decay of key
            channel c is ``exp(g_t[c])``, so ``g <= 0``), any float dtype (converted to fp32).
            ``-inf`` (a hard reset) is allowed: every implementation but ``"reference"``
            raises values under ``common.LOG_DECAY_FLOOR`` (-128) to it, a decay of 0 in
            fp32 either way (:func:`pallas_kernels.common.floor_log_decay`).
        b: erase gate ``[B, T, H, K]`` in ``(0, 1)`` (applied to k on the read side only).
        w: write gate ``[B, T, H, V]`` in ``(0, 1)`` (applied to v).
        scale: read-out scale; ``None`` means ``K ** -0.5``.
        initial_state: ``[B, H, K, V]`` state before the first token (fp32 recommended), or
            ``None`` for zeros. With ``segment_ids`` it applies to the first document of each
            row only.
        output_final_state: whether to return the state after the last token.
        segment_ids: optional integer ``[B, T]`` for packed rows. A new document starts wherever
            ``segment_ids[:, t] != segment_ids[:, t - 1]``, and the state is reset to zero there.
        chunk_size: chunk length C of the chunked form, a power of two (64 matches FLA). It is
            clipped to ``T`` when ``T`` is shorter (one unpadded chunk); other forms ignore it.
        implementation: ``None``/``"auto"``, ``"pallas"``, ``"pallas_interpret"``,
            ``"pallas_tpu"``, ``"chunked"``, ``"reference"`` or ``"associative_scan"``.
            ``"auto"`` runs the Pallas TPU kernels on a TPU when K and V are 64 or 128, the
            chunk size is 64 or 128 and ``T`` fills a chunk, the Pallas GPU kernels on a GPU
            under the same conditions (chunk size 64; ``common.channelwise_gpu.AUTO_SELECT``),
            and the chunked form otherwise.
            ``"pallas"`` runs the Pallas GPU kernels (K, V in {64, 128}, chunk size 64);
            ``"pallas_interpret"`` runs them in Pallas interpret mode anywhere; ``"pallas_tpu"``
            runs the TPU kernels, in TPU interpret mode off a TPU.
        return_residual: whether to also return the per-token residuals ``u``.

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
            ``"pallas_interpret"`` or ``"pallas_tpu"`` that cannot run the call (no GPU for
            ``"pallas"``, head dims other than 64/128, another chunk size), with the reason.
    """
    _validate(q, k, v, g, b, w, initial_state, segment_ids, chunk_size, scale=scale)
    impl = pallas_tpu.choose_implementation(
        "gdn2", implementation, tuple(_IMPLEMENTATIONS), (q, k, v), (q.shape[-1], v.shape[-1]),
        chunk_size, q.shape[1],
        fallback=channelwise_gpu.choose_implementation,
    )
    if scale is None:
        scale = q.shape[-1] ** -0.5
    # The token-serial ground truth takes g as is; the Pallas GPU kernels floor it themselves
    # (in their gamma kernel: no XLA pass over g, MOSAIC_GPU.md Sec. 47.4).
    if impl != "reference" and impl not in pallas_gpu.PALLAS_IMPLEMENTATIONS:
        g = common.floor_log_decay(g)
    if impl == "pallas_tpu":
        o, final_state, u = _forward_tpu(q, k, v, g, b, w, initial_state, segment_ids,
                                         scale=float(scale), chunk_size=chunk_size)
        final_state = final_state if output_final_state else None
        return (o, final_state, u) if return_residual else (o, final_state)
    if impl in pallas_gpu.PALLAS_IMPLEMENTATIONS:
        o, final_state, u = _forward_pallas(
            q, k, v, g, b, w, initial_state, segment_ids, scale=float(scale),
            interpret=impl == "pallas_interpret", return_residual=return_residual,
        )
        final_state = final_state if output_final_state else None
        return (o, final_state, u) if return_residual else (o, final_state)
    o, final_state, u = _forward(
        q, k, v, g, b, w, scale, initial_state, segment_ids,
        implementation=impl, chunk_size=chunk_size,
    )
    if not output_final_state:
        final_state = None
    if return_residual:
        return o, final_state, u
    return o, final_state
