"""AgentNet, adapted step-wise [ours]: the current actor routes the task to the next actor.

AgentNet (Yang et al., NeurIPS 2025, arXiv 2504.00587) has no orchestrator: each agent is a
router and an executor, both instruction-tuned LLMs prompted with what a retrieval memory of
their past trajectories holds; an agent that receives a task executes it, forwards it to a
neighbour, or splits it. Step-wise, here: the task is the episode, held by the agent that
acted last; each step its holder keeps it (acts) or forwards it; nothing is split.

Each decision step, in every live env, the agent that acted at the previous step (the
*holder*, ``Situation.previous_actor``) routes, by one of two routers (``coordination.router``):

``bid`` (the default, what Table 2 ran):

1. its router is its own bid policy (no new training): the rule asks the collector for the
   holder's bid; a bid of at least ``keep_bid`` keeps the task (the holder acts again);
2. otherwise it forwards the task. The destination comes from a retrieval memory of past
   successful steps (steps whose reward was positive): the ``neighbours`` stored observations
   nearest to the current one by token overlap (Jaccard, at least ``min_overlap``) vote for the
   agent that acted there, weighted by overlap x reward; with no usable memory it forwards
   to the next agent in rotation. A step with no holder (episode start, after a skipped step)
   takes the memory's choice, else agent ``decision mod N``.

``trained`` [ours]: the holder's reply to its route prompt (``PromptTemplate.route``: which
role acts now; naming its own role keeps the task), which every agent learns in the cold start
from the experts' demonstrations, in place of the bids: in each demonstration state, whoever
holds the task names the expert's owner (keep when it owns the step, forward to the owner when
the owner changes; docs/coordination.md, "Decisions learned from demonstrations"). The rule
asks the collector for the log-prob of each present agent's role in that reply and takes the
likeliest, mixed with the memory's vote shares by ``memory_weight`` (0: the router alone). A
step with no holder is routed by the agent ``decision mod N`` (the task's entry point).

The holder is the previous step's actor of the same episode or fork branch, which the
collector knows: a fork branch's forced first actor is the holder of its second step. The
memory is shared experience, not per-env state: it keeps the newest ``memory_size`` successful
steps of every episode played with this rule object (``record_outcomes``).

Per step, with N agents and E live envs: one bid generation per env with a holder (batched per
holder: at most N batches, E rows in all), a memory look-up over at most ``memory_size`` entries
per env (CPU set overlaps), then the actor's action generation. That is 1 bid generation per env
instead of the auction's N (``trained``: one route prompt per env, each present role's name
scored after it). The router's bid is not a sealed-auction bid: the step records
``winning_bid`` 0 (bucket-brigade credit becomes the per-step reward).
"""

from __future__ import annotations

import math
import random
import re
from collections import deque
from dataclasses import dataclass

from bidswarm.checks import Parameter, at_least, one_of, unit_interval
from bidswarm.coordination.base import (
    ROUTE,
    CoordinationRule,
    Decision,
    LearnedDecisionConfig,
    Situation,
    register,
    relabel_problems,
)

ROUTERS = ("bid", "trained")
"""``coordination.router``: the holder's auction bid read as keep-or-pass, or its route prompt
learned from the demonstrations."""

_WORD = re.compile(r"\w+")


def observation_tokens(text: str) -> frozenset[str]:
    """Lower-cased word tokens of an observation (the memory's key)."""
    return frozenset(_WORD.findall(text.lower()))


def token_overlap(a: frozenset[str], b: frozenset[str]) -> float:
    """Jaccard overlap of two token sets (0 when both are empty)."""
    union = len(a | b)
    return len(a & b) / union if union else 0.0


@dataclass(frozen=True)
class MemoryEntry:
    """A past successful step: what the world looked like, who acted, what it earned."""

    tokens: frozenset[str]
    actor: int
    reward: float


class SuccessMemory:
    """The newest ``capacity`` successful steps; votes for an actor by nearest observations."""

    def __init__(self, capacity: int, neighbours: int, min_overlap: float):
        self.entries: deque[MemoryEntry] = deque(maxlen=capacity)
        self.neighbours = neighbours
        self.min_overlap = min_overlap

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, tokens: frozenset[str], actor: int, reward: float) -> None:
        if reward > 0.0:
            self.entries.append(MemoryEntry(tokens, actor, reward))

    def votes(self, tokens: frozenset[str]) -> dict[int, float]:
        """Actor -> the votes of the nearest successful steps (overlap x reward); empty without
        a close one."""
        scored = [(token_overlap(tokens, entry.tokens), entry) for entry in self.entries]
        close = [(overlap, e) for overlap, e in scored if overlap >= self.min_overlap]
        close.sort(key=lambda pair: pair[0], reverse=True)
        votes: dict[int, float] = {}
        for overlap, entry in close[: self.neighbours]:
            votes[entry.actor] = votes.get(entry.actor, 0.0) + overlap * entry.reward
        return votes

    def suggest(self, tokens: frozenset[str]) -> int | None:
        """The actor the nearest successful steps vote for, or None without a close one."""
        votes = self.votes(tokens)
        if not votes:
            return None
        # Highest vote; the lowest agent index among equal votes keeps it deterministic.
        return min(votes, key=lambda agent: (-votes[agent], agent))


