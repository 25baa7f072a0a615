"""A ``--multirun`` sweep's MLflow parent run: made before its jobs (Hydra callback
:class:`SweepParent`), open while they run, ended with their summary (``bidswarm.report``:
arms, held-out reward after RL, the comparison plots). See docs/mlflow.md."""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import re
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from bidswarm.tracking import (
    OVERRIDES_TAG,
    PARENT_ENV,
    SWEEP_TAG,
    open_experiment,
    run_url,
    sweep_run_name,
    tracking_uri,
)


class SweepParent(Callback):
    """Hydra callback (``hydra.callbacks`` of ``conf/train.yaml``): in the launcher's process,
    before any job, the sweep's parent run named from the sweep's overrides (all values,
    ``sweep ablation=none,random_credit seed=0,1``); its id reaches the jobs through
    :data:`PARENT_ENV`. After the last job: the sweep's summary (:func:`summarise_sweep`), and
    the parent ends ``FINISHED`` (``FAILED`` if a job failed or the sweep stopped)."""

    def __init__(self) -> None:
        self.parent: str | None = None
        self.uri = ""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if config.logger.name != "mlflow":
            return
        import mlflow  # noqa: F401  (it configures its loggers on import: do that first)

        if not config.verbose:  # the store's set-up lines: not on the launcher's console
            logging.getLogger("mlflow").setLevel(logging.WARNING)
        self.uri = tracking_uri(config.logger.tracking_uri)
        client, experiment = open_experiment(self.uri, config.logger.experiment_name)
        sweep_dir = str(Path(config.hydra.sweep.dir).resolve())
        overrides = " ".join(config.hydra.overrides.task)
        run = client.create_run(
            experiment,
            run_name=sweep_run_name(config.hydra.overrides.task),
            tags={SWEEP_TAG: sweep_dir, OVERRIDES_TAG: overrides},
        )
        self.parent = run.info.run_id
        os.environ[PARENT_ENV] = self.parent
        atexit.register(self._end, "FAILED")  # a failed job skips on_multirun_end

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self.parent is None:
            return
        from mlflow.tracking import MlflowClient

        parent, client = self.parent, MlflowClient(self.uri)
        if not config.verbose:
            os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"
        try:
            summary = summarise_sweep(client, self.parent, Path(config.hydra.sweep.dir) / "summary")
        except (Exception, SystemExit) as error:  # the jobs' results stand without one
            print(f"[bidswarm] sweep summary failed: {error}", flush=True)
            summary = None
        children = client.search_runs(
            [client.get_run(self.parent).info.experiment_id],
            filter_string=f"tags.mlflow.parentRunId = '{self.parent}'",
        )
        finished = bool(children) and all(c.info.status == "FINISHED" for c in children)
        self._end("FINISHED" if finished else "FAILED")
        if summary is not None:
            print(summary, flush=True)
        experiment = client.get_run(parent).info.experiment_id
        print(f"[bidswarm] sweep parent run: {run_url(self.uri, experiment, parent)}", flush=True)

    def _end(self, status: str) -> None:
        if self.parent is None:
            return
        from mlflow.tracking import MlflowClient

        MlflowClient(self.uri).set_terminated(self.parent, status)
        os.environ.pop(PARENT_ENV, None)
        self.parent = None


ARM_NAME_CHARACTERS = 200
"""Longest arm name in a metric name: MLflow refuses names over 250 characters, and
``arm/<arm>/heldout_reward/ci_high`` adds 27 (an arm of a one-arm sweep is named by every
override, a tracking URI among them)."""


def arm_metric_name(arm: str) -> str:
    """An arm's name as a metric name (MLflow allows letters, digits, ``_-. /``):
    ``ablation=random_credit`` -> ``ablation-random_credit``; a name longer than
    :data:`ARM_NAME_CHARACTERS` keeps its start and ends with a hash of the whole name, so
    arms stay apart (``summary/arms.json`` has the full names)."""
    name = re.sub(r"[^\w.\- ]", "_", arm.replace("=", "-").replace(",", " "))
    if len(name) <= ARM_NAME_CHARACTERS:
        return name
    digest = hashlib.sha1(arm.encode()).hexdigest()[:8]
    return f"{name[: ARM_NAME_CHARACTERS - 10]}..{digest}"


def summarise_sweep(client, parent: str, out: Path) -> str:
    """The sweep's comparison (``bidswarm.report``: arms = children grouped by the overrides
    that differ) on its parent run: per arm the held-out reward after RL,
    ``arm/<arm>/heldout_reward/{mean,se,ci_low,ci_high}`` (two-way random-effects interval
    over training seeds x worlds, :func:`bidswarm.report.strategies.strategy_rows`; over worlds
    only for an arm of one training seed), ``arm/<arm>/seeds`` (the training seeds those count) and
    ``arm/<arm>/runs``; the report (``summary/report.md``, its plots) and the table
    ``summary/arms.json``. Returns the report's markdown."""
    # MLflow's client: imported where a sweep logs to MLflow only
    from bidswarm.report import command, reading, strategies, tables

    text = command.write_report(client, parent, [], out)
    rows = strategies.strategy_rows(
        reading.group_by_strategy(
            [reading.read_run(client, r) for r in reading.find_runs(client, parent)]
        )
    )
    metrics: dict[str, float] = {}
    for row in rows:
        name = f"arm/{arm_metric_name(row.strategy)}"
        metrics |= {f"{name}/heldout_reward/mean": row.mean, f"{name}/heldout_reward/se": row.se}
        if row.ci_low is not None:
            metrics |= {
                f"{name}/heldout_reward/ci_low": row.ci_low,
                f"{name}/heldout_reward/ci_high": row.ci_high,
            }
        metrics[f"{name}/seeds"] = float(row.seeds)
        metrics[f"{name}/runs"] = float(row.runs)
    for key, value in metrics.items():
        client.log_metric(parent, key, value)
    client.log_artifacts(parent, str(out), "summary")
    table = {
        "arm": [row.strategy for row in rows],
        "held-out reward after RL (mean)": [row.mean for row in rows],
        "SE": [row.se for row in rows],
        "95% CI low": [row.ci_low for row in rows],
        "95% CI high": [row.ci_high for row in rows],
        "over": [
            tables.interval_basis(row).replace("¹", f" ({strategies.ONE_SEED})") for row in rows
        ],
        "training seeds": [row.seeds for row in rows],
        "runs": [row.runs for row in rows],
    }
    client.log_table(parent, table, "summary/arms.json")
    return text
