"""No Mosaic GPU kernel of ours reduces over the rows of a register array (CI, CPU, tracing only).

A sum (or max, min) over a non-minor axis of a WGMMA-layout array crosses warps, and Mosaic GPU
lowers it through one SMEM scratch view at a fixed offset (``reduction_scratch_bytes``, jax's
``ModuleContext.scratch_view``). In a kernel of two or more warpgroups every warpgroup runs the
same code on that one buffer at once: a data race. K2's two column sums did exactly this and gave
wrong ``dg`` on the H100 in channel groups that changed from run to run (MOSAIC_GPU.md Sec. 43),
while interpret mode, which runs a warpgroup as one thread, could not show it. Reductions along
the minor (last) axis of a 2-D tile stay within a warp (shuffles, no scratch) and are allowed;
a sum of a rank-1 vector (one value per row or column) is not.

The check walks the jaxpr of each op (``jax.make_jaxpr`` on the CPU host: nothing is lowered
or run), enters every kernel body (the ``mpmd_map`` / ``pallas_call`` equations' jaxprs) and
lists each reduction over an axis other than the last of an array of rank 2 or more.
"""

import functools

import jax
import jax.numpy as jnp
from absl.testing import absltest, parameterized
from jax.extend import core as jcore

from pallas_kernels.common import channelwise_grad_mosaic_gpu as kgm
from pallas_kernels.gated_delta_rule import mosaic_vjp

_KERNEL_CALLS = ("mpmd_map", "pallas_call")
_REDUCTIONS = ("reduce_sum", "reduce_max", "reduce_min", "reduce_and", "reduce_or",
               "argmax", "argmin")


def sub_jaxprs(eqn):
    """The jaxprs in ``eqn``'s parameters (kernel bodies, loop and branch bodies)."""
    for value in eqn.params.values():
        for sub in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(sub, jcore.ClosedJaxpr):
                yield sub.jaxpr
            elif isinstance(sub, jcore.Jaxpr):
                yield sub


def row_reductions(jaxpr, in_kernel=False):
    """``(kernels entered, [(primitive, shape, axes), ...])``: the in-kernel reductions of
    ``jaxpr`` over an axis other than the last, or of a rank-1 array."""
    kernels, found = 0, []
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if in_kernel and name in _REDUCTIONS:
            shape = eqn.invars[0].aval.shape
            axes = tuple(eqn.params.get("axes", (eqn.params.get("axis"),)))
            # rank 1: a per-row (or per-column) vector spans the warps, so any sum of it does
            if len(shape) == 1 or any(a % len(shape) != len(shape) - 1 for a in axes):
                found.append((name, shape, axes))
        entering = name in _KERNEL_CALLS
        for sub in sub_jaxprs(eqn):
            n, f = row_reductions(sub, in_kernel or entering)
            kernels += n + int(entering and not in_kernel)
            found += f
    return kernels, found


def _bf16(*shape):
    return jax.ShapeDtypeStruct(shape, jnp.bfloat16)


class RowReductionTest(parameterized.TestCase):

    def check(self, fn, *args, min_kernels=1):
        kernels, found = row_reductions(jax.make_jaxpr(fn)(*args).jaxpr)
        self.assertGreaterEqual(kernels, min_kernels, "no Mosaic GPU kernel body was entered")
        self.assertEqual(found, [], "a reduction over the rows inside a Mosaic GPU kernel "
                         "(cross-warp scratch shared by the warpgroups: module docstring)")

    @parameterized.parameters(16, 32)
    def test_k1_and_k2(self, slab):
        b, t, h, d = 1, 128, 2, 128
        f32 = jax.ShapeDtypeStruct((b, t, h, d), jnp.float32)
        doc = jax.ShapeDtypeStruct((b, t), jnp.int32)
        k1_args = [_bf16(b, t, h, d)] * 3 + [f32] + [_bf16(b, t, h, d)] * 3
        self.check(lambda *a: kgm.channelwise_grad_intra_mosaic(
            *a[:-1], scale=0.1, doc=a[-1], slab=slab), *k1_args, doc)
        k2_args = ([_bf16(b, t, h, d)] * 2 + [jax.ShapeDtypeStruct((b, t, h, 1), jnp.float32),
                   f32] + [_bf16(b, h, t // 64, d, d)] * 2 + [_bf16(b, t, h, d)] * 3)
        self.check(lambda *a: kgm.channelwise_grad_chunk_mosaic(
            *a[:-1], scale=0.1, doc=a[-1], slab=slab), *k2_args, doc)

    @parameterized.parameters(True, False)
    def test_gdn_default_fwd_bwd(self, gated):
        b, t, h, d = 1, 256, 2, 128

        def loss(q, k, v, g, beta):
            o, _ = mosaic_vjp.gated_delta_rule_mosaic(q, k, v, g if gated else None, beta)
            return o.astype(jnp.float32).sum()

        grad = jax.grad(loss, argnums=(0, 1, 2, 4) + ((3,) if gated else ()))
        g = jax.ShapeDtypeStruct((b, t, h), jnp.float32)
        self.check(grad, *[_bf16(b, t, h, d)] * 3, g, _bf16(b, t, h), min_kernels=3)

    def test_the_check_sees_a_row_sum(self):
        # The walker itself: an in-kernel axis-0 sum is found, an axis-1 one is not.
        from jax.experimental.pallas import mosaic_gpu as plgpu

        def body(x_ref, o_ref, axis):
            o_ref[...] = jnp.sum(x_ref[...], axis=axis)

        for axis, want in ((0, 1), (1, 0)):
            call = plgpu.kernel(functools.partial(body, axis=axis),
                                out_type=jax.ShapeDtypeStruct((64,), jnp.float32),
                                grid=(1,), grid_names=("g",))
            x = jax.ShapeDtypeStruct((64, 64), jnp.float32)
            kernels, found = row_reductions(jax.make_jaxpr(call)(x).jaxpr)
            self.assertEqual((kernels, len(found)), (1, want), (axis, found))


if __name__ == "__main__":
    absltest.main()
