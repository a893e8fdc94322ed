"""The pieces' maps and passes from zero in one launch (MOSAIC_GPU.md Sec. 57).

``mosaic_vjp.MAPS_CARRY_X`` (off by default): the fused ``T0`` forward's sequence pieces take
``M_p`` and ``X_p`` from
:func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu_maps_x.chunk_delta_piece_maps_x_mosaic`
(kernel ``gdn_chunk_delta_h_maps_x``, with ``PIECE_SKIP`` ``..._skip``) instead of the maps
launch plus the fused ``T0`` kernel's ``summary=True`` launch.

* ``MapsXInterpretTest``: ``M_p`` bit-equal to
  :func:`pallas_kernels.gated_delta_rule.kernel_mosaic_gpu.chunk_delta_piece_maps_mosaic`'s;
  ``X_p`` against the summary launch's (the same within the 16-bit operand rounding) and both
  against the fp32 token-serial reference (``reference.py``) run on each piece from zero, the
  new one no worse than 1.5x the summary's error; the affine map ``S -> M_p S + X_p`` applied
  to a random state against the reference run from that state. The CI case (T 384, P = 2
  pieces of 3 chunks, one launch, about 5 s on two cores) checks the last two only; the rest
  is ``slow`` (K 128 / V 64 with GVA, K 64 / V 128, DeltaNet, ``piece_skip`` bit-equal to no
  skip). Multi-launch interpreted tests need ``PJRT_NPROC=8`` (MOSAIC_GPU.md Sec. 10).
* ``MapsXApiTest`` (``slow``): the public op with the option (and with ``PIECE_SKIP``):
  ``o``, the final state, ``u`` and every gradient against the fp32 ``lax.scan`` reference's
  autodiff, with packed documents, an initial state and a partial last chunk (T 1000).
* ``MapsXLoweringTest`` (CI): the op's ``value_and_grad`` lowered for CUDA with the option
  (and with ``PIECE_SKIP``): one ``maps_x`` launch, no maps or summary launch, 6 launches
  against the 7 without it.
* ``MapsXGpuTest`` (``gpu``): the compiled kernel at K = V = 128 with GVA, and the op.
"""

import functools
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest, parameterized

from pallas_kernels.common import mosaic_gpu
from pallas_kernels.common import mosaic_gpu_lib as mgl
from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu_maps_x as kmx
from pallas_kernels.gated_delta_rule import mosaic_vjp, reference
from tests import tolerances
from tests.pallas_kernels import kernel_mosaic_gdn_piece_skip_test as ps_test
from tests.pallas_kernels import kernel_mosaic_gdn_test as gdn_test
from tests.pallas_kernels import kernel_mosaic_gpu_test as kmg_test
from tests.pallas_kernels import mosaic_gpu_dispatch_test as dispatch_test

C = mgl.CHUNK


def _maps_x(case, pieces, skip=False, interpret=True):
    """``(maps, x_local)`` of the new launch, ``[B, P, H, K, K]`` and ``[B, P, H, K, V]``."""
    q, k, v, g, beta, seg, t0, w, gc, docs = case
    cuts = mgl.piece_cuts(docs[1], pieces) if skip else None
    return kmx.chunk_delta_piece_maps_x_mosaic(k, v, t0, w, g, beta, pieces=pieces,
                                               gate_cumsum=gc, doc_vecs=docs,
                                               interpret=interpret, piece_skip=skip,
                                               piece_cuts=cuts)


