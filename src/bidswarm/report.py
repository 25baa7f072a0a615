"""Compare strategies from MLflow: a markdown table and plots of a sweep or an experiment.

    python scripts/report.py --experiment tables --out outputs/reports/tables \
        --results docs/results.md
    python scripts/report.py --parent <sweep parent run id> --out outputs/reports/sweep
    MLFLOW_TRACKING_URI=sqlite:////tmp/x.db python scripts/report.py --experiment bidswarm

Runs are grouped into strategies by their name (the Hydra overrides) with ``seed=``,
``run_dir=`` and the overrides every run shares left out, so the seeds of one strategy pool
together. Training
runs give their held-out result after RL (``eval_after/...``) and their training curves;
evaluation runs (``python -m bidswarm.evaluate``) give ``eval/...`` and borrow the training FLOPs
of the run they evaluated. Writes ``report.md`` and the figures that have data
(:data:`FIGURES`: the outcomes against a swept number such as ``replicas`` or ``dropout``,
participation at fixed decisions, reward vs training FLOPs, participation per role, winning
bids per role) into ``--out`` and prints the tables.

Statistics are over held-out *worlds*, never episodes: each run logs its mean reward per
held-out world (artifact ``heldout/eval_after_worlds.json``, ``heldout/eval_worlds.json`` for
evaluation runs, with each world's pass@k in ``heldout/eval_pass_at_<k>_worlds.json``). A
strategy's mean, SE and 95% interval are over its (training seed, world) cells by a two-way
cluster bootstrap over training seeds and worlds (a strategy of one training seed: a t interval
over its worlds, labelled as not counting training-seed variation); every strategy is compared
with the reference strategy (``--reference``, default the MPT defaults) by the paired difference
over the (training seed, world) cells both hold, with a two-way cluster bootstrap interval over
training seeds and worlds (:func:`bidswarm.statistics.paired_difference`). Runs logged before
per-world rewards existed fall back to statistics over their run-level means and are left out
of the pairing.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from mlflow.entities import Run
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from bidswarm import metric_names as names
from bidswarm import statistics, tracking

POOLED_KEYS = (
    "seed",
    "run_dir",
    "max_seeds",
    "runs_per_seed",
    "batch_size",
    "device",
)
"""Override keys that do not make a strategy (runs differing only in them are pooled)."""
DEFAULT_STRATEGY = "mpt (defaults)"
BUDGET_COLUMNS = (
    (names.SFT_ACTION_TOKENS, "SFT action tokens"),
    (names.SFT_BID_TOKENS, "SFT bid tokens"),
    (names.SFT_FLOPS, "SFT FLOPs"),
    (names.UPDATES_ACTION, "RL action updates"),
    (names.UPDATES_BID, "RL bid updates"),
    ("flops/total", "training FLOPs (RL)"),
)
"""The budget a training run logs (its final values) -> the budget table's column header."""


@dataclass
class RunResult:
    """What the report needs of one MLflow run."""

    run_id: str
    strategy: str
    heldout_mean: float | None
    heldout_se: float | None
    training_flops: float | None
    curves: dict[str, list[float]] = field(default_factory=dict)
    """Per-update histories: ``reward/mean``, ``reward/se``, ``flops/total``, participation."""
    training_seed: int | None = None
    """The ``seed`` the evaluated agents were trained with (None: unknown, left unpaired)."""
    world_rewards: dict[int, float] | None = None
    """Held-out mean reward per world id (None: the run logged none)."""
    before_world_rewards: dict[int, float] | None = None
    """A training run's held-out per-world rewards before RL (after SFT), if measured."""
    participation: dict[str, dict[str, float]] = field(default_factory=dict)
    """``before`` / ``after`` -> role -> share of acting steps on the held-out worlds."""
    outcomes: dict[str, float] = field(default_factory=dict)
    """An evaluation run's success, pass@k, agents and FLOPs per decision (:data:`OUTCOMES`)."""
    world_pass_at_k: dict[int, dict[int, float]] = field(default_factory=dict)
    """An evaluation run's k -> world id -> pass@k (empty: the run logged none)."""
    heldout_curve: dict[str, tuple[float, float]] = field(default_factory=dict)
    """A training run's held-out mean reward along training: ``before``, ``update <u>``
    (``eval.every``), ``after`` -> (RL training FLOPs so far, reward) (:func:`heldout_curve`)."""
    budget: dict[str, float] = field(default_factory=dict)
    """What the training run spent (:data:`BUDGET_COLUMNS`; an evaluation run: its source
    run's); a key the run did not log is absent."""
    winning_bids: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    """``before`` / ``after`` RL (training runs) or ``eval`` (evaluation runs) -> role -> bid
    level (``0.8``) or ``mean`` -> that held-out ``bids/winning/<role>/<level>`` (empty: the
    rule records no winning bids)."""


@dataclass
class StrategyRow:
    """A strategy's held-out reward: mean, SE and 95% CI over ``n`` ``unit`` (cells or runs)
    from ``seeds`` training seeds (:func:`summarize`)."""

    strategy: str
    mean: float
    se: float
    runs: int
    training_flops: float | None
    ci_low: float | None = None
    ci_high: float | None = None
    n: int = 1
    unit: str = "runs"
    cells: dict[tuple[object, int], float] = field(default_factory=dict)
    """(training seed, world) -> mean reward, for pairing (empty: no per-world rewards)."""
    seeds: int = 1
    """Training seeds the runs came from (a run of unknown seed counts as one of its own)."""

    @property
    def counts_seeds(self) -> bool:
        """Whether SE and CI include training-seed variation (two seeds or more)."""
        return self.seeds >= 2


ONE_SEED = "1 seed: SE over worlds, training-seed variation not counted"
"""The note of a strategy with a single training seed, whose SE and CI are over worlds only."""


@dataclass
class DifferenceRow:
    """``strategy`` minus the reference, paired by (training seed, world); None: not paired."""

    strategy: str
    difference: statistics.Difference | None


def strategy_of(run_name: str) -> str:
    """``ablation=monolithic,seed=2`` -> ``ablation=monolithic``; nothing left -> the default."""
    name = run_name.removeprefix("eval ").strip()
    if name in ("", "default"):
        return DEFAULT_STRATEGY
    kept = [part for part in name.split(",") if part.split("=", 1)[0] not in POOLED_KEYS]
    return ",".join(kept) or DEFAULT_STRATEGY


def find_runs(client: MlflowClient, parent: str | None, experiment: str | None) -> list[Run]:
    """The children of sweep run ``parent``, or every non-parent run of ``experiment``."""
    if parent is not None:
        experiment_id = client.get_run(parent).info.experiment_id
        return client.search_runs(
            [experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent}'"
        )
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise SystemExit(f"no MLflow experiment named {experiment!r}")
    runs = client.search_runs([found.experiment_id])
    return [
        run
        for run in runs
        if tracking.SWEEP_TAG not in run.data.tags and run.data.tags.get(KIND_TAG) != REPORT_KIND
    ]


