r"""Launch-parameter sweep for the Pallas GPU kernels of the delta-rule family (Triton lowering).

``--op=gdn`` (default) tunes ``pallas_kernels/gated_delta_rule/kernel_gpu.TUNING`` (Gated
DeltaNet, paper arXiv 2607.07953, Sec. 3.2; the same kernels serve DeltaNet, simple GLA,
Lightning and linear attention): ``split_forward`` (the forward as one sequential kernel
``forward``, or as the sequential ``forward_state`` plus the parallel ``forward_output``), the
``segments`` of sequence parallelism (``None``: ``kernel_gpu.num_segments`` decides), the
value-block width ``block_v`` of the sequential kernels (``forward`` or ``forward_state``, and
``backward_state``; ``None`` means ``kernel_gpu.auto_block_v``), the key-block width ``block_k`` of
``backward_chunk`` (``None`` means the whole K), and ``(num_warps, num_stages)`` of each kernel
``prepare``, ``forward``, ``forward_state``, ``forward_output``, ``backward_state`` and
``backward_chunk``. The launch parameters of the kernels the configuration does not run
(``forward`` under split_forward, ``forward_state``/``forward_output`` without it) do not
change the program: such candidates count as the same configuration and are not re-measured.

``--op=kda`` and ``--op=gdn2`` tune the per-channel-decay kernels of
``pallas_kernels/common/channelwise_gpu.TUNING`` (one module serves Kimi Delta Attention and Gated
DeltaNet-2, arXiv 2607.07953, Eqs. 18-24), timed through the op named: ``intra_tf32`` (the
decay-scaled intra-chunk products of bf16 inputs in TF32, else in bf16),
``intra_token_heads`` (an int >= 1: the cap on heads per program of the forward ``intra``
kernel, which runs one program per token and group of heads, the largest power of two dividing
H and at most this cap, as that module's ``intra_heads`` resolves it), ``block_v`` of ``wu``,
``forward`` and ``backward_state`` and ``block_k`` of ``gamma``, ``wu`` and ``backward_chunk``
(``None`` means ``min(dim, 64)``, as that module's ``block_widths`` resolves them),
``prepare_k`` (the key-block width of the ``prepare`` kernel's products, on 16 x 16
sub-blocks; ``None`` means block_k), and ``(num_warps, num_stages)`` of ``gamma``,
``intra_token`` (the launch of the ``intra`` kernel, which also writes qg, kg and krg),
``prepare``, ``wu`` (the kernel forming W, U and e_all from prepare's A and intra's krg),
``forward``, ``grad_blocks``, ``backward_state`` and
``backward_chunk`` (a pair, or a dict of pairs per key head dim, as for gdn). Every
configuration runs all eight kernels (gamma, intra, prepare, wu and forward in the forward, then
grad_blocks, backward_state and backward_chunk); caps that resolve to the same heads per program
at every shape are one configuration and are not re-measured, and so is a ``None`` prepare_k
and the block_k it resolves to. The gdn-only knobs (``split_forward``, ``segments``,
``forward_state``, ``forward_output``) are refused there.

Method: one coordinate-descent pass. Start from the module's current TUNING (or ``--start``);
for each knob in ``--knobs`` order (default for gdn: split_forward in {False, True}, segments
in {None, 1, 2, 4, 8, 16, 32}, block_v in {32, 64, 128}, block_k in {64, 128}, then num_warps
in {4, 8} x num_stages in {1, 2, 3} for prepare, forward, forward_state, forward_output,
backward_state, backward_chunk; for kda/gdn2: intra_tf32 in {True, False}, intra_token_heads
in {1, 2, 4, 8, 16}, block_v and block_k in {32, 64, 128}, prepare_k in {16, 32, 64}, then the
same launches for gamma, wu, forward, grad_blocks, backward_state, backward_chunk, and
num_warps in {1, 2, 4} x num_stages in {1, 2, 3} for intra_token and prepare)
time every value with the other knobs at their best so far and keep the fastest.
The objective is the sum over shapes of the fwd+bwd time (the forward-only knobs also change
fwd+bwd). A configuration that fails to compile or run (Triton out of shared memory, a block
wider than the head dim, ...) is recorded with its error and skipped.

TUNING is read when the op is traced, and JAX caches traced jaxprs of the op's inner ``jax.jit``
(a fresh outer ``jax.jit`` does not re-trace it), so every configuration is traced after
``jax.clear_caches()`` and its jaxpr is checked: each ``pallas_call`` must carry the
configuration's ``(num_warps, num_stages)`` and grid (in ``--interpret`` mode, where launch
parameters are not staged, on an untimed ``interpret=False`` twin). The programs of one knob's
candidates are compiled concurrently (``benchmarks.common.compile_concurrently``); a forward
program shared by several configurations (the backward knobs do not change it) is measured once.
The original TUNING is restored (and the caches cleared) on exit.

Inputs (per shape, one seed): bf16 q, k, v, unit-norm k, scale K^-0.5 and fp32 gates: GDN
(``gated_delta_rule``) g [B, T, H] = logsigmoid(N(0, 1)), beta = sigmoid(N(0, 1)); KDA
(``pallas_kernels.kda.kda``) the per-channel g [B, T, H, K] = logsigmoid(N(0, 1)) and beta
[B, T, H] = sigmoid(N(0, 1)); GDN-2 (``pallas_kernels.gdn2.gdn2``) the per-channel g, the erase
gate b [B, T, H, K] and the write gate w [B, T, H, V] = sigmoid(N(0, 1)). ``fwd`` is the plain
call (o only), ``fwdbwd`` the forward plus the VJP of a fixed bf16 cotangent w.r.t. every
input. Shapes: S1 = (B=8, T=4096, H=16, D=128), S2 = (B=1, T=32768, H=16, D=128), or
``B,T,H,D`` tuples. Times are wall clock in ms per call: the median of ``--iters`` jitted calls
after ``--warmup`` calls, each followed by ``block_until_ready``. At the end the baseline and
the best configuration are timed again, alternating (``--confirm_rounds``), and the best
configuration is checked against the op's fp32 ``lax.scan`` reference
(``implementation="reference"``) at ``--check_shape`` (relative RMS error: o < 5e-3, every
gradient < 2e-2).

``--time_budget_s`` bounds the whole run from the parsing of the flags (compiles included; the
Python start-up and ``import jax`` come before it): the baseline is always measured, then a
candidate is started only while its estimated cost (serial and compile seconds per program so
far, compiles ``--compile_workers`` at a time) plus a reserve for the end (the confirmation's
calls at the measured medians, and the correctness check: ``--check_reserve_s`` or its
estimated compiles, whichever is larger) fits in what is left; the rest is recorded as
``skipped (time budget)``.
``<out>.json`` and ``<out>.md`` are rewritten after every knob, so a killed run keeps what it
measured. To finish a cut-short sweep, run again with ``--start`` set to the best so far and
``--knobs`` set to the knobs not reached.

Usage (on the GPU machine)::

    python benchmarks/tune_kernels.py --shapes=S1,S2 --time_budget_s=150 \
        --out=benchmarks/results/tune-gdn-h200-<date>

Only the split forward and its launch parameters (the rest swept on 2026-11-29)::

    python benchmarks/tune_kernels.py --shapes=S1,S2 --time_budget_s=300 \
        --knobs=split_forward,block_v,forward_state,forward_output \
        --out=benchmarks/results/tune-gdn-split-h200-<date>

KDA (the per-channel-decay kernels of ``pallas_kernels/common/channelwise_gpu.py``; ``--op=gdn2``
for GDN-2)::

    python benchmarks/tune_kernels.py --op=kda --shapes=S1,S2 --time_budget_s=300 \
        --out=benchmarks/results/tune-kda-h200-<date>

Only the prepare kernel (its launch and key-block width) and the wu kernel's launch::

    python benchmarks/tune_kernels.py --op=kda --shapes=S1,S2 --time_budget_s=300 \
        --knobs=prepare,prepare_k,wu \
        --out=benchmarks/results/tune-kda-prepare-h200-<date>

CPU smoke run (Pallas interpret mode; the launch parameters are ignored there)::

    python benchmarks/tune_kernels.py --interpret --shapes=1,128,2,64 --iters=1 --warmup=0 \
        --knobs=block_v=32/64,forward=4x2/8x1 --check_shape=1,64,1,64 --out=/tmp/tune

writes ``<out>.json`` (environment, settings, every configuration tried with its knobs, per-shape
fwd and fwd+bwd ms and status; baseline, best, descent, confirmation, correctness check) and
``<out>.md`` (the tables, the best TUNING as a Python literal, the speed-up over the baseline;
in ``--interpret`` mode a note replaces the last two, as those timings say nothing about GPU
speed). Without ``--interpret`` a GPU backend is required (exit status 2 otherwise). When the
baseline configuration fails, the report is still written and the exit status is 1.
"""

import dataclasses
import json
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.extend.core  # noqa: E402,F401 - jax.extend.core.Jaxpr/ClosedJaxpr below
import jax.numpy as jnp  # noqa: E402

from benchmarks import common as bench  # noqa: E402
from pallas_kernels import gated_delta_rule as gdr  # noqa: E402
from pallas_kernels import gdn2 as gdn2_ops  # noqa: E402
from pallas_kernels import kda as kda_ops  # noqa: E402
from pallas_kernels.common import channelwise_gpu  # noqa: E402
from pallas_kernels.gated_delta_rule import kernel_gpu  # noqa: E402
from pallas_kernels.gdn2 import kernel_gpu as gdn2_kernel_gpu  # noqa: E402
from pallas_kernels.kda import kernel_gpu as kda_kernel_gpu  # noqa: E402

SHAPES = {"S1": (8, 4096, 16, 128), "S2": (1, 32768, 16, 128)}
BOOL_KNOBS = ("split_forward",)
SEGMENT_KNOBS = ("segments",)
BLOCK_KNOBS = ("block_v", "block_k")
LAUNCH_KNOBS = ("prepare", "forward", "forward_state", "forward_output", "backward_state",
                "backward_chunk")
KNOBS = BOOL_KNOBS + SEGMENT_KNOBS + BLOCK_KNOBS + LAUNCH_KNOBS
# The knobs that change the forward program.
FWD_KNOBS = ("split_forward", "segments", "block_v", "prepare", "forward", "forward_state",
             "forward_output")
