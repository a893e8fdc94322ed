"""The model-level benchmarks (issue 10): CPU smoke runs of both binaries on tiny models, the
out-of-memory / time-budget bookkeeping, and the model features they rely on (last-token logits,
fresh prefill + grown caches + decode equal to the full forward)."""

import argparse
import contextlib
import io
import json
import os
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest
from flax import nnx

from benchmarks import bench_inference
from benchmarks import bench_train
from benchmarks import common as bench
from lattn_jax import config as config_lib
from lattn_jax import model as model_lib
from tests import tolerances

OOM_MESSAGE = "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 123456789 bytes."


def _check_outputs(test, out, payload, table_rows):
    with open(out + ".json") as f:
        saved = json.load(f)
    test.assertEqual(len(saved["records"]), len(payload["records"]))
    for key in ("date_utc", "command", "jax", "jaxlib", "flax", "optax", "python",
                "device_kind"):
        test.assertIn(key, saved["environment"])
    with open(out + ".md") as f:
        md = f.read()
    for row in table_rows:
        test.assertIn(row, md)
    test.assertGreater(os.path.getsize(out + ".png"), 1000)


@pytest.mark.entry
class BenchTrainTest(absltest.TestCase):

    def test_presets(self):
        patterns = {p: bench_train.experiment_config(p, "adamw").model.layer_pattern
                    for p in bench_train.PRESETS}
        self.assertEqual(patterns["softmax"], ("attn",) * 24)
        self.assertEqual(patterns["gdn_pure"], ("gdn",) * 22)
        self.assertEqual(patterns["gdn_hybrid"], ("gdn", "gdn", "attn") * 7 + ("gdn",))
        cfg = bench_train.experiment_config("gdn_hybrid", "muon", tiny=True, num_layers=3)
        self.assertEqual(cfg.model.layer_pattern, ("gdn", "gdn", "attn"))
        self.assertEqual(cfg.optim.name, "muon")
        with self.assertRaisesRegex(ValueError, "num_layers=7 must be in"):
            bench_train.experiment_config("softmax", "adamw", tiny=True, num_layers=7)
        cfg = bench_train.experiment_config(
            "gdn_pure", "adamw", tiny=True,
            overrides=["model.split_projections=false", "model.gdn.implementation=chunked"])
        self.assertIs(cfg.model.split_projections, False)  # the presets turn it on
        self.assertEqual(cfg.model.gdn.implementation, "chunked")
        for bad in ("model.no_such_key=1", "model.split_projections", "nope.x=1"):
            with self.assertRaisesRegex(ValueError, "expected section.key=value"):
                bench_train.experiment_config("gdn_pure", "adamw", tiny=True, overrides=[bad])

    @pytest.mark.slow  # benchmark tooling, ~20-40 s on 2 cores
    def test_tiny_sweep_times_every_configuration(self):
        # Two presets keep the test short: the hybrid has both kinds of layer; test_presets
        # checks the third preset's configuration.
        out = os.path.join(self.create_tempdir().full_path, "train")
        presets = ("softmax", "gdn_hybrid")
        payload = bench_train.main(["--tiny", "--num_layers=3", "--compile_workers=2",
                                    f"--presets={','.join(presets)}", f"--out={out}"])
        records = payload["records"]
        self.assertEqual([(r["seq_len"], r["preset"]) for r in records],
                         [(t, p) for t in (16, 32) for p in presets])
        for r in records:
            self.assertEqual(r["status"], bench.OK, r)
            self.assertGreater(r["iter_s"], 0)
            self.assertGreater(r["tokens_per_s"], 0)
            self.assertEqual(r["batch"] * r["seq_len"], 64)
            self.assertLen(r["times_s"], 2)
            self.assertGreater(r["memory"]["peak_estimate"], 0)
        self.assertIn("softmax/gdn_hybrid", payload["summary"]["ratios"][32])
        _check_outputs(self, out, payload, [f"| {p} | 3 |" for p in presets] + ["| 32 | "])


