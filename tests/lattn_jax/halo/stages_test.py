"""HALO stages on tiny data: each stage's loss falls, and a stage resumes from its checkpoint."""

import dataclasses
import functools
import json
import os
import shutil
import tempfile
import time
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest

from lattn_jax import config as config_lib
from lattn_jax.halo import hypenet
from lattn_jax.halo import loaders
from lattn_jax.halo import losses
from lattn_jax.halo import stages
from tests.lattn_jax.halo import hypenet_test


def batches(vocab=61, batch=2, length=16, seed=0):
    """Endless batches of a fixed set of sequences (learnable quickly)."""
    rng = np.random.default_rng(seed)
    data = rng.integers(0, vocab, size=(4, batch, length + 1))
    i = 0
    while True:
        x = data[i % 4]
        i += 1
        yield {"inputs": x[:, :-1], "targets": x[:, 1:],
               "weights": np.ones((batch, length), np.float32)}


def optim_cfg(lr):
    return config_lib.OptimConfig(name="adamw", learning_rate=lr, warmup_steps=2,
                                  schedule="cosine", min_lr_ratio=0.1, weight_decay=0.0)


def train_cfg(steps, **kw):
    return config_lib.TrainConfig(total_steps=steps, checkpoint_every=steps, log_every=steps,
                                  **kw)


@functools.lru_cache(maxsize=None)
def two_layer_teacher():
    """``(config, params)`` of a random tiny teacher with two attention layers (the stages'
    programs compile per layer): Stage 2/3's student is then one Lightning and one attention
    layer, still a hybrid. Made once per process (four test classes read it; jax arrays, so
    none can change it)."""
    cfg = dataclasses.replace(hypenet_test.tiny_teacher_config(), layer_pattern=("attn",) * 2)
    return cfg, stages.random_teacher(cfg, seed=0)


