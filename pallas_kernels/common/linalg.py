"""Small dense linear algebra used by the chunked forms, written in plain XLA ops.

The chunked (WY/UT) form of every delta-rule variant needs ``(I + L)^{-1}`` for a strictly
lower-triangular ``L`` per chunk (Yang et al. 2024, "Parallelizing Linear Transformers with the
Delta Rule over Sequence Length", Eq. 10-11). We compute it by forward substitution over the rows
of the ``C x C`` matrix instead of calling ``lax.linalg.triangular_solve``: on the CPU backend the
batched LAPACK solve inside a deep backward pass was observed to hang (jax 0.10.2, three or more
stacked layers), and a row loop is what GPU/TPU kernels do anyway. The gradient is the analytic
``dL = -strict_tril(X^T dX X^T)`` with ``X = (I + L)^{-1}``, so the backward pass stores only
``X`` rather than every loop iterate.
"""

import jax
import jax.numpy as jnp

_HIGHEST = jax.lax.Precision.HIGHEST


def _forward_substitution(strict: jax.Array) -> jax.Array:
    c = strict.shape[-1]
    eye = jnp.broadcast_to(jnp.eye(c, dtype=strict.dtype), strict.shape)

    def body(i, x):
        # Row i of X = e_i - sum_{j < i} L_ij X_j; rows >= i of X are still identity rows and
        # L_ij = 0 for j >= i, so the full-row product only picks up solved rows.
        row = jnp.einsum("...j,...jk->...k", strict[..., i, :], x, precision=_HIGHEST)
        return x.at[..., i, :].set(eye[..., i, :] - row)

    return jax.lax.fori_loop(1, c, body, eye)


@jax.custom_vjp
def unit_lower_inverse(strict: jax.Array) -> jax.Array:
    """Returns ``(I + L)^{-1}`` for strictly lower-triangular ``L``.

    Args:
      strict: fp32 ``[..., C, C]``; only the strictly lower triangle is read (the caller must
        pass zeros on and above the diagonal).

    Returns:
      fp32 ``[..., C, C]``, unit lower-triangular.
    """
    return _forward_substitution(strict)


def _inverse_fwd(strict):
    x = _forward_substitution(strict)
    return x, x


def _inverse_bwd(x, dx):
    # d(A^{-1}) = -A^{-1} dA A^{-1}  =>  dA = -X^T dX X^T; only the strict lower part of A varies.
    xt = jnp.swapaxes(x, -1, -2)
    da = -jnp.einsum("...ij,...jk,...kl->...il", xt, dx, xt, precision=_HIGHEST)
    return (jnp.tril(da, -1),)


unit_lower_inverse.defvjp(_inverse_fwd, _inverse_bwd)


def solve_unit_lower(strict: jax.Array, rhs: jax.Array) -> jax.Array:
    """Solves ``(I + L) X = rhs`` for strictly lower-triangular ``L``.

    Args:
      strict: fp32 ``[..., C, C]`` strictly lower-triangular ``L``.
      rhs: fp32 ``[..., C, D]``.

    Returns:
      fp32 ``[..., C, D]``.
    """
    return jnp.einsum("...ij,...jd->...id", unit_lower_inverse(strict), rhs, precision=_HIGHEST)
