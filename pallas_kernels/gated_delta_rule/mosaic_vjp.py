"""Differentiable Gated DeltaNet / DeltaNet on the Mosaic GPU kernels (Hopper).

:func:`gated_delta_rule_mosaic` wraps the forward stages of
:mod:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu` (with ``forward="fused_t0"``, the
default, or ``"fused_t0_split"``: ``chunk_kkt_inverse_mosaic`` and
``chunk_delta_fused_t0_fwd_mosaic`` (``split_output`` for the latter), ``W`` formed by the
``T0`` kernel only when differentiated; ``"fused_t0"`` on rows with too few CTAs runs them as
sequence pieces, the ``T0`` kernel then always forming ``W`` for the pieces' maps
(:data:`FUSED_T0_PIECES`, MOSAIC_GPU.md Sec. 42); with ``forward="three_pass"``, and on rows
with too few CTAs for ``"fused_t0_split"``: ``chunk_wy_mosaic``, ``chunk_delta_h_mosaic``, the
scalar-decay ``chunk_output_mosaic``; with ``forward="fused"`` or ``"fused_split"``,
``chunk_wy_mosaic`` and
:func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu_fused.chunk_delta_fused_fwd_mosaic`,
which stores ``h`` and ``v_new`` only when differentiated (``v_new`` also for
``return_residual``)) in a ``jax.custom_vjp``
whose backward chains the four backward stages (paper arXiv 2412.06464, Sec. 3.3; paper arXiv
2607.07953, Sec. 3.2, Eqs. 15-17; FLA's ``chunk_gated_delta_rule_bwd``,
``fla/ops/gated_delta_rule/chunk.py``):

1. :func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu_bwd.chunk_dv_local_mosaic`,
2. :func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu.chunk_delta_dh_mosaic` (the reverse
   state pass: ``dS'`` of every chunk, total ``dv_new``, ``dh0``),
3. :func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu_bwd.chunk_delta_grads_mosaic`
   (``dq``, the state/score part of ``dk``, ``dw``, the explicit part of ``dg``),
4. :func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu_wy_bwd.chunk_wy_bwd_mosaic`
   (``dk``, ``dv``, ``dbeta`` and the rest of ``dg`` through ``W, U``),

as ``tests/pallas_kernels/kernel_mosaic_gdn_wy_bwd_test.py``'s whole-backward pipeline
test: ``dk`` and ``dg`` are the sums of the stage-3 and stage-4 parts (both are gradients of
the per-token ``k`` and ``g``), ``dU = dv_new``. Since 2026-12-05 (MOSAIC_GPU.md Sec. 27) the
sums are formed in stage 4's kernel, not in XLA: stage 3
(:func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu_bwd.chunk_delta_grads_partials_mosaic`)
hands over its fp32 ``dk`` per value head and its per-token ``dL/dG`` and boundary partials,
stage 4 adds them in fp32, does ``dg``'s in-chunk reverse cumsum and writes ``dk`` and ``dv``
in the input dtype; stage 3 writes ``dq`` in the input dtype and stage 4 reads ``dU`` in it.
With GVA (``Hk < H``) at ``K = 64`` (the model presets) stage 3 runs one CTA per key head
that loops over its value heads and sums ``dq`` in fp32 SMEM, so ``dq`` leaves
``[B, T, Hk, K]`` in the input dtype too; ``dk`` (and ``dq`` at ``K = 128``) still leaves in
fp32 per value head for XLA's group sum, then is rounded once: the same loop in stage 4
(``gva_loop=True``) spills in offline ptxas (MOSAIC_GPU.md Sec. 27.5).

The residual ``u`` (FLA's ``v_new``, which cross-layer routing reads) is returned on request
(``return_residual``): it is the forward's ``v_new``, and its cotangent ``du`` is added to
stage 1's ``dv_local`` (in the kernel, in fp32) before the reverse state pass, since
``dL/dv_new`` is the sum of its three uses (the chunk's own read-out, the state, the output
``u`` itself) and stage 2 carries the total through ``dS'_{c-1} = ... - W_c^T dv_new_c``.

With ``backward="fused"`` or ``"fused_ws"`` (MOSAIC_GPU.md Sec. 31; ``"fused_ws"``, on three
warpgroups, is the default since its first Hopper timing, Sec. 31.8) stages 3 and 4 are one kernel,
:func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu_bwd_fused.chunk_bwd_fused_mosaic`, in
jla's value-space form: it reads the gate-free inverse ``T0`` (kept by the ``fused_t0``
forwards as one more residual, else recomputed by ``chunk_kkt_inverse_mosaic``) and writes
``dq, dk, dv`` in the input dtype and fp32 ``dbeta``, ``dg``, with no fp32 ``dw`` / ``dk``
partials through HBM and no recomputed inverse. With GVA at ``K = 64`` (the presets) the
``"fused_ws"`` kernel sums ``dq`` and ``dk`` over each group itself (its GVA loop, fp32 in
SMEM, rounded once: Sec. 33), so they leave ``[B, T, Hk, K]`` with no XLA group sum; at
``K = 128`` and with ``"fused"`` they leave per value head in fp32 for XLA's sum.

With ``dv_local="fold"`` (MOSAIC_GPU.md Sec. 32; not the default until a GPU timing) stages 1
and 2 are one kernel: the reverse state pass
(:func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu.chunk_delta_dh_mosaic` with
``fold_dv_local=True``) forms ``dv_local`` (and adds ``du``) in a third warpgroup, so
``dv_local`` never reaches HBM and its launch is gone; same roundings, same results.

With ``dh_w="t0"`` (MOSAIC_GPU.md Sec. 51; off by default until a GPU timing) and
``dv_local="fold"``, the fused ``T0`` forwards on whole rows keep no ``W``: their ``T0`` kernel
runs without ``return_w`` and the folded reverse pass forms ``W`` per chunk from the ``T0``
residual (``chunk_delta_dh_mosaic(w_from_t0=True)``), as jla's state backward does.

Dispatch: :func:`pallas_kernels.gated_delta_rule.api.gated_delta_rule` runs this op for
``implementation="mosaic_gpu"`` (``"mosaic_gpu_interpret"``: interpret mode), and for
``"auto"`` on Hopper where the call fits (since 2026-12-06, timed faster than the Triton kernels
at S1, S2 and P1 on an H100); ``delta_rule``'s ``"auto"`` keeps the Triton kernels until its own
table is timed (:data:`pallas_kernels.common.mosaic_gpu.AUTO_OFF`).

Status (2026-12-05): tested in interpret mode against ``jax.vjp`` of
``chunked.gated_delta_rule_chunked`` and exported for CUDA with its backward
(``tests/pallas_kernels/kernel_mosaic_gdn_vjp_test.py``); timed once on an H200 at S1
(before the sequence pieces existed; its correctness gate passed:
``benchmarks/results/mosaic-gpu-h200-2026-12-05.md``). The three backwards' ``GpuTest`` cases
passed on an H100 and ``"fused_ws"`` timed fastest there
(``benchmarks/results/mosaic-gpu-h100-2026-12-05.md``). The public op's ``gpu`` tests
(``return_residual``) and the sequence pieces (MOSAIC_GPU.md Sec. 29) have not run on a GPU.
"""

