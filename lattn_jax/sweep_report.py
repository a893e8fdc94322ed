"""The results of a sweep: table, ranking, seed spread, the paper's numbers, loss curves.

:func:`build` reads every run directory of a sweep (:mod:`lattn_jax.sweep`: the grid's runs
and any other run recorded under the same root) and :func:`write` turns it into
``<root>/results.md``, ``results.csv`` (one row per run), ``results.json`` and ``curves.png``.

Runs that differ only in their seed form a group; a group's score is the mean final validation
loss of its finished seeds, and the ranking orders groups by it. The seed-to-seed spread is the
pooled standard deviation of the final losses within groups of two or more finished seeds,
``sigma = sqrt(sum (x - group mean)^2 / sum (n - 1))``; two groups next to each other in the
ranking whose gap is below ``3 sigma`` are a close pair, and their groups with a single seed
need a second one (the page prints the ``--only`` filters).

Throughput (tokens/s, MFU) and wall time measured while a run shared the GPU with other runs
of the sweep (``experiments/sweep.py --parallel=N``, N > 1; the concurrency of the attempts
that wrote the records they come from, :attr:`lattn_jax.sweep.RunResult.concurrent`) are
marked ``†`` on the page (and ``concurrent`` > 1 in the CSV and JSON runs). A group's tokens/s
and MFU come from its runs measured alone when it has any; a throughput comparison with the
paper uses only those, and says which rows it left out (or that no group was measured
alone). Losses are unaffected. A finished run measured again alone after training
(``experiments/sweep.py --remeasure_alone=N``: ``<run>/throughput_alone.json``,
:func:`lattn_jax.sweep.remeasure_alone`) counts as measured alone with those tokens/s and MFU,
which the page marks ``‡`` ("measured alone in an N-step run after training shared the GPU")
in the ranking, the runs table and the comparisons with the paper; its wall time stays marked
``†``. In the CSV and JSON runs its ``concurrent`` is then 1, ``alone_steps`` is N and
``shared_tokens_per_sec`` / ``shared_mfu`` keep the numbers measured while sharing; a failed
re-measurement's error line is the runs table's note.

A partial run's step and tokens (runs table, CSV, JSON) are those of its newest checkpoint, the
step it resumes from (:func:`lattn_jax.sweep.run_state`, as ``--dry_run`` says); its losses
are from its last logged step, which the note (and ``logged_step``) gives when they differ.

A sweep split over several machine holds may run on more than one kind of GPU (an H100 in one
window, an H200 in the next). Each run's device kinds come from its trainer's
``invocations.jsonl`` (:attr:`lattn_jax.sweep.RunResult.devices`; the re-measurement's when
one replaces its throughput). The sweep's throughput device is the kind most runs with a
throughput ran on (:attr:`Report.device`); tokens/s and MFU from any other kind (or from a run
that moved between kinds) are marked ``§``, shown, and never compared: a group measured only
there gets no tokens/s rank, and a group with runs on both uses those on the throughput
device. Losses are compared across kinds (the same code, dtypes and data; the kinds' kernels
round differently, well below the seed-to-seed spread).

The sweep config may carry (all optional):

* ``references``: the paper's numbers, each a dict ``name``, ``source`` (where they come from),
  ``metric`` (ours to compare: ``final_val_loss``, ``best_val_loss``, ``tokens_per_sec``),
  ``values`` (``(filter, paper value)`` pairs, a filter in ``--only`` syntax picking a group;
  when several groups match, the one with the lowest final loss), ``inverse`` (True when the
  paper's value rises as our metric falls, e.g. an accuracy against our loss), ``normalise_to``
  (a filter: our metric divided by that group's, for the paper's relative columns) and
  ``note`` (``{matched}`` in it: how many of this sweep's groups the values pick; ``{groups}``:
  how many groups the sweep has). For each, the page puts ours beside the paper's, both
  ranked from the best (rank 1: lowest loss, highest tokens/s; ties share their average rank),
  and gives the Spearman rank correlation of the two rankings (+1 = the same order);
* ``claims``: the paper's conclusions as ``dict(claim, source, better, worse, paper)``: the
  ``better`` group (filter) has the lower final loss than ``worse``, by ``paper`` nats in the
  paper; the page says whether ours agrees, and whether our gap exceeds ``3 sigma``. When the
  two groups finished the same seeds, it also gives the paired differences, seed by seed
  (``better - worse`` at one seed: the same initialisation of the shared weights and the same
  data order, so the seed's own effect, which dominates ``sigma``, cancels): their values, mean
  and sample standard deviation, and whether every seed agrees in sign;
* ``scan``: ``dict(axis, by)``: a learning-rate (or any) scan; per combination of the ``by``
  axes, the mean final loss over the other axes for each value of ``axis`` and the best one
  (flagged when it lies at the edge of the scanned values).
"""

import collections
import csv
import dataclasses
import datetime
import io
import json
import math
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
from scipy import stats

from lattn_jax import sweep

SWEEP_LOG = "sweep.jsonl"
RESULTS_MD, RESULTS_CSV, RESULTS_JSON, CURVES_PNG = (
    "results.md", "results.csv", "results.json", "curves.png")
_METRICS = ("final_val_loss", "best_val_loss", "tokens_per_sec")
_HIGHER_IS_BETTER = ("tokens_per_sec",)


@dataclasses.dataclass
class Entry:
    """One run in the report: its definition, status and metrics.

    Attributes:
      run: the :class:`~lattn_jax.sweep.Run`.
      state: its :class:`~lattn_jax.sweep.RunState`.
      result: its :class:`~lattn_jax.sweep.RunResult`.
      in_grid: whether the current grid holds it (else it was recorded under the root by an
        earlier grid).
      alone: its ``throughput_alone.json`` (:func:`lattn_jax.sweep.remeasure_alone`) when
        the report uses it: the run's throughput was measured only while it shared the GPU,
        and ``result.tokens_per_sec`` and ``result.mfu`` are then the re-measurement's
        (``result.concurrent`` 1), the shared ones kept in ``shared_tokens_per_sec`` and
        ``shared_mfu``; else ``None``.
      alone_error: the error line of a failed re-measurement alone (none recorded), else
        ``None``.
    """

    run: sweep.Run
    state: sweep.RunState
    result: sweep.RunResult
    in_grid: bool = True
    alone: Optional[Dict[str, Any]] = None
    alone_error: Optional[str] = None
    shared_tokens_per_sec: Optional[float] = None
    shared_mfu: Optional[float] = None


