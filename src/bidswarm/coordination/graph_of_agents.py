"""Graph-of-Agents, adapted step-wise [ours]: every agent proposes, peers score, the best acts.

Each decision step, in every live env:

1. every agent proposes its action (``Swarm.act``, one generation batch per agent over envs);
2. every agent scores the other agents' proposals: the mean token log-prob of the proposal as
   its own action reply, under its own action prompt (``Swarm.score``, one forward batch per
   scorer over envs x proposals). This needs no training beyond the action policies: a peer
   that would itself have written a similar instruction rates it higher;
3. the proposal with the highest mean peer score acts (ties: uniform at random), and its
   proposer is the actor. A population of one agent has no peers and scores itself.

Per step, with N agents and E live envs: N action generations (batched per agent, E rows each)
plus N * (N - 1) scoring rows per env (N forward batches of E * (N - 1) rows, no sampling), so
roughly N times the action cost of the auction and no bid generations. No bids are made, so the
step records ``winning_bid`` 0 (and bucket-brigade credit becomes the per-step reward).
"""

from __future__ import annotations

import random

import torch

from bidswarm.coordination.base import CoordinationRule, Decision
from bidswarm.envs.base import TextEnv
from bidswarm.rollout.records import Reply
from bidswarm.rollout.swarm import Swarm


def peer_scores(scores: list[list[float]]) -> list[float]:
    """Mean score of each proposal over the other agents (``scores[scorer][proposer]``).

    A single agent has no peers: its own score stands.
    """
    n = len(scores)
    if n == 1:
        return [scores[0][0]]
    return [sum(scores[j][i] for j in range(n) if j != i) / (n - 1) for i in range(n)]


def best_proposal(values: list[float], rng: random.Random) -> int:
    """Index of the highest value, ties broken uniformly by ``rng``."""
    top = max(values)
    return rng.choice([i for i, value in enumerate(values) if value == top])


class GraphOfAgents(CoordinationRule):
    """Every agent proposes an action, agents score each other's proposals, the best acts."""

    def decide(
        self, swarm: Swarm, envs: list[TextEnv], rng: random.Random, generator: torch.Generator
    ) -> list[Decision]:
        n = swarm.n_agents
        proposals = [swarm.act(agent, envs, generator) for agent in range(n)]
        # scores[env][scorer][proposer]; the diagonal is only filled for a lone agent.
        scores = [[[0.0] * n for _ in range(n)] for _ in envs]
        for scorer in range(n):
            proposers = [p for p in range(n) if p != scorer] if n > 1 else [scorer]
            rows: list[tuple[int, int]] = [(e, p) for e in range(len(envs)) for p in proposers]
            replies: list[Reply] = [proposals[p][e] for e, p in rows]
            values = swarm.score(scorer, [envs[e] for e, _ in rows], replies)
            for (e, p), value in zip(rows, values, strict=True):
                scores[e][scorer][p] = value
        decisions = []
        for e in range(len(envs)):
            winner = best_proposal(peer_scores(scores[e]), rng)
            decisions.append(Decision(actor=winner, action=proposals[winner][e]))
        return decisions
