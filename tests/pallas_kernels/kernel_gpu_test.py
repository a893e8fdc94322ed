"""The Pallas GPU kernels of the scalar-decay family against the fp32 token-serial references.

``InterpretTest`` runs the kernels in Pallas interpret mode (``implementation=
"pallas_interpret"``) on whatever backend runs the suite, so CI checks the kernel code itself on
CPU; inputs are fp32, so the kernels run every product in fp32 and must match the references to
fp32 rounding. ``GpuTest`` (marked ``gpu``, skipped without a GPU) compiles the same kernels
with Triton and checks bf16 inputs against the fp32 reference by relative RMS error, with FLA's
gates (o and states 5e-3, dq/dk/dv/dh0 8e-3, dbeta/dg 2e-2; ../shared/BENCHMARKS.md §5.5).
``SplitForwardInterpretTest`` repeats a few interpret checks with ``TUNING["split_forward"]``
(the forward as a sequential state kernel plus a parallel output kernel) and compares the two
forward paths; ``SegmentsInterpretTest`` does the same for ``TUNING["segments"]`` (sequence
parallelism: rows cut into segments whose state passes run in parallel); ``GpuTest`` also
compiles the split and segmented paths, and ``TritonLoweringTest`` lowers them to Triton for
CUDA on any backend.
"""

from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest, parameterized

from pallas_kernels import gated_delta_rule as gdr
from pallas_kernels import simple_gla as sg
from pallas_kernels.common import pallas_gpu
from pallas_kernels.gated_delta_rule import kernel_gpu
from pallas_kernels.gated_delta_rule import reference as gdr_reference
from pallas_kernels.simple_gla import reference as sg_reference
from tests import random_inputs
from tests import tolerances

OPS = ("gdn", "deltanet", "simple_gla", "lightning", "linear_attn")


def _inputs(seed, batch, seq_len, key_heads, heads, dim, *, dtype=jnp.float32, decay=1.0):
    """Random inputs of every op: L2-normalised q, k; g = decay * log_sigmoid(randn); beta =
    sigmoid(randn); h0 = 0.5 randn; log_decay uniform in -decay * [0.01, 1).

    Returns:
        ``(inputs, cot_seed)``: the seed of the cotangents drawn by :func:`_cotangents`.
    """
    # numpy's generator, not jax.random: each jax.random call (and each eager op on the
    # draws) on a new shape compiles a program.
    rng = np.random.default_rng(seed)

    def normal(*shape):
        return rng.standard_normal(shape)

    q, k, v = (jnp.asarray(x, dtype) for x in
               random_inputs.qkv(rng, batch, seq_len, key_heads, heads, dim, dim))
    g = jnp.asarray(decay * -np.logaddexp(0.0, -normal(batch, seq_len, heads)), jnp.float32)
    beta = jnp.asarray(random_inputs.sigmoid(normal(batch, seq_len, heads)), jnp.float32)
    h0 = jnp.asarray(0.5 * normal(batch, heads, dim, dim), jnp.float32)
    log_decay = jnp.asarray(-rng.uniform(0.01, 1.0, (heads,)) * decay, jnp.float32)
    return dict(q=q, k=k, v=v, g=g, beta=beta, h0=h0, log_decay=log_decay), (seed, 1)


def _cotangents(cot_seed, outs):
    """Standard-normal cotangents of ``outs`` (in their dtypes), the same for the same seed."""
    rng = np.random.default_rng(cot_seed)
    return tuple(jnp.asarray(rng.standard_normal(x.shape), x.dtype) for x in outs)


