"""Sharding: logical axis names, the rules table, meshes, and 8 simulated devices vs one.

The multi-device checks run in subprocesses (``sharding_worker.py``) because the number of
simulated CPU devices must be set before JAX initialises, and this pytest process has one; the
multi-process check (slow) runs two such subprocesses as one JAX distributed run.
"""

import json
import os
import socket
import subprocess
import sys
import tempfile
import types

import jax
import numpy as np
import pytest
from absl.testing import absltest
from flax import nnx

from lattn_jax import checkpoint as checkpoint_lib
from lattn_jax import config as config_lib
from lattn_jax import flops
from lattn_jax import model as model_lib
from lattn_jax import sharding
from lattn_jax import train
from tests import tolerances
from tests.lattn_jax import sharding_worker

_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sharding_worker.py")
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_worker(mode: str, directory: str, devices: int) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=sharding_worker.worker_xla_flags(devices))
    proc = subprocess.run([sys.executable, _WORKER, mode, directory], env=env, cwd=_ROOT,
                          capture_output=True, text=True, timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise AssertionError(f"worker {mode} on {devices} devices failed:\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def run_processes(n: int = 2, devices: int = 2, mesh: str = "fsdp") -> list:
    """Runs the worker's ``process`` mode as ``n`` processes of one JAX distributed run."""
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        port = sock.getsockname()[1]
    procs = []
    for pid in range(n):
        env = dict(os.environ, JAX_PLATFORMS="cpu", LATTN_PROCESS_ID=str(pid),
                   LATTN_PORT=str(port), LATTN_MESH=mesh,
                   XLA_FLAGS=sharding_worker.worker_xla_flags(devices))
        procs.append(subprocess.Popen([sys.executable, _WORKER, "process", "-"], env=env,
                                      cwd=_ROOT, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    results = []
    for pid, proc in enumerate(procs):
        out, err = proc.communicate(timeout=600)
        lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
        if proc.returncode or not lines:
            for other in procs:
                other.kill()
            raise AssertionError(f"process {pid} failed:\n{err[-4000:]}")
        results.append(json.loads(lines[-1][len("RESULT "):]))
    return results


def _abstract_params(model_config):
    model = nnx.eval_shape(lambda: model_lib.LanguageModel(model_config, rngs=nnx.Rngs(0)))
    return nnx.to_pure_dict(nnx.state(model, nnx.Param))


class LogicalAxesTest(absltest.TestCase):

    def test_every_parameter_of_every_mixer_and_routing_mode_has_names(self):
        every = tuple(config_lib.MIXER_NAMES)
        routed = ("gdn", "deltanet", "attn")
        variants = [
            dict(layer_pattern=every, attention=config_lib.AttentionConfig(
                output_gate=True, qk_norm=True), tie_embeddings=False),
            dict(layer_pattern=routed, routing=config_lib.RoutingConfig(
                mode="cler", gamma_mode="channel"),
                deltanet=config_lib.DeltaNetConfig(num_v_heads=8, head_v_dim=64)),
            dict(layer_pattern=routed, routing=config_lib.RoutingConfig(mode="cler_h", rank=4)),
            dict(layer_pattern=routed, routing=config_lib.RoutingConfig(mode="surprise_gate")),
            dict(layer_pattern=routed, routing=config_lib.RoutingConfig(attn_res=True)),
        ]
        for kwargs in variants:
            cfg = config_lib.ModelConfig(vocab_size=300, d_model=128, **kwargs)
            params = _abstract_params(cfg)
            axes = sharding.param_logical_axes(params)
            flat_p = jax.tree_util.tree_leaves(params)
            flat_a = jax.tree_util.tree_leaves(axes, is_leaf=lambda x: isinstance(x, tuple))
            self.assertEqual(len(flat_p), len(flat_a))
            for leaf, names in zip(flat_p, flat_a):
                self.assertLen(names, leaf.ndim)
        self.assertEqual(axes["embed"], ("vocab", "embed"))
        self.assertEqual(axes["blocks"][0]["mlp"]["fc1"]["kernel"], ("embed", "mlp"))

    def test_unknown_matrix_is_an_error(self):
        with self.assertRaisesRegex(ValueError, "PARAM_AXES"):
            sharding.logical_axes_for(("blocks", "0", "mixer", "new_thing"), 2)

    def test_spec_drops_mesh_axes_that_do_not_divide(self):
        mesh = types.SimpleNamespace(shape={"data": 2, "fsdp": 2, "context": 1, "tensor": 4})
        rules = config_lib.DEFAULT_AXIS_RULES
        self.assertEqual(sharding.logical_to_spec(("embed", "mlp"), (64, 128), mesh, rules),
                         jax.sharding.PartitionSpec("fsdp", "tensor"))
        # 6 columns do not split 4 ways: replicated along that dimension.
        self.assertEqual(sharding.logical_to_spec(("embed", "heads"), (64, 6), mesh, rules),
                         jax.sharding.PartitionSpec("fsdp", None))
        # The batch splits over data and fsdp together, or over the part that divides it.
        self.assertEqual(sharding.logical_to_spec(sharding.ACT_BTD, (8, 4, 16), mesh, rules),
                         jax.sharding.PartitionSpec(("data", "fsdp"), None, None))
        self.assertEqual(sharding.logical_to_spec(sharding.ACT_BTD, (2, 4, 16), mesh, rules),
                         jax.sharding.PartitionSpec("data", None, None))
        # The sequence goes to the context axis when it is larger than 1 and divides T.
        mesh = types.SimpleNamespace(shape={"data": 2, "fsdp": 1, "context": 4, "tensor": 1})
        self.assertEqual(sharding.logical_to_spec(sharding.ACT_BTD, (2, 8, 16), mesh, rules),
                         jax.sharding.PartitionSpec("data", "context", None))
        self.assertEqual(sharding.logical_to_spec(sharding.ACT_BTD, (2, 1, 16), mesh, rules),
                         jax.sharding.PartitionSpec("data", None, None))  # one decoding step

    def test_constrain_and_shard_map_are_identities_without_a_mesh(self):
        x = np.ones((2, 3, 4), np.float32)
        self.assertIs(sharding.constrain(x, sharding.ACT_BTD), x)
        op = sharding.shard_map_op(lambda a: (a * 2,), (sharding.ACT_BTD,), (sharding.ACT_BTD,))
        np.testing.assert_array_equal(op(x)[0], 2 * x)

    def test_mesh_config(self):
        self.assertEqual(config_lib.MeshConfig().shape(8), (8, 1, 1, 1))
        self.assertEqual(config_lib.MeshConfig(data=-1, tensor=2).shape(8), (4, 1, 1, 2))
        self.assertEqual(config_lib.MeshConfig(data=2, context=-1).shape(8), (2, 1, 4, 1))
        with self.assertRaisesRegex(config_lib.ConfigError, "needs 8 devices"):
            config_lib.MeshConfig(data=2, fsdp=2, tensor=2).shape(4)
        with self.assertRaisesRegex(config_lib.ConfigError, "unknown mesh axes"):
            config_lib.MeshConfig(rules=(("embed", "model"),))
        cfg = config_lib.experiment_from_config_dict(dict(
            model={}, data=dict(paths=(_WORKER,), tokenizer="byte", seq_len=8, batch_size=2),
            mesh=dict(fsdp=2, rules=[["embed", ["fsdp", "data"]], ["mlp", None]])))
        self.assertEqual(cfg.mesh.rules, (("embed", ("fsdp", "data")), ("mlp", None)))


class FlopsTest(absltest.TestCase):

    def test_hand_computed_gdn_and_attention(self):
        cfg = config_lib.ModelConfig(
            vocab_size=100, d_model=16, layer_pattern=("gdn", "attn"), mlp_hidden=32,
            tie_embeddings=True,
            attention=config_lib.AttentionConfig(num_heads=2, num_kv_heads=2),
            gdn=config_lib.GatedDeltaNetConfig(num_k_heads=1, num_v_heads=2, head_k_dim=8,
                                               head_v_dim=4, chunk_size=64, conv_width=4))
        t = 32  # chunk clips to T
        gdn_core = 2 * (2 * t * (3 * 8 + 2 * 4) + 6 * 8 * 4 + t * t / 3)
        gdn_conv = 2 * 4 * (2 * 8 + 2 * 4)
        attn = 2 * t * 8 * 2
        self.assertAlmostEqual(flops.mixer_flops_per_token(cfg, "gdn", t), gdn_core + gdn_conv)
        self.assertAlmostEqual(flops.mixer_flops_per_token(cfg, "attn", t), attn)
        params = _abstract_params(cfg)
        gdn_in = 16 * (2 * 8 + 2 * 2 * 4 + 2 * 2)
        matmuls = (gdn_in + 8 * 16  # GDN in/out projections
                   + 16 * 3 * 16 + 16 * 16  # attention qkv (no gate) and out
                   + 2 * (16 * 64 + 32 * 16)  # two MLPs
                   + 100 * 16)  # tied head
        self.assertAlmostEqual(flops.flops_per_token(cfg, params, t),
                               3 * (2 * matmuls + gdn_core + gdn_conv + attn))
        # The same count from an nnx.State (leaf paths end in ".value"), as the inference
        # benchmark passes it: once counted no matmul at all (negative prefill TFLOP/s).
        state = nnx.split(nnx.eval_shape(
            lambda: model_lib.LanguageModel(cfg, rngs=nnx.Rngs(0))))[1]
        self.assertAlmostEqual(flops.flops_per_token(cfg, state, t, training=False),
                               2 * matmuls + gdn_core + gdn_conv + attn)

    def test_peak_table(self):
        device = types.SimpleNamespace(device_kind="NVIDIA H200")
        self.assertEqual(flops.peak_flops_per_device(device), 989e12)
        self.assertIsNone(flops.peak_flops_per_device(types.SimpleNamespace(device_kind="cpu")))
        self.assertEqual(flops.peak_flops_per_device(device, override=790e12), 790e12)


class MultiDeviceTest(absltest.TestCase):

    def test_sharded_step_matches_one_device_and_checkpoint_restores_on_4_and_1(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = run_worker("step", tmp, devices=8)
            fwd = tolerances.fwd_tol(np.float32)
            self.assertEqual(out["accum_steps"], [2, 1])  # accumulated, one pass
            np.testing.assert_allclose(out["loss8"], out["loss1"], **fwd)
            np.testing.assert_allclose(out["loss8_one_pass"], out["loss1"], **fwd)
            # The train step's loss is that of the parameters before its update.
            np.testing.assert_allclose(out["step_loss8"], out["loss8"], **fwd)
            self.assertEqual(out["init_max_diff"], 0.0)  # sharded init = single-device init
            # Gradients: max |g8 - g1| / max |g1| per parameter, against the fp32 grad rtol.
            rtol = tolerances.grad_tol(np.float32)["rtol"]
            for key in ("grad_max_rel", "grad_max_rel_one_pass"):
                for name, err in out[key].items():
                    self.assertLess(err, rtol, f"{key} {name}")
            self.assertEqual(out["specs"], {
                "fc1": "('fsdp', 'tensor')", "embed": "('tensor', 'fsdp')",
                "in_proj": "('fsdp', 'tensor')", "norm": "(None,)"})
            self.assertEqual(out["moment_specs"], ["('fsdp', 'tensor')"])

            four = run_worker("restore", tmp, devices=4)
            self.assertEqual(four["mismatched"], [])
            self.assertEqual(four["fc1_spec"], "('fsdp', 'tensor')")

            # ... and on this process's single device.
            trainer = train.Trainer(sharding_worker.tiny_config(config_lib.MeshConfig()))
            ckpt = checkpoint_lib.Checkpointer(tmp)
            restored = ckpt.restore(1, trainer.abstract_state())
            ckpt.close()
            expected = np.load(os.path.join(tmp, "params.npz"))
            got = sharding_worker.flat(restored)
            for key in expected.files:
                np.testing.assert_array_equal(got[key], expected[key], err_msg=key)


@pytest.mark.slow
class MultiProcessTest(absltest.TestCase):

    def test_two_processes_feed_their_own_rows_and_match_one_device(self):
        # Two JAX processes (gloo collectives on CPU), 2 devices each: every process places
        # only its 4 rows of the 8-row batch (Trainer.put_batch), two micro-batches per step.
        results = run_processes()
        fwd = tolerances.fwd_tol(np.float32)
        rtol = tolerances.grad_tol(np.float32)["rtol"]
        for out in results:
            self.assertEqual((out["processes"], out["devices"], out["accum_steps"]), (2, 4, 2))
            np.testing.assert_allclose(out["loss2"], out["loss1"], **fwd)
            np.testing.assert_allclose(out["total2"], out["total1"], **fwd)
            self.assertEqual(out["count2"], out["count1"])
            for name, err in out["grad_max_rel"].items():
                self.assertLess(err, rtol, name)

    def test_context_parallel_inside_each_process(self):
        # data 2 across the two processes x context 2 over each process's devices: every
        # process places its own rows, the sequences split over its two devices.
        results = run_processes(mesh="context")
        fwd = tolerances.fwd_tol(np.float32)
        rtol = tolerances.grad_tol(np.float32)["rtol"]
        for out in results:
            self.assertEqual(out["mesh"], {"data": 2, "fsdp": 1, "context": 2, "tensor": 1})
            np.testing.assert_allclose(out["loss2"], out["loss1"], **fwd)
            np.testing.assert_allclose(out["total2"], out["total1"], **fwd)
            for name, err in out["grad_max_rel"].items():
                self.assertLess(err, rtol, name)


if __name__ == "__main__":
    absltest.main()
