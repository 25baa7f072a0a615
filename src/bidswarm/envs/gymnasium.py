"""Every registered task as a single-agent Gymnasium environment: the monolithic agent's view.

One agent owns every role's actions (``role=None``, :data:`~bidswarm.envs.base.MONOLITHIC`)
and acts at every step, as our monolithic baseline does: the observation is the task's
monolithic observation, the action a reply text, the reward the task's step reward.

Importing this module registers ``bidswarm/<Task>-v0`` for each task of ``envs.TASKS``
(``bidswarm/Crafting-v0``, ``bidswarm/Navigation-v0``, ``bidswarm/Research-v0``); the task's
config fields go as keyword arguments, e.g.
``gymnasium.make("bidswarm.envs.gymnasium:bidswarm/Crafting-v0", target="wooden_pickaxe")``
(the ``module:`` prefix imports this module first). ``snapshot()`` / ``restore()`` fork it;
:func:`snapshot_wrapped` / :func:`restore_wrapped` fork it through the wrappers
``gymnasium.make`` adds (``TimeLimit``'s step count included) and through a ``SyncVectorEnv``
(``docs/environments.md``).
"""

from __future__ import annotations

import copy
from typing import Any, ClassVar

import gymnasium
import numpy as np
from gymnasium.vector import SyncVectorEnv, VectorEnv
from gymnasium.wrappers import Autoreset, OrderEnforcing, PassiveEnvChecker, TimeLimit

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


WRAPPER_STATE: dict[type[gymnasium.Wrapper], tuple[str, ...]] = {
    TimeLimit: ("_elapsed_steps",),
    OrderEnforcing: ("_has_reset",),
    Autoreset: ("autoreset",),
    PassiveEnvChecker: (),
}
"""What each wrapper ``gymnasium.make`` may add keeps that decides what comes next: the steps
``TimeLimit`` counted, whether ``OrderEnforcing`` saw a reset, whether ``Autoreset`` resets at
the next step (``PassiveEnvChecker``'s flags only say which checks it ran). Their attribute
names are gymnasium 1.4's."""


def snapshot_wrapped(env: gymnasium.Env | VectorEnv) -> dict[str, Any]:
    """A snapshot of ``env`` with its wrappers, for :func:`restore_wrapped`: the state of each
    wrapper of :data:`WRAPPER_STATE`, outermost first, and the :class:`MonolithicTextEnv`'s
    :meth:`~MonolithicTextEnv.snapshot`. Of a ``SyncVectorEnv``: each sub-env's, and which
    sub-envs reset at the next step (its autoreset flags).

    Another wrapper, a vector wrapper or an ``AsyncVectorEnv`` (whose sub-envs and autoreset
    flags live in its worker processes) raise ``TypeError``: their state is out of reach.
    """
    if isinstance(env, SyncVectorEnv):
        return {
            "vector": [snapshot_wrapped(sub_env) for sub_env in env.envs],
            "autoreset": env._autoreset_envs.tolist(),
        }
    chain, inner = _wrapper_chain(env)
    wrappers = [
        [
            type(wrapper).__name__,
            {name: getattr(wrapper, name) for name in WRAPPER_STATE[type(wrapper)]},
        ]
        for wrapper in chain
    ]
    return copy.deepcopy({"wrappers": wrappers, "env": inner.snapshot()})


def restore_wrapped(env: gymnasium.Env | VectorEnv, state: dict[str, Any]) -> None:
    """Return ``env`` and its wrappers to ``state`` (from :func:`snapshot_wrapped` of an env
    wrapped the same way: else ``ValueError``, before anything changes); ``state`` stays
    reusable. Then the same actions replay the same observations, rewards and ends."""
    _check_wrapped(env, state)
    if isinstance(env, SyncVectorEnv):
        for sub_env, sub_state in zip(env.envs, state["vector"], strict=True):
            restore_wrapped(sub_env, sub_state)
        env._autoreset_envs = np.array(state["autoreset"], dtype=np.bool_)
        return
    chain, inner = _wrapper_chain(env)
    for wrapper, (_, values) in zip(chain, state["wrappers"], strict=True):
        for name, value in values.items():
            setattr(wrapper, name, copy.deepcopy(value))
    inner.restore(state["env"])


def _wrapper_chain(
    env: gymnasium.Env | VectorEnv,
) -> tuple[list[gymnasium.Wrapper], MonolithicTextEnv]:
    """The wrappers around ``env``'s :class:`MonolithicTextEnv`, outermost first, and it; a
    ``TypeError`` for anything whose state :func:`snapshot_wrapped` cannot reach."""
    if isinstance(env, VectorEnv):
        raise TypeError(
            f"cannot fork through {type(env).__name__}: only a SyncVectorEnv's sub-envs and "
            "autoreset flags are in reach (an AsyncVectorEnv keeps them in its workers); fork "
            "a SyncVectorEnv, or each single env"
        )
    chain = []
    while isinstance(env, gymnasium.Wrapper):
        if type(env) not in WRAPPER_STATE:
            known = sorted(wrapper.__name__ for wrapper in WRAPPER_STATE)
            raise TypeError(
                f"cannot fork through {type(env).__name__}: its state is unknown (known: {known})"
            )
        chain.append(env)
        env = env.env
    if not isinstance(env, MonolithicTextEnv):
        raise TypeError(f"snapshot_wrapped forks a bidswarm env, not a {type(env).__name__}")
    return chain, env


def _check_wrapped(env: gymnasium.Env | VectorEnv, state: dict[str, Any]) -> None:
    """``ValueError`` unless ``state`` is :func:`snapshot_wrapped` of an env wrapped as ``env``
    is (the task itself is checked by :meth:`MonolithicTextEnv.restore`, also before it
    changes anything)."""
    if isinstance(env, SyncVectorEnv):
        if len(state.get("vector", ())) != env.num_envs:
            raise ValueError(
                f"a snapshot of {len(state.get('vector', ()))} envs cannot restore a "
                f"SyncVectorEnv of {env.num_envs}"
            )
        for sub_env, sub_state in zip(env.envs, state["vector"], strict=True):
            _check_wrapped(sub_env, sub_state)
        return
    chain, inner = _wrapper_chain(env)
    names = [type(wrapper).__name__ for wrapper in chain]
    if "wrappers" not in state:
        raise ValueError("restore_wrapped takes what snapshot_wrapped returned")
    theirs = [name for name, _ in state["wrappers"]]
    if names != theirs:
        raise ValueError(f"a snapshot of an env wrapped in {theirs} cannot restore one in {names}")
    check_snapshot("gymnasium", inner.task, state["env"])


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
