"""The HALO report stage on the tiny config, its measurements, and the results page."""

import dataclasses
import functools
import json
import math
import os
import random
import re
import shutil
import tempfile
import time
from unittest import mock

import numpy as np
from absl.testing import absltest

from configs import halo_smollm2
from lattn_jax.data import tokenizers as tok_lib
from lattn_jax.eval import niah
from lattn_jax.halo import experiment
from lattn_jax.halo import hypenet
from lattn_jax.halo import loaders
from lattn_jax.halo import report as report_lib
from lattn_jax.halo import stages
from tests.lattn_jax.halo import hypenet_test
from tests.lattn_jax.halo import selection_test

QUIET = dict(print_fn=lambda s: None)


def write_piqa(data_dir, n=4):
    """A tiny ``eval/piqa`` in the original format."""
    os.makedirs(os.path.join(data_dir, "eval", "piqa"), exist_ok=True)
    with open(os.path.join(data_dir, "eval", "piqa", "valid.jsonl"), "w") as f:
        for i in range(n):
            f.write(json.dumps({"goal": f"How do I open jar {i}?", "sol1": "Twist the lid.",
                                "sol2": "Eat the jar."}) + "\n")
    with open(os.path.join(data_dir, "eval", "piqa", "valid-labels.lst"), "w") as f:
        f.write("0\n" * n)


def tiny_config(data_dir, measurements):
    cfg = halo_smollm2.get_config("tiny")
    cfg.teacher.random_model.num_layers = 2  # compiles dominate: fewer layers, faster test
    cfg.hypenet.attention_layers = (1,)  # no selection sweep
    for stage in ("stage1", "stage2"):
        cfg[stage].train.total_steps = 1
    cfg.report.update(data_dir=data_dir, measurements=measurements, perplexity_max_docs=1)
    return cfg


@functools.lru_cache(maxsize=None)
def _tiny_stages():
    """``(workdir, {stage: experiment.run's summary})``: Stage 1 and Stage 2 of
    :func:`tiny_config`, run once per process for the report tests, which copy the workdir
    (the report options are not Stage 1's or 2's: the report runs with each test's own)."""
    os.makedirs(absltest.TEST_TMPDIR.value, exist_ok=True)
    parent = tempfile.mkdtemp(dir=absltest.TEST_TMPDIR.value)
    workdir = os.path.join(parent, "stages")
    cfg = tiny_config(os.path.join(parent, "unused-data"), ("perplexity",))
    return workdir, {stage: experiment.run(cfg, workdir, stage, **QUIET)
                     for stage in ("stage1", "stage2")}


def copy_of_tiny_stages(test):
    """A workdir of its own for ``test`` in which the tiny Stage 1 and Stage 2 are done."""
    source, outs = _tiny_stages()
    for stage in ("stage1", "stage2"):
        test.assertTrue(outs[stage]["complete"])
    workdir = os.path.join(test.create_tempdir().full_path, "halo")
    shutil.copytree(source, workdir)
    for stage in ("stage1", "stage2"):
        test.assertTrue(experiment.is_done(workdir, stage))
    return workdir


class ReportStageTest(absltest.TestCase):

    def test_report_after_the_tiny_stages_resumes_and_renders(self):
        workdir = copy_of_tiny_stages(self)
        cfg = tiny_config(self.create_tempdir().full_path, ("perplexity", "niah"))
        # A deadline already past: nothing measured, not done, resumable.
        out = experiment.run(cfg, workdir, "report", deadline=time.time() - 1.0, **QUIET)
        self.assertFalse(out["complete"])
        self.assertFalse(experiment.is_done(workdir, "report"))
        out = experiment.run(cfg, workdir, "report", **QUIET)
        self.assertTrue(out["complete"])
        self.assertTrue(experiment.is_done(workdir, "report"))
        rep = report_lib.read_json(out["report"])
        for name in ("teacher", "student"):
            ppl = rep["results"]["perplexity"][name]
            self.assertBetween(ppl["token_perplexity"], 1.0, 257.0 * 1.5)
            r = rep["results"]["niah"][name]["niah_single_1"]
            self.assertEqual(np.shape(r["grid"]), (2, 2))  # lengths (448, 640) x 2 depths
            self.assertTrue(np.all((np.asarray(r["grid"]) >= 0) & (np.asarray(r["grid"]) <= 1)))
            self.assertEqual(r["per_length_n"], {"448": 2, "640": 2})
            p = r["per_length"]["640"]
            self.assertAlmostEqual(r["per_length_se"]["640"], math.sqrt(p * (1 - p) / 2))
            self.assertEqual(r["short"]["lengths"], [448])  # niah_short_max_len=448
            self.assertEqual(r["long"]["lengths"], [640])
            # niah_batch_tokens=900: 2 rows of 448 tokens, 1 row of 640 (2 batches).
            stats = rep["details"]["niah"][name]["niah"]["per_part"]
            self.assertEqual((stats["448"]["niah_single_1"]["batch_size"],
                              stats["448"]["niah_single_1"]["batches"]), (2, 1))
            self.assertEqual((stats["640"]["niah_single_1"]["batch_size"],
                              stats["640"]["niah_single_1"]["batches"]), (1, 2))
        # One line per finished NIAH part (model, task, length).
        parts = report_lib.read_jsonl(os.path.join(workdir, "report", report_lib.NIAH_PARTS))
        self.assertEqual(sorted((r["model"], r["length"]) for r in parts),
                         [("student", 448), ("student", 640), ("teacher", 448),
                          ("teacher", 640)])
        self.assertEqual(rep["meta"]["attention_layers"], [1])
        self.assertEqual(rep["meta"]["student_params"], "stage2")  # no stage3 checkpoint
        # Measurements already in report.json are not repeated.
        seconds = dict(rep["seconds"])
        experiment.run(cfg, workdir, "report", **QUIET)
        self.assertEqual(report_lib.read_json(out["report"])["seconds"], seconds)
        page = report_lib.render_markdown(workdir)
        self.assertIn("| stage1 | per-layer MSE", page)
        self.assertIn("| perplexity (wiki.test.raw, window 64) | token_perplexity |", page)
        self.assertIn("niah_single_1, student (string_match_all, 1 prompts per cell", page)
        self.assertIn("NIAH summary", page)
        self.assertIn("| niah_single_1 (n=2 per length) | string_match_all @ 640 |", page)
        with open(os.path.join(workdir, "report", report_lib.REPORT_MD)) as f:
            self.assertIn("token_perplexity", f.read())


class MeasurementsTest(absltest.TestCase):

    def test_speed_memory_and_commonsense(self):
        data_dir = self.create_tempdir().full_path
        write_piqa(data_dir)
        # Byte tokens; padded prefills; two layers (compiles dominate): the student is one
        # Lightning and one attention layer.
        cfg = dataclasses.replace(hypenet_test.tiny_teacher_config(), vocab_size=257,
                                  use_segment_ids=True, layer_pattern=("attn",) * 2)
        params = stages.random_teacher(cfg, seed=0)
        student_cfg = dataclasses.replace(hypenet.hypenet_config(cfg, [1]), use_segment_ids=True)
        student_params = hypenet.convert(params, cfg, student_cfg)
        models = {"teacher": (loaders.build_model(cfg, params), "tiny teacher"),
                  "student": (loaders.build_model(student_cfg, student_params), "tiny student")}
        options = halo_smollm2.get_config("tiny").report
        options.update(data_dir=data_dir, measurements=("speed", "commonsense"))
        stage_dir = self.create_tempdir().full_path
        rep = report_lib.run_report(options=options, stage_dir=stage_dir, models=models,
                                    tokenizer=tok_lib.ByteTokenizer(), meta={}, **QUIET)
        self.assertTrue(rep["complete"])
        for name in ("teacher", "student"):
            speed = rep["results"]["speed"][name]["128"]
            self.assertEqual(speed["prompt_tokens"], 128 - 8)
            self.assertEqual(speed["capacity"], 120 + 4)
            self.assertGreater(speed["decode_tokens_per_s"], 0.0)
            piqa = rep["results"]["commonsense"][name]["piqa"]
            self.assertEqual(piqa["n"], 4)
            self.assertBetween(piqa["acc"], 0.0, 1.0)
            for key in ("acc", "acc_norm"):
                self.assertAlmostEqual(piqa[f"{key}_se"],
                                       math.sqrt(piqa[key] * (1 - piqa[key]) / 4))
        # KV cache: 2 (teacher) vs 1 (student) attention layers of [1, 124, 2, 8] fp32 k and v;
        # the student's Lightning layer holds an fp32 [1, 4, 8, 8] state.
        kv_layer = 2 * 124 * 2 * 8 * 4
        teacher_bytes = rep["results"]["speed"]["teacher"]["128"]["state_bytes"]
        student_bytes = rep["results"]["speed"]["student"]["128"]["state_bytes"]
        self.assertBetween(teacher_bytes["kv_cache"], 2 * kv_layer, 2 * kv_layer + 32)
        self.assertBetween(student_bytes["kv_cache"], kv_layer, kv_layer + 16)
        self.assertBetween(student_bytes["recurrent"], 4 * 8 * 8 * 4, 4 * 8 * 8 * 4 + 32)
        md = report_lib.results_markdown(rep)
        self.assertIn("| speed @ 128 | state: KV cache (MiB) |", md)
        self.assertIn("| piqa (n=4, chance 0.500) | acc |", md)
        piqa = rep["results"]["commonsense"]["teacher"]["piqa"]
        self.assertIn(f"| {piqa['acc']:.3f} ± {piqa['acc_se']:.3f} |", md)
        self.assertIn("| commonsense (1 tasks) | mean of acc_norm (acc where none) | ", md)


