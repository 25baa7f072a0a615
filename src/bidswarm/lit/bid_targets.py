"""[ours] Bid losses toward targets, beside the paper's Bradley-Terry (Eq. 3).

- The bid anchor (``bids.anchor_coef``): the negative log-likelihood of the task expert's bid
  labels at the swarm's own bid prompts, added to action updates. Action updates train the same
  weights that write the bids; without an anchor the bid replies drift toward the action text
  (the bid and action prompts differ by a word). The labels are the expert's bid of the
  bidder's role in each state the update played (``StepRecord.expert_levels``), so the anchor
  also labels the states off the experts' path, which the SFT demonstrations never reach.
- The bid anchor on the levels (``bids.anchor_target=levels``): the negative log of the
  probability that the bid reply is one of the levels' canonical replies, whichever, at the
  same prompts: it keeps the replies bids without pulling them toward the expert's labels,
  whose base rates (mostly passes for a role that owns few steps) the label anchor teaches.
- The calibrated bid loss (``bids.loss=calibrated``): each agent's distribution over the bid
  levels toward its measured value of acting (``rollout/acting_values.py``), two-hot
  cross-entropy (``algorithms/calibration.py``).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from bidswarm.agents.policy import AgentPolicy
from bidswarm.algorithms.calibration import calibrated_bid_loss, two_hot_targets
from bidswarm.lit.accumulation import Backward
from bidswarm.rollout.batches import (
    BidLabelBatch,
    BidLevelMassBatch,
    BidValueBatch,
    LevelRowsBatch,
)


def bid_anchor_loss(
    policy: AgentPolicy,
    batch: BidLabelBatch,
    coef: float,
    token_budget: int | None,
    backward: Backward,
) -> torch.Tensor:
    """Mean negative log-likelihood per label token of ``batch``'s canonical bid replies at
    temperature 1 (the unconstrained reply, so its gradient also moves probability from any
    other text onto the levels), micro-batch by micro-batch; ``backward(agent, coef x loss)``
    per micro-batch. Returns the batch's loss before ``coef`` (detached)."""
    normalizer = float(sum(len(reply) for reply in batch.reply_ids))
    total = torch.zeros((), device=policy.device)
    for _, prompts, replies in batch.forwards(policy, token_budget):
        logp, mask = policy.reply_token_logprobs(prompts, replies, temperature=1.0)
        loss = -(logp * mask).sum() / normalizer
        total = total + loss.detach()
        backward(batch.agent, coef * loss)
    return total


def level_logprobs(
    policy: AgentPolicy, batch: LevelRowsBatch, token_budget: int | None
) -> Iterator[tuple[range, torch.Tensor]]:
    """Forward by forward over ``batch``, which of its prompts the forward holds and their
    log-probs at temperature 1 of each level's canonical reply (teacher-forced, with gradient),
    one row per prompt."""
    width = len(batch.level_ids)
    for part, prompts, replies in batch.forwards(policy, token_budget):
        logp, mask = policy.reply_token_logprobs(prompts, replies, temperature=1.0)
        yield part, (logp * mask).sum(dim=1).reshape(len(part), width)


def level_mass_loss(
    policy: AgentPolicy,
    batch: BidLevelMassBatch,
    coef: float,
    token_budget: int | None,
    backward: Backward,
) -> torch.Tensor:
    """The bid anchor on the levels: mean over ``batch``'s prompts of -log sum_l p(level l's
    canonical reply | prompt) at temperature 1, micro-batch by micro-batch;
    ``backward(agent, coef x loss)`` per micro-batch. Its gradient raises every level's
    probability in proportion to it, so the levels' relative odds move only through what the
    shared weights carry along. Returns the batch's loss before ``coef`` (detached)."""
    total = torch.zeros((), device=policy.device)
    for _, logprobs in level_logprobs(policy, batch, token_budget):
        loss = -torch.logsumexp(logprobs, dim=1).sum() / len(batch.prompt_ids)
        total = total + loss.detach()
        backward(batch.agent, coef * loss)
    return total


def calibrated_value_loss(
    policy: AgentPolicy,
    batch: BidValueBatch,
    token_budget: int | None,
    backward: Backward,
) -> torch.Tensor:
    """The calibrated bid loss of one agent over ``batch``: the log-prob at temperature 1 of
    each level's canonical reply at each prompt (teacher-forced, with gradient), and the
    cross-entropy of their softmax over the levels toward the two-hot targets of the values
    (mean over the batch's prompts); ``backward(agent, loss)`` per micro-batch. Returns the
    batch's loss (detached)."""
    targets = two_hot_targets(torch.tensor(batch.values, device=policy.device), batch.levels)
    total = torch.zeros((), device=policy.device)
    for part, logprobs in level_logprobs(policy, batch, token_budget):
        loss = calibrated_bid_loss(
            logprobs,
            targets[part.start : part.stop],
            normalizer=float(len(batch.values)),
        )["loss_calibration"]
        total = total + loss.detach()
        backward(batch.agent, loss)
    return total
