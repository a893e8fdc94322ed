"""The HALO report stage on the tiny config, its measurements, and the results page."""

import dataclasses
import json
import os
import time

from absl.testing import absltest

from configs import halo_smollm2
from lattn_jax.data import tokenizers as tok_lib
from lattn_jax.halo import experiment
from lattn_jax.halo import hypenet
from lattn_jax.halo import loaders
from lattn_jax.halo import report as report_lib
from lattn_jax.halo import stages
from tests.lattn_jax.halo import hypenet_test

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


class ReportStageTest(absltest.TestCase):

    def test_report_after_the_tiny_stages_resumes_and_renders(self):
        workdir = self.create_tempdir().full_path
        cfg = tiny_config(self.create_tempdir().full_path, ("perplexity", "niah"))
        for stage in ("stage1", "stage2"):
            self.assertTrue(experiment.run(cfg, workdir, stage, **QUIET)["complete"])
            self.assertTrue(experiment.is_done(workdir, stage))
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
            grid = rep["results"]["niah"][name]["niah_single_1"]["grid"]
            self.assertEqual(len(grid), 1)
            self.assertBetween(grid[0][0], 0.0, 1.0)
        self.assertEqual(rep["meta"]["attention_layers"], [1])
        self.assertEqual(rep["meta"]["student_params"], "stage2")  # no stage3 checkpoint
        # Measurements already in report.json are not repeated.
        seconds = dict(rep["seconds"])
        experiment.run(cfg, workdir, "report", **QUIET)
        self.assertEqual(report_lib.read_json(out["report"])["seconds"], seconds)
        page = report_lib.render_markdown(workdir)
        self.assertIn("| stage1 | per-layer MSE", page)
        self.assertIn("| perplexity (wiki.test.raw, window 64) | token_perplexity |", page)
        self.assertIn("niah_single_1, student", page)
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


class MarkdownTest(absltest.TestCase):

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
        write("stage1/done.json", {})
        write("select/selection.json", {"attention_layers": [1], "csr": [0.5, 0.4, 0.5],
                                        "recall": [1.0, 0.5, 0.9], "scores": [0.0, 5.0, 50.0],
                                        "csr_metric": "exp(-val_ce) proxy"})
        write("calibrate/calibration.json", {"best": 500.0,
                                             "losses": {"None": 3.25, "500.0": 3.125}})
        write("pipeline.jsonl", [{"command": "python experiments/halo_pipeline.py --x=1",
                                  "started": "2026-11-30T10:00:00", "wall_s": 300.0,
                                  "stages": {"stage1": 42.0}, "status": "deadline"}],
              jsonl=True)
        niah_res = {"grid": [[1.0, 0.5], [0.0, 0.0]], "lengths": [2048, 32768],
                    "depths": [10.0, 90.0], "mean": 0.375,
                    "per_length": {"2048": 0.75, "32768": 0.0}, "examples": []}
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
                                             "acc_norm_chance": 0.5, "n": 500}}
                                for n, a in (("teacher", 0.625), ("student", 0.5))},
                "niah": {"teacher": {"niah_single_2": niah_res},
                         "student": {"niah_single_2": niah_res}},
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
        self.assertIn("| 1 **(attn)** | 0.4000 | 0.500 | 5.000 |", page)
        self.assertIn("Chosen: a = 500.0.", page)
        self.assertIn("Training tokens in all: 10,485,760.", page)
        self.assertIn("| perplexity (wiki.test.raw, window 2048) | token_perplexity | 12.500 | "
                      "15.250 |", page)
        self.assertIn("| piqa (n=500, chance 0.500) | acc_norm | 0.625 | 0.500 |", page)
        self.assertIn("| niah_single_2 | string_match_all @ 32,768 | 0.00 | 0.00 |", page)
        self.assertIn("| 2,048 | 1.00 | 0.50 |", page)
        self.assertIn("| speed @ 8,192 | decode (ms/token) | 4.00 | 4.00 |", page)
        self.assertIn("| speed @ 8,192 | state: total (MiB) | 3.0 | 3.0 |", page)
        self.assertIn("| speed @ 8,192 | device peak so far (MiB) | 5,120.0 | 5,120.0 |", page)
        # Missing stages say so instead of failing.
        self.assertIn("| stage2 | forward KL from the teacher, whole student | 512 x 32 x 300 | "
                      "4,915,200 | 0.0001 | – | – | – | no |", page)


if __name__ == "__main__":
    absltest.main()
