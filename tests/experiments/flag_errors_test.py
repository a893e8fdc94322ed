"""Every absl binary reports a bad command line in one line (``lattn_jax.flag_errors``), not absl's
two-line ``FATAL Flags parsing error: ... Pass --helpshort ...``."""

import glob
import os
import subprocess
import sys

import pytest
from absl import flags
from absl.testing import absltest, parameterized

from lattn_jax import config as config_lib
from lattn_jax import flag_errors
from tests import binary_runs

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def run(binary, *args):
    """The binary with ``args``, in a fork of a process that imported its modules once
    (tests/binary_runs.py: a launch of a binary with jax spent ~2.5 s importing)."""
    cmd = [sys.executable, os.path.join(ROOT, binary), *args]
    return binary_runs.run(cmd)


# Each binary with the command line that fails flag parsing: without a required flag where it
# has one (the first required flag is named), else with a flag it does not define. Each run stops
# at parsing (about 0.1 s for the binaries without jax, 1-2 s with it).
CASES = (
    ("build_corpus", "experiments/build_corpus.py", [], "output_dir"),
    ("corpus_pieces", "experiments/corpus_pieces.py", [], "mode"),
    ("generate_corpus", "experiments/generate_corpus.py", ["--output_dir=/tmp/x"], "model"),
    ("halo_report", "experiments/halo_report.py", [], "workdir"),
    ("prepare_data", "experiments/prepare_data.py", ["--output_dir=/tmp/x"], "input"),
    ("vital_topics", "experiments/vital_topics.py", [], "output"),
    ("profile_fwd", "benchmarks/profile_fwd.py", [], "out"),
    ("profile_t0", "benchmarks/profile_t0.py", [], "out"),
    ("profile_grad", "benchmarks/profile_grad.py", [], "out"),
    ("profile_wy_bwd", "benchmarks/profile_wy_bwd.py", [], "out"),
    ("fetch_eval_data", "experiments/fetch_eval_data.py", ["--no_such_flag"], None),
    ("halo_eval_subset", "experiments/halo_eval_subset.py", ["--no_such_flag"], None),
    ("bench_kernels", "benchmarks/bench_kernels.py", ["--no_such_flag"], None),
    ("bench_optimizer", "benchmarks/bench_optimizer.py", ["--no_such_flag"], None),
    ("gpu_tests", "benchmarks/gpu_tests.py", ["--no_such_flag"], None),
    ("kernel_registers", "benchmarks/kernel_registers.py", ["--no_such_flag"], None),
    ("offline_ptxas", "benchmarks/offline_ptxas.py", ["--no_such_flag"], None),
)


@pytest.mark.entry
class BinaryFlagErrorTest(parameterized.TestCase):

    @parameterized.named_parameters(*CASES)
    def test_a_bad_command_line_is_one_error_line(self, binary, args, required):
        result = run(binary, *args)
        self.assertEqual(result.returncode, 1, result.stderr)
        lines = result.stderr.strip().splitlines()
        self.assertLen(lines, 1, result.stderr)
        if required:
            self.assertEqual(lines[0], f"error: flag --{required}=None: Flag --{required} "
                             f"must have a value other than None.")
        else:
            self.assertEqual(lines[0], "error: Unknown command line flag 'no_such_flag'")


@pytest.mark.entry
class ConfigFileErrorTest(parameterized.TestCase):
    """A --config that cannot be loaded is ``cannot load --config=<path>: <reason>`` (before:
    a directory said "Configuration is not available because of an earlier failure to load:
    [Errno 21] ...", a non-Python file only its SyntaxError)."""

    @parameterized.named_parameters(
        ("directory", "configs", "error: cannot load --config=configs: Is a directory"),
        ("missing", "configs/nope.py",
         "error: cannot load --config=configs/nope.py: No such file or directory"),
        ("not_python", "{tmp}/notes.md",
         "error: cannot load --config={tmp}/notes.md: line 2: unterminated string literal "
         "(detected at line 2) (a config file is a Python file defining get_config())"),
        ("bad_python", "{tmp}/bad.py",
         "error: cannot load --config={tmp}/bad.py: line 1: invalid syntax"))
    def test_an_unloadable_config_is_one_line_naming_it(self, value, expected):
        tmp = self.create_tempdir().full_path
        for name, text in (("notes.md", "# Notes\nIt's a note.\n"),
                           ("bad.py", "def get_config(:\n")):
            with open(os.path.join(tmp, name), "w") as f:
                f.write(text)
        value, expected = value.format(tmp=tmp), expected.format(tmp=tmp)
        workdir = os.path.join(tmp, "w")
        result = run("experiments/train.py", f"--config={value}", f"--workdir={workdir}")
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertEqual(result.stderr.strip().splitlines(), [expected])
        self.assertFalse(os.path.exists(workdir))


