"""The Mosaic GPU (``plgpu``) kernels of Gated DeltaNet / DeltaNet, tested on CPU and the H200.

``pallas_kernels/gated_delta_rule/kernel_mosaic_gpu.py`` (issue 29, not dispatched) has the delta
state pass :func:`chunk_delta_h_mosaic`, the forward :func:`gated_delta_rule_fwd_mosaic` (the WY
preparation, by default the kernel :func:`chunk_wy_mosaic` (tested on its own in
``kernel_mosaic_gdn_wy_test.py``) or XLA with ``wy_implementation="xla"``, the state pass, then
the scalar-decay output kernel on ``v_new``) and the reverse delta state pass
:func:`chunk_delta_dh_mosaic` (the first backward kernel).
``StatePassInterpretTest`` and ``ForwardInterpretTest`` run them in jax's Mosaic GPU interpret
mode (``InterpretGPUParams`` with race detection) and check, against the fp32 token-serial
reference (:func:`pallas_kernels.gated_delta_rule.reference.gated_delta_rule_reference`, run on
prefixes of whole chunks for the entry states), the states entering every chunk, ``v_new`` (the
reference's residual ``u``), the final state and ``o``, on bf16 inputs rounded once before the
reference (``q, k`` L2-normalised first). The kernels add 16-bit roundings of ``W``, ``U``, the
states and ``v_new`` (fp32 accumulation), so the gate is the relative RMS error (< 5e-3, the GPU
kernels' gate in BUILD.md) plus ``assert_allclose`` at the bf16 forward tolerance.
``DeltaDhInterpretTest`` runs the reverse delta state pass :func:`chunk_delta_dh_mosaic` and
checks ``dh`` (gradients of the states leaving each chunk), the total ``dv_new`` gradient and
``dh0`` against ``jax.vjp`` of a small fp32 chunk form written here (:func:`_chunk_form`, with
additive perturbations of the chunk states and of ``v_new``), which ``ChunkFormTest`` (in
``kernel_mosaic_gdn_bwd_test.py``) checks against the token-serial reference (relative RMS
< 1e-4). ``LoweringTest`` lowers for CUDA on the CPU host (two variants per kernel;
``LoweringSlowTest``, ``slow``, the others);
``GpuTest`` (marked ``gpu``) compiles the real kernels at realistic rows (their few-row cases
run as sequence pieces: the automatic choice). ``PiecesInterpretTest`` (``slow``) checks the
sequence pieces of both state passes (rows cut into ``P`` pieces run in parallel, MOSAIC_GPU.md
Sec. 29) against one piece and the references, and each piece's ``[K, K]`` map against the
state pass run on the piece alone; ``PiecesLoweringTest`` their launches for CUDA.

A failing interpreted kernel may hang instead of raising; run one test at a time under
``timeout`` (``pallas_kernels/common/MOSAIC_GPU.md``, "Interpreter hang seen").
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest, parameterized

from pallas_kernels import common
from pallas_kernels.gated_delta_rule import chunked, reference
from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu as kgd
from tests import tolerances
from tests.pallas_kernels import kernel_mosaic_gpu_test as kmg_test


def _inputs(batch, seq_len, heads, kv_heads, dk, dv, *, decay, h0, docs, seed=0):
    """bf16 ``q, k`` (L2-normalised in fp32, then rounded) and ``v``, fp32 ``g`` (``None`` when
    ``decay`` is ``None``: DeltaNet), ``beta`` in (0, 1), ``h0`` and ``segment_ids``
    (documents of lengths ``docs``, the rest one more document)."""
    q, k, v, g, state, seg = kmg_test.inputs(batch, seq_len, heads, kv_heads, dk, dv,
                                             decay=decay, h0=h0, docs=docs, seed=seed)

    def l2(x):  # in numpy (a new shape's eager ops compile programs)
        x = np.asarray(x).astype(np.float64)
        return jnp.asarray(x / np.linalg.norm(x, axis=-1, keepdims=True), jnp.bfloat16)

    rng = np.random.default_rng(seed + 100)
    beta = jnp.asarray(1.0 / (1.0 + np.exp(-rng.standard_normal(v.shape[:3]))), jnp.float32)
    return l2(q), l2(k), v, g, beta, state, seg


def _expand(x, heads):
    """``[B, T, Hk, K]`` to fp32 ``[B, T, H, K]`` (value head ``h`` reads ``h // group``)."""
    return jnp.repeat(x.astype(jnp.float32), heads // x.shape[2], axis=2)


def _reference(q, k, v, g, beta, state, seg, scale):
    """``(o, final_state, u)`` of the fp32 token-serial reference."""
    heads = v.shape[2]
    return reference.gated_delta_rule_reference(
        _expand(q, heads), _expand(k, heads), v.astype(jnp.float32), g, beta, scale=scale,
        initial_state=state, segment_ids=seg)


def _reference_chunk_states(k, v, g, beta, state, seg):
    """``[B, H, N, K, V]`` states entering each chunk, from the reference run on prefixes."""
    heads, dk, dv = v.shape[2], k.shape[3], v.shape[3]
    kf, vf = _expand(k, heads), v.astype(jnp.float32)
    starts = []
    for n in range(-(-k.shape[1] // kgd.CHUNK)):
        t = n * kgd.CHUNK
        if t == 0:
            starts.append(jnp.zeros((k.shape[0], heads, dk, dv)) if state is None else state)
            continue
        _, s, _ = reference.gated_delta_rule_reference(
            kf[:, :t], kf[:, :t], vf[:, :t], None if g is None else g[:, :t], beta[:, :t],
            scale=1.0, initial_state=state, segment_ids=None if seg is None else seg[:, :t])
        starts.append(s)
    return jnp.stack(starts, axis=2)


def _wy(k, v, g, beta, seg):
    """The kernels' ``w, u`` inputs: fp32 WY factors rounded to bf16 (as the forward does)."""
    w, u = chunked.wy_representation(_expand(k, v.shape[2]), v, g, beta, segment_ids=seg)
    seq_len = k.shape[1]
    return w[:, :seq_len].astype(k.dtype), u[:, :seq_len].astype(v.dtype)


def _assert_close(test, name, got, want, max_err=5e-3, allclose=True):
    err = tolerances.rel_err(got, want)
    test.assertLess(err, max_err, msg=f"{name}: relative RMS error {err:.2e}")
    if allclose:
        np.testing.assert_allclose(np.asarray(got, np.float32), want,
                                   **tolerances.fwd_tol(jnp.bfloat16), err_msg=name)


# B, T, H, Hk, K, V, decay (None: DeltaNet), h0, document lengths (the rest one more document)
_CPU_CASES = (
    ("plain_T128_K64_V64", 1, 128, 1, 1, 64, 64, 0.1, False, None),
    # starts at 64 (a chunk boundary), 100 (inside chunk 1) and 130 (inside the partial chunk 2)
    ("gva_h0_packed_partial_T150_K64_V128", 1, 150, 2, 1, 64, 128, 0.02, True, (64, 36, 30)),
    ("strong_decay_h0_partial_T65_K128_V64", 2, 65, 1, 1, 128, 64, 5.0, True, None),
    # starts at 10 and 70: chunk 0's incoming state reaches its first 10 tokens only
    ("packed_h0_T128_K64_V64", 1, 128, 1, 1, 64, 64, 0.2, True, (10, 60)),
    ("deltanet_h0_T100_K64_V64", 1, 100, 1, 1, 64, 64, None, True, None),
    ("gva_packed_T192_K128_V128", 1, 192, 2, 1, 128, 128, 0.1, True, (70, 30)),
)


# Slow (out of CI): interpreted Mosaic GPU kernels can hang instead of failing (MOSAIC_GPU.md,
# "Interpreter hang seen"). The mark is on the class: absl's parameterized copies of a method
# do not keep a method-level mark. Run one at a time: pytest -m slow <file> -k <case>.
@pytest.mark.slow
class StatePassInterpretTest(parameterized.TestCase):

    @parameterized.named_parameters(
        *_CPU_CASES,
        # h stored in fp32 (the S operand of W S then has its own 16-bit SMEM tile)
        ("fp32_states_gva_h0_packed_T150_K64_V128", 1, 150, 2, 1, 64, 128, 0.02, True,
         (64, 36, 30), jnp.float32),
    )
    def test_chunk_delta_h_matches_reference(self, batch, seq_len, heads, kv_heads, dk, dv,
                                             decay, h0, docs, states_dtype=jnp.bfloat16):
        _, k, v, g, beta, state, seg = _inputs(batch, seq_len, heads, kv_heads, dk, dv,
                                               decay=decay, h0=h0, docs=docs)
        w, u = _wy(k, v, g, beta, seg)
        h, v_new, final = kgd.chunk_delta_h_mosaic(k, w, u, g, initial_state=state,
                                                   segment_ids=seg, states_dtype=states_dtype,
                                                   interpret=True)
        want_h = _reference_chunk_states(k, v, g, beta, state, seg)
        _, want_final, want_u = _reference(k, k, v, g, beta, state, seg, 1.0)
        self.assertEqual((h.shape, h.dtype), (want_h.shape, jnp.dtype(states_dtype)))
        self.assertEqual((v_new.shape, v_new.dtype), (v.shape, v.dtype))
        self.assertEqual((final.shape, final.dtype), (want_final.shape, jnp.float32))
        _assert_close(self, "h", h, want_h)
        _assert_close(self, "v_new", v_new, want_u)
        _assert_close(self, "final_state", final, want_final)


@pytest.mark.slow
class ForwardInterpretTest(parameterized.TestCase):
    """The whole forward; W and U from :func:`kgd.chunk_wy_mosaic` (the default) except in the
    ``xla_wy`` cases."""

    @parameterized.named_parameters(
        *_CPU_CASES,
        ("xla_wy_gva_h0_packed_partial_T150_K64_V128", 1, 150, 2, 1, 64, 128, 0.02, True,
         (64, 36, 30), "xla"),
        ("xla_wy_deltanet_h0_T100_K64_V64", 1, 100, 1, 1, 64, 64, None, True, None, "xla"),
    )
    def test_forward_matches_reference(self, batch, seq_len, heads, kv_heads, dk, dv, decay, h0,
                                       docs, wy_implementation="mosaic"):
        q, k, v, g, beta, state, seg = _inputs(batch, seq_len, heads, kv_heads, dk, dv,
                                               decay=decay, h0=h0, docs=docs)
        scale = dk ** -0.5
        o, final, v_new = kgd.gated_delta_rule_fwd_mosaic(
            q, k, v, g, beta, scale=scale, initial_state=state, segment_ids=seg,
            return_residual=True, wy_implementation=wy_implementation, interpret=True)
        want_o, want_final, want_u = _reference(q, k, v, g, beta, state, seg, scale)
        self.assertEqual((o.shape, o.dtype), (want_o.shape, jnp.bfloat16))
        self.assertEqual((final.shape, final.dtype), (want_final.shape, jnp.float32))
        for name, got, want in (("o", o, want_o), ("final_state", final, want_final),
                                ("v_new", v_new, want_u)):
            _assert_close(self, name, got, want)


# ----------------------------------------------------------------------------------------------
# The reverse delta state pass (chunk_delta_dh_mosaic).

_HI = jax.lax.Precision.HIGHEST


def _pad_chunks(x, n_chunks):
    pad = n_chunks * kgd.CHUNK - x.shape[1]
    return jnp.pad(x, ((0, 0), (0, pad)) + ((0, 0),) * (x.ndim - 2))


def _chunk_gates(g, seg, shape, n_chunks):
    """Per chunk ``(gam [B, C, H], conn [B, C], last [B, C], dmat [B, C, C, H])``, fp32, from
    ``common.document_index`` (test-side, not the kernels' ``doc_vectors``)."""
    batch, seq_len, heads = shape
    gf = _pad_chunks(jnp.zeros(shape) if g is None else g.astype(jnp.float32), n_chunks)
    seg = jnp.zeros((batch, seq_len), jnp.int32) if seg is None else seg
    doc = jnp.pad(common.document_index(seg), ((0, 0), (0, n_chunks * kgd.CHUNK - seq_len)),
                  mode="edge")
    causal = jnp.tril(jnp.ones((kgd.CHUNK, kgd.CHUNK), bool))
    for n in range(n_chunks):
        sl = slice(n * kgd.CHUNK, (n + 1) * kgd.CHUNK)
        gam = jnp.cumsum(gf[:, sl], axis=1)
        dc = doc[:, sl]
        prev = dc[:, :1] if n == 0 else doc[:, n * kgd.CHUNK - 1:n * kgd.CHUNK]
        mask = (causal[None] & (dc[:, :, None] == dc[:, None, :]))[..., None]  # [B, t, s, 1]
        expo = jnp.where(mask, gam[:, :, None, :] - gam[:, None, :, :], 0.0)
        yield (gam, (dc == prev).astype(jnp.float32), (dc == dc[:, -1:]).astype(jnp.float32),
               jnp.where(mask, jnp.exp(expo), 0.0))


def _chunk_form(q, k, w, u, g, seg, h0, e, f, scale):
    """fp32 chunk form of the GDN forward with additive perturbations ``e`` and ``f``.

    ``q, k, w`` ``[B, T, H, K]`` and ``u, f`` ``[B, T, H, V]`` fp32 (value heads), ``h0``
    ``[B, H, K, V]``; ``e`` ``[B, H, N, K, V]`` is added to the state leaving chunk ``n`` and
    ``f`` to ``v_new``. Returns ``(o, final_state)``. Written from the chunk equations
    (``kernel_gpu.py``'s module docstring); ``ChunkFormTest``
    (``kernel_mosaic_gdn_bwd_test.py``) checks it against the token-serial reference, so
    ``jax.vjp`` of it w.r.t. ``(h0, e, f)`` at zero perturbations gives the
    reverse pass's ``dh0``, ``dh`` (the gradients of the states leaving each chunk) and the
    total ``dv_new`` by autodiff, not by the hand-derived recursion the kernel runs.
    """
    return chunk_form_with_residuals(q, k, w, u, g, seg, h0, e, f, scale)[0]


def chunk_form_with_residuals(q, k, w, u, g, seg, h0, e, f, scale):
    """:func:`_chunk_form` that also returns what the backward kernels read: ``((o,
    final_state), (h, v_new))`` with ``h`` ``[B, H, N, K, V]`` the states entering each chunk
    and ``v_new`` ``[B, T, H, V]`` (``kernel_mosaic_gdn_bwd_test.py``)."""
    seq_len, n_chunks = k.shape[1], e.shape[2]
    q, k, w, u, f = (_pad_chunks(x, n_chunks) for x in (q, k, w, u, f))
    s, outs, states, vns = h0, [], [], []
    for n, (gam, conn, last, dmat) in enumerate(_chunk_gates(g, seg, k.shape[:1] + (seq_len,)
                                                             + k.shape[2:3], n_chunks)):
        sl = slice(n * kgd.CHUNK, (n + 1) * kgd.CHUNK)
        states.append(s)
        vn = u[:, sl] - jnp.einsum("bthk,bhkv->bthv", w[:, sl], s, precision=_HI) + f[:, sl]
        vns.append(vn)
        e_in = conn[:, :, None] * jnp.exp(gam)  # [B, C, H]
        qk = jnp.einsum("bthk,bshk->btsh", q[:, sl], k[:, sl], precision=_HI) * dmat
        o = (jnp.einsum("bthk,bhkv->bthv", q[:, sl] * e_in[..., None], s, precision=_HI)
             + jnp.einsum("btsh,bshv->bthv", qk, vn, precision=_HI))
        outs.append(scale * o)
        e_out = last[:, :, None] * jnp.exp(gam[:, -1:] - gam)  # [B, C, H]
        keep = conn[:, -1:] * jnp.exp(gam[:, -1])  # [B, H]
        s = (keep[..., None, None] * s
             + jnp.einsum("bthk,bthv->bhkv", k[:, sl] * e_out[..., None], vn, precision=_HI)
             + e[:, :, n])
    o = jnp.concatenate(outs, axis=1)[:, :seq_len]
    v_new = jnp.concatenate(vns, axis=1)[:, :seq_len]
    return (o, s), (jnp.stack(states, axis=2), v_new)


def _dv_local(q, k, g, seg, do, scale):
    """``scale (Q K^T * D)^T dO`` per chunk (fp32): ``v_new``'s gradient through its own
    chunk's read-out, the kernel's ``dv_local`` input."""
    seq_len = k.shape[1]
    n_chunks = -(-seq_len // kgd.CHUNK)
    q, k, do = (_pad_chunks(x, n_chunks) for x in (q, k, do))
    out = []
    for n, (_, _, _, dmat) in enumerate(_chunk_gates(g, seg, k.shape[:1] + (seq_len,)
                                                     + k.shape[2:3], n_chunks)):
        sl = slice(n * kgd.CHUNK, (n + 1) * kgd.CHUNK)
        qk = jnp.einsum("bthk,bshk->btsh", q[:, sl], k[:, sl], precision=_HI) * dmat
        out.append(scale * jnp.einsum("btsh,bthv->bshv", qk, do[:, sl], precision=_HI))
    return jnp.concatenate(out, axis=1)[:, :seq_len]


def _reference_dh(q, k, w, g, seg, do, dht, scale):
    """``(dh, dv_new, dh0)`` of the chunk form by ``jax.vjp`` (fp32; ``dht=None``: zeros)."""
    batch, seq_len, heads, dk = k.shape
    dv = do.shape[-1]
    n_chunks = -(-seq_len // kgd.CHUNK)
    u = jnp.zeros((batch, seq_len, heads, dv))  # the gradients do not depend on U

    def fn(h0, e, f):
        return _chunk_form(q, k, w, u, g, seg, h0, e, f, scale)

    _, vjp = jax.vjp(fn, jnp.zeros((batch, heads, dk, dv)),
                     jnp.zeros((batch, heads, n_chunks, dk, dv)), u)
    dht = jnp.zeros((batch, heads, dk, dv)) if dht is None else dht
    dh0, dh, dvn = vjp((do.astype(jnp.float32), dht))
    return dh, dvn, dh0


def _dh_inputs(batch, seq_len, heads, kv_heads, dk, dv, *, decay, dht, docs, seed=0):
    """bf16 kernel inputs ``q, k`` (``Hk`` heads), ``w``, ``do``, ``dv_local``, fp32 ``g``,
    ``dht``, ``segment_ids``, and the fp32 value-head ``qf, kf, wf, dof`` the reference reads
    (the same rounded values)."""
    q, k, v, g, beta, _, seg = _inputs(batch, seq_len, heads, kv_heads, dk, dv, decay=decay,
                                       h0=False, docs=docs, seed=seed)
    w, _ = _wy(k, v, g, beta, seg)
    rng = np.random.default_rng(seed + 7)
    do = jnp.asarray(rng.standard_normal(v.shape), jnp.bfloat16)
    state_grad = (jnp.asarray(rng.standard_normal((batch, heads, dk, dv)), jnp.float32) if dht
                  else None)
    scale = dk ** -0.5
    qf, kf, wf, dof = _expand(q, heads), _expand(k, heads), w.astype(jnp.float32), do.astype(
        jnp.float32)
    dvl = _dv_local(qf, kf, g, seg, dof, scale).astype(jnp.bfloat16)
    return (q, k, w, do, dvl, g, state_grad, seg), (qf, kf, wf, dof), scale


# B, T, H, Hk, K, V, decay (None: DeltaNet), dht, document lengths (the rest one more document)
_DH_CASES = (
    ("plain_T128_K64_V64", 1, 128, 1, 1, 64, 64, 0.1, False, None),
    # starts at 64 (a chunk boundary), 100 (inside chunk 1) and 130 (inside the partial chunk 2)
    ("gva_dht_packed_partial_T150_K64_V128", 1, 150, 2, 1, 64, 128, 0.02, True, (64, 36, 30)),
    # T = 65, K = 128, V = 64 (strong decay, dht) hung in the interpreter in 3 of 3 runs (0 %
    # CPU, MOSAIC_GPU.md Sec. 5), so the strong-decay cases split K = 128 and the partial chunk.
    ("strong_decay_dht_T128_K128_V64", 2, 128, 1, 1, 128, 64, 5.0, True, None),
    ("strong_decay_dht_partial_T65_K64_V64", 2, 65, 1, 1, 64, 64, 5.0, True, None),
    ("deltanet_dht_T100_K64_V64", 1, 100, 1, 1, 64, 64, None, True, None),
    ("gva_packed_T192_K128_V128", 1, 192, 2, 1, 128, 128, 0.1, True, (70, 30)),
)


# The chunk form above is checked against the token-serial reference (values and final state)
# by ``ChunkFormTest`` in ``kernel_mosaic_gdn_bwd_test.py``, whose reverse-pass references are
# its ``jax.vjp``.


@pytest.mark.slow
class DeltaDhInterpretTest(parameterized.TestCase):

    def _check(self, batch, seq_len, heads, kv_heads, dk, dv, decay, dht, docs,
               states_dtype=jnp.bfloat16):
        args, (qf, kf, wf, dof), scale = _dh_inputs(batch, seq_len, heads, kv_heads, dk, dv,
                                                    decay=decay, dht=dht, docs=docs)
        q, k, w, do, dvl, g, state_grad, seg = args
        dh, dvn, dh0 = kgd.chunk_delta_dh_mosaic(q, k, w, do, dvl, g, scale=scale,
                                                 final_state_grad=state_grad, segment_ids=seg,
                                                 states_dtype=states_dtype, interpret=True)
        want_dh, want_dvn, want_dh0 = _reference_dh(qf, kf, wf, g, seg, dof, state_grad, scale)
        n_chunks = -(-seq_len // kgd.CHUNK)
        self.assertEqual((dh.shape, dh.dtype),
                         ((batch, heads, n_chunks, dk, dv), jnp.dtype(states_dtype)))
        self.assertEqual((dvn.shape, dvn.dtype), (do.shape, do.dtype))
        self.assertEqual((dh0.shape, dh0.dtype), ((batch, heads, dk, dv), jnp.float32))
        for name, got, want in (("dh", dh, want_dh), ("dv_new", dvn, want_dvn),
                                ("dh0", dh0, want_dh0)):
            _assert_close(self, name, got, want, allclose=False)

    @parameterized.named_parameters(*_DH_CASES)
    def test_chunk_delta_dh_matches_autodiff(self, *case):
        self._check(*case)

    def test_fp32_states(self):
        self._check(1, 150, 2, 1, 64, 128, 0.02, True, (64, 36, 30), states_dtype=jnp.float32)


# Sequence pieces, B, T, H, Hk, K, V, decay (None: DeltaNet), h0 / dht, document lengths: with
# no documents every piece map is non-zero, so the entry states depend on all of them; the
# packed case has documents crossing piece edges and one starting on an edge (T = 512: 8 chunks).
_PIECE_CASES = (
    ("P4_gva_h0_T512_K64_V64", 4, 1, 512, 2, 1, 64, 64, 0.02, True, None),
    ("P2_packed_h0_T512_K64_V128", 2, 1, 512, 2, 2, 64, 128, 0.05, True, (100, 156, 150)),
    ("P4_deltanet_h0_T512_K64_V64", 4, 1, 512, 1, 1, 64, 64, None, True, None),
)


@pytest.mark.slow
class PiecesInterpretTest(parameterized.TestCase):

    @parameterized.named_parameters(*_PIECE_CASES)
    def test_chunk_delta_h_pieces(self, pieces, batch, seq_len, heads, kv_heads, dk, dv, decay,
                                  h0, docs):
        _, k, v, g, beta, state, seg = _inputs(batch, seq_len, heads, kv_heads, dk, dv,
                                               decay=decay, h0=h0, docs=docs, seed=3)
        w, u = _wy(k, v, g, beta, seg)
        run = functools.partial(kgd.chunk_delta_h_mosaic, k, w, u, g, initial_state=state,
                                segment_ids=seg, interpret=True)
        h, v_new, final, maps = run(pieces=pieces, return_maps=True)
        one = run(pieces=1)
        self.assertEqual(maps.shape, (batch, pieces, heads, dk, dk))
        _assert_close(self, "h", h, _reference_chunk_states(k, v, g, beta, state, seg))
        _, want_final, want_u = _reference(k, k, v, g, beta, state, seg, 1.0)
        _assert_close(self, "v_new", v_new, want_u)
        _assert_close(self, "final_state", final, want_final)
        # One piece rounds other bf16 operands (the maps' states, the entry states): the same
        # gate between the two kernels' paths as against the reference.
        for name, got, want in zip(("h", "v_new", "final_state"), (h, v_new, final), one):
            self.assertEqual((got.shape, got.dtype), (want.shape, want.dtype), msg=name)
            _assert_close(self, f"{name} vs one piece", got, want.astype(jnp.float32),
                          allclose=False)
        if seg is None:  # each map against the pass on the piece alone from a random state
            span = seq_len // pieces
            s0 = jnp.asarray(np.random.default_rng(5).standard_normal((batch, heads, dk, dv)),
                             jnp.float32)
            for p in range(pieces):
                sl = slice(p * span, (p + 1) * span)
                _, _, want = kgd.chunk_delta_h_mosaic(
                    k[:, sl], w[:, sl], jnp.zeros_like(u[:, sl]), None if g is None else g[:, sl],
                    initial_state=s0, states_dtype=jnp.float32, interpret=True)
                got = jnp.einsum("bhij,bhjv->bhiv", maps[:, p], s0,
                                 precision=jax.lax.Precision.HIGHEST)
                _assert_close(self, f"map of piece {p}", got, want, allclose=False)

    @parameterized.named_parameters(*_PIECE_CASES)
    def test_chunk_delta_dh_pieces(self, pieces, batch, seq_len, heads, kv_heads, dk, dv, decay,
                                   dht, docs):
        args, (qf, kf, wf, dof), scale = _dh_inputs(batch, seq_len, heads, kv_heads, dk, dv,
                                                    decay=decay, dht=dht, docs=docs, seed=4)
        q, k, w, do, dvl, g, state_grad, seg = args
        run = functools.partial(kgd.chunk_delta_dh_mosaic, q, k, w, do, dvl, g, scale=scale,
                                final_state_grad=state_grad, segment_ids=seg, interpret=True)
        got = run(pieces=pieces)  # piece maps formed here
        one = run(pieces=1)
        _, _, _, maps = kgd.chunk_delta_h_mosaic(k, w, jnp.zeros_like(do), g, segment_ids=seg,
                                                 states_dtype=q.dtype, pieces=pieces,
                                                 return_maps=True, interpret=True)
        given = run(pieces=pieces, piece_maps=maps)  # the forward's maps, as mosaic_vjp passes
        want = _reference_dh(qf, kf, wf, g, seg, dof, state_grad, scale)
        for i, name in enumerate(("dh", "dv_new", "dh0")):
            self.assertEqual((got[i].shape, got[i].dtype), (one[i].shape, one[i].dtype))
            _assert_close(self, name, got[i], want[i], allclose=False)
            _assert_close(self, f"{name} vs one piece", got[i], one[i].astype(jnp.float32),
                          allclose=False)
            _assert_close(self, f"{name} (maps given) vs formed", given[i],
                          got[i].astype(jnp.float32), 1e-6, allclose=False)


class PiecesLoweringTest(absltest.TestCase):
    """Both state passes with ``pieces=2`` lower for CUDA as their launches: the maps (``U = 0``
    from the identity), the pieces from zero, the stored pass; the reverse pass reuses given
    maps."""

    def test_chunk_delta_h_and_dh_pieces_lower_for_cuda(self):
        _, k, v, g, beta, state, seg = _inputs(1, 512, 2, 1, 64, 64, decay=0.1, h0=True,
                                               docs=(300,))
        w, u = _wy(k, v, g, beta, seg)

        def fwd(k, w, u, g, state, seg):
            return kgd.chunk_delta_h_mosaic(k, w, u, g, initial_state=state, segment_ids=seg,
                                            states_dtype=k.dtype, pieces=2, return_maps=True)

        text = jax.jit(fwd).trace(k, w, u, g, state, seg).lower(
            lowering_platforms=("cuda",)).as_text()
        self.assertEqual(text.count("custom_call @mosaic_gpu"), 3)
        for name in ("gdn_chunk_delta_h_maps", "gdn_chunk_delta_h_pieces", "gdn_chunk_delta_h"):
            self.assertIn(name, text)
        _, _, _, maps = jax.eval_shape(fwd, k, w, u, g, state, seg)
        self.assertEqual(maps.shape, (1, 2, 2, 64, 64))
        args, _, scale = _dh_inputs(1, 512, 2, 1, 64, 64, decay=0.1, dht=True, docs=(300,))

        def bwd(*args, maps=None):
            q, k, w, do, dvl, g, state_grad, seg = args
            return kgd.chunk_delta_dh_mosaic(q, k, w, do, dvl, g, scale=scale,
                                             final_state_grad=state_grad, segment_ids=seg,
                                             states_dtype=q.dtype, pieces=2, piece_maps=maps)

        for given, calls in ((False, 3), (True, 2)):
            m = jnp.zeros((1, 2, 2, 64, 64)) if given else None
            text = jax.jit(functools.partial(bwd, maps=m)).trace(*args).lower(
                lowering_platforms=("cuda",)).as_text()
            self.assertEqual(text.count("custom_call @mosaic_gpu"), calls, msg=f"{given=}")
            self.assertIn("gdn_chunk_delta_dh_pieces", text)


@pytest.mark.gpu
class GpuTest(kmg_test.HopperTestCase):
    """The compiled kernels (wgmma, TMA) on bf16 inputs against the fp32 reference."""

    @parameterized.named_parameters(
        # B, T, H, Hk, K, V, decay (None: DeltaNet), h0, document lengths (the rest one more)
        ("plain_T2048_K128_V128", 2, 2048, 4, 4, 128, 128, 0.05, False, None),
        ("gva_h0_packed_T4096_K128_V128", 2, 4096, 4, 2, 128, 128, 0.05, True,
         (700, 1, 64, 999, 1200)),
        ("strong_decay_h0_partial_T1000_K64_V128", 2, 1000, 2, 1, 64, 128, 5.0, True, None),
        ("packed_T3000_K128_V64", 1, 3000, 3, 3, 128, 64, 0.2, False, (10, 54, 500, 2000)),
        ("decay_h0_T4096_K64_V64", 1, 4096, 2, 2, 64, 64, 0.02, True, None),
        ("deltanet_h0_packed_T2048_K128_V128", 1, 2048, 2, 2, 128, 128, None, True,
         (300, 700)),
    )
    def test_forward_matches_reference(self, batch, seq_len, heads, kv_heads, dk, dv, decay, h0,
                                       docs):
        q, k, v, g, beta, state, seg = _inputs(batch, seq_len, heads, kv_heads, dk, dv,
                                               decay=decay, h0=h0, docs=docs, seed=3)
        scale = dk ** -0.5
        o, final, v_new = kgd.gated_delta_rule_fwd_mosaic(
            q, k, v, g, beta, scale=scale, initial_state=state, segment_ids=seg,
            return_residual=True)
        want_o, want_final, want_u = _reference(q, k, v, g, beta, state, seg, scale)
        self.assertEqual((o.shape, o.dtype), (want_o.shape, jnp.bfloat16))
        self.assertEqual((final.shape, final.dtype), (want_final.shape, jnp.float32))
        for name, got, want in (("o", o, want_o), ("final_state", final, want_final),
                                ("v_new", v_new, want_u)):
            _assert_close(self, name, got, want, allclose=False)

    @parameterized.named_parameters(
        ("gva_h0_packed_T2048_K128_V128", 1, 2048, 4, 2, 128, 128, 0.05, True, (700, 1, 64)),
        ("fp32_states_T1000_K64_V64", 1, 1000, 2, 2, 64, 64, 0.5, True, None, jnp.float32),
    )
    def test_chunk_delta_h_matches_reference(self, batch, seq_len, heads, kv_heads, dk, dv,
                                             decay, h0, docs, states_dtype=jnp.bfloat16):
        _, k, v, g, beta, state, seg = _inputs(batch, seq_len, heads, kv_heads, dk, dv,
                                               decay=decay, h0=h0, docs=docs, seed=5)
        w, u = _wy(k, v, g, beta, seg)
        h, v_new, final = kgd.chunk_delta_h_mosaic(k, w, u, g, initial_state=state,
                                                   segment_ids=seg, states_dtype=states_dtype)
        want_h = _reference_chunk_states(k, v, g, beta, state, seg)
        _, want_final, want_u = _reference(k, k, v, g, beta, state, seg, 1.0)
        for name, got, want in (("h", h, want_h), ("v_new", v_new, want_u),
                                ("final_state", final, want_final)):
            _assert_close(self, name, got, want, allclose=False)

    @parameterized.named_parameters(
        # B, T, H, Hk, K, V, decay (None: DeltaNet), dht, document lengths (the rest one more)
        ("gva_dht_packed_T4096_K128_V128", 1, 4096, 4, 2, 128, 128, 0.05, True,
         (700, 1, 64, 999, 1200)),
        ("strong_decay_dht_partial_T1000_K64_V128", 2, 1000, 2, 1, 64, 128, 5.0, True, None),
        ("packed_T3000_K128_V64", 1, 3000, 2, 2, 128, 64, 0.2, False, (10, 54, 500, 2000)),
        ("deltanet_dht_packed_T2048_K64_V64", 1, 2048, 2, 2, 64, 64, None, True, (300, 700)),
        ("fp32_states_T1000_K128_V128", 1, 1000, 2, 2, 128, 128, 0.1, True, None, jnp.float32),
    )
    def test_chunk_delta_dh_matches_autodiff(self, batch, seq_len, heads, kv_heads, dk, dv,
                                             decay, dht, docs, states_dtype=jnp.bfloat16):
        args, (qf, kf, wf, dof), scale = _dh_inputs(batch, seq_len, heads, kv_heads, dk, dv,
                                                    decay=decay, dht=dht, docs=docs, seed=9)
        q, k, w, do, dvl, g, state_grad, seg = args
        dh, dvn, dh0 = kgd.chunk_delta_dh_mosaic(q, k, w, do, dvl, g, scale=scale,
                                                 final_state_grad=state_grad, segment_ids=seg,
                                                 states_dtype=states_dtype)
        want = _reference_dh(qf, kf, wf, g, seg, dof, state_grad, scale)
        for name, got, w_ in zip(("dh", "dv_new", "dh0"), (dh, dvn, dh0), want):
            _assert_close(self, name, got, w_, allclose=False)


def _check_forward_lowers(test, dk, dv, wy_implementation):
    q, k, v, g, beta, state, seg = _inputs(1, 200, 2, 1, dk, dv, decay=0.2, h0=True,
                                           docs=(70, 30))

    def fn(q, k, v, g, beta, state, seg):
        return kgd.gated_delta_rule_fwd_mosaic(q, k, v, g, beta, initial_state=state,
                                               segment_ids=seg,
                                               wy_implementation=wy_implementation)

    text = (jax.jit(fn).trace(q, k, v, g, beta, state, seg)
            .lower(lowering_platforms=("cuda",)).as_text())
    mosaic_wy = wy_implementation == "mosaic"
    # (WY preparation,) delta state pass, output
    test.assertEqual(text.count("custom_call @mosaic_gpu"), 2 + mosaic_wy)
    test.assertEqual("gdn_chunk_wy" in text, mosaic_wy)
    test.assertIn("gdn_chunk_delta_h", text)
    test.assertIn("simple_gla_chunk_output", text)


def _check_fp32_states_deltanet_lowers(test, dk, dv):
    _, k, v, _, beta, _, _ = _inputs(2, 130, 2, 2, dk, dv, decay=None, h0=False, docs=None)
    w, u = _wy(k, v, None, beta, None)

    def fn(k, w, u):
        return kgd.chunk_delta_h_mosaic(k, w, u, None, states_dtype=jnp.float32)

    text = jax.jit(fn).trace(k, w, u).lower(lowering_platforms=("cuda",)).as_text()
    test.assertEqual(text.count("custom_call @mosaic_gpu"), 1)
    test.assertIn("gdn_chunk_delta_h", text)


def _check_chunk_delta_dh_lowers(test, dk, dv, states_dtype):
    args, _, scale = _dh_inputs(1, 200, 2, 1, dk, dv, decay=0.2, dht=True, docs=(70, 30))

    def fn(q, k, w, do, dvl, g, state_grad, seg):
        return kgd.chunk_delta_dh_mosaic(q, k, w, do, dvl, g, scale=scale,
                                         final_state_grad=state_grad, segment_ids=seg,
                                         states_dtype=states_dtype)

    text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    test.assertEqual(text.count("custom_call @mosaic_gpu"), 1)
    test.assertIn("gdn_chunk_delta_dh", text)


# Lowering variants: LoweringTest has two per kernel (K = V = 64 and K = V = 128, each with one
# of the options), LoweringSlowTest the other ones; tests/ci_slow.py moves chunk_delta_dh's
# K = V = 128 bf16 one out of CI too (CI lowers it within kernel_mosaic_gdn_vjp_test's export).
_FWD_CI, _FWD_SLOW = kmg_test.split_variants(
    [dict(dk=64, dv=64, wy_implementation="xla"), dict(dk=128, dv=128, wy_implementation="mosaic")],
    dk=(64, 128), dv=(64, 128), wy_implementation=("mosaic", "xla"))
_FP32_DELTANET_CI, _FP32_DELTANET_SLOW = kmg_test.split_variants(
    [dict(dk=64, dv=64), dict(dk=128, dv=128)], dk=(64, 128), dv=(64, 128))
_DH_LOWER_CI, _DH_LOWER_SLOW = kmg_test.split_variants(
    [dict(dk=64, dv=64, states_dtype=jnp.float32), dict(dk=128, dv=128, states_dtype=jnp.bfloat16)],
    dk=(64, 128), dv=(64, 128), states_dtype=(jnp.bfloat16, jnp.float32))


class LoweringTest(parameterized.TestCase):

    @parameterized.named_parameters(*_FWD_CI)
    def test_forward_lowers_for_cuda(self, **variant):
        _check_forward_lowers(self, **variant)

    @parameterized.named_parameters(*_FP32_DELTANET_CI)
    def test_fp32_states_deltanet_lowers_for_cuda(self, **variant):
        _check_fp32_states_deltanet_lowers(self, **variant)

    @parameterized.named_parameters(*_DH_LOWER_CI)
    def test_chunk_delta_dh_lowers_for_cuda(self, **variant):
        _check_chunk_delta_dh_lowers(self, **variant)


# Slow (out of CI): the other K, V and option combinations of LoweringTest; each lowers every
# layout of the kernels again (0.4 to 3 s a variant, 12 s for the 14 on a 2-core machine). The
# mark is on the class: absl's parameterized copies of a method do not keep a method-level mark.
@pytest.mark.slow
class LoweringSlowTest(parameterized.TestCase):

    @parameterized.named_parameters(*_FWD_SLOW)
    def test_forward_lowers_for_cuda(self, **variant):
        _check_forward_lowers(self, **variant)

    @parameterized.named_parameters(*_FP32_DELTANET_SLOW)
    def test_fp32_states_deltanet_lowers_for_cuda(self, **variant):
        _check_fp32_states_deltanet_lowers(self, **variant)

    @parameterized.named_parameters(*_DH_LOWER_SLOW)
    def test_chunk_delta_dh_lowers_for_cuda(self, **variant):
        _check_chunk_delta_dh_lowers(self, **variant)


class ValidationTest(absltest.TestCase):

    def test_rejects_what_the_kernels_cannot_run(self):
        q, k, v, g, beta, _, _ = _inputs(1, 64, 2, 1, 64, 64, decay=0.1, h0=False, docs=None)
        w, u = _wy(k, v, g, beta, None)
        with self.assertRaisesRegex(ValueError, "w must be"):
            kgd.chunk_delta_h_mosaic(k, w[:, :, :1], u, g)
        with self.assertRaisesRegex(ValueError, "16-bit dtype"):
            kgd.chunk_delta_h_mosaic(k.astype(jnp.float32), w.astype(jnp.float32),
                                     u.astype(jnp.float32), g)
        with self.assertRaisesRegex(ValueError, "initial_state must be"):
            kgd.chunk_delta_h_mosaic(k, w, u, g, initial_state=jnp.zeros((1, 2, 64, 32)))
        with self.assertRaisesRegex(ValueError, "beta must be"):
            kgd.gated_delta_rule_fwd_mosaic(q, k, v, g, beta[:, :, :1])
        with self.assertRaisesRegex(ValueError, "head dims"):
            kgd.gated_delta_rule_fwd_mosaic(q, k, v[..., :32], g, beta)

    def test_chunk_delta_dh_rejects_what_it_cannot_run(self):
        args, _, _ = _dh_inputs(1, 64, 2, 1, 64, 64, decay=0.1, dht=False, docs=None)
        q, k, w, do, dvl, g, _, _ = args
        with self.assertRaisesRegex(ValueError, "k must have"):
            kgd.chunk_delta_dh_mosaic(q, k[:, :32], w, do, dvl, g, scale=1.0)
        with self.assertRaisesRegex(ValueError, "w must be"):
            kgd.chunk_delta_dh_mosaic(q, k, w[:, :, :1], do, dvl, g, scale=1.0)
        with self.assertRaisesRegex(ValueError, "dv_local must have"):
            kgd.chunk_delta_dh_mosaic(q, k, w, do, dvl.astype(jnp.float32), g, scale=1.0)
        with self.assertRaisesRegex(ValueError, "final_state_grad must be"):
            kgd.chunk_delta_dh_mosaic(q, k, w, do, dvl, g, scale=1.0,
                                      final_state_grad=jnp.zeros((1, 2, 64, 32)))
        with self.assertRaisesRegex(ValueError, "states_dtype must be"):
            kgd.chunk_delta_dh_mosaic(q, k, w, do, dvl, g, scale=1.0, states_dtype=jnp.float16)
        with self.assertRaisesRegex(ValueError, "head dims"):
            kgd.chunk_delta_dh_mosaic(q, k, w, do[..., :32], dvl[..., :32], g, scale=1.0)

    def test_pieces_are_refused_when_they_do_not_fit(self):
        args, _, _ = _dh_inputs(1, 512, 2, 1, 64, 64, decay=0.1, dht=False, docs=None)
        q, k, w, do, dvl, g, _, _ = args
        with self.assertRaisesRegex(ValueError, "pieces=3 must be a positive divisor"):
            kgd.chunk_delta_h_mosaic(k, w, do, g, pieces=3)
        with self.assertRaisesRegex(ValueError, "pieces=3 must be a positive divisor"):
            kgd.chunk_delta_dh_mosaic(q, k, w, do, dvl, g, scale=1.0, pieces=3)
        with self.assertRaisesRegex(ValueError, r"piece_maps must be \[B, P, H, K, K\]"):
            kgd.chunk_delta_dh_mosaic(q, k, w, do, dvl, g, scale=1.0, pieces=2,
                                      piece_maps=jnp.zeros((1, 4, 2, 64, 64)))


if __name__ == "__main__":
    absltest.main()
