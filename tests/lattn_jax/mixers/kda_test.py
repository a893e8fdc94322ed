"""KDA mixer: parameter layout against spec §2.4, gates and init, fp64 NumPy, properties."""

import numpy as np
import jax
import jax.numpy as jnp
from absl.testing import absltest
from flax import nnx

from lattn_jax import config as config_lib
from lattn_jax.mixers import kda
from tests import tolerances
from tests.lattn_jax.mixers import properties_test as props


class KDAPropertiesTest(props.MixerPropertiesTest):
    MIXER = "kda"


def _kda_np(module, x):
    """fp64 KDA (paper 1 Eqs. 18-20, spec §2.4), written from the spec."""
    cfg = module.cfg
    p = props.np_params(module)
    b, t, _ = x.shape
    h, dk, dv = cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim
    q, k, v, proj = props.np_conv_qkv(p, x, module.qk_dim, cfg.num_k_heads, dk, h, dv)
    beta = props.np_sigmoid(proj[..., 2 * module.qk_dim + module.v_dim:])[..., None]  # [B,T,H,1]
    trunk = x @ p["bottleneck_proj"]["kernel"]
    f_hidden, g_hidden = trunk[..., :module.rank], trunk[..., module.rank:]
    f = (f_hidden @ p["f_out_proj"]["kernel"]).reshape(b, t, h, dk)
    g = -np.exp(p["A_log"])[:, None] * props.np_softplus(f + p["dt_bias"].reshape(h, dk))
    o = props.np_recurrence(q, k, v, scale=dk ** -0.5, log_decay=g, k_read=beta * k,
                            v_write=beta * v)
    gate = props.np_sigmoid(g_hidden @ p["g_out_proj"]["kernel"] + p["g_out_bias"])
    o = props.np_rms_norm(o, p["o_norm"]["scale"], cfg.norm_eps) * gate.reshape(b, t, h, dv)
    return o.reshape(b, t, -1) @ p["out_proj"]["kernel"]


class KDATest(absltest.TestCase):

    def test_param_count_matches_spec_350m_layer(self):
        # Spec §2.4: d=1024, 4x64 keys / 8x64 values, rank-64 gates: 1,783,880 with the input
        # RMSNorm (1032*1024 + 128*1024 + 64*512 + (64*512 + 512) + 4096 + 8 + 512 + 64
        # + 512*1024 + 1024).
        cfg = config_lib.ModelConfig(vocab_size=32000, d_model=1024, layer_pattern=("kda",),
                                     mlp_hidden=2816)
        self.assertEqual(props.spec_param_count("kda", cfg), 1_783_880)

    def test_init(self):
        module = kda.KimiDeltaAttention(props.tiny_config("kda"), rngs=nnx.Rngs(0))
        rate = np.exp(np.asarray(module.A_log[...]))
        self.assertTrue(np.all((rate >= 1) & (rate <= 16)), rate)
        dt = np.asarray(jax.nn.softplus(module.dt_bias[...]))  # inverse-softplus init
        self.assertTrue(np.all((dt >= 1e-3 * (1 - 1e-5)) & (dt <= 1e-1 * (1 + 1e-5))), dt)
        self.assertEqual(module.dt_bias[...].shape, (4 * 8,))
        self.assertEqual(module.dt_bias[...].dtype, jnp.float32)
        np.testing.assert_array_equal(module.g_out_bias[...], 0.0)

    def test_log_decay_is_per_key_channel(self):
        module = kda.KimiDeltaAttention(props.tiny_config("kda"), rngs=nnx.Rngs(0))
        f = props.normal(1, (2, 3, 4, 8), jnp.bfloat16)
        g = module.log_decay(f)
        self.assertEqual(g.dtype, jnp.float32)
        want = -np.exp(np.asarray(module.A_log[...], np.float64))[:, None] * props.np_softplus(
            np.asarray(f, np.float64) + np.asarray(module.dt_bias[...], np.float64).reshape(4, 8))
        np.testing.assert_allclose(g, want, rtol=1e-5)

    def test_matches_numpy(self):
        module = kda.KimiDeltaAttention(props.tiny_config("kda"), rngs=nnx.Rngs(0))
        x = props.normal(1, (2, props.T, props.D_MODEL))
        want = _kda_np(module, np.asarray(x, np.float64))
        tolerances.assert_rel_err(props.call(module, x), want, 1e-5, "kda vs numpy")


if __name__ == "__main__":
    absltest.main()
