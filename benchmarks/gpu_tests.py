r"""Runs marked tests (default ``-m gpu``) in parallel pytest processes under one deadline.

Why: on the H200 our Mosaic GPU tests are compile-bound (12-03c: about 55 s per backward test,
one CPU core busy, the GPU idle), device time is rationed per session, and a plain
``timeout 170 pytest -q`` killed by the deadline reports nothing but dots. This binary spreads
the tests over ``--jobs`` processes (the GPU machine has 16 cores), stops them all at
``--deadline_s`` with SIGINT (pytest then still prints its per-test lines), and writes which
tests passed, failed, were skipped or never ran.

Collection: ``pytest --collect-only -q -m <marker> <paths>`` in the current directory. Tests
go to workers round-robin in collection order, so a file's slow tests spread over the workers.
Each worker runs ``pytest -v -p no:cacheprovider -p benchmarks.gpu_tests_plugin -m <marker>
<its node ids>`` with ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` (the workers share one GPU's
memory); its output goes to ``<out>/worker-<k>.log`` and the plugin writes every test phase's
report to ``<out>/worker-<k>.jsonl`` as it happens. The outcomes come from those records, not
from the log, so nothing a test prints can fake or hide a verdict.

Each worker runs in its own process group: at the deadline SIGINT (then SIGKILL after
``--grace_s``) goes to the whole group, so processes a test started stop with it (unless it
started its own session). A SIGTERM or SIGINT to this binary stops every worker group, writes
the summary of what ran, and exits 143 or 130. Run it from the directory pytest takes as its
rootdir (the repository root): the collected node ids are relative to it, and the binary
refuses ids whose files it cannot find. An ``--out`` folder's files of an earlier run are
removed first.

Outcomes per test: ``passed``, ``failed`` (a strict xpass included), ``error`` (a setup or
teardown error, also after a passing call), ``skipped``, ``xfailed``, ``xpassed``, ``not run``
(its worker was stopped, at the deadline or by a signal, before its verdict) and ``worker died``
(its worker ended on its own without a verdict for it: ``os._exit``, a crash).

Outputs: ``<out>/summary.json`` (``{"counts": {...}, "tests": {node id: outcome},
"worker_exit": [...], "ptxas": [...], ...}``), ``<out>/summary.md``, ``<out>/workers.log``
(every worker's log, one after another, each under a line ``===== worker-<k>.log =====``)
and a short summary on stdout. On a return folder that brings back only a few files (the GPU
machine's ``$OUT``), keep ``summary.md``, ``summary.json`` and ``workers.log``: together they
hold everything the per-worker files do but the raw phase records.

ptxas: with ``MOSAIC_GPU_DUMP_PTXAS=1`` in the environment jaxlib prints ptxas's verbose
output for every Mosaic GPU kernel it compiles; the workers then run with ``-s`` (pytest's
output capture would keep a passing test's prints out of its log), and after they end (also
at the deadline or on a signal) the summary collects, from every worker's log,
``benchmarks/offline_ptxas.py``'s ``parse_ptxas`` records: ``summary.json``'s ``"ptxas"``
is a list of ``{"worker", "entry", "registers", "spill_stores", "spill_loads", "line"}``
(``None`` for a figure a stopped worker's log lacks; ``line``, ptxas's lines of that entry,
trimmed), one per distinct ``(entry, registers, spill stores, spill loads)``, first worker
first; ``summary.md`` gets the table "ptxas (MOSAIC_GPU_DUMP_PTXAS=1)" when there are any.

Exit status:
0 if every collected test ran and none failed, 1 if any failed, errored or lost its worker, 2 if
none failed but some did not run (deadline), 3 if collection failed or found nothing (one line;
pytest's full output in ``<out>/collect.log``), 130 / 143 after SIGINT / SIGTERM.

Usage (on the GPU machine; ``$OUT`` comes back from a ``run`` call)::

    python3 benchmarks/gpu_tests.py --jobs=8 --deadline_s=280 --out=$OUT/gpu_tests \
        tests/pallas_kernels/kernel_mosaic_gdn_bwd_test.py \
        tests/pallas_kernels/kernel_mosaic_gdn_wy_bwd_test.py

Raises (as a one-line error, exit 3): a ``--jobs`` below 1, a ``--deadline_s`` not above 0, a
negative ``--grace_s``, no paths, a failed or empty collection, node ids whose files are not
under the current directory.
"""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from typing import Dict, List, Mapping, Optional, Sequence

from absl import app, flags

# The repository root, so that `python benchmarks/gpu_tests.py` finds lattn_jax.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import offline_ptxas  # noqa: E402  pylint: disable=wrong-import-position
from lattn_jax.eval import fetch  # noqa: E402  pylint: disable=wrong-import-position

