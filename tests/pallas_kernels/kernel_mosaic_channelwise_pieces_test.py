"""Sequence pieces of the per-channel (KDA / GDN-2) Mosaic GPU state passes (MOSAIC_GPU.md
Sec. 30).

:func:`channelwise_mosaic_gpu.channelwise_forward_mosaic` (``pieces=``, ``return_maps=``) and
:func:`channelwise_mosaic_gpu.channelwise_backward_state_mosaic` (``pieces=``,
``piece_maps=``) cut each row into ``P`` pieces run as rows: per chunk the forward state map
is affine, ``S -> (diag(e_all) - Kg^T W) S + Kg^T U``, so a piece maps ``S -> M_p S + X_p`` and
its reverse pass ``d -> M_p^T d + Y_p``. Inputs come from ``channelwise_gpu``'s own ``intra``,
``prepare`` and ``wu`` kernels (Pallas interpret mode) on random inputs, as in
``kernel_mosaic_channelwise_test.py``.

* ``PiecesLoweringTest`` (CI): the launches for CUDA (forward: maps, pieces from zero, stored
  pass; reverse: pieces from zero and stored pass, plus the maps launch when not given), and
  the whole KDA forward + backward with automatic pieces (the backward reuses the forward's
  maps: one maps launch).
* ``PiecesProtocolTest`` (CI): the summary launches' barrier protocol (the state warpgroup
  alone reads its published tiles; one ``in_free`` arrival) on the mbarrier model.
* ``PiecesValidationTest`` (CI): ``pieces`` not dividing the chunk count, ``piece_maps`` of the
  wrong shape or dtype, a bad ``TUNING["mosaic_pieces"]``.
* ``PiecesInterpretTest`` (``slow``; GPU interpret mode): ``P = 2`` and ``4`` at T = 512 (8
  chunks) against the float64 recurrences (relative RMS < 5e-3) and against ``P = 1``; no
  documents (every map non-zero) and documents crossing piece edges (maps of pieces with a
  document start exactly zero); each map against the pass on its piece alone from a random
  state; the reverse pass with the forward's maps equal to maps formed inside, and with
  ``M_p`` in place of ``M_p^T`` far outside the gate. ``PiecesOpInterpretTest`` (``slow``):
  the KDA and GDN-2 ops with ``TUNING["mosaic_pieces"] = 4`` against the Triton state passes.

The interpreted multi-launch tests need a larger XLA CPU pool (they hang at 0% CPU without
it): ``PJRT_NPROC=8 python -m pytest -m slow -k Pieces
tests/pallas_kernels/kernel_mosaic_channelwise_pieces_test.py``.
"""

import collections
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest, parameterized

from pallas_kernels.common import channelwise_gpu
from pallas_kernels.common import channelwise_mosaic_gpu as cwm
from tests import tolerances
from tests.pallas_kernels import kernel_gpu_channelwise_test as cw_test
from tests.pallas_kernels import kernel_mosaic_channelwise_test as cwt

C = cwm.CHUNK
_GATE = 5e-3  # relative RMS against the float64 recurrences and against P = 1 (bf16 / fp16)


def _launches(text):
    """``Counter`` of the Mosaic GPU kernel names in lowered text (``<name>_mosaic_gpu``)."""
    return collections.Counter(
        re.findall(r"(channelwise_state_(?:fwd|bwd)_mosaic\w*?)_mosaic_gpu\b", text))


