"""The one-pass Pallas RMSNorm kernels (``pallas_kernels/common/rms_norm_gpu.py``).

``InterpretTest`` runs the kernels in Pallas interpret mode (any backend) against the XLA form
``lattn_jax.layers.rms_norm`` (forward values: fp32 to a few ulps, bf16 to one rounding flip)
and the gradients against float64 NumPy of the backward's formula, on random (never zero)
inputs with several leading axes, row counts that fill no whole block, and D of 64, 1000 (not a
power of two: masked columns) and 1024. ``TritonLoweringTest`` lowers forward + backward for
CUDA on any host (``jax.export``, no GPU). ``GpuTest`` (marked ``gpu``, skipped without a GPU)
compiles them with Triton. ``ErrorsTest``: bad inputs name their argument.
"""

import collections
import re
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest, parameterized

from lattn_jax import layers, sharding
from pallas_kernels.common import pallas_gpu, rms_norm_gpu

EPS = 1e-5
# (leading shape, D): rows 15 (< one backward program), 51 (two programs, the last partial),
# 2 * 3 * 5 = 30 rows of 1000 (masked columns), 65 rows of 64 (three programs).
CASES = (((3, 5), 1000), ((3, 17), 1024), ((2, 3, 5), 1000), ((5, 13), 64), ((1,), 64))


def _inputs(seed, lead, dim, dtype):
    """``x, scale, dy``: x and dy N(0, 1) in ``dtype`` (x offset from zero), scale fp32 near 1."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(lead + (dim,)) + 0.1
    scale = 1.0 + 0.2 * rng.standard_normal(dim)
    dy = rng.standard_normal(lead + (dim,))
    return (jnp.asarray(x, dtype), jnp.asarray(scale, jnp.float32), jnp.asarray(dy, dtype))


def _numpy_grads(x, scale, dy):
    """float64 ``dx = r (gs - xh mean(gs xh))`` and ``d scale = sum dy xh`` (over all rows)."""
    x, scale, dy = (np.asarray(a, np.float64) for a in (x, scale, dy))
    r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS)
    xh, gs = x * r, dy * scale
    dx = r * (gs - xh * np.mean(gs * xh, axis=-1, keepdims=True))
    return dx, np.sum((dy * xh).reshape(-1, x.shape[-1]), axis=0)


def _vjp(fn, x, scale, dy):
    y, vjp = jax.vjp(lambda x, s: fn(x, s, EPS), x, scale)
    return (y,) + vjp(dy)


def _pallas(x, scale, eps):
    return rms_norm_gpu.rms_norm_pallas(x, scale, eps, interpret=True)


class InterpretTest(parameterized.TestCase):

    @parameterized.parameters(*CASES)
    def test_fp32_matches_xla_and_numpy(self, lead, dim):
        x, scale, dy = _inputs(0, lead, dim, jnp.float32)
        y, dx, ds = _vjp(_pallas, x, scale, dy)
        y_xla = layers.rms_norm(x, scale, EPS)
        self.assertEqual((y.dtype, dx.dtype, ds.dtype), (jnp.float32,) * 3)
        np.testing.assert_allclose(y, y_xla, rtol=1e-6, atol=1e-6)
        dx_np, ds_np = _numpy_grads(x, scale, dy)
        np.testing.assert_allclose(dx, dx_np, rtol=1e-5, atol=1e-6 * np.abs(dx_np).max())
        np.testing.assert_allclose(ds, ds_np, rtol=1e-5, atol=1e-6 * np.abs(ds_np).max())

    @parameterized.parameters(*CASES)
    def test_bf16_matches_xla_to_one_rounding(self, lead, dim):
        x, scale, dy = _inputs(1, lead, dim, jnp.bfloat16)
        y, dx, ds = _vjp(_pallas, x, scale, dy)
        y_xla, dx_xla, ds_xla = _vjp(layers.rms_norm, x, scale, dy)
        self.assertEqual((y.dtype, dx.dtype, ds.dtype),
                         (jnp.bfloat16, jnp.bfloat16, jnp.float32))
        # y and dx are rounded once from fp32 values that differ by the order of the row sums:
        # at most one bf16 step (2^-7 of the magnitude, 2^-8 away from the rounding point).
        for got, want in ((y, y_xla), (dx, dx_xla)):
            got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
            np.testing.assert_array_less(np.abs(got - want), np.abs(want) * 2.0 ** -7 + 1e-30)
            self.assertLess(np.mean(got != want), 0.02)
        np.testing.assert_allclose(ds, ds_xla, rtol=1e-5, atol=1e-6 * np.abs(ds_xla).max())
        # Against float64 of the same bf16 inputs: dx within its one rounding.
        dx_np, ds_np = _numpy_grads(x, scale, dy)
        np.testing.assert_allclose(np.asarray(dx, np.float32), dx_np, rtol=2.0 ** -8,
                                   atol=1e-5 * np.abs(dx_np).max())
        np.testing.assert_allclose(ds, ds_np, rtol=1e-5, atol=1e-6 * np.abs(ds_np).max())

    def test_bf16_scale_gradient_takes_its_dtype(self):
        x, scale, dy = _inputs(2, (4,), 64, jnp.float32)
        _, _, ds = _vjp(_pallas, x, scale.astype(jnp.bfloat16), dy)
        self.assertEqual(ds.dtype, jnp.bfloat16)

    def test_block_rows(self):
        self.assertEqual([rms_norm_gpu.padded_dim(d) for d in (1, 64, 1000, 1024, 4096)],
                         [1, 64, 1024, 1024, 4096])
        self.assertEqual([rms_norm_gpu.block_rows(d) for d in (64, 128, 1000, 4096)],
                         [16, 16, 4, 1])


class TritonLoweringTest(absltest.TestCase):
    """Forward + backward lower to Triton for CUDA on any host (``jax.export``, no GPU; jax >=
    0.11 compiles the Triton kernels at this point), D = 1000 (masked columns)."""

    def test_exports_for_cuda(self):
        x, scale, dy = _inputs(0, (2, 37), 1000, jnp.bfloat16)

        def fwdbwd(x, scale, dy):
            return _vjp(rms_norm_gpu.rms_norm_pallas, x, scale, dy)

        with pallas_gpu.abstract_gpu_target():
            exported = jax.export.export(
                jax.jit(fwdbwd), platforms=["cuda"],
                disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(
                    "__gpu$xla.gpu.triton")])(x, scale, dy)
            text = exported.mlir_module()
        self.assertEqual(text.count("__gpu$xla.gpu.triton"), 2)
        self.assertEqual(collections.Counter(re.findall(r'name = "(rms_norm_\w+)"', text)),
                         collections.Counter(["rms_norm_fwd", "rms_norm_bwd"]))


@pytest.mark.gpu
class GpuTest(parameterized.TestCase):
    """The kernels compiled by Triton on a GPU (skipped without one), the model's shapes (D of
    the 350M model's blocks, 1024, and of GDN's o_norm, 128) and a masked D: forward values to
    one rounding of XLA's, gradients against float64 NumPy."""

    def setUp(self):
        super().setUp()
        if jax.default_backend() != "gpu":
            self.skipTest("needs a GPU")

    @parameterized.product(dim=(128, 1000, 1024, 4096), dtype=(jnp.float32, jnp.bfloat16))
    def test_matches_xla_and_numpy(self, dim, dtype):
        x, scale, dy = _inputs(3, (4, 333), dim, dtype)
        y, dx, ds = jax.jit(lambda *a: _vjp(rms_norm_gpu.rms_norm_pallas, *a))(x, scale, dy)
        y_xla = layers.rms_norm(x, scale, EPS)
        got, want = np.asarray(y, np.float32), np.asarray(y_xla, np.float32)
        step = 2.0 ** -7 if dtype == jnp.bfloat16 else 2.0 ** -18
        np.testing.assert_array_less(np.abs(got - want), np.abs(want) * step + 1e-30)
        dx_np, ds_np = _numpy_grads(x, scale, dy)
        rtol = 2.0 ** -8 if dtype == jnp.bfloat16 else 1e-5
        np.testing.assert_allclose(np.asarray(dx, np.float32), dx_np, rtol=rtol,
                                   atol=1e-5 * np.abs(dx_np).max())
        np.testing.assert_allclose(ds, ds_np, rtol=1e-5, atol=1e-5 * np.abs(ds_np).max())


