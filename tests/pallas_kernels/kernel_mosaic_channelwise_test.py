"""The per-channel family's state passes on Mosaic GPU (KDA, GDN-2; issue 29).

``pallas_kernels/common/channelwise_mosaic_gpu.py`` has :func:`channelwise_forward_mosaic` and
:func:`channelwise_backward_state_mosaic`, drop-ins for the Triton ``forward`` and
``backward_state`` kernels of ``channelwise_gpu`` (both switched by ``state_pass="mosaic"``).
Their inputs here are realistic: ``Qg, Kg, W, U, Mq, e_all`` come from ``channelwise_gpu``'s
own ``intra``, ``prepare`` and ``wu`` kernels (Pallas interpret mode) on random ``q, k`` (unit
rows), ``v``, per-channel log-decays ``g <= 0`` and scales, with documents starting inside
chunks and a partial last chunk; the reverse pass takes random ``dO``, ``dvn_in`` and ``dht``.

* ``LoweringTest`` (CI): each kernel exports for CUDA on the CPU host (``jax.export``) at
  K = V = 128 bf16 (the forward with the ``hs`` and ``Vn`` stores and ``h0``, the reverse with
  and without ``dvn_in``; which also checks Mosaic GPU's 227 KB SMEM limit: the counts are
  pinned, with and without ``alias_staging``), K = V = 64 fp16, K 128 / V 64; and the whole
  KDA forward + backward with ``state_pass="mosaic"`` exports with both Mosaic kernels in place
  of the Triton ``forward`` and ``backward_state`` kernels.
* ``ProtocolTest`` (CI): each kernel's barrier protocol (three warpgroups) on a model of
  mbarriers under random schedules (no deadlock, no lapped phase, no buffer overwritten while
  read).
* ``ValidationTest`` (CI): the ValueErrors (fp32 inputs, head dims, shapes, ``state_pass``),
  and fp32 inputs of the op taking the Triton state pass under ``state_pass="mosaic"``.
* ``InterpretTest`` (``slow``): each kernel in Mosaic GPU interpret mode against an
  independent float64 NumPy recurrence of its equations (relative RMS, by dtype) and against
  the Triton ``_forward`` / ``_backward_state`` in Pallas interpret mode on the same inputs;
  the forward's optional stores change nothing else; an unpadded ``T`` is padded inside.
  ``OpInterpretTest`` (``slow``): the whole KDA and GDN-2 ops with ``state_pass="mosaic"``
  (both Mosaic kernels) against ``"triton"`` (outputs and all gradients), both interpreted.
* ``GpuTest`` (``gpu``): on a Hopper GPU, KDA and GDN-2 with the switch on and off against the
  fp32 token-serial reference (o, final state, every gradient) and against each other, and
  each kernel against float64 and the compiled Triton kernel at S1-like rows. Their few rows
  make the Mosaic passes run as sequence pieces (MOSAIC_GPU.md Sec. 30), so the gates against
  Triton are the float64 ones there (:func:`_triton_gate`).

The interpreted three-warpgroup kernels need a larger XLA CPU pool on a 2-core host (BUILD.md,
MOSAIC_GPU.md Sec. 10): ``PJRT_NPROC=8 timeout 900 python -m pytest -q -m slow
tests/pallas_kernels/kernel_mosaic_channelwise_test.py``.
"""

import collections
import re
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest, parameterized

from pallas_kernels.common import channelwise_gpu, mosaic_gpu, pallas_gpu
from pallas_kernels.common import channelwise_mosaic_gpu as cwm
from pallas_kernels.common import mosaic_gpu_lib as mgl
from pallas_kernels.kda import kernel_gpu as kda_kernel
from tests import tolerances
from tests.pallas_kernels import kernel_gpu_channelwise_test as cw_test
from tests.pallas_kernels import kernel_mosaic_gpu_test as kmg_test

C = cwm.CHUNK
_BF16, _FP16 = jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)
# Relative RMS gates against the float64 recurrence (the kernel rounds S and Vn to the operand
# dtype as wgmma operands, as the Triton kernel): the GPU kernels' forward gate for bf16
# (BUILD.md); fp16 carries three more mantissa bits.
_REF_GATE = {_BF16: 5e-3, _FP16: 1e-3}
# Against the Triton kernel on the same inputs: the same roundings, different fp32 summation
# orders, so o, Vn and hs differ by an occasional operand-dtype ulp after the rounding.
_TRITON_GATE = {_BF16: 2e-3, _FP16: 3e-4}
_SMEM_LIMIT = 227 * 1024


