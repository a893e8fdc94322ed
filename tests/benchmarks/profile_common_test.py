"""The flags and the timed-variant run the kernel profilers share (benchmarks/common.py:
``define_profile_flags``, ``run_profile``), and the four profilers' command lines, which moving
them there left as they were (profile_fwd.py, profile_grad.py, profile_t0.py,
profile_wy_bwd.py; their own tests run them)."""

import errno
import json
import os
import re
import subprocess
import sys
from unittest import mock

from absl import flags
from absl.testing import absltest
import numpy as np

from benchmarks import common
from tests import binary_runs

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SHARED = ("batch", "seq_len", "heads", "dk", "dv", "dtype", "variants", "iters", "check_heads",
          "deadline_s", "interpret", "static", "out")
# Every profiler's flags and defaults (absl's --help), as they were before the shared flags
# moved to benchmarks/common.py.
HELP_DEFAULTS = {"batch": "8", "seq_len": "4096", "heads": "16", "dk": "128", "dv": "128",
                 "dtype": "bfloat16", "iters": "20", "check_heads": "2", "interpret": "false",
                 "static": "false", "deadline_s": None, "out": None}
OWN = {
    "profile_fwd": {"kv_heads": "16", "doc_len": "0", "sm_count": "132", "ctas_per_sm": "1",
                    "clock_ghz": None, "split_order": "", "split_stages": "2",
                    "variants": "io,v_new,state,full,no_store,nobar"},
    "profile_grad": {"gate": "0.01", "slabs": "16,32",
                     "variants": "k2,k2:no_band,k2:no_mma,k2:no_factors,k2:no_state,"
                                 "k2:no_cumsum,k2:no_store,k2:no_band+no_cumsum+no_factors+"
                                 "no_mma+no_state,k1,k1:no_band,k1:no_mma,k1:no_factors,"
                                 "k1:no_store,k1:no_band+no_factors+no_mma"},
    "profile_t0": {"kv_heads": "16", "doc_len": "0", "sm_count": "132", "ctas_per_sm": "2",
                   "clock_ghz": None, "chunks_per_cta": "",
                   "variants": "io:doubling,gram:doubling,no_refine:doubling,full:doubling,"
                               "nobar:doubling,no_store:doubling,no_refine:substitution,"
                               "full:substitution,nobar:substitution,"
                               "full:substitution+split_merge,nobar:substitution+split_merge"},
    "profile_wy_bwd": {"gate": "0.001",
                       "variants": "full,io,no_mma,no_inverse,no_split,no_exp,no_store,"
                                   "no_exp+no_inverse+no_mma+no_split"},
}


def help_defaults(text):
    """``{flag: default or None}`` of the flags absl's ``--help`` lists for the binary (a long
    default is wrapped over several lines there)."""
    blocks, name = {}, None
    for line in text.splitlines():
        match = re.match(r"^  --(?:\[no\])?(\w+):", line)
        if match:
            name = match.group(1)
            blocks[name] = ""
        elif name and line.startswith("    "):
            blocks[name] += line.strip()  # (joined: a wrapped default has no spaces)
    out = {}
    for name, block in blocks.items():
        match = re.search(r"\(default: '(.*?)'\)", block)
        out[name] = match.group(1) if match else None
    return out


