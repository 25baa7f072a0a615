"""Text environments. Each task is a sub-package of ``envs`` whose environment class registers
itself under its ``task.name`` (``@register_task("<name>")``, ``envs/base.py``); importing this
package imports every sub-package, so a new task is its own sub-package and its YAML, nothing
else."""

from __future__ import annotations

import importlib
import pkgutil

from bidswarm.envs.base import (
    EPISODE_METRICS,
    MONOLITHIC,
    TASKS,
    StepResult,
    TaskConfig,
    TextEnv,
    register_task,
)

for _module in pkgutil.iter_modules(__path__):
    if _module.ispkg:  # a task; the modules beside them are shared machinery and wrappers
        importlib.import_module(f"{__name__}.{_module.name}")


def env_class(name: str) -> type[TextEnv]:
    """The environment class registered under ``name``; a clear error for an unknown task."""
    if name not in TASKS:
        raise ValueError(f"task.name={name!r} is not a known task; choose one of {sorted(TASKS)}")
    return TASKS[name]


def make_env(config: TaskConfig) -> TextEnv:
    """Build the environment that ``config.name`` names."""
    return env_class(config.name)(config)


__all__ = [
    "EPISODE_METRICS",
    "MONOLITHIC",
    "TASKS",
    "StepResult",
    "TaskConfig",
    "TextEnv",
    "env_class",
    "make_env",
    "register_task",
]