def _triton_gate(dtype, batch, heads, dv, seq_len):
    """The gate against the Triton kernel: :data:`_TRITON_GATE` when the Mosaic pass runs as one
    launch; with sequence pieces (the automatic choice, ``mosaic_gpu_lib.num_pieces``, P > 1 at
    the ``gpu`` cases' few rows; MOSAIC_GPU.md Sec. 30) the maps and entry states are rounded to
    the operand dtype where one pass rounds the carried state, so the two differ by that
    rounding (up to 3.2e-3 bf16, 3.5e-4 fp16 against P = 1 on CPU): :data:`_REF_GATE`."""
    pieces = mgl.num_pieces(None, batch * heads * (dv // cwm.BLOCK_V), -(-seq_len // C))
    return _TRITON_GATE[dtype] if pieces == 1 else _REF_GATE[dtype]


def _segment_ids(batch, seq_len, docs):
    """``[B, T]`` ids: row 0 packed with documents of ``docs`` tokens (the rest one more),
    the other rows one document each; ``None`` without ``docs``."""
    if docs is None:
        return None
    lengths = list(docs) + [seq_len - sum(docs)]
    row = np.repeat(np.arange(len(lengths)), lengths)
    ids = np.zeros((batch, seq_len), np.int32)
    ids[0] = row
    return jnp.asarray(ids)


def _prepared(seed, batch, seq_len, heads, dk, dv, dtype, *, docs=None, decay=1.0, h0=True,
              gdn2=False, interpret=True):
    """``(cfg, prep, h0)`` for the state pass: ``channelwise_gpu``'s ``intra``, ``prepare`` and
    ``wu`` kernels (Pallas interpret mode if ``interpret``) on random inputs (KDA's per-head
    ``beta`` or GDN-2's per-channel ``b, w`` as the scales), time padded to whole chunks."""
    keys = jax.random.split(jax.random.key(seed), 8)

    def unit(x):
        return x / jnp.linalg.norm(x, axis=-1, keepdims=True)

    shape_k, shape_v = (batch, seq_len, heads, dk), (batch, seq_len, heads, dv)
    q = unit(jax.random.normal(keys[0], shape_k)).astype(dtype)
    k = unit(jax.random.normal(keys[1], shape_k)).astype(dtype)
    v = jax.random.normal(keys[2], shape_v).astype(dtype)
    g = decay * jax.nn.log_sigmoid(jax.random.normal(keys[3], shape_k) + 1.5)
    if gdn2:
        ks = jax.nn.sigmoid(jax.random.normal(keys[4], shape_k))
        vs = jax.nn.sigmoid(jax.random.normal(keys[5], shape_v))
    else:
        ks = vs = jax.nn.sigmoid(jax.random.normal(keys[4], (batch, seq_len, heads, 1)))
    state = 0.5 * jax.random.normal(keys[6], (batch, heads, dk, dv)) if h0 else None
    n_chunks = -(-seq_len // C)
    padded = n_chunks * C

    def pad(x):
        return jnp.pad(x, ((0, 0), (0, padded - seq_len)) + ((0, 0),) * (x.ndim - 2))

    q, k, v, ks, vs, g = (pad(x) for x in (q, k, v, ks, vs, g))
    gam = jnp.cumsum(g.reshape(batch, n_chunks, C, heads, dk), axis=2).reshape(g.shape)
    seg = _segment_ids(batch, seq_len, docs)
    doc_arrays = () if seg is None else pallas_gpu.docs_from_segment_ids(seg, padded)
    cfg = channelwise_gpu._config(batch=batch, heads=heads, n_chunks=n_chunks, dk=dk, dv=dv,
                                  scale=dk ** -0.5, has_docs=seg is not None, mm_dtype=dtype,
                                  interpret=interpret, return_residual=True)
    prep = jax.jit(lambda *xs: channelwise_gpu._prepare(cfg, *xs, doc_arrays, save_a=False))(
        q, k, v, ks, vs, gam)
    return cfg, prep, state


def _kernel_args(prep):
    return tuple(prep[n] for n in ("qg_ref", "kg_ref", "w_ref", "u_ref", "mq_ref", "e_ref"))


def _reference(prep, h0, scale):
    """float64 NumPy recurrence of the module docstring's equations on ``prep``'s arrays:
    ``(o, final_state, Vn, hs)``, no rounding anywhere."""
    qg, kg, w, u, mq, e = (np.asarray(x, np.float64) for x in _kernel_args(prep))
    batch, tp, heads, dk = qg.shape
    dv, n_chunks = u.shape[-1], tp // C
    o, vn = np.zeros_like(u), np.zeros_like(u)
    hs = np.zeros((batch, heads, n_chunks, dk, dv))
    ht = np.zeros((batch, heads, dk, dv))
    for b in range(batch):
        for h in range(heads):
            s = np.zeros((dk, dv)) if h0 is None else np.asarray(h0[b, h], np.float64)
            for n in range(n_chunks):
                r = slice(n * C, (n + 1) * C)
                hs[b, h, n] = s
                vn_n = u[b, r, h] - w[b, r, h] @ s
                o[b, r, h] = scale * (qg[b, r, h] @ s + mq[b, h, n] @ vn_n)
                vn[b, r, h] = vn_n
                s = e[b, h, n][:, None] * s + kg[b, r, h].T @ vn_n
            ht[b, h] = s
    return o, ht, vn, hs


def _run_mosaic(cfg, prep, h0, *, interpret, stores=True):
    return cwm.channelwise_forward_mosaic(*_kernel_args(prep), scale=cfg["scale"],
                                          initial_state=h0, store_v_new=stores, store_h=stores,
                                          interpret=interpret)


def _run_triton(cfg, prep, h0):
    zeros = jnp.zeros(prep["qg_ref"].shape[:1] + (prep["qg_ref"].shape[2],)
                      + (cfg["dk"], cfg["dv"]), jnp.float32)
    return jax.jit(lambda p, s: channelwise_gpu._forward(cfg, p, s, save=True))(
        prep, zeros if h0 is None else h0)


_NAMES = ("o", "final_state", "vn", "hs")


def _check_kernel(test, case, *, interpret=True, triton=True):
    seed, batch, seq_len, heads, dk, dv, dtype, docs, decay, h0, gdn2 = case
    dtype = jnp.dtype(dtype)
    cfg, prep, state = _prepared(seed, batch, seq_len, heads, dk, dv, dtype, docs=docs,
                                 decay=decay, h0=h0, gdn2=gdn2, interpret=interpret)
    got = _run_mosaic(cfg, prep, state, interpret=interpret)
    for name, x, want_dtype in zip(_NAMES, got, (dtype, jnp.float32, dtype, dtype)):
        test.assertEqual(x.dtype, want_dtype, name)
    want = _reference(prep, state, cfg["scale"])
    for name, a, e in zip(_NAMES, got, want):
        test.assertEqual(a.shape, e.shape, name)
        test.assertLess(tolerances.rel_err(a, e), _REF_GATE[dtype], f"{name} vs float64")
    if triton:
        tri = _run_triton(cfg, prep, state)
        gate = _triton_gate(dtype, batch, heads, dv, seq_len)
        for name, a, e in zip(_NAMES, got, tri):
            test.assertEqual((a.shape, a.dtype), (e.shape, e.dtype), name)
            test.assertLess(tolerances.rel_err(a, e), gate, f"{name} vs Triton")


def _cotangents(seed, prep, dv, dtype, *, dvn_in=True):
    """Random ``(dO, dvn_in or None, dht)`` for the reverse pass on ``prep``'s shapes."""
    batch, tp, heads, dk = prep["qg_ref"].shape
    keys = jax.random.split(jax.random.key(100 + seed), 3)
    do = jax.random.normal(keys[0], (batch, tp, heads, dv)).astype(dtype)
    din = (0.3 * jax.random.normal(keys[1], (batch, tp, heads, dv))).astype(dtype)
    dht = jax.random.normal(keys[2], (batch, heads, dk, dv))
    return do, din if dvn_in else None, dht


def _bwd_reference(prep, do, dvn_in, dht, scale):
    """float64 NumPy reverse recurrence of ``channelwise_backward_state_mosaic``'s equations
    on ``prep``'s arrays: ``(dvn, dhs, dh0)``, no rounding anywhere."""
    qg, kg, w, mq, e = (np.asarray(prep[n], np.float64)
                        for n in ("qg_ref", "kg_ref", "w_ref", "mq_ref", "e_ref"))
    do = np.asarray(do, np.float64)
    din = None if dvn_in is None else np.asarray(dvn_in, np.float64)
    batch, tp, heads, dk = qg.shape
    dv, n_chunks = do.shape[-1], tp // C
    dvn = np.zeros_like(do)
    dhs = np.zeros((batch, heads, n_chunks, dk, dv))
    dh0 = np.zeros((batch, heads, dk, dv))
    for b in range(batch):
        for h in range(heads):
            ds = np.asarray(dht[b, h], np.float64)
            for n in reversed(range(n_chunks)):
                r = slice(n * C, (n + 1) * C)
                dhs[b, h, n] = ds
                d = scale * mq[b, h, n].T @ do[b, r, h] + kg[b, r, h] @ ds
                if din is not None:
                    d = d + din[b, r, h]
                dvn[b, r, h] = d
                ds = (e[b, h, n][:, None] * ds + scale * qg[b, r, h].T @ do[b, r, h]
                      - w[b, r, h].T @ d)
            dh0[b, h] = ds
    return dvn, dhs, dh0


def _bwd_args(prep):
    return tuple(prep[n] for n in ("qg_ref", "kg_ref", "w_ref", "mq_ref", "e_ref"))


_BWD_NAMES = ("dvn", "dhs", "dh0")


def _check_backward(test, case, *, interpret=True, triton=True):
    seed, batch, seq_len, heads, dk, dv, dtype, docs, decay, h0, gdn2 = case
    dtype = jnp.dtype(dtype)
    cfg, prep, _ = _prepared(seed, batch, seq_len, heads, dk, dv, dtype, docs=docs,
                             decay=decay, h0=h0, gdn2=gdn2, interpret=interpret)
    do, din, dht = _cotangents(seed, prep, dv, dtype, dvn_in=h0)
    got = cwm.channelwise_backward_state_mosaic(*_bwd_args(prep), do, scale=cfg["scale"],
                                                dvn_in=din, dht=dht, interpret=interpret)
    want = _bwd_reference(prep, do, din, dht, cfg["scale"])
    for name, a, e, want_dtype in zip(_BWD_NAMES, got, want, (dtype, dtype, jnp.float32)):
        test.assertEqual((a.shape, a.dtype), (e.shape, want_dtype), name)
        test.assertLess(tolerances.rel_err(a, e), _REF_GATE[dtype], f"{name} vs float64")
    if triton:
        tri = jax.jit(lambda p, *c: channelwise_gpu._backward_state(cfg, p, *c))(
            prep, do, din, dht)
        gate = _triton_gate(dtype, batch, heads, dv, seq_len)
        for name, a, e in zip(_BWD_NAMES, got, tri):
            test.assertEqual((a.shape, a.dtype), (e.shape, e.dtype), name)
            test.assertLess(tolerances.rel_err(a, e), gate, f"{name} vs Triton")


# seed, B, T, H, K, V, dtype, document lengths (row 0; the rest one more), decay, h0, GDN-2
_CASES = (
    ("kda_bf16_packed_partial_T200_K128_V128", 0, 2, 200, 2, 128, 128, jnp.bfloat16,
     (10, 54, 1, 70), 1.0, True, False),
    ("gdn2_bf16_packed_T192_K64_V128", 1, 1, 192, 2, 64, 128, jnp.bfloat16, (30, 3, 100), 1.0,
     True, True),
    ("kda_fp16_strong_decay_partial_T150_K128_V64", 2, 1, 150, 2, 128, 64, jnp.float16,
     (64, 20), 10.0, False, False),
    ("gdn2_fp16_h0_T128_K64_V64", 3, 2, 128, 1, 64, 64, jnp.float16, None, 0.5, True, True),
)


# Class-level mark: absl's parameterized copies of a method do not keep a method-level mark.
@pytest.mark.slow
class InterpretTest(parameterized.TestCase):
    """Mosaic GPU interpret mode against float64 and the Triton kernel (interpreted)."""

    @parameterized.named_parameters(*_CASES)
    def test_kernel_matches_reference_and_triton(self, *case):
        _check_kernel(self, case)

    @parameterized.named_parameters(*_CASES)
    def test_backward_matches_reference_and_triton(self, *case):
        # The reverse pass (dvn_in given where the case has h0) on the same inputs.
        _check_backward(self, case)

    def test_stores_change_nothing_else(self):
        cfg, prep, state = _prepared(5, 1, 130, 2, 64, 64, jnp.bfloat16, docs=(40,))
        full = _run_mosaic(cfg, prep, state, interpret=True)
        bare = _run_mosaic(cfg, prep, state, interpret=True, stores=False)
        self.assertIsNone(bare[2])
        self.assertIsNone(bare[3])
        for name, a, e in zip(_NAMES[:2], bare[:2], full[:2]):
            np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(e, np.float32),
                                          err_msg=name)

    def test_unpadded_length_pads_inside(self):
        # T = 100 given directly (the op passes whole chunks): the kernel pads the token arrays
        # with zeros, which add nothing, and returns the first T rows.
        cfg, prep, state = _prepared(6, 1, 100, 2, 64, 64, jnp.float16, docs=(70,))
        full = _run_mosaic(cfg, prep, state, interpret=True)
        cut = dict(prep, **{n: prep[n][:, :100] for n in ("qg_ref", "kg_ref", "w_ref", "u_ref")})
        part = _run_mosaic(cfg, cut, state, interpret=True)
        for name, a, e in zip(_NAMES, part, (full[0][:, :100], full[1], full[2][:, :100],
                                             full[3])):
            np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(e, np.float32),
                                          err_msg=name)

    def test_backward_unpadded_length_pads_inside(self):
        cfg, prep, _ = _prepared(6, 1, 100, 2, 64, 64, jnp.float16, docs=(70,))
        do, din, dht = _cotangents(6, prep, 64, jnp.float16)
        do, din = (jnp.where(jnp.arange(128)[None, :, None, None] < 100, x, 0) for x in (do, din))
        args = _bwd_args(prep)
        full = cwm.channelwise_backward_state_mosaic(*args, do, scale=cfg["scale"], dvn_in=din,
                                                     dht=dht, interpret=True)
        cut = [x[:, :100] for x in args[:3]] + list(args[3:]) + [do[:, :100]]
        part = cwm.channelwise_backward_state_mosaic(*cut, scale=cfg["scale"],
                                                     dvn_in=din[:, :100], dht=dht,
                                                     interpret=True)
        for name, a, e in zip(_BWD_NAMES, part, (full[0][:, :100], full[1], full[2])):
            np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(e, np.float32),
                                          err_msg=name)


