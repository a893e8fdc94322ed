"""Softmax attention mixer against an independent NumPy (fp64) implementation, KV cache, NoPE,
logit scaling and the property suite."""

import numpy as np
import pytest
import jax
import jax.numpy as jnp
from absl.testing import absltest, parameterized
from flax import nnx

from lattn_jax import config as config_lib
from lattn_jax.mixers import attention
from tests import tolerances
from tests.lattn_jax.mixers import properties_test as props


class AttentionPropertiesTest(props.MixerPropertiesTest):
    MIXER = "attn"


class NoPEAttentionPropertiesTest(props.MixerPropertiesTest):
    MIXER = "attn_nope"


def _rope_np(x, pos, theta):
    d = x.shape[-1]
    inv = 1.0 / theta ** (np.arange(0, d, 2) / d)
    ang = pos[..., None] * inv  # [B, T, d/2]
    cos, sin = np.cos(ang)[:, :, None], np.sin(ang)[:, :, None]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def _attention_np(module, x, segment_ids):
    """fp64 reference: explicit GQA repeat, explicit causal + document mask, softmax.

    Also covers QK norm (eps 1e-5), NoPE (``rope_theta=None``) and HypeNet's logit scaling.
    """
    w = np.asarray(module.qkv_proj.kernel[...], np.float64)
    wo = np.asarray(module.out_proj.kernel[...], np.float64)
    b, t, _ = x.shape
    h, g, dh = module.num_heads, module.num_kv_heads, module.head_dim
    proj = x @ w
    q, rest = proj[..., : h * dh], proj[..., h * dh:]
    gate = None
    if module.output_gate:
        gate, rest = rest[..., : h * dh], rest[..., h * dh:]
    k, v = rest[..., : g * dh], rest[..., g * dh:]
    q, k, v = (a.reshape(b, t, -1, dh) for a in (q, k, v))
    if module.q_norm is not None:
        q = props.np_rms_norm(q, np.asarray(module.q_norm.scale[...], np.float64), 1e-5)
        k = props.np_rms_norm(k, np.asarray(module.k_norm.scale[...], np.float64), 1e-5)
    # positions restart at each document
    pos = np.zeros((b, t))
    for i in range(b):
        for j in range(1, t):
            pos[i, j] = 0 if segment_ids[i, j] != segment_ids[i, j - 1] else pos[i, j - 1] + 1
    if module.rope_theta is not None:
        q, k = _rope_np(q, pos, module.rope_theta), _rope_np(k, pos, module.rope_theta)
    if module.logit_scaling_base is not None:
        a = module.logit_scaling_base
        q = q * (np.log(pos + a) / np.log(a))[:, :, None, None]
    k, v = np.repeat(k, h // g, axis=2), np.repeat(v, h // g, axis=2)
    s = np.einsum("bihd,bjhd->bhij", q, k) / np.sqrt(dh)
    same_doc = segment_ids[:, :, None] == segment_ids[:, None, :]
    mask = np.tril(np.ones((t, t), bool))[None] & same_doc
    s = np.where(mask[:, None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    o = np.einsum("bhij,bjhd->bihd", p, v).reshape(b, t, h * dh)
    if gate is not None:
        o = o / (1 + np.exp(-gate))
    return o @ wo


class AttentionTest(parameterized.TestCase):

    @parameterized.named_parameters(
        dict(testcase_name="mha", heads=4, kv_heads=4, gate=False),
        dict(testcase_name="gqa_gate", heads=4, kv_heads=2, gate=True),
        dict(testcase_name="mqa", heads=4, kv_heads=1, gate=True),
    )
    def test_matches_numpy(self, heads, kv_heads, gate):
        cfg = config_lib.ModelConfig(
            vocab_size=50, d_model=32, layer_pattern=("attn",), mlp_hidden=64,
            attention=config_lib.AttentionConfig(num_heads=heads, num_kv_heads=kv_heads,
                                                 output_gate=gate, rope_theta=10_000.0))
        module = attention.Attention(cfg, rngs=nnx.Rngs(0))
        x = np.asarray(props.normal(1, (2, 19, 32)))
        seg = np.array([[0] * 7 + [1] * 12, [3] * 19])
        out = props.call(module, jnp.asarray(x, jnp.float32), jnp.asarray(seg))
        np.testing.assert_allclose(out, _attention_np(module, x.astype(np.float64), seg),
                                   **tolerances.fwd_tol(jnp.float32))

    @parameterized.named_parameters(
        dict(testcase_name="nope_qknorm_scaling", nope=True, scaling=20.0),
        dict(testcase_name="rope_scaling", nope=False, scaling=3.0),
    )
    def test_hypenet_features_match_numpy(self, nope, scaling):
        name = "attn_nope" if nope else "attn"
        cfg = config_lib.ModelConfig(
            vocab_size=50, d_model=32, layer_pattern=(name,), mlp_hidden=64,
            attention=config_lib.AttentionConfig(num_heads=4, num_kv_heads=2, output_gate=True,
                                                 qk_norm=True, rope_theta=10_000.0,
                                                 logit_scaling_base=scaling))
        module_cls = attention.NoPEAttention if nope else attention.Attention
        module = module_cls(cfg, rngs=nnx.Rngs(0))
        self.assertEqual(module.rope_theta, None if nope else 10_000.0)
        x = np.asarray(props.normal(1, (2, 19, 32)))
        seg = np.array([[0] * 7 + [1] * 12, [3] * 19])
        out = props.call(module, jnp.asarray(x, jnp.float32), jnp.asarray(seg))
        np.testing.assert_allclose(out, _attention_np(module, x.astype(np.float64), seg),
                                   **tolerances.fwd_tol(jnp.float32))

    def test_logit_scale_values(self):
        # Spec hypenet-halo.md §1.6 item 4: a = 500 gives s = 1.113 at t = 511, 1.357 at 4K,
        # 1.566 at 16K, 1.897 at 128K, 2.231 at 1M; s_0 = 1 (0-based t, §6 item 16).
        t = jnp.array([[0, 511, 4095, 16383, 131071, 1048575]])
        np.testing.assert_allclose(attention.logit_scale(t, 500.0)[0],
                                   [1.0, 1.113, 1.357, 1.566, 1.897, 2.231], atol=1e-3)

    def test_config_validation(self):
        with self.assertRaisesRegex(ValueError, "logit_scaling_base must be > 1"):
            config_lib.AttentionConfig(logit_scaling_base=1.0)

    def test_hypenet_2b_layer_param_count(self):
        # Spec hypenet-halo.md §1.6: q (16 x 128), k/v (8 x 128), gate, o at d = 2048, q/k
        # norms (128 each): 3 * 2048^2 + 2 * 2048 * 1024 + 256 = 16,777,472 (computed).
        cfg = config_lib.ModelConfig(
            vocab_size=151936, d_model=2048, layer_pattern=("attn_nope",), mlp_hidden=6144,
            attention=config_lib.AttentionConfig(num_heads=16, num_kv_heads=8, head_dim=128,
                                                 rope_theta=None, qk_norm=True, output_gate=True))
        self.assertEqual(props.spec_param_count("attn_nope", cfg) - 2048, 16_777_472)

    def test_kv_cache_layout_and_errors(self):
        module = attention.Attention(props.tiny_config("attn", "bfloat16"), rngs=nnx.Rngs(0))
        cache = module.init_state(2, 5)
        self.assertIsInstance(cache, attention.KVCache)
        self.assertEqual(cache.k.shape, (2, 5, 2, 8))  # [B, S_max, G, dh]
        self.assertEqual(cache.v.dtype, jnp.bfloat16)
        np.testing.assert_array_equal(cache.length, [0, 0])
        x = jnp.zeros((2, 4, props.D_MODEL), jnp.bfloat16)
        _, cache = props.call(module, x, state=cache, return_state=True)
        np.testing.assert_array_equal(cache.length, [4, 4])
        with self.assertRaisesRegex(ValueError, "do not fit in the KV cache"):
            module(x[:, :2], state=cache)
        with self.assertRaisesRegex(ValueError, "batch"):
            module(x[:1, :1], state=cache)
        for max_len in (0, 8.0, None, True):  # a float or None failed with a TypeError
            with self.subTest(max_len=max_len):
                with self.assertRaisesRegex(ValueError, r"^max_len must be an integer >= 1 "
                                                        rf"\(the KV-cache capacity\), got "
                                                        rf"max_len={max_len!r}$"):
                    module.init_state(2, max_len)
        self.assertEqual(module.init_state(2, np.int64(3)).k.shape, (2, 3, 2, 8))
        # Without a state, return_state gives a cache exactly as long as the call.
        _, full = props.call(module, x, return_state=True)
        self.assertEqual(full.k.shape[1], 4)

    def test_a_cache_of_other_heads_or_head_width_is_refused(self):
        """A cache from another layer (other ``num_kv_heads`` or ``head_dim``) failed inside
        ``lax.dynamic_update_slice`` or ``jax.nn.dot_product_attention``)."""
        module = attention.Attention(props.tiny_config("attn", "float32"), rngs=nnx.Rngs(0))
        cache = module.init_state(2, 6)  # k, v [2, 6, 2, 8]
        x = props.normal(4, (2, 1, props.D_MODEL))
        for name, shape in (("k", (2, 6, 1, 8)), ("v", (2, 6, 2, 16)), ("k", (2, 6, 4, 8))):
            with self.subTest(name=name, shape=shape):
                bad = cache._replace(**{name: jnp.ones(shape)})
                with self.assertRaisesRegex(
                        ValueError, rf"the cache's {name} must be \[batch=2, max_len=6, "
                        rf"num_kv_heads=2, head_dim=8\] for this layer, got "
                        rf"\({', '.join(map(str, shape))}\)"):
                    module(x, state=bad, return_state=True)

    def test_decode_positions_restart_after_packed_prefill(self):
        module = attention.Attention(props.tiny_config("attn"), rngs=nnx.Rngs(0))
        x = props.normal(5, (1, 6, props.D_MODEL))
        _, cache = props.call(module, x, jnp.array([[0, 0, 0, 0, 1, 1]]),
                              state=module.init_state(1, 8), return_state=True)
        np.testing.assert_array_equal(cache.doc_start, [4])  # position of the next token: 2
        np.testing.assert_array_equal(cache.length, [6])

    def test_fresh_prefill_equals_cached_prefill_and_grows(self):
        # return_state without a state (training kernel, cache of capacity T) must give the
        # outputs and cache of a prefill into an empty init_state cache, packed rows included.
        module = attention.Attention(props.tiny_config("attn"), rngs=nnx.Rngs(0))
        x = props.normal(7, (2, 9, props.D_MODEL))
        seg = jnp.array([[0] * 4 + [1] * 5, [2] * 9])
        y_fresh, fresh = props.call(module, x, seg, return_state=True)
        y_cached, cached = props.call(module, x, seg, state=module.init_state(2, 9),
                                      return_state=True)
        np.testing.assert_allclose(y_fresh, y_cached, **tolerances.fwd_tol(jnp.float32))
        for a, b in zip(fresh, cached):
            np.testing.assert_allclose(a, b, **tolerances.fwd_tol(jnp.float32))
        grown = attention.grow_cache(fresh, 12)
        self.assertEqual(grown.k.shape[1], 12)
        np.testing.assert_array_equal(grown.k[:, :9], fresh.k)
        np.testing.assert_array_equal(grown.length, [9, 9])
        with self.assertRaisesRegex(ValueError, "below the cache's capacity"):
            attention.grow_cache(fresh, 4)

    def test_implementation_resolution(self):
        bf16 = jnp.bfloat16
        if jax.default_backend() != "gpu":
            self.assertEqual(attention.resolve_implementation("auto", bf16, 64), "xla")
            with self.assertRaisesRegex(ValueError, "implementation='cudnn'.*backend"):
                attention.resolve_implementation("cudnn", bf16, 64)
        else:
            self.assertEqual(attention.resolve_implementation("auto", bf16, 64), "cudnn")
        self.assertEqual(attention.resolve_implementation("auto", jnp.float32, 64), "xla")
        with self.assertRaisesRegex(ValueError, "float32"):
            attention.resolve_implementation("cudnn", jnp.float32, 64)
        with self.assertRaisesRegex(ValueError, "head_dim=12"):
            attention.resolve_implementation("cudnn", bf16, 12)
        self.assertEqual(attention.resolve_implementation("xla", bf16, 12), "xla")
        with self.assertRaisesRegex(ValueError, "choose from"):
            config_lib.AttentionConfig(implementation="flash")


@pytest.mark.gpu
class CudnnAttentionTest(parameterized.TestCase):
    """cuDNN flash attention (bf16) against XLA's attention on the same module, and against
    the fp64 NumPy reference; outputs and parameter gradients."""

    def setUp(self):
        super().setUp()
        if jax.default_backend() != "gpu":
            self.skipTest("needs a GPU")

    @parameterized.named_parameters(dict(testcase_name="causal", packed=False),
                                    dict(testcase_name="packed", packed=True))
    def test_cudnn_matches_xla(self, packed):
        def build(impl):
            cfg = config_lib.ModelConfig(
                vocab_size=50, d_model=256, layer_pattern=("attn",), mlp_hidden=64,
                dtype="bfloat16", attention=config_lib.AttentionConfig(
                    num_heads=4, num_kv_heads=2, head_dim=64, output_gate=True,
                    implementation=impl))
            return attention.Attention(cfg, rngs=nnx.Rngs(0))

        x = props.normal(3, (2, 256, 256), jnp.float32)
        seg = jnp.concatenate([jnp.zeros((2, 100), jnp.int32), jnp.ones((2, 156), jnp.int32)],
                              axis=1) if packed else None
        outs, grads = [], []
        for impl in ("cudnn", "xla"):
            module = build(impl)
            self.assertEqual(module.implementation, impl)
            graphdef, params = nnx.split(module)

            def loss(p, x):
                y = nnx.merge(graphdef, p)(x, segment_ids=seg)
                return jnp.sum(y.astype(jnp.float32) ** 2), y

            (_, y), g = jax.jit(jax.value_and_grad(loss, has_aux=True))(params, x)
            outs.append(np.asarray(y, np.float32))
            grads.append(jax.tree_util.tree_leaves(g))
        ref = _attention_np(build("xla"), np.asarray(x, np.float64),
                            np.asarray(seg) if packed else np.zeros((2, 256), int))
        rel = lambda a, b: np.linalg.norm(a - b) / np.linalg.norm(b)  # noqa: E731
        self.assertLess(rel(outs[0], ref), 2e-2)
        self.assertLess(rel(outs[0], outs[1]), 2e-2)
        for a, b in zip(*grads):
            self.assertLess(rel(np.asarray(a, np.float32), np.asarray(b, np.float32)), 3e-2)


if __name__ == "__main__":
    absltest.main()
