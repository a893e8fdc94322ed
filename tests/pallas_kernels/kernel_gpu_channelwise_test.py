"""The Pallas GPU kernels of the per-channel-decay delta rule (KDA, GDN-2) against fp32 references.

``InterpretTest`` runs the kernels of ``pallas_kernels/common/channelwise_gpu.py`` in Pallas
interpret mode (``implementation="pallas_interpret"``) on whatever backend runs the suite, with
fp32 inputs, so every product is fp32 and the kernels must match the token-serial references
(``kda/reference.py``, ``gdn2/reference.py``) to fp32 rounding: outputs, final state, the
residual u and all gradients (q, k, v, g, beta / b, w, initial_state); one case runs bf16
inputs there too (bf16 operands, A and Mq stored in bf16) against the GPU gates.
``PrepareWidthsTest`` checks that ``prepare``'s key-block width changes its outputs by rounding
only. ``TritonLoweringTest`` lowers the kernels for CUDA on any host. ``GpuTest`` (marked
``gpu``, skipped without a GPU) compiles the kernels with Triton and checks bf16
inputs against the fp32 reference by relative RMS error with FLA's gates (o and states 5e-3,
dq/dk/dv/dh0 8e-3, gates 2e-2; ../shared/BENCHMARKS.md §5.5).
"""

import collections
import contextlib
import re
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest, parameterized

from pallas_kernels import gdn2 as gdn2_ops
from pallas_kernels import kda as kda_ops
from pallas_kernels.common import channelwise_gpu, pallas_gpu
from pallas_kernels.gdn2 import kernel_gpu as gdn2_kernel
from pallas_kernels.gdn2 import reference as gdn2_reference
from pallas_kernels.kda import kernel_gpu as kda_kernel
from pallas_kernels.kda import reference as kda_reference
from tests import tolerances

_DIFF_ARGS = {
    "kda": ("q", "k", "v", "g", "beta", "h0"),
    "gdn2": ("q", "k", "v", "g", "b", "w", "h0"),
}


def _gpu_case_segment_ids(packed):
    """The GPU cases' documents: ``None``, or (``packed``) five documents of 100, 257, 64, 300
    and 279 tokens in each of 2 rows of T = 1000 (int32 ``[2, 1000]``)."""
    if not packed:
        return None
    lengths = [100, 257, 64, 300, 279]
    return jnp.asarray(np.repeat(np.arange(5), lengths)[None].repeat(2, 0), jnp.int32)


def _inputs(seed, batch, seq_len, key_heads, heads, dim, *, dtype=jnp.float32, decay=1.0):
    """Random inputs of both ops: L2-normalised q, k; g = decay * log_sigmoid(randn + 1.5) per
    channel; beta, b, w = sigmoid(randn); h0 = 0.5 randn.

    Returns:
        ``(inputs, cot_seed)``: the seed of the cotangents drawn by :func:`_cotangents`.
    """
    # numpy's generator, not jax.random: each jax.random call (and each eager op on the
    # draws) on a new shape compiles a program.
    rng = np.random.default_rng(seed)

    def normal(*shape):
        return rng.standard_normal(shape)

    def l2(x):
        return x / np.linalg.norm(x, axis=-1, keepdims=True)

    def sigmoid(x):
        return 1.0 / (1.0 + np.exp(-x))

    q = jnp.asarray(l2(normal(batch, seq_len, key_heads, dim)), dtype)
    k = jnp.asarray(l2(normal(batch, seq_len, key_heads, dim)), dtype)
    v = jnp.asarray(normal(batch, seq_len, heads, dim), dtype)
    # Per-channel log-decays (log_sigmoid(x) = -log(1 + e^-x)); decay=10 reaches about -20 per
    # token and below.
    g = decay * -np.logaddexp(0.0, -(normal(batch, seq_len, heads, dim) + 1.5))
    f32 = jnp.float32
    beta = jnp.asarray(sigmoid(normal(batch, seq_len, heads)), f32)
    b = jnp.asarray(sigmoid(normal(batch, seq_len, heads, dim)), f32)
    w = jnp.asarray(sigmoid(normal(batch, seq_len, heads, dim)), f32)
    h0 = jnp.asarray(0.5 * normal(batch, heads, dim, dim), f32)
    return dict(q=q, k=k, v=v, g=jnp.asarray(g, f32), beta=beta, b=b, w=w, h0=h0), (seed, 1)


