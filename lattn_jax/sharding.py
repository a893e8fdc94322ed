"""Meshes, logical axis names and the rules that map them to mesh axes; shard_map wrappers.

One naming system for parameters, activations and kernels (STYLE items 14 and 21-24, after
MaxText's ``logical_axis_rules``):

* every parameter's dimensions get logical names from :data:`PARAM_AXES`, a table of path
  patterns kept here rather than in the modules, so that the model code stays free of sharding
  annotations (:func:`param_logical_axes`; an unmatched parameter of rank >= 2 is an error, so a
  new module must add its row);
* activations are constrained at block boundaries with :func:`constrain` (``ACT_BTD``);
* kernels run inside ``shard_map`` with specs derived from the same names
  (:func:`shard_map_op`: batch and heads are independent in every mixer op);
* one rules table, ``MeshConfig.rules`` (default ``config.DEFAULT_AXIS_RULES``), maps logical
  names to the mesh axes ``("data", "fsdp", "context", "tensor")``; the sequence axis
  (``act_len``) goes to ``context``, whose layers run in :mod:`lattn_jax.context_parallel`.

A dimension that the mapped mesh axes do not divide stays replicated (e.g. 2 key heads on a
4-way tensor axis), so any config runs on any mesh; the cost is only efficiency.

Everything here is a no-op unless :func:`activate` is in effect: a one-device run never sees a
mesh (the trainer's plain single-device path).
"""

import contextlib
import contextvars
import os
import re
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, Tuple

import jax
import numpy as np
from absl import logging
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from lattn_jax import config as config_lib
from lattn_jax.typing import Array, PyTree

Names = Tuple[Optional[str], ...]
Rules = Sequence[Tuple[str, Any]]

# Activation layouts (shape letters of ``lattn_jax.typing``).
ACT_BTD: Names = ("act_batch", "act_len", "act_embed")
ACT_BTS: Names = ("act_batch", "act_len", "act_vocab")
ACT_BT: Names = ("act_batch", "act_len")
ACT_BTH: Names = ("act_batch", "act_len", "act_heads")
ACT_BTHK: Names = ("act_batch", "act_len", "act_heads", None)
ACT_BHKV: Names = ("act_batch", "act_heads", None, None)

# Parameter path patterns (``/``-joined module names, layer indices dropped) -> logical names of
# the leaf's dimensions, first match wins. Leaves of rank <= 1 and the CLER gain that match no
# row are ``"vector"`` along every dimension (replicated by the default rules).
PARAM_AXES: Tuple[Tuple[str, Names], ...] = (
    (r"^embed$", ("vocab", "embed")),                                     # [S, D]
    (r"^head/kernel$", ("embed", "vocab")),                               # [D, S]
    (r"mlp/fc1/kernel$", ("embed", "mlp")),                               # [D, 2F]
    (r"mlp/fc2/kernel$", ("mlp", "embed")),                               # [F, D]
    (r"conv/kernel$", ("conv_width", "heads")),                           # [W, C]
    (r"route/route_proj/kernel$", ("heads", "embed")),                    # [H V, D]
    (r"route/route_down/kernel$", ("heads", "rank")),                     # [H V, r]
    (r"route/route_up/kernel$", ("rank", "embed")),                       # [r, D]
    (r"mixer/(bottleneck_proj|f_down|g_down)/kernel$", ("embed", "rank")),  # [D, r]
    (r"mixer/(f_up|g_up|f_out_proj|g_out_proj)/kernel$", ("rank", "heads")),  # [r, H K]
    (r"mixer/out_proj/kernel$", ("heads", "embed")),                      # [H V, D]
    (r"mixer/(in_proj|qkv_proj|[qkvz]_proj)/kernel$", ("embed", "heads")),  # [D, fused]
    (r"(^|/)gamma$", None),                                               # CLER gain
)
_PARAM_AXES_RE = tuple((re.compile(p), names) for p, names in PARAM_AXES)


def _key_name(key: Any) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def _path_names(path) -> Tuple[str, ...]:
    return tuple(_key_name(k) for k in path)