def _entry(run: sweep.Run, workdir: str, in_grid: bool) -> Entry:
    """The report's entry of ``run``: its state and metrics, with the tokens/s and MFU of its
    re-measurement alone in place of those measured while sharing the GPU, if it has one. A
    partial run's step (and tokens) is its newest checkpoint's, the step it resumes from
    (``--dry_run`` says the same), its newest logged step kept in ``result.logged_step`` when
    they differ: the losses are from that one."""
    result = sweep.collect(workdir)
    entry = Entry(run=run, state=sweep.run_state(workdir), result=result, in_grid=in_grid)
    if entry.state.status == sweep.Status.PARTIAL and entry.state.step != result.step:
        result.logged_step, result.step = result.step, entry.state.step
        if result.tokens_per_step:
            result.tokens = result.step * result.tokens_per_step
    if result.concurrent <= 1:
        return entry
    alone = sweep.read_throughput_alone(workdir)
    if alone is None:
        failed = sweep.run_state(os.path.join(workdir, sweep.ALONE_DIR))
        if failed.status == sweep.Status.FAILED:
            entry.alone_error = failed.error
        return entry
    entry.alone = alone
    entry.shared_tokens_per_sec, entry.shared_mfu = result.tokens_per_sec, result.mfu
    result.tokens_per_sec, result.mfu = float(alone["tokens_per_sec"]), alone.get("mfu")
    result.concurrent = 1
    # The re-measurement's device kinds: recorded with it (its directory is not exported).
    result.devices = (tuple(alone.get("devices") or ())
                      or sweep.device_kinds(os.path.join(workdir, sweep.ALONE_DIR))
                      or result.devices)
    return entry


def device_label(e: Entry) -> str:
    """The device kind(s) a run's throughput comes from, ``" + "``-joined (``""`` unknown)."""
    return " + ".join(e.result.devices)


def _measured(e: Entry) -> bool:
    return bool(e.result.tokens_per_sec or e.result.mfu is not None)


@dataclasses.dataclass
class Group:
    """Runs that differ only in their seed.

    Attributes:
      name: the run names without the seed axis.
      values: the non-seed axis values.
      entries: the group's runs.
      losses: final validation losses of the finished runs (nats/token).
      mean, sd: their mean and sample standard deviation (``sd`` needs two).
      best_val_loss: the mean of the finished runs' lowest validation losses.
      tokens_per_sec, mfu: means over the runs that logged them and were measured alone; when
        none was, over those measured while sharing the machine (``throughput_shared``).
      throughput_shared: ``tokens_per_sec`` and ``mfu`` come from runs that shared the machine
        with other runs (``--parallel`` > 1; :attr:`lattn_jax.sweep.RunResult.concurrent`):
        shown marked, never compared (:meth:`metric` gives ``None`` for ``tokens_per_sec``).
      throughput_remeasured: some of the runs they come from trained while sharing the
        machine and were measured again alone (:attr:`Entry.alone`): compared, marked.
      throughput_device: the device kind(s) of ``tokens_per_sec`` and ``mfu`` when none of its
        measured runs ran on the sweep's throughput device (:attr:`Report.device`): shown
        marked, never compared; ``None`` otherwise (they then come only from runs on it).
      tokens: tokens of a finished run; params, non_embedding_params: of any run.
    """

    name: str
    values: Tuple[Tuple[str, Any], ...]
    entries: List[Entry] = dataclasses.field(default_factory=list)
    losses: List[float] = dataclasses.field(default_factory=list)
    mean: Optional[float] = None
    sd: Optional[float] = None
    best_val_loss: Optional[float] = None
    tokens_per_sec: Optional[float] = None
    mfu: Optional[float] = None
    throughput_shared: bool = False
    throughput_remeasured: bool = False
    throughput_device: Optional[str] = None
    tokens: Optional[int] = None
    params: Optional[int] = None
    non_embedding_params: Optional[int] = None

    def metric(self, name: str) -> Optional[float]:
        """``final_val_loss`` (the mean), ``best_val_loss`` or ``tokens_per_sec`` (``None``
        when measured only while sharing the machine, or only on another device kind than the
        sweep's throughput device: not comparable)."""
        if name == "tokens_per_sec" and (self.throughput_shared or self.throughput_device):
            return None
        return self.mean if name == "final_val_loss" else getattr(self, name)


@dataclasses.dataclass
class Report:
    """Everything the results page shows (:func:`build`).

    Attributes:
      name: the sweep's name; root: its directory.
      entries: every run (the grid's in grid order, then recorded ones outside the grid).
      groups: the seed groups in order of first appearance; ranking: those with a finished
        run, by mean final validation loss (best first).
      spread: the pooled seed-to-seed standard deviation (nats/token), or ``None``;
        spread_groups: how many groups it pools.
      close_pairs: ``(better, worse, gap)`` neighbours in the ranking closer than 3 ``spread``;
        needs_seed: their groups with a single finished seed.
      references, claims, scan: the config's, evaluated (module docstring).
      invocations: the records of ``<root>/sweep.jsonl`` (command line, start, wall time,
        outcome of every sweep call that ran the sweep: not ``--report_only`` or
        ``--dry_run``).
      device: the sweep's throughput device (:func:`throughput_device`), or ``None``;
        devices: ``{device label: runs with a throughput on it}``, most runs first.
      config_changes: ``{run name: "<field> <recorded> -> <now>; ..."}``, the runs whose
        trainer recorded another experiment config than the training config resolves to now
        (:func:`lattn_jax.sweep.config_changes`); marked :data:`CONFIG_MARK`.
    """

    name: str
    root: str
    entries: List[Entry]
    groups: List[Group]
    ranking: List[Group]
    spread: Optional[float]
    spread_groups: int
    close_pairs: List[Tuple[str, str, float]]
    needs_seed: List[str]
    references: List[Dict[str, Any]]
    claims: List[Dict[str, Any]]
    scan: Optional[Dict[str, Any]]
    invocations: List[Dict[str, Any]]
    device: Optional[str] = None
    devices: Dict[str, int] = dataclasses.field(default_factory=dict)
    config_changes: Dict[str, str] = dataclasses.field(default_factory=dict)


# ------------------------------------------------------------------------------------------------
# Statistics
# ------------------------------------------------------------------------------------------------

def rank(values: Sequence[float]) -> np.ndarray:
    """Ranks 1..n of ``values`` (ascending), ties sharing their average rank."""
    return stats.rankdata(np.asarray(values, dtype=np.float64), method="average")


def spearman(x: Sequence[float], y: Sequence[float]) -> Optional[float]:
    """Spearman's rank correlation of two equally long sequences: the Pearson correlation of
    their average ranks (``scipy.stats.spearmanr``). ``None`` for fewer than 2 pairs or a
    constant sequence.

    Raises:
      ValueError: if the lengths differ.
    """
    if len(x) != len(y):
        raise ValueError(f"spearman: {len(x)} values against {len(y)}")
    if len(x) < 2 or len(set(x)) < 2 or len(set(y)) < 2:
        return None
    return float(stats.spearmanr(x, y).statistic)


def seed_spread(groups: Sequence[Group]) -> Tuple[Optional[float], int]:
    """Pooled within-group standard deviation of the final losses (module docstring), and the
    number of groups it pools; ``(None, 0)`` when no group has two finished seeds."""
    num, dof, used = 0.0, 0, 0
    for g in groups:
        if len(g.losses) >= 2:
            x = np.asarray(g.losses)
            num += float(np.sum((x - x.mean()) ** 2))
            dof += len(x) - 1
            used += 1
    return (math.sqrt(num / dof), used) if dof else (None, 0)


