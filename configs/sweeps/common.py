"""Shared pieces of the small-scale paper-1 sweeps (``table2_small``, ``lr_scan_small``,
``table7_small``): the fixed training-config arguments, seeds, the tiny CPU variant.

A sweep config's ``get_config(arg)`` returns the ConfigDict that ``experiments/sweep.py`` and
:mod:`lattn_jax.sweep` read (``name``, ``train_config``, ``arg``, ``overrides``, ``grid``,
``seed_axis``, ``local_args``, and for the report ``references``, ``claims``, ``scan``).
"""

import ml_collections

from configs import common

# The paper's seed (spec §5.4: --seed 42), then the second one.
SEEDS = (42, 43)

# Every sweep run: no TensorBoard event files (metrics.jsonl holds the same scalars).
OVERRIDES = (("train.tensorboard", False),)

# tiny: the CPU variant for tests; the paper-1 "tiny" model (d 64, 6 layers) for 4 steps of
# 2 x 32 tokens (a checkpoint and an evaluation every 2 steps): bytes of the bundled
# WikiText-2 text, or with ``corpus`` the corpus's own tokens (TINY_CORPUS_OVERRIDES: a CPU
# rehearsal of the full-size sweep's data).
TINY_CORPUS_OVERRIDES = (
    ("train.total_steps", 4), ("train.eval_every", 2), ("train.checkpoint_every", 2),
    ("train.log_every", 1), ("optim.warmup_steps", 1), ("data.seq_len", 32),
    ("data.batch_size", 2), ("data.max_val_batches", 2))
TINY_OVERRIDES = TINY_CORPUS_OVERRIDES + (
    ("data.tokenizer", "byte"), ("model.vocab_size", 257))


def fixed_arg(corpus, tiny, **values):
    """The fixed part of every run's argument string: ``size=small``, ``values``, ``tiny``
    (the CPU model) when set, and ``corpus`` (for ``tiny``, optional: without it the bundled
    text).

    Raises:
      ConfigArgError: when a full-size sweep has no ``corpus``, or the path holds ``,``.
    """
    pairs = [("size", "small")] + list(values.items())
    if tiny:
        pairs.append(("tiny", True))
    elif not corpus:
        raise common.ConfigArgError(
            "corpus=<dir> is required: the mixture directory with train/ and validation/ "
            "token shards (experiments/build_corpus.py), e.g. corpus=/data/open/prose-llama2")
    if not corpus:
        return tuple(pairs)
    if "," in str(corpus):
        raise common.ConfigArgError(f"corpus={corpus!r}: the path may not hold ','")
    return tuple(pairs + [("corpus", corpus)])


def scan_rates(path: str, tiny: bool = False) -> dict:
    """Each optimizer's best learning rate from a finished scan's ``results.json``.

    The file is what ``experiments/sweep.py`` writes for ``configs/sweeps/lr_scan_small.py``
    (``lattn_jax.sweep_report``: its ``scan`` entry, one block per optimizer with the mean
    final validation loss of every rate over the scanned models, and the best rate). Reading
    it lets one message of GPU calls run the scan's last runs and then Table 2 / Table 7 at
    the rates found, with no reply in between.

    A best rate at the edge of the scan is taken as it is (the scan's results page marks it).

    Args:
      path: the scan's ``results.json``.
      tiny: the calling table is the ``tiny`` CPU variant: the file must come from
        ``lr_scan_small_tiny``; otherwise from ``lr_scan_small`` (a tiny scan's rates never
        feed a full-size table, nor the reverse).

    Returns:
      ``{optimizer: rate}``, e.g. ``{"adamw": 0.001, "muon": 0.00036}``.

    Raises:
      ConfigArgError: naming ``rates_from`` and the file, if ``path`` is not a string (a name
        that ``parse_arg`` read as a number or bool), if it is missing, unreadable or not a
        JSON object, was written by another sweep, has no ``lr`` scan by ``opt``, or a rate of
        the scan lacks a finished run of some model (the scan is not complete: finish it
        first).
    """
    import json  # noqa: PLC0415 (only this helper reads files)
    if not isinstance(path, str):  # parse_arg read "123" or "True" as a literal: open(1) is stdout
        raise common.ConfigArgError(f"rates_from={path!r}: not a file name (give a path that "
                                    f"does not read as a Python literal, e.g. ./{path})")
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise common.ConfigArgError(f"rates_from={path}: cannot read it ({e})") from None
    if not isinstance(data, dict):
        raise common.ConfigArgError(f"rates_from={path}: not a sweep's results.json (a JSON "
                                    f"{type(data).__name__}, not an object)")
    want = "lr_scan_small" + ("_tiny" if tiny else "")
    if data.get("sweep") != want:
        raise common.ConfigArgError(f"rates_from={path}: written by sweep "
                                    f"{data.get('sweep')!r}, not {want!r}")
    scan = data.get("scan")
    if not scan or scan.get("axis") != "lr" or scan.get("by") != ["opt"]:
        raise common.ConfigArgError(f"rates_from={path}: no learning-rate scan by optimizer "
                                    f"(expected lr_scan_small's results.json)")
    rates = {}
    for block in scan["blocks"]:
        opt = dict(block["by"])["opt"]
        missing = [r["value"] for r in block["rows"] if r["n"] < len(block["columns"])]
        if missing or block.get("best") is None:
            raise common.ConfigArgError(
                f"rates_from={path}: the {opt} scan is not complete (rates without a finished "
                f"run of every model: {missing}); finish the scan first")
        rates[opt] = float(block["best"])
    return rates


