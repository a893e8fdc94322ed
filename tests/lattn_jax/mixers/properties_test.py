"""The property suite every token mixer must satisfy (issue 3), fp32 and with bf16 inputs.

:class:`MixerPropertiesTest` is parameterised by the class attribute ``MIXER`` (a name of
``lattn_jax.mixers.REGISTRY``); each variant's test file runs it through a one-line subclass
(``class GDNPropertiesTest(properties_test.MixerPropertiesTest): MIXER = "gdn"``), so that every
file stays small and fast. This file checks that every registered mixer has such a subclass.

Properties, each in fp32 and in bf16 (compute dtype and inputs):

* causality: changing tokens ``>= t0`` leaves outputs ``< t0`` bit-identical;
* packed documents through ``segment_ids`` equal separate runs;
* a prefill followed by token-by-token decoding equals the full forward (outputs and state),
  and so does a second multi-token call continuing the prefill's state;
* a packed prefill followed by decoding equals prefilling and decoding the last document alone;
* strong decay / saturated gates: huge inputs (and decay rates) give finite outputs and
  gradients;
* the GQA/GVA head mapping: a grouped module equals the ungrouped module whose key-side
  (linear mixers) or K/V (softmax, Lightning) weights are repeat-interleaved over heads.
"""

import dataclasses
import functools
import importlib
from typing import Dict, List, Optional, Tuple

import numpy as np
import jax
import jax.numpy as jnp
from absl.testing import absltest, parameterized
from flax import nnx

from lattn_jax import config as config_lib
from lattn_jax import mixers
from lattn_jax.mixers import attention
from tests import tolerances

D_MODEL = 32
T = 12  # three chunks of 4; prefixes and documents of 6 (one compiled shape for both)
HALF = 6
DTYPES = (("fp32", "float32"), ("bf16", "bfloat16"))

# Test file holding the MixerPropertiesTest subclass of each registered mixer.
SUBCLASS_FILES = {
    "attn": "attention_test",
    "attn_nope": "attention_test",
    "gdn": "gated_deltanet_test",
    "deltanet": "deltanet_test",
    "kda": "kda_test",
    "gdn2": "gdn2_test",
    "lightning": "lightning_test",
    "linear_attn": "linear_attention_test",
}


def normal(seed, shape, dtype=jnp.float32, scale=1.0):
    """Normal draws of standard deviation ``scale`` from numpy's generator, scaled in numpy and
    cast once to ``dtype``: each jax.random call (and each eager op on the draws) on a new shape
    compiles a program."""
    return jnp.asarray(scale * np.random.default_rng(seed).standard_normal(shape), dtype)


def tiny_config(name: str, dtype: str = "float32", grouped: bool = True,
                **attention_kw) -> config_lib.ModelConfig:
    """A one-layer config for mixer ``name`` with GQA/GVA (``grouped``) or without."""
    kh = 2 if grouped else 4
    linear = dict(num_k_heads=kh, num_v_heads=4, head_k_dim=8, head_v_dim=8, chunk_size=4)
    attn = dict(num_heads=4, num_kv_heads=kh, output_gate=True, qk_norm=True,
                rope_theta=10_000.0)
    attn.update(attention_kw)
    return config_lib.ModelConfig(
        vocab_size=50, d_model=D_MODEL, layer_pattern=(name,), mlp_hidden=64, dtype=dtype,
        # A larger init std so outputs are O(1) and relative errors are meaningful.
        init_std=0.2,
        attention=config_lib.AttentionConfig(**attn),
        gdn=config_lib.GatedDeltaNetConfig(**linear),
        deltanet=config_lib.DeltaNetConfig(**linear),
        kda=config_lib.KDAConfig(**linear),
        gdn2=config_lib.GDN2Config(**linear),
        linear_attn=config_lib.LinearAttentionConfig(**linear),
        lightning=config_lib.LightningConfig(num_heads=4, num_kv_heads=kh, chunk_size=4,
                                             rope_theta=10_000.0),
    )


Segment = Tuple[int, int, int]  # (heads, width per head, repeat factor) along the last axis


