"""Coordination rules: who acts each step, as pure decisions (see ``coordination/base.py``).

``RULES`` maps the ``coordination.name`` of a YAML in ``conf/coordination/`` to its rule class.
Each rule registers itself (``@register("<name>")``); importing this package imports every
module in it, so a new rule is one new module here and its YAML, nothing else.
"""

from __future__ import annotations

import importlib
import pkgutil

from bidswarm.coordination.base import (
    RULES,
    CoordinationConfig,
    CoordinationRule,
    Decision,
    Situation,
    register,
)

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")


def make_coordination(config: CoordinationConfig) -> CoordinationRule:
    """The rule that ``config.name`` names (checked by ``config.validate``), configured by it."""
    return RULES[config.name].from_config(config)


__all__ = [
    "RULES",
    "CoordinationConfig",
    "CoordinationRule",
    "Decision",
    "Situation",
    "make_coordination",
    "register",
]
