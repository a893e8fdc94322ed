"""Tests of benchmarks/acceptance.py: issue 29's verdicts from bench_kernels records."""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from absl.testing import absltest

from benchmarks import acceptance

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _rec(op, shape, pas, peer, ms, gate=True):
    return dict(op=op, shape=shape, pass_=pas, peer=peer, kernel_ms=ms, gate=gate)


class AcceptanceTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        rng = np.random.default_rng(29)
        self.jla = float(rng.uniform(1.0, 2.0))

    def _row(self, lines, op, shape, pas):
        rows = [line for line in lines if line.startswith(f"| {op} | {shape} | {pas} |")]
        self.assertLen(rows, 1, lines)
        return [c.strip() for c in rows[0].strip("|").split("|")]

    def test_verdicts_against_jla_and_fla(self):
        jla = self.jla
        met = 0.95 * jla - 0.01
        missed = 0.95 * jla + 0.123
        records = [_rec("kda", "S1", "fwd", "ours", met), _rec("kda", "S1", "fwd", "jla", jla),
                   _rec("kda", "S1", "fwd", "fla", met + 0.5),
                   _rec("kda", "S2", "fwdbwd", "ours", missed),
                   _rec("kda", "S2", "fwdbwd", "jla", jla),
                   _rec("kda", "S2", "fwdbwd", "fla", missed - 0.25)]
        lines = acceptance.table(records)
        row = self._row(lines, "kda", "S1", "fwd")
        self.assertEqual(row[6], f"{met / jla:.3f}")
        self.assertEqual(row[7:], ["met", "met"])
        row = self._row(lines, "kda", "S2", "fwdbwd")
        self.assertEqual(row[7], "missed by 0.123")
        self.assertEqual(row[8], "missed by 0.250")

    def test_red_gate_meets_nothing_and_a_missing_peer_is_not_measured(self):
        records = [_rec("gdn", "P1", "fwd", "ours", 0.1, gate=False),
                   _rec("gdn", "P1", "fwd", "jla", self.jla),
                   _rec("gdn", "P1", "fwdbwd", "ours", 0.2),
                   _rec("gdn", "P1", "fwdbwd", "jla", self.jla)]
        lines = acceptance.table(records)
        self.assertEqual(self._row(lines, "gdn", "P1", "fwd")[7:], ["RED (gate)"] * 2)
        self.assertEqual(self._row(lines, "gdn", "P1", "fwdbwd")[7:], ["met", "not measured"])

    def test_gdn_s1_target_line_and_last_record_wins(self):
        records = [_rec("gdn", "S1", "fwdbwd", "ours", 1.1),
                   _rec("gdn", "S1", "fwdbwd", "ours", 1.5)]  # a later process's record
        lines = acceptance.table(records)
        self.assertIn("GDN S1 fwd+bwd: 1.500 ms against at most 1.23 ms: missed by 0.270.",
                      lines)
        self.assertEqual(self._row(lines, "gdn", "S1", "fwdbwd")[3], "1.500")

    def test_binary_reads_jsonl_and_json_and_names_a_bad_file(self):
        tmp = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
        a, b = os.path.join(tmp, "S1.jsonl"), os.path.join(tmp, "fla.json")
        with open(a, "w") as f:
            f.write(json.dumps(_rec("lightning", "S1", "fwd", "ours", 0.2)) + "\n")
            f.write(json.dumps(_rec("lightning", "S1", "fwd", "jla", 0.3)) + "\n")
        with open(b, "w") as f:
            json.dump(dict(records=[_rec("lightning", "S1", "fwd", "fla", 0.19)]), f)
        run = [sys.executable, os.path.join(ROOT, "benchmarks", "acceptance.py")]
        out = subprocess.run(run + [a, b], capture_output=True, text=True, cwd=ROOT)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("| lightning | S1 | fwd | 0.200 | 0.300 | 0.190 | 0.667 | met | "
                      "missed by 0.010 |", out.stdout)
        bad = os.path.join(tmp, "bad.jsonl")
        with open(bad, "w") as f:
            f.write("not json\n")
        out = subprocess.run(run + [a, bad], capture_output=True, text=True, cwd=ROOT)
        self.assertNotEqual(out.returncode, 0)
        self.assertIn(f"{bad} is not bench_kernels records", out.stderr)
        self.assertLen(out.stderr.strip().splitlines(), 1)


if __name__ == "__main__":
    absltest.main()
