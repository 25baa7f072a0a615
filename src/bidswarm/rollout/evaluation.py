"""Held-out evaluation: every held-out world x ``runs_per_seed`` runs, mean +- SE."""

from __future__ import annotations

import random

import torch

from bidswarm.rollout.loop import RolloutLoop
from bidswarm.rollout.metrics import episode_metrics
from bidswarm.rollout.records import Episode


def evaluate(
    loop: RolloutLoop, seeds: list[int], runs_per_seed: int, seed: int, batch_size: int = 64
) -> tuple[dict[str, float], list[Episode]]:
    """Play ``seeds`` x ``runs_per_seed`` episodes (sampling, fixed randomness) in lock-step."""
    rng = random.Random(f"eval/{seed}")
    device = next(loop.swarm.population.parameters()).device
    generator = torch.Generator(device=device)
    generator.manual_seed(rng.randrange(2**63))
    worlds = [s for s in seeds for _ in range(runs_per_seed)]
    episodes: list[Episode] = []
    for start in range(0, len(worlds), batch_size):
        episodes += loop.run(worlds[start : start + batch_size], rng, generator)
    return episode_metrics(episodes, loop.swarm), episodes
