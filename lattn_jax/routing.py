"""Cross-layer routing: CLER, CLER-H, CLVR, their controls, and Attention Residuals.

Paper 1 (arXiv 2607.07953) §4, Eqs. 25-29; spec §4 (authors' ``cler_utils.py``,
``cler_hidden_routing.py``, ``transformer_block.py``). A routing layer is a GDN or DeltaNet layer
(``config.ROUTABLE_MIXERS``); it emits two per-token signals (:class:`RouteSignals`):

* the error ``r_t = u_t = beta_t (v_t - alpha_t S_{t-1}^T k_t)`` (GDN; DeltaNet has no
  ``alpha``): the op's residual (``return_residual=True``, FLA's ``v_new``), beta-scaled and with
  the decay-adjusted read, exactly what the authors route (spec §4.1, §10 item 1), with exact
  gradients through it;
* the value ``v_t``: the post-conv SiLU value, not beta-scaled, not normalised (spec §10 item 2).

Destinations:

* value-space CLER (``mode="cler"``, spec §4.2, "latest" routing): the layer's value target
  becomes ``v~_l = v_l + Gamma_l * norm?(r_{p(l)})`` before the kernel (:func:`inject_value`),
  ``p(l)`` the nearest lower routing layer; softmax layers pass the side channel on unchanged;
* residual stream (``cler_h``, ``clvr``, ``error_value``, ``surprise_gate``, ``hidden_state``,
  spec §4.3): ``h_{l+1} <- Block_l(h_l) + P_l s_l`` after the layer's MLP (:class:`HiddenRoute`);
* Attention Residuals (spec §4.4, :func:`attn_res_combine`): sub-layer inputs are softmax mixes of
  all earlier sub-layer contributions.

Parameter names for optimizer partitions: the projections are :class:`~lattn_jax.layers.Dense`
kernels ``route_proj.kernel [in, D]`` (full rank) or ``route_down.kernel [in, r]`` and
``route_up.kernel [r, D]`` (low rank); the CLER gains are ``gamma`` (0-D, ``[H]`` or ``[H, V]``);
CLER-G has 0-D ``surprise_scale`` / ``surprise_bias``; AttnRes pseudo-queries are 1-D
``attn_res_query`` ``[D]``.
"""

import math
from typing import NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from lattn_jax import config as config_lib
from lattn_jax import layers
from lattn_jax.typing import Array

_EPS = 1e-6  # every routing normaliser uses 1e-6 (spec §4.2-4.4)


class RouteSignals(NamedTuple):
    """What a routing layer emits, per token and value head.

    Attributes:
      error: ``[B, T, H, V]`` the residual ``r_t = u_t`` (spec §4.1), compute dtype, computed
        from the value target after any value-space injection.
      value: ``[B, T, H, V]`` the post-conv SiLU value ``v_t`` before any injection.
    """

    error: Array
    value: Array


def rms_normalize(x: Array, axis=-1) -> Array:
    """``x * rsqrt(mean(x^2, axis) + 1e-6)`` in fp32, cast back to ``x.dtype`` (spec §4.2)."""
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=axis, keepdims=True) + _EPS)).astype(
        x.dtype)


def make_gamma(routing: config_lib.RoutingConfig, num_heads: int, head_dim: int) -> nnx.Param:
    """The CLER gain ``Gamma_l`` (CU ``make_cler_gamma_parameter``), fp32, filled with
    ``routing.gamma_init``: 0-D (``"scalar"``), ``[H]`` (``"head"``) or ``[H, V]``
    (``"channel"``)."""
    shape = {"scalar": (), "head": (num_heads,), "channel": (num_heads, head_dim)}
    return nnx.Param(jnp.full(shape[routing.gamma_mode], routing.gamma_init, jnp.float32))