def _cotangents(cot_seed, outs):
    """Standard-normal cotangents of ``outs`` (in their dtypes), the same for the same seed."""
    rng = np.random.default_rng(cot_seed)
    return tuple(jnp.asarray(rng.standard_normal(x.shape), x.dtype) for x in outs)


@contextlib.contextmanager
def _tuning(overrides):
    """``channelwise_gpu.TUNING`` with ``overrides``; the ops' jitted traces read TUNING, so JAX's
    caches are cleared on entry and exit."""
    jax.clear_caches()
    try:
        with mock.patch.dict(channelwise_gpu.TUNING, overrides):
            yield
    finally:
        jax.clear_caches()


# TUNING values that keep every channelwise pass on the Triton kernels of this file.
_TRITON_PASSES = {"state_pass": "triton", "grad_pass": "triton"}


def _call(op, impl, inputs, segment_ids, residual):
    """``(o, final_state[, u])`` of ``op`` with ``impl`` (None: the fp32 token-serial reference)."""
    q, k, v, g, h0 = (inputs[n] for n in ("q", "k", "v", "g", "h0"))
    gates = (inputs["beta"],) if op == "kda" else (inputs["b"], inputs["w"])
    if impl is None:
        group = v.shape[2] // q.shape[2]
        q, k = (jnp.repeat(x.astype(jnp.float32), group, axis=2) for x in (q, k))
        fn = kda_reference.kda_reference if op == "kda" else gdn2_reference.gdn2_reference
        o, s, u = fn(q, k, v.astype(jnp.float32), g, *gates, scale=q.shape[-1] ** -0.5,
                     initial_state=h0, segment_ids=segment_ids)
        return (o, s, u) if residual else (o, s)
    fn = kda_ops.kda if op == "kda" else gdn2_ops.gdn2
    return fn(q, k, v, g, *gates, initial_state=h0, output_final_state=True,
              segment_ids=segment_ids, implementation=impl, return_residual=residual)


def _outputs_and_grads(op, impl, inputs, segment_ids, cot_seed, residual):
    names = _DIFF_ARGS[op]

    def fn(*diff):
        return _call(op, impl, dict(inputs, **dict(zip(names, diff))), segment_ids, residual)

    outs, vjp = jax.vjp(fn, *[inputs[n] for n in names])
    return outs, dict(zip(names, vjp(_cotangents(cot_seed, outs))))


_reference_outputs_and_grads = jax.jit(_outputs_and_grads, static_argnums=(0, 1, 4, 5))


def _check_against_reference(op, *, batch=1, seq_len=65, key_heads=2, heads=2, dim=64, decay=1.0,
                             segment_ids=None, residual=False, seed=0):
    """fp32 inputs: the kernels in interpret mode equal the fp32 reference to rounding
    (outputs, final state, u if ``residual``, every gradient)."""
    inputs, cot_seed = _inputs(seed, batch, seq_len, key_heads, heads, dim, decay=decay)
    # The reference as one compiled program (op by op it compiled each small op on its own).
    want = _reference_outputs_and_grads(op, None, inputs, segment_ids, cot_seed, residual)
    got = _outputs_and_grads(op, "pallas_interpret", inputs, segment_ids, cot_seed, residual)
    tol = tolerances.fwd_tol(jnp.float32)
    for name, a, e in zip(("o", "final_state", "u"), got[0], want[0]):
        np.testing.assert_allclose(a, e, err_msg=f"{op} {name}", **tol)
    gtol = tolerances.grad_tol(jnp.float32)
    for name in _DIFF_ARGS[op]:
        scale = float(jnp.max(jnp.abs(want[1][name]))) + 1e-6
        np.testing.assert_allclose(got[1][name] / scale, want[1][name] / scale,
                                   err_msg=f"{op} d{name}", **gtol)


