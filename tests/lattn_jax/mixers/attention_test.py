"""Softmax attention mixer against an independent NumPy (fp64) implementation."""

import numpy as np
import jax
import jax.numpy as jnp
from absl.testing import absltest, parameterized
from flax import nnx

from lattn_jax import config as config_lib
from lattn_jax.mixers import attention
from tests import tolerances


def _rope_np(x, pos, theta):
    d = x.shape[-1]
    inv = 1.0 / theta ** (np.arange(0, d, 2) / d)
    ang = pos[..., None] * inv  # [B, T, d/2]
    cos, sin = np.cos(ang)[:, :, None], np.sin(ang)[:, :, None]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def _attention_np(module, x, segment_ids):
    """fp64 reference: explicit GQA repeat, explicit causal + document mask, softmax."""
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
    # positions restart at each document
    pos = np.zeros((b, t))
    for i in range(b):
        for j in range(1, t):
            pos[i, j] = 0 if segment_ids[i, j] != segment_ids[i, j - 1] else pos[i, j - 1] + 1
    q, k = _rope_np(q, pos, module.rope_theta), _rope_np(k, pos, module.rope_theta)
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
        x = np.asarray(jax.random.normal(jax.random.key(1), (2, 19, 32)))
        seg = np.array([[0] * 7 + [1] * 12, [3] * 19])
        out = module(jnp.asarray(x, jnp.float32), segment_ids=jnp.asarray(seg))
        np.testing.assert_allclose(out, _attention_np(module, x.astype(np.float64), seg),
                                   **tolerances.fwd_tol(jnp.float32))


if __name__ == "__main__":
    absltest.main()
