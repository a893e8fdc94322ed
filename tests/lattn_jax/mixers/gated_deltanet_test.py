"""Gated DeltaNet mixer: parameter layout against the spec, chunked == reference, packing."""

import numpy as np
import jax
import jax.numpy as jnp
from absl.testing import absltest, parameterized
from flax import nnx

from lattn_jax import config as config_lib
from lattn_jax import model as model_lib
from lattn_jax.mixers import gated_deltanet
from tests import tolerances


def _cfg(implementation="auto", chunk_size=16, **gdn):
    gdn = dict(dict(num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=8,
                    chunk_size=chunk_size, implementation=implementation), **gdn)
    return config_lib.ModelConfig(vocab_size=50, d_model=32, layer_pattern=("gdn",), mlp_hidden=64,
                                  gdn=config_lib.GatedDeltaNetConfig(**gdn))


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
        a = jax.random.normal(jax.random.key(1), (2, 5, 4))
        bl = jax.random.normal(jax.random.key(2), (2, 5, 4))
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
        x = jax.random.normal(jax.random.key(3), (2, t, 32))
        tolerances.assert_rel_err(chunked(x), reference(x), 1e-5, "gdn module")

    def test_packed_documents_equal_separate_runs(self):
        module = gated_deltanet.GatedDeltaNet(_cfg(), rngs=nnx.Rngs(0))
        x = jax.random.normal(jax.random.key(4), (1, 30, 32))
        seg = jnp.array([[0] * 11 + [1] * 19])
        packed = module(x, segment_ids=seg)
        first, second = module(x[:, :11]), module(x[:, 11:])
        np.testing.assert_allclose(packed[:, :11], first, **tolerances.fwd_tol(jnp.float32))
        np.testing.assert_allclose(packed[:, 11:], second, **tolerances.fwd_tol(jnp.float32))

    def test_causal(self):
        module = gated_deltanet.GatedDeltaNet(_cfg(), rngs=nnx.Rngs(0))
        x = jax.random.normal(jax.random.key(5), (1, 24, 32))
        y = x.at[:, 15:].set(jax.random.normal(jax.random.key(6), (1, 9, 32)))
        np.testing.assert_array_equal(module(x)[:, :15], module(y)[:, :15])


if __name__ == "__main__":
    absltest.main()
