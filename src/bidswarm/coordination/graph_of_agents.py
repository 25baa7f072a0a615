"""Graph-of-Agents, adapted step-wise [ours]: every agent proposes, peers score, the best acts.

Each decision step, in every live env, the collector (the rule asks for proposals):

1. has every agent propose its action (one generation batch per agent over envs);
2. has every agent score the other agents' proposals: the mean token log-prob of the proposal
   as its own action reply, under its own action prompt (one forward batch per scorer over
   envs x proposals, micro-batched by ``rl.micro_batch_tokens``). This needs no training beyond
   the action policies: a peer that would itself have written a similar instruction rates it
   higher.

The rule then picks the proposal with the highest mean peer score (ties: uniform at random),
and its proposer is the actor; its proposal is the action. A population of one agent has no
peers and scores itself.

Per step, with N agents and E live envs: N action generations (batched per agent, E rows each)
plus N * (N - 1) scoring rows per env (N forward batches of E * (N - 1) rows, no sampling), so
roughly N times the action cost of the auction and no bid generations. No bids are made, so the
step records ``winning_bid`` 0 (and bucket-brigade credit becomes the per-step reward).
"""

from __future__ import annotations

import random

from bidswarm.coordination.base import CoordinationRule, Decision, Situation, register


def best_proposal(values: list[float], rng: random.Random) -> int:
    """Index of the highest value, ties broken uniformly by ``rng``."""
    top = max(values)
    return rng.choice([i for i, value in enumerate(values) if value == top])


@register("graph_of_agents")
class GraphOfAgents(CoordinationRule):
    """Every present agent proposes an action, the present agents score each other's proposals,
    the best acts (nobody present: the step is skipped)."""

    asks_proposals = True

    def decide(self, situations: list[Situation], rng: random.Random) -> list[Decision]:
        decisions = []
        for s in situations:
            present = s.present
            if not present:
                decisions.append(Decision(actor=None))
                continue
            best = best_proposal(list(s.proposal_scores.values()), rng)
            decisions.append(Decision(actor=present[best]))
        return decisions
