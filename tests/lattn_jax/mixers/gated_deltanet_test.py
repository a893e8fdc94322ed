"""Gated DeltaNet mixer: parameter layout against the spec, chunked == reference, packing, fp64
NumPy, decoding state and the property suite."""

import numpy as np
import jax
import jax.numpy as jnp
from absl.testing import absltest, parameterized
from flax import nnx

from lattn_jax import config as config_lib
from lattn_jax import layers
from lattn_jax import model as model_lib
from lattn_jax.mixers import gated_deltanet
from tests import tolerances
from tests.lattn_jax.mixers import properties_test as props


class GatedDeltaNetPropertiesTest(props.MixerPropertiesTest):
    MIXER = "gdn"


def _gdn_np(module, x):
    """fp64 Gated DeltaNet (paper 1 Eqs. 15-17, spec §2.1), written from the spec."""
    cfg = module.cfg
    p = props.np_params(module)
    b, t, _ = x.shape
    h, dv = cfg.num_v_heads, cfg.head_v_dim
    q, k, v, proj = props.np_conv_qkv(p, x, module.qk_dim, cfg.num_k_heads, cfg.head_k_dim, h,
                                      dv)
    rest = proj[..., 2 * module.qk_dim + module.v_dim:]
    z, beta_logit, a = rest[..., :module.v_dim], rest[..., module.v_dim:-h], rest[..., -h:]
    beta = props.np_sigmoid(beta_logit)[..., None]  # [B, T, H, 1]
    g = -np.exp(p["A_log"]) * props.np_softplus(a + p["dt_bias"])  # [B, T, H]
    o = props.np_recurrence(q, k, v, scale=cfg.head_k_dim ** -0.5, log_decay=g,
                            k_read=beta * k, v_write=beta * v)
    o = props.np_rms_norm(o, p["o_norm"]["scale"], cfg.norm_eps) * props.np_silu(z).reshape(
        b, t, h, dv)
    return o.reshape(b, t, -1) @ p["out_proj"]["kernel"]


def _cfg(implementation="auto", chunk_size=16, dtype="float32", **gdn):
    gdn = dict(dict(num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=8,
                    chunk_size=chunk_size, implementation=implementation), **gdn)
    return config_lib.ModelConfig(vocab_size=50, d_model=32, layer_pattern=("gdn",), mlp_hidden=64,
                                  dtype=dtype, gdn=config_lib.GatedDeltaNetConfig(**gdn))


