"""The evaluate / generate binaries: bad input ends with one clear line naming it; evaluate.py
takes a GGUF file (issue 33)."""

import dataclasses
import functools
import json
import os
import random
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

from lattn_jax import config as config_lib
from lattn_jax import train
from tests import binary_runs
from tests.lattn_jax import train_test
from tests.lattn_jax.eval import fixtures

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
_TMP = tempfile.mkdtemp(prefix="evaluate-test-")
# Starts like a GGUF file: the flag checks that come before loading see a GGUF model.
FAKE_GGUF = os.path.join(_TMP, "model.gguf")
with open(FAKE_GGUF, "wb") as _f:
    _f.write(b"GGUF\x03\x00\x00\x00")
NOT_GGUF = os.path.join(_TMP, "notes.txt")
with open(NOT_GGUF, "w") as _f:
    _f.write("hello")
EMPTY_TEXT = os.path.join(_TMP, "empty.txt")  # a perplexity file with no document
with open(EMPTY_TEXT, "w") as _f:
    _f.write("\n")
# An output directory whose results.json was cut short (a full disk, an editor).
DAMAGED_OUT = os.path.join(_TMP, "damaged-eval")
os.makedirs(DAMAGED_OUT)
with open(os.path.join(DAMAGED_OUT, "results.json"), "w") as _f:
    _f.write('{"piqa": {"acc": 0.5')


def run(binary, *flags):
    """The binary with ``flags``, in a fork of a process that imported its modules once
    (tests/binary_runs.py: a launch spent ~2.5 s importing jax and the library), compiling
    without most XLA optimizations (compile time on CPU; no test here checks numerics a
    slower program would give otherwise)."""
    cmd = [sys.executable, os.path.join(ROOT, "experiments", binary), *flags]
    return binary_runs.run(cmd, env=binary_runs.fast_compile_env())


