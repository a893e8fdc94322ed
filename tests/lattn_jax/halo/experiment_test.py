"""The HALO driver end to end on the tiny config (random teacher, byte tokenizer)."""

import copy
import dataclasses
import json
import os
import shlex
from unittest import mock

import pytest
from absl.testing import absltest
import jax
import numpy as np

from configs import halo_qwen3_1p7b
from configs import halo_smollm2
from lattn_jax import config as config_lib
from lattn_jax.data import pipeline
from lattn_jax.data import prepare
from lattn_jax.data import shards
from lattn_jax.halo import experiment
from lattn_jax.halo import report
from pallas_kernels.common import validation
from tests.lattn_jax.data import corpus
from tests.lattn_jax.halo import loaders_test


def _record_stage1_without(config, workdir, key):
    """Records ``config``'s Stage-1 options in ``workdir`` as a run from before option ``key``
    existed (the key left out of ``options.json``); returns the value that was left out."""
    os.makedirs(os.path.join(workdir, "stage1"))
    experiment._record_options(config, workdir, "stage1")
    path = os.path.join(workdir, "stage1", experiment.OPTIONS_FILE)
    with open(path) as f:
        recorded = json.load(f)
    value = recorded.pop(key)
    with open(path, "w") as f:
        json.dump(recorded, f)
    return value


class ConfigTest(absltest.TestCase):

    def test_configs_load(self):
        for cfg in (halo_smollm2.get_config(), halo_qwen3_1p7b.get_config(),
                    halo_smollm2.get_config("tiny"), halo_smollm2.get_config("h200")):
            self.assertEqual(cfg.stage2.temperature, 1.0)
            self.assertEqual(cfg.stage1.optim.weight_decay, 0.0)
            # Every measurement; the corpus's perplexity where the data are token directories,
            # niah_forced (a diagnosis of the NIAH misses) opt-in outside h200.
            self.assertEqual(set(cfg.report.measurements) | {"corpus_perplexity", "niah_forced"},
                             set(report.MEASUREMENTS))
            report.check_options(cfg.report)
        self.assertEqual(experiment.STAGES[-1], "report")
        cfg = cfg_h200 = halo_smollm2.get_config("h200")
        self.assertIn("corpus_perplexity", cfg.report.measurements)
        self.assertEqual(tuple(cfg.report.stage2_measurements),
                         ("perplexity", "corpus_perplexity"))
        # The report's perplexity text (WikiText-2 test) is not trained on: the open corpus.
        self.assertEqual(cfg.data.paths, (f"{halo_smollm2.DEFAULT_CORPUS}/train",))
        self.assertEqual(cfg.data.val_paths, (f"{halo_smollm2.DEFAULT_CORPUS}/validation",))
        self.assertIsNone(cfg.data.tokenizer_path)  # follows --config.teacher.path
        budget = {s: cfg[s].seq_len * cfg[s].batch_size * cfg[s].train.total_steps
                  for s in ("stage1", "stage2", "stage3")}
        # At least 160M tokens (1.2 per parameter), 14 / 42 / 44 % (spec §3.6).
        total = sum(budget.values())
        self.assertBetween(total, 160_000_000, 160_500_000)
        for stage, share in (("stage1", 0.14), ("stage2", 0.42), ("stage3", 0.44)):
            self.assertAlmostEqual(budget[stage] / total, share, delta=0.002)
        self.assertEqual(cfg.stage3.seq_len, 16_384)
        other = halo_smollm2.get_config("h200,corpus=/x/y")
        self.assertEqual(other.data.paths, ("/x/y/train",))
        # General prose up-weighted (the 2026-12-02b run); prose_weights=False reads it once.
        self.assertEqual(dict(cfg.data.source_weights), halo_smollm2.H200_SOURCE_WEIGHTS)
        self.assertTrue(all(w > 1 for w in halo_smollm2.H200_SOURCE_WEIGHTS.values()))
        self.assertIsNone(halo_smollm2.get_config("h200,prose_weights=False").data.source_weights)
        self.assertIsNone(cfg.stage2.source_weights)
        # Teacher-written text: Stages 1-2 read it, Stage 3 (16K windows) leaves it out.
        gen = halo_smollm2.get_config("h200,teacher_text=/g/t")
        self.assertEqual(gen.data.paths, (f"{halo_smollm2.DEFAULT_CORPUS}/train", "/g/t"))
        for stage, w in (("stage1", 3.0), ("stage2", 3.0), ("stage3", 0.0)):
            self.assertEqual(dict(gen[stage].source_weights),
                             {**halo_smollm2.H200_SOURCE_WEIGHTS, "teacher": w})
        gen = halo_smollm2.get_config("h200,teacher_text=/g/t,teacher_weight=7.5")
        self.assertEqual(gen.stage2.source_weights["teacher"], 7.5)
        self.assertEqual(gen.stage3.source_weights["teacher"], 0.0)
        with self.assertRaisesRegex(ValueError, "teacher_weight"):
            halo_smollm2.get_config("h200,teacher_text=/g/t,teacher_weight=0")
        # Stage 2 at longer windows: the same tokens per step and steps, Stage 1 and 3 unchanged.
        long2 = halo_smollm2.get_config("h200,stage2_len=2048")
        self.assertEqual((long2.stage2.seq_len, long2.stage2.batch_size), (2048, 24))
        self.assertEqual(long2.stage2.train.total_steps, cfg_h200.stage2.train.total_steps)
        self.assertEqual(long2.stage3.seq_len, 16_384)
        with self.assertRaisesRegex(ValueError, "stage2_len"):
            halo_smollm2.get_config("h200,stage2_len=768")
        cfg = halo_qwen3_1p7b.get_config()
        self.assertEqual((cfg.stage3.seq_len, cfg.stage3.train.total_steps), (16_384, 500))
        self.assertEqual(cfg.stage3.optim.min_lr_ratio, 1.0)


