"""MLflow: the store, run names from the Hydra overrides, one parent run per sweep."""

from __future__ import annotations

import fcntl
import os
import urllib.error
import urllib.request
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

DEFAULT_TRACKING_URI = "sqlite:///outputs/mlflow.db"
SWEEP_TAG = "bidswarm.sweep_dir"
HEALTH_TIMEOUT_S = 5.0
"""How long the check before training waits for a tracking server to answer."""


class TrackingUnavailable(RuntimeError):
    """The configured MLflow store cannot be used."""


def tracking_uri(configured: str | None) -> str:
    """The config's URI, else ``$MLFLOW_TRACKING_URI``, else the project's sqlite store.

    MLflow 3 refuses the old ``./mlruns`` file store by default, so never leave it implicit.
    """
    uri = configured or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI
    if uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    return uri


def check_store(uri: str) -> None:
    """Fail fast, before anything is built, when MLflow cannot use ``uri``: a URI without a
    scheme MLflow accepts, or a tracking server that does not answer its ``/health`` check
    within :data:`HEALTH_TIMEOUT_S` (MLflow's own client would retry for minutes)."""
    from bidswarm.config import tracking_uri_problems

    problems = tracking_uri_problems("tracking URI", uri)
    if problems:
        raise TrackingUnavailable(
            f"{problems[0]} (from logger.tracking_uri or MLFLOW_TRACKING_URI)"
        )
    if not uri.startswith(("http://", "https://")):
        return
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=HEALTH_TIMEOUT_S) as reply:
            answer = reply.read(64).decode(errors="replace").strip()
    except (urllib.error.URLError, OSError, ValueError) as error:
        reason = getattr(error, "reason", error)
        answer = None
    if answer != "OK":
        reason = f"answered {answer!r}" if answer is not None else str(reason)
        raise TrackingUnavailable(
            f"the MLflow tracking server {uri} is not reachable ({reason}). Start it "
            "(`mlflow server --host 127.0.0.1 --port 5000 --backend-store-uri "
            "sqlite:///outputs/mlflow.db`), point MLFLOW_TRACKING_URI or logger.tracking_uri "
            "at a reachable store, or train with logger=csv"
        )


def experiment_id(client, name: str) -> str:
    """The id of the MLflow experiment ``name`` (an ``MlflowClient``'s store), created if new."""
    experiment = client.get_experiment_by_name(name)
    return experiment.experiment_id if experiment else client.create_experiment(name)


def run_name() -> str:
    """The run's name: its Hydra overrides (``coordination=round_robin,seed=1``) or ``default``."""
    if not HydraConfig.initialized():
        return "default"
    return HydraConfig.get().job.override_dirname or "default"


def sweep_parent_run(uri: str, experiment_name: str) -> str | None:
    """In a ``--multirun`` sweep, the id of the sweep's parent run (created by the first job)."""
    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    import mlflow
    from mlflow.tracking import MlflowClient

    sweep_dir = str(Path(HydraConfig.get().sweep.dir).resolve())
    Path(sweep_dir).mkdir(parents=True, exist_ok=True)
    # Jobs of a parallel launcher (joblib, SLURM arrays) start together: a lock in the sweep
    # folder makes exactly one of them create the store's tables, the experiment and the
    # parent run (concurrent first use of a new sqlite store fails in MLflow's migrations).
    with open(Path(sweep_dir) / ".mlflow_parent.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        client = MlflowClient(uri)
        experiment = experiment_id(client, experiment_name)
        found = client.search_runs(
            [experiment], filter_string=f"tags.`{SWEEP_TAG}` = '{sweep_dir}'", max_results=1
        )
        if found:
            return found[0].info.run_id
        overrides = HydraConfig.get().overrides.task
        name = "sweep " + " ".join(o for o in overrides) if overrides else "sweep"
        run = client.create_run(experiment, run_name=name, tags={SWEEP_TAG: sweep_dir})
        client.set_terminated(run.info.run_id)
    del mlflow
    return run.info.run_id