@pytest.mark.entry
class EvaluateBinaryTest(parameterized.TestCase):

    @parameterized.named_parameters(
        ("unknown_task", "evaluate.py", ["--checkpoint=/tmp", "--tasks=piqa,hellaswg"],
         "error: unknown task 'hellaswg'"),
        ("missing_checkpoint", "evaluate.py", ["--checkpoint=/no/such/run", "--tasks=piqa"],
         "error: no such checkpoint: /no/such/run (expected a lattn-jax training workdir"),
        ("not_a_model_file", "evaluate.py", [f"--checkpoint={NOT_GGUF}", "--tasks=piqa"],
         "notes.txt is a file but not a GGUF file"),
        ("gguf_needs_output_dir", "evaluate.py", [f"--checkpoint={FAKE_GGUF}", "--tasks=piqa"],
         "error: --output_dir is required when --checkpoint is a GGUF file"),
        ("gguf_has_no_step", "evaluate.py",
         [f"--checkpoint={FAKE_GGUF}", "--step=3", "--output_dir=/tmp/x", "--tasks=piqa"],
         "error: --step applies to lattn-jax training and HALO workdirs; "),
        ("empty_perplexity_file_is_named", "evaluate.py",
         [f"--checkpoint={FAKE_GGUF}", f"--output_dir={_TMP}/out", "--tasks=perplexity",
          f"--perplexity_files={EMPTY_TEXT}"],
         f"error: --perplexity_files: {EMPTY_TEXT} has no documents to score"),
        ("gguf_has_no_validation_split", "evaluate.py",
         [f"--checkpoint={FAKE_GGUF}", "--output_dir=/tmp/x", "--tasks=perplexity"],
         "a GGUF file has none: pass text files, e.g. --perplexity_files="),
        ("limit_or_sample", "evaluate.py",
         ["--checkpoint=/tmp", "--tasks=piqa", "--limit=5", "--sample_items=5"],
         "error: limit=5 (the first N documents, as lm-evaluation-harness --limit) and "
         "sample_items=5 (a seeded random subset) are exclusive; give one"),
        ("bad_niah_lengths", "evaluate.py",
         ["--checkpoint=/tmp", "--tasks=niah", "--niah_lengths=1024,0"],
         "error: --niah_lengths=1024,0: '0' is not a positive integer (a length in tokens)"),
        # Accepted, and scored nothing: a results.json of zeros replacing a real one.
        ("zero_niah_samples", "evaluate.py",
         ["--checkpoint=/tmp", "--tasks=niah_single_1", "--niah_samples=0"],
         "error: --niah_samples=0: not a positive integer (NIAH prompts per (length, depth))"),
        # Was a traceback after the scoring (the evaluation lost).
        ("output_dir_is_a_file", "evaluate.py",
         ["--checkpoint=/tmp", "--tasks=piqa", f"--output_dir={__file__}"],
         f"error: --output_dir={__file__} exists and is not a directory"),
        # Was found when the new scores were merged into it, after the scoring (scores lost).
        # Reported before the model (a GGUF file, loaded next) is even read.
        ("damaged_results_json", "evaluate.py",
         [f"--checkpoint={FAKE_GGUF}", "--tasks=piqa", f"--output_dir={DAMAGED_OUT}"],
         f"error: {DAMAGED_OUT}/results.json is not valid JSON ("),
        ("negative_perplexity_max_docs", "evaluate.py",
         ["--checkpoint=/tmp", "--tasks=perplexity", "--perplexity_max_docs=-3"],
         "error: perplexity_max_docs must be a positive number of documents, got -3"),
        # Was "stride must be in [1, max_len]" after the model loaded.
        ("perplexity_stride_over_window", "evaluate.py",
         [f"--checkpoint={FAKE_GGUF}", "--output_dir=/tmp/x", "--tasks=perplexity",
          "--perplexity_files=/nonexistent.txt", "--perplexity_stride=4096"],
         "error: --perplexity_stride=4096 exceeds --perplexity_window=2048: "),
        # Was blamed on --data_dir, which does not change an absolute path.
        ("missing_perplexity_file", "evaluate.py",
         [f"--checkpoint={FAKE_GGUF}", "--output_dir=/tmp/x", "--tasks=perplexity",
          "--perplexity_files=/nonexistent.txt"],
         "error: --perplexity_files entry not found (nothing was scored; pass existing text "
         "files, absolute or relative to --data_dir): /nonexistent.txt\n"),
        # Was "--perplexity_files entry not found" for a directory that exists.
        ("perplexity_directory", "evaluate.py",
         [f"--checkpoint={FAKE_GGUF}", "--output_dir=/tmp/x", "--tasks=perplexity",
          f"--perplexity_files={DAMAGED_OUT}"],
         f"error: --perplexity_files: {DAMAGED_OUT} is a directory; each entry must be a text "
         f"file: pass the files to score (e.g. --perplexity_files={DAMAGED_OUT}/results.json)\n"),
        ("generate_missing_checkpoint", "generate.py",
         ["--checkpoint=/no/such/run", "--prompt=hi"],
         "error: no such checkpoint: /no/such/run (expected a lattn-jax training workdir"),
        # Was "no such checkpoint directory" although the file exists; a GGUF file now loads.
        ("generate_other_file", "generate.py", [f"--checkpoint={NOT_GGUF}", "--prompt=hi"],
         "notes.txt is a file but not a GGUF file"),
        ("generate_gguf_has_no_step", "generate.py",
         [f"--checkpoint={FAKE_GGUF}", "--step=3", "--prompt=hi"],
         f"error: step=3: a checkpoint step applies to lattn-jax training and HALO workdirs "
         f"only; "
         f"{FAKE_GGUF} is a GGUF file\n"),
        ("bad_top_p", "generate.py", ["--checkpoint=/no/such/run", "--prompt=hi", "--top_p=2"],
         "error: top_p must be in (0, 1]"),
        # Were accepted, and sampled garbage (nan) or the argmax (inf).
        ("nan_temperature", "generate.py",
         ["--checkpoint=/no/such/run", "--prompt=hi", "--temperature=nan"],
         "error: temperature must be a finite number >= 0, got nan\n"),
        ("inf_temperature", "generate.py",
         ["--checkpoint=/no/such/run", "--prompt=hi", "--temperature=inf"],
         "error: temperature must be a finite number >= 0, got inf\n"),
        ("negative_top_k", "generate.py",
         ["--checkpoint=/no/such/run", "--prompt=hi", "--top_k=-1"],
         "error: top_k must be >= 0, got -1\n"),
        # Came after the model loaded.
        ("zero_max_new_tokens", "generate.py",
         ["--checkpoint=/no/such/run", "--prompt=hi", "--max_new_tokens=0"],
         "error: max_new_tokens must be >= 1, got 0\n"),
        # Named no flag, and came after the (slow) restore.
        ("context_over_the_devices", "evaluate.py",
         ["--checkpoint=/no/such/run", "--tasks=piqa", "--context=2"],
         "error: --context=2 needs a multiple of 2 devices; there is 1\n"),
        ("generate_context_over_the_devices", "generate.py",
         ["--checkpoint=/no/such/run", "--prompt=hi", "--context=2"],
         "error: --context=2 needs a multiple of 2 devices; there is 1\n"),
        # Was "prompt 0 is empty" (counted from 0), after the model loaded.
        ("empty_prompt", "generate.py",
         ["--checkpoint=/no/such/run", "--prompt=hi", "--prompt="],
         "error: --prompt #2 is empty; give it at least one token\n"),
        ("bad_stop_token", "generate.py",
         ["--checkpoint=/no/such/run", "--prompt=hi", "--stop_token=abc"],
         "error: --stop_token=abc: token ids are integers"),
        # A count below 1 named by its flag (--limit=0 said "limit must be a positive ...").
        ("limit_zero", "evaluate.py", ["--checkpoint=/tmp", "--tasks=piqa", "--limit=0"],
         "error: --limit=0: not a positive integer (documents per zero-shot task)"),
        ("sample_items_negative", "evaluate.py",
         ["--checkpoint=/tmp", "--tasks=piqa", "--sample_items=-2"],
         "error: --sample_items=-2: not a positive integer (items per task)"),
    )
    def test_bad_input_gives_one_clear_line(self, binary, flags, message):
        result = run(binary, *flags)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn(message, result.stderr)
        self.assertNotIn("Traceback", result.stderr)

    @parameterized.named_parameters(
        ("generate_without_prompt", "generate.py", ["--checkpoint=/no/such/run"], "prompt"),
        ("evaluate_without_checkpoint", "evaluate.py", ["--tasks=piqa"], "checkpoint"),
    )
    def test_a_missing_required_flag_is_the_one_line_train_py_gives(self, binary, flags, name):
        # It was absl's "FATAL Flags parsing error: ..." plus the usage hint.
        result = run(binary, *flags)
        self.assertEqual(result.returncode, 1)
        self.assertEqual(result.stderr.strip(), f"error: flag --{name}=None: Flag --{name} "
                         f"must have a value other than None.")


