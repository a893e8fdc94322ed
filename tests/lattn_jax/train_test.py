"""Training loop: loss goes down, checkpoints round-trip, interrupted runs resume exactly."""

import dataclasses
import fcntl
import gzip
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from unittest import mock

import numpy as np
import jax
import jax.numpy as jnp
import ml_collections
import pytest
from absl.testing import absltest

from lattn_jax import checkpoint as checkpoint_lib
from lattn_jax import config as config_lib
from lattn_jax import data as data_lib
from lattn_jax import optim
from lattn_jax import train
from lattn_jax.data import shards as shards_lib

WORDS = ("the cat sat on a mat while dogs ran past old red barns and small birds sang "
         "under bright skies near quiet rivers").split()


def write_corpus(directory, n_docs=40, seed=0):
    """A small random-word corpus, documents separated by blank lines."""
    rng = np.random.default_rng(seed)
    docs = [" ".join(rng.choice(WORDS, size=rng.integers(20, 60))) for _ in range(n_docs)]
    path = os.path.join(directory, "corpus.txt")
    with open(path, "w") as f:
        f.write("\n\n".join(docs))
    return path


def tiny_experiment(path, **train_overrides):
    model = config_lib.ModelConfig(
        vocab_size=257, d_model=32, layer_pattern=("gdn", "attn"), mlp_hidden=64,
        attention=config_lib.AttentionConfig(num_heads=2, num_kv_heads=1, output_gate=True),
        gdn=config_lib.GatedDeltaNetConfig(num_k_heads=1, num_v_heads=2, head_k_dim=16,
                                           head_v_dim=16, chunk_size=16))
    data = data_lib.DataConfig(paths=(path,), doc_split="blank_line", tokenizer="byte",
                               seq_len=32, batch_size=4, val_fraction=0.1, seed=0,
                               max_val_batches=2)
    optim_cfg = config_lib.OptimConfig(learning_rate=3e-3, warmup_steps=2)
    tcfg = dict(total_steps=6, eval_every=3, checkpoint_every=3, log_every=2, seed=0)
    tcfg.update(train_overrides)
    return config_lib.ExperimentConfig(model=model, data=data, optim=optim_cfg,
                                       train=config_lib.TrainConfig(**tcfg))


def batch_with_random_weights(config, seed, keep):
    """The first training batch of ``config`` with each weight 1 with probability ``keep``,
    else 0 (numpy ``default_rng(seed)``)."""
    batch = next(data_lib.build_datasets(config.data).train_iter)
    rng = np.random.default_rng(seed)
    return dict(batch, weights=(rng.random(batch["weights"].shape) < keep).astype(np.float32))


def _drop_recorded_option(workdir, section, key):
    """Removes ``section.key`` from the run's ``config.json``: a record written before the
    option existed."""
    path = os.path.join(workdir, "config.json")
    with open(path) as f:
        saved = json.load(f)
    del saved[section][key]
    with open(path, "w") as f:
        json.dump(saved, f)


def _write_text(path, text):
    with open(path, "w") as f:
        f.write(text)


def _leaf(tree, path):
    """The leaf of ``tree`` at a ``tree_flatten_with_path`` path."""
    for key in path:
        tree = tree[key.key if hasattr(key, "key") else key.idx]
    return tree


class CorpusTestCase(absltest.TestCase):
    """A test case with a fresh temporary directory ``self.tmp`` holding a small corpus
    (``self.corpus``, from :func:`write_corpus`)."""

    def setUp(self):
        super().setUp()
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = self._tmp.name
        self.corpus = write_corpus(self.tmp)

    def tearDown(self):
        self._tmp.cleanup()
        super().tearDown()