class Stage3TeacherKLConfigTest(absltest.TestCase):
    """``stage3.kl_weight`` / ``kl_len``: off by default, set by ``:h200,stage3_kl=...``, and
    passed to ``stages.run_stage3`` with the teacher."""

    def test_h200_arguments(self):
        for cfg in (halo_smollm2.get_config("tiny"), halo_smollm2.get_config("h200")):
            self.assertEqual((cfg.stage3.kl_weight, cfg.stage3.kl_len), (0.0, 8192))
        cfg = halo_smollm2.get_config("h200,stage3_kl=0.5,stage3_kl_len=4096")
        self.assertEqual((cfg.stage3.kl_weight, cfg.stage3.kl_len), (0.5, 4096))
        self.assertEqual(cfg.stage3.seq_len, 16_384)  # the CE's window is unchanged
        self.assertEqual(halo_smollm2.get_config("h200,stage3_kl=1").stage3.kl_weight, 1.0)
        for arg, name in (("stage3_kl=-0.5", "stage3_kl"), ("stage3_kl=1e999", "stage3_kl"),
                          ("stage3_kl_len=0", "stage3_kl_len"),
                          ("stage3_kl=0.5,stage3_kl_len=-8", "stage3_kl_len")):
            with self.assertRaisesRegex(ValueError, name):
                halo_smollm2.get_config("h200," + arg)

    def test_run_passes_the_options_and_the_teacher(self):
        cfg = halo_smollm2.get_config("tiny")
        cfg.hypenet.attention_layers = (1,)
        cfg.stage3.kl_weight, cfg.stage3.kl_len = 0.25, 32
        workdir = self.create_tempdir().full_path
        os.makedirs(os.path.join(workdir, "stage2"))  # (its parameters: the mock below)
        with mock.patch.object(experiment.stages, "latest_params", return_value={}), \
                mock.patch.object(experiment.stages, "run_stage3",
                                  return_value={"losses": [], "step": 0,
                                                "complete": False}) as run3:
            experiment.run(cfg, workdir, "stage3", print_fn=lambda s: None)
        kw = run3.call_args.kwargs
        teacher_cfg, teacher_params, _ = experiment.load_teacher(cfg)
        self.assertEqual((kw["kl_weight"], kw["kl_len"]), (0.25, 32))
        self.assertIs(kw["teacher_cfg"], teacher_cfg)
        self.assertIs(kw["teacher_params"], teacher_params)