class StagesTest(absltest.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.teacher_cfg, cls.teacher_params = two_layer_teacher()
        cls.stage1_cfg = stages.stage1_student_config(cls.teacher_cfg)
        cls.stopped = None

    def stopped_by_a_past_deadline(self):
        """``(workdir, summary, printed lines)`` of a Stage 1 of 3 steps started after its
        deadline (a plain ``time.time()`` value), which stops after one step; run once for the
        class. A test that resumes it copies the workdir."""
        if self.stopped is None:
            os.makedirs(absltest.TEST_TMPDIR.value, exist_ok=True)
            workdir = tempfile.mkdtemp(dir=absltest.TEST_TMPDIR.value)
            lines = []
            out = stages.run_stage1(
                workdir=workdir, teacher_cfg=self.teacher_cfg, teacher_params=self.teacher_params,
                student_cfg=self.stage1_cfg, optim_cfg=optim_cfg(3e-3), train_cfg=train_cfg(3),
                batches=batches(), deadline=time.time() - 1.0, print_fn=lines.append)
            type(self).stopped = (workdir, out, lines)
        return self.stopped

    def test_stage1_loss_falls_and_resumes(self):
        workdir = self.create_tempdir().full_path
        kw = dict(teacher_cfg=self.teacher_cfg, teacher_params=self.teacher_params,
                  student_cfg=self.stage1_cfg, optim_cfg=optim_cfg(3e-3),
                  print_fn=lambda s: None)
        first = stages.run_stage1(workdir=workdir, batches=batches(),
                                  train_cfg=train_cfg(12, max_steps_per_run=6), **kw)
        second = stages.run_stage1(workdir=workdir, batches=batches(),
                                   train_cfg=train_cfg(12), **kw)
        self.assertEqual(second["resumed_from"], 6)
        self.assertEqual(second["step"], 12)
        losses = first["losses"] + second["losses"]
        print("stage 1 losses", np.round(losses, 6))
        self.assertLess(np.mean(losses[-3:]), 0.7 * np.mean(losses[:3]))
        # The student trains only mixers; every layer has one.
        self.assertLen(second["params"]["mixers"], 2)

    def test_a_past_deadline_stops_after_one_step_and_resumes(self):
        stopped, first, _ = self.stopped_by_a_past_deadline()
        workdir = os.path.join(self.create_tempdir().full_path, "stage1")
        shutil.copytree(stopped, workdir)
        kw = dict(teacher_cfg=self.teacher_cfg, teacher_params=self.teacher_params,
                  student_cfg=self.stage1_cfg, optim_cfg=optim_cfg(3e-3),
                  train_cfg=train_cfg(3), print_fn=lambda s: None)
        self.assertEqual((first["step"], first["complete"]), (1, False))
        second = stages.run_stage1(workdir=workdir, batches=batches(), **kw)
        self.assertEqual((second["resumed_from"], second["step"], second["complete"]),
                         (1, 3, True))

    def test_metrics_after_a_record_cut_short_by_a_kill_stay_whole_lines(self):
        workdir = self.create_tempdir().full_path
        stages._write_metrics(workdir, {"step": 1, "loss": np.float32(2.0)})
        with open(os.path.join(workdir, "metrics.jsonl"), "a") as f:
            f.write('{"step": 2, "lo')  # killed mid-record
        stages._write_metrics(workdir, {"step": 2, "loss": np.float32(1.5)})
        with open(os.path.join(workdir, "metrics.jsonl")) as f:
            self.assertEqual([json.loads(line) for line in f],
                             [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.5}])

    def test_the_stop_line_names_the_signal_that_stopped_the_stage(self):
        # The pipeline's deadline (experiments/halo_pipeline.py) turns "now" once SIGTERM or
        # Ctrl-C arrived; the stage said "deadline reached" while the pipeline said the signal.
        class SignalledDeadline(float):
            stop_reason = "stopped by SIGTERM"

        signalled = []
        stages.run_stage1(workdir=self.create_tempdir().full_path, teacher_cfg=self.teacher_cfg,
                          teacher_params=self.teacher_params, student_cfg=self.stage1_cfg,
                          optim_cfg=optim_cfg(3e-3), train_cfg=train_cfg(3), batches=batches(),
                          deadline=SignalledDeadline(time.time() - 1.0),
                          print_fn=signalled.append)
        by_time = self.stopped_by_a_past_deadline()[2]  # the same run, a plain deadline
        for lines, line in ((signalled, "stopped by SIGTERM"), (by_time, "deadline reached")):
            self.assertIn(f"{line} at step 1; checkpointing (run again to resume)", lines)

    @pytest.mark.slow  # ~24 s on 2 cores; the stages' exact-resume test runs in CI
    def test_stage2_and_stage3_losses_fall(self):
        s1 = stages.stage1_init(self.teacher_cfg, self.teacher_params, self.stage1_cfg)
        student_cfg = hypenet.hypenet_config(self.teacher_cfg, [1])
        out = stages.run_stage2(
            workdir=self.create_tempdir().full_path, teacher_cfg=self.teacher_cfg,
            teacher_params=self.teacher_params, student_cfg=student_cfg, stage1_params=s1,
            optim_cfg=optim_cfg(3e-3), train_cfg=train_cfg(12), batches=batches(),
            kl_chunk_size=8, print_fn=lambda s: None)
        print("stage 2 losses", np.round(out["losses"], 6))
        self.assertLess(np.mean(out["losses"][-3:]), 0.7 * np.mean(out["losses"][:3]))
        out3 = stages.run_stage3(
            workdir=self.create_tempdir().full_path, student_cfg=student_cfg,
            init_params=out["params"], optim_cfg=optim_cfg(1e-2), train_cfg=train_cfg(12),
            batches=batches(), print_fn=lambda s: None)
        print("stage 3 losses", np.round(out3["losses"], 4))
        self.assertLess(np.mean(out3["losses"][-3:]), np.mean(out3["losses"][:3]) - 0.1)
        cal = stages.calibrate_logit_scaling(
            student_cfg, out3["params"], [next(batches())], [None, 2.0, 500.0],
            print_fn=lambda s: None)
        self.assertIn(cal["best"], (None, 2.0, 500.0))
        self.assertLen(cal["losses"], 3)
        self.assertNotAlmostEqual(cal["losses"]["None"], cal["losses"]["2.0"], places=6)