class TrainTest(CorpusTestCase):

    def test_train_steps_lower_the_loss_on_a_fixed_batch(self):
        cfg = tiny_experiment(self.corpus)
        cfg = config_lib.ExperimentConfig(
            model=cfg.model, data=cfg.data, train=cfg.train,
            optim=config_lib.OptimConfig(learning_rate=1e-2, warmup_steps=0, schedule="cosine"))
        trainer = train.Trainer(cfg)
        state = trainer.init_state(0)
        batch = train._to_jax(next(data_lib.build_datasets(cfg.data).train_iter))
        losses = []
        for _ in range(8):
            state, metrics = trainer.train_step(state, batch)
            losses.append(float(metrics["loss"]))
        self.assertLess(losses[-1], losses[0] - 0.5, losses)
        self.assertEqual(int(state["step"]), 8)

    def test_gradient_accumulation_equals_one_pass(self):
        """Micro-batches of 1 row (4 micro-steps) against the whole batch at once: the loss is
        the token mean over the whole batch (random 0/1 weights make the rows' token counts
        unequal, so averaging per-micro-batch means would differ), the gradients match, and
        evaluation sums the same tokens."""
        batch = batch_with_random_weights(tiny_experiment(self.corpus), 3, 0.6)
        results, params = {}, None
        for micro in (None, 1):
            trainer = train.Trainer(tiny_experiment(self.corpus, micro_batch_size=micro))
            self.assertEqual(trainer.accum_steps, {None: 1, 1: 4}[micro])
            if params is None:  # the same model and seed: the same initial parameters
                params = trainer.init_state(0)["params"]
            loss, grads = jax.jit(trainer.loss_and_grads)(params, train._to_jax(batch))
            total, count, _, _ = trainer.eval_step(params, batch)
            results[micro] = (float(loss), grads, float(total), float(count))
        ref = results[None]
        self.assertEqual(ref[3], float(batch["weights"].sum()))
        # The weights matter: on this batch the mean of the four rows' own means differs from
        # the token mean by ~4e-4 nats (measured 2026-11-30), ~70x the tolerance below.
        got = results[1]
        np.testing.assert_allclose(got[0], ref[0], rtol=1e-6)
        np.testing.assert_allclose(got[2], ref[2], rtol=1e-6)
        self.assertEqual(got[3], ref[3])
        for path, g in jax.tree_util.tree_flatten_with_path(got[1])[0]:
            r = _leaf(ref[1], path)
            np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-5,
                                       atol=1e-6 * float(np.max(np.abs(r))),
                                       err_msg=jax.tree_util.keystr(path))

    def test_evaluation_leaves_out_and_counts_nonfinite_padding(self):
        """A NaN in a zero-weight padding row must not make the validation loss NaN (2026-12-03:
        intermittent NaN val losses on the H200 with finite training losses), and is counted;
        a NaN at a real position does make it NaN and is counted as such. Reference: the
        weighted mean of the unpatched token losses over the real positions, from optax."""
        import optax
        params = None
        for micro in (None, 1):
            trainer = train.Trainer(tiny_experiment(self.corpus, micro_batch_size=micro))
            if params is None:  # the same model and seed: the same initial parameters
                params = trainer.init_state(0)["params"]
            batch = batch_with_random_weights(trainer.config, 5, 0.8)
            weights = batch["weights"]
            weights[2] = 0.0  # an all-zero padding row, as data.pipeline pads the last batch
            clean = np.asarray(jax.jit(trainer.logits)(params, train._to_jax(batch)))
            ce = np.asarray(optax.softmax_cross_entropy_with_integer_labels(
                clean, batch["targets"]))
            want = float(np.sum(ce * weights) / np.sum(weights))
            pad = weights == 0  # [B, T]: row 2 and the scattered zero weights
            original = trainer.logits
            trainer.logits = lambda p, b: jnp.where(  # b: a micro-batch under micro=1
                (b["weights"] == 0)[..., None], jnp.nan, original(p, b))
            trainer._eval_step_jit = jax.jit(trainer._eval_step)
            got = trainer.evaluate_counts(params, [batch])
            self.assertAlmostEqual(got.loss, want, places=5)
            self.assertEqual((got.tokens, got.nonfinite, got.nonfinite_padding),
                             (float(weights.sum()), 0, int(pad.sum())))
            if micro:
                continue
            real = np.argwhere(~pad)[0]
            trainer.logits = lambda p, b: original(p, b).at[real[0], real[1], 0].set(jnp.inf)
            trainer._eval_step_jit = jax.jit(trainer._eval_step)
            got = trainer.evaluate_counts(params, [batch])
            self.assertFalse(np.isfinite(got.loss))
            self.assertEqual((got.nonfinite, got.nonfinite_padding), (1, 0))
            # cross_entropy_loss, which training and HALO use, masks the same way.
            _, total, count = train.cross_entropy_loss(
                jnp.where(jnp.asarray(pad)[..., None], jnp.nan, jnp.asarray(clean)),
                batch["targets"], jnp.asarray(weights))
            self.assertAlmostEqual(float(total / count), want, places=5)

    def test_fused_loss_head_equals_the_plain_one(self):
        """train.loss_chunk_size: the fused head's loss and gradients equal the plain head's
        (fp32 model, so both form the same fp32 logits), with uneven chunks (7 tokens: the last
        padded) and with gradient accumulation; a bad value is one ConfigError."""
        import dataclasses
        # One attention layer: the option changes only the head and the loss, whose cotangent
        # reaches every layer the same way; the GDN layer of tiny_experiment only doubled the
        # compile time of the six programs below.
        base = tiny_experiment(self.corpus)
        base = dataclasses.replace(base, model=dataclasses.replace(
            base.model, dtype="float32", layer_pattern=("attn",)))
        batch = batch_with_random_weights(base, 4, 0.7)
        out, params = {}, None
        for chunk in (None, 7):
            for micro in (None, 1):
                cfg = dataclasses.replace(base, train=dataclasses.replace(
                    base.train, loss_chunk_size=chunk, micro_batch_size=micro))
                trainer = train.Trainer(cfg)
                if params is None:  # the same model and seed: the same initial parameters
                    params = trainer.init_state(0)["params"]
                out[chunk, micro] = jax.jit(trainer.loss_and_grads)(params, train._to_jax(batch))
        ref_loss, ref_grads = out[None, None]
        for key in ((7, None), (7, 1), (None, 1)):
            loss, grads = out[key]
            np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-6, err_msg=key)
            for path, g in jax.tree_util.tree_flatten_with_path(grads)[0]:
                r = np.asarray(_leaf(ref_grads, path))
                np.testing.assert_allclose(np.asarray(g), r, rtol=1e-4,
                                           atol=1e-6 * np.abs(r).max() + 1e-9,
                                           err_msg=f"{key} {jax.tree_util.keystr(path)}")
        # The option does switch the head: in bf16 the plain head rounds the logits to bf16
        # before the loss and the fused one does not, so the two losses differ, a little.
        losses_bf16, params = [], None
        for chunk in (None, 7):
            cfg = dataclasses.replace(tiny_experiment(self.corpus), train=dataclasses.replace(
                base.train, loss_chunk_size=chunk))
            cfg = dataclasses.replace(cfg, model=dataclasses.replace(
                base.model, dtype="bfloat16"))
            trainer = train.Trainer(cfg)
            if params is None:
                params = trainer.init_state(0)["params"]
            losses_bf16.append(float(jax.jit(trainer.loss_and_grads)(
                params, train._to_jax(batch))[0]))
        self.assertNotEqual(losses_bf16[0], losses_bf16[1])
        np.testing.assert_allclose(losses_bf16[1], losses_bf16[0], rtol=1e-2)
        for bad in (0, 2.5, True):
            with self.assertRaisesRegex(config_lib.ConfigError, "train.loss_chunk_size"):
                config_lib.TrainConfig(loss_chunk_size=bad)

    def test_micro_batch_size_must_divide_the_batch(self):
        with self.assertRaisesRegex(config_lib.ConfigError,
                                    r"data.batch_size=4 .*train.micro_batch_size"):
            train.Trainer(tiny_experiment(self.corpus, micro_batch_size=3))
        with self.assertRaisesRegex(config_lib.ConfigError, "train.micro_batch_size"):
            tiny_experiment(self.corpus, micro_batch_size=0)

    def test_checkpoint_round_trip_restores_params_optimizer_step_and_data(self):
        cfg = tiny_experiment(self.corpus)
        trainer = train.Trainer(cfg)
        ds = data_lib.build_datasets(cfg.data)
        state = trainer.init_state(0)
        for _ in range(2):
            state, _ = trainer.train_step(state, train._to_jax(next(ds.train_iter)))
        ckpt = checkpoint_lib.Checkpointer(os.path.join(self.tmp, "w"))
        ckpt.save(2, state, ds.train_iter)
        ckpt.wait()
        expected_next = next(ds.train_iter)

        fresh_ds = data_lib.build_datasets(cfg.data)
        restored = ckpt.restore(2, trainer.abstract_state(), fresh_ds.train_iter)
        ckpt.close()
        jax.tree_util.tree_map(np.testing.assert_array_equal, restored, state)
        self.assertEqual(int(restored["step"]), 2)
        got_next = next(fresh_ds.train_iter)
        for key in expected_next:
            np.testing.assert_array_equal(got_next[key], expected_next[key])

    @pytest.mark.entry
    @pytest.mark.slow  # ~30 s; train_robustness_test covers kill + SIGTERM resume in CI
    def test_interrupted_run_resumes_exactly(self):
        lines = []
        straight = train.train_and_evaluate(tiny_experiment(self.corpus),
                                            os.path.join(self.tmp, "a"), print_fn=lines.append)
        self.assertEqual(straight["resumed_from"], -1)
        self.assertEqual(straight["step"], 6)

        workdir = os.path.join(self.tmp, "b")
        first = train.train_and_evaluate(tiny_experiment(self.corpus, max_steps_per_run=4),
                                         workdir, print_fn=lines.append)
        self.assertEqual(first["step"], 4)
        lines.clear()
        second = train.train_and_evaluate(tiny_experiment(self.corpus), workdir,
                                          print_fn=lines.append)
        self.assertEqual(second["resumed_from"], 4)
        self.assertTrue(any(line.startswith("Resuming from the checkpoint at step 4")
                            for line in lines), lines)
        self.assertEqual(second["step"], 6)
        np.testing.assert_allclose(second["val_loss"], straight["val_loss"], rtol=1e-6)

        lines.clear()
        third = train.train_and_evaluate(tiny_experiment(self.corpus), workdir,
                                         print_fn=lines.append)
        self.assertEqual((third["resumed_from"], third["already_finished"]), (6, True))
        self.assertEqual(third["val_loss"], second["val_loss"])
        self.assertTrue(lines[-1].startswith("run already finished at step 6"), lines)
        self.assertFalse([line for line in lines if line.startswith("final:")], lines)
        with open(os.path.join(workdir, "metrics.jsonl")) as f:
            records = [json.loads(line) for line in f]
        self.assertGreater(len(records), 3)
        self.assertEqual([r["step"] for r in records if "val_loss" in r].count(6), 1)

    def test_throughput_leaves_out_evaluation_and_checkpoint_time(self):
        # Newcomer finding (2026-12-07d): the window after an evaluation or a save counted
        # its time as training (25 tok/s printed where the steps ran at ~2,000). A fake clock
        # that jumps 1,000 s in every evaluation and every save: no step time may see it.
        offset = [0.0]
        real_clock = time.perf_counter

        def clock():
            return real_clock() + offset[0]

        def jump(real):
            def wrapped(*args, **kwargs):
                offset[0] += 1000.0
                return real(*args, **kwargs)
            return wrapped

        workdir = os.path.join(self.tmp, "clock")
        cfg = tiny_experiment(self.corpus, total_steps=8, eval_every=2, checkpoint_every=4,
                              log_every=2)
        with mock.patch.object(train.time, "perf_counter", clock), \
                mock.patch.object(train.Trainer, "evaluate_counts",
                                  jump(train.Trainer.evaluate_counts)), \
                mock.patch.object(train.checkpoint_lib.Checkpointer, "save",
                                  jump(train.checkpoint_lib.Checkpointer.save)):
            train.train_and_evaluate(cfg, workdir, print_fn=lambda s: None)
        self.assertGreaterEqual(offset[0], 5000.0)  # three evaluations, two saves at least
        with open(os.path.join(workdir, "metrics.jsonl")) as f:
            times = [r["step_time"] for r in map(json.loads, f) if r.get("step_time")]
        self.assertGreaterEqual(len(times), 3)
        self.assertLess(max(times), 100.0, times)

    def test_resume_refuses_a_different_model(self):
        workdir = os.path.join(self.tmp, "c")
        train.train_and_evaluate(tiny_experiment(self.corpus, total_steps=1), workdir,
                                 print_fn=lambda s: None)
        cfg = tiny_experiment(self.corpus, total_steps=2)
        cfg = config_lib.ExperimentConfig(
            model=config_lib.ModelConfig(**{**cfg.model.__dict__, "d_model": 48}),
            data=cfg.data, optim=cfg.optim, train=cfg.train)
        with self.assertRaisesRegex(config_lib.ConfigError, r"model\.d_model \(32 -> 48\)"):
            train.train_and_evaluate(cfg, workdir, print_fn=lambda s: None)


