"""The numbers of each strategy: its held-out reward with a 95% interval, paired
differences to a reference strategy, pass@k and the winning-bid shares.

Statistics are over held-out *worlds*, never episodes. A strategy's mean, SE and 95% interval
are over its (training seed, world) cells by a two-way random-effects analysis of training
seeds x worlds (:func:`bidswarm.statistics.clustered_summary`; a strategy of one training seed:
a t interval over its worlds, labelled as not counting training-seed variation,
:data:`ONE_SEED`); every strategy is compared with the
reference strategy by the paired difference over the (training seed, world) cells both hold,
with the same interval over the per-cell differences
(:func:`bidswarm.statistics.paired_difference`). Runs logged before per-world rewards existed
fall back to statistics over their run-level means and are left out of the pairing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from bidswarm import statistics
from bidswarm.report.reading import DEFAULT_STRATEGY, RunResult

ONE_SEED = "1 seed: SE over worlds, training-seed variation not counted"
"""The note of a strategy with a single training seed, whose SE and CI are over worlds only."""

WINNING_BID_PHASES = {"before": "after SFT", "after": "after RL", "eval": "evaluation"}
"""The held-out evaluations whose winning bids the report shows, in order, with their labels."""


@dataclass
class StrategyRow:
    """A strategy's held-out reward: mean, SE and 95% CI over ``n`` ``unit`` (cells or runs)
    from ``seeds`` training seeds (:func:`strategy_rows`)."""

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


@dataclass
class DifferenceRow:
    """``strategy`` minus ``reference``, paired by (training seed, world); None: not paired."""

    strategy: str
    difference: statistics.Difference | None
    reference: str
    """The strategy it is compared with (:func:`paired_with`)."""


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
    seeds they hold. Two seeds or more: the two-way random-effects interval over training seeds
    x worlds (:func:`bidswarm.statistics.clustered_summary`; cells that share a seed are not
    independent). One seed: the t interval over its worlds, which cannot count the variation
    between training seeds (:data:`ONE_SEED`)."""
    seeds = len({seed for seed, _ in cells})
    if seeds >= 2:
        return statistics.clustered_summary(cells), seeds
    return statistics.summarize(list(cells.values())), seeds


def strategy_rows(groups: dict[str, list[RunResult]]) -> list[StrategyRow]:
    """Mean, SE and 95% CI per strategy. When every run logged per-world rewards: over its
    (training seed, world) cells (:func:`cell_summary`: two-way random effects of seeds x
    worlds; one seed: over worlds only). Else over its runs' means (t interval; each run is
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


def settings_of(strategy: str) -> list[str]:
    """The ``key=value`` settings a strategy's name is made of (:func:`strategy_of`)."""
    return strategy.split(",")


def is_setting(reference: str, names: list[str]) -> bool:
    """Whether ``reference`` is one setting of strategies named by several, not a strategy."""
    return reference not in names and any(
        reference in settings_of(name) and len(settings_of(name)) > 1 for name in names
    )


def reference_strategy(
    rows: list[StrategyRow], chosen: str | None, pair_by: Sequence[str] = ()
) -> str:
    """``chosen`` (a strategy, or one setting of strategies named by several:
    :func:`paired_with`), else the MPT defaults when present, else the best row. ``pair_by``
    needs a setting as ``chosen``, and keys that some strategy names."""
    names = [row.strategy for row in rows]
    if chosen is not None and chosen not in names and not is_setting(chosen, names):
        raise SystemExit(
            f"--reference {chosen!r}: no such strategy, nor a setting of one; strategies: {names}"
        )
    if pair_by and (chosen is None or not any(chosen in settings_of(n) for n in names)):
        raise SystemExit(f"--pair-by needs one setting as --reference (got {chosen!r})")
    unknown = [key for key in pair_by if all(setting_value(n, key) is None for n in names)]
    if unknown:
        raise SystemExit(f"--pair-by {unknown}: no strategy names such a setting; {names}")
    if chosen is not None:
        return chosen
    return DEFAULT_STRATEGY if DEFAULT_STRATEGY in names else names[0]


def setting_value(name: str, key: str) -> str | None:
    """The value ``name`` (a strategy) gives ``key``; None where it names no such setting."""
    values = [s.split("=", 1)[1] for s in settings_of(name) if s.split("=", 1)[0] == key]
    return values[0] if values else None


def paired_with(names: list[str], reference: str, pair_by: Sequence[str] = ()) -> dict[str, str]:
    """Strategy -> the strategy it is compared with. ``reference`` a strategy: every other one
    with it. ``reference`` one setting (``ablation=initial_bids``) of strategies named by
    several (``rl.fork_tie_break=True,ablation=none``): each strategy without that setting with
    the one that differs from it only there (``rl.fork_tie_break=True,ablation=initial_bids``),
    so a factor is compared within each level of the others; a strategy with no such match is
    absent. ``pair_by`` (keys): each strategy without the reference setting is paired instead
    with the one strategy that has it and the same value of each key in ``pair_by`` (or names
    neither), whatever their other settings: arms that differ in more than one setting
    (``ablation=none,dropout=0.3,replicas=4`` with ``ablation=monolithic,dropout=0.3``, the
    reference ``ablation=monolithic`` paired by ``dropout``); absent where none or several
    match. The reference is then a setting even where one strategy is named by it alone."""
    if pair_by:
        at_reference = [name for name in names if reference in settings_of(name)]
        pairs = {}
        for name in names:
            if name in at_reference:
                continue
            level = [setting_value(name, key) for key in pair_by]
            matches = [r for r in at_reference if [setting_value(r, k) for k in pair_by] == level]
            if len(matches) == 1:
                pairs[name] = matches[0]
        return pairs
    if not is_setting(reference, names):
        return {name: reference for name in names if name != reference}
    key = reference.split("=", 1)[0]
    with_reference = {
        tuple(s for s in settings_of(name) if s != reference): name
        for name in names
        if reference in settings_of(name)
    }
    pairs = {}
    for name in names:
        if reference in settings_of(name):
            continue
        others = tuple(s for s in settings_of(name) if s.split("=", 1)[0] != key)
        if others in with_reference and len(others) == len(settings_of(name)) - 1:
            pairs[name] = with_reference[others]
    return pairs


