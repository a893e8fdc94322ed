"""Paper 1 Table 7 and §6.6: residual-stream routing (CLER-H, CLVR), controls and AttnRes, 350M.

Hosts: the 20-layer GDN (290.26M) and DeltaNet (276.46M) hybrids of the shared Muon launcher,
at 350M / 1B tokens and 350M / 15B tokens (spec §3, §9.1, §9.4). The 1.3B / 40B Table 7 row is
in ``configs/scale_1p3b.py``.

Routes (``route=``):

* ``none``: the host;
* ``cler_h``: ``h <- Block_l(h) + P_l vec(r_l)`` after every linear layer, ``r`` the op's
  residual (spec §4.3); ``clvr`` (CLER-V): the same with the post-conv value ``v_l``. Full-rank
  ``P_l`` (512 -> 1024, zero init) adds 14 x 524,288 = 7,340,032 parameters; ``rank=64`` adds
  1,376,256 (spec §3);
* controls of paper §6.6 (the exploratory GDN 350M/1B group): ``error_value`` (CLER-RV,
  ``P_l [r; v]``), ``surprise_gate`` (CLER-G), ``hidden_state`` (the self-transform
  ``P_l h_{l+1}``, rank 256 by default = the full-rank CLVR parameter count), ``wide`` (the
  larger-baseline control: F 2936, +7.37M, matching full-rank ``P_l``; F 2840 matches rank 64);
* ``attn_res``: Full Attention Residuals (spec §4.4), +2L x 1024 = 40,960 pseudo-query params.

Recipe: Muon 3.6e-4 (+1.5e-3 Adam group), seq 4096, GBS 128; ``budget=15b``: 28,610 steps, eval
every 500; ``budget=1b``: 1,907 steps, eval every 100 (the authors' 1B schedule discontinuity is
not reproduced, see ``configs/table6.py``).

Launch::

    python experiments/train.py --config=configs/table7.py:host=gdn,budget=15b,route=clvr \\
        --workdir=runs/t7-gdn-15b-clvr
    python experiments/train.py --config=configs/table7.py:host=gdn,route=clvr,tiny \\
        --workdir=/tmp/t7-clvr-tiny

Arguments: ``host`` (gdn | deltanet), ``budget`` (1b | 15b; small | small_scan with
``size=small``), ``route`` (see above), ``rank`` (``P_l`` rank, default full), ``normalize``
(RMS-normalise the routed input, cler_h/clvr only), ``tiny``, ``size`` (350m | small: the
6-layer d = 512 member of configs/sweeps/table2_small.py, its hybrids' 4 linear layers routed;
full-rank ``P_l`` 256 -> 512 adds 4 x 131,072 = 524,288, matched by ``wide`` F 1464 (+516,096)
and ``hidden_state`` rank 128), ``lr`` (peak Muon LR; default the recipe's 3.6e-4), ``corpus``
(train/ and validation/ token shards), ``seed`` (default 42).
"""

from configs import common

ROUTES = ("none", "cler_h", "clvr", "error_value", "surprise_gate", "hidden_state", "wide",
          "attn_res")
NUM_LAYERS = 20
WIDE_MLP = 2936  # spec §9.4: FFN-width control, +7.37M params at 20 layers
# size=small: F 1408 -> 1464 over 6 layers adds 6 x 3 x 512 x 56 = 516,096 parameters, the
# multiple of 8 nearest the full-rank P_l's 4 x 256 x 512 = 524,288 (the 350M control's F 2936
# is likewise 8 x 367); the self-transform's rank 128 x (512 + 512) is the same budget.
SMALL_WIDE_MLP = 1464
SMALL_HIDDEN_STATE_RANK = 128

VARIANTS = tuple(
    [f"host={h},budget={b},route={r}" for h in ("gdn", "deltanet") for b in ("1b", "15b")
     for r in ("none", "cler_h", "clvr", "attn_res")]
    + [f"host=gdn,budget=1b,route={r}"
       for r in ("error_value", "surprise_gate", "hidden_state", "wide")]
    + ["host=gdn,budget=1b,route=cler_h,rank=64", "host=gdn,budget=1b,route=clvr,rank=64"])


def get_config(arg=None):
    """Returns the ConfigDict of one Table 7 / §6.6 run (see the module docstring for ``arg``).

    Raises:
      ConfigArgError: for an unknown argument or value.
    """
    arg = common.parse_arg(arg, host="gdn", budget=None, route="clvr", rank=None,
                           normalize=False, tiny=False, size="350m", lr=None, corpus=None,
                           seed=42)
    if arg.host not in ("gdn", "deltanet"):
        raise common.ConfigArgError(f"host={arg.host!r}; choose gdn or deltanet")
    if arg.size not in ("350m", "small"):
        raise common.ConfigArgError(f"size={arg.size!r}; choose 350m or small")
    small = arg.size == "small"
    budgets = common.SMALL_BUDGETS if small else ("1b", "15b")
    budget = arg.budget or budgets[0 if small else 1]
    if budget not in budgets:
        raise common.ConfigArgError(f"budget={budget!r} with size={arg.size}; choose "
                                    f"{' or '.join(budgets)}")
    if arg.route not in ROUTES:
        raise common.ConfigArgError(f"route={arg.route!r}; choose from {', '.join(ROUTES)}")
    routing, mlp_hidden = None, None
    if arg.route == "attn_res":
        routing = dict(attn_res=True)
    elif arg.route == "wide":
        mlp_hidden = SMALL_WIDE_MLP if small else WIDE_MLP
    elif arg.route != "none":
        rank = arg.rank
        if rank is None and arg.route == "hidden_state":
            # 256 x (1024 + 1024) = 512 x 1024: the full-rank CLVR budget (small: 128 x 1024).
            rank = SMALL_HIDDEN_STATE_RANK if small else 256
        routing = dict(mode=arg.route, rank=rank, normalize_input=arg.normalize)
    return common.paper1_experiment(
        linear=arg.host, stack="hybrid",
        num_layers=common.SMALL_NUM_LAYERS if small else NUM_LAYERS, opt="muon", budget=budget,
        size=arg.size, tiny=arg.tiny, mlp_hidden=mlp_hidden, routing=routing,
        learning_rate=arg.lr, corpus=arg.corpus, seed=arg.seed)
