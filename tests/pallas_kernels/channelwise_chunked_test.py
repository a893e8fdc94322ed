"""The shared per-channel-decay chunk form against the KDA ``lax.scan`` recurrence in fp64."""

import jax
import numpy as np
from absl.testing import absltest

from pallas_kernels.common import channelwise_chunked
from pallas_kernels.kda import reference


class ChannelwiseChunkedTest(absltest.TestCase):

    def test_equals_the_scan_recurrence_across_documents(self):
        with jax.enable_x64(True):
            rng = np.random.default_rng(0)
            b, t, h, kd, vd = 2, 37, 2, 8, 4  # T not a multiple of the chunk: padded tail
            q, k = (rng.standard_normal((b, t, h, kd)) for _ in range(2))
            k /= np.linalg.norm(k, axis=-1, keepdims=True)
            v = rng.standard_normal((b, t, h, vd))
            g = -rng.uniform(0.01, 0.5, (b, t, h, kd))
            beta = rng.uniform(0.1, 0.9, (b, t, h))
            s0 = rng.standard_normal((b, h, kd, vd))
            seg = np.array([[0] * 20 + [1] * 17, [0] * 9 + [1] * 28])
            ref = reference.kda_reference(q, k, v, g, beta, scale=kd ** -0.5, initial_state=s0,
                                          segment_ids=seg)
            kr, vw = beta[..., None] * k, beta[..., None] * v
            got = channelwise_chunked.channelwise_delta_chunked(
                q, k, kr, vw, g, scale=kd ** -0.5, initial_state=s0, segment_ids=seg,
                chunk_size=16)
        for name, x, y in zip(("o", "final_state", "u"), got, ref):
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-5,
                                       err_msg=name)


if __name__ == "__main__":
    absltest.main()