class CalibrationTest(absltest.TestCase):
    """``calibrate_logit_scaling``'s per-position buckets against plain fp32 logits."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        teacher_cfg, teacher_params = two_layer_teacher()
        cls.student_cfg = hypenet.hypenet_config(teacher_cfg, [1])
        s1 = stages.stage1_init(teacher_cfg, teacher_params,
                                stages.stage1_student_config(teacher_cfg), seed=2)
        params = stages.stage2_init(teacher_cfg, teacher_params, cls.student_cfg, s1)
        leaves, tree = jax.tree_util.tree_flatten(params)
        keys = jax.random.split(jax.random.key(11), len(leaves))
        # Perturbed so that the NoPE attention's logits are not the teacher's (random, not 0).
        cls.params = jax.tree_util.tree_unflatten(tree, [
            x + 0.1 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)])
        rng = np.random.default_rng(5)
        seq = rng.integers(0, teacher_cfg.vocab_size, size=(2, 2, 25))
        cls.batches = [{"inputs": s[:, :-1], "targets": s[:, 1:],
                        "weights": (rng.random((2, 24)) > 0.25).astype(np.float32)
                        * rng.uniform(0.5, 1.5, (2, 24)).astype(np.float32)} for s in seq]
        cls.logits_of = {}

    def _logits(self, a):
        """Each batch's whole-window fp32 logits (as float64) at scaling ``a``; computed once per
        ``a`` (every position range of :meth:`_plain` reads the same logits)."""
        if a not in self.logits_of:
            cfg = dataclasses.replace(self.student_cfg, attention=dataclasses.replace(
                self.student_cfg.attention, logit_scaling_base=a))
            model = loaders.build_model(cfg, self.params)
            self.logits_of[a] = [np.asarray(model(jnp.asarray(b["inputs"])), np.float64)
                                 for b in self.batches]
        return self.logits_of[a]

    def _plain(self, a, start, stop):
        """Weighted mean CE of positions [start, stop) from the whole window's fp32 logits,
        float64 sums over the batches (an independent path: no chunks, no hidden states)."""
        total = count = 0.0
        for b, logits in zip(self.batches, self._logits(a)):
            logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(
                -1, keepdims=True)) - logits.max(-1, keepdims=True)
            nll = -np.take_along_axis(logp, b["targets"][..., None], -1)[..., 0]
            w = b["weights"].astype(np.float64)
            total += (w * nll)[:, start:stop].sum()
            count += w[:, start:stop].sum()
        return total / count

    def test_buckets_equal_the_plain_loss_per_position_range(self):
        buckets = stages.doubling_buckets(6, 24)
        self.assertEqual(buckets, [(0, 6), (6, 12), (12, 24)])
        cal = stages.calibrate_logit_scaling(
            self.student_cfg, self.params, self.batches, [None, 2.0], print_fn=lambda s: None,
            position_buckets=buckets, chunk_size=7)
        self.assertEqual(cal["position_buckets"], [[0, 6], [6, 12], [12, 24]])
        for a in (None, 2.0):
            with self.subTest(a=a):
                self.assertAlmostEqual(cal["losses"][str(a)], self._plain(a, 0, 24), places=4)
                for (b0, b1), got in zip(buckets, cal["bucket_losses"][str(a)]):
                    self.assertAlmostEqual(got, self._plain(a, b0, b1), places=4)
        # a = 2 scales every query (s_0 = 1, s_23 = log2(25)): the losses must differ.
        self.assertGreater(abs(cal["losses"]["None"] - cal["losses"]["2.0"]), 1e-4)
        self.assertEqual(cal["best"], min((None, 2.0), key=lambda a: cal["losses"][str(a)]))
        want_tokens = [sum(float(b["weights"][:, b0:b1].sum()) for b in self.batches)
                       for b0, b1 in buckets]
        np.testing.assert_allclose(cal["bucket_tokens"], want_tokens, rtol=1e-6)

    def test_bad_buckets_and_lengths_are_refused(self):
        for bad in ([(0, 6), (7, 24)], [(1, 24)], [(0, 12)], [(0, 6), (6, 6), (6, 24)]):
            with self.subTest(bad=bad), self.assertRaisesRegex(
                    ValueError, r"position_buckets must tile \[0, 24\)"):
                stages.calibrate_logit_scaling(self.student_cfg, self.params, self.batches,
                                               [None], position_buckets=bad)
        short = dict(self.batches[0], inputs=self.batches[0]["inputs"][:, :20])
        with self.assertRaisesRegex(ValueError, r"share one length T, got \[20, 24\]"):
            stages.calibrate_logit_scaling(self.student_cfg, self.params,
                                           [short, self.batches[1]], [None])
        for bad in ((0, 8), (8, 0), (True, 8), (8.0, 8)):
            with self.subTest(bad=bad), self.assertRaisesRegex(ValueError, r"must be an int"):
                stages.doubling_buckets(*bad)
        self.assertEqual(stages.doubling_buckets(16384, 65536),
                         [(0, 16384), (16384, 32768), (32768, 65536)])
        self.assertEqual(stages.doubling_buckets(16384, 8192), [(0, 8192)])
        self.assertEqual(stages.doubling_buckets(10, 35), [(0, 10), (10, 20), (20, 35)])


class Stage3TeacherKLTest(absltest.TestCase):
    """Stage 3's optional teacher KL on each window's first ``kl_len`` positions."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.teacher_cfg, cls.teacher_params = two_layer_teacher()
        cls.student_cfg = hypenet.hypenet_config(cls.teacher_cfg, [1])
        stage1_cfg = stages.stage1_student_config(cls.teacher_cfg)
        s1 = stages.stage1_init(cls.teacher_cfg, cls.teacher_params, stage1_cfg, seed=1)
        # Stage-1 Lightning layer with a perturbed Stage-2 student: it differs from the teacher.
        params = stages.stage2_init(cls.teacher_cfg, cls.teacher_params, cls.student_cfg, s1)
        leaves, tree = jax.tree_util.tree_flatten(params)
        keys = jax.random.split(jax.random.key(7), len(leaves))
        cls.params = jax.tree_util.tree_unflatten(tree, [
            x + 0.05 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)])
        teacher_fn = stages.language_model_fn(cls.teacher_cfg)
        # The teacher's forward as one jitted program per length: op by op, each new length
        # compiled every op again (about 3 s a length on 2 cores).
        cls.teacher_forward = staticmethod(jax.jit(
            lambda p, x, hidden: teacher_fn(p)(x, return_hidden=hidden),
            static_argnames="hidden"))
        rng = np.random.default_rng(3)
        seq = rng.integers(0, cls.teacher_cfg.vocab_size, size=(2, 17))
        cls.batch = {"inputs": jnp.asarray(seq[:, :-1]), "targets": jnp.asarray(seq[:, 1:]),
                     "weights": jnp.asarray((rng.random((2, 16)) > 0.2).astype(np.float32)
                                            * rng.uniform(0.5, 1.5, (2, 16)), jnp.float32)}

    def _plain(self, weight, kl_len):
        """The loss from full-vocabulary fp32 logits, no chunks: CE + weight x KL."""
        student_fn = stages.language_model_fn(self.student_cfg)
        b = self.batch
        w = b["weights"]
        k = min(kl_len, b["inputs"].shape[1])
        t_logits = self.teacher_forward(self.teacher_params, b["inputs"][:, :k],
                                        hidden=False).astype(jnp.float32)

        def loss(params):
            logits = student_fn(params)(b["inputs"]).astype(jnp.float32)  # [B, T, V]
            log_ps = jax.nn.log_softmax(logits, axis=-1)
            nll = -jnp.take_along_axis(log_ps, b["targets"][..., None], axis=-1)[..., 0]
            ce = jnp.sum(nll * w) / jnp.sum(w)
            log_pt = jax.nn.log_softmax(t_logits, axis=-1)
            kl_tok = jnp.sum(jnp.exp(log_pt) * (log_pt - log_ps[:, :k]), axis=-1)  # [B, K]
            kl = jnp.sum(kl_tok * w[:, :k]) / jnp.sum(w[:, :k])
            return ce + weight * kl

        return loss

    def _assert_grads_close(self, got, want, rtol):
        for (path, g), r in zip(jax.tree_util.tree_flatten_with_path(got)[0],
                                jax.tree_util.tree_leaves(want)):
            g, r = np.asarray(g), np.asarray(r)  # (numpy: eager jnp compiled each leaf's shape)
            scale = float(np.max(np.abs(r))) + 1e-12
            err = float(np.max(np.abs(g - r)))
            self.assertLessEqual(err, rtol * scale, jax.tree_util.keystr(path))

    def test_weight_zero_is_the_plain_cross_entropy_without_the_teacher(self):
        student_fn = stages.language_model_fn(self.student_cfg)

        def today(params, _, batch):  # stage3_loss_fn before the KL option
            student = student_fn(params)
            hidden = student(batch["inputs"], return_hidden=True)
            return losses.chunked_cross_entropy(hidden, student.head_kernel(), batch["targets"],
                                                batch.get("weights"), chunk_size=7)[0]

        with mock.patch.object(stages, "language_model_fn",
                               wraps=stages.language_model_fn) as built:
            loss_fn = stages.stage3_loss_fn(self.student_cfg, chunk_size=7,
                                            teacher_cfg=self.teacher_cfg, kl_weight=0.0,
                                            kl_len=8)
        built.assert_called_once_with(self.student_cfg)  # no teacher model
        # The second argument is never read: a teacher would fail on it.
        got = jax.value_and_grad(loss_fn)(self.params, "no teacher", self.batch)
        want = jax.value_and_grad(today)(self.params, None, self.batch)
        self.assertEqual(float(got[0]), float(want[0]))
        for g, r in zip(jax.tree_util.tree_leaves(got[1]), jax.tree_util.tree_leaves(want[1])):
            np.testing.assert_array_equal(g, r)

    def test_loss_and_grads_match_the_plain_computation(self):
        for weight, kl_len in ((0.7, 10), (2.0, 100)):  # a prefix; longer than the window
            loss_fn = stages.stage3_loss_fn(self.student_cfg, chunk_size=7,
                                            teacher_cfg=self.teacher_cfg, kl_weight=weight,
                                            kl_len=kl_len)
            loss, grads = jax.jit(jax.value_and_grad(loss_fn))(
                self.params, self.teacher_params, self.batch)
            want, want_grads = jax.jit(jax.value_and_grad(self._plain(weight, kl_len)))(
                self.params)
            np.testing.assert_allclose(float(loss), float(want), rtol=1e-5)
            self._assert_grads_close(grads, want_grads, rtol=1e-5)
        # The KL term is there and not negligible.
        ce = jax.jit(self._plain(0.0, 10))(self.params)
        self.assertGreater(float(want) - float(ce), 1e-2)

    def test_train_loop_logs_the_terms(self):
        # with_terms gives the two parts of the loss; the step's metrics (one pass or the mean
        # over micro-batches) and the logged record carry them, and ce + w kl is the loss.
        weight = 0.7
        loss_fn = stages.stage3_loss_fn(self.student_cfg, chunk_size=7,
                                        teacher_cfg=self.teacher_cfg, kl_weight=weight,
                                        kl_len=10)
        loss, terms = loss_fn.with_terms(self.params, self.teacher_params, self.batch)
        self.assertEqual(set(terms), {"ce", "kl"})
        self.assertGreater(float(terms["kl"]), 1e-2)
        np.testing.assert_allclose(float(terms["ce"]) + weight * float(terms["kl"]),
                                   float(loss), rtol=1e-6)
        for micro in (None, 1):
            train_step = stages.make_train_step(loss_fn, optim_cfg(1e-3), 4,
                                                micro_batch_size=micro)
            _, metrics = train_step.step(train_step.init_state(self.params),
                                         self.teacher_params, self.batch)
            self.assertEqual(set(metrics), {"loss", "grad_norm", "lr", "ce", "kl"})
            np.testing.assert_allclose(float(metrics["ce"]) + weight * float(metrics["kl"]),
                                       float(metrics["loss"]), rtol=1e-5)
            if micro is None:
                np.testing.assert_allclose(float(metrics["loss"]), float(loss), rtol=1e-5)
        workdir = self.create_tempdir().full_path
        lines = []
        batches = iter([self.batch] * 2)
        stages.run_stage3(workdir=workdir, student_cfg=self.student_cfg, init_params=self.params,
                          optim_cfg=optim_cfg(1e-3), train_cfg=train_cfg(2), batches=batches,
                          teacher_cfg=self.teacher_cfg, teacher_params=self.teacher_params,
                          kl_weight=weight, kl_len=10, print_fn=lines.append)
        with open(os.path.join(workdir, "metrics.jsonl")) as f:
            rec = [json.loads(line) for line in f][-1]
        np.testing.assert_allclose(rec["ce"] + weight * rec["kl"], rec["loss"], rtol=1e-5)
        self.assertTrue(any(" ce " in line and " kl " in line for line in lines), lines)

    def test_the_teacher_on_the_prefix_is_the_teacher_on_the_window(self):
        tokens = self.batch["inputs"]
        full = self.teacher_forward(self.teacher_params, tokens, hidden=True)
        np.testing.assert_allclose(
            self.teacher_forward(self.teacher_params, tokens[:, :9], hidden=True), full[:, :9],
            rtol=1e-5, atol=1e-5)

    def test_bad_options_are_named(self):
        for kw, name in ((dict(kl_weight=-0.1), "kl_weight"),
                         (dict(kl_weight=float("nan")), "kl_weight"),
                         (dict(kl_weight=float("inf"), teacher_cfg=self.teacher_cfg, kl_len=8),
                          "kl_weight"),
                         (dict(kl_weight=0.5, kl_len=8), "teacher_cfg"),
                         (dict(kl_weight=0.5, teacher_cfg=self.teacher_cfg), "kl_len"),
                         (dict(kl_weight=0.5, teacher_cfg=self.teacher_cfg, kl_len=0),
                          "kl_len")):
            with self.assertRaisesRegex(ValueError, name):
                stages.stage3_loss_fn(self.student_cfg, **kw)
        with self.assertRaisesRegex(ValueError, "teacher_params"):
            stages.run_stage3(workdir="unused", student_cfg=self.student_cfg,
                              init_params=self.params, optim_cfg=optim_cfg(1e-3),
                              train_cfg=train_cfg(1), batches=iter(()),
                              teacher_cfg=self.teacher_cfg, kl_weight=0.5, kl_len=8)

    def test_run_stage3_passes_the_teacher_only_with_a_weight(self):
        kw = dict(workdir="unused", student_cfg=self.student_cfg, init_params=self.params,
                  optim_cfg=optim_cfg(1e-3), train_cfg=train_cfg(1), batches=iter(()),
                  teacher_cfg=self.teacher_cfg, teacher_params=self.teacher_params, seq_len=16,
                  kl_len=8)
        with mock.patch.object(stages, "train_loop") as loop:
            stages.run_stage3(kl_weight=0.0, **kw)
            off = loop.call_args.kwargs
            stages.run_stage3(kl_weight=0.5, **kw)
            on = loop.call_args.kwargs
        self.assertIsNone(off["frozen"])
        self.assertIs(on["frozen"], self.teacher_params)
        self.assertEqual(off["flops_per_token"], stages.stage_flops_per_token(
            "stage3", 16, student_cfg=self.student_cfg, student_params=self.params))
        self.assertEqual(on["flops_per_token"], stages.stage_flops_per_token(
            "stage3", 16, student_cfg=self.student_cfg, student_params=self.params,
            teacher_cfg=self.teacher_cfg, teacher_params=self.teacher_params, teacher_len=8))
        self.assertGreater(on["flops_per_token"], off["flops_per_token"])