def tiny_models(seed=0, vocab_size=61):
    """A random 2-layer teacher and its HypeNet student (Lightning + NoPE attention with
    logit scaling), fp32, with segment ids on as in the report."""
    cfg = dataclasses.replace(hypenet_test.tiny_teacher_config(), use_segment_ids=True,
                              layer_pattern=("attn",) * 2, vocab_size=vocab_size)
    params = stages.random_teacher(cfg, seed=seed)
    student_cfg = hypenet.hypenet_config(cfg, [1])
    student_cfg = dataclasses.replace(
        student_cfg, use_segment_ids=True,
        attention=dataclasses.replace(student_cfg.attention, logit_scaling_base=50.0))
    return {"teacher": loaders.build_model(cfg, params),
            "student": loaders.build_model(student_cfg,
                                           hypenet.convert(params, cfg, student_cfg))}


class CorpusPerplexityTest(absltest.TestCase):

    def test_stage2_student_gets_only_its_measurements_and_corpus_ppl_is_exact(self):
        from lattn_jax.data import prepare
        src = self.create_tempdir()
        rng = random.Random(5)
        docs = ["".join(rng.choice("abcdefgh ,.") for _ in range(n)) for n in (30, 17, 44, 9)]
        src.create_file("valid.txt", content="\n\n".join(docs) + "\n")
        corpus_dir = self.create_tempdir().full_path
        prepare.prepare_corpus([src.full_path], corpus_dir, tokenizer="byte", progress=False,
                               print_fn=lambda s: None)
        models = tiny_models(vocab_size=257)
        stage2 = tiny_models(seed=1, vocab_size=257)["student"]  # any other student
        named = {"teacher": (models["teacher"], "t"), "student": (models["student"], "s"),
                 "student_stage2": (stage2, "s2")}
        options = halo_smollm2.get_config("tiny").report
        options.update(measurements=("perplexity", "corpus_perplexity"), perplexity_max_docs=1,
                       stage2_measurements=("corpus_perplexity",),
                       corpus_perplexity_paths=(corpus_dir,), corpus_perplexity_tokens=60)
        stage_dir = self.create_tempdir().full_path
        rep = report_lib.run_report(options=options, stage_dir=stage_dir, models=named,
                                    tokenizer=tok_lib.ByteTokenizer(), meta={}, **QUIET)
        self.assertTrue(rep["complete"])
        self.assertEqual(set(rep["results"]["perplexity"]), {"teacher", "student"})
        self.assertEqual(set(rep["results"]["corpus_perplexity"]),
                         {"teacher", "student", "student_stage2"})
        # By hand: the first 60 bytes are documents 1 (30) and 2 (17) and 13 bytes of the
        # third, each scored alone after EOS; the window (64) holds every document whole.
        tok = tok_lib.ByteTokenizer()
        cut = [tok.encode(docs[0]), tok.encode(docs[1]), tok.encode(docs[2])[:13]]
        for name, model in (("teacher", models["teacher"]), ("student_stage2", stage2)):
            nll = 0.0
            for ids in cut:
                x = np.array([[tok.eos_id] + ids[:-1]], np.int32)
                logits = np.asarray(model(x), np.float64)[0]
                logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
                nll -= logp[np.arange(len(ids)), ids].sum()
            got = rep["results"]["corpus_perplexity"][name]
            self.assertEqual(got["tokens"], 60)
            self.assertEqual(got["documents"], 3)
            self.assertAlmostEqual(got["nll_per_token"], nll / 60, places=4)
        md = report_lib.results_markdown(rep)
        self.assertIn("| measurement | metric | teacher | student | student_stage2 |", md)
        self.assertRegex(md, r"\| corpus perplexity \(.*first 60 tokens, window 64\) \| "
                             r"token_perplexity \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \|")
        self.assertRegex(md, r"\| perplexity \(.*\) \| token_perplexity \| [0-9.]+ \| "
                             r"[0-9.]+ \| – \|")


class UnscaledStudentTest(absltest.TestCase):

    def test_unscaled_student_gets_its_measurements_and_only_the_short_niah(self):
        cfg = dataclasses.replace(hypenet_test.tiny_teacher_config(), use_segment_ids=True,
                                  layer_pattern=("attn",) * 2, vocab_size=257)
        params = stages.random_teacher(cfg, seed=0)
        base = dataclasses.replace(hypenet.hypenet_config(cfg, [1]), use_segment_ids=True)

        def student(a):
            s_cfg = dataclasses.replace(
                base, attention=dataclasses.replace(base.attention, logit_scaling_base=a))
            return loaders.build_model(s_cfg, hypenet.convert(params, cfg, s_cfg))

        named = {"teacher": (loaders.build_model(cfg, params), "t"),
                 "student": (student(50.0), "s"), "student_unscaled": (student(None), "u")}
        options = halo_smollm2.get_config("tiny").report
        options.update(measurements=("perplexity", "niah"), perplexity_max_docs=1,
                       unscaled_measurements=("perplexity", "niah"),
                       extra_models_niah_max_len=448)
        stage_dir = self.create_tempdir().full_path
        rep = report_lib.run_report(options=options, stage_dir=stage_dir, models=named,
                                    tokenizer=tok_lib.ByteTokenizer(), meta={}, **QUIET)
        self.assertTrue(rep["complete"])
        ppl = rep["results"]["perplexity"]
        self.assertEqual(set(ppl), {"teacher", "student", "student_unscaled"})
        # The scaling acts inside the window (s_t = log_50(t + 50) > 1 for t > 0).
        self.assertNotAlmostEqual(ppl["student"]["token_perplexity"],
                                  ppl["student_unscaled"]["token_perplexity"], places=4)
        # The unscaled model is the student without the scaling: measured as the student of
        # another report, it scores the same.
        alone = report_lib.run_report(
            options=options, stage_dir=self.create_tempdir().full_path,
            models={"student": (student(None), "u")}, tokenizer=tok_lib.ByteTokenizer(),
            meta={}, **QUIET)
        self.assertAlmostEqual(alone["results"]["perplexity"]["student"]["token_perplexity"],
                               ppl["student_unscaled"]["token_perplexity"], places=5)
        # NIAH: every length for the two main models, up to 448 for the extra one.
        nh = rep["results"]["niah"]
        for name in ("teacher", "student"):
            self.assertEqual(nh[name]["niah_single_1"]["per_length_n"], {"448": 2, "640": 2})
        self.assertEqual(nh["student_unscaled"]["niah_single_1"]["per_length_n"], {"448": 2})
        parts = report_lib.read_jsonl(os.path.join(stage_dir, report_lib.NIAH_PARTS))
        self.assertEqual(sorted((r["model"], r["length"]) for r in parts if
                                r["model"] == "student_unscaled"), [("student_unscaled", 448)])
        md = report_lib.results_markdown(rep)
        self.assertIn("| measurement | metric | teacher | student | student_unscaled |", md)
        self.assertIn("student_unscaled: NIAH at lengths up to 448 only "
                      "(`report.extra_models_niah_max_len`)", md)
        self.assertRegex(md, r"\| niah_single_1 \(n=2 per length\) \| string_match_all @ 640 "
                             r"\| [0-9.]+ ± [0-9.]+ \| [0-9.]+ ± [0-9.]+ \| – \|")

    def test_bad_extra_model_options_are_named(self):
        options = halo_smollm2.get_config("tiny").report
        for update, name in ((dict(unscaled_measurements=("bogus",)), "unscaled_measurements"),
                             (dict(unscaled_measurements=("niah",),
                                   extra_models_niah_max_len=100), "extra_models_niah_max_len"),
                             (dict(extra_models_niah_max_len=True),
                              "extra_models_niah_max_len")):
            bad = options.copy_and_resolve_references()
            bad.update(**update)
            with self.assertRaisesRegex(ValueError, name):
                report_lib.check_options(bad)
        fine = options.copy_and_resolve_references()
        fine.update(unscaled_measurements=("niah",), extra_models_niah_max_len=448)
        report_lib.check_options(fine)
        # Only what the report runs (2026-12-04 newcomer pass: niah_forced was dropped silently).
        outside = options.copy_and_resolve_references()
        outside.update(measurements=("niah",), unscaled_measurements=("niah_forced", "niah"))
        with self.assertRaisesRegex(ValueError, r"report\.unscaled_measurements: "
                                                r"\['niah_forced'\]: not in report\.measurements"):
            report_lib.check_options(outside)

    def test_a_resumed_report_measures_only_what_other_which_options_add(self):
        models = tiny_models(vocab_size=257)
        unscaled = tiny_models(vocab_size=257)["student"]  # any third model
        named = {"teacher": (models["teacher"], "t"), "student": (models["student"], "s")}
        options = halo_smollm2.get_config("tiny").report
        options.update(measurements=("perplexity",), perplexity_max_docs=1)
        stage_dir = self.create_tempdir().full_path
        first = report_lib.run_report(options=options, stage_dir=stage_dir, models=named,
                                      tokenizer=tok_lib.ByteTokenizer(), meta={}, **QUIET)
        more = options.copy_and_resolve_references()
        more.update(unscaled_measurements=("perplexity",))
        lines = []
        second = report_lib.run_report(
            options=more, stage_dir=stage_dir,
            models={**named, "student_unscaled": (unscaled, "u")},
            tokenizer=tok_lib.ByteTokenizer(), meta={}, print_fn=lines.append)
        self.assertEqual([x.split(":")[0] for x in lines], ["perplexity / student_unscaled"])
        self.assertEqual(second["results"]["perplexity"]["student"],
                         first["results"]["perplexity"]["student"])
        self.assertEqual(second["options"]["unscaled_measurements"], ["perplexity"])
        # An option a result depends on still measures everything again, and says which.
        wider = more.copy_and_resolve_references()
        wider.perplexity_window = 32
        lines = []
        report_lib.run_report(options=wider, stage_dir=stage_dir, models=named,
                              tokenizer=tok_lib.ByteTokenizer(), meta={}, print_fn=lines.append)
        self.assertIn("report options changed (perplexity_window): measuring everything again",
                      lines)

    def test_a_complete_report_run_again_says_so_and_rewrites_both_files(self):
        # It printed nothing and rewrote report.json but not report.md.
        models = tiny_models(vocab_size=257)
        named = {"teacher": (models["teacher"], "t"), "student": (models["student"], "s")}
        options = halo_smollm2.get_config("tiny").report
        options.update(measurements=("perplexity",), perplexity_max_docs=1)
        stage_dir = self.create_tempdir().full_path
        report_lib.run_report(options=options, stage_dir=stage_dir, models=named,
                              tokenizer=tok_lib.ByteTokenizer(), meta={"run": "first"}, **QUIET)
        lines = []
        again = report_lib.run_report(options=options, stage_dir=stage_dir, models=named,
                                      tokenizer=tok_lib.ByteTokenizer(), meta={"run": "second"},
                                      print_fn=lines.append)
        self.assertTrue(again["complete"])
        path = os.path.join(stage_dir, report_lib.REPORT_JSON)
        self.assertEqual(lines, [
            f"report already complete ({path}): nothing to measure; report.json and report.md "
            f"rewritten (run details refreshed). Change a report option or use a new --workdir "
            f"to measure again"])
        with open(os.path.join(stage_dir, report_lib.REPORT_MD)) as f:
            self.assertEqual(f.read(), report_lib.results_markdown(report_lib.read_json(path)))

    def test_report_stage_adds_the_unscaled_student_only_when_a_is_calibrated(self):
        workdir = copy_of_tiny_stages(self)
        cfg = tiny_config(self.create_tempdir().full_path, ("perplexity",))
        cfg.report.unscaled_measurements = ("perplexity",)
        out = experiment.run(cfg, workdir, "report", **QUIET)  # no calibration: a = None
        rep = report_lib.read_json(out["report"])
        self.assertEqual(set(rep["results"]["perplexity"]), {"teacher", "student"})
        os.makedirs(os.path.join(workdir, "calibrate"))
        with open(os.path.join(workdir, "calibrate", "calibration.json"), "w") as f:
            json.dump({"best": 50.0}, f)
        os.remove(out["report"])
        rep = report_lib.read_json(experiment.run(cfg, workdir, "report", **QUIET)["report"])
        ppl = rep["results"]["perplexity"]
        self.assertEqual(set(ppl), {"teacher", "student", "student_unscaled"})
        self.assertIn("a = None", rep["meta"]["student_unscaled"])
        self.assertIn("a = 50.0", rep["meta"]["student"])
        self.assertNotAlmostEqual(ppl["student"]["token_perplexity"],
                                  ppl["student_unscaled"]["token_perplexity"], places=4)