def _call(op, impl, q, k, v, g, beta, h0, log_decay, segment_ids):
    """``(o, final_state)`` of ``op`` with implementation ``impl`` (None: fp32 reference)."""
    kw = dict(initial_state=h0, output_final_state=True, segment_ids=segment_ids)
    if impl is None:
        # The references take expanded heads in fp32.
        group = v.shape[2] // q.shape[2]
        q, k = (jnp.repeat(x.astype(jnp.float32), group, axis=2) for x in (q, k))
        v = v.astype(jnp.float32)
        scale = q.shape[-1] ** -0.5
        if op in ("gdn", "deltanet"):
            o, s, _ = gdr_reference.gated_delta_rule_reference(
                q, k, v, g if op == "gdn" else None, beta, scale=scale, initial_state=h0,
                segment_ids=segment_ids)
            return o, s
        gate = {"simple_gla": g, "linear_attn": None,
                "lightning": jnp.broadcast_to(log_decay, g.shape)}[op]
        return sg_reference.simple_gla_reference(q, k, v, gate, scale=scale, initial_state=h0,
                                                 segment_ids=segment_ids)
    kw["implementation"] = impl
    if op == "gdn":
        return gdr.gated_delta_rule(q, k, v, g, beta, **kw)
    if op == "deltanet":
        return gdr.delta_rule(q, k, v, beta, **kw)
    if op == "simple_gla":
        return sg.simple_gla(q, k, v, g, **kw)
    if op == "lightning":
        return sg.lightning_attention(q, k, v, log_decay, **kw)
    return sg.linear_attention(q, k, v, **kw)


_DIFF_ARGS = {
    "gdn": ("q", "k", "v", "g", "beta", "h0"),
    "deltanet": ("q", "k", "v", "beta", "h0"),
    "simple_gla": ("q", "k", "v", "g", "h0"),
    "lightning": ("q", "k", "v", "log_decay", "h0"),
    "linear_attn": ("q", "k", "v", "h0"),
}


def _outputs_and_grads(op, impl, inputs, segment_ids, cot_seed):
    names = _DIFF_ARGS[op]

    def loss(*diff):
        args = dict(inputs, **dict(zip(names, diff)))
        o, s = _call(op, impl, segment_ids=segment_ids, **args)
        return o, s

    (o, s), vjp = jax.vjp(loss, *[inputs[n] for n in names])
    grads = vjp(_cotangents(cot_seed, (o, s)))
    return o, s, dict(zip(names, grads))


def _gdn_with_residual(inputs, segment_ids, cot_seed):
    """GDN in interpret mode with the residual u returned: ``(o, final_state, u)`` and the VJP
    of random cotangents on all three w.r.t. ``_DIFF_ARGS["gdn"]`` (reads TUNING when traced)."""
    names = _DIFF_ARGS["gdn"]

    def f(*diff):
        a = dict(inputs, **dict(zip(names, diff)))
        return gdr.gated_delta_rule(
            a["q"], a["k"], a["v"], a["g"], a["beta"], initial_state=a["h0"],
            output_final_state=True, segment_ids=segment_ids, return_residual=True,
            implementation="pallas_interpret")

    outs, vjp = jax.vjp(f, *[inputs[n] for n in names])
    return outs, vjp(_cotangents(cot_seed, outs))


# Reference results by check() arguments: SplitForwardInterpretTest checks cases of
# InterpretTest again and reuses their references (CI time).
_REFERENCES = {}


