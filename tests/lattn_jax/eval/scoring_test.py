"""Log-likelihood scoring, lm-eval metrics, task loaders and perplexity on hand-made items."""

import math
import os

import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized
from flax import nnx

from lattn_jax.data import tokenizers as tok_lib
from lattn_jax.eval import perplexity
from lattn_jax.eval import scoring
from lattn_jax.eval import tasks

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "shared", "data", "eval")


class Bigram(nnx.Module):
    """``logits[b, t] = table[tokens[b, t]]``: known log-likelihoods for hand-made items."""

    def __init__(self, table):
        self.table = nnx.Param(jnp.asarray(table, jnp.float32))

    def __call__(self, tokens, route=True):
        return jnp.take(self.table[...], tokens, axis=0)


def bigram(vocab=257, seed=0):
    table = np.random.default_rng(seed).normal(size=(vocab, vocab)) * 2
    logp = table - np.log(np.exp(table).sum(-1, keepdims=True))
    return Bigram(table), logp


class ScoringTest(absltest.TestCase):

    def test_encode_pair_moves_trailing_space(self):
        tok = tok_lib.ByteTokenizer()
        ctx, cont = scoring.encode_pair(tok, "Answer: ", "yes")
        self.assertEqual(tok.decode(ctx), "Answer:")
        self.assertEqual(tok.decode(cont), " yes")
        ctx, cont = scoring.encode_pair(tok, "", "hi")
        self.assertEqual(ctx, [tok.eos_id])

    def test_loglikelihood_matches_hand_computation(self):
        model, logp = bigram()
        scorer = scoring.Scorer(model, max_len=6, batch_size=2, bucket=4)
        requests = [([1, 2, 3], [4, 5]), ([7], [8]), ([1, 2, 3, 4, 5, 6, 7, 8], [9, 10])]
        got = scorer.loglikelihood(requests)
        for (ctx, cont), (ll, greedy) in zip(requests, got):
            seq = ctx + cont
            want = sum(logp[seq[len(ctx) + i - 1], c] for i, c in enumerate(cont))
            self.assertAlmostEqual(ll, want, places=4)
            argmax = all(np.argmax(logp[seq[len(ctx) + i - 1]]) == c for i, c in enumerate(cont))
            self.assertEqual(greedy, argmax)
        # A greedy continuation is recognised.
        nxt = int(np.argmax(logp[3]))
        self.assertTrue(scorer.loglikelihood([([3], [nxt])])[0][1])


class MetricsTest(absltest.TestCase):

    def test_acc_and_acc_norm(self):
        doc = tasks.Doc(requests=(("q", " a"), ("q", " bbbb")), gold=1, choices=("a", "bbbb"))
        # ll(a) = -1 > ll(bbbb) = -2, but per character -1 < -0.5: acc 0, acc_norm 1.
        out = tasks.process_results("piqa", [doc], [[(-1.0, False), (-2.0, False)]])
        self.assertEqual((out["acc"], out["acc_norm"], out["acc_chance"]), (0.0, 1.0, 0.5))
        self.assertEqual((out["acc_majority"], out["acc_norm_majority"]), (1.0, 1.0))

    def test_majority_rate_of_the_scored_items_beside_chance(self):
        # BoolQ-like labels, 3 of 4 items "yes" (index 1): always answering "yes" scores 0.75.
        docs = [tasks.Doc(requests=(("q", " no"), ("q", " yes")), gold=g, choices=("no", "yes"))
                for g in (1, 0, 1, 1)]
        out = tasks.process_results("boolq", docs, [[(-1.0, False), (-2.0, False)]] * 4)
        self.assertEqual((out["acc_chance"], out["acc_majority"], out["acc"]), (0.5, 0.75, 0.25))

    def test_lambada_metrics(self):
        docs = [tasks.Doc(requests=(("a b", " c"),), gold=0, choices=("c",))] * 2
        out = tasks.process_results("lambada_openai", docs, [[(-1.0, True)], [(-3.0, False)]])
        self.assertEqual(out["acc"], 0.5)
        self.assertAlmostEqual(out["perplexity"], math.exp(2.0))

    def test_unknown_task(self):
        with self.assertRaisesRegex(ValueError, "unknown task 'hellaswg'"):
            tasks.load_task("hellaswg", DATA)
        with self.assertRaisesRegex(FileNotFoundError, "evaluation file not found: /nope"):
            tasks.load_task("piqa", "/nope")