def grain_batches(seed=0):
    """A checkpointable (grain) iterator of packed byte-level windows over the bundled text:
    resuming restores its position, as the pipeline's data does."""
    from lattn_jax import assets
    from lattn_jax import data as data_lib
    ds = data_lib.build_datasets(data_lib.DataConfig(
        paths=(assets.asset_path("corpus/wikitext-2-raw/wiki.valid.raw"),),
        tokenizer="byte", seq_len=16, batch_size=4, val_fraction=0.05, seed=seed,
        shuffle=True))
    return ds.train_iter


class Stage2LearningRateGroupsTest(absltest.TestCase):
    """``copied_lr_scale`` (an ablation outside the spec): the Lightning mixers at the stage's
    rate, everything copied from the teacher at a multiple of it."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.teacher_cfg, cls.teacher_params = two_layer_teacher()
        cls.s1 = stages.stage1_init(cls.teacher_cfg, cls.teacher_params,
                                    stages.stage1_student_config(cls.teacher_cfg))
        cls.student_cfg = hypenet.hypenet_config(cls.teacher_cfg, [1])  # layer 0 Lightning
        cls.params = stages.stage2_init(cls.teacher_cfg, cls.teacher_params, cls.student_cfg,
                                        cls.s1)

    def test_labels(self):
        scales = stages.stage2_update_scales(self.student_cfg, self.params, 0.1)
        flat = {"/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path): v
                for path, v in jax.tree_util.tree_flatten_with_path(scales)[0]}
        new = sorted(k for k, v in flat.items() if v == 1.0)
        self.assertTrue(new)
        self.assertTrue(all(k.startswith("blocks/0/mixer/") for k in new), new)
        self.assertIn("blocks/0/mixer/z_proj/kernel", new)
        copied = {k for k, v in flat.items() if v == 0.1}
        self.assertEqual(copied, set(flat) - set(new))
        for name in ("blocks/1/mixer/qkv_proj/kernel", "blocks/0/mlp", "embed"):
            self.assertTrue(any(k.startswith(name) for k in copied), (name, sorted(copied)))
        for bad in (0, -1.0, float("inf"), float("nan"), True, "0.1"):
            with self.assertRaisesRegex(ValueError, "copied_lr_scale must be a finite number"):
                stages.stage2_update_scales(self.student_cfg, self.params, bad)

    def test_updates_of_the_copied_group_are_scaled(self):
        # AdamW with weight decay 0: the update of a leaf is -lr m / (sqrt(v) + eps), so the
        # scaled group's update is exactly scale x the one-rate update, the other group's the
        # same (two updates from the same gradients: the first at rate 0, the warm-up's start).
        # The gradients are computed once (the update scales act after them, in ``tx``), as one
        # jitted program: op by op, the Stage-2 loss's gradient took about 6 s on 2 cores.
        loss_fn = stages.stage2_loss_fn(self.teacher_cfg, self.student_cfg, chunk_size=8)
        scales = stages.stage2_update_scales(self.student_cfg, self.params, 0.1)
        _, grads = jax.jit(stages.make_train_step(loss_fn, optim_cfg(1e-3), 4).loss_and_grads)(
            self.params, self.teacher_params, next(batches()))
        updates = []
        for update_scales in (None, scales):
            step = stages.make_train_step(loss_fn, optim_cfg(1e-3), 4,
                                          update_scales=update_scales)
            opt_state = step.tx.init(self.params)
            for _ in range(2):
                upd, opt_state = step.tx.update(grads, opt_state, self.params)
            updates.append(upd)
        seen = set()
        for one_rate, grouped, scale in zip(*(jax.tree_util.tree_leaves(t)
                                              for t in (*updates, scales))):
            np.testing.assert_allclose(grouped, scale * np.asarray(one_rate), rtol=1e-6)
            if np.abs(one_rate).max() > 0:
                seen.add(scale)
        self.assertEqual(seen, {1.0, 0.1})  # both groups move

    def test_run_stage2_with_groups_resumes_and_refuses_a_bad_scale(self):
        kw = dict(teacher_cfg=self.teacher_cfg, teacher_params=self.teacher_params,
                  student_cfg=self.student_cfg, stage1_params=self.s1, optim_cfg=optim_cfg(3e-3),
                  kl_chunk_size=8, print_fn=lambda s: None, copied_lr_scale=0.25)
        whole = stages.run_stage2(workdir=self.create_tempdir().full_path,
                                  train_cfg=train_cfg(4), batches=batches(), **kw)
        workdir = self.create_tempdir().full_path
        first = stages.run_stage2(workdir=workdir, train_cfg=train_cfg(4, max_steps_per_run=2),
                                  batches=batches(), **kw)
        second = stages.run_stage2(workdir=workdir, train_cfg=train_cfg(4),
                                   batches=batches(seed=0), **kw)
        self.assertEqual(second["resumed_from"], 2)
        self.assertLen(first["losses"] + second["losses"], 4)
        one_rate = stages.run_stage2(workdir=self.create_tempdir().full_path,
                                     train_cfg=train_cfg(4), batches=batches(),
                                     **{**kw, "copied_lr_scale": 1.0})
        self.assertNotAlmostEqual(whole["losses"][-1], one_rate["losses"][-1], places=6)
        with self.assertRaisesRegex(ValueError, "copied_lr_scale"):
            stages.run_stage2(workdir=self.create_tempdir().full_path, train_cfg=train_cfg(2),
                              batches=batches(), **{**kw, "copied_lr_scale": 0.0})


class ResumeTest(absltest.TestCase):
    """Each stage cut mid-way and resumed gives the losses of the same stage run in one go."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.teacher_cfg = dataclasses.replace(hypenet_test.tiny_teacher_config(),
                                              layer_pattern=("attn",) * 2, vocab_size=257)
        cls.teacher_params = stages.random_teacher(cls.teacher_cfg, seed=0)
        cls.stage1_cfg = stages.stage1_student_config(cls.teacher_cfg)
        cls.student_cfg = hypenet.hypenet_config(cls.teacher_cfg, [1])
        cls.s1 = stages.stage1_init(cls.teacher_cfg, cls.teacher_params, cls.stage1_cfg)

    def _check(self, run, steps=6, cut=3, **kw):
        whole = run(self.create_tempdir().full_path, train_cfg(steps), grain_batches(), **kw)
        workdir = self.create_tempdir().full_path
        first = run(workdir, train_cfg(steps, max_steps_per_run=cut), grain_batches(), **kw)
        second = run(workdir, train_cfg(steps), grain_batches(), **kw)
        self.assertEqual((first["step"], second["resumed_from"], second["step"]),
                         (cut, cut, steps))
        np.testing.assert_allclose(first["losses"] + second["losses"], whole["losses"],
                                   rtol=1e-6, atol=0)
        # A cut run differs from the whole one if the data or the state were not restored.
        self.assertLen(set(np.round(whole["losses"], 6)), steps)

    def test_resume_drops_the_metrics_logged_after_the_checkpoint(self):
        # A run killed after logging steps 4-5 past its checkpoint at 3: the resumed run logs
        # steps 4-6 again, and metrics.jsonl has each step once, in order.
        def run(workdir, tcfg, data):
            return stages.run_stage1(
                workdir=workdir, teacher_cfg=self.teacher_cfg,
                teacher_params=self.teacher_params, student_cfg=self.stage1_cfg,
                optim_cfg=optim_cfg(3e-3), train_cfg=tcfg, batches=data,
                print_fn=lambda s: None, seq_len=16)

        def cfg(**kw):
            return config_lib.TrainConfig(total_steps=6, checkpoint_every=3, log_every=1, **kw)

        workdir = self.create_tempdir().full_path
        run(workdir, cfg(max_steps_per_run=3), grain_batches())
        path = os.path.join(workdir, "metrics.jsonl")
        with open(path, "a") as f:
            for step in (4, 5):
                f.write(json.dumps({"step": step, "loss": 123.0}) + "\n")
        run(workdir, cfg(), grain_batches())
        with open(path) as f:
            records = [json.loads(ln) for ln in f]
        self.assertEqual([r["step"] for r in records], [1, 2, 3, 4, 5, 6])
        self.assertNotIn(123.0, [r["loss"] for r in records])
        with open(path + ".discarded-3") as f:  # the dropped records are kept
            self.assertEqual([json.loads(ln)["loss"] for ln in f], [123.0, 123.0])

    def test_stage1_resumes_exactly(self):
        def run(workdir, tcfg, data):
            return stages.run_stage1(
                workdir=workdir, teacher_cfg=self.teacher_cfg,
                teacher_params=self.teacher_params, student_cfg=self.stage1_cfg,
                optim_cfg=optim_cfg(3e-3), train_cfg=tcfg, batches=data,
                print_fn=lambda s: None, seq_len=16)
        self._check(run)

    def test_stage2_and_stage3_resume_exactly(self):

        def run2(workdir, tcfg, data):
            return stages.run_stage2(
                workdir=workdir, teacher_cfg=self.teacher_cfg,
                teacher_params=self.teacher_params, student_cfg=self.student_cfg,
                stage1_params=self.s1, optim_cfg=optim_cfg(3e-3), train_cfg=tcfg, batches=data,
                kl_chunk_size=24, micro_batch_size=2, print_fn=lambda s: None, seq_len=16)
        self._check(run2)
        init = stages.stage2_init(self.teacher_cfg, self.teacher_params, self.student_cfg,
                                  self.s1)

        def run3(workdir, tcfg, data):
            return stages.run_stage3(
                workdir=workdir, student_cfg=self.student_cfg, init_params=init,
                optim_cfg=optim_cfg(3e-3), train_cfg=tcfg, batches=data, micro_batch_size=2,
                ce_chunk_size=24, print_fn=lambda s: None, seq_len=16)
        self._check(run3)

    def test_stage3_with_the_teacher_kl_resumes_exactly(self):
        init = stages.stage2_init(self.teacher_cfg, self.teacher_params, self.student_cfg, None)

        def run3(workdir, tcfg, data):
            return stages.run_stage3(
                workdir=workdir, student_cfg=self.student_cfg, init_params=init,
                optim_cfg=optim_cfg(3e-3), train_cfg=tcfg, batches=data, micro_batch_size=2,
                ce_chunk_size=24, print_fn=lambda s: None, seq_len=16,
                teacher_cfg=self.teacher_cfg, teacher_params=self.teacher_params,
                kl_weight=0.5, kl_len=8)
        self._check(run3)

    def test_micro_batches_give_the_whole_batch_step(self):
        outs = []
        for micro in (None, 1, 2):
            outs.append(stages.run_stage2(
                workdir=self.create_tempdir().full_path, teacher_cfg=self.teacher_cfg,
                teacher_params=self.teacher_params, student_cfg=self.student_cfg,
                stage1_params=self.s1, optim_cfg=optim_cfg(3e-3), train_cfg=train_cfg(3),
                batches=grain_batches(), micro_batch_size=micro, print_fn=lambda s: None))
        for out in outs[1:]:
            np.testing.assert_allclose(out["losses"], outs[0]["losses"], rtol=2e-5)

    def test_flops_per_token(self):
        student = stages.stage2_init(self.teacher_cfg, self.teacher_params, self.student_cfg,
                                     self.s1)
        t = 16
        d, h, dh, kv, f, v = 32, 4, 8, 2, 48, 257
        attn_proj = d * (h * dh + 2 * kv * dh) + h * dh * d  # q, k, v, o
        mlp = 3 * d * f
        teacher_fwd = 2 * (2 * (attn_proj + mlp) + v * d) + 2 * (2.0 * t * dh * h)
        got = stages.stage_flops_per_token("stage2", t, teacher_cfg=self.teacher_cfg,
                                           teacher_params=self.teacher_params,
                                           student_cfg=self.student_cfg,
                                           student_params=student)
        student_train = stages.stage_flops_per_token("stage3", t, student_cfg=self.student_cfg,
                                                     student_params=student)
        self.assertAlmostEqual(got - student_train, teacher_fwd)
        # Stage 3 with the teacher's KL on the first k positions: its forward at length k,
        # for k of every t tokens.
        k = 4
        teacher_prefix = 2 * (2 * (attn_proj + mlp) + v * d) + 2 * (2.0 * k * dh * h)
        with_kl = stages.stage_flops_per_token("stage3", t, teacher_cfg=self.teacher_cfg,
                                               teacher_params=self.teacher_params,
                                               student_cfg=self.student_cfg,
                                               student_params=student, teacher_len=k)
        self.assertAlmostEqual(with_kl - student_train, teacher_prefix * k / t)
        with self.assertRaisesRegex(ValueError, "teacher_len"):
            stages.stage_flops_per_token("stage2", t, teacher_cfg=self.teacher_cfg,
                                         teacher_params=self.teacher_params,
                                         student_cfg=self.student_cfg,
                                         student_params=student, teacher_len=k)
        with self.assertRaisesRegex(ValueError, "stage4"):
            stages.stage_flops_per_token("stage4", t)


