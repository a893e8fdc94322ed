"""Paper 1 Table 6: value-space CLER, 350M / ~1B tokens (spec §4.2, §9.5; paper §6.5).

Each routing layer (GDN or DeltaNet) adds ``Gamma_l r_{p(l)}`` to its value target, ``r`` the
beta-scaled (GDN: decay-adjusted) error of the nearest lower routing layer, carried across the
softmax layers ("latest" mode with carry-through); ``Gamma_l`` scalar, initialised to 0 (spec
§4.2, the "cler-gated-v1 ... carry" launchers). Rows: {GDN, DeltaNet} x {Muon, AdamW} x
{baseline, CLER}.

Stacks: Muon rows use the shared launcher's 20-layer hybrids (GDN 290.26M, DeltaNet 276.46M);
the AdamW rows (W4, torch kernels) GDN 20 and DeltaNet 24 layers (319.47M) (spec §3, §9.5).
CLER adds one gain per routing layer (14 or 16 scalars).

Recipe: seq 4096, GBS 128, 1,907 steps (244,140 samples), 200 warm-up steps, WSD minus_sqrt to
0.1x; Muon 3.6e-4 (+1.5e-3 Adam group), AdamW 3e-4. NOT reproduced: these 1B runs kept the 15B
cool-down length (5,722 steps > the run), so the authors' LR jumps to min + 0.162 (max - min)
after warm-up and decays from there (spec §5.3); ``OptimConfig`` cannot express that (its
``decay_fraction`` is at most 1), so these presets use the ordinary 20% cool-down.

Launch::

    python experiments/train.py --config=configs/table6.py:host=gdn,opt=muon,route=cler \\
        --workdir=runs/t6-gdn-muon-cler

Arguments: ``host`` (gdn | deltanet), ``opt`` (muon | adamw), ``route`` (none | cler),
``gamma_mode`` (scalar | head | channel), ``gamma_init`` (0.0; the W4 ablations used 0.01),
``normalize`` (the "normresid" RMS normalisation of r), ``tiny``.
"""

from configs import common

LAYERS = {("muon", "gdn"): 20, ("muon", "deltanet"): 20,
          ("adamw", "gdn"): 20, ("adamw", "deltanet"): 24}

VARIANTS = tuple(f"host={h},opt={o},route={r}" for h in ("gdn", "deltanet")
                 for o in ("muon", "adamw") for r in ("none", "cler"))


def get_config(arg=None):
    """Returns the ConfigDict of one Table 6 run (see the module docstring for ``arg``).

    Raises:
      ConfigArgError: for an unknown argument or value.
    """
    arg = common.parse_arg(arg, host="gdn", opt="muon", route="cler", gamma_mode="scalar",
                           gamma_init=0.0, normalize=False, tiny=False)
    if (arg.opt, arg.host) not in LAYERS:
        raise common.ConfigArgError(
            f"host={arg.host!r}, opt={arg.opt!r}; choose host gdn | deltanet, opt muon | adamw")
    if arg.route not in ("none", "cler"):
        raise common.ConfigArgError(f"route={arg.route!r}; choose none or cler")
    routing = None
    if arg.route == "cler":
        routing = dict(mode="cler", gamma_mode=arg.gamma_mode, gamma_init=arg.gamma_init,
                       normalize_residual=arg.normalize)
    return common.paper1_experiment(
        linear=arg.host, stack="hybrid", num_layers=LAYERS[(arg.opt, arg.host)], opt=arg.opt,
        budget="1b", tiny=arg.tiny, routing=routing)
