"""What the report reads of MLflow: the runs of a sweep or an experiment, each as a
:class:`RunResult`, grouped into strategies.

Runs are grouped into strategies by their name (the Hydra overrides) with ``seed=``,
``run_dir=`` and the overrides every run shares left out, so the seeds of one strategy pool
together. Training runs give their held-out result after RL (``eval_after/...``), their
per-update curves, their held-out rewards along training and their budget; evaluation runs
(``python -m bidswarm.evaluate``) give ``eval/...`` (reward, success, pass@k) and borrow the
training FLOPs, budget and training seed of the run they evaluated. Per-world rewards come from
the artifacts ``heldout/<evaluation>_worlds.json``.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mlflow.entities import Run
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from bidswarm import metric_names as names
from bidswarm import tracking

POOLED_KEYS = (
    "seed",
    "run_dir",
    "max_seeds",
    "runs_per_seed",
    "batch_size",
    "device",
    "model.torch_threads",
)
"""Override keys that do not make a strategy (runs differing only in them are pooled): the
training and evaluation seeds and sizes, and where and on how many threads a run computed."""

DEFAULT_STRATEGY = "mpt (defaults)"
"""The strategy of a run without overrides (the MPT defaults) or with pooled ones only."""

BUDGET_COLUMNS = (
    (names.SFT_ACTION_TOKENS, "SFT action tokens"),
    (names.SFT_BID_TOKENS, "SFT bid tokens"),
    (names.SFT_DECISION_TOKENS, "SFT decision tokens"),
    (names.SFT_FLOPS, "SFT FLOPs"),
    (names.UPDATES_ACTION, "RL action updates"),
    (names.UPDATES_BID, "RL bid updates"),
    ("flops/total", "training FLOPs (RL)"),
)
"""The budget a training run logs (its final values) -> the budget table's column header."""
RELABEL_FLOPS = ("sft/relabel/flops", "sft/decision_relabel/flops")
"""The cold start's labelling rounds (bids', a learned decision's): in ``sft/flops``, read
apart for the decision table."""

KIND_TAG = "bidswarm.kind"
"""The tag that says what a run is: ``evaluate`` (``bidswarm.evaluate``), ``report``."""

REPORT_KIND = "report"
"""Runs tagged ``bidswarm.kind=report`` hold a report's markdown and figures, no result."""

FORK_CURVES = (
    "forks/resampled_below",
    "forks/tied",
    "forks/effective_pairs",
    "forks/untied",
    "forks/control_untied",
)
"""The fork funnel's metrics a training run logs at each bid update (``ForkStats``) that the
per-run table reads: forks played, forks tied, effective pairs, and the untied share of the
paper's pairs against that of the control branches (label noise, docs/forks.md)."""

OUTCOMES = (
    "agents",
    "task/success",
    "flops_per_decision",
    "tokens_per_decision",
    "seconds_per_decision",
)
"""Evaluation metrics besides the reward that the outcome table shows (with ``pass@<k>/mean``):
agents, success, and the per-step cost of the rule."""


@dataclass
class RunResult:
    """What the report needs of one MLflow run."""

    run_id: str
    strategy: str
    heldout_mean: float | None
    heldout_se: float | None
    training_flops: float | None
    curves: dict[str, list[float]] = field(default_factory=dict)
    """Per-update histories: ``reward/mean``, ``reward/se``, ``flops/total``, participation;
    per bid update, the fork funnel's :data:`FORK_CURVES`."""
    training_seed: int | None = None
    """The ``seed`` the evaluated agents were trained with (None: unknown, left unpaired)."""
    world_rewards: dict[int, float] | None = None
    """Held-out mean reward per world id (None: the run logged none)."""
    before_world_rewards: dict[int, float] | None = None
    """A training run's held-out per-world rewards before RL (after SFT), if measured."""
    participation: dict[str, dict[str, float]] = field(default_factory=dict)
    """``before`` / ``after`` RL (training runs) or ``eval`` (evaluation runs) -> role -> share
    of acting steps on the held-out worlds."""
    outcomes: dict[str, float] = field(default_factory=dict)
    """An evaluation run's success, pass@k, agents and FLOPs per decision (:data:`OUTCOMES`)."""
    world_pass_at_k: dict[int, dict[int, float]] = field(default_factory=dict)
    """An evaluation run's k -> world id -> pass@k (empty: the run logged none)."""
    success: dict[str, dict[str, float]] = field(default_factory=dict)
    """A training run's held-out evaluations ``before`` / ``after`` RL -> ``task/success`` and
    ``pass_at_<k>/mean`` (a phase absent: not measured)."""
    world_success: dict[str, dict[int, dict[int, float]]] = field(default_factory=dict)
    """``before`` / ``after`` RL -> k -> world id -> pass@k (absent: the run logged none)."""
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
    milestones: dict[str, dict[str, float]] = field(default_factory=dict)
    """``before`` / ``after`` RL (training runs) or ``eval`` (evaluation runs) -> milestone ->
    share of held-out episodes that reached it (``eval_<when>/task/milestone/<name>``; empty:
    the task logs no milestones)."""
    peer_scores: dict[str, float] = field(default_factory=dict)
    """An evaluation run's ``eval/peer_scores/...`` (``received/<role>``, ``margin``,
    ``near_tie``) without the prefix; empty: the rule scores no proposals."""
    market: dict[str, dict[str, float]] = field(default_factory=dict)
    """``before`` / ``after`` RL (training runs) or ``eval`` -> the held-out market health
    (``metric_names.MARKET_HEALTH``, per role where it has roles, and ``gap_to_<rule>/*``)."""
    reference_world_rewards: dict[str, dict[int, float]] = field(default_factory=dict)
    """``<before|after>_<rule>`` -> held-out mean reward per world of the run's agents under
    a reference rule (``eval.reference_rules``; absent: not logged)."""


