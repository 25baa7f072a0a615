"""AgentNet, adapted step-wise [ours]: the current actor routes the task to the next actor.

Each decision step, in every live env, the agent that acted at the previous step (the
*holder*, ``Situation.previous_actor``) routes:

1. its router is its own bid policy (no new training): the rule asks the collector for the
   holder's bid; a bid of at least ``keep_bid`` keeps the task (the holder acts again);
2. otherwise it forwards the task. The destination comes from a retrieval memory of past
   successful steps (steps whose reward was positive): the ``neighbours`` stored observations
   nearest to the current one by token overlap (Jaccard, at least ``min_overlap``) vote for the
   agent that acted there, weighted by overlap x reward; with no usable memory it forwards
   to the next agent in rotation. A step with no holder (episode start, after a skipped step)
   takes the memory's choice, else agent ``decision mod N``.

The holder is the previous step's actor of the same episode or fork branch, which the
collector knows: a fork branch's forced first actor is the holder of its second step. The
memory is shared experience, not per-env state: it keeps the newest ``memory_size`` successful
steps of every episode played with this rule object (``record_outcomes``).

Per step, with N agents and E live envs: one bid generation per env with a holder (batched per
holder: at most N batches, E rows in all), a memory look-up over at most ``memory_size`` entries
per env (CPU set overlaps), then the actor's action generation. That is 1 bid generation per env
instead of the auction's N. The router's bid is not a sealed-auction bid: the step records
``winning_bid`` 0 (bucket-brigade credit becomes the per-step reward).
"""

from __future__ import annotations

import random
import re
from collections import deque
from dataclasses import dataclass

from bidswarm.checks import Parameter, at_least, unit_interval
from bidswarm.coordination.base import (
    CoordinationConfig,
    CoordinationRule,
    Decision,
    Situation,
    register,
)

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

    def suggest(self, tokens: frozenset[str]) -> int | None:
        """The actor the nearest successful steps vote for, or None without a close one."""
        scored = [(token_overlap(tokens, entry.tokens), entry) for entry in self.entries]
        close = [(overlap, e) for overlap, e in scored if overlap >= self.min_overlap]
        close.sort(key=lambda pair: pair[0], reverse=True)
        votes: dict[int, float] = {}
        for overlap, entry in close[: self.neighbours]:
            votes[entry.actor] = votes.get(entry.actor, 0.0) + overlap * entry.reward
        if not votes:
            return None
        # Highest vote; the lowest agent index among equal votes keeps it deterministic.
        return min(votes, key=lambda agent: (-votes[agent], agent))


@dataclass
class AgentNetConfig(CoordinationConfig):
    """AgentNet's router and memory (``conf/coordination/agentnet.yaml``)."""

    keep_bid: float = 0.6
    """The holder keeps acting when its own bid reaches this (the top two default levels)."""
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
        self.memory = SuccessMemory(config.memory_size, config.neighbours, config.min_overlap)

    @classmethod
    def parameters(cls) -> list[Parameter]:
        return [
            *super().parameters(),
            Parameter("keep_bid", unit_interval()),  # a bid level: 0 always keeps
            Parameter("memory_size", at_least(1)),
            Parameter("neighbours", at_least(1)),
            Parameter("min_overlap", unit_interval()),  # a Jaccard overlap
        ]

    @classmethod
    def from_config(cls, config: AgentNetConfig) -> AgentNet:
        return cls(config)

    def bidders(self, situation: Situation) -> list[int]:
        """Only the holder bids (when present): its bid decides whether it keeps the task."""
        holder = self._holder(situation)
        return [] if holder is None else [holder]

    def decide(self, situations: list[Situation], rng: random.Random) -> list[Decision]:
        return [Decision(actor=self._route(situation)) for situation in situations]

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
