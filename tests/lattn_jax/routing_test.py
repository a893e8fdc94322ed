"""Cross-layer routing (CLER, CLER-H, CLVR, controls, AttnRes) and layer-pattern stacks.

The reference is an independent fp64 NumPy forward of a 2-layer routed stack written from the
spec's equations (spec §2.1, §2.2, §4.1-4.4), not from the module code.
"""

import zlib

import numpy as np
import jax
import jax.numpy as jnp
import pytest
from absl.testing import absltest, parameterized
from flax import nnx

from lattn_jax import config as config_lib
from lattn_jax import model as model_lib
from lattn_jax import routing
from tests import tolerances

VOCAB, D, F = 50, 32, 40


def make_config(pattern, mode="none", *, rank=None, attn_res=False, gamma_mode="channel",
                normalize_residual=False, normalize_input=False):
    return config_lib.ModelConfig(
        vocab_size=VOCAB, d_model=D, layer_pattern=tuple(pattern), mlp_hidden=F,
        attention=config_lib.AttentionConfig(num_heads=4, num_kv_heads=2, output_gate=True),
        gdn=config_lib.GatedDeltaNetConfig(num_k_heads=2, num_v_heads=4, head_k_dim=8,
                                           head_v_dim=8, chunk_size=4),
        deltanet=config_lib.DeltaNetConfig(num_k_heads=2, num_v_heads=2, head_k_dim=8,
                                           head_v_dim=16, chunk_size=4),
        routing=config_lib.RoutingConfig(mode=mode, rank=rank, attn_res=attn_res,
                                         gamma_mode=gamma_mode,
                                         normalize_residual=normalize_residual,
                                         normalize_input=normalize_input))


def _normal(seed, shape, scale=1.0):
    """fp32 normal draws of standard deviation ``scale`` from numpy's generator (scaled in
    numpy): each jax.random call or eager op on a new shape compiles a program."""
    return jnp.asarray(scale * np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def _tokens(seed, shape):
    """int32 token ids uniform in ``[0, VOCAB)`` from numpy's generator."""
    return jnp.asarray(np.random.default_rng(seed).integers(0, VOCAB, shape), jnp.int32)


def randomise(model, names, seed):
    """Replaces every parameter whose path contains one of ``names`` with random values."""
    state = nnx.state(model, nnx.Param)

    def draw(path, leaf):
        path = "/".join(str(getattr(k, "key", k)) for k in path)
        if not any(n in path for n in names):
            return leaf
        return _normal((seed, zlib.crc32(path.encode())), leaf.shape, scale=0.3)

    pure = jax.tree_util.tree_map_with_path(draw, nnx.to_pure_dict(state))
    nnx.replace_by_pure_dict(state, pure)
    nnx.update(model, state)


# ---------------------------------------------------------------------------------------------
# Independent fp64 NumPy reference.
# ---------------------------------------------------------------------------------------------


def np_silu(x):
    return x / (1.0 + np.exp(-x))


def np_sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def np_rms(x, w=1.0, eps=1e-5):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def np_l2(x):
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + 1e-6)


def np_conv(x, kernel):
    w = kernel.shape[0]
    xp = np.concatenate([np.zeros((x.shape[0], w - 1, x.shape[2])), x], axis=1)
    return sum(kernel[i] * xp[:, i:i + x.shape[1]] for i in range(w))


def np_delta_rule(q, k, v, beta, log_decay, scale):
    """Token-serial (gated) delta rule per value head; returns ``(o, u)`` (spec §2.1, §4.1).

    ``u_t = beta_t (v_t - alpha_t S_{t-1}^T k_t)``, ``S_t = alpha_t S_{t-1} + k_t u_t^T``,
    ``o_t = scale S_t^T q_t``.
    """
    b, t, h, dk = k.shape
    s = np.zeros((b, h, dk, v.shape[-1]))
    o, u = np.zeros_like(v), np.zeros_like(v)
    for i in range(t):
        alpha = np.exp(log_decay[:, i])[..., None, None]  # [B, H, 1, 1]
        u[:, i] = beta[:, i][..., None] * (
            v[:, i] - np.einsum("bhk,bhkv->bhv", k[:, i], alpha * s))
        s = alpha * s + k[:, i][..., :, None] * u[:, i][..., None, :]
        o[:, i] = scale * np.einsum("bhk,bhkv->bhv", q[:, i], s)
    return o, u


