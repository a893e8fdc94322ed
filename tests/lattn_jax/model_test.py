"""Model assembly: pure / hybrid / dense patterns, causality, packing, ties, param counts."""

import dataclasses
from unittest import mock

import numpy as np
import jax
import jax.numpy as jnp
from absl.testing import absltest, parameterized
from flax import nnx

from lattn_jax import config as config_lib
from lattn_jax import model as model_lib
from pallas_kernels.common import mosaic_gpu, validation
from tests import tolerances

PATTERNS = {
    "pure": ("gdn", "gdn", "gdn"),
    "hybrid": ("gdn", "gdn", "attn"),
    "dense": ("attn", "attn", "attn"),
}


def _tokens(seed, shape, low=0, high=64):
    """int32 token ids uniform in ``[low, high)`` from numpy's generator: each jax.random call
    on a new shape compiles a program."""
    return jnp.asarray(np.random.default_rng(seed).integers(low, high, shape), jnp.int32)


@nnx.jit
def forward(model, tokens, segment_ids=None):
    """``model(tokens, segment_ids=...)`` under ``nnx.jit``: one compile per shape is cheaper
    than eager mode (op by op, the softmax layers alone compiled ~70 programs per shape)."""
    return model(tokens, segment_ids=segment_ids)


def tiny_config(pattern, **kw):
    return config_lib.ModelConfig(
        vocab_size=64, d_model=32, layer_pattern=pattern, mlp_hidden=48,
        attention=config_lib.AttentionConfig(num_heads=4, num_kv_heads=2, output_gate=True),
        gdn=config_lib.GatedDeltaNetConfig(num_k_heads=2, num_v_heads=4, head_k_dim=8,
                                           head_v_dim=8, chunk_size=8), **kw)