class InterpretTest(parameterized.TestCase):
    """Pallas interpret mode: fp32 inputs equal the reference to fp32 rounding (one bf16 case
    within the GPU gates). The Triton passes are pinned: with 16-bit operands TUNING's Mosaic
    passes (the defaults since 2026-12-07c) would run in Mosaic GPU interpret mode instead."""

    def setUp(self):
        super().setUp()
        self.enter_context(_tuning(_TRITON_PASSES))

    def check(self, op, **kwargs):
        _check_against_reference(op, **kwargs)

    @pytest.mark.slow  # ~19 s on 2 cores; GDN-2's ragged-length case runs in CI
    def test_kda_ragged_length_initial_state_gva(self):
        # T = 65: one full chunk and a one-token tail; two value heads per key head.
        self.check("kda", seq_len=65, key_heads=1, heads=2)

    def test_gdn2_ragged_length_initial_state_with_residual(self):
        # The residual u is returned and gets a cotangent (the dVn input of the reverse pass,
        # which reaches grad_blocks and backward_chunk through dR = A^T dVn).
        self.check("gdn2", seq_len=65, residual=True, seed=1)

    @parameterized.parameters("kda", "gdn2")
    def test_packed_documents(self, op):
        # Two rows: five documents with boundaries inside and on chunk edges (10, 40, 43, 64),
        # and three documents (64, 65: a one-token document at a chunk start).
        rows = ([10, 30, 3, 21, 36], [64, 1, 35])
        segment_ids = jnp.asarray(np.stack([np.repeat(np.arange(len(r)), r) for r in rows]),
                                  jnp.int32)
        self.check(op, batch=2, seq_len=100, segment_ids=segment_ids, seed=2)

    @parameterized.parameters("kda", "gdn2")
    @pytest.mark.slow  # ~30 s on 2 cores; KDA head dim 128 packed with strong decay runs in CI
    def test_strong_decay(self, op):
        # Per-channel log-decays down to about -20 per token and below: exponents must stay
        # masked before exp, and the off-diagonal reference-point factors must stay <= 1.
        inputs, _ = _inputs(3, 1, 96, 2, 2, 64, decay=10.0)
        self.assertLess(float(jnp.min(inputs["g"])), -20.0)
        self.check(op, seq_len=96, decay=10.0, seed=3)

    @pytest.mark.slow  # ~18 s on 2 cores
    def test_token_parallel_intra_head_groups(self):
        # Twelve heads under a cap of 8: the token-parallel intra kernel runs four heads per
        # program (the largest power of two dividing 12 within the cap); GVA with two key heads.
        self.assertEqual([channelwise_gpu.intra_heads(h, {"intra_token_heads": 8})
                          for h in (1, 2, 5, 6, 12, 16)], [1, 2, 1, 2, 4, 8])
        self.assertEqual([channelwise_gpu.intra_heads(h, {"intra_token_heads": 2})
                          for h in (1, 5, 6, 16)], [1, 1, 2, 2])
        with _tuning({"intra_token_heads": 8}):
            self.check("kda", seq_len=80, key_heads=2, heads=12, seed=7)

    def test_intra_token_heads_below_one_is_an_error(self):
        # There is no other intra form to fall back on: a cap < 1 is refused, naming the entry,
        # by intra_heads and by the op (its static configuration, before any kernel runs).
        why = re.escape('TUNING["intra_token_heads"] (the cap on heads per program of the intra '
                        'kernel) must be an int >= 1, got ')
        for bad in (0, -2, None, "four"):
            with self.assertRaisesRegex(ValueError, why + re.escape(repr(bad))):
                channelwise_gpu.intra_heads(4, {"intra_token_heads": bad})
        inputs, _ = _inputs(0, 1, 64, 1, 1, 64)
        args = [inputs[n] for n in ("q", "k", "v", "g", "beta")]
        with _tuning({"intra_token_heads": 0}):
            with self.assertRaisesRegex(ValueError, why + "0$"):
                kda_ops.kda(*args, implementation="pallas_interpret")

    @pytest.mark.slow  # ~21 s on 2 cores; packed documents of both ops run in CI
    def test_kda_head_dim_128_packed_strong_decay(self):
        # K = 128 (two key blocks in wu, the gamma kernel and backward_chunk; grad_blocks
        # over the whole K), packed documents with boundaries inside 16-row blocks, and
        # log-decays down to about -20 per token.
        segment_ids = jnp.asarray(np.repeat(np.arange(3), [40, 30, 26])[None], jnp.int32)
        self.check("kda", seq_len=96, dim=128, decay=10.0, segment_ids=segment_ids, seed=8)

    def test_bf16_inputs(self):
        # bf16 inputs in interpret mode: A and Mq are stored in bf16 (the operand dtype their
        # consumers round them to); outputs and gradients within the GPU tests' bf16 gates.
        segment_ids = jnp.asarray(np.repeat(np.arange(2), [50, 78])[None], jnp.int32)
        inputs, cot_seed = _inputs(9, 1, 128, 1, 2, 64, dtype=jnp.bfloat16)
        want = _outputs_and_grads("kda", None, inputs, segment_ids, cot_seed, False)
        got = _outputs_and_grads("kda", "pallas_interpret", inputs, segment_ids, cot_seed, False)
        self.assertLess(tolerances.rel_err(got[0][0], want[0][0]), 5e-3, "o")
        self.assertLess(tolerances.rel_err(got[0][1], want[0][1]), 5e-3, "final_state")
        for name in _DIFF_ARGS["kda"]:
            limit = 2e-2 if name in ("g", "beta") else 8e-3
            self.assertLess(tolerances.rel_err(got[1][name], want[1][name]), limit, f"d{name}")

    @pytest.mark.slow  # ~35 s on 2 cores; head dim 128 and GVA each run in CI (cases above)
    def test_kda_head_dim_128_gva(self):
        # K = V = 128: two key blocks in wu and backward_chunk (eight in prepare), two value
        # blocks.
        self.check("kda", batch=2, seq_len=70, key_heads=1, heads=2, dim=128, seed=4)

    def test_auto_dispatch_and_explicit_pallas_raises(self):
        inputs, _ = _inputs(0, 1, 64, 1, 1, 64)
        args = [inputs[n] for n in ("q", "k", "v", "g", "beta")]
        gdn2_args = [inputs[n] for n in ("q", "k", "v", "g", "b", "w")]
        self.assertTrue(channelwise_gpu.AUTO_SELECT)  # on since the H200 GPU tests passed
        on_gpu = jax.default_backend() == "gpu"
        for implementation in (None, "auto"):
            self.assertEqual(channelwise_gpu.choose_implementation(
                "kda", implementation, ("chunked", "reference"), args[:3], (64, 64), 64, 64),
                "pallas" if on_gpu else "chunked")
        # The switch holds "auto" back.
        with mock.patch.object(channelwise_gpu, "AUTO_SELECT", False):
            self.assertEqual(channelwise_gpu.choose_implementation(
                "kda", "auto", ("chunked", "reference"), args[:3], (64, 64), 64, 64), "chunked")
        if jax.default_backend() != "gpu":
            with self.assertRaisesRegex(ValueError, "need a GPU backend"):
                kda_ops.kda(*args, implementation="pallas")
            with self.assertRaisesRegex(ValueError, "need a GPU backend"):
                gdn2_ops.gdn2(*gdn2_args, implementation="pallas")
            np.testing.assert_array_equal(kda_ops.kda(*args)[0],
                                          kda_ops.kda(*args, implementation="chunked")[0])
        with self.assertRaisesRegex(ValueError, "head dim 32"):
            kda_ops.kda(inputs["q"][..., :32], inputs["k"][..., :32], inputs["v"],
                        inputs["g"][..., :32], inputs["beta"], implementation="pallas_interpret")
        with self.assertRaisesRegex(ValueError, "chunk_size=32"):
            gdn2_ops.gdn2(*gdn2_args, chunk_size=32, implementation="pallas_interpret")

    @pytest.mark.slow  # ~20 s on 2 cores; bf16 inputs run in CI
    def test_scale_shapes(self):
        # The read-key / write-value scales are per head ([B, T, H], KDA's beta) or per channel
        # (shaped like k / v, GDN-2's b and w); a per-head scale equals its broadcast per-channel
        # form exactly, and any other shape is refused, naming the argument.
        inputs, _ = _inputs(1, 1, 70, 1, 1, 64)
        q, k, v, g, beta = (inputs[n] for n in ("q", "k", "v", "g", "beta"))

        def run(ks, vs):
            return channelwise_gpu.channelwise_delta_pallas(q, k, v, g, ks, vs, scale=0.125,
                                                            interpret=True)

        per_head = run(beta, beta)
        per_channel = run(jnp.broadcast_to(beta[..., None], k.shape),
                          jnp.broadcast_to(beta[..., None], v.shape))
        for a, e in zip(per_head, per_channel):
            np.testing.assert_array_equal(a, e)
        with self.assertRaisesRegex(ValueError, r"k_scale must be shaped \(1, 70, 1\) or "
                                                r"\(1, 70, 1, 64\), got \(1, 70, 1, 32\)"):
            run(k[..., :32], beta)
        with self.assertRaisesRegex(ValueError, "v_scale must be shaped"):
            run(beta, beta[:, :64])
        with self.assertRaisesRegex(ValueError, "k_scale must be a float array, got int32"):
            run(jnp.ones(beta.shape, jnp.int32), beta)

    @pytest.mark.slow  # ~45 s on 2 cores; bf16 inputs and the scale paths each run in CI
    def test_scales_bf16(self):
        # bf16 inputs, where the in-kernel kr = k ks and vw = v vs round once to bf16: the
        # outputs equal those of v pre-scaled by XLA with a unit v_scale (the same rounding), a
        # per-head scale equals its broadcast per-channel form in outputs and every gradient
        # (its gradient the channel sum of the per-channel one), and bf16 scales give bf16
        # gradients.
        inputs, ck = _inputs(2, 1, 80, 1, 1, 64, dtype=jnp.bfloat16)
        q, k, v, g, beta = (inputs[n] for n in ("q", "k", "v", "g", "beta"))
        seg = jnp.asarray(np.repeat(np.arange(2), [33, 47])[None], jnp.int32)

        def run(v, ks, vs):
            return channelwise_gpu.channelwise_delta_pallas(q, k, v, g, ks, vs, scale=0.125,
                                                            segment_ids=seg, interpret=True)

        got = run(v, beta, beta)
        vw = (v.astype(jnp.float32) * beta[..., None]).astype(v.dtype)
        for a, e in zip(got, run(vw, beta, jnp.ones_like(beta))):
            np.testing.assert_array_equal(a, e)
        (cot,) = _cotangents(ck, got[:1])

        def grads(ks, vs):
            o, vjp = jax.vjp(lambda *xs: run(*xs)[0], v, ks, vs)
            return o, vjp(cot)

        o_h, (dv_h, dks_h, dvs_h) = grads(beta, beta)
        wide_k = jnp.broadcast_to(beta[..., None], k.shape)
        wide_v = jnp.broadcast_to(beta[..., None], v.shape)
        o_c, (dv_c, dks_c, dvs_c) = grads(wide_k, wide_v)
        np.testing.assert_array_equal(o_h, o_c)
        np.testing.assert_array_equal(dv_h, dv_c)
        self.assertGreater(float(jnp.max(jnp.abs(dks_h))), 0.0)
        np.testing.assert_allclose(dks_h, jnp.sum(dks_c, -1), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(dvs_h, jnp.sum(dvs_c, -1), rtol=1e-5, atol=1e-6)
        _, (_, dks_b, dvs_b) = grads(beta.astype(jnp.bfloat16), beta.astype(jnp.bfloat16))
        self.assertEqual((dks_b.dtype, dvs_b.dtype), (jnp.bfloat16, jnp.bfloat16))


_PACKED_ROWS = ([10, 30, 3, 22], [64, 1])  # T = 65: boundaries inside 16-row blocks and at 64


def _packed_segment_ids(rows=_PACKED_ROWS):
    return jnp.asarray(np.stack([np.repeat(np.arange(len(r)), r) for r in rows]), jnp.int32)


def _prepare_outputs(prepare_k, *, dtype, dim, packed, decay, seq_len=65, heads=2, seed=11):
    """Every output of ``channelwise_gpu._prepare`` (``intra``, ``prepare`` and ``wu``, A saved) in
    Pallas interpret mode under ``TUNING["prepare_k"] = prepare_k``, on random inputs:
    ``{name: array}`` (w, u, a, mq, qg, kg, e). Two batch rows, packed documents
    (:data:`_PACKED_ROWS`) if ``packed``, log-decays scaled by ``decay``."""
    inputs, _ = _inputs(seed, 2, seq_len, heads, heads, dim, dtype=dtype, decay=decay)
    chunk = channelwise_gpu.CHUNK
    padded = -(-seq_len // chunk) * chunk

    def pad(x):
        return jnp.pad(x, ((0, 0), (0, padded - seq_len)) + ((0, 0),) * (x.ndim - 2))

    q, k, v = (pad(inputs[n]) for n in ("q", "k", "v"))
    ks, vs = pad(inputs["b"]), pad(inputs["w"])  # GDN-2's per-channel scales
    g = pad(inputs["g"])
    gam = jnp.cumsum(g.reshape(2, padded // chunk, chunk, heads, dim), axis=2).reshape(g.shape)
    docs = (pallas_gpu.docs_from_segment_ids(_packed_segment_ids(), padded) if packed else ())
    with mock.patch.dict(channelwise_gpu.TUNING, {"prepare_k": prepare_k}):
        cfg = channelwise_gpu._config(batch=2, heads=heads, n_chunks=padded // chunk, dk=dim,
                                      dv=dim, scale=dim ** -0.5, has_docs=packed, mm_dtype=dtype,
                                      interpret=True, return_residual=False)
    fn = jax.jit(lambda *xs: channelwise_gpu._prepare(cfg, *xs, docs, save_a=True))
    outs = fn(q, k, v, ks, vs, gam)
    return {name[:-len("_ref")]: x for name, x in outs.items()}


class DecayRowsTest(parameterized.TestCase):
    """``intra``'s decay-scaled rows against float64 NumPy on the same inputs, in Pallas
    interpret mode: ``qg = q E_in``, ``kg = k E_out``, ``krg = kr E_in`` with ``E_in =
    exp(gamma_t) conn_t``, ``E_out = exp(gamma_C - gamma_t) last_t`` and ``kr = k ks`` rounded
    to the operand dtype (T = 65 padded to 128, packed documents with boundaries inside and at
    the end of chunks, per-channel read-key scales). ``wu``'s W = A krg is checked through the
    op in ``InterpretTest``; these rows reach it only through W and the state pass."""

    @parameterized.named_parameters(
        ("fp32_packed", jnp.float32, True, 1e-5),
        ("fp32_unpacked", jnp.float32, False, 1e-5),
        ("bf16_packed", jnp.bfloat16, True, 2.0 ** -8),
    )
    def test_rows_match_numpy(self, dtype, packed, rtol):
        heads, dim, seq_len, chunk = 2, 64, 65, channelwise_gpu.CHUNK
        padded = -(-seq_len // chunk) * chunk
        inputs, _ = _inputs(5, 2, seq_len, heads, heads, dim, dtype=dtype, decay=3.0)

        def pad(x):
            return jnp.pad(x, ((0, 0), (0, padded - seq_len)) + ((0, 0),) * (x.ndim - 2))

        q, k, ks, g = (pad(inputs[n]) for n in ("q", "k", "b", "g"))
        gam = jnp.cumsum(g.reshape(2, -1, chunk, heads, dim), axis=2).reshape(g.shape)
        docs = pallas_gpu.docs_from_segment_ids(_packed_segment_ids(), padded) if packed else ()
        cfg = channelwise_gpu._config(batch=2, heads=heads, n_chunks=padded // chunk, dk=dim,
                                      dv=dim, scale=dim ** -0.5, has_docs=packed, mm_dtype=dtype,
                                      interpret=True, return_residual=False)
        outs = jax.jit(lambda *xs: channelwise_gpu._intra(cfg, *xs, docs))(q, k, ks, gam)

        f64 = lambda x: np.asarray(jnp.asarray(x, jnp.float32), np.float64)  # noqa: E731
        gam64 = f64(gam)
        g_last = np.repeat(gam64.reshape(2, -1, chunk, heads, dim)[:, :, -1:], chunk, axis=2)
        e_in = np.exp(gam64)
        e_out = np.exp(g_last.reshape(gam64.shape) - gam64)
        if packed:
            e_in = e_in * f64(docs[1])[:, :, None, None]
            e_out = e_out * f64(docs[2])[:, :, None, None]
        kr = f64((k.astype(jnp.float32) * ks.astype(jnp.float32)).astype(dtype))
        want = {"qg": f64(q) * e_in, "kg": f64(k) * e_out, "krg": kr * e_in}
        for name, expected in want.items():
            got = outs[name + "_ref"]
            self.assertEqual((got.shape, got.dtype), (q.shape, jnp.dtype(dtype)), name)
            np.testing.assert_allclose(f64(got), expected, rtol=rtol,
                                       atol=rtol * np.max(np.abs(expected)), err_msg=name)
        if packed:  # the masks matter here: tokens of a new document do not see S_0
            self.assertGreater(np.sum(f64(docs[1]) == 0), 0)

    def test_unpadded_length_is_an_error(self):
        inputs, _ = _inputs(1, 1, 64, 1, 1, 64)
        cfg = channelwise_gpu._config(batch=1, heads=1, n_chunks=2, dk=64, dv=64, scale=0.125,
                                      has_docs=False, mm_dtype=jnp.float32, interpret=True,
                                      return_residual=False)
        with self.assertRaisesRegex(ValueError, "padded length 128"):
            channelwise_gpu._intra(cfg, inputs["q"], inputs["k"], inputs["beta"][..., None],
                                   inputs["g"], ())


class DocStartsTest(absltest.TestCase):

    def test_hand_computed_starts_of_two_rows(self):
        # Row 0: documents of 10, 30, 3, 21 and 64 tokens (boundaries at 10, 40, 43 in chunk 0
        # and 64 on the chunk edge); row 1: 70 tokens then 58 (a document across the edge).
        rows = ([10, 30, 3, 21, 64], [70, 58])
        doc = jnp.asarray(np.stack([np.repeat(np.arange(len(r)), r) for r in rows]), jnp.int32)
        got = np.asarray(channelwise_gpu._doc_starts(doc))[..., 0]
        want = np.zeros((2, 128), np.int32)
        for t, start in ((range(10, 40), 10), (range(40, 43), 40), (range(43, 64), 43)):
            want[0, list(t)] = start
        want[1, 70:] = 6  # chunk 1's second document starts at its local index 6
        np.testing.assert_array_equal(got, want)
        # the kernel's mask: c <= r share a document iff c >= start[r]; against the ids
        for b in range(2):
            for n in range(2):
                ids = np.asarray(doc)[b, 64 * n:64 * (n + 1)]
                r, c = np.tril_indices(64)
                np.testing.assert_array_equal(c >= got[b, 64 * n + r], ids[r] == ids[c])


class PrepareWidthsTest(parameterized.TestCase):
    """``prepare``'s key-block width (``TUNING["prepare_k"]``) changes only the order of its
    sums: outputs with the default width (16) against the whole key head dim in one block, in
    Pallas interpret mode: T = 65 (a one-token tail chunk), K = V = 64 and 128, packed
    documents, log-decays to about -20 per token. (The outputs themselves are checked through
    the op against the fp32 reference in ``InterpretTest``.)"""

    def test_widths_agree(self):
        # fp32, K = 64 in four key blocks of 16 against one of 64, packed documents,
        # log-decays to about -20 per token.
        self.check_widths(dtype=jnp.float32, dim=64, packed=True, decay=10.0)

    @parameterized.named_parameters(
        ("fp32_k128_packed", jnp.float32, 128, True, 1.0),
        ("bf16_k64_packed", jnp.bfloat16, 64, True, 1.0),
        ("bf16_k128_packed_strong_decay", jnp.bfloat16, 128, True, 10.0),
    )
    @pytest.mark.slow  # ~15 s on 2 cores; the case above runs in CI
    def test_widths_agree_more(self, dtype, dim, packed, decay):
        self.check_widths(dtype=dtype, dim=dim, packed=packed, decay=decay)

    def check_widths(self, **kwargs):
        dtype, dim = kwargs["dtype"], kwargs["dim"]
        want = _prepare_outputs(dim, **kwargs)
        got = _prepare_outputs(16, **kwargs)
        self.assertEqual(sorted(got), ["a", "e", "kg", "mq", "qg", "u", "w"])
        for name in sorted(want):
            a, e = (np.asarray(x[name], np.float32) for x in (got, want))
            self.assertEqual((a.shape, got[name].dtype), (e.shape, want[name].dtype), name)
            self.assertTrue(np.all(np.isfinite(a)), name)
            if name in ("qg", "kg", "e"):  # intra's and wu's elementwise outputs (no prepare_k)
                np.testing.assert_array_equal(a, e, err_msg=name)
            elif dtype == jnp.float32:
                # fp32 to rounding: max difference relative to the largest entry.
                self.assertLess(np.max(np.abs(a - e)), 1e-6 * np.max(np.abs(e)), name)
            else:
                # bf16 outputs (A, Mq stored in bf16; W, U from bf16 operands): a few entries
                # may round to neighbouring bf16 values; far inside the GPU gates.
                self.assertLess(tolerances.rel_err(a, e), 2e-3, name)
            if name in ("a", "mq"):  # zeros above the diagonal, written by prepare
                upper = np.triu(np.ones((64, 64), bool), 1)
                self.assertFalse(np.any(a[..., upper]), name)
            if name == "a":  # unit diagonal
                np.testing.assert_allclose(np.diagonal(a, axis1=-2, axis2=-1), 1.0)

    def test_bad_width_is_an_error(self):
        # Refused by the op's static configuration, before any kernel runs.
        inputs, _ = _inputs(0, 1, 64, 1, 1, 64)
        args = [inputs[n] for n in ("q", "k", "v", "g", "beta")]
        for width in (48, 8, 128):
            with _tuning({"prepare_k": width}):
                with self.assertRaisesRegex(ValueError, rf'TUNING\["prepare_k"\]={width} must '
                                                        "divide the key head dim 64"):
                    kda_ops.kda(*args, implementation="pallas_interpret")
        config = dict(batch=1, heads=1, n_chunks=1, dk=64, dv=64, scale=0.125, has_docs=False,
                      mm_dtype=jnp.float32, interpret=True, return_residual=False)
        with _tuning({"prepare_k": 32}):
            self.assertEqual(channelwise_gpu._config(**config)["prepare_k"], 32)
        with _tuning({"prepare_k": None}):  # None: block_k
            # (None: min(K, 64))
            self.assertEqual(channelwise_gpu._config(**config)["prepare_k"], 64)


class TritonLoweringTest(parameterized.TestCase):
    """KDA and GDN-2 forward + backward lower to Triton for CUDA on any host (``jax.export``, no
    GPU), so an op the lowering rejects fails here rather than on the next GPU run (jax >= 0.11
    compiles the Triton kernels at this point). KDA takes the per-head scale path of the kernels
    (beta ``[B, T, H]``), GDN-2 the per-channel one (b, w)."""

    @parameterized.parameters("kda", "gdn2")
    def test_exports_for_cuda(self, op):
        inputs, _ = _inputs(0, 1, 128, 2, 2, 64, dtype=jnp.bfloat16)
        segment_ids = jnp.asarray(np.repeat(np.arange(2), [50, 78])[None], jnp.int32)
        names = ("q", "k", "v", "g") + (("beta",) if op == "kda" else ("b", "w"))
        args = [inputs[n] for n in names]
        fn = kda_kernel.kda_pallas if op == "kda" else gdn2_kernel.gdn2_pallas

        def fwdbwd_gpu(*args):
            def f(*args):
                return fn(*args, scale=0.125, segment_ids=segment_ids)[0]
            o, vjp = jax.vjp(f, *args)
            return vjp(o) + (o,)

        with pallas_gpu.abstract_gpu_target():
            exported = jax.export.export(
                jax.jit(fwdbwd_gpu), platforms=["cuda"],
                disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(
                    "__gpu$xla.gpu.triton")])(*args)
            text = exported.mlir_module()
        # Every kernel once, and no other channelwise kernel.
        self.assertEqual(collections.Counter(re.findall(r'name = "channelwise_(\w+)"', text)),
                         collections.Counter(["gamma", "intra", "prepare", "wu", "forward",
                                              "backward_state", "grad_blocks", "backward_chunk"]))


@pytest.mark.gpu
class GpuTest(parameterized.TestCase):
    """bf16 inputs compiled by Triton on a GPU, against the fp32 reference (FLA's gates). The
    Triton state and grad passes are pinned: on a Hopper GPU TUNING's defaults are the Mosaic
    passes (tested in ``kernel_mosaic_channelwise*_test.py``), and A100s run these."""

    def setUp(self):
        super().setUp()
        if jax.default_backend() != "gpu":
            self.skipTest("needs a GPU")
        self.enter_context(_tuning(_TRITON_PASSES))

    @parameterized.product(op=("kda", "gdn2"), packed=(False, True), dim=(64, 128))
    def test_bf16_against_fp32_reference(self, op, packed, dim):
        seq_len = 1000
        segment_ids = _gpu_case_segment_ids(packed)
        inputs, cot_seed = _inputs(0, 2, seq_len, 2, 4, dim, dtype=jnp.bfloat16)
        want = _outputs_and_grads(op, None, inputs, segment_ids, cot_seed, False)
        got = _outputs_and_grads(op, "pallas", inputs, segment_ids, cot_seed, False)
        self.assertLess(tolerances.rel_err(got[0][0], want[0][0]), 5e-3, "o")
        self.assertLess(tolerances.rel_err(got[0][1], want[0][1]), 5e-3, "final_state")
        for name in _DIFF_ARGS[op]:
            limit = 2e-2 if name in ("g", "beta", "b", "w") else 8e-3
            self.assertLess(tolerances.rel_err(got[1][name], want[1][name]), limit, f"d{name}")


if __name__ == "__main__":
    absltest.main()