_JOBS = _DEADLINE = _GRACE = _MARKER = _OUT = None  # flags, defined by _define_flags


def _define_flags() -> None:
    """Defines the binary's flags; only when run as a program, so that importing the module
    (its tests) cannot clash with another module's ``--out`` in the same process."""
    global _JOBS, _DEADLINE, _GRACE, _MARKER, _OUT  # pylint: disable=global-statement
    _JOBS = flags.DEFINE_integer("jobs", 8, "Parallel pytest processes (>= 1).")
    _DEADLINE = flags.DEFINE_float("deadline_s", 280.0,
                                   "Seconds from the start until every worker gets SIGINT (> 0).")
    _GRACE = flags.DEFINE_float("grace_s", 15.0, "Seconds a worker gets after SIGINT to print "
                                "its lines, then SIGKILL.")
    _MARKER = flags.DEFINE_string("marker", "gpu", "pytest -m expression selecting the tests.")
    _OUT = flags.DEFINE_string("out", None,
                               "Output folder (default: $OUT/gpu_tests, else ./gpu_tests).")


# When a test has several phase outcomes (call, then teardown), the worst one is its outcome.
_RANK = {"failed": 3, "error": 2}


def collect(paths: Sequence[str], marker: str) -> List[str]:
    """The node ids pytest collects for ``paths`` under ``-m marker``, in collection order.

    Raises:
      RuntimeError: collection failed (pytest's exit status is neither 0 nor 5, "no tests").
    """
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider", "-m", marker, *paths],
                          capture_output=True, text=True, check=False)
    if proc.returncode not in (0, 5):
        lines = (proc.stdout + proc.stderr).strip().splitlines()
        first = next((ln for ln in lines if ln.startswith(("ERROR", "E "))),
                     lines[-1] if lines else "")
        raise RuntimeError(f"pytest --collect-only failed (exit {proc.returncode}): "
                           f"{first.strip()}", proc.stdout + proc.stderr)
    return [line.strip() for line in proc.stdout.splitlines() if "::" in line]


def split_round_robin(items: Sequence[str], jobs: int) -> List[List[str]]:
    """``items`` dealt to ``min(jobs, len(items))`` lists in turn (order kept within each)."""
    n = max(1, min(jobs, len(items)))
    return [list(items[k::n]) for k in range(n)]


def outcome_of(phases: Sequence[Mapping[str, object]]) -> Optional[str]:
    """A test's outcome from its phase reports (``benchmarks/gpu_tests_plugin.py`` lines, in
    order), or ``None`` when it has no verdict yet (its call never reported).

    ``failed``: the call failed (a strict xpass included); ``error``: setup or teardown failed
    (also after a passing call); ``skipped`` / ``xfailed``: skipped in setup or call, without or
    with an xfail mark; ``xpassed``: a non-strict xfail that passed; else ``passed``.
    """
    verdict = None
    for p in phases:
        when, outcome, xfail = p.get("when"), p.get("outcome"), bool(p.get("wasxfail"))
        if outcome == "failed":
            this = "failed" if when == "call" else "error"
        elif outcome == "skipped":
            this = "xfailed" if xfail else "skipped"
        elif when == "call":
            this = "xpassed" if xfail else "passed"
        else:
            continue  # a passing setup or teardown decides nothing
        if verdict is None or _RANK.get(this, 0) > _RANK.get(verdict, 0):
            verdict = this
    return verdict


def read_records(path: str) -> Dict[str, List[Dict[str, object]]]:
    """``{node id: [phase reports]}`` from a worker's record file (``fetch.read_jsonl``: a torn
    last line, from a worker killed mid-write, is skipped; no file, no records)."""
    out: Dict[str, List[Dict[str, object]]] = {}
    for rec in fetch.read_jsonl(path):
        out.setdefault(rec["nodeid"], []).append(rec)
    return out


def summarise(groups: Sequence[Sequence[str]], records: Sequence[Mapping[str, list]],
              stopped: Sequence[bool]) -> Dict[str, object]:
    """Per-test outcomes and their counts, worker by worker.

    A test without a verdict in its worker's record is ``not run`` if the worker was stopped
    (deadline or signal), else ``worker died``: the worker ended on its own without reaching it.
    """
    outcomes: Dict[str, str] = {}
    for group, rec, was_stopped in zip(groups, records, stopped):
        missing = "not run" if was_stopped else "worker died"
        for t in group:
            outcomes[t] = outcome_of(rec.get(t, [])) or missing
    counts: Dict[str, int] = {}
    for o in outcomes.values():
        counts[o] = counts.get(o, 0) + 1
    return {"counts": counts, "tests": outcomes}


