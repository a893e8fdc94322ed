"""Context-parallel checks on simulated CPU devices (driven by ``context_parallel_test.py``).

Run as ``XLA_FLAGS=--xla_force_host_platform_device_count=8 python context_parallel_worker.py
MODE``; prints one ``RESULT {json}`` line. Every comparison is against the same computation on
one device without a mesh (the unsplit op, itself tested against the ``lax.scan`` references),
in fp32. Errors are ``max |a - b| / max |b|`` per array.

Modes:
  ``ops``: every linear-recurrence op (GDN, DeltaNet, KDA, GDN-2, simple GLA, Lightning, linear
    attention) on packed rows (documents of 37, 51 and 40 tokens; a document starting exactly
    on a shard edge; a document spanning three or more shards) with an initial state, for
    ``mesh.context`` = 2, 4 and 8: outputs, final state, residual, and the gradients of a loss
    of all of them with respect to q, k, v, every gate and the initial state.
  ``mixers``: every mixer module (with its short convolution, and softmax attention with RoPE
    and with NoPE + logit scaling) on a data 2 x context 4 mesh: outputs, the prefill state
    (``return_state``), and the gradients of every parameter and of the input.
  ``model``: a GDN + attention hybrid's training loss and gradients through the Trainer on a
    data 2 x context 2 x tensor 2 mesh.
  ``eval``: a hybrid language model's scoring log-probabilities (``Scorer``) and greedy
    generation from prompts of different lengths (``Generator``: context-parallel prefill, then
    decoding) under ``evaluation_mesh(4)`` (data 2 x context 4) against one device.
  ``export``: ``jax.export`` for CUDA of a bf16 GDN / attention / KDA hybrid's gradient under
    context 2 and 4 on abstract H200s (``sharding.abstract_mesh``; the Pallas GPU kernels inside
    the shard_map, as ``implementation="auto"`` picks them on a GPU, the backend being reported
    as "gpu" for the lowering): platforms, device count, kernel names and collectives.
  ``export_hopper``: the same with the GPU reporting compute capability 9.0, so GDN's layers
    lower to the Mosaic GPU kernels inside the shard_map (the Mosaic GPU interpreter cannot run
    them there: under shard_map on simulated CPU devices it fails its barrier bookkeeping and
    hangs, jax 0.10.2; so lowering is what CPU can check).
  ``hlo``: the compiled forward + backward of a GDN layer under context 4 at two sequence
    lengths: its collectives (kind, bytes, replica groups) read from the HLO text.
"""

import functools
import json
import os
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from lattn_jax import config as config_lib  # noqa: E402
from lattn_jax import context_parallel  # noqa: E402
from lattn_jax import mixers  # noqa: E402
from lattn_jax import sharding  # noqa: E402
from lattn_jax import train  # noqa: E402
from pallas_kernels.gated_delta_rule import api as gdr  # noqa: E402
from pallas_kernels.gdn2 import api as gdn2_api  # noqa: E402
from pallas_kernels.kda import api as kda_api  # noqa: E402
from pallas_kernels.simple_gla import api as sg  # noqa: E402
from tests.lattn_jax import sharding_worker  # noqa: E402

# The same compile settings as tests/conftest.py.
jax.config.update("jax_disable_most_optimizations", True)
jax.config.update("jax_default_matmul_precision", "highest")

T = 128  # row 0: documents of 37, 51, 40 tokens; row 1: 16 + 112 (a start on a shard edge)


def segment_ids(t: int = T) -> np.ndarray:
    seg = np.zeros((2, t), np.int32)
    seg[0, 37:88] = 1  # 51 tokens: shards 2-5 of 8, 1-2 of 4
    seg[0, 88:] = 2  # 40 tokens
    seg[1, 16:] = 1  # starts exactly at a shard edge for 8 shards (and spans 7 shards)
    return seg


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def context_mesh(data: int, context: int, tensor: int = 1):
    cfg = config_lib.MeshConfig(data=data, context=context, tensor=tensor)
    devices = jax.devices()[:data * context * tensor]
    return sharding.make_mesh(cfg, devices), cfg.rules


