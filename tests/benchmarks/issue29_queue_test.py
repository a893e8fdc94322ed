"""benchmarks/windows/issue29_queue.sh: every command it would run on the GPU machine, on a CPU.

The script runs with every item and a ``python3`` on ``PATH`` that records its arguments and does
nothing (the inline ``python3 -c`` snippets run for real, on logs that do not exist), under
``I29_TMP``. Then each recorded command is checked the cheap way: bench_kernels.py's flags are
parsed and go through its own ``_check_*`` refusals; profile_grad.py's and gpu_tests.py's flags
are parsed; profile_fwd.py's flags are parsed and go through its split and variant checks
(each variant's kernel name printed); bench_gva_loop.py's arguments go through its parser;
every pytest node id, ``-k`` expression and gpu_tests.py path must collect at least one test.
A typo'd flag or a renamed test fails here instead of costing GPU minutes. Also: the
estimates of ``est()`` cover each item's ``timeout`` caps.
"""

import atexit
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

from absl.testing import absltest

from lattn_jax import config as config_lib
from tests import binary_runs
from tests.benchmarks import window_shims

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "benchmarks", "windows", "issue29_queue.sh")
ITEMS = ("t0glue t0w prof_split gva t0 vk split1 split2 early autooff autooff_dn fp16def "
         "t0pieces tp350 stepprof approx cw_state cw_diag cw_grad cw_tests cw_gdn2 cw_slab kda_dvw "
         "swiglu k2floor norm_ab dvn_hf tab_gdn tab_dn tab_lgt tab_kda tab_gdn2 tab_fla lgt_fused "
         "lgt_ftests dhw mix pskip lgt_rh lgt_st rs rs_prof mapsx rs_res rs_res_st "
         "rs_pieces kda_local rs_proto").split()

_BENCH_KERNELS = """import json, sys
sys.argv = ["bench_kernels.py"]
from absl import flags
from benchmarks import bench_kernels as bk
for argv in json.loads(sys.stdin.read()):
    flags.FLAGS.unparse_flags()
    flags.FLAGS(["bench_kernels.py"] + argv)
    bk._check_mosaic_forward(); bk._check_mosaic_backward()
    bk._check_channelwise_state_pass(); bk._check_channelwise_grad_pass()
    bk._apply_mosaic_t0(); bk._check_mosaic_rs_stages(); bk._check_mosaic_rs_residuals()
    bk._check_mosaic_rs_protocol()
print("OK")
"""

_PROFILE_GRAD = """import json, sys
from absl import flags
from benchmarks import profile_grad as p
p._define_flags()
flags.FLAGS(["profile_grad.py"] + json.loads(sys.stdin.read()))
print(p.with_slabs(p.parse_variants(p._VARIANTS.value), p.parse_slabs(p._SLABS.value)))
"""

_DIAG_GRAD = """import json, sys
from absl import flags
from benchmarks import diag_grad as d
d._define_flags()
flags.FLAGS(["diag_grad.py"] + json.loads(sys.stdin.read()))
runs, probes = d.selected(d._VARIANTS.value, d._SLABS.value, d._PROBES.value)
print(json.dumps(dict(runs=[r[0] for r in runs], probes=probes, deadline=d._DEADLINE_S.value)))
"""

_PROFILE_FWD = """import json, sys
from absl import flags
from benchmarks import profile_fwd as p
p._define_flags()
flags.FLAGS(["profile_fwd.py"] + json.loads(sys.stdin.read()))
split, variants = p.selected_variants()
print(json.dumps(dict(split=split, variants=variants,
                      kernels=[p.kernel_name(v, split) for v in variants])))
"""

_GPU_TESTS = """import json, sys
from absl import flags
from benchmarks import gpu_tests as g
g._define_flags()
for argv in json.loads(sys.stdin.read()):
    flags.FLAGS.unparse_flags()
    rest = flags.FLAGS(["gpu_tests.py"] + argv)
    print(json.dumps(dict(marker=g._MARKER.value, paths=rest[1:])))
"""

