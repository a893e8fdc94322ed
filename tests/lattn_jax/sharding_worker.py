"""Runs one multi-device check in a fresh process (driven by ``sharding_test.py``).

The number of simulated CPU devices must be fixed before JAX initialises, so each check runs as
``XLA_FLAGS=--xla_force_host_platform_device_count=N python sharding_worker.py MODE DIR`` and
prints one JSON line with its results.

Modes:
  ``step``: the 2 x 2 x 2 (data x fsdp x tensor) loss and gradients, in one pass and with
    gradient accumulation (two micro-batches), against the single-device one-pass ones (loss
    and every gradient), the parameter shardings, one sharded train step (its loss), then a
    sharded checkpoint saved to ``DIR`` (with the parameters as ``DIR/params.npz`` for the
    restoring side).
  ``restore``: restores that checkpoint onto a mesh of all this process's devices
    (fsdp x tensor = N/2 x 2) and compares it with ``params.npz``.
  ``process``: one of two processes of a multi-process run (:func:`run_process`).
"""

import dataclasses
import json
import os
import sys

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from lattn_jax import checkpoint as checkpoint_lib  # noqa: E402
from lattn_jax import config as config_lib  # noqa: E402
from lattn_jax import sharding  # noqa: E402
from lattn_jax import train  # noqa: E402

# The same compile settings as tests/conftest.py.
jax.config.update("jax_disable_most_optimizations", True)
jax.config.update("jax_default_matmul_precision", "highest")


def worker_xla_flags(devices: int) -> str:
    """``XLA_FLAGS`` for a worker process: the suite's own (``tests/conftest.py``) plus
    ``devices`` simulated CPU devices (also used by ``context_parallel_test``)."""
    inherited = os.environ.get("XLA_FLAGS", "")
    return f"{inherited} --xla_force_host_platform_device_count={devices}".strip()


def tiny_config(mesh: config_lib.MeshConfig, batch_size: int = 4,
                micro_batch_size=None) -> config_lib.ExperimentConfig:
    """GDN + softmax attention with every head count divisible by the 2-way tensor axis."""
    model = config_lib.ModelConfig(
        vocab_size=256, d_model=32, layer_pattern=("gdn", "attn"), mlp_hidden=64,
        attention=config_lib.AttentionConfig(num_heads=2, num_kv_heads=2, output_gate=True),
        gdn=config_lib.GatedDeltaNetConfig(num_k_heads=2, num_v_heads=4, head_k_dim=8,
                                           head_v_dim=8, chunk_size=8))
    data = train.data_lib.DataConfig(paths=(os.path.abspath(__file__),), tokenizer="byte",
                                     seq_len=16,
                                     batch_size=batch_size)
    return config_lib.ExperimentConfig(
        model=model, data=data, mesh=mesh,
        optim=config_lib.OptimConfig(learning_rate=1e-2, warmup_steps=0),
        train=config_lib.TrainConfig(total_steps=10, micro_batch_size=micro_batch_size))


