"""``restore.model_kind`` / ``load_model``: one loader for training workdirs, HF directories and
GGUF files (issue 33); every bad path gives one error naming it."""

import json
import os
import shlex

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest

from lattn_jax.eval import restore
from lattn_jax.halo import loaders
from tests.lattn_jax.eval import fixtures


class ModelKindTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.root = self.create_tempdir().full_path

    def path(self, *parts):
        return os.path.join(self.root, *parts)

    def write(self, name, content, mode="w"):
        os.makedirs(os.path.dirname(self.path(name)), exist_ok=True)
        with open(self.path(name), mode) as f:
            f.write(content)
        return self.path(name)

    def test_each_kind_is_recognised(self):
        self.assertEqual(restore.model_kind(self.write("m.gguf", b"GGUF\x03\x00", "wb")), "gguf")
        self.write("hf/config.json", json.dumps({"model_type": "llama"}))
        self.write("hf/tokenizer.json", "{}")
        self.assertEqual(restore.model_kind(self.path("hf")), "hf")

    def test_the_hints_quote_a_path_with_a_space_for_the_shell(self):
        # The --checkpoint=<path> to paste was not quoted: a space split it into two words.
        workdir = self.path("my runs é", "default")
        self.write("my runs é/default/config.json", "{}")
        os.makedirs(os.path.join(workdir, "checkpoints", "200"))
        halo = self.path("halo run é")
        self.write("halo run é/config.json", json.dumps({"teacher": {}, "hypenet": {}}))
        os.makedirs(os.path.join(halo, "stage2", "checkpoints", "5"))
        for path, checkpoint, step in (
                (os.path.join(workdir, "checkpoints", "200"), workdir, "200"),
                (os.path.join(workdir, "checkpoints"), workdir, None),
                (os.path.join(halo, "stage2", "checkpoints", "5"), halo, "5"),
                (os.path.join(halo, "stage2"), halo, None)):
            with self.subTest(path=path):
                with self.assertRaises(FileNotFoundError) as ctx:
                    restore.model_kind(path)
                hint = f"--checkpoint={shlex.quote(checkpoint)}"
                hint += f" --step={step}" if step else ""
                self.assertIn(hint, str(ctx.exception))
                self.assertEqual(shlex.split(hint), [f"--checkpoint={checkpoint}"] + (
                    [f"--step={step}"] if step else []))

    def test_a_step_folder_or_a_sweep_root_gets_a_hint(self):
        workdir = self.path("runs", "default")
        self.write("runs/default/config.json", "{}")
        os.makedirs(self.path("runs", "default", "checkpoints", "200", "state"))
        step_dir = self.path("runs", "default", "checkpoints", "200")
        for fn in (restore.model_kind, restore.load):
            with self.subTest(fn=fn.__name__):
                with self.assertRaises(FileNotFoundError) as ctx:
                    fn(step_dir)
                self.assertRegex(str(ctx.exception), "^no config.json in checkpoint directory")
                self.assertTrue(str(ctx.exception).endswith(
                    f"; {step_dir} is a checkpoint step folder: pass --checkpoint={workdir} "
                    f"--step=200"), str(ctx.exception))
                with self.assertRaises(FileNotFoundError) as ctx:
                    fn(os.path.dirname(step_dir))
                self.assertTrue(str(ctx.exception).endswith(
                    f"; pass the workdir above it: --checkpoint={workdir}"), str(ctx.exception))
        sweep = self.path("sweep")
        for name in ("c", "a", "b"):
            self.write(f"sweep/runs/{name}/config.json", "{}")
        os.makedirs(self.path("sweep", "runs", "d"))  # no config.json yet: not offered
        for fn in (restore.model_kind, restore.load):
            with self.assertRaises(FileNotFoundError) as ctx:
                fn(sweep)
            self.assertTrue(str(ctx.exception).endswith(
                f"; {sweep} is a sweep root: pass one of {sweep}/runs/<name> (e.g. "
                f"{sweep}/runs/a, {sweep}/runs/b)"), str(ctx.exception))
        self.write("started/sweep.jsonl", "{}\n")
        with self.assertRaises(FileNotFoundError) as ctx:
            restore.model_kind(self.path("started"))
        self.assertTrue(str(ctx.exception).endswith(
            f"; {self.path('started')} is a sweep root, but none of its runs has a config.json "
            f"yet"), str(ctx.exception))

    def test_bad_paths_are_named(self):
        with self.assertRaisesRegex(FileNotFoundError, "no such checkpoint: .*/none \\(expected "
                                                       "a lattn-jax training workdir"):
            restore.model_kind(self.path("none"))
        with self.assertRaisesRegex(ValueError, "notes.txt is a file but not a GGUF file"):
            restore.model_kind(self.write("notes.txt", "hello"))
        os.makedirs(self.path("empty"))
        with self.assertRaisesRegex(FileNotFoundError, "no config.json in checkpoint directory "
                                                       ".*/empty"):
            restore.model_kind(self.path("empty"))
        # Loading a training workdir: a missing directory is said to be missing, an existing
        # one without config.json is said to lack it.
        with self.assertRaisesRegex(FileNotFoundError, "no such checkpoint directory: .*/none"):
            restore.load(self.path("none"))
        with self.assertRaisesRegex(FileNotFoundError, "no config.json in checkpoint directory "
                                                       ".*/empty"):
            restore.load(self.path("empty"))
        self.write("hf/config.json", json.dumps({"model_type": "llama"}))
        with self.assertRaisesRegex(FileNotFoundError, "hf/tokenizer.json: no such file"):
            restore.model_kind(self.path("hf"))
        self.write("bad/config.json", "{not json")
        with self.assertRaisesRegex(ValueError, "bad/config.json is not valid JSON"):
            restore.model_kind(self.path("bad"))
        # Another kind of run's config.json: its kind and the binary that takes it (newcomer
        # pass: "config has no 'model' section").
        self.write("halo/config.json", json.dumps({"teacher": {}, "hypenet": {}, "stage1": {}}))
        with self.assertRaisesRegex(
                ValueError, r"^.*/halo/config\.json is a HALO pipeline's config, not a "
                            r"training run's: .*/halo is a HALO workdir, whose student the "
                            r"pipeline's report stage evaluates \(experiments/"
                            r"halo_pipeline\.py --stages=report\) and load_model loads"):
            restore.load(self.path("halo"))
        # load_model takes it once Stage 2 has written the student (restore_halo_test.py).
        with self.assertRaisesRegex(FileNotFoundError, r"^.*/halo is a HALO workdir without a "
                                                       r"converted student"):
            restore.model_kind(self.path("halo"))
        self.write("sweep/config.json", json.dumps({"train_config": "configs/table2.py"}))
        with self.assertRaisesRegex(ValueError, r"sweep/config\.json is not a training run's "
                                                r"config \(it has no 'model' section; it is a "
                                                r"sweep config .*, which experiments/sweep\.py "
                                                r"takes\)"):
            restore.model_kind(self.path("sweep"))
        # A config.json without model_type is a training workdir's, and must validate.
        self.write("run/config.json", json.dumps({"model": {"vocab_size": "many"}}))
        with self.assertRaises(ValueError):
            restore.model_kind(self.path("run"))


