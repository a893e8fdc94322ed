"""K1, the per-channel family's intra-chunk gradients on Mosaic GPU (KDA, GDN-2; issue 29).

``pallas_kernels/common/channelwise_grad_mosaic_gpu.py`` has
:func:`channelwise_grad_intra_mosaic`, a drop-in for the Triton ``grad_blocks`` kernel of
``channelwise_gpu`` (switched by ``grad_pass="mosaic"``). Its inputs here come from the real
forward: ``channelwise_gpu``'s ``gamma``, ``intra``, ``prepare``, ``wu`` and ``forward`` kernels
(``Vn``, ``A``), a random ``dO`` through ``backward_state`` (``dVn``) and ``_chunk_dr``
(``dR = A^T dVn``), all in Pallas interpret mode (compiled in ``GpuTest``).

* ``LoweringTest`` (CI): the kernel exports for CUDA on the CPU host (``jax.export``) at K, V in
  {64, 128}, bf16 and fp16, with and without documents; the SMEM count at K = V = 128 is
  pinned (Mosaic GPU's own count; the limit is 232,448 bytes); the whole KDA forward +
  backward with ``grad_pass="mosaic"`` exports with K1 in place of ``grad_blocks`` (and GDN-2
  with both Mosaic state passes as well).
* ``Jax011LoweringTest`` (CI where the test process has jax >= 0.11, skipped below): K1 with
  document ids at K = V in {64, 128} and both slabs, the layout search on a small fuel
  (MOSAIC_GPU.md Sec. 24.2; ``PYTHONPATH=$PWD /tmp/jax011/bin/python -m pytest ...``).
* ``AblationTest`` (CI): the timing ablations (``ablations``, MOSAIC_GPU.md Sec. 22) export
  for CUDA under their kernel names; the default equals ``ablations=()`` (same module text);
  bad names are refused; ``channelwise_gpu`` (the op) never passes them.
* ``ValidationTest`` (CI): the ValueErrors (fp32, head dims, shapes, ``grad_pass``) and the
  fp32 fallback to Triton.
* ``InterpretTest`` (``slow``, one case per test): K1 in Mosaic GPU interpret mode
  (``detect_races=True``) and the Triton ``_grad_blocks`` in Pallas interpret mode on identical
  inputs, each against a float64 NumPy evaluation of the same formulas (relative RMS 5e-3;
  not bit-equal: K1 rounds the pairs at least 8 apart to the operand dtype, Triton to TF32).
  ``OpInterpretTest`` (``slow``): the whole KDA and GDN-2 ops with ``grad_pass="mosaic"``
  against ``"triton"``, every gradient.
* ``GpuTest`` (``gpu``): on a Hopper GPU, the compiled K1 against float64 and the compiled
  Triton kernel at longer rows; the whole KDA and GDN-2 ops with either grad pass against the
  fp32 token-serial reference and against each other.

Interpret tests, one at a time on a 2-core host: ``PJRT_NPROC=8 timeout 900 python -m pytest
-q -m slow tests/pallas_kernels/kernel_mosaic_channelwise_grad_test.py``.
"""

import collections
import contextlib
import functools
import io
import re
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest, parameterized

from pallas_kernels.common import channelwise_gpu, pallas_gpu
from pallas_kernels.common import channelwise_grad_mosaic_gpu as k1
from pallas_kernels.common import channelwise_mosaic_gpu as cwm
from pallas_kernels.gdn2 import kernel_gpu as gdn2_kernel
from pallas_kernels.kda import kernel_gpu as kda_kernel
from tests import tolerances
from tests.pallas_kernels import kernel_gpu_channelwise_test as cw_test
from tests.pallas_kernels import kernel_mosaic_channelwise_test as kmc_test
from tests.pallas_kernels import kernel_mosaic_gpu_test as kmg_test

C = k1.CHUNK
_BF16, _FP16 = jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)
# Relative RMS against the float64 evaluation (MOSAIC_GPU.md Sec. 19.4.6): K1 and Triton alike.
_REF_GATE = 5e-3
_SMEM_LIMIT = 227 * 1024
_SMEM_K128_V128 = 203_808  # MOSAIC_GPU.md Sec. 20 and the module docstring quote it
_SMEM_K128_V128_SLAB16 = 175_136


