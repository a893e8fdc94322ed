"""Plain linear attention mixer: spec §2.3 layout and counts, fp64 NumPy, properties."""

import dataclasses

import numpy as np
import jax.numpy as jnp
from absl.testing import absltest
from flax import nnx

from lattn_jax import config as config_lib
from lattn_jax.mixers import linear_attention
from tests import tolerances
from tests.lattn_jax.mixers import properties_test as props


class LinearAttentionPropertiesTest(props.MixerPropertiesTest):
    MIXER = "linear_attn"


def _linear_attention_np(module, x):
    """fp64 additive linear attention (paper 1 Eqs. 4-10) in DeltaNet's shell (spec §2.3)."""
    cfg = module.cfg
    p = props.np_params(module)
    b, t, _ = x.shape
    q, k, v, _ = props.np_conv_qkv(p, x, module.qk_dim, cfg.num_k_heads, cfg.head_k_dim,
                                   cfg.num_v_heads, cfg.head_v_dim)
    o = props.np_recurrence(q, k, v, scale=cfg.head_k_dim ** -0.5)  # no decay, no erase
    o = props.np_rms_norm(o, p["o_norm"]["scale"], cfg.norm_eps).reshape(b, t, -1)
    return o @ p["out_proj"]["kernel"]


def _config(**overrides):
    cfg = props.tiny_config("linear_attn")
    return dataclasses.replace(cfg, linear_attn=dataclasses.replace(cfg.linear_attn, **overrides))


class LinearAttentionTest(absltest.TestCase):

    def test_param_count_matches_spec(self):
        # Spec §2.3 / §3: the LT hybrid has the DeltaNet hybrid's parameter count, so an LT
        # layer (with its dead beta rows) is DeltaNet's 1,582,208 (d=1024, 4 x (64, 128)).
        cfg = config_lib.ModelConfig(vocab_size=32000, d_model=1024,
                                     layer_pattern=("linear_attn",), mlp_hidden=2816)
        self.assertEqual(props.spec_param_count("linear_attn", cfg), 1_582_208)
        cfg = dataclasses.replace(
            cfg, linear_attn=config_lib.LinearAttentionConfig(dead_beta_proj=False))
        self.assertEqual(props.spec_param_count("linear_attn", cfg), 1_582_208 - 4 * 1024)

    def test_matches_numpy(self):
        module = linear_attention.LinearAttention(_config(), rngs=nnx.Rngs(0))
        x = props.normal(1, (2, props.T, props.D_MODEL))
        want = _linear_attention_np(module, np.asarray(x, np.float64))
        tolerances.assert_rel_err(props.call(module, x), want, 1e-5, "linear attn vs numpy")

    def test_dead_beta_rows_get_zero_gradient(self):
        module = linear_attention.LinearAttention(_config(), rngs=nnx.Rngs(0))
        x = props.normal(2, (1, 5, props.D_MODEL))
        grads = nnx.jit(nnx.grad(lambda m, x: jnp.sum(m(x) ** 2)))(module, x)
        g = np.asarray(grads.in_proj.kernel[...])
        np.testing.assert_array_equal(g[:, -4:], 0.0)  # the H = 4 beta columns
        self.assertGreater(np.abs(g[:, :-4]).max(), 0)

    def test_without_short_conv(self):
        module = linear_attention.LinearAttention(_config(conv_width=0), rngs=nnx.Rngs(0))
        self.assertIsNone(module.conv)
        x = props.normal(3, (2, 7, props.D_MODEL))
        full = props.call(module, x)
        y, state = props.call(module, x[:, :5], state=module.init_state(2), return_state=True)
        self.assertIsNone(state.conv_state)
        outs = [y]
        for i in range(5, 7):
            y, state = props.call(module, x[:, i:i + 1], state=state, return_state=True)
            outs.append(y)
        tolerances.assert_rel_err(jnp.concatenate(outs, 1), full, 1e-5, "no-conv decode")


if __name__ == "__main__":
    absltest.main()
