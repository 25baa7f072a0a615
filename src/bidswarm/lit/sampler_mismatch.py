"""How far the rollout engine's log-probs of the sampled tokens are from the learner's.

The learner recomputes every trained reply's log-probs with its own weights (the training
signal). Where an engine sampled the reply, it also reported its own log-prob of each token
(:attr:`~bidswarm.rollout.records.Reply.sampled_logprobs`): another kernel (vLLM), another
dtype (``model.rollout_dtype``), or weights a step behind would show here as a gap.
``engine/logprob_gap_mean`` and ``engine/logprob_gap_max`` are |learner - engine| per sampled
token over an update's trained replies (action tokens, and the sampled bid of each pair).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from bidswarm import metric_names as names


def sampled_logprob_rows(
    rows: Sequence[Sequence[float]], replies: Sequence[Sequence[int]], width: int, device
) -> tuple[Tensor, Tensor]:
    """The engine's log-probs laid out as the learner's [B, width] (column j: reply token j)
    and where they are present: a row counts only when it has one value per reply token (an
    engine sampled that reply); others, and padding, are 0 in both."""
    values = torch.zeros((len(rows), width), device=device)
    present = torch.zeros((len(rows), width), device=device)
    for b, (row, reply) in enumerate(zip(rows, replies, strict=True)):
        if row and len(row) == len(reply):
            values[b, : len(row)] = torch.tensor(row, dtype=torch.float32, device=device)
            present[b, : len(row)] = 1.0
    return values, present


@dataclass
class LogprobGap:
    """|learner - engine| over the sampled tokens an update trained on."""

    total: float = 0.0
    tokens: int = 0
    largest: float = 0.0

    def add(self, learner: Tensor, sampled: Tensor, present: Tensor) -> None:
        """Tokens where ``present`` is 1, all three [B, L] (``learner`` may carry gradient)."""
        gap = (learner.detach().float() - sampled).abs() * present
        count = int(present.sum())
        if count:
            self.total += float(gap.sum())
            self.tokens += count
            self.largest = max(self.largest, float(gap.max()))

    def as_metrics(self) -> dict[str, float]:
        """The gap's mean and max (none when no trained token was engine-sampled)."""
        if not self.tokens:
            return {}
        return {
            names.ENGINE_LOGPROB_GAP_MEAN: self.total / self.tokens,
            names.ENGINE_LOGPROB_GAP_MAX: self.largest,
        }
