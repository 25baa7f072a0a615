"""The pure math of MPT: the auction (Eq. 1), credit rules (Eq. 2), losses (Eqs. 2-3), the
fork's bid redraw (section 4) and the calibrated bid loss [ours]."""

from __future__ import annotations

from bidswarm.algorithms.auction import AuctionOutcome, run_auction
from bidswarm.algorithms.calibration import (
    calibrated_bid_loss,
    calibration_error,
    expected_bid,
    two_hot_targets,
)
from bidswarm.algorithms.credit import (
    CREDIT_RULES,
    CreditConfig,
    CreditRule,
    bucket_brigade_credit,
    episode_return_credit,
    make_credit,
    random_bid_credit,
    reward_to_go_credit,
)
from bidswarm.algorithms.losses import (
    Normalization,
    bradley_terry_loss,
    fork_preference,
    reinforce_loss,
)
from bidswarm.algorithms.resampling import draw_below, rejection_keep_probability

__all__ = [
    "CREDIT_RULES",
    "AuctionOutcome",
    "CreditConfig",
    "CreditRule",
    "Normalization",
    "bradley_terry_loss",
    "bucket_brigade_credit",
    "calibrated_bid_loss",
    "calibration_error",
    "draw_below",
    "episode_return_credit",
    "expected_bid",
    "fork_preference",
    "make_credit",
    "random_bid_credit",
    "reinforce_loss",
    "rejection_keep_probability",
    "reward_to_go_credit",
    "run_auction",
    "two_hot_targets",
]