class InterpretTest(parameterized.TestCase):
    """fp32 inputs in Pallas interpret mode: the kernels equal the reference to fp32 rounding."""

    def check(self, op, *, batch=1, seq_len=65, key_heads=2, heads=2, dim=64, decay=1.0,
              segment_ids=None, seed=0):
        inputs, cot_seed = _inputs(seed, batch, seq_len, key_heads, heads, dim, decay=decay)
        key = (op, batch, seq_len, key_heads, heads, dim, decay, seed,
               None if segment_ids is None else np.asarray(segment_ids).tobytes())
        if key not in _REFERENCES:
            _REFERENCES[key] = jax.device_get(
                _outputs_and_grads(op, None, inputs, segment_ids, cot_seed))
        want = _REFERENCES[key]
        got = _outputs_and_grads(op, "pallas_interpret", inputs, segment_ids, cot_seed)
        tol = tolerances.fwd_tol(jnp.float32)
        np.testing.assert_allclose(got[0], want[0], err_msg=f"{op} o", **tol)
        np.testing.assert_allclose(got[1], want[1], err_msg=f"{op} final_state", **tol)
        gtol = tolerances.grad_tol(jnp.float32)
        for name in _DIFF_ARGS[op]:
            scale = float(jnp.max(jnp.abs(want[2][name]))) + 1e-6
            np.testing.assert_allclose(got[2][name] / scale, want[2][name] / scale,
                                       err_msg=f"{op} d{name}", **gtol)

    @parameterized.parameters(*OPS)
    def test_ragged_length_with_initial_state(self, op):
        # T = 65: one full chunk and a one-token tail chunk (padded inside the op).
        self.check(op, seq_len=65)

    @parameterized.parameters("gdn", "deltanet")  # with and without decay
    def test_packed_documents(self, op):
        self.check_packed(op)

    @parameterized.parameters("simple_gla", "linear_attn")
    @pytest.mark.slow  # ~8 s each on 2 cores; GDN and DeltaNet run in CI
    def test_packed_documents_more_ops(self, op):
        self.check_packed(op)

    def check_packed(self, op):
        # One row of five documents, boundaries inside and on chunk edges (10, 40, 43, 64).
        lengths = [10, 30, 3, 21, 36]
        segment_ids = jnp.asarray(np.repeat(np.arange(5), lengths)[None], jnp.int32)
        self.check(op, seq_len=sum(lengths), segment_ids=segment_ids, seed=1)

    def test_strong_decay(self):
        self.check_strong_decay("gdn")

    @pytest.mark.slow  # ~8 s on 2 cores; GDN runs in CI
    def test_strong_decay_simple_gla(self):
        self.check_strong_decay("simple_gla")

    def check_strong_decay(self, op):
        # Log-decays down to about -20 per token: exponents must be masked before exp.
        self.check(op, seq_len=96, decay=8.0, seed=2)

    @pytest.mark.slow  # ~40 s on 2 cores; SplitForwardInterpretTest's GVA + head dim 128 runs in CI
    def test_gva_and_head_dim_128(self):
        # Two value heads per key head, K = V = 128 (two key blocks in the gradient kernel),
        # with the value blocks of 64 that many-program shapes get (auto_block_v gives these
        # few-program test shapes blocks of 32).
        jax.clear_caches()  # TUNING is read at trace time
        with mock.patch.dict(kernel_gpu.TUNING, {"block_v": 64}):
            self.check("gdn", seq_len=70, key_heads=1, heads=2, dim=128, batch=2, seed=3)
        jax.clear_caches()

    def test_auto_block_v_narrows_only_when_few_programs_run(self):
        self.assertEqual(kernel_gpu.auto_block_v(8, 16, 128), 64)  # S1: 256 programs
        self.assertEqual(kernel_gpu.auto_block_v(1, 16, 128), 32)  # S2: 32 programs at 64
        self.assertEqual(kernel_gpu.auto_block_v(4, 16, 128), 64)  # 128 programs: enough
        self.assertEqual(kernel_gpu.auto_block_v(1, 4, 32), 32)  # V < 64: V

    def test_auto_on_cpu_is_chunked_and_explicit_pallas_raises(self):
        inputs, _ = _inputs(0, 1, 64, 1, 1, 64)
        args = [inputs[n] for n in ("q", "k", "v", "g", "beta")]
        if jax.default_backend() != "gpu":
            with self.assertRaisesRegex(ValueError, "need a GPU backend"):
                gdr.gated_delta_rule(*args, implementation="pallas")
            np.testing.assert_array_equal(gdr.gated_delta_rule(*args)[0],
                                          gdr.gated_delta_rule(*args, implementation="chunked")[0])
        with self.assertRaisesRegex(ValueError, "head dim 32"):
            sg.simple_gla(inputs["q"][..., :32], inputs["k"][..., :32], inputs["v"],
                          inputs["g"], implementation="pallas_interpret")
        with self.assertRaisesRegex(ValueError, "chunk_size=32"):
            gdr.delta_rule(inputs["q"], inputs["k"], inputs["v"], inputs["beta"],
                           chunk_size=32, implementation="pallas_interpret")

    def test_residual_matches_chunked(self):
        inputs, _ = _inputs(4, 1, 80, 2, 2, 64)
        args = [inputs[n] for n in ("q", "k", "v", "g", "beta")]
        _, _, u_kernel = gdr.gated_delta_rule(*args, return_residual=True,
                                              implementation="pallas_interpret")
        _, _, u_chunked = gdr.gated_delta_rule(*args, return_residual=True,
                                               implementation="chunked")
        np.testing.assert_allclose(u_kernel, u_chunked, **tolerances.fwd_tol(jnp.float32))

    @pytest.mark.slow  # ~10 s on 2 cores
    def test_qk_l2norm_option_normalises_first(self):
        # Raw (unnormalised) q, k with use_qk_l2norm equal pre-normalised q, k without it,
        # in value and in gradient w.r.t. the raw inputs (checked against the chunked form).
        inputs, _ = _inputs(5, 1, 64, 2, 2, 64)
        raw_q, raw_k = 3.0 * inputs["q"] + 0.1, 0.5 * inputs["k"] - 0.2

        def loss(impl, q, k):
            o, _ = gdr.gated_delta_rule(q, k, inputs["v"], inputs["g"], inputs["beta"],
                                        use_qk_l2norm=True, implementation=impl)
            return jnp.sum(o * o)

        for argnum in (1, 2):
            want = jax.grad(loss, argnum)("chunked", raw_q, raw_k)
            got = jax.grad(loss, argnum)("pallas_interpret", raw_q, raw_k)
            np.testing.assert_allclose(got, want, **tolerances.grad_tol(jnp.float32))
        normed = [x / jnp.linalg.norm(x, axis=-1, keepdims=True) for x in (raw_q, raw_k)]
        o_ref, _ = gdr.gated_delta_rule(*normed, inputs["v"], inputs["g"], inputs["beta"],
                                        implementation="chunked")
        o, _ = gdr.gated_delta_rule(raw_q, raw_k, inputs["v"], inputs["g"], inputs["beta"],
                                    use_qk_l2norm=True, implementation="pallas_interpret")
        np.testing.assert_allclose(o, o_ref, rtol=1e-4, atol=1e-5)


