"""Sequence pieces that skip what a document start cuts (MOSAIC_GPU.md Sec. 52).

``mosaic_vjp.PIECE_SKIP`` (off by default): with documents, the fused ``T0`` forward's
sequence pieces get one int32 per piece, the piece-local chunk of its last document start or
``-1`` (:func:`pallas_kernels.common.mosaic_gpu_lib.piece_cuts`). The maps launch
(``chunk_delta_piece_maps_mosaic(piece_skip=True)``, kernel ``gdn_chunk_delta_h_maps_skip``)
writes ``M_p = 0`` for a cut piece without loading or running its chain; the summary launch
(``chunk_delta_fused_t0_fwd_mosaic(summary=True, piece_cuts=...)``, kernel
``..._summary_skip``) runs each piece's chain from zero from its cut chunk on. The backward:
``chunk_delta_dh_mosaic(piece_skip=True)`` runs the launch from a zero exit gradient (``Y_p``,
kernel ``..._pieces_skip``) from each piece's first document start down to its first chunk.

* ``PieceCutsTest`` (CI): the cuts of hand-placed documents (starts on chunk edges, inside
  chunks, on a piece edge, in a piece's first or last chunk, none, two in one piece).
* ``PieceSkipInterpretTest``: the maps and the summary's ``X_p`` with the option equal, bit
  for bit (``==``, so up to the sign of zeros), to those without it, and the cut pieces' maps
  exactly zero; one small case in CI (a few seconds), the rest ``slow``, including
  :func:`mosaic_vjp._fused_t0_pieces` whole (``o``, the final state, ``v_new``, ``h``, the
  maps) bit-equal, the reverse pass (folded or not, ``W`` stored or from ``T0``, DeltaNet)
  bit-equal, and the public op's outputs and gradients against the chunk form's fp32
  autodiff. Multi-launch interpreted tests need ``PJRT_NPROC=8`` (MOSAIC_GPU.md Sec. 10).
* ``PieceSkipLoweringTest`` (CI): the op's forward and ``jax.grad`` with the option lowered
  for CUDA: the two ``_skip`` kernels, the same launch count; without documents the jaxpr
  is the option-off one.
* ``PieceSkipGpuTest`` (``gpu``): the compiled kernels, the same checks.
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
from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu as kgd
from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu_fused as kfused
from pallas_kernels.gated_delta_rule import mosaic_vjp
from tests.pallas_kernels import kernel_mosaic_gdn_test as gdn_test
from tests.pallas_kernels import kernel_mosaic_gpu_test as kmg_test
from tests.pallas_kernels import mosaic_gpu_dispatch_test as dispatch_test

C = mgl.CHUNK

# T = 512, P = 4 pieces of 2 chunks: piece 0 no start, piece 1 one inside its first chunk
# (token 150), piece 2 two (256, its first token and a chunk edge; 350), piece 3 one inside
# its last chunk (500). Document lengths, the rest one more document.
SMALL_DOCS, SMALL_CUTS = (150, 106, 94, 150), [-1, 0, 1, 1]
# T = 1024, P = 4 pieces of 4 chunks. A: piece 0 none, piece 1 inside its first chunk (300),
# piece 2 on its first token (512, a piece edge) and inside chunk 10 (700), piece 3 inside its
# last chunk (1000). B: piece 0 on a chunk edge (128), piece 1 none, piece 2 on a chunk edge
# (640) and the piece's last token (767), piece 3 on its last chunk's first token (960).
DOCS_A, CUTS_A = (300, 212, 188, 300), [-1, 0, 2, 3]
DOCS_B, CUTS_B = (128, 512, 127, 193), [2, -1, 3, 3]


def _case(seq_len, heads, kv_heads, dk, dv, docs, decay=0.2, seed=0):
    """bf16 ``q, k, v``, fp32 ``g`` (``None`` for DeltaNet: ``decay=None``), ``beta``,
    ``segment_ids``, the residual ``T0`` and ``W`` (fp32 XLA, rounded to k's dtype), and the
    document vectors and gate cumsum formed on whole rows."""
    q, k, v, g, beta, _, seg = gdn_test._inputs(1, seq_len, heads, kv_heads, dk, dv,
                                                decay=decay, h0=False, docs=docs, seed=seed)
    t0 = kgd.kkt_inverse_xla(k, beta, segment_ids=seg).astype(k.dtype)
    w = kgd.w_from_t0(k, t0, g, beta, segment_ids=seg)
    gc, docs_v = mosaic_vjp._shared(g, v, seg)
    return q, k, v, g, beta, seg, t0, w, gc, docs_v


def _maps_and_summary(case, pieces, skip, interpret=True):
    """The maps ``[B, P, H, K, K]`` and the summary's ``X_p`` ``[B * P, H, K, V]`` as
    :func:`mosaic_vjp._fused_t0_pieces` forms them, with or without the skip."""
    q, k, v, g, beta, seg, t0, w, gc, docs = case
    num_chunks = -(-v.shape[1] // C)
    cuts = mgl.piece_cuts(docs[1], pieces) if skip else None
    maps = kgd.chunk_delta_piece_maps_mosaic(
        k, w, g, pieces=pieces, gate_cumsum=gc, doc_vecs=docs, interpret=interpret,
        piece_skip=skip, piece_cuts=cuts)
    split = functools.partial(mgl.split_rows, pieces=pieces)
    pad = functools.partial(mgl.pad_time, num_chunks=num_chunks)
    qp, kp, vp, t0p, betap = (split(pad(x)) for x in (q, k, v, t0, beta))
    gp = None if g is None else split(pad(g))
    _, x_local, _, _ = kfused.chunk_delta_fused_t0_fwd_mosaic(
        qp, kp, vp, t0p, gp, betap, scale=k.shape[-1] ** -0.5, interpret=interpret,
        gate_cumsum=None if gc is None else mgl.split_head_major(gc, pieces),
        doc_vecs=tuple(split(x) for x in docs), pieces=pieces, summary=True,
        piece_cuts=cuts)
    return maps, x_local


def _check_maps_and_summary(test, case, pieces, want_cuts, interpret=True):
    cuts = np.asarray(mgl.piece_cuts(case[-1][1], pieces))
    np.testing.assert_array_equal(cuts, want_cuts)
    maps_off, x_off = _maps_and_summary(case, pieces, False, interpret)
    maps_on, x_on = _maps_and_summary(case, pieces, True, interpret)
    maps_off, x_off, maps_on, x_on = map(np.asarray, (maps_off, x_off, maps_on, x_on))
    for p, cut in enumerate(want_cuts):  # the claim: a cut piece's map is exactly zero
        test.assertEqual(np.any(maps_off[:, p] != 0), cut < 0, msg=f"piece {p}")
    np.testing.assert_array_equal(maps_on, maps_off)
    np.testing.assert_array_equal(x_on, x_off)
    test.assertGreater(np.abs(x_on).max(), 0)


def _check_pieces_path(test, case, pieces, interpret=True):
    """:func:`mosaic_vjp._fused_t0_pieces` whole, with and without the skip: bit-equal."""
    q, k, v, g, beta, seg, t0, w, gc, docs = case
    heads, dk, dv = v.shape[2], k.shape[-1], v.shape[-1]
    h0 = jax.random.normal(jax.random.key(3), (1, heads, dk, dv), jnp.float32)
    run = functools.partial(mosaic_vjp._fused_t0_pieces, q, k, v, t0, w, g, beta, h0, gc, docs,
                            pieces=pieces, scale=dk ** -0.5, store_v_new=True, store_h=True,
                            interpret=interpret)
    off, on = run(piece_skip=False), run(piece_skip=True)
    for name, a, b in zip(("o", "final_state", "v_new", "h", "maps"), off, on):
        np.testing.assert_array_equal(np.asarray(b), np.asarray(a), err_msg=name)


def _check_reverse(test, case, pieces, fold, w_t0=False, interpret=True):
    """``chunk_delta_dh_mosaic`` with sequence pieces, with and without ``piece_skip`` (the
    ``Y_p`` launch from the first document start down, maps formed here skipping): ``dh``,
    ``dv_new`` and ``dh0`` bit-equal. ``fold``: ``dv_local`` formed in the pass, ``du`` given;
    else a random ``dv_local``. ``w_t0``: ``W`` formed from ``T0`` (the forward's maps
    given)."""
    q, k, v, g, beta, seg, t0, w, gc, docs = case
    key = jax.random.split(jax.random.key(5), 3)
    do = jax.random.normal(key[0], v.shape).astype(v.dtype)
    extra = jax.random.normal(key[1], v.shape).astype(v.dtype)  # du (fold) or dv_local
    dht = jax.random.normal(key[2], v.shape[:1] + (v.shape[2], k.shape[-1], v.shape[-1]))
    maps = (kgd.chunk_delta_piece_maps_mosaic(k, w, g, pieces=pieces, gate_cumsum=gc,
                                              doc_vecs=docs, interpret=interpret)
            if w_t0 else None)
    run = functools.partial(
        kgd.chunk_delta_dh_mosaic, q, k, t0 if w_t0 else w, do, None if fold else extra, g,
        scale=k.shape[-1] ** -0.5, final_state_grad=dht, gate_cumsum=gc, doc_vecs=docs,
        states_dtype=v.dtype, pieces=pieces, piece_maps=maps, fold_dv_local=fold,
        residual_grad=extra if fold else None, w_from_t0=w_t0, beta=beta if w_t0 else None,
        interpret=interpret)
    off, on = run(piece_skip=False), run(piece_skip=True)
    for name, a, b in zip(("dh", "dv_new", "dh0"), off, on):
        np.testing.assert_array_equal(np.asarray(b), np.asarray(a), err_msg=name)
    test.assertGreater(float(jnp.abs(on[2]).max()), 0)


class PieceCutsTest(absltest.TestCase):

    def test_cuts_of_hand_placed_documents(self):
        for seq_len, docs, pieces, want in ((512, SMALL_DOCS, 4, SMALL_CUTS),
                                            (1024, DOCS_A, 4, CUTS_A), (1024, DOCS_B, 4, CUTS_B),
                                            (1024, DOCS_B, 2, [2, 7]), (1024, None, 4, [-1] * 4)):
            seg = None if docs is None else gdn_test._inputs(
                1, seq_len, 1, 1, 64, 64, decay=0.2, h0=False, docs=docs)[-1]
            _, conn, _ = mgl.doc_vectors(seg, 1, seq_len // C)
            np.testing.assert_array_equal(np.asarray(mgl.piece_cuts(conn, pieces)), want,
                                          err_msg=str((docs, pieces)))

    def test_cuts_are_per_row(self):
        conn = jnp.ones((2, 8 * C), jnp.float32).at[1, 3 * C + 63].set(0)
        np.testing.assert_array_equal(np.asarray(mgl.piece_cuts(conn, 2)), [-1, -1, 3, -1])

    def test_first_cuts(self):
        # the reverse pass's: the piece's first chunk holding a document start, or -1
        for docs, want in ((DOCS_A, [-1, 0, 0, 3]), (DOCS_B, [2, -1, 2, 3])):
            seg = gdn_test._inputs(1, 1024, 1, 1, 64, 64, decay=0.2, h0=False, docs=docs)[-1]
            _, conn, _ = mgl.doc_vectors(seg, 1, 1024 // C)
            np.testing.assert_array_equal(np.asarray(mgl.piece_cuts(conn, 4, first=True)),
                                          want, err_msg=str(docs))


class PieceSkipInterpretTest(parameterized.TestCase):
    """Interpreted (``PJRT_NPROC=8``): the option's maps and ``X_p`` bit-equal to the plain
    launches'. The first test is the CI case (about 5 s on two cores)."""

    def test_small_maps_and_summary_equal_the_plain_launches(self):
        _check_maps_and_summary(self, _case(512, 1, 1, 64, 64, SMALL_DOCS), 4, SMALL_CUTS)

    @pytest.mark.slow
    def test_gva_k128_maps_and_summary(self):
        for docs, cuts in ((DOCS_A, CUTS_A), (DOCS_B, CUTS_B)):
            _check_maps_and_summary(self, _case(1024, 2, 1, 128, 64, docs, seed=1), 4, cuts)

    @pytest.mark.slow
    def test_deltanet_maps_and_summary(self):
        _check_maps_and_summary(self, _case(1024, 1, 1, 64, 64, DOCS_B, decay=None, seed=2), 4,
                                CUTS_B)

    @pytest.mark.slow
    def test_pieces_path_bit_equal(self):
        _check_pieces_path(self, _case(1024, 2, 1, 64, 64, DOCS_A, seed=3), 4)

    @pytest.mark.slow
    def test_reverse_pass_bit_equal(self):
        # the backward (Sec. 52 B): the folded pass and the separate dv_local, both doc sets
        for docs, fold in ((DOCS_A, True), (DOCS_B, True), (DOCS_B, False)):
            _check_reverse(self, _case(1024, 1, 1, 64, 64, docs, seed=4), 4, fold)

    @pytest.mark.slow
    def test_reverse_pass_w_from_t0_and_deltanet(self):
        _check_reverse(self, _case(1024, 2, 1, 64, 64, DOCS_A, seed=5), 4, True, w_t0=True)
        _check_reverse(self, _case(512, 1, 1, 64, 64, SMALL_DOCS, decay=None, seed=6), 4,
                       True)


@pytest.mark.slow
class PieceSkipApiTest(parameterized.TestCase):
    """The public op (``PJRT_NPROC=8``) with ``PIECE_SKIP``: ``o``, the final state, ``u`` and
    every gradient against the chunk form's fp32 autodiff (``mosaic_gpu_dispatch_test``'s
    gates). B 1, H 2, V 64, T 1024: P = 4 pieces of 4 chunks."""

    @parameterized.named_parameters(("docs_a", DOCS_A), ("docs_b", DOCS_B))
    def test_match_chunked_autodiff(self, docs):
        with mock.patch.object(mosaic_vjp, "PIECE_SKIP", True):
            self.assertEqual(mosaic_vjp.fused_t0_pieces("fused_t0", 1, 2, 64, 1024), 4)
            dispatch_test._check_residual_and_gradients(
                self, "mosaic_gpu_interpret", dispatch_test._gdn_case(seq_len=1024, docs=docs,
                                                                      seed=4), False)


class PieceSkipLoweringTest(absltest.TestCase):

    def _lower(self, skip, grad, docs=DOCS_A):
        q, k, v, g, beta, h0, seg, do, dht, du = dispatch_test._gdn_case(seq_len=1024,
                                                                         docs=docs)
        seg = None if docs is None else seg
        fn = dispatch_test._gdn_loss("mosaic_gpu", seg, do, dht, du)
        if grad:
            fn = jax.value_and_grad(fn, argnums=range(6), has_aux=True)
        with mock.patch.object(mosaic_gpu, "compute_capability", return_value=(9, 0)), \
                mock.patch.object(mosaic_vjp, "PIECE_SKIP", skip):
            text = jax.jit(fn).trace(q, k, v, g, beta, h0).lower(
                lowering_platforms=("cuda",)).as_text()
        return [line for line in text.splitlines() if "custom_call @mosaic_gpu" in line]

    def test_forward_and_grad_lower_for_cuda_with_the_skip_kernels(self):
        for grad, launches in ((False, 4), (True, 7)):
            calls = self._lower(True, grad)
            self.assertEqual(len(calls), launches)  # len: a failing list prints whole kernels
            for name in ("gdn_chunk_delta_h_maps_skip",
                         "gdn_chunk_delta_fused_t0_fwd_summary_skip") + (
                             ("gdn_chunk_delta_dh_fold_pieces_skip",) if grad else ()):
                self.assertEqual(sum(name in c for c in calls), 1, msg=name)
            self.assertEqual(len(self._lower(False, grad)), launches)
            self.assertEqual(sum("_skip" in c for c in self._lower(False, grad)), 0)

    def test_no_documents_leave_the_jaxpr_unchanged(self):
        q, k, v, g, beta, h0, _, do, dht, du = dispatch_test._gdn_case(seq_len=1024,
                                                                       docs=DOCS_A)
        fn = dispatch_test._gdn_loss("mosaic_gpu", None, do, dht, du)

        def jaxpr(skip):
            with mock.patch.object(mosaic_gpu, "compute_capability", return_value=(9, 0)), \
                    mock.patch.object(mosaic_vjp, "PIECE_SKIP", skip):
                return str(jax.make_jaxpr(jax.grad(lambda *a: fn(*a)[0], argnums=range(6)))(
                    q, k, v, g, beta, h0))
        self.assertEqual(jaxpr(True), jaxpr(False))
        self.assertEqual(jaxpr(True).count("_skip"), 0)


@pytest.mark.gpu
class PieceSkipGpuTest(kmg_test.HopperTestCase):
    """The compiled kernels: the option's maps, ``X_p`` and the whole pieces path equal to the
    plain launches' (bit for bit), and the public op against the chunk form's autodiff."""

    def test_maps_and_summary_equal_the_plain_launches(self):
        for docs, cuts in ((DOCS_A, CUTS_A), (DOCS_B, CUTS_B)):
            _check_maps_and_summary(self, _case(1024, 4, 2, 128, 128, docs, seed=1), 4, cuts,
                                    interpret=False)

    def test_pieces_path_bit_equal(self):
        _check_pieces_path(self, _case(1024, 4, 2, 128, 128, DOCS_A, seed=3), 4,
                           interpret=False)

    def test_reverse_pass_bit_equal(self):
        for docs, fold in ((DOCS_A, True), (DOCS_B, False)):
            _check_reverse(self, _case(1024, 4, 2, 128, 128, docs, seed=4), 4, fold,
                           interpret=False)

    def test_match_chunked_autodiff(self):
        case = dispatch_test._gdn_case(2048, 4, 2, 128, 128, decay=0.05,
                                       docs=(768, 1, 255, 1024), seed=6)
        with mock.patch.object(mosaic_vjp, "PIECE_SKIP", True):
            self.assertGreater(mosaic_vjp.fused_t0_pieces("fused_t0", 1, 4, 128, 2048), 1)
            dispatch_test._check_residual_and_gradients(self, "mosaic_gpu", case, False)


if __name__ == "__main__":
    absltest.main()
