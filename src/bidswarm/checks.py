"""Config checks that every layer shares: the ``key=value: what is allowed`` lines a check
collects (:class:`Problems`) and the declared allowed values of a parameter (:class:`Allowed`).

Coordination rules, credit rules and tasks check their own parameters with these (each
declares ``(key, Allowed)`` pairs or writes a ``problems`` method); ``config.validate`` asks the
chosen ones and reports every problem at once, before any model loads or folder is made.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any, NamedTuple


@dataclass(frozen=True)
class Allowed:
    """The values a parameter may take.

    accepts: whether a value is allowed.
    text:    what is allowed, as the error message says it (``must be >= 1``).
    refuses: one value it refuses: the tests set every declared parameter to it and expect the
             config to be refused naming the key.
    """

    accepts: Callable[[Any], bool]
    text: str
    refuses: Any


def at_least(low: int) -> Allowed:
    return Allowed(lambda value: value >= low, f"must be >= {low}", low - 1)


def positive() -> Allowed:
    return Allowed(
        lambda value: math.isfinite(value) and value > 0, "must be a finite number > 0", 0.0
    )


def non_negative() -> Allowed:
    return Allowed(
        lambda value: math.isfinite(value) and value >= 0, "must be finite and >= 0", -1.0
    )


def unit_interval(low_open: bool = False) -> Allowed:
    if low_open:
        return Allowed(lambda value: 0 < value <= 1, "must lie in (0, 1]", 0.0)
    return Allowed(lambda value: 0 <= value <= 1, "must lie in [0, 1]", 1.5)


MAX_SEED = 2**32 - 1
"""The largest run seed, numpy's (``lightning.seed_everything`` seeds numpy); the smallest is 0."""


def seed_range() -> Allowed:
    return Allowed(
        lambda value: 0 <= value <= MAX_SEED, f"must be an integer in 0 .. {MAX_SEED}", -1
    )


def one_of(choices: Collection[Any]) -> Allowed:
    return Allowed(
        lambda value: value in choices, f"choose one of {sorted(choices)}", "<none of these>"
    )


class Parameter(NamedTuple):
    """A parameter of a rule's config and the values it may take (a key may have several)."""

    key: str
    allowed: Allowed


class Problems(list):
    """Collects ``key=value: what is allowed`` lines."""

    def require(self, ok: bool, key: str, value: Any, allowed: str) -> None:
        if not ok:
            shown = value.value if isinstance(value, Enum) else value  # 'chat', not PromptStyle
            self.append(f"{key}={shown!r}: {allowed}")

    def check(self, key: str, value: Any, allowed: Allowed) -> None:
        self.require(allowed.accepts(value), key, value, allowed.text)

    def one_of(self, key: str, value: Any, choices: Collection[Any]) -> None:
        self.check(key, value, one_of(choices))

    def at_least(self, key: str, value: Any, low: int) -> None:
        self.check(key, value, at_least(low))

    def positive(self, key: str, value: Any) -> None:
        self.check(key, value, positive())

    def non_negative(self, key: str, value: Any) -> None:
        self.check(key, value, non_negative())

    def unit_interval(self, key: str, value: Any, low_open: bool = False) -> None:
        self.check(key, value, unit_interval(low_open))


def parameter_problems(section: str, config: Any, parameters: Iterable[Parameter]) -> list[str]:
    """``<section>.<key>=<value>: what is allowed`` for each declared parameter of ``config`` (a
    dataclass or its ``DictConfig``) whose value is not allowed."""
    problems = Problems()
    for key, allowed in parameters:
        problems.check(f"{section}.{key}", getattr(config, key), allowed)
    return problems