class SelectionLinesTest(absltest.TestCase):

    def test_the_bootstrap_column_and_line(self):
        sel = {"attention_layers": [2], "csr": [0.5, 0.4, 0.5], "recall": [1.0, 0.5, 0.9],
               "scores": [0.0, 5.0, 50.0], "recall_accuracy": [0.75, 0.25, 0.5],
               "teacher": {"csr": 0.55, "recall": 0.95, "recall_accuracy": 0.5},
               "bootstrap": {"resamples": 1000, "top_k_frequency": [0.0, 0.375, 0.625],
                             "selected": [2], "selected_frequency": 0.625,
                             "sets": [[[2], 0.625], [[1], 0.375]]}}
        lines = report_lib.selection_lines(sel)
        self.assertIn("| layer | csr | recall | recall accuracy | score | kept (bootstrap) |",
                      lines)
        self.assertIn("| 1 | 0.4000 | 0.5000 | 0.250 | 5.000 | 0.38 |", lines)
        self.assertIn("| 2 **(attn)** | 0.5000 | 0.9000 | 0.500 | 50.000 | 0.62 |", lines)
        self.assertIn("| teacher (no replacement) | 0.5500 | 0.9500 | 0.500 | – | – |", lines)
        self.assertTrue(any("the selected set in 62.5% of them" in x and "[1] 37.5%" in x
                            for x in lines))
        del sel["bootstrap"]  # older selections: no column
        self.assertIn("| layer | csr | recall | recall accuracy | score |",
                      report_lib.selection_lines(sel))


class TeacherReuseTest(absltest.TestCase):

    def _first_report(self):
        """A tiny teacher and student measured once (perplexity): the report to reuse."""
        models = tiny_models(vocab_size=257)
        named = {"teacher": (models["teacher"], "t"), "student": (models["student"], "s")}
        options = halo_smollm2.get_config("tiny").report
        options.update(measurements=("perplexity",), perplexity_max_docs=1)
        meta = {"teacher": "random /a/b/tiny.gguf: 2 layers", "teacher_id": "tiny sha256:1"}
        first = self.create_tempdir().full_path
        rep1 = report_lib.run_report(options=options, stage_dir=first, models=named,
                                     tokenizer=tok_lib.ByteTokenizer(), meta=meta, **QUIET)
        source = os.path.join(first, report_lib.REPORT_JSON)
        return models, named, options, meta, rep1, source

    def test_teacher_results_are_reused_only_for_the_same_teacher_and_options(self):
        models, named, options, meta, rep1, source = self._first_report()
        # Another run: another student, the same teacher; the teacher is not measured again.
        other_student = tiny_models(seed=1, vocab_size=257)["student"]
        again = options.copy_and_resolve_references()
        # Where the data live and what the Stage-2 student gets are not compared.
        again.update(teacher_report=source, data_dir="/elsewhere",
                     stage2_measurements=("perplexity",))
        second = self.create_tempdir().full_path
        lines = []
        rep2 = report_lib.run_report(
            options=again, stage_dir=second, tokenizer=tok_lib.ByteTokenizer(),
            models={"teacher": (models["teacher"], "t"), "student": (other_student, "s2")},
            meta=meta, print_fn=lines.append)
        self.assertTrue(rep2["complete"])
        t1 = rep1["results"]["perplexity"]["teacher"]
        t2 = rep2["results"]["perplexity"]["teacher"]
        self.assertEqual(t2["reused_from"]["path"], source)
        self.assertEqual(t2["token_perplexity"], t1["token_perplexity"])
        self.assertNotIn("perplexity/teacher", rep2["seconds"])  # not measured
        self.assertIn("perplexity/student", rep2["seconds"])
        self.assertNotEqual(rep2["results"]["perplexity"]["student"]["token_perplexity"],
                            rep1["results"]["perplexity"]["student"]["token_perplexity"])
        self.assertIn(f"perplexity / teacher: reused from {source}", lines)
        self.assertIn("The teacher's results of perplexity are reused from",
                      report_lib.results_markdown(rep2))
        # Other options, or another teacher: one error naming why.
        changed = again.copy_and_resolve_references()
        changed.perplexity_window = 32
        with self.assertRaisesRegex(ValueError, "other options: perplexity_window"):
            report_lib.run_report(options=changed, stage_dir=self.create_tempdir().full_path,
                                  models=named, tokenizer=tok_lib.ByteTokenizer(), meta=meta,
                                  **QUIET)
        with self.assertRaisesRegex(ValueError, "another teacher"):
            report_lib.run_report(options=again, stage_dir=self.create_tempdir().full_path,
                                  models=named, tokenizer=tok_lib.ByteTokenizer(),
                                  meta=dict(meta, teacher_id="tiny sha256:2"), **QUIET)

    def test_a_reused_teacher_result_without_position_nll_is_measured_anew(self):
        # Reports before the position buckets: their teacher perplexity lacks position_nll.
        models, named, options, meta, rep1, source = self._first_report()
        old = report_lib.read_json(source)
        del old["results"]["perplexity"]["teacher"]["position_nll"]
        report_lib._write_json(source, old)
        again = options.copy_and_resolve_references()
        again.teacher_report = source
        lines = []
        rep2 = report_lib.run_report(options=again, stage_dir=self.create_tempdir().full_path,
                                     models=named, tokenizer=tok_lib.ByteTokenizer(),
                                     meta=meta, print_fn=lines.append)
        self.assertTrue(rep2["complete"])
        self.assertIn(f"perplexity / teacher: not reused from {source} (it lacks "
                      "position_nll): measuring it anew", lines)
        t1 = rep1["results"]["perplexity"]["teacher"]
        t2 = rep2["results"]["perplexity"]["teacher"]
        self.assertNotIn("reused_from", t2)
        self.assertIn("perplexity/teacher", rep2["seconds"])  # measured
        self.assertEqual(t2["position_nll"], t1["position_nll"])
        self.assertAlmostEqual(t2["token_perplexity"], t1["token_perplexity"], places=9)
        self.assertIn("Perplexity by position in the window",
                      report_lib.results_markdown(rep2))

    def test_the_committed_h200_report_is_reusable_by_the_h200_config(self):
        # The next issue-27 run reuses the teacher of the 2026-12-02 run: same options (the
        # data's machine paths aside) and the same GGUF (the report predates teacher_id).
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__)))))
        path = os.path.join(root, "benchmarks", "results", "halo-smollm2-2026-12-02", "report",
                            "report.json")
        options = report_lib._options_dict(halo_smollm2.get_config("h200").report)
        meta = {"teacher": "gguf /somewhere/else/SmolLM2-135M-Instruct.Q4_1.gguf: 30 softmax "
                           "attention layers (RoPE), bfloat16 compute, bfloat16 params",
                "teacher_id": "SmolLM2-135M-Instruct.Q4_1.gguf sha256:abc"}
        got = report_lib.reusable_teacher_results(path, options, meta)
        self.assertEqual(set(got), {"perplexity", "corpus_perplexity", "commonsense", "speed",
                                    "niah"})
        self.assertAlmostEqual(got["perplexity"]["token_perplexity"], 20.834, places=3)

    def test_reused_teacher_results_render(self):
        # The 2026-12-02b run crashed here: the first page written after the teacher's results
        # were reused (before any student result) took ``reused_from`` for a commonsense task.
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__)))))
        path = os.path.join(root, "benchmarks", "results", "halo-smollm2-2026-12-02", "report",
                            "report.json")
        with open(path) as f:
            report = json.load(f)
        plain = report_lib.results_markdown(report)
        for results in report["results"].values():
            results["teacher"] = dict(results["teacher"],
                                      reused_from={"path": path, "updated": "then"})
        reused = report_lib.results_markdown(report)
        # The marker is no task, length or metric: the same tables, and a note of the reuse.
        note = re.search(r"\nThe teacher's results of [^\n]* are reused from `([^`]*)`[^\n]*\n",
                         reused)
        self.assertIsNotNone(note)
        self.assertEqual(note.group(1), path)
        self.assertEqual(reused.replace(note.group(0), ""), plain)
        for results in report["results"].values():
            results.pop("student", None)
            results.pop("student_stage2", None)
        teacher_only = report_lib.results_markdown(report)
        self.assertIn("0.452 ± 0.007", teacher_only)  # the teacher's commonsense mean


