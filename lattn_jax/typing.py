"""Shape legend and array aliases shared by the whole codebase.

Every docstring and shape comment in ``lattn_jax`` and ``pallas_kernels`` uses these letters:

====  ==========================================================
B     batch size
T     time (sequence length, tokens)
H     heads (for delta-rule mixers: value heads unless stated)
HK    key/query heads when they differ from value heads (GVA/GQA)
K     key (and query) head dimension ``d_k``
V     value head dimension ``d_v``
D     model width ``d_model``
F     MLP hidden width
C     chunk size
N     number of chunks (``T / C`` after padding)
W     short-convolution width
S     vocabulary size
====  ==========================================================

Recurrent states use the FLA layout ``[B, H, K, V]`` (key-major); the read-out is
``o_t = S_t^T q_t``.
"""

from typing import Any

import jax

Array = jax.Array
PRNGKey = jax.Array
PyTree = Any
