"""Graph-of-Agents, adapted step-wise [ours]: every agent proposes, peers score, the best acts.

Graph-of-Agents (Yun et al., ICLR 2026, arXiv 2604.17148) answers one query with a few
selected LLMs: each answers, each scores the others' answers (their relevance), messages pass
from the best-scored to the others and back, and the answers are pooled (max or mean). Its
models are instruction-tuned LLMs that score zero-shot. Step-wise, here: the query is the
decision step, the answer an agent's proposed action, and max pooling is "the best-scored
proposal acts"; there is no node selection (every role is a node) and no message passing.

Each decision step, in every live env, the collector (the rule asks for proposals):

1. has every agent propose its action (one generation batch per agent over envs);
2. has every agent score the other agents' proposals, in one of two ways
   (``coordination.scoring``):

   - ``logprob`` (the default, what Table 2 ran): the mean token log-prob of the proposal as
     its own action reply, under its own action prompt. Nothing is trained for it: a peer that
     would itself have written a similar instruction rates it higher. With roles whose actions
     are disjoint it measures how much a proposal looks like the scorer's own replies.
   - ``trained`` [ours]: the expected usefulness level of the scorer's reply to its score
     prompt (``PromptTemplate.score``: its own observation and the proposal), read from the
     log-prob of each level's canonical reply, softmax at temperature 1. The agents learn it in
     the cold start from the experts' demonstrations (in each demonstration state the owner's
     expert action is scored at the top level, every other role's expert reply there at 0: the
     scorer becomes a classifier of the expert's owner from the proposal's text), in place of
     the bids (docs/coordination.md, "Decisions learned from demonstrations").

The rule then picks the proposal with the highest mean peer score (ties: uniform at random),
and its proposer is the actor; its proposal is the action. A population of one agent has no
peers and scores itself.

Per step, with N agents and E live envs: N action generations (batched per agent, E rows each)
plus N * (N - 1) scoring rows per env (N forward batches of E * (N - 1) rows, no sampling; the
trained scoring adds each level's one-token reply after each row), so roughly N times the
action cost of the auction and no bid generations. No bids are made, so the step records
``winning_bid`` 0 (and bucket-brigade credit becomes the per-step reward).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from bidswarm.checks import Parameter, one_of
from bidswarm.coordination.base import (
    ACTION_LOGPROB,
    SCORE,
    USEFULNESS,
    CoordinationRule,
    Decision,
    LearnedDecisionConfig,
    Situation,
    register,
    relabel_problems,
)

SCORINGS = {"logprob": ACTION_LOGPROB, "trained": USEFULNESS}
"""``coordination.scoring`` -> how the collector scores the proposals."""


def best_proposal(values: list[float], rng: random.Random) -> int:
    """Index of the highest value, ties broken uniformly by ``rng``."""
    top = max(values)
    return rng.choice([i for i, value in enumerate(values) if value == top])


@dataclass
class GraphOfAgentsConfig(LearnedDecisionConfig):
    """How peers score proposals (``conf/coordination/graph_of_agents.yaml``)."""

    scoring: str = "logprob"
    """``logprob``: the mean token log-prob under the scorer's own action prompt (untrained);
    ``trained`` [ours]: the scorer's usefulness level, learned from the demonstrations."""


@register("graph_of_agents")
class GraphOfAgents(CoordinationRule):
    """Every present agent proposes an action, the present agents score each other's proposals,
    the best acts (nobody present: the step is skipped)."""

    Config = GraphOfAgentsConfig
    asks_proposals = True

    def __init__(self, config: GraphOfAgentsConfig | None = None) -> None:
        config = config or GraphOfAgentsConfig(name="graph_of_agents")
        self.proposal_scoring = SCORINGS[config.scoring]
        self.decisions_learned = frozenset({SCORE} if self.proposal_scoring == USEFULNESS else ())

    @classmethod
    def parameters(cls) -> list[Parameter]:
        return [*super().parameters(), Parameter("scoring", one_of(SCORINGS))]

    @classmethod
    def problems(cls, config: GraphOfAgentsConfig) -> list[str]:
        return super().problems(config) + relabel_problems(
            config, SCORINGS.get(config.scoring) == USEFULNESS, "coordination.scoring=trained"
        )

    @classmethod
    def from_config(cls, config: GraphOfAgentsConfig) -> GraphOfAgents:
        return cls(config)

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
