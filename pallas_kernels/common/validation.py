"""Input validation, padding and implementation dispatch shared by all linear-attention ops.

Every public op in ``pallas_kernels`` validates its arguments here, so that a bad call fails at
the boundary with one ``ValueError`` that names the offending argument and its shape (or one
``TypeError`` for an argument that is not an array at all), rather than deep inside a
``lax.scan``.
"""

import logging
import math
import numbers
from typing import Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

_logged = set()  # (op, message) pairs already logged by log_once

# Names accepted by the ``implementation=`` argument of every op. ``None`` and ``"auto"`` pick the
# best available form for the backend; kernels register further names as they land.
IMPLEMENTATIONS: Tuple[str, ...] = ("auto", "chunked", "reference")


def check_array(name: str, x) -> None:
    """Checks that an op's array argument is an array: a ``jax.Array`` (tracers included) or a
    ``numpy.ndarray``.

    Like ``jax.numpy``'s own functions (``jnp.sum([1, 2])`` raises ``TypeError``), the ops take
    no Python lists or tuples: converting one element by element is slow, and a nested list of
    the wrong depth or a ragged one would surface as a shape error far from its cause. (A list
    raised ``AttributeError: 'list' object has no attribute 'shape'`` inside the checks.)

    Args:
        name: the argument's name, used in the error message.
        x: the argument as the caller passed it.

    Raises:
        TypeError: ``"q must be a jax.Array or numpy.ndarray, got list: convert it with
            jnp.asarray(q)"``.
    """
    if not isinstance(x, (jax.Array, np.ndarray)):
        raise TypeError(f"{name} must be a jax.Array or numpy.ndarray, got "
                        f"{type(x).__name__}: convert it with jnp.asarray({name})")


def check_arrays(**arrays) -> None:
    """:func:`check_array` on each keyword argument that is not ``None``, in the order given:
    the array arguments of the public chunked, associative and reference forms (the public ops
    check theirs in :func:`check_op_inputs`).

    Raises:
        TypeError: naming the first argument that is not a ``jax.Array`` or ``numpy.ndarray``
            (a list, a tuple; :func:`check_array`).
    """
    for name, x in arrays.items():
        if x is not None:
            check_array(name, x)


def check_segment_ids_dtype(segment_ids: jax.Array) -> None:
    """Raises ``ValueError`` unless ``segment_ids`` (``[B, T]`` document ids) has an integer
    dtype: ``"segment_ids must have an integer dtype, got segment_ids.dtype=float32"``."""
    dtype = jnp.result_type(segment_ids)
    if not jnp.issubdtype(dtype, jnp.integer):
        raise ValueError(f"segment_ids must have an integer dtype, got "
                         f"segment_ids.dtype={jnp.dtype(dtype).name}")


def check_shape(name: str, x: jax.Array, expected: Sequence[Optional[int]],
                axes: Optional[Sequence[str]] = None) -> None:
    """Checks that ``x`` has ``len(expected)`` dims and matches every non-None entry.

    Args:
        name: the argument's name, used in the error message.
        x: the array to check (only its static shape is read, so this costs nothing under
            ``jit``).
        expected: the expected shape; ``None`` entries match any size.
        axes: optional names of the axes, one per entry of ``expected``. With them, either
            error reads ``"<name> must be [batch, seq_len, d_model=512], got (2, 16, 513)"``
            (a fixed size shown as ``axis=size``; a wrong rank adds ``" (rank 3)"`` and reads
            ``"got shape (...)"``); without them, the rank error gives the expected sizes (``?``
            for any) and the size error the first axis that differs.

    Raises:
        ValueError: if the rank or any fixed dimension differs.
    """
    shape = tuple(jnp.shape(x))
    if axes is not None:
        if len(axes) != len(expected):
            raise ValueError(f"axes {tuple(axes)} do not match expected {tuple(expected)}")
        spec = ", ".join(a if want is None else f"{a}={want}" for a, want in zip(axes, expected))
        if len(shape) != len(expected):
            raise ValueError(f"{name} must be [{spec}] (rank {len(expected)}), got shape {shape}")
        if any(want is not None and got != want for got, want in zip(shape, expected)):
            raise ValueError(f"{name} must be [{spec}], got {shape}")
        return
    if len(shape) != len(expected):
        spec = ", ".join("?" if want is None else str(want) for want in expected)
        raise ValueError(
            f"{name} must have rank {len(expected)} ([{spec}]), got shape {shape}")
    for axis, (got, want) in enumerate(zip(shape, expected)):
        if want is not None and got != want:
            raise ValueError(
                f"{name}.shape={shape} does not match the expected shape {tuple(expected)} "
                f"(axis {axis}: got {got}, want {want})"
            )


