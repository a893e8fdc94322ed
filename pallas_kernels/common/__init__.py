"""Utilities shared by every op in ``pallas_kernels``: validation, padding and dispatch."""

from pallas_kernels.common.validation import (  # noqa: F401
    IMPLEMENTATIONS,
    check_array,
    check_arrays,
    check_chunk_size,
    check_op_inputs,
    check_rank,
    check_scale,
    check_shape,
    effective_chunk_size,
    LOG_DECAY_FLOOR,
    expand_key_heads,
    floor_log_decay,
    floor_log_decay_grad,
    l2_normalize,
    document_index,
    pad_time,
    resolve_implementation,
)
