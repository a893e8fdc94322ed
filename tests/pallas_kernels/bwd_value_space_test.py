"""The value-space chunk-local GDN backward (MOSAIC_GPU.md Sec. 31.4 step 1) against autodiff.

:func:`pallas_kernels.gated_delta_rule.bwd_value_space.chunk_bwd_value_space` runs the
equations planned for the fused backward kernel (Sec. 31.3). Its inputs ``h``, ``v_new``
(forward) and ``dh``, ``dv_new`` (reverse state pass) come from ``jax.vjp`` of a chunk form with
additive perturbations ``e`` (of the state leaving each chunk) and ``f`` (of ``v_new``); the
gradients it returns are compared with ``jax.vjp`` of the whole forward w.r.t.
``q, k, v, g, beta``:

- ``Fp32Test``: the repo's fp32 references: ``h``, ``v_new``, ``dh``, ``dv_new`` from
  ``kernel_mosaic_gdn_test.chunk_form_with_residuals`` (the Mosaic tests' fp32 chunk form), the
  reference gradients from ``jax.vjp`` of
  :func:`pallas_kernels.gated_delta_rule.chunked.gated_delta_rule_chunked`; relative RMS error
  < 1e-4.
  ``T0`` from ``kernel_mosaic_gpu.kkt_inverse_xla`` (the XLA twin of the ``T0`` kernel).
- ``Fp64Test``: the same check in fp64 (``jax.enable_x64``) against :func:`_chunk_form64`,
  a dtype-generic chunk form written here from ``chunked.py``'s UT equations (the repo's
  references compute in fp32 only); relative error (max abs error over max abs value)
  < 1e-10. It also checks that :func:`_chunk_form64`'s gradients equal
  ``chunked.gated_delta_rule_chunked``'s (fp32, < 1e-4), so the fp64 reference is the same
  function.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized

from pallas_kernels import common
from pallas_kernels.gated_delta_rule import bwd_value_space as bvs
from pallas_kernels.gated_delta_rule import chunked
from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu as kgd
from tests import tolerances
from tests.pallas_kernels import kernel_mosaic_gdn_test as gdn_test

_HI = jax.lax.Precision.HIGHEST
C = 64
_NAMES = ("dq", "dk", "dv", "dbeta", "dg")

# name, B, T, H, Hk, K, V, decay (None: DeltaNet), document lengths (the rest one more document)
_CASES = (
    ("gated_T128_K32", 2, 128, 2, 2, 32, 32, 0.1, None),
    ("deltanet_packed_T130_K32", 1, 130, 2, 2, 32, 32, None, (10, 60)),
    ("gated_packed_partial_T100_K32", 1, 100, 2, 2, 32, 32, 0.1, (10, 60)),
    ("strong_decay_partial_T65_K32", 1, 65, 2, 2, 32, 32, 5.0, None),
    ("gva_packed_partial_T150_K64", 1, 150, 4, 2, 64, 64, 0.05, (10, 60)),
    ("gva_doc_at_chunk_start_T192_K32", 1, 192, 2, 1, 32, 32, 0.1, (64, 36, 30)),
)


def _inputs(batch, seq_len, heads, kv_heads, dk, dv, decay, docs, dtype, seed=0):
    """Random ``q, k`` (L2-normalised, ``Hk`` heads), ``v``, ``g`` (``-decay U(0, 1)``, ``None``
    for DeltaNet), ``beta`` in (0.1, 0.9), ``h0``, ``segment_ids``, ``do``, ``dht``, in
    ``dtype`` (numpy draws: the same values in fp32 and fp64)."""
    rng = np.random.default_rng(seed)
    q, k = (rng.standard_normal((batch, seq_len, kv_heads, dk)) for _ in range(2))
    q /= np.linalg.norm(q, axis=-1, keepdims=True)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((batch, seq_len, heads, dv))
    g = None if decay is None else -decay * rng.uniform(0.0, 1.0, (batch, seq_len, heads))
    beta = rng.uniform(0.1, 0.9, (batch, seq_len, heads))
    h0 = rng.standard_normal((batch, heads, dk, dv))
    do = rng.standard_normal((batch, seq_len, heads, dv))
    dht = rng.standard_normal((batch, heads, dk, dv))
    seg = None
    if docs is not None:
        lengths = list(docs) + [seq_len - sum(docs)]
        ids = np.repeat(np.arange(len(lengths)) % 2 + 3, lengths)
        seg = jnp.asarray(np.repeat(ids[None], batch, 0), jnp.int32)
    arrs = [None if x is None else jnp.asarray(x, dtype) for x in (q, k, v, g, beta, h0, do, dht)]
    return (*arrs, seg)


def _jit(fn, **static):
    """``fn`` jitted, with the keyword arguments ``static`` bound (Python numbers). The
    functions compared here are pure ``jnp`` code; eager they ran op by op (the chunk loops
    unrolled into hundreds of dispatches and small compiles), jitted each is one program: the
    same equations, about 3x faster on the CPU tests."""
    return jax.jit(functools.partial(fn, **static))


def _expand(x, heads):
    return jnp.repeat(x, heads // x.shape[2], axis=2)


def _group_sum(x, kv_heads):
    return x.reshape(x.shape[:2] + (kv_heads, -1) + x.shape[3:]).sum(axis=3)


def _chunk_form64(q, k, v, g, beta, h0, e, f, seg, scale):
    """Dtype-generic chunk form (``chunked.py``'s UT equations, chunks of 64, a Python loop):
    ``((o, final_state), (h, v_new))`` with the perturbations ``e`` ``[B, H, N, K, V]`` (added
    to the state leaving chunk ``n``) and ``f`` ``[B, T, H, V]`` (added to ``v_new``), so
    ``jax.vjp`` w.r.t. them gives ``dh`` and the total ``dv_new``. ``q, k`` value heads."""
    batch, seq_len, heads, _ = k.shape
    n_chunks = e.shape[2]
    pad = n_chunks * C - seq_len

    def p(x):
        return jnp.pad(x, ((0, 0), (0, pad)) + ((0, 0),) * (x.ndim - 2))

    q, k, v, beta, f = (p(x) for x in (q, k, v, beta, f))
    g = jnp.zeros_like(beta) if g is None else p(g)
    ids = jnp.zeros((batch, seq_len), jnp.int32) if seg is None else seg
    doc = jnp.pad(common.document_index(ids), ((0, 0), (0, pad)), mode="edge")
    idx = jnp.arange(C)
    s, outs, states, vns = h0, [], [], []
    for n in range(n_chunks):
        sl = slice(n * C, (n + 1) * C)
        dc = doc[:, sl]
        prev = dc[:, :1] if n == 0 else doc[:, n * C - 1:n * C]
        conn = (dc == prev)[:, :, None]  # [B, C, 1]
        last = (dc == dc[:, -1:])[:, :, None]
        same = (dc[:, :, None] == dc[:, None, :])[..., None]  # [B, t, s, 1]
        gn = g[:, sl]  # [B, C, H]
        gam = jnp.cumsum(gn, axis=1)
        segsum = jnp.cumsum(jnp.where((idx[:, None] > idx[None, :])[None, :, :, None],
                                      gn[:, :, None, :], 0.0), axis=1)  # [B, t, s, H]
        dmat = jnp.where((idx[:, None] >= idx[None, :])[None, :, :, None] & same,
                         jnp.exp(segsum), 0.0)
        kn, qn, bn = k[:, sl], q[:, sl], beta[:, sl]
        kk = jnp.einsum("bthk,bshk->btsh", kn, kn, precision=_HI)
        a = jnp.where((idx[:, None] > idx[None, :])[None, :, :, None],
                      bn[:, :, None, :] * kk * dmat, 0.0)
        a = jnp.moveaxis(a, 3, 1)  # [B, H, t, s]
        eye = jnp.broadcast_to(jnp.eye(C, dtype=a.dtype), a.shape)
        x = jax.scipy.linalg.solve_triangular(eye + a, eye, lower=True, unit_diagonal=True)
        e_in = jnp.where(conn, jnp.exp(gam), 0.0)  # [B, C, H]
        u = jnp.einsum("bhts,bshv->bthv", x, bn[..., None] * v[:, sl], precision=_HI)
        w = jnp.einsum("bhts,bshk->bthk", x, (bn * e_in)[..., None] * kn, precision=_HI)
        states.append(s)
        vn = u - jnp.einsum("bthk,bhkv->bthv", w, s, precision=_HI) + f[:, sl]
        vns.append(vn)
        qk = jnp.einsum("bthk,bshk->btsh", qn, kn, precision=_HI) * dmat
        o = (jnp.einsum("bthk,bhkv->bthv", qn * e_in[..., None], s, precision=_HI)
             + jnp.einsum("btsh,bshv->bthv", qk, vn, precision=_HI))
        outs.append(scale * o)
        e_out = jnp.where(last, jnp.exp(segsum[:, -1]), 0.0)  # [B, C, H]
        keep = jnp.where(conn[:, -1], jnp.exp(gam[:, -1]), 0.0)  # [B, H]
        s = (keep[..., None, None] * s
             + jnp.einsum("bthk,bthv->bhkv", kn * e_out[..., None], vn, precision=_HI)
             + e[:, :, n])
    o = jnp.concatenate(outs, axis=1)[:, :seq_len]
    v_new = jnp.concatenate(vns, axis=1)[:, :seq_len]
    return (o, s), (jnp.stack(states, axis=2), v_new)


def _value_space_inputs_and_ref64(q, k, v, g, beta, h0, do, dht, seg, scale):
    """``(h, v_new, dh, dv_new)`` and the reference ``(dq, dk, dv, dbeta, dg)`` by ``jax.vjp``
    of :func:`_chunk_form64` (one vjp: the perturbations give ``dh`` and ``dv_new``)."""
    batch, seq_len, heads, dv = v.shape
    dk = k.shape[3]
    n_chunks = -(-seq_len // C)
    e0 = jnp.zeros((batch, heads, n_chunks, dk, dv), v.dtype)
    f0 = jnp.zeros_like(v)
    gf = jnp.zeros_like(beta) if g is None else g

    def fn(qf, kf, vf, gg, bf, e, f):
        return _chunk_form64(qf, kf, vf, None if g is None else gg, bf, h0, e, f, seg, scale)

    _, vjp, (h, v_new) = jax.vjp(fn, _expand(q, heads), _expand(k, heads), v, gf, beta, e0, f0,
                                 has_aux=True)
    dq, dk_, dv_, dg, dbeta, dh, dvn = vjp((do, dht))
    kv = q.shape[2]
    want = (_group_sum(dq, kv), _group_sum(dk_, kv), dv_, dbeta, None if g is None else dg)
    return (h, v_new, dh, dvn), want


def _chunked_grads32(q, k, v, g, beta, h0, do, dht, seg, scale):
    """``(dq, dk, dv, dbeta, dg)`` by ``jax.vjp`` of ``chunked.gated_delta_rule_chunked``."""
    heads = v.shape[2]

    def fn(qf, kf, vf, gf, bf):
        o, final, _ = chunked.gated_delta_rule_chunked(
            qf, kf, vf, None if g is None else gf, bf, scale=scale, initial_state=h0,
            segment_ids=seg)
        return o, final

    gf = jnp.zeros_like(beta) if g is None else g
    _, vjp = jax.vjp(fn, _expand(q, heads), _expand(k, heads), v, gf, beta)
    dq, dk, dv, dg, dbeta = vjp((do, dht))
    kv = q.shape[2]
    return _group_sum(dq, kv), _group_sum(dk, kv), dv, dbeta, None if g is None else dg


def _fp32_inputs(q, k, v, g, beta, h0, do, dht, seg, scale):
    """``(h, v_new, dh, dv_new)`` from the Mosaic tests' fp32 chunk form
    (``gdn_test.chunk_form_with_residuals``, ``W, U`` from ``chunked.wy_representation``)."""
    batch, seq_len, heads, dv = v.shape
    dk = k.shape[3]
    n_chunks = -(-seq_len // C)
    qf, kf = _expand(q, heads), _expand(k, heads)
    w, u = chunked.wy_representation(kf, v, g, beta, segment_ids=seg)
    w, u = w[:, :seq_len], u[:, :seq_len]

    def fn(e, f):
        return gdn_test.chunk_form_with_residuals(qf, kf, w, u, g, seg, h0, e, f, scale)

    _, vjp, (h, v_new) = jax.vjp(fn, jnp.zeros((batch, heads, n_chunks, dk, dv)),
                                 jnp.zeros_like(v), has_aux=True)
    dh, dvn = vjp((do, dht))
    return h, v_new, dh, dvn


def max_rel_err(got, want):
    """``max |got - want| / max |want|`` (fp64 numpy)."""
    a, b = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def _compare(test, got, want, max_err, err_fn, skip=()):
    errs = {}
    for name, x, y in zip(_NAMES, got, want):
        if y is None:
            test.assertIsNone(x, msg=name)
            continue
        test.assertEqual(x.shape, y.shape, msg=name)
        errs[name] = err_fn(x, y)
        if name not in skip:
            test.assertLess(errs[name], max_err.get(name, max_err["*"]),
                            msg=f"{name}: error {errs[name]:.2e} ({errs})")
    return errs


class Fp64Test(parameterized.TestCase):
    """fp64: the value-space gradients equal autodiff of the chunk form to rounding."""

    @parameterized.named_parameters(*_CASES)
    def test_matches_chunk_form_vjp(self, batch, seq_len, heads, kv_heads, dk, dv, decay, docs):
        with jax.enable_x64(True):
            q, k, v, g, beta, h0, do, dht, seg = _inputs(
                batch, seq_len, heads, kv_heads, dk, dv, decay, docs, jnp.float64)
            scale = dk ** -0.5
            # Eager: jitted in fp64, the T192 GVA case's program never finished on XLA:CPU
            # (jax 0.10.2; a deadlock at run time, no CPU used).
            (h, v_new, dh, dvn), want = _value_space_inputs_and_ref64(
                q, k, v, g, beta, h0, do, dht, seg, scale)
            got = _jit(bvs.chunk_bwd_value_space, scale=scale)(
                q, k, v, g, beta, do, v_new, dvn, None, h, dh, segment_ids=seg)
            self.assertEqual(got[0].dtype, jnp.float64)
            errs = _compare(self, got, want, {"*": 1e-10}, max_rel_err)
            print(f"fp64 {self._testMethodName}: "
                  + ", ".join(f"{n} {e:.1e}" for n, e in errs.items()))

    @parameterized.named_parameters(_CASES[2], _CASES[4])
    def test_fp64_reference_is_the_chunked_form(self, batch, seq_len, heads, kv_heads, dk, dv,
                                                decay, docs):
        args = _inputs(batch, seq_len, heads, kv_heads, dk, dv, decay, docs, jnp.float32)
        q, k, v, g, beta, h0, do, dht, seg = args
        scale = dk ** -0.5
        want = _chunked_grads32(q, k, v, g, beta, h0, do, dht, seg, scale)
        _, got = _value_space_inputs_and_ref64(q, k, v, g, beta, h0, do, dht, seg, scale)
        _compare(self, got, want, {"*": 1e-4}, tolerances.rel_err)


class Fp32Test(parameterized.TestCase):
    """fp32, the repo's references; ``T0`` from ``kgd.kkt_inverse_xla``."""

    @parameterized.named_parameters(*_CASES)
    def test_matches_chunked_vjp(self, batch, seq_len, heads, kv_heads, dk, dv, decay, docs):
        q, k, v, g, beta, h0, do, dht, seg = _inputs(
            batch, seq_len, heads, kv_heads, dk, dv, decay, docs, jnp.float32)
        # q, k rounded to bf16 values (exact in fp32): kkt_inverse_xla takes 16-bit keys.
        q, k = (x.astype(jnp.bfloat16).astype(jnp.float32) for x in (q, k))
        scale = dk ** -0.5
        h, v_new, dh, dvn = _jit(_fp32_inputs, scale=scale)(q, k, v, g, beta, h0, do, dht, seg)
        # The T0 kernel's XLA twin takes K in {64, 128} (16-bit k); else T0 is solved inside.
        t0 = (_jit(kgd.kkt_inverse_xla)(k.astype(jnp.bfloat16), beta, segment_ids=seg)
              if dk in (64, 128) else None)
        got = _jit(bvs.chunk_bwd_value_space, scale=scale)(
            q, k, v, g, beta, do, v_new, dvn, t0, h, dh, segment_ids=seg)
        want = _jit(_chunked_grads32, scale=scale)(q, k, v, g, beta, h0, do, dht, seg)
        errs = _compare(self, got, want, {"*": 1e-4}, tolerances.rel_err)
        print(f"fp32 {self._testMethodName}: relative RMS "
              + ", ".join(f"{n} {e:.1e}" for n, e in errs.items()) + "; max "
              + ", ".join(f"{n} {max_rel_err(x, y):.1e}" for n, x, y in zip(_NAMES, got, want)
                          if y is not None))


class ValidationTest(absltest.TestCase):

    def test_rejects_bad_shapes(self):
        q, k, v, g, beta, h0, do, _, _ = _inputs(1, 64, 2, 2, 8, 8, 0.1, None, jnp.float32)
        h = jnp.zeros((1, 2, 1, 8, 8))
        with self.assertRaisesRegex(ValueError, "h must be"):
            bvs.chunk_bwd_value_space(q, k, v, g, beta, do, v, v, None, h[:, :, :, :4], h,
                                      scale=1.0)
        with self.assertRaisesRegex(ValueError, "beta must be"):
            bvs.chunk_bwd_value_space(q, k, v, g, beta[..., :1], do, v, v, None, h, h,
                                      scale=1.0)
        with self.assertRaisesRegex(ValueError, "multiple of Hk"):
            bvs.chunk_bwd_value_space(q, k, v[:, :, :1].repeat(3, 2), g[..., :1].repeat(3, 2),
                                      beta[..., :1].repeat(3, 2), do[:, :, :1].repeat(3, 2),
                                      v[:, :, :1].repeat(3, 2), v[:, :, :1].repeat(3, 2), None,
                                      jnp.zeros((1, 3, 1, 8, 8)), jnp.zeros((1, 3, 1, 8, 8)),
                                      scale=1.0)


if __name__ == "__main__":
    absltest.main()