def head_layout(name: str, cfg: config_lib.ModelConfig) -> Dict[Tuple[str, ...], List[Segment]]:
    """Where each parameter holds key-side (or K/V) heads, for the GQA/GVA mapping test.

    Returns a map from parameter path to the segments of its last axis; a segment
    ``(n, w, r)`` holds ``n`` heads of width ``w``, each to be repeated ``r`` times to build the
    ungrouped module. Parameters not listed are copied unchanged.
    """
    if name in ("attn", "attn_nope"):
        a = cfg.attention
        dh = cfg.attention_head_dim
        r = a.num_heads // a.num_kv_heads
        q_width = a.num_heads * dh * (2 if a.output_gate else 1)
        return {("qkv_proj", "kernel"): [(1, q_width, 1), (a.num_kv_heads, dh, r),
                                         (a.num_kv_heads, dh, r)]}
    if name == "lightning":
        lc = cfg.lightning
        dh = cfg.lightning_head_dim
        r = lc.num_heads // lc.num_kv_heads
        return {("k_proj", "kernel"): [(lc.num_kv_heads, dh, r)],
                ("v_proj", "kernel"): [(lc.num_kv_heads, dh, r)]}
    sub = {"gdn": cfg.gdn, "deltanet": cfg.deltanet, "kda": cfg.kda, "gdn2": cfg.gdn2,
           "linear_attn": cfg.linear_attn}[name]
    hk, k = sub.num_k_heads, sub.head_k_dim
    r = sub.num_v_heads // hk
    v_dim = sub.num_v_heads * sub.head_v_dim
    key = (hk, k, r)
    qkv = [key, key, (1, v_dim, 1)]
    rest = {"gdn": v_dim + 2 * sub.num_v_heads, "deltanet": sub.num_v_heads,
            "kda": sub.num_v_heads, "linear_attn": sub.num_v_heads, "gdn2": 0}[name]
    in_proj = qkv + ([(1, rest, 1)] if rest else [])
    layout = {("in_proj", "kernel"): in_proj, ("conv", "kernel"): qkv}
    if name == "gdn2":
        layout[("in_proj", "kernel")] = qkv + [key, (1, v_dim, 1)]
        layout[("f_up", "kernel")] = [key]
        layout[("A_log",)] = [(hk, 1, r)]
        layout[("dt_bias",)] = [key]
    return layout


def _repeat_heads(x: np.ndarray, segments: List[Segment]) -> np.ndarray:
    """Repeat-interleaves the heads of each segment of the last axis of ``x``."""
    out, start = [], 0
    for heads, width, rep in segments:
        seg = x[..., start:start + heads * width]
        seg = seg.reshape(seg.shape[:-1] + (heads, width))
        out.append(np.repeat(seg, rep, axis=-2).reshape(seg.shape[:-2] + (-1,)))
        start += heads * width
    if start != x.shape[-1]:
        raise ValueError(f"segments cover {start} of {x.shape[-1]} entries")
    return np.concatenate(out, axis=-1)


def _get(tree, path):
    for p in path:
        tree = tree[p]
    return tree


def _set(tree, path, value):
    for p in path[:-1]:
        tree = tree[p]
    tree[path[-1]] = value


def init_state(module, batch: int, max_len: int):
    """``module.init_state``: softmax attention also takes the cache capacity."""
    if isinstance(module, attention.Attention):
        return module.init_state(batch, max_len)
    return module.init_state(batch)


@functools.partial(nnx.jit, static_argnames=("return_state",))
def call(module, x, segment_ids=None, state=None, return_state=False):
    """``module(x, ...)`` under ``nnx.jit``: one compile per shape is cheaper than eager mode."""
    return module(x, segment_ids=segment_ids, state=state, return_state=return_state)


@nnx.jit
def _prefix_input_grad(module, x, mask):
    """Gradient w.r.t. ``x`` of the outputs selected by ``mask`` ([1, T, 1])."""
    return jax.grad(lambda x: jnp.sum(module(x).astype(jnp.float32) * mask))(x)


@nnx.jit
def _loss_and_grads(module, x):
    def loss(m, x):
        return jnp.sum(m(x).astype(jnp.float32) ** 2)

    return nnx.value_and_grad(loss, argnums=(0, 1))(module, x)