def paired_differences(
    rows: list[StrategyRow], reference: str, pair_by: Sequence[str] = ()
) -> list[DifferenceRow]:
    """Every strategy minus the one it is paired with (:func:`paired_with`) over the (training
    seed, world) cells both hold (two-way random-effects CI); None when they share no cell."""
    by_name = {row.strategy: row for row in rows}
    out = []
    for strategy, base_name in paired_with(list(by_name), reference, pair_by).items():
        row, base = by_name[strategy], by_name[base_name]
        shared = row.cells.keys() & base.cells.keys()
        difference = (
            statistics.paired_difference(row.cells, base.cells, row.strategy, base_name)
            if shared
            else None
        )
        out.append(DifferenceRow(row.strategy, difference, base_name))
    return out


def pass_cells(results: list[RunResult], k: int) -> dict[tuple[object, int], float] | None:
    """(training seed, world) -> pass@k (:func:`strategy_cells`); None when a run logged no
    per-world pass@k."""
    if any(k not in r.world_pass_at_k for r in results):
        return None
    return strategy_cells(results, lambda r: r.world_pass_at_k[k])


def pass_summary(results: list[RunResult], k: int) -> statistics.Summary | None:
    """pass@k of a strategy: over its (training seed, world) cells (:func:`cell_summary`) when
    every run logged per-world pass@k, else the t interval over its runs' means (one training
    seed each); None when no run logged pass@k."""
    cells = pass_cells(results, k)
    if cells is not None:
        return cell_summary(cells)[0]
    values = [r.outcomes[f"pass_at_{k}/mean"] for r in results if f"pass_at_{k}/mean" in r.outcomes]
    return statistics.summarize(values) if values else None


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


@dataclass
class CatchUp:
    """When ``strategy`` first reaches ``target``'s final held-out reward along its own held-out
    curve (:attr:`RunResult.heldout_curve`), as a fraction of the RL training FLOPs ``target``
    spent to get there, per training seed (:func:`catch_up`)."""

    strategy: str
    target: str
    fractions: dict[object, float | None]
    """Training seed -> FLOPs fraction; None: ``strategy`` did not reach it within its run."""
    short_of: dict[object, float] = field(default_factory=dict)
    """A seed not reached -> ``strategy``'s own RL FLOPs over ``target``'s (the fraction is
    larger than this)."""

    @property
    def reached(self) -> list[float]:
        return [f for f in self.fractions.values() if f is not None]


def flops_to_reach(curve: dict[str, tuple[float, float]], reward: float) -> float | None:
    """The RL training FLOPs at which a held-out curve of (FLOPs, reward) points first reaches
    ``reward``: linear between the last point below and the first at or above it (0 when the
    SFT start already does); None when no point does."""
    points = sorted(curve.values())
    for i, (flops, value) in enumerate(points):
        if value >= reward:
            if i == 0:
                return flops
            low_flops, low_value = points[i - 1]
            return low_flops + (reward - low_value) / (value - low_value) * (flops - low_flops)
    return None


def catch_up(groups: dict[str, list[RunResult]], reference: str) -> list[CatchUp]:
    """For every strategy paired with ``reference`` (a strategy name), both ways: the FLOPs at
    which it reaches ``reference``'s final held-out reward of the same training seed, over the
    FLOPs ``reference`` spent (and ``reference`` reaching its). Only runs with a held-out curve
    along training (``eval.every``) and a final point count; a seed with several runs of a
    strategy counts as not reached unless every pair reaches."""
    if reference not in groups:
        return []

    def by_seed(strategy: str) -> dict[object, list[RunResult]]:
        seeds: dict[object, list[RunResult]] = {}
        for result in groups[strategy]:
            if "after" in result.heldout_curve and len(result.heldout_curve) > 2:
                seeds.setdefault(seed_cluster(result), []).append(result)
        return seeds

    out = []
    for other in (name for name in groups if name != reference):
        for strategy, target in ((other, reference), (reference, other)):
            runs, targets = by_seed(strategy), by_seed(target)
            row = CatchUp(strategy, target, {})
            for seed in sorted(runs.keys() & targets.keys(), key=str):
                row.fractions[seed] = None
                pairs = [(run, goal) for run in runs[seed] for goal in targets[seed]]
                fractions = []
                for run, goal in pairs:
                    goal_flops, goal_reward = goal.heldout_curve["after"]
                    reach = flops_to_reach(run.heldout_curve, goal_reward)
                    if reach is None:
                        row.short_of[seed] = run.heldout_curve["after"][0] / goal_flops
                    else:
                        fractions.append(reach / goal_flops)
                if len(fractions) == len(pairs):
                    row.fractions[seed] = sum(fractions) / len(fractions)
            if row.fractions:
                out.append(row)
    return out
