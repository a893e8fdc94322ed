"""DeltaNet mixer: parameter layout against spec §2.2, module against fp64 NumPy, properties."""

import numpy as np
import jax.numpy as jnp
from absl.testing import absltest
from flax import nnx

from lattn_jax import config as config_lib
from lattn_jax.mixers import deltanet
from tests import tolerances
from tests.lattn_jax.mixers import properties_test as props


class DeltaNetPropertiesTest(props.MixerPropertiesTest):
    MIXER = "deltanet"


def _deltanet_np(module, x):
    """fp64 DeltaNet (paper 1 Eq. 14): [q|k|v|beta], conv+SiLU, L2 q/k, delta rule, norm."""
    cfg = module.cfg
    p = props.np_params(module)
    b, t, _ = x.shape
    q, k, v, proj = props.np_conv_qkv(p, x, module.qk_dim, cfg.num_k_heads, cfg.head_k_dim,
                                      cfg.num_v_heads, cfg.head_v_dim)
    beta = props.np_sigmoid(proj[..., 2 * module.qk_dim + module.v_dim:])[..., None]  # [B,T,H,1]
    o = props.np_recurrence(q, k, v, scale=cfg.head_k_dim ** -0.5, k_read=beta * k,
                            v_write=beta * v)
    o = props.np_rms_norm(o, p["o_norm"]["scale"], cfg.norm_eps).reshape(b, t, -1)
    return o @ p["out_proj"]["kernel"]


class DeltaNetTest(absltest.TestCase):

    def test_param_count_matches_spec_350m_layer(self):
        # Spec §2.2: d=1024, 4 heads of K=64 / V=128: 1,582,208 with the fused input RMSNorm.
        cfg = config_lib.ModelConfig(vocab_size=32000, d_model=1024, layer_pattern=("deltanet",),
                                     mlp_hidden=2816)
        self.assertEqual(props.spec_param_count("deltanet", cfg), 1_582_208)

    def test_matches_numpy(self):
        module = deltanet.DeltaNet(props.tiny_config("deltanet"), rngs=nnx.Rngs(0))
        x = props.normal(1, (2, props.T, props.D_MODEL))
        want = _deltanet_np(module, np.asarray(x, np.float64))
        tolerances.assert_rel_err(props.call(module, x), want, 1e-5, "deltanet vs numpy")

    def test_state_layout(self):
        module = deltanet.DeltaNet(props.tiny_config("deltanet", "bfloat16"), rngs=nnx.Rngs(0))
        state = module.init_state(3)
        self.assertEqual(state.conv_state.shape, (3, 3, 2 * 16 + 32))
        self.assertEqual(state.conv_state.dtype, jnp.bfloat16)
        self.assertEqual(state.recurrent.shape, (3, 4, 8, 8))
        self.assertEqual(state.recurrent.dtype, jnp.float32)
        with self.assertRaisesRegex(ValueError, "batch 3"):
            module(jnp.zeros((2, 1, props.D_MODEL), jnp.bfloat16), state=state)


if __name__ == "__main__":
    absltest.main()
