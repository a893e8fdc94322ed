"""Optimizers and learning-rate schedules (paper 1 §5, spec §5.1-5.3), built from optax.

* :func:`learning_rate_schedule`: linear warm-up, then cosine decay or warmup-stable-decay (WSD)
  with a ``minus_sqrt`` / linear / cosine cool-down, ending at ``min_lr_ratio * peak``.
* :func:`make_optimizer`: global-norm clipping, then either

  - ``optim.name == "adamw"`` (spec §5.2): AdamW whose decoupled weight decay skips 0-D and 1-D
    parameters (norm scales, ``A_log``, ``dt_bias``, biases), as Megatron does; or
  - ``optim.name == "muon"`` (spec §5.1, the paper's final runs): an ``optax.multi_transform``
    over the partition of :func:`param_labels`. Hidden 2-D matrices get (Nor)Muon
    (:func:`scale_by_normuon_recipe`); embeddings, LM head, norms, ``A_log``, ``dt_bias``,
    biases, convolution weights and every 0-D/1-D parameter get AdamW with its own peak LR,
    schedule floor and weight decay (:func:`adamw_group_settings`).

  With ``optim.flatten`` every AdamW update (the whole ``adamw`` optimizer, or the AdamW group of
  ``muon``) runs on raveled fp32 vectors (:func:`adamw_transform`, ``optax.flatten``) instead of
  leaf by leaf: the same arithmetic in a few large kernels instead of several small kernels per
  leaf. Muon leaves stay per matrix.

Layout convention. Flax ``Dense`` kernels are ``[in, out]`` (``y = x @ W``), the transpose of
PyTorch's ``[out, in]`` weights that the authors' Muon code (NVIDIA Emerging-Optimizers v0.2.0)
sees. Everything shape-dependent below (fan-in/fan-out scale, the NorMuon reduction axis) is
written for ``[in, out]`` and reproduces the PyTorch rule on the transposed matrix.
"""

import re
from typing import Any, NamedTuple, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import optax

from lattn_jax import config as config_lib
from lattn_jax.typing import PyTree

MUON = "muon"
ADAMW = "adamw"

# Quintic Newton-Schulz coefficients (a, b, c), one triple per step (spec §5.1 step 3; EO
# ``muon_utils`` "quintic", from modded-nanogpt). Steps beyond 5 cycle through the table, as EO
# does (it requires a multiple of 5).
QUINTIC_NS_COEFFS: Tuple[Tuple[float, float, float], ...] = (
    (4.0848, -6.8946, 2.9270),
    (3.9505, -6.3029, 2.6377),
    (3.7418, -5.5913, 2.3037),
    (2.8769, -3.1427, 1.2046),
    (2.8366, -3.0525, 1.2012),
)
# Keller Jordan's original single triple (EO "simple"), repeated every step.
SIMPLE_NS_COEFFS: Tuple[Tuple[float, float, float], ...] = ((3.4445, -4.7750, 2.0315),)

# Frobenius-normalisation floor before Newton-Schulz (EO ``newton_schulz(eps=1e-7)``).
_NS_EPS = 1e-7

# Spec §5.1: the AdamW group's peak LR is 1.5e-3 when the Muon LR is 3.6e-4, and the launchers
# that tie the two scale it as ``MUON_LR * 1.5e-3 / 3.6e-4``.
_ADAMW_TO_MUON_LR_RATIO = 1.5e-3 / 3.6e-4

# -------------------------------------------------------------------------------------------
# Parameter partition
# -------------------------------------------------------------------------------------------

# A parameter goes to AdamW when any component of its path matches one of these (case-sensitive
# regular expressions on the dict key / attribute name), whatever its rank:
_ADAMW_PATH_PATTERNS: Tuple[str, ...] = (
    r"embed",              # token / position embeddings (embed, tok_embeddings, ...)
    r"^(lm_)?head$",       # the LM head (untied) or its module
    r"conv",               # short convolutions: [W, C] here, 3-D [C, 1, W] in PyTorch
    r"norm",               # RMSNorm / LayerNorm scales (final_norm, q_norm, o_norm, ...)
    r"bias$",              # dt_bias, g_out_bias, bias, ...
    r"^A_log$",            # log decay rates
)
_ADAMW_PATH_RE = re.compile("|".join(f"(?:{p})" for p in _ADAMW_PATH_PATTERNS))