def inject_value(v: Array, r_src: Array, gamma: Array, *, normalize: bool) -> Array:
    """Value-space CLER: ``v~ = v + Gamma * norm?(r_src)`` (paper 1 Eq. 27; CU
    ``inject_cler_residual``).

    Args:
      v: ``[B, T, H, V]`` the layer's value target (post-conv SiLU, before beta).
      r_src: ``[B, T, H, V]`` the error of the nearest lower routing layer.
      gamma: fp32 gain, 0-D, ``[H]`` or ``[H, V]``.
      normalize: per-head RMS normalisation of ``r_src`` over ``V`` first.

    Returns:
      ``[B, T, H, V]`` in ``v.dtype`` (the sum is formed in fp32).

    Raises:
      ValueError: if ``r_src`` and ``v`` differ in shape.
    """
    if r_src.shape != v.shape:
        raise ValueError(f"the routed residual must match the value target: {r_src.shape=}, "
                         f"{v.shape=}")
    if normalize:
        r_src = rms_normalize(r_src)
    g = gamma.astype(jnp.float32)
    if g.ndim == 1:
        g = g[:, None]  # [H, 1]
    return (v.astype(jnp.float32) + g * r_src.astype(jnp.float32)).astype(v.dtype)


def _torch_linear_init(key, shape, dtype):
    """PyTorch's ``nn.Linear`` default, ``U(-1/sqrt(in), 1/sqrt(in))`` for ``[in, out]``."""
    bound = 1.0 / math.sqrt(shape[0])
    return jax.random.uniform(key, shape, dtype, -bound, bound)