def close_pairs(ranking: Sequence[Group], spread: Optional[float],
                factor: float = 3.0) -> List[Tuple[str, str, float]]:
    """Neighbours in ``ranking`` whose gap in mean final loss is below ``factor x spread``, as
    ``(better, worse, gap)``; every pair of groups that close is made of such neighbours."""
    if spread is None:
        return []
    out = []
    for a, b in zip(ranking, ranking[1:]):
        gap = b.mean - a.mean
        if gap < factor * spread:
            out.append((a.name, b.name, gap))
    return out


# ------------------------------------------------------------------------------------------------
# Building the report
# ------------------------------------------------------------------------------------------------

def _reused_note(root: str, run: "sweep.Run") -> str:
    """The runs table's note on a run whose records were copied from an identical finished run
    of another sweep (``sweep.execute(..., reuse_from=...)``)."""
    try:
        with open(os.path.join(sweep.run_dir(root, run), sweep.RUN_RECORD)) as f:
            source = json.load(f).get(sweep.REUSED_KEY)
    except (OSError, ValueError):
        return ""
    if not source:
        return ""
    parts = os.path.normpath(source).split(os.sep)
    where = "/".join(parts[-3:]) if len(parts) >= 3 else source
    return f"the same training as {where} (its records; not run again)"


def _nonfinite_note(r: "sweep.RunResult") -> str:
    """The runs table's note on evaluations whose validation loss was NaN or inf."""
    if not r.nonfinite_val_evals:
        return ""
    return (f"{r.nonfinite_val_evals} of {len(r.val_curve)} evaluations NaN/inf "
            f"(best val: the finite ones)")


def _loss_key(loss: float) -> Tuple[bool, float]:
    """Sort key of a loss: lowest first, a NaN or inf (a diverged run, or one whose final
    evaluation was not finite) after every finite one. A bare NaN key would leave ``sorted``
    and ``min`` in an order that depends on where the NaN stands."""
    finite = math.isfinite(loss)
    return (not finite, loss if finite else 0.0)


def throughput_device(entries: Sequence[Entry]) -> Tuple[Optional[str], Dict[str, int]]:
    """The device label most runs with a throughput ran on (a tie: the first in ``entries``
    order), and the count of runs per label (most first); ``(None, {})`` when no run has a
    known device and a throughput."""
    counts = collections.Counter(device_label(e) for e in entries
                                 if _measured(e) and device_label(e))
    ordered = dict(counts.most_common())  # ties keep the order they were first seen in
    return (next(iter(ordered)) if ordered else None), ordered


def _groups(entries: Sequence[Entry], seed_axis: Optional[str],
            device: Optional[str] = None) -> List[Group]:
    by_name: Dict[str, Group] = {}
    for e in entries:
        g = by_name.get(e.run.group)
        if g is None:
            values = tuple((a, v) for a, v in e.run.values if a != seed_axis)
            g = by_name[e.run.group] = Group(name=e.run.group, values=values)
        g.entries.append(e)
    for g in by_name.values():
        finished = [e for e in g.entries if e.state.status == sweep.Status.FINISHED
                    and e.result.final_val_loss is not None]
        g.losses = [e.result.final_val_loss for e in finished]
        if g.losses:
            g.mean = float(np.mean(g.losses))
            g.sd = float(np.std(g.losses, ddof=1)) if len(g.losses) > 1 else None
            best = [e.result.best_val_loss for e in finished if e.result.best_val_loss is not None]
            g.best_val_loss = float(np.mean(best)) if best else None
            g.tokens = finished[0].result.tokens
        measured = [e for e in g.entries if _measured(e)]
        alone = [e for e in measured if e.result.concurrent <= 1]
        g.throughput_shared = bool(measured) and not alone
        pool = alone or measured
        # Only runs on the sweep's throughput device (or of unknown device) are compared.
        here = [e for e in pool if device is None or device_label(e) in (device, "")]
        if pool and not here:
            g.throughput_device = " or ".join(sorted({device_label(e) for e in pool}))
        pool = here or pool
        g.throughput_remeasured = any(e.alone is not None for e in pool)
        tps = [e.result.tokens_per_sec for e in pool if e.result.tokens_per_sec]
        mfu = [e.result.mfu for e in pool if e.result.mfu is not None]
        g.tokens_per_sec = float(np.mean(tps)) if tps else None
        g.mfu = float(np.mean(mfu)) if mfu else None
        for e in g.entries:
            if e.result.params is not None:
                g.params, g.non_embedding_params = e.result.params, e.result.non_embedding_params
                break
    return list(by_name.values())


def _match(groups: Sequence[Group], text: str) -> Optional[Group]:
    """The group a filter picks: of the matching ones with a final loss, the lowest; else the
    first matching one; ``None`` if none matches."""
    conditions = sweep.parse_filter(text)
    found = [g for g in groups if sweep.matches(g, conditions)]
    scored = [g for g in found if g.mean is not None]
    if scored:
        return min(scored, key=lambda g: g.mean)
    return found[0] if found else None


def _references(config: Mapping[str, Any], groups: Sequence[Group]) -> List[Dict[str, Any]]:
    out = []
    for i, ref in enumerate(config.get("references") or ()):
        metric = ref.get("metric", "final_val_loss")
        if metric not in _METRICS:
            raise sweep.SweepConfigError(f"references[{i}].metric={metric!r}; choose from "
                                         f"{', '.join(_METRICS)}")
        base, base_shared, base_remeasured, base_other = None, False, False, None
        if ref.get("normalise_to"):
            g = _match(groups, ref["normalise_to"])
            base = g.metric(metric) if g is not None else None
            base_shared = _shared_only(g, metric)
            base_remeasured = _remeasured(g, metric)
            base_other = _other_device(g, metric)
        rows = []
        for text, paper in ref.get("values", ()):
            g = _match(groups, text)
            ours = g.metric(metric) if g is not None else None
            if ours is not None and ref.get("normalise_to"):
                ours = ours / base if base else None
            rows.append({"filter": text, "group": g.name if g else None, "paper": paper,
                         "ours": ours, "shared": _shared_only(g, metric),
                         "other_device": _other_device(g, metric),
                         "remeasured": _remeasured(g, metric) or (
                             ours is not None and base_remeasured)})
        pairs = [(r["ours"], r["paper"]) for r in rows
                 if r["ours"] is not None and r["paper"] is not None]
        # Ranks count from the best: the lowest loss, the highest tokens/s; the paper's values
        # go the same way as ours unless ``inverse``.
        ours_sign = -1.0 if metric in _HIGHER_IS_BETTER else 1.0
        paper_sign = -ours_sign if ref.get("inverse") else ours_sign
        ours_key = [ours_sign * p[0] for p in pairs]
        paper_key = [paper_sign * p[1] for p in pairs]
        rho = spearman(ours_key, paper_key) if pairs else None
        ours_rank = rank(ours_key) if pairs else []
        paper_rank = rank(paper_key) if pairs else []
        k = 0
        for r in rows:
            if r["ours"] is not None and r["paper"] is not None:
                r["ours_rank"], r["paper_rank"] = float(ours_rank[k]), float(paper_rank[k])
                k += 1
        out.append({"name": ref.get("name", f"reference {i}"), "source": ref.get("source", ""),
                    "metric": metric, "inverse": bool(ref.get("inverse")),
                    "normalise_to": ref.get("normalise_to"),
                    "note": _fill_note(ref.get("note", ""), rows, groups),
                    "rows": rows, "spearman": rho, "n": len(pairs),
                    "shared_left_out": sum(1 for r in rows if r["shared"]),
                    "other_device_left_out": sum(1 for r in rows
                                                 if r["other_device"] and not r["shared"]),
                    "base_shared": base_shared, "base_remeasured": base_remeasured,
                    "base_other_device": base_other})
    return out