def check_op_inputs(q, k, v, gates, initial_state, segment_ids, chunk_size, scale=None):
    """Validates the arguments every linear-attention op shares, and its gates.

    Args:
      q, k: ``[B, T, HK, K]`` floating.
      v: ``[B, T, H, V]`` floating, ``H`` a multiple of ``HK`` (GVA).
      gates: ``(name, array or None, shape)`` triples; ``shape`` may use the letters ``"B"``,
        ``"T"``, ``"H"``, ``"K"``, ``"V"`` for the sizes above. ``None`` arrays are skipped.
      initial_state: ``[B, H, K, V]`` or None.
      segment_ids: integer ``[B, T]`` or None.
      chunk_size: a positive power of two.
      scale: ``None`` or a positive finite real number (:func:`check_scale`).

    Returns:
      ``dict(B=..., T=..., HK=..., H=..., K=..., V=...)``.

    Raises:
      TypeError: naming the first array argument that is not a ``jax.Array`` or
        ``numpy.ndarray`` (a list, a tuple; :func:`check_array`).
      ValueError: naming the offending argument and its shape or dtype (also for an empty head
        or head-dim axis, ``HK``, ``K``, ``H`` or ``V`` of 0); a wrong rank names the
        layout, e.g. ``"q must be [B, T, HK, K] (rank 4), got shape (8, 16, 2)"``. When ``q.shape !=
        k.shape``, the message names the one that disagrees with the other arguments carrying
        that size (``v``, gates, ``initial_state``, ``segment_ids``), or both alike when none
        does (e.g. ``"q.shape=(2, 8, 2, 7) and k.shape=(2, 8, 2, 8) differ: ..."``).
    """
    check_arrays(q=q, k=k, v=v, **{name: x for name, x, _ in gates},
                 initial_state=initial_state, segment_ids=segment_ids)
    check_rank("q", q, ("B", "T", "HK", "K"))
    batch, seq_len, key_heads, dk = q.shape
    if seq_len < 1:
        raise ValueError(f"the time axis must hold at least one token, got {q.shape=}")
    check_rank("k", k, ("B", "T", "HK", "K"))
    check_rank("v", v, ("B", "T", "H", "V"))
    if k.shape != q.shape:
        raise ValueError(_q_k_mismatch(q, k, v, gates, initial_state, segment_ids))
    check_shape("v", v, (batch, seq_len, None, None))
    heads, dv = v.shape[2], v.shape[3]
    if 0 in (key_heads, dk, heads, dv):  # (raised ZeroDivisionError: H % HK, K ** -0.5)
        raise ValueError(f"q, k and v need at least one head and one channel per head, got "
                         f"{q.shape=} [B, T, HK, K] and {v.shape=} [B, T, H, V]")
    if heads % key_heads:
        raise ValueError(
            f"the value heads of v must be a multiple of the key heads of q and k (GVA), got "
            f"{v.shape=} with H={heads} and {q.shape=} with HK={key_heads}"
        )
    sizes = dict(B=batch, T=seq_len, HK=key_heads, H=heads, K=dk, V=dv)
    arrays = [("q", q), ("k", k), ("v", v)]
    for name, x, shape in gates:
        if x is not None:
            check_rank(name, x, tuple(shape))
            check_shape(name, x, tuple(sizes[letter] for letter in shape))
            arrays.append((name, x))
    for name, x in arrays:
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise ValueError(f"{name} must have a floating dtype, got {name}.dtype={x.dtype}")
    if initial_state is not None:
        check_rank("initial_state", initial_state, ("B", "H", "K", "V"))
        check_shape("initial_state", initial_state, (batch, heads, dk, dv))
        if not jnp.issubdtype(initial_state.dtype, jnp.floating):  # (was cast silently)
            raise ValueError(f"initial_state must have a floating dtype (the state is fp32), "
                             f"got initial_state.dtype={initial_state.dtype}")
    if segment_ids is not None:
        check_rank("segment_ids", segment_ids, ("B", "T"))
        check_shape("segment_ids", segment_ids, (batch, seq_len))
        check_segment_ids_dtype(segment_ids)
    check_chunk_size(chunk_size)
    check_scale(scale)
    return sizes