def logical_axes_for(path: Sequence[str], ndim: int) -> Names:
    """Logical names of one parameter's dimensions, from its path (see :data:`PARAM_AXES`).

    Raises:
      ValueError: if a parameter of rank >= 2 matches no row, or a row has the wrong rank.
    """
    joined = "/".join(p for p in path if not p.isdigit())
    for pattern, names in _PARAM_AXES_RE:
        if pattern.search(joined):
            if names is None:
                return ("vector",) * ndim
            if len(names) != ndim:
                raise ValueError(f"parameter {joined} has rank {ndim}, but PARAM_AXES gives it "
                                 f"the names {names}")
            return names
    if ndim <= 1:
        return ("vector",) * ndim
    raise ValueError(f"parameter {joined} (rank {ndim}) has no logical axis names; add a row "
                     f"to lattn_jax.sharding.PARAM_AXES")


def param_logical_axes(params: PyTree) -> PyTree:
    """A pytree like ``params`` whose leaves are tuples of logical axis names."""
    return jax.tree_util.tree_map_with_path(
        lambda path, leaf: logical_axes_for(_path_names(path), np.ndim(leaf)), params)


# -------------------------------------------------------------------------------------------
# Mesh and specs
# -------------------------------------------------------------------------------------------


def make_mesh(mesh_config: config_lib.MeshConfig,
              devices: Optional[Sequence[Any]] = None) -> jax.sharding.Mesh:
    """The ``MESH_AXES`` (``data, fsdp, context, tensor``) mesh over ``devices`` (default: all).

    Raises:
      ConfigError: if the mesh shape does not match the number of devices.
    """
    devices = jax.devices() if devices is None else list(devices)
    shape = mesh_config.shape(len(devices))
    types = (jax.sharding.AxisType.Auto,) * len(shape)
    return jax.make_mesh(shape, config_lib.MESH_AXES, axis_types=types, devices=devices)


def abstract_mesh(mesh_config: config_lib.MeshConfig, num_devices: int,
                  device_kind: str = "NVIDIA H200",
                  platform: str = "gpu") -> jax.sharding.AbstractMesh:
    """The ``MESH_AXES`` mesh of ``num_devices`` devices that are described, not present.

    For lowering or exporting a program for a machine this one is not (``jax.export`` for N
    GPUs from a host with one GPU or none): :func:`activate` enters it as JAX's abstract mesh,
    and the Pallas GPU kernels read their target from its ``device_kind``. Give the jitted
    function abstract arguments (``jax.ShapeDtypeStruct``) and shardings on this mesh.

    Raises:
      ConfigError: if the mesh does not fit ``num_devices``.
      NotImplementedError: on a JAX without abstract devices.
    """
    from jax._src import mesh as mesh_lib  # AbstractDevice has no public name yet

    device_cls = getattr(mesh_lib, "AbstractDevice", None)
    if device_cls is None:
        raise NotImplementedError(f"jax {jax.__version__} has no abstract devices")
    shape = mesh_config.shape(num_devices)
    device = device_cls(device_kind=device_kind, num_cores=None, platform=platform)
    return jax.sharding.AbstractMesh(shape, config_lib.MESH_AXES,
                                     axis_types=(jax.sharding.AxisType.Auto,) * len(shape),
                                     abstract_device=device)


def _mesh_axes_for(name: Optional[str], rules: Mapping[str, Any]) -> Tuple[str, ...]:
    if name is None:
        return ()
    if name not in rules:
        raise ValueError(f"logical axis {name!r} has no rule; add it to mesh.rules "
                         f"(known: {', '.join(rules)})")
    axes = rules[name]
    if axes is None:
        return ()
    return (axes,) if isinstance(axes, str) else tuple(axes)


