"""The market's health: whether the bid channel carries out the choice it was taught.

Measured on every batch of episodes (each RL update's, each held-out evaluation's) and printed
at the end of every run (``metric_names.MARKET_HEALTH``): how often the actor is the agent the
task's scripted expert would let act, on and off the states the experts' own play reaches;
how much of each bidder's probability lies on the bid levels at all (:func:`valid_level_mass`);
how often bids parse, tie at the top, or skip the step; and how spread the wins are.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter

from bidswarm import metric_names as names
from bidswarm.envs.base import role_name
from bidswarm.rollout.records import Episode, StepRecord

DOMINANT_SHARE = 0.9
"""One agent winning more than this share of the contested steps is a collapsed market: the
run's end warns (:func:`market_warnings`)."""


def market_metrics(episodes: list[Episode], roles: list[str | None]) -> dict[str, float]:
    """Every health metric of ``episodes`` that applies (``roles[i]``: agent ``i``'s role):
    expert-owner agreement (all steps, on and off the experts' path) where the experts' view
    was recorded, bid parse rate per role and top ties where bids were sampled, skips and the
    spread of wins always."""
    steps = [s for e in episodes for s in e.steps]
    metrics = _agreement(episodes, roles)
    parsed: dict[str, list[bool]] = {}
    for step in steps:
        for agent, bid in step.bids.items():
            parsed.setdefault(role_name(roles[agent]), []).append(bid.parsed)
    for role, flags in sorted(parsed.items()):
        metrics[f"{names.BID_PARSE_RATE}/{role}"] = sum(flags) / len(flags)
    auctions = [s for s in steps if s.bids]
    if auctions:
        metrics[names.TOP_TIE_FRAC] = sum(_top_tied(s) for s in auctions) / len(auctions)
    if steps:
        metrics[names.SKIP_FRAC] = sum(s.actor is None for s in steps) / len(steps)
        metrics[names.SKIP_RUN_MAX] = float(max(_longest_skip_run(e) for e in episodes))
    acting = Counter(role_name(roles[s.actor]) for s in steps if s.actor is not None)
    if acting:
        metrics[names.WINNER_ENTROPY_BITS] = _entropy_bits(list(acting.values()))
    contested = Counter(s.actor for s in steps if s.contested)
    if contested:
        metrics[names.TOP_CONTESTED_WIN_SHARE] = max(contested.values()) / contested.total()
    return metrics


def _agreement(episodes: list[Episode], roles: list[str | None]) -> dict[str, float]:
    """``auction/expert_owner_agreement`` over the steps with the experts' view, and its
    ``/on_path`` and ``/off_path`` parts (each only where it has steps); per role that owns
    steps, ``auction/expert_owner_recall/<role>``; per role that acts,
    ``auction/expert_owner_precision/<role>``; per role whose bids both own and do not own
    steps, ``bids/owner_auc/<role>``."""
    groups: dict[str, list[bool]] = {"": [], "/on_path": [], "/off_path": []}
    recall: dict[str, list[bool]] = {}
    precision: dict[str, list[bool]] = {}
    bids: dict[str, list[tuple[float, bool]]] = {}
    for episode in episodes:
        for step, on_path in zip(episode.steps, episode.on_expert_path, strict=True):
            if not step.expert_levels:
                continue
            agrees = _agrees(step, roles)
            groups[""].append(agrees)
            groups["/on_path" if on_path else "/off_path"].append(agrees)
            owners = step.expert_owners
            for owner in owners:
                acted = step.actor is not None and roles[step.actor] == owner
                recall.setdefault(owner, []).append(acted)
            if step.actor is not None:
                actor = role_name(roles[step.actor])
                precision.setdefault(actor, []).append(roles[step.actor] in owners)
            for agent, bid in step.bids.items():
                role = role_name(roles[agent])
                bids.setdefault(role, []).append((bid.level, roles[agent] in owners))
    metrics = {
        f"{names.EXPERT_OWNER_AGREEMENT}{part}": sum(flags) / len(flags)
        for part, flags in groups.items()
        if flags
    }
    for role, flags in sorted(recall.items()):
        metrics[f"{names.EXPERT_OWNER_RECALL}/{role}"] = sum(flags) / len(flags)
    for role, flags in sorted(precision.items()):
        metrics[f"{names.EXPERT_OWNER_PRECISION}/{role}"] = sum(flags) / len(flags)
    for role, scored in sorted(bids.items()):
        auc = owner_auc(scored)
        if auc is not None:
            metrics[f"{names.OWNER_AUC}/{role}"] = auc
    return metrics


