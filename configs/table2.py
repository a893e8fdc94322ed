"""Paper 1 Table 2: the architecture study, 350M class / 15B tokens (spec §3, §5, §9.2).

Softmax (dense Transformer++) and DeltaNet, GDN, KDA, GDN-2 in pure and hybrid form (hybrid =
``--linear-attention-freq 3``: softmax at layers 2, 5, 8, ...), each with AdamW or Muon. Layer
counts are the authors' parameter-matched ones (spec §3): softmax 24 (F 2560), GDN 22, DeltaNet 24,
KDA 24, GDN-2 20 (the only GDN-2 launcher, spec §2.6); all linear/hybrid F 2816. The softmax
layers of GDN and GDN-2 hybrids carry the sigmoid output gate, the others do not (spec §2.5,
§10 item 5). Parameter counts (spec §3): softmax 317.24M, GDN hybrid 313.35M / pure 302.49M,
DeltaNet 319.47M / 311.15M, KDA 322.70M / 315.99M, GDN-2 hybrid 296.24M.

Recipe: seq 4096, GBS 128, 28,610 steps (15.0B tokens), 200 warm-up steps, WSD with a minus_sqrt
cool-down over the last 20% to 0.1x; AdamW lr 3e-4, Muon lr 3.6e-4 with the Adam-routed
parameters at 1.5e-3 (spec §5).

Launch (from the repository root)::

    python experiments/train.py --config=configs/table2.py:arch=gdn,stack=hybrid,opt=muon \\
        --workdir=runs/t2-gdn-hybrid-muon --config.data.paths="('/data/fineweb_edu_15b',)"
    python experiments/train.py --config=configs/table2.py:arch=softmax,opt=adamw,tiny \\
        --workdir=/tmp/t2-softmax-tiny

Arguments: ``arch`` (softmax | deltanet | gdn | kda | gdn2), ``stack`` (hybrid | pure; dense
for softmax, the default there), ``opt`` (adamw | muon), ``tiny`` (CPU-sized smoke run),
``num_layers`` (override ``L``; e.g. 20 for the AdamW KDA launcher's default, spec §3), ``lr``,
``size`` (350m | small: the scaled-down member of configs/sweeps/table2_small.py, 6 layers for
every architecture), ``budget`` (15b for 350m; small | small_scan for small), ``corpus`` (a
directory with train/ and validation/ token shards, e.g. /data/open/prose-llama2), ``seed``
(default 42, the paper's; initialisation and window order).
"""

from configs import common

LAYERS = {"softmax": 24, "gdn": 22, "deltanet": 24, "kda": 24, "gdn2": 20}

# Every selectable full-size preset (the tests append ",tiny" for the CPU variants).
VARIANTS = tuple(
    [f"arch=softmax,stack=dense,opt={o}" for o in common.OPTIMIZERS]
    + [f"arch={a},stack={s},opt={o}" for a in ("deltanet", "gdn", "kda", "gdn2")
       for s in ("hybrid", "pure") for o in common.OPTIMIZERS])


def get_config(arg=None):
    """Returns the ConfigDict of one Table 2 run (see the module docstring for ``arg``).

    Raises:
      ConfigArgError: for an unknown argument or value, or softmax with a linear stack.
    """
    arg = common.parse_arg(arg, arch="gdn", stack=None, opt="muon", tiny=False,
                           num_layers=None, lr=None, size="350m", budget=None, corpus=None,
                           seed=42)
    if arg.arch not in LAYERS:
        raise common.ConfigArgError(f"arch={arg.arch!r}; choose from {', '.join(LAYERS)}")
    if arg.size not in ("350m", "small"):
        raise common.ConfigArgError(f"size={arg.size!r}; choose 350m or small")
    if arg.arch == "softmax":
        stack = arg.stack or "dense"
        if stack != "dense":
            raise common.ConfigArgError(f"arch=softmax has only stack=dense, got {stack!r}")
        linear = None
    else:
        stack = arg.stack or "hybrid"
        if stack not in ("hybrid", "pure"):
            raise common.ConfigArgError(f"stack={stack!r}; choose hybrid or pure")
        linear = arg.arch
    default_layers = common.SMALL_NUM_LAYERS if arg.size == "small" else LAYERS[arg.arch]
    budget = arg.budget or ("small" if arg.size == "small" else "15b")
    return common.paper1_experiment(
        linear=linear, stack=stack, num_layers=arg.num_layers or default_layers, opt=arg.opt,
        budget=budget, size=arg.size, tiny=arg.tiny, learning_rate=arg.lr, corpus=arg.corpus,
        seed=arg.seed)