def _key_name(key: Any) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def label_for(path: Sequence[str], ndim: int) -> str:
    """The optimizer group of one parameter, from its path and rank (spec §5.1 routing).

    The authors' rule (Megatron ``emerging_optimizers._is_nonlinear_or_embedding``) is "AdamW iff
    embedding / output layer or ``ndim != 2``, else Muon". Ours, in order:

    1. a path component matching an AdamW pattern -> ``"adamw"``: embeddings, the LM head,
       convolutions (2-D ``[W, C]`` in our layout, so the rank test alone would miss them), and,
       for robustness, norms, biases and ``A_log`` (all 1-D today);
    2. otherwise a 2-D leaf -> ``"muon"``: hidden projection kernels (``*_proj/kernel``, MLP
       ``fc1``/``fc2``, KDA/GDN-2 low-rank gate projections, routing ``route_proj`` /
       ``route_down`` / ``route_up``), and also 2-D gains such as the channel CLER gain
       ``gamma: [H, V]``, which the authors' rank rule puts on Muon (spec §5.1 lists
       "channel-γ [H_v×d_v]" under Muon);
    3. everything else -> ``"adamw"``: 0-D and 1-D leaves (norm scales, ``dt_bias``, scalar and
       per-head ``gamma``, AttnRes queries ``[D]``, CLER-G ``surprise_scale``/``surprise_bias``)
       and 3-D+ leaves.

    A new module needs no change here if its projection matrices are 2-D and its vectors are
    1-D. Per-layer vectors stacked into one 2-D array would be mis-routed to Muon: keep them 1-D
    or give them a name matching an AdamW pattern.

    Args:
      path: the parameter's path components as strings, e.g.
        ``("blocks", "0", "mixer", "in_proj", "kernel")``.
      ndim: the parameter's rank.

    Returns:
      ``"muon"`` or ``"adamw"``.
    """
    if any(_ADAMW_PATH_RE.search(part) for part in path):
        return ADAMW
    return MUON if ndim == 2 else ADAMW


def param_labels(params: PyTree) -> PyTree:
    """Labels every parameter leaf ``"muon"`` or ``"adamw"`` (see :func:`label_for`).

    Args:
      params: a parameter pytree whose dict keys (or attribute names) are the module names, e.g.
        the pure dict ``nnx.to_pure_dict(nnx.state(model, nnx.Param))`` used by the trainer.
        Leaves need only ``ndim`` (arrays or ``jax.ShapeDtypeStruct``).

    Returns:
      A pytree of the same structure whose leaves are the strings ``"muon"`` / ``"adamw"``.
    """
    return jax.tree_util.tree_map_with_path(
        lambda path, leaf: label_for([_key_name(k) for k in path], jnp.ndim(leaf)), params)


def weight_decay_mask(params):
    """``True`` for parameters that get weight decay: those with two or more dimensions."""
    return jax.tree_util.tree_map(lambda p: jnp.ndim(p) >= 2, params)


# -------------------------------------------------------------------------------------------
# Learning-rate schedule
# -------------------------------------------------------------------------------------------


