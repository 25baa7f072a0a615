"""Counterfactual forks of contested steps -> preference pairs of the winner's bids (Eq. 3).

PAPER.md section 4: for a contested step, restore the world, resample the winner's bid until it
falls below the runner-up's (so the runner-up acts), roll the branch out with the current
policies, and prefer the bid whose branch earned more from that step on; ties are dropped.
By default the bid is drawn below the runner-up's directly and the pair weighted by the chance
that the paper's three tries would have kept the fork (``rl.bid_resample``): the same
expectation as rejection sampling, without the forks it drops.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch

from bidswarm.algorithms.losses import fork_preference
from bidswarm.algorithms.resampling import rejection_keep_probability
from bidswarm.config import BidResampling, ForkSelection, ForkSteps, RLConfig
from bidswarm.envs.base import TextEnv
from bidswarm.rollout.keyed import group_by
from bidswarm.rollout.loop import RolloutLoop
from bidswarm.rollout.records import Episode, PreferencePair, Reply, StepRecord


@dataclass
class ForkStats:
    """The funnel of one bid phase (PAPER.md section 4), from contested steps to pairs."""

    contested: int = 0
    eligible: int = 0
    """Contested steps the selection rule allows (``rl.fork_steps``)."""
    chosen: int = 0
    """Eligible steps drawn within the per-episode budget."""
    resampled_below: int = 0
    """Chosen steps where a parsed resample fell below the runner-up (or a bid was drawn below
    it, with a weight > 0): a branch was played."""
    unparsed_resamples: int = 0
    """Resampled bid replies that did not parse (never used as a counterfactual bid)."""
    tied: int = 0
    pairs: int = 0
    pair_weight: float = 0.0
    """Sum of the pairs' weights (:attr:`PreferencePair.weight`; = ``pairs`` when unweighted)."""
    effective_pairs: float = 0.0
    """Kish's effective sample size of the weighted pairs, (sum w)^2 / sum w^2 (= ``pairs``
    when unweighted): how many equally weighted pairs the bid update's loss is worth."""
    control: int = 0
    """Played forks that also played a control branch (``rl.control_forks``): the recorded
    winner acting again at the forked step, with fresh samples."""
    control_tied: int = 0
    """Control branches that scored as the recorded branch did (a tie by the same rule)."""

    def count_pairs(self, pairs: list[PreferencePair]) -> None:
        """Fill in ``pairs``, ``pair_weight`` and ``effective_pairs`` from the kept pairs."""
        weights = [pair.weight for pair in pairs]
        squares = sum(w * w for w in weights)
        self.pairs = len(pairs)
        self.pair_weight = sum(weights)
        self.effective_pairs = self.pair_weight**2 / squares if squares > 0 else 0.0

    def as_metrics(self) -> dict[str, float]:
        """Every count as ``forks/<name>``, and the label rates: ``forks/untied``, the share of
        the played forks whose branches did not tie (their labels), and ``forks/control_untied``,
        the share of the control branches that did not tie with the recorded branch although
        the same agent acted (labels made by sampling noise alone); each only when it has a
        fork to count."""
        metrics = {f"forks/{name}": float(value) for name, value in vars(self).items()}
        if self.resampled_below:
            metrics["forks/untied"] = 1.0 - self.tied / self.resampled_below
        if self.control:
            metrics["forks/control_untied"] = 1.0 - self.control_tied / self.control
        return metrics


@dataclass
class ForkExample:
    """One played fork, kept for its transcript: the recorded episode and its forked step, the
    counterfactual branch from that step on (the runner-up acting), and which scored more
    from that step on (``preference``: +1 the recorded one, -1 the branch, 0 a tie)."""

    episode: Episode
    step: StepRecord
    branch: Episode
    preference: int


def forkable_steps(episode: Episode, fork_steps: ForkSteps) -> list[StepRecord]:
    """The contested steps of ``episode`` (with a snapshot) that ``fork_steps`` allows.

    ``all``: every contested step (the paper's, which does not say more). ``until_last_reward``
    [ours]: only those at or before the episode's last rewarded decision (all of them when the
    episode earned nothing). After the last reward the recorded branch scores 0, and a single
    change of actor there rarely earns anything either: most such forks tie and are dropped.
    Biased: the choice reads the recorded branch's own outcome; rewards being >= 0, the forks
    it leaves out could only tie or prefer the lower bid, so the pairs lean toward the high one.
    """
    contested = [s for s in episode.steps if s.contested and s.snapshot is not None]
    rewarded = [s.index for s in episode.steps if s.reward != 0.0]
    if fork_steps == ForkSteps.all or not rewarded:
        return contested
    return [s for s in contested if s.index <= rewarded[-1]]


