"""A credit rule: how one episode's rewards are split among its acting steps.

Every rule takes the ACTING steps of one episode in order (skipped steps already dropped by the
collector) under one signature,
``(rewards, bids, runner_up_bids, rng, levels, reads) -> (credits, discarded)``: one credit per
acting step and the part of the return that no step keeps. Each rule uses the arguments its
equation needs (the equations are plain functions beside their rule). A rule
registers itself under its ``credit.name`` with :func:`register`, reads its parameters from its
own config dataclass (:attr:`CreditRule.Config`, the schema of ``conf/credit/<name>.yaml``) in
:meth:`CreditRule.from_config` and declares their allowed values
(:meth:`CreditRule.parameters`), which ``config.validate`` checks before any model loads.
"""

from __future__ import annotations

import abc
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from omegaconf import MISSING

from bidswarm.checks import Parameter, parameter_problems


@dataclass(frozen=True)
class ReadEdge:
    """A note of the shared memory that an acting step read: who wrote it, how well it matched.

    writer: position, among the episode's acting steps, of the step that wrote the note
            (earlier than the reader).
    score:  the note's retrieval score in the reader's observation.
    """

    writer: int
    score: float


Reads = Sequence[Sequence[ReadEdge]]
"""Per acting step, the shared memory's notes its actor read (empty without a memory)."""


@dataclass
class CreditConfig:
    """How an episode's reward becomes per-step credit (``conf/credit/``, docs/method.md sections 3
    and 7); a rule with parameters extends this schema (see ``MemoryTreeConfig``)."""

    name: str = MISSING


class CreditRule(abc.ABC):
    """Splits one episode's rewards among its acting steps (see the module docstring)."""

    name: ClassVar[str]
    """The ``credit.name`` the rule is registered under (:func:`register`)."""
    Config: ClassVar[type[CreditConfig]] = CreditConfig
    """The schema of the rule's YAML (``conf/credit/<name>.yaml``)."""
    draws_randomness: ClassVar[bool] = False
    """Whether the rule draws from ``rng`` (its credits then cannot be replayed by diagnostics)."""
    conserves_return: bool = False
    """Whether the rule splits the return: ``sum(credits) + discarded == sum(rewards)`` on every
    episode (``tests/test_market_conformance.py`` checks the claim both ways). A rule whose
    claim hangs on its parameters sets it per instance (``memory_tree``: its base rule's)."""
    reads_memory: ClassVar[bool] = False
    """Whether credit flows down the shared memory's reads (contribution trees with a
    ``tree()`` method): the collector then logs the trees' diagnostics per update and each
    evaluation draws one (docs/memory.md)."""

    @classmethod
    def parameters(cls) -> list[Parameter]:
        """Every field of :attr:`Config` (but ``name``) with its allowed values."""
        return []

    @classmethod
    def problems(cls, config: Any) -> list[str]:
        """``credit.<key>=<value>: what is allowed`` for each parameter of ``config`` (the rule's
        :attr:`Config` or its ``DictConfig``) that is not allowed."""
        return parameter_problems("credit", config, cls.parameters())

    @classmethod
    def from_config(cls, config: CreditConfig) -> CreditRule:
        """The rule configured by ``config``; rules with parameters read them here."""
        return cls()

    @abc.abstractmethod
    def __call__(
        self,
        rewards: Sequence[float],
        bids: Sequence[float],
        runner_up_bids: Sequence[float],
        rng: random.Random,
        levels: Sequence[float],
        reads: Reads = (),
    ) -> tuple[list[float], float]:
        """(credit per acting step, shape [T]; the discarded part of the return).

        rewards: r_t per acting step, shape [T]; bids: the winning bid b_t per acting step
        (``Decision.credited_bid``); runner_up_bids: the runner-up's bid at each acting step
        (``Decision.runner_up_bid``: 0 when nobody else bid, or the bids did not decide the
        step); rng: the only source of randomness; levels: the bid levels; reads: per acting
        step, the memory's notes its actor read.
        """


CREDIT_RULES: dict[str, type[CreditRule]] = {}
"""``credit.name`` -> rule class, filled by :func:`register` as each rule's module is imported
(``algorithms/credit/__init__.py`` imports every module of the package)."""


def register(name: str) -> Callable[[type[CreditRule]], type[CreditRule]]:
    """Class decorator: the rule ``credit=<name>`` selects (``conf/credit/<name>.yaml`` holds
    ``name: <name>``)."""

    def add(rule: type[CreditRule]) -> type[CreditRule]:
        if name in CREDIT_RULES and CREDIT_RULES[name] is not rule:
            raise ValueError(f"two credit rules are registered as {name!r}")
        rule.name = name
        CREDIT_RULES[name] = rule
        return rule

    return add


def make_credit(config: CreditConfig) -> CreditRule:
    """The rule that ``config.name`` names, configured by ``config`` (built once per run and
    handed to the collector); raises ValueError on a value :meth:`CreditRule.problems` refuses."""
    if config.name not in CREDIT_RULES:
        raise ValueError(f"credit.name={config.name!r}: choose one of {sorted(CREDIT_RULES)}")
    rule = CREDIT_RULES[config.name]
    if type(config) is not rule.Config:
        raise ValueError(
            f"credit={config.name} is configured by {rule.Config.__name__}, "
            f"got {type(config).__name__}"
        )
    problems = rule.problems(config)
    if problems:
        raise ValueError("; ".join(problems))
    return rule.from_config(config)
