"""Counterfactual forks of contested steps -> preference pairs of the winner's bids (Eq. 3).

docs/method.md section 4: for a contested step, restore the world, resample the winner's bid
until it falls below the runner-up's (so the runner-up acts), roll the branch out with the
current policies, and prefer the bid whose branch earned more from that step on; ties are dropped.
By default the bid is drawn below the runner-up's directly and the pair weighted by the chance
that the paper's three tries would have kept the fork (``rl.bid_resample``): the same
expectation as rejection sampling, without the forks it drops.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch

from bidswarm.algorithms.losses import fork_preference, side_score, tie_break_preference
from bidswarm.algorithms.resampling import keep_probability_estimate, rejection_keep_probability
from bidswarm.config import (
    BidResampling,
    BidTies,
    ForkSelection,
    ForkSteps,
    MalformedResample,
    RLConfig,
)
from bidswarm.envs.base import TextEnv
from bidswarm.rollout.keyed import group_by
from bidswarm.rollout.loop import RolloutLoop
from bidswarm.rollout.records import Bid, Episode, PreferencePair, Reply, StepRecord


@dataclass
class ForkStats:
    """The funnel of one bid phase (docs/method.md section 4), from contested steps to pairs."""

    contested: int = 0
    eligible: int = 0
    """Contested steps the selection rule allows (``rl.fork_steps``)."""
    chosen: int = 0
    """Eligible steps drawn within the per-episode budget."""
    resampled_below: int = 0
    """Chosen steps where a parsed resample fell below the runner-up (or a bid was drawn below
    it, with a weight > 0): a branch was played."""
    unparsed_resamples: int = 0
    """Resampled bid replies that did not parse (a counterfactual bid only with
    ``rl.malformed_resample=bid_zero``)."""
    tied: int = 0
    """Played forks whose sides tied (after ``rl.fork_tie_break``): dropped, or pairs with
    label 1/2 under ``rl.bt_ties=half_label``."""
    tie_broken: int = 0
    """Played forks whose sides' scores tied and that ``rl.fork_tie_break`` decided."""
    pairs: int = 0
    """Pairs the loss gets (with ``rl.bt_ties=half_label``, the tied ones too)."""
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
    horizon: int | None = None,
) -> list[StepRecord]:
    """``budget`` of the ``eligible`` contested steps of ``episode`` (all when fewer), without
    replacement, drawn from ``rng`` alone (``rl.fork_selection``, :class:`ForkSelection`).

    ``uniform``: a uniform draw (``rng.sample``). ``margin``: smallest winning bid minus
    runner-up bid first. ``near_reward``: fewest decisions to the episode's next reward (the
    first rewarded step at or after the step; none after the last reward: last) first. Both
    break ties by a random number per eligible step, drawn in the steps' order. ``near_reward``
    is biased: it reads the recorded branch's own outcome (:class:`ForkSelection`).
    ``open_reward``: a weighted draw without replacement (Efraimidis-Spirakis keys u^(1/w),
    a random number u per eligible step in the steps' order), the weight w the reward still
    open at the step (:attr:`StepRecord.open_reward`; 1 when unknown) times the decisions left
    of ``horizon`` (1 when None); steps of weight 0 last, in random order. What is known at the
    fork only.

    Example: margins (0.2, 0.6, 0.2, 0.4), budget 3, margin -> the two 0.2 steps in random
    order, then the 0.4 step.
    """
    count = min(budget, len(eligible))
    if selection == ForkSelection.uniform:
        return rng.sample(eligible, count)
    if selection == ForkSelection.open_reward:

        def weight(step: StepRecord) -> float:
            still_open = 1.0 if step.open_reward is None else step.open_reward
            return still_open * (1.0 if horizon is None else max(horizon - step.index, 0))

        keys = [(weight(step), rng.random()) for step in eligible]
        order = sorted(
            range(len(eligible)),
            key=lambda i: (
                (0, -(keys[i][1] ** (1 / keys[i][0]))) if keys[i][0] > 0 else (1, keys[i][1])
            ),
        )
        return [eligible[i] for i in order[:count]]
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
    """Counterfactual forks of contested steps (docs/method.md section 4) -> preference pairs.

    For each chosen contested step (``rl.fork_budget`` per episode among the steps
    :func:`forkable_steps` allows, uniformly or as ``rl.fork_selection`` says,
    :func:`choose_fork_steps`): restore the world, redraw the winner's bid below the
    runner-up's (``rl.bid_resample``: up to ``rl.max_bid_resamples`` resamples, a draw
    restricted to the canonical levels below, weighted or not, or the first kept of
    ``rl.bid_resample_samples`` samples weighted by the estimated chance that the tries keep
    the fork), let the runner-up act, roll the branch out with the current policies and
    compare the reward from that step on with the recorded episode's. With
    ``rl.fork_branches`` K > 1 each side is K branches scored by their mean: the runner-up's
    K, and the recorded episode with K - 1 replays where the recorded winner acts again.
    Ties (``rl.fork_tie_break`` may decide them; ``rl.bt_ties`` may keep them) and failed
    resamples are dropped; every stage is counted in the returned :class:`ForkStats`. Then
    ``rl.control_forks`` of the played forks play a control branch (the recorded winner acting
    again), counted in the stats and in no pair. ``examples``,
    when given, receives every played fork (:class:`ForkExample`, for transcripts).
    """
    stats = ForkStats()
    chosen: list[tuple[Episode, StepRecord]] = []
    for episode in episodes:
        stats.contested += sum(s.contested for s in episode.steps)
        eligible = forkable_steps(episode, rl.fork_steps)
        stats.eligible += len(eligible)
        picked = choose_fork_steps(
            episode, eligible, rl.fork_selection, rl.fork_budget, rng, loop.horizon
        )
        chosen += [(episode, step) for step in picked]
    stats.chosen = len(chosen)
    if not chosen:
        return [], stats
    envs = loop.envs(len(chosen))
    for env, (_, step) in zip(envs, chosen, strict=True):
        env.restore(step.snapshot)
    steps = [step for _, step in chosen]
    resampled, weights = redraw_bids(loop, envs, steps, rl, generator, stats)
    kept = [k for k, reply in enumerate(resampled) if reply is not None]
    stats.resampled_below = len(kept)
    if not kept:
        return [], stats
    played = [chosen[k] for k in kept]
    branches_per_side = rl.fork_branches
    runner_ups = [step.decision.runner_up for _, step in played]
    winners = [step.actor for _, step in played]
    tie_break = rl.fork_tie_break
    # One lock-step rollout: each fork's K runner-up branches, then its K - 1 winner replays.
    sides = _play_branches(
        loop,
        played,
        [(runner_ups, branches_per_side), (winners, branches_per_side - 1)],
        rng,
        generator,
        tie_break,
    )
    pairs = []
    for j, (k, (episode, step)) in enumerate(zip(kept, played, strict=True)):
        counterfactual_side, replays = sides[0][j], sides[1][j]
        recorded_side = [_recorded_branch(episode, step), *replays]
        preference, broken = fork_label(recorded_side, counterfactual_side, tie_break)
        stats.tie_broken += broken
        if examples is not None:
            examples.append(ForkExample(episode, step, counterfactual_side[0].episode, preference))
        original, counterfactual = step.bids[step.actor].reply, resampled[k]
        if preference == 0:
            stats.tied += 1
            if rl.bt_ties != BidTies.half_label:
                continue
        better, worse = (counterfactual, original) if preference < 0 else (original, counterfactual)
        pairs.append(
            PreferencePair(
                step.actor,
                original.prompt_ids,
                better.reply_ids,
                worse.reply_ids,
                weights[k],
                better.sampled_logprobs,
                worse.sampled_logprobs,
                tied=preference == 0,
            )
        )
    stats.count_pairs(pairs)
    _play_controls(loop, played, rl, rng, generator, stats)
    return pairs, stats