def learning_rate_schedule(cfg: config_lib.OptimConfig, total_steps: int, *,
                           peak: Optional[float] = None,
                           min_lr_ratio: Optional[float] = None) -> optax.Schedule:
    """Returns ``step -> lr``.

    WSD (spec §5.3): ``lr = peak * step / warmup`` during warm-up, ``peak`` while stable, and over
    the last ``decay_fraction * total_steps`` steps ``lr = min + (peak - min) * (1 - f(tau))``
    with ``tau`` the elapsed fraction of the cool-down and ``f(tau) = sqrt(tau)`` for
    ``minus_sqrt``, ``tau`` for ``linear``, ``(1 - cos(pi tau)) / 2`` for ``cosine``.
    Cosine: warm-up then ``min + (peak - min)(1 + cos(pi tau)) / 2`` over the remaining steps.
    ``min = min_lr_ratio * peak``.

    Args:
      cfg: optimizer settings.
      total_steps: total optimizer steps of the run.
      peak: peak LR; default ``cfg.learning_rate`` (the main / Muon group).
      min_lr_ratio: final LR as a fraction of ``peak``; default ``cfg.min_lr_ratio``.
    """
    peak = cfg.learning_rate if peak is None else peak
    ratio = cfg.min_lr_ratio if min_lr_ratio is None else min_lr_ratio
    floor = peak * ratio
    warmup = min(cfg.warmup_steps, total_steps)

    if cfg.schedule == "cosine":
        decay_start, decay_len = warmup, max(total_steps - warmup, 1)
        shape = "cosine"
    else:
        decay_len = max(int(round(cfg.decay_fraction * total_steps)), 1)
        decay_start = max(total_steps - decay_len, warmup)
        decay_len = max(total_steps - decay_start, 1)
        shape = cfg.decay_shape

    def schedule(step):
        step = jnp.asarray(step, jnp.float32)
        warm = peak * jnp.minimum(step / max(warmup, 1), 1.0) if warmup > 0 else peak
        tau = jnp.clip((step - decay_start) / decay_len, 0.0, 1.0)
        if shape == "minus_sqrt":
            frac = jnp.sqrt(tau)
        elif shape == "linear":
            frac = tau
        else:
            frac = 0.5 * (1.0 - jnp.cos(jnp.pi * tau))
        decayed = floor + (peak - floor) * (1.0 - frac)
        return jnp.where(step < warmup, warm, decayed)

    return schedule


class AdamWGroupSettings(NamedTuple):
    """Resolved hyper-parameters of the AdamW group of the Muon recipe (spec §5.1)."""

    learning_rate: float
    min_lr_ratio: float
    weight_decay: float


def adamw_group_settings(cfg: config_lib.OptimConfig) -> AdamWGroupSettings:
    """The AdamW group's peak LR, schedule floor and weight decay when ``cfg.name == "muon"``.

    Defaults (spec §5.1 and §10 item 8, what the final runs did):

    * ``adamw_learning_rate=None`` -> ``learning_rate * 1.5e-3 / 3.6e-4`` (1.5e-3 at the paper's
      Muon LR 3.6e-4; the launchers that tie the two use this ratio);
    * ``adamw_min_lr_ratio=None`` -> ``1.0``: linear warm-up, then constant (Megatron ran the
      scalar group with ``min_lr = max_lr``). Set it to ``min_lr_ratio`` for the same cool-down
      as the Muon group;
    * ``adamw_weight_decay=None`` -> ``0.0`` (``--muon-scalar-weight-decay 0``).

    Args:
      cfg: optimizer settings.

    Returns:
      :class:`AdamWGroupSettings`.
    """
    lr = cfg.adamw_learning_rate
    if lr is None:
        lr = cfg.learning_rate * _ADAMW_TO_MUON_LR_RATIO
    ratio = 1.0 if cfg.adamw_min_lr_ratio is None else cfg.adamw_min_lr_ratio
    wd = 0.0 if cfg.adamw_weight_decay is None else cfg.adamw_weight_decay
    return AdamWGroupSettings(learning_rate=lr, min_lr_ratio=ratio, weight_decay=wd)


# -------------------------------------------------------------------------------------------
# Muon pieces (stateless/stateful optax transforms on 2-D [in, out] leaves)
# -------------------------------------------------------------------------------------------


def ns_coefficients(kind: str, steps: int) -> Tuple[Tuple[float, float, float], ...]:
    """Per-step Newton-Schulz coefficients (spec §5.1 step 3).

    Args:
      kind: ``"quintic"`` (5 tuned triples, cycled) or ``"simple"`` (one triple, repeated).
      steps: number of iterations.

    Returns:
      ``steps`` triples ``(a, b, c)``.

    Raises:
      ValueError: unknown ``kind``, ``steps < 1``, or ``"quintic"`` with ``steps % 5 != 0``
        (EO refuses it too).
    """
    if steps < 1:
        raise ValueError(f"Newton-Schulz needs steps >= 1, got {steps}")
    if kind == "quintic":
        table = QUINTIC_NS_COEFFS
        if steps % len(table):
            raise ValueError(f"quintic Newton-Schulz needs a multiple of 5 steps, got {steps}")
    elif kind == "simple":
        table = SIMPLE_NS_COEFFS
    else:
        raise ValueError(f"unknown Newton-Schulz coefficients {kind!r}; choose quintic or simple")
    return tuple(table[i % len(table)] for i in range(steps))