class SplitForwardInterpretTest(parameterized.TestCase):
    """``TUNING["split_forward"]``: forward_state + forward_output instead of forward.

    TUNING is read at trace time and traces are cached, hence ``jax.clear_caches()`` around the
    patch. The cases are a subset of :class:`InterpretTest` (CI time).
    """

    check = InterpretTest.check

    def setUp(self):
        super().setUp()
        jax.clear_caches()
        patcher = mock.patch.dict(kernel_gpu.TUNING, {"split_forward": True})
        patcher.start()
        self.addCleanup(jax.clear_caches)  # runs after patcher.stop (cleanups are LIFO)
        self.addCleanup(patcher.stop)

    @parameterized.parameters("gdn", "simple_gla")
    def test_ragged_length_with_initial_state(self, op):
        self.check(op, seq_len=65)

    @parameterized.parameters("gdn", "deltanet")  # deltanet: the no-decay specialisation
    def test_packed_documents(self, op):
        lengths = [10, 30, 3, 21, 36]
        segment_ids = jnp.asarray(np.repeat(np.arange(5), lengths)[None], jnp.int32)
        self.check(op, seq_len=sum(lengths), segment_ids=segment_ids, seed=1)

    def test_gva_and_head_dim_128(self):
        # auto_block_v gives the state kernel value blocks of 32 here, the output kernel 64.
        self.check("gdn", seq_len=70, key_heads=1, heads=2, dim=128, batch=2, seed=3)

    @pytest.mark.slow  # ~25 s on 2 cores; the split path's reference checks above run in CI
    def test_equals_the_unsplit_forward(self):
        # Random packed rows, three chunks: outputs to fp32 rounding (accumulation order of the
        # read-out); the residual u, the final state and every gradient (from the same residuals).
        inputs, cot_seed = _inputs(6, 2, 150, 2, 2, 64)
        ids = np.repeat(np.arange(4), [20, 70, 44, 16])
        segment_ids = jnp.asarray(np.stack([ids, np.sort(ids[::-1] % 3)]), jnp.int32)
        names = _DIFF_ARGS["gdn"]
        split = _gdn_with_residual(inputs, segment_ids, cot_seed)
        jax.clear_caches()
        with mock.patch.dict(kernel_gpu.TUNING, {"split_forward": False}):
            unsplit = _gdn_with_residual(inputs, segment_ids, cot_seed)
        jax.clear_caches()  # (also cleared by the class's cleanup should run() fail)
        tol = dict(rtol=1e-6, atol=1e-6)
        for what, got, want in zip(("o", "final_state", "u"), split[0], unsplit[0]):
            np.testing.assert_allclose(got, want, err_msg=what, **tol)
        for name, got, want in zip(names, split[1], unsplit[1]):
            np.testing.assert_allclose(got, want, err_msg=f"d{name}", **tol)


