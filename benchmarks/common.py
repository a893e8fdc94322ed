"""Helpers shared by the benchmark binaries in ``benchmarks/`` (model level: ``bench_train.py``,
``bench_inference.py``; kernels: ``bench_kernels.py``, ``tune_kernels.py``,
``channelwise_forms.py``; trainer and data: ``train_throughput.py``, ``multi_gpu.py``,
``profile_train_step.py``, ``data_pipeline.py``; protocol in ../shared/BENCHMARKS.md §5).

* :func:`environment`: date (UTC), hardware, package versions and the command line of a run;
* :func:`compile_concurrently`: ahead-of-time compilation of many lowered functions in a thread
  pool (XLA releases the GIL while it compiles, so 15 train steps compile in about the time of
  the slowest few);
* :func:`guarded`: runs one measurement and turns an out-of-memory error into the status
  ``"out of memory"`` (other errors into ``"error: ..."``) so that a sweep goes on;
* :class:`TimeBudget` and :func:`scaled_estimate`: skip a configuration whose cost, extrapolated
  from the previous (shorter) one, would overrun a wall-clock budget;
* :func:`time_calls`: wall-clock seconds per call after warm-up calls, each synchronised with
  ``jax.block_until_ready``;
* :func:`compiled_memory` / :func:`device_memory`: the two memory figures the benchmarks report
  (the compiled executable's own buffer estimate, and the device allocator's high-water mark);
* :func:`write_report`: rewrites ``<out>.json`` and ``<out>.md`` atomically after every
  configuration, so a run that is killed keeps what it measured;
* :func:`define_profile_flags` and :func:`run_profile`: the flags and the timed-variant run
  the kernel profilers (``profile_fwd.py``, ``profile_grad.py``, ``profile_t0.py``,
  ``profile_wy_bwd.py``) share.
"""

import argparse
import concurrent.futures
import dataclasses
import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import subprocess
import sys
import time
import traceback
from typing import Any, Callable, Dict, Hashable, List, Mapping, Optional, Sequence, Tuple

import jax

from lattn_jax.eval import fetch

OK = "ok"
OUT_OF_MEMORY = "out of memory"
SKIPPED_BUDGET = "skipped (time budget)"

