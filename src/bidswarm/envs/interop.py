"""What the PettingZoo and Gymnasium views of a task share: the text spaces, building a task by
name, the end of an episode in their terms, and the checks at their edges (render modes, seeds,
snapshots of another task) (``docs/environments.md``).

Only the two wrappers (``envs/pettingzoo.py``, ``envs/gymnasium.py``) import this module: the
rest of the package never imports ``gymnasium`` (the optional ``envs`` extra).
"""

from __future__ import annotations

import dataclasses
import functools
import string
from collections.abc import Mapping
from typing import Any

from gymnasium.spaces import Space, Text

from bidswarm.envs import env_class
from bidswarm.envs.base import TextEnv

OBSERVATION_MAX_LENGTH = 8192
"""Characters an observation may hold. The tasks' observations stay under 500 with their default
configs, and under about 2,000 whatever the agents write, since a task quotes a reply only
through ``envs/quoting.py`` (``tests/test_envs_wrappers.py`` checks real ones and 20,000-character
replies); longer histories, pages or notes have room to grow."""

ACTION_MAX_LENGTH = 1024
"""Characters a sampled reply may hold. Any string is carried out as a reply (an agent's reply is
not cut to a space); one that means nothing is a wasted turn, counted as invalid."""

OBSERVATION_CHARSET = "".join(chr(code) for code in range(0x10000) if not 0xD800 <= code <= 0xDFFF)
"""Every character of Unicode's Basic Multilingual Plane but the surrogates. The tasks draw ASCII,
but an observation also quotes what agents wrote (a wasted reply, a search query, a note), and a
model may write anything. Characters beyond the plane (emoji) are left out: a space enumerates
its characters, and all 1.1 million would cost a second and 150 MB per space; an agent that
writes one makes an observation that lies outside the space (still carried out and shown)."""

ACTION_CHARSET = string.ascii_letters + string.digits + string.punctuation + " \n"
"""What a sampled reply is drawn from: the characters of every task's reply formats (a random
draw is almost always a wasted turn, as a random reply of a model is)."""


TEXT_SPACES: dict[str, tuple[int, str, str]] = {
    "observation": (
        OBSERVATION_MAX_LENGTH,
        OBSERVATION_CHARSET,
        f"<the Basic Multilingual Plane without surrogates: {len(OBSERVATION_CHARSET)} characters>",
    ),
    "action": (ACTION_MAX_LENGTH, ACTION_CHARSET, "<printable ASCII>"),
}
"""Each kind of text space: most characters, charset, and how ``repr`` names the charset."""


@functools.cache
def _character_tables(kind: str) -> dict[str, Any]:
    max_length, charset, _ = TEXT_SPACES[kind]
    return dict(vars(Text(max_length, min_length=0, charset=charset)))


class TextSpace(Text):
    """A gymnasium ``Text`` space of one of :data:`TEXT_SPACES`, cheap to build, copy and print.

    ``Text.__init__`` builds tables of its characters: ~40 ms for the 63,488 of observations,
    which a plain ``repr`` (of an error message, a vector env) lists in full. Here they are built
    once per process and shared, read-only, by every space of the kind; each space keeps its
    own generator; ``repr`` names the charset; a pickle or a copy holds the kind and the
    generator only. Otherwise it is exactly that ``Text`` (``==`` to it, same samples).
    """

    def __init__(self, kind: str, seed: int | None = None):
        self.__dict__.update(_character_tables(kind))
        Space.__init__(self, dtype=str, seed=seed)
        self.kind = kind

    def __repr__(self) -> str:
        return f"Text({self.min_length}, {self.max_length}, charset={TEXT_SPACES[self.kind][2]})"

    def __reduce__(self) -> tuple:
        return TextSpace, (self.kind,), {"_np_random": self.__dict__["_np_random"]}


def observation_space() -> TextSpace:
    """The space of a role's observation text."""
    return TextSpace("observation")


def action_space() -> TextSpace:
    """The space replies (bids and actions) are sampled from."""
    return TextSpace("action")


def build_task(task: str, config: Mapping[str, Any]) -> TextEnv:
    """The registered task ``task`` (``envs.TASKS``) built from its config's fields ``config``
    (e.g. ``target="wooden_pickaxe"`` for crafting); a nested config may come as a dict, as YAML
    or ``gymnasium.make`` keyword arguments give it (``memory={"size": 4}``); an unknown field
    raises ``TypeError`` naming it."""
    cls = env_class(task)
    return cls(cls.Config(name=task, **_nested_configs(cls.Config, config)))


def _nested_configs(schema: type, config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with each dict given for a dataclass-valued field of ``schema`` (``memory``)
    built into that dataclass."""
    built = dict(config)
    defaults = schema()
    for field in dataclasses.fields(schema):
        value, default = built.get(field.name), getattr(defaults, field.name)
        if isinstance(value, Mapping) and dataclasses.is_dataclass(default):
            try:
                built[field.name] = type(default)(**value)
            except TypeError as error:
                raise TypeError(f"task.{field.name}={dict(value)!r}: {error}") from None
    return built


def check_render_mode(env: Any, render_mode: str | None) -> None:
    """Refuse a ``render_mode`` that ``env.metadata["render_modes"]`` does not list."""
    modes = env.metadata["render_modes"]
    if render_mode is not None and render_mode not in modes:
        raise ValueError(f"render_mode={render_mode!r}: choose one of {modes} or None")


def wrapper_snapshot(wrapper: str, state: dict[str, Any]) -> dict[str, Any]:
    """``state`` of a wrapper (its task's snapshot under ``"task"``), marked with the wrapper."""
    return {"wrapper": wrapper, **state}


def check_snapshot(wrapper: str, task: TextEnv, state: Any) -> None:
    """Refuse, before anything changes, a snapshot of another task or of another wrapper."""
    if not (isinstance(state, Mapping) and {"wrapper", "task"} <= state.keys()):
        raise ValueError(
            f"restore() of a {wrapper} env of task {task.config.name!r} takes what snapshot() "
            f"of such an env returned, not this {type(state).__name__}"
        )
    task.check_snapshot(state["task"])
    if state["wrapper"] != wrapper:
        raise ValueError(
            f"a snapshot of a {state['wrapper']} env cannot restore a {wrapper} env "
            f"(task {task.config.name!r})"
        )


def episode_end(env: TextEnv) -> tuple[bool, bool]:
    """``(terminated, truncated)`` now: an episode the world ended before its decision budget
    was spent (target reached, a stop, an answer) terminated; one that ran out of budget was
    truncated (an episode that ends by its own event on the last decision counts as truncated)."""
    if not env.done:
        return False, False
    truncated = env.decisions_made >= env.config.max_decisions
    return not truncated, truncated


def require_text(action: Any) -> str:
    """``action`` if it is a string; anything else is a caller's mistake, not a wasted turn."""
    if not isinstance(action, str):
        raise TypeError(f"a reply is a str, got {type(action).__name__}: {action!r}")
    return action