class HiddenRoute(nnx.Module):
    """``eps_l = P_l s_l``, added to the residual stream after routing layer ``l`` (spec §4.3).

    ``P_l`` (CH ``make_cler_hidden_projection``) is zero-initialised so a routed model starts as
    its host: full rank ``route_proj: [in, D]`` zeros; rank ``r``: ``route_down: [in, r]``
    ``U(-1/sqrt(in), 1/sqrt(in))`` and ``route_up: [r, D]`` zeros, whose product is zero while
    ``dL/d route_up = route_down^T s^T dL/d eps`` is not.

    The source ``s_l`` (``[B, T, in]``) per mode: ``cler_h`` ``vec(r)``, ``clvr`` ``vec(v)``
    (``in = H V``), ``error_value`` ``vec([r_h; v_h])`` (``in = 2 H V``), ``surprise_gate``
    ``vec(v * sigmoid(a s_h + b))`` with ``s_h = ||r_h|| / (||v_h|| + 1e-6)`` (fp32; ``a = 1``,
    ``b = 0`` at init), ``hidden_state`` the layer output ``h_{l+1}`` (``in = D``).

    Args:
      routing: the routing config (its ``mode`` must be a residual-stream mode).
      num_heads: ``H`` value heads of the host layer.
      head_dim: ``V``.
      d_model: ``D``.
      rngs, dtype, param_dtype: as for :class:`~lattn_jax.layers.Dense`.

    Raises:
      ValueError: if ``routing.mode`` is not a residual-stream mode.
    """

    def __init__(self, routing: config_lib.RoutingConfig, *, num_heads: int, head_dim: int,
                 d_model: int, rngs: nnx.Rngs, dtype=jnp.float32, param_dtype=jnp.float32):
        if routing.mode not in config_lib.HIDDEN_ROUTING_MODES:
            raise ValueError(f"HiddenRoute needs a residual-stream mode, got {routing.mode=}")
        self.mode = routing.mode
        self.normalize_input = routing.normalize_input
        hv = num_heads * head_dim
        in_features = {"error_value": 2 * hv, "hidden_state": d_model}.get(self.mode, hv)
        dense = dict(std=0.0, rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        zeros = jax.nn.initializers.zeros
        if routing.rank is None:
            self.route_proj = layers.Dense(in_features, d_model, kernel_init=zeros, **dense)
        else:
            self.route_down = layers.Dense(in_features, routing.rank,
                                           kernel_init=_torch_linear_init, **dense)
            self.route_up = layers.Dense(routing.rank, d_model, kernel_init=zeros, **dense)
        self.rank = routing.rank
        if self.mode == "surprise_gate":
            self.surprise_scale = nnx.Param(jnp.ones((), jnp.float32))
            self.surprise_bias = nnx.Param(jnp.zeros((), jnp.float32))

    def source(self, signals: Optional[RouteSignals], h_out: Array) -> Array:
        """The projected signal ``s_l``: ``[B, T, in]``.

        Args:
          signals: the layer's :class:`RouteSignals` (unused for ``hidden_state``).
          h_out: ``[B, T, D]`` the layer's output ``h_{l+1}`` before routing.
        """
        if self.mode == "hidden_state":
            return h_out
        r, v = signals.error, signals.value  # [B, T, H, V] each
        if self.mode == "cler_h":
            s = r
        elif self.mode == "clvr":
            s = v
        elif self.mode == "error_value":
            s = jnp.concatenate([r, v.astype(r.dtype)], axis=-1)  # [B, T, H, 2V]
        else:  # surprise_gate
            r32, v32 = r.astype(jnp.float32), v.astype(jnp.float32)
            surprise = jnp.linalg.norm(r32, axis=-1, keepdims=True) / (
                jnp.linalg.norm(v32, axis=-1, keepdims=True) + _EPS)  # [B, T, H, 1]
            gate = jax.nn.sigmoid(self.surprise_scale[...] * surprise + self.surprise_bias[...])
            s = (v32 * gate).astype(v.dtype)
        s = s.reshape(s.shape[0], s.shape[1], -1)  # [B, T, in], head-major
        if self.normalize_input:
            s = rms_normalize(s)
        return s

    def __call__(self, signals: Optional[RouteSignals], h_out: Array) -> Array:
        """``eps_l = P_l s_l``: ``[B, T, D]`` in the compute dtype (see :meth:`source`)."""
        s = self.source(signals, h_out)
        if self.rank is None:
            return self.route_proj(s)
        return self.route_up(self.route_down(s))


def attn_res_combine(query: Array, contributions: Sequence[Array]) -> Array:
    """One AttnRes sub-layer input (spec §4.4, TB ``_attn_res_combine``).

    ``x = sum_i softmax_i((w . V_i) / rms(V_i)) V_i`` per token, ``rms(V_i) = sqrt(mean_D V_i^2 +
    1e-6)``, softmax over the contributions ``i``; computed in fp32. A zero query gives the
    uniform mean of the contributions (spec §10 item 15).

    Args:
      query: ``[D]`` the sub-layer's pseudo-query ``w_m``.
      contributions: ``N >= 1`` arrays ``[B, T, D]``: the embedding output, then every earlier
        sub-layer's contribution.

    Returns:
      ``[B, T, D]`` in the dtype of the first contribution.
    """
    values = jnp.stack([c.astype(jnp.float32) for c in contributions], axis=0)  # [N, B, T, D]
    rms = jnp.sqrt(jnp.mean(values * values, axis=-1) + _EPS)  # [N, B, T]
    logits = jnp.einsum("nbtd,d->nbt", values, query.astype(jnp.float32)) / rms
    weights = jax.nn.softmax(logits, axis=0)  # [N, B, T]
    return jnp.einsum("nbt,nbtd->btd", weights, values).astype(contributions[0].dtype)


def add_gamma(module: nnx.Module, model_config: config_lib.ModelConfig, num_heads: int,
              head_dim: int) -> None:
    """Gives a routing-capable mixer its CLER gain ``module.gamma`` when ``mode == "cler"``.

    Sets ``module.value_routing`` (bool) and ``module.normalize_residual``; the gain is created
    only for value-space CLER (spec §4.3: hidden-stream routing creates no ``Gamma``).
    """
    cfg = model_config.routing
    module.value_routing = cfg.mode == "cler"
    module.normalize_residual = cfg.normalize_residual
    if module.value_routing:
        module.gamma = make_gamma(cfg, num_heads, head_dim)


def value_target(module: nnx.Module, v: Array, route_in: Optional[Array]) -> Array:
    """The value the kernel writes: ``v``, or ``v + Gamma r_src`` given a routed residual.

    Args:
      module: a mixer prepared by :func:`add_gamma`.
      v: ``[B, T, H, V]`` post-conv SiLU value.
      route_in: optional ``[B, T, H, V]`` residual of the nearest lower routing layer.

    Raises:
      ValueError: if ``route_in`` is given to a mixer built without value-space CLER, or its
        shape differs from ``v``'s.
    """
    if route_in is None:
        return v
    if not getattr(module, "value_routing", False):
        raise ValueError("route_in was given, but this mixer has no CLER gain; set "
                         "model.routing.mode='cler'")
    return inject_value(v, route_in, module.gamma[...], normalize=module.normalize_residual)


def mixer_outputs(y: Array, new_state, signals: RouteSignals, *, return_state: bool,
                  return_route: bool):
    """``y``, ``(y, state)``, ``(y, signals)`` or ``(y, state, signals)`` as requested."""
    out = (y,) + ((new_state,) if return_state else ()) + ((signals,) if return_route else ())
    return out[0] if len(out) == 1 else out
