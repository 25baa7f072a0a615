"""AgentNet, adapted step-wise [ours]: the current actor routes the task to the next actor.

Each decision step, in every live env, the agent that acted last (the *holder*) routes:

1. its router is its own bid policy (no new training): it writes its bid for acting now;
   a bid of at least ``keep_bid`` keeps the task (the holder acts again);
2. otherwise it forwards the task. The destination comes from a retrieval memory of past
   successful steps (steps whose reward was positive): the ``neighbours`` stored observations
   nearest to the current one by token overlap (Jaccard, at least ``min_overlap``) vote for the
   agent that acted there, weighted by overlap x reward; with no usable memory it forwards
   to the next agent in rotation. A step with no holder (episode start) takes the memory's
   choice, else agent ``decision mod N``.

Who acts now: the holder lives in the rule, keyed by the env object and stamped with a
fingerprint of the env's state after that step (decision index + shared observation text).
The stamp must match at the next decision, so a ``restore`` to any other state (a fork, a new
episode in a reused env) drops the holder rather than carrying a wrong one, and the branch
routes as at an episode start; an actor forced on a branch's first step becomes its holder
(``record_outcomes`` sees it). The memory is shared experience, not per-env state: it keeps the
newest ``memory_size`` successful steps of every episode played with this rule object.

Per step, with N agents and E live envs: one bid generation per env (by its holder, batched
per holder: at most N batches, E rows in all), a memory look-up over at most ``memory_size``
entries per env (CPU set overlaps), then the actor's action generation. That is 1 bid
generation per env instead of the auction's N. The router's bid is not a sealed-auction bid:
the step records ``winning_bid`` 0 (bucket-brigade credit becomes the per-step reward).
"""

from __future__ import annotations

import random
import re
from collections import deque
from dataclasses import dataclass

import torch

from bidswarm.coordination.base import CoordinationRule, Decision
from bidswarm.envs.base import MONOLITHIC, TextEnv
from bidswarm.rollout.swarm import Swarm

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


@dataclass(frozen=True)
class Holder:
    """Who acted last in an env, valid only while the env is still in ``state``."""

    agent: int
    state: tuple[int, str]


def env_state_stamp(env: TextEnv) -> tuple[int, str]:
    """The state fingerprint a holder is valid for: decision index and the shared observation."""
    return env.decisions_made, env.observation(MONOLITHIC)


class AgentNet(CoordinationRule):
    """The holder keeps the task or forwards it, helped by a memory of successful steps."""

    keep_bid = 0.6
    """The holder keeps acting when its own bid reaches this (the top two default levels)."""
    memory_size = 2048
    neighbours = 8
    min_overlap = 0.3

    def __init__(self) -> None:
        self.memory = SuccessMemory(self.memory_size, self.neighbours, self.min_overlap)
        self._holders: dict[int, Holder] = {}
        self._pending: dict[int, frozenset[str]] = {}
        """Each env's observation tokens at the last decision, stored once the reward is known."""

    def holder(self, env: TextEnv) -> int | None:
        """The agent that holds the task in ``env`` now (None: at a start or after a restore)."""
        held = self._holders.get(id(env))
        if held is None or held.state != env_state_stamp(env):
            return None
        return held.agent

    def decide(
        self, swarm: Swarm, envs: list[TextEnv], rng: random.Random, generator: torch.Generator
    ) -> list[Decision]:
        n = swarm.n_agents
        holders = [self.holder(env) for env in envs]
        tokens = [observation_tokens(env.observation(MONOLITHIC)) for env in envs]
        for env, env_tokens in zip(envs, tokens, strict=True):
            self._pending[id(env)] = env_tokens
        keeps = self._router_keeps(swarm, envs, holders, generator)
        decisions = []
        for env, holder, env_tokens, keep in zip(envs, holders, tokens, keeps, strict=True):
            if holder is not None and keep:
                actor = holder
            else:
                suggested = self.memory.suggest(env_tokens)
                if holder is None:
                    actor = suggested if suggested is not None else env.decisions_made % n
                elif suggested is not None and suggested != holder:
                    actor = suggested
                else:
                    actor = (holder + 1) % n
            decisions.append(Decision(actor=actor))
        return decisions

    def _router_keeps(
        self,
        swarm: Swarm,
        envs: list[TextEnv],
        holders: list[int | None],
        generator: torch.Generator,
    ) -> list[bool]:
        """Each holder's bid, one batch per holder agent: does it keep the task?"""
        keeps = [False] * len(envs)
        by_holder: dict[int, list[int]] = {}
        for pos, holder in enumerate(holders):
            if holder is not None:
                by_holder.setdefault(holder, []).append(pos)
        for agent, positions in sorted(by_holder.items()):
            bids = swarm.bid(agent, [envs[p] for p in positions], generator)
            for pos, bid in zip(positions, bids, strict=True):
                keeps[pos] = bid.level >= self.keep_bid
        return keeps

    def record_outcomes(
        self, envs: list[TextEnv], decisions: list[Decision], rewards: list[float]
    ) -> None:
        for env, decision, reward in zip(envs, decisions, rewards, strict=True):
            pending = self._pending.pop(id(env), None)
            if decision.actor is None:
                self._holders.pop(id(env), None)
                continue
            if pending is not None:
                self.memory.add(pending, decision.actor, reward)
            self._holders[id(env)] = Holder(decision.actor, env_state_stamp(env))
