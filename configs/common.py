"""Shared helpers for config files: ``parse_arg`` and the default bundled-corpus data section.

A config file defines ``get_config(arg=None)`` returning an ``ml_collections.ConfigDict``. The
``arg`` string (after the colon in ``--config=configs/x.py:arg``) is a comma-separated list of
``key=value`` pairs or bare flags, parsed by :func:`parse_arg`.
"""

import ast
import dataclasses
import os
import typing

import ml_collections
from ml_collections import config_dict

from lattn_jax import assets
from lattn_jax import config as config_lib


class ConfigArgError(config_lib.ConfigArgumentError):
    """A bad ``--config=file.py:arg`` argument string (a ``ValueError``; a command-line mistake,
    reported as its message alone, not as an error in the config file)."""


def parse_arg(arg, **defaults):
    """Parses ``"a=1,b=x,flag"`` into a ConfigDict, starting from ``defaults``.

    Values are read as Python literals when possible (``1``, ``0.5``, ``True``), else kept as
    strings; a bare name sets that flag (a ``bool`` default) to ``True``.

    Raises:
      ConfigArgError (a ValueError): for a key that is not in ``defaults``, a value whose
        type does not match the default's (``stage2_len=abc``), or a bare name whose default is
        not a ``bool`` (``corpus`` for ``corpus=<dir>``: it needs a value), naming the argument.
    """
    out = ml_collections.ConfigDict(defaults)
    if not arg:
        return out
    for item in arg.split(","):
        key, sep, value = item.partition("=")
        key = key.strip()
        if key not in defaults:
            raise ConfigArgError(
                f"unknown config argument {key!r}; known: {', '.join(defaults)}")
        if not sep:
            if not isinstance(defaults[key], bool):  # ``corpus`` for ``corpus=<dir>``
                raise ConfigArgError(f"config argument {key!r} needs a value: {key}=... (the "
                                     f"default is {defaults[key]!r})")
            out[key] = True
            continue
        try:
            parsed = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            parsed = value
        try:
            out[key] = parsed
        except TypeError:
            raise ConfigArgError(
                f"config argument {key}={value!r}: expected type "
                f"{type(defaults[key]).__name__} (the default is {defaults[key]!r})") from None
    return out


def bundled_wikitext_data(seq_len: int, batch_size: int) -> ml_collections.ConfigDict:
    """Data section for the WikiText-2 raw validation + test text bundled in the package.

    Documents are Wikipedia articles; tokens are LLaMA-2 SentencePiece ids (the paper's), with EOS
    after every article and no BOS.
    """
    return ml_collections.ConfigDict(dict(
        # A tuple, so that it can be overridden: --config.data.paths="('/data/a.txt',)".
        # Bundled files by name, resolved in the package at run time (lattn_jax.assets), so
        # that a run directory's config.json does not depend on where the clone lives.
        paths=(assets.BUNDLED + assets.WIKITEXT2_DIR + "/wiki.valid.raw",
               assets.BUNDLED + assets.WIKITEXT2_DIR + "/wiki.test.raw"),
        format="auto",  # per file: .jsonl / .jsonl.gz / .json.gz are JSONL, the rest text
        text_field="text",
        # Bad JSONL records (not an object, no text) allowed before the read stops.
        max_bad_fraction=0.01,
        doc_split="wikitext",
        tokenizer="sentencepiece",
        # None: the bundled LLaMA-2 model (paper 1's tokenizer); set a path for another
        # SentencePiece model, or --config.data.tokenizer=byte for bytes.
        tokenizer_path=config_dict.placeholder(str),
        seq_len=seq_len,
        batch_size=batch_size,
        val_fraction=0.05,
        # A corpus with its own validation split (experiments/build_corpus.py writes one):
        # --config.data.val_paths="('/data/open_offline/prose-llama2/validation',)".
        val_paths=config_dict.placeholder(tuple),
        seed=0,
        shuffle=True,  # reshuffle the train windows every epoch (False: corpus order)
        max_val_batches=config_dict.placeholder(int),
    ))


# ------------------------------------------------------------------------------------------------
# Paper 1 (arXiv 2607.07953) presets: one source of truth for sizes, stacks, recipes.
# ------------------------------------------------------------------------------------------------