@dataclass(frozen=True)
class Branch:
    """One branch of a fork side: its rewards from the forked step on, its progress score at
    the end (``TextEnv.progress``; None when not asked or unknown) and its episode."""

    episode: Episode
    rewards: tuple[float, ...]
    progress: float | None


def _recorded_branch(episode: Episode, step: StepRecord) -> Branch:
    """The recorded episode from ``step`` on, as a branch of the fork at ``step``."""
    rewards = tuple(s.reward for s in episode.steps if s.index >= step.index)
    return Branch(episode, rewards, episode.final_progress)


def fork_label(
    recorded: list[Branch], counterfactual: list[Branch], tie_break: bool
) -> tuple[int, bool]:
    """Which side of a fork is preferred, +1 the recorded, -1 the counterfactual, 0 a tie, and
    whether ``tie_break`` decided it: each side scored by the mean of its branches' rewards
    (:func:`side_score`; one branch each: the paper's label), compared within the branch
    score tolerance (:func:`fork_preference`); a tie, with ``tie_break``, goes to the side
    that earned first, then to the higher progress score (:func:`tie_break_preference`)."""
    recorded_rewards = [b.rewards for b in recorded]
    counterfactual_rewards = [b.rewards for b in counterfactual]
    preference = fork_preference(side_score(recorded_rewards), side_score(counterfactual_rewards))
    if preference != 0 or not tie_break:
        return preference, False
    preference = tie_break_preference(
        recorded_rewards,
        counterfactual_rewards,
        [b.progress for b in recorded],
        [b.progress for b in counterfactual],
    )
    return preference, preference != 0