def owner_auc(scored: list[tuple[float, bool]]) -> float | None:
    """The probability that a bid where the bidder owns the step (by the expert) is above one
    where it does not, ties counting half (the area under the ROC curve, Mann-Whitney); None
    when either kind is missing. 0.5: the bids do not see which steps are the bidder's."""
    owned = [level for level, owns in scored if owns]
    other = sorted(level for level, owns in scored if not owns)
    if not owned or not other:
        return None
    wins = 0.0
    for level in owned:
        below = bisect.bisect_left(other, level)
        tied = bisect.bisect_right(other, level) - below
        wins += below + tied / 2
    return wins / (len(owned) * len(other))


def _agrees(step: StepRecord, roles: list[str | None]) -> bool:
    """Whether the step's actor is one the expert would let act (both skipping agrees)."""
    owners = step.expert_owners
    if step.actor is None:
        return not owners
    return roles[step.actor] in owners


def _top_tied(step: StepRecord) -> bool:
    levels = [bid.level for bid in step.bids.values()]
    top = max(levels)
    return top > 0.0 and levels.count(top) >= 2


def _longest_skip_run(episode: Episode) -> int:
    longest = run = 0
    for step in episode.steps:
        run = run + 1 if step.actor is None else 0
        longest = max(longest, run)
    return longest


def _entropy_bits(counts: list[int]) -> float:
    total = sum(counts)
    return -sum(c / total * math.log2(c / total) for c in counts if c) + 0.0


def market_warnings(metrics: dict[str, float]) -> list[str]:
    """What a run's end should warn of in its market (``metrics``: an evaluation's)."""
    share = metrics.get(names.TOP_CONTESTED_WIN_SHARE)
    if share is not None and share > DOMINANT_SHARE:
        return [
            f"one agent wins {share:.0%} of the contested steps (> {DOMINANT_SHARE:.0%}): "
            "the market has collapsed onto it"
        ]
    return []


def probe_prompts(episodes: list[Episode], agent: int, limit: int) -> list[list[int]]:
    """Up to ``limit`` of ``agent``'s bid prompts in ``episodes``, evenly spaced over them."""
    prompts = [s.bids[agent].reply.prompt_ids for e in episodes for s in e.steps if agent in s.bids]
    prompts = [p for p in prompts if p]  # prompts sent between processes lose their ids
    if len(prompts) <= limit:
        return prompts
    return [prompts[i * len(prompts) // limit] for i in range(limit)]


def valid_level_mass(swarm, episodes: list[Episode], limit: int) -> dict[str, float]:
    """``bids/valid_level_mass/<role>``: per role, the mean over (up to ``limit`` of) its
    agents' bid prompts in ``episodes`` of the probability, at temperature 1 and with no
    constraint, that the bid policy replies exactly one of the bid levels (its canonical text,
    ``format_bid``, then end of sequence). A diagnostic: its forwards are not counted in the
    run's tokens or FLOPs."""
    masses: dict[str, list[float]] = {}
    for agent in range(swarm.n_agents):
        prompts = probe_prompts(episodes, agent, limit)
        if prompts:
            role = role_name(swarm.role(agent))
            masses.setdefault(role, []).extend(swarm.level_mass(agent, prompts))
    return {
        f"{names.VALID_LEVEL_MASS}/{role}": sum(values) / len(values)
        for role, values in sorted(masses.items())
    }
