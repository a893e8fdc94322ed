"""The split WY preparation of the Mosaic GPU GDN forward: ``T0`` and ``forward="fused_t0"``.

``pallas_kernels/gated_delta_rule/kernel_mosaic_gpu.py`` has
:func:`chunk_kkt_inverse_mosaic`, the gate-free inverse ``T0 = (I + A0)^{-1}``
(``A0_ij = beta_i k_i . k_j``, ``j < i``, same document) of every 64-token chunk, and
``kernel_mosaic_gpu_fused.py`` has :func:`chunk_delta_fused_t0_fwd_mosaic`, the fused forward
that reads ``v`` and ``T0`` and forms ``v_new = (T0 * e^{G_i - G_j} * beta_j)
(V - diag(conn e^G) K S)`` itself; ``gated_delta_rule_fwd_mosaic`` and
``mosaic_vjp.gated_delta_rule_mosaic`` run them as ``forward="fused_t0"`` (issue 29, not
dispatched, not run on a GPU yet).

* ``KktInverseInterpretTest`` (``slow``) runs the ``T0`` kernel in Mosaic GPU interpret mode
  against a float64 numpy inverse per chunk (bf16 and fp16 keys, documents starting inside
  chunks, a partial last chunk, GVA, strongly correlated keys): within 10 % of the float64
  inverse's own rounding to the input dtype, and exactly zero above the diagonal and between
  documents.
* ``FusedT0InterpretTest`` (``slow``) runs the ``T0`` kernel and the fused kernel (all stores
  on) against the fp32 token-serial ``lax.scan`` reference
  (:func:`pallas_kernels.gated_delta_rule.reference.gated_delta_rule_reference`):
  ``kernel_mosaic_gdn_test.py``'s cases (packed documents with starts at, inside and after chunk
  boundaries, strong decay, partial last chunk, GVA, ``initial_state``, DeltaNet) in bf16 and two
  in fp16, with dtype-chosen gates (relative RMS; bf16 also ``assert_allclose`` at the bf16
  forward tolerance). It also checks the whole forward with ``forward="fused_t0"`` against the
  reference and the three-pass forward, with both ``wy_implementation``s.
* ``FusedT0SplitInterpretTest`` (``slow``): the same kernel, forward and VJP checks with
  ``split_output=True`` (``forward="fused_t0_split"``, three warpgroups in jla's layout: the
  output warpgroup forms ``Ag`` from ``T0`` elementwise a chunk ahead, the state warpgroup
  ``v_new = Ag X``).
  Also every ``split_order`` and ``split_stages`` (the three-stage ring of MOSAIC_GPU.md
  Sec. 17) bit-equal to the default, and ``prepare_mid`` with three stages against the
  reference. ``LoweringTest`` (CI) exports ``prepare_mid`` with three stages (K = V = 128
  bf16 with ``h0`` and documents, which also checks the 227 KB SMEM limit; K 64 fp16
  DeltaNet; K 128 / V 64) and runs a model of the three warpgroups' barrier protocol under
  random schedules (no deadlock, no lapped phase, no buffer overwritten while read).
  ``state_layout="vk"`` (the state carried transposed) and ``split_order="shared_mask"``
  (MOSAIC_GPU.md Sec. 35): bit-equal to the default interpreted, ``vk`` against the
  reference and through the op's VJP; CI exports ``vk`` (``state_ag``, three stages, GVA).
* ``VjpInterpretTest`` (``slow``): ``jax.vjp`` of the op with ``forward="fused_t0"`` (``W``
  formed by the ``T0`` kernel for the unchanged backward; in XLA before Sec. 36) against
  ``jax.vjp`` of the fp32 chunk form, with ``kernel_mosaic_gdn_fused_test.py``'s gates.
  ``LoweringTest.test_rows_with_few_ctas_run_pieces_or_three_pass``: ``mosaic_vjp.resolve_forward``,
* ``KktInverseWInterpretTest`` (``slow``): ``return_w=True`` of the ``T0`` kernel (the
  backward's ``W`` formed in the kernel, MOSAIC_GPU.md Sec. 36): the same ``T0`` bit for bit,
  ``W`` against the fp32 WY factor within 2 % of that factor's own rounding to the input dtype
  (GVA, documents starting inside chunks, a partial last chunk, several chunks per CTA so the
  key ring and its ``W`` staging wrap, fp16 DeltaNet).
* ``XlaFormTest`` (CI): the XLA helpers ``kkt_inverse_xla`` and ``w_from_t0`` against float64
  and the fp32 WY factors of ``chunked.wy_representation``.
* ``LoweringTest`` (CI) exports the ``T0`` kernel, the fused ``T0`` kernel, the forward and the
  op's gradient for CUDA on the CPU host (``jax.export``; one variant each, about 1 to 5 s on 2
  cores), and the split kernel; ``LoweringSlowTest`` (``slow``) the other head dims and options
  and the forward with ``"fused_t0_split"``.
* ``FusedT0StagesTest`` (CI): the two-warpgroup kernel's timing ablations (``stages``,
  MOSAIC_GPU.md Sec. 16) export for CUDA under their own names and leave the default's jaxpr
  alone; ``FusedT0StagesInterpretTest`` (``slow``) checks what ``io``, ``state`` and
  ``no_store`` compute against ``full``.
* ``SplitStagesTest`` (CI): the three-warpgroup kernel's timing ablations (``stages`` with
  ``split_output``, ``kfused.SPLIT_T0_STAGES``, MOSAIC_GPU.md Sec. 39) export for CUDA under
  their own names, ``"full"`` leaves the production kernel's jaxpr alone, bad combinations are
  refused; ``SplitStagesInterpretTest`` (``slow``) checks what each stage computes
  (``state_ag``, three stages) against ``full``, the fp32 reference and a float64 read-out.
* ``split_protocol="early_s"`` (MOSAIC_GPU.md Sec. 40: ``S_c`` announced on its own barrier
  so the read-out's ``Q S_c`` is issued before ``v_new`` exists): CI runs the protocol model
  with it (and finds the two races it guards against), exports it for CUDA (K = V = 128 bf16,
  ``state_ag``, three stages: the 227 KB limit), checks that ``"joint"`` is the default's jaxpr
  and the refusals; ``SplitProtocolInterpretTest`` and ``FusedT0SplitInterpretTest``
  (``slow``) check it against the reference and bit for bit against the default in every
  order; ``LoweringSlowTest`` exports the other orders.
* ``GpuTest`` (``gpu``) runs the compiled kernels on a Hopper GPU at realistic rows.

The interpreted kernels hang on a 2-core host unless XLA's CPU pool is larger (BUILD.md,
MOSAIC_GPU.md Sec. 10): run them as
``PJRT_NPROC=8 timeout 900 python -m pytest -q -m slow
tests/pallas_kernels/kernel_mosaic_gdn_t0_test.py``.
"""

import sys
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest, parameterized

from pallas_kernels import common
from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu as kgd
from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu_fused as kfused
from pallas_kernels.gated_delta_rule import mosaic_vjp
from tests import tolerances
from tests.pallas_kernels import kernel_mosaic_gdn_bwd_test as bwd_test
from tests.pallas_kernels import kernel_mosaic_gdn_fused_test as fused_test
from tests.pallas_kernels import kernel_mosaic_gdn_test as gdn_test
from tests.pallas_kernels import kernel_mosaic_gdn_wy_test as wy_test
from tests.pallas_kernels import kernel_mosaic_gpu_test as kmg_test

C = kgd.CHUNK
# Relative RMS gates against the fp32 / fp64 references, by input dtype. bf16: the GPU kernels'
# forward gate (BUILD.md); measured (interpreted, 2026-12-03) 1.7e-3 to 3.2e-3 on the six bf16
# cases. fp16 carries three more mantissa bits: measured 2.4e-4 to 3.5e-4, gated at 1e-3.
_FWD_GATE = {jnp.dtype(jnp.bfloat16): 5e-3, jnp.dtype(jnp.float16): 1e-3}
# T0 - I against float64: at most 10 % above the error of the float64 inverse rounded to the
# input dtype (the doubling's fp16 merges alone gave bf16 2.2e-3 and fp16 1.4e-3 on correlated
# keys; with the Newton step the kernel's error equals the rounding's to three digits: bf16
# 1.4e-3 to 1.7e-3, fp16 1.8e-4 to 2.0e-4).
_T0_OVER_ROUNDING = 1.1


def _inputs(batch, seq_len, heads, kv_heads, dk, dv, decay, h0, docs, dtype=jnp.bfloat16, *,
            correlated=0.0, seed=0):
    """``kernel_mosaic_gdn_test._inputs`` (``q, k`` L2-normalised) in ``dtype``; with
    ``correlated``, the keys and ``beta`` of ``kernel_mosaic_gdn_wy_test._inputs``."""
    q, k, v, g, beta, state, seg = gdn_test._inputs(batch, seq_len, heads, kv_heads, dk, dv,
                                                    decay=decay, h0=h0, docs=docs, seed=seed)
    if correlated:
        k, v, g, beta, seg = wy_test._inputs(batch, seq_len, heads, kv_heads, dk, dv,
                                             decay=decay, docs=docs, correlated=correlated,
                                             seed=seed)
    q, k, v = (x.astype(jnp.float32).astype(dtype) for x in (q, k, v))
    return q, k, v, g, beta, state, seg


def _document_index(seg, batch, seq_len):
    """int64 ``[B, T]``: each token's document number (``common.document_index``), all 0
    without ``segment_ids``."""
    if seg is None:
        return np.zeros((batch, seq_len), np.int64)
    return np.asarray(common.document_index(seg))


def _check_io_and_state_stages(run, v, state, vn_full, final_full):
    """The ``io`` and ``state`` ablations of a fused ``T0`` forward kernel (``run(stages)``
    returns its four outputs): ``io`` gives ``v`` back and leaves the state, ``state`` gives
    the full kernel's ``v_new`` and final state, bit for bit."""
    o_io, final_io, _, _ = run("io")
    np.testing.assert_array_equal(np.asarray(o_io), np.asarray(v))
    np.testing.assert_array_equal(np.asarray(final_io), np.asarray(state))
    o_state, final_state, _, _ = run("state")
    np.testing.assert_array_equal(np.asarray(o_state), np.asarray(vn_full))
    np.testing.assert_array_equal(np.asarray(final_state), np.asarray(final_full))


def _t0_reference(k, beta, seg):
    """float64 ``T0`` ``[B, T, H, 64]``: ``inv(I + A0)`` of every chunk (the last one as long
    as it is), ``A0_ij = beta_i k_i . k_j`` on ``j < i`` in the same document."""
    batch, seq_len, heads = beta.shape
    kf = np.asarray(gdn_test._expand(k, heads), np.float64)
    bf = np.asarray(beta, np.float64)
    doc = _document_index(seg, batch, seq_len)
    out = np.zeros((batch, seq_len, heads, C))
    for b in range(batch):
        for start in range(0, seq_len, C):
            rows = slice(start, min(start + C, seq_len))
            n = rows.stop - rows.start
            d = doc[b, rows]
            strict = np.tril(np.ones((n, n), bool), -1) & (d[:, None] == d[None, :])
            for h in range(heads):
                kc = kf[b, rows, h]
                a0 = np.where(strict, bf[b, rows, h][:, None] * (kc @ kc.T), 0.0)
                out[b, rows, h, :n] = np.linalg.inv(np.eye(n) + a0)
    return out


def _check_t0(test, k, beta, seg, t0, gate=None):
    """``t0`` (kernel or XLA) against float64: shape, relative RMS of ``T0 - I`` (the unit
    diagonal would hide the error) below ``gate`` (default: 1.1 times that of the float64
    inverse rounded to ``t0``'s dtype) and exact zeros outside causal same-document pairs.
    Returns the relative RMS error and the max abs error."""
    batch, seq_len, heads = beta.shape
    test.assertEqual(t0.shape, (batch, seq_len, heads, C))
    want = _t0_reference(k, beta, seg)
    got = np.asarray(t0, np.float64)
    eye = np.zeros_like(want)
    idx = np.arange(seq_len)
    eye[:, idx, :, idx % C] = 1.0
    err = tolerances.rel_err(got - eye, want - eye)
    if gate is None:
        rounded = np.asarray(jnp.asarray(want, jnp.float32).astype(t0.dtype), np.float64)
        gate = _T0_OVER_ROUNDING * tolerances.rel_err(rounded - eye, want - eye)
    test.assertLess(err, gate, msg=f"T0 - I: relative RMS error {err:.2e} (gate {gate:.2e})")
    np.testing.assert_array_equal(got[want == 0.0], 0.0)  # structure: exact zeros
    return err, float(np.abs(got - want).max())


def _check_fused_kernel(test, batch, seq_len, heads, kv_heads, dk, dv, decay, h0, docs,
                        dtype=jnp.bfloat16, *, seed=0, interpret=True, allclose=True,
                        split_output=False, split_order=kfused.SPLIT_DEFAULT_ORDER,
                        split_stages=kfused.STAGES, state_layout="kv",
                        split_protocol=kfused.SPLIT_DEFAULT_PROTOCOL):
    """The ``T0`` kernel then the fused ``T0`` kernel (all stores on; three warpgroups with
    ``split_output``, in ``split_order``, with a ``split_stages``-deep ring and
    ``split_protocol``) against the
    token-serial reference. Returns the relative RMS errors."""
    q, k, v, g, beta, state, seg = _inputs(batch, seq_len, heads, kv_heads, dk, dv, decay, h0,
                                           docs, dtype, seed=seed)
    scale = dk ** -0.5
    t0 = kgd.chunk_kkt_inverse_mosaic(k, beta, segment_ids=seg, interpret=interpret)
    o, final, v_new, h = kfused.chunk_delta_fused_t0_fwd_mosaic(
        q, k, v, t0, g, beta, scale=scale, initial_state=state, segment_ids=seg,
        store_v_new=True, store_h=True, split_output=split_output, interpret=interpret,
        split_order=split_order, split_stages=split_stages, state_layout=state_layout,
        split_protocol=split_protocol)
    want_o, want_final, want_u = gdn_test._reference(q, k, v, g, beta, state, seg, scale)
    want_h = gdn_test._reference_chunk_states(k, v, g, beta, state, seg)
    test.assertEqual((o.shape, o.dtype), (v.shape, v.dtype))
    test.assertEqual((final.shape, final.dtype), (want_final.shape, jnp.float32))
    test.assertEqual((v_new.shape, v_new.dtype), (v.shape, v.dtype))
    test.assertEqual((h.shape, h.dtype), (want_h.shape, v.dtype))
    errs = {}
    for name, got, want in (("o", o, want_o), ("final_state", final, want_final),
                            ("v_new", v_new, want_u), ("h", h, want_h)):
        gdn_test._assert_close(test, name, got, want, max_err=_FWD_GATE[jnp.dtype(dtype)],
                               allclose=allclose and dtype == jnp.bfloat16)
        errs[name] = tolerances.rel_err(got, want)
    return errs