# Each command line's argparse parse, all in one process (each launch paid the interpreter's start
# and the script's imports, jax's included: about 2.5 s of CPU on the 2-core CI machine): the
# script runs as __main__ until its parser has parsed, which prints "OK" and exits. Each command
# line's stdout and stderr are captured on their own; the last line printed is their JSON list.
_ARGPARSE = """import argparse, contextlib, io, json, runpy, sys, traceback
parse = argparse.ArgumentParser.parse_args
def parse_and_stop(self, *a, **k):
    parse(self, *a, **k)
    print("OK")
    sys.exit(0)
argparse.ArgumentParser.parse_args = parse_and_stop
outputs = []
for argv in json.loads(sys.stdin.read()):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        sys.argv = list(argv)
        try:
            runpy.run_path(sys.argv[0], run_name="__main__")
        except SystemExit as e:
            if e.code is not None and not isinstance(e.code, int):
                print(e.code, file=sys.stderr)
        except Exception:
            traceback.print_exc()
    outputs.append(dict(stdout=out.getvalue(), stderr=err.getvalue()))
print(json.dumps(outputs))
"""

# ``pytest --collect-only -q -p no:cacheprovider`` with the argument list on stdin (a snippet
# of ``_python``: a fork of the driver that imported jax and pytest once; each ``python -m
# pytest`` start cost about 3 s on the 2-core CI machine).
_COLLECT = """import json, sys
import pytest
sys.exit(int(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider"]
                         + json.loads(sys.stdin.read()))))
"""


# ``python -c <code>`` with ``payload`` (JSON) on stdin, as a file binary_runs can run: its
# driver imports what every snippet's benchmark module imports first (jax, Pallas, the library)
# once, and each snippet runs in a fork of it (a process of its own: its own absl flags, exit
# status, stdout and stderr). Each launch of its own cost about 2.5 s of the 2-core CI machine.
# The benchmark modules themselves are imported by the snippets, in their forks: some define
# flags of the same names (--out, --iters) at import.
_SNIPPET_MAIN = """import io
import json
import sys

import jax  # noqa: F401
import jax.numpy  # noqa: F401
import numpy  # noqa: F401
import pytest  # noqa: F401
from absl import flags  # noqa: F401
from jax.experimental import pallas  # noqa: F401

import lattn_jax.config  # noqa: F401
import pallas_kernels  # noqa: F401

code, payload = sys.argv[1], sys.argv[2]
sys.argv = sys.argv[:1]
sys.stdin = io.StringIO(payload)
exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})
"""
_snippet_main = []  # the file, written at the first use


def _python(code, payload):
    """``subprocess.run([sys.executable, "-c", code], input=json.dumps(payload), cwd=ROOT,
    capture_output=True, text=True, timeout=300)`` with PYTHONPATH=ROOT and JAX_PLATFORMS=cpu,
    as a fork of binary_runs' driver (``_SNIPPET_MAIN``)."""
    if not _snippet_main:
        directory = tempfile.mkdtemp(prefix="issue29_snippets_")
        atexit.register(shutil.rmtree, directory, ignore_errors=True)
        path = os.path.join(directory, "snippet_main.py")
        with open(path, "w") as f:
            f.write(_SNIPPET_MAIN)
        _snippet_main.append(path)
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    return binary_runs.run([sys.executable, _snippet_main[0], code, json.dumps(payload)],
                           env=env, timeout=300)


def _collect(arg_lists):
    """``pytest --collect-only -q`` with each of ``arg_lists`` (-m, -k, paths) in the repository
    root: a ``subprocess.CompletedProcess`` each (returncode, stdout, stderr; ``_COLLECT``)."""
    return [_python(_COLLECT, list(args)) for args in arg_lists]


def _collected(result):
    """How many tests a ``_collect`` result selected (-m, -k, paths)."""
    m = re.search(r"^(\d+)(?:/\d+)? tests? collected", result.stdout, re.M)
    return (int(m.group(1)) if m and result.returncode == 0 else 0), result.stdout[-2000:]


def _collected_ids(result):
    """The node ids a ``_collect`` result selected (-m, paths)."""
    if result.returncode != 0:
        raise AssertionError(f"collection failed: {result.stdout[-2000:]}{result.stderr[-2000:]}")
    return {line.strip() for line in result.stdout.splitlines() if "::" in line}


