"""What the PettingZoo and Gymnasium views of a task share: the text spaces, building a task by
name, and the end of an episode in their terms (``docs/environments.md``).

Only the two wrappers (``envs/pettingzoo.py``, ``envs/gymnasium.py``) import this module: the
rest of the package never imports ``gymnasium`` (the optional ``envs`` extra).
"""

from __future__ import annotations

import string
from typing import Any

from gymnasium.spaces import Text

from bidswarm.envs import env_class
from bidswarm.envs.base import TextEnv

OBSERVATION_MAX_LENGTH = 8192
"""Characters an observation may hold. The tasks' observations stay under 500 with their default
configs (``tests/test_envs_wrappers.py`` checks real ones); longer histories, pages or notes have
room to grow."""

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


def observation_space() -> Text:
    """The space of a role's observation text."""
    return Text(OBSERVATION_MAX_LENGTH, min_length=0, charset=OBSERVATION_CHARSET)


def action_space() -> Text:
    """The space replies (bids and actions) are sampled from."""
    return Text(ACTION_MAX_LENGTH, min_length=0, charset=ACTION_CHARSET)


def build_task(task: str, config: dict[str, Any]) -> TextEnv:
    """The registered task ``task`` (``envs.TASKS``) built from its config's fields ``config``
    (e.g. ``target="wooden_pickaxe"`` for crafting); an unknown field raises ``TypeError``."""
    cls = env_class(task)
    return cls(cls.Config(name=task, **config))


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
