"""Plain records of what happened in an episode, consumed by the credit rules and the losses."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple


@dataclass(frozen=True)
class Reply:
    """A generated reply: the tokens the policy saw and produced (for recomputing log-probs)."""

    agent: int
    prompt_ids: list[int]
    reply_ids: list[int]
    text: str


class Bid(NamedTuple):
    """One bid reply: its level (0 when malformed), the reply, and whether it parsed."""

    level: float
    reply: Reply
    parsed: bool


@dataclass
class Decision:
    """A coordination rule's choice for one environment; ``actor`` None skips the step.

    bids / bid_replies: parsed bid and bid reply per agent (empty when the rule asks none).
    runner_up / runner_up_bid: the best other bidder (forks let it act instead).
    action: set when the rule already produced the action (e.g. by scoring proposals).
    """

    actor: int | None
    winning_bid: float = 0.0
    runner_up: int | None = None
    runner_up_bid: float = 0.0
    bids: list[float] = field(default_factory=list)
    bid_replies: list[Reply] = field(default_factory=list)
    action: Reply | None = None


@dataclass
class StepRecord(Decision):
    """One decision step of one episode: the decision, and what the environment made of it.

    snapshot: environment state before the action, kept only for contested steps when forks
              are wanted.
    """

    decision: int = 0
    reward: float = 0.0
    valid_action: bool = True
    snapshot: Any = None

    @classmethod
    def of(cls, decision: Decision, index: int) -> StepRecord:
        """The record of ``decision`` made at decision step ``index``."""
        return cls(**{f.name: getattr(decision, f.name) for f in fields(Decision)}, decision=index)

    @property
    def contested(self) -> bool:
        """PAPER.md section 4: the runner-up bid is non-zero."""
        return self.actor is not None and self.runner_up_bid > 0.0


@dataclass
class Episode:
    """A whole episode in one world; ``steps`` in decision order, skipped steps included."""

    seed: int
    steps: list[StepRecord] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def total_reward(self) -> float:
        return sum(step.reward for step in self.steps)

    @property
    def acting_steps(self) -> list[StepRecord]:
        """The chain of actors that credit flows along (skipped steps dropped, PAPER.md 3)."""
        return [step for step in self.steps if step.actor is not None]

    def reward_from(self, decision: int) -> float:
        """Environment reward from ``decision`` (inclusive) to the end: a fork's branch score."""
        return sum(step.reward for step in self.steps if step.decision >= decision)


@dataclass(frozen=True)
class PreferencePair:
    """Two bid replies of the same agent in the same context; ``preferred`` led to more reward."""

    agent: int
    prompt_ids: list[int]
    preferred_ids: list[int]
    rejected_ids: list[int]
