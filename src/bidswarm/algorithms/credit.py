"""Credit rules: how an episode's rewards are split among its acting steps.

Every rule takes the ACTING steps of one episode in order (skipped steps already dropped by
the caller) and returns ``(credits, discarded)``: one credit per acting step and the part of
the return that no step keeps. ``CREDIT_RULES`` maps the ``credit`` config names to one
uniform signature so that the training loop does not branch on the rule; ``make_credit_rule``
builds a rule with its parameters (only ``memory_tree`` has any).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from bidswarm.algorithms.memory_tree import MemoryTreeCredit, ReadEdge, memory_tree_credit

Reads = Sequence[Sequence[ReadEdge]]
"""Per acting step, the shared memory's notes its actor read (empty without a memory)."""


class CreditRule(Protocol):
    """Uniform signature of a credit rule:
    ``(rewards, bids, rng, levels, reads) -> (credits, lost)``."""

    def __call__(
        self,
        rewards: Sequence[float],
        bids: Sequence[float],
        rng: random.Random,
        levels: Sequence[float],
        reads: Reads = (),
    ) -> tuple[list[float], float]: ...


def _validate_bid(step: int, bid: float) -> None:
    if math.isnan(bid) or not 0.0 <= bid <= 1.0:
        raise ValueError(f"bid at acting step {step} must lie in [0, 1], got {bid!r}")


def bucket_brigade_credit(
    rewards: Sequence[float], bids: Sequence[float]
) -> tuple[list[float], float]:
    """Eq. 2 of MPT: bucket-brigade credit over the acting steps of one episode.

    Sweeps backwards with v_t = r_t + b_{t+1} v_{t+1}, v_{T+1} = 0; the actor of step t keeps
    c_t = (1 - b_t) v_t and passes b_t v_t upstream. The first actor's upstream share b_1 v_1
    has nobody to go to and is discarded, so ``sum(credits) + discarded == sum(rewards)``.

    Args:
        rewards: r_t per acting step, shape [T].
        bids: winning bid b_t per acting step, shape [T], each in [0, 1].

    Returns:
        (credits c_t, shape [T]; discarded b_1 v_1). An empty episode gives ([], 0.0).

    Example: bids (0.8, 0.4, 0.6), rewards (0, 0, 10) -> v (2.4, 6, 10),
    credits (0.48, 3.6, 4.0), discarded 1.92.
    """
    if len(rewards) != len(bids):
        raise ValueError(
            f"rewards and bids must have one entry per acting step, got {len(rewards)} "
            f"rewards and {len(bids)} bids"
        )
    for step, bid in enumerate(bids):
        _validate_bid(step, bid)
    credits = [0.0] * len(rewards)
    downstream_share = 0.0  # b_{t+1} v_{t+1}: what the next actor passes back to step t
    for step in reversed(range(len(rewards))):
        value = float(rewards[step]) + downstream_share
        credits[step] = (1.0 - bids[step]) * value
        downstream_share = bids[step] * value
    return credits, downstream_share


def random_bid_credit(
    rewards: Sequence[float], rng: random.Random, levels: Sequence[float]
) -> tuple[list[float], float]:
    """The random-credit ablation of MPT (section 7): Eq. 2 with the bids made random.

    The recursion of ``bucket_brigade_credit`` with every winning bid replaced by a value drawn
    uniformly from ``levels`` (the auction and bid learning are unchanged elsewhere).

    Args:
        rewards: r_t per acting step, shape [T].
        rng: source of the random bids.
        levels: the bid levels to draw from, e.g. (0, 0.2, 0.4, 0.6, 0.8).

    Returns:
        (credits, shape [T]; discarded), conserving the return like Eq. 2.
    """
    if len(levels) == 0:
        raise ValueError("random_bid_credit needs at least one bid level to draw from")
    random_bids = [rng.choice(levels) for _ in rewards]
    return bucket_brigade_credit(rewards, random_bids)


