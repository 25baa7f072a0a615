"""The collector's ledger: tokens, FLOPs, bids, parse failures and actions, counted here only.

FLOPs follow docs/method.md section 5 [ours], with the rates of :mod:`bidswarm.agents.flops`:
2 x the weights a token runs through per generated or scored token (rollout), forward + backward per
trained token (6 x params fully fine-tuned; 4 x base + 6 x adapter under LoRA), over all agents,
forks included. The
collector writes the ledger: the swarm counts what it generates and scores, the loop the
actions, the collector the trained tokens of the batches it hands to the learner; the learner
adds the scored tokens of its KL reference (``SwarmModule.reference_usage``). Held-out
evaluation counts into a ledger of its own (``Swarm.separate_usage``).

Under DDP every process counts what it did itself; the run's ledger is the sum over the
processes (the learner's, ``SwarmModule.usage``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields

from bidswarm.agents.flops import ParameterCounts


@dataclass
class Usage:
    """Running totals of one run's training (or of one evaluation)."""

    rollout_tokens: int = 0
    train_tokens: int = 0
    rollout_flops: float = 0.0
    train_flops: float = 0.0
    bid_parse_failures: int = 0
    bids_made: int = 0
    invalid_actions: int = 0
    actions_made: int = 0

    def count_rollout(self, weights: ParameterCounts, tokens: int) -> None:
        """Generated or scored tokens of an agent whose tokens run through ``weights``."""
        self.rollout_tokens += tokens
        self.rollout_flops += weights.forward_flops_per_token * tokens

    def count_trained(self, weights: ParameterCounts, tokens: int) -> None:
        """Trained tokens (prompt + reply of every row a learner forward sees)."""
        self.train_tokens += tokens
        self.train_flops += weights.train_flops_per_token * tokens

    def count_bids(self, parsed: Iterable[bool]) -> None:
        """Bid replies made, and which parsed (a malformed one counts as bid 0)."""
        for ok in parsed:
            self.bids_made += 1
            self.bid_parse_failures += not ok

    def count_action(self, valid: bool) -> None:
        self.actions_made += 1
        self.invalid_actions += not valid

    def __add__(self, other: Usage) -> Usage:
        """Both ledgers' counts together (an update's added to the run's; processes' summed)."""
        return Usage(
            **{c.name: getattr(self, c.name) + getattr(other, c.name) for c in fields(self)}
        )

    def as_metrics(self) -> dict[str, float]:
        """The logged names: ``tokens/*``, ``flops/*``, ``parse_failures/bid`` (totals so far).
        Invalid actions are counted for checkpoints only: the logged count is the task's own,
        per episode (``task/invalid_replies``)."""
        return {
            "tokens/rollout": float(self.rollout_tokens),
            "tokens/train": float(self.train_tokens),
            "flops/rollout": self.rollout_flops,
            "flops/train": self.train_flops,
            "flops/total": self.rollout_flops + self.train_flops,
            "parse_failures/bid": float(self.bid_parse_failures),
        }

    def as_dict(self) -> dict[str, float]:
        """Every counter, for a checkpoint."""
        return {key: float(value) for key, value in asdict(self).items()}

    def load(self, values: dict[str, float]) -> None:
        """Counters saved by :meth:`as_dict`."""
        for counter in fields(self):
            if counter.name in values:
                kind = int if counter.type in ("int", int) else float
                setattr(self, counter.name, kind(values[counter.name]))
