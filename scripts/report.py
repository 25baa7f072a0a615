"""Compare strategies from MLflow: a markdown table and plots of a sweep or an experiment.

    python scripts/report.py --experiment table1 --out outputs/reports/table1
    python scripts/report.py --parent <sweep parent run id> --out outputs/reports/sweep
    MLFLOW_TRACKING_URI=sqlite:////tmp/x.db python scripts/report.py --experiment bidswarm

Runs are grouped into strategies by their name (the Hydra overrides) with ``seed=``,
``run_dir=`` and the overrides every run shares left out, so the seeds of one strategy pool
together. Training
runs give their held-out result after RL (``eval_after/...``) and their training curves;
evaluation runs (``python -m bidswarm.evaluate``) give ``eval/...`` and borrow the training FLOPs
of the run they evaluated. Writes ``report.md``, ``reward_vs_flops.png`` and
``participation.png`` into ``--out`` and prints the table.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from bidswarm import tracking
from bidswarm.rollout.metrics import mean_and_se

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


@dataclass
class StrategyRow:
    strategy: str
    mean: float
    se: float
    runs: int
    training_flops: float | None


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
    return [run for run in runs if tracking.SWEEP_TAG not in run.data.tags]


def history(client: MlflowClient, run_id: str, key: str) -> list[float]:
    """Values of ``key`` in logging order."""
    points = sorted(client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))
    return [m.value for m in points]


def read_run(client: MlflowClient, run: Run) -> RunResult:
    metrics = run.data.metrics
    strategy = strategy_of(run.info.run_name or "")
    if run.data.tags.get("bidswarm.kind") == "evaluate":
        flops = None
        source = run.data.tags.get("bidswarm.source_run")
        if source is not None:
            try:
                flops = client.get_run(source).data.metrics.get("flops/total")
            except Exception:  # the source run lives in another store: no FLOPs to show
                flops = None
        return RunResult(
            run.info.run_id,
            strategy,
            metrics.get("eval/reward/mean"),
            metrics.get("eval/reward/se"),
            flops,
        )
    keys = ["reward/mean", "reward/se", "flops/total"]
    keys += sorted(k for k in metrics if k.startswith("participation/"))
    return RunResult(
        run.info.run_id,
        strategy,
        metrics.get("eval_after/reward/mean"),
        metrics.get("eval_after/reward/se"),
        metrics.get("flops/total"),
        {key: history(client, run.info.run_id, key) for key in keys},
    )


def group_by_strategy(results: list[RunResult]) -> dict[str, list[RunResult]]:
    """Runs per strategy; when strategies differ, the overrides they all share
    (``experiment=figure7``) are left out of their names."""
    parts = [set(r.strategy.split(",")) - {DEFAULT_STRATEGY} for r in results]
    distinct = len({r.strategy for r in results}) > 1
    common = set.intersection(*parts) if parts and distinct else set()
    groups: dict[str, list[RunResult]] = {}
    for result in results:
        kept = [p for p in result.strategy.split(",") if p not in common]
        groups.setdefault(",".join(kept) or DEFAULT_STRATEGY, []).append(result)
    return dict(sorted(groups.items()))


def summarize(groups: dict[str, list[RunResult]]) -> list[StrategyRow]:
    """Mean +- SE per strategy: across runs (seeds) when several, else the run's own SE."""
    rows = []
    for strategy, results in groups.items():
        scored = [r for r in results if r.heldout_mean is not None]
        if not scored:
            continue
        if len(scored) == 1:
            mean, se = scored[0].heldout_mean, scored[0].heldout_se or 0.0
        else:
            mean, se = mean_and_se([r.heldout_mean for r in scored])
        flops = [r.training_flops for r in scored if r.training_flops is not None]
        rows.append(
            StrategyRow(strategy, mean, se, len(scored), sum(flops) / len(flops) if flops else None)
        )
    return sorted(rows, key=lambda row: row.mean, reverse=True)


def markdown_table(rows: list[StrategyRow]) -> str:
    lines = [
        "| strategy | held-out reward (mean ± SE) | runs | training FLOPs | vs best |",
        "|---|---|---|---|---|",
    ]
    best = rows[0].mean if rows else 0.0
    for row in rows:
        flops = f"{row.training_flops:.3g}" if row.training_flops is not None else "n/a"
        gap = "best" if row is rows[0] else f"{row.mean - best:+.2f}"
        lines.append(
            f"| {row.strategy} | {row.mean:.2f} ± {row.se:.2f} | {row.runs} | {flops} | {gap} |"
        )
    return "\n".join(lines)