class TeacherDtypeTest(absltest.TestCase):
    """A ``"random"`` teacher is cast to ``hypenet.dtype`` as a loaded one is."""

    def test_random_and_loaded_teachers_agree_on_the_compute_dtype(self):
        rng = np.random.default_rng()
        dtype = str(rng.choice(["bfloat16", "float16"]))
        cfg = halo_smollm2.get_config("tiny")
        cfg.hypenet.dtype = dtype
        r = cfg.teacher.random_model
        path = loaders_test.write_gguf_file(
            os.path.join(self.create_tempdir().full_path, "t.gguf"), rng, family="llama",
            vocab=r.vocab_size, d=r.d_model, layers=r.num_layers, heads=r.num_heads,
            kv_heads=r.num_kv_heads, head_dim=r.head_dim, mlp=r.mlp_hidden, tie=True,
            rope_theta=r.rope_theta, eps=1e-6, merges=1)
        loaded = copy.deepcopy(cfg)
        loaded.teacher.update(kind="gguf", path=path)
        teachers = {}
        for name, config in (("random", cfg), ("gguf", loaded)):
            with mock.patch.dict(experiment._TEACHERS, clear=True):
                model_cfg, params, _ = experiment.load_teacher(config)
            self.assertEqual(experiment._teacher_config(config)[0], model_cfg, name)
            teachers[name] = (model_cfg, params)
        for name, (model_cfg, params) in teachers.items():
            self.assertEqual((model_cfg.dtype, model_cfg.param_dtype), (dtype, "float32"), name)
            kernel = params["blocks"][0]["mixer"]["qkv_proj"]["kernel"]
            self.assertEqual(kernel.dtype, np.dtype(dtype), name)  # matrices in the compute dtype
            self.assertEqual(params["final_norm"]["scale"].dtype, np.float32, name)
        self.assertEqual(teachers["random"][0].layer_pattern, teachers["gguf"][0].layer_pattern)


class StageDataTest(absltest.TestCase):
    """``data_for``: a stage's ``source_weights`` replace ``data.source_weights`` for it alone."""

    def test_stage_mixture(self):
        root = self.create_tempdir().full_path
        text = os.path.join(root, "text")
        os.makedirs(text)
        paragraphs = corpus.shakespeare_paragraphs(60)
        for i in range(2):  # shards shard-00000 and shard-00001: 30 paragraphs each
            with open(os.path.join(text, f"part{i}.txt"), "w", encoding="utf-8") as f:
                f.write("\n\n".join(paragraphs[30 * i:30 * (i + 1)]) + "\n")
        shard_dir = os.path.join(root, "shards")
        prepare.prepare_corpus([text], shard_dir, tokenizer="byte", workers=0, progress=False,
                               print_fn=lambda _: None)
        cfg = halo_smollm2.get_config("tiny")
        cfg.data.update(paths=(shard_dir,), format="tokens", tokenizer="byte", val_fraction=0.1,
                        source_weights={"shard-00000": 2.0})
        cfg.stage2.source_weights = {"shard-00001": 0.0}
        docs = shards.open_corpus([shard_dir])
        train_idx, _ = pipeline.split_documents(docs.num_documents, 0.1, cfg.data.seed)
        tokens = [int((docs.doc_len[train_idx[docs.doc_shard[train_idx] == k]] + 1).sum())
                  for k in (0, 1)]
        self.assertTrue(all(tokens))
        # Stage 1 follows data.source_weights; Stage 2 its own (shard 1 out, shard 0 once).
        self.assertEqual(experiment.data_for(cfg, cfg.stage1).stats.train_tokens,
                         2 * tokens[0] + tokens[1])
        self.assertEqual(experiment.data_for(cfg, cfg.stage2).stats.train_tokens, tokens[0])


