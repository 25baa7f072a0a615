"""MLflow: the store, run names from the Hydra overrides, clean params, one parent run per
sweep that stays open while its jobs run and ends with their summary (docs/mlflow.md)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

DEFAULT_TRACKING_URI = "sqlite:///outputs/mlflow.db"
SWEEP_TAG = "bidswarm.sweep_dir"
OVERRIDES_TAG = "bidswarm.overrides"
COMMIT_TAG = "bidswarm.git_commit"
"""The commit a run's code was at (:func:`code_commit`); reports name it."""
PARENT_ENV = "BIDSWARM_SWEEP_PARENT"
"""The sweep parent's run id, set by ``bidswarm.sweep.SweepParent`` for the jobs the launcher
starts."""
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}
"""Opens the experiment in the UI's model-training view (runs, charts), not the GenAI one."""
ARTIFACT_FOLDER = "mlartifacts"
"""Beside a sqlite store's file: where its runs' artifacts go (not ``./mlruns``)."""
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


def artifact_location(uri: str) -> str | None:
    """Where a new experiment of the store ``uri`` keeps artifacts: ``mlartifacts/`` beside a
    sqlite file (``outputs/mlartifacts`` for the default store); None: the server decides."""
    if not uri.startswith("sqlite:///"):
        return None
    return str(Path(uri.removeprefix("sqlite:///")).resolve().parent / ARTIFACT_FOLDER)


