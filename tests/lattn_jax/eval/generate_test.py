"""Generation: cached decoding equals the full forward; padding is invisible; sampling filters."""

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized
from flax import nnx

from lattn_jax import config as config_lib
from lattn_jax import model as model_lib
from lattn_jax.eval import generate as gen_lib

PATTERNS = {
    "pure": ("gdn", "gdn"),
    "hybrid": ("gdn", "attn"),
    "dense": ("attn", "attn"),
}


def tiny_model(pattern, seed=0, **kw):
    cfg = config_lib.ModelConfig(
        vocab_size=64, d_model=32, layer_pattern=pattern, mlp_hidden=48, **kw,
        attention=config_lib.AttentionConfig(num_heads=4, num_kv_heads=2, output_gate=True),
        gdn=config_lib.GatedDeltaNetConfig(num_k_heads=2, num_v_heads=4, head_k_dim=8,
                                           head_v_dim=8, chunk_size=8))
    return model_lib.LanguageModel(cfg, rngs=nnx.Rngs(seed))


class DecodeMatchesForwardTest(parameterized.TestCase):

    @parameterized.named_parameters(*PATTERNS.items())
    def test_token_by_token_equals_full_forward(self, pattern):
        model = tiny_model(pattern)
        tokens = np.asarray(jax.random.randint(jax.random.key(1), (2, 11), 0, 64), np.int32)
        graphdef, params = nnx.split(model)
        full = jax.jit(lambda p, x: nnx.merge(graphdef, p)(x))(params, tokens)
        g = gen_lib.Generator(model)
        prefix = 4
        logits, states = g.prefill(tokens[:, :prefix], np.ones((2, prefix), bool), 11)
        np.testing.assert_allclose(logits, full[:, prefix - 1], rtol=1e-5, atol=1e-5)
        greedy = gen_lib.SamplingConfig()
        for t in range(prefix, 11):
            _, logits, states = g.step(jnp.asarray(tokens[:, t]), states, jax.random.key(0),
                                       greedy)
            np.testing.assert_allclose(logits, full[:, t], rtol=1e-5, atol=1e-5,
                                       err_msg=f"step {t}")


class PaddingTest(absltest.TestCase):

    def test_padded_batch_equals_per_row_generation(self):
        model = tiny_model(PATTERNS["hybrid"], seed=3)
        g = gen_lib.Generator(model, pad_id=7, bucket=8)
        prompts = [[5, 9, 2], [11, 3, 8, 60, 1, 17, 4]]
        alone = [g.generate([p], max_new_tokens=6).tokens[0] for p in prompts]
        batched = g.generate(prompts, max_new_tokens=6)
        self.assertEqual(batched.tokens, alone)
        self.assertEqual(batched.prompt_lengths, [3, 7])
        # The same prompts right-padded (with a different pad value) give the same tokens.
        tokens = np.full((2, 8), 63, np.int32)
        mask = np.zeros((2, 8), bool)
        for i, p in enumerate(prompts):
            tokens[i, :len(p)], mask[i, :len(p)] = p, True
        right = g.generate_padded(tokens, mask, max_new_tokens=6)
        self.assertEqual(right.tokens, alone)

    def test_padding_is_invisible_without_training_segment_ids(self):
        # Models trained on unpacked rows (use_segment_ids=False, the paper presets and HALO's
        # students) still keep left padding out of the prefill: the prompt's last logits do
        # not depend on how much padding the bucket adds.
        model = tiny_model(PATTERNS["hybrid"], seed=4, use_segment_ids=False)
        prompt = [[5, 9, 2, 33, 12]]
        last = [gen_lib.Generator(model, pad_id=7, bucket=b).prefill(
            np.asarray(prompt, np.int32), np.ones((1, 5), bool), 16)[0] for b in (1,)]
        padded = np.concatenate([np.full((1, 3), 7, np.int32), np.asarray(prompt, np.int32)], 1)
        mask = np.concatenate([np.zeros((1, 3), bool), np.ones((1, 5), bool)], 1)
        logits, _ = gen_lib.Generator(model, pad_id=7).prefill(padded, mask, 16)
        np.testing.assert_allclose(logits, last[0], rtol=1e-5, atol=1e-5)
        g = gen_lib.Generator(model, pad_id=7, bucket=8)
        prompts = [[5, 9, 2], [11, 3, 8, 60, 1, 17, 4]]
        alone = [g.generate([p], max_new_tokens=5).tokens[0] for p in prompts]
        self.assertEqual(g.generate(prompts, max_new_tokens=5).tokens, alone)

    def test_stop_tokens_end_a_row(self):
        model = tiny_model(PATTERNS["hybrid"], seed=3)
        g = gen_lib.Generator(model, bucket=8)
        first = g.generate([[5, 9, 2]], max_new_tokens=6).tokens[0]
        out = g.generate([[5, 9, 2]], max_new_tokens=6, stop_tokens=[first[1]])
        self.assertEqual(out.tokens[0], first[:2])
        self.assertEqual(out.finished, [True])

    def test_stop_fn_ends_a_row_after_a_decode_call(self):
        # stop_fn (e.g. the harness's stop strings) is checked after each compiled call: row 0
        # ends after the call in which it reaches 3 tokens (1 + 4 = 5 tokens, decode_chunk 4);
        # its tokens are the first of the full generation, and row 1 is not affected.
        model = tiny_model(PATTERNS["hybrid"], seed=3)
        g = gen_lib.Generator(model, bucket=8, decode_chunk=4)
        prompts = [[5, 9, 2], [11, 3, 8, 60, 1, 17, 4]]
        full = g.generate(prompts, max_new_tokens=12).tokens
        seen = []

        def stop_fn(row, tokens):
            seen.append((row, len(tokens)))
            return row == 0 and len(tokens) >= 3

        out = g.generate(prompts, max_new_tokens=12, stop_fn=stop_fn)
        self.assertEqual(out.tokens, [full[0][:5], full[1]])
        self.assertEqual(out.finished, [True, False])
        self.assertEqual(seen, [(0, 1), (1, 1), (0, 5), (1, 5), (1, 9)])

    def test_decode_chunk_does_not_change_the_tokens(self):
        # Several tokens per compiled call (a scan on the device) draw the same random numbers
        # in the same order as one call per token: greedy and sampled outputs, stop tokens and
        # lengths that are not multiples of the chunk (7 = 1 + 4 + 2 of a second 4) agree.
        model = tiny_model(PATTERNS["hybrid"], seed=5)
        prompts = [[5, 9, 2], [11, 3, 8, 60, 1]]
        sampled = gen_lib.SamplingConfig(temperature=1.5)
        outs = {}
        for chunk in (1, 4):
            g = gen_lib.Generator(model, bucket=8, decode_chunk=chunk)
            greedy = g.generate(prompts, max_new_tokens=7)
            drawn = g.generate(prompts, max_new_tokens=7, sampling=sampled, seed=11)
            stop = g.generate(prompts, max_new_tokens=7, sampling=sampled, seed=11,
                              stop_tokens=[drawn.tokens[0][2]])
            outs[chunk] = (greedy.tokens, drawn.tokens, stop.tokens, stop.finished)
        self.assertEqual(outs[4], outs[1])
        self.assertNotEqual(outs[1][0], outs[1][1])  # the draws are not the greedy choice
        self.assertLen(outs[1][2][0], 3)  # row 0 stops at its third token
        self.assertEqual(outs[1][3][0], True)
        with self.assertRaisesRegex(ValueError, "decode_chunk must be >= 1"):
            gen_lib.Generator(model, decode_chunk=0)

    def test_continuation_text_keeps_the_leading_space(self):
        class SentencePieceLike:  # drops the leading space of whatever it decodes
            pieces = ["The", "\u2581history", "\u2581of", "\u25811", "km"]

            def decode(self, ids):
                return "".join(self.pieces[i] for i in ids).replace("\u2581", " ").lstrip()

        tok = SentencePieceLike()
        self.assertEqual(tok.decode([3, 4]), "1km")  # decoded alone: the space is lost
        self.assertEqual(gen_lib.continuation_text(tok, [0, 1, 2], [3, 4]), " 1km")

    def test_bad_inputs(self):
        g = gen_lib.Generator(tiny_model(PATTERNS["dense"]))
        with self.assertRaisesRegex(ValueError, "prompt 1 is empty"):
            g.generate([[1], []], max_new_tokens=2)
        with self.assertRaisesRegex(ValueError, "contiguous"):
            gen_lib.left_align(np.ones((1, 4)), np.array([[1, 0, 1, 0]], bool))