class ResumeOptionsTest(absltest.TestCase):
    """``check_resume``: a stage that ran with other options is neither resumed nor reused."""

    def test_changed_options_are_refused_and_free_keys_are_not(self):
        workdir = self.create_tempdir().full_path
        cfg = halo_smollm2.get_config("h200,stage2_len=2048")
        for stage in ("stage1", "stage2"):
            os.makedirs(os.path.join(workdir, stage))
            experiment._record_options(cfg, workdir, stage)
        recorded = json.load(open(os.path.join(workdir, "stage2", experiment.OPTIONS_FILE)))
        self.assertEqual(recorded["stage2.seq_len"], 2048)
        self.assertNotIn("teacher.path", recorded)  # a path: free to move between machines
        experiment.check_resume(cfg, workdir, experiment.STAGES)  # same options: fine
        # Where the files are, how often to save, which kernels: free to change.
        moved = halo_smollm2.get_config("h200,stage2_len=2048,corpus=/elsewhere")
        moved.teacher.path = "/other/teacher.gguf"
        moved.stage2.train.checkpoint_every = 7
        moved.hypenet.lightning_implementation = "pallas"
        # The same products formed otherwise (MOSAIC_GPU.md Sec. 46.2's packed SwiGLU).
        self.assertIs(cfg.hypenet.swiglu_packed, False)
        self.assertNotIn("hypenet.swiglu_packed", recorded)
        moved.hypenet.swiglu_packed = True
        moved.hypenet.split_projections = not cfg.hypenet.split_projections
        experiment.check_resume(moved, workdir, experiment.STAGES)
        # Stage 2 started at 512-token windows would continue at 2,048: refused, named.
        other = halo_smollm2.get_config("h200,stage2_len=512")
        with self.assertRaisesRegex(ValueError, r"stage2 has started in .* stage2\.batch_size: "
                                                r"24 -> 96, stage2\.seq_len: 2048 -> 512"):
            experiment.check_resume(other, workdir, ("stage2",))
        # A done stage 2 would be skipped and reused: refused too; check_options runs it.
        with open(os.path.join(workdir, "stage2", experiment.DONE_FILE), "w") as f:
            f.write("{}")
        with self.assertRaisesRegex(ValueError, r"stage2 is done in .*delete .*options\.json"):
            experiment.check_options(other, workdir, experiment.STAGES)
        # Stage 3's options do not touch stages 1-2 (a Stage-3 rerun keeps them).
        kl = halo_smollm2.get_config("h200,stage2_len=2048,stage3_kl=1.0")
        experiment.check_resume(kl, workdir, experiment.STAGES)
        # Deleting the record accepts the change; nothing else was touched.
        os.remove(os.path.join(workdir, "stage2", experiment.OPTIONS_FILE))
        experiment.check_resume(other, workdir, experiment.STAGES)
        self.assertTrue(os.path.exists(os.path.join(workdir, "stage2", experiment.DONE_FILE)))

    def test_the_selection_bootstrap_options_do_not_block_a_resume(self):
        workdir = self.create_tempdir().full_path
        cfg = halo_smollm2.get_config("h200,stage2_len=2048")
        os.makedirs(os.path.join(workdir, "select"))
        experiment._record_options(cfg, workdir, "select")
        path = os.path.join(workdir, "select", experiment.OPTIONS_FILE)
        recorded = json.load(open(path))
        self.assertEqual(recorded["select.csr_items_per_task"], 570)
        # A record written before the bootstrap existed (2026-12-04 newcomer pass: refused).
        with open(path, "w") as f:
            json.dump({k: v for k, v in recorded.items() if "bootstrap" not in k}, f)
        fewer = halo_smollm2.get_config("h200,stage2_len=2048")
        fewer.select.bootstrap_resamples = 50
        fewer.select.bootstrap_seed = 3
        experiment.check_resume(fewer, workdir, ("select",))
        # A record that has them, with other values: free too.
        with open(path, "w") as f:
            json.dump({**recorded, "select.bootstrap_resamples": 1000}, f)
        experiment.check_resume(fewer, workdir, ("select",))
        # What the layers' records depend on is still bound.
        other = halo_smollm2.get_config("h200,stage2_len=2048")
        other.select.csr_items_per_task = 200
        with self.assertRaisesRegex(ValueError, r"select\.csr_items_per_task: 570 -> 200"):
            experiment.check_resume(other, workdir, ("select",))
        for bad in (-1, True):
            bad_cfg = halo_smollm2.get_config("h200,stage2_len=2048")
            bad_cfg.select.bootstrap_resamples = bad
            with self.assertRaisesRegex(ValueError, r"select\.bootstrap_resamples must be an "
                                                    r"int >= 0"):
                experiment.check_options(bad_cfg, self.create_tempdir().full_path,
                                         experiment.STAGES)

    def test_lightning_alibi_max_bias_reaches_the_student_and_is_checked(self):
        workdir = self.create_tempdir().full_path
        cfg = halo_smollm2.get_config("h200,stage2_len=2048")
        self.assertEqual(cfg.hypenet.lightning_alibi_max_bias, 8.0)
        teacher = config_lib.ModelConfig(d_model=64, layer_pattern=("attn",) * 4)
        self.assertEqual(experiment.student_config(cfg, teacher, (1,)).lightning.alibi_max_bias,
                         8.0)
        # A record from before the option existed resumes under the value it used (8)...
        self.assertEqual(
            _record_stage1_without(cfg, workdir, "hypenet.lightning_alibi_max_bias"), 8.0)
        experiment.check_resume(cfg, workdir, ("stage1",))
        # ...and refuses another one, which changes every Lightning layer's decays.
        longer = halo_smollm2.get_config("h200,stage2_len=2048")
        longer.hypenet.lightning_alibi_max_bias = 12.0
        self.assertEqual(
            experiment.student_config(longer, teacher, (1,)).lightning.alibi_max_bias, 12.0)
        with self.assertRaisesRegex(ValueError, r"stage1 ran in .* with hypenet\."
                                                r"lightning_alibi_max_bias=8\.0"):
            experiment.check_resume(longer, workdir, ("stage1",))
        # A later stage (or calibrate and the report) built on a Stage 1 of another value is
        # refused too, though Stage 1 itself does not run (2026-12-03 newcomer pass: it ran).
        for stages_now in (("stage2",), ("calibrate", "report")):
            with self.subTest(stages=stages_now), self.assertRaisesRegex(
                    ValueError, r"stage1 ran in .* every stage built on it must use the same "
                                r"value \(now 12\.0\)"):
                experiment.check_options(longer, workdir, stages_now)
        # The evenly spaced ablation (other attention layers from the same Stage 1) is free.
        even = halo_smollm2.get_config("h200,stage2_len=2048")
        even.hypenet.attention_layers = (3, 7, 11, 15, 19, 23, 27)
        experiment.check_options(even, workdir, ("stage2",))

    def test_lightning_qk_norm_reaches_the_student_and_binds_from_stage1_on(self):
        workdir = self.create_tempdir().full_path
        teacher = config_lib.ModelConfig(d_model=64, layer_pattern=("attn",) * 4)
        cfg = halo_smollm2.get_config("h200,stage2_len=2048")
        self.assertIs(cfg.hypenet.lightning_qk_norm, True)
        self.assertTrue(experiment.student_config(cfg, teacher, (1,)).lightning.qk_norm)
        plain = halo_smollm2.get_config("h200,stage2_len=2048")
        plain.hypenet.lightning_qk_norm = False
        self.assertFalse(experiment.student_config(plain, teacher, (1,)).lightning.qk_norm)
        # A Stage 1 recorded before the option existed ran with the norms.
        self.assertIs(_record_stage1_without(cfg, workdir, "hypenet.lightning_qk_norm"), True)
        experiment.check_options(cfg, workdir, ("stage2",))
        # Every later stage reads Stage 1's Lightning weights: the other value is refused.
        for stages_now in (("stage1",), ("stage2",), ("calibrate", "report")):
            with self.subTest(stages=stages_now), self.assertRaisesRegex(
                    ValueError, r"stage1 ran in .* with hypenet\.lightning_qk_norm=True, and "
                                r"every stage built on it must use the same value \(now False\)"):
                experiment.check_options(plain, workdir, stages_now)

    def test_attention_rope_reaches_the_student_and_binds_from_stage2_on(self):
        """hypenet.attention_rope (the HyPE ablation: RoPE kept in the attention layers) builds
        "attn" instead of "attn_nope" layers; a Stage 2 of either kind may follow one Stage 1
        (which trains no attention layer), but Stage 3, calibrate and the report must use
        Stage 2's value."""
        workdir = self.create_tempdir().full_path
        teacher = config_lib.ModelConfig(d_model=64, layer_pattern=("attn",) * 4)
        nope = halo_smollm2.get_config("h200,stage2_len=2048")
        self.assertIs(nope.hypenet.attention_rope, False)
        self.assertEqual(experiment.student_config(nope, teacher, (1,)).layer_pattern,
                         ("lightning", "attn_nope", "lightning", "lightning"))
        rope = halo_smollm2.get_config("h200,stage2_len=2048")
        rope.hypenet.attention_rope = True
        self.assertEqual(experiment.student_config(rope, teacher, (1,)).layer_pattern,
                         ("lightning", "attn", "lightning", "lightning"))
        # The report's model line names the form the student has.
        self.assertEqual(experiment.attention_form(
            experiment.student_config(rope, teacher, (1, 3))), "RoPE + output gate")
        self.assertEqual(experiment.attention_form(
            experiment.student_config(nope, teacher, (1, 3))), "NoPE + output gate")
        mixed = dataclasses.replace(experiment.student_config(rope, teacher, (1,)),
                                    layer_pattern=("attn", "attn_nope", "lightning", "lightning"))
        with self.assertRaisesRegex(ValueError, r"one kind of attention layer"):
            experiment.attention_form(mixed)
        # A Stage 1 recorded before the option existed (no key): Stage 2 may take either.
        self.assertIs(_record_stage1_without(nope, workdir, "hypenet.attention_rope"), False)
        experiment.check_options(rope, workdir, ("stage2",))
        # Once Stage 2 ran with RoPE, the later stages must keep it.
        os.makedirs(os.path.join(workdir, "stage2"))
        experiment._record_options(rope, workdir, "stage2")
        experiment.check_options(rope, workdir, ("stage3", "calibrate", "report"))
        for stages_now in (("stage3",), ("calibrate", "report")):
            with self.subTest(stages=stages_now), self.assertRaisesRegex(
                    ValueError, r"stage2 ran in .* with hypenet\.attention_rope=True, and every "
                                r"stage built on it must use the same value \(now False\)"):
                experiment.check_options(nope, workdir, stages_now)

    def _assert_refused_up_front(self, section, key, bads, message):
        """Each bad value of ``config.<section>.<key>`` stops check_options with ``message``
        before any stage directory exists."""
        workdir = os.path.join(self.create_tempdir().full_path, "run")
        for bad in bads:
            cfg = halo_smollm2.get_config("h200,stage2_len=2048")
            cfg[section][key] = bad
            with self.subTest(bad=bad), self.assertRaisesRegex(ValueError, message):
                experiment.check_options(cfg, workdir, experiment.STAGES)
        self.assertFalse(os.path.exists(workdir))
        return workdir

    def test_a_training_config_or_workdir_is_refused_before_anything_runs(self):
        # 2026-12-04 newcomer pass: halo.py with configs/default.py ended in a 37-line
        # traceback; a HALO stage in a training run's workdir replaced its config.json.
        from configs import default  # noqa: PLC0415
        workdir = self.create_tempdir().full_path
        with self.assertRaisesRegex(
                config_lib.ConfigError,
                r"^--config is not a HALO config: it has no teacher, hypenet, stage1"):
            experiment.check_options(default.get_config(), workdir, experiment.STAGES)
        training = {"model": {"d_model": 64}, "data": {}, "optim": {}, "train": {}}
        path = os.path.join(workdir, "config.json")
        with open(path, "w") as f:
            json.dump(training, f)
        cfg = halo_smollm2.get_config("h200,stage2_len=2048")
        with self.assertRaisesRegex(ValueError, f"^{path} is a training run's config, not a "
                                                f"HALO pipeline's .*Use another --workdir"):
            experiment.check_options(cfg, workdir, experiment.STAGES)
        with open(path) as f:
            self.assertEqual(json.load(f), training)  # untouched
        with open(path, "w") as f:
            f.write('{"teacher": ')
        with self.assertRaisesRegex(ValueError, "is not valid JSON"):
            experiment.check_options(cfg, workdir, experiment.STAGES)
        with open(path, "w") as f:
            json.dump({"teacher": {}}, f)  # a HALO workdir's: accepted
        experiment.check_options(cfg, workdir, experiment.STAGES)

    def test_bad_lightning_alibi_max_bias_stops_before_anything_runs(self):
        self._assert_refused_up_front(
            "hypenet", "lightning_alibi_max_bias", (0.0, -1.0, float("nan"), float("inf"), 2000.0),
            r"^hypenet\.lightning_alibi_max_bias: max_bias")

    def test_bad_lightning_implementation_names_the_hypenet_option(self):
        # It named model.lightning.implementation, an option a HALO config does not have.
        rng = np.random.default_rng()
        bad = "".join(rng.choice(list("xyzq_"), size=6))
        self._assert_refused_up_front(
            "hypenet", "lightning_implementation", (bad, "Pallas", ""),
            r"^hypenet\.lightning_implementation='[^']*'; choose from auto, chunked, ")
        cfg = halo_smollm2.get_config("tiny")
        cfg.hypenet.lightning_implementation = bad
        with self.assertRaisesRegex(config_lib.ConfigError,
                                    rf"^hypenet\.lightning_implementation='{bad}'; choose"):
            experiment.student_config(cfg, experiment.load_teacher(cfg)[0], (0,))

    @pytest.mark.skipif(jax.default_backend() != "cpu", reason="the kernels run off CPU")
    def test_a_kernel_that_cannot_run_here_names_the_hypenet_option(self):
        # Stage 1 calls the Lightning mixer outside Block.mix: the op's error named no option.
        impl = str(np.random.default_rng().choice(["pallas", "mosaic_gpu"]))
        cfg = halo_smollm2.get_config("tiny")
        cfg.hypenet.lightning_implementation = impl
        with self.assertRaisesRegex(
                validation.UnsupportedImplementationError,
                rf"^hypenet\.lightning_implementation='{impl}' is not supported here: "
                rf"lightning_attention: implementation='{impl}' cannot run this call: [^\n]*$"):
            experiment.run(cfg, self.create_tempdir().full_path, "stage1",
                           print_fn=lambda s: None)
        # Block.mix's naming of the trainer's option (stages 2, 3, the report) is replaced.
        inner = validation.UnsupportedImplementationError(
            f"model.lightning.implementation={impl!r} is not supported here: "
            f"lightning_attention: no")
        self.assertEqual(str(experiment.name_lightning_implementation(cfg, inner)),
                         f"hypenet.lightning_implementation={impl!r} is not supported here: "
                         f"lightning_attention: no")

    def test_stage2_copied_lr_scale_is_checked_first_and_binds_stage2(self):
        workdir = self._assert_refused_up_front(  # (ml_collections itself refuses a str)
            "stage2", "copied_lr_scale", (0.0, -1.0, float("nan"), float("inf")),
            r"^stage2\.copied_lr_scale must be a finite number > 0")
        # A Stage 2 started at one rate for the whole student does not resume with two.
        cfg = halo_smollm2.get_config("h200,stage2_len=2048")
        self.assertEqual(cfg.stage2.copied_lr_scale, 1.0)
        os.makedirs(os.path.join(workdir, "stage2"))
        experiment._record_options(cfg, workdir, "stage2")
        cfg.stage2.copied_lr_scale = 0.1
        with self.assertRaisesRegex(ValueError, r"stage2\.copied_lr_scale: 1\.0 -> 0\.1"):
            experiment.check_resume(cfg, workdir, ("stage2",))

    def test_stage2_temperature_is_checked_first(self):
        self._assert_refused_up_front(
            "stage2", "temperature", (0.0, -1.0, float("nan"), float("inf")),
            r"^stage2\.temperature must be a finite number > 0")

    def test_optimizer_layout_is_free_for_a_done_stage_only(self):
        # optim.flatten changes the optimizer state's layout: a started stage cannot resume
        # under the other layout, but a done one is only read for its params.
        workdir = self.create_tempdir().full_path
        cfg = halo_smollm2.get_config("h200,stage2_len=2048")
        os.makedirs(os.path.join(workdir, "stage2"))
        experiment._record_options(cfg, workdir, "stage2")
        self.assertTrue(cfg.stage2.optim.flatten)
        unflat = halo_smollm2.get_config("h200,stage2_len=2048")
        unflat.stage2.optim.flatten = False
        with self.assertRaisesRegex(ValueError, r"stage2 has started in .*"
                                                r"stage2\.optim\.flatten: True -> False"):
            experiment.check_resume(unflat, workdir, ("stage2",))
        with open(os.path.join(workdir, "stage2", experiment.DONE_FILE), "w") as f:
            f.write("{}")
        experiment.check_resume(unflat, workdir, ("stage2",))
        # A record from before the option existed (key absent) is the same case.
        path = os.path.join(workdir, "stage2", experiment.OPTIONS_FILE)
        recorded = json.load(open(path))
        del recorded["stage2.optim.flatten"]
        with open(path, "w") as f:
            json.dump(recorded, f)
        experiment.check_resume(cfg, workdir, ("stage2",))
        unflat.stage2.seq_len = 512  # other keys still count
        with self.assertRaisesRegex(ValueError, r"stage2 is done in .*stage2\.seq_len"):
            experiment.check_resume(unflat, workdir, ("stage2",))

    def test_rerunning_a_done_stage_needs_its_layout(self):
        # halo.py --stage=stage2 on a done stage restores its whole checkpoint (optimizer state
        # included): under the other optim.flatten that was an orbax "Structure mismatch".
        workdir = self.create_tempdir().full_path
        cfg = halo_smollm2.get_config("h200,stage2_len=2048")
        os.makedirs(os.path.join(workdir, "stage2"))
        experiment._record_options(cfg, workdir, "stage2")
        with open(os.path.join(workdir, "stage2", experiment.DONE_FILE), "w") as f:
            f.write("{}")
        unflat = halo_smollm2.get_config("h200,stage2_len=2048")
        unflat.stage2.optim.flatten = False
        experiment.check_resume(unflat, workdir, ("stage2",))  # reused as done: fine
        with self.assertRaisesRegex(ValueError, r"stage2 is done in .*stage2\.optim\.flatten: "
                                                r"True -> False; .*run it with the recorded"):
            experiment.run(unflat, workdir, "stage2", print_fn=lambda s: None)
        self.assertFalse(os.path.exists(os.path.join(workdir, "config.json")))  # nothing ran


