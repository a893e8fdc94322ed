"""Kimi Delta Attention, KDA (paper arXiv 2607.07953, Eqs. 18-20; spec §2.4).

See ``api.py`` for the math, the argument conventions and an example.
"""

# Public op: validates, expands GVA heads and dispatches on ``implementation``.
from pallas_kernels.kda.api import kda  # noqa: F401

# The forms behind the op (fp32 out, H heads already expanded, no validation).
from pallas_kernels.kda.associative import kda_associative  # noqa: F401
from pallas_kernels.kda.chunked import kda_chunked  # noqa: F401
from pallas_kernels.kda.reference import kda_reference  # noqa: F401
