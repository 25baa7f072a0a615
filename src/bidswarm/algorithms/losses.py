"""Loss terms of MPT: REINFORCE on action tokens (Eq. 2) and Bradley–Terry on bids (Eq. 3).

Pure functions of tensors that return named terms; the training module sums and logs them.
"""

from __future__ import annotations

import math
from enum import Enum

import torch
import torch.nn.functional as F
from torch import Tensor


class Normalization(str, Enum):
    """How the REINFORCE loss of one agent is normalised [ours] (``rl.loss_normalization``)."""

    token_mean = "token_mean"
    """-sum_b(adv_b * sum_l logp_bl m_bl) / sum(m): every action token weighs the same."""
    sequence_sum = "sequence_sum"
    """-mean_b(adv_b * sum_l logp_bl m_bl): every acting step weighs the same."""

    __str__ = str.__str__


def reinforce_loss(
    token_logprobs: Tensor,
    mask: Tensor,
    credits: Tensor,
    normalization: Normalization | str = Normalization.token_mean,
    baseline: Tensor | None = None,
    normalizer: float | None = None,
) -> dict[str, Tensor]:
    """Eq. 2 of MPT: the REINFORCE loss of ONE agent on its action tokens.

    The advantage of each acting step is its credit minus the mean credit of this agent's
    acting steps in the batch (the per-agent mean baseline), so a batch of equal credits gives
    no gradient. Credits are data: no gradient flows into them.

    Args:
        token_logprobs: log pi(token) of the action reply, shape [B, L] (B acting steps).
        mask: 1 on the action tokens to train, 0 on prompt and padding, shape [B, L].
        credits: credit c_t of each acting step, shape [B].
        normalization: ``token_mean``: -sum_b(adv_b * sum_l logp_bl m_bl) / sum(m);
            ``sequence_sum``: -mean_b(adv_b * sum_l logp_bl m_bl).
        baseline: the agent's mean credit over its whole batch, shape [] (None: the mean of
            ``credits``). With ``normalizer``, the rows may be one micro-batch of the batch.
        normalizer: the whole batch's action tokens (``token_mean``) or rows (``sequence_sum``)
            (None: those of these rows). The losses of a batch's micro-batches, each with the
            batch's baseline and normalizer, sum to the loss of the whole batch.

    Returns:
        {"loss_action": scalar, "advantage_abs_mean": scalar, detached}.
    """
    if normalization not in list(Normalization):
        raise ValueError(
            f"normalization must be one of {[n.value for n in Normalization]}, "
            f"got {normalization!r}"
        )
    if token_logprobs.dim() != 2 or mask.shape != token_logprobs.shape:
        raise ValueError(
            "token_logprobs and mask must both have shape [B, L], got "
            f"{tuple(token_logprobs.shape)} and {tuple(mask.shape)}"
        )
    if credits.shape != token_logprobs.shape[:1]:
        raise ValueError(
            f"credits must have shape [B] = [{token_logprobs.shape[0]}], got {tuple(credits.shape)}"
        )
    if token_logprobs.shape[0] == 0:
        raise ValueError("reinforce_loss needs at least one acting step; skip agents that idled")
    mask = mask.to(token_logprobs.dtype)
    credits = credits.detach().to(token_logprobs.dtype)
    advantages = credits - (credits.mean() if baseline is None else baseline.detach())
    # where() rather than a product so that -inf log-probs on masked-out padding stay harmless.
    masked_logprobs = torch.where(mask > 0, token_logprobs * mask, torch.zeros_like(mask))
    sequence_logprobs = masked_logprobs.sum(dim=1)
    weighted = advantages * sequence_logprobs
    if normalization == Normalization.token_mean:
        tokens = mask.sum().clamp_min(1.0) if normalizer is None else max(normalizer, 1.0)
        loss = -weighted.sum() / tokens
    else:
        loss = -weighted.sum() / (len(weighted) if normalizer is None else normalizer)
    return {"loss_action": loss, "advantage_abs_mean": advantages.abs().mean().detach()}


def bradley_terry_loss(
    logp_winner: Tensor,
    logp_loser: Tensor,
    beta: float = 1.0,
    weights: Tensor | None = None,
    normalizer: float | None = None,
) -> dict[str, Tensor]:
    """Eq. 3 of MPT: Bradley–Terry preference loss on the winner's two bid replies.

    loss = sum_p w_p * -log sigmoid(beta * (logp_w - logp_l)) / sum_p w_p, with no reference
    model: the weighted mean over pairs (with every w_p = 1, the paper's plain mean).

    Args:
        logp_winner: summed log-prob of the preferred bid reply's tokens, shape [P].
        logp_loser: summed log-prob of the other bid reply's tokens (same context), shape [P].
        beta: scale of the log-prob margin (default 1, as in the paper).
        weights: each pair's weight w_p >= 0, shape [P] (None: all 1); e.g. the chance that
            rejection sampling would have kept the pair's fork
            (:func:`~bidswarm.algorithms.resampling.rejection_keep_probability`). Data: no
            gradient flows into them.
        normalizer: the weight sum of the whole batch when these P pairs are one micro-batch of
            it (its pair count when unweighted; None: the sum of ``weights``, or P); the
            micro-batches' losses then sum to the whole batch's.

    Returns:
        {"loss_bid": scalar, "preference_accuracy": fraction of pairs with logp_w > logp_l
        (unweighted), detached}.
    """
    if logp_winner.dim() != 1 or logp_winner.shape != logp_loser.shape:
        raise ValueError(
            "logp_winner and logp_loser must both have shape [P], got "
            f"{tuple(logp_winner.shape)} and {tuple(logp_loser.shape)}"
        )
    if logp_winner.shape[0] == 0:
        raise ValueError("bradley_terry_loss needs at least one preference pair")
    if not (math.isfinite(beta) and beta > 0.0):
        raise ValueError(f"beta must be a finite number > 0, got {beta!r}")
    margin = logp_winner - logp_loser
    pair_losses = -F.logsigmoid(beta * margin)
    if weights is None:
        total = pair_losses.sum()
        weight_sum = float(len(margin))
    else:
        if weights.shape != margin.shape:
            raise ValueError(
                f"weights must have shape [P] = [{len(margin)}], got {tuple(weights.shape)}"
            )
        if not bool(torch.all(torch.isfinite(weights) & (weights >= 0))):
            raise ValueError("weights must be finite and >= 0")
        weights = weights.detach().to(pair_losses.dtype)
        total = (weights * pair_losses).sum()
        weight_sum = float(weights.sum())
    if normalizer is not None:
        weight_sum = normalizer
    if not weight_sum > 0.0:
        raise ValueError(f"the pairs' weight sum must be > 0, got {weight_sum!r}")
    loss = total / weight_sum
    accuracy = (margin > 0).to(margin.dtype).mean().detach()
    return {"loss_bid": loss, "preference_accuracy": accuracy}


def fork_preference(original_score: float, branch_score: float) -> int:
    """Which branch of a counterfactual fork is preferred (section 4 of MPT).

    Returns:
        +1 when the original branch scored higher, -1 when the counterfactual branch did,
        0 on a tie (the pair is dropped).
    """
    if math.isnan(original_score) or math.isnan(branch_score):
        raise ValueError(f"branch scores must be numbers, got {original_score!r}, {branch_score!r}")
    if original_score > branch_score:
        return 1
    if original_score < branch_score:
        return -1
    return 0
