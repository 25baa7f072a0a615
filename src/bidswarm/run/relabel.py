"""[ours] Bid labels where the swarm goes, in the cold start (``bids.relabel_rounds``).

The SFT bid demonstrations cover only the states of the experts' own play: after one actor the
expert would not have picked, the bids meet states nobody labelled. Each round plays the
swarm after SFT on the demonstration worlds under its own rule, labels every bidder's bid
prompt at every state with the task expert's bid for its role (``expert_bid`` reads any state),
and fine-tunes each agent for one epoch on the aggregate: the new labels together with its own
SFT demonstrations, bids and actions (DAgger, Ross et al. 2011, with the expert's bids as the
labels). Without the demonstrations in the mix the bid labels, which share the weights with the
actions, wash the actions out. Its rollouts and trained tokens count in the SFT budget.
"""

from __future__ import annotations

import torch

from bidswarm import metric_names as names
from bidswarm.envs.experts import Demonstration
from bidswarm.lit.bid_targets import bid_anchor_loss
from bidswarm.rollout.batches import BidLabelBatch, bid_label_batches
from bidswarm.rollout.keyed import seeded_randomness
from bidswarm.rollout.loop import RolloutLoop
from bidswarm.rollout.market import market_metrics
from bidswarm.rollout.swarm import Swarm

RELABEL = "sft/relabel"
"""``sft/relabel/<round>/agreement``: the swarm's agreement with the expert's choice in the
round's episodes, before that round's training; ``sft/relabel/flops``: what the rounds spent
(also in ``sft/flops``)."""


def relabel_bids(
    loop: RolloutLoop,
    demonstrations: list[Demonstration],
    seeds: list[int],
    rounds: int,
    lr: float,
    batch_size: int,
    token_budget: int | None,
    seed: int,
) -> dict[str, float]:
    """``rounds`` rounds of playing ``seeds`` with ``loop`` and fine-tuning each agent on the
    expert's labels at every bid prompt of the episodes together with its own
    ``demonstrations`` (AdamW at ``lr``, batches of ``batch_size`` rows in a seeded order, one
    epoch); returns the rounds' metrics."""
    swarm = loop.swarm
    population = swarm.bid_population
    device = next(population.parameters()).device
    optimizers = {
        agent: torch.optim.AdamW(policy.trainable_parameters(), lr=lr)
        for agent, policy in enumerate(population.agents)
    }
    metrics: dict[str, float] = {}
    with swarm.separate_usage() as usage:
        for round_ in range(rounds):
            rng, generator = seeded_randomness(f"relabel/{seed}/{round_}", device)
            episodes = loop.run(seeds, rng, generator)
            health = market_metrics(episodes, swarm.roles)
            metrics[f"{RELABEL}/{round_}/agreement"] = health.get(
                names.EXPERT_OWNER_AGREEMENT, float("nan")
            )
            shuffle = torch.Generator().manual_seed(rng.randrange(2**62))
            for labels in bid_label_batches(episodes, swarm.roles, swarm.level_reply_ids, 10**9):
                batch = _with_demonstrations(swarm, labels, demonstrations)
                order = torch.randperm(len(batch.prompt_ids), generator=shuffle)
                _train_epoch(swarm, batch, order, optimizers[batch.agent], batch_size, token_budget)
    population.eval()
    metrics[f"{RELABEL}/flops"] = usage.rollout_flops + usage.train_flops
    return metrics


def _with_demonstrations(
    swarm: Swarm, labels: BidLabelBatch, demonstrations: list[Demonstration]
) -> BidLabelBatch:
    """``labels`` with the agent's own role's demonstrations (bids and actions) added, as the
    SFT cold start writes them."""
    policy = swarm.bid_population.agents[labels.agent]
    own = [d for d in demonstrations if d.role == policy.role]
    if not own:
        return labels
    build = {"bid": swarm.prompts.bid, "action": swarm.prompts.action}
    prompts = policy.encode_prompts([build[d.kind](d.role, d.observation) for d in own])
    replies = [policy.encode_reply(swarm.prompts.reply_text(d.reply)) for d in own]
    return BidLabelBatch(
        labels.agent, [*labels.prompt_ids, *prompts], [*labels.reply_ids, *replies]
    )


def _train_epoch(
    swarm: Swarm,
    batch: BidLabelBatch,
    order: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    batch_size: int,
    token_budget: int | None,
) -> None:
    """One pass over ``batch``'s labels in ``order``, ``batch_size`` prompts a step."""
    policy = swarm.bid_population.agents[batch.agent]
    policy.train()
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size].tolist()
        part = BidLabelBatch(
            batch.agent, [batch.prompt_ids[i] for i in rows], [batch.reply_ids[i] for i in rows]
        )
        optimizer.zero_grad(set_to_none=True)
        bid_anchor_loss(policy, part, 1.0, token_budget, lambda _, loss: loss.backward())
        optimizer.step()
        swarm.count_trained(batch.agent, part.learner_tokens(policy, token_budget))
