"""Credit rules: how an episode's rewards are split among its acting steps (``credit/base.py``).

``CREDIT_RULES`` maps the ``credit.name`` of a YAML in ``conf/credit/`` to its rule class; each
rule registers itself (``@register("<name>")``) beside its equation (Eq. 2 of MPT in
``bucket_brigade.py``). Importing this package imports every module in it, so a new rule is one
new module here and its YAML, nothing else. :func:`make_credit` builds the configured rule.
"""

from __future__ import annotations

import importlib
import pkgutil

from bidswarm.algorithms.credit.base import (
    CREDIT_RULES,
    CreditConfig,
    CreditRule,
    ReadEdge,
    Reads,
    make_credit,
    register,
)
from bidswarm.algorithms.credit.bucket_brigade import bucket_brigade_credit, random_bid_credit
from bidswarm.algorithms.credit.returns import episode_return_credit, reward_to_go_credit
from bidswarm.algorithms.credit.second_price import second_price_credit

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "CREDIT_RULES",
    "CreditConfig",
    "CreditRule",
    "ReadEdge",
    "Reads",
    "bucket_brigade_credit",
    "episode_return_credit",
    "make_credit",
    "random_bid_credit",
    "register",
    "reward_to_go_credit",
    "second_price_credit",
]
