"""Eq. 2 of MPT, bucket-brigade credit, and its random-credit ablation (MPT section 7): the
equations and their rules (``credit=bucket_brigade``, ``credit=random``)."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from bidswarm.algorithms.credit.base import CreditRule, Reads, register


def _validate_bid(step: int, bid: float) -> None:
    if math.isnan(bid) or not 0.0 <= bid <= 1.0:
        raise ValueError(f"bid at acting step {step} must lie in [0, 1], got {bid!r}")


def bucket_brigade_credit(
    rewards: Sequence[float], bids: Sequence[float]
) -> tuple[list[float], float]:
    """Eq. 2 of MPT: bucket-brigade credit over the acting steps of one episode.

    Sweeps backwards with v_t = r_t + b_{t+1} v_{t+1}, v_{T+1} = 0; the actor of step t keeps
    c_t = (1 - b_t) v_t and passes b_t v_t upstream. The first actor's upstream share b_1 v_1
    has nobody to go to and is discarded, so ``sum(credits) + discarded == sum(rewards)``.

    Args:
        rewards: r_t per acting step, shape [T].
        bids: winning bid b_t per acting step, shape [T], each in [0, 1].

    Returns:
        (credits c_t, shape [T]; discarded b_1 v_1). An empty episode gives ([], 0.0).

    Example: bids (0.8, 0.4, 0.6), rewards (0, 0, 10) -> v (2.4, 6, 10),
    credits (0.48, 3.6, 4.0), discarded 1.92.
    """
    if len(rewards) != len(bids):
        raise ValueError(
            f"rewards and bids must have one entry per acting step, got {len(rewards)} "
            f"rewards and {len(bids)} bids"
        )
    for step, bid in enumerate(bids):
        _validate_bid(step, bid)
    credits = [0.0] * len(rewards)
    downstream_share = 0.0  # b_{t+1} v_{t+1}: what the next actor passes back to step t
    for step in reversed(range(len(rewards))):
        value = float(rewards[step]) + downstream_share
        credits[step] = (1.0 - bids[step]) * value
        downstream_share = bids[step] * value
    return credits, downstream_share


def random_bid_credit(
    rewards: Sequence[float], rng: random.Random, levels: Sequence[float]
) -> tuple[list[float], float]:
    """The random-credit ablation of MPT (section 7): Eq. 2 with the bids made random.

    The recursion of ``bucket_brigade_credit`` with every winning bid replaced by a value drawn
    uniformly from ``levels`` (the auction and bid learning are unchanged elsewhere).

    Args:
        rewards: r_t per acting step, shape [T].
        rng: source of the random bids.
        levels: the bid levels to draw from, e.g. (0, 0.2, 0.4, 0.6, 0.8).

    Returns:
        (credits, shape [T]; discarded), conserving the return like Eq. 2.
    """
    if len(levels) == 0:
        raise ValueError("random_bid_credit needs at least one bid level to draw from")
    random_bids = [rng.choice(levels) for _ in rewards]
    return bucket_brigade_credit(rewards, random_bids)


@register("bucket_brigade")
class BucketBrigade(CreditRule):
    """Eq. 2 of MPT over the winning bids (:func:`bucket_brigade_credit`)."""

    conserves_return = True

    def __call__(
        self,
        rewards: Sequence[float],
        bids: Sequence[float],
        runner_up_bids: Sequence[float],
        rng: random.Random,
        levels: Sequence[float],
        reads: Reads = (),
    ) -> tuple[list[float], float]:
        return bucket_brigade_credit(rewards, bids)


@register("random")
class RandomBids(CreditRule):
    """Eq. 2 with the bids drawn from the levels (:func:`random_bid_credit`)."""

    conserves_return = True
    draws_randomness = True

    def __call__(
        self,
        rewards: Sequence[float],
        bids: Sequence[float],
        runner_up_bids: Sequence[float],
        rng: random.Random,
        levels: Sequence[float],
        reads: Reads = (),
    ) -> tuple[list[float], float]:
        return random_bid_credit(rewards, rng, levels)
