"""The evaluation driver (lattn_jax/eval/driver.py): flag checks before anything is loaded (the
binary end to end: tests/experiments/evaluate_test.py)."""

import json
import os
import tempfile
import types
from unittest import mock

from absl.testing import absltest
import jax

from lattn_jax.data import tokenizers as tok_lib
from lattn_jax.eval import driver, restore, runner
from tests.lattn_jax.eval import runner_test


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

    def test_a_results_directory_that_cannot_be_written_is_refused_before_scoring(self):
        path = os.path.join(self.create_tempdir().full_path, "file")
        with open(path, "w") as f:
            f.write("x")
        out = os.path.join(path, "eval")
        # A GGUF file's kind is known from its first bytes: the refusal comes before any
        # weight or data file is read.
        model = os.path.join(self.create_tempdir().full_path, "m.gguf")
        with open(model, "wb") as f:
            f.write(b"GGUF" + bytes(12))
        with self.assertRaisesRegex(ValueError, rf"^--output_dir: the results directory {out} "
                                                rf"cannot be written \({path} is a file, not a "
                                                rf"directory\); nothing was scored$"):
            driver.evaluate(driver.EvaluateRequest(model, tasks=("piqa",), output_dir=out))
        with self.assertRaisesRegex(FileNotFoundError, "^no such checkpoint: /no/such/run"):
            driver.evaluate(driver.EvaluateRequest("/no/such/run", tasks=("piqa",),
                                                   output_dir=out))  # a bad model first
        driver.check_output_dir(os.path.join(self.create_tempdir().full_path, "a", "b"), "x")

    def test_flags_that_do_not_fit_the_model_kind(self):
        options = runner.EvalOptions(data_dir="/tmp")
        gguf = driver.EvaluateRequest("m.gguf", step=3)
        driver.check_kind_flags(gguf, "lattn_jax", ["piqa"], options)  # a workdir takes --step
        driver.check_kind_flags(gguf, "halo", ["piqa"], options)  # a HALO student's stage too
        with self.assertRaisesRegex(ValueError, r"^--step applies to lattn-jax training and "
                                                r"HALO workdirs; m\.gguf is a "):
            driver.check_kind_flags(gguf, "gguf", ["piqa"], options)
        with self.assertRaisesRegex(ValueError, r"^--output_dir is required when --checkpoint "
                                                r"is a "):
            driver.check_kind_flags(driver.EvaluateRequest("m.gguf"), "gguf", ["piqa"], options)
        with self.assertRaisesRegex(ValueError, r"^--perplexity_files=validation scores the "):
            driver.check_kind_flags(driver.EvaluateRequest("m.gguf", output_dir="/tmp/o"),
                                    "gguf", ["perplexity"], options)
        with self.assertRaisesRegex(ValueError, r"held out; a HALO workdir has none"):
            driver.check_kind_flags(driver.EvaluateRequest("runs/halo"), "halo", ["perplexity"],
                                    options)


class SaveAsYouGoTest(absltest.TestCase):
    """Ctrl-C after some tasks finished keeps them: each is merged into results.json as it
    finishes, and the interruption is one line saying so (was a traceback, nothing saved)."""

    def test_an_interrupt_keeps_the_finished_tasks(self):
        out = os.path.join(tempfile.mkdtemp(), "eval")
        model = types.SimpleNamespace(config=types.SimpleNamespace(layer_pattern=("gdn",)))
        restored = types.SimpleNamespace(
            model=runner_test.Bigram(), tokenizer=tok_lib.ByteTokenizer(), step=7,
            training_data=None, model_config=model.config, describe=lambda: "step 7")
        real_score, calls = runner.score_task, []

        def score(scorer, name, docs, pairs):  # the second task is interrupted
            calls.append(name)
            if len(calls) == 2:
                raise KeyboardInterrupt
            return real_score(scorer, name, docs, pairs)

        request = driver.EvaluateRequest(checkpoint="/ckpt", tasks=("piqa", "arc_easy"),
                                         data_dir=runner_test.FIXTURES, output_dir=out,
                                         max_len=1024, batch_size=2)
        with mock.patch.object(restore, "model_kind", return_value="lattn_jax"), \
                mock.patch.object(restore, "load_model", return_value=restored), \
                mock.patch.object(runner, "score_task", side_effect=score):
            with self.assertRaises(driver.Interrupted) as ctx:
                driver.evaluate(request, print_fn=lambda *a: None)
        path = os.path.join(out, "results.json")
        self.assertEqual(str(ctx.exception), f"interrupted: 1 task(s) saved to {path} (piqa); "
                                             f"rerun to score the rest")
        with open(path) as f:
            saved = json.load(f)
        self.assertEqual(list(saved), ["piqa"])
        self.assertEqual(saved["piqa"]["step"], 7)
        self.assertIn("acc", saved["piqa"])
        with open(os.path.join(out, "results.md")) as f:
            self.assertIn("| piqa | acc |", f.read())


# XLA's out-of-device-memory error, as a 16-prompt batch of 8192 tokens raised it on a GPU.
OOM_TEXT = ("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 34359738368 bytes.\n"
            "BufferAssignment OOM Debugging.")