# Substrings of the errors that mean "the device ran out of memory": XLA's allocator
# (RESOURCE_EXHAUSTED), cuDNN/cuBLAS workspace allocations and CUDA itself.
_OOM_MARKERS = ("resource_exhausted", "out of memory", "failed to allocate",
                "cudnn_status_alloc_failed", "cublas_status_alloc_failed",
                "cudaerrormemoryallocation", "cuda_error_out_of_memory", "allocation failure")


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` reports a device (or host) memory allocation failure.

    Matches XLA's ``RESOURCE_EXHAUSTED`` status (``jax.errors.JaxRuntimeError``), Python's
    ``MemoryError``, and cuDNN/cuBLAS/CUDA allocation failures by their message.
    """
    if isinstance(exc, MemoryError):
        return True
    text = f"{type(exc).__name__}: {exc}".lower()
    return any(marker in text for marker in _OOM_MARKERS)


def describe_error(exc: BaseException) -> str:
    """The status recorded for a failed measurement: :data:`OUT_OF_MEMORY`, or
    ``"error: <type>: <first line of the message>"`` (at most 300 characters)."""
    if is_out_of_memory(exc):
        return OUT_OF_MEMORY
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"error: {type(exc).__name__}: {first}"[:300]


def guarded(fn: Callable[..., Any], *args, **kwargs) -> Tuple[Any, str]:
    """Runs ``fn(*args, **kwargs)``; returns ``(result, "ok")``, or ``(None, status)`` when it
    raised.

    The status is :data:`OUT_OF_MEMORY` for an allocation failure (:func:`is_out_of_memory`)
    and ``"error: ..."`` for any other exception (whose traceback is printed to stderr), so that
    a sweep records the failure and continues. ``KeyboardInterrupt`` and ``SystemExit`` are not
    caught.
    """
    try:
        return fn(*args, **kwargs), OK
    except Exception as exc:  # noqa: BLE001 - every failure becomes a recorded status
        status = describe_error(exc)
        if status != OUT_OF_MEMORY:
            traceback.print_exc()
        return None, status


@dataclasses.dataclass
class TimeBudget:
    """A wall-clock budget for a whole sweep, in seconds from ``start``.

    Attributes:
      budget_s: the budget; ``None`` means unlimited.
      start: ``clock()`` when the sweep began.
      clock: the time source (seconds), ``time.perf_counter`` by default.
    """

    budget_s: Optional[float]
    start: float = dataclasses.field(default_factory=time.perf_counter)
    clock: Callable[[], float] = time.perf_counter

    def elapsed(self) -> float:
        """Seconds since ``start``."""
        return self.clock() - self.start

    def remaining(self) -> float:
        """Seconds left (``inf`` without a budget; may be negative once overrun)."""
        return float("inf") if self.budget_s is None else self.budget_s - self.elapsed()

    def allows(self, estimate_s: Optional[float]) -> bool:
        """Whether a step estimated at ``estimate_s`` seconds fits in what is left (an unknown
        estimate, ``None``, always fits: the first configuration has nothing to go by)."""
        return estimate_s is None or estimate_s <= self.remaining()


def run_variants(variants: Sequence[Tuple[Dict[str, Any], Tuple[Any, ...]]],
                 measure: Callable[..., Any], *, budget: TimeBudget, jsonl: str,
                 table: Callable[[List[Dict[str, Any]]], str], deadline_exit: int
                 ) -> List[Dict[str, Any]]:
    """Measures kernel variants one after another under a deadline (the profilers' loop).

    For each ``(rec, args)`` in order: skipped (``rec["skipped"]``) when the slowest variant so
    far would not fit in ``budget``; else ``measure(rec, want, *args)`` under :func:`guarded`
    (it fills ``rec``; ``want`` is the result of the last variant that succeeded, e.g. a float64
    reference to reuse; an error goes to ``rec["error"]`` and the next variant runs), with its
    wall time in ``rec["wall_s"]``. Each record is appended to ``jsonl`` and printed as JSON.
    With a finite budget a watchdog thread fires when it runs out: it records the variant still
    compiling or running as skipped, prints ``table(records)`` (which may also write a file)
    and ends the process with status ``deadline_exit`` (``os._exit``: a compile cannot be
    interrupted otherwise). Without the watchdog firing, ``table(records)`` is printed at the
    end.

    Args:
      variants: ``(rec, args)`` pairs; ``rec`` a JSON-able dict that names the variant.
      measure: ``measure(rec, want, *args) -> result``.
      budget: the run's :class:`TimeBudget` (``budget_s`` ``None``: no deadline).
      jsonl: the file the records are appended to (created by the caller).
      table: renders records as the run's table.
      deadline_exit: the exit status when the watchdog ends the run.

    Returns:
      The records, in order.
    """
    import threading

    want = None
    slowest: Optional[float] = None
    records: List[Dict[str, Any]] = []
    lock = threading.Lock()
    running: Dict[str, Dict[str, Any]] = {}

    def append(rec):
        with open(jsonl, "a") as f:
            f.write(json.dumps(rec) + "\n")

    def watchdog():  # the deadline passed with a variant still compiling or running
        with lock:
            rec = running.get("rec")
            if rec is not None:
                rec = dict(rec, skipped=f"still running at --deadline_s={budget.budget_s:.0f}"
                                        f" (after {time.perf_counter() - rec.pop('_t0'):.0f} s)")
                append(rec)
            print(table(records + ([rec] if rec else [])), flush=True)
            os._exit(deadline_exit)

    timer = None
    if budget.budget_s is not None:
        timer = threading.Timer(max(budget.remaining(), 0.0), watchdog)
        timer.daemon = True
        timer.start()
    for rec, args in variants:
        if not budget.allows(slowest):
            rec["skipped"] = f"deadline ({budget.remaining():.0f} s left, last took {slowest:.0f})"
        else:
            t0 = time.perf_counter()
            with lock:
                running["rec"] = dict(rec, _t0=t0)
            result, status = guarded(measure, rec, want, *args)
            if status == OK:
                want = result
            else:  # the traceback went to stderr; the other variants still run
                rec["error"] = status
            wall = time.perf_counter() - t0
            rec["wall_s"] = wall
            slowest = wall if slowest is None else max(slowest, wall)
        with lock:
            running.pop("rec", None)
            records.append(rec)
            append(rec)
        print(json.dumps(rec), flush=True)
    with lock:
        if timer is not None:
            timer.cancel()
        print(table(records))
    return records


def run_profile(out: str, runs: Sequence[Tuple[Dict[str, Any], Tuple[Any, ...]]],
                measure: Callable[..., Any], *, render: Callable[[List[Dict[str, Any]]], str],
                deadline_s: Optional[float], start: float, deadline_exit: int
                ) -> List[Dict[str, Any]]:
    """The kernel profilers' timed-variant run (``profile_fwd.py``, ``profile_grad.py``,
    ``profile_t0.py``, ``profile_wy_bwd.py``): :func:`run_variants` writing ``<out>.jsonl``
    (made empty first, its directory created) and ``<out>.md`` (``render(records)``,
    rewritten whenever the table is printed, atomically: a temporary file beside it renamed
    over it, so a failed or interrupted write leaves the previous file whole), under a
    :class:`TimeBudget` of ``deadline_s`` seconds from ``start`` (``--deadline_s``, counted
    from the start of ``main``).

    Args:
      out: the output path prefix (``--out``).
      runs, measure, deadline_exit: :func:`run_variants`'s ``variants``, ``measure`` and
        ``deadline_exit``.
      render: the records as the run's table (markdown).
      deadline_s: the budget in seconds; ``None``: no deadline.
      start: ``time.perf_counter()`` when the budget starts.

    Returns:
      The records, in order.
    """
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    jsonl = out + ".jsonl"
    open(jsonl, "w").close()

    def table(records):
        text = render(records)
        fetch.write_atomic(out + ".md", text)  # a failed write keeps the previous table
        return text

    return run_variants(runs, measure, budget=TimeBudget(deadline_s, start=start), jsonl=jsonl,
                        table=table, deadline_exit=deadline_exit)


@dataclasses.dataclass(frozen=True)
class ProfileFlags:
    """The absl flag holders :func:`define_profile_flags` returns (``.value`` after parsing);
    ``dv`` is ``None`` for a profiler without ``--dv``."""

    batch: Any
    seq_len: Any
    heads: Any
    dk: Any
    dv: Any
    dtype: Any
    variants: Any
    iters: Any
    check_heads: Any
    deadline_s: Any
    interpret: Any
    static: Any
    out: Any

    def holders(self) -> Tuple[Any, ...]:
        """The holders in definition order, ``dv`` left out when the profiler has none:
        ``(batch, seq_len, heads, dk, [dv,] dtype, variants, iters, check_heads, deadline_s,
        interpret, static, out)``."""
        return tuple(getattr(self, f.name) for f in dataclasses.fields(self)
                     if f.name != "dv" or self.dv is not None)


_PROFILE_DEADLINE_HELP = (
    "Wall-clock budget of the whole run, from the start of main: variants that would not fit "
    "are skipped, and a variant still running at the deadline ends the run (status 3) after "
    "the table of the finished ones is written.")


def define_profile_flags(*, heads_help: str, dtype_help: str, variants_default: Sequence[str],
                         variants_help: str, check_heads_help: str, dv: bool = True,
                         iters_help: str = "Traced calls per variant (0: no trace).",
                         interpret_help: str = ("Mosaic GPU interpret mode (CPU checks of this "
                                                "binary; use a tiny shape)."),
                         static_help: str = ("Count instructions in the lowered modules (CPU; "
                                             "no kernel runs)."),
                         flag_values: Optional[Any] = None) -> ProfileFlags:
    """Defines the absl flags the kernel profilers share: ``--batch`` (8), ``--seq_len``
    (4096), ``--heads`` (16), ``--dk`` and ``--dv`` (64 or 128, default 128), ``--dtype``
    (bfloat16 or float16), ``--variants``, ``--iters`` (20), ``--check_heads`` (2),
    ``--deadline_s``, ``--interpret``, ``--static`` and ``--out`` (required).

    Call it only from a profiler run as a program (its ``_define_flags`` under ``__main__``):
    the benchmark modules define some of the same names, and the tests import several of them.
    The caller then declares them its own for ``--help``:
    ``flags.adopt_module_key_flags(common)``.

    Args:
      heads_help, dtype_help, variants_help, check_heads_help, iters_help, interpret_help,
        static_help: the flags' help texts where the profilers word them differently.
      variants_default: ``--variants``'s default list.
      dv: also define ``--dv`` (``profile_t0.py`` has no value dimension).
      flag_values: the registry (default absl's global ``FLAGS``).

    Returns:
      The flag holders (:class:`ProfileFlags`).
    """
    from absl import flags

    fv = flags.FLAGS if flag_values is None else flag_values
    return ProfileFlags(
        batch=flags.DEFINE_integer("batch", 8, "Batch rows B.", flag_values=fv),
        seq_len=flags.DEFINE_integer("seq_len", 4096, "Tokens per row T.", flag_values=fv),
        heads=flags.DEFINE_integer("heads", 16, heads_help, flag_values=fv),
        dk=flags.DEFINE_enum("dk", "128", ["64", "128"], "Key head dim K.", flag_values=fv),
        dv=(flags.DEFINE_enum("dv", "128", ["64", "128"], "Value head dim V.", flag_values=fv)
            if dv else None),
        dtype=flags.DEFINE_enum("dtype", "bfloat16", ["bfloat16", "float16"], dtype_help,
                                flag_values=fv),
        variants=flags.DEFINE_list("variants", list(variants_default), variants_help,
                                   flag_values=fv),
        iters=flags.DEFINE_integer("iters", 20, iters_help, flag_values=fv),
        check_heads=flags.DEFINE_integer("check_heads", 2, check_heads_help, flag_values=fv),
        deadline_s=flags.DEFINE_float("deadline_s", None, _PROFILE_DEADLINE_HELP,
                                      flag_values=fv),
        interpret=flags.DEFINE_bool("interpret", False, interpret_help, flag_values=fv),
        static=flags.DEFINE_bool("static", False, static_help, flag_values=fv),
        out=flags.DEFINE_string("out", None, "Output path prefix (.jsonl and .md).",
                                required=True, flag_values=fv))


def scaled_estimate(previous_s: Optional[float], previous_size: Optional[float], size: float,
                    exponent: float) -> Optional[float]:
    """``previous_s * (size / previous_size) ** exponent``: the cost of a configuration
    extrapolated from a smaller one, e.g. ``exponent=2`` for attention prefill (quadratic in the
    context), ``1`` for linear work. ``None`` when there is no previous measurement."""
    if previous_s is None or not previous_size:
        return None
    return float(previous_s) * (float(size) / float(previous_size)) ** exponent


def time_calls(fn: Callable[[], Any], *, warmup: int, iters: int) -> List[float]:
    """Wall-clock seconds of ``iters`` calls of ``fn()`` after ``warmup`` untimed calls.

    Every call is followed by ``jax.block_until_ready`` on its result, inside the timed interval
    (BENCHMARKS.md §5.4, wall time per call).

    Raises:
      ValueError: for ``iters < 1`` or ``warmup < 0``; and whatever ``fn`` raises.
    """
    if iters < 1 or warmup < 0:
        raise ValueError(f"need iters >= 1 and warmup >= 0, got {iters=} {warmup=}")
    for _ in range(warmup):
        jax.block_until_ready(fn())
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return times


def time_back_to_back(fn: Callable[[], Any], iters: int) -> float:
    """Wall-clock seconds per call of ``iters`` calls of ``fn()`` dispatched back to back with one
    ``jax.block_until_ready`` at the end (BENCHMARKS.md §5.4's secondary metric: launch gaps and
    glue count, a per-call host sync does not). No warm-up: the caller compiles first.

    Raises:
      ValueError: for ``iters < 1``; and whatever ``fn`` raises.
    """
    if iters < 1:
        raise ValueError(f"need iters >= 1, got {iters=}")
    t0 = time.perf_counter()
    out = None
    for _ in range(iters):
        out = fn()
    jax.block_until_ready(out)
    return (time.perf_counter() - t0) / iters


def device_kernel_events(events: Sequence[Mapping[str, Any]], with_args: bool = False
                         ) -> List[Tuple]:
    """``(name, start, duration)`` (µs) of every device kernel in Chrome-trace ``events``;
    ``(name, start, duration, args)`` with ``with_args`` (the event's ``args`` dict, ``{}`` if
    absent: on a GPU, jax.profiler's kernel events carry the launching HLO instruction there,
    e.g. ``hlo_op`` and ``hlo_module``).

    Keeps the complete events (``ph == "X"``) on processes whose name holds ``/device:GPU``
    (jax.profiler's device planes), and of those only the ``Stream #...`` threads where the trace
    names threads (the device plane also has lines such as the CUPTI overhead). Empty on a CPU
    backend or a trace without device activity.
    """
    names = {e["pid"]: e.get("args", {}).get("name", "") for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    gpu = {pid for pid, name in names.items() if "/device:GPU" in name}
    threads = {(e["pid"], e.get("tid")): e.get("args", {}).get("name", "") for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name" and e["pid"] in gpu}

    def on_stream(e):
        name = threads.get((e["pid"], e.get("tid")))
        return name is None or name.startswith("Stream")

    kernels = [e for e in events if e.get("ph") == "X" and e.get("pid") in gpu and on_stream(e)]
    if with_args:
        return [(e.get("name", ""), float(e.get("ts", 0)), float(e.get("dur", 0)),
                 dict(e.get("args") or {})) for e in kernels]
    return [(e.get("name", ""), float(e.get("ts", 0)), float(e.get("dur", 0))) for e in kernels]


def busy_time(intervals: Sequence[Tuple[float, float]]) -> float:
    """Length of the union of ``(start, duration)`` intervals: time with at least one kernel
    running (kernels on concurrent streams counted once)."""
    total, end = 0.0, float("-inf")
    for start, dur in sorted(intervals):
        stop = start + dur
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def trace_events(fn: Callable[[], Any], calls: int) -> List[Mapping[str, Any]]:
    """Chrome-trace events of ``calls`` synced calls of ``fn()`` under ``jax.profiler.trace``
    (in a temporary directory); empty if the profiler wrote no trace file."""
    import glob
    import gzip
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        with jax.profiler.trace(tmp):
            for _ in range(calls):
                jax.block_until_ready(fn())
        files = sorted(glob.glob(os.path.join(tmp, "**", "*.trace.json.gz"), recursive=True))
        if not files:
            return []
        with gzip.open(files[-1]) as fh:
            return json.load(fh).get("traceEvents", [])


def compile_concurrently(lowered: Mapping[Hashable, Any], *, max_workers: Optional[int] = None,
                         log: Callable[[str], None] = print
                         ) -> Dict[Hashable, Tuple[Any, str, float]]:
    """Compiles ``jax.stages.Lowered`` objects in a thread pool.

    Args:
      lowered: key -> ``jax.jit(f).lower(...)`` result (or a zero-argument callable returning
        one, lowered on the calling thread just before its compilation is submitted, so that
        tracing overlaps with the compilations already running).
      max_workers: threads; ``None`` is ``os.cpu_count()``.
      log: progress printer.

    Returns:
      key -> ``(compiled or None, status, seconds)``; ``status`` is ``"ok"``, "out of
      memory" or ``"error: ..."`` (:func:`guarded`); ``seconds`` is the compile wall time
      (lowering excluded). A compilation that ran out of memory in the pool (on a GPU, XLA's
      autotuner allocates operands on the device, and many concurrent compilations share it)
      is retried alone afterwards before it is reported as out of memory.
    """
    results: Dict[Hashable, Tuple[Any, str, float]] = {}
    workers = max(1, max_workers or os.cpu_count() or 1)
    lowered_ok = {}

    def compile_one(low):
        t0 = time.perf_counter()
        compiled, status = guarded(low.compile)
        return compiled, status, time.perf_counter() - t0

    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {}
        for key, item in lowered.items():
            low, status = guarded(item) if callable(item) else (item, OK)
            if low is None:  # the lowering itself failed
                results[key] = (None, status, 0.0)
                log(f"lowering {key} failed: {status}")
                continue
            lowered_ok[key] = low
            futures[pool.submit(compile_one, low)] = key
        for future in concurrent.futures.as_completed(futures):
            key = futures[future]
            results[key] = future.result()
            log(f"compiled {key}: {results[key][1]} in {results[key][2]:.1f} s")
    for key, (_, status, _) in list(results.items()):
        if status == OUT_OF_MEMORY and key in lowered_ok:
            results[key] = compile_one(lowered_ok[key])
            log(f"compiled {key} alone: {results[key][1]} in {results[key][2]:.1f} s")
    return results


def compiled_memory(compiled: Any) -> Optional[Dict[str, int]]:
    """The compiled executable's buffer sizes (``Compiled.memory_analysis()``), in bytes.

    Returns:
      ``dict(argument, output, alias, temp, generated_code, peak_estimate)`` where
      ``peak_estimate = argument + output + temp - alias`` is the device memory the executable
      needs while it runs (inputs, outputs not aliased to donated inputs, and XLA's scratch);
      ``None`` where the backend gives no analysis.
    """
    try:
        stats = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - not every backend implements it
        return None
    if stats is None:
        return None
    out = dict(argument=int(stats.argument_size_in_bytes),
               output=int(stats.output_size_in_bytes),
               alias=int(stats.alias_size_in_bytes),
               temp=int(stats.temp_size_in_bytes),
               generated_code=int(stats.generated_code_size_in_bytes))
    out["peak_estimate"] = out["argument"] + out["output"] + out["temp"] - out["alias"]
    return out


def device_memory() -> Optional[Dict[str, int]]:
    """The first local device's allocator statistics, in bytes: ``bytes_in_use``,
    ``peak_bytes_in_use`` (the process's high-water mark so far: it never goes down) and
    ``bytes_limit``; ``None`` on backends without statistics (CPU)."""
    stats = jax.local_devices()[0].memory_stats()
    if not stats:
        return None
    return {k: int(stats[k]) for k in ("bytes_in_use", "peak_bytes_in_use", "bytes_limit")
            if k in stats}


def _version(package: str) -> Optional[str]:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def package_versions(*packages: str) -> Dict[str, Optional[str]]:
    """``{"python": ..., package: installed version or None, ...}`` (distribution names)."""
    return {"python": platform.python_version(), **{p: _version(p) for p in packages}}


def nvidia_smi(query: str = "name,driver_version,memory.total,clocks.max.sm") -> Optional[str]:
    """``nvidia-smi --query-gpu=<query>`` as CSV without header (one line per GPU), or ``None``
    where there is no ``nvidia-smi`` or it fails. Does not initialise a JAX backend."""
    try:
        return subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                              capture_output=True, text=True, check=False,
                              timeout=30).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def device_summary() -> str:
    """The GPUs as ``N x <name, memory, driver>`` per distinct kind (``nvidia-smi``), else the
    host's CPU; for report headers. Does not initialise a JAX backend."""
    smi = nvidia_smi("name,memory.total,driver_version")
    if not smi:
        return f"{platform.processor() or platform.machine()} ({os.cpu_count()} CPUs)"
    lines = [line.strip() for line in smi.splitlines() if line.strip()]
    kinds = sorted(set(lines), key=lines.index)
    return "; ".join(f"{lines.count(k)} x {k}" for k in kinds)


def environment(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Date (UTC), hardware, versions and command line of this run (BENCHMARKS.md §5.1).

    Args:
      argv: the command line; ``None`` is ``sys.argv``.

    Returns:
      A JSON-serialisable dict: ``date_utc``, ``command``, ``python``, ``jax``, ``jaxlib``,
      ``flax``, ``optax``, ``backend``, ``device_kind``, ``device_count``, ``nvidia_smi``
      (name, driver, memory of each GPU, or ``None``), ``host`` (platform and CPU count) and the
      ``XLA_*`` environment variables.
    """
    argv = list(sys.argv if argv is None else argv)
    device = jax.local_devices()[0]
    smi = nvidia_smi()
    return dict(
        date_utc=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        command="python " + " ".join(shlex.quote(a) for a in argv),
        python=platform.python_version(),
        jax=jax.__version__, jaxlib=_version("jaxlib"), flax=_version("flax"),
        optax=_version("optax"),
        backend=jax.default_backend(), device_kind=device.device_kind,
        device_count=jax.device_count(), nvidia_smi=smi,
        host=f"{platform.platform()}, {os.cpu_count()} CPUs",
        xla_env={k: v for k, v in sorted(os.environ.items()) if k.startswith("XLA_")},
    )


def write_report(out: str, payload: Mapping[str, Any], markdown: str) -> None:
    """Writes ``<out>.json`` (``payload``) and ``<out>.md`` (``markdown``), each atomically
    (:func:`lattn_jax.eval.fetch.write_atomic`: a temporary file renamed over the old one,
    removed if the write fails), creating the directory if needed."""
    out = os.path.abspath(out)
    fetch.write_atomic(out + ".json", json.dumps(payload, indent=1, default=str) + "\n")
    fetch.write_atomic(out + ".md", markdown)


def gib(n: Optional[float]) -> str:
    """``n`` bytes as GiB with 2 decimals, or ``"–"`` for ``None``."""
    return "–" if n is None else f"{n / 2**30:.2f}"


def fmt(x: Optional[float], spec: str = ".3f") -> str:
    """``format(x, spec)``, or ``"–"`` for ``None``."""
    return "–" if x is None else format(x, spec)


class IntListError(argparse.ArgumentTypeError, ValueError):
    """A malformed :func:`int_list` item (argparse prints its message as is)."""


_INT_SUFFIXES = {"k": 1024, "m": 1024 * 1024}


def int_list(text: str) -> List[int]:
    """``"1,2,3"`` -> ``[1, 2, 3]``, ``"4K,1m"`` -> ``[4096, 1048576]`` (an argparse ``type``).

    Each comma-separated item is an integer, optionally with a case-insensitive suffix ``K``
    (x 1024) or ``M`` (x 1024 * 1024); empty items are ignored.

    Raises:
      IntListError: (a ``ValueError`` and ``argparse.ArgumentTypeError``) naming the first
        malformed item.
    """
    values = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        number, scale = item, 1
        if item[-1].lower() in _INT_SUFFIXES:
            number, scale = item[:-1], _INT_SUFFIXES[item[-1].lower()]
        try:
            values.append(int(number) * scale)
        except ValueError:
            raise IntListError(f"{item!r} is not an integer (optionally with a K = 1024 or "
                               f"M = 1048576 suffix, e.g. 4K,1M)") from None
    return values


def add_sweep_args(p: argparse.ArgumentParser, *, tiny_help: str, always_run: str,
                   always_run_help: str) -> None:
    """Adds the options both model-level sweeps share: ``--tiny``, ``--compile_workers``,
    ``--time_budget_s``, ``--always_run``, ``--seed`` and ``--no_plot``."""
    p.add_argument("--tiny", action="store_true", help=tiny_help)
    p.add_argument("--compile_workers", type=int, default=None,
                   help="compilation threads (default: CPU count)")
    p.add_argument("--time_budget_s", type=float, default=None,
                   help="skip runs extrapolated to overrun this wall-clock budget")
    p.add_argument("--always_run", default=always_run, help=always_run_help)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no_plot", action="store_true", help="do not draw <out>.png")


def finish_sweep_args(p: argparse.ArgumentParser, args: argparse.Namespace, *,
                      defaults: Mapping[str, Any], tiny_defaults: Mapping[str, Any],
                      names: str, allowed: Sequence[str], pair_example: str) -> None:
    """Completes parsed sweep options in place: unset options take ``defaults`` (or
    ``tiny_defaults`` with ``--tiny``); ``args.<names>`` (comma-separated) becomes a list checked
    against ``allowed``; ``--always_run`` becomes a set of ``(name, int)`` pairs.

    Raises:
      SystemExit: through ``p.error`` for an unknown name or a malformed ``--always_run``.
    """
    for key, value in (tiny_defaults if args.tiny else defaults).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    chosen = [x.strip() for x in getattr(args, names).split(",") if x.strip()]
    unknown = [x for x in chosen if x not in allowed]
    if unknown:
        p.error(f"unknown {names} {unknown}; choose from {', '.join(allowed)}")
    setattr(args, names, chosen)
    try:
        args.always_run = {(m, int(n)) for m, n in
                           (x.split(":") for x in args.always_run.split(",") if x.strip())}
    except ValueError:
        p.error(f"--always_run={args.always_run!r}: give name:size pairs, e.g. {pair_example}")
