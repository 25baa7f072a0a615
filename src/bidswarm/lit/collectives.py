"""What the processes of a multi-process run (DDP, DeepSpeed) exchange besides gradients.

Each process collects its own rollouts and counts what it spent, so the run's tokens and FLOPs
are the sum over the processes (:func:`sum_over_processes`): what ``flops/*`` log and what
``rl.flop_budget`` is compared with, the same number on every process, so that every process
takes the same stop decision (one stopping alone would leave the others waiting in the next
gradient all-reduce). Held-out evaluation is spread over the processes, and process 0 gathers
what each one played (:func:`gather_on_process_zero`).

These are collectives: every process makes the same calls in the same order. A process that
waits for another longer than ``trainer.collective_timeout_s`` fails (``lit/strategy.py``).
In one process each is the identity.
"""

from __future__ import annotations

from typing import TypeVar

import torch
from lightning.pytorch.strategies import Strategy
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from bidswarm.rollout.usage import Usage

Value = TypeVar("Value")


def sum_over_processes(usage: Usage, strategy: Strategy, device: torch.device) -> Usage:
    """Every process's ``usage`` summed, on every process (float64 on ``device``, where the
    strategy's backend reduces: counts stay exact below 2**53)."""
    counts = usage.as_dict()
    values = torch.tensor(list(counts.values()), dtype=torch.float64, device=device)
    summed = strategy.reduce(values, reduce_op="sum")
    total = Usage()
    total.load(dict(zip(counts, summed.tolist(), strict=True)))
    return total


def process_group() -> tuple[int, int]:
    """``(rank, processes)`` of this process in the run's process group; ``(rank, 1)`` before
    the group exists (Lightning makes it at the first ``fit``; only process 0 runs before)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return rank_zero_only.rank, 1


def gather_on_process_zero(value: Value) -> list[Value] | None:
    """Every process's ``value`` (picklable), in rank order, on process 0; None on the others.
    Outside a process group: ``[value]``."""
    rank, processes = process_group()
    if processes == 1:
        return [value]
    gathered: list[Value] | None = [None] * processes if rank == 0 else None  # type: ignore[list-item]
    torch.distributed.gather_object(value, gathered, dst=0)
    return gathered
