"""GDN-2 mixer: parameter layout against spec §2.6 (v2), gates, fp64 NumPy, properties."""

import numpy as np
from absl.testing import absltest
from flax import nnx

from lattn_jax import config as config_lib
from lattn_jax import model as model_lib
from lattn_jax.mixers import gdn2
from tests import tolerances
from tests.lattn_jax.mixers import properties_test as props


class GDN2PropertiesTest(props.MixerPropertiesTest):
    MIXER = "gdn2"


def _gdn2_np(module, x):
    """fp64 GDN-2 (paper 1 Eqs. 21-24, spec §2.6 v2), written from the spec."""
    cfg = module.cfg
    p = props.np_params(module)
    b, t, _ = x.shape
    hk, h, dk, dv = cfg.num_k_heads, cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim
    qk, vd = module.qk_dim, module.v_dim
    q, k, v, proj = props.np_conv_qkv(p, x, qk, hk, dk, h, dv)
    group = h // hk
    erase = props.np_sigmoid(proj[..., 2 * qk + vd:3 * qk + vd]).reshape(b, t, hk, dk)
    write = props.np_sigmoid(proj[..., 3 * qk + vd:]).reshape(b, t, h, dv)
    a = (x @ p["f_down"]["kernel"] @ p["f_up"]["kernel"]).reshape(b, t, hk, dk)
    g = -np.exp(p["A_log"])[:, None] * props.np_softplus(a + p["dt_bias"].reshape(hk, dk))
    erase, g = np.repeat(erase, group, axis=2), np.repeat(g, group, axis=2)
    # The erase gate multiplies k on the read side only; the write's outer product uses k.
    o = props.np_recurrence(q, k, v, scale=dk ** -0.5, log_decay=g, k_read=erase * k,
                            v_write=write * v)
    z = x @ p["g_down"]["kernel"] @ p["g_up"]["kernel"] + p["g_up_bias"]
    o = props.np_rms_norm(o, p["o_norm"]["scale"], cfg.norm_eps) * props.np_silu(z).reshape(
        b, t, h, dv)
    return o.reshape(b, t, -1) @ p["out_proj"]["kernel"]


class GDN2Test(absltest.TestCase):

    def test_param_count_matches_spec_350m_hybrid(self):
        # Spec §2.6 / §3: the 20-layer 350M GDN-2 hybrid (v2 low-rank f/g; softmax layers at
        # (i + 1) % 3 == 0 with the output gate) has 296.235M parameters (commit message); one
        # GDN-2 layer is 1792*1024 + (1024*64 + 64*256) + (1024*64 + 64*512 + 512) + 4096 + 4
        # + 256 + 64 + 512*1024 + 1024 (input norm) = 2,545,476 (computed).
        pattern = tuple("attn" if (i + 1) % 3 == 0 else "gdn2" for i in range(20))
        cfg = config_lib.ModelConfig(
            vocab_size=32000, d_model=1024, layer_pattern=pattern, mlp_hidden=2816,
            attention=config_lib.AttentionConfig(num_heads=16, num_kv_heads=4, output_gate=True))
        self.assertEqual(props.spec_param_count("gdn2", cfg), 2_545_476)
        model = nnx.eval_shape(lambda: model_lib.LanguageModel(cfg, rngs=nnx.Rngs(0)))
        self.assertEqual(model_lib.count_params(model), 296_235_448)

    def test_gate_layout(self):
        module = gdn2.GatedDeltaNet2(props.tiny_config("gdn2"), rngs=nnx.Rngs(0))
        self.assertEqual(module.in_proj.kernel.shape, (32, 3 * 16 + 2 * 32))  # [q|k|v|b|w]
        self.assertEqual(module.f_up.kernel.shape, (8, 16))  # decay logits per key channel
        self.assertEqual(module.A_log.shape, (2,))  # per key head
        self.assertEqual(module.dt_bias.shape, (16,))  # per key channel
        np.testing.assert_array_equal(module.g_up_bias[...], 0.0)
        a = props.normal(1, (2, 3, 2, 8))
        want = -np.exp(np.asarray(module.A_log[...], np.float64))[:, None] * props.np_softplus(
            np.asarray(a, np.float64) + np.asarray(module.dt_bias[...], np.float64).reshape(2, 8))
        np.testing.assert_allclose(module.log_decay(a), want, rtol=1e-5)

    def test_matches_numpy(self):
        module = gdn2.GatedDeltaNet2(props.tiny_config("gdn2"), rngs=nnx.Rngs(0))
        x = props.normal(1, (2, props.T, props.D_MODEL))
        want = _gdn2_np(module, np.asarray(x, np.float64))
        tolerances.assert_rel_err(props.call(module, x), want, 1e-5, "gdn2 vs numpy")


if __name__ == "__main__":
    absltest.main()
