"""Gated DeltaNet-2, GDN-2 (paper arXiv 2607.07953, Eqs. 21-24; spec §2.6).

See ``api.py`` for the math, the argument conventions and an example.
"""

# Public op: validates, expands GVA heads and dispatches on ``implementation``.
from pallas_kernels.gdn2.api import gdn2  # noqa: F401

# The forms behind the op (fp32 out, H heads already expanded, no validation).
from pallas_kernels.gdn2.associative import gdn2_associative  # noqa: F401
from pallas_kernels.gdn2.chunked import gdn2_chunked  # noqa: F401
from pallas_kernels.gdn2.reference import gdn2_reference  # noqa: F401