def hopper():
    """Patches the GPU's compute capability to 9.0: a Mosaic ``state_pass`` / ``grad_pass``
    lowered for CUDA on this CPU host runs the Mosaic kernels only on a GPU that has them
    (``mosaic_gpu.resolve_pass``; elsewhere the Triton ones)."""
    return mock.patch.object(mosaic_gpu, "compute_capability", return_value=(9, 0))


def kda_fwd_bwd_cuda_text(tuning, seq_len=128, lengths=(50, 78)):
    """The MLIR text of KDA's forward and backward (``jax.vjp`` of ``kda_pallas``, B 1, H 2,
    K = V = 64, bf16, documents of ``lengths`` tokens) exported for CUDA on a mocked Hopper
    GPU with the channelwise ``TUNING`` overrides ``tuning``."""
    inputs, _ = cw_test._inputs(0, 1, seq_len, 2, 2, 64, dtype=jnp.bfloat16)
    seg = jnp.asarray(np.repeat(np.arange(len(lengths)), lengths)[None], jnp.int32)
    args = [inputs[n] for n in ("q", "k", "v", "g", "beta")]

    def fwdbwd(*args):
        def f(*args):
            return kda_kernel.kda_pallas(*args, scale=0.125, segment_ids=seg)[0]
        o, vjp = jax.vjp(f, *args)
        return vjp(o) + (o,)

    with cw_test._tuning(tuning), hopper(), pallas_gpu.abstract_gpu_target():
        return jax.export.export(
            jax.jit(fwdbwd), platforms=["cuda"],
            disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(
                "__gpu$xla.gpu.triton")])(*args).mlir_module()


