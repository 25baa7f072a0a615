"""Held-out evaluation: every held-out world x ``runs_per_seed`` runs; statistics over worlds.

The episodes are cut into batches of ``batch_size`` played in lock-step
(:func:`evaluation_batches`), and each batch draws its randomness from a key of its own
(:func:`batch_randomness`): the batch, not the process that plays it, decides its episodes. So
several processes can share an evaluation (:func:`play_batches`: batch ``b`` on process
``b mod processes``) and, gathered in batch order (:func:`summarize_evaluation`), give exactly
the numbers of one process playing every batch. The batch is the unit, not the world: the
episodes of one lock-step batch share the sampling generator, and a batch's size and padding
enter its float arithmetic. A rule that remembers across episodes (AgentNet's memory of
successful steps) is the exception: each process's memory holds what that process played.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from bidswarm import metric_names as names
from bidswarm.rollout.acting_values import acting_values, regret, sample_states
from bidswarm.rollout.keyed import seeded_randomness
from bidswarm.rollout.loop import RolloutLoop
from bidswarm.rollout.market import valid_level_mass
from bidswarm.rollout.metrics import episode_metrics
from bidswarm.rollout.records import Bid, Episode
from bidswarm.rollout.usage import Usage
from bidswarm.statistics import pass_at_k_over_worlds, per_world_means, summarize


@dataclass
class Evaluation:
    """What an evaluation measured.

    metrics: ``episode_metrics`` of all episodes, except that ``reward/mean``, ``reward/se``,
             ``reward/ci_low`` and ``reward/ci_high`` (95% t interval) are over the per-world
             mean rewards (``worlds`` of them): the runs of one world are not independent.
    world_rewards: mean reward per held-out world id, to pair arms on the same worlds.
    world_pass_at_k: k -> held-out world id -> pass@k of task success on that world.
    usage: tokens and FLOPs the evaluation itself spent (never added to the swarm's training
           counters).
    """

    metrics: dict[str, float]
    episodes: list[Episode]
    world_rewards: dict[int, float]
    world_pass_at_k: dict[int, dict[int, float]]
    usage: Usage

    def write_worlds(self, folder: Path, key: str) -> list[Path]:
        """The per-world results as ``folder/<key>_worlds.json`` (mean reward) and
        ``folder/<key>_pass_at_<k>_worlds.json`` (pass@k of task success), world ids as keys,
        so that arms and phases can be paired on the same worlds; returns the files."""
        folder.mkdir(parents=True, exist_ok=True)
        per_world = {key: self.world_rewards} | {
            f"{key}_pass_at_{k}": values for k, values in self.world_pass_at_k.items()
        }
        paths = []
        for name, values in per_world.items():
            path = folder / f"{name}_worlds.json"
            path.write_text(json.dumps({str(w): v for w, v in values.items()}, indent=1) + "\n")
            paths.append(path)
        return paths


@dataclass
class PlayedBatches:
    """The batches one process played: batch index -> its episodes, and what they cost."""

    episodes: dict[int, list[Episode]] = field(default_factory=dict)
    usage: Usage = field(default_factory=Usage)
    regrets: dict[int, list[tuple[int, float, float]]] = field(default_factory=dict)
    """Batch index -> (world, who-should-act regret, the oracle's value) of each state its
    forks measured (:func:`batch_regrets`; empty without ``regret_states``)."""

    def without_token_ids(self) -> PlayedBatches:
        """The same episodes with their replies' token ids left out (empty), to send to another
        process: nothing computed from an evaluation reads them (its metrics, transcripts and
        memory trees read rewards, decisions and texts), and the prompts' ids are most of an
        episode's size."""
        return PlayedBatches(
            {b: [_without_token_ids(e) for e in batch] for b, batch in self.episodes.items()},
            self.usage,
            self.regrets,
        )


def evaluation_batches(seeds: list[int], runs_per_seed: int, batch_size: int) -> list[list[int]]:
    """The worlds of each batch: every seed ``runs_per_seed`` times (its runs consecutive), in
    ``seeds``' order, cut into batches of ``batch_size`` (the last one shorter)."""
    worlds = [s for s in seeds for _ in range(runs_per_seed)]
    return [worlds[start : start + batch_size] for start in range(0, len(worlds), batch_size)]


def batch_randomness(
    seed: int, batch: int, device: torch.device | str
) -> tuple[random.Random, torch.Generator]:
    """The randomness of evaluation batch ``batch`` of the run of ``seed``: key ``eval/<seed>``
    for batch 0, ``eval/<seed>/<batch>`` for the others. Batch 0 keeps the key that the whole
    evaluation drew from before batches were keyed one by one, so an evaluation of one batch
    gives the numbers it gave then; one of several batches does not (its later batches drew
    from where the earlier ones left the shared generators, which no other process can know)."""
    key = f"eval/{seed}" if batch == 0 else f"eval/{seed}/{batch}"
    return seeded_randomness(key, device)


def play_batches(
    loop: RolloutLoop,
    seeds: list[int],
    runs_per_seed: int,
    seed: int,
    batch_size: int = 64,
    rank: int = 0,
    processes: int = 1,
    progress: bool = False,
    regret_states: int = 0,
) -> PlayedBatches:
    """Play the evaluation's batches ``rank, rank + processes, ...`` (sampling, each batch's own
    randomness), counting into a ledger of its own (``Swarm.evaluating``, which also sets the
    bids' evaluation temperature) so that held-out evaluation never shows up in the training
    ``tokens/*`` and ``flops/*``. ``progress``: a bar on stderr (process 0) over the lock-step
    decisions, ``task.max_decisions`` per batch (a
    batch whose episodes all end sooner jumps to its end)."""
    device = next(loop.swarm.population.parameters()).device
    batches = evaluation_batches(seeds, runs_per_seed, batch_size)
    mine = range(rank, len(batches), processes)
    horizon = loop.horizon
    shown = progress and rank == 0
    bar = tqdm(total=len(mine) * horizon, desc="held-out", unit="decision", disable=not shown)
    played = PlayedBatches()
    with loop.swarm.evaluating() as usage, bar:
        for position, index in enumerate(mine):
            bar.set_postfix(batch=f"{position + 1}/{len(mine)}", episodes=len(batches[index]))
            rng, generator = batch_randomness(seed, index, device)
            episodes = loop.run(
                batches[index],
                rng,
                generator,
                on_decision=lambda: bar.update(1),
                snapshot_every_step=regret_states > 0,
            )
            if regret_states:
                played.regrets[index] = batch_regrets(loop, episodes, regret_states, seed, index)
            played.episodes[index] = episodes
            bar.update((position + 1) * horizon - bar.n)
    played.usage = usage
    return played


def batch_regrets(
    loop: RolloutLoop, episodes: list[Episode], per_world: int, seed: int, batch: int
) -> list[tuple[int, float, float]]:
    """The who-should-act regret (``rollout/acting_values.py``) at up to ``per_world`` acting
    states of the first episode of each world in ``episodes`` (drawn from a key of the batch's own,
    so the evaluation's episodes are those without it), one branch per agent, its tokens
    counted in no ledger (the evaluation's ``flops`` are the rule's own cost); the episodes'
    snapshots are dropped after. (world, regret, the oracle's value) per acting state."""
    device = next(loop.swarm.population.parameters()).device
    rng, generator = seeded_randomness(f"regret/{seed}/{batch}", device)
    firsts = list({e.seed: e for e in reversed(episodes)}.values())
    with loop.swarm.separate_usage():  # a measurement of the rule, not the rule's own cost
        states = sample_states(firsts, per_world, rng, acting_only=True)
        forks = acting_values(loop, states, 1, rng, generator)
    for step in (s for e in episodes for s in e.steps):
        step.snapshot = None
    return [(f.episode.seed, r, f.oracle) for f in forks if (r := regret(f)) is not None]


def summarize_evaluation(
    parts: list[PlayedBatches], loop: RolloutLoop, runs_per_seed: int, mass_probe_prompts: int = 0
) -> Evaluation:
    """The evaluation of every batch that ``parts`` (one per process) played, its episodes in
    batch order as one process plays them: statistics over worlds, pass@k, the usage summed,
    and the bid policies' valid-level mass at up to ``mass_probe_prompts`` bid prompts per
    agent (``rollout/market.py``; 0: not measured)."""
    by_batch = {index: batch for part in parts for index, batch in part.episodes.items()}
    episodes = [e for index in sorted(by_batch) for e in by_batch[index]]
    usage = Usage()
    for part in parts:
        usage = usage + part.usage
    world_rewards = per_world_means([e.total_reward for e in episodes], [e.seed for e in episodes])
    reward = summarize(list(world_rewards.values()))
    metrics = episode_metrics(episodes, loop.swarm.roles, loop.swarm.bid_levels) | {
        "reward/mean": reward.mean,
        "reward/se": reward.se,
        "reward/ci_low": reward.ci_low,
        "reward/ci_high": reward.ci_high,
        "worlds": float(reward.n),
    }
    if mass_probe_prompts:
        metrics |= valid_level_mass(loop.swarm, episodes, mass_probe_prompts)
    regrets = [state for part in parts for batch in part.regrets.values() for state in batch]
    if regrets:
        worlds = [w for w, _, _ in regrets]
        summary = summarize(list(per_world_means([r for _, r, _ in regrets], worlds).values()))
        oracle = per_world_means([o for _, _, o in regrets], worlds).values()
        metrics |= {
            f"{names.REGRET}/mean": summary.mean,
            f"{names.REGRET}/ci_low": summary.ci_low,
            f"{names.REGRET}/ci_high": summary.ci_high,
            f"{names.REGRET}/states": float(len(regrets)),
            f"{names.REGRET}/oracle": sum(oracle) / len(oracle),
        }
    pass_metrics, world_pass_at_k = pass_at_k_metrics(episodes, runs_per_seed)
    return Evaluation(metrics | pass_metrics, episodes, world_rewards, world_pass_at_k, usage)


def evaluate(
    loop: RolloutLoop,
    seeds: list[int],
    runs_per_seed: int,
    seed: int,
    batch_size: int = 64,
    progress: bool = False,
    mass_probe_prompts: int = 0,
    regret_states: int = 0,
) -> Evaluation:
    """Play ``seeds`` x ``runs_per_seed`` episodes in this process, ``batch_size`` in lock-step
    at a time (:func:`play_batches`, with its bar if ``progress``), and summarize them."""
    played = play_batches(
        loop, seeds, runs_per_seed, seed, batch_size, progress=progress, regret_states=regret_states
    )
    return summarize_evaluation([played], loop, runs_per_seed, mass_probe_prompts)


def _without_token_ids(episode: Episode) -> Episode:
    steps = [
        replace(
            step,
            bids={
                agent: Bid(bid.level, replace(bid.reply, prompt_ids=[], reply_ids=[]), bid.parsed)
                for agent, bid in step.bids.items()
            },
            action=None
            if step.action is None
            else replace(step.action, prompt_ids=[], reply_ids=[]),
        )
        for step in episode.steps
    ]
    return Episode(episode.seed, steps, episode.metrics)


def pass_at_k_metrics(
    episodes: list[Episode], runs_per_seed: int
) -> tuple[dict[str, float], dict[int, dict[int, float]]]:
    """``pass_at_<k>/mean|se|ci_low|ci_high`` (pass@k; MLflow names take no ``@``) of task
    success for k = 1..runs_per_seed: the unbiased estimator per world from its
    ``runs_per_seed`` attempts, the 95% Wilson interval over worlds (within [0, 1]); and
    k -> world -> that world's pass@k. Every task's episodes report ``success`` (crafting: the
    target obtained; navigation: stopped within the success distance; research: a correct
    answer)."""
    successes = [e.metrics["success"] for e in episodes]
    worlds = [e.seed for e in episodes]
    metrics, per_world = {}, {}
    for k in range(1, runs_per_seed + 1):
        summary, per_world[k] = pass_at_k_over_worlds(successes, worlds, k)
        metrics |= {
            f"pass_at_{k}/mean": summary.mean,
            f"pass_at_{k}/se": summary.se,
            f"pass_at_{k}/ci_low": summary.ci_low,
            f"pass_at_{k}/ci_high": summary.ci_high,
        }
    return metrics, per_world
