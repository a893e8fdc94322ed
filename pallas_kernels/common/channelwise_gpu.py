"""Chunked Pallas GPU kernels (Triton lowering) for the per-channel-decay delta rule: KDA, GDN-2.

One generic recurrence serves Kimi Delta Attention (paper arXiv 2607.07953, Eqs. 18-20, spec
§2.4: ``kr = beta k``, ``vw = beta v``) and Gated DeltaNet-2 (Eqs. 21-24, spec §2.6:
``kr = b * k``, ``vw = w * v``). With a per-key-channel log-decay g_t in R^K (``<= 0``)::

    S~_t = Diag(exp g_t) S_{t-1},  u_t = vw_t - S~_t^T kr_t,  S_t = S~_t + k_t u_t^T,
    o_t  = scale S_t^T q_t.

The ops enter these kernels through ``kda/kernel_gpu.py`` (``kda_pallas``) and
``gdn2/kernel_gpu.py`` (``gdn2_pallas``); their ``api.py`` dispatch through
:func:`choose_implementation` (gated on :data:`AUTO_SELECT`).

Forward and backward are a ``jax.custom_vjp`` over ``(q, k, v, ks, vs, g, h0)`` with
``kr = k ks`` and ``vw = v vs`` (the scales: beta for KDA, b and w for GDN-2). The forward
kernels form those products themselves (:func:`_scaled`: fp32, rounded once to the operand
dtype), so no separate pass over k and v runs before them; the backward forms ``kr`` in XLA for
its kernels (K2, ``grad_pass="mosaic_fused"``, forms it itself from k and ks) and applies the
products' chain rule to dkr and dvw (dk, dv and the scales' gradients). (Until 2026-11-30 XLA
formed ``kr`` and ``vw`` before the kernels: 125 us of the KDA forward at S1, H200; the fold
took the KDA / GDN-2 forward from 2.162 / 2.279 to 2.008 / 2.205 ms,
``kernels-h200-2026-11-30.md``, tenth run.) Inside, the
``gamma`` kernel forms gamma, the within-chunk cumsum of g, and the backward
returns dg (``backward_chunk`` takes the within-chunk reverse cumsum of d gamma). g arrives
unfloored: the gamma kernel raises it to ``LOG_DECAY_FLOOR`` on the way in and dg is taken
through that floor by ``validation.floor_log_decay_grad`` (K2 applies it in its epilogue): the
values and gradients of ``validation.floor_log_decay``, which the ops' other implementations
apply in XLA (MOSAIC_GPU.md Sec. 47.4).

Chunk form (C = 64 tokens per chunk, entry state S_0 in R^{K x V}, gamma [C, K] the fp32
within-chunk cumsum of g; the algebra of :func:`pallas_kernels.common.channelwise_chunked.
channelwise_delta_chunked`)::

    Mk_ij = sum_c kr_ic k_jc exp(gamma_ic - gamma_jc)    (j < i, same document)
    Mq_ij = sum_c q_ic  k_jc exp(gamma_ic - gamma_jc)    (j <= i, same document)
    A     = (I + Mk)^{-1};  W = A (kr * E_in);  U = A vw;  Vn = U - W S_0   ("v_new" = u)
    O     = scale [(q * E_in) S_0 + Mq Vn]
    S_C   = Diag(e_all) S_0 + (k * E_out)^T Vn

with ``E_in = exp(gamma) conn``, ``E_out = exp(gamma_C - gamma) last`` ([C, K]) and
``e_all = exp(gamma_C) conn_C`` ([K]); conn/last are the document masks of
:func:`pallas_kernels.common.pallas_gpu.docs_from_segment_ids` (tokens of a new document do
not see S_0; tokens of an earlier document do not reach S_C).

Intra-chunk products, exactly and without overflow. Rows are split into four 16-row blocks.
For i in a later block I than j's block J, with a reference r between them (g <= 0 makes gamma
non-increasing, so gamma_i <= r <= gamma_j for r = gamma at the first row of I, as ``prepare``
takes it, or at the last row of J, as ``grad_blocks`` does)::

    exp(gamma_ic - gamma_jc) = exp(gamma_ic - r_c) exp(r_c - gamma_jc)    (both factors <= 1)

so each off-diagonal 16 x 16 block pair is one product
``(X_I e^{gamma_I - r}) (Y_J e^{r - gamma_J})^T`` with no masks. The four 16 x 16 diagonal
blocks (``j <= i`` in one block) take the elementwise form
``sum_c X_ic Y_jc exp(gamma_ic - gamma_jc)``, whose exponents are ``<= 0``. In the forward the
``intra`` kernel forms them one row at a time (:func:`_intra_tokens_kernel`: one program per
token and group of heads, a loop over the row's ``i mod 16 + 1`` columns, as FLA's
token-parallel KDA intra kernel). That chain of small dependent steps runs in tiny programs,
many resident per SM, rather than inside the big per-chunk programs (which hold ~255 registers
per thread, so only one or two fit per SM and nothing hides its latency; H200, 2026-11-29: KDA
forward 7.2 -> 4.3 ms and forward+backward 26.9 -> 24.1 ms at S1 when the diagonal blocks left
them, then in per-block programs). In the backward ``grad_blocks`` takes each diagonal block
in four 4-row quads (:func:`_intra_grad_levels`): pairs in different quads by the
factorisation above with the quad's last row as reference, pairs in one quad elementwise.
``prepare`` holds the chunk's 16 x 16 sub-blocks as separate register tiles, as FLA's fused
inter + solve KDA kernel does (Triton cannot slice registers): the six off-diagonal block pairs
of Mk and Mq by ``[16, BK] x [BK, 16]`` products with the reference at the first row of the row
block (both exponents <= 0, no masks), ``intra``'s diagonal tiles loaded directly, the diagonal
blocks of A by row-wise forward substitution in fp32 and the rest by block forward substitution
(16 ``[16, 16]`` products); ~0.5M multiply-adds per chunk and head at K = 128. ``wu`` then
forms W and U from A on whole ``[C, BK]`` tiles, reading ``krg = kr E_in`` that ``intra`` wrote
(with qg and kg: each token's decay-scaled rows, formed where q, k and kr are loaded anyway;
until 2026-11-30, 11:15 UTC, ``wu`` formed them from q, k and fp32 gamma: 0.381 ms against
0.182 now, ``intra`` 0.441 -> 0.504, KDA forward 1.932 -> 1.742 ms at S1). (Until 2026-11-30,
09:30 UTC, one kernel did both on whole ``[C, C]`` fp32 tiles: masked ``[C, BK] x [BK, C]``
products, 8x the useful FLOPs, ~5.9M multiply-adds, 255 registers with spills at 8 warps; 1.86
ms at S1 against 0.53 + 0.40 ms for ``prepare`` + ``wu`` then and 0.46 + 0.18 now, H200,
``history/channelwise-forms-h200-2026-11-30b.md``, ``kernels-h200-2026-11-30.md``.)

Kernels (grid in brackets):

* ``gamma`` [chunks, B*H]: the within-chunk cumsum of g (fp32 ``[B, Tp, H, K]``).
* ``intra`` [B*T, H/nh]: the diagonal 16 x 16 blocks of Mk and Mq (fp32 ``[B, H, N, C, 16]``,
  row i holding its block's columns j <= i mod 16; the columns after it are not written and
  hold whatever the buffer held, NaN in interpret mode: ``prepare`` masks them), and the
  token's rows of ``qg = q E_in``, ``kg = k E_out`` and ``krg = kr E_in`` (operand dtype,
  ``[B, Tp, H, K]``), one program per token and group of nh heads (:func:`intra_heads`).
* ``prepare`` [chunks, B*H] (:func:`_prepare_kernel`): Mk and Mq from 16 x 16 sub-blocks (the
  off-diagonal ones by products over key blocks of ``BK`` channels, ``intra``'s diagonal ones
  loaded), A by forward substitution; A and Mq out (``[B, H, N, C, C]`` in the tensor-core
  operand dtype, to which every consumer rounds them).
* ``wu`` [chunks, B*H] (:func:`_wu_kernel`): ``W = A krg`` (krg from ``intra``), ``U = A vw``
  (operand dtype) and e_all (fp32 ``[B, H, N, K]``).
* ``forward`` [B*H, V/BV]: the sequential pass with the fp32 state ``[K, BV]`` in registers;
  writes O, the final state, and (for the backward) Vn and every chunk's entry state S_0.
  ``state_pass="mosaic"`` (``TUNING["state_pass"]``; the default since 2026-12-07c, when its
  9 ``gpu`` tests passed on an H100 and both passes were faster than Triton's at S1 and S2,
  ``MOSAIC_GPU.md`` Secs. 37.1, 46) runs it instead as the Hopper Mosaic GPU kernel of
  :mod:`pallas_kernels.common.channelwise_mosaic_gpu` (three warpgroups, wgmma/TMA; same
  outputs, layouts and roundings; bf16/fp16 operands only, fp32 keeps this kernel;
  ``MOSAIC_GPU.md`` Sec. 18). Whether a Mosaic value of ``state_pass`` or ``grad_pass``
  runs is decided where ``implementation=`` picks Mosaic GPU for the other ops,
  :func:`pallas_kernels.common.mosaic_gpu.resolve_pass`: sm_90 (Hopper, 9.x) (or interpret mode)
  and 16-bit operands; elsewhere (an A100) ``TUNING``'s value falls back to these Triton
  kernels with the reason logged once, and a per-call value raises.
* ``backward_state`` [B*H, V/BV]: the reverse pass; with dS the gradient of the chunk's exit
  state (stored per chunk as dS_C)::

      dVn = scale Mq^T dO + kg dS_C (+ the cotangent of the returned residual)
      dS_0 = Diag(e_all) dS_C + scale qg^T dO - W^T dVn

  ``state_pass="mosaic"`` runs it as
  :func:`pallas_kernels.common.channelwise_mosaic_gpu.channelwise_backward_state_mosaic`
  (the same switch as the forward: one setting for both state passes, as both are drop-ins
  with the Triton kernels' outputs and roundings; MOSAIC_GPU.md Sec. 18.1). Rows with few
  CTAs run both Mosaic passes as sequence pieces (``TUNING["mosaic_pieces"]``, ``None``:
  automatic; MOSAIC_GPU.md Sec. 30); the forward's piece maps are a residual of the
  ``custom_vjp``, so the reverse pass does not form them again.

* ``grad_blocks`` [chunks, B*H, 4] (:func:`_grad_blocks_kernel`): the share of dq, dkr and dk
  (fp32 ``[B, T, H, K]``) that flows through Mq and Mk, for the rows of one 16-row block, from
  ``dR = A^T dVn`` (XLA, :func:`_chunk_dr`; also ``dvw``)::

      dMq = scale mask_incl(dO Vn^T);  dMk = -mask_strict(dR Vn^T)
      dX_ic = sum_j dM_ij Y_jc e_ijc,  dY_jc = sum_(M, i) dM_ij X_ic e_ijc

  (X = q for Mq, kr for Mk, Y = k, ``e_ijc = exp(gamma_ic - gamma_jc)``), each ``[16, 16]``
  block of dM formed from V-contractions of the rows involved; the off-diagonal blocks by the
  factorisation above, the diagonal one by the quad levels. ``grad_pass="mosaic"``
  (not the default: ``"mosaic_fused"``, below, replaces it; right on an H100 since the fixes
  of ``MOSAIC_GPU.md`` Sec. 43, wrong before, Sec. 41) runs it instead as K1,
  :func:`pallas_kernels.common.channelwise_grad_mosaic_gpu.channelwise_grad_intra_mosaic`
  (two warpgroups, wgmma/TMA; the same partials, with the pairs at least 8 tokens apart in
  the operand dtype instead of TF32; bf16/fp16 only; ``MOSAIC_GPU.md`` Sec. 20).
* ``backward_chunk`` [chunks, B*H, K/BK]: the parameter gradients of one chunk and key block
  from S_0, dS_C, dO, Vn and dR::

      dqg = scale dO S_0^T;  dkg = Vn dS_C^T;  de_all = rowsum(S_0 * dS_C)
      d(kr E_in) = -dR S_0^T

  plus ``grad_blocks``' partials and the elementwise factors (E_in, E_out, e_all) by
  ``d exp(x) = exp(x) dx``; ``d gamma_ic`` collects ``X_ic dX_ic - Y_ic dY_ic`` of the
  products and the factors' shares, and dg is its within-chunk reverse cumsum.
  ``grad_pass="mosaic_fused"`` runs ``grad_blocks``, ``backward_chunk`` and the chain rule
  through ``kr = k ks`` (:func:`_kr_chain`) as one Mosaic GPU kernel, K2
  (:func:`pallas_kernels.common.channelwise_grad_mosaic_gpu.channelwise_grad_chunk_mosaic`:
  K1 plus this kernel's equations and the chain rule in an epilogue, so K1's fp32 partials
  never reach HBM and dkr is never written, and ``kr`` is formed in the kernel, not read;
  the same dq, dk, dks, dg in the same dtypes and
  layouts, the roundings of this path kept; dg's reverse cumsum on the tensor cores on three
  exact bf16 pieces; bf16/fp16 only; ``MOSAIC_GPU.md`` Sec. 21). The default
  (``TUNING["grad_pass"]``) since 2026-12-07c: its ``gpu`` tests pass on an H100 after the
  fixes of Sec. 43 (it was wrong there on 2026-12-06f, Sec. 41), and KDA's S1 forward and
  backward took 8.145 ms with it against 8.799 with the Triton kernels, same run (Sec. 46).
  K2 reads ``dR`` in ``[B, H, T, V]``, the layout XLA's per-chunk product comes out in, and
  writes it back as ``dvw`` ``[B, T, H, V]`` from SMEM (Sec. 47.2): XLA's transpose of the
  product, fused with the value-scale chain, took 0.75 ms of KDA's S1 backward.

Numerics: states, decays, the inverse and every accumulation are fp32. The state-pass products
take input-dtype operands (bf16 inputs: bf16 tensor cores, fp32 accumulate, as FLA); the
decay-scaled intra-chunk products run in TF32 for half-precision inputs (``TUNING
["intra_tf32"]``) and in IEEE fp32 for fp32 inputs, so fp32 inputs match the fp32 reference to
rounding. Requires ``g <= 0`` (a decay), as every form of these ops documents.

All kernels also run under ``interpret=True`` (Pallas interpret mode) on any backend; the test
suite checks them that way on CPU. Status: verified in interpret mode (fp32 to rounding; bf16
within the GPU gates) and on the H200 (2026-11-30, session 24, the kernels of commit 771c2ac
less its launch change: ``pytest -m gpu tests/pallas_kernels/kernel_gpu_channelwise_test.py``,
8 passed: KDA and GDN-2, bf16 against the fp32 reference, packed and not, head dims 64 and 128;
with the final launches the benchmark's correctness gate, ``benchmarks/results/
kernels-h200-2026-11-30.md``, twelfth to fourteenth runs), so ``"auto"`` picks them on a GPU
(:data:`AUTO_SELECT`). In the 350M KDA hybrid they train 6.4x
faster than the chunked JAX form
(``benchmarks/results/history/train-throughput-h200-2026-11-29.md``).
"""