def np_mixer(p, x, name, cfg, r_src):
    """GDN / DeltaNet mixer with optional value-space injection; returns ``(y, r, v)``."""
    mc = getattr(cfg, name)
    b, t, _ = x.shape
    hk, h, dk, dv = mc.num_k_heads, mc.num_v_heads, mc.head_k_dim, mc.head_v_dim
    qk, vd = hk * dk, h * dv
    proj = x @ p["in_proj"]["kernel"]
    qkv = np_silu(np_conv(proj[..., :2 * qk + vd], p["conv"]["kernel"]))
    q = np.repeat(np_l2(qkv[..., :qk].reshape(b, t, hk, dk)), h // hk, axis=2)
    k = np.repeat(np_l2(qkv[..., qk:2 * qk].reshape(b, t, hk, dk)), h // hk, axis=2)
    v = qkv[..., 2 * qk:].reshape(b, t, h, dv)
    rest = proj[..., 2 * qk + vd:]
    if name == "gdn":
        z, beta_logit, a = rest[..., :vd], rest[..., vd:vd + h], rest[..., vd + h:]
        log_decay = -np.exp(p["A_log"]) * np.logaddexp(0.0, a + p["dt_bias"])
    else:
        z, beta_logit, log_decay = None, rest, np.zeros((b, t, h))
    target = v
    if r_src is not None:
        r_in = r_src
        if cfg.routing.normalize_residual:
            r_in = r_src / np.sqrt(np.mean(r_src ** 2, -1, keepdims=True) + 1e-6)
        gamma = p["gamma"]
        target = v + (gamma[:, None] if gamma.ndim == 1 else gamma) * r_in
    o, u = np_delta_rule(q, k, target, np_sigmoid(beta_logit), log_decay, dk ** -0.5)
    o = np_rms(o, p["o_norm"]["scale"], mc.norm_eps)
    if z is not None:
        o = o * np_silu(z.reshape(b, t, h, dv))
    return o.reshape(b, t, vd) @ p["out_proj"]["kernel"], u, v


def np_route(p, mode, r, v, h_out, normalize_input):
    """``eps = P s`` for the residual-stream modes (spec §4.3)."""
    b, t = h_out.shape[:2]
    if mode == "cler_h":
        s = r
    elif mode == "clvr":
        s = v
    elif mode == "error_value":
        s = np.concatenate([r, v], -1)
    elif mode == "surprise_gate":
        surprise = np.linalg.norm(r, axis=-1, keepdims=True) / (
            np.linalg.norm(v, axis=-1, keepdims=True) + 1e-6)
        s = v * np_sigmoid(p["surprise_scale"] * surprise + p["surprise_bias"])
    else:
        s = h_out
    s = s.reshape(b, t, -1)
    if normalize_input:
        s = s / np.sqrt(np.mean(s * s, -1, keepdims=True) + 1e-6)
    if "route_proj" in p:
        return s @ p["route_proj"]["kernel"]
    return s @ p["route_down"]["kernel"] @ p["route_up"]["kernel"]


def np_combine(w, values):
    """AttnRes: ``sum_i softmax_i(w . V_i / rms(V_i)) V_i`` (spec §4.4)."""
    vals = np.stack(values)  # [N, B, T, D]
    logits = np.einsum("nbtd,d->nbt", vals, w) / np.sqrt(np.mean(vals ** 2, -1) + 1e-6)
    e = np.exp(logits - logits.max(0))
    return np.einsum("nbt,nbtd->btd", e / e.sum(0), vals)


def np_forward(params, cfg, tokens, route=True):
    """The whole routed model for a stack of GDN/DeltaNet layers, fp64 logits."""
    mode = cfg.routing.mode if route else "none"
    h = params["embed"][tokens]
    contributions, side = [h], None
    for i, name in enumerate(cfg.layer_pattern):
        p = params["blocks"][i]
        x = h
        if cfg.routing.attn_res and i > 0:
            x = np_combine(p["attn_res_mixer_query"], contributions)
        y, r, v = np_mixer(p["mixer"], np_rms(x, p["mixer_norm"]["scale"]), name, cfg,
                           side if mode == "cler" else None)
        if cfg.routing.attn_res:
            contributions.append(y)
            x = np_combine(p["attn_res_mlp_query"], contributions)
        else:
            x = h + y
        gate, up = np.split(np_rms(x, p["mlp_norm"]["scale"]) @ p["mlp"]["fc1"]["kernel"], 2, -1)
        c = (np_silu(gate) * up) @ p["mlp"]["fc2"]["kernel"]
        h_out = x + c
        if mode in config_lib.HIDDEN_ROUTING_MODES:
            eps = np_route(p["route"], mode, r, v, h_out, cfg.routing.normalize_input)
            c, h_out = c + eps, h_out + eps
        contributions.append(c)
        h = h_out
        side = r if cfg.routing.mode == "cler" else side
    if cfg.routing.attn_res:
        h = np_combine(params["attn_res_final_query"], contributions)
    return np_rms(h, params["final_norm"]["scale"]) @ params["head"]["kernel"]


CASES = [
    ("gdn_cler", "gdn", dict(mode="cler")),
    ("gdn_cler_head_normalized", "gdn", dict(mode="cler", gamma_mode="head",
                                             normalize_residual=True)),
    ("deltanet_cler_scalar", "deltanet", dict(mode="cler", gamma_mode="scalar")),
    ("gdn_cler_h", "gdn", dict(mode="cler_h")),
    ("deltanet_cler_h", "deltanet", dict(mode="cler_h")),
    ("gdn_clvr", "gdn", dict(mode="clvr")),
    ("deltanet_clvr_rank3", "deltanet", dict(mode="clvr", rank=3)),
    ("gdn_clvr_normalized_input", "gdn", dict(mode="clvr", normalize_input=True)),
    ("gdn_error_value", "gdn", dict(mode="error_value")),
    ("gdn_surprise_gate", "gdn", dict(mode="surprise_gate")),
    ("deltanet_hidden_state_rank5", "deltanet", dict(mode="hidden_state", rank=5)),
    ("gdn_attn_res", "gdn", dict(attn_res=True)),
    ("gdn_clvr_attn_res", "gdn", dict(mode="clvr", attn_res=True)),
]

ROUTING_PARAM_NAMES = ("gamma", "route_proj", "route_down", "route_up", "surprise",
                       "attn_res")


class RoutingReferenceTest(parameterized.TestCase):

    @parameterized.named_parameters(*CASES)
    def test_two_layer_stack_matches_numpy(self, host, options):
        cfg = make_config((host, host), **options)
        model = model_lib.LanguageModel(cfg, rngs=nnx.Rngs(0))
        # Nonzero routing parameters, so that every route contributes.
        randomise(model, ROUTING_PARAM_NAMES, seed=7)
        params = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64),
                                        nnx.to_pure_dict(nnx.state(model, nnx.Param)))
        tokens = _tokens(3, (2, 11))
        for route in (True, False):
            got = model(tokens, route=route)
            want = np_forward(params, cfg, np.asarray(tokens), route=route)
            tolerances.assert_rel_err(got, want, tolerances.FWD[jnp.dtype(jnp.float32)][0],
                                      name=f"route={route}")
        if options.get("mode", "none") != "none":
            routed = np.asarray(model(tokens))
            plain = np.asarray(model(tokens, route=False))
            self.assertGreater(np.abs(routed - plain).max(), 1e-4)

    def test_gdn_error_is_decay_adjusted_and_beta_scaled(self):
        # Spec §4.1: r_t = beta_t (v_t - alpha_t S_{t-1}^T k_t); at t = 0 it is beta_0 v_0.
        cfg = make_config(("gdn",), "clvr")
        block = model_lib.Block("gdn", cfg, rngs=nnx.Rngs(0))
        x = _normal(1, (2, 9, D))
        _, signals = block.mix(x)
        p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64),
                                   nnx.to_pure_dict(nnx.state(block, nnx.Param)))
        _, r, v = np_mixer(p["mixer"], np_rms(np.asarray(x, np.float64),
                                              p["mixer_norm"]["scale"]), "gdn", cfg, None)
        np.testing.assert_allclose(signals.error, r, **tolerances.fwd_tol(jnp.float32))
        np.testing.assert_allclose(signals.value, v, **tolerances.fwd_tol(jnp.float32))


