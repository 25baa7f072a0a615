"""A coordination rule: a pure decision of who acts in each live environment.

A rule never touches a model or an environment. It declares what it decides from
(:attr:`CoordinationRule.asks_bids`, :attr:`~CoordinationRule.asks_proposals` and how peers
score them, :attr:`~CoordinationRule.asks_routes`, :attr:`~CoordinationRule.reads_observations`)
and which decisions it learns from demonstrations (:attr:`~CoordinationRule.decisions_learned`);
the collector (``rollout/loop.py``) samples
exactly that, batched per agent over environments, and hands it over as one
:class:`Situation` per environment. The rule returns one :class:`Decision` per environment,
using only those situations, its own memory and the ``random.Random`` it is given. So every rule
is unit-tested without any model (``tests/test_coordination.py``).

A rule registers itself under its ``coordination.name`` with :func:`register` and declares its
parameters with their allowed values (:meth:`CoordinationRule.parameters`), so that
``config.validate`` refuses a bad value before any model loads.
"""

from __future__ import annotations

import abc
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from omegaconf import MISSING

from bidswarm.algorithms.auction import PAPER_BID_LEVELS
from bidswarm.checks import Allowed, Parameter, Problems, at_least, parameter_problems
from bidswarm.envs.experts import format_bid

DECIDER = -1
"""The population's decider in :attr:`Situation.routes` and :meth:`CoordinationRule.routers`: a
model that reads every role's view and names who acts, but never acts itself (a rule that
:attr:`~CoordinationRule.needs_decider`)."""
DECIDER_NAME = "router"
"""The decider's name in its prompts and its saved folder."""

ACTION_LOGPROB = "action_logprob"
"""Peers score a proposal by its mean token log-prob under their own action prompt."""
USEFULNESS = "usefulness"
"""Peers score a proposal by the expected level of their reply to the score prompt (a trained
decision: ``PromptTemplate.score``)."""
PROPOSAL_SCORINGS = (ACTION_LOGPROB, USEFULNESS)

SCORE = "score"
"""A decision learned from demonstrations: every agent rates the other roles' replies."""
OWN_SCORE = "own_score"
"""A decision learned from demonstrations: every agent rates its own reply (its bid on it)."""
ROUTE = "route"
"""A decision learned from demonstrations: every agent names who acts next from its own view."""
PICK = "pick"
"""A decision learned from demonstrations: the decider names who acts next from every view."""
LEARNABLE_DECISIONS = (SCORE, OWN_SCORE, ROUTE, PICK)
DECISION_KINDS = (SCORE, OWN_SCORE, ROUTE)
"""The :class:`~bidswarm.envs.experts.Demonstration` kinds of the learned decisions (the
decider's picks are ``route`` demonstrations of its own)."""


@dataclass
class CoordinationConfig:
    """Who acts each step (``conf/coordination/``). ``bid_levels``: the quantized bids of
    docs/method.md section 2; a rule with parameters extends this schema (see
    ``AgentNetConfig``)."""

    name: str = MISSING
    bid_levels: list[float] = field(default_factory=lambda: list(PAPER_BID_LEVELS))
    replicas: int = 1
    """Copies of each role in the population (population scaling)."""


@dataclass
class LearnedDecisionConfig(CoordinationConfig):
    """The schema of a rule whose models may learn their decision from demonstrations."""

    relabel_rounds: int = 0
    """[ours] After the cold start, rounds of labels in the swarm's own states (DAgger): play
    the swarm on the demonstration worlds under the rule, label every decision prompt it read
    with the task expert's choice there, fine-tune on them for one epoch (``run/relabel.py``
    for bids; counted in ``sft/flops``). 0: off; only for a rule that learns its decision."""


def relabel_problems(config: Any, learns: bool, when: str) -> list[str]:
    """The line refusing ``relabel_rounds`` > 0 of a rule configured to learn nothing."""
    problems = Problems()
    problems.require(
        learns or config.relabel_rounds <= 0,
        "coordination.relabel_rounds",
        config.relabel_rounds,
        f"0 unless {when} (the rule learns no decision to relabel)",
    )
    return problems


