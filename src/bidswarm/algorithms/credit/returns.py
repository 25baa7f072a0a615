"""Credit without bids: the whole episode return (monolithic REINFORCE, MPT section 7) or the
reward to go (REINFORCE with causality) at every acting step (``credit=episode_return``,
``credit=reward_to_go``)."""

from __future__ import annotations

import random
from collections.abc import Sequence

from bidswarm.algorithms.credit.base import CreditRule, Reads, register


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


@register("episode_return")
class EpisodeReturn(CreditRule):
    """Every acting step gets the episode return (:func:`episode_return_credit`)."""

    def __call__(
        self,
        rewards: Sequence[float],
        bids: Sequence[float],
        runner_up_bids: Sequence[float],
        rng: random.Random,
        levels: Sequence[float],
        reads: Reads = (),
    ) -> tuple[list[float], float]:
        return episode_return_credit(rewards)


@register("reward_to_go")
class RewardToGo(CreditRule):
    """Each acting step gets the reward from it on (:func:`reward_to_go_credit`)."""

    def __call__(
        self,
        rewards: Sequence[float],
        bids: Sequence[float],
        runner_up_bids: Sequence[float],
        rng: random.Random,
        levels: Sequence[float],
        reads: Reads = (),
    ) -> tuple[list[float], float]:
        return reward_to_go_credit(rewards)
