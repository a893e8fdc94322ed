"""The absl binary: bad options end with one clear line naming the option or file."""

import atexit
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest
from absl.testing import absltest, parameterized

from tests import binary_runs
from tests.lattn_jax import multihost_test

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


# The runs' environment: without most XLA optimizations (compile time on CPU), and with a
# persistent compilation cache of this test process (removed at exit), shared by the runs: they
# compile the same few programs (TINY_RUN's steps), and a cache hit returns the executable of
# the identical program, as tests/conftest.py's cache does in the test process.
_CACHE_DIR = tempfile.mkdtemp(prefix="lattn-jax-train-binary-xla-cache-")
atexit.register(shutil.rmtree, _CACHE_DIR, ignore_errors=True)
_ENV = binary_runs.fast_compile_env(JAX_COMPILATION_CACHE_DIR=_CACHE_DIR,
                                    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0.1")


def run_train(*flags):
    """experiments/train.py with ``flags``, in a fork of a process that imported its modules
    once (tests/binary_runs.py; ~2.5 s of imports a launch), in :data:`_ENV`."""
    cmd = [sys.executable, os.path.join(ROOT, "experiments", "train.py"),
           "--config=" + os.path.join(ROOT, "configs", "default.py"), *flags]
    return binary_runs.run(cmd, env=_ENV)


# A two-step-per-checkpoint run of a one-layer model on the bundled text (seconds on a CPU).
TINY_RUN = ("--config.model.layer_pattern=('attn',)", "--config.model.vocab_size=257",
            "--config.data.tokenizer=byte", "--config.data.seq_len=32",
            "--config.data.batch_size=2", "--config.data.max_val_batches=1",
            "--config.train.total_steps=4", "--config.train.checkpoint_every=2",
            "--config.train.eval_every=100", "--config.train.log_every=1",
            "--config.optim.warmup_steps=1")

# Runs experiments/train.py as __main__ with Trainer.train_step raising XLA's out-of-memory
# error at its third call (after step 2's checkpoint).
OOM_AT_STEP_3 = """
import jax
from lattn_jax import train
real_step, calls = train.Trainer.train_step, []
def train_step(self, state, batch):
    calls.append(None)
    if len(calls) == 3:
        raise jax.errors.JaxRuntimeError(
            "RESOURCE_EXHAUSTED: Out of memory allocating 123456789 bytes.\\nmore detail")
    return real_step(self, state, batch)
train.Trainer.train_step = train_step
"""

# Checkpointer.save with two Ctrl-Cs (SIGINT) at step 2: a stop request, then an interrupt.
CTRL_C_TWICE_IN_SAVE_2 = """
import os, signal, time
from lattn_jax import checkpoint
real_save = checkpoint.Checkpointer.save
def save(self, step, *args, **kwargs):
    if step == 2:
        for _ in range(2):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
    return real_save(self, step, *args, **kwargs)
checkpoint.Checkpointer.save = save
"""

# Checkpointer.save sends this process SIGTERM (a cluster's preemption) at step 2.
SIGNAL_IN_SAVE_2 = """
import os, signal, time
from lattn_jax import checkpoint
real_save = checkpoint.Checkpointer.save
def save(self, step, *args, **kwargs):
    if step == 2:
        os.kill(os.getpid(), signal.{name})
        time.sleep(0.05)
    return real_save(self, step, *args, **kwargs)
checkpoint.Checkpointer.save = save
"""

# The binary's train.stop_exit_status (called once train_and_evaluate returned, after the final
# "checkpoint:" line) sends this process a signal first: one that comes as a finished run ends.
SIGNAL_AFTER_FINISH = """
import os, signal
from lattn_jax import train
real_status = train.stop_exit_status
def stop_exit_status(result):
    os.kill(os.getpid(), signal.{name})
    return real_status(result)
train.stop_exit_status = stop_exit_status
"""

# Trainer.train_step sends this process a signal at its second call (a stop request in the
# loop, between checkpoints).
SIGNAL_AT_STEP_2 = """
import os, signal
from lattn_jax import train
real_step, calls = train.Trainer.train_step, []
def train_step(self, state, batch):
    calls.append(None)
    if len(calls) == 2:
        os.kill(os.getpid(), signal.{name})
    return real_step(self, state, batch)
train.Trainer.train_step = train_step
"""

# Trainer.eval_step sends this process a signal in the periodic evaluation at step 2.
SIGNAL_IN_EVAL_2 = """
import os, signal
from lattn_jax import train
real_eval = train.Trainer.eval_step
def eval_step(self, params, batch):
    os.kill(os.getpid(), signal.{name})
    return real_eval(self, params, batch)
train.Trainer.eval_step = eval_step
"""


_PATCHED_SCRIPTS = tempfile.mkdtemp(prefix="lattn-jax-train-patched-")
atexit.register(shutil.rmtree, _PATCHED_SCRIPTS, ignore_errors=True)


def run_train_patched(patch, *flags):
    """:func:`run_train` with the Python code ``patch`` run first, in the same process, and
    SIGHUP at its default disposition (as under a terminal, even when the suite runs under
    ``nohup``): a script file that does both, then runs experiments/train.py as ``__main__``,
    run by :mod:`tests.binary_runs` like the binary itself (its own forked process, exit
    status, stdout and stderr; the imports shared)."""
    script = os.path.join(ROOT, "experiments", "train.py")
    code = ("import signal\nsignal.signal(signal.SIGHUP, signal.SIG_DFL)\n" + patch
            + "\nimport runpy, sys\n"
            f"sys.argv[0] = {script!r}\nrunpy.run_path({script!r}, run_name='__main__')\n")
    fd, path = tempfile.mkstemp(suffix=".py", dir=_PATCHED_SCRIPTS)
    with os.fdopen(fd, "w") as f:
        f.write(code)
    cmd = [sys.executable, path, "--config=" + os.path.join(ROOT, "configs", "default.py"),
           *flags]
    return binary_runs.run(cmd, env=_ENV, timeout=300)


@pytest.mark.entry
class TrainBinaryTest(parameterized.TestCase):

    @parameterized.named_parameters(
        ("missing_file", "--config.data.paths=('/no/such/file.txt',)",
         "error: data.paths: no such file or directory: /no/such/file.txt"),
        ("option_typo", "--config.train.total_step=20",
         "error: unknown config option 'train.total_step'. Did you mean \"total_steps\""),
        # ml_collections' hint looks within the section: none for an option of another one.
        ("option_of_another_section", "--config.train.warmup_steps=10",
         "error: unknown config option 'train.warmup_steps'. Did you mean "
         "\"optim.warmup_steps\"?"),
    )
    def test_bad_option_gives_one_clear_line(self, flag, message):
        self.check_one_clear_line(flag, message)

    @parameterized.named_parameters(
        ("unknown_mixer", "--config.model.layer_pattern=('gdn','foo')",
         "error: model.layer_pattern[1]='foo' is not a known mixer"),
        ("width", "--config.model.d_model=130",
         "error: model.d_model=130 is not divisible by model.attention.num_heads=4"),
        ("chunk_size", "--config.model.gdn.chunk_size=48",
         "error: model.gdn.chunk_size must be a positive power of two, got 48"),
        # An explicitly named GPU kernel on this CPU machine: raised while tracing the step,
        # naming the option and keeping the op's reason.
        ("gpu_kernel_on_cpu", "--config.model.gdn.implementation=pallas",
         "error: model.gdn.implementation='pallas' is not supported here: gated_delta_rule: "
         "implementation='pallas' cannot run this call: the Pallas GPU kernels need a GPU"),
    )
    @pytest.mark.slow  # ~12 s per case on 2 cores (a subprocess each); two cases run in CI
    def test_more_bad_options_give_one_clear_line(self, flag, message):
        self.check_one_clear_line(flag, message)

    @pytest.mark.slow  # ~12 s on 2 cores (a subprocess)
    def test_binary_data_file_gives_one_clear_line(self):
        path = os.path.join(self.create_tempdir().full_path, "binary.txt")
        with open(path, "wb") as f:
            f.write(bytes(range(256)) * 64)
        self.check_one_clear_line(f"--config.data.paths=('{path}',)",
                                  f"error: data.paths: {path} looks binary")

    @parameterized.named_parameters(
        ("absent", "--step=5", "error: no checkpoint for step 5 in {}/checkpoints (steps: none)"),
        ("negative", "--step=-5", "error: flag --step=-5: -5 is not a non-negative integer"),
    )
    def test_bad_step_on_a_fresh_workdir_is_one_line_and_writes_nothing(self, flag, message):
        workdir = os.path.join(self.create_tempdir().full_path, "fresh")
        result = run_train("--workdir=" + workdir, flag)
        self.assertEqual(result.returncode, 1, result.stderr)
        # No orbax "cannot schedule new futures" traceback after it, no files left behind.
        self.assertEqual(result.stderr.strip().splitlines(), [message.format(workdir)])
        self.assertFalse(os.path.exists(workdir))

    def test_a_sweep_root_as_workdir_is_one_line_and_left_alone(self):
        # train.py trained into experiments/sweep.py's root (sweep.jsonl, runs/<name>/ ...).
        root = self.create_tempdir().full_path
        with open(os.path.join(root, "sweep.jsonl"), "w") as f:
            f.write('{"sweep": "tiny", "argv": ["sweep.py"]}\n')
        os.makedirs(os.path.join(root, "runs", "seed=0"))
        before = sorted(os.listdir(root))
        result = run_train("--workdir=" + root)
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertEqual(result.stderr.strip().splitlines(), [
            f"error: {root} is a sweep root (it has sweep.jsonl and runs/; experiments/sweep.py "
            f"writes it), not a training run's workdir: training would overwrite it. Use "
            f"another --workdir"])
        self.assertEqual(sorted(os.listdir(root)), before)
        self.assertEqual(os.listdir(os.path.join(root, "runs")), ["seed=0"])

    def test_a_workdir_inside_a_data_directory_is_one_line_and_writes_nothing(self):
        # The scan of data.paths read the run's own records: "error: data: /tmp/x/run 1/
        # invocations.jsonl:1: record has no field 'text'".
        data = self.create_tempdir().full_path
        with open(os.path.join(data, "a.jsonl"), "w") as f:
            f.write("".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(50)))
        workdir = os.path.join(data, "run 1")
        result = run_train("--workdir=" + workdir, f"--config.data.paths=('{data}',)")
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertEqual(result.stderr.strip().splitlines(), [
            f"error: --workdir={workdir} is inside the data.paths directory {data}, whose scan "
            f"would read the run's own records (invocations.jsonl, metrics.jsonl, console.log, "
            f"...) as data: use a --workdir outside it, or name the data files themselves in "
            f"data.paths"])
        self.assertFalse(os.path.exists(workdir))

    def test_validation_files_among_the_training_files_are_one_line_and_write_nothing(self):
        # data.val_paths=data.paths trained on the validation set: its loss was not held out.
        data = self.create_tempdir().full_path
        paths = []
        for i in range(int(np.random.default_rng().integers(1, 4))):
            paths.append(os.path.join(data, f"part{i}.txt"))
            with open(paths[-1], "w") as f:
                f.write("\n\n".join(f"document {i}.{j} " * 8 for j in range(20)))
        shared = paths if np.random.default_rng().integers(2) else [data]
        workdir = os.path.join(self.create_tempdir().full_path, "fresh")
        result = run_train("--workdir=" + workdir, *TINY_RUN,
                           f"--config.data.paths={tuple(paths)!r}",
                           f"--config.data.val_paths={tuple(shared)!r}")
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertEqual(result.stderr.strip().splitlines(), [
            f"error: data: data.val_paths shares {len(paths)} file(s) with data.paths "
            f"({', '.join(paths)}): their documents would be trained on and held out for "
            f"validation at once; give data.val_paths files that data.paths does not read, or "
            f"leave data.val_paths unset to hold out data.val_fraction of data.paths' "
            f"documents"])
        self.assertFalse(os.path.exists(workdir))

    def _broken_corpus(self, name="broken.jsonl"):
        """A JSONL corpus whose records are 90% bad (no text field, or not JSON)."""
        path = os.path.join(self.create_tempdir().full_path, name)
        lines = [json.dumps({"text": f"document {i} " * 8}) if i % 10 == 0 else
                 json.dumps({"txt": "x"}) if i % 3 else "{oops" for i in range(3000)]
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        return path

    def test_a_mostly_broken_corpus_is_one_line_naming_it_and_writes_nothing(self):
        path = self._broken_corpus()
        workdir = os.path.join(self.create_tempdir().full_path, "fresh")
        result = run_train("--workdir=" + workdir, *TINY_RUN, f"--config.data.paths=('{path}',)")
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertNotIn("Traceback", result.stderr)
        self.assertRegex(result.stderr.strip().splitlines()[-1], re.escape(
            f"error: data: {path}: stopped: 11 of the 13 records read so far are bad (85%: ")
            + r".* more than data\.max_bad_fraction=0\.01 allows")
        self.assertFalse(os.path.exists(workdir))

    def test_a_resume_past_max_bad_fraction_stops_before_touching_the_checkpoints(self):
        # A run allowed 95% bad records, resumed without that option: refused with one line
        # when the data is read, its checkpoint and records as they were.
        path = self._broken_corpus()
        workdir = os.path.join(self.create_tempdir().full_path, "run")
        flags = (*TINY_RUN, f"--config.data.paths=('{path}',)")
        result = run_train("--workdir=" + workdir, *flags, "--config.train.total_steps=2",
                           "--config.data.max_bad_fraction=0.95")
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        with open(os.path.join(workdir, "metrics.jsonl")) as f:
            metrics = f.read()
        result = run_train("--workdir=" + workdir, *flags)
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertNotIn("Traceback", result.stderr)
        self.assertRegex(result.stderr.strip().splitlines()[-1], re.escape(
            f"error: data: {path}: stopped: 11 of the 13 records read so far are bad"))
        self.assertEqual(os.listdir(os.path.join(workdir, "checkpoints")), ["2"])
        with open(os.path.join(workdir, "metrics.jsonl")) as f:
            self.assertEqual(f.read(), metrics)

    def test_config_file_without_get_config_is_one_line_naming_it(self):
        # Was "error: module 'config_config' has no attribute 'get_config'".
        workdir = os.path.join(self.create_tempdir().full_path, "fresh")
        path = os.path.join(ROOT, "configs", "common.py")
        cmd = [sys.executable, os.path.join(ROOT, "experiments", "train.py"),
               f"--config={path}", f"--workdir={workdir}"]
        result = binary_runs.run(cmd, env=_ENV)  # (run_train's driver: imports shared)
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertEqual(result.stderr.strip().splitlines(), [
            f"error: --config={path}: {path} has no get_config() (a config file defines "
            f"get_config(), returning the experiment's ConfigDict)"])
        self.assertFalse(os.path.exists(workdir))

    def test_out_of_memory_at_a_later_step_is_one_line_and_keeps_the_checkpoint(self):
        # It ended in a long RESOURCE_EXHAUSTED traceback (only the first step's was one line).
        workdir = os.path.join(self.create_tempdir().full_path, "run")
        result = run_train_patched(OOM_AT_STEP_3, "--workdir=" + workdir, *TINY_RUN)
        self.assertEqual(result.returncode, 1, result.stderr)
        path = os.path.join(workdir, "checkpoints")
        self.assertEqual(result.stderr.strip().splitlines()[-1], (
            f"error: out of device memory in train step 3 (data.batch_size=2, data.seq_len=32, "
            f"train.micro_batch_size=None); the last checkpoint, step 2 in {path}/2, is intact: "
            f"running the same command again resumes from it. To fit: lower data.batch_size or "
            f"data.seq_len, or set a smaller train.micro_batch_size (gradient accumulation; same "
            f"batch per step); a resumed run keeps data.batch_size and data.seq_len (changing "
            f"them needs a new --workdir). XLA: RESOURCE_EXHAUSTED: Out of memory allocating "
            f"123456789 bytes."))
        self.assertNotIn("Traceback", result.stderr)
        self.assertEqual(os.listdir(path), ["2"])
        with open(os.path.join(workdir, "metrics.jsonl")) as f:
            self.assertEqual([json.loads(line)["step"] for line in f], [1, 2])

    def test_ctrl_c_twice_during_a_save_finishes_it_and_says_so_in_one_line(self):
        workdir = os.path.join(self.create_tempdir().full_path, "run")
        result = run_train_patched(CTRL_C_TWICE_IN_SAVE_2, "--workdir=" + workdir, *TINY_RUN)
        self.assertEqual(result.returncode, 130, result.stderr)
        path = os.path.join(workdir, "checkpoints")
        self.assertEqual(result.stderr.strip().splitlines()[-1], (
            f"interrupted (Ctrl-C): the checkpoint at step 2 ({path}/2) is complete; stopped "
            f"there on Ctrl-C: run the same command again to resume from it"))
        self.assertNotIn("Traceback", result.stderr)
        self.assertEqual(os.listdir(path), ["2"])

    @parameterized.parameters(("SIGTERM", 143), ("SIGHUP", 129))
    def test_sigterm_during_the_stop_path_save_finishes_it_and_says_so_in_one_line(
            self, name, status):
        # The stop path (here max_steps_per_run) saved under the default SIGTERM handler: a
        # SIGTERM then killed the process mid-write (status -15, no step 2); so did a SIGHUP
        # (an ssh disconnect), under its default handler at any time. The status is the
        # shell's for the signal (128 + its number), which the sweep counts as no failure.
        workdir = os.path.join(self.create_tempdir().full_path, "run")
        result = run_train_patched(SIGNAL_IN_SAVE_2.format(name=name), "--workdir=" + workdir,
                                   *TINY_RUN, "--config.train.checkpoint_every=5",
                                   "--config.train.max_steps_per_run=2")
        self.assertEqual(result.returncode, status, result.stderr)
        path = os.path.join(workdir, "checkpoints")
        self.assertEqual(result.stderr.strip().splitlines()[-1], (
            f"terminated ({name}): the checkpoint at step 2 ({path}/2) is complete; stopped "
            f"there on {name}: run the same command again to resume from it"))
        self.assertNotIn("Traceback", result.stderr)
        self.assertEqual(os.listdir(path), ["2"])

    @parameterized.parameters("SIGTERM", "SIGHUP")
    def test_a_signal_after_the_final_checkpoint_of_a_finished_run_exits_0(self, name):
        # It came under the default handler: status 143 (129) for a run that had finished (a
        # rerun said "run already finished at step 4"), which a scheduler reads as stopped.
        workdir = os.path.join(self.create_tempdir().full_path, "run")
        result = run_train_patched(SIGNAL_AFTER_FINISH.format(name=name),
                                   "--workdir=" + workdir, *TINY_RUN)
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        path = os.path.join(workdir, "checkpoints")
        self.assertEqual(result.stdout.strip().splitlines()[-1], f"checkpoint: {path}/4")
        self.assertEqual(result.stderr.strip().splitlines()[-1], (
            f"{name} after the run completed at step 4 (its final checkpoint is written): "
            f"nothing to stop"))
        self.assertNotIn("Traceback", result.stderr)

    def test_a_sigterm_in_a_periodic_evaluation_stops_with_the_shells_status(self):
        # The run saved step 2 and stopped (the evaluation cut short: EvaluationStopped) but
        # exited 0, so a scheduler or a shell loop took the preempted run for a finished one.
        workdir = os.path.join(self.create_tempdir().full_path, "run")
        result = run_train_patched(SIGNAL_IN_EVAL_2.format(name="SIGTERM"),
                                   "--workdir=" + workdir, *TINY_RUN,
                                   "--config.train.eval_every=2",
                                   "--config.data.max_val_batches=2")
        self.assertEqual(result.returncode, 143, result.stderr[-3000:])
        self.assertIn("the evaluation at step 2 stopped after 1 of 2 validation batches "
                      "(SIGTERM); not recorded", result.stdout)
        self.assertIn("Stopping at step 2 of 4 (SIGTERM (preemption)); checkpoint saved, run "
                      "again to resume.", result.stdout)
        self.assertNotIn("final: step", result.stdout)
        self.assertEqual(os.listdir(os.path.join(workdir, "checkpoints")), ["2"])

    @pytest.mark.slow  # ~40 s on 2 cores (three subprocesses); the SIGTERM case runs in CI
    def test_every_early_stop_in_the_loop_exits_non_zero_and_a_step_limit_exits_0(self):
        # SIGHUP (an ssh disconnect) and one Ctrl-C stopped the run after a checkpoint and
        # exited 0. train.max_steps_per_run is a stop the command asked for: still 0 (the
        # sweep counts that run as partial from its console.log, not from the status).
        for name, status in (("SIGHUP", 129), ("SIGINT", 130)):
            workdir = os.path.join(self.create_tempdir().full_path, "run")
            result = run_train_patched(SIGNAL_AT_STEP_2.format(name=name),
                                       "--workdir=" + workdir, *TINY_RUN)
            self.assertEqual(result.returncode, status, (name, result.stderr[-3000:]))
            self.assertIn("Stopping at step 2 of 4 (", result.stdout, name)
            self.assertEqual(os.listdir(os.path.join(workdir, "checkpoints")), ["2"], name)
        workdir = os.path.join(self.create_tempdir().full_path, "run")
        result = run_train("--workdir=" + workdir, *TINY_RUN,
                           "--config.train.max_steps_per_run=2")
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        self.assertIn("Stopping at step 2 of 4 (train.max_steps_per_run=2)", result.stdout)

    def test_a_finished_run_again_says_so_in_one_line_and_records_no_result(self):
        # The same command on a finished run evaluated the restored model again and appended
        # a second final val_loss record (and another "final:" line) to the run's records.
        workdir = os.path.join(self.create_tempdir().full_path, "run")
        result = run_train("--workdir=" + workdir, *TINY_RUN)
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        # (each invocation is logged, and holds the lock)
        logs = ("invocations.jsonl", "console.log", ".train.lock")
        before = {}
        for name in sorted(os.listdir(workdir)):
            if os.path.isfile(os.path.join(workdir, name)) and name not in logs:
                with open(os.path.join(workdir, name), "rb") as f:
                    before[name] = f.read()
        self.assertIn("metrics.jsonl", before)
        result = run_train("--workdir=" + workdir, *TINY_RUN)
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        val = [json.loads(line)["val_loss"] for line in before["metrics.jsonl"].splitlines()
               if b"val_loss" in line]
        self.assertLen(val, 1)
        path = os.path.join(workdir, "checkpoints")
        self.assertEqual(result.stdout.strip().splitlines()[-1], (
            f"run already finished at step 4 (train.total_steps=4; final val_loss {val[0]:.4f}, "
            f"checkpoint {path}/4): nothing to do. Raise --config.train.total_steps to train "
            f"on."))
        self.assertNotIn("final: step", result.stdout)
        after = {}
        for name in sorted(os.listdir(workdir)):
            if os.path.isfile(os.path.join(workdir, name)) and name not in logs:
                with open(os.path.join(workdir, name), "rb") as f:
                    after[name] = f.read()
        self.assertEqual(after, before)
        with open(os.path.join(workdir, "console.log")) as f:
            self.assertEqual(len(re.findall(r"^final: step 4 ", f.read(), re.M)), 1)
        self.assertCountEqual(os.listdir(path), ["2", "4"])

    def test_a_mesh_over_the_devices_is_refused_before_the_data_is_read(self):
        # It was refused only after the corpus was read and tokenized.
        workdir = os.path.join(self.create_tempdir().full_path, "run")
        result = run_train("--workdir=" + workdir, *TINY_RUN, "--config.mesh.data=2")
        self.assertEqual(result.returncode, 1)
        self.assertEqual(result.stderr.strip().splitlines(), [
            "error: mesh data x fsdp x context x tensor = 2 x 1 x 1 x 1 needs 2 devices, but "
            "there are 1"])
        self.assertNotIn("data:", result.stdout)
        self.assertFalse(os.path.exists(workdir))

    def test_ctrl_c_while_jax_is_imported_is_one_line_and_status_130(self):
        # 2026-12-07 newcomer pass: a Ctrl-C in the first 1-2 s (jax's imports) printed a
        # 30-line traceback, an ImportError, or nothing at all (swallowed by a gc callback: the
        # run went on). A real SIGINT (a plain subprocess), sent once -X importtime shows a jax
        # module imported: deterministic, and the process ends at once (~1 s).
        workdir = os.path.join(self.create_tempdir().full_path, "run")
        proc = subprocess.Popen(
            [sys.executable, "-X", "importtime", os.path.join(ROOT, "experiments", "train.py"),
             "--config=" + os.path.join(ROOT, "configs", "default.py"), "--workdir=" + workdir],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        try:
            for line in proc.stderr:  # "import time:   242 |   10799 |   jax.version"
                if time.monotonic() > deadline:
                    self.fail("no jax import seen in -X importtime's lines")
                if re.match(r"import time:.*\|\s+jax\.", line):
                    proc.send_signal(signal.SIGINT)
                    break
            rest = proc.stderr.read()
            proc.wait(timeout=60)
        finally:  # a run that ignored the signal must not outlive the test
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
            proc.stderr.close()
        lines = [x for x in rest.splitlines() if not x.startswith("import time:")]
        self.assertEqual(proc.returncode, 130, rest[-2000:])
        self.assertEqual(lines, ["interrupted (Ctrl-C) while starting; nothing was written"])
        self.assertFalse(os.path.exists(workdir))

    @pytest.mark.slow
    def test_ctrl_c_in_start_up_exits_130_without_a_crash(self):
        # 2026-12-05 newcomer pass: a Ctrl-C 3 to 4.5 s into the default run printed its line,
        # then "Fatal Python error: Segmentation fault" (status -11) in 3 of 6 tries: the
        # interpreter's shutdown with XLA work in flight. A real SIGINT at several moments of
        # the start-up (a plain subprocess: binary_runs' forks do not start up the same way).
        cmd = [sys.executable, os.path.join(ROOT, "experiments", "train.py"),
               "--config=" + os.path.join(ROOT, "configs", "default.py"),
               "--config.train.total_steps=40"]
        for delay in (2.5, 3.0, 3.5, 4.5):
            workdir = os.path.join(self.create_tempdir().full_path, "run")
            proc = subprocess.Popen(cmd + ["--workdir=" + workdir], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
            try:
                time.sleep(delay)
                proc.send_signal(signal.SIGINT)
                _, err = proc.communicate(timeout=120)
            finally:  # a run that ignored the signal must not outlive the test
                if proc.poll() is None:
                    proc.kill()
                    proc.communicate()
            with self.subTest(delay=delay):
                self.assertEqual(proc.returncode, 130, err[-2000:])
                self.assertIn("Ctrl-C", err)  # in start-up, or (a slower host) after a step
                self.assertNotIn("Fatal Python error", err)

    def test_float16_on_the_cpu_is_refused_before_the_data_is_read(self):
        # 2026-12-05 newcomer pass: the config check accepted it and the first step failed with
        # a 40-line traceback (dot_general precision F16_F16_F32 is not supported on CPU).
        workdir = os.path.join(self.create_tempdir().full_path, "run")
        result = run_train("--workdir=" + workdir, *TINY_RUN, "--config.model.dtype=float16")
        self.assertEqual(result.returncode, 1)
        self.assertEqual(result.stderr.strip().splitlines(), [
            "error: model.dtype=float16 is not supported on the CPU backend (XLA's CPU matrix "
            "product has no float16 x float16 -> float32); use float32 or bfloat16 here, "
            "float16 on a GPU"])
        self.assertNotIn("data:", result.stdout)
        self.assertFalse(os.path.exists(workdir))

    def test_a_start_with_another_model_width_writes_nothing_and_says_so(self):
        # It called the checkpoint unreadable, advised moving it away, and wrote a config.json
        # of the wrong width, which then refused the right command. evaluate.py on a workdir
        # whose config.json describes another model says the same in one line.
        workdir = os.path.join(self.create_tempdir().full_path, "run")
        result = run_train("--workdir=" + workdir, *TINY_RUN, "--config.model.d_model=64")
        self.assertEqual(result.returncode, 0, result.stderr)
        with open(os.path.join(workdir, "config.json")) as f:
            good_config = f.read()
        os.remove(os.path.join(workdir, "config.json"))
        result = run_train("--workdir=" + workdir, *TINY_RUN, "--config.model.d_model=32")
        path = os.path.join(workdir, "checkpoints")
        self.assertEqual(result.returncode, 1)
        self.assertEqual(result.stderr.strip().splitlines()[-1], (
            f"error: the checkpoint at step 4 in {path} is of a different model (its parameter "
            f"tree/shapes do not match this config: params/blocks/0/mixer/out_proj/kernel has "
            f"shape (64, 64) there, (32, 32) here (and 23 more)); use the options it was "
            f"trained with or a new --workdir"))
        self.assertNotIn("Traceback", result.stderr)
        self.assertFalse(os.path.exists(os.path.join(workdir, "config.json")))
        self.assertCountEqual(os.listdir(path), ["2", "4"])  # nothing set aside
        with open(os.path.join(workdir, "config.json"), "w") as f:
            f.write(good_config.replace('"d_model": 64', '"d_model": 32'))
        evaluate = binary_runs.run(
            [sys.executable, os.path.join(ROOT, "experiments", "evaluate.py"),
             "--checkpoint=" + workdir, "--tasks=perplexity",
             "--perplexity_files=" + os.path.join(ROOT, "README.md")],
            env=_ENV)  # (run_train's driver: jax and the library imported once)
        self.assertEqual(evaluate.returncode, 1)
        self.assertEqual(evaluate.stderr.strip().splitlines()[-1], (
            f"error: the checkpoint at step 4 in {path} is of a different model (its parameter "
            f"tree/shapes do not match this config: params/blocks/0/mixer/out_proj/kernel has "
            f"shape (64, 64) there, (32, 32) here (and 23 more)); {workdir}/config.json does "
            f"not describe the model it holds"))
        os.remove(os.path.join(workdir, "config.json"))
        result = run_train("--workdir=" + workdir, *TINY_RUN, "--config.model.d_model=64",
                           "--config.train.total_steps=6")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn(f"Resuming from the checkpoint at step 4 in {path}", result.stdout
                      + result.stderr)
        with open(os.path.join(workdir, "config.json")) as f:
            self.assertEqual(json.load(f)["model"]["d_model"], 64)

    @pytest.mark.slow  # two processes of one JAX distributed run (~8 s alone on 2 cores)
    def test_sigterm_to_one_process_of_two_stops_both_at_one_step(self):
        # The watcher's Python handler replaced JAX's preemption notifier, so the processes did
        # not agree on a step: the one that got SIGTERM left the loop for its save while the
        # other waited in the next step's collectives, and both hung.
        workdir = os.path.join(self.create_tempdir().full_path, "run")
        port, env = multihost_test.free_port(), multihost_test.one_device_cpu_env()
        procs, outs = [], []
        for pid in range(2):
            out = open(os.path.join(self.create_tempdir().full_path, "out"), "w+")
            self.addCleanup(out.close)
            procs.append(subprocess.Popen(
                [sys.executable, os.path.join(ROOT, "experiments", "train.py"),
                 "--config=" + os.path.join(ROOT, "configs", "default.py"),
                 "--workdir=" + workdir, f"--coordinator_address=localhost:{port}",
                 "--num_processes=2", f"--process_id={pid}", *TINY_RUN,
                 "--config.train.total_steps=100000", "--config.train.checkpoint_every=50000"],
                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env, text=True))
            outs.append(out)
        try:
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline and "step     5  train_loss" not in _text(outs[0]):
                time.sleep(0.2)
            procs[1].send_signal(signal.SIGTERM)  # process 1 only: the service tells process 0
            for proc in procs:
                proc.wait(timeout=120)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
        # (the shell's status for SIGTERM: a preempted run is not a finished one)
        self.assertEqual([p.returncode for p in procs], [143, 143], _text(outs[0])[-2000:])
        stops = re.findall(r"Stopping at step (\d+) of 100000 \(SIGTERM \(preemption\)\); "
                           r"checkpoint saved", _text(outs[0]))
        self.assertLen(stops, 1)
        self.assertEqual(os.listdir(os.path.join(workdir, "checkpoints")), stops)

    def check_one_clear_line(self, flag, message):
        result = run_train("--workdir=" + self.create_tempdir().full_path, flag)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn(message, result.stderr)
        self.assertNotIn("Traceback", result.stderr)


def _text(f):
    f.flush()
    f.seek(0)
    return f.read()


if __name__ == "__main__":
    absltest.main()
