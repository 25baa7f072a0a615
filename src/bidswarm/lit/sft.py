"""SFT cold start (docs/method.md section 5): each agent learns only its own role's demonstrations.

Every agent makes ``SFTConfig.epochs`` passes over each demonstration it learns, each pass in a
fresh seeded order: a role agent over its role's action and bid demonstrations (of the bid ones,
a seeded ``SFTConfig.bid_fraction`` share), the monolithic agent (role None) over every role's
actions (the demonstrations with role None), so it sees each action demonstration as often as
that role's agent (``sft.match=action_passes``). With ``sft.match=tokens`` the monolithic
agent's passes instead go on until it has trained as many tokens as the role agents of one
replica in total, bids included (:class:`~bidswarm.config.SFTMatch` says why that favours it).
A rule that learns its own decision (``CoordinationRule.decisions_learned``: peers' usefulness
scores, routes) has demonstrations of it in place of the bids (``run/decision_demonstrations.py``):
each agent learns its role's ``score`` and ``route`` demonstrations as it would its bids (the same
passes, the same ``bid_fraction`` share), and the population's decider, if it has one, its own
``route`` demonstrations in the same optimizer step.
Each plan's action, bid and decision tokens and FLOPs are the run's SFT budget
(:func:`sft_budget`).
The loss is the token mean of the negative log-likelihood of the reply tokens (end of sequence
included), never of the prompt. Each agent's batch is forwarded in micro-batches of at most
``SFTConfig.micro_batch_tokens`` tokens with gradient accumulation: the step is the same, its
peak memory is set by the budget. One AdamW optimizer holds one param group per agent, each
with its own cosine schedule over that agent's own steps; an agent with no batch in a step has
no gradient, so AdamW leaves it unchanged.
"""

from __future__ import annotations

import gc
import math
import random
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import Logger
from torch.utils.data import DataLoader

from bidswarm import metric_names as names
from bidswarm.agents.policy import AgentPolicy, micro_batches
from bidswarm.agents.population import DECIDER_FOLDER, Population, agent_folder_name
from bidswarm.agents.prompts import PromptTemplate, parse_bid
from bidswarm.config import SFTConfig, SFTDemonstrations, SFTMatch
from bidswarm.coordination.base import DECIDER_NAME, DECISION_KINDS
from bidswarm.engines import PromptBatch, RolloutEngine
from bidswarm.envs.experts import Demonstration
from bidswarm.lit.accumulation import Backward, GradientAccumulator
from bidswarm.lit.callbacks import StepProgress
from bidswarm.lit.memory import release_cached_blocks


@dataclass(frozen=True)
class SFTExample:
    """A tokenized demonstration: prompt tokens, reply tokens (ending with eos) and its kind
    (``action`` or ``bid``)."""

    prompt_ids: list[int]
    reply_ids: list[int]
    kind: str
    """``action``, ``bid``, or a learned decision's ``score`` / ``route``."""

    @property
    def tokens(self) -> int:
        return len(self.prompt_ids) + len(self.reply_ids)


def encode_demonstrations(
    agent: AgentPolicy, demonstrations: list[Demonstration], prompts: PromptTemplate
) -> list[SFTExample]:
    """Prompt and reply tokens of each demonstration, as ``agent`` would see and write them."""
    texts = [prompts.prompt_of(d) for d in demonstrations]
    prompt_ids = agent.encode_prompts(texts) if texts else []
    return [
        SFTExample(ids, agent.encode_reply(prompts.reply_text(d.reply)), d.kind)
        for ids, d in zip(prompt_ids, demonstrations, strict=True)
    ]


SAMPLED_KINDS = ("bid", *DECISION_KINDS)
"""The kinds of which ``sft.bid_fraction`` keeps a seeded share: a decision made at every step."""


def member_name(index: int, role: str | None) -> str:
    """``agent0_logger``, ...; the decider (after the agents): ``decider_router``."""
    return DECIDER_FOLDER if role == DECIDER_NAME else agent_folder_name(index, role)


def trained_members(population: Population) -> Population:
    """What the cold start trains: the agents, and after them the decider if there is one."""
    if population.decider is None:
        return population
    return Population([*population.agents, population.decider])


def demonstrations_of(role: str | None, demonstrations: list[Demonstration]):
    """A role's bid, action and decision demonstrations (the decider's: its ``route`` ones);
    for None, the monolithic copies of actions."""
    if role is None:
        return [d for d in demonstrations if d.role is None and d.kind == "action"]
    return [d for d in demonstrations if d.role == role]


PARSE_PROBE_PROMPTS = 32
"""Bid demonstrations per agent whose prompts :func:`bid_parse_rate` samples a reply to."""


