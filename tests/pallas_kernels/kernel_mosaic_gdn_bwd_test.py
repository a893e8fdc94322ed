"""The Gated DeltaNet Mosaic GPU backward kernels of ``kernel_mosaic_gpu_bwd.py``, on CPU and GPU.

``pallas_kernels/gated_delta_rule/kernel_mosaic_gpu_bwd.py`` (issue 29, not dispatched) has
:func:`chunk_delta_grads_mosaic` (``dq``, ``dk`` through ``q . k`` and the state, ``dw`` and the
gate gradient through the read-out and the state update, with the WY factors ``W, U`` held
fixed) and :func:`chunk_dv_local_mosaic` (``scale (Q K^T * D)^T dO`` per chunk). The reference
of the first is ``jax.vjp`` of a small fp32 chunk form written here (:func:`_chunk_form`:
``v_new = U - W S + f``, the read-out and the state update per chunk of 64, with an additive
perturbation ``e`` of each chunk's leaving state), taken w.r.t. ``q, k, w, g`` (and ``e, f``,
which give the kernel's ``dh`` and ``dv_new`` inputs); its primal also gives the kernel's ``h``
and ``v_new`` inputs. ``ChunkFormTest`` (CI) checks the chunk form against the token-serial
reference (:func:`pallas_kernels.gated_delta_rule.reference.gated_delta_rule_reference`) to
1e-4, so the reference gradients come from autodiff of a form checked against the recurrence,
not from the hand-derived equations the kernel runs; it also checks that the ``dv_local``
formula is the read-out part of autodiff's ``dv_new``. The kernel reads ``h``, ``dh``,
``v_new``, ``dv_new`` rounded to bf16 (as the GPU pipeline stores them) and rounds ``dA`` once
more, so the gate is a relative RMS error (< 5e-3; ``dg`` < 1e-2).
``PipelineInterpretTest`` composes the forward state pass, ``dv_local``, the reverse state pass
and the gradient kernel and compares ``dq`` and ``dh0`` with ``jax.vjp`` of the XLA chunk form
:func:`pallas_kernels.gated_delta_rule.chunked.gated_delta_rule_chunked`.

The interpreted classes are marked ``slow`` (interpreted Mosaic GPU kernels can hang instead of
failing, ``pallas_kernels/common/MOSAIC_GPU.md``); ``LoweringTest`` exports the kernels for CUDA
on the CPU host with ``jax.export`` (two variants per kernel; ``LoweringSlowTest``, ``slow``,
the other six); ``GpuTest`` (marked ``gpu``) runs the compiled kernels on a
Hopper GPU. Run the interpreted cases one at a time under ``timeout`` when debugging:
``pytest -m slow tests/pallas_kernels/kernel_mosaic_gdn_bwd_test.py -k <case>``.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest, parameterized

from pallas_kernels.gated_delta_rule import chunked
from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu as kgd
from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu_bwd as kbwd
from tests import tolerances
from tests.pallas_kernels import kernel_mosaic_gdn_test as gdn_test
from tests.pallas_kernels import kernel_mosaic_gpu_test as kmg_test

_HI = jax.lax.Precision.HIGHEST
C = kbwd.CHUNK


# fp32 chunk form of the GDN forward with perturbations ``e`` (states) and ``f`` (v_new), also
# returning ``(h, v_new)``: ``((o, final_state), (h, v_new))``.
_chunk_form = gdn_test.chunk_form_with_residuals


def _cotangents(seed, do_shape, dht_shape, dht):
    """Standard-normal bf16 ``do`` and (if ``dht``, else None) fp32 ``dht``, drawn with numpy
    (each jax.random call on a new shape compiles a program)."""
    rng = np.random.default_rng(seed)
    do = jnp.asarray(rng.standard_normal(do_shape), jnp.bfloat16)
    return do, (jnp.asarray(rng.standard_normal(dht_shape), jnp.float32) if dht else None)


def _case(batch, seq_len, heads, kv_heads, dk, dv, decay, h0, dht, docs, seed=0):
    """Kernel inputs (bf16 where the GPU pipeline stores 16 bits) and the fp32 reference
    gradients ``(dq, dk, dw, dg)`` (``dq, dk`` summed over GVA groups; ``dg`` ``None`` for
    DeltaNet) by ``jax.vjp`` of :func:`_chunk_form`."""
    q, k, v, g, beta, state, seg = gdn_test._inputs(batch, seq_len, heads, kv_heads, dk, dv,
                                                    decay=decay, h0=h0, docs=docs, seed=seed)
    do, state_grad = _cotangents(seed + 11, v.shape, (batch, heads, dk, dv), dht)
    args, want = _case_references(q, k, v, g, beta, state, seg, do, state_grad,
                                  kv_heads=kv_heads)
    return args, seg, dk ** -0.5, want


@functools.partial(jax.jit, static_argnames=("kv_heads",))
def _case_references(q, k, v, g, beta, state, seg, do, state_grad, kv_heads):
    """:func:`_case`'s kernel inputs and reference gradients, as one compiled program (op by op
    they compiled each small op on its own)."""
    batch, seq_len, _, dk = k.shape
    heads, dv = v.shape[2], v.shape[3]
    w, u = gdn_test._wy(k, v, g, beta, seg)
    scale = dk ** -0.5
    n_chunks = -(-seq_len // C)
    qf, kf = gdn_test._expand(q, heads), gdn_test._expand(k, heads)
    wf, uf = w.astype(jnp.float32), u.astype(jnp.float32)
    h0f = jnp.zeros((batch, heads, dk, dv)) if state is None else state
    e0 = jnp.zeros((batch, heads, n_chunks, dk, dv))
    f0 = jnp.zeros((batch, seq_len, heads, dv))

    def fn(qf, kf, wf, gf, e, f):  # gf is unused for DeltaNet (g None): its gradient is 0
        return _chunk_form(qf, kf, wf, uf, None if g is None else gf, seg, h0f, e, f, scale)

    gf = jnp.zeros((batch, seq_len, heads)) if g is None else g
    _, vjp, (h, v_new) = jax.vjp(fn, qf, kf, wf, gf, e0, f0, has_aux=True)
    dht_ = jnp.zeros((batch, heads, dk, dv)) if state_grad is None else state_grad
    dq, dk_, dw, dg, dh, dvn = vjp((do.astype(jnp.float32), dht_))
    dq, dk_ = (kbwd._group_sum(x, kv_heads) for x in (dq, dk_))
    bf = jnp.bfloat16
    args = (q, k, v_new.astype(bf), do, dvn.astype(bf), g, h.astype(bf), dh.astype(bf))
    want = (dq, dk_, dw, None if g is None else dg)
    return args, want


def _check(test, got, want):
    dq, dk, dw, dg = got
    for name, x, y in (("dq", dq, want[0]), ("dk", dk, want[1]), ("dw", dw, want[2])):
        test.assertEqual((x.shape, x.dtype), (y.shape, jnp.float32), msg=name)
        err = tolerances.rel_err(x, y)
        test.assertLess(err, 5e-3, msg=f"{name}: relative RMS error {err:.2e}")
    if want[3] is None:
        test.assertIsNone(dg)
    else:
        test.assertEqual((dg.shape, dg.dtype), (want[3].shape, jnp.float32))
        err = tolerances.rel_err(dg, want[3])
        test.assertLess(err, 1e-2, msg=f"dg: relative RMS error {err:.2e}")


def _dv_local_case(batch, seq_len, heads, kv_heads, dk, dv, decay, h0, dht, docs, seed=0):
    """bf16 ``q, k, do``, fp32 ``g``, ``segment_ids``, ``scale`` and the fp32 reference
    ``scale (Q K^T * D)^T dO`` per chunk (``gdn_test._dv_local``, checked against autodiff by
    ``ChunkFormTest.test_dv_local_is_the_read_out_part_of_dv_new``)."""
    del h0, dht
    q, k, v, g, _, _, seg = gdn_test._inputs(batch, seq_len, heads, kv_heads, dk, dv,
                                             decay=decay, h0=False, docs=docs, seed=seed)
    do, _ = _cotangents(seed + 11, v.shape, None, False)  # _case's do
    scale = dk ** -0.5
    want = gdn_test._dv_local(gdn_test._expand(q, heads), gdn_test._expand(k, heads), g, seg,
                              do.astype(jnp.float32), scale)
    return (q, k, do, g), seg, scale, want


class ChunkFormTest(parameterized.TestCase):
    """:func:`_chunk_form` (whose ``jax.vjp`` is the reference) equals the token-serial
    reference, and its ``h`` and ``v_new`` are the reference's chunk states and residuals."""

    @parameterized.named_parameters(
        ("gva_h0_packed_partial_T150", 1, 150, 2, 1, 64, 64, 0.02, (64, 36, 30)),
        ("strong_decay_h0_T65", 1, 65, 1, 1, 64, 64, 5.0, None),
        ("deltanet_packed_T130", 1, 130, 1, 1, 64, 64, None, (10, 60)),
    )
    def test_chunk_form_matches_reference(self, batch, seq_len, heads, kv_heads, dk, dv, decay,
                                          docs):
        q, k, v, g, beta, state, seg = gdn_test._inputs(batch, seq_len, heads, kv_heads, dk, dv,
                                                        decay=decay, h0=True, docs=docs)
        qf, kf = gdn_test._expand(q, heads), gdn_test._expand(k, heads)
        vf = v.astype(jnp.float32)
        w, u = chunked.wy_representation(kf, vf, g, beta, segment_ids=seg)
        n_chunks = -(-seq_len // C)
        (o, final), (h, v_new) = _chunk_form(
            qf, kf, w[:, :seq_len], u[:, :seq_len], g, seg, state,
            jnp.zeros((batch, heads, n_chunks, dk, dv)), jnp.zeros_like(vf), 0.125)
        want_o, want_final, want_u = gdn_test._reference(q, k, v, g, beta, state, seg, 0.125)
        want_h = gdn_test._reference_chunk_states(k, v, g, beta, state, seg)
        for got, want in ((o, want_o), (final, want_final), (v_new, want_u), (h, want_h)):
            self.assertLess(tolerances.rel_err(got, want), 1e-4)

    @parameterized.named_parameters(
        ("gva_h0_dht_packed_partial_T150", 1, 150, 2, 1, 64, 64, 0.02, True, True, (64, 36, 30)),
        ("deltanet_dht_T100", 1, 100, 1, 1, 64, 64, None, False, True, None),
    )
    def test_dv_local_is_the_read_out_part_of_dv_new(self, *case):
        """``dv_new`` (autodiff) = ``dv_local`` + ``diag(last e^{G_L - G}) K dS'``: the
        reference of ``chunk_dv_local_mosaic`` is the read-out part of autodiff's ``dv_new``."""
        args, seg, _, _ = _case(*case)
        q, k, _, _, dvn, g, _, dh = args  # dvn, dh: bf16 copies of the autodiff values
        _, _, _, want_dvl = _dv_local_case(*case)
        batch, seq_len, heads = dvn.shape[:3]
        n_chunks = -(-seq_len // C)
        kf = gdn_test._pad_chunks(gdn_test._expand(k, heads), n_chunks)
        gates = gdn_test._chunk_gates(g, seg, (batch, seq_len, heads), n_chunks)
        state = []
        for n, (gam, _, last, _) in enumerate(gates):
            e_out = last[:, :, None] * jnp.exp(gam[:, -1:] - gam)  # [B, C, H]
            kd = jnp.einsum("bthk,bhkv->bthv", kf[:, n * C:(n + 1) * C],
                            dh[:, :, n].astype(jnp.float32), precision=_HI)
            state.append(kd * e_out[..., None])
        state = jnp.concatenate(state, axis=1)[:, :seq_len]
        self.assertLess(tolerances.rel_err(want_dvl + state, dvn), 5e-3)


# B, T, H, Hk, K, V, decay (None: DeltaNet), h0, dht, document lengths (the rest one more)
_CPU_CASES = (
    ("h0_dht_T128_K64_V64", 1, 128, 1, 1, 64, 64, 0.02, True, True, None),
    # starts at 64 (a chunk boundary), 100 (inside chunk 1) and 130 (inside the partial chunk 2)
    ("gva_h0_dht_packed_partial_T150_K64_V128", 1, 150, 2, 1, 64, 128, 0.02, True, True,
     (64, 36, 30)),
    ("strong_decay_dht_T128_K128_V64", 1, 128, 1, 1, 128, 64, 5.0, False, True, None),
    ("strong_decay_h0_partial_T65_K64_V64", 2, 65, 1, 1, 64, 64, 5.0, True, False, None),
    ("deltanet_h0_packed_T100_K64_V64", 1, 100, 1, 1, 64, 64, None, True, True, (10, 60)),
    ("gva_packed_T192_K128_V128", 1, 192, 4, 2, 128, 128, 0.1, True, True, (70, 30)),
)


# Slow (out of CI): see the module docstring. The mark is on the class: absl's parameterized
# copies of a method do not keep a method-level mark.
@pytest.mark.slow
class GradsInterpretTest(parameterized.TestCase):

    @parameterized.named_parameters(*_CPU_CASES)
    def test_chunk_delta_grads_matches_autodiff(self, *case):
        args, seg, scale, want = _case(*case)
        got = kbwd.chunk_delta_grads_mosaic(*args, scale=scale, segment_ids=seg, interpret=True)
        _check(self, got, want)

    @parameterized.named_parameters(*(c for c in _CPU_CASES if "partial" in c[0]
                                      or "deltanet" in c[0]))
    def test_partials_assemble_to_the_autodiff_grads(self, *case):
        """``chunk_delta_grads_partials_mosaic`` with a 16-bit ``dq``: ``dq`` against the
        reference; the per-value-head ``dk`` summed over each GVA group, and ``dg`` assembled
        from ``dgt`` and ``bnd`` (boundary at the chunk's last token, in-chunk reverse cumsum,
        in XLA here), against it too; and the 16-bit ``dq`` is the fp32 one rounded once."""
        args, seg, scale, want = _case(*case)
        q, kv_heads, seq_len = args[0], args[1].shape[2], args[1].shape[1]
        dq16, dk_h, dw, dgt, bnd = kbwd.chunk_delta_grads_partials_mosaic(
            *args, scale=scale, segment_ids=seg, dq_dtype=q.dtype, interpret=True)
        dq32 = kbwd.chunk_delta_grads_partials_mosaic(
            *args, scale=scale, segment_ids=seg, interpret=True)[0]
        self.assertEqual((dq16.dtype, dq32.dtype, dk_h.shape[2]),
                         (q.dtype, jnp.float32, args[2].shape[2]))
        self.assertEqual(jnp.max(jnp.abs(dq16.astype(jnp.float32)
                                         - dq32.astype(q.dtype).astype(jnp.float32))), 0.0)
        dg = None
        if want[3] is not None:
            batch, heads, padded = dgt.shape
            chunks = dgt.reshape(batch, heads, padded // C, C)
            chunks = chunks.at[..., -1].add(jnp.sum(bnd.reshape(chunks.shape), axis=-1))
            chunks = jnp.flip(jnp.cumsum(jnp.flip(chunks, -1), axis=-1), -1)
            dg = jnp.moveaxis(chunks.reshape(batch, heads, padded), 1, 2)[:, :seq_len]
        _check(self, (dq32, kbwd._group_sum(dk_h, kv_heads), dw, dg), want)
        err = tolerances.rel_err(dq16.astype(jnp.float32), want[0])
        self.assertLess(err, 5e-3, msg=f"bf16 dq: relative RMS error {err:.2e}")

    @parameterized.named_parameters(
        *(c for c in _CPU_CASES if c[0].startswith("gva")),
        ("gva4_h0_dht_packed_partial_T150_K64_V64", 1, 150, 4, 1, 64, 64, 0.05, True, True,
         (64, 36, 30)))
    def test_gva_loop_on_and_off(self, *case):
        """``gva_loop`` (MOSAIC_GPU.md Sec. 27.5) forced on and off: ``dq`` ``[B, T, Hk, K]``
        against the reference either way (fp32); with ``dq_dtype=bf16`` the two equal each
        other bit for bit at ``G = 2`` (one fp32 add of two terms, in either order) and within
        one bf16 ulp at ``G = 4``; ``dk``, ``dw``, ``dgt``, ``bnd`` (per value head) equal."""
        args, seg, scale, want = _case(*case)
        q, kv_heads = args[0], args[1].shape[2]
        group = args[2].shape[2] // kv_heads
        kw = dict(scale=scale, segment_ids=seg, interpret=True)
        outs = {}
        for loop in (True, False):
            for dt in (jnp.float32, q.dtype):
                outs[loop, dt] = kbwd.chunk_delta_grads_partials_mosaic(
                    *args, dq_dtype=dt, gva_loop=loop, **kw)
            dq32 = outs[loop, jnp.float32][0]
            self.assertEqual((dq32.shape, dq32.dtype), (want[0].shape, jnp.float32))
            err = tolerances.rel_err(dq32, want[0])
            self.assertLess(err, 5e-3, msg=f"dq (gva_loop={loop}): relative RMS error {err:.2e}")
        on, off = outs[True, q.dtype], outs[False, q.dtype]
        self.assertEqual((on[0].dtype, off[0].dtype), (q.dtype, q.dtype))
        diff = jnp.abs(on[0].astype(jnp.float32) - off[0].astype(jnp.float32))
        if group > 2:
            ulp = jnp.abs(off[0].astype(jnp.float32)) * 2.0 ** -7 + 1e-30
            self.assertLessEqual(float(jnp.max(diff / ulp)), 1.0)
        else:
            self.assertEqual(float(jnp.max(diff)), 0.0)
        for name, x, y in zip(("dk", "dw", "dgt", "bnd"), on[1:], off[1:]):
            self.assertEqual(float(jnp.max(jnp.abs(x - y))), 0.0, msg=name)

    @parameterized.named_parameters(*_CPU_CASES)
    def test_chunk_dv_local_matches_reference(self, *case):
        (q, k, do, g), seg, scale, want = _dv_local_case(*case)
        got = kbwd.chunk_dv_local_mosaic(q, k, do, g, scale=scale, segment_ids=seg,
                                         interpret=True)
        self.assertEqual((got.shape, got.dtype), (do.shape, do.dtype))
        err = tolerances.rel_err(got, want)
        self.assertLess(err, 5e-3, msg=f"dv_local: relative RMS error {err:.2e}")

    def test_chunk_dv_local_adds_the_residual_grad(self):
        # The routing residual's cotangent du joins dv_local in fp32 before the one rounding.
        (q, k, do, g), seg, scale, want = _dv_local_case(1, 150, 2, 1, 64, 128, 0.05, False,
                                                         False, (64, 36, 30))
        du = jnp.asarray(np.random.default_rng(8).standard_normal(do.shape), do.dtype)
        got = kbwd.chunk_dv_local_mosaic(q, k, do, g, scale=scale, segment_ids=seg,
                                         residual_grad=du, interpret=True)
        err = tolerances.rel_err(got, want + du.astype(jnp.float32))
        self.assertLess(err, 5e-3, msg=f"dv_local + du: relative RMS error {err:.2e}")


def _pipeline_grads(q, k, v, g, beta, state, seg, do, dht, scale, interpret):
    """All gradients of the Mosaic GPU pipeline, with the WY backward done by ``jax.vjp`` of
    :func:`pallas_kernels.gated_delta_rule.chunked.wy_representation` in XLA (fp32).

    The kernels: the forward state pass, then ``dv_local``, the reverse state pass and the
    chunk-local gradients. Returns fp32 ``(dq, dk, dv, dg, dbeta, dh0)`` (``dg`` ``None`` for
    DeltaNet); ``dq, dk`` per key head.
    """
    heads, seq_len = v.shape[2], v.shape[1]
    w, u = gdn_test._wy(k, v, g, beta, seg)
    h, v_new, _ = kgd.chunk_delta_h_mosaic(k, w, u, g, initial_state=state, segment_ids=seg,
                                           states_dtype=q.dtype, interpret=interpret)
    dvl = kbwd.chunk_dv_local_mosaic(q, k, do, g, scale=scale, segment_ids=seg,
                                     interpret=interpret)
    dh, dvn, dh0 = kgd.chunk_delta_dh_mosaic(q, k, w, do, dvl, g, scale=scale,
                                             final_state_grad=dht, segment_ids=seg,
                                             states_dtype=q.dtype, interpret=interpret)
    dq, dk, dw, dg = kbwd.chunk_delta_grads_mosaic(q, k, v_new, do, dvn, g, h, dh,
                                                   scale=scale, segment_ids=seg,
                                                   interpret=interpret)

    def wy(kf, vf, gf, bf):  # the WY factors, w.r.t. which dw and dU = dv_new are taken
        return chunked.wy_representation(kf, vf, None if g is None else gf, bf,
                                         segment_ids=seg)

    gf = jnp.zeros(beta.shape) if g is None else g
    (w_p, _), vjp = jax.vjp(wy, gdn_test._expand(k, heads), v.astype(jnp.float32), gf, beta)
    pad = ((0, 0), (0, w_p.shape[1] - seq_len), (0, 0), (0, 0))
    dk_wy, dv, dg_wy, dbeta = vjp((jnp.pad(dw, pad), jnp.pad(dvn.astype(jnp.float32), pad)))
    dk = dk + kbwd._group_sum(dk_wy, k.shape[2])
    dg = None if g is None else dg + dg_wy
    return dq, dk, dv, dg, dbeta, dh0


def _chunked_grads(q, k, v, g, beta, state, seg, do, dht, scale):
    """``(dq, dk, dv, dg, dbeta, dh0)`` by ``jax.vjp`` of the XLA chunk form
    ``chunked.gated_delta_rule_chunked`` (fp32), ``dq, dk`` summed over GVA groups."""
    heads = v.shape[2]

    def fn(qf, kf, vf, gf, bf, h0):
        o, final, _ = chunked.gated_delta_rule_chunked(
            qf, kf, vf, None if g is None else gf, bf, scale=scale, initial_state=h0,
            segment_ids=seg)
        return o, final

    h0 = jnp.zeros(v.shape[:1] + (heads, k.shape[3], v.shape[3])) if state is None else state
    gf = jnp.zeros(beta.shape) if g is None else g
    _, vjp = jax.vjp(fn, gdn_test._expand(q, heads), gdn_test._expand(k, heads),
                     v.astype(jnp.float32), gf, beta, h0)
    dq, dk, dv, dg, dbeta, dh0 = vjp((do.astype(jnp.float32),
                                      jnp.zeros_like(h0) if dht is None else dht))
    dq, dk = (kbwd._group_sum(x, q.shape[2]) for x in (dq, dk))
    return dq, dk, dv, None if g is None else dg, dbeta, dh0


_GRAD_NAMES = ("dq", "dk", "dv", "dg", "dbeta", "dh0")


def _check_pipeline(test, got, want):
    for name, x, y in zip(_GRAD_NAMES, got, want):
        if y is None:
            continue
        err = tolerances.rel_err(x, y)
        test.assertLess(err, 1e-2 if name in ("dg", "dbeta") else 5e-3,
                        msg=f"{name}: relative RMS error {err:.2e}")


def _pipeline_inputs(batch, seq_len, heads, kv_heads, dk, dv, decay, h0, dht, docs, seed=0):
    """``(q, k, v, g, beta, h0, segment_ids, do, dht, scale)`` for the pipeline tests."""
    q, k, v, g, beta, state, seg = gdn_test._inputs(batch, seq_len, heads, kv_heads, dk, dv,
                                                    decay=decay, h0=h0, docs=docs, seed=seed)
    do, state_grad = _cotangents(seed + 3, v.shape, (batch, heads, dk, dv), dht)
    return q, k, v, g, beta, state, seg, do, state_grad, dk ** -0.5


@pytest.mark.slow
class PipelineInterpretTest(parameterized.TestCase):
    """The four backward-side kernels composed (with the forward state pass) and an XLA WY
    backward give every gradient of the chunk form: checks the contracts between the kernels
    (``h`` entering, ``dh`` leaving each chunk, total ``dv_new``, what ``dw``, ``dk`` and
    ``dg`` leave to the WY backward), not only each kernel alone."""

    @parameterized.named_parameters(
        ("gva_h0_dht_packed_partial_T150_K64_V64", 1, 150, 2, 1, 64, 64, 0.05, True, True,
         (64, 36, 30)),
        ("deltanet_dht_T128_K64_V64", 1, 128, 1, 1, 64, 64, None, False, True, None),
        ("strong_decay_h0_dht_packed_T128_K64_V128", 1, 128, 2, 2, 64, 128, 5.0, True, True,
         (10, 60)),
        ("gva_h0_dht_packed_T192_K128_V128", 1, 192, 2, 1, 128, 128, 0.1, True, True,
         (70, 30)),
    )
    def test_grads_match_chunked_vjp(self, *case):
        args = _pipeline_inputs(*case)
        _check_pipeline(self, _pipeline_grads(*args, True), _chunked_grads(*args))


@pytest.mark.gpu
class GpuTest(kmg_test.HopperTestCase):
    """The compiled kernel (wgmma, TMA) on bf16 inputs against the fp32 autodiff reference."""

    @parameterized.named_parameters(
        ("gva_h0_dht_packed_T2048_K128_V128", 1, 2048, 4, 2, 128, 128, 0.05, True, True,
         (700, 1, 64, 999)),
        ("strong_decay_dht_partial_T1000_K64_V128", 2, 1000, 2, 1, 64, 128, 5.0, False, True,
         None),
        ("packed_T1500_K128_V64", 1, 1500, 2, 2, 128, 64, 0.2, True, False, (10, 54, 500)),
        ("deltanet_dht_packed_T1024_K64_V64", 1, 1024, 2, 2, 64, 64, None, True, True,
         (300, 200)),
    )
    def test_chunk_delta_grads_matches_autodiff(self, *case):
        args, seg, scale, want = _case(*case, seed=5)
        got = kbwd.chunk_delta_grads_mosaic(*args, scale=scale, segment_ids=seg)
        _check(self, got, want)

    @parameterized.named_parameters(
        ("gva_packed_T2048_K128_V128", 1, 2048, 4, 2, 128, 128, 0.05, False, False,
         (700, 1, 64, 999)),
        ("strong_decay_partial_T1000_K64_V128", 2, 1000, 2, 1, 64, 128, 5.0, False, False, None),
        ("deltanet_T1024_K128_V64", 1, 1024, 2, 2, 128, 64, None, False, False, None),
    )
    def test_chunk_dv_local_matches_reference(self, *case):
        (q, k, do, g), seg, scale, want = _dv_local_case(*case, seed=5)
        got = kbwd.chunk_dv_local_mosaic(q, k, do, g, scale=scale, segment_ids=seg)
        err = tolerances.rel_err(got, want)
        self.assertLess(err, 5e-3, msg=f"dv_local: relative RMS error {err:.2e}")

    @parameterized.named_parameters(
        ("gva_h0_dht_packed_T2048_K128_V128", 1, 2048, 4, 2, 128, 128, 0.05, True, True,
         (700, 1, 64, 999)),
        ("deltanet_partial_T1000_K64_V64", 2, 1000, 2, 2, 64, 64, None, False, True, None),
    )
    def test_pipeline_grads_match_chunked_vjp(self, *case):
        args = _pipeline_inputs(*case, seed=7)
        _check_pipeline(self, _pipeline_grads(*args, False), _chunked_grads(*args))


def _check_chunk_delta_grads_exports(test, dk, dv, gated):
    args, seg, scale, _ = _case(1, 200, 2, 1, dk, dv, 0.2 if gated else None, True, True,
                                (70, 30))

    def fn(*a):
        return kbwd.chunk_delta_grads_mosaic(*a[:-1], scale=scale, segment_ids=a[-1])

    exported = jax.export.export(jax.jit(fn), platforms=["cuda"])(*args, seg)
    text = exported.mlir_module()
    test.assertEqual(text.count("custom_call @mosaic_gpu"), 1)
    test.assertIn("gdn_chunk_grads", text)


def _check_chunk_dv_local_exports(test, dk, dv, gated):
    (q, k, do, g), seg, scale, _ = _dv_local_case(1, 200, 2, 1, dk, dv, 0.2 if gated else None,
                                                  False, False, (70, 30))

    def fn(q, k, do, g, seg):
        return kbwd.chunk_dv_local_mosaic(q, k, do, g, scale=scale, segment_ids=seg)

    text = jax.export.export(jax.jit(fn), platforms=["cuda"])(q, k, do, g, seg).mlir_module()
    test.assertEqual(text.count("custom_call @mosaic_gpu"), 1)
    test.assertIn("gdn_chunk_dv_local", text)


# Export variants: CI keeps two per kernel (K = V = 64 without gates, K = V = 128 gated);
# LoweringSlowTest runs the other six.
_EXPORT_CI, _EXPORT_SLOW = kmg_test.split_variants(
    [dict(dk=64, dv=64, gated=False), dict(dk=128, dv=128, gated=True)],
    dk=(64, 128), dv=(64, 128), gated=(True, False))


class LoweringTest(parameterized.TestCase):

    @parameterized.named_parameters(*_EXPORT_CI)
    def test_chunk_delta_grads_exports_for_cuda(self, **variant):
        _check_chunk_delta_grads_exports(self, **variant)

    @parameterized.named_parameters(*_EXPORT_CI)
    def test_chunk_dv_local_exports_for_cuda(self, **variant):
        _check_chunk_dv_local_exports(self, **variant)


# Slow (out of CI): the other K, V and gate combinations of LoweringTest (0.2 to 3 s each, 11 s
# for the 12). The mark is on the class: absl's parameterized copies of a method do not keep a
# method-level mark.
@pytest.mark.slow
class LoweringSlowTest(parameterized.TestCase):

    @parameterized.named_parameters(*_EXPORT_SLOW)
    def test_chunk_delta_grads_exports_for_cuda(self, **variant):
        _check_chunk_delta_grads_exports(self, **variant)

    @parameterized.named_parameters(*_EXPORT_SLOW)
    def test_chunk_dv_local_exports_for_cuda(self, **variant):
        _check_chunk_dv_local_exports(self, **variant)


class ValidationTest(absltest.TestCase):

    def test_rejects_what_the_kernel_cannot_run(self):
        args, _, _, _ = _case(1, 64, 2, 1, 64, 64, 0.1, False, False, None)
        q, k, vn, do, dvn, g, h, dh = args
        with self.assertRaisesRegex(ValueError, "q and k must match"):
            kbwd.chunk_delta_grads_mosaic(q[..., :32], k, vn, do, dvn, g, h, dh, scale=1.0)
        with self.assertRaisesRegex(ValueError, "dv_new must have"):
            kbwd.chunk_delta_grads_mosaic(q, k, vn, do, dvn.astype(jnp.float32), g, h, dh,
                                          scale=1.0)
        with self.assertRaisesRegex(ValueError, "dh must be"):
            kbwd.chunk_delta_grads_mosaic(q, k, vn, do, dvn, g, h, dh[:, :1], scale=1.0)
        with self.assertRaisesRegex(ValueError, "g must be"):
            kbwd.chunk_delta_grads_mosaic(q, k, vn, do, dvn, g[:, :, :1], h, dh, scale=1.0)
        with self.assertRaisesRegex(ValueError, "head dims"):
            kbwd.chunk_delta_grads_mosaic(q, k, vn[..., :32], do[..., :32], dvn[..., :32], g,
                                          h[..., :32], dh[..., :32], scale=1.0)

    def test_dv_local_rejects_what_the_kernel_cannot_run(self):
        (q, k, do, g), _, _, _ = _dv_local_case(1, 64, 2, 1, 64, 64, 0.1, False, False, None)
        with self.assertRaisesRegex(ValueError, "q and k must match"):
            kbwd.chunk_dv_local_mosaic(q, k[:, :32], do, g, scale=1.0)
        with self.assertRaisesRegex(ValueError, "16-bit dtype"):
            kbwd.chunk_dv_local_mosaic(q, k, do.astype(jnp.float32), g, scale=1.0)
        with self.assertRaisesRegex(ValueError, "head dims"):
            kbwd.chunk_dv_local_mosaic(q, k, do[..., :32], g, scale=1.0)
        with self.assertRaisesRegex(ValueError, "residual_grad must have do's shape"):
            kbwd.chunk_dv_local_mosaic(q, k, do, g, scale=1.0,
                                       residual_grad=do.astype(jnp.float32))


if __name__ == "__main__":
    absltest.main()
