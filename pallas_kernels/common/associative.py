"""Exact parallel (associative-scan) form of any linear-attention recurrence with affine steps.

Every delta-rule mixer in this package updates its state ``S_t in R^{K x V}`` (FLA layout) by an
affine map of the previous state::

    S_t = A_t S_{t-1} + B_t,        A_t in R^{K x K},  B_t in R^{K x V}.

Affine maps compose associatively. Writing a step as the pair ``(A, B)``, applying
``(A1, B1)`` and then ``(A2, B2)`` is the single step::

    (A2, B2) o (A1, B1) = (A2 A1, A2 B1 + B2),

so all states follow from ``jax.lax.associative_scan`` in ``O(log T)`` depth and ``O(T K^3)``
work (against ``O(T K V)`` for the serial scan). This is exact (no chunk approximation): it is
the form used to check the chunked kernels, and the building block for context parallelism and
chunk-state passing, where each shard or chunk contributes its composed ``(A, B)`` pair.

Packed rows: a document start resets the state to zero, which is the step with ``A_t = 0``; the
composition rule then drops everything before it.
"""

from typing import Optional, Tuple

import jax
import jax.numpy as jnp

from pallas_kernels.common import validation

_HIGHEST = jax.lax.Precision.HIGHEST


def document_starts(segment_ids: jax.Array) -> jax.Array:
    """Marks the tokens where a new document starts, other than the first token of each row.

    These are the tokens before which the recurrent state resets to zero; the first token of a
    row is never marked, because ``initial_state`` applies to the first document.

    Args:
        segment_ids: int array ``[B, T]``. A new document starts wherever
            ``segment_ids[:, t] != segment_ids[:, t - 1]``.

    Returns:
        bool array ``[B, T]``, ``False`` at ``t = 0``.
    """
    doc = validation.document_index(segment_ids)  # [B, T]
    first = jnp.zeros_like(doc[:, :1], dtype=bool)
    return jnp.concatenate([first, doc[:, 1:] != doc[:, :-1]], axis=1)


def _compose(earlier: Tuple[jax.Array, jax.Array], later: Tuple[jax.Array, jax.Array]):
    """Returns ``later o earlier`` = ``(A2 A1, A2 B1 + B2)`` for batched affine steps."""
    a1, b1 = earlier
    a2, b2 = later
    a = jnp.einsum("...ij,...jk->...ik", a2, a1, precision=_HIGHEST)
    b = jnp.einsum("...ij,...jv->...iv", a2, b1, precision=_HIGHEST) + b2
    return a, b


def affine_associative_scan(
    A: jax.Array,  # noqa: N803 (matrix names follow the math)
    Bm: jax.Array,  # noqa: N803
    initial_state: Optional[jax.Array] = None,
    reset: Optional[jax.Array] = None,
) -> jax.Array:
    """Computes every state of ``S_t = A_t S_{t-1} + B_t`` with a parallel associative scan.

    The steps are composed with the exact rule ``(A2, B2) o (A1, B1) = (A2 A1, A2 B1 + B2)``
    (module docstring) by ``jax.lax.associative_scan`` along time. All math is fp32 with
    ``Precision.HIGHEST`` whatever the input dtypes. Gradients come from JAX autodiff.

    Args:
        A: state transition matrices ``[B, T, H, K, K]``, any float dtype, acting on the key
            axis of the state (``(A_t S)[i, v] = sum_j A_t[i, j] S[j, v]``).
        Bm: state inputs ``[B, T, H, K, V]``, any float dtype.
        initial_state: ``S_{-1}``, ``[B, H, K, V]``, or ``None`` for zeros.
        reset: optional bool ``[B, T]``. Where true, ``A_t`` is replaced by zero, so that
            ``S_t = B_t`` forgets everything before token ``t`` (a document start, see
            :func:`document_starts`). ``initial_state`` therefore only reaches the tokens before
            the first reset of each row.

    Returns:
        fp32 ``[B, T, H, K, V]``: ``S_t`` for every token ``t`` (inclusive of token ``t``).

    Raises:
        ValueError: if the ranks or shapes of ``A``, ``Bm``, ``initial_state`` or ``reset`` do not
            match, or ``T == 0``.
    """
    validation.check_rank("Bm", Bm, ("B", "T", "H", "K", "V"))
    batch, seq_len, heads, dk, dv = Bm.shape
    if seq_len < 1:
        raise ValueError(f"the time axis must hold at least one token, got {Bm.shape=}")
    validation.check_shape("A", A, (batch, seq_len, heads, dk, dk))
    if initial_state is not None:
        validation.check_shape("initial_state", initial_state, (batch, heads, dk, dv))
    if reset is not None:
        validation.check_shape("reset", reset, (batch, seq_len))

    f32 = jnp.float32
    a = jnp.asarray(A, f32)
    b = jnp.asarray(Bm, f32)  # a jax.Array (b.at below) for NumPy inputs too
    if reset is not None:
        a = jnp.where(reset[:, :, None, None, None], 0.0, a)  # document start: forget S_{t-1}
    if initial_state is not None:
        # Fold S_{-1} into the first step: S_0 = A_0 S_{-1} + B_0. The composed A's are then
        # never applied to a state, so this is exact and saves a matmul per token.
        b0 = b[:, 0] + jnp.einsum(
            "bhij,bhjv->bhiv", a[:, 0], initial_state.astype(f32), precision=_HIGHEST
        )
        b = b.at[:, 0].set(b0)
    _, states = jax.lax.associative_scan(_compose, (a, b), axis=1)
    return states  # [B, T, H, K, V]
