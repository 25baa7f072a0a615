"""The calibrated bid loss [ours] (``algorithms/calibration.py``): two-hot targets whose
expectation is the value, the cross-entropy toward them, and the calibration error."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from bidswarm.algorithms.calibration import (
    calibrated_bid_loss,
    calibration_error,
    expected_bid,
    two_hot_targets,
)

LEVELS = (0.0, 0.2, 0.4, 0.6, 0.8)


def test_two_hot_worked_examples() -> None:
    targets = two_hot_targets(torch.tensor([0.25, 0.4, 0.0, 0.8, 0.95, -0.3]), LEVELS)
    expected = [
        [0.0, 0.75, 0.25, 0.0, 0.0],
        [0.0, 0.0, 1.0, 0.0, 0.0],
        [1.0, 0.0, 0.0, 0.0, 0.0],
        [0.0, 0.0, 0.0, 0.0, 1.0],
        [0.0, 0.0, 0.0, 0.0, 1.0],  # above the top level: clipped
        [1.0, 0.0, 0.0, 0.0, 0.0],  # below the bottom level: clipped
    ]
    assert torch.allclose(targets, torch.tensor(expected), atol=1e-6)


@given(
    st.lists(st.floats(0.0, 0.8), min_size=1, max_size=20),
    st.lists(st.floats(0.01, 1.0), min_size=1, max_size=6),
)
def test_two_hot_expectation_is_the_clipped_value(values, gaps) -> None:
    """On any increasing levels (uneven gaps too): rows are distributions on at most two
    neighbouring levels, and their expected level is the value clipped to the levels' range."""
    levels = [0.0]
    for gap in gaps:
        levels.append(levels[-1] + gap)
    values_t = torch.tensor(values, dtype=torch.float64)
    targets = two_hot_targets(values_t, levels)
    grid = torch.tensor(levels, dtype=torch.float64)
    assert torch.all(targets >= 0)
    assert torch.allclose(targets.sum(dim=1), torch.ones(len(values), dtype=torch.float64))
    assert torch.allclose(targets @ grid, values_t.clamp(0.0, levels[-1]), atol=1e-9)
    for row in targets:
        support = torch.nonzero(row > 0).flatten().tolist()
        assert len(support) <= 2 and (len(support) < 2 or support[1] - support[0] == 1)


def test_two_hot_rejects_bad_levels_and_values() -> None:
    with pytest.raises(ValueError, match="strictly increasing"):
        two_hot_targets(torch.tensor([0.3]), (0.0, 0.4, 0.2))
    with pytest.raises(ValueError, match="non-empty"):
        two_hot_targets(torch.tensor([0.3]), ())
    with pytest.raises(ValueError, match="finite"):
        two_hot_targets(torch.tensor([math.nan]), LEVELS)
    assert two_hot_targets(torch.tensor([0.3, 2.0]), (0.5,)).tolist() == [[1.0], [1.0]]


def test_calibrated_loss_worked_example_and_its_minimum() -> None:
    uniform_two = torch.zeros(1, 2)
    terms = calibrated_bid_loss(uniform_two, torch.tensor([[1.0, 0.0]]))
    assert float(terms["loss_calibration"]) == pytest.approx(math.log(2))
    assert float(terms["calibration_kl"]) == pytest.approx(math.log(2))
    # At the target the loss is the target's entropy and the KL vanishes.
    target = torch.tensor([[0.0, 0.75, 0.25, 0.0, 0.0]])
    at_target = calibrated_bid_loss(torch.log(target.clamp_min(1e-12)) - 3.0, target)
    entropy = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    assert float(at_target["loss_calibration"]) == pytest.approx(entropy, abs=1e-6)
    assert float(at_target["calibration_kl"]) == pytest.approx(0.0, abs=1e-6)


def test_calibrated_loss_is_a_weighted_mean_and_micro_batches_sum_to_the_batch() -> None:
    generator = torch.Generator().manual_seed(0)
    logprobs = torch.randn(4, 5, generator=generator)
    targets = two_hot_targets(torch.tensor([0.1, 0.5, 0.7, 0.3]), LEVELS)
    weights = torch.tensor([1.0, 0.0, 2.0, 0.5])
    whole = calibrated_bid_loss(logprobs, targets, weights)["loss_calibration"]
    rows = [
        float(calibrated_bid_loss(logprobs[i : i + 1], targets[i : i + 1])["loss_calibration"])
        for i in range(4)
    ]
    weighted = sum(w * r for w, r in zip(weights.tolist(), rows, strict=True))
    assert float(whole) == pytest.approx(weighted / 3.5)
    parts = [
        calibrated_bid_loss(logprobs[part], targets[part], weights[part], normalizer=3.5)
        for part in (slice(0, 1), slice(1, 4))
    ]
    assert float(sum(p["loss_calibration"] for p in parts)) == pytest.approx(float(whole))


def test_calibrated_loss_gradient_is_distribution_minus_target() -> None:
    logprobs = torch.tensor([[0.3, -1.0, 0.2, 0.0, -0.5]], requires_grad=True)
    targets = two_hot_targets(torch.tensor([0.5]), LEVELS)
    calibrated_bid_loss(logprobs, targets)["loss_calibration"].backward()
    expected = torch.softmax(logprobs.detach(), dim=-1) - targets
    assert torch.allclose(logprobs.grad, expected, atol=1e-6)


def test_descending_the_loss_moves_the_expected_bid_to_the_value() -> None:
    """Plain gradient descent on free logits: the expected bid reaches each value, and the
    calibration error falls to ~0 from the uniform start's."""
    values = torch.tensor([0.05, 0.3, 0.55, 0.8])
    targets = two_hot_targets(values, LEVELS)
    logits = torch.zeros(4, 5, requires_grad=True)
    optimizer = torch.optim.SGD([logits], lr=5.0)
    before = float(calibration_error(expected_bid(logits, LEVELS), values))
    for _ in range(300):
        optimizer.zero_grad()
        calibrated_bid_loss(logits, targets)["loss_calibration"].backward()
        optimizer.step()
    after = float(calibration_error(expected_bid(logits, LEVELS), values))
    assert before > 0.15 and after < 0.01


def test_calibration_error_and_expected_bid() -> None:
    error = calibration_error(torch.tensor([0.2, 0.8]), torch.tensor([0.4, 0.5]))
    assert float(error) == pytest.approx(0.25)
    uniform = torch.zeros(1, 5)
    assert float(expected_bid(uniform, LEVELS)[0]) == pytest.approx(0.4)
    with pytest.raises(ValueError, match="share one shape"):
        calibration_error(torch.tensor([0.2]), torch.tensor([0.4, 0.5]))
    with pytest.raises(ValueError, match=r"\[B, 5\]"):
        expected_bid(torch.zeros(1, 4), LEVELS)


def test_calibrated_loss_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="shape"):
        calibrated_bid_loss(torch.zeros(2, 5), torch.zeros(2, 4))
    with pytest.raises(ValueError, match="at least one"):
        calibrated_bid_loss(torch.zeros(0, 5), torch.zeros(0, 5))
    with pytest.raises(ValueError, match="sum to 1"):
        calibrated_bid_loss(torch.zeros(1, 2), torch.tensor([[0.5, 0.2]]))
    with pytest.raises(ValueError, match="weights"):
        calibrated_bid_loss(torch.zeros(1, 2), torch.tensor([[1.0, 0.0]]), torch.tensor([-1.0]))
    with pytest.raises(ValueError, match="weight sum"):
        calibrated_bid_loss(torch.zeros(1, 2), torch.tensor([[1.0, 0.0]]), torch.tensor([0.0]))
