"""lattn_jax.halo.pipeline in-process: stage order, the deadline, the record, exit statuses.

The stages are mocked (``experiment.run``); the binary and real stages:
``tests/experiments/halo_test.py``.
"""

import json
import math
import os
import shlex
import time
from unittest import mock

from absl.testing import absltest

from configs import halo_smollm2
from lattn_jax.halo import experiment
from lattn_jax.halo import pipeline


class _Watcher:
    requested, signal_name = False, "SIGTERM"


def _records(workdir):
    with open(os.path.join(workdir, pipeline.LOG_FILE)) as f:
        return [json.loads(line) for line in f]


class SelectStagesTest(absltest.TestCase):

    def test_pipeline_order_whatever_the_order_given(self):
        self.assertEqual(pipeline.select_stages(["report", "stage1", "select"]),
                         ["stage1", "select", "report"])

    def test_unknown_stage(self):
        with self.assertRaisesRegex(pipeline.PipelineError,
                                    r"^unknown stage\(s\) \['stage4'\]; choose from"):
            pipeline.select_stages(["stage1", "stage4"])


class DeadlineTest(absltest.TestCase):

    def test_compares_like_a_time_and_turns_now_on_a_signal(self):
        watcher = _Watcher()
        deadline = pipeline.Deadline(100.0, watcher)
        self.assertTrue(150.0 >= deadline)
        self.assertFalse(50.0 >= deadline)
        self.assertEqual(deadline - 10.0, 90.0)
        self.assertIsNone(deadline.stop_reason)
        self.assertEqual(float(pipeline.Deadline(None, watcher)), math.inf)
        watcher.requested = True
        self.assertTrue(50.0 >= deadline)
        self.assertEqual(float(deadline), -math.inf)
        self.assertEqual(deadline.stop_reason, "stopped by SIGTERM")


class RunTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.root = self.create_tempdir().full_path
        self.workdir = os.path.join(self.root, "run")
        data = os.path.join(self.root, "data")
        for sub in ("eval", "niah/PaulGrahamEssays"):
            os.makedirs(os.path.join(data, sub))
        self.config = halo_smollm2.get_config("tiny")
        self.config.report.data_dir = data
        self.lines = []

    def run_pipeline(self, **kw):
        options = pipeline.PipelineOptions(workdir=self.workdir, compilation_cache="", **kw)
        return pipeline.run(self.config, options, argv=["halo_pipeline.py", "--x=a b"],
                            print_fn=self.lines.append)

    def test_not_a_halo_config(self):
        self.config = {"model": {}}
        with self.assertRaises(pipeline.PipelineError):
            self.run_pipeline()
        self.assertFalse(os.path.exists(self.workdir))

    def test_a_refusal_writes_nothing_without_a_workdir_and_is_recorded_with_one(self):
        self.config.stage3.kl_weight = -1.0
        message = "stage3.kl_weight must be a finite number >= 0, got -1.0"
        with mock.patch.object(experiment, "run") as stage:
            with self.assertRaisesRegex(pipeline.PipelineError, f"^{message}$"):
                self.run_pipeline()
            self.assertFalse(os.path.exists(self.workdir))
            os.makedirs(self.workdir)
            with self.assertRaisesRegex(pipeline.PipelineError, f"^{message}$"):
                self.run_pipeline()
            stage.assert_not_called()
        [record] = _records(self.workdir)
        self.assertEqual((record["status"], record["stages"]), (f"error: {message}", {}))
        self.assertEqual(record["command"], "python halo_pipeline.py '--x=a b'")
        self.assertIn("pipeline: error before any stage after", self.lines[-1])

    def test_early_refusals_are_not_recorded_even_in_an_existing_workdir(self):
        # The module docstring says exactly what pipeline.jsonl records (it claimed every
        # invocation): an unknown stage and a config without HALO sections never are.
        os.makedirs(self.workdir)
        with mock.patch.object(experiment, "run") as stage:
            with self.assertRaisesRegex(pipeline.PipelineError, r"^unknown stage\(s\)"):
                self.run_pipeline(stages=["stage1", "stage9"])
            halo = self.config
            self.config = {"model": {}}
            with self.assertRaises(pipeline.PipelineError):
                self.run_pipeline()
            stage.assert_not_called()
        self.assertEqual(os.listdir(self.workdir), [])
        self.config = halo  # past the checks: recorded
        with mock.patch.object(experiment, "run", return_value={"complete": False}):
            self.assertEqual(self.run_pipeline(stages=["stage1"]), pipeline.EXIT_DEADLINE)
        self.assertEqual([r["status"] for r in _records(self.workdir)], ["deadline"])
        for text in (pipeline.__doc__, pipeline.run.__doc__):
            self.assertIn("not recorded", " ".join(text.split()).lower())

    def test_every_stage_in_order_then_skipped_when_done(self):
        ran = []

        def fake_run(config, workdir, stage, print_fn, deadline, stage_flag):
            self.assertEqual(stage_flag, "--stages")  # its checks name the pipeline's flag
            ran.append(stage)
            os.makedirs(os.path.join(workdir, stage), exist_ok=True)
            with open(os.path.join(workdir, stage, experiment.DONE_FILE), "w") as f:
                f.write("{}")
            return {"complete": True}

        with mock.patch.object(experiment, "run", side_effect=fake_run):
            self.assertEqual(self.run_pipeline(), 0)
            self.assertEqual(ran, list(experiment.STAGES))
            self.assertRegex(self.lines[-1], r"^report: .*report\.md; the results page: ")
            self.assertEqual(self.run_pipeline(stages=["report", "stage1"]), 0)
        self.assertEqual(ran, list(experiment.STAGES))  # nothing ran again
        first, second = _records(self.workdir)
        self.assertEqual(first["status"], "complete")
        self.assertEqual(list(first["stages"]), list(experiment.STAGES))
        self.assertEqual(second["stages"], {"stage1": "done before", "report": "done before"})

    def test_the_results_page_command_quotes_the_workdir(self):
        # "python experiments/halo_report.py --workdir=<path>" was not quoted: a path with a
        # space pasted as two words.
        self.workdir = os.path.join(self.root, "halo run é")
        with mock.patch.object(experiment, "run", return_value={"complete": True}):
            self.assertEqual(self.run_pipeline(), 0)
        _, command = self.lines[-1].split("; the results page: ")
        self.assertEqual(shlex.split(command), ["python", "experiments/halo_report.py",
                                                f"--workdir={self.workdir}"])

    def test_deadline_and_a_stopped_stage_give_status_3(self):
        with mock.patch.object(experiment, "run") as stage:
            self.assertEqual(self.run_pipeline(deadline_s=1e-9), pipeline.EXIT_DEADLINE)
            stage.assert_not_called()
            self.assertIn("=== stage1: not started, deadline", self.lines)
            stage.return_value = {"complete": False}
            self.assertEqual(self.run_pipeline(), pipeline.EXIT_DEADLINE)
            self.assertEqual(stage.call_count, 1)
        self.assertEqual([r["status"] for r in _records(self.workdir)], ["deadline"] * 2)

    def test_a_failing_stage_names_it_and_is_recorded(self):
        with mock.patch.object(experiment, "run", side_effect=ValueError("bad data")):
            with self.assertRaisesRegex(pipeline.PipelineError, r"^stage1 failed: bad data$"):
                self.run_pipeline()
        [record] = _records(self.workdir)
        self.assertEqual(record["status"], "error: bad data")
        self.assertRegex(self.lines[-1], r"^pipeline: error in stage1 after")

    def test_an_unexpected_error_is_recorded_and_re_raised(self):
        with mock.patch.object(experiment, "run", side_effect=RuntimeError("xla")):
            with self.assertRaisesRegex(RuntimeError, "^xla$"):
                self.run_pipeline()
        self.assertEqual(_records(self.workdir)[0]["status"], "error: RuntimeError: xla")

    def test_a_record_cut_short_by_a_kill_does_not_glue_to_the_next(self):
        os.makedirs(self.workdir)
        with open(os.path.join(self.workdir, pipeline.LOG_FILE), "w") as f:
            f.write('{"command": "python halo_pipeline.py", "sta')  # killed mid-record
        with mock.patch.object(experiment, "run", return_value={"complete": True}):
            self.assertEqual(self.run_pipeline(stages=["stage1"]), 0)
        [record] = _records(self.workdir)  # json.loads of every line: whole lines only
        self.assertEqual(record["status"], "complete")

    def test_a_second_ctrl_c_gives_130(self):
        with mock.patch.object(experiment, "run", side_effect=KeyboardInterrupt):
            self.assertEqual(self.run_pipeline(), pipeline.EXIT_INTERRUPTED)
        self.assertEqual(_records(self.workdir)[0]["status"], "interrupted (second Ctrl-C)")
        self.assertLess(_records(self.workdir)[0]["wall_s"], time.time())


if __name__ == "__main__":
    absltest.main()