def _check_forward(test, batch, seq_len, heads, kv_heads, dk, dv, decay, h0, docs,
                   wy_implementation="mosaic", *, seed=0, interpret=True, forward="fused_t0"):
    """``gated_delta_rule_fwd_mosaic(forward=forward)`` (``"fused_t0"`` or
    ``"fused_t0_split"``) against the reference (5e-3) and
    no worse than the three-pass forward (its relative RMS error against the reference at most
    10 % plus 1e-4 above the three-pass one's; the two differ from each other by about as much
    as each from the reference, 2.3e-3 to 2.6e-3 on ``o``: different roundings, ``T0`` instead
    of ``W, U``). Returns ``{name: (fused_t0 error, three-pass error)}``."""
    q, k, v, g, beta, state, seg = _inputs(batch, seq_len, heads, kv_heads, dk, dv, decay, h0,
                                           docs, seed=seed)
    scale = dk ** -0.5

    def run(forward):
        return kgd.gated_delta_rule_fwd_mosaic(
            q, k, v, g, beta, scale=scale, initial_state=state, segment_ids=seg,
            return_residual=True, wy_implementation=wy_implementation, forward=forward,
            interpret=interpret)

    t0_fwd, three = run(forward), run("three_pass")
    want = gdn_test._reference(q, k, v, g, beta, state, seg, scale)
    errs = {}
    for name, got, other, ref in zip(("o", "final_state", "v_new"), t0_fwd, three, want):
        test.assertEqual((got.shape, got.dtype), (other.shape, other.dtype), msg=name)
        gdn_test._assert_close(test, name, got, ref, allclose=False)
        err, err_three = tolerances.rel_err(got, ref), tolerances.rel_err(other, ref)
        test.assertLess(err, 1.1 * err_three + 1e-4,
                        msg=f"{name}: relative RMS error {err:.2e} (three-pass {err_three:.2e})")
        errs[name] = (err, err_three)
    return errs


# B, T, H, Hk, K, V, decay (None: DeltaNet), h0, document lengths (the rest one more), dtype
_T0_CASES = (
    ("plain_T128_K64", 1, 128, 1, 1, 64, 64, 0.1, False, None, jnp.bfloat16, 0.0),
    # starts at 64 (a chunk boundary), 100 (inside chunk 1) and 130 (inside the partial chunk 2)
    ("gva_packed_partial_T150_K64", 1, 150, 2, 1, 64, 64, 0.02, False, (64, 36, 30),
     jnp.bfloat16, 0.0),
    ("gva_packed_T192_K128", 2, 192, 4, 2, 128, 64, 0.1, False, (70, 30), jnp.bfloat16, 0.0),
    ("fp16_packed_partial_T100_K128", 1, 100, 1, 1, 128, 64, 0.1, False, (10, 60),
     jnp.float16, 0.0),
    # keys sharing one direction (k_i . k_j about 0.9), beta near 1: the inverse's hard case
    ("correlated_T128_K128", 1, 128, 2, 1, 128, 64, 0.01, False, None, jnp.bfloat16, 3.0),
    ("correlated_fp16_packed_T150_K64", 1, 150, 1, 1, 64, 64, None, False, (40,), jnp.float16,
     3.0),
)

# The fused cases: kernel_mosaic_gdn_test's bf16 ones and two in fp16.
_FUSED_CASES = tuple(gdn_test._CPU_CASES) + (
    ("fp16_gva_h0_packed_partial_T150_K64_V128", 1, 150, 2, 1, 64, 128, 0.02, True,
     (64, 36, 30), jnp.float16),
    ("fp16_deltanet_h0_T100_K128_V64", 1, 100, 1, 1, 128, 64, None, True, None, jnp.float16),
)


# Slow (out of CI): interpreted Mosaic GPU kernels (MOSAIC_GPU.md, "Interpreter hang seen";
# run with PJRT_NPROC=8). The mark is on the class: absl's parameterized copies of a method do
# not keep a method-level mark.
@pytest.mark.slow
class KktInverseInterpretTest(parameterized.TestCase):

    @parameterized.named_parameters(*_T0_CASES)
    def test_t0_matches_float64(self, batch, seq_len, heads, kv_heads, dk, dv, decay, h0, docs,
                                dtype, correlated):
        _, k, _, _, beta, _, seg = _inputs(batch, seq_len, heads, kv_heads, dk, dv, decay, h0,
                                           docs, dtype, correlated=correlated)
        # The doubling (Sec. 12); the default substitution with split merges has the same
        # cases in kernel_mosaic_kkt_test.KktSplitMergeInterpretTest.
        t0 = kgd.chunk_kkt_inverse_mosaic(k, beta, segment_ids=seg, inverse="doubling",
                                          interpret=True)
        self.assertEqual(t0.dtype, k.dtype)
        _check_t0(self, k, beta, seg, t0)


# Whole-forward cases of _check_forward, shared by the two-warpgroup and the split layouts.
_FORWARD_CASES = (
    ("gva_h0_packed_partial_T150_K64_V128", 1, 150, 2, 1, 64, 128, 0.02, True, (64, 36, 30)),
    ("deltanet_packed_T128_K64_V64", 1, 128, 1, 1, 64, 64, None, False, (10, 60)),
    ("xla_t0_strong_decay_h0_partial_T65_K128_V64", 2, 65, 1, 1, 128, 64, 5.0, True, None,
     "xla"),
)


def _check_split_variants_bit_equal(test, inputs, interpret, variants=None):
    """Every ``(split_order, split_stages[, state_layout or a dict of further keyword
    arguments])`` of ``variants`` (default: all orders and depths) of the split kernel (all
    stores on) gives the default's ``o``, final state, ``v_new`` and ``h`` bit for bit."""
    q, k, v, g, beta, state, seg = inputs
    t0 = kgd.chunk_kkt_inverse_mosaic(k, beta, segment_ids=seg, interpret=interpret)

    def run(**kw):
        return kfused.chunk_delta_fused_t0_fwd_mosaic(
            q, k, v, t0, g, beta, scale=q.shape[-1] ** -0.5, initial_state=state,
            segment_ids=seg, store_v_new=True, store_h=True, split_output=True,
            interpret=interpret, **kw)

    default = [np.asarray(x, np.float32) for x in run()]
    if variants is None:
        variants = [(order, depth) for order in kfused.SPLIT_ORDERS
                    for depth in kfused.SPLIT_STAGES]
    for order, depth, *layout in variants:  # (order, depth[, state_layout or kwargs])
        extra = layout[0] if layout and isinstance(layout[0], dict) else {
            "state_layout": layout[0] if layout else "kv"}
        got = run(split_order=order, split_stages=depth, **extra)
        for name, a, b in zip(("o", "final_state", "v_new", "h"), got, default, strict=True):
            np.testing.assert_array_equal(np.asarray(a, np.float32), b,
                                          err_msg=f"{name}, {order}, {depth} stages {layout}")


def _check_optional_stores(split_output):
    """``fused_test._check_optional_stores`` for ``chunk_delta_fused_t0_fwd_mosaic``."""
    q, k, v, g, beta, state, seg = _inputs(1, 150, 2, 1, 64, 64, 0.05, True, (64, 36, 30))
    t0 = kgd.chunk_kkt_inverse_mosaic(k, beta, segment_ids=seg, interpret=True)

    def run(store):
        return kfused.chunk_delta_fused_t0_fwd_mosaic(
            q, k, v, t0, g, beta, scale=0.125, initial_state=state, segment_ids=seg,
            store_v_new=store, store_h=store, split_output=split_output, interpret=True)

    fused_test._check_optional_stores(run)


@pytest.mark.slow
class FusedT0InterpretTest(parameterized.TestCase):

    @parameterized.named_parameters(*_FUSED_CASES)
    def test_fused_t0_kernel_matches_reference(self, *case):
        _check_fused_kernel(self, *case)

    def test_optional_stores_change_nothing_else(self):
        _check_optional_stores(split_output=False)

    @parameterized.named_parameters(*_FORWARD_CASES)
    def test_forward_fused_t0_matches_reference_and_three_pass(self, *case):
        _check_forward(self, *case)


@pytest.mark.slow
class FusedT0SplitInterpretTest(parameterized.TestCase):
    """``split_output=True`` (``forward="fused_t0_split"``): the same checks."""

    @parameterized.named_parameters(*_FUSED_CASES)
    def test_fused_t0_split_kernel_matches_reference(self, *case):
        _check_fused_kernel(self, *case, split_output=True)

    def test_optional_stores_change_nothing_else(self):
        _check_optional_stores(split_output=True)

    @parameterized.named_parameters(*_FORWARD_CASES)
    def test_forward_fused_t0_split_matches_reference_and_three_pass(self, *case):
        _check_forward(self, *case, forward="fused_t0_split")

    def test_vjp_fused_t0_split_matches_chunked_vjp(self):
        fused_test._check_vjp(self, bwd_test._pipeline_inputs(
            1, 150, 2, 1, 64, 64, 0.05, True, True, (64, 36, 30)), True, "fused_t0_split")

    @parameterized.named_parameters(*_FUSED_CASES)
    def test_fused_t0_split_prepare_first_matches_reference(self, *case):
        _check_fused_kernel(self, *case, split_output=True, split_order="prepare_first")

    def test_split_orders_and_depths_give_identical_outputs(self):
        # The same arithmetic in another order of the output warpgroup's tasks, or with a
        # three-stage ring (vd_s aliasing x_s; the RefUnion of sb_s and state_s is GPU-only):
        # bit for bit. T 300: five chunks, so the three-stage ring wraps, the last one partial
        # (44 tokens); documents start inside chunks (64, 36, 30, ...); h0; GVA.
        _check_split_variants_bit_equal(
            self, _inputs(1, 300, 2, 1, 64, 64, 0.05, True, (64, 36, 30, 100)), True)

    @parameterized.named_parameters(
        (f"{order}_s3{kfused._SPLIT_PROTOCOL_SUFFIX[protocol]}_{name}", order, protocol, *case)
        for order, protocol in (("prepare_mid", "joint"), ("state_ag", "joint"),
                                ("state_ag", "early_s"))
        for name, *case in (
            ("gva_h0_packed_partial_T150_K64_V128", 1, 150, 2, 1, 64, 128, 0.02, True,
             (64, 36, 30)),
            ("fp16_deltanet_h0_T100_K128_V64", 1, 100, 1, 1, 128, 64, None, True, None,
             jnp.float16)))
    def test_fused_t0_split_sec17_s3_matches_reference(self, order, protocol, *case):
        # Sec. 17's candidates against the fp32 token-serial reference (all stores on); and
        # state_ag with Sec. 40's split_protocol="early_s" (..._state_ag_s3_es_...).
        _check_fused_kernel(self, *case, split_output=True, split_order=order, split_stages=3,
                            split_protocol=protocol)

    def test_split_protocol_early_s_gives_identical_outputs(self):
        # Sec. 40: the same products, Q S_c issued on its own barrier: bit for bit against
        # the default, in every order at the depth each is meant for (T 300: five chunks, the
        # three-stage ring and the published halves wrap; documents inside chunks; h0; GVA).
        _check_split_variants_bit_equal(
            self, _inputs(1, 300, 2, 1, 64, 64, 0.05, True, (64, 36, 30, 100)), True,
            variants=[(order, depth, {"split_protocol": "early_s"}) for order, depth in (
                ("state_ag", 3), ("state_ag", 2), ("readout_first", 2), ("prepare_first", 2),
                ("prepare_mid", 3), ("shared_mask", 2))])

    @parameterized.named_parameters(
        ("state_ag_s3_gva_h0_packed_partial_T150_K64_V128", "state_ag", 3, 1, 150, 2, 1, 64,
         128, 0.02, True, (64, 36, 30)),
        ("readout_first_s2_fp16_deltanet_h0_T100_K128_V64", "readout_first", 2, 1, 100, 1, 1,
         128, 64, None, True, None, jnp.float16))
    def test_fused_t0_split_vk_matches_reference(self, order, depth, *case):
        # state_layout="vk" (MOSAIC_GPU.md Sec. 35) against the fp32 token-serial reference
        # (all stores on: h and v_new come back through the wrapper's transposes).
        _check_fused_kernel(self, *case, split_output=True, split_order=order,
                            split_stages=depth, state_layout="vk")

    def test_vjp_fused_t0_split_vk_matches_chunked_vjp(self):
        # The op's forward and backward with state_layout="vk" (through SPLIT_T0_OPTIONS, as
        # bench_kernels.py --mosaic_t0_split_state_layout=vk sets it): the residuals h and
        # v_new come back through the wrapper's transposes into the unchanged backward. A
        # sequence length of its own keeps jit caches out of it.
        self.enter_context(absltest.mock.patch.dict(kgd.SPLIT_T0_OPTIONS,
                                                    {"state_layout": "vk"}))
        fused_test._check_vjp(self, bwd_test._pipeline_inputs(
            1, 151, 2, 1, 64, 64, 0.05, True, True, (64, 36, 30)), True, "fused_t0_split")

    def test_vk_state_layout_gives_the_kv_outputs(self):
        # The same 16-bit operands and fp32 sums, transposed: interpreted (numpy matmuls),
        # o, the final state, v_new and h equal the default layout's bit for bit (measured
        # 2026-12-06; on the GPU the wgmma summation order may differ: GpuTest compares with
        # a tolerance). T 300: five chunks (the three-stage ring wraps), a 44-token last
        # chunk, documents starting inside chunks, h0, GVA.
        inputs = _inputs(1, 300, 2, 1, 64, 64, 0.05, True, (64, 36, 30, 100))
        _check_split_variants_bit_equal(self, inputs, True, variants=[
            ("readout_first", 2, "vk"), ("state_ag", 3, "vk"), ("shared_mask", 2, "vk")])


