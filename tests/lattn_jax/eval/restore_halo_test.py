"""``restore.load_model`` on a HALO workdir: the converted student, loadable by ``generate.py``
and ``evaluate.py`` with the flags of any model.

The fixture runs the real pipeline (``experiment.run``: Stage 1, then Stage 2) on the ``tiny``
config's random teacher, 2 steps each; the reference is the params Stage 2's training loop
returned in memory, built into a model from the HypeNet config directly (not through a
checkpoint, nor through ``load_student``). A second fixture runs Stage 3 (2 steps, at a
learning rate that moves the student well away from Stage 2's) on a copy of that workdir; its
reference is the params Stage 3's loop returned.
"""

import dataclasses
import functools
import json
import os
import re
import shutil
import sys
import tempfile
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest
from flax import nnx

from configs import halo_smollm2
from lattn_jax.eval import restore
from lattn_jax.halo import experiment, hypenet, loaders, stages
from tests import binary_runs
from tests.lattn_jax.halo import loaders_test

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
EVAL_DATA = os.path.join(os.path.dirname(__file__), "testdata", "eval_data")
ATTENTION_LAYERS = (1,)


def _config():
    cfg = halo_smollm2.get_config("tiny")
    cfg.hypenet.attention_layers = ATTENTION_LAYERS
    for stage in ("stage1", "stage2", "stage3"):
        cfg[stage].train.total_steps = 2
    # The tiny config's 1e-5 would leave Stage 3's student within the tests' tolerance of
    # Stage 2's: a load of the wrong stage would pass.
    cfg.stage3.optim.learning_rate = 1e-2
    return cfg


def _reference(trained_params, teacher_cfg, logit_scaling_base=None):
    """The student built from its training loop's in-memory params: the HypeNet of the tiny
    config's options (hypenet_config's arguments spelled out), fp32 as the tiny report."""
    cfg = hypenet.hypenet_config(teacher_cfg, ATTENTION_LAYERS, tie_embeddings=None,
                                 lightning_implementation="auto", lightning_alibi_max_bias=8.0,
                                 lightning_qk_norm=True, attention_rope=False, dtype="float32",
                                 split_projections=True)
    cfg = dataclasses.replace(cfg, attention=dataclasses.replace(
        cfg.attention, logit_scaling_base=logit_scaling_base))
    return loaders.build_model(cfg, trained_params)


@functools.partial(jax.jit, static_argnums=0)
def _jitted_forward(graphdef, state, ids):
    return nnx.merge(graphdef, state)(ids)


def logits(model, ids):
    """``model(ids)`` as one jitted program, shared by every model of the same structure (the
    restored student, its reference and the other stage's): op by op, each new length compiled
    every op again (about 2.5 s a length on 2 cores)."""
    graphdef, state = nnx.split(model)
    return np.asarray(_jitted_forward(graphdef, state, ids))


@functools.lru_cache(maxsize=None)
def _student_workdir():
    """``(workdir, Stage 2's returned state, teacher config)``, made once per process."""
    os.makedirs(absltest.TEST_TMPDIR.value, exist_ok=True)
    workdir = os.path.join(tempfile.mkdtemp(dir=absltest.TEST_TMPDIR.value), "halo-student")
    cfg = _config()
    quiet = dict(print_fn=lambda s: None)
    experiment.run(cfg, workdir, "stage1", **quiet)
    trained = _run_keeping(cfg, workdir, "stage2")
    return workdir, trained, experiment.load_teacher(cfg)[0]


def _run_keeping(cfg, workdir, stage):
    """``experiment.run(cfg, workdir, stage)``, returning what the stage's training loop
    returned (``params``, ``step``, ...)."""
    name = f"run_{stage}"
    real, trained = getattr(stages, name), {}

    def keep(**kw):
        out = real(**kw)
        trained.update(out)
        return out

    with mock.patch.object(experiment.stages, name, side_effect=keep):
        experiment.run(cfg, workdir, stage, print_fn=lambda s: None)
    return trained