_ZERO_INIT_CASES = [
    (f"{host}_{mode}{'' if rank is None else f'_rank{rank}'}", host, mode, rank)
    for host in ("gdn", "deltanet")
    for mode, rank in (("cler", None), ("cler_h", None), ("clvr", None), ("clvr", 4),
                       ("error_value", None), ("surprise_gate", None), ("hidden_state", 6))]
# CI runs every mode on the GDN host and one on DeltaNet; the other DeltaNet hosts (same
# routing code, ~10-30 s each on 2 cores) run with -m slow.
_ZERO_INIT_CI = [c for c in _ZERO_INIT_CASES if c[1] == "gdn" or c[0] == "deltanet_clvr"]


class _ZeroInitCheck:

    def _check_equals_host(self, host, mode, rank):
        pattern = (host, host, "attn", host)
        routed = model_lib.LanguageModel(make_config(pattern, mode, rank=rank),
                                         rngs=nnx.Rngs(0))
        plain = model_lib.LanguageModel(make_config(pattern), rngs=nnx.Rngs(1))
        # The host gets the routed model's host parameters.
        host_params = nnx.to_pure_dict(nnx.state(plain, nnx.Param))
        routed_params = nnx.to_pure_dict(nnx.state(routed, nnx.Param))

        def copy(dst, src):
            for key in dst:
                dst[key] = copy(dst[key], src[key]) if isinstance(dst[key], dict) else src[key]
            return dst

        state = nnx.state(plain, nnx.Param)
        nnx.replace_by_pure_dict(state, copy(host_params, routed_params))
        nnx.update(plain, state)
        tokens = _tokens(5, (2, 10))
        np.testing.assert_array_equal(routed(tokens), plain(tokens))

        cotangent = _normal(6, (2, 10, VOCAB))
        grads = nnx.grad(lambda m: jnp.sum(m(tokens) * cotangent))(routed)
        routing_layers = [i for i, name in enumerate(pattern) if name == host]
        for n, i in enumerate(routing_layers):
            block = grads.blocks[i]
            if mode == "cler":
                g = block.mixer.gamma[...]
                if n == 0:  # the first routing layer receives nothing (spec §4.2)
                    np.testing.assert_array_equal(g, np.zeros_like(g))
                    continue
            elif rank is None:
                g = block.route.route_proj.kernel[...]
            else:
                g = block.route.route_up.kernel[...]
            self.assertGreater(float(jnp.abs(g).max()), 1e-7, f"layer {i}")