class LatestParamsTest(absltest.TestCase):
    """``latest_params`` reads only the params, whatever optimizer state was saved with them."""

    def test_params_restore_whatever_the_optimizer_layout(self):
        from lattn_jax import checkpoint as checkpoint_lib
        from lattn_jax import optim
        rng = np.random.default_rng(7)
        params = {"blocks": {"0": {"w": jnp.asarray(rng.normal(size=(6, 4)), jnp.float32),
                                   "scale": jnp.asarray(rng.normal(size=(4,)), jnp.float32)}},
                  "embed": jnp.asarray(rng.normal(size=(9, 6)), jnp.float32)}
        for flatten in (False, True):
            workdir = self.create_tempdir().full_path
            cfg = config_lib.OptimConfig(name="adamw", learning_rate=1e-3, warmup_steps=1,
                                         weight_decay=0.1, flatten=flatten)
            tx = optim.make_optimizer(cfg, 10)
            ckpt = checkpoint_lib.Checkpointer(workdir, keep=2)
            ckpt.save(5, {"params": params, "opt_state": tx.init(params),
                          "step": jnp.asarray(5, jnp.int32)})
            ckpt.close()
            got = stages.latest_params(workdir, jax.tree_util.tree_map(jnp.zeros_like, params))
            jax.tree_util.tree_map(np.testing.assert_array_equal, got, params)
        with self.assertRaisesRegex(FileNotFoundError, "no checkpoint"):
            stages.latest_params(self.create_tempdir().full_path, params)


if __name__ == "__main__":
    absltest.main()