def bid_parse_rate(
    population: Population,
    demonstrations: list[Demonstration],
    prompts: PromptTemplate,
    max_bid_tokens: int,
    temperature: float,
    seed: int,
    engine: RolloutEngine,
) -> float | None:
    """Share of bid replies that parse to a bid level (:func:`parse_bid`), sampled at
    ``temperature`` by each agent to the prompts of up to :data:`PARSE_PROBE_PROMPTS` of its own
    role's bid demonstrations (a seeded draw, the same before and after SFT); None when no
    agent has bid demonstrations (a monolithic swarm). A pretrained chat model replies free
    text to a bid prompt: this says how much of it the auction can read, before and after the
    cold start (``sft/bid_parse_rate/before|after``). Sampled by the run's rollout
    ``engine``, on its own random streams: it moves no other number of the run."""
    rng = random.Random(seed)
    generator = torch.Generator(population.agents[0].device).manual_seed(seed)
    parsed: list[bool] = []
    for agent in population.agents:
        bids = [d for d in demonstrations_of(agent.role, demonstrations) if d.kind == "bid"]
        if not bids:
            continue
        probe = rng.sample(bids, min(PARSE_PROBE_PROMPTS, len(bids)))
        batch = PromptBatch(
            agent, agent.encode_prompts([prompts.bid(d.role, d.observation) for d in probe])
        )
        replies = engine.generate([batch], max_bid_tokens, temperature, generator)[0]
        parsed += [parse_bid(reply.text, list(prompts.bid_levels))[1] for reply in replies]
    return sum(parsed) / len(parsed) if parsed else None


def keep_bid_fraction(
    demonstrations: list[Demonstration], fraction: float, rng: random.Random
) -> list[Demonstration]:
    """Every action demonstration and a seeded draw of ``fraction`` of the bid (and learned
    decision) ones, in order.

    Every role bids at every step but acts at few, so bids are most of a role's examples;
    keeping fewer of them gives the SFT steps to the replies (the harder part to learn).
    """
    if fraction >= 1.0:
        return demonstrations
    return [d for d in demonstrations if d.kind not in SAMPLED_KINDS or rng.random() < fraction]


def epoch_stream(n_examples: int, epochs: int, rng: random.Random) -> list[int]:
    """Example indices for ``epochs`` passes, each pass in a fresh random order."""
    stream: list[int] = []
    for _ in range(epochs):
        order = list(range(n_examples))
        rng.shuffle(order)
        stream += order
    return stream


def token_matched_stream(examples: list[SFTExample], budget: int, rng: random.Random) -> list[int]:
    """Shuffled passes over ``examples`` cut where their tokens first reach ``budget``."""
    stream: list[int] = []
    total = 0
    while total < budget and examples:
        for index in epoch_stream(len(examples), 1, rng):
            if total >= budget:
                break
            stream.append(index)
            total += examples[index].tokens
    return stream


def example_forwards(
    agent: AgentPolicy, examples: list[SFTExample], token_budget: int | None
) -> list[tuple[list[list[int]], list[list[int]]]]:
    """The forwards of ``agent`` over one step's ``examples``, as (prompts, replies): consecutive
    examples whose forward stays within ``token_budget`` tokens (:func:`micro_batches` of
    :meth:`AgentPolicy.forward_row_tokens`)."""
    prompts, replies = [e.prompt_ids for e in examples], [e.reply_ids for e in examples]
    return [
        ([prompts[i] for i in part], [replies[i] for i in part])
        for part in micro_batches(agent.forward_row_tokens(prompts, replies), token_budget)
    ]


@dataclass
class AgentPlan:
    """What one agent trains on: its examples, their order, and its batches."""

    examples: list[SFTExample]
    stream: list[int]
    batch_size: int

    @property
    def steps(self) -> int:
        return math.ceil(len(self.stream) / self.batch_size)

    @property
    def steps_per_epoch(self) -> int:
        return max(math.ceil(len(self.examples) / self.batch_size), 1)

    def batch(self, step: int) -> list[SFTExample]:
        indices = self.stream[step * self.batch_size : (step + 1) * self.batch_size]
        return [self.examples[index] for index in indices]

    @property
    def trained_tokens(self) -> int:
        return sum(self.examples[index].tokens for index in self.stream)

    @property
    def loss_tokens(self) -> int:
        return sum(len(self.examples[index].reply_ids) for index in self.stream)

    def forward_tokens(self, agent: AgentPolicy, token_budget: int | None) -> int:
        """Tokens the forwards over every batch of the plan compute (:func:`example_forwards`;
        a prompt head the rows of a forward share counted once): what ``sft/flops`` counts."""
        return sum(
            agent.forward_tokens(prompts, replies)
            for step in range(self.steps)
            for prompts, replies in example_forwards(agent, self.batch(step), token_budget)
        )

    def trained_tokens_of(self, *kinds: str) -> int:
        """Prompt + reply tokens of the examples of ``kinds`` (``action``, ``bid``, ...)
        trained on."""
        return sum(
            self.examples[index].tokens
            for index in self.stream
            if self.examples[index].kind in kinds
        )


