"""Discounted reward-to-go credit [ours] (``credit=discounted_return``): each acting step gets
the rewards from it on, discounted by a fixed ``gamma`` per acting step. Unlike Eq. 2 of MPT,
where the discount from one step to the next is the next winner's bid, the discount does not
hinge on the bids: a chain of confident (0.8) winners passes 0.8 per step upstream in Eq. 2,
here it passes ``gamma``."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from bidswarm.algorithms.credit.base import CreditConfig, CreditRule, Reads, register
from bidswarm.checks import Parameter, unit_interval


def discounted_return_credit(rewards: Sequence[float], gamma: float) -> tuple[list[float], float]:
    """Discounted reward to go over the acting steps: c_t = sum_{k >= t} gamma^(k - t) r_k,
    i.e. c_t = r_t + gamma * c_{t+1} with c_{T+1} = 0 (skipped steps are not in the chain).

    gamma = 1 is ``reward_to_go``; gamma = 0 leaves each step its own reward. Nothing is split,
    so nothing is discarded (the credits do not sum to the return, as with ``reward_to_go``).

    Args:
        rewards: r_t per acting step, shape [T].
        gamma: the discount per acting step, in [0, 1] (``credit.gamma``).

    Returns:
        (credits, shape [T]; 0.0). Example: rewards (0, 0, 10), gamma 0.5 -> (2.5, 5, 10).
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"credit.gamma={gamma!r}: must lie in [0, 1]")
    credits, to_go = [0.0] * len(rewards), 0.0
    for step in reversed(range(len(rewards))):
        to_go = float(rewards[step]) + gamma * to_go
        credits[step] = to_go
    return credits, 0.0


@dataclass
class DiscountedReturnConfig(CreditConfig):
    """``credit=discounted_return``: reward to go with a fixed discount per acting step."""

    gamma: float = 0.95
    """[ours] The discount per acting step (1: ``credit=reward_to_go``)."""


@register("discounted_return")
class DiscountedReturn(CreditRule):
    """Each acting step gets the rewards from it on, discounted by ``gamma`` per acting step
    (:func:`discounted_return_credit`)."""

    Config = DiscountedReturnConfig

    def __init__(self, gamma: float = 0.95) -> None:
        self.gamma = gamma

    @classmethod
    def parameters(cls) -> list[Parameter]:
        return [Parameter("gamma", unit_interval())]

    @classmethod
    def from_config(cls, config: DiscountedReturnConfig) -> DiscountedReturn:
        return cls(config.gamma)

    def __call__(
        self,
        rewards: Sequence[float],
        bids: Sequence[float],
        runner_up_bids: Sequence[float],
        rng: random.Random,
        levels: Sequence[float],
        reads: Reads = (),
    ) -> tuple[list[float], float]:
        return discounted_return_credit(rewards, self.gamma)