def grad_inputs(seed, batch, seq_len, heads, dk, dv, dtype, *, docs=None, decay=1.0, h0=True,
                gdn2=False, interpret=True, full=False):
    """``(cfg, args, doc_arrays)``: ``args = (q, k, kr, gamma, do, vn, dr)`` as ``grad_blocks``
    receives them in the op's backward, from ``channelwise_gpu``'s own forward kernels (Pallas
    interpret mode if ``interpret``) on random inputs (KDA's per-head ``beta`` or GDN-2's
    per-channel scales, log-decays ``decay * log_sigmoid(N(1.5, 1))`` on the even channels, to
    about -20 per token at ``decay=10``, and ``log_sigmoid(N(1.5, 1))`` on the odd ones), a
    random ``dO`` and the final state's cotangent; time padded to whole chunks. ``full``: also
    ``(ks, hs, dhs)`` (the padded kr scale, the chunks' entry states and exit cotangents) as a
    fourth element, K2's extra inputs."""
    keys = jax.random.split(jax.random.key(seed), 10)

    def unit(x):
        return x / jnp.linalg.norm(x, axis=-1, keepdims=True)

    shape_k, shape_v = (batch, seq_len, heads, dk), (batch, seq_len, heads, dv)
    q = unit(jax.random.normal(keys[0], shape_k)).astype(dtype)
    k = unit(jax.random.normal(keys[1], shape_k)).astype(dtype)
    v = jax.random.normal(keys[2], shape_v).astype(dtype)
    channel_decay = jnp.where(jnp.arange(dk) % 2 == 0, decay, 1.0)  # odd channels: mild
    g = channel_decay * jax.nn.log_sigmoid(jax.random.normal(keys[3], shape_k) + 1.5)
    if gdn2:
        ks = jax.nn.sigmoid(jax.random.normal(keys[4], shape_k))
        vs = jax.nn.sigmoid(jax.random.normal(keys[5], shape_v))
    else:
        ks = vs = jax.nn.sigmoid(jax.random.normal(keys[4], (batch, seq_len, heads, 1)))
    state = (0.5 * jax.random.normal(keys[6], (batch, heads, dk, dv)) if h0
             else jnp.zeros((batch, heads, dk, dv)))
    n_chunks = -(-seq_len // C)
    padded = n_chunks * C

    def pad(x):
        return jnp.pad(x, ((0, 0), (0, padded - seq_len)) + ((0, 0),) * (x.ndim - 2))

    q, k, v, ks, vs, g = (pad(x) for x in (q, k, v, ks, vs, g))
    do = pad(jax.random.normal(keys[7], shape_v).astype(dtype))
    dht = jax.random.normal(keys[8], (batch, heads, dk, dv))
    seg = kmc_test._segment_ids(batch, seq_len, docs)
    doc_arrays = () if seg is None else pallas_gpu.docs_from_segment_ids(seg, padded)
    cfg = channelwise_gpu._config(batch=batch, heads=heads, n_chunks=n_chunks, dk=dk, dv=dv,
                                  scale=dk ** -0.5, has_docs=seg is not None, mm_dtype=dtype,
                                  interpret=interpret, return_residual=False)

    @jax.jit
    def forward(q, k, v, ks, vs, g, state, do, dht):
        gam = channelwise_gpu._gamma(cfg, g)
        prep = channelwise_gpu._prepare(cfg, q, k, v, ks, vs, gam, doc_arrays, save_a=True)
        _, _, vn, hs = channelwise_gpu._forward(cfg, prep, state, save=True)
        dvn, dhs, _ = channelwise_gpu._backward_state(cfg, prep, do, None, dht)
        dr = channelwise_gpu._chunk_dr(cfg, prep["a_ref"], dvn)
        kr = (k.astype(jnp.float32) * ks.astype(jnp.float32)).astype(k.dtype)
        return (q, k, kr, gam, do, vn, dr), (ks, hs, dhs)

    args, extra = forward(q, k, v, ks, vs, g, state, do, dht)
    if full:
        return cfg, args, doc_arrays, extra
    return cfg, args, doc_arrays


def reference(args, doc, scale):
    """float64 NumPy ``(dq, dk, dkr)`` of the kernel's equations on ``args``
    (``q, k, kr, gamma, do, vn, dr``; ``doc [B, T]`` or ``None``): dense per chunk, the
    exponents masked to ``j <= i`` before ``exp``, no rounding anywhere."""
    q, k, kr, gam, do, vn, dr = (np.asarray(x, np.float64) for x in args)
    batch, tp, heads, dk = q.shape
    n_chunks = tp // C

    def chunks(x):
        return x.reshape(batch, n_chunks, C, heads, -1)

    q, k, kr, gam, do, vn, dr = (chunks(x) for x in (q, k, kr, gam, do, vn, dr))
    i, j = np.indices((C, C))
    same = np.ones((batch, n_chunks, C, C), bool)
    if doc is not None:
        d = np.asarray(doc).reshape(batch, n_chunks, C)
        same = d[..., :, None] == d[..., None, :]
    incl, strict = ((i >= j) & same)[:, :, None], ((i > j) & same)[:, :, None]
    dmq = scale * np.einsum("bnihv,bnjhv->bnhij", do, vn) * incl
    dmk = -np.einsum("bnihv,bnjhv->bnhij", dr, vn) * strict
    out = [np.zeros((batch, n_chunks, C, heads, dk)) for _ in range(3)]
    for h in range(heads):  # one head at a time: e is [B, N, C, C, K]
        g_h = gam[:, :, :, h]
        expo = np.where((i >= j)[None, None, :, :, None],
                        g_h[:, :, :, None] - g_h[:, :, None, :], -np.inf)
        e = np.exp(expo)
        mq, mk = dmq[:, :, h], dmk[:, :, h]
        out[0][:, :, :, h] = np.einsum("bnij,bnjc,bnijc->bnic", mq, k[:, :, :, h], e)
        out[1][:, :, :, h] = (np.einsum("bnij,bnic,bnijc->bnjc", mq, q[:, :, :, h], e)
                              + np.einsum("bnij,bnic,bnijc->bnjc", mk, kr[:, :, :, h], e))
        out[2][:, :, :, h] = np.einsum("bnij,bnjc,bnijc->bnic", mk, k[:, :, :, h], e)
    return tuple(x.reshape(batch, tp, heads, dk) for x in out)


_NAMES = ("dq", "dk", "dkr")


def _check_kernel(test, case, *, interpret=True, slab=k1.SLAB):
    seed, batch, seq_len, heads, dk, dv, dtype, docs, decay, h0, gdn2 = case
    cfg, args, doc_arrays = grad_inputs(seed, batch, seq_len, heads, dk, dv, jnp.dtype(dtype),
                                        docs=docs, decay=decay, h0=h0, gdn2=gdn2,
                                        interpret=interpret)
    doc = doc_arrays[0] if doc_arrays else None
    log = io.StringIO()
    with contextlib.redirect_stdout(log):  # the interpreter prints the races it detects
        got = jax.block_until_ready(k1.channelwise_grad_intra_mosaic(
            *args, scale=cfg["scale"], doc=doc, slab=slab, interpret=interpret))
    races = log.getvalue()
    test.assertFalse("RACE DETECTED" in races, races[:600])  # e.g. without the sync wait
    q, k, kr, gam, do, vn, dr = args
    tri = jax.jit(lambda *a: channelwise_gpu._grad_blocks(cfg, *a))(q, k, kr, gam, doc_arrays,
                                                                    do, vn, dr)
    want = reference(args, doc, cfg["scale"])
    errs = {}
    for name, a, t, e in zip(_NAMES, got, tri, want):
        test.assertEqual((a.shape, a.dtype), (t.shape, t.dtype), name)
        test.assertFalse(np.isnan(np.asarray(a)).any(), f"{name}: NaN")
        errs[name] = (tolerances.rel_err(a, e), tolerances.rel_err(t, e))
        test.assertLess(errs[name][0], _REF_GATE, f"K1 {name} vs float64")
        test.assertLess(errs[name][1], _REF_GATE, f"Triton {name} vs float64")
    print("rel RMS vs float64 (K1, Triton):", errs)


# seed, B, T, H, K, V, dtype, document lengths (row 0; the rest one more), decay, h0, GDN-2.
# Documents start at a chunk boundary (64), just after one (65) and inside chunks; decay 10
# reaches about -20 per token.
_CASES = (
    ("kda_bf16_strong_decay_T150_K128_V128", 0, 1, 150, 1, 128, 128, jnp.bfloat16,
     (64, 1, 40), 10.0, True, False),
    ("gdn2_bf16_T192_K64_V128", 1, 1, 192, 2, 64, 128, jnp.bfloat16, (30, 98, 1), 1.0, False,
     True),
    ("kda_fp16_strong_decay_partial_T65_K64_V64", 2, 2, 65, 1, 64, 64, jnp.float16, (63,),
     10.0, True, False),
    ("gdn2_fp16_T192_K128_V64", 3, 1, 192, 1, 128, 64, jnp.float16, (63, 2, 60), 1.0, True,
     True),
)


# Class-level mark: absl's parameterized copies of a method do not keep a method-level mark.
@pytest.mark.slow
class InterpretTest(parameterized.TestCase):
    """K1 in Mosaic GPU interpret mode and Triton's grad_blocks in Pallas interpret mode."""

    @parameterized.named_parameters(*_CASES)
    def test_kernel_and_triton_match_float64(self, *case):
        _check_kernel(self, case)

    def test_slab16_matches_float64_and_triton(self):
        # Two 16-channel steps per warpgroup (the fallback if ptxas spills at 32): the first
        # case again.
        _check_kernel(self, _CASES[0][1:], slab=16)

    def test_unpadded_length_pads_inside(self):
        # T = 100 given directly: the kernel zero-pads (the pads add nothing inside the chunk:
        # zero dO, Vn, dR rows) and returns the first T rows.
        cfg, args, doc_arrays = grad_inputs(4, 1, 100, 1, 64, 64, _BF16, docs=(70,))
        doc = doc_arrays[0]
        cut = [x.at[:, 100:].set(0) for x in args]
        full = k1.channelwise_grad_intra_mosaic(*cut, scale=cfg["scale"], doc=doc,
                                                interpret=True)
        part = k1.channelwise_grad_intra_mosaic(*(x[:, :100] for x in cut), scale=cfg["scale"],
                                                doc=doc[:, :100], interpret=True)
        for name, a, e in zip(_NAMES, part, full):
            np.testing.assert_array_equal(a, e[:, :100], err_msg=name)


def _op_outputs_and_grads(op, inputs, segment_ids, cot_key, grad_pass, impl,
                          state_pass="triton"):
    # The state pass pinned (Triton unless given), so that only grad_pass differs between calls
    # whatever TUNING's defaults are.
    with cw_test._tuning({"grad_pass": grad_pass, "state_pass": state_pass}):
        return cw_test._outputs_and_grads(op, impl, inputs, segment_ids, cot_key, False)


@pytest.mark.slow
class OpInterpretTest(parameterized.TestCase):
    """The whole op (``implementation="pallas_interpret"``) with the switch on and off."""

    # The third: log-decays to about -20 per token and below (dg is jla's failure mode there).
    @parameterized.parameters(("kda", 64, 1.0), ("gdn2", 128, 1.0), ("kda", 64, 10.0))
    def test_mosaic_grad_pass_matches_triton(self, op, dim, decay):
        inputs, cot_key = cw_test._inputs(4, 1, 150, 1, 1, dim, dtype=jnp.bfloat16,
                                          decay=decay)
        seg = jnp.asarray(np.repeat(np.arange(3), [30, 70, 50])[None], jnp.int32)
        want = _op_outputs_and_grads(op, inputs, seg, cot_key, "triton", "pallas_interpret")
        got = _op_outputs_and_grads(op, inputs, seg, cot_key, "mosaic", "pallas_interpret")
        for name, a, e in zip(("o", "final_state"), got[0], want[0]):  # the forward: unchanged
            np.testing.assert_array_equal(a, e, err_msg=f"{op} {name}")
        # Against the fp32 token-serial reference: K1's error within 10 % of the Triton
        # kernel's for every gradient (dg included; MOSAIC_GPU.md Sec. 19.4.2's criterion).
        ref = cw_test._outputs_and_grads(op, None, inputs, seg, cot_key, False)
        for name in cw_test._DIFF_ARGS[op]:
            self.assertLess(tolerances.rel_err(got[1][name], want[1][name]), 4e-3,
                            f"{op} d{name}")
            self.assertLessEqual(tolerances.rel_err(got[1][name], ref[1][name]),
                                 1.1 * tolerances.rel_err(want[1][name], ref[1][name]) + 1e-5,
                                 f"{op} d{name} vs the fp32 reference")


def _export_kernel(dk, dv, dtype, docs=True, slab=k1.SLAB, ablations=None):
    """Exports K1 for CUDA; returns ``(mlir text, Mosaic GPU's SMEM count)``. ``ablations``:
    passed on unless ``None`` (then the kernel's default)."""
    batch, seq_len, heads = 1, 200, 2
    spec = jax.ShapeDtypeStruct
    args = ([spec((batch, seq_len, heads, dk), dtype)] * 3
            + [spec((batch, seq_len, heads, dk), jnp.float32)]
            + [spec((batch, seq_len, heads, dv), dtype)] * 3)
    doc = spec((batch, seq_len), jnp.int32) if docs else None

    def fn(*args, doc=None):
        return k1.channelwise_grad_intra_mosaic(
            *args, scale=0.1, doc=doc, slab=slab,
            **({} if ablations is None else dict(ablations=ablations)))

    return kmc_test.export_cuda_counting_smem(fn, *args, doc=doc)


@functools.lru_cache(maxsize=None)
def _exported_kernel(dk, dv, dtype, docs, slab):
    """``_export_kernel(dk, dv, dtype, docs, slab)`` once per module (the default ablations, no
    patches): LoweringTest's K128 V128 case, its SMEM count and slab-16 tests and FenceTest
    read the same three exports (about 1 s each on 2 cores)."""
    return _export_kernel(dk, dv, dtype, docs, slab)


def _export_op(op, tuning):
    """The channelwise kernel names of ``op``'s forward + backward exported for CUDA under
    ``tuning`` on a patched Hopper GPU: ``(Counter of the Triton kernels' names, number of
    Mosaic GPU calls, text)``."""
    dim = 64
    inputs, _ = cw_test._inputs(0, 1, 128, 2, 2, dim, dtype=jnp.bfloat16)
    seg = jnp.asarray(np.repeat(np.arange(2), [50, 78])[None], jnp.int32)
    names = ("q", "k", "v", "g") + (("beta",) if op == "kda" else ("b", "w"))
    fn_op = kda_kernel.kda_pallas if op == "kda" else gdn2_kernel.gdn2_pallas

    def fwdbwd(*args):
        def f(*args):
            return fn_op(*args, scale=0.125, segment_ids=seg)[0]
        o, vjp = jax.vjp(f, *args)
        return vjp(o) + (o,)

    with cw_test._tuning(tuning), kmc_test.hopper(), pallas_gpu.abstract_gpu_target():
        exported = jax.export.export(
            jax.jit(fwdbwd), platforms=["cuda"],
            disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(
                "__gpu$xla.gpu.triton")])(*(inputs[n] for n in names))
        text = exported.mlir_module()
    return (collections.Counter(re.findall(r'name = "channelwise_(\w+)"', text)),
            text.count("custom_call @mosaic_gpu"), text)


