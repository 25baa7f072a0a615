"""The collector: each update's fresh on-policy data as plain per-agent batches and metrics.

Update ``u`` of a cycle of ``rl.action_updates + rl.bid_updates`` is an action update or a bid
update (:meth:`Collector.update_kind`); a rule without contested steps has no bid updates, and
by default (``rl.bid_slot_without_bids=skip``) its cycles are only the ``rl.action_updates``
action updates, so every arm makes the same number of action updates
(:attr:`Collector.total_updates`). The collector draws ``rl.envs_per_update`` training worlds
(a bid update: ``rl.bid_envs_per_update``) and plays them in lock-step (``RolloutLoop.run``);
then

- action update: the configured credit rule over each episode's acting steps (Eq. 2), grouped
  into one :class:`~bidswarm.rollout.batches.ActionBatch` per agent that acted;
- bid update: counterfactual forks of contested steps (``rollout/forks.py``) -> preference
  pairs, one :class:`~bidswarm.rollout.batches.BidBatch` per agent with pairs (Eq. 3).

It counts the update's tokens, FLOPs and parse failures (those generated and scored, and those
the learner will train on) in a ledger of the update's own, and returns the batches with that
ledger and the update's metrics (reward, participation, the fork funnel, time per phase). The
learner (``lit/swarm_module.py``) adds the ledger, summed over the processes, to the run's, and
turns the batches into gradient steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from bidswarm import metric_names as names
from bidswarm.algorithms.credit import CreditRule
from bidswarm.config import BidSlotWithoutBids, RLConfig
from bidswarm.coordination.bid_readers import AnchorTarget, BidLoss, BidsConfig
from bidswarm.rollout.acting_values import (
    acting_values,
    calibration_pairs,
    sample_states,
    value_batches,
)
from bidswarm.rollout.batches import (
    ActionBatch,
    AnchorBatch,
    BidBatch,
    BidLabelBatch,
    BidLevelMassBatch,
    BidValueBatch,
    bid_label_batches,
    credited_batches,
    level_mass_batches,
    preference_batches,
)
from bidswarm.rollout.forks import ForkExample, fork_pairs
from bidswarm.rollout.keyed import seeded_randomness
from bidswarm.rollout.loop import RolloutLoop
from bidswarm.rollout.market import valid_level_mass
from bidswarm.rollout.memory_credit import memory_tree_metrics
from bidswarm.rollout.metrics import episode_metrics, timed
from bidswarm.rollout.records import Episode
from bidswarm.rollout.usage import Usage


class UpdateKind(str, Enum):
    action = "action"
    """Bucket-brigade credit (or the configured rule) + REINFORCE on action tokens (Eq. 2)."""
    bid = "bid"
    """Counterfactual forks + Bradley-Terry on bid tokens (Eq. 3)."""

    __str__ = str.__str__


@dataclass
class Collected:
    """One update's data: the batches (one per agent with data), the metrics so far, and what
    this process spent on it (``usage``: the update's counts only, not the run's totals)."""

    kind: UpdateKind
    batches: list[ActionBatch | AnchorBatch] | list[BidBatch] | list[BidValueBatch]
    metrics: dict[str, float]
    usage: Usage = field(default_factory=Usage)


class Collector:
    """Collects the data of every update of the schedule from a :class:`RolloutLoop`.

    credit_rule: the run's credit rule, built once (``algorithms.credit.make_credit``).
    train_seeds: the worlds each update draws from.
    seed: the run's seed; update ``u`` of rank ``r`` draws all its randomness from
    ``(seed, r, u)``, so a resumed run replays it exactly.
    """

    def __init__(
        self,
        loop: RolloutLoop,
        rl: RLConfig,
        credit_rule: CreditRule,
        train_seeds: list[int],
        seed: int,
        bids: BidsConfig | None = None,
    ):
        """``bids``: the bid channel's settings that the collector reads (the anchor's labels,
        the valid-level probe); None: the paper's."""
        self.loop = loop
        self.rl = rl
        self.bids = bids or BidsConfig(name="paper")
        self.credit_rule = credit_rule
        self.train_seeds = train_seeds
        self.seed = seed
        self.last_forks: list[ForkExample] = []
        """The forks played by the latest bid update (for transcripts)."""
        self.last_calibration: list[tuple[str, float, float]] = []
        """(role, bid, value target) at the latest calibrated bid update's forks (a plot)."""

    @property
    def makes_bid_updates(self) -> bool:
        """Whether the schedule has bid updates: the rule makes contested steps to fork."""
        return self.loop.coordination.makes_contested_steps and self.rl.bid_updates > 0

    @property
    def updates_per_cycle(self) -> int:
        """``action_updates + bid_updates``; without bid updates, the bid slots are skipped
        unless ``rl.bid_slot_without_bids=action`` makes them action updates."""
        fill = self.rl.bid_slot_without_bids == BidSlotWithoutBids.action
        if self.makes_bid_updates or fill:
            return self.rl.action_updates + self.rl.bid_updates
        return self.rl.action_updates

    @property
    def total_updates(self) -> int:
        return self.rl.cycles * self.updates_per_cycle

    def update_kind(self, update: int) -> UpdateKind:
        """The 4:1 schedule; rules without contested steps only ever make action updates."""
        if not self.makes_bid_updates:
            return UpdateKind.action
        cycle = self.rl.action_updates + self.rl.bid_updates
        return UpdateKind.action if update % cycle < self.rl.action_updates else UpdateKind.bid

    def updates_made(self, update: int) -> dict[str, float]:
        """``updates/action`` and ``updates/bid``: the updates of each kind made once
        ``update`` (counted from 0) is done."""
        made = update + 1
        if not self.makes_bid_updates:
            return {names.UPDATES_ACTION: float(made), names.UPDATES_BID: 0.0}
        cycles, rest = divmod(made, self.updates_per_cycle)
        action = cycles * self.rl.action_updates + min(rest, self.rl.action_updates)
        return {names.UPDATES_ACTION: float(action), names.UPDATES_BID: float(made - action)}

    def worlds_per_update(self, kind: UpdateKind) -> int:
        """How many training worlds an update of ``kind`` plays."""
        if kind == UpdateKind.bid and self.rl.bid_envs_per_update is not None:
            return self.rl.bid_envs_per_update
        return self.rl.envs_per_update

    def collect(self, update: int, rank: int = 0) -> Collected:
        """Fresh episodes for ``update`` on process ``rank`` -> per-agent batches + metrics,
        and the update's usage on this process."""
        with self.loop.swarm.separate_usage() as usage:
            kind, batches, metrics = self._collect(update, rank)
        return Collected(kind, batches, metrics, usage)

    def anchor_batches(
        self, episodes: list[Episode]
    ) -> list[BidLabelBatch] | list[BidLevelMassBatch]:
        """The bid anchor's batches at ``episodes``' bid prompts (``bids.anchor_target``): the
        expert's labels, or every level."""
        swarm, limit = self.loop.swarm, self.bids.anchor_prompts
        if self.bids.anchor_target == AnchorTarget.levels:
            return level_mass_batches(episodes, swarm.bid_levels, swarm.level_reply_ids, limit)
        return bid_label_batches(episodes, swarm.roles, swarm.level_reply_ids, limit)

    def _collect(self, update: int, rank: int) -> tuple[UpdateKind, list, dict[str, float]]:
        kind = self.update_kind(update)
        swarm = self.loop.swarm
        device = next(swarm.population.parameters()).device
        rng, generator = seeded_randomness(f"{self.seed}/{rank}/{update}", device)
        timings: dict[str, float] = {}
        with timed(timings, "rollout"):
            seeds = rng.sample(self.train_seeds, self.worlds_per_update(kind))
            calibrated = kind == UpdateKind.bid and self.bids.loss == BidLoss.calibrated
            episodes = self.loop.run(
                seeds,
                rng,
                generator,
                keep_snapshots=kind == UpdateKind.bid,
                snapshot_every_step=calibrated,
            )
        metrics = episode_metrics(episodes, swarm.roles, swarm.bid_levels)
        if self.bids.mass_probe_prompts:
            metrics |= valid_level_mass(swarm, episodes, self.bids.mass_probe_prompts)
        batches: list[ActionBatch | AnchorBatch] | list[BidBatch] | list[BidValueBatch]
        if kind == UpdateKind.action:
            with timed(timings, "credit"):
                batches, discarded = credited_batches(
                    episodes, self.credit_rule, rng, swarm.bid_levels
                )
            metrics["credit/discarded"] = discarded
            if self.bids.anchor_coef > 0:  # the bid anchor, at the swarm's own states
                batches = [*batches, *self.anchor_batches(episodes)]
            if self.credit_rule.reads_memory:  # contribution trees: their diagnostics
                metrics |= memory_tree_metrics(
                    episodes, self.credit_rule, swarm.roles, swarm.bid_levels
                )
        elif calibrated:  # every agent's value of acting at sampled states
            with timed(timings, "fork"):
                states = sample_states(episodes, self.bids.value_states, rng)
                forks = acting_values(self.loop, states, self.bids.value_branches, rng, generator)
                batches, found = value_batches(self.loop, forks)
            metrics |= found
            self.last_calibration = calibration_pairs(forks, swarm.roles, max(swarm.bid_levels))
        else:
            with timed(timings, "fork"):
                self.last_forks = []
                pairs, stats = fork_pairs(
                    self.loop, episodes, self.rl, rng, generator, examples=self.last_forks
                )
            batches = preference_batches(pairs)
            metrics |= stats.as_metrics()
        for batch in batches:
            policy = swarm.population[batch.agent]
            swarm.count_trained(
                batch.agent, batch.learner_tokens(policy, self.rl.micro_batch_tokens)
            )
        metrics |= self.updates_made(update)
        metrics |= {names.UPDATE: float(update), names.UPDATE_IS_BID: float(kind == UpdateKind.bid)}
        metrics |= {names.seconds(phase): value for phase, value in timings.items()}
        metrics |= swarm.engine.metrics()  # time/engine_*: its start-up and weight syncs so far
        return kind, batches, metrics
