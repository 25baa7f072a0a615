"""[ours] A rule's learned decision labelled where the swarm goes (``relabel_rounds``).

The decision demonstrations (``run/decision_demonstrations.py``) cover only the experts' own
states, and Graph-of-Agents' score demonstrations only the experts' own replies, never what an
agent that is not needed proposes. Each round plays the swarm after SFT on the demonstration
worlds under its own rule; every decision prompt a model read there (a route, a peer's score of
a proposal the swarm really made) is kept with the task expert's answer in that state
(``DecisionReader.labelling``: the owner's role; the top level for the owner's proposal and
the lowest for any other), and each model fine-tunes for one epoch on the aggregate: its own
decision demonstrations and every round's labels so far. That is DAgger (Ross et al. 2011)
with the expert's owner as the label; unlike ``bids.relabel_rounds`` (``run/relabel.py``,
one epoch on the round's labels alone), the aggregate keeps the demonstrations' balance of
owners: on the round's labels alone the decider followed each round's majority, whoever a
stuck swarm's states belong to (the main job: all logger after one round, all smith after
two). Its rollouts and trained tokens count in the SFT budget.
"""

from __future__ import annotations

import torch
from omegaconf import DictConfig

from bidswarm import metric_names as names
from bidswarm.agents.policy import AgentPolicy
from bidswarm.agents.population import Population
from bidswarm.agents.prompts import PromptTemplate
from bidswarm.coordination.base import DECIDER_NAME
from bidswarm.envs.base import TextEnv
from bidswarm.envs.experts import Demonstration
from bidswarm.lit.bid_targets import bid_anchor_loss
from bidswarm.rollout.batches import BidLabelBatch
from bidswarm.rollout.decisions import DecisionLabel
from bidswarm.rollout.keyed import seeded_randomness
from bidswarm.rollout.loop import RolloutLoop
from bidswarm.rollout.market import market_metrics
from bidswarm.run.demonstrations import demonstration_worlds

RELABEL_DECISIONS = "sft/decision_relabel"
"""``sft/decision_relabel/<round>/agreement``: the swarm's agreement with the expert's choice
in the round's episodes, before that round's training; ``/<round>/labels``: the prompts it
labelled; ``sft/decision_relabel/flops``: what the rounds spent (also in ``sft/flops``)."""


def relabel_run_decisions(
    loop: RolloutLoop, env: TextEnv, cfg: DictConfig, demonstrations: list[Demonstration]
) -> dict[str, float]:
    """A run's ``coordination.relabel_rounds`` on its demonstration worlds, from its decision
    demonstrations among ``demonstrations``, at its SFT learning rate and batch size (its
    metrics: :data:`RELABEL_DECISIONS`)."""
    sft = cfg.sft
    worlds = demonstration_worlds(env, cfg)
    start = demonstration_labels(loop.swarm.population, demonstrations, loop.swarm.prompts)
    rounds = cfg.coordination.relabel_rounds
    return relabel_decisions(
        loop, worlds, rounds, sft.lr, sft.batch_size, sft.micro_batch_tokens, cfg.seed, start
    )


def demonstration_labels(
    population: Population, demonstrations: list[Demonstration], prompts: PromptTemplate
) -> list[DecisionLabel]:
    """The decision demonstrations (``score``, ``route``) as labels of the model that learns
    each: the agents of its role, or the decider."""
    labels = []
    for demo in (d for d in demonstrations if d.kind in ("score", "route")):
        if demo.role == DECIDER_NAME:
            policies = [] if population.decider is None else [population.decider]
        else:
            policies = [population.agents[a] for a in population.agents_of(demo.role)]
        for policy in policies:
            prompt_ids = policy.encode_prompts([prompts.prompt_of(demo)])[0]
            reply_ids = policy.encode_reply(prompts.reply_text(demo.reply))
            labels.append(DecisionLabel(policy, prompt_ids, reply_ids))
    return labels


def relabel_decisions(
    loop: RolloutLoop,
    seeds: list[int],
    rounds: int,
    lr: float,
    batch_size: int,
    token_budget: int | None,
    seed: int,
    start: list[DecisionLabel] | None = None,
) -> dict[str, float]:
    """``rounds`` rounds of playing ``seeds`` with ``loop`` while its decision reader keeps
    every decision prompt with the expert's label, then one epoch per model on its own labels
    of ``start`` (the demonstrations) and of every round so far (AdamW at ``lr``, batches of
    ``batch_size`` prompts in a seeded order); returns the rounds' metrics."""
    swarm = loop.swarm
    population = swarm.population
    device = next(population.parameters()).device
    optimizers: dict[int, torch.optim.Optimizer] = {}
    metrics: dict[str, float] = {}
    aggregate = list(start or [])
    with swarm.separate_usage() as usage:
        for round_ in range(rounds):
            rng, generator = seeded_randomness(f"decision_relabel/{seed}/{round_}", device)
            with loop.decisions.labelling() as labels:
                episodes = loop.run(seeds, rng, generator)
            health = market_metrics(episodes, swarm.roles)
            agreement = health.get(names.EXPERT_OWNER_AGREEMENT, float("nan"))
            metrics[f"{RELABEL_DECISIONS}/{round_}/agreement"] = agreement
            metrics[f"{RELABEL_DECISIONS}/{round_}/labels"] = float(len(labels))
            aggregate += labels
            shuffle = torch.Generator().manual_seed(rng.randrange(2**62))
            for policy, rows in _by_policy(aggregate):
                optimizer = optimizers.setdefault(
                    id(policy), torch.optim.AdamW(policy.trainable_parameters(), lr=lr)
                )
                order = torch.randperm(len(rows), generator=shuffle).tolist()
                policy.train()
                for start in range(0, len(order), batch_size):
                    part = [rows[i] for i in order[start : start + batch_size]]
                    batch = BidLabelBatch(
                        0, [r.prompt_ids for r in part], [r.reply_ids for r in part]
                    )
                    optimizer.zero_grad(set_to_none=True)
                    bid_anchor_loss(policy, batch, 1.0, token_budget, _backward)
                    optimizer.step()
                    tokens = batch.learner_tokens(policy, token_budget)
                    swarm.usage.count_trained(policy.parameter_counts(), tokens)
    population.eval()
    metrics[f"{RELABEL_DECISIONS}/flops"] = usage.rollout_flops + usage.train_flops
    return metrics


def _backward(_: int, loss: torch.Tensor) -> None:
    loss.backward()


def _by_policy(labels: list[DecisionLabel]) -> list[tuple[AgentPolicy, list[DecisionLabel]]]:
    """The labels grouped by the model that read them, in order of first appearance."""
    groups: dict[int, tuple[AgentPolicy, list[DecisionLabel]]] = {}
    for label in labels:
        groups.setdefault(id(label.policy), (label.policy, []))[1].append(label)
    return list(groups.values())
