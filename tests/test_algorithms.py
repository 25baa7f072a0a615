"""Property tests of MPT's pure math: auction (Eq. 1), credit (Eq. 2) and losses (Eqs. 2-3)."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor

from bidswarm.algorithms import (
    CREDIT_RULES,
    AuctionOutcome,
    bradley_terry_loss,
    bucket_brigade_credit,
    draw_below,
    episode_return_credit,
    fork_preference,
    make_credit,
    random_bid_credit,
    reinforce_loss,
    rejection_keep_probability,
    reward_to_go_credit,
    run_auction,
)
from bidswarm.algorithms.credit import ReadEdge, second_price_credit
from bidswarm.algorithms.credit.second_price import CRAFTING_PRICE_SCALE, SecondPriceConfig

BID_LEVELS = (0.0, 0.2, 0.4, 0.6, 0.8)

rewards_strategy = st.lists(
    st.floats(min_value=-100.0, max_value=100.0, allow_nan=False), min_size=0, max_size=60
)


def _episode(draw: st.DrawFn) -> tuple[list[float], list[float]]:
    rewards = draw(rewards_strategy)
    bids = draw(
        st.lists(
            st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
            min_size=len(rewards),
            max_size=len(rewards),
        )
    )
    return rewards, bids


episodes = st.composite(_episode)()


def _conserves(credits: list[float], discarded: float, rewards: list[float]) -> bool:
    return math.isclose(sum(credits) + discarded, sum(rewards), rel_tol=1e-9, abs_tol=1e-9)


# --- auction (Eq. 1) ---------------------------------------------------------------------


@given(st.lists(st.sampled_from(BID_LEVELS), min_size=1, max_size=8), st.integers(0, 2**32))
def test_auction_winner_holds_the_highest_bid(bids: list[float], seed: int) -> None:
    outcome = run_auction(bids, random.Random(seed))
    if max(bids) == 0.0:
        assert outcome.skipped and not outcome.contested
        return
    assert outcome.winner is not None
    assert bids[outcome.winner] == max(bids) == outcome.winning_bid
    others = [bid for index, bid in enumerate(bids) if index != outcome.winner]
    expected_runner_up_bid = max(others, default=0.0)
    assert outcome.runner_up_bid == expected_runner_up_bid
    assert outcome.contested == (expected_runner_up_bid > 0.0)
    if outcome.runner_up is None:
        assert expected_runner_up_bid == 0.0
    else:
        assert outcome.runner_up != outcome.winner
        assert bids[outcome.runner_up] == outcome.runner_up_bid


def test_auction_all_zero_bids_skip_the_step() -> None:
    outcome = run_auction([0.0, 0.0, 0.0], random.Random(0))
    assert outcome == AuctionOutcome(None, 0.0, None, 0.0)
    assert outcome.skipped and not outcome.contested


def test_auction_three_way_tie_is_uniform_and_contested() -> None:
    rng = random.Random(1234)
    winners: Counter[int] = Counter()
    draws = 3000
    for _ in range(draws):
        outcome = run_auction([0.6, 0.2, 0.6, 0.6], rng)
        assert outcome.contested and outcome.runner_up_bid == outcome.winning_bid == 0.6
        assert outcome.runner_up in {0, 2, 3} and outcome.runner_up != outcome.winner
        winners[outcome.winner] += 1
    assert set(winners) == {0, 2, 3}
    for count in winners.values():
        assert 0.28 <= count / draws <= 0.39


def test_auction_lone_positive_bid_is_uncontested() -> None:
    outcome = run_auction([0.0, 0.4, 0.0], random.Random(0))
    assert outcome.winner == 1 and outcome.runner_up is None
    assert not outcome.contested and not outcome.skipped


def test_auction_rejects_negative_or_missing_bids() -> None:
    with pytest.raises(ValueError, match="agent 1"):
        run_auction([0.2, -0.2], random.Random(0))
    with pytest.raises(ValueError, match="at least one bid"):
        run_auction([], random.Random(0))


# --- credit (Eq. 2) ----------------------------------------------------------------------


def test_bucket_brigade_worked_example() -> None:
    credits, discarded = bucket_brigade_credit([0.0, 0.0, 10.0], [0.8, 0.4, 0.6])
    assert credits == pytest.approx([0.48, 3.6, 4.0], abs=1e-12)
    assert discarded == pytest.approx(1.92, abs=1e-12)


def test_credit_of_an_empty_episode() -> None:
    assert bucket_brigade_credit([], []) == ([], 0.0)
    assert random_bid_credit([], random.Random(0), BID_LEVELS) == ([], 0.0)
    assert episode_return_credit([]) == ([], 0.0)


@given(episodes)
def test_bucket_brigade_conserves_the_return(episode: tuple[list[float], list[float]]) -> None:
    rewards, bids = episode
    credits, discarded = bucket_brigade_credit(rewards, bids)
    assert len(credits) == len(rewards)
    assert _conserves(credits, discarded, rewards)


@given(rewards_strategy, st.integers(0, 2**32))
def test_random_credit_conserves_the_return(rewards: list[float], seed: int) -> None:
    credits, discarded = random_bid_credit(rewards, random.Random(seed), BID_LEVELS)
    assert len(credits) == len(rewards)
    assert _conserves(credits, discarded, rewards)


def test_random_credit_is_the_brigade_over_drawn_bids() -> None:
    rewards = [1.0, 0.0, 3.0, 5.0]
    rng = random.Random(7)
    drawn_bids = [rng.choice(BID_LEVELS) for _ in rewards]
    assert random_bid_credit(rewards, random.Random(7), BID_LEVELS) == bucket_brigade_credit(
        rewards, drawn_bids
    )


def test_episode_return_credit_gives_every_step_the_return() -> None:
    assert episode_return_credit([1.0, -2.0, 4.0]) == ([3.0, 3.0, 3.0], 0.0)


def test_reward_to_go_credit_sums_the_rewards_from_each_step_on() -> None:
    assert reward_to_go_credit([1.0, -2.0, 4.0]) == ([3.0, 2.0, 4.0], 0.0)
    assert reward_to_go_credit([]) == ([], 0.0)


@given(st.lists(st.floats(-100, 100), max_size=30))
def test_reward_to_go_equals_bucket_brigade_with_every_bid_passing_all_upstream(rewards) -> None:
    """With b = 1 nobody keeps anything in Eq. 2; reward to go is what each v_t carries."""
    credits, _ = reward_to_go_credit(rewards)
    value = 0.0
    for step in reversed(range(len(rewards))):
        value += rewards[step]
        assert credits[step] == pytest.approx(value, abs=1e-9)


def credit_rule(name: str):
    """The registered rule ``name`` with its schema's defaults."""
    rule = CREDIT_RULES[name]
    return make_credit(rule.Config(name=name))


