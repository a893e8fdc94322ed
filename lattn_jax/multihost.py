"""A failure on one process of a multi-process run ends every process at once, with one line.

Without this, an error on one process of a ``jax.distributed`` run (a bad data file on one host,
a failed write, any exception) left the others blocked in the next step's collectives: the
failing process printed its error and then waited in ``jax.distributed.shutdown()``'s barrier
(run at exit) for processes that never reached it, and after the shutdown timeout (300 s by
default) every process aborted with a C++ check-failure dump (``Terminating process because the
JAX distributed service detected fatal errors``). Measured with two CPU processes of the tiny
trainer: both exited after 311 s with SIGABRT.

Here the failing process publishes a one-line description of its failure in the coordination
service's key-value store (``lattn_jax/failed/<process index>``) and exits at once with
``os._exit`` (no shutdown barrier: the others will not reach it). Every process runs a daemon
thread (:func:`watch_peers`) that polls that directory; when another process's failure
appears, it prints ``error: process i of n failed: <its line>; process j stops too`` to stderr
and exits with status 1. A process blocked in a collective releases the GIL, so the thread runs.
Nothing is saved on the way out: after a failure the processes' states need not agree on a step,
and the newest checkpoint is the last consistent one.

A process killed without running Python (SIGKILL, the kernel's out-of-memory killer) publishes
nothing; JAX's heartbeat then notices it (``heartbeat_timeout_seconds``, 100 s by default) and
ends the others as before.

Single-process runs never start the thread and re-raise every exception unchanged.
"""

import functools
import os
import sys
import threading
import time
import traceback
from typing import Callable, Optional

import jax
from absl import logging
from jax._src import distributed as _distributed

FAILED_DIR = "lattn_jax/failed/"
# Seconds between two polls of the failure directory (one small RPC to the coordinator each).
POLL_S = 1.0
# Process 0 hosts the coordination service: when it fails it waits this long before exiting,
# so that the others read its line (and exit with it) before the service disappears.
COORDINATOR_LINGER_S = 3 * POLL_S

_watcher: Optional[threading.Thread] = None
_stop = threading.Event()


def _client():
    """The ``jax.distributed`` client, or ``None`` in a single-process run (read without
    initialising a backend: a failure before ``jax.distributed.initialize()`` must not start
    one)."""
    client = _distributed.global_state.client
    if client is None or jax.process_count() <= 1:
        return None
    return client


def exit_now(code: int) -> None:
    """Ends the process with status ``code`` at once: flushes stdout, stderr and absl's log,
    then ``os._exit`` (no interpreter shutdown: it waits for ``jax.distributed``'s barrier in a
    multi-process run, and it segfaulted with XLA work in flight after a Ctrl-C in
    ``experiments/train.py``'s start-up and ``experiments/evaluate.py``'s scoring)."""
    sys.stdout.flush()
    sys.stderr.flush()
    logging.flush()
    os._exit(code)


def _exit_now(code: int) -> None:  # the failure path's exit (tests replace it)
    exit_now(code)


def peer_failures(client) -> dict:
    """Failures published so far: ``{process index: line}`` (this process's included).

    Args:
      client: the ``jax.distributed`` client (``DistributedRuntimeClient``).
    """
    out = {}
    for key, value in client.key_value_dir_get(FAILED_DIR):
        try:
            out[int(key.rsplit("/", 1)[-1])] = value
        except ValueError:
            continue
    return out


def _watch(client, me: int, count: int, poll_s: float) -> None:
    while not _stop.wait(poll_s):
        try:
            failures = peer_failures(client)
        except Exception:  # the service is gone (shutting down): nothing more to watch
            return
        others = sorted(i for i in failures if i != me)
        if others:
            i = others[0]
            print(f"error: process {i} of {count} failed: {failures[i]}; process {me} stops "
                  "too (nothing saved since the last checkpoint)", file=sys.stderr)
            _exit_now(1)