@dataclass
class AgentNetConfig(LearnedDecisionConfig):
    """AgentNet's router and memory (``conf/coordination/agentnet.yaml``)."""

    router: str = "bid"
    """``bid``: the holder's auction bid read as keep-or-pass (untrained for it); ``trained``
    [ours]: the holder's route prompt, learned from the demonstrations."""
    keep_bid: float = 0.6
    """The holder keeps acting when its own bid reaches this (the top two default levels;
    ``router=bid``)."""
    memory_weight: float = 0.0
    """[ours] ``router=trained``: the weight of the memory's vote shares mixed into the
    router's probabilities over the present agents (0: the router alone)."""
    memory_size: int = 2048
    """Successful steps the memory keeps (the newest)."""
    neighbours: int = 8
    """Nearest stored steps that vote for the next actor."""
    min_overlap: float = 0.3
    """Token overlap (Jaccard) a stored step needs to vote."""


@register("agentnet")
class AgentNet(CoordinationRule):
    """The holder keeps the task or forwards it, helped by a memory of successful steps."""

    Config = AgentNetConfig
    asks_bids = True
    reads_observations = True

    def __init__(self, config: AgentNetConfig | None = None) -> None:
        config = config or AgentNetConfig(name="agentnet")
        self.keep_bid = config.keep_bid
        self.memory_weight = config.memory_weight
        self.memory = SuccessMemory(config.memory_size, config.neighbours, config.min_overlap)
        self.trained = config.router == "trained"
        if self.trained:
            self.asks_bids = False
            self.asks_routes = True
            self.decisions_learned = frozenset({ROUTE})

    @classmethod
    def parameters(cls) -> list[Parameter]:
        return [
            *super().parameters(),
            Parameter("router", one_of(ROUTERS)),
            Parameter("keep_bid", unit_interval()),  # a bid level: 0 always keeps
            Parameter("memory_weight", unit_interval()),
            Parameter("memory_size", at_least(1)),
            Parameter("neighbours", at_least(1)),
            Parameter("min_overlap", unit_interval()),  # a Jaccard overlap
        ]

    @classmethod
    def problems(cls, config: AgentNetConfig) -> list[str]:
        learns = config.router == "trained"
        return super().problems(config) + relabel_problems(
            config, learns, "coordination.router=trained"
        )

    @classmethod
    def from_config(cls, config: AgentNetConfig) -> AgentNet:
        return cls(config)

    def bidders(self, situation: Situation) -> list[int]:
        """Only the holder bids (when present): its bid decides whether it keeps the task."""
        holder = self._holder(situation)
        return [] if holder is None or self.trained else [holder]

    def routers(self, situation: Situation) -> list[int]:
        """``router=trained``: the holder routes, or with no holder the entry agent."""
        router = self._trained_router(situation)
        return [] if router is None else [router]

    def decide(self, situations: list[Situation], rng: random.Random) -> list[Decision]:
        if self.trained:
            return [Decision(actor=self._route_trained(s, rng)) for s in situations]
        return [Decision(actor=self._route(situation)) for situation in situations]

    def _trained_router(self, situation: Situation) -> int | None:
        """Who routes with ``router=trained``: the holder, else agent ``decision mod N`` (the
        next present one); None with nobody present (or the bid router)."""
        if not self.trained or not situation.present:
            return None
        holder = self._holder(situation)
        return holder if holder is not None else self._next_present(situation, situation.decision)

    def _route_trained(self, situation: Situation, rng: random.Random) -> int | None:
        """The present agent the router's reply and the memory's votes make likeliest."""
        router = self._trained_router(situation)
        if router is None:
            return None
        logprobs = {a: lp for a, lp in situation.routes[router].items() if a in situation.present}
        top = max(logprobs.values())
        weights = {a: math.exp(lp - top) for a, lp in logprobs.items()}
        total = sum(weights.values())
        shares = {a: w / total for a, w in weights.items()}
        if self.memory_weight > 0.0:
            votes = self.memory.votes(observation_tokens(situation.observation))
            votes = {a: v for a, v in votes.items() if a in shares}
            if votes:
                cast = sum(votes.values())
                shares = {
                    a: (1.0 - self.memory_weight) * p + self.memory_weight * votes.get(a, 0) / cast
                    for a, p in shares.items()
                }
        best = max(shares.values())
        return rng.choice(sorted(a for a, p in shares.items() if p == best))

    @staticmethod
    def _holder(situation: Situation) -> int | None:
        """The previous actor, unless it dropped out (then nobody holds the task)."""
        holder = situation.previous_actor
        return None if holder is None or holder in situation.absent else holder

    def _route(self, situation: Situation) -> int | None:
        if not situation.present:
            return None
        holder = self._holder(situation)
        if holder is not None and situation.bids[holder] >= self.keep_bid:
            return holder
        suggested = self.memory.suggest(observation_tokens(situation.observation))
        if suggested in situation.absent:
            suggested = None
        if holder is None:
            if suggested is not None:
                return suggested
            return self._next_present(situation, situation.decision)
        if suggested is not None and suggested != holder:
            return suggested
        return self._next_present(situation, holder + 1)

    @staticmethod
    def _next_present(situation: Situation, start: int) -> int:
        """The first present agent in rotation from ``start`` (some agent is present)."""
        n = situation.n_agents
        return next((start + k) % n for k in range(n) if (start + k) % n not in situation.absent)

    def record_outcomes(
        self, situations: list[Situation], decisions: list[Decision], rewards: list[float]
    ) -> None:
        """Remember the decided steps that earned reward: who acted, in which observation."""
        for situation, decision, reward in zip(situations, decisions, rewards, strict=True):
            if decision.actor is not None and reward > 0.0:
                self.memory.add(observation_tokens(situation.observation), decision.actor, reward)
