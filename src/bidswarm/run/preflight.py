"""Everything a run can be refused for before a folder, a model or an env is made, checked once
per job: by Hydra's callback :class:`Preflight` (a single run, before Hydra makes its folder),
else by ``bidswarm.train.main`` (a sweep's job, or Hydra without the callback)."""

from __future__ import annotations

import sys
from typing import Any

from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from bidswarm import tracking
from bidswarm.config import check_machine, validate
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
    Hydra creates the run's output folder, so that a bad value leaves nothing behind."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            preflight(OmegaConf.masked_copy(config, [k for k in config if k != "hydra"]))
        except (ValueError, CheckpointError, tracking.TrackingUnavailable) as error:
            # Hydra turns a callback's exceptions into warnings and goes on: exit here.
            sys.exit(f"Error: {error}")


PREFLIGHT_TARGET = f"{Preflight.__module__}.{Preflight.__qualname__}"
"""How ``hydra.callbacks`` names :class:`Preflight` (``_target_``)."""


def checked_at_hydra_start(hydra_cfg: DictConfig) -> bool:
    """Whether :class:`Preflight` already checked this job's config (``hydra_cfg``: Hydra's
    own config of the job): a single run whose ``hydra.callbacks`` hold the callback. A
    sweep's job is checked by itself: its values are not those of the sweep's config."""
    return hydra_cfg.mode == RunMode.RUN and any(
        callback.get("_target_") == PREFLIGHT_TARGET for callback in hydra_cfg.callbacks.values()
    )