def newton_schulz(x: jax.Array, coeffs: Sequence[Tuple[float, float, float]], *,
                  compute_dtype: Any = jnp.bfloat16, eps: float = _NS_EPS) -> jax.Array:
    """Approximate polar factor ``U V^T`` of ``x = U S V^T`` by Newton-Schulz iteration.

    ``X_0 = x / max(||x||_F, eps)`` (so every singular value is <= 1), then per step with
    coefficients ``(a, b, c)``: ``A = X X^T``, ``X <- a X + (b A + c A^2) X``, i.e. every singular
    value goes through ``s -> a s + b s^3 + c s^5`` while the singular vectors are kept. The
    quintic coefficients do not converge to exactly 1: after 5 steps singular values above
    ~3e-3 of the Frobenius norm land in about ``[0.98, 1.15]`` (smaller ones are not yet
    amplified). Spec §5.1 step 3; EO ``muon_utils.newton_schulz``.

    The iteration is transpose-equivariant, so the matrix is transposed to ``[short, long]``
    (``A`` is the small Gram matrix) and back. With ``compute_dtype=bfloat16`` the iterate and
    the Gram matrices are stored in bf16 and the matmuls accumulate in fp32, which is what the
    authors ran (``fp32_matmul_prec="medium"``: EO casts ``X`` to bf16 for the loop). Leading
    axes are a batch of independent matrices (one batched matmul per product instead of one
    small matmul per matrix: :func:`orthogonalize` stacks equal-shaped updates this way).

    Args:
      x: ``[..., m, n]`` matrix or batch of matrices (any layout; the result has the same
        layout); each trailing ``[m, n]`` matrix is normalised and iterated on its own.
      coeffs: per-step ``(a, b, c)``, e.g. from :func:`ns_coefficients`.
      compute_dtype: dtype of the iterate (``jnp.bfloat16`` or ``jnp.float32``).
      eps: floor of the Frobenius norm in the normalisation.

    Returns:
      fp32 ``[..., m, n]``.

    Raises:
      ValueError: ``x`` has fewer than 2 dimensions.
    """
    if x.ndim < 2:
        raise ValueError(f"newton_schulz needs a matrix, got {x.shape=}")
    f32 = jnp.float32
    x = x.astype(f32)
    transpose = x.shape[-2] > x.shape[-1]
    if transpose:
        x = jnp.swapaxes(x, -1, -2)  # [..., short, long]
    norm = jnp.sqrt(jnp.sum(jnp.square(x), axis=(-2, -1), keepdims=True))
    x = (x / jnp.maximum(norm, eps)).astype(compute_dtype)

    def mm(a, b):
        return jnp.matmul(a, b, preferred_element_type=f32)

    for a, b, c in coeffs:
        gram = mm(x, jnp.swapaxes(x, -1, -2)).astype(compute_dtype)  # [..., short, short]
        poly = (b * gram.astype(f32) + c * mm(gram, gram)).astype(compute_dtype)
        x = (a * x.astype(f32) + mm(poly, x)).astype(compute_dtype)
    x = x.astype(f32)
    return jnp.swapaxes(x, -1, -2) if transpose else x


def orthogonalize(coeffs: Sequence[Tuple[float, float, float]], *,
                  compute_dtype: Any = jnp.bfloat16) -> optax.GradientTransformation:
    """Stateless transform: every (2-D) update leaf ``G -> newton_schulz(G)`` (spec §5.1 step 3).

    Leaves of equal shape and dtype (the same projection in every layer) are stacked and
    iterated as one batch: the same per-matrix result, with ~5 x 3 batched matmuls per shape
    instead of per leaf (a 350M model has ~170 such leaves, so the unbatched form launches
    thousands of small matmuls per step).

    Raises:
      ValueError: (at update time) for an update leaf that is not 2-D.
    """
    coeffs = tuple(tuple(float(v) for v in c) for c in coeffs)

    def update_fn(updates, state, params=None):
        del params
        leaves, treedef = jax.tree_util.tree_flatten(updates)
        groups = {}
        for i, g in enumerate(leaves):
            if g.ndim != 2:
                raise ValueError(f"Muon orthogonalises matrices; got an update of shape "
                                 f"{g.shape}")
            groups.setdefault((g.shape, jnp.dtype(g.dtype)), []).append(i)
        out = list(leaves)
        for (_, dtype), idx in groups.items():
            batch = jnp.stack([leaves[i] for i in idx])
            ortho = newton_schulz(batch, coeffs, compute_dtype=compute_dtype).astype(dtype)
            for j, i in enumerate(idx):
                out[i] = ortho[j]
        return jax.tree_util.tree_unflatten(treedef, out), state

    return optax.GradientTransformation(optax.init_empty_state, update_fn)


