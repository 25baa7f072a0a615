"""Intra-op threads of a run: the jobs of a parallel local sweep share the cores instead of
each taking all of them (``scripts/bench_threads.py`` measures why)."""

from __future__ import annotations

import os
from typing import Any

from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

SWEEP_JOBS_ENV = "BIDSWARM_SWEEP_JOBS"
"""How many jobs the sweep makes, set by :class:`SweepJobs` for the jobs the launcher starts."""


def sweep_jobs(overrides: list[str]) -> int | None:
    """How many jobs a sweep of these overrides makes: the product of each sweep's number of
    values. None where Hydra alone can expand a sweep (``glob(...)``) or parse the overrides."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
        jobs = 1
        for override in parsed:
            if override.is_sweep_override():
                jobs *= len(list(override.sweep_string_iterator()))
        return jobs
    except Exception:
        return None


class SweepJobs(Callback):
    """Hydra callback (``hydra.callbacks`` of ``conf/train.yaml``): in the launcher's process,
    before any job, the number of jobs of the sweep (its command line's overrides and
    ``hydra.sweeper.params``) reaches the jobs through :data:`SWEEP_JOBS_ENV`, so that a sweep
    of fewer jobs than the launcher's ``n_jobs`` gives each of them more threads
    (:func:`threads_per_job`)."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        params = config.hydra.sweeper.get("params") or {}
        overrides = [*config.hydra.overrides.task, *(f"{k}={v}" for k, v in params.items())]
        jobs = sweep_jobs(overrides)
        if jobs is None:
            os.environ.pop(SWEEP_JOBS_ENV, None)
        else:
            os.environ[SWEEP_JOBS_ENV] = str(jobs)


def threads_per_job(
    hydra_cfg: DictConfig, cores: int | None = None, jobs_in_sweep: int | None = None
) -> int | None:
    """Intra-op threads of a job of a parallel local sweep (joblib launcher, ``n_jobs`` jobs
    at once): its share of the ``cores`` this process may run on; None otherwise (torch's
    default). ``jobs_in_sweep``, the number of jobs the sweep makes (by default what
    :class:`SweepJobs` counted), caps the jobs that share: a one-job sweep
    keeps every core. Jobs that each take every core make their threads spin-wait on each
    other (measured: a SmolLM2 rollout 20x slower with two such jobs on 2 cores)."""
    if hydra_cfg.mode != RunMode.MULTIRUN or "joblib" not in hydra_cfg.launcher.get("_target_", ""):
        return None
    cores = cores or len(os.sched_getaffinity(0))
    n_jobs = hydra_cfg.launcher.n_jobs
    jobs = cores if n_jobs < 1 else min(n_jobs, cores)  # joblib: -1 means one job per core
    if jobs_in_sweep is None and os.environ.get(SWEEP_JOBS_ENV, "").isdigit():
        jobs_in_sweep = int(os.environ[SWEEP_JOBS_ENV])
    if jobs_in_sweep:
        jobs = min(jobs, jobs_in_sweep)
    return max(1, cores // jobs)
