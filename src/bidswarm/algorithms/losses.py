"""Loss terms of MPT: REINFORCE on action tokens (Eq. 2) and Bradley–Terry on bids (Eq. 3),
with the options beyond the paper [ours]: the REINFORCE baseline and advantage normalisation,
a KL penalty to the policy at the start of RL and an entropy bonus.

Pure functions of tensors that return named terms; the training module sums and logs them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Sequence
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


class Baseline(str, Enum):
    """What REINFORCE subtracts from each acting step's credit (``rl.baseline``)."""

    agent_mean = "agent_mean"
    """The paper's (Eq. 2): the mean credit of the agent's acting steps in the batch."""
    role_decision_mean = "role_decision_mean"
    """[ours] The mean credit of the batch's acting steps of the same role at the same decision
    index (over every agent of that role); a step alone in its group gets the agent mean."""
    none = "none"
    """[ours] No baseline: the advantage is the credit."""

    __str__ = str.__str__


def group_mean_baselines(
    credits: Sequence[float], groups: Sequence[Hashable]
) -> list[float | None]:
    """Per row, the mean credit of the rows in its group; None for a row alone in its group.

    Args:
        credits: credit of each acting step of the update, every agent's, shape [N].
        groups: each row's group, e.g. (role, decision index), shape [N].

    Returns:
        shape [N]. Example: credits (1, 3, 5, 7), groups (a, a, b, c) -> (2, 2, None, None).
    """
    if len(credits) != len(groups):
        raise ValueError(f"{len(credits)} credits for {len(groups)} groups")
    sums: dict[Hashable, float] = {}
    counts: dict[Hashable, int] = {}
    for credit, group in zip(credits, groups, strict=True):
        sums[group] = sums.get(group, 0.0) + float(credit)
        counts[group] = counts.get(group, 0) + 1
    return [sums[g] / counts[g] if counts[g] > 1 else None for g in groups]


def reinforce_advantages(
    credits: Tensor,
    baseline: Baseline | str = Baseline.agent_mean,
    group_means: Tensor | None = None,
    normalize: bool = False,
    eps: float = 1e-8,
) -> Tensor:
    """The advantage of each acting step of ONE agent's whole batch (Eq. 2's c_t - mean_i by
    default), computed once before the batch is split into micro-batches.

    Args:
        credits: credit c_t of each of the agent's acting steps, shape [B].
        baseline: ``agent_mean`` (paper): c_t - mean(c); ``role_decision_mean``: c_t minus
            ``group_means[t]``, or mean(c) where that is NaN (a row alone in its group);
            ``none``: c_t.
        group_means: shape [B], NaN for singletons (:func:`group_mean_baselines`); needed by
            ``role_decision_mean`` only.
        normalize: divide by the advantages' standard deviation over the batch (population
            std) plus ``eps``; a batch whose advantages are all equal (std 0, e.g. one row) is
            left as it is, having no spread to normalise.

    Returns:
        shape [B], no gradient. Example: credits (1, 2, 6), agent_mean -> (-2, -1, 3);
        normalized -> (-2, -1, 3) / sqrt(14 / 3).
    """
    if credits.dim() != 1:
        raise ValueError(f"credits must have shape [B], got {tuple(credits.shape)}")
    if baseline not in list(Baseline):
        raise ValueError(f"baseline must be one of {[b.value for b in Baseline]}, got {baseline!r}")
    credits = credits.detach()
    if baseline == Baseline.agent_mean:
        advantages = credits - credits.mean()
    elif baseline == Baseline.role_decision_mean:
        if group_means is None or group_means.shape != credits.shape:
            raise ValueError("role_decision_mean needs group_means of shape [B]")
        means = torch.where(torch.isnan(group_means), credits.mean(), group_means.to(credits))
        advantages = credits - means
    else:
        advantages = credits.clone()
    if normalize and len(advantages) > 1:
        spread = advantages.std(correction=0)
        if spread > 0:
            advantages = advantages / (spread + eps)
    return advantages