def muon_scale_factor(shape: Tuple[int, int], mode: str) -> float:
    """Muon's per-matrix update scale for a Flax ``[in, out]`` kernel (spec §5.1 step 3).

    With ``fan_in = shape[0]`` and ``fan_out = shape[1]`` (PyTorch's ``size_in = W.size(1)``,
    ``size_out = W.size(0)`` of the transposed weight; EO ``get_muon_scale_factor``):

    * ``"spectral"`` (the paper, EO default): ``sqrt(max(fan_in, fan_out))``;
    * ``"shape_scaling"`` (Keller Jordan's Muon): ``sqrt(max(1, fan_out / fan_in))``;
    * ``"unit_rms_norm"`` (Scion): ``sqrt(fan_out / fan_in)``.

    Args:
      shape: ``(fan_in, fan_out)`` of the kernel.
      mode: one of the names above.

    Returns:
      The scale factor.

    Raises:
      ValueError: unknown ``mode`` or a shape that is not 2-D.
    """
    if len(shape) != 2:
        raise ValueError(f"muon_scale_factor needs a 2-D [in, out] shape, got {shape}")
    fan_in, fan_out = shape
    if mode == "spectral":
        return max(fan_in, fan_out) ** 0.5
    if mode == "shape_scaling":
        return max(1.0, fan_out / fan_in) ** 0.5
    if mode == "unit_rms_norm":
        return (fan_out / fan_in) ** 0.5
    raise ValueError(f"unknown Muon scale mode {mode!r}")


def scale_by_muon_shape(mode: str, extra_scale_factor: float = 1.0
                        ) -> optax.GradientTransformation:
    """Stateless transform: ``O -> O * muon_scale_factor(O.shape, mode) * extra_scale_factor``."""
    muon_scale_factor((1, 1), mode)  # validates ``mode`` eagerly

    def update_fn(updates, state, params=None):
        del params
        out = jax.tree_util.tree_map(
            lambda o: o * (muon_scale_factor(o.shape, mode) * extra_scale_factor), updates)
        return out, state

    return optax.GradientTransformation(optax.init_empty_state, update_fn)


def normuon_axis(shape: Tuple[int, int]) -> int:
    """The axis of a Flax ``[in, out]`` kernel that NorMuon averages over.

    EO (spec §5.1 step 4) averages a PyTorch ``[out, in]`` update over ``dim=-1`` (the input
    axis) when ``out >= in`` and over ``dim=-2`` (the output axis) otherwise, so the second moment
    is one value per index of the LONGER axis (per output neuron when ``out >= in``). For the
    transposed Flax layout that is axis 0 (input) when ``shape[1] >= shape[0]``, else axis 1;
    square kernels average over the input axis.
    """
    return 0 if shape[1] >= shape[0] else 1


class NorMuonState(NamedTuple):
    """``moment2``: per leaf, the EMA of the mean squared update, ``[1, out]`` or ``[in, 1]``."""

    moment2: PyTree