def episode_return_credit(rewards: Sequence[float]) -> tuple[list[float], float]:
    """Monolithic REINFORCE credit (section 7): every acting step gets the episode return.

    Args:
        rewards: r_t per acting step, shape [T].

    Returns:
        ([sum(rewards)] * T, 0.0).
    """
    episode_return = float(sum(rewards))
    return [episode_return] * len(rewards), 0.0


def reward_to_go_credit(rewards: Sequence[float]) -> tuple[list[float], float]:
    """Plain REINFORCE with causality [ours]: each acting step gets the reward from it on.

    The non-myopic credit of the round-robin training ablation: with no bids, Eq. 2 would pass
    nothing upstream and leave each actor only its own step's reward.

    Args:
        rewards: r_t per acting step, shape [T].

    Returns:
        ([sum(rewards[t:]) for each t], 0.0).
    """
    credits, to_go = [0.0] * len(rewards), 0.0
    for step in reversed(range(len(rewards))):
        to_go += float(rewards[step])
        credits[step] = to_go
    return credits, 0.0


TREE_BASES = ("bucket_brigade", "episode_return", "reward_to_go")
"""Rules whose credits can root the memory's trees (deterministic, so diagnostics can replay
them)."""


@dataclass(frozen=True)
class MemoryTreeRule:
    """``credit=memory_tree`` (seed 002, ``algorithms/memory_tree.py``): the ``base`` rule's
    credits are the roots of contribution trees over the shared memory's reads; a share
    ``memory_share`` of a step's credit goes down its read edges to the notes' writers
    (weights softmax(score / ``temperature``)), recursively to ``max_depth``."""

    base: str = "bucket_brigade"
    memory_share: float = 0.5
    temperature: float = 1.0
    max_depth: int = 2

    def __post_init__(self) -> None:
        if self.base not in TREE_BASES:
            raise ValueError(f"credit.base={self.base!r}: choose one of {list(TREE_BASES)}")

    def tree(
        self,
        rewards: Sequence[float],
        bids: Sequence[float],
        rng: random.Random,
        levels: Sequence[float],
        reads: Reads = (),
    ) -> tuple[MemoryTreeCredit, float]:
        """The trees' credits (with what reached writers) and the base rule's discarded part."""
        roots, lost = CREDIT_RULES[self.base](rewards, bids, rng, levels)
        reads = reads or [[] for _ in roots]
        tree = memory_tree_credit(roots, reads, self.memory_share, self.temperature, self.max_depth)
        return tree, lost

    def __call__(
        self,
        rewards: Sequence[float],
        bids: Sequence[float],
        rng: random.Random,
        levels: Sequence[float],
        reads: Reads = (),
    ) -> tuple[list[float], float]:
        tree, lost = self.tree(rewards, bids, rng, levels, reads)
        return tree.credits, lost


CREDIT_RULES: dict[str, CreditRule] = {
    # Each rule takes the uniform arguments and uses the ones its equation needs.
    "bucket_brigade": lambda rewards, bids, rng, levels, reads=(): bucket_brigade_credit(
        rewards, bids
    ),
    "random": lambda rewards, bids, rng, levels, reads=(): random_bid_credit(rewards, rng, levels),
    "episode_return": lambda rewards, bids, rng, levels, reads=(): episode_return_credit(rewards),
    "reward_to_go": lambda rewards, bids, rng, levels, reads=(): reward_to_go_credit(rewards),
    "memory_tree": MemoryTreeRule(),
}
"""Every ``credit.name``; ``memory_tree`` here with its default parameters."""


def make_credit_rule(name: str, **parameters: float | int | str) -> CreditRule:
    """The rule ``credit.name`` names, with the ``credit`` config's other fields as its
    parameters (only ``memory_tree`` takes any)."""
    if name not in CREDIT_RULES:
        raise ValueError(f"credit.name={name!r}: choose one of {sorted(CREDIT_RULES)}")
    if name == "memory_tree":
        return MemoryTreeRule(**parameters)
    if parameters:
        raise ValueError(f"credit={name} takes no parameters, got {sorted(parameters)}")
    return CREDIT_RULES[name]