class ProfileFlagsTest(absltest.TestCase):

    def test_define_profile_flags_defines_the_shared_flags_with_their_defaults(self):
        fv = flags.FlagValues()
        got = common.define_profile_flags(
            heads_help="H.", dtype_help="d.", variants_default=("a", "b"), variants_help="v.",
            check_heads_help="c.", flag_values=fv)
        fv(["prog", "--out=/tmp/x", "--dk=64", "--variants=b"])
        self.assertEqual(
            {name: getattr(got, name).value for name in SHARED},
            {"batch": 8, "seq_len": 4096, "heads": 16, "dk": "64", "dv": "128",
             "dtype": "bfloat16", "variants": ["b"], "iters": 20, "check_heads": 2,
             "deadline_s": None, "interpret": False, "static": False, "out": "/tmp/x"})
        self.assertEqual(fv["heads"].help, "H.")
        # No --dv (profile_t0.py); --out is required.
        fv = flags.FlagValues()
        got = common.define_profile_flags(
            heads_help="H.", dtype_help="d.", variants_default=("a",), variants_help="v.",
            check_heads_help="c.", dv=False, flag_values=fv)
        self.assertIsNone(got.dv)
        self.assertNotIn("dv", fv)
        with self.assertRaisesRegex(flags.IllegalFlagValueError, "--out"):
            fv(["prog"])

    def test_run_profile_writes_the_records_and_the_table(self):
        out = os.path.join(self.create_tempdir().full_path, "new", "prof")
        os.makedirs(os.path.dirname(out))
        with open(out + ".jsonl", "w") as f:
            f.write('{"variant": "stale"}\n')

        def measure(rec, want, x):
            rec["value"] = x + (want or 0)
            return rec["value"]

        recs = common.run_profile(
            out, [({"variant": "a"}, (1,)), ({"variant": "b"}, (2,))], measure,
            render=lambda rs: "| " + " | ".join(r["variant"] for r in rs) + " |\n",
            deadline_s=None, start=0.0, deadline_exit=3)
        self.assertEqual([r["value"] for r in recs], [1, 3])
        with open(out + ".jsonl") as f:
            self.assertEqual([json.loads(line)["variant"] for line in f], ["a", "b"])
        with open(out + ".md") as f:
            self.assertEqual(f.read(), "| a | b |\n")

    def test_a_failed_table_write_leaves_the_previous_table_intact(self):
        # A rerun with the same --out rewrites <out>.md; a write that fails (here: past a file
        # size limit, as on a full disk) left it truncated when it was written in place.
        out = os.path.join(self.create_tempdir().full_path, "prof")
        rng = np.random.default_rng(3)
        words = ["k1", "k2", "no_mma", "io", "full", "0.125", "ms"]
        previous = "| " + " | ".join(rng.choice(words, size=20)) + " |\n"
        with open(out + ".md", "w") as f:
            f.write(previous)
        big = "| " + " | ".join(rng.choice(words, size=4000)) + " |\n"  # > the 4 KiB limit
        script = f"""
import resource, signal
from benchmarks import common
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit: EFBIG, not a kill
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
try:
    common.run_profile({out!r}, [({{"variant": "a"}}, ()), ({{"variant": "b"}}, ())],
                       lambda rec, want: 1.0, render=lambda rs: {big!r},
                       deadline_s=None, start=0.0, deadline_exit=3)
except OSError as e:
    print("errno", e.errno)
"""
        result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                                text=True, timeout=120,
                                env=dict(os.environ, JAX_PLATFORMS="cpu",
                                         PYTHONDONTWRITEBYTECODE="1"))
        self.assertEqual(result.returncode, 0, result.stderr[-2000:])
        self.assertEqual(result.stdout.strip().splitlines()[-1], f"errno {errno.EFBIG}")
        with open(out + ".md") as f:
            self.assertEqual(f.read(), previous)  # the previous run's table, whole
        self.assertEqual(sorted(os.listdir(os.path.dirname(out))), ["prof.jsonl", "prof.md"])

    def test_write_report_writes_both_files_whole_and_leaves_no_temporary_file(self):
        # The benchmarks' <out>.json / <out>.md pair; a failed write removes its temporary
        # file (the old inline write left a fixed "<out>.md.tmp" behind) and keeps the old one.
        folder = os.path.join(self.create_tempdir().full_path, "new")
        out = os.path.join(folder, "bench")
        rng = np.random.default_rng(5)
        payload = {"rows": rng.integers(0, 1000, size=7).tolist(), "ms": float(rng.random())}
        common.write_report(out, payload, "| a |\n")
        with open(out + ".json") as f:
            self.assertEqual(json.load(f), payload)
        self.assertEqual(sorted(os.listdir(folder)), ["bench.json", "bench.md"])
        with mock.patch("os.replace", side_effect=OSError(errno.ENOSPC, "disk full")):
            with self.assertRaises(OSError):
                common.write_report(out, {"other": 1}, "| c |\n")
        with open(out + ".json") as f:
            self.assertEqual(json.load(f), payload)
        self.assertEqual(sorted(os.listdir(folder)), ["bench.json", "bench.md"])

    def test_the_profilers_define_the_shared_flags_in_one_place_with_the_same_defaults(self):
        # Each of the four defined the same twelve flags and wrote the same output files.
        for name, own in OWN.items():
            path = os.path.join(ROOT, "benchmarks", name + ".py")
            with open(path) as f:
                source = f.read()
            defined = re.findall(r"DEFINE_\w+\(\s*\"(\w+)\"", source)
            self.assertEqual([d for d in defined if d in SHARED], [], name)
            self.assertIn("common.run_profile(", source, name)
            self.assertNotIn("common.run_variants(", source, name)
            # (a fork of one process that imported the profilers' modules: tests/binary_runs.py)
            result = binary_runs.run([sys.executable, path, "--help"],
                                     env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=120)
            expected = dict(HELP_DEFAULTS, **own)
            if name == "profile_t0":
                del expected["dv"]
            self.assertEqual(help_defaults(result.stdout + result.stderr), expected, name)


if __name__ == "__main__":
    absltest.main()
