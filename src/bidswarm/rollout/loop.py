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


@dataclass
class ForkStats:
    """Bookkeeping of one bid phase (PAPER.md section 4)."""

    contested: int = 0
    made: int = 0
    dropped: int = 0
    """No resample fell below the runner-up's bid within the allowed tries."""
    tied: int = 0

    def as_metrics(self) -> dict[str, float]:
        return {
            "forks/made": float(self.made),
            "forks/dropped": float(self.dropped),
            "forks/tied": float(self.tied),
            "forks/pairs": float(self.made - self.tied),
        }


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
    ) -> tuple[list[PreferencePair], ForkStats]:
        """Counterfactual forks of contested steps (PAPER.md section 4) -> preference pairs.

        For each chosen contested step: restore the world, resample the winner's bid up to
        ``max_resamples`` times until it falls below the runner-up's, let the runner-up act,
        roll the branch out with the current policies and compare the reward from that step
        on with the recorded episode's. Ties and failed resamples are dropped and counted.
        """
        stats = ForkStats()
        chosen: list[tuple[Episode, StepRecord]] = []
        for episode in episodes:
            contested = [s for s in episode.steps if s.contested and s.snapshot is not None]
            stats.contested += len(contested)
            for step in rng.sample(contested, min(budget, len(contested))):
                chosen.append((episode, step))
        if not chosen:
            return [], stats
        envs = self._envs(len(chosen))
        for env, (_, step) in zip(envs, chosen, strict=True):
            env.restore(step.snapshot)
        resampled = self._resample_bids(
            envs, [step for _, step in chosen], max_resamples, generator, resample_temperature
        )
        kept = [k for k, reply in enumerate(resampled) if reply is not None]
        stats.dropped = len(chosen) - len(kept)
        stats.made = len(kept)
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
        return pairs, stats

    def _resample_bids(
        self,
        envs: list[TextEnv],
        steps: list[StepRecord],
        tries: int,
        generator: torch.Generator,
        temperature: float | None,
    ):
        """Per fork, the first of ``tries`` resampled winner bids below the runner-up's, or None."""
        found = [None] * len(steps)
        by_winner: dict[int, list[int]] = {}
        for k, step in enumerate(steps):
            by_winner.setdefault(step.actor, []).append(k)
        for agent, ks in sorted(by_winner.items()):
            samples = self.swarm.bid(
                agent, [envs[k] for k in ks], generator, copies=tries, temperature=temperature
            )
            for j, k in enumerate(ks):
                for level, reply in samples[j * tries : (j + 1) * tries]:
                    if level < steps[k].runner_up_bid:
                        found[k] = reply
                        break
        return found
