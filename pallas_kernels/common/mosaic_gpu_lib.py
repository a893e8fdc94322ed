"""Shared pieces of the Pallas Mosaic GPU (``plgpu``) kernels for Hopper (issue 29).

Used by the scalar-decay kernels (:mod:`pallas_kernels.simple_gla.kernel_mosaic_gpu`) and the
delta-rule forward (:mod:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu`); the dispatch is
:mod:`pallas_kernels.common.mosaic_gpu`. What is here:

* the chunk and tile constants, the supported head dims and dtypes, and the input checks the
  kernels share (:func:`unsupported_reason`, :func:`check_kv_gates`,
  :func:`check_states_dtype`);
* the host-side inputs every kernel reads: time padding (:func:`pad_time`), the head-major
  chunk-local fp32 gate cumsum (:func:`chunk_cumsum`) and the document vectors
  (:func:`doc_vectors`);
* the sequence split of the state passes for rows with few CTAs (:func:`num_pieces`,
  :func:`split_rows`, :func:`split_head_major`) and the fp32 scan over the pieces' affine
  maps (:func:`scan_piece_maps`; the delta and per-channel passes, MOSAIC_GPU.md Secs. 29,
  30);
* SMEM tiles (:func:`swizzled_smem`) and the memory warpgroup of the 2-stage TMA ring
  (:func:`ring_producer`);
* the interpret-mode shims. jax 0.10.2's Mosaic GPU interpreter (:func:`interpret_params`)
  cannot evaluate ``plgpu.load`` with a layout, ``plgpu.layout_cast``,
  ``plgpu.broadcasted_iota(..., layout=)``, a transposed SMEM ``wgmma`` operand or a register
  ``wgmma`` operand, so :func:`load_rows`, :func:`load_cols`, :func:`load_tile`,
  :func:`zeros_acc`, :func:`iota`, :func:`transposed` and :func:`lhs_operand` take an
  ``interpret`` flag and read plainly or copy through SMEM there; the other branch is what the
  GPU runs (covered on CPU by the lowering tests). ``pallas_kernels/common/MOSAIC_GPU.md`` has
  the details.
"""

import inspect
from typing import Optional

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.common import pallas_gpu

CHUNK = 64
# Mosaic GPU's approx_math for every kernel of ours (read when a kernel is traced): on, jnp.exp
# lowers to a multiply by log2(e) and one ex2.approx.ftz.f32 (as jla's kernels compile, with
# CompilerParams(approx_math=True)); off, to the accurate math.exp sequence around the same
# instruction. On since the H100 run of 2026-12-07d (MOSAIC_GPU.md Sec. 47: GDN S1 fwd+bwd
# 1.614 against 1.70 ms, S2 2.235 against 2.362, the gate's errors equal to 1e-7);
# bench_kernels.py --nomosaic_approx_math turns it off per process.
APPROX_MATH = True
BLOCK_V = 64  # value columns per CTA of the state passes: the state tile is [K, BLOCK_V] fp32
STAGES = 2  # depth of the TMA input ring
SUPPORTED_HEAD_DIMS = (64, 128)
SUPPORTED_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
_WGMMA = plgpu.Layout.WGMMA
_ROWS = plgpu.Layout.WGMMA.reduce(1)  # one value per row of a [64 * m, n] WGMMA tile
_COLS = plgpu.Layout.WGMMA.reduce(0)  # one value per column of a [64 * m, n] WGMMA tile

# jax 0.10.x's ``plgpu.load(src, idx, *, layout)`` needs the index; from 0.11 passing it is
# deprecated (index the ref with ``ref.at[...]`` instead) and it may be left out.
_LOAD_IDX = inspect.signature(plgpu.load).parameters.get("idx")
_LOAD_NEEDS_IDX = _LOAD_IDX is not None and _LOAD_IDX.default is inspect.Parameter.empty


def compiler_params(**kwargs):
    """``plgpu.CompilerParams(**kwargs)`` with ``approx_math`` from :data:`APPROX_MATH`: every
    Mosaic GPU kernel of ours takes its compiler parameters from here."""
    return plgpu.CompilerParams(approx_math=APPROX_MATH, **kwargs)


