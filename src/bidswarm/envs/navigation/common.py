"""What the embedded and the Habitat navigation tasks share: roles, texts, bookkeeping, experts.

A subclass owns the world (pose, views, shortest path) and keeps the episode state in the
attributes this base reads: ``_decisions``, ``_done``, ``_last`` (last result text),
``_metrics`` (PathMetrics), ``_distance_to_goal``, ``_stopped`` and ``_total_reward``.
"""

from __future__ import annotations

import abc

from bidswarm.envs.base import StepResult, TextEnv, role_name
from bidswarm.envs.navigation import shared
from bidswarm.envs.navigation.actions import (
    MOVE_CENTIMETRES,
    ROLES,
    TURN_DEGREES,
    NavAction,
    parse_action,
    rejection_message,
    role_may_act,
)


class NavigationRules(TextEnv):
    """Turner / Mover / Stopper sharing one body; the world is the subclass's."""

    roles = ROLES
    setting = "a house"
    """Where the robot is, in the task description."""

    @property
    def task_description(self) -> str:
        who = (
            "any of them may turn, move forward or stop"
            if self.config.actions == "shared"
            else "the turner turns, the mover moves forward, the stopper stops"
        )
        return (
            f"Three agents share one robot in {self.setting}: {who}. Follow the route "
            "instruction together and stop within "
            f"{self.config.success_distance:g} m of the goal, in at most "
            f"{self.config.max_decisions} decisions."
        )

    def role_description(self, role: str | None) -> str:
        turns = "/".join(str(n) for n in TURN_DEGREES)
        moves = "/".join(str(n) for n in MOVE_CENTIMETRES)
        commands = (
            f'"turn left N degree" or "turn right N degree" (N = {turns}), '
            f'"move forward N cm" (N = {moves}) or "stop"'
        )
        texts = {
            "turner": f'You are the turner: reply "turn left N degree" or "turn right N degree", '
            f"N = {turns}.",
            "mover": f'You are the mover: reply "move forward N cm", N = {moves}.',
            "stopper": 'You are the stopper: reply "stop" when the goal is reached; it ends the '
            "episode.",
            None: f"You control the robot: reply {commands} at the goal.",
        }
        if role not in texts:
            raise ValueError(f"unknown navigation role {role!r}; roles are {ROLES}")
        if self.config.actions == "shared":
            return shared.describe(role, commands) + self.memory_hint
        return texts[role] + self.memory_hint

    @property
    def decisions_made(self) -> int:
        return self._decisions

    @property
    def done(self) -> bool:
        return self._done

    def _take_decision(
        self, actor_role: str | None, action: str
    ) -> tuple[NavAction | None, StepResult | None]:
        """Count a decision and parse ``action``: (the command, None) when ``actor_role`` may
        carry it out, else (None, the wasted turn's result)."""
        if actor_role is not None and actor_role not in ROLES:
            raise ValueError(f"unknown navigation role {actor_role!r}; roles are {ROLES}")
        self.require_running("step()")
        self._decisions += 1
        command = parse_action(action)
        if command is None or not self.may_act(actor_role, command):
            self._last = rejection_message(role_name(actor_role), action, command)
            self._done = self._decisions >= self.config.max_decisions
            return None, StepResult(0.0, self._done, valid=False, message=self._last)
        return command, None

    def note_turn(self, actor_role: str | None) -> StepResult:
        self.require_running("step()")
        self._decisions += 1
        self._last = f"{role_name(actor_role)} wrote a note"
        self._done = self._decisions >= self.config.max_decisions
        return StepResult(0.0, self._done, message=self._last)

    def skip(self) -> StepResult:
        self.require_running("skip()")
        self._decisions += 1
        self._last = "no one acted"
        self._done = self._decisions >= self.config.max_decisions
        return StepResult(0.0, self._done, message=self._last)

    def episode_metrics(self) -> dict[str, float]:
        metrics = self._metrics.summary(self._distance_to_goal, self._stopped)
        metrics["reward"] = self._total_reward
        metrics["decisions"] = float(self._decisions)
        if self.memory.enabled:
            metrics |= self.memory.metrics()
        return metrics

    @abc.abstractmethod
    def expert_command(self) -> NavAction | None:
        """The experts' next command (None when they have none, e.g. once the episode is over)."""

    def may_act(self, role: str | None, command: NavAction) -> bool:
        """Whether an agent of ``role`` (None: monolithic) may carry out ``command``: its own
        kind of command (split actions), or any (shared)."""
        return self.config.actions == "shared" or role_may_act(role, command)

    def knows(self, role: str | None) -> bool:
        """Whether ``role`` sees the current room's layout (always, but under shared actions
        where a subclass draws who knows which room)."""
        return True

    def expert_action(self, role: str | None) -> str | None:
        command = self.expert_command()
        if command is None or not self.knows(role) or not self.may_act(role, command):
            return None
        return command.text

    def expert_bid(self, role: str) -> float:
        """0.8 when the next command the path needs is ``role``'s (shared actions: when
        ``role`` knows the room), else 0 (pass)."""
        command = self.expert_action(role)
        return shared.EXPERT_BID if command is not None else 0.0
