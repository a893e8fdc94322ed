"""Runs one absl binary on several command lines from one Python process, each in a fork.

A test that checks a binary's one-line errors launched ``python <binary> <flags>`` once per
bad command line, and each launch paid the interpreter's start and the imports of jax,
ml_collections and the library (about 2.5 s of CPU on the 2-core CI machine) to print one line.
:class:`Runner` (and :func:`run_many`) starts one Python process, imports the modules the
binary imports at its top level once (for ``experiments/train.py`` also, once a child has
imported them, the modules a training run imports later: tensorboardX, which imports torch
where installed, and matplotlib's Agg backend), then for each command line forks a child that
executes the binary's file as ``__main__`` (``runpy.run_path``) with that ``sys.argv``: its
own process, exit status, stdout and stderr, as a separate launch gives. Only the imports are
shared: nothing the binary does happens before the fork. Not for tests whose point is the
process itself (signals to a launched process, its start-up environment): those keep
``subprocess``.

The child ends as the interpreter would: ``SystemExit(None)`` -> 0, an int -> that status, any
other value -> printed to stderr and status 1; an uncaught exception -> its traceback, status 1.
A child still running after ``timeout`` seconds (default :data:`TIMEOUT_S`, as the tests'
``subprocess.run(..., timeout=)`` had) is killed and :meth:`Runner.run` raises
``subprocess.TimeoutExpired``, so a hung binary fails its test instead of holding the suite.
"""

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import List, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT_S = 600.0

# The driver: argv[1] a directory for the children's stdout/stderr files. Reads one JSON
# [binary, [arguments], timeout_s] a line on stdin; answers each with the exit status on stdout
# ("timeout" for a child killed after timeout_s).
_DRIVER = r"""
import ast, contextlib, importlib, json, os, runpy, signal, sys, time, traceback
outdir = sys.argv[1]
sys.path.insert(0, os.getcwd())
imported = set()
# Modules a binary imports later than at its top, by the binary's path in the repository: a
# training run's MetricsWriter imports tensorboardX (which imports torch where it is installed:
# about 1.7 s of each such child) and its loss plot matplotlib's Agg backend. Once a child has
# imported them, the driver imports them too, for the children after it (a child that stops
# before, e.g. at a bad flag, costs the driver nothing).
LAZY = {"experiments/train.py": ("tensorboardX", "matplotlib.backends.backend_agg",
                                 "matplotlib.figure")}


def lazy_modules(binary):
    return LAZY.get(os.path.relpath(os.path.abspath(binary)), ())


def import_top_level(binary):
    # The binary's top-level imports, once per binary.
    if binary in imported:
        return
    imported.add(binary)
    with open(binary, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, ast.Import):
            for a in node.names:
                importlib.import_module(a.name)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            importlib.import_module(node.module)
            for a in node.names:  # a submodule (from lattn_jax import config), or a name
                with contextlib.suppress(ImportError):  # (a name: its module is imported)
                    importlib.import_module(f"{node.module}.{a.name}")


answers = os.fdopen(os.dup(1), "w")
for i, line in enumerate(sys.stdin):
    binary, argv, timeout = json.loads(line)
    import_top_level(binary)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            for fd, name in ((1, "out"), (2, "err")):
                target = os.open(os.path.join(outdir, f"{i}.{name}"),
                                 os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                os.dup2(target, fd)
                os.close(target)
            sys.stdin.close()
            sys.argv = [binary] + list(argv)
            try:
                runpy.run_path(binary, run_name="__main__")
                status = 0
            except SystemExit as e:
                if e.code is None:
                    status = 0
                elif isinstance(e.code, int):
                    status = e.code
                else:
                    print(e.code, file=sys.stderr)
                    status = 1
            except BaseException:
                traceback.print_exc()
                status = 1
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
                loaded = [m for m in lazy_modules(binary) if m in sys.modules]
                if loaded:  # for the driver (LAZY)
                    with open(os.path.join(outdir, f"{i}.lazy"), "w") as f:
                        json.dump(loaded, f)
            finally:
                os._exit(status)
    deadline, pause = time.monotonic() + timeout, 0.001
    while True:
        done, wait_status = os.waitpid(pid, os.WNOHANG)
        if done:
            answer = os.waitstatus_to_exitcode(wait_status)
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            answer = "timeout"
            break
        time.sleep(pause)
        pause = min(2 * pause, 0.05)
    lazy = os.path.join(outdir, f"{i}.lazy")
    if os.path.exists(lazy):
        with open(lazy) as f:
            for name in json.load(f):
                importlib.import_module(name)
        os.remove(lazy)
    answers.write(json.dumps(answer) + "\n")
    answers.flush()
"""


