"""Everything a run can be refused for before a folder, a model or an env is made, checked once
per job: by Hydra's callback :class:`Preflight` (a single run, before Hydra makes its folder),
else by ``bidswarm.train.main`` (a sweep's job, or Hydra without the callback)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from hydra import compose
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from bidswarm import console, tracking
from bidswarm.config import ConfigError, check_machine, validate
from bidswarm.lit.callbacks import CheckpointError
from bidswarm.run.resume import check_init_from, check_resume, check_resumed_tracking


def preflight(cfg: DictConfig) -> None:
    """Everything that can be refused before a folder, a model or an env is made: config
    values, what they ask of this machine, ``resume=``, ``init_from=``, the tracking store."""
    validate(cfg)
    check_machine(cfg)
    check_resume(cfg)
    check_init_from(cfg)
    if cfg.logger.name == "mlflow":
        uri = tracking.tracking_uri(cfg.logger.tracking_uri)
        tracking.check_store(uri)
        check_resumed_tracking(cfg, uri)


class Preflight(Callback):
    """Hydra callback (``hydra.callbacks`` of ``conf/train.yaml``): :func:`preflight` before
    Hydra creates the run's output folder, so that a bad value leaves nothing behind; then the
    folder itself (:func:`check_output_folder`), before any model loads."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        cfg = OmegaConf.masked_copy(config, [k for k in config if k != "hydra"])
        try:
            preflight(cfg)
            # The folder's name may read Hydra's config (``${hydra:job.name}``), which Hydra
            # sets itself just after the callbacks: set it first, as it will be.
            HydraConfig.instance().set_config(config)
            check_output_folder("hydra.run.dir", str(config.hydra.run.dir))
        except (ValueError, CheckpointError, tracking.TrackingUnavailable) as error:
            # Hydra turns a callback's exceptions into warnings and goes on: exit here.
            sys.exit(f"Error: {error}")
        say_debug_changes(config.hydra, cfg)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """A sweep's folder, tried before any job starts (each job checks its own values)."""
        try:
            check_output_folder("hydra.sweep.dir", str(config.hydra.sweep.dir))
        except ConfigError as error:
            sys.exit(f"Error: {error}")


def check_output_folder(key: str, folder: str) -> None:
    """Make the run's output ``folder`` (named by the config key ``key``), as Hydra does next;
    :class:`ConfigError` naming the folder and why when it cannot be made or written to."""
    path = Path(folder)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(
            f"{key}={folder}: the output folder cannot be made: {_why_not(path, error)}"
        ) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"{key}={folder}: the output folder is not writable")


def _why_not(path: Path, error: OSError) -> str:
    """Why ``mkdir`` of ``path`` failed, said of the nearest folder that exists (``/proc/x``:
    not "no such file", but that ``/proc`` takes no new folder)."""
    existing = next(parent for parent in path.absolute().parents if parent.exists())
    if path.exists() or not existing.is_dir():
        blocking = path if path.exists() else existing
        return f"{blocking} exists and is not a folder"
    if isinstance(error, FileNotFoundError):
        return f"{existing} exists but takes no new folder ({error.strerror})"
    return f"{error.strerror} ({error.filename})"


def debug_changes(hydra_cfg: DictConfig, task: DictConfig) -> list[str]:
    """What the chosen ``debug`` profile changes of the task's own config (``task``: the
    composed run's), as ``task.<key> <own> -> <profile's>``: against the config composed
    again with the same overrides but no profile. Empty without a profile. ``hydra_cfg``:
    Hydra's own config of the run; Hydra must be initialised (as it is inside a run)."""
    profile = hydra_cfg.runtime.choices.get("debug")
    if profile is None:
        return []
    others = [o for o in hydra_cfg.overrides.task if o.lstrip("+~").split("=")[0] != "debug"]
    own = compose(hydra_cfg.job.config_name, overrides=others).task
    theirs, profiles = _dotted(own), _dotted(task)
    return [
        f"task.{key} {theirs.get(key)} -> {value}"
        for key, value in profiles.items()
        if theirs.get(key) != value
    ]


def say_debug_changes(hydra_cfg: DictConfig, cfg: DictConfig) -> None:
    """Say on the console what the ``debug`` profile changes of the task (:func:`debug_changes`):
    a profile that cuts the decision budget, or any other value of the task, says so."""
    changes = debug_changes(hydra_cfg, cfg.task)
    if changes:
        profile = hydra_cfg.runtime.choices.debug
        console.say(
            f"[bidswarm] debug={profile} changes the task's own values: {', '.join(changes)}"
        )


def _dotted(node: DictConfig) -> dict[str, Any]:
    """``node``'s leaves by dotted key (``world_size.cities``), interpolations unresolved."""
    flat: dict[str, Any] = {}
    for key, value in OmegaConf.to_container(node, resolve=False).items():
        if isinstance(value, dict):
            flat |= {f"{key}.{k}": v for k, v in _dotted(OmegaConf.create(value)).items()}
        else:
            flat[str(key)] = value
    return flat


PREFLIGHT_TARGET = f"{Preflight.__module__}.{Preflight.__qualname__}"
"""How ``hydra.callbacks`` names :class:`Preflight` (``_target_``)."""


def checked_at_hydra_start(hydra_cfg: DictConfig) -> bool:
    """Whether :class:`Preflight` already checked this job's config (``hydra_cfg``: Hydra's
    own config of the job): a single run whose ``hydra.callbacks`` hold the callback. A
    sweep's job is checked by itself: its values are not those of the sweep's config."""
    return hydra_cfg.mode == RunMode.RUN and any(
        callback.get("_target_") == PREFLIGHT_TARGET for callback in hydra_cfg.callbacks.values()
    )
