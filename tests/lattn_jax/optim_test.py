"""Optimizers: the Muon/AdamW partition, Newton-Schulz, NorMuon, both groups' steps, training.

Numpy references are written independently of ``lattn_jax.optim``: the Newton-Schulz output is
computed from an SVD (the iteration maps each singular value through a fixed odd polynomial and
keeps the singular vectors), and the NorMuon step follows the authors' PyTorch code (EO
``AdaptiveMuon.step``) on the transposed ``[out, in]`` matrix.
"""

import os
import tempfile
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from absl.testing import absltest, parameterized
from flax import nnx

from lattn_jax import checkpoint as checkpoint_lib
from lattn_jax import config as config_lib
from lattn_jax import data as data_lib
from lattn_jax import mixers
from lattn_jax import model as model_lib
from lattn_jax import optim
from lattn_jax import train
from tests.lattn_jax import train_test

# Spec §5.1 step 3 (EO "quintic"), typed out again rather than imported.
QUINTIC = [(4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
           (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012)]


def ns_polynomial(x):
    """The scalar map of 5 quintic Newton-Schulz steps, float64."""
    x = np.asarray(x, np.float64)
    for a, b, c in QUINTIC:
        x = a * x + b * x ** 3 + c * x ** 5
    return x


def np_newton_schulz(g):
    """Reference NS output ``U p(S / ||G||_F) V^T`` from numpy's SVD (float64)."""
    g = np.asarray(g, np.float64)
    u, s, vt = np.linalg.svd(g, full_matrices=False)
    return (u * ns_polynomial(s / np.linalg.norm(g))) @ vt


def np_normuon_run(w_flax, grads_flax, *, lr, wd, mu=0.95, beta2=0.95, eps=1e-8,
                   normuon=True):
    """EO ``AdaptiveMuon(moment2_method="normuon", scale_mode="spectral", nesterov=True)``
    steps on the PyTorch ``[out, in]`` weight (the transpose of the Flax kernel)."""
    p = np.asarray(w_flax, np.float64).T  # [out, in]
    out_dim, in_dim = p.shape
    m = np.zeros_like(p)
    avg_dim = -1 if out_dim >= in_dim else -2
    v = np.zeros((out_dim, 1) if avg_dim == -1 else (1, in_dim))
    for g in grads_flax:
        g = np.asarray(g, np.float64).T
        p = p * (1 - lr * wd)                       # decoupled weight decay first
        m = m + (1 - mu) * (g - m)                  # exp_avg.lerp_(grad, 1 - momentum)
        g_nest = g + mu * (m - g)                   # grad.lerp(exp_avg, momentum)
        o = np_newton_schulz(g_nest) * np.sqrt(max(out_dim, in_dim))
        if normuon:
            v = v + (1 - beta2) * (np.mean(o ** 2, axis=avg_dim, keepdims=True) - v)
            o = o / np.sqrt(np.maximum(v, eps))
        p = p - lr * o
    return p.T


def np_adamw_run(w, grads, *, lr, wd, b1=0.9, b2=0.95, eps=1e-8):
    """Bias-corrected AdamW with decoupled decay ``lr * wd * p`` (constant LR)."""
    p = np.asarray(w, np.float64)
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    for t, g in enumerate(grads, start=1):
        g = np.asarray(g, np.float64)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        mhat, vhat = m / (1 - b1 ** t), v / (1 - b2 ** t)
        p = p - lr * (mhat / (np.sqrt(vhat) + eps) + wd * p)
    return p


# A hand-made tree with every kind of leaf; shapes are Flax [in, out].
SHAPES = {
    "blocks": {
        "0": {
            "mlp": {"fc1": {"kernel": (96, 256)}, "fc2": {"kernel": (256, 96)}},
            "mixer": {"out_proj": {"kernel": (64, 64)}, "A_log": (4,),
                      "conv": {"kernel": (4, 64)}},
        },
    },
    "embed": (50, 16),
    "final_norm": {"scale": (16,)},
}
MUON_PATHS = ("blocks/0/mlp/fc1/kernel", "blocks/0/mlp/fc2/kernel",
              "blocks/0/mixer/out_proj/kernel")


def random_tree(seed, scale=1.0):
    leaves, treedef = jax.tree_util.tree_flatten(SHAPES, is_leaf=lambda x: isinstance(x, tuple))
    # numpy's generator, not jax.random: each jax.random call (and each eager op on the draws)
    # on a new shape compiles a program.
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_unflatten(
        treedef, [jnp.asarray(scale * rng.standard_normal(s), jnp.float32) for s in leaves])


def get(tree, path):
    for key in path.split("/"):
        tree = tree[key]
    return tree


def flat_with_names(tree):
    return {"/".join(str(optim._key_name(k)) for k in path): leaf
            for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def muon_cfg(**kw):
    base = dict(name="muon", learning_rate=0.02, warmup_steps=0, schedule="wsd",
                grad_clip=0.0, muon_ns_dtype="float32")
    base.update(kw)
    return config_lib.OptimConfig(**base)


def run_steps_with_state(cfg, params, grads_list, total_steps=100):
    tx = optim.make_optimizer(cfg, total_steps)
    state = tx.init(params)
    update = jax.jit(tx.update)
    for grads in grads_list:
        updates, state = update(grads, state, params)
        params = optax.apply_updates(params, updates)
    return params, state


def run_steps(cfg, params, grads_list, total_steps=100):
    return run_steps_with_state(cfg, params, grads_list, total_steps)[0]


# -------------------------------------------------------------------------------------------
# Partition
# -------------------------------------------------------------------------------------------

# The intended group of every parameter name the model has today, keyed by the last two path
# components (module, leaf). A leaf not in this table fails the test, so new parameters must be
# classified here on purpose.
_MUON_MODULES = {"qkv_proj", "q_proj", "k_proj", "v_proj", "z_proj", "out_proj", "in_proj",
                 "fc1", "fc2", "bottleneck_proj", "f_out_proj", "g_out_proj", "f_down", "f_up",
                 "g_down", "g_up", "beta_proj", "g_proj", "f_proj", "gate_proj", "o_proj",
                 "route_proj", "route_down", "route_up"}


def intended_label(names, shape):
    module, leaf = (names[-2] if len(names) > 1 else ""), names[-1]
    if leaf == "embed" or module == "head":
        return "adamw"
    if leaf == "scale" and module.endswith("norm"):
        return "adamw"
    if leaf in ("A_log", "dt_bias") or leaf.endswith("_bias") or module == "conv":
        return "adamw"
    if leaf == "kernel" and module in _MUON_MODULES:
        return "muon"
    if leaf.startswith("attn_res_") or leaf.startswith("surprise_"):
        return "adamw"
    if leaf == "gamma":  # spec §5.1: 0-D / [H] on AdamW, channel [H, V] on Muon
        return "muon" if len(shape) == 2 else "adamw"
    raise AssertionError(f"unclassified parameter {'/'.join(names)} {shape}: add it to the test")


def small_model_params(pattern, **kw):
    cfg = config_lib.ModelConfig(
        vocab_size=64, d_model=32, layer_pattern=pattern, mlp_hidden=48,
        attention=config_lib.AttentionConfig(num_heads=4, num_kv_heads=2, output_gate=True,
                                             qk_norm=True), **kw)
    abstract = nnx.eval_shape(lambda: model_lib.LanguageModel(cfg, rngs=nnx.Rngs(0)))
    return nnx.to_pure_dict(nnx.state(abstract, nnx.Param))


class ParamLabelsTest(parameterized.TestCase):

    def check_all_leaves(self, params):
        labels = optim.param_labels(params)
        self.assertEqual(jax.tree_util.tree_structure(labels),
                         jax.tree_util.tree_structure(params))
        names = flat_with_names(params)
        got = flat_with_names(labels)
        for path, leaf in names.items():
            self.assertIn(got[path], ("muon", "adamw"), path)
            self.assertEqual(got[path], intended_label(path.split("/"), leaf.shape),
                             f"{path} {leaf.shape}")
            if got[path] == "muon":
                self.assertEqual(len(leaf.shape), 2, path)
        return got

    @parameterized.named_parameters(*[(name, name) for name in mixers.REGISTRY])
    def test_every_leaf_gets_the_intended_label(self, mixer):
        got = self.check_all_leaves(small_model_params((mixer,)))
        self.assertEqual(got["embed"], "adamw")
        self.assertEqual(got["head/kernel"], "adamw")
        self.assertEqual(got["final_norm/scale"], "adamw")
        self.assertEqual(got["blocks/0/mixer_norm/scale"], "adamw")
        self.assertEqual(got["blocks/0/mlp/fc1/kernel"], "muon")
        self.assertEqual(got["blocks/0/mlp/fc2/kernel"], "muon")
        self.assertEqual(got["blocks/0/mixer/out_proj/kernel"], "muon")
        self.assertEqual(sorted(set(got.values())), ["adamw", "muon"])

    def test_specific_mixer_paths(self):
        got = self.check_all_leaves(
            small_model_params(("gdn", "attn", "kda", "gdn2", "lightning")))
        expected = {
            "blocks/0/mixer/A_log": "adamw", "blocks/0/mixer/dt_bias": "adamw",
            "blocks/0/mixer/conv/kernel": "adamw", "blocks/0/mixer/in_proj/kernel": "muon",
            "blocks/0/mixer/o_norm/scale": "adamw",
            "blocks/1/mixer/qkv_proj/kernel": "muon", "blocks/1/mixer/q_norm/scale": "adamw",
            "blocks/2/mixer/g_out_bias": "adamw", "blocks/2/mixer/f_out_proj/kernel": "muon",
            "blocks/3/mixer/g_up_bias": "adamw", "blocks/3/mixer/f_down/kernel": "muon",
            "blocks/4/mixer/q_proj/kernel": "muon", "blocks/4/mixer/k_proj/kernel": "muon",
            "blocks/4/mixer/v_proj/kernel": "muon",
        }
        for path, label in expected.items():
            self.assertEqual(got[path], label, path)

    @parameterized.named_parameters(
        ("cler_channel_gamma", dict(mode="cler", gamma_mode="channel")),
        ("cler_head_gamma", dict(mode="cler", gamma_mode="head")),
        ("cler_scalar_gamma", dict(mode="cler", gamma_mode="scalar")),
        ("cler_h_low_rank", dict(mode="cler_h", rank=8)),
        ("surprise_gate", dict(mode="surprise_gate")),
        ("clvr_attn_res", dict(mode="clvr", attn_res=True)),
    )
    def test_routing_parameters(self, routing):
        # Two GDN hosts: CLER routes r [H, V] between layers, so the hosts' value heads match.
        params = small_model_params(("gdn", "attn", "gdn"),
                                    routing=config_lib.RoutingConfig(**routing))
        self.check_all_leaves(params)

    def test_future_modules_by_path_and_rank(self):
        params = {
            "blocks": {"0": {
                "route": {"route_proj": {"kernel": jnp.ones((512, 32))}},
                "mixer": {"gamma": jnp.ones(()), "head_gamma": jnp.ones((8,)),
                          "channel_gamma": jnp.ones((8, 64)), "new_bias": jnp.ones((2, 3)),
                          "short_conv": {"kernel": jnp.ones((4, 128))},
                          "einsum_kernel": jnp.ones((32, 4, 8)),
                          "gate_norm": {"scale": jnp.ones((4, 8))}},
            }},
            "tok_embedding": jnp.ones((10, 4)), "lm_head": {"kernel": jnp.ones((4, 10))},
        }
        got = flat_with_names(optim.param_labels(params))
        self.assertEqual(got, {
            "blocks/0/route/route_proj/kernel": "muon",
            "blocks/0/mixer/gamma": "adamw",
            "blocks/0/mixer/head_gamma": "adamw",
            "blocks/0/mixer/channel_gamma": "muon",  # the authors' rank rule (spec §5.1)
            "blocks/0/mixer/new_bias": "adamw",
            "blocks/0/mixer/short_conv/kernel": "adamw",
            "blocks/0/mixer/einsum_kernel": "adamw",
            "blocks/0/mixer/gate_norm/scale": "adamw",
            "tok_embedding": "adamw",
            "lm_head/kernel": "adamw",
        })

    def test_labels_of_abstract_params(self):
        params = {"w": jax.ShapeDtypeStruct((3, 4), jnp.float32),
                  "b_bias": jax.ShapeDtypeStruct((4,), jnp.float32)}
        self.assertEqual(optim.param_labels(params), {"w": "muon", "b_bias": "adamw"})


# -------------------------------------------------------------------------------------------
# Newton-Schulz and the Muon scale
# -------------------------------------------------------------------------------------------


class NewtonSchulzTest(parameterized.TestCase):

    @parameterized.named_parameters(
        ("wide_96x256", (96, 256)), ("tall_256x96", (256, 96)), ("square_64", (64, 64)))
    def test_fp32_matches_svd_reference_and_band(self, shape):
        g = np.asarray(jax.random.normal(jax.random.key(0), shape, jnp.float32))
        got = np.asarray(optim.newton_schulz(
            jnp.asarray(g), optim.ns_coefficients("quintic", 5), compute_dtype=jnp.float32))
        want = np_newton_schulz(g)
        np.testing.assert_allclose(got, want, atol=2e-5, rtol=0)

        # Band: each singular value s of G goes to p(s / ||G||_F); over the range of this
        # matrix's normalised singular values p stays within [lo, hi] (about [0.98, 1.15]),
        # which lies inside the commonly quoted quintic band [0.68, 1.2].
        s_in = np.linalg.svd(g, compute_uv=False) / np.linalg.norm(g)
        grid = np.linspace(s_in.min(), s_in.max(), 100_001)
        lo, hi = ns_polynomial(grid).min(), ns_polynomial(grid).max()
        self.assertGreater(lo, 0.68)
        self.assertLess(hi, 1.2)
        s_out = np.linalg.svd(got, compute_uv=False)
        self.assertGreaterEqual(s_out.min(), lo - 1e-4)
        self.assertLessEqual(s_out.max(), hi + 1e-4)

        # Distance to the exact polar factor U V^T is at most max |p - 1|.
        u, _, vt = np.linalg.svd(g.astype(np.float64), full_matrices=False)
        self.assertLessEqual(np.linalg.norm(got - u @ vt, 2), max(1 - lo, hi - 1) + 1e-4)

    def test_bf16_iterate_stays_near_the_fp32_result(self):
        g = jnp.asarray(np.random.default_rng(1).standard_normal((96, 256)), jnp.float32)
        coeffs = optim.ns_coefficients("quintic", 5)
        got = optim.newton_schulz(g, coeffs, compute_dtype=jnp.bfloat16)
        self.assertEqual(got.dtype, jnp.float32)
        want = np_newton_schulz(np.asarray(g))
        # bf16 has 8 mantissa bits: ~0.4% relative per rounding, a few roundings per step.
        rel = np.linalg.norm(np.asarray(got) - want) / np.linalg.norm(want)
        self.assertLess(rel, 3e-2)
        s_out = np.linalg.svd(np.asarray(got), compute_uv=False)
        self.assertGreater(s_out.min(), 0.68)
        self.assertLess(s_out.max(), 1.2)

    def test_agrees_with_optax_contrib_newton_schulz(self):
        optax_ns = getattr(optax.contrib, "_muon", None)
        if optax_ns is None or not hasattr(optax_ns, "orthogonalize_via_newton_schulz"):
            self.skipTest("optax.contrib has no orthogonalize_via_newton_schulz")
        g = jnp.asarray(np.random.default_rng(2).standard_normal((96, 256)), jnp.float32)
        ours = optim.newton_schulz(g, optim.ns_coefficients("quintic", 5),
                                   compute_dtype=jnp.float32)
        theirs = optax_ns.orthogonalize_via_newton_schulz(
            g, jnp.asarray(QUINTIC, jnp.float32), ns_steps=5, eps=1e-7)
        np.testing.assert_allclose(ours, theirs, atol=2e-5, rtol=0)

    def test_batched_and_grouped_match_each_matrix(self):
        # A batch [3, m, n] iterates each matrix on its own (its own Frobenius norm: the three
        # differ in scale by 100x); orthogonalize stacks equal shapes and keeps others apart.
        coeffs = optim.ns_coefficients("quintic", 5)
        rng = np.random.default_rng(3)
        mats = [jnp.asarray(rng.standard_normal((48, 80)) * 10.0 ** (i - 1), jnp.float32)
                for i in range(3)]
        got = optim.newton_schulz(jnp.stack(mats), coeffs, compute_dtype=jnp.float32)
        for i, m in enumerate(mats):
            np.testing.assert_allclose(got[i], np_newton_schulz(np.asarray(m)), atol=2e-5,
                                       rtol=0, err_msg=f"matrix {i}")
        updates = {"a": mats[0],
                   "b": {"c": mats[1],
                         "d": jnp.asarray(rng.standard_normal((80, 48)), jnp.float32),
                         "e": mats[2]},
                   "f": jnp.asarray(rng.standard_normal((32, 32)), jnp.bfloat16)}
        tx = optim.orthogonalize(coeffs, compute_dtype=jnp.float32)
        out, _ = tx.update(updates, tx.init(updates))
        for path, u in jax.tree_util.tree_leaves_with_path(updates):
            o = dict(jax.tree_util.tree_leaves_with_path(out))[path]
            self.assertEqual((o.shape, o.dtype), (u.shape, u.dtype))
            want = np_newton_schulz(np.asarray(u, np.float32))
            np.testing.assert_allclose(np.asarray(o, np.float32), want,
                                       atol=2e-2 if u.dtype == jnp.bfloat16 else 2e-5, rtol=0,
                                       err_msg=jax.tree_util.keystr(path))
        with self.assertRaisesRegex(ValueError, r"Muon orthogonalises matrices; got an update "
                                                r"of shape \(2, 3, 4\)"):
            tx.update({"w": jnp.ones((2, 3, 4))}, tx.init({}))

    def test_coefficients(self):
        self.assertEqual(list(optim.ns_coefficients("quintic", 5)), QUINTIC)
        self.assertEqual(list(optim.ns_coefficients("quintic", 10)), QUINTIC * 2)
        self.assertEqual(optim.ns_coefficients("simple", 3), ((3.4445, -4.7750, 2.0315),) * 3)
        with self.assertRaisesRegex(ValueError, "multiple of 5"):
            optim.ns_coefficients("quintic", 4)
        with self.assertRaisesRegex(ValueError, "unknown Newton-Schulz"):
            optim.ns_coefficients("cubic", 5)
        with self.assertRaisesRegex(ValueError, "matrix"):
            optim.newton_schulz(jnp.ones((3,)), QUINTIC)

    def test_scale_factor_for_flax_in_out_layout(self):
        # Flax [in=96, out=256] is PyTorch [out=256, in=96].
        self.assertAlmostEqual(optim.muon_scale_factor((96, 256), "spectral"), 16.0)
        self.assertAlmostEqual(optim.muon_scale_factor((96, 256), "shape_scaling"),
                               np.sqrt(256 / 96))
        self.assertAlmostEqual(optim.muon_scale_factor((256, 96), "shape_scaling"), 1.0)
        self.assertAlmostEqual(optim.muon_scale_factor((256, 96), "unit_rms_norm"),
                               np.sqrt(96 / 256))
        with self.assertRaisesRegex(ValueError, "scale mode"):
            optim.muon_scale_factor((2, 2), "mup")

    def test_normuon_axis_follows_the_longer_axis(self):
        self.assertEqual(optim.normuon_axis((96, 256)), 0)   # out >= in: one value per output
        self.assertEqual(optim.normuon_axis((256, 96)), 1)   # in > out: one value per input
        self.assertEqual(optim.normuon_axis((64, 64)), 0)    # tie: like PyTorch dim=-1 (input)


# -------------------------------------------------------------------------------------------
# Full steps of make_optimizer(name="muon")
# -------------------------------------------------------------------------------------------


class MuonStepTest(parameterized.TestCase):

    @parameterized.named_parameters(
        ("spectral", "spectral", {"blocks/0/mlp/fc1/kernel": 16.0,
                                  "blocks/0/mlp/fc2/kernel": 16.0,
                                  "blocks/0/mixer/out_proj/kernel": 8.0}),
        ("shape_scaling", "shape_scaling", {"blocks/0/mlp/fc1/kernel": np.sqrt(256 / 96),
                                            "blocks/0/mlp/fc2/kernel": 1.0,
                                            "blocks/0/mixer/out_proj/kernel": 1.0}),
    )
    def test_plain_muon_step_is_scaled_orthogonal(self, mode, factors):
        params, grads = random_tree(0), random_tree(1)
        lr, wd = 0.02, 0.1
        cfg = muon_cfg(learning_rate=lr, weight_decay=wd, muon_variant="muon",
                       muon_scale_mode=mode)
        new = run_steps(cfg, params, [grads])
        for path, factor in factors.items():
            w, g = np.asarray(get(params, path)), np.asarray(get(grads, path))
            # First step: G~ = (1 - mu)(1 + mu) G, and NS ignores the scale of its input.
            want = w - lr * (factor * np_newton_schulz(g) + wd * w)
            np.testing.assert_allclose(get(new, path), want, atol=2e-5 * lr * factor, rtol=0,
                                       err_msg=path)

    def test_normuon_matches_numpy_reference_over_three_steps(self):
        params = random_tree(0)
        grads = [random_tree(s, scale=0.1) for s in (1, 2, 3)]
        lr, wd = 0.01, 0.1
        new = run_steps(muon_cfg(learning_rate=lr, weight_decay=wd), params, grads)
        for path in MUON_PATHS:
            want = np_normuon_run(get(params, path), [get(g, path) for g in grads], lr=lr, wd=wd)
            np.testing.assert_allclose(get(new, path), want, atol=3e-6, rtol=0, err_msg=path)

    def test_normuon_first_step_has_rms_one_over_sqrt_one_minus_beta2(self):
        params, grads = random_tree(0), random_tree(1)
        lr = 0.01
        new = run_steps(muon_cfg(learning_rate=lr, weight_decay=0.0), params, [grads])
        for path in MUON_PATHS:
            u = (np.asarray(get(params, path)) - np.asarray(get(new, path))) / lr
            ax = optim.normuon_axis(u.shape)
            np.testing.assert_allclose(np.sqrt(np.mean(u ** 2, axis=ax)), 1 / np.sqrt(0.05),
                                       rtol=1e-4, err_msg=path)

    def test_bf16_newton_schulz_step_is_close_to_fp32(self):
        params, grads = random_tree(0), random_tree(1)
        f32 = run_steps(muon_cfg(), params, [grads])
        bf16 = run_steps(muon_cfg(muon_ns_dtype="bfloat16"), params, [grads])
        for path in MUON_PATHS:
            d32 = np.asarray(get(f32, path)) - np.asarray(get(params, path))
            d16 = np.asarray(get(bf16, path)) - np.asarray(get(params, path))
            self.assertLess(np.linalg.norm(d16 - d32) / np.linalg.norm(d32), 3e-2, path)

    def test_adamw_group_gets_its_own_learning_rate(self):
        params = random_tree(0)
        grads = [random_tree(s) for s in (1, 2)]
        lr, adam_lr = 0.02, 3e-3
        new = run_steps(muon_cfg(learning_rate=lr, adamw_learning_rate=adam_lr), params, grads)
        for path in ("embed", "final_norm/scale", "blocks/0/mixer/A_log",
                     "blocks/0/mixer/conv/kernel"):
            want = np_adamw_run(get(params, path), [get(g, path) for g in grads], lr=adam_lr,
                                wd=0.0)
            np.testing.assert_allclose(get(new, path), want, rtol=1e-5, atol=1e-7,
                                       err_msg=path)

    def test_weight_decay_applies_where_intended(self):
        params, grads = random_tree(0), random_tree(1)
        lr, adam_lr = 0.02, 3e-3
        cfg = dict(learning_rate=lr, adamw_learning_rate=adam_lr)
        no_wd = flat_with_names(run_steps(muon_cfg(weight_decay=0.0, **cfg), params, [grads]))
        # Paper default: wd 0.1 on Muon matrices, none on the AdamW group.
        paper = flat_with_names(run_steps(muon_cfg(weight_decay=0.1, **cfg), params, [grads]))
        # With an AdamW-group decay: only its 2+-dim leaves (embeddings, conv) are decayed.
        adam_wd = flat_with_names(run_steps(
            muon_cfg(weight_decay=0.0, adamw_weight_decay=0.05, **cfg), params, [grads]))
        start = flat_with_names(params)
        for path, w in start.items():
            w = np.asarray(w)
            muon_leaf = path in MUON_PATHS
            want = -lr * 0.1 * w if muon_leaf else np.zeros_like(w)
            np.testing.assert_allclose(paper[path] - no_wd[path], want, atol=1e-6, err_msg=path)
            decayed = not muon_leaf and w.ndim >= 2
            want = -adam_lr * 0.05 * w if decayed else np.zeros_like(w)
            np.testing.assert_allclose(adam_wd[path] - no_wd[path], want, atol=1e-6,
                                       err_msg=path)

    def test_clipping_is_global_over_both_groups(self):
        params = random_tree(0)
        grads = random_tree(1, scale=3.0)
        norm = float(optax.tree.norm(grads))
        self.assertGreater(norm, 1.0)
        clipped = run_steps(muon_cfg(grad_clip=1.0), params, [grads])
        prescaled = run_steps(muon_cfg(grad_clip=0.0), params,
                              [jax.tree_util.tree_map(lambda g: g / norm, grads)])
        for path in ("embed", "final_norm/scale", "blocks/0/mlp/fc1/kernel"):
            np.testing.assert_allclose(get(clipped, path), get(prescaled, path), atol=1e-6,
                                       err_msg=path)

    def test_group_defaults_and_schedules(self):
        cfg = config_lib.OptimConfig(name="muon", learning_rate=3.6e-4, warmup_steps=10)
        adam = optim.adamw_group_settings(cfg)
        self.assertAlmostEqual(adam.learning_rate, 1.5e-3)
        self.assertEqual((adam.min_lr_ratio, adam.weight_decay), (1.0, 0.0))
        muon_lr = optim.learning_rate_schedule(cfg, 100)
        adam_lr = optim.learning_rate_schedule(cfg, 100, peak=adam.learning_rate,
                                               min_lr_ratio=adam.min_lr_ratio)
        # Same warm-up; the Muon group cools down to 0.1x, the AdamW group stays constant.
        np.testing.assert_allclose([float(adam_lr(s)) for s in (5, 50, 100)],
                                   [0.75e-3, 1.5e-3, 1.5e-3], rtol=1e-6)
        np.testing.assert_allclose([float(muon_lr(s)) for s in (5, 50, 100)],
                                   [1.8e-4, 3.6e-4, 3.6e-5], rtol=1e-6)
        tied = config_lib.OptimConfig(name="muon", adamw_learning_rate=1e-3,
                                      adamw_min_lr_ratio=0.1, adamw_weight_decay=0.01)
        self.assertEqual(tuple(optim.adamw_group_settings(tied)), (1e-3, 0.1, 0.01))

    def test_adamw_name_keeps_the_previous_optimizer(self):
        params, grads = random_tree(0), random_tree(1, scale=0.01)
        cfg = config_lib.OptimConfig(learning_rate=1e-3, warmup_steps=0, grad_clip=0.0)
        self.assertEqual(cfg.name, "adamw")
        new = run_steps(cfg, params, [grads])
        for path, w in flat_with_names(params).items():
            wd = 0.1 if np.ndim(w) >= 2 else 0.0
            want = np_adamw_run(w, [get(grads, path)], lr=1e-3, wd=wd)
            np.testing.assert_allclose(get(new, path), want, rtol=1e-5, atol=1e-7,
                                       err_msg=path)


class OptimConfigTest(parameterized.TestCase):

    @parameterized.named_parameters(
        ("name", dict(name="sgd"), r"optim\.name"),
        ("adamw_learning_rate", dict(adamw_learning_rate=0.0), r"optim\.adamw_learning_rate"),
        ("adamw_min_lr_ratio", dict(adamw_min_lr_ratio=1.5), r"optim\.adamw_min_lr_ratio"),
        ("adamw_weight_decay", dict(adamw_weight_decay=-1.0), r"optim\.adamw_weight_decay"),
        ("muon_momentum", dict(muon_momentum=1.0), r"optim\.muon_momentum"),
        ("muon_ns_steps", dict(muon_ns_steps=0), r"optim\.muon_ns_steps"),
        ("muon_ns_steps_quintic", dict(muon_ns_steps=6), r"optim\.muon_ns_steps"),
        ("muon_ns_coefficients", dict(muon_ns_coefficients="cubic"),
         r"optim\.muon_ns_coefficients"),
        ("muon_ns_dtype", dict(muon_ns_dtype="float16"), r"optim\.muon_ns_dtype"),
        ("muon_scale_mode", dict(muon_scale_mode="mup"), r"optim\.muon_scale_mode"),
        ("muon_extra_scale_factor", dict(muon_extra_scale_factor=0.0),
         r"optim\.muon_extra_scale_factor"),
        ("muon_variant", dict(muon_variant="adamuon"), r"optim\.muon_variant"),
        ("muon_beta2", dict(muon_beta2=-0.1), r"optim\.muon_beta2"),
        ("muon_eps", dict(muon_eps=0.0), r"optim\.muon_eps"),
        ("b2", dict(b2=1.0), r"optim\.b2"),
        ("weight_decay", dict(weight_decay=-0.1), r"optim\.weight_decay"),
        ("flatten", dict(flatten="yes"), r"optim\.flatten must be True or False, got 'yes'"),
        ("flatten_int", dict(flatten=1), r"optim\.flatten"),
    )
    def test_invalid_option_is_named(self, kwargs, pattern):
        with self.assertRaisesRegex(config_lib.ConfigError, pattern):
            config_lib.OptimConfig(**kwargs)

    @parameterized.named_parameters(
        ("learning_rate_inf", "optim", dict(learning_rate=float("inf")),
         "optim.learning_rate must be a finite number > 0, got inf"),
        ("learning_rate_nan", "optim", dict(learning_rate=float("nan")),
         "optim.learning_rate must be a finite number > 0, got nan"),
        ("learning_rate_negative", "optim", dict(learning_rate=-1.0),
         "optim.learning_rate must be > 0, got -1.0"),
        ("adamw_learning_rate_inf", "optim", dict(adamw_learning_rate=float("inf")),
         "optim.adamw_learning_rate must be a finite number > 0 or None, got inf"),
        ("weight_decay_inf", "optim", dict(weight_decay=float("inf")),
         "optim.weight_decay must be a finite number >= 0, got inf"),
        ("adamw_weight_decay_inf", "optim", dict(adamw_weight_decay=float("inf")),
         "optim.adamw_weight_decay must be a finite number >= 0 or None, got inf"),
        ("grad_clip_inf", "optim", dict(grad_clip=float("inf")),
         "optim.grad_clip must be a finite number >= 0, got inf"),
        ("eps_inf", "optim", dict(eps=float("inf")),
         "optim.eps must be a finite number > 0, got inf"),
        ("peak_flops_inf", "train", dict(peak_flops_per_device=float("inf")),
         "train.peak_flops_per_device must be a finite number > 0 or None, got inf"),
    )
    def test_an_infinite_or_nan_float_option_is_refused_by_name(self, section, kwargs, message):
        # inf passed the plain "> 0" checks: a learning rate of inf trained until the NaN guard
        # stopped the run at step 2.
        cls = config_lib.OptimConfig if section == "optim" else config_lib.TrainConfig
        with self.assertRaises(config_lib.ConfigError) as cm:
            cls(**kwargs)
        self.assertEqual(str(cm.exception), message)

    def test_simple_coefficients_allow_any_step_count(self):
        cfg = config_lib.OptimConfig(name="muon", muon_ns_coefficients="simple", muon_ns_steps=3)
        self.assertEqual(cfg.muon_ns_steps, 3)

    def test_from_config_dict(self):
        corpus = train_test.write_corpus(self.create_tempdir().full_path)
        cfg = config_lib.experiment_from_config_dict({
            "model": {"vocab_size": 64, "d_model": 32},
            "data": {"paths": [corpus], "seq_len": 16, "batch_size": 2},
            "optim": {"name": "muon", "adamw_learning_rate": 1e-3, "muon_momentum": 0.9,
                      "muon_ns_steps": 10},
        })
        self.assertEqual((cfg.optim.name, cfg.optim.adamw_learning_rate,
                          cfg.optim.muon_momentum, cfg.optim.muon_ns_steps),
                         ("muon", 1e-3, 0.9, 10))


# -------------------------------------------------------------------------------------------
# optim.flatten: AdamW on flat vectors
# -------------------------------------------------------------------------------------------


def assert_trees_close(got, want, atol=2e-7):
    # The flat and per-leaf programs fuse differently (XLA CPU), so a few elements of Adam's
    # ratio differ in the last bit; times lr and through near-cancelling decay that is at most
    # ~1e-7 absolute on O(1) parameters (97% of the elements agree bit for bit).
    for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(got),
                            jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=atol,
                                   err_msg=jax.tree_util.keystr(path))


class FlattenTest(parameterized.TestCase):

    @parameterized.named_parameters(
        ("adamw", dict(name="adamw", weight_decay=0.1)),
        ("adamw_no_decay", dict(name="adamw", weight_decay=0.0)),
        ("adamw_cosine", dict(name="adamw", weight_decay=0.05, schedule="cosine")),
        ("muon", dict(name="muon", weight_decay=0.1, muon_ns_dtype="float32")),
        ("muon_adamw_decay", dict(name="muon", weight_decay=0.1, adamw_weight_decay=0.05,
                                  adamw_min_lr_ratio=0.1, muon_ns_dtype="float32")),
    )
    def test_flat_params_equal_per_leaf_params(self, kw):
        # Warm-up, the stable phase and the cool-down all happen in 8 steps; the gradients are
        # large enough that clipping (global norm 1) is active at every step.
        params = random_tree(0)
        grads = [random_tree(s, scale=0.3) for s in range(1, 9)]
        self.assertGreater(float(optax.tree.norm(grads[0])), 1.0)
        base = dict(learning_rate=1e-2, warmup_steps=2, decay_fraction=0.5, grad_clip=1.0, **kw)
        want, want_state = run_steps_with_state(config_lib.OptimConfig(**base), params, grads, 8)
        got, got_state = run_steps_with_state(config_lib.OptimConfig(flatten=True, **base),
                                              params, grads, 8)
        # Muon leaves: clipping's global norm sums the leaves in another order, and the five
        # fp32 Newton-Schulz iterations amplify that last-bit difference to ~1e-5 of the
        # orthogonalised update; times lr 1e-2 over 8 steps, up to ~1e-6 absolute (2.6e-7 seen
        # on 2026-12-03, over the Adam bound of 2e-7). A wrong flat layout moves parameters
        # by ~1e-2 (the `moved` check below), far above either bound.
        assert_trees_close(got, want, atol=1e-6 if kw["name"] == "muon" else 2e-7)
        moved = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip(
            jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(params)))
        self.assertGreater(moved, 1e-3)
        # Muon leaves keep their per-matrix state; the AdamW moments are flat vectors.
        flat_mu = [x for x in jax.tree_util.tree_leaves(
            optax.tree_utils.tree_get_all_with_path(got_state, "mu"))
            if hasattr(x, "ndim")]
        self.assertTrue(flat_mu)
        self.assertTrue(all(x.ndim == 1 for x in flat_mu))
        if kw["name"] == "muon":
            trace = optax.tree_utils.tree_get(got_state, "trace")
            for path in MUON_PATHS:
                self.assertEqual(get(trace, path).shape, get(params, path).shape)

    def test_flat_state_layout(self):
        params = small_model_params(("gdn", "attn"))
        sizes = {optim.DECAY: 0, optim.NO_DECAY: 0}
        for leaf in jax.tree_util.tree_leaves(params):
            sizes[optim.DECAY if leaf.ndim >= 2 else optim.NO_DECAY] += int(np.prod(leaf.shape))
        self.assertGreater(min(sizes.values()), 0)
        tx = optim.make_optimizer(config_lib.OptimConfig(flatten=True), 10)
        state = jax.eval_shape(tx.init, params)
        groups = state[1].inner_states  # (clip, partition)
        self.assertEqual(set(groups), {optim.DECAY, optim.NO_DECAY})
        for name, group in groups.items():
            adam = group.inner_state[0]
            self.assertEqual((adam.mu.shape, adam.nu.shape, adam.mu.dtype),
                             ((sizes[name],), (sizes[name],), jnp.float32), name)
        # The structure does not depend on values: eval_shape and a real init agree.
        real = tx.init(jax.tree_util.tree_map(lambda p: jnp.zeros(p.shape, p.dtype), params))
        self.assertEqual(jax.tree_util.tree_structure(real), jax.tree_util.tree_structure(state))
        self.assertEqual(jax.tree_util.tree_map(lambda x: x.shape, real),
                         jax.tree_util.tree_map(lambda x: x.shape, state))

    def test_checkpoint_round_trip(self):
        params = random_tree(0)
        grads = [random_tree(s, scale=0.1) for s in (1, 2, 3)]
        cfg = config_lib.OptimConfig(learning_rate=1e-2, warmup_steps=0, flatten=True)
        tx = optim.make_optimizer(cfg, 10)
        update = jax.jit(tx.update)
        state = {"params": params, "opt_state": tx.init(params), "step": jnp.zeros((), jnp.int32)}

        def step(state, grads):
            updates, opt_state = update(grads, state["opt_state"], state["params"])
            return {"params": optax.apply_updates(state["params"], updates),
                    "opt_state": opt_state, "step": state["step"] + 1}

        state = step(state, grads[0])
        state = step(state, grads[1])
        ckpt = checkpoint_lib.Checkpointer(self.create_tempdir().full_path, async_save=False)
        ckpt.save(2, state)
        abstract = jax.eval_shape(lambda p: {"params": p, "opt_state": tx.init(p),
                                             "step": jnp.zeros((), jnp.int32)}, params)
        restored = ckpt.restore(2, abstract)
        ckpt.close()
        jax.tree_util.tree_map(np.testing.assert_array_equal, restored, state)
        jax.tree_util.tree_map(np.testing.assert_array_equal, step(restored, grads[2]),
                               step(state, grads[2]))

    def test_only_matrices_and_empty_groups(self):
        # No 1-D leaf: the no-decay group is empty (EmptyState), the result unchanged.
        params = {"a": random_tree(0)["embed"], "b": {"kernel": random_tree(1)["embed"]}}
        grads = [jax.tree_util.tree_map(lambda p: 0.1 * jnp.cos(p + s), params) for s in (1, 2)]
        base = dict(learning_rate=1e-2, warmup_steps=0, weight_decay=0.1)
        want = run_steps(config_lib.OptimConfig(**base), params, grads)
        got = run_steps(config_lib.OptimConfig(flatten=True, **base), params, grads)
        assert_trees_close(got, want)

    def test_mixed_dtypes_are_refused(self):
        params = {"w": jnp.ones((4, 4), jnp.float32), "v": jnp.ones((4, 4), jnp.bfloat16)}
        tx = optim.make_optimizer(config_lib.OptimConfig(flatten=True), 10)
        # A ConfigError, also under jit (as train.py inits): the binaries print one line.
        for init in (tx.init, jax.jit(tx.init)):
            with self.assertRaisesRegex(config_lib.ConfigError,
                                        r"optim\.flatten=True .* one dtype; got "
                                        r"\['bfloat16', 'float32'\]"):
                init(params)

    def test_sharded_parameters_are_refused(self):
        replicated = types.SimpleNamespace(is_fully_replicated=True)
        sharded = types.SimpleNamespace(is_fully_replicated=False)
        shardings = {"embed": sharded, "norm": replicated}
        optim.check_flatten_sharding(config_lib.OptimConfig(), shardings)  # off: no check
        optim.check_flatten_sharding(config_lib.OptimConfig(flatten=True), {"norm": replicated})
        with self.assertRaisesRegex(config_lib.ConfigError,
                                    r"optim\.flatten=True .* 1 parameters are sharded "
                                    r"\(e\.g\. \['embed'\]\)"):
            optim.check_flatten_sharding(config_lib.OptimConfig(flatten=True), shardings)


