"""[ours] The bid anchor: the negative log-likelihood of the task expert's bid labels at the
swarm's own bid prompts, added to action updates (``bids.anchor_coef``).

Action updates train the same weights that write the bids; without an anchor the bid replies
drift toward the action text (the bid and action prompts differ by a word). The labels are
the expert's bid of the bidder's role in each state the update played (``StepRecord
.expert_levels``), so the anchor also labels the states off the experts' path, which the SFT
demonstrations never reach.
"""

from __future__ import annotations

import torch

from bidswarm.agents.policy import AgentPolicy
from bidswarm.lit.accumulation import Backward
from bidswarm.rollout.batches import BidLabelBatch


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