class SamplingTest(absltest.TestCase):

    def test_greedy_top_k_top_p(self):
        logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]] * 2000))
        greedy = gen_lib.sample_logits(logits, jax.random.key(0), gen_lib.SamplingConfig())
        np.testing.assert_array_equal(greedy, 0)
        top2 = gen_lib.sample_logits(logits, jax.random.key(1),
                                     gen_lib.SamplingConfig(temperature=1.0, top_k=2))
        self.assertEqual(set(np.asarray(top2).tolist()), {0, 1})
        # p = 0.7: tokens 0 (mass before 0) and 1 (mass before 0.5) survive, 2 (0.8) does not.
        nucleus = gen_lib.sample_logits(logits, jax.random.key(2),
                                        gen_lib.SamplingConfig(temperature=1.0, top_p=0.7))
        counts = np.bincount(np.asarray(nucleus), minlength=4)
        self.assertEqual(counts[2] + counts[3], 0)
        np.testing.assert_allclose(counts[0] / 2000, 0.5 / 0.8, atol=0.05)

    def test_nucleus_mask_equals_the_sorted_rule(self):
        # fp64 reference: sort descending, keep a token if the mass before it is below p.
        rng = np.random.default_rng(0)
        for scale, p in ((0.5, 0.9), (2.0, 0.5), (2.0, 0.95), (6.0, 0.9), (6.0, 0.3)):
            logits = rng.standard_normal((16, 1000)) * scale
            probs = np.exp(logits - logits.max(1, keepdims=True))
            probs /= probs.sum(1, keepdims=True)
            order = np.argsort(-probs, axis=1)
            sorted_p = np.take_along_axis(probs, order, axis=1)
            keep_sorted = np.cumsum(sorted_p, axis=1) - sorted_p < p
            expected = np.zeros_like(keep_sorted)
            np.put_along_axis(expected, order, keep_sorted, axis=1)
            got = gen_lib.nucleus_mask(jnp.asarray(logits, jnp.float32), p)
            np.testing.assert_array_equal(got, expected, err_msg=f"{scale=} {p=}")
        # -inf logits (a top-k filter before) are never kept; a certain token is kept alone.
        logits = jnp.array([[0.0, -jnp.inf, 1.0, -jnp.inf], [50.0, 0.0, 0.0, 0.0]])
        np.testing.assert_array_equal(gen_lib.nucleus_mask(logits, 0.99),
                                      [[True, False, True, False], [True, False, False, False]])

    def test_bad_config(self):
        with self.assertRaisesRegex(ValueError, "top_p"):
            gen_lib.SamplingConfig(top_p=0.0)


if __name__ == "__main__":
    absltest.main()