@pytest.mark.slow
class VjpInterpretTest(parameterized.TestCase):

    @parameterized.named_parameters(
        # B, T, H, Hk, K, V, decay (None: DeltaNet), h0, dht, document lengths
        ("gva_h0_dht_packed_partial_T150_K64_V64", 1, 150, 2, 1, 64, 64, 0.05, True, True,
         (64, 36, 30)),
        ("deltanet_dht_T128_K64_V64", 1, 128, 1, 1, 64, 64, None, False, True, None),
    )
    def test_vjp_fused_t0_matches_chunked_vjp(self, *case):
        fused_test._check_vjp(self, bwd_test._pipeline_inputs(*case), True, "fused_t0")


@pytest.mark.slow
class KktInverseWInterpretTest(parameterized.TestCase):

    @parameterized.named_parameters(
        # B, T, H, Hk, K, V, decay (None: DeltaNet), document lengths, dtype, chunks per CTA
        ("gva_packed_partial_T150_K64", 1, 150, 2, 1, 64, 64, 0.05, (64, 36, 30), jnp.bfloat16,
         None),
        ("packed_ring_T300_K128_cpc4", 1, 300, 1, 1, 128, 64, 0.1, (100, 150, 50),
         jnp.bfloat16, 4),
        ("fp16_deltanet_T100_K128", 1, 100, 1, 1, 128, 64, None, None, jnp.float16, None),
    )
    def test_w_matches_wy_factor(self, batch, seq_len, heads, kv_heads, dk, dv, decay, docs,
                                 dtype, cpc):
        _, k, v, g, beta, _, seg = _inputs(batch, seq_len, heads, kv_heads, dk, dv, decay,
                                           False, docs, dtype)
        t0, w = kgd.chunk_kkt_inverse_mosaic(k, beta, g=g, segment_ids=seg, return_w=True,
                                             chunks_per_cta=cpc, interpret=True)
        t0_alone = kgd.chunk_kkt_inverse_mosaic(k, beta, segment_ids=seg, chunks_per_cta=cpc,
                                                interpret=True)
        np.testing.assert_array_equal(np.asarray(t0, np.float32),
                                      np.asarray(t0_alone, np.float32))
        self.assertEqual((w.shape, w.dtype), ((batch, seq_len, heads, dk), k.dtype))
        want, _ = wy_test._reference(k, v, g, beta, seg)
        rounding = tolerances.rel_err(want.astype(dtype).astype(jnp.float32), want)
        err = tolerances.rel_err(w, want)
        # Interpreted: bf16 1.677e-3 against a rounding of 1.676e-3 (XLA's w_from_t0 on the
        # rounded T0: 1.735e-3); fp16 2.079e-4 against 2.079e-4 (2.145e-4).
        self.assertLess(err, 1.02 * rounding, msg=f"W: {err:.3e}, rounding {rounding:.3e}")


class XlaFormTest(parameterized.TestCase):
    """The XLA helpers of ``forward="fused_t0"``: ``kkt_inverse_xla`` (the ``T0`` of
    ``wy_implementation="xla"``) and ``w_from_t0`` (the backward's ``W``)."""

    def test_kkt_inverse_xla_matches_float64(self):
        _, k, _, _, beta, _, seg = _inputs(1, 150, 2, 1, 64, 64, 0.02, False, (64, 36, 30),
                                           correlated=3.0)
        t0 = kgd.kkt_inverse_xla(k, beta, segment_ids=seg)
        self.assertEqual(t0.dtype, jnp.float32)
        _check_t0(self, k, beta, seg, t0, gate=1e-5)

    @parameterized.parameters(0.05, None)
    def test_w_from_t0_matches_wy_representation(self, decay):
        # With the fp32 T0, W = e^{G_i} sum_j T0_ij beta_j conn_j k_j is the WY factor W.
        _, k, v, g, beta, _, seg = _inputs(1, 150, 2, 1, 64, 64, decay, False, (64, 36, 30))
        k32 = k.astype(jnp.float32)
        t0 = kgd.kkt_inverse_xla(k32.astype(k.dtype), beta, segment_ids=seg)
        w = kgd.w_from_t0(k32, t0, g, beta, segment_ids=seg)
        want, _ = wy_test._reference(k, v, g, beta, seg)
        self.assertEqual((w.shape, w.dtype), (want.shape, jnp.float32))
        self.assertLess(tolerances.rel_err(w, want), 1e-5)


def _check_t0_kernel_exports(test, dk):
    _, k, _, _, beta, _, seg = _inputs(1, 200, 2, 1, dk, 64, 0.2, False, (70, 30))

    def fn(k, beta, seg):
        return kgd.chunk_kkt_inverse_mosaic(k, beta, segment_ids=seg)

    exported = jax.export.export(jax.jit(fn), platforms=["cuda"])(k, beta, seg)
    text = exported.mlir_module()
    test.assertEqual(text.count("custom_call @mosaic_gpu"), 1)
    test.assertIn("gdn_chunk_kkt_inverse", text)
    test.assertEqual([(a.shape, a.dtype) for a in exported.out_avals],
                     [((1, 200, 2, C), k.dtype)])


def _check_t0_w_kernel_exports(test, dk, kv_heads=1, deltanet=False):
    _, k, _, g, beta, _, seg = _inputs(1, 200, 2, kv_heads, dk, 64, None if deltanet else 0.2,
                                       False, (70, 30))

    def fn(k, g, beta, seg):
        return kgd.chunk_kkt_inverse_mosaic(k, beta, g=g, segment_ids=seg, return_w=True)

    exported = jax.export.export(jax.jit(fn), platforms=["cuda"])(k, g, beta, seg)
    text = exported.mlir_module()
    test.assertEqual(text.count("custom_call @mosaic_gpu"), 1)
    test.assertIn("gdn_chunk_kkt_inverse_subst_split_w", text)
    test.assertEqual([(a.shape, a.dtype) for a in exported.out_avals],
                     [((1, 200, 2, C), k.dtype), ((1, 200, 2, dk), k.dtype)])


def _check_fused_t0_kernel_exports(test, dk, dv, stores, split_output=False,
                                   split_order=kfused.SPLIT_DEFAULT_ORDER,
                                   split_stages=kfused.STAGES, dtype=jnp.bfloat16,
                                   deltanet=False, kv_heads=1, state_layout="kv",
                                   split_protocol=kfused.SPLIT_DEFAULT_PROTOCOL):
    q, k, v, g, beta, state, seg = _inputs(1, 200, 2, kv_heads, dk, dv,
                                           None if deltanet else 0.2, True, (70, 30), dtype)
    t0 = kgd.kkt_inverse_xla(k, beta, segment_ids=seg).astype(k.dtype)

    def fn(q, k, v, t0, g, beta, state, seg):
        return kfused.chunk_delta_fused_t0_fwd_mosaic(
            q, k, v, t0, g, beta, scale=0.1, initial_state=state, segment_ids=seg,
            store_v_new=stores, store_h=stores, split_output=split_output,
            split_order=split_order, split_stages=split_stages, state_layout=state_layout,
            split_protocol=split_protocol)

    exported = jax.export.export(jax.jit(fn), platforms=["cuda"])(
        q, k, v, t0, g, beta, state, seg)
    text = exported.mlir_module()
    test.assertEqual(text.count("custom_call @mosaic_gpu"), 1)
    name = "gdn_chunk_delta_fused_t0_fwd" + ("_split" if split_output else "")
    test.assertIn(name, text)
    test.assertEqual("gdn_chunk_delta_fused_t0_fwd_split" in text, split_output)
    test.assertEqual("gdn_chunk_delta_fused_t0_fwd_split_ro" in text,
                     split_output and split_order == "readout_first")
    test.assertEqual("gdn_chunk_delta_fused_t0_fwd_split_pm" in text,
                     split_output and split_order == "prepare_mid")
    test.assertEqual("gdn_chunk_delta_fused_t0_fwd_split_sa" in text,
                     split_output and split_order == "state_ag")
    test.assertEqual("_s3" in text, split_output and split_stages == 3)
    test.assertEqual("_vk" in text, state_layout == "vk")
    test.assertEqual("_es" in text, split_protocol == "early_s")


def _split_protocol(order, depth, num_chunks, stages="full", protocol="joint"):
    """The barrier waits (``"W"``) and arrivals (``"A"``) of ``_split_t0_kernel``'s three
    warpgroups in program order, as ``(kind, name, chunk)`` (``kfused._SPLIT_PROTOCOL``; the
    eleven TMA copies of a stage are one arrival on ``in_bar`` here, ``in_free`` takes two),
    with the SMEM accesses they guard: ``"X"`` writes a buffer, ``"R"`` starts reading it
    and ``"E"`` ends the read. Buffers: ``ring`` (a stage: ``q, k, v, T0`` and the vectors,
    ``depth`` of them), ``ag`` (``Ag`` over ``T0`` in the stage) and ``pub`` (``S`` and
    ``v_new`` published, two). ``stages``: the timing ablations of ``kfused.SPLIT_T0_STAGES``
    (``"no_store"`` and ``"nobar"`` have ``"full"``'s protocol): ``"io"`` (state and output
    wait for the stage and release it), ``"state"`` (the output warpgroup waits ``s_ready``,
    reads the published ``v_new`` and releases ``s_free`` and the stage it never reads),
    ``"readout"`` (the state warpgroup publishes the landed ``v`` per chunk after ``s_free``
    two back and ``in_bar``; ``S`` once, before the loop, outside the model).

    ``protocol="early_s"`` (``kfused.SPLIT_PROTOCOLS``, stages ``"full"`` only here): ``pub``
    splits into ``pub_s`` (``S``, written and announced on ``s_pub`` first) and ``pub_v``
    (``v_new``, written before ``s_ready``); the output warpgroup starts reading ``pub_s``
    after ``W s_pub`` and ``pub_v`` after ``W s_ready``, and ends both reads (one ``wgmma``
    wait) before ``s_free``."""
    early = protocol == "early_s"
    memory = []
    for i in range(num_chunks):
        memory += [("W", "in_free", i - depth)] if i >= depth else []
        memory += [("X", "ring", i), ("A", "in_bar", i)]
    memory += [("W", "in_free", i) for i in range(max(num_chunks - depth, 0), num_chunks)]
    done = [("A", "done", 0), ("W", "done", 0)]
    if stages == "io":
        ring_only = [e for n in range(num_chunks) for e in (
            ("W", "in_bar", n), ("R", "ring", n), ("E", "ring", n), ("A", "in_free", n))]
        return [ring_only + done, list(ring_only) + done, memory + done]
    state = []
    for n in range(num_chunks):
        if stages == "readout":
            state += [("W", "s_free", n - 2)] if n >= 2 else []
            state += [("W", "in_bar", n), ("R", "ring", n), ("X", "pub", n), ("E", "ring", n),
                      ("A", "s_ready", n), ("A", "in_free", n)]
            continue
        state += [("W", "s_free", n - 2)] if n >= 2 else []
        state += ([("X", "pub_s", n), ("A", "s_pub", n)] if early else [("X", "pub", n)])
        state += [("W", "in_bar", n), ("R", "ring", n)]
        state += [("X", "ag", n)] if order == "state_ag" else [("W", "ag_ready", n)]
        state += [("R", "ag", n)] + ([("X", "pub_v", n)] if early else [])
        state += [("A", "s_ready", n), ("E", "ag", n), ("E", "ring", n), ("A", "in_free", n)]
    state += [("W", "s_free", n) for n in range(max(num_chunks - 2, 0), num_chunks)]

    def prepare(m):
        return [("W", "in_bar", m), ("R", "ring", m), ("X", "ag", m), ("A", "ag_ready", m)]

    output = [] if order == "state_ag" else prepare(0)
    if stages == "state":
        output = [e for n in range(num_chunks) for e in (
            ("W", "s_ready", n), ("R", "pub", n), ("E", "pub", n), ("A", "s_free", n),
            ("E", "ring", n), ("A", "in_free", n))]
        return [wg + done for wg in (state, output, memory)]
    for n in range(num_chunks):
        nxt = prepare(n + 1) if n + 1 < num_chunks else []
        read_state = [("W", "s_ready", n), ("R", "pub", n), ("E", "pub", n), ("A", "s_free", n),
                      ("E", "ring", n), ("A", "in_free", n)]
        if early:  # Q S_c on s_pub, P v_new on s_ready, one wait for both products
            read_state = [("W", "s_pub", n), ("R", "pub_s", n), ("W", "s_ready", n),
                          ("R", "pub_v", n), ("E", "pub_s", n), ("E", "pub_v", n),
                          ("A", "s_free", n), ("E", "ring", n), ("A", "in_free", n)]
        if order == "state_ag":  # the read-out only, after its own wait for the stage
            output += [("W", "in_bar", n), ("R", "ring", n)] + read_state
        else:  # read_scores(n): no barrier, reads ring n (held since prepare(n))
            output += (nxt + read_state if order in ("prepare_first", "prepare_mid") else
                       read_state + nxt)
    return [wg + [("A", "done", 0), ("W", "done", 0)] for wg in (state, output, memory)]


