"""Every registered task as a PettingZoo environment whose agents are the task's roles.

:class:`TextAuctionEnv` (AEC) is MPT's decision step: a **bid phase** (each role in turn replies
with a bid string, read by :func:`~bidswarm.envs.experts.parse_bid` as our agents' bids are: an
unparseable bid counts as 0) then, after the sealed-bid auction of Eq. 1 of MPT
(:func:`~bidswarm.algorithms.auction.run_auction`: the highest bid acts, ties drawn from the
env's seeded RNG), an **action phase** in which the winner replies with its action. When every
bid is 0 the step is skipped, as our rollout loop skips it. ``infos[role]["phase"]`` says which
reply a role owes (``"bid"`` or ``"act"``); its observation is exactly the text our own agents
see (``TextEnv.observation``).

:class:`TextParallelEnv` lets the caller supply the coordination rule: every role proposes an
action at once and ``choose_actor(turn, rng)`` picks whose is carried out (None skips).

Rewards: the task's step reward goes to **every** role (one team, one goal, as in our loop; who
earned it is the credit rule's business, and ``infos`` name the actor), so each role's return
is the episode's return. Bid steps pay 0. Both envs keep the fork contract: ``snapshot()`` holds
the task's snapshot and the wrapper's own state (phase, bids so far, agents, rewards, RNG);
``restore()`` returns to it (``docs/environments.md``).
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from gymnasium.spaces import Text
from pettingzoo import AECEnv, ParallelEnv

from bidswarm.algorithms.auction import PAPER_BID_LEVELS, run_auction
from bidswarm.envs.base import MONOLITHIC, StepResult, TextEnv, world_seed
from bidswarm.envs.experts import parse_bid
from bidswarm.envs.interop import (
    action_space,
    build_task,
    check_render_mode,
    check_snapshot,
    episode_end,
    observation_space,
    require_text,
    wrapper_snapshot,
)


class TextObservation(str):
    """An observation: a ``str`` that also carries the dtype of gymnasium's ``Text`` space.

    PettingZoo's ``api_test`` compares ``observation_space(agent).dtype`` with the ``.dtype`` of
    every observation, which a plain ``str`` lacks (pettingzoo 1.27.0); in every other way it is
    the task's observation text.
    """

    __slots__ = ()
    dtype = np.dtype(str)


class _RoleSpaces:
    """One observation and one action space per role, the same object at every call (PettingZoo
    seeds a space through the object it hands out)."""

    def __init__(self, roles: Sequence[str]):
        self._observation_spaces = {role: observation_space() for role in roles}
        self._action_spaces = {role: action_space() for role in roles}

    def observation_space(self, agent: str) -> Text:
        return self._observation_spaces[agent]

    def action_space(self, agent: str) -> Text:
        return self._action_spaces[agent]


def _seeded(seed: Any, rng: random.Random) -> tuple[int | None, random.Random]:
    """``seed`` read by :func:`~bidswarm.envs.base.world_seed` (None stays None), and the
    wrapper's RNG: a fresh one seeded by it, else ``rng``."""
    if seed is None:
        return None, rng
    seed = world_seed(seed)
    return seed, random.Random(seed)


def _world_seed(task: TextEnv, seed: int | None, rng: random.Random) -> int:
    """World ``seed`` when given, else a training world drawn from ``rng``."""
    return seed if seed is not None else rng.randrange(task.config.n_train_seeds)


def _step_info(actor: str | None, result: StepResult) -> dict[str, Any]:
    """What a role learns of a finished decision step besides its reward."""
    return {"actor": actor, "valid": result.valid, "message": result.message}


def _episode_metrics(task: TextEnv, counts: dict[str, int]) -> dict[str, float]:
    """The task's episode metrics and the wrapper's counts of malformed replies, all floats."""
    return {**task.episode_metrics(), **{key: float(n) for key, n in counts.items()}}


