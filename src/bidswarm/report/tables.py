"""The report's markdown: the strategy table and its verdict, the paired differences, and
the budget, RL gain (reward and task success), participation, winning-bid and outcome tables
(each empty when no run logged what it shows)."""

from __future__ import annotations

from collections.abc import Sequence
from statistics import median

from bidswarm import statistics
from bidswarm.report.reading import BUDGET_COLUMNS, RunResult, pass_ks
from bidswarm.report.strategies import (
    ONE_SEED,
    WINNING_BID_PHASES,
    DifferenceRow,
    StrategyRow,
    bid_levels_of,
    catch_up,
    cell_summary,
    paired_with,
    pass_cells,
    settings_of,
    strategy_cells,
    winning_bid_shares,
)


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
        "cells, each the mean of that world's runs, by a two-way random-effects analysis of "
        "training seeds x worlds (variance components from the mean squares, Satterthwaite's "
        "t; runs that logged no per-world rewards: t interval over the runs' means, one "
        "training seed each).",
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


def verdict(rows: list[StrategyRow]) -> str:
    """One sentence: who has the highest mean, by how much over the second, and whether that
    is told apart: by their paired difference on the (training seed, world) cells both hold
    (two-way random-effects interval) when they share cells, else by whether their 95% intervals
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


def difference_table(
    differences: list[DifferenceRow], reference: str, pair_by: Sequence[str] = ()
) -> str:
    """Markdown: strategy - the strategy it is paired with, its 95% CI, how many cells were
    paired, the verdict; a column names the partner when ``reference`` is a setting (paired by
    ``pair_by``'s keys: :func:`paired_with`)."""
    matched = any(row.reference != reference for row in differences)
    if not matched:
        against = f"**{reference}**"
    elif pair_by:
        keys = ", ".join(f"**{key}**" for key in pair_by)
        against = f"the strategy with **{reference}** and the same {keys}"
    else:
        against = f"the strategy that differs only in **{reference}**"
    lines = [
        f"Paired difference to {against} on the same (training seed, world) cells; 95% CI by "
        "the two-way random-effects analysis of training seeds x worlds.",
        "",
        f"| strategy |{' paired with |' if matched else ''} − {reference} | 95% CI "
        "| paired cells | verdict |",
        "|---|" + ("---|" if matched else "") + "---|---|---|---|",
    ]
    for row in differences:
        partner = f" {row.reference} |" if matched else ""
        d = row.difference
        if d is None:
            lines.append(
                f"| {row.strategy} |{partner} n/a | n/a | 0 | not paired: no shared cell |"
            )
        else:
            lines.append(
                f"| {row.strategy} |{partner} {d.mean:+.2f} | {d.ci_low:+.2f} .. "
                f"{d.ci_high:+.2f} | {d.n} | {d.verdict} |"
            )
    return "\n".join(lines)


def budget_table(groups: dict[str, list[RunResult]]) -> str:
    """Markdown: per strategy, what its training spent (:data:`BUDGET_COLUMNS`), the mean over
    its scored runs that logged it, the runs its reward rows count (a run that did not finish
    has no held-out result and would understate the budget); empty when none logged one."""
    headers = " | ".join(header for _, header in BUDGET_COLUMNS)
    lines = [
        "What each strategy's training spent (mean over its runs; an evaluation run counts "
        "its source run's): SFT tokens (prompt + reply) of action, of bid and of a learned "
        "decision's demonstrations and SFT FLOPs, the RL updates of each kind, and RL's "
        "training FLOPs (rollouts, forks and trained tokens; SFT's apart). By default every "
        "arm makes the same passes over each action demonstration and the same number of "
        "action updates (docs/coordination.md).",
        "",
        f"| strategy | {headers} | runs |",
        "|---|" + "---|" * (len(BUDGET_COLUMNS) + 1),
    ]
    found = False
    for strategy, results in groups.items():
        budgets = [r.budget for r in results if r.budget and r.heldout_mean is not None]
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
        "with its 95% CI by the two-way random-effects analysis of training seeds x worlds, "
        "and the smallest difference these cells would detect with 80% power (1.43x the "
        "interval's half-width).",
        "",
        "| strategy | after SFT (95% CI) | after RL (95% CI) | RL − SFT | 95% CI | detectable "
        "| verdict |",
        "|---|---|---|---|---|---|---|",
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
            f"| {d.ci_low:+.2f} .. {d.ci_high:+.2f} | {d.detectable:.2f} | {d.verdict} |"
        )
    if one_seed:
        lines += ["", f"¹ {ONE_SEED}."]
    return "\n".join(lines) if found else ""