def _check_split_protocol(test, seeds=100, stages="full", orders=kfused.SPLIT_ORDERS,
                          protocol="joint"):
    """Runs :func:`_split_protocol` under random schedules (every order, both ring depths, 1
    to 7 chunks) on mbarriers with phase parity. Checked whenever an event is next in its
    warpgroup, so under every schedule, not only the sampled ones: a wait must not find its
    slot a full phase further (the parity back where it waited: it would hang on the GPU),
    an arrival must not land before the slot's previous phase completed, a buffer must not
    be written before the reads of its previous use ended (two readers of a stage, one of
    the others) nor read before its write. Each sampled schedule must run to its end.
    ``protocol``: ``"joint"`` or ``"early_s"`` (:func:`_split_protocol`)."""
    arrivals = {"in_free": 2, "done": 3}
    readers = {"ring": 2, "ag": 1, "pub": 1, "pub_s": 1, "pub_v": 1}
    for order in orders:
        for depth in kfused.SPLIT_STAGES:
            slots = {"in_bar": depth, "in_free": depth, "ag_ready": depth, "s_ready": 2,
                     "s_free": 2, "done": 1, "ring": depth, "ag": depth, "pub": 2,
                     "s_pub": 2, "pub_s": 2, "pub_v": 2}
            for num_chunks in range(1, 8):
                for seed in range(seeds):
                    rng = np.random.default_rng(seed)
                    programs = _split_protocol(order, depth, num_chunks, stages,
                                               **({} if protocol == "joint" else
                                                  {"protocol": protocol}))
                    pcs, count, written, ended = [0, 0, 0], {}, set(), {}

                    def where():  # the event checked (its warpgroup's next), for a message
                        return (f"{stages}, {order}, {depth} stages, {num_chunks} chunks, "
                                f"seed {seed}: {kind} {name}[{chunk}]")
                    left = sum(len(p) for p in programs)  # events not yet run
                    while left:
                        ready = []
                        for wg, (pc, program) in enumerate(zip(pcs, programs)):
                            if pc == len(program):
                                continue
                            kind, name, chunk = program[pc]
                            use = chunk // slots[name] + 1  # the phase of its slot
                            done = count.get((name, chunk % slots[name]), 0) // arrivals.get(
                                name, 1)
                            before = chunk - slots[name]  # the slot's previous use
                            # Each check's condition first, in plain Python; the assertion
                            # (and its message) only where it fails: formatting the message
                            # and calling the assertion for every event of every schedule
                            # were most of the checker's time (this loop runs ~10^6 times).
                            if kind == "W":
                                if not done <= use:
                                    test.assertLessEqual(done, use, msg=f"{where()}: lapped")
                            elif kind == "A":
                                if done != use - 1:
                                    test.assertEqual(done, use - 1, msg=f"{where()}: early")
                            elif kind == "X" and before >= 0:
                                if ended.get((name, before), 0) != readers[name]:
                                    test.assertEqual(ended.get((name, before), 0),
                                                     readers[name], msg=f"{where()}: still read")
                            elif kind == "R":
                                if (name, chunk) not in written:
                                    test.assertIn((name, chunk), written,
                                                  msg=f"{where()}: unwritten")
                            if kind != "W" or done == use:
                                ready.append(wg)
                        if not ready:
                            test.assertTrue(ready, msg=f"{order}, {depth} stages, {num_chunks} "
                                            f"chunks, seed {seed}: deadlock at {pcs}")
                        # (integers(1) is 0 and draws nothing: the same schedules without it)
                        wg = ready[rng.integers(len(ready))] if len(ready) > 1 else ready[0]
                        kind, name, chunk = programs[wg][pcs[wg]]
                        if kind == "A":
                            key = (name, chunk % slots[name])
                            count[key] = count.get(key, 0) + 1
                        elif kind == "X":
                            written.add((name, chunk))
                        elif kind == "E":
                            ended[(name, chunk)] = ended.get((name, chunk), 0) + 1
                        pcs[wg] += 1
                        left -= 1


def _check_forward_exports(test, dk, dv, deltanet, forward="fused_t0"):
    q, k, v, g, beta, state, seg = _inputs(1, 200, 2, 1, dk, dv, None if deltanet else 0.2,
                                           True, (70, 30))

    def fn(q, k, v, g, beta, state, seg):
        return kgd.gated_delta_rule_fwd_mosaic(q, k, v, g, beta, initial_state=state,
                                               segment_ids=seg, return_residual=True,
                                               forward=forward)

    exported = jax.export.export(jax.jit(fn), platforms=["cuda"])(q, k, v, g, beta, state, seg)
    text = exported.mlir_module()
    # T0, then the fused T0 kernel: no W, U preparation, no separate state pass or read-out.
    test.assertEqual(text.count("custom_call @mosaic_gpu"), 2)
    test.assertIn("gdn_chunk_kkt_inverse", text)
    test.assertIn("gdn_chunk_delta_fused_t0_fwd", text)
    test.assertNotIn("gdn_chunk_wy", text)
    test.assertNotIn("gdn_chunk_delta_h", text)


def _check_grad_exports(test, dk, dv, deltanet):
    q, k, v, g, beta, state, seg, _, _, scale = bwd_test._pipeline_inputs(
        1, 200, 2, 1, dk, dv, None if deltanet else 0.2, True, True, (70, 30))

    def loss(q, k, v, g, beta, h0, seg):
        o, final = mosaic_vjp.gated_delta_rule_mosaic(
            q, k, v, g, beta, scale=scale, initial_state=h0, segment_ids=seg,
            output_final_state=True, forward="fused_t0")
        return jnp.sum(o.astype(jnp.float32) ** 2) + jnp.sum(final)

    argnums = (0, 1, 2, 4, 5) if deltanet else (0, 1, 2, 3, 4, 5)
    fn = jax.jit(jax.grad(loss, argnums=argnums))
    exported = jax.export.export(fn, platforms=["cuda"])(q, k, v, g, beta, state, seg)
    text = exported.mlir_module()
    # forward: T0, fused T0; backward (the defaults, "fused_ws" and dv_local "fold"): the
    # reverse pass forming dv_local, the fused chunk-local kernel reading the forward's T0 (no
    # second inverse)
    calls = [line for line in text.splitlines() if "custom_call @mosaic_gpu" in line]
    test.assertEqual(len(calls), 4)  # len: a failing list would print whole kernels
    for name in ("gdn_chunk_kkt_inverse", "gdn_chunk_delta_fused_t0_fwd",
                 "gdn_chunk_delta_dh_fold", "gdn_chunk_bwd_fused_ws"):
        test.assertEqual(sum(name in c for c in calls), 1, msg=name)
    # the backward's W comes from the T0 kernel (its "_w" form), not from an XLA product
    # (MOSAIC_GPU.md Sec. 36: w_from_t0's fp32 dot_general was a cuBLAS GEMM)
    test.assertEqual(sum("gdn_chunk_kkt_inverse_subst_split_w" in c for c in calls), 1)
    test.assertNotIn("dot_general", text)
    want = [x.shape for x in (q, k, v, g, beta, state) if x is not None]
    test.assertEqual([a.shape for a in exported.out_avals], want)


# Export variants: CI keeps one per check, LoweringSlowTest runs the others.
_T0_CI, _T0_SLOW = kmg_test.split_variants([dict(dk=128)], dk=(64, 128))
_KERNEL_CI, _KERNEL_SLOW = kmg_test.split_variants(
    [dict(dk=128, dv=128, stores=True)], dk=(64, 128), dv=(64, 128), stores=(False, True))
_SPLIT_CI, _SPLIT_SLOW = kmg_test.split_variants(
    [dict(dk=128, dv=128, stores=True)], dk=(64, 128), dv=(64, 128), stores=(False, True))
_FWD_CI, _FWD_SLOW = kmg_test.split_variants(
    [dict(dk=64, dv=64, deltanet=False)], dk=(64, 128), dv=(64, 128), deltanet=(False, True))
_GRAD_CI, _GRAD_SLOW = kmg_test.split_variants(
    [dict(dk=64, dv=64, deltanet=False)], dk=(64, 128), dv=(64, 128), deltanet=(False, True))


class LoweringTest(parameterized.TestCase):
    """The kernels export for CUDA on any host: the whole Pallas-to-Mosaic-GPU lowering runs
    (layouts, swizzles, ``wgmma`` operand shapes and dtypes); ptxas runs on the GPU only."""

    @parameterized.named_parameters(*_T0_CI)
    def test_t0_kernel_exports_for_cuda(self, **variant):
        _check_t0_kernel_exports(self, **variant)

    @parameterized.named_parameters(*_KERNEL_CI)
    def test_fused_t0_kernel_exports_for_cuda(self, **variant):
        _check_fused_t0_kernel_exports(self, **variant)

    def test_rows_with_few_ctas_run_pieces_or_three_pass(self):
        # resolve_forward, fused_t0_pieces (MOSAIC_GPU.md Sec. 36, 42): S1 keeps the fused T0
        # forwards on whole rows; at S2 (B 1, T 32768, H 16, V 128: 32 CTAs, 4 pieces)
        # "fused_t0" runs as 4 sequence pieces (FUSED_T0_PIECES, the default since 12-06g) or,
        # with it off, falls back to three_pass as "fused_t0_split" always does
        resolve, pieces = mosaic_vjp.resolve_forward, mosaic_vjp.fused_t0_pieces
        self.assertTrue(mosaic_vjp.FUSED_T0_PIECES)
        for forward in ("fused_t0", "fused_t0_split"):
            self.assertEqual(resolve(forward, 8, 16, 128, 4096), forward)
            self.assertEqual(pieces(forward, 8, 16, 128, 4096), 1)
            with mock.patch.object(mosaic_vjp, "FUSED_T0_FALLBACK", False):
                self.assertEqual(resolve(forward, 1, 16, 128, 32768), forward)
                self.assertEqual(pieces(forward, 1, 16, 128, 32768), 1)
        self.assertEqual(resolve("fused_t0", 1, 16, 128, 32768), "fused_t0")
        self.assertEqual(pieces("fused_t0", 1, 16, 128, 32768), 4)
        self.assertEqual(resolve("fused_t0_split", 1, 16, 128, 32768), "three_pass")
        self.assertEqual(pieces("three_pass", 1, 16, 128, 32768), 1)
        with mock.patch.object(mosaic_vjp, "FUSED_T0_PIECES", False):
            self.assertEqual(resolve("fused_t0", 1, 16, 128, 32768), "three_pass")
            self.assertEqual(pieces("fused_t0", 1, 16, 128, 32768), 1)
        for forward in ("three_pass", "fused"):
            self.assertEqual(resolve(forward, 1, 16, 128, 32768), forward)
        # the op's training step at B 1, T 512, H 1, V 64 (one CTA, 8 chunks: 2 pieces) runs
        # "fused_t0" as pieces (the summary launch), the three-pass kernels with the pieces off,
        # and the fused T0 kernel on whole rows without the fallback
        q, k, v, g, beta, _, _ = _inputs(1, 512, 1, 1, 64, 64, 0.1, False, None)

        def kernels(forward="fused_t0"):  # None: no forward= (the op's default)
            def loss(q, k, v, g, beta):
                named = {} if forward is None else {"forward": forward}
                o, _ = mosaic_vjp.gated_delta_rule_mosaic(q, k, v, g, beta, **named)
                return jnp.sum(o.astype(jnp.float32) ** 2)

            text = jax.export.export(jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4))),
                                     platforms=["cuda"])(q, k, v, g, beta).mlir_module()
            return [name for name in ("gdn_chunk_wy", "gdn_chunk_delta_h_pieces",
                                      "gdn_chunk_delta_fused_t0_fwd",
                                      "gdn_chunk_delta_fused_t0_fwd_summary") if name in text]

        # (three exports of a training step, about 3 s each on 2 cores; the op's default
        # forward is "fused_t0", ValidationTest of kernel_mosaic_gdn_vjp_test.py)
        self.assertEqual(kernels(None), ["gdn_chunk_delta_fused_t0_fwd",
                                         "gdn_chunk_delta_fused_t0_fwd_summary"])
        with mock.patch.object(mosaic_vjp, "FUSED_T0_PIECES", False):
            self.assertEqual(kernels(), ["gdn_chunk_wy", "gdn_chunk_delta_h_pieces"])
        with mock.patch.object(mosaic_vjp, "FUSED_T0_FALLBACK", False):
            self.assertEqual(kernels(), ["gdn_chunk_delta_fused_t0_fwd"])

    @parameterized.named_parameters(("K128", dict(dk=128)),
                                    ("K64_gva_deltanet", dict(dk=64, kv_heads=2, deltanet=True)))
    def test_t0_kernel_with_w_exports_for_cuda(self, variant):
        _check_t0_w_kernel_exports(self, **variant)

    @parameterized.named_parameters(*_SPLIT_CI)
    def test_fused_t0_split_kernel_exports_for_cuda(self, **variant):
        _check_fused_t0_kernel_exports(self, **variant, split_output=True)

    @parameterized.named_parameters(*_SPLIT_CI)
    def test_fused_t0_split_prepare_first_kernel_exports_for_cuda(self, **variant):
        _check_fused_t0_kernel_exports(self, **variant, split_output=True,
                                       split_order="prepare_first")

    @parameterized.product(
        order=("prepare_mid", "state_ag"),
        variant=(dict(dk=128, dv=128), dict(dk=64, dv=64, dtype=jnp.float16, deltanet=True),
                 dict(dk=128, dv=64, kv_heads=2)),
    )
    def test_fused_t0_split_sec17_s3_kernel_exports_for_cuda(self, order, variant):
        # Sec. 17's candidates with three stages: K = V = 128 bf16 (GVA: two value heads read
        # one key head; h0, documents), K 64 fp16 DeltaNet, K 128 / V 64 without GVA. At
        # K = V = 128 bf16 the export also checks the 227 KB SMEM limit (Mosaic GPU raises
        # above it), which the three-stage ring meets only with its two aliases.
        _check_fused_t0_kernel_exports(self, **variant, stores=True, split_output=True,
                                       split_order=order, split_stages=3)

    @parameterized.parameters("prepare_mid", "state_ag", "shared_mask")
    def test_fused_t0_split_sec17_s2_kernel_exports_for_cuda(self, order):
        _check_fused_t0_kernel_exports(self, 128, 128, True, split_output=True,
                                       split_order=order)

    def test_fused_t0_split_vk_kernel_exports_for_cuda(self):
        # state_layout="vk" (MOSAIC_GPU.md Sec. 35): the state warpgroup's register left
        # operands (S^T, X^T, decayed v_new^T), the transposed views of Ag, v, k and of the
        # published S^T / v_new^T, at K = V = 128 bf16 with GVA, h0, documents and all stores,
        # state_ag with three stages (the 227 KB limit: RefUnion of S^T and the fp32 state).
        _check_fused_t0_kernel_exports(self, 128, 128, True, split_output=True,
                                       split_order="state_ag", split_stages=3, kv_heads=2,
                                       state_layout="vk")

    def test_split_stages_3_fits_227_kb_only_with_its_aliases(self):
        # Mosaic GPU's own SMEM count (core._smem_tree_size, what it checks against 227 KB)
        # of the split kernel at K = V = 128 bf16: the three-stage ring with its aliases below
        # the limit, by the third stage's 49.75 KB less the two aliases' 40 KB.
        from jax.experimental.mosaic.gpu import core as mgpu_core
        sizes = []
        count = mgpu_core._smem_tree_size

        def spy(buffers):
            sizes.append(count(buffers))
            return sizes[-1]

        self.enter_context(absltest.mock.patch.object(mgpu_core, "_smem_tree_size", spy))
        for depth in kfused.SPLIT_STAGES:
            _check_fused_t0_kernel_exports(self, 128, 128, True, split_output=True,
                                           split_order="prepare_mid", split_stages=depth)
        two, three = sizes
        self.assertLessEqual(three, 227 * 1024)
        # A third stage is 49.75 KB (more with alignment); the aliases save 40 KB of it.
        self.assertLess(three - two, (49.75 - 32) * 1024)

    def test_split_protocol_cannot_deadlock(self):
        # kfused._SPLIT_PROTOCOL argues it by induction over chunks; this runs the protocol.
        _check_split_protocol(self)

    def test_split_protocol_check_finds_a_deadlock_and_a_race(self):
        # The check itself: a one-stage ring deadlocks (prepare(n + 1) waits for copies that
        # need read_state(n)'s release), and without s_free the state warpgroup overwrites a
        # published S the output warpgroup has not read (prepare_first).
        with absltest.mock.patch.object(kfused, "SPLIT_STAGES", (1,)):
            with self.assertRaisesRegex(AssertionError, "deadlock"):
                _check_split_protocol(self, seeds=2)
        protocol = _split_protocol

        def without_s_free(order, depth, num_chunks, stages="full"):
            state, *others = protocol(order, depth, num_chunks, stages)
            return [[e for e in state if e[:2] != ("W", "s_free")]] + others

        with absltest.mock.patch.object(sys.modules[__name__], "_split_protocol",
                                        without_s_free):
            with self.assertRaisesRegex(AssertionError, "still read"):
                _check_split_protocol(self, seeds=2)

    def test_split_protocol_early_s_cannot_deadlock(self):
        # split_protocol="early_s" (MOSAIC_GPU.md Sec. 40): s_pub announces S_c before v_new
        # exists; every order, both depths, 1 to 7 chunks: no deadlock, no lapped phase, no
        # published S or v_new overwritten while read or read before written.
        _check_split_protocol(self, seeds=60, protocol="early_s")

    def test_split_protocol_early_s_check_finds_races(self):
        # The model of "early_s" catches the two mistakes the protocol guards against: the
        # output warpgroup issuing P v_new on s_pub alone (v_new read before it is written),
        # and the state warpgroup announcing S_c before writing it.
        model = _split_protocol

        def without_v_new_wait(order, depth, num_chunks, stages="full", protocol="joint"):
            state, output, memory = model(order, depth, num_chunks, stages, protocol)
            return [state, [e for e in output if e[:2] != ("W", "s_ready")], memory]

        def announced_early(order, depth, num_chunks, stages="full", protocol="joint"):
            state, *others = model(order, depth, num_chunks, stages, protocol)
            writes = [i for i, e in enumerate(state) if e[:2] == ("X", "pub_s")]
            for i in writes:  # A s_pub before X pub_s
                state[i], state[i + 1] = state[i + 1], state[i]
            return [state] + others

        for broken in (without_v_new_wait, announced_early):
            with absltest.mock.patch.object(sys.modules[__name__], "_split_protocol", broken):
                with self.assertRaisesRegex(AssertionError, "unwritten"):
                    _check_split_protocol(self, seeds=3, protocol="early_s",
                                          orders=("state_ag",))

    def test_fused_t0_split_early_s_kernel_exports_for_cuda(self):
        # split_protocol="early_s" at K = V = 128 bf16, state_ag with three stages, GVA, h0,
        # documents, all stores: the 227 KB limit with the two extra mbarriers (Mosaic GPU's
        # count 228,488 bytes against 228,472 for "joint", 2026-12-06).
        _check_fused_t0_kernel_exports(self, 128, 128, True, split_output=True,
                                       split_order="state_ag", split_stages=3, kv_heads=2,
                                       split_protocol="early_s")

    @parameterized.named_parameters(*_FWD_CI)
    def test_forward_fused_t0_exports_for_cuda(self, **variant):
        _check_forward_exports(self, **variant)

    @parameterized.named_parameters(*_GRAD_CI)
    def test_grad_fused_t0_exports_for_cuda(self, **variant):
        _check_grad_exports(self, **variant)