def _fill_note(note: str, rows: Sequence[Mapping[str, Any]], groups: Sequence[Group]) -> str:
    """A reference's ``note`` with ``{matched}`` replaced by the number of this sweep's groups
    its rows pick and ``{groups}`` by the number of groups the sweep has (a tiny sweep has
    fewer than the full one: a fixed count in the note was wrong there)."""
    matched = len({r["group"] for r in rows if r["group"] is not None})
    return note.replace("{matched}", str(matched)).replace("{groups}", str(len(groups)))


def _shared_only(group: Optional[Group], metric: str) -> bool:
    """Whether ``metric`` of ``group`` is a throughput measured only while its runs shared the
    machine (left out of the comparison with the paper)."""
    return group is not None and metric == "tokens_per_sec" and group.throughput_shared


def _other_device(group: Optional[Group], metric: str) -> Optional[str]:
    """The device kind(s) of ``group``'s throughput when ``metric`` is a throughput measured
    only on another kind than the sweep's throughput device (left out of the comparison with
    the paper), else ``None``."""
    if group is None or metric != "tokens_per_sec":
        return None
    return group.throughput_device


def _remeasured(group: Optional[Group], metric: str) -> bool:
    """Whether ``metric`` of ``group`` is a throughput that comes (partly) from runs measured
    again alone after they trained sharing the machine (compared, marked)."""
    return group is not None and metric == "tokens_per_sec" and group.throughput_remeasured


def paired_by_seed(better: Group, worse: Group) -> List[Tuple[Any, float]]:
    """``(seed, better's final loss - worse's)`` for each seed both groups finished, in seed
    order (nats/token; a seed with no recorded final loss in either group is left out)."""
    def finals(g: Group) -> Dict[Any, float]:
        return {e.run.seed: e.result.final_val_loss for e in g.entries
                if e.state.status == sweep.Status.FINISHED and e.result.final_val_loss is not None
                and e.run.seed is not None}
    b, w = finals(better), finals(worse)
    return [(s, b[s] - w[s]) for s in sorted(set(b) & set(w))]


def _paired_note(diffs: Sequence[Tuple[Any, float]]) -> str:
    """The claims table's verdict addition for two or more paired seeds (module docstring)."""
    d = np.asarray([x for _, x in diffs])
    same = int(np.sum(d < 0)) if d.mean() < 0 else int(np.sum(d > 0))
    return (f"; paired by seed: mean {d.mean():+.4f}, sd {np.std(d, ddof=1):.2g}, "
            f"the sign of the mean in {same} of {len(d)} seeds")


def _claims(config: Mapping[str, Any], groups: Sequence[Group],
            spread: Optional[float]) -> List[Dict[str, Any]]:
    out = []
    for i, claim in enumerate(config.get("claims") or ()):
        missing = [k for k in ("claim", "better", "worse") if not claim.get(k)]
        if missing:
            raise sweep.SweepConfigError(f"claims[{i}]: {', '.join(missing)} missing (a claim "
                                         f"is dict(claim, source, better, worse, paper))")
        better, worse = _match(groups, claim["better"]), _match(groups, claim["worse"])
        ours, per_seed = None, []
        if better is not None and worse is not None and None not in (better.mean, worse.mean):
            ours = better.mean - worse.mean
            per_seed = paired_by_seed(better, worse)
        if ours is None:
            verdict = "not run yet"
        else:
            verdict = "holds" if ours < 0 else "does not hold"
            if spread is not None and abs(ours) < 3 * spread:
                verdict += f" (gap below 3 sigma = {3 * spread:.4f})"
            elif spread is None:
                verdict += " (no seed spread yet)"
            if len(per_seed) >= 2:
                verdict += _paired_note(per_seed)
        out.append({"claim": claim["claim"], "source": claim.get("source", ""),
                    "better": claim["better"], "worse": claim["worse"],
                    "paper": claim.get("paper"), "ours": ours, "verdict": verdict,
                    "per_seed": [[sweep.format_value(s), d] for s, d in per_seed]})
    return out


def _scan(config: Mapping[str, Any], groups: Sequence[Group]) -> Optional[Dict[str, Any]]:
    scan = config.get("scan")
    if not scan:
        return None
    if not scan.get("axis"):
        raise sweep.SweepConfigError("scan: axis missing (scan is dict(axis, by))")
    axis, by = scan["axis"], tuple(scan.get("by") or ())
    blocks: Dict[Tuple, Dict[str, Any]] = {}
    for g in groups:
        values = dict(g.values)
        if axis not in values:
            continue
        key = tuple((b, values.get(b)) for b in by)
        others = tuple((a, v) for a, v in g.values if a != axis and a not in by)
        block = blocks.setdefault(key, {"cells": {}, "points": [], "columns": []})
        if values[axis] not in block["points"]:
            block["points"].append(values[axis])
        if others not in block["columns"]:
            block["columns"].append(others)
        block["cells"][(values[axis], others)] = g.mean
    out = []
    for key, block in blocks.items():
        points = sorted(block["points"], key=lambda v: (not isinstance(v, (int, float)), v))
        rows, complete = [], []
        for p in points:
            cells = [block["cells"].get((p, c)) for c in block["columns"]]
            have = [c for c in cells if c is not None]
            mean = float(np.mean(have)) if have else None
            rows.append({"value": p, "cells": cells, "mean": mean, "n": len(have)})
            if have and len(have) == len(cells):
                complete.append((mean, p))
        candidates = complete or [(r["mean"], r["value"]) for r in rows if r["mean"] is not None]
        best = min(candidates, key=lambda t: _loss_key(t[0]))[1] if candidates else None
        edge = best is not None and len(points) > 1 and best in (points[0], points[-1])
        columns = [sweep.values_name(c) or "-" for c in block["columns"]]
        out.append({"by": [list(k) for k in key], "columns": columns, "rows": rows,
                    "best": best, "edge": edge, "complete": bool(complete)})
    return {"axis": axis, "by": list(by), "blocks": out}