def apply_scan_rates(arg, optimizers) -> None:
    """Sets ``arg.<opt>_lr`` for each of ``optimizers`` from ``arg.rates_from`` (a finished
    scan's results.json, :func:`scan_rates`), if given; the tables' ``get_config`` call it.

    Raises:
      ConfigArgError: ``rates_from`` together with a rate given by hand, a scan without one of
        ``optimizers``, or any of :func:`scan_rates`'s errors.
    """
    if not arg.rates_from:
        return
    names = [f"{o}_lr" for o in optimizers]
    if any(arg[n] is not None for n in names):
        raise common.ConfigArgError(f"rates_from= or {' and '.join(n + '=' for n in names)}, "
                                    f"not both")
    rates = scan_rates(arg.rates_from, tiny=bool(arg.tiny))
    if any(o not in rates for o in optimizers):
        wanted = list(optimizers) if len(optimizers) > 1 else optimizers[0]
        raise common.ConfigArgError(f"rates_from={arg.rates_from}: scans {sorted(rates)}, "
                                    f"not {wanted}")
    for o, n in zip(optimizers, names):
        arg[n] = rates[o]


# Table 2 and Table 7 runs: the LM head and cross-entropy fused in chunks of this many tokens
# (train.loss_chunk_size; 8 chunks of a 16 x 4096 batch, 1 GB of fp32 logits each at the
# 32,000-token vocabulary, instead of 8.4 GB for the whole batch). The learning-rate scan ran
# the plain head (its 16 first runs predate the option).
LOSS_CHUNK = (("train.loss_chunk_size", 8192),)


def sweep_config(*, name, train_config, arg, grid, tiny, seed_axis="seed", references=(),
                 claims=(), scan=None, overrides=()) -> ml_collections.ConfigDict:
    """A sweep ConfigDict (:mod:`lattn_jax.sweep`) with :data:`OVERRIDES`, then ``overrides``
    (``(field, value)`` pairs), then for ``tiny`` :data:`TINY_OVERRIDES` (with a ``corpus``
    in ``arg``: :data:`TINY_CORPUS_OVERRIDES`, the corpus's tokenizer and vocabulary)."""
    config = ml_collections.ConfigDict()
    config.name = name + ("_tiny" if tiny else "")
    config.train_config = train_config
    config.arg = tuple(arg)
    tiny_overrides = TINY_CORPUS_OVERRIDES if "corpus" in dict(arg) else TINY_OVERRIDES
    config.overrides = OVERRIDES + tuple(overrides) + (tiny_overrides if tiny else ())
    config.grid = tuple(grid)
    config.seed_axis = seed_axis
    config.references = tuple(references)
    config.claims = tuple(claims)
    config.scan = scan
    # The corpus path may differ between machines (a sweep continued elsewhere).
    config.local_args = ("corpus",)
    return config