def _play_branches(
    loop: RolloutLoop,
    forks: list[tuple[Episode, StepRecord]],
    sides: list[tuple[list[int], int]],
    rng: random.Random,
    generator: torch.Generator,
    progress: bool,
) -> list[list[list[Branch]]]:
    """For each side ``(first actors, copies)``: per fork, ``copies`` branches from the fork's
    snapshot with that fork's first actor forced, all played in one lock-step rollout (per
    fork, each side's copies in turn); ``progress``: read each branch's end progress score."""
    rows = [
        (side, j, actors[j])
        for j in range(len(forks))
        for side, (actors, copies) in enumerate(sides)
        for _ in range(copies)
    ]
    envs = loop.envs(len(rows))
    for env, (_, j, _) in zip(envs, rows, strict=True):
        env.restore(forks[j][1].snapshot)
    branches = [Episode(seed=forks[j][0].seed) for _, j, _ in rows]
    if rows:
        loop.play(envs, branches, rng, generator, first_actors=[actor for _, _, actor in rows])
    played: list[list[list[Branch]]] = [[[] for _ in forks] for _ in sides]
    for (side, j, _), env, branch in zip(rows, envs, branches, strict=True):
        rewards = tuple(s.reward for s in branch.steps)
        played[side][j].append(Branch(branch, rewards, env.progress() if progress else None))
    return played


def control_count(played: int, share: float) -> int:
    """How many of ``played`` forks play a control branch: ceil(``share`` x ``played``), so
    that any share above 0 measures at least one fork when one was played."""
    return min(played, math.ceil(share * played))


def _play_controls(
    loop: RolloutLoop,
    played: list[tuple[Episode, StepRecord]],
    rl: RLConfig,
    rng: random.Random,
    generator: torch.Generator,
    stats: ForkStats,
) -> None:
    """Control branches of a uniform draw of ``control_count`` of the ``played`` forks
    (``rl.control_forks``): in place of the runner-up's side, ``rl.fork_branches`` branches
    where the recorded winner acts again from the fork's snapshot (fresh samples, same actor),
    labelled against the recorded side as a counterfactual is (:func:`fork_label`: ``control``,
    ``control_tied``). Played after every pair is made, from the same streams: the pairs are
    those of a run without controls; nothing here reaches a loss."""
    controls = rng.sample(played, control_count(len(played), rl.control_forks))
    if not controls:
        return
    k = rl.fork_branches
    winners = [step.actor for _, step in controls]
    control_sides, replays = _play_branches(
        loop, controls, [(winners, k), (winners, k - 1)], rng, generator, rl.fork_tie_break
    )
    for (episode, step), control, replayed in zip(controls, control_sides, replays, strict=True):
        recorded = [_recorded_branch(episode, step), *replayed]
        preference, _ = fork_label(recorded, control, rl.fork_tie_break)
        stats.control += 1
        stats.control_tied += preference == 0