def _unit(x):
    return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def op_cases(rng):
    """(name, op, arrays, gate layouts, residual) with random inputs; GVA (HK=2, H=4)."""
    b, hk, h, dk, dv = 2, 2, 4, 16, 8
    f32 = jnp.float32
    normal = lambda *s: jnp.asarray(rng.normal(size=s), f32)  # noqa: E731
    uniform = lambda lo, hi, *s: jnp.asarray(rng.uniform(lo, hi, size=s), f32)  # noqa: E731
    q, k = _unit(normal(b, T, hk, dk)), _unit(normal(b, T, hk, dk))
    v = normal(b, T, h, dv)
    qh, kh = _unit(normal(b, T, h, dk)), _unit(normal(b, T, h, dk))
    chunked = dict(chunk_size=16, implementation="chunked")
    return [
        ("gdn", functools.partial(gdr.gated_delta_rule, return_residual=True, **chunked),
         (q, k, v, -uniform(0.01, 0.3, b, T, h), uniform(0.1, 0.9, b, T, h)),
         ("bth", "bth"), True),
        ("deltanet", functools.partial(gdr.delta_rule, return_residual=True, **chunked),
         (q, k, v, uniform(0.1, 0.9, b, T, h)), ("bth",), True),
        ("kda", functools.partial(kda_api.kda, **chunked),
         (q, k, v, -uniform(0.01, 0.3, b, T, h, dk), uniform(0.1, 0.9, b, T, h)),
         ("bthk", "bth"), False),
        ("gdn2", functools.partial(gdn2_api.gdn2, **chunked),
         (qh, kh, v, -uniform(0.01, 0.3, b, T, h, dk), uniform(0.1, 0.9, b, T, h, dk),
          uniform(0.1, 0.9, b, T, h, dv)), ("bthk", "bthk", "bthv"), False),
        ("simple_gla", functools.partial(sg.simple_gla, **chunked),
         (qh, kh, v, -uniform(0.01, 0.3, b, T, h)), ("bth",), False),
        ("lightning", functools.partial(sg.lightning_attention, **chunked),
         (qh, kh, v, -uniform(0.01, 0.3, h)), ("h",), False),
        ("linear_attention", functools.partial(sg.linear_attention, **chunked),
         (q, k, v), (), False),
    ]


def run_ops() -> dict:
    rng = np.random.default_rng(0)
    seg = jnp.asarray(segment_ids())
    out = {}
    for name, op, arrays, layouts, residual in op_cases(rng):
        b, h, dk, dv = arrays[0].shape[0], arrays[2].shape[2], arrays[0].shape[3], \
            arrays[2].shape[3]
        s0 = jnp.asarray(rng.normal(size=(b, h, dk, dv)), jnp.float32)
        w = [jnp.asarray(rng.normal(size=s), jnp.float32)
             for s in ((b, T, h, dv), (b, h, dk, dv), (b, T, h, dv))]

        def run(*args):
            *xs, s0 = args
            return context_parallel.linear_recurrence(
                op, xs[0], xs[1], xs[2], tuple(xs[3:]), layouts, segment_ids=seg,
                initial_state=s0, output_final_state=True, return_residual=residual)

        def loss(*args):  # one program for the outputs and the gradients
            outs = run(*args)
            total = jnp.sum(outs[0] * w[0]) + jnp.sum(outs[1] * w[1])
            if residual:
                total = total + jnp.sum(outs[2] * w[2])
            return total, outs

        argnums = tuple(range(len(arrays) + 1))
        step = jax.jit(jax.grad(loss, argnums=argnums, has_aux=True))
        gref, ref = step(*arrays, s0)
        for n in (2, 4, 8):
            mesh, rules = context_mesh(1, n)
            with sharding.activate(mesh, rules):
                grads, got = jax.jit(jax.grad(loss, argnums=argnums, has_aux=True))(*arrays, s0)
            names = ["o", "final_state"] + (["u"] if residual else [])
            errs = {nm: rel(a, r) for nm, a, r in zip(names, got, ref)}
            arg_names = ["q", "k", "v"] + [f"gate{i}" for i in range(len(arrays) - 3)] + [
                "initial_state"]
            errs.update({f"d_{nm}": rel(a, r) for nm, a, r in zip(arg_names, grads, gref)})
            out[f"{name}/context{n}"] = errs
    return out