def check_rank(name: str, x: jax.Array, axes: Sequence[str]) -> None:
    """Checks that ``x`` has one dimension per entry of ``axes`` (only the static shape is read).

    Args:
        name: the argument's name, used in the error message.
        x: the array to check.
        axes: the layout's axis letters, e.g. ``("B", "T", "HK", "K")``.

    Raises:
        ValueError: ``"q must be [B, T, HK, K] (rank 4), got shape (8, 16, 2)"`` if the rank
            differs.
    """
    check_shape(name, x, (None,) * len(axes), axes=axes)


def check_scale(scale) -> None:
    """Checks an op's ``scale=`` argument: ``None`` (the op's default, ``K ** -0.5``) or a
    positive finite real number (a Python or NumPy int or float, not a bool; it is a static
    argument of the kernels, so not a JAX array).

    Raises:
        ValueError: ``"scale must be None or a positive finite number, got scale='x' (str)"``.
    """
    if scale is None:
        return
    ok = (isinstance(scale, (numbers.Real, np.number)) and not isinstance(scale, (bool, np.bool_))
          and not isinstance(scale, jax.Array))
    if ok:
        value = float(scale)
        ok = math.isfinite(value) and value > 0
    if not ok:
        raise ValueError(f"scale must be None or a positive finite number, got {scale=!r} "
                         f"({type(scale).__name__})")


def _q_k_mismatch(q, k, v, gates, initial_state, segment_ids) -> str:
    """The message for ``q.shape != k.shape`` (both rank 4), naming the odd one out.

    The other arguments that carry the first differing size (``v``, the gates, ``initial_state``
    and ``segment_ids`` for ``B``, ``T`` and ``K``; nothing carries ``HK``) decide which of q
    and k is wrong: if all of them agree with k, q is named first as the mismatch, and the other
    way round; otherwise the message names both alike.
    """
    axis = next(i for i, (a, b) in enumerate(zip(q.shape, k.shape)) if a != b)
    letter = ("B", "T", "HK", "K")[axis]
    witnesses = []  # (name, size of `letter`) from the other arguments
    layouts = [("v", v, "BTHV"), ("initial_state", initial_state, "BHKV"),
               ("segment_ids", segment_ids, "BT")]
    layouts += [(name, x, shape) for name, x, shape in gates]
    for name, x, shape in layouts:
        if x is not None and letter in tuple(shape) and jnp.ndim(x) == len(shape):
            witnesses.append((name, jnp.shape(x)[list(shape).index(letter)]))
    sizes = {size for _, size in witnesses}
    others = ", ".join(f"{name} has {size}" for name, size in witnesses)
    detail = (f"axis {axis} ({letter}): q has {q.shape[axis]}, k has {k.shape[axis]}"
              + (f", {others}" if others else ""))
    if sizes == {k.shape[axis]}:
        return (f"q.shape={q.shape} does not match k.shape={k.shape}: q must be [B, T, HK, K] "
                f"like k ({detail})")
    if sizes == {q.shape[axis]}:
        return (f"k.shape={k.shape} does not match q.shape={q.shape}: k must be [B, T, HK, K] "
                f"like q ({detail})")
    return (f"q.shape={q.shape} and k.shape={k.shape} differ: q and k must both be "
            f"[B, T, HK, K] ({detail})")


def expand_key_heads(q: jax.Array, k: jax.Array, heads: int, dtype=jnp.float32):
    """GVA/GQA: repeats ``q, k`` ``[B, T, HK, K]`` to ``[B, T, H, K]``, cast to ``dtype``.

    Value head ``h`` reads key head ``h // (H // HK)`` (FLA / torch ``repeat_interleave``).
    ``dtype=None`` keeps the input dtypes (the kernels run in the input dtype); the default fp32
    is what the pure-JAX forms compute in.
    """
    group = heads // q.shape[2]
    if dtype is not None:
        q, k = q.astype(dtype), k.astype(dtype)
    return jnp.repeat(q, group, axis=2), jnp.repeat(k, group, axis=2)  # [B, T, H, K]