def redraw_bids(
    loop: RolloutLoop,
    envs: list[TextEnv],
    steps: list[StepRecord],
    rl: RLConfig,
    generator: torch.Generator,
    stats: ForkStats,
) -> tuple[list[Reply | None], list[float]]:
    """Per fork (``envs[k]`` restored to ``steps[k]``), the winner's counterfactual bid reply
    below the runner-up's (None: the fork is not played) and the fork's weight, as
    ``rl.bid_resample`` says (:class:`~bidswarm.config.BidResampling`); resampled replies that
    do not parse are counted in ``stats``. A level reader (``bids.reader``) samples no reply:
    its fork draws a level below the runner-up's, weighted as ``weighted_below_runner_up``
    unless ``rl.bid_resample=below_runner_up``."""
    if loop.swarm.reader.reads_levels:  # no sampled replies: a level drawn below, weighted
        return _draw_bids_below(loop, envs, steps, rl, generator)
    if rl.bid_resample == BidResampling.rejection:
        return _resample_bids(loop, envs, steps, rl, generator, stats), [1.0] * len(steps)
    if rl.bid_resample == BidResampling.sampled_below_runner_up:
        return _sample_bids_below(loop, envs, steps, rl, generator, stats)
    return _draw_bids_below(loop, envs, steps, rl, generator)


def kept_by_rejection(bid: Bid, runner_up_bid: float, malformed: MalformedResample | str) -> bool:
    """Whether a rejection try keeps this resampled bid: it parsed to a level below the
    runner-up's, or it is malformed and ``rl.malformed_resample=bid_zero`` reads it as bid 0
    (below every runner-up of a contested step)."""
    if not bid.parsed:
        return malformed == MalformedResample.bid_zero
    return bid.level < runner_up_bid


def _sample_bids_below(
    loop: RolloutLoop,
    envs: list[TextEnv],
    steps: list[StepRecord],
    rl: RLConfig,
    generator: torch.Generator,
    stats: ForkStats,
) -> tuple[list[Reply | None], list[float]]:
    """Per fork, m = ``rl.bid_resample_samples`` resampled winner bids: the first that
    rejection keeps (:func:`kept_by_rejection`) is the counterfactual bid, and the fork's
    weight is the unbiased estimate of the chance that K = ``rl.max_bid_resamples`` tries keep
    it from the c kept of m (:func:`keep_probability_estimate`; c = 0: weight 0, not played)."""
    m = rl.bid_resample_samples
    found: list[Reply | None] = [None] * len(steps)
    weights = [0.0] * len(steps)
    for k, mine in _winner_bid_samples(loop, envs, steps, m, rl, generator):
        stats.unparsed_resamples += sum(not bid.parsed for bid in mine)
        ceiling = steps[k].decision.runner_up_bid
        kept = [bid for bid in mine if kept_by_rejection(bid, ceiling, rl.malformed_resample)]
        weights[k] = keep_probability_estimate(len(kept), m, rl.max_bid_resamples)
        found[k] = kept[0].reply if kept else None
    return found, weights


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
    weighted = rl.bid_resample != BidResampling.below_runner_up
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
    """Per fork, the first of ``rl.max_bid_resamples`` resampled winner bids that rejection
    keeps (:func:`kept_by_rejection`: parsed below the runner-up's; a malformed one only under
    ``rl.malformed_resample=bid_zero``), or None."""
    found: list[Reply | None] = [None] * len(steps)
    for k, tries in _winner_bid_samples(loop, envs, steps, rl.max_bid_resamples, rl, generator):
        for bid in tries:
            stats.unparsed_resamples += not bid.parsed
            if kept_by_rejection(bid, steps[k].decision.runner_up_bid, rl.malformed_resample):
                found[k] = bid.reply
                break
    return found


def _winner_bid_samples(
    loop: RolloutLoop,
    envs: list[TextEnv],
    steps: list[StepRecord],
    copies: int,
    rl: RLConfig,
    generator: torch.Generator,
):
    """``(k, bids)`` per fork k: ``copies`` bids of its recorded winner sampled from the fork's
    world at ``rl.bid_resample_temperature``, one generation batch per agent."""
    for agent, ks in group_by(range(len(steps)), lambda k: steps[k].actor):
        samples = loop.swarm.bid(
            agent,
            [envs[k] for k in ks],
            generator,
            copies=copies,
            temperature=rl.bid_resample_temperature,
        )
        for j, k in enumerate(ks):
            yield k, samples[j * copies : (j + 1) * copies]
