"""Optimizers and learning-rate schedules (paper 1 §5, spec §5.2-5.3), built from optax.

* :func:`learning_rate_schedule`: linear warm-up, then cosine decay or warmup-stable-decay (WSD)
  with a ``minus_sqrt`` / linear / cosine cool-down, ending at ``min_lr_ratio * peak``.
* :func:`make_optimizer`: global-norm clipping followed by AdamW whose decoupled weight decay
  skips 0-D and 1-D parameters (norm scales, ``A_log``, ``dt_bias``), as Megatron does.
"""

import jax
import jax.numpy as jnp
import optax

from lattn_jax import config as config_lib


def learning_rate_schedule(cfg: config_lib.OptimConfig, total_steps: int) -> optax.Schedule:
    """Returns ``step -> lr``.

    WSD (spec §5.3): ``lr = peak * step / warmup`` during warm-up, ``peak`` while stable, and over
    the last ``decay_fraction * total_steps`` steps ``lr = min + (peak - min) * (1 - f(tau))``
    with ``tau`` the elapsed fraction of the cool-down and ``f(tau) = sqrt(tau)`` for
    ``minus_sqrt``, ``tau`` for ``linear``, ``(1 - cos(pi tau)) / 2`` for ``cosine``.
    Cosine: warm-up then ``min + (peak - min)(1 + cos(pi tau)) / 2`` over the remaining steps.

    Args:
      cfg: optimizer settings.
      total_steps: total optimizer steps of the run.
    """
    peak = cfg.learning_rate
    floor = cfg.learning_rate * cfg.min_lr_ratio
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


def weight_decay_mask(params):
    """``True`` for parameters that get weight decay: those with two or more dimensions."""
    return jax.tree_util.tree_map(lambda p: jnp.ndim(p) >= 2, params)


def make_optimizer(cfg: config_lib.OptimConfig, total_steps: int) -> optax.GradientTransformation:
    """Global-norm clipping then AdamW (Loshchilov & Hutter 2019) on the WSD/cosine schedule."""
    schedule = learning_rate_schedule(cfg, total_steps)
    parts = []
    if cfg.grad_clip > 0:
        parts.append(optax.clip_by_global_norm(cfg.grad_clip))
    parts.append(optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                             weight_decay=cfg.weight_decay, mask=weight_decay_mask))
    return optax.chain(*parts)