def choose_fork_steps(
    episode: Episode,
    eligible: list[StepRecord],
    selection: ForkSelection | str,
    budget: int,
    rng: random.Random,
) -> list[StepRecord]:
    """``budget`` of the ``eligible`` contested steps of ``episode`` (all when fewer), without
    replacement, drawn from ``rng`` alone (``rl.fork_selection``, :class:`ForkSelection`).

    ``uniform``: a uniform draw (``rng.sample``). ``margin``: smallest winning bid minus
    runner-up bid first. ``near_reward``: fewest decisions to the episode's next reward (the
    first rewarded step at or after the step; none after the last reward: last) first. Both
    break ties by a random number per eligible step, drawn in the steps' order. ``near_reward``
    is biased: it reads the recorded branch's own outcome (:class:`ForkSelection`).

    Example: margins (0.2, 0.6, 0.2, 0.4), budget 3, margin -> the two 0.2 steps in random
    order, then the 0.4 step.
    """
    count = min(budget, len(eligible))
    if selection == ForkSelection.uniform:
        return rng.sample(eligible, count)
    if selection == ForkSelection.margin:

        def closeness(step: StepRecord) -> float:
            # rounded: 0.8 - 0.6 and 0.6 - 0.4 are one margin, not two floats apart
            return round(step.decision.winning_bid - step.decision.runner_up_bid, 9)
    elif selection == ForkSelection.near_reward:
        rewarded = [s.index for s in episode.steps if s.reward != 0.0]

        def closeness(step: StepRecord) -> float:
            return min((i - step.index for i in rewarded if i >= step.index), default=math.inf)
    else:
        raise ValueError(f"fork selection must be one of {[f.value for f in ForkSelection]}")
    ranked = sorted(eligible, key=lambda step: (closeness(step), rng.random()))
    return ranked[:count]


def fork_pairs(
    loop: RolloutLoop,
    episodes: list[Episode],
    rl: RLConfig,
    rng: random.Random,
    generator: torch.Generator,
    examples: list[ForkExample] | None = None,
) -> tuple[list[PreferencePair], ForkStats]:
    """Counterfactual forks of contested steps (PAPER.md section 4) -> preference pairs.

    For each chosen contested step (``rl.fork_budget`` per episode among the steps
    :func:`forkable_steps` allows, uniformly or as ``rl.fork_selection`` says,
    :func:`choose_fork_steps`): restore the world, redraw the winner's bid below the
    runner-up's (``rl.bid_resample``: up to ``rl.max_bid_resamples`` parsed-or-not resamples,
    or a draw restricted to the levels below, weighted or not by the chance that those
    resamples would have kept the fork), let the runner-up act, roll the branch out with the
    current policies and compare the reward from that step on with the recorded episode's.
    Ties and failed resamples are dropped; every stage is counted in the returned
    :class:`ForkStats`. Then ``rl.control_forks`` of the played forks play a control branch
    (the recorded winner acting again), counted in the stats and in no pair. ``examples``,
    when given, receives every played fork (:class:`ForkExample`, for transcripts).
    """
    stats = ForkStats()
    chosen: list[tuple[Episode, StepRecord]] = []
    for episode in episodes:
        stats.contested += sum(s.contested for s in episode.steps)
        eligible = forkable_steps(episode, rl.fork_steps)
        stats.eligible += len(eligible)
        for step in choose_fork_steps(episode, eligible, rl.fork_selection, rl.fork_budget, rng):
            chosen.append((episode, step))
    stats.chosen = len(chosen)
    if not chosen:
        return [], stats
    envs = loop.envs(len(chosen))
    for env, (_, step) in zip(envs, chosen, strict=True):
        env.restore(step.snapshot)
    steps = [step for _, step in chosen]
    if rl.bid_resample == BidResampling.rejection:
        resampled = _resample_bids(loop, envs, steps, rl, generator, stats)
        weights = [1.0] * len(steps)
    else:
        resampled, weights = _draw_bids_below(loop, envs, steps, rl, generator)
    kept = [k for k, reply in enumerate(resampled) if reply is not None]
    stats.resampled_below = len(kept)
    if not kept:
        return [], stats
    branches = [Episode(seed=chosen[k][0].seed) for k in kept]
    first_actors = [chosen[k][1].decision.runner_up for k in kept]
    loop.play([envs[k] for k in kept], branches, rng, generator, first_actors=first_actors)
    pairs = []
    for k, branch in zip(kept, branches, strict=True):
        episode, step = chosen[k]
        original, counterfactual = step.bids[step.actor].reply, resampled[k]
        preference = fork_preference(episode.reward_from(step.index), branch.total_reward)
        if examples is not None:
            examples.append(ForkExample(episode, step, branch, int(preference)))
        if preference == 0:
            stats.tied += 1
            continue
        better, worse = (original, counterfactual) if preference > 0 else (counterfactual, original)
        pairs.append(
            PreferencePair(
                step.actor,
                original.prompt_ids,
                better.reply_ids,
                worse.reply_ids,
                weights[k],
                better.sampled_logprobs,
                worse.sampled_logprobs,
            )
        )
    stats.count_pairs(pairs)
    _play_controls(loop, [chosen[k] for k in kept], rl.control_forks, rng, generator, stats)
    return pairs, stats