class LoweringTest(parameterized.TestCase):
    """The layout branch the interpreter replaces, lowered for CUDA on the CPU host."""

    @parameterized.named_parameters(
        ("K128_V128_bf16_docs", 128, 128, jnp.bfloat16, True),
        ("K64_V64_fp16", 64, 64, jnp.float16, False),
        ("K128_V64_bf16_docs", 128, 64, jnp.bfloat16, True),
        ("K64_V128_fp16_docs", 64, 128, jnp.float16, True),
    )
    def test_kernel_exports_for_cuda(self, dk, dv, dtype, docs):
        text, smem = _exported_kernel(dk, dv, dtype, docs, k1.SLAB)
        self.assertEqual(text.count("custom_call @mosaic_gpu"), 1)
        self.assertIn(k1.KERNEL_NAME, text)
        self.assertLessEqual(smem, _SMEM_LIMIT)

    def test_smem_count_at_k128_v128_bf16(self):
        self.assertEqual(_exported_kernel(128, 128, jnp.bfloat16, True, k1.SLAB)[1],
                         _SMEM_K128_V128)

    def test_slab16_exports_for_cuda(self):
        text, smem = _exported_kernel(128, 128, jnp.bfloat16, True, 16)
        self.assertEqual(text.count("custom_call @mosaic_gpu"), 1)
        self.assertEqual(smem, _SMEM_K128_V128_SLAB16)

    def test_kda_fwd_bwd_exports_without_grad_blocks(self):
        names, mosaic, text = _export_op("kda", {"grad_pass": "mosaic", "state_pass": "triton"})
        self.assertEqual(mosaic, 1)
        self.assertIn(k1.KERNEL_NAME, text)
        self.assertEqual(names, collections.Counter(
            ["gamma", "intra", "prepare", "wu", "forward", "backward_state", "backward_chunk"]))

    def test_gdn2_fwd_bwd_exports_with_every_mosaic_pass(self):
        names, mosaic, text = _export_op("gdn2", {"grad_pass": "mosaic", "state_pass": "mosaic"})
        self.assertEqual(mosaic, 3)
        for name in (k1.KERNEL_NAME, cwm.KERNEL_NAME, cwm.BWD_KERNEL_NAME):
            self.assertIn(name, text)
        self.assertEqual(names, collections.Counter(
            ["gamma", "intra", "prepare", "wu", "backward_chunk"]))


