"""Metrics of a batch of episodes (reward, task metrics, participation per role) and the
timing of named phases."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from bidswarm.envs.base import role_name
from bidswarm.rollout.records import Episode
from bidswarm.statistics import summarize


def episode_metrics(episodes: list[Episode], roles: list[str | None]) -> dict[str, float]:
    """Means over ``episodes`` of reward (with its SE) and every task metric, and who acted how
    often; ``roles[i]`` is agent ``i``'s role."""
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
    contested = sum(s.contested for e in episodes for s in e.steps)
    metrics["contested_fraction"] = contested / max(total_acting, 1)
    return metrics


@contextmanager
def timed(timings: dict[str, float], phase: str) -> Iterator[None]:
    """Add the seconds the block takes to ``timings[phase]`` (logged as ``time/<phase>_s``)."""
    start = time.perf_counter()
    yield
    timings[phase] = timings.get(phase, 0.0) + time.perf_counter() - start
