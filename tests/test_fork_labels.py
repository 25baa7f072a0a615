"""The forks' labels (PAPER.md section 4): how much of them is noise (control branches), the
options that give them more signal, and the weight that makes a draw below the runner-up worth
what the paper's rejection sampling keeps."""

from __future__ import annotations

import math
import random

import pytest
import torch
import torch.nn.functional as F

from bidswarm.algorithms.losses import bradley_terry_loss, side_score, tie_break_preference
from bidswarm.config import RLConfig
from bidswarm.coordination import Decision
from bidswarm.envs.crafting import CraftingConfig, CraftingEnv
from bidswarm.rollout.forks import choose_fork_steps, control_count, fork_pairs
from bidswarm.rollout.loop import RolloutLoop
from bidswarm.rollout.records import Episode, StepRecord
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


# -- labels with more signal [ours] ------------------------------------------------------------
def test_side_scores_are_branch_means_and_one_branch_is_the_papers_score():
    assert side_score([(0.0, 10.0), (0.0, 0.0, 30.0)]) == 20.0
    rewards = (0.1, 0.2, 0.3)
    assert side_score([rewards]) == sum(rewards)


def test_tie_breaks_prefer_the_earlier_reward_then_progress_within_the_tolerance():
    assert tie_break_preference([(0.0, 10.0, 0.0)], [(10.0, 0.0, 0.0)], [None], [None]) == -1
    assert tie_break_preference([(10.0,)], [(0.0, 10.0)], [None], [None]) == 1
    assert tie_break_preference([(0.0, 0.0)], [(0.0,)], [-3.0], [-5.0]) == 1
    assert tie_break_preference([(0.0,)], [(0.0,)], [-3.0], [None]) == 0
    # the same milestones summed in another order are no earlier reward
    a, b = (0.1, 0.2, 0.3), (0.3, 0.2, 0.1)
    tied = [(sum(a),)], [(sum(b),)]
    assert tie_break_preference(*tied, [1.0], [1.0 + 1e-12]) == 0
    # means over K branches: (0, 10) and (10, 0) on one side against (5, 5) on the other
    assert tie_break_preference([(0.0, 10.0), (10.0, 0.0)], [(5.0, 5.0)], [None] * 2, [None]) == 0


def test_half_label_ties_pull_the_margin_to_zero_and_leave_decisive_pairs_alone():
    winner = torch.tensor([0.5, -1.0, 2.0], requires_grad=True)
    loser = torch.tensor([0.0, 0.0, 0.0])
    plain = bradley_terry_loss(winner, loser)["loss_bid"]
    none_tied = bradley_terry_loss(winner, loser, ties=torch.zeros(3, dtype=torch.bool))
    assert torch.equal(none_tied["loss_bid"], plain)
    ties = torch.tensor([False, True, False])
    terms = bradley_terry_loss(winner, loser, ties=ties)
    by_hand = (
        -F.logsigmoid(torch.tensor(0.5))
        - (F.logsigmoid(torch.tensor(-1.0)) + F.logsigmoid(torch.tensor(1.0))) / 2
        - F.logsigmoid(torch.tensor(2.0))
    ) / 3
    assert terms["loss_bid"].item() == pytest.approx(by_hand.item())
    assert terms["preference_accuracy"].item() == 1.0  # over the two decisive pairs
    (grad,) = torch.autograd.grad(terms["loss_bid"], winner)
    assert grad[1] < 0  # the tied pair's margin -1 is pushed up, toward 0
    at_zero = bradley_terry_loss(torch.zeros(1), torch.zeros(1), ties=torch.ones(1, dtype=bool))
    assert at_zero["loss_bid"].item() == pytest.approx(math.log(2))


def test_open_reward_selection_reads_only_the_state_at_the_fork():
    def contested(index: int, open_reward: float | None) -> StepRecord:
        decision = Decision(actor=0, winning_bid=0.8, runner_up=1, runner_up_bid=0.4)
        return StepRecord(index, decision, snapshot={}, open_reward=open_reward)

    steps = [contested(0, 140.0), contested(5, 0.0), contested(9, 100.0), contested(11, 40.0)]
    episode = Episode(0, steps)
    counts = {s.index: 0 for s in steps}
    for seed in range(400):
        for step in choose_fork_steps(episode, steps, "open_reward", 1, random.Random(seed), 12):
            counts[step.index] += 1
    # weights 140 x 12, 0, 100 x 3, 40 x 1: the draw follows them; nothing open: never first
    assert counts[5] == 0
    assert counts[0] > counts[9] > counts[11]
    assert counts[0] / 400 == pytest.approx(1680 / 2020, abs=0.06)
    everything = choose_fork_steps(episode, steps, "open_reward", 4, random.Random(0), 12)
    assert sorted(s.index for s in everything) == [0, 5, 9, 11] and everything[-1].index == 5


def test_k_branches_per_side_and_ties_kept_as_half_labels(loop):
    """K = 2: each fork plays 2 runner-up branches and 1 replay of the winner (more rollout
    tokens than K = 1); with half-label ties every played fork makes a pair."""
    _, _, one, one_usage = forks(loop, RLConfig(fork_budget=2, control_forks=0.0))
    rl = RLConfig(fork_budget=2, control_forks=0.0, fork_branches=2, bt_ties="half_label")
    _, pairs, two, two_usage = forks(loop, rl)
    assert two.resampled_below == one.resampled_below > 0
    assert two_usage.rollout_tokens > one_usage.rollout_tokens
    assert len(pairs) == two.pairs == two.resampled_below
    assert sum(pair.tied for pair in pairs) == two.tied


def test_crafting_reports_what_is_open_and_how_far_the_plan_is():
    env = CraftingEnv(CraftingConfig(target="wooden_pickaxe", max_decisions=30))
    env.reset(0)
    assert env.open_reward() == pytest.approx(sum(env.milestones.values()))
    start = env.progress()
    assert start < 0
    while env.expert_action(None) and not env.done:
        env.step("logger", "chop a tree")
        if env.obtained:
            break
    assert env.open_reward() < sum(env.milestones.values())
    assert env.progress() > start