@pytest.mark.entry
class BenchInferenceTest(absltest.TestCase):

    @pytest.mark.slow  # benchmark tooling, ~20-40 s on 2 cores
    def test_tiny_sweep_times_every_configuration(self):
        out = os.path.join(self.create_tempdir().full_path, "inference")
        # Two layers (the hybrid: one Lightning, one softmax layer): compiles dominate.
        payload = bench_inference.main(["--tiny", "--num_layers=2", "--attention_every=2",
                                        "--compile_workers=2", f"--out={out}"])
        records = payload["records"]
        self.assertLen(records, 6)
        for r in records:
            self.assertEqual(r["prefill"]["status"], bench.OK, r)
            self.assertEqual(r["decode"]["status"], bench.OK, r)
            self.assertGreater(r["prefill"]["s"], 0)
            self.assertAlmostEqual(r["prefill"]["us_per_token"],
                                   1e6 * r["prefill"]["s"] / r["context"])
            self.assertGreater(r["decode"]["ms_per_token"], 0)
            self.assertLen(r["decode"]["times_s"], 2)
            self.assertGreater(r["decode"]["state_bytes"], 0)
        by = {(r["model"], r["context"]): r for r in records}
        # Only attention caches grow with the context.
        self.assertGreater(by[("dense", 128)]["decode"]["state_bytes"],
                           by[("dense", 64)]["decode"]["state_bytes"])
        self.assertEqual(by[("pure", 128)]["decode"]["state_bytes"],
                         by[("pure", 64)]["decode"]["state_bytes"])
        self.assertEqual(by[("hybrid", 64)]["attention_layers"], 1)
        _check_outputs(self, out, payload,
                       [f"| {m} | {c} |" for m in bench_inference.MODELS for c in (64, 128)])

    @pytest.mark.slow  # benchmark tooling, ~20 s on 2 cores
    def test_out_of_memory_and_time_budget_are_recorded_and_the_sweep_goes_on(self):
        calls = []
        real = bench.time_calls

        def first_call_runs_out_of_memory(fn, **kwargs):
            calls.append(kwargs)
            if len(calls) == 1:  # the hybrid's prefill at context 64, the first measurement
                raise jax.errors.JaxRuntimeError(OOM_MESSAGE)
            return real(fn, **kwargs)

        out = os.path.join(self.create_tempdir().full_path, "inference")
        # A zero budget skips everything that has an estimate (a previous context), except
        # the --always_run pairs; the hybrid at 128 also has no estimate (its 64 prefill failed).
        with mock.patch.object(bench, "time_calls", first_call_runs_out_of_memory):
            payload = bench_inference.main([
                "--tiny", "--num_layers=2", "--attention_every=2", "--models=hybrid,dense",
                "--contexts=64,128", "--time_budget_s=0",
                "--always_run=hybrid:128", "--compile_workers=2", "--no_plot",
                "--decode_tokens_per_call=3", f"--out={out}"])
        status = {(r["model"], r["context"], part): r[part]["status"]
                  for r in payload["records"] for part in ("prefill", "decode")}
        self.assertEqual(status, {
            ("hybrid", 64, "prefill"): bench.OUT_OF_MEMORY,
            ("hybrid", 64, "decode"): bench.OK,
            ("dense", 64, "prefill"): bench.OK,
            ("dense", 64, "decode"): bench.OK,
            ("hybrid", 128, "prefill"): bench.OK,
            ("hybrid", 128, "decode"): bench.OK,
            ("dense", 128, "prefill"): bench.SKIPPED_BUDGET,
            ("dense", 128, "decode"): bench.SKIPPED_BUDGET,
        })
        dec = payload["records"][0]["decode"]  # hybrid at 64: 3 tokens per call
        self.assertEqual((dec["tokens_per_call"], dec["capacity"]), (3, 64 + 3 * (1 + 2)))
        self.assertAlmostEqual(dec["ms_per_token"], 1e3 * np.median(dec["times_s"]) / 3)
        with open(out + ".md") as f:
            md = f.read()
        self.assertIn("3 token(s) per jitted call", md)
        self.assertIn("| hybrid | 64 | – |", md)
        self.assertIn("| out of memory | ok |", md)
        self.assertIn("| skipped (time budget) | skipped (time budget) |", md)


