"""Linear-attention ops for JAX: token-serial references, chunked forms and kernels.

This package imports only ``jax`` (never flax or ``lattn_jax``), so the ops can be reused
outside the model code. Each variant lives in its own sub-package with fixed file roles:

* ``reference.py``: the token-by-token ``lax.scan`` recurrence in fp32 (ground truth);
* ``chunked.py``: the pure-JAX chunkwise (WY/UT) form used for training on any backend;
* ``associative.py``: the parallel-scan form, where one applies;
* ``kernel_gpu.py`` / ``kernel_tpu.py``: the op's Pallas kernels with their custom VJP, or its
  thin entry into kernels that several ops share;
* ``api.py``: the public op, which validates its inputs and dispatches on ``implementation``.

``common/`` holds what more than one op uses, under public names: validation, padding and
dispatch helpers, the kernels' shared math, and the forms and kernels that serve several ops
(``channelwise_chunked.py`` and ``channelwise_gpu.py`` for KDA and GDN-2, ``delta_tpu.py`` for
every op on TPUs). ``common/`` imports no op package, and no package uses another's private
names (``tests/layout_test.py``).
"""