# Slow (out of CI): the other K, V and option combinations of LoweringTest. The mark is on the
# class: absl's parameterized copies of a method do not keep a method-level mark.
@pytest.mark.slow
class LoweringSlowTest(parameterized.TestCase):

    @parameterized.named_parameters(
        ("prepare_mid_s3_K128_V128", dict(dk=128, dv=128, split_order="prepare_mid",
                                          split_stages=3)),
        ("readout_first_s2_K64_V64_fp16_deltanet",
         dict(dk=64, dv=64, dtype=jnp.float16, deltanet=True)),
        ("shared_mask_s2_K128_V64_nostores", dict(dk=128, dv=64, stores=False,
                                                  split_order="shared_mask")))
    def test_fused_t0_split_early_s_kernel_exports_for_cuda(self, variant):
        # split_protocol="early_s" in the other orders, depths, head dims and dtypes.
        _check_fused_t0_kernel_exports(self, **{"stores": True, **variant}, split_output=True,
                                       split_protocol="early_s")

    @parameterized.named_parameters(
        ("readout_first_s2_K128_V128", dict(dk=128, dv=128)),
        ("readout_first_s2_K128_V128_nostores", dict(dk=128, dv=128, stores=False)),
        ("state_ag_s2_K64_V64_fp16_deltanet", dict(dk=64, dv=64, dtype=jnp.float16,
                                                   deltanet=True, split_order="state_ag")),
        ("readout_first_s3_K128_V64_gva", dict(dk=128, dv=64, kv_heads=2, split_stages=3)),
        ("prepare_mid_s3_K64_V128", dict(dk=64, dv=128, split_order="prepare_mid",
                                         split_stages=3)),
    )
    def test_fused_t0_split_vk_kernel_exports_for_cuda(self, variant):
        _check_fused_t0_kernel_exports(self, **{"stores": True, **variant}, split_output=True,
                                       state_layout="vk")

    @parameterized.named_parameters(*_T0_SLOW)
    def test_t0_kernel_exports_for_cuda(self, **variant):
        _check_t0_kernel_exports(self, **variant)

    @parameterized.named_parameters(*_KERNEL_SLOW)
    def test_fused_t0_kernel_exports_for_cuda(self, **variant):
        _check_fused_t0_kernel_exports(self, **variant)

    @parameterized.named_parameters(*_SPLIT_SLOW)
    def test_fused_t0_split_kernel_exports_for_cuda(self, **variant):
        _check_fused_t0_kernel_exports(self, **variant, split_output=True)

    @parameterized.named_parameters(*_FWD_SLOW)
    def test_forward_fused_t0_exports_for_cuda(self, **variant):
        _check_forward_exports(self, **variant)

    @parameterized.named_parameters(*(_FWD_CI + _FWD_SLOW))
    def test_forward_fused_t0_split_exports_for_cuda(self, **variant):
        _check_forward_exports(self, **variant, forward="fused_t0_split")

    @parameterized.named_parameters(*_GRAD_SLOW)
    def test_grad_fused_t0_exports_for_cuda(self, **variant):
        _check_grad_exports(self, **variant)


def _t0_fwd_call(**kw):
    """``chunk_delta_fused_t0_fwd_mosaic`` on one small case (B 1, T 64, H 2, Hk 1, K = V = 64,
    gated, no ``h0`` or documents; ``t0`` zeros) with ``kw`` as its options: the refusal
    tests' call."""
    q, k, v, g, beta, _, _ = _inputs(1, 64, 2, 1, 64, 64, 0.1, False, None)
    t0 = jnp.zeros((1, 64, 2, C), k.dtype)
    return kfused.chunk_delta_fused_t0_fwd_mosaic(q, k, v, t0, g, beta, scale=0.1, **kw)


def _t0_fwd_jaxpr(**fixed):
    """``jaxpr(**kw)``: the jaxpr text of ``chunk_delta_fused_t0_fwd_mosaic`` on one fixed case
    (B 1, T 150, H 2, Hk 1, K 64, V 128, gated, ``h0``, two documents; ``t0`` zeros: only the
    trace matters) with ``fixed`` and ``kw`` as its static options."""
    q, k, v, g, beta, state, seg = _inputs(1, 150, 2, 1, 64, 128, 0.2, True, (70, 30))
    t0 = jnp.zeros((1, 150, 2, C), k.dtype)

    def jaxpr(**kw):
        return str(jax.make_jaxpr(lambda *a: kfused.chunk_delta_fused_t0_fwd_mosaic(
            *a, scale=0.1, initial_state=state, segment_ids=seg, **fixed, **kw))(
                q, k, v, t0, g, beta))
    return jaxpr


def _check_stage_exports(test, stages, dk, dv, dtype=jnp.bfloat16, h0=True, docs=(70, 30)):
    q, k, v, g, beta, state, seg = _inputs(1, 200, 2, 1, dk, dv, 0.2, h0, docs, dtype)
    t0 = kgd.kkt_inverse_xla(k, beta, segment_ids=seg).astype(k.dtype)

    def fn(q, k, v, t0, g, beta, state, seg):
        return kfused.chunk_delta_fused_t0_fwd_mosaic(
            q, k, v, t0, g, beta, scale=0.1, initial_state=state, segment_ids=seg,
            stages=stages)

    exported = jax.export.export(jax.jit(fn), platforms=["cuda"])(
        q, k, v, t0, g, beta, state, seg)
    text = exported.mlir_module()
    test.assertEqual(text.count("custom_call @mosaic_gpu"), 1)
    test.assertIn(f"gdn_chunk_delta_fused_t0_fwd_abl_{stages}", text)
    test.assertEqual([(a.shape, a.dtype) for a in exported.out_avals[:2]],
                     [((1, 200, 2, dv), dtype), ((1, 2, dk, dv), jnp.float32)])


