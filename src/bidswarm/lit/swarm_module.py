"""SwarmModule: the learner. Each update: collect -> log-probs -> loss -> step.

Each Lightning epoch is one update (one batch), so a checkpoint at the end of every epoch
resumes exactly at the next update. The collector (``rollout/collector.py``) hands over the
update's data as plain per-agent batches: an action update's (credit already assigned, Eq. 2)
or a bid update's (preference pairs from counterfactual forks, Eq. 3). The learner forwards
each agent's batch in micro-batches of at most ``rl.micro_batch_tokens`` tokens, accumulating
gradients, so the peak memory of an update is set by the budget and not by envs x decisions;
then it clips each agent's gradient and steps the one optimizer.

The learner keeps the run's ledger of tokens and FLOPs (:attr:`SwarmModule.usage`): each update
adds what every process counted, summed over the processes (``lit/collectives.py``), so the
logged ``tokens/*`` and ``flops/*`` and the ``rl.flop_budget`` check are the run's, the same on
every process. Besides the collector's counts, the learner counts its own scoring forwards:
with ``rl.kl_coef`` above 0 the frozen reference scores every row the update trains on
(:meth:`SwarmModule.reference_usage`).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable

import lightning as L
import torch
from torch.utils.data import DataLoader

from bidswarm import metric_names as names
from bidswarm.agents.policy import FrozenReference
from bidswarm.agents.population import Population, agent_folder_name
from bidswarm.algorithms.losses import (
    Baseline,
    Normalization,
    bradley_terry_loss,
    entropy_bonus,
    group_mean_baselines,
    kl_penalty,
    reinforce_advantages,
    reinforce_loss,
    truncated_importance_weights,
)
from bidswarm.algorithms.schedules import LRSchedule, lr_factor
from bidswarm.config import RLConfig
from bidswarm.coordination.bid_readers import BidsConfig
from bidswarm.lit.accumulation import Backward, GradientAccumulator
from bidswarm.lit.bid_targets import bid_anchor_loss, calibrated_value_loss, level_mass_loss
from bidswarm.lit.collectives import sum_over_processes
from bidswarm.lit.memory import gpu_memory, release_cached_blocks
from bidswarm.lit.sampler_mismatch import LogprobGap, sampled_logprob_rows
from bidswarm.rollout.batches import (
    ActionBatch,
    AnchorBatch,
    BidBatch,
    BidLabelBatch,
    BidLevelMassBatch,
    BidValueBatch,
)
from bidswarm.rollout.collector import Collector
from bidswarm.rollout.metrics import timed
from bidswarm.rollout.usage import Usage


class SwarmModule(L.LightningModule):
    """The population's learner: one optimizer step per update of the collector's schedule.

    temperature: the sampling temperature, at which log-probs are recomputed.
    """

    def __init__(
        self,
        population: Population,
        collector: Collector,
        rl: RLConfig,
        temperature: float,
        bids: BidsConfig | None = None,
    ):
        """``bids``: the bid channel (None: the paper's); its ``temperature`` is the one the
        sampled reader's bid replies are scored at (None: ``temperature``)."""
        super().__init__()
        self.automatic_optimization = False
        self.population = population
        self.collector = collector
        self.rl = rl
        self.bids = bids or BidsConfig(name="paper")
        self.temperature = temperature
        self.bid_temperature = self.bids.temperature or temperature
        self.history: list[dict[str, float]] = []
        self.usage = Usage()
        """The run's training ledger: every update's counts of every process, summed
        (checkpointed; what ``flops/*`` log and ``rl.flop_budget`` reads)."""
        self._updates_this_process = 0
        # LoRA checkpoints hold the adapters only (on_save_checkpoint); on_load_checkpoint
        # checks their keys itself, as strict loading would ask for the frozen base's too.
        self.strict_loading = not population.is_lora
        # The KL penalty's reference: each agent as it starts RL (after SFT, or init_from's;
        # a resumed run builds this module from sft/ before the checkpoint loads). Made only
        # when the penalty is on: nothing is copied or forwarded otherwise.
        self.references: list[FrozenReference] | None = (
            [FrozenReference(agent) for agent in population.agents] if rl.kl_coef > 0 else None
        )

    @property
    def total_updates(self) -> int:
        return self.collector.total_updates

    # -- Lightning hooks -----------------------------------------------------------------------
    def configure_optimizers(self):
        # One optimizer (DeepSpeed accepts one), one param group per agent: agents that did
        # not act keep grad None and AdamW leaves them untouched.
        groups = [
            {"params": agent.trainable_parameters(), "name": f"agent{i}"}
            for i, agent in enumerate(self.population.agents)
        ]
        return torch.optim.AdamW(groups, lr=self.rl.lr, weight_decay=self.rl.weight_decay)

    def on_train_start(self) -> None:
        # SFT leaves the agents in eval mode; the models have no dropout, so rollouts are the same.
        self.population.train()
        # A run resumed after the update that spent its FLOP budget has nothing left to do
        # (training_step stops only after an update, which would make one more).
        if self.budget_spent:
            self.trainer.should_stop = True

    def train_dataloader(self) -> DataLoader:
        return DataLoader([0], batch_size=None)

    def training_step(self, batch, batch_idx):
        update = self.current_epoch
        memory: dict[str, float] = {}
        with gpu_memory(memory, "collect", self.device):
            collected = self.collector.collect(update, self.global_rank)
        release_cached_blocks(self.device)
        spent = collected.usage + self.reference_usage(collected.batches)
        self.usage = self.usage + sum_over_processes(spent, self.trainer.strategy, self.device)
        timings: dict[str, float] = {}
        phase = f"update_{collected.kind}"
        schedule = self.set_learning_rate(update)
        with timed(timings, phase), gpu_memory(memory, phase, self.device):
            losses = self.learn(collected.batches)
        metrics = collected.metrics | self.usage.as_metrics() | losses | memory | schedule
        metrics |= {names.seconds(phase): value for phase, value in timings.items()}
        self.history.append(metrics)
        if self.logger is not None:  # the update is the step of every RL metric
            logged = {k: v for k, v in metrics.items() if k not in names.BOOKKEEPING}
            self.logger.log_metrics(logged, step=update)
        self._updates_this_process += 1
        if self.rl.stop_after is not None and self._updates_this_process >= self.rl.stop_after:
            self.trainer.should_stop = True
        if self.budget_spent:
            self.trainer.should_stop = True

    def reference_usage(self, batches: list[ActionBatch] | list[BidBatch]) -> Usage:
        """What the KL penalty's reference forwards cost in an update over ``batches`` (nothing
        when ``rl.kl_coef`` is 0): it scores each row the learner trains on once more, the same
        tokens (``batch.learner_tokens``), as scored tokens at 2 x the weights it runs through
        (a full agent's copy: all its weights; a LoRA agent's reference: the base, adapters
        off)."""
        usage = Usage()
        if self.references is None:
            return usage
        for batch in batches:
            policy = self.population.agents[batch.agent]
            tokens = batch.learner_tokens(policy, self.rl.micro_batch_tokens)
            usage.count_rollout(self.references[batch.agent].parameter_counts(), tokens)
        return usage

    @property
    def budget_spent(self) -> bool:
        """Whether the run's training FLOPs (all processes') reached ``rl.flop_budget`` (never
        without one); the same answer on every process."""
        if self.rl.flop_budget is None:
            return False
        return self.usage.rollout_flops + self.usage.train_flops >= self.rl.flop_budget

    @property
    def finished(self) -> bool:
        """Whether every update of the schedule has been made, or the FLOP budget is spent."""
        return len(self.history) >= self.total_updates or self.budget_spent

    def adapter_state_keys(self) -> set[str]:
        """The state-dict keys of the LoRA agents' adapters, each adapter once (all agents
        hold the one shared model): what a LoRA checkpoint keeps of the module's state."""
        trainable = {id(p) for agent in self.population for p in agent.trainable_parameters()}
        return {name for name, p in self.named_parameters() if id(p) in trainable}

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Counters, per-update metrics and the process's RNG states (each update draws its
        own randomness from (seed, rank, update); the global generators are kept so that
        nothing else drawn from them differs after a resume). LoRA agents keep only their
        adapters: the frozen base is the one saved with the run's populations (``base/``),
        which a resumed run loads with ``sft/``."""
        if self.population.is_lora:
            kept = self.adapter_state_keys()
            checkpoint["state_dict"] = {
                key: value for key, value in checkpoint["state_dict"].items() if key in kept
            }
        checkpoint["bidswarm"] = {
            "usage": self.usage.as_dict(),
            "history": self.history,
            "rng": {
                "python": random.getstate(),
                "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            },
        }

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if self.population.is_lora:
            self._check_adapter_keys(checkpoint["state_dict"].keys())
        state = checkpoint["bidswarm"]
        self.usage.load(state["usage"])
        self.history = list(state["history"])
        rng = state.get("rng")  # absent from checkpoints written before it was kept
        if rng is not None:
            random.setstate(rng["python"])
            torch.set_rng_state(rng["torch"])
            if rng["cuda"] and len(rng["cuda"]) == torch.cuda.device_count():
                torch.cuda.set_rng_state_all(rng["cuda"])

    def _check_adapter_keys(self, saved: Iterable[str]) -> None:
        """A LoRA checkpoint must hold exactly this population's adapters (the base's weights
        are absent by design; Lightning loads it non-strictly)."""
        saved, wanted = set(saved), self.adapter_state_keys()
        if saved != wanted:
            missing, unexpected = sorted(wanted - saved), sorted(saved - wanted)
            raise RuntimeError(
                "the checkpoint does not hold this population's LoRA adapters: "
                f"missing {len(missing)} keys {missing[:3]}, unexpected {len(unexpected)} keys "
                f"{unexpected[:3]}"
            )

    # -- learning ------------------------------------------------------------------------------
    def set_learning_rate(self, update: int) -> dict[str, float]:
        """Every param group's learning rate for ``update`` (``rl.lr_schedule`` after
        ``rl.warmup_updates``), set once per update, whether or not it steps; a function of the
        update alone, so a resumed run continues the schedule. Returns ``{"lr": ...}`` to log,
        nothing under the paper's constant rate."""
        if self.rl.lr_schedule == LRSchedule.constant and self.rl.warmup_updates == 0:
            return {}
        factor = lr_factor(update, self.total_updates, self.rl.lr_schedule, self.rl.warmup_updates)
        for group in self.optimizers().param_groups:
            group["lr"] = self.rl.lr * factor
        return {names.LEARNING_RATE: self.rl.lr * factor}

    def learn(self, batches: list[ActionBatch] | list[BidBatch]) -> dict[str, float]:
        """Each agent's loss, micro-batch by micro-batch with gradient accumulation, then one
        optimizer step (skipped when no agent has data); returns the losses as metrics:
        ``loss_action/<agent>`` (``agent0_logger``, as the SFT curves) and ``loss_action``, the
        mean over the agents with data (``loss_bid`` likewise); with ``rl.kl_coef`` or
        ``rl.entropy_coef`` above 0 also their terms' means over the agents
        (``loss_action/kl``, ``loss_bid/kl``, ``entropy``; ``metric_names``), and how far the
        engine's log-probs of the sampled tokens were from the learner's
        (``engine/logprob_gap_mean|max``, :mod:`bidswarm.lit.sampler_mismatch`)."""
        accumulator = GradientAccumulator(self, self.population.agents)
        metrics: dict[str, float] = {}
        totals: dict[str, torch.Tensor] = {}
        gap = LogprobGap()
        group_means = self.role_decision_baselines(batches)
        kinds = Counter(type(batch) for batch in batches)
        for batch in batches:
            extra: dict[str, torch.Tensor] = {}
            if isinstance(batch, ActionBatch):
                name = "loss_action"
                means = group_means.get(batch.agent)
                loss = self.action_loss(batch, accumulator.backward, means, extra, gap)
            elif isinstance(batch, AnchorBatch | BidValueBatch):
                name, loss = self.bid_target_loss(batch, accumulator.backward)
            else:
                name = "loss_bid"
                loss = self.bid_loss(batch, accumulator.backward, extra, gap)
            agent = agent_folder_name(batch.agent, self.population[batch.agent].role)
            metrics[f"{name}/{agent}"] = float(loss)
            share = kinds[type(batch)]
            totals[name] = totals.get(name, 0) + loss / share
            for term, value in extra.items():
                totals[term] = totals.get(term, 0) + value / share
        if accumulator.synchronize():
            optimizer = self.optimizers()
            if self.rl.grad_clip > 0:
                self._clip_per_agent(optimizer)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return metrics | {name: float(total) for name, total in totals.items()} | gap.as_metrics()

    def bid_target_loss(
        self, batch: AnchorBatch | BidValueBatch, backward: Backward
    ) -> tuple[str, torch.Tensor]:
        """The name and loss of a batch of bid targets (``lit/bid_targets.py``): the anchor's
        expert labels or levels, or the calibrated values of acting."""
        policy, budget = self.population.agents[batch.agent], self.rl.micro_batch_tokens
        coef = self.bids.anchor_coef
        if isinstance(batch, BidLabelBatch):
            return names.BID_ANCHOR, bid_anchor_loss(policy, batch, coef, budget, backward)
        if isinstance(batch, BidLevelMassBatch):
            return names.BID_ANCHOR, level_mass_loss(policy, batch, coef, budget, backward)
        return names.BID_CALIBRATION, calibrated_value_loss(policy, batch, budget, backward)

    def role_decision_baselines(
        self, batches: list[ActionBatch] | list[BidBatch]
    ) -> dict[int, list[float | None]]:
        """Per agent, each row's mean credit over the update's rows of the same role and
        decision index, None when alone (``rl.baseline=role_decision_mean``; else empty)."""
        if self.rl.baseline != Baseline.role_decision_mean:
            return {}
        action = [b for b in batches if isinstance(b, ActionBatch)]
        rows = [(b.agent, d, c) for b in action for d, c in zip(b.decisions, b.credit, strict=True)]
        roles = [self.population[agent].role for agent, _, _ in rows]
        means = group_mean_baselines(
            [c for _, _, c in rows], [(r, d) for r, (_, d, _) in zip(roles, rows, strict=True)]
        )
        found: dict[int, list[float | None]] = {}
        for (agent, _, _), mean in zip(rows, means, strict=True):
            found.setdefault(agent, []).append(mean)
        return found

    def action_loss(
        self,
        batch: ActionBatch,
        backward: Backward,
        group_means: list[float | None] | None = None,
        extra_terms: dict[str, torch.Tensor] | None = None,
        gap: LogprobGap | None = None,
    ) -> torch.Tensor:
        """Eq. 2 of MPT: REINFORCE of one agent on its action tokens, with the advantages of
        its whole batch (``rl.baseline``: the per-agent mean by default; ``group_means`` for
        ``role_decision_mean``) and the normaliser of the whole batch, plus ``rl.kl_coef`` x the
        KL to the reference and minus ``rl.entropy_coef`` x the entropy (each term only when
        its coefficient is above 0), each token weighted by its truncated importance ratio
        against the engine that sampled it with ``rl.importance_cap``; ``backward(agent, loss)``
        per micro-batch. Returns the batch's REINFORCE loss (detached); ``extra_terms``
        receives the batch's KL and entropy, ``gap`` the sampled tokens' log-prob gaps."""
        policy = self.population.agents[batch.agent]
        credits = torch.tensor(batch.credit, dtype=torch.float32, device=policy.device)
        means = None
        if group_means is not None:
            means = torch.tensor(
                [float("nan") if m is None else m for m in group_means], device=policy.device
            )
        advantages = reinforce_advantages(
            credits, self.rl.baseline, means, self.rl.normalize_advantage
        )
        normalizer = float(
            sum(len(r) for r in batch.reply_ids)
            if self.rl.loss_normalization == Normalization.token_mean
            else len(batch.reply_ids)
        )
        kl_on, entropy_on = self.rl.kl_coef > 0, self.rl.entropy_coef > 0
        total = torch.zeros((), device=policy.device)
        kl_total, entropy_total = torch.zeros(()), torch.zeros(())
        for part, prompts, replies in batch.forwards(policy, self.rl.micro_batch_tokens):
            scores = policy.reply_token_scores(prompts, replies, self.temperature, entropy_on)
            sampled, present = sampled_logprob_rows(
                [batch.sampled_logprobs[i] for i in part],
                replies,
                scores.logprobs.shape[1],
                policy.device,
            )
            if gap is not None:
                gap.add(scores.logprobs, sampled, present)
            loss = reinforce_loss(
                scores.logprobs,
                scores.mask,
                advantages[part.start : part.stop],
                self.rl.loss_normalization,
                baseline=torch.zeros((), device=policy.device),
                normalizer=normalizer,
                token_weights=self.importance_weights(scores.logprobs, sampled, present),
            )["loss_action"]
            total = total + loss.detach()
            if kl_on:
                reference = self.references[batch.agent].reply_token_logprobs(
                    prompts, replies, self.temperature
                )
                kl = kl_penalty(scores.logprobs, reference, scores.mask, normalizer)["kl"]
                loss = loss + self.rl.kl_coef * kl
                kl_total = kl_total + kl.detach().cpu()
            if entropy_on:
                entropy = entropy_bonus(scores.entropy, scores.mask, normalizer)["entropy"]
                loss = loss - self.rl.entropy_coef * entropy
                entropy_total = entropy_total + entropy.detach().cpu()
            backward(batch.agent, loss)
        if extra_terms is not None:
            extra_terms |= {names.KL_ACTION: kl_total} if kl_on else {}
            extra_terms |= {names.ENTROPY: entropy_total} if entropy_on else {}
        return total

    def bid_loss(
        self,
        batch: BidBatch,
        backward: Backward,
        extra_terms: dict[str, torch.Tensor] | None = None,
        gap: LogprobGap | None = None,
    ) -> torch.Tensor:
        """Eq. 3 of MPT: Bradley-Terry of one agent over its preference pairs' bid tokens, the
        mean weighted by the pairs' weights over the whole batch (every micro-batch divides by
        the batch's weight sum, so the micro-batches' losses and gradients add up to the whole
        batch's); both replies of a pair share a forward; ``backward(agent, loss)`` per
        micro-batch of pairs. With ``rl.kl_coef`` above 0, plus that times the KL to the
        reference on both replies' bid tokens (per reply summed over its tokens, the replies
        weighted by their pair's weight, divided by twice the weight sum). With
        ``rl.importance_cap``, each pair's term is also weighted by the truncated importance
        ratio of its engine-sampled reply (summed over the reply's tokens). Returns the batch's
        Bradley-Terry loss (detached); ``extra_terms`` receives the batch's KL, ``gap`` the
        sampled bid tokens' log-prob gaps."""
        policy = self.population.agents[batch.agent]
        weights = torch.tensor(batch.weights, dtype=torch.float32, device=policy.device)
        weight_sum = float(weights.sum())
        total = torch.zeros((), device=policy.device)
        kl_on, kl_total = self.rl.kl_coef > 0, torch.zeros(())
        for part, prompts, replies in batch.forwards(policy, self.rl.micro_batch_tokens):
            logp, mask = policy.reply_token_logprobs(prompts, replies, self.bid_temperature)
            summed = (logp * mask).sum(dim=1)
            n = len(part)
            sampled, present = sampled_logprob_rows(
                [batch.preferred_sampled_logprobs[i] for i in part]
                + [batch.rejected_sampled_logprobs[i] for i in part],
                replies,
                logp.shape[1],
                policy.device,
            )
            if gap is not None:
                gap.add(logp, sampled, present)
            pair_weights = weights[part.start : part.stop]
            reply_weights = self.importance_weights(
                summed, (sampled * present).sum(dim=1), present.amax(dim=1)
            )
            if reply_weights is not None:
                pair_weights = pair_weights * reply_weights[:n] * reply_weights[n:]
            ties = [batch.tied[i] for i in part]
            terms = bradley_terry_loss(
                summed[:n],
                summed[n:],
                self.rl.bt_beta,
                weights=pair_weights,
                normalizer=weight_sum,
                ties=torch.tensor(ties, device=policy.device) if any(ties) else None,
            )
            loss = terms["loss_bid"]
            total = total + loss.detach()
            if kl_on:
                reference = self.references[batch.agent].reply_token_logprobs(
                    prompts, replies, self.bid_temperature
                )
                row_weights = weights[part.start : part.stop].repeat(2)
                kl = kl_penalty(logp, reference, mask, 2 * weight_sum, row_weights)["kl"]
                loss = loss + self.rl.kl_coef * kl
                kl_total = kl_total + kl.detach().cpu()
            backward(batch.agent, loss)
        if extra_terms is not None and kl_on:
            extra_terms[names.KL_BID] = kl_total
        return total

    def importance_weights(
        self, learner: torch.Tensor, sampled: torch.Tensor, present: torch.Tensor
    ) -> torch.Tensor | None:
        """``rl.importance_cap``'s truncated importance weights of engine-sampled tokens or
        replies (:func:`truncated_importance_weights`); None when the correction is off."""
        if self.rl.importance_cap is None:
            return None
        return truncated_importance_weights(learner, sampled, present, self.rl.importance_cap)

    def _clip_per_agent(self, optimizer) -> None:
        """Clip each agent's gradient norm to ``rl.grad_clip`` on its own (one param group per
        agent): a global clip would let one agent's large gradient shrink every other's step."""
        for group in optimizer.param_groups:
            grads = [p for p in group["params"] if p.grad is not None]
            if grads:
                torch.nn.utils.clip_grad_norm_(grads, self.rl.grad_clip)
