"""``mosaic_gpu_lib.chunk_cumsum`` (CI, CPU): values, and no cumsum of a constant for DeltaNet.

The chunk-local gate cumsum of the Mosaic GDN kernels is checked against NumPy; with no gate
(DeltaNet) it must be zeros without a cumsum, because a cumsum of a zeros constant made XLA
constant-fold a reduce-window over ``[B, N, 64, H]`` while compiling, 4-6 s per kernel that
takes it (H100, ``benchmarks/results/mosaic-gpu-h100-2026-12-07.md``).
"""

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from pallas_kernels.common import mosaic_gpu_lib as mgl
from pallas_kernels.gated_delta_rule import mosaic_vjp
from tests.pallas_kernels.mosaic_reduction_test import sub_jaxprs


def _primitives(jaxpr):
    names = []
    for eqn in jaxpr.eqns:
        names.append(eqn.primitive.name)
        for sub in sub_jaxprs(eqn):
            names += _primitives(sub)
    return names


class ChunkCumsumTest(absltest.TestCase):

    def test_gated_values_per_chunk_and_padding(self):
        rng = np.random.default_rng(0)
        batch, seq_len, heads = 2, 150, 3  # 3 chunks, the last one padded
        g = rng.uniform(-1.0, 0.0, (batch, seq_len, heads)).astype(np.float32)
        got = np.asarray(mgl.chunk_cumsum(jnp.asarray(g, jnp.bfloat16).astype(jnp.float32),
                                          (batch, seq_len, heads), 3))
        self.assertEqual(got.shape, (batch, heads, 192))
        gp = np.zeros((batch, 192, heads), np.float64)
        gp[:, :seq_len] = np.asarray(jnp.asarray(g, jnp.bfloat16).astype(jnp.float32))
        want = np.cumsum(gp.reshape(batch, 3, 64, heads), axis=2).reshape(batch, 192, heads)
        np.testing.assert_allclose(got, np.moveaxis(want, 1, 2), rtol=1e-6, atol=1e-6)

    def test_ungated_is_zeros(self):
        got = mgl.chunk_cumsum(None, (2, 100, 4), 2)
        self.assertEqual((got.shape, got.dtype), ((2, 4, 128), jnp.float32))
        np.testing.assert_array_equal(np.asarray(got), 0.0)

    def test_deltanet_fwd_bwd_has_no_cumsum_and_gdn_has(self):
        s = jax.ShapeDtypeStruct
        b, t, h, d = 1, 256, 2, 64

        def grads(gated):
            def loss(q, k, v, g, beta):
                o, _ = mosaic_vjp.gated_delta_rule_mosaic(q, k, v, g if gated else None, beta)
                return o.astype(jnp.float32).sum()
            args = ([s((b, t, h, d), jnp.bfloat16)] * 3
                    + [s((b, t, h), jnp.float32), s((b, t, h), jnp.bfloat16)])
            return _primitives(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2, 4)))(
                *args).jaxpr)

        self.assertNotIn("cumsum", grads(False))
        self.assertIn("cumsum", grads(True))  # the check can see one


class ApproxMathTest(absltest.TestCase):
    """``mosaic_gpu_lib.APPROX_MATH`` reaches every kernel (MOSAIC_GPU.md Sec. 44)."""

    def test_every_kernel_takes_its_compiler_params_from_the_lib(self):
        import pathlib
        root = pathlib.Path(__file__).resolve().parents[2] / "pallas_kernels"
        direct = [str(p.relative_to(root)) for p in root.rglob("*.py")
                  if p.name != "mosaic_gpu_lib.py"
                  and "compiler_params=plgpu.CompilerParams(" in p.read_text()]
        self.assertEqual(direct, [])
        users = [p for p in root.rglob("*.py") if "compiler_params(" in p.read_text()]
        self.assertGreaterEqual(len(users), 8)

    def test_the_switch_turns_exp_into_exp2_in_the_module(self):
        if not jax.__version__.startswith("0.10."):
            self.skipTest("reads the serialized Mosaic GPU module back (jax 0.10 only)")
        from unittest import mock

        from jax.experimental.pallas import mosaic_gpu as plgpu

        from benchmarks import profile_t0

        def body(x_ref, o_ref):
            o_ref[...] = jnp.exp(x_ref[...])

        texts = {}
        for on in (False, True):
            with mock.patch.object(mgl, "APPROX_MATH", on):
                call = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((128,), jnp.float32),
                                    grid=(1,), grid_names=("g",),
                                    compiler_params=mgl.compiler_params())
                exported = jax.export.export(jax.jit(call), platforms=["cuda"])(
                    jax.ShapeDtypeStruct((128,), jnp.float32))
                texts[on] = profile_t0.mosaic_module_text(exported.mlir_module())
        self.assertIn("math.exp\"", texts[False])
        self.assertNotIn("math.exp2", texts[False])
        self.assertIn("math.exp2", texts[True])
        self.assertNotIn("math.exp\"", texts[True])


if __name__ == "__main__":
    absltest.main()
