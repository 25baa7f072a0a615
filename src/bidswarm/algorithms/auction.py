"""The sealed-bid auction that picks who acts at a decision step (Eq. 1 of MPT)."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

PAPER_BID_LEVELS: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8)
"""The quantized bids of docs/method.md section 2: every coordination rule's and every PettingZoo
view's default ``bid_levels``."""


@dataclass(frozen=True)
class AuctionOutcome:
    """Who won one auction, and who would have acted in their place.

    winner: index of the acting agent, or None when every bid was 0 (the step is skipped).
    winning_bid: the winner's bid (0.0 when skipped).
    runner_up: index of the highest bidder among the others with a non-zero bid, or None.
    runner_up_bid: that agent's bid (0.0 when there is none).
    """

    winner: int | None
    winning_bid: float
    runner_up: int | None
    runner_up_bid: float

    @property
    def contested(self) -> bool:
        """True when the runner-up bid is non-zero: the step can be forked (section 4)."""
        return self.runner_up_bid > 0.0

    @property
    def skipped(self) -> bool:
        """True when nobody acts because every bid was 0."""
        return self.winner is None


def _validate_bids(bids: Sequence[float]) -> None:
    if len(bids) == 0:
        raise ValueError("run_auction needs at least one bid (one per agent), got none")
    for index, bid in enumerate(bids):
        if math.isnan(bid) or bid < 0.0:
            raise ValueError(f"bid of agent {index} must be a number >= 0, got {bid!r}")


def _pick(candidates: list[int], rng: random.Random) -> int:
    # Draw only when there is a real tie, so untied auctions leave the RNG stream untouched.
    return candidates[0] if len(candidates) == 1 else rng.choice(candidates)


def run_auction(bids: Sequence[float], rng: random.Random) -> AuctionOutcome:
    """Eq. 1 of MPT: the highest bid acts; ties are broken uniformly at random.

    Args:
        bids: one bid per agent, shape [N], each >= 0 (agent index = position).
        rng: the source of tie-breaking randomness (seeded by the caller for reproducibility).

    Returns:
        The outcome. All bids 0 -> skipped (winner None, not contested). When several agents
        tie for the top, the winner is drawn uniformly among them and the runner-up uniformly
        among the remaining top bidders, so the step is contested with
        ``runner_up_bid == winning_bid``. Otherwise the runner-up is the highest non-zero bid
        among the others (ties drawn uniformly); a zero bid never makes a runner-up.
    """
    _validate_bids(bids)
    top_bid = max(bids)
    if top_bid <= 0.0:
        return AuctionOutcome(winner=None, winning_bid=0.0, runner_up=None, runner_up_bid=0.0)
    top_bidders = [index for index, bid in enumerate(bids) if bid == top_bid]
    winner = _pick(top_bidders, rng)
    others = [index for index in range(len(bids)) if index != winner and bids[index] > 0.0]
    if not others:
        return AuctionOutcome(
            winner=winner, winning_bid=float(top_bid), runner_up=None, runner_up_bid=0.0
        )
    second_bid = max(bids[index] for index in others)
    runner_up = _pick([index for index in others if bids[index] == second_bid], rng)
    return AuctionOutcome(
        winner=winner,
        winning_bid=float(top_bid),
        runner_up=runner_up,
        runner_up_bid=float(second_bid),
    )