import functools
from typing import Optional, Tuple, Union

import jax
import jax.numpy as jnp

from pallas_kernels.common import mosaic_gpu_lib as mgl
from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu as kgd
from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu_bwd as kbwd
from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu_bwd_fused as kbf
from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu_fused as kfused
from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu_maps_x as kmx
from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu_rs as krs
from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu_wy_bwd as kwb
from pallas_kernels.simple_gla import kernel_mosaic_gpu as sg

# How the backward runs its chunk-local gradients (``backward=``): "split", stages 3 and 4
# (``chunk_delta_grads_partials_mosaic`` + ``chunk_wy_bwd_mosaic``), or "fused", one kernel
# (``chunk_bwd_fused_mosaic``, MOSAIC_GPU.md Sec. 31) with ``T0`` from the forward (``fused_t0``
# forwards) or ``chunk_kkt_inverse_mosaic``, on one warpgroup; or "fused_ws", the same kernel
# split over three warpgroups (``warpgroups=3``, Sec. 31.7). The default is "fused_ws": on an H100
# (2026-12-05, Sec. 31.8) it was the fastest of the three at S1 (op fwd+bwd 2.246 ms of kernels
# against 2.551 fused and 2.821 split) with every correctness gate green.
BACKWARDS = ("split", "fused", "fused_ws")
DEFAULT_BACKWARD = "fused_ws"

# How the backward forms dv_local (``dv_local=``, MOSAIC_GPU.md Sec. 32): "separate", stage 1's
# own kernel (``chunk_dv_local_mosaic``) writes it to HBM for the reverse state pass; "fold",
# the reverse state pass forms it in a third warpgroup (``fold_dv_local=True``). The default is
# "fold": on an H100 (2026-12-06, Sec. 32.2) the op's fwd+bwd kernel time with ``fused_ws`` was
# 2.044 ms at S1 and 2.584 at S2 against "separate"'s 2.250 and 2.789, the gates green.
DV_LOCALS = ("separate", "fold")
DEFAULT_DV_LOCAL = "fold"

# Where the reverse state pass gets W (``dh_w=``, MOSAIC_GPU.md Sec. 51): "stored", the
# forward's residual (for the fused T0 forwards the T0 kernel's return_w form writes it,
# gdn_chunk_kkt_inverse_subst_split_w); "t0", the folded pass forms W per chunk from the T0
# residual in its dv_local warpgroup (chunk_delta_dh_mosaic(w_from_t0=True), kernel
# gdn_chunk_delta_dh_fold_t0), so the forward runs the plain T0 kernel and writes no W. "t0"
# takes effect only where it saves that write: dv_local="fold", a fused T0 forward on whole
# rows (fused_t0_pieces(...) == 1: the pieces' maps need W, which the T0 kernel then forms
# anyway); elsewhere the stored W runs. "stored" until a GPU timing.
DH_WS = ("stored", "t0")
DEFAULT_DH_W = "stored"

# The fused T0 forwards (forward="fused_t0" / "fused_t0_split") run one CTA per (b, h, 64 value
# columns) over the whole row, with no sequence pieces: at B 1, T 32768, H 16, V 128 that is 32
# CTAs on 132 SMs, and the kernel took 1.70 ms on an H100 (2026-12-06, MOSAIC_GPU.md Sec. 36)
# where the three-pass state pass runs its rows as 4 pieces. With this on (the default), such
# rows (those the three-pass state pass would split, mosaic_gpu_lib.num_pieces > 1) run the
# three-pass forward instead, or with FUSED_T0_PIECES (the default) "fused_t0" as sequence
# pieces: resolve_forward and fused_t0_pieces, the one place that decides. Off: whole rows.
FUSED_T0_FALLBACK = True

# With FUSED_T0_FALLBACK on, whether forward="fused_t0" runs such rows as sequence pieces
# (MOSAIC_GPU.md Sec. 42: the T0 kernel with W, the pieces' maps from W
# (kernel_mosaic_gpu.chunk_delta_piece_maps_mosaic), their passes from zero (the fused T0
# kernel's state chain, summary=True), the entry states by an XLA loop, then the fused T0 kernel
# on the pieces as rows) instead of the three-pass forward; "fused_t0_split" always falls back.
# On since 2026-12-06g (Sec. 42.2): on an H100 at S2 (B 1, T 32768, H 16, K = V = 128, bf16) the
# forward took 0.974 ms against the three-pass fallback's 1.115 (same call), and the kernels the
# path changes 1.57 ms of the fwd+bwd step against 1.78 at S2 and P1 in two calls; the gate and
# the four gpu tests of the path green.
FUSED_T0_PIECES = True

# With documents (segment_ids given), whether the fused T0 forward's sequence pieces skip what a
# document start cuts (MOSAIC_GPU.md Sec. 52): a piece in which a document starts has the state
# map M_p = 0 exactly (the maps launch writes the zeros without running its chain: kernel
# gdn_chunk_delta_h_maps_skip), and its pass from zero X_p depends only on the chunks from the
# one of its last document start (the summary launch starts there: ..._summary_skip). One int32
# per piece (mosaic_gpu_lib.piece_cuts), formed in XLA from the document vectors. The backward
# (any forward with pieces): the reverse pass from a zero exit gradient (Y_p) runs each piece
# only from its first document start down (chunk_delta_dh_mosaic(piece_skip=True), kernel
# ..._pieces_skip). Without documents nothing changes. Off until a GPU timing at P1 (Sec. 52).
PIECE_SKIP = False