def exit_status(counts: Dict[str, int]) -> int:
    """0 all ran and none failed; 1 a failure, error or lost worker; 2 some never ran."""
    if counts.get("failed", 0) or counts.get("error", 0) or counts.get("worker died", 0):
        return 1
    return 2 if counts.get("not run", 0) else 0


_PTXAS_LINE = re.compile(r"ptxas info\s*: (Compiling entry function|Used \d+ registers)"
                         r"|\d+ bytes stack frame, \d+ bytes spill stores")


def ptxas_records(logs: Sequence[str]) -> List[Dict[str, object]]:
    """ptxas's registers and spills per kernel entry from the worker logs ``logs`` (worker k's
    text at index k), parsed by ``offline_ptxas.parse_ptxas``: ``{"worker", "entry",
    "registers", "spill_stores", "spill_loads", "line"}``, one per distinct ``(entry,
    registers, spill stores, spill loads)`` in worker and log order; ``line`` is the entry's
    ptxas lines (entry, stack frame and spills, registers) joined by `` | ``, at most 300
    characters."""
    out, seen = [], set()
    for k, log in enumerate(logs):
        blocks = re.split(r"(?=ptxas info\s*: Compiling entry function)", log)[1:]
        for block in blocks:
            recs = offline_ptxas.parse_ptxas(block)
            if not recs:
                continue
            rec = recs[0]
            key = (rec["kernel"], rec["regs"], rec["spill_st"], rec["spill_ld"])
            if key in seen:
                continue
            seen.add(key)
            lines = []
            for ln in block.splitlines():
                m = _PTXAS_LINE.search(ln)
                if m:
                    lines.append(ln[m.start():].strip())
            out.append({"worker": k, "entry": rec["kernel"], "registers": rec["regs"],
                        "spill_stores": rec["spill_st"], "spill_loads": rec["spill_ld"],
                        "line": " | ".join(lines)[:300]})
    return out


def read_log(path: str) -> str:
    """A worker's log as text (bytes that are not UTF-8 replaced; no file, empty)."""
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""


