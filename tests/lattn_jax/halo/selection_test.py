"""HALO layer-selection score against the authors' sweep logs (spec §5), the evaluators, and the
sweep's probes (held-out batched acc_norm, teacher-forced NIAH recall) on a hand-built model in
which exactly one layer retrieves."""

import bz2
import dataclasses
import json
import os
import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest
from flax import nnx

from lattn_jax import config as config_lib
from lattn_jax import records
from lattn_jax.data import tokenizers as tok_lib
from lattn_jax.eval import scoring
from lattn_jax.eval import tasks as tasks_lib
from lattn_jax.halo import experiment
from lattn_jax.halo import hypenet
from lattn_jax.halo import loaders
from lattn_jax.halo import selection
from lattn_jax.halo import stages
from tests import tolerances
from tests.lattn_jax.halo import hypenet_test

# Spec §5.1 (HypeNet-2B / Qwen3-1.7B): per-layer CSR and recall averages.
CSR_2B = [0.3108, 0.5548, 0.5804, 0.5839, 0.5756, 0.5799, 0.5784, 0.5753, 0.5828, 0.5802, 0.5722,
          0.5727, 0.5768, 0.5782, 0.5784, 0.5794, 0.5791, 0.5725, 0.5757, 0.5776, 0.5708, 0.5768,
          0.5709, 0.5775, 0.5776, 0.5769, 0.5779, 0.5794]
RECALL_2B = [0.6339, 0.7202, 0.6937, 0.7144, 0.7097, 0.7432, 0.6862, 0.7100, 0.7258, 0.6935,
             0.7249, 0.6883, 0.6936, 0.7258, 0.7182, 0.7314, 0.7017, 0.7053, 0.7087, 0.6847,
             0.7188, 0.6531, 0.7274, 0.7064, 0.6936, 0.6705, 0.7008, 0.7216]
# Spec §5.3 (HypeNet-9B / Qwen3-8B).
CSR_9B = [0.5561, 0.7099, 0.7086, 0.7059, 0.7101, 0.7043, 0.7111, 0.7094, 0.7079, 0.7081, 0.7116,
          0.7071, 0.7066, 0.7062, 0.7049, 0.7042, 0.7081, 0.7028, 0.7058, 0.7076, 0.7068, 0.7034,
          0.7037, 0.7046, 0.7090, 0.7060, 0.7058, 0.7083, 0.7076, 0.7054, 0.7084, 0.7071, 0.7041,
          0.7084, 0.7095, 0.7096]
RECALL_9B = [0.7712, 0.8008, 0.7879, 0.8013, 0.8014, 0.7968, 0.8025, 0.7781, 0.8060, 0.8024,
             0.8064, 0.8055, 0.8073, 0.7925, 0.7979, 0.7945, 0.8091, 0.7989, 0.8035, 0.8084,
             0.7978, 0.8004, 0.7843, 0.8011, 0.7749, 0.8035, 0.7928, 0.8089, 0.8046, 0.7984,
             0.8056, 0.7989, 0.8032, 0.7750, 0.8010, 0.8038]