def _zeros(batch, seq_len, heads, dk, dv, dtype=jnp.bfloat16):
    """Placeholder kernel inputs ``(qg, kg, w, u, mq, e_all)`` (only their shapes matter when
    lowering)."""
    n = -(-seq_len // C)
    tok = [jnp.zeros((batch, seq_len, heads, d), dtype) for d in (dk, dk, dk, dv)]
    return tok + [jnp.zeros((batch, heads, n, C, C), dtype),
                  jnp.zeros((batch, heads, n, dk), jnp.float32)]


def _lower(fn, *args):
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


class PiecesLoweringTest(parameterized.TestCase):
    """The pieces' launches lower for CUDA on the CPU host."""

    @parameterized.parameters((64, 64), (128, 128))
    def test_forward_pieces_are_three_launches(self, dk, dv):
        args = _zeros(1, 512, 2, dk, dv)
        h0 = jnp.ones((1, 2, dk, dv), jnp.float32)

        def fwd(*args):
            return cwm.channelwise_forward_mosaic(*args, scale=0.1, initial_state=h0,
                                                  store_v_new=True, store_h=True, pieces=2,
                                                  return_maps=True)

        self.assertEqual(_launches(_lower(fwd, *args)),
                         collections.Counter([cwm.KERNEL_NAME + "_maps",
                                              cwm.KERNEL_NAME + "_pieces", cwm.KERNEL_NAME]))
        o, ht, vn, hs, maps = jax.eval_shape(fwd, *args)
        self.assertEqual((o.shape, ht.shape, vn.shape, hs.shape, maps.shape, maps.dtype),
                         ((1, 512, 2, dv), (1, 2, dk, dv), (1, 512, 2, dv), (1, 2, 8, dk, dv),
                          (1, 2, 2, dk, dk), jnp.float32))

    def test_one_piece_is_one_launch(self):
        args = _zeros(1, 512, 2, 64, 64)
        text = _lower(functools.partial(cwm.channelwise_forward_mosaic, scale=0.1, pieces=1,
                                        return_maps=True), *args)
        self.assertEqual(_launches(text), collections.Counter([cwm.KERNEL_NAME]))
        qg, kg, w, u, mq, e_all = args
        text = _lower(functools.partial(cwm.channelwise_backward_state_mosaic, scale=0.1,
                                        pieces=1), qg, kg, w, mq, e_all, u)
        self.assertEqual(_launches(text), collections.Counter([cwm.BWD_KERNEL_NAME]))

    def test_backward_pieces_reuse_given_maps(self):
        qg, kg, w, u, mq, e_all = _zeros(1, 512, 2, 64, 128)
        dht = jnp.ones((1, 2, 64, 128), jnp.float32)
        for maps, want in ((None, [cwm.KERNEL_NAME + "_maps"]), (jnp.zeros((1, 4, 2, 64, 64)),
                                                                 [])):
            def bwd(qg, kg, w, mq, e_all, do, maps=maps):
                return cwm.channelwise_backward_state_mosaic(
                    qg, kg, w, mq, e_all, do, scale=0.1, dvn_in=do, dht=dht, pieces=4,
                    piece_maps=maps)

            text = _lower(bwd, qg, kg, w, mq, e_all, u)
            self.assertEqual(_launches(text), collections.Counter(
                want + [cwm.BWD_KERNEL_NAME + "_pieces", cwm.BWD_KERNEL_NAME]),
                msg=f"maps given: {maps is not None}")

    def test_kda_fwd_bwd_hands_the_forward_maps_to_the_backward(self):
        # B 1, H 2, V 64 (two CTAs), 8 chunks: the automatic choice is P = 2. Forward three
        # launches, backward two: one maps launch in all.
        text = cwt.kda_fwd_bwd_cuda_text({"state_pass": "mosaic", "grad_pass": "triton"},
                                         seq_len=512, lengths=(200, 312))
        self.assertEqual(text.count("custom_call @mosaic_gpu"), 5)
        self.assertEqual(_launches(text), collections.Counter(
            [cwm.KERNEL_NAME + "_maps", cwm.KERNEL_NAME + "_pieces", cwm.KERNEL_NAME,
             cwm.BWD_KERNEL_NAME + "_pieces", cwm.BWD_KERNEL_NAME]))

    @parameterized.parameters(1, 4)
    def test_backward_dvn_heads_first_lowers(self, pieces):
        # dvn_heads_first (MOSAIC_GPU.md Sec. 48.2): the stored launch writes dvn [B, H, T, V]
        # by TMA; the launches are the same, and only dvn's shape changes (T = 500 is padded
        # inside and cut back).
        qg, kg, w, u, mq, e_all = _zeros(1, 500, 2, 64, 128)
        dht = jnp.ones((1, 2, 64, 128), jnp.float32)
        shapes = {}
        for heads_first in (False, True):
            def bwd(qg, kg, w, mq, e_all, do, heads_first=heads_first):
                return cwm.channelwise_backward_state_mosaic(
                    qg, kg, w, mq, e_all, do, scale=0.1, dvn_in=do, dht=dht, pieces=pieces,
                    dvn_heads_first=heads_first)

            text = _lower(bwd, qg, kg, w, mq, e_all, u)
            self.assertEqual(_launches(text)[cwm.BWD_KERNEL_NAME], 1)
            shapes[heads_first] = [x.shape for x in jax.eval_shape(bwd, qg, kg, w, mq, e_all, u)]
        self.assertEqual(shapes[False][0], (1, 500, 2, 128))
        self.assertEqual(shapes[True], [(1, 2, 500, 128)] + shapes[False][1:])


class PiecesValidationTest(absltest.TestCase):

    def test_pieces_must_divide_the_chunk_count(self):
        qg, kg, w, u, mq, e_all = _zeros(1, 512, 2, 64, 64)
        with self.assertRaisesRegex(ValueError, "pieces=3 must be a positive divisor"):
            cwm.channelwise_forward_mosaic(qg, kg, w, u, mq, e_all, scale=0.1, pieces=3)
        with self.assertRaisesRegex(ValueError, "pieces=3 must be a positive divisor"):
            cwm.channelwise_backward_state_mosaic(qg, kg, w, mq, e_all, u, scale=0.1, pieces=3)

    def test_piece_maps_must_be_the_forward_maps(self):
        qg, kg, w, u, mq, e_all = _zeros(1, 512, 2, 64, 64)
        for maps in (jnp.zeros((1, 4, 2, 64, 64)), jnp.zeros((1, 2, 2, 64, 64), jnp.bfloat16)):
            with self.assertRaisesRegex(ValueError, r"piece_maps must be \[B, P, H, K, K\]"):
                cwm.channelwise_backward_state_mosaic(qg, kg, w, mq, e_all, u, scale=0.1,
                                                      pieces=2, piece_maps=maps)

    def test_tuning_pieces(self):
        base = dict(batch=1, heads=1, n_chunks=8, dk=64, dv=64, scale=0.1, has_docs=False,
                    interpret=True, return_residual=False, mm_dtype=jnp.bfloat16,
                    state_pass="mosaic")
        self.assertIsNone(channelwise_gpu._config(**base)["mosaic_pieces"])
        with cw_test._tuning({"mosaic_pieces": 4}):
            self.assertEqual(channelwise_gpu._config(**base)["mosaic_pieces"], 4)
        for bad in (0, 2.0, True, "4"):
            with cw_test._tuning({"mosaic_pieces": bad}):
                with self.assertRaisesRegex(ValueError, "TUNING\\['mosaic_pieces'\\]"):
                    channelwise_gpu._config(**base)


def _summary_protocol(num_chunks):
    """As ``kernel_mosaic_channelwise_test._protocol``, for the forward's summary launches
    (``store=False``: the maps and the pieces from zero): the state warpgroup is the only
    reader of the published ``S`` and ``Vn`` (no ``s_ready`` / ``v_ready`` / ``s_free``), the
    output warpgroup only meets the others at ``done``, ``in_free`` takes one arrival."""
    memory = cwt._protocol(num_chunks)[2][:-2]
    state = []
    for n in range(num_chunks):
        state += [("X", "sb", n), ("W", "in_bar", n), ("R", "ring", n), ("R", "sb", n),
                  ("E", "sb", n), ("X", "vn", n), ("R", "vn", n), ("E", "vn", n),
                  ("E", "ring", n), ("A", "in_free", n)]
    return [wg + [("A", "done", 0), ("W", "done", 0)] for wg in (state, [], memory)]


class PiecesProtocolTest(absltest.TestCase):
    """The summary launches' barrier protocol on the mbarrier model of
    ``kernel_mosaic_channelwise_test.ProtocolTest`` (random schedules, 1 to 7 chunks)."""

    def test_summary_launches_no_deadlock_lapping_or_overwrite(self):
        slots = dict(in_bar=cwm.STAGES, in_free=cwm.STAGES, ring=cwm.STAGES, sb=2, vn=2,
                     done=1)
        cwt.ProtocolTest.check_protocol(self, _summary_protocol, slots, dict(done=3),
                                        dict(ring=1, sb=1, vn=1))


def _piece_args(prep, p, span):
    """The forward kernel's inputs of piece ``p`` alone (``span`` tokens), ``U = 0``."""
    qg, kg, w, u, mq, e_all = cwt._kernel_args(prep)
    sl, cl = slice(p * span, (p + 1) * span), slice(p * span // C, (p + 1) * span // C)
    return (qg[:, sl], kg[:, sl], w[:, sl], jnp.zeros_like(u[:, sl]), mq[:, :, cl],
            e_all[:, :, cl])


def _doc_starts(seq_len, docs):
    """Token indices where row 0's documents (``cwt._segment_ids``) start, 0 excluded."""
    return set(np.cumsum(docs)) - {seq_len} if docs else set()


# pieces, seed, B, T, H, K, V, dtype, row 0's document lengths (the rest one more), decay, h0,
# GDN-2 scales. Decays -0.01 to -0.05 per token keep the maps far from zero over a piece. The
# packed case has a document crossing three piece edges and a piece whose map is non-zero
# between pieces whose maps are zero.
_CASES = (
    ("P4_kda_bf16_docs_cross_edges_T512_K64_V64", 4, 0, 1, 512, 2, 64, 64, jnp.bfloat16,
     (100, 300), 0.02, True, False),
    ("P2_gdn2_fp16_nodocs_T512_K64_V64", 2, 1, 1, 512, 2, 64, 64, jnp.float16, None, 0.01,
     True, True),
    ("P4_kda_bf16_nodocs_T512_K128_V64", 4, 2, 1, 512, 1, 128, 64, jnp.bfloat16, None, 0.01,
     True, False),
)


class PiecesInterpretTest(parameterized.TestCase):
    """GPU interpret mode, T = 512 (8 chunks)."""

    @parameterized.named_parameters(*_CASES)
    @pytest.mark.slow
    def test_forward_pieces(self, pieces, seed, batch, seq_len, heads, dk, dv, dtype, docs,
                            decay, h0, gdn2):
        cfg, prep, state = cwt._prepared(seed, batch, seq_len, heads, dk, dv, dtype, docs=docs,
                                         decay=decay, h0=h0, gdn2=gdn2)
        run = functools.partial(cwm.channelwise_forward_mosaic, *cwt._kernel_args(prep),
                                scale=cfg["scale"], initial_state=state, store_v_new=True,
                                store_h=True, interpret=True)
        *got, maps = run(pieces=pieces, return_maps=True)
        one = run(pieces=1)
        want = cwt._reference(prep, state, cfg["scale"])
        self.assertEqual((maps.shape, maps.dtype), ((batch, pieces, heads, dk, dk), jnp.float32))
        for name, a, e, o in zip(cwt._NAMES, got, want, one):
            self.assertEqual((a.shape, a.dtype), (o.shape, o.dtype), name)
            err = tolerances.rel_err(a, e)
            print(f"{self._testMethodName} {name}: vs float64 {err:.2e}, vs P=1 "
                  f"{tolerances.rel_err(a, o):.2e}")
            self.assertLess(err, _GATE, f"{name} vs float64")
            self.assertLess(tolerances.rel_err(a, o), _GATE, f"{name} vs one piece")
        span = seq_len // pieces
        starts = _doc_starts(seq_len, docs)
        s0 = jax.random.normal(jax.random.key(7), (batch, heads, dk, dv))
        for p in range(pieces):
            m = np.asarray(maps[:, p])
            if any(p * span <= t < (p + 1) * span for t in starts):  # row 0 has them
                self.assertTrue(np.all(m[0] == 0), f"map of piece {p}: a document starts in it")
            else:
                self.assertGreater(float(np.abs(m).max()), 1e-2, f"map of piece {p}")
            # The map against the pass on the piece alone (U = 0) from a random state.
            _, alone, _, _ = cwm.channelwise_forward_mosaic(
                *_piece_args(prep, p, span), scale=cfg["scale"], initial_state=s0, pieces=1,
                interpret=True)
            mapped = jnp.einsum("bhij,bhjv->bhiv", maps[:, p], s0,
                                precision=jax.lax.Precision.HIGHEST)
            err = tolerances.rel_err(mapped, alone) if np.any(m) else float(
                np.abs(np.asarray(alone)).max())
            print(f"{self._testMethodName} map {p}: {err:.2e}")
            self.assertLess(err, _GATE, f"map of piece {p} vs its pass alone")

    @parameterized.named_parameters(*_CASES)
    @pytest.mark.slow
    def test_backward_pieces(self, pieces, seed, batch, seq_len, heads, dk, dv, dtype, docs,
                             decay, h0, gdn2):
        cfg, prep, _ = cwt._prepared(seed, batch, seq_len, heads, dk, dv, dtype, docs=docs,
                                     decay=decay, h0=h0, gdn2=gdn2)
        do, din, dht = cwt._cotangents(seed, prep, dv, dtype, dvn_in=h0)
        run = functools.partial(cwm.channelwise_backward_state_mosaic, *cwt._bwd_args(prep), do,
                                scale=cfg["scale"], dvn_in=din, dht=dht, interpret=True)
        got = run(pieces=pieces)  # the maps formed here
        one = run(pieces=1)
        *_, maps = cwm.channelwise_forward_mosaic(*cwt._kernel_args(prep), scale=cfg["scale"],
                                                  pieces=pieces, return_maps=True,
                                                  interpret=True)
        given = run(pieces=pieces, piece_maps=maps)  # the forward's maps, as channelwise_gpu
        want = cwt._bwd_reference(prep, do, din, dht, cfg["scale"])
        for name, a, e, o, g in zip(cwt._BWD_NAMES, got, want, one, given):
            self.assertEqual((a.shape, a.dtype), (o.shape, o.dtype), name)
            err = tolerances.rel_err(a, e)
            print(f"{self._testMethodName} {name}: vs float64 {err:.2e}, vs P=1 "
                  f"{tolerances.rel_err(a, o):.2e}")
            self.assertLess(err, _GATE, f"{name} vs float64")
            self.assertLess(tolerances.rel_err(a, o), _GATE, f"{name} vs one piece")
            self.assertLess(tolerances.rel_err(g, a), 1e-6, f"{name}: maps given vs formed")
        if docs is None:  # every map non-zero: M_p in place of M_p^T must show
            swapped = run(pieces=pieces, piece_maps=jnp.swapaxes(maps, -1, -2))
            err = tolerances.rel_err(swapped[2], want[2])
            print(f"{self._testMethodName} dh0 with M_p for M_p^T: {err:.2e}")
            self.assertGreater(err, 4 * _GATE, "dh0 with the maps untransposed")

    @parameterized.parameters(1, 2)
    @pytest.mark.slow
    def test_backward_dvn_heads_first_is_the_same_dvn(self, pieces):
        # The heads-first TMA stores (whole rows at the global chunk index) write the values
        # of the default layout, bit for bit; dhs and dh0 are untouched. T = 200 (padded to
        # 256 by _prepared: 4 chunks, the last one's tail zeros), documents crossing the piece
        # edge.
        cfg, prep, _ = cwt._prepared(9, 1, 200, 2, 64, 64, jnp.bfloat16, docs=(90, 5),
                                     gdn2=True)
        do, din, dht = cwt._cotangents(9, prep, 64, jnp.bfloat16)
        run = functools.partial(cwm.channelwise_backward_state_mosaic, *cwt._bwd_args(prep), do,
                                scale=cfg["scale"], dvn_in=din, dht=dht, pieces=pieces,
                                interpret=True)
        rows = run()
        heads = run(dvn_heads_first=True)
        self.assertEqual(heads[0].shape, (1, 2, 256, 64))
        self.assertGreater(float(jnp.abs(rows[0].astype(jnp.float32)).max()), 0.1)
        for name, a, e in zip(cwt._BWD_NAMES, heads, (jnp.swapaxes(rows[0], 1, 2),) + rows[1:]):
            np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(e, np.float32),
                                          err_msg=name)


class PiecesOpInterpretTest(parameterized.TestCase):
    """The whole op (``implementation="pallas_interpret"``) with ``state_pass="mosaic"`` and
    ``TUNING["mosaic_pieces"] = 4`` (the forward's maps a residual of the backward) against the
    Triton state passes: outputs and every gradient."""

    @parameterized.parameters(("kda", 64), ("gdn2", 64))
    @pytest.mark.slow
    def test_pieces_match_triton(self, op, dim):
        inputs, cot_key = cw_test._inputs(5, 1, 256, 2, 2, dim, dtype=jnp.bfloat16, decay=0.05)
        # One chunk per piece; the start at 40 zeroes piece 0's map only, so the forward's
        # entry states go through M_1, M_2 and the backward's exit gradients through M_1^T to
        # M_3^T (the second document crosses three piece edges).
        seg = jnp.asarray(np.repeat(np.arange(2), [40, 216])[None], jnp.int32)
        ref = cw_test._outputs_and_grads(op, None, inputs, seg, cot_key, False)  # fp32
        with cw_test._tuning({"state_pass": "triton"}):
            want = cw_test._outputs_and_grads(op, "pallas_interpret", inputs, seg, cot_key, False)
        with cw_test._tuning({"state_pass": "mosaic", "mosaic_pieces": 4}):
            got = cw_test._outputs_and_grads(op, "pallas_interpret", inputs, seg, cot_key, False)
        # The pieces round the maps' and entry states' wgmma operands to bf16 where one pass
        # rounds the carried state: the two differ by bf16 noise (about 2e-3 here), not by an
        # fp32 summation order as the P = 1 kernels (kernel_mosaic_channelwise_test's 2e-3 /
        # 4e-3), so the pieces' gate (5e-3) against Triton, and GpuTest's gates against fp32.
        pairs = [(n, got[0][i], want[0][i], ref[0][i], 5e-3)
                 for i, n in enumerate(("o", "final_state"))]
        pairs += [(f"d{n}", got[1][n], want[1][n], ref[1][n],
                   2e-2 if n in ("g", "beta", "b", "w") else 8e-3) for n in cw_test._DIFF_ARGS[op]]
        for name, a, e, r, gate in pairs:
            err, tri, mine = (tolerances.rel_err(x, y) for x, y in ((a, e), (e, r), (a, r)))
            print(f"{op} {name}: vs Triton {err:.2e}; vs fp32: pieces {mine:.2e}, Triton "
                  f"{tri:.2e}")
            self.assertLess(err, _GATE, f"{op} {name} vs Triton")
            self.assertLess(mine, gate, f"{op} {name} vs fp32")


if __name__ == "__main__":
    absltest.main()