def _op_outputs_and_grads(op, inputs, segment_ids, cot_key, state_pass, impl):
    # The grad pass pinned to Triton, so that only state_pass differs between calls whatever
    # TUNING's defaults are.
    with cw_test._tuning({"state_pass": state_pass, "grad_pass": "triton"}):
        return cw_test._outputs_and_grads(op, impl, inputs, segment_ids, cot_key, False)


@pytest.mark.slow
class OpInterpretTest(parameterized.TestCase):
    """The whole op (``implementation="pallas_interpret"``) with the switch on and off."""

    @parameterized.parameters(("kda", 64), ("gdn2", 128))
    def test_mosaic_state_pass_matches_triton(self, op, dim):
        inputs, cot_key = cw_test._inputs(4, 1, 150, 2, 2, dim, dtype=jnp.bfloat16)
        seg = jnp.asarray(np.repeat(np.arange(3), [30, 70, 50])[None], jnp.int32)
        want = _op_outputs_and_grads(op, inputs, seg, cot_key, "triton", "pallas_interpret")
        got = _op_outputs_and_grads(op, inputs, seg, cot_key, "mosaic", "pallas_interpret")
        for name, a, e in zip(("o", "final_state"), got[0], want[0]):
            self.assertLess(tolerances.rel_err(a, e), _TRITON_GATE[_BF16], f"{op} {name}")
        for name in cw_test._DIFF_ARGS[op]:
            self.assertLess(tolerances.rel_err(got[1][name], want[1][name]), 4e-3,
                            f"{op} d{name}")