@pytest.mark.entry
class StrayArgumentsTest(parameterized.TestCase):
    """A word that is no flag (an unquoted value with spaces) is one line, not the help text
    (49 lines for generate.py) ending with it (2026-12-06 newcomer pass)."""

    @parameterized.named_parameters(
        ("generate", "experiments/generate.py",
         ["--checkpoint=/no/such/run", "--prompt=The", "history", "of"],
         "error: unexpected arguments ['history', 'of'] (quote a value with spaces: "
         "--prompt=\"The history of\")"),
        ("train", "experiments/train.py",
         ["--config=configs/default.py", "--workdir", "/tmp/x", "extra"],
         "error: unexpected arguments ['extra'] (quote a value with spaces: "
         "--workdir=\"/tmp/x extra\")"),
        ("fetch_eval_data", "experiments/fetch_eval_data.py", ["stray"],
         "error: unexpected arguments ['stray']"),
    )
    def test_a_stray_word_is_one_line_with_the_quoted_flag(self, binary, args, expected):
        result = run(binary, *args)
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertEqual(result.stderr.strip().splitlines(), [expected])

    def test_every_binary_rejects_stray_words_with_the_helper(self):
        binaries = sorted(glob.glob(os.path.join(ROOT, "experiments", "*.py")))
        self.assertNotEmpty(binaries)
        for path in binaries:
            with self.subTest(binary=os.path.basename(path)), open(path) as f:
                text = f.read()
                self.assertRegex(text, r"\n    (flag_errors|config_lib)\.reject_arguments\(argv\)")
                self.assertNotIn("unexpected arguments", text)

    def test_the_hint_quotes_the_flag_the_words_followed(self):
        def line(argv, command_line):
            with self.assertRaises(SystemExit) as cm:
                flag_errors.reject_arguments(argv, command_line)
            return cm.exception.code

        flag_errors.reject_arguments(["prog"], ["prog", "--a=1"])  # nothing stray: returns
        self.assertEqual(line(["p", "b", "c"], ["p", "--x=a", "b", "c", "--y=2"]),
                         "error: unexpected arguments ['b', 'c'] (quote a value with spaces: "
                         "--x=\"a b c\")")
        self.assertEqual(line(["p", "b"], ["p", "--x", "a", "b"]),
                         "error: unexpected arguments ['b'] (quote a value with spaces: "
                         "--x=\"a b\")")
        self.assertEqual(line(["p", "b"], ["p", "b", "--x=a"]),
                         "error: unexpected arguments ['b']")
        self.assertEqual(line(["p", "b"], ["p", "--flag", "b"]),  # a boolean flag before it
                         "error: unexpected arguments ['b']")
        self.assertEqual(line(["p", "$b"], ["p", "--x=a", "$b"]),  # quoted for the shell
                         "error: unexpected arguments ['$b'] (quote a value with spaces: "
                         "--x='a $b')")


class FlagErrorsModuleTest(absltest.TestCase):

    def test_config_re_exports_the_helpers(self):
        self.assertIs(config_lib.parse_flags, flag_errors.parse_flags)
        self.assertIs(config_lib.describe_flag_error, flag_errors.describe_flag_error)
        self.assertIs(config_lib.bare_tuple_override, flag_errors.bare_tuple_override)

    def test_importing_it_pulls_neither_jax_nor_numpy(self):
        # Light binaries (fetch_eval_data.py, the benchmark drivers) import it at start-up.
        code = ("import sys; import lattn_jax.flag_errors; "
                "print(sorted(m for m in ('jax', 'numpy', 'ml_collections', 'lattn_jax.config') "
                "if m in sys.modules))")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             cwd=ROOT, timeout=60, check=True).stdout
        self.assertEqual(out.strip(), "[]")

    def test_an_unknown_flag_is_one_line_in_process(self):
        fv = flags.FlagValues()
        flags.DEFINE_string("name", None, "A name.", flag_values=fv)
        with self.assertRaises(flags.UnrecognizedFlagError) as cm:
            fv(["prog", "--nmae=x"])
        self.assertEqual(flag_errors.describe_flag_error(cm.exception),
                         "Unknown command line flag 'nmae'. Did you mean: name ?")


