"""The pure math of MPT: the auction (Eq. 1), credit rules (Eq. 2) and losses (Eqs. 2-3)."""

from __future__ import annotations

from bidswarm.algorithms.auction import AuctionOutcome, run_auction
from bidswarm.algorithms.credit import (
    CREDIT_RULES,
    CreditRule,
    bucket_brigade_credit,
    episode_return_credit,
    random_bid_credit,
    reward_to_go_credit,
)
from bidswarm.algorithms.losses import (
    Normalization,
    bradley_terry_loss,
    fork_preference,
    reinforce_loss,
)

__all__ = [
    "CREDIT_RULES",
    "AuctionOutcome",
    "CreditRule",
    "Normalization",
    "bradley_terry_loss",
    "bucket_brigade_credit",
    "episode_return_credit",
    "fork_preference",
    "random_bid_credit",
    "reinforce_loss",
    "reward_to_go_credit",
    "run_auction",
]