@absltest.skipIf(not os.path.isdir(DATA), "shared/data/eval not present")
class LoaderTest(parameterized.TestCase):

    @parameterized.parameters(("piqa", 1838, 2), ("winogrande", 1267, 2), ("boolq", 3270, 2),
                              ("openbookqa", 500, 4), ("arc_challenge", 1172, None),
                              ("lambada_openai", 5153, 1), ("hellaswag", 10042, 4))
    def test_counts_and_prompts(self, name, count, choices):
        docs = tasks.load_task(name, DATA)
        self.assertLen(docs, count)
        if choices:
            self.assertTrue(all(len(d.requests) == choices for d in docs))
        self.assertTrue(all(0 <= d.gold < len(d.requests) for d in docs))
        self.assertLen(tasks.load_task(name, DATA, limit=5), 5)

    def test_prompt_formats(self):
        arc = tasks.load_task("arc_easy", DATA)[0]
        self.assertTrue(arc.requests[0][0].startswith("Question: Which statement best explains"))
        self.assertTrue(arc.requests[0][0].endswith("\nAnswer:"))
        self.assertTrue(arc.requests[0][1].startswith(" Sunlight"))
        wg = tasks.load_task("winogrande", DATA)[1]
        self.assertEqual(wg.requests[0], ("Sarah was a much better surgeon than Maria so Sarah",
                                          " always got the harder cases."))
        self.assertEqual(wg.gold, 0)