class SegmentsInterpretTest(parameterized.TestCase):
    """``TUNING["segments"]``: each row's state passes cut into P segments run in parallel.

    The segments' affine state maps, the sequential combine over segments and the rerun from
    the combined entry states must reproduce the token-serial reference (fp32, interpret mode),
    across document boundaries that cut segments, and the unsegmented kernels in every output
    and gradient (the residual u's cotangent included, which the reverse transitions carry).
    """

    check = InterpretTest.check

    def setUp(self):
        super().setUp()
        jax.clear_caches()
        self.addCleanup(jax.clear_caches)

    def test_packed_rows_with_initial_state(self):
        self.check_packed_rows("gdn", 4)

    @parameterized.parameters(("simple_gla", 2), ("deltanet", 2))
    @pytest.mark.slow  # ~12 s each on 2 cores; GDN at 4 segments runs in CI
    def test_packed_rows_with_initial_state_more_ops(self, op, segments):
        self.check_packed_rows(op, segments)

    def check_packed_rows(self, op, segments):
        # T = 300: 5 chunks padded to 8 (two per segment at P = 4); documents of 60, 100, 75
        # and 65 tokens, so boundaries fall inside segments and chunks.
        segment_ids = jnp.asarray(np.repeat(np.arange(4), [60, 100, 75, 65])[None], jnp.int32)
        with mock.patch.dict(kernel_gpu.TUNING, {"segments": segments}):
            self.check(op, seq_len=300, segment_ids=segment_ids, seed=7)

    @pytest.mark.slow  # ~20 s on 2 cores; the reference checks above run in CI
    def test_equals_unsegmented_with_residual_cotangent(self):
        inputs, cot_seed = _inputs(8, 2, 200, 2, 2, 64)
        ids = np.repeat(np.arange(3), [70, 64, 66])
        segment_ids = jnp.asarray(np.stack([ids, ids[::-1]]), jnp.int32)
        names = _DIFF_ARGS["gdn"]

        def run(segments):
            jax.clear_caches()
            with mock.patch.dict(kernel_gpu.TUNING, {"segments": segments}):
                return _gdn_with_residual(inputs, segment_ids, cot_seed)

        cut, whole = run(4), run(1)
        tol = dict(rtol=2e-5, atol=2e-5)
        for what, got, want in zip(("o", "final_state", "u"), cut[0], whole[0]):
            np.testing.assert_allclose(got, want, err_msg=what, **tol)
        for name, got, want in zip(names, cut[1], whole[1]):
            scale = float(jnp.max(jnp.abs(want))) + 1e-6
            np.testing.assert_allclose(got / scale, want / scale, err_msg=f"d{name}", **tol)

    def test_num_segments_rule(self):
        tuning = dict(kernel_gpu.TUNING, segments=None)
        # 350M GDN (8 value heads of 64): one 32K row -> 16 segments of 32 chunks; B=8 at 4K
        # (64 programs) -> 2; S2 (32 programs) -> 4; S1 (256 programs) -> none; short rows
        # are never cut below MIN_SEGMENT_CHUNKS chunks per segment.
        self.assertEqual(kernel_gpu.num_segments(1, 8, 64, 512, tuning), 16)
        self.assertEqual(kernel_gpu.num_segments(8, 8, 64, 64, tuning), 2)
        self.assertEqual(kernel_gpu.num_segments(1, 16, 128, 512, tuning), 4)
        self.assertEqual(kernel_gpu.num_segments(8, 16, 128, 64, tuning), 1)
        self.assertEqual(kernel_gpu.num_segments(1, 8, 64, 16, tuning), 2)
        self.assertEqual(kernel_gpu.num_segments(1, 8, 64, 15, tuning), 1)
        self.assertEqual(kernel_gpu.num_segments(1, 8, 64, 512, dict(tuning, segments=3)), 3)

    def test_launch_for_resolves_per_head_dim(self):
        tuning = dict(kernel_gpu.TUNING, forward=(4, 2), backward_chunk={64: (4, 2), 128: (8, 2)})
        self.assertEqual(kernel_gpu.launch_for("forward", 128, tuning), (4, 2))
        self.assertEqual(kernel_gpu.launch_for("backward_chunk", 64, tuning), (4, 2))
        self.assertEqual(kernel_gpu.launch_for("backward_chunk", 128, tuning), (8, 2))