def without_test_locations(text):
    """Exported module text without the location lines that point into a test file (the
    call sites of the two exports being compared differ). jax 0.11 also writes a per-process
    counter into the serialized Mosaic GPU module (``mosaic_gpu.dump_basename``, ``<name>_<n>``)
    and so into the ``kernel_hash`` of its bytes: the counter is masked and the hash dropped
    (the module's bytes are still compared)."""
    text = re.sub(r'(?m)^#loc\d+ = loc\("[^"]*_test\.py".*$', "", text)
    text = re.sub(r'(dump_basename\\00\w+?)_\d+\\00', r'\1_N\\00', text)
    return re.sub(r'kernel_hash = "[^"]*"', 'kernel_hash = "-"', text)


def default_and_explicit(export):
    """``(export(), export(ablations=()))`` for comparing a kernel's default with
    ``ablations=()``, from one call site (jax 0.11 serializes the caller's location into the
    Mosaic GPU module). If jax 0.11's ``dump_basename`` counters of the two differ in digits
    (``_9``, ``_10``: the bytecode's string lengths differ too), the pair is exported again."""
    def counter(result):  # export()'s (text, ...)
        found = re.search(r'dump_basename\\00\w+?_(\d+)\\00', result[0])
        return found.group(1) if found else ""

    for _ in range(2):
        pair = [export(**kw) for kw in ({}, dict(ablations=()))]
        if len(counter(pair[0])) == len(counter(pair[1])):
            break
    return pair


