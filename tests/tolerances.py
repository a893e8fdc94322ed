"""The one tolerance table for numerical tests, keyed by dtype and split into fwd/grad.

References are always computed in fp32 (or fp64). Starting points are JAX's defaults. Any change
here needs a comment saying why, and a reviewer.
"""

import jax.numpy as jnp
import numpy as np

# (rtol, atol) pairs.
FWD = {
    jnp.dtype(jnp.float64): (1e-10, 1e-10),
    jnp.dtype(jnp.float32): (1e-5, 1e-5),
    jnp.dtype(jnp.bfloat16): (2e-2, 2e-2),
}
GRAD = {
    jnp.dtype(jnp.float64): (1e-8, 1e-8),
    jnp.dtype(jnp.float32): (1e-4, 1e-4),
    jnp.dtype(jnp.bfloat16): (1e-1, 1e-1),
}


def fwd_tol(dtype):
    """Returns ``dict(rtol=..., atol=...)`` for forward outputs computed in ``dtype``."""
    rtol, atol = FWD[jnp.dtype(dtype)]
    return dict(rtol=rtol, atol=atol)


def grad_tol(dtype):
    """Returns ``dict(rtol=..., atol=...)`` for gradients computed in ``dtype``."""
    rtol, atol = GRAD[jnp.dtype(dtype)]
    return dict(rtol=rtol, atol=atol)


def rel_err(actual, expected) -> float:
    """Relative RMS error ``||a - e|| / ||e||`` (FLA's err-ratio), robust on long sequences."""
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    return float(np.linalg.norm(a - e) / max(np.linalg.norm(e), 1e-30))


def assert_rel_err(actual, expected, max_err: float, name: str = "") -> None:
    """Asserts ``rel_err(actual, expected) <= max_err`` with a message that gives both."""
    err = rel_err(actual, expected)
    if not err <= max_err:
        raise AssertionError(f"{name}: relative error {err:.3e} exceeds {max_err:.1e}")