# Whether the fused T0 forward's sequence pieces form their maps M_p and their passes from zero
# X_p in one launch (MOSAIC_GPU.md Sec. 57, issue 29 Sec. 49 finding 2:
# kernel_mosaic_gpu_maps_x.chunk_delta_piece_maps_x_mosaic, kernel gdn_chunk_delta_h_maps_x)
# instead of the maps launch plus a second run of the fused T0 kernel (summary=True). One CTA
# per (piece, head, 64 columns) carries both chains over one shared TMA ring (the k and W reads
# shared); the local chain takes v_new as Ag V - W X (Ag V issued beside W X), so it is as deep
# as the maps chain. Composes with PIECE_SKIP (..._maps_x_skip). Off until a GPU timing at S2
# and P1 (Sec. 57's rule).
MAPS_CARRY_X = False

# The forward of :func:`gated_delta_rule_mosaic` when none is named. "fused_t0" since
# 2026-12-06 (MOSAIC_GPU.md Sec. 38.1): on an H100 at S1 (B 8, T 4096, H 16, K = V = 128, bf16)
# the op's fwd+bwd kernel time with the default backward was 1.705 ms (12-06c) and 1.717
# (12-06e) against "three_pass"'s 2.044 (12-06, Sec. 32.2), the gates green, and the seven
# `gpu` tests of Sec. 38 passed on that card (12-06e). Rows with too few CTAs run it as
# sequence pieces (FUSED_T0_PIECES, since 2026-12-06g; "three_pass" before).
# "fused_rs" since 2026-12-08 (MOSAIC_GPU.md Sec. 63, Sec. 56.4's rule): on an H100 at S1 fwd its
# kernel took 0.264 ms against fused_t0's 0.409 (0.65x), the op's forward 0.371 against 0.513,
# and its eleven `gpu` tests passed. It runs the primal only: under differentiation, with
# return_residual and on rows with too few CTAs it falls back to "fused_t0" (logged once; unless
# RS_RESIDUALS / RS_PIECES), so the training step runs what it ran before.
DEFAULT_FORWARD = "fused_rs"
# Keyword arguments of kernel_mosaic_gpu_rs.chunk_delta_fused_rs_fwd_mosaic at the op's call
# (forward="fused_rs"): empty, the defaults. For timing variants only (bench_kernels.py
# --mosaic_rs_stages sets stages, --mosaic_rs_protocol protocol (MOSAIC_GPU.md Sec. 64),
# --mosaic_rs_residual_from residual_from, which only the residual form reads; read at trace
# time).
RS_OPTIONS: dict = {}
# Whether forward="fused_rs" runs its own kernel's residual form under differentiation and with
# return_residual (MOSAIC_GPU.md Sec. 58): chunk_delta_fused_rs_fwd_mosaic(store_h=...,
# store_v_new=...) writes h and v_new as fused_t0 does (same arrays, layouts and kind of
# roundings), the T0 kernel forms W (or not, dh_w="t0") and T0 is kept, so the backward is
# unchanged. Off (the default until a GPU timing): fused_rs falls back to fused_t0 there, as
# before. Rows with too few CTAs fall back either way (resolve_forward). Read at trace time
# (bench_kernels.py --mosaic_rs_residuals sets it).
RS_RESIDUALS = False
# Whether forward="fused_rs" runs rows with too few CTAs (S2, P1) as sequence pieces with its own
# kernel for the last launch (MOSAIC_GPU.md Sec. 60): the pieces' maps M_p and passes from zero
# X_p and the entry states e_p as for "fused_t0" (_fused_t0_pieces; MAPS_CARRY_X and PIECE_SKIP
# apply there unchanged), then kernel_mosaic_gpu_rs.chunk_delta_fused_rs_fwd_mosaic(pieces=P) on
# the pieces as rows from e_p instead of the fused T0 kernel (with RS_RESIDUALS under
# differentiation its residual form: h at global chunk indices, v_new). Off (the default until a
# GPU timing at S2 and P1): such rows fall back to "fused_t0"'s pieces, as before. Read at trace
# time (bench_kernels.py --mosaic_rs_pieces sets it).
RS_PIECES = False


def resolve_forward(forward: str, batch: int, heads: int, dv: int, seq_len: int) -> str:
    """The forward that :func:`gated_delta_rule_mosaic` runs for ``forward`` at this shape:
    ``"three_pass"`` for a fused ``T0`` forward whose rows have too few CTAs (the three-pass
    state pass would run them as sequence pieces; :data:`FUSED_T0_FALLBACK`), else
    ``forward``. ``"fused_rs"`` resolves as ``"fused_t0"`` on such rows (logged once,
    :func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu.rs_fallback`), or stays
    ``"fused_rs"`` with :data:`RS_PIECES` and :data:`FUSED_T0_PIECES` (its kernel on the
    sequence pieces, MOSAIC_GPU.md Sec. 60)."""
    if (not FUSED_T0_FALLBACK or forward not in ("fused_t0", "fused_t0_split", "fused_rs")
            or mgl.row_pieces(batch, heads, dv, seq_len) == 1):
        return forward
    if forward == "fused_rs" and RS_PIECES and FUSED_T0_PIECES:  # Sec. 60
        return forward
    if forward == "fused_rs":  # without RS_PIECES: "fused_t0" runs them as sequence pieces
        forward = kgd.rs_fallback("rows with too few CTAs: sequence pieces")
    return forward if forward == "fused_t0" and FUSED_T0_PIECES else "three_pass"