_JAX_011 = jax.__version_info__ >= (0, 11)
_NOT_011 = ("jax 0.11's Mosaic GPU layout inference (the H200's jax 0.11.2; run this file "
            "with the py3.12 venv of BUILD.md)")
# The search's fuel in the jax 0.11 tests: K1 takes 79 and K2 136 at most (MOSAIC_GPU.md
# Sec. 24.2); the default, 100,000, took 10 minutes of CPU to run out on K1 before the fix.
LAYOUT_FUEL = 2_000


@contextlib.contextmanager
def small_layout_fuel(fuel=LAYOUT_FUEL):
    """jax 0.11's layout inference with ``fuel`` (a search that backtracks fails in seconds
    with ``Layout inference failed to find a solution`` instead of running for minutes)."""
    from jax.experimental.mosaic.gpu import layout_inference
    infer = layout_inference.infer_layout

    def limited(module, **kwargs):
        return infer(module, **{**kwargs, "fuel": fuel})

    with mock.patch.object(layout_inference, "infer_layout", limited):
        yield


@absltest.skipUnless(_JAX_011, f"needs {_NOT_011}")
class Jax011LoweringTest(parameterized.TestCase):
    """K1 lowers on jax >= 0.11 with document ids at both slabs (MOSAIC_GPU.md Sec. 24.2: the
    row and column loads of the document ids, once merged into one load the search could not
    lay out; the quadrant mask's ``logical_not``), the layout search on a small fuel."""

    @parameterized.product(dim=(64, 128), slab=k1.SLABS)
    def test_exports_with_documents(self, dim, slab):
        with small_layout_fuel():
            text, smem = _export_kernel(dim, dim, jnp.bfloat16, docs=True, slab=slab)
        self.assertEqual(text.count("custom_call @mosaic_gpu"), 1)
        self.assertLessEqual(smem, _SMEM_LIMIT)


