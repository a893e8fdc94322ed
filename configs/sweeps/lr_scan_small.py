"""Sweep: the learning-rate scan before Table 2 at small scale (AdamW and Muon, two models).

Softmax dense and GDN hybrid (the baseline and the paper's main architecture), each with AdamW
at 3e-4, 1e-3, 3e-3, 1e-2 and with Muon at 1.2e-4, 3.6e-4, 1.2e-3, 3.6e-3, 1.2e-2:
half-decade steps from the paper's 350M rates (spec §5.1-5.2) upward (Muon: and one below),
since a model 16x smaller is expected to want larger ones (DeepSeek-LLM's fit 0.3118
C^-0.125 gives 1.2e-3 at 350M / 15B and 2.7e-3 here; under Muon the Adam group's LR moves
with the Muon LR, x 1.5e-3 / 3.6e-4, as in transformer-pp-350m-muon.sbatch). One seed (42).
Why first: Table 2 then compares each optimizer at its own best rate, not at one shared or
inherited rate (the issue points to the paper's Fig. 5; spec §10 item 10 records how the
authors' own GDN / DeltaNet "Muon LR" runs all trained at 3.6e-4 through a launcher bug).

Each run is the Table 2 small preset (``configs/sweeps/table2_small.py``: d 512, 6 layers, GBS
16 x 4096) for a quarter of its budget (``budget=small_scan``: 1,350 steps = 88.5M tokens,
warm-up 9 steps, WSD cool-down over the last 20%, evaluation every 150 steps). The optimum at
a quarter of the tokens can sit somewhat above the full-budget one; the page marks a best rate
at the edge of the scan (extend it then). The results page's "Scan of lr" section gives the
best rate per optimizer (mean final loss over the two models): pass them to table2_small as
``adamw_lr`` and ``muon_lr``, and the Muon one to table7_small as ``muon_lr``.

Cost: 18 runs x 88.5M tokens. Measured on one H200 (2026-12-03, windows 1 and 2): 94-119 s
per run including compilation and evaluations (1.12-1.24M tokens/s; a run resumed across two
calls 128-139 s), about 30 minutes for all.

Muon 1.2e-4 was added after window 2 (2026-12-03b): of the first four Muon rates the lowest,
3.6e-4, was best for both models (mean 2.268 against 2.417 at 1.2e-3), at the scan's edge, so
the scan goes one half-decade lower (the sweep skips the 16 finished runs and runs the two new
ones).

Launch::

    python experiments/sweep.py --config=configs/sweeps/lr_scan_small.py:\\
corpus=/tmp/corpus/prose-llama2 --root=/tmp/sweeps/lr_scan --deadline_s=540

Arguments: ``corpus`` (required unless ``tiny``), ``tiny`` (CPU: 2 rates per optimizer, 4
steps; on the bundled text, or on ``corpus`` when given).
"""

from configs import common
from configs.sweeps import common as sweeps_common

MODELS = (("softmax", "dense"), ("gdn", "hybrid"))
LEARNING_RATES = {"adamw": (3e-4, 1e-3, 3e-3, 1e-2),
                  "muon": (1.2e-4, 3.6e-4, 1.2e-3, 3.6e-3, 1.2e-2)}
TINY_LEARNING_RATES = {"adamw": (1e-3, 3e-3), "muon": (1.2e-3, 3.6e-3)}


def get_config(arg=None):
    """Returns the sweep ConfigDict (see the module docstring for ``arg``).

    Raises:
      ConfigArgError: for an unknown argument, or a missing ``corpus`` (full size).
    """
    arg = common.parse_arg(arg, corpus=None, tiny=False)
    rates = TINY_LEARNING_RATES if arg.tiny else LEARNING_RATES
    grid = [(("arch", (a,)), ("stack", (s,)), ("opt", (o,)), ("lr", rates[o]))
            for a, s in MODELS for o in common.OPTIMIZERS]
    return sweeps_common.sweep_config(
        name="lr_scan_small", train_config="configs/table2.py",
        arg=sweeps_common.fixed_arg(arg.corpus, arg.tiny, budget="small_scan", seed=42),
        grid=grid, tiny=arg.tiny, seed_axis=None, scan=dict(axis="lr", by=("opt",)))
