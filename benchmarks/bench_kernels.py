r"""Kernel benchmark: our ops against fla (Triton, torch) and jax-linear-attention on one GPU.

Protocol (../shared/BENCHMARKS.md §5): identical inputs for every peer (generated from one numpy
seed in each process, bf16 q/k/v, unit-norm k, scale K^-0.5, fp32 gates g = logsigmoid(N(0, 1))
and beta/b/w = sigmoid(N(0, 1)), Lightning with FLA's fixed per-head decay of layer 0 of 12);
passes ``fwd`` (plain call) and ``fwdbwd`` (forward plus the VJP of a fixed bf16 cotangent,
gradients for q, k, v and the gates); a correctness gate (relative RMS error of o and of every
gradient against our fp32 ``lax.scan`` reference at (2, 2048, 4, 128)) before any time counts.
Times per call (§5.4): the primary metric, kernel time, is the summed device duration of every
kernel one call launches over ``--iters`` calls (JAX: a ``jax.profiler`` trace, Pallas kernels
and XLA glue alike; torch: ``torch.profiler`` self device time); wall clock is the median of
``--iters`` calls after ``--warmup`` calls with a device sync after each (JAX:
``block_until_ready``; torch: ``triton.testing.do_bench``, which also flushes L2), and for JAX
also the mean over ``--iters`` calls dispatched back to back with one sync. The same traces
give each record's per-kernel breakdown (``kernels``: ms per call of its largest kernels by
name, listed below the table), where a pass's time goes in ours and in the peers. fla runs in a
separate torch process started by this binary (``--torch_worker``), with
``FLA_DISABLE_BACKEND_DISPATCH=1`` and FLA's Triton-3.6 guard on the gated backward lifted for
timing only (fla issue #640: its dbeta/dg are then unreliable).

Shapes: S1 (B=8, T=4096, H=16, D=128), S2 (B=1, T=32768, H=16, D=128) and P1 (one 32768-token row
packed with 16 documents of pseudo-random lengths; fla gets ``cu_seqlens``, JAX ops
``segment_ids``). The floor R is the §3 roofline (identical for all three shapes).

Usage (on the GPU machine, after installing the peers' wheels from ../shared/tools/gpu-wheels.sh)::

    python benchmarks/bench_kernels.py --ops=gdn,deltanet,lightning,kda,gdn2 \
        --shapes=S1,S2,P1 --out=benchmarks/results/kernels-h200-<date>

writes ``<out>.json`` (one record per peer, op, shape and pass) and ``<out>.md`` (the tables).
With ``--mosaic_forward=fused_t0`` (or ``fused_t0_split``), ``--mosaic_t0_inverse``,
``--mosaic_t0_refine`` and ``--mosaic_t0_chunks_per_cta`` pick the variant of the ``T0`` kernel
(``chunk_kkt_inverse_mosaic``; its time is the ``gdn_chunk_kkt_inverse*`` entry of each
record's ``kernels``); ``pallas_kernels/common/MOSAIC_GPU.md`` Sec. 13 has the command. With
``fused_t0_split``, ``--mosaic_t0_split_order=prepare_first`` (or ``prepare_mid``) times
another order of the output warpgroup (the default is ``readout_first``; Sec. 16, 17) and
``--mosaic_t0_split_stages=3`` a three-stage TMA ring (Sec. 17),
``--mosaic_t0_split_state_layout=vk,kv`` the state warpgroup carrying ``S^T`` and the default
layout, one variant each (Sec. 35), ``--mosaic_t0_split_protocol=early_s`` the read-out's
``Q S_c`` on its own barrier (Sec. 40).
``--mosaic_forward=fused_rs`` times the primal-only forward with the state in registers (Sec. 56;
``--mosaic_rs_stages=2`` its two-stage ring, ``--mosaic_rs_protocol=ag_ahead`` the read-out
of chunk ``n`` after chunk ``n + 1``'s ``Ag``, Sec. 64; under differentiation it runs
``fused_t0``, or
with ``--mosaic_rs_residuals`` its own residual form, which stores ``h`` and ``v_new``, Sec. 58;
``--mosaic_rs_residual_from=state`` the form that stores the published tiles, Sec. 58.5;
``--mosaic_rs_pieces`` its kernel on the sequence pieces of rows with few CTAs, S2 and P1,
instead of ``fused_t0``'s, Sec. 60).
``--mosaic_gla_residual_h`` (op lightning, pass fwdbwd) keeps the fused forward's chunk
states as the backward's residual instead of recomputing them (Sec. 54);
``--mosaic_gla_stages=3`` gives its fused forward a three-stage TMA ring (Sec. 55).
``--mosaic_backward=split,fused,fused_ws`` times the GDN / DeltaNet Mosaic op once per
backward (``gated_delta_rule_mosaic``'s ``backward=``: stages 3 and 4, or the fused chunk-local
kernel ``gdn_chunk_bwd_fused`` on one or three warpgroups; Sec. 31), each with its own gate,
record and a table of their own. A plain value runs ``dv_local="separate"`` (stage 1's own
kernel ``gdn_chunk_dv_local``), whatever the op's default; a value with the suffix ``+fold``
(``fused_ws+fold``, the op's default since Sec. 32.2) runs that backward with ``dv_local="fold"``
(the reverse state pass forms ``dv_local`` itself, kernel ``gdn_chunk_delta_dh_fold``; Sec. 32),
so ``--mosaic_backward=fused_ws,fused_ws+fold`` times separate against fold in one run. A
further suffix ``+t0w`` (``fused_ws+fold+t0w``) also sets ``dh_w="t0"``: the folded reverse
pass forms ``W`` from ``T0`` (kernel ``gdn_chunk_delta_dh_fold_t0``) and the fused ``T0``
forward's ``T0`` kernel writes no ``W`` (Sec. 51; whole rows only: elsewhere the op runs the
stored ``W``), so ``--mosaic_backward=fused_ws+fold,fused_ws+fold+t0w`` times the two.

On a TPU (v4/v5e/v5p/v6e) the same binary times ``ours`` (``implementation="auto"``, which picks
the Pallas TPU kernels of ``kernel_tpu.py`` for all five ops) and ``chunked``; the GPU-only peers
(fla, jla) are skipped with a message::

    python benchmarks/bench_kernels.py --peers=ours,chunked --shapes=S1,S2,P1 \
        --out=benchmarks/results/kernels-tpu-<chip>-<date>
"""

import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np
from absl import app, flags

# The repository root, so that `python benchmarks/bench_kernels.py` finds the benchmarks
# package (its helpers are imported where they are used; the fla worker never needs them).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_OPS = flags.DEFINE_list("ops", ["gdn", "deltanet", "lightning", "kda", "gdn2"], "Ops to time.")
_SHAPES = flags.DEFINE_list("shapes", ["S1", "S2", "P1"], "Shapes: S1, S2, P1 or BxTxH.")
_PASSES = flags.DEFINE_list("passes", ["fwd", "fwdbwd"], "Passes: fwd, fwdbwd.")
_PEERS = flags.DEFINE_list("peers", ["ours", "chunked", "jla", "fla"],
                           "Implementations: ours (auto dispatch), chunked, jla, fla, and "
                           "mosaic (our Mosaic GPU kernels of issue 29, called directly, "
                           "whatever auto picks: lightning, gdn and deltanet, forward and "
                           "backward; Hopper or newer).")

# What the Mosaic GPU kernels (pallas_kernels/simple_gla/kernel_mosaic_gpu.py and
# pallas_kernels/gated_delta_rule/kernel_mosaic_gpu.py) cover so far: op -> passes.
# gdn / deltanet fwdbwd: the custom_vjp op mosaic_vjp.gated_delta_rule_mosaic (its backward's
# gpu tests first passed on the H200 on 2026-12-03), with the mosaic WY only.
_MOSAIC_PASSES = {"lightning": ("fwd", "fwdbwd"), "gdn": ("fwd", "fwdbwd"),
                  "deltanet": ("fwd", "fwdbwd")}
_MOSAIC_OPS = tuple(_MOSAIC_PASSES)


def _mosaic_passes(op: str) -> tuple:
    """The passes the ``mosaic`` peer runs for ``op``: :data:`_MOSAIC_PASSES`, forward only for
    gdn / deltanet with ``--mosaic_wy=xla`` (a forward-only comparison path)."""
    passes = _MOSAIC_PASSES.get(op, ())
    if op in ("gdn", "deltanet") and _MOSAIC_WY.value == "xla":
        return tuple(p for p in passes if p == "fwd")
    return passes


_MOSAIC_WY = flags.DEFINE_enum(
    "mosaic_wy", "mosaic", ["mosaic", "xla"],
    "Peer mosaic, gdn and deltanet: how the forward forms the WY factors W, U "
    "(gated_delta_rule_fwd_mosaic's wy_implementation): mosaic, the chunk_wy_mosaic kernel; "
    "xla, the fp32 XLA form of before 2026-12-03 (for comparison).")
_MOSAIC_FORWARD = flags.DEFINE_string(
    "mosaic_forward", None,
    "Peer mosaic: the forward= of the Mosaic ops (simple_gla_mosaic: two_pass or fused; "
    "gated_delta_rule_mosaic: three_pass, fused, fused_split, fused_t0, fused_t0_split or "
    "fused_rs, the primal-only forward with the state in registers, MOSAIC_GPU.md Sec. 56: "
    "pass fwd runs it, fwdbwd runs fused_t0 instead); "
    "unset: each op's "
    "default. "
    "Recorded with every mosaic record.")
_MOSAIC_RS_STAGES = flags.DEFINE_integer(
    "mosaic_rs_stages", None,
    "Peer mosaic, ops gdn / deltanet, --mosaic_forward=fused_rs: the depth of its TMA input "
    "ring (chunk_delta_fused_rs_fwd_mosaic's stages=, 2 or 3), set in mosaic_vjp.RS_OPTIONS "
    "for this process; unset: the deepest that fits in SMEM (3; MOSAIC_GPU.md Sec. 56). "
    "Recorded with every mosaic gdn / deltanet record (mosaic_rs_stages).")
_MOSAIC_RS_PROTOCOL = flags.DEFINE_enum(
    "mosaic_rs_protocol", None, ["joint", "ag_ahead"],
    "Peer mosaic, ops gdn / deltanet, --mosaic_forward=fused_rs: the output warpgroup's order "
    "(chunk_delta_fused_rs_fwd_mosaic's protocol=, kernel_mosaic_gpu_rs.RS_PROTOCOLS, set in "
    "mosaic_vjp.RS_OPTIONS for this process): joint (the default) or ag_ahead (chunk n + 1's "
    "Q K^T, mask, Ag and P before chunk n's read-out; MOSAIC_GPU.md Sec. 64). Recorded with "
    "every mosaic gdn / deltanet record (mosaic_rs_protocol).")
_MOSAIC_RS_RESIDUALS = flags.DEFINE_bool(
    "mosaic_rs_residuals", None,
    "Peer mosaic, ops gdn / deltanet, --mosaic_forward=fused_rs: sets mosaic_vjp.RS_RESIDUALS "
    "for this process: on, pass fwdbwd runs fused_rs's residual form (it stores h and v_new for "
    "the backward, MOSAIC_GPU.md Sec. 58) instead of falling back to fused_t0; unset: the "
    "op's default (off). Recorded with every mosaic gdn / deltanet record "
    "(mosaic_rs_residuals; mosaic_forward_run names the forward that ran).")
_MOSAIC_RS_RESIDUAL_FROM = flags.DEFINE_enum(
    "mosaic_rs_residual_from", None, ["output", "state"],
    "With --mosaic_rs_residuals: which warpgroup of fused_rs's residual form untransposes h and "
    "v_new (chunk_delta_fused_rs_fwd_mosaic's residual_from=, set in mosaic_vjp.RS_OPTIONS): "
    "output (the default: staging tiles, two stages at K = 128) or state (published "
    "untransposed, three stages; jax >= 0.11); MOSAIC_GPU.md Sec. 58.5. Recorded as "
    "mosaic_rs_residual_from.")