class ScoreTest(absltest.TestCase):

    def test_reproduces_the_2b_and_9b_configs(self):
        scores = selection.halo_scores(CSR_2B, RECALL_2B)
        self.assertEqual(selection.select_attention_layers(scores, 28 // 4),
                         [2, 3, 6, 8, 9, 21, 25])
        self.assertEqual(selection.rank_layers(scores)[:7], [3, 8, 2, 9, 21, 25, 6])
        # Capped best-CSR layer, and layer 0 (catastrophic CSR) / layer 5 (best recall).
        np.testing.assert_allclose(scores[[3, 0, 5]], [50.0, 0.40, 0.0], atol=5e-3)
        scores = selection.halo_scores(CSR_9B, RECALL_9B)
        self.assertEqual(selection.select_attention_layers(scores, 36 // 4),
                         [1, 2, 4, 6, 7, 10, 24, 33, 34])

    def test_hand_computed_score(self):
        # max C = 0.6 (layer 1), max R = 0.9 (layer 0).
        scores = selection.halo_scores([0.5, 0.6, 0.4], [0.9, 0.7, 0.8])
        np.testing.assert_allclose(scores, [0.0, 50.0, 0.1 / 0.2])

    def test_bad_input(self):
        with self.assertRaisesRegex(ValueError, "equal-length"):
            selection.halo_scores([0.1, 0.2], [0.3])
        with self.assertRaisesRegex(ValueError, "k=5"):
            selection.select_attention_layers([1.0, 2.0], 5)


class _CharTokenizer:
    eos_id = 0

    def encode(self, text):
        return [ord(c) % 96 + 1 for c in text]

    def decode(self, ids):
        return "".join(chr(i - 1 + 96 * (i - 1 < 32)) for i in ids)


class EvaluatorTest(absltest.TestCase):

    def test_acc_norm_and_recall_with_an_oracle_model(self):
        import jax.numpy as jnp

        tok = _CharTokenizer()

        def copy_model(tokens):  # predicts "token t+1 == token t": favours repeated letters
            return 10.0 * jnp.eye(97)[tokens]

        items = [{"context": "xx", "choices": ["ab", "xx"], "label": 1},
                 {"context": "aa", "choices": ["aa", "bc"], "label": 0}]
        self.assertEqual(selection.acc_norm(copy_model, tok, items), 1.0)
        rec = [{"prompt": "zz", "answer": "zzz"}, {"prompt": "zz", "answer": "q"}]
        self.assertEqual(selection.recall_contains(copy_model, tok, rec, max_new_tokens=3), 0.5)
        self.assertLen(selection.synthetic_recall_items(3), 3)

    def test_sweep_resumes(self):
        path = self.create_tempfile().full_path
        calls = []

        def evaluate(layer):
            calls.append(layer)
            return 0.5 + layer, 0.1 * layer

        selection.sweep(2, evaluate, path, print_fn=lambda s: None)
        csr, recall = selection.sweep(3, evaluate, path, print_fn=lambda s: None)
        self.assertEqual(calls, [0, 1, 2])
        np.testing.assert_allclose(csr, [0.5, 1.5, 2.5])


def random_teacher(seed=1):
    """A tiny untied teacher with a wide init, so that greedy tokens vary (a tied, narrow one
    repeats its input)."""
    cfg = dataclasses.replace(hypenet_test.tiny_teacher_config(tie=False), init_std=0.5)
    return cfg, stages.random_teacher(cfg, seed=seed)


def compiled_forward(model):
    """``model``'s full forward ``tokens -> logits`` as one jitted program.

    The full-recomputation reference re-runs the whole sequence for every new token; op by op
    that dominated these tests' time. Compiled, it is still the plain causal forward, and every
    reference call has the same padded shape, so it compiles once per model.
    """
    graphdef, state = nnx.split(model)
    forward = jax.jit(lambda s, tokens: nnx.merge(graphdef, s)(tokens))
    return lambda tokens: forward(state, tokens)


class StateDecodingTest(absltest.TestCase):
    """The recall generator decodes with per-layer states and gives the full-forward tokens."""

    def test_batched_state_decoding_equals_full_recomputation(self):
        cfg, params = random_teacher()
        model = loaders.build_model(cfg, params)
        reference = compiled_forward(model)
        prompts = [[5, 9, 2], [11, 3, 8, 60, 1, 17, 4, 33, 2], [7]]
        free = [selection.greedy_generate_full(reference, p, 8) for p in prompts]
        self.assertGreater(len({t for out in free for t in out}), 6)  # not a constant model
        # A stop id that occurs: rows end before it.
        k = next(i for i in range(2, 8) if free[0][i] not in free[0][:i])
        full = [selection.greedy_generate_full(reference, p, 8, free[0][k]) for p in prompts]
        self.assertLen(full[0], k)
        # Batched, left-padded to a multiple of 8, two prompts per call.
        decoded = selection.greedy_generate(model, prompts, 8, free[0][k], batch_size=2,
                                            bucket=8)
        self.assertEqual(decoded, full)

    @pytest.mark.slow  # ~21 s on 2 cores; the retrieval-layer ranking test runs in CI
    def test_sweep_model_is_each_single_replacement_model(self):
        cfg, params = random_teacher(seed=2)
        s1, sweep = stage1_sweep(cfg, params, seed=3)
        tokens = np.random.default_rng(0).integers(0, 61, size=(2, 13))
        prompts = [[5, 9, 2], [11, 3, 8, 60, 1, 17, 4]]
        for layer in (-1, 2):
            keep = [i for i in range(cfg.num_layers) if i != layer]
            cfg_l = hypenet.hypenet_config(cfg, keep, attention_rope=True, attention_gate=False)
            lightning_params = {layer: s1["mixers"][layer]} if layer >= 0 else None
            converted = loaders.build_model(cfg_l, hypenet.convert(
                params, cfg, cfg_l, lightning_params=lightning_params))
            sweep.select(layer)
            np.testing.assert_allclose(sweep.logits(tokens), converted(jnp.asarray(tokens)),
                                       **tolerances.fwd_tol(jnp.float32))
            reference = compiled_forward(converted)
            full = [selection.greedy_generate_full(reference, p, 6) for p in prompts]
            self.assertEqual(selection.greedy_generate(sweep.generator, prompts, 6), full,
                             msg=f"{layer=}")
            batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
                     "weights": np.ones((2, 12), np.float32)}
            total, count = sweep.loss_sums(batch)
            self.assertEqual(count, 24.0)
            self.assertGreater(total, 0.0)

    def test_sweep_stops_when_asked(self):
        path = self.create_tempfile().full_path
        with self.assertRaises(selection.Interrupted):
            selection.sweep(3, lambda layer: (1.0, 1.0), path, print_fn=lambda s: None,
                            should_stop=lambda: len(selection.read_jsonl(path)) >= 2)
        self.assertLen(selection.read_jsonl(path), 2)
        csr, _ = selection.sweep(3, lambda layer: (2.0, 1.0), path, print_fn=lambda s: None)
        np.testing.assert_allclose(csr, [1.0, 1.0, 2.0])


# ---------------------------------------------------------------------------------------------
# The sweep's probes
# ---------------------------------------------------------------------------------------------

_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _words(rng, n, min_len=2, max_len=7):
    """``n`` random lowercase words (no digits: the retrieval test's needle is the only one)."""
    return ["".join(rng.choice(_LETTERS) for _ in range(rng.randint(min_len, max_len)))
            for _ in range(n)]


def write_probe_data(root, *, n_arc=12, n_hellaswag=40, seed=0):
    """A tiny ``shared/data`` layout: ARC Dev and Test files (different questions), a HellaSwag
    validation file in the llama.cpp rendering, and a digit-free essay haystack."""
    rng = random.Random(seed)
    arc_dir = os.path.join(root, "eval", "arc")
    os.makedirs(arc_dir, exist_ok=True)
    for name in ("Easy", "Challenge"):
        for split in ("Dev", "Test"):
            with open(os.path.join(arc_dir, f"ARC-{name}-{split}.jsonl"), "w") as f:
                for i in range(n_arc):
                    labels = ["A", "B", "C", "D"][:rng.choice([3, 4])] if i % 3 else ["1", "2",
                                                                                      "3"]
                    q = {"stem": f"{split} {name} q{i}: " + " ".join(_words(rng, 6)) + "?",
                         "choices": [{"label": lab, "text": " ".join(_words(rng, 2))}
                                     for lab in labels]}
                    f.write(json.dumps({"question": q, "answerKey": rng.choice(labels)}) + "\n")
    hs_dir = os.path.join(root, "eval", "hellaswag")
    os.makedirs(hs_dir, exist_ok=True)
    lines = []
    for i in range(n_hellaswag):
        lines += [f"Activity {i}: " + " ".join(_words(rng, 8)), str(rng.randrange(4))]
        lines += [" ".join(_words(rng, rng.randint(2, 5))) for _ in range(4)]
    with bz2.open(os.path.join(hs_dir, "hellaswag_val_full.txt.bz2"), "wt") as f:
        f.write("\n".join(lines) + "\n")
    essays = os.path.join(root, "niah", "PaulGrahamEssays")
    os.makedirs(essays, exist_ok=True)
    text = " ".join(w + ("." if rng.random() < 0.12 else "") for w in _words(rng, 2000))
    with open(os.path.join(essays, "essay.txt"), "w") as f:
        f.write(text)
    return root


class HeldOutItemsTest(absltest.TestCase):

    def test_items_are_disjoint_from_the_report(self):
        root = write_probe_data(self.create_tempdir().full_path)
        eval_dir = os.path.join(root, "eval")
        report_subsets = ((10, 1234), (7, 42))
        held = selection.heldout_csr_items(eval_dir, per_task=20, seed=5,
                                           hellaswag_exclude=report_subsets)
        self.assertEqual(list(held), list(selection.HELDOUT_CSR_TASKS))
        # HellaSwag: none of the report's seeded subsets (load_task's documents).
        hs = held["hellaswag"]
        self.assertLen(hs.docs, 20)
        for limit, seed in report_subsets:
            self.assertEmpty(set(hs.indices) & set(tasks_lib.subset_indices(40, limit, seed)))
            report_docs = tasks_lib.load_task("hellaswag", eval_dir, limit, seed)
            self.assertEmpty(set(hs.docs) & set(report_docs))
        all_hs = tasks_lib.load_task("hellaswag", eval_dir)
        self.assertEqual(list(hs.docs), [all_hs[i] for i in hs.indices])
        # ARC: the Dev files; the report's Test items never appear. load_arc_split("Test") is
        # tasks.load_task's ARC (same prompt format).
        for task in ("arc_easy", "arc_challenge"):
            self.assertTrue(held[task].source.endswith("-Dev.jsonl"))
            self.assertLen(held[task].docs, 12)  # fewer than per_task: all of them
            test_docs = tasks_lib.load_task(task, eval_dir)
            self.assertEqual(selection.load_arc_split(eval_dir, task, "Test")[1], test_docs)
            self.assertEmpty(set(held[task].docs) & set(test_docs))
            self.assertTrue(all(d.requests[0][0].startswith("Question: Dev")
                                for d in held[task].docs))
        # Seeded: the same items again, others with another seed.
        again = selection.heldout_csr_items(eval_dir, per_task=20, seed=5,
                                            hellaswag_exclude=report_subsets)
        self.assertEqual(again["hellaswag"].indices, hs.indices)
        other = selection.heldout_csr_items(eval_dir, tasks=("hellaswag",), per_task=20, seed=6,
                                            hellaswag_exclude=report_subsets)
        self.assertNotEqual(other["hellaswag"].indices, hs.indices)

    def test_bad_options_and_missing_files(self):
        root = self.create_tempdir().full_path
        with self.assertRaisesRegex(ValueError, "select.csr_tasks.*piqa"):
            selection.heldout_csr_items(root, tasks=("piqa",))
        with self.assertRaisesRegex(FileNotFoundError, "ARC-Easy-Dev.jsonl"):
            selection.heldout_csr_items(root, tasks=("arc_easy",))
        with self.assertRaisesRegex(ValueError, "select.recall_tasks"):
            selection.niah_recall_prompts(tok_lib.make_tokenizer("byte"), tasks=("niah_x",),
                                          lengths=(256,), depths=(50.0,), count=1, seed=0)
        with self.assertRaisesRegex(FileNotFoundError, "PaulGrahamEssays|essays"):
            selection.niah_recall_prompts(tok_lib.make_tokenizer("byte"),
                                          tasks=("niah_single_2",), lengths=(256,),
                                          depths=(50.0,), count=1, seed=0,
                                          essays_dir=os.path.join(root, "none"))

    def test_the_real_hellaswag_probe_avoids_the_report_subset(self):
        eval_dir = os.path.join(experiment.report_defaults()["data_dir"], "eval")
        if not os.path.exists(os.path.join(eval_dir, "hellaswag")):
            self.skipTest(f"no {eval_dir}")
        held = selection.heldout_csr_items(eval_dir, per_task=200,
                                           hellaswag_exclude=((1000, 1234),))
        report_docs = tasks_lib.load_task("hellaswag", eval_dir, limit=1000, seed=1234)
        self.assertLen(held["hellaswag"].docs, 200)
        self.assertEmpty(set(held["hellaswag"].docs) & set(report_docs))
        for task in ("arc_easy", "arc_challenge"):
            self.assertEmpty(set(held[task].docs) & set(tasks_lib.load_task(task, eval_dir)))


def stage1_sweep(cfg, params, seed, bucket=8):
    """``(stage-1 state, ReplacementSweep)`` as the pipeline builds them (Lightning layers
    initialised from the teacher's attention)."""
    s1_cfg = stages.stage1_student_config(cfg)
    s1 = stages.stage1_init(cfg, params, s1_cfg, seed=seed)
    sweep = selection.ReplacementSweep(
        selection.build_sweep_model(cfg, params, s1_cfg, s1["mixers"]), bucket=bucket)
    return s1, sweep


def byte_teacher(seed=0):
    """A random untied byte-level teacher (vocab 257) with a wide init."""
    cfg = dataclasses.replace(hypenet_test.tiny_teacher_config(tie=False), vocab_size=257,
                              init_std=0.3)
    return cfg, stages.random_teacher(cfg, seed=seed)


def random_docs(rng, n, trailing_space=False):
    """Multiple-choice docs with random contexts and 2-4 continuations of varied lengths."""
    docs = []
    for _ in range(n):
        ctx = " ".join(_words(rng, rng.randint(1, 6))) + (" " if trailing_space else "")
        conts = [" " + " ".join(_words(rng, rng.randint(1, 4)))
                 for _ in range(rng.randint(2, 4))]
        docs.append(tasks_lib.Doc(requests=tuple((ctx, c) for c in conts),
                                  gold=rng.randrange(len(conts)), choices=tuple(conts)))
    return docs


class BatchedScoringTest(absltest.TestCase):

    def test_batched_acc_norm_equals_the_per_item_reference(self):
        cfg, params = byte_teacher()
        model = loaders.build_model(cfg, params)
        forward = compiled_forward(model)  # one jitted program per shape, shared below
        scorer = selection.logits_scorer(forward)
        tok = tok_lib.make_tokenizer("byte")
        rng = random.Random(3)
        docs = random_docs(rng, 9)
        # The report's Scorer and the probe's batches (4 rows; left truncation at 40 tokens for
        # the longest rows) give the same log-likelihoods.
        requests = [scoring.encode_pair(tok, c, x) for d in docs for c, x in d.requests]
        ref = scoring.Scorer(model, max_len=40, batch_size=4, bucket=64).loglikelihood(requests)
        prepared = selection.prepare_continuations(requests, batch_size=4, bucket=64,
                                                   max_len=40)
        self.assertGreater(len(prepared.batches), 4)
        self.assertEqual([s[:2] for s in prepared.shapes], [(4, 40)])  # one program
        got = selection.continuation_loglikelihoods(scorer, prepared)
        np.testing.assert_allclose([g[0] for g in got], [r[0] for r in ref], rtol=1e-5,
                                   atol=1e-4)
        self.assertEqual([g[1] for g in got], [r[1] for r in ref])
        # acc_norm of the batched probe == the per-item, batch-1 selection.acc_norm (contexts
        # without trailing spaces: both split the tokens alike and divide by the same length).
        probe = selection.CsrProbe({"task_a": docs[:5], "task_b": docs[5:]}, tok,
                                   batch_size=4, bucket=64, max_len=512)
        out = probe.evaluate(scorer)
        for name, part in (("task_a", docs[:5]), ("task_b", docs[5:])):
            items = [{"context": d.requests[0][0], "choices": list(d.choices), "label": d.gold}
                     for d in part]
            self.assertAlmostEqual(out["per_task"][name], selection.acc_norm(forward, tok, items))
        self.assertAlmostEqual(out["csr"], np.mean(list(out["per_task"].values())))
        self.assertEqual(probe.num_items, {"task_a": 5, "task_b": 4})
        # And against lm-eval's rule spelled out per item (trailing spaces move to the
        # continuation; normalised by the choice's characters).
        docs = random_docs(rng, 6, trailing_space=True)
        out = selection.CsrProbe({"t": docs}, tok, batch_size=4, bucket=64).evaluate(scorer)
        correct = []
        for d in docs:
            lls = []
            for c, x in d.requests:
                ctx, cont = scoring.encode_pair(tok, c, x)
                lp = selection._logprobs(forward, ctx + cont)[len(ctx) - 1:]
                lls.append(float(np.sum(lp, dtype=np.float64)))
            lens = np.array([len(ch) for ch in d.choices], np.float64)
            correct.append(float(np.argmax(np.array(lls) / lens) == d.gold))
        self.assertAlmostEqual(out["per_task"]["t"], np.mean(correct))
        self.assertEqual(out["per_doc"]["t"], [int(c) for c in correct])

    def test_sweep_target_logprobs_read_the_head_at_the_positions(self):
        cfg, params = byte_teacher(seed=4)
        _, sweep = stage1_sweep(cfg, params, seed=5)
        rng = np.random.default_rng(1)
        tokens = rng.integers(0, 257, size=(3, 24))
        positions = rng.integers(0, 24, size=(3, 5))
        targets = rng.integers(0, 257, size=(3, 5))
        for layer in (-1, 1):
            sweep.select(layer)
            lp, greedy = sweep.target_logprobs(tokens, positions, targets)
            ref_lp, ref_greedy = selection.logits_scorer(sweep.logits)(tokens, positions,
                                                                       targets)
            self.assertEqual(lp.dtype, np.float32)
            np.testing.assert_allclose(lp, ref_lp, **tolerances.fwd_tol(jnp.float32))
            np.testing.assert_array_equal(greedy, ref_greedy)

    def test_continuous_recall_by_hand(self):
        # A bigram model: logits[b, t] = log q[tokens[b, t]], q's rows are distributions.
        q = np.array([[0.5, 0.25, 0.125, 0.125],
                      [0.1, 0.2, 0.3, 0.4],
                      [0.25, 0.25, 0.25, 0.25],
                      [0.7, 0.1, 0.1, 0.1]], np.float32)
        table = jnp.log(jnp.asarray(q))
        scorer = selection.logits_scorer(lambda tokens: table[tokens])

        def prompt(ctx, ans, cell="t"):
            return selection.RecallPrompt(task=cell, length=8, depth=50.0, value="",
                                          context_ids=tuple(ctx), answer_ids=tuple(ans))

        prompts = [prompt([2, 3, 0], [0, 1]),  # p = q[0, 0], q[0, 1] = 0.5, 0.25 (argmax: yes, no)
                   prompt([1], [3, 0, 0]),  # q[1, 3], q[3, 0], q[0, 0] = 0.4, 0.7, 0.5 (all argmax)
                   prompt([1, 2, 2, 1, 1], [2], "u")]  # q[1, 2] = 0.3 (no)
        probe = selection.RecallProbe(prompts, batch_size=2, bucket=4)
        self.assertLen(probe.prepared.batches, 2)  # a padding row in the second
        out = probe.evaluate(scorer)
        expected = [(0.5 + 0.25) / 2, (0.4 + 0.7 + 0.5) / 3, 0.3]
        self.assertAlmostEqual(out["recall"], np.mean(expected), places=6)
        self.assertAlmostEqual(out["accuracy"], 1.0 / 3.0)
        self.assertAlmostEqual(out["recall_by_cell"]["u@8"], 0.3, places=6)
        self.assertAlmostEqual(out["recall_by_cell"]["t@8"], np.mean(expected[:2]), places=6)
        self.assertEqual(probe.num_items, {"t@8": 2, "u@8": 1})
        np.testing.assert_allclose(out["per_prompt"], expected, rtol=1e-6)

    def test_niah_prompts_end_with_the_answer_prefix(self):
        root = write_probe_data(self.create_tempdir().full_path)
        tok = tok_lib.make_tokenizer("byte")
        prompts = selection.niah_recall_prompts(
            tok, tasks=("niah_single_2", "niah_multikey_1"), lengths=(768, 1024),
            depths=(10.0, 90.0), count=3, seed=7,
            essays_dir=os.path.join(root, "niah", "PaulGrahamEssays"))
        self.assertLen(prompts, 12)
        for p in prompts:
            self.assertEqual(tok.decode(p.answer_ids), " " + p.value)
            self.assertTrue(tok.decode(p.context_ids).endswith("mentioned in the provided "
                                                               "text is"))
            self.assertLessEqual(len(p.context_ids) + len(p.answer_ids) - 1, p.length)
            self.assertIn(p.value, tok.decode(p.context_ids))
        self.assertEqual([p.depth for p in prompts[:3]], [10.0, 90.0, 10.0])
        # One padded shape per length.
        probe = selection.RecallProbe(prompts, batch_size=3, bucket=64)
        self.assertEqual({s[1] for s in probe.prepared.shapes}, {768, 1024})


class SweepRecordsTest(absltest.TestCase):

    def test_records_resume_under_the_same_probe_only(self):
        path = self.create_tempfile().full_path
        calls = []

        def evaluate(layer):
            calls.append(layer)
            return {"csr": 0.5, "recall": 0.25 * layer, "recall_accuracy": 1.0}

        quiet = dict(print_fn=lambda s: None)
        recs = selection.sweep_records([-1, 0, 1], evaluate, path, probe="a", **quiet)
        self.assertEqual(recs[1], {"layer": 1, "csr": 0.5, "recall": 0.25,
                                   "recall_accuracy": 1.0, "probe": "a"})
        selection.sweep_records([-1, 0, 1], evaluate, path, probe="a", **quiet)
        self.assertEqual(calls, [-1, 0, 1])
        selection.sweep_records([0], evaluate, path, probe="b", **quiet)
        self.assertEqual(calls, [-1, 0, 1, 0])

    def test_a_last_record_cut_short_by_a_kill_is_dropped_and_the_sweep_resumes(self):
        # The select stage read its own results with the strict evaluation-file reader: a
        # process killed mid-write left a last line that stopped every later resume.
        path = self.create_tempfile().full_path
        calls = []

        def evaluate(layer):
            calls.append(layer)
            return {"csr": 0.5, "recall": 0.25 * layer}

        quiet = dict(print_fn=lambda s: None)
        selection.sweep_records([-1, 0], evaluate, path, probe="a", **quiet)
        with open(path, "a") as f:
            f.write('{"layer": 1, "csr": 0.5, "rec')  # killed while writing layer 1
        with self.assertLogs(level="WARNING") as logs:
            recs = selection.sweep_records([-1, 0, 1, 2], evaluate, path, probe="a", **quiet)
        self.assertLen(logs.output, 1)
        self.assertIn(f"{path}: dropped its last line, cut short", logs.output[0])
        self.assertEqual(calls, [-1, 0, 1, 2])  # only layers 1 and 2 evaluated again
        self.assertEqual(recs[1]["recall"], 0.25)
        # The cut line was removed before the next record: the file is whole lines again.
        with open(path) as f:
            self.assertEqual([json.loads(line)["layer"] for line in f], [-1, 0, 1, 2])
        # A bad line in the middle is not a killed writer's: still an error naming it.
        with open(path) as f:
            lines = f.readlines()
        with open(path, "w") as f:
            f.writelines(lines[:1] + ['{"layer": 0, "cs\n'] + lines[2:])
        with self.assertRaisesRegex(records.RecordsError, r", line 2: not valid JSON"):
            selection.sweep_records([-1, 0, 1, 2], evaluate, path, probe="a", **quiet)

    def test_cut_tie(self):
        self.assertTrue(selection.cut_tie([50.0, 0.0, 50.0, 1.0], 1)["tie"])
        tie = selection.cut_tie([50.0, 0.0, 50.0, 1.0], 1)
        self.assertEqual(tie["tied_layers"], [0, 2])
        self.assertIn("by index order", tie["notice"])
        self.assertFalse(selection.cut_tie([50.0, 0.0, 50.0, 1.0], 2)["tie"])
        self.assertIsNone(selection.cut_tie([3.0, 2.0], 2)["cut_scores"])


# ---------------------------------------------------------------------------------------------
# The key test: the probes single out the one layer that retrieves
# ---------------------------------------------------------------------------------------------

RETRIEVER = 2
_DIGITS = np.arange(ord("0"), ord("9") + 1)  # byte ids of "0".."9"


def retrieval_teacher():
    """A 4-layer RoPE teacher in which only layer :data:`RETRIEVER` reads the context.

    Byte vocabulary, ``d_model = 64``; residual dims: 0 a constant, 1 "is a digit", 2..11 the
    digit's one-hot, 12..21 the retrieved digits, 32..63 random per-token features. Every
    MLP's output projection and every other layer's attention output projection is zero, so
    those layers (and their Stage-1 students, which copy ``W_o``) leave the residual alone.
    Layer :data:`RETRIEVER`'s head 0 is a content-addressed lookup: a constant query and a
    "digit" key in the lowest-frequency RoPE pair (dims 7 / 15, angle ``1e6^(-7/8)`` per
    token: position-independent over the prompt) put all attention on the earlier digits,
    their one-hot values are copied to dims 12..21, and the LM head turns those into digit
    logits. With the needle value the only digits in a prompt, the teacher gives each of
    its digits a high probability wherever the needle is; the Lightning student of that
    layer decays by ``e^(-1/4)`` per token in head 0 and keeps only the last few answer digits.
    """
    cfg = config_lib.ModelConfig(
        vocab_size=257, d_model=64, layer_pattern=("attn",) * 4, mlp_hidden=32,
        tie_embeddings=False, norm_eps=1e-6, use_segment_ids=False,
        attention=config_lib.AttentionConfig(num_heads=4, num_kv_heads=2, head_dim=16,
                                             rope_theta=1e6, qk_norm=False))
    params = jax.tree_util.tree_map(np.array, stages.random_teacher(cfg, seed=0))
    rng = np.random.default_rng(0)
    embed = np.zeros((257, 64), np.float32)
    embed[:, 0] = 1.0
    embed[_DIGITS, 1] = 1.0
    embed[_DIGITS, 2 + np.arange(10)] = 1.0
    embed[:, 32:] = 0.5 * rng.standard_normal((257, 32))
    params["embed"] = embed
    dh, low = 16, 7  # q | k | v columns: [0, 64) | [64, 96) | [96, 128)
    for layer, block in params["blocks"].items():
        block["mlp"]["fc2"]["kernel"][:] = 0.0
        out = block["mixer"]["out_proj"]["kernel"]
        out[:] = 0.0
        if layer != RETRIEVER:
            continue
        qkv = block["mixer"]["qkv_proj"]["kernel"]  # [64, 128]; heads 1-3 stay random
        qkv[:, :dh] = qkv[:, 64:64 + dh] = qkv[:, 96:96 + dh] = 0.0
        qkv[0, low] = 3.5  # query of head 0: the constant
        qkv[1, 64 + low] = 3.5  # key of KV head 0: "is a digit"
        qkv[2 + np.arange(10), 96 + np.arange(10)] = 1.0  # value: the digit's one-hot
        out[np.arange(10), 12 + np.arange(10)] = 1.0  # head 0 -> retrieved dims
    head = 0.02 * rng.standard_normal((64, 257)).astype(np.float32)
    head[12 + np.arange(10), _DIGITS] = 10.0
    params["head"]["kernel"] = head
    return cfg, params


class SelectionSeparatesLayersTest(absltest.TestCase):

    def test_only_the_retrieval_layer_scores(self):
        root = write_probe_data(self.create_tempdir().full_path, n_arc=6, n_hellaswag=12)
        tok = tok_lib.make_tokenizer("byte")
        cfg, params = retrieval_teacher()
        # Stage-1 students as the pipeline initialises them (lightning_from_attention).
        _, sweep = stage1_sweep(cfg, params, seed=3, bucket=64)
        held = selection.heldout_csr_items(os.path.join(root, "eval"), per_task=4,
                                           hellaswag_exclude=((4, 1234),))
        csr_probe = selection.CsrProbe({t: h.docs for t, h in held.items()}, tok,
                                       batch_size=16, bucket=128, max_len=256)
        prompts = selection.niah_recall_prompts(
            tok, tasks=("niah_single_2",), lengths=(512,), depths=(25.0, 75.0), count=4,
            seed=1, essays_dir=os.path.join(root, "niah", "PaulGrahamEssays"))
        self.assertTrue(all(sum(ch.isdigit() for ch in tok.decode(p.context_ids)) == 7
                            for p in prompts))  # the needle's digits only
        recall_probe = selection.RecallProbe(prompts, batch_size=4, bucket=64)

        def evaluate(layer):
            sweep.select(layer)
            c = csr_probe.evaluate(sweep.target_logprobs)
            r = recall_probe.evaluate(sweep.target_logprobs)
            return {"csr": c["csr"], "recall": r["recall"], "recall_accuracy": r["accuracy"]}

        recs = selection.sweep_records([-1, 0, 1, 2, 3], evaluate, print_fn=lambda s: None)
        teacher = recs[-1]
        csr = [recs[i]["csr"] for i in range(4)]
        recall = [recs[i]["recall"] for i in range(4)]
        self.assertGreater(teacher["recall"], 0.1)  # the teacher retrieves the needle digits
        for layer in range(4):
            if layer != RETRIEVER:  # replacing a layer that does nothing changes nothing
                self.assertEqual(recall[layer], teacher["recall"])
                self.assertEqual(csr[layer], teacher["csr"])
        self.assertLess(recall[RETRIEVER], 0.5 * teacher["recall"])
        scores = selection.halo_scores(csr, recall)
        ranking = selection.rank_layers(scores)
        self.assertEqual(ranking[0], RETRIEVER)
        others = [scores[i] for i in range(4) if i != RETRIEVER]
        self.assertGreater(scores[RETRIEVER], max(others))
        self.assertEqual(selection.select_attention_layers(scores, 1), [RETRIEVER])
        self.assertFalse(selection.cut_tie(scores, 1)["tie"])


class BootstrapSelectionTest(absltest.TestCase):

    def test_a_decisive_layer_is_always_kept_and_the_shares_sum_to_k(self):
        rng = np.random.default_rng(0)
        num_layers, n, prompts = 6, 80, 24
        # Layer 2 keeps every CSR item right and loses recall on every prompt: score 50 in
        # every resample. The others lose CSR on random items and recall a little.
        base = rng.random(n) < 0.6
        csr = np.array([base if layer == 2 else base & (rng.random(n) < 0.9)
                        for layer in range(num_layers)], np.float64)
        recall = 0.8 + 0.05 * rng.random((num_layers, prompts))
        recall[2] = 0.1
        cells = ["a@1"] * 12 + ["b@2"] * 12
        out = selection.bootstrap_selection({"t": csr, "u": csr[:, :40]}, recall, cells, 2,
                                            resamples=300, seed=1)
        freq = np.array(out["top_k_frequency"])
        self.assertEqual(freq[2], 1.0)
        self.assertAlmostEqual(freq.sum(), 2.0)  # each resample keeps exactly k layers
        self.assertTrue(np.all((freq >= 0) & (freq <= 1)))
        # The full-data selection, as the select stage computes it.
        c_full = (csr.mean(1) + csr[:, :40].mean(1)) / 2
        self.assertEqual(out["selected"], selection.select_attention_layers(
            selection.halo_scores(c_full, recall.mean(1)), 2))
        self.assertLessEqual(sum(share for _, share in out["sets"]), 1.0 + 1e-12)
        self.assertEqual(out["sets"][0][1], max(share for _, share in out["sets"]))
        # Seeded: the same draws again; another seed, other draws of the noisy layers.
        again = selection.bootstrap_selection({"t": csr, "u": csr[:, :40]}, recall, cells, 2,
                                              resamples=300, seed=1)
        self.assertEqual(again, out)

    def test_resampled_means_have_the_bootstrap_mean_and_spread(self):
        # Against the textbook values: E[mean*] = the sample mean, SD[mean*] = s / sqrt(n)
        # with s the population-style SD of the sample (ddof=0).
        rng = np.random.default_rng(3)
        values = rng.random((2, 50))
        draws = selection._resample_means(values, np.arange(50), 20000, rng)
        self.assertEqual(draws.shape, (20000, 2))
        se = values.std(axis=1) / np.sqrt(50)
        for layer in range(2):
            self.assertAlmostEqual(draws[:, layer].mean(), values[layer].mean(),
                                   delta=4 * se[layer] / np.sqrt(2e4))
        np.testing.assert_allclose(draws.std(0), se, rtol=0.03)
        # Paired: both layers see the same draw (identical rows give identical means).
        same = selection._resample_means(np.stack([values[0], values[0]]), np.arange(50), 100,
                                         rng)
        np.testing.assert_array_equal(same[:, 0], same[:, 1])

    def test_bad_input(self):
        csr = {"t": np.ones((3, 5))}
        recall = np.ones((3, 4))
        with self.assertRaisesRegex(ValueError, "bootstrap_resamples"):
            selection.bootstrap_selection(csr, recall, ["a"] * 4, 1, resamples=0)
        with self.assertRaisesRegex(ValueError, "recall must be"):
            selection.bootstrap_selection(csr, recall, ["a"] * 3, 1)
        with self.assertRaisesRegex(ValueError, "recall must be"):
            selection.bootstrap_selection({"t": np.ones((2, 5))}, recall, ["a"] * 4, 1)
        with self.assertRaisesRegex(ValueError, "outside"):
            selection.bootstrap_selection(csr, recall, ["a"] * 4, 4)
        with self.assertRaisesRegex(ValueError, "at least one CSR task"):
            selection.bootstrap_selection({}, recall, ["a"] * 4, 1)


class SelectStageTest(absltest.TestCase):

    def test_select_writes_the_probe_results_and_resumes(self):
        from configs import halo_smollm2

        root = write_probe_data(self.create_tempdir().full_path)
        workdir = self.create_tempdir().full_path
        cfg = halo_smollm2.get_config("tiny")
        cfg.teacher.random_model.num_layers = 2  # compiles dominate: fewer layers
        cfg.stage1.train.total_steps = 1
        cfg.report.update(data_dir=root, csr_tasks=("hellaswag",), csr_limit=5, csr_seed=3)
        cfg.select.update(num_attention=1, csr_exclude=((10, 1234),), csr_bucket=128,
                          csr_max_len=128)
        quiet = dict(print_fn=lambda s: None)
        experiment.run(cfg, workdir, "stage1", **quiet)
        out = experiment.run(cfg, workdir, "select", **quiet)
        with open(os.path.join(workdir, "select", "selection.json")) as f:
            sel = json.load(f)
        self.assertEqual(sel["attention_layers"], out["attention_layers"])
        for key in ("csr", "recall", "recall_accuracy", "scores"):
            self.assertLen(sel[key], 2)
        np.testing.assert_allclose(sel["scores"], selection.halo_scores(sel["csr"],
                                                                        sel["recall"]))
        self.assertEqual(sel["attention_layers"], [sel["ranking"][0]])
        self.assertEqual(sel["csr_items"], {"arc_easy": 4, "arc_challenge": 4, "hellaswag": 4})
        self.assertEqual(sel["recall_items"], {"niah_single_2@512": 2})
        self.assertIn("acc_norm", sel["csr_metric"])
        self.assertIn("probability", sel["recall_metric"])
        self.assertIn(sel["tie_at_cut"], (True, False))
        self.assertContainsSubset({"csr", "recall", "recall_accuracy"}, set(sel["teacher"]))
        # The bootstrap over the probes' items (4 + 4 + 4 CSR items, 2 prompts).
        boot = sel["bootstrap"]
        self.assertEqual(boot["resamples"], 1000)
        self.assertEqual(boot["selected"], sel["attention_layers"])
        self.assertAlmostEqual(sum(boot["top_k_frequency"]), 1.0)
        recs = [r for r in selection.read_jsonl(os.path.join(workdir, "select", "sweep.jsonl"))
                if r["layer"] >= 0]
        for r in recs:
            self.assertEqual({t: len(v) for t, v in r["csr_per_doc"].items()},
                             sel["csr_items"])
            self.assertAlmostEqual(np.mean([np.mean(v) for v in r["csr_per_doc"].values()]),
                                   r["csr"])
            self.assertAlmostEqual(np.mean(r["recall_per_prompt"]), r["recall"])
        # The report's own HellaSwag subset is excluded as well as csr_exclude's.
        self.assertEqual(sel["hellaswag_excluded_subsets"], [[10, 1234], [5, 3]])
        for limit, seed in sel["hellaswag_excluded_subsets"]:
            self.assertEmpty(set(sel["csr_item_indices"]["hellaswag"])
                             & set(tasks_lib.subset_indices(40, limit, seed)))
        # Resumed: nothing evaluated again.
        path = os.path.join(workdir, "select", "sweep.jsonl")
        self.assertLen(selection.read_jsonl(path), 3)  # the teacher and 2 layers
        again = experiment.run(cfg, workdir, "select", **quiet)
        self.assertLen(selection.read_jsonl(path), 3)
        self.assertEqual(again["scores"], sel["scores"])
        # Records written before the per-item fields: reused, and the missing bootstrap said.
        old = [{k: v for k, v in r.items() if k not in ("csr_per_doc", "recall_per_prompt")}
               for r in selection.read_jsonl(path)]
        with open(path, "w") as f:
            f.write("".join(json.dumps(r) + "\n" for r in old))
        lines = []
        again = experiment.run(cfg, workdir, "select", print_fn=lines.append)
        self.assertEqual(again["scores"], sel["scores"])
        self.assertNotIn("bootstrap", again)
        self.assertTrue(any(x.startswith("select: no bootstrap") for x in lines), lines)


if __name__ == "__main__":
    absltest.main()
