"""Every op at the head dimensions models use (64, 100, 128, 192): chunked == reference.

Non-power-of-two (100) and wide (192) heads must work in the pure-JAX forms; kernels that only
support some sizes fall back to these forms, so their correctness at every size matters.
"""

import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized

from pallas_kernels import gated_delta_rule as gdr
from pallas_kernels import gdn2 as gdn2_lib
from pallas_kernels import kda as kda_lib
from pallas_kernels import simple_gla as sgla
from tests import tolerances

HEAD_DIMS = (64, 100, 128, 192)
B, T, H, CHUNK = 1, 40, 2, 16


def _inputs(dk, dv, seed=0):
    # numpy's generator, not jax.random: each jax.random call (and each eager op on the
    # draws) on a new shape compiles a program.
    rng = np.random.default_rng(seed)

    def normal(*shape):
        return rng.standard_normal(shape)

    def unit(x):
        return x / np.linalg.norm(x, axis=-1, keepdims=True)

    def sigmoid(x):
        return 1.0 / (1.0 + np.exp(-x))

    q = unit(normal(B, T, H, dk))
    k = unit(normal(B, T, H, dk))
    v = normal(B, T, H, dv)
    beta = sigmoid(normal(B, T, H))
    g_head = -np.logaddexp(0.0, normal(B, T, H))  # -softplus
    g_chan = -np.logaddexp(0.0, normal(B, T, H, dk))
    gates = sigmoid(normal(B, T, H, dk + dv))
    xs = q, k, v, beta, g_head, g_chan, gates[..., :dk], gates[..., dk:]
    return tuple(jnp.asarray(x, jnp.float32) for x in xs)


def _run(op, dk, dv, implementation):
    q, k, v, beta, g_head, g_chan, b, w = _inputs(dk, dv)
    h0 = jnp.asarray(np.random.default_rng(9).standard_normal((B, H, dk, dv)), jnp.float32)
    kwargs = dict(initial_state=h0, output_final_state=True, chunk_size=CHUNK,
                  implementation=implementation)
    if op == "gdn":
        return gdr.gated_delta_rule(q, k, v, g_head, beta, **kwargs)
    if op == "kda":
        return kda_lib.kda(q, k, v, g_chan, beta, **kwargs)
    if op == "gdn2":
        return gdn2_lib.gdn2(q, k, v, g_chan, b, w, **kwargs)
    return sgla.simple_gla(q, k, v, g_head, **kwargs)


class HeadDimsTest(parameterized.TestCase):

    @parameterized.named_parameters(
        dict(testcase_name=f"{op}_K={d}", op=op, dim=d)
        for op in ("gdn", "kda", "gdn2", "simple_gla") for d in HEAD_DIMS)
    def test_chunked_matches_reference(self, op, dim):
        dv = dim if op != "gdn" else 64  # GDN also mixes K != V
        o, state = _run(op, dim, dv, "chunked")
        o_ref, state_ref = _run(op, dim, dv, "reference")
        max_err = tolerances.FWD[jnp.dtype(jnp.float32)][0]
        tolerances.assert_rel_err(o, o_ref, max_err, f"{op} o")
        tolerances.assert_rel_err(state, state_ref, max_err, f"{op} final_state")


if __name__ == "__main__":
    absltest.main()
