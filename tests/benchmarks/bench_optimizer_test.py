"""benchmarks/bench_optimizer.py: a tiny CPU run (both flatten settings, the gate, the report
files) and its argument checks."""

import json
import math
import os
import subprocess
import sys
import tempfile

from absl.testing import absltest

from benchmarks import bench_optimizer as bo

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "benchmarks", "bench_optimizer.py")


class BenchOptimizerTest(absltest.TestCase):

    def test_tiny_run(self):  # ~6 s on 2 cores
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "opt")
            payload = bo.run(tiny=True, weight_decays=(0.0, 0.1), warmup=1, iters=2, rounds=1,
                             trace_calls=0, out=out, log=lambda s: None)
            with open(out + ".json") as f:
                self.assertEqual(json.load(f)["num_params"], payload["num_params"])
            with open(out + ".md") as f:
                md = f.read()
        self.assertIn("| adamw | 0.1 | on |", md)
        rows = payload["results"]
        self.assertEqual([(r["weight_decay"], r["flatten"]) for r in rows],
                         [(0.0, False), (0.0, True), (0.1, False), (0.1, True)])
        for r in rows:
            self.assertTrue(math.isfinite(r["ms_median"]) and r["ms_median"] > 0, r)
            self.assertIsNone(r["kernels_per_call"])  # CPU: no device plane
        self.assertFalse(payload["gate_failed"])
        self.assertLess(rows[1]["gate_max_abs_diff"], bo.GATE_ATOL)
        # Flat state: one mu and one nu per group instead of per leaf, the same bytes.
        self.assertLess(rows[1]["state_leaves"], rows[0]["state_leaves"])
        self.assertLess(rows[3]["state_leaves"], rows[2]["state_leaves"])
        self.assertEqual(rows[1]["state_bytes"], rows[0]["state_bytes"])
        self.assertEqual(payload["settings"]["optim"]["name"], "adamw")

    def test_bad_arguments(self):
        for kwargs in (dict(iters=0), dict(rounds=0), dict(warmup=-1), dict(hbm_tbps=0.0),
                       dict(names=("sgd",)), dict(weight_decays=(-0.1,)),
                       dict(weight_decays=(float("inf"),)), dict(weight_decays=(float("nan"),)),
                       dict(stage="stage4")):
            with self.assertRaises(ValueError, msg=str(kwargs)):
                bo.run(tiny=True, log=lambda s: None, **kwargs)

    def test_flags(self):  # ~6 s: the binary's own flag handling, before anything is built
        out = f"--out={self.create_tempdir().full_path}/opt"
        for flags, want in (([], "--out is required"),
                            ([out, "--weight_decays=x", "--iters=0"],
                             "bench_optimizer.py: --weight_decays=x: need comma-separated "
                             "numbers")):
            proc = subprocess.run([sys.executable, SCRIPT, *flags], capture_output=True,
                                  text=True, timeout=120, check=False,
                                  env={**os.environ, "JAX_PLATFORMS": "cpu"})
            self.assertEqual(proc.returncode, 3, (flags, proc.stderr[-2000:]))
            self.assertIn(want, proc.stderr, flags)

    def test_flags_name_the_option(self):  # ~6 s: refused before anything is built
        blocker = self.create_tempfile("file").full_path  # a file: no folder can be made in it
        for flags, want in (
                ([f"--out={blocker}/sub/opt", "--iters=0"],
                 f"bench_optimizer.py: --out={blocker}/sub/opt: cannot create {blocker}/sub"),
                ([f"--out={self.create_tempdir().full_path}/opt", "--attention_layers=1,x"],
                 "bench_optimizer.py: --attention_layers=1,x: need comma-separated integers")):
            proc = subprocess.run([sys.executable, SCRIPT, *flags], capture_output=True,
                                  text=True, timeout=120, check=False,
                                  env={**os.environ, "JAX_PLATFORMS": "cpu"})
            self.assertEqual(proc.returncode, 3, (flags, proc.stderr[-2000:]))
            err = proc.stderr.strip()
            self.assertTrue(err.startswith(want), (flags, err))
            self.assertEqual(len(err.splitlines()), 1, (flags, err))


if __name__ == "__main__":
    absltest.main()
