"""Metrics of a batch of episodes (reward, task metrics, participation per role) and the
timing of named phases."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from bidswarm import metric_names as names
from bidswarm.envs.base import role_name
from bidswarm.rollout.market import market_metrics
from bidswarm.rollout.records import Episode
from bidswarm.statistics import summarize


def episode_metrics(
    episodes: list[Episode], roles: list[str | None], bid_levels: list[float]
) -> dict[str, float]:
    """Means over ``episodes`` of reward (with its SE) and every task metric, who acted how
    often, the share of acting steps that were contested (and forkable), and the winning bids
    per role at the steps whose bids decided them (:func:`winning_bid_metrics`, ``bid_levels``
    the swarm's); ``roles[i]`` is agent ``i``'s role. With bids sampled, the share that parsed
    (``bids/parse_rate``)."""
    reward = summarize([e.total_reward for e in episodes]) if episodes else None
    metrics = {
        "reward/mean": reward.mean if reward else 0.0,
        "reward/se": reward.se if reward else 0.0,
        "episodes": float(len(episodes)),
    }
    # The task's own "reward" is the episode's total reward, already ``reward/mean``.
    keys = sorted({k for e in episodes for k in e.metrics} - {"reward"})
    for key in keys:
        metrics[f"task/{key}"] = sum(e.metrics.get(key, 0.0) for e in episodes) / len(episodes)
    acting = Counter(
        role_name(roles[s.actor]) for e in episodes for s in e.steps if s.actor is not None
    )
    steps = sum(len(e.steps) for e in episodes)
    total_acting = sum(acting.values())
    for role in sorted({role_name(role) for role in roles}):
        metrics[f"participation/{role}"] = acting[role] / max(total_acting, 1)
    metrics["skipped_fraction"] = (steps - total_acting) / max(steps, 1)
    metrics |= participation_at_decisions(episodes, roles)
    contested = sum(s.contested for e in episodes for s in e.steps)
    metrics["contested_fraction"] = contested / max(total_acting, 1)
    metrics |= winning_bid_metrics(episodes, roles, bid_levels)
    metrics |= peer_score_metrics(episodes, roles)
    parsed = [bid.parsed for e in episodes for s in e.steps for bid in s.bids.values()]
    if parsed:  # rules that ask for bids
        metrics[names.BID_PARSE_RATE] = sum(parsed) / len(parsed)
    return metrics | market_metrics(episodes, roles)


def winning_bid_metrics(
    episodes: list[Episode], roles: list[str | None], bid_levels: list[float]
) -> dict[str, float]:
    """What bucket-brigade credit (Eq. 2 of MPT) sees: per role, over the acting steps its
    agents won whose bids decided them (:attr:`Decision.bids_read`), the share won at each bid
    level (``bids/winning/<role>/<level>``, level as ``0.8``; a level reader's expected bid,
    which lies between the levels, counts at its nearest level) and the mean winning bid
    (``bids/winning/<role>/mean``, exact). Every non-zero level is logged; level 0 where a zero bid
    won some step (under the auction none does: all-zero bids skip; a rule that lets a zero
    bidder act logs it). A role that won no such step gets none, a rule that never reads the
    bids none at all."""
    won: dict[str, list[float]] = {}
    for step in (s for e in episodes for s in e.steps if s.actor is not None):
        if step.decision.bids_read is not False:
            won.setdefault(role_name(roles[step.actor]), []).append(step.decision.winning_bid)
    metrics = {}
    for role, bids in sorted(won.items()):
        counts = Counter(min(bid_levels, key=lambda level: abs(level - bid)) for bid in bids)
        prefix = f"{names.WINNING_BIDS}/{role}"
        for level in (level for level in bid_levels if level > 0 or counts[level]):
            metrics[f"{prefix}/{level:g}"] = counts[level] / len(bids)
        metrics[f"{prefix}/mean"] = sum(bids) / len(bids)
    return metrics


PEER_SCORE_NEAR_TIE = 0.1
"""A gap in mean peer score (nats per token) below which two proposals count as near-tied."""


def peer_score_metrics(episodes: list[Episode], roles: list[str | None]) -> dict[str, float]:
    """What a rule that scores proposals saw (:data:`bidswarm.metric_names.PEER_SCORES`): per
    proposer role the mean peer score its proposals received, and over the steps with two
    proposals or more the gap between the best two and the share of near-ties
    (:data:`PEER_SCORE_NEAR_TIE`). Empty when no step recorded proposal scores."""
    received: dict[str, list[float]] = {}
    gaps = []
    for step in (s for e in episodes for s in e.steps if s.proposal_scores):
        for agent, score in step.proposal_scores.items():
            received.setdefault(role_name(roles[agent]), []).append(score)
        if len(step.proposal_scores) >= 2:
            best, second = sorted(step.proposal_scores.values(), reverse=True)[:2]
            gaps.append(best - second)
    metrics = {
        f"{names.PEER_SCORES}/received/{role}": sum(v) / len(v)
        for role, v in sorted(received.items())
    }
    if gaps:
        metrics[f"{names.PEER_SCORES}/margin"] = sum(gaps) / len(gaps)
        near = sum(gap < PEER_SCORE_NEAR_TIE for gap in gaps)
        metrics[f"{names.PEER_SCORES}/near_tie"] = near / len(gaps)
    return metrics


PARTICIPATION_DECISIONS = (10, 30)
"""Decision numbers (1-based) at which the share of each role acting is logged, besides the
last decision of each episode (docs/method.md section 8 reports decision 120, the last)."""


def participation_at_decisions(
    episodes: list[Episode], roles: list[str | None]
) -> dict[str, float]:
    """``participation_at/<d>/<role>``: among the episodes that reached decision ``d`` (the 10th,
    the 30th; ``last``: each episode's last decision), the share in which ``role`` acted at it
    (the remainder skipped the step)."""
    names = sorted({role_name(role) for role in roles})
    picks: dict[str, list] = {
        str(d): [e.steps[d - 1] for e in episodes if len(e.steps) >= d]
        for d in PARTICIPATION_DECISIONS
    }
    picks["last"] = [e.steps[-1] for e in episodes if e.steps]
    metrics = {}
    for label, steps in picks.items():
        if not steps:
            continue
        acting = Counter(role_name(roles[s.actor]) for s in steps if s.actor is not None)
        for role in names:
            metrics[f"participation_at/{label}/{role}"] = acting[role] / len(steps)
    return metrics


@contextmanager
def timed(timings: dict[str, float], phase: str) -> Iterator[None]:
    """Add the seconds the block takes to ``timings[phase]`` (logged as ``time/<phase>_s``)."""
    start = time.perf_counter()
    yield
    timings[phase] = timings.get(phase, 0.0) + time.perf_counter() - start