class ZeroInitTest(_ZeroInitCheck, parameterized.TestCase):

    @parameterized.named_parameters(*_ZERO_INIT_CI)
    def test_equals_host_exactly_yet_routing_params_get_gradients(self, host, mode, rank):
        self._check_equals_host(host, mode, rank)

    def test_softmax_layers_carry_the_side_channel(self):
        # Spec §4.2 "latest" with carry-through: layer 2 receives layer 0's error across the
        # softmax layer 1.
        cfg = make_config(("gdn", "attn", "gdn"), "cler")
        model = model_lib.LanguageModel(cfg, rngs=nnx.Rngs(0))
        randomise(model, ("gamma",), seed=2)
        tokens = _tokens(4, (2, 8))
        h = jnp.take(model.embed[...], tokens, axis=0)
        b0, b1, b2 = model.blocks
        h, side0 = b0(h, return_side=True)
        h, side1 = b1(h, side=side0, return_side=True)
        self.assertIs(side1, side0)
        h = b2(h, side=side0)
        want = model.head(model.final_norm(h))
        np.testing.assert_allclose(model(tokens), want, **tolerances.fwd_tol(jnp.float32))

    def test_attn_res_with_zero_queries_is_the_uniform_mean(self):
        # Spec §10 item 15: zero pseudo-queries average the contributions.
        values = [_normal(i, (2, 3, D)) for i in range(4)]
        got = routing.attn_res_combine(jnp.zeros((D,)), values)
        np.testing.assert_allclose(got, np.mean(np.stack(values), 0),
                                   **tolerances.fwd_tol(jnp.float32))

    def test_param_counts_of_routing(self):
        # Spec §3: per routing layer 512 x 1024 (full rank) or 64 (512 + 1024) (rank 64);
        # AttnRes 2 L x d. Here H V = 32, d = 32.
        pattern = ("gdn", "gdn", "attn")
        base = model_lib.count_params(model_lib.LanguageModel(make_config(pattern),
                                                              rngs=nnx.Rngs(0)))
        for options, extra in ((dict(mode="clvr"), 2 * 32 * D),
                               (dict(mode="cler_h", rank=3), 2 * 3 * (32 + D)),
                               (dict(mode="error_value"), 2 * 64 * D),
                               (dict(mode="cler"), 2 * 4 * 8),
                               (dict(attn_res=True), 2 * 3 * D)):
            cfg = make_config(pattern, **options)
            n = model_lib.count_params(model_lib.LanguageModel(cfg, rngs=nnx.Rngs(0)))
            self.assertEqual(n - base, extra, options)