def build(config: Mapping[str, Any], root: str,
          config_changes: Optional[Mapping[str, str]] = None) -> Report:
    """Reads every run of the sweep under ``root``.

    Args:
      config: the sweep config (:func:`lattn_jax.sweep.expand`'s options, plus the optional
        ``references``, ``claims`` and ``scan`` of the module docstring).
      root: the sweep directory.
      config_changes: the runs whose recorded experiment config differs from what the training
        config resolves to now (:func:`lattn_jax.sweep.config_changes`; its lines), marked in
        the runs table; ``None``: none.

    Returns:
      A :class:`Report`: the grid's runs in grid order, then runs recorded under the root that
      the grid does not hold.

    Raises:
      SweepConfigError: for a bad grid, reference, claim or scan option, naming it.
    """
    runs = sweep.expand(config)
    names = {r.name for r in runs}
    extra = [r for r in sweep.recorded_runs(root) if r.name not in names]
    entries = []
    for run, in_grid in [(r, True) for r in runs] + [(r, False) for r in extra]:
        entries.append(_entry(run, sweep.run_dir(root, run), in_grid))
    device, devices = throughput_device(entries)
    groups = _groups(entries, config.get("seed_axis"), device)
    ranking = sorted([g for g in groups if g.mean is not None], key=lambda g: _loss_key(g.mean))
    spread, used = seed_spread(groups)
    pairs = close_pairs(ranking, spread)
    by_name = {g.name: g for g in groups}
    needs = []
    for a, b, _ in pairs:
        for name in (a, b):
            if len(by_name[name].losses) < 2 and name not in needs:
                needs.append(name)
    return Report(
        name=config.get("name", os.path.basename(os.path.abspath(root))), root=root,
        entries=entries, groups=groups, ranking=ranking, spread=spread, spread_groups=used,
        close_pairs=pairs, needs_seed=needs, references=_references(config, groups),
        claims=_claims(config, groups, spread), scan=_scan(config, groups),
        invocations=sweep.read_jsonl(os.path.join(root, SWEEP_LOG)), device=device,
        devices=devices, config_changes=dict(config_changes or {}))


# ------------------------------------------------------------------------------------------------
# Writing it
# ------------------------------------------------------------------------------------------------

def _f(value: Optional[float], fmt: str = ".4f") -> str:
    return "" if value is None else format(value, fmt)


def _tokens(n: Optional[int]) -> str:
    if n is None:
        return ""
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n:,}"


def _params(n: Optional[int]) -> str:
    return "" if n is None else f"{n / 1e6:.2f}M"


def _pct(x: Optional[float]) -> str:
    return "" if x is None else f"{100 * x:.1f}%"