def batch(seed: int = 0, rows: int = 4):
    """Random tokens, two documents per row, and random 0/1 weights (unequal token counts per
    row, so a mean of per-micro-batch means would differ from the token mean)."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 256, size=(rows, 17))
    segment_ids = np.repeat(np.array([[0] * 10 + [1] * 6]), rows, axis=0).astype(np.int32)
    weights = (rng.random((rows, 16)) < 0.7).astype(np.float32)
    return {"inputs": tokens[:, :-1].astype(np.int32), "targets": tokens[:, 1:].astype(np.int32),
            "weights": weights, "segment_ids": segment_ids}


def flat(tree):
    return {jax.tree_util.keystr(path): np.asarray(leaf)
            for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def spec_of(x):
    return str(tuple(x.sharding.spec))


def run_step(directory: str) -> dict:
    # One device takes the 8 rows in one pass; the 2 x 2 x 2 mesh both in one pass and in two
    # micro-batches of one row per data-parallel replica (gradient accumulation).
    single = train.Trainer(tiny_config(config_lib.MeshConfig(data=1), batch_size=8))
    state = single.init_state(0)
    b = batch(rows=8)
    loss1, grads1 = jax.jit(single.loss_and_grads)(state["params"], single.put_batch(b))

    cfg = tiny_config(config_lib.MeshConfig(data=2, fsdp=2, tensor=2), batch_size=8,
                      micro_batch_size=1)
    mesh = sharding.make_mesh(cfg.mesh)
    sharded = train.Trainer(cfg, mesh)
    state8 = sharded.init_state(0)
    one_pass = train.Trainer(dataclasses.replace(
        cfg, train=dataclasses.replace(cfg.train, micro_batch_size=None)), mesh)
    with sharding.activate(mesh, cfg.mesh.rules):
        loss8, grads8 = jax.jit(sharded.loss_and_grads)(state8["params"], sharded.put_batch(b))
        loss8_one, grads8_one = jax.jit(one_pass.loss_and_grads)(state8["params"],
                                                                 one_pass.put_batch(b))
    p = state8["params"]
    out = {
        "accum_steps": [sharded.accum_steps, one_pass.accum_steps],
        "loss1": float(loss1), "loss8": float(loss8), "loss8_one_pass": float(loss8_one),
        "init_max_diff": max(float(np.max(np.abs(a - c))) for a, c in zip(
            flat(state["params"]).values(), flat(p).values())),
        "grad_max_rel": {k: float(np.max(np.abs(a - flat(grads8)[k]))
                                  / (np.max(np.abs(a)) + 1e-12))
                         for k, a in flat(grads1).items()},
        "grad_max_rel_one_pass": {k: float(np.max(np.abs(a - flat(grads8_one)[k]))
                                           / (np.max(np.abs(a)) + 1e-12))
                                  for k, a in flat(grads1).items()},
        "specs": {"fc1": spec_of(p["blocks"][0]["mlp"]["fc1"]["kernel"]),
                  "embed": spec_of(p["embed"]),
                  "in_proj": spec_of(p["blocks"][0]["mixer"]["in_proj"]["kernel"]),
                  "norm": spec_of(p["final_norm"]["scale"])},
        "devices_per_fc1_shard": len(
            p["blocks"][0]["mlp"]["fc1"]["kernel"].sharding.device_set),
    }
    state8, metrics = sharded.train_step(state8, b)
    out["step_loss8"] = float(metrics["loss"])
    fc1_shape = p["blocks"][0]["mlp"]["fc1"]["kernel"].shape
    out["moment_specs"] = sorted({
        spec_of(leaf) for path, leaf in jax.tree_util.tree_flatten_with_path(
            state8["opt_state"])[0]
        if "fc1" in jax.tree_util.keystr(path) and leaf.shape == fc1_shape})
    ckpt = checkpoint_lib.Checkpointer(directory, async_save=False)
    ckpt.save(1, state8)
    ckpt.close()
    np.savez(os.path.join(directory, "params.npz"), **flat(state8))
    return out


def run_restore(directory: str) -> dict:
    n = jax.device_count()
    cfg = tiny_config(config_lib.MeshConfig(data=1, fsdp=n // 2, tensor=2))
    trainer = train.Trainer(cfg, sharding.make_mesh(cfg.mesh))
    ckpt = checkpoint_lib.Checkpointer(directory)
    restored = ckpt.restore(1, trainer.abstract_state())
    ckpt.close()
    expected = np.load(os.path.join(directory, "params.npz"))
    got = flat(restored)
    return {"devices": n, "mismatched": [k for k in expected.files
                                         if not np.array_equal(expected[k], got[k])],
            "fc1_spec": spec_of(restored["params"]["blocks"][0]["mlp"]["fc1"]["kernel"])}


def run_process(directory: str) -> dict:
    """One of two processes (``LATTN_PROCESS_ID`` 0/1, coordinator on ``localhost:
    LATTN_PORT``), each with 2 CPU devices: a data x fsdp = 2 x 2 mesh over both (or data x
    context with ``LATTN_MESH=context``), each process feeding its own 4 of the 8 rows (as the
    data pipeline does), two micro-batches per step.
    Compared with this process's one-device one-pass step on all 8 rows."""
    del directory
    from jax.experimental import multihost_utils
    pid = int(os.environ["LATTN_PROCESS_ID"])
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"localhost:{os.environ['LATTN_PORT']}", num_processes=2,
                               process_id=pid)
    b = batch(rows=8)
    single = train.Trainer(tiny_config(config_lib.MeshConfig(data=1), batch_size=8))
    state = single.init_state(0)
    loss1, grads1 = jax.jit(single.loss_and_grads)(state["params"], single.put_batch(b))
    total1, count1, _, _ = single.eval_step(state["params"], b)

    # LATTN_MESH=context: data 2 (one replica per process) x context 2 (each process's two
    # devices split every sequence; the documents of batch() cross the shard edge).
    axes = dict(fsdp=2) if os.environ.get("LATTN_MESH", "fsdp") == "fsdp" else dict(context=2)
    cfg = tiny_config(config_lib.MeshConfig(data=2, tensor=1, **axes), batch_size=8,
                      micro_batch_size=1)
    mesh = sharding.make_mesh(cfg.mesh)
    multi = train.Trainer(cfg, mesh)
    local = {k: v[4 * pid:4 * pid + 4] for k, v in b.items()}
    state2 = multi.init_state(0)
    with sharding.activate(mesh, cfg.mesh.rules):
        loss2, grads2 = jax.jit(multi.loss_and_grads)(state2["params"], multi.put_batch(local))
    grads2 = multihost_utils.process_allgather(grads2, tiled=True)
    total2, count2, _, _ = multi.eval_step(state2["params"], local)
    return {"process": pid, "processes": jax.process_count(), "devices": jax.device_count(),
            "mesh": dict(mesh.shape), "accum_steps": multi.accum_steps,
            "loss1": float(loss1), "loss2": float(loss2),
            "total1": float(total1), "total2": float(total2),
            "count1": float(count1), "count2": float(count2),
            "grad_max_rel": {k: float(np.max(np.abs(a - np.asarray(flat(grads2)[k])))
                                      / (np.max(np.abs(a)) + 1e-12))
                             for k, a in flat(grads1).items()}}


if __name__ == "__main__":
    mode, directory = sys.argv[1], sys.argv[2]
    result = {"step": run_step, "restore": run_restore, "process": run_process}[mode](directory)
    print("RESULT " + json.dumps(result))
