"""benchmarks/gpu_tests.py: parallel marked tests under one deadline, on a stand-in test tree.

The binary spends rationed GPU time, and its summary is the only record of which GPU tests ran.
These tests run it here on a throw-away tree of ``gpu``-marked tests that pass, fail, skip or
sleep past the deadline, and check each test's recorded outcome and the exit status.
"""

import json
import os
import subprocess
import sys
import textwrap
import time

from absl.testing import absltest

from benchmarks import gpu_tests

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "benchmarks", "gpu_tests.py")

TESTS = textwrap.dedent("""\
    import os
    import subprocess
    import sys
    import time
    import pytest

    pytestmark = pytest.mark.gpu

    def test_a_passes():
        assert sum(range(4)) == 6

    @pytest.mark.parametrize("name", ["a b", "g h]"])
    def test_b_fails(name):
        assert name == "a b"

    def test_c_skips():
        pytest.skip("no accelerator")

    def test_d_sleeps():
        # A child that the deadline must stop with its worker (its pid goes to a file).
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        with open("child.pid", "w") as f:
            f.write(str(child.pid))
        time.sleep(60)

    @pytest.fixture
    def broken_teardown():
        yield
        raise RuntimeError("teardown")

    def test_e_teardown_error(broken_teardown):
        pass

    def test_f_kills_its_worker():
        os._exit(0)  # a clean exit status, but no verdict: still "worker died"
    """)


PTXAS_BIG = """ptxas info    : 0 bytes gmem
ptxas warning : Registers are spilled to local memory in function 'big_kernel', 92 bytes \
spill stores, 96 bytes spill loads
ptxas info    : Compiling entry function 'big_kernel' for 'sm_90a'
ptxas info    : Function properties for big_kernel
    96 bytes stack frame, 92 bytes spill stores, 96 bytes spill loads
ptxas info    : Used 255 registers, used 2 barriers, 1 bytes smem
ptxas info    : Compile time = 278.714 ms
"""
PTXAS_SMALL = """ptxas info    : Compiling entry function 'small_kernel' for 'sm_90a'
ptxas info    : Function properties for small_kernel
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 45 registers, used 2 barriers, 1 bytes smem
"""
PTXAS_TESTS = textwrap.dedent("""\
    import os
    import pytest

    pytestmark = pytest.mark.gpu

    def test_big():
        os.write(1, {big!r}.encode())

    def test_small():
        os.write(2, {small!r}.encode())
        os.write(1, {big!r}.encode())
    """).format(big=PTXAS_BIG, small=PTXAS_SMALL)


