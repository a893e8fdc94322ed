"""HALO layer-selection score against the authors' sweep logs (spec §5) and the evaluators."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from flax import nnx

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

    def test_sweep_model_is_each_single_replacement_model(self):
        cfg, params = random_teacher(seed=2)
        s1_cfg = stages.stage1_student_config(cfg)
        s1 = stages.stage1_init(cfg, params, s1_cfg, seed=3)
        sweep = selection.ReplacementSweep(
            selection.build_sweep_model(cfg, params, s1_cfg, s1["mixers"]), bucket=8)
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


if __name__ == "__main__":
    absltest.main()
