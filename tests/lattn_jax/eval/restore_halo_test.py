"""``restore.load_model`` on a HALO workdir: the converted student, loadable by ``generate.py``
and ``evaluate.py`` with the flags of any model.

The fixture runs the real pipeline (``experiment.run``: Stage 1, then Stage 2) on the ``tiny``
config's random teacher, 2 steps each; the reference is the params Stage 2's training loop
returned in memory, built into a model from the HypeNet config directly (not through a
checkpoint, nor through ``load_student``).
"""

import dataclasses
import functools
import json
import os
import shutil
import sys
import tempfile
from unittest import mock

import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest

from configs import halo_smollm2
from lattn_jax.eval import restore
from lattn_jax.halo import experiment, hypenet, loaders, stages
from tests import binary_runs

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
EVAL_DATA = os.path.join(os.path.dirname(__file__), "testdata", "eval_data")
ATTENTION_LAYERS = (1,)


def _config():
    cfg = halo_smollm2.get_config("tiny")
    cfg.hypenet.attention_layers = ATTENTION_LAYERS
    for stage in ("stage1", "stage2"):
        cfg[stage].train.total_steps = 2
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


@functools.lru_cache(maxsize=None)
def _student_workdir():
    """``(workdir, Stage 2's returned state, teacher config)``, made once per process."""
    os.makedirs(absltest.TEST_TMPDIR.value, exist_ok=True)
    workdir = os.path.join(tempfile.mkdtemp(dir=absltest.TEST_TMPDIR.value), "halo-student")
    cfg = _config()
    quiet = dict(print_fn=lambda s: None)
    experiment.run(cfg, workdir, "stage1", **quiet)
    trained = {}
    real = stages.run_stage2

    def keep(**kw):
        out = real(**kw)
        trained.update(out)
        return out

    with mock.patch.object(experiment.stages, "run_stage2", side_effect=keep):
        experiment.run(cfg, workdir, "stage2", **quiet)
    return workdir, trained, experiment.load_teacher(cfg)[0]


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
            np.testing.assert_allclose(np.asarray(restored.model(ids)), np.asarray(ref(ids)),
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
        logits = np.asarray(restored.model(ids))
        np.testing.assert_allclose(logits, np.asarray(ref(ids)), rtol=1e-5, atol=1e-5)
        unscaled = _reference(self.trained["params"], self.teacher_cfg)
        self.assertGreater(np.abs(logits - np.asarray(unscaled(ids))).max(), 1e-4)
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
        self.assertFalse(os.path.exists(os.path.join(workdir, "stage2")))  # nothing created


@pytest.mark.entry
class HaloStudentBinariesTest(_HaloFixture):
    """generate.py and evaluate.py on the student, with the flags of any model."""

    def run_binary(self, binary, *flags):
        cmd = [sys.executable, os.path.join(ROOT, "experiments", binary), *flags]
        return binary_runs.run(cmd)

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
