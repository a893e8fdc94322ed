"""benchmarks/export_grad_mosaic.py: K1 and K2 export for CUDA at the script's smallest shape
(under the test process's jax), and a bad kernel name is refused."""

from absl.testing import absltest, parameterized

from benchmarks import export_grad_mosaic


class ExportCaseTest(parameterized.TestCase):

    @parameterized.parameters(("k1", 64, 16, True), ("k2", 128, 32, False))
    def test_exports_one_mosaic_call(self, kernel, dim, slab, docs):
        seconds, calls = export_grad_mosaic.export_case(kernel, dim, slab, docs)
        self.assertEqual(calls, 1)
        self.assertGreater(seconds, 0.0)

    def test_rejects_unknown_kernel(self):
        with self.assertRaisesRegex(ValueError, "k1 or k2"):
            export_grad_mosaic.export_case("k3", 64, 16, True)


if __name__ == "__main__":
    absltest.main()