class ModelTest(parameterized.TestCase):

    @parameterized.named_parameters(*[(name, pattern) for name, pattern in PATTERNS.items()])
    def test_output_shape_dtype_and_causality(self, pattern):
        model = model_lib.LanguageModel(tiny_config(pattern), rngs=nnx.Rngs(0))
        tokens = _tokens(1, (2, 21))
        logits = forward(model, tokens)
        self.assertEqual(logits.shape, (2, 21, 64))
        self.assertEqual(logits.dtype, jnp.float32)
        self.assertTrue(np.all(np.isfinite(logits)))
        changed = tokens.at[:, 13:].set((tokens[:, 13:] + 1) % 64)
        out = forward(model, changed)
        np.testing.assert_allclose(out[:, :13], logits[:, :13], rtol=1e-6, atol=1e-6)
        self.assertGreater(np.abs(out[:, 13:] - logits[:, 13:]).max(), 1e-4)

    @parameterized.named_parameters(*[(name, pattern) for name, pattern in PATTERNS.items()])
    def test_packed_documents_are_independent(self, pattern):
        model = model_lib.LanguageModel(tiny_config(pattern), rngs=nnx.Rngs(0))
        tokens = _tokens(2, (1, 20))
        seg = jnp.array([[0] * 9 + [1] * 11])
        packed = forward(model, tokens, seg)
        np.testing.assert_allclose(packed[:, :9], forward(model, tokens[:, :9]),
                                   **tolerances.fwd_tol(jnp.float32))
        np.testing.assert_allclose(packed[:, 9:], forward(model, tokens[:, 9:]),
                                   **tolerances.fwd_tol(jnp.float32))

    def test_segment_ids_ignored_when_disabled(self):
        model = model_lib.LanguageModel(tiny_config(PATTERNS["hybrid"], use_segment_ids=False),
                                        rngs=nnx.Rngs(0))
        tokens = _tokens(3, (1, 12))
        seg = jnp.array([[0] * 5 + [1] * 7])
        np.testing.assert_array_equal(forward(model, tokens, seg), forward(model, tokens))

    @parameterized.named_parameters(
        ("float_tokens", "float", (2, 12), None, r"tokens must be integer token ids "
         r"\[batch, seq_len\], got float32 \(2, 12\)"),
        ("embeddings_as_tokens", "float", (2, 12, 32), None, r"tokens must be integer token ids "
         r"\[batch, seq_len\], got float32 \(2, 12, 32\)"),
        ("rank_1_tokens", "int", (12,), None, r"tokens must be .*\[batch, seq_len\], got int32 "
         r"\(12,\)"),
        ("short_segment_ids", "int", (2, 12), (2, 11), r"segment_ids must be \[batch=2, "
         r"seq_len=12\] like tokens, got \(2, 11\)"),
        ("no_tokens", "int", (2, 0), None, r"^tokens must hold at least one row and one token, "
         r"got shape \(2, 0\)$"),
        ("no_rows", "int", (0, 5), None, r"^tokens must hold at least one row and one token"),
    )
    def test_bad_input_shapes_name_the_argument(self, kind, shape, seg_shape, message):
        # Checked on static shapes before any computation: an abstract model suffices.
        model = nnx.eval_shape(lambda: model_lib.LanguageModel(tiny_config(PATTERNS["hybrid"]),
                                                               rngs=nnx.Rngs(0)))
        if kind == "float":
            tokens = jnp.asarray(np.random.default_rng(4).standard_normal(shape), jnp.float32)
        else:
            tokens = _tokens(4, shape, 1, 64)
        seg = None if seg_shape is None else _tokens(4, seg_shape, 0, 3)
        with self.assertRaisesRegex(ValueError, message):
            model(tokens, segment_ids=seg)

    @parameterized.named_parameters(
        ("too_large", [[1, 2, 300]], r"got min 1, max 300"),  # gave NaN logits
        ("negative", [[-1, 2, 3]], r"got min -1, max 3"),  # wrapped to the last row silently
    )
    def test_concrete_token_ids_outside_the_vocabulary_are_refused(self, ids, got):
        model = nnx.eval_shape(lambda: model_lib.LanguageModel(tiny_config(PATTERNS["hybrid"]),
                                                               rngs=nnx.Rngs(0)))
        vocab = model.config.vocab_size
        for tokens in (jnp.asarray(ids, jnp.int32), np.asarray(ids, np.int32)):
            with self.assertRaisesRegex(
                    ValueError, rf"^tokens must be ids in \[0, vocab_size={vocab}\), {got}$"):
                model(tokens)

    def test_init_state_refuses_a_batch_below_one(self):
        model = nnx.eval_shape(lambda: model_lib.LanguageModel(tiny_config(PATTERNS["hybrid"]),
                                                               rngs=nnx.Rngs(0)))
        for batch in (-1, 0, 1.5, True):
            with self.subTest(batch=batch):
                with self.assertRaisesRegex(ValueError, rf"^init_state: batch={batch!r}; "
                                                        r"expected a positive integer"):
                    model.init_state(batch, 4)
        self.assertLen(model.init_state(np.int64(2), 4), 3)  # one state per block

    def test_a_state_entry_of_the_wrong_kind_is_refused_naming_its_layer(self):
        """A reordered state list (a KV cache at a linear layer, a recurrent state at an
        attention layer) failed inside the mixer with an AttributeError."""
        model = nnx.eval_shape(lambda: model_lib.LanguageModel(  # the check comes first
            tiny_config(("gdn", "attn", "lightning"),
                        lightning=dict(num_heads=2, num_kv_heads=2)), rngs=nnx.Rngs(0)))
        tokens = _tokens(1, (2, 3))
        states = model.init_state(2, 8)
        cases = [([states[1], states[0], states[2]], r"state\[0\] is a KVCache, but layer 0 "
                  r"\('gdn'\) needs a RecurrentState"),
                 ([states[0], states[2], states[1]], r"state\[1\] is a LightningState, but "
                  r"layer 1 \('attn'\) needs a KVCache"),
                 ([states[0], states[1], states[0]], r"state\[2\] is a RecurrentState, but "
                  r"layer 2 \('lightning'\) needs a LightningState")]
        for bad, message in cases:
            with self.subTest(message=message):
                with self.assertRaisesRegex(ValueError, message):
                    model(tokens, state=bad, return_state=True)
        self.assertEqual([type(st).__name__ for st in states],
                         ["RecurrentState", "KVCache", "LightningState"])

    def test_a_string_layer_pattern_is_refused_asking_for_a_tuple(self):
        # "gdn" would otherwise be read letter by letter ('g' is not a known mixer).
        with self.assertRaisesRegex(config_lib.ConfigError,
                                    r"model\.layer_pattern must be a tuple of mixer names, "
                                    r"e\.g\. \('gdn',\), got the string 'gdn'"):
            config_lib.ModelConfig(vocab_size=64, d_model=32, layer_pattern="gdn", mlp_hidden=48)
        self.assertEqual(config_lib.ModelConfig(vocab_size=64, d_model=32, layer_pattern=("gdn",),
                                                mlp_hidden=48).layer_pattern, ("gdn",))

    def test_a_list_layer_pattern_is_stored_as_the_tuple(self):
        listed = config_lib.ModelConfig(vocab_size=64, d_model=32, layer_pattern=["gdn", "attn"],
                                        mlp_hidden=48)
        tupled = config_lib.ModelConfig(vocab_size=64, d_model=32, layer_pattern=("gdn", "attn"),
                                        mlp_hidden=48)
        self.assertEqual(listed.layer_pattern, ("gdn", "attn"))
        self.assertEqual(listed, tupled)
        self.assertEqual(hash(listed), hash(tupled))
        # The other tuple field of the config dataclasses is stored as a tuple too.
        mesh = config_lib.MeshConfig(rules=[["batch", ["data", "fsdp"]], ["embed", None]])
        self.assertEqual(mesh.rules, (("batch", ("data", "fsdp")), ("embed", None)))
        hash(mesh)

    def test_pallas_implementation_is_a_config_choice_with_a_named_error(self):
        # "pallas" is accepted by every linear mixer section; off a GPU the call names why it
        # cannot run instead of falling back silently; a misspelling is named at config time.
        for section, cls in (("gdn", config_lib.GatedDeltaNetConfig),
                             ("kda", config_lib.KDAConfig)):
            self.assertEqual(cls(implementation="pallas").implementation, "pallas")
            with self.assertRaisesRegex(config_lib.ConfigError,
                                        f"model.{section}.implementation='palas'"):
                cls(implementation="palas")
        cfg = config_lib.ModelConfig(
            vocab_size=64, d_model=32, layer_pattern=("gdn",), mlp_hidden=48,
            gdn=config_lib.GatedDeltaNetConfig(num_k_heads=2, num_v_heads=2, head_k_dim=64,
                                               head_v_dim=64, implementation="pallas"))
        model = model_lib.LanguageModel(cfg, rngs=nnx.Rngs(0))
        tokens = _tokens(3, (1, 64))
        if jax.default_backend() != "gpu":
            with self.assertRaisesRegex(ValueError, "implementation='pallas' cannot run"):
                model(tokens)

    def test_an_unsupported_kernel_names_its_linear_mixer_sections_option(self):
        # The op's error named only the op (gated_delta_rule: implementation='pallas' ...), not
        # the option that chose it, as softmax attention's does (2026-12-06 newcomer pass).
        if jax.default_backend() == "gpu":
            self.skipTest("the Pallas GPU kernels can run here")
        ops = {"gdn": "gated_delta_rule", "deltanet": "delta_rule", "kda": "kda",
               "gdn2": "gdn2", "lightning": "lightning_attention",
               "linear_attn": "linear_attention"}
        linear = [m for m in config_lib.MIXER_NAMES if not m.startswith("attn")]
        self.assertCountEqual(ops, linear)  # every linear mixer section
        tokens = jnp.zeros((1, 64), jnp.int32)
        for section in linear:
            with self.subTest(section=section):
                cfg = config_lib.ModelConfig(vocab_size=64, d_model=32, layer_pattern=(section,),
                                             mlp_hidden=48)
                cfg = dataclasses.replace(cfg, **{section: dataclasses.replace(
                    getattr(cfg, section), implementation="pallas")})
                model = model_lib.LanguageModel(cfg, rngs=nnx.Rngs(0))
                with self.assertRaisesRegex(
                        validation.UnsupportedImplementationError,
                        rf"^model\.{section}\.implementation='pallas' is not supported here: "
                        rf"{ops[section]}: implementation='pallas' cannot run this call: .*GPU"):
                    model(tokens)

    def test_mosaic_gpu_implementation_builds_the_mosaic_kernels_into_the_train_step(self):
        # model.gdn / model.deltanet.implementation="mosaic_gpu": on a (patched) Hopper GPU the
        # loss and its gradient, lowered for CUDA on this host, run each layer's op as Mosaic
        # GPU kernels (routing's residual u included); off a GPU the call names why it cannot
        # run.
        for section, cls, layer in (("gdn", config_lib.GatedDeltaNetConfig, "gdn"),
                                    ("deltanet", config_lib.DeltaNetConfig, "deltanet")):
            with self.assertRaisesRegex(config_lib.ConfigError,
                                        f"model.{section}.implementation='mosaic'.*mosaic_gpu"):
                cls(implementation="mosaic")
            mixer = cls(num_k_heads=1, num_v_heads=2, head_k_dim=64, head_v_dim=64,
                        implementation="mosaic_gpu")
            cfg = config_lib.ModelConfig(vocab_size=64, d_model=32, layer_pattern=(layer,),
                                         mlp_hidden=48, dtype="bfloat16", **{section: mixer})
            model = model_lib.LanguageModel(cfg, rngs=nnx.Rngs(0))
            tokens = _tokens(3, (1, 128))
            if jax.default_backend() != "gpu":
                with self.assertRaisesRegex(ValueError, "implementation='mosaic_gpu' cannot run"):
                    model(tokens)
            graphdef, params = nnx.split(model)

            def loss(params):
                logits = nnx.merge(graphdef, params)(tokens)
                return jnp.mean(logits.astype(jnp.float32) ** 2)

            with mock.patch.object(mosaic_gpu, "compute_capability", return_value=(9, 0)):
                text = jax.jit(jax.value_and_grad(loss)).trace(params).lower(
                    lowering_platforms=("cuda",)).as_text()
            # mosaic_vjp's defaults at T 128 (one piece, no three-pass fallback): forward
            # "fused_rs", which under differentiation runs "fused_t0": the T0 kernel (also forming
            # the backward's W) and the fused state and output kernel; backward, the reverse pass
            # forming dv_local ("fold") and the fused chunk-local kernel ("fused_ws") with the
            # forward's T0
            self.assertEqual(text.count("custom_call @mosaic_gpu"), 4, msg=section)
            for name in ("gdn_chunk_kkt_inverse_subst_split_w", "gdn_chunk_delta_fused_t0_fwd",
                         "gdn_chunk_delta_dh_fold", "gdn_chunk_bwd_fused_ws"):
                self.assertTrue(name in text, msg=f"{section}: {name}")

    def test_split_projections_same_values_and_gradients(self):
        # model.split_projections forms each column block of the fused projections (GDN's
        # in_proj, attention's qkv_proj, the MLP's fc1) as its own product: the same parameters
        # (same init) and, up to fp32 rounding, the same loss and gradients as split-after.
        tokens = _tokens(3, (2, 24))

        def loss_and_grads(split):
            model = model_lib.LanguageModel(
                tiny_config(PATTERNS["hybrid"], split_projections=split), rngs=nnx.Rngs(0))
            graph, params, rest = nnx.split(model, nnx.Param, ...)

            def loss(p):
                logits = nnx.merge(graph, p, rest)(tokens)
                return jnp.mean(jax.nn.log_softmax(logits)[..., 0] * jnp.arange(24.0))

            return params, jax.jit(jax.value_and_grad(loss))(params)

        p0, (l0, g0) = loss_and_grads(False)
        p1, (l1, g1) = loss_and_grads(True)
        jax.tree_util.tree_map(np.testing.assert_array_equal, p0, p1)
        self.assertTrue(model_lib.LanguageModel(
            tiny_config(PATTERNS["hybrid"], split_projections=True),
            rngs=nnx.Rngs(0)).blocks[2].mixer.qkv_proj.split_products)
        np.testing.assert_allclose(l1, l0, rtol=1e-6)
        leaves0, leaves1 = jax.tree_util.tree_leaves(g0), jax.tree_util.tree_leaves(g1)
        self.assertLen(leaves1, len(leaves0))
        for a, b in zip(leaves1, leaves0):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6 * float(np.max(np.abs(b))))

    def test_swiglu_packed_same_params_values_and_gradients(self):
        # model.swiglu_packed forms the MLP's fc1 as one product and layers.swiglu_packed
        # (MOSAIC_GPU.md Sec. 46.2): the same parameters (same init; checkpoints interchange)
        # and, up to fp32 rounding, the same loss and gradients, with split_projections on or
        # off (fc1 split into two products only unpacked).
        tokens = _tokens(5, (2, 16))
        weights = jnp.asarray(np.random.default_rng(6).uniform(0.5, 1.5, (2, 16)), jnp.float32)

        def loss_and_grads(split, packed):
            model = model_lib.LanguageModel(
                tiny_config(PATTERNS["dense"], split_projections=split, swiglu_packed=packed),
                rngs=nnx.Rngs(0))
            self.assertEqual([b.mlp.packed for b in model.blocks], [packed] * 3)
            graph, params, rest = nnx.split(model, nnx.Param, ...)

            def loss(p):
                logits = nnx.merge(graph, p, rest)(tokens)
                picked = jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[..., None], -1)
                return -jnp.mean(picked[..., 0] * weights)

            return params, jax.jit(jax.value_and_grad(loss))(params)

        for split in (False, True):
            p0, (l0, g0) = loss_and_grads(split, False)
            p1, (l1, g1) = loss_and_grads(split, True)
            jax.tree_util.tree_map(np.testing.assert_array_equal, p0, p1)
            np.testing.assert_allclose(l1, l0, rtol=1e-6)
            leaves0, leaves1 = jax.tree_util.tree_leaves(g0), jax.tree_util.tree_leaves(g1)
            self.assertLen(leaves1, len(leaves0))
            for a, b in zip(leaves1, leaves0):
                np.testing.assert_allclose(a, b, rtol=1e-4,
                                           atol=1e-6 * float(np.max(np.abs(b))), err_msg=split)
            fc1 = g1["blocks"][0]["mlp"]["fc1"]["kernel"]
            self.assertGreater(float(jnp.abs(fc1).min()), 0.0)

    def test_pallas_norms_same_params_values_and_gradients(self):
        # model.norm_implementation="pallas_interpret" runs every RMSNorm (the blocks', the
        # final one, GDN's o_norm, attention's q/k norms) by the Pallas kernels of
        # pallas_kernels/common/rms_norm_gpu.py in interpret mode: the same parameters and, up
        # to fp32 rounding, the same logits and gradients as "xla".
        tokens = _tokens(7, (2, 16))
        pattern = ("gdn", "attn")

        def logits_and_grads(implementation):
            cfg = tiny_config(pattern, norm_implementation=implementation)
            cfg = dataclasses.replace(cfg, attention=dataclasses.replace(cfg.attention,
                                                                         qk_norm=True))
            model = model_lib.LanguageModel(cfg, rngs=nnx.Rngs(0))
            norms = [model.final_norm, model.blocks[0].mixer.o_norm,
                     model.blocks[1].mixer.q_norm] + [n for b in model.blocks
                                                      for n in (b.mixer_norm, b.mlp_norm)]
            self.assertEqual({n.implementation for n in norms}, {implementation})
            graph, params, rest = nnx.split(model, nnx.Param, ...)

            def loss(p):
                logits = nnx.merge(graph, p, rest)(tokens)
                picked = jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[..., None], -1)
                return -jnp.mean(picked[..., 0]), logits

            return params, jax.jit(jax.value_and_grad(loss, has_aux=True))(params)

        p0, ((_, y0), g0) = logits_and_grads("xla")
        p1, ((_, y1), g1) = logits_and_grads("pallas_interpret")
        jax.tree_util.tree_map(np.testing.assert_array_equal, p0, p1)
        np.testing.assert_allclose(y1, y0, rtol=1e-5, atol=1e-5)
        leaves0, leaves1 = jax.tree_util.tree_leaves(g0), jax.tree_util.tree_leaves(g1)
        self.assertLen(leaves1, len(leaves0))
        for a, b in zip(leaves1, leaves0):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6 * float(np.max(np.abs(b))))
        scale = g1["final_norm"]["scale"]
        self.assertGreater(float(jnp.abs(scale).min()), 0.0)

    def test_tied_embeddings_share_the_matrix(self):
        tied = model_lib.LanguageModel(tiny_config(PATTERNS["dense"], tie_embeddings=True),
                                       rngs=nnx.Rngs(0))
        untied = model_lib.LanguageModel(tiny_config(PATTERNS["dense"]), rngs=nnx.Rngs(0))
        self.assertIsNone(tied.head)
        self.assertEqual(model_lib.count_params(untied) - model_lib.count_params(tied), 64 * 32)

    def test_bf16_compute(self):
        model = model_lib.LanguageModel(tiny_config(PATTERNS["hybrid"], dtype="bfloat16"),
                                        rngs=nnx.Rngs(0))
        logits = forward(model, _tokens(4, (2, 10)))
        self.assertEqual(logits.dtype, jnp.float32)
        self.assertTrue(np.all(np.isfinite(logits)))

    def test_attention_layer_param_count_matches_spec(self):
        # Spec §2.5: softmax layer at d=1024, 16 heads / 4 KV groups of 64, with the fused input
        # norm: 2,622,464 params, +1,048,576 with the output gate.
        for gate, want in ((False, 2_622_464), (True, 2_622_464 + 1_048_576)):
            cfg = config_lib.ModelConfig(
                vocab_size=32000, d_model=1024, layer_pattern=("attn",) * 20, mlp_hidden=2816,
                attention=config_lib.AttentionConfig(num_heads=16, num_kv_heads=4,
                                                     output_gate=gate))
            block = nnx.eval_shape(lambda: model_lib.Block("attn", cfg, rngs=nnx.Rngs(0)))
            n = sum(x.size for x in jax.tree_util.tree_leaves(nnx.state(block.mixer, nnx.Param)))
            self.assertEqual(n + 1024, want)


class ModelConfigTypeTest(absltest.TestCase):

    def test_a_config_dict_or_dict_is_refused_naming_the_constructors(self):
        from configs import table2
        model_cd = table2.get_config("tiny").model
        for value, kind in ((model_cd, "ConfigDict"), (model_cd.to_dict(), "dict")):
            with self.assertRaisesRegex(
                    TypeError, rf"ModelConfig, got {kind}; .*experiment_from_config_dict"
                               rf"\(config\)\.model .*ModelConfig\(\*\*options\)"):
                model_lib.LanguageModel(value, rngs=nnx.Rngs(0))
        # The named constructors build it.
        cfg = config_lib.ModelConfig(**model_cd.to_dict())
        self.assertEqual(cfg, config_lib.experiment_from_config_dict(
            table2.get_config("tiny")).model)


if __name__ == "__main__":
    absltest.main()