def check_chunk_size(chunk_size: int) -> None:
    """Raises ``ValueError`` unless ``chunk_size`` is a positive power of two."""
    if (isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1
            or chunk_size & (chunk_size - 1)):  # (True passed as chunk_size 1)
        raise ValueError(f"chunk_size must be a positive power of two, got {chunk_size=}")


def log_once(op: str, message: str) -> None:
    """Logs ``"<op>: <message>"`` at INFO level, once per op and message (the kernel
    dispatchers' decisions, so that a training loop does not repeat them every step)."""
    if (op, message) not in _logged:
        _logged.add((op, message))
        logging.info("%s: %s", op, message)


class UnsupportedImplementationError(ValueError):
    """An explicitly named implementation (a GPU/TPU kernel, cuDNN) cannot run a call here: a
    bad option for this machine or these shapes, reported in one line by the binaries."""


def require_runnable(op: str, implementation: str, reason: Optional[str], instead: str) -> str:
    """Returns ``implementation`` when ``reason`` is ``None`` (an explicitly named kernel can
    run this call).

    Raises:
        UnsupportedImplementationError: (a ``ValueError``) ``"<op>: implementation=... cannot
            run this call: <reason>. Use implementation=<instead>."`` otherwise.
    """
    if reason is not None:
        raise UnsupportedImplementationError(
            f"{op}: implementation={implementation!r} cannot run this call: {reason}. Use "
            f"implementation={instead}.")
    return implementation


def auto_kernel_reason(reason: Optional[str], seq_len: int, chunk_size: int) -> Optional[str]:
    """Why ``"auto"`` should not pick a kernel: ``reason``, or, when there is none, that ``T`` is
    shorter than one kernel chunk (such calls, e.g. decode steps, are cheaper in the chunked
    form); ``None`` when the kernel should run."""
    if reason is None and seq_len < chunk_size:
        return f"T={seq_len} is shorter than one kernel chunk ({chunk_size})"
    return reason


def resolve_implementation(implementation: Optional[str], supported: Sequence[str],
                           op: Optional[str] = None) -> str:
    """Maps the user's ``implementation`` to a concrete form.

    Args:
        implementation: ``None``/``"auto"`` or one of ``supported``.
        supported: the concrete forms this op provides, best first.
        op: the public function's name (``"gated_delta_rule"``), which the error names.

    Returns:
        The concrete implementation name. ``None`` and ``"auto"`` resolve to ``supported[0]``.

    Raises:
        ValueError: if ``implementation`` names no form of this op. We never fall back silently.
    """
    if implementation is None or implementation == "auto":
        return supported[0]
    if implementation not in supported:
        where = f"{op}: " if op else ""
        raise ValueError(
            f"{where}implementation={implementation!r} is not available for this op; "
            f"choose one of {('auto',) + tuple(supported)}"
        )
    return implementation


def effective_chunk_size(chunk_size: int, seq_len: int) -> int:
    """The chunk length the chunked forms use: ``min(chunk_size, seq_len)``.

    A sequence shorter than one chunk runs as a single chunk of exactly ``T`` tokens, with no
    padding (a decode step, ``T == 1``, is one token). Besides saving work, this avoids padding a
    lone partial chunk, which hit an XLA GPU compiler error (``RET_CHECK`` in the MLIR kernel
    emitter, jax 0.11.2 on an H200) at ``T = 11``, ``C = 16``.
    """
    return max(1, min(chunk_size, seq_len))


def pad_time(x: Optional[jax.Array], multiple: int, value: float = 0.0) -> Optional[jax.Array]:
    """Pads axis 1 (time) of ``x`` on the right up to a multiple of ``multiple``."""
    if x is None:
        return None
    t = x.shape[1]
    pad = (-t) % multiple
    if pad == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[1] = (0, pad)
    return jnp.pad(x, widths, constant_values=value)