def fused_t0_pieces(forward: str, batch: int, heads: int, dv: int, seq_len: int) -> int:
    """The sequence pieces ``P`` per row that the ``forward`` resolved by
    :func:`resolve_forward` runs: ``P > 1`` for ``"fused_t0"`` on rows with few CTAs while
    :data:`FUSED_T0_FALLBACK` and :data:`FUSED_T0_PIECES` are on (the choice of
    :func:`pallas_kernels.common.mosaic_gpu_lib.num_pieces`, as the three-pass state pass
    makes it), and for ``"fused_rs"`` with :data:`RS_PIECES` as well (MOSAIC_GPU.md Sec. 60),
    else 1 (whole rows)."""
    rs = ("fused_rs",) if RS_PIECES else ()
    if forward not in ("fused_t0",) + rs or not (FUSED_T0_FALLBACK and FUSED_T0_PIECES):
        return 1
    return mgl.row_pieces(batch, heads, dv, seq_len)


def gated_delta_rule_mosaic(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: Optional[jax.Array],
    beta: jax.Array,
    *,
    scale: Optional[float] = None,
    initial_state: Optional[jax.Array] = None,
    segment_ids: Optional[jax.Array] = None,
    output_final_state: bool = False,
    forward: str = DEFAULT_FORWARD,
    interpret: bool = False,
    return_residual: bool = False,
    backward: str = DEFAULT_BACKWARD,
    dv_local: str = DEFAULT_DV_LOCAL,
    dh_w: str = DEFAULT_DH_W,
) -> Union[Tuple[jax.Array, Optional[jax.Array]],
           Tuple[jax.Array, Optional[jax.Array], jax.Array]]:
    """Differentiable Gated DeltaNet (``g``) or DeltaNet (``g=None``) on Mosaic GPU kernels.

    Computes, per batch row and value head (paper arXiv 2607.07953, Eqs. 15-17; as
    :func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu.gated_delta_rule_fwd_mosaic`)::

        u_t = beta_t (v_t - e^{g_t} S_{t-1}^T k_t),   S_t = e^{g_t} S_{t-1} + k_t u_t^T,
        o_t = scale * S_t^T q_t

    with the state reset to zero at document starts, and a ``jax.custom_vjp`` whose backward
    chains the four Mosaic backward stages (module docstring). Per chunk ``c`` (notation of
    :mod:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu_bwd`)::

        dv_new_c = dv_local_c + diag(last e^{G_L - G}) K_c dS'_c
        dS'_{c-1} = keep_c e^{G_L} dS'_c + scale (diag(conn e^G) Q_c)^T do_c - W_c^T dv_new_c
        dU = dv_new,   dW = -dv_new S_c^T
        dk = dk_(b,c) + dk_WY,   dg = dg_(b,c) + dg_WY,   dv, dbeta from the WY backward

    Residuals (saved by the forward, not recomputed): the inputs plus ``W`` ``[B, T, H, K]``
    and ``v_new`` ``[B, T, H, V]`` (input dtype) and the chunk-entry states ``h``
    ``[B, H, ceil(T / 64), K, V]`` (input dtype): per token and value head
    ``2 (K + V + K V / 64)`` bytes in bf16, 1,024 bytes at K = V = 128 (four times ``v``).
    ``U`` is not kept (the backward needs only ``dU``); the WY backward recomputes the inverse
    ``T`` from ``k``, ``g``, ``beta`` (``kernel_mosaic_gpu_wy_bwd``'s docstring says why).
    Also kept: the chunk-local gate cumsum ``G`` (fp32 ``[B, H, Tp]``, ``Tp = 64 ceil(T / 64)``,
    4 bytes per token and value head) and the document vectors (fp32 ``[B, Tp]``, three), each
    formed once per call and shared by all seven kernels (MOSAIC_GPU.md Sec. 27).

    Args:
        q, k: ``[B, T, Hk, K]``, bf16 or fp16 (GVA when ``Hk < H``: value head ``h`` reads
            query/key head ``h // (H // Hk)``); used as given (L2-normalise them beforehand).
        v: ``[B, T, H, V]``, same dtype; ``K, V`` in {64, 128}.
        g: log-decay ``[B, T, H]`` (natural log, ``<= 0``; fp32 preferred) or ``None``
            (DeltaNet).
        beta: write strengths ``[B, T, H]`` in ``(0, 1)``, any float dtype (used in fp32).
        scale: read-out scale (static); ``None`` means ``K ** -0.5``.
        initial_state: ``[B, H, K, V]`` or ``None`` (zeros); first document of each row only.
        segment_ids: optional int ``[B, T]`` (packed documents); not differentiated.
        output_final_state: whether to return the state after the last token (static); when
            ``False`` the backward runs with a zero final-state gradient.
        forward: how the forward runs its state pass and output (static), as
            :func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu.gated_delta_rule_fwd_mosaic`'s
            ``forward``: ``"three_pass"``, ``"fused"`` or ``"fused_split"``
            (:func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu_fused.chunk_delta_fused_fwd_mosaic`)
            or ``"fused_t0"`` / ``"fused_t0_split"``
            (``chunk_kkt_inverse_mosaic`` and
            :func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu_fused.chunk_delta_fused_t0_fwd_mosaic`,
            two or three warpgroups; rows with too few CTAs for them run ``"three_pass"``
            instead, :func:`resolve_forward`, or with :data:`FUSED_T0_PIECES`
            ``"fused_t0"`` as sequence pieces, :func:`fused_t0_pieces`).
            Under differentiation the fused kernels also store ``h`` and ``v_new`` (the
            residuals); without it (the primal alone) they store neither. ``"fused_t0"`` and
            ``"fused_t0_split"`` have no ``W``: under differentiation the ``T0`` kernel forms
            it from its fp32 ``T0`` (``chunk_kkt_inverse_mosaic(return_w=True)``, rounded once;
            MOSAIC_GPU.md Sec. 36; it was an XLA product before). The backward is the same
            for every forward. ``"fused_rs"`` (the default, :data:`DEFAULT_FORWARD`;
            MOSAIC_GPU.md Sec. 56 and 63): the
            primal alone from ``T0`` with the state carried transposed in registers
            (:func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu_rs.chunk_delta_fused_rs_fwd_mosaic`,
            jla's schedule, :data:`RS_OPTIONS`); it stores no residuals, so under
            differentiation, with ``return_residual`` and on rows with too few CTAs it runs
            ``"fused_t0"`` instead and logs why once
            (:func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu.rs_fallback`). With
            :data:`RS_RESIDUALS` on (off by default, MOSAIC_GPU.md Sec. 58) it runs its
            kernel's residual form there instead (``store_h``, ``store_v_new``; ``T0`` kept,
            ``W`` from the ``T0`` kernel or, with ``dh_w="t0"``, from ``T0``); rows with too
            few CTAs still fall back, unless :data:`RS_PIECES` is on (off by default,
            MOSAIC_GPU.md Sec. 60): then they run ``"fused_t0"``'s sequence pieces with this
            kernel as the last launch (``pieces=P``, from the entry states ``e_p``).
        interpret: Mosaic GPU interpret mode (CPU, tests).
        return_residual: also return the per-token residuals
            ``u_t = beta_t (v_t - e^{g_t} S_{t-1}^T k_t)`` (the forward's ``v_new``; static).
            Differentiable: ``du`` joins ``dv_local`` before the reverse state pass (module
            docstring); the fused forwards then store ``v_new`` in the primal too.
        backward: how the backward forms the chunk-local gradients (static, one of
            :data:`BACKWARDS`): ``"split"``, stages 3 and 4 of the module
            docstring; ``"fused"``, one kernel,
            :func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu_bwd_fused.chunk_bwd_fused_mosaic`
            (MOSAIC_GPU.md Sec. 31), with the gate-free inverse ``T0`` kept from the forward
            (``"fused_t0"``, ``"fused_t0_split"``: a residual of ``[B, T, H, 64]`` in the input
            dtype) or recomputed by ``chunk_kkt_inverse_mosaic`` (the other forwards);
            ``"fused_ws"`` (default), the same with the kernel's three-warpgroup form
            (``warpgroups=3``). Stages 1 and 2 are the same for all.
        dv_local: how the backward forms stage 1's ``dv_local`` (static, one of
            :data:`DV_LOCALS`): ``"separate"``, its own kernel
            (:func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu_bwd.chunk_dv_local_mosaic`)
            writing it to HBM; ``"fold"`` (default), the reverse state pass forms it
            (``chunk_delta_dh_mosaic(fold_dv_local=True)``, MOSAIC_GPU.md Sec. 32). Same
            roundings either way; every option above (GVA, documents, ``initial_state``,
            ``output_final_state``, ``return_residual``, sequence pieces, every ``forward`` and
            ``backward``) is supported with both.
        dh_w: where the reverse state pass gets ``W`` (static, one of :data:`DH_WS`):
            ``"stored"`` (default), the forward's residual; ``"t0"``, the folded pass forms
            ``W_i = e^{G_i} sum_j T0_ij beta_j conn_j k_j`` per chunk from the ``T0`` residual
            (``chunk_delta_dh_mosaic(w_from_t0=True)``, MOSAIC_GPU.md Sec. 51), so the
            forward's ``T0`` kernel writes no ``W``. Takes effect with ``dv_local="fold"`` and a
            fused ``T0`` forward on whole rows (see :data:`DH_WS`); elsewhere ``"stored"``
            runs. ``W`` then comes from ``T0`` rounded to the input dtype rather than the fp32
            ``T0`` (:func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu.w_from_t0`'s
            ``W``).

    Returns:
        ``(o, final_state)``, or ``(o, final_state, u)`` with ``return_residual``: ``o`` and
        ``u`` ``[B, T, H, V]`` in the input dtype, ``final_state`` ``[B, H, K, V]`` fp32 if
        ``output_final_state`` else ``None``. Gradients flow to
        ``q, k, v, g, beta, initial_state``, each in its own dtype (``None`` for ``g`` when
        ``g`` is ``None``; computed in fp32 and rounded once).

    Raises:
        ValueError: on a ``beta`` that is not ``[B, T, H]``, an ``initial_state`` that is not
            ``[B, H, K, V]``, an unknown ``forward``,
            ``backward``, ``dv_local`` or ``dh_w``, and as
            the kernels (shapes, dtypes, head dims, ``H`` not a multiple of ``Hk``).
    """
    batch, seq_len, _, dk = k.shape
    heads = v.shape[2]
    if scale is None:
        scale = dk ** -0.5
    if beta.shape != (batch, seq_len, heads):
        raise ValueError(f"beta must be [B, T, H] = {(batch, seq_len, heads)}, got {beta.shape=}")
    want = (batch, heads, dk, v.shape[3])
    if initial_state is not None and initial_state.shape != want:
        raise ValueError(f"initial_state must be [B, H, K, V] = {want}, got "
                         f"{initial_state.shape=}")
    if forward not in kgd.FORWARDS:
        raise ValueError(f"forward must be one of {kgd.FORWARDS}, got {forward!r}")
    if backward not in BACKWARDS:
        raise ValueError(f"backward must be one of {BACKWARDS}, got {backward!r}")
    if dv_local not in DV_LOCALS:
        raise ValueError(f"dv_local must be one of {DV_LOCALS}, got {dv_local!r}")
    if dh_w not in DH_WS:
        raise ValueError(f"dh_w must be one of {DH_WS}, got {dh_w!r}")
    mgl.check_kv_gates(k, v, g, segment_ids)
    forward = resolve_forward(forward, batch, heads, v.shape[3], seq_len)  # S2: Sec. 36
    dh_w = resolve_dh_w(dh_w, forward, dv_local, batch, heads, v.shape[3], seq_len)
    out = _gdn_mosaic(q, k, v, g, beta, initial_state, segment_ids, float(scale),
                      bool(output_final_state), forward, interpret, bool(return_residual),
                      backward, dv_local, dh_w)
    final_state = out[1] if output_final_state else None
    return (out[0], final_state) + tuple(out[2:])