_MOSAIC_RS_PIECES = flags.DEFINE_bool(
    "mosaic_rs_pieces", None,
    "Peer mosaic, ops gdn / deltanet, --mosaic_forward=fused_rs: sets mosaic_vjp.RS_PIECES for "
    "this process: on, rows with too few CTAs (S2, P1) run fused_rs's kernel as the sequence "
    "pieces' last launch (MOSAIC_GPU.md Sec. 60) instead of falling back to fused_t0's pieces "
    "(under differentiation with --mosaic_rs_residuals only); unset: the op's default (off). "
    "Refused with --mosaic_t0_pieces=false. Recorded with every mosaic gdn / deltanet record "
    "(mosaic_rs_pieces; mosaic_forward_run and mosaic_pieces_run name what ran).")
_MOSAIC_GLA_RESIDUAL_H = flags.DEFINE_bool(
    "mosaic_gla_residual_h", None,
    "Peer mosaic, op lightning, pass fwdbwd: the residual_h= of simple_gla_mosaic: on, the "
    "fused forward stores its chunk states h and the backward uses them instead of "
    "recomputing them with chunk_states_mosaic (MOSAIC_GPU.md Sec. 54; applies where the "
    "forward resolves to fused under differentiation: --mosaic_forward=fused, or the default "
    "auto on rows without sequence pieces); unset: kernel_mosaic_gpu.RESIDUAL_H (off). "
    "Recorded with every mosaic lightning record (mosaic_gla_residual_h: the value in force, "
    "mosaic_forward_run: the forward the fwd or fwdbwd pass resolved to).")
_MOSAIC_GLA_STAGES = flags.DEFINE_integer(
    "mosaic_gla_stages", None,
    "Peer mosaic, op lightning: the depth of simple_gla_fused_fwd_mosaic's TMA input ring "
    "(stages=, at least 2; 2 is the default, 3 fits the SMEM at K = V = 128; MOSAIC_GPU.md "
    "Sec. 55), set in kernel_mosaic_gpu.FUSED_OPTIONS for this process; applies where the "
    "forward resolves to fused (refused with --mosaic_forward=two_pass). Recorded with every "
    "mosaic lightning record (mosaic_gla_stages: the value in force, null for the default).")
_MOSAIC_T0_PIECES = flags.DEFINE_bool(
    "mosaic_t0_pieces", None,
    "Peer mosaic, gdn and deltanet: set mosaic_vjp.FUSED_T0_PIECES for this process: on, the "
    "fused_t0 forward (the default) runs rows with few CTAs (S2, P1, the gate's shape) as "
    "sequence pieces (MOSAIC_GPU.md Sec. 42; the op's default since 2026-12-06g); off "
    "(--nomosaic_t0_pieces), it falls back to three_pass there; unset: the op's default. "
    "Recorded with every mosaic record (mosaic_t0_pieces: the value in force).")
_MOSAIC_PIECE_SKIP = flags.DEFINE_bool(
    "mosaic_piece_skip", None,
    "Peer mosaic, gdn and deltanet: set mosaic_vjp.PIECE_SKIP for this process: on, the fused_t0 "
    "forward's sequence pieces (rows with few CTAs) skip what a document start cuts (the maps "
    "launch writes M_p = 0 for a piece with a document start, the summary launch starts at the "
    "piece's last one; MOSAIC_GPU.md Sec. 52; only with documents, e.g. P1); unset: the op's "
    "default (off). Recorded with every mosaic record (mosaic_piece_skip: the value in force).")
_MOSAIC_MAPS_CARRY_X = flags.DEFINE_bool(
    "mosaic_maps_carry_x", None,
    "Peer mosaic, gdn and deltanet: set mosaic_vjp.MAPS_CARRY_X for this process: on, the "
    "fused_t0 forward's sequence pieces (rows with few CTAs: S2, P1) form their maps M_p and "
    "their passes from zero X_p in one launch (gdn_chunk_delta_h_maps_x; no summary launch; "
    "MOSAIC_GPU.md Sec. 57; composes with --mosaic_piece_skip); unset: the op's default (off). "
    "Recorded with every mosaic record (mosaic_maps_carry_x: the value in force).")
_MOSAIC_APPROX_MATH = flags.DEFINE_bool(
    "mosaic_approx_math", None,
    "Every Mosaic GPU kernel of ours (peers mosaic and ours: GDN, DeltaNet, simple_gla, the "
    "per-channel passes): set mosaic_gpu_lib.APPROX_MATH for this process, Mosaic GPU's "
    "approx_math (jnp.exp as ex2.approx, as jla compiles; MOSAIC_GPU.md Sec. 44); unset: the "
    "default (on since 2026-12-07d). Recorded with every record (mosaic_approx_math: the "
    "value in force).")
_MOSAIC_T0_INVERSE = flags.DEFINE_string(
    "mosaic_t0_inverse", None,
    "Peer mosaic, gdn and deltanet with --mosaic_forward=fused_t0 or fused_t0_split: the "
    "inverse= of the T0 kernel chunk_kkt_inverse_mosaic (substitution, the default since "
    "2026-12-04d, or doubling: MOSAIC_GPU.md Sec. 13, 15); unset: the default. Recorded with "
    "every mosaic record.")
_MOSAIC_T0_REFINE = flags.DEFINE_string(
    "mosaic_t0_refine", None,
    "Peer mosaic, as --mosaic_t0_inverse: the refine= of chunk_kkt_inverse_mosaic (newton "
    "or split_merge: hi/lo split merges and no Newton step, with the substitution only; "
    "MOSAIC_GPU.md Sec. 15); unset: the inverse's default (split_merge for the "
    "substitution, newton for the doubling). Recorded with every mosaic record.")
_MOSAIC_T0_CPC = flags.DEFINE_integer(
    "mosaic_t0_chunks_per_cta", None,
    "Peer mosaic, as --mosaic_t0_inverse: the chunks_per_cta= of chunk_kkt_inverse_mosaic "
    "(>= 1); unset: its rule kkt_chunks_per_cta (8 at S1). Recorded with every mosaic record.")
_MOSAIC_T0_SPLIT_ORDER = flags.DEFINE_string(
    "mosaic_t0_split_order", None,
    "Peer mosaic, gdn and deltanet with --mosaic_forward=fused_t0_split: the split_order= of "
    "chunk_delta_fused_t0_fwd_mosaic (readout_first, the default since 2026-12-04f, "
    "prepare_first, prepare_mid, state_ag or shared_mask: MOSAIC_GPU.md Sec. 16, 17, 35); "
    "unset: the default. Recorded "
    "with every mosaic record.")
_MOSAIC_T0_SPLIT_STAGES = flags.DEFINE_integer(
    "mosaic_t0_split_stages", None,
    "Peer mosaic, as --mosaic_t0_split_order: the split_stages= of "
    "chunk_delta_fused_t0_fwd_mosaic, the depth of its TMA input ring (2, the default, or 3: "
    "MOSAIC_GPU.md Sec. 17); unset: the default. Recorded with every mosaic record.")
_MOSAIC_T0_SPLIT_STATE = flags.DEFINE_list(
    "mosaic_t0_split_state_layout", [],
    "Peer mosaic, as --mosaic_t0_split_order: the state_layout= values of "
    "chunk_delta_fused_t0_fwd_mosaic to time, each as its own variant in this process with "
    "its own gate (kv, the default, and vk: the state warpgroup carries S^T with register "
    "left operands, MOSAIC_GPU.md Sec. 35); unset: the default once. Recorded in each "
    "mosaic record's mosaic_t0.")
_MOSAIC_T0_SPLIT_PROTOCOL = flags.DEFINE_string(
    "mosaic_t0_split_protocol", None,
    "Peer mosaic, as --mosaic_t0_split_order: the split_protocol= of "
    "chunk_delta_fused_t0_fwd_mosaic (joint, the default: one barrier once S_c and v_new are "
    "published; early_s: S_c announced on its own barrier, so the read-out's Q S_c is issued "
    "before v_new exists, MOSAIC_GPU.md Sec. 40; layout kv only); unset: the default. "
    "Recorded with every mosaic record.")
_MOSAIC_BACKWARD = flags.DEFINE_list(
    "mosaic_backward", [],
    "Peer mosaic, ops gdn and deltanet, pass fwdbwd: the backward= of gated_delta_rule_mosaic "
    "(split: stages 3 and 4, chunk_delta_grads_partials_mosaic + chunk_wy_bwd_mosaic; fused: "
    "the one kernel chunk_bwd_fused_mosaic with T0 from the fused_t0 forwards or "
    "chunk_kkt_inverse_mosaic, one warpgroup; fused_ws: the same on three warpgroups; "
    "MOSAIC_GPU.md Sec. 31), with dv_local=separate; the suffix +fold (e.g. fused_ws+fold) "
    "sets dv_local=fold instead (the reverse state pass forms dv_local, Sec. 32), and "
    "+fold+t0w (fused_ws+fold+t0w) also dh_w=t0 (the reverse pass forms W from T0, the T0 "
    "kernel writes no W; Sec. 51). Several "
    "(split,fused,fused_ws) time mosaic once per value, each with its own gate and record "
    "(field mosaic_backward) and a table of their own below the main one; empty: the op's "
    "defaults (fused_ws+fold), not recorded.")
_CW_STATE_PASS = flags.DEFINE_list(
    "channelwise_state_pass", [],
    "Peer ours, ops kda and gdn2: the state passes of the channelwise kernels "
    "(pallas_kernels/common/channelwise_gpu.TUNING['state_pass']: triton, or mosaic, the "
    "Hopper kernels channelwise_mosaic_gpu.channelwise_forward_mosaic and "
    "channelwise_backward_state_mosaic; MOSAIC_GPU.md Sec. 18). "
    "Several (triton,mosaic) time ours once per value, each with its own gate and record "
    "(field channelwise_state_pass) and a table of their own below the main one; empty: "
    "TUNING's default, not recorded.")
_CW_GRAD_PASS = flags.DEFINE_list(
    "channelwise_grad_pass", [],
    "Peer ours, ops kda and gdn2, pass fwdbwd: the gradients through Mq and Mk of the "
    "channelwise backward (pallas_kernels/common/channelwise_gpu.TUNING['grad_pass']: triton, "
    "the grad_blocks kernel; mosaic, K1 channelwise_grad_mosaic_gpu."
    "channelwise_grad_intra_mosaic, MOSAIC_GPU.md Sec. 20; or mosaic_fused, K2 "
    "channelwise_grad_chunk_mosaic, which also replaces backward_chunk and the kr chain rule, "
    "Sec. 21). As --channelwise_state_pass: "
    "several values time ours once per value (times each --channelwise_state_pass value), each "
    "with its own gate and record (field channelwise_grad_pass) and a table of their own; "
    "empty: TUNING's default, not recorded.")
_BREAKDOWN_TOP = flags.DEFINE_integer(
    "breakdown_top", 8,
    "Kernels named in each record's per-kernel breakdown (record field kernels), largest "
    "first; the rest are summed as (other). Raise it where a pass launches more kernels than "
    "that and the tables' per-kernel columns must see them all (KDA fwd+bwd with the Mosaic "
    "state passes' sequence pieces at S2: MOSAIC_GPU.md Sec. 30, 37).", lower_bound=1)
_ITERS = flags.DEFINE_integer("iters", 30, "Timed calls per measurement.")
_WARMUP = flags.DEFINE_integer("warmup", 5, "Untimed calls before timing.")
_OUT = flags.DEFINE_string("out", None, "Output path prefix for .json and .md.")
_GATE_SHAPE = flags.DEFINE_string("gate_shape", "2x2048x4", "BxTxH of the correctness gate.")
_DIM = flags.DEFINE_integer("dim", 128, "Head dim K = V.")
_TORCH_WORKER = flags.DEFINE_bool("torch_worker", False, "Internal: time fla in this process.")
_TUNING = flags.DEFINE_string(
    "tuning", None,
    'JSON overrides of the kernels\' launch parameters before timing, e.g. '
    '\'{"scalar": {"backward_chunk": [8, 1], "block_k": 64}, "channelwise": {"prepare": [8, 1]}}\' '
    "(scalar: pallas_kernels/gated_delta_rule/kernel_gpu.TUNING; channelwise: "
    "pallas_kernels/common/channelwise_gpu.TUNING). Recorded with every record.")
_CHUNKED_SHAPES = flags.DEFINE_list(
    "chunked_shapes", ["S1"], "Shapes at which the chunked JAX form is timed (it is slow).")