def l2_normalize(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    """``x * rsqrt(sum(x^2) + eps)`` over the last axis, computed in fp32, returned in ``x.dtype``.

    FLA's ``l2norm`` (``use_qk_l2norm_in_kernel``), applied to q and k of the delta-rule family
    (paper arXiv 2607.07953, Sec. 3.2: keys are L2-normalised for the delta rule's stability).
    """
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.sum(x32 * x32, axis=-1, keepdims=True) + eps)).astype(x.dtype)


# The log-decay floor of the chunked forms and kernels (natural log per token): exp(-128) is
# below fp32's smallest subnormal (exp(-103.3)), so a token at or under the floor decays the
# state to exactly 0 in fp32, as exp(g) does for any g <= -104 in the token-serial recurrence.
LOG_DECAY_FLOOR = -128.0


def floor_log_decay(g: jax.Array) -> jax.Array:
    """``max(g, LOG_DECAY_FLOOR)``: the log-decay the chunked forms and kernels are given.

    The chunked forms take in-chunk cumulative sums ``G`` of ``g`` and use differences
    ``G_i - G_j``. A token with ``g = -inf`` (decay 0, a hard reset) turns those into
    ``-inf - (-inf) = NaN``, and one with a huge finite ``g`` (``-1e8``) leaves the later
    ``G`` values equal in fp32, so their differences lose every small gate after it (measured
    2026-12-03, bf16, T 256, K = V = 64: the Triton GDN and simple-GLA kernels returned NaN
    for ``-inf`` and errors of 0.12 and 0.26 for ``-1e8``; the KDA chunked form and kernel NaN
    and 0.046; the ``lax.scan`` references were exact). Clamping at the floor changes no
    decay factor in fp32 (``exp`` of either is 0) and keeps ``|G| <= 64 x 128`` in a chunk of 64,
    where the forms were measured exact (errors at the bf16 floor for events down to -1e4).
    Gradients: 0 with respect to a ``g`` under the floor, as the fp32 value of ``d exp(g)/dg``.

    Args:
        g: log-decay (natural log, <= 0), any shape: ``[B, T, H]`` scalar per head or
            ``[B, T, H, K]`` per key channel; float (fp32 by the ops' contract). NaN stays NaN.

    Returns:
        ``g`` with every element below ``LOG_DECAY_FLOOR`` raised to it, same shape and dtype.
    """
    return jnp.maximum(g, jnp.asarray(LOG_DECAY_FLOOR, g.dtype))


def floor_log_decay_grad(g: jax.Array, dg: jax.Array) -> jax.Array:
    """``dg`` taken through :func:`floor_log_decay`, for kernels that floor ``g`` themselves.

    The values ``jax.vjp(floor_log_decay, g)`` gives: ``dg`` where ``g`` is above
    ``LOG_DECAY_FLOOR``, ``dg / 2`` at it (``jnp.maximum``'s tie rule), 0 below it and for a NaN
    ``g``. One elementwise expression: XLA fuses it as one pass, and a Pallas kernel (K2 of
    ``channelwise_grad_mosaic_gpu``) applies it to its register tiles.

    Args:
        g: the log-decay before the floor, any float dtype and shape.
        dg: the cotangent of the floored log-decay, ``g``'s shape (fp32 by the ops' contract).

    Returns:
        ``dg``'s shape and dtype.
    """
    floor = jnp.asarray(LOG_DECAY_FLOOR, g.dtype)
    return jnp.where(g > floor, dg, jnp.where(g == floor, 0.5 * dg, 0.0))


def document_index(segment_ids: jax.Array) -> jax.Array:
    """Turns segment ids into a monotone per-row document index.

    A new document starts wherever ``segment_ids[:, t] != segment_ids[:, t - 1]``; the returned
    index counts those starts, so two runs that reuse an id (``0, 1, 0``) stay distinct.

    Args:
        segment_ids: int array ``[B, T]``.

    Returns:
        int32 array ``[B, T]``: 0 for the first document of each row, then 1, 2, ...
    """
    starts = jnp.concatenate(
        [
            jnp.zeros_like(segment_ids[:, :1], dtype=jnp.int32),
            (segment_ids[:, 1:] != segment_ids[:, :-1]).astype(jnp.int32),
        ],
        axis=1,
    )
    return jnp.cumsum(starts, axis=1, dtype=jnp.int32)
