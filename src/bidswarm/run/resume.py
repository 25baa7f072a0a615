"""Continuing a run, and starting one from another's agents: what ``resume=`` and ``init_from=``
must name (checked by :func:`bidswarm.run.preflight.preflight` before anything is made), the
run's folder and its ``state.json``, written atomically (docs/reliability.md)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from bidswarm.agents.population import POPULATION_FILE
from bidswarm.coordination import RULES
from bidswarm.envs import env_class
from bidswarm.envs.base import MONOLITHIC
from bidswarm.lit.callbacks import resume_checkpoint


class ResumeError(ValueError):
    """``resume=`` names no run, or a run this config cannot continue."""


METHOD_KEYS = ("task", "model", "coordination", "credit", "seed", "sft", "rl", "init_from")
"""Config sections that define the method: a resumed run must keep them."""
RESUMABLE_CHANGES = (
    "rl.cycles",
    "rl.stop_after",
    "rl.flop_budget",
    "rl.checkpoint_every",
    "model.torch_threads",
)
"""Keys of those sections a resumed run may change (length of the schedule, speed)."""


def check_resume(cfg: DictConfig) -> None:
    """``resume=`` must name a folder that holds a run (its ``state.json``) trained with the
    same method as ``cfg``, whose last checkpoint (if any) is complete; raises
    :class:`ResumeError` naming the path or the keys (:class:`CheckpointError` naming the
    checkpoint). Creates nothing."""
    if cfg.resume is None:
        return
    folder = Path(cfg.resume)
    if not folder.is_dir():
        raise ResumeError(f"resume={cfg.resume}: no such folder; pass the folder of a run")
    if not (folder / "state.json").is_file():
        raise ResumeError(
            f"resume={cfg.resume}: the folder holds no run (no state.json); pass the folder of "
            "a run (outputs/runs/<day>/<time>)"
        )
    check_same_method(cfg, folder)
    # A truncated checkpoint is named before anything loads (fit checks every record).
    resume_checkpoint(folder / "checkpoints", full=False)


def check_resumed_tracking(cfg: DictConfig, uri: str) -> None:
    """A resumed run goes on logging into the MLflow run it started (``mlflow_run_id`` in its
    ``state.json``): that run must be in the store at ``uri`` and not deleted, or the first
    update's metrics would fail after the models have loaded. Raises :class:`ResumeError`
    naming the run and the fix. Loads no model."""
    if cfg.resume is None:
        return
    run_id = load_state(Path(cfg.resume)).get("mlflow_run_id")
    if run_id is None:
        return
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    try:
        run = MlflowClient(uri).get_run(run_id)
    except MlflowException:
        raise ResumeError(
            f"resume={cfg.resume}: its MLflow run {run_id} is not in the tracking store {uri}; "
            "resume with the store it was logged to (logger.tracking_uri or "
            "MLFLOW_TRACKING_URI)"
        ) from None
    if run.info.lifecycle_stage == "deleted":
        raise ResumeError(
            f"resume={cfg.resume}: its MLflow run {run_id} was deleted; restore it "
            f"(MLFLOW_TRACKING_URI={uri} mlflow runs restore --run-id {run_id}) and resume "
            "again, or start a new run without resume="
        )


class InitFromError(ValueError):
    """``init_from=`` names no finished run, or one whose agents this config cannot start from."""


def init_population_folder(cfg: DictConfig) -> Path | None:
    """The ``final/`` population that ``init_from=`` starts the run from (None without it)."""
    return None if cfg.init_from is None else Path(cfg.init_from) / "final"


def check_init_from(cfg: DictConfig) -> None:
    """``init_from=`` must name a finished run (its ``final/population.json``) of the same model
    whose roles are this config's (one agent per role, or the monolithic agent); raises
    :class:`InitFromError` naming the key and what differs. Loads no model."""
    folder = init_population_folder(cfg)
    if folder is None:
        return
    meta_file = folder / POPULATION_FILE
    if not meta_file.is_file():
        raise InitFromError(
            f"init_from={cfg.init_from}: no finished run there (no {meta_file}); pass the "
            "folder of a training run that saved its final/ population"
        )
    roles = json.loads(meta_file.read_text())["roles"]
    rule = RULES[cfg.coordination.name]
    wanted = [MONOLITHIC] if rule.monolithic else list(env_class(cfg.task.name).roles)
    if roles != wanted:
        raise InitFromError(
            f"init_from={cfg.init_from}: its agents have roles {roles}, coordination="
            f"{cfg.coordination.name} on task {cfg.task.name} needs {wanted} (one agent per "
            "role; replicas are copied from it)"
        )
    saved_file = Path(cfg.init_from) / "resolved_config.yaml"
    if saved_file.is_file():
        saved_model = OmegaConf.load(saved_file).model.name
        if saved_model != cfg.model.name:
            raise InitFromError(
                f"init_from={cfg.init_from}: trained model.name={saved_model!r}, this run "
                f"has model.name={cfg.model.name!r}"
            )


def check_same_method(cfg: DictConfig, folder: Path) -> None:
    """Refuse to continue the run of ``folder`` with a config whose method differs."""
    saved_file = folder / "resolved_config.yaml"
    if not saved_file.is_file():
        return
    saved = OmegaConf.load(saved_file)
    changed = method_changes(saved, cfg)
    if changed:
        raise ResumeError(
            f"resume={folder}: the run was trained with other values of keys that change the "
            "method:\n  " + "\n  ".join(changed) + "\nresume with the run's values, or start "
            "a new run without resume="
        )


def run_folder(cfg: DictConfig) -> Path:
    """The run's folder: ``resume=`` (checked by :func:`check_resume`), else ``output_dir``.

    Without ``resume=``, a folder that already holds a run continues it (a requeued SLURM job
    restarts in its own folder): only with the same method (:func:`check_same_method`). This
    is checked here, not at preflight: Hydra names ``output_dir`` only once the job starts.
    """
    run_dir = Path(cfg.resume or cfg.output_dir)
    if cfg.resume is None and (run_dir / "state.json").is_file():
        check_same_method(cfg, run_dir)
    return run_dir


def method_changes(saved: DictConfig, cfg: DictConfig) -> list[str]:
    """``key: saved -> now`` for each method key (:data:`METHOD_KEYS`) both configs have whose
    value differs, except :data:`RESUMABLE_CHANGES`. Keys only one of them has are skipped (a
    field added to a schema after the run started)."""
    before = _flat({key: _resolved(saved, key) for key in METHOD_KEYS if key in saved})
    now = _flat({key: _resolved(cfg, key) for key in METHOD_KEYS})
    return [
        f"{key}: {before[key]!r} -> {now[key]!r}"
        for key in sorted(before.keys() & now.keys())
        if before[key] != now[key] and key not in RESUMABLE_CHANGES
    ]


def _resolved(cfg: DictConfig, key: str) -> Any:
    node = cfg[key]
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat |= _flat(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def load_state(run_dir: Path) -> dict[str, Any]:
    """The run's ``state.json`` (empty for a new run); a clear error naming a damaged one."""
    path = run_dir / "state.json"
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ResumeError(f"{path} is damaged ({error}); it is not a run state") from None


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` by ``text`` so that a kill at any moment leaves the old or the new file."""
    partial = path.with_name(path.name + ".partial")
    with open(partial, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, path)
