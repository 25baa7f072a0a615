"""Rules that need no bids: a fixed rotation, and the single monolithic agent."""

from __future__ import annotations

import random

from bidswarm.checks import Allowed, Parameter
from bidswarm.coordination.base import CoordinationRule, Decision, Situation, register


@register("round_robin")
class RoundRobin(CoordinationRule):
    """Agent ``decision mod N`` acts: the fixed rotation of hand-designed pipelines. An absent
    agent is skipped: the next present one in the rotation acts (none present: the step is
    skipped)."""

    def decide(self, situations: list[Situation], rng: random.Random) -> list[Decision]:
        return [Decision(actor=self._next_present(s)) for s in situations]

    @staticmethod
    def _next_present(situation: Situation) -> int | None:
        n = situation.n_agents
        for offset in range(n):
            agent = (situation.decision + offset) % n
            if agent not in situation.absent:
                return agent
        return None


@register("monolithic")
class Monolithic(CoordinationRule):
    """A population of one agent that owns every role's actions acts every step; when it has
    dropped out, the step is wasted (skipped)."""

    monolithic = True

    @classmethod
    def parameters(cls) -> list[Parameter]:
        one_copy = Allowed(
            lambda replicas: replicas == 1,
            "must be 1 with coordination=monolithic (a single agent owns every role)",
            2,
        )
        return [*super().parameters(), Parameter("replicas", one_copy)]

    def decide(self, situations: list[Situation], rng: random.Random) -> list[Decision]:
        for situation in situations:
            if situation.n_agents != 1:
                raise ValueError(f"monolithic coordination needs 1 agent, got {situation.n_agents}")
        return [Decision(actor=None if 0 in s.absent else 0) for s in situations]
