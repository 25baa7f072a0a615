"""Text environments. Each task is a sub-package registered in ``TASKS`` by its config name."""

from __future__ import annotations

import importlib

from bidswarm.envs.base import MONOLITHIC, StepResult, TaskConfig, TextEnv

TASKS: dict[str, str] = {
    "crafting": "bidswarm.envs.crafting:CraftingEnv",
    "research": "bidswarm.envs.research:ResearchEnv",
    "navigation": "bidswarm.envs.navigation:NavigationEnv",
}
"""Task name (``task.name`` in the config) -> ``module:EnvClass``."""


def env_class(name: str) -> type[TextEnv]:
    """The environment class registered under ``name``; a clear error for an unknown task."""
    if name not in TASKS:
        raise ValueError(f"task.name={name!r} is not a known task; choose one of {sorted(TASKS)}")
    module, cls = TASKS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def make_env(config: TaskConfig) -> TextEnv:
    """Build the environment that ``config.name`` names."""
    return env_class(config.name)(config)


__all__ = ["MONOLITHIC", "TASKS", "StepResult", "TaskConfig", "TextEnv", "env_class", "make_env"]