class NiahDecoderTest(absltest.TestCase):

    def test_batched_answers_equal_batch_one_generation(self):
        rng = np.random.default_rng(0)
        m, cap = 7, 80
        # Two "lengths" of 4 and 3 prompts per task, of random lengths (so rows of one batch
        # differ).
        lengths = (48, 64)
        prompts = {}
        for task in ("niah_single_1", "niah_single_2"):
            prompts[task] = []
            for length, count in zip(lengths, (4, 3)):
                row = []
                for _ in range(count):
                    ids = rng.integers(0, 61, int(rng.integers(length - 30, length - m + 1)))
                    row.append(report_lib.NiahPrompt(sample=None, ids=ids.astype(np.int32)))
                prompts[task].append(row)
        for name, model in tiny_models().items():
            ref_decoder = report_lib.Decoder(model, pad_id=0)

            def alone(ids, stop):  # batch 1, left-padded (its own document): one shape
                return ref_decoder.generate(ids.tolist(), padded_len=max(lengths) - m,
                                            capacity=cap, max_new_tokens=m, stop_id=stop)

            ref = {t: [[alone(p.ids, None) for p in row] for row in rows]
                   for t, rows in prompts.items()}
            # A stop token that occurs in some answers, not as their first token.
            stop = ref["niah_single_1"][0][0][2]
            ref_stop = {t: [[alone(p.ids, stop) for p in row] for row in rows]
                        for t, rows in prompts.items()}
            self.assertTrue(any(len(a) < m for rows in ref_stop.values() for row in rows
                                for a in row))
            decoder = report_lib.NiahDecoder(model, chunk=3)
            # One part per (task, length), 150 tokens per batch: at length 48, 4 prompts in 2
            # batches of 2 (at most 3 rows); at 64, 3 prompts in 2 batches of 2 (the second
            # filled with a copy); the chunks run past some rows' last needed step.
            for stop_id, want in ((None, ref), (stop, ref_stop)):
                got, stats = report_lib.niah_answers(
                    decoder, prompts, lengths=lengths, max_new_tokens=m, batch_tokens=150,
                    stop_id=stop_id, print_fn=lambda s: None)
                self.assertEqual(got, want, msg=f"{name} {stop_id=}")
                for task in prompts:
                    st48, st64 = stats["48"][task], stats["64"][task]
                    self.assertEqual((st48["batches"], st48["batch_size"]), (2, 2))
                    self.assertEqual((st64["batches"], st64["batch_size"]), (2, 2))
                    # The prefill length and rest width are shared by the tasks of a length.
                    self.assertEqual(st48["prefix_len"], min(len(p.ids) for rows in
                                                             prompts.values() for p in rows[0]))
                    self.assertEqual(st64["rest_width"], stats["64"]["niah_single_1"]
                                     ["rest_width"])
            # Parts given as done are not decoded; should_stop leaves the rest undone (None).
            parts = []
            got, stats = report_lib.niah_answers(
                decoder, prompts, lengths=lengths, max_new_tokens=m, batch_tokens=150,
                stop_id=None, done={("niah_single_1", 48): ref["niah_single_1"][0]},
                on_part=lambda t, n, a, st: parts.append((t, n, a)),
                should_stop=lambda: len(parts) >= 2)
            self.assertEqual([(t, n) for t, n, _ in parts],
                             [("niah_single_2", 48), ("niah_single_1", 64)])
            self.assertEqual(got["niah_single_1"], ref["niah_single_1"])
            self.assertEqual(got["niah_single_2"], [ref["niah_single_2"][0], None])
            self.assertEqual(sorted(stats), ["48", "64"])
            self.assertNotIn("niah_single_1", stats["48"])

    def test_precompiled_programs_give_the_same_answers(self):
        rng = np.random.default_rng(1)
        m, lengths = 5, (40, 56)
        prompts = {task: [[report_lib.NiahPrompt(sample=None, ids=rng.integers(
            0, 61, int(rng.integers(n - 20, n - m + 1))).astype(np.int32)) for _ in range(3)]
            for n in lengths] for task in ("niah_single_1", "niah_single_2")}
        model = tiny_models()["student"]
        kw = dict(lengths=lengths, max_new_tokens=m, batch_tokens=100, stop_id=None)
        want, _ = report_lib.niah_answers(report_lib.NiahDecoder(model, chunk=3), prompts,
                                          print_fn=lambda s: None, **kw)
        decoder = report_lib.NiahDecoder(model, chunk=3)
        lines = []
        with mock.patch.object(decoder, "_prefill", wraps=decoder._prefill) as prefill, \
                mock.patch.object(decoder, "_steps", wraps=decoder._steps) as steps:
            got, _ = report_lib.niah_answers(decoder, prompts, print_fn=lines.append,
                                             precompile=True, **kw)
            # Every part ran the executables compiled ahead of time, never the jit functions.
            self.assertEqual((prefill.call_count, steps.call_count), (0, 0))
        self.assertEqual(got, want)
        # One prefill and one step program per length: the tasks of a length share them.
        self.assertLen(decoder._compiled, 4)
        self.assertTrue(any("compiled 2 prefill and step program pairs" in s for s in lines))

    def test_no_precompilation_once_the_deadline_has_passed(self):
        # should_stop already True: nothing is decoded, so nothing is compiled either (on the
        # H200 that compilation is tens of seconds past the report's deadline).
        prompts = {"niah_single_1": [[report_lib.NiahPrompt(sample=None, ids=np.arange(
            30, dtype=np.int32))]]}
        decoder = report_lib.NiahDecoder(tiny_models()["student"], chunk=3)
        with mock.patch.object(decoder, "precompile") as precompile:
            got, stats = report_lib.niah_answers(
                decoder, prompts, lengths=(40,), max_new_tokens=5, batch_tokens=100,
                stop_id=None, print_fn=lambda s: None, should_stop=lambda: True,
                precompile=True)
        precompile.assert_not_called()
        self.assertEqual((got, stats), ({"niah_single_1": [None]}, {}))

    def test_generate_checks_its_arguments(self):
        decoder = report_lib.NiahDecoder(tiny_models()["teacher"], chunk=4)
        ids = [np.arange(10), np.arange(12)]
        with self.assertRaisesRegex(ValueError, "capacity >= 17"):
            decoder.generate(ids, batch_size=2, capacity=16, max_new_tokens=3)
        with self.assertRaisesRegex(ValueError, "prefix_len <= 10"):
            decoder.generate(ids, batch_size=2, capacity=40, max_new_tokens=3, prefix_len=11)
        with self.assertRaisesRegex(ValueError, "no prompts"):
            decoder.generate([], batch_size=2, capacity=40, max_new_tokens=3)
        with self.assertRaisesRegex(ValueError, "chunk must be >= 1"):
            report_lib.NiahDecoder(tiny_models()["teacher"], chunk=0)

    def test_batch_size(self):
        self.assertEqual(report_lib.niah_batch_size(65536, 300, 262144), 4)
        self.assertEqual(report_lib.niah_batch_size(2048, 300, 262144), 100)  # 3 x 100, not 128
        self.assertEqual(report_lib.niah_batch_size(32768, 300, 262144), 8)  # 38 batches
        self.assertEqual(report_lib.niah_batch_size(131072, 5, 65536), 1)
        self.assertEqual(report_lib.niah_batch_size(1024, 3, 262144), 3)
        with self.assertRaisesRegex(ValueError, "report.niah_batch_tokens"):
            report_lib.niah_batch_size(1024, 3, 0)


