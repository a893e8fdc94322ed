"""Every public op of ``pallas_kernels`` refuses a non-array argument with one ``TypeError``,
and so do the exported chunked, reference and associative forms (``FormArrayArgumentsTest``).

A Python list (or tuple) given for ``q``, ``k``, ``v``, a gate, ``initial_state`` or
``segment_ids`` raised ``AttributeError: 'list' object has no attribute 'shape'`` (or
``'dtype'``) deep inside the checks (2026-12-06 newcomer probe). The ops now say which argument
is not an array, as ``jax.numpy``'s own functions refuse lists
(:func:`pallas_kernels.common.check_array`); NumPy arrays are still accepted and give the same
result as JAX arrays.

Run from the repository root: ``python -m pytest -q tests/pallas_kernels/array_arguments_test.py``,
or as a script: ``python -m tests.pallas_kernels.array_arguments_test``.
"""

from absl.testing import absltest
from absl.testing import parameterized
import jax.numpy as jnp
import numpy as np

from pallas_kernels import common
from pallas_kernels import gated_delta_rule as gdr
from pallas_kernels import gdn2 as gdn2_lib
from pallas_kernels import kda as kda_lib
from pallas_kernels import simple_gla as sg

B, T, HK, H, K, V = 2, 8, 1, 2, 8, 8