class TextAuctionEnv(_RoleSpaces, AECEnv):
    """A task as an AEC game: bid phase, auction (Eq. 1 of MPT), action phase (module docstring).

    ``infos[role]``: ``phase`` (the reply it owes); after each decision step ``actor`` (None when
    skipped), ``valid`` and ``message`` of the step; at the end, ``metrics``: the task's episode
    metrics plus ``bids_malformed`` and ``actions_invalid``.
    """

    metadata: ClassVar[dict[str, Any]] = {"name": "bidswarm_auction_v0", "render_modes": ["ansi"]}

    def __init__(
        self,
        task: TextEnv,
        bid_levels: Sequence[float] = PAPER_BID_LEVELS,
        render_mode: str | None = None,
    ):
        check_render_mode(self, render_mode)
        AECEnv.__init__(self)
        _RoleSpaces.__init__(self, task.roles)
        self.task = task
        self.bid_levels = list(bid_levels)
        self.render_mode = render_mode
        self.possible_agents = list(task.roles)
        self.agents: list[str] = []
        self._rng = random.Random()
        self._reset_bookkeeping()
        self.agents = []  # no episode until reset()

    def _reset_bookkeeping(self) -> None:
        self.agents = list(self.possible_agents)
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {agent: {"phase": "bid"} for agent in self.agents}
        self.agent_selection = self.agents[0]
        self._skip_agent_selection = None
        self._bids: dict[str, float] = {}
        self._phase = "bid"
        self._counts = {"bids_malformed": 0, "actions_invalid": 0}

    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        """Start world ``seed`` (``TextEnv.reset``) with the auction's RNG seeded by it; without
        a seed, a training world drawn from that RNG. ``options`` are not read."""
        seed, self._rng = _seeded(seed, self._rng)
        self.task.reset(_world_seed(self.task, seed, self._rng))
        self._reset_bookkeeping()

    def observe(self, agent: str) -> TextObservation:
        return TextObservation(self.task.observation(agent))

    def step(self, action: str | None) -> None:
        """The selected role's reply (None once it is dead, as PettingZoo asks); before
        ``reset`` or after every role left the ended episode, ``EpisodeNotRunning``."""
        if not self.agents:
            self.task.require_running("step()")
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        reply = require_text(action)
        self._cumulative_rewards[agent] = 0.0
        self._clear_rewards()
        if self._phase == "bid":
            self._bid(agent, reply)
        else:
            self._finish_decision(agent, self.task.step(agent, reply))
        self._accumulate_rewards()

    def _bid(self, agent: str, reply: str) -> None:
        level, parsed = parse_bid(reply, self.bid_levels)
        self._bids[agent] = level
        self._counts["bids_malformed"] += int(not parsed)
        if len(self._bids) < len(self.agents):
            self.agent_selection = self.agents[len(self._bids)]
            return
        outcome = run_auction([self._bids[role] for role in self.agents], self._rng)
        if outcome.winner is None:
            self._finish_decision(None, self.task.skip())
            return
        self._phase = "act"
        self.agent_selection = self.agents[outcome.winner]
        self.infos[self.agent_selection] = {"phase": "act"}

    def _finish_decision(self, actor: str | None, result: StepResult) -> None:
        """Pay every role the step's reward, then open the next bid phase or end the episode."""
        self._counts["actions_invalid"] += int(actor is not None and not result.valid)
        self.rewards = dict.fromkeys(self.agents, float(result.reward))
        terminated, truncated = episode_end(self.task)
        info = {"phase": "bid", **_step_info(actor, result)}
        if terminated or truncated:
            info["metrics"] = _episode_metrics(self.task, self._counts)
        self.infos = {agent: copy.deepcopy(info) for agent in self.agents}
        self.terminations = dict.fromkeys(self.agents, terminated)
        self.truncations = dict.fromkeys(self.agents, truncated)
        self._bids, self._phase = {}, "bid"
        self.agent_selection = self.agents[0]

    def render(self) -> str | None:
        """The whole world's text (the monolithic view) under ``render_mode="ansi"``."""
        return self.task.observation(MONOLITHIC) if self.render_mode == "ansi" else None

    def close(self) -> None:
        """Nothing to release: a task holds no process or file."""

    # -- fork contract -------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """Plain data: the task's snapshot and everything of the AEC game that decides what
        comes next (phase, bids so far, whose turn, live agents, rewards, infos, the RNG)."""
        return copy.deepcopy(
            wrapper_snapshot(
                "aec",
                {
                    "task": self.task.snapshot(),
                    "rng": self._rng.getstate(),
                    "phase": self._phase,
                    "bids": self._bids,
                    "counts": self._counts,
                    "agents": self.agents,
                    "agent_selection": self.agent_selection,
                    "skip_agent_selection": self._skip_agent_selection,
                    "rewards": self.rewards,
                    "cumulative_rewards": self._cumulative_rewards,
                    "terminations": self.terminations,
                    "truncations": self.truncations,
                    "infos": self.infos,
                },
            ),
        )

    def restore(self, state: dict[str, Any]) -> None:
        """Return to ``state`` (from :meth:`snapshot`); ``state`` stays reusable. A snapshot of
        another task or wrapper is refused before anything changes."""
        check_snapshot("aec", self.task, state)
        state = copy.deepcopy(state)
        self.task.restore(state["task"])
        self._rng.setstate(state["rng"])
        self._phase, self._bids, self._counts = state["phase"], state["bids"], state["counts"]
        self.agents, self.agent_selection = state["agents"], state["agent_selection"]
        self._skip_agent_selection = state["skip_agent_selection"]
        self.rewards, self._cumulative_rewards = state["rewards"], state["cumulative_rewards"]
        self.terminations, self.truncations = state["terminations"], state["truncations"]
        self.infos = state["infos"]


@dataclass(frozen=True)
class Turn:
    """What a caller's coordination rule sees at one decision step of :class:`TextParallelEnv`.

    decision:       decision steps already taken (skipped ones included).
    previous_actor: who acted at the previous step (None at the first or after a skip).
    observation:    the whole world's text (the monolithic view).
    proposals:      each role's proposed action this step, in the task's role order.
    """

    decision: int
    previous_actor: str | None
    observation: str
    proposals: Mapping[str, str]


ChooseActor = Callable[[Turn, random.Random], str | None]
"""A coordination rule: the role whose proposal is carried out, or None to skip the step; the
``random.Random`` is the env's seeded RNG (its only source of randomness)."""


