"""Held-out evaluation: every held-out world x ``runs_per_seed`` runs; statistics over worlds."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from bidswarm.rollout.keyed import seeded_randomness
from bidswarm.rollout.loop import RolloutLoop
from bidswarm.rollout.metrics import episode_metrics
from bidswarm.rollout.records import Episode
from bidswarm.rollout.usage import Usage
from bidswarm.statistics import pass_at_k_over_worlds, per_world_means, summarize


@dataclass
class Evaluation:
    """What an evaluation measured.

    metrics: ``episode_metrics`` of all episodes, except that ``reward/mean``, ``reward/se``,
             ``reward/ci_low`` and ``reward/ci_high`` (95% t interval) are over the per-world
             mean rewards (``worlds`` of them): the runs of one world are not independent.
    world_rewards: mean reward per held-out world id, to pair arms on the same worlds.
    world_pass_at_k: k -> held-out world id -> pass@k of task success on that world.
    usage: tokens and FLOPs the evaluation itself spent (never added to the swarm's training
           counters).
    """

    metrics: dict[str, float]
    episodes: list[Episode]
    world_rewards: dict[int, float]
    world_pass_at_k: dict[int, dict[int, float]]
    usage: Usage

    def write_worlds(self, folder: Path, key: str) -> list[Path]:
        """The per-world results as ``folder/<key>_worlds.json`` (mean reward) and
        ``folder/<key>_pass_at_<k>_worlds.json`` (pass@k of task success), world ids as keys,
        so that arms and phases can be paired on the same worlds; returns the files."""
        folder.mkdir(parents=True, exist_ok=True)
        per_world = {key: self.world_rewards} | {
            f"{key}_pass_at_{k}": values for k, values in self.world_pass_at_k.items()
        }
        paths = []
        for name, values in per_world.items():
            path = folder / f"{name}_worlds.json"
            path.write_text(json.dumps({str(w): v for w, v in values.items()}, indent=1) + "\n")
            paths.append(path)
        return paths


def evaluate(
    loop: RolloutLoop, seeds: list[int], runs_per_seed: int, seed: int, batch_size: int = 64
) -> Evaluation:
    """Play ``seeds`` x ``runs_per_seed`` episodes (sampling, fixed randomness) in lock-step.

    The swarm counts into a ledger of its own while it plays (``Swarm.separate_usage``), so
    held-out evaluation never shows up in the training ``tokens/*`` and ``flops/*``.
    """
    device = next(loop.swarm.population.parameters()).device
    rng, generator = seeded_randomness(f"eval/{seed}", device)
    worlds = [s for s in seeds for _ in range(runs_per_seed)]
    episodes: list[Episode] = []
    with loop.swarm.separate_usage() as usage:
        for start in range(0, len(worlds), batch_size):
            episodes += loop.run(worlds[start : start + batch_size], rng, generator)
    world_rewards = per_world_means([e.total_reward for e in episodes], [e.seed for e in episodes])
    reward = summarize(list(world_rewards.values()))
    metrics = episode_metrics(episodes, loop.swarm.roles, loop.winning_bid_levels) | {
        "reward/mean": reward.mean,
        "reward/se": reward.se,
        "reward/ci_low": reward.ci_low,
        "reward/ci_high": reward.ci_high,
        "worlds": float(reward.n),
    }
    pass_metrics, world_pass_at_k = pass_at_k_metrics(episodes, runs_per_seed)
    return Evaluation(metrics | pass_metrics, episodes, world_rewards, world_pass_at_k, usage)


def pass_at_k_metrics(
    episodes: list[Episode], runs_per_seed: int
) -> tuple[dict[str, float], dict[int, dict[int, float]]]:
    """``pass_at_<k>/mean|se|ci_low|ci_high`` (pass@k; MLflow names take no ``@``) of task
    success for k = 1..runs_per_seed: the unbiased estimator per world from its
    ``runs_per_seed`` attempts, the 95% Wilson interval over worlds (within [0, 1]); and
    k -> world -> that world's pass@k. Every task's episodes report ``success`` (crafting: the
    target obtained; navigation: stopped within the success distance; research: a correct
    answer)."""
    successes = [e.metrics["success"] for e in episodes]
    worlds = [e.seed for e in episodes]
    metrics, per_world = {}, {}
    for k in range(1, runs_per_seed + 1):
        summary, per_world[k] = pass_at_k_over_worlds(successes, worlds, k)
        metrics |= {
            f"pass_at_{k}/mean": summary.mean,
            f"pass_at_{k}/se": summary.se,
            f"pass_at_{k}/ci_low": summary.ci_low,
            f"pass_at_{k}/ci_high": summary.ci_high,
        }
    return metrics, per_world