# Config files whose own code fails, each with the line its error names: a KeyError, a missing
# ConfigDict field, 1/0 and a missing import read as "unknown config option 'boom'" / 'model',
# a bare "division by zero" and "No module named 'x'" (newcomer 2026-12-07).
_FAILING_CONFIGS = (
    ("key_error", "def get_config():\n    raise KeyError('boom')\n",
     "(line 2): KeyError: 'boom'"),
    ("missing_field", "import ml_collections\n\n\ndef get_config():\n"
     "    config = ml_collections.ConfigDict(dict(modle=1))\n    return config.model\n",
     "(line 6): AttributeError: 'model' Did you mean \"modle\" instead of \"model\"?"),
    ("zero_division", "def get_config():\n    x = 1\n    return x / 0\n",
     "(line 3): ZeroDivisionError: division by zero"),
    ("missing_import", "import no_such_module_x\n\n\ndef get_config():\n    return None\n",
     "(line 1): ModuleNotFoundError: No module named 'no_such_module_x'"),
    # absl and ml_collections re-raise a ValueError (the original as context): still its line.
    ("value_error", "def get_config():\n    raise ValueError('bad value')\n",
     "(line 2): ValueError: bad value"),
)


class ConfigFileCodeErrorTest(parameterized.TestCase):
    """An error raised by a config file's own code is ``error in --config=FILE (line N):
    ExcType: message``, apart from command-line errors (a bad override or ``:arg``)."""

    def parse(self, path, *overrides):
        from ml_collections import config_flags  # noqa: PLC0415 (this test only)
        fv = flags.FlagValues()
        argv = ["prog", f"--config={path}", *overrides]
        config_flags.DEFINE_config_file("config", None, "A config.", flag_values=fv,
                                        sys_argv=argv)
        try:  # not assertRaises: it drops the traceback, which tells the file's errors apart
            fv(argv)
        except Exception as e:  # noqa: BLE001 - whatever the file raises
            return e, argv
        self.fail(f"{argv} parsed")

    def write(self, text):
        path = os.path.join(self.create_tempdir().full_path, "cfg.py")
        with open(path, "w") as f:
            f.write(text)
        return path

    @parameterized.named_parameters(*_FAILING_CONFIGS)
    def test_an_error_in_the_config_file_names_its_file_and_line(self, text, expected):
        path = self.write(text)
        error, argv = self.parse(path)
        self.assertEqual(flag_errors.describe_config_file_error(error, argv),
                         f"error in --config={path} {expected}")

    def test_command_line_errors_keep_their_own_message(self):
        path = self.write("import ml_collections\n"
                          "from lattn_jax import flag_errors\n\n\n"
                          "def get_config(arg=None):\n"
                          "    if arg:\n"
                          "        raise flag_errors.ConfigArgumentError("
                          "'unknown argument ' + arg)\n"
                          "    return ml_collections.ConfigDict(dict(model=dict(d_model=1)))\n")
        error, argv = self.parse(path, "--config.model.d_modle=3")  # a mistyped override
        self.assertIsNone(flag_errors.describe_config_file_error(error, argv))
        self.assertEqual(flag_errors.describe_flag_error(error, argv),
                         "unknown config option 'model.d_modle'. Did you mean \"d_model\" "
                         "instead of \"d_modle\"?")
        error, argv = self.parse(path + ":bogus")  # a bad :arg the config refuses
        self.assertIsNone(flag_errors.describe_config_file_error(error, argv))
        self.assertEqual(flag_errors.describe_flag_error(error, argv),
                         f"flag --config={path}: unknown argument bogus")

    def test_an_override_into_a_missing_section_is_named_in_full(self):
        # ml_collections names only the section it did not find ("kda"); a newcomer read
        # "unknown config option 'kda'" for --config.model.kda.chunk_size=32 (2026-12-07d).
        path = self.write("import ml_collections\n\n\n"
                          "def get_config():\n"
                          "    return ml_collections.ConfigDict(dict(model=dict(\n"
                          "        d_model=1, gdn=dict(chunk_size=64))))\n")
        error, argv = self.parse(path, "--config.model.kda.chunk_size=32")
        message = flag_errors.describe_flag_error(error, argv)
        self.assertIn("model.kda.chunk_size", message)
        self.assertIn("this config has no section model.kda", message)

    def test_a_value_of_the_wrong_type_is_named_in_words(self):
        path = self.write("import ml_collections\n\n\n"
                          "def get_config():\n"
                          "    return ml_collections.ConfigDict(dict(model=dict(\n"
                          "        d_model=1, packed=False, eps=1e-5)))\n")
        for override, words in (("model.packed=maybe", "not a boolean (true or false)"),
                                ("model.d_model=12.5", "not an integer"),
                                ("model.eps=small", "not a number")):
            with self.subTest(override):
                error, argv = self.parse(path, f"--config.{override}")
                self.assertEqual(flag_errors.describe_flag_error(error, argv),
                                 f"flag --config.{override}: {words}")

    def test_an_os_error_in_get_config_is_not_a_config_that_cannot_be_loaded(self):
        # ml_collections defers a config's OSError to the value's first use: it read "cannot
        # load --config=<file>: No such file or directory", as if the config file were missing.
        from unittest import mock  # noqa: PLC0415 (this test only)
        from ml_collections import config_flags  # noqa: PLC0415
        path = self.write("def get_config():\n    return open('/no/such/file.txt')\n")
        fv = flags.FlagValues()
        argv = ["prog", f"--config={path}"]
        holder = config_flags.DEFINE_config_file("config", None, "A config.", flag_values=fv,
                                                 sys_argv=argv)
        fv(argv)
        with mock.patch.object(sys, "argv", argv), self.assertRaises(SystemExit) as cm:
            config_lib.config_flag_value(holder)
        self.assertEqual(cm.exception.code,
                         f"error in --config={path} (line 2): FileNotFoundError: [Errno 2] No "
                         f"such file or directory: '/no/such/file.txt'")

    @pytest.mark.entry
    def test_the_binary_prints_the_one_line(self):
        path = self.write("def get_config():\n    return 1 / 0\n")
        result = run("experiments/train.py", f"--config={path}", "--workdir=/nonexistent/w")
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertEqual(result.stderr.strip().splitlines(), [
            f"error in --config={path} (line 2): ZeroDivisionError: division by zero"])