def likeliest(logprobs: Mapping[int, float], rng: random.Random) -> int | None:
    """The agent with the highest log-prob (ties, e.g. replicas of one role: uniform by
    ``rng``); None when there is none."""
    if not logprobs:
        return None
    top = max(logprobs.values())
    return rng.choice(sorted(agent for agent, value in logprobs.items() if value == top))


def peer_scores(
    scores: Sequence[Sequence[float]], present: Sequence[int] | None = None
) -> list[float]:
    """Mean score of each present agent's proposal over the other present agents
    (``scores[scorer][proposer]``), in the order of ``present`` (default: every agent).

    A single agent has no peers: its own score stands.
    """
    agents = list(range(len(scores))) if present is None else list(present)
    if len(agents) == 1:
        return [scores[agents[0]][agents[0]]]
    return [sum(scores[j][i] for j in agents if j != i) / (len(agents) - 1) for i in agents]


@dataclass(frozen=True)
class Situation:
    """What a rule knows of one live environment at one decision step.

    n_agents:       agents in the swarm (indices 0..n_agents-1).
    decision:       decision steps already taken in this episode (skipped ones included).
    previous_actor: who acted at the previous step of this episode or fork branch (None at
                    the first step or after a skipped step).
    observation:    the shared (monolithic) observation; only for rules that read it.
    bids:           parsed bid level of each agent that :meth:`CoordinationRule.bidders` named
                    (a malformed bid reply counts as 0, docs/method.md section 2).
    peer_scores:    ``peer_scores[scorer][proposer]``: the mean token log-prob of ``proposer``'s
                    action proposal under ``scorer``'s own action prompt, for rules that ask
                    for proposals; the diagonal is only filled for a lone agent, or (only it)
                    with ``own_scores``.
    own_scores:     whether each agent scored its own proposal only (a rule that
                    :attr:`~CoordinationRule.scores_own_proposal`).
    absent:         agents that dropped out at this step (evaluation ``dropout``): they neither
                    bid, propose nor act, and every rule routes around them.
    expert_choice:  the present agents whose role the task's scripted expert would let act
                    (empty: it would skip); only for rules that ask for it.
    bid_bonus:      what exploration adds to each bid when the winner is picked (training
                    only, ``bids.explore``); the decision records the bid itself.
    routes:         ``routes[router][agent]``: the log-prob that ``router`` (an agent, or
                    :data:`DECIDER`) replies ``agent``'s role to its route prompt (who acts
                    next), for each router the rule named (:meth:`CoordinationRule.routers`)
                    and each present agent; only for rules that ask for routes.
    """

    n_agents: int
    decision: int
    previous_actor: int | None = None
    observation: str = ""
    bids: Mapping[int, float] = field(default_factory=dict)
    peer_scores: tuple[tuple[float, ...], ...] = ()
    own_scores: bool = False
    absent: frozenset[int] = frozenset()
    expert_choice: frozenset[int] = frozenset()
    bid_bonus: Mapping[int, float] = field(default_factory=dict)
    routes: Mapping[int, Mapping[int, float]] = field(default_factory=dict)

    @property
    def present(self) -> list[int]:
        """The agents that may bid and act at this step, in index order."""
        return [agent for agent in range(self.n_agents) if agent not in self.absent]

    @property
    def proposal_scores(self) -> dict[int, float]:
        """Each present agent's proposal -> its mean score by the other present agents
        (:func:`peer_scores`), or with ``own_scores`` its proposer's own, in index order; empty
        when the rule asked for no proposals."""
        if not self.peer_scores:
            return {}
        present = self.present
        if self.own_scores:
            return {agent: self.peer_scores[agent][agent] for agent in present}
        return dict(zip(present, peer_scores(self.peer_scores, present), strict=True))