class GatedDeltaNetTest(parameterized.TestCase):

    def test_param_count_matches_spec_350m_layer(self):
        # Spec §2.1: GDN layer of the 350M models (d=1024, 4x64 keys, 8x64 values) has
        # 2,118,736 parameters including the fused input RMSNorm (1024).
        cfg = config_lib.ModelConfig(vocab_size=32000, d_model=1024, layer_pattern=("gdn",) * 2,
                                     mlp_hidden=2816)
        block = nnx.eval_shape(lambda: model_lib.Block("gdn", cfg, rngs=nnx.Rngs(0)))
        n = sum(x.size for x in jax.tree_util.tree_leaves(nnx.state(block.mixer, nnx.Param)))
        n += block.mixer_norm.scale.shape[0]
        self.assertEqual(n, 2_118_736)

    def test_gates_follow_definition(self):
        module = gated_deltanet.GatedDeltaNet(_cfg(), rngs=nnx.Rngs(0))
        a = props.normal(1, (2, 5, 4))
        bl = props.normal(2, (2, 5, 4))
        beta, g = module.gates(bl, a)
        a_log = np.asarray(module.A_log[...], np.float64)
        want_g = -np.exp(a_log) * np.log1p(np.exp(np.asarray(a, np.float64) + 1.0))  # dt_bias=1
        np.testing.assert_allclose(g, want_g, rtol=1e-5)
        np.testing.assert_allclose(beta, 1 / (1 + np.exp(-np.asarray(bl, np.float64))), rtol=1e-6)
        self.assertTrue(np.all((np.exp(a_log) >= 1) & (np.exp(a_log) <= 16)))

    @parameterized.parameters(1, 17, 40)
    def test_chunked_equals_reference(self, t):
        chunked = gated_deltanet.GatedDeltaNet(_cfg("chunked"), rngs=nnx.Rngs(0))
        reference = gated_deltanet.GatedDeltaNet(_cfg("reference"), rngs=nnx.Rngs(0))
        x = props.normal(3, (2, t, 32))
        tolerances.assert_rel_err(props.call(chunked, x), props.call(reference, x), 1e-5,
                                  "gdn module")

    def test_packed_documents_equal_separate_runs(self):
        module = gated_deltanet.GatedDeltaNet(_cfg(), rngs=nnx.Rngs(0))
        x = props.normal(4, (1, 30, 32))
        seg = jnp.array([[0] * 11 + [1] * 19])
        packed = props.call(module, x, seg)
        first, second = props.call(module, x[:, :11]), props.call(module, x[:, 11:])
        np.testing.assert_allclose(packed[:, :11], first, **tolerances.fwd_tol(jnp.float32))
        np.testing.assert_allclose(packed[:, 11:], second, **tolerances.fwd_tol(jnp.float32))

    def test_causal(self):
        module = gated_deltanet.GatedDeltaNet(_cfg(), rngs=nnx.Rngs(0))
        x = props.normal(5, (1, 24, 32))
        y = np.array(x)
        y[:, 15:] = np.random.default_rng(6).standard_normal((1, 9, 32))
        y = jnp.asarray(y, jnp.float32)
        np.testing.assert_array_equal(props.call(module, x)[:, :15],
                                      props.call(module, y)[:, :15])

    def test_matches_numpy(self):
        module = gated_deltanet.GatedDeltaNet(props.tiny_config("gdn"), rngs=nnx.Rngs(0))
        x = props.normal(1, (2, props.T, props.D_MODEL))
        want = _gdn_np(module, np.asarray(x, np.float64))
        tolerances.assert_rel_err(props.call(module, x), want, 1e-5, "gdn vs numpy")

    def test_state_layout(self):
        module = gated_deltanet.GatedDeltaNet(_cfg(dtype="bfloat16"), rngs=nnx.Rngs(0))
        state = module.init_state(3)
        self.assertIsInstance(state, layers.RecurrentState)
        self.assertEqual(state.conv_state.shape, (3, 3, 2 * 32 + 32))  # [B, W-1, 2HK K + H V]
        self.assertEqual(state.conv_state.dtype, jnp.bfloat16)
        self.assertEqual(state.recurrent.shape, (3, 4, 16, 8))  # [B, H, K, V]
        self.assertEqual(state.recurrent.dtype, jnp.float32)
        with self.assertRaisesRegex(ValueError, "batch 3"):
            module(jnp.zeros((2, 1, 32), jnp.bfloat16), state=state)

    def test_carried_conv_state_drops_earlier_documents(self):
        conv_state = jnp.arange(1.0, 4.0)[None, :, None] * jnp.ones((2, 3, 2))  # times T-3..T-1
        seg = jnp.array([[0, 0, 0, 1, 1], [2, 2, 2, 2, 2]])
        out = layers.carry_conv_state(conv_state, seg)
        np.testing.assert_array_equal(out[0, :, 0], [0.0, 2.0, 3.0])
        np.testing.assert_array_equal(out[1], conv_state[1])
        # Inputs from before the call (a short call) belong to its first document.
        out = layers.carry_conv_state(conv_state, jnp.array([[0, 1], [4, 4]]))
        np.testing.assert_array_equal(out[0, :, 0], [0.0, 0.0, 3.0])
        np.testing.assert_array_equal(out[1], conv_state[1])


if __name__ == "__main__":
    absltest.main()