SPLIT_KERNELS = ("forward_state", "forward_output")  # run instead of forward by split_forward
_LAUNCHES = tuple((w, s) for w in (4, 8) for s in (1, 2, 3))
DEFAULT_VALUES = {"split_forward": (False, True), "segments": (None, 1, 2, 4, 8, 16, 32),
                  "block_v": (32, 64, 128), "block_k": (64, 128),
                  **{k: _LAUNCHES for k in LAUNCH_KNOBS}}
KERNEL_NAMES = {k: "gdn_" + k for k in LAUNCH_KNOBS}  # pallas_call names in kernel_gpu.py
BACKWARD_KERNELS = ("backward_state", "backward_chunk")
PASSES = ("fwd", "fwdbwd")
ERROR_LIMITS = {"o": 5e-3}
GRAD_LIMIT = 2e-2
CHUNK = kernel_gpu.CHUNK
# Replaces the best configuration's speed-up and TUNING literal in an --interpret report.
INTERPRET_NOTE = ("Interpret mode (--interpret): the launch parameters are ignored and the timings "
                  "say nothing about GPU speed; this run only checks the sweep machinery.")

# The per-channel-decay kernels (pallas_kernels/common/channelwise_gpu.py), serving KDA and GDN-2.
CW_BOOL_KNOBS = ("intra_tf32",)
CW_INT_KNOBS = ("intra_token_heads",)  # ints >= 1
# prepare_k: the key-block width of the prepare kernel's products (16 x 16 sub-blocks); a power
# of two >= 16, or None (block_k).
CW_BLOCK_KNOBS = ("prepare_k",)
# The kernels (pallas_call names less "channelwise_") of the family, and those a forward-only
# program runs (every configuration runs all of them). The intra kernel runs with intra_token's
# launch and intra_token_heads resolved at the shape's head count (channelwise_gpu.intra_heads).
CW_KERNELS = ("gamma", "intra", "prepare", "wu", "forward", "grad_blocks", "backward_state",
              "backward_chunk")
CW_FWD_KERNELS = ("gamma", "intra", "prepare", "wu", "forward")
CW_LAUNCH_KNOBS = ("gamma", "intra_token", "prepare", "wu", "forward", "grad_blocks",
                   "backward_state", "backward_chunk")
CW_KNOBS = CW_BOOL_KNOBS + CW_INT_KNOBS + BLOCK_KNOBS + CW_BLOCK_KNOBS + CW_LAUNCH_KNOBS
# channelwise_gpu.TUNING keys that are not Triton launch or shape knobs: which kernels run the
# state passes and the gradients through Mq and Mk (the Mosaic GPU kernels, timed against
# Triton by bench_kernels.py --channelwise_state_pass / --channelwise_grad_pass), the state
# passes' SMEM aliasing and sequence pieces, K1's slab width, and the chunk-local forward's
# kernel (chunk_local, MOSAIC_GPU.md Sec. 62). This script tunes the Triton
# kernels under the module's setting of them.
CW_NOT_KNOBS = ("state_pass", "mosaic_alias_staging", "mosaic_pieces", "grad_pass",
                "mosaic_grad_slab", "chunk_local")
# block_v and block_k also change the forward (wu loops over value and key blocks, gamma over key
# blocks), prepare_k and intra_tf32 prepare's products. grad_blocks, backward_state and
# backward_chunk change the backward only.
CW_FWD_KNOBS = ("intra_tf32", "intra_token_heads", "block_v", "block_k", "prepare_k", "gamma",
                "intra_token", "prepare", "wu", "forward")
CW_DEFAULT_VALUES = {"intra_tf32": (True, False),
                     "intra_token_heads": (1, 2, 4, 8, 16),
                     "block_v": (32, 64, 128),
                     "block_k": (32, 64, 128),
                     "prepare_k": (16, 32, 64),
                     **{k: _LAUNCHES for k in CW_LAUNCH_KNOBS},
                     # On the H200 prepare and intra run best at 1 warp, 3 stages (FLA's fused
                     # inter + solve and token-parallel intra kernels autotune 1-8 warps).
                     "prepare": tuple((w, s) for w in (1, 2, 4) for s in (1, 2, 3)),
                     "intra_token": tuple((w, s) for w in (1, 2, 4) for s in (1, 2, 3))}
CW_CHUNK = channelwise_gpu.CHUNK


@dataclasses.dataclass(frozen=True)
class Family:
    """What one ``--op`` tunes: a kernel module's TUNING, its knobs and its kernels' names."""

    module: Any  # the kernel module whose TUNING the sweep rewrites
    path: str  # that module's file, named in the report
    title: str  # the kernels, in the report's title
    inputs: str  # the op and its inputs, in the report
    prefix: str  # of the pallas_call names
    knobs: Tuple[str, ...]  # in the default sweep order
    launch_knobs: Tuple[str, ...]
    fwd_knobs: Tuple[str, ...]  # the knobs that change the forward program
    default_values: Mapping[str, Tuple[Any, ...]]
    grads: Tuple[str, ...]  # names of the VJP's outputs, in input order


_CW_PATH = "pallas_kernels/common/channelwise_gpu.py"
_CW_INPUTS = "bf16 q/k/v, unit-norm k, scale K^-0.5, fp32 per-channel g = logsigmoid(N(0, 1))"
FAMILIES = {
    "gdn": Family(kernel_gpu, "pallas_kernels/gated_delta_rule/kernel_gpu.py",
                  "scalar-decay Pallas GPU kernels",
                  "GDN, bf16 q/k/v, unit-norm k, scale K^-0.5, fp32 gates", "gdn_", KNOBS,
                  LAUNCH_KNOBS, FWD_KNOBS, DEFAULT_VALUES, ("dq", "dk", "dv", "dg", "dbeta")),
    "kda": Family(channelwise_gpu, _CW_PATH, "per-channel-decay Pallas GPU kernels, KDA",
                  f"KDA, {_CW_INPUTS}, beta = sigmoid(N(0, 1))", "channelwise_", CW_KNOBS,
                  CW_LAUNCH_KNOBS, CW_FWD_KNOBS, CW_DEFAULT_VALUES,
                  ("dq", "dk", "dv", "dg", "dbeta")),
    "gdn2": Family(channelwise_gpu, _CW_PATH, "per-channel-decay Pallas GPU kernels, GDN-2",
                   f"GDN-2, {_CW_INPUTS}, erase gate b [B, T, H, K] and write gate w "
                   "[B, T, H, V] = sigmoid(N(0, 1))", "channelwise_", CW_KNOBS, CW_LAUNCH_KNOBS,
                   CW_FWD_KNOBS, CW_DEFAULT_VALUES, ("dq", "dk", "dv", "dg", "db", "dw")),
}
OPS = tuple(FAMILIES)

Shape = Tuple[int, int, int, int]
Tuning = Dict[str, Any]


# ----------------------------------------------------------------------------------------------
# Flags and their parsing.


def _define_flags(fv: flags.FlagValues) -> None:
    flags.DEFINE_enum("op", "gdn", OPS,
                      "Which kernels to tune: gdn (pallas_kernels/gated_delta_rule/"
                      "kernel_gpu.py, timed through gated_delta_rule), or kda / gdn2 (the "
                      "per-channel-decay kernels of pallas_kernels/common/channelwise_gpu.py, "
                      "timed through that op).", flag_values=fv)
    flags.DEFINE_string("shapes", "S1,S2",
                        "Comma-separated shapes: S1, S2, or B,T,H,D runs (e.g. S1,1,128,2,64).",
                        flag_values=fv)
    flags.DEFINE_string("knobs", None,
                        "Knobs in sweep order, each optionally with its values: name or "
                        "name=v1/v2/...; block values are ints or None, launch values WxS "
                        "(num_warps x num_stages), split_forward and intra_tf32 "
                        "True/False, intra_token_heads ints >= 1, e.g. "
                        "split_forward,block_v=32/64,forward=4x2/8x1 (default: every knob "
                        f"of the op: {','.join(KNOBS)} for gdn, {','.join(CW_KNOBS)} for kda "
                        "and gdn2).",
                        flag_values=fv)
    flags.DEFINE_string("start", None,
                        "JSON overrides of the starting point, e.g. '{\"block_v\": 32, "
                        "\"forward\": [8, 2]}' (default: the module's current TUNING).",
                        flag_values=fv)
    flags.DEFINE_integer("iters", 30, "Timed calls per measurement.", flag_values=fv)
    flags.DEFINE_integer("warmup", 5, "Untimed calls before timing.", flag_values=fv)
    flags.DEFINE_float("time_budget_s", 150.0,
                       "Wall-clock budget of the whole run in seconds, compiles included; "
                       "<= 0: unlimited.", flag_values=fv)
    flags.DEFINE_float("check_reserve_s", 20.0,
                       "Least seconds of the budget kept for the correctness check (the "
                       "confirmation's estimated time is kept on top).", flag_values=fv)
    flags.DEFINE_string("check_shape", "1,1024,4,128",
                        "B,T,H,D of the final correctness check against the fp32 reference.",
                        flag_values=fv)
    flags.DEFINE_integer("confirm_rounds", 3,
                         "Alternating re-timings of baseline and best at the end (0: none).",
                         flag_values=fv)
    flags.DEFINE_integer("compile_workers", None, "Compilation threads (default: CPU count).",
                         flag_values=fv)
    flags.DEFINE_bool("interpret", False,
                      "Run the kernels in Pallas interpret mode (implementation="
                      "'pallas_interpret'; any backend, slow; for smoke tests).", flag_values=fv)
    flags.DEFINE_integer("seed", 0, "Seed of the inputs.", flag_values=fv)
    flags.DEFINE_string("out", None, "Output prefix: writes <out>.json and <out>.md.",
                        flag_values=fv)


