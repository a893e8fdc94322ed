"""HypeNet conversion: identity conversion reproduces the teacher; GQA expansion; new params."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest

from lattn_jax import config as config_lib
from lattn_jax.halo import hypenet
from lattn_jax.halo import loaders
from lattn_jax.halo import stages
from tests import tolerances


def tiny_teacher_config(tie=True, qk_norm=True):
    return config_lib.ModelConfig(
        vocab_size=61, d_model=32, layer_pattern=("attn",) * 4, mlp_hidden=48,
        tie_embeddings=tie, norm_eps=1e-6, use_segment_ids=False,
        attention=config_lib.AttentionConfig(num_heads=4, num_kv_heads=2, head_dim=8,
                                             rope_theta=1e4, qk_norm=qk_norm))


class ConversionTest(absltest.TestCase):

    def test_all_attention_with_rope_reproduces_the_teacher(self):
        tokens = jnp.asarray(np.random.default_rng(0).integers(0, 61, size=(2, 13)))
        for tie in (True, False):
            cfg = tiny_teacher_config(tie=tie)
            params = stages.random_teacher(cfg, seed=1)
            ref = loaders.build_model(cfg, params)(tokens)
            student_cfg = hypenet.hypenet_config(cfg, range(4), attention_rope=True,
                                                 attention_gate=False)
            self.assertEqual(student_cfg.layer_pattern, ("attn",) * 4)
            out = loaders.build_model(
                student_cfg, hypenet.convert(params, cfg, student_cfg))(tokens)
            np.testing.assert_allclose(out, ref, **tolerances.fwd_tol(jnp.float32))

    def test_hypenet_layers(self):
        cfg = tiny_teacher_config(qk_norm=False)
        params = stages.random_teacher(cfg)
        student_cfg = hypenet.hypenet_config(cfg, [1], logit_scaling_base=500.0)
        self.assertEqual(student_cfg.layer_pattern,
                         ("lightning", "attn_nope", "lightning", "lightning"))
        lc = student_cfg.lightning
        self.assertEqual((lc.num_heads, lc.num_kv_heads, lc.head_dim, lc.rope_theta),
                         (4, 4, 8, 1e4))
        self.assertTrue(lc.qk_norm and lc.output_norm and lc.output_gate)
        self.assertEqual(lc.conv_width, 0)
        self.assertEqual(student_cfg.attention.logit_scaling_base, 500.0)
        out = hypenet.convert(params, cfg, student_cfg, seed=3)
        teacher_mixer = params["blocks"][0]["mixer"]["qkv_proj"]["kernel"]
        q, _, k, v = hypenet.split_qkv(teacher_mixer, cfg)
        light = out["blocks"][0]["mixer"]
        np.testing.assert_array_equal(light["q_proj"]["kernel"], q)
        # New head h reads teacher KV head h // 2 (repeat_interleave).
        kk = np.asarray(light["k_proj"]["kernel"]).reshape(32, 4, 8)
        for h in range(4):
            np.testing.assert_array_equal(kk[:, h], np.asarray(k).reshape(32, 2, 8)[:, h // 2])
        np.testing.assert_array_equal(light["o_norm"]["scale"], np.ones(32))
        np.testing.assert_array_equal(light["q_norm"]["scale"], np.ones(8))
        z = np.asarray(light["z_proj"]["kernel"])
        self.assertLessEqual(np.abs(z).max(), 1 / np.sqrt(32))
        self.assertGreater(z.std(), 0.5 / np.sqrt(3 * 32))
        attn = out["blocks"][1]["mixer"]["qkv_proj"]["kernel"]
        q1, gate, k1, v1 = hypenet.split_qkv(attn, student_cfg, gated=True)
        tq, _, tk, tv = hypenet.split_qkv(params["blocks"][1]["mixer"]["qkv_proj"]["kernel"], cfg)
        np.testing.assert_array_equal(q1, tq)
        np.testing.assert_array_equal(v1, tv)
        self.assertLess(abs(float(np.std(gate)) - 0.02), 0.005)
        logits = loaders.build_model(student_cfg, out)(jnp.zeros((1, 5), jnp.int32))
        self.assertTrue(np.isfinite(np.asarray(logits)).all())

    def test_lightning_without_qk_norm(self):
        # The ablation for teachers without QK norms (SmolLM2): the converted Lightning layers
        # have no q/k norms, the same projections, and compute the Lightning recurrence on the
        # raw q, k: equal to a student with norms whose q, k are scaled back to the raw ones.
        cfg = tiny_teacher_config(qk_norm=False)
        params = stages.random_teacher(cfg, seed=2)
        with_norm = hypenet.hypenet_config(cfg, [1])
        plain = hypenet.hypenet_config(cfg, [1], lightning_qk_norm=False)
        self.assertTrue(with_norm.lightning.qk_norm)
        self.assertFalse(plain.lightning.qk_norm)
        a = hypenet.convert(params, cfg, with_norm, seed=3)
        b = hypenet.convert(params, cfg, plain, seed=3)
        for i in (0, 2, 3):
            self.assertEqual(set(a["blocks"][i]["mixer"]) - set(b["blocks"][i]["mixer"]),
                             {"q_norm", "k_norm"})
            for name, leaf in b["blocks"][i]["mixer"].items():
                np.testing.assert_array_equal(leaf["kernel" if "kernel" in leaf else "scale"],
                                              a["blocks"][i]["mixer"][name][
                                                  "kernel" if "kernel" in leaf else "scale"])
        tokens = jnp.asarray(np.random.default_rng(4).integers(0, 61, size=(2, 11)))
        out_plain = loaders.build_model(plain, b)(tokens)
        out_norm = loaders.build_model(with_norm, a)(tokens)
        self.assertTrue(np.isfinite(np.asarray(out_plain)).all())
        # Different functions: the norms change q and k (the teacher's are not unit RMS).
        self.assertGreater(float(jnp.abs(out_plain - out_norm).max()), 1e-3)

    def test_split_projections_same_student_loss_and_gradients(self):
        # hypenet.split_projections (on in the HALO configs) forms the gated attention's
        # q/gate/k/v blocks and the MLP's gate/up blocks as separate products: the same params,
        # the same loss and, up to fp32 rounding, the same gradients as one product then split.
        cfg = tiny_teacher_config(qk_norm=False)
        teacher = stages.random_teacher(cfg, seed=2)
        rng = np.random.default_rng(5)
        tokens = jnp.asarray(rng.integers(0, 61, size=(2, 11)))
        targets = jnp.asarray(rng.integers(0, 61, size=(2, 11)))
        self.assertFalse(cfg.split_projections)
        results = []
        for split in (None, True):
            student_cfg = hypenet.hypenet_config(cfg, [1, 3], split_projections=split)
            self.assertEqual(student_cfg.split_projections, bool(split))
            params = hypenet.convert(teacher, cfg, student_cfg, seed=3)
            model = loaders.build_model(student_cfg, params)
            self.assertEqual(model.blocks[1].mixer.qkv_proj.split_products, bool(split))
            self.assertEqual(model.blocks[0].mlp.fc1.split_products, bool(split))

            def loss(p, student_cfg=student_cfg):
                logits = loaders.build_model(student_cfg, p)(tokens)
                logp = jax.nn.log_softmax(logits.astype(jnp.float32))
                return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], -1))

            results.append(jax.value_and_grad(loss)(params))
        (l0, g0), (l1, g1) = results
        np.testing.assert_allclose(l1, l0, rtol=1e-6)
        leaves0, leaves1 = jax.tree_util.tree_leaves(g0), jax.tree_util.tree_leaves(g1)
        self.assertLen(leaves1, len(leaves0))
        for a, b in zip(leaves1, leaves0):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6 * float(np.max(np.abs(b))))

    def test_swiglu_packed_is_kept_or_set(self):
        # hypenet.swiglu_packed (the HALO pipeline's, off) sets ModelConfig.swiglu_packed;
        # None keeps the teacher's. The converted parameters do not depend on it.
        cfg = tiny_teacher_config()
        packed_teacher = dataclasses.replace(cfg, swiglu_packed=True)
        for teacher, arg, want in ((cfg, None, False), (cfg, True, True),
                                   (packed_teacher, None, True), (packed_teacher, False, False)):
            student_cfg = hypenet.hypenet_config(teacher, [1, 3], swiglu_packed=arg)
            self.assertIs(student_cfg.swiglu_packed, want)
            self.assertEqual(student_cfg.split_projections, teacher.split_projections)
        teacher = stages.random_teacher(cfg, seed=4)
        shapes = [jax.tree_util.tree_map(
            jnp.shape, hypenet.convert(teacher, cfg, hypenet.hypenet_config(
                cfg, [1, 3], swiglu_packed=packed), seed=3)) for packed in (False, True)]
        self.assertEqual(shapes[0], shapes[1])

    def test_errors(self):
        cfg = tiny_teacher_config()
        with self.assertRaisesRegex(ValueError, r"\[7\]"):
            hypenet.hypenet_config(cfg, [7])
        with self.assertRaisesRegex(ValueError, "all 'attn'"):
            hypenet.hypenet_config(dataclasses.replace(cfg, layer_pattern=("gdn",) * 4), [])
        self.assertEqual(hypenet.attention_layer_count(28), 7)


if __name__ == "__main__":
    absltest.main()