import functools
import numbers
from typing import Optional, Tuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels.common import mosaic_gpu, pallas_gpu, validation
from pallas_kernels.common.pallas_gpu import mm, mm_nt, mm_tn

F32 = jnp.float32
# One-line switch: whether implementation=None/"auto" of KDA and GDN-2 picks these kernels on a
# GPU (as gated_delta_rule does). On since the kernels passed their GPU tests on the H200; an
# explicit implementation="pallas" runs them regardless, "chunked" never.
AUTO_SELECT = True
# Triton launch parameters per kernel: (num_warps, num_stages); the value-block width of the
# sequential kernels and the key-block width of gamma/wu/backward_chunk (None: min(dim, 64)),
# prepare_k the key-block width of prepare's products (None: block_k);
# intra_tf32: decay-scaled intra-chunk products of half-precision inputs in TF32 (else in the
# input dtype); intra_token_heads: the cap (>= 1) on heads per program of the intra kernel
# (intra_heads), intra_token its launch. A launch may also be a dict {key head dim: pair}
# (launch_for). Swept on the H200 at S1 with benchmarks/tune_kernels.py --op=kda and
# benchmarks/channelwise_forms.py (benchmarks/results/history/tune-kda-h200-2026-11-29.md,
# -11-30.md, history/channelwise-forms-h200-2026-11-30b.md, -30c.md): block_k 64 (32: -0.4%); intra
# 2 heads per program at 1 warp, 3 stages (0.521 ms with its qg/kg/krg rows, -30c; 4 heads 1 warp
# 0.567, 4 heads 4 warps 0.649, FLA's choice); prepare 1 warp, 3 stages, prepare_k 16 (the key-block
# loop outermost, -30c: 1.169 ms with intra and wu; 2 stages 1.228, 1 stage 1.356, 2 warps
# 1.674 or worse; prepare_k 32 is untimed in this form, where it spills per kernel_registers.py; in
# the earlier row-block form, -30b: 1.465, prepare_k 32 1.578 with the columns as a loop, 3.06
# unrolled; FLA's fused inter + solve kernel: 1 warp, 3 stages, BK 32); wu 4 warps, 3 stages
# (-30c, now only W and U: 4x2 .. 8x3 within 1.5%); grad_blocks 4 warps 2 stages and
# backward_chunk 4 warps 3 stages (KDA fwd+bwd 10.11 -> 9.56 ms wall,
# history/tune-kda-backward-launches-h200-2026-11-30.md); forward 4 warps 3 stages and gamma 8 warps
# 2 stages (KDA fwd 2.106 -> 1.981 ms wall in the sweep's confirmation, fwd+bwd flat,
# history/tune-kda-forward-launches-h200-2026-11-30.md); backward_state unswept since the intra
# split.
# History (H200, S1, 2026-11-30): the backward's diagonal blocks as quad levels instead of a 16-step
# column loop, KDA fwd+bwd 24.2 -> 13.5 ms wall (history/tune-kda-h200-2026-11-30.md); then 13.43 ->
# 10.25 ms from the gamma kernel + grad_blocks + 4-warp launches
# (history/tune-kda-options-h200-2026-11-30.md); KDA forward 3.22 -> 2.16 ms (summed kernel time)
# from prepare on 16 x 16 sub-blocks plus the separate wu kernel (2.51 -> 1.47 ms with intra) and
# intra storing each column as summed (0.63 -> 0.53 ms); then (session 24, kernel time) 2.16 -> 1.64
# ms from the kr/vw fold, exp2, intra writing qg/kg/krg, prepare over key blocks and the
# forward/gamma launches (kernels-h200-2026-11-30.md, ninth to twelfth runs). Losing forms deleted:
# XLA's cumsum of g outside the custom_vjp (gamma kernel: 13.425 -> 12.875 ms); the intra_grad
# kernel plus backward_chunk's off-diagonal loop (grad_blocks: 12.875 -> 12.210, 10.33 at 4 warps);
# the forward intra as a per-block column loop (1.056 ms) or quad levels (1.312), against 0.627
# token-parallel (4 heads, 4 warps); a products kernel for prepare's off-diagonal blocks; prepare on
# whole [C, C] tiles (2.507 ms with intra), the sub-block form with W and U in the same kernel
# (1.875), the gamma-kernel removal with a direct [C, C] diagonal layout (prepare 1.86 -> 3.42);
# prepare with row blocks outermost (1.201 ms with intra and wu against 1.169,
# history/channelwise-forms-h200-2026-11-30c.md).
TUNING = {
    "prepare": (1, 3),
    "prepare_k": 16,
    "wu": (4, 3),
    "forward": (4, 3),
    "backward_state": (4, 2),
    "backward_chunk": (4, 3),
    "block_v": None,
    "block_k": None,
    "intra_tf32": True,
    "intra_token_heads": 2,
    "intra_token": (1, 3),
    "grad_blocks": (4, 2),
    "gamma": (8, 2),
    # The state passes (the "forward" and "backward_state" kernels): "triton"
    # (_forward_kernel, _backward_state_kernel) or "mosaic" (channelwise_mosaic_gpu's
    # channelwise_forward_mosaic and channelwise_backward_state_mosaic: Hopper wgmma/TMA, three
    # warpgroups each; bf16/fp16 operands on sm_90 (9.x) only, so fp32 inputs and older GPUs keep
    # the Triton kernels: mosaic_gpu.resolve_pass decides and logs why). "mosaic" since
    # 2026-12-07c (MOSAIC_GPU.md Sec. 46: its gpu tests pass on an H100, both passes faster than
    # Triton's at S1 and S2, Sec. 37.1); channelwise_delta_pallas's state_pass= overrides it per
    # call. mosaic_alias_staging: the
    # Mosaic kernels' alias_staging (their fp32 state staging tile shares SMEM with the
    # published 16-bit state). mosaic_pieces: the Mosaic state passes' sequence pieces per row
    # (their pieces=; None: mosaic_gpu_lib.num_pieces' choice, P > 1 only where B * H * V / 64
    # CTAs leave the GPU idle, e.g. P = 4 at B 1, H 16, V 128, T 32K; an int must divide every
    # call's chunk count; MOSAIC_GPU.md Sec. 30).
    "state_pass": "mosaic",
    "mosaic_alias_staging": False,
    "mosaic_pieces": None,
    # The gradients through Mq and Mk (the "grad_blocks" kernel): "triton" (_grad_blocks_kernel)
    # or "mosaic" (channelwise_grad_mosaic_gpu's channelwise_grad_intra_mosaic, K1: Hopper
    # wgmma/TMA, two warpgroups; bf16/fp16 operands on sm_90 (9.x) only, so fp32 inputs and older
    # GPUs keep the Triton kernel, as for state_pass). K1 and K2 compiled on an H100 gave wrong
    # gradients on 2026-12-06f (MOSAIC_GPU.md Secs. 37.6, 41) and pass their gpu tests since
    # the fixes of Sec. 43; "mosaic_fused" is the default since 2026-12-07c (Sec. 46: 7.4 %
    # faster than Triton's passes at KDA's S1, same run); channelwise_delta_pallas's grad_pass=
    # overrides it per call. "mosaic_fused": K2,
    # channelwise_grad_chunk_mosaic, replaces grad_blocks, backward_chunk and the kr chain rule
    # (_kr_chain) with one kernel (MOSAIC_GPU.md Sec. 21; a value of this key rather than a
    # second key because it replaces the grad_blocks kernel too: the three values are
    # exclusive). mosaic_grad_slab: K1's and K2's key channels per phase-2 step, 16 (two steps
    # per warpgroup) or 32 (one). 16 is the one ptxas compiles without register spills for
    # both (offline ptxas, MOSAIC_GPU.md Sec. 23/24; at 32 K2 spills about 280 B on jax
    # 0.11.2); 32 issues half as many wgmma of twice the width, and on an H100 (2026-12-07c,
    # profile_grad.py --slabs=16,32, KDA S1) it is faster despite the spills: K2 3.685 against
    # 4.087 ms, K1 2.867 against 3.040, gates green, and the gpu tests' slab-16-against-32
    # checks pass (MOSAIC_GPU.md Sec. 37.5's rule, Sec. 46): 32 since then.
    "grad_pass": "mosaic_fused",
    "mosaic_grad_slab": 32,
    # The chunk-local forward (gamma, intra, prepare, wu): "triton" (_gamma + _prepare, four
    # launches) or "mosaic" (channelwise_local_mosaic_gpu.channelwise_local_mosaic: one Mosaic
    # GPU kernel per chunk, the same outputs, layouts and dtypes; MOSAIC_GPU.md Sec. 62).
    # Resolved as state_pass (16-bit operands, sm_90 or interpret mode, else Triton, logged
    # once); per-channel scales (GDN-2's write gate) keep Triton too, logged once. Off
    # ("triton") until its GPU rule (Sec. 62) is run; no per-call argument.
    "chunk_local": "triton",
}
STATE_PASSES = ("triton", "mosaic")
CHUNK_LOCALS = ("triton", "mosaic")
GRAD_PASSES = ("triton", "mosaic", "mosaic_fused")
# TUNING["mosaic_grad_slab"]'s values: K1's phase-2 slab widths
# (channelwise_grad_mosaic_gpu.SLABS, not imported here: it loads the Mosaic GPU lowering).
GRAD_SLABS = (32, 16)
CHUNK = pallas_gpu.KERNEL_CHUNK_SIZE  # C = 64
SUB = pallas_gpu.INVERSE_BLOCK  # 16-row diagonal blocks
NSUB = CHUNK // SUB
QUAD = 4  # rows per quad of a diagonal block (_intra_grad_levels)

_iota = pallas_gpu.iota
_exp = pallas_gpu.exp
_last = pallas_gpu.last_element
_program_bh = pallas_gpu.program_batch_head
_doc_inputs = pallas_gpu.doc_inputs
_load_docs = pallas_gpu.load_docs


def launch_for(kernel: str, dk: int, tuning=None) -> Tuple[int, int]:
    """``(num_warps, num_stages)`` of ``kernel`` (a :data:`TUNING` key) at key head dim ``dk``;
    an entry is a pair or a dict from head dim to pair (:func:`pallas_gpu.resolve_launch`).

    Raises:
      ValueError: for a dict entry without ``dk``, or an entry that is not a pair.
    """
    return pallas_gpu.resolve_launch((TUNING if tuning is None else tuning)[kernel], dk)


def block_widths(dk: int, dv: int, tuning=None) -> Tuple[int, int]:
    """``(block_v, block_k)`` the kernels run with: ``tuning``'s (default :data:`TUNING`)
    widths, ``None`` resolved to ``min(dim, 64)``."""
    tuning = TUNING if tuning is None else tuning
    return tuning.get("block_v") or min(dv, 64), tuning.get("block_k") or min(dk, 64)