class _Generator:
    """gen_lib.Generator whose generate runs out of device memory past 1000-token prompts."""

    def __init__(self, *args, **kwargs):
        del args, kwargs  # the real Generator's (model, pad_id, bucket, route)

    def generate(self, prompts, max_new_tokens, stop_tokens):
        if max(len(p) for p in prompts) > 1000:
            raise jax.errors.JaxRuntimeError(OOM_TEXT)
        return types.SimpleNamespace(tokens=[[] for _ in prompts])


class OutOfMemoryTest(absltest.TestCase):
    """NIAH at --batch_size=16 and length 8192 ended in an XLA traceback asking for ~34 GB."""

    def _evaluate(self, out, tasks, **kwargs):
        model = types.SimpleNamespace(layer_pattern=("gdn",))
        restored = types.SimpleNamespace(
            model=runner_test.Bigram(), tokenizer=tok_lib.ByteTokenizer(), step=7,
            training_data=None, model_config=model, describe=lambda: "step 7")
        request = driver.EvaluateRequest(checkpoint="/ckpt", tasks=tasks,
                                         data_dir=runner_test.FIXTURES, output_dir=out,
                                         max_len=1024, **kwargs)
        with mock.patch.object(restore, "model_kind", return_value="lattn_jax"), \
                mock.patch.object(restore, "load_model", return_value=restored), \
                mock.patch.object(runner.gen_lib, "Generator", _Generator):
            return driver.evaluate(request, print_fn=lambda *a: None)

    def test_niah_out_of_memory_is_one_line_naming_the_flags_and_keeps_finished_tasks(self):
        out = os.path.join(tempfile.mkdtemp(), "eval")
        path = os.path.join(out, "results.json")
        with self.assertRaises(runner.OutOfMemoryError) as ctx:
            self._evaluate(out, ("piqa", "niah_single_1"), batch_size=16,
                           niah_lengths=("512", "2048", "4096"), niah_depths=("0", "50"))
        self.assertIsInstance(ctx.exception, ValueError)  # evaluate.py: "error: <it>", exit 1
        self.assertEqual(str(ctx.exception), (
            f"niah_single_1 ran out of device memory at length 2048 (--niah_lengths) with "
            f"--batch_size=16 prompts per forward pass: rerun with a smaller --batch_size (e.g. "
            f"--batch_size=8) or shorter --niah_lengths; 1 task(s) finished before it are saved "
            f"to {path} (piqa). XLA: RESOURCE_EXHAUSTED: Out of memory while trying to allocate "
            f"34359738368 bytes."))
        with open(path) as f:
            self.assertEqual(list(json.load(f)), ["piqa"])

    def test_perplexity_out_of_memory_is_one_line_naming_its_flags(self):
        out = os.path.join(tempfile.mkdtemp(), "eval")
        text = os.path.join(tempfile.mkdtemp(), "doc.txt")
        with open(text, "w") as f:
            f.write("some text to score\n\nand more of it\n")

        def evaluate(*args, **kwargs):
            raise jax.errors.JaxRuntimeError(OOM_TEXT)

        with mock.patch.object(runner.ppl_lib, "evaluate", side_effect=evaluate), \
                self.assertRaises(runner.OutOfMemoryError) as ctx:
            self._evaluate(out, ("perplexity",), perplexity_files=(text,))
        self.assertEqual(str(ctx.exception), (
            f"perplexity {text} ran out of device memory with --perplexity_batch_size=2 "
            f"windows of --perplexity_window=2048 tokens per forward pass: rerun with a smaller "
            f"--perplexity_batch_size or --perplexity_window; 0 task(s) finished before it are "
            f"saved to {os.path.join(out, 'results.json')}. XLA: RESOURCE_EXHAUSTED: Out of "
            f"memory while trying to allocate 34359738368 bytes."))

    def test_zero_shot_out_of_memory_is_one_line_and_keeps_finished_tasks(self):
        out = os.path.join(tempfile.mkdtemp(), "eval")
        path = os.path.join(out, "results.json")
        score_task = runner.score_task

        def score(scorer, name, docs, pairs):  # piqa scores; the second task runs out
            if name != "piqa":
                raise jax.errors.JaxRuntimeError(OOM_TEXT)
            return score_task(scorer, name, docs, pairs)

        with mock.patch.object(runner, "score_task", side_effect=score), \
                self.assertRaises(runner.OutOfMemoryError) as ctx:
            self._evaluate(out, ("piqa", "arc_easy"), batch_size=8)
        self.assertEqual(str(ctx.exception), (
            f"arc_easy ran out of device memory with --batch_size=8 requests of up to "
            f"--max_len=1024 tokens per forward pass: rerun with a smaller --batch_size (e.g. "
            f"--batch_size=4); 1 task(s) finished before it are saved to {path} (piqa). XLA: "
            f"RESOURCE_EXHAUSTED: Out of memory while trying to allocate 34359738368 bytes."))
        with open(path) as f:
            self.assertEqual(list(json.load(f)), ["piqa"])


if __name__ == "__main__":
    absltest.main()
