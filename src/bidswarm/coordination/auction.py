"""MPT's sealed-bid auction (Eq. 1 of MPT) as a coordination rule."""

from __future__ import annotations

import random

import torch

from bidswarm.algorithms.auction import run_auction
from bidswarm.coordination.base import CoordinationRule, Decision
from bidswarm.envs.base import TextEnv
from bidswarm.rollout.swarm import Swarm


class Auction(CoordinationRule):
    """Every agent bids in every env (one batch per agent); the highest bid acts."""

    asks_bids = True

    def decide(
        self, swarm: Swarm, envs: list[TextEnv], rng: random.Random, generator: torch.Generator
    ) -> list[Decision]:
        per_agent = [swarm.bid(agent, envs, generator) for agent in range(swarm.n_agents)]
        decisions = []
        for env_pos in range(len(envs)):
            bids = [per_agent[agent][env_pos].level for agent in range(swarm.n_agents)]
            outcome = run_auction(bids, rng)
            decisions.append(
                Decision(
                    actor=outcome.winner,
                    winning_bid=outcome.winning_bid,
                    runner_up=outcome.runner_up,
                    runner_up_bid=outcome.runner_up_bid,
                    bids=bids,
                    bid_replies=[per_agent[a][env_pos].reply for a in range(swarm.n_agents)],
                )
            )
        return decisions
