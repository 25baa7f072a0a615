"""Plain records of what happened in an episode: what the collector turns into batches."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from bidswarm.coordination.base import Decision
from bidswarm.envs.experts import expert_owners
from bidswarm.envs.memory import MemoryTrace


@dataclass(frozen=True)
class Reply:
    """A generated reply: the tokens the policy saw and produced (for recomputing log-probs).

    ``sampled_logprobs``: the rollout engine's log-prob of each reply token when an engine
    sampled it (empty for a reply the collector wrote, e.g. a bid drawn below the runner-up);
    the learner compares its own with them (``engine/logprob_gap_*``, ``rl.importance_cap``).
    """

    agent: int
    prompt_ids: list[int]
    reply_ids: list[int]
    text: str
    sampled_logprobs: tuple[float, ...] = field(default=(), compare=False)


class Bid(NamedTuple):
    """One bid reply: its level (0 when malformed), the reply, and whether it parsed;
    ``bonus``: what ``bids.explore`` adds to it when the auction picks the winner (training
    only, a level reader's spread; the recorded level stays the bid)."""

    level: float
    reply: Reply
    parsed: bool
    bonus: float = 0.0


@dataclass
class StepRecord:
    """One decision step of one episode: the rule's decision, what the collector sampled for
    it, and what the environment made of it.

    index:    the decision step of the episode (skipped steps count).
    bids:     the bids sampled for the rule, by agent (empty when it asks none).
    action:   the actor's action reply (None when the step was skipped).
    snapshot: environment state before the action, kept only for contested steps when forks
              are wanted.
    memory:   the notes the actor read and the note it wrote (None: the memory is off).
    message:  the environment's feedback on the step (shown in the next observation).
    proposal_scores: each present agent's proposal -> its mean peer score (its own bid on it
              under coordination=proposal_auction), what a rule that
              asks for proposals read (:attr:`Situation.proposal_scores`; empty otherwise).
    expert_levels: each role's expert bid in the state before the step, snapped to the bid
              levels (``envs.experts.expert_levels``): whom the task's expert would let act
              (:attr:`expert_owners`) and the bid labels of the swarm's own states; empty for
              the monolithic agent (no roles to pick from).
    followed_expert: whether the step went as the experts' play would have gone from an
              expert state (the expert's owner acted and wrote the expert's action, or the
              experts would have skipped and the step was skipped); None once the episode has
              left the experts' path, in a fork branch (which starts mid-episode) and for the
              monolithic agent. :attr:`Episode.on_expert_path` reads it.
    """

    index: int
    decision: Decision
    bids: dict[int, Bid] = field(default_factory=dict)
    action: Reply | None = None
    reward: float = 0.0
    valid_action: bool = True
    snapshot: Any = None
    open_reward: float | None = None
    """With the snapshot: the reward still open before the step (``TextEnv.open_reward``),
    what ``rl.fork_selection=open_reward`` reads."""
    memory: MemoryTrace | None = None
    message: str = ""
    proposal_scores: dict[int, float] = field(default_factory=dict)
    expert_levels: dict[str, float] = field(default_factory=dict)
    followed_expert: bool | None = None

    @property
    def actor(self) -> int | None:
        return self.decision.actor

    @property
    def expert_owners(self) -> frozenset[str]:
        """The roles the task's expert would let act here (empty: it would skip)."""
        return expert_owners(self.expert_levels)

    @property
    def contested(self) -> bool:
        """docs/method.md section 4: the runner-up bid is non-zero."""
        return self.decision.contested


@dataclass
class Episode:
    """A whole episode in one world; ``steps`` in decision order, skipped steps included."""

    seed: int
    steps: list[StepRecord] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    final_progress: float | None = None
    """The progress score of the final state (``TextEnv.progress``), read when the episode
    keeps snapshots (a bid update's: ``rl.fork_tie_break`` compares it); None otherwise."""

    @property
    def total_reward(self) -> float:
        return sum(step.reward for step in self.steps)

    @property
    def acting_steps(self) -> list[StepRecord]:
        """The chain of actors that credit flows along (skipped steps dropped, docs/method.md
        section 3)."""
        return [step for step in self.steps if step.actor is not None]

    @property
    def on_expert_path(self) -> list[bool]:
        """Per step, whether its state is one the experts' own play reaches (every earlier step
        :attr:`StepRecord.followed_expert`): the states the bid demonstrations label."""
        flags, on_path = [], True
        for step in self.steps:
            flags.append(on_path)
            on_path = on_path and step.followed_expert is True
        return flags

    def reward_from(self, index: int) -> float:
        """Environment reward from step ``index`` (inclusive) to the end: a fork's branch score."""
        return sum(step.reward for step in self.steps if step.index >= index)


@dataclass(frozen=True)
class PreferencePair:
    """Two bid replies of the same agent in the same context; ``preferred`` led to more reward."""

    agent: int
    prompt_ids: list[int]
    preferred_ids: list[int]
    rejected_ids: list[int]
    weight: float = 1.0
    """The pair's weight in the Bradley-Terry mean (Eq. 3): the chance that the paper's rejection
    sampling would have kept its fork (``rl.bid_resample`` ``weighted_below_runner_up`` or
    ``sampled_below_runner_up``), else 1."""
    preferred_sampled_logprobs: tuple[float, ...] = ()
    rejected_sampled_logprobs: tuple[float, ...] = ()
    """The engine's log-probs of each reply's tokens, where an engine sampled it
    (:attr:`Reply.sampled_logprobs`; empty for a reply the collector drew itself)."""
    tied: bool = False
    """The fork's sides tied: a pair with label 1/2 (``rl.bt_ties=half_label``)."""