def verdict(rows: list[StrategyRow]) -> str:
    """One sentence: who wins and by how much (and whether the SEs overlap)."""
    if not rows:
        return "No run holds a held-out result yet."
    if len(rows) == 1:
        return f"Only one strategy: {rows[0].strategy} ({rows[0].mean:.2f} ± {rows[0].se:.2f})."
    first, second = rows[0], rows[1]
    gap = first.mean - second.mean
    relative = f" ({100 * gap / abs(second.mean):+.0f}%)" if second.mean else ""
    overlap = abs(gap) <= first.se + second.se
    note = "within one SE of each other" if overlap else "separated by more than their SEs"
    return (
        f"Best: **{first.strategy}** {first.mean:.2f} ± {first.se:.2f}, {gap:+.2f}{relative} "
        f"over {second.strategy} ({second.mean:.2f} ± {second.se:.2f}); {note}."
    )


def aligned_mean_and_se(series: list[list[float]]) -> tuple[list[float], list[float]]:
    """Per index over runs (truncated to the shortest): mean and SE across runs."""
    length = min(len(s) for s in series)
    stats = [mean_and_se([s[i] for s in series]) for i in range(length)]
    return [m for m, _ in stats], [e for _, e in stats]


def plot_reward_vs_flops(groups: dict[str, list[RunResult]], path: Path) -> Path:
    """Training reward against cumulative training FLOPs per strategy, with SE bands."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for strategy, results in groups.items():
        curves = [r.curves for r in results if r.curves.get("reward/mean")]
        if not curves:
            continue
        flops, _ = aligned_mean_and_se([c["flops/total"] for c in curves])
        reward, se = aligned_mean_and_se([c["reward/mean"] for c in curves])
        if len(curves) == 1:  # one seed: the band is the SE over that update's episodes
            se = curves[0]["reward/se"][: len(reward)]
        (line,) = ax.plot(flops, reward, marker="o", ms=3, label=f"{strategy} (n={len(curves)})")
        lower = [m - s for m, s in zip(reward, se, strict=True)]
        upper = [m + s for m, s in zip(reward, se, strict=True)]
        ax.fill_between(flops, lower, upper, alpha=0.2, color=line.get_color())
    ax.set_xlabel("training FLOPs (rollout + updates)")
    ax.set_ylabel("training episode reward")
    ax.set_title("Reward vs training FLOPs (mean ± SE)")
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_participation(groups: dict[str, list[RunResult]], path: Path) -> Path:
    """Share of acting steps per role over the updates, one panel per strategy."""
    trained = {s: rs for s, rs in groups.items() if any(r.curves.get("reward/mean") for r in rs)}
    panels = max(len(trained), 1)
    fig, axes = plt.subplots(1, panels, figsize=(4 * panels, 3.5), squeeze=False)
    for ax, (strategy, results) in zip(axes[0], trained.items(), strict=False):
        roles = sorted({k for r in results for k in r.curves if k.startswith("participation/")})
        for key in roles:
            series = [r.curves[key] for r in results if r.curves.get(key)]
            share, _ = aligned_mean_and_se(series)
            ax.plot(range(len(share)), share, label=key.split("/", 1)[1])
        ax.set_title(strategy, fontsize=9)
        ax.set_xlabel("update")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        if roles:
            ax.legend(fontsize=8)
    axes[0][0].set_ylabel("share of acting steps")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_report(
    client: MlflowClient, parent: str | None, experiment: str | None, out: Path
) -> str:
    """Table + verdict + plots into ``out``; returns the markdown."""
    runs = find_runs(client, parent, experiment)
    if not runs:
        raise SystemExit("no runs found (is the tracking URI right?)")
    groups = group_by_strategy([read_run(client, run) for run in runs])
    rows = summarize(groups)
    out.mkdir(parents=True, exist_ok=True)
    plot_reward_vs_flops(groups, out / "reward_vs_flops.png")
    plot_participation(groups, out / "participation.png")
    source = f"sweep parent run `{parent}`" if parent else f"experiment `{experiment}`"
    text = "\n\n".join(
        [
            f"# Strategy comparison ({source})",
            markdown_table(rows),
            verdict(rows),
            "![reward vs training FLOPs](reward_vs_flops.png)",
            "![participation share per role](participation.png)",
        ]
    )
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
    args = parser.parse_args(argv)
    client = MlflowClient(tracking.tracking_uri(args.tracking_uri))
    print(write_report(client, args.parent, args.experiment, args.out))
    print(f"\n[bidswarm] report written to {args.out}/report.md")


if __name__ == "__main__":
    main()
