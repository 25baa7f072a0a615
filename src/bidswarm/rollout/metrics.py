"""Metrics of a batch of episodes: reward, task metrics, participation share per role."""

from __future__ import annotations

import math
from collections import Counter

from bidswarm.rollout.records import Episode
from bidswarm.rollout.swarm import Swarm


def mean_and_se(values: list[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (0 for fewer than two values)."""
    n = len(values)
    if n == 0:
        return 0.0, 0.0
    mean = sum(values) / n
    if n < 2:
        return mean, 0.0
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


def role_name(role: str | None) -> str:
    return "all" if role is None else role


def episode_metrics(episodes: list[Episode], swarm: Swarm) -> dict[str, float]:
    """Means over ``episodes`` of reward and every task metric, and who acted how often."""
    rewards = [e.total_reward for e in episodes]
    mean, se = mean_and_se(rewards)
    metrics = {"reward/mean": mean, "reward/se": se, "episodes": float(len(episodes))}
    keys = sorted({k for e in episodes for k in e.metrics})
    for key in keys:
        metrics[f"task/{key}"] = sum(e.metrics.get(key, 0.0) for e in episodes) / len(episodes)
    acting = Counter(
        role_name(swarm.role(s.actor)) for e in episodes for s in e.steps if s.actor is not None
    )
    steps = sum(len(e.steps) for e in episodes)
    total_acting = sum(acting.values())
    roles = sorted({role_name(swarm.role(a)) for a in range(swarm.n_agents)})
    for role in roles:
        metrics[f"participation/{role}"] = acting[role] / max(total_acting, 1)
    metrics["skipped_fraction"] = (steps - total_acting) / max(steps, 1)
    contested = sum(s.contested for e in episodes for s in e.steps)
    metrics["contested_fraction"] = contested / max(total_acting, 1)
    return metrics
