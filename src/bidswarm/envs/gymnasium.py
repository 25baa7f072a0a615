"""Every registered task as a single-agent Gymnasium environment: the monolithic agent's view.

One agent owns every role's actions (``role=None``, :data:`~bidswarm.envs.base.MONOLITHIC`)
and acts at every step, as our monolithic baseline does: the observation is the task's
monolithic observation, the action a reply text, the reward the task's step reward.

Importing this module registers ``bidswarm/<Task>-v0`` for each task of ``envs.TASKS``
(``bidswarm/Crafting-v0``, ``bidswarm/Navigation-v0``, ``bidswarm/Research-v0``); the task's
config fields go as keyword arguments, e.g.
``gymnasium.make("bidswarm.envs.gymnasium:bidswarm/Crafting-v0", target="wooden_pickaxe")``
(the ``module:`` prefix imports this module first). ``snapshot()`` / ``restore()`` fork it
(``docs/environments.md``).
"""

from __future__ import annotations

import copy
from typing import Any, ClassVar

import gymnasium

from bidswarm.envs import TASKS
from bidswarm.envs.base import MONOLITHIC, TextEnv, world_seed
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


class MonolithicTextEnv(gymnasium.Env[str, str]):
    """A task played by one agent that owns every role (module docstring).

    ``reset(seed=s)`` plays world ``s`` (``TextEnv.reset``); ``reset()`` a training world drawn
    from the env's seeded generator. ``info``: ``valid`` and ``message`` of the step; at the end,
    ``metrics``: the task's episode metrics plus ``actions_invalid``.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"]}

    def __init__(self, task: str, render_mode: str | None = None, **config: Any):
        """``task``: a name of ``envs.TASKS``; ``config``: fields of its config."""
        check_render_mode(self, render_mode)
        self.task: TextEnv = build_task(task, config)
        self.render_mode = render_mode
        self.observation_space = observation_space()
        self.action_space = action_space()
        self._actions_invalid = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        seed = None if seed is None else world_seed(seed)
        super().reset(seed=seed)
        if seed is None:
            seed = int(self.np_random.integers(self.task.config.n_train_seeds))
        self.task.reset(seed)
        self._actions_invalid = 0
        return self.task.observation(MONOLITHIC), {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """One decision by the monolithic agent; before ``reset`` or after the end,
        ``EpisodeNotRunning`` (the task's ``step`` raises it, changing nothing)."""
        result = self.task.step(MONOLITHIC, require_text(action))
        self._actions_invalid += int(not result.valid)
        terminated, truncated = episode_end(self.task)
        info: dict[str, Any] = {"valid": result.valid, "message": result.message}
        if terminated or truncated:
            info["metrics"] = {
                **self.task.episode_metrics(),
                "actions_invalid": float(self._actions_invalid),
            }
        observation = self.task.observation(MONOLITHIC)
        return observation, float(result.reward), terminated, truncated, info

    def render(self) -> str | None:
        return self.task.observation(MONOLITHIC) if self.render_mode == "ansi" else None

    # -- fork contract -------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """Plain data: the task's snapshot, the invalid-action count and the generator's state
        (it draws the next ``reset()``'s world)."""
        return copy.deepcopy(
            wrapper_snapshot(
                "gymnasium",
                self.task,
                {
                    "task": self.task.snapshot(),
                    "actions_invalid": self._actions_invalid,
                    "np_random": self.np_random.bit_generator.state,
                },
            )
        )

    def restore(self, state: dict[str, Any]) -> None:
        """Return to ``state`` (from :meth:`snapshot`); ``state`` stays reusable. A snapshot of
        another task or wrapper is refused before anything changes."""
        check_snapshot("gymnasium", self.task, state)
        state = copy.deepcopy(state)
        self.task.restore(state["task"])
        self._actions_invalid = state["actions_invalid"]
        self.np_random.bit_generator.state = state["np_random"]


def env_id(task: str) -> str:
    """The Gymnasium id of ``task``: ``bidswarm/Crafting-v0`` for ``crafting``."""
    return f"bidswarm/{task.capitalize()}-v0"


for _task in TASKS:
    if env_id(_task) not in gymnasium.registry:
        gymnasium.register(
            env_id(_task),
            entry_point=f"{__name__}:MonolithicTextEnv",
            kwargs={"task": _task},
        )