class BenchInferenceArgsTest(absltest.TestCase):
    """Bad options end in one ``error:`` line naming the flag(s) (parse only, no model built)."""

    def _error(self, *argv):
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr), self.assertRaises(SystemExit) as cm:
            bench_inference.parse_args(["--tiny", "--out=unused", *argv])
        self.assertEqual(cm.exception.code, 2)
        errors = [line for line in stderr.getvalue().splitlines() if "error:" in line]
        self.assertLen(errors, 1, stderr.getvalue())
        self.assertNotIn("Traceback", stderr.getvalue())
        return errors[0]

    def test_model_flags_are_checked_by_name(self):
        self.assertIn("error: --num_heads=3 must be a multiple of --num_kv_heads=2",
                      self._error("--num_heads=3", "--num_kv_heads=2"))
        line = self._error("--attention_every=0")
        self.assertIn("error: --attention_every must be >= 2, got 0", line)
        self.assertNotIn("attention_freq", line)
        self.assertIn("error: --head_dim must be even (RoPE), got 15", self._error("--head_dim=15"))
        self.assertIn("error: --vocab_size must be >= 2, got 1", self._error("--vocab_size=1"))
        for name in ("d_model", "num_layers", "num_heads", "num_kv_heads", "mlp_hidden"):
            self.assertIn(f"error: --{name} must be >= 1, got 0", self._error(f"--{name}=0"))
        # Only the hybrid has an attention frequency.
        args = bench_inference.parse_args(["--tiny", "--out=unused", "--models=dense,pure",
                                           "--attention_every=0"])
        self.assertEqual(args.models, ["dense", "pure"])

    def test_remaining_config_errors_name_the_flags(self):
        error = config_lib.ConfigError("model attention_freq must be >= 2, got 1")
        with mock.patch.object(bench_inference, "model_config", side_effect=error):
            line = self._error("--models=hybrid")
        self.assertIn("error: --attention_every: invalid for the hybrid model (model "
                      "attention_freq must be >= 2, got 1)", line)

    def test_run_counts_name_only_the_offending_flags(self):
        line = self._error("--decode_steps=0")
        self.assertTrue(line.endswith("error: --decode_steps=0: must be >= 1"), line)
        line = self._error("--contexts=0,64", "--prefill_iters=0")
        self.assertTrue(line.endswith("error: --contexts=0,64, --prefill_iters=0: must be >= 1"),
                        line)
        self.assertIn("--decode_tokens_per_call=-1: must be >= 1",
                      self._error("--decode_tokens_per_call=-1"))
        self.assertIn("error: --contexts: give at least one context length",
                      self._error("--contexts=,"))

    def test_contexts_take_k_and_m_suffixes(self):
        args = bench_inference.parse_args(["--tiny", "--out=unused", "--contexts=1K,2k,1M"])
        self.assertEqual(args.contexts, [1024, 2048, 1048576])
        self.assertIn("argument --contexts: '1X' is not an integer (optionally with a K = 1024 "
                      "or M = 1048576 suffix", self._error("--contexts=64,1X"))


class MultiTokenDecodeTest(absltest.TestCase):

    def test_one_call_of_three_tokens_equals_three_single_steps(self):
        args = bench_inference.parse_args(["--tiny", "--out=unused"])
        config = bench_inference.model_config("hybrid", args)
        one = bench_inference.InferenceModel(config, seed=3)
        three = bench_inference.InferenceModel(config, seed=3, tokens_per_call=3)
        params = one.init_params(jnp.int32(3))
        states = one.decode_state_fn(16, 5)()
        token = jnp.array([7], jnp.int32)
        tokens = []
        for _ in range(3):
            token, states = one.step(params, token, states)
            tokens.append(int(token[0]))
        last, states3 = three.step(params, jnp.array([7], jnp.int32),
                                   three.decode_state_fn(16, 5)())
        self.assertEqual(int(last[0]), tokens[-1])
        for a, b in zip(jax.tree_util.tree_leaves(states), jax.tree_util.tree_leaves(states3)):
            np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                       rtol=1e-5, atol=1e-6)