def export_cuda_counting_smem(fn, *args, **kwargs):
    """``jax.export`` of ``jax.jit(fn)(*args, **kwargs)`` for CUDA on this (CPU) host; returns
    ``(mlir text, the largest SMEM count Mosaic GPU checked)`` (``core._smem_tree_size``, what
    it compares with the 227 KB a block may have)."""
    from jax.experimental.mosaic.gpu import core as mgpu_core

    sizes = []
    count = mgpu_core._smem_tree_size

    def spy(buffers):
        sizes.append(count(buffers))
        return sizes[-1]

    with absltest.mock.patch.object(mgpu_core, "_smem_tree_size", spy):
        exported = jax.export.export(jax.jit(fn), platforms=["cuda"])(*args, **kwargs)
    return exported.mlir_module(), max(sizes)


def _export_kernel(dk, dv, dtype, stores, alias=False, backward=False):
    """Exports the forward kernel (``stores``: ``hs`` and ``Vn``) or the reverse one
    (``backward``; ``stores``: with ``dvn_in``) for CUDA; returns ``(mlir text, Mosaic GPU's
    SMEM count)``."""
    batch, seq_len, heads = 1, 200, 2
    n_chunks = -(-seq_len // C)
    tok = [jnp.zeros((batch, seq_len, heads, d), dtype) for d in (dk, dk, dk, dv)]
    mq = jnp.zeros((batch, heads, n_chunks, C, C), dtype)
    e_all = jnp.zeros((batch, heads, n_chunks, dk), jnp.float32)
    h0 = jnp.zeros((batch, heads, dk, dv), jnp.float32)

    def fn(qg, kg, w, u, mq, e_all):
        if backward:  # u in the place of dO (and dvn_in)
            return cwm.channelwise_backward_state_mosaic(
                qg, kg, w, mq, e_all, u, scale=0.1, dvn_in=u if stores else None, dht=h0,
                alias_staging=alias)
        return cwm.channelwise_forward_mosaic(qg, kg, w, u, mq, e_all, scale=0.1,
                                              initial_state=h0, store_v_new=stores,
                                              store_h=stores, alias_staging=alias)

    return export_cuda_counting_smem(fn, *tok, mq, e_all)


class LoweringTest(parameterized.TestCase):
    """The layout branch the interpreter replaces, lowered for CUDA on the CPU host."""

    @parameterized.named_parameters(
        ("K128_V128_bf16_stores", 128, 128, jnp.bfloat16, True),
        ("K64_V64_fp16", 64, 64, jnp.float16, False),
        ("K128_V64_bf16_stores", 128, 64, jnp.bfloat16, True),
    )
    def test_kernel_exports_for_cuda(self, dk, dv, dtype, stores):
        text, smem = _export_kernel(dk, dv, dtype, stores)
        self.assertEqual(text.count("custom_call @mosaic_gpu"), 1)
        self.assertIn(cwm.KERNEL_NAME, text)
        self.assertLessEqual(smem, _SMEM_LIMIT)

    @parameterized.named_parameters(
        ("K128_V128_bf16_dvn_in", 128, 128, jnp.bfloat16, True),
        ("K128_V128_bf16", 128, 128, jnp.bfloat16, False),
        ("K64_V64_fp16", 64, 64, jnp.float16, False),
        ("K128_V64_bf16_dvn_in", 128, 64, jnp.bfloat16, True),
    )
    def test_backward_kernel_exports_for_cuda(self, dk, dv, dtype, dvn_in):
        text, smem = _export_kernel(dk, dv, dtype, dvn_in, backward=True)
        self.assertEqual(text.count("custom_call @mosaic_gpu"), 1)
        self.assertIn(cwm.BWD_KERNEL_NAME, text)
        self.assertLessEqual(smem, _SMEM_LIMIT)

    def test_backward_smem_count_at_k128_v128_bf16(self):
        # MOSAIC_GPU.md Sec. 18.1 and the module docstring quote these counts: with dvn_in,
        # with it and alias_staging, without it.
        counts = tuple(_export_kernel(128, 128, jnp.bfloat16, din, alias=alias,
                                      backward=True)[1]
                       for din, alias in ((True, False), (True, True), (False, False)))
        self.assertEqual(counts, (230_480, 197_712, 214_096))

    def test_smem_count_at_k128_v128_bf16(self):
        # MOSAIC_GPU.md Sec. 18 and the module docstring quote these two counts.
        _, plain = _export_kernel(128, 128, jnp.bfloat16, True)
        _, aliased = _export_kernel(128, 128, jnp.bfloat16, True, alias=True)
        self.assertEqual((plain, aliased), (230_496, 197_728))

    def test_kda_fwd_bwd_exports_with_mosaic_state_pass(self):
        text = kda_fwd_bwd_cuda_text({"state_pass": "mosaic", "grad_pass": "triton"})
        # Both state passes on Mosaic GPU; every other channelwise kernel once on Triton.
        self.assertEqual(text.count("custom_call @mosaic_gpu"), 2)
        self.assertIn(cwm.KERNEL_NAME, text)
        self.assertIn(cwm.BWD_KERNEL_NAME, text)
        self.assertEqual(collections.Counter(re.findall(r'name = "channelwise_(\w+)"', text)),
                         collections.Counter(["gamma", "intra", "prepare", "wu", "grad_blocks",
                                              "backward_chunk"]))


def _protocol(num_chunks):
    """Per warpgroup (state, output, memory), the barrier waits ``W`` and arrivals ``A`` of
    :func:`channelwise_mosaic_gpu._kernel` in program order as ``(kind, name, chunk)``, with
    the SMEM accesses they guard (``X`` writes a buffer, ``R`` starts and ``E`` ends a read).
    Buffers: ``ring`` (a stage), ``sb`` (the published ``S``) and ``vn`` (the published
    ``Vn``), two of each; a stage's six TMA copies are one arrival on ``in_bar``."""
    stages = cwm.STAGES
    memory = []
    for n in range(num_chunks):
        memory += ([("W", "in_free", n - stages)] if n >= stages else []) + [
            ("X", "ring", n), ("A", "in_bar", n)]
    memory += [("W", "in_free", n) for n in range(max(num_chunks - stages, 0), num_chunks)]
    state, output = [], []
    for n in range(num_chunks):
        state += ([("W", "s_free", n - 2)] if n >= 2 else []) + [
            ("X", "sb", n), ("A", "s_ready", n), ("W", "in_bar", n), ("R", "ring", n),
            ("X", "vn", n), ("A", "v_ready", n), ("E", "ring", n), ("A", "in_free", n)]
        output += [("W", "in_bar", n), ("R", "ring", n), ("W", "s_ready", n), ("R", "sb", n),
                   ("W", "v_ready", n), ("R", "vn", n), ("E", "sb", n), ("E", "vn", n),
                   ("A", "s_free", n), ("E", "ring", n), ("A", "in_free", n)]
    state += [("W", "s_free", n) for n in range(max(num_chunks - 2, 0), num_chunks)]
    return [wg + [("A", "done", 0), ("W", "done", 0)] for wg in (state, output, memory)]


def _bwd_protocol(num_chunks):
    """As :func:`_protocol`, for :func:`channelwise_mosaic_gpu._bwd_kernel` (state, dVn and
    memory warpgroups; index ``i`` is the step, chunk ``N - 1 - i``). Buffers: ``ring``, ``sb``
    (the published ``dS``) and ``vn`` (the published ``dVn``); the state warpgroup's final
    ``dh0`` staging is modelled as writing both ``sb`` tiles (their ``RefUnion`` under
    ``alias_staging``)."""
    memory = _protocol(num_chunks)[2][:-2]
    state, dvn = [], []
    for i in range(num_chunks):
        state += [("X", "sb", i), ("A", "s_ready", i), ("W", "in_bar", i), ("R", "ring", i),
                  ("W", "v_ready", i), ("R", "vn", i), ("E", "vn", i), ("E", "ring", i),
                  ("A", "in_free", i)]
        dvn += [("W", "in_bar", i), ("R", "ring", i), ("W", "s_ready", i), ("R", "sb", i),
                ("E", "sb", i), ("E", "ring", i), ("A", "in_free", i), ("X", "vn", i),
                ("A", "v_ready", i)]
    state += [("X", "sb", num_chunks), ("X", "sb", num_chunks + 1)]  # the dh0 staging
    return [wg + [("A", "done", 0), ("W", "done", 0)] for wg in (state, dvn, memory)]


class ProtocolTest(absltest.TestCase):
    """The kernels' barrier protocols on a model of mbarriers with phase parity, under random
    schedules of their three warpgroups (1 to 7 chunks): no deadlock; no wait that finds its
    barrier a whole phase past the one it waits for (it would hang on the GPU); no arrival
    before the barrier's previous phase completed; no buffer written before every read of its
    previous use ended, nor read before it was written."""

    def check_protocol(self, protocol, slots, arrivals, readers):
        for num_chunks in range(1, 8):
            for seed in range(60):
                rng = np.random.default_rng(seed)
                programs = protocol(num_chunks)
                pcs, arrived, written, ended = [0, 0, 0], collections.Counter(), set(), \
                    collections.Counter()
                while any(pc < len(prog) for pc, prog in zip(pcs, programs)):
                    runnable = []
                    for wg, prog in enumerate(programs):
                        if pcs[wg] == len(prog):
                            continue
                        kind, name, n = prog[pcs[wg]]
                        where = f"{num_chunks} chunks, seed {seed}: {kind} {name}[{n}]"
                        phase = n // slots[name] + 1  # which completion of its slot this is
                        done = arrived[name, n % slots[name]] // arrivals.get(name, 1)
                        if kind == "W":
                            self.assertLessEqual(done, phase, f"{where}: lapped")
                        elif kind == "A":
                            self.assertEqual(done, phase - 1, f"{where}: early arrival")
                        elif kind == "X" and n >= slots[name]:
                            self.assertEqual(ended[name, n - slots[name]], readers[name],
                                             f"{where}: overwrites a buffer still read")
                        elif kind == "R":
                            self.assertIn((name, n), written, f"{where}: unwritten")
                        if kind != "W" or done == phase:
                            runnable.append(wg)
                    self.assertTrue(runnable, f"{num_chunks} chunks, seed {seed}: deadlock")
                    wg = runnable[rng.integers(len(runnable))]
                    kind, name, n = programs[wg][pcs[wg]]
                    if kind == "A":
                        arrived[name, n % slots[name]] += 1
                    elif kind == "X":
                        written.add((name, n))
                    elif kind == "E":
                        ended[name, n] += 1
                    pcs[wg] += 1

    def test_no_deadlock_lapping_or_overwrite(self):
        slots = dict(in_bar=cwm.STAGES, in_free=cwm.STAGES, ring=cwm.STAGES, s_ready=2,
                     v_ready=2, s_free=2, sb=2, vn=2, done=1)
        self.check_protocol(_protocol, slots, dict(in_free=2, done=3), dict(ring=2, sb=1, vn=1))

    def test_backward_no_deadlock_lapping_or_overwrite(self):
        slots = dict(in_bar=cwm.STAGES, in_free=cwm.STAGES, ring=cwm.STAGES, s_ready=2,
                     v_ready=2, sb=2, vn=2, done=1)
        self.check_protocol(_bwd_protocol, slots, dict(in_free=2, done=3),
                            dict(ring=2, sb=1, vn=1))


class ValidationTest(parameterized.TestCase):

    def _args(self, dk=64, dv=64, dtype=jnp.bfloat16, seq_len=100, n_chunks=2):
        tok = [jnp.zeros((1, seq_len, 2, d), dtype) for d in (dk, dk, dk, dv)]
        return tok + [jnp.zeros((1, 2, n_chunks, C, C), dtype),
                      jnp.zeros((1, 2, n_chunks, dk), jnp.float32)]

    def check_raises(self, pattern, args, **kwargs):
        with self.assertRaisesRegex(ValueError, pattern):
            cwm.channelwise_forward_mosaic(*args, scale=0.1, **kwargs)

    def test_rejects_what_the_kernel_cannot_take(self):
        self.check_raises("16-bit dtype.*Triton", self._args(dtype=jnp.float32))
        self.check_raises("head dims", self._args(dk=32))
        self.check_raises("head dims", self._args(dv=256))
        args = self._args()
        self.check_raises("kg must", [args[0], args[1][:, :, :1]] + args[2:])
        self.check_raises("w must", args[:2] + [args[2].astype(jnp.float16)] + args[3:])
        self.check_raises("u must", args[:3] + [args[3][:, :50]] + args[4:])
        self.check_raises("mq must", self._args(n_chunks=3))
        self.check_raises("e_all must", args[:5] + [args[5][..., :32]])
        self.check_raises("initial_state", args,
                          initial_state=jnp.zeros((1, 2, 64, 32), jnp.float32))

    def test_backward_rejects_what_the_kernel_cannot_take(self):
        def check(pattern, args, **kwargs):
            qg, kg, w, u, mq, e_all = args
            with self.assertRaisesRegex(ValueError, pattern):
                cwm.channelwise_backward_state_mosaic(qg, kg, w, mq, e_all, u, scale=0.1,
                                                      **kwargs)

        check("16-bit dtype.*Triton", self._args(dtype=jnp.float32))
        check("head dims", self._args(dk=32))
        check("head dims", self._args(dv=256))
        args = self._args()
        check("kg must", [args[0], args[1][:, :, :1]] + args[2:])
        check("do must", args[:3] + [args[3][:, :50]] + args[4:])
        check("dvn_in must", args, dvn_in=args[3].astype(jnp.float32))
        check("mq must", self._args(n_chunks=3))
        check("e_all must", args[:5] + [args[5][..., :32]])
        check("dht must", args, dht=jnp.zeros((1, 2, 64, 32), jnp.float32))

    def test_state_pass_option(self):
        inputs, _ = cw_test._inputs(0, 1, 64, 1, 1, 64, dtype=jnp.bfloat16)
        q, k, v, g, beta = (inputs[n] for n in ("q", "k", "v", "g", "beta"))
        with self.assertRaisesRegex(ValueError, "state_pass must be one of"):
            channelwise_gpu.channelwise_delta_pallas(q, k, v, g, beta, beta, scale=0.125,
                                                     state_pass="cuda")
        base = dict(batch=1, heads=1, n_chunks=1, dk=64, dv=64, scale=0.1, has_docs=False,
                    interpret=True, return_residual=False)
        cfg = channelwise_gpu._config(**base, mm_dtype=jnp.bfloat16, state_pass="mosaic")
        self.assertEqual(cfg["state_pass"], "mosaic")
        # fp32 operands: the Mosaic kernel cannot take them, the Triton kernel runs.
        cfg = channelwise_gpu._config(**base, mm_dtype=jnp.float32, state_pass="mosaic")
        self.assertEqual(cfg["state_pass"], "triton")
        self.assertEqual(channelwise_gpu._config(**base, mm_dtype=jnp.bfloat16)["state_pass"],
                         channelwise_gpu.TUNING["state_pass"])


@pytest.mark.gpu
class GpuTest(kmg_test.HopperTestCase):
    """The compiled kernel (wgmma, TMA) on a Hopper GPU."""

    # Two of kernel_gpu_channelwise_test.GpuTest's eight cases (each runs the reference and
    # both state passes forward and backward; the call's time is short).
    @parameterized.parameters(("kda", True, 128), ("gdn2", False, 64))
    def test_op_with_either_state_pass_against_fp32_reference(self, op, packed, dim):
        # kernel_gpu_channelwise_test.GpuTest's case and gates (FLA's), with the switch on and
        # off: o, final state and every gradient (the backward reads the kernel's hs and Vn).
        seq_len = 1000
        segment_ids = cw_test._gpu_case_segment_ids(packed)
        inputs, cot_key = cw_test._inputs(0, 2, seq_len, 2, 4, dim, dtype=jnp.bfloat16)
        want = cw_test._outputs_and_grads(op, None, inputs, segment_ids, cot_key, False)
        got = {sp: _op_outputs_and_grads(op, inputs, segment_ids, cot_key, sp, "pallas")
               for sp in ("mosaic", "triton")}
        for sp, (outs, grads) in got.items():
            for i, name in enumerate(("o", "final_state")):
                self.assertLess(tolerances.rel_err(outs[i], want[0][i]), 5e-3, f"{sp} {name}")
            for name in cw_test._DIFF_ARGS[op]:
                limit = 2e-2 if name in ("g", "beta", "b", "w") else 8e-3
                self.assertLess(tolerances.rel_err(grads[name], want[1][name]), limit,
                                f"{sp} d{name}")
        # Same roundings as the Triton kernel: the two state passes agree far inside the gates
        # (2e-3 / 4e-3). Here (B 2, H 4, 16 chunks) the Mosaic passes run as P = 4 sequence
        # pieces, which round the maps and entry states instead (MOSAIC_GPU.md Sec. 30): 5e-3.
        pieces = mgl.num_pieces(None, 2 * 4 * (dim // cwm.BLOCK_V), -(-seq_len // C))
        out_gate, grad_gate = (2e-3, 4e-3) if pieces == 1 else (5e-3, 5e-3)
        for i, name in enumerate(("o", "final_state")):
            self.assertLess(tolerances.rel_err(got["mosaic"][0][i], got["triton"][0][i]),
                            out_gate, f"{name}: mosaic vs triton")
        for name in cw_test._DIFF_ARGS[op]:
            self.assertLess(tolerances.rel_err(got["mosaic"][1][name], got["triton"][1][name]),
                            grad_gate, f"d{name}: mosaic vs triton")

    @parameterized.named_parameters(
        ("kda_bf16_packed_T4096_K128_V128", 0, 2, 4096, 4, 128, 128, jnp.bfloat16,
         (700, 1, 64, 999, 1200), 1.0, True, False),
        ("gdn2_bf16_partial_T1000_K64_V128", 1, 2, 1000, 2, 64, 128, jnp.bfloat16, None, 5.0,
         True, True),
        ("kda_fp16_packed_T3000_K128_V64", 2, 1, 3000, 3, 128, 64, jnp.float16,
         (10, 54, 500, 2000), 0.5, False, False),
    )
    def test_kernel_matches_reference_and_triton(self, *case):
        _check_kernel(self, case, interpret=False)

    @parameterized.named_parameters(
        ("kda_bf16_packed_T4096_K128_V128", 0, 2, 4096, 4, 128, 128, jnp.bfloat16,
         (700, 1, 64, 999, 1200), 1.0, True, False),
        ("gdn2_bf16_partial_T1000_K64_V128", 1, 2, 1000, 2, 64, 128, jnp.bfloat16, None, 5.0,
         False, True),
        ("kda_fp16_packed_T3000_K128_V64", 2, 1, 3000, 3, 128, 64, jnp.float16,
         (10, 54, 500, 2000), 0.5, True, False),
    )
    def test_backward_matches_reference_and_triton(self, *case):
        # The reverse pass against float64 and the compiled Triton _backward_state (dvn_in
        # given where the case has h0).
        _check_backward(self, case, interpret=False)

    def test_alias_staging_changes_nothing(self):
        cfg, prep, state = _prepared(7, 1, 1000, 2, 128, 128, jnp.bfloat16, docs=(300, 1),
                                     interpret=False)
        plain = _run_mosaic(cfg, prep, state, interpret=False)
        aliased = cwm.channelwise_forward_mosaic(*_kernel_args(prep), scale=cfg["scale"],
                                                 initial_state=state, store_v_new=True,
                                                 store_h=True, alias_staging=True)
        for name, a, e in zip(_NAMES, aliased, plain):
            np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(e, np.float32),
                                          err_msg=name)
        do, din, dht = _cotangents(7, prep, 128, jnp.bfloat16)
        plain, aliased = (cwm.channelwise_backward_state_mosaic(
            *_bwd_args(prep), do, scale=cfg["scale"], dvn_in=din, dht=dht, alias_staging=alias)
            for alias in (False, True))
        for name, a, e in zip(_BWD_NAMES, aliased, plain):
            np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(e, np.float32),
                                          err_msg=name)


if __name__ == "__main__":
    absltest.main()