def _reference_pieces(case, pieces, start):
    """fp32 ``[B, P, H, K, V]``: each piece run by the token-serial reference from ``start``
    (``[B, H, K, V]``, or ``None``: zeros), reset where a document starts on its first token.
    One reference call, the pieces as rows."""
    q, k, v, g, beta, seg, *_ = case
    batch, seq_len, heads = v.shape[:3]

    def rows(x):  # [B, T, ...] -> [B P, T / P, ...]
        return None if x is None else x.reshape((batch * pieces, seq_len // pieces)
                                                + x.shape[2:])
    s0 = None
    if start is not None:
        s0 = jnp.repeat(start, pieces, axis=0)  # [B P, H, K, V]
        if seg is not None:  # a document starting on a piece's first token resets it
            seg_np = np.asarray(seg).reshape(batch, pieces, seq_len // pieces)
            cut = np.zeros((batch, pieces), bool)
            cut[:, 1:] = seg_np[:, 1:, 0] != seg_np[:, :-1, -1]
            s0 = jnp.where(jnp.asarray(cut.reshape(-1))[:, None, None, None], 0.0, s0)
    kf = rows(gdn_test._expand(k, heads))
    _, final, _ = jax.jit(functools.partial(reference.gated_delta_rule_reference, scale=1.0))(
        kf, kf, rows(v.astype(jnp.float32)), rows(g), rows(beta), initial_state=s0,
        segment_ids=rows(seg))
    return np.asarray(final).reshape((batch, pieces) + final.shape[1:])


def _check_against_reference(test, case, pieces, maps, x, x_summary=None):
    """``X_p`` against the reference from zero (no worse than 1.5x the summary's error when
    given, and below 1 % of its scale), and ``M_p e + X_p`` against the reference from ``e``."""
    maps, x = np.asarray(maps), np.asarray(x)
    want = _reference_pieces(case, pieces, None)
    scale = np.abs(want).max()
    test.assertGreater(scale, 0)
    err = np.abs(x - want).max()
    test.assertLess(err, 1e-2 * scale, msg=f"X_p error {err:.3e}, scale {scale:.3e}")
    if x_summary is not None:
        err_summary = np.abs(np.asarray(x_summary).reshape(x.shape) - want).max()
        test.assertLessEqual(err, 1.5 * err_summary + 1e-6 * scale,
                             msg=f"X_p error {err:.3e}, the summary's {err_summary:.3e}")
    batch, heads, dk, dv = x.shape[0], x.shape[2], x.shape[3], x.shape[4]
    entry = jax.random.normal(jax.random.key(7), (batch, heads, dk, dv), jnp.float32)
    want = _reference_pieces(case, pieces, entry)
    got = np.einsum("bphkj,bhjv->bphkv", maps, np.asarray(entry)) + x
    err = np.abs(got - want).max()
    test.assertLess(err, 1e-2 * np.abs(want).max(), msg=f"M_p e + X_p error {err:.3e}")


def _check_equal_to_two_launches(test, case, pieces, skip=False, interpret=True):
    """``M_p`` bit-equal to the maps launch's, ``X_p`` close to the summary launch's and to
    the reference; with ``skip`` also bit-equal to the new launch without it."""
    maps_old, x_old = ps_test._maps_and_summary(case, pieces, skip, interpret)
    maps, x = _maps_x(case, pieces, skip, interpret)
    np.testing.assert_array_equal(np.asarray(maps), np.asarray(maps_old))
    _check_against_reference(test, case, pieces, maps, x, x_old)
    if skip:
        maps_ns, x_ns = _maps_x(case, pieces, False, interpret)
        np.testing.assert_array_equal(np.asarray(maps), np.asarray(maps_ns))
        np.testing.assert_array_equal(np.asarray(x), np.asarray(x_ns))


def _reference_loss(seg, do, dht, du, deltanet=False):
    """:func:`mosaic_gpu_dispatch_test._gdn_loss` on the fp32 ``lax.scan`` reference."""

    def f(q, k, v, g, beta, h0):
        heads = v.shape[2]
        o, final, u = reference.gated_delta_rule_reference(
            gdn_test._expand(q, heads), gdn_test._expand(k, heads), v.astype(jnp.float32),
            None if deltanet else g, beta, scale=q.shape[-1] ** -0.5, initial_state=h0,
            segment_ids=seg)
        value = jnp.sum(o * do) + jnp.sum(final * dht) + jnp.sum(u * du)
        return value, (o, final, u)
    return f


def _check_op(test, impl, case, skip=False):
    """The public op with ``MAPS_CARRY_X`` (and ``PIECE_SKIP`` with ``skip``): ``o``, the final
    state, ``u`` and every gradient against the reference's autodiff (the gates of
    ``mosaic_gpu_dispatch_test``: outputs 5e-3, dq dk dv dh0 8e-3, dg dbeta 2e-2)."""
    q, k, v, g, beta, h0, seg, do, dht, du = case
    argnums = tuple(range(6))
    with mock.patch.object(mosaic_vjp, "MAPS_CARRY_X", True), \
            mock.patch.object(mosaic_vjp, "PIECE_SKIP", skip):
        test.assertGreater(mosaic_vjp.fused_t0_pieces("fused_t0", q.shape[0], v.shape[2],
                                                      v.shape[3], v.shape[1]), 1)
        (_, got_out), got = jax.value_and_grad(dispatch_test._gdn_loss(impl, seg, do, dht, du),
                                               argnums=argnums, has_aux=True)(
                                                   q, k, v, g, beta, h0)
    (_, want_out), want = jax.value_and_grad(_reference_loss(seg, do, dht, du),
                                             argnums=argnums, has_aux=True)(
                                                 q, k, v, g, beta, h0)
    for name, x, w in zip(("o", "final_state", "u"), got_out, want_out):
        err = tolerances.rel_err(x.astype(jnp.float32), w.astype(jnp.float32))
        test.assertLess(err, 5e-3, msg=f"{name}: relative RMS error {err:.2e}")
    for name, x, w in zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), got, want):
        test.assertEqual(x.shape, w.shape, msg=name)
        err = tolerances.rel_err(x.astype(jnp.float32), w.astype(jnp.float32))
        test.assertLess(err, 2e-2 if name in ("dg", "dbeta") else 8e-3,
                        msg=f"{name}: relative RMS error {err:.2e}")


