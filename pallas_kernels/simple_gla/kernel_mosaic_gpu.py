"""Scalar-decay linear attention as Pallas Mosaic GPU kernels (Hopper): forward and backward.

The first Mosaic GPU (``plgpu``) kernels, written as groundwork for issue 29; nothing dispatches
to them yet. :func:`simple_gla_fwd_mosaic` runs the chunk-state pass below and then the
chunk-output kernel (:func:`chunk_output_mosaic`, FLA's ``chunk_fwd_o``; its equation and
structure are in its docstring); with ``forward="fused"`` it runs both in one kernel instead,
:func:`simple_gla_fused_fwd_mosaic` (three warpgroups: memory, state, output; the chunk states
never reach HBM). The state pass computes the states that enter every chunk
of 64 tokens (the ``h`` of FLA's ``chunk_fwd_h``, ``fla/ops/common/chunk_h.py``) and the final
state, for simple GLA, Lightning attention and plain linear attention (``g = None``). Per batch
row, value head and chunk ``c``, with the chunk-local inclusive cumulative log-decay
``G_i = g_{c,0} + ... + g_{c,i}`` and ``G_L`` its last entry::

    S_{c+1} = keep_c exp(G_L) S_c + k_c^T (last_c * exp(G_L - G) * v_c)     (state [K, V], fp32)

which is the token recurrence ``S_t = exp(g_t) S_{t-1} + k_t v_t^T`` of
:func:`pallas_kernels.simple_gla.reference.simple_gla_reference` summed over one chunk (paper
"Linear Attention Architectures", arXiv 2607.07953, Eqs. 4-10; GLA, arXiv 2312.06635, Sec. 4).
With packed documents, ``last_c`` (1 on the tokens of the chunk's last document) and ``keep_c``
(1 when no document starts inside the chunk) make the chunk form exact: a document start resets
the state, so only the last document's tokens reach the next chunk, and the incoming state only
when the chunk has no start.

Kernel structure (see ``pallas_kernels/common/MOSAIC_GPU.md``): one CTA per ``(b, h, 64 value
columns)`` and two warpgroups. The memory warpgroup streams ``k``, ``v`` and the gate vectors of
each chunk into a two-stage SMEM ring with TMA copies (``copy_gmem_to_smem``, one barrier per
stage, one "free" barrier per stage back from the consumer). The state warpgroup keeps ``S``
(``[K, 64]`` fp32) as a WGMMA accumulator in registers through the chunk loop: per chunk it
stores ``S`` (the state entering the chunk) to HBM through an fp32 SMEM tile, scales the value
tile by its per-row decay into a swizzled 16-bit SMEM tile, runs one ``wgmma``
``k^T v_decayed`` (``k^T`` read as a transposed SMEM operand, fp32 accumulator) and adds
``keep exp(G_L) S``.

CPU testing: jax 0.10.2's Mosaic GPU interpreter (``InterpretGPUParams``, not yet exported from
``plgpu`` there) simulates TMA, barriers, warpgroups and ``wgmma``, but cannot evaluate
``plgpu.load`` with a layout, ``plgpu.layout_cast`` or ``plgpu.broadcasted_iota(..., layout=)``;
real lowering needs exactly those for the 64-entry gate vectors, and its ``wgmma`` cannot read
a transposed SMEM ref (``ref.T``; neither can the interpreter at jax's main branch of
2026-08). So when interpreting, :func:`_load_rows` / :func:`_load_tile` read plainly instead of
with a WGMMA layout, and ``k^T`` is copied into an SMEM scratch instead of passed as
``k_s.T``; everything else (TMA ring, barriers, warpgroups, ``wgmma`` with its fp32
accumulator, gate and document math) is the same code on both paths. The output kernel adds
two such shims: :func:`_iota` (``broadcasted_iota`` with a layout) and :func:`_lhs_operand`
(the interpreter's ``wgmma`` takes no register operand, so the masked scores go through an SMEM
scratch there). The lowering test
(``jax.jit(...).trace(...).lower(lowering_platforms=("cuda",))``) covers the other branch.

Backward: :func:`chunk_dstates_mosaic` is the reverse state pass (FLA's ``chunk_bwd_dh``), the
state kernel's mirror in reverse chunk order; its derivation is in its docstring. The parameter
gradients ``dq, dk, dv`` come from :func:`chunk_grads_mosaic` (one CTA per chunk, like the output
kernel), and :func:`simple_gla_bwd_mosaic` composes the backward (``dg`` in XLA, exact).
"""

import functools
from typing import Optional, Tuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.common import mosaic_gpu_lib

CHUNK = mosaic_gpu_lib.CHUNK
BLOCK_V = mosaic_gpu_lib.BLOCK_V  # value columns per CTA: the state tile is [K, BLOCK_V] fp32
STAGES = mosaic_gpu_lib.STAGES  # depth of the TMA input ring
SUPPORTED_HEAD_DIMS = mosaic_gpu_lib.SUPPORTED_HEAD_DIMS
SUPPORTED_DTYPES = mosaic_gpu_lib.SUPPORTED_DTYPES
# Shared Mosaic GPU helpers (pallas_kernels.common.mosaic_gpu_lib), under this module's short
# names.
_swizzled_smem = mosaic_gpu_lib.swizzled_smem
_load_rows = mosaic_gpu_lib.load_rows
_load_tile = mosaic_gpu_lib.load_tile
_zeros_acc = mosaic_gpu_lib.zeros_acc
_ring_producer = mosaic_gpu_lib.ring_producer
_pad_time = mosaic_gpu_lib.pad_time
_chunk_cumsum = mosaic_gpu_lib.chunk_cumsum
_doc_vectors = mosaic_gpu_lib.doc_vectors
_check_states_dtype = mosaic_gpu_lib.check_states_dtype
_check_kv_gates = mosaic_gpu_lib.check_kv_gates
_load_cols = mosaic_gpu_lib.load_cols
_by_row = mosaic_gpu_lib.by_row
_iota = mosaic_gpu_lib.iota
_transposed = mosaic_gpu_lib.transposed
_lhs_operand = mosaic_gpu_lib.lhs_operand
interpret_params = mosaic_gpu_lib.interpret_params
unsupported_reason = mosaic_gpu_lib.unsupported_reason
# simple_gla_fwd_mosaic's forward= choices: chunk_states_mosaic + chunk_output_mosaic, the
# one kernel simple_gla_fused_fwd_mosaic, or "auto" (resolve_forward).
FORWARDS = ("two_pass", "fused", "auto")
# simple_gla_mosaic's default (MOSAIC_GPU.md Sec. 50.1, H100 2026-12-07g, kernel ms): the fused
# forward took 0.205 against two_pass's 0.467 at S1 and 0.311 against 0.571 at P1; under
# differentiation 1.110 against 1.173 fwd+bwd at S1 but 1.416 against 1.376 at P1, where the
# backward's state pass is no longer the forward's (XLA keeps one of two equal calls).
DEFAULT_FORWARD = "auto"
# Keyword arguments that simple_gla_fwd_mosaic and the custom_vjp pass to every
# simple_gla_fused_fwd_mosaic call: empty (its defaults) unless a benchmark sets one, e.g.
# {"stages": 3} (bench_kernels.py --mosaic_gla_stages; MOSAIC_GPU.md Sec. 55). Read at trace.
FUSED_OPTIONS: dict = {}
# simple_gla_mosaic's default residual_h (MOSAIC_GPU.md Sec. 54, CPU 2026-12-07g, not yet timed):
# under differentiation with the fused forward, keep the forward's chunk states h (store_h) as
# the backward's residual instead of recomputing them with chunk_states_mosaic. Expected on the
# H100 at S1: the backward's state pass (0.196 ms) gone for h's TMA stores in the fused kernel.
RESIDUAL_H = False


def resolve_forward(forward: str, batch: int, seq_len: int, heads: int, dv: int,
                    differentiated: bool) -> str:
    """The forward kernels that ``forward`` runs: ``"auto"`` is ``"fused"``, except under
    differentiation on rows that the state passes split into sequence pieces
    (:func:`pallas_kernels.common.mosaic_gpu_lib.num_pieces` > 1: few CTAs), where it is
    ``"two_pass"`` (its state pass is the backward's recomputation, one call for both; the
    H100 numbers are at :data:`DEFAULT_FORWARD`); other values are returned as given.

    Raises:
        ValueError: for a ``forward`` not in :data:`FORWARDS`.
    """
    if forward not in FORWARDS:
        raise ValueError(f"forward must be one of {FORWARDS}, got {forward!r}")
    if forward != "auto":
        return forward
    if not differentiated:
        return "fused"
    return "fused" if mosaic_gpu_lib.row_pieces(batch, heads, dv, seq_len) == 1 else "two_pass"


def _state_pass_kernel(k_ref, v_ref, g_ref, last_ref, conn_ref, *rest, num_chunks: int,
                       group: int, has_h0: bool, pieces: int, store_h: bool, interpret: bool):
    """Kernel body; refs are GMEM. ``rest`` = ``[h0_ref,] [h_ref,] ht_ref`` then the scratch.

    With ``pieces = P > 1`` the inputs are ``P`` pieces of ``num_chunks`` chunks per row,
    reshaped into ``B * P`` rows (grid axis ``b`` is ``row * P + piece``); ``h0`` and ``ht``
    are per piece and ``h`` is written at the row's global chunk index.
    """
    rest = list(rest)
    h0_ref = rest.pop(0) if has_h0 else None
    h_ref = rest.pop(0) if store_h else None
    (ht_ref, k_s, v_s, g_s, last_s, conn_s, vd_s, state_s, hst_s, in_bar, in_free,
     io_bar, done, *kt_s) = rest
    kt_s = kt_s[0] if interpret else None
    b, h, iv = lax.axis_index("b"), lax.axis_index("h"), lax.axis_index("v")
    b_out, n_base = lax.div(b, pieces), lax.rem(b, pieces) * num_chunks  # h's row, 1st chunk
    hk = lax.div(h, group)  # GVA: value head h reads key head h // group
    cols = pl.ds(iv * BLOCK_V, BLOCK_V)
    wg = lax.axis_index("wg")
    dk = k_s.shape[-1]

    @pl.when(wg == 1)
    def _memory():
        plgpu.set_max_registers(40, action="decrease")

        def issue(n, slot):
            rows = pl.ds(n * CHUNK, CHUNK)
            bar = in_bar.at[slot]
            plgpu.copy_gmem_to_smem(k_ref.at[b, rows, hk], k_s.at[slot], bar)
            plgpu.copy_gmem_to_smem(v_ref.at[b, rows, h, cols], v_s.at[slot], bar)
            plgpu.copy_gmem_to_smem(g_ref.at[b, h, rows], g_s.at[slot], bar)
            plgpu.copy_gmem_to_smem(last_ref.at[b, rows], last_s.at[slot], bar)
            plgpu.copy_gmem_to_smem(conn_ref.at[b, rows], conn_s.at[slot], bar)

        _ring_producer(issue, num_chunks, in_free)

    @pl.when(wg == 0)
    def _state():
        plgpu.set_max_registers(232, action="increase")
        h0 = h0_ref.at[b, h, :, cols] if has_h0 else None
        s0 = mosaic_gpu_lib.entry_state(h0, state_s, io_bar, (dk, BLOCK_V), interpret)

        def step(n, s):
            slot = lax.rem(n, STAGES)
            if store_h:
                # The state entering chunk n goes to HBM (in h's dtype) while the chunk's
                # inputs land.
                plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # hst_s of chunk n - 1 was read
                hst_s[...] = s.astype(hst_s.dtype)
                plgpu.commit_smem()
                plgpu.copy_smem_to_gmem(hst_s, h_ref.at[b_out, h, n_base + n, :, cols])
            plgpu.barrier_wait(in_bar.at[slot])
            g = _load_rows(g_s.at[slot], interpret)  # chunk-local cumsum of log-decay, fp32
            g_last = g_s[slot, CHUNK - 1]
            # exp(G_L - G_i) <= 1 for every i (g <= 0), so no overflow; tokens before the chunk's
            # last document start do not reach the next chunk (last = 0).
            k_decay = jnp.exp(g_last - g) * _load_rows(last_s.at[slot], interpret)
            s_decay = jnp.exp(g_last) * conn_s[slot, CHUNK - 1]  # 0 if a document starts inside
            v = _load_tile(v_s.at[slot], interpret).astype(jnp.float32)
            vd_s[...] = (v * lax.broadcast_in_dim(k_decay, v.shape, [0])).astype(vd_s.dtype)
            plgpu.commit_smem()

            if interpret:  # the interpreter's wgmma cannot read a transposed ref: copy k^T
                kt_s[...] = k_s[slot].T
                k_t = kt_s
            else:
                k_t = k_s.at[slot].T

            def product(acc):
                plgpu.wgmma(acc, k_t, vd_s)  # k^T (decayed v), fp32 accumulation
                return acc[...]

            # A fresh accumulator plus the decayed state, not pl.run_state(ACC.init(...)): the
            # 0.10.2 interpreter has no rule for run_state. The barrier keeps the add after the
            # accumulator read, which waits for the wgmma.
            kv = lax.optimization_barrier(pl.run_scoped(product, plgpu.ACC((dk, BLOCK_V))))
            plgpu.barrier_arrive(in_free.at[slot])
            return s * s_decay + kv

        s = lax.fori_loop(0, num_chunks, step, s0)
        mosaic_gpu_lib.store_state(s, state_s, ht_ref.at[b, h, :, cols])

    # Both warpgroups leave together (an early exit while another issues wgmma is unsafe).
    plgpu.barrier_arrive(done)
    plgpu.barrier_wait(done)