@pytest.mark.parametrize("name", sorted(CREDIT_RULES))
def test_credit_rules_share_one_signature(name) -> None:
    """Whatever the registry holds: built from its config, a rule takes the uniform arguments
    and returns one credit per acting step and what it discarded; a rule that draws no
    randomness gives the same credits from any ``rng``; one that reads no memory ignores it."""
    rule = credit_rule(name)
    assert rule.name == name
    rewards, bids, runner_up = [0.0, 0.0, 10.0], [0.8, 0.4, 0.6], [0.6, 0.2, 0.0]
    credits, lost = rule(rewards, bids, runner_up, random.Random(0), BID_LEVELS)
    assert len(credits) == len(rewards) and all(math.isfinite(c) for c in [*credits, lost])
    assert rule([], [], [], random.Random(0), BID_LEVELS) == ([], 0.0)
    if not rule.draws_randomness:
        assert rule(rewards, bids, runner_up, random.Random(9), BID_LEVELS) == (credits, lost)
    if not rule.reads_memory:
        reads = [[], [ReadEdge(0, 1.0)], [ReadEdge(1, 2.0)]]
        assert rule(rewards, bids, runner_up, random.Random(0), BID_LEVELS, reads) == (
            credits,
            lost,
        )


def test_each_credit_rule_applies_its_equation() -> None:
    rewards, bids, runner_up = [0.0, 0.0, 10.0], [0.8, 0.4, 0.6], [0.6, 0.2, 0.4]
    chain = (rewards, bids, runner_up)
    assert credit_rule("reward_to_go")(*chain, random.Random(0), BID_LEVELS) == reward_to_go_credit(
        rewards
    )
    assert credit_rule("bucket_brigade")(
        *chain, random.Random(0), BID_LEVELS
    ) == bucket_brigade_credit(rewards, bids)
    assert credit_rule("random")(*chain, random.Random(3), BID_LEVELS) == random_bid_credit(
        rewards, random.Random(3), BID_LEVELS
    )
    assert credit_rule("episode_return")(
        *chain, random.Random(0), BID_LEVELS
    ) == episode_return_credit(rewards)
    assert credit_rule("second_price")(*chain, random.Random(0), BID_LEVELS) == second_price_credit(
        rewards, runner_up, CRAFTING_PRICE_SCALE
    )


def test_bucket_brigade_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="one entry per acting step"):
        bucket_brigade_credit([1.0, 2.0], [0.4])
    with pytest.raises(ValueError, match="step 1"):
        bucket_brigade_credit([1.0, 2.0], [0.4, 1.5])


# --- second-price credit [ours] -----------------------------------------------------------


def test_second_price_worked_example() -> None:
    credits, discarded = second_price_credit([0.0, 0.0, 10.0], [0.4, 0.6, 0.2], 10.0)
    assert credits == pytest.approx([2.0, -4.0, 8.0], abs=1e-12)
    assert discarded == pytest.approx(4.0, abs=1e-12)
    assert second_price_credit([], [], 10.0) == ([], 0.0)