class FusedT0StagesTest(parameterized.TestCase):
    """The timing ablations of MOSAIC_GPU.md Sec. 16 (``stages`` of the two-warpgroup
    ``fused_t0`` kernel): each exports for CUDA under its own kernel name, ``"full"`` is the
    default's jaxpr and ``"nobar"`` differs from it only in ``unsafe_no_auto_barriers`` and the
    kernel name (CI, about 15 s)."""

    @parameterized.named_parameters(
        ("io_K128_V128", "io", 128, 128),
        ("v_new_K128_V128", "v_new", 128, 128),
        ("state_K128_V128", "state", 128, 128),
        ("no_store_K128_V128", "no_store", 128, 128),
        ("nobar_K128_V128", "nobar", 128, 128),
        ("state_fp16_deltanet_K64_V64", "state", 64, 64, jnp.float16, False, None),
        ("v_new_K64_V128", "v_new", 64, 128),
    )
    def test_stage_exports_for_cuda(self, stages, dk, dv, dtype=jnp.bfloat16, h0=True,
                                    docs=(70, 30)):
        _check_stage_exports(self, stages, dk, dv, dtype, h0, docs)

    def test_full_is_the_default_and_nobar_only_drops_the_barriers(self):
        for interpret in (False, True):
            jaxpr = _t0_fwd_jaxpr(interpret=interpret)

            default = jaxpr()
            self.assertEqual(jaxpr(stages="full"), default)
            self.assertIn("unsafe_no_auto_barriers=False", default)
            nobar = jaxpr(stages="nobar")
            self.assertNotEqual(nobar, default)
            self.assertEqual(nobar.replace("unsafe_no_auto_barriers=True",
                                           "unsafe_no_auto_barriers=False")
                             .replace("_abl_nobar", ""), default)
            for stages in ("io", "v_new", "state", "no_store"):
                self.assertNotEqual(jaxpr(stages=stages), default)

    def test_split_order_readout_first_is_the_default_and_prepare_first_differs(self):
        for interpret in (False, True):
            jaxpr = _t0_fwd_jaxpr(interpret=interpret, split_output=True)

            default = jaxpr()
            self.assertEqual(jaxpr(split_order="readout_first"), default)
            self.assertIn("gdn_chunk_delta_fused_t0_fwd_split_ro", default)
            prepare_first = jaxpr(split_order="prepare_first")
            self.assertNotEqual(prepare_first, default)
            self.assertIn("gdn_chunk_delta_fused_t0_fwd_split", prepare_first)
            self.assertNotIn("gdn_chunk_delta_fused_t0_fwd_split_ro", prepare_first)

    def test_split_t0_options_reach_the_split_forward(self):
        # kernel_mosaic_gpu.SPLIT_T0_OPTIONS (set by bench_kernels.py --mosaic_t0_split_order)
        # is read at trace time; a sequence length of its own keeps jit caches out of it.
        q, k, v, g, beta, state, seg = _inputs(1, 131, 2, 1, 64, 64, 0.2, True, (70, 30))
        self.addCleanup(kgd.SPLIT_T0_OPTIONS.clear)
        kgd.SPLIT_T0_OPTIONS["split_order"] = "prepare_first"

        def jaxpr(forward):
            return str(jax.make_jaxpr(lambda *a: kgd.gated_delta_rule_fwd_mosaic(
                *a, scale=0.1, initial_state=state, segment_ids=seg,
                forward=forward))(q, k, v, g, beta))

        split = jaxpr("fused_t0_split")
        self.assertIn("gdn_chunk_delta_fused_t0_fwd_split", split)
        self.assertNotIn("gdn_chunk_delta_fused_t0_fwd_split_ro", split)  # not the default
        self.assertNotIn("gdn_chunk_delta_fused_t0_fwd_split", jaxpr("fused_t0"))
        self.assertNotIn("_vk", split)
        # bench_kernels.py --mosaic_t0_split_state_layout sets state_layout per variant
        kgd.SPLIT_T0_OPTIONS["state_layout"] = "vk"
        jax.clear_caches()
        self.assertIn("gdn_chunk_delta_fused_t0_fwd_split_vk", jaxpr("fused_t0_split"))
        # bench_kernels.py --mosaic_t0_split_protocol=early_s (MOSAIC_GPU.md Sec. 40)
        kgd.SPLIT_T0_OPTIONS.update(state_layout="kv", split_order="state_ag", split_stages=3,
                                    split_protocol="early_s")
        jax.clear_caches()
        self.assertIn("gdn_chunk_delta_fused_t0_fwd_split_sa_s3_es", jaxpr("fused_t0_split"))

    def test_split_stages_two_is_the_default_and_names_the_variants(self):
        jaxpr = _t0_fwd_jaxpr(split_output=True)

        default = jaxpr()
        self.assertEqual(jaxpr(split_stages=2), default)
        for order, name in (("readout_first", "split_ro_s3"), ("prepare_first", "split_s3"),
                            ("prepare_mid", "split_pm_s3"), ("state_ag", "split_sa_s3"),
                            ("shared_mask", "split_sm_s3")):
            self.assertIn(f"gdn_chunk_delta_fused_t0_fwd_{name}",
                          jaxpr(split_order=order, split_stages=3))
        prepare_mid = jaxpr(split_order="prepare_mid")
        self.assertIn("gdn_chunk_delta_fused_t0_fwd_split_pm", prepare_mid)
        self.assertNotIn("_s3", prepare_mid)

    def test_split_protocol_joint_is_the_default_and_early_s_differs(self):
        # MOSAIC_GPU.md Sec. 40: "joint" is the default's jaxpr (every order at three stages,
        # interpreted and not); "early_s" differs and carries its own kernel name.
        for interpret in (False, True):
            jaxpr = _t0_fwd_jaxpr(interpret=interpret, split_output=True, split_stages=3)

            for order in ("state_ag", "readout_first"):
                default = jaxpr(split_order=order)
                self.assertEqual(jaxpr(split_order=order, split_protocol="joint"), default)
                early = jaxpr(split_order=order, split_protocol="early_s")
                self.assertNotEqual(early, default)
                suffix = kfused._SPLIT_ORDER_SUFFIX[order]
                name = f"gdn_chunk_delta_fused_t0_fwd_split{suffix}_s3"
                self.assertIn(f"{name}_es", early)
                self.assertIn(name, default)
                self.assertNotIn(f"{name}_es", default)
        self.assertEqual(kfused.fused_t0_kernel_name(
            split_output=True, split_order="state_ag", split_stages=3,
            split_protocol="early_s", stages="nobar"),
            "gdn_chunk_delta_fused_t0_fwd_split_sa_s3_es_abl_nobar")

    def test_rejects_unknown_or_unsupported_split_protocol(self):
        with self.assertRaisesRegex(ValueError, "split_protocol must be one of"):
            _t0_fwd_call(split_output=True, split_protocol="late_s")
        with self.assertRaisesRegex(ValueError, "split_protocol='early_s' .* needs "
                                                "split_output=True"):
            _t0_fwd_call(split_protocol="early_s")
        with self.assertRaisesRegex(ValueError, "split_protocol='early_s' .* "
                                                "state_layout='kv' only"):
            _t0_fwd_call(split_output=True, split_protocol="early_s", state_layout="vk")
        for stages in ("io", "state", "readout"):
            with self.assertRaisesRegex(ValueError, "split_protocol='early_s' needs both "
                                                    f"sides.*stages='{stages}'"):
                _t0_fwd_call(split_output=True, split_order="state_ag",
                             split_protocol="early_s", stages=stages)

    def test_summary_and_pieces_name_their_kernel_and_leave_the_default(self):
        # MOSAIC_GPU.md Sec. 42: pieces=1 and summary=False are the default's jaxpr; summary
        # has its own kernel name and one output; pieces=2 writes h at global chunk indices.
        q, k, v, g, beta, state, seg = _inputs(2, 128, 2, 1, 64, 64, 0.2, True, (70, 30))
        t0 = jnp.zeros((2, 128, 2, C), k.dtype)

        def jaxpr(**kw):
            return jax.make_jaxpr(lambda *a: kfused.chunk_delta_fused_t0_fwd_mosaic(
                *a, scale=0.1, initial_state=state, segment_ids=seg, **kw))(
                    q, k, v, t0, g, beta)
        default = str(jaxpr(store_h=True))
        self.assertEqual(str(jaxpr(store_h=True, pieces=1, summary=False)), default)
        summary = jaxpr(summary=True)
        self.assertIn("gdn_chunk_delta_fused_t0_fwd_summary", str(summary))
        self.assertNotIn("_summary", default)
        self.assertEqual([v.aval.shape for v in summary.jaxpr.outvars if v.aval.ndim == 4],
                         [(2, 2, 64, 64)])  # the final state alone
        pieces = jaxpr(store_h=True, pieces=2)
        self.assertEqual(pieces.out_avals[-1].shape, (1, 2, 4, 64, 64))  # [B, H, P N, K, V]
        self.assertEqual(jaxpr(store_h=True).out_avals[-1].shape, (2, 2, 2, 64, 64))

    def test_rejects_bad_pieces_or_summary(self):
        with self.assertRaisesRegex(ValueError, "pieces=3 must be a positive divisor of the "
                                                "batch rows 1"):
            _t0_fwd_call(pieces=3)
        with self.assertRaisesRegex(ValueError, "pieces=0 must be a positive divisor"):
            _t0_fwd_call(pieces=0)
        q, k, v, g, beta, _, _ = _inputs(2, 64, 2, 1, 64, 64, 0.1, False, None)
        t0 = jnp.zeros((2, 64, 2, C), k.dtype)
        with self.assertRaisesRegex(ValueError, "pieces=2 is built for the two-warpgroup "
                                                "kernel only"):
            kfused.chunk_delta_fused_t0_fwd_mosaic(q, k, v, t0, g, beta, scale=0.1, pieces=2,
                                                   split_output=True)
        q, k, v, g, beta, _, _ = _inputs(2, 100, 2, 1, 64, 64, 0.1, False, None)
        t0 = jnp.zeros((2, 100, 2, C), k.dtype)
        with self.assertRaisesRegex(ValueError, "pieces=2: each piece must be a whole number "
                                                "of chunks of 64 tokens, got T = 100"):
            kfused.chunk_delta_fused_t0_fwd_mosaic(q, k, v, t0, g, beta, scale=0.1, pieces=2)
        w = jnp.zeros((2, 100, 2, 64), k.dtype)
        for bad in (None, 2.0, True):
            with self.assertRaisesRegex(ValueError, "pieces must be a positive divisor of the "
                                                    "chunk count 2"):
                kgd.chunk_delta_piece_maps_mosaic(k, w, g, pieces=bad)
        with self.assertRaisesRegex(ValueError, "pieces=3 must be a positive divisor"):
            kgd.chunk_delta_piece_maps_mosaic(k, w, g, pieces=3)
        for kw in (dict(split_output=True), dict(store_v_new=True), dict(store_h=True),
                   dict(stages="io")):
            with self.assertRaisesRegex(ValueError, "summary=True runs the two-warpgroup state "
                                                    "chain", msg=str(kw)):
                _t0_fwd_call(summary=True, **kw)

    def test_rejects_unknown_or_unsplit_split_stages(self):
        with self.assertRaisesRegex(ValueError, "split_stages must be one of"):
            _t0_fwd_call(split_output=True, split_stages=4)
        with self.assertRaisesRegex(ValueError, "split_stages=3 .* needs split_output=True"):
            _t0_fwd_call(split_stages=3)

    def test_rejects_unknown_or_unsplit_split_order(self):
        with self.assertRaisesRegex(ValueError, "split_order must be one of"):
            _t0_fwd_call(split_output=True, split_order="ahead")
        with self.assertRaisesRegex(ValueError, "needs split_output=True"):
            _t0_fwd_call(split_order="prepare_first")

    def test_rejects_unknown_or_unsplit_state_layout(self):
        with self.assertRaisesRegex(ValueError, "state_layout must be one of"):
            _t0_fwd_call(split_output=True, state_layout="kvt")
        with self.assertRaisesRegex(ValueError, "state_layout='vk' .* needs split_output=True"):
            _t0_fwd_call(state_layout="vk")

    def test_rejects_unknown_or_combined_stages(self):
        with self.assertRaisesRegex(ValueError, "stages must be one of"):
            _t0_fwd_call(stages="gram")
        for kw in (dict(store_v_new=True), dict(store_h=True),
                   dict(store_h=True, split_output=True, split_order="state_ag")):
            with self.assertRaisesRegex(ValueError, "timing ablation without extra outputs"):
                _t0_fwd_call(stages="state", **kw)
        with self.assertRaisesRegex(ValueError, "'readout' is an ablation of the three-warpgroup"
                                                ".* needs split_output=True"):
            _t0_fwd_call(stages="readout")


# Interpreted (slow; PJRT_NPROC=8 as the module docstring says): what the stages compute.
@pytest.mark.slow
class FusedT0StagesInterpretTest(absltest.TestCase):
    """``"io"`` returns the loaded ``v`` and the initial state, ``"state"`` the ``v_new`` and
    the final state of ``"full"`` (bit-equal: the same products and roundings), and
    ``"no_store"`` the last chunk's ``o`` of ``"full"``."""

    def test_stages_compute_what_they_say(self):
        seq_len = 150  # three chunks, the last partial; GVA 2:1, h0, two documents
        q, k, v, g, beta, state, seg = _inputs(1, seq_len, 2, 1, 64, 64, 0.2, True, (70, 30))
        t0 = kgd.kkt_inverse_xla(k, beta, segment_ids=seg).astype(k.dtype)

        def run(stages, **kw):
            return kfused.chunk_delta_fused_t0_fwd_mosaic(
                q, k, v, t0, g, beta, scale=64 ** -0.5, initial_state=state, segment_ids=seg,
                interpret=True, stages=stages, **kw)

        o_full, final_full, vn_full, _ = run("full", store_v_new=True)
        _check_io_and_state_stages(run, v, state, vn_full, final_full)
        o_ns = run("no_store")[0]
        last = slice(2 * C, seq_len)
        np.testing.assert_array_equal(np.asarray(o_ns[:, last]), np.asarray(o_full[:, last]))
        # summary=True (MOSAIC_GPU.md Sec. 42): "state"'s chain, only the final state stored
        o_sum, final_sum, vn_sum, h_sum = run("full", summary=True)
        self.assertIsNone(o_sum)
        self.assertIsNone(vn_sum)
        self.assertIsNone(h_sum)
        np.testing.assert_array_equal(np.asarray(final_sum), np.asarray(final_full))


def _check_split_stage_exports(test, stages, split_order="state_ag", split_stages=3, dk=128,
                               dv=128, dtype=jnp.bfloat16, deltanet=False):
    q, k, v, g, beta, state, seg = _inputs(1, 200, 2, 1, dk, dv, None if deltanet else 0.2,
                                           True, (70, 30), dtype)
    t0 = kgd.kkt_inverse_xla(k, beta, segment_ids=seg).astype(k.dtype)

    def fn(q, k, v, t0, g, beta, state, seg):
        return kfused.chunk_delta_fused_t0_fwd_mosaic(
            q, k, v, t0, g, beta, scale=0.1, initial_state=state, segment_ids=seg,
            split_output=True, split_order=split_order, split_stages=split_stages,
            stages=stages)

    exported = jax.export.export(jax.jit(fn), platforms=["cuda"])(
        q, k, v, t0, g, beta, state, seg)
    text = exported.mlir_module()
    test.assertEqual(text.count("custom_call @mosaic_gpu"), 1)
    name = kfused.fused_t0_kernel_name(split_output=True, split_order=split_order,
                                       split_stages=split_stages, stages=stages)
    test.assertIn(name + "/", text)  # the op's named scope, then the kernel's own
    test.assertEqual([(a.shape, a.dtype) for a in exported.out_avals[:2]],
                     [((1, 200, 2, dv), dtype), ((1, 2, dk, dv), jnp.float32)])


