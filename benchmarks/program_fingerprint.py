"""Fingerprint of a preset's one-device train step as compiled for CUDA, on any host.

Exports ``Trainer.loss_and_grads`` of a ``configs/table2.py`` preset for CUDA (``jax.export``,
the Pallas GPU kernels included, as ``implementation="auto"`` picks them on a GPU) and prints
the sha256 of the module with its location metadata normalised (``#locNNN`` ids differ between
checkouts for the same program). Two checkouts with the same fingerprint run the same GPU
program, so they have the same step time: the check behind "``mesh.context = 1`` costs nothing"
(``benchmarks/results/context-parallel-h200-2026-12-01.md``). Run both checkouts from the same
directory: the kernels' Triton IR embeds source paths.

Usage::

    python benchmarks/program_fingerprint.py --variant=arch=gdn,stack=pure,opt=muon

Presets with softmax layers need cuDNN at lowering time, i.e. a GPU host.
"""

import argparse
import hashlib
import importlib.util
import os
import re
import sys
from unittest import mock

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from lattn_jax import config as config_lib  # noqa: E402
from lattn_jax import train  # noqa: E402


def fingerprint(variant: str, batch_size: int) -> dict:
    """``{"sha256", "chars", "triton_calls"}`` of the normalised CUDA export of one preset."""
    spec = importlib.util.spec_from_file_location("table2", os.path.join(_ROOT, "configs",
                                                                         "table2.py"))
    table2 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table2)
    cd = table2.get_config(variant)
    cd.data.paths = (os.path.join(_ROOT, "README.md"),)  # never read: shapes only
    cd.data.tokenizer = "byte"
    cd.data.batch_size = batch_size
    cd.model.dtype = "bfloat16"
    cfg = config_lib.experiment_from_config_dict(cd)
    with mock.patch.object(jax, "default_backend", lambda: "gpu"):
        trainer = train.Trainer(cfg)
        shape = (cfg.data.batch_size, cfg.data.seq_len)
        batch = {k: jax.ShapeDtypeStruct(shape, jnp.float32 if k == "weights" else jnp.int32)
                 for k in ("inputs", "targets", "weights", "segment_ids")}
        exported = jax.export.export(
            jax.jit(trainer.loss_and_grads), platforms=["cuda"],
            disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(
                "__gpu$xla.gpu.triton")])(trainer.abstract_state()["params"], batch)
    text = exported.mlir_module()
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#loc"))
    body = re.sub(r"#loc\d+", "#loc", body)
    return {"sha256": hashlib.sha256(body.encode()).hexdigest(), "chars": len(body),
            "triton_calls": text.count("xla.gpu.triton")}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default="arch=gdn,stack=pure,opt=muon",
                        help="configs/table2.py variant")
    parser.add_argument("--batch_size", type=int, default=16, help="rows per step")
    args = parser.parse_args()
    print(args.variant, fingerprint(args.variant, args.batch_size))


if __name__ == "__main__":
    main()