@given(episodes, st.floats(min_value=0.01, max_value=1000.0))
def test_second_price_conserves_the_return(episode, price_scale) -> None:
    rewards, runner_up = episode
    credits, discarded = second_price_credit(rewards, runner_up, price_scale)
    assert len(credits) == len(rewards)
    assert math.isclose(
        sum(credits) + discarded, sum(rewards), rel_tol=1e-9, abs_tol=1e-9 * (1 + price_scale)
    )


@given(episodes, st.floats(min_value=0.01, max_value=1000.0))
def test_second_price_is_the_reward_minus_a_price_difference(episode, price_scale) -> None:
    """c_t - r_t = p_{t+1} - p_t, the prices being the runner-ups' bids in reward units; the
    first price is the discarded share."""
    rewards, runner_up = episode
    credits, discarded = second_price_credit(rewards, runner_up, price_scale)
    prices = [price_scale * bid for bid in runner_up] + [0.0]
    for step, (credit, reward) in enumerate(zip(credits, rewards, strict=True)):
        assert credit - reward == pytest.approx(
            prices[step + 1] - prices[step], abs=1e-9 * (1 + price_scale + abs(reward))
        )
    assert discarded == (prices[0] if rewards else 0.0)


def test_second_price_without_runner_ups_is_the_step_reward() -> None:
    """A chain with no contested step (or a rule without bids) charges nothing."""
    assert second_price_credit([1.0, -2.0, 4.0], [0.0, 0.0, 0.0], 175.0) == ([1.0, -2.0, 4.0], 0.0)


def test_second_price_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="one entry per acting step"):
        second_price_credit([1.0, 2.0], [0.4], 10.0)
    with pytest.raises(ValueError, match="acting step 1"):
        second_price_credit([1.0, 2.0], [0.4, 1.5], 10.0)
    with pytest.raises(ValueError, match="price_scale"):
        second_price_credit([1.0], [0.4], 0.0)


def test_the_second_price_rule_reads_its_scale_and_the_runner_up_bids_only() -> None:
    rule = make_credit(SecondPriceConfig(name="second_price", price_scale=10.0))
    rewards, runner_up = [0.0, 0.0, 10.0], [0.4, 0.6, 0.2]
    for winning in ([0.8, 0.8, 0.8], [0.6, 0.8, 0.4]):
        assert rule(rewards, winning, runner_up, random.Random(0), BID_LEVELS) == (
            second_price_credit(rewards, runner_up, 10.0)
        )
    assert credit_rule("second_price").price_scale == CRAFTING_PRICE_SCALE == 140 / 0.8
    with pytest.raises(ValueError, match=r"credit\.price_scale=-1"):
        make_credit(SecondPriceConfig(name="second_price", price_scale=-1.0))


def test_a_thin_market_charges_the_handover_and_clones_price_the_winning_bid() -> None:
    """The main job's experts: the Logger's last chop (reward 12.7, the Smith runner-up at 0.6)
    hands over to the Smith, whom nobody outbids; without clones that chop pays 105 and is paid
    0. With clones (Chang et al.) the prices are the winners' bids, and the return is kept."""
    rewards, winning, runner_up = [12.7, 19.1, 50.9], [0.8, 0.8, 0.8], [0.6, 0.0, 0.0]
    thin = make_credit(SecondPriceConfig(name="second_price"))
    credits, _ = thin(rewards, winning, runner_up, random.Random(0), BID_LEVELS)
    assert credits == pytest.approx([12.7 - 105.0, 19.1, 50.9])
    cloned = make_credit(SecondPriceConfig(name="second_price", clones=True))
    credits, discarded = cloned(rewards, [0.8, 0.6, 0.4], runner_up, random.Random(0), BID_LEVELS)
    assert credits == pytest.approx([12.7 + 105.0 - 140.0, 19.1 + 70.0 - 105.0, 50.9 - 70.0])
    assert sum(credits) + discarded == pytest.approx(sum(rewards))


# --- REINFORCE (Eq. 2) -------------------------------------------------------------------


def _logprob_leaf(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, length, generator=generator, dtype=torch.float64)
    return (-torch.nn.functional.softplus(logits)).requires_grad_(True)


@pytest.mark.parametrize("normalization", ["token_mean", "sequence_sum"])
def test_reinforce_gradient_reaches_only_masked_tokens(normalization: str) -> None:
    logprobs = _logprob_leaf(3, 5)
    mask = torch.tensor([[0, 1, 1, 0, 0], [0, 0, 1, 1, 1], [1, 1, 0, 0, 0]], dtype=torch.bool)
    credits = torch.tensor([1.0, -2.0, 7.0], dtype=torch.float64)  # advantages (-1, -4, 5)
    reinforce_loss(logprobs, mask, credits, normalization)["loss_action"].backward()
    assert logprobs.grad is not None
    assert torch.all(logprobs.grad[~mask] == 0.0)
    assert torch.all(logprobs.grad[mask] != 0.0)