def logical_to_spec(names: Names, shape: Sequence[int], mesh: jax.sharding.Mesh,
                    rules: Rules) -> P:
    """The ``PartitionSpec`` of an array with dimension names ``names`` and ``shape``.

    A mesh axis is used at most once per array (the first dimension that asks for it gets it),
    and mesh axes that do not divide a dimension are dropped from it (that dimension is then
    replicated over them).
    """
    rules = dict(rules)
    used = set()
    spec = []
    for name, size in zip(names, shape):
        kept = []
        divisor = 1
        for axis in _mesh_axes_for(name, rules):
            n = mesh.shape[axis]
            if axis in used or n == 1 or size % (divisor * n):
                continue
            kept.append(axis)
            divisor *= n
        used.update(kept)
        spec.append(None if not kept else kept[0] if len(kept) == 1 else tuple(kept))
    return P(*spec)


def param_shardings(params: PyTree, mesh: jax.sharding.Mesh, rules: Rules) -> PyTree:
    """``NamedSharding`` of every parameter (leaves may be arrays or ``ShapeDtypeStruct``)."""
    axes = param_logical_axes(params)
    return jax.tree_util.tree_map(
        lambda leaf, names: NamedSharding(mesh, logical_to_spec(names, leaf.shape, mesh, rules)),
        params, axes, is_leaf=lambda x: isinstance(x, tuple) and all(
            isinstance(n, (str, type(None))) for n in x))


def state_shardings(abstract_state: PyTree, mesh: jax.sharding.Mesh, rules: Rules) -> PyTree:
    """Shardings of a train state ``{"params", "opt_state", "step"}``.

    Parameters follow their logical names. An optimizer-state leaf whose path ends with a
    parameter's path and has the same shape (Adam's moments, Muon's momentum) takes that
    parameter's sharding; every other leaf (counts, NorMuon's reduced second moments, the step)
    is replicated.
    """
    p_sh = param_shardings(abstract_state["params"], mesh, rules)
    by_path = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(abstract_state["params"])[0]:
        sharding = p_sh
        for k in path:
            sharding = sharding[k.key] if hasattr(k, "key") else sharding[k.idx]
        by_path[_path_names(path)] = (tuple(leaf.shape), sharding)
    replicated = NamedSharding(mesh, P())

    def opt_leaf(path, leaf):
        names = _path_names(path)
        for start in range(len(names)):
            hit = by_path.get(names[start:])
            if hit is not None and hit[0] == tuple(np.shape(leaf)):
                return hit[1]
        return replicated

    out = dict(abstract_state)
    out["params"] = p_sh
    out["opt_state"] = jax.tree_util.tree_map_with_path(opt_leaf, abstract_state["opt_state"])
    for key in abstract_state:
        if key not in ("params", "opt_state"):
            out[key] = jax.tree_util.tree_map(lambda _: replicated, abstract_state[key])
    return out


# -------------------------------------------------------------------------------------------
# The active mesh: activation constraints and shard_map
# -------------------------------------------------------------------------------------------

_ACTIVE: contextvars.ContextVar = contextvars.ContextVar("lattn_sharding", default=None)


@contextlib.contextmanager
def activate(mesh: Optional[jax.sharding.Mesh], rules: Rules) -> Iterator[None]:
    """Makes ``mesh`` and ``rules`` current (``jax.set_mesh`` plus our rules) for tracing.

    ``mesh=None`` does nothing, so callers need no branch for the single-device path.
    """
    if mesh is None:
        yield
        return
    token = _ACTIVE.set((mesh, tuple(rules)))
    # An AbstractMesh (devices described, not present: lowering or exporting for a machine
    # this one is not, e.g. jax.export for N GPUs) is entered as the abstract mesh.
    enter = (jax.sharding.use_abstract_mesh if isinstance(mesh, jax.sharding.AbstractMesh)
             else jax.set_mesh)
    try:
        with enter(mesh):
            yield
    finally:
        _ACTIVE.reset(token)


def active_mesh() -> Optional[jax.sharding.Mesh]:
    """The mesh made current by :func:`activate`, or ``None``."""
    active = _ACTIVE.get()
    return None if active is None else active[0]


def rule_axes(name: str) -> Tuple[str, ...]:
    """The mesh axes the active rules map logical name ``name`` to; () without a mesh.

    Raises:
      ValueError: if the active rules have no entry for ``name``.
    """
    active = _ACTIVE.get()
    if active is None:
        return ()
    return _mesh_axes_for(name, dict(active[1]))