@pytest.mark.entry
@pytest.mark.slow  # ~40 s on 2 cores; each stage's loss and resume is in stages_test.py
class PipelineTest(absltest.TestCase):

    def test_all_stages_run_and_resume(self):
        workdir = self.create_tempdir().full_path
        cfg = halo_smollm2.get_config("tiny")
        quiet = dict(print_fn=lambda s: None)
        out1 = experiment.run(cfg, workdir, "stage1", **quiet)
        self.assertEqual(out1["step"], 4)
        again = experiment.run(cfg, workdir, "stage1", **quiet)
        self.assertEqual((again["step"], again["losses"]), (4, []))
        sel = experiment.run(cfg, workdir, "select", **quiet)
        self.assertLen(sel["attention_layers"], 1)
        with open(os.path.join(workdir, "select", "selection.json")) as f:
            self.assertEqual(json.load(f)["attention_layers"], sel["attention_layers"])
        self.assertLen(experiment.run(cfg, workdir, "stage2", **quiet)["losses"], 4)
        self.assertLen(experiment.run(cfg, workdir, "stage3", **quiet)["losses"], 4)
        # Calibrated beyond Stage 3's window, as the h200 config does: two position buckets.
        s3_len = cfg.stage3.seq_len
        cfg.calibrate.seq_len = 2 * s3_len
        cal = experiment.run(cfg, workdir, "calibrate", **quiet)
        self.assertIn(cal["best"], (None, 500.0))
        self.assertEqual(cal["position_buckets"], [[0, s3_len], [s3_len, 2 * s3_len]])
        self.assertEqual(cal["seq_len"], 2 * s3_len)
        self.assertTrue(all(v is not None for v in cal["bucket_losses"]["None"]))
        with self.assertRaisesRegex(ValueError, "unknown stage"):
            experiment.run(cfg, workdir, "stage4", **quiet)


class StageFolderHintTest(absltest.TestCase):

    def test_the_workdir_to_pass_is_quoted_for_the_shell(self):
        # "pass --workdir=<path>" was not quoted: a path with a space split into two words.
        workdir = os.path.join(self.create_tempdir().full_path, "halo run é")
        os.makedirs(os.path.join(workdir, "stage2"))
        with open(os.path.join(workdir, "config.json"), "w") as f:
            json.dump({"teacher": {}, "hypenet": {}}, f)
        with self.assertRaises(ValueError) as ctx:
            experiment.check_workdir_kind(os.path.join(workdir, "stage2"))
        hint = f"pass --workdir={shlex.quote(workdir)} (each stage"
        self.assertIn(hint, str(ctx.exception))
        self.assertEqual(shlex.split(hint.split(" (")[0]), ["pass", f"--workdir={workdir}"])


if __name__ == "__main__":
    absltest.main()