def _f32(x) -> np.ndarray:
    return np.asarray(jnp.asarray(x, jnp.float32), np.float64)


def _max_rel_err(dtype: str) -> float:
    """The forward rtol of ``tests/tolerances.py`` used as a bound on the relative RMS error."""
    return tolerances.FWD[jnp.dtype(dtype)][0]


# ---------------------------------------------------------------------------------------------
# Independent fp64 NumPy pieces for the per-variant "exact math" tests.
# ---------------------------------------------------------------------------------------------


def np_params(module) -> Dict:
    """The module's parameters as a nested dict of fp64 NumPy arrays."""
    return jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64),
                                  nnx.to_pure_dict(nnx.state(module, nnx.Param)))


def np_silu(x):
    return x / (1.0 + np.exp(-x))


def np_sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def np_softplus(x):
    return np.logaddexp(0.0, x)


def np_rms_norm(x, weight, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def np_l2_normalize(x, eps=1e-6):
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)


def np_short_conv(x, kernel):
    """``y[t, c] = sum_i w[i, c] x[t - W + 1 + i, c]`` with zeros before the row start."""
    width = kernel.shape[0]
    xp = np.concatenate([np.zeros((x.shape[0], width - 1, x.shape[2])), x], axis=1)
    return sum(kernel[i] * xp[:, i:i + x.shape[1]] for i in range(width))


