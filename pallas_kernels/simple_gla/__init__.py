"""Scalar-decay linear attention: plain linear attention and Lightning Attention.

Plain linear attention: paper arXiv 2607.07953, Eqs. 4-10 (no decay, no normaliser). Lightning
Attention: HypeNet, arXiv 2601.22156 (spec ``hypenet-halo.md`` §1.5, fixed per-head decay). See
``api.py`` for the math, the argument conventions and an example.
"""

# Public ops: validate, expand GVA heads and dispatch on ``implementation``.
from pallas_kernels.simple_gla.api import lightning_attention  # noqa: F401
from pallas_kernels.simple_gla.api import lightning_log_decay  # noqa: F401
from pallas_kernels.simple_gla.api import linear_attention  # noqa: F401
from pallas_kernels.simple_gla.api import simple_gla  # noqa: F401

# The forms behind the ops (fp32 out, H heads already expanded, no validation).
from pallas_kernels.simple_gla.chunked import simple_gla_chunked  # noqa: F401
from pallas_kernels.simple_gla.reference import simple_gla_associative  # noqa: F401
from pallas_kernels.simple_gla.reference import simple_gla_reference  # noqa: F401