class LoadModelTest(absltest.TestCase):

    def test_gguf_file(self):
        path = fixtures.write_tiny_gguf(os.path.join(self.create_tempdir().full_path, "t.gguf"))
        restored = restore.load_model(path)
        self.assertEqual((restored.kind, restored.step, restored.config, restored.path),
                         ("gguf", None, None, path))
        self.assertIsNone(restored.training_data)
        self.assertEqual(restored.describe(), "GGUF file")
        # Padding-safe batched generation: the padding is its own segment.
        self.assertTrue(restored.model_config.use_segment_ids)
        tok = restored.tokenizer
        self.assertEqual((tok.vocab_size, tok.bos_id, tok.eos_id), (268, 266, 267))
        ids = tok.encode("Question: the water?\nAnswer: the")
        self.assertEqual(tok.decode(ids), "Question: the water?\nAnswer: the")
        teacher = loaders.load_gguf(path)
        ref = loaders.build_model(teacher.model_config, teacher.params)
        np.testing.assert_array_equal(np.asarray(restored.model(jnp.asarray([ids]))),
                                      np.asarray(ref(jnp.asarray([ids]))))
        with self.assertRaisesRegex(ValueError, "step=3: a checkpoint step applies to lattn-jax "
                                                "training and HALO workdirs only; .*t.gguf is a "
                                                "GGUF file"):
            restore.load_model(path, 3)

    def test_a_run_without_a_readable_checkpoint_gives_a_readers_advice(self):
        # generate.py/evaluate.py on a run whose checkpoints are all unreadable ended in the
        # trainer's "Move the directory away or use a new --workdir.": neither has --workdir.
        from configs import table7
        from lattn_jax import config as config_lib
        from lattn_jax import train as train_lib
        workdir = self.create_tempdir().full_path
        config = config_lib.experiment_from_config_dict(
            table7.get_config(f"host=gdn,route=clvr,tiny,seed={np.random.randint(1, 99)}"))
        ckpt = restore.checkpoint_lib.Checkpointer(workdir, async_save=False)
        ckpt.save(3, jax.tree_util.tree_map(lambda a: jnp.zeros(a.shape, a.dtype),
                                            train_lib.Trainer(config).abstract_state()))
        ckpt.close()
        with open(os.path.join(workdir, "config.json"), "w") as f:
            json.dump(config_lib.experiment_json_dict(config), f)
        directory = os.path.join(workdir, "checkpoints")
        os.remove(os.path.join(directory, "3", "state", "_METADATA"))
        with self.assertRaises(restore.checkpoint_lib.CheckpointError) as cm:
            restore.load_model(workdir)
        self.assertEqual(str(cm.exception), (
            f"no readable checkpoint in {directory}: step 3 (state/_METADATA is missing). "
            f"There is no model to restore: copy its checkpoints back from a backup, or train "
            f"it again."))

    def test_a_reused_sweep_run_names_the_run_that_holds_its_checkpoints(self):
        # A Table 7 host run reused from Table 2 (sweep --reuse_from) holds records only:
        # generate.py/evaluate.py said "no checkpoint in .../checkpoints" and no more.
        from configs import table7
        from lattn_jax import config as config_lib
        from lattn_jax import sweep
        root = self.create_tempdir().full_path
        source = os.path.join(root, "t2", "runs", f"arch=gdn,seed={np.random.randint(40, 99)}")
        workdir = os.path.join(root, "t7", "runs", "route=none,seed=42")
        os.makedirs(workdir)
        config = config_lib.experiment_from_config_dict(
            table7.get_config("host=gdn,route=none,tiny"))
        with open(os.path.join(workdir, "config.json"), "w") as f:
            json.dump(config_lib.experiment_json_dict(config), f)
        with open(os.path.join(workdir, sweep.RUN_RECORD), "w") as f:
            json.dump({"name": "route=none,seed=42", sweep.REUSED_KEY: source}, f)
        with self.assertRaises(FileNotFoundError) as cm:
            restore.load_model(workdir)
        self.assertEqual(str(cm.exception), (
            f"no checkpoint in {workdir}/checkpoints: a sweep's --reuse_from copied this run's "
            f"records from {source}, not its checkpoints; load that run instead"))


if __name__ == "__main__":
    absltest.main()
