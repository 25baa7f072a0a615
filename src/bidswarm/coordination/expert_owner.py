"""The reference rule: the task's scripted expert picks who acts, the trained agents act."""

from __future__ import annotations

import random

from bidswarm.coordination.base import CoordinationRule, Decision, Situation, register


@register("expert_owner")
class ExpertOwner(CoordinationRule):
    """The agent whose role the task's expert would let act (the owner of the expert's next
    step, ``envs.experts.expert_owners``) acts, with its own trained action; the expert
    skipping skips the step. Several present agents of that role (``replicas``): one drawn
    uniformly; none present (``dropout``): the step is skipped.

    Evaluation only: with the run's trained actions it bounds what any bid channel could reach
    by carrying out the expert's schedule (``python -m bidswarm.evaluate ...
    coordination=expert_owner``; a run reports it after RL by ``eval.reference_rules``)."""

    asks_expert = True
    evaluation_only = True

    def decide(self, situations: list[Situation], rng: random.Random) -> list[Decision]:
        decisions = []
        for situation in situations:
            choice = sorted(situation.expert_choice)
            actor = None if not choice else choice[0] if len(choice) == 1 else rng.choice(choice)
            decisions.append(Decision(actor=actor))
        return decisions
