"""The forks' labels (docs/method.md section 4): how much of them is noise (control branches), the
options that give them more signal, and the weight that makes a draw below the runner-up worth
what the paper's rejection sampling keeps."""

from __future__ import annotations

import math
import random

import pytest
import torch
import torch.nn.functional as F

from bidswarm.agents.population import Population
from bidswarm.agents.prompts import PromptTemplate
from bidswarm.algorithms.losses import bradley_terry_loss, side_score, tie_break_preference
from bidswarm.config import ModelConfig, RLConfig, TinyArchConfig
from bidswarm.coordination import Decision
from bidswarm.coordination.auction import Auction
from bidswarm.envs.crafting import CraftingConfig, CraftingEnv
from bidswarm.rollout.forks import (
    ForkStats,
    choose_fork_steps,
    control_count,
    fork_pairs,
    kept_by_rejection,
    redraw_bids,
)
from bidswarm.rollout.loop import RolloutLoop
from bidswarm.rollout.records import Episode, StepRecord
from bidswarm.rollout.swarm import Swarm
from conftest import hf_engine, tiny_crafting_swarm

LEVELS = [0.0, 0.2, 0.4, 0.6, 0.8]


PLAY_EVERY_FORK = "below_runner_up"
"""The untrained agents of :func:`loop` rarely reply a parsed bid: a draw among the levels
below plays every chosen fork, what the tests of controls and branches need."""


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
    _, plain, plain_stats, plain_usage = forks(
        loop, RLConfig(fork_budget=3, control_forks=0.0, bid_resample=PLAY_EVERY_FORK)
    )
    _, pairs, stats, usage = forks(
        loop, RLConfig(fork_budget=3, control_forks=1.0, bid_resample=PLAY_EVERY_FORK)
    )
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
    rl = RLConfig(fork_budget=3, control_forks=0.5, bid_resample=PLAY_EVERY_FORK)
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
    _, _, one, one_usage = forks(
        loop, RLConfig(fork_budget=2, control_forks=0.0, bid_resample=PLAY_EVERY_FORK)
    )
    rl = RLConfig(fork_budget=2, control_forks=0.0, fork_branches=2, bt_ties="half_label")
    rl.bid_resample = PLAY_EVERY_FORK
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


# -- the weight of a draw below the runner-up: non-canonical replies ---------------------------
SPELLINGS = {"0.0": 0.05, "0.2": 0.05, "0.20": 0.15, "0": 0.1, "0.4": 0.1}
"""Replies that parse below 0.6, two in spellings that are no level's canonical string."""
ABOVE = {"0.6": 0.2, "0.8": 0.2, "none": 0.15}
"""Replies that rejection turns down at a runner-up of 0.6 (``none`` is malformed)."""


@pytest.fixture(scope="module")
def spelling_loop() -> RolloutLoop:
    """A tiny swarm whose Miner replies to its bid prompt with the texts of ``SPELLINGS`` and
    ``ABOVE`` at about their shares: a third of its mass parses below 0.6 without being a
    canonical level string (as SmolLM2's replies do after SFT)."""
    env = CraftingEnv(CraftingConfig(max_decisions=12))
    env.reset(0)
    shares = SPELLINGS | ABOVE
    texts = PromptTemplate.for_env(env, "compact", None, LEVELS)
    corpus = [texts.bid("miner", env.observation("miner")) + texts.reply_text(r) for r in shares]
    arch = TinyArchConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    cfg = ModelConfig(name="tiny", source="tiny", prompt_style="compact", tiny=arch)
    torch.manual_seed(0)
    population = Population.build(cfg, list(env.roles), 1, corpus * 20)
    prompts = PromptTemplate.for_env(env, "compact", population.agents[0].tokenizer, LEVELS)
    agent = population.agents[1]
    prompt = agent.encode_prompts([prompts.bid("miner", env.observation("miner"))])
    replies = [agent.encode_reply(prompts.reply_text(r)) for r in shares]
    weights = torch.tensor(list(shares.values()))
    optimizer = torch.optim.Adam(agent.parameters(), lr=2e-2)
    for _ in range(150):
        logp, mask = agent.reply_token_logprobs(prompt * len(replies), replies)
        loss = -((logp * mask).sum(dim=1) * weights).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    longest = max(len(r) for r in replies)
    swarm = Swarm(population, prompts, longest + 1, 6, 1.0, hf_engine())
    return RolloutLoop(lambda: CraftingEnv(CraftingConfig(max_decisions=12)), swarm, Auction())


