"""[ours] A centralised router: one model that reads every role's view picks who acts.

The honest control for the market: the population holds a *decider* besides the acting
agents (``Population.decider``, a model of the agents' architecture that never acts), which
reads the whole world's observation (the monolithic agent's view: every role's observation in
one) and replies the role that acts now to its route prompt (``PromptTemplate.route`` with
:data:`~bidswarm.coordination.base.DECIDER_NAME`). It learns that reply in the cold start from
the experts' demonstrations (in each demonstration state, the expert's owner), the agents learn
their actions as under the auction, and nobody learns bids; ``coordination.relabel_rounds``
adds labels in the swarm's own states (DAgger). The rule asks the collector for the log-prob
of each present agent's role in the decider's reply and takes the likeliest (replicas of one
role: uniform); it never skips.

If the decider matches the expert's schedule, a task cannot show an advantage of a
decentralised market over a central scheduler trained on the same labels: that is a finding
to report, not a failure (docs/coordination.md).

Per step, with E live envs: one route prompt per env (the decider's, one batch), each present
role's name scored after it, then the actor's action generation. No bids: the step records
``winning_bid`` 0 (bucket-brigade credit becomes the per-step reward). The decider is trained
in the cold start only, not by RL.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from bidswarm.coordination.base import (
    DECIDER,
    PICK,
    CoordinationRule,
    Decision,
    LearnedDecisionConfig,
    Situation,
    likeliest,
    register,
)


@dataclass
class RouterConfig(LearnedDecisionConfig):
    """The centralised router (``conf/coordination/router.yaml``)."""


@register("router")
class Router(CoordinationRule):
    """The population's decider names the role that acts; its likeliest present agent acts."""

    Config = RouterConfig
    needs_decider = True
    asks_routes = True
    decisions_learned = frozenset({PICK})

    def routers(self, situation: Situation) -> list[int]:
        return [DECIDER] if situation.present else []

    def decide(self, situations: list[Situation], rng: random.Random) -> list[Decision]:
        decisions = []
        for s in situations:
            routes = {a: lp for a, lp in s.routes.get(DECIDER, {}).items() if a in s.present}
            decisions.append(Decision(actor=likeliest(routes, rng)))
        return decisions