def resolve_dh_w(dh_w: str, forward: str, dv_local: str, batch: int, heads: int, dv: int,
                 seq_len: int) -> str:
    """The ``dh_w`` that :func:`gated_delta_rule_mosaic` runs (``forward`` already resolved by
    :func:`resolve_forward`): ``"t0"`` only with ``dv_local="fold"`` and a fused ``T0`` forward
    on whole rows (:func:`fused_t0_pieces` is 1), where it saves the ``T0`` kernel's ``W``
    write; else ``"stored"`` (:data:`DH_WS`)."""
    # "fused_rs" keeps T0 under differentiation either way: its residual form (RS_RESIDUALS,
    # Sec. 58) or its fallback there, "fused_t0" (which resolve_forward has not applied yet).
    if (dh_w == "t0" and dv_local == "fold"
            and forward in ("fused_t0", "fused_t0_split", "fused_rs")
            and fused_t0_pieces(forward, batch, heads, dv, seq_len) == 1):
        return "t0"
    return "stored"


def _shared(g, v, segment_ids):
    """``(gc, docs)``, formed once and passed to every kernel of the op (MOSAIC_GPU.md
    Sec. 27): ``gc`` the fp32 ``[B, H, Tp]`` chunk-local cumsum of ``g`` (``None`` for
    DeltaNet), ``docs`` the fp32 ``[B, Tp]`` document vectors ``(doc, conn, last)`` of
    ``segment_ids`` (:func:`pallas_kernels.common.mosaic_gpu_lib.doc_vectors`)."""
    batch, seq_len, heads = v.shape[:3]
    num_chunks = -(-seq_len // mgl.CHUNK)
    gc = None if g is None else mgl.chunk_cumsum(g, (batch, seq_len, heads), num_chunks)
    return gc, mgl.doc_vectors(segment_ids, batch, num_chunks)


def _forward(q, k, v, g, beta, initial_state, segment_ids, scale, forward, interpret,
             residuals=True, gc=None, docs=None, want_v_new=False, want_w=True):
    """``(o, final_state)`` and the residuals ``(w, h, v_new, maps, t0)`` of the forward
    stages (``t0``: the ``fused_t0`` forwards' ``T0`` under differentiation, else ``None``).

    ``maps``: the sequence-piece maps ``[B, P, H, K, K]`` of the three-pass state pass or of
    ``"fused_t0"`` on rows with few CTAs (:func:`fused_t0_pieces`, :func:`_fused_t0_pieces`;
    under differentiation), else ``None`` (one piece, or the other fused forwards). The fused
    kernels give ``None`` for ``h`` and ``v_new`` without ``residuals`` (``v_new`` is kept with
    ``want_v_new``), ``"fused_t0"`` ``None`` for ``w`` (whole rows, not differentiated).
    ``gc``, ``docs``: :func:`_shared`, passed to the three-pass kernels,
    ``chunk_wy_mosaic`` and the fused ``T0`` forwards' two kernels (not to ``"fused"`` /
    ``"fused_split"``'s fused kernel). ``want_w=False`` (``dh_w="t0"``): the fused ``T0``
    forwards on whole rows run the plain ``T0`` kernel and give ``None`` for ``w`` (the
    backward forms it from ``t0``); the other paths form ``W`` anyway and ignore it."""
    if forward == "fused_rs" and (residuals or want_v_new) and not RS_RESIDUALS:
        forward = kgd.rs_fallback("under differentiation" if residuals
                                  else "return_residual=True")
    store_v_new = residuals or want_v_new
    batch, seq_len, heads, dv = v.shape
    pieces = fused_t0_pieces(forward, batch, heads, dv, seq_len)  # "fused_rs": RS_PIECES
    if pieces > 1:  # rows with few CTAs as sequence pieces (MOSAIC_GPU.md Sec. 42, 60)
        if docs is None:
            gc, docs = _shared(g, v, segment_ids)
        t0, w = kgd.chunk_kkt_inverse_mosaic(k, beta, segment_ids=segment_ids,
                                             interpret=interpret, return_w=True, g=g,
                                             gate_cumsum=gc, doc_vecs=docs, **kgd.T0_OPTIONS)
        o, final_state, v_new, h, maps = _fused_t0_pieces(
            q, k, v, t0, w, g, beta, initial_state, gc, docs, pieces=pieces, scale=scale,
            store_v_new=store_v_new, store_h=residuals, interpret=interpret,
            piece_skip=PIECE_SKIP and segment_ids is not None, carry_x=MAPS_CARRY_X,
            **({"rs": True} if forward == "fused_rs" else {}))
        return (o, final_state), ((w, h, v_new, maps, t0) if residuals
                                  else (None, None, v_new, None, None))
    if forward in ("fused_t0", "fused_t0_split", "fused_rs"):
        # Under differentiation the T0 kernel also forms the backward's W (from its fp32 T0,
        # MOSAIC_GPU.md Sec. 36; it was an fp32 XLA product, ~0.65 ms of glue at S1 on an H100).
        # With want_w=False (dh_w="t0", MOSAIC_GPU.md Sec. 51) the reverse pass forms W itself.
        form_w = residuals and want_w
        t0 = kgd.chunk_kkt_inverse_mosaic(k, beta, segment_ids=segment_ids, interpret=interpret,
                                          return_w=form_w, g=g, gate_cumsum=gc, doc_vecs=docs,
                                          **kgd.T0_OPTIONS)  # empty unless a benchmark sets it
        t0, w = t0 if form_w else (t0, None)
        if forward == "fused_rs":  # the primal (Sec. 56) or, with RS_RESIDUALS, Sec. 58's form
            out = krs.chunk_delta_fused_rs_fwd_mosaic(
                q, k, v, t0, g, beta, scale=scale, initial_state=initial_state,
                segment_ids=segment_ids, interpret=interpret, gate_cumsum=gc, doc_vecs=docs,
                store_h=residuals, store_v_new=store_v_new, **RS_OPTIONS)
            o, final_state, v_new, h = out if len(out) == 4 else out + (None, None)
        else:
            o, final_state, v_new, h = kfused.chunk_delta_fused_t0_fwd_mosaic(
                q, k, v, t0, g, beta, scale=scale, initial_state=initial_state,
                segment_ids=segment_ids, store_v_new=store_v_new, store_h=residuals,
                split_output=forward == "fused_t0_split", interpret=interpret, gate_cumsum=gc,
                doc_vecs=docs,
                **(kgd.SPLIT_T0_OPTIONS if forward == "fused_t0_split" else {}))  # as T0_OPTIONS
        return (o, final_state), (w, h, v_new, None, t0 if residuals else None)
    w, u = kgd.chunk_wy_mosaic(k, v, g, beta, segment_ids=segment_ids, gate_cumsum=gc,
                               doc_vecs=docs, interpret=interpret)
    if forward != "three_pass":
        o, final_state, v_new, h = kfused.chunk_delta_fused_fwd_mosaic(
            q, k, w, u, g, scale=scale, initial_state=initial_state, segment_ids=segment_ids,
            store_v_new=store_v_new, store_h=residuals, split_output=forward == "fused_split",
            interpret=interpret)
        return (o, final_state), (w, h, v_new, None, None)
    # h only feeds wgmma operands (forward read-out, stage 3): stored in the input dtype. Rows
    # with few CTAs run as sequence pieces; their [K, K] maps are kept for the backward.
    h, v_new, final_state, maps = kgd.chunk_delta_h_mosaic(
        k, w, u, g, initial_state=initial_state, segment_ids=segment_ids, gate_cumsum=gc,
        doc_vecs=docs, states_dtype=v.dtype, return_maps=True, interpret=interpret)
    o = sg.chunk_output_mosaic(q, k, v_new, g, h, scale=scale, segment_ids=segment_ids,
                               gate_cumsum=gc, doc_vecs=docs, interpret=interpret)
    return (o, final_state), (w, h, v_new, maps, None)


def _fused_t0_pieces(q, k, v, t0, w, g, beta, initial_state, gc, docs, *, pieces, scale,
                     store_v_new, store_h, interpret, piece_skip=False, carry_x=False,
                     rs=False):
    """``forward="fused_t0"`` on rows cut into ``pieces`` sequence pieces (MOSAIC_GPU.md
    Sec. 42): ``(o, final_state, v_new, h, maps)``.

    Piece ``p`` maps its entry state as ``S -> M_p S + X_p``: ``M_p`` from ``W``
    (:func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu.chunk_delta_piece_maps_mosaic`),
    ``X_p`` from the fused ``T0`` kernel's state chain on the pieces as rows from zero
    (``summary=True``); the entry states ``e_0 = initial_state``, ``e_{p+1} = M_p e_p + X_p``
    (:func:`pallas_kernels.common.mosaic_gpu_lib.scan_piece_maps`, fp32); then the fused ``T0``
    kernel on the pieces as rows from ``e_p``, ``h`` written at global chunk indices
    (``pieces``). ``maps`` (``[B, P, H, K, K]`` fp32) go to the backward's reverse state pass,
    which needs the same maps. ``gc``, ``docs``: :func:`_shared` (formed on whole rows, so a
    piece's first chunk's ``conn`` gates its entry state). ``piece_skip`` (:data:`PIECE_SKIP`
    with documents, MOSAIC_GPU.md Sec. 52): the per-piece chunk of the last document start
    (int32 ``[B * P]``, :func:`pallas_kernels.common.mosaic_gpu_lib.piece_cuts`) lets the
    maps launch write ``M_p = 0`` without its chain and the summary start there; the same
    results up to the sign of zeros. ``carry_x`` (:data:`MAPS_CARRY_X`, MOSAIC_GPU.md
    Sec. 57): ``M_p`` and ``X_p`` from one launch
    (:func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu_maps_x.chunk_delta_piece_maps_x_mosaic`),
    no summary launch; ``M_p`` bit-equal, ``X_p`` within the 16-bit operand rounding (its
    ``v_new`` is ``Ag V - W X`` instead of ``Ag (V - diag(conn e^G) K X)``), with or without
    ``piece_skip``. ``rs`` (``forward="fused_rs"`` with :data:`RS_PIECES`, MOSAIC_GPU.md
    Sec. 60): the last launch is
    :func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu_rs.chunk_delta_fused_rs_fwd_mosaic`
    on the pieces as rows from ``e_p`` (:data:`RS_OPTIONS`; its residual form for ``store_h`` /
    ``store_v_new``, ``h`` at global chunk indices) instead of the fused ``T0`` kernel; the
    maps, the passes from zero and the entry states are the same."""
    batch, seq_len, heads, dv = v.shape
    dk = k.shape[-1]
    num_chunks = -(-seq_len // mgl.CHUNK)
    cuts = mgl.piece_cuts(docs[1], pieces) if piece_skip else None  # [B * P] int32
    skip_args = {"piece_skip": True, "piece_cuts": cuts} if piece_skip else {}
    if carry_x:  # M_p and X_p in one launch (MOSAIC_GPU.md Sec. 57)
        maps, x_local = kmx.chunk_delta_piece_maps_x_mosaic(
            k, v, t0, w, g, beta, pieces=pieces, gate_cumsum=gc, doc_vecs=docs,
            interpret=interpret, **skip_args)
    else:
        maps = kgd.chunk_delta_piece_maps_mosaic(
            k, w, g, pieces=pieces, gate_cumsum=gc, doc_vecs=docs, interpret=interpret,
            **skip_args)
    split = functools.partial(mgl.split_rows, pieces=pieces)
    pad = functools.partial(mgl.pad_time, num_chunks=num_chunks)
    qp, kp, vp, t0p = (split(pad(x)) for x in (q, k, v, t0))
    betap = split(pad(beta))
    gp = None if g is None else split(pad(g))
    gcp = None if gc is None else mgl.split_head_major(gc, pieces)
    run = functools.partial(kfused.chunk_delta_fused_t0_fwd_mosaic, qp, kp, vp, t0p, gp, betap,
                            scale=scale, interpret=interpret, gate_cumsum=gcp,
                            doc_vecs=tuple(split(x) for x in docs), pieces=pieces)
    if not carry_x:  # X_p from the fused T0 kernel's state chain from zero
        _, x_local, _, _ = run(summary=True, **({} if cuts is None else {"piece_cuts": cuts}))
    entries = mgl.scan_piece_maps(maps, x_local.reshape(batch, pieces, heads, dk, dv),
                                  initial_state, reverse=False)
    entries = entries.reshape(batch * pieces, heads, dk, dv)
    if rs:  # the register-resident kernel on the pieces (MOSAIC_GPU.md Sec. 60)
        out = krs.chunk_delta_fused_rs_fwd_mosaic(
            qp, kp, vp, t0p, gp, betap, scale=scale, initial_state=entries,
            interpret=interpret, gate_cumsum=gcp, doc_vecs=tuple(split(x) for x in docs),
            pieces=pieces, **({"store_h": True} if store_h else {}),
            **({"store_v_new": True} if store_v_new else {}), **RS_OPTIONS)
        o, finals, v_new, h = out if len(out) == 4 else out + (None, None)
    else:
        o, finals, v_new, h = run(initial_state=entries, store_v_new=store_v_new,
                                  store_h=store_h)
    o = o.reshape(batch, num_chunks * mgl.CHUNK, heads, dv)[:, :seq_len]
    if v_new is not None:
        v_new = v_new.reshape(batch, num_chunks * mgl.CHUNK, heads, dv)[:, :seq_len]
    final_state = finals.reshape(batch, pieces, heads, dk, dv)[:, -1]
    return o, final_state, v_new, h, maps


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9, 10, 11, 12, 13, 14))
def _gdn_mosaic(q, k, v, g, beta, initial_state, segment_ids, scale, output_final_state,
                forward, interpret, return_residual, backward, dv_local, dh_w):
    """``(o, final_state)``, plus ``u`` (``v_new``) with ``return_residual``."""
    del output_final_state, backward, dv_local, dh_w
    gc, docs = _shared(g, v, segment_ids)
    out, (_, _, v_new, _, _) = _forward(q, k, v, g, beta, initial_state, segment_ids, scale,
                                        forward, interpret, residuals=False, gc=gc, docs=docs,
                                        want_v_new=return_residual)
    return out + ((v_new,) if return_residual else ())


