"""The interface of a coordination rule: who acts in each live environment this step."""

from __future__ import annotations

import abc
import random

import torch

from bidswarm.envs.base import TextEnv
from bidswarm.rollout.records import Decision
from bidswarm.rollout.swarm import Swarm


class CoordinationRule(abc.ABC):
    """Picks the actor of every live environment, batched over environments."""

    asks_bids: bool = False
    """Whether the rule's decisions carry bids (and so contested steps to fork)."""

    @abc.abstractmethod
    def decide(
        self, swarm: Swarm, envs: list[TextEnv], rng: random.Random, generator: torch.Generator
    ) -> list[Decision]:
        """One decision per env in ``envs``."""

    def record_outcomes(
        self, envs: list[TextEnv], decisions: list[Decision], rewards: list[float]
    ) -> None:
        """Called once the envs have stepped with ``decisions``; rules with memory override it."""
        return None  # most rules keep no state between steps