class BookkeepingTest(absltest.TestCase):

    def test_int_list_takes_k_and_m_suffixes(self):
        self.assertEqual(bench.int_list("1,2,3"), [1, 2, 3])
        self.assertEqual(bench.int_list(" 4K, 16k,1M,1m,7,,"),
                         [4096, 16384, 1048576, 1048576, 7])
        self.assertEqual(bench.int_list(""), [])
        for bad in ("1.5K", "K", "4G", "abc", "1KB"):
            with self.assertRaisesRegex(ValueError, f"^{bad!r} is not an integer"):
                bench.int_list(f"8,{bad}")
        with self.assertRaises(argparse.ArgumentTypeError):  # argparse prints the message
            bench.int_list("x")

    def test_guarded_names_out_of_memory_and_other_errors(self):
        def oom():
            raise jax.errors.JaxRuntimeError(OOM_MESSAGE)

        self.assertEqual(bench.guarded(oom), (None, bench.OUT_OF_MEMORY))
        # A real allocation failure: 4 TiB on this host.
        self.assertEqual(bench.guarded(lambda: jnp.zeros((2**40,), jnp.float32))[1],
                         bench.OUT_OF_MEMORY)
        self.assertEqual(bench.guarded(lambda: 1 / 0)[1],
                         "error: ZeroDivisionError: division by zero")
        self.assertEqual(bench.guarded(lambda x: x + 1, 2), (3, bench.OK))
        self.assertTrue(bench.is_out_of_memory(RuntimeError("CUDNN_STATUS_ALLOC_FAILED")))
        self.assertFalse(bench.is_out_of_memory(ValueError("shapes do not match")))

    def test_time_budget_and_estimates(self):
        now = [100.0]
        budget = bench.TimeBudget(10.0, start=100.0, clock=lambda: now[0])
        self.assertTrue(budget.allows(None))
        self.assertTrue(budget.allows(9.0))
        now[0] = 105.0
        self.assertFalse(budget.allows(6.0))
        self.assertAlmostEqual(budget.remaining(), 5.0)
        self.assertTrue(bench.TimeBudget(None).allows(1e9))
        self.assertIsNone(bench.scaled_estimate(None, None, 8, 2.0))
        self.assertAlmostEqual(bench.scaled_estimate(1.5, 4, 8, 2.0), 6.0)
        self.assertAlmostEqual(bench.scaled_estimate(1.5, 4, 8, 0.0), 1.5)

    def test_run_variants_passes_the_last_result_records_errors_and_skips(self):
        now = [0.0]
        budget = bench.TimeBudget(10.0, start=0.0, clock=lambda: now[0])
        seen = []

        def measure(rec, want, x):
            seen.append((rec["variant"], want))
            now[0] += 4.0  # the budget's clock; the walls below are real
            if x is None:
                raise ValueError("bad variant")
            rec["value"] = x
            return x

        jsonl = self.create_tempdir().full_path + "/r.jsonl"
        open(jsonl, "w").close()
        tables = []
        with mock.patch.object(bench.time, "perf_counter", side_effect=lambda: now[0]):
            recs = bench.run_variants(
                [({"variant": "a"}, (1,)), ({"variant": "b"}, (None,)),
                 ({"variant": "c"}, (3,))],
                measure, budget=bench.TimeBudget(None), jsonl=jsonl,
                table=lambda r: tables.append(len(r)) or "table", deadline_exit=3)
        # The failed variant's error is recorded and the last good result reaches the next.
        self.assertEqual(seen, [("a", None), ("b", 1), ("c", 1)])
        self.assertIn("ValueError", recs[1]["error"])
        self.assertEqual([r.get("value") for r in recs], [1, None, 3])
        self.assertEqual([r["wall_s"] for r in recs], [4.0, 4.0, 4.0])
        self.assertEqual([json.loads(x)["variant"] for x in open(jsonl)], ["a", "b", "c"])
        self.assertEqual(tables, [3])
        # A budget that the slowest variant would overrun skips the rest (no watchdog: the
        # budget's clock is a fake one that never reaches its end in real time).
        now[0] = 0.0
        with mock.patch.object(bench.time, "perf_counter", side_effect=lambda: now[0]), \
                mock.patch("threading.Timer"):
            recs = bench.run_variants(
                [({"variant": "a"}, (1,)), ({"variant": "b"}, (2,)),
                 ({"variant": "c"}, (3,))],
                measure, budget=budget, jsonl=jsonl, table=lambda r: "", deadline_exit=3)
        self.assertEqual([("skipped" in r) for r in recs], [False, False, True])
        self.assertIn("deadline (2 s left, last took 4)", recs[2]["skipped"])

    def test_compile_concurrently_records_failures(self):
        def bad_lowering():
            raise jax.errors.JaxRuntimeError(OOM_MESSAGE)

        good = jax.jit(lambda x: x * 2).lower(jax.ShapeDtypeStruct((3,), jnp.float32))
        out = bench.compile_concurrently({"good": good, "bad": bad_lowering}, max_workers=2,
                                         log=lambda s: None)
        self.assertEqual(out["bad"][:2], (None, bench.OUT_OF_MEMORY))
        compiled, status, _ = out["good"]
        self.assertEqual(status, bench.OK)
        np.testing.assert_array_equal(compiled(jnp.ones(3)), 2 * np.ones(3))
        self.assertGreater(bench.compiled_memory(compiled)["peak_estimate"], 0)