def _config(*, batch, heads, n_chunks, dk, dv, scale, has_docs, mm_dtype, interpret,
            return_residual, state_pass=None, grad_pass=None):
    """The static configuration of one call (hashable once sorted into a tuple).

    ``state_pass`` and ``grad_pass`` (``None``: ``TUNING["state_pass"]``,
    ``TUNING["grad_pass"]``) go through :func:`pallas_kernels.common.mosaic_gpu.resolve_pass`:
    a Mosaic value runs the Mosaic GPU kernels in interpret mode or on a GPU of compute
    capability 9.0 or newer, with 16-bit operands. Otherwise it resolves to ``"triton"``
    (logged once): for fp32 operands (``wgmma`` has no IEEE fp32 product), and for a
    ``TUNING`` value on an older GPU (A100) or without a GPU; a per-call value there raises.

    Raises:
      UnsupportedImplementationError: (a ``ValueError``) a per-call Mosaic ``state_pass`` or
        ``grad_pass`` with 16-bit operands, outside interpret mode, without a CUDA GPU of
        compute capability 9.x (Hopper) (naming the option and the capability).
      ValueError: if ``TUNING``'s block widths (``prepare_k`` included) do not divide the head
        dims, ``TUNING["intra_token_heads"]`` is not >= 1, ``state_pass`` is not one of
        :data:`STATE_PASSES`, ``grad_pass`` not one of :data:`GRAD_PASSES`, or
        ``TUNING["mosaic_grad_slab"]`` not one of :data:`GRAD_SLABS`
        (:func:`grad_slab`; checked whichever kernel runs), or ``TUNING["mosaic_pieces"]``
        not ``None`` or a positive int (whether it divides the chunk count is checked by the
        Mosaic state passes, naming ``pieces``), or ``TUNING["chunk_local"]`` not one of
        :data:`CHUNK_LOCALS` (resolved like ``state_pass``: a Mosaic value takes Triton for
        fp32 operands or without a Hopper GPU, logged).
    """
    passes = {}
    for option, value, values in (("state_pass", state_pass, STATE_PASSES),
                                  ("grad_pass", grad_pass, GRAD_PASSES)):
        explicit = value is not None
        value = value if explicit else TUNING.get(option, "triton")
        if value not in values:
            raise ValueError(f"{option} must be one of {values}, got {value!r}")
        # The one place that decides whether Mosaic GPU kernels run (issue 29): Hopper-or-newer
        # or interpret mode, 16-bit operands; else Triton, logged (or raised, for an explicit
        # value this machine cannot run).
        passes[option] = mosaic_gpu.resolve_pass(
            "channelwise_delta_pallas", option, value, explicit=explicit, dtype=mm_dtype,
            interpret=interpret)
    state_pass, grad_pass = passes["state_pass"], passes["grad_pass"]
    chunk_local = TUNING.get("chunk_local", "triton")
    if chunk_local not in CHUNK_LOCALS:
        raise ValueError(f"TUNING['chunk_local'] must be one of {CHUNK_LOCALS}, got "
                         f"{chunk_local!r}")
    chunk_local = mosaic_gpu.resolve_pass("channelwise_delta_pallas", "chunk_local",
                                          chunk_local, explicit=False, dtype=mm_dtype,
                                          interpret=interpret)
    block_v, block_k = block_widths(dk, dv)
    pallas_gpu.check_block_widths(block_v, block_k, dk, dv)
    prepare_k = TUNING.get("prepare_k") or block_k
    pieces = TUNING.get("mosaic_pieces")
    if pieces is not None and (isinstance(pieces, bool) or not isinstance(pieces, int)
                               or pieces < 1):
        raise ValueError(f"TUNING['mosaic_pieces'] must be None or a positive int, got "
                         f"{pieces!r}")
    if prepare_k < SUB or prepare_k > dk or dk % prepare_k:
        raise ValueError(f'TUNING["prepare_k"]={prepare_k} must divide the key head dim {dk} '
                         f"(and be >= {SUB})")
    return dict(batch=batch, heads=heads, n_chunks=n_chunks, dk=dk, dv=dv, scale=scale,
                block_v=block_v, block_k=block_k, prepare_k=prepare_k,
                has_docs=has_docs, mm_dtype=jnp.dtype(mm_dtype), interpret=interpret,
                return_residual=return_residual, intra_tf32=bool(TUNING["intra_tf32"]),
                intra_heads=intra_heads(heads), state_pass=state_pass, grad_pass=grad_pass,
                mosaic_alias_staging=bool(TUNING.get("mosaic_alias_staging", False)),
                mosaic_pieces=pieces, mosaic_grad_slab=grad_slab(TUNING),
                chunk_local=chunk_local)


def grad_slab(tuning) -> int:
    """``tuning["mosaic_grad_slab"]`` (16 when absent): K1's and K2's key channels per phase-2
    step.

    Args:
      tuning: a :data:`TUNING`-like mapping.

    Returns:
      The slab width, an ``int`` of :data:`GRAD_SLABS`.

    Raises:
      ValueError: the value is not an integer of :data:`GRAD_SLABS` (a ``bool``, a ``float``
        or a string such as ``"32"`` is refused), naming ``TUNING['mosaic_grad_slab']``.
    """
    slab = tuning.get("mosaic_grad_slab", 16)
    # An integer (numpy's too), not a bool, a float or a string.
    if (isinstance(slab, bool) or not isinstance(slab, numbers.Integral)
            or slab not in GRAD_SLABS):
        raise ValueError(f"TUNING['mosaic_grad_slab'] must be one of {GRAD_SLABS} (K1's and "
                         f"K2's key channels per phase-2 step; 16 does not spill registers), "
                         f"got {slab!r}")
    return int(slab)


def _pallas(kernel, cfg, *, tune, **kwargs):
    """:func:`pallas_gpu.named_pallas_call` with the launch of :data:`TUNING` entry ``tune``."""
    return pallas_gpu.named_pallas_call(kernel, cfg, launch=launch_for(tune, cfg["dk"]),
                                        **kwargs)


# ----------------------------------------------------------------------------------------------
# In-kernel helpers (operate on loaded values).


def _intra_dot(a, b, dims, cfg):
    """fp32 product of decay-scaled operands: IEEE (fp32 inputs), TF32 or input dtype (half)."""
    mdt = cfg["mm_dtype"]
    if mdt == jnp.dtype(F32) or cfg["intra_tf32"]:
        precision = (jax.lax.Precision.HIGHEST if mdt == jnp.dtype(F32)
                     else jax.lax.Precision.DEFAULT)
        a, b = a.astype(F32), b.astype(F32)
    else:
        precision = None
        a, b = a.astype(mdt), b.astype(mdt)
    return jax.lax.dot_general(a, b, (dims, ((), ())), precision=precision,
                               preferred_element_type=F32)


def _block_factors(gam, ref_row, block, size=SUB):
    """Off-diagonal factors for column block ``block`` (rows ``size * block ..``, ``size`` rows)
    with reference ``ref_row`` [BK], over the rows of ``gam`` (a ``[SUB, BK]`` diagonal block
    cut into quads of ``size`` rows, :func:`_intra_grad_levels`).

    Returns ``(row_fac, col_fac)`` shaped as ``gam``: ``exp(gam - r)`` on rows of later blocks
    and ``exp(r - gam)`` on the rows of the block, zero elsewhere (exponents masked before exp).
    """
    rows = _iota((gam.shape[0], 1), 0)
    later = rows >= size * (block + 1)
    inside = (rows >= size * block) & (rows < size * (block + 1))
    row_fac = jnp.where(later, _exp(jnp.where(later, gam - ref_row[None, :], 0.0)), 0.0)
    col_fac = jnp.where(inside, _exp(jnp.where(inside, ref_row[None, :] - gam, 0.0)), 0.0)
    return row_fac, col_fac


def _decay_factors(gam, g_last, conn, last, conn_last):
    """``(E_in [C, BK], E_out [C, BK], e_all [BK])`` with the document masks applied."""
    e_in = _exp(gam)
    e_out = _exp(g_last[None, :] - gam)
    e_all = _exp(g_last)
    if conn is not None:
        e_in = e_in * conn[:, None]
        e_out = e_out * last[:, None]
        e_all = e_all * conn_last
    return e_in, e_out, e_all


def _column_block_factors(k_ref, gam_ref, g_rows, b, h, t0, j):
    """Factors of the off-diagonal block (rows of a later 16-row block, column block j) for
    rows with gamma ``g_rows`` (``[SUB, K]``): ``(e^{g_rows - r_j}, k_j * e^{r_j - gamma_j})``,
    both ``[SUB, K]`` fp32, r_j = gamma at the last row of block j, so both exponents are
    <= 0 within a chunk and need no mask."""
    jsl = pl.ds(t0 + SUB * j, SUB)
    ref_row = gam_ref[b, t0 + SUB * j + SUB - 1, h, :][None, :]
    return (_exp(g_rows - ref_row),
            k_ref[b, jsl, h, :].astype(F32) * _exp(ref_row - gam_ref[b, jsl, h, :]))


# ----------------------------------------------------------------------------------------------
# Small programs: intra (the diagonal 16 x 16 blocks of Mk and Mq), grad_blocks (every gradient
# through Mq and Mk, the diagonal blocks by quad levels) and gamma.


def _expand_quads(a):
    """``[SUB / QUAD, K]`` -> ``[SUB, K]``: row i takes row ``i // QUAD`` (no arithmetic)."""
    n, width = a.shape
    return jnp.broadcast_to(a[:, None, :], (n, QUAD, width)).reshape(n * QUAD, width)