def scale_by_normuon(beta2: float = 0.95, eps: float = 1e-8) -> optax.GradientTransformation:
    """NorMuon's row/column second-moment normalisation (spec §5.1 step 4; arXiv 2510.05491).

    For an orthogonalised, scaled update ``O`` (``[in, out]``) with ``ax = normuon_axis``::

        v = mean(O**2, axis=ax, keepdims=True)      # [1, out] or [in, 1]
        V <- beta2 * V + (1 - beta2) * v            # no bias correction
        U = O * rsqrt(max(V, eps))

    ``V`` starts at zero, so the first update has RMS ``1 / sqrt(1 - beta2)`` (~4.47 at 0.95),
    decaying to ~1, exactly as in EO ``AdaptiveMuon(moment2_method="normuon")``.

    Args:
      beta2: EMA rate of the second moment.
      eps: floor of ``V`` under the reciprocal square root.

    Returns:
      An optax ``GradientTransformation`` with state :class:`NorMuonState`.
    """

    def reduced(shape):
        ax = normuon_axis(shape)
        return tuple(1 if i == ax else n for i, n in enumerate(shape))

    def init_fn(params):
        return NorMuonState(moment2=jax.tree_util.tree_map(
            lambda p: jnp.zeros(reduced(p.shape), jnp.float32), params))

    def update_fn(updates, state, params=None):
        del params
        moment2 = jax.tree_util.tree_map(
            lambda o, v: beta2 * v + (1.0 - beta2) * jnp.mean(
                jnp.square(o.astype(jnp.float32)), axis=normuon_axis(o.shape), keepdims=True),
            updates, state.moment2)
        out = jax.tree_util.tree_map(
            lambda o, v: (o * jax.lax.rsqrt(jnp.maximum(v, eps))).astype(o.dtype),
            updates, moment2)
        return out, NorMuonState(moment2=moment2)

    return optax.GradientTransformation(init_fn, update_fn)


def scale_by_normuon_recipe(cfg: config_lib.OptimConfig) -> optax.GradientTransformation:
    """The Muon group's direction, before weight decay and LR (spec §5.1 steps 2-4).

    Per 2-D ``[in, out]`` gradient ``G``::

        M <- mu M + (1 - mu) G;  G~ = (1 - mu) G + mu M   (Nesterov; else G~ = M)
        O = NS(G~) * scale(shape) * extra_scale_factor
        U = NorMuon(O)                                    (variant "normuon"; "muon": U = O)

    The momentum is ``optax.trace(mu, nesterov)`` followed by ``optax.scale(1 - mu)``: ``trace``
    keeps ``M / (1 - mu)``, so this reproduces EO's ``lerp`` EMA exactly, with no bias correction
    (unlike ``optax.contrib.scale_by_muon``, which bias-corrects, and whose NS has no bf16 mode;
    hence our own pieces).

    Args:
      cfg: optimizer settings (``muon_*`` fields).

    Returns:
      An optax ``GradientTransformation`` (to be applied to 2-D leaves only).
    """
    mu = cfg.muon_momentum
    parts = [
        optax.trace(decay=mu, nesterov=cfg.muon_nesterov),
        optax.scale(1.0 - mu),
        orthogonalize(ns_coefficients(cfg.muon_ns_coefficients, cfg.muon_ns_steps),
                      compute_dtype=jnp.dtype(cfg.muon_ns_dtype)),
        scale_by_muon_shape(cfg.muon_scale_mode, cfg.muon_extra_scale_factor),
    ]
    if cfg.muon_variant == "normuon":
        parts.append(scale_by_normuon(cfg.muon_beta2, cfg.muon_eps))
    return optax.chain(*parts)


# -------------------------------------------------------------------------------------------
# AdamW, leaf by leaf or on flat vectors
# -------------------------------------------------------------------------------------------

# Group labels of the flattened AdamW (see adamw_transform).
DECAY = "decay"
NO_DECAY = "no_decay"


def _flatten_group(inner: optax.GradientTransformation) -> optax.GradientTransformation:
    """``optax.flatten(inner)`` that also accepts a tree without leaves and refuses mixed dtypes.

    ``optax.flatten`` concatenates the leaves into one vector (``concatenate`` fails on none,
    and would silently promote mixed dtypes, e.g. bf16 moments to fp32). A group of
    ``optax.multi_transform`` can be empty (a model without 1-D parameters has no ``no_decay``
    leaf): then the state is ``optax.EmptyState()`` and the updates pass through unchanged.

    Raises:
      ConfigError: (a ``ValueError``; at ``init``) the leaves do not all have one dtype.
    """
    flat = optax.flatten(inner)

    def init_fn(params):
        leaves = jax.tree_util.tree_leaves(params)
        if not leaves:
            return optax.EmptyState()
        dtypes = sorted({str(jnp.result_type(x)) for x in leaves})
        if len(dtypes) > 1:
            # A ConfigError (a ValueError): the binaries print it as one line, no traceback.
            raise config_lib.ConfigError(
                f"optim.flatten=True ravels the parameters into one vector, which "
                f"needs one dtype; got {dtypes}. Set optim.flatten=False")
        return flat.init(params)

    def update_fn(updates, state, params=None):
        if not jax.tree_util.tree_leaves(updates):
            return updates, state
        return flat.update(updates, state, params)

    return optax.GradientTransformation(init_fn, update_fn)