def plan_sft(
    population: Population,
    demonstrations: list[Demonstration],
    prompts: PromptTemplate,
    cfg: SFTConfig,
    seed: int,
) -> list[AgentPlan]:
    """Each agent's examples and batch order (see the module docstring for the rules)."""
    rng = random.Random(seed)
    if cfg.demonstrations != SFTDemonstrations.all:
        kinds = DECISION_KINDS
        if cfg.demonstrations == SFTDemonstrations.decisions_and_actions:
            kinds = (*DECISION_KINDS, "action")
        demonstrations = [d for d in demonstrations if d.kind in kinds]
    demonstrations = keep_bid_fraction(demonstrations, cfg.bid_fraction, rng)
    role_demos = [d for d in demonstrations if d.role is not None]
    plans: list[AgentPlan] = []
    for agent in population:
        examples = encode_demonstrations(
            agent, demonstrations_of(agent.role, demonstrations), prompts
        )
        if agent.role is None and cfg.match == SFTMatch.tokens:
            # As many tokens as one replica of every role trains in total, bids included.
            budget = cfg.epochs * sum(
                e.tokens for e in encode_demonstrations(agent, role_demos, prompts)
            )
            stream = token_matched_stream(examples, budget, rng)
        else:
            stream = epoch_stream(len(examples), cfg.epochs, rng)
        plans.append(AgentPlan(examples, stream, cfg.batch_size))
    return plans


def sft_budget(
    population: Population, plans: list[AgentPlan], token_budget: int | None
) -> dict[str, float]:
    """What SFT spends, per agent and in total: ``sft/action_tokens`` and ``sft/bid_tokens``
    (prompt + reply tokens trained on, by demonstration kind), ``sft/decision_tokens`` (of a
    learned decision's, only where there are any) and ``sft/flops`` (training FLOPs
    per token x the tokens the forwards compute, :meth:`AgentPlan.forward_tokens`: 6 x
    parameters, 4 x base + 6 x adapter under LoRA, :mod:`bidswarm.agents.flops`, as the RL
    ledger counts them); each as ``<name>/<agent>`` and ``<name>`` (the sum over agents; the
    decider's as ``/decider_router``)."""
    budget: dict[str, float] = {name: 0.0 for name in names.SFT_BUDGET}
    learns = any(plan.trained_tokens_of(*DECISION_KINDS) for plan in plans)
    for index, (agent, plan) in enumerate(zip(population, plans, strict=True)):
        per_token = agent.parameter_counts().train_flops_per_token
        spent = {
            names.SFT_ACTION_TOKENS: float(plan.trained_tokens_of("action")),
            names.SFT_BID_TOKENS: float(plan.trained_tokens_of("bid")),
            names.SFT_FLOPS: per_token * plan.forward_tokens(agent, token_budget),
        }
        if learns:
            spent[names.SFT_DECISION_TOKENS] = float(plan.trained_tokens_of(*DECISION_KINDS))
        for name, value in spent.items():
            budget[f"{name}/{member_name(index, agent.role)}"] = value
            budget[name] = budget.get(name, 0.0) + value
    return budget


def cosine_schedule(total_steps: int):
    """LR factor from 1 down to 0 over ``total_steps`` (half a cosine), then 0."""

    def factor(step: int) -> float:
        if total_steps <= 0:
            return 0.0
        return 0.5 * (1.0 + math.cos(math.pi * min(step, total_steps) / total_steps))

    return factor