KIND_TAG = "bidswarm.kind"
REPORT_KIND = "report"
"""Runs tagged ``bidswarm.kind=report`` hold a report's markdown and figures, no result."""


def log_report(client: MlflowClient, experiment: str, out: Path) -> str:
    """The report's markdown and PNG figures as the artifacts of a run of ``experiment``
    (tagged as a report, so the next report leaves it out)."""
    experiment_id = client.get_experiment_by_name(experiment).experiment_id
    run = client.create_run(
        experiment_id,
        run_name=f"report {time.strftime('%Y-%m-%d %H:%M')}",
        tags={KIND_TAG: REPORT_KIND},
    )
    for path in [*sorted(out.glob("*.png")), out / "report.md"]:
        client.log_artifact(run.info.run_id, str(path), "report")
    client.set_terminated(run.info.run_id)
    return run.info.run_id


def seed_of(params: dict[str, str], run_name: str) -> int | None:
    """A run's ``seed`` param, else the ``seed=`` of its name, else None."""
    value = params.get("seed")
    if value is None:
        overrides = dict(part.split("=", 1) for part in run_name.split(",") if "=" in part)
        value = overrides.get("seed")
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def read_world_rewards(client: MlflowClient, run_id: str, key: str) -> dict[int, float] | None:
    """The artifact ``heldout/<key>_worlds.json`` of a run (None: the run logged none)."""
    name = f"heldout/{key}_worlds.json"
    try:
        if name not in {a.path for a in client.list_artifacts(run_id, "heldout")}:
            return None
        with tempfile.TemporaryDirectory() as folder:
            text = Path(client.download_artifacts(run_id, name, folder)).read_text()
    except (MlflowException, OSError):  # artifacts in a store this machine cannot read
        return None
    return {int(world): float(reward) for world, reward in json.loads(text).items()}


def history(client: MlflowClient, run_id: str, key: str) -> list[float]:
    """Values of ``key`` in logging order."""
    points = sorted(client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))
    return [m.value for m in points]


def heldout_curve(
    client: MlflowClient, run_id: str, metrics: dict[str, float]
) -> dict[str, tuple[float, float]]:
    """Held-out mean reward of a training run against its RL training FLOPs: before RL (0),
    every ``eval.every`` updates (``eval_during`` at step u: after update u, whose FLOPs are
    logged at step u - 1) and after RL (the last update's FLOPs)."""
    flops = {m.step: m.value for m in client.get_metric_history(run_id, "flops/total")}
    points = {}
    if "eval_before/reward/mean" in metrics:
        points["before"] = (0.0, metrics["eval_before/reward/mean"])
    for m in client.get_metric_history(run_id, "eval_during/reward/mean"):
        if m.step - 1 in flops:
            points[f"update {m.step}"] = (flops[m.step - 1], m.value)
    if "eval_after/reward/mean" in metrics and flops:
        points["after"] = (flops[max(flops)], metrics["eval_after/reward/mean"])
    return points


def folder_seed(run_dir: str | None) -> int | None:
    """The ``seed`` in a training run folder's ``resolved_config.yaml`` (None: no such file)."""
    config = Path(run_dir) / "resolved_config.yaml" if run_dir else None
    if config is None or not config.is_file():
        return None
    return OmegaConf.load(config).get("seed")


def budget_of(metrics: dict[str, float]) -> dict[str, float]:
    """The budget (:data:`BUDGET_COLUMNS`) among a training run's final metric values."""
    return {key: metrics[key] for key, _ in BUDGET_COLUMNS if key in metrics}


def winning_bids_of(metrics: dict[str, float], evaluation: str) -> dict[str, dict[str, float]]:
    """Role -> level (or ``mean``) -> value of the ``<evaluation>/bids/winning/<role>/<level>``
    metrics (:func:`bidswarm.rollout.metrics.winning_bid_metrics`)."""
    prefix = f"{evaluation}/{names.WINNING_BIDS}/"
    found: dict[str, dict[str, float]] = {}
    for key, value in metrics.items():
        if key.startswith(prefix):
            role, level = key.removeprefix(prefix).split("/")
            found.setdefault(role, {})[level] = value
    return found


def read_run(client: MlflowClient, run: Run) -> RunResult:
    metrics = run.data.metrics
    strategy = strategy_of(run.info.run_name or "")
    if run.data.tags.get("bidswarm.kind") == "evaluate":
        # Its own ``seed`` is the evaluation's; the training seed is its source run's.
        flops, seed, budget = None, None, {}
        source = run.data.tags.get("bidswarm.source_run")
        if source is not None:
            try:
                trained = client.get_run(source)
            except Exception:  # the source run lives in another store: no FLOPs to show
                trained = None
            if trained is not None:
                flops = trained.data.metrics.get("flops/total")
                seed = seed_of(trained.data.params, trained.info.run_name or "")
                budget = budget_of(trained.data.metrics)
        if seed is None:  # the source run logged elsewhere: its folder's config says the seed
            seed = folder_seed(run.data.tags.get("bidswarm.source_run_dir"))
        outcomes = {
            name.removeprefix("eval/"): value
            for name, value in metrics.items()
            if name.removeprefix("eval/") in OUTCOMES
            or (name.startswith("eval/pass_at_") and name.endswith("/mean"))
        }
        world_pass_at_k = {
            k: read_world_rewards(client, run.info.run_id, f"eval_pass_at_{k}")
            for k in pass_ks([outcomes])
        }
        return RunResult(
            run.info.run_id,
            strategy,
            metrics.get("eval/reward/mean"),
            metrics.get("eval/reward/se"),
            flops,
            training_seed=seed,
            world_rewards=read_world_rewards(client, run.info.run_id, "eval"),
            outcomes=outcomes,
            world_pass_at_k={k: v for k, v in world_pass_at_k.items() if v is not None},
            budget=budget,
            winning_bids={"eval": bids} if (bids := winning_bids_of(metrics, "eval")) else {},
        )
    keys = ["reward/mean", "reward/se", "flops/total"]
    keys += sorted(k for k in metrics if k.startswith(("participation/", "participation_at/")))
    participation = {
        when: {
            key.rsplit("/", 1)[1]: value
            for key, value in metrics.items()
            if key.startswith(f"eval_{when}/participation/")
        }
        for when in ("before", "after")
    }
    for when in ("before", "after"):
        prefix = f"eval_{when}/participation_at/"
        participation[f"{when}_at"] = {
            key.removeprefix(prefix): value
            for key, value in metrics.items()
            if key.startswith(prefix)
        }
    return RunResult(
        run.info.run_id,
        strategy,
        metrics.get("eval_after/reward/mean"),
        metrics.get("eval_after/reward/se"),
        metrics.get("flops/total"),
        {key: history(client, run.info.run_id, key) for key in keys},
        training_seed=seed_of(run.data.params, run.info.run_name or ""),
        world_rewards=read_world_rewards(client, run.info.run_id, "eval_after"),
        before_world_rewards=read_world_rewards(client, run.info.run_id, "eval_before"),
        participation=participation,
        heldout_curve=heldout_curve(client, run.info.run_id, metrics),
        budget=budget_of(metrics),
        winning_bids={
            when: bids
            for when in ("before", "after")
            if (bids := winning_bids_of(metrics, f"eval_{when}"))
        },
    )


