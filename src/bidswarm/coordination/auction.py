"""MPT's sealed-bid auction (Eq. 1 of MPT) as a coordination rule."""

from __future__ import annotations

import random

from bidswarm.algorithms.auction import AuctionOutcome, run_auction
from bidswarm.coordination.base import CoordinationRule, Decision, Situation, register


def decision_of(outcome: AuctionOutcome) -> Decision:
    """The decision an auction's ``outcome`` makes: its winner acts at its bid, its runner-up
    and the runner-up's bid recorded (what credit and forks read)."""
    return Decision(
        actor=outcome.winner,
        winning_bid=outcome.winning_bid,
        runner_up=outcome.runner_up,
        runner_up_bid=outcome.runner_up_bid,
    )


@register("auction")
class Auction(CoordinationRule):
    """Every present agent bids in every env; the highest bid acts, ties uniform, all-zero
    skips. An absent agent makes no bid: it counts as 0, which never wins nor runs up."""

    asks_bids = True
    makes_contested_steps = True
    records_winning_bids = True

    def bidders(self, situation: Situation) -> list[int]:
        return situation.present

    def decide(self, situations: list[Situation], rng: random.Random) -> list[Decision]:
        decisions = []
        for situation in situations:
            bids = [
                0.0 if a in situation.absent else situation.bids[a]
                for a in range(situation.n_agents)
            ]
            if not situation.bid_bonus:
                decisions.append(decision_of(run_auction(bids, rng)))
                continue
            # Exploration (``bids.explore``): the order is by bid + bonus, the prices the bids.
            scores = [
                b + situation.bid_bonus.get(a, 0.0) if b > 0 else 0.0 for a, b in enumerate(bids)
            ]
            outcome = run_auction(scores, rng)
            decisions.append(
                Decision(
                    actor=outcome.winner,
                    winning_bid=0.0 if outcome.winner is None else bids[outcome.winner],
                    runner_up=outcome.runner_up,
                    runner_up_bid=0.0 if outcome.runner_up is None else bids[outcome.runner_up],
                )
            )
        return decisions