_FLA_CACHE = flags.DEFINE_string(
    "fla_autotune_cache", None,
    "Directory for the fla worker's Triton cache with autotune results kept "
    "(TRITON_CACHE_DIR + TRITON_CACHE_AUTOTUNING=1): a later run given the same directory "
    "compiles only each kernel's chosen config instead of re-tuning (minutes per op on a fresh "
    "machine). Timings are still taken in the run.")

# Floors (ms) at N = 524,288 token-heads, D = 128 (BENCHMARKS.md §3): (fwd, fwd+bwd).
FLOOR_MS = {"gdn": (0.126, 0.371), "deltanet": (0.126, 0.371), "lightning": (0.125, 0.34),
            "kda": (0.187, None), "gdn2": (0.312, None)}
SHAPES = {"S1": (8, 4096, 16), "S2": (1, 32768, 16), "P1": (1, 32768, 16)}


def _shape(name):
    """``(B, T, H)`` of a named shape or of ``"BxTxH"`` (``"P"`` prefix: packed documents)."""
    if name in SHAPES:
        return SHAPES[name]
    return tuple(int(x) for x in name.lstrip("P").lower().split("x"))


def _doc_lengths(total, n_docs, seed=1):
    rng = np.random.default_rng(seed)
    cuts = np.sort(rng.choice(np.arange(1, total), n_docs - 1, replace=False))
    return np.diff(np.concatenate([[0], cuts, [total]]))


def make_inputs(op, batch, seq_len, heads, dim, packed, seed=0):
    """numpy inputs (fp32; q, k, v are rounded to bf16 by each framework identically)."""
    rng = np.random.default_rng(seed)
    shape = (batch, seq_len, heads, dim)
    q = rng.standard_normal(shape, np.float32)
    k = rng.standard_normal(shape, np.float32)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal(shape, np.float32)
    do = rng.standard_normal(shape, np.float32)

    def logsig(x):
        return -np.logaddexp(0.0, -x)

    def sig(x):
        return 1.0 / (1.0 + np.exp(-x))

    out = dict(q=q, k=k, v=v, do=do)
    if op in ("gdn",):
        out["g"] = logsig(rng.standard_normal(shape[:3], np.float32)).astype(np.float32)
    if op in ("gdn", "deltanet", "kda"):
        out["beta"] = sig(rng.standard_normal(shape[:3], np.float32)).astype(np.float32)
    if op in ("kda", "gdn2"):
        out["g"] = logsig(rng.standard_normal(shape, np.float32)).astype(np.float32)
    if op == "gdn2":
        out["b"] = sig(rng.standard_normal(shape, np.float32)).astype(np.float32)
        out["w"] = sig(rng.standard_normal(shape, np.float32)).astype(np.float32)
    if op == "lightning":
        out["g_gamma"] = (-(8.0 / heads) * np.arange(heads)).astype(np.float32)
    if packed:
        lengths = _doc_lengths(seq_len, 16)
        out["segment_ids"] = np.repeat(np.arange(16), lengths)[None].astype(np.int32)
        out["cu_seqlens"] = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return out


def _gate_names(op):
    return {"gdn": ("g", "beta"), "deltanet": ("beta",), "lightning": (),
            "kda": ("g", "beta"), "gdn2": ("g", "b", "w")}[op]


# ---------------------------------------------------------------------------------------------
# JAX side: ours, our chunked form, jla.


def _jax_fn(op, peer, segment_ids):
    import jax.numpy as jnp

    from pallas_kernels import gated_delta_rule as gdr
    from pallas_kernels import gdn2 as gdn2_ops
    from pallas_kernels import kda as kda_ops
    from pallas_kernels import simple_gla as sg

    if peer == "jla":
        import jla.ops as jla_ops
        kind = {"gdn": "gated_deltanet", "deltanet": "deltanet", "lightning": "simple_gla",
                "kda": "kda", "gdn2": "gdn2"}[op]

        def fn(q, k, v, **gates):
            if op == "lightning":
                gates = dict(g=jnp.broadcast_to(gates.pop("g_gamma"), q.shape[:3]))
            o = jla_ops.linear_attention(kind, q, k, v, impl="mosaic_gpu",
                                         scale=q.shape[-1] ** -0.5, segment_ids=segment_ids,
                                         **gates)
            return o[0]
        return fn
    if peer == "mosaic":
        from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu as gdr_mosaic
        from pallas_kernels.gated_delta_rule import mosaic_vjp
        from pallas_kernels.simple_gla import kernel_mosaic_gpu as kmg

        def fn(q, k, v, **gates):
            if op not in _MOSAIC_OPS:  # run_jax skips these; a direct caller gets told
                raise ValueError(f"peer mosaic covers {', '.join(_MOSAIC_OPS)}, not {op}")
            forward = {} if _MOSAIC_FORWARD.value is None else {"forward": _MOSAIC_FORWARD.value}
            if op in ("gdn", "deltanet") and _MOSAIC_WY.value == "xla":  # forward only
                return gdr_mosaic.gated_delta_rule_fwd_mosaic(
                    q, k, v, gates.get("g"), gates["beta"], scale=q.shape[-1] ** -0.5,
                    segment_ids=segment_ids, wy_implementation="xla", **forward)[0]
            if op in ("gdn", "deltanet"):
                backward = mosaic_backward_options(_MOSAIC_BACKWARD_NOW[0])
                return mosaic_vjp.gated_delta_rule_mosaic(
                    q, k, v, gates.get("g"), gates["beta"], scale=q.shape[-1] ** -0.5,
                    segment_ids=segment_ids, **forward, **backward)[0]
            g = jnp.broadcast_to(gates["g_gamma"], q.shape[:3])
            return kmg.simple_gla_mosaic(q, k, v, g, scale=q.shape[-1] ** -0.5,
                                         segment_ids=segment_ids,
                                         residual_h=_MOSAIC_GLA_RESIDUAL_H.value, **forward)[0]
        return fn
    impl = None if peer == "ours" else "chunked"
    kw = dict(segment_ids=segment_ids, implementation=impl)

    def fn(q, k, v, **gates):
        if op == "gdn":
            return gdr.gated_delta_rule(q, k, v, gates["g"], gates["beta"], **kw)[0]
        if op == "deltanet":
            return gdr.delta_rule(q, k, v, gates["beta"], **kw)[0]
        if op == "lightning":
            return sg.lightning_attention(q, k, v, gates["g_gamma"], **kw)[0]
        if op == "kda":
            return kda_ops.kda(q, k, v, gates["g"], gates["beta"], **kw)[0]
        return gdn2_ops.gdn2(q, k, v, gates["g"], gates["b"], gates["w"], **kw)[0]
    return fn


def _jax_reference(op, segment_ids):
    """fp32 token-serial reference (``implementation="reference"``)."""
    from pallas_kernels import gated_delta_rule as gdr
    from pallas_kernels import gdn2 as gdn2_ops
    from pallas_kernels import kda as kda_ops
    from pallas_kernels import simple_gla as sg
    kw = dict(segment_ids=segment_ids, implementation="reference")

    def fn(q, k, v, **gates):
        if op == "gdn":
            return gdr.gated_delta_rule(q, k, v, gates["g"], gates["beta"], **kw)[0]
        if op == "deltanet":
            return gdr.delta_rule(q, k, v, gates["beta"], **kw)[0]
        if op == "lightning":
            return sg.lightning_attention(q, k, v, gates["g_gamma"], **kw)[0]
        if op == "kda":
            return kda_ops.kda(q, k, v, gates["g"], gates["beta"], **kw)[0]
        return gdn2_ops.gdn2(q, k, v, gates["g"], gates["b"], gates["w"], **kw)[0]
    return fn


def _jax_passes(fn, names):
    import jax

    def fwd(q, k, v, do, **gates):
        return fn(q, k, v, **gates)

    def fwdbwd(q, k, v, do, **gates):
        def f(q, k, v, *gs):
            return fn(q, k, v, **{**gates, **dict(zip(names, gs))})
        o, vjp = jax.vjp(f, q, k, v, *[gates[n] for n in names])
        # o is returned too: a training step uses it, and without it XLA may drop a forward
        # kernel whose only output is o (the split GDN forward's read-out kernel).
        return vjp(do.astype(o.dtype)) + (o,)

    return {"fwd": jax.jit(fwd), "fwdbwd": jax.jit(fwdbwd)}


def _time_jax(f, args, kwargs):
    """``(median, min)`` wall ms per call, each call followed by ``block_until_ready``."""
    from benchmarks import common
    times = np.asarray(common.time_calls(lambda: f(*args, **kwargs), warmup=_WARMUP.value,
                                         iters=_ITERS.value)) * 1e3
    return float(np.median(times)), float(np.min(times))


def _time_jax_loop(f, args, kwargs):
    """Wall ms per call of ``--iters`` calls dispatched back to back with one sync (§5.4's
    secondary metric: launch gaps and XLA glue count, the per-call host sync does not)."""
    import jax
    from benchmarks import common
    jax.block_until_ready(f(*args, **kwargs))
    return common.time_back_to_back(lambda: f(*args, **kwargs), _ITERS.value) * 1e3


def device_ms_from_trace(events, calls):
    """Device kernel time per call (ms) from Chrome-trace ``events`` of ``calls`` calls: the
    summed durations of :func:`benchmarks.common.device_kernel_events`; ``None`` when there
    are none or they sum to zero (a CPU backend, or a trace without device activity)."""
    return _kernel_time(_trace_kernels(events), calls)[0]


def _trace_kernels(events):
    """``(name, duration_us)`` of every device kernel in Chrome-trace ``events``."""
    from benchmarks import common
    return [(name, dur) for name, _, dur in common.device_kernel_events(events)]


def _kernel_time(kernels, calls):
    """``(ms per call, breakdown)`` of ``(name, duration_us)`` kernel launches over ``calls``
    calls (:func:`kernel_breakdown`); ``(None, None)`` when they sum to zero."""
    total = sum(dur for _, dur in kernels)
    if total <= 0:
        return None, None
    return total / 1e3 / calls, kernel_breakdown(kernels, calls, top=_breakdown_top())


def _breakdown_top():
    """``--breakdown_top`` once flags are parsed, else :data:`BREAKDOWN_TOP`."""
    return _BREAKDOWN_TOP.value if flags.FLAGS.is_parsed() else BREAKDOWN_TOP


BREAKDOWN_TOP = 8  # kernels named per record; the rest are summed as "(other)"


def kernel_breakdown(durations, calls, top=BREAKDOWN_TOP):
    """Device time per call by kernel name (ms), largest first: ``{name: ms}`` of the ``top``
    largest names, the rest summed under ``"(other)"``; ``None`` if nothing ran.

    Args:
      durations: ``(name, duration_us)`` pairs of every kernel launch of ``calls`` calls.
      calls: how many calls the durations cover (>= 1).
    """
    totals = {}
    for name, dur in durations:
        totals[name] = totals.get(name, 0.0) + float(dur)
    if not totals or sum(totals.values()) <= 0:
        return None
    ranked = sorted(totals.items(), key=lambda kv: -kv[1])
    out = {name: us / 1e3 / calls for name, us in ranked[:top]}
    if len(ranked) > top:
        out["(other)"] = sum(us for _, us in ranked[top:]) / 1e3 / calls
    return out


def _kernel_ms_jax(f, args, kwargs):
    """§5.4's primary metric for JAX: the summed device durations of every kernel of one call
    (Pallas kernels and XLA glue alike), from a ``jax.profiler`` trace of ``--iters`` calls;
    returns ``(ms, breakdown)`` (:func:`kernel_breakdown`; both ``None`` without a trace)."""
    from benchmarks import common
    events = common.trace_events(lambda: f(*args, **kwargs), _ITERS.value)
    return _kernel_time(_trace_kernels(events), _ITERS.value)


def _to_jax(inputs, op):
    import jax.numpy as jnp
    args = tuple(jnp.asarray(inputs[n], jnp.bfloat16) for n in ("q", "k", "v", "do"))
    gates = {n: jnp.asarray(inputs[n]) for n in _gate_names(op)}
    if op == "lightning":
        gates["g_gamma"] = jnp.asarray(inputs["g_gamma"])
    seg = inputs.get("segment_ids")
    return args, gates, None if seg is None else jnp.asarray(seg)


