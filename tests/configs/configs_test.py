"""Every config file loads, converts to typed dataclasses, and initialises under eval_shape."""

import glob
import importlib
import os

import jax
import numpy as np
from absl.testing import absltest, parameterized
from flax import nnx

from lattn_jax import config as config_lib
from lattn_jax import model as model_lib
from lattn_jax import optim

CONFIG_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "configs")
CONFIG_MODULES = sorted(
    os.path.basename(p)[:-3] for p in glob.glob(os.path.join(CONFIG_DIR, "*.py"))
    # HALO configs describe conversion stages, not one training run: tests/lattn_jax/halo.
    if not os.path.basename(p).startswith(("_", "common", "halo_")))


class ConfigsTest(parameterized.TestCase):

    @parameterized.parameters(*[(name,) for name in CONFIG_MODULES])
    def test_config_builds_and_initialises(self, name):
        module = importlib.import_module(f"configs.{name}")
        cfg = config_lib.experiment_from_config_dict(module.get_config())
        abstract = nnx.eval_shape(lambda: model_lib.LanguageModel(cfg.model, rngs=nnx.Rngs(0)))
        params = nnx.state(abstract, nnx.Param)
        n = sum(x.size for x in jax.tree_util.tree_leaves(params))
        self.assertGreater(n, 0)
        tx = optim.make_optimizer(cfg.optim, cfg.train.total_steps)
        jax.eval_shape(tx.init, nnx.to_pure_dict(params))
        # The command-line options BUILD.md documents exist in every training config (a
        # ConfigDict only takes overrides of keys it declares).
        raw = module.get_config()
        for key in ("remat", "remat_policy", "dtype", "param_dtype"):
            self.assertIn(key, raw.model, f"configs/{name}.py: model.{key}")
        for key in ("data", "fsdp", "tensor"):
            self.assertIn(key, raw.mesh, f"configs/{name}.py: mesh.{key}")

    @parameterized.parameters("hybrid", "pure", "dense")
    def test_default_patterns(self, pattern):
        from configs import default
        cfg = config_lib.experiment_from_config_dict(default.get_config(f"pattern={pattern}"))
        self.assertEqual(cfg.model.layer_pattern, default.PATTERNS[pattern])

    def test_default_sizes_every_linear_mixer_like_gdn(self):
        # Without their sections the other mixers took ModelConfig's 350M-scale heads: a
        # pattern naming kda had twice gdn's mixer parameters (newcomer, 2026-12-07d).
        from configs import default
        counts = {}
        for mixer in ("gdn", "kda", "gdn2", "deltanet", "linear_attn"):
            cfg = default.get_config()
            cfg.model.layer_pattern = (mixer,)
            mcfg = config_lib.experiment_from_config_dict(cfg).model
            model = model_lib.LanguageModel(mcfg, rngs=nnx.Rngs(0))
            params = jax.tree.leaves(nnx.state(model, nnx.Param))
            counts[mixer] = sum(p.size for p in params) - mcfg.vocab_size * mcfg.d_model
        for mixer, count in counts.items():
            self.assertLess(abs(count / counts["gdn"] - 1.0), 0.15, counts)


