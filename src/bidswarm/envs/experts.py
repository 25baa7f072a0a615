"""Joint play of the scripted experts under their hand-written bidding rule.

The text of a bid lives here too (``format_bid`` writes it, ``parse_bid`` reads it): the experts,
the agents (``agents/prompts.py``) and the PettingZoo wrapper (``envs/pettingzoo.py``) share it.

Used for SFT demonstrations (docs/method.md section 5: each agent learns only its own role's
demonstrations) and to show that a task is solvable (the ceiling a trained swarm can reach).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from bidswarm.envs.base import TextEnv


@dataclass(frozen=True)
class Demonstration:
    """One supervised example: what ``role`` saw and what its expert replied.

    kind: ``bid`` (reply is the bid level as text) or ``action`` (reply is the action text);
        the decisions a coordination rule learns add ``score`` (reply: the usefulness level of
        ``proposal``, another role's reply), ``own_score`` (the same of the role's own reply)
        and ``route`` (reply: the role that should act).
    role: None for the monolithic agent's copy of an action demonstration.
    proposal: the reply a ``score`` demonstration rates (empty for the other kinds).
    """

    kind: str
    role: str | None
    observation: str
    reply: str
    proposal: str = ""


@dataclass
class ExpertEpisode:
    seed: int
    total_reward: float = 0.0
    decisions: int = 0
    skipped: int = 0
    actors: list[str | None] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    demonstrations: list[Demonstration] = field(default_factory=list)


def snap_to_level(value: float, levels: list[float]) -> float:
    """The bid level nearest to ``value`` (ties go to the lower level)."""
    return min(levels, key=lambda level: (abs(level - value), level))


def format_bid(level: float) -> str:
    """The canonical text of a bid reply, e.g. ``0.6``."""
    return f"{level:.1f}"


_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)")


def parse_bid(text: str, levels: list[float]) -> tuple[float, bool]:
    """The first number of a bid reply snapped to the nearest level, and whether it parsed.

    A reply without a number, or whose first number is outside [0, 1], is malformed: it counts
    as bid 0.0 (docs/method.md section 2) and the caller counts the failure.
    """
    match = _NUMBER.search(text)
    if match is None:
        return 0.0, False
    value = float(match.group())
    if not 0.0 <= value <= 1.0:
        return 0.0, False
    return snap_to_level(value, levels), True


def expert_levels(env: TextEnv, bid_levels: list[float]) -> dict[str, float]:
    """Every role's expert bid now (:meth:`TextEnv.expert_bid`), snapped to ``bid_levels``."""
    return {role: snap_to_level(env.expert_bid(role), bid_levels) for role in env.roles}


def expert_owners(levels: dict[str, float]) -> frozenset[str]:
    """The roles the experts' auction would let act: those with the top non-zero bid (empty:
    the experts skip the step). A task's experts never tie at the top (the task contract
    check), so this is one role or none."""
    top = max(levels.values(), default=0.0)
    if top <= 0.0:
        return frozenset()
    return frozenset(role for role, level in levels.items() if level == top)


def play_expert_episode(
    env: TextEnv,
    seed: int,
    bid_levels: list[float],
    on_state: Callable[[TextEnv, dict[str, float]], None] | None = None,
    same_reply: bool = False,
) -> ExpertEpisode:
    """Run the experts on world ``seed``: highest expert bid acts, ties uniform, all-zero skips.
    ``on_state(env, levels)`` sees each state before its step, with every role's expert bid
    (what the demonstrations of a rule's own decisions are read from). Each step's action
    demonstration teaches the actor; with ``same_reply`` also every other role whose expert
    replies the same action there (``sft.action_roles=same_reply``)."""
    rng = random.Random(seed)
    env.reset(seed)
    episode = ExpertEpisode(seed=seed)
    while not env.done:
        observations = {role: env.observation(role) for role in env.roles}
        bids = expert_levels(env, bid_levels)
        if on_state is not None:
            on_state(env, bids)
        for role in env.roles:
            episode.demonstrations.append(
                Demonstration("bid", role, observations[role], format_bid(bids[role]))
            )
        top = max(bids.values())
        if top <= 0.0:
            result = env.skip()
            episode.skipped += 1
            episode.actors.append(None)
        else:
            actor = rng.choice([role for role, bid in bids.items() if bid == top])
            action = env.expert_action(actor) or ""
            taught = [
                role
                for role in env.roles
                if role == actor or (same_reply and action and env.expert_action(role) == action)
            ]
            monolithic_observation = env.observation(None)
            result = env.step(actor, action)
            episode.actors.append(actor)
            episode.demonstrations.extend(
                Demonstration("action", role, observations[role], action) for role in taught
            )
            episode.demonstrations.append(
                Demonstration("action", None, monolithic_observation, action)
            )
        episode.total_reward += result.reward
        episode.decisions += 1
    episode.metrics = env.episode_metrics()
    return episode