def test_reinforce_ignores_infinite_logprobs_on_padding() -> None:
    logprobs = _logprob_leaf(2, 3).detach().clone()
    logprobs[0, 2] = -math.inf
    logprobs.requires_grad_(True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    result = reinforce_loss(logprobs, mask, torch.tensor([0.0, 1.0], dtype=torch.float64))
    result["loss_action"].backward()
    assert torch.isfinite(result["loss_action"]) and torch.all(torch.isfinite(logprobs.grad))


def test_reinforce_equal_credits_give_no_gradient() -> None:
    logprobs = _logprob_leaf(4, 6)
    mask = torch.ones(4, 6)
    result = reinforce_loss(logprobs, mask, torch.full((4,), 7.5, dtype=torch.float64))
    result["loss_action"].backward()
    assert result["advantage_abs_mean"].item() == 0.0
    assert torch.all(logprobs.grad == 0.0)


@pytest.mark.parametrize("normalization", ["token_mean", "sequence_sum"])
def test_reinforce_step_raises_logprob_of_higher_credit(normalization: str) -> None:
    logits = torch.zeros(3, 4, requires_grad=True)
    mask = torch.ones(3, 4)
    credits = torch.tensor([5.0, 1.0, 0.0])

    def sequence_logprobs() -> torch.Tensor:
        return torch.nn.functional.logsigmoid(logits).sum(dim=1)

    before = sequence_logprobs().detach()
    loss = reinforce_loss(torch.nn.functional.logsigmoid(logits), mask, credits, normalization)[
        "loss_action"
    ]
    loss.backward()
    with torch.no_grad():
        logits -= 0.1 * logits.grad
    after = sequence_logprobs().detach()
    assert after[0] > before[0]  # above the baseline: reinforced
    assert after[2] < before[2]  # below the baseline: discouraged


def test_reinforce_loss_value_and_detached_advantage() -> None:
    logprobs = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -9.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    credits = torch.tensor([3.0, 1.0])  # advantages (+1, -1)
    result = reinforce_loss(logprobs, mask, credits)
    # -(1 * (-3) + (-1) * (-0.5)) / 3 tokens
    assert result["loss_action"].item() == pytest.approx(2.5 / 3)
    assert result["advantage_abs_mean"].item() == pytest.approx(1.0)
    assert not result["advantage_abs_mean"].requires_grad


@settings(max_examples=50, deadline=None)
@given(
    st.integers(1, 6),
    st.integers(1, 8),
    st.integers(0, 4),
    st.lists(st.floats(-50.0, 50.0, allow_nan=False), min_size=6, max_size=6),
    st.integers(0, 1000),
)
def test_token_mean_and_sequence_sum_differ_by_reply_length(
    batch: int, reply_length: int, padding: int, credit_pool: list[float], seed: int
) -> None:
    logprobs = _logprob_leaf(batch, reply_length + padding, seed).detach()
    mask = torch.zeros_like(logprobs)
    mask[:, padding:] = 1.0  # left padding, every reply `reply_length` tokens long
    credits = torch.tensor(credit_pool[:batch], dtype=torch.float64)
    token_mean = reinforce_loss(logprobs, mask, credits, "token_mean")["loss_action"]
    sequence_sum = reinforce_loss(logprobs, mask, credits, "sequence_sum")["loss_action"]
    assert sequence_sum.item() == pytest.approx(reply_length * token_mean.item(), abs=1e-9)


def test_reinforce_rejects_bad_input() -> None:
    logprobs, mask = torch.zeros(2, 3), torch.ones(2, 3)
    with pytest.raises(ValueError, match="normalization"):
        reinforce_loss(logprobs, mask, torch.zeros(2), "per_token")
    with pytest.raises(ValueError, match="credits must have shape"):
        reinforce_loss(logprobs, mask, torch.zeros(3))
    with pytest.raises(ValueError, match="shape \\[B, L\\]"):
        reinforce_loss(logprobs, torch.ones(2, 4), torch.zeros(2))
    with pytest.raises(ValueError, match="at least one acting step"):
        reinforce_loss(torch.zeros(0, 3), torch.ones(0, 3), torch.zeros(0))


# --- Bradley–Terry (Eq. 3) ---------------------------------------------------------------


def test_bradley_terry_equals_log_two_at_equality() -> None:
    logp = torch.tensor([-1.0, -4.0, -0.3])
    result = bradley_terry_loss(logp, logp.clone())
    assert result["loss_bid"].item() == pytest.approx(math.log(2.0))
    assert result["preference_accuracy"].item() == 0.0


@given(st.floats(-30.0, 30.0), st.floats(0.01, 5.0), st.floats(0.1, 3.0))
def test_bradley_terry_decreases_with_the_margin(margin: float, step: float, beta: float) -> None:
    loser = torch.tensor([-2.0], dtype=torch.float64)

    def loss_at(value: float) -> float:
        winner = loser + value
        return bradley_terry_loss(winner, loser, beta)["loss_bid"].item()

    assert loss_at(margin + step) < loss_at(margin)


def test_bradley_terry_is_finite_for_extreme_margins() -> None:
    winner = torch.tensor([-1.0, -5000.0], requires_grad=True)
    loser = torch.tensor([-5000.0, -1.0], requires_grad=True)
    result = bradley_terry_loss(winner, loser)
    result["loss_bid"].backward()
    assert result["loss_bid"].item() == pytest.approx(4999.0 / 2)
    assert result["preference_accuracy"].item() == 0.5
    assert torch.all(torch.isfinite(winner.grad)) and torch.all(torch.isfinite(loser.grad))


def test_bradley_terry_gradient_flows_only_through_its_inputs() -> None:
    winner = torch.tensor([-1.0, -3.0], dtype=torch.float64, requires_grad=True)
    loser = torch.tensor([-2.0, -1.0], dtype=torch.float64)  # a frozen input gets nothing
    beta = 0.5
    result = bradley_terry_loss(winner, loser, beta)
    result["loss_bid"].backward()
    assert loser.grad is None
    assert not result["preference_accuracy"].requires_grad
    expected = -beta * torch.sigmoid(-beta * (winner.detach() - loser)) / 2
    assert torch.allclose(winner.grad, expected)


def test_bradley_terry_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="shape \\[P\\]"):
        bradley_terry_loss(torch.zeros(2), torch.zeros(3))
    with pytest.raises(ValueError, match="at least one preference pair"):
        bradley_terry_loss(torch.zeros(0), torch.zeros(0))
    with pytest.raises(ValueError, match="beta"):
        bradley_terry_loss(torch.zeros(1), torch.zeros(1), beta=0.0)


