"""The report's figures, one function each, listed in :data:`FIGURES`: the outcomes
against a swept number such as ``replicas`` or ``dropout``, participation at fixed decisions,
reward vs training FLOPs, participation per role, winning bids per role. Each returns the path
it drew, or None when no run logged what it shows. (:mod:`bidswarm.plots` draws the figures of
one run; these compare strategies.)"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bidswarm import statistics
from bidswarm.report.reading import DEFAULT_STRATEGY, RunResult, pass_ks
from bidswarm.report.strategies import (
    WINNING_BID_PHASES,
    StrategyRow,
    bid_levels_of,
    pass_summary,
    winning_bid_shares,
)

FIGURES = {
    "outcomes.png": "held-out outcomes against the swept setting",
    "participation_at.png": "participation at fixed decisions",
    "reward_vs_flops.png": "reward vs training FLOPs",
    "participation.png": "participation share per role",
    "winning_bids.png": "winning-bid distribution per role, after SFT vs after RL",
}
"""The report's figures (file -> caption), in the order the report shows them."""

PANELS_PER_ROW = 3
"""Panels a row of a figure with a panel per strategy (:func:`panel_grid`)."""


def plot_outcomes(
    rows: list[StrategyRow], groups: dict[str, list[RunResult]], path: Path
) -> Path | None:
    """Held-out reward (mean, 95% CI of :func:`~bidswarm.report.strategies.strategy_rows`)
    and, when evaluations logged it, the highest pass@k (mean, 95% CI of
    :func:`~bidswarm.report.strategies.pass_summary`) against the numeric override the
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


def plot_reward_vs_flops_per_strategy(
    groups: dict[str, list[RunResult]], path: Path
) -> Path | None:
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
        "held-out worlds (squares, 95% CI over >= 3 runs, range of 2)",
        fontsize=10,
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


MIN_RUNS_FOR_INTERVAL = 3
"""Runs a held-out point needs before :func:`heldout_whiskers` draws its 95% t interval: with
two runs the t quantile is 12.7 and the interval spans hundreds of reward points."""


def heldout_whiskers(rewards: list[float]) -> tuple[float, float, float]:
    """(mean, low, high) of one held-out point over runs: the 95% t interval from
    :data:`MIN_RUNS_FOR_INTERVAL` runs on, the runs' range below that (the run itself for one)."""
    summary = statistics.summarize(rewards)
    if len(rewards) >= MIN_RUNS_FOR_INTERVAL:
        return summary.mean, summary.ci_low, summary.ci_high
    return summary.mean, min(rewards), max(rewards)


def draw_heldout_points(ax: plt.Axes, results: list[RunResult], color: str) -> None:
    """A strategy's held-out rewards along training (:attr:`RunResult.heldout_curve`), each
    point the mean over the runs that measured it, at their mean FLOPs, with
    :func:`heldout_whiskers`, joined by a dashed line."""
    points = []
    for label in {label for r in results for label in r.heldout_curve}:
        measured = [r.heldout_curve[label] for r in results if label in r.heldout_curve]
        flops = sum(x for x, _ in measured) / len(measured)
        points.append((flops, *heldout_whiskers([reward for _, reward in measured])))
    if points:
        points.sort()
        ax.errorbar(
            [flops for flops, *_ in points],
            [mean for _, mean, _, _ in points],
            yerr=[
                [mean - low for _, mean, low, _ in points],
                [high - mean for _, mean, _, high in points],
            ],
            fmt="s--",
            ms=5,
            capsize=3,
            color=color,
            alpha=0.9,
        )


def plot_participation_per_strategy(groups: dict[str, list[RunResult]], path: Path) -> Path | None:
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


def aligned_mean_and_se(series: list[list[float]]) -> tuple[list[float], list[float]]:
    """Per index over runs (truncated to the shortest): mean and SE across runs."""
    length = min(len(s) for s in series)
    stats = [statistics.summarize([s[i] for s in series]) for i in range(length)]
    return [s.mean for s in stats], [s.se for s in stats]


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