@dataclass(frozen=True)
class Decision:
    """A rule's choice for one environment; ``actor`` None skips the step.

    runner_up / runner_up_bid: the best other bidder (a fork lets it act instead); a step is
    contested when ``runner_up_bid`` is non-zero (docs/method.md section 4) and it is ``forkable``.
    bids_read: whether ``winning_bid`` is the actor's bid level at this step (the b_t of Eq. 2
        of MPT, what credit and the winning-bid metrics read); False: the step was decided
        without the bids (its ``winning_bid`` counts as 0).
    forkable: whether a contested step may be forked (the runner-up acts instead, Eq. 3).
    Both None: the rule's class-level declaration (:attr:`CoordinationRule.records_winning_bids`,
    :attr:`CoordinationRule.makes_contested_steps`), which the collector writes in
    (:meth:`CoordinationRule.settle`): a rule decides per step only where it needs to.
    """

    actor: int | None
    winning_bid: float = 0.0
    runner_up: int | None = None
    runner_up_bid: float = 0.0
    bids_read: bool | None = None
    forkable: bool | None = None

    @property
    def contested(self) -> bool:
        return self.forkable is not False and self.actor is not None and self.runner_up_bid > 0.0

    @property
    def credited_bid(self) -> float:
        """The b_t that credit reads: ``winning_bid`` when the bids decided the step, else 0."""
        return self.winning_bid if self.bids_read is not False else 0.0

    @property
    def credited_runner_up_bid(self) -> float:
        """The runner-up's bid that credit reads (a second price): ``runner_up_bid`` when the
        bids decided the step, else 0."""
        return self.runner_up_bid if self.bids_read is not False else 0.0


def _written_apart(levels: list[float]) -> bool:
    written = [format_bid(b) for b in levels]
    return len(set(written)) == len(written)


BID_LEVELS = (
    Parameter(
        "bid_levels",
        Allowed(
            lambda levels: bool(levels) and all(0.0 <= b <= 1.0 for b in levels) and 0.0 in levels,
            "levels must lie in [0, 1] and include 0 (pass)",
            [0.2, 0.4],
        ),
    ),
    Parameter(
        "bid_levels",
        Allowed(
            lambda levels: any(b > 0 for b in levels),
            "need a level above 0 (with only 0 every step is skipped)",
            [0.0],
        ),
    ),
    Parameter(
        "bid_levels",
        Allowed(
            _written_apart,
            "levels must differ as agents write them (one decimal, e.g. 0.2 and 0.24 are both 0.2)",
            [0.0, 0.21, 0.24],
        ),
    ),
)
"""What every rule's ``bid_levels`` must be (docs/method.md section 2: quantized bids, 0 passes)."""


