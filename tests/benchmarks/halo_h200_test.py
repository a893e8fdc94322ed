"""benchmarks/halo_h200.sh: pack, receive, generate, start and wait, with a stand-in pipeline.

The script moves the HALO run's inputs in pieces to a GPU machine, has the teacher write text
there and then runs the pipeline on it; a mistake in it costs a GPU session. These tests run its
commands here on tiny inputs (a tiny GGUF teacher, a byte-tokenized corpus, a one-file wheel),
with ``PIPELINE`` pointing at a script that records the arguments it was given.
"""

import json
import os
import subprocess
import sys
import tempfile
import zipfile

import pytest
from absl.testing import absltest

from lattn_jax.data import prepare, shards
from tests.lattn_jax.halo import teacher_corpus_test

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "benchmarks", "halo_h200.sh")

STAND_IN = """\
import json, os, sys
args = dict(a[2:].split("=", 1) for a in sys.argv[1:])
for stage in ([] if "stages" in args else ["stage1", "stage2", "stage3"]):
    os.makedirs(os.path.join(args["workdir"], stage), exist_ok=True)
    with open(os.path.join(args["workdir"], stage, "done.json"), "w") as f:
        json.dump({"stage": stage}, f)
os.makedirs(os.path.join(args["workdir"], "report"), exist_ok=True)
with open(os.path.join(args["workdir"], "report", "args.json"), "w") as f:
    json.dump(args, f)
print("stand-in pipeline: done")
"""