class AblationTest(parameterized.TestCase):
    """The timing ablations (``ablations``, MOSAIC_GPU.md Sec. 22): each lowers for CUDA under
    its own kernel name; the default is ``()`` and its module is the real kernel's; bad names
    are refused; the op never passes them."""

    @parameterized.parameters(*[(name,) for name in k1.K1_ABLATIONS])
    def test_each_ablation_exports_under_its_name(self, name):
        text, smem = _export_kernel(128, 128, jnp.bfloat16, docs=False, ablations=(name,))
        self.assertEqual(text.count("custom_call @mosaic_gpu"), 1)
        self.assertIn(f'{k1.KERNEL_NAME}_abl_{name}\\00', text)  # the name, NUL-terminated
        self.assertLessEqual(smem, _SMEM_LIMIT)

    def test_default_is_the_real_kernel(self):
        (default, smem), (explicit, _) = default_and_explicit(
            functools.partial(_export_kernel, 128, 128, jnp.bfloat16, docs=False))
        self.assertEqual(without_test_locations(explicit),
                         without_test_locations(default))  # the Mosaic GPU module included
        self.assertNotIn("_abl_", default)
        self.assertEqual(smem, _SMEM_K128_V128)
        both = _export_kernel(128, 128, jnp.bfloat16, docs=False,
                              ablations=("no_store", "no_band"))[0]
        self.assertIn(f'{k1.KERNEL_NAME}_abl_no_band_no_store\\00', both)  # sorted

    def test_rejects_bad_ablations_and_the_op_never_passes_them(self):
        args = ValidationTest()._args()
        for bad, msg in ((("no_state",), "not in"), (("nope",), "not in"),
                         (("no_band", "no_band"), "repeat"), ("no_band", "tuple")):
            with self.assertRaisesRegex(ValueError, msg):
                k1.channelwise_grad_intra_mosaic(*args, scale=0.1, ablations=bad)
        import inspect
        self.assertNotIn("ablation", inspect.getsource(channelwise_gpu))


def unfenced_wgmma(module_text):
    """``(store line, wgmma line)`` of every ``wgmma`` issued after a register -> SMEM store
    (``llvm.store`` to ``ptr<3>``) with no ``fence.proxy`` in between, in the textual order of a
    Mosaic GPU module (loops are read in text order). A generic-proxy write that the tensor
    cores (async proxy) read needs that fence (``plgpu.commit_smem``); interpret mode does not
    model it (MOSAIC_GPU.md Sec. 41)."""
    dirty, bad = None, []
    for n, line in enumerate(module_text.splitlines()):
        if '"stable_mosaic_gpu.llvm.store"' in line and "ptr<3>" in line:
            dirty = n
        elif "nvvm.fence.proxy" in line:
            dirty = None
        elif "wgmma.mma_async" in line and dirty is not None:
            bad.append((dirty, n))
    return bad


def mosaic_module_or_skip(test, exported_text):
    """The Mosaic GPU module's text of ``exported_text`` (jax 0.10; jaxlib 0.11 cannot read the
    serialized module back in Python: the test is skipped there)."""
    if not jax.__version__.startswith("0.10."):
        test.skipTest("reads the serialized Mosaic GPU module back (jax 0.10 only)")
    from benchmarks import profile_t0
    return profile_t0.mosaic_module_text(exported_text)