def control_count(played: int, share: float) -> int:
    """How many of ``played`` forks play a control branch: ceil(``share`` x ``played``), so
    that any share above 0 measures at least one fork when one was played."""
    return min(played, math.ceil(share * played))


def _play_controls(
    loop: RolloutLoop,
    played: list[tuple[Episode, StepRecord]],
    share: float,
    rng: random.Random,
    generator: torch.Generator,
    stats: ForkStats,
) -> None:
    """Control branches of a uniform draw of ``control_count`` of the ``played`` forks: the
    recorded winner acts again from the fork's snapshot (fresh samples, same actor), and the
    branch is compared with the recorded one as a counterfactual is (``control``,
    ``control_tied``). Played after every pair is made, from the same streams: the pairs are
    those of a run without controls; nothing here reaches a loss."""
    controls = rng.sample(played, control_count(len(played), share))
    if not controls:
        return
    envs = loop.envs(len(controls))
    for env, (_, step) in zip(envs, controls, strict=True):
        env.restore(step.snapshot)
    branches = [Episode(seed=episode.seed) for episode, _ in controls]
    actors = [step.actor for _, step in controls]
    loop.play(envs, branches, rng, generator, first_actors=actors)
    for (episode, step), branch in zip(controls, branches, strict=True):
        stats.control += 1
        recorded = episode.reward_from(step.index)
        stats.control_tied += fork_preference(recorded, branch.total_reward) == 0


def _draw_bids_below(
    loop: RolloutLoop,
    envs: list[TextEnv],
    steps: list[StepRecord],
    rl: RLConfig,
    generator: torch.Generator,
) -> tuple[list[Reply | None], list[float]]:
    """Per fork, the winner's bid drawn among the levels below the runner-up's
    (:meth:`Swarm.bid_below`), and the fork's weight: 1 for ``below_runner_up``; for
    ``weighted_below_runner_up`` the chance 1 - (1 - q)^K that K = ``rl.max_bid_resamples``
    rejection tries would have kept the fork, q the policy's mass on the canonical replies of
    the levels below (at ``rl.bid_resample_temperature``). Given that a try succeeds, its bid is
    distributed as the draw, so the weighted forks have the expectation of the forks rejection
    sampling keeps (:mod:`bidswarm.algorithms.resampling`). A fork whose weight underflows to 0
    would never be kept: it is not played (None)."""
    found: list[Reply | None] = [None] * len(steps)
    weights = [1.0] * len(steps)
    weighted = rl.bid_resample == BidResampling.weighted_below_runner_up
    for agent, ks in group_by(range(len(steps)), lambda k: steps[k].actor):
        drawn, masses = loop.swarm.bid_below(
            agent,
            [envs[k] for k in ks],
            [steps[k].decision.runner_up_bid for k in ks],
            generator,
            rl.bid_resample_temperature,
        )
        for k, reply, mass in zip(ks, drawn, masses, strict=True):
            if weighted:
                weights[k] = rejection_keep_probability(mass, rl.max_bid_resamples)
            found[k] = reply if weights[k] > 0.0 else None
    return found, weights


def _resample_bids(
    loop: RolloutLoop,
    envs: list[TextEnv],
    steps: list[StepRecord],
    rl: RLConfig,
    generator: torch.Generator,
    stats: ForkStats,
) -> list[Reply | None]:
    """Per fork, the first of ``rl.max_bid_resamples`` resampled winner bids that parsed and
    fell below the runner-up's, or None. A malformed reply would count as bid 0 in the auction,
    but it is no bid the policy could be taught to prefer: it never becomes a counterfactual."""
    tries = rl.max_bid_resamples
    found: list[Reply | None] = [None] * len(steps)
    for agent, ks in group_by(range(len(steps)), lambda k: steps[k].actor):
        samples = loop.swarm.bid(
            agent,
            [envs[k] for k in ks],
            generator,
            copies=tries,
            temperature=rl.bid_resample_temperature,
        )
        for j, k in enumerate(ks):
            for bid in samples[j * tries : (j + 1) * tries]:
                stats.unparsed_resamples += not bid.parsed
                if bid.parsed and bid.level < steps[k].decision.runner_up_bid:
                    found[k] = bid.reply
                    break
    return found