@functools.lru_cache(maxsize=None)
def _stage3_workdir():
    """``(workdir, Stage 3's returned state)``: Stage 3 run on a copy of the Stage-2 workdir,
    made once per process."""
    stage2_dir, _, _ = _student_workdir()
    workdir = os.path.join(tempfile.mkdtemp(dir=absltest.TEST_TMPDIR.value), "halo-stage3")
    shutil.copytree(stage2_dir, workdir)
    return workdir, _run_keeping(_config(), workdir, "stage3")


class _HaloFixture(absltest.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.workdir, cls.trained, cls.teacher_cfg = _student_workdir()


class HaloStudentTest(_HaloFixture):

    def tokens(self, rng, vocab):
        return jnp.asarray(rng.integers(0, vocab, size=(2, int(rng.integers(8, 40)))))

    def test_the_student_loads_with_the_logits_of_the_trained_params(self):
        self.assertEqual(restore.model_kind(self.workdir), "halo")
        restored = restore.load_model(self.workdir)
        self.assertEqual((restored.kind, restored.stage, restored.step, restored.config),
                         ("halo", "stage2", self.trained["step"], None))
        self.assertEqual(restored.describe(), f"HALO student, stage2 step {self.trained['step']}")
        self.assertIsNone(restored.training_data)
        self.assertTrue(restored.model_config.use_segment_ids)  # padding-safe generation
        self.assertEqual(restored.tokenizer.vocab_size, 257)  # the tiny config's byte tokenizer
        ref = _reference(self.trained["params"], self.teacher_cfg)
        self.assertEqual(restored.model_config.layer_pattern, ref.config.layer_pattern)
        rng = np.random.default_rng(0)
        for _ in range(2):
            ids = self.tokens(rng, 257)
            np.testing.assert_allclose(logits(restored.model, ids), logits(ref, ids),
                                       rtol=1e-5, atol=1e-5)

    def test_the_calibrated_scaling_and_a_step_are_applied(self):
        workdir = os.path.join(self.create_tempdir().full_path, "halo")
        shutil.copytree(self.workdir, workdir)
        a = float(np.random.default_rng().choice([1.5, 2.0, 3.0]))  # strong at T < 40
        os.makedirs(os.path.join(workdir, "calibrate"))
        with open(os.path.join(workdir, "calibrate", "calibration.json"), "w") as f:
            json.dump({"best": a, "student_params": "stage2"}, f)
        restored = restore.load_model(workdir, step=self.trained["step"])
        self.assertEqual(restored.model_config.attention.logit_scaling_base, a)
        ref = _reference(self.trained["params"], self.teacher_cfg, logit_scaling_base=a)
        ids = self.tokens(np.random.default_rng(1), 257)
        got = logits(restored.model, ids)
        np.testing.assert_allclose(got, logits(ref, ids), rtol=1e-5, atol=1e-5)
        unscaled = _reference(self.trained["params"], self.teacher_cfg)
        self.assertGreater(np.abs(got - logits(unscaled, ids)).max(), 1e-4)
        with self.assertRaisesRegex(FileNotFoundError, r"step=9999: no stage2 checkpoint at that "
                                                       r"step in .*/halo \(the HALO student's "
                                                       r"steps: .*2\)"):
            restore.load_model(workdir, step=9999)

    def test_a_halo_workdir_without_a_student_is_one_error_naming_it(self):
        workdir = os.path.join(self.create_tempdir().full_path, "early")
        os.makedirs(os.path.join(workdir, "stage1"))
        shutil.copy(os.path.join(self.workdir, "config.json"), workdir)
        for fn in (restore.model_kind, restore.load_model):
            with self.assertRaisesRegex(FileNotFoundError, rf"^{workdir} is a HALO workdir "
                                                           r"without a converted student: no "
                                                           r"stage3 or stage2 checkpoint; run "
                                                           r"experiments/halo.py --stage=stage2"):
                fn(workdir)
        stage1 = os.path.join(workdir, "stage1")
        with self.assertRaisesRegex(FileNotFoundError, re.escape(
                f"{stage1} is the stage1 folder of the HALO workdir {workdir}, not a model, and "
                f"that workdir has no converted student yet (no stage3 or stage2 checkpoint): "
                f"run experiments/halo.py --workdir={workdir} --stage=stage2, then pass "
                f"--checkpoint={workdir}")):
            restore.load_model(stage1)
        self.assertFalse(os.path.exists(os.path.join(workdir, "stage2")))  # nothing created


class HaloStage3StudentTest(_HaloFixture):
    """A workdir whose Stage 3 ran: its student is Stage 3's, through the same loader."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.workdir3, cls.trained3 = _stage3_workdir()

    def test_the_stage3_student_loads_with_the_logits_of_stage3s_params(self):
        self.assertEqual(restore.model_kind(self.workdir3), "halo")
        self.assertEqual(experiment.student_stage(self.workdir3), "stage3")
        restored = restore.load_model(self.workdir3)
        step = self.trained3["step"]
        self.assertEqual((restored.kind, restored.stage, restored.step, restored.config),
                         ("halo", "stage3", step, None))
        self.assertEqual(restored.describe(), f"HALO student, stage3 step {step}")
        self.assertTrue(restored.model_config.use_segment_ids)
        self.assertIsNone(restored.model_config.attention.logit_scaling_base)
        self.assertEqual(restored.tokenizer.vocab_size, 257)
        ref = _reference(self.trained3["params"], self.teacher_cfg)
        stage2 = _reference(self.trained["params"], self.teacher_cfg)
        self.assertEqual(restored.model_config.layer_pattern, ref.config.layer_pattern)
        rng = np.random.default_rng()
        for _ in range(2):
            ids = jnp.asarray(rng.integers(0, 257, size=(2, int(rng.integers(8, 40)))))
            got = logits(restored.model, ids)
            np.testing.assert_allclose(got, logits(ref, ids), rtol=1e-5, atol=1e-5)
            # Stage 3 moved the student: the loaded model is not Stage 2's.
            self.assertGreater(np.abs(got - logits(stage2, ids)).max(), 1e-3)
        # --step names a Stage-3 step; Stage 2's checkpoints are not the student's any more.
        self.assertEqual(restore.load_model(self.workdir3, step=step).step, step)
        with self.assertRaisesRegex(FileNotFoundError, rf"step=9999: no stage3 checkpoint at "
                                                       rf"that step in {self.workdir3} "):
            restore.load_model(self.workdir3, step=9999)

    def test_a_stage_folder_is_one_line_naming_the_workdir_to_pass(self):
        # It read "no config.json in checkpoint directory <w>/stage3 (expected ...)", and a
        # step folder's hint named the stage folder as the checkpoint to pass.
        w, step = self.workdir3, self.trained3["step"]
        where = "{} is the {} folder of the HALO workdir " + w + ", not a model: "
        cases = {
            "stage3": f"pass the HALO workdir, --checkpoint={w} (its student: stage3's newest "
                      f"checkpoint, step {step}; --step picks another of stage3's)",
            f"stage3/checkpoints/{step}": f"pass the HALO workdir and the step, --checkpoint="
                                          f"{w} --step={step} (stage3's checkpoints hold its "
                                          f"student)",
            "stage3/checkpoints": f"pass the HALO workdir, --checkpoint={w} (its student",
            "stage2": f"pass the HALO workdir, --checkpoint={w}, whose student is stage3's "
                      f"newest checkpoint (step {step}; Stage 2's checkpoints are not loaded "
                      f"once Stage 3 has one)",
            f"stage2/checkpoints/{step}": f"pass the HALO workdir, --checkpoint={w}, whose "
                                          f"student is stage3's",
            "stage1/checkpoints": f"pass the HALO workdir, --checkpoint={w}, whose student is "
                                  f"stage3's newest checkpoint (step {step}; stage1 holds no "
                                  f"student)",
        }
        for rel, expected in cases.items():
            path = os.path.join(w, rel)
            self.assertTrue(os.path.isdir(path), path)
            message = where.format(path, rel.split("/")[0]) + expected
            for fn in (restore.model_kind, restore.load_model, restore.load):
                with self.subTest(path=rel, fn=fn.__name__):
                    with self.assertRaises(FileNotFoundError) as cm:
                        fn(path)
                    self.assertTrue(str(cm.exception).startswith(message), str(cm.exception))
                    self.assertNotIn("\n", str(cm.exception))
        # What the message says to pass loads the student.
        self.assertEqual(restore.load_model(w, step=step).stage, "stage3")
        # A folder named like a stage outside a HALO workdir keeps the plain message.
        alone = os.path.join(self.create_tempdir().full_path, "stage2")
        os.makedirs(alone)
        with self.assertRaisesRegex(FileNotFoundError,
                                    rf"^no config.json in checkpoint directory {alone} "):
            restore.model_kind(alone)

    def test_a_calibration_applies_only_to_the_stage_it_calibrated(self):
        workdir = os.path.join(self.create_tempdir().full_path, "halo")
        shutil.copytree(self.workdir3, workdir)
        os.makedirs(os.path.join(workdir, "calibrate"))
        a = float(np.random.default_rng().choice([1.5, 2.0, 3.0]))
        for calibrated, expected in (("stage2", None), ("stage3", a)):
            with open(os.path.join(workdir, "calibrate", "calibration.json"), "w") as f:
                json.dump({"best": a, "student_params": calibrated}, f)
            restored = restore.load_model(workdir)
            self.assertEqual(restored.model_config.attention.logit_scaling_base, expected,
                             calibrated)
        ref = _reference(self.trained3["params"], self.teacher_cfg, logit_scaling_base=a)
        ids = jnp.asarray(np.random.default_rng(2).integers(0, 257, size=(2, 33)))
        np.testing.assert_allclose(logits(restored.model, ids), logits(ref, ids),
                                   rtol=1e-5, atol=1e-5)


class LoadStudentReadsNoTeacherTensorTest(_HaloFixture):
    """``load_student`` takes its teacher's config and tokenizer only: the Student it returns is
    the one it returned when it read the whole teacher (``experiment._load_teacher``), while
    every tensor reader (and the random teacher's initialisation) raises.

    A checkpoint teacher's workdir is the fixture's, copied, with ``config.json``'s
    ``teacher`` pointing at a GGUF file or HF directory of the random teacher's dimensions
    (random weights, a byte-level BPE of 258 tokens): the student's shapes are the same, so
    its checkpoints restore; its tokenizer is the teacher file's.
    """

    def workdir_with_teacher(self, kind, rng):
        workdir = os.path.join(self.create_tempdir().full_path, "halo")
        shutil.copytree(self.workdir, workdir)
        if kind == "random":
            return workdir
        t = self.teacher_cfg
        dims = dict(family="qwen3" if t.attention.qk_norm else "llama", vocab=t.vocab_size,
                    d=t.d_model, layers=t.num_layers, heads=t.attention.num_heads,
                    kv_heads=t.attention.num_kv_heads, head_dim=t.attention.head_dim,
                    mlp=t.mlp_hidden, tie=t.tie_embeddings, rope_theta=t.attention.rope_theta,
                    eps=t.norm_eps, merges=1)
        where = os.path.join(self.create_tempdir().full_path, "teacher")
        if kind == "gguf":
            path = loaders_test.write_gguf_file(where + ".gguf", rng, **dims)
        else:
            path = loaders_test.write_hf_dir(where, rng, **dims)
        with open(os.path.join(workdir, "config.json")) as f:
            values = json.load(f)
        values["teacher"].update(kind=kind, path=path)
        with open(os.path.join(workdir, "config.json"), "w") as f:
            json.dump(values, f)
        return workdir

    def whole_teacher_student(self, workdir, step):
        """``load_student`` as it was: the teacher read whole, its params dropped."""
        def whole(config):
            cfg, params, tokenizer = experiment._load_teacher(config)
            self.assertIsNotNone(params)
            return cfg, tokenizer

        with mock.patch.object(experiment, "_teacher_config", side_effect=whole):
            return experiment.load_student(workdir, step)

    def test_the_same_student_without_reading_the_teachers_tensors(self):
        rng = np.random.default_rng()
        for kind in ("random", "gguf", "hf"):
            with self.subTest(kind=kind):
                if kind == "hf" and not loaders_test.HAVE_SAFETENSORS:
                    self.skipTest(loaders_test.NO_SAFETENSORS)
                workdir = self.workdir_with_teacher(kind, rng)
                step = rng.choice([None, self.trained["step"]])
                before = self.whole_teacher_student(workdir, step)
                initialised = loaders_test.TensorReadError("stages.random_teacher called")
                with loaders_test.no_tensor_reads(), \
                        mock.patch.object(stages, "random_teacher", side_effect=initialised):
                    with self.assertRaises(loaders_test.TensorReadError):
                        self.whole_teacher_student(workdir, step)  # the patches bite
                    after = experiment.load_student(workdir, step)
                self.assertEqual(after.model_config, before.model_config)
                self.assertEqual((after.stage, after.step, after.logit_scaling_base),
                                 (before.stage, before.step, before.logit_scaling_base))
                self.assertEqual(after.step, self.trained["step"])
                leaves = jax.tree_util.tree_leaves_with_path(before.params)
                self.assertEqual(jax.tree_util.tree_structure(after.params),
                                 jax.tree_util.tree_structure(before.params))
                for (where, ref), got in zip(leaves, jax.tree_util.tree_leaves(after.params)):
                    self.assertEqual(got.dtype, ref.dtype, where)
                    np.testing.assert_array_equal(np.asarray(got), np.asarray(ref),
                                                  err_msg=str(where))
                self.assertEqual(type(after.tokenizer), type(before.tokenizer))
                self.assertEqual(after.tokenizer.kind,
                                 {"random": "byte", "gguf": "gguf", "hf": "huggingface"}[kind])
                for _ in range(3):
                    text = loaders_test.random_text(rng)
                    self.assertEqual(after.tokenizer.encode(text), before.tokenizer.encode(text))


@pytest.mark.entry
class HaloStudentBinariesTest(_HaloFixture):
    """generate.py and evaluate.py on the student, with the flags of any model."""

    def run_binary(self, binary, *flags):
        """``binary`` in a fork of a process that imported its modules (tests/binary_runs.py),
        compiling without most XLA optimizations as this process does (tests/conftest.py; as
        train_test's and sweep_test's binaries do): the compiles were most of these tests'
        time on CPU."""
        cmd = [sys.executable, os.path.join(ROOT, "experiments", binary), *flags]
        return binary_runs.run(cmd, env=binary_runs.fast_compile_env())

    def test_generate_runs_the_student(self):
        prompts = ["The", "A longer prompt than the first"]
        args = [f"--checkpoint={self.workdir}", "--max_new_tokens=4"]
        result = self.run_binary("generate.py", *args, *[f"--prompt={p}" for p in prompts])
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        lines = result.stdout.splitlines()
        rows = [i for i, line in enumerate(lines) if line == "-" * 80]
        self.assertLen(rows, 2, result.stdout)
        for row, prompt in zip(rows, prompts):
            self.assertTrue(lines[row - 1].startswith(prompt), result.stdout)

    def test_generate_and_evaluate_run_the_stage3_student(self):
        workdir3, trained3 = _stage3_workdir()
        result = self.run_binary("generate.py", f"--checkpoint={workdir3}",
                                 "--max_new_tokens=4", "--prompt=The")
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        self.assertIn("-" * 80, result.stdout.splitlines())
        out = self.create_tempdir().full_path
        result = self.run_binary(
            "evaluate.py", f"--checkpoint={workdir3}", "--tasks=perplexity",
            f"--data_dir={EVAL_DATA}", f"--output_dir={out}",
            "--perplexity_files=lm/wikitext-2-raw/wiki.test.raw", "--perplexity_window=64",
            "--perplexity_stride=64", "--perplexity_max_docs=1", "--batch_size=2")
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        self.assertIn(f"(HALO student, stage3 step {trained3['step']})", result.stdout)
        with open(os.path.join(out, "results.json")) as f:
            results = json.load(f)
        self.assertEqual({v["step"] for v in results.values()}, {trained3["step"]})

    def test_a_stage_folder_is_one_line_in_generate_and_halo(self):
        stage2 = os.path.join(self.workdir, "stage2")
        result = self.run_binary("generate.py", f"--checkpoint={stage2}", "--prompt=The")
        self.assertEqual(result.returncode, 1, result.stderr[-3000:])
        self.assertEqual(result.stderr.strip().splitlines(), [
            f"error: {stage2} is the stage2 folder of the HALO workdir {self.workdir}, not a "
            f"model: pass the HALO workdir, --checkpoint={self.workdir} (its student: stage2's "
            f"newest checkpoint, step {self.trained['step']}; --step picks another of "
            f"stage2's)"])
        # halo.py --workdir=<stage folder>: refused before anything is written there.
        before = sorted(os.listdir(stage2))
        config = os.path.join(ROOT, "configs", "halo_smollm2.py")
        result = self.run_binary("halo.py", f"--config={config}:tiny", f"--workdir={stage2}",
                                 "--stage=stage3")
        self.assertEqual(result.returncode, 1, result.stderr[-3000:])
        self.assertEqual(result.stderr.strip().splitlines(), [
            f"error: --workdir={stage2} is the stage2 folder of the HALO workdir "
            f"{self.workdir}, not a HALO workdir: pass --workdir={self.workdir} (each stage "
            f"writes its own folder there; --stage picks the stage)"])
        self.assertEqual(sorted(os.listdir(stage2)), before)
        result = self.run_binary("halo_report.py", f"--workdir={stage2}")
        self.assertEqual(result.returncode, 1, result.stderr[-3000:])
        self.assertEqual(result.stderr.strip().splitlines(), [
            f"error: {stage2} is the stage2 folder of the HALO workdir {self.workdir}: pass "
            f"--workdir={self.workdir}"])

    def test_evaluate_scores_perplexity_and_niah_on_the_student(self):
        out = self.create_tempdir().full_path
        result = self.run_binary(
            "evaluate.py", f"--checkpoint={self.workdir}", "--tasks=perplexity,niah_single_1",
            f"--data_dir={EVAL_DATA}", f"--output_dir={out}",
            "--perplexity_files=lm/wikitext-2-raw/wiki.test.raw", "--perplexity_window=64",
            "--perplexity_stride=64", "--perplexity_max_docs=2", "--niah_lengths=512",
            "--niah_depths=50", "--batch_size=2", "--max_len=512")
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        self.assertIn("(HALO student, stage2 step", result.stdout)
        with open(os.path.join(out, "results.json")) as f:
            results = json.load(f)
        self.assertEqual({v["step"] for v in results.values()}, {self.trained["step"]})
        self.assertTrue(any(k.startswith("perplexity:") for k in results), results)
        self.assertIn("niah_single_1", results)
        # The held-out split is a training run's; a HALO workdir is refused before loading.
        result = self.run_binary("evaluate.py", f"--checkpoint={self.workdir}",
                                 "--tasks=perplexity", f"--output_dir={out}")
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("a HALO workdir has none: pass text files", result.stderr)


if __name__ == "__main__":
    absltest.main()
