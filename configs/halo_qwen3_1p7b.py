"""HALO at paper scale: Qwen3-1.7B -> HypeNet-2B (spec ``hypenet-halo.md`` §1.1, §3.6).

28 layers -> 7 NoPE attention layers (the authors' selection is 2, 3, 6, 8, 9, 21, 25; set
``--config.hypenet.attention_layers="(2,3,6,8,9,21,25)"`` to skip the sweep), 21 Lightning layers
(16 heads, head dim 128, RoPE base 1e6). Recipe (8 GPUs in the paper): Stage 1 20K steps x 32 x
512 tokens, LR 1e-3 -> 1e-5; Stage 2 20K x 96 x 512, 1e-4 -> 1e-5; Stage 3 500 x 128 x 16,384,
constant 1e-5; AdamW (0.9, 0.95), wd 0, clip 1, 50 warm-up steps; inference ``a = 500``.
Data: FineWeb-Edu (sample/100BT) as local Parquet/JSONL files or token shards, EOS-delimited
packing, no BOS, no shuffling (spec §3.5).

Usage::

    python experiments/halo.py --config=configs/halo_qwen3_1p7b.py --workdir=runs/hypenet2b \\
        --config.teacher.path=/models/Qwen3-1.7B --config.data.paths="('/data/fineweb',)" \\
        --config.data.tokenizer_path=/models/Qwen3-1.7B/tokenizer.json --stage=stage1
"""

from ml_collections import config_dict

from configs import common
from lattn_jax.halo import experiment


def get_config(arg=None):
    common.parse_arg(arg)
    data = dict(paths=config_dict.placeholder(tuple), format="auto", text_field="text",
                doc_split="file", tokenizer="huggingface",
                tokenizer_path=config_dict.placeholder(str), val_fraction=0.001, seed=0,
                shuffle=False, max_val_batches=16)
    cfg = experiment.base_config(
        teacher_path=None, teacher_kind="hf", data=data,
        stage_lengths={"stage1": (512, 32, 20_000), "stage2": (512, 96, 20_000),
                       "stage3": (16_384, 128, 500)},
        lrs={"stage1": 1e-3, "stage2": 1e-4, "stage3": 1e-5},
        min_lrs={"stage1": 1e-5, "stage2": 1e-5, "stage3": 1e-5},
        checkpoint_every=1000)
    cfg.stage3.train.checkpoint_every = 50
    cfg.select.max_new_tokens = 32
    cfg.calibrate.candidates = (None, 100.0, 200.0, 362.0, 500.0, 1000.0, 2000.0)
    return cfg