class CrossSectionSuggestionTest(absltest.TestCase):
    """An unknown override gets close names from every section: ml_collections' "did you mean"
    looked within the option's own section, so ``train.steps`` and ``train.warmup_steps`` got
    no hint (newcomer 2026-12-07)."""

    KNOWN = ("train", "train.total_steps", "train.max_steps_per_run", "train.seed",
             "optim", "optim.warmup_steps", "optim.learning_rate", "model", "model.d_model",
             "model.attention", "model.attention.num_heads")

    def test_suggest_options_across_sections(self):
        self.assertEqual(flag_errors.suggest_options("train.warmup_steps", self.KNOWN),
                         ["optim.warmup_steps"])
        self.assertEqual(flag_errors.suggest_options("train.steps", self.KNOWN),
                         ["train.total_steps", "train.max_steps_per_run", "optim.warmup_steps"])
        self.assertEqual(flag_errors.suggest_options("model.num_heads", self.KNOWN),
                         ["model.attention.num_heads"])
        self.assertEqual(flag_errors.suggest_options("optim.learning_rat", self.KNOWN),
                         ["optim.learning_rate"])
        self.assertEqual(flag_errors.suggest_options("data.zzz", self.KNOWN), [])

    def test_the_flag_error_names_the_option_in_another_section(self):
        from ml_collections import config_flags  # noqa: PLC0415 (this test only)
        path = os.path.join(self.create_tempdir().full_path, "cfg.py")
        with open(path, "w") as f:
            f.write("import ml_collections\n\n\ndef get_config():\n"
                    "    return ml_collections.ConfigDict(dict(\n"
                    "        train=dict(total_steps=10, seed=0),\n"
                    "        optim=dict(warmup_steps=2, learning_rate=1e-3)))\n")
        for override, hint in (
                ("train.warmup_steps", 'Did you mean "optim.warmup_steps"?'),
                ("train.steps", 'Did you mean "train.total_steps" or "optim.warmup_steps"?'),
                ("optim.learning_rat", 'Did you mean "learning_rate" instead of '
                                       '"learning_rat"?')):  # ml_collections' own hint kept
            with self.subTest(override=override):
                argv = ["prog", f"--config={path}", f"--config.{override}=1"]
                fv = flags.FlagValues()
                config_flags.DEFINE_config_file("config", None, "A config.", flag_values=fv,
                                                sys_argv=argv)
                with self.assertRaises(Exception) as cm:  # noqa: B017 - ml_collections' type
                    fv(argv)
                self.assertEqual(flag_errors.describe_flag_error(cm.exception, argv,
                                                                 flag_values=fv),
                                 f"unknown config option '{override}'. {hint}")


class StartUpInterruptTest(absltest.TestCase):

    def test_the_start_up_handler_is_installed_then_replaced_by_keyboard_interrupt(self):
        import signal  # noqa: PLC0415 (this test only)
        before = signal.getsignal(signal.SIGINT)
        self.addCleanup(signal.signal, signal.SIGINT, before)
        flag_errors.exit_on_ctrl_c()
        self.assertIs(signal.getsignal(signal.SIGINT), flag_errors._exit_on_sigint)
        flag_errors.end_exit_on_ctrl_c()
        self.assertIs(signal.getsignal(signal.SIGINT), signal.default_int_handler)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # another handler (nohup-like): kept
        flag_errors.end_exit_on_ctrl_c()
        self.assertEqual(signal.getsignal(signal.SIGINT), signal.SIG_IGN)


if __name__ == "__main__":
    absltest.main()
