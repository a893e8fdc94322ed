"""The evaluation driver (lattn_jax/eval/driver.py): flag checks before anything is loaded (the
binary end to end: tests/experiments/evaluate_test.py)."""

import os

from absl.testing import absltest

from lattn_jax.eval import driver, runner


class CheckFlagsTest(absltest.TestCase):

    def test_flags_wrong_on_their_own(self):
        request = driver.EvaluateRequest(checkpoint="/tmp/run", tasks=("piqa",))
        driver.check_flags(request, ["piqa"])  # fine
        with self.assertRaisesRegex(ValueError, r"^--tasks=piqa: no task given; choose from "):
            driver.check_flags(request, [])
        with self.assertRaisesRegex(ValueError, r"^--perplexity_stride=0: not a positive "
                                                r"integer \(tokens\)$"):
            driver.check_flags(driver.EvaluateRequest("/tmp/run", perplexity_stride=0), ["piqa"])
        path = os.path.join(self.create_tempdir().full_path, "file")
        with open(path, "w") as f:
            f.write("x")
        with self.assertRaisesRegex(ValueError, rf"^--output_dir={path} exists and is not a "
                                                rf"directory$"):
            driver.check_flags(driver.EvaluateRequest("/tmp/run", output_dir=path), ["piqa"])

    def test_flags_that_do_not_fit_the_model_kind(self):
        options = runner.EvalOptions(data_dir="/tmp")
        gguf = driver.EvaluateRequest("m.gguf", step=3)
        driver.check_kind_flags(gguf, "lattn_jax", ["piqa"], options)  # a workdir takes --step
        with self.assertRaisesRegex(ValueError, r"^--step applies to lattn-jax training "
                                                r"workdirs; m\.gguf is a "):
            driver.check_kind_flags(gguf, "gguf", ["piqa"], options)
        with self.assertRaisesRegex(ValueError, r"^--output_dir is required when --checkpoint "
                                                r"is a "):
            driver.check_kind_flags(driver.EvaluateRequest("m.gguf"), "gguf", ["piqa"], options)
        with self.assertRaisesRegex(ValueError, r"^--perplexity_files=validation scores the "):
            driver.check_kind_flags(driver.EvaluateRequest("m.gguf", output_dir="/tmp/o"),
                                    "gguf", ["perplexity"], options)


if __name__ == "__main__":
    absltest.main()