def write_wheel(directory):
    """A pure-Python wheel of one module (``lattn_probe``), installable with no index."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "lattn_probe-0.1-py3-none-any.whl")
    info = "lattn_probe-0.1.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("lattn_probe/__init__.py", "VALUE = 7\n")
        z.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: lattn-probe\nVersion: 0.1\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                    "Tag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return path


def write_shards(directory, text_dir, paragraphs):
    os.makedirs(text_dir, exist_ok=True)
    with open(os.path.join(text_dir, "part.txt"), "w", encoding="utf-8") as f:
        f.write("\n\n".join(paragraphs) + "\n")
    prepare.prepare_corpus([text_dir], directory, tokenizer="byte", workers=0, progress=False,
                           print_fn=lambda _: None)


class HaloH200ScriptTest(absltest.TestCase):
    """Each test's inputs are its own; ``pack()`` without teacher text packs once per class (the
    first test's inputs; every test's are the same bytes up to the wheel's timestamps) into a
    class directory that no test writes to (receive copies the pieces, a corrupt piece is
    written to the copy): packing took about 2 s of each test."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls._class_tmp = tempfile.TemporaryDirectory()
        cls._packed = None

    @classmethod
    def tearDownClass(cls):
        cls._class_tmp.cleanup()
        super().tearDownClass()

    def setUp(self):
        super().setUp()
        self.root = self.create_tempdir().full_path
        r = self.root
        self.gguf = teacher_corpus_test.write_tiny_gguf(os.path.join(r, "t.gguf"))
        self.wheels = os.path.dirname(write_wheel(os.path.join(r, "whl")))
        paragraphs = [f"Paragraph {i} of the tiny corpus, with words {i * 7} and {i * 13}."
                      for i in range(40)]
        self.corpus = os.path.join(r, "tiny-corpus")
        write_shards(os.path.join(self.corpus, "train"), os.path.join(r, "t1"), paragraphs[:30])
        write_shards(os.path.join(self.corpus, "validation"), os.path.join(r, "t2"),
                     paragraphs[30:])
        self.halo_data = os.path.join(r, "halo_data")
        self.shared = os.path.join(r, "shared")
        for d in (os.path.join(self.halo_data, "eval"), os.path.join(self.shared, "eval", "x"),
                  os.path.join(self.shared, "niah")):
            os.makedirs(d)
        with open(os.path.join(self.shared, "eval", "x", "items.jsonl"), "w") as f:
            f.write('{"text": "an evaluation item that no document shares"}\n')
        with open(os.path.join(self.shared, "niah", "essay.txt"), "w") as f:
            f.write("A haystack essay.\n")
        self.stand_in = os.path.join(r, "stand_in.py")
        with open(self.stand_in, "w") as f:
            f.write(STAND_IN)
        self.out = os.path.join(r, "out")
        os.makedirs(self.out)
        bindir = os.path.dirname(sys.executable)  # python3 = this interpreter
        self.env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}",
                        XFER=os.path.join(r, "xfer"), WORK=os.path.join(r, "work"),
                        SITE=os.path.join(r, "site"), SHARED_DATA=self.shared,
                        PIPELINE=self.stand_in, OUT=self.out, SHOW_S="0", PYTHONPATH=ROOT,
                        WAIT_POLL_S="0.1")  # `wait` checks the stand-in run every 0.1 s, not 2

    def sh(self, *args, env=None):
        result = subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True,
                                cwd=ROOT, env={**self.env, **(env or {})}, timeout=600)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        return result.stdout

    def pack(self, *teacher_text):
        cls = type(self)
        if not teacher_text and cls._packed is not None:
            return cls._packed  # (checked below when it was packed)
        packed = (os.path.join(self.root, "packed") if teacher_text else
                  os.path.join(cls._class_tmp.name, "packed"))
        self.sh("pack", self.corpus, self.gguf, self.wheels, self.halo_data, packed,
                *teacher_text)
        names = sorted(os.listdir(packed))
        self.assertEqual(names, ["data.tar.part0", "data.tar.sha256", "model.tar.part0",
                                 "model.tar.sha256"])
        if not teacher_text:
            cls._packed = packed
        return packed

    def recorded_args(self):
        self.sh("wait", "60")
        with open(os.path.join(self.root, "work", "report", "args.json")) as f:
            return json.load(f)

    def test_wait_brings_files_back_only_once_the_run_ended(self):
        # A wait that returns files lengthens the gap before the next call, and the machine is
        # released after 30 s idle: while the run goes on, no files unless COLLECT=1.
        release = os.path.join(self.root, "release")
        with open(self.stand_in, "w") as f:
            f.write("import os, time\nprint('stand-in pipeline: waiting', flush=True)\n"
                    f"while not os.path.exists({release!r}):\n    time.sleep(0.1)\n"
                    + STAND_IN)
        packed = self.pack()
        self.sh("receive", f"{packed}/model.tar.part0", f"{packed}/model.tar.sha256")
        self.sh("receive", f"{packed}/data.tar.part0", f"{packed}/data.tar.sha256")
        self.sh("start")
        self.assertEqual(os.listdir(self.out), [])
        shown = self.sh("wait", "1")
        self.assertIn("pipeline: running", shown)
        self.assertIn("files left on the machine", shown)
        self.assertEqual(os.listdir(self.out), [])
        self.sh("wait", "1", env={"COLLECT": "1"})
        self.assertIn("halo.log", os.listdir(self.out))
        for name in os.listdir(self.out):
            os.remove(os.path.join(self.out, name))
        open(release, "w").close()
        shown = self.sh("wait", "60")
        self.assertIn("pipeline: not running", shown)
        self.assertCountEqual(os.listdir(self.out), ["halo.log", "halo_outputs.tgz"])

    @pytest.mark.slow  # ~11 s; the CI keeps the script's receive/start/wait tests
    def test_bundled_teacher_text_and_its_weight(self):
        # Teacher text written elsewhere travels in the data tar; its weight keeps the plan's
        # share: 3 x 40,116,931 tokens per pass / its kept tokens.
        text = os.path.join(self.root, "gen", "teacher-smollm2")
        write_shards(text, os.path.join(self.root, "t3"), ["Written by the teacher."] * 5)
        manifest = shards.read_manifest(text)
        manifest["generation"] = {"counts": {"kept_tokens": 20_000_000}}
        with open(os.path.join(text, shards.MANIFEST), "w") as f:
            json.dump(manifest, f)
        packed = self.pack(text)
        self.sh("receive", f"{packed}/model.tar.part0", f"{packed}/model.tar.sha256")
        self.sh("receive", f"{packed}/data.tar.part0", f"{packed}/data.tar.sha256")
        self.assertIn("driver started", self.sh("start"))
        args = self.recorded_args()
        xfer = self.env["XFER"]
        self.assertEqual(args["config"], f"configs/halo_smollm2.py:h200,corpus={xfer}/corpus/"
                         f"tiny-corpus,teacher_text={xfer}/corpus/teacher-smollm2,"
                         f"teacher_weight=6.0")
        self.assertEqual(args["config.teacher.path"],
                         f"{xfer}/bundle/SmolLM2-135M-Instruct.Q4_1.gguf")
        self.assertEqual(args["config.report.data_dir"], f"{xfer}/bundle/halo_data")
        # The joined corpus equals the packed one; the wheel was installed in SITE.
        self.assertEqual(shards.open_corpus([f"{xfer}/corpus/tiny-corpus/train"]).num_documents,
                         shards.open_corpus([f"{self.corpus}/train"]).num_documents)
        self.assertTrue(os.path.exists(f"{self.env['SITE']}/lattn_probe/__init__.py"))
        # The run's small files came back, the teacher text's manifest among them.
        listing = subprocess.run(["tar", "tzf", f"{self.out}/halo_outputs.tgz"],
                                 capture_output=True, text=True, check=True).stdout.split()
        self.assertIn("work/teacher_text/manifest.json", listing)
        self.assertIn("work/report/args.json", listing)

    def test_prepare_then_start_with_config_args(self):
        # `prepare` unpacks the model tar and installs the wheels (for GPU tests before the run);
        # `start` then finds them in place and unpacks only the data tar.
        packed = self.pack()
        for name in ("model.tar.part0", "model.tar.sha256"):
            self.sh("receive", f"{packed}/{name}")
        self.assertIn("wheels installed", self.sh("prepare"))
        self.assertIn("already unpacked", self.sh("prepare"))  # a second call is harmless
        probe = subprocess.run([sys.executable, "-c",
                                "import lattn_probe; print(lattn_probe.VALUE)"],
                               capture_output=True, text=True,
                               env=dict(self.env, PYTHONPATH=self.env["SITE"]))
        self.assertEqual(probe.stdout.strip(), "7", probe.stderr)
        self.assertFalse(os.path.exists(f"{self.env['XFER']}/model.tar.part0"))
        for name in ("data.tar.part0", "data.tar.sha256"):
            self.sh("receive", f"{packed}/{name}")
        self.sh("start", env={"CONFIG_ARGS": "stage2_len=2048"})
        self.assertEqual(self.recorded_args()["config"],
                         f"configs/halo_smollm2.py:h200,corpus={self.env['XFER']}/corpus/"
                         f"tiny-corpus,stage2_len=2048")

    @pytest.mark.slow  # ~10 s
    def test_a_second_start_in_another_workdir(self):
        # A short run first (e.g. a Stage-1-only ablation, WORK=<another dir> and
        # --stages=stage1), then the main run: the second `start` finds the tars unpacked and
        # the wheels installed, joins the corpus again and runs in the default workdir.
        packed = self.pack()
        for name in ("model.tar.part0", "model.tar.sha256", "data.tar.part0",
                     "data.tar.sha256"):
            self.sh("receive", f"{packed}/{name}")
        first = os.path.join(self.root, "qk")
        short = {"WORK": first, "HALO_FLAGS": "--stages=stage1 "
                 "--config.hypenet.lightning_qk_norm=False"}
        self.sh("start", env=short)
        self.sh("wait", "60", env=short)
        with open(os.path.join(first, "report", "args.json")) as f:
            args = json.load(f)
        self.assertEqual(args["stages"], "stage1")
        self.assertEqual(args["config.hypenet.lightning_qk_norm"], "False")
        self.sh("start")
        args = self.recorded_args()
        self.assertNotIn("stages", args)
        self.assertNotIn("config.hypenet.lightning_qk_norm", args)
        self.assertTrue(os.path.exists(os.path.join(self.root, "work", "stage3", "done.json")))

    def test_branch_runs_a_second_stage3_from_the_same_stage2(self):
        packed = self.pack()
        self.sh("receive", f"{packed}/model.tar.part0", f"{packed}/model.tar.sha256")
        self.sh("receive", f"{packed}/data.tar.part0", f"{packed}/data.tar.sha256")
        self.sh("start", env={"HALO_FLAGS": "--config.stage3.optim.learning_rate=1e-4 "
                                            "--config.report.teacher_report=t.json",
                              "BRANCH_FLAGS": "--config.stage3.optim.learning_rate=3e-4",
                              "BRANCH_NAME": "lr3e-4"})
        main = self.recorded_args()
        self.assertEqual(main["config.stage3.optim.learning_rate"], "1e-4")
        self.assertNotIn("stages", main)
        branch = f"{self.env['WORK']}-lr3e-4"
        with open(os.path.join(branch, "report", "args.json")) as f:
            args = json.load(f)
        # HALO_FLAGS first, BRANCH_FLAGS after: the branch's value is the one the flag keeps.
        self.assertEqual((args["workdir"], args["stages"], args["config.report.teacher_report"],
                          args["config.stage3.optim.learning_rate"]),
                         (branch, "stage3,calibrate,report", "t.json", "3e-4"))
        self.assertEqual(args["config"], main["config"])
        # Stage 2 was copied, the main run's Stage 3 and report were not.
        self.assertTrue(os.path.exists(os.path.join(branch, "stage2", "done.json")))
        self.assertFalse(os.path.exists(os.path.join(branch, "stage3")))
        listing = subprocess.run(["tar", "tzf", f"{self.out}/halo_outputs.tgz"],
                                 capture_output=True, text=True, check=True).stdout.split()
        self.assertIn("work/report/args.json", listing)
        self.assertIn("work-lr3e-4/report/args.json", listing)
        with open(f"{self.out}/halo.log") as f:
            self.assertIn("=== branch:", f.read())

    def test_branch_from_stage2_reruns_stage2_with_the_branch_flags(self):
        # The selection's ablation: evenly spaced attention layers from the same Stage 1.
        packed = self.pack()
        self.sh("receive", f"{packed}/model.tar.part0", f"{packed}/model.tar.sha256")
        self.sh("receive", f"{packed}/data.tar.part0", f"{packed}/data.tar.sha256")
        self.sh("start", env={"BRANCH_FROM": "stage2", "BRANCH_NAME": "even",
                              "BRANCH_FLAGS": "--config.hypenet.attention_layers=(3,7,11)"})
        self.sh("wait", "60")
        branch = f"{self.env['WORK']}-even"
        with open(os.path.join(branch, "report", "args.json")) as f:
            args = json.load(f)
        self.assertEqual((args["stages"], args["config.hypenet.attention_layers"]),
                         ("stage2,stage3,calibrate,report", "(3,7,11)"))
        self.assertTrue(os.path.exists(os.path.join(branch, "stage1", "done.json")))
        for stage in ("stage2", "stage3"):  # not copied: the branch reruns them
            self.assertFalse(os.path.exists(os.path.join(branch, stage)), stage)
        with open(f"{self.out}/halo.log") as f:
            self.assertIn("stages before stage2, with: --config.hypenet.attention_layers",
                          f.read())

    def test_bad_branch_from_stops_start_before_the_driver(self):
        packed = self.pack()
        self.sh("receive", f"{packed}/model.tar.part0", f"{packed}/model.tar.sha256")
        self.sh("receive", f"{packed}/data.tar.part0", f"{packed}/data.tar.sha256")
        result = subprocess.run(["bash", SCRIPT, "start"], capture_output=True, text=True,
                                cwd=ROOT, timeout=600,
                                env=dict(self.env, BRANCH_FROM="stage1", BRANCH_FLAGS="--x=1"))
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("BRANCH_FROM=stage1: must be stage2, stage3, calibrate or report",
                      result.stderr)
        self.assertFalse(os.path.exists(f"{self.env['WORK']}.driver.pid"))
        # BRANCH_FROM without BRANCH_FLAGS would run no branch: refused too.
        result = subprocess.run(["bash", SCRIPT, "start"], capture_output=True, text=True,
                                cwd=ROOT, timeout=600,
                                env=dict(self.env, BRANCH_FROM="stage2", BRANCH_FLAGS=" \t"))
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("without BRANCH_FLAGS: no branch would run", result.stderr)
        self.assertFalse(os.path.exists(f"{self.env['WORK']}.driver.pid"))

    def test_corrupt_piece_stops_start(self):
        packed = self.pack()
        self.sh("receive", f"{packed}/model.tar.part0", f"{packed}/model.tar.sha256",
                f"{packed}/data.tar.sha256")
        with open(f"{packed}/data.tar.part0", "rb") as f:
            data = bytearray(f.read())
        data[len(data) // 2] ^= 0xFF
        with open(f"{self.env['XFER']}/data.tar.part0", "wb") as f:
            f.write(data)
        result = subprocess.run(["bash", SCRIPT, "start"], capture_output=True, text=True,
                                cwd=ROOT, env=self.env, timeout=600)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("data.tar: FAILED", result.stdout + result.stderr)
        self.assertFalse(os.path.exists(f"{self.env['WORK']}.driver.pid"))

    @pytest.mark.slow  # ~25 s on 2 cores: the generation imports jax and compiles the teacher
    def test_generate_then_distil(self):
        topics = os.path.join(self.root, "topics.txt")
        with open(topics, "w", encoding="utf-8") as f:
            f.write("Volcano\nJazz\n")
        packed = self.pack()
        self.sh("receive", f"{packed}/model.tar.part0", f"{packed}/model.tar.sha256")
        gen_flags = (f"--topics={topics} --template=Tell_me_about_{{topic}}. --batch_size=2 "
                     "--prompt_len=160 --max_new_tokens=6 --min_tokens=1 --samples_per_prompt=1")
        self.sh("generate", env={"GEN_FLAGS": gen_flags, "GEN_DEADLINE_S": "300"})
        self.sh("receive", f"{packed}/data.tar.part0", f"{packed}/data.tar.sha256")
        self.sh("start")
        args = self.recorded_args()
        xfer = self.env["XFER"]
        gen = f"{xfer}/gen/teacher-smollm2"
        kept = shards.read_manifest(gen)["generation"]["counts"]["kept_tokens"]
        self.assertEqual(kept, 12)  # 2 prompts x 6 tokens
        self.assertTrue(args["config"].endswith(f",teacher_text={gen},teacher_weight="
                                                f"{round(3 * 40_116_931 / kept, 1)}"))
        with open(f"{self.out}/gen.log") as f:
            self.assertIn("complete: this run 12 tokens generated", f.read())


if __name__ == "__main__":
    absltest.main()
