"""The RolloutLoop: lock-step batched episodes over many environments, and counterfactual forks.

This object is the project's custom loop (Lightning 2.x has no custom Loop classes): the
training module calls it inside ``training_step`` so every update sees on-policy episodes.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import torch

from bidswarm.algorithms.losses import fork_preference
from bidswarm.coordination.base import CoordinationRule
from bidswarm.envs.base import TextEnv
from bidswarm.rollout.records import Decision, Episode, PreferencePair, StepRecord
from bidswarm.rollout.swarm import Swarm


FORK_STEPS = ("all", "until_last_reward")
"""Which contested steps a bid update may fork (``rl.fork_steps``)."""
BID_RESAMPLING = ("rejection", "below_runner_up")
"""How a fork redraws the winner's bid (``rl.bid_resample``): ``rejection`` samples bid replies
up to ``max_bid_resamples`` times until a parsed one falls below the runner-up's (the paper's);
``below_runner_up`` [ours] draws from the policy restricted to the levels below it (the limit of
rejection sampling with unlimited tries): no fork is dropped."""


@dataclass
class ForkStats:
    """The funnel of one bid phase (PAPER.md section 4), from contested steps to pairs."""

    contested: int = 0
    eligible: int = 0
    """Contested steps the selection rule allows (``rl.fork_steps``)."""
    chosen: int = 0
    """Eligible steps drawn within the per-episode budget."""
    resampled_below: int = 0
    """Chosen steps where a parsed resample fell below the runner-up: a branch was played."""
    unparsed_resamples: int = 0
    """Resampled bid replies that did not parse (never used as a counterfactual bid)."""
    tied: int = 0
    pairs: int = 0

    def as_metrics(self) -> dict[str, float]:
        return {f"forks/{name}": float(value) for name, value in vars(self).items()}


def forkable_steps(episode: Episode, fork_steps: str) -> list[StepRecord]:
    """The contested steps of ``episode`` (with a snapshot) that ``fork_steps`` allows.

    ``all``: every contested step (the paper's, which does not say more). ``until_last_reward``
    [ours]: only those at or before the episode's last rewarded decision (all of them when the
    episode earned nothing). After the last reward the recorded branch scores 0, and a single
    change of actor there rarely earns anything either: most such forks tie and are dropped.
    """
    if fork_steps not in FORK_STEPS:
        raise ValueError(f"rl.fork_steps={fork_steps!r}: choose one of {FORK_STEPS}")
    contested = [s for s in episode.steps if s.contested and s.snapshot is not None]
    rewarded = [s.decision for s in episode.steps if s.reward != 0.0]
    if fork_steps == "all" or not rewarded:
        return contested
    return [s for s in contested if s.decision <= rewarded[-1]]


def group_by(items, key) -> list[tuple]:
    """``(key, [items with that key])`` in increasing key order, items in their given order."""
    groups: dict = {}
    for item in items:
        groups.setdefault(key(item), []).append(item)
    return sorted(groups.items())


class RolloutLoop:
    """Runs a swarm in many environments at once; one generation batch per agent per phase."""

    def __init__(
        self, make_env: Callable[[], TextEnv], swarm: Swarm, coordination: CoordinationRule
    ):
        self.make_env = make_env
        self.swarm = swarm
        self.coordination = coordination
        self._pool: list[TextEnv] = []

    def _envs(self, n: int) -> list[TextEnv]:
        """``n`` environment objects, reused across calls (building one can be costly)."""
        while len(self._pool) < n:
            self._pool.append(self.make_env())
        return self._pool[:n]

    def run(
        self,
        seeds: list[int],
        rng: random.Random,
        generator: torch.Generator,
        keep_snapshots: bool = False,
    ) -> list[Episode]:
        """Play one episode per seed, all in lock-step; snapshots of contested steps if asked."""
        envs = self._envs(len(seeds))
        for env, seed in zip(envs, seeds, strict=True):
            env.reset(seed)
        episodes = [Episode(seed=seed) for seed in seeds]
        self._play(envs, episodes, rng, generator, keep_snapshots)
        for env, episode in zip(envs, episodes, strict=True):
            episode.metrics = env.episode_metrics()
        return episodes

    def _play(
        self,
        envs: list[TextEnv],
        episodes: list[Episode],
        rng: random.Random,
        generator: torch.Generator,
        keep_snapshots: bool,
        first_actors: list[int] | None = None,
    ) -> None:
        """Step every env to its end. ``first_actors`` forces who acts first (fork branches)."""
        live = [i for i, env in enumerate(envs) if not env.done]
        while live:
            live_envs = [envs[i] for i in live]
            if first_actors is not None:
                decisions = [Decision(actor=first_actors[i]) for i in live]
                first_actors = None
            else:
                decisions = self.coordination.decide(self.swarm, live_envs, rng, generator)
            self._generate_actions(live_envs, decisions, generator)
            rewards = []
            for env_index, env, decision in zip(live, live_envs, decisions, strict=True):
                record = self._step(env, decision, keep_snapshots)
                episodes[env_index].steps.append(record)
                rewards.append(record.reward)
            self.coordination.record_outcomes(live_envs, decisions, rewards)
            live = [i for i in live if not envs[i].done]

    def _generate_actions(
        self, envs: list[TextEnv], decisions: list[Decision], generator: torch.Generator
    ) -> None:
        """Fill in each winner's action, one generation batch per acting agent."""
        by_actor: dict[int, list[int]] = {}
        for pos, decision in enumerate(decisions):
            if decision.actor is not None and decision.action is None:
                by_actor.setdefault(decision.actor, []).append(pos)
        for agent, positions in sorted(by_actor.items()):
            replies = self.swarm.act(agent, [envs[p] for p in positions], generator)
            for pos, reply in zip(positions, replies, strict=True):
                decisions[pos].action = reply

    def _step(self, env: TextEnv, decision: Decision, keep_snapshots: bool) -> StepRecord:
        record = StepRecord.of(decision, env.decisions_made)
        if keep_snapshots and record.contested:
            record.snapshot = env.snapshot()
        if decision.actor is None:
            result = env.skip()
        else:
            result = env.step(self.swarm.role(decision.actor), decision.action.text)
            self.swarm.usage.actions_made += 1
            self.swarm.usage.invalid_actions += not result.valid
        record.reward = result.reward
        record.valid_action = result.valid
        return record

    def fork(
        self,
        episodes: list[Episode],
        budget: int,
        max_resamples: int,
        rng: random.Random,
        generator: torch.Generator,
        resample_temperature: float | None = None,
        fork_steps: str = "all",
        bid_resample: str = "rejection",
    ) -> tuple[list[PreferencePair], ForkStats]:
        """Counterfactual forks of contested steps (PAPER.md section 4) -> preference pairs.

        For each chosen contested step (``budget`` per episode, drawn uniformly among the steps
        :func:`forkable_steps` allows): restore the world, resample the winner's bid up to
        ``max_resamples`` times until a parsed resample falls below the runner-up's, let the
        runner-up act, roll the branch out with the current policies and compare the reward
        from that step on with the recorded episode's. Ties and failed resamples are dropped;
        every stage is counted in the returned :class:`ForkStats`. ``bid_resample``: see
        :data:`BID_RESAMPLING`.
        """
        if bid_resample not in BID_RESAMPLING:
            raise ValueError(f"rl.bid_resample={bid_resample!r}: choose one of {BID_RESAMPLING}")
        stats = ForkStats()
        chosen: list[tuple[Episode, StepRecord]] = []
        for episode in episodes:
            stats.contested += sum(s.contested for s in episode.steps)
            eligible = forkable_steps(episode, fork_steps)
            stats.eligible += len(eligible)
            for step in rng.sample(eligible, min(budget, len(eligible))):
                chosen.append((episode, step))
        stats.chosen = len(chosen)
        if not chosen:
            return [], stats
        envs = self._envs(len(chosen))
        for env, (_, step) in zip(envs, chosen, strict=True):
            env.restore(step.snapshot)
        steps = [step for _, step in chosen]
        if bid_resample == "rejection":
            resampled = self._resample_bids(
                envs, steps, max_resamples, generator, resample_temperature, stats
            )
        else:
            resampled = self._draw_bids_below(envs, steps, generator, resample_temperature)
        kept = [k for k, reply in enumerate(resampled) if reply is not None]
        stats.resampled_below = len(kept)
        if not kept:
            return [], stats
        branch_envs = [envs[k] for k in kept]
        branches = [Episode(seed=chosen[k][0].seed) for k in kept]
        first_actors = [chosen[k][1].runner_up for k in kept]
        self._play(branch_envs, branches, rng, generator, False, first_actors)
        pairs = []
        for k, branch in zip(kept, branches, strict=True):
            episode, step = chosen[k]
            original = step.bid_replies[step.actor]
            counterfactual = resampled[k]
            preference = fork_preference(episode.reward_from(step.decision), branch.total_reward)
            if preference == 0:
                stats.tied += 1
                continue
            better, worse = (
                (original, counterfactual) if preference > 0 else (counterfactual, original)
            )
            pairs.append(
                PreferencePair(step.actor, original.prompt_ids, better.reply_ids, worse.reply_ids)
            )
        stats.pairs = len(pairs)
        return pairs, stats

    def _draw_bids_below(
        self,
        envs: list[TextEnv],
        steps: list[StepRecord],
        generator: torch.Generator,
        temperature: float | None,
    ) -> list:
        """Per fork, the winner's bid drawn among the levels below the runner-up's."""
        found = [None] * len(steps)
        for agent, ks in group_by(range(len(steps)), lambda k: steps[k].actor):
            drawn = self.swarm.bid_below(
                agent,
                [envs[k] for k in ks],
                [steps[k].runner_up_bid for k in ks],
                generator,
                temperature,
            )
            for k, reply in zip(ks, drawn, strict=True):
                found[k] = reply
        return found

    def _resample_bids(
        self,
        envs: list[TextEnv],
        steps: list[StepRecord],
        tries: int,
        generator: torch.Generator,
        temperature: float | None,
        stats: ForkStats,
    ):
        """Per fork, the first of ``tries`` resampled winner bids that parsed and fell below the
        runner-up's, or None. A malformed reply would count as bid 0 in the auction, but it is
        no bid the policy could be taught to prefer: it never becomes a counterfactual."""
        found = [None] * len(steps)
        for agent, ks in group_by(range(len(steps)), lambda k: steps[k].actor):
            samples = self.swarm.bid(
                agent, [envs[k] for k in ks], generator, copies=tries, temperature=temperature
            )
            for j, k in enumerate(ks):
                for bid in samples[j * tries : (j + 1) * tries]:
                    stats.unparsed_resamples += not bid.parsed
                    if bid.parsed and bid.level < steps[k].runner_up_bid:
                        found[k] = bid.reply
                        break
        return found