def reinforce_loss(
    token_logprobs: Tensor,
    mask: Tensor,
    credits: Tensor,
    normalization: Normalization | str = Normalization.token_mean,
    baseline: Tensor | None = None,
    normalizer: float | None = None,
    token_weights: Tensor | None = None,
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
        token_weights: a weight per token, shape [B, L] (data, no gradient; None: all 1), e.g.
            :func:`truncated_importance_weights` (``rl.importance_cap``).

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
    if token_weights is not None:
        masked_logprobs = masked_logprobs * token_weights.detach().to(masked_logprobs.dtype)
    sequence_logprobs = masked_logprobs.sum(dim=1)
    weighted = advantages * sequence_logprobs
    if normalization == Normalization.token_mean:
        tokens = mask.sum().clamp_min(1.0) if normalizer is None else max(normalizer, 1.0)
        loss = -weighted.sum() / tokens
    else:
        loss = -weighted.sum() / (len(weighted) if normalizer is None else normalizer)
    return {"loss_action": loss, "advantage_abs_mean": advantages.abs().mean().detach()}


def truncated_importance_weights(
    learner_logprobs: Tensor, sampled_logprobs: Tensor, present: Tensor, cap: float
) -> Tensor:
    """[ours] Truncated importance sampling (TIS) of a sampler/learner mismatch: the weight
    w = min(pi_learner / pi_sampler, cap) = min(exp(logp_learner - logp_sampler), cap) of each
    token (or reply) that a rollout engine sampled, 1 where ``present`` is 0 (no sampler
    log-prob: padding, or a reply the collector wrote). Detached: it reweights the on-policy
    term, no gradient flows through it. The correction of Yao et al. 2025, "Your efficient RL
    framework secretly brings you off-policy RL training" (fengyao.notion.site), for rollouts
    sampled by vLLM in another precision than the trainer's.

    Args:
        learner_logprobs, sampled_logprobs, present: the same shape ([B, L] per token or [B]
            per reply); ``present`` is 1 where ``sampled_logprobs`` holds a value.
        cap: the truncation C > 0.

    Example: learner log 0.5, sampler log 0.25 -> ratio 2, with cap 1.5 -> 1.5.
    """
    if not learner_logprobs.shape == sampled_logprobs.shape == present.shape:
        raise ValueError(
            "learner_logprobs, sampled_logprobs and present must share one shape, got "
            f"{tuple(learner_logprobs.shape)}, {tuple(sampled_logprobs.shape)}, "
            f"{tuple(present.shape)}"
        )
    if not cap > 0:
        raise ValueError(f"cap must be > 0, got {cap!r}")
    present = present > 0
    difference = torch.where(
        present, learner_logprobs.detach() - sampled_logprobs, torch.zeros_like(sampled_logprobs)
    )
    weights = torch.exp(difference).clamp(max=cap)
    return torch.where(present, weights, torch.ones_like(weights)).detach()


def kl_penalty(
    token_logprobs: Tensor,
    reference_logprobs: Tensor,
    mask: Tensor,
    normalizer: float,
    row_weights: Tensor | None = None,
) -> dict[str, Tensor]:
    """[ours] KL(pi || pi_ref) per token by the k3 estimator (as in GRPO-style LLM RL):
    k3 = exp(r) - r - 1 with r = logp_ref - logp, unbiased for the KL on tokens sampled from
    pi, >= 0 for every token; its gradient in logp is 1 - exp(r) (0 where pi = pi_ref).

    kl = sum_b w_b * sum_l k3_bl m_bl / normalizer.

    Args:
        token_logprobs: log pi(token) with gradient, shape [B, L].
        reference_logprobs: log pi_ref(token), the policy at the start of RL, shape [B, L]
            (data: no gradient flows into it).
        mask: 1 on the tokens to penalise, shape [B, L].
        normalizer: the whole batch's tokens or rows (or weighted rows), as the loss the term
            is added to: the micro-batches' terms then sum to the whole batch's.
        row_weights: each row's weight, shape [B] (None: all 1; a bid pair's weight).

    Returns:
        {"kl": scalar}. Example: logp = log 0.5, logp_ref = log 0.25 on one token ->
        exp(log 0.5) - log 0.5 - 1 = 0.5 + 0.693 - 1 = 0.193.
    """
    if token_logprobs.shape != reference_logprobs.shape or mask.shape != token_logprobs.shape:
        raise ValueError(
            "token_logprobs, reference_logprobs and mask must share shape [B, L], got "
            f"{tuple(token_logprobs.shape)}, {tuple(reference_logprobs.shape)}, "
            f"{tuple(mask.shape)}"
        )
    if not normalizer > 0:
        raise ValueError(f"normalizer must be > 0, got {normalizer!r}")
    # Padding's ratio is 0 before exp (k3 = 0 there): an infinite log-prob on padding stays
    # harmless, in the value and in the gradient.
    ratio = torch.where(
        mask > 0, reference_logprobs.detach() - token_logprobs, torch.zeros_like(token_logprobs)
    )
    per_token = torch.exp(ratio) - ratio - 1
    per_row = per_token.sum(dim=1)
    if row_weights is not None:
        per_row = per_row * row_weights.detach().to(per_row.dtype)
    return {"kl": per_row.sum() / normalizer}


def entropy_bonus(token_entropy: Tensor, mask: Tensor, normalizer: float) -> dict[str, Tensor]:
    """[ours] The policy's entropy at the trained positions, to be maximised (subtracted from
    the loss with ``rl.entropy_coef``): entropy = sum_bl H_bl m_bl / normalizer.

    Args:
        token_entropy: H_bl = -sum_v pi(v) log pi(v) over the full vocabulary at each reply
            position (with gradient), shape [B, L].
        mask: 1 on the action tokens, shape [B, L].
        normalizer: the whole batch's tokens (``token_mean``) or rows (``sequence_sum``).

    Returns:
        {"entropy": scalar}. Example: two positions, uniform over 2 and over 4 tokens,
        normalizer 2 -> (log 2 + log 4) / 2 = 1.040.
    """
    if token_entropy.shape != mask.shape:
        raise ValueError(
            f"token_entropy and mask must share shape [B, L], got {tuple(token_entropy.shape)} "
            f"and {tuple(mask.shape)}"
        )
    if not normalizer > 0:
        raise ValueError(f"normalizer must be > 0, got {normalizer!r}")
    masked = torch.where(mask > 0, token_entropy, torch.zeros_like(token_entropy))
    return {"entropy": masked.sum() / normalizer}


def bradley_terry_loss(
    logp_winner: Tensor,
    logp_loser: Tensor,
    beta: float = 1.0,
    weights: Tensor | None = None,
    normalizer: float | None = None,
    ties: Tensor | None = None,
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
        ties: True where the pair's branches tied, shape [P] (None: no tie; ``rl.bt_ties``
            ``half_label`` [ours]): a tied pair has label 1/2, its loss
            -(log sigmoid(beta d) + log sigmoid(-beta d)) / 2 for the margin d (log 2 at d = 0,
            its minimum), weighted and normalised as the others.

    Returns:
        {"loss_bid": scalar, "preference_accuracy": fraction of the decisive pairs with
        logp_w > logp_l (unweighted; NaN when every pair tied), detached}.
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
    decisive = torch.ones_like(margin, dtype=torch.bool)
    if ties is not None:
        if ties.shape != margin.shape:
            raise ValueError(f"ties must have shape [P] = [{len(margin)}], got {tuple(ties.shape)}")
        decisive = ~ties.to(torch.bool)
        half = (pair_losses - F.logsigmoid(-beta * margin)) / 2
        pair_losses = torch.where(decisive, pair_losses, half)
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
    accuracy = (margin[decisive] > 0).to(margin.dtype).mean().detach()
    return {"loss_bid": loss, "preference_accuracy": accuracy}


BRANCH_SCORE_TOLERANCE = 1e-9
"""Two branch scores closer than this, relative to the larger or absolutely near 0
(``math.isclose(a, b, rel_tol=..., abs_tol=...)``), are a tie: a branch score is a sum of
rewards, and the same milestones summed in another order differ in the last bits (the wooden
pickaxe's log, planks, stick and table: 89.09090909090908 or 89.0909090909091)."""


def fork_preference(original_score: float, branch_score: float) -> int:
    """Which branch of a counterfactual fork is preferred (section 4 of MPT).

    Scores within :data:`BRANCH_SCORE_TOLERANCE` of each other are a tie.

    Returns:
        +1 when the original branch scored higher, -1 when the counterfactual branch did,
        0 on a tie (the pair is dropped).
    """
    if math.isnan(original_score) or math.isnan(branch_score):
        raise ValueError(f"branch scores must be numbers, got {original_score!r}, {branch_score!r}")
    tolerance = BRANCH_SCORE_TOLERANCE
    if math.isclose(original_score, branch_score, rel_tol=tolerance, abs_tol=tolerance):
        return 0
    return 1 if original_score > branch_score else -1


def side_score(branch_rewards: Sequence[Sequence[float]]) -> float:
    """A fork side's score: the mean over its K branches (``rl.fork_branches`` [ours]) of each
    branch's rewards from the forked step on; with K = 1 that branch's sum, the paper's score.

    Example: branches (0, 10) and (0, 0, 30) -> (10 + 30) / 2 = 20.
    """
    if not branch_rewards:
        raise ValueError("a fork side needs at least one branch")
    return sum(sum(rewards) for rewards in branch_rewards) / len(branch_rewards)


def _mean_reward_curve(branch_rewards: Sequence[Sequence[float]], length: int) -> list[float]:
    """Per decision from the forked step on, the reward earned so far, mean over the branches
    (a branch that ended keeps its total)."""
    curves = []
    for rewards in branch_rewards:
        curve = list(itertools.accumulate(rewards))
        curves.append(curve + [curve[-1] if curve else 0.0] * (length - len(curve)))
    return [sum(values) / len(curves) for values in zip(*curves, strict=True)]


def tie_break_preference(
    original_rewards: Sequence[Sequence[float]],
    branch_rewards: Sequence[Sequence[float]],
    original_progress: Sequence[float | None],
    branch_progress: Sequence[float | None],
) -> int:
    """[ours] ``rl.fork_tie_break``: which side of a TIED fork is preferred, +1 the original
    (recorded) side, -1 the counterfactual, 0 still tied (dropped). Each side is its branches'
    rewards from the forked step on and each branch's progress score at its end
    (``TextEnv.progress``, None: unknown).

    Earlier reward first: at the first decision where the sides' rewards so far (mean over
    their branches) differ, the side ahead is preferred. Then the higher mean progress score
    of the final states, when every branch has one. Both compare within
    :data:`BRANCH_SCORE_TOLERANCE`, as :func:`fork_preference` does.

    Example: rewards (0, 10, 0) against (10, 0, 0): -1 (the counterfactual earned its 10
    first); (0, 0) against (0,) with progress -3 against -5: +1.
    """
    length = max(len(rewards) for rewards in (*original_rewards, *branch_rewards))
    original = _mean_reward_curve(original_rewards, length)
    branch = _mean_reward_curve(branch_rewards, length)
    for ahead, behind in zip(original, branch, strict=True):
        preference = fork_preference(ahead, behind)
        if preference != 0:
            return preference
    progress = [*original_progress, *branch_progress]
    if any(value is None for value in progress):
        return 0
    original_mean = sum(original_progress) / len(original_progress)  # type: ignore[arg-type]
    branch_mean = sum(branch_progress) / len(branch_progress)  # type: ignore[arg-type]
    return fork_preference(original_mean, branch_mean)