class MapsXInterpretTest(parameterized.TestCase):
    """Interpreted (``PJRT_NPROC=8``). The first test is the CI case."""

    def test_small_against_the_reference(self):
        # T 384, P = 2 pieces of 3 chunks (the ring refills), a document inside piece 1
        case = ps_test._case(384, 1, 1, 64, 64, (250,), seed=11)
        maps, x = _maps_x(case, 2)
        _check_against_reference(self, case, 2, maps, x)
        self.assertTrue(np.all(np.asarray(maps)[:, 1] == 0))  # a document starts in piece 1
        self.assertGreater(np.abs(np.asarray(maps)[:, 0]).max(), 0)

    @pytest.mark.slow
    def test_equal_to_the_two_launches(self):
        _check_equal_to_two_launches(self, ps_test._case(512, 1, 1, 64, 64, ps_test.SMALL_DOCS),
                                     4)

    @pytest.mark.slow
    def test_k128_v64_gva(self):
        _check_equal_to_two_launches(self, ps_test._case(512, 2, 1, 128, 64, ps_test.SMALL_DOCS,
                                                         seed=1), 4)

    @pytest.mark.slow
    def test_k64_v128_no_documents(self):
        _check_equal_to_two_launches(self, ps_test._case(512, 2, 2, 64, 128, None, seed=2), 4)

    @pytest.mark.slow
    def test_deltanet(self):
        _check_equal_to_two_launches(self, ps_test._case(512, 1, 1, 64, 64, ps_test.SMALL_DOCS,
                                                         decay=None, seed=3), 4)

    @pytest.mark.slow
    def test_piece_skip(self):
        for docs in (ps_test.DOCS_A, ps_test.DOCS_B):
            _check_equal_to_two_launches(self, ps_test._case(1024, 1, 1, 64, 64, docs, seed=4),
                                         4, skip=True)


@pytest.mark.slow
class MapsXApiTest(parameterized.TestCase):
    """The public op (``PJRT_NPROC=8``) with the option, B 1, H 2 (GVA: Hk 1), K = V = 64,
    T 1000 (P = 4 pieces of 4 chunks, the last one partial), documents and ``h0``."""

    @parameterized.named_parameters(("plain", False), ("piece_skip", True))
    def test_match_reference_autodiff(self, skip):
        case = dispatch_test._gdn_case(seq_len=1000, docs=(300, 212, 188), seed=5)
        _check_op(self, "mosaic_gpu_interpret", case, skip)


class MapsXLoweringTest(absltest.TestCase):

    def _lower(self, skip):
        """The Mosaic GPU custom calls of the op's ``value_and_grad`` lowered for CUDA with
        the option (and ``PIECE_SKIP`` with ``skip``), documents, ``h0``, T 1024 (P = 4)."""
        q, k, v, g, beta, h0, seg, do, dht, du = dispatch_test._gdn_case(
            seq_len=1024, docs=ps_test.DOCS_A)
        fn = jax.value_and_grad(dispatch_test._gdn_loss("mosaic_gpu", seg, do, dht, du),
                                argnums=range(6), has_aux=True)
        with mock.patch.object(mosaic_gpu, "compute_capability", return_value=(9, 0)), \
                mock.patch.object(mosaic_vjp, "MAPS_CARRY_X", True), \
                mock.patch.object(mosaic_vjp, "PIECE_SKIP", skip):
            text = jax.jit(fn).trace(q, k, v, g, beta, h0).lower(
                lowering_platforms=("cuda",)).as_text()
        return [line for line in text.splitlines() if "custom_call @mosaic_gpu" in line]

    def test_one_launch_replaces_maps_and_summary(self):
        # without the option: 7 launches (PieceSkipLoweringTest), the maps and the summary
        # among them; with it 6, the maps_x launch in their place
        for skip in (False, True):
            calls = self._lower(skip)
            self.assertLen(calls, 6)  # len: a failing list prints whole kernels
            name = kmx.KERNEL_NAME + ("_skip" if skip else "")
            self.assertEqual(sum(name in c for c in calls), 1, msg=name)
            for gone in ("fused_t0_fwd_summary", "gdn_chunk_delta_h_maps_mosaic",
                         "gdn_chunk_delta_h_maps_skip"):
                self.assertEqual(sum(gone in c for c in calls), 0, msg=gone)


@pytest.mark.gpu
class MapsXGpuTest(kmg_test.HopperTestCase):
    """The compiled kernel: ``M_p`` bit-equal to the maps launch's, ``X_p`` against the summary
    launch's and the reference, with and without the skip; the public op with the option."""

    def test_equal_to_the_two_launches(self):
        _check_equal_to_two_launches(self, ps_test._case(1024, 4, 2, 128, 128, None, seed=1), 4,
                                     interpret=False)
        for docs in (ps_test.DOCS_A, ps_test.DOCS_B):
            _check_equal_to_two_launches(self, ps_test._case(1024, 4, 2, 128, 128, docs,
                                                             seed=2), 4, skip=True,
                                         interpret=False)

    def test_match_reference_autodiff(self):
        case = dispatch_test._gdn_case(2000, 4, 2, 128, 128, decay=0.05,
                                       docs=(768, 1, 255, 900), seed=6)
        for skip in (False, True):
            _check_op(self, "mosaic_gpu", case, skip)


if __name__ == "__main__":
    absltest.main()