def np_rope(x, positions, theta):
    """Rotate-half RoPE on ``[B, T, H, K]`` with positions ``[B, T]``."""
    d = x.shape[-1]
    ang = positions[..., None] * (1.0 / theta ** (np.arange(0, d, 2) / d))  # [B, T, d/2]
    cos, sin = np.cos(ang)[:, :, None], np.sin(ang)[:, :, None]
    x1, x2 = x[..., :d // 2], x[..., d // 2:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def np_recurrence(q, k, v, *, scale, log_decay=None, k_read=None, v_write=None):
    """Token-serial linear-attention recurrence in fp64, all per value head ``[B, T, H, .]``.

    ``S~ = Diag(exp g_t) S`` (``log_decay`` ``[B, T, H]`` scalar or ``[B, T, H, K]`` per key
    channel, ``None``: no decay), ``u_t = vw_t - S~^T kr_t``, ``S_t = S~ + k_t u_t^T``,
    ``o_t = scale S_t^T q_t``. ``k_read=None`` means no erase (plain/Lightning attention);
    ``v_write=None`` means ``v``.
    """
    b, t, h, dk = k.shape
    dv = v.shape[-1]
    v_write = v if v_write is None else v_write
    state = np.zeros((b, h, dk, dv))
    out = np.zeros((b, t, h, dv))
    for i in range(t):
        if log_decay is not None:
            g = log_decay[:, i]
            g = g[..., None, None] if g.ndim == 2 else g[..., :, None]
            state = np.exp(g) * state
        u = v_write[:, i]
        if k_read is not None:
            u = u - np.einsum("bhk,bhkv->bhv", k_read[:, i], state)
        state = state + k[:, i][..., :, None] * u[..., None, :]
        out[:, i] = scale * np.einsum("bhk,bhkv->bhv", q[:, i], state)
    return out


def np_conv_qkv(params, x, qk_dim, heads_k, head_k, heads_v, head_v):
    """In-projection's ``[q | k | v]`` block through conv + SiLU, q/k L2-normalised, per head."""
    b, t, _ = x.shape
    proj = x @ params["in_proj"]["kernel"]
    qkv = np_silu(np_short_conv(proj[..., :2 * qk_dim + heads_v * head_v],
                                params["conv"]["kernel"]))
    q = np_l2_normalize(qkv[..., :qk_dim].reshape(b, t, heads_k, head_k))
    k = np_l2_normalize(qkv[..., qk_dim:2 * qk_dim].reshape(b, t, heads_k, head_k))
    v = qkv[..., 2 * qk_dim:].reshape(b, t, heads_v, head_v)
    group = heads_v // heads_k
    return np.repeat(q, group, axis=2), np.repeat(k, group, axis=2), v, proj


def spec_param_count(name: str, model_config: config_lib.ModelConfig) -> int:
    """Parameters of one ``name`` layer's mixer plus its input RMSNorm, as the spec counts them."""
    from lattn_jax import model as model_lib  # pylint: disable=import-outside-toplevel
    block = nnx.eval_shape(lambda: model_lib.Block(name, model_config, rngs=nnx.Rngs(0)))
    n = sum(x.size for x in jax.tree_util.tree_leaves(nnx.state(block.mixer, nnx.Param)))
    return n + block.mixer_norm.scale.shape[0]


# ---------------------------------------------------------------------------------------------
# The property suite.
# ---------------------------------------------------------------------------------------------


class MixerPropertiesTest(parameterized.TestCase):
    """The issue-3 property suite for the mixer named ``MIXER`` (``None``: abstract, skipped)."""

    MIXER: Optional[str] = None

    def setUp(self):
        super().setUp()
        if self.MIXER is None:
            self.skipTest("abstract property suite; run through a subclass with MIXER set")

    def _module(self, dtype, grouped=True, seed=0):
        cfg = tiny_config(self.MIXER, dtype, grouped)
        return mixers.build_mixer(self.MIXER, cfg, rngs=nnx.Rngs(seed)), cfg

    def _x(self, dtype, seed=1, length=T, scale=1.0):
        return normal(seed, (2, length, D_MODEL), dtype, scale)

    def _assert_close(self, actual, expected, dtype, name):
        tolerances.assert_rel_err(_f32(actual), _f32(expected), _max_rel_err(dtype),
                                  f"{self.MIXER} {dtype} {name}")

    def _assert_state_close(self, actual, expected, dtype, name):
        flat_a, tree_a = jax.tree_util.tree_flatten(actual)
        flat_e, tree_e = jax.tree_util.tree_flatten(expected)
        self.assertEqual(tree_a, tree_e)
        for i, (a, e) in enumerate(zip(flat_a, flat_e)):
            self.assertEqual(a.shape, e.shape)
            self.assertEqual(a.dtype, e.dtype)
            if jnp.issubdtype(a.dtype, jnp.integer):
                np.testing.assert_array_equal(a, e)
            elif np.any(_f32(e)):
                self._assert_close(a, e, dtype, f"{name} state leaf {i}")

    @parameterized.named_parameters(*DTYPES)
    def test_causal(self, dtype):
        module, _ = self._module(dtype)
        x = self._x(dtype)
        t0 = 7
        y = x.at[:, t0:].set(self._x(dtype, seed=2)[:, t0:])
        out_x, out_y = call(module, x), call(module, y)
        self.assertEqual(out_x.shape, x.shape)
        self.assertEqual(out_x.dtype, jnp.dtype(dtype))
        np.testing.assert_array_equal(_f32(out_x[:, :t0]), _f32(out_y[:, :t0]))
        self.assertGreater(np.abs(_f32(out_x[:, t0:]) - _f32(out_y[:, t0:])).max(), 0)
        if jnp.dtype(dtype) == jnp.float32:
            # The gradients of the earlier outputs do not see the future either: zero w.r.t.
            # future inputs, and unchanged w.r.t. earlier inputs when the future changes.
            mask = (jnp.arange(x.shape[1]) < t0).astype(jnp.float32)[None, :, None]
            grad_x = _prefix_input_grad(module, x, mask)
            grad_y = _prefix_input_grad(module, y, mask)
            np.testing.assert_array_equal(grad_x[:, t0:], 0.0)
            self.assertGreater(np.abs(grad_x[:, :t0]).max(), 0)
            np.testing.assert_allclose(grad_x[:, :t0], grad_y[:, :t0], rtol=1e-6, atol=1e-7)

    @parameterized.named_parameters(*DTYPES)
    def test_packed_documents_equal_separate_runs(self, dtype):
        module, _ = self._module(dtype)
        x = self._x(dtype)
        seg = jnp.array([[0] * HALF + [1] * HALF, [5] * HALF + [2] * HALF])
        packed = call(module, x, seg)
        self._assert_close(packed[:, :HALF], call(module, x[:, :HALF]), dtype, "first document")
        self._assert_close(packed[:, HALF:], call(module, x[:, HALF:]), dtype, "second document")

    @parameterized.named_parameters(*DTYPES)
    def test_prefill_then_decode_equals_forward(self, dtype):
        module, _ = self._module(dtype)
        x = self._x(dtype)
        full, full_state = call(module, x, state=init_state(module, 2, T), return_state=True)
        self._assert_close(full, call(module, x), dtype, "forward with vs without state")
        prefill, prefill_state = call(module, x[:, :HALF], state=init_state(module, 2, T),
                                      return_state=True)
        # Token-by-token decoding after the prefill.
        outs, state = [prefill], prefill_state
        for i in range(HALF, T):
            y, state = call(module, x[:, i:i + 1], state=state, return_state=True)
            self.assertEqual(y.shape, (2, 1, D_MODEL))
            outs.append(y)
        self._assert_close(jnp.concatenate(outs, axis=1), full, dtype, "decode vs forward")
        self._assert_state_close(state, full_state, dtype, "decode vs forward")
        # A second multi-token call continuing the state (chunked prefill).
        rest, rest_state = call(module, x[:, HALF:], state=prefill_state, return_state=True)
        self._assert_close(rest, full[:, HALF:], dtype, "chunked prefill vs forward")
        self._assert_state_close(rest_state, full_state, dtype, "chunked prefill vs forward")
        for leaf in jax.tree_util.tree_leaves(state):
            if leaf.ndim == 4 and not isinstance(state, attention.KVCache):
                self.assertEqual(leaf.dtype, jnp.float32, "recurrent state must be fp32")

    @parameterized.named_parameters(*DTYPES)
    def test_packed_prefill_then_decode(self, dtype):
        module, _ = self._module(dtype)
        x = self._x(dtype)
        token = self._x(dtype, seed=3, length=1)
        # Row 0: two documents of HALF; row 1: three, the last one (2 tokens) shorter than the
        # short-conv window, so that carried conv inputs of the earlier document would leak.
        seg = jnp.array([[0] * HALF + [1] * HALF, [3] * 4 + [4] * (T - 6) + [7] * 2])
        last_start = np.array([HALF, T - 2])
        _, state = call(module, x, seg, state=init_state(module, 2, T + 1), return_state=True)
        y, _ = call(module, token, state=state, return_state=True)
        # Decoding continues each row's last document only: earlier documents do not matter...
        earlier = np.arange(T)[None, :, None] < last_start[:, None, None]
        x2 = jnp.where(earlier, self._x(dtype, seed=4), x)
        _, state2 = call(module, x2, seg, state=init_state(module, 2, T + 1), return_state=True)
        y2, _ = call(module, token, state=state2, return_state=True)
        self._assert_close(y2, y, dtype, "decode after packed prefill, other earlier documents")
        # ... and it is as if the last document had been prefilled alone (checked on row 0).
        _, alone = call(module, x[:, HALF:], state=init_state(module, 2, T + 1),
                        return_state=True)
        want, _ = call(module, token, state=alone, return_state=True)
        self._assert_close(y[:1], want[:1], dtype, "decode after packed prefill vs alone")

    @parameterized.named_parameters(*DTYPES)
    def test_saturated_gates_and_strong_decay_are_finite(self, dtype):
        module, _ = self._module(dtype)
        if hasattr(module, "A_log"):  # decay rates exp(A_log) = 1e4: log-decays near -1e5
            module.A_log = nnx.Param(jnp.full_like(module.A_log[...], np.log(1e4)))
        x = self._x(dtype, scale=1e3)  # saturates every sigmoid / softplus gate
        value, (grad_m, grad_x) = _loss_and_grads(module, x)
        self.assertTrue(np.isfinite(value), f"loss {value}")
        self.assertTrue(np.all(np.isfinite(_f32(grad_x))))
        for path, g in jax.tree_util.tree_leaves_with_path(nnx.state(grad_m, nnx.Param)):
            self.assertTrue(np.all(np.isfinite(_f32(g))), jax.tree_util.keystr(path))

    @parameterized.named_parameters(*DTYPES)
    def test_grouped_heads_equal_repeated_heads(self, dtype):
        grouped, cfg = self._module(dtype, grouped=True)
        full, _ = self._module(dtype, grouped=False, seed=1)
        params = nnx.to_pure_dict(nnx.state(grouped, nnx.Param))
        full_state = nnx.state(full, nnx.Param)
        for path, segments in head_layout(self.MIXER, cfg).items():
            _set(params, path, jnp.asarray(_repeat_heads(np.asarray(_get(params, path)),
                                                         segments)))
        jax.tree_util.tree_map(lambda a, b: self.assertEqual(a.shape, b.shape), params,
                               nnx.to_pure_dict(full_state))
        nnx.replace_by_pure_dict(full_state, params)
        nnx.update(full, full_state)
        x = self._x(dtype)
        self._assert_close(call(full, x), call(grouped, x), dtype, "grouped vs repeated heads")

    @parameterized.named_parameters(
        ("rank_2", (2, T), None, rf"x must be \[batch, seq_len, d_model={D_MODEL}\] "
         rf"\(rank 3\), got shape \(2, {T}\)"),
        ("wide", (2, T, D_MODEL + 1), None, rf"x must be \[batch, seq_len, d_model={D_MODEL}\], "
         rf"got \(2, {T}, {D_MODEL + 1}\)"),
        ("short_segment_ids", (2, T, D_MODEL), (2, T - 1),
         rf"segment_ids must be \[batch=2, seq_len={T}\] like x, got \(2, {T - 1}\)"),
    )
    def test_bad_input_shapes_name_the_argument(self, shape, seg_shape, message):
        # Checked on static shapes before any computation: an abstract module suffices.
        cfg = tiny_config(self.MIXER)
        module = nnx.eval_shape(lambda: mixers.build_mixer(self.MIXER, cfg, rngs=nnx.Rngs(0)))
        x = normal(5, shape)
        seg = (None if seg_shape is None else
               jnp.asarray(np.random.default_rng(6).integers(0, 3, seg_shape), jnp.int32))
        with self.assertRaisesRegex(ValueError, message):
            module(x, segment_ids=seg)

    def test_integer_x_names_x_and_its_dtype(self):
        # An int32 x ran silently (the kernel ops refuse integer q/k/v).
        cfg = tiny_config(self.MIXER)
        module = nnx.eval_shape(lambda: mixers.build_mixer(self.MIXER, cfg, rngs=nnx.Rngs(0)))
        x = jnp.ones((2, T, D_MODEL), jnp.int32)
        with self.assertRaisesRegex(ValueError, r"^x must have a floating dtype \(activations, "
                                                r"not token ids\), got x\.dtype=int32$"):
            module(x)

    def test_float_segment_ids_are_refused_naming_their_dtype(self):
        # Softmax attention used to accept them; the linear mixers' kernels refused them.
        cfg = tiny_config(self.MIXER)
        module = nnx.eval_shape(lambda: mixers.build_mixer(self.MIXER, cfg, rngs=nnx.Rngs(0)))
        x = jnp.ones((2, T, D_MODEL), jnp.float32)
        with self.assertRaisesRegex(ValueError, r"^segment_ids must have an integer dtype, got "
                                                r"segment_ids\.dtype=float32$"):
            module(x, segment_ids=jnp.zeros((2, T), jnp.float32))

    def test_no_tokens_are_refused_naming_x_shape_with_or_without_a_state(self):
        # Was an error naming an internal q (linear), an empty y or an IndexError (attention).
        cfg = tiny_config(self.MIXER)
        module = mixers.build_mixer(self.MIXER, cfg, rngs=nnx.Rngs(0))
        message = (rf"^x must hold at least one row and one token \[batch, seq_len, "
                   rf"d_model={D_MODEL}\], got shape \(2, 0, {D_MODEL}\)$")
        x = jnp.ones((2, 0, D_MODEL), jnp.float32)
        with self.assertRaisesRegex(ValueError, message):
            module(x)
        with self.assertRaisesRegex(ValueError, message):
            module(x, state=init_state(module, 2, T), return_state=True)

    @parameterized.named_parameters(("zero", 0), ("negative", -1), ("float", 2.5),
                                    ("bool", True))
    def test_init_state_refuses_a_batch_that_is_not_a_positive_integer(self, batch):
        cfg = tiny_config(self.MIXER)
        module = nnx.eval_shape(lambda: mixers.build_mixer(self.MIXER, cfg, rngs=nnx.Rngs(0)))
        with self.assertRaisesRegex(ValueError, rf"^init_state: batch={batch!r}; expected a "
                                                rf"positive integer \(rows\)$"):
            init_state(module, batch, T)
        self.assertLen(jax.tree_util.tree_leaves(init_state(module, np.int64(2), T))[0], 2)


class RegistryCoverageTest(absltest.TestCase):

    def test_every_mixer_runs_the_property_suite(self):
        self.assertEqual(set(SUBCLASS_FILES), set(mixers.REGISTRY))
        for name, file in SUBCLASS_FILES.items():
            module = importlib.import_module(f"tests.lattn_jax.mixers.{file}")
            suites = [obj for obj in vars(module).values()
                      if isinstance(obj, type) and issubclass(obj, MixerPropertiesTest)
                      and obj.MIXER == name]
            self.assertLen(suites, 1, f"{file}.py must subclass MixerPropertiesTest for {name!r}")


class MixerConfigValidationTest(parameterized.TestCase):

    @parameterized.named_parameters(
        ("deltanet_heads", config_lib.DeltaNetConfig, dict(num_k_heads=3),
         r"model\.deltanet\.num_v_heads=4 must be a multiple of model\.deltanet\.num_k_heads=3"),
        ("kda_chunk", config_lib.KDAConfig, dict(chunk_size=48),
         r"model\.kda\.chunk_size must be a positive power of two"),
        ("kda_dt", config_lib.KDAConfig, dict(dt_min=0.5, dt_max=0.1),
         r"model\.kda\.dt_min=0\.5 and model\.kda\.dt_max=0\.1"),
        ("gdn2_impl", config_lib.GDN2Config, dict(implementation="triton"),
         r"model\.gdn2\.implementation='triton'"),
        ("gdn2_rank", config_lib.GDN2Config, dict(gate_rank=0), r"model\.gdn2\.gate_rank"),
        ("linear_conv", config_lib.LinearAttentionConfig, dict(conv_width=-1),
         r"model\.linear_attn\.conv_width must be >= 0"),
        ("lightning_gqa", config_lib.LightningConfig, dict(num_heads=4, num_kv_heads=3),
         r"model\.lightning\.num_heads=4 must be a multiple"),
        ("lightning_scale", config_lib.LightningConfig, dict(scale="2"),
         r"model\.lightning\.scale='2'"),
    )
    def test_invalid_values_name_the_option(self, cls, kwargs, message):
        with self.assertRaisesRegex(ValueError, message):
            cls(**kwargs)

    def test_model_config_checks_lightning_head_dim(self):
        with self.assertRaisesRegex(ValueError, r"model\.lightning\.num_heads=3"):
            config_lib.ModelConfig(d_model=32, layer_pattern=("lightning",),
                                   lightning=config_lib.LightningConfig(num_heads=3,
                                                                        num_kv_heads=3))
        with self.assertRaisesRegex(ValueError, "RoPE needs an even head dimension"):
            config_lib.ModelConfig(d_model=36, layer_pattern=("lightning",),
                                   lightning=config_lib.LightningConfig(head_dim=9))
        cfg = config_lib.ModelConfig(d_model=36, layer_pattern=("lightning", "attn_nope"),
                                     attention=config_lib.AttentionConfig(num_heads=4,
                                                                          num_kv_heads=4),
                                     lightning=config_lib.LightningConfig(head_dim=9,
                                                                          rope_theta=None))
        self.assertEqual(cfg.lightning_head_dim, 9)

    def test_every_mixer_has_a_config_section(self):
        cfg = config_lib.ModelConfig(layer_pattern=config_lib.MIXER_NAMES)
        for section in ("gdn", "deltanet", "kda", "gdn2", "lightning", "linear_attn"):
            self.assertTrue(dataclasses.is_dataclass(getattr(cfg, section)), section)


if __name__ == "__main__":
    absltest.main()