def write_essays(data_dir, words=3000, seed=0):
    """A tiny ``niah/PaulGrahamEssays`` haystack: random lowercase words and periods."""
    rng = random.Random(seed)
    essays = os.path.join(data_dir, "niah", "PaulGrahamEssays")
    os.makedirs(essays, exist_ok=True)
    text = " ".join("".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 7)))
                    + ("." if rng.random() < 0.1 else "") for _ in range(words))
    with open(os.path.join(essays, "essay.txt"), "w") as f:
        f.write(text)


class NiahResumeTest(absltest.TestCase):

    def test_a_cut_run_resumes_per_part_with_the_same_result(self):
        data_dir = self.create_tempdir().full_path
        write_essays(data_dir)
        options = halo_smollm2.get_config("tiny").report
        # 2 models x 2 tasks x 1 length: 4 parts of 2 prompts (2 depths x 1 sample).
        options.update(data_dir=data_dir, measurements=("niah",),
                       niah_tasks=("niah_single_1", "niah_single_2"), niah_lengths=(448,))
        tiny = tiny_models(vocab_size=257)  # byte tokens
        models = {"student": (tiny["student"], "tiny student"),
                  "teacher": (tiny["teacher"], "tiny teacher")}
        tok = tok_lib.ByteTokenizer()
        real_generate = report_lib.NiahDecoder.generate
        calls = []

        def run(stage_dir, cut_at=None, **kw):
            """run_report; NiahDecoder.generate raises on its ``cut_at``-th call."""
            lines = []

            def generate(decoder, prompts, **kwargs):
                calls.append(len(prompts))
                if len(calls) == cut_at:
                    raise RuntimeError("machine lost")
                answers, stats = real_generate(decoder, prompts, **kwargs)
                # The random models repeat one token; answer the needle (the prompt's first
                # 7-digit number) for some prompts (a parity of their ids), so that parts
                # differ.
                for i, ids in enumerate(prompts):
                    if int(np.sum(np.asarray(ids) * np.arange(len(ids)))) % 2:
                        answers[i] = tok.encode(re.search(r"\d{7}", tok.decode(ids)).group())
                return answers, stats

            calls.clear()
            with mock.patch.object(report_lib.NiahDecoder, "generate", generate):
                rep = report_lib.run_report(options=options, stage_dir=stage_dir, models=models,
                                            tokenizer=tok, meta={}, print_fn=lines.append,
                                            **kw)
            # The per-part lines and the read-back notices (not the per-model summaries).
            return rep, [s for s in lines if s.startswith("niah /") and (" @ " in s or
                                                                         "read back" in s)]

        def parts(stage_dir):
            return [(r["model"], r["task"], r["length"], r["answers"]) for r in
                    report_lib.read_jsonl(os.path.join(stage_dir, report_lib.NIAH_PARTS))]

        ref_dir, cut_dir = self.create_tempdir().full_path, self.create_tempdir().full_path
        ref, ref_lines = run(ref_dir)
        self.assertTrue(ref["complete"])
        self.assertLen(calls, 4)
        self.assertRegex(ref_lines[0], r"^niah / student / niah_single_1 @ 448: "
                                       r"\d\.\d{3} ± \d\.\d{3} \(2 prompts, 1 batches of 2")
        self.assertLen(parts(ref_dir), 4)
        # The parts are told apart by their answers (some needles found, some not).
        accuracy = [r["accuracy"] for r in report_lib.read_jsonl(
            os.path.join(ref_dir, report_lib.NIAH_PARTS))]
        self.assertGreater(len(set(accuracy)), 1, msg=accuracy)

        # The machine is lost while decoding the second part: the first one is on disk.
        with self.assertRaisesRegex(RuntimeError, "machine lost"):
            run(cut_dir, cut_at=2)
        self.assertEqual([p[:3] for p in parts(cut_dir)], [("student", "niah_single_1", 448)])
        self.assertEqual(parts(cut_dir)[0], parts(ref_dir)[0])
        # A deadline between parts: the student's second part and the teacher's first, then
        # a clean stop before the teacher's second.
        path = os.path.join(cut_dir, report_lib.NIAH_PARTS)
        rep, lines = run(cut_dir, should_stop=lambda: len(report_lib.read_jsonl(path)) >= 3)
        self.assertFalse(rep["complete"])
        self.assertLen(calls, 2)
        self.assertIn("student", rep["results"]["niah"])
        self.assertNotIn("teacher", rep["results"]["niah"])
        self.assertRegex(lines[0], r"^niah / student: 1 of 2 parts read back from ")
        self.assertEqual([s.split(":")[0] for s in lines[1:]],
                         ["niah / student / niah_single_2 @ 448",
                          "niah / teacher / niah_single_1 @ 448"])
        # The last run decodes only the part left and gives the uninterrupted run's result.
        rep, lines = run(cut_dir)
        self.assertTrue(rep["complete"])
        self.assertLen(calls, 1)
        self.assertEqual([s.split(":")[0] for s in lines],
                         ["niah / teacher", "niah / teacher / niah_single_2 @ 448"])
        self.assertEqual(rep["details"]["niah"]["teacher"]["niah"]["parts_read_back"],
                         ["niah_single_1 @ 448"])
        self.assertEqual(rep["results"]["niah"], ref["results"]["niah"])
        self.assertCountEqual(parts(cut_dir), parts(ref_dir))

        # Other options: the parts on disk are not read back.
        options.niah_max_new_tokens = 6
        rep, lines = run(cut_dir, should_stop=lambda: bool(calls))
        self.assertFalse(rep["complete"])
        self.assertLen(calls, 1)
        self.assertEqual(rep["results"], {})
        self.assertNotIn("read back", " ".join(lines))

    def test_parts_file_survives_a_half_written_line(self):
        path = os.path.join(self.create_tempdir().full_path, report_lib.NIAH_PARTS)
        record = {"model": "student", "task": "niah_single_1", "length": 448,
                  "fingerprint": "f", "answers": [[1, 2], []]}
        report_lib.append_jsonl(path, record)
        with open(path, "a") as f:
            f.write('{"model": "teacher", "task": "niah_')  # cut mid-line
        report_lib.append_jsonl(path, dict(record, task="niah_single_2"))
        got = report_lib.read_niah_parts(path, model="student", fingerprint="f")
        self.assertEqual(sorted(got), [("niah_single_1", 448), ("niah_single_2", 448)])
        self.assertEqual(got["niah_single_1", 448]["answers"], [[1, 2], []])
        self.assertEqual(report_lib.read_niah_parts(path, model="student", fingerprint="g"), {})
        self.assertEqual(report_lib.read_niah_parts(path, model="teacher", fingerprint="f"), {})

    def test_parts_file_skips_lines_that_are_not_records(self):
        # JSON, but not an object (a hand edit, another tool's line): skipped, not a traceback.
        path = os.path.join(self.create_tempdir().full_path, report_lib.NIAH_PARTS)
        with open(path, "w") as f:
            f.write('[1, 2]\n"x"\n3\nnull\n')
        record = {"model": "student", "task": "niah_single_1", "length": 448,
                  "fingerprint": "f", "answers": [[1, 2]]}
        report_lib.append_jsonl(path, record)
        got = report_lib.read_niah_parts(path, model="student", fingerprint="f")
        self.assertEqual(list(got), [("niah_single_1", 448)])


