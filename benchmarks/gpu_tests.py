r"""Runs marked tests (default ``-m gpu``) in parallel pytest processes under one deadline.

Why: on the H200 our Mosaic GPU tests are compile-bound (12-03c: about 55 s per backward test,
one CPU core busy, the GPU idle), device time is rationed per session, and a plain
``timeout 170 pytest -q`` killed by the deadline reports nothing but dots. This binary spreads
the tests over ``--jobs`` processes (the GPU machine has 16 cores), stops them all at
``--deadline_s`` with SIGINT (pytest then still prints its per-test lines), and writes which
tests passed, failed, were skipped or never ran.

Collection: ``pytest --collect-only -q -m <marker> <paths>`` in the current directory. Tests
go to workers round-robin in collection order, so a file's slow tests spread over the workers.
Each worker runs ``pytest -v -p no:cacheprovider -m <marker> <its node ids>`` with
``XLA_PYTHON_CLIENT_PREALLOCATE=false`` (the workers share one GPU's memory); its output goes to
``<out>/worker-<k>.log``.

Outputs: ``<out>/summary.json`` (``{"counts": {...}, "tests": {node id: outcome}, ...}``,
outcomes ``passed``, ``failed``, ``error``, ``skipped``, ``xfailed``, ``xpassed`` and
``not run``) and ``<out>/summary.md``; a short summary on stdout. Exit status: 0 if every
collected test ran and none failed, 1 if any failed or errored, 2 if none failed but some did
not run (deadline), 3 if collection failed or found nothing.

Usage (on the GPU machine; ``$OUT`` comes back from a ``run`` call)::

    python3 benchmarks/gpu_tests.py --jobs=8 --deadline_s=280 --out=$OUT/gpu_tests \
        tests/pallas_kernels/kernel_mosaic_gdn_bwd_test.py \
        tests/pallas_kernels/kernel_mosaic_gdn_wy_bwd_test.py

Raises (as a one-line error, exit 3): a ``--jobs`` or ``--deadline_s`` below 1, no paths.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from typing import Dict, List, Sequence

from absl import app, flags

_JOBS = flags.DEFINE_integer("jobs", 8, "Parallel pytest processes (>= 1).")
_DEADLINE = flags.DEFINE_float("deadline_s", 280.0,
                               "Seconds from the start until every worker gets SIGINT (> 0).")
_GRACE = flags.DEFINE_float("grace_s", 15.0,
                            "Seconds a worker gets after SIGINT to print its lines, then SIGKILL.")
_MARKER = flags.DEFINE_string("marker", "gpu", "pytest -m expression selecting the tests.")
_OUT = flags.DEFINE_string("out", None,
                           "Output folder (default: $OUT/gpu_tests, else ./gpu_tests).")

# pytest -v: "path::Class::test_name PASSED   [ 50%]" (xdist-free, one test per line).
_RESULT = re.compile(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
_OUTCOME = {"PASSED": "passed", "FAILED": "failed", "ERROR": "error", "SKIPPED": "skipped",
            "XFAIL": "xfailed", "XPASS": "xpassed"}


def collect(paths: Sequence[str], marker: str) -> List[str]:
    """The node ids pytest collects for ``paths`` under ``-m marker``, in collection order.

    Raises:
      RuntimeError: collection failed (pytest's exit status is neither 0 nor 5, "no tests").
    """
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider", "-m", marker, *paths],
                          capture_output=True, text=True, check=False)
    if proc.returncode not in (0, 5):
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise RuntimeError(f"pytest --collect-only failed (exit {proc.returncode}):\n{tail}")
    return [line.strip() for line in proc.stdout.splitlines() if "::" in line]


def split_round_robin(items: Sequence[str], jobs: int) -> List[List[str]]:
    """``items`` dealt to ``min(jobs, len(items))`` lists in turn (order kept within each)."""
    n = max(1, min(jobs, len(items)))
    return [list(items[k::n]) for k in range(n)]


def parse_log(text: str) -> Dict[str, str]:
    """``{node id: outcome}`` from a ``pytest -v`` log (the first verdict of a test wins, so a
    teardown ERROR after a PASSED keeps ``passed``; pytest prints that error in the summary)."""
    out: Dict[str, str] = {}
    for line in text.splitlines():
        m = _RESULT.match(line.strip())
        if m and m.group(1) not in out:
            out[m.group(1)] = _OUTCOME[m.group(2)]
    return out


def summarise(tests: Sequence[str], logs: Sequence[str]) -> Dict[str, object]:
    """Per-test outcomes (``not run`` where no log has a verdict) and their counts."""
    seen: Dict[str, str] = {}
    for text in logs:
        seen.update(parse_log(text))
    outcomes = {t: seen.get(t, "not run") for t in tests}
    counts: Dict[str, int] = {}
    for o in outcomes.values():
        counts[o] = counts.get(o, 0) + 1
    return {"counts": counts, "tests": outcomes}


def exit_status(counts: Dict[str, int]) -> int:
    """0 all ran and none failed; 1 a failure or error; 2 some never ran."""
    if counts.get("failed", 0) or counts.get("error", 0):
        return 1
    return 2 if counts.get("not run", 0) else 0


def _markdown(summary: Dict[str, object], command: str) -> str:
    lines = [f"Command: `{command}`", "",
             "Counts: " + ", ".join(f"{k} {v}" for k, v in sorted(summary["counts"].items())),
             f"Wall: {summary['wall_s']:.1f} s over {summary['jobs']} workers", "",
             "| test | outcome |", "|---|---|"]
    lines += [f"| `{t}` | {o} |" for t, o in summary["tests"].items()]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str]) -> int:
    paths = list(argv[1:])
    problem = None
    if not paths:
        problem = "give the test paths (or node ids) to run"
    elif _JOBS.value < 1:
        problem = f"--jobs={_JOBS.value} must be at least 1"
    elif not _DEADLINE.value > 0:
        problem = f"--deadline_s={_DEADLINE.value} must be above 0"
    if problem:
        print(f"gpu_tests.py: {problem}", file=sys.stderr)
        return 3
    out = _OUT.value or os.path.join(os.environ.get("OUT", "."), "gpu_tests")
    os.makedirs(out, exist_ok=True)
    start = time.monotonic()
    try:
        tests = collect(paths, _MARKER.value)
    except RuntimeError as e:
        print(f"gpu_tests.py: {e}", file=sys.stderr)
        return 3
    if not tests:
        print(f"gpu_tests.py: no test under {paths} matches -m {_MARKER.value!r}",
              file=sys.stderr)
        return 3
    groups = split_round_robin(tests, _JOBS.value)
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    procs, files = [], []
    for k, group in enumerate(groups):
        f = open(os.path.join(out, f"worker-{k}.log"), "w")  # pylint: disable=consider-using-with
        files.append(f)
        procs.append(subprocess.Popen(  # pylint: disable=consider-using-with
            [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-m",
             _MARKER.value, *group], stdout=f, stderr=subprocess.STDOUT, env=env))
    print(f"{len(tests)} tests over {len(procs)} workers; deadline {_DEADLINE.value:.0f} s",
          flush=True)
    deadline = start + _DEADLINE.value
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.5)
    interrupted = [p for p in procs if p.poll() is None]
    for p in interrupted:
        p.send_signal(signal.SIGINT)
    grace_end = time.monotonic() + _GRACE.value
    for p in interrupted:
        try:
            p.wait(timeout=max(0.0, grace_end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    for f in files:
        f.close()
    logs = []
    for k in range(len(groups)):
        with open(os.path.join(out, f"worker-{k}.log"), encoding="utf-8", errors="replace") as f:
            logs.append(f.read())
    summary = summarise(tests, logs)
    summary.update(wall_s=time.monotonic() - start, jobs=len(procs),
                   interrupted_workers=len(interrupted), deadline_s=_DEADLINE.value,
                   marker=_MARKER.value, paths=paths)
    command = " ".join([os.path.relpath(__file__)] + sys.argv[1:])
    with open(os.path.join(out, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(dict(summary, command=command), f, indent=1)
    with open(os.path.join(out, "summary.md"), "w", encoding="utf-8") as f:
        f.write(_markdown(summary, command))
    counts = summary["counts"]
    print("counts: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
          + f"; {summary['wall_s']:.1f} s; {len(interrupted)} workers stopped at the deadline")
    for t, o in summary["tests"].items():
        if o in ("failed", "error"):
            print(f"{o.upper()}: {t}")
    return exit_status(counts)


if __name__ == "__main__":
    app.run(main)