def _wall(s: Optional[float]) -> str:
    return "" if s is None else (f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min")


def _md_cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]], align: str) -> List[str]:
    out = ["| " + " | ".join(header) + " |",
           "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
    return out


SHARED_MARK = "†"  # throughput measured while the run shared the GPU (``--parallel`` > 1)


ALONE_MARK = "‡"  # throughput measured again alone after training shared the GPU


DEVICE_MARK = "§"  # throughput measured on another device kind than the sweep's throughput device


CONFIG_MARK = "¶"  # the run's recorded experiment config is not what its config file gives now


def _mark(shared: bool, remeasured: bool = False, other_device: Any = None):
    """A cell formatter: a non-empty cell gets :data:`SHARED_MARK` when ``shared``, else
    :data:`ALONE_MARK` when ``remeasured``, and :data:`DEVICE_MARK` after either (or alone)
    when ``other_device`` is true."""
    mark = SHARED_MARK if shared else ALONE_MARK if remeasured else ""
    if other_device:
        mark += DEVICE_MARK
    return lambda text: f"{text} {mark}" if mark and text else text


def _short_device(label: str) -> str:
    """``"NVIDIA H200"`` -> ``"H200"`` for the runs table (``"NVIDIA "`` dropped)."""
    return label.replace("NVIDIA ", "")


def _alone_steps(entries: Sequence[Entry]) -> str:
    """``"a 300"`` (or ``"a 200 or 300"``, ``"an 80"``): the article and steps of the
    re-measurements alone used, before ``-step run``."""
    steps = sorted({int(e.alone.get("steps") or 0) for e in entries if e.alone is not None})
    text = " or ".join(str(n) for n in steps)
    first = steps[0] if steps else 0  # "an 8..", "an 11", "an 18", "an 11,000-..", "an 18,.."
    spoken_vowel = text.startswith("8") or first in (11, 18) or any(
        low <= first < low + 1000 for low in (11_000, 18_000))
    return ("an " if spoken_vowel else "a ") + text


def alone_footnote(entries: Sequence[Entry]) -> str:
    """The footnote of :data:`ALONE_MARK`: measured alone in an N-step run after training
    shared the GPU (``--remeasure_alone``)."""
    return (f"{ALONE_MARK} Measured alone in {_alone_steps(entries)}-step run after "
            f"training shared the GPU (`experiments/sweep.py --remeasure_alone`: the run's own "
            f"trainer command in `runs/<run>/alone/`, tokens/s and MFU the medians over its "
            f"logging windows after the first; `runs/<run>/{sweep.THROUGHPUT_ALONE}`); "
            f"compared with runs measured alone. The run's wall time stays marked "
            f"{SHARED_MARK}.")


def _alone_note(e: Entry) -> str:
    """The runs table's note on a run whose throughput was measured again alone, or whose
    re-measurement failed."""
    if e.alone_error:
        return f"re-measurement alone failed: {e.alone_error}"
    if e.alone is None:
        return ""
    shared = _f(e.shared_tokens_per_sec, ",.0f")
    mfu = _pct(e.shared_mfu)
    return (f"tokens/s, MFU measured alone in {_alone_steps([e])}-step run on "
            f"{str(e.alone.get('date', ''))[:10]} (while sharing: {shared} tokens/s"
            + (f", MFU {mfu}" if mfu else "") + ")")


def _logged_note(r: "sweep.RunResult") -> str:
    """The runs table's note on a partial run whose losses are from another step than the one
    it resumes from (its step column)."""
    if r.logged_step is None:
        return ""
    return f"losses at the last logged step {r.logged_step} (resumes from step {r.step})"


def _on_cpu(devices: Sequence[str]) -> bool:
    """Whether the recorded device kinds are all CPUs (a CPU-only machine; ``()``: unknown)."""
    return bool(devices) and all("cpu" in str(kind).lower() for kind in devices)


def _shared_what(results: Sequence["sweep.RunResult"]) -> str:
    """``"the machine"`` when every one of ``results`` ran on CPUs only (:func:`_on_cpu`),
    else ``"the GPU"``: what the runs of ``--parallel`` > 1 shared."""
    cpu = bool(results) and all(_on_cpu(r.devices) for r in results)
    return "the machine" if cpu else "the GPU"


def _shared_note(r: "sweep.RunResult") -> str:
    """The runs table's note on a run measured while sharing the GPU (``"shared GPU ..."``;
    ``"shared the machine ..."`` for a run on CPUs only, :func:`_on_cpu`)."""
    what = _shared_what([r])
    if r.concurrent > 1:
        return (f"shared {'GPU' if what == 'the GPU' else what} (parallel={r.parallel}, up to "
                f"{r.concurrent} runs at once)")
    if r.attempts_concurrent > 1:  # throughput measured alone, the wall time is not
        return (f"wall time includes an attempt that shared {what} (parallel={r.parallel}, "
                f"up to {r.attempts_concurrent} runs at once)")
    return ""


def _device_reference_lines(ref: Mapping[str, Any], device: Optional[str]) -> List[str]:
    """What a throughput comparison with the paper left out because it was measured on another
    device kind than the sweep's throughput device ``device``; none when nothing was."""
    if ref["metric"] != "tokens_per_sec":
        return []
    if ref.get("base_other_device") and not ref["base_shared"]:
        return ["", f"{DEVICE_MARK} No comparison: the group it is relative to "
                f"(`{ref['normalise_to']}`) was measured only on {ref['base_other_device']}; "
                f"throughput is compared only between runs on {device}."]
    if ref.get("other_device_left_out"):
        return ["", f"{DEVICE_MARK} {ref['other_device_left_out']} row(s) left out: measured "
                f"only on another device kind than {device} (the row says which); the ranks "
                f"and the correlation use the runs on {device}."]
    return []


def _shared_reference_lines(ref: Mapping[str, Any]) -> List[str]:
    """What a throughput comparison with the paper left out: groups whose runs were all
    measured while sharing the GPU (``--parallel`` > 1); none when nothing was left out."""
    if ref["metric"] != "tokens_per_sec" or not (ref["shared_left_out"] or ref["base_shared"]):
        return []
    if ref["base_shared"]:
        return ["", f"{SHARED_MARK} No comparison: the group it is relative to "
                f"(`{ref['normalise_to']}`) was measured only while sharing the GPU "
                f"(`--parallel` > 1); throughput is compared only between runs measured alone."]
    if not ref["n"]:
        return ["", f"{SHARED_MARK} No comparison: none of these groups was measured alone "
                f"({ref['shared_left_out']} measured only while sharing the GPU, `--parallel` "
                f"> 1); throughput is compared only between runs measured alone."]
    return ["", f"{SHARED_MARK} {ref['shared_left_out']} row(s) left out: measured only while "
            f"sharing the GPU (`--parallel` > 1); the ranks and the correlation use the runs "
            f"measured alone."]


def _config_changed(report: Report, group: Group) -> bool:
    """Whether a run of ``group`` was trained with another experiment config than its config
    file gives now (:attr:`Report.config_changes`, marked :data:`CONFIG_MARK`)."""
    return any(e.run.name in report.config_changes for e in group.entries)


def markdown(report: Report) -> str:
    """The results page (Markdown): commands, ranking, runs (with failed runs' error lines),
    seeds, one section per paper reference (with Spearman's rank correlation), the paper's
    conclusions, the scan, failed runs, and the curves."""
    counts = {s: 0 for s in sweep.Status}
    for e in report.entries:
        counts[e.state.status] += 1
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    lines = [f"# {report.name}: sweep results", "",
             f"- Generated {now} from `{os.path.abspath(report.root)}` "
             f"({len(report.entries)} runs: " + ", ".join(
                 f"{n} {s.value}" for s, n in counts.items() if n) + ").",
             "- Losses are validation cross-entropy in nats/token; \"final\" is the evaluation "
             "at the last step, \"best\" the lowest finite one of all evaluations; tokens/s "
             "and MFU are medians over the trainer's logging windows; wall time includes start-up, "
             "compilation and evaluations.", ""]
    shared = [e for e in report.entries
              if max(e.result.concurrent, e.result.attempts_concurrent) > 1]
    if shared:
        most = max(e.result.parallel for e in shared)
        lines[-1:-1] = [
            f"- {SHARED_MARK} {len(shared)} run(s) shared "
            f"{_shared_what([e.result for e in shared])} with other runs of this "
            f"sweep (`--parallel` up to {most}): their tokens/s, MFU and wall time are marked "
            f"{SHARED_MARK}, describe the shared machine, and are never compared with runs "
            f"measured alone (the throughput comparisons below use only runs measured alone); "
            f"their losses are unaffected. A run whose tokens/s and MFU were measured alone "
            f"after an attempt that shared the GPU has only its wall time marked."]
    elsewhere = [e for e in report.entries if _measured(e) and report.device
                 and device_label(e) not in (report.device, "")]
    if elsewhere:
        kinds = ", ".join(f"{d} ({n} run{'s' if n > 1 else ''})"
                          for d, n in report.devices.items())
        lines[-1:-1] = [
            f"- {DEVICE_MARK} The runs' throughput was measured on more than one kind of "
            f"device: {kinds}. Tokens/s and MFU are compared only between runs on "
            f"{report.device} (the most runs); the {len(elsewhere)} other(s) are marked "
            f"{DEVICE_MARK} and shown, not compared. Losses are compared across devices."]
    elsewhere_ids = {id(e) for e in elsewhere}
    changed = [e for e in report.entries if e.run.name in report.config_changes]
    if changed:
        lines[-1:-1] = [
            f"- {CONFIG_MARK} {len(changed)} run(s) were trained with another experiment config "
            f"than the training config file gives them now (it, or a file it imports, was "
            f"edited since): their numbers are the recorded config's, not this grid's; the runs "
            f"table marks them {CONFIG_MARK} and names the fields (recorded -> now)."]
    remeasured = [e for e in report.entries if e.alone is not None]
    if remeasured:
        lines[-1:-1] = [
            f"- {ALONE_MARK} {len(remeasured)} of them had their tokens/s and MFU measured "
            f"again alone, in {_alone_steps(remeasured)}-step run after training "
            f"(`--remeasure_alone`): those numbers, marked {ALONE_MARK}, replace the shared "
            f"ones and are compared; their wall time stays marked {SHARED_MARK}."]
    if report.invocations:
        lines += ["## Commands", ""]
        for inv in report.invocations:
            lines.append(f"- {inv.get('started', '')} ({_wall(inv.get('wall_s'))}, "
                         f"{inv.get('status', '')}): `{inv.get('command', '')}`")
        lines.append("")
    if report.ranking:
        lines += ["## Ranking", ""]
        best = report.ranking[0].mean
        rows = []
        changed_groups = [g for g in report.ranking if _config_changed(report, g)]
        for i, g in enumerate(report.ranking, 1):
            sd = f" ± {g.sd:.4f}" if g.sd is not None else ""
            mark = _mark(g.throughput_shared, g.throughput_remeasured, g.throughput_device)
            rows.append([i, g.name + (f" {CONFIG_MARK}" if g in changed_groups else ""),
                         len(g.losses), f"{g.mean:.4f}{sd}", f"{g.mean - best:+.4f}",
                         _f(g.best_val_loss), _tokens(g.tokens),
                         mark(_f(g.tokens_per_sec, ",.0f")), mark(_pct(g.mfu)),
                         _params(g.params), _params(g.non_embedding_params)])
        lines += _table(["rank", "group", "seeds", "final val", "Δ best", "best val", "tokens",
                         "tokens/s", "MFU", "params", "non-emb."], rows, "rlrrrrrrrrr")
        if any(g.throughput_shared for g in report.ranking):
            lines += ["", f"{SHARED_MARK} No run of the group was measured alone: tokens/s and "
                      f"MFU of runs that shared the GPU (`--parallel` > 1)."]
        if any(g.throughput_remeasured for g in report.ranking):
            lines += ["", alone_footnote(report.entries)]
        if any(g.throughput_device for g in report.ranking):
            lines += ["", f"{DEVICE_MARK} No run of the group was measured on {report.device}: "
                      f"tokens/s and MFU on the device the runs table names, not compared."]
        if changed_groups:
            lines += ["", f"{CONFIG_MARK} The group has a run trained with another experiment "
                      f"config than the training config file gives it now (marked {CONFIG_MARK} "
                      f"in the runs table): its numbers may include that other experiment's."]
        lines.append("")
    lines += ["## Runs", ""]
    rows = []
    for e in report.entries:
        r, s = e.result, e.state
        progress = f"{r.step}/{s.total_steps}" if s.total_steps else (str(r.step) if r.step else "")
        # tokens/s, MFU: the attempts that wrote their records (or the re-measurement alone)
        mark = _mark(r.concurrent > 1, e.alone is not None, id(e) in elsewhere_ids)
        wall_mark = _mark(r.attempts_concurrent > 1)  # the wall time adds every attempt
        changed_note = report.config_changes.get(e.run.name)
        rows.append([e.run.name + ("" if e.in_grid else " (not in this grid)")
                     + (f" {CONFIG_MARK}" if changed_note else ""), s.status.value,
                     progress, _f(r.final_val_loss), _f(r.best_val_loss),
                     _f(r.final_train_loss), _tokens(r.tokens),
                     mark(_f(r.tokens_per_sec, ",.0f")), mark(_pct(r.mfu)), _params(r.params),
                     _params(r.non_embedding_params), wall_mark(_wall(r.wall_s)),
                     _short_device(device_label(e)),
                     "; ".join(filter(None, [s.error, _logged_note(r), _nonfinite_note(r),
                                             changed_note and f"{CONFIG_MARK} config changed "
                                             f"since it ran: {changed_note}",
                                             _reused_note(report.root, e.run),
                                             _shared_note(r), _alone_note(e)]))])
    lines += _table(["run", "status", "step", "final val", "best val", "final train", "tokens",
                     "tokens/s", "MFU", "params", "non-emb.", "wall", "device", "error"], rows,
                    "llrrrrrrrrrrll")
    if shared:
        lines += ["", f"{SHARED_MARK} Measured while the run shared "
                  f"{_shared_what([e.result for e in report.entries if e.result.concurrent > 1])} "
                  f"with other runs of the sweep (`--parallel` > 1; the note says how many at "
                  f"once): not comparable with runs measured alone."]
    if remeasured:
        lines += ["", alone_footnote(report.entries)]
    if elsewhere:
        lines += ["", f"{DEVICE_MARK} Measured on another device kind than {report.device} (the "
                  f"device column): not compared."]
    if changed:
        lines += ["", f"{CONFIG_MARK} Trained with another experiment config than the training "
                  f"config file gives the run now (the note names the fields, recorded -> now): "
                  f"another experiment's numbers under this grid's name."]
    lines.append("")
    lines += ["## Seeds", ""]
    if report.spread is None:
        lines.append("No group has two finished seeds yet, so there is no seed-to-seed spread.")
    else:
        plural = "s" if report.spread_groups > 1 else ""
        lines.append(f"Seed-to-seed spread (pooled standard deviation of the final loss over "
                     f"{report.spread_groups} group{plural} with two or more seeds): "
                     f"sigma = {report.spread:.4f} nats; 3 sigma = {3 * report.spread:.4f}.")
        if report.close_pairs:
            lines += ["", "Neighbours in the ranking closer than 3 sigma:", ""]
            lines += [f"- {a} vs {b}: gap {gap:.4f}" for a, b, gap in report.close_pairs]
        else:
            lines += ["", "No two neighbours in the ranking are closer than 3 sigma."]
        if report.needs_seed:
            lines += ["", "Second seeds needed (with the config's second seed in its grid, e.g. "
                      "`seeds=2`):", "",
                      "```", " ".join(f"--only='{n}'" for n in report.needs_seed), "```"]
    lines.append("")
    for ref in report.references:
        lines += [f"## Paper: {ref['name']}", "", f"Source: {ref['source']}."]
        if ref["note"]:
            lines += ["", ref["note"]]
        lines.append("")
        metric = ref["metric"] + (" (relative)" if ref["normalise_to"] else "")
        fmt = ".3f" if ref["normalise_to"] else (",.0f" if ref["metric"] == "tokens_per_sec"
                                                 else ".4f")
        rows = [[r["filter"], r["paper"],
                 f"{SHARED_MARK} shared GPU only" if r.get("shared")
                 else f"{DEVICE_MARK} {r['other_device']} only" if r.get("other_device")
                 else _mark(False, r.get("remeasured"))(_f(r["ours"], fmt)),
                 _f(r.get("paper_rank"), "g"), _f(r.get("ours_rank"), "g")]
                for r in ref["rows"]]
        lines += _table(["paper row", "paper", f"ours: {metric}", "paper rank", "our rank"],
                        rows, "lrrrr")
        rho = "n/a (fewer than 2 rows)" if ref["spearman"] is None else f"{ref['spearman']:+.3f}"
        lines += ["", f"Spearman rank correlation over {ref['n']} rows: {rho}"
                  + (" (the paper's values inverted: higher is better there)"
                     if ref["inverse"] else "") + "."]
        lines += _shared_reference_lines(ref)
        lines += _device_reference_lines(ref, report.device)
        if any(r.get("remeasured") and r["ours"] is not None for r in ref["rows"]):
            lines += ["", alone_footnote(report.entries)
                      + (f" The group it is relative to (`{ref['normalise_to']}`) is one of "
                         f"them." if ref.get("base_remeasured") else "")]
        lines.append("")
    if report.claims:
        lines += ["## The paper's conclusions", ""]
        rows = [[c["claim"], c["source"], _f(c["paper"], "+.4f"), _f(c["ours"], "+.4f"),
                 ", ".join(f"{s}: {d:+.4f}" for s, d in c["per_seed"]), c["verdict"]]
                for c in report.claims]
        lines += _table(["claim (Δ = better - worse, final val loss)", "source", "paper Δ",
                         "ours Δ", "Δ by seed", "ours"], rows, "llrrll")
        lines.append("")
    if report.scan:
        scan = report.scan
        lines += [f"## Scan of {scan['axis']}", ""]
        for block in scan["blocks"]:
            title = ", ".join(f"{k}={sweep.format_value(v)}" for k, v in block["by"]) or "all"
            lines += [f"### {title}", ""]
            rows = [[sweep.format_value(r["value"])] + [_f(c) for c in r["cells"]]
                    + [_f(r["mean"]), r["n"]] for r in block["rows"]]
            lines += _table([scan["axis"]] + block["columns"] + ["mean", "n"], rows,
                            "l" + "r" * (len(block["columns"]) + 2))
            if block["best"] is not None:
                note = " (at the edge of the scan: extend it)" if block["edge"] else ""
                note += "" if block["complete"] else " (from incomplete rows)"
                lines += ["", f"Best {scan['axis']}: {sweep.format_value(block['best'])}{note}."]
            lines.append("")
    failed = [e for e in report.entries if e.state.status == sweep.Status.FAILED]
    if failed:
        lines += ["## Failed runs", ""]
        lines += [f"- {e.run.name}: `{e.state.error}` (log: "
                  f"`runs/{e.run.name}/{sweep.RUN_LOG}`)" for e in failed]
        lines.append("")
    lines += ["## Loss curves", "", f"![validation and training loss against tokens]"
              f"({CURVES_PNG})", ""]
    return "\n".join(lines)


_CSV_FIELDS = ("run", "group", "seed", "in_grid", "status", "step", "logged_step", "total_steps",
               "final_val_loss", "best_val_loss", "best_val_step", "last_val_loss",
               "final_train_loss", "tokens", "tokens_per_sec", "mfu", "params",
               "non_embedding_params", "wall_s", "concurrent", "parallel", "alone_steps",
               "shared_tokens_per_sec", "shared_mfu", "devices", "error", "config_changed")


def _run_row(e: Entry) -> Dict[str, Any]:
    r = e.result
    return {"run": e.run.name, "group": e.run.group, "seed": e.run.seed, "in_grid": e.in_grid,
            "status": e.state.status.value, "step": r.step, "logged_step": r.logged_step,
            "total_steps": e.state.total_steps,
            "final_val_loss": r.final_val_loss, "best_val_loss": r.best_val_loss,
            "best_val_step": r.best_val_step, "last_val_loss": r.last_val_loss,
            "final_train_loss": r.final_train_loss, "tokens": r.tokens,
            "tokens_per_sec": r.tokens_per_sec, "mfu": r.mfu, "params": r.params,
            "non_embedding_params": r.non_embedding_params, "wall_s": r.wall_s,
            "concurrent": r.concurrent, "parallel": r.parallel,
            "alone_steps": e.alone.get("steps") if e.alone else None,
            "shared_tokens_per_sec": e.shared_tokens_per_sec, "shared_mfu": e.shared_mfu,
            "devices": device_label(e), "error": e.state.error}


def csv_text(report: Report) -> str:
    """One row per run (:data:`_CSV_FIELDS`; ``config_changed``: the fields, recorded -> now,
    of a run trained with another experiment config than its config file gives now, else
    empty)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=_CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for e in report.entries:
        row = {**_run_row(e), "config_changed": report.config_changes.get(e.run.name)}
        writer.writerow({k: "" if v is None else v for k, v in row.items()})
    return buf.getvalue()


def json_dict(report: Report) -> Dict[str, Any]:
    """The report as JSON-ready data (runs, groups in ranking order, seeds, references, claims,
    scan, commands)."""
    groups = [{"group": g.name, "seeds": len(g.losses), "final_val_loss": g.mean,
               "final_val_loss_sd": g.sd, "best_val_loss": g.best_val_loss,
               "tokens_per_sec": g.tokens_per_sec, "mfu": g.mfu,
               "throughput_shared": g.throughput_shared,
               "throughput_remeasured": g.throughput_remeasured,
               "throughput_device": g.throughput_device, "tokens": g.tokens,
               "params": g.params, "non_embedding_params": g.non_embedding_params,
               "config_changed": _config_changed(report, g),
               "rank": report.ranking.index(g) + 1 if g in report.ranking else None}
              for g in report.groups]
    return {"sweep": report.name, "root": os.path.abspath(report.root),
            "runs": [{**_run_row(e), "config_changed": report.config_changes.get(e.run.name)}
                     for e in report.entries], "groups": groups,
            "seed_spread": report.spread, "seed_spread_groups": report.spread_groups,
            "close_pairs": [list(p) for p in report.close_pairs],
            "needs_second_seed": report.needs_seed, "references": report.references,
            "claims": report.claims, "scan": report.scan, "commands": report.invocations,
            "throughput_device": report.device, "devices": report.devices}


def _finite_or_null(x):
    """``x`` with every NaN or inf float replaced by ``None`` (strict JSON has no NaN)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite_or_null(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite_or_null(v) for v in x]
    return x


def plot_curves(report: Report, path: str) -> Optional[str]:
    """Writes the validation (left) and training (right) loss of every run against tokens;
    one colour per group, one line style per seed. Returns ``path``, or ``None`` when no run
    has logged a loss."""
    from matplotlib import figure  # imported here: only the report plots
    from matplotlib import ticker
    from matplotlib.backends import backend_agg

    entries = [e for e in report.entries if e.result.val_curve or e.result.train_curve]
    if not entries:
        return None
    fig = figure.Figure(figsize=(14, 6.5), dpi=100)
    backend_agg.FigureCanvasAgg(fig)
    ax_val, ax_train = fig.subplots(1, 2)
    group_names = list(dict.fromkeys(e.run.group for e in entries))
    styles = ("-", "--", ":", "-.")
    finals = [e.result.last_val_loss for e in entries
              if e.result.last_val_loss is not None and math.isfinite(e.result.last_val_loss)]
    top = (min(finals) + 1.5) if finals else None
    for e in entries:
        g = group_names.index(e.run.group)
        seeds = [x.run.seed for x in entries if x.run.group == e.run.group]
        style = styles[seeds.index(e.run.seed) % len(styles)]
        colour = f"C{g % 10}"
        width = 1.0 + (g // 10) * 0.8  # beyond ten groups, colours repeat with a wider line
        for ax, curve, marker in ((ax_val, e.result.val_curve, "o"),
                                  (ax_train, e.result.train_curve, None)):
            if curve:
                x, y = zip(*curve)
                ax.plot(x, y, style, color=colour, lw=width, marker=marker, ms=2,
                        label=e.run.name)
    for ax, title in ((ax_val, "validation loss"), (ax_train, "training loss")):
        ax.set_xlabel("tokens")
        ax.set_ylabel("loss (nats/token)")
        ax.set_title(f"{report.name}: {title}")
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        ax.grid(alpha=0.3)
        if top is not None:
            low = min(finals) - 0.1
            ax.set_ylim(low, top)
    handles, labels = ax_val.get_legend_handles_labels()
    if not handles:
        handles, labels = ax_train.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=7, frameon=False)
    rows = math.ceil(len(labels) / 3)
    fig.subplots_adjust(bottom=min(0.1 + 0.025 * rows, 0.6), top=0.93, wspace=0.2)
    tmp = path + ".tmp.png"
    fig.savefig(tmp)
    os.replace(tmp, path)
    return path


def _write_atomic(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def write(report: Report, out_dir: Optional[str] = None) -> Dict[str, str]:
    """Writes ``results.md``, ``results.csv``, ``results.json`` and ``curves.png`` (each
    replaced atomically) to ``out_dir`` (default: the sweep root).

    Returns:
      ``{"md", "csv", "json", "png"}`` paths (``png`` absent when nothing was logged yet).
    """
    out_dir = out_dir or report.root
    os.makedirs(out_dir, exist_ok=True)
    paths = {"md": os.path.join(out_dir, RESULTS_MD), "csv": os.path.join(out_dir, RESULTS_CSV),
             "json": os.path.join(out_dir, RESULTS_JSON)}
    _write_atomic(paths["md"], markdown(report))
    _write_atomic(paths["csv"], csv_text(report))
    _write_atomic(paths["json"], json.dumps(_finite_or_null(json_dict(report)), indent=1,
                                            default=str, allow_nan=False) + "\n")
    png = plot_curves(report, os.path.join(out_dir, CURVES_PNG))
    if png:
        paths["png"] = png
    return paths