class SplitStagesTest(parameterized.TestCase):
    """The timing ablations of the three-warpgroup kernel (``stages`` with ``split_output``,
    :data:`kfused.SPLIT_T0_STAGES`, MOSAIC_GPU.md Sec. 39): each exports for CUDA under its
    own kernel name (K = V = 128 bf16 with ``h0`` and documents at three ring stages, so within
    the 227 KB SMEM limit with the aliases; a two-stage ``readout_first`` for the stages every
    order takes; K 64 fp16 DeltaNet), ``"full"`` is the production kernel's jaxpr and
    ``"nobar"`` differs from it only in ``unsafe_no_auto_barriers`` and the name, and the bad
    combinations are refused (CI, about 10 s)."""

    @parameterized.named_parameters(
        ("io_sa_s3", "io"),
        ("state_sa_s3", "state"),
        ("readout_sa_s3", "readout"),
        ("no_store_sa_s3", "no_store"),
        ("nobar_sa_s3", "nobar"),
        ("io_ro_s2", "io", "readout_first", 2),
        ("no_store_ro_s2", "no_store", "readout_first", 2),
        ("state_sa_s2_fp16_deltanet_K64", "state", "state_ag", 2, 64, 64, jnp.float16, True),
        ("readout_sa_s3_K128_V64", "readout", "state_ag", 3, 128, 64),
    )
    def test_split_stage_exports_for_cuda(self, *args):
        _check_split_stage_exports(self, *args)

    def test_split_stage_protocols_cannot_deadlock(self):
        # _split_protocol's model of each ablation (LoweringTest.test_split_protocol_cannot_
        # deadlock's check; "no_store" and "nobar" are "full"'s protocol)
        _check_split_protocol(self, seeds=20, stages="io")
        for stages in ("state", "readout"):
            _check_split_protocol(self, seeds=40, stages=stages, orders=("state_ag",))
        # and the check sees a broken one: "readout" publishing v without waiting for s_free
        protocol = _split_protocol

        def without_s_free(order, depth, num_chunks, stages="full"):
            state, *others = protocol(order, depth, num_chunks, stages)
            return [[e for e in state if e[:2] != ("W", "s_free")]] + others

        with mock.patch.object(sys.modules[__name__], "_split_protocol", without_s_free):
            with self.assertRaisesRegex(AssertionError, "readout, .*still read"):
                _check_split_protocol(self, seeds=5, stages="readout", orders=("state_ag",))

    def test_kernel_names(self):
        name = kfused.fused_t0_kernel_name
        self.assertEqual(name(), "gdn_chunk_delta_fused_t0_fwd")
        self.assertEqual(name(stages="io"), "gdn_chunk_delta_fused_t0_fwd_abl_io")
        self.assertEqual(name(split_output=True), "gdn_chunk_delta_fused_t0_fwd_split_ro")
        self.assertEqual(name(split_output=True, split_order="state_ag", split_stages=3,
                              stages="readout"),
                         "gdn_chunk_delta_fused_t0_fwd_split_sa_s3_abl_readout")
        self.assertEqual(name(split_output=True, split_order="prepare_first", split_stages=3,
                              state_layout="vk"), "gdn_chunk_delta_fused_t0_fwd_split_s3_vk")

    def test_full_is_the_production_kernel_and_nobar_only_drops_the_barriers(self):
        q, k, v, g, beta, state, seg = _inputs(1, 150, 2, 1, 64, 128, 0.2, True, (70, 30))
        t0 = jnp.zeros((1, 150, 2, C), k.dtype)
        for interpret in (False, True):
            for order, depth in (("state_ag", 3), ("readout_first", 2)):
                def jaxpr(**kw):
                    return str(jax.make_jaxpr(lambda *a: kfused.chunk_delta_fused_t0_fwd_mosaic(
                        *a, scale=0.1, initial_state=state, segment_ids=seg,
                        interpret=interpret, split_output=True, split_order=order,
                        split_stages=depth, **kw))(q, k, v, t0, g, beta))

                default = jaxpr()
                self.assertEqual(jaxpr(stages="full"), default)
                nobar = jaxpr(stages="nobar")
                self.assertNotEqual(nobar, default)
                self.assertEqual(nobar.replace("unsafe_no_auto_barriers=True",
                                               "unsafe_no_auto_barriers=False")
                                 .replace("_abl_nobar", ""), default)
                stages = ("io", "no_store") + (("state", "readout") if order == "state_ag"
                                               else ())
                for stage in stages:
                    self.assertNotEqual(jaxpr(stages=stage), default, f"{order} {stage}")

    def test_rejects_bad_combinations(self):
        fn = _t0_fwd_call

        split = dict(split_output=True, split_order="state_ag", split_stages=3)
        with self.assertRaisesRegex(ValueError, "'v_new' is an ablation of the two-warpgroup "
                                                "kernel: with split_output=True"):
            fn(stages="v_new", **split)
        for stages in ("state", "readout"):
            with self.assertRaisesRegex(ValueError, "needs split_order='state_ag'"):
                fn(stages=stages, split_output=True, split_order="prepare_mid", split_stages=3)
        with self.assertRaisesRegex(ValueError, "state_layout='kv' split kernel"):
            fn(stages="io", state_layout="vk", **split)
        for kw in (dict(store_v_new=True), dict(store_h=True)):
            with self.assertRaisesRegex(ValueError, "timing ablation without extra outputs"):
                fn(stages="readout", **split, **kw)


def _readout_float64(q, k, v, g, state, seg, scale):
    """float64 ``o`` ``[B, T, H, V]`` of the split kernel's ``stages="readout"``: per chunk of
    64 tokens ``o_t = scale (conn_t e^{G_t} q_t . S_0 + sum_s D_ts (q_t . k_s) v_s)`` with
    ``S_0`` the initial state rounded to ``v``'s dtype (the published 16-bit tile) for every
    chunk, ``G`` the chunk-local inclusive cumsum of ``g``, ``D_ts = e^{G_t - G_s}`` on causal
    same-document pairs and ``conn_t`` 1 on the tokens of the document open before the chunk
    (in chunk 0 the first document, which the initial state enters)."""
    batch, seq_len, heads, dv = v.shape
    qf, kf = (np.asarray(gdn_test._expand(x, heads).astype(jnp.float32), np.float64)
              for x in (q, k))
    vf = np.asarray(v.astype(jnp.float32), np.float64)
    gf = np.zeros((batch, seq_len, heads)) if g is None else np.asarray(g, np.float64)
    s0 = np.asarray(state.astype(v.dtype).astype(jnp.float32), np.float64)
    doc = _document_index(seg, batch, seq_len)
    out = np.zeros((batch, seq_len, heads, dv))
    for b in range(batch):
        for c0 in range(0, seq_len, C):
            rows = slice(c0, min(c0 + C, seq_len))
            d = doc[b, rows]
            open_doc = d[0] if c0 == 0 else doc[b, c0 - 1]
            conn = (d == open_doc).astype(np.float64)
            causal = np.tril(np.ones((len(d), len(d)), bool)) & (d[:, None] == d[None, :])
            for h in range(heads):
                gc = np.cumsum(gf[b, rows, h])
                dmat = np.where(causal, np.exp(np.where(causal, gc[:, None] - gc[None, :], 0)),
                                0.0)
                qh, kh = qf[b, rows, h], kf[b, rows, h]
                out[b, rows, h] = scale * ((conn * np.exp(gc))[:, None] * (qh @ s0[b, h])
                                           + ((qh @ kh.T) * dmat) @ vf[b, rows, h])
    return out


# Interpreted, slow like every interpreted Mosaic GPU test (BUILD.md: the interpreter's barrier
# callbacks can hang a 2-core host; 7.4 s alone on 2 cores, 2026-12-06): the smallest
# split_protocol="early_s" case (MOSAIC_GPU.md Sec. 40) against the fp32 reference; the others
# are in FusedT0SplitInterpretTest. CI has the protocol model, the export, the jaxpr, refusals.
@pytest.mark.slow
class SplitProtocolInterpretTest(absltest.TestCase):

    def test_early_s_state_ag_s3_matches_reference(self):
        # state_ag with three stages, T 130 (three chunks, the last partial: both published
        # halves are reused), GVA 2:1, h0, a document starting inside chunk 0; all stores on.
        _check_fused_kernel(self, 1, 130, 2, 1, 64, 64, 0.05, True, (40,),
                            split_output=True, split_order="state_ag", split_stages=3,
                            split_protocol="early_s")


# Interpreted (slow; PJRT_NPROC=8 as the module docstring says): what the split stages compute.
@pytest.mark.slow
class SplitStagesInterpretTest(absltest.TestCase):
    """``state_ag`` with three ring stages at T 200 (four chunks: the ring and the published
    tiles wrap; GVA 2:1, ``h0``, documents starting inside chunks, a partial last chunk):
    ``"full"`` against the fp32 reference; ``"io"`` returns the loaded ``v`` and the initial
    state, ``"state"`` the ``v_new`` and final state of ``"full"`` (bit-equal), ``"readout"``
    the frozen-chain read-out (:func:`_readout_float64`) and the initial state,
    ``"no_store"`` the last chunk's ``o`` of ``"full"`` and ``"nobar"`` ``"full"``'s
    results."""

    def test_split_stages_compute_what_they_say(self):
        seq_len, dk = 200, 64
        q, k, v, g, beta, state, seg = _inputs(1, seq_len, 2, 1, dk, 64, 0.2, True, (70, 30))
        t0 = kgd.kkt_inverse_xla(k, beta, segment_ids=seg).astype(k.dtype)
        scale = dk ** -0.5

        def run(stages, **kw):
            return kfused.chunk_delta_fused_t0_fwd_mosaic(
                q, k, v, t0, g, beta, scale=scale, initial_state=state, segment_ids=seg,
                interpret=True, split_output=True, split_order="state_ag", split_stages=3,
                stages=stages, **kw)

        o_full, final_full, vn_full, _ = run("full", store_v_new=True)
        o_ref, final_ref, _ = gdn_test._reference(q, k, v, g, beta, state, seg, scale)
        for got, want in ((o_full, o_ref), (final_full, final_ref)):
            self.assertLess(tolerances.rel_err(got, want), _FWD_GATE[jnp.dtype(v.dtype)])
        _check_io_and_state_stages(run, v, state, vn_full, final_full)
        o_ro, final_ro, _, _ = run("readout")
        np.testing.assert_array_equal(np.asarray(final_ro), np.asarray(state))
        want = _readout_float64(q, k, v, g, state, seg, scale)
        got = np.asarray(o_ro.astype(jnp.float32), np.float64)
        self.assertLess(np.sqrt(np.mean((got - want) ** 2) / np.mean(want ** 2)), 5e-3)
        o_ns = run("no_store")[0]
        last = slice(3 * C, seq_len)
        np.testing.assert_array_equal(np.asarray(o_ns[:, last]), np.asarray(o_full[:, last]))
        o_nb, final_nb, _, _ = run("nobar")
        np.testing.assert_array_equal(np.asarray(o_nb), np.asarray(o_full))
        np.testing.assert_array_equal(np.asarray(final_nb), np.asarray(final_full))


class ValidationTest(absltest.TestCase):

    def test_rejects_what_the_kernels_cannot_run(self):
        q, k, v, g, beta, _, _ = _inputs(1, 64, 2, 1, 64, 64, 0.1, False, None)
        t0 = jnp.zeros((1, 64, 2, C), k.dtype)
        inverse = kgd.chunk_kkt_inverse_mosaic
        with self.assertRaisesRegex(ValueError, "beta must be"):
            inverse(k, beta[:, :32])
        with self.assertRaisesRegex(ValueError, "beta must be"):
            inverse(jnp.concatenate([k, k, k], axis=2), beta)  # H % Hk != 0
        with self.assertRaisesRegex(ValueError, "16-bit dtype"):
            inverse(k.astype(jnp.float32), beta)
        with self.assertRaisesRegex(ValueError, "head dims"):
            inverse(k[..., :32], beta)
        with self.assertRaisesRegex(ValueError, "segment_ids must be"):
            inverse(k, beta, segment_ids=jnp.zeros((1, 32), jnp.int32))
        with self.assertRaisesRegex(ValueError, "return_w needs stages='full'"):
            inverse(k, beta, g=g, return_w=True, stages="gram")
        with self.assertRaisesRegex(ValueError, "g must be"):
            inverse(k, beta, g=g[:, :, :1], return_w=True)
        fused = kfused.chunk_delta_fused_t0_fwd_mosaic
        with self.assertRaisesRegex(ValueError, "q must have"):
            fused(q[:, :32], k, v, t0, g, beta, scale=1.0)
        with self.assertRaisesRegex(ValueError, "t0 must be"):
            fused(q, k, v, t0[..., :32], g, beta, scale=1.0)
        with self.assertRaisesRegex(ValueError, "t0 must be"):
            fused(q, k, v, t0.astype(jnp.float32), g, beta, scale=1.0)
        with self.assertRaisesRegex(ValueError, "beta must be"):
            fused(q, k, v, t0, g, beta[:, :, :1], scale=1.0)
        with self.assertRaisesRegex(ValueError, "16-bit dtype"):
            fused(q, k, v.astype(jnp.float32), t0, g, beta, scale=1.0)
        with self.assertRaisesRegex(ValueError, "g must be"):
            fused(q, k, v, t0, g[:, :, :1], beta, scale=1.0)
        with self.assertRaisesRegex(ValueError, "initial_state must be"):
            fused(q, k, v, t0, g, beta, scale=1.0, initial_state=jnp.zeros((1, 2, 64, 32)))

    def test_shapes_and_optional_stores(self):
        q, k, v, g, beta, state, _ = _inputs(1, 100, 2, 1, 64, 64, 0.1, True, None)
        t0 = jax.eval_shape(kgd.chunk_kkt_inverse_mosaic, k, beta)
        self.assertEqual((t0.shape, t0.dtype), ((1, 100, 2, C), k.dtype))
        t0 = jnp.zeros(t0.shape, t0.dtype)
        for store_v_new, store_h in ((False, False), (True, False), (False, True)):
            out = jax.eval_shape(
                lambda *a, s0, sv=store_v_new, sh=store_h:
                kfused.chunk_delta_fused_t0_fwd_mosaic(*a, scale=1.0, initial_state=s0,
                                                       store_v_new=sv, store_h=sh),
                q, k, v, t0, g, beta, s0=state)
            self.assertEqual(out[0].shape, v.shape)
            self.assertEqual((out[1].shape, out[1].dtype), ((1, 2, 64, 64), jnp.float32))
            self.assertEqual(out[2] is None, not store_v_new)
            self.assertEqual(out[3] is None, not store_h)
            if store_h:
                self.assertEqual((out[3].shape, out[3].dtype), ((1, 2, 2, 64, 64), v.dtype))
        self.assertIn("fused_t0", kgd.FORWARDS)
        self.assertIn("fused_t0_split", kgd.FORWARDS)
        split = jax.eval_shape(
            lambda *a, s0: kfused.chunk_delta_fused_t0_fwd_mosaic(
                *a, scale=1.0, initial_state=s0, store_v_new=True, store_h=True,
                split_output=True), q, k, v, t0, g, beta, s0=state)
        self.assertEqual([(x.shape, x.dtype) for x in split],
                         [(v.shape, v.dtype), ((1, 2, 64, 64), jnp.float32), (v.shape, v.dtype),
                          ((1, 2, 2, 64, 64), v.dtype)])
        two = jax.eval_shape(lambda *a: kgd.gated_delta_rule_fwd_mosaic(*a, forward="fused_t0"),
                             q, k, v, g, beta)
        self.assertLen(two, 2)


