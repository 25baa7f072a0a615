"""[ours] Every agent's value of acting, measured by forks where each agent acts.

At a sampled state of an episode (any step with a snapshot, skipped steps included), restore
the world once per agent and branch, force that agent to act first, and let the swarm play the
rest of the episode with its own rule and policies; an agent's value of acting there is the
mean reward of its branches from that step on. Branch ``k`` of every agent draws from the same
random numbers (one seed per branch index, the same generator state for every agent's
rollout of it: common random numbers), so the agents' values differ by who acts, not by luck
of sampling, as far as their rollouts stay aligned.

Two readers: bid updates with ``rl.bid_loss=calibrated`` train every agent's bid toward its
normalised value (:func:`value_targets`), and held-out evaluations with ``eval.regret_states``
measure the rule's who-should-act regret against this one-step oracle (:func:`regret`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from bidswarm import metric_names as names
from bidswarm.envs.base import role_name
from bidswarm.rollout.batches import BidValueBatch
from bidswarm.rollout.keyed import group_by
from bidswarm.rollout.loop import RolloutLoop
from bidswarm.rollout.records import Episode, StepRecord


@dataclass(frozen=True)
class ActingValues:
    """The forks of one state: ``returns[agent][branch]``, the reward from the step on."""

    episode: Episode
    step: StepRecord
    returns: tuple[tuple[float, ...], ...]

    @property
    def values(self) -> list[float]:
        """Each agent's mean return over its branches."""
        return [sum(r) / len(r) for r in self.returns]

    @property
    def oracle(self) -> float:
        """The best agent's value: what the one-step oracle's choice earns."""
        return max(self.values)


def sample_states(
    episodes: list[Episode], per_episode: int, rng: random.Random, acting_only: bool = False
) -> list[tuple[Episode, StepRecord]]:
    """Up to ``per_episode`` steps with a snapshot of each episode (``acting_only``: of those
    where an agent acted), a uniform draw from ``rng`` (in episode order)."""
    chosen = []
    for episode in episodes:
        steps = [
            s
            for s in episode.steps
            if s.snapshot is not None and (s.actor is not None or not acting_only)
        ]
        chosen += [(episode, s) for s in rng.sample(steps, min(per_episode, len(steps)))]
    return chosen


def acting_values(
    loop: RolloutLoop,
    states: list[tuple[Episode, StepRecord]],
    branches: int,
    rng: random.Random,
    generator: torch.Generator,
) -> list[ActingValues]:
    """Every agent's returns from each of ``states`` over ``branches`` branches where it acts
    first (common random numbers across agents per branch index, see the module); each
    agent's branches of all states are played in one lock-step rollout."""
    if not states:
        return []
    n = loop.swarm.n_agents
    returns: list[list[list[float]]] = [[[] for _ in range(n)] for _ in states]
    for _ in range(branches):
        seed = rng.randrange(2**62)
        for agent in range(n):
            envs = loop.envs(len(states))
            for env, (_, step) in zip(envs, states, strict=True):
                env.restore(step.snapshot)
            played = [Episode(seed=episode.seed) for episode, _ in states]
            branch_generator = torch.Generator(device=generator.device).manual_seed(seed)
            loop.play(
                envs,
                played,
                random.Random(seed),
                branch_generator,
                first_actors=[agent] * len(states),
            )
            for j, branch in enumerate(played):
                returns[j][agent].append(branch.total_reward)
    return [
        ActingValues(episode, step, tuple(tuple(r) for r in agent_returns))
        for (episode, step), agent_returns in zip(states, returns, strict=True)
    ]


def value_targets(forks: ActingValues, top_level: float) -> list[float]:
    """Each agent's normalised value of acting, in bid units [0, ``top_level``]: its value as
    a share of the reward open at the episode's start (``StepRecord.open_reward`` of its first
    step: the task's whole reward, 140 on crafting, so a bid of 0.8 prices all of it and bids
    are values-to-go in one unit at every step, as the second price reads them), or, where the
    task does not say, of the best agent's value at the state; 0 when nothing is left to earn."""
    values = forks.values
    scale = forks.episode.steps[0].open_reward if forks.episode.steps else None
    if scale is None or scale <= 0:
        scale = max(values)
    if scale <= 0:
        return [0.0] * len(values)
    return [top_level * min(max(v / scale, 0.0), 1.0) for v in values]


def regret(forks: ActingValues) -> float | None:
    """The oracle's value minus the value of the agent that acted at the state (None at a
    skipped step, which no fork measures)."""
    actor = forks.step.actor
    return None if actor is None else forks.oracle - forks.values[actor]


def calibration_pairs(
    forks: list[ActingValues], roles: list[str | None], top_level: float
) -> list[tuple[str, float, float]]:
    """(role, bid, value target) of every bid at the forked states (a calibration plot)."""
    return [
        (role_name(roles[agent]), bid.level, value_targets(forked, top_level)[agent])
        for forked in forks
        for agent, bid in forked.step.bids.items()
    ]


def value_batches(
    loop: RolloutLoop, forks: list[ActingValues]
) -> tuple[list[BidValueBatch], dict[str, float]]:
    """Per agent that bid at the forked states, its bid prompts there with its value targets
    (:func:`value_targets`, in the swarm's bid units), and the metrics of the forks: how far
    the bids the agents made there were from those targets (``bids/calibration_error``), the
    regret of the rule's choice (``auction/regret`` at the acting states) and the states
    forked (``forks/value_states``)."""
    swarm = loop.swarm
    top = max(swarm.bid_levels)
    rows: list[tuple[int, list[int], float]] = []
    errors, regrets = [], []
    for forked in forks:
        targets = value_targets(forked, top)
        for agent, bid in forked.step.bids.items():
            rows.append((agent, bid.reply.prompt_ids, targets[agent]))
            errors.append(abs(bid.level - targets[agent]))
        if (found := regret(forked)) is not None:
            regrets.append(found)
    batches = [
        BidValueBatch(
            agent,
            [prompt for _, prompt, _ in items],
            [target for _, _, target in items],
            list(swarm.bid_levels),
            [swarm.level_reply_ids(agent, level) for level in swarm.bid_levels],
        )
        for agent, items in group_by(rows, lambda row: row[0])
    ]
    metrics = {"forks/value_states": float(len(forks))}
    if errors:
        metrics[names.CALIBRATION_ERROR] = sum(errors) / len(errors)
    if regrets:
        metrics[f"{names.REGRET}/train"] = sum(regrets) / len(regrets)
    return batches, metrics
