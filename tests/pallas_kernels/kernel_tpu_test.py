"""The Pallas TPU kernels of the delta-rule family against the fp32 token-serial references.

``InterpretTest`` runs the Mosaic kernels (``kernel_tpu.py``, ``common/delta_tpu.py``) in Pallas
TPU interpret mode (``implementation="pallas_tpu"`` off a TPU) on whatever backend runs the
suite, so CI checks the kernel code itself on CPU. Inputs are fp32, so every product runs in
fp32 and outputs, final states and all gradients must match the references to fp32 rounding.
The interpreter compiles slowly (about 20 s per op configuration on CPU), so each case covers
several features at once: T = 65 (a one-token tail chunk) and T = 256, a packed row, an
initial state, strong decay, head dims 64 and 128, GVA. ``LoweringTest`` lowers forward and
backward for the TPU platform (``jax.export``, no TPU needed), which runs the Pallas-to-Mosaic
lowering rules on every kernel. On a TPU, ``TpuTest`` (marked ``tpu``) compiles the kernels and
checks bf16 inputs against the fp32 reference by relative RMS error (FLA's gates).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest, parameterized

from pallas_kernels import gated_delta_rule as gdr
from pallas_kernels import gdn2 as gdn2_ops
from pallas_kernels import kda as kda_ops
from pallas_kernels import simple_gla as sg
from pallas_kernels.common import delta_tpu
from pallas_kernels.gated_delta_rule import reference as gdr_reference
from pallas_kernels.gdn2 import reference as gdn2_reference
from pallas_kernels.kda import reference as kda_reference
from pallas_kernels.simple_gla import reference as sg_reference
from tests import tolerances

_DIFF_ARGS = {
    "gdn": ("q", "k", "v", "g", "beta", "h0"),
    "deltanet": ("q", "k", "v", "beta", "h0"),
    "lightning": ("q", "k", "v", "log_decay", "h0"),
    "kda": ("q", "k", "v", "gk", "beta", "h0"),
    "gdn2": ("q", "k", "v", "gk", "b", "w", "h0"),
}


def _inputs(seed, batch, seq_len, key_heads, heads, dim, *, dtype=jnp.float32, decay=1.0):
    keys = jax.random.split(jax.random.key(seed), 11)

    def l2(x):
        return x / jnp.linalg.norm(x, axis=-1, keepdims=True)

    tok = (batch, seq_len, heads)
    q = l2(jax.random.normal(keys[0], (batch, seq_len, key_heads, dim))).astype(dtype)
    k = l2(jax.random.normal(keys[1], (batch, seq_len, key_heads, dim))).astype(dtype)
    v = jax.random.normal(keys[2], tok + (dim,)).astype(dtype)
    g = decay * jax.nn.log_sigmoid(jax.random.normal(keys[3], tok))
    gk = decay * jax.nn.log_sigmoid(jax.random.normal(keys[4], tok + (dim,)))
    beta = jax.nn.sigmoid(jax.random.normal(keys[5], tok))
    b = jax.nn.sigmoid(jax.random.normal(keys[6], tok + (dim,)))
    w = jax.nn.sigmoid(jax.random.normal(keys[7], tok + (dim,)))
    h0 = 0.5 * jax.random.normal(keys[8], (batch, heads, dim, dim))
    log_decay = -jax.random.uniform(keys[9], (heads,), minval=0.01, maxval=1.0) * decay
    return dict(q=q, k=k, v=v, g=g, gk=gk, beta=beta, b=b, w=w, h0=h0,
                log_decay=log_decay), keys[10]


def _call(op, impl, x, segment_ids):
    """``(o, final_state)`` of ``op`` with implementation ``impl`` (None: fp32 reference)."""
    q, k, v, h0 = x["q"], x["k"], x["v"], x["h0"]
    if impl is None:
        group = v.shape[2] // q.shape[2]
        q, k = (jnp.repeat(a.astype(jnp.float32), group, axis=2) for a in (q, k))
        v = v.astype(jnp.float32)
        kw = dict(scale=q.shape[-1] ** -0.5, initial_state=h0, segment_ids=segment_ids)
        if op in ("gdn", "deltanet"):
            g = x["g"] if op == "gdn" else None
            return gdr_reference.gated_delta_rule_reference(q, k, v, g, x["beta"], **kw)[:2]
        if op == "lightning":
            gate = jnp.broadcast_to(x["log_decay"], x["g"].shape)
            return sg_reference.simple_gla_reference(q, k, v, gate, **kw)
        if op == "kda":
            return kda_reference.kda_reference(q, k, v, x["gk"], x["beta"], **kw)[:2]
        return gdn2_reference.gdn2_reference(q, k, v, x["gk"], x["b"], x["w"], **kw)[:2]
    kw = dict(initial_state=h0, output_final_state=True, segment_ids=segment_ids,
              implementation=impl)
    if op == "gdn":
        return gdr.gated_delta_rule(q, k, v, x["g"], x["beta"], **kw)
    if op == "deltanet":
        return gdr.delta_rule(q, k, v, x["beta"], **kw)
    if op == "lightning":
        return sg.lightning_attention(q, k, v, x["log_decay"], **kw)
    if op == "kda":
        return kda_ops.kda(q, k, v, x["gk"], x["beta"], **kw)
    return gdn2_ops.gdn2(q, k, v, x["gk"], x["b"], x["w"], **kw)


def _outputs_and_grads(op, impl, inputs, segment_ids, cot_key):
    names = _DIFF_ARGS[op]

    def run(*diff):
        return tuple(_call(op, impl, dict(inputs, **dict(zip(names, diff))), segment_ids))

    (o, s), vjp = jax.vjp(run, *[inputs[n] for n in names])
    keys = jax.random.split(cot_key, 2)
    do = jax.random.normal(keys[0], o.shape).astype(o.dtype)
    ds = jax.random.normal(keys[1], s.shape)
    return o, s, dict(zip(names, vjp((do, ds))))


def _packed(lengths, batch=1):
    ids = np.repeat(np.arange(len(lengths)), lengths)[None].repeat(batch, 0)
    return jnp.asarray(ids, jnp.int32)


class InterpretTest(parameterized.TestCase):
    """fp32 inputs in TPU interpret mode: the kernels equal the reference to fp32 rounding."""

    def check(self, op, *, batch=1, seq_len=65, key_heads=2, heads=2, dim=64, decay=1.0,
              segment_ids=None, seed=0):
        inputs, cot_key = _inputs(seed, batch, seq_len, key_heads, heads, dim, decay=decay)
        want = _outputs_and_grads(op, None, inputs, segment_ids, cot_key)
        got = _outputs_and_grads(op, "pallas_tpu", inputs, segment_ids, cot_key)
        tol = tolerances.fwd_tol(jnp.float32)
        np.testing.assert_allclose(got[0], want[0], err_msg=f"{op} o", **tol)
        np.testing.assert_allclose(got[1], want[1], err_msg=f"{op} final_state", **tol)
        gtol = tolerances.grad_tol(jnp.float32)
        for name in _DIFF_ARGS[op]:
            scale = float(jnp.max(jnp.abs(want[2][name]))) + 1e-6
            np.testing.assert_allclose(got[2][name] / scale, want[2][name] / scale,
                                       err_msg=f"{op} d{name}", **gtol)

    @pytest.mark.slow  # ~30 s on 2 cores under load; the other TPU interpret checks run in CI
    def test_gdn_packed_strong_decay_gva(self):
        # T = 256 (four chunks), five documents with boundaries inside and on chunk edges,
        # log-decays down to about -20 per token, two value heads per key head.
        lengths = [10, 54, 3, 100, 89]
        self.check("gdn", seq_len=256, key_heads=1, heads=2, decay=8.0,
                   segment_ids=_packed(lengths), seed=1)

    @pytest.mark.slow  # head dim 128: the 64 variants cover the code in CI
    def test_deltanet_ragged_head_dim_128(self):
        # No decay; T = 65: one full chunk and a one-token tail; K = V = 128.
        self.check("deltanet", seq_len=65, key_heads=1, heads=1, dim=128, seed=2)

    @pytest.mark.slow  # ~17 s on 2 cores
    def test_lightning_ragged(self):
        # The delta rule off (fixed per-head decay), batch of two rows.
        self.check("lightning", seq_len=65, batch=2, key_heads=1, heads=2, seed=3)

    @pytest.mark.slow  # ~13 s on 2 cores
    def test_kda_ragged_strong_decay(self):
        # Per-channel log-decays down to about -20 per token: the exponents of the intra-chunk
        # matrices must stay <= 0 (sub-block reference points) and be masked before exp.
        self.check("kda", seq_len=65, decay=8.0, key_heads=1, heads=2, seed=4)

    @pytest.mark.slow  # head dim 128: the 64 variants cover the code in CI
    def test_gdn2_packed_head_dim_128(self):
        lengths = [70, 1, 57, 128]
        self.check("gdn2", seq_len=256, key_heads=1, heads=1, dim=128,
                   segment_ids=_packed(lengths), seed=5)

    def test_dispatch(self):
        inputs, _ = _inputs(0, 1, 64, 1, 1, 64)
        q, k, v = inputs["q"], inputs["k"], inputs["v"]
        if jax.default_backend() != "tpu":
            # "auto" never picks the TPU kernels off a TPU.
            np.testing.assert_array_equal(
                kda_ops.kda(q, k, v, inputs["gk"], inputs["beta"])[0],
                kda_ops.kda(q, k, v, inputs["gk"], inputs["beta"], implementation="chunked")[0])
        with self.assertRaisesRegex(ValueError, "head dim 32"):
            gdn2_ops.gdn2(q[..., :32], k[..., :32], v, inputs["gk"][..., :32],
                          inputs["b"][..., :32], inputs["w"], implementation="pallas_tpu")
        with self.assertRaisesRegex(ValueError, "chunk_size=32"):
            gdr.delta_rule(q, k, v, inputs["beta"], chunk_size=32, implementation="pallas_tpu")
        with self.assertRaisesRegex(ValueError, "not available"):
            kda_ops.kda(q, k, v, inputs["gk"], inputs["beta"], implementation="triton")


class LoweringTest(parameterized.TestCase):
    """Forward and backward lower to Mosaic for the TPU platform (no TPU needed)."""

    @parameterized.parameters(("scalar", True, True, 64), ("channel", False, True, 128),
                              ("scalar", False, False, 64))
    def test_lowers_for_tpu(self, decay, packed, delta, chunk):
        inputs, _ = _inputs(0, 1, 128, 1, 1, 128, dtype=jnp.bfloat16)
        q, k, v = inputs["q"], inputs["k"], inputs["v"]
        g = inputs["g"] if decay == "scalar" else inputs["gk"]
        seg = _packed([50, 78]) if packed else None

        def loss(q, k, v, g, h0):
            o, s, u = delta_tpu.delta_rule_tpu(
                q, k, k if delta else None, v, g, scale=0.1, initial_state=h0, segment_ids=seg,
                chunk_size=chunk, mm_dtype=jnp.bfloat16, interpret=False)
            return jnp.sum(o.astype(jnp.float32)) + jnp.sum(s) + jnp.sum(u)

        fn = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4)))
        exported = jax.export.export(fn, platforms=["tpu"])(q, k, v, g, inputs["h0"])
        text = exported.mlir_module()
        for name in ("prepare", "forward", "backward_state", "backward_chunk"):
            self.assertIn(f"delta_tpu_{name}", text)


@pytest.mark.tpu
class TpuTest(parameterized.TestCase):
    """bf16 inputs compiled by Mosaic on a TPU, against the fp32 reference (FLA's gates)."""

    def setUp(self):
        super().setUp()
        if jax.default_backend() != "tpu":
            self.skipTest("needs a TPU")

    @parameterized.product(op=tuple(_DIFF_ARGS), packed=(False, True), dim=(64, 128))
    def test_bf16_against_fp32_reference(self, op, packed, dim):
        seq_len = 1000
        segment_ids = _packed([100, 257, 64, 300, 279], batch=2) if packed else None
        inputs, cot_key = _inputs(0, 2, seq_len, 2, 4, dim, dtype=jnp.bfloat16)
        want = _outputs_and_grads(op, None, inputs, segment_ids, cot_key)
        got = _outputs_and_grads(op, "pallas_tpu", inputs, segment_ids, cot_key)
        self.assertLess(tolerances.rel_err(got[0], want[0]), 5e-3, "o")
        self.assertLess(tolerances.rel_err(got[1], want[1]), 5e-3, "final_state")
        for name in _DIFF_ARGS[op]:
            limit = 2e-2 if name in ("g", "gk", "beta", "b", "w", "log_decay") else 8e-3
            self.assertLess(tolerances.rel_err(got[2][name], want[2][name]), limit, f"d{name}")


if __name__ == "__main__":
    absltest.main()