class ResumeChecksTest(absltest.TestCase):
    """Resume checks. The class shares one corpus (``self.corpus``; a test that rewrites it
    puts it back) and one finished one-step run of ``tiny_experiment(self.corpus,
    total_steps=1)``, trained at its first use: :meth:`copy_of_one_step_run` gives each test
    its own copy of that run directory, whose config and data records name the shared corpus.
    Training that run was most of each such test's time."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls._class_tmp = tempfile.TemporaryDirectory()
        cls.corpus = write_corpus(cls._class_tmp.name)
        cls._one_step_run = None

    @classmethod
    def tearDownClass(cls):
        cls._class_tmp.cleanup()
        super().tearDownClass()

    def setUp(self):
        super().setUp()
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()
        super().tearDown()

    def copy_of_one_step_run(self, name):
        """``<self.tmp>/<name>``: a copy of the class's finished run of
        ``tiny_experiment(self.corpus, total_steps=1)`` (trained here at the first call)."""
        cls = type(self)
        if cls._one_step_run is None:
            run = os.path.join(cls._class_tmp.name, "one_step_run")
            train.train_and_evaluate(tiny_experiment(cls.corpus, total_steps=1), run,
                                     print_fn=lambda s: None)
            cls._one_step_run = run
        workdir = os.path.join(self.tmp, name)
        shutil.copytree(cls._one_step_run, workdir)
        return workdir

    def test_the_lock_file_is_there_only_while_a_run_trains(self):
        # .train.lock stayed in every workdir a run had used, finished or stopped.
        from lattn_jax import sweep  # noqa: PLC0415 (how a sweep tells a trainer is running)
        workdir = self.copy_of_one_step_run("l")
        lock = os.path.join(workdir, train.WORKDIR_LOCK)
        self.assertFalse(os.path.exists(lock))  # the finished run's: none left
        seen = []

        def watch(line):  # the first progress line: training under the lock
            if not seen:
                seen.append((os.path.exists(lock), sweep.trainer_lock_owner(workdir)))

        # Resumed, then stopped after one step by the run's own limit (a clean stop).
        result = train.train_and_evaluate(
            tiny_experiment(self.corpus, total_steps=3, max_steps_per_run=1), workdir,
            print_fn=watch)
        self.assertEqual((result["resumed_from"], result["step"]), (1, 2))
        self.assertEqual(seen, [(True, str(os.getpid()))])  # held: a sweep leaves it alone
        self.assertFalse(os.path.exists(lock))
        self.assertIsNone(sweep.trainer_lock_owner(workdir))

    def test_a_resume_reads_config_json_once_under_the_lock(self):
        # It read it three times there (the early and the late resume check, the resume-free
        # options' note), besides the check of the workdir's kind before the lock.
        workdir = self.copy_of_one_step_run("c")
        path = os.path.join(workdir, "config.json")
        lines = []
        with mock.patch.object(config_lib, "read_run_config_json",
                               wraps=config_lib.read_run_config_json) as read:
            result = train.train_and_evaluate(tiny_experiment(self.corpus, total_steps=2),
                                              workdir, print_fn=lines.append)
        self.assertEqual((result["resumed_from"], result["step"]), (1, 2))
        self.assertEqual([c.args for c in read.call_args_list], [(path,), (path,)])
        # What the read is for still happens: a changed schedule option is reported.
        self.assertTrue(any(line.startswith("warning: resuming with optimizer/schedule options")
                            and "train.total_steps (1 -> 2)" in line for line in lines), lines)

    def test_changed_data_stream_is_refused(self):
        workdir = self.copy_of_one_step_run("d")
        cfg = tiny_experiment(self.corpus, total_steps=2)
        data = data_lib.DataConfig(**{**cfg.data.__dict__, "seq_len": 16})
        cfg = config_lib.ExperimentConfig(model=cfg.model, data=data, optim=cfg.optim,
                                          train=cfg.train)
        # Refused before the data is read (it was refused after: minutes on a large corpus).
        with mock.patch.object(data_lib, "build_datasets", side_effect=AssertionError("read")):
            with self.assertRaisesRegex(config_lib.ConfigError,
                                        r"data\.seq_len \(32 -> 16\)"):
                train.train_and_evaluate(cfg, workdir, print_fn=lambda s: None)

    def test_changed_train_seed_is_refused_and_an_older_record_without_it_resumes(self):
        # train.seed seeds only the initial parameters: a resume ignored a new one without a
        # word, while invocations.jsonl recorded it (2026-12-06 newcomer pass).
        workdir = self.copy_of_one_step_run("s")
        cfg = tiny_experiment(self.corpus, total_steps=2)
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, seed=5))
        with mock.patch.object(data_lib, "build_datasets", side_effect=AssertionError("read")):
            with self.assertRaisesRegex(config_lib.ConfigError,
                                        r"options that differ: train\.seed \(0 -> 5\)\. Use a "
                                        r"new --workdir"):
                train.train_and_evaluate(cfg, workdir, print_fn=lambda s: None)
        # A config.json written before train.seed was recorded: nothing to compare, resumes.
        _drop_recorded_option(workdir, "train", "seed")
        self.assertEqual(train._check_resume_compatible(workdir, cfg, has_checkpoint=True),
                         ["train.total_steps (1 -> 2)"])

    def test_a_run_resumes_with_the_swiglu_packed_and_split_projections_switched(self):
        # Both form the same parameters' products otherwise (MOSAIC_GPU.md Sec. 46.2's packed
        # SwiGLU; the split column blocks): a resume may switch them, silently (same values),
        # and the checkpoint restores into the other form and trains on.
        workdir = self.copy_of_one_step_run("p")
        base = tiny_experiment(self.corpus, total_steps=2)
        self.assertEqual((base.model.swiglu_packed, base.model.split_projections),
                         (False, False))
        with open(os.path.join(workdir, "config.json")) as f:
            self.assertIs(json.load(f)["model"]["swiglu_packed"], False)
        for packed, split in ((True, False), (True, True), (False, True)):
            cfg = dataclasses.replace(base, model=dataclasses.replace(
                base.model, swiglu_packed=packed, split_projections=split))
            self.assertEqual(train._check_resume_compatible(workdir, cfg, has_checkpoint=True),
                             ["train.total_steps (1 -> 2)"], (packed, split))
            # ... not silently (a newcomer, 2026-12-07d): the resume notes each switch.
            self.assertEqual(train._resume_free_changes(workdir, cfg),
                             [f"model.{name} ({old!r} -> {new!r})"
                              for name, old, new in (("split_projections", False, split),
                                                     ("swiglu_packed", False, packed))
                              if old != new], (packed, split))
        # norm_implementation: the same norms by XLA or by the Pallas kernels (the check only:
        # "pallas" needs a GPU to train on).
        cfg = dataclasses.replace(base, model=dataclasses.replace(
            base.model, norm_implementation="pallas"))
        self.assertEqual(train._check_resume_compatible(workdir, cfg, has_checkpoint=True),
                         ["train.total_steps (1 -> 2)"])
        # A config.json written before the option: nothing to compare either.
        _drop_recorded_option(workdir, "model", "swiglu_packed")
        cfg = dataclasses.replace(base, model=dataclasses.replace(base.model, swiglu_packed=True))
        self.assertEqual(train._check_resume_compatible(workdir, cfg, has_checkpoint=True),
                         ["train.total_steps (1 -> 2)"])
        lines = []
        out = train.train_and_evaluate(cfg, workdir, print_fn=lines.append)
        self.assertEqual((out["resumed_from"], out["step"]), (1, 2))
        self.assertTrue(np.isfinite(out["train_loss"]))
        warned = [x for x in lines if x.startswith("warning: resuming")]
        self.assertLen(warned, 1, lines)
        self.assertNotIn("swiglu_packed", warned[0])
        # The start recorded no swiglu_packed (deleted above): nothing to note.
        self.assertFalse([x for x in lines if x.startswith("note: resuming")], lines)

    def test_a_data_file_rebuilt_with_other_contents_is_refused_on_resume(self):
        # The corpus at the same path was rebuilt (same options, other documents): the run
        # resumed on other data from the restored iterator position without a word.
        workdir = self.copy_of_one_step_run("f")
        with open(self.corpus) as f:
            text = f.read()
        self.addCleanup(_write_text, self.corpus, text)  # the class's corpus, as it was
        cfg = tiny_experiment(self.corpus, total_steps=2)
        same_size = (r"same size \(\d+ bytes\), other contents: the SHA-256 of its first and "
                     r"last MiB differs")
        for changed, what in ((text[::-1], same_size),
                              (text + "\n\nmore words", r"size \d+ -> \d+ bytes")):
            with open(self.corpus, "w") as f:
                f.write(changed)
            with mock.patch.object(data_lib, "build_datasets",
                                   side_effect=AssertionError("read")):
                with self.assertRaisesRegex(config_lib.ConfigError, (
                        rf"^data\.paths: {re.escape(self.corpus)} changed since the run in "
                        rf"{re.escape(workdir)} started \({what}\); resuming would train on "
                        rf"other data\. Use a new --workdir or the original file, or remove "
                        rf"{re.escape(os.path.join(workdir, train.DATA_FINGERPRINT))} to resume "
                        rf"on the new contents deliberately\.$")):
                    train.train_and_evaluate(cfg, workdir, print_fn=lambda s: None)
        # Deliberately: without the record the run resumes, and records the new contents.
        os.remove(os.path.join(workdir, train.DATA_FINGERPRINT))
        out = train.train_and_evaluate(cfg, workdir, print_fn=lambda s: None)
        self.assertEqual((out["resumed_from"], out["step"]), (1, 2))
        with open(os.path.join(workdir, train.DATA_FINGERPRINT)) as f:
            recorded = json.load(f)
        self.assertEqual(recorded["data.paths"][self.corpus]["bytes"],
                         os.path.getsize(self.corpus))
        # The same contents written again (a new mtime): not a change.
        with open(self.corpus, "w") as f:
            f.write(text + "\n\nmore words")
        out = train.train_and_evaluate(tiny_experiment(self.corpus, total_steps=3), workdir,
                                       print_fn=lambda s: None)
        self.assertEqual((out["resumed_from"], out["step"]), (2, 3))

    def test_a_changed_validation_file_is_not_called_other_training_data(self):
        # A data.val_paths file changed: the refusal said "resuming would train on other
        # data", which it would not; it would validate on other documents.
        workdir = self.create_tempdir().full_path
        rng = np.random.default_rng()
        size = int(rng.integers(1000, 9000))
        record = {"version": train._FINGERPRINT_VERSION, "data.paths": {"/d/t.txt": {"b": 1}},
                  "data.val_paths": {"/d/v.txt": {"bytes": size}}}
        with open(os.path.join(workdir, train.DATA_FINGERPRINT), "w") as f:
            json.dump(record, f)
        now = dict(record, **{"data.val_paths": {"/d/v.txt": {"bytes": size + 17}}})
        with self.assertRaises(config_lib.ConfigError) as cm:
            train._check_data_unchanged(workdir, lambda: now, has_checkpoint=True)
        self.assertEqual(str(cm.exception), (
            f"data.val_paths: /d/v.txt changed since the run in {workdir} started (size {size} "
            f"-> {size + 17} bytes); resuming would validate on other documents than its "
            f"earlier evaluations. Use a new --workdir or the original file, or remove "
            f"{os.path.join(workdir, train.DATA_FINGERPRINT)} to resume on the new contents "
            f"deliberately."))

    def test_a_file_named_twice_is_read_once_and_an_older_run_reading_it_twice_not_resumed(
            self):
        # data.paths=("<dir>", "<dir>/corpus.txt") read the file twice: copies of the
        # validation documents in the training split, without a word.
        data_dir = os.path.join(self.tmp, "data")
        os.makedirs(data_dir)
        corpus = write_corpus(data_dir, n_docs=int(np.random.default_rng().integers(30, 60)))
        paths = (data_dir, corpus)[::int(np.random.default_rng().choice([1, -1]))]

        def run(workdir, total_steps, paths=paths):
            cfg = tiny_experiment(corpus, total_steps=total_steps)
            cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, paths=paths))
            lines = []
            train.train_and_evaluate(cfg, workdir, print_fn=lines.append)
            return lines

        once = [x for x in run(os.path.join(self.tmp, "once"), 1, (corpus,))
                if x.startswith("data: ")]
        workdir = os.path.join(self.tmp, "twice")
        lines = [x for x in run(workdir, 1) if x.startswith("data: ")]
        dropped = f"data.paths {corpus} (named twice)"  # the directory's path is the same
        self.assertEqual(lines, [f"data: read once, dropped as duplicates of an earlier entry "
                                 f"(the same real file): {dropped}"] + once)
        self.assertIn(f"Resuming from the checkpoint at step 1 in {workdir}/checkpoints (data "
                      f"iterator restored)", run(workdir, 2))  # recorded as read once: resumes
        # A run recorded before duplicates were dropped (no mark, or no record) read the file
        # twice: resuming on the deduplicated stream is refused, before the data is read.
        record = os.path.join(workdir, train.DATA_FINGERPRINT)
        with open(record) as f:
            saved = json.load(f)
        self.assertIs(saved.pop(train._DISTINCT_FILES), True)
        for older in (saved, None):
            if older is None:
                os.remove(record)
            else:
                with open(record, "w") as f:
                    json.dump(older, f)
            with mock.patch.object(data_lib, "build_datasets",
                                   side_effect=AssertionError("read")):
                with self.assertRaisesRegex(config_lib.ConfigError, (
                        rf"^data\.paths: {re.escape(corpus)} is named twice; the run in "
                        rf"{re.escape(workdir)} started when such a file was read twice .*"
                        rf"resuming would train on another document stream\. Use a new "
                        rf"--workdir\.$")):
                    run(workdir, 3)

    def test_token_shard_directories_are_not_listed_as_files_for_duplicates(self):
        # A token-shard directory is read by its manifest: listed as text it "holds no data
        # file" (it has none of the text extensions).
        shard_dir = os.path.join(self.tmp, "val-shards")
        data_lib.prepare_corpus([self.corpus], shard_dir, tokenizer="byte", workers=0,
                                progress=False, print_fn=lambda _: None)
        twice = int(np.random.default_rng().integers(2, 4))
        data = dataclasses.replace(tiny_experiment(self.corpus).data,
                                   paths=(self.corpus,) * twice, val_paths=(shard_dir,))
        self.assertEqual(train.duplicate_data_files(data),
                         [("data.paths", self.corpus, self.corpus)] * (twice - 1))

    def test_a_token_shard_directory_named_twice_is_read_once_and_said(self):
        # data.paths=(<shards>, <shards>) read every document twice, without a word (a text
        # file named twice was read once).
        shard_dir = os.path.join(self.tmp, "shards")
        data_lib.prepare_corpus([self.corpus], shard_dir, tokenizer="byte", workers=0,
                                progress=False, print_fn=lambda _: None)
        link = os.path.join(self.tmp, "shards-link")
        os.symlink(shard_dir, link)
        once = shards_lib.open_corpus([shard_dir])
        paths = (shard_dir, link, shard_dir)
        twice = shards_lib.open_corpus(list(paths))
        self.assertEqual((len(twice.doc_len), int(twice.doc_len.sum())),
                         (len(once.doc_len), int(once.doc_len.sum())))
        data = dataclasses.replace(tiny_experiment(self.corpus).data, paths=paths,
                                   format="tokens")
        self.assertEqual(train.duplicate_data_files(data),
                         [("data.paths", link, shard_dir), ("data.paths", shard_dir, shard_dir)])
        lines = []
        train.check_duplicate_files(self.tmp, data, has_checkpoint=False,
                                    read_saved=lambda: (None, None), print_fn=lines.append,
                                    consequence="")
        self.assertEqual(lines, [f"data: read once, dropped as duplicates of an earlier entry "
                                 f"(the same real file): data.paths {link} (= {shard_dir}), "
                                 f"data.paths {shard_dir} (named twice)"])

    def test_a_gzip_file_written_again_keeps_its_fingerprint(self):
        # gzip writes the time of the write into its header (bytes 4-7): a deterministic
        # rebuild of a .jsonl.gz corpus was refused as "same size, other contents".
        path = os.path.join(self.tmp, "docs.jsonl.gz")
        rng = np.random.default_rng(0)
        lines = "".join(json.dumps({"text": " ".join(rng.choice(["a", "b", "c"], 50))}) + "\n"
                        for _ in range(20)).encode()
        prints = []
        for mtime in (1_000_000, 2_000_000):
            with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb",
                                                        mtime=mtime) as f:
                f.write(lines)
            with open(path, "rb") as f:
                prints.append((f.read(), train._file_fingerprint(path)))
        self.assertNotEqual(prints[0][0], prints[1][0])  # the bytes differ (the header time)
        self.assertEqual(prints[0][1], prints[1][1])
        with open(path, "r+b") as f:  # one byte of the compressed stream: a change
            f.seek(20)
            byte = f.read(1)
            f.seek(20)
            f.write(bytes([byte[0] ^ 1]))
        self.assertNotEqual(train._file_fingerprint(path), prints[0][1])

    def test_a_record_of_another_version_is_not_compared_and_is_rewritten(self):
        workdir = self.copy_of_one_step_run("v")
        record = os.path.join(workdir, train.DATA_FINGERPRINT)
        with open(record) as f:
            saved = json.load(f)
        self.assertEqual(saved["version"], train._FINGERPRINT_VERSION)
        saved = {**saved, "version": 1,
                 "data.paths": {self.corpus: {"bytes": 1, "sha256_head_tail": "0"}}}
        with open(record, "w") as f:
            json.dump(saved, f)
        out = train.train_and_evaluate(tiny_experiment(self.corpus, total_steps=2), workdir,
                                       print_fn=lambda s: None)
        self.assertEqual((out["resumed_from"], out["step"]), (1, 2))
        with open(record) as f:
            rewritten = json.load(f)
        self.assertEqual(rewritten["version"], train._FINGERPRINT_VERSION)
        self.assertEqual(rewritten["data.paths"][self.corpus]["bytes"],
                         os.path.getsize(self.corpus))

    def test_a_malformed_token_shard_manifest_is_one_config_error(self):
        # data_fingerprints read the manifest before build_datasets, whose ValueError the
        # trainer turns into a ConfigError ("data: ..."): the manifest's ValueError escaped as
        # a traceback (experiments/train.py catches no ValueError) instead of one line.
        shards = os.path.join(self.tmp, "tokens")
        os.makedirs(shards)
        with open(os.path.join(shards, "manifest.json"), "w") as f:
            json.dump({"format": "lattn-token-shards", "version": 999}, f)
        cfg = tiny_experiment(self.corpus)
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, paths=(shards,)))
        with self.assertRaisesRegex(config_lib.ConfigError,
                                    r"^data: .*manifest\.json: not a lattn-token-shards v1"):
            train.train_and_evaluate(cfg, os.path.join(self.tmp, "m"), print_fn=lambda s: None)

    def test_a_workdir_in_use_is_refused_before_anything_is_written(self):
        workdir = os.path.join(self.tmp, "busy")
        os.makedirs(workdir)
        # Another run's lock: a second open file description conflicts even in this process.
        with open(os.path.join(workdir, train.WORKDIR_LOCK), "w") as held:
            fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            held.write("4242\n")
            held.flush()
            with self.assertRaisesRegex(config_lib.ConfigError,
                                        r"workdir .*busy is in use by another run \(pid 4242"):
                train.train_and_evaluate(tiny_experiment(self.corpus, total_steps=1), workdir,
                                         print_fn=lambda s: None)
            self.assertEqual(sorted(os.listdir(workdir)), [train.WORKDIR_LOCK])
        # Released (the holder closed it, as a process's end does): the run goes ahead, and
        # deletes the file the other run left (as a killed run leaves it) when it ends.
        out = train.train_and_evaluate(tiny_experiment(self.corpus, total_steps=1), workdir,
                                       print_fn=lambda s: None)
        self.assertEqual(out["step"], 1)
        self.assertNotIn(train.WORKDIR_LOCK, os.listdir(workdir))

    def test_changed_schedule_options_are_reported_on_resume(self):
        # Raising total_steps (how a finished run continues) or changing the LR recomputes the
        # schedule from the resumed step on: allowed, but said in one line naming them.
        # (The class's finished one-step run; a fresh four-step run here took most of the
        # test's time and checked nothing more.)
        workdir = self.copy_of_one_step_run("s")
        lines = []
        train.train_and_evaluate(tiny_experiment(self.corpus, total_steps=1), workdir,
                                 print_fn=lines.append)
        self.assertFalse([x for x in lines if x.startswith("warning: resuming")], lines)
        cfg = tiny_experiment(self.corpus, total_steps=2)
        cfg = config_lib.ExperimentConfig(
            model=cfg.model, data=cfg.data, train=cfg.train,
            optim=config_lib.OptimConfig(**{**cfg.optim.__dict__, "learning_rate": 1e-3}))
        lines = []
        out = train.train_and_evaluate(cfg, workdir, print_fn=lines.append)
        self.assertEqual(out["step"], 2)
        warned = [x for x in lines if x.startswith("warning: resuming")]
        self.assertLen(warned, 1, lines)
        self.assertIn("optim.learning_rate (0.003 -> 0.001), train.total_steps (1 -> 2)",
                      warned[0])
        self.assertIn("schedule is recomputed", warned[0])

    def test_a_warmup_derived_from_total_steps_is_marked_as_such_on_resume(self):
        # A preset's warm-up is a tenth of train.total_steps (a FieldReference): raising
        # total_steps changes it too, which the warning listed as if the user had changed it.
        rng = np.random.default_rng(17)
        first_total = int(rng.integers(10, 20))
        later_total = first_total + int(rng.integers(10, 30))

        def preset(total_steps, warmup_steps=None, **train_overrides):
            values = dataclasses.asdict(tiny_experiment(self.corpus, **train_overrides))
            total = ml_collections.FieldReference(first_total)
            values["train"]["total_steps"] = total
            values["optim"]["warmup_steps"] = total // 10
            c = ml_collections.ConfigDict(values)
            c.train.total_steps = total_steps  # as --config.train.total_steps would
            if warmup_steps is not None:
                c.optim.warmup_steps = warmup_steps
            return (config_lib.experiment_from_config_dict(c), config_lib.derived_options(c))

        workdir = os.path.join(self.tmp, "w")
        config, derived = preset(first_total, max_steps_per_run=1)
        train.train_and_evaluate(config, workdir, print_fn=lambda s: None, derived=derived)
        config, derived = preset(later_total, max_steps_per_run=1)
        lines = []
        train.train_and_evaluate(config, workdir, print_fn=lines.append, derived=derived)
        warned = [x for x in lines if x.startswith("warning: resuming")]
        self.assertLen(warned, 1, lines)
        self.assertIn(f"(train.total_steps ({first_total} -> {later_total}), "
                      f"optim.warmup_steps ({first_total // 10} -> {later_total // 10}, "
                      f"derived from train.total_steps); the start's", warned[0])
        # Set outright, the warm-up is the user's own change: listed as such.
        config, derived = preset(later_total, warmup_steps=later_total // 5)
        self.assertEqual(train._check_resume_compatible(workdir, config, True, derived=derived), [
            f"optim.warmup_steps ({first_total // 10} -> {later_total // 5})",
            f"train.total_steps ({first_total} -> {later_total})"])
        # An option marked derived whose source did not change: its change came from elsewhere,
        # so it is not marked.
        config, _ = preset(first_total, warmup_steps=later_total // 5)
        changed = train._check_resume_compatible(
            workdir, config, True, derived={"optim.warmup_steps": ("train.total_steps",)})
        self.assertEqual(changed, [f"optim.warmup_steps ({first_total // 10} -> "
                                   f"{later_total // 5})"])

    def test_flat_optimizer_trains_resumes_and_refuses_a_layout_change(self):
        def cfg(flatten, total_steps):
            base = tiny_experiment(self.corpus, total_steps=total_steps)
            optim_cfg = config_lib.OptimConfig(**{**base.optim.__dict__, "flatten": flatten})
            return config_lib.ExperimentConfig(model=base.model, data=base.data,
                                               optim=optim_cfg, train=base.train)

        workdir = os.path.join(self.tmp, "f")
        first = train.train_and_evaluate(cfg(True, 1), workdir, print_fn=lambda s: None)
        self.assertTrue(np.isfinite(first["val_loss"]))
        second = train.train_and_evaluate(cfg(True, 2), workdir, print_fn=lambda s: None)
        self.assertEqual(second["resumed_from"], 1)
        # The optimizer state's layout differs: one line naming the option, not orbax's error.
        with self.assertRaisesRegex(config_lib.ConfigError, r"optim\.flatten \(True -> False\)"):
            train.train_and_evaluate(cfg(False, 3), workdir, print_fn=lambda s: None)

    def test_another_optimizer_is_refused_in_one_line_before_any_warning(self):
        workdir = self.copy_of_one_step_run("o")
        base = tiny_experiment(self.corpus, total_steps=2)
        cfg = dataclasses.replace(base, optim=dataclasses.replace(base.optim, name="muon"))
        lines = []
        with mock.patch.object(data_lib, "build_datasets", side_effect=AssertionError("read")):
            with self.assertRaises(config_lib.ConfigError) as ctx:
                train.train_and_evaluate(cfg, workdir, print_fn=lines.append)
        message = str(ctx.exception)
        self.assertRegex(message, r"^optim\.name \('adamw' -> 'muon'\) cannot change on resume "
                                  r"\(it changes the optimizer state's layout\)")
        self.assertNotIn("\n", message)
        self.assertFalse([x for x in lines if x.startswith("warning: resuming")], lines)
        # Nothing was lost: the run resumes with its own optimizer.
        out = train.train_and_evaluate(base, workdir, print_fn=lambda s: None)
        self.assertEqual(out["resumed_from"], 1)

    def test_state_layout_options_are_exactly_those_that_change_the_state_tree(self):
        params = {"embed": {"embedding": jnp.zeros((8, 4))},
                  "blocks": {"0": {"mlp": {"fc1": {"kernel": jnp.zeros((4, 6))}},
                                   "norm": {"scale": jnp.zeros((4,))}}}}

        def structure(optim_cfg):
            tx = optim.make_optimizer(optim_cfg, total_steps=10)
            return jax.tree_util.tree_structure(tx.init(params))

        variants = [dict(), dict(name="muon"), dict(flatten=True), dict(grad_clip=0.0),
                    dict(grad_clip=0.5), dict(weight_decay=0.0),
                    dict(flatten=True, weight_decay=0.0),
                    dict(name="muon", muon_variant="muon"), dict(muon_variant="muon"),
                    dict(name="muon", muon_nesterov=False), dict(name="muon", flatten=True),
                    dict(name="muon", flatten=True, adamw_weight_decay=0.1),
                    dict(name="muon", adamw_weight_decay=0.1), dict(learning_rate=1e-3),
                    dict(name="muon", muon_ns_steps=10, muon_scale_mode="shape_scaling")]
        cfgs = [config_lib.OptimConfig(**v) for v in variants]
        for a, va in zip(cfgs, variants):
            for b, vb in zip(cfgs, variants):
                with self.subTest(saved=va, now=vb):
                    diffs = train._optim_layout_diffs(dataclasses.asdict(a),
                                                      dataclasses.asdict(b))
                    self.assertEqual(bool(diffs), structure(a) != structure(b), diffs)

    def test_config_json_without_checkpoint_does_not_block_a_new_run(self):
        workdir = os.path.join(self.tmp, "e")
        os.makedirs(workdir)
        with open(os.path.join(workdir, "config.json"), "w") as f:
            f.write('{"model": {"d_model": 999}, "data": {}}')
        out = train.train_and_evaluate(tiny_experiment(self.corpus, total_steps=1), workdir,
                                       print_fn=lambda s: None)
        self.assertEqual(out["resumed_from"], -1)

    def test_workdir_that_is_a_file_is_a_config_error(self):
        path = os.path.join(self.tmp, "not_a_dir")
        with open(path, "w") as f:
            f.write("x")
        with self.assertRaisesRegex(config_lib.ConfigError, "exists and is not a directory"):
            train.train_and_evaluate(tiny_experiment(self.corpus), path,
                                     print_fn=lambda s: None)

    def test_uncreatable_workdir_is_a_config_error_naming_the_flag_and_the_reason(self):
        with self.assertRaisesRegex(config_lib.ConfigError,
                                    r"^--workdir=/proc/nope/x: cannot create the directory "
                                    r"\(No such file or directory: /proc/nope\)$"):
            train.train_and_evaluate(tiny_experiment(self.corpus), "/proc/nope/x",
                                     print_fn=lambda s: None)

    def test_too_small_corpus_is_a_config_error(self):
        path = os.path.join(self.tmp, "one.txt")
        with open(path, "w") as f:
            f.write("a single short document")
        with self.assertRaisesRegex(config_lib.ConfigError, r"^data: "):
            train.train_and_evaluate(tiny_experiment(path), os.path.join(self.tmp, "f"),
                                     print_fn=lambda s: None)

    def test_model_vocab_below_the_tokenizer_is_a_config_error(self):
        # The corpus's ids (byte tokenizer: 257) must fit the embedding; out-of-range ids
        # cannot be checked inside jit (jnp.take gives NaN rows for them).
        config = tiny_experiment(self.corpus)
        config = dataclasses.replace(config, model=dataclasses.replace(config.model,
                                                                       vocab_size=200))
        with self.assertRaisesRegex(config_lib.ConfigError,
                                    r"model\.vocab_size=200 is smaller than the tokenizer's "
                                    r"vocabulary \(byte: 257\)"):
            train.train_and_evaluate(config, os.path.join(self.tmp, "new", "v"),
                                     print_fn=lambda s: None)
        # Refused after the workdir was set up: the workdir (invocations.jsonl, console.log,
        # .train.lock) and the parent this call made are removed again.
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "new")))
        # A workdir that existed before the call keeps what the call wrote there.
        existing = os.path.join(self.tmp, "existing")
        os.makedirs(existing)
        with self.assertRaises(config_lib.ConfigError):
            train.train_and_evaluate(config, existing, print_fn=lambda s: None)
        # (the lock file: deleted as the call ends, as after any run)
        self.assertEqual(sorted(os.listdir(existing)), [train.CONSOLE_LOG, train.INVOCATIONS])

    def test_a_failed_fresh_workdir_with_saved_results_is_kept(self):
        made = os.path.join(self.tmp, "made")
        workdir = os.path.join(made, "w")
        self.assertEqual(config_lib.first_missing_dir(workdir), made)
        self.assertIsNone(config_lib.first_missing_dir(self.tmp))
        for saved in ("metrics.jsonl", os.path.join("checkpoints", "3", "state")):
            path = os.path.join(workdir, saved)
            os.makedirs(os.path.dirname(path))
            with open(path, "w") as f:
                f.write("x\n")
            self.assertFalse(train._remove_unused_workdir(workdir, made), saved)
            self.assertTrue(os.path.exists(path))
            shutil.rmtree(made)
        os.makedirs(os.path.join(workdir, "checkpoints"))  # empty: nothing saved
        self.assertTrue(train._remove_unused_workdir(workdir, made))
        self.assertFalse(os.path.exists(made))


class WorkdirOutsideDataTest(absltest.TestCase):

    def test_only_a_workdir_the_data_scan_would_read_is_refused(self):
        root = self.create_tempdir().full_path
        data, val = os.path.join(root, "data"), os.path.join(root, "val")
        for d in (data, val):
            os.makedirs(d)

        def check(workdir, **data_options):
            config = mock.Mock(data=data_lib.DataConfig(
                **{"paths": (data,), "seq_len": 8, "batch_size": 1, **data_options}))
            train.check_workdir_outside_data(config, workdir)

        check(os.path.join(root, "run"))  # beside the data: fine
        check(os.path.join(root, "data-run"))  # a name that only starts like it
        check(os.path.join(data, ".runs", "a"))  # a hidden folder: the scan skips it
        with open(os.path.join(val, "manifest.json"), "w") as f:
            f.write("{}")
        check(os.path.join(val, "run"), val_paths=(val,))  # token shards: read by the manifest
        os.remove(os.path.join(val, "manifest.json"))
        for workdir, option, directory, extra in (
                (os.path.join(data, "run 1"), "data.paths", data, {}),
                (data, "data.paths", data, {}),
                (os.path.join(val, "a", "b"), "data.val_paths", val, {"val_paths": (val,)})):
            with self.assertRaisesRegex(config_lib.ConfigError, re.escape(
                    f"--workdir={workdir} is inside the {option} directory {directory}, whose "
                    f"scan would read the run's own records")):
                check(workdir, **extra)


class GitStateTest(absltest.TestCase):

    def test_reads_commit_and_dirty_without_writing_the_index(self):
        # A file touched after the commit (same contents) makes a plain `git status` refresh
        # the index, rewriting .git/index under the index lock; the run's read must not.
        if shutil.which("git") is None:
            self.skipTest("no git")
        repo = self.create_tempdir().full_path
        env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
                   GIT_COMMITTER_EMAIL="t@t")
        path = os.path.join(repo, "a.txt")
        with open(path, "w") as f:
            f.write(str(np.random.default_rng().integers(1 << 30)))
        for args in (("init", "-q"), ("add", "a.txt"), ("commit", "-q", "-m", "a")):
            subprocess.run(("git", "-C", repo) + args, check=True, env=env, capture_output=True)
        index = os.path.join(repo, ".git", "index")
        os.utime(path, ns=(os.stat(index).st_mtime_ns + 10**9,) * 2)
        before = os.stat(index).st_mtime_ns, open(index, "rb").read()
        state = train._git_state(repo)
        head = subprocess.run(("git", "-C", repo, "rev-parse", "HEAD"), check=True,
                              capture_output=True, text=True).stdout.strip()
        self.assertEqual(state, {"commit": head, "dirty": False})
        self.assertEqual((os.stat(index).st_mtime_ns, open(index, "rb").read()), before)
        with open(path, "a") as f:
            f.write("x")
        self.assertTrue(train._git_state(repo)["dirty"])


class ScheduleTest(absltest.TestCase):

    def test_wsd_minus_sqrt_matches_hand_computed_values(self):
        cfg = config_lib.OptimConfig(learning_rate=1.0, min_lr_ratio=0.1, warmup_steps=10,
                                     schedule="wsd", decay_fraction=0.2,
                                     decay_shape="minus_sqrt")
        lr = optim.learning_rate_schedule(cfg, total_steps=100)
        # warm-up 0..10, stable to step 80, then 0.1 + 0.9 * (1 - sqrt((s - 80) / 20)).
        for step, want in [(0, 0.0), (5, 0.5), (10, 1.0), (50, 1.0), (80, 1.0),
                           (85, 0.1 + 0.9 * (1 - 0.5)), (100, 0.1)]:
            np.testing.assert_allclose(float(lr(step)), want, rtol=1e-6, err_msg=f"{step=}")

    def test_cosine(self):
        cfg = config_lib.OptimConfig(learning_rate=2.0, min_lr_ratio=0.0, warmup_steps=0,
                                     schedule="cosine")
        lr = optim.learning_rate_schedule(cfg, total_steps=10)
        np.testing.assert_allclose([float(lr(s)) for s in (0, 5, 10)], [2.0, 1.0, 0.0],
                                   atol=1e-6)

    def test_weight_decay_skips_vectors(self):
        mask = optim.weight_decay_mask({"w": jnp.ones((2, 3)), "norm": jnp.ones(3),
                                        "s": jnp.ones(())})
        self.assertEqual(mask, {"w": True, "norm": False, "s": False})


class ConfigTypeTest(absltest.TestCase):
    """``train_and_evaluate`` given a config file's ``ConfigDict`` (not an ExperimentConfig)."""

    def test_a_config_dict_is_refused_naming_the_converter_before_any_write(self):
        from configs import table2
        with tempfile.TemporaryDirectory() as tmp:
            workdir = os.path.join(tmp, "run")
            with self.assertRaisesRegex(
                    TypeError, r"ExperimentConfig, got ConfigDict; .*"
                               r"lattn_jax\.config\.experiment_from_config_dict\(config\)"):
                train.train_and_evaluate(table2.get_config("tiny"), workdir)
            self.assertFalse(os.path.exists(workdir))
            # The named converter is the way in.
            cfg = config_lib.experiment_from_config_dict(table2.get_config("tiny"))
            self.assertIsInstance(cfg, config_lib.ExperimentConfig)


if __name__ == "__main__":
    absltest.main()