# Linear-mixer heads (HK, K, H, V) and model sizes, spec §2 and §3. "tiny" shrinks everything to a
# CPU-sized model with the same structure (stack pattern, gates, routing) for smoke runs.
PAPER1_SIZES = {
    "350m": dict(
        d_model=1024, mlp_linear=2816, mlp_dense=2560,
        attention=dict(num_heads=16, num_kv_heads=4, head_dim=64),
        heads=dict(gdn=(4, 64, 8, 64), deltanet=(4, 64, 4, 128), kda=(4, 64, 8, 64),
                   gdn2=(4, 64, 8, 64)),
        chunk_size=64),
    # 1.3B/40B Muon launcher (transformer-pp-1p3b-fwe40b-env.sh): 16 query heads / 8 KV of 128;
    # DeltaNet 8 x (64 / 128) as in the 1.3B DeltaNet launchers (spec §3 "Larger configs").
    "1p3b": dict(
        d_model=2048, mlp_linear=5632, mlp_dense=5632,
        attention=dict(num_heads=16, num_kv_heads=8, head_dim=128),
        heads=dict(gdn=(8, 64, 16, 64), deltanet=(8, 64, 8, 128)),
        chunk_size=64),
    # The small member of the 350M family (configs/sweeps/table2_small.py): every width halved
    # (d, F, and the number of query/KV/linear heads), head dims kept at 64 / 128 (the GPU
    # kernels' sizes), so F/d, the GQA ratio and the key/value widths per d are the 350M ones;
    # depth SMALL_NUM_LAYERS. 15.4M-17.5M non-embedding parameters.
    "small": dict(
        d_model=512, mlp_linear=1408, mlp_dense=1280,
        attention=dict(num_heads=8, num_kv_heads=2, head_dim=64),
        heads=dict(gdn=(2, 64, 4, 64), deltanet=(2, 64, 2, 128), kda=(2, 64, 4, 64),
                   gdn2=(2, 64, 4, 64)),
        chunk_size=64),
    "tiny": dict(
        d_model=64, mlp_linear=176, mlp_dense=160,
        attention=dict(num_heads=4, num_kv_heads=2, head_dim=16),
        heads=dict(gdn=(2, 16, 4, 16), deltanet=(2, 16, 2, 32), kda=(2, 16, 4, 16),
                   gdn2=(2, 16, 4, 16)),
        chunk_size=16),
}

# Hosts whose hybrids put a sigmoid output gate on the softmax layers (spec §2.5, §10 item 5):
# GDN and GDN-2 hybrids only; the dense baseline, DeltaNet and KDA hybrids have none.
OUTPUT_GATE_HOSTS = ("gdn", "gdn2")

TINY_LAYERS = 6  # keeps the [lin, lin, attn] x 2 hybrid structure
# Depth of the "small" size for every architecture: the 350M layer counts (24 / 22 / 20) divided
# by 4 and rounded to the [lin, lin, attn] period, so every hybrid has 2 softmax layers.
SMALL_NUM_LAYERS = 6