def interpret_params():
    """``InterpretGPUParams`` for Mosaic GPU interpret mode on CPU (jax 0.10.x and 0.11.x).

    jax 0.11 exports the class as ``plgpu.InterpretGPUParams``; jax 0.10.2 has it only in
    ``jax._src.pallas.mosaic_gpu.interpret.params``.

    Raises:
        NotImplementedError: on a jax without the Mosaic GPU interpreter.
    """
    cls = getattr(plgpu, "InterpretGPUParams", None)
    if cls is None:
        try:
            from jax._src.pallas.mosaic_gpu.interpret import params as gpu_interpret
        except ImportError as e:  # pragma: no cover - depends on the installed jax
            raise NotImplementedError("this jax has no Mosaic GPU interpret mode") from e
        cls = gpu_interpret.InterpretGPUParams
    return cls(detect_races=True)


def swizzled_smem(shape, dtype):
    """SMEM tile tiled and swizzled for TMA and WGMMA (the minor dim is the last dim)."""
    dtype = jnp.dtype(dtype)
    swizzle = plgpu.find_swizzle(shape[-1] * dtype.itemsize * 8)
    tiling = plgpu.TilingTransform((8, swizzle // dtype.itemsize))
    return plgpu.SMEM(shape, dtype, transforms=(tiling, plgpu.SwizzleTransform(swizzle)))


def load(ref, layout):
    """The whole ``ref`` (SMEM) as a register value in ``layout``, on jax 0.10 and 0.11."""
    if _LOAD_NEEDS_IDX:
        return plgpu.load(ref, (), layout=layout)
    return plgpu.load(ref, layout=layout)


def load_rows(ref, interpret: bool):
    """A ``[C]`` fp32 SMEM vector as one value per row of a WGMMA tile (see module docstring)."""
    if interpret:
        return ref[...]
    return load(ref, _ROWS)


def load_cols(ref, interpret: bool):
    """A ``[C]`` fp32 SMEM vector as one value per column of a WGMMA tile."""
    if interpret:
        return ref[...]
    return load(ref, _COLS)


def load_tile(ref, interpret: bool):
    """A 2-D SMEM tile in the WGMMA register layout."""
    if interpret:
        return ref[...]
    return load(ref, _WGMMA)


def zeros_acc(shape, interpret: bool):
    zeros = jnp.zeros(shape, jnp.float32)
    return zeros if interpret else plgpu.layout_cast(zeros, _WGMMA)


def entry_state(h0_src, state_s, io_bar, shape, interpret: bool):
    """The fp32 state entering a row's first chunk, as a WGMMA accumulator value.

    ``h0_src``: the row's ``[K, BLOCK_V]`` view of ``initial_state`` in GMEM (copied by TMA
    into ``state_s``, fp32 SMEM, waited on ``io_bar``), or ``None`` for zeros of ``shape``.
    """
    if h0_src is None:
        return zeros_acc(shape, interpret)
    plgpu.copy_gmem_to_smem(h0_src, state_s, io_bar)
    plgpu.barrier_wait(io_bar)
    return load_tile(state_s, interpret)


def store_state(s, state_s, dst, *, wait_stores: bool = True) -> None:
    """Writes the fp32 state ``s`` to the GMEM view ``dst`` through ``state_s`` (fp32 SMEM)
    and waits for the copy. ``wait_stores``: first wait until earlier SMEM -> GMEM copies have
    read their sources (``state_s`` may be one of them); ``False`` where none can have."""
    if wait_stores:
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)
    state_s[...] = s
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(state_s, dst)
    plgpu.wait_smem_to_gmem(0)


def iota(shape, dim: int, interpret: bool):
    """int32 ``broadcasted_iota`` in the WGMMA layout (plain when interpreting)."""
    if interpret:
        return lax.broadcasted_iota(jnp.int32, shape, dim)
    return plgpu.broadcasted_iota(jnp.int32, shape, dim, layout=_WGMMA)


def by_row(x, shape):
    """``x`` ``[C]`` broadcast along the rows of ``shape`` (one value per row)."""
    return lax.broadcast_in_dim(x, shape, [0])


def causal_decay(i, j, g_i, g_j, d_i, d_j):
    """The chunk's decayed causal same-document mask ``D``, fp32 ``[C, C]``.

    ``D_ts = e^{G_t - G_s}`` where ``s <= t`` and tokens ``t, s`` are in the same document, else
    0 (arXiv 2607.07953 Sec. 3.2; FLA's ``chunk_fwd_o``). The exponent is masked before
    ``exp``, so ``D <= 1`` and nothing overflows above the diagonal. ``i, j``: row and column
    iotas ``[C, C]`` (:func:`iota`); ``g_i, d_i``: the chunk-local cumulative log-decay and the
    document ids as rows (:func:`load_rows`), ``g_j, d_j`` as columns (:func:`load_cols`).
    """
    shape = i.shape
    mask = (j <= i) & (by_row(d_i, shape) == lax.broadcast_in_dim(d_j, shape, [1]))
    diff = by_row(g_i, shape) - lax.broadcast_in_dim(g_j, shape, [1])
    return jnp.exp(jnp.where(mask, diff, -jnp.inf))


def transposed(ref, scratch, interpret: bool):
    """``ref^T`` as a ``wgmma`` operand: a transposed view, or a copy into ``scratch``."""
    if interpret:  # the 0.10.2 interpreter's wgmma cannot read a transposed ref
        scratch[...] = ref[...].T
        plgpu.commit_smem()
        return scratch
    return ref.transpose((1, 0))  # plgpu.transpose_ref is deprecated in jax 0.11


def lhs_operand(x, scratch, interpret: bool):
    """A 16-bit register tile as the left ``wgmma`` operand (via ``scratch`` when interpreting).

    The 0.10.2 interpreter's ``wgmma`` takes SMEM refs only; on the GPU the operand stays in
    registers.
    """
    if interpret:
        scratch[...] = x
        plgpu.commit_smem()
        return scratch
    return x


def ring_producer(issue, num_chunks: int, in_free, stages: int = STAGES) -> None:
    """The memory warpgroup of a ``stages``-deep TMA ring over ``num_chunks`` steps:
    ``issue(i, slot)`` starts step ``i``'s copies into ``slot``; a slot is refilled once the
    consumer arrives on ``in_free[slot]``, and the last releases are observed before leaving."""
    for i in range(min(stages, num_chunks)):
        issue(i, i)

    @pl.loop(stages, num_chunks)
    def _refill(i):
        slot = lax.rem(i, stages)
        plgpu.barrier_wait(in_free.at[slot])  # step i - stages consumed the slot
        issue(i, slot)

    for i in range(max(num_chunks - stages, 0), num_chunks):  # observe the last releases
        plgpu.barrier_wait(in_free.at[i % stages])


def ring_producer_from(issue, lo, num_chunks: int, in_free, stages: int = STAGES) -> None:
    """:func:`ring_producer` over the steps ``lo .. num_chunks - 1`` only, ``lo`` a traced
    int32 scalar in ``[0, num_chunks]``: ``issue(n, slot)`` with ``slot = n mod stages`` (the
    consumer's ``fori_loop(lo, num_chunks)`` uses the same slots). The first ``stages`` steps
    go out at once, step ``n`` waits for ``in_free[n mod stages]`` (step ``n - stages``
    consumed the slot), and the last releases (steps ``>= lo``) are observed before leaving.
    Used where a sequence piece's chain starts at a document start (MOSAIC_GPU.md Sec. 52)."""
    for i in range(stages):
        @pl.when(lo + i < num_chunks)
        def _first():
            n = lo + i
            issue(n, lax.rem(n, stages))

    @pl.loop(lo + stages, num_chunks)
    def _refill(n):
        slot = lax.rem(n, stages)
        plgpu.barrier_wait(in_free.at[slot])
        issue(n, slot)

    for n in range(max(num_chunks - stages, 0), num_chunks):  # observe the last releases
        @pl.when(lo <= n)
        def _observe():
            plgpu.barrier_wait(in_free.at[n % stages])


def pad_time(x, num_chunks):
    """Zero-pads axis 1 (time) of ``x`` to ``num_chunks * CHUNK``."""
    pad = num_chunks * CHUNK - x.shape[1]
    return jnp.pad(x, ((0, 0), (0, pad)) + ((0, 0),) * (x.ndim - 2))


def chunk_cumsum(g, shape, num_chunks, gate_cumsum=None):
    """fp32 ``[B, H, Tp]`` chunk-local inclusive cumsum of ``g`` (``[B, T, H]`` or ``None``):
    ``G_t = sum_{s <= t, s in t's chunk of 64} g_s``, accumulated in fp32.

    Head-major, so one chunk's gates are one contiguous TMA row; padding tokens get ``g = 0``.
    ``gate_cumsum``: that array computed once by the caller (``[B, H, Tp]`` fp32, e.g. by this
    function) and shared by several kernels (MOSAIC_GPU.md Sec. 27); returned as it is after a
    shape check, and ``g`` is then not read.

    Raises:
        ValueError: a ``gate_cumsum`` that is not fp32 ``[B, H, Tp]``.
    """
    batch, _, heads = shape
    padded = num_chunks * CHUNK
    if gate_cumsum is not None:
        if gate_cumsum.shape != (batch, heads, padded) or gate_cumsum.dtype != jnp.float32:
            raise ValueError(f"gate_cumsum must be fp32 [B, H, Tp] = {(batch, heads, padded)}, "
                             f"got {gate_cumsum.shape} {gate_cumsum.dtype}")
        return gate_cumsum
    if g is None:  # ungated (DeltaNet): zeros as they are. A cumsum of a zeros constant made
        # XLA constant-fold a reduce-window over the whole [B, N, 64, H] at compile time, 4-6 s
        # per kernel that takes it on the H100 (benchmarks/results/mosaic-gpu-h100-2026-12-07.md)
        return jnp.zeros((batch, heads, padded), jnp.float32)
    gf = pad_time(g.astype(jnp.float32), num_chunks)
    gc = jnp.cumsum(gf.reshape(batch, num_chunks, CHUNK, heads), axis=2)
    return jnp.moveaxis(gc.reshape(batch, padded, heads), 1, 2)  # [B, H, Tp]


def doc_vectors(segment_ids, batch, num_chunks, precomputed=None):
    """fp32 ``(doc, conn, last)`` ``[B, Tp]`` (see :func:`pallas_gpu.docs_from_segment_ids`).

    ``doc`` is the document index (exact in fp32 below 2**24 tokens), ``conn`` is 1 on the tokens
    of the document that was open before the chunk, ``last`` 1 on the chunk's last document.
    ``precomputed``: this function's result for the same ``segment_ids``, formed once by a
    caller that runs several kernels (MOSAIC_GPU.md Sec. 27); returned after a shape check.

    Raises:
        ValueError: a ``precomputed`` that is not three fp32 ``[B, Tp]`` arrays.
    """
    padded = num_chunks * CHUNK
    if precomputed is not None:
        if len(precomputed) != 3 or any(x.shape != (batch, padded) or x.dtype != jnp.float32
                                        for x in precomputed):
            raise ValueError(f"doc_vecs must be three fp32 [B, Tp] = {(batch, padded)} arrays, "
                             f"got {[(x.shape, x.dtype) for x in precomputed]}")
        return tuple(precomputed)
    if segment_ids is None:
        ones = jnp.ones((batch, padded), jnp.float32)
        return jnp.zeros((batch, padded), jnp.float32), ones, ones
    doc, conn, last = pallas_gpu.docs_from_segment_ids(segment_ids, padded)
    return doc.astype(jnp.float32), conn, last


# Rows with fewer CTAs than this run as sequence pieces (the H200 has 132 SMs).
TARGET_CTAS = 132
MAX_PIECES = 8


def num_pieces(pieces: Optional[int], ctas: int, num_chunks: int) -> int:
    """How many sequence pieces a state pass runs: ``pieces`` if given (it must divide the chunk
    count), else the largest ``P <= MAX_PIECES`` dividing ``num_chunks`` with
    ``ctas * P <= TARGET_CTAS`` and at least 4 chunks per piece.

    Raises:
        ValueError: naming ``pieces`` when it is not a positive divisor of the chunk count.
    """
    if pieces is not None:
        if pieces < 1 or num_chunks % pieces:
            raise ValueError(f"pieces={pieces} must be a positive divisor of the chunk count "
                             f"{num_chunks}")
        return pieces
    best = 1
    for p in range(2, MAX_PIECES + 1):
        if num_chunks % p == 0 and ctas * p <= TARGET_CTAS and num_chunks // p >= 4:
            best = p
    return best


def given_pieces(pieces, num_chunks: int) -> int:
    """``pieces`` as a caller of a pieces kernel gives it (a static ``int``), checked:
    :func:`num_pieces` of it.

    Raises:
        ValueError: naming ``pieces`` when it is not an ``int`` (a ``bool`` is refused) or not a
            positive divisor of the chunk count.
    """
    if not isinstance(pieces, int) or isinstance(pieces, bool):
        raise ValueError(f"pieces must be a positive divisor of the chunk count {num_chunks}, "
                         f"got {pieces!r}")
    return num_pieces(pieces, 1, num_chunks)


def check_piece_rows(pieces, batch: int, seq_len: int) -> None:
    """Checks ``pieces`` of a kernel that takes each row's ``P`` sequence pieces as ``P`` rows
    of its batch (``[B * P, T / P, ...]``, :func:`split_rows`): ``batch`` the rows it was
    given, ``seq_len`` the tokens per piece.

    Raises:
        ValueError: naming ``pieces`` when it is not a positive ``int`` dividing ``batch``, or
            when ``pieces > 1`` and ``seq_len`` is not a whole number of chunks.
    """
    if not isinstance(pieces, int) or pieces < 1 or batch % pieces:
        raise ValueError(f"pieces={pieces!r} must be a positive divisor of the batch rows "
                         f"{batch} (the sequence pieces of each row, as rows)")
    if pieces > 1 and seq_len % CHUNK:
        raise ValueError(f"pieces={pieces}: each piece must be a whole number of chunks of "
                         f"{CHUNK} tokens, got T = {seq_len} per piece")


def checked_piece_cuts(conn: jax.Array, pieces: int,
                       cuts: Optional[jax.Array]) -> jax.Array:
    """The per-piece chunk of the last document start, int32 ``[B * P]``: ``cuts`` as a caller
    formed it (checked), else :func:`piece_cuts` of the documents' ``conn`` ``[B, Tp]``.

    Raises:
        ValueError: naming ``piece_cuts`` when ``cuts`` is not int32 ``[B * P]``.
    """
    rows = conn.shape[0] * pieces
    if cuts is None:
        return piece_cuts(conn, pieces)
    if cuts.shape != (rows,) or cuts.dtype != jnp.int32:
        raise ValueError(f"piece_cuts must be int32 [B * P] = {(rows,)}, got "
                         f"{cuts.shape} {cuts.dtype}")
    return cuts


def row_pieces(batch: int, heads: int, dv: int, seq_len: int) -> int:
    """The sequence pieces per row that the state passes choose for rows of ``seq_len``
    tokens with ``batch * heads * dv / BLOCK_V`` CTAs (:func:`num_pieces`; 1: enough CTAs)."""
    return num_pieces(None, batch * heads * (dv // BLOCK_V), -(-seq_len // CHUNK))


def split_rows(x, pieces):
    """``[B, Tp, ...]`` to ``[B * P, Tp / P, ...]``: each row as ``P`` rows of consecutive
    chunks (a free reshape). The gate and document vectors are formed on whole rows first, so
    ``conn`` of a piece's first chunk still says whether the previous piece's state reaches
    it."""
    return x.reshape((x.shape[0] * pieces, x.shape[1] // pieces) + x.shape[2:])


def split_head_major(x, pieces):
    """``[B, H, Tp]`` (the head-major gate cumsum) to ``[B * P, H, Tp / P]``."""
    b, hh, tp = x.shape
    x = x.reshape(b, hh, pieces, tp // pieces).transpose(0, 2, 1, 3)
    return x.reshape(b * pieces, hh, tp // pieces)


def piece_cuts(conn, pieces, *, first: bool = False):
    """int32 ``[B * P]``: per sequence piece (pieces as rows, as :func:`split_rows` cuts
    them), the piece-local index of its last chunk in which a document starts, or ``-1``.

    ``conn``: fp32 ``[B, Tp]`` of :func:`doc_vectors` (formed on whole rows). A chunk ``c``
    holds a document start where ``keep_c = conn`` of its last token is 0 (the state entering
    it does not reach its exit, the state passes' ``s_decay`` factor; a start on the chunk's
    first token counts). For piece ``p`` with cut ``c >= 0`` the state map ``M_p`` is zero and
    the exit state from zero depends only on chunks ``c ..`` (MOSAIC_GPU.md Sec. 52).
    ``first``: the piece's first such chunk instead (or ``-1``); the reverse pass from a zero
    exit gradient reaches the piece's entry only through chunks ``.. c``."""
    rows, padded = conn.shape
    keep = conn.reshape(rows * pieces, padded // (pieces * CHUNK), CHUNK)[:, :, -1]
    idx = lax.broadcasted_iota(jnp.int32, keep.shape, 1)
    if first:
        big = keep.shape[1]
        f = jnp.min(jnp.where(keep == 0, idx, big), axis=1)
        return jnp.where(f == big, -1, f).astype(jnp.int32)
    return jnp.max(jnp.where(keep == 0, idx, -1), axis=1).astype(jnp.int32)


def scan_piece_maps(maps, local, start, *, reverse: bool):
    """Entry states (or, ``reverse``, exit gradients) of the pieces, ``[B, P, H, K, V]`` fp32.

    Forward: piece ``p`` maps ``S -> maps[p] S + local[p]`` (``maps`` ``[B, P, H, K, K]``,
    ``local`` ``[B, P, H, K, V]`` its pass from zero), so the entries are ``e_0 = start``
    (``[B, H, K, V]``; ``None``: zeros) and ``e_{p+1} = maps[p] e_p + local[p]``. Reverse (the
    backward's state gradients): the reverse pass maps an exit gradient
    ``d -> maps[p]^T d + local[p]`` (``local`` its pass from a zero exit gradient), so the
    exits are ``x_{P-1} = start`` and ``x_{p-1} = maps[p]^T x_p + local[p]``. fp32 products at
    ``HIGHEST`` precision; ``P <= MAX_PIECES`` unrolled steps. Used by the delta state passes
    (:mod:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu`) and the per-channel ones
    (:mod:`pallas_kernels.common.channelwise_mosaic_gpu`).
    """
    num = local.shape[1]
    x = jnp.zeros_like(local[:, 0]) if start is None else start.astype(jnp.float32)
    out = [None] * num
    order = range(num - 1, -1, -1) if reverse else range(num)
    eq = "bhji,bhjv->bhiv" if reverse else "bhij,bhjv->bhiv"
    for p in order:
        out[p] = x
        x = jnp.einsum(eq, maps[:, p], x, precision=lax.Precision.HIGHEST) + local[:, p]
    return jnp.stack(out, axis=1)


def check_states_dtype(states_dtype, input_dtype):
    """``states_dtype`` as a ``jnp.dtype``: fp32 or ``input_dtype``.

    Raises:
        ValueError: naming ``states_dtype`` when it is neither.
    """
    states_dtype = jnp.dtype(states_dtype)
    if states_dtype not in (jnp.dtype(jnp.float32), jnp.dtype(input_dtype)):
        raise ValueError(f"states_dtype must be float32 or the input dtype {input_dtype}, got "
                         f"{states_dtype}")
    return states_dtype


def unsupported_reason(k: jax.Array, v: jax.Array, names=("k", "v")) -> Optional[str]:
    """Why :func:`chunk_states_mosaic` cannot take these inputs, or ``None`` when it can.

    ``names`` are the argument names used in the message (``("q", "do")`` for
    :func:`chunk_dstates_mosaic`, where ``q`` takes the place of ``k`` and ``do`` of ``v``).
    """
    a, b = names
    if k.shape[-1] not in SUPPORTED_HEAD_DIMS or v.shape[-1] not in SUPPORTED_HEAD_DIMS:
        return (f"head dims must be in {SUPPORTED_HEAD_DIMS}, got {a}.shape={k.shape} "
                f"{b}.shape={v.shape}")
    if k.dtype not in SUPPORTED_DTYPES or v.dtype != k.dtype:
        return (f"{a} and {b} must share a 16-bit dtype (wgmma operands), got "
                f"{a}.dtype={k.dtype} {b}.dtype={v.dtype}")
    return None


def check_kv_gates(k, v, g, segment_ids, names=("k", "v")) -> None:
    """The checks the kernels share: ``k [B, T, Hk, K]``, ``v [B, T, H, V]`` with
    ``H % Hk == 0``, a supported dtype and head dims, ``g [B, T, H]``, ``segment_ids [B, T]``.
    ``names`` name ``k`` and ``v`` in the messages.

    Raises:
        ValueError: naming the argument and the shape it needs.
    """
    batch, seq_len, kv_heads, _ = k.shape
    heads = v.shape[2]
    a, b = names
    if v.shape[:2] != (batch, seq_len) or heads % kv_heads:
        raise ValueError(f"need {a} [B, T, Hk, K], {b} [B, T, H, V] with H % Hk == 0: "
                         f"{a}.shape={k.shape} {b}.shape={v.shape}")
    reason = unsupported_reason(k, v, names)
    if reason is not None:
        raise ValueError(reason)
    if g is not None and g.shape != (batch, seq_len, heads):
        raise ValueError(f"g must be [B, T, H] = {(batch, seq_len, heads)}, got {g.shape=}")
    if segment_ids is not None and segment_ids.shape != (batch, seq_len):
        raise ValueError(f"segment_ids must be [B, T] = {(batch, seq_len)}, got "
                         f"{segment_ids.shape=}")