class Runner:
    """One driver process; :meth:`run` is ``subprocess.run([sys.executable, binary, *argv],
    cwd=ROOT, capture_output=True, text=True)`` in a fork of it. Use as a context manager (or
    :meth:`close`)."""

    def __init__(self, tmpdir: str, env=None):
        self.tmpdir, self.count = tmpdir, 0
        self.driver_err = os.path.join(tmpdir, "driver.err")
        with open(self.driver_err, "w") as err:
            self.driver = subprocess.Popen(
                [sys.executable, "-c", _DRIVER, tmpdir], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT, env=env)

    def run(self, binary: str, *argv: str,
            timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
        """Runs ``binary`` (relative to the repository root) with ``argv``.

        Raises:
          subprocess.TimeoutExpired: the run took longer than ``timeout`` seconds (killed).
          RuntimeError: the driver itself ended (its stderr's end in the message).
        """
        self.driver.stdin.write(json.dumps([binary, list(argv), timeout]) + "\n")
        self.driver.stdin.flush()
        answer = self.driver.stdout.readline()
        if not answer:
            self.driver.kill()
            with open(self.driver_err, encoding="utf-8") as f:
                raise RuntimeError(f"binary_runs driver ended at {binary}: {f.read()[-3000:]}")
        i, self.count = self.count, self.count + 1
        outputs = []
        for name in ("out", "err"):
            path = os.path.join(self.tmpdir, f"{i}.{name}")
            with open(path, encoding="utf-8") as f:
                outputs.append(f.read())
            os.remove(path)
        status = json.loads(answer)
        if status == "timeout":
            raise subprocess.TimeoutExpired([sys.executable, binary, *argv], timeout, *outputs)
        return subprocess.CompletedProcess([sys.executable, binary, *argv], status, *outputs)

    def close(self):
        """Ends the driver (idempotent)."""
        if self.driver.poll() is None:
            self.driver.stdin.close()
            self.driver.wait(timeout=60)
        self.driver.stdout.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def fast_compile_env(**extra: str) -> dict:
    """``os.environ`` plus ``JAX_DISABLE_MOST_OPTIMIZATIONS=true`` and ``extra``: the
    environment of a binary run by a test on CPU, compiling without most XLA optimizations as
    the test process does (``tests/conftest.py``; compile time dominates tiny runs)."""
    return dict(os.environ, JAX_DISABLE_MOST_OPTIMIZATIONS="true", **extra)


def run_many(binary: str, argvs: Sequence[Sequence[str]], tmpdir: str,
             env=None) -> List[subprocess.CompletedProcess]:
    """:meth:`Runner.run` of each argument list in ``argvs``, one after another."""
    with Runner(tmpdir, env=env) as runner:
        return [runner.run(binary, *argv) for argv in argvs]


_SHARED = {}  # environment -> this process's Runner for run() with it, most recent last
_MAX_SHARED = 2  # idle drivers kept (each holds jax and the library: a few hundred MB)


def run(cmd: Sequence[str], env=None, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)`` of a command
    line ``[sys.executable, binary, *argv]``, by a :class:`Runner` shared by the calls in this
    process with the same ``env`` (``None``: ``os.environ`` as at the first such call). The
    :data:`_MAX_SHARED` most recently used runners are kept; the others end, and all at exit."""
    if cmd[0] != sys.executable:
        raise ValueError(f"not a command line of this Python: {cmd[:2]}")
    # (pytest sets PYTEST_CURRENT_TEST to each test's name: not a different environment)
    key = None if env is None else tuple(sorted(
        (k, v) for k, v in env.items() if k != "PYTEST_CURRENT_TEST"))
    runner = _SHARED.pop(key, None)
    if runner is None:
        while len(_SHARED) >= _MAX_SHARED:
            _SHARED.pop(next(iter(_SHARED))).close()
        tmpdir = tempfile.mkdtemp(prefix="binary-runs-")
        runner = Runner(tmpdir, env=env)
        atexit.register(shutil.rmtree, tmpdir, ignore_errors=True)
        atexit.register(runner.close)
    _SHARED[key] = runner  # most recent last
    return runner.run(cmd[1], *cmd[2:], timeout=timeout)
