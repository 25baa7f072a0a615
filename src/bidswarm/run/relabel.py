"""[ours] Labels where the swarm goes, in the cold start: DAgger rounds over the bids
(``bids.relabel_rounds``) and over a rule's learned decisions (``coordination.relabel_rounds``).

The SFT demonstrations cover only the states of the experts' own play: after one actor the
expert would not have picked, the bids and decisions meet states nobody labelled. Each round
plays the swarm after SFT on the demonstration worlds under its own rule and keeps every prompt
a model answered there with the task expert's answer in that state (``expert_bid`` and the
expert's owner read any state):

- bids: every bidder's bid prompt, labelled with the expert's bid for its role;
- decisions (``DecisionReader.labelling``): every route prompt, labelled with the owner's role,
  and every peer's score of a proposal the swarm really made, labelled with the top level for
  the owner's proposal and the lowest for any other.

Then each model fine-tunes for one epoch (AdamW, one optimizer per model across the rounds) on
the aggregate: every round's labels so far, then its own SFT demonstrations of those kinds
(DAgger, Ross et al. 2011, with the expert as the labeller). The demonstrations keep the
balance the rounds' own states lack: without the actions in the mix the bid labels, which share
the weights with the actions, wash the actions out; on one round's labels alone the main job's
decider followed that round's majority, whoever a stuck swarm's states belong to (all logger
after one round, all smith after two). Models are trained in the population's order (agents,
then the decider). The rounds' rollouts and trained tokens count in the SFT budget.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig
from tqdm.auto import tqdm

from bidswarm import metric_names as names
from bidswarm.agents.policy import AgentPolicy
from bidswarm.agents.population import Population
from bidswarm.agents.prompts import PromptTemplate
from bidswarm.coordination.base import DECIDER_NAME, DECISION_KINDS, CoordinationRule
from bidswarm.envs.base import TextEnv
from bidswarm.envs.experts import Demonstration
from bidswarm.lit.bid_targets import bid_anchor_loss
from bidswarm.rollout.batches import BidLabelBatch, bid_label_batches
from bidswarm.rollout.decisions import DecisionLabel
from bidswarm.rollout.keyed import seeded_randomness
from bidswarm.rollout.loop import RolloutLoop
from bidswarm.rollout.market import market_metrics
from bidswarm.rollout.records import Episode
from bidswarm.run.demonstrations import demonstration_worlds

RELABEL = "sft/relabel"
"""The bids' rounds: ``sft/relabel/<round>/agreement`` (the swarm's agreement with the
expert's choice in the round's episodes, before that round's training), ``/<round>/labels``
(the prompts it labelled), ``sft/relabel/flops`` (what the rounds spent, also in
``sft/flops``)."""
RELABEL_DECISIONS = "sft/decision_relabel"
"""The decisions' rounds, with the same metrics as :data:`RELABEL`."""

BID_KINDS = ("bid", "action")
"""The demonstrations the bids' rounds train on beside their labels."""

LabelsOf = Callable[[RolloutLoop, list[Episode], list[DecisionLabel]], list[DecisionLabel]]
"""A round's labels from its episodes and the decision prompts the reader kept while playing."""


@dataclass(frozen=True)
class RoundTraining:
    """How each model trains on a round's labels: AdamW at ``lr``, ``batch_size`` prompts a
    step, micro-batches of at most ``token_budget`` learner tokens (None: whole batches), the
    forwards under the trainer's ``precision`` (:func:`mixed_precision`)."""

    lr: float
    batch_size: int
    token_budget: int | None = None
    precision: str = "32-true"

    @classmethod
    def of_run(cls, cfg: DictConfig, lr: float | None = None) -> RoundTraining:
        """A run's: its SFT learning rate (or ``lr``), batch size and micro-batches, its
        trainer's precision."""
        sft = cfg.sft
        return cls(lr or sft.lr, sft.batch_size, sft.micro_batch_tokens, cfg.trainer.precision)


def relabel_bids(
    loop: RolloutLoop,
    demonstrations: list[Demonstration],
    seeds: list[int],
    rounds: int,
    training: RoundTraining,
    seed: int,
) -> dict[str, float]:
    """``rounds`` DAgger rounds over the bids on ``seeds``, beside each agent's own bid and
    action ``demonstrations`` (metrics: :data:`RELABEL`)."""
    swarm = loop.swarm
    start = demonstration_labels(swarm.bid_population, demonstrations, swarm.prompts, BID_KINDS)
    return dagger_rounds(loop, seeds, rounds, training, seed, RELABEL, bid_labels, start)