def _inputs(seed):
    """Random NumPy inputs for every op's arrays (float32; ``segment_ids`` int32, 2 docs/row)."""
    rng = np.random.default_rng(seed)

    def normal(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    def log_decay(*shape):
        return -rng.uniform(0.01, 1.0, shape).astype(np.float32)

    def unit(*shape):
        return rng.uniform(0.05, 0.95, shape).astype(np.float32)

    cut = int(rng.integers(1, T))
    segment_ids = np.where(np.arange(T) < cut, 3, 7)[None].repeat(B, 0).astype(np.int32)
    return dict(q=normal(B, T, HK, K), k=normal(B, T, HK, K), v=normal(B, T, H, V),
                g=log_decay(B, T, H), g_k=log_decay(B, T, H, K), beta=unit(B, T, H),
                b=unit(B, T, H, K), w=unit(B, T, H, V), initial_state=normal(B, H, K, V),
                segment_ids=segment_ids, log_decay=log_decay(H))


# op name -> (function, positional argument names, the key of _inputs for each)
OPS = {
    "gated_delta_rule": (gdr.gated_delta_rule, ("q", "k", "v", "g", "beta"),
                         ("q", "k", "v", "g", "beta")),
    "delta_rule": (gdr.delta_rule, ("q", "k", "v", "beta"), ("q", "k", "v", "beta")),
    "kda": (kda_lib.kda, ("q", "k", "v", "g", "beta"), ("q", "k", "v", "g_k", "beta")),
    "gdn2": (gdn2_lib.gdn2, ("q", "k", "v", "g", "b", "w"), ("q", "k", "v", "g_k", "b", "w")),
    "simple_gla": (sg.simple_gla, ("q", "k", "v", "g"), ("q", "k", "v", "g")),
    "linear_attention": (sg.linear_attention, ("q", "k", "v"), ("q", "k", "v")),
    "lightning_attention": (sg.lightning_attention, ("q", "k", "v", "log_decay"),
                            ("q", "k", "v", "log_decay")),
}
KEYWORD_ARRAYS = ("initial_state", "segment_ids")


def _call(op, inputs, *, replace=None, convert=jnp.asarray):
    """Calls ``op`` on ``inputs`` (each array through ``convert``), with argument
    ``replace = (name, value)`` given as ``value`` instead."""
    fn, names, keys = OPS[op]
    args = {name: convert(inputs[key]) for name, key in zip(names, keys)}
    args.update({name: convert(inputs[name]) for name in KEYWORD_ARRAYS})
    if replace is not None:
        args[replace[0]] = replace[1]
    positional = [args.pop(name) for name in names]
    return fn(*positional, output_final_state=True, implementation="chunked", chunk_size=4,
              **args)


# The exported pure-JAX forms (package __init__s): name -> (function, positional argument
# names, the key of _inputs for each, extra keywords). They take q and k at the value heads.
_CHUNK = dict(chunk_size=4)
FORMS = {
    "gated_delta_rule_chunked": (gdr.gated_delta_rule_chunked, ("q", "k", "v", "g", "beta"),
                                 ("q_h", "k_h", "v", "g", "beta"), _CHUNK),
    "gated_delta_rule_reference": (gdr.gated_delta_rule_reference,
                                   ("q", "k", "v", "g", "beta"),
                                   ("q_h", "k_h", "v", "g", "beta"), {}),
    "kda_chunked": (kda_lib.kda_chunked, ("q", "k", "v", "g", "beta"),
                    ("q_h", "k_h", "v", "g_k", "beta"), _CHUNK),
    "kda_reference": (kda_lib.kda_reference, ("q", "k", "v", "g", "beta"),
                      ("q_h", "k_h", "v", "g_k", "beta"), {}),
    "kda_associative": (kda_lib.kda_associative, ("q", "k", "v", "g", "beta"),
                        ("q_h", "k_h", "v", "g_k", "beta"), {}),
    "gdn2_chunked": (gdn2_lib.gdn2_chunked, ("q", "k", "v", "g", "b", "w"),
                     ("q_h", "k_h", "v", "g_k", "b", "w"), _CHUNK),
    "gdn2_reference": (gdn2_lib.gdn2_reference, ("q", "k", "v", "g", "b", "w"),
                       ("q_h", "k_h", "v", "g_k", "b", "w"), {}),
    "gdn2_associative": (gdn2_lib.gdn2_associative, ("q", "k", "v", "g", "b", "w"),
                         ("q_h", "k_h", "v", "g_k", "b", "w"), {}),
    "simple_gla_chunked": (sg.simple_gla_chunked, ("q", "k", "v", "g"),
                           ("q_h", "k_h", "v", "g"), _CHUNK),
    "simple_gla_reference": (sg.simple_gla_reference, ("q", "k", "v", "g"),
                             ("q_h", "k_h", "v", "g"), {}),
    "simple_gla_associative": (sg.simple_gla_associative, ("q", "k", "v", "g"),
                               ("q_h", "k_h", "v", "g"), {}),
}


def _call_form(form, inputs, *, replace=None, convert=jnp.asarray):
    """``o`` of the exported form ``form`` on ``inputs`` (as :func:`_call`)."""
    fn, names, keys, extra = FORMS[form]
    inputs = dict(inputs, q_h=np.repeat(inputs["q"], H // HK, axis=2),
                  k_h=np.repeat(inputs["k"], H // HK, axis=2))
    args = {name: convert(inputs[key]) for name, key in zip(names, keys)}
    args.update({name: convert(inputs[name]) for name in KEYWORD_ARRAYS})
    if replace is not None:
        args[replace[0]] = replace[1]
    positional = [args.pop(name) for name in names]
    return fn(*positional, scale=K ** -0.5, **args, **extra)[0]


class FormArrayArgumentsTest(parameterized.TestCase):
    """The exported chunked, reference and associative forms (public API: each variant's
    ``__init__`` re-exports them) refuse a list as the ops do, before any computation."""

    @parameterized.named_parameters(
        (f"{form}_{name}", form, name, key)
        for form, (_, names, keys, _) in FORMS.items()
        for name, key in list(zip(names, keys)) + [(n, n) for n in KEYWORD_ARRAYS])
    def test_list_names_the_argument(self, form, name, key):
        inputs = _inputs(seed=len(form) * 31 + len(name))
        if key in ("q_h", "k_h"):
            value = np.repeat(inputs[key[0]], H // HK, axis=2).tolist()
        else:
            value = inputs[key].tolist()
        with self.assertRaisesRegex(
                TypeError, rf"^{name} must be a jax\.Array or numpy\.ndarray, got list: "
                           rf"convert it with jnp\.asarray\({name}\)$"):
            _call_form(form, inputs, replace=(name, value))

    @parameterized.named_parameters((form, form) for form in FORMS)
    def test_numpy_arrays_match_jax_arrays(self, form):
        inputs = _inputs(seed=len(form))
        o_np = _call_form(form, inputs, convert=np.asarray)
        o_jnp = _call_form(form, inputs)
        np.testing.assert_allclose(o_np, o_jnp, rtol=1e-6, atol=1e-6)
        self.assertGreater(float(jnp.abs(o_jnp).max()), 0.0)

    def test_check_arrays_skips_none_and_names_the_first(self):
        common.check_arrays(q=np.ones(2), initial_state=None)
        with self.assertRaisesRegex(TypeError, r"^k must be a "):
            common.check_arrays(q=np.ones(2), k=[1.0], v=(1.0,))


class ArrayArgumentsTest(parameterized.TestCase):

    @parameterized.named_parameters(
        (f"{op}_{name}", op, name, key)
        for op, (_, names, keys) in OPS.items()
        for name, key in list(zip(names, keys)) + [(n, n) for n in KEYWORD_ARRAYS]
        if not (op == "lightning_attention" and name == "log_decay"))  # array-likes taken
    def test_list_names_the_argument(self, op, name, key):
        inputs = _inputs(seed=len(op) * 31 + len(name))
        for kind in (list, tuple):
            value = inputs[key].tolist()
            value = tuple(value) if kind is tuple else value
            with self.subTest(kind=kind.__name__):
                with self.assertRaisesRegex(
                        TypeError, rf"^{name} must be a jax\.Array or numpy\.ndarray, got "
                                   rf"{kind.__name__}: convert it with jnp\.asarray\({name}\)$"):
                    _call(op, inputs, replace=(name, value))

    @parameterized.named_parameters((op, op) for op in OPS)
    def test_numpy_arrays_match_jax_arrays(self, op):
        inputs = _inputs(seed=len(op))
        o_np, state_np = _call(op, inputs, convert=np.asarray)
        o_jnp, state_jnp = _call(op, inputs)
        np.testing.assert_allclose(o_np, o_jnp, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(state_np, state_jnp, rtol=1e-6, atol=1e-6)
        self.assertGreater(float(jnp.abs(o_jnp).max()), 0.0)  # a real result, not zeros

    def test_check_array(self):
        common.check_array("q", np.ones((2, 3), np.float32))
        common.check_array("q", jnp.ones((2, 3)))
        for bad in ([1.0], (1.0,), 1.0, "q", None):
            with self.subTest(bad=bad), self.assertRaisesRegex(TypeError, r"^x must be a "):
                common.check_array("x", bad)


if __name__ == "__main__":
    absltest.main()
