"""The report's market sections: each run's market health; each run's decision after SFT
beside what it cost (the bids, or a rule's learned decision, docs/coordination.md "Decisions
learned from demonstrations"); and per strategy the gap between the ``expert_owner`` reference
(the task's expert picks who acts, the same trained agents act) and the run's own rule, paired
over (training seed, world) cells."""

from __future__ import annotations

from bidswarm import metric_names as names
from bidswarm import statistics
from bidswarm.report.reading import RELABEL_FLOPS, RunResult
from bidswarm.report.strategies import strategy_cells


def _share(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.0f}%"


def _per_role(market: dict[str, float], name: str) -> str:
    roles = {k.rsplit("/", 1)[1]: v for k, v in market.items() if k.startswith(f"{name}/")}
    return " ".join(f"{v:.2f}" for _, v in sorted(roles.items())) if roles else "–"


def market_run_table(groups: dict[str, list[RunResult]]) -> str:
    """Markdown: one row per training run with the held-out market health after SFT and after
    RL (``rollout/market.py``); empty when no run logged it."""
    rows = [(s, r) for s, results in groups.items() for r in results if r.market.get("after")]
    if not rows:
        return ""
    agree = names.EXPERT_OWNER_AGREEMENT
    lines = [
        "The market per training run (held-out): how often the actor is the agent the task's "
        "expert would let act, after SFT → after RL, and after RL on / off the experts' path; "
        "the bid policies' probability of replying a bid level at all and the share of bids "
        "that parsed, per role in alphabetical order; top ties; skipped steps; the entropy of "
        "who acts; the held-out reward of the same agents under `expert_owner` minus the "
        "run's own rule after RL (95% CI over worlds); and the who-should-act regret after RL "
        "(95% CI over worlds) with the best agent's return at the same states.",
        "",
        "| strategy | seed | actor = expert's choice | on / off path | valid bid mass | parsed "
        "| top ties | skipped | who acts (bits) | expert_owner − own (95% CI) "
        "| regret (95% CI) of the best's |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for strategy, r in rows:
        before, after = r.market.get("before", {}), r.market["after"]
        on, off = after.get(f"{agree}/on_path"), after.get(f"{agree}/off_path")
        gap = after.get("gap_to_expert_owner/mean")
        shown_gap = (
            "–"
            if gap is None
            else f"{gap:+.1f} ({after['gap_to_expert_owner/ci_low']:+.1f} .. "
            f"{after['gap_to_expert_owner/ci_high']:+.1f})"
        )
        entropy = after.get(names.WINNER_ENTROPY_BITS)
        regret = after.get(f"{names.REGRET}/mean")
        shown_regret = (
            "–"
            if regret is None
            else f"{regret:.1f} ({after[f'{names.REGRET}/ci_low']:.1f} .. "
            f"{after[f'{names.REGRET}/ci_high']:.1f}) of "
            f"{after.get(f'{names.REGRET}/oracle', float('nan')):.1f}"
        )
        lines.append(
            f"| {strategy} | {'–' if r.training_seed is None else r.training_seed} "
            f"| {_share(before.get(agree))} → {_share(after.get(agree))} "
            f"| {_share(on)} / {_share(off)} | {_per_role(after, names.VALID_LEVEL_MASS)} "
            f"| {_per_role(after, names.BID_PARSE_RATE)} | {_share(after.get(names.TOP_TIE_FRAC))} "
            f"| {_share(after.get(names.SKIP_FRAC))} "
            f"| {'–' if entropy is None else f'{entropy:.2f}'} | {shown_gap} | {shown_regret} |"
        )
    return "\n".join(lines)


def decision_table(groups: dict[str, list[RunResult]]) -> str:
    """Markdown: one row per training run with who acts after SFT (held-out) beside what the
    decision costs: its agreement with the expert's owner (on / off the experts' path), each
    role's share of the steps the expert gives it, the rollout FLOPs per decision step, and
    the cold start's training FLOPs of the bids and of a learned decision (each its tokens'
    share of ``sft/flops``, plus its labelling rounds); empty when no run logged it."""
    rows = [(s, r) for s, results in groups.items() for r in results if r.market.get("before")]
    if not rows:
        return ""
    agree = names.EXPERT_OWNER_AGREEMENT
    lines = [
        "Who acts after SFT, per training run (held-out, before RL): the actor = the expert's "
        "choice overall and on / off the experts' path; per role (alphabetical) the share of "
        "the steps the expert gives it where it acted; the rollout FLOPs per decision step of "
        "that evaluation (bids, proposals, scores, routes and the action); and the cold "
        "start's training FLOPs of the bids and of the rule's learned decision (each its "
        "tokens' share of the SFT FLOPs, plus its labelling rounds; a rule that learns a "
        "decision still learns the bids, unused, so that its actions learn the auction's "
        "stream), and all SFT FLOPs.",
        "",
        "| strategy | seed | actor = expert's choice | on / off path | owner's share acted "
        "| FLOPs / decision | bid SFT FLOPs | learned decision SFT FLOPs | SFT FLOPs |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for strategy, r in rows:
        before = r.market["before"]
        cost = before.get("flops_per_decision")
        bids, decision = channel_flops(r.budget)
        lines.append(
            f"| {strategy} | {'–' if r.training_seed is None else r.training_seed} "
            f"| {_share(before.get(agree))} | {_share(before.get(f'{agree}/on_path'))} / "
            f"{_share(before.get(f'{agree}/off_path'))} "
            f"| {_per_role(before, names.EXPERT_OWNER_RECALL)} "
            f"| {_flops(cost)} | {_flops(bids)} | {_flops(decision)} "
            f"| {_flops(r.budget.get(names.SFT_FLOPS))} |"
        )
    return "\n".join(lines)


def _flops(value: float | None) -> str:
    return "–" if value is None else f"{value:.3g}"


def channel_flops(budget: dict[str, float]) -> tuple[float | None, float | None]:
    """The cold start's FLOPs of the bids and of a learned decision: the share of
    ``sft/flops`` (without the labelling rounds, which it includes) of their tokens among the
    action, bid and decision tokens, plus their own rounds (``sft/relabel/flops``,
    ``sft/decision_relabel/flops``); None where the run logged none of them."""
    kinds = (names.SFT_ACTION_TOKENS, names.SFT_BID_TOKENS, names.SFT_DECISION_TOKENS)
    tokens = sum(budget.get(kind, 0.0) for kind in kinds)
    if names.SFT_FLOPS not in budget or tokens <= 0:
        return None, None
    bid_rounds, decision_rounds = (budget.get(key, 0.0) for key in RELABEL_FLOPS)
    per_token = (budget[names.SFT_FLOPS] - bid_rounds - decision_rounds) / tokens
    bids = per_token * budget.get(names.SFT_BID_TOKENS, 0.0) + bid_rounds
    if names.SFT_DECISION_TOKENS not in budget:
        return bids, None
    return bids, per_token * budget[names.SFT_DECISION_TOKENS] + decision_rounds


def owner_gap_table(groups: dict[str, list[RunResult]], rule: str = "expert_owner") -> str:
    """Markdown: per strategy, after SFT and after RL, the held-out reward of its runs' agents
    under ``rule`` minus under their own rule, over the (training seed, world) cells both hold
    (two-way random-effects 95% CI); empty when no run logged ``rule``."""
    lines = [
        f"Who acts, priced: the same trained agents under `{rule}` (the task's expert picks who "
        "acts) minus under the strategy's own rule, paired over (training seed, world) cells "
        "(95% CI from the two-way random-effects model: it counts training seeds).",
        "",
        f"| strategy | when | seeds | own rule | `{rule}` | {rule} − own | 95% CI |",
        "|---|---|---|---|---|---|---|",
    ]
    found = False
    for strategy, results in groups.items():
        for when, own_worlds in (("before", "before_world_rewards"), ("after", "world_rewards")):
            key = f"{when}_{rule}"
            runs = [r for r in results if key in r.reference_world_rewards]
            if not runs:
                continue
            found = True
            own = strategy_cells(runs, lambda r, attr=own_worlds: getattr(r, attr))
            reference = strategy_cells(runs, lambda r, k=key: r.reference_world_rewards[k])
            d = statistics.paired_difference(reference, own)
            shared = own.keys() & reference.keys()
            own_mean = sum(own[c] for c in shared) / len(shared)
            reference_mean = sum(reference[c] for c in shared) / len(shared)
            lines.append(
                f"| {strategy} | {'after SFT' if when == 'before' else 'after RL'} | {len(runs)} "
                f"| {own_mean:.1f} | {reference_mean:.1f} | {d.mean:+.1f} "
                f"| {d.ci_low:+.1f} .. {d.ci_high:+.1f} |"
            )
    return "\n".join(lines) if found else ""