def test_bradley_terry_with_unit_weights_is_the_unweighted_loss_bit_for_bit() -> None:
    torch.manual_seed(0)
    winner, loser = torch.randn(7, requires_grad=True), torch.randn(7)
    plain = bradley_terry_loss(winner, loser, 0.7)["loss_bid"]
    (plain_grad,) = torch.autograd.grad(plain, winner)
    unit = bradley_terry_loss(winner, loser, 0.7, weights=torch.ones(7))["loss_bid"]
    (unit_grad,) = torch.autograd.grad(unit, winner)
    assert torch.equal(plain, unit) and torch.equal(plain_grad, unit_grad)
    # The micro-batch form (the whole batch's pair count as normalizer) is the same loss too.
    parts = [
        bradley_terry_loss(winner[s], loser[s], 0.7, weights=torch.ones(len(range(7)[s])),
                           normalizer=7.0)["loss_bid"]
        for s in (slice(0, 3), slice(3, 7))
    ]  # fmt: skip
    torch.testing.assert_close(parts[0] + parts[1], plain)


def test_bradley_terry_weights_give_the_weighted_mean() -> None:
    winner = torch.tensor([-1.0, -3.0, -0.5], dtype=torch.float64)
    loser = torch.tensor([-2.0, -1.0, -0.5], dtype=torch.float64)
    weights = torch.tensor([0.2, 1.0, 0.5], dtype=torch.float64)
    beta = 2.0
    by_hand = [-math.log(1.0 / (1.0 + math.exp(-beta * m))) for m in (1.0, -2.0, 0.0)]
    expected = (0.2 * by_hand[0] + 1.0 * by_hand[1] + 0.5 * by_hand[2]) / 1.7
    result = bradley_terry_loss(winner, loser, beta, weights=weights)
    assert result["loss_bid"].item() == pytest.approx(expected, rel=1e-12)
    assert result["preference_accuracy"].item() == pytest.approx(1 / 3)  # pairs, not weights


def test_bradley_terry_micro_batches_with_weights_sum_to_the_whole_batch() -> None:
    """Each micro-batch divides by the whole batch's weight sum: losses and gradients add up."""
    torch.manual_seed(1)
    winner = torch.randn(10, dtype=torch.float64, requires_grad=True)
    loser = torch.randn(10, dtype=torch.float64)
    weights = torch.rand(10, dtype=torch.float64) + 0.05
    whole = bradley_terry_loss(winner, loser, weights=weights)["loss_bid"]
    (whole_grad,) = torch.autograd.grad(whole, winner)
    total = float(weights.sum())
    parts = [
        bradley_terry_loss(winner[a:b], loser[a:b], weights=weights[a:b], normalizer=total)
        for a, b in ((0, 4), (4, 5), (5, 10))
    ]
    split = sum(part["loss_bid"] for part in parts)
    (split_grad,) = torch.autograd.grad(split, winner)
    torch.testing.assert_close(split, whole)
    torch.testing.assert_close(split_grad, whole_grad)


def test_bradley_terry_rejects_bad_weights() -> None:
    with pytest.raises(ValueError, match="weights must have shape"):
        bradley_terry_loss(torch.zeros(2), torch.zeros(2), weights=torch.ones(3))
    with pytest.raises(ValueError, match=">= 0"):
        bradley_terry_loss(torch.zeros(2), torch.zeros(2), weights=torch.tensor([1.0, -0.1]))
    with pytest.raises(ValueError, match="weight sum"):
        bradley_terry_loss(torch.zeros(2), torch.zeros(2), weights=torch.zeros(2))