def parse_shapes(text: str, flag: str = "--shapes") -> Dict[str, Shape]:
    """Parses ``--shapes`` (or ``--check_shape``).

    Args:
      text: comma-separated tokens: shape names (:data:`SHAPES`), ``BxTxHxD`` tokens, or runs of
        four integers ``B,T,H,D`` (batch, sequence length, heads, head dim K = V).
      flag: the flag named in error messages.

    Returns:
      ``{name: (B, T, H, D)}`` in the given order; custom shapes are named ``"BxTxHxD"``.

    Raises:
      app.UsageError: on an unknown name, an incomplete integer run, a non-positive size, or a
        head dim the kernels do not support (64 or 128).
    """
    tokens = [t.strip() for t in text.split(",") if t.strip()]
    shapes: Dict[str, Shape] = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok in SHAPES:
            shape, i = SHAPES[tok], i + 1
            name = tok
        else:
            parts = tok.lower().split("x") if "x" in tok.lower() else tokens[i:i + 4]
            step = 1 if "x" in tok.lower() else 4
            try:
                shape = tuple(int(p) for p in parts)
            except ValueError:
                raise app.UsageError(f"{flag}: {tok!r} is neither a shape name "
                                     f"({', '.join(SHAPES)}) nor B,T,H,D integers") from None
            if len(shape) != 4:
                raise app.UsageError(f"{flag}: need four integers B,T,H,D, got {parts}")
            i += step
            name = "x".join(str(d) for d in shape)
        if min(shape) < 1 or shape[3] not in (64, 128):
            raise app.UsageError(f"{flag}: {name} needs positive sizes and D in (64, 128)")
        shapes[name] = shape
    if not shapes:
        raise app.UsageError(f"{flag}: no shape given")
    return shapes


def pass_kernels(pass_: str, split_forward: bool, segments: int = 1) -> Tuple[str, ...]:
    """The kernels (pallas_call names less ``gdn_``) a pass runs: ``pass_`` is ``"fwd"`` or
    ``"fwdbwd"``; ``segments > 1`` adds the segment-transition kernel (``forward_state``'s
    launch)."""
    fwd = ("prepare",) + (SPLIT_KERNELS if split_forward else ("forward",))
    if segments > 1:
        fwd = fwd + ("segment_transitions",)
    return fwd if pass_ == "fwd" else fwd + BACKWARD_KERNELS


def _parse_value(knob: str, text: str):
    if knob in BOOL_KNOBS + CW_BOOL_KNOBS:
        if text.lower() in ("true", "1"):
            return True
        if text.lower() in ("false", "0"):
            return False
        raise ValueError(f"{text!r} is not True or False")
    if knob in CW_INT_KNOBS:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"{knob}: {text!r} is not an int") from None
        if value < 1:
            raise ValueError(f"{knob}: {value} is not >= 1")
        return value
    if knob in SEGMENT_KNOBS:
        if text.lower() in ("none", "auto"):
            return None
        value = int(text)
        if value < 1:
            raise ValueError(f"{value} is not >= 1")
        return value
    if knob in BLOCK_KNOBS + CW_BLOCK_KNOBS:
        if text.lower() == "none":
            return None
        value = int(text)
        if value < 16 or value & (value - 1):
            raise ValueError(f"{value} is not a power of two >= 16")
        return value
    warps, stages = (int(x) for x in text.lower().split("x"))
    if warps < 1 or stages < 1:
        raise ValueError("num_warps and num_stages must be positive")
    return (warps, stages)


def _unknown_knob(flag: str, name: str, op: str) -> app.UsageError:
    """The error for a knob ``op`` does not have: another op's knob, or no knob at all."""
    family = FAMILIES[op]
    others = [o for o in OPS if name in FAMILIES[o].knobs]
    if others:
        where = sorted({FAMILIES[o].path for o in others})
        return app.UsageError(
            f"{flag}: {name!r} is a knob of --op={'/'.join(others)} only ({', '.join(where)}), "
            f"not of --op={op} ({family.path}); choose from {', '.join(family.knobs)}")
    return app.UsageError(f"{flag}: unknown knob {name!r}; choose from "
                          f"{', '.join(family.knobs)}")


def parse_knobs(text: Optional[str], op: str = "gdn") -> Dict[str, List[Any]]:
    """Parses ``--knobs`` into the sweep plan.

    Args:
      text: comma-separated ``name`` or ``name=v1/v2/...`` entries; names from the op's knobs
        (:data:`KNOBS` for gdn, :data:`CW_KNOBS` for kda and gdn2); ``None``: every knob of the
        op with its default values. Block values are powers of two >= 16 or ``None``; launch
        values ``WxS``; split_forward and intra_tf32 values ``True``/``False``; segments
        values ints >= 1 or ``None``; intra_token_heads values ints >= 1; prepare_k values
        as block values.
      op: ``--op`` (a key of :data:`FAMILIES`).

    Returns:
      ``{knob: [values]}`` in sweep order (a bare name takes the op's default values,
      :data:`DEFAULT_VALUES` or :data:`CW_DEFAULT_VALUES`).

    Raises:
      app.UsageError: on an unknown or repeated knob name, a knob of another op (e.g.
        split_forward with ``op="kda"``), or a malformed value.
    """
    family = FAMILIES[op]
    if text is None:
        text = ",".join(family.knobs)
    plan: Dict[str, List[Any]] = {}
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        name, _, values = entry.partition("=")
        name = name.strip()
        if name not in family.knobs:
            raise _unknown_knob("--knobs", name, op)
        if name in plan:
            raise app.UsageError(f"--knobs: {name!r} is given twice")
        if not values:
            plan[name] = list(family.default_values[name])
            continue
        try:
            plan[name] = [_parse_value(name, v.strip()) for v in values.split("/") if v.strip()]
        except ValueError as e:
            form = ("a power of two >= 16 or None" if name in BLOCK_KNOBS + CW_BLOCK_KNOBS
                    else "an int >= 1 or None (auto)" if name in SEGMENT_KNOBS
                    else "True or False" if name in BOOL_KNOBS + CW_BOOL_KNOBS
                    else "an int >= 1" if name in CW_INT_KNOBS
                    else "WxS, e.g. 4x2")
            raise app.UsageError(f"--knobs: bad value in {entry!r} ({e}); each value is "
                                 f"{form}") from None
        if not plan[name]:
            raise app.UsageError(f"--knobs: {entry!r} lists no value")
    if not plan:
        raise app.UsageError("--knobs: no knob given")
    return plan


def parse_start(text: Optional[str], base: Mapping[str, Any], op: str = "gdn") -> Tuning:
    """The starting configuration: ``base`` updated with the JSON overrides ``text``.

    Args:
      text: a JSON object ``{knob: value}`` (launch values as ``[num_warps, num_stages]``), or
        ``None``/empty for no override.
      base: the module's TUNING.
      op: ``--op`` (whose knobs ``text`` may name).

    Returns:
      A new TUNING dict (launch values as tuples).

    Raises:
      app.UsageError: on malformed JSON, an unknown knob (or another op's) or a malformed value.
    """
    family = FAMILIES[op]
    tuning = dict(base)
    if not text:
        return tuning
    try:
        overrides = json.loads(text)
    except json.JSONDecodeError as e:
        raise app.UsageError(f"--start: not JSON ({e})") from None
    if not isinstance(overrides, dict):
        raise app.UsageError("--start: give a JSON object {knob: value}")
    for key, value in overrides.items():
        if key not in family.knobs:
            raise _unknown_knob("--start", key, op)
        try:
            text_value = ("x".join(str(int(x)) for x in value) if key in family.launch_knobs
                          else str(value))
            tuning[key] = _parse_value(key, text_value)
        except (TypeError, ValueError) as e:
            raise app.UsageError(f"--start: bad value {value!r} for {key!r} ({e})") from None
    return tuning


def parse_flags(argv: Sequence[str]) -> flags.FlagValues:
    """Parses ``argv`` (without the program name) into a fresh ``FlagValues``.

    A private ``FlagValues`` keeps this binary's flags out of absl's global ones (other
    experiment modules define flags of the same names) and makes :func:`main` re-entrant.

    Args:
      argv: command-line options, e.g. ``["--shapes=S1", "--knobs=block_v"]``.

    Returns:
      The parsed flags (every value validated).

    Raises:
      app.UsageError: on an unknown flag, a bad value, or any error of :func:`parse_shapes`,
        :func:`parse_knobs` or :func:`parse_start`.
    """
    fv = flags.FlagValues()
    _define_flags(fv)
    try:
        fv(["tune_kernels"] + list(argv))
    except flags.Error as e:
        raise app.UsageError(str(e)) from None
    if fv.iters < 1 or fv.warmup < 0:
        raise app.UsageError(f"need --iters >= 1 and --warmup >= 0, got {fv.iters}, {fv.warmup}")
    parse_shapes(fv.shapes)
    parse_knobs(fv.knobs, fv.op)
    if len(parse_shapes(fv.check_shape, "--check_shape")) != 1:
        raise app.UsageError("--check_shape: give one B,T,H,D shape")
    family = FAMILIES[fv.op]
    parse_start(fv.start, family.module.TUNING, fv.op)
    return fv


# ----------------------------------------------------------------------------------------------
# Configurations: effective values, validity, and the launch check on the traced jaxpr.