def _tiny_model(pattern, seed=0):
    cfg = config_lib.ModelConfig(
        vocab_size=64, d_model=32, layer_pattern=pattern, mlp_hidden=48, use_segment_ids=False,
        attention=config_lib.AttentionConfig(num_heads=4, num_kv_heads=2, output_gate=True),
        gdn=config_lib.GatedDeltaNetConfig(num_k_heads=2, num_v_heads=4, head_k_dim=8,
                                           head_v_dim=8, chunk_size=8),
        lightning=config_lib.LightningConfig(num_heads=4, num_kv_heads=4, chunk_size=8))
    return model_lib.LanguageModel(cfg, rngs=nnx.Rngs(seed))


class PrefillTest(absltest.TestCase):
    """The model features the inference benchmark relies on (fp32, so tolerances are fp32's)."""

    def setUp(self):
        super().setUp()
        self.model = _tiny_model(("gdn", "attn", "lightning", "attn_nope"))
        self.graphdef, self.params = nnx.split(self.model)
        self.tokens = np.asarray(jax.random.randint(jax.random.key(1), (2, 12), 0, 64), np.int32)
        self.tol = tolerances.fwd_tol(jnp.float32)

    def call(self, tokens, **kwargs):
        return nnx.merge(self.graphdef, self.params)(tokens, **kwargs)

    def test_last_logits_only_is_the_last_row(self):
        full = self.call(self.tokens)
        last = self.call(self.tokens, last_logits_only=True)
        self.assertEqual(last.shape, (2, 1, 64))
        self.assertEqual(last.dtype, jnp.float32)
        np.testing.assert_allclose(last, full[:, -1:], **self.tol)
        full_s, states = self.call(self.tokens, return_state=True)
        last_s, states_last = self.call(self.tokens, return_state=True, last_logits_only=True)
        np.testing.assert_allclose(full_s, full, **self.tol)
        np.testing.assert_allclose(last_s, full[:, -1:], **self.tol)
        jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, **self.tol),
                               states, states_last)

    def test_fresh_prefill_grown_caches_and_decode_equal_the_full_forward(self):
        full = jax.jit(lambda p, x: nnx.merge(self.graphdef, p)(x))(self.params, self.tokens)
        prefix, total = 5, self.tokens.shape[1]
        prefill = jax.jit(lambda p, x: nnx.merge(self.graphdef, p)(
            x, return_state=True, last_logits_only=True))
        logits, states = prefill(self.params, self.tokens[:, :prefix])
        np.testing.assert_allclose(logits[:, 0], full[:, prefix - 1], **self.tol)
        states = model_lib.LanguageModel.grow_state(states, total)
        self.assertEqual(states[1].k.shape[1], total)
        step = jax.jit(lambda p, x, s: nnx.merge(self.graphdef, p)(x, state=s, return_state=True),
                       donate_argnums=(2,))
        for t in range(prefix, total):
            logits, states = step(self.params, self.tokens[:, t:t + 1], states)
            np.testing.assert_allclose(logits[:, 0], full[:, t], err_msg=f"step {t}", **self.tol)


if __name__ == "__main__":
    absltest.main()