@pytest.mark.slow
class ZeroInitMoreDeltaNetTest(_ZeroInitCheck, parameterized.TestCase):

    @parameterized.named_parameters(*[c for c in _ZERO_INIT_CASES if c not in _ZERO_INIT_CI])
    def test_equals_host_exactly_yet_routing_params_get_gradients(self, host, mode, rank):
        self._check_equals_host(host, mode, rank)


class ConfigTest(parameterized.TestCase):

    def test_stack_patterns_follow_the_spec(self):
        # Spec §3: freq 3 => softmax at (i + 1) % 3 == 0.
        for layers, softmax in ((20, [2, 5, 8, 11, 14, 17]), (22, [2, 5, 8, 11, 14, 17, 20]),
                                (24, list(range(2, 24, 3)))):
            pattern = config_lib.stack_pattern("hybrid", layers, "gdn")
            self.assertEqual([i for i, n in enumerate(pattern) if n == "attn"], softmax)
        self.assertEqual(config_lib.stack_pattern("hybrid", 20, "gdn")[-1], "gdn")
        self.assertEqual(config_lib.stack_pattern("pure", 3, "kda"), ("kda",) * 3)
        self.assertEqual(config_lib.stack_pattern("dense", 2), ("attn", "attn"))
        self.assertEqual(config_lib.stack_pattern("hybrid", 8, "gdn", attention_freq=4),
                         ("gdn",) * 3 + ("attn",) + ("gdn",) * 3 + ("attn",))

    @parameterized.named_parameters(
        ("bad_stack", lambda: config_lib.stack_pattern("mixed", 4, "gdn"), r"stack='mixed'"),
        ("no_linear", lambda: config_lib.stack_pattern("pure", 4), r"linear mixer=None"),
        ("bad_mode", lambda: config_lib.RoutingConfig(mode="clerv"),
         r"model\.routing\.mode='clerv'"),
        ("bad_gamma", lambda: config_lib.RoutingConfig(mode="cler", gamma_mode="row"),
         r"model\.routing\.gamma_mode='row'"),
        ("rank_with_cler", lambda: config_lib.RoutingConfig(mode="cler", rank=4),
         r"model\.routing\.rank applies"),
        ("normalize_input_with_gate",
         lambda: config_lib.RoutingConfig(mode="surprise_gate", normalize_input=True),
         r"model\.routing\.normalize_input applies"),
        ("kda_host", lambda: make_config(("kda", "attn"), "clvr"),
         r"model\.routing\.mode='clvr' needs every linear layer.*layer_pattern\[0\]='kda'"),
        ("no_routing_layer", lambda: make_config(("attn",), "cler_h"),
         r"needs at least one gdn or deltanet layer"),
        ("cler_mixed_value_shapes", lambda: make_config(("gdn", "deltanet"), "cler"),
         # each pair named with its section (sorted pairs put deltanet's (2, 16) first)
         r"need equal num_v_heads and head_v_dim, got model\.gdn\.num_v_heads=4, "
         r"model\.gdn\.head_v_dim=8, model\.deltanet\.num_v_heads=2, "
         r"model\.deltanet\.head_v_dim=16$"),
        ("remat_attn_res", lambda: config_lib.ModelConfig(
            layer_pattern=("gdn",), remat=True,
            routing=config_lib.RoutingConfig(attn_res=True)), r"model\.remat"),
    )
    def test_bad_config_names_the_option(self, build, message):
        with self.assertRaisesRegex(config_lib.ConfigError, message):
            build()

    def test_route_in_without_gamma_raises(self):
        block = model_lib.Block("gdn", make_config(("gdn",), "clvr"), rngs=nnx.Rngs(0))
        x = _normal(0, (1, 4, D))
        r = _normal(1, (1, 4, 4, 8))
        with self.assertRaisesRegex(ValueError, r"no CLER gain"):
            block.mixer(x, route_in=r)


if __name__ == "__main__":
    absltest.main()