# -------------------------------------------------------------------------------------------
# The trainer with name="muon"
# -------------------------------------------------------------------------------------------


class TrainWithMuonTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = self._tmp.name
        base = train_test.tiny_experiment(train_test.write_corpus(self.tmp))
        self.cfg = config_lib.ExperimentConfig(
            model=base.model, data=base.data, train=base.train,
            optim=config_lib.OptimConfig(name="muon", learning_rate=3e-3,
                                         adamw_learning_rate=1e-2, warmup_steps=0,
                                         schedule="cosine"))

    def tearDown(self):
        self._tmp.cleanup()
        super().tearDown()

    @pytest.mark.slow  # ~15-38 s on 2 cores; the Muon step's numpy references run in CI
    def test_muon_training_lowers_the_loss_and_checkpoints(self):
        trainer = train.Trainer(self.cfg)
        state = trainer.init_state(0)
        opt_leaves = jax.tree_util.tree_leaves(state["opt_state"])
        self.assertTrue(all(np.all(np.isfinite(x)) for x in opt_leaves))
        batch = train._to_jax(next(data_lib.build_datasets(self.cfg.data).train_iter))
        losses = []
        for _ in range(6):
            state, metrics = trainer.train_step(state, batch)
            losses.append(float(metrics["loss"]))
        self.assertLess(losses[-1], losses[0] - 1.0, losses)

        # The multi-transform state (momentum, NorMuon moment, Adam moments) round-trips.
        ckpt = checkpoint_lib.Checkpointer(os.path.join(self.tmp, "w"), async_save=False)
        ckpt.save(6, state)
        restored = ckpt.restore(6, trainer.abstract_state())
        ckpt.close()
        jax.tree_util.tree_map(np.testing.assert_array_equal, restored, state)
        _, m1 = trainer.train_step(restored, batch)
        _, m2 = trainer.train_step(state, batch)
        self.assertEqual(float(m1["loss"]), float(m2["loss"]))


if __name__ == "__main__":
    absltest.main()