@contextlib.contextmanager
def store_lock(uri: str) -> Iterator[None]:
    """Held while a process first uses the store ``uri``: for a sqlite store an exclusive lock on
    ``<file>.lock`` beside it, so that runs started together (two shells, a parallel launcher,
    a SLURM array) create a new store's tables and an experiment one at a time; MLflow's
    migrations fail when two processes run them at once. A tracking server needs none."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    store = Path(uri.removeprefix("sqlite:///"))
    with open(store.with_name(store.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def open_experiment(uri: str, name: str) -> tuple[Any, str]:
    """An ``MlflowClient`` of the store ``uri`` and the id of its experiment ``name`` (created
    if new: :func:`experiment_id`), under :func:`store_lock`."""
    from mlflow.tracking import MlflowClient

    with store_lock(uri):
        client = MlflowClient(uri)
        return client, experiment_id(client, name)


def experiment_id(client, name: str) -> str:
    """The id of the MLflow experiment ``name`` (an ``MlflowClient``'s store), created if new
    with its artifacts under :func:`artifact_location` and the model-training view."""
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        location = artifact_location(client.tracking_uri)
        return client.create_experiment(name, artifact_location=location, tags=EXPERIMENT_KIND)
    if "mlflow.experimentKind" not in experiment.tags:
        for key, value in EXPERIMENT_KIND.items():
            client.set_experiment_tag(experiment.experiment_id, key, value)
    return experiment.experiment_id


UI_VIEW = "workflowType=machine_learning"
"""The MLflow UI's model-training view (runs, charts), not the GenAI one it opens by default."""


def run_url(uri: str, experiment: str, run_id: str) -> str:
    """The run's page in the MLflow UI's model-training view: at the tracking server's own
    address, else at ``mlflow ui``'s default one (:func:`ui_command`)."""
    base = uri.rstrip("/") if uri.startswith(("http://", "https://")) else "http://127.0.0.1:5000"
    return f"{base}/#/experiments/{experiment}/runs/{run_id}?{UI_VIEW}"


def ui_command(uri: str) -> str:
    """The command that serves the store ``uri`` (nothing to serve for a tracking server)."""
    if uri.startswith(("http://", "https://")):
        return ""
    return f"mlflow ui --backend-store-uri {uri} --host 127.0.0.1 --port 5000"


# -- params ------------------------------------------------------------------------------------
UNLOGGED_KEYS = ("output_dir", "resume", "init_from", "logger", "verbose")
"""Where a run goes and how it is tracked, not what it is: kept out of the params (the run
folder is the tag ``bidswarm.run_dir``; the resolved config artifact holds everything)."""
SUPERSEDED_KEYS = ("model.sft_epochs", "model.sft_lr", "model.rl_lr", "model.micro_batch_tokens")
"""The model's defaults for ``sft.*`` / ``rl.*`` (``conf/train.yaml`` interpolates them): the
params show the value used, under ``sft/`` and ``rl/`` only."""
CHOICE_GROUPS = ("ablation", "experiment", "debug")
"""The ``# @package _global_`` groups whose choice names the run's setting."""


def run_params(cfg: DictConfig, choices: dict[str, Any] | None = None) -> dict[str, Any]:
    """The resolved config as MLflow params, one key per setting: without paths
    (:data:`UNLOGGED_KEYS`), ``None`` values and superseded defaults (:data:`SUPERSEDED_KEYS`),
    plus the choices of :data:`CHOICE_GROUPS` (``none`` when unset)."""
    tree = OmegaConf.to_container(cfg, resolve=True)
    for key in UNLOGGED_KEYS:
        tree.pop(key, None)
    for dotted in SUPERSEDED_KEYS:
        section, key = dotted.split(".", 1)
        tree.get(section, {}).pop(key, None)
    params = {key: value for key, value in _flatten(tree).items() if value is not None}
    for group in CHOICE_GROUPS:
        params[group] = (choices or {}).get(group) or "none"
    return params


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat |= _flatten(value, f"{prefix}{key}/")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def hydra_choices() -> dict[str, Any]:
    """The config groups' choices of this job (``{"ablation": "random_credit", ...}``)."""
    return dict(HydraConfig.get().runtime.choices) if HydraConfig.initialized() else {}


def hydra_overrides() -> str:
    """This job's command-line overrides, space-separated (empty outside Hydra)."""
    return " ".join(HydraConfig.get().overrides.task) if HydraConfig.initialized() else ""


def code_commit() -> str | None:
    """The git commit of the code this process runs (``-dirty`` appended when tracked files
    differ from it), or None outside a git checkout (an installed package)."""
    root = Path(__file__).resolve().parents[2]

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", *args], cwd=root, capture_output=True, text=True, timeout=20
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if not commit:
        return None
    changed = git("status", "--porcelain", "--untracked-files=no")
    return commit + ("-dirty" if changed else "")


def run_name() -> str:
    """The run's name: its Hydra overrides (``coordination=round_robin,seed=1``) or ``default``."""
    if not HydraConfig.initialized():
        return "default"
    return HydraConfig.get().job.override_dirname or "default"


def sweep_run_name(overrides: list[str], cwd: Path | None = None) -> str:
    """A sweep parent's name: ``sweep`` and the sweep's overrides, values as given, except
    existing folders: one is written relative to ``cwd`` (the working directory) when inside
    it, and a key swept over several folders (an evaluation sweep's ``run_dir``) becomes
    ``run_dir=<5 folders in outputs/multirun/...>``, so the name says what ran, not every
    absolute path."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    cwd = (cwd or Path.cwd()).resolve()
    parts = []
    for text, override in zip(
        overrides, OverridesParser.create().parse_overrides(overrides), strict=True
    ):
        value = override.value()
        values = [
            getattr(v, "text", v) for v in (value.list if hasattr(value, "list") else [value])
        ]
        folders = [Path(v) for v in values if isinstance(v, str) and Path(v).is_dir()]
        if not folders or len(folders) != len(values):
            parts.append(text)
            continue
        shown = [_relative(folder, cwd) for folder in folders]
        label = shown[0] if len(shown) == 1 else folders_label(shown)
        parts.append(f"{override.get_key_element()}={label}")
    return " ".join(["sweep", *parts])


def folders_label(folders: list[str]) -> str:
    """``<5 folders in outputs/multirun/...>``: several folders, counted, under their common
    parent (a sweep parent's name, a report's command)."""
    try:
        return f"<{len(folders)} folders in {os.path.commonpath(folders)}>"
    except ValueError:  # relative and absolute ones, or on different drives
        return f"<{len(folders)} folders>"


def provenance_tags() -> dict[str, str]:
    """The tags every training and evaluation run records: its Hydra overrides and, in a git
    checkout, the commit of its code (:func:`code_commit`)."""
    commit = code_commit()
    return {OVERRIDES_TAG: hydra_overrides()} | ({COMMIT_TAG: commit} if commit else {})


def _relative(folder: Path, cwd: Path) -> str:
    resolved = folder.resolve()
    return str(resolved.relative_to(cwd)) if resolved.is_relative_to(cwd) else str(folder)


def sweep_parent_run(uri: str, experiment_name: str) -> str | None:
    """In a ``--multirun`` sweep, the id of the sweep's parent run: the one
    ``bidswarm.sweep.SweepParent`` made before the jobs started, else (a launcher without the
    callback) one made by the first job."""
    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    if os.environ.get(PARENT_ENV):
        return os.environ[PARENT_ENV]
    sweep_dir = str(Path(HydraConfig.get().sweep.dir).resolve())
    Path(sweep_dir).mkdir(parents=True, exist_ok=True)
    # Jobs of a parallel launcher (joblib, SLURM arrays) start together: a lock in the sweep
    # folder makes exactly one of them create the parent run, on any store.
    with open(Path(sweep_dir) / ".mlflow_parent.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        client, experiment = open_experiment(uri, experiment_name)
        found = client.search_runs(
            [experiment], filter_string=f"tags.`{SWEEP_TAG}` = '{sweep_dir}'", max_results=1
        )
        if found:
            return found[0].info.run_id
        name = sweep_run_name(list(HydraConfig.get().overrides.task))
        run = client.create_run(experiment, run_name=name, tags={SWEEP_TAG: sweep_dir})
    return run.info.run_id
