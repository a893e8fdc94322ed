"""``pallas_kernels.common.pallas_gpu``: dispatch rules and the kernels' shared math helpers.

The helpers are plain jax functions, so they are checked here outside any kernel against numpy;
``kernel_gpu_test.py`` checks them inside the kernels.
"""

from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest

from pallas_kernels.common import channelwise_gpu, pallas_gpu


class UnitLowerInverseTest(absltest.TestCase):

    def test_matches_numpy_inverse(self):
        rng = np.random.default_rng(0)
        for scale in (0.3, 1.0):  # entries up to |L_ij| = 1: correlated unit keys, beta near 1
            strict = np.tril(rng.uniform(-scale, scale, (64, 64)), -1).astype(np.float32)
            got = pallas_gpu.unit_lower_inverse(jnp.asarray(strict), jnp.dtype(jnp.float32))
            want = np.linalg.inv(np.eye(64) + strict.astype(np.float64))
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


class DocumentMasksTest(absltest.TestCase):

    def test_masks_of_a_packed_row(self):
        # Documents 0 (tokens 0-69), 1 (70-99), 2 (100-129); chunks of 64, padded to 192.
        seg = jnp.asarray(np.repeat([5, 7, 5], [70, 30, 30])[None], jnp.int32)
        doc, conn, last = (np.asarray(x)[0] for x in pallas_gpu.docs_from_segment_ids(seg, 192))
        np.testing.assert_array_equal(doc[:130], np.repeat([0, 1, 2], [70, 30, 30]))
        np.testing.assert_array_equal(doc[130:], 2)  # padding joins the last document
        # conn: token still in the document running when its chunk began.
        np.testing.assert_array_equal(conn[:64], 1)
        np.testing.assert_array_equal(conn[64:128], np.repeat([1, 0], [6, 58]))
        np.testing.assert_array_equal(conn[128:], np.repeat([0, 1], [0, 64]))
        # last: token in the document of its chunk's last token.
        np.testing.assert_array_equal(last[64:128], np.repeat([0, 1], [36, 28]))


class TuningEntriesTest(absltest.TestCase):

    def test_resolve_launch(self):
        self.assertEqual(pallas_gpu.resolve_launch((8, 2), 64), (8, 2))
        self.assertEqual(pallas_gpu.resolve_launch({64: (4, 2), 128: (8, 2)}, 128), (8, 2))
        with self.assertRaisesRegex(ValueError, "no entry for head dim 32"):
            pallas_gpu.resolve_launch({64: (4, 2)}, 32)
        with self.assertRaisesRegex(ValueError, "not a .num_warps, num_stages. pair"):
            pallas_gpu.resolve_launch((4, 2, 1), 64)

    def test_block_widths_must_divide_the_head_dims(self):
        pallas_gpu.check_block_widths(32, 64, dk=64, dv=128)
        with self.assertRaisesRegex(ValueError, r"TUNING\['block_k'\]=128 must divide the head "
                                                r"dim 64"):
            pallas_gpu.check_block_widths(64, 128, dk=64, dv=64)
        with self.assertRaisesRegex(ValueError, r"TUNING\['block_v'\]=48"):
            pallas_gpu.check_block_widths(48, 64, dk=64, dv=128)
        # The per-channel kernels check theirs when a call is configured (no silent NaNs).
        with mock.patch.dict(channelwise_gpu.TUNING, {"block_k": 128}):
            with self.assertRaisesRegex(ValueError, "block_k"):
                channelwise_gpu._config(batch=1, heads=1, n_chunks=1, dk=64, dv=64, scale=1.0,
                                        has_docs=False, mm_dtype=jnp.float32, interpret=True,
                                        return_residual=False)


class DispatchTest(absltest.TestCase):

    def test_choose_implementation(self):
        x = jnp.zeros((1, 128, 1, 64), jnp.bfloat16)
        choose = pallas_gpu.choose_implementation
        args = ("op", ("chunked", "reference"), (x, x, x), (64, 64), 64, 128)
        if jax.default_backend() != "gpu":
            self.assertEqual(choose(args[0], "auto", *args[1:]), "chunked")
            with self.assertRaisesRegex(ValueError, "need a GPU backend"):
                choose(args[0], "pallas", *args[1:])
        self.assertEqual(choose(args[0], "pallas_interpret", *args[1:]), "pallas_interpret")
        self.assertEqual(choose(args[0], "reference", *args[1:]), "reference")
        with self.assertRaisesRegex(ValueError, "head dim 32"):
            choose("op", "pallas_interpret", ("chunked",), (x, x, x), (32, 64), 64, 128)
        with self.assertRaisesRegex(ValueError, "not available"):
            choose(args[0], "triton", *args[1:])

    def test_matmul_dtype(self):
        bf, f32 = jnp.zeros((2,), jnp.bfloat16), jnp.zeros((2,), jnp.float32)
        self.assertEqual(pallas_gpu.matmul_dtype(bf, bf, bf), jnp.dtype(jnp.bfloat16))
        self.assertEqual(pallas_gpu.matmul_dtype(bf, f32, bf), jnp.dtype(jnp.float32))


if __name__ == "__main__":
    absltest.main()