def decay_labels(params: PyTree) -> PyTree:
    """``"decay"`` for leaves that get weight decay (2+ dims, :func:`weight_decay_mask`), else
    ``"no_decay"``; a pytree of strings with the structure of ``params`` (leaves need ``ndim``)."""
    return jax.tree_util.tree_map(lambda p: DECAY if jnp.ndim(p) >= 2 else NO_DECAY, params)


def adamw_transform(learning_rate: optax.ScalarOrSchedule, *, b1: float, b2: float, eps: float,
                    weight_decay: float, flatten: bool = False
                    ) -> optax.GradientTransformation:
    """Bias-corrected AdamW with decoupled weight decay on 2+-dim leaves only.

    Per fp32 leaf ``p`` with gradient ``g`` at step ``t = 1, 2, ...`` (``lr_t`` the schedule at
    ``t - 1``; ``wd = weight_decay`` if ``p.ndim >= 2`` else ``0``)::

        m <- b1 m + (1 - b1) g;   v <- b2 v + (1 - b2) g^2
        p <- p - lr_t * (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + wd * p)

    ``flatten=False``: ``optax.adamw(..., mask=weight_decay_mask)``, state per leaf (``mu``,
    ``nu`` of each leaf's shape and dtype).

    ``flatten=True``: the same update on flat vectors. A leaf mask cannot be expressed on one
    raveled vector, so the leaves are split by :func:`decay_labels` with
    ``optax.multi_transform`` into two groups, each wrapped in ``optax.flatten``:
    ``"decay"`` (``optax.adamw`` with ``weight_decay``, no mask) and ``"no_decay"``
    (``optax.adam``, i.e. AdamW without the decay term, which is what the masked leaves get).
    Chosen over one vector with an elementwise 0/1 decay mask because the mask would be an
    ``[N]`` array either baked into the program as a constant or carried in the state (4 more
    bytes per parameter read every step), and would need our own decay transform; the two groups
    are stock optax transforms, so the arithmetic per element is optax's own and the only cost
    is a second (small: norm scales and biases) flat group. With ``weight_decay == 0`` there is
    one group, ``optax.flatten(optax.adam(...))`` (the decay term is zero everywhere).
    Both groups step their own count, in lockstep, so bias correction and the schedule are
    unchanged. State: ``mu``/``nu`` are ``[N_group]`` vectors of the leaves' common dtype.
    Under a mesh these vectors match no parameter, so ``sharding.state_shardings`` replicates
    them (see :func:`check_flatten_sharding`).

    Args:
      learning_rate: a float or an ``optax`` schedule ``step -> lr``.
      b1, b2, eps: Adam's moment rates and denominator floor.
      weight_decay: decoupled decay rate (times ``lr_t``) of 2+-dim leaves.
      flatten: update flat vectors instead of leaf by leaf.

    Returns:
      An optax ``GradientTransformation``; its ``update`` needs ``params`` when
      ``weight_decay > 0``.

    Raises:
      ValueError: (at ``init``, ``flatten=True``) the parameter leaves (of one group) do not all
        have one dtype.
    """
    if not flatten:
        return optax.adamw(learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay,
                           mask=weight_decay_mask)
    adam = _flatten_group(optax.adam(learning_rate, b1=b1, b2=b2, eps=eps))
    if weight_decay == 0:
        return adam
    decayed = _flatten_group(optax.adamw(learning_rate, b1=b1, b2=b2, eps=eps,
                                         weight_decay=weight_decay))
    return optax.multi_transform({DECAY: decayed, NO_DECAY: adam}, decay_labels)


