"""Rules that need no bids: a fixed rotation, and the single monolithic agent."""

from __future__ import annotations

import random

from bidswarm.coordination.base import CoordinationRule, Decision, Situation


class RoundRobin(CoordinationRule):
    """Agent ``decision mod N`` acts: the fixed rotation of hand-designed pipelines."""

    def decide(self, situations: list[Situation], rng: random.Random) -> list[Decision]:
        return [Decision(actor=s.decision % s.n_agents) for s in situations]


class Monolithic(CoordinationRule):
    """A population of one agent that owns every role's actions acts every step."""

    monolithic = True

    def decide(self, situations: list[Situation], rng: random.Random) -> list[Decision]:
        for situation in situations:
            if situation.n_agents != 1:
                raise ValueError(f"monolithic coordination needs 1 agent, got {situation.n_agents}")
        return [Decision(actor=0) for _ in situations]