class BadInputTest(absltest.TestCase):

    def _config(self):
        from configs import default
        return default.get_config()

    def test_unknown_mixer_name(self):
        c = self._config()
        c.model.layer_pattern = ("gdn", "mamba9", "attn")
        with self.assertRaisesRegex(ValueError, r"model\.layer_pattern\[1\]='mamba9' is not a "
                                                r"known mixer"):
            config_lib.experiment_from_config_dict(c)

    def test_width_not_divisible_by_heads(self):
        c = self._config()
        c.model.d_model = 130
        with self.assertRaisesRegex(ValueError, r"model\.d_model=130 is not divisible by "
                                                r"model\.attention\.num_heads=4"):
            config_lib.experiment_from_config_dict(c)

    def test_odd_derived_rope_head_dim_says_where_it_comes_from(self):
        c = self._config()
        c.model.d_model = 100
        with self.assertRaises(ValueError) as ctx:
            config_lib.experiment_from_config_dict(c)
        self.assertEqual(
            str(ctx.exception),
            "RoPE needs an even head dimension, got model.attention head_dim=25 = "
            "model.d_model 100 / model.attention.num_heads 4; choose a model.d_model that is a "
            "multiple of 2 x 4 (e.g. 96 or 104), set an even model.attention.head_dim, or set "
            "model.attention.rope_theta=None")
        c = self._config()
        c.model.attention.head_dim = 25
        with self.assertRaisesRegex(ValueError, r"^RoPE needs an even head dimension, got "
                                                r"model\.attention\.head_dim=25; set an even one "
                                                r"or set model\.attention\.rope_theta=None$"):
            config_lib.experiment_from_config_dict(c)

    def test_missing_data_file(self):
        c = self._config()
        c.data.paths = ["/nonexistent/corpus.txt"]
        with self.assertRaisesRegex(FileNotFoundError, r"data\.paths.*/nonexistent/corpus\.txt"):
            config_lib.experiment_from_config_dict(c)

    def test_bad_total_steps_is_named_itself(self):
        # The default's warm-up is derived from total_steps: the error names total_steps, not
        # the warm-up the user never set.
        c = self._config()
        c.train.total_steps = -5
        with self.assertRaisesRegex(ValueError, r"^train\.total_steps must be >= 1, got -5"):
            config_lib.experiment_from_config_dict(c)

    def test_derived_options_follow_the_field_they_are_computed_from(self):
        # The default's and the tiny presets' warm-up is a tenth of train.total_steps; set
        # outright, it follows nothing (the resume warning then lists it as the user's change).
        tiny = importlib.import_module("configs.table2").get_config("arch=gdn,opt=adamw,tiny")
        for c in (self._config(), tiny):
            self.assertEqual(config_lib.derived_options(c),
                             {"optim.warmup_steps": ("train.total_steps",)})
            c.train.total_steps = 70
            self.assertEqual(config_lib.derived_options(c),
                             {"optim.warmup_steps": ("train.total_steps",)})
            c.optim.warmup_steps = 3
            self.assertEqual(config_lib.derived_options(c), {})
        full = importlib.import_module("configs.table2").get_config("arch=gdn,opt=adamw")
        self.assertEqual(config_lib.derived_options(full), {})  # the recipe's fixed warm-up
        self.assertEqual(config_lib.derived_options({"train": {"total_steps": 5}}), {})

    def test_unknown_option(self):
        c = self._config().to_dict()
        c["model"]["d_modle"] = 12
        with self.assertRaisesRegex(ValueError, r"unknown option\(s\) model\.d_modle"):
            config_lib.experiment_from_config_dict(c)

    def test_a_config_of_another_kind_is_named(self):
        # Newcomer pass: train.py with a HALO or sweep config said only "config has no 'model'
        # section".
        from configs import halo_smollm2
        from configs.sweeps import table2_small
        with self.assertRaisesRegex(
                config_lib.ConfigError,
                r"^config has no 'model' section: it is a HALO pipeline config \(sections "
                r"teacher, hypenet and one per stage\), which experiments/halo_pipeline\.py "
                r"\(or experiments/halo\.py, one stage at a time\) takes, not a training config "
                r"\(experiments/train\.py's, e\.g\. configs/default\.py\)$"):
            config_lib.experiment_from_config_dict(halo_smollm2.get_config("tiny"))
        with self.assertRaisesRegex(config_lib.ConfigError,
                                    r"^config has no 'model' section: it is a sweep config "
                                    r"\(train_config, grid\), which experiments/sweep\.py takes"):
            config_lib.experiment_from_config_dict(table2_small.get_config("tiny"))
        with self.assertRaisesRegex(config_lib.ConfigError, r"^config has no 'model' section$"):
            config_lib.experiment_from_config_dict({"data": {}})

    def test_sections_given_as_mappings_are_built_and_checked(self):
        # Newcomer pass: ModelConfig(gdn=dict(...)) kept the dict unchecked; a bad key or value
        # surfaced as an AttributeError when the model was built.
        m = config_lib.ModelConfig(gdn=dict(num_k_heads=2), kda={"gate_rank": 8},
                                   routing=dict(mode="cler"), layer_pattern=("gdn",))
        self.assertIsInstance(m.gdn, config_lib.GatedDeltaNetConfig)
        self.assertEqual((m.gdn.num_k_heads, m.gdn.num_v_heads, m.kda.gate_rank), (2, 8, 8))
        self.assertEqual(m.routing.mode, "cler")
        for name in ("attention", "gdn", "deltanet", "kda", "gdn2", "lightning", "linear_attn",
                     "routing"):
            with self.assertRaisesRegex(config_lib.ConfigError,
                                        rf"^unknown option\(s\) model\.{name}\.bogus; known"):
                config_lib.ModelConfig(**{name: dict(bogus=1)})
        with self.assertRaisesRegex(config_lib.ConfigError,
                                    r"^model\.gdn\.chunk_size must be a positive power of two"):
            config_lib.ModelConfig(gdn=dict(chunk_size=48))
        with self.assertRaisesRegex(config_lib.ConfigError,
                                    r"^model\.gdn\.num_k_heads='4' has the wrong type; "
                                    r"expected int$"):
            config_lib.ModelConfig(gdn=dict(num_k_heads="4"))
        with self.assertRaisesRegex(config_lib.ConfigError,
                                    r"^model\.attention\.rope_theta='x' has the wrong type; "
                                    r"expected float or None$"):
            config_lib.ModelConfig(attention=dict(rope_theta="x"))
        with self.assertRaisesRegex(config_lib.ConfigError,
                                    r"^model\.gdn must be a GatedDeltaNetConfig or a mapping"):
            config_lib.ModelConfig(gdn=64)
        # Types are checked before the checks run (2026-12-04 newcomer pass: a truthy "no" tied
        # the embeddings, 3.5 passed the >= 2 check), in sections and at the top level.
        for kw, msg in ((dict(tie_embeddings="no"), r"model\.tie_embeddings='no'.*bool"),
                        (dict(vocab_size=3.5), r"model\.vocab_size=3\.5.*int"),
                        (dict(d_model="128"), r"model\.d_model='128'.*int"),
                        (dict(gdn=dict(num_k_heads=4.0)), r"model\.gdn\.num_k_heads=4\.0.*int"),
                        (dict(gdn=dict(chunk_size=True)), r"model\.gdn\.chunk_size=True.*int")):
            with self.subTest(**{k: str(v) for k, v in kw.items()}), \
                    self.assertRaisesRegex(config_lib.ConfigError, rf"^{msg}$"):
                config_lib.ModelConfig(**kw)
        self.assertEqual(config_lib.ModelConfig(attention=dict(rope_theta=10000)).attention
                         .rope_theta, 10000)  # an int where a float goes is fine
        with self.assertRaisesRegex(config_lib.ConfigError,
                                    r"^unknown option\(s\) model\.lightning\.heads"):
            config_lib.ExperimentConfig(model=dict(lightning=dict(heads=2)),
                                        data=self._config().data.to_dict())


