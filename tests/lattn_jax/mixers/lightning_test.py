"""Lightning Attention mixer (HypeNet): decays, layout and counts, fp64 NumPy, properties."""

import dataclasses

import numpy as np
import jax
import jax.numpy as jnp
from absl.testing import absltest
from flax import nnx

from lattn_jax import config as config_lib
from lattn_jax import model as model_lib
from lattn_jax.mixers import lightning
from tests import tolerances
from tests.lattn_jax.mixers import properties_test as props


class LightningPropertiesTest(props.MixerPropertiesTest):
    MIXER = "lightning"


def _lightning_np(module, x, segment_ids=None, max_bias=8.0):
    """fp64 Lightning Attention from spec ``hypenet-halo.md`` §1.5 items 1-10."""
    cfg = module.cfg
    p = props.np_params(module)
    b, t, _ = x.shape
    h, g, dh = module.num_heads, module.num_kv_heads, module.head_dim
    q = (x @ p["q_proj"]["kernel"]).reshape(b, t, h, dh)
    k = (x @ p["k_proj"]["kernel"]).reshape(b, t, g, dh)
    v = (x @ p["v_proj"]["kernel"]).reshape(b, t, g, dh)
    q = props.np_rms_norm(q, p["q_norm"]["scale"], 1e-5)
    k = props.np_rms_norm(k, p["k_norm"]["scale"], 1e-5)
    pos = np.broadcast_to(np.arange(t, dtype=np.float64), (b, t))
    q, k = props.np_rope(q, pos, cfg.rope_theta), props.np_rope(k, pos, cfg.rope_theta)
    k, v = np.repeat(k, h // g, axis=2), np.repeat(v, h // g, axis=2)
    slopes = 2.0 ** (-max_bias * (np.arange(h) + 1) / h)
    log_gamma = np.broadcast_to(-slopes, (b, t, h))
    o = props.np_recurrence(q, k, v, scale=dh ** -0.5, log_decay=log_gamma)
    o = props.np_rms_norm(o.reshape(b, t, h * dh), p["o_norm"]["scale"], 1e-5)
    o = o * props.np_sigmoid(x @ p["z_proj"]["kernel"])
    return o @ p["out_proj"]["kernel"]


class LightningTest(absltest.TestCase):

    def test_fixed_decays_follow_spec(self):
        # Spec §1.5 item 5: H = 16 gives gamma_0 = 0.4931 and gamma_15 = 0.99610; not a param.
        cfg = config_lib.ModelConfig(d_model=64, layer_pattern=("lightning",),
                                     lightning=config_lib.LightningConfig(num_heads=16))
        module = lightning.LightningAttention(cfg, rngs=nnx.Rngs(0))
        gamma = np.exp(np.asarray(module.log_decay(), np.float64))
        np.testing.assert_allclose(gamma[[0, 15]], [0.4931, 0.99610], atol=1e-4)
        self.assertTrue(np.all(np.diff(gamma) > 0))
        names = [jax.tree_util.keystr(p) for p, _ in
                 jax.tree_util.tree_leaves_with_path(nnx.state(module, nnx.Param))]
        self.assertFalse([n for n in names if "decay" in n or "A_log" in n], names)

    def test_param_count_matches_hypenet_2b(self):
        # Spec §1.1: HypeNet-2B (Qwen3-1.7B: d=2048, 28 layers, 16 q / 8 kv heads of 128,
        # MLP 6144, vocab 151936, tied) with lightning 16/16/128 everywhere except the NoPE
        # softmax layers 2,3,6,8,9,21,25: about 1.926B parameters. One lightning layer is
        # 5 * 2048^2 (q, k, v, z, o) + 128 + 128 + 2048 (q/k/o norms) = 20,973,824.
        attn_layers = (2, 3, 6, 8, 9, 21, 25)
        cfg = config_lib.ModelConfig(
            vocab_size=151936, d_model=2048, mlp_hidden=6144, tie_embeddings=True,
            norm_eps=1e-6,
            layer_pattern=tuple("attn_nope" if i in attn_layers else "lightning"
                                for i in range(28)),
            attention=config_lib.AttentionConfig(num_heads=16, num_kv_heads=8, head_dim=128,
                                                 rope_theta=None, qk_norm=True,
                                                 output_gate=True),
            lightning=config_lib.LightningConfig(num_heads=16, num_kv_heads=16, head_dim=128))
        self.assertEqual(props.spec_param_count("lightning", cfg) - 2048, 20_973_824)
        model = nnx.eval_shape(lambda: model_lib.LanguageModel(cfg, rngs=nnx.Rngs(0)))
        n = model_lib.count_params(model)
        self.assertEqual(n, 1_926_138_880)
        self.assertAlmostEqual(n / 1e9, 1.926, places=3)

    def test_matches_numpy(self):
        module = lightning.LightningAttention(props.tiny_config("lightning"), rngs=nnx.Rngs(0))
        x = props.normal(1, (2, props.T, props.D_MODEL))
        want = _lightning_np(module, np.asarray(x, np.float64))
        tolerances.assert_rel_err(props.call(module, x), want, 1e-5, "lightning vs numpy")

    def test_alibi_max_bias_sets_the_decays(self):
        # alibi_max_bias = 12 (an ablation, not HypeNet): the module's decays and its output
        # follow the fp64 recurrence with slopes 2^(-12 (h + 1) / H); the default (8) does not.
        base = props.tiny_config("lightning")
        cfg = dataclasses.replace(base, lightning=dataclasses.replace(base.lightning,
                                                                      alibi_max_bias=12.0))
        module = lightning.LightningAttention(cfg, rngs=nnx.Rngs(0))
        h = module.num_heads
        np.testing.assert_allclose(module.log_decay(),
                                   -(2.0 ** (-12.0 * (np.arange(h) + 1) / h)), rtol=1e-7)
        x = props.normal(3, (2, props.T, props.D_MODEL))
        got = props.call(module, x)
        want = _lightning_np(module, np.asarray(x, np.float64), max_bias=12.0)
        tolerances.assert_rel_err(got, want, 1e-5, "lightning (b = 12) vs numpy")
        other = _lightning_np(module, np.asarray(x, np.float64))
        self.assertGreater(np.abs(np.asarray(got, np.float64) - other).max(), 1e-3)
        for bad in (0.0, -2, float("nan"), 149.0, True):
            with self.subTest(bad=bad), self.assertRaisesRegex(
                    config_lib.ConfigError, r"model\.lightning\.alibi_max_bias"):
                config_lib.LightningConfig(alibi_max_bias=bad)
        self.assertEqual(config_lib.LightningConfig(alibi_max_bias=np.float32(12)).alibi_max_bias,
                         12)

    def test_z_proj_init_is_pytorch_default(self):
        module = lightning.LightningAttention(props.tiny_config("lightning"), rngs=nnx.Rngs(0))
        z = np.asarray(module.z_proj.kernel[...])
        bound = 1 / np.sqrt(props.D_MODEL)
        self.assertTrue(np.all(np.abs(z) <= bound))
        self.assertGreater(np.abs(z).max(), 0.8 * bound)

    def test_state_carries_the_rope_position(self):
        module = lightning.LightningAttention(props.tiny_config("lightning"), rngs=nnx.Rngs(0))
        x = props.normal(2, (2, props.T, props.D_MODEL))
        seg = jnp.array([[0] * props.T, [0] * 5 + [1] * (props.T - 5)])
        _, state = props.call(module, x, seg, state=module.init_state(2), return_state=True)
        self.assertIsInstance(state, lightning.LightningState)
        np.testing.assert_array_equal(state.position, [props.T, props.T - 5])
        self.assertIsNone(state.conv_state)
        self.assertEqual(state.recurrent.dtype, jnp.float32)

    def test_optional_short_conv_prefill_then_decode(self):
        lc = config_lib.LightningConfig(num_heads=4, num_kv_heads=2, chunk_size=4, conv_width=3)
        cfg = dataclasses.replace(props.tiny_config("lightning"), lightning=lc)
        module = lightning.LightningAttention(cfg, rngs=nnx.Rngs(0))
        x = props.normal(3, (2, 7, props.D_MODEL))
        full = props.call(module, x)
        y, state = props.call(module, x[:, :5], state=module.init_state(2), return_state=True)
        self.assertEqual(state.conv_state.shape, (2, 2, (4 + 2 * 2) * 8))
        outs = [y]
        for i in range(5, 7):
            y, state = props.call(module, x[:, i:i + 1], state=state, return_state=True)
            outs.append(y)
        tolerances.assert_rel_err(jnp.concatenate(outs, 1), full, 1e-5, "conv decode")


if __name__ == "__main__":
    absltest.main()