def _gdn_mosaic_fwd(q, k, v, g, beta, initial_state, segment_ids, scale, output_final_state,
                    forward, interpret, return_residual, backward, dv_local, dh_w):
    del output_final_state, dv_local  # dh_w is already resolved (resolve_dh_w)
    gc, docs = _shared(g, v, segment_ids)
    out, (w, h, v_new, maps, t0) = _forward(q, k, v, g, beta, initial_state, segment_ids, scale,
                                            forward, interpret, gc=gc, docs=docs,
                                            want_w=dh_w != "t0")
    out = out + ((v_new,) if return_residual else ())
    # kept for the fused backwards, and for the reverse pass when it forms W (w is None)
    t0 = t0 if backward != "split" or w is None else None
    return out, (q, k, v, g, beta, initial_state, segment_ids, w, h, v_new, gc, docs, maps, t0)


def _gdn_mosaic_bwd(scale, output_final_state, forward, interpret, return_residual, backward,
                    dv_local, dh_w, residuals, cotangents):
    del forward  # the backward is the same for every forward (T0 aside)
    q, k, v, g, beta, initial_state, segment_ids, w, h, v_new, gc, docs, maps, t0 = residuals
    do, dht = cotangents[:2]
    do = do.astype(v.dtype)
    dht = dht.astype(jnp.float32) if output_final_state else None
    seg = segment_ids
    shared = dict(segment_ids=seg, gate_cumsum=gc, doc_vecs=docs)
    # u is v_new: its cotangent joins the chunk-local part before the reverse state pass,
    # which carries the total dL/dv_new (module docstring); stage 1 adds it in fp32 (with
    # dv_local="fold", the reverse pass's dv_local warpgroup does).
    du = cotangents[2].astype(v.dtype) if return_residual else None
    fold = dv_local == "fold"
    dvl = None if fold else kbwd.chunk_dv_local_mosaic(q, k, do, g, scale=scale,
                                                       residual_grad=du, interpret=interpret,
                                                       **shared)
    w_t0 = w is None  # dh_w="t0": the folded pass forms W from T0 (MOSAIC_GPU.md Sec. 51)
    assert not w_t0 or (dh_w == "t0" and fold and t0 is not None), (dh_w, dv_local)
    dh, dvn, dh0 = kgd.chunk_delta_dh_mosaic(q, k, t0 if w_t0 else w, do, dvl, g, scale=scale,
                                             final_state_grad=dht, states_dtype=v.dtype,
                                             piece_maps=maps, fold_dv_local=fold,
                                             residual_grad=du if fold else None,
                                             w_from_t0=w_t0, beta=beta if w_t0 else None,
                                             # W from T0 has no maps to split rows with: the
                                             # whole rows, as the forward ran them
                                             pieces=1 if w_t0 and maps is None else None,
                                             interpret=interpret, **shared,
                                             **({"piece_skip": True} if PIECE_SKIP
                                                and seg is not None else {}))
    dh0 = None if initial_state is None else dh0.astype(initial_state.dtype)
    if backward in ("fused", "fused_ws"):  # stages 3 and 4 in one kernel (MOSAIC_GPU.md Sec. 31)
        if t0 is None:  # not kept by the forward: the T0 kernel again (0.09 ms at S1, H200)
            t0 = kgd.chunk_kkt_inverse_mosaic(k, beta, segment_ids=seg, interpret=interpret,
                                              **kgd.T0_OPTIONS)
        dq, dk, dv, dbeta, dg = kbf.chunk_bwd_fused_mosaic(
            q, k, v, do, v_new, dvn, t0, g, beta, h, dh, scale=scale, interpret=interpret,
            warpgroups=3 if backward == "fused_ws" else 1, **shared)
        dg = None if g is None else dg.astype(g.dtype)
        return (dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), dg,
                dbeta.astype(beta.dtype), dh0, None)
    # Stage 3 hands its fp32 chunk-local dk (per value head) and dL/dG partials to stage 4,
    # which adds them in-kernel (and does dg's in-chunk reverse cumsum), so dq, dk, dv leave
    # the kernels once, in the input dtype (MOSAIC_GPU.md Sec. 27).
    dq, dk_loc, dw, dgt, bnd = kbwd.chunk_delta_grads_partials_mosaic(
        q, k, v_new, do, dvn, g, h, dh, scale=scale, dq_dtype=q.dtype, interpret=interpret,
        **shared)
    dk, dv, dbeta, dg = kwb.chunk_wy_bwd_mosaic(
        k, v, g, beta, dw, dvn, **shared, dk_partial=dk_loc,
        dg_partial=None if g is None else (dgt, bnd), out_dtype=k.dtype, interpret=interpret)
    dg = None if g is None else dg.astype(g.dtype)
    return (dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), dg,
            dbeta.astype(beta.dtype), dh0, None)


_gdn_mosaic.defvjp(_gdn_mosaic_fwd, _gdn_mosaic_bwd)