def mixer_config(name: str) -> config_lib.ModelConfig:
    common = dict(vocab_size=64, d_model=32, mlp_hidden=64, layer_pattern=(name,))
    small = dict(num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=8, chunk_size=8)
    sections = {
        "gdn": dict(gdn=config_lib.GatedDeltaNetConfig(**small)),
        "deltanet": dict(deltanet=config_lib.DeltaNetConfig(**small)),
        "kda": dict(kda=config_lib.KDAConfig(**small)),
        "gdn2": dict(gdn2=config_lib.GDN2Config(**small)),
        "linear_attn": dict(linear_attn=config_lib.LinearAttentionConfig(**small)),
        "lightning": dict(lightning=config_lib.LightningConfig(
            num_heads=4, head_dim=8, chunk_size=8, conv_width=4)),
        "attn": dict(attention=config_lib.AttentionConfig(num_heads=4, num_kv_heads=2)),
        "attn_nope": dict(attention=config_lib.AttentionConfig(
            num_heads=4, num_kv_heads=2, qk_norm=True, output_gate=True,
            logit_scaling_base=500.0)),
    }
    return config_lib.ModelConfig(**common, **sections[name])


def run_mixers() -> dict:
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(2, T, 32)), jnp.float32)
    seg = jnp.asarray(segment_ids())
    mesh, rules = context_mesh(2, 4)
    out = {}
    for name in ("gdn", "deltanet", "kda", "gdn2", "linear_attn", "lightning", "attn",
                 "attn_nope"):
        module = mixers.build_mixer(name, mixer_config(name), rngs=nnx.Rngs(0))
        graphdef, params = nnx.split(module)
        w = jnp.asarray(rng.normal(size=x.shape), jnp.float32)

        def loss(params, x):  # the prefill's outputs and state, and the gradients
            y, state = nnx.merge(graphdef, params)(x, segment_ids=seg, return_state=True)
            return jnp.sum(y * w), (y, state)

        step = lambda: jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))  # noqa: E731
        ref_g, (ref_y, ref_state) = step()(params, x)
        with sharding.activate(mesh, rules):
            g, (y, state) = step()(params, x)
        errs = {"y": rel(y, ref_y), "d_x": rel(g[1], ref_g[1])}
        for prefix, got, want in (("state", state, ref_state), ("d", g[0], ref_g[0])):
            paths = jax.tree_util.tree_flatten_with_path(got)[0]
            for (path, a), r in zip(paths, jax.tree_util.tree_leaves(want)):
                errs[prefix + jax.tree_util.keystr(path)] = rel(a, r) if np.size(r) else 0.0
        out[name] = errs
    return out