def paper1_model(linear, stack, num_layers, *, size="350m", mlp_hidden=None,
                 routing=None) -> ml_collections.ConfigDict:
    """The ``model`` section of a paper-1 run (spec §1-§3).

    Args:
      linear: linear mixer ``"gdn"``, ``"deltanet"``, ``"kda"`` or ``"gdn2"`` (``None`` for a
        dense stack).
      stack: ``"pure"``, ``"hybrid"`` (softmax at layers ``i`` with ``(i + 1) % 3 == 0``) or
        ``"dense"``.
      num_layers: ``L`` (ignored, :data:`TINY_LAYERS`, when ``size="tiny"``).
      size: a key of :data:`PAPER1_SIZES`.
      mlp_hidden: SwiGLU ``F``; ``None`` means 2816 for linear/hybrid stacks and 2560 for the
        dense softmax baseline at 350M (spec §1).
      routing: ``model.routing`` options (``mode``, ``rank``, ``attn_res``, ...), or ``None``.

    Returns:
      A ConfigDict for ``ModelConfig``: vocab 32000 untied, RMSNorm eps 1e-5, init std 0.02,
      RoPE 5e5 in softmax layers only, bf16 compute with fp32 params (fp32 for ``tiny``), no
      state reset at document boundaries (spec §10 item 17).

    Raises:
      ConfigArgError: for an unknown size or a linear mixer the size has no heads for.
    """
    if size not in PAPER1_SIZES:
        raise ConfigArgError(f"size={size!r}; choose from {', '.join(PAPER1_SIZES)}")
    s = PAPER1_SIZES[size]
    tiny = size == "tiny"
    if tiny:
        num_layers = TINY_LAYERS
    pattern = config_lib.stack_pattern(stack, num_layers, linear)
    if mlp_hidden is None:
        mlp_hidden = s["mlp_dense"] if stack == "dense" else s["mlp_linear"]
    model = dict(
        vocab_size=32000,
        d_model=s["d_model"],
        layer_pattern=pattern,
        mlp_hidden=mlp_hidden,
        tie_embeddings=False,
        norm_eps=1e-5,
        init_std=0.02,
        dtype="float32" if tiny else "bfloat16",
        param_dtype="float32",
        use_segment_ids=False,
        # split_projections: the GDN-pure step 164.2 -> 161.7 ms on the H200 (2026-11-30).
        # swiglu_packed: MOSAIC_GPU.md Sec. 46.2's experiment, off until its A/B decides.
        # norm_implementation: the one-pass Pallas RMSNorm is "pallas", off ("xla") until its
        # A/B on a card decides (MOSAIC_GPU.md Sec. 47).
        remat=False, remat_policy="nothing_saveable", split_projections=True,
        swiglu_packed=False, norm_implementation="xla",
        attention=dict(rope_theta=500_000.0, qk_norm=False, implementation="auto",
                       output_gate=stack == "hybrid" and linear in OUTPUT_GATE_HOSTS,
                       **s["attention"]),
    )
    if stack != "dense":
        if linear not in s["heads"]:
            raise ConfigArgError(f"no {linear!r} heads for size={size!r}; choose from "
                                 f"{', '.join(s['heads'])}")
        hk, dk, h, dv = s["heads"][linear]
        model[linear] = dict(num_k_heads=hk, num_v_heads=h, head_k_dim=dk, head_v_dim=dv,
                             conv_width=4, chunk_size=s["chunk_size"], implementation="auto",
                             norm_eps=1e-5)
    routing = dict(routing or {})
    model["routing"] = dict(
        mode=routing.pop("mode", "none"), gamma_mode=routing.pop("gamma_mode", "scalar"),
        gamma_init=float(routing.pop("gamma_init", 0.0)),
        normalize_residual=routing.pop("normalize_residual", False),
        rank=config_dict.FieldReference(routing.pop("rank", None), field_type=int),
        normalize_input=routing.pop("normalize_input", False),
        attn_res=routing.pop("attn_res", False))
    if routing:
        raise ConfigArgError(f"unknown routing option(s) {', '.join(routing)}")
    return ml_collections.ConfigDict(model)


# Optimizer recipes (spec §5): AdamW lr 3e-4; Muon (NorMuon) lr 3.6e-4 with the Adam-routed
# params (embeddings, head, norms, gates, conv) at 1.5e-3; both min 0.1x, wd 0.1, betas
# (0.9, 0.95), eps 1e-8, clip 1.0, warm-up then WSD with a minus_sqrt cool-down over 20%.
OPTIMIZERS = ("adamw", "muon")
DEFAULT_LR = {"adamw": 3e-4, "muon": 3.6e-4}


