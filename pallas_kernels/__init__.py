"""Linear-attention ops for JAX: token-serial references, chunked forms and kernels.

This package imports only ``jax`` (never flax or ``lattn_jax``), so the ops can be reused
outside the model code. Each variant lives in its own sub-package with fixed file roles:

* ``reference.py``: the token-by-token ``lax.scan`` recurrence in fp32 (ground truth);
* ``chunked.py``: the pure-JAX chunkwise (WY/UT) form used for training on any backend;
* ``api.py``: the public op, which validates its inputs and dispatches on ``implementation``.
"""