def run_model() -> dict:
    single = train.Trainer(sharding_worker.tiny_config(config_lib.MeshConfig(data=1),
                                                       batch_size=8))
    state = single.init_state(0)
    batch = sharding_worker.batch(rows=8)
    batch["segment_ids"] = np.repeat(np.array([[0] * 5 + [1] * 7 + [2] * 4]), 8,
                                     axis=0).astype(np.int32)  # documents cross shard edges
    loss1, grads1 = jax.jit(single.loss_and_grads)(state["params"], single.put_batch(batch))
    cfg = sharding_worker.tiny_config(config_lib.MeshConfig(data=2, context=2, tensor=2),
                                      batch_size=8)
    mesh = train.make_mesh(cfg)
    trainer = train.Trainer(cfg, mesh)
    state8 = trainer.init_state(0)
    with sharding.activate(mesh, cfg.mesh.rules):
        put = trainer.put_batch(batch)
        loss8, grads8 = jax.jit(trainer.loss_and_grads)(state8["params"], put)
    flat1, flat8 = sharding_worker.flat(grads1), sharding_worker.flat(grads8)
    return {"mesh": dict(mesh.shape), "loss1": float(loss1), "loss8": float(loss8),
            "inputs_spec": str(tuple(put["inputs"].sharding.spec)),
            "grad_rel": {k: rel(flat8[k], a) for k, a in flat1.items()}}


def run_eval() -> dict:
    from lattn_jax import model as model_lib
    from lattn_jax.eval import generate as gen_lib
    from lattn_jax.eval import scoring

    cfg = config_lib.ModelConfig(
        vocab_size=64, d_model=32, mlp_hidden=64, layer_pattern=("gdn", "attn", "lightning"),
        gdn=config_lib.GatedDeltaNetConfig(num_k_heads=2, num_v_heads=4, head_k_dim=8,
                                           head_v_dim=8, chunk_size=8),
        attention=config_lib.AttentionConfig(num_heads=4, num_kv_heads=2),
        lightning=config_lib.LightningConfig(num_heads=4, head_dim=8, chunk_size=8))
    model = model_lib.LanguageModel(cfg, rngs=nnx.Rngs(3))
    rng = np.random.default_rng(4)
    inputs = rng.integers(0, 64, size=(4, 64))
    targets = rng.integers(0, 64, size=(4, 64))
    prompts = [list(rng.integers(1, 64, size=n)) for n in (5, 23, 40, 17)]

    def evaluate(model):
        lp, _ = scoring.Scorer(model, max_len=64, batch_size=4).token_logprobs(inputs, targets)
        gen = gen_lib.Generator(model, pad_id=0, bucket=16)
        out = gen.generate(prompts, max_new_tokens=6)
        return lp, out.tokens

    ref_lp, ref_tokens = evaluate(model)
    mesh = context_parallel.evaluation_mesh(4)
    with sharding.activate(mesh, config_lib.DEFAULT_AXIS_RULES):
        lp, tokens = evaluate(context_parallel.replicate(model, mesh))
    return {"mesh": dict(mesh.shape), "logprob_rel": rel(lp, ref_lp),
            "tokens_equal": tokens == ref_tokens, "tokens": [list(map(int, t)) for t in tokens]}