def optim_section(**values) -> ml_collections.ConfigDict:
    """An ``optim`` section holding every :class:`~lattn_jax.config.OptimConfig` option.

    Every option can then be overridden from the command line (``--config.optim.name=muon``);
    options whose default is ``None`` become typed placeholders.

    Args:
      **values: options that differ from the dataclass defaults.

    Raises:
      ConfigArgError: for a name that is not an optimizer option.
    """
    fields = {f.name: f for f in dataclasses.fields(config_lib.OptimConfig)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigArgError(f"unknown optim option(s) {unknown}; choose from {sorted(fields)}")
    section = {}
    for name, field in fields.items():
        value = values.get(name, field.default)
        if value is None or field.default is None:
            kind = typing.get_args(field.type)[0] if typing.get_args(field.type) else field.type
            value = config_dict.FieldReference(value, field_type=kind)
        section[name] = value
    return ml_collections.ConfigDict(section)


def paper1_optim(opt, *, warmup_steps, learning_rate=None,
                 adamw_learning_rate=1.5e-3) -> ml_collections.ConfigDict:
    """The ``optim`` section of a paper-1 run (spec §5.1-5.3).

    Args:
      opt: ``"adamw"`` or ``"muon"``.
      warmup_steps: linear warm-up length.
      learning_rate: peak LR (of the Muon group for ``"muon"``); ``None`` is
        :data:`DEFAULT_LR`.
      adamw_learning_rate: Muon only: the constant LR of the Adam-routed parameters (spec
        §5.1: 1.5e-3).

    Raises:
      ConfigArgError: for an unknown optimizer.
    """
    if opt not in OPTIMIZERS:
        raise ConfigArgError(f"opt={opt!r}; choose from {', '.join(OPTIMIZERS)}")
    return optim_section(
        name=opt,
        learning_rate=DEFAULT_LR[opt] if learning_rate is None else float(learning_rate),
        adamw_learning_rate=adamw_learning_rate if opt == "muon" else None,
        muon_momentum=0.95, muon_ns_steps=5,
        min_lr_ratio=0.1, warmup_steps=warmup_steps, schedule="wsd", decay_fraction=0.2,
        decay_shape="minus_sqrt", b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1, grad_clip=1.0)


# Token budgets (spec §5.3-5.4): steps at GBS 128 x 4096 (350M) or GBS 512 (1.3B), warm-up.
BUDGETS = {
    "15b": dict(total_steps=28_610, warmup_steps=200, batch_size=128, eval_every=500),
    "1b": dict(total_steps=1_907, warmup_steps=200, batch_size=128, eval_every=100),
    # 1.3B/40B: 9,765,625 samples at GBS 512 = 19,073 it; warm-up 25,600 samples = 50 it
    # (the launchers' sample-based warm-up; not stated for this launcher in the spec).
    "40b": dict(total_steps=19_073, warmup_steps=50, batch_size=512, eval_every=500),
    # The "small" size (configs/sweeps/table2_small.py): GBS 16 x 4096 = 65,536 tokens, 5,400
    # steps = 353.9M tokens (>= 20 per non-embedding parameter of every small preset), warm-up
    # 0.7% of the steps as 200 of 28,610; "small_scan" is the learning-rate scan's quarter.
    "small": dict(total_steps=5_400, warmup_steps=38, batch_size=16, eval_every=200),
    "small_scan": dict(total_steps=1_350, warmup_steps=9, batch_size=16, eval_every=150),
}
SMALL_BUDGETS = ("small", "small_scan")


def train_section(**values) -> ml_collections.ConfigDict:
    """``config.train`` with every ``TrainConfig`` field listed (so each can be overridden on the
    command line, e.g. ``--config.train.nonfinite_policy=skip``), ``values`` replacing the
    dataclass defaults.

    Raises:
      ConfigArgError: for a name that is not a ``TrainConfig`` field.
    """
    fields = {f.name: f for f in dataclasses.fields(config_lib.TrainConfig)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigArgError(f"unknown train option(s) {', '.join(unknown)}")
    section = {}
    for name, field in fields.items():
        value = values.get(name, field.default)
        if value is None:  # Optional[int] / Optional[float]: a typed placeholder
            kind = float if name == "peak_flops_per_device" else int
            value = config_dict.placeholder(kind)
        section[name] = value
    return ml_collections.ConfigDict(section)


def corpus_data(corpus: str, seq_len: int, batch_size: int) -> ml_collections.ConfigDict:
    """Data section for a corpus directory with ``train/`` and ``validation/`` token shards.

    ``experiments/build_corpus.py`` writes one per mixture and tokenizer (e.g.
    ``/data/open/prose-llama2``); every training document is trained on and the validation
    split is the corpus's own. The keys are those of :func:`bundled_wikitext_data`, so the same
    command-line overrides apply.

    Args:
      corpus: the mixture directory (its ``train`` and ``validation`` subdirectories are read).
      seq_len: tokens per row.
      batch_size: rows per step.
    """
    data = bundled_wikitext_data(seq_len=seq_len, batch_size=batch_size)
    data.paths = (os.path.join(corpus, "train"),)
    data.val_paths = (os.path.join(corpus, "validation"),)
    return data


def paper1_experiment(*, linear, stack, num_layers, opt, budget, size="350m", tiny=False,
                      learning_rate=None, mlp_hidden=None, routing=None, corpus=None,
                      seed=42) -> ml_collections.ConfigDict:
    """A complete paper-1 experiment ConfigDict (model, data, optim, train).

    Full runs use seq 4096, seed 42, eval every 500 (100 for 1B) steps over 10 batches, 1% of
    the documents held out (spec §5.4, §6, §7). The data section points at the bundled
    WikiText-2 text; point ``--config.data.paths`` at the tokenised FineWeb-Edu JSONL for a real
    run, or give ``corpus``. ``tiny=True`` keeps the structure (stack, gates, routing,
    optimizer) and shrinks the model (:data:`PAPER1_SIZES` ``"tiny"``), data (128 tokens x 8)
    and run (60 steps) to CPU size. The tiny run's warm-up is a tenth of ``train.total_steps``
    (6 of 60), derived through a ``FieldReference`` as in ``configs/default.py``: lowering
    ``--config.train.total_steps`` lowers it with the run, so a shorter run still warms up and
    decays (a fixed 6 made ``train.schedule_warning`` warn about a warm-up the user never set);
    ``--config.optim.warmup_steps`` sets it outright. The full-size warm-ups are the recipe's
    step counts (:data:`BUDGETS`) and stay fixed.

    ``size="small"`` goes with a budget of :data:`SMALL_BUDGETS` (and only with those): GBS 16 x
    4096, the whole validation split at every evaluation (a ``corpus``'s is 11-12 batches),
    one checkpoint kept (no best one: the sweep reads the best validation loss from the
    metrics), and under Muon the Adam group's LR tied to the Muon LR (``learning_rate x 1.5e-3
    / 3.6e-4``, as in transformer-pp-350m-muon.sbatch, spec §5.1; the recipe's 1.5e-3 at the
    recipe's 3.6e-4), so that one ``learning_rate`` scales the whole recipe.

    Args:
      linear, stack, num_layers, size, mlp_hidden, routing: the model (:func:`paper1_model`).
      opt: ``"adamw"`` or ``"muon"``.
      budget: a key of :data:`BUDGETS`.
      tiny: the CPU-sized variant.
      learning_rate: peak LR (of the Muon group under Muon); ``None``: :data:`DEFAULT_LR`.
      corpus: a directory with ``train/`` and ``validation/`` token shards
        (:func:`corpus_data`); ``None``: the bundled WikiText-2 text.
      seed: ``train.seed`` (initialisation) and, except for ``tiny`` runs (whose validation
        documents are split off the bundled text by ``data.seed``), ``data.seed`` (the window
        order; a ``corpus``'s validation tokens do not depend on it).

    Raises:
      ConfigArgError: for an unknown budget, optimizer, size or mixer, or a budget that does not
        go with the size.
    """
    if budget not in BUDGETS:
        raise ConfigArgError(f"budget={budget!r}; choose from {', '.join(BUDGETS)}")
    if (size == "small") != (budget in SMALL_BUDGETS):
        raise ConfigArgError(
            f"budget={budget!r} does not go with size={size!r}: size=small takes budget "
            f"{' or '.join(SMALL_BUDGETS)}, the other sizes take "
            f"{', '.join(b for b in BUDGETS if b not in SMALL_BUDGETS)}")
    b = BUDGETS[budget]
    config = ml_collections.ConfigDict()
    config.model = paper1_model(linear, stack, num_layers, size="tiny" if tiny else size,
                                mlp_hidden=None if tiny else mlp_hidden, routing=routing)
    # Mesh axes (data x fsdp x context x tensor, -1 = the remaining devices), overridable on the
    # command line: --config.mesh.fsdp=8.
    config.mesh = dict(data=-1, fsdp=1, context=1, tensor=1)
    if tiny:
        # The warm-up is a tenth of the run and follows --config.train.total_steps.
        total = config_dict.FieldReference(60)
        warmup = total // 10
        if corpus:
            config.data = corpus_data(corpus, seq_len=128, batch_size=8)
        else:
            config.data = bundled_wikitext_data(seq_len=128, batch_size=8)
        config.data.max_val_batches = 4
        lr = 3e-3 if learning_rate is None else learning_rate
        config.optim = paper1_optim(opt, warmup_steps=warmup, learning_rate=lr,
                                    adamw_learning_rate=3e-3)
        config.train = train_section(total_steps=total, eval_every=30, checkpoint_every=30,
                                     keep_checkpoints=1, log_every=10, seed=seed)
        return config
    total = b["total_steps"]
    if corpus:
        config.data = corpus_data(corpus, seq_len=4096, batch_size=b["batch_size"])
    else:
        config.data = bundled_wikitext_data(seq_len=4096, batch_size=b["batch_size"])
        config.data.val_fraction = 0.01
    config.data.seed = seed
    if size == "small":
        # The whole validation split (prose-llama2: 779,463 tokens, 12 batches) every time.
        config.data.max_val_batches = None if corpus else 10
        config.optim = paper1_optim(opt, warmup_steps=b["warmup_steps"],
                                    learning_rate=learning_rate, adamw_learning_rate=None)
        config.train = train_section(total_steps=total, eval_every=b["eval_every"],
                                     checkpoint_every=1000, keep_checkpoints=1,
                                     keep_best_checkpoint=False, log_every=10, seed=seed)
        return config
    config.data.max_val_batches = 10
    config.optim = paper1_optim(opt, warmup_steps=b["warmup_steps"],
                                learning_rate=learning_rate)
    config.train = train_section(total_steps=total, eval_every=b["eval_every"],
                                 checkpoint_every=b["eval_every"], keep_checkpoints=2,
                                 log_every=10, seed=seed)
    return config