def write_workers_log(path: str, logs: Sequence[str]) -> None:
    """Every worker's log into one file, each under ``===== worker-<k>.log =====``."""
    with open(path, "w", encoding="utf-8") as f:
        for k, log in enumerate(logs):
            f.write(f"===== worker-{k}.log =====\n")
            f.write(log if not log or log.endswith("\n") else log + "\n")


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    """``sig`` to the worker's process group (the worker and what its tests started)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is gone
        os.killpg(proc.pid, sig)


def _stop(procs: Sequence[subprocess.Popen], grace_s: float) -> List[subprocess.Popen]:
    """SIGINT to every running worker's group (pytest then prints its lines), SIGKILL to the
    groups after ``grace_s``; returns the workers that were still running."""
    running = [p for p in procs if p.poll() is None]
    for p in running:
        _signal_group(p, signal.SIGINT)
    end = time.monotonic() + grace_s
    for p in running:
        with contextlib.suppress(subprocess.TimeoutExpired):  # SIGKILL below
            p.wait(timeout=max(0.0, end - time.monotonic()))
    for p in procs:  # processes a test left behind in a finished worker's group, too
        _signal_group(p, signal.SIGKILL)
        if p.poll() is None:
            p.wait()
    return running


def _markdown(summary: Dict[str, object], command: str) -> str:
    lines = [f"Command: `{command}`", "",
             "Counts: " + ", ".join(f"{k} {v}" for k, v in sorted(summary["counts"].items())),
             f"Wall: {summary['wall_s']:.1f} s over {summary['jobs']} workers", "",
             "| test | outcome |", "|---|---|"]
    lines += [f"| `{t}` | {o} |" for t, o in summary["tests"].items()]
    if summary.get("ptxas"):
        na = lambda v: "?" if v is None else str(v)  # noqa: E731 - a figure a log lacks
        lines += ["", "ptxas (MOSAIC_GPU_DUMP_PTXAS=1)", "",
                  "| entry | registers | spill stores | spill loads |", "|---|---:|---:|---:|"]
        lines += [f"| `{r['entry']}` | {na(r['registers'])} | {na(r['spill_stores'])} | "
                  f"{na(r['spill_loads'])} |" for r in summary["ptxas"]]
    return "\n".join(lines) + "\n"


def _on_sigterm(signum, frame):  # noqa: ARG001 - signal handler signature
    raise SystemExit(128 + signum)


_OWN_FILES = r"worker-\d+\.(log|jsonl)|workers\.log|summary\.(json|md)|collect\.log"


def main(argv: Sequence[str]) -> int:
    paths = list(argv[1:])
    problem = None
    if not paths:
        problem = "give the test paths (or node ids) to run"
    elif _JOBS.value < 1:
        problem = f"--jobs={_JOBS.value} must be at least 1"
    elif not _DEADLINE.value > 0:
        problem = f"--deadline_s={_DEADLINE.value} must be above 0"
    elif not _GRACE.value >= 0:
        problem = f"--grace_s={_GRACE.value} must be at least 0"
    if problem:
        print(f"gpu_tests.py: {problem}", file=sys.stderr)
        return 3
    out = _OUT.value or os.path.join(os.environ.get("OUT", "."), "gpu_tests")
    if os.path.isdir(out):  # an earlier run's files would pass for this run's
        for name in os.listdir(out):
            if re.fullmatch(_OWN_FILES, name):
                os.remove(os.path.join(out, name))
    start = time.monotonic()
    try:
        tests = collect(paths, _MARKER.value)
    except RuntimeError as e:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "collect.log"), "w", encoding="utf-8") as f:
            f.write(e.args[1])
        print(f"gpu_tests.py: {e.args[0]} (all of it: {os.path.join(out, 'collect.log')})",
              file=sys.stderr)
        return 3
    if not tests:
        print(f"gpu_tests.py: no test under {paths} matches -m {_MARKER.value!r}",
              file=sys.stderr)
        return 3
    elsewhere = sorted({t.split("::")[0] for t in tests
                        if not os.path.exists(t.split("::")[0])})
    if elsewhere:
        print(f"gpu_tests.py: pytest names {elsewhere[0]} relative to its rootdir, which is "
              f"not the current directory {os.getcwd()}: run from the rootdir "
              f"(the repository root)", file=sys.stderr)
        return 3
    os.makedirs(out, exist_ok=True)
    groups = split_round_robin(tests, _JOBS.value)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # for -p benchmarks...
    pythonpath = os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH")) if p)
    procs, files, interrupted, signalled = [], [], [], None
    # pytest's capture would hold a passing test's ptxas output back from the log.
    no_capture = ["-s"] if os.environ.get("MOSAIC_GPU_DUMP_PTXAS", "") not in ("", "0") else []
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        for k, group in enumerate(groups):
            f = open(os.path.join(out, f"worker-{k}.log"), "w")  # noqa: SIM115
            files.append(f)
            env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false", PYTHONPATH=pythonpath,
                       GPU_TESTS_RECORD=os.path.join(out, f"worker-{k}.jsonl"))
            procs.append(subprocess.Popen(  # its own process group: see _stop
                [sys.executable, "-m", "pytest", "-v", *no_capture, "-p", "no:cacheprovider",
                 "-p", "benchmarks.gpu_tests_plugin", "-m", _MARKER.value, *group],
                stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True))
        print(f"{len(tests)} tests over {len(procs)} workers; deadline {_DEADLINE.value:.0f} s",
              flush=True)
        deadline = start + _DEADLINE.value
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.5)
        interrupted = _stop(procs, _GRACE.value)
    except (KeyboardInterrupt, SystemExit) as e:  # Ctrl-C, SIGTERM: stop, then summarise
        signalled = 130 if isinstance(e, KeyboardInterrupt) else (e.code or 1)
        interrupted = _stop(procs, 0.0)
    finally:
        signal.signal(signal.SIGTERM, previous)
        for f in files:
            f.close()
    records = [read_records(os.path.join(out, f"worker-{k}.jsonl")) for k in range(len(procs))]
    stopped = [p in interrupted or signalled is not None for p in procs]
    logs = [read_log(os.path.join(out, f"worker-{k}.log")) for k in range(len(procs))]
    write_workers_log(os.path.join(out, "workers.log"), logs)
    summary = summarise(groups[:len(procs)], records, stopped)
    summary.update(wall_s=time.monotonic() - start, jobs=len(procs),
                   interrupted_workers=len(interrupted), worker_exit=[p.returncode for p in procs],
                   signalled=signalled, deadline_s=_DEADLINE.value, marker=_MARKER.value,
                   paths=paths, ptxas=ptxas_records(logs))
    command = " ".join([os.path.relpath(__file__)] + sys.argv[1:])
    with open(os.path.join(out, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(dict(summary, command=command), f, indent=1)
    with open(os.path.join(out, "summary.md"), "w", encoding="utf-8") as f:
        f.write(_markdown(summary, command))
    counts = summary["counts"]
    print("counts: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
          + f"; {summary['wall_s']:.1f} s; {len(interrupted)} workers stopped"
          + (f" by a signal (exit {signalled})" if signalled is not None else " at the deadline"))
    for t, o in summary["tests"].items():
        if o in ("failed", "error", "worker died"):
            print(f"{o.upper()}: {t}")
    return signalled if signalled is not None else exit_status(counts)


if __name__ == "__main__":
    _define_flags()
    from lattn_jax import flag_errors  # one-line flag errors (absl only)
    app.run(main, flags_parser=flag_errors.parse_flags)