def run_export(hopper: bool = False) -> dict:
    import contextlib
    from unittest import mock

    from lattn_jax import model as model_lib
    from pallas_kernels.common import mosaic_gpu

    small = dict(num_k_heads=2, num_v_heads=4, head_k_dim=64, head_v_dim=64, chunk_size=64)
    cfg = config_lib.ModelConfig(
        vocab_size=64, d_model=256, mlp_hidden=256, layer_pattern=("gdn", "attn", "kda"),
        dtype="bfloat16", gdn=config_lib.GatedDeltaNetConfig(**small),
        kda=config_lib.KDAConfig(**small),
        attention=config_lib.AttentionConfig(num_heads=4, num_kv_heads=2))
    out = {"backend": jax.default_backend(), "jax": jax.__version__}
    # On a host without a GPU the kernels' choice and lowering are told "gpu"; the target
    # H200s are abstract devices (jax >= 0.11 compiles Triton while lowering, for them).
    # ``hopper``: the GPU also reports compute capability 9.0, so auto takes the Mosaic GPU
    # kernels where its choice is Mosaic (GDN's; KDA keeps its Triton passes by default).
    cc = (mock.patch.object(mosaic_gpu, "compute_capability", return_value=(9, 0)) if hopper
          else contextlib.nullcontext())
    with mock.patch.object(jax, "default_backend", lambda: "gpu"), cc:
        graphdef, params = nnx.split(model_lib.LanguageModel(cfg, rngs=nnx.Rngs(0)))
        tokens = jax.ShapeDtypeStruct((1, 512), jnp.int32)

        def loss(params, tokens, segment_ids):
            logits = nnx.merge(graphdef, params)(tokens, segment_ids=segment_ids)
            return jnp.mean(jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1))

        for n in (2, 4):
            mesh_cfg = config_lib.MeshConfig(data=1, context=n)
            mesh = sharding.abstract_mesh(mesh_cfg, n)
            replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
            abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), params)
            with sharding.activate(mesh, mesh_cfg.rules):
                exported = jax.export.export(
                    jax.jit(jax.grad(loss), in_shardings=replicated, out_shardings=replicated),
                    platforms=["cuda"],
                    disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(
                        "__gpu$xla.gpu.triton")])(abstract, tokens, tokens)
            text = exported.mlir_module()
            out[str(n)] = {
                "nr_devices": exported.nr_devices, "platforms": list(exported.platforms),
                "kernels": sorted(set(re.findall(r'name = "([a-z0-9_]+)"', text))),
                "mosaic_calls": text.count("custom_call @mosaic_gpu"),
                "mosaic_kernels": sorted(set(re.findall(
                    r"((?:gdn|channelwise)_[a-z0-9_]*?)_mosaic_gpu\b", text))),
                "collective_permutes": text.count("stablehlo.collective_permute"),
                "all_gathers": text.count("stablehlo.all_gather")}
    return out


_COLLECTIVE = re.compile(
    r"=\s*(.*?)\s+(all-gather|all-reduce|collective-permute|all-to-all|"
    r"reduce-scatter)(?:-start)?\(")
_BYTES = {"f32": 4, "s32": 4, "u32": 4, "pred": 1, "bf16": 2, "f16": 2, "s8": 1, "u8": 1}


def _shape_bytes(text: str) -> int:
    total = 0
    for dtype, dims in re.findall(r"([a-z]+[0-9]*)\[([0-9,]*)\]", text):
        size = int(np.prod([int(d) for d in dims.split(",") if d])) if dims else 1
        total += size * _BYTES.get(dtype, 4)
    return total


def run_hlo() -> dict:
    cfg = mixer_config("gdn")
    module = mixers.build_mixer("gdn", cfg, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(module)
    mesh, rules = context_mesh(1, 4)
    out = {}
    for t in (256, 512):
        rng = np.random.default_rng(2)
        x = jnp.asarray(rng.normal(size=(1, t, 32)), jnp.float32)
        seg = jnp.asarray(np.repeat(np.arange(4), t // 4)[None].astype(np.int32) % 2)

        def loss(params, x):
            return jnp.sum(nnx.merge(graphdef, params)(x, segment_ids=seg) ** 2)

        with sharding.activate(mesh, rules):
            text = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(params, x).compile().as_text()
        ops = []
        for line in text.splitlines():
            match = _COLLECTIVE.search(line)
            if match:
                groups = re.search(r"replica_groups=(\S+?),? (?:use_global|to_apply|channel)", line)
                ops.append({"kind": match.group(2), "bytes": _shape_bytes(match.group(1)),
                            "groups": groups.group(1) if groups else "",
                            "line": line.strip()[:300]})
        out[str(t)] = ops
    return out


if __name__ == "__main__":
    mode = sys.argv[1]
    result = {"ops": run_ops, "mixers": run_mixers, "model": run_model, "eval": run_eval,
              "export": run_export, "export_hopper": functools.partial(run_export, hopper=True),
              "hlo": run_hlo}[mode]()
    print("RESULT " + json.dumps(result))
