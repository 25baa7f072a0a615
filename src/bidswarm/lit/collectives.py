"""What the processes of a multi-process run (DDP, DeepSpeed) exchange besides gradients.

Each process collects its own rollouts and counts what it spent, so the run's tokens and FLOPs
are the sum over the processes (:func:`sum_over_processes`): what ``flops/*`` log and what
``rl.flop_budget`` is compared with, the same number on every process, so that every process
takes the same stop decision (one stopping alone would leave the others waiting in the next
gradient all-reduce).

These are collectives: every process makes the same calls in the same order. A process that
waits for another longer than ``trainer.collective_timeout_s`` fails (``lit/strategy.py``).
In one process each is the identity.
"""

from __future__ import annotations

import torch
from lightning.pytorch.strategies import Strategy

from bidswarm.rollout.usage import Usage


def sum_over_processes(usage: Usage, strategy: Strategy, device: torch.device) -> Usage:
    """Every process's ``usage`` summed, on every process (float64 on ``device``, where the
    strategy's backend reduces: counts stay exact below 2**53)."""
    counts = usage.as_dict()
    values = torch.tensor(list(counts.values()), dtype=torch.float64, device=device)
    summed = strategy.reduce(values, reduce_op="sum")
    total = Usage()
    total.load(dict(zip(counts, summed.tolist(), strict=True)))
    return total
