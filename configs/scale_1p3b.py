"""Paper 1's 1.3B / 40B-token runs: Table 7's GDN row and Table 3's DeltaNet rows (spec §3).

Model (transformer-pp-1p3b-fwe40b-env.sh): 24 layers, d 2048, F 5632, softmax 16 query heads /
8 KV groups of 128, RoPE 5e5; GDN 8 x 64 keys / 16 x 64 values, DeltaNet 8 x (64 / 128); hybrid
= softmax at layers 2, 5, ..., 23 (16 linear layers); GDN hybrids gate their softmax outputs.

Runs:

* GDN hybrid (Table 7): ``route=none``, ``cler_h`` or ``clvr`` (full-rank ``P_l`` 1024 -> 2048,
  zero init: 16 x 2,097,152 = +33.6M parameters, spec §3);
* DeltaNet (Table 3): hybrid at lr 3.6e-4, pure at 1.5e-4, and pure with value-space CLER
  (``route=cler``, scalar ``Gamma`` initialised to ``gamma_init``, 0.1 in the reported run;
  spec §9.2 also lists 0.0).

Recipe: Muon, min LR 0.1x, 9,765,625 samples at GBS 512 = 19,073 steps, seq 4096; Adam-routed
parameters at 1.5e-3 (the shared launcher's ``--muon-scalar-lr``). The warm-up is the shared
launcher's 25,600 samples = 50 steps at GBS 512 (not stated for the 1.3B launcher in the spec).

Launch::

    python experiments/train.py --config=configs/scale_1p3b.py:host=gdn,route=clvr \\
        --workdir=runs/1p3b-gdn-clvr

Arguments: ``host`` (gdn | deltanet), ``stack`` (hybrid | pure), ``route`` (none | cler_h |
clvr | cler), ``gamma_init`` (value-space CLER), ``lr`` (Muon LR; default 1.5e-4 for pure
DeltaNet, else 3.6e-4), ``tiny``.
"""

from configs import common

NUM_LAYERS = 24

VARIANTS = (
    "host=gdn,stack=hybrid,route=none",
    "host=gdn,stack=hybrid,route=cler_h",
    "host=gdn,stack=hybrid,route=clvr",
    "host=deltanet,stack=hybrid,route=none",
    "host=deltanet,stack=pure,route=none",
    "host=deltanet,stack=pure,route=cler",
)


def get_config(arg=None):
    """Returns the ConfigDict of one 1.3B run (see the module docstring for ``arg``).

    Raises:
      ConfigArgError: for an unknown argument or value.
    """
    arg = common.parse_arg(arg, host="gdn", stack="hybrid", route="clvr", gamma_init=0.1,
                           lr=None, tiny=False)
    if arg.host not in ("gdn", "deltanet"):
        raise common.ConfigArgError(f"host={arg.host!r}; choose gdn or deltanet")
    if arg.stack not in ("hybrid", "pure"):
        raise common.ConfigArgError(f"stack={arg.stack!r}; choose hybrid or pure")
    if arg.route not in ("none", "cler_h", "clvr", "cler"):
        raise common.ConfigArgError(f"route={arg.route!r}; choose none, cler_h, clvr or cler")
    routing = None
    if arg.route == "cler":
        routing = dict(mode="cler", gamma_init=arg.gamma_init)
    elif arg.route != "none":
        routing = dict(mode=arg.route)
    lr = arg.lr
    if lr is None and not arg.tiny:
        lr = 1.5e-4 if (arg.host, arg.stack) == ("deltanet", "pure") else 3.6e-4
    return common.paper1_experiment(
        linear=arg.host, stack=arg.stack, num_layers=NUM_LAYERS, opt="muon", budget="40b",
        size="1p3b", tiny=arg.tiny, learning_rate=lr, routing=routing)