# --- the fork's bid redraw (section 4): weighted draws below vs rejection sampling --------------


def test_rejection_keep_probability() -> None:
    assert rejection_keep_probability(0.0, 3) == 0.0
    assert rejection_keep_probability(1.0, 3) == 1.0
    assert rejection_keep_probability(0.5, 3) == pytest.approx(0.875)
    assert rejection_keep_probability(0.3, 1) == pytest.approx(0.3)
    assert rejection_keep_probability(1e-12, 3) == pytest.approx(3e-12, rel=1e-9)
    with pytest.raises(ValueError, match="probability"):
        rejection_keep_probability(1.5, 3)
    with pytest.raises(ValueError, match="tries"):
        rejection_keep_probability(0.5, 0)


# Per step: the policy's probability of each level's reply (the rest of the mass: replies that
# do not parse), the runner-up's bid, and the value f(step, level) a kept fork adds.
FORK_STEPS = [
    ([0.02, 0.02, 0.03, 0.03, 0.85], 0.6, [5.0, -1.0, 2.0, 0.0, 0.0]),  # confident: q = 0.07
    ([0.20, 0.20, 0.20, 0.20, 0.15], 0.4, [1.0, 3.0, 0.0, 0.0, 0.0]),  # spread: q = 0.40
    ([0.05, 0.10, 0.25, 0.30, 0.25], 0.2, [4.0, 0.0, 0.0, 0.0, 0.0]),  # one level below: 0.05
    ([0.30, 0.30, 0.20, 0.10, 0.05], 0.8, [-2.0, 1.0, 0.5, 3.0, 0.0]),  # nearly sure: q = 0.90
]


def _rejection_sampling_sums(replicates: int, tries: int, generator: torch.Generator) -> Tensor:
    """Per replicate: sum over the steps of f(step, kept bid) for the forks that ``tries``
    resamples from the whole policy (a try succeeds when it parses below the runner-up) keep."""
    totals = torch.zeros(replicates, dtype=torch.float64)
    for probs, runner_up, values in FORK_STEPS:
        full = torch.tensor([*probs, 1.0 - sum(probs)], dtype=torch.float64)  # last: unparsed
        draws = torch.multinomial(full, replicates * tries, replacement=True, generator=generator)
        draws = draws.view(replicates, tries)
        below = torch.tensor([level < runner_up for level in BID_LEVELS] + [False])[draws]
        first = below.to(torch.int64).argmax(dim=1)  # first successful try (0 when none)
        kept_level = draws.gather(1, first[:, None])[:, 0]
        f = torch.tensor([*values, 0.0], dtype=torch.float64)
        totals += torch.where(below.any(dim=1), f[kept_level], 0.0)
    return totals


def _weighted_draw_sums(
    replicates: int, tries: int, generator: torch.Generator, weighted: bool
) -> Tensor:
    """Per replicate: sum over the steps of w * f(step, drawn bid), the bid drawn below the
    runner-up with :func:`draw_below` and w its keep probability (1 when not ``weighted``)."""
    totals = torch.zeros(replicates, dtype=torch.float64)
    for probs, runner_up, values in FORK_STEPS:
        below = [k for k, level in enumerate(BID_LEVELS) if level < runner_up]
        logprobs = torch.tensor([probs[k] for k in below], dtype=torch.float32).log()
        for r in range(replicates):
            choice, q = draw_below(logprobs, generator)
            weight = rejection_keep_probability(q, tries) if weighted else 1.0
            totals[r] += weight * values[below[choice]]
    return totals


def _agree(a: Tensor, b: Tensor) -> tuple[float, float]:
    """|mean(a) - mean(b)| and the standard error of that difference."""
    gap = abs(float(a.mean() - b.mean()))
    se = math.sqrt(float(a.var() / len(a) + b.var() / len(b)))
    return gap, se


def test_weighted_draws_below_have_the_expectation_of_three_try_rejection_sampling() -> None:
    """E[sum over kept forks of f] by the paper's rejection sampling (3 tries, failed and
    malformed tries included) equals that of draws below the runner-up weighted by
    1 - (1 - q)^3, within Monte Carlo error; unweighted draws (every fork kept) do not."""
    replicates, tries = 4000, 3
    generator = torch.Generator().manual_seed(0)
    rejection = _rejection_sampling_sums(replicates, tries, generator)
    weighted = _weighted_draw_sums(replicates, tries, generator, weighted=True)
    unweighted = _weighted_draw_sums(replicates, tries, generator, weighted=False)
    gap, se = _agree(weighted, rejection)
    assert gap < 4 * se, f"weighted {weighted.mean():.4f} vs rejection {rejection.mean():.4f}"
    gap, se = _agree(unweighted, rejection)
    assert gap > 10 * se, f"unweighted {unweighted.mean():.4f} ~ rejection {rejection.mean():.4f}"
    # Both estimate the closed form: sum over steps of keep probability x E_below[f].
    exact = 0.0
    for probs, runner_up, values in FORK_STEPS:
        below = [k for k, level in enumerate(BID_LEVELS) if level < runner_up]
        q = sum(probs[k] for k in below)
        exact += (1 - (1 - q) ** tries) * sum(probs[k] * values[k] for k in below) / q
    assert abs(float(rejection.mean()) - exact) < 4 * float(rejection.std()) / replicates**0.5
    assert abs(float(weighted.mean()) - exact) < 4 * float(weighted.std()) / replicates**0.5


