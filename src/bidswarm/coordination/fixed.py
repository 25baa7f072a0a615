"""Rules that need no bids: a fixed rotation, and the single monolithic agent."""

from __future__ import annotations

import random

import torch

from bidswarm.coordination.base import CoordinationRule, Decision
from bidswarm.envs.base import TextEnv
from bidswarm.rollout.swarm import Swarm


class RoundRobin(CoordinationRule):
    """Agent ``decision mod N`` acts: the fixed rotation of hand-designed pipelines."""

    def decide(
        self, swarm: Swarm, envs: list[TextEnv], rng: random.Random, generator: torch.Generator
    ) -> list[Decision]:
        return [Decision(actor=env.decisions_made % swarm.n_agents) for env in envs]


class Monolithic(CoordinationRule):
    """A population of one agent that owns every role's actions acts every step."""

    def decide(
        self, swarm: Swarm, envs: list[TextEnv], rng: random.Random, generator: torch.Generator
    ) -> list[Decision]:
        if swarm.n_agents != 1:
            raise ValueError(f"monolithic coordination needs 1 agent, got {swarm.n_agents}")
        return [Decision(actor=0) for _ in envs]