def relabel_decisions(
    loop: RolloutLoop,
    seeds: list[int],
    rounds: int,
    training: RoundTraining,
    seed: int,
    start: list[DecisionLabel] | None = None,
) -> dict[str, float]:
    """``rounds`` DAgger rounds over the rule's learned decisions on ``seeds``, beside ``start``
    (the decision demonstrations as labels; metrics: :data:`RELABEL_DECISIONS`)."""
    return dagger_rounds(
        loop, seeds, rounds, training, seed, RELABEL_DECISIONS, read_labels, start or []
    )


def relabel_run_decisions(
    loop: RolloutLoop, env: TextEnv, cfg: DictConfig, demonstrations: list[Demonstration]
) -> dict[str, float]:
    """A run's ``coordination.relabel_rounds`` on its demonstration worlds, from its
    demonstrations among ``demonstrations`` of :func:`decision_round_kinds`, trained as its
    SFT (:meth:`RoundTraining.of_run`)."""
    swarm = loop.swarm
    kinds = decision_round_kinds(loop.coordination)
    start = demonstration_labels(swarm.population, demonstrations, swarm.prompts, kinds)
    return relabel_decisions(
        loop,
        demonstration_worlds(env, cfg),
        cfg.coordination.relabel_rounds,
        RoundTraining.of_run(cfg),
        cfg.seed,
        start,
    )


def decision_round_kinds(rule: CoordinationRule) -> tuple[str, ...]:
    """The demonstration kinds ``rule``'s decision rounds train on beside their labels: its
    decisions' and, where the decision is learned in the agents' own weights (every rule's but
    the router's, whose decider is a model of its own), the agents' actions, as the bids' rounds
    do (:data:`BID_KINDS`): alone, an epoch of level replies after prompts so like the action
    prompt made the tiny agents answer their action prompt with a level."""
    return DECISION_KINDS if rule.needs_decider else (*DECISION_KINDS, "action")


def demonstration_labels(
    population: Population,
    demonstrations: list[Demonstration],
    prompts: PromptTemplate,
    kinds: Sequence[str] = DECISION_KINDS,
) -> list[DecisionLabel]:
    """The demonstrations of ``kinds`` as labels of the models that learn each: the agents of
    its role, or the decider."""
    labels = []
    for demo in (d for d in demonstrations if d.kind in kinds):
        if demo.role == DECIDER_NAME:
            policies = [] if population.decider is None else [population.decider]
        else:
            policies = [population.agents[a] for a in population.agents_of(demo.role)]
        for policy in policies:
            prompt_ids = policy.encode_prompts([prompts.prompt_of(demo)])[0]
            reply_ids = policy.encode_reply(prompts.reply_text(demo.reply))
            labels.append(DecisionLabel(policy, prompt_ids, reply_ids))
    return labels


def bid_labels(
    loop: RolloutLoop, episodes: list[Episode], _: list[DecisionLabel]
) -> list[DecisionLabel]:
    """Every bid prompt of ``episodes`` with the expert's bid for the bidder's role there."""
    swarm = loop.swarm
    agents = swarm.bid_population.agents
    return [
        DecisionLabel(agents[batch.agent], prompt, reply)
        for batch in bid_label_batches(episodes, swarm.roles, swarm.level_reply_ids, 10**9)
        for prompt, reply in zip(batch.prompt_ids, batch.reply_ids, strict=True)
    ]


def read_labels(
    _: RolloutLoop, __: list[Episode], read: list[DecisionLabel]
) -> list[DecisionLabel]:
    """The decision prompts the reader kept while the round played, with the expert's answers."""
    return read


