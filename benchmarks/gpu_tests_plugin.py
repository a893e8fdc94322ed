"""pytest plugin of ``benchmarks/gpu_tests.py``: one JSON line per test phase report.

Each worker loads it (``-p benchmarks.gpu_tests_plugin``) and appends, to the file named by
``$GPU_TESTS_RECORD``, ``{"nodeid", "when", "outcome", "wasxfail"}`` for every setup, call and
teardown report as pytest makes it, flushed at once: the record survives a worker killed at the
deadline, and nothing a test prints (or a live-log block splitting pytest's ``-v`` line) can
fake or hide a verdict.
"""

import json
import os


def pytest_runtest_logreport(report):
    """Appends the phase report (pytest hook)."""
    path = os.environ.get("GPU_TESTS_RECORD")
    if not path:
        return
    line = json.dumps({"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
                       "wasxfail": hasattr(report, "wasxfail")})
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
