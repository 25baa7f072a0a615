"""What the collector hands the learner: one plain batch per agent, and how it is made.

An action update's batches come from the episodes by the configured credit rule (Eq. 2, the
collector's post-processing step, built once per run by ``algorithms.credit.make_credit``); a bid
update's from the forks' preference pairs (Eq. 3).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from bidswarm.agents.policy import AgentPolicy, micro_batches
from bidswarm.algorithms.credit import CreditRule
from bidswarm.rollout.keyed import group_by
from bidswarm.rollout.memory_credit import episode_reads
from bidswarm.rollout.records import Episode, PreferencePair


class Forward(NamedTuple):
    """One forward of the learner over a batch: which of the batch's rows (or pairs) it holds,
    and the prompts and replies it computes."""

    part: range
    prompt_ids: list[list[int]]
    reply_ids: list[list[int]]


class LearnerBatch:
    """What every batch the learner takes shares: its forwards (:meth:`forwards`, each batch
    kind its own), and the tokens they compute (the FLOP ledger's)."""

    def forwards(self, policy: AgentPolicy, token_budget: int | None) -> list[Forward]:
        raise NotImplementedError

    def learner_tokens(self, policy: AgentPolicy, token_budget: int | None) -> int:
        """Tokens the learner's forwards over this batch compute (the FLOP ledger's)."""
        return sum(
            policy.forward_tokens(f.prompt_ids, f.reply_ids)
            for f in self.forwards(policy, token_budget)
        )


class RowBatch(LearnerBatch):
    """A batch of (prompt, reply) rows, each trained on its reply tokens."""

    prompt_ids: list[list[int]]
    reply_ids: list[list[int]]

    def forwards(self, policy: AgentPolicy, token_budget: int | None) -> list[Forward]:
        """The learner's forwards over this batch: consecutive rows whose forward stays within
        ``token_budget`` tokens (:func:`micro_batches` of
        :meth:`AgentPolicy.forward_row_tokens`)."""
        rows = policy.forward_row_tokens(self.prompt_ids, self.reply_ids)
        return [
            Forward(part, [self.prompt_ids[i] for i in part], [self.reply_ids[i] for i in part])
            for part in micro_batches(rows, token_budget)
        ]


@dataclass(frozen=True)
class ActionBatch(RowBatch):
    """One agent's acting steps: the prompt it saw, the action it wrote, the step's credit and
    its decision index in the episode (what ``rl.baseline=role_decision_mean`` groups by), and
    the rollout engine's log-prob of each action token (:attr:`Reply.sampled_logprobs`)."""

    agent: int
    prompt_ids: list[list[int]]
    reply_ids: list[list[int]]
    credit: list[float]
    decisions: list[int]
    sampled_logprobs: list[tuple[float, ...]]


@dataclass(frozen=True)
class BidBatch(LearnerBatch):
    """One agent's preference pairs: two bid replies in the same context, preferred first, and
    each pair's weight in the Bradley-Terry mean (:attr:`PreferencePair.weight`)."""

    agent: int
    prompt_ids: list[list[int]]
    preferred_ids: list[list[int]]
    rejected_ids: list[list[int]]
    weights: list[float]
    preferred_sampled_logprobs: list[tuple[float, ...]]
    rejected_sampled_logprobs: list[tuple[float, ...]]
    tied: list[bool]
    """Per pair, whether its fork tied (label 1/2, ``rl.bt_ties=half_label``)."""

    def forwards(self, policy: AgentPolicy, token_budget: int | None) -> list[Forward]:
        """The learner's forwards over this batch: a pair is two rows of one forward (its
        prompt with the preferred reply, then with the rejected one: the rows of a forward are
        its pairs' preferred rows, then their rejected rows), so consecutive pairs whose longer
        row fits half of ``token_budget`` per row (:func:`micro_batches`)."""
        pairs = zip(self.preferred_ids, self.rejected_ids, strict=True)
        longer = [max(preferred, rejected, key=len) for preferred, rejected in pairs]
        rows = policy.forward_row_tokens(self.prompt_ids, longer)
        half = None if token_budget is None else token_budget // 2
        return [
            Forward(
                part,
                [self.prompt_ids[i] for i in part] * 2,
                [self.preferred_ids[i] for i in part] + [self.rejected_ids[i] for i in part],
            )
            for part in micro_batches(rows, half)
        ]


@dataclass(frozen=True)
class BidLabelBatch(RowBatch):
    """One agent's bid prompts with the task expert's bid at each (its canonical reply): the
    targets of the bid anchor (``bids.anchor_coef``), a negative log-likelihood in action
    updates."""

    agent: int
    prompt_ids: list[list[int]]
    reply_ids: list[list[int]]


class LevelRowsBatch(LearnerBatch):
    """A batch of bid prompts, each scored with the canonical reply of every bid level (a level
    distribution per prompt)."""

    prompt_ids: list[list[int]]
    level_ids: list[list[int]]
    """The canonical reply of each bid level, in the agent's tokens."""

    def forwards(self, policy: AgentPolicy, token_budget: int | None) -> list[Forward]:
        """Each prompt with every level's reply, prompts whose rows fit ``token_budget``
        together (the rows of a forward: prompt 0 with each level, then prompt 1, ...)."""
        longest = max(self.level_ids, key=len)
        rows = policy.forward_row_tokens(self.prompt_ids, [longest] * len(self.prompt_ids))
        levels = len(self.level_ids)
        share = None if token_budget is None else max(token_budget // levels, 1)
        return [
            Forward(
                part,
                [self.prompt_ids[i] for i in part for _ in self.level_ids],
                [reply for _ in part for reply in self.level_ids],
            )
            for part in micro_batches(rows, share)
        ]


@dataclass(frozen=True)
class BidValueBatch(LevelRowsBatch):
    """One agent's bid prompts at forked states with its measured value of acting there, in
    bid units (``bids.loss=calibrated``), and the canonical reply of every bid level: the
    learner moves the agent's distribution over the levels toward each value."""

    agent: int
    prompt_ids: list[list[int]]
    values: list[float]
    levels: list[float]
    level_ids: list[list[int]]


@dataclass(frozen=True)
class BidLevelMassBatch(LevelRowsBatch):
    """[ours] One agent's bid prompts with the canonical reply of every bid level: the targets
    of the bid anchor on the levels (``bids.anchor_target=levels``), which raises the
    probability that the reply is a level, whichever level it is."""

    agent: int
    prompt_ids: list[list[int]]
    level_ids: list[list[int]]


AnchorBatch = BidLabelBatch | BidLevelMassBatch
"""The bid anchor's batch of one agent (``bids.anchor_target``), added to action updates."""


def evenly_spaced(items: list, limit: int) -> list:
    """At most ``limit`` of ``items``, evenly spaced over them, in order."""
    if len(items) <= limit:
        return items
    return [items[i * len(items) // limit] for i in range(limit)]


def bid_label_batches(
    episodes: list[Episode],
    roles: list[str | None],
    reply_ids: Callable[[int, float], list[int]],
    limit: int,
) -> list[BidLabelBatch]:
    """Per agent that bid, up to ``limit`` of its bid prompts in ``episodes`` (evenly spaced)
    with the task expert's bid for its role there (``StepRecord.expert_levels``) as the reply
    (``reply_ids(agent, level)``: the level's canonical reply in the agent's tokens)."""
    rows: dict[int, list[tuple[list[int], float]]] = {}
    for step in (s for e in episodes for s in e.steps if s.expert_levels):
        for agent, bid in step.bids.items():
            if bid.reply.prompt_ids:
                level = step.expert_levels[roles[agent]]
                rows.setdefault(agent, []).append((bid.reply.prompt_ids, level))
    batches = []
    for agent, items in sorted(rows.items()):
        items = evenly_spaced(items, limit)
        batches.append(
            BidLabelBatch(
                agent,
                [prompt for prompt, _ in items],
                [reply_ids(agent, level) for _, level in items],
            )
        )
    return batches


def level_mass_batches(
    episodes: list[Episode],
    levels: Sequence[float],
    reply_ids: Callable[[int, float], list[int]],
    limit: int,
) -> list[BidLevelMassBatch]:
    """Per agent that bid, up to ``limit`` of its bid prompts in ``episodes`` (evenly spaced),
    each with every one of ``levels``' canonical replies (``reply_ids(agent, level)``)."""
    rows: dict[int, list[list[int]]] = {}
    for step in (s for e in episodes for s in e.steps):
        for agent, bid in step.bids.items():
            if bid.reply.prompt_ids:
                rows.setdefault(agent, []).append(bid.reply.prompt_ids)
    return [
        BidLevelMassBatch(
            agent,
            evenly_spaced(prompts, limit),
            [reply_ids(agent, level) for level in levels],
        )
        for agent, prompts in sorted(rows.items())
    ]


def credited_batches(
    episodes: list[Episode], credit_rule: CreditRule, rng: random.Random, levels: Sequence[float]
) -> tuple[list[ActionBatch], float]:
    """The credit rule over each episode's acting steps, grouped into one batch per agent that
    acted (by agent index; rows in episode order), and the mean discarded credit per episode.
    Agents that did not act get no batch, and so no gradient."""
    rows = []
    discarded = 0.0
    for episode in episodes:
        acting = episode.acting_steps
        credits, lost = credit_rule(
            [s.reward for s in acting],
            [s.decision.credited_bid for s in acting],
            [s.decision.credited_runner_up_bid for s in acting],
            rng,
            levels,
            episode_reads(episode),
        )
        discarded += lost
        rows += [(s.actor, s.action, c, s.index) for s, c in zip(acting, credits, strict=True)]
    batches = [
        ActionBatch(
            agent,
            [action.prompt_ids for _, action, _, _ in items],
            [action.reply_ids for _, action, _, _ in items],
            [credit for _, _, credit, _ in items],
            [decision for _, _, _, decision in items],
            [action.sampled_logprobs for _, action, _, _ in items],
        )
        for agent, items in group_by(rows, lambda row: row[0])
    ]
    return batches, discarded / max(len(episodes), 1)


def preference_batches(pairs: list[PreferencePair]) -> list[BidBatch]:
    """One batch per agent with preference pairs (by agent index; pairs in their order)."""
    return [
        BidBatch(
            agent,
            [p.prompt_ids for p in items],
            [p.preferred_ids for p in items],
            [p.rejected_ids for p in items],
            [p.weight for p in items],
            [p.preferred_sampled_logprobs for p in items],
            [p.rejected_sampled_logprobs for p in items],
            [p.tied for p in items],
        )
        for agent, items in group_by(pairs, lambda pair: pair.agent)
    ]