def run_table(groups: dict[str, list[RunResult]]) -> str:
    """Markdown: one row per training run evaluated on the held-out worlds before and after RL
    (by strategy, then training seed): both rewards, RL − SFT with its 95% t interval over the
    worlds, task success, participation per role, and its bid updates' forks (the share of the
    forks played that tied, :func:`forks_tied`, the effective pairs per bid update (mean and
    median) and the untied share of the paper's pairs against the control branches', each
    over the bid updates that logged it, :func:`curve_mean`); empty when no run measured both."""
    measured = [
        (strategy, r)
        for strategy, results in groups.items()
        for r in results
        if r.world_rewards and r.before_world_rewards and "before" in r.heldout_curve
    ]
    if not measured:
        return ""
    role_sets = {tuple(sorted(r.participation.get("after", {}))) for _, r in measured}
    shared_roles = role_sets.pop() if len(role_sets) == 1 else None
    participation = "participation %" + (f" {'/'.join(shared_roles)}" if shared_roles else "")
    lines = [
        "Per training run: held-out reward after SFT and after RL on the same worlds, RL − SFT "
        "with its 95% t interval over those worlds (one run: training-seed variation is not in "
        "it), task success, participation (share of acting steps per role), and the forks of "
        "its bid updates: the share of the forks played that tied, the effective number of "
        "weighted pairs (mean, and median in brackets), and the untied share of the paper's "
        "pairs against that of the control branches (the recorded winner acting again: how "
        "often noise alone decides a pair), each over the run's bid updates (– : none "
        "measured).",
        "",
        f"| strategy | seed | after SFT | after RL | RL − SFT | 95% CI (over worlds) | task "
        f"success | {participation} | forks tied | effective pairs / bid update "
        "| untied paper / control |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    order = {name: i for i, name in enumerate(groups)}
    measured.sort(key=lambda item: (order[item[0]], str(item[1].training_seed)))
    for strategy, r in measured:
        d = statistics.paired_difference(r.world_rewards, r.before_world_rewards)
        success = [r.success.get(when, {}).get("task/success") for when in ("before", "after")]
        shown_success = (
            f"{100 * success[0]:.0f}% → {100 * success[1]:.0f}%" if None not in success else ""
        )
        tied, pairs = forks_tied(r), curve_mean(r, "forks/effective_pairs")
        median_pairs = curve_median(r, "forks/effective_pairs")
        untied = [curve_mean(r, f"forks/{k}") for k in ("untied", "control_untied")]
        shown_untied = "–" if None in untied else f"{100 * untied[0]:.0f}% / {100 * untied[1]:.0f}%"
        seed = "–" if r.training_seed is None else str(r.training_seed)
        lines.append(
            f"| {strategy} | {seed} | {r.heldout_curve['before'][1]:.1f} | {r.heldout_mean:.1f} "
            f"| {d.mean:+.1f} | {d.ci_low:+.1f} .. {d.ci_high:+.1f} | {shown_success} "
            f"| {run_participation(r, shared_roles)} "
            f"| {'–' if tied is None else f'{100 * tied:.0f}%'} "
            f"| {'–' if pairs is None else f'{pairs:.1f} ({median_pairs:.1f})'} | {shown_untied} |"
        )
    return "\n".join(lines)


def run_participation(result: RunResult, roles: tuple[str, ...] | None) -> str:
    """``5/9/86 → 21/13/66``: each role's held-out share of acting steps (%) after SFT → after
    RL, in the order of ``roles``; without shared roles each share is named (``logger 5``)."""
    names = roles or tuple(sorted(result.participation.get("after", {})))
    parts = []
    for when in ("before", "after"):
        shares = result.participation.get(when, {})
        values = [f"{100 * shares.get(role, 0.0):.0f}" for role in names]
        if roles is None:
            values = [f"{role} {value}" for role, value in zip(names, values, strict=True)]
        parts.append(("/" if roles else ", ").join(values))
    return " → ".join(parts)


def forks_tied(result: RunResult) -> float | None:
    """Mean over the run's bid updates that played forks of the share of them that tied
    (``forks/tied`` / ``forks/resampled_below``); None without such an update."""
    played = result.curves.get("forks/resampled_below", [])
    tied = result.curves.get("forks/tied", [])
    shares = [t / p for t, p in zip(tied, played, strict=True) if p > 0]
    return sum(shares) / len(shares) if shares else None


def curve_mean(result: RunResult, key: str) -> float | None:
    """Mean over the run's bid updates that logged ``key`` (``forks/effective_pairs``: Kish's
    effective number of weighted pairs; ``forks/untied``); None where none did."""
    values = result.curves.get(key, [])
    return sum(values) / len(values) if values else None


def curve_median(result: RunResult, key: str) -> float | None:
    """Median over the run's bid updates that logged ``key``; None where none did."""
    values = result.curves.get(key, [])
    return median(values) if values else None


def success_gain_table(groups: dict[str, list[RunResult]]) -> str:
    """Markdown: per training strategy, held-out task success and pass@1..k after SFT -> after
    RL (means over its runs) and the highest pass@k's gain with its 95% CI: paired on the
    (training seed, world) cells (two-way random-effects interval) when every run logged
    per-world pass@k, else a t interval over the runs' own after - before differences (one
    training seed each); empty when no run measured both."""
    rows = {
        s: [r for r in rs if {"before", "after"} <= r.success.keys()] for s, rs in groups.items()
    }
    rows = {s: results for s, results in rows.items() if results}
    if not rows:
        return ""
    ks = pass_ks([r.success["after"] for results in rows.values() for r in results])
    columns = ["task/success"] + [f"pass_at_{k}/mean" for k in ks]
    names = ["success"] + [f"pass@{k}" for k in ks]
    top = f"pass@{ks[-1]}" if ks else "success"
    lines = [
        "Task success and pass@k on the held-out worlds after SFT → after RL (mean over runs; "
        f"pass@k by the unbiased estimator per world), and what RL adds to {top} with its 95% "
        "CI: paired on (training seed, world) cells by the two-way random-effects analysis, or "
        "² a t "
        "interval over the runs' own differences where runs logged no per-world pass@k.",
        "",
        f"| strategy | {' | '.join(names)} | {top} RL − SFT | 95% CI | runs |",
        "|" + "---|" * (len(names) + 4),
    ]
    footnotes = set()
    for strategy, results in rows.items():
        cells = []
        for column in columns:
            shares = {
                when: [r.success[when].get(column) for r in results] for when in ("before", "after")
            }
            if any(v is None for values in shares.values() for v in values):
                cells.append("")
                continue
            before, after = (sum(v) / len(v) for v in shares.values())
            cells.append(f"{100 * before:.0f}% → {100 * after:.0f}%")
        gain, interval, mark = success_gain(results, ks[-1] if ks else None)
        footnotes.add(mark)
        shown = "" if gain is None else f"{100 * gain:+.1f}"
        lines.append(
            f"| {strategy} | {' | '.join(cells)} | {shown} | {interval}{mark} | {len(results)} |"
        )
    if "¹" in footnotes:
        lines += ["", f"¹ {ONE_SEED}."]
    if "²" in footnotes:
        lines += ["", "² t interval over runs (training seeds): no per-world pass@k logged."]
    return "\n".join(lines)


def success_gain(results: list[RunResult], k: int | None) -> tuple[float | None, str, str]:
    """pass@k (task success when ``k`` is None) after RL minus after SFT over ``results``:
    (mean, ``low .. high`` in points, footnote mark of :func:`success_gain_table`)."""
    if k is not None and all(
        k in r.world_success.get("before", {}) and k in r.world_success.get("after", {})
        for r in results
    ):
        after = strategy_cells(results, lambda r: r.world_success["after"][k])
        before = strategy_cells(results, lambda r: r.world_success["before"][k])
        d = statistics.paired_difference(after, before, "after RL", "after SFT")
        mark = "¹" if len({seed for seed, _ in after}) < 2 else ""
        return d.mean, f"{100 * d.ci_low:+.1f} .. {100 * d.ci_high:+.1f}", mark
    column = "task/success" if k is None else f"pass_at_{k}/mean"
    differences = [
        r.success["after"][column] - r.success["before"][column]
        for r in results
        if column in r.success["after"] and column in r.success["before"]
    ]
    if not differences:
        return None, "", ""
    if len(differences) < 2:
        return differences[0], "", "²"
    summary = statistics.summarize(differences)
    return summary.mean, f"{100 * summary.ci_low:+.1f} .. {100 * summary.ci_high:+.1f}", "²"


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


def milestone_table(groups: dict[str, list[RunResult]]) -> str:
    """Markdown: per strategy, the share of held-out episodes that reached each milestone of
    the task, after SFT -> after RL, mean over the runs that logged it, the milestones in the
    order the most episodes reach them after RL (for a recipe chain: where the swarm stalls);
    empty when no run logged milestones."""
    rows = []
    for strategy, results in groups.items():
        measured = [r for r in results if r.milestones.get("after")]
        if not measured:
            continue
        after = {
            m: mean_share(measured, "after", m) for r in measured for m in r.milestones["after"]
        }
        parts = []
        for milestone in sorted(after, key=lambda m: (-after[m], m)):
            before = mean_share(measured, "before", milestone)
            shown = f"{100 * before:.0f}% → " if before is not None else ""
            parts.append(f"{milestone} {shown}{100 * after[milestone]:.0f}%")
        rows.append(f"| {strategy} | {'; '.join(parts)} | {len(measured)} |")
    if not rows:
        return ""
    header = [
        "Milestones on the held-out worlds (share of episodes that reached each), after SFT → "
        "after RL, mean over runs, in the order most episodes reach them.",
        "",
        "| strategy | milestones | runs |",
        "|---|---|---|",
    ]
    return "\n".join(header + rows)


def mean_share(results: list[RunResult], when: str, milestone: str) -> float | None:
    """Mean over ``results`` of the share of episodes that reached ``milestone`` in the
    held-out evaluation ``when`` (``before`` / ``after`` RL); None if no run logged it."""
    shares = [
        r.milestones[when][milestone] for r in results if milestone in r.milestones.get(when, {})
    ]
    return sum(shares) / len(shares) if shares else None


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
            measured = sum(1 for p in after if any(k.split("/")[0] == label for k in p))
            lines.append(f"| {strategy} | {label} | {'; '.join(parts)} | {measured} |")
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


def outcome_table(
    groups: dict[str, list[RunResult]], reference: str | None = None, pair_by: Sequence[str] = ()
) -> str:
    """Per strategy of evaluation runs: agents, task success and pass@1..k (each the mean over
    the held-out worlds of a run, here mean ± SE over the strategy's runs, i.e. training seeds),
    the highest pass@k's 95% CI over (training seed, world) cells (two-way random effects;
    empty when a run logged no per-world pass@k), with a ``reference`` its paired difference
    to the pass@k of the strategy it is paired with (:func:`paired_with`), and the cost per
    decision; empty when no run logged them."""
    rows = {s: [r for r in rs if r.outcomes] for s, rs in groups.items()}
    rows = {s: results for s, results in rows.items() if results}
    if not rows:
        return ""
    ks = pass_ks([r.outcomes for results in rows.values() for r in results])
    columns = ["task/success"] + [f"pass_at_{k}/mean" for k in ks]
    header = ["strategy", "agents", "success", *(f"pass@{k}" for k in ks)]
    header += [f"pass@{ks[-1]} 95% CI"] if ks else []
    partners = paired_with(list(rows), reference, pair_by) if ks and reference is not None else {}
    partners = {s: partner for s, partner in partners.items() if partner in rows}
    if partners:  # a reference (or a strategy with the reference setting) against itself
        partners |= {s: s for s in rows if s == reference or reference in settings_of(s)}
    paired = bool(partners)
    header += [f"pass@{ks[-1]} − {reference} (95% CI)"] if paired else []
    header += ["FLOPs/decision", "tokens/decision", "s/decision", "runs"]
    lines = [
        "Task success and pass@k per strategy (unbiased estimator per held-out world from its "
        "runs, mean over worlds per training run; here mean ± SE over the training runs), the "
        "highest pass@k's 95% CI by the two-way random-effects analysis of training seeds x "
        "worlds (kept within 0% .. 100%; cells all 0% give 0% .. 0%), and the evaluation's "
        "cost per decision (bids and actions of every agent): FLOPs, generated and prompt "
        "tokens, and wall-clock seconds (mean over the runs that logged it; it depends on the "
        "machine's load).",
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
            partner = partners.get(strategy)
            cells.append(pass_difference(results, rows[partner], ks[-1]) if partner else "")
        for cost in ("flops_per_decision", "tokens_per_decision", "seconds_per_decision"):
            values = [o[cost] for o in outcomes if cost in o]
            cells.append(f"{sum(values) / len(values):.3g}" if values else "")
        cells.append(str(len(outcomes)))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def pass_interval(results: list[RunResult], k: int) -> str:
    """``low% .. high%``: the 95% two-way random-effects interval of pass@k over the runs'
    (training seed, world) cells; empty when a run logged no per-world pass@k."""
    cells = pass_cells(results, k)
    if cells is None:
        return ""
    summary = statistics.clustered_summary(cells)
    low, high = max(summary.ci_low, 0.0), min(summary.ci_high, 1.0)  # a share's own range
    return f"{100 * low:.1f}% .. {100 * high:.1f}%"


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


def catch_up_table(groups: dict[str, list[RunResult]], reference: str) -> str:
    """Markdown: sample efficiency on the held-out worlds (:func:`catch_up`): per pair of
    strategies, the RL training FLOPs at which one first reaches the other's final held-out
    reward of the same seed, as a fraction of the other's FLOPs, mean and 95% t interval over
    the seeds that reach it, and each seed's value; empty without held-out curves."""
    rows = catch_up(groups, reference)
    if not rows:
        return ""
    lines = [
        "Sample efficiency on the held-out worlds: the RL training FLOPs at which a strategy "
        "first reaches another's final held-out reward (same training seed; linear between "
        "its held-out evaluations along training, `eval.every`, SFT's start at 0) over the RL "
        "FLOPs the other spent; below 1: it gets there with less. Mean and 95% t interval "
        "over the seeds that reach it; a seed that does not is shown as > its own FLOPs over "
        "the other's. Each held-out point is a noisy mean (its SE: `eval_during/reward/se`), "
        "so a first crossing is early-biased: read the interval, not the point.",
        "",
        "| strategy | reaches the final reward of | FLOPs fraction (95% CI) | seeds reaching "
        "| per seed |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        reached = row.reached
        if reached:
            s = statistics.summarize(reached)
            interval = f"{s.mean:.2f} ({s.ci_low:.2f} .. {s.ci_high:.2f})"
        else:
            interval = "n/a"
        per_seed = ", ".join(
            f"{seed}: {value:.2f}" if value is not None else f"{seed}: > {row.short_of[seed]:.2f}"
            for seed, value in row.fractions.items()
        )
        lines.append(
            f"| {row.strategy} | {row.target} | {interval} | {len(reached)} of "
            f"{len(row.fractions)} | {per_seed} |"
        )
    return "\n".join(lines)


def mean_of(values: list[dict[str, float]], key: str) -> float:
    """Mean of ``key`` over the dicts in ``values`` that hold it (one at least)."""
    found = [v[key] for v in values if key in v]
    return sum(found) / len(found)


def evaluation_behaviour_table(groups: dict[str, list[RunResult]]) -> str:
    """Markdown: what each evaluated strategy did on the held-out worlds (evaluation runs):
    participation per role, the share of episodes that reached each milestone, and, for a rule
    that scores proposals, the mean peer score each role's proposals received and the margin
    between the best and the second; empty when no evaluation run logged participation."""
    rows = []
    for strategy, results in groups.items():
        measured = [r for r in results if r.participation.get("eval")]
        if not measured:
            continue
        shares = [r.participation["eval"] for r in measured]
        roles = sorted({role for share in shares for role in share})
        acting = "; ".join(f"{role} {100 * mean_of(shares, role):.0f}%" for role in roles)
        reached = [r.milestones["eval"] for r in measured if r.milestones.get("eval")]
        names = {m for found in reached for m in found}
        order = sorted(names, key=lambda m: (-mean_of(reached, m), m))
        milestones = "; ".join(f"{m} {100 * mean_of(reached, m):.0f}%" for m in order) or "–"
        scored = [r.peer_scores for r in measured if r.peer_scores]
        received = sorted({k for found in scored for k in found if k.startswith("received/")})
        peers = "; ".join(
            f"{key.removeprefix('received/')} {mean_of(scored, key):.2f}" for key in received
        )
        if any("margin" in found for found in scored):
            peers += f"; margin {mean_of(scored, 'margin'):.2f}"
        rows.append(f"| {strategy} | {acting} | {milestones} | {peers or '–'} | {len(measured)} |")
    if not rows:
        return ""
    header = [
        "What each strategy did on the held-out worlds (evaluation runs, mean over runs): the "
        "share of acting steps per role, the share of episodes that reached each milestone (in "
        "the order most reach them), and for a rule that scores proposals the mean peer score "
        "each role's proposals received (mean token log-prob under the other agents, nats per "
        "token) with the mean margin between the best and the second-best proposal of a step.",
        "",
        "| strategy | participation | milestones | peer scores received | runs |",
        "|---|---|---|---|---|",
    ]
    return "\n".join(header + rows)