def _rel(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def correctness_gate(op, peer, fwd_only=False):
    """Relative RMS errors of o and each gradient (of o only if ``fwd_only``) against the fp32
    reference (§5.5)."""
    import jax
    import jax.numpy as jnp
    batch, seq_len, heads = _shape(_GATE_SHAPE.value)
    inputs = make_inputs(op, batch, seq_len, heads, _DIM.value, packed=False, seed=7)
    (q, k, v, do), gates, seg = _to_jax(inputs, op)
    names = tuple(gates)
    if op == "lightning":
        names = ()  # FLA's fixed g_gamma is not trained
    ref_passes = _jax_passes(_jax_reference(op, seg), names)
    f32 = [x.astype(jnp.float32) for x in (q, k, v)]
    want_o = ref_passes["fwd"](*f32, do, **gates)
    # The token-serial reference's backward keeps every token's [K, V] state: at --gate_shape
    # 8x1024x16 it asked for 34 GiB and ran out of memory on an 80 GB H100 (2026-12-07i), so
    # a forward-only gate does not run it.
    want_g = () if fwd_only else ref_passes["fwdbwd"](*f32, do.astype(jnp.float32), **gates)
    passes = _jax_passes(_jax_fn(op, peer, seg), names)
    # The gate shape's rows have few CTAs, where gated_delta_rule_mosaic would run a fused T0
    # forward as three_pass, or "fused_t0" as sequence pieces (mosaic_vjp.resolve_forward,
    # FUSED_T0_PIECES): the gate checks the forward named, "fused_t0" as the pieces it runs
    # on such rows when FUSED_T0_PIECES is on (the default; --nomosaic_t0_pieces turns it off).
    # A "+t0w" value (dh_w="t0", MOSAIC_GPU.md Sec. 51) runs whole rows, where dh_w="t0" applies.
    # The default forward, "fused_rs" since 2026-12-08 (Sec. 63), runs "fused_t0"'s pieces on
    # such rows: unnamed, the gate checks those pieces as before; named (--mosaic_forward=
    # fused_rs), its own kernel on whole rows, or on the pieces with --mosaic_rs_pieces.
    from pallas_kernels.gated_delta_rule import mosaic_vjp
    fallback = mosaic_vjp.FUSED_T0_FALLBACK
    named = _MOSAIC_FORWARD.value or mosaic_vjp.DEFAULT_FORWARD
    pieces = named == "fused_t0" or (named == "fused_rs" and (
        not _MOSAIC_FORWARD.value or mosaic_vjp.RS_PIECES))
    t0w = (_MOSAIC_BACKWARD_NOW[0] or "").endswith(T0W_SUFFIX)
    mosaic_vjp.FUSED_T0_FALLBACK = (fallback and mosaic_vjp.FUSED_T0_PIECES and pieces
                                    and not t0w)
    try:
        got_o = passes["fwd"](q, k, v, do, **gates)
        got_g = () if fwd_only else passes["fwdbwd"](q, k, v, do, **gates)
    finally:
        mosaic_vjp.FUSED_T0_FALLBACK = fallback
    errs = {"o": _rel(got_o.astype(jnp.float32), want_o)}
    for name, a, b in zip(("q", "k", "v") + names, got_g, want_g):
        errs["d" + name] = _rel(jnp.asarray(a, jnp.float32), b)
    limits = {"o": 5e-3, "dq": 8e-3, "dk": 8e-3, "dv": 8e-3}
    ok = all(e < limits.get(n, 2e-2) for n, e in errs.items())
    del jax
    return ok, errs


def _on_tpu():
    import jax
    return jax.default_backend() == "tpu"


def _apply_tuning():
    """Applies ``--tuning`` to the kernel modules' TUNING dicts; returns what was applied."""
    if not _TUNING.value:
        return None
    from pallas_kernels.common import channelwise_gpu
    from pallas_kernels.gated_delta_rule import kernel_gpu as scalar_gpu
    overrides = json.loads(_TUNING.value)
    modules = {"scalar": scalar_gpu, "channelwise": channelwise_gpu}
    for family, values in overrides.items():
        if family not in modules:
            raise app.UsageError(f"--tuning: unknown kernel family {family!r}; "
                                 f"choose from {sorted(modules)}")
        table = modules[family].TUNING
        for key, value in values.items():
            if key not in table:
                raise app.UsageError(f"--tuning: {family} has no entry {key!r}; "
                                     f"entries: {sorted(table)}")
            table[key] = tuple(value) if isinstance(value, list) else value
    return overrides


def _check_mosaic_forward():
    """``--mosaic_forward`` against the forwards of the chosen Mosaic ops, before anything runs
    (unchecked, a bad value failed only at each op's gate, after the other peers' timings)."""
    if _MOSAIC_FORWARD.value is None:
        return
    if "mosaic" not in _PEERS.value:  # it would be ignored: refuse instead
        raise app.UsageError(f"--mosaic_forward={_MOSAIC_FORWARD.value} applies to peer mosaic "
                             f"only (--peers={','.join(_PEERS.value)})")
    from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu as gdr_mosaic
    from pallas_kernels.simple_gla import kernel_mosaic_gpu as kmg
    forwards = {"lightning": kmg.FORWARDS, "gdn": gdr_mosaic.FORWARDS,
                "deltanet": gdr_mosaic.FORWARDS}
    if not any(op in forwards for op in _OPS.value):  # it would apply to nothing: refuse
        raise app.UsageError(f"--mosaic_forward={_MOSAIC_FORWARD.value} applies to ops "
                             f"{', '.join(forwards)} only (--ops={','.join(_OPS.value)})")
    for op in _OPS.value:
        if op in forwards and _MOSAIC_FORWARD.value not in forwards[op]:
            raise app.UsageError(f"--mosaic_forward={_MOSAIC_FORWARD.value}: op {op} takes "
                                 f"one of {', '.join(forwards[op])}")


def _check_mosaic_gla_stages():
    """``--mosaic_gla_stages`` where it would apply, before anything runs (peer mosaic, op
    lightning, a forward that can resolve to fused, at least 2), then set
    ``kernel_mosaic_gpu.FUSED_OPTIONS["stages"]`` (removed when the flag is unset)."""
    from pallas_kernels.simple_gla import kernel_mosaic_gpu as kmg
    value = _MOSAIC_GLA_STAGES.value
    kmg.FUSED_OPTIONS.pop("stages", None)
    if value is None:
        return
    named = f"--mosaic_gla_stages={value}"
    if value < 2:
        raise app.UsageError(f"{named}: the ring needs at least 2 stages")
    _require_lightning_fused(named)
    kmg.FUSED_OPTIONS["stages"] = value


def _require_gdn_fused_rs(named):
    """Refuse the flag ``named`` (``app.UsageError``) unless peer mosaic, op gdn or deltanet
    and ``--mosaic_forward=fused_rs`` are chosen: the flags of GDN's ``fused_rs`` forward
    (``--mosaic_rs_*``, MOSAIC_GPU.md Sec. 56-60)."""
    if "mosaic" not in _PEERS.value:
        raise app.UsageError(f"{named} applies to peer mosaic only "
                             f"(--peers={','.join(_PEERS.value)})")
    if not any(op in ("gdn", "deltanet") for op in _OPS.value):
        raise app.UsageError(f"{named} applies to ops gdn, deltanet only "
                             f"(--ops={','.join(_OPS.value)})")
    if _MOSAIC_FORWARD.value != "fused_rs":
        raise app.UsageError(f"{named} applies to --mosaic_forward=fused_rs only "
                             f"(--mosaic_forward={_MOSAIC_FORWARD.value})")


def _check_mosaic_rs_stages():
    """``--mosaic_rs_stages`` where it would apply, before anything runs (peer mosaic, op gdn
    or deltanet, ``--mosaic_forward=fused_rs``, a depth of ``kernel_mosaic_gpu_rs.RS_STAGES``),
    then set ``mosaic_vjp.RS_OPTIONS["stages"]`` (removed when the flag is unset)."""
    from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu_rs as krs
    from pallas_kernels.gated_delta_rule import mosaic_vjp
    value = _MOSAIC_RS_STAGES.value
    mosaic_vjp.RS_OPTIONS.pop("stages", None)
    if value is None:
        return
    named = f"--mosaic_rs_stages={value}"
    if value not in krs.RS_STAGES:
        raise app.UsageError(f"{named}: takes one of {', '.join(map(str, krs.RS_STAGES))}")
    _require_gdn_fused_rs(named)
    mosaic_vjp.RS_OPTIONS["stages"] = value


def _check_mosaic_rs_protocol():
    """``--mosaic_rs_protocol`` where it would apply, before anything runs (peer mosaic, op gdn
    or deltanet, ``--mosaic_forward=fused_rs``), then set ``mosaic_vjp.RS_OPTIONS["protocol"]``
    (removed when the flag is unset)."""
    from pallas_kernels.gated_delta_rule import mosaic_vjp
    value = _MOSAIC_RS_PROTOCOL.value
    mosaic_vjp.RS_OPTIONS.pop("protocol", None)
    if value is None:
        return
    _require_gdn_fused_rs(f"--mosaic_rs_protocol={value}")
    mosaic_vjp.RS_OPTIONS["protocol"] = value


def _check_mosaic_rs_residuals():
    """``--mosaic_rs_residuals`` where it would apply, before anything runs (peer mosaic, op gdn
    or deltanet, ``--mosaic_forward=fused_rs``), then set ``mosaic_vjp.RS_RESIDUALS`` (the
    op's default, off, when the flag is unset)."""
    from pallas_kernels.gated_delta_rule import mosaic_vjp
    value = _MOSAIC_RS_RESIDUALS.value
    mosaic_vjp.RS_RESIDUALS = False
    mosaic_vjp.RS_OPTIONS.pop("residual_from", None)
    where = _MOSAIC_RS_RESIDUAL_FROM.value
    if where is not None and not value:
        raise app.UsageError(f"--mosaic_rs_residual_from={where} applies to "
                             f"--mosaic_rs_residuals only")
    if value is None:
        return
    named = f"--mosaic_rs_residuals={value}"
    _require_gdn_fused_rs(named)
    mosaic_vjp.RS_RESIDUALS = bool(value)
    if where is not None:
        mosaic_vjp.RS_OPTIONS["residual_from"] = where


def _check_mosaic_rs_pieces():
    """``--mosaic_rs_pieces`` where it would apply, before anything runs (peer mosaic, op gdn
    or deltanet, ``--mosaic_forward=fused_rs``, sequence pieces not turned off by
    ``--mosaic_t0_pieces=false``), then set ``mosaic_vjp.RS_PIECES`` (the op's default, off,
    when the flag is unset)."""
    from pallas_kernels.gated_delta_rule import mosaic_vjp
    value = _MOSAIC_RS_PIECES.value
    mosaic_vjp.RS_PIECES = False
    if value is None:
        return
    named = f"--mosaic_rs_pieces={value}"
    _require_gdn_fused_rs(named)
    if value and _MOSAIC_T0_PIECES.value is False:
        raise app.UsageError(f"{named} runs fused_rs on sequence pieces, which "
                             "--mosaic_t0_pieces=false turns off")
    mosaic_vjp.RS_PIECES = bool(value)


def _require_lightning_fused(named, passes=()):
    """Refuse the flag ``named`` (``app.UsageError``) unless peer mosaic, op lightning, each
    of ``passes`` and a forward that can resolve to fused (not ``--mosaic_forward=two_pass``)
    are chosen: the Lightning fused forward's flags (``--mosaic_gla_*``)."""
    if "mosaic" not in _PEERS.value:
        raise app.UsageError(f"{named} applies to peer mosaic only "
                             f"(--peers={','.join(_PEERS.value)})")
    if "lightning" not in _OPS.value:
        raise app.UsageError(f"{named} applies to op lightning only "
                             f"(--ops={','.join(_OPS.value)})")
    for pas in passes:
        if pas not in _PASSES.value:
            raise app.UsageError(f"{named} applies to pass {pas} only "
                                 f"(--passes={','.join(_PASSES.value)})")
    if _MOSAIC_FORWARD.value == "two_pass":
        raise app.UsageError(f"{named} applies to the fused forward (--mosaic_forward=fused or "
                             f"auto), not --mosaic_forward=two_pass")


def _check_mosaic_gla_residual_h():
    """``--mosaic_gla_residual_h`` (either value) where it would apply, before anything runs:
    peer mosaic, op lightning, pass fwdbwd, a forward that can resolve to fused (refused
    with ``--mosaic_forward=two_pass``, whose state pass the backward already shares)."""
    value = _MOSAIC_GLA_RESIDUAL_H.value
    if value is None:
        return
    named = "--mosaic_gla_residual_h" if value else "--nomosaic_gla_residual_h"
    _require_lightning_fused(named, passes=("fwdbwd",))


def _apply_mosaic_t0():
    """``--mosaic_t0_inverse``, ``--mosaic_t0_refine`` and ``--mosaic_t0_chunks_per_cta``
    against the forward and the T0 kernel's choices, before anything runs (refused where
    they would be ignored); then set ``kernel_mosaic_gpu.T0_OPTIONS``, the keyword arguments
    of ``chunk_kkt_inverse_mosaic`` at the forwards' call sites (read at trace time: nothing
    is traced yet). Likewise ``--mosaic_t0_split_order``, ``--mosaic_t0_split_stages``,
    ``--mosaic_t0_split_protocol`` and
    ``--mosaic_t0_split_state_layout`` (``fused_t0_split`` only) into
    ``kernel_mosaic_gpu.SPLIT_T0_OPTIONS``. Returns all of them in one dict."""
    options = {}
    if _MOSAIC_T0_INVERSE.value is not None:
        options["inverse"] = _MOSAIC_T0_INVERSE.value
    if _MOSAIC_T0_REFINE.value is not None:
        options["refine"] = _MOSAIC_T0_REFINE.value
    if _MOSAIC_T0_CPC.value is not None:
        options["chunks_per_cta"] = _MOSAIC_T0_CPC.value
    split = {}
    if _MOSAIC_T0_SPLIT_ORDER.value is not None:
        split["split_order"] = _MOSAIC_T0_SPLIT_ORDER.value
    if _MOSAIC_T0_SPLIT_STAGES.value is not None:
        split["split_stages"] = _MOSAIC_T0_SPLIT_STAGES.value
    if _MOSAIC_T0_SPLIT_PROTOCOL.value is not None:
        split["split_protocol"] = _MOSAIC_T0_SPLIT_PROTOCOL.value
    if _MOSAIC_T0_SPLIT_STATE.value:  # validated here, applied per variant (run_jax)
        split["split_state_layout"] = ",".join(_MOSAIC_T0_SPLIT_STATE.value)
    if not options and not split:
        return {}
    named = ", ".join(f"--mosaic_t0_{key}={value}"
                      for key, value in {**options, **split}.items())
    t0_forwards = ("fused_t0", "fused_t0_split", "fused_rs")
    if _MOSAIC_FORWARD.value not in t0_forwards:  # the T0 kernel would not run: refuse
        raise app.UsageError(f"{named} applies to --mosaic_forward={' or '.join(t0_forwards)} "
                             f"only (--mosaic_forward={_MOSAIC_FORWARD.value})")
    if not any(op in ("gdn", "deltanet") for op in _OPS.value):
        raise app.UsageError(f"{named} applies to ops gdn, deltanet only "
                             f"(--ops={','.join(_OPS.value)})")
    if options and _MOSAIC_WY.value != "mosaic":  # T0 would come from kkt_inverse_xla
        raise app.UsageError(f"{named} applies to --mosaic_wy=mosaic only "
                             f"(--mosaic_wy={_MOSAIC_WY.value})")
    from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu as gdr_mosaic
    if "inverse" in options and options["inverse"] not in gdr_mosaic.KKT_INVERSES:
        raise app.UsageError(f"--mosaic_t0_inverse={options['inverse']}: the T0 kernel takes "
                             f"one of {', '.join(gdr_mosaic.KKT_INVERSES)}")
    if "refine" in options:
        if options["refine"] not in gdr_mosaic.KKT_REFINES:
            raise app.UsageError(f"--mosaic_t0_refine={options['refine']}: the T0 kernel takes "
                                 f"one of {', '.join(gdr_mosaic.KKT_REFINES)}")
        if (options["refine"] == "split_merge"
                and options.get("inverse", gdr_mosaic.KKT_DEFAULT_INVERSE) != "substitution"):
            raise app.UsageError("--mosaic_t0_refine=split_merge needs "
                                 "--mosaic_t0_inverse=substitution")
    if options.get("chunks_per_cta", 1) < 1:
        raise app.UsageError(f"--mosaic_t0_chunks_per_cta={options['chunks_per_cta']}: must "
                             f"be >= 1")
    if split:
        from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu_fused as kfused
        if _MOSAIC_FORWARD.value != "fused_t0_split":
            flag = " and ".join(f"--mosaic_t0_{key}" for key in split)
            raise app.UsageError(f"{flag} applies to --mosaic_forward=fused_t0_split only "
                                 f"(--mosaic_forward={_MOSAIC_FORWARD.value})")
        if split.get("split_order", kfused.SPLIT_DEFAULT_ORDER) not in kfused.SPLIT_ORDERS:
            raise app.UsageError(f"--mosaic_t0_split_order={split['split_order']}: takes one "
                                 f"of {', '.join(kfused.SPLIT_ORDERS)}")
        if split.get("split_stages", kfused.STAGES) not in kfused.SPLIT_STAGES:
            raise app.UsageError(f"--mosaic_t0_split_stages={split['split_stages']}: takes one "
                                 f"of {', '.join(map(str, kfused.SPLIT_STAGES))}")
        for layout in _MOSAIC_T0_SPLIT_STATE.value:
            if layout not in kfused.SPLIT_STATE_LAYOUTS:
                raise app.UsageError(f"--mosaic_t0_split_state_layout={layout}: takes "
                                     f"values of {', '.join(kfused.SPLIT_STATE_LAYOUTS)}")
        protocol = split.get("split_protocol", kfused.SPLIT_DEFAULT_PROTOCOL)
        if protocol not in kfused.SPLIT_PROTOCOLS:
            raise app.UsageError(f"--mosaic_t0_split_protocol={protocol}: takes one of "
                                 f"{', '.join(kfused.SPLIT_PROTOCOLS)}")
        if protocol != kfused.SPLIT_DEFAULT_PROTOCOL and "vk" in _MOSAIC_T0_SPLIT_STATE.value:
            raise app.UsageError(f"--mosaic_t0_split_protocol={protocol} is built for the kv "
                                 f"state layout only (--mosaic_t0_split_state_layout="
                                 f"{','.join(_MOSAIC_T0_SPLIT_STATE.value)})")
        split.pop("split_state_layout", None)  # a variant: _set_split_state_layout
    gdr_mosaic.T0_OPTIONS.clear()
    gdr_mosaic.T0_OPTIONS.update(options)
    gdr_mosaic.SPLIT_T0_OPTIONS.clear()
    gdr_mosaic.SPLIT_T0_OPTIONS.update(split)
    return {**options, **split}


_CW_OPS = ("kda", "gdn2")


def _check_distinct(flag, values, choices):
    """Refuses ``--<flag>`` values outside ``choices`` or given twice (one UsageError)."""
    if any(v not in choices for v in values) or len(set(values)) != len(values):
        raise app.UsageError(f"--{flag}={','.join(values)}: takes distinct values of "
                             f"{', '.join(choices)}")


def _check_channelwise_state_pass():
    """``--channelwise_state_pass`` against the state passes, peers and ops, before anything
    runs (refused where it would be ignored)."""
    values = _CW_STATE_PASS.value
    if not values:
        return
    from pallas_kernels.common import channelwise_gpu
    _check_distinct("channelwise_state_pass", values, channelwise_gpu.STATE_PASSES)
    if "ours" not in _PEERS.value or not any(op in _CW_OPS for op in _OPS.value):
        raise app.UsageError(f"--channelwise_state_pass applies to peer ours and ops "
                             f"{', '.join(_CW_OPS)} only (--peers={','.join(_PEERS.value)} "
                             f"--ops={','.join(_OPS.value)})")


def _check_channelwise_grad_pass():
    """``--channelwise_grad_pass`` against the grad passes, peers, ops and passes, before
    anything runs (refused where it would be ignored: it changes only the backward)."""
    values = _CW_GRAD_PASS.value
    if not values:
        return
    from pallas_kernels.common import channelwise_gpu
    _check_distinct("channelwise_grad_pass", values, channelwise_gpu.GRAD_PASSES)
    if ("ours" not in _PEERS.value or not any(op in _CW_OPS for op in _OPS.value)
            or "fwdbwd" not in _PASSES.value):
        raise app.UsageError(f"--channelwise_grad_pass applies to peer ours, ops "
                             f"{', '.join(_CW_OPS)} and pass fwdbwd only "
                             f"(--peers={','.join(_PEERS.value)} --ops={','.join(_OPS.value)} "
                             f"--passes={','.join(_PASSES.value)})")


def _check_mosaic_backward():
    """``--mosaic_backward`` against the backwards, peers, ops and passes, before anything runs
    (refused where it would be ignored: it changes only the GDN / DeltaNet Mosaic backward)."""
    values = _MOSAIC_BACKWARD.value
    if not values:
        return
    from pallas_kernels.gated_delta_rule import mosaic_vjp
    _check_distinct("mosaic_backward", values, mosaic_backward_choices(mosaic_vjp.BACKWARDS))
    if ("mosaic" not in _PEERS.value or not any(op in ("gdn", "deltanet") for op in _OPS.value)
            or "fwdbwd" not in _PASSES.value or _MOSAIC_WY.value != "mosaic"):
        raise app.UsageError(f"--mosaic_backward applies to peer mosaic, ops gdn, deltanet, "
                             f"pass fwdbwd and --mosaic_wy=mosaic only "
                             f"(--peers={','.join(_PEERS.value)} --ops={','.join(_OPS.value)} "
                             f"--passes={','.join(_PASSES.value)} "
                             f"--mosaic_wy={_MOSAIC_WY.value})")


# The backward= the mosaic GDN / DeltaNet op runs with now (None: its default), set per
# --mosaic_backward value by run_jax and read by _jax_fn at trace time.
_MOSAIC_BACKWARD_NOW = [None]
# The suffix of a --mosaic_backward value that also sets dv_local="fold" (MOSAIC_GPU.md Sec. 32).
FOLD_SUFFIX = "+fold"
# The suffix after FOLD_SUFFIX that also sets dh_w="t0" (W formed from T0, MOSAIC_GPU.md Sec. 51).
T0W_SUFFIX = "+t0w"


def mosaic_backward_choices(backwards):
    """The ``--mosaic_backward`` values: each backward, each with :data:`FOLD_SUFFIX`, and each
    with both suffixes (:data:`T0W_SUFFIX` needs the fold)."""
    return (tuple(backwards) + tuple(b + FOLD_SUFFIX for b in backwards)
            + tuple(b + FOLD_SUFFIX + T0W_SUFFIX for b in backwards))


def mosaic_backward_base(value):
    """The ``backward=`` of a ``--mosaic_backward`` value (its suffixes removed)."""
    for suffix in (T0W_SUFFIX, FOLD_SUFFIX):
        value = value[:-len(suffix)] if value.endswith(suffix) else value
    return value


def mosaic_backward_options(value):
    """``gated_delta_rule_mosaic``'s keyword options of a ``--mosaic_backward`` value
    (``{}`` for ``None``, the op's defaults): ``backward=``, and ``dv_local="fold"`` for a
    ``+fold`` value, else ``"separate"`` (named, so a value means what it meant before the
    op's default became ``"fold"``); ``dh_w="t0"`` for a ``+fold+t0w`` value."""
    if value is None:
        return {}
    if value.endswith(T0W_SUFFIX):  # "+fold+t0w": dh_w="t0" (MOSAIC_GPU.md Sec. 51)
        return dict(mosaic_backward_options(value[:-len(T0W_SUFFIX)]), dh_w="t0")
    if value.endswith(FOLD_SUFFIX):
        return {"backward": value[:-len(FOLD_SUFFIX)], "dv_local": "fold"}
    return {"backward": value, "dv_local": "separate"}


def _mosaic_backward_variants(op, peer):
    """``--mosaic_backward``'s values for ``(op, peer)`` (``[None]``: once, the default)."""
    if peer == "mosaic" and op in ("gdn", "deltanet") and _MOSAIC_BACKWARD.value:
        return list(_MOSAIC_BACKWARD.value)
    return [None]


def _set_mosaic_backward(value):
    """Sets :data:`_MOSAIC_BACKWARD_NOW` and clears JAX's caches, whose traces read it."""
    import jax

    if value != _MOSAIC_BACKWARD_NOW[0]:
        _MOSAIC_BACKWARD_NOW[0] = value
        jax.clear_caches()


def _split_state_layout_variants(op, peer):
    """``--mosaic_t0_split_state_layout``'s values for ``(op, peer)`` (``[None]``: once,
    the default layout)."""
    if peer == "mosaic" and op in ("gdn", "deltanet") and _MOSAIC_T0_SPLIT_STATE.value:
        return list(_MOSAIC_T0_SPLIT_STATE.value)
    return [None]


def _set_split_state_layout(value):
    """Sets ``state_layout`` in ``kernel_mosaic_gpu.SPLIT_T0_OPTIONS`` (``None``: removes it,
    the default) and clears JAX's caches, whose traces read it."""
    import jax

    from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu as gdr_mosaic
    if value != gdr_mosaic.SPLIT_T0_OPTIONS.get("state_layout"):
        if value is None:
            gdr_mosaic.SPLIT_T0_OPTIONS.pop("state_layout")
        else:
            gdr_mosaic.SPLIT_T0_OPTIONS["state_layout"] = value
        jax.clear_caches()


def _pass_values(flag, op, peer):
    """The values of ``flag`` (``--channelwise_state_pass`` / ``--channelwise_grad_pass``) to
    run ``(op, peer)`` with (``[None]``: once, as configured)."""
    if peer == "ours" and op in _CW_OPS and flag.value:
        return list(flag.value)
    return [None]


def _set_pass(key, value):
    """Sets ``channelwise_gpu.TUNING[key]`` (``None``: leaves it) and clears JAX's caches,
    whose traces read TUNING."""
    if value is None:
        return
    import jax

    from pallas_kernels.common import channelwise_gpu
    channelwise_gpu.TUNING[key] = value
    jax.clear_caches()


def _state_pass_variants(op, peer):
    """``--channelwise_state_pass``'s values for ``(op, peer)`` (:func:`_pass_values`)."""
    return _pass_values(_CW_STATE_PASS, op, peer)


def _grad_pass_variants(op, peer):
    """``--channelwise_grad_pass``'s values for ``(op, peer)`` (:func:`_pass_values`)."""
    return _pass_values(_CW_GRAD_PASS, op, peer)


def _set_state_pass(value):
    """``TUNING["state_pass"] = value`` (:func:`_set_pass`)."""
    _set_pass("state_pass", value)


def _set_grad_pass(value):
    """``TUNING["grad_pass"] = value`` (:func:`_set_pass`)."""
    _set_pass("grad_pass", value)


def _channelwise_variants(op, peer):
    """``(state_pass, grad_pass)`` pairs to run ``(op, peer)`` with: every
    ``--channelwise_state_pass`` value with every ``--channelwise_grad_pass`` value."""
    return [(sp, gp) for sp in _state_pass_variants(op, peer)
            for gp in _grad_pass_variants(op, peer)]


def _variants(op, peer):
    """``(state_pass, grad_pass, mosaic_backward, state_layout)`` to run ``(op, peer)`` with
    (:func:`_channelwise_variants` with every ``--mosaic_backward`` value and every
    ``--mosaic_t0_split_state_layout`` value)."""
    return [(sp, gp, bw, sl) for sp, gp in _channelwise_variants(op, peer)
            for bw in _mosaic_backward_variants(op, peer)
            for sl in _split_state_layout_variants(op, peer)]


def run_jax(records):
    tuning = _apply_tuning()
    t0_options = _apply_mosaic_t0()
    import jax
    peers = [p for p in _PEERS.value if p != "fla"]
    for gpu_only in ("jla", "mosaic"):
        if _on_tpu() and gpu_only in peers:
            print(f"skipping peer {gpu_only}: its kernels are Mosaic GPU only (backend is tpu)",
                  flush=True)
            peers.remove(gpu_only)
    for op in _OPS.value:
        for peer in peers:
            for state_pass, grad_pass, backward, layout in _variants(op, peer):
                _set_state_pass(state_pass)
                _set_grad_pass(grad_pass)
                _set_mosaic_backward(backward)
                _set_split_state_layout(layout)
                gate_ok, errs = (True, {})
                if peer == "mosaic" and op not in _MOSAIC_OPS:
                    print(f"skipping peer mosaic for {op}: its Mosaic GPU kernel is not written "
                          f"yet (covered: {', '.join(_MOSAIC_OPS)})", flush=True)
                    continue
                if peer in ("ours", "mosaic"):
                    try:
                        fwd_only = peer == "mosaic" and "fwdbwd" not in _mosaic_passes(op)
                        gate_ok, errs = correctness_gate(op, peer, fwd_only=fwd_only)
                    except Exception as e:  # noqa: BLE001 - recorded, never silent
                        gate_ok, errs = False, {"error": repr(e)[:300]}
                    label = "".join(f" ({what} {value})" for what, value in
                                    (("state pass", state_pass), ("grad pass", grad_pass),
                                     ("backward", backward), ("state layout", layout))
                                    if value)
                    print(f"gate {op} {peer}{label}: {'green' if gate_ok else 'RED'} {errs}",
                          flush=True)
                for shape in _SHAPES.value:
                    batch, seq_len, heads = _shape(shape)
                    if peer == "chunked" and shape not in _CHUNKED_SHAPES.value:
                        continue
                    inputs = make_inputs(op, batch, seq_len, heads, _DIM.value,
                                         packed=shape.startswith("P"))
                    (q, k, v, do), gates, seg = _to_jax(inputs, op)
                    names = () if op == "lightning" else tuple(gates)
                    passes = _jax_passes(_jax_fn(op, peer, seg), names)
                    for pas in _PASSES.value:
                        if peer == "mosaic" and pas not in _mosaic_passes(op):
                            print(f"skipping peer mosaic {op} {pas}: no Mosaic GPU backward "
                                  f"{'with --mosaic_wy=xla' if op in _MOSAIC_OPS else 'yet'}",
                                  flush=True)
                            continue
                        rec = dict(peer=peer, op=op, shape=shape, bthd=[batch, seq_len, heads,
                                                                        _DIM.value], pass_=pas,
                                   gate=gate_ok, gate_errors=errs, tuning=tuning)
                        from pallas_kernels.common import mosaic_gpu_lib
                        rec["mosaic_approx_math"] = mosaic_gpu_lib.APPROX_MATH
                        if peer == "mosaic" and op in ("gdn", "deltanet"):
                            rec["mosaic_wy"] = _MOSAIC_WY.value
                        if peer == "mosaic":
                            from pallas_kernels.gated_delta_rule import mosaic_vjp
                            rec["mosaic_forward"] = _MOSAIC_FORWARD.value
                            rec["mosaic_t0_pieces"] = mosaic_vjp.FUSED_T0_PIECES
                            rec["mosaic_piece_skip"] = mosaic_vjp.PIECE_SKIP
                            rec["mosaic_maps_carry_x"] = mosaic_vjp.MAPS_CARRY_X
                        if peer == "mosaic" and op == "lightning":
                            from pallas_kernels.simple_gla import kernel_mosaic_gpu as kmg
                            # the value in force, and the forward the pass resolved to
                            # (kmg.resolve_forward; residual_h acts only where it is "fused")
                            rec["mosaic_gla_residual_h"] = (
                                kmg.RESIDUAL_H if _MOSAIC_GLA_RESIDUAL_H.value is None
                                else _MOSAIC_GLA_RESIDUAL_H.value)
                            rec["mosaic_gla_stages"] = kmg.FUSED_OPTIONS.get("stages")
                            rec["mosaic_forward_run"] = kmg.resolve_forward(
                                _MOSAIC_FORWARD.value or kmg.DEFAULT_FORWARD, batch, seq_len,
                                heads, _DIM.value, differentiated=pas == "fwdbwd")
                        if (peer == "mosaic" and op in ("gdn", "deltanet")
                                and _MOSAIC_WY.value != "xla"):
                            # what the op ran (unset: its default): a fused T0 forward on rows
                            # with few CTAs runs as three_pass, or "fused_t0" as sequence
                            # pieces (mosaic_vjp.resolve_forward, fused_t0_pieces; MOSAIC_GPU.md
                            # Sec. 36, 42)
                            rec["mosaic_forward_run"] = mosaic_vjp.resolve_forward(
                                _MOSAIC_FORWARD.value or mosaic_vjp.DEFAULT_FORWARD, batch,
                                heads, _DIM.value, seq_len)
                            if (rec["mosaic_forward_run"] == "fused_rs" and pas != "fwd"
                                    and not mosaic_vjp.RS_RESIDUALS):
                                rec["mosaic_forward_run"] = "fused_t0"  # no residuals (Sec. 56)
                            rec["mosaic_rs_stages"] = mosaic_vjp.RS_OPTIONS.get("stages")
                            rec["mosaic_rs_protocol"] = mosaic_vjp.RS_OPTIONS.get(
                                "protocol", "joint")  # Sec. 64
                            rec["mosaic_rs_residuals"] = mosaic_vjp.RS_RESIDUALS  # Sec. 58
                            rec["mosaic_rs_pieces"] = mosaic_vjp.RS_PIECES  # Sec. 60
                            rec["mosaic_rs_residual_from"] = mosaic_vjp.RS_OPTIONS.get(
                                "residual_from")
                            rec["mosaic_pieces_run"] = mosaic_vjp.fused_t0_pieces(
                                rec["mosaic_forward_run"], batch, heads, _DIM.value, seq_len)
                            # where W of the reverse pass came from (Sec. 51; "+t0w" values)
                            bw_opts = mosaic_backward_options(backward)
                            # (the op resolves it from its own forward: "fused_rs" without
                            # RS_RESIDUALS runs the stored W, Sec. 58)
                            rec["mosaic_dh_w_run"] = mosaic_vjp.resolve_dh_w(
                                bw_opts.get("dh_w", mosaic_vjp.DEFAULT_DH_W),
                                mosaic_vjp.resolve_forward(
                                    _MOSAIC_FORWARD.value or mosaic_vjp.DEFAULT_FORWARD, batch,
                                    heads, _DIM.value, seq_len),
                                bw_opts.get("dv_local", mosaic_vjp.DEFAULT_DV_LOCAL), batch,
                                heads, _DIM.value, seq_len)
                        if state_pass is not None:
                            rec["channelwise_state_pass"] = state_pass
                        if grad_pass is not None:
                            rec["channelwise_grad_pass"] = grad_pass
                        if backward is not None:
                            rec["mosaic_backward"] = backward
                        if peer == "mosaic" and op in ("gdn", "deltanet") and (
                                t0_options or layout):
                            rec["mosaic_t0"] = {**t0_options, **(
                                {"state_layout": layout} if layout else {})}
                        try:
                            fn = passes[pas]
                            rec["ms"], rec["ms_min"] = _time_jax(fn, (q, k, v, do), gates)
                            rec["ms_loop"] = _time_jax_loop(fn, (q, k, v, do), gates)
                            rec["kernel_ms"], rec["kernels"] = _kernel_ms_jax(
                                fn, (q, k, v, do), gates)
                        except Exception as e:  # noqa: BLE001
                            rec["error"] = repr(e)[:300]
                        print(json.dumps(rec), flush=True)
                        records.append(rec)
                        _append(rec)
                    del q, k, v, do, gates
        jax.clear_caches()


# ---------------------------------------------------------------------------------------------
# torch side: fla.


def _kernel_ms_torch(torch, fn):
    """§5.4's primary metric for fla: ``torch.profiler`` self device time per call (ms) over
    ``--iters`` calls (every kernel the call launches, Triton and torch alike); returns
    ``(ms, breakdown)`` (:func:`kernel_breakdown`)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(_ITERS.value):
            fn()
        torch.cuda.synchronize()
    # Device events only (as torch's own table footer counts them), no user annotations.
    kernels = [(e.name, e.self_device_time_total) for e in prof.events()
               if e.device_type == DeviceType.CUDA
               and not getattr(e, "is_user_annotation", False)]
    return _kernel_time(kernels, _ITERS.value)


def run_fla():
    """Times fla's chunk kernels (torch worker); yields one record per op, shape and pass."""
    os.environ["FLA_DISABLE_BACKEND_DISPATCH"] = "1"
    import torch
    import triton
    import fla.ops.common.chunk_o as chunk_o
    chunk_o.TRITON_ABOVE_3_7_1 = True  # lift the Triton-3.6 guard for timing (fla #640)
    from fla.ops.delta_rule import chunk_delta_rule
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    from fla.ops.gdn2 import chunk_gdn2
    from fla.ops.kda import chunk_kda
    from fla.ops.simple_gla import chunk_simple_gla
    start = time.time()
    dev = "cuda"
    for op in _OPS.value:
        for shape in _SHAPES.value:
            batch, seq_len, heads = _shape(shape)
            inputs = make_inputs(op, batch, seq_len, heads, _DIM.value,
                                 packed=shape.startswith("P"))
            t = {n: torch.from_numpy(inputs[n]).to(dev) for n in ("q", "k", "v", "do")}
            for n in ("q", "k", "v", "do"):
                t[n] = t[n].to(torch.bfloat16)
            gates = {n: torch.from_numpy(inputs[n]).to(dev) for n in _gate_names(op)}
            kw = dict(scale=_DIM.value ** -0.5)
            if "cu_seqlens" in inputs:
                kw["cu_seqlens"] = torch.from_numpy(inputs["cu_seqlens"]).to(dev)
                kw["cu_seqlens_cpu"] = torch.from_numpy(inputs["cu_seqlens"])

            def call(q, k, v, gs, op=op, kw=kw, inputs=inputs):
                if op == "gdn":
                    return chunk_gated_delta_rule(q, k, v, gs["g"], gs["beta"], **kw)[0]
                if op == "deltanet":
                    return chunk_delta_rule(q, k, v, gs["beta"], **kw)[0]
                if op == "lightning":
                    g_gamma = torch.from_numpy(inputs["g_gamma"]).to(dev)
                    return chunk_simple_gla(q, k, v, g_gamma=g_gamma, **kw)[0]
                if op == "kda":
                    return chunk_kda(q, k, v, gs["g"], gs["beta"], **kw)[0]
                return chunk_gdn2(q, k, v, gs["g"], gs["b"], gs["w"], **kw)[0]

            for pas in _PASSES.value:
                rec = dict(peer="fla", op=op, shape=shape,
                           bthd=[batch, seq_len, heads, _DIM.value], pass_=pas)
                try:
                    if pas == "fwd":
                        def fn():
                            with torch.no_grad():
                                return call(t["q"], t["k"], t["v"], gates)
                    else:
                        leaves = [t["q"], t["k"], t["v"]] + list(gates.values())
                        leaves = [x.detach().requires_grad_(True) for x in leaves]

                        def fn(leaves=leaves):
                            gs = dict(zip(gates, leaves[3:]))
                            o = call(leaves[0], leaves[1], leaves[2], gs)
                            return torch.autograd.grad(o, leaves, t["do"])
                    for _ in range(_WARMUP.value):
                        fn()
                    torch.cuda.synchronize()
                    rec["ms"] = float(triton.testing.do_bench(fn, warmup=25, rep=100,
                                                              return_mode="median"))
                    rec["ms_min"] = float(triton.testing.do_bench(fn, warmup=5, rep=50,
                                                                  return_mode="min"))
                    rec["kernel_ms"], rec["kernels"] = _kernel_ms_torch(torch, fn)
                except Exception as e:  # noqa: BLE001
                    rec["error"] = repr(e)[:300]
                rec["wall_s"] = round(time.time() - start, 1)  # since the worker started
                yield rec
            torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# Report.


# The distributions whose versions the records carry: module name -> distribution names.
_DISTRIBUTIONS = {"jax": ("jax",), "jaxlib": ("jaxlib",), "torch": ("torch",),
                  "triton": ("triton",), "fla": ("flash-linear-attention", "fla-core"),
                  "jla": ("jax-linear-attention",)}


def _versions():
    """Versions, date and device of the run. Package versions come from their installed
    metadata, not by importing the packages: importing fla (torch, Triton and its kernels) in
    a process that timed only JAX peers is the likely cause of the ~24 s between such a
    process's last record and its end on the H100 (2026-12-07f, MOSAIC_GPU.md Sec. 49)."""
    from importlib import metadata
    out = dict(python=platform.python_version(), date=datetime.date.today().isoformat())
    for mod, dists in _DISTRIBUTIONS.items():
        out[mod] = None  # a missing peer is reported as absent
        for dist in dists:
            try:
                out[mod] = metadata.version(dist)
                break
            except metadata.PackageNotFoundError:
                continue
    try:
        import jax
        out["device"] = f"{jax.default_backend()}: {jax.devices()[0].device_kind}"
    except Exception:  # noqa: BLE001
        out["device"] = None
    try:
        out["gpu"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm",
             "--format=csv,noheader"], capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        out["gpu"] = None
    return out


def _ms(x):
    """A time in ms with three decimals; ``–`` for ``None``."""
    return "–" if x is None else f"{x:.3f}"


def _own_ms(record, *names):
    """The summed time (ms) of a record's per-kernel breakdown entries whose kernel name holds
    any of ``names`` (substrings); ``None`` when none does."""
    return sum(ms for k, ms in (record.get("kernels") or {}).items()
               if any(n in k for n in names)) or None


def peer_ratio(ours, peer):
    """``"t_peer / t_ours"`` of two records: kernel times if both have one (> 0), else wall
    times if both have one, else ``"–"`` (a kernel time is never set against a wall time)."""
    for key in ("kernel_ms", "ms"):
        if ours.get(key) and peer.get(key):
            return f"{peer[key] / ours[key]:.2f}"
    return "–"


def markdown(records, versions, command):
    by = {}
    for r in records:
        by[(r["op"], r["shape"], r["pass_"], r["peer"])] = r
    lines = [f"# Kernel benchmark, {versions['date']}", "",
             f"Hardware: {versions.get('gpu') or versions.get('device')}. Versions: " + ", ".join(
                 f"{k} {v}" for k, v in versions.items()
                 if k not in ("gpu", "device", "date")) + ".",
             "", f"Command: `{command}`", "",
             "Times in ms per call; ratios > 1 mean ours is faster. R = roofline floor of "
             "BENCHMARKS.md §3; %R = R / t_ours (kernel time). `ours` is each op's `auto` dispatch "
             "(on a GPU: the Pallas GPU kernels for all five, KDA and GDN2 since "
             "common.channelwise_gpu.AUTO_SELECT was switched on on 2026-11-29, and for "
             "lightning the Mosaic GPU kernels on compute capability 9.x since "
             "common.mosaic_gpu.AUTO_SELECT of 2026-12-02, for gdn since it left "
             "common.mosaic_gpu.AUTO_OFF on 2026-12-06; on a TPU: the "
             "Pallas TPU kernels for all five). The floors R are H200 floors; on a TPU recompute "
             "them from the chip's peak FLOP/s and HBM bandwidth (BUILD.md).", ""]
    gates = {r["op"]: r.get("gate_errors") for r in records if r["peer"] == "ours"}
    lines += ["Correctness gate (ours vs the fp32 reference, relative RMS error):", ""]
    for op, errs in gates.items():
        lines.append(f"- {op}: " + ", ".join(
            f"{k} {v:.2e}" if isinstance(v, float) else f"{k} {v}"
            for k, v in (errs or {}).items()))
    lines += ["",
              "Kernel = summed device time of every kernel of one call (jax.profiler / "
              "torch.profiler; §5.4's primary metric); wall = median of synced calls (JAX) or "
              "do_bench (fla); loop = back-to-back calls with one sync (JAX). Ratios are "
              "peer / ours on kernel time where both have one, else on wall time (never one "
              "against the other); %R on our kernel time (wall where it is missing).", "",
              "| op | shape | pass | ours kernel | fla kernel | jla kernel | ours wall "
              "| ours loop | fla wall | jla wall | chunked wall | fla/ours | jla/ours | R | %R |",
              "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]

    for op in dict.fromkeys(r["op"] for r in records):
        for shape in dict.fromkeys(r["shape"] for r in records):
            for pas in ("fwd", "fwdbwd"):
                recs = {p: by.get((op, shape, pas, p), {}) for p in
                        ("ours", "fla", "jla", "chunked")}
                if not any(r.get("ms") or r.get("kernel_ms") for r in recs.values()):
                    continue
                # The floors hold at N = B*T*H = 524,288 token-heads (the core shapes).
                floor = FLOOR_MS[op][0 if pas == "fwd" else 1] if shape in SHAPES else None

                def ratio(p):
                    return peer_ratio(recs["ours"], recs[p])

                mine = recs["ours"].get("kernel_ms") or recs["ours"].get("ms")
                pct = "–" if not (floor and mine) else f"{100 * floor / mine:.0f}%"
                lines.append(
                    f"| {op} | {shape} | {pas} | {_ms(recs['ours'].get('kernel_ms'))} | "
                    f"{_ms(recs['fla'].get('kernel_ms'))} | {_ms(recs['jla'].get('kernel_ms'))} "
                    f"| {_ms(recs['ours'].get('ms'))} | {_ms(recs['ours'].get('ms_loop'))} | "
                    f"{_ms(recs['fla'].get('ms'))} | {_ms(recs['jla'].get('ms'))} | "
                    f"{_ms(recs['chunked'].get('ms'))} | {ratio('fla')} | {ratio('jla')} | "
                    f"{_ms(floor)} | {pct} |")
    lines += mosaic_lines(records)
    lines += state_pass_lines(records)
    lines += grad_pass_lines(records)
    lines += mosaic_backward_lines(records)
    lines += breakdown_lines(records)
    return "\n".join(lines) + "\n"


def mosaic_lines(records):
    """Markdown lines comparing the ``mosaic`` peer (our Mosaic GPU kernels of issue 29, not
    dispatched yet) with ``ours`` (the dispatched kernels) and jla, on kernel time where both
    have one (:func:`peer_ratio`); ``[]`` without mosaic records."""
    latest = {(r["op"], r["shape"], r["pass_"], r["peer"]): r for r in records}
    keys = [k[:3] for k in latest if k[3] == "mosaic"]
    if not keys:
        return []

    forwards = sorted({str(r.get("mosaic_forward")) for r in records if r["peer"] == "mosaic"
                       and r.get("mosaic_forward")})
    residual_h = any(r["peer"] == "mosaic" and r.get("mosaic_gla_residual_h")
                     for r in records)
    lines = ["", "Our Mosaic GPU kernels (peer `mosaic`, issue 29, called directly), against "
                 "the dispatched kernels and jla. Ratios > 1 mean the Mosaic GPU kernel is "
                 "faster." + (f" Forward: `{', '.join(forwards)}` (`--mosaic_forward`)."
                              if forwards else "")
                 + (" Lightning's backward reuses the fused forward's `h` "
                    "(`--mosaic_gla_residual_h`)." if residual_h else ""), ""]
    gates = {r["op"]: r.get("gate_errors") for r in records if r["peer"] == "mosaic"}
    for op, errs in gates.items():
        lines.append(f"- gate, {op} (mosaic vs the fp32 reference): " + ", ".join(
            f"{k} {v:.2e}" if isinstance(v, float) else f"{k} {v}"
            for k, v in (errs or {}).items()))
    lines += ["", "| op | shape | pass | mosaic kernel | ours kernel | jla kernel | mosaic wall "
                  "| ours/mosaic | jla/mosaic |", "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for op, shape, pas in keys:
        m = latest[(op, shape, pas, "mosaic")]
        o = latest.get((op, shape, pas, "ours"), {})
        j = latest.get((op, shape, pas, "jla"), {})
        lines.append(f"| {op} | {shape} | {pas} | {_ms(m.get('kernel_ms'))} | "
                     f"{_ms(o.get('kernel_ms'))} | {_ms(j.get('kernel_ms'))} | "
                     f"{_ms(m.get('ms'))} | {peer_ratio(m, o)} | {peer_ratio(m, j)} |")
    return lines


def state_pass_lines(records):
    """Markdown lines of the ``ours`` records of KDA / GDN-2 run per
    ``--channelwise_state_pass`` (each value's kernel and wall time, the forward and reverse
    state-pass kernels' own times from the breakdown, and its gate); ``[]`` without such
    records. The main table keeps the last value's record only."""
    recs = [r for r in records if r.get("channelwise_state_pass") and r["peer"] == "ours"]
    if not recs:
        return []

    lines = ["", "Channelwise state passes (`--channelwise_state_pass`, peer ours; "
                 "MOSAIC_GPU.md Sec. 18): the Triton kernels `channelwise_forward` / "
                 "`channelwise_backward_state` or the Mosaic GPU kernels "
                 f"`{_STATE_KERNELS['mosaic']}` / `{_BWD_STATE_KERNELS['mosaic']}`.", "",
             "| op | shape | pass | state pass | kernel | state-pass kernel | reverse state-pass "
             "kernel | wall | gate |",
             "|---|---|---|---|---:|---:|---:|---:|---|"]
    for r in recs:
        own = [_own_ms(r, names[r["channelwise_state_pass"]])
               for names in (_STATE_KERNELS, _BWD_STATE_KERNELS)]
        lines.append(f"| {r['op']} | {r['shape']} | {r['pass_']} | "
                     f"{r['channelwise_state_pass']} | {_ms(r.get('kernel_ms'))} | "
                     f"{_ms(own[0])} | {_ms(own[1])} | {_ms(r.get('ms'))} | "
                     f"{'green' if r.get('gate') else 'RED'} |")
    return lines


def grad_pass_lines(records):
    """Markdown lines of the ``ours`` records of KDA / GDN-2 run per ``--channelwise_grad_pass``
    (each value's kernel and wall time, the grad-pass kernel's own time from the breakdown,
    that time plus ``backward_chunk``'s, which K2 (``mosaic_fused``) also replaces, the state
    pass it ran with, and its gate); ``[]`` without such records."""
    recs = [r for r in records if r.get("channelwise_grad_pass") and r["peer"] == "ours"]
    if not recs:
        return []

    lines = ["", "Channelwise grad passes (`--channelwise_grad_pass`, peer ours; "
                 "MOSAIC_GPU.md Sec. 20, 21): the Triton kernel `channelwise_grad_blocks`, the "
                 f"Mosaic GPU kernel `{_GRAD_KERNELS['mosaic']}` (K1) or "
                 f"`{_GRAD_KERNELS['mosaic_fused']}` (K2, which also replaces "
                 "`channelwise_backward_chunk` and the kr chain rule).", "",
             "| op | shape | pass | state pass | grad pass | kernel | grad-pass kernel "
             "| + backward_chunk | wall | gate |",
             "|---|---|---|---|---|---:|---:|---:|---:|---|"]

    for r in recs:
        own = _own_ms(r, _GRAD_KERNELS[r["channelwise_grad_pass"]])
        chunk = _own_ms(r, "channelwise_backward_chunk")
        both = None if own is None else own + (chunk or 0.0)
        lines.append(f"| {r['op']} | {r['shape']} | {r['pass_']} | "
                     f"{r.get('channelwise_state_pass') or 'default'} | "
                     f"{r['channelwise_grad_pass']} | {_ms(r.get('kernel_ms'))} | {_ms(own)} | "
                     f"{_ms(both)} | {_ms(r.get('ms'))} | "
                     f"{'green' if r.get('gate') else 'RED'} |")
    return lines


# Kernel-name substrings of the chunk-local backward of each --mosaic_backward value: stages 3
# and 4 ("split"), or the fused kernel and the T0 kernel it may recompute ("fused").
_BACKWARD_KERNELS = {"split": ("gdn_chunk_grads", "gdn_chunk_wy_bwd"),
                     "fused": ("gdn_chunk_bwd_fused", "gdn_chunk_kkt_inverse"),
                     "fused_ws": ("gdn_chunk_bwd_fused_ws", "gdn_chunk_kkt_inverse")}
# Kernel-name substrings of stage 1 and the reverse state pass: separate, or folded (Sec. 32;
# "gdn_chunk_delta_dh" also matches "gdn_chunk_delta_dh_fold" and the "_pieces" launches).
_DV_LOCAL_KERNELS = ("gdn_chunk_dv_local", "gdn_chunk_delta_dh")


def mosaic_backward_lines(records):
    """Markdown lines of the ``mosaic`` GDN / DeltaNet records run per ``--mosaic_backward``
    (each value's kernel and wall time, the own time of the chunk-local backward it replaces
    or runs, that of ``dv_local`` and the reverse state pass (:data:`_DV_LOCAL_KERNELS`:
    ``gdn_chunk_dv_local`` + ``gdn_chunk_delta_dh*``, or the folded ``gdn_chunk_delta_dh_fold*``
    alone for a ``+fold`` value), and its gate); ``[]`` without such records. The main table
    keeps the last value's record only. The ``fused`` own time includes the ``T0`` kernel's
    (``gdn_chunk_kkt_inverse``: once in the forward of ``fused_t0``, else also once in the
    backward)."""
    recs = [r for r in records if r.get("mosaic_backward") and r["peer"] == "mosaic"]
    if not recs:
        return []

    lines = ["", "Mosaic GDN / DeltaNet backwards (`--mosaic_backward`, peer mosaic; "
                 "MOSAIC_GPU.md Sec. 31): `split`, stages 3 and 4 (`gdn_chunk_grads`, "
                 "`gdn_chunk_wy_bwd`), or `fused` / `fused_ws`, `gdn_chunk_bwd_fused` / "
                 "`gdn_chunk_bwd_fused_ws` (one / three warpgroups; with "
                 "`gdn_chunk_kkt_inverse*`, the T0 kernel); `+fold`: `dv_local` formed in the "
                 "reverse state pass (Sec. 32); `+t0w`: `W` formed there from `T0`, the T0 "
                 "kernel without `_w` (Sec. 51).", "",
             "| op | shape | pass | backward | kernel | chunk-local backward kernels | "
             "dv_local + reverse pass | wall | gate |",
             "|---|---|---|---|---:|---:|---:|---:|---|"]
    for r in recs:
        value = r["mosaic_backward"]
        base = mosaic_backward_base(value)
        own = _own_ms(r, *_BACKWARD_KERNELS[base])
        dvl = _own_ms(r, *_DV_LOCAL_KERNELS)
        lines.append(f"| {r['op']} | {r['shape']} | {r['pass_']} | {value} | "
                     f"{_ms(r.get('kernel_ms'))} | {_ms(own)} | {_ms(dvl)} | {_ms(r.get('ms'))} | "
                     f"{'green' if r.get('gate') else 'RED'} |")
    return lines


# The kernel name of each grad pass in the profiler's per-kernel breakdown (a substring).
_GRAD_KERNELS = {"triton": "channelwise_grad_blocks", "mosaic": "channelwise_grad_intra_mosaic",
                 "mosaic_fused": "channelwise_grad_chunk_mosaic"}
# The kernel name of each state pass in the profiler's per-kernel breakdown (a substring).
_STATE_KERNELS = {"triton": "channelwise_forward", "mosaic": "channelwise_state_fwd_mosaic"}
_BWD_STATE_KERNELS = {"triton": "channelwise_backward_state",
                      "mosaic": "channelwise_state_bwd_mosaic"}


def breakdown_lines(records):
    """Markdown lines of the per-kernel device time (ms per call) of every record that has one:
    where each pass's kernel time goes, ours next to the peers'."""
    latest = {(r["op"], r["shape"], r["pass_"], r["peer"]): r for r in records}  # as the table
    with_kernels = [r for r in latest.values() if r.get("kernels")]
    if not with_kernels:
        return []
    lines = ["", f"Per-kernel device time, ms per call (the {BREAKDOWN_TOP} largest kernels of "
                 "each record by name, the rest as (other); same traces as the kernel column):",
             ""]
    for r in with_kernels:
        parts = ", ".join(f"{name} {ms:.3f}" for name, ms in r["kernels"].items())
        lines.append(f"- {r['op']} {r['shape']} {r['pass_']}, {r['peer']}: {parts}")
    return lines


_START = time.monotonic()


def _append(rec):
    """Appends one record to ``<out>.jsonl`` at once, so a run cut short keeps what it measured.
    Sets the record's ``t_s``: seconds since this process started (what compiling, the gate and
    the profile cost per record, for planning a device window)."""
    rec.setdefault("t_s", round(time.monotonic() - _START, 1))
    if _OUT.value:
        os.makedirs(os.path.dirname(os.path.abspath(_OUT.value)), exist_ok=True)
        with open(_OUT.value + ".jsonl", "a") as f:
            f.write(json.dumps(rec) + "\n")


def main(argv):
    del argv
    if _TORCH_WORKER.value:
        for rec in run_fla():
            print("FLA_RECORD " + json.dumps(rec), flush=True)
        return
    _check_mosaic_forward()
    _check_mosaic_gla_residual_h()
    _check_mosaic_gla_stages()
    _check_mosaic_rs_stages()
    _check_mosaic_rs_protocol()
    _check_mosaic_rs_residuals()
    _check_mosaic_rs_pieces()
    _check_mosaic_backward()
    _check_channelwise_state_pass()
    _check_channelwise_grad_pass()
    _apply_mosaic_t0()  # refuse a bad value before anything runs (run_jax applies it again)
    if _MOSAIC_T0_PIECES.value is not None:
        from pallas_kernels.gated_delta_rule import mosaic_vjp
        mosaic_vjp.FUSED_T0_PIECES = _MOSAIC_T0_PIECES.value
    if _MOSAIC_PIECE_SKIP.value is not None:
        from pallas_kernels.gated_delta_rule import mosaic_vjp
        mosaic_vjp.PIECE_SKIP = _MOSAIC_PIECE_SKIP.value
    if _MOSAIC_MAPS_CARRY_X.value is not None:
        from pallas_kernels.gated_delta_rule import mosaic_vjp
        mosaic_vjp.MAPS_CARRY_X = _MOSAIC_MAPS_CARRY_X.value
    if _MOSAIC_APPROX_MATH.value is not None:
        from pallas_kernels.common import mosaic_gpu_lib
        mosaic_gpu_lib.APPROX_MATH = _MOSAIC_APPROX_MATH.value
    records = []
    command = "python " + " ".join(sys.argv)
    if "fla" in _PEERS.value and _on_tpu():
        print("skipping peer fla: it needs torch + Triton on a CUDA GPU (backend is tpu)",
              flush=True)
    elif "fla" in _PEERS.value:
        args = [sys.executable, os.path.abspath(__file__), "--torch_worker"] + [
            a for a in sys.argv[1:] if not a.startswith("--out")]
        env = dict(os.environ)
        if _FLA_CACHE.value:
            env.update(TRITON_CACHE_DIR=os.path.abspath(_FLA_CACHE.value),
                       TRITON_CACHE_AUTOTUNING="1")
        # Streamed line by line: a run cut short keeps every record the worker printed. stderr
        # goes to a file, so a chatty worker cannot fill a pipe nobody reads and stall.
        with tempfile.TemporaryFile("w+") as err, subprocess.Popen(
                args, stdout=subprocess.PIPE, stderr=err, text=True, bufsize=1,
                env=env) as proc:
            for line in proc.stdout:
                if line.startswith("FLA_RECORD "):
                    records.append(json.loads(line[len("FLA_RECORD "):]))
                    _append(records[-1])
                    print(line.rstrip(), flush=True)
            proc.wait()
            err.seek(0)
            stderr = err.read()
        if proc.returncode != 0:
            print("fla worker failed:\n" + stderr[-3000:], flush=True)
    run_jax(records)
    versions = _versions()
    md = markdown(records, versions, command)
    print(md)
    if _OUT.value:
        os.makedirs(os.path.dirname(os.path.abspath(_OUT.value)), exist_ok=True)
        with open(_OUT.value + ".json", "w") as f:
            json.dump(dict(versions=versions, command=command, records=records), f, indent=1)
        with open(_OUT.value + ".md", "w") as f:
            f.write(md)


if __name__ == "__main__":
    from lattn_jax import flag_errors  # one-line flag errors (absl only)
    app.run(main, flags_parser=flag_errors.parse_flags)
