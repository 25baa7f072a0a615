"""[ours] A sealed auction on proposals: every agent proposes its action, then bids on it.

MPT's agents bid before they act: the bid prompt shows the agent's observation, and the bid
must foresee both what the agent would do and whether that is what the team needs. Where roles
share actions and differ in what they can do (``task.actions=shared``), the bid then has two
steps to take in one: infer the plan's next step, then read the agent's own skill at it. Here
each agent first proposes its action (its action prompt, as Graph-of-Agents' agents do), then
bids on its own proposal: its reply to the score prompt (``PromptTemplate.score`` with
``own=True``: its observation and its proposal), read as the expected level (softmax at
temperature 1 over the bid levels' replies, as ``bids.reader=expected`` reads a bid). The
highest bid acts (Eq. 1 of MPT, ``algorithms/auction.py``: ties uniform), its proposal is the
action, and the bid is the b_t that credit reads (bucket brigade, as the auction's).

The bid on a proposal is learned in the cold start from the experts' demonstrations
(``decisions_learned`` :data:`OWN_SCORE`, ``run/decision_demonstrations.py``): in each expert
state every role rates its own expert reply at its expert's bid there (0 where the plan does not
need the role now, replaying its latest reply), and in relabel rounds
(``coordination.relabel_rounds``) at its expert's bid in the swarm's own states. The agents also
learn the auction's bids and actions, as every rule that learns a decision does.

Unlike the auction, someone always acts (an expected level is never exactly 0) and steps are
not forked (the bid updates of Eq. 3 redraw a bid reply; here the bid is read, not drawn).

Per step, with N agents and E live envs: N action generations (one batch per agent) and N
scoring rows per env (one forward batch of E rows per agent, each level's one-token reply after
it); no bid generations.
"""

from __future__ import annotations

import random

from bidswarm.algorithms.auction import run_auction
from bidswarm.coordination.auction import decision_of
from bidswarm.coordination.base import (
    OWN_SCORE,
    USEFULNESS,
    CoordinationRule,
    Decision,
    LearnedDecisionConfig,
    Situation,
    register,
)


@register("proposal_auction")
class ProposalAuction(CoordinationRule):
    """Every present agent proposes an action and bids on it; the highest bid acts (nobody
    present: the step is skipped)."""

    Config = LearnedDecisionConfig
    asks_proposals = True
    scores_own_proposal = True
    proposal_scoring = USEFULNESS
    records_winning_bids = True
    decisions_learned = frozenset({OWN_SCORE})

    def decide(self, situations: list[Situation], rng: random.Random) -> list[Decision]:
        decisions = []
        for s in situations:
            scores = s.proposal_scores  # an absent agent bids nothing: 0, never a winner
            outcome = run_auction([scores.get(a, 0.0) for a in range(s.n_agents)], rng)
            decisions.append(decision_of(outcome))
        return decisions
