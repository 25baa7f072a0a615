"""The learning rate of the RL updates over the run (``rl.lr_schedule``, ``rl.warmup_updates``)
[ours]: the paper's RL learning rate is constant (docs/method.md section 5)."""

from __future__ import annotations

import math
from enum import Enum


class LRSchedule(str, Enum):
    """How the RL learning rate moves from update to update (``rl.lr_schedule``)."""

    constant = "constant"
    """The paper's: ``rl.lr`` at every update (after the warm-up, if any)."""
    cosine = "cosine"
    """[ours] Half a cosine from ``rl.lr`` towards 0 over the updates after the warm-up."""
    linear = "linear"
    """[ours] A straight line from ``rl.lr`` towards 0 over the updates after the warm-up."""

    __str__ = str.__str__


def lr_factor(
    update: int, total_updates: int, schedule: LRSchedule | str, warmup: int = 0
) -> float:
    """The factor of ``rl.lr`` at ``update`` (counted from 0) of ``total_updates``.

    Warm-up: (u + 1) / (warmup + 1) for u < warmup, rising to 1 (the first update already
    moves, the first after the warm-up has the full rate). After it, with
    p = (u - warmup) / (total_updates - warmup), the fraction of the decay already made:
    constant 1, cosine (1 + cos(pi p)) / 2, linear 1 - p. The last update has p < 1, so every
    update moves the weights.

    Example: 4 updates, warm-up 1 -> cosine (0.5, 1, 0.75, 0.25), linear (0.5, 1, 2/3, 1/3);
    5 updates, warm-up 2, constant -> (1/3, 2/3, 1, 1, 1).
    """
    if schedule not in list(LRSchedule):
        raise ValueError(f"schedule must be one of {[s.value for s in LRSchedule]}: {schedule!r}")
    if update < 0 or warmup < 0:
        raise ValueError(f"update ({update}) and warmup ({warmup}) must be >= 0")
    if update < warmup:
        return (update + 1) / (warmup + 1)
    if schedule == LRSchedule.constant:
        return 1.0
    progress = (update - warmup) / max(total_updates - warmup, 1)
    progress = min(progress, 1.0)
    if schedule == LRSchedule.cosine:
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    return 1.0 - progress