class PerplexityTest(absltest.TestCase):

    def test_rolling_windows_score_each_token_once(self):
        toks = list(range(10, 33))
        for stride in (1, 3, 8):
            scored = []
            for inp, tgt, k in perplexity.rolling_windows(toks, 0, 8, stride):
                self.assertLessEqual(len(inp), 8)
                self.assertEqual(inp[1:], tgt[:-1])
                scored += tgt[len(tgt) - k:]
            self.assertEqual(scored, toks)

    def test_perplexity_of_a_bigram(self):
        model, logp = bigram()
        tok = tok_lib.ByteTokenizer()
        scorer = scoring.Scorer(model, max_len=8, batch_size=4, bucket=4)
        text = "hello world, hi"
        out = perplexity.evaluate(scorer, tok, [text], max_len=8, stride=8)
        seq = [tok.eos_id] + tok.encode(text)
        nll = -sum(logp[a, b] for a, b in zip(seq[:-1], seq[1:]))
        self.assertAlmostEqual(out["token_perplexity"], math.exp(nll / len(text)), places=3)
        self.assertAlmostEqual(out["bits_per_byte"], nll / (len(text) * math.log(2)), places=4)
        np.testing.assert_allclose(out["word_perplexity"], math.exp(nll / 3), rtol=1e-5)

    def test_perplexity_of_token_documents_scores_each_document_on_its_own(self):
        model, logp = bigram()
        scorer = scoring.Scorer(model, max_len=8, batch_size=4, bucket=4)
        rng = np.random.default_rng(3)
        docs = [rng.integers(1, 257, size=n).tolist() for n in (5, 19, 1, 8)]
        out = perplexity.evaluate_tokens(scorer, docs, 0, max_len=8, stride=8)
        # By hand: every document after one prefix token 0, no context across documents.
        nll = -sum(logp[a, b] for d in docs for a, b in zip([0] + d[:-1], d))
        self.assertEqual(out["tokens"], 33)
        self.assertEqual(out["documents"], 4)
        self.assertAlmostEqual(out["nll_per_token"], nll / 33, places=4)
        self.assertAlmostEqual(out["token_perplexity"], math.exp(nll / 33), places=3)
        with self.assertRaisesRegex(ValueError, "empty document"):
            perplexity.evaluate_tokens(scorer, [[3], []], 0, max_len=8, stride=8)

    def test_position_buckets_against_a_hand_computation(self):
        model, logp = bigram(seed=4)
        scorer = scoring.Scorer(model, max_len=8, batch_size=3, bucket=4)
        rng = np.random.default_rng(7)
        docs = [rng.integers(1, 257, size=n).tolist() for n in (5, 19, 1, 8, 26)]
        edges = (0, 1, 3, 8)
        for stride in (8, 3):
            out = perplexity.evaluate_tokens(scorer, docs, 0, max_len=8, stride=stride,
                                             position_buckets=edges)
            # By hand: document token i (0-based) is predicted from token i - 1 (the bigram),
            # at window position i for i < 8, else i - (end - 8) where ``end`` is the end of
            # the first window past i (windows end at 8, 8 + stride, ... and at the document).
            nll_sum, count = np.zeros(3), np.zeros(3, int)
            for d in docs:
                for i, (a, b) in enumerate(zip([0] + d[:-1], d)):
                    end = min(8 + -(-(i + 1 - 8) // stride) * stride, len(d))
                    pos = i if i < 8 else i - (end - 8)
                    k = np.searchsorted(edges, pos, side="right") - 1
                    nll_sum[k] -= logp[a, b]
                    count[k] += 1
            got = out["position_nll"]
            self.assertEqual([(b["start"], b["stop"]) for b in got], [(0, 1), (1, 3), (3, 8)])
            self.assertEqual([b["tokens"] for b in got], count.tolist())
            self.assertEqual(sum(b["tokens"] for b in got), out["tokens"])
            for b, s, n in zip(got, nll_sum, count):
                self.assertAlmostEqual(b["mean_nll"], s / n, places=4)
                self.assertAlmostEqual(b["perplexity"], math.exp(s / n), places=3)
            weighted = sum(b["mean_nll"] * b["tokens"] for b in got) / out["tokens"]
            self.assertAlmostEqual(weighted, out["nll_per_token"], places=9)
            self.assertAlmostEqual(weighted, math.log(out["token_perplexity"]), places=9)

    def test_position_buckets_follow_a_position_dependent_loss(self):

        class PositionScorer:  # log p = -(1 + t / 10) + noise at window position t
            batch_size, bucket = 2, 8

            def token_logprobs(self, inputs, targets):
                t = np.arange(inputs.shape[1])
                noise = np.random.default_rng(int(inputs.sum())).uniform(-0.01, 0.01,
                                                                         inputs.shape)
                return (-(1 + t / 10) + noise).astype(np.float32), None

        tok = tok_lib.ByteTokenizer()
        rng = np.random.default_rng(1)
        texts = ["".join(rng.choice(list("abc d"), size=n)) for n in (100, 64, 33, 7)]
        out = perplexity.evaluate(PositionScorer(), tok, texts, max_len=64, stride=64)
        got = out["position_nll"]
        self.assertEqual([(b["start"], b["stop"]) for b in got],
                         [(0, 2), (2, 8), (8, 16), (16, 32), (32, 64)])  # the default
        # Documents of 100, 64, 33 and 7 tokens; the 100's second window reads tokens 36..99
        # and scores 64..99 at positions 28..63: [0, 2) has 2 + 2 + 2 + 2 tokens and
        # [32, 64) has (32 + 32) + 32 + 1.
        self.assertEqual([b["tokens"] for b in got], [8, 23, 24, 52, 97])
        self.assertEqual(sum(b["tokens"] for b in got), out["tokens"])
        means = [b["mean_nll"] for b in got]
        self.assertEqual(means, sorted(means))
        expected = {}  # tokens per position: i < 64 at i, later ones at the window's end
        for x in texts:
            for i in range(len(x)):
                t = i if i < 64 else i - (len(x) - 64)
                expected[t] = expected.get(t, 0) + 1
        for b in got:  # the mean of 1 + t / 10 over the bucket's tokens, within the noise
            n = sum(expected.get(t, 0) for t in range(b["start"], b["stop"]))
            mean = sum((1 + t / 10) * expected.get(t, 0) for t in range(b["start"], b["stop"]))
            self.assertAlmostEqual(b["mean_nll"], mean / n, delta=0.01)
        self.assertAlmostEqual(sum(b["mean_nll"] * b["tokens"] for b in got) / out["tokens"],
                               math.log(out["token_perplexity"]), places=9)

    def test_position_buckets_are_checked(self):
        self.assertEqual(perplexity.default_position_buckets(2048),
                         (0, 64, 256, 512, 1024, 2048))
        self.assertEqual(perplexity.check_position_buckets(None, 8), (0, 1, 2, 4, 8))
        scorer = scoring.Scorer(bigram()[0], max_len=8, batch_size=2, bucket=4)
        for bad in ((0, 4), (1, 8), (0, 4, 4, 8), (0, 2.5, 8), (8,), (0, 9)):
            with self.assertRaisesRegex(ValueError, "position_buckets"):
                perplexity.evaluate_tokens(scorer, [[3, 4]], 0, max_len=8, stride=8,
                                           position_buckets=bad)


if __name__ == "__main__":
    absltest.main()