@functools.partial(jax.jit, static_argnames=("states_dtype", "pieces", "interpret"))
def chunk_states_mosaic(
    k: jax.Array,
    v: jax.Array,
    g: Optional[jax.Array],
    *,
    initial_state: Optional[jax.Array] = None,
    segment_ids: Optional[jax.Array] = None,
    states_dtype=jnp.float32,
    pieces: Optional[int] = None,
    interpret: bool = False,
) -> Tuple[jax.Array, jax.Array]:
    """States entering every chunk of 64 tokens, and the final state, by a Mosaic GPU kernel.

    Args:
        k: keys ``[B, T, Hk, K]``, bf16 or fp16; ``H % Hk == 0`` (grouped value heads: value head
            ``h`` reads key head ``h // (H // Hk)``).
        v: values ``[B, T, H, V]``, same dtype as ``k``. ``K, V`` in {64, 128}.
        g: per-token log-decay ``[B, T, H]`` (natural log, ``<= 0``), or ``None`` (no decay).
        initial_state: ``[B, H, K, V]`` state before the first token (read as fp32), or
            ``None`` for zeros; it applies to the first document of each row only.
        segment_ids: optional int ``[B, T]``; the state resets to zero wherever the id changes.
        states_dtype: dtype of the stored ``h`` (static): fp32 (default), or the input dtype
            when ``h`` only feeds ``wgmma`` operands (:func:`chunk_output_mosaic`,
            :func:`chunk_grads_mosaic`), which halves the bytes written and saves a conversion
            pass. The carried state is fp32 in registers either way.
        pieces: static; the number of sequence pieces ``P`` the pass runs in parallel per row
            (``None``: chosen by :func:`pallas_kernels.common.mosaic_gpu_lib.num_pieces` when
            ``B * H * V / 64`` CTAs would leave the GPU idle, e.g. ``P = 4`` at B 1, H 16,
            V 128, T 32K). With ``P > 1`` a first launch computes each piece's state from
            zero (no ``h`` stored), an XLA scan over the pieces gives their entry states
            (exact: a piece maps ``S`` to ``A_p S + F_p``, ``A_p`` the product of its chunks'
            ``keep exp(G_L)``), and a second launch stores ``h``. It must divide
            ``ceil(T / 64)``.
        interpret: run the kernel in Mosaic GPU interpret mode (CPU; slow, for tests).

    Returns:
        ``(h, final_state)``: ``h`` ``[B, H, N, K, V]`` in ``states_dtype`` with
        ``N = ceil(T / 64)``, the state entering chunk ``n`` (the state after token
        ``64 n - 1``, ``initial_state`` for ``n = 0``), and ``final_state`` ``[B, H, K, V]``
        fp32, the state after token ``T - 1``.
        The states equal :func:`pallas_kernels.simple_gla.reference.simple_gla_reference`'s
        up to the 16-bit rounding of ``exp(G_L - G) v`` before the fp32-accumulated product.

    Raises:
        ValueError: on mismatched shapes, unsupported head dims or dtypes (see
            :func:`unsupported_reason`), or ``H`` not a multiple of ``Hk``.
    """
    batch, seq_len, kv_heads, dk = k.shape
    heads, dv = v.shape[2], v.shape[3]
    _check_kv_gates(k, v, g, segment_ids)
    states_dtype = _check_states_dtype(states_dtype, k.dtype)
    if initial_state is not None and initial_state.shape != (batch, heads, dk, dv):
        raise ValueError(f"initial_state must be [B, H, K, V] = {(batch, heads, dk, dv)}, got "
                         f"{initial_state.shape=}")

    num_chunks = -(-seq_len // CHUNK)
    pieces = mosaic_gpu_lib.num_pieces(pieces, batch * heads * (dv // BLOCK_V), num_chunks)
    # Padding tokens have k = v = 0 and g = 0: they leave the state unchanged.
    k, v = _pad_time(k, num_chunks), _pad_time(v, num_chunks)
    gc = _chunk_cumsum(g, (batch, seq_len, heads), num_chunks)  # [B, H, Tp]
    _, conn, last = _doc_vectors(segment_ids, batch, num_chunks)  # [B, Tp] each
    h0 = None if initial_state is None else initial_state.astype(jnp.float32)
    run = functools.partial(_states_call, group=heads // kv_heads, pieces=pieces,
                            states_dtype=states_dtype, interpret=interpret)
    with jax.named_scope("simple_gla_chunk_states_mosaic"):
        if pieces == 1:
            return run(k, v, gc, last, conn, h0, store_h=True)
        # Sequence split (rows with few CTAs): pass 1 gives each piece's state from zero, a scan
        # over the pieces their entry states (the state map of a piece is affine:
        # S -> A_p S + F_p with a scalar A_p per head), pass 2 the stored states.
        kp, vp, lastp, connp = (mosaic_gpu_lib.split_rows(x, pieces) for x in (k, v, last, conn))
        gp = mosaic_gpu_lib.split_head_major(gc, pieces)
        (f_local,) = run(kp, vp, gp, lastp, connp, None, store_h=False)
        decay = _piece_decay(gc, conn, pieces)  # [B, H, P]
        entries = _scan_pieces(f_local.reshape(batch, pieces, heads, dk, dv), decay, h0,
                               reverse=False)
        h, finals = run(kp, vp, gp, lastp, connp,
                        entries.reshape(batch * pieces, heads, dk, dv), store_h=True)
        return h, finals.reshape(batch, pieces, heads, dk, dv)[:, -1]


def _piece_decay(gc, conn, pieces):
    """``[B, H, P]`` fp32: the scalar each piece multiplies an incoming state by,
    ``prod over its chunks of keep_c exp(G_L,c)`` (0 if a document starts in the piece)."""
    b, hh, tp = gc.shape
    g_last = gc.reshape(b, hh, pieces, -1, CHUNK)[..., -1]  # [B, H, P, Nq]: G_L per chunk
    keep = conn.reshape(b, 1, pieces, -1, CHUNK)[..., -1]  # [B, 1, P, Nq]
    return jnp.exp(jnp.sum(g_last, axis=-1)) * jnp.prod(keep, axis=-1)


def _scan_pieces(local, decay, start, *, reverse: bool):
    """Entry states of the pieces, ``[B, P, H, K, V]`` fp32, from ``local`` (each piece's state
    map applied to zero, ``[B, P, H, K, V]``), ``decay`` ``[B, H, P]`` and ``start`` (the state
    entering the first piece, or ``None`` for zeros). ``reverse`` scans from the last piece
    (the backward's state gradients: piece ``p`` receives ``decay[p + 1] X + local[p + 1]``)."""
    num = local.shape[1]
    x = jnp.zeros_like(local[:, 0]) if start is None else start.astype(jnp.float32)
    entries = [None] * num
    order = range(num - 1, -1, -1) if reverse else range(num)
    for p in order:
        entries[p] = x
        x = decay[:, :, p, None, None] * x + local[:, p]
    return jnp.stack(entries, axis=1)


def _states_call(k, v, gc, last, conn, h0, *, group, pieces, states_dtype, store_h, interpret):
    """One launch of the forward state pass over ``[B * P]`` rows of pieces (see
    :func:`_state_pass_kernel`). Returns ``(h, ht)`` (``h`` ``[B, H, P * Nq, K, V]`` in
    ``states_dtype``, ``ht`` ``[B * P, H, K, V]`` fp32), or ``(ht,)`` without ``store_h``."""
    rows, tq, _, dk = k.shape
    heads, dv = v.shape[2], v.shape[3]
    num_chunks = tq // CHUNK
    has_h0 = h0 is not None
    kernel = functools.partial(_state_pass_kernel, num_chunks=num_chunks, group=group,
                               has_h0=has_h0, pieces=pieces, store_h=store_h,
                               interpret=interpret)
    vec = plgpu.SMEM((STAGES, CHUNK), jnp.float32)
    h_type = jax.ShapeDtypeStruct((rows // pieces, heads, pieces * num_chunks, dk, dv),
                                  states_dtype)
    ht_type = jax.ShapeDtypeStruct((rows, heads, dk, dv), jnp.float32)
    call = plgpu.kernel(
        kernel,
        out_type=(h_type, ht_type) if store_h else (ht_type,),
        scratch_types=[
            _swizzled_smem((STAGES, CHUNK, dk), k.dtype),  # k_s
            _swizzled_smem((STAGES, CHUNK, BLOCK_V), v.dtype),  # v_s
            vec, vec, vec,  # g_s, last_s, conn_s
            _swizzled_smem((CHUNK, BLOCK_V), v.dtype),  # vd_s: exp(G_L - G) v, the wgmma operand
            _swizzled_smem((dk, BLOCK_V), jnp.float32),  # state_s: staging of h0, final state
            _swizzled_smem((dk, BLOCK_V), states_dtype),  # hst_s: staging of h
            plgpu.Barrier(num_arrivals=5, num_barriers=STAGES),  # in_bar: a stage's 5 copies landed
            plgpu.Barrier(num_arrivals=1, num_barriers=STAGES),  # in_free: a stage may be refilled
            plgpu.Barrier(num_arrivals=1),  # io_bar: h0 landed
            plgpu.Barrier(num_arrivals=2),  # done: both warpgroups finished
        ] + ([plgpu.SMEM((dk, CHUNK), k.dtype)] if interpret else []),  # kt_s: k^T, interpret only
        grid=(rows, heads, dv // BLOCK_V),
        grid_names=("b", "h", "v"),
        num_threads=2,
        thread_name="wg",
        compiler_params=mosaic_gpu_lib.compiler_params(),
        interpret=interpret_params() if interpret else None,
        kernel_name="simple_gla_chunk_states",
    )
    return call(k, v, gc, last, conn, *([h0] if has_h0 else []))


def _intra_chunk_decay(g_row_s, g_col_s, doc_row_s, doc_col_s, interpret: bool):
    """``(D, G_i)``: ``D`` ``[C, C]`` fp32, ``D_ij = exp(G_i - G_j)`` where ``j <= i`` in the
    same document, else 0, from the chunk-local gate cumsum ``G`` and document ids, each given
    as a row copy and a column copy in SMEM (the two views need different register layouts);
    ``G_i`` ``[C]``, the gate cumsum in the row layout (the callers' state terms use it).
    Masking the exponent keeps ``D <= 1`` (no overflow for ``j > i``, where
    ``G_i - G_j >= 0``)."""
    shape = (CHUNK, CHUNK)
    g_i, g_j = _load_rows(g_row_s, interpret), _load_cols(g_col_s, interpret)
    d_i, d_j = _load_rows(doc_row_s, interpret), _load_cols(doc_col_s, interpret)
    i, j = _iota(shape, 0, interpret), _iota(shape, 1, interpret)

    def by_col(x):
        return lax.broadcast_in_dim(x, shape, [1])

    mask = (j <= i) & (_by_row(d_i, shape) == by_col(d_j))
    return jnp.exp(jnp.where(mask, _by_row(g_i, shape) - by_col(g_j), -jnp.inf)), g_i


def _output_kernel(q_ref, k_ref, v_ref, h_ref, g_ref, doc_ref, conn_ref, o_ref, q_s, k_s, v_s,
                   h_s, g_row_s, g_col_s, doc_row_s, doc_col_s, conn_s, o_s, in_bar, *shim,
                   group: int, scale: float, interpret: bool):
    """Kernel body of :func:`chunk_output_mosaic`: one chunk of one ``(b, h)`` per CTA."""
    n, h, b = lax.axis_index("n"), lax.axis_index("h"), lax.axis_index("b")
    hk = lax.div(h, group)  # GVA: value head h reads key head h // group
    rows = pl.ds(n * CHUNK, CHUNK)
    dv = v_s.shape[-1]
    plgpu.copy_gmem_to_smem(q_ref.at[b, rows, hk], q_s, in_bar)
    plgpu.copy_gmem_to_smem(k_ref.at[b, rows, hk], k_s, in_bar)
    plgpu.copy_gmem_to_smem(v_ref.at[b, rows, h], v_s, in_bar)
    plgpu.copy_gmem_to_smem(h_ref.at[b, h, n], h_s, in_bar)
    # Row and column views of one vector need different register layouts: separate copies.
    plgpu.copy_gmem_to_smem(g_ref.at[b, h, rows], g_row_s, in_bar)
    plgpu.copy_gmem_to_smem(g_ref.at[b, h, rows], g_col_s, in_bar)
    plgpu.copy_gmem_to_smem(doc_ref.at[b, rows], doc_row_s, in_bar)
    plgpu.copy_gmem_to_smem(doc_ref.at[b, rows], doc_col_s, in_bar)
    plgpu.copy_gmem_to_smem(conn_ref.at[b, rows], conn_s, in_bar)
    plgpu.barrier_wait(in_bar)
    kt_s, p_s = shim if interpret else (None, None)  # SMEM copies, interpret only
    k_t = _transposed(k_s, kt_s, interpret)

    def products(a_acc, qs_acc):  # issued together: one wait for both
        plgpu.wgmma(a_acc, q_s, k_t)  # q k^T, [C, C]
        plgpu.wgmma(qs_acc, q_s, h_s)  # q S_c, [C, V]
        return a_acc[...], qs_acc[...]

    # The barrier keeps the arithmetic below after the accumulator reads (jla's pitfall).
    a, qs = lax.optimization_barrier(
        pl.run_scoped(products, plgpu.ACC((CHUNK, CHUNK)), plgpu.ACC((CHUNK, dv))))
    decay, g_i = _intra_chunk_decay(g_row_s, g_col_s, doc_row_s, doc_col_s, interpret)
    p = (a * decay).astype(v_s.dtype)  # 16-bit, the left wgmma operand from registers

    def intra(acc):
        plgpu.wgmma(acc, _lhs_operand(p, p_s, interpret), v_s)  # P v, [C, V]
        return acc[...]

    pv = lax.optimization_barrier(pl.run_scoped(intra, plgpu.ACC((CHUNK, dv))))
    # The incoming state reaches token i only if its document was open before the chunk.
    row_scale = jnp.exp(g_i) * _load_rows(conn_s, interpret)
    o = scale * (qs * _by_row(row_scale, qs.shape) + pv)
    o_s[...] = o.astype(o_s.dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(o_s, o_ref.at[b, rows, h])
    plgpu.wait_smem_to_gmem(0)


@functools.partial(jax.jit, static_argnames=("scale", "interpret"))
def chunk_output_mosaic(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: Optional[jax.Array],
    h: jax.Array,
    *,
    scale: float,
    segment_ids: Optional[jax.Array] = None,
    gate_cumsum: Optional[jax.Array] = None,
    doc_vecs: Optional[Tuple[jax.Array, jax.Array, jax.Array]] = None,
    interpret: bool = False,
) -> jax.Array:
    """Outputs of every chunk from the states entering it, by a Mosaic GPU kernel.

    The counterpart of FLA's ``chunk_fwd_o`` (``fla/ops/common/chunk_o.py``). For token ``t`` of
    chunk ``c``, with ``G`` the chunk-local inclusive cumulative log-decay (fp32)::

        o_t = scale * ( conn_t exp(G_t) S_c^T q_t
                        + sum_{s <= t in chunk c, doc(s) = doc(t)} (q_t . k_s) exp(G_t - G_s) v_s )

    where ``conn_t`` is 1 when ``t`` belongs to the document that was open before the chunk (no
    document starts in the chunk at or before ``t``). This is the chunk form of
    :func:`pallas_kernels.simple_gla.reference.simple_gla_reference` (GLA, arXiv 2312.06635,
    Sec. 4; paper "Linear Attention Architectures", arXiv 2607.07953, Eqs. 4-10).

    One CTA per ``(chunk, value head, batch row)``, one warpgroup: TMA loads of the chunk's
    ``q, k, v``, ``S_c`` and gate/document vectors; ``wgmma`` for ``q k^T`` and ``q S_c``
    (issued together), the causal, same-document, decayed mask in fp32 registers, then
    ``wgmma`` of the masked scores (16-bit, from registers) with ``v``; fp32 accumulation.

    Args:
        q: queries ``[B, T, Hk, K]``, bf16 or fp16; ``H % Hk == 0`` (value head ``h`` reads
            query/key head ``h // (H // Hk)``).
        k: keys ``[B, T, Hk, K]``, same dtype.
        v: values ``[B, T, H, V]``, same dtype. ``K, V`` in {64, 128}.
        g: log-decay ``[B, T, H]`` (natural log, ``<= 0``), or ``None`` (no decay).
        h: ``[B, H, N, K, V]`` states entering each chunk (``N = ceil(T / 64)``), e.g. from
            :func:`chunk_states_mosaic`; rounded to the input dtype (the ``wgmma`` operand).
        scale: read-out scale (static).
        segment_ids: optional int ``[B, T]``; documents start wherever the id changes.
        doc_vecs: optional ``(doc, conn, last)``, fp32 ``[B, Tp]`` each, as
            :func:`pallas_kernels.common.mosaic_gpu_lib.doc_vectors` gives them for
            ``segment_ids``, formed once by a caller that runs several kernels (``mosaic_vjp``);
            ``None``: formed here.
        gate_cumsum: optional fp32 ``[B, H, Tp]`` (``Tp = 64 ceil(T / 64)``), ``g``'s
            chunk-local cumsum as :func:`pallas_kernels.common.mosaic_gpu_lib.chunk_cumsum`
            gives it, computed once by a caller that runs several kernels on one ``g``
            (``mosaic_vjp``); ``None``: computed here.
        interpret: run in Mosaic GPU interpret mode (CPU; slow, for tests).

    Returns:
        ``o`` ``[B, T, H, V]`` in the input dtype.

    Raises:
        ValueError: on mismatched shapes, unsupported head dims or dtypes (see
            :func:`unsupported_reason`), or ``H`` not a multiple of ``Hk``.
    """
    batch, seq_len, kv_heads, dk = k.shape
    heads, dv = v.shape[2], v.shape[3]
    num_chunks = -(-seq_len // CHUNK)
    if q.shape != k.shape or q.dtype != k.dtype:
        raise ValueError(f"q and k must match: {q.shape=} {k.shape=} {q.dtype=} {k.dtype=}")
    _check_kv_gates(k, v, g, segment_ids)
    if h.shape != (batch, heads, num_chunks, dk, dv):
        raise ValueError(f"h must be [B, H, N, K, V] = {(batch, heads, num_chunks, dk, dv)}, "
                         f"got {h.shape=}")

    padded = num_chunks * CHUNK
    q, k, v = (_pad_time(x, num_chunks) for x in (q, k, v))
    gc = _chunk_cumsum(g, (batch, seq_len, heads), num_chunks, gate_cumsum)  # [B, H, Tp]
    doc, conn, _ = _doc_vectors(segment_ids, batch, num_chunks, doc_vecs)  # [B, Tp] each
    vec = plgpu.SMEM((CHUNK,), jnp.float32)
    call = plgpu.kernel(
        functools.partial(_output_kernel, group=heads // kv_heads, scale=float(scale),
                          interpret=interpret),
        out_type=jax.ShapeDtypeStruct((batch, padded, heads, dv), v.dtype),
        scratch_types=[
            _swizzled_smem((CHUNK, dk), q.dtype),  # q_s
            _swizzled_smem((CHUNK, dk), k.dtype),  # k_s
            _swizzled_smem((CHUNK, dv), v.dtype),  # v_s
            _swizzled_smem((dk, dv), v.dtype),  # h_s: S_c in 16 bits
            vec, vec, vec, vec, vec,  # g_row_s, g_col_s, doc_row_s, doc_col_s, conn_s
            _swizzled_smem((CHUNK, dv), v.dtype),  # o_s: staging of the output tile
            plgpu.Barrier(num_arrivals=9),  # in_bar: the 9 input copies landed
        ] + ([plgpu.SMEM((dk, CHUNK), k.dtype),  # kt_s: k^T, interpret only
              _swizzled_smem((CHUNK, CHUNK), v.dtype)] if interpret else []),  # p_s: P
        grid=(num_chunks, heads, batch),  # chunks first: CUDA caps grid y and z at 65535
        grid_names=("n", "h", "b"),
        compiler_params=mosaic_gpu_lib.compiler_params(),
        interpret=interpret_params() if interpret else None,
        kernel_name="simple_gla_chunk_output",
    )
    with jax.named_scope("simple_gla_chunk_output_mosaic"):
        o = call(q, k, v, h.astype(v.dtype), gc, doc, conn)
    return o[:, :seq_len]


@functools.partial(jax.jit, static_argnames=("scale", "forward", "interpret"))
def simple_gla_fwd_mosaic(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: Optional[jax.Array],
    *,
    scale: Optional[float] = None,
    initial_state: Optional[jax.Array] = None,
    segment_ids: Optional[jax.Array] = None,
    forward: str = "two_pass",
    interpret: bool = False,
) -> Tuple[jax.Array, jax.Array]:
    """Forward of scalar-decay linear attention: :func:`chunk_states_mosaic` then
    :func:`chunk_output_mosaic` (``forward="two_pass"``), or the one fused kernel
    :func:`simple_gla_fused_fwd_mosaic` (``forward="fused"``, and ``"auto"`` here: same
    results up to rounding order, no chunk states in HBM).

    Args:
        q, k: ``[B, T, Hk, K]``, bf16 or fp16 (GVA when ``Hk < H``).
        v: ``[B, T, H, V]``, same dtype; ``K, V`` in {64, 128}.
        g: log-decay ``[B, T, H]`` (``<= 0``) or ``None``.
        scale: read-out scale (static); ``None`` means ``K ** -0.5``.
        initial_state: ``[B, H, K, V]`` or ``None`` (zeros); first document of each row only.
        segment_ids: optional int ``[B, T]`` (packed documents).
        forward: static, ``"two_pass"`` (default), ``"fused"`` or ``"auto"`` (fused; see
            :func:`resolve_forward`).
        interpret: Mosaic GPU interpret mode (CPU, tests).

    Returns:
        ``(o, final_state)``: ``o`` ``[B, T, H, V]`` in the input dtype and ``final_state``
        ``[B, H, K, V]`` fp32, as :func:`pallas_kernels.simple_gla.reference.simple_gla_reference`
        (which runs ``S_t = exp(g_t) S_{t-1} + k_t v_t^T``, ``o_t = scale S_t^T q_t``).

    Raises:
        ValueError: as :func:`chunk_states_mosaic` and :func:`chunk_output_mosaic` (or
            :func:`simple_gla_fused_fwd_mosaic`), or for an unknown ``forward``.
    """
    forward = resolve_forward(forward, k.shape[0], k.shape[1], v.shape[2], v.shape[3],
                              differentiated=False)
    if scale is None:
        scale = k.shape[-1] ** -0.5
    if forward == "fused":
        return simple_gla_fused_fwd_mosaic(q, k, v, g, scale=scale, initial_state=initial_state,
                                           segment_ids=segment_ids, interpret=interpret,
                                           **FUSED_OPTIONS)
    # h only feeds chunk_output_mosaic's wgmma: stored in the input dtype (no fp32 round trip).
    h, final_state = chunk_states_mosaic(k, v, g, initial_state=initial_state,
                                         segment_ids=segment_ids, states_dtype=v.dtype,
                                         interpret=interpret)
    o = chunk_output_mosaic(q, k, v, g, h, scale=scale, segment_ids=segment_ids,
                            interpret=interpret)
    return o, final_state


# ----------------------------------------------------------------------------------------------
# Fused forward: the state pass and the chunk outputs in one kernel.


def _causal_decay(g_row_s, g_col_s, doc_row_s, doc_col_s, interpret: bool):
    """:func:`_intra_chunk_decay`, with the document refs optional (``None``: one document, so
    the mask is ``j <= i`` alone and no document vectors are read)."""
    if doc_row_s is not None:
        return _intra_chunk_decay(g_row_s, g_col_s, doc_row_s, doc_col_s, interpret)
    shape = (CHUNK, CHUNK)
    g_i, g_j = _load_rows(g_row_s, interpret), _load_cols(g_col_s, interpret)
    mask = _iota(shape, 1, interpret) <= _iota(shape, 0, interpret)
    diff = _by_row(g_i, shape) - lax.broadcast_in_dim(g_j, shape, [1])
    return jnp.exp(jnp.where(mask, diff, -jnp.inf)), g_i


def _fused_fwd_kernel(q_ref, k_ref, v_ref, g_ref, *rest, num_chunks: int, group: int,
                      scale: float, packed: bool, has_h0: bool, store_h: bool, stages: int,
                      interpret: bool):
    """Kernel body of :func:`simple_gla_fused_fwd_mosaic`; refs are GMEM.

    ``rest`` = ``[doc_ref, conn_ref, last_ref,] [h0_ref,] o_ref, ht_ref, [h_ref,]`` then the
    scratch (see :func:`simple_gla_fused_fwd_mosaic` for the schedule).
    """
    rest = list(rest)
    doc_ref, conn_ref, last_ref = (rest.pop(0) for _ in range(3)) if packed else (None,) * 3
    h0_ref = rest.pop(0) if has_h0 else None
    o_ref, ht_ref = rest.pop(0), rest.pop(0)
    h_ref = rest.pop(0) if store_h else None
    q_s, k_s, v_s, g_row_s, g_col_s = (rest.pop(0) for _ in range(5))
    if packed:
        doc_row_s, doc_col_s, conn_s, last_s = (rest.pop(0) for _ in range(4))
    else:
        doc_row_s = doc_col_s = conn_s = last_s = None
    (vd_s, s_pub, o_s, state_s, in_bar, in_free, s_ready, s_free, io_bar, done, *shim) = rest
    kt_state_s, kt_out_s, p_s = shim if interpret else (None, None, None)  # interpret only
    b, h, iv = lax.axis_index("b"), lax.axis_index("h"), lax.axis_index("v")
    hk = lax.div(h, group)  # GVA: value head h reads query/key head h // group
    cols = pl.ds(iv * BLOCK_V, BLOCK_V)
    wg = lax.axis_index("wg")
    dk = k_s.shape[-1]

    @pl.when(wg == 2)
    def _memory():
        plgpu.set_max_registers(40, action="decrease")

        def issue(n, slot):
            rows = pl.ds(n * CHUNK, CHUNK)
            bar = in_bar.at[slot]
            plgpu.copy_gmem_to_smem(q_ref.at[b, rows, hk], q_s.at[slot], bar)
            plgpu.copy_gmem_to_smem(k_ref.at[b, rows, hk], k_s.at[slot], bar)
            plgpu.copy_gmem_to_smem(v_ref.at[b, rows, h, cols], v_s.at[slot], bar)
            # Row and column views of one vector need different register layouts: two copies.
            plgpu.copy_gmem_to_smem(g_ref.at[b, h, rows], g_row_s.at[slot], bar)
            plgpu.copy_gmem_to_smem(g_ref.at[b, h, rows], g_col_s.at[slot], bar)
            if packed:
                plgpu.copy_gmem_to_smem(doc_ref.at[b, rows], doc_row_s.at[slot], bar)
                plgpu.copy_gmem_to_smem(doc_ref.at[b, rows], doc_col_s.at[slot], bar)
                plgpu.copy_gmem_to_smem(conn_ref.at[b, rows], conn_s.at[slot], bar)
                plgpu.copy_gmem_to_smem(last_ref.at[b, rows], last_s.at[slot], bar)

        _ring_producer(issue, num_chunks, in_free, stages)  # in_free: one arrival per consumer

    @pl.when(wg == 0)
    def _state():
        plgpu.set_max_registers(232, action="increase")
        h0 = h0_ref.at[b, h, :, cols] if has_h0 else None
        s0 = mosaic_gpu_lib.entry_state(h0, state_s, io_bar, (dk, BLOCK_V), interpret)

        def step(n, s):
            slot, half = lax.rem(n, stages), lax.rem(n, 2)
            plgpu.barrier_wait(in_bar.at[slot])

            @pl.when(n >= 2)
            def _():  # the output warpgroup has read the state published for chunk n - 2
                plgpu.barrier_wait(s_free.at[half])

            if store_h:  # at most one h store in flight: chunk n - 2's has read s_pub[half]
                plgpu.wait_smem_to_gmem(1, wait_read_only=True)
            # Publish S_n (the state entering chunk n) in 16 bits for the output warpgroup.
            s_pub.at[half][...] = s.astype(s_pub.dtype)
            plgpu.commit_smem()
            plgpu.barrier_arrive(s_ready.at[half])
            if store_h:
                plgpu.copy_smem_to_gmem(s_pub.at[half], h_ref.at[b, h, n, :, cols])
            # The state update, as _state_pass_kernel: exp(G_L - G_i) <= 1 (g <= 0).
            g_last = g_row_s[slot, CHUNK - 1]
            k_decay = jnp.exp(g_last - _load_rows(g_row_s.at[slot], interpret))
            s_decay = jnp.exp(g_last)
            if packed:  # only the last document reaches the next chunk; a start drops S_n
                k_decay = k_decay * _load_rows(last_s.at[slot], interpret)
                s_decay = s_decay * conn_s[slot, CHUNK - 1]
            v = _load_tile(v_s.at[slot], interpret).astype(jnp.float32)
            vd_s[...] = (v * _by_row(k_decay, v.shape)).astype(vd_s.dtype)
            plgpu.commit_smem()
            k_t = _transposed(k_s.at[slot], kt_state_s, interpret)

            def product(acc):
                plgpu.wgmma(acc, k_t, vd_s)  # k^T (decayed v), fp32 accumulation
                return acc[...]

            kv = lax.optimization_barrier(pl.run_scoped(product, plgpu.ACC((dk, BLOCK_V))))
            plgpu.barrier_arrive(in_free.at[slot])
            return s * s_decay + kv

        s = lax.fori_loop(0, num_chunks, step, s0)
        for n in range(max(num_chunks - 2, 0), num_chunks):  # the last releases of s_pub
            plgpu.barrier_wait(s_free.at[n % 2])
        # h0 landed before the loop; no store has read state_s.
        mosaic_gpu_lib.store_state(s, state_s, ht_ref.at[b, h, :, cols], wait_stores=False)

    @pl.when(wg == 1)
    def _output():
        plgpu.set_max_registers(232, action="increase")

        def step(n, carry):
            slot, half = lax.rem(n, stages), lax.rem(n, 2)
            plgpu.barrier_wait(in_bar.at[slot])
            k_t = _transposed(k_s.at[slot], kt_out_s, interpret)

            def scores(acc):
                plgpu.wgmma(acc, q_s.at[slot], k_t)  # q k^T, [C, C]: needs no state
                return acc[...]

            # The barrier keeps the arithmetic below after the accumulator read.
            a = lax.optimization_barrier(pl.run_scoped(scores, plgpu.ACC((CHUNK, CHUNK))))
            decay, g_i = _causal_decay(g_row_s.at[slot], g_col_s.at[slot],
                                       None if not packed else doc_row_s.at[slot],
                                       None if not packed else doc_col_s.at[slot], interpret)
            p = (a * decay).astype(v_s.dtype)  # 16-bit, the left wgmma operand from registers
            # The incoming state reaches token i only if its document was open before the chunk.
            row_scale = jnp.exp(g_i)
            if packed:
                row_scale = row_scale * _load_rows(conn_s.at[slot], interpret)
            plgpu.barrier_wait(s_ready.at[half])  # S_n published

            def products(qs_acc, pv_acc):  # issued together: one wait for both
                plgpu.wgmma(qs_acc, q_s.at[slot], s_pub.at[half])  # q S_n, [C, V]
                plgpu.wgmma(pv_acc, _lhs_operand(p, p_s, interpret), v_s.at[slot])  # P v
                return qs_acc[...], pv_acc[...]

            qs, pv = lax.optimization_barrier(pl.run_scoped(
                products, plgpu.ACC((CHUNK, BLOCK_V)), plgpu.ACC((CHUNK, BLOCK_V))))
            plgpu.barrier_arrive(s_free.at[half])
            plgpu.barrier_arrive(in_free.at[slot])
            o = scale * (qs * _by_row(row_scale, qs.shape) + pv)
            plgpu.wait_smem_to_gmem(1, wait_read_only=True)  # o_s[half] of chunk n - 2 was read
            o_s.at[half][...] = o.astype(o_s.dtype)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(o_s.at[half], o_ref.at[b, pl.ds(n * CHUNK, CHUNK), h, cols])
            return carry

        lax.fori_loop(0, num_chunks, step, None)
        plgpu.wait_smem_to_gmem(0)

    # All warpgroups leave together (an early exit while another issues wgmma is unsafe).
    plgpu.barrier_arrive(done)
    plgpu.barrier_wait(done)


@functools.partial(jax.jit, static_argnames=("scale", "store_h", "stages", "pieces",
                                             "interpret"))
def simple_gla_fused_fwd_mosaic(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: Optional[jax.Array],
    *,
    scale: Optional[float] = None,
    initial_state: Optional[jax.Array] = None,
    segment_ids: Optional[jax.Array] = None,
    store_h: bool = False,
    stages: int = STAGES,
    pieces: Optional[int] = None,
    interpret: bool = False,
):
    """Forward of scalar-decay linear attention as ONE Mosaic GPU kernel (state pass + output).

    Same math, inputs and results as :func:`simple_gla_fwd_mosaic` (which runs
    :func:`chunk_states_mosaic` and then :func:`chunk_output_mosaic`), without the HBM round
    trip of the chunk states. Per batch row, value head and chunk ``c`` of 64 tokens, with
    ``G_i = g_{c,0} + ... + g_{c,i}`` the chunk-local inclusive cumulative log-decay (fp32),
    ``G_L`` its last entry and ``S_c`` ``[K, V]`` fp32 the state entering the chunk::

        o_c     = scale * ( diag(conn_c exp(G)) q_c S_c
                            + (q_c k_c^T ⊙ M_c ⊙ exp(G_i - G_j)) v_c )
        S_{c+1} = keep_c exp(G_L) S_c + k_c^T (last_c * exp(G_L - G) * v_c)

    with ``M_c`` the causal (``j <= i``), same-document mask, ``conn_c`` 1 on the tokens of the
    document open before the chunk, ``last_c`` 1 on the chunk's last document and ``keep_c`` 1
    when no document starts inside the chunk: the chunk form of the token recurrence
    ``S_t = exp(g_t) S_{t-1} + k_t v_t^T``, ``o_t = scale S_t^T q_t`` of
    :func:`pallas_kernels.simple_gla.reference.simple_gla_reference` (GLA, arXiv 2312.06635,
    Sec. 4; paper "Linear Attention Architectures", arXiv 2607.07953, Eqs. 4-10; FLA's
    ``chunk_fwd_h`` + ``chunk_fwd_o``).

    Schedule (the warp-specialised structure of jla's ``sg_fused_fwd``, in our ``[K, V]`` state
    layout): one CTA per ``(b, h, 64 value columns)`` walks the chunks in order with three
    warpgroups.

    * WG2 (memory, 40 registers) streams ``q``, ``k``, ``v[:, 64 cols]`` and the gate (row and
      column copies) and document vectors of each chunk into a 2-stage TMA ring; a stage is
      refilled when both consumers have released it.
    * WG0 (state, 232 registers) keeps ``S`` ``[K, 64]`` fp32 as a WGMMA accumulator in
      registers. Per chunk it publishes ``S_c`` in the input dtype to a 2-slot SMEM tile
      (``s_ready``/``s_free`` barriers per slot), then forms ``exp(G_L - G) last v`` in SMEM and
      adds ``wgmma(k^T, ·)`` to ``keep exp(G_L) S``.
    * WG1 (output, 232 registers) computes the scores ``q k^T`` and their causal, decayed,
      same-document mask while WG0 updates the state (the scores need no state), waits for
      ``S_c``, issues ``q S_c`` and ``P v`` (``P`` a 16-bit register operand) together and
      stores ``o`` through a 2-slot SMEM tile (at most one TMA store in flight).

    Each published ``S_c`` is the state :func:`chunk_states_mosaic` would store in the input
    dtype; with ``store_h`` WG0 also sends it to HBM by TMA (for a backward that reuses it).
    Rows with few CTAs run as sequence pieces, as :func:`chunk_states_mosaic`'s: the state pass
    (without ``h``) gives each piece's state from zero, an XLA scan their entry states, and the
    fused kernel runs the ``B * P`` pieces as rows from those states.

    Args:
        q: queries ``[B, T, Hk, K]``, bf16 or fp16; ``H % Hk == 0`` (value head ``h`` reads
            query/key head ``h // (H // Hk)``).
        k: keys ``[B, T, Hk, K]``, same dtype.
        v: values ``[B, T, H, V]``, same dtype. ``K, V`` in {64, 128}.
        g: per-token log-decay ``[B, T, H]`` (natural log, ``<= 0``), or ``None`` (no decay).
        scale: read-out scale (static); ``None`` means ``K ** -0.5``.
        initial_state: ``[B, H, K, V]`` state before the first token (read as fp32), or
            ``None`` for zeros; it applies to the first document of each row only.
        segment_ids: optional int ``[B, T]``; the state resets to zero wherever the id changes.
        store_h: static; also return the states entering every chunk.
        stages: static, the depth of the TMA input ring (2 by default; 3 fits the SMEM at
            K = V = 128, about 211 KB against 171 KB; a tuning knob for the GPU).
        pieces: static; sequence pieces ``P`` per row (``None``: chosen by
            :func:`pallas_kernels.common.mosaic_gpu_lib.num_pieces`, 1 unless ``B * H * V / 64``
            CTAs would leave the GPU idle).
            It must divide ``ceil(T / 64)``. With ``P > 1`` and ``store_h`` XLA transposes ``h``
            from per-piece rows (one extra pass over ``h``).
        interpret: run in Mosaic GPU interpret mode (CPU; slow, for tests).

    Returns:
        ``(o, final_state)``, or ``(o, final_state, h)`` with ``store_h``: ``o`` ``[B, T, H, V]``
        in the input dtype, ``final_state`` ``[B, H, K, V]`` fp32 (the state after token
        ``T - 1``), ``h`` ``[B, H, N, K, V]`` in the input dtype (``N = ceil(T / 64)``, the state
        entering chunk ``n``, bitwise the ``h`` of :func:`chunk_states_mosaic` with
        ``states_dtype`` the input dtype). Equal to
        :func:`pallas_kernels.simple_gla.reference.simple_gla_reference` up to the 16-bit
        rounding of the ``wgmma`` operands (``exp(G_L - G) v``, ``S_c``, the masked scores)
        with fp32 accumulation, and of ``o``.

    Raises:
        ValueError: on mismatched shapes (``q`` and ``k``, ``g``, ``segment_ids``,
            ``initial_state``), unsupported head dims or dtypes (see :func:`unsupported_reason`),
            ``H`` not a multiple of ``Hk``, ``stages < 2``, or ``pieces`` not a positive
            divisor of the chunk count.
    """
    batch, seq_len, kv_heads, dk = k.shape
    heads, dv = v.shape[2], v.shape[3]
    if q.shape != k.shape or q.dtype != k.dtype:
        raise ValueError(f"q and k must match: {q.shape=} {k.shape=} {q.dtype=} {k.dtype=}")
    _check_kv_gates(k, v, g, segment_ids)
    if initial_state is not None and initial_state.shape != (batch, heads, dk, dv):
        raise ValueError(f"initial_state must be [B, H, K, V] = {(batch, heads, dk, dv)}, got "
                         f"{initial_state.shape=}")
    if stages < 2:
        raise ValueError(f"stages must be >= 2, got {stages}")
    if scale is None:
        scale = dk ** -0.5

    num_chunks = -(-seq_len // CHUNK)
    pieces = mosaic_gpu_lib.num_pieces(pieces, batch * heads * (dv // BLOCK_V), num_chunks)
    # Padding tokens have q = k = v = 0 and g = 0: they leave the state unchanged.
    q, k, v = (_pad_time(x, num_chunks) for x in (q, k, v))
    gc = _chunk_cumsum(g, (batch, seq_len, heads), num_chunks)  # [B, H, Tp]
    doc, conn, last = _doc_vectors(segment_ids, batch, num_chunks)  # [B, Tp] each
    docs = [doc, conn, last] if segment_ids is not None else []  # none streamed without docs
    h0 = None if initial_state is None else initial_state.astype(jnp.float32)
    run = functools.partial(_fused_call, group=heads // kv_heads, scale=float(scale),
                            store_h=store_h, stages=stages, interpret=interpret)
    with jax.named_scope("simple_gla_fused_fwd_mosaic"):
        if pieces == 1:
            outs = run(q, k, v, gc, docs, h0)
            o, final_state = outs[0], outs[1]
            h = outs[2] if store_h else None
        else:
            # Sequence split, as chunk_states_mosaic's: the state pass gives each piece's state
            # from zero, a scan over the pieces their entry states, then the fused kernel runs
            # the pieces as rows, each from its entry state (exact: a piece's state map is
            # affine). conn of a piece's first chunk gates the entry state as any other.
            kp, vp, lastp, connp = (mosaic_gpu_lib.split_rows(x, pieces)
                                    for x in (k, v, last, conn))
            gp = mosaic_gpu_lib.split_head_major(gc, pieces)
            (f_local,) = _states_call(kp, vp, gp, lastp, connp, None, group=heads // kv_heads,
                                      pieces=pieces, states_dtype=v.dtype, store_h=False,
                                      interpret=interpret)
            entries = _scan_pieces(f_local.reshape(batch, pieces, heads, dk, dv),
                                   _piece_decay(gc, conn, pieces), h0, reverse=False)
            outs = run(mosaic_gpu_lib.split_rows(q, pieces), kp, vp, gp,
                       [mosaic_gpu_lib.split_rows(x, pieces) for x in docs],
                       entries.reshape(batch * pieces, heads, dk, dv))
            o = outs[0].reshape((batch, num_chunks * CHUNK) + outs[0].shape[2:])
            final_state = outs[1].reshape(batch, pieces, heads, dk, dv)[:, -1]
            h = None
            if store_h:  # [B * P, H, N / P, K, V] -> [B, H, N, K, V]
                h = outs[2].reshape((batch, pieces, heads) + outs[2].shape[2:])
                h = jnp.swapaxes(h, 1, 2).reshape(batch, heads, num_chunks, dk, dv)
    o = o[:, :seq_len]
    return (o, final_state, h) if store_h else (o, final_state)


def _fused_call(q, k, v, gc, docs, h0, *, group, scale, store_h, stages, interpret):
    """One launch of the fused forward (:func:`_fused_fwd_kernel`) over the rows of padded
    ``q, k`` ``[R, Tq, Hk, K]``, ``v`` ``[R, Tq, H, V]``, ``gc`` ``[R, H, Tq]``, ``docs`` (``[]``
    or ``[doc, conn, last]``, ``[R, Tq]`` each) and ``h0`` (``[R, H, K, V]`` fp32 or ``None``).
    Returns ``(o, ht)`` or ``(o, ht, h)`` with ``store_h``: ``o`` ``[R, Tq, H, V]``, ``ht``
    ``[R, H, K, V]`` fp32, ``h`` ``[R, H, Tq / 64, K, V]`` in the input dtype."""
    rows, padded, _, dk = k.shape
    heads, dv = v.shape[2], v.shape[3]
    num_chunks = padded // CHUNK
    packed = bool(docs)
    has_h0 = h0 is not None
    vec = plgpu.SMEM((stages, CHUNK), jnp.float32)
    out_type = [jax.ShapeDtypeStruct((rows, padded, heads, dv), v.dtype),
                jax.ShapeDtypeStruct((rows, heads, dk, dv), jnp.float32)]
    if store_h:
        out_type.append(jax.ShapeDtypeStruct((rows, heads, num_chunks, dk, dv), v.dtype))
    n_copies = 5 + 4 * packed
    shim = [plgpu.SMEM((dk, CHUNK), k.dtype),  # kt_state_s: k^T for WG0
            plgpu.SMEM((dk, CHUNK), k.dtype),  # kt_out_s: k^T for WG1
            _swizzled_smem((CHUNK, CHUNK), v.dtype)]  # p_s: the masked scores
    call = plgpu.kernel(
        functools.partial(_fused_fwd_kernel, num_chunks=num_chunks, group=group,
                          scale=scale, packed=packed, has_h0=has_h0, store_h=store_h,
                          stages=stages, interpret=interpret),
        out_type=tuple(out_type),
        scratch_types=[
            _swizzled_smem((stages, CHUNK, dk), q.dtype),  # q_s
            _swizzled_smem((stages, CHUNK, dk), k.dtype),  # k_s
            _swizzled_smem((stages, CHUNK, BLOCK_V), v.dtype),  # v_s
            vec, vec,  # g_row_s, g_col_s
        ] + ([vec] * 4 if packed else []) + [  # doc_row_s, doc_col_s, conn_s, last_s
            _swizzled_smem((CHUNK, BLOCK_V), v.dtype),  # vd_s: exp(G_L - G) last v (WG0)
            _swizzled_smem((2, dk, BLOCK_V), v.dtype),  # s_pub: S_c in 16 bits, 2 slots
            _swizzled_smem((2, CHUNK, BLOCK_V), v.dtype),  # o_s: staging of o, 2 slots
            _swizzled_smem((dk, BLOCK_V), jnp.float32),  # state_s: staging of h0, final state
            plgpu.Barrier(num_arrivals=n_copies, num_barriers=stages),  # in_bar: stage landed
            plgpu.Barrier(num_arrivals=2, num_barriers=stages),  # in_free: WG0 and WG1 done
            plgpu.Barrier(num_arrivals=1, num_barriers=2),  # s_ready: S_c published
            plgpu.Barrier(num_arrivals=1, num_barriers=2),  # s_free: WG1 read S_c
            plgpu.Barrier(num_arrivals=1),  # io_bar: h0 landed
            plgpu.Barrier(num_arrivals=3),  # done: all warpgroups finished
        ] + (shim if interpret else []),
        grid=(rows, heads, dv // BLOCK_V),
        grid_names=("b", "h", "v"),
        num_threads=3,
        thread_name="wg",
        compiler_params=mosaic_gpu_lib.compiler_params(),
        interpret=interpret_params() if interpret else None,
        kernel_name="simple_gla_fused_fwd",
    )
    return call(q, k, v, gc, *docs, *([h0] if has_h0 else []))


# ----------------------------------------------------------------------------------------------
# Backward: the reverse state pass.


def _dstate_pass_kernel(q_ref, do_ref, g_ref, conn_ref, *rest, num_chunks: int, group: int,
                        scale: float, has_dht: bool, leaving: bool, pieces: int, store_dh: bool,
                        interpret: bool):
    """Kernel body of :func:`chunk_dstates_mosaic`; refs are GMEM.

    ``rest`` = ``[dht_ref,] [dh_ref,] dh0_ref`` then the scratch. The mirror of
    :func:`_state_pass_kernel` in reverse chunk order, with ``q`` for ``k`` and ``do`` for ``v``,
    and the same sequence pieces (``dht`` and ``dh0`` per piece, ``dh`` at global chunks).
    """
    rest = list(rest)
    dht_ref = rest.pop(0) if has_dht else None
    dh_ref = rest.pop(0) if store_dh else None
    (dh0_ref, q_s, do_s, g_s, conn_s, dod_s, state_s, dhst_s, in_bar, in_free, io_bar,
     done, *qt_s) = rest
    qt_s = qt_s[0] if interpret else None
    b, h, iv = lax.axis_index("b"), lax.axis_index("h"), lax.axis_index("v")
    b_out, n_base = lax.div(b, pieces), lax.rem(b, pieces) * num_chunks  # dh's row, 1st chunk
    hk = lax.div(h, group)  # GVA: value head h reads query head h // group
    cols = pl.ds(iv * BLOCK_V, BLOCK_V)
    wg = lax.axis_index("wg")
    dk = q_s.shape[-1]

    @pl.when(wg == 1)
    def _memory():
        plgpu.set_max_registers(40, action="decrease")

        def issue(i, slot):  # step i reads chunk N - 1 - i
            rows = pl.ds((num_chunks - 1 - i) * CHUNK, CHUNK)
            bar = in_bar.at[slot]
            plgpu.copy_gmem_to_smem(q_ref.at[b, rows, hk], q_s.at[slot], bar)
            plgpu.copy_gmem_to_smem(do_ref.at[b, rows, h, cols], do_s.at[slot], bar)
            plgpu.copy_gmem_to_smem(g_ref.at[b, h, rows], g_s.at[slot], bar)
            plgpu.copy_gmem_to_smem(conn_ref.at[b, rows], conn_s.at[slot], bar)

        _ring_producer(issue, num_chunks, in_free)

    @pl.when(wg == 0)
    def _state():
        plgpu.set_max_registers(232, action="increase")
        if has_dht:
            plgpu.copy_gmem_to_smem(dht_ref.at[b, h, :, cols], state_s, io_bar)
            plgpu.barrier_wait(io_bar)
            d0 = _load_tile(state_s, interpret)
        else:
            d0 = _zeros_acc((dk, BLOCK_V), interpret)

        def store(d, n):
            if not store_dh:
                return
            # dh[n] goes to HBM (in dh's dtype); the store of step i - 1 must have read dhst_s.
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)
            dhst_s[...] = d.astype(dhst_s.dtype)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(dhst_s, dh_ref.at[b_out, h, n_base + n, :, cols])

        def step(i, d):
            n = num_chunks - 1 - i
            slot = lax.rem(i, STAGES)
            if leaving:  # the gradient of the state leaving chunk n: dS_{n+1}, before the update
                store(d, n)
            plgpu.barrier_wait(in_bar.at[slot])
            g = _load_rows(g_s.at[slot], interpret)  # chunk-local cumsum of log-decay, fp32
            g_last = g_s[slot, CHUNK - 1]
            # The incoming state reaches token t as conn_t exp(G_t) S (exp(G_t) <= 1).
            q_decay = jnp.exp(g) * _load_rows(conn_s.at[slot], interpret)
            d_decay = jnp.exp(g_last) * conn_s[slot, CHUNK - 1]  # keep: 0 if a document starts
            do = _load_tile(do_s.at[slot], interpret).astype(jnp.float32)
            dod_s[...] = (do * lax.broadcast_in_dim(q_decay, do.shape, [0])).astype(dod_s.dtype)
            plgpu.commit_smem()
            q_t = _transposed(q_s.at[slot], qt_s, interpret)

            def product(acc):
                plgpu.wgmma(acc, q_t, dod_s)  # q^T (decayed do), fp32 accumulation
                return acc[...]

            # Fresh accumulator plus the decayed carry (no run_state in the 0.10.2 interpreter);
            # the barrier keeps the add after the accumulator read (jla's pitfall).
            qdo = lax.optimization_barrier(pl.run_scoped(product, plgpu.ACC((dk, BLOCK_V))))
            plgpu.barrier_arrive(in_free.at[slot])
            d = d * d_decay + scale * qdo
            if not leaving:  # the gradient of the state entering chunk n: dS_n
                store(d, n)
            return d

        d = lax.fori_loop(0, num_chunks, step, d0)
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)
        state_s[...] = d
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(state_s, dh0_ref.at[b, h, :, cols])
        plgpu.wait_smem_to_gmem(0)

    # Both warpgroups leave together (an early exit while another issues wgmma is unsafe).
    plgpu.barrier_arrive(done)
    plgpu.barrier_wait(done)


@functools.partial(jax.jit, static_argnames=("scale", "states_dtype", "leaving", "pieces",
                                             "interpret"))
def chunk_dstates_mosaic(
    q: jax.Array,
    do: jax.Array,
    g: Optional[jax.Array],
    *,
    scale: float,
    final_state_grad: Optional[jax.Array] = None,
    segment_ids: Optional[jax.Array] = None,
    states_dtype=jnp.float32,
    leaving: bool = False,
    pieces: Optional[int] = None,
    interpret: bool = False,
) -> Tuple[jax.Array, jax.Array]:
    """Gradients w.r.t. the state entering every chunk, by a reverse Mosaic GPU state pass.

    The backward counterpart of :func:`chunk_states_mosaic` (FLA's ``chunk_bwd_dh``,
    ``fla/ops/common/chunk_h.py``). Derivation: in the chunk form of the forward (see the module
    docstring and :func:`chunk_output_mosaic`), the state ``S_n`` entering chunk ``n`` reaches
    the loss only through chunk ``n``'s outputs,
    ``o_t = scale (conn_t exp(G_t) S_n^T q_t + intra-chunk terms)``, and the state leaving
    it, ``S_{n+1} = keep_n exp(G_L) S_n + (terms without S_n)``. With ``dS_n = dL/dS_n``
    (``[K, V]``), ``do_t = dL/do_t``, ``G`` the chunk-local inclusive cumulative log-decay and
    ``G_L`` its last entry, the chain rule gives::

        dS_N = dht                                  (the gradient of the final state, or 0)
        dS_n = keep_n exp(G_L) dS_{n+1} + scale * q_n^T (conn_n * exp(G) * do_n)     (fp32)

    where ``q_n [64, K]`` and ``do_n [64, V]`` are chunk ``n``'s rows, ``conn_t`` is 1 on the
    tokens of the document open before the chunk and ``keep_n`` (``conn`` of the chunk's last
    token) is 0 when a document starts inside the chunk: a reset cuts the incoming state off
    from every later token, so its gradient stops there too. This is the reverse of the token
    recurrence ``S_t = exp(g_t) S_{t-1} + k_t v_t^T``, ``o_t = scale S_t^T q_t`` of
    :func:`pallas_kernels.simple_gla.reference.simple_gla_reference` (GLA, arXiv 2312.06635,
    Sec. 4; paper "Linear Attention Architectures", arXiv 2607.07953, Eqs. 4-10). ``dS_n``
    does not depend on ``k`` or ``v``. ``dS_0`` is the gradient w.r.t. ``initial_state``
    (which the forward applies to the first document only, through chunk 0's ``conn``).

    Kernel structure, as :func:`chunk_states_mosaic`'s in reverse: one CTA per ``(b, h, 64
    value columns)``, two warpgroups. The memory warpgroup streams ``q``, ``do`` and the gate
    and ``conn`` vectors of chunks ``N - 1, ..., 0`` into a two-stage TMA ring. The state
    warpgroup keeps ``dS`` (``[K, 64]`` fp32) in registers; per chunk it scales ``do`` by
    ``conn exp(G)`` into a swizzled 16-bit SMEM tile, runs one ``wgmma`` ``q^T (decayed do)``
    (``q^T`` a transposed SMEM operand; a copy when interpreting), adds
    ``keep exp(G_L) dS`` and stores ``dS_n`` (or, with ``leaving``, ``dS_{n+1}`` before the
    update) to HBM through an SMEM tile of ``states_dtype``.

    Args:
        q: queries ``[B, T, Hk, K]``, bf16 or fp16; ``H % Hk == 0`` (value head ``h`` reads
            query head ``h // (H // Hk)``).
        do: output gradient ``[B, T, H, V]``, same dtype as ``q``. ``K, V`` in {64, 128}.
        g: per-token log-decay ``[B, T, H]`` (natural log, ``<= 0``), or ``None`` (no decay).
        scale: read-out scale of the forward (static).
        final_state_grad: ``[B, H, K, V]`` gradient w.r.t. the final state (read as fp32), or
            ``None`` for zeros.
        segment_ids: optional int ``[B, T]``; documents start wherever the id changes.
        states_dtype: dtype of the stored ``dh`` (static): fp32 (default) or the input dtype
            (when ``dh`` only feeds ``wgmma`` operands, as in :func:`simple_gla_bwd_mosaic`).
        leaving: static; ``False`` (default) stores the gradient w.r.t. the state *entering*
            chunk ``n`` at ``dh[:, :, n]``; ``True`` stores the gradient w.r.t. the state
            *leaving* it (``dS_{n+1}``, ``final_state_grad`` or zeros for the last chunk), the
            ``dS'`` operand of :func:`chunk_grads_mosaic`, with no shift pass in XLA.
        pieces: static; sequence pieces run in parallel per row, as in
            :func:`chunk_states_mosaic` (``None``: chosen the same way), scanned in reverse.
        interpret: run the kernel in Mosaic GPU interpret mode (CPU; slow, for tests).

    Returns:
        ``(dh, dh0)``: ``dh`` ``[B, H, N, K, V]`` in ``states_dtype`` with ``N = ceil(T / 64)``,
        the gradient w.r.t. the state entering chunk ``n`` (``h[:, :, n]`` of
        :func:`chunk_states_mosaic`), or leaving it with ``leaving``; ``dh0`` ``[B, H, K, V]``
        fp32, the gradient w.r.t. ``initial_state`` (``dS_0``). Exact up to the 16-bit
        rounding of ``conn exp(G) do`` before the fp32-accumulated product (and of the stored
        ``dh`` with a 16-bit ``states_dtype``).

    Raises:
        ValueError: on mismatched shapes, unsupported head dims or dtypes (see
            :func:`unsupported_reason`), ``H`` not a multiple of ``Hk``, or a
            ``final_state_grad`` that is not ``[B, H, K, V]``.
    """
    batch, seq_len, kv_heads, dk = q.shape
    heads, dv = do.shape[2], do.shape[3]
    _check_kv_gates(q, do, g, segment_ids, names=("q", "do"))
    states_dtype = _check_states_dtype(states_dtype, q.dtype)
    if final_state_grad is not None and final_state_grad.shape != (batch, heads, dk, dv):
        raise ValueError(f"final_state_grad must be [B, H, K, V] = {(batch, heads, dk, dv)}, "
                         f"got {final_state_grad.shape=}")

    num_chunks = -(-seq_len // CHUNK)
    pieces = mosaic_gpu_lib.num_pieces(pieces, batch * heads * (dv // BLOCK_V), num_chunks)
    # Padding tokens have q = do = 0 and g = 0: they pass dS through unchanged.
    q, do = _pad_time(q, num_chunks), _pad_time(do, num_chunks)
    gc = _chunk_cumsum(g, (batch, seq_len, heads), num_chunks)  # [B, H, Tp]
    _, conn, _ = _doc_vectors(segment_ids, batch, num_chunks)  # [B, Tp]
    dht = None if final_state_grad is None else final_state_grad.astype(jnp.float32)
    run = functools.partial(_dstates_call, group=heads // kv_heads, scale=float(scale),
                            leaving=leaving, pieces=pieces, states_dtype=states_dtype,
                            interpret=interpret)
    with jax.named_scope("simple_gla_chunk_dstates_mosaic"):
        if pieces == 1:
            return run(q, do, gc, conn, dht, store_dh=True)
        # Sequence split, as chunk_states_mosaic's in reverse: pass 1 gives each piece's dS at
        # its start from a zero gradient at its end, a reverse scan the gradient at each
        # piece's end (piece p + 1 maps X to A_{p+1} X + D_{p+1}), pass 2 the stored dh.
        qp, dop, connp = (mosaic_gpu_lib.split_rows(x, pieces) for x in (q, do, conn))
        gp = mosaic_gpu_lib.split_head_major(gc, pieces)
        (d_local,) = run(qp, dop, gp, connp, None, store_dh=False)
        decay = _piece_decay(gc, conn, pieces)  # [B, H, P]
        ends = _scan_pieces(d_local.reshape(batch, pieces, heads, dk, dv), decay, dht,
                            reverse=True)
        dh, starts = run(qp, dop, gp, connp, ends.reshape(batch * pieces, heads, dk, dv),
                         store_dh=True)
        return dh, starts.reshape(batch, pieces, heads, dk, dv)[:, 0]


def _dstates_call(q, do, gc, conn, dht, *, group, scale, leaving, pieces, states_dtype,
                  store_dh, interpret):
    """One launch of the reverse state pass over ``[B * P]`` rows of pieces (see
    :func:`_dstate_pass_kernel`). Returns ``(dh, dS_start)`` (``dh`` ``[B, H, P * Nq, K, V]``
    in ``states_dtype``, ``dS_start`` ``[B * P, H, K, V]`` fp32, the gradient at each piece's
    start), or ``(dS_start,)`` without ``store_dh``."""
    rows, tq, _, dk = q.shape
    heads, dv = do.shape[2], do.shape[3]
    num_chunks = tq // CHUNK
    has_dht = dht is not None
    kernel = functools.partial(_dstate_pass_kernel, num_chunks=num_chunks, group=group,
                               scale=scale, has_dht=has_dht, leaving=leaving, pieces=pieces,
                               store_dh=store_dh, interpret=interpret)
    vec = plgpu.SMEM((STAGES, CHUNK), jnp.float32)
    dh_type = jax.ShapeDtypeStruct((rows // pieces, heads, pieces * num_chunks, dk, dv),
                                   states_dtype)
    start_type = jax.ShapeDtypeStruct((rows, heads, dk, dv), jnp.float32)
    call = plgpu.kernel(
        kernel,
        out_type=(dh_type, start_type) if store_dh else (start_type,),
        scratch_types=[
            _swizzled_smem((STAGES, CHUNK, dk), q.dtype),  # q_s
            _swizzled_smem((STAGES, CHUNK, BLOCK_V), do.dtype),  # do_s
            vec, vec,  # g_s, conn_s
            _swizzled_smem((CHUNK, BLOCK_V), do.dtype),  # dod_s: conn exp(G) do, wgmma operand
            _swizzled_smem((dk, BLOCK_V), jnp.float32),  # state_s: staging of dht, dh0
            _swizzled_smem((dk, BLOCK_V), states_dtype),  # dhst_s: staging of dh
            plgpu.Barrier(num_arrivals=4, num_barriers=STAGES),  # in_bar: a stage's 4 copies
            plgpu.Barrier(num_arrivals=1, num_barriers=STAGES),  # in_free: a stage may be refilled
            plgpu.Barrier(num_arrivals=1),  # io_bar: dht landed
            plgpu.Barrier(num_arrivals=2),  # done: both warpgroups finished
        ] + ([plgpu.SMEM((dk, CHUNK), q.dtype)] if interpret else []),  # qt_s: q^T, interpret
        grid=(rows, heads, dv // BLOCK_V),
        grid_names=("b", "h", "v"),
        num_threads=2,
        thread_name="wg",
        compiler_params=mosaic_gpu_lib.compiler_params(),
        interpret=interpret_params() if interpret else None,
        kernel_name="simple_gla_chunk_dstates",
    )
    return call(q, do, gc, conn, *([dht] if has_dht else []))


# ----------------------------------------------------------------------------------------------
# Backward: the parameter gradients of every chunk.


def _grads_kernel(q_ref, k_ref, v_ref, do_ref, h_ref, dhn_ref, g_ref, doc_ref, conn_ref,
                  last_ref, dq_ref, dk_ref, dv_ref, dgt_ref, bnd_ref, q_s, k_s, v_s, do_s, h_s,
                  dhn_s, g_row_s, g_col_s, doc_row_s, doc_col_s, conn_s, last_s, ds_s, p_s, sk_s,
                  sv_s, dgt_s, bnd_s, in_bar, *shim, group: int, scale: float, interpret: bool):
    """Kernel body of :func:`chunk_grads_mosaic`: one chunk of one ``(b, h)`` per CTA.

    ``shim`` (interpret only): SMEM scratch for the transposed operands ``k^T, v^T, S_c^T,
    dS'^T, dA^T, P^T`` (see :func:`_transposed`).
    """
    n, h, b = lax.axis_index("n"), lax.axis_index("h"), lax.axis_index("b")
    hk = lax.div(h, group)  # GVA: value head h reads query/key head h // group
    rows = pl.ds(n * CHUNK, CHUNK)
    dk, dv = k_s.shape[-1], v_s.shape[-1]
    plgpu.copy_gmem_to_smem(q_ref.at[b, rows, hk], q_s, in_bar)
    plgpu.copy_gmem_to_smem(k_ref.at[b, rows, hk], k_s, in_bar)
    plgpu.copy_gmem_to_smem(v_ref.at[b, rows, h], v_s, in_bar)
    plgpu.copy_gmem_to_smem(do_ref.at[b, rows, h], do_s, in_bar)
    plgpu.copy_gmem_to_smem(h_ref.at[b, h, n], h_s, in_bar)
    plgpu.copy_gmem_to_smem(dhn_ref.at[b, h, n], dhn_s, in_bar)
    # Row and column views of one vector need different register layouts: separate copies.
    plgpu.copy_gmem_to_smem(g_ref.at[b, h, rows], g_row_s, in_bar)
    plgpu.copy_gmem_to_smem(g_ref.at[b, h, rows], g_col_s, in_bar)
    plgpu.copy_gmem_to_smem(doc_ref.at[b, rows], doc_row_s, in_bar)
    plgpu.copy_gmem_to_smem(doc_ref.at[b, rows], doc_col_s, in_bar)
    plgpu.copy_gmem_to_smem(conn_ref.at[b, rows], conn_s, in_bar)
    plgpu.copy_gmem_to_smem(last_ref.at[b, rows], last_s, in_bar)
    plgpu.barrier_wait(in_bar)
    kt_s, vt_s, ht_s, dhnt_s, dst_s, pt_s = shim if interpret else (None,) * 6

    def scores(a_acc, dp_acc):  # issued together: one wait for both
        plgpu.wgmma(a_acc, q_s, _transposed(k_s, kt_s, interpret))  # A = q k^T, [C, C]
        plgpu.wgmma(dp_acc, do_s, _transposed(v_s, vt_s, interpret))  # dP = do v^T, [C, C]
        return a_acc[...], dp_acc[...]

    # The barrier keeps the arithmetic below after the accumulator reads (jla's pitfall).
    a, dp = lax.optimization_barrier(
        pl.run_scoped(scores, plgpu.ACC((CHUNK, CHUNK)), plgpu.ACC((CHUNK, CHUNK))))
    # Row t, column s: causal, same document, scale exp(G_t - G_s).
    decay, g_i = _intra_chunk_decay(g_row_s, g_col_s, doc_row_s, doc_col_s, interpret)
    decay = scale * decay
    ds_s[...] = (dp * decay).astype(ds_s.dtype)  # dA_ts = scale (do_t . v_s) exp(G_t - G_s)
    p_s[...] = (a * decay).astype(p_s.dtype)  # P_ts = scale (q_t . k_s) exp(G_t - G_s)
    plgpu.commit_smem()

    g_last = g_row_s[CHUNK - 1]
    # The incoming state reaches token t as conn_t exp(G_t); token s reaches the state leaving
    # the chunk as last_s exp(G_L - G_s) (both <= 1).
    in_scale = jnp.exp(g_i) * _load_rows(conn_s, interpret)
    out_scale = jnp.exp(g_last - g_i) * _load_rows(last_s, interpret)

    def store(x, stage, out_ref):
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the previous store read the stage
        stage[...] = x
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(stage, out_ref.at[b, rows, h])

    def dq_products(intra, inter):
        plgpu.wgmma(intra, ds_s, k_s)  # dA k, [C, K]
        plgpu.wgmma(inter, do_s, _transposed(h_s, ht_s, interpret))  # do S_c^T, [C, K]
        return intra[...], inter[...]

    intra, inter = lax.optimization_barrier(
        pl.run_scoped(dq_products, plgpu.ACC((CHUNK, dk)), plgpu.ACC((CHUNK, dk))))
    dq = intra + scale * inter * _by_row(in_scale, inter.shape)
    # dL/dG_t = q_t . dq_t - k_t . dk_t + [t = L] <S', dS'> (see simple_gla_bwd_mosaic), fp32
    # row sums of the fp32 gradients before they are rounded for the store.
    dgt = jnp.sum(_load_tile(q_s, interpret).astype(jnp.float32) * dq, axis=1)
    store(dq.astype(sk_s.dtype), sk_s, dq_ref)

    def dk_products(intra, state):
        plgpu.wgmma(intra, _transposed(ds_s, dst_s, interpret), q_s)  # dA^T q, [C, K]
        plgpu.wgmma(state, v_s, _transposed(dhn_s, dhnt_s, interpret))  # v dS'^T, [C, K]
        return intra[...], state[...]

    intra, state = lax.optimization_barrier(
        pl.run_scoped(dk_products, plgpu.ACC((CHUNK, dk)), plgpu.ACC((CHUNK, dk))))
    dk_state = state * _by_row(out_scale, state.shape)  # last_s exp(G_L - G_s) dS' v_s
    dk_total = intra + dk_state
    k_f = _load_tile(k_s, interpret).astype(jnp.float32)
    dgt = dgt - jnp.sum(k_f * dk_total, axis=1)
    # <S', dS'> with S' = keep exp(G_L) S_c + sum_s last_s exp(G_L - G_s) k_s v_s^T: the second
    # part is sum_s k_s . dk_state_s; the first, keep exp(G_L) <S_c, dS'>, is summed as the row
    # sums of 64-row slices of S_c * dS'. Per-row partials; XLA adds the chunk's 64 of them.
    bnd = jnp.sum(k_f * dk_state, axis=1)
    carry = jnp.exp(g_last) * conn_s[CHUNK - 1]  # keep exp(G_L)
    for r in range(0, dk, CHUNK):
        rows_r = pl.ds(r, CHUNK)
        s_c = _load_tile(h_s.at[rows_r], interpret).astype(jnp.float32)
        ds_next = _load_tile(dhn_s.at[rows_r], interpret).astype(jnp.float32)
        bnd = bnd + carry * jnp.sum(s_c * ds_next, axis=1)
    store(dk_total.astype(sk_s.dtype), sk_s, dk_ref)
    dgt_s[...] = dgt
    bnd_s[...] = bnd
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(dgt_s, dgt_ref.at[b, h, rows])
    plgpu.copy_smem_to_gmem(bnd_s, bnd_ref.at[b, h, rows])

    def dv_products(intra, state):
        plgpu.wgmma(intra, _transposed(p_s, pt_s, interpret), do_s)  # P^T do, [C, V]
        plgpu.wgmma(state, k_s, dhn_s)  # k dS', [C, V]
        return intra[...], state[...]

    intra, state = lax.optimization_barrier(
        pl.run_scoped(dv_products, plgpu.ACC((CHUNK, dv)), plgpu.ACC((CHUNK, dv))))
    store((intra + state * _by_row(out_scale, state.shape)).astype(sv_s.dtype), sv_s, dv_ref)
    plgpu.wait_smem_to_gmem(0)


@functools.partial(jax.jit, static_argnames=("scale", "interpret"))
def chunk_grads_mosaic(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: Optional[jax.Array],
    h: jax.Array,
    dh_next: jax.Array,
    do: jax.Array,
    *,
    scale: float,
    segment_ids: Optional[jax.Array] = None,
    interpret: bool = False,
) -> Tuple[jax.Array, jax.Array, jax.Array]:
    """Per-value-head ``dq, dk, dv`` of every chunk from the stored states, by a Mosaic GPU kernel.

    The counterpart of FLA's ``chunk_bwd_dqkwg`` and ``chunk_bwd_dv``
    (``fla/ops/common/chunk_o.py``) for the scalar-decay family; ``dg`` follows from its outputs
    in :func:`simple_gla_bwd_mosaic`. Derivation: chunk ``c`` of the forward (see
    :func:`chunk_output_mosaic` and :func:`chunk_states_mosaic`) is, with ``G`` the chunk-local
    inclusive cumulative log-decay, ``G_L`` its last entry, ``S = S_c`` the state entering the
    chunk and ``S'`` the state leaving it::

        o_t = scale ( conn_t exp(G_t) S^T q_t
                      + sum_{s <= t, doc(s) = doc(t)} (q_t . k_s) exp(G_t - G_s) v_s )
        S'  = keep exp(G_L) S + sum_s last_s exp(G_L - G_s) k_s v_s^T

    ``q, k`` enter only there, so with ``do_t = dL/do_t`` and ``dS' = dL/dS'`` (the gradient of
    the state leaving chunk ``c``: ``dh_next[:, :, c]`` from :func:`chunk_dstates_mosaic` with
    ``leaving=True``, the final state's gradient for the last chunk), and the masked
    matrices (row ``t``, column ``s``, causal and same document)
    ``dA_ts = scale (do_t . v_s) exp(G_t - G_s)`` and ``P_ts = scale (q_t . k_s) exp(G_t - G_s)``::

        dq_t = scale conn_t exp(G_t) S do_t + sum_s dA_ts k_s                 (dq = dA k + ...)
        dk_s = sum_t dA_ts q_t + last_s exp(G_L - G_s) dS' v_s                (dk = dA^T q + ...)
        dv_s = sum_t P_ts do_t + last_s exp(G_L - G_s) dS'^T k_s              (dv = P^T do + ...)

    The gradient w.r.t. ``S`` itself is :func:`chunk_dstates_mosaic`'s. These are the gradients
    of :func:`pallas_kernels.simple_gla.reference.simple_gla_reference` (the chunk form is
    exact; GLA, arXiv 2312.06635, Sec. 4 and App. on the backward).

    Kernel structure, as :func:`chunk_output_mosaic`: one CTA per ``(chunk, value head, batch
    row)``, one warpgroup, twelve TMA copies on one barrier (``q, k, v, do``, ``S_c`` and ``dS'``
    rounded to the input dtype, row and column copies of the gate and document vectors, ``conn``,
    ``last``). ``wgmma`` (16-bit operands, fp32 accumulators) computes ``q k^T`` and ``do v^T``
    as one group; the causal, same-document decay is applied in the exponent and ``dA``, ``P``
    go to swizzled 16-bit SMEM tiles; then three groups of two products each give ``dq``, ``dk``
    and ``dv`` (``dA^T``, ``P^T``, ``k^T``, ``v^T``, ``S^T`` and ``dS'^T`` are transposed SMEM
    operands, copies when interpreting). Each gradient leaves through an SMEM tile of its output
    dtype. The gate gradient's per-token terms are formed in fp32 before any rounding (as FLA's
    ``chunk_bwd_dqkwg`` does): ``dgt_t = q_t . dq_t - k_t . dk_t`` and the boundary term
    ``<S', dS'>``, which the kernel never sees as such (it holds ``S_c``, not ``S'``), from
    ``S' = keep exp(G_L) S_c + sum_s last_s exp(G_L - G_s) k_s v_s^T``::

        <S', dS'> = keep exp(G_L) <S_c, dS'> + sum_s k_s . (last_s exp(G_L - G_s) dS' v_s)

    the second sum's terms being the state part of ``dk_s``. Its per-row partials leave as
    ``bnd`` and are summed per chunk here.

    Args:
        q: queries ``[B, T, Hk, K]``, bf16 or fp16; ``H % Hk == 0`` (value head ``h`` reads
            query/key head ``h // (H // Hk)``).
        k: keys ``[B, T, Hk, K]``, same dtype.
        v: values ``[B, T, H, V]``, same dtype. ``K, V`` in {64, 128}.
        g: log-decay ``[B, T, H]`` (natural log, ``<= 0``), or ``None`` (no decay).
        h: ``[B, H, N, K, V]`` states entering each chunk (``N = ceil(T / 64)``), from
            :func:`chunk_states_mosaic`; rounded to the input dtype (a ``wgmma`` operand) unless
            already in it.
        dh_next: ``[B, H, N, K, V]`` gradients w.r.t. the states leaving each chunk (``dS'``),
            from :func:`chunk_dstates_mosaic` with ``leaving=True``; rounded to the input dtype
            unless already in it.
        do: output gradient ``[B, T, H, V]``, same dtype as ``v``.
        scale: read-out scale of the forward (static).
        segment_ids: optional int ``[B, T]``; documents start wherever the id changes.
        interpret: run in Mosaic GPU interpret mode (CPU; slow, for tests).

    Returns:
        ``(dq, dk, dv, dgt, boundary)``. ``dq, dk`` ``[B, T, H, K]`` **per value head**: in the
        input dtype without GVA (``H == Hk``), fp32 with it (the key heads' gradients are the
        sums over each group of ``H // Hk`` value heads, done in XLA by
        :func:`simple_gla_bwd_mosaic`). ``dv`` ``[B, T, H, V]`` in the input dtype. ``dgt``
        ``[B, H, N * 64]`` fp32, ``q_t . dq_t - k_t . dk_t`` per value head (0 on padding), and
        ``boundary`` ``[B, H, N]`` fp32, ``<S', dS'>`` per chunk: with them
        ``dL/dG_t = dgt_t + [t = L] boundary``. Exact up to the 16-bit rounding of the
        ``wgmma`` operands (``S_c``, ``dS'``, ``dA``, ``P``) with fp32 accumulation.

    Raises:
        ValueError: on mismatched shapes, unsupported head dims or dtypes (see
            :func:`unsupported_reason`), ``H`` not a multiple of ``Hk``, or ``h``, ``dh_next``,
            ``do`` of the wrong shape.
    """
    batch, seq_len, kv_heads, dk = k.shape
    heads, dv = v.shape[2], v.shape[3]
    num_chunks = -(-seq_len // CHUNK)
    if q.shape != k.shape or q.dtype != k.dtype:
        raise ValueError(f"q and k must match: {q.shape=} {k.shape=} {q.dtype=} {k.dtype=}")
    if do.shape != v.shape or do.dtype != v.dtype:
        raise ValueError(f"do and v must match: {do.shape=} {v.shape=} {do.dtype=} {v.dtype=}")
    _check_kv_gates(k, v, g, segment_ids)
    for name, x in (("h", h), ("dh_next", dh_next)):
        if x.shape != (batch, heads, num_chunks, dk, dv):
            raise ValueError(f"{name} must be [B, H, N, K, V] = "
                             f"{(batch, heads, num_chunks, dk, dv)}, got {name}.shape={x.shape}")

    padded = num_chunks * CHUNK
    # Padding tokens have q = k = v = do = 0 and g = 0: they contribute nothing.
    q, k, v, do = (_pad_time(x, num_chunks) for x in (q, k, v, do))
    gc = _chunk_cumsum(g, (batch, seq_len, heads), num_chunks)  # [B, H, Tp]
    doc, conn, last = _doc_vectors(segment_ids, batch, num_chunks)  # [B, Tp] each
    vec = plgpu.SMEM((CHUNK,), jnp.float32)
    # dq, dk leave in the input dtype unless GVA sums them over a group (fp32 then, in XLA).
    dqk_dtype = k.dtype if heads == kv_heads else jnp.float32
    shim = [plgpu.SMEM((dk, CHUNK), k.dtype),  # kt_s
            plgpu.SMEM((dv, CHUNK), v.dtype),  # vt_s
            plgpu.SMEM((dv, dk), v.dtype),  # ht_s
            plgpu.SMEM((dv, dk), v.dtype),  # dhnt_s
            plgpu.SMEM((CHUNK, CHUNK), v.dtype),  # dst_s
            plgpu.SMEM((CHUNK, CHUNK), v.dtype)]  # pt_s
    f32 = jnp.float32
    call = plgpu.kernel(
        functools.partial(_grads_kernel, group=heads // kv_heads, scale=float(scale),
                          interpret=interpret),
        out_type=(jax.ShapeDtypeStruct((batch, padded, heads, dk), dqk_dtype),
                  jax.ShapeDtypeStruct((batch, padded, heads, dk), dqk_dtype),
                  jax.ShapeDtypeStruct((batch, padded, heads, dv), v.dtype),
                  jax.ShapeDtypeStruct((batch, heads, padded), f32),  # dgt
                  jax.ShapeDtypeStruct((batch, heads, padded), f32)),  # bnd
        scratch_types=[
            _swizzled_smem((CHUNK, dk), q.dtype),  # q_s
            _swizzled_smem((CHUNK, dk), k.dtype),  # k_s
            _swizzled_smem((CHUNK, dv), v.dtype),  # v_s
            _swizzled_smem((CHUNK, dv), v.dtype),  # do_s
            _swizzled_smem((dk, dv), v.dtype),  # h_s: S_c in 16 bits
            _swizzled_smem((dk, dv), v.dtype),  # dhn_s: dS' in 16 bits
            vec, vec, vec, vec, vec, vec,  # g_row_s, g_col_s, doc_row_s, doc_col_s, conn_s, last_s
            _swizzled_smem((CHUNK, CHUNK), v.dtype),  # ds_s: masked dA
            _swizzled_smem((CHUNK, CHUNK), v.dtype),  # p_s: masked P
            _swizzled_smem((CHUNK, dk), dqk_dtype),  # sk_s: staging of dq, then dk
            _swizzled_smem((CHUNK, dv), v.dtype),  # sv_s: staging of dv
            vec, vec,  # dgt_s, bnd_s: staging of the per-row dg terms
            plgpu.Barrier(num_arrivals=12),  # in_bar: the 12 input copies landed
        ] + (shim if interpret else []),
        grid=(num_chunks, heads, batch),  # chunks first: CUDA caps grid y and z at 65535
        grid_names=("n", "h", "b"),
        compiler_params=mosaic_gpu_lib.compiler_params(),
        interpret=interpret_params() if interpret else None,
        kernel_name="simple_gla_chunk_grads",
    )
    with jax.named_scope("simple_gla_chunk_grads_mosaic"):
        dq, dk_, dv_, dgt, bnd = call(q, k, v, do, h.astype(v.dtype), dh_next.astype(v.dtype),
                                      gc, doc, conn, last)  # astype: free when 16-bit already
    boundary = jnp.sum(bnd.reshape(batch, heads, num_chunks, CHUNK), axis=-1)
    return dq[:, :seq_len], dk_[:, :seq_len], dv_[:, :seq_len], dgt, boundary


@functools.partial(jax.jit, static_argnames=("scale", "interpret"))
def simple_gla_bwd_mosaic(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: Optional[jax.Array],
    do: jax.Array,
    *,
    scale: Optional[float] = None,
    initial_state: Optional[jax.Array] = None,
    final_state_grad: Optional[jax.Array] = None,
    segment_ids: Optional[jax.Array] = None,
    h: Optional[jax.Array] = None,
    interpret: bool = False,
):
    """Backward of scalar-decay linear attention from three Mosaic GPU kernels and XLA.

    :func:`chunk_states_mosaic` recomputes the states ``h`` entering every chunk (stored in the
    input dtype; its final state is not needed: ``chunk_grads_mosaic`` forms the boundary term
    from ``h`` itself), unless the caller passes ``h`` (e.g. the fused forward's,
    :func:`simple_gla_fused_fwd_mosaic` with ``store_h``, bitwise the same states; then only
    two kernels run), :func:`chunk_dstates_mosaic` gives the gradients
    ``dS'`` of the states leaving every chunk (input dtype) and ``dh0``, and
    :func:`chunk_grads_mosaic` the per-value-head ``dq, dk, dv`` and the fp32 per-token terms of
    ``dg``. XLA then sums ``dq, dk`` over each GVA group (fp32) and reverse-cumsums ``dg``
    within each chunk (fp32).

    ``dg`` derivation: ``g`` enters the chunk form (see :func:`chunk_grads_mosaic`) only through
    ``G_t = g_{c,0} + ... + g_{c,t}``, in the factors ``exp(G_t - G_s)`` (intra-chunk scores
    and values reaching the state leaving the chunk), ``exp(G_t)`` (the incoming state read by
    token ``t``) and ``exp(G_L)`` (the incoming state carried through the chunk). Each factor's
    derivative is the term it multiplies, with ``+`` for the ``G`` of the later token and ``-``
    for the earlier one; grouping the terms by the gradients that contain them gives, per value
    head and chunk::

        dL/dG_t = q_t . dq_t - k_t . dk_t + [t = L] <S', dS'>
        dg_t    = sum_{u >= t in the chunk} dL/dG_u                        (fp32, reverse cumsum)

    where ``dq, dk`` are :func:`chunk_grads_mosaic`'s (per value head, before the group sum and
    before rounding: the kernel forms these terms in fp32), ``S'`` the state leaving the chunk
    (``h[:, :, c + 1]``, the final state for the last one) and ``dS'`` its gradient. The
    ``[t = L]`` term collects ``keep exp(G_L) <S, dS'>`` and
    ``sum_s k_s . (last_s exp(G_L - G_s) dS' v_s)``, which sum to ``<S', dS'>`` because
    ``S' = keep exp(G_L) S + sum_s last_s exp(G_L - G_s) k_s v_s^T``. Document resets need no
    extra term: the masks already remove every factor that spans a document start, so ``g`` at
    a start gets zero gradient (it multiplies the reset state), as in the reference. FLA forms
    ``dg`` the same way (``chunk_bwd_dqkwg`` plus a reverse ``chunk_local_cumsum``).

    Args:
        q, k: ``[B, T, Hk, K]``, bf16 or fp16 (GVA when ``Hk < H``).
        v: ``[B, T, H, V]``, same dtype; ``K, V`` in {64, 128}.
        g: log-decay ``[B, T, H]`` (``<= 0``) or ``None``.
        do: gradient of ``o`` ``[B, T, H, V]``, same dtype as ``v``.
        scale: read-out scale (static); ``None`` means ``K ** -0.5``.
        initial_state: ``[B, H, K, V]`` or ``None`` (zeros), as in the forward.
        final_state_grad: ``[B, H, K, V]`` gradient of the final state, or ``None`` (zeros).
        segment_ids: optional int ``[B, T]`` (packed documents).
        h: optional ``[B, H, N, K, V]`` states entering every chunk (``N = ceil(T / 64)``) in
            the input dtype, as :func:`chunk_states_mosaic` with ``states_dtype=v.dtype``
            returns them (or :func:`simple_gla_fused_fwd_mosaic` with ``store_h``); ``None``:
            recomputed by :func:`chunk_states_mosaic`.
        interpret: Mosaic GPU interpret mode (CPU, tests).

    Returns:
        ``(dq, dk, dv, dg, dh0)``: ``dq, dk`` ``[B, T, Hk, K]`` and ``dv`` ``[B, T, H, V]`` in
        the input dtype, ``dg`` ``[B, T, H]`` fp32 (``None`` when ``g`` is ``None``), ``dh0``
        ``[B, H, K, V]`` fp32 (``None`` when ``initial_state`` is ``None``).

    Raises:
        ValueError: as the three kernels, or naming ``h`` when it is not ``[B, H, N, K, V]`` in
            the input dtype.
    """
    if scale is None:
        scale = k.shape[-1] ** -0.5
    batch, seq_len, kv_heads, dk = k.shape
    heads = v.shape[2]
    group = heads // max(kv_heads, 1)
    if h is not None:
        want = (batch, heads, -(-seq_len // CHUNK), dk, v.shape[3])
        if h.shape != want or h.dtype != v.dtype:
            raise ValueError(f"h must be [B, H, N, K, V] = {want} in the input dtype {v.dtype}, "
                             f"got {h.shape=} {h.dtype=}")
    else:
        # h and dS' only feed wgmma operands (and the dg boundary term below): stored in the
        # input dtype, dS' already shifted by the reverse pass (leaving=True), so no conversion
        # or shift pass runs in XLA. The two-pass forward's chunk_states_mosaic call is
        # identical, so XLA keeps one. Its final state is not needed here.
        h, _ = chunk_states_mosaic(k, v, g, initial_state=initial_state,
                                   segment_ids=segment_ids, states_dtype=v.dtype,
                                   interpret=interpret)
    dh_next, dh0 = chunk_dstates_mosaic(q, do, g, scale=scale, final_state_grad=final_state_grad,
                                        segment_ids=segment_ids, states_dtype=v.dtype,
                                        leaving=True, interpret=interpret)
    dq, dk_, dv_, dgt, boundary = chunk_grads_mosaic(q, k, v, g, h, dh_next, do, scale=scale,
                                                     segment_ids=segment_ids,
                                                     interpret=interpret)
    dg = None
    if g is not None:
        num_chunks = h.shape[2]
        dgt = dgt.reshape(batch, heads, num_chunks, CHUNK)
        # dg_t = sum_{u >= t in the chunk} dL/dG_u; the boundary term sits at u = L, so every
        # token of the chunk gets it.
        dg = jnp.flip(jnp.cumsum(jnp.flip(dgt, 3), axis=3), 3) + boundary[..., None]
        dg = jnp.moveaxis(dg.reshape(batch, heads, num_chunks * CHUNK), 1, 2)[:, :seq_len]
    if group > 1:  # GVA: fp32 per-value-head gradients summed over each group
        dq = dq.reshape(batch, seq_len, kv_heads, group, dk).sum(3)
        dk_ = dk_.reshape(batch, seq_len, kv_heads, group, dk).sum(3)
    return (dq.astype(q.dtype), dk_.astype(k.dtype), dv_.astype(v.dtype), dg,
            dh0 if initial_state is not None else None)


def simple_gla_mosaic(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: Optional[jax.Array] = None,
    *,
    scale: Optional[float] = None,
    initial_state: Optional[jax.Array] = None,
    segment_ids: Optional[jax.Array] = None,
    forward: str = DEFAULT_FORWARD,
    residual_h: Optional[bool] = None,
    interpret: bool = False,
) -> Tuple[jax.Array, jax.Array]:
    """Differentiable scalar-decay linear attention on the Mosaic GPU kernels.

    ``o_t = scale q_t^T S_t``, ``S_t = exp(g_t) S_{t-1} + k_t v_t^T`` (reset at document
    starts), as :func:`simple_gla_fwd_mosaic`, with a ``jax.custom_vjp`` whose backward is
    :func:`simple_gla_bwd_mosaic` (states recomputed, not saved: the residuals are the inputs;
    with ``residual_h`` and the fused forward, the forward's states ``h`` are saved too).

    Args:
        q, k: ``[B, T, Hk, K]`` bf16 or fp16; v: ``[B, T, H, V]`` same dtype; ``K, V`` in
            {64, 128}.
        g: log-decay ``[B, T, H]`` (``<= 0``, fp32 preferred) or ``None``.
        scale: static read-out scale; ``None`` means ``K ** -0.5``.
        initial_state: ``[B, H, K, V]`` or ``None``.
        segment_ids: optional int ``[B, T]``; not differentiated.
        forward: static, the forward kernels: ``"two_pass"``, ``"fused"`` (see
            :func:`simple_gla_fwd_mosaic`) or ``"auto"`` (:data:`DEFAULT_FORWARD`: fused,
            except two-pass under differentiation on rows with sequence pieces;
            :func:`resolve_forward`); the backward is the same either way.
        residual_h: static; ``None`` means :data:`RESIDUAL_H` (off). On, and when the forward
            resolves to ``"fused"`` under differentiation, the forward rule runs
            :func:`simple_gla_fused_fwd_mosaic` with ``store_h`` and saves its chunk states
            ``h`` (``[B, H, N, K, V]``, input dtype) as a residual, which the backward uses
            instead of recomputing them (:func:`simple_gla_bwd_mosaic`'s ``h``): the same
            states bitwise, so the same gradients bitwise. On rows with sequence pieces XLA
            transposes ``h`` from per-piece rows (one extra pass over ``h``). No effect on the
            primal alone or with the two-pass forward (whose state pass the backward shares).
        interpret: Mosaic GPU interpret mode (CPU, tests).

    Returns:
        ``(o, final_state)``: ``o`` ``[B, T, H, V]`` in the input dtype, ``final_state``
        ``[B, H, K, V]`` fp32. Gradients flow to ``q, k, v, g, initial_state``, each in its
        own dtype.

    Raises:
        ValueError: as the kernels (shapes, dtypes, head dims), or for an unknown ``forward``.
    """
    if forward not in FORWARDS:
        raise ValueError(f"forward must be one of {FORWARDS}, got {forward!r}")
    if scale is None:
        scale = k.shape[-1] ** -0.5
    residual_h = RESIDUAL_H if residual_h is None else bool(residual_h)
    return _simple_gla_mosaic(q, k, v, g, initial_state, segment_ids, float(scale), interpret,
                              forward, residual_h)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8, 9))
def _simple_gla_mosaic(q, k, v, g, initial_state, segment_ids, scale, interpret, forward,
                       residual_h):
    del residual_h  # differentiation only
    return simple_gla_fwd_mosaic(q, k, v, g, scale=scale, initial_state=initial_state,
                                 segment_ids=segment_ids, forward=forward, interpret=interpret)


def _simple_gla_mosaic_fwd(q, k, v, g, initial_state, segment_ids, scale, interpret, forward,
                           residual_h):
    forward = resolve_forward(forward, k.shape[0], k.shape[1], v.shape[2], v.shape[3],
                              differentiated=True)
    h = None
    if residual_h and forward == "fused":  # the forward's states, bitwise the recomputed ones
        o, final_state, h = simple_gla_fused_fwd_mosaic(
            q, k, v, g, scale=scale, initial_state=initial_state, segment_ids=segment_ids,
            store_h=True, interpret=interpret, **FUSED_OPTIONS)
        out = (o, final_state)
    else:
        out = simple_gla_fwd_mosaic(q, k, v, g, scale=scale, initial_state=initial_state,
                                    segment_ids=segment_ids, forward=forward,
                                    interpret=interpret)
    return out, (q, k, v, g, initial_state, segment_ids, h)


def _simple_gla_mosaic_bwd(scale, interpret, forward, residual_h, residuals, cotangents):
    # h: the fused forward's states (residual_h), or None: recomputed by chunk_states_mosaic
    del forward, residual_h
    q, k, v, g, initial_state, segment_ids, h = residuals
    do, dht = cotangents
    dq, dk, dv, dg, dh0 = simple_gla_bwd_mosaic(
        q, k, v, g, do.astype(v.dtype), scale=scale, initial_state=initial_state,
        final_state_grad=dht, segment_ids=segment_ids, h=h, interpret=interpret)
    dg = None if g is None else dg.astype(g.dtype)
    dh0 = None if initial_state is None else dh0.astype(initial_state.dtype)
    return dq, dk, dv, dg, dh0, None


_simple_gla_mosaic.defvjp(_simple_gla_mosaic_fwd, _simple_gla_mosaic_bwd)