def effective(tuning: Mapping[str, Any], shape: Shape, op: str = "gdn") -> Tuning:
    """The values the kernels use at ``shape``.

    Args:
      tuning: a TUNING dict of ``op``'s module (``None`` block widths allowed).
      shape: ``(B, T, H, D)``, D the head dim K = V.
      op: ``--op``.

    Returns:
      For gdn, a copy with ``None`` block widths resolved by ``kernel_gpu.block_widths`` (as the
      kernels resolve them, on the pseudo-batch of ``segments`` (resolved by
      ``kernel_gpu.num_segments``) segments per row), launches by ``kernel_gpu.launch_for`` (a
      pair, or a dict per head dim), ``split_forward`` as a bool, and ``None`` as the launch of
      the forward kernels the configuration does not run (``forward`` when split,
      ``forward_state``/``forward_output`` otherwise). For kda/gdn2, ``None`` block widths
      resolved to ``min(D, 64)`` (common/channelwise_gpu.py's ``_config``), launches by its
      ``launch_for``, ``intra_tf32`` as a bool, ``intra_token_heads`` as the heads per
      program of the ``intra`` kernel at H (its ``intra_heads``), and a ``None`` prepare_k
      resolved to block_k (as its ``_config`` resolves it).

    Raises:
      ValueError: (kda, gdn2) if ``intra_token_heads`` is not an int >= 1.
    """
    batch, seq_len, heads, dim = shape
    if op != "gdn":
        out = {k: channelwise_gpu.launch_for(k, dim, tuning) for k in CW_LAUNCH_KNOBS}
        out["intra_token_heads"] = channelwise_gpu.intra_heads(heads, tuning)
        out["block_v"], out["block_k"] = channelwise_gpu.block_widths(dim, dim, tuning)
        out["intra_tf32"] = bool(tuning.get("intra_tf32", True))
        out["prepare_k"] = tuning.get("prepare_k") or out["block_k"]
        return out
    out = {k: kernel_gpu.launch_for(k, dim, tuning) for k in LAUNCH_KNOBS}
    out["split_forward"] = split = bool(tuning.get("split_forward", False))
    tuning = dict(tuning, segments=tuning.get("segments", 1))
    out["segments"] = segments = kernel_gpu.num_segments(batch, heads, dim,
                                                         -(-seq_len // CHUNK), tuning)
    # forward_state's launch also runs the segment transitions.
    for k in (("forward",) if split else SPLIT_KERNELS[1:] if segments > 1 else SPLIT_KERNELS):
        out[k] = None
    out["block_v"], out["block_k"] = kernel_gpu.block_widths(batch * segments, heads, dim, dim,
                                                             tuning)
    return out


def invalid_reason(tuning: Mapping[str, Any], shapes: Mapping[str, Shape],
                   op: str = "gdn") -> Optional[str]:
    """Why ``tuning`` cannot run at some shape.

    Args:
      tuning: a TUNING dict of ``op``'s module.
      shapes: ``{name: (B, T, H, D)}``.
      op: ``--op``.

    Returns:
      ``"error: <knob>=<width> does not fit head dim <D> (<name>)"`` for a block wider than,
      or not dividing, the head dim; ``None`` when every shape can run.
    """
    for name, shape in shapes.items():
        dim = shape[3]
        eff = effective(tuning, shape, op)
        for knob in BLOCK_KNOBS + (CW_BLOCK_KNOBS if op != "gdn" else ()):
            if eff[knob] > dim or dim % eff[knob]:
                return f"error: {knob}={eff[knob]} does not fit head dim {dim} ({name})"
    return None


def _key(tuning: Mapping[str, Any], shapes: Mapping[str, Shape], knobs=None, *,
         op: str = "gdn") -> tuple:
    """Identity of the compiled programs: the effective ``knobs`` (default: every knob of
    ``op``) at every shape."""
    knobs = FAMILIES[op].knobs if knobs is None else knobs
    return tuple(tuple(effective(tuning, s, op)[k] for k in knobs) for s in shapes.values())


def _fwd_key(tuning: Mapping[str, Any], shape: Shape, op: str = "gdn") -> tuple:
    eff = effective(tuning, shape, op)
    return (shape,) + tuple(eff[k] for k in FAMILIES[op].fwd_knobs)


def _subjaxprs(params: Mapping[str, Any]):
    for value in params.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(item, jax.extend.core.ClosedJaxpr):
                yield item.jaxpr
            elif isinstance(item, jax.extend.core.Jaxpr):
                yield item


def _launch(compiler_params) -> Optional[Tuple[int, int]]:
    if compiler_params is None:
        return None
    if isinstance(compiler_params, Mapping):  # older jax: {"triton": {...}} / {"triton": obj}
        compiler_params = compiler_params.get("triton", next(iter(compiler_params.values())))
    get = (compiler_params.get if isinstance(compiler_params, Mapping)
           else lambda n: getattr(compiler_params, n, None))
    return (get("num_warps"), get("num_stages"))


class LaunchCheckUnavailable(RuntimeError):
    """The traced program does not show the launch parameters in a form we can read."""


def launch_table(closed_jaxpr) -> Dict[str, List[dict]]:
    """Every ``pallas_call`` in a traced program, nested jaxprs included.

    Args:
      closed_jaxpr: ``jax.jit(f).trace(...).jaxpr``.

    Returns:
      ``{kernel name: [dict(launch=(num_warps, num_stages) or None, grid=tuple or None),
      ...]}``; ``launch`` is ``None`` where no Triton parameters were staged (interpret mode),
      ``grid`` where the primitive's parameters do not expose one.
    """
    table: Dict[str, List[dict]] = {}

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "pallas_call":
                params = eqn.params
                # jax 0.10/0.11: "name"; older releases: "name_and_src_info" ("<name> for ...").
                name = str(params.get("name", params.get("name_and_src_info", "")))
                grid = getattr(params.get("grid_mapping"), "grid", None)
                table.setdefault((name.split() or [""])[0], []).append(dict(
                    launch=_launch(params.get("compiler_params")),
                    grid=None if grid is None else tuple(grid)))
            for sub in _subjaxprs(eqn.params):
                walk(sub)

    walk(closed_jaxpr.jaxpr)
    return table


def _gdn_grids(eff: Mapping[str, Any], shape: Shape) -> Dict[str, tuple]:
    """The grids of gated_delta_rule/kernel_gpu.py's kernels at ``shape`` under ``eff``."""
    batch, seq_len, heads, dim = shape
    segments = eff["segments"]
    # The kernels see a pseudo-batch of B * P rows of n_chunks / P chunks (segments).
    n_chunks = -(-seq_len // (CHUNK * segments))
    rows = batch * segments * heads
    return {"prepare": (n_chunks, rows),
            "forward": (rows, dim // eff["block_v"]),
            "forward_state": (rows, dim // eff["block_v"]),
            "segment_transitions": (rows, 2 * dim // min(64, 2 * dim)),
            "forward_output": (n_chunks, rows, dim // min(dim, kernel_gpu.OUTPUT_BLOCK_V)),
            "backward_state": (rows, dim // eff["block_v"]),
            "backward_chunk": (n_chunks, rows, dim // eff["block_k"])}


def channelwise_pass_kernels(pass_: str) -> Tuple[str, ...]:
    """The kernels (pallas_call names less ``channelwise_``) a pass of channelwise_gpu.py runs:
    ``pass_`` is ``"fwd"`` or ``"fwdbwd"``; the same under every configuration."""
    return CW_FWD_KERNELS if pass_ == "fwd" else CW_KERNELS


def _channelwise_grids(eff: Mapping[str, Any], shape: Shape) -> Dict[str, tuple]:
    """The grids of channelwise_gpu.py's kernels (``_gamma``, ``_intra``, ``_prepare``'s
    prepare and wu, ``_forward``, ``_grad_blocks``, ``_backward_state``, ``_backward_chunk``) at
    ``shape`` under the effective values ``eff``."""
    batch, seq_len, heads, dim = shape
    n_chunks, rows = -(-seq_len // CW_CHUNK), batch * heads
    nsub = channelwise_gpu.NSUB  # 16-row blocks per chunk
    per = eff["intra_token_heads"]  # intra: a program per token and head group
    return {"gamma": (n_chunks, rows),
            "intra": (batch * n_chunks * CW_CHUNK, heads // per),
            "prepare": (n_chunks, rows),
            "wu": (n_chunks, rows),
            "forward": (rows, dim // eff["block_v"]),
            "grad_blocks": (n_chunks, rows, nsub),
            "backward_state": (rows, dim // eff["block_v"]),
            "backward_chunk": (n_chunks, rows, dim // eff["block_k"])}


def _launch_knob(kernel: str) -> str:
    """The launch knob of the kernel named ``kernel`` (less its prefix): its own, but
    forward_state's for gdn's segment transitions and intra_token's for the channelwise intra
    kernel."""
    if kernel == "segment_transitions":
        return "forward_state"
    if kernel == "intra":
        return "intra_token"
    return kernel


def check_launches(table: Mapping[str, List[dict]], tuning: Mapping[str, Any], shape: Shape,
                   pass_: str, *, check_launch: bool = True, op: str = "gdn") -> None:
    """Checks that a traced program runs ``tuning`` (not a stale cached trace).

    Args:
      table: :func:`launch_table` of the program.
      tuning: the configuration it should run.
      shape: its ``(B, T, H, D)``.
      pass_: ``"fwd"`` or ``"fwdbwd"`` (which kernels must appear).
      check_launch: also compare ``(num_warps, num_stages)`` (off for interpret-mode programs,
        which stage none).
      op: ``--op``: the ``gdn_*`` kernels of gated_delta_rule/kernel_gpu.py, or (kda, gdn2) the
        ``channelwise_*`` kernels of common/channelwise_gpu.py.

    Raises:
      LaunchCheckUnavailable: when the program holds none of this family's kernels by name, or
        launch parameters are expected but none can be read (an unknown jax format).
      RuntimeError: naming the kernel and what differs (a stale trace), or a missing kernel.
    """
    family = FAMILIES[op]
    kernel_names = family.launch_knobs if op == "gdn" else CW_KERNELS
    names = sorted(family.prefix + k for k in kernel_names)
    if not any(name in table for name in names):
        raise LaunchCheckUnavailable(f"no pallas_call named {names} (found {sorted(table)})")
    eff = effective(tuning, shape, op)
    if op == "gdn":
        grids, kernels = _gdn_grids(eff, shape), pass_kernels(pass_, eff["split_forward"],
                                                              eff["segments"])
    else:
        grids = _channelwise_grids(eff, shape)
        kernels = channelwise_pass_kernels(pass_)
    for kernel in kernels:
        name = family.prefix + kernel
        calls = table.get(name)
        if not calls:
            raise RuntimeError(f"{pass_}: no pallas_call named {name} in the "
                               f"traced program (found {sorted(table)})")
        for call in calls:
            want = tuple(eff[_launch_knob(kernel)])
            if check_launch and (call["launch"] is None or None in call["launch"]):
                raise LaunchCheckUnavailable(f"{name}: no Triton launch "
                                             "parameters readable in the traced program")
            if check_launch and call["launch"] != want:
                raise RuntimeError(f"{pass_}: {name} traced with launch "
                                   f"{call['launch']}, expected {want} (stale trace?)")
            if call["grid"] is not None and call["grid"] != grids[kernel]:
                raise RuntimeError(f"{pass_}: {name} traced with grid "
                                   f"{call['grid']}, expected {grids[kernel]} (stale trace?)")


def set_tuning(tuning: Mapping[str, Any], op: str = "gdn") -> None:
    """Writes ``tuning`` into the TUNING of ``op``'s kernel module and clears JAX's caches.

    TUNING is read when the op is traced; a fresh outer ``jax.jit`` alone is not enough, since
    the traced jaxpr of the op's inner ``jax.jit`` (``api._forward_pallas``) is cached by
    function and argument types, so the next trace would reuse the old launch parameters.

    Args:
      tuning: the full TUNING dict to install (copied).
      op: ``--op``: ``gated_delta_rule/kernel_gpu.TUNING`` for gdn,
        ``common/channelwise_gpu.TUNING`` for kda and gdn2.
    """
    module = FAMILIES[op].module
    module.TUNING.clear()
    module.TUNING.update(tuning)
    jax.clear_caches()


# ----------------------------------------------------------------------------------------------
# Inputs and programs.


def make_inputs(shape: Shape, seed: int, op: str = "gdn") -> Tuple[jax.Array, ...]:
    """The op's inputs at one shape (the bench_kernels.py contract), with a cotangent.

    Args:
      shape: ``(B, T, H, D)``.
      seed: PRNG seed.
      op: ``--op``.

    Returns:
      q, v, cotangent do ``[B, T, H, D]`` bf16 N(0, 1); k ``[B, T, H, D]`` bf16, unit norm over
      D; gates fp32: for gdn ``(q, k, v, g, beta, do)`` with g ``[B, T, H]``
      logsigmoid(N(0, 1)) and beta ``[B, T, H]`` sigmoid(N(0, 1)); for kda the same with the
      per-channel g ``[B, T, H, D]``; for gdn2 ``(q, k, v, g, b, w, do)`` with that g and
      the gates b (erase, ``[B, T, H, K]``) and w (write, ``[B, T, H, V]``) sigmoid(N(0, 1)).
    """
    batch, seq_len, heads, dim = shape

    def build_channelwise(key):
        kq, kk, kv, kg, kb, kw, kd = jax.random.split(key, 7)
        big = (batch, seq_len, heads, dim)
        bf16 = jnp.bfloat16
        k = jax.random.normal(kk, big, jnp.float32)
        k = k / jnp.linalg.norm(k, axis=-1, keepdims=True)
        gates = ((jax.nn.sigmoid(jax.random.normal(kb, big[:3], jnp.float32)),) if op == "kda"
                 else (jax.nn.sigmoid(jax.random.normal(kb, big, jnp.float32)),
                       jax.nn.sigmoid(jax.random.normal(kw, big, jnp.float32))))
        return (jax.random.normal(kq, big, jnp.float32).astype(bf16), k.astype(bf16),
                jax.random.normal(kv, big, jnp.float32).astype(bf16),
                jax.nn.log_sigmoid(jax.random.normal(kg, big, jnp.float32)), *gates,
                jax.random.normal(kd, big, jnp.float32).astype(bf16))

    def build(key):
        kq, kk, kv, kg, kb, kd = jax.random.split(key, 6)
        big = (batch, seq_len, heads, dim)
        bf16 = jnp.bfloat16
        k = jax.random.normal(kk, big, jnp.float32)
        k = k / jnp.linalg.norm(k, axis=-1, keepdims=True)
        return (jax.random.normal(kq, big, jnp.float32).astype(bf16), k.astype(bf16),
                jax.random.normal(kv, big, jnp.float32).astype(bf16),
                jax.nn.log_sigmoid(jax.random.normal(kg, big[:3], jnp.float32)),
                jax.nn.sigmoid(jax.random.normal(kb, big[:3], jnp.float32)),
                jax.random.normal(kd, big, jnp.float32).astype(bf16))

    fn = build if op == "gdn" else build_channelwise
    return jax.block_until_ready(jax.jit(fn)(jax.random.key(seed)))


def programs(op: Callable[..., jax.Array]) -> Dict[str, Callable[..., Any]]:
    """The timed passes of an op.

    Args:
      op: ``op(*xs) -> o [B, T, H, V]``, e.g. ``op(q, k, v, g, beta)``.

    Returns:
      ``{"fwd": f(*xs, do) -> o, "fwdbwd": f(*xs, do) -> (*dxs, o)}``, e.g. ``(dq, dk, dv, dg,
      dbeta, o)`` (the VJP of the fixed cotangent ``do``, cast to o's dtype, and o itself);
      plain functions to wrap in ``jax.jit``.
    """

    def fwd(*args):
        return op(*args[:-1])

    def fwdbwd(*args):
        *xs, do = args
        o, vjp = jax.vjp(op, *xs)
        # o is returned too: as in training, where the loss reads it. Otherwise dead-code
        # elimination drops a read-out that has a kernel of its own (split_forward's
        # forward_output), and the fwd+bwd time would miss it.
        return vjp(do.astype(o.dtype)) + (o,)

    return {"fwd": fwd, "fwdbwd": fwdbwd}


def gdn_op(implementation: str) -> Callable[..., jax.Array]:
    """The public op as a function of its arrays.

    Args:
      implementation: ``gated_delta_rule``'s ``implementation=`` (``"pallas"``,
        ``"pallas_interpret"``, ``"reference"``, ...).

    Returns:
      ``op(q, k, v, g, beta) -> o [B, T, H, V]`` in v's dtype (scale K^-0.5, no final state).
    """

    def op(q, k, v, g, beta):
        return gdr.gated_delta_rule(q, k, v, g, beta, implementation=implementation)[0]

    return op


def kda_op(implementation: str) -> Callable[..., jax.Array]:
    """:func:`gdn_op` for ``pallas_kernels.kda.kda``: ``op(q, k, v, g, beta) -> o``."""

    def op(q, k, v, g, beta):
        return kda_ops.kda(q, k, v, g, beta, implementation=implementation)[0]

    return op


def gdn2_op(implementation: str) -> Callable[..., jax.Array]:
    """:func:`gdn_op` for ``pallas_kernels.gdn2.gdn2``: ``op(q, k, v, g, b, w) -> o``."""

    def op(q, k, v, g, b, w):
        return gdn2_ops.gdn2(q, k, v, g, b, w, implementation=implementation)[0]

    return op


def _kernel_op(q, k, v, g, beta):
    """The GPU kernels without interpret mode, called directly (traced, never run, on CPU)."""
    return kernel_gpu.scalar_decay_pallas(q, k, v, g, beta, scale=q.shape[-1] ** -0.5,
                                          return_residual=False, interpret=False)[0]


def _kda_kernel_op(q, k, v, g, beta):
    """:func:`_kernel_op` for KDA (channelwise_gpu.py's kernels through kda/kernel_gpu.py)."""
    return kda_kernel_gpu.kda_pallas(q, k, v, g, beta, scale=q.shape[-1] ** -0.5,
                                     return_residual=False, interpret=False)[0]


def _gdn2_kernel_op(q, k, v, g, b, w):
    """:func:`_kernel_op` for GDN-2 (channelwise_gpu.py's kernels through gdn2/kernel_gpu.py)."""
    return gdn2_kernel_gpu.gdn2_pallas(q, k, v, g, b, w, scale=q.shape[-1] ** -0.5,
                                       return_residual=False, interpret=False)[0]


OP_FUNCTIONS = {"gdn": gdn_op, "kda": kda_op, "gdn2": gdn2_op}  # implementation -> op
KERNEL_OPS = {"gdn": _kernel_op, "kda": _kda_kernel_op, "gdn2": _gdn2_kernel_op}


def _median_ms(times_s: Sequence[float]) -> float:
    return 1e3 * statistics.median(times_s)


def rel_rms(got, want) -> float:
    """Relative RMS error of two arrays of one shape.

    Args:
      got: the array under test (any float dtype).
      want: the reference.

    Returns:
      ``||got - want|| / ||want||`` (Frobenius norms, computed in fp32), a Python float.
    """
    got = jnp.asarray(got, jnp.float32)
    want = jnp.asarray(want, jnp.float32)
    return float(jnp.linalg.norm(got - want) / jnp.maximum(jnp.linalg.norm(want), 1e-30))


# ----------------------------------------------------------------------------------------------
# The sweep.


class Sweep:
    """Coordinate descent over the op's knobs; holds every trial and writes the report.

    Attributes:
      opts: the parsed flags.
      op: ``--op`` (a key of :data:`FAMILIES`).
      shapes: ``{name: (B, T, H, D)}``.
      plan: ``{knob: [values]}`` in sweep order.
      baseline: the module's TUNING when the sweep began.
      trials: every configuration tried, in order (see :meth:`payload`).
      budget: the run's :class:`benchmarks.common.TimeBudget`.
    """

    def __init__(self, fv: flags.FlagValues, argv: Sequence[str], baseline: Mapping[str, Any]):
        """Sets up the sweep (inputs are made in :meth:`run`).

        Args:
          fv: parsed flags (:func:`parse_flags`).
          argv: the command line, for the report.
          baseline: the TUNING to compare against (the module's, before any change).
        """
        self.opts = fv
        self.argv = list(argv)
        self.op = fv.op
        self.shapes = parse_shapes(fv.shapes)
        self.plan = parse_knobs(fv.knobs, self.op)
        self.baseline = dict(baseline)
        self.start = parse_start(fv.start, baseline, self.op)
        self.interpret = fv.interpret
        self.impl = "pallas_interpret" if fv.interpret else "pallas"
        self.budget = bench.TimeBudget(fv.time_budget_s if fv.time_budget_s > 0 else None)
        self.trials: List[dict] = []
        self.descent: List[dict] = []
        self.fwd_results: Dict[tuple, dict] = {}  # _fwd_key -> fwd measurement of one shape
        self.kept: Dict[tuple, Any] = {}  # compiled programs of the baseline and the incumbent
        # Cost model of a program (all measured batches): serial seconds (tracing, lowering,
        # timing) and compile seconds each, compiles running --compile_workers at a time.
        self.costs = dict(serial_s=0.0, compile_s=0.0, programs=0)
        self.workers = max(1, fv.compile_workers or os.cpu_count() or 1)
        self.stopped_by_budget = False
        self.confirm: Optional[dict] = None
        self.check: Optional[dict] = None
        self.env: Dict[str, Any] = {}
        self.best: Optional[dict] = None
        self.inputs: Dict[str, tuple] = {}

    def log(self, text: str) -> None:
        """Prints (and flushes) one progress line, prefixed with the elapsed seconds."""
        print(f"[{self.budget.elapsed():7.1f} s] {text}", flush=True)

    # -- bookkeeping ---------------------------------------------------------------------------

    def _trial(self, knob, value, tuning, status="pending", **extra) -> dict:
        trial = dict(id=len(self.trials), knob=knob, value=value, tuning=dict(tuning),
                     status=status, shapes={}, objective_ms=None, **extra)
        self.trials.append(trial)
        return trial

    def _find(self, tuning) -> Optional[dict]:
        """The measured (or failed) trial with the same effective knobs, if any."""
        key = _key(tuning, self.shapes, op=self.op)
        for t in self.trials:
            if t["status"] != bench.SKIPPED_BUDGET and "same_as" not in t and \
                    _key(t["tuning"], self.shapes, op=self.op) == key:
                return t
        return None

    def _estimate(self, n_programs: int) -> Optional[float]:
        """Seconds to measure ``n_programs`` programs in one batch (``None`` before the first
        batch): serial work per program, plus compiles in ``ceil(n / workers)`` waves at the
        mean compile time so far (measured under the same concurrency, so on the safe side)."""
        c = self.costs
        if not c["programs"]:
            return None
        waves = -(-n_programs // self.workers)
        return (c["serial_s"] * n_programs + c["compile_s"] * waves) / c["programs"]

    def _reserve(self, incumbent) -> float:
        """Seconds kept for the end: the correctness check (``--check_reserve_s``, or more where
        the wall time per program so far says its compiles take longer) plus the confirmation.
        """
        (_, check_shape), = parse_shapes(self.opts.check_shape).items()
        n_check = 2 if check_shape in self.shapes.values() else 4  # + ours unless reused
        check = max(self.opts.check_reserve_s, self._estimate(n_check) or 0.0)
        return check + self._confirm_estimate(incumbent)

    def _confirm_estimate(self, incumbent) -> float:
        """Seconds :meth:`_confirm` will take: its calls at the measured medians (an upper
        bound: the incumbent only gets faster)."""
        per_call = 0.0
        for trial in (self.trials[0], self.trials[incumbent.get("measured_id", incumbent["id"])]):
            for rec in trial["shapes"].values():
                per_call += sum(rec.get(f"{p}_ms") or 0.0 for p in PASSES) / 1e3
        calls = max(self.opts.confirm_rounds, 0) * (self.opts.iters + self.opts.warmup)
        return per_call * calls

    def _programs_needed(self, tuning, pending_fwd) -> int:
        n = 0
        for shape in self.shapes.values():
            fk = _fwd_key(tuning, shape, self.op)
            n += 1 + (fk not in self.fwd_results and fk not in pending_fwd)
        return n

    # -- measuring -----------------------------------------------------------------------------

    def measure(self, batch: List[dict]) -> None:
        """Traces, checks, compiles (concurrently) and times the trials of ``batch``.

        Args:
          batch: trial dicts with status ``"pending"``; updated in place: each ends with status
            ``"ok"``, per-shape times (ms) and ``objective_ms``, or an error status. The fwd
            measurement of a forward program already measured (the same shape and effective
            forward knobs, the family's ``fwd_knobs``) is reused and marked with ``fwd_from``.
        """
        t0 = time.perf_counter()
        fns = {self.impl: programs(OP_FUNCTIONS[self.op](self.impl))}
        if self.interpret:
            fns["twin"] = programs(KERNEL_OPS[self.op])
        lowered: Dict[tuple, Any] = {}
        fwd_owner: Dict[tuple, int] = {}
        for trial in batch:
            set_tuning(trial["tuning"], self.op)
            t_lower = time.perf_counter()
            _, status = bench.guarded(self._lower, trial, fns, lowered, fwd_owner)
            trial["lower_s"] = round(time.perf_counter() - t_lower, 3)
            if status != bench.OK:
                trial["status"] = status
                self.log(f"#{trial['id']} {self._label(trial)}: {status}")
        compiled, t_compile = {}, time.perf_counter()
        if lowered:
            self.log(f"compiling {len(lowered)} programs")
            compiled = bench.compile_concurrently(
                lowered, max_workers=self.workers, log=lambda s: print("  " + s, flush=True))
        compile_wall = time.perf_counter() - t_compile
        for trial in batch:
            if trial["status"] == "pending":
                self._time(trial, compiled)
        if lowered:
            self.costs["programs"] += len(lowered)
            self.costs["serial_s"] += time.perf_counter() - t0 - compile_wall
            self.costs["compile_s"] += sum(sec for _, _, sec in compiled.values())

    def _lower(self, trial, fns, lowered, fwd_owner) -> None:
        """Traces and lowers the programs of ``trial`` (run under its TUNING) into ``lowered``;
        adds nothing when any step raises."""
        reason = invalid_reason(trial["tuning"], self.shapes, self.op)
        if reason:
            raise ValueError(reason[len("error: "):])
        mine: Dict[tuple, Any] = {}
        owned = []
        check = "ok"
        for name, shape in self.shapes.items():
            args = self.inputs[name]
            fk = _fwd_key(trial["tuning"], shape, self.op)
            todo = ["fwdbwd"]
            if fk not in self.fwd_results and fk not in fwd_owner:
                todo.insert(0, "fwd")
                owned.append(fk)
            for pass_ in todo:
                traced = jax.jit(fns[self.impl][pass_]).trace(*args)
                tables = [(launch_table(traced.jaxpr), not self.interpret)]
                if self.interpret:  # launch parameters are staged only outside interpret mode
                    twin = jax.jit(fns["twin"][pass_]).trace(*args)
                    tables.append((launch_table(twin.jaxpr), True))
                for table, with_launch in tables:
                    try:
                        check_launches(table, trial["tuning"], shape, pass_,
                                       check_launch=with_launch, op=self.op)
                    except LaunchCheckUnavailable as e:
                        check = f"unavailable: {e}"
                        if not any(t.get("launch_check") == check for t in self.trials):
                            self.log(f"warning: launch check {check}")
                key = ("fwd", fk) if pass_ == "fwd" else ("fwdbwd", trial["id"], name)
                mine[key] = traced.lower()
        lowered.update(mine)
        fwd_owner.update({fk: trial["id"] for fk in owned})
        trial["launch_check"] = check

    def _time(self, trial, compiled) -> None:
        it, wu = self.opts.iters, self.opts.warmup
        compile_s = 0.0
        for name, shape in self.shapes.items():
            args = self.inputs[name]
            rec = trial["shapes"].setdefault(name, {})
            fk = _fwd_key(trial["tuning"], shape, self.op)
            for pass_, key in (("fwd", ("fwd", fk)), ("fwdbwd", ("fwdbwd", trial["id"], name))):
                if pass_ == "fwd" and fk in self.fwd_results:
                    prev = self.fwd_results[fk]
                    rec.update(fwd_ms=prev.get("fwd_ms"), fwd_min_ms=prev.get("fwd_min_ms"),
                               fwd_from=prev["trial"])
                    if prev["status"] != bench.OK:
                        trial["status"] = prev["status"]
                    continue
                exe, status, seconds = compiled.get(key, (None, "error: not compiled", 0.0))
                compile_s += seconds
                if status == bench.OK:
                    times, status = bench.guarded(
                        bench.time_calls, lambda exe=exe: exe(*args), warmup=wu, iters=it)
                if status == bench.OK:
                    rec[f"{pass_}_ms"] = round(_median_ms(times), 4)
                    rec[f"{pass_}_min_ms"] = round(1e3 * min(times), 4)
                    self.kept[key] = exe
                if pass_ == "fwd":
                    self.fwd_results[fk] = dict(trial=trial["id"], status=status,
                                                **{k: rec.get(k) for k in ("fwd_ms",
                                                                           "fwd_min_ms")})
                if status != bench.OK and trial["status"] == "pending":
                    trial["status"] = f"{status} ({name} {pass_})"
        trial["compile_s"] = round(compile_s, 2)
        if trial["status"] == "pending":
            trial["status"] = bench.OK
            trial["objective_ms"] = round(sum(r["fwdbwd_ms"] for r in trial["shapes"].values()),
                                          4)
        self.log(f"#{trial['id']} {self._label(trial)}: " + "; ".join(
            f"{n} fwd {bench.fmt(r.get('fwd_ms'))} fwd+bwd {bench.fmt(r.get('fwdbwd_ms'))}"
            for n, r in trial["shapes"].items())
            + f"; objective {bench.fmt(trial['objective_ms'])} ms"
            + ("" if trial["status"] == bench.OK else f"; {trial['status']}"))

    def _prune(self, keep_ids) -> None:
        """Keeps the compiled programs of the trials ``keep_ids`` only (for :meth:`confirm`)."""
        keep = set()
        for t in self.trials:
            if t["id"] in keep_ids:
                for name, shape in self.shapes.items():
                    keep.add(("fwd", _fwd_key(t["tuning"], shape, self.op)))
                    keep.add(("fwdbwd", t["id"], name))
        self.kept = {k: v for k, v in self.kept.items() if k in keep}

    @staticmethod
    def _label(trial) -> str:
        if trial["knob"] is None:
            return trial.get("role", "config")
        return f"{trial['knob']}={_fmt_value(trial['value'])}"

    # -- the descent ---------------------------------------------------------------------------

    def run(self) -> dict:
        """Runs the sweep, the confirmation and the correctness check.

        Leaves the module's TUNING at the last configuration traced (:func:`main` restores it).

        Returns:
          :meth:`payload`, also written to ``<out>.json``/``<out>.md`` after every knob.
        """
        self.env = bench.environment(["benchmarks/tune_kernels.py"] + self.argv)
        self.log(f"device {self.env['device_kind']} ({self.env['backend']}), jax "
                 f"{self.env['jax']}; op {self.op} ({FAMILIES[self.op].path}); shapes "
                 f"{self.shapes}; implementation {self.impl}")
        for name, shape in self.shapes.items():
            self.inputs[name] = make_inputs(shape, self.opts.seed, self.op)
        base = self._trial(None, None, self.baseline, role="baseline")
        first = [base]
        if _key(self.start, self.shapes, op=self.op) != _key(self.baseline, self.shapes,
                                                             op=self.op):
            first.append(self._trial(None, None, self.start, role="start"))
        self.measure(first)
        incumbent = self.best = first[-1]
        self._write()
        for i, (knob, values) in enumerate(self.plan.items()):
            incumbent = self.best = self._sweep_knob(knob, values, incumbent)
            self._prune({base["id"], incumbent["measured_id"] if "measured_id" in incumbent
                         else incumbent["id"]})
            self._write()
            if self.stopped_by_budget and list(self.plan)[i + 1:]:
                for rest in list(self.plan)[i + 1:]:
                    for value in self.plan[rest]:
                        self._trial(rest, value, {**incumbent["tuning"], rest: value},
                                    status=bench.SKIPPED_BUDGET)
                self.log(f"time budget reached: knobs {list(self.plan)[i + 1:]} not swept")
                break
        self.confirm = self._confirm(base, incumbent)
        self._write()
        self.check = self._check(incumbent)
        self._write()
        payload = self.payload()
        print(markdown(payload), flush=True)
        return payload

    def _sweep_knob(self, knob, values, incumbent) -> dict:
        """Tries every value of ``knob`` around ``incumbent``; returns the new incumbent (a trial
        dict, possibly a ``same_as`` record whose measurement is ``measured_id``)."""
        self.log(f"knob {knob}: values {[_fmt_value(v) for v in values]}, incumbent "
                 f"{_fmt_value(incumbent['tuning'][knob])}")
        candidates, batch, pending_fwd, n_programs = [], [], set(), 0
        for value in values:
            tuning = {**incumbent["tuning"], knob: value}
            same = self._find(tuning)
            if same is not None:
                measured = self.trials[same.get("measured_id", same["id"])]
                candidates.append(self._trial(knob, value, tuning, status=measured["status"],
                                              same_as=measured["id"],
                                              measured_id=measured["id"]))
                candidates[-1]["objective_ms"] = measured["objective_ms"]
                continue
            reason = invalid_reason(tuning, self.shapes, self.op)
            if reason:
                candidates.append(self._trial(knob, value, tuning, status=reason))
                self.log(f"#{candidates[-1]['id']} {knob}={_fmt_value(value)}: {reason}")
                continue
            need = self._programs_needed(tuning, pending_fwd)
            est = self._estimate(n_programs + need)
            reserve = self._reserve(incumbent)
            if self.stopped_by_budget or (est is not None and not self.budget.allows(
                    est + reserve)):
                self.stopped_by_budget = True
                candidates.append(self._trial(knob, value, tuning, status=bench.SKIPPED_BUDGET))
                self.log(f"#{candidates[-1]['id']} {knob}={_fmt_value(value)}: "
                         f"{bench.SKIPPED_BUDGET} (estimate {bench.fmt(est, '.1f')} s + reserve "
                         f"{reserve:.1f} s, {self.budget.remaining():.1f} s left)")
                continue
            trial = self._trial(knob, value, tuning)
            n_programs += need
            pending_fwd.update(_fwd_key(tuning, s, self.op) for s in self.shapes.values())
            batch.append(trial)
            candidates.append(trial)
        if batch:
            self.measure(batch)
        best = incumbent
        for c in candidates:
            if c["status"] == bench.OK and c["objective_ms"] is not None and (
                    best["objective_ms"] is None or c["objective_ms"] < best["objective_ms"]):
                best = c
        step = dict(knob=knob, value=best["tuning"][knob], objective_ms=best["objective_ms"],
                    trial=best.get("measured_id", best["id"]),
                    tried=[c["id"] for c in candidates])
        self.descent.append(step)
        self.log(f"knob {knob}: keep {_fmt_value(step['value'])} (objective "
                 f"{bench.fmt(best['objective_ms'])} ms, trial #{step['trial']})")
        return best

    def _confirm(self, base, best) -> Optional[dict]:
        """Re-times the baseline and the best configuration alternately (their programs are
        still compiled); ``None`` when they are the same or a program is missing."""
        rounds = self.opts.confirm_rounds
        best_id = best.get("measured_id", best["id"])
        if rounds < 1 or best_id == base["id"] or base["status"] != bench.OK:
            return None
        roles = {"baseline": base, "best": self.trials[best_id]}
        times: Dict[tuple, List[float]] = {}
        for _ in range(rounds):
            for role, trial in roles.items():
                for name, shape in self.shapes.items():
                    for pass_ in PASSES:
                        key = (("fwd", _fwd_key(trial["tuning"], shape, self.op))
                               if pass_ == "fwd"
                               else ("fwdbwd", trial["id"], name))
                        exe = self.kept.get(key)
                        if exe is None:
                            return None
                        args = self.inputs[name]
                        times.setdefault((role, name, pass_), []).extend(bench.time_calls(
                            lambda exe=exe, args=args: exe(*args),
                            warmup=self.opts.warmup, iters=self.opts.iters))
        out: Dict[str, Any] = {"rounds": rounds}
        for role in roles:
            out[role] = {name: {f"{p}_ms": round(_median_ms(times[(role, name, p)]), 4)
                                for p in PASSES} for name in self.shapes}
        out["speedup"] = {name: {p: round(out["baseline"][name][f"{p}_ms"]
                                          / out["best"][name][f"{p}_ms"], 4) for p in PASSES}
                          for name in self.shapes}
        obj = {role: sum(out[role][n]["fwdbwd_ms"] for n in self.shapes) for role in roles}
        out["objective_speedup"] = round(obj["baseline"] / obj["best"], 4)
        self.log(f"confirmation ({rounds} alternating rounds): objective speed-up "
                 f"{out['objective_speedup']:.3f}x")
        return out

    def _check(self, best) -> dict:
        """Relative RMS errors of the kernels under the ``best`` trial's TUNING against the fp32
        reference at ``--check_shape`` (reusing its compiled programs when that is a sweep
        shape)."""
        tuning = best["tuning"]
        (name, shape), = parse_shapes(self.opts.check_shape).items()
        self.log(f"correctness check at {name} with the best configuration")
        out = dict(shape=list(shape), tuning=_jsonable(tuning),
                   limits=dict(o=ERROR_LIMITS["o"], grads=GRAD_LIMIT))
        reason = invalid_reason(tuning, {name: shape}, self.op)
        if reason:
            out.update(ok=False, status=reason)
            return out
        set_tuning(tuning, self.op)
        args = make_inputs(shape, self.opts.seed + 1, self.op)  # (q, k, v, gates..., do)
        f32 = tuple(x.astype(jnp.float32) for x in args)  # the gates are fp32 already
        ours = programs(OP_FUNCTIONS[self.op](self.impl))
        ref = programs(OP_FUNCTIONS[self.op]("reference"))
        calls = {("ours", p): (ours[p], args) for p in PASSES}
        calls.update({("ref", p): (ref[p], f32) for p in PASSES})
        kept = {}
        for sweep_name, sweep_shape in self.shapes.items():
            if sweep_shape == shape:  # the best's programs at this shape are still compiled
                kept = {("ours", "fwd"): self.kept.get(("fwd", _fwd_key(tuning, shape,
                                                                        self.op))),
                        ("ours", "fwdbwd"): self.kept.get(
                            ("fwdbwd", best.get("measured_id", best["id"]), sweep_name))}
                kept = {key: exe for key, exe in kept.items() if exe is not None}
        out["reused_programs"] = sorted(p for _, p in kept)

        def run_all():
            lowered = {key: jax.jit(fn).trace(*args).lower() for key, (fn, args) in calls.items()
                       if key not in kept}
            compiled = bench.compile_concurrently(lowered, max_workers=self.workers,
                                                  log=lambda s: None)
            compiled.update({key: (exe, bench.OK, 0.0) for key, exe in kept.items()})
            results = {}
            for key, (exe, status, _) in compiled.items():
                if status != bench.OK:
                    raise RuntimeError(f"{key}: {status}")
                results[key] = exe(*calls[key][1])
            return results

        results, status = bench.guarded(run_all)
        if status != bench.OK:
            out.update(ok=False, status=status)
            self.log(f"correctness check: {status}")
            return out
        errors = {"o": rel_rms(results[("ours", "fwd")], results[("ref", "fwd")])}
        for gname, got, want in zip(FAMILIES[self.op].grads,  # o (last) is in fwd
                                    results[("ours", "fwdbwd")], results[("ref", "fwdbwd")]):
            errors[gname] = rel_rms(got, want)
        ok = all(e < ERROR_LIMITS.get(n, GRAD_LIMIT) for n, e in errors.items())
        out.update(errors={n: float(f"{e:.3e}") for n, e in errors.items()}, ok=ok,
                   status=bench.OK if ok else "error: relative RMS error over the limit")
        self.log(f"correctness check: {'green' if ok else 'RED'} " + ", ".join(
            f"{n} {e:.2e}" for n, e in errors.items()))
        return out

    # -- report --------------------------------------------------------------------------------

    def payload(self) -> dict:
        """The JSON report.

        Returns:
          ``dict(environment, settings, baseline, start, trials, descent, best, confirm, check,
          elapsed_s, stopped_by_budget)``. Each trial: ``id``, ``knob`` and ``value`` (``None``
          for the baseline/start), ``tuning`` (the full TUNING, launch values as lists),
          ``status`` (``"ok"``, ``"error: ..."``, ``"out of memory"``, ``"skipped (time
          budget)"``), ``shapes`` ``{name: {fwd_ms, fwd_min_ms, fwdbwd_ms, fwdbwd_min_ms[,
          fwd_from]}}`` (ms per call; median and minimum), ``objective_ms`` (sum of fwdbwd_ms
          over shapes), ``same_as`` where an earlier trial has the same effective knobs.
        """
        base = self.trials[0] if self.trials else None
        best = self.best
        best_trial = None if best is None else self.trials[best.get("measured_id", best["id"])]
        best_out = None
        if best is not None:
            best_out = dict(tuning=_jsonable(best["tuning"]), trial=best_trial["id"],
                            objective_ms=best_trial["objective_ms"],
                            speedup_vs_baseline=_ratio(base["objective_ms"],
                                                       best_trial["objective_ms"]),
                            python=tuning_literal(best["tuning"], self.op))
        return dict(
            environment=self.env,
            settings=dict(op=self.op, module=FAMILIES[self.op].path,
                          shapes={n: list(s) for n, s in self.shapes.items()},
                          knobs={k: [_jsonable_value(v) for v in vs]
                                 for k, vs in self.plan.items()},
                          iters=self.opts.iters, warmup=self.opts.warmup,
                          interpret=self.interpret, implementation=self.impl,
                          time_budget_s=self.opts.time_budget_s,
                          check_reserve_s=self.opts.check_reserve_s,
                          check_shape=self.opts.check_shape, seed=self.opts.seed,
                          objective="sum over shapes of the fwd+bwd median (ms)"),
            baseline=dict(tuning=_jsonable(self.baseline), trial=0,
                          objective_ms=None if base is None else base["objective_ms"]),
            start=_jsonable(self.start),
            trials=[{**t, "tuning": _jsonable(t["tuning"]),
                     "value": _jsonable_value(t["value"])} for t in self.trials],
            descent=[{**d, "value": _jsonable_value(d["value"])} for d in self.descent],
            best=best_out, confirm=self.confirm, check=self.check,
            elapsed_s=round(self.budget.elapsed(), 1), stopped_by_budget=self.stopped_by_budget,
        )

    def _write(self) -> None:
        if self.opts.out:
            payload = self.payload()
            bench.write_report(self.opts.out, payload, markdown(payload))


# ----------------------------------------------------------------------------------------------
# Formatting.


def _fmt_value(value) -> str:
    if isinstance(value, (tuple, list)):
        return "x".join(str(x) for x in value)
    return str(value)


def _jsonable_value(value):
    if isinstance(value, dict):  # a launch per head dim
        return {str(d): list(v) for d, v in value.items()}
    return list(value) if isinstance(value, tuple) else value


def _jsonable(tuning: Mapping[str, Any]) -> dict:
    return {k: _jsonable_value(v) for k, v in tuning.items()}


def _ratio(a, b) -> Optional[float]:
    return None if not a or not b else round(a / b, 4)


def tuning_literal(tuning: Mapping[str, Any], op: str = "gdn") -> str:
    """The TUNING dict as Python source to paste into the op's kernel_gpu.py.

    Args:
      tuning: a TUNING dict (launch values as tuples or lists).
      op: ``--op`` (whose module's key order to follow).

    Returns:
      ``TUNING = {...}`` over several lines, in the module's TUNING key order, tuples for the
      launch values.
    """
    family = FAMILIES[op]
    order = list(family.module.TUNING) or list(family.launch_knobs + BLOCK_KNOBS)
    order += [k for k in tuning if k not in order]
    lines = ["TUNING = {"]
    for key in order:
        value = tuning[key]
        if isinstance(value, dict):  # a launch per head dim (keys are strings after JSON)
            value = {int(d): tuple(v) for d, v in value.items()}
        lines.append(f"    {key!r}: {tuple(value) if isinstance(value, list) else value!r},"
                     .replace("'", '"'))
    return "\n".join(lines + ["}"])


def markdown(payload: Mapping[str, Any]) -> str:
    """The Markdown report.

    Args:
      payload: :meth:`Sweep.payload` (or its JSON round trip).

    Returns:
      The setup, the best TUNING as a Python literal, its speed-up over the baseline per shape
      and pass (sweep and confirmation timings), the correctness check, the descent and every
      configuration tried (times in ms per call). In interpret mode (``settings.interpret``) the
      headline speed-up and the TUNING literal are replaced by :data:`INTERPRET_NOTE`.
    """
    env, st = payload["environment"], payload["settings"]
    family = FAMILIES[st.get("op", "gdn")]  # reports from before --op are gdn's
    names = list(st["shapes"])
    trials = payload["trials"]
    base_obj = payload["baseline"]["objective_ms"]
    lines = [
        f"# Launch-parameter sweep: {family.title} ({family.path})", "",
        f"Device: {env.get('device_kind')} ({env.get('backend')}); jax {env.get('jax')}, "
        f"jaxlib {env.get('jaxlib')}; {env.get('date_utc')}.", "",
        f"Command: `{env.get('command')}`", "",
        "Shapes: " + ", ".join(f"{n} = (B={s[0]}, T={s[1]}, H={s[2]}, D={s[3]})"
                               for n, s in st["shapes"].items())
        + f". {family.inputs}; implementation `{st['implementation']}`. Times: wall-clock "
        f"median per call in ms of {st['iters']} jitted calls after {st['warmup']} warm-up "
        f"calls. Objective: {st['objective']}. Coordinate descent over "
        f"{', '.join(st['knobs'])}.", "",
        f"Elapsed {payload['elapsed_s']} s of a {st['time_budget_s']} s budget"
        + ("; **stopped by the time budget** (knobs not reached are listed as skipped)."
           if payload["stopped_by_budget"] else "."), "",
    ]
    best = payload["best"]
    if best:
        bt = trials[best["trial"]]
        lines += ["## Best configuration", ""]
        if st.get("interpret"):
            lines += [INTERPRET_NOTE, ""]
        else:
            lines += [f"Trial #{best['trial']}, objective {bench.fmt(best['objective_ms'])} ms vs "
                      f"baseline {bench.fmt(base_obj)} ms: speed-up "
                      f"{bench.fmt(best['speedup_vs_baseline'], '.3f')}x (sweep timings)"
                      + (". **Slower than the baseline** (a --start elsewhere): keep the current "
                         "TUNING." if (best["speedup_vs_baseline"] or 1.0) < 1.0 else "."), "",
                      f"Paste into `{family.path}`:", "",
                      "```python", best["python"], "```", ""]
        lines += ["| shape | pass | baseline (sweep) | best (sweep) | speed-up | baseline "
                  "(confirm) | best (confirm) | speed-up (confirm) |",
                  "|---|---|---:|---:|---:|---:|---:|---:|"]
        conf = payload.get("confirm")
        for n in names:
            for p in PASSES:
                b = trials[0]["shapes"].get(n, {}).get(f"{p}_ms")
                x = bt["shapes"].get(n, {}).get(f"{p}_ms")
                cb = conf["baseline"][n][f"{p}_ms"] if conf else None
                cx = conf["best"][n][f"{p}_ms"] if conf else None
                lines.append(f"| {n} | {p} | {bench.fmt(b)} | {bench.fmt(x)} | "
                             f"{bench.fmt(_ratio(b, x), '.3f')} | {bench.fmt(cb)} | "
                             f"{bench.fmt(cx)} | {bench.fmt(_ratio(cb, cx), '.3f')} |")
        if conf:
            lines += ["", f"Confirmation: baseline and best re-timed in {conf['rounds']} "
                      f"alternating rounds; objective speed-up "
                      f"{conf['objective_speedup']:.3f}x."]
        lines.append("")
    check = payload.get("check")
    if check:
        errs = check.get("errors") or {}
        lines += ["## Correctness check", "",
                  f"Best configuration at (B, T, H, D) = {tuple(check['shape'])} against the fp32 "
                  f"`lax.scan` reference (relative RMS error; limits o < {check['limits']['o']}, "
                  f"gradients < {check['limits']['grads']}): **"
                  + ("green" if check.get("ok") else "RED") + "** "
                  + ", ".join(f"{n} {e:.2e}" for n, e in errs.items())
                  + ("" if check.get("ok") else f" ({check.get('status')})"), ""]
    if payload["descent"]:
        lines += ["## Descent", "", "| knob | kept | objective (ms) | trial | tried |",
                  "|---|---|---:|---:|---|"]
        for d in payload["descent"]:
            lines.append(f"| {d['knob']} | {_fmt_value(d['value'])} | "
                         f"{bench.fmt(d['objective_ms'])} | #{d['trial']} | "
                         + ", ".join(f"#{i}" for i in d["tried"]) + " |")
        lines.append("")
    head = "| # | knob | value | " + " | ".join(f"{n} fwd | {n} fwd+bwd" for n in names) + \
        " | objective | vs baseline | status |"
    lines += ["## All configurations", "",
              "Times in ms (median per call). `fwd` marked * is reused from the trial that first "
              "compiled the same forward program; 'same as #i' rows were not re-measured.", "",
              head, "|" + "---|" * 3 + "---:|" * (2 * len(names) + 2) + "---|"]
    for t in trials:
        label = t.get("role", "") if t["knob"] is None else t["knob"]
        cells = []
        for n in names:
            r = t["shapes"].get(n, {})
            star = "*" if "fwd_from" in r else ""
            cells += [bench.fmt(r.get("fwd_ms")) + star, bench.fmt(r.get("fwdbwd_ms"))]
        status = t["status"] if "same_as" not in t else f"same as #{t['same_as']}"
        value = "–" if t["knob"] is None else _fmt_value(t["value"])
        lines.append(f"| {t['id']} | {label} | {value} | " + " | ".join(cells)
                     + f" | {bench.fmt(t['objective_ms'])} | "
                     f"{bench.fmt(_ratio(base_obj, t['objective_ms']), '.3f')} | {status} |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------
# Entry point.


def main(argv: Optional[Sequence[str]] = None) -> Optional[dict]:
    """Parses ``argv`` (without the program name; ``None``: ``sys.argv[1:]``) and runs the sweep.

    The TUNING of the ``--op``'s kernel module (``gated_delta_rule/kernel_gpu.py`` for gdn,
    ``common/channelwise_gpu.py`` for kda and gdn2) is restored, and JAX's caches cleared, whatever
    happens.

    Returns:
      The payload written to ``<out>.json`` (:meth:`Sweep.payload`), or ``None`` for ``--help``.

    Raises:
      app.UsageError: on a bad flag or flag value (e.g. an unknown knob name), or without
        ``--interpret`` on a backend other than GPU (checked before anything is traced).
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--help" in argv or "-h" in argv:
        fv = flags.FlagValues()
        _define_flags(fv)
        print(__doc__ + "\nFlags:\n" + fv.get_help())
        return None
    fv = parse_flags(argv)
    backend = jax.default_backend()
    if backend != "gpu" and not fv.interpret:
        raise app.UsageError(f"the Pallas GPU kernels need a GPU backend (found {backend}); "
                             "pass --interpret for a CPU smoke run")
    original = dict(FAMILIES[fv.op].module.TUNING)
    try:
        return Sweep(fv, argv, original).run()
    finally:
        set_tuning(original, fv.op)


def baseline_failure(payload: Optional[Mapping[str, Any]]) -> Optional[str]:
    """Why the run failed as a whole: the baseline configuration (trial #0), which every
    speed-up is measured against, did not run; ``None`` when it did (or for ``--help``)."""
    trials = (payload or {}).get("trials") or []
    if not trials or trials[0]["status"] == bench.OK:
        return None
    status = " ".join(str(trials[0]["status"]).split())
    status = status[len("error: "):] if status.startswith("error: ") else status
    return (f"the baseline configuration (trial #0) failed ({status}); no speed-up can be "
            "measured against it (the report lists every trial)")


def _cli() -> None:
    try:
        payload = main()
    except app.UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    reason = baseline_failure(payload)
    if reason:  # the report is written: say why in one line and exit non-zero
        print(f"error: {reason}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    _cli()