class NiahForcedTest(absltest.TestCase):

    def test_forced_scores_equal_a_direct_forward_and_render(self):
        import jax
        import jax.numpy as jnp
        from lattn_jax.eval import scoring
        model = tiny_models(seed=3, vocab_size=257)["student"]
        tok = tok_lib.ByteTokenizer()
        prompts = report_lib.niah_samples(tok, tasks=["niah_single_1"], lengths=[448],
                                          depths=[20.0, 80.0], samples_per_cell=2,
                                          essay_words=None, max_new_tokens=8, seed=9)
        cell = prompts["niah_single_1"][0]
        # 4 prompts in batches of 3: a padded last batch.
        got = report_lib.niah_forced_scores(scoring.Scorer(model, max_len=448, batch_size=1),
                                            tok, cell, rows_per_batch=3, bucket=64)
        first_p, first_g, rest_p, rest_g = [], [], [], []
        # Jitted: each prompt's length is new, and op by op every one compiled each op again.
        forward = selection_test.compiled_forward(model)
        for p in cell:  # one unpadded fp32 forward per prompt
            answer = tok.encode(" " + p.sample.value)
            ids = list(p.ids) + answer
            logits = forward(jnp.asarray([ids[:-1]], jnp.int32))[0].astype(jnp.float32)
            probs = np.asarray(jax.nn.softmax(logits, axis=-1), np.float64)
            at = np.arange(len(p.ids) - 1, len(ids) - 1)
            tp = probs[at, answer]
            argmax = probs[at].argmax(-1) == np.asarray(answer)
            first_p.append(tp[0])
            first_g.append(argmax[0])
            rest_p.append(tp[1:].mean())
            rest_g.append(argmax[1:].all())
        self.assertEqual((got["n"], got["answer_tokens"]), (4, 8.0))  # " " + 7 digits, bytes
        np.testing.assert_allclose(got["first_prob"], np.mean(first_p), rtol=2e-4)
        np.testing.assert_allclose(got["rest_prob"], np.mean(rest_p), rtol=2e-4)
        self.assertEqual(got["first_greedy"], np.mean(first_g))
        self.assertEqual(got["rest_greedy"], np.mean(rest_g))
        md = report_lib.results_markdown({"results": {"niah_forced": {
            "student": {"niah_single_1": {"448": got}}}}})
        self.assertIn(f"| niah_single_1 | 448 | {got['first_prob']:.3f} "
                      f"({got['first_greedy']:.2f}) | {got['rest_prob']:.3f} "
                      f"({got['rest_greedy']:.2f}) |", md)
        with self.assertRaisesRegex(ValueError, "rows_per_batch >= 1"):
            report_lib.niah_forced_scores(None, tok, cell, rows_per_batch=0)

    def test_measurement_covers_the_short_lengths_only(self):
        data_dir = self.create_tempdir().full_path
        models = {k: (m, k) for k, m in tiny_models(seed=1, vocab_size=257).items()}
        options = halo_smollm2.get_config("tiny").report
        options.update(data_dir=data_dir, measurements=("niah_forced",))
        rep = report_lib.run_report(options=options, stage_dir=self.create_tempdir().full_path,
                                    models=models, tokenizer=tok_lib.ByteTokenizer(), meta={},
                                    **QUIET)
        self.assertTrue(rep["complete"])
        short = [str(n) for n in options.niah_lengths if n <= options.niah_short_max_len]
        self.assertNotEqual(short, [str(n) for n in options.niah_lengths])  # 640 is left out
        for name in ("teacher", "student"):
            per = rep["results"]["niah_forced"][name]["niah_single_1"]
            self.assertEqual(sorted(per), short)
            self.assertEqual(per[short[0]]["n"],
                             len(options.niah_depths) * options.niah_samples)
            self.assertBetween(per[short[0]]["first_prob"], 0.0, 1.0)


class StandardErrorTest(absltest.TestCase):

    def test_hand_checked_values(self):
        # 0.652 * 0.348 / 1000 = 2.26896e-4 -> 0.0150631.
        self.assertAlmostEqual(report_lib.binomial_se(0.652, 1000), 0.0150631, places=7)
        self.assertEqual(report_lib.binomial_se(1.0, 20), 0.0)
        self.assertTrue(math.isnan(report_lib.binomial_se(0.5, 0)))
        # sqrt(.03^2 + .04^2) / 2 = .025.
        mean, se = report_lib.mean_with_se([0.5, 0.7], [0.03, 0.04])
        self.assertAlmostEqual(mean, 0.6)
        self.assertAlmostEqual(se, 0.025)
        out = report_lib.with_se({"acc": 0.25, "acc_norm": 0.5, "n": 400, "acc_chance": 0.25})
        self.assertAlmostEqual(out["acc_se"], math.sqrt(0.25 * 0.75 / 400))  # 0.021651
        self.assertAlmostEqual(out["acc_norm_se"], 0.025)  # sqrt(.25 / 400)
        mean, se = report_lib.csr_mean({"arc_easy": out, "winogrande": {"acc": 0.6, "n": 1000}})
        self.assertAlmostEqual(mean, 0.55)  # acc_norm of arc_easy, acc of winogrande
        self.assertAlmostEqual(se, math.sqrt(0.025 ** 2 + 0.24 / 1000) / 2)

    def test_niah_scores_on_random_answers(self):
        rng = random.Random(5)
        tok = tok_lib.ByteTokenizer()
        lengths, depths, per_cell = (512, 1024, 4096), (10.0, 50.0, 90.0), 4
        prompts, answers, hits = {}, {}, {}
        for task in ("niah_single_1", "niah_single_3"):
            prompts[task], answers[task], hits[task] = [], [], []
            for length in lengths:
                row_p, row_a, row_h = [], [], []
                for d in depths:
                    for _ in range(per_cell):
                        value = str(rng.randint(10 ** 6, 10 ** 7 - 1))
                        hit = rng.random() < 0.6
                        sample = niah.Sample(task=task, prompt="", value=value, key="k",
                                             depth=d, length=length, needle_char=0,
                                             context_chars=(0, 0), num_tokens=0)
                        row_p.append(report_lib.NiahPrompt(sample=sample, ids=np.zeros(1)))
                        row_a.append(tok.encode(f" {value if hit else '42'}. The end"))
                        row_h.append(float(hit))
                prompts[task].append(row_p)
                answers[task].append(row_a)
                hits[task].append(row_h)
        out = report_lib.niah_scores(answers, tok, prompts, lengths=lengths, depths=depths,
                                     samples_per_cell=per_cell, short_max_len=1024)
        for task in prompts:
            h = np.asarray(hits[task])  # [lengths, depths * per_cell]
            r = out[task]
            np.testing.assert_allclose(r["grid"], h.reshape(3, 3, per_cell).mean(-1))
            p = h.mean(1)
            se = np.sqrt(p * (1 - p) / h.shape[1])
            for i, n in enumerate(lengths):
                self.assertAlmostEqual(r["per_length"][str(n)], p[i])
                self.assertAlmostEqual(r["per_length_se"][str(n)], se[i])
                self.assertEqual(r["per_length_n"][str(n)], 12)
            self.assertEqual(r["short"]["lengths"], [512, 1024])
            self.assertAlmostEqual(r["short"]["mean"], (p[0] + p[1]) / 2)
            self.assertAlmostEqual(r["short"]["se"], math.sqrt(se[0] ** 2 + se[1] ** 2) / 2)
            self.assertEqual(r["long"]["lengths"], [4096])
            self.assertAlmostEqual(r["long"]["se"], se[2])
            self.assertAlmostEqual(r["mean_se"], math.sqrt(np.sum(se ** 2)) / 3)
            # Hits start with the value, misses hold none of it.
            for i, n in enumerate(lengths):
                hit_count = int(h[i].sum())
                self.assertEqual(r["answer_modes"][str(n)],
                                 dict(value_first=hit_count, value_later=0, partial_value=0,
                                      no_value=h.shape[1] - hit_count))
        md = report_lib.results_markdown({"options": {"niah_tasks": list(prompts)},
                                          "results": {"niah": {"student": out}}})
        c = out["niah_single_3"]["answer_modes"]["4096"]
        self.assertIn(f"| niah_single_3 | 4,096 | {c['value_first']} / 0 / 0 / {c['no_value']} |",
                      md)

    def test_bad_options_are_named(self):
        base = halo_smollm2.get_config("tiny").report
        for key, value, pattern in (("niah_tasks", ("niah_single_9",), "report.niah_tasks"),
                                    ("niah_depths", (50.0, 120.0), "report.niah_depths"),
                                    ("niah_lengths", (8,), "report.niah_lengths"),
                                    ("niah_batch_tokens", 0, "report.niah_batch_tokens"),
                                    ("measurements", ("speed", "vibes"), "report.measurements"),
                                    ("stage2_measurements", ("vibes",),
                                     "report.stage2_measurements"),
                                    ("measurements", ("corpus_perplexity",),
                                     "report.corpus_perplexity_paths"),
                                    # niah_forced scores lengths <= niah_short_max_len only:
                                    # none there would be an empty result, not an error.
                                    ("niah_short_max_len", 100, "report.niah_short_max_len")):
            options = base.copy_and_resolve_references()
            options[key] = value
            if key == "niah_short_max_len":
                options.measurements = ("niah_forced",)
            with self.assertRaisesRegex(ValueError, pattern):
                report_lib.check_options(options)
        report_lib.check_options(base)
        short = base.copy_and_resolve_references()
        short.niah_short_max_len = 100  # fine without niah_forced
        report_lib.check_options(short)