def dagger_rounds(
    loop: RolloutLoop,
    seeds: list[int],
    rounds: int,
    training: RoundTraining,
    seed: int,
    prefix: str,
    labels_of: LabelsOf,
    start: list[DecisionLabel],
) -> dict[str, float]:
    """``rounds`` rounds of playing ``seeds`` with ``loop``, each followed by one epoch per
    model on its labels (``labels_of``) of every round so far, then of ``start``, in a seeded
    order (:func:`train_epoch`; one optimizer per model across the rounds); the rounds' metrics
    under ``prefix``.
    A bar on stderr (process 0) per round: its lock-step decisions, then its training steps."""
    swarm = loop.swarm
    device = next(swarm.population.parameters()).device
    optimizers: dict[int, torch.optim.Optimizer] = {}
    metrics: dict[str, float] = {}
    kept: list[DecisionLabel] = []
    name = prefix.removeprefix("sft/")
    with swarm.separate_usage() as usage:
        for round_ in range(rounds):
            key = f"{name}/{seed}/{round_}"
            rng, generator = seeded_randomness(key, device)
            bar = tqdm(
                total=loop.horizon,
                desc=f"{name} {round_ + 1}/{rounds}",
                unit="step",
                disable=rank_zero_only.rank != 0,
            )
            with bar:
                bar.set_postfix(phase=f"play {len(seeds)} worlds")
                with loop.decisions.labelling() as read:
                    episodes = loop.run(seeds, rng, generator, on_decision=bar.update)
                labels = labels_of(loop, episodes, read)
                health = market_metrics(episodes, swarm.roles)
                agreement = health.get(names.EXPERT_OWNER_AGREEMENT, float("nan"))
                metrics[f"{prefix}/{round_}/agreement"] = agreement
                metrics[f"{prefix}/{round_}/labels"] = float(len(labels))
                kept += labels
                shuffle = torch.Generator().manual_seed(rng.randrange(2**62))
                groups = by_model(models(swarm), kept + start)
                steps = sum(-(-len(rows) // training.batch_size) for _, rows in groups)
                bar.reset(total=steps)
                for policy, rows in groups:
                    bar.set_postfix(phase=f"train {policy.role}", labels=len(rows))
                    optimizer = optimizers.setdefault(
                        id(policy),
                        torch.optim.AdamW(policy.trainable_parameters(), lr=training.lr),
                    )
                    order = torch.randperm(len(rows), generator=shuffle).tolist()
                    shuffled = [rows[i] for i in order]
                    tokens = train_epoch(policy, shuffled, optimizer, training, bar.update)
                    swarm.usage.count_trained(policy.parameter_counts(), tokens)
    for policy in models(swarm):
        policy.eval()
    metrics[f"{prefix}/flops"] = usage.rollout_flops + usage.train_flops
    return metrics


def models(swarm) -> list[AgentPolicy]:
    """Every model the swarm's rounds may train, in order: the agents, those that bid for them
    (when another population bids), the decider."""
    found: list[AgentPolicy] = []
    for policy in (
        *swarm.population.agents,
        *swarm.bid_population.agents,
        swarm.population.decider,
    ):
        if policy is not None and all(policy is not other for other in found):
            found.append(policy)
    return found


def by_model(
    order: list[AgentPolicy], labels: list[DecisionLabel]
) -> list[tuple[AgentPolicy, list[DecisionLabel]]]:
    """``labels`` grouped by the model that learns them, the models in ``order``, each
    group's labels in their own order."""
    groups: dict[int, list[DecisionLabel]] = {}
    for label in labels:
        groups.setdefault(id(label.policy), []).append(label)
    return [(policy, groups[id(policy)]) for policy in order if id(policy) in groups]


def train_epoch(
    policy: AgentPolicy,
    rows: list[DecisionLabel],
    optimizer: torch.optim.Optimizer,
    training: RoundTraining,
    on_step: Callable[[], None] | None = None,
) -> int:
    """One pass over ``rows`` in their order, ``training.batch_size`` a step, on each reply's
    teacher-forced log-likelihood, the forwards under :func:`mixed_precision`; the learner
    tokens it trained on. ``on_step`` after each step (a progress bar)."""
    policy.train()
    tokens = 0
    autocast = mixed_precision(training.precision, policy.device.type)
    for start in range(0, len(rows), training.batch_size):
        part = rows[start : start + training.batch_size]
        batch = BidLabelBatch(0, [r.prompt_ids for r in part], [r.reply_ids for r in part])
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            bid_anchor_loss(policy, batch, 1.0, training.token_budget, _backward)
        optimizer.step()
        tokens += batch.learner_tokens(policy, training.token_budget)
        if on_step is not None:
            on_step()
    return tokens


def mixed_precision(precision: str, device_type: str) -> contextlib.AbstractContextManager:
    """The autocast the trainer's ``precision`` runs Lightning's forwards under, for the
    rounds' forwards outside Lightning: ``bf16-mixed`` bfloat16 autocast, every other precision
    none (the weights' own dtype; ``16-mixed`` would need Lightning's loss scaling, which the
    rounds do not do)."""
    if precision == "bf16-mixed":
        return torch.autocast(device_type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _backward(_: int, loss: torch.Tensor) -> None:
    with torch.autocast(loss.device.type, enabled=False):  # backward outside autocast
        loss.backward()
