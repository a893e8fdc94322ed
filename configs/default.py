"""Default run: a small Gated DeltaNet / softmax-attention hybrid on the bundled WikiText-2 text.

Sized to train on a 2-core CPU in a few minutes; it reports a validation loss well below the
corpus's unigram entropy. Launch (from the repository root)::

    python experiments/train.py --config=configs/default.py --workdir=runs/default

Override anything from the command line, e.g. ``--config.train.total_steps=600`` or
``--config.model.layer_pattern='("gdn","gdn","attn","gdn")'``. The argument string selects a
variant: ``--config=configs/default.py:pattern=pure`` (``hybrid`` | ``pure`` | ``dense``).
"""

import ml_collections
from ml_collections import config_dict

from configs import common

PATTERNS = {
    "hybrid": ("gdn", "gdn", "attn", "gdn", "gdn", "attn"),
    "pure": ("gdn",) * 6,
    "dense": ("attn",) * 6,
}


def get_config(arg=None):
    arg = common.parse_arg(arg, pattern="hybrid")
    if arg.pattern not in PATTERNS:
        raise common.ConfigArgError(f"pattern={arg.pattern!r}; choose from {', '.join(PATTERNS)}")
    config = ml_collections.ConfigDict()
    config.model = dict(
        vocab_size=32000,
        d_model=128,
        layer_pattern=PATTERNS[arg.pattern],
        mlp_hidden=352,
        tie_embeddings=True,
        norm_eps=1e-5,
        init_std=0.02,
        dtype="float32",
        param_dtype="float32",
        use_segment_ids=True,
        remat=False, remat_policy="nothing_saveable", split_projections=False,
        swiglu_packed=False, norm_implementation="xla",
        # Paper 1 puts a sigmoid output gate on the softmax layers of GDN hybrids only; the
        # dense (Transformer++) baseline has none.
        attention=dict(num_heads=4, num_kv_heads=2, head_dim=config_dict.placeholder(int),
                       implementation="auto",
                       rope_theta=config_dict.FieldReference(500_000.0, field_type=float),
                       output_gate=arg.pattern != "dense", qk_norm=False),
        gdn=dict(num_k_heads=2, num_v_heads=4, head_k_dim=32, head_v_dim=32, conv_width=4,
                 chunk_size=64, implementation="auto", norm_eps=1e-5),
        # The other linear mixers at gdn's size (DeltaNet and linear attention as paper 1
        # sizes them against GDN: half the value heads, twice the value width), so that a
        # --config.model.layer_pattern naming them compares like with like; without these
        # sections they took ModelConfig's 350M-scale defaults, 2-2.5x gdn's parameters here.
        deltanet=dict(num_k_heads=2, num_v_heads=2, head_k_dim=32, head_v_dim=64,
                      chunk_size=64, implementation="auto"),
        kda=dict(num_k_heads=2, num_v_heads=4, head_k_dim=32, head_v_dim=32, chunk_size=64,
                 implementation="auto"),
        gdn2=dict(num_k_heads=2, num_v_heads=4, head_k_dim=32, head_v_dim=32, chunk_size=64,
                  implementation="auto"),
        linear_attn=dict(num_k_heads=2, num_v_heads=2, head_k_dim=32, head_v_dim=64,
                         chunk_size=64, implementation="auto"),
    )
    config.data = common.bundled_wikitext_data(seq_len=128, batch_size=16)
    # The warm-up is a tenth of the run (20 of the 200 steps), so a shorter run
    # (--config.train.total_steps=20) still warms up and decays; --config.optim.warmup_steps
    # sets it outright.
    total_steps = config_dict.FieldReference(200)
    # Every optimizer option is listed (common.optim_section), so any can be overridden, e.g.
    # --config.optim.name=muon.
    config.optim = common.optim_section(
        name="adamw", learning_rate=3e-3, min_lr_ratio=0.1, warmup_steps=total_steps // 10,
        schedule="wsd", decay_fraction=0.2, decay_shape="minus_sqrt", b1=0.9, b2=0.95,
        eps=1e-8, weight_decay=0.1, grad_clip=1.0)
    # 200 steps x 16 x 128 tokens = 410k tokens, about 0.7 epochs of the training split: about
    # 5 minutes on an idle 2-core CPU, ending about 1 nat below the unigram entropy.
    # Mesh axes (data x fsdp x context x tensor); -1 takes the remaining devices; context splits
    # each sequence over devices (BUILD.md "Context parallelism"). One device: no mesh.
    config.mesh = dict(data=-1, fsdp=1, context=1, tensor=1)
    config.train = common.train_section(total_steps=total_steps, eval_every=50,
                                        checkpoint_every=50, keep_checkpoints=2, log_every=10,
                                        seed=0)
    return config