class CommandLineAndRunFileTest(absltest.TestCase):
    """Bad input from the command line or a damaged run directory: one clear error naming it
    (2026-12-04 newcomer pass: a bare --config.model.layer_pattern=gdn trained a one-layer
    model without a word; a truncated config.json gave a JSON traceback without its path)."""

    def test_layer_pattern_must_be_written_as_a_tuple(self):
        check = config_lib.bare_tuple_override
        msg = check(["train.py", "--config=c.py", "--config.model.layer_pattern=gdn"])
        self.assertIn("--config.model.layer_pattern=gdn: write a tuple of mixer names", msg)
        self.assertIn("--config.model.layer_pattern=\"('gdn',)\"", msg)
        msg = check(["t", "--config.model.layer_pattern", "gdn, gdn,attn"])  # the spaced form
        self.assertIn("\"('gdn','gdn','attn')\"", msg)
        for fine in (["t", "--config.model.layer_pattern=('gdn','attn')"],
                     ["t", "--config.model.layer_pattern= ['gdn']"],
                     ["t", "--config.model.d_model=64", "--layer_pattern=gdn"],
                     ["t", "--config=configs/default.py:pattern=pure"]):
            self.assertIsNone(check(fine), fine)

    def test_a_bare_comma_list_of_paths_names_both_ways_to_write_it(self):
        # 2026-12-07 newcomer pass: --config.data.paths=/a,/b gave ml_collections' generic
        # "Error while parsing string ... as tuple", whose suggestion (quote it) reads one path.
        check = config_lib.bare_tuple_override
        self.assertEqual(
            check(["t", "--config.data.paths=/data/a.txt,/data/b.txt"]),
            "--config.data.paths=/data/a.txt,/data/b.txt: write several paths as a tuple, e.g. "
            "--config.data.paths=\"('/data/a.txt','/data/b.txt')\", or give the option once per "
            "path (--config.data.paths=/data/a.txt --config.data.paths=/data/b.txt)")
        self.assertIn("--config.data.paths=\"('/x',)\"", check(["t", "--config.data.paths", "/x,"]))
        for fine in (["t", "--config.data.paths=/a"], ["t", "--config.data.paths=('/a','/b')"],
                     ["t", "--config.data.paths=/a", "--config.data.paths=/b"]):
            self.assertIsNone(check(fine), fine)

    def test_a_tuple_option_given_twice_is_refused(self):
        # ml_collections joined the two tuples: --config.model.layer_pattern="('gdn',)"
        # --config.model.layer_pattern="('attn',)" trained a two-layer ('gdn', 'attn') model,
        # where any other option repeated keeps its last value.
        check = config_lib.repeated_tuple_override
        rng = np.random.default_rng()
        a = "(" + ",".join(repr(m) for m in rng.choice(["gdn", "attn", "kda"], 3)) + ")"
        b = f"('/data/c{rng.integers(100)}',)"
        self.assertEqual(
            check(["t", f"--config.model.layer_pattern={a}", "--config.model.d_model=64",
                   "--config.model.layer_pattern", "('attn',)"]),
            f"--config.model.layer_pattern is given 2 times with tuple values ({a}, ('attn',)): "
            f"ml_collections joins them instead of keeping the last; give it once, with the "
            f"whole tuple")
        self.assertIn("--config.data.paths is given 2 times",
                      check(["t", "--config.data.paths=('/x',)", f"--config.data.paths={b}"]))
        for fine in (["t", f"--config.model.layer_pattern={a}", f"--config.data.paths={b}"],
                     ["t", "--config.train.total_steps=3", "--config.train.total_steps=5"],
                     ["t", "--config.data.paths=/a", "--config.data.paths=/b"],  # one element each
                     ["t", "--config=configs/default.py:pattern=pure"]):
            self.assertIsNone(check(fine), fine)

    def test_run_config_json_errors_name_the_file(self):
        tmp = self.create_tempdir()
        path = tmp.create_file("config.json", '{"model": ').full_path
        with self.assertRaisesRegex(config_lib.ConfigError,
                                    f"^{path} is not valid JSON .*restore it or use a new"):
            config_lib.read_run_config_json(path)
        with open(path, "w") as f:
            f.write("[1, 2]")
        with self.assertRaisesRegex(config_lib.ConfigError, f"^{path} does not hold a JSON"):
            config_lib.read_run_config_json(path)
        with open(path, "w") as f:
            f.write('{"model": {"d_model": 64}}')
        self.assertEqual(config_lib.read_run_config_json(path), {"model": {"d_model": 64}})

    def test_training_refuses_to_overwrite_another_kind_of_run(self):
        from lattn_jax import train as train_lib  # noqa: PLC0415
        tmp = self.create_tempdir()
        halo = '{"teacher": {"kind": "gguf"}, "stage1": {}}'
        path = tmp.create_file("config.json", halo).full_path
        config = config_lib.experiment_from_config_dict(
            importlib.import_module("configs.default").get_config())
        for has_checkpoint in (False, True):
            with self.assertRaisesRegex(config_lib.ConfigError,
                                        f"^{path} is not a training run's config .*a HALO "
                                        f"workdir.*Use another --workdir"):
                train_lib._check_resume_compatible(tmp.full_path, config,
                                                   has_checkpoint=has_checkpoint)
        with open(path) as f:
            self.assertEqual(f.read(), halo)  # untouched
        # train_and_evaluate refuses before writing anything there (2026-12-04 newcomer pass:
        # the lock file, invocations.jsonl, console.log and checkpoints/ came first).
        before = sorted(os.listdir(tmp.full_path))
        with self.assertRaisesRegex(config_lib.ConfigError, "a HALO workdir"):
            train_lib.train_and_evaluate(config, tmp.full_path, print_fn=lambda s: None)
        self.assertEqual(sorted(os.listdir(tmp.full_path)), before)

    def test_restore_names_a_corrupt_config_json(self):
        from lattn_jax.eval import restore  # noqa: PLC0415
        tmp = self.create_tempdir()
        path = tmp.create_file("config.json", '{"model": ').full_path
        with self.assertRaisesRegex(ValueError, f"^{path} is not valid JSON"):
            restore.load_config(tmp.full_path)


if __name__ == "__main__":
    absltest.main()