class Issue29QueueTest(absltest.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        tmp = tempfile.mkdtemp(prefix="issue29_queue_", dir=absltest.get_default_test_tmpdir())
        calls = os.path.join(tmp, "calls.jsonl")
        bin_dir = window_shims.install(tmp, calls)
        cls.result = subprocess.run(
            ["bash", SCRIPT, "100000"] + list(ITEMS), cwd=ROOT, capture_output=True, text=True,
            timeout=300, env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
                              "I29_TMP": os.path.join(tmp, "work"),
                              "OUT": os.path.join(tmp, "out"), "JAX_PLATFORMS": "cpu"})
        with open(calls) as f:
            cls.calls = [json.loads(line) for line in f]

    def _calls(self, tool):
        return [c[1:] for c in self.calls if c and c[0] == tool]

    def _one_call_parsed(self, tool, code):
        """The queue's one call of ``tool``, its flags parsed by ``code``: the JSON line that
        ``code`` prints last."""
        argvs = self._calls(tool)
        self.assertLen(argvs, 1)
        result = _python(code, argvs[0])
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        return json.loads(result.stdout.strip().splitlines()[-1])

    def _argparse_outputs(self, script, argvs):
        """Each of ``argvs`` through ``script``'s argparse parser (``_ARGPARSE``, one process):
        a dict of the stdout and stderr of each."""
        result = _python(_ARGPARSE, [[script] + list(argv) for argv in argvs])
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        outputs = json.loads(result.stdout.strip().splitlines()[-1])
        self.assertLen(outputs, len(argvs))
        return outputs

    def test_every_item_ran(self):
        for it in ITEMS:
            self.assertIn(f"== {it} ended at", self.result.stdout, self.result.stdout[-3000:])
        self.assertNotIn("skipped", self.result.stdout)

    def test_bench_kernels_flags_parse_and_pass_its_checks(self):
        argvs = self._calls("benchmarks/bench_kernels.py")
        self.assertGreaterEqual(len(argvs), 16)
        result = _python(_BENCH_KERNELS, argvs)
        self.assertEqual(result.stdout.strip(), "OK", result.stderr[-3000:])

    def test_profile_grad_flags_parse(self):
        argvs = self._calls("benchmarks/profile_grad.py")
        self.assertNotEmpty(argvs)
        for argv in argvs:
            result = _python(_PROFILE_GRAD, argv)
            self.assertEqual(result.returncode, 0, result.stderr[-3000:])

    def test_diag_grad_flags_parse(self):
        parsed = self._one_call_parsed("benchmarks/diag_grad.py", _DIAG_GRAD)  # cw_diag
        self.assertEqual(parsed["runs"][:4], ["k1@16", "k1@32", "k2@16", "k2@32"])
        self.assertEqual(parsed["probes"][:3], ["random", "nodecay", "kda"])
        self.assertLess(parsed["deadline"], 190)  # inside the item's timeout

    def test_default_list_is_the_items_not_yet_run_and_fits_one_window(self):
        with open(SCRIPT) as f:
            text = f.read()
        default = re.search(r"ITEMS=\$\{\*:-([^}]*)\}", text).group(1).split()
        # the order after 2026-12-07i (MOSAIC_GPU.md Sec. 63, 64): fused_rs on S2/P1's pieces,
        # W from T0's gpu tests again, fused_rs's ag_ahead protocol (S1 fwd)
        self.assertEqual(default, ["rs_pieces", "dhw", "rs_proto"])
        self.assertTrue(set(default) <= set(ITEMS))
        # every item has an estimate (an unknown one would be 100000 s: never run), and the
        # list fits a session's 1,800 s of device time with the script's 15 s margins
        estimates = {m.group(1): int(m.group(2)) for m in re.finditer(
            r"(\w+)\) echo (\d+);;", text)}
        for alts in re.finditer(r"([\w|]+)\) echo (\d+);;", text):
            for name in alts.group(1).split("|"):
                estimates[name] = int(alts.group(2))
        self.assertTrue(all(it in estimates for it in default), estimates)
        self.assertLessEqual(sum(estimates[it] + 15 for it in default), 1800)

    def test_bench_gva_loop_arguments_parse(self):
        argvs = self._calls("benchmarks/bench_gva_loop.py")
        self.assertNotEmpty(argvs)
        for result in self._argparse_outputs("benchmarks/bench_gva_loop.py", argvs):
            self.assertEqual(result["stdout"].strip(), "OK", result["stderr"][-3000:])

    def test_tp350_runs_the_throughput_binary_with_each_gdn_implementation(self):
        argvs = self._calls("benchmarks/train_throughput.py")
        self.assertLen(argvs, 2)  # tp350: auto, then pallas
        outputs = self._argparse_outputs("benchmarks/train_throughput.py", argvs)
        for argv, impl, result in zip(argvs, ("auto", "pallas"), outputs):
            self.assertEqual(result["stdout"].strip(), "OK", result["stderr"][-3000:])
            extra = [a for a in argv if a.startswith("--extra=")]
            self.assertEqual(extra, [f"--extra=--config.data.val_fraction=0.05 "
                                     f"--config.model.gdn.implementation={impl}"])
            self.assertIn("--batch_size=128", argv)
            # 8 (TP_MB's default): 16 ran out of memory on an 80 GB H100 (2026-12-07)
            self.assertIn("--micro_batch_size=8", argv)
        # both values are ones the model config accepts
        self.assertIn("auto", config_lib._DELTA_IMPLEMENTATIONS)
        self.assertIn("pallas", config_lib._DELTA_IMPLEMENTATIONS)

    def test_stepprof_profiles_the_tp350_step_with_the_mosaic_kernels(self):
        # stepprof's one call, then swiglu's two (the same command with --swiglu_packed off,
        # on), then norm_ab's two (the same command with model.norm_implementation xla, pallas)
        argvs = self._calls("benchmarks/profile_train_step.py")
        self.assertLen(argvs, 5)
        norms = []
        outputs = self._argparse_outputs("benchmarks/profile_train_step.py", argvs)
        for argv, result in zip(argvs, outputs):
            self.assertEqual(result["stdout"].strip(), "OK", result["stderr"][-3000:])
            sets = [a.split("=", 1)[1] for a in argv if a.startswith("--set=")]
            self.assertEqual(sets[:2], ["train.micro_batch_size=8",
                                        "model.gdn.implementation=auto"])
            norms.append(sets[2:])
            self.assertIn("--batch=128", argv)  # tp350's global batch
        self.assertEqual([[a for a in argv if a.startswith("--swiglu")] for argv in argvs],
                         [[], ["--swiglu_packed=off"], ["--swiglu_packed=on"], [], []])
        self.assertEqual(norms, [[], [], [], ["model.norm_implementation=xla"],
                                 ["model.norm_implementation=pallas"]])
        self.assertIn("auto", config_lib._DELTA_IMPLEMENTATIONS)
        self.assertContainsSubset(("xla", "pallas"), config_lib.NORM_IMPLEMENTATIONS)

    def test_profile_fwd_flags_parse(self):
        argvs = self._calls("benchmarks/profile_fwd.py")
        self.assertLen(argvs, 4)  # prof_split, rs_prof's two (fused_rs, fused_t0), rs_proto
        parsed = []
        for argv in argvs:
            result = _python(_PROFILE_FWD, argv)
            self.assertEqual(result.returncode, 0, result.stderr[-3000:])
            parsed.append(json.loads(result.stdout.strip().splitlines()[-1]))
        # rs_prof (MOSAIC_GPU.md Sec. 56): fused_rs's ablations, then fused_t0's full
        self.assertEqual(parsed[1]["split"], {"rs_stages": 3})
        self.assertEqual(parsed[1]["kernels"], ["gdn_chunk_delta_fused_rs_fwd_s3_abl_state",
                                                "gdn_chunk_delta_fused_rs_fwd_s3_abl_readout",
                                                "gdn_chunk_delta_fused_rs_fwd_s3"])
        self.assertEqual((parsed[2]["split"], parsed[2]["variants"]), ({}, ["full"]))
        # rs_proto (Sec. 64): the ablations of protocol="ag_ahead", three stages
        self.assertEqual(parsed[3]["split"], {"rs_stages": 3, "rs_protocol": "ag_ahead"})
        self.assertEqual(parsed[3]["kernels"], ["gdn_chunk_delta_fused_rs_fwd_s3_ah_abl_state",
                                                "gdn_chunk_delta_fused_rs_fwd_s3_ah_abl_readout",
                                                "gdn_chunk_delta_fused_rs_fwd_s3_ah"])
        parsed = parsed[0]  # prof_split
        self.assertEqual(parsed["split"], dict(split_output=True, split_order="state_ag",
                                               split_stages=3))
        self.assertEqual(parsed["variants"], ["io", "state", "readout", "full", "no_store",
                                              "nobar"])
        self.assertIn("gdn_chunk_delta_fused_t0_fwd_split_sa_s3_abl_readout", parsed["kernels"])

    def test_gpu_tests_paths_collect(self):
        argvs = self._calls("benchmarks/gpu_tests.py")
        self.assertLen(argvs, 10)  # t0w, gva, early, autooff, autooff_dn, fp16def, t0pieces,
        # cw_tests, k2floor, dvn_hf
        result = _python(_GPU_TESTS, argvs)  # one process parses every call's flags
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        parsed = [json.loads(line) for line in result.stdout.strip().splitlines()[-len(argvs):]]
        self.assertLen(parsed, len(argvs))
        paths = {}  # marker -> the paths of the calls with it
        for call in parsed:
            paths.setdefault(call["marker"], []).extend(call["paths"])
        # one collection for all paths of a marker (each pytest start costs seconds), then
        # each path on its own: none may select nothing
        markers = list(paths)
        results = _collect([["-m", marker] + sorted(set(paths[marker])) for marker in markers])
        for marker, result in zip(markers, results):
            ids = _collected_ids(result)
            for path in paths[marker]:
                self.assertTrue(any(i == path or i.startswith(path + "::") for i in ids),
                                f"{path} selects no test; collected: {sorted(ids)[:20]}")

    def test_pytest_selections_collect(self):
        argvs = [c[1:] for c in self._calls("-m") if c[:1] == ["pytest"]]
        self.assertLen(argvs, 15)  # t0glue, vk, split2, norm_ab, lgt_ftests, dhw, pskip, lgt_rh,
        # rs, mapsx, rs_res, rs_res_st, rs_pieces, kda_local, rs_proto
        selections = []
        for argv in argvs:
            keep, i = [], 0
            while i < len(argv):
                a = argv[i]
                if a in ("-m", "-k"):
                    keep += argv[i:i + 2]
                    i += 2
                    continue
                if a in ("-n", "-p"):  # xdist workers (where installed), plugins: not here
                    i += 2
                    continue
                if not a.startswith("-"):
                    keep.append(a)
                i += 1
            selections.append(keep)
        for keep, result in zip(selections, _collect(selections)):  # one process's forks
            n, out = _collected(result)
            self.assertGreater(n, 0, f"{keep}: {out}")

    def test_estimates_cover_the_timeout_caps(self):
        with open(SCRIPT) as f:
            text = f.read()
        est = {}
        for names, value in re.findall(r"(\w+(?:\|\w+)*)\) echo (\d+);;", text):
            for name in names.split("|"):
                est[name] = int(value)
        self.assertEqual(set(est), set(ITEMS))
        default = re.search(r"ITEMS=\$\{\*:-([^}]*)\}", text).group(1).split()
        self.assertContainsSubset(default, ITEMS)
        for it in ITEMS:
            body = re.search(r"^run_%s\(\) \{(.*)$" % it, text, re.M).group(1)
            if not body.rstrip().endswith("}"):  # not a one-line function: up to its "}" line
                body = re.search(r"^run_%s\(\) \{(.*?)^\}" % it, text, re.M | re.S).group(1)
            elapsed = 0  # the most seconds the item can have used so far
            for m in re.finditer(r"timeout (\d+) |timeout \$\(\((\d+) - SECONDS \+ s\)\)|"
                                 r"split_loop ([\w: ]+)|run_tab \w+ [\w,]+ (\d+)\b", body):
                if m.group(1) or m.group(4):  # run_tab's limit caps its three processes
                    elapsed += int(m.group(1) or m.group(4))
                elif m.group(2):  # a timeout of what is left: never <= 0 (0 is no limit)
                    self.assertGreaterEqual(int(m.group(2)) - elapsed, 10, f"{it}: {m.group(0)}")
                    elapsed = int(m.group(2))
                else:
                    elapsed += 65 * len(m.group(3).split())  # split_loop's timeout 65 each
            self.assertGreater(elapsed, 0, it)
            self.assertGreaterEqual(est[it], elapsed, f"{it}: est {est[it]} < cap {elapsed}")


if __name__ == "__main__":
    absltest.main()