def _intra_grad_levels(cfg, dms, xs, k_ref, gam_ref, g_blk, b, h, r0):
    """The gradients through the diagonal 16-row block at rows ``r0 ..`` of the decayed products
    (for :func:`_grad_blocks_kernel`). Returns ``(dX for each X, dY)``, ``[SUB, K]`` fp32.

    ``dms`` are the block's masked ``[SUB, SUB]`` cotangents, ``xs`` their ``[SUB, K]`` fp32
    left operands, Y = k, ``g_blk`` the block's gamma. The block is cut into four 4-row quads.
    Pairs in different quads (quad(i) > m = quad(j)) factor through the reference r = gamma at
    the last row of quad m, as the off-diagonal blocks do (``gamma_i <= r <= gamma_j``, both
    factors <= 1, exponents masked before ``exp``): ``dX += row_fac (dM @ (Y col_fac))`` and
    ``dY += col_fac (dM^T @ (X row_fac))``, three whole-tile steps. Pairs in one quad
    (j = 4 quad(i) + m <= i) take the elementwise form by the quad's row m, loaded for all four
    quads at once with stride 4 and repeated over each quad's rows (four steps):
    ``dX_i += dM[i, j] Y_j e_ij`` and row j of dY gets the sum over its quad's rows i of
    ``dM[i, j] X_i e_ij`` (a sum over each quad's four rows, placed at row m). The products run
    in IEEE fp32 for fp32 inputs and in TF32 otherwise, whatever ``intra_tf32`` says (never in
    the half input dtype).
    """
    cfg = {**cfg, "intra_tf32": True}  # TF32 at least, never the half input dtype
    rows = _iota((SUB, 1), 0)
    r2, c2 = _iota((SUB, SUB), 0), _iota((SUB, SUB), 1)
    nq = SUB // QUAD
    y = k_ref[b, pl.ds(r0, SUB), h, :].astype(F32)
    dxs = [jnp.zeros_like(g_blk) for _ in xs]
    dy = jnp.zeros_like(g_blk)
    for m in range(nq - 1):
        row_fac, col_fac = _block_factors(g_blk, gam_ref[b, r0 + QUAD * m + QUAD - 1, h, :], m,
                                          QUAD)
        yc = y * col_fac
        dy_m = jnp.zeros_like(g_blk)
        for i, (dm, x) in enumerate(zip(dms, xs)):
            dxs[i] = dxs[i] + row_fac * _intra_dot(dm, yc, ((1,), (0,)), cfg)
            dy_m = dy_m + _intra_dot(dm, x * row_fac, ((0,), (0,)), cfg)
        dy = dy + col_fac * dy_m
    slot = _iota((nq, QUAD, 1), 1)
    for m in range(QUAD):
        qsl = pl.ds(r0 + m, nq, stride=QUAD)
        valid = rows % QUAD >= m
        g_m = _expand_quads(gam_ref[b, qsl, h, :])
        e = jnp.where(valid, _exp(jnp.where(valid, g_blk - g_m, 0.0)), 0.0)
        ye = _expand_quads(k_ref[b, qsl, h, :].astype(F32)) * e
        at = (c2 == (r2 // QUAD) * QUAD + m) & (r2 % QUAD >= m)
        xe = jnp.zeros_like(g_blk)
        for i, (dm, x) in enumerate(zip(dms, xs)):
            dm_m = jnp.sum(jnp.where(at, dm, 0.0), axis=1)[:, None]  # dM[i, j(i)]
            dxs[i] = dxs[i] + dm_m * ye
            xe = xe + dm_m * x
        per_quad = jnp.sum((xe * e).reshape(nq, QUAD, -1), axis=1)  # [nq, K]: row m of each
        dy = dy + jnp.where(slot == m, per_quad[:, None, :], 0.0).reshape(SUB, -1)
    return dxs[0], dxs[1], dy


def intra_heads(heads: int, tuning=None) -> int:
    """Heads per program of the ``intra`` kernel: the largest power of two that divides
    ``heads`` and is at most ``TUNING["intra_token_heads"]`` (``tuning``'s, if given).

    Raises:
      ValueError: if that cap is not an int >= 1.
    """
    raw = (TUNING if tuning is None else tuning).get("intra_token_heads")
    cap = raw if isinstance(raw, int) and not isinstance(raw, bool) else 0
    if cap < 1:
        raise ValueError('TUNING["intra_token_heads"] (the cap on heads per program of the '
                         f'intra kernel) must be an int >= 1, got {raw!r}')
    n = 1
    while n * 2 <= cap and heads % (n * 2) == 0:
        n *= 2
    return n


def _intra_tokens_kernel(q_ref, k_ref, ks_ref, gam_ref, conn_ref, last_ref, mkd_ref, mqd_ref,
                         qg_ref, kg_ref, krg_ref, *, cfg):
    """The ``intra`` kernel: the diagonal 16 x 16 blocks of Mk and Mq, one row at a time, and
    the token's decay-scaled rows.

    One program per token t (row i of its chunk) and group of ``cfg["intra_heads"]`` heads
    writes row i of the diagonal blocks: ``sum_c X_ic k_jc exp(gamma_ic - gamma_jc)`` for the
    columns j <= i of i's 16-row block (X = kr for Mk, q for Mq), a loop of ``i mod 16 + 1``
    steps over ``[heads, K]`` rows (FLA's token-parallel KDA intra kernel has this shape), each
    column stored as soon as it is summed (no register tile to assemble); the columns j > i are
    not written (uninitialised: ``prepare``, the only reader, masks them). The exponents are
    <= 0 (j <= i and g <= 0), so nothing is masked; fp32 elementwise. Document masks of the
    blocks are applied by ``prepare``.

    It also writes the token's rows of ``qg = q E_in``, ``kg = k E_out`` and ``krg = kr E_in``
    (``E_in = exp(gamma_t) conn_t``, ``E_out = exp(gamma_C - gamma_t) last_t``: the factors of
    :func:`_decay_factors` for one row), since it loads q, k and kr anyway: ``wu`` then reads
    krg instead of q, k and gamma's ``[C, K]`` tiles (only gamma's last row per chunk, for
    e_all). Tiny programs with few registers: many resident per SM.
    """
    tp = cfg["n_chunks"] * CHUNK
    tok = pl.program_id(0)
    b, t = tok // tp, tok % tp
    nh = cfg["intra_heads"]
    hsl = pl.ds(pl.program_id(1) * nh, nh)
    n, i = t // CHUNK, t % CHUNK
    i_sub = i % SUB
    g_i = gam_ref[b, t, hsl, :]  # [nh, K]
    k_t = k_ref[b, t, hsl, :].astype(F32)
    x_k = _scaled(k_t, ks_ref, b, t, hsl, slice(None), cfg["mm_dtype"])  # kr_t = k_t ks_t
    x_q = q_ref[b, t, hsl, :].astype(F32)

    e_in = _exp(g_i)
    e_out = _exp(gam_ref[b, n * CHUNK + CHUNK - 1, hsl, :] - g_i)
    if conn_ref is not None:
        e_in = e_in * conn_ref[b, t]
        e_out = e_out * last_ref[b, t]
    qg_ref[b, t, hsl, :] = (x_q * e_in).astype(qg_ref.dtype)
    kg_ref[b, t, hsl, :] = (k_t * e_out).astype(kg_ref.dtype)
    krg_ref[b, t, hsl, :] = (x_k * e_in).astype(krg_ref.dtype)

    def column(jj, carry):  # column jj of the row, stored as soon as it is summed
        j = t - i_sub + jj
        dec = k_ref[b, j, hsl, :].astype(F32) * _exp(g_i - gam_ref[b, j, hsl, :])
        mkd_ref[b, hsl, n, i, jj] = jnp.sum(x_k * dec, axis=1)
        mqd_ref[b, hsl, n, i, jj] = jnp.sum(x_q * dec, axis=1)
        return carry

    jax.lax.fori_loop(0, i_sub + 1, column, 0)


def _intra(cfg, q, k, ks, gam, docs):
    """:func:`_intra_tokens_kernel` (a program per token and group of ``cfg["intra_heads"]``
    heads) on q, k ``[B, Tp, H, K]`` (operand dtype), the read-key scale ks (``[B, Tp, H, 1 or
    K]``: kr = k ks), gamma (fp32 ``[B, Tp, H, K]``) and the document masks ``docs``.

    Returns ``{ref name: array}``: ``mkd_ref`` and ``mqd_ref``, the diagonal blocks of Mk and Mq
    (fp32 ``[B, H, N, C, SUB]``; row i holds columns ``j <= i mod 16`` only, the others are
    unwritten (uninitialised; NaN in interpret mode), so readers must mask them as ``prepare``
    does); ``qg_ref``, ``kg_ref`` (k's dtype) and ``krg_ref`` (operand dtype), ``[B, Tp, H,
    K]``.

    Raises:
      ValueError: if the arrays' length ``Tp`` is not the configuration's padded length
        ``n_chunks * 64`` (the kernel decodes token indices from it).
    """
    bsz, tp, heads, dk = k.shape
    if tp != cfg["n_chunks"] * CHUNK:  # the kernel decodes (b, t) from the padded length
        raise ValueError(f"_intra: sequence length {tp} is not the padded length "
                         f"{cfg['n_chunks'] * CHUNK} of the configuration")
    mats = jax.ShapeDtypeStruct((bsz, heads, cfg["n_chunks"], CHUNK, SUB), F32)
    tok_k = jax.ShapeDtypeStruct((bsz, tp, heads, dk), k.dtype)
    return _pallas(
        _intra_tokens_kernel, cfg,
        inputs=[("q_ref", q), ("k_ref", k), ("ks_ref", ks), ("gam_ref", gam)]
        + _doc_inputs(docs)[1:],  # conn and last
        outputs=[("mkd_ref", mats), ("mqd_ref", mats), ("qg_ref", tok_k), ("kg_ref", tok_k),
                 ("krg_ref", jax.ShapeDtypeStruct((bsz, tp, heads, dk), cfg["mm_dtype"]))],
        grid=(bsz * tp, heads // cfg["intra_heads"]), tune="intra_token",
        name="channelwise_intra",
    )


def _grad_blocks_kernel(q_ref, k_ref, kr_ref, gam_ref, doc_ref, conn_ref, last_ref, do_ref,
                        vn_ref, dr_ref, dq_ref, dk_ref, dkr_ref, *, cfg):
    """The ``grad_blocks`` kernel: every gradient through Mq and Mk for the rows of block c.

    With ``dMq = scale mask_incl(dO Vn^T)``, ``dMk = -mask_strict(dR Vn^T)`` (``dR = A^T dVn``
    from :func:`_chunk_dr`, in the input dtype), formed per ``[16, 16]`` block from
    V-contractions of the rows involved (c the 16-row block of grid axis 2)::

        dX_c = sum_{j < c} (dM_cj (k_j e^{r_j - gamma_j})) * e^{gamma_c - r_j} + diag_c
        dY_c = e^{r_c - gamma_c} * sum_{i > c} (dMq_ic^T (q_i E_ic) + dMk_ic^T (kr_i E_ic))
               + diag_c,   E_ic = e^{gamma_i - r_c}

    (X = q for Mq, kr for Mk; r_j = gamma at the last row of block j, every exponent <= 0),
    the diagonal block's share ``diag_c`` by :func:`_intra_grad_levels`. Writes fp32 partials
    of dq, dkr and dk that ``backward_chunk`` adds (with their gamma share). Products as
    :func:`_intra_dot`, the diagonal block's as :func:`_intra_grad_levels`; the dM blocks in
    the input dtype with fp32 accumulation. The three parts run one after another so that few
    ``[16, K]`` tiles are live at once.
    """
    n = pl.program_id(0)
    b, h = _program_bh(cfg, 1)
    c = pl.program_id(2)
    mdt = cfg["mm_dtype"]
    scale = cfg["scale"]
    t0 = n * CHUNK
    r0 = t0 + SUB * c
    csl = pl.ds(r0, SUB)

    def doc_rows(sl):
        return _load_docs(cfg, doc_ref, conn_ref, last_ref, b, sl)[0]

    def same_doc(dm, doc_i, doc_j):
        return dm if doc_i is None else jnp.where(doc_i[:, None] == doc_j[None, :], dm, 0.0)

    doc_c = doc_rows(csl)
    g_c = gam_ref[b, csl, h, :]  # [SUB, K]
    zero = jnp.zeros_like(g_c)

    # Y side: row blocks i > c (dk of block c's rows).
    ref_c = gam_ref[b, r0 + SUB - 1, h, :][None, :]

    def y_side(i, dy):
        isl = pl.ds(t0 + SUB * i, SUB)
        vn_c = vn_ref[b, csl, h, :]
        doc_i = doc_rows(isl)
        dmq = same_doc(scale * mm_nt(do_ref[b, isl, h, :], vn_c, mdt), doc_i, doc_c)
        dmk = same_doc(-mm_nt(dr_ref[b, isl, h, :], vn_c, mdt), doc_i, doc_c)
        row_fac = _exp(gam_ref[b, isl, h, :] - ref_c)
        return (dy + _intra_dot(dmq, q_ref[b, isl, h, :].astype(F32) * row_fac, ((0,), (0,)),
                                cfg)
                + _intra_dot(dmk, kr_ref[b, isl, h, :].astype(F32) * row_fac, ((0,), (0,)),
                             cfg))

    dk = _exp(ref_c - g_c) * jax.lax.fori_loop(c + 1, NSUB, y_side, zero)

    # The diagonal block.
    rows, cols = _iota((SUB, SUB), 0), _iota((SUB, SUB), 1)
    incl = rows >= cols
    if doc_c is not None:
        incl = incl & (doc_c[:, None] == doc_c[None, :])
    strict = incl & (rows > cols)
    vn_c = vn_ref[b, csl, h, :]
    dmq_d = jnp.where(incl, scale * mm_nt(do_ref[b, csl, h, :], vn_c, mdt), 0.0)
    dmk_d = jnp.where(strict, -mm_nt(dr_ref[b, csl, h, :], vn_c, mdt), 0.0)
    xs = (q_ref[b, csl, h, :].astype(F32), kr_ref[b, csl, h, :].astype(F32))
    dq, dkr, dk_d = _intra_grad_levels(cfg, (dmq_d, dmk_d), xs, k_ref, gam_ref, g_c, b, h, r0)
    dk_ref[b, csl, h, :] = dk + dk_d

    # X side: column blocks j < c (dq, dkr of block c's rows).
    def x_side(j, carry):
        dq, dkr = carry
        jsl = pl.ds(t0 + SUB * j, SUB)
        vn_j = vn_ref[b, jsl, h, :]
        doc_j = doc_rows(jsl)
        dmq = same_doc(scale * mm_nt(do_ref[b, csl, h, :], vn_j, mdt), doc_c, doc_j)
        dmk = same_doc(-mm_nt(dr_ref[b, csl, h, :], vn_j, mdt), doc_c, doc_j)
        row_fac, yc = _column_block_factors(k_ref, gam_ref, g_c, b, h, t0, j)
        return (dq + row_fac * _intra_dot(dmq, yc, ((1,), (0,)), cfg),
                dkr + row_fac * _intra_dot(dmk, yc, ((1,), (0,)), cfg))

    dq, dkr = jax.lax.fori_loop(0, c, x_side, (dq, dkr))
    dq_ref[b, csl, h, :] = dq
    dkr_ref[b, csl, h, :] = dkr


def _chunk_dr(cfg, amat, dvn, heads_first: bool = False, dvn_heads_first: bool = False):
    """``dR = A^T dVn`` per chunk, ``[B, T, H, V]`` in the input dtype (XLA).

    Operands in the input dtype with fp32 accumulation, rounded once: the value the products
    of ``grad_blocks`` and ``backward_chunk`` see (they cast dR to the input dtype) and ``dvw``
    itself. ``heads_first``: ``[B, H, T, V]`` instead, the product's own output layout (its
    batch dimensions b, h, n lead), so XLA writes it without a transpose; K2 reads that layout
    and hands ``dvw`` back in ``[B, T, H, V]`` (MOSAIC_GPU.md Sec. 47.2). ``dvn_heads_first``:
    ``dvn`` is ``[B, H, T, V]`` (the Mosaic reverse state pass writes it so), the product's own
    operand layout: no transpose of it either (MOSAIC_GPU.md Sec. 48.2).
    """
    if dvn_heads_first:
        bsz, heads, tp, dv = dvn.shape
    else:
        bsz, tp, heads, dv = dvn.shape
    mdt = cfg["mm_dtype"]
    dvn_in = "bhnlv" if dvn_heads_first else "bnlhv"
    dvn_c = dvn.reshape((bsz, heads, cfg["n_chunks"], CHUNK, dv) if dvn_heads_first
                        else (bsz, cfg["n_chunks"], CHUNK, heads, dv)).astype(mdt)
    precision = jax.lax.Precision.HIGHEST if mdt == jnp.dtype(F32) else None
    # The product's result in the operand dtype (fp32 accumulation, one rounding; the same
    # value as an fp32 result rounded after): XLA then moves the einsum's output transpose
    # in 16 bits (an fp32 result was transposed first, 537 MB at S1; MOSAIC_GPU.md Sec. 43.3).
    out = "bhniv" if heads_first else "bnihv"
    dr = jnp.einsum(f"bhnli,{dvn_in}->{out}", amat.astype(mdt), dvn_c, precision=precision,
                    preferred_element_type=mdt)
    return dr.reshape((bsz, heads, tp, dv) if heads_first else (bsz, tp, heads, dv))


def _grad_blocks(cfg, q, k, kr, gam, docs, do, vn, dr):
    """``(dq, dk, dkr)`` partials, fp32 ``[B, T, H, K]``, from :func:`_grad_blocks_kernel`."""
    bsz, tp, heads, dk = q.shape
    tok = jax.ShapeDtypeStruct((bsz, tp, heads, dk), F32)
    outs = _pallas(
        _grad_blocks_kernel, cfg,
        inputs=[("q_ref", q), ("k_ref", k), ("kr_ref", kr), ("gam_ref", gam)]
        + _doc_inputs(docs) + [("do_ref", do), ("vn_ref", vn), ("dr_ref", dr)],
        outputs=[("dq_ref", tok), ("dk_ref", tok), ("dkr_ref", tok)],
        grid=(cfg["n_chunks"], bsz * heads, NSUB), tune="grad_blocks",
        name="channelwise_grad_blocks",
    )
    return outs["dq_ref"], outs["dk_ref"], outs["dkr_ref"]


def _grad_blocks_mosaic(cfg, q, k, kr, gam, docs, do, vn, dr):
    """:func:`_grad_blocks` on the Mosaic GPU kernel K1
    (:func:`pallas_kernels.common.channelwise_grad_mosaic_gpu.channelwise_grad_intra_mosaic`,
    GPU interpret mode under ``cfg["interpret"]``): the same partials, layouts and dtypes."""
    from pallas_kernels.common import channelwise_grad_mosaic_gpu

    return channelwise_grad_mosaic_gpu.channelwise_grad_intra_mosaic(
        q, k, kr, gam, do, vn, dr, scale=cfg["scale"], doc=docs[0] if docs else None,
        slab=cfg["mosaic_grad_slab"], interpret=cfg["interpret"])


def _gamma_kernel(g_ref, gam_ref, *, cfg):
    """The ``gamma`` kernel: ``gamma = cumsum(max(g, LOG_DECAY_FLOOR))`` within one chunk, fp32
    (Triton scan), one program per (chunk, head), key blocks of ``block_k`` channels. The
    floor (``validation.floor_log_decay``'s values, NaN kept) is applied here on the way in,
    not as an XLA pass over ``g`` before the op (0.17 ms at S1 on an H100, MOSAIC_GPU.md Sec.
    47.4); its gradient is ``validation.floor_log_decay_grad``."""
    n = pl.program_id(0)
    b, h = _program_bh(cfg, 1)
    tsl = pl.ds(n * CHUNK, CHUNK)
    bk = cfg["block_k"]
    floor = F32(validation.LOG_DECAY_FLOOR)
    for kb in range(cfg["dk"] // bk):
        ksl = pl.ds(kb * bk, bk)
        g = g_ref[b, tsl, h, ksl]
        gam_ref[b, tsl, h, ksl] = jnp.cumsum(jnp.where(g < floor, floor, g), axis=0)


def _gamma(cfg, g):
    """The within-chunk cumsum of ``g`` (fp32 ``[B, Tp, H, K]``) by :func:`_gamma_kernel`."""
    bsz, _, heads, _ = g.shape
    outs = _pallas(_gamma_kernel, cfg, inputs=[("g_ref", g)],
                   outputs=[("gam_ref", jax.ShapeDtypeStruct(g.shape, F32))],
                   grid=(cfg["n_chunks"], bsz * heads), tune="gamma", name="channelwise_gamma")
    return outs["gam_ref"]


def _scaled(x, s_ref, b, tsl, hsl, csl, mdt):
    """``x * s`` of a loaded block ``x`` (fp32, read at ``[b, tsl, hsl, csl]``), rounded once
    to the operand dtype ``mdt`` and returned as fp32: ``kr = k ks`` or ``vw = v vs`` formed in
    the kernel from the raw tensor and its scale (any float dtype, taken to fp32 here:
    ``s_ref``'s last dim is 1, broadcast over the channels, or the full head dim), the same
    values XLA's ``(k * ks.astype(f32)).astype(mdt)`` gives (IEEE fp32 product, round to
    nearest even)."""
    s = s_ref[b, tsl, hsl, pl.ds(0, 1) if s_ref.shape[-1] == 1 else csl].astype(F32)
    return (x * s).astype(mdt).astype(F32)


def _conn_last(conn):
    """``conn`` of the chunk's last token (a scalar), or ``None`` without documents."""
    return None if conn is None else _last(conn, CHUNK)


# ----------------------------------------------------------------------------------------------
# Kernel 1: intra-chunk preparation.


def _prepare_kernel(q_ref, k_ref, ks_ref, gam_ref, doc_ref, conn_ref, last_ref, mkd_ref, mqd_ref,
                    a_ref, mq_ref, *, cfg):
    """The ``prepare`` kernel: Mk, Mq and ``A = (I + Mk)^{-1}`` of one chunk, computed on its
    16 x 16 sub-blocks held as separate register tiles (``[16, 16]`` and ``[16, BK]`` values),
    as FLA's fused inter + solve KDA kernel does. One program per (chunk, batch * head).

    Row block i holds rows ``16 i .. 16 i + 15`` of the chunk; tiles are loaded from and stored
    to the refs at those row offsets (Triton cannot slice registers, but refs slice freely).

    1. Off-diagonal blocks (i > j) of Mk and Mq, summed over key blocks of ``BK =
       cfg["prepare_k"]`` channels (the loop; all six block pairs inside it, each row block's
       tiles loaded once per key block), with r_i = gamma at the FIRST row of block i (gamma
       is non-increasing, so ``gamma_i <= r_i <= gamma_j`` for every row of block i and every
       row of an earlier block j)::

           Mk_ij = (kr_i e^{gamma_i - r_i}) (k_j e^{r_{j+1} - gamma_j} e^{r_i - r_{j+1}})^T

       and Mq_ij likewise (q_i). Every exponent is <= 0 in a chunk: no masks, no overflow, an
       exact factorisation; the column factor ``k_j e^{r_{j+1} - gamma_j}`` serves every i > j
       (times the per-channel ``e^{r_i - r_{j+1}}`` for i > j + 1). Twelve ``[16, BK] x [BK,
       16]`` products per key block by :func:`_intra_dot` (IEEE fp32 for fp32 inputs; TF32 or
       the input dtype for half inputs, ``TUNING["intra_tf32"]``). (Until 2026-11-30 the row
       blocks were the outer loop, one key-block loop per row block: intra + prepare + wu
       1.201 ms against 1.169 at S1 on the H200, history/channelwise-forms-h200-2026-11-30c.md; a
       loop over the column blocks with selects into the accumulators was slower still.)
       Masks per tile, after the loop: same document (``doc_ref`` holds, for this kernel,
       each token's document start in its chunk, :func:`_doc_starts`: column ``c`` shares
       row ``r``'s document iff ``c >= start[r]``; ``conn_ref`` and ``last_ref`` are
       ``None``). Mq's tiles go
       out masked, in the operand dtype: the diagonal tile from ``intra`` (``mqd`` rows
       ``16 i ..``, loaded directly; inclusive lower and same document, which also drops the
       columns ``intra`` leaves unwritten), zeros above the diagonal (the output is
       uninitialised).
    2. ``A = (I + Mk)^{-1}`` blockwise. The four unit-lower diagonal blocks
       ``A_ii = (I + L_i)^{-1}`` (``L_i`` = ``intra``'s ``mkd`` tile, strict lower; without
       the document mask, which A's tiles get as they are stored: exact, as documents are
       contiguous runs of rows, see the comment at the substitution) by forward substitution,
       one row r per step for all four blocks at once:
       ``(A_ii - I)[r] = a + sum_m a_m (A_ii - I)[m]`` with ``a = -L_i[r, :r]`` loaded from
       ``mkd_ref`` (fp32 elementwise: exact to fp32 rounding for every input dtype, no Newton
       step needed). Then the blocks below the diagonal by block forward substitution,
       ``A_ij = -A_ii sum_{j <= m < i} Mk_im A_mj`` (16 ``[16, 16]`` products by
       :func:`pallas_gpu.dot_precise`: IEEE fp32 for fp32 inputs, TF32 for half inputs), and A
       out in the operand dtype (tile by tile, zeros above the diagonal) for :func:`_wu_kernel`
       and the backward.

    The inverse runs after all products, so that its tiles do not stay live through the
    product loop (registers: 255 per thread at 1 warp, no spills, estimated with
    ``benchmarks/kernel_registers.py`` and Triton 3.6 at S1; ``prepare_k`` 32 spills).
    """
    n = pl.program_id(0)
    b, h = _program_bh(cfg, 1)
    t0 = n * CHUNK
    mdt = cfg["mm_dtype"]
    bk = cfg["prepare_k"]
    nkb = cfg["dk"] // bk

    def rows(i):  # the tokens of row block i (a Python or a traced int)
        return pl.ds(t0 + SUB * i, SUB)

    def blk(i):  # rows / columns of block i in a [C, C] matrix
        return pl.ds(SUB * i, SUB)

    def with_mask(mask, other):
        return other if mask is None else mask if other is None else mask & other

    def same_doc(i, j):  # [SUB, SUB]: row of block i and column of block j <= i in one document
        # (documents are contiguous runs: column c shares row r's document iff c is at or after
        # the row's document start; a [SUB, 1] tile against a column iota, no column vector).
        # The starts are loaded where each mask is formed, after the product loop, so that
        # neither they nor the masks are live through the loop or the substitution (with the
        # document ids loaded before the loop it spilled 116 bytes at 255 registers, with the
        # starts loaded once after it 24: benchmarks/kernel_registers.py --op=kda --segments).
        return None if not cfg["has_docs"] else SUB * j + c16 >= doc_ref[b, rows(i), :]

    def masked(tile, mask):
        return tile if mask is None else jnp.where(mask, tile, 0.0)

    r16, c16 = _iota((SUB, SUB), 0), _iota((SUB, SUB), 1)
    zero = jnp.zeros((SUB, SUB), F32)

    # 1. Off-diagonal blocks of Mk and Mq; Mq out (above the diagonal now, the rest after the
    # products).
    for i in range(NSUB):
        for j in range(i + 1, NSUB):
            mq_ref[b, h, n, blk(i), blk(j)] = zero.astype(mq_ref.dtype)
    # Key blocks outermost: each row block's tiles are loaded once per key block and the six
    # block pairs' products are independent work for the one warp.
    pairs = [(i, j) for i in range(1, NSUB) for j in range(i)]

    def key_block(kb, acc):
        ksl = pl.ds(kb * bk, bk)
        ref = {i: gam_ref[b, t0 + SUB * i, h, ksl][None, :] for i in range(1, NSUB)}  # r_i
        gam = {i: gam_ref[b, rows(i), h, ksl] for i in range(NSUB)}
        kraw = {i: k_ref[b, rows(i), h, ksl].astype(F32) for i in range(NSUB)}
        # Column factors k_j e^{r_{j+1} - gamma_j}, times the per-channel e^{r_i - r_{j+1}}
        # for row blocks i > j + 1 (both exponents <= 0): e^{r_i - gamma_j} with three
        # [16, BK] exponentials instead of six.
        ycol = {j: kraw[j] * _exp(ref[j + 1] - gam[j]) for j in range(NSUB - 1)}
        out = []
        for i in range(1, NSUB):
            row_fac = _exp(gam[i] - ref[i])  # e^{gamma_i - r_i}
            xk = _scaled(kraw[i], ks_ref, b, rows(i), h, ksl, mdt) * row_fac  # kr rows
            xq = q_ref[b, rows(i), h, ksl].astype(F32) * row_fac
            for j in range(i):
                y = ycol[j] if j + 1 == i else ycol[j] * _exp(ref[i] - ref[j + 1])
                out += [_intra_dot(xk, y, ((1,), (1,)), cfg), _intra_dot(xq, y, ((1,), (1,)), cfg)]
        return tuple(a + o for a, o in zip(acc, out))

    acc = jax.lax.fori_loop(0, nkb, key_block, tuple(zero for _ in range(2 * len(pairs))))
    for i in range(NSUB):
        mq_ref[b, h, n, blk(i), blk(i)] = masked(
            mqd_ref[b, h, n, blk(i), :], with_mask(r16 >= c16, same_doc(i, i))
        ).astype(mq_ref.dtype)
    mk = {}
    for x, (i, j) in enumerate(pairs):
        mq_ref[b, h, n, blk(i), blk(j)] = masked(acc[2 * x + 1], same_doc(i, j)).astype(
            mq_ref.dtype)
        mk[i, j] = acc[2 * x]  # unmasked: A's tiles are masked as they are stored (below)

    # 2. A = (I + Mk)^{-1}: the diagonal blocks by row-wise forward substitution (the four
    # blocks in lockstep, A_ii - I built row by row) ...
    lane = _iota((SUB,), 0)

    def substitute(r, strict_inv):
        out = []
        for i, x in enumerate(strict_inv):
            a = jnp.where(lane < r, -mkd_ref[b, h, n, SUB * i + r, :], 0.0)  # -L_i[r, :r]
            a = a + jnp.sum(a[:, None] * x, axis=0)
            out.append(jnp.where(r16 == r, a[None, :], x))
        return tuple(out)

    # Mk without its document mask (here and in the blocks below the diagonal): documents are
    # contiguous runs of rows, so entry (r, c) of the inverse of a unit lower triangular
    # matrix, which depends only on its entries in rows and columns c .. r, is the masked
    # matrix's wherever r and c share a document (the same nonzero terms: every other term
    # has an exact zero of the upper triangle as a factor); A's other entries are zeroed as
    # its tiles are stored. So no mask is live through the substitution and the products.
    strict_inv = jax.lax.fori_loop(1, SUB, substitute, tuple(zero for _ in range(NSUB)))
    eye = jnp.where(r16 == c16, 1.0, 0.0).astype(F32)
    amat = {(i, i): x + eye for i, x in enumerate(strict_inv)}
    # ... then the blocks below the diagonal, row block by row block, each row block stored
    # (masked) once it is complete, so that few masked copies are live at a time.
    for i in range(NSUB):
        for j in range(i - 1, -1, -1):
            acc = pallas_gpu.dot_precise(mk[i, j], amat[j, j], mdt)
            for m in range(j + 1, i):
                acc = acc + pallas_gpu.dot_precise(mk[i, m], amat[m, j], mdt)
            amat[i, j] = -pallas_gpu.dot_precise(amat[i, i], acc, mdt)
        for j in range(NSUB):
            a_ref[b, h, n, blk(i), blk(j)] = (masked(amat[i, j], same_doc(i, j)) if j <= i
                                              else zero).astype(a_ref.dtype)


def _wu_kernel(krg_ref, v_ref, vs_ref, gam_ref, conn_ref, a_ref, w_ref, u_ref, e_ref, *, cfg):
    """The ``wu`` kernel: ``W = A krg`` (``krg = kr E_in`` from :func:`_intra_tokens_kernel`)
    and ``U = A vw`` (the WY representation, paper 1 Eqs. 18-24; FLA's ``recompute_w_u``;
    ``vw = v vs`` formed here by :func:`_scaled`), and ``e_all = exp(gamma_C) conn_C``, of one
    chunk on whole ``[C, BK]`` / ``[C, BV]`` tiles, with A from :func:`_prepare_kernel`
    (operand dtype; one ``[C, C] x [C, BK]`` tensor-core product per key or value block, fp32
    accumulation). One program per (chunk, batch * head)."""
    n = pl.program_id(0)
    b, h = _program_bh(cfg, 1)
    t0 = n * CHUNK
    tsl = pl.ds(t0, CHUNK)
    mdt = cfg["mm_dtype"]
    bk, bv = cfg["block_k"], cfg["block_v"]
    conn_last = None if conn_ref is None else conn_ref[b, t0 + CHUNK - 1]
    amat = a_ref[b, h, n, :, :]
    for kb in range(cfg["dk"] // bk):
        ksl = pl.ds(kb * bk, bk)
        e_all = _exp(gam_ref[b, t0 + CHUNK - 1, h, ksl])
        e_ref[b, h, n, ksl] = e_all if conn_last is None else e_all * conn_last
        w_ref[b, tsl, h, ksl] = mm(amat, krg_ref[b, tsl, h, ksl], mdt).astype(w_ref.dtype)
    for vb in range(cfg["dv"] // bv):
        vsl = pl.ds(vb * bv, bv)
        vw = _scaled(v_ref[b, tsl, h, vsl].astype(F32), vs_ref, b, tsl, h, vsl, mdt)
        u_ref[b, tsl, h, vsl] = mm(amat, vw, mdt).astype(u_ref.dtype)


def _doc_starts(doc):
    """int32 ``[B, Tp, 1]``: each token's chunk-local index of its document's first token in
    its chunk (0 when the document began in an earlier chunk), from the document ids ``doc``
    (``[B, Tp]``, non-decreasing: :func:`pallas_gpu.docs_from_segment_ids`). Row ``r`` and
    column ``c <= r`` of a chunk share a document iff ``c >= start[r]``."""
    bsz, tp = doc.shape
    dc = doc.reshape(bsz, tp // CHUNK, CHUNK)
    pos = jnp.arange(CHUNK, dtype=jnp.int32)
    first = jnp.concatenate([jnp.ones_like(dc[..., :1], bool), dc[..., 1:] != dc[..., :-1]],
                            axis=-1)
    starts = jax.lax.cummax(jnp.where(first, pos, 0), axis=2)
    return starts.reshape(bsz, tp, 1).astype(jnp.int32)


def _prepare(cfg, q, k, v, ks, vs, gam, docs, *, save_a):
    """The ``intra``, ``prepare`` and ``wu`` kernels (named ``channelwise_intra``,
    ``channelwise_prepare`` and ``channelwise_wu``), which form ``kr = k ks`` and ``vw = v vs``
    themselves (float scales ``ks`` ``[B, Tp, H, 1 or K]``, ``vs`` ``[B, Tp, H, 1 or V]``).
    Returns ``{ref name: array}``: ``w_ref``, ``u_ref``, ``qg_ref``, ``kg_ref`` (operand dtype,
    ``[B, Tp, H, K or V]``), ``mq_ref`` and (``save_a``) ``a_ref`` (operand dtype,
    ``[B, H, N, C, C]``, zero above the diagonal) and
    ``e_ref`` (fp32 ``[B, H, N, K]``)."""
    intra = _intra(cfg, q, k, ks, gam, docs)
    bsz, tp, heads, dk = k.shape
    dv = v.shape[-1]
    nc = cfg["n_chunks"]
    # A and Mq in the tensor-core operand dtype: every consumer (wu, forward, backward_state,
    # _chunk_dr) rounds them to it before its product, so storing them rounded changes nothing
    # but halves their HBM traffic for half-precision inputs.
    mats = jax.ShapeDtypeStruct((bsz, heads, nc, CHUNK, CHUNK), cfg["mm_dtype"])
    # prepare reads each token's document start in its chunk (as doc_ref), not the ids
    starts = [("doc_ref", _doc_starts(docs[0])), ("conn_ref", None),
              ("last_ref", None)] if docs else _doc_inputs(docs)
    outs = _pallas(
        _prepare_kernel, cfg,
        inputs=[("q_ref", q), ("k_ref", k), ("ks_ref", ks), ("gam_ref", gam)]
        + starts + [("mkd_ref", intra["mkd_ref"]), ("mqd_ref", intra["mqd_ref"])],
        outputs=[("a_ref", mats), ("mq_ref", mats)],
        grid=(nc, bsz * heads), tune="prepare", name="channelwise_prepare",
    )
    outs.update(_pallas(
        _wu_kernel, cfg,
        inputs=[("krg_ref", intra["krg_ref"]), ("v_ref", v), ("vs_ref", vs), ("gam_ref", gam)]
        + _doc_inputs(docs)[1:2] + [("a_ref", outs["a_ref"])],  # conn only
        outputs=[
            ("w_ref", jax.ShapeDtypeStruct((bsz, tp, heads, dk), k.dtype)),
            ("u_ref", jax.ShapeDtypeStruct((bsz, tp, heads, dv), v.dtype)),
            ("e_ref", jax.ShapeDtypeStruct((bsz, heads, nc, dk), F32)),
        ],
        grid=(nc, bsz * heads), tune="wu", name="channelwise_wu",
    ))
    outs["qg_ref"], outs["kg_ref"] = intra["qg_ref"], intra["kg_ref"]
    if not save_a:
        del outs["a_ref"]
    return outs


# ----------------------------------------------------------------------------------------------
# Kernel 2: the sequential forward pass over chunks.


def _forward_kernel(qg_ref, kg_ref, u_ref, w_ref, mq_ref, e_ref, h0_ref,
                    o_ref, ht_ref, vn_ref, hs_ref, *, cfg):
    b, h = _program_bh(cfg, 0)
    vsl = pl.ds(pl.program_id(1) * cfg["block_v"], cfg["block_v"])
    mdt = cfg["mm_dtype"]

    def body(n, state):
        tsl = pl.ds(n * CHUNK, CHUNK)
        if hs_ref is not None:
            hs_ref[b, h, n, :, vsl] = state.astype(hs_ref.dtype)
        vn = u_ref[b, tsl, h, vsl].astype(F32) - mm(w_ref[b, tsl, h, :], state, mdt)
        o = mm(qg_ref[b, tsl, h, :], state, mdt) + mm(mq_ref[b, h, n, :, :], vn, mdt)
        o_ref[b, tsl, h, vsl] = (cfg["scale"] * o).astype(o_ref.dtype)
        if vn_ref is not None:
            vn_ref[b, tsl, h, vsl] = vn.astype(vn_ref.dtype)
        e_all = e_ref[b, h, n, :]
        return e_all[:, None] * state + mm_tn(kg_ref[b, tsl, h, :], vn, mdt)

    state = h0_ref[b, h, :, vsl].astype(F32)
    state = jax.lax.fori_loop(0, cfg["n_chunks"], body, state)
    ht_ref[b, h, :, vsl] = state


def _forward(cfg, prep, h0, *, save):
    qg, u = prep["qg_ref"], prep["u_ref"]
    bsz, tp, heads, dk = qg.shape
    dv = u.shape[-1]
    save_vn = save or cfg["return_residual"]
    outs = _pallas(
        _forward_kernel, cfg,
        inputs=[("qg_ref", qg), ("kg_ref", prep["kg_ref"]), ("u_ref", u),
                ("w_ref", prep["w_ref"]), ("mq_ref", prep["mq_ref"]),
                ("e_ref", prep["e_ref"]), ("h0_ref", h0)],
        outputs=[
            ("o_ref", jax.ShapeDtypeStruct((bsz, tp, heads, dv), u.dtype)),
            ("ht_ref", jax.ShapeDtypeStruct((bsz, heads, dk, dv), F32)),
            ("vn_ref", jax.ShapeDtypeStruct((bsz, tp, heads, dv), u.dtype) if save_vn else None),
            ("hs_ref", jax.ShapeDtypeStruct((bsz, heads, cfg["n_chunks"], dk, dv),
                                            cfg["mm_dtype"]) if save else None),
        ],
        grid=(bsz * heads, dv // cfg["block_v"]), tune="forward", name="channelwise_forward",
    )
    return outs["o_ref"], outs["ht_ref"], outs.get("vn_ref"), outs.get("hs_ref")


def _forward_mosaic(cfg, prep, h0, *, save):
    """:func:`_forward` on the Mosaic GPU kernel
    (:func:`pallas_kernels.common.channelwise_mosaic_gpu.channelwise_forward_mosaic`, GPU
    interpret mode under ``cfg["interpret"]``): the same outputs, layouts and dtypes, plus the
    sequence pieces' maps (``[B, P, H, K, K]`` fp32 when ``save`` and ``P > 1``, else
    ``None``; ``cfg["mosaic_pieces"]``), the residual :func:`_backward_state_mosaic` reuses."""
    from pallas_kernels.common import channelwise_mosaic_gpu

    return channelwise_mosaic_gpu.channelwise_forward_mosaic(
        prep["qg_ref"], prep["kg_ref"], prep["w_ref"], prep["u_ref"], prep["mq_ref"],
        prep["e_ref"], scale=cfg["scale"], initial_state=h0,
        store_v_new=save or cfg["return_residual"], store_h=save,
        alias_staging=cfg["mosaic_alias_staging"], pieces=cfg["mosaic_pieces"],
        return_maps=save, interpret=cfg["interpret"])


# ----------------------------------------------------------------------------------------------
# Kernel 3: the reverse state pass.


def _backward_state_kernel(qg_ref, kg_ref, w_ref, mq_ref, e_ref, do_ref, dvn_in_ref, dht_ref,
                           dvn_ref, dhs_ref, dh0_ref, *, cfg):
    b, h = _program_bh(cfg, 0)
    vsl = pl.ds(pl.program_id(1) * cfg["block_v"], cfg["block_v"])
    mdt = cfg["mm_dtype"]
    scale = cfg["scale"]
    nc = cfg["n_chunks"]

    def body(i, dstate):
        n = nc - 1 - i
        tsl = pl.ds(n * CHUNK, CHUNK)
        dhs_ref[b, h, n, :, vsl] = dstate.astype(dhs_ref.dtype)
        do = do_ref[b, tsl, h, vsl]
        dvn = scale * mm_tn(mq_ref[b, h, n, :, :], do, mdt)
        dvn = dvn + mm(kg_ref[b, tsl, h, :], dstate, mdt)
        if dvn_in_ref is not None:
            dvn = dvn + dvn_in_ref[b, tsl, h, vsl].astype(F32)
        dvn_ref[b, tsl, h, vsl] = dvn.astype(dvn_ref.dtype)
        e_all = e_ref[b, h, n, :]
        dnew = e_all[:, None] * dstate + scale * mm_tn(qg_ref[b, tsl, h, :], do, mdt)
        return dnew - mm_tn(w_ref[b, tsl, h, :], dvn, mdt)

    dstate = dht_ref[b, h, :, vsl].astype(F32)
    dstate = jax.lax.fori_loop(0, nc, body, dstate)
    dh0_ref[b, h, :, vsl] = dstate


def _backward_state(cfg, prep, do, dvn_in, dht):
    qg = prep["qg_ref"]
    bsz, tp, heads, dk = qg.shape
    dv = do.shape[-1]
    outs = _pallas(
        _backward_state_kernel, cfg,
        inputs=[("qg_ref", qg), ("kg_ref", prep["kg_ref"]), ("w_ref", prep["w_ref"]),
                ("mq_ref", prep["mq_ref"]), ("e_ref", prep["e_ref"]), ("do_ref", do),
                ("dvn_in_ref", dvn_in), ("dht_ref", dht)],
        outputs=[
            # In the operand dtype: its one reader (_chunk_dr) rounds it to that first.
            ("dvn_ref", jax.ShapeDtypeStruct((bsz, tp, heads, dv), cfg["mm_dtype"])),
            ("dhs_ref", jax.ShapeDtypeStruct((bsz, heads, cfg["n_chunks"], dk, dv),
                                             cfg["mm_dtype"])),
            ("dh0_ref", jax.ShapeDtypeStruct((bsz, heads, dk, dv), F32)),
        ],
        grid=(bsz * heads, dv // cfg["block_v"]), tune="backward_state",
        name="channelwise_backward_state",
    )
    return outs["dvn_ref"], outs["dhs_ref"], outs["dh0_ref"]


def _backward_state_mosaic(cfg, prep, do, dvn_in, dht, maps=None, dvn_heads_first=False):
    """:func:`_backward_state` on the Mosaic GPU kernel (:func:`pallas_kernels.common.
    channelwise_mosaic_gpu.channelwise_backward_state_mosaic`, GPU interpret mode under
    ``cfg["interpret"]``): the same outputs, layouts and dtypes. ``dvn_in`` (the residual's
    cotangent) is taken to the operand dtype, which it has whenever the op passes it. ``maps``:
    the forward's sequence-piece maps (:func:`_forward_mosaic`), or ``None`` (``P = 1``).
    ``dvn_heads_first``: ``dvn`` returned as ``[B, H, Tp, V]`` (for :func:`_chunk_dr`)."""
    from pallas_kernels.common import channelwise_mosaic_gpu

    if dvn_in is not None:
        dvn_in = dvn_in.astype(cfg["mm_dtype"])
    return channelwise_mosaic_gpu.channelwise_backward_state_mosaic(
        prep["qg_ref"], prep["kg_ref"], prep["w_ref"], prep["mq_ref"], prep["e_ref"], do,
        scale=cfg["scale"], dvn_in=dvn_in, dht=dht,
        alias_staging=cfg["mosaic_alias_staging"], pieces=cfg["mosaic_pieces"],
        piece_maps=maps, dvn_heads_first=dvn_heads_first, interpret=cfg["interpret"])


# ----------------------------------------------------------------------------------------------
# Kernel 4: per-chunk parameter gradients.


def _backward_chunk_kernel(q_ref, k_ref, kr_ref, gam_ref, doc_ref, conn_ref, last_ref,
                           hs_ref, dhs_ref, do_ref, vn_ref, dr_ref, dqd_ref, dkd_ref, dkrd_ref,
                           dq_ref, dk_ref, dkr_ref, dgam_ref, *, cfg):
    """Gradients of one chunk for one block of key channels (grid axis 2); module docstring.

    The share through Mq and Mk comes from ``grad_blocks`` (``dqd``, ``dkd``, ``dkrd``); this
    kernel adds the state terms and the decay factors' shares and writes dg, the within-chunk
    reverse cumsum of d gamma.
    """
    n = pl.program_id(0)
    b, h = _program_bh(cfg, 1)
    kb_id = pl.program_id(2)
    bk = cfg["block_k"]
    ksl = pl.ds(kb_id * bk, bk)
    t0 = n * CHUNK
    tsl = pl.ds(t0, CHUNK)
    mdt = cfg["mm_dtype"]
    scale = cfg["scale"]

    _, conn, last = _load_docs(cfg, doc_ref, conn_ref, last_ref, b, tsl)
    conn_last = _conn_last(conn)
    do = do_ref[b, tsl, h, :]
    vn = vn_ref[b, tsl, h, :]
    dr = dr_ref[b, tsl, h, :]  # dR = A^T dVn (= dvw) from _chunk_dr

    q = q_ref[b, tsl, h, ksl].astype(F32)
    k = k_ref[b, tsl, h, ksl].astype(F32)
    kr = kr_ref[b, tsl, h, ksl].astype(F32)
    gam = gam_ref[b, tsl, h, ksl]
    g_last = gam_ref[b, t0 + CHUNK - 1, h, ksl]
    e_in, e_out, e_all = _decay_factors(gam, g_last, conn, last, conn_last)

    # State terms; folded at once into partial gradients so few [C, BK] tiles stay live.
    s0 = hs_ref[b, h, n, ksl, :]  # [BK, V]
    ds_c = dhs_ref[b, h, n, ksl, :]  # [BK, V]
    de_all = jnp.sum(s0.astype(F32) * ds_c.astype(F32), axis=1)  # [BK]
    dq = scale * mm_nt(do, s0, mdt) * e_in  # dqg E_in
    dkr = -mm_nt(dr, s0, mdt) * e_in  # d(kr E_in) E_in
    dk = mm_nt(vn, ds_c, mdt) * e_out  # dkg E_out
    dk_out = k * dk  # d E_out * E_out
    dgam = q * dq + kr * dkr - dk_out
    is_last = _iota((CHUNK, 1), 0) == CHUNK - 1
    dgam = dgam + jnp.where(is_last, (jnp.sum(dk_out, axis=0) + de_all * e_all)[None, :], 0.0)

    # The decayed intra-chunk products Mq (X = q) and Mk (X = kr), Y = k: every block's share
    # from the grad_blocks kernel.
    dq_m = dqd_ref[b, tsl, h, ksl]
    dkr_m = dkrd_ref[b, tsl, h, ksl]
    dk_m = dkd_ref[b, tsl, h, ksl]
    dgam = dgam + q * dq_m + kr * dkr_m - k * dk_m
    dq_ref[b, tsl, h, ksl] = (dq + dq_m).astype(dq_ref.dtype)
    dkr_ref[b, tsl, h, ksl] = (dkr + dkr_m).astype(dkr_ref.dtype)
    dk_ref[b, tsl, h, ksl] = (dk + dk_m).astype(dk_ref.dtype)
    # dg = the within-chunk reverse cumsum of d gamma, as total - cumsum + self (fp32; Triton
    # lowers only the forward scan): rounding ~ eps * sum |d gamma| of the chunk.
    dgam = jnp.sum(dgam, axis=0)[None, :] - jnp.cumsum(dgam, axis=0) + dgam
    dgam_ref[b, tsl, h, ksl] = dgam


def _backward_chunk(cfg, q, k, kr, gam, docs, amat, hs, dhs, do, vn, dvn):
    """``(dq, dk, dkr, dvw, dg)``: ``dR = A^T dVn`` (:func:`_chunk_dr`, in the operand dtype,
    is dvw itself), the ``grad_blocks`` kernel, then the ``backward_chunk`` kernel."""
    dr = _chunk_dr(cfg, amat, dvn)
    grad_pass = _grad_blocks_mosaic if cfg["grad_pass"] == "mosaic" else _grad_blocks
    dqd, dkd, dkrd = grad_pass(cfg, q, k, kr, gam, docs, do, vn, dr)
    bsz, tp, heads, dk = q.shape
    tok_k = jax.ShapeDtypeStruct((bsz, tp, heads, dk), q.dtype)
    outs = _pallas(
        _backward_chunk_kernel, cfg,
        inputs=[("q_ref", q), ("k_ref", k), ("kr_ref", kr), ("gam_ref", gam)]
        + _doc_inputs(docs)
        + [("hs_ref", hs), ("dhs_ref", dhs), ("do_ref", do), ("vn_ref", vn), ("dr_ref", dr),
           ("dqd_ref", dqd), ("dkd_ref", dkd), ("dkrd_ref", dkrd)],
        outputs=[
            ("dq_ref", tok_k),
            ("dk_ref", tok_k),
            ("dkr_ref", tok_k),
            ("dgam_ref", jax.ShapeDtypeStruct((bsz, tp, heads, dk), F32)),
        ],
        grid=(cfg["n_chunks"], bsz * heads, dk // cfg["block_k"]), tune="backward_chunk",
        name="channelwise_backward_chunk",
    )
    return outs["dq_ref"], outs["dk_ref"], outs["dkr_ref"], dr, outs["dgam_ref"]


def _kr_chain(k, ks, dk, dkr):
    """``(dk, dks)`` through ``kr = k ks`` (XLA, fp32): ``dk + ks dkr`` rounded to k's dtype
    and ``dks = k dkr`` (fp32; summed over the channels for a per-token ``ks [B, T, H, 1]``).
    ``dk``, ``dkr`` as ``backward_chunk`` wrote them (operand dtype). K2
    (``grad_pass="mosaic_fused"``) does the same in its kernel."""
    dkr = dkr.astype(F32)
    dk = (dk.astype(F32) + ks.astype(F32) * dkr).astype(k.dtype)
    dks = k.astype(F32) * dkr
    if ks.shape[-1] == 1:
        dks = jnp.sum(dks, axis=-1, keepdims=True)
    return dk, dks


def _grad_chunk_mosaic(cfg, q, k, ks, gam, docs, hs, dhs, do, vn, dr_bh, g):
    """``(dq, dk, dks, dg, dvw)`` from the Mosaic GPU kernel K2
    (:func:`pallas_kernels.common.channelwise_grad_mosaic_gpu.channelwise_grad_chunk_mosaic`):
    ``grad_blocks``, ``backward_chunk`` and :func:`_kr_chain` in one kernel, the same values,
    dtypes and layouts (``dks`` fp32 before its cast to ks's dtype). K2 forms ``kr = k ks``
    itself (the same fp32 product, rounded once), so no ``kr`` is passed. ``dr_bh``: ``dR``
    ``[B, H, T, V]`` (:func:`_chunk_dr` with ``heads_first``); K2 returns it as ``dvw`` ``[B,
    T, H, V]``. ``g``: the unfloored log-decay; K2 returns ``dg`` through the floor
    (``validation.floor_log_decay_grad``)."""
    from pallas_kernels.common import channelwise_grad_mosaic_gpu

    return channelwise_grad_mosaic_gpu.channelwise_grad_chunk_mosaic(
        q, k, ks, gam, hs, dhs, do, vn, dr_bh, scale=cfg["scale"],
        doc=docs[0] if docs else None, slab=cfg["mosaic_grad_slab"], interpret=cfg["interpret"],
        dr_heads_first=True, g=g)


# ----------------------------------------------------------------------------------------------
# custom_vjp wiring and entry points.


def _local_mosaic(cfg, q, k, v, ks, vs) -> bool:
    """Whether the chunk-local forward runs on the Mosaic GPU kernel (``cfg["chunk_local"]``,
    :data:`TUNING`'s ``"chunk_local"`` resolved by :func:`_config`) for these operands; where
    that kernel refuses them (GDN-2's per-channel scales) the Triton kernels run, logged once."""
    if cfg["chunk_local"] != "mosaic":
        return False
    from pallas_kernels.common import channelwise_local_mosaic_gpu as clm

    why = clm.unsupported_reason(q, k, v, ks, vs)
    if why is not None:
        validation.log_once("channelwise_delta_pallas",
                            f"TUNING['chunk_local']='mosaic': using the Triton kernels: {why}")
        return False
    return True


@functools.lru_cache(maxsize=None)
def _make_core(static):
    """Builds the ``custom_vjp`` op for one static configuration (cached)."""
    cfg = dict(static)
    residual = cfg["return_residual"]

    def forward(q, k, v, ks, vs, g, h0, docs, *, save):
        # The within-chunk cumsum of g runs here, so the backward returns dg (not d gamma).
        if _local_mosaic(cfg, q, k, v, ks, vs):
            from pallas_kernels.common import channelwise_local_mosaic_gpu as clm

            prep, gam = clm.channelwise_local_mosaic(q, k, v, ks, vs, g, docs, save_a=save,
                                                     interpret=cfg["interpret"])
        else:
            gam = _gamma(cfg, g)
            prep = _prepare(cfg, q, k, v, ks, vs, gam, docs, save_a=save)
        if cfg["state_pass"] == "mosaic":  # maps: the sequence pieces' (None when P = 1)
            o, ht, vn, hs, *maps = _forward_mosaic(cfg, prep, h0, save=save)
        else:
            (o, ht, vn, hs), maps = _forward(cfg, prep, h0, save=save), ()
        return o, ht, vn, hs, prep, gam, maps[0] if maps else None

    @jax.custom_vjp
    def core(q, k, v, ks, vs, g, h0, docs):
        o, ht, vn, _, _, _, _ = forward(q, k, v, ks, vs, g, h0, docs, save=False)
        return (o, ht, vn) if residual else (o, ht)

    def core_fwd(q, k, v, ks, vs, g, h0, docs):
        o, ht, vn, hs, prep, gam, maps = forward(q, k, v, ks, vs, g, h0, docs, save=True)
        out = (o, ht, vn) if residual else (o, ht)
        keep = {n: prep[n] for n in ("qg_ref", "kg_ref", "w_ref", "mq_ref", "e_ref", "a_ref")}
        return out, (q, k, v, ks, vs, g, gam, docs, keep, hs, vn, maps)

    def core_bwd(res, cts):
        q, k, v, ks, vs, g, gam, docs, prep, hs, vn, maps = res
        do = cts[0].astype(q.dtype)
        dvn_out = cts[2] if residual else None
        fused = cfg["grad_pass"] == "mosaic_fused"
        # With K2, dVn's only reader is _chunk_dr's product: the Mosaic pass writes it in the
        # product's layout [B, H, T, V] (no transpose in XLA).
        dvn_heads_first = fused and cfg["state_pass"] == "mosaic"
        if cfg["state_pass"] == "mosaic":  # the forward's piece maps, not formed again
            dvn, dhs, dh0 = _backward_state_mosaic(cfg, prep, do, dvn_out, cts[1], maps,
                                                   dvn_heads_first=dvn_heads_first)
        else:
            dvn, dhs, dh0 = _backward_state(cfg, prep, do, dvn_out, cts[1])
        vf, vsf = v.astype(F32), vs.astype(F32)
        if fused:  # K2: grad_blocks + backward_chunk + kr chain
            # dR heads-first (no transpose in XLA); K2 forms kr = k ks itself and hands dR
            # back as dvw [B, T, H, V].
            dr_bh = _chunk_dr(cfg, prep["a_ref"], dvn, heads_first=True,
                              dvn_heads_first=dvn_heads_first)
            # K2 also takes dg through the log-decay's floor (no XLA pass over g and dg).
            dq, dk, dks, dg, dvw = _grad_chunk_mosaic(cfg, q, k, ks, gam, docs, hs, dhs, do, vn,
                                                      dr_bh, g)
        else:
            # kr as the forward kernels formed it (the fp32 product rounded once); the
            # backward kernels read it whole.
            kr = (k.astype(F32) * ks.astype(F32)).astype(k.dtype)
            dq, dk, dkr, dvw, dg = _backward_chunk(cfg, q, k, kr, gam, docs, prep["a_ref"],
                                                   hs, dhs, do, vn, dvn)
            dk, dks = _kr_chain(k, ks, dk, dkr)
            dg = validation.floor_log_decay_grad(g, dg)
        # Through vw = v vs (fp32): dv = vs dvw, dvs = v dvw (summed over the channels vs
        # broadcasts over); kr = k ks in _kr_chain.
        dvw = dvw.astype(F32)
        dv = (vsf * dvw).astype(v.dtype)
        dvs = vf * dvw
        if vs.shape[-1] == 1:
            dvs = jnp.sum(dvs, axis=-1, keepdims=True)
        return (dq, dk, dv, dks.astype(ks.dtype), dvs.astype(vs.dtype), dg, dh0,
                tuple(None for _ in docs))

    core.defvjp(core_fwd, core_bwd)
    return core


def channelwise_delta_pallas(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    k_scale: jax.Array,
    v_scale: jax.Array,
    *,
    scale: float,
    initial_state: Optional[jax.Array] = None,
    segment_ids: Optional[jax.Array] = None,
    return_residual: bool = True,
    interpret: bool = False,
    state_pass: Optional[str] = None,
    grad_pass: Optional[str] = None,
) -> Tuple[jax.Array, jax.Array, Optional[jax.Array]]:
    """The per-channel-decay delta rule on the Pallas GPU kernels (module docstring).

    ``u_t = vw_t - (Diag(e^{g_t}) S_{t-1})^T kr_t``, ``S_t = Diag(e^{g_t}) S_{t-1} + k_t u_t^T``,
    ``o_t = scale S_t^T q_t`` (paper arXiv 2607.07953, Eqs. 18-24; spec §2.4/§2.6) with the read
    key ``kr_t = k_t * k_scale_t`` and the write value ``vw_t = v_t * v_scale_t`` (KDA: both
    scales beta_t; GDN-2: the erase gate b_t and the write gate w_t), each product formed in
    fp32 inside the kernels and rounded once to the operand dtype (no separate XLA pass over k
    and v); the same result as
    :func:`pallas_kernels.common.channelwise_chunked.channelwise_delta_chunked` given ``kr`` and
    ``vw``. Gradients w.r.t. q, k, v, g, both scales and ``initial_state`` come from the
    kernels' ``custom_vjp``.

    Args:
      q: queries ``[B, T, H, K]`` (already expanded to the value heads), bf16/fp16/fp32.
      k: keys ``[B, T, H, K]`` (the write key).
      v: values ``[B, T, H, V]``.
      g: per-key-channel log-decay ``[B, T, H, K]`` (natural log, ``<= 0``); fp32 internally.
        Values under ``LOG_DECAY_FLOOR`` (-128; ``-inf`` included) are raised to it inside
        the kernels, with ``validation.floor_log_decay``'s values and gradients.
      k_scale: the read key's scale, ``[B, T, H]`` (one per head and token) or ``[B, T, H, K]``;
        any float dtype (read as is, taken to fp32 in the kernels; its gradient in its dtype).
      v_scale: the write value's scale, ``[B, T, H]`` or ``[B, T, H, V]``; as ``k_scale``.
      scale: read-out scale.
      initial_state: ``[B, H, K, V]`` (fp32) or ``None`` for zeros.
      segment_ids: optional int ``[B, T]``; the state resets where the id changes.
      return_residual: whether to compute the residual ``u`` (``v_new``).
      interpret: run in Pallas interpret mode (any backend; slow; the Mosaic state pass in
        Mosaic GPU interpret mode).
      state_pass: the forward and reverse state passes, ``"triton"`` or ``"mosaic"`` (the
        Hopper kernels of :mod:`pallas_kernels.common.channelwise_mosaic_gpu`; need sm_90
        when compiled); ``None``: ``TUNING["state_pass"]``. fp32 operands always take the
        Triton kernels (logged once). ``TUNING``'s ``"mosaic"`` takes them too below sm_90
        (an A100) or without a GPU, logged once; a per-call ``"mosaic"`` there raises
        (:func:`pallas_kernels.common.mosaic_gpu.resolve_pass` decides both). Everything
        else (intra, prepare, wu, grad_blocks, backward_chunk) is the same either way.
      grad_pass: the gradients through Mq and Mk, ``"triton"`` (``grad_blocks``),
        ``"mosaic"`` (K1, :mod:`pallas_kernels.common.channelwise_grad_mosaic_gpu`; sm_90 when
        compiled) or ``"mosaic_fused"`` (K2: K1 with ``backward_chunk`` and the kr chain rule
        in one kernel; sm_90); ``None``: ``TUNING["grad_pass"]``. Resolved as
        ``state_pass``: fp32 operands take Triton, as does ``TUNING``'s Mosaic value below
        sm_90; a per-call Mosaic value there raises.

    Returns:
      ``(o [B, T, H, V], final_state [B, H, K, V] fp32, u [B, T, H, V] or None)``; o and u in
      the operand dtype (bf16/fp16 when q, k, v all are, else fp32).

    Raises:
      ValueError: if K or V is not 64 or 128 (callers dispatch those to the chunked form),
        ``k_scale`` / ``v_scale`` (named) is not a float array shaped ``[B, T, H]`` or like
        ``k`` / ``v``, ``state_pass`` is not ``"triton"``, ``"mosaic"`` or ``None``, or
        ``grad_pass`` not one of :data:`GRAD_PASSES` or ``None``.
      UnsupportedImplementationError: (a ``ValueError``) a per-call Mosaic ``state_pass`` or
        ``grad_pass`` with 16-bit operands outside interpret mode, where the default backend
        is not a CUDA GPU of compute capability 9.x (Hopper): ``"channelwise_delta_pallas:
        state_pass='mosaic' cannot run this call: ... this GPU has 8.0. Use
        state_pass='triton' ..."``.
    """
    from pallas_kernels import common

    bsz, seq_len, heads, dk = q.shape
    dv = v.shape[-1]
    if dk not in pallas_gpu.SUPPORTED_HEAD_DIMS or dv not in pallas_gpu.SUPPORTED_HEAD_DIMS:
        raise ValueError(f"the Pallas kernels support head dims {pallas_gpu.SUPPORTED_HEAD_DIMS},"
                         f" got K={dk}, V={dv}")
    scales = []
    for name, x, like in (("k_scale", k_scale, k), ("v_scale", v_scale, v)):
        if x.shape == like.shape[:3]:
            x = x[..., None]
        elif x.shape != like.shape:
            raise ValueError(f"{name} must be shaped {like.shape[:3]} or {like.shape}, "
                             f"got {x.shape}")
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise ValueError(f"{name} must be a float array, got {x.dtype}")
        scales.append(common.pad_time(x, CHUNK))  # its own dtype: the kernels take it to fp32
    mdt = pallas_gpu.matmul_dtype(q, k, v)
    padded = -(-seq_len // CHUNK) * CHUNK
    n_chunks = padded // CHUNK
    q, k, v = (common.pad_time(x.astype(mdt), CHUNK) for x in (q, k, v))
    cfg = _config(
        batch=bsz, heads=heads, n_chunks=n_chunks, dk=dk, dv=dv, scale=float(scale),
        has_docs=segment_ids is not None, mm_dtype=mdt, interpret=interpret,
        return_residual=return_residual, state_pass=state_pass, grad_pass=grad_pass,
    )
    gpad = common.pad_time(g.astype(F32), CHUNK)  # [B, Tp, H, K]; padding is inert (g = 0)
    if initial_state is None:
        initial_state = jnp.zeros((bsz, heads, dk, dv), F32)
    h0 = initial_state.astype(F32)
    docs = () if segment_ids is None else pallas_gpu.docs_from_segment_ids(segment_ids, padded)
    outs = _make_core(tuple(sorted(cfg.items())))(q, k, v, *scales, gpad, h0, docs)
    u = outs[2][:, :seq_len] if return_residual else None
    return outs[0][:, :seq_len], outs[1], u


def choose_implementation(op, implementation, concrete, arrays, head_dims, chunk_size, seq_len):
    """``pallas_gpu.choose_implementation`` for KDA/GDN-2, with ``"auto"`` gated on AUTO_SELECT.

    With :data:`AUTO_SELECT` off, ``None``/``"auto"`` resolves to ``concrete[0]`` (the chunked
    form) even on a GPU; explicit ``"pallas"``/``"pallas_interpret"`` are resolved (and
    rejected with the reason where they cannot run) by ``pallas_gpu.choose_implementation``.
    Usable as the ``fallback`` of ``pallas_tpu.choose_implementation``.

    Raises:
      ValueError: for an unknown name, or a kernel implementation that cannot run this call.
    """
    if (implementation is None or implementation == "auto") and not AUTO_SELECT:
        return validation.resolve_implementation(implementation, tuple(concrete), op)
    return pallas_gpu.choose_implementation(op, implementation, concrete, arrays, head_dims,
                                            chunk_size, seq_len)