class FenceTest(parameterized.TestCase):
    """Every register -> SMEM store that a ``wgmma`` reads is fenced first (Sec. 41)."""

    def test_the_checker_sees_a_missing_fence(self):
        store = '"stable_mosaic_gpu.llvm.store"(%1, %2) : (i32, !llvm.ptr<3>) -> ()'
        mma = '%3 = "stable_mosaic_gpu.llvm.inline_asm"() {asm_string = "wgmma.mma_async"}'
        fence = '"stable_mosaic_gpu.nvvm.fence.proxy"() : () -> ()'
        self.assertEqual(unfenced_wgmma("\n".join([store, mma])), [(0, 1)])
        self.assertEqual(unfenced_wgmma("\n".join([store, fence, mma])), [])

    @parameterized.parameters(16, 32)
    def test_k1_fences_its_operand_stores(self, slab):
        text = mosaic_module_or_skip(self, _exported_kernel(128, 128, jnp.bfloat16, True,
                                                            slab)[0])
        self.assertEqual(text.count("wgmma.mma_async"), 54)
        self.assertEqual(unfenced_wgmma(text), [])


class ValidationTest(parameterized.TestCase):

    def _args(self, dk=64, dv=64, dtype=jnp.bfloat16, seq_len=100):
        keyed = [jnp.zeros((1, seq_len, 2, dk), dtype) for _ in range(3)]
        valued = [jnp.zeros((1, seq_len, 2, dv), dtype) for _ in range(3)]
        return keyed + [jnp.zeros((1, seq_len, 2, dk), jnp.float32)] + valued

    def check_raises(self, pattern, args, **kwargs):
        with self.assertRaisesRegex(ValueError, pattern):
            k1.channelwise_grad_intra_mosaic(*args, scale=0.1, **kwargs)

    def test_rejects_what_the_kernel_cannot_take(self):
        self.check_raises("16-bit dtype.*grad_pass='triton'", self._args(dtype=jnp.float32))
        self.check_raises("head dims", self._args(dk=32))
        self.check_raises("head dims", self._args(dv=256))
        args = self._args()
        self.check_raises("k must", [args[0], args[1][:, :, :1]] + args[2:])
        self.check_raises("kr must", args[:2] + [args[2].astype(jnp.float16)] + args[3:])
        self.check_raises("gamma must", args[:3] + [args[3][..., :32]] + args[4:])
        self.check_raises("do must", args[:4] + [args[4][:, :50]] + args[5:])
        self.check_raises("vn must", args[:5] + [args[5].astype(jnp.float16), args[6]])
        self.check_raises("dr must", args[:6] + [args[6][..., :32]])
        self.check_raises("doc must", args, doc=jnp.zeros((1, 64), jnp.int32))
        self.check_raises("slab must", args, slab=24)

    def test_grad_pass_option(self):
        inputs, _ = cw_test._inputs(0, 1, 64, 1, 1, 64, dtype=jnp.bfloat16)
        q, k, v, g, beta = (inputs[n] for n in ("q", "k", "v", "g", "beta"))
        with self.assertRaisesRegex(ValueError, "grad_pass must be one of"):
            channelwise_gpu.channelwise_delta_pallas(q, k, v, g, beta, beta, scale=0.125,
                                                     grad_pass="cuda")
        base = dict(batch=1, heads=1, n_chunks=1, dk=64, dv=64, scale=0.1, has_docs=False,
                    interpret=True, return_residual=False)
        cfg = channelwise_gpu._config(**base, mm_dtype=jnp.bfloat16, grad_pass="mosaic")
        self.assertEqual((cfg["grad_pass"], cfg["state_pass"]),
                         ("mosaic", channelwise_gpu.TUNING["state_pass"]))
        # fp32 operands: the Mosaic kernel cannot take them, the Triton kernel runs.
        cfg = channelwise_gpu._config(**base, mm_dtype=jnp.float32, grad_pass="mosaic")
        self.assertEqual(cfg["grad_pass"], "triton")
        self.assertEqual(channelwise_gpu._config(**base, mm_dtype=jnp.bfloat16)["grad_pass"],
                         channelwise_gpu.TUNING["grad_pass"])
        self.assertEqual(channelwise_gpu.TUNING["grad_pass"], "mosaic_fused")  # MOSAIC_GPU Sec. 46
        # The shipped slab: 32, faster on an H100 than 16 despite its spills (MOSAIC_GPU.md
        # Sec. 46).
        self.assertEqual(cfg["mosaic_grad_slab"], channelwise_gpu.TUNING["mosaic_grad_slab"])
        self.assertEqual(channelwise_gpu.TUNING["mosaic_grad_slab"], 32)

    def test_mosaic_grad_slab_is_checked_where_the_kernel_is_chosen(self):
        # Read unchecked before: int() turned "32" and 24.0 into slabs, and 24 or 0 only
        # failed inside K1 on a GPU (or in interpret mode), after the Triton parts had run.
        self.assertCountEqual(channelwise_gpu.GRAD_SLABS, k1.SLABS)
        # The shipped default: 32 (MOSAIC_GPU.md Sec. 46).
        self.assertEqual(channelwise_gpu.TUNING["mosaic_grad_slab"], 32)
        inputs, _ = cw_test._inputs(0, 1, 64, 1, 1, 64, dtype=jnp.bfloat16)
        q, k, v, g, beta = (inputs[n] for n in ("q", "k", "v", "g", "beta"))
        base = dict(batch=1, heads=1, n_chunks=1, dk=64, dv=64, scale=0.1, has_docs=False,
                    interpret=True, return_residual=False, mm_dtype=jnp.bfloat16)
        message = r"^TUNING\['mosaic_grad_slab'\] must be one of \(32, 16\) .*, got "
        rng = np.random.default_rng(5)
        bad = [24, 0, -16, 64, "32", 32.0, True, None, int(rng.integers(17, 32))]
        for value in bad:
            with self.subTest(value=value), mock.patch.dict(
                    channelwise_gpu.TUNING, mosaic_grad_slab=value):
                with self.assertRaisesRegex(ValueError, message + re.escape(repr(value))):
                    channelwise_gpu._config(**base, grad_pass="mosaic")
                with self.assertRaisesRegex(ValueError, message):  # any grad pass, CPU too
                    channelwise_gpu.channelwise_delta_pallas(q, k, v, g, beta, beta,
                                                             scale=0.125, grad_pass="triton")
        for value in (16, 32, np.int64(16)):
            with mock.patch.dict(channelwise_gpu.TUNING, mosaic_grad_slab=value):
                got = channelwise_gpu._config(**base, grad_pass="mosaic")["mosaic_grad_slab"]
                self.assertEqual((got, type(got)), (int(value), int))
        tuning = {k: v for k, v in channelwise_gpu.TUNING.items() if k != "mosaic_grad_slab"}
        self.assertEqual(channelwise_gpu.grad_slab(tuning), 16)  # absent: the default