class TritonLoweringTest(parameterized.TestCase):
    """Both forward paths lower to Triton on any backend (``jax.export`` for CUDA, no GPU).

    Runs Pallas' Triton lowering rules on every kernel of forward + backward, so an op the
    lowering does not support fails here rather than on the next GPU run.
    """

    @parameterized.parameters((False, 1), (True, 1), (False, 2))
    def test_exports_for_cuda(self, split, segments):
        inputs, _ = _inputs(0, 1, 128, 2, 2, 64, dtype=jnp.bfloat16)
        segment_ids = jnp.asarray(np.repeat(np.arange(2), [50, 78])[None], jnp.int32)

        def fwdbwd(q, k, v, g, beta):
            def f(q, k, v, g, beta):
                return kernel_gpu.scalar_decay_pallas(q, k, v, g, beta, scale=0.125,
                                                      segment_ids=segment_ids)[0]

            o, vjp = jax.vjp(f, q, k, v, g, beta)
            return vjp(o) + (o,)  # o kept live: the split read-out is a kernel of its own

        args = [inputs[n] for n in ("q", "k", "v", "g", "beta")]
        # No jax.clear_caches() needed: scalar_decay_pallas has no inner jit, and its custom_vjp
        # op is built per static configuration, split_forward included.
        with mock.patch.dict(kernel_gpu.TUNING, {"split_forward": split, "segments": segments}), \
                pallas_gpu.abstract_gpu_target():
            exported = jax.export.export(
                jax.jit(fwdbwd), platforms=["cuda"],
                disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(
                    "__gpu$xla.gpu.triton")])(*args)
        text = exported.mlir_module()
        forward = ["gdn_forward_state", "gdn_forward_output"] if split else ["gdn_forward"]
        for name in ["gdn_prepare", *forward, "gdn_backward_state", "gdn_backward_chunk"]:
            self.assertIn(f'name = "{name}"', text)
        self.assertEqual('name = "gdn_forward"' in text, not split)
        self.assertEqual('name = "gdn_segment_transitions"' in text, segments > 1)


@pytest.mark.gpu
class GpuTest(parameterized.TestCase):
    """bf16 inputs compiled by Triton on a GPU, against the fp32 reference (FLA's gates)."""

    def setUp(self):
        super().setUp()
        if jax.default_backend() != "gpu":
            self.skipTest("needs a GPU")

    @parameterized.product(op=OPS, packed=(False, True))
    def test_bf16_against_fp32_reference(self, op, packed):
        self.check_bf16(op, packed)

    @parameterized.parameters("gdn", "simple_gla")
    def test_split_forward_bf16_against_fp32_reference(self, op):
        # The split forward's Triton lowering (forward_state + forward_output), packed rows.
        jax.clear_caches()  # TUNING is read at trace time
        try:
            with mock.patch.dict(kernel_gpu.TUNING, {"split_forward": True}):
                self.check_bf16(op, True)
        finally:
            jax.clear_caches()

    @parameterized.parameters("gdn", "lightning")
    def test_segments_bf16_against_fp32_reference(self, op):
        # Rows of 16 chunks cut into 4 segments (the default cuts these shapes in 2), packed.
        jax.clear_caches()  # TUNING is read at trace time
        try:
            with mock.patch.dict(kernel_gpu.TUNING, {"segments": 4}):
                self.check_bf16(op, True)
        finally:
            jax.clear_caches()

    def check_bf16(self, op, packed):
        seq_len = 1000
        segment_ids = None
        if packed:
            lengths = [100, 257, 64, 300, 279]
            segment_ids = jnp.asarray(np.repeat(np.arange(5), lengths)[None].repeat(2, 0),
                                      jnp.int32)
        inputs, cot_seed = _inputs(0, 2, seq_len, 4, 4, 128, dtype=jnp.bfloat16)
        want = _outputs_and_grads(op, None, inputs, segment_ids, cot_seed)
        got = _outputs_and_grads(op, "pallas", inputs, segment_ids, cot_seed)
        self.assertLess(tolerances.rel_err(got[0], want[0]), 5e-3, "o")
        self.assertLess(tolerances.rel_err(got[1], want[1]), 5e-3, "final_state")
        for name in _DIFF_ARGS[op]:
            limit = 2e-2 if name in ("g", "beta", "log_decay") else 8e-3
            self.assertLess(tolerances.rel_err(got[2][name], want[2][name]), limit, f"d{name}")


if __name__ == "__main__":
    absltest.main()
