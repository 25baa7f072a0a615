"""Bids as calibrated value estimates [ours]: a loss that moves each agent's bid distribution
toward its measured value of acting, beside Bradley-Terry on bid replies (Eq. 3 of MPT).

A value is in bid units: a return divided by the price scale (``credit.price_scale`` of
``credit=second_price``), so that a calibrated bid is the price the second-price rule charges
for it. Its target over the bid levels is two-hot: the value split between its two neighbouring
levels so that the target's expected level is the value (a value outside the levels' range is
clipped to it). The loss is the cross-entropy of the agent's distribution over the levels
toward that target; its minimiser over a tabular policy is the mean target, whose expected
level is the mean value: bids that estimate values (Chang et al. 2020's bidders learn that by
their own utility; here it is the target).

Pure functions of tensors; this module holds the loss only, the learner's wiring of it (which
value each bid is trained toward, e.g. a fork's branch return) is separate.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor


def _levels_tensor(levels: Sequence[float], like: Tensor) -> Tensor:
    grid = torch.as_tensor(list(levels), dtype=like.dtype, device=like.device)
    if grid.dim() != 1 or len(grid) == 0:
        raise ValueError(f"levels must be a non-empty sequence, got {list(levels)!r}")
    if len(grid) > 1 and not bool(torch.all(grid[1:] > grid[:-1])):
        raise ValueError(f"levels must be strictly increasing, got {list(levels)!r}")
    return grid


def two_hot_targets(values: Tensor, levels: Sequence[float]) -> Tensor:
    """The two-hot target of each value over the bid levels: expectation = the value.

    A value v with levels[k] <= v <= levels[k + 1] puts (levels[k + 1] - v) / gap on level k
    and (v - levels[k]) / gap on level k + 1 (gap = levels[k + 1] - levels[k]), so that
    sum_l target_l * levels[l] = v; a value on a level is one-hot there. Values below
    levels[0] or above levels[-1] are clipped to them first.

    Args:
        values: the values in bid units, shape [B].
        levels: the bid levels, strictly increasing, shape [L], e.g. (0, 0.2, 0.4, 0.6, 0.8).

    Returns:
        shape [B, L], each row >= 0 summing to 1, no gradient. Example: levels
        (0, 0.2, 0.4, 0.6, 0.8), value 0.25 -> (0, 0.75, 0.25, 0, 0); value 0.95 -> one-hot 0.8.
    """
    if values.dim() != 1:
        raise ValueError(f"values must have shape [B], got {tuple(values.shape)}")
    if not bool(torch.all(torch.isfinite(values))):
        raise ValueError("values must be finite")
    values = values.detach()
    grid = _levels_tensor(levels, values)
    targets = torch.zeros(len(values), len(grid), dtype=values.dtype, device=values.device)
    if len(grid) == 1:
        return targets + 1.0
    clipped = values.clamp(float(grid[0]), float(grid[-1]))
    upper = torch.searchsorted(grid, clipped).clamp(1, len(grid) - 1)
    lower = upper - 1
    upper_share = (clipped - grid[lower]) / (grid[upper] - grid[lower])
    targets.scatter_(1, lower[:, None], (1.0 - upper_share)[:, None])
    targets.scatter_add_(1, upper[:, None], upper_share[:, None])
    return targets


def level_distribution(level_logprobs: Tensor) -> Tensor:
    """The bid distribution over the levels: softmax of the level log-probs [B, L] (the policy
    restricted to the L canonical bid replies, renormalised)."""
    return torch.softmax(level_logprobs, dim=-1)


def expected_bid(level_logprobs: Tensor, levels: Sequence[float]) -> Tensor:
    """E[bid] = sum_l softmax(level_logprobs)_l * levels[l], shape [B] from [B, L]."""
    if level_logprobs.dim() != 2 or level_logprobs.shape[1] != len(levels):
        raise ValueError(
            f"level_logprobs must have shape [B, {len(levels)}], got {tuple(level_logprobs.shape)}"
        )
    grid = _levels_tensor(levels, level_logprobs)
    return (level_distribution(level_logprobs) * grid).sum(dim=-1)


def calibrated_bid_loss(
    level_logprobs: Tensor,
    targets: Tensor,
    weights: Tensor | None = None,
    normalizer: float | None = None,
) -> dict[str, Tensor]:
    """[ours] Cross-entropy of each bid distribution over the levels toward its target:

    loss = sum_b w_b * -sum_l y_bl log softmax(z_b)_l / sum_b w_b,

    with z_b the log-probs of the L level replies at bid prompt b (log-softmax renormalises
    them over the levels) and y_b the target (:func:`two_hot_targets`). Its gradient in z_b is
    softmax(z_b) - y_b: zero where the distribution is the target.

    Args:
        level_logprobs: log pi(level reply) of each of the L levels at each of B bid prompts,
            with gradient, shape [B, L].
        targets: the target distribution over the levels, rows >= 0 summing to 1, shape [B, L]
            (data: no gradient flows into it).
        weights: each row's weight w_b >= 0, shape [B] (None: all 1).
        normalizer: the weight sum of the whole batch when these B rows are one micro-batch of
            it (None: the sum of ``weights``, or B); the micro-batches' losses then sum to the
            whole batch's.

    Returns:
        {"loss_calibration": scalar, "calibration_kl": KL(target || distribution), the loss
        less the targets' entropy (0 when calibrated), weighted as the loss, detached}.
        Example: uniform over 2 levels toward one-hot -> log 2 = 0.693, KL 0.693.
    """
    if level_logprobs.dim() != 2 or targets.shape != level_logprobs.shape:
        raise ValueError(
            "level_logprobs and targets must both have shape [B, L], got "
            f"{tuple(level_logprobs.shape)} and {tuple(targets.shape)}"
        )
    if level_logprobs.shape[0] == 0:
        raise ValueError("calibrated_bid_loss needs at least one bid prompt")
    targets = targets.detach().to(level_logprobs.dtype)
    if not bool(torch.all(targets >= 0)) or not torch.allclose(
        targets.sum(dim=1), torch.ones_like(targets[:, 0]), atol=1e-5
    ):
        raise ValueError("each target row must be >= 0 and sum to 1")
    log_distribution = F.log_softmax(level_logprobs, dim=-1)
    row_losses = -(targets * log_distribution).sum(dim=-1)
    target_entropy = -(targets * torch.log(targets.clamp_min(1e-30))).sum(dim=-1)
    if weights is None:
        weights = torch.ones_like(row_losses)
    elif weights.shape != row_losses.shape:
        raise ValueError(
            f"weights must have shape [B] = [{len(row_losses)}], got {tuple(weights.shape)}"
        )
    weights = weights.detach().to(row_losses.dtype)
    if not bool(torch.all(torch.isfinite(weights) & (weights >= 0))):
        raise ValueError("weights must be finite and >= 0")
    weight_sum = float(weights.sum()) if normalizer is None else normalizer
    if not weight_sum > 0.0:
        raise ValueError(f"the rows' weight sum must be > 0, got {weight_sum!r}")
    loss = (weights * row_losses).sum() / weight_sum
    kl = (weights * (row_losses - target_entropy)).sum().detach() / weight_sum
    return {"loss_calibration": loss, "calibration_kl": kl}


def calibration_error(bids: Tensor, values: Tensor) -> Tensor:
    """Mean |bid - value|: how far bids (e.g. :func:`expected_bid`) are from the values they
    estimate, both in bid units, shape [B] each; a scalar, detached."""
    if bids.shape != values.shape or bids.dim() != 1 or len(bids) == 0:
        raise ValueError(
            f"bids and values must share one shape [B], B >= 1, got {tuple(bids.shape)} and "
            f"{tuple(values.shape)}"
        )
    return (bids.detach() - values.detach().to(bids.dtype)).abs().mean()