def round_robin(turn: Turn, rng: random.Random) -> str:
    """The roles act in turn, in the task's order, by decision index (a rule needing no model)."""
    roles = list(turn.proposals)
    return roles[turn.decision % len(roles)]


class TextParallelEnv(_RoleSpaces, ParallelEnv):
    """A task as a parallel game: every role proposes, the caller's ``choose_actor`` picks whose
    proposal is carried out (module docstring). ``infos`` as in :class:`TextAuctionEnv` (no
    ``phase``: every step asks every role for an action)."""

    metadata: ClassVar[dict[str, Any]] = {"name": "bidswarm_parallel_v0", "render_modes": ["ansi"]}

    def __init__(self, task: TextEnv, choose_actor: ChooseActor, render_mode: str | None = None):
        check_render_mode(self, render_mode)
        _RoleSpaces.__init__(self, task.roles)
        self.task = task
        self.choose_actor = choose_actor
        self.render_mode = render_mode
        self.possible_agents = list(task.roles)
        self.agents: list[str] = []
        self._rng = random.Random()
        self._previous_actor: str | None = None
        self._counts = {"actions_invalid": 0}

    def reset(
        self, seed: int | None = None, options: dict | None = None
    ) -> tuple[dict[str, str], dict[str, dict]]:
        """As :meth:`TextAuctionEnv.reset`; returns each role's observation and an empty info."""
        seed, self._rng = _seeded(seed, self._rng)
        self.task.reset(_world_seed(self.task, seed, self._rng))
        self.agents = list(self.possible_agents)
        self._previous_actor = None
        self._counts = {"actions_invalid": 0}
        return self._observations(self.agents), {agent: {} for agent in self.agents}

    def _observations(self, agents: list[str]) -> dict[str, TextObservation]:
        return {agent: TextObservation(self.task.observation(agent)) for agent in agents}

    def step(self, actions: dict[str, str]) -> tuple[dict, dict, dict, dict, dict]:
        """Carry out the chosen role's action (or skip); every live role must propose one.
        Before ``reset`` or after the end, ``EpisodeNotRunning``."""
        if not self.agents:
            self.task.require_running("step()")
        if set(actions) != set(self.agents):
            raise ValueError(f"need one action per live role {self.agents}, got {sorted(actions)}")
        turn = Turn(
            decision=self.task.decisions_made,
            previous_actor=self._previous_actor,
            observation=self.task.observation(MONOLITHIC),
            proposals={agent: require_text(actions[agent]) for agent in self.agents},
        )
        actor = self.choose_actor(turn, self._rng)
        if actor is None:
            result = self.task.skip()
        elif actor in turn.proposals:
            result = self.task.step(actor, turn.proposals[actor])
            self._counts["actions_invalid"] += int(not result.valid)
        else:
            raise ValueError(f"choose_actor returned {actor!r}, not one of {self.agents} or None")
        self._previous_actor = actor
        agents = self.agents
        terminated, truncated = episode_end(self.task)
        info = _step_info(actor, result)
        if terminated or truncated:
            info["metrics"] = _episode_metrics(self.task, self._counts)
            self.agents = []
        return (
            self._observations(agents),
            dict.fromkeys(agents, float(result.reward)),
            dict.fromkeys(agents, terminated),
            dict.fromkeys(agents, truncated),
            {agent: copy.deepcopy(info) for agent in agents},
        )

    def render(self) -> str | None:
        """The whole world's text (the monolithic view) under ``render_mode="ansi"``."""
        return self.task.observation(MONOLITHIC) if self.render_mode == "ansi" else None

    def close(self) -> None:
        """Nothing to release: a task holds no process or file."""

    # -- fork contract -------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """Plain data: the task's snapshot, the live roles, the previous actor and the RNG."""
        return copy.deepcopy(
            wrapper_snapshot(
                "parallel",
                {
                    "task": self.task.snapshot(),
                    "rng": self._rng.getstate(),
                    "agents": self.agents,
                    "previous_actor": self._previous_actor,
                    "counts": self._counts,
                },
            )
        )

    def restore(self, state: dict[str, Any]) -> None:
        """Return to ``state`` (from :meth:`snapshot`); ``state`` stays reusable. A snapshot of
        another task or wrapper is refused before anything changes."""
        check_snapshot("parallel", self.task, state)
        state = copy.deepcopy(state)
        self.task.restore(state["task"])
        self._rng.setstate(state["rng"])
        self.agents, self._previous_actor = state["agents"], state["previous_actor"]
        self._counts = state["counts"]


def env(
    task: str,
    bid_levels: Sequence[float] = PAPER_BID_LEVELS,
    render_mode: str | None = None,
    **config: Any,
) -> TextAuctionEnv:
    """The registered task ``task`` (``envs.TASKS``) as an AEC env; ``config``: fields of its
    config (e.g. ``target="wooden_pickaxe"``, ``cache_dir=...`` for research)."""
    return TextAuctionEnv(build_task(task, config), bid_levels, render_mode)


def parallel_env(
    task: str, choose_actor: ChooseActor, render_mode: str | None = None, **config: Any
) -> TextParallelEnv:
    """The registered task ``task`` as a parallel env coordinated by ``choose_actor``."""
    return TextParallelEnv(build_task(task, config), choose_actor, render_mode)