@pytest.mark.entry
class EvaluateGGUFTest(absltest.TestCase):

    def test_a_gguf_file_is_evaluated_on_the_first_n_documents(self):
        out = self.create_tempdir().full_path
        gguf = fixtures.write_tiny_gguf(os.path.join(out, "tiny.gguf"))
        result = run("evaluate.py", f"--checkpoint={gguf}", "--tasks=piqa,lambada_openai",
                     "--limit=3", f"--data_dir={fixtures.HARNESS_DATA}", f"--output_dir={out}",
                     "--batch_size=4", "--max_len=512")
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        self.assertIn("(GGUF file, this run)", result.stdout)
        with open(os.path.join(out, "results.json")) as f:
            results = json.load(f)
        self.assertEqual({k: (v["n"], v["step"]) for k, v in results.items()},
                         {"piqa": (3, None), "lambada_openai": (3, None)})

    def test_generate_runs_a_gguf_file(self):
        # generate.py read training workdirs only (evaluate.py took GGUF files already).
        out = self.create_tempdir().full_path
        gguf = fixtures.write_tiny_gguf(os.path.join(out, "tiny.gguf"))
        prompts = ["The", "A longer prompt than the first"]
        args = [f"--checkpoint={gguf}", "--max_new_tokens=4"]
        args += [f"--prompt={p}" for p in prompts]
        result = run("generate.py", *args)
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        lines = result.stdout.splitlines()
        rows = [i for i, line in enumerate(lines) if line == "-" * 80]
        self.assertLen(rows, 2, result.stdout)
        self.assertTrue(lines[rows[0] - 1].startswith(prompts[0]), result.stdout)
        self.assertTrue(lines[rows[1] - 1].startswith(prompts[1]), result.stdout)
        self.assertEqual(run("generate.py", *args).stdout, result.stdout)  # greedy: the same

    def test_a_truncated_gguf_file_is_one_line_naming_it(self):
        out = self.create_tempdir().full_path
        with open(fixtures.write_tiny_gguf(os.path.join(out, "tiny.gguf")), "rb") as f:
            data = f.read()
        path = os.path.join(out, "cut.gguf")
        with open(path, "wb") as f:  # a random cut inside the tensor data
            f.write(data[:random.randrange(len(data) // 2, len(data) - 1)])
        result = run("evaluate.py", f"--checkpoint={path}", "--tasks=piqa", "--limit=3",
                     f"--data_dir={fixtures.HARNESS_DATA}", f"--output_dir={out}/eval")
        self.assertEqual(result.returncode, 1, result.stderr[-3000:])
        self.assertRegex(result.stderr.strip(), rf"^error: {path} is not a readable GGUF file: "
                                                r"[^\n]+$")

    def test_a_damaged_eval_file_is_one_line_naming_it_and_the_line(self):
        out = self.create_tempdir().full_path
        gguf = fixtures.write_tiny_gguf(os.path.join(out, "tiny.gguf"))
        data = os.path.join(out, "data")
        shutil.copytree(fixtures.HARNESS_DATA, data)
        piqa = os.path.join(data, "eval", "piqa", "valid.jsonl")
        with open(piqa) as f:
            lines = f.readlines()
        bad = random.randrange(len(lines))
        # cut short, keeping at least one character: an empty line is skipped as blank, and
        # the run then fails on the item count instead (seen once in CI on 2026-12-07)
        lines[bad] = lines[bad][:random.randrange(1, len(lines[bad]) - 2)] + "\n"
        with open(piqa, "w") as f:
            f.writelines(lines)
        result = run("evaluate.py", f"--checkpoint={gguf}", "--tasks=piqa", "--limit=3",
                     f"--data_dir={data}", f"--output_dir={out}/eval")
        self.assertEqual(result.returncode, 1, result.stderr[-3000:])
        self.assertRegex(result.stderr.strip(),
                         rf"^error: {piqa}, line {bad + 1}: not valid JSON \([^\n]+\)$")


@pytest.mark.slow
class InterruptTest(absltest.TestCase):

    def test_ctrl_c_keeps_the_finished_tasks_in_one_line(self):
        # Was a ~30-line KeyboardInterrupt traceback, exit 130 and no results.json; then,
        # through sys.exit, a segfault at exit with XLA work in flight.
        tmp = tempfile.mkdtemp()
        gguf, out = fixtures.write_tiny_gguf(os.path.join(tmp, "tiny.gguf")), f"{tmp}/eval"
        cmd = [sys.executable, os.path.join(ROOT, "experiments", "evaluate.py"),
               f"--checkpoint={gguf}", "--tasks=piqa,niah_single_1", "--batch_size=1",
               "--niah_lengths=4096,8192", "--niah_samples=8", f"--output_dir={out}",
               f"--data_dir={fixtures.HARNESS_DATA}"]
        proc = subprocess.Popen(  # a SIGINT ignored by the parent would be inherited
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        path = os.path.join(out, "results.json")
        while not os.path.exists(path) and proc.poll() is None:
            time.sleep(0.05)
        time.sleep(0.5)  # past piqa's write, into NIAH (the second task; ~2 min on 2 cores)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        self.assertEqual(proc.returncode, 130, err)
        self.assertEqual(err.strip().splitlines()[-1], f"interrupted: 1 task(s) saved to {path} "
                                                       f"(piqa); rerun to score the rest")
        self.assertNotIn("Traceback", err)
        with open(path) as f:
            self.assertEqual(list(json.load(f)), ["piqa"])


@pytest.mark.entry
class GenerateContextTest(absltest.TestCase):
    """generate.py --context=8 padded prompts to lcm(16, 8) = 16 tokens, 2 per shard, fewer
    than a width-4 convolution's 3-token halo: every short prompt failed ("2 tokens per
    context shard are fewer than the convolution's 3-token halo")."""

    def test_short_prompts_split_over_8_devices_as_on_one(self):
        tmp = self.create_tempdir().full_path
        os.makedirs(os.path.join(tmp, "data"))
        corpus = train_test.write_corpus(os.path.join(tmp, "data"), n_docs=30)
        workdir = os.path.join(tmp, "run")
        train.train_and_evaluate(train_test.tiny_experiment(corpus, total_steps=1), workdir,
                                 print_fn=lambda s: None)
        env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
                   JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
        outputs = []
        for context in (1, 8):
            result = subprocess.run(
                [sys.executable, os.path.join(ROOT, "experiments", "generate.py"),
                 f"--checkpoint={workdir}", "--prompt=Hi", "--prompt=A longer prompt",
                 "--max_new_tokens=3", f"--context={context}"],
                env=env, capture_output=True, text=True, timeout=300)
            self.assertEqual(result.returncode, 0, result.stderr[-2000:])
            outputs.append(result.stdout)
        self.assertEqual(outputs[0], outputs[1])


class HeldOutValidationTest(absltest.TestCase):
    """--tasks=perplexity scores a run's validation split only over the files it started with:
    a corpus reshuffled in place (same size) put training documents into the "validation"
    perplexity, exit 0 and no word."""

    @classmethod
    def setUpClass(cls):
        # One tiny run for the class, trained once; setUp puts its pristine copy (and the
        # corpus's) back in place before each test, which may change both.
        super().setUpClass()
        cls.shared = tempfile.mkdtemp(prefix="held-out-")
        os.makedirs(os.path.join(cls.shared, "data"))
        cls.corpus = train_test.write_corpus(
            os.path.join(cls.shared, "data"),
            n_docs=int(np.random.default_rng().integers(30, 60)))
        cls.workdir = os.path.join(cls.shared, "run")
        train.train_and_evaluate(train_test.tiny_experiment(cls.corpus, total_steps=1),
                                 cls.workdir, print_fn=lambda s: None)
        shutil.copytree(cls.workdir, os.path.join(cls.shared, "pristine-run"))
        shutil.copyfile(cls.corpus, os.path.join(cls.shared, "pristine-corpus.txt"))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.shared, ignore_errors=True)
        super().tearDownClass()

    def setUp(self):
        super().setUp()
        self.tmp = self.create_tempdir().full_path
        self.rng = np.random.default_rng()
        shutil.rmtree(self.workdir)
        shutil.copytree(os.path.join(self.shared, "pristine-run"), self.workdir)
        shutil.copyfile(os.path.join(self.shared, "pristine-corpus.txt"), self.corpus)

    def evaluate(self, name):
        return run("evaluate.py", f"--checkpoint={self.workdir}", "--tasks=perplexity",
                   "--perplexity_max_docs=2", "--perplexity_window=32",
                   "--perplexity_stride=32", f"--output_dir={self.tmp}/{name}")

    def test_a_corpus_changed_since_the_run_started_is_refused(self):
        result = self.evaluate("same")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("perplexity validation: scored the first 2 of", result.stdout)
        self.assertNotIn("note:", result.stdout)
        with open(self.corpus) as f:
            docs = f.read().split("\n\n")
        shuffled = list(docs)
        while shuffled == docs:
            self.rng.shuffle(shuffled)
        with open(self.corpus, "w") as f:  # the same size, other documents in the split
            f.write("\n\n".join(shuffled))
        result = self.evaluate("shuffled")
        self.assertEqual(result.returncode, 1)
        self.assertEqual(result.stderr.strip(), (
            f"error: data.paths: {self.corpus} changed since the run in {self.workdir} started "
            f"(same size ({os.path.getsize(self.corpus)} bytes), other contents: the SHA-256 of "
            f"its first and last MiB differs); its validation split would now hold other "
            f"documents, possibly ones it trained on. Restore the original file, or score "
            f"other text with --perplexity_files=<text files>"))
        self.assertNotIn("devices", result.stdout)  # before the restore
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "shuffled")))
        # A run recorded before data fingerprints is scored, and the output says it is unchecked.
        os.remove(os.path.join(self.workdir, train.DATA_FINGERPRINT))
        result = self.evaluate("legacy")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout.splitlines()[0], (
            f"note: {self.workdir} has no {train.DATA_FINGERPRINT} of version "
            f"{train._FINGERPRINT_VERSION} (a run recorded before data fingerprints): its "
            f"validation split is scored without checking that its data files are unchanged"))

    def test_a_run_whose_validation_split_was_not_held_out_is_refused(self):
        data = train_test.tiny_experiment(self.corpus).data
        check = functools.partial(train.check_held_out_data, self.workdir,
                                  print_fn=lambda s: None)
        check(data)  # the run as it was: fine
        link = os.path.join(self.tmp, "link.txt")
        os.symlink(self.corpus, link)
        same = [self.corpus, link, os.path.dirname(self.corpus)][int(self.rng.integers(3))]
        with self.assertRaisesRegex(config_lib.ConfigError, re.escape(
                f"perplexity 'validation' of {self.workdir}: data.val_paths shares 1 file(s) "
                f"with data.paths ({self.corpus if same != link else link}): ")):
            check(dataclasses.replace(data, val_paths=(same,)))
        # A file named twice, in a run recorded before duplicates were read once.
        record = os.path.join(self.workdir, train.DATA_FINGERPRINT)
        with open(record) as f:
            saved = json.load(f)
        del saved[train._DISTINCT_FILES]
        with open(record, "w") as f:
            json.dump(saved, f)
        twice = dataclasses.replace(data, paths=(self.corpus, link))
        with self.assertRaisesRegex(config_lib.ConfigError, re.escape(
                f"data.paths: {link} is {self.corpus} again (the same real file); the run in "
                f"{self.workdir} started when such a file was read twice")):
            check(twice)

    def test_an_unreadable_data_file_is_one_line_naming_it(self):
        # A data file that exists but cannot be read (no permission; as root, whom chmod 000
        # does not stop, an open that fails) ended evaluate.py in a traceback.
        script = (
            "import builtins, runpy, sys\n"
            "from lattn_jax import train\n"
            "def refuse(path, *a, **k):\n"
            f"    if path == {self.corpus!r}:\n"
            "        raise PermissionError(13, 'Permission denied', path)\n"
            "    return builtins.open(path, *a, **k)\n"
            "train.open = refuse\n"
            f"sys.argv = ['evaluate.py', '--checkpoint={self.workdir}', '--tasks=perplexity',\n"
            f"            '--output_dir={self.tmp}/unreadable']\n"
            "runpy.run_path('experiments/evaluate.py', run_name='__main__')\n")
        path = os.path.join(self.tmp, "evaluate_unreadable.py")
        with open(path, "w") as f:
            f.write(script)
        # Run as a binary would be by run(): in a fork of the process that imported its modules.
        result = binary_runs.run([sys.executable, path], env=binary_runs.fast_compile_env())
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertEqual(result.stderr.strip(), (
            f"error: data.paths: {self.corpus} cannot be read (Permission denied)"))
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "unreadable")))


class EvaluateFlagsTest(absltest.TestCase):

    def test_perplexity_is_batched_memory_safely_by_default(self):
        # Issue 32, trap 6: batch 16 of 2048-token windows took 8.7 GB on a CPU.
        result = run("evaluate.py", "--helpfull")
        self.assertIn("--perplexity_batch_size", result.stdout)
        flag = result.stdout.split("--perplexity_batch_size")[1].split("--")[0]
        self.assertIn("(default: '2')", " ".join(flag.split()))


if __name__ == "__main__":
    absltest.main()
