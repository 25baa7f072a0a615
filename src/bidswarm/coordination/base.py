"""A coordination rule: a pure decision of who acts in each live environment.

A rule never touches a model or an environment. It declares what it decides from
(:attr:`CoordinationRule.asks_bids`, :attr:`~CoordinationRule.asks_proposals`,
:attr:`~CoordinationRule.reads_observations`); the collector (``rollout/loop.py``) samples
exactly that, batched per agent over environments, and hands it over as one
:class:`Situation` per environment. The rule returns one :class:`Decision` per environment,
using only those situations, its own memory and the ``random.Random`` it is given. So every rule
is unit-tested without any model (``tests/test_coordination.py``).
"""

from __future__ import annotations

import abc
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from omegaconf import MISSING


@dataclass
class CoordinationConfig:
    """Who acts each step (``conf/coordination/``). ``bid_levels``: the quantized bids of
    PAPER.md section 2; a rule with parameters extends this schema (see ``AgentNetConfig``)."""

    name: str = MISSING
    bid_levels: list[float] = field(default_factory=lambda: [0.0, 0.2, 0.4, 0.6, 0.8])
    replicas: int = 1
    """Copies of each role in the population (population scaling)."""


@dataclass(frozen=True)
class Situation:
    """What a rule knows of one live environment at one decision step.

    n_agents:       agents in the swarm (indices 0..n_agents-1).
    decision:       decision steps already taken in this episode (skipped ones included).
    previous_actor: who acted at the previous step of this episode or fork branch (None at
                    the first step or after a skipped step).
    observation:    the shared (monolithic) observation; only for rules that read it.
    bids:           parsed bid level of each agent that :meth:`CoordinationRule.bidders` named
                    (a malformed bid reply counts as 0, PAPER.md section 2).
    peer_scores:    ``peer_scores[scorer][proposer]``: the mean token log-prob of ``proposer``'s
                    action proposal under ``scorer``'s own action prompt, for rules that ask
                    for proposals; the diagonal is only filled for a lone agent.
    absent:         agents that dropped out at this step (evaluation ``dropout``): they neither
                    bid, propose nor act, and every rule routes around them.
    """

    n_agents: int
    decision: int
    previous_actor: int | None = None
    observation: str = ""
    bids: Mapping[int, float] = field(default_factory=dict)
    peer_scores: tuple[tuple[float, ...], ...] = ()
    absent: frozenset[int] = frozenset()

    @property
    def present(self) -> list[int]:
        """The agents that may bid and act at this step, in index order."""
        return [agent for agent in range(self.n_agents) if agent not in self.absent]


@dataclass(frozen=True)
class Decision:
    """A rule's choice for one environment; ``actor`` None skips the step.

    runner_up / runner_up_bid: the best other bidder (a fork lets it act instead); a step is
    contested when ``runner_up_bid`` is non-zero (PAPER.md section 4).
    """

    actor: int | None
    winning_bid: float = 0.0
    runner_up: int | None = None
    runner_up_bid: float = 0.0

    @property
    def contested(self) -> bool:
        return self.actor is not None and self.runner_up_bid > 0.0


class CoordinationRule(abc.ABC):
    """Picks the actor of every live environment from the situations the collector gathered."""

    Config: ClassVar[type[CoordinationConfig]] = CoordinationConfig
    """The schema of the rule's YAML (``conf/coordination/<name>.yaml``)."""
    monolithic: ClassVar[bool] = False
    """Whether the rule needs the population of one agent that owns every role."""
    asks_bids: ClassVar[bool] = False
    """Whether the collector samples the bids of the agents :meth:`bidders` names."""
    asks_proposals: ClassVar[bool] = False
    """Whether the collector samples every agent's action proposal and has every agent score
    the others' (the acting proposal is then the action: no second generation)."""
    reads_observations: ClassVar[bool] = False
    """Whether situations carry the shared observation text."""
    makes_contested_steps: ClassVar[bool] = False
    """Whether decisions name a bidding runner-up, so steps can be contested, forked and the
    bids trained by bid updates (Eq. 3)."""
    records_winning_bids: ClassVar[bool] = False
    """Whether each decision's ``winning_bid`` is the actor's bid level (the b_t of Eq. 2 of
    MPT); the other rules record 0 at every step."""

    @classmethod
    def from_config(cls, config: CoordinationConfig) -> CoordinationRule:
        """The rule configured by ``config``; rules with parameters read them here."""
        return cls()

    def bidders(self, situation: Situation) -> list[int]:
        """The agents whose bids the rule needs in this situation (rules that ask for bids)."""
        return []

    @abc.abstractmethod
    def decide(self, situations: list[Situation], rng: random.Random) -> list[Decision]:
        """One decision per situation; ``rng`` is the only source of randomness."""

    def record_outcomes(
        self, situations: list[Situation], decisions: list[Decision], rewards: list[float]
    ) -> None:
        """The rewards that the decided steps earned; rules with a memory override it."""
        return None  # most rules keep no state between steps