def check_flatten_sharding(cfg: config_lib.OptimConfig, param_shardings: PyTree) -> None:
    """Refuses ``optim.flatten`` when parameters are sharded (FSDP / tensor parallel meshes).

    The flat AdamW moments are ``[N]`` vectors that correspond to no parameter, so
    ``sharding.state_shardings`` replicates them, and raveling sharded parameters gathers them:
    every device would hold the whole optimizer state. Replicated parameters (one device, pure
    data parallelism) are fine.

    Args:
      cfg: optimizer settings.
      param_shardings: pytree of ``jax.sharding.Sharding`` (anything with
        ``is_fully_replicated``), one per parameter.

    Raises:
      ConfigError: ``cfg.flatten`` and some parameter sharding is not fully replicated.
    """
    if not cfg.flatten:
        return
    sharded = [jax.tree_util.keystr(path) for path, s in
               jax.tree_util.tree_flatten_with_path(param_shardings)[0]
               if not s.is_fully_replicated]
    if sharded:
        raise config_lib.ConfigError(
            f"optim.flatten=True keeps the AdamW state as whole flat vectors, replicated on "
            f"every device, but {len(sharded)} parameters are sharded (e.g. {sharded[0]}); set "
            f"optim.flatten=False with fsdp or tensor parallelism")


# -------------------------------------------------------------------------------------------
# The optimizer
# -------------------------------------------------------------------------------------------


def make_optimizer(cfg: config_lib.OptimConfig, total_steps: int) -> optax.GradientTransformation:
    """Global-norm clipping, then AdamW or the paper's Muon + AdamW recipe.

    ``cfg.name == "adamw"`` (spec §5.2): AdamW (Loshchilov & Hutter 2019) at ``learning_rate``
    on the WSD/cosine schedule, decoupled weight decay on params with 2+ dims.

    ``cfg.name == "muon"`` (spec §5.1): ``optax.multi_transform`` over :func:`param_labels`:

    * ``"muon"`` leaves: :func:`scale_by_normuon_recipe`, then decoupled weight decay and the LR,
      ``P <- P - lr_t * (U + weight_decay * P)`` (= EO's ``P <- P (1 - lr_t wd)`` before
      ``P <- P - lr_t U``), with ``lr_t`` the schedule at peak ``learning_rate``;
    * ``"adamw"`` leaves: bias-corrected AdamW (``b1, b2, eps``) at the peak, schedule floor and
      weight decay of :func:`adamw_group_settings` (decay only on 2+-dim leaves).

    Both groups share the warm-up and schedule shape; clipping is on the global norm of ALL
    gradients before the split (Megatron ChainedOptimizer).

    ``cfg.flatten``: every AdamW update above runs on flat vectors (:func:`adamw_transform`):
    the ``adamw`` optimizer, or the ``"adamw"`` group of ``muon`` (nested inside its
    ``multi_transform``; Muon leaves stay per matrix). The clipping still sees every gradient
    leaf and the schedules are the same; only the optimizer state's layout changes, so a
    checkpoint restores only into the setting that wrote it.

    Args:
      cfg: optimizer settings.
      total_steps: total optimizer steps (for the schedule).

    Returns:
      An optax ``GradientTransformation``; its ``update`` needs ``params``.

    Raises:
      ValueError: unknown ``cfg.name`` (``OptimConfig`` already rejects it); with
        ``cfg.flatten``, at ``init``, parameters of more than one dtype.
    """
    parts = []
    if cfg.grad_clip > 0:
        parts.append(optax.clip_by_global_norm(cfg.grad_clip))
    schedule = learning_rate_schedule(cfg, total_steps)
    if cfg.name == ADAMW:
        parts.append(adamw_transform(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                                     weight_decay=cfg.weight_decay, flatten=cfg.flatten))
    elif cfg.name == MUON:
        adam = adamw_group_settings(cfg)
        adam_schedule = learning_rate_schedule(cfg, total_steps, peak=adam.learning_rate,
                                               min_lr_ratio=adam.min_lr_ratio)
        muon_tx = optax.chain(
            scale_by_normuon_recipe(cfg),
            optax.add_decayed_weights(cfg.weight_decay),
            optax.scale_by_learning_rate(schedule),
        )
        adamw_tx = adamw_transform(adam_schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                                   weight_decay=adam.weight_decay, flatten=cfg.flatten)
        parts.append(optax.multi_transform({MUON: muon_tx, ADAMW: adamw_tx}, param_labels))
    else:
        raise ValueError(f"optim.name={cfg.name!r}; choose adamw or muon")
    return optax.chain(*parts)