class SFTModule(L.LightningModule):
    """Supervised fine-tuning of every agent of a population on its own plan."""

    def __init__(self, population: Population, plans: list[AgentPlan], cfg: SFTConfig):
        super().__init__()
        self.automatic_optimization = False
        self.population = population
        self.plans = plans
        self.cfg = cfg
        self.losses: dict[int, list[float]] = defaultdict(list)

    @property
    def total_steps(self) -> int:
        return max((plan.steps for plan in self.plans), default=0)

    def agent_name(self, index: int) -> str:
        return member_name(index, self.population[index].role)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(list(range(self.total_steps)), batch_size=None, shuffle=False)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        step = int(batch)
        accumulator = GradientAccumulator(self, list(self.population))
        total, trained = None, 0
        for index, (agent, plan) in enumerate(zip(self.population, self.plans, strict=True)):
            examples = plan.batch(step)
            if not examples:
                continue
            loss = self.agent_loss(index, agent, examples, accumulator.backward)
            self.losses[index].append(float(loss))
            self.log(f"sft/loss/{self.agent_name(index)}", loss, batch_size=len(examples))
            total = loss if total is None else total + loss
            trained += 1
        if accumulator.synchronize():
            optimizer = self.optimizers()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        self.lr_schedulers().step()
        if total is not None:
            # The mean over the agents trained at this step (each agent's: sft/loss/<agent>).
            self.log("sft/loss", total / trained, batch_size=1, prog_bar=True)

    def agent_loss(
        self,
        index: int,
        agent: AgentPolicy,
        examples: list[SFTExample],
        backward: Backward,
    ) -> torch.Tensor:
        """Token-mean NLL of ``agent``'s replies in ``examples`` (detached); ``backward(index,
        loss)`` adds its gradient micro-batch by micro-batch."""
        reply_tokens = float(sum(len(e.reply_ids) for e in examples))
        total = torch.zeros((), device=agent.device)
        for prompts, replies in example_forwards(agent, examples, self.cfg.micro_batch_tokens):
            logprobs, mask = agent.reply_token_logprobs(prompts, replies)
            loss = -(logprobs * mask).sum() / reply_tokens
            backward(index, loss)
            total = total + loss.detach()
        return total

    def configure_optimizers(self) -> dict[str, Any]:
        groups = [
            {"params": agent.trainable_parameters(), "name": self.agent_name(index)}
            for index, agent in enumerate(self.population)
        ]
        optimizer = torch.optim.AdamW(groups, lr=self.cfg.lr, weight_decay=self.cfg.weight_decay)
        schedules = [cosine_schedule(plan.steps) for plan in self.plans]
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedules)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }

    def final_loss(self, index: int) -> float:
        """Mean loss of the agent's last epoch worth of batches (nan if it never trained)."""
        recent = self.losses[index][-self.plans[index].steps_per_epoch :]
        return sum(recent) / len(recent) if recent else math.nan


def run_sft(
    population: Population,
    demonstrations: list[Demonstration],
    prompts: PromptTemplate,
    cfg: SFTConfig,
    trainer_kwargs: dict[str, Any] | None = None,
    logger: Logger | None = None,
    seed: int = 0,
    progress: bool = False,
) -> dict[str, float]:
    """Fine-tune every agent (and the decider, :func:`trained_members`) on its own
    demonstrations with a ``lightning.Trainer``.

    ``trainer_kwargs`` go to the Trainer (accelerator, devices, precision, ...); loss curves
    go to ``logger`` per agent; ``progress``: a bar over the steps on stderr. Returns
    ``sft/final_loss/<agent>``, ``sft/trained_tokens/<agent>`` (prompt + reply tokens
    processed), ``sft/loss_tokens/<agent>`` (supervised reply tokens), ``sft/trained_tokens``
    (all agents), ``sft/steps`` and the SFT budget (:func:`sft_budget`).
    """
    population = trained_members(population)
    plans = plan_sft(population, demonstrations, prompts, cfg, seed)
    module = SFTModule(population, plans, cfg)
    if module.total_steps == 0:
        raise ValueError("SFT has no demonstrations for any agent of the population")
    options: dict[str, Any] = {
        "max_epochs": 1,
        "logger": logger if logger is not None else False,
        "enable_checkpointing": False,
        "enable_model_summary": False,
        "enable_progress_bar": False,
        "log_every_n_steps": 1,
    }
    options.update(trainer_kwargs or {})
    if progress:
        options["callbacks"] = [*options.get("callbacks", []), StepProgress("SFT")]
    population.train()
    trainer = L.Trainer(**options)
    trainer.fit(module)
    population.eval()
    result: dict[str, float] = {"sft/steps": float(module.total_steps)}
    for index, plan in enumerate(plans):
        name = module.agent_name(index)
        result[f"sft/final_loss/{name}"] = module.final_loss(index)
        result[f"sft/trained_tokens/{name}"] = float(plan.trained_tokens)
        result[f"sft/loss_tokens/{name}"] = float(plan.loss_tokens)
    result["sft/trained_tokens"] = float(sum(plan.trained_tokens for plan in plans))
    result |= sft_budget(population, plans, cfg.micro_batch_tokens)
    # The trainer and the module refer to each other: free the SFT optimizer's states (two
    # copies of every weight) now, not at some later garbage collection, before RL makes its own;
    # then hand the freed memory back to the system (on a CPU glibc kept ~5 GiB of SmolLM2's).
    del trainer, module
    gc.collect()
    release_cached_blocks(population.agents[0].device)
    return result
