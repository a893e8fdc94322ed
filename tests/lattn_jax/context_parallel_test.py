"""Context parallelism (``mesh.context``) against one device, on 8 simulated CPU devices.

The multi-device checks run in subprocesses (``context_parallel_worker.py``) because the number
of simulated devices must be set before JAX initialises. Tolerance: the issue's 1e-5, as
``max |a - b| / max |b|`` per array in fp32 (the split changes only the order of fp32 sums).
The module-level check of every mixer is marked slow (``pytest -m slow`` runs it).
"""

import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from absl.testing import absltest

from lattn_jax import config as config_lib
from lattn_jax import context_parallel
from tests.lattn_jax import sharding_worker

_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "context_parallel_worker.py")
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_TOL = 1e-5


def run_worker(mode: str, devices: int = 8) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=sharding_worker.worker_xla_flags(devices))
    proc = subprocess.run([sys.executable, _WORKER, mode], env=env, cwd=_ROOT,
                          capture_output=True, text=True, timeout=900)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise AssertionError(f"worker {mode} failed:\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len("RESULT "):])


class ContextParallelTest(absltest.TestCase):

    def assert_small(self, errors: dict, where: str):
        for name, err in errors.items():
            self.assertLessEqual(err, _TOL, f"{where}: {name} differs by {err:.2e}")

    @pytest.mark.slow  # ~130 s on 2 cores; the HLO check of a GDN layer under context 4 runs in CI
    def test_every_linear_op_matches_one_device_for_context_2_4_8(self):
        out = run_worker("ops")
        ops = ("gdn", "deltanet", "kda", "gdn2", "simple_gla", "lightning", "linear_attention")
        self.assertEqual(sorted(out), sorted(f"{op}/context{n}" for op in ops for n in (2, 4, 8)))
        for key, errors in out.items():
            # outputs, final state, and gradients of q, k, v, every gate and the initial state
            self.assertIn("final_state", errors)
            self.assertIn("d_initial_state", errors)
            self.assert_small(errors, key)
        self.assertIn("d_gate2", out["gdn2/context8"])  # the value-side write gate
        self.assertIn("u", out["gdn/context4"])  # the routing residual

    @pytest.mark.slow  # ~60 s on 2 cores; CI keeps the ops, the model, scoring and the HLO
    def test_every_mixer_module_matches_one_device_on_data_2_x_context_4(self):
        # Short convolutions (halo), softmax attention (gathered keys, RoPE / NoPE + logit
        # scaling), prefill states, parameter gradients: a replicated parameter's gradient is
        # the single-device one, not multiplied by the context size.
        out = run_worker("mixers")
        self.assertEqual(sorted(out), sorted(("gdn", "deltanet", "kda", "gdn2", "linear_attn",
                                              "lightning", "attn", "attn_nope")))
        for name, errors in out.items():
            self.assertIn("d_x", errors)
            self.assertTrue(any(k.startswith("state") for k in errors), name)
            self.assert_small(errors, name)
        self.assertIn("d['conv']['kernel'].value", out["gdn"])
        self.assertIn("d['A_log'].value", out["gdn"])

    @pytest.mark.slow  # ~45 s on 2 cores (a 3-axis mesh through the Trainer)
    def test_hybrid_model_loss_and_gradients_on_data_2_x_context_2_x_tensor_2(self):
        out = run_worker("model")
        self.assertEqual(out["mesh"], {"data": 2, "fsdp": 1, "context": 2, "tensor": 2})
        self.assertEqual(out["inputs_spec"], "('data', 'context')")
        np.testing.assert_allclose(out["loss8"], out["loss1"], rtol=_TOL)
        self.assertGreater(len(out["grad_rel"]), 10)
        self.assert_small(out["grad_rel"], "gradient")

    @pytest.mark.slow  # ~30 s on 2 cores
    def test_scoring_and_generation_prefill_on_data_2_x_context_4(self):
        out = run_worker("eval")
        self.assertEqual(out["mesh"], {"data": 2, "fsdp": 1, "context": 4, "tensor": 1})
        self.assertLessEqual(out["logprob_rel"], _TOL)
        self.assertTrue(out["tokens_equal"], out["tokens"])

    @pytest.mark.slow  # ~35 s on 2 cores (CUDA lowering of three mixers)
    def test_context_path_exports_for_cuda_with_the_pallas_kernels(self):
        # The GPU program of a bf16 GDN / attention / KDA hybrid's gradient under context 2 and
        # 4: lowered for CUDA (the Triton kernels inside the shard_map), not run.
        out = run_worker("export", devices=4)
        for n in (2, 4):
            got = out[str(n)]
            self.assertEqual((got["nr_devices"], got["platforms"]), (n, ["cuda"]))
            for kernel in ("gdn_forward", "gdn_backward_chunk", "channelwise_forward",
                           "channelwise_backward_chunk"):
                self.assertIn(kernel, got["kernels"], n)
            self.assertGreater(got["collective_permutes"], 0)
            self.assertEqual(got["all_gathers"], 3)  # the softmax layer's k, v and segment ids

    @pytest.mark.slow  # ~25 s on 2 cores
    def test_context_path_exports_for_cuda_with_the_mosaic_gpu_kernels(self):
        # As above on a Hopper GPU (compute capability 9.0): auto gives GDN's layers the Mosaic
        # GPU kernels inside the shard_map (each shard with its incoming state and documents;
        # under differentiation the default forward "fused_rs" runs "fused_t0"), and KDA its
        # Mosaic state passes and grad kernel (K2) after the Triton chunk-local kernels (TUNING's
        # defaults; this slow test still named the Triton state passes until 2026-12-08).
        out = run_worker("export_hopper", devices=4)
        for n in (2, 4):
            got = out[str(n)]
            self.assertEqual((got["nr_devices"], got["platforms"]), (n, ["cuda"]))
            self.assertEqual(got["mosaic_kernels"], [
                "channelwise_grad_chunk_mosaic", "channelwise_state_bwd_mosaic",
                "channelwise_state_fwd_mosaic", "gdn_chunk_bwd_fused_ws",
                "gdn_chunk_delta_dh_fold", "gdn_chunk_delta_fused_t0_fwd",
                "gdn_chunk_kkt_inverse_subst_split_w"], n)
            self.assertGreaterEqual(got["mosaic_calls"], 7, n)
            self.assertNotIn("gdn_forward", got["kernels"], n)  # no Triton GDN kernel left
            for kernel in ("channelwise_forward", "channelwise_backward_chunk"):
                self.assertNotIn(kernel, got["kernels"], n)  # KDA's Triton state passes
            for kernel in ("channelwise_gamma", "channelwise_intra", "channelwise_prepare",
                           "channelwise_wu"):
                self.assertIn(kernel, got["kernels"], n)
            self.assertGreater(got["collective_permutes"], 0)
            self.assertEqual(got["all_gathers"], 3)

    def test_gdn_layer_moves_states_not_activations(self):
        # Compiled forward + backward of a GDN layer (H 4, K V 8, conv over 64 channels, one
        # row) under context 4, at T = 256 and 512.
        out = run_worker("hlo", devices=4)
        heads, dk, dv, channels, halo = 4, 8, 8, 64, 3
        state_bytes = 4 * heads * dk * max(dk, dv)
        for t, ops in out.items():
            kinds = {op["kind"] for op in ops}
            self.assertNotIn("all-gather", kinds, f"T={t}")
            permutes = [op for op in ops if op["kind"] == "collective-permute"]
            # Hillis-Steele over 4 shards: 2 steps of (M, X) forward, their transposes backward,
            # plus the entry-state shift, the conv halo and the boundary segment ids.
            self.assertGreaterEqual(len(permutes), 6, f"T={t}")
            for op in permutes:
                self.assertLessEqual(op["bytes"], max(state_bytes, 4 * halo * channels),
                                     op["line"])

        # Cross-device all-reduces (the parameter gradients' sum over shards) carry parameter
        # sizes; the compiler's one-device groups ({{0},{1},...}) move nothing.
        def crossing(ops):
            return sorted(op["bytes"] for op in ops if op["kind"] == "all-reduce"
                          and not re.fullmatch(r"\{(\{\d+\},?)+\}", op["groups"]))
        self.assertTrue(crossing(out["256"]))
        self.assertEqual(crossing(out["256"]), crossing(out["512"]))
        # Independent of T: the same messages at both lengths.
        sizes = {t: sorted(op["bytes"] for op in ops if op["kind"] == "collective-permute")
                 for t, ops in out.items()}
        self.assertEqual(sizes["256"], sizes["512"])
        self.assertEqual(context_parallel.halo_bytes(heads, dk, dv, 4),
                         2 * 4 * heads * dk * (dk + dv))

    def test_sequence_length_must_split(self):
        model = config_lib.ModelConfig(layer_pattern=("gdn",))
        context_parallel.check_sequence_length(4096, 8, model)
        with self.assertRaisesRegex(config_lib.ConfigError, "data.seq_len=100 .*mesh.context=8"):
            context_parallel.check_sequence_length(100, 8, model)
        with self.assertRaisesRegex(config_lib.ConfigError, "halo"):
            context_parallel.check_sequence_length(16, 8, model)
        with self.assertRaisesRegex(config_lib.ConfigError, "mesh.context must be >= 1"):
            config_lib.MeshConfig(context=0)
        with self.assertRaisesRegex(ValueError,
                                    r"^--context=3 needs a multiple of 3 devices; there is 1$"):
            context_parallel.evaluation_mesh(3)
        self.assertIsNone(context_parallel.evaluation_mesh(1))

    def test_padding_bucket_leaves_every_shard_the_convolution_halo(self):
        model = config_lib.ModelConfig(layer_pattern=("gdn",))  # conv_width 4: a 3-token halo
        self.assertEqual(context_parallel.padding_bucket(16, 1, model), 16)
        self.assertEqual(context_parallel.padding_bucket(16, 4, model), 16)
        self.assertEqual(context_parallel.padding_bucket(16, 8, model), 32)
        self.assertEqual(context_parallel.padding_bucket(32, 16, model), 64)
        self.assertEqual(context_parallel.padding_bucket(16, 8, None), 16)
        for base, context in ((16, 8), (32, 16), (64, 32), (16, 3)):
            bucket = context_parallel.padding_bucket(base, context, model)
            self.assertEqual(bucket % math.lcm(base, context), 0)
            self.assertGreaterEqual(bucket // context, 3)
            context_parallel.check_sequence_length(bucket, context, model)
        with self.assertRaisesRegex(ValueError, "must be >= 1"):
            context_parallel.padding_bucket(16, 0, model)


if __name__ == "__main__":
    absltest.main()