class MarkdownTest(absltest.TestCase):

    def test_position_table(self):
        def ppl(means, tokens=(60, 30, 10)):
            buckets = [{"start": a, "stop": b, "tokens": n, "mean_nll": m,
                        "perplexity": None if m is None else math.exp(m)}
                       for (a, b), n, m in zip(((0, 64), (64, 1024), (1024, 2048)), tokens,
                                               means)]
            return {"token_perplexity": 20.0, "word_perplexity": 40.0, "bits_per_byte": 0.9,
                    "file": "wiki.test.raw", "window": 2048, "position_nll": buckets}

        report = {"results": {"perplexity": {
            "teacher": ppl([3.0, 2.5, math.log(20.0)]),
            "student": ppl([3.1, 2.5 + math.log(1.5), math.log(30.0)]),
            "student_stage2": ppl([3.2, 2.7, None], tokens=(60, 30, 0))}}}
        md = report_lib.results_markdown(report)
        table = md[md.index("\nPerplexity by position"):]
        self.assertEqual(table.splitlines()[2:], [
            "",
            "| positions | tokens | teacher ppl | student ppl | student_stage2 ppl "
            "| student / teacher |",
            "|---|---:|---:|---:|---:|---:|",
            f"| [0, 64) | 60 | 20.086 | 22.198 | 24.533 | {math.exp(0.1):.3f} |",
            "| [64, 1,024) | 30 | 12.182 | 18.274 | 14.880 | 1.500 |",
            "| [1,024, 2,048) | 10 | 20.000 | 30.000 | – | 1.500 |"])
        # A teacher reused from a report before the buckets: its column is left out.
        del report["results"]["perplexity"]["teacher"]["position_nll"]
        md = report_lib.results_markdown(report)
        self.assertIn("| positions | tokens | student ppl | student_stage2 ppl "
                      "| student / teacher |", md)
        self.assertIn("| [64, 1,024) | 30 | 18.274 | 14.880 | – |", md)

    def test_committed_reports_render_with_the_position_table_where_measured(self):
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__)))))
        results = os.path.join(root, "benchmarks", "results")
        workdirs = sorted(d for d in os.listdir(results)
                          if os.path.exists(os.path.join(results, d, "report", "report.json")))
        self.assertNotEmpty(workdirs)
        for d in workdirs:
            page = report_lib.render_markdown(os.path.join(results, d))
            self.assertIn("## Teacher versus converted student", page)
            self.assertIn("token_perplexity", page)
            with open(os.path.join(results, d, "report", "report.json")) as f:
                ppl = json.load(f)["results"].get("perplexity", {})
            measured = any("position_nll" in r for r in ppl.values())
            self.assertEqual("Perplexity by position" in page, measured, d)

    def test_stage3_row_names_the_teacher_kl(self):
        # With stage3.kl_weight > 0 the logged Stage-3 loss is CE + w x KL: the page says so.
        workdir = self.create_tempdir().full_path
        stage3 = {"seq_len": 16384, "batch_size": 8, "optim": {"learning_rate": 1e-5},
                  "train": {"total_steps": 538}}
        for kl, want in (({}, "| stage3 | next-token CE, long windows |"),
                         ({"kl_weight": 0.0, "kl_len": 8192},
                          "| stage3 | next-token CE, long windows |"),
                         ({"kl_weight": 0.5, "kl_len": 8192},
                          "| stage3 | next-token CE, long windows, + 0.5 x forward KL from "
                          "the teacher on each window's first 8192 positions (the logged "
                          "loss is the sum) |")):
            with open(os.path.join(workdir, "config.json"), "w") as f:
                json.dump({"stage3": dict(stage3, **kl)}, f)
            self.assertIn(want, report_lib.render_markdown(workdir))

    def test_selection_section_names_an_attention_layers_override(self):
        # The selection's ablation (halo_h200.sh BRANCH_FROM=stage2) carries the selection but
        # trains the layers of config.hypenet.attention_layers: the page must not pass them off
        # as the selection's.
        workdir = self.create_tempdir().full_path
        os.makedirs(os.path.join(workdir, "select"))
        sel = {"attention_layers": [2, 5], "csr": [0.3] * 6, "recall": [0.5] * 6,
               "scores": [1.0, 2.0, 9.0, 0.5, 0.1, 8.0]}
        with open(os.path.join(workdir, "select", "selection.json"), "w") as f:
            json.dump(sel, f)
        notice = "**This run's student does not use the selection below:**"
        for layers, shown in (([1, 3], True), ([2, 5], False), (None, False)):
            with open(os.path.join(workdir, "config.json"), "w") as f:
                json.dump({"hypenet": {"attention_layers": layers}}, f)
            page = report_lib.render_markdown(workdir)
            self.assertEqual(notice in page, shown, layers)
            self.assertIn("Kept as softmax attention (NoPE + gate in the student): **[2, 5]**",
                          page)
            if shown:
                self.assertIn("`config.hypenet.attention_layers` = [1, 3] overrides the "
                              "selected [2, 5]", page)

    def test_calibration_table_splits_the_loss_by_position_bucket(self):
        cal = {"best": None, "seq_len": 65536,
               "losses": {"None": 2.5, "500.0": 2.625},
               "position_buckets": [[0, 16384], [16384, 32768], [32768, 65536]],
               "bucket_losses": {"None": [2.25, 2.5, 2.75], "500.0": [2.5, 2.625, None]},
               "bucket_tokens": [16384.0, 16384.0, 0.0]}
        lines = "\n".join(report_lib.calibration_lines(cal))
        self.assertIn("| a | validation CE | [0, 16,384) | [16,384, 32,768) | "
                      "[32,768, 65,536) |\n|---|---:|---:|---:|---:|", lines)
        self.assertIn("| None | 2.5000 | 2.2500 | 2.5000 | 2.7500 |", lines)
        self.assertIn("| 500.0 | 2.6250 | 2.5000 | 2.6250 | – |", lines)
        self.assertIn("Windows of 65,536 tokens", lines)
        self.assertIn("Chosen: a = None (the lowest whole-window CE).", lines)

    def test_selection_section_names_the_attention_form_of_an_ablation(self):
        # hypenet.attention_rope=True (the ablation keeping the teacher's RoPE) must not be
        # reported as HypeNet's NoPE attention.
        workdir = self.create_tempdir().full_path
        os.makedirs(os.path.join(workdir, "select"))
        sel = {"attention_layers": [1, 4], "csr": [0.3] * 5, "recall": [0.5] * 5,
               "scores": [1.0, 7.0, 0.2, 0.5, 6.0]}
        with open(os.path.join(workdir, "select", "selection.json"), "w") as f:
            json.dump(sel, f)
        for hyp, want in (({"attention_rope": True}, "RoPE + gate"),
                          ({"attention_rope": False}, "NoPE + gate"), ({}, "NoPE + gate")):
            with open(os.path.join(workdir, "config.json"), "w") as f:
                json.dump({"hypenet": hyp}, f)
            page = report_lib.render_markdown(workdir)
            self.assertIn(f"Kept as softmax attention ({want} in the student): **[1, 4]**",
                          page, hyp)

    def test_stage_table_says_select_did_not_run_when_the_config_sets_the_layers(self):
        # The selection's ablation as its own pipeline (--stages without select): no select
        # directory, attention layers from the config.
        workdir = self.create_tempdir().full_path
        config = {"select": {"seq_len": 512, "batch_size": 32, "max_val_batches": 8,
                             "synthetic_recall": 20},
                  "hypenet": {"attention_layers": [3, 7, 11]}}
        with open(os.path.join(workdir, "config.json"), "w") as f:
            json.dump(config, f)
        page = report_lib.render_markdown(workdir)
        self.assertIn("| select | not run: `hypenet.attention_layers` = [3, 7, 11] set in the "
                      "config |", page)
        self.assertNotIn("single-replacement sweep over ? layers", page)
        # With a select directory (a branch from a copied workdir) the sweep row stays.
        os.makedirs(os.path.join(workdir, "select"))
        self.assertIn("| select | single-replacement sweep over",
                      report_lib.render_markdown(workdir))

    def test_page_from_hand_made_json(self):
        workdir = self.create_tempdir().full_path

        def write(rel, obj, jsonl=False):
            path = os.path.join(workdir, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                if jsonl:
                    f.writelines(json.dumps(r) + "\n" for r in obj)
                else:
                    json.dump(obj, f)

        def stage(seq_len, batch, steps, lr):
            return {"seq_len": seq_len, "batch_size": batch,
                    "optim": {"learning_rate": lr}, "train": {"total_steps": steps}}

        write("config.json", {
            "teacher": {"path": "/tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf", "kind": "gguf"},
            "stage1": stage(512, 32, 300, 1e-3), "stage2": stage(512, 32, 300, 1e-4),
            "stage3": stage(16384, 1, 40, 1e-5),
            "select": {"seq_len": 512, "batch_size": 32, "max_val_batches": 2,
                       "synthetic_recall": 20},
            "calibrate": {"seq_len": 16384, "batch_size": 1, "max_batches": 2,
                          "candidates": [None, 500.0]},
            "report": {"dtype": "bfloat16"}})
        write("stage1/metrics.jsonl", [{"step": 10, "loss": 0.5}, {"step": 300, "loss": 0.125}],
              jsonl=True)
        write("stage1/timing.jsonl", [{"wall_s": 30.0}, {"wall_s": 12.0}], jsonl=True)
        # Two invocations: 9 + 3 timed steps of 16,384 tokens in 2 + 1 s, 1e9 FLOP per token
        # on a 1e15 FLOP/s device: 65,536 tokens/s, MFU 6.6%.
        write("stage1/throughput.jsonl", [
            {"tokens_per_step": 16384, "timed_steps": 9, "timed_s": 2.0, "first_step_s": 20.5,
             "flops_per_token": 1e9, "peak_flops": 1e15},
            {"tokens_per_step": 16384, "timed_steps": 3, "timed_s": 1.0, "first_step_s": 4.0,
             "flops_per_token": 1e9, "peak_flops": 1e15}], jsonl=True)
        write("stage1/metrics.jsonl", [{"step": 10, "loss": 0.5, "tokens_per_s": 60000.0,
                                        "mfu": 0.06},
                                       {"step": 300, "loss": 0.125, "tokens_per_s": 70000.0,
                                        "mfu": 0.07}], jsonl=True)
        write("stage1/done.json", {})
        write("select/selection.json", {"attention_layers": [1], "csr": [0.5, 0.4, 0.5],
                                        "recall": [1.0, 0.5, 0.9], "scores": [0.0, 5.0, 50.0],
                                        "csr_metric": "exp(-val_ce) proxy",
                                        "recall_accuracy": [0.75, 0.25, None],
                                        "ranking": [2, 1, 0], "cut_scores": [50.0, 5.0],
                                        "notice": None,
                                        "teacher": {"csr": 0.55, "recall": 0.95,
                                                    "recall_accuracy": 0.5}})
        write("calibrate/calibration.json", {"best": 500.0,
                                             "losses": {"None": 3.25, "500.0": 3.125}})
        write("pipeline.jsonl", [{"command": "python experiments/halo_pipeline.py --x=1",
                                  "started": "2026-11-30T10:00:00", "wall_s": 300.0,
                                  "stages": {"stage1": 42.0}, "status": "deadline"}],
              jsonl=True)
        # niah_single_2 as reports wrote it before the SE fields (n unknown: no SE shown).
        niah_old = {"grid": [[1.0, 0.5], [0.0, 0.0]], "lengths": [2048, 16384],
                    "depths": [10.0, 90.0], "mean": 0.375,
                    "per_length": {"2048": 0.75, "16384": 0.0}, "examples": []}

        def niah_new(short, long):  # 100 prompts per length
            ses = [math.sqrt(p * (1 - p) / 100) for p in (short, long)]
            return {"grid": [[short, short], [long, long]], "lengths": [2048, 16384],
                    "depths": [10.0, 90.0], "n_per_cell": 50,
                    "per_length": {"2048": short, "16384": long},
                    "per_length_se": {"2048": ses[0], "16384": ses[1]},
                    "per_length_n": {"2048": 100, "16384": 100},
                    "short": {"lengths": [2048], "mean": short, "se": ses[0]},
                    "long": {"lengths": [16384], "mean": long, "se": ses[1]}, "examples": []}
        speed = {"prompt_tokens": 8160, "capacity": 8288, "prefill_s": 0.0125,
                 "prefill_tokens_per_s": 652800.0, "decode_s_per_token": 0.004,
                 "decode_tokens_per_s": 250.0,
                 "state_bytes": {"kv_cache": 2 ** 20, "recurrent": 2 ** 21,
                                 "total": 3 * 2 ** 20},
                 "device_memory": {"peak_bytes_in_use": 5 * 2 ** 30}}
        write("report/report.json", {
            "options": {"csr_limit": 500}, "updated": "2026-11-30T10:05:00+00:00",
            "meta": {"teacher": "the teacher", "student": "the student",
                     "hardware": {"device_kind": "NVIDIA H200", "device_count": 1,
                                  "platform": "gpu", "jax": "0.11.2"}},
            "results": {
                "perplexity": {n: {"token_perplexity": p, "word_perplexity": 2 * p,
                                   "bits_per_byte": 1.0, "file": "wiki.test.raw",
                                   "window": 2048}
                               for n, p in (("teacher", 12.5), ("student", 15.25))},
                "commonsense": {n: {"piqa": {"acc": a, "acc_norm": a, "acc_chance": 0.5,
                                             "acc_norm_chance": 0.5, "n": 500},
                                    "winogrande": {"acc": w, "acc_chance": 0.5, "n": 1000}}
                                for n, a, w in (("teacher", 0.625, 0.607),
                                                ("student", 0.5, 0.5))},
                "niah": {"teacher": {"niah_single_1": niah_new(0.9, 0.2),
                                     "niah_single_2": niah_old},
                         "student": {"niah_single_1": niah_new(0.6, 0.1),
                                     "niah_single_2": niah_old}},
                "speed": {"teacher": {"8192": speed}, "student": {"8192": speed}}},
            "seconds": {"perplexity/teacher": 3.5}})
        page = report_lib.render_markdown(workdir)
        self.assertIn("# HALO conversion of SmolLM2-135M-Instruct.Q4_1.gguf (2026-11-30)", page)
        self.assertIn("1 x NVIDIA H200 (gpu); jax 0.11.2", page)
        self.assertIn("python experiments/halo_pipeline.py --x=1", page)
        self.assertIn("| stage1 | per-layer MSE to the attention outputs (Lightning students) "
                      "| 512 x 32 x 300 | 4,915,200 | 0.001 | 0.5000 (10) | 0.1250 (300) | 42 "
                      "| yes |", page)
        self.assertIn("| stage3 | next-token CE, long windows | 16384 x 1 x 40 | 655,360 |",
                      page)
        self.assertIn("| stage2 |", page)
        self.assertIn("| stage1 | 16,384 | 1.000 | 12 | 65,536 | 6.6% | 65,000 | 6.5% | "
                      "20.5, 4.0 |", page)
        self.assertIn("| stage2 | – | – | – | – | – | – | – | – |", page)
        self.assertIn("| 1 **(attn)** | 0.4000 | 0.5000 | 0.250 | 5.000 |", page)
        self.assertIn("| 2 | 0.5000 | 0.9000 | – | 50.000 |", page)
        self.assertIn("| teacher (no replacement) | 0.5500 | 0.9500 | 0.500 | – |", page)
        self.assertIn("* Scores at the cut (rank k, k + 1): [50.0, 5.0]; no tie decides the "
                      "choice.", page)
        # A calibration.json written before the position buckets: one column.
        self.assertIn("| a | validation CE |\n|---|---:|\n| None | 3.2500 |\n| 500.0 | 3.1250 |",
                      page)
        self.assertIn("Chosen: a = 500.0 (the lowest whole-window CE).", page)
        self.assertIn("Training tokens in all: 10,485,760.", page)
        self.assertIn("| perplexity (wiki.test.raw, window 2048) | token_perplexity | 12.500 | "
                      "15.250 |", page)
        # SE by hand: sqrt(.625 * .375 / 500) = .02165, sqrt(.5 * .5 / 500) = .02236.
        self.assertIn("| piqa (n=500, chance 0.500) | acc_norm | 0.625 ± 0.022 | 0.500 ± 0.022 |",
                      page)
        # sqrt(.607 * .393 / 1000) = .01545, sqrt(.25 / 1000) = .01581; no acc_norm row.
        self.assertIn("| winogrande (n=1000, chance 0.500) | acc | 0.607 ± 0.015 | "
                      "0.500 ± 0.016 |", page)
        self.assertNotIn("| winogrande (n=1000, chance 0.500) | acc_norm |", page)
        # Mean of piqa acc_norm and winogrande acc: (.625 + .607) / 2 = .616, SE
        # sqrt(.02165^2 + .01545^2) / 2 = .01330; student .5, sqrt(.0005 + .00025) / 2 = .01369.
        self.assertIn("| commonsense (2 tasks) | mean of acc_norm (acc where none) | "
                      "0.616 ± 0.013 | 0.500 ± 0.014 |", page)
        # NIAH, SE sqrt(p (1 - p) / 100): .9 -> .030, .6 -> .049.
        self.assertIn("| niah_single_1 (n=100 per length) | string_match_all @ 2,048 | "
                      "0.900 ± 0.030 | 0.600 ± 0.049 |", page)
        self.assertIn("| niah_single_1 | mean 16,384 | 0.200 ± 0.040 | 0.100 ± 0.030 |", page)
        self.assertIn("| niah_single_2 | string_match_all @ 16,384 | 0.000 | 0.000 |", page)
        # Summary: ratio .6 / .9 = .667, SE .667 * sqrt((.049 / .6)^2 + (.03 / .9)^2) = .059;
        # over the two tasks (no SE for the old one): (.9 + .75) / 2, (.6 + .75) / 2, ...
        self.assertIn("| task | teacher 2,048 | student 2,048 | student / teacher 2,048 | "
                      "teacher 16,384 | student 16,384 |", page)
        self.assertIn("| niah_single_1 | 0.900 ± 0.030 | 0.600 ± 0.049 | 0.667 ± 0.059 | "
                      "0.200 ± 0.040 | 0.100 ± 0.030 |", page)
        self.assertIn("| mean of 2 tasks | 0.825 | 0.675 | 0.818 | 0.100 | 0.050 |", page)
        self.assertIn("niah_single_1, teacher (string_match_all, 50 prompts per cell;", page)
        self.assertIn("| 2,048 | 1.00 | 0.50 |", page)
        self.assertIn("| speed @ 8,192 | decode (ms/token) | 4.00 | 4.00 |", page)
        self.assertIn("| speed @ 8,192 | state: total (MiB) | 3.0 | 3.0 |", page)
        self.assertIn("| speed @ 8,192 | device peak so far (MiB) | 5,120.0 | 5,120.0 |", page)
        # Missing stages say so instead of failing.
        self.assertIn("| stage2 | forward KL from the teacher, whole student | 512 x 32 x 300 | "
                      "4,915,200 | 0.0001 | – | – | – | no |", page)


if __name__ == "__main__":
    absltest.main()
