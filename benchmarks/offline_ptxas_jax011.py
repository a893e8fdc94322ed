r"""``offline_ptxas.py`` on jax 0.11's Mosaic GPU lowering (a py3.12 venv; CPU; approximate).

``benchmarks/offline_ptxas.py`` reads each kernel's Mosaic GPU module back from the exported
custom call with jaxlib's ``mosaic_gpu-serde`` pass; on jax 0.11.2 that read fails
(``#gpu<dim x>``: the serialized module keeps an older attribute syntax that only the CUDA
plugin's C++ reader upgrades). This wrapper runs the same binary, flags and pipeline, but takes
each module as jax prints it just before serialization (``core._run_serde_pass`` with
``serialize=True``, in MLIR's generic op form) and rewrites what numba-cuda-mlir 0.6.0's older
MLIR cannot parse (MOSAIC_GPU.md Sec. 24.2):

* the ``layout`` / ``transforms`` attributes of the dialect lowering's dead
  ``unrealized_conversion_cast`` ops (the plugin's canonicalize drops the casts) and
  ``!mosaic_gpu.barrier`` element types in cast chains (as ``i64``, what they wrap);
* ``#gpu.dim<x>`` -> ``#gpu<dim x>``, ``#nvvm.shfl_kind<idx>`` -> ``#nvvm<shfl_kind idx>``;
* ``gpu.barrier``'s ``scope`` (workgroup, the default) and ``gpu.launch``'s twelfth (empty)
  operand group, both newer than 0.6.0.

What differs from the GPU machine: the MLIR/LLVM that lowers to PTX is numba-cuda-mlir's
(2026-10), not jaxlib 0.11.2's, as in ``offline_ptxas.py``; the rewrites above are textual. The
thread and SMEM columns print ``?`` (their regexes read the custom op form); the SMEM count is
the export's (MOSAIC_GPU.md's pins). Modules compiled once in a process are not exported
again (jax's caches): one kernel per entry.

Setup (py3.12 bindings; the 0.10 venv's ``/tmp/ptx-site`` holds cp311 ones)::

    /tmp/jax011/bin/pip install --no-deps --target /tmp/ptx-site312 \
        numba-cuda-mlir==0.6.0 nvidia-cuda-nvcc-cu12==12.9.86

Usage (repository root; the flags are ``offline_ptxas.py``'s)::

    PYTHONPATH=$PWD /tmp/jax011/bin/python benchmarks/offline_ptxas_jax011.py \
        --site=/tmp/ptx-site312 --kernels=k1:16,k2:16,k1:32,k2:32
"""

import os
import re
import sys
from typing import List

if __name__ == "__main__":  # python benchmarks/offline_ptxas_jax011.py from the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

_CAPTURED: List[str] = []

# (pattern, replacement) applied in order to each module's generic-form text.
_REWRITES = (
    (r'("builtin\.unrealized_conversion_cast"\([^)\n]*\)) \{(?:layout|transforms) = [^\n]*\} :',
     r"\1 :"),
    (r"!mosaic_gpu\.barrier", "i64"),
    (r"#gpu\.dim<([xyz])>", r"#gpu<dim \1>"),
    (r"#nvvm\.shfl_kind<(\w+)>", r"#nvvm<shfl_kind \1>"),
    (r'"gpu\.barrier"\(\) <\{scope = #gpu\.barrier_scope<workgroup>\}>', '"gpu.barrier"()'),
    (r'("gpu\.launch"\([^\n]*operandSegmentSizes = array<i32: (?:\d+, ){10}\d+), 0>', r"\1>"),
)


def rewrite_for_upstream(text: str) -> str:
    """``text`` (a Mosaic GPU module printed by jaxlib 0.11.2 in generic op form) with the
    rewrites of the module docstring, for numba-cuda-mlir 0.6.0's parser."""
    for pattern, replacement in _REWRITES:
        text = re.sub(pattern, replacement, text)
    return text


def captured_modules(exported_mlir: str) -> List[str]:
    """Stands in for ``offline_ptxas.mosaic_modules``: the modules serialized since the last
    call (``exported_mlir`` is not read), rewritten by :func:`rewrite_for_upstream`."""
    del exported_mlir
    texts = [rewrite_for_upstream(text) for text in _CAPTURED]
    _CAPTURED.clear()
    return texts


def _install() -> None:
    from jax.experimental.mosaic.gpu import core

    from benchmarks import offline_ptxas
    serde = core._run_serde_pass

    def capturing(module, *, serialize, ir_version=None):
        if serialize:
            _CAPTURED.append(module.operation.get_asm(print_generic_op_form=True))
        return serde(module, serialize=serialize, ir_version=ir_version)

    core._run_serde_pass = capturing
    offline_ptxas.mosaic_modules = captured_modules


if __name__ == "__main__":
    from absl import app

    from benchmarks import offline_ptxas
    from lattn_jax import flag_errors
    _install()
    offline_ptxas._define_flags()
    app.run(offline_ptxas.main, flags_parser=flag_errors.parse_flags)