def test_fork_preference() -> None:
    assert fork_preference(5.0, 2.0) == 1
    assert fork_preference(2.0, 5.0) == -1
    assert fork_preference(3.0, 3.0) == 0
    with pytest.raises(ValueError):
        fork_preference(math.nan, 1.0)


def test_the_same_milestones_earned_in_another_order_tie() -> None:
    """Two branches that earn the wooden pickaxe's log, planks, stick and table, in two orders:
    their float sums differ in the last bits, and that is no label."""
    from bidswarm.envs.crafting.techtree import default_milestones

    milestones = default_milestones("wooden_pickaxe")
    recorded = sum(milestones[m] for m in ("oak_log", "oak_planks", "stick", "crafting_table"))
    branch = sum(milestones[m] for m in ("oak_log", "oak_planks", "crafting_table", "stick"))
    assert recorded != branch and recorded == pytest.approx(branch)
    assert fork_preference(recorded, branch) == fork_preference(branch, recorded) == 0
    # The smallest real difference, one milestone more, still decides; so does one near 0.
    assert fork_preference(recorded + milestones["oak_log"], branch) == 1
    assert fork_preference(branch, recorded + milestones["oak_log"]) == -1
    assert fork_preference(1e-6, 0.0) == 1 and fork_preference(0.0, 1e-12) == 0


# --- options for long horizons [ours]: discounted credit, baselines, KL, entropy, LR -------
def test_discounted_return_credit_worked_example() -> None:
    from bidswarm.algorithms.credit.discounted_return import discounted_return_credit

    assert discounted_return_credit([0.0, 0.0, 10.0], 0.5) == ([2.5, 5.0, 10.0], 0.0)
    credits, lost = discounted_return_credit([1.0, 2.0, 4.0], 0.95)
    assert credits == pytest.approx([1 + 0.95 * 2 + 0.95**2 * 4, 2 + 0.95 * 4, 4.0])
    assert lost == 0.0
    assert discounted_return_credit([1.0, -2.0, 4.0], 1.0) == reward_to_go_credit([1.0, -2.0, 4.0])
    assert discounted_return_credit([1.0, -2.0, 4.0], 0.0) == ([1.0, -2.0, 4.0], 0.0)
    assert discounted_return_credit([], 0.9) == ([], 0.0)
    with pytest.raises(ValueError, match="gamma"):
        discounted_return_credit([1.0], 1.5)


def test_the_discounted_return_rule_reads_its_gamma_and_ignores_the_bids() -> None:
    from bidswarm.algorithms.credit.discounted_return import DiscountedReturnConfig

    rule = make_credit(DiscountedReturnConfig(name="discounted_return", gamma=0.5))
    rewards = [0.0, 0.0, 10.0]
    for bids in ([0.8, 0.4, 0.6], [0.2, 0.2, 0.2]):
        assert rule(rewards, bids, bids, random.Random(0), BID_LEVELS) == ([2.5, 5.0, 10.0], 0.0)
    assert credit_rule("discounted_return").gamma == 0.95
    with pytest.raises(ValueError, match=r"credit\.gamma"):
        make_credit(DiscountedReturnConfig(name="discounted_return", gamma=-0.1))


def test_group_mean_baselines_leave_singletons_to_the_agent_mean() -> None:
    from bidswarm.algorithms.losses import group_mean_baselines

    groups = [("logger", 0), ("logger", 0), ("miner", 3), ("logger", 3)]
    assert group_mean_baselines([1.0, 3.0, 5.0, 7.0], groups) == [2.0, 2.0, None, None]
    with pytest.raises(ValueError):
        group_mean_baselines([1.0], [])


