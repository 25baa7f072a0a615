"""Second-price credit [ours] (``credit=second_price``): the credit-conserving Vickrey payment of
Chang et al. 2020, "Decentralized Reinforcement Learning: Global Decision-Making via Local
Economic Transactions", adapted to the chain of acting steps, as the action learner's credit.

Each acting step's winner pays the price of its auction, the runner-up's bid in reward units
p_t = s * b'_t (b'_t the runner-up's bid level, s = ``credit.price_scale``), and is paid the
price of the next acting step's auction by the next winner, who buys the state it leaves:

    c_t = r_t + p_{t+1} - p_t,   p_{T+1} = 0.

The sum telescopes: sum_t c_t + p_1 = sum_t r_t. The first winner's price p_1 has nobody to go
to and is discarded, as bucket brigade (Eq. 2 of MPT) discards b_1 v_1.

Here the bids are NOT trained on this utility (Chang et al. train each bidder on its own
utility, so that bidding one's value is optimal): the bids are trained toward value targets
(``algorithms/calibration.py``), and this rule only turns them into the action learner's
credit. When the bids estimate values, p_t ~ V(s_t), the runner-up's value of acting here, and
c_t is a TD-style advantage r_t + V(s_{t+1}) - V(s_t) of the winner's action over the best
alternative. Unlike Chang et al. there is no discount (their gamma^(time between auctions));
a step with no runner-up (or under a rule without bids) has price 0.

Chang et al. also clone every bidder, so that a bidder always meets one rival who values the
state as it does. Without clones a thin market prices a state at 0 whenever one agent alone
bids for it, and the step that creates such a state pays its own price and is paid nothing: in
the main job the Logger's last chop, after which only the Smith bids, earns 12.7 - 175 x 0.6
(the Smith's runner-up bid before it) = -92.3, while a reply that changes nothing costs about
0 (about the same prices before and after), and with the experts' bid levels RL turns the
Logger's replies into invalid ones (docs/results.md, "The market"). ``credit.clones=true``
[ours] is Chang et al.'s cloning: each winner's clone bids what it bids, so the second-highest
bid is the winner's own and p_t = s * b_t, the winning bid in reward units; a TD advantage when
the winning bids estimate values, and a large charge on the last step when they do not.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from bidswarm.algorithms.credit.base import CreditConfig, CreditRule, Reads, register
from bidswarm.checks import Parameter, positive

CRAFTING_PRICE_SCALE = 175.0
"""140 / 0.8: the crafting task's whole return (its milestones sum to 140) priced at the top
bid level 0.8, so that every value to go of a crafting episode (0 to 140) is a bid within the
levels {0, ..., 0.8} without clipping; one level step (0.2) is 35 reward units."""


def second_price_credit(
    rewards: Sequence[float], runner_up_bids: Sequence[float], price_scale: float
) -> tuple[list[float], float]:
    """Second-price credit over the acting steps of one episode (module docstring).

    p_t = price_scale * runner_up_bids[t];  c_t = r_t + p_{t+1} - p_t with p_{T+1} = 0; the
    discarded part is p_1, so ``sum(credits) + discarded == sum(rewards)``.

    Args:
        rewards: r_t per acting step, shape [T].
        runner_up_bids: the runner-up's bid level at each acting step, shape [T], each in
            [0, 1] (0: no runner-up).
        price_scale: reward units per bid unit, > 0 (``credit.price_scale``).

    Returns:
        (credits c_t, shape [T]; discarded p_1). An empty episode gives ([], 0.0).

    Example: rewards (0, 0, 10), runner-up bids (0.4, 0.6, 0.2), scale 10 -> prices (4, 6, 2),
    credits (0 + 6 - 4, 0 + 2 - 6, 10 + 0 - 2) = (2, -4, 8), discarded 4 (2 - 4 + 8 + 4 = 10).
    """
    if len(rewards) != len(runner_up_bids):
        raise ValueError(
            f"rewards and runner_up_bids must have one entry per acting step, got "
            f"{len(rewards)} rewards and {len(runner_up_bids)} runner-up bids"
        )
    if not (math.isfinite(price_scale) and price_scale > 0.0):
        raise ValueError(f"credit.price_scale={price_scale!r}: must be a finite number > 0")
    for step, bid in enumerate(runner_up_bids):
        if math.isnan(bid) or not 0.0 <= bid <= 1.0:
            raise ValueError(f"runner-up bid at acting step {step} must lie in [0, 1], got {bid!r}")
    if not rewards:
        return [], 0.0
    prices = [price_scale * float(bid) for bid in runner_up_bids]
    next_prices = [*prices[1:], 0.0]  # p_{t+1}: what the next winner pays for the state
    credits = [
        float(reward) + paid - price
        for reward, paid, price in zip(rewards, next_prices, prices, strict=True)
    ]
    return credits, prices[0]


@dataclass
class SecondPriceConfig(CreditConfig):
    """``credit=second_price``: each winner keeps its reward plus the next auction's price
    minus its own (:func:`second_price_credit`)."""

    price_scale: float = CRAFTING_PRICE_SCALE
    """[ours] Reward units per bid unit (:data:`CRAFTING_PRICE_SCALE`); another task sets its
    own, e.g. its largest return over the top level 0.8."""
    clones: bool = False
    """[ours] Chang et al.'s cloned bidders: the price is the winning bid, not the runner-up's
    (module docstring)."""


@register("second_price")
class SecondPrice(CreditRule):
    """Reward plus the next auction's price minus this auction's, prices the runner-ups' bids in
    reward units (:func:`second_price_credit`); with ``clones`` the winners' bids."""

    Config = SecondPriceConfig
    conserves_return = True

    def __init__(self, price_scale: float = CRAFTING_PRICE_SCALE, clones: bool = False) -> None:
        self.price_scale = price_scale
        self.clones = clones

    @classmethod
    def parameters(cls) -> list[Parameter]:
        return [Parameter("price_scale", positive())]

    @classmethod
    def from_config(cls, config: SecondPriceConfig) -> SecondPrice:
        return cls(config.price_scale, config.clones)

    def __call__(
        self,
        rewards: Sequence[float],
        bids: Sequence[float],
        runner_up_bids: Sequence[float],
        rng: random.Random,
        levels: Sequence[float],
        reads: Reads = (),
    ) -> tuple[list[float], float]:
        # a winner's clone bids what it bids: the second-highest bid is then the winner's own
        priced = bids if self.clones else runner_up_bids
        return second_price_credit(rewards, priced, self.price_scale)
