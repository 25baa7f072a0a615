"""[ours] Bid losses toward targets, beside the paper's Bradley-Terry (Eq. 3).

- The bid anchor (``bids.anchor_coef``): the negative log-likelihood of the task expert's bid
  labels at the swarm's own bid prompts, added to action updates. Action updates train the same
  weights that write the bids; without an anchor the bid replies drift toward the action text
  (the bid and action prompts differ by a word). The labels are the expert's bid of the
  bidder's role in each state the update played (``StepRecord.expert_levels``), so the anchor
  also labels the states off the experts' path, which the SFT demonstrations never reach.
- The calibrated bid loss (``bids.loss=calibrated``): each agent's distribution over the bid
  levels toward its measured value of acting (``rollout/acting_values.py``), two-hot
  cross-entropy (``algorithms/calibration.py``).
"""

from __future__ import annotations

import torch

from bidswarm.agents.policy import AgentPolicy
from bidswarm.algorithms.calibration import calibrated_bid_loss, two_hot_targets
from bidswarm.lit.accumulation import Backward
from bidswarm.rollout.batches import BidLabelBatch, BidValueBatch


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
    width = len(batch.level_ids)
    total = torch.zeros((), device=policy.device)
    for part, prompts, replies in batch.forwards(policy, token_budget):
        logp, mask = policy.reply_token_logprobs(prompts, replies, temperature=1.0)
        level_logprobs = (logp * mask).sum(dim=1).reshape(len(part), width)
        loss = calibrated_bid_loss(
            level_logprobs,
            targets[part.start : part.stop],
            normalizer=float(len(batch.values)),
        )["loss_calibration"]
        total = total + loss.detach()
        backward(batch.agent, loss)
    return total
