"""The forks' labels (PAPER.md section 4): how much of them is noise (control branches), the
options that give them more signal, and the weight that makes a draw below the runner-up worth
what the paper's rejection sampling keeps."""

from __future__ import annotations

import random

import pytest
import torch

from bidswarm.config import RLConfig
from bidswarm.rollout.forks import control_count, fork_pairs
from bidswarm.rollout.loop import RolloutLoop
from conftest import tiny_crafting_swarm


@pytest.fixture(scope="module")
def loop() -> RolloutLoop:
    return tiny_crafting_swarm(max_decisions=12)[2]


def forks(loop: RolloutLoop, rl: RLConfig, seed: int = 3, worlds: int = 6):
    """The episodes of ``worlds`` worlds and their forks' pairs, stats and the rollout tokens
    the forks cost, all drawn from ``seed``."""
    rng, generator = random.Random(seed), torch.Generator().manual_seed(seed)
    episodes = loop.run(list(range(worlds)), rng, generator, keep_snapshots=True)
    with loop.swarm.separate_usage() as usage:
        pairs, stats = fork_pairs(loop, episodes, rl, rng, generator)
    return episodes, pairs, stats, usage


# -- label noise: control branches -------------------------------------------------------------
def test_control_count_is_the_share_of_the_played_forks_rounded_up():
    assert control_count(48, 0.125) == 6
    assert control_count(3, 0.125) == 1
    assert control_count(5, 1.0) == 5
    assert control_count(5, 0.0) == control_count(0, 0.5) == 0


def test_control_branches_are_counted_and_never_reach_the_pairs(loop):
    """With controls the pairs are those without them (the controls play after every pair is
    made), the controls' rollout tokens are counted, and the funnel reports both rates."""
    _, plain, plain_stats, plain_usage = forks(loop, RLConfig(fork_budget=3, control_forks=0.0))
    _, pairs, stats, usage = forks(loop, RLConfig(fork_budget=3, control_forks=1.0))
    assert stats.resampled_below > 0
    assert pairs == plain
    assert [p.weight for p in pairs] == [p.weight for p in plain]
    assert (stats.tied, stats.pairs) == (plain_stats.tied, plain_stats.pairs)
    assert plain_stats.control == 0 and stats.control == stats.resampled_below
    assert 0 <= stats.control_tied <= stats.control
    assert usage.rollout_tokens > plain_usage.rollout_tokens
    assert usage.rollout_flops > plain_usage.rollout_flops
    metrics, plain_metrics = stats.as_metrics(), plain_stats.as_metrics()
    assert metrics["forks/untied"] == plain_metrics["forks/untied"]
    assert metrics["forks/untied"] == pytest.approx(1 - stats.tied / stats.resampled_below)
    assert metrics["forks/control_untied"] == pytest.approx(1 - stats.control_tied / stats.control)
    assert "forks/control_untied" not in plain_metrics


def test_a_share_of_the_played_forks_plays_controls(loop):
    """A share of 1/2 plays ceil(played / 2) control branches."""
    rl = RLConfig(fork_budget=3, control_forks=0.5)
    _, _, stats, _ = forks(loop, rl, seed=4)
    assert stats.control == control_count(stats.resampled_below, 0.5) > 0