class ErrorsTest(absltest.TestCase):

    def test_bad_inputs_name_their_argument(self):
        x = jnp.ones((2, 8), jnp.float32)
        with self.assertRaisesRegex(ValueError, r"scale must have shape \[D\] = \(8,\)"):
            rms_norm_gpu.rms_norm_pallas(x, jnp.ones((7,)), EPS, interpret=True)
        with self.assertRaisesRegex(ValueError, r"scale must have shape \[D\]"):
            rms_norm_gpu.rms_norm_pallas(x, jnp.ones((1, 8)), EPS, interpret=True)
        with self.assertRaisesRegex(ValueError, "x must be a float array, got dtype int32"):
            rms_norm_gpu.rms_norm_pallas(x.astype(jnp.int32), jnp.ones((8,)), EPS)
        with self.assertRaisesRegex(ValueError, "scale must be a float array"):
            rms_norm_gpu.rms_norm_pallas(x, jnp.ones((8,), jnp.int32), EPS)
        with self.assertRaisesRegex(ValueError, r"x must have shape \[\.\.\., D\]"):
            rms_norm_gpu.rms_norm_pallas(jnp.ones((), jnp.float32), jnp.ones((1,)), EPS)

    def test_rmsnorm_implementation_errors(self):
        with self.assertRaisesRegex(ValueError, "RMSNorm implementation='triton'; choose from "
                                                "xla, pallas, pallas_interpret"):
            layers.RMSNorm(8, implementation="triton")
        if jax.default_backend() != "gpu":
            with self.assertRaisesRegex(ValueError, r"model\.norm_implementation.*needs a GPU"):
                layers.RMSNorm(8, implementation="pallas")(jnp.ones((2, 8)))
        # Under a mesh of several devices GSPMD would gather x for the kernels: refused.
        norm = layers.RMSNorm(8, implementation="pallas_interpret")
        with mock.patch.object(sharding, "active_mesh", return_value=mock.Mock(size=2)):
            with self.assertRaisesRegex(ValueError, "one device only .* mesh has 2 devices"):
                norm(jnp.ones((2, 8)))
        with mock.patch.object(sharding, "active_mesh", return_value=mock.Mock(size=1)):
            self.assertEqual(norm(jnp.ones((2, 8))).shape, (2, 8))


if __name__ == "__main__":
    absltest.main()