@pytest.mark.gpu
class GpuTest(kmg_test.HopperTestCase):
    """The compiled kernel (wgmma, TMA) on a Hopper GPU."""

    @parameterized.parameters(("kda", True, 128), ("gdn2", False, 64))
    def test_op_with_either_grad_pass_against_fp32_reference(self, op, packed, dim):
        # kernel_gpu_channelwise_test.GpuTest's case and gates (FLA's), with the switch on and
        # off (and K1 with both Mosaic state passes): o, final state and every gradient.
        seq_len = 1000
        segment_ids = cw_test._gpu_case_segment_ids(packed)
        inputs, cot_key = cw_test._inputs(0, 2, seq_len, 2, 4, dim, dtype=jnp.bfloat16)
        want = cw_test._outputs_and_grads(op, None, inputs, segment_ids, cot_key, False)
        got = {(gp, sp): _op_outputs_and_grads(op, inputs, segment_ids, cot_key, gp, "pallas",
                                               state_pass=sp)
               for gp, sp in (("mosaic", "triton"), ("triton", "triton"), ("mosaic", "mosaic"))}
        for key, (outs, grads) in got.items():
            for i, name in enumerate(("o", "final_state")):
                self.assertLess(tolerances.rel_err(outs[i], want[0][i]), 5e-3, f"{key} {name}")
            for name in cw_test._DIFF_ARGS[op]:
                limit = 2e-2 if name in ("g", "beta", "b", "w") else 8e-3
                self.assertLess(tolerances.rel_err(grads[name], want[1][name]), limit,
                                f"{key} d{name}")
        mosaic, triton = got[("mosaic", "triton")], got[("triton", "triton")]
        for name in cw_test._DIFF_ARGS[op]:
            self.assertLess(tolerances.rel_err(mosaic[1][name], triton[1][name]), 4e-3,
                            f"d{name}: mosaic vs triton grad pass")

    @parameterized.named_parameters(
        ("kda_bf16_packed_T2048_K128_V128", 0, 1, 2048, 2, 128, 128, jnp.bfloat16,
         (700, 1, 64, 999), 1.0, True, False),
        ("gdn2_bf16_strong_decay_partial_T1000_K64_V128", 1, 2, 1000, 2, 64, 128, jnp.bfloat16,
         None, 10.0, False, True),
        ("kda_fp16_packed_T1500_K128_V64", 2, 1, 1500, 2, 128, 64, jnp.float16,
         (10, 54, 500), 0.5, True, False),
    )
    def test_kernel_matches_reference_and_triton(self, *case):
        _check_kernel(self, case, interpret=False)

    def test_slab16_matches_slab32(self):
        cfg, args, doc_arrays = grad_inputs(3, 2, 2048, 2, 128, 128, _BF16, docs=(700, 1, 64),
                                            interpret=False)
        wide, narrow = (k1.channelwise_grad_intra_mosaic(*args, scale=cfg["scale"],
                                                         doc=doc_arrays[0], slab=slab)
                        for slab in (32, 16))
        for name, a, e in zip(_NAMES, narrow, wide):  # fp32 summation order at most
            self.assertLess(tolerances.rel_err(a, e), 1e-5, name)


if __name__ == "__main__":
    absltest.main()
