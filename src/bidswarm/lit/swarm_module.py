"""SwarmModule: MPT training as a LightningModule with manual optimization.

Each Lightning epoch is one update (one batch), so a checkpoint at the end of every epoch
resumes exactly at the next update. Update ``u`` of a cycle of ``action_updates + bid_updates``
is an action update (bucket-brigade credit + REINFORCE, Eq. 2) or a bid update (counterfactual
forks + Bradley-Terry, Eq. 3), each on fresh on-policy episodes collected inside the step.
"""

from __future__ import annotations

import random
import time
from collections import defaultdict
from contextlib import contextmanager

import lightning as L
import torch
from torch.utils.data import DataLoader

from bidswarm.algorithms.credit import CREDIT_RULES
from bidswarm.algorithms.losses import bradley_terry_loss, reinforce_loss
from bidswarm.config import RLConfig
from bidswarm.rollout.loop import RolloutLoop
from bidswarm.rollout.metrics import episode_metrics
from bidswarm.rollout.records import Episode, PreferencePair


class SwarmModule(L.LightningModule):
    """Population + RolloutLoop + the 4:1 schedule of action and bid updates."""

    def __init__(
        self,
        loop: RolloutLoop,
        rl: RLConfig,
        credit: str,
        train_seeds: list[int],
        seed: int,
    ):
        super().__init__()
        self.automatic_optimization = False
        self.loop = loop
        self.population = loop.swarm.population
        self.rl = rl
        self.credit_rule = CREDIT_RULES[credit]
        self.train_seeds = train_seeds
        self.seed = seed
        self.history: list[dict[str, float]] = []
        self._timings: dict[str, float] = {}
        self._updates_this_process = 0

    # -- schedule ------------------------------------------------------------------------------
    @property
    def total_updates(self) -> int:
        return self.rl.cycles * (self.rl.action_updates + self.rl.bid_updates)

    def update_kind(self, update: int) -> str:
        """``action`` or ``bid``; rules without bids only ever make action updates."""
        if not self.loop.coordination.asks_bids or self.rl.bid_updates == 0:
            return "action"
        cycle = self.rl.action_updates + self.rl.bid_updates
        return "action" if update % cycle < self.rl.action_updates else "bid"

    # -- Lightning hooks -----------------------------------------------------------------------
    def configure_optimizers(self):
        # One optimizer (DeepSpeed accepts one), one param group per agent: agents that did
        # not act keep grad None and AdamW leaves them untouched.
        groups = [
            {"params": list(agent.parameters()), "name": f"agent{i}"}
            for i, agent in enumerate(self.population.agents)
        ]
        return torch.optim.AdamW(groups, lr=self.rl.lr, weight_decay=self.rl.weight_decay)

    def on_train_start(self) -> None:
        # SFT leaves the agents in eval mode; the models have no dropout, so rollouts are the same.
        self.population.train()

    def train_dataloader(self) -> DataLoader:
        return DataLoader([0], batch_size=None)

    def training_step(self, batch, batch_idx):
        update = self.current_epoch
        rng, generator = self._randomness(update)
        kind = self.update_kind(update)
        self._timings = {}
        with self._timed("rollout"):
            seeds = rng.sample(self.train_seeds, self.rl.envs_per_update)
            episodes = self.loop.run(seeds, rng, generator, keep_snapshots=kind == "bid")
        metrics = episode_metrics(episodes, self.loop.swarm)
        if kind == "action":
            metrics |= self._action_update(episodes, rng)
        else:
            metrics |= self._bid_update(episodes, rng, generator)
        usage = self.loop.swarm.usage
        metrics |= {
            "update": float(update),
            "update_is_bid": float(kind == "bid"),
            "tokens/rollout": float(usage.rollout_tokens),
            "tokens/train": float(usage.train_tokens),
            "flops/rollout": usage.rollout_flops,
            "flops/train": usage.train_flops,
            "flops/total": usage.rollout_flops + usage.train_flops,
            "parse_failures/bid": float(usage.bid_parse_failures),
            "invalid_actions": float(usage.invalid_actions),
        }
        metrics |= {f"time/{name}": seconds for name, seconds in self._timings.items()}
        self.history.append(metrics)
        self.log_dict(metrics, on_step=True, on_epoch=False, prog_bar=False, batch_size=1)
        self.log("reward", metrics["reward/mean"], prog_bar=True, batch_size=1)
        self._updates_this_process += 1
        if self.rl.stop_after is not None and self._updates_this_process >= self.rl.stop_after:
            self.trainer.should_stop = True

    @property
    def finished(self) -> bool:
        """Whether every update of the schedule has been made."""
        return len(self.history) >= self.total_updates

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["bidswarm"] = {"usage": self.loop.swarm.usage.as_dict(), "history": self.history}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        state = checkpoint["bidswarm"]
        self.loop.swarm.usage.load(state["usage"])
        self.history = list(state["history"])

    # -- helpers -------------------------------------------------------------------------------
    def _randomness(self, update: int) -> tuple[random.Random, torch.Generator]:
        """Randomness derived from (seed, rank, update): a resumed run replays it exactly."""
        key = f"{self.seed}/{self.global_rank}/{update}"
        rng = random.Random(key)
        generator = torch.Generator(device=self.device)
        generator.manual_seed(rng.randrange(2**63))
        return rng, generator

    @contextmanager
    def _timed(self, phase: str):
        start = time.perf_counter()
        yield
        self._timings[phase] = self._timings.get(phase, 0.0) + time.perf_counter() - start

    def _backward_and_step(self, losses: list[torch.Tensor]) -> None:
        """Backward the summed loss and step; with no data, skip (or join the all-reduce)."""
        optimizer = self.optimizers()
        if not losses:
            if self.trainer.world_size == 1:
                return
            # Other processes may have data: take part in the gradient all-reduce with zeros.
            losses = [sum(p.reshape(-1)[0] * 0.0 for p in self.population.parameters())]
        self.manual_backward(torch.stack([loss.reshape(()) for loss in losses]).sum())
        if self.rl.grad_clip > 0:
            self._clip_per_agent(optimizer)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def _clip_per_agent(self, optimizer) -> None:
        """Clip each agent's gradient norm to ``rl.grad_clip`` on its own (one param group per
        agent): a global clip would let one agent's large gradient shrink every other's step."""
        for group in optimizer.param_groups:
            grads = [p for p in group["params"] if p.grad is not None]
            if grads:
                torch.nn.utils.clip_grad_norm_(grads, self.rl.grad_clip)

    def _action_update(self, episodes: list[Episode], rng: random.Random) -> dict[str, float]:
        """Credit, REINFORCE losses per agent, one optimizer step (Eq. 2)."""
        with self._timed("update_action"):
            losses, metrics = self.action_losses(episodes, rng)
            self._backward_and_step(losses)
        return metrics

    def _bid_update(
        self, episodes: list[Episode], rng: random.Random, generator: torch.Generator
    ) -> dict[str, float]:
        """Counterfactual forks -> preference pairs -> Bradley-Terry per agent (Eq. 3)."""
        with self._timed("fork"):
            pairs, stats = self.loop.fork(
                episodes,
                self.rl.fork_budget,
                self.rl.max_bid_resamples,
                rng,
                generator,
                self.rl.bid_resample_temperature,
                self.rl.fork_steps,
                self.rl.bid_resample,
            )
        with self._timed("update_bid"):
            losses, metrics = self.bid_losses(pairs)
            self._backward_and_step(losses)
        return metrics | stats.as_metrics()

    def action_losses(
        self, episodes: list[Episode], rng: random.Random
    ) -> tuple[list[torch.Tensor], dict[str, float]]:
        """The credit rule over each episode's acting steps, then one REINFORCE loss per agent
        that acted (Eq. 2 of MPT); agents that did not act get no loss and so no gradient."""
        samples: dict[int, list] = defaultdict(list)
        discarded = 0.0
        for episode in episodes:
            acting = episode.acting_steps
            credits, lost = self.credit_rule(
                [s.reward for s in acting],
                [s.winning_bid for s in acting],
                rng,
                self.loop.swarm.bid_levels,
            )
            discarded += lost
            for step, credit in zip(acting, credits, strict=True):
                samples[step.actor].append((step.action, credit))
        metrics = {"credit/discarded": discarded / max(len(episodes), 1)}
        losses = []
        for agent, items in sorted(samples.items()):
            replies = [reply for reply, _ in items]
            logp, mask = self._reply_logprobs(
                agent, [r.prompt_ids for r in replies], [r.reply_ids for r in replies]
            )
            credits = torch.tensor([c for _, c in items], dtype=logp.dtype, device=logp.device)
            terms = reinforce_loss(logp, mask, credits, self.rl.loss_normalization)
            losses.append(terms["loss_action"])
            metrics[f"loss_action/agent{agent}"] = float(terms["loss_action"].detach())
        if losses:
            metrics["loss_action"] = float(sum(loss.detach() for loss in losses))
        return losses, metrics

    def bid_losses(
        self, pairs: list[PreferencePair]
    ) -> tuple[list[torch.Tensor], dict[str, float]]:
        """One Bradley-Terry loss per agent over its preference pairs' bid tokens (Eq. 3)."""
        by_agent: dict[int, list[PreferencePair]] = defaultdict(list)
        for pair in pairs:
            by_agent[pair.agent].append(pair)
        losses, metrics = [], {}
        for agent, agent_pairs in sorted(by_agent.items()):
            prompts = [p.prompt_ids for p in agent_pairs] * 2
            replies = [p.preferred_ids for p in agent_pairs] + [p.rejected_ids for p in agent_pairs]
            logp, mask = self._reply_logprobs(agent, prompts, replies)
            summed = (logp * mask).sum(dim=1)
            n = len(agent_pairs)
            terms = bradley_terry_loss(summed[:n], summed[n:], self.rl.bt_beta)
            losses.append(terms["loss_bid"])
            metrics[f"loss_bid/agent{agent}"] = float(terms["loss_bid"].detach())
        if losses:
            metrics["loss_bid"] = float(sum(loss.detach() for loss in losses))
        return losses, metrics

    def _reply_logprobs(
        self, agent: int, prompt_ids: list[list[int]], reply_ids: list[list[int]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token log-probs (with gradient) of ``agent``'s replies; counts trained tokens."""
        policy = self.population.agents[agent]
        self.loop.swarm.count_trained(
            agent, sum(len(p) + len(r) for p, r in zip(prompt_ids, reply_ids, strict=True))
        )
        return policy.reply_token_logprobs(
            prompt_ids, reply_ids, temperature=self.loop.swarm.temperature
        )