def watch_peers(poll_s: float = POLL_S) -> bool:
    """Starts the daemon thread that ends this process when another one publishes a failure.

    Call it once after ``jax.distributed.initialize()``; a no-op in a single-process run or when
    already started.

    Args:
      poll_s: seconds between polls of the coordination service's failure directory.

    Returns:
      Whether a watcher runs (``False`` in a single-process run).
    """
    global _watcher
    client = _client()
    if client is None:
        return False
    if _watcher is None or not _watcher.is_alive():
        _stop.clear()
        _watcher = threading.Thread(
            target=_watch, args=(client, jax.process_index(), jax.process_count(), poll_s),
            name="lattn_jax-peer-failures", daemon=True)
        _watcher.start()
    return True


def stop_watching() -> None:
    """Stops the watcher thread (a clean end: before ``jax.distributed.shutdown()``)."""
    _stop.set()


class StopExit(SystemExit):
    """``sys.exit(status)`` with a non-zero status that is no failure: every process of the run
    stops at the same point (``experiments/train.py`` after a preemption every process agreed
    on and saved: 143, 129 or 130). The status is each process's own: the process that
    received SIGHUP exits 129 while its peers, told by the shared preemption notice, exit 143.
    It is not published to the other processes
    (:func:`publish_failure_and_exit`), which would otherwise exit with status 1 for it; the
    process ends as after a clean return (the shutdown barrier included), with this status."""


def _failure(e: BaseException):
    """``(line, status)`` for an exception that ends the process with a failure, else ``None``."""
    if isinstance(e, StopExit):
        return None
    if isinstance(e, SystemExit):
        if e.code is None or e.code == 0:
            return None
        if isinstance(e.code, int):
            return f"exit status {e.code}", e.code
        text = str(e.code).strip()
        return (text[len("error: "):] if text.startswith("error: ") else text), 1
    if isinstance(e, KeyboardInterrupt):
        return "interrupted (Ctrl-C)", 130
    lines = (str(e).strip() or "").splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}".rstrip(": "), 1


def publish_failure_and_exit(e: BaseException) -> None:
    """In a multi-process run, ends this process for the failure ``e`` at once: prints it as
    Python would (the message of ``sys.exit("...")``, or the traceback), publishes its first
    line for the other processes (:func:`watch_peers`) and exits with its status through
    ``os._exit`` (skipping ``jax.distributed.shutdown()``'s barrier, which the others will not
    reach). When another process published a failure first, this one is its consequence (a
    collective that lost its peer): it prints that process's line with its own in brackets, no
    traceback, and exits with status 1. Returns (does nothing) for a clean exit or in a
    single-process run.

    Args:
      e: the exception that is ending the process.
    """
    client = _client()
    failure = _failure(e)
    if client is None or failure is None:
        return
    line, status = failure
    _stop.set()
    me = jax.process_index()
    try:
        earlier = {i: text for i, text in peer_failures(client).items() if i != me}
    except Exception:  # the service is gone
        earlier = {}
    if earlier:  # this failure followed another process's (e.g. its collectives lost a peer)
        i = min(earlier)
        print(f"error: process {i} of {jax.process_count()} failed: {earlier[i]}; process {me} "
              f"stops too ({line})", file=sys.stderr)
        _exit_now(1)
    if isinstance(e, SystemExit):
        if not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    elif not isinstance(e, KeyboardInterrupt):
        traceback.print_exception(e)
    try:
        client.key_value_set(f"{FAILED_DIR}{me}", line)
    except Exception as publish_error:  # the service is gone; the heartbeat will tell the rest
        print(f"(could not tell the other processes: {publish_error})", file=sys.stderr)
    else:
        if me == 0:
            time.sleep(COORDINATOR_LINGER_S)
    _exit_now(status)


def fail_fast(main: Callable) -> Callable:
    """Wraps an absl ``main`` so that a failure in a multi-process run ends every process at
    once (:func:`publish_failure_and_exit`); a clean return or a :class:`StopExit`, and every
    outcome of a single-process run, are unchanged."""

    @functools.wraps(main)
    def wrapped(argv):
        try:
            result = main(argv)
        except StopExit:
            stop_watching()
            raise
        except BaseException as e:
            publish_failure_and_exit(e)
            raise
        stop_watching()
        return result

    return wrapped