def spec_for(names: Names, shape: Sequence[int]) -> Optional[P]:
    """The spec of ``names`` on the active mesh, or ``None`` when no mesh is active."""
    active = _ACTIVE.get()
    if active is None:
        return None
    mesh, rules = active
    return logical_to_spec(names, shape, mesh, rules)


def constrain(x: Array, names: Names) -> Array:
    """``with_sharding_constraint`` of ``x`` to its logical ``names``; identity without a mesh."""
    spec = spec_for(names, x.shape)
    if spec is None:
        return x
    return jax.lax.with_sharding_constraint(x, NamedSharding(active_mesh(), spec))


def shard_map_op(fn: Callable, in_names: Sequence[Optional[Names]],
                 out_names: Sequence[Optional[Names]]) -> Callable:
    """Wraps an op whose batch and head dimensions are independent in ``shard_map``.

    ``fn(*args)`` takes positional arrays (or ``None``) and returns a tuple of arrays (or
    ``None``). ``in_names[i]`` / ``out_names[j]`` name the dimensions of argument ``i`` / output
    ``j`` (``None`` for an absent array). Each shard runs ``fn`` on its block of batch rows and
    heads, so a Pallas kernel never sees a global array. Without an active mesh, or when a
    sharded dimension does not divide evenly over its mesh axes (and would therefore be
    replicated inconsistently across q/k and v heads), ``fn`` runs unwrapped (GSPMD partitions
    it).
    """
    def wrapped(*args):
        active = _ACTIVE.get()
        if active is None:
            return fn(*args)
        mesh, rules = active
        rule_map = dict(rules)
        in_specs = []
        for arg, names in zip(args, in_names):
            if arg is None:
                in_specs.append(P())
                continue
            spec = logical_to_spec(names, arg.shape, mesh, rules)
            for name, size, got in zip(names, arg.shape, spec):
                want = tuple(a for a in _mesh_axes_for(name, rule_map) if mesh.shape[a] > 1)
                have = () if got is None else (got,) if isinstance(got, str) else tuple(got)
                if want != have:
                    return fn(*args)  # uneven split: let GSPMD handle the whole op
            in_specs.append(spec)
        out_shapes = jax.eval_shape(fn, *args)
        out_specs = tuple(
            P() if names is None or shape is None
            else logical_to_spec(names, shape.shape, mesh, rules)
            for names, shape in zip(out_names, out_shapes))
        return jax.shard_map(fn, mesh=mesh, in_specs=tuple(in_specs), out_specs=out_specs,
                             check_vma=False)(*args)

    return wrapped


# -------------------------------------------------------------------------------------------
# Multi-host
# -------------------------------------------------------------------------------------------

# Environment variables that mark a multi-process launch which ``jax.distributed.initialize()``
# can configure by itself (its cluster auto-detection: SLURM, Open MPI / mpirun, Cloud TPU pods).
_CLUSTER_MARKERS = (
    ("SLURM_NTASKS", lambda v: int(v) > 1),
    ("OMPI_COMM_WORLD_SIZE", lambda v: int(v) > 1),
    ("TPU_WORKER_HOSTNAMES", lambda v: "," in v),
)


def initialize_distributed(coordinator_address: Optional[str] = None,
                           num_processes: Optional[int] = None,
                           process_id: Optional[int] = None) -> bool:
    """Starts JAX's multi-process runtime when the flags or the cluster environment ask for it.

    With any of the arguments given they are passed on (``coordinator_address`` is
    ``host:port`` of process 0). Otherwise ``jax.distributed.initialize()`` auto-detects the
    cluster when a multi-process SLURM, Open MPI or TPU-pod launch is visible in the
    environment; a single-process run initialises nothing.

    Returns:
      Whether the distributed runtime was initialised.
    """
    explicit = any(v is not None for v in (coordinator_address, num_processes, process_id))
    if not explicit:
        detected = [name for name, test in _CLUSTER_MARKERS
                    if os.environ.get(name) and test(os.environ[name])]
        if not detected:
            return False
        logging.info("multi-process launch detected from %s", ", ".join(detected))
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id)
    return True