def _rejection_keeps(loop, env, replicates, tries, malformed, generator):
    """Per replicate, the paper's rejection sampling with ``tries`` tries at a runner-up of
    0.6: (kept, the kept reply is not a canonical level string)."""
    bids = loop.swarm.bid(1, [env] * replicates, generator, copies=tries)
    kept, odd = torch.zeros(replicates), torch.zeros(replicates)
    for r in range(replicates):
        for bid in bids[r * tries : (r + 1) * tries]:
            if kept_by_rejection(bid, 0.6, malformed):
                kept[r], odd[r] = 1.0, float(bid.reply.text.strip() not in CANONICAL)
                break
    return kept, odd


CANONICAL = {f"{level:.1f}" for level in LEVELS}


def _weighted_keeps(loop, env, replicates, rl, generator):
    """Per replicate fork, the production redraw's weight w and w x (the counterfactual reply
    is not a canonical level string)."""
    decision = Decision(actor=1, winning_bid=0.8, runner_up=0, runner_up_bid=0.6)
    steps = [StepRecord(0, decision, snapshot={}) for _ in range(replicates)]
    found, weights = redraw_bids(loop, [env] * replicates, steps, rl, generator, ForkStats())
    w = torch.tensor(weights)
    odd = torch.tensor([float(r is not None and r.text.strip() not in CANONICAL) for r in found])
    return w, w * odd


def _gap(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    return abs(float(a.mean() - b.mean())), math.sqrt(float(a.var() / len(a) + b.var() / len(b)))


@pytest.mark.parametrize("malformed", ["failed_try", "bid_zero"])
def test_weighted_forks_have_the_expectation_of_rejection_with_non_canonical_replies(
    spelling_loop, malformed
):
    """Monte Carlo: the default redraw's weights (and its weights on forks whose counterfactual
    reply is a non-canonical spelling) have the expectation of the paper's three tries, which
    keep any reply that parses below the runner-up (and a malformed one as bid 0 under
    ``bid_zero``); q from the canonical strings alone (``weighted_below_runner_up``) does not."""
    env = CraftingEnv(CraftingConfig(max_decisions=12))
    env.reset(0)
    replicates, generator = 3000, torch.Generator().manual_seed(0)
    kept, odd = _rejection_keeps(spelling_loop, env, replicates, 3, malformed, generator)
    assert float(odd.mean()) > 0.1 and float(kept.mean()) < 0.99, "the fit lost its spread"
    rl = RLConfig(malformed_resample=malformed)
    weights, odd_weights = _weighted_keeps(spelling_loop, env, replicates, rl, generator)
    gap, se = _gap(weights, kept)
    assert gap < 4 * se, f"weights {weights.mean():.4f} vs rejection {kept.mean():.4f}"
    gap, se = _gap(odd_weights, odd)
    assert gap < 4 * se, f"non-canonical {odd_weights.mean():.4f} vs rejection {odd.mean():.4f}"
    if malformed == "failed_try":
        canonical = RLConfig(bid_resample="weighted_below_runner_up")
        weights, _ = _weighted_keeps(spelling_loop, env, replicates, canonical, generator)
        gap, se = _gap(weights, kept)
        assert gap > 6 * se, f"canonical q {weights.mean():.4f} ~ rejection {kept.mean():.4f}"