# GpuTest's fused-kernel cases (both layouts): B, T, H, Hk, K, V, decay (None: DeltaNet), h0,
# document lengths, dtype.
_GPU_KERNEL_CASES = (
    ("plain_T2048_K128_V128", 2, 2048, 4, 4, 128, 128, 0.05, False, None, jnp.bfloat16),
    ("gva_h0_packed_T4096_K128_V128", 1, 4096, 4, 2, 128, 128, 0.05, True,
     (700, 1, 64, 999, 1200), jnp.bfloat16),
    ("strong_decay_h0_partial_T1000_K64_V128", 2, 1000, 2, 1, 64, 128, 5.0, True, None,
     jnp.bfloat16),
    ("deltanet_h0_packed_T2048_K64_V64", 1, 2048, 2, 2, 64, 64, None, True, (300, 700),
     jnp.bfloat16),
    ("fp16_packed_T3000_K128_V64", 1, 3000, 3, 3, 128, 64, 0.2, False, (10, 54, 500, 2000),
     jnp.float16),
)
_GPU_FORWARD_CASES = (
    ("gva_h0_packed_T4096_K128_V128", 2, 4096, 4, 2, 128, 128, 0.05, True,
     (700, 1, 64, 999, 1200)),
    ("deltanet_h0_partial_T1000_K128_V128", 1, 1000, 2, 2, 128, 128, None, True, None),
)


_GPU_T0_CASES = (
    ("gva_packed_T4096_K128", 2, 4096, 4, 2, 128, 64, 0.05, False,
     (700, 1, 64, 999, 1200), jnp.bfloat16, 0.0),
    ("fp16_packed_T3000_K64", 1, 3000, 3, 3, 64, 64, 0.2, False, (10, 54, 500, 2000),
     jnp.float16, 0.0),
    ("correlated_T2048_K128", 1, 2048, 4, 2, 128, 64, 0.01, False, (300,), jnp.bfloat16,
     3.0),
)


@pytest.mark.gpu
class GpuTest(kmg_test.HopperTestCase):
    """The compiled kernels (wgmma, TMA) against the float64 / fp32 references."""

    @parameterized.named_parameters(*_GPU_T0_CASES)
    def test_t0_matches_float64(self, batch, seq_len, heads, kv_heads, dk, dv, decay, h0, docs,
                                dtype, correlated):
        _, k, _, _, beta, _, seg = _inputs(batch, seq_len, heads, kv_heads, dk, dv, decay, h0,
                                           docs, dtype, correlated=correlated, seed=11)
        _check_t0(self, k, beta, seg, kgd.chunk_kkt_inverse_mosaic(k, beta, segment_ids=seg))

    @parameterized.named_parameters(
        # MOSAIC_GPU.md Sec. 36: the T0 kernel's W (return_w) on the GPU, S1's 8 chunks per CTA
        ("cpc8_gva_packed_partial_T3000_K128", 2, 3000, 4, 2, 128, 128, 0.05, (700, 1, 64, 999),
         jnp.bfloat16, 8),
        ("fp16_deltanet_T1000_K64", 1, 1000, 2, 1, 64, 64, None, None, jnp.float16, None),
    )
    def test_w_matches_wy_factor(self, batch, seq_len, heads, kv_heads, dk, dv, decay, docs,
                                 dtype, cpc):
        _, k, v, g, beta, _, seg = _inputs(batch, seq_len, heads, kv_heads, dk, dv, decay,
                                           False, docs, dtype, seed=11)
        t0, w = kgd.chunk_kkt_inverse_mosaic(k, beta, g=g, segment_ids=seg, return_w=True,
                                             chunks_per_cta=cpc)
        np.testing.assert_array_equal(
            np.asarray(t0, np.float32),
            np.asarray(kgd.chunk_kkt_inverse_mosaic(k, beta, segment_ids=seg,
                                                    chunks_per_cta=cpc), np.float32))
        want, _ = wy_test._reference(k, v, g, beta, seg)
        rounding = tolerances.rel_err(want.astype(dtype).astype(jnp.float32), want)
        err = tolerances.rel_err(w, want)
        print(f"W: relative RMS {err:.3e}, the WY factor's own rounding {rounding:.3e}")
        self.assertLess(err, 1.05 * rounding)

    @parameterized.named_parameters(
        *_GPU_T0_CASES,
        # 8 chunks per CTA (S1's), GVA, a partial last group and chunk, bf16 K 64
        ("cpc8_gva_packed_partial_T3000_K64", 2, 3000, 4, 1, 64, 64, 0.1, False,
         (100, 900, 64, 1), jnp.bfloat16, 0.0, 8),
    )
    def test_t0_substitution_matches_float64(self, batch, seq_len, heads, kv_heads, dk, dv,
                                             decay, h0, docs, dtype, correlated,
                                             chunks_per_cta=None):
        # inverse="substitution" (MOSAIC_GPU.md Sec. 13): the inline_mgpu forward substitution
        # runs only here (interpreted, its plain-jnp form runs instead).
        _, k, _, _, beta, _, seg = _inputs(batch, seq_len, heads, kv_heads, dk, dv, decay, h0,
                                           docs, dtype, correlated=correlated, seed=11)
        t0 = kgd.chunk_kkt_inverse_mosaic(k, beta, segment_ids=seg,
                                          chunks_per_cta=chunks_per_cta, inverse="substitution")
        self.assertEqual(t0.dtype, k.dtype)
        _check_t0(self, k, beta, seg, t0)

    @parameterized.named_parameters(
        *_GPU_T0_CASES,
        ("cpc8_gva_packed_partial_T3000_K64", 2, 3000, 4, 1, 64, 64, 0.1, False,
         (100, 900, 64, 1), jnp.bfloat16, 0.0, 8),
    )
    def test_t0_split_merge_matches_float64(self, batch, seq_len, heads, kv_heads, dk, dv,
                                            decay, h0, docs, dtype, correlated,
                                            chunks_per_cta=None):
        # refine="split_merge" (MOSAIC_GPU.md Sec. 15): hi/lo split merge operands instead of
        # the Newton step; the same gate as the Newton kernels.
        _, k, _, _, beta, _, seg = _inputs(batch, seq_len, heads, kv_heads, dk, dv, decay, h0,
                                           docs, dtype, correlated=correlated, seed=11)
        t0 = kgd.chunk_kkt_inverse_mosaic(k, beta, segment_ids=seg,
                                          chunks_per_cta=chunks_per_cta, inverse="substitution",
                                          refine="split_merge")
        self.assertEqual(t0.dtype, k.dtype)
        err, _ = _check_t0(self, k, beta, seg, t0)
        print(f"T0 split_merge {self.id()}: relative RMS {err:.3e}")

    @parameterized.named_parameters(*_GPU_KERNEL_CASES)
    def test_fused_t0_kernel_matches_reference(self, *case):
        _check_fused_kernel(self, *case, seed=5, interpret=False, allclose=False)

    @parameterized.named_parameters(*_GPU_FORWARD_CASES)
    def test_forward_fused_t0_matches_reference_and_three_pass(self, *case):
        _check_forward(self, *case, seed=3, interpret=False)

    def test_vjp_fused_t0_matches_chunked_vjp(self):
        # rows of 8 CTAs: without the patch the op would run three_pass (resolve_forward)
        with mock.patch.object(mosaic_vjp, "FUSED_T0_FALLBACK", False):
            fused_test._check_vjp(self, bwd_test._pipeline_inputs(
                1, 2048, 4, 2, 128, 128, 0.05, True, True, (700, 1, 64, 999), seed=11), False,
                "fused_t0")

    @parameterized.named_parameters(*_GPU_KERNEL_CASES)
    def test_fused_t0_split_kernel_matches_reference(self, *case):
        _check_fused_kernel(self, *case, seed=5, interpret=False, allclose=False,
                            split_output=True)

    @parameterized.named_parameters(*_GPU_KERNEL_CASES)
    def test_fused_t0_split_prepare_first_kernel_matches_reference(self, *case):
        _check_fused_kernel(self, *case, seed=5, interpret=False, allclose=False,
                            split_output=True, split_order="prepare_first")

    @parameterized.named_parameters(
        (f"{order}_s3_{name}", order, *case) for order in ("prepare_mid", "state_ag")
        for name, *case in _GPU_KERNEL_CASES)
    def test_fused_t0_split_sec17_s3_kernel_matches_reference(self, order, *case):
        # MOSAIC_GPU.md Sec. 17: prepare_mid (Ag between the read-out's halves) and state_ag
        # (the state warpgroup forms Ag), three-stage ring (RefUnion of S and the fp32 state
        # staging; vd_s in x_s).
        errs = _check_fused_kernel(self, *case, seed=5, interpret=False, allclose=False,
                                   split_output=True, split_order=order, split_stages=3)
        print(f"{order}_s3 {self.id()}: " + ", ".join(f"{k} {v:.3e}" for k, v in errs.items()))

    def test_fused_t0_split_sec17_variants_are_bit_equal(self):
        # Same arithmetic, other schedules: bit for bit at a realistic row (documents, h0,
        # GVA, 64 chunks, a partial last one); the variants MOSAIC_GPU.md Sec. 17 times.
        _check_split_variants_bit_equal(
            self, _inputs(1, 4090, 4, 2, 128, 128, 0.05, True, (700, 1, 64, 999, 1200),
                          seed=5), False,
            variants=[("state_ag", 3), ("prepare_mid", 3), ("state_ag", 2), ("shared_mask", 2)])

    @parameterized.named_parameters(*_GPU_KERNEL_CASES)
    def test_fused_t0_split_early_s_kernel_matches_reference(self, *case):
        # MOSAIC_GPU.md Sec. 40: split_protocol="early_s" (Q S_c on its own barrier), state_ag
        # with three stages, against the fp32 reference, all stores on.
        errs = _check_fused_kernel(self, *case, seed=5, interpret=False, allclose=False,
                                   split_output=True, split_order="state_ag", split_stages=3,
                                   split_protocol="early_s")
        print(f"early_s sa_s3 {self.id()}: " + ", ".join(f"{k} {v:.3e}"
                                                         for k, v in errs.items()))

    def test_fused_t0_split_early_s_is_bit_equal(self):
        # Sec. 40: the same products in the same accumulators, only the barrier Q S_c waits
        # on moves: bit for bit at a realistic row (64 chunks, documents, h0, GVA).
        early = {"split_protocol": "early_s"}
        _check_split_variants_bit_equal(
            self, _inputs(1, 4090, 4, 2, 128, 128, 0.05, True, (700, 1, 64, 999, 1200),
                          seed=5), False,
            variants=[("state_ag", 3, early), ("readout_first", 2, early),
                      ("prepare_mid", 3, early)])

    @parameterized.named_parameters(
        (f"{order}_s{depth}_{name}", order, depth, *case)
        for order, depth in (("readout_first", 2), ("state_ag", 3), ("shared_mask", 2))
        for name, *case in _GPU_KERNEL_CASES)
    def test_fused_t0_split_vk_kernel_matches_reference(self, order, depth, *case):
        # MOSAIC_GPU.md Sec. 35: state_layout="vk" (S^T carried, register left operands; V^T
        # by an identity product) against the fp32 reference, all stores on; errors printed
        # beside the default layout's.
        kw = dict(seed=5, interpret=False, allclose=False, split_output=True,
                  split_order=order, split_stages=depth)
        errs = _check_fused_kernel(self, *case, **kw, state_layout="vk")
        base = _check_fused_kernel(self, *case, **kw)
        print(f"vk {order}_s{depth} {self.id()}: " + ", ".join(
            f"{k} {v:.3e} (kv {base[k]:.3e})" for k, v in errs.items()))
        for name, err in errs.items():  # the same roundings: no more than 1.5x kv's error
            self.assertLessEqual(err, 1.5 * base[name] + 1e-6, name)

    def test_fused_t0_split_vk_is_close_to_kv(self):
        # A realistic row (64 chunks, partial last one, documents, h0, GVA): the transposed
        # chain against the default layout; only the wgmma summation order may differ.
        q, k, v, g, beta, state, seg = _inputs(1, 4090, 4, 2, 128, 128, 0.05, True,
                                               (700, 1, 64, 999, 1200), seed=5)
        t0 = kgd.chunk_kkt_inverse_mosaic(k, beta, segment_ids=seg)

        def run(**kw):
            return kfused.chunk_delta_fused_t0_fwd_mosaic(
                q, k, v, t0, g, beta, scale=128 ** -0.5, initial_state=state,
                segment_ids=seg, store_v_new=True, store_h=True, split_output=True, **kw)

        for name, a, b in zip(("o", "final_state", "v_new", "h"), run(state_layout="vk"),
                              run(), strict=True):
            err = tolerances.rel_err(a, b)
            print(f"vk vs kv {name}: relative RMS {err:.3e}")
            self.assertLess(err, _FWD_GATE[jnp.dtype(jnp.bfloat16)], name)

    @parameterized.named_parameters(*_GPU_FORWARD_CASES)
    def test_forward_fused_t0_split_matches_reference_and_three_pass(self, *case):
        _check_forward(self, *case, seed=3, interpret=False, forward="fused_t0_split")

    def test_vjp_fused_t0_split_matches_chunked_vjp(self):
        # rows of 8 CTAs: without the patch the op would run three_pass (resolve_forward)
        with mock.patch.object(mosaic_vjp, "FUSED_T0_FALLBACK", False):
            fused_test._check_vjp(self, bwd_test._pipeline_inputs(
                1, 2048, 4, 2, 128, 128, 0.05, True, True, (700, 1, 64, 999), seed=11), False,
                "fused_t0_split")


if __name__ == "__main__":
    absltest.main()