def strategy_of(run_name: str) -> str:
    """``ablation=monolithic,seed=2`` -> ``ablation=monolithic``; nothing left -> the default."""
    name = run_name.removeprefix("eval ").strip()
    if name in ("", "default"):
        return DEFAULT_STRATEGY
    kept = [part for part in name.split(",") if part.split("=", 1)[0] not in POOLED_KEYS]
    return ",".join(kept) or DEFAULT_STRATEGY


def find_runs(
    client: MlflowClient, parent: str | None, experiments: Sequence[str] = ()
) -> list[Run]:
    """The children of sweep run ``parent``, or every non-parent run of ``experiments`` (one
    store; arms trained into several experiments are then compared and paired as one)."""
    if parent is not None:
        experiment_id = client.get_run(parent).info.experiment_id
        return client.search_runs(
            [experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent}'"
        )
    ids = []
    for experiment in experiments:
        found = client.get_experiment_by_name(experiment)
        if found is None:
            raise SystemExit(f"no MLflow experiment named {experiment!r}")
        ids.append(found.experiment_id)
    runs = [run for experiment_id in ids for run in client.search_runs([experiment_id])]
    return [
        run
        for run in runs
        if tracking.SWEEP_TAG not in run.data.tags and run.data.tags.get(KIND_TAG) != REPORT_KIND
    ]


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
    """The budget (:data:`BUDGET_COLUMNS`, :data:`RELABEL_FLOPS`) among a training run's final
    metric values."""
    keys = [key for key, _ in BUDGET_COLUMNS] + list(RELABEL_FLOPS)
    return {key: metrics[key] for key in keys if key in metrics}


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
    """What the report needs of ``run``: of an evaluation run (tagged ``bidswarm.kind=evaluate``)
    its ``eval/...`` results and its source run's FLOPs, budget and training seed; of a training
    run its held-out results after RL (and before), curves and budget."""
    metrics = run.data.metrics
    strategy = strategy_of(run.info.run_name or "")
    if run.data.tags.get(KIND_TAG) == "evaluate":
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
            participation={"eval": under(metrics, "eval/participation/")},
            milestones={"eval": under(metrics, "eval/task/milestone/")},
            peer_scores=under(metrics, f"eval/{names.PEER_SCORES}/"),
        )
    keys = ["reward/mean", "reward/se", "flops/total"]
    keys += sorted(k for k in metrics if k.startswith(("participation/", "participation_at/")))
    keys += [k for k in FORK_CURVES if k in metrics]
    participation = {
        when: under(metrics, f"eval_{when}/participation/") for when in ("before", "after")
    }
    for when in ("before", "after"):
        participation[f"{when}_at"] = under(metrics, f"eval_{when}/participation_at/")
    success = {
        when: found
        for when in ("before", "after")
        if (found := success_of(metrics, f"eval_{when}/"))
    }
    world_success: dict[str, dict[int, dict[int, float]]] = {}
    for when, found in success.items():
        for k in pass_ks([found]):
            worlds = read_world_rewards(client, run.info.run_id, f"eval_{when}_pass_at_{k}")
            if worlds is not None:
                world_success.setdefault(when, {})[k] = worlds
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
        success=success,
        world_success=world_success,
        heldout_curve=heldout_curve(client, run.info.run_id, metrics),
        budget=budget_of(metrics),
        winning_bids={
            when: bids
            for when in ("before", "after")
            if (bids := winning_bids_of(metrics, f"eval_{when}"))
        },
        milestones={
            when: found
            for when in ("before", "after")
            if (found := under(metrics, f"eval_{when}/task/milestone/"))
        },
        market={
            when: found
            for when in ("before", "after")
            if (found := market_of(metrics, f"eval_{when}/"))
        },
        reference_world_rewards={
            f"{when}_{rule}": worlds
            for when in ("before", "after")
            for rule in references_of(metrics, f"eval_{when}/")
            if (worlds := read_world_rewards(client, run.info.run_id, f"eval_{when}_{rule}"))
        },
    )


def market_of(metrics: dict[str, float], prefix: str) -> dict[str, float]:
    """The market health among the metrics under ``prefix`` (``rollout/market.py``), and the
    evaluation's rollout FLOPs per decision step (``flops_per_decision``: its ``flops`` over
    ``episodes`` x mean ``task/decisions``) where it logged them."""
    found = under(metrics, prefix)
    market = {
        name: value
        for name, value in found.items()
        if name.startswith(names.MARKET_HEALTH) or name.startswith("gap_to_")
    }
    decisions = found.get("episodes", 0.0) * found.get("task/decisions", 0.0)
    if market and "flops" in found and decisions > 0:
        market["flops_per_decision"] = found["flops"] / decisions
    return market


def references_of(metrics: dict[str, float], prefix: str) -> list[str]:
    """The reference rules an evaluation under ``prefix`` was compared with (``gap_to_<rule>``)."""
    gaps = under(metrics, f"{prefix}gap_to_")
    return sorted({name.split("/", 1)[0] for name in gaps})


def under(metrics: dict[str, float], prefix: str) -> dict[str, float]:
    """The metrics whose names start with ``prefix``, keyed by the rest of the name."""
    return {name.removeprefix(prefix): v for name, v in metrics.items() if name.startswith(prefix)}


def success_of(metrics: dict[str, float], prefix: str) -> dict[str, float]:
    """``task/success`` and every ``pass_at_<k>/mean`` among the metrics under ``prefix``."""
    return {
        name: value
        for name, value in under(metrics, prefix).items()
        if name == "task/success" or (name.startswith("pass_at_") and name.endswith("/mean"))
    }


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