OUTCOMES = ("agents", "task/success", "flops_per_decision")
"""Evaluation metrics besides the reward that the outcome table shows (with ``pass@<k>/mean``)."""


def pass_ks(outcomes: list[dict[str, float]]) -> list[int]:
    """The k of every ``pass_at_<k>/mean`` in ``outcomes``, ascending."""
    return sorted(
        {
            int(key.removeprefix("pass_at_").split("/")[0])
            for run in outcomes
            for key in run
            if key.startswith("pass_at_")
        }
    )


def outcome_table(groups: dict[str, list[RunResult]], reference: str | None = None) -> str:
    """Per strategy of evaluation runs: agents, task success and pass@1..k (each the mean over
    the held-out worlds of a run, here mean ± SE over the strategy's runs, i.e. training seeds),
    the highest pass@k's 95% CI over (training seed, world) cells (two-way cluster bootstrap;
    empty when a run logged no per-world pass@k), with a ``reference`` strategy its paired
    difference to the reference's, and the FLOPs per decision; empty when no run logged them."""
    rows = {s: [r for r in rs if r.outcomes] for s, rs in groups.items()}
    rows = {s: results for s, results in rows.items() if results}
    if not rows:
        return ""
    ks = pass_ks([r.outcomes for results in rows.values() for r in results])
    columns = ["task/success"] + [f"pass_at_{k}/mean" for k in ks]
    header = ["strategy", "agents", "success", *(f"pass@{k}" for k in ks)]
    header += [f"pass@{ks[-1]} 95% CI"] if ks else []
    paired = bool(ks) and reference in rows
    header += [f"pass@{ks[-1]} − {reference} (95% CI)"] if paired else []
    header += ["FLOPs/decision", "runs"]
    lines = [
        "Task success and pass@k per strategy (unbiased estimator per held-out world from its "
        "runs, mean over worlds per training run; here mean ± SE over the training runs), the "
        "highest pass@k's 95% CI by the two-way cluster bootstrap over training seeds and "
        "worlds (it spans only values seen: cells all 0% give 0% .. 0%), and the evaluation's "
        "FLOPs per decision (bids and actions of every agent).",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for strategy, results in rows.items():
        outcomes = [r.outcomes for r in results]
        cells = [strategy, f"{outcomes[0].get('agents', float('nan')):.0f}"]
        for column in columns:
            values = [o[column] for o in outcomes if column in o]
            if not values:
                cells.append("")
                continue
            summary = statistics.summarize(values)
            cells.append(f"{100 * summary.mean:.1f}% ± {100 * summary.se:.1f}")
        if ks:
            cells.append(pass_interval(results, ks[-1]))
        if paired:
            cells.append(pass_difference(results, rows[reference], ks[-1]))
        flops = [o["flops_per_decision"] for o in outcomes if "flops_per_decision" in o]
        cells.append(f"{sum(flops) / len(flops):.3g}" if flops else "")
        cells.append(str(len(outcomes)))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def pass_interval(results: list[RunResult], k: int) -> str:
    """``low% .. high%``: the 95% two-way cluster bootstrap interval of pass@k over the runs'
    (training seed, world) cells; empty when a run logged no per-world pass@k."""
    cells = pass_cells(results, k)
    if cells is None:
        return ""
    summary = statistics.clustered_summary(cells)
    return f"{100 * summary.ci_low:.1f}% .. {100 * summary.ci_high:.1f}%"


def pass_summary(results: list[RunResult], k: int) -> statistics.Summary | None:
    """pass@k of a strategy: over its (training seed, world) cells (:func:`cell_summary`) when
    every run logged per-world pass@k, else the t interval over its runs' means (one training
    seed each); None when no run logged pass@k."""
    cells = pass_cells(results, k)
    if cells is not None:
        return cell_summary(cells)[0]
    values = [r.outcomes[f"pass_at_{k}/mean"] for r in results if f"pass_at_{k}/mean" in r.outcomes]
    return statistics.summarize(values) if values else None


def pass_cells(results: list[RunResult], k: int) -> dict[tuple[object, int], float] | None:
    """(training seed, world) -> pass@k (:func:`strategy_cells`); None when a run logged no
    per-world pass@k."""
    if any(k not in r.world_pass_at_k for r in results):
        return None
    return strategy_cells(results, lambda r: r.world_pass_at_k[k])


def group_by_strategy(results: list[RunResult]) -> dict[str, list[RunResult]]:
    """Runs per strategy; when strategies differ, the overrides they all share
    (``experiment=tables``) are left out of their names."""
    parts = [set(r.strategy.split(",")) - {DEFAULT_STRATEGY} for r in results]
    distinct = len({r.strategy for r in results}) > 1
    common = set.intersection(*parts) if parts and distinct else set()
    groups: dict[str, list[RunResult]] = {}
    for result in results:
        kept = [p for p in result.strategy.split(",") if p not in common]
        groups.setdefault(",".join(kept) or DEFAULT_STRATEGY, []).append(result)
    return dict(sorted(groups.items()))


def pass_difference(results: list[RunResult], reference: list[RunResult], k: int) -> str:
    """``+d (low .. high)`` in points: pass@k of ``results`` minus the ``reference`` runs' on
    the (training seed, world) cells both hold (:func:`bidswarm.statistics.paired_difference`);
    empty when a run logged no per-world pass@k or they share no cell."""
    mine, theirs = pass_cells(results, k), pass_cells(reference, k)
    if mine is None or theirs is None:
        return ""
    if results is reference:
        return "reference"
    if not mine.keys() & theirs.keys():
        return ""
    d = statistics.paired_difference(mine, theirs)
    return f"{100 * d.mean:+.1f} ({100 * d.ci_low:+.1f} .. {100 * d.ci_high:+.1f})"


def seed_cluster(result: RunResult) -> object:
    """The training seed of a run; a run of unknown seed is its own cluster, ``run <id>``."""
    return f"run {result.run_id}" if result.training_seed is None else result.training_seed


def strategy_cells(
    results: list[RunResult],
    per_world: Callable[[RunResult], dict[int, float] | None] = lambda r: r.world_rewards,
) -> dict[tuple[object, int], float]:
    """(training seed, world) -> mean over the strategy's runs of that seed of ``per_world``
    (by default the held-out reward; a run of unknown seed is its own cluster
    (:func:`seed_cluster`), which pairs with nothing)."""
    values: dict[tuple[object, int], list[float]] = {}
    for result in results:
        cluster = seed_cluster(result)
        for world, reward in (per_world(result) or {}).items():
            values.setdefault((cluster, world), []).append(reward)
    return {key: sum(v) / len(v) for key, v in values.items()}


def cell_summary(cells: dict[tuple[object, int], float]) -> tuple[statistics.Summary, int]:
    """Mean, SE and 95% CI of a strategy's (training seed, world) cells, and how many training
    seeds they hold. Two seeds or more: the two-way cluster bootstrap over training seeds and
    worlds (:func:`bidswarm.statistics.clustered_summary`; cells that share a seed are not
    independent). One seed: the t interval over its worlds, which cannot count the variation
    between training seeds (:data:`ONE_SEED`)."""
    seeds = len({seed for seed, _ in cells})
    if seeds >= 2:
        return statistics.clustered_summary(cells), seeds
    return statistics.summarize(list(cells.values())), seeds


def summarize(groups: dict[str, list[RunResult]]) -> list[StrategyRow]:
    """Mean, SE and 95% CI per strategy. When every run logged per-world rewards: over its
    (training seed, world) cells (:func:`cell_summary`: two-way cluster bootstrap over seeds
    and worlds; one seed: over worlds only). Else over its runs' means (t interval; each run is
    one training seed; one run: its own SE over worlds, no CI)."""
    rows = []
    for strategy, results in groups.items():
        scored = [r for r in results if r.heldout_mean is not None]
        if not scored:
            continue
        flops = [r.training_flops for r in scored if r.training_flops is not None]
        row = StrategyRow(
            strategy, 0.0, 0.0, len(scored), sum(flops) / len(flops) if flops else None
        )
        row.seeds = len(scored)  # runs without per-world rewards: one training seed each
        if all(r.world_rewards for r in scored):
            row.cells = strategy_cells(scored)
            s, row.seeds = cell_summary(row.cells)
            row.unit = "cells"
        elif len(scored) == 1:
            row.mean, row.se = scored[0].heldout_mean, scored[0].heldout_se or 0.0
            rows.append(row)
            continue
        else:
            s = statistics.summarize([r.heldout_mean for r in scored])
        row.mean, row.se, row.ci_low, row.ci_high, row.n = s.mean, s.se, s.ci_low, s.ci_high, s.n
        rows.append(row)
    return sorted(rows, key=lambda row: row.mean, reverse=True)


def interval_basis(row: StrategyRow) -> str:
    """What a row's SE and CI are over: ``3 seeds, 90 cells``, ``5 runs``; a row of one
    training seed says so (``1 seed, 30 worlds¹``, ``1 run¹``: footnote :data:`ONE_SEED`)."""
    if row.ci_low is None:
        return "1 run¹"
    if row.unit == "runs":
        return f"{row.n} runs"
    if not row.counts_seeds:
        return f"1 seed, {row.n} worlds¹"
    return f"{row.seeds} seeds, {row.n} cells"


def markdown_table(rows: list[StrategyRow]) -> str:
    """Mean ± SE, 95% CI and what they are over (seeds and cells, or runs), runs, FLOPs, gap
    to the best; a footnote marks the rows whose interval cannot count training seeds."""
    lines = [
        "Held-out reward per strategy: mean ± SE and 95% CI over its (training seed, world) "
        "cells, each the mean of that world's runs, by a two-way cluster bootstrap over "
        "training seeds and worlds (runs that logged no per-world rewards: t interval over the "
        "runs' means, one training seed each).",
        "",
        "| strategy | held-out reward (mean ± SE) | 95% CI | over | runs | training FLOPs "
        "| vs best |",
        "|---|---|---|---|---|---|---|",
    ]
    best = rows[0].mean if rows else 0.0
    for row in rows:
        flops = f"{row.training_flops:.3g}" if row.training_flops is not None else "n/a"
        gap = "best" if row is rows[0] else f"{row.mean - best:+.2f}"
        ci = "n/a" if row.ci_low is None else f"{row.ci_low:.2f} .. {row.ci_high:.2f}"
        lines.append(
            f"| {row.strategy} | {row.mean:.2f} ± {row.se:.2f} | {ci} | {interval_basis(row)} "
            f"| {row.runs} | {flops} | {gap} |"
        )
    if any(not row.counts_seeds for row in rows):
        lines += ["", f"¹ {ONE_SEED}."]
    return "\n".join(lines)


def reference_strategy(rows: list[StrategyRow], chosen: str | None) -> str:
    """``chosen``, else the MPT defaults when present, else the best row."""
    names = [row.strategy for row in rows]
    if chosen is not None:
        if chosen not in names:
            raise SystemExit(f"--reference {chosen!r}: no such strategy; strategies: {names}")
        return chosen
    return DEFAULT_STRATEGY if DEFAULT_STRATEGY in names else names[0]


def paired_differences(rows: list[StrategyRow], reference: str) -> list[DifferenceRow]:
    """Every other strategy minus ``reference`` over the (training seed, world) cells both
    hold (two-way cluster bootstrap CI); None when they share no cell."""
    base = next(row for row in rows if row.strategy == reference)
    out = []
    for row in rows:
        if row is base:
            continue
        shared = row.cells.keys() & base.cells.keys()
        difference = (
            statistics.paired_difference(row.cells, base.cells, row.strategy, reference)
            if shared
            else None
        )
        out.append(DifferenceRow(row.strategy, difference))
    return out


def difference_table(differences: list[DifferenceRow], reference: str) -> str:
    """Markdown: strategy - reference, its 95% CI, how many cells were paired, the verdict."""
    lines = [
        f"Paired difference to **{reference}** on the same (training seed, world) cells; 95% CI "
        "by a two-way cluster bootstrap over training seeds and worlds.",
        "",
        f"| strategy | − {reference} | 95% CI | paired cells | verdict |",
        "|---|---|---|---|---|",
    ]
    for row in differences:
        d = row.difference
        if d is None:
            lines.append(f"| {row.strategy} | n/a | n/a | 0 | not paired: no shared cell |")
        else:
            lines.append(
                f"| {row.strategy} | {d.mean:+.2f} | {d.ci_low:+.2f} .. {d.ci_high:+.2f} "
                f"| {d.n} | {d.verdict} |"
            )
    return "\n".join(lines)


def budget_table(groups: dict[str, list[RunResult]]) -> str:
    """Markdown: per strategy, what its training spent (:data:`BUDGET_COLUMNS`), the mean over
    its runs that logged it (empty when no run logged a budget)."""
    headers = " | ".join(header for _, header in BUDGET_COLUMNS)
    lines = [
        "What each strategy's training spent (mean over its runs; an evaluation run counts "
        "its source run's): SFT tokens (prompt + reply) of action and of bid demonstrations "
        "and SFT FLOPs, the RL updates of each kind, and RL's training FLOPs (rollouts, forks "
        "and trained tokens; SFT's apart). By default every arm makes the same passes over "
        "each action demonstration and the same number of action updates (docs/coordination.md).",
        "",
        f"| strategy | {headers} | runs |",
        "|---|" + "---|" * (len(BUDGET_COLUMNS) + 1),
    ]
    found = False
    for strategy, results in groups.items():
        budgets = [r.budget for r in results if r.budget]
        if not budgets:
            continue
        found = True
        cells = []
        for key, _ in BUDGET_COLUMNS:
            logged = [budget[key] for budget in budgets if key in budget]
            cells.append(f"{sum(logged) / len(logged):.3g}" if logged else "n/a")
        lines.append(f"| {strategy} | {' | '.join(cells)} | {len(budgets)} |")
    return "\n".join(lines) if found else ""


def rl_gain_table(groups: dict[str, list[RunResult]]) -> str:
    """Markdown: per training strategy, held-out reward after RL minus after SFT, paired on the
    same (training seed, world) cells (empty when no run measured both)."""
    lines = [
        "What RL adds to each strategy's own cold start: held-out reward after RL minus after "
        "SFT, paired on the same (training seed, world) cells; each mean and the difference "
        "with its 95% CI by the two-way cluster bootstrap over training seeds and worlds.",
        "",
        "| strategy | after SFT (95% CI) | after RL (95% CI) | RL − SFT | 95% CI | verdict |",
        "|---|---|---|---|---|---|",
    ]
    found = one_seed = False
    for strategy, results in groups.items():
        both = [r for r in results if r.world_rewards and r.before_world_rewards]
        if not both:
            continue
        found = True
        after = strategy_cells(both)
        before = strategy_cells(
            [
                RunResult(
                    r.run_id,
                    r.strategy,
                    None,
                    None,
                    None,
                    training_seed=r.training_seed,
                    world_rewards=r.before_world_rewards,
                )
                for r in both
            ]
        )
        d = statistics.paired_difference(after, before, "after RL", "after SFT")
        (sft, seeds), (rl, _) = cell_summary(before), cell_summary(after)
        one_seed = one_seed or seeds < 2
        mark = "¹" if seeds < 2 else ""
        lines.append(
            f"| {strategy} | {sft.mean:.2f} ({sft.ci_low:.2f} .. {sft.ci_high:.2f}){mark} "
            f"| {rl.mean:.2f} ({rl.ci_low:.2f} .. {rl.ci_high:.2f}){mark} | {d.mean:+.2f} "
            f"| {d.ci_low:+.2f} .. {d.ci_high:+.2f} | {d.verdict} |"
        )
    if one_seed:
        lines += ["", f"¹ {ONE_SEED}."]
    return "\n".join(lines) if found else ""


def participation_table(groups: dict[str, list[RunResult]]) -> str:
    """Markdown: per strategy and role, the held-out share of acting steps after SFT -> after
    RL, averaged over the strategy's runs (the paper's participation shift)."""
    rows = []
    for strategy, results in groups.items():
        measured = [
            r for r in results if r.participation.get("before") and r.participation.get("after")
        ]
        if not measured:
            continue
        roles = sorted({role for r in measured for role in r.participation["after"]})
        shifts = []
        for role in roles:
            before = sum(r.participation["before"].get(role, 0.0) for r in measured) / len(measured)
            after = sum(r.participation["after"].get(role, 0.0) for r in measured) / len(measured)
            shifts.append(f"{role} {100 * before:.0f}% → {100 * after:.0f}%")
        rows.append(f"| {strategy} | {'; '.join(shifts)} | {len(measured)} |")
    if not rows:
        return ""
    header = [
        "Participation on the held-out worlds (share of acting steps per role), after SFT → "
        "after RL, mean over runs.",
        "",
        "| strategy | participation | runs |",
        "|---|---|---|",
    ]
    return "\n".join(header + rows)


WINNING_BID_PHASES = {"before": "after SFT", "after": "after RL", "eval": "evaluation"}
"""The held-out evaluations whose winning bids the report shows, in order, with their labels."""


def winning_bid_shares(
    results: list[RunResult],
) -> dict[str, dict[str, dict[str, float]]]:
    """Phase (:data:`WINNING_BID_PHASES`) -> role -> level (or ``mean``) -> the mean over the
    runs in which the role acted of their held-out ``bids/winning/<role>/<level>``."""
    shares: dict[str, dict[str, dict[str, float]]] = {}
    for phase in WINNING_BID_PHASES:
        measured = [r.winning_bids[phase] for r in results if phase in r.winning_bids]
        for role in sorted({role for bids in measured for role in bids}):
            acted = [bids[role] for bids in measured if role in bids]
            levels = {level for bids in acted for level in bids}
            shares.setdefault(phase, {})[role] = {
                level: sum(bids.get(level, 0.0) for bids in acted) / len(acted) for level in levels
            }
    return shares


def bid_levels_of(shares: dict[str, dict[str, dict[str, float]]]) -> list[str]:
    """The bid levels (``0.2`` ... ``0.8``) in ``shares``, ascending."""
    levels = {level for roles in shares.values() for bids in roles.values() for level in bids}
    return sorted(levels - {"mean"}, key=float)


def winning_bid_table(groups: dict[str, list[RunResult]]) -> str:
    """Markdown: per strategy and role, the held-out share of the role's acting steps won at
    each bid level and the mean winning bid, after SFT → after RL (or of an evaluation run),
    mean over runs; empty when no run's rule records winning bids."""
    shares = {strategy: winning_bid_shares(results) for strategy, results in groups.items()}
    shares = {strategy: found for strategy, found in shares.items() if found}
    if not shares:
        return ""
    levels = sorted({lv for found in shares.values() for lv in bid_levels_of(found)}, key=float)
    lines = [
        "Winning bids on the held-out worlds: per role, the share of its acting steps won at "
        "each bid level and the mean winning bid (the bids bucket-brigade credit, Eq. 2, passes "
        "upstream), after SFT → after RL, mean over the runs in which the role acted. Rules "
        "without bids record none and have no row.",
        "",
        "| strategy | role | " + " | ".join(levels) + " | mean bid | runs |",
        "|" + "---|" * (len(levels) + 4),
    ]
    for strategy, found in shares.items():
        phases = [phase for phase in WINNING_BID_PHASES if phase in found]
        runs = sum(any(p in r.winning_bids for p in phases) for r in groups[strategy])
        for role in sorted({role for phase in phases for role in found[phase]}):
            cells = []
            for level in [*levels, "mean"]:
                values = [found[phase].get(role, {}).get(level) for phase in phases]
                shown = [
                    "–" if v is None else (f"{v:.2f}" if level == "mean" else f"{100 * v:.0f}%")
                    for v in values
                ]
                cells.append(" → ".join(shown))
            lines.append(f"| {strategy} | {role} | {' | '.join(cells)} | {runs} |")
    return "\n".join(lines)


def plot_winning_bids(groups: dict[str, list[RunResult]], path: Path) -> Path | None:
    """Per strategy a panel: for each role, a bar per held-out evaluation (after SFT, after
    RL), stacked by the share of the role's acting steps won at each bid level. None when no
    run's rule records winning bids."""
    shares = {strategy: winning_bid_shares(results) for strategy, results in groups.items()}
    shares = {strategy: found for strategy, found in shares.items() if found}
    if not shares:
        return None
    levels = sorted({lv for found in shares.values() for lv in bid_levels_of(found)}, key=float)
    colors = {level: plt.cm.viridis(i / max(len(levels) - 1, 1)) for i, level in enumerate(levels)}
    fig, axes = panel_grid(len(shares))
    for ax, (strategy, found) in zip(axes, shares.items(), strict=False):
        phases = [phase for phase in WINNING_BID_PHASES if phase in found]
        roles = sorted({role for phase in phases for role in found[phase]})
        ticks, labels = [], []
        for i, role in enumerate(roles):
            for j, phase in enumerate(phases):
                x = i * (len(phases) + 1) + j
                ticks.append(x)
                labels.append(f"{role}\n{WINNING_BID_PHASES[phase]}")
                bottom = 0.0
                for level in levels:
                    share = found[phase].get(role, {}).get(level, 0.0)
                    ax.bar(x, share, bottom=bottom, color=colors[level], width=0.8)
                    bottom += share
        ax.set_xticks(ticks, labels, fontsize=7, rotation=90)
        ax.set_title(wrapped(strategy), fontsize=8)
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3, axis="y")
    axes[0].set_ylabel("share of the role's acting steps")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[level]) for level in levels]
    axes[0].legend(handles, [f"won at {level}" for level in levels], fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def verdict(rows: list[StrategyRow]) -> str:
    """One sentence: who has the highest mean, by how much over the second, and whether that
    is told apart: by their paired difference on the (training seed, world) cells both hold
    (two-way cluster bootstrap) when they share cells, else by whether their 95% intervals
    overlap; a comparison that rests on one training seed says so."""
    if not rows:
        return "No run holds a held-out result yet."
    if len(rows) == 1:
        return f"Only one strategy: {rows[0].strategy} ({rows[0].mean:.2f} ± {rows[0].se:.2f})."
    first, second = rows[0], rows[1]
    gap = first.mean - second.mean
    relative = f" ({100 * gap / abs(second.mean):+.0f}%)" if second.mean else ""
    shared = first.cells.keys() & second.cells.keys()
    note, one_seed = "no interval to tell them apart (a run without per-world rewards)", False
    if shared:
        d = statistics.paired_difference(first.cells, second.cells, first.strategy, second.strategy)
        seeds = len({seed for seed, _ in shared})
        note = (
            f"paired on {d.n} (training seed, world) cells: {d.mean:+.2f} (95% CI "
            f"{d.ci_low:+.2f} .. {d.ci_high:+.2f}), {d.verdict}"
        )
        one_seed = seeds < 2
    elif first.ci_low is not None and second.ci_low is not None:
        apart = first.ci_low > second.ci_high or second.ci_low > first.ci_high
        note = "their 95% intervals do not overlap" if apart else "their 95% intervals overlap"
        one_seed = not (first.counts_seeds and second.counts_seeds)
    if one_seed:
        note += f" ({ONE_SEED})"
    return (
        f"Best: **{first.strategy}** {first.mean:.2f} ± {first.se:.2f}, {gap:+.2f}{relative} "
        f"over {second.strategy} ({second.mean:.2f} ± {second.se:.2f}); {note}."
    )


def aligned_mean_and_se(series: list[list[float]]) -> tuple[list[float], list[float]]:
    """Per index over runs (truncated to the shortest): mean and SE across runs."""
    length = min(len(s) for s in series)
    stats = [statistics.summarize([s[i] for s in series]) for i in range(length)]
    return [s.mean for s in stats], [s.se for s in stats]


def plot_reward_vs_flops(groups: dict[str, list[RunResult]], path: Path) -> Path | None:
    """Training reward against cumulative training FLOPs per strategy, with SE bands; None
    when no run has training curves (a report of evaluation runs only)."""
    trained = {s: rs for s, rs in groups.items() if any(r.curves.get("reward/mean") for r in rs)}
    if not trained:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for strategy, results in trained.items():
        curves = [r.curves for r in results if r.curves.get("reward/mean")]
        flops, _ = aligned_mean_and_se([c["flops/total"] for c in curves])
        reward, se = aligned_mean_and_se([c["reward/mean"] for c in curves])
        if len(curves) == 1:  # one seed: the band is the SE over that update's episodes
            se = curves[0]["reward/se"][: len(reward)]
        (line,) = ax.plot(flops, reward, marker="o", ms=3, label=f"{strategy} (n={len(curves)})")
        lower = [m - s for m, s in zip(reward, se, strict=True)]
        upper = [m + s for m, s in zip(reward, se, strict=True)]
        ax.fill_between(flops, lower, upper, alpha=0.2, color=line.get_color())
        draw_heldout_points(ax, results, line.get_color())
    ax.set_xlabel("RL training FLOPs (rollout + updates)")
    ax.set_ylabel("episode reward")
    ax.set_title(
        "Reward vs training FLOPs: training episodes (line, ± SE),\n"
        "held-out worlds (squares, 95% CI over runs)",
        fontsize=10,
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def draw_heldout_points(ax: plt.Axes, results: list[RunResult], color: str) -> None:
    """A strategy's held-out rewards along training (:attr:`RunResult.heldout_curve`), each
    point the mean over the runs that measured it, at their mean FLOPs, with the 95% t
    interval over those runs (none for one run), joined by a dashed line."""
    xs, means, errors = [], [], []
    for label in {label for r in results for label in r.heldout_curve}:
        points = [r.heldout_curve[label] for r in results if label in r.heldout_curve]
        summary = statistics.summarize([reward for _, reward in points])
        xs.append(sum(x for x, _ in points) / len(points))
        means.append(summary.mean)
        errors.append(summary.ci_high - summary.mean)
    if xs:
        order = sorted(range(len(xs)), key=lambda i: xs[i])
        ax.errorbar(
            [xs[i] for i in order],
            [means[i] for i in order],
            yerr=[errors[i] for i in order],
            fmt="s--",
            ms=5,
            capsize=3,
            color=color,
            alpha=0.9,
        )


def plot_participation(groups: dict[str, list[RunResult]], path: Path) -> Path | None:
    """Share of acting steps per role over the updates, one panel per strategy; None when no
    run has training curves."""
    trained = {s: rs for s, rs in groups.items() if any(r.curves.get("reward/mean") for r in rs)}
    if not trained:
        return None
    fig, axes = panel_grid(len(trained))
    for ax, (strategy, results) in zip(axes, trained.items(), strict=False):
        roles = sorted({k for r in results for k in r.curves if k.startswith("participation/")})
        for key in roles:
            series = [r.curves[key] for r in results if r.curves.get(key)]
            share, _ = aligned_mean_and_se(series)
            ax.plot(range(len(share)), share, label=key.split("/", 1)[1])
        ax.set_title(wrapped(strategy), fontsize=8)
        ax.set_xlabel("update")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        if roles:
            ax.legend(fontsize=8)
    axes[0].set_ylabel("share of acting steps")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def participation_at_table(groups: dict[str, list[RunResult]]) -> str:
    """Who acts at fixed decisions (``participation_at/<d>/<role>``) on the held-out worlds,
    after SFT -> after RL, mean over runs; empty when no run logged it."""
    lines = []
    for strategy, results in groups.items():
        before = [r.participation.get("before_at", {}) for r in results]
        after = [r.participation.get("after_at", {}) for r in results]
        keys = sorted({k for p in after for k in p})
        if not keys:
            continue
        for label in sorted({k.split("/")[0] for k in keys}, key=lambda x: (x == "last", x)):
            parts = []
            for key in (k for k in keys if k.split("/")[0] == label):
                b = [p[key] for p in before if key in p]
                a = [p[key] for p in after if key in p]
                shown = f"{100 * sum(b) / len(b):.0f}% → " if b else ""
                parts.append(f"{key.split('/')[1]} {shown}{100 * sum(a) / len(a):.0f}%")
            lines.append(f"| {strategy} | {label} | {'; '.join(parts)} | {len(results)} |")
    if not lines:
        return ""
    head = [
        "Who acts at a fixed decision on the held-out worlds (share of episodes in which the "
        "role acted there; the rest skipped it), after SFT → after RL, mean over runs.",
        "",
        "| strategy | decision | participation | runs |",
        "|---|---|---|---|",
    ]
    return "\n".join(head + lines)


def plot_participation_at(groups: dict[str, list[RunResult]], path: Path) -> Path | None:
    """Share of training episodes in which each role acts at the 10th / 30th / last decision,
    over the updates: one panel per (strategy, decision). None when no run logged it."""
    panels = []
    for strategy, results in groups.items():
        labels = sorted(
            {
                k.split("/")[1]
                for r in results
                for k in r.curves
                if k.startswith("participation_at/")
            },
            key=lambda x: (x == "last", x),
        )
        panels += [(strategy, label, results) for label in labels]
    if not panels:
        return None
    fig, axes = panel_grid(len(panels))
    for ax, (strategy, label, results) in zip(axes, panels, strict=False):
        prefix = f"participation_at/{label}/"
        for key in sorted({k for r in results for k in r.curves if k.startswith(prefix)}):
            share, _ = aligned_mean_and_se([r.curves[key] for r in results if r.curves.get(key)])
            ax.plot(range(len(share)), share, label=key.removeprefix(prefix))
        ax.set_title(wrapped(f"{strategy}: decision {label}"), fontsize=8)
        ax.set_xlabel("update")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("share of episodes acting")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


PANELS_PER_ROW = 3


def panel_grid(panels: int) -> tuple[plt.Figure, list[plt.Axes]]:
    """A figure of ``panels`` panels, at most :data:`PANELS_PER_ROW` a row (long strategy
    names stay readable); the unused panels of the last row are hidden."""
    columns = min(panels, PANELS_PER_ROW)
    rows = -(-panels // columns)
    fig, grid = plt.subplots(
        rows, columns, figsize=(4.2 * columns, 3.6 * rows), squeeze=False, sharey=True
    )
    axes = list(grid.flat)
    for unused in axes[panels:]:
        unused.set_visible(False)
    return fig, axes[:panels]


def wrapped(title: str, width: int = 40) -> str:
    """A panel title broken at its commas into lines of about ``width`` characters."""
    lines, line = [], ""
    for part in title.split(","):
        if line and len(line) + len(part) + 1 > width:
            lines.append(line + ",")
            line = part
        else:
            line = f"{line},{part}" if line else part
    return "\n".join([*lines, line])


def swept_setting(strategies: list[str]) -> tuple[str, dict[str, tuple[float, str]]] | None:
    """The numeric override the strategies vary most (``replicas``, ``dropout``): its key, and
    per strategy its value and the rest of its name (the series it belongs to). None when no
    override with a number in every strategy takes two or more values."""
    parsed = {s: dict(p.split("=", 1) for p in s.split(",") if "=" in p) for s in strategies}
    values: dict[str, set[float]] = {}
    for key in set().union(*parsed.values()):
        numbers = {as_number(parts.get(key)) for parts in parsed.values()} - {None}
        if len(numbers) >= 2:
            values[key] = numbers
    if not values:
        return None
    key = max(sorted(values), key=lambda k: len(values[k]))
    points = {}
    for strategy, parts in parsed.items():
        x = as_number(parts.get(key))
        if x is not None:
            rest = ",".join(f"{k}={v}" for k, v in parts.items() if k != key)
            points[strategy] = (x, rest or DEFAULT_STRATEGY)
    return key, points


def as_number(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def plot_outcomes(
    rows: list[StrategyRow], groups: dict[str, list[RunResult]], path: Path
) -> Path | None:
    """Held-out reward (mean, 95% CI of :func:`summarize`) and, when evaluations logged it, the
    highest pass@k (mean, 95% CI of :func:`pass_summary`) against the numeric override the
    strategies sweep (population size, dropout p), a line per series (e.g. per coordination
    rule); hollow markers: one training seed (intervals over worlds only). None when the
    strategies sweep no number."""
    swept = swept_setting([row.strategy for row in rows])
    if swept is None:
        return None
    key, points = swept
    ks = pass_ks([r.outcomes for rs in groups.values() for r in rs])
    pass_key = f"pass_at_{ks[-1]}/mean" if ks else None
    fig, axes = plt.subplots(1, 2 if pass_key else 1, figsize=(11 if pass_key else 6, 4))
    axes = list(axes) if pass_key else [axes]
    for series in sorted({rest for _, rest in points.values()}):
        chosen = sorted(
            (points[row.strategy][0], row)
            for row in rows
            if row.strategy in points and points[row.strategy][1] == series
        )
        xs = [x for x, _ in chosen]
        means = [row.mean for _, row in chosen]
        low = [row.mean - (row.ci_low if row.ci_low is not None else row.mean) for _, row in chosen]
        high = [
            (row.ci_high if row.ci_high is not None else row.mean) - row.mean for _, row in chosen
        ]
        (line, _, _) = axes[0].errorbar(
            xs, means, yerr=[low, high], marker="o", ms=4, capsize=3, label=series
        )
        one_seed = [(x, row.mean) for x, row in chosen if not row.counts_seeds]
        if one_seed:
            axes[0].plot(*zip(*one_seed, strict=True), "o", ms=7, mfc="white", c=line.get_color())
        if pass_key:
            shares = [pass_summary(groups[row.strategy], ks[-1]) for _, row in chosen]
            shown = [(x, s) for x, s in zip(xs, shares, strict=True) if s is not None]
            axes[1].errorbar(
                [x for x, _ in shown],
                [100 * s.mean for _, s in shown],
                yerr=[
                    [100 * (s.mean - s.ci_low) for _, s in shown],
                    [100 * (s.ci_high - s.mean) for _, s in shown],
                ],
                marker="o",
                ms=4,
                capsize=3,
                label=series,
            )
    axes[0].set_ylabel("held-out reward (mean, 95% CI)")
    axes[0].set_title("95% CI over training seeds × worlds (hollow: 1 seed)", fontsize=9)
    if pass_key:
        axes[1].set_ylabel(f"pass@{max(ks)} of task success, % (mean, 95% CI)")
        axes[1].set_ylim(0, 100)
    for ax in axes:
        ax.set_xlabel(key)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


FIGURES = {
    "outcomes.png": "held-out outcomes against the swept setting",
    "participation_at.png": "participation at fixed decisions",
    "reward_vs_flops.png": "reward vs training FLOPs",
    "participation.png": "participation share per role",
    "winning_bids.png": "winning-bid distribution per role, after SFT vs after RL",
}
"""The report's figures (file -> caption), in the order the report shows them."""


def write_report(
    client: MlflowClient,
    parent: str | None,
    experiment: str | None,
    out: Path,
    reference: str | None = None,
) -> str:
    """Tables (strategies; paired differences to ``reference``) + verdict + plots into
    ``out``; returns the markdown."""
    runs = find_runs(client, parent, experiment)
    if not runs:
        raise SystemExit("no runs found (is the tracking URI right?)")
    groups = group_by_strategy([read_run(client, run) for run in runs])
    rows = summarize(groups)
    out.mkdir(parents=True, exist_ok=True)
    source = f"sweep parent run `{parent}`" if parent else f"experiment `{experiment}`"
    sections = [f"# Strategy comparison ({source})", markdown_table(rows), verdict(rows)]
    if len(rows) > 1:
        reference = reference_strategy(rows, reference)
        sections.append(difference_table(paired_differences(rows, reference), reference))
    tables = (
        budget_table(groups),
        rl_gain_table(groups),
        participation_table(groups),
        participation_at_table(groups),
        winning_bid_table(groups),
        outcome_table(groups, reference),
    )
    sections += [table for table in tables if table]
    for name in FIGURES:  # figures of an earlier report into ``out`` must not linger
        (out / name).unlink(missing_ok=True)
    drawn = [
        plot_outcomes(rows, groups, out / "outcomes.png"),
        plot_participation_at(groups, out / "participation_at.png"),
        plot_reward_vs_flops(groups, out / "reward_vs_flops.png"),
        plot_participation(groups, out / "participation.png"),
        plot_winning_bids(groups, out / "winning_bids.png"),
    ]
    sections += [f"![{FIGURES[path.name]}]({path.name})" for path in drawn if path is not None]
    text = "\n\n".join(sections)
    (out / "report.md").write_text(text + "\n")
    return text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--parent", help="run id of a sweep's parent run")
    which.add_argument("--experiment", help="MLflow experiment name")
    parser.add_argument("--out", type=Path, default=Path("outputs/reports/latest"))
    parser.add_argument(
        "--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI, else the project store"
    )
    parser.add_argument(
        "--reference",
        default=None,
        help=f"strategy the others are paired against (default: {DEFAULT_STRATEGY!r} when "
        "present, else the best)",
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=None,
        help="also put the report into this markdown file (e.g. docs/results.md), replacing "
        "its section for this experiment or sweep; figures are copied beside it",
    )
    args = parser.parse_args(argv)
    client = MlflowClient(tracking.tracking_uri(args.tracking_uri))
    text = write_report(client, args.parent, args.experiment, args.out, args.reference)
    print(text)
    print(f"\n[bidswarm] report written to {args.out}/report.md")
    if args.experiment is not None:
        run_id = log_report(client, args.experiment, args.out)
        print(f"[bidswarm] report and figures logged to MLflow run {run_id}")
    if args.results is not None:
        name = args.experiment or f"sweep-{args.parent}"
        update_results(args.results, name, text, args.out, " ".join(sys.argv))
        print(f"[bidswarm] section {name!r} of {args.results} updated")


def update_results(results: Path, name: str, text: str, figures: Path, command: str) -> None:
    """Replace (or append) the section of ``name`` in ``results``: the report's markdown, its
    figures copied to ``results``'s folder as ``<name>_<figure>.png``, the command, the date."""
    results.parent.mkdir(parents=True, exist_ok=True)
    for figure in figures.glob("*.png"):
        target = results.parent / "results" / f"{name}_{figure.name}"
        target.parent.mkdir(exist_ok=True)
        shutil.copyfile(figure, target)
        text = text.replace(f"]({figure.name})", f"](results/{target.name})")
    text = text.replace("# Strategy comparison", "## Strategy comparison", 1)
    begin, end = f"<!-- report:{name} -->", f"<!-- /report:{name} -->"
    section = f"{begin}\n{text}\n\nMade {time.strftime('%Y-%m-%d')} by `{command}`.\n{end}"
    current = results.read_text() if results.exists() else ""
    if begin in current and end in current:
        head, rest = current.split(begin, 1)
        current = head + section + rest.split(end, 1)[1]
    else:
        current = current.rstrip() + ("\n\n" if current else "") + section + "\n"
    results.write_text(current)


if __name__ == "__main__":
    main()