class GpuTestsTest(absltest.TestCase):

    def _tree(self, body=TESTS):
        root = self.create_tempdir().full_path
        with open(os.path.join(root, "pytest.ini"), "w") as f:
            f.write("[pytest]\nmarkers =\n    gpu: needs a GPU\n    slow: slow\n")
        with open(os.path.join(root, "stand_in_test.py"), "w") as f:
            f.write(body)
        return root

    def _run(self, root, *flags, env=None):
        out = os.path.join(root, "out")
        proc = subprocess.run([sys.executable, SCRIPT, f"--out={out}", *flags,
                               "stand_in_test.py"], cwd=root, capture_output=True, text=True,
                              timeout=120, check=False, env=env)
        return proc, out

    def test_ptxas_lines_and_workers_log(self):
        # Two passing tests print ptxas's verbose output at the file-descriptor level, as
        # jaxlib's compiler does: worker 0 a kernel that spills, worker 1 one that does not
        # and the first one again (the same figures: one record).
        root = self._tree(PTXAS_TESTS)
        env = dict(os.environ, MOSAIC_GPU_DUMP_PTXAS="1")
        proc, out = self._run(root, "--jobs=2", env=env)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        with open(os.path.join(out, "summary.json")) as f:
            ptxas = json.load(f)["ptxas"]
        self.assertEqual([{k: v for k, v in r.items() if k != "line"} for r in ptxas], [
            {"worker": 0, "entry": "big_kernel", "registers": 255, "spill_stores": 92,
             "spill_loads": 96},
            {"worker": 1, "entry": "small_kernel", "registers": 45, "spill_stores": 0,
             "spill_loads": 0}])
        self.assertEqual(ptxas[0]["line"],
                         "ptxas info    : Compiling entry function 'big_kernel' for 'sm_90a' | "
                         "96 bytes stack frame, 92 bytes spill stores, 96 bytes spill loads | "
                         "ptxas info    : Used 255 registers, used 2 barriers, 1 bytes smem")
        with open(os.path.join(out, "summary.md")) as f:
            md = f.read()
        self.assertIn("ptxas (MOSAIC_GPU_DUMP_PTXAS=1)", md)
        self.assertIn("| `big_kernel` | 255 | 92 | 96 |", md)
        self.assertIn("| `small_kernel` | 45 | 0 | 0 |", md)
        # workers.log: every worker's log, in order, under its header.
        with open(os.path.join(out, "workers.log")) as f:
            text = f.read()
        for k in range(2):
            with open(os.path.join(out, f"worker-{k}.log")) as f:
                self.assertIn(f"===== worker-{k}.log =====\n" + f.read(), text)
        self.assertLess(text.index("test_big"), text.index("===== worker-1.log"))
        self.assertGreater(text.index("test_small"), text.index("===== worker-1.log"))
        # Without the variable: pytest's capture keeps the passing tests' prints out of the
        # logs, no records, no table; workers.log still written.
        env.pop("MOSAIC_GPU_DUMP_PTXAS")
        proc, out = self._run(root, "--jobs=2", env=env)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        with open(os.path.join(out, "summary.json")) as f:
            self.assertEqual(json.load(f)["ptxas"], [])
        with open(os.path.join(out, "summary.md")) as f:
            self.assertNotIn("ptxas (MOSAIC_GPU_DUMP_PTXAS=1)", f.read())
        with open(os.path.join(out, "workers.log")) as f:
            self.assertIn("===== worker-1.log =====", f.read())

    def test_ptxas_records_from_logs(self):
        # Worker 0 stopped mid-compile of a third kernel; pytest's text around ptxas's lines.
        log0 = ("tests/x.py::test_a " + PTXAS_BIG + PTXAS_SMALL + "PASSED\n"
                "ptxas info    : Compiling entry function 'cut_kernel' for 'sm_90a'\n")
        log1 = PTXAS_SMALL + PTXAS_SMALL.replace("Used 45", "Used 40")
        recs = gpu_tests.ptxas_records([log0, log1])
        self.assertEqual([(r["worker"], r["entry"], r["registers"], r["spill_stores"],
                           r["spill_loads"]) for r in recs],
                         [(0, "big_kernel", 255, 92, 96), (0, "small_kernel", 45, 0, 0),
                          (0, "cut_kernel", None, None, None), (1, "small_kernel", 40, 0, 0)])
        summary = {"counts": {"passed": 1}, "tests": {"a::t": "passed"}, "wall_s": 1.0,
                   "jobs": 2, "ptxas": recs}
        md = gpu_tests._markdown(summary, "cmd")  # pylint: disable=protected-access
        self.assertIn("| `cut_kernel` | ? | ? | ? |", md)
        self.assertIn("| `small_kernel` | 40 | 0 | 0 |", md)
        summary["ptxas"] = gpu_tests.ptxas_records(["no ptxas here\n", ""])
        self.assertEqual(summary["ptxas"], [])
        self.assertNotIn("ptxas", gpu_tests._markdown(summary, "cmd"))  # pylint: disable=W0212

    def test_outcomes_deadline_and_exit_status(self):
        root = self._tree()
        # 3 workers, round-robin over a, b[a b], b[g h]], c, d, e, f:
        # worker 0: a, c, f (f ends it: "worker died"); worker 1: b[a b], d (stopped at the
        # deadline); worker 2: b[g h]], e.
        proc, out = self._run(root, "--jobs=3", "--deadline_s=8", "--grace_s=10")
        self.assertEqual(proc.returncode, 1, proc.stdout + proc.stderr)
        with open(os.path.join(out, "summary.json")) as f:
            summary = json.load(f)
        name = "stand_in_test.py::test_{}"
        self.assertEqual(summary["tests"], {
            name.format("a_passes"): "passed", name.format("b_fails[a b]"): "passed",
            name.format("b_fails[g h]]"): "failed", name.format("c_skips"): "skipped",
            name.format("d_sleeps"): "not run", name.format("e_teardown_error"): "error",
            name.format("f_kills_its_worker"): "worker died"})
        self.assertEqual((summary["jobs"], summary["interrupted_workers"]), (3, 1))
        self.assertEqual(summary["worker_exit"][0], 0)
        self.assertIn("FAILED: stand_in_test.py::test_b_fails[g h]]", proc.stdout)
        self.assertIn("WORKER DIED: stand_in_test.py::test_f_kills_its_worker", proc.stdout)
        with open(os.path.join(out, "summary.md")) as f:
            self.assertIn("| `stand_in_test.py::test_d_sleeps` | not run |", f.read())
        # The sleeping test's child was stopped with its worker's process group.
        with open(os.path.join(root, "child.pid")) as f:
            child = int(f.read())
        with self.assertRaises(ProcessLookupError):
            for _ in range(50):  # a killed child may take a moment to be reaped by init
                os.kill(child, 0)
                time.sleep(0.1)

    def test_all_pass_exits_zero_and_nothing_collected_exits_three(self):
        root = self._tree("import pytest\n\n@pytest.mark.gpu\ndef test_ok():\n"
                          "    assert 2 + 2 == 4\n\ndef test_unmarked():\n    assert False\n")
        proc, out = self._run(root, "--jobs=4")
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        with open(os.path.join(out, "summary.json")) as f:
            self.assertEqual(json.load(f)["tests"], {"stand_in_test.py::test_ok": "passed"})
        proc, _ = self._run(root, "--marker=tpu")
        self.assertEqual(proc.returncode, 3)
        self.assertIn("no test under", proc.stderr)
        proc, _ = self._run(root, "--jobs=0")
        self.assertEqual(proc.returncode, 3)
        self.assertIn("--jobs=0 must be at least 1", proc.stderr)
        # Run from another directory than pytest's rootdir: refused, nothing run.
        sub = os.path.join(root, "sub")
        os.makedirs(sub)
        result = subprocess.run([sys.executable, SCRIPT, f"--out={root}/o2",
                                 "../stand_in_test.py"], cwd=sub, capture_output=True,
                                text=True, timeout=120, check=False)
        self.assertEqual(result.returncode, 3, result.stderr)
        self.assertIn("relative to its rootdir", result.stderr)
        self.assertFalse(os.path.exists(f"{root}/o2"))
        # A collection error: one line, pytest's whole output in collect.log.
        with open(os.path.join(root, "broken_test.py"), "w") as f:
            f.write("def test_x(:\n")
        out = os.path.join(root, "o3")
        proc = subprocess.run([sys.executable, SCRIPT, f"--out={out}", "broken_test.py"],
                              cwd=root, capture_output=True, text=True, timeout=120,
                              check=False)
        self.assertEqual(proc.returncode, 3)
        self.assertEqual(len(proc.stderr.strip().splitlines()), 1, proc.stderr)
        self.assertIn("pytest --collect-only failed", proc.stderr)
        with open(os.path.join(out, "collect.log")) as f:
            self.assertIn("SyntaxError", f.read())

    def test_split_and_parse(self):
        self.assertEqual(gpu_tests.split_round_robin(list("abcde"), 2),
                         [["a", "c", "e"], ["b", "d"]])
        self.assertEqual(gpu_tests.split_round_robin(list("ab"), 8), [["a"], ["b"]])
        rec = lambda when, outcome, xfail=False: {"when": when, "outcome": outcome,  # noqa
                                                  "wasxfail": xfail}
        self.assertEqual(gpu_tests.outcome_of([rec("setup", "passed"), rec("call", "passed"),
                                               rec("teardown", "failed")]), "error")
        self.assertEqual(gpu_tests.outcome_of([rec("setup", "passed"), rec("call", "failed"),
                                               rec("teardown", "failed")]), "failed")
        self.assertEqual(gpu_tests.outcome_of([rec("setup", "skipped")]), "skipped")
        self.assertEqual(gpu_tests.outcome_of([rec("call", "skipped", True)]), "xfailed")
        self.assertEqual(gpu_tests.outcome_of([rec("call", "passed", True)]), "xpassed")
        self.assertIsNone(gpu_tests.outcome_of([rec("setup", "passed")]))  # call never reported
        self.assertEqual(gpu_tests.exit_status({"passed": 3, "not run": 1}), 2)
        self.assertEqual(gpu_tests.exit_status({"passed": 3, "error": 1, "not run": 1}), 1)
        self.assertEqual(gpu_tests.exit_status({"passed": 3, "worker died": 1}), 1)
        records = [{"a::t": [rec("call", "passed")]}, {}]
        self.assertEqual(
            gpu_tests.summarise([["a::t", "b::t"], ["c::t"]], records, [True, False])["tests"],
            {"a::t": "passed", "b::t": "not run", "c::t": "worker died"})


if __name__ == "__main__":
    absltest.main()
