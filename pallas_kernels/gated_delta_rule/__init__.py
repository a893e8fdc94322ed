"""Gated DeltaNet and DeltaNet (paper arXiv 2607.07953, Sec. 3.2, Eqs. 14-17).

See ``api.py`` for the math, the argument conventions and an example.
"""

# Public ops: validate, expand GVA heads and dispatch on ``implementation``.
from pallas_kernels.gated_delta_rule.api import delta_rule  # noqa: F401
from pallas_kernels.gated_delta_rule.api import gated_delta_rule  # noqa: F401

# The forms behind the ops (fp32 in and out, H heads already expanded, no validation).
from pallas_kernels.gated_delta_rule.chunked import gated_delta_rule_chunked  # noqa: F401
from pallas_kernels.gated_delta_rule.reference import gated_delta_rule_reference  # noqa: F401