class CoordinationRule(abc.ABC):
    """Picks the actor of every live environment from the situations the collector gathered."""

    name: ClassVar[str]
    """The ``coordination.name`` the rule is registered under (:func:`register`)."""
    Config: ClassVar[type[CoordinationConfig]] = CoordinationConfig
    """The schema of the rule's YAML (``conf/coordination/<name>.yaml``)."""
    monolithic: ClassVar[bool] = False
    """Whether the rule needs the population of one agent that owns every role."""
    asks_bids: bool = False
    """Whether the collector samples the bids of the agents :meth:`bidders` names (a rule may
    set it per instance, from its config)."""
    asks_proposals: ClassVar[bool] = False
    """Whether the collector samples every agent's action proposal and has every agent score
    the others' (the acting proposal is then the action: no second generation)."""
    scores_own_proposal: ClassVar[bool] = False
    """Whether each agent scores only its own proposal (a sealed auction on proposals) rather
    than the other agents'; :attr:`Situation.peer_scores` then holds the diagonal."""
    proposal_scoring: str = ACTION_LOGPROB
    """How peers score the proposals (:data:`PROPOSAL_SCORINGS`): :data:`ACTION_LOGPROB` or
    :data:`USEFULNESS` (a rule may set it per instance, from its config)."""
    asks_routes: bool = False
    """Whether the collector reads, for each router :meth:`routers` names, how likely it names
    each present agent's role as the next actor (:attr:`Situation.routes`)."""
    needs_decider: ClassVar[bool] = False
    """Whether the population holds a decider (:data:`DECIDER`) besides the acting agents: a
    model of the agents' architecture that only routes, trained with them in the cold start."""
    decisions_learned: frozenset[str] = frozenset()
    """Which decisions of :data:`LEARNABLE_DECISIONS` the rule's models learn from the experts'
    demonstrations in the cold start, in place of the bids when the rule asks no bids (a rule
    may set it per instance, from its config)."""
    reads_observations: ClassVar[bool] = False
    """Whether situations carry the shared observation text."""
    asks_expert: ClassVar[bool] = False
    """Whether situations carry the task expert's choice (:attr:`Situation.expert_choice`):
    a reference rule, which training refuses (:attr:`evaluation_only`)."""
    evaluation_only: ClassVar[bool] = False
    """Whether the rule may only evaluate a trained swarm (``python -m bidswarm.evaluate``),
    not train one: ``python -m bidswarm.train`` refuses it."""
    makes_contested_steps: ClassVar[bool] = False
    """Whether decisions name a bidding runner-up, so steps can be contested, forked and the
    bids trained by bid updates (Eq. 3): the schedule has bid updates, and the default of each
    decision's :attr:`Decision.forkable`."""
    records_winning_bids: ClassVar[bool] = False
    """Whether each decision's ``winning_bid`` is the actor's bid level (the b_t of Eq. 2 of
    MPT): the default of each decision's :attr:`Decision.bids_read`; the other rules record 0
    at every step."""

    @classmethod
    def parameters(cls) -> list[Parameter]:
        """Every field of :attr:`Config` (but ``name``) with its allowed values; a rule with
        parameters extends the list (``tests/test_coordination.py`` checks that none is left
        out and that each refused value is refused naming its key)."""
        parameters = [*BID_LEVELS, Parameter("replicas", at_least(1))]
        if issubclass(cls.Config, LearnedDecisionConfig):
            parameters.append(Parameter("relabel_rounds", at_least(0)))
        return parameters

    @classmethod
    def problems(cls, config: Any) -> list[str]:
        """``coordination.<key>=<value>: what is allowed`` for each parameter of ``config`` (the
        rule's :attr:`Config` or its ``DictConfig``) that is not allowed."""
        return parameter_problems("coordination", config, cls.parameters())

    @classmethod
    def from_config(cls, config: CoordinationConfig) -> CoordinationRule:
        """The rule configured by ``config``; rules with parameters read them here."""
        return cls()

    def bidders(self, situation: Situation) -> list[int]:
        """The agents whose bids the rule needs in this situation (rules that ask for bids)."""
        return []

    def routers(self, situation: Situation) -> list[int]:
        """The agents (or :data:`DECIDER`) whose route the rule needs in this situation (rules
        that ask for routes)."""
        return []

    @abc.abstractmethod
    def decide(self, situations: list[Situation], rng: random.Random) -> list[Decision]:
        """One decision per situation; ``rng`` is the only source of randomness. A decision may
        say whether its bids were read and whether it may be forked (:class:`Decision`);
        unsaid, the rule's class-level declarations hold."""

    def settle(self, decisions: list[Decision]) -> list[Decision]:
        """``decisions`` with every unsaid :attr:`Decision.bids_read` and
        :attr:`Decision.forkable` set to the rule's declaration (what the collector records)."""
        settled = []
        for decision in decisions:
            if decision.forkable and not self.makes_contested_steps:
                raise ValueError(
                    f"coordination={self.name}: a decision says forkable=True, but the rule "
                    "declares no contested steps (makes_contested_steps): its schedule has no "
                    "bid updates to fork them"
                )
            settled.append(
                replace(
                    decision,
                    bids_read=self.records_winning_bids
                    if decision.bids_read is None
                    else decision.bids_read,
                    forkable=self.makes_contested_steps
                    if decision.forkable is None
                    else decision.forkable,
                )
            )
        return settled

    def record_outcomes(
        self, situations: list[Situation], decisions: list[Decision], rewards: list[float]
    ) -> None:
        """The rewards that the decided steps earned; rules with a memory override it."""
        return None  # most rules keep no state between steps


RULES: dict[str, type[CoordinationRule]] = {}
"""``coordination.name`` -> rule class, filled by :func:`register` as each rule's module is
imported (``coordination/__init__.py`` imports every module of the package)."""


def register(name: str) -> Callable[[type[CoordinationRule]], type[CoordinationRule]]:
    """Class decorator: the rule ``coordination=<name>`` selects (``conf/coordination/<name>.yaml``
    holds ``name: <name>``)."""

    def add(rule: type[CoordinationRule]) -> type[CoordinationRule]:
        if name in RULES and RULES[name] is not rule:
            raise ValueError(f"two coordination rules are registered as {name!r}")
        rule.name = name
        RULES[name] = rule
        return rule

    return add