def test_reinforce_advantages_by_hand() -> None:
    from bidswarm.algorithms.losses import reinforce_advantages

    credits = torch.tensor([1.0, 2.0, 6.0])
    torch.testing.assert_close(reinforce_advantages(credits), torch.tensor([-2.0, -1.0, 3.0]))
    torch.testing.assert_close(reinforce_advantages(credits, "none"), credits)
    # groups: rows 0 and 1 share a (role, decision) mean of 4 (with another agent's row);
    # row 2 is alone and falls back to the agent mean 3
    means = torch.tensor([4.0, 4.0, float("nan")])
    torch.testing.assert_close(
        reinforce_advantages(credits, "role_decision_mean", means), torch.tensor([-3.0, -2.0, 3.0])
    )
    std = math.sqrt((4 + 1 + 9) / 3)  # population std of (-2, -1, 3)
    torch.testing.assert_close(
        reinforce_advantages(credits, "agent_mean", normalize=True),
        torch.tensor([-2.0, -1.0, 3.0]) / (std + 1e-8),
    )
    # no spread to normalise: left as it is (one row; equal advantages)
    torch.testing.assert_close(
        reinforce_advantages(torch.tensor([5.0]), "none", normalize=True), torch.tensor([5.0])
    )
    torch.testing.assert_close(
        reinforce_advantages(torch.tensor([2.0, 2.0]), "agent_mean", normalize=True),
        torch.zeros(2),
    )
    with pytest.raises(ValueError, match="group_means"):
        reinforce_advantages(credits, "role_decision_mean")
    with pytest.raises(ValueError, match="baseline"):
        reinforce_advantages(credits, "median")


def test_the_paper_baseline_gives_the_reinforce_loss_bit_for_bit() -> None:
    """Advantages computed first and handed over with a zero baseline: the same loss as the
    per-agent mean baseline inside ``reinforce_loss``, bit for bit (the canary's numbers)."""
    from bidswarm.algorithms.losses import reinforce_advantages

    torch.manual_seed(0)
    logp = torch.randn(4, 5)
    mask = (torch.rand(4, 5) > 0.3).float()
    credits = torch.tensor([0.3, 1.7, -0.2, 4.1])
    direct = reinforce_loss(logp, mask, credits)["loss_action"]
    advantages = reinforce_advantages(credits)
    handed = reinforce_loss(logp, mask, advantages, baseline=torch.zeros(()))["loss_action"]
    assert torch.equal(direct, handed)


def test_kl_penalty_k3_by_hand() -> None:
    from bidswarm.algorithms.losses import kl_penalty

    logp = torch.tensor([[math.log(0.5), math.log(0.2)]], requires_grad=True)
    ref = torch.tensor([[math.log(0.25), math.log(0.2)]])
    mask = torch.tensor([[1.0, 1.0]])
    kl = kl_penalty(logp, ref, mask, normalizer=2.0)["kl"]
    value = float(kl.detach())
    r = math.log(0.25) - math.log(0.5)  # second token: r = 0, k3 = 0
    assert value == pytest.approx((math.exp(r) - r - 1) / 2)
    assert value == pytest.approx((0.5 + math.log(2) - 1) / 2)
    kl.backward()
    # d k3 / d logp = 1 - exp(r): 0.5 on the first token (halved by the normaliser), 0 where
    # the policy equals the reference
    torch.testing.assert_close(logp.grad, torch.tensor([[0.25, 0.0]]))
    # padding is ignored (also an infinite log-prob there); row weights scale each row
    logp2 = torch.tensor(
        [[math.log(0.5), -math.inf], [math.log(0.5), math.log(0.5)]], requires_grad=True
    )
    ref2 = torch.tensor([[math.log(0.25), 0.0], [math.log(0.25), math.log(0.25)]])
    mask2 = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    k3 = 0.5 + math.log(2) - 1
    weighted = kl_penalty(logp2, ref2, mask2, 3.0, row_weights=torch.tensor([1.0, 0.5]))["kl"]
    assert float(weighted.detach()) == pytest.approx((k3 + 0.5 * 2 * k3) / 3)
    weighted.backward()
    assert torch.isfinite(logp2.grad).all() and logp2.grad[0, 1] == 0.0
    assert float(kl_penalty(ref2, ref2, mask2, 1.0)["kl"]) == 0.0


def test_entropy_bonus_by_hand() -> None:
    from bidswarm.algorithms.losses import entropy_bonus

    entropy = torch.tensor([[math.log(2), math.log(4)], [math.log(8), 123.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    term = entropy_bonus(entropy, mask, normalizer=3.0)["entropy"]
    assert float(term) == pytest.approx((math.log(2) + math.log(4) + math.log(8)) / 3)


def test_learning_rate_schedules_by_hand() -> None:
    from bidswarm.algorithms.schedules import lr_factor

    def factors(schedule, total, warmup):
        return [lr_factor(u, total, schedule, warmup) for u in range(total)]

    assert factors("constant", 4, 0) == [1.0] * 4
    assert factors("cosine", 4, 1) == pytest.approx([0.5, 1.0, 0.75, 0.25])
    assert factors("linear", 4, 1) == pytest.approx([0.5, 1.0, 2 / 3, 1 / 3])
    assert factors("constant", 5, 2) == pytest.approx([1 / 3, 2 / 3, 1.0, 1.0, 1.0])
    assert factors("cosine", 2, 0) == pytest.approx([1.0, 0.5])
    assert min(factors("linear", 60, 0)) > 0  # the last update still moves the weights
    with pytest.raises(ValueError):
        lr_factor(0, 4, "step", 0)
