"""The real CLI end to end with tiny budgets: the smoke profile, MLflow contents, resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from conftest import ROOT


def run_cli(tmp_path: Path, *overrides: str, name: str = "run") -> Path:
    """Run ``python -m bidswarm.train`` in a subprocess; return its run folder."""
    run_dir = tmp_path / name
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    command = [sys.executable, "-m", "bidswarm.train", f"hydra.run.dir={run_dir}", *overrides]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return run_dir


def read_state(run_dir: Path) -> dict:
    return json.loads((run_dir / "state.json").read_text())


def test_smoke_runs_the_whole_pipeline_and_logs_to_mlflow(tmp_path):
    run_dir = run_cli(tmp_path, "debug=smoke")
    state = read_state(run_dir)
    assert state["sft_done"] and "eval_before" in state and "eval_after" in state
    assert (run_dir / "checkpoints" / "last.ckpt").exists()
    assert (run_dir / "final").is_dir() and (run_dir / "sft").is_dir()

    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.get_run(state["mlflow_run_id"])
    metrics = run.data.metrics
    for key in (
        "reward/mean",
        "flops/total",
        "tokens/rollout",
        "forks/made",
        "contested_fraction",
        "participation/logger",
        "eval_after/reward/mean",
        "time/rollout",
        "parse_failures/bid",
    ):
        assert key in metrics, f"{key} missing from MLflow metrics {sorted(metrics)}"
    assert run.data.params["rl.fork_budget"] == "2"
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"reward_vs_flops.png", "participation.png", "resolved_config.yaml"} <= artifacts
    assert run.info.run_name == "debug=smoke"


def test_both_update_kinds_change_the_agents(tmp_path):
    run_dir = run_cli(tmp_path, "debug=smoke")
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)
    kinds = [h["update_is_bid"] for h in ckpt["bidswarm"]["history"]]
    assert kinds == [0.0, 1.0]
    from bidswarm.agents.population import Population

    sft = Population.from_pretrained(run_dir / "sft")
    final = Population.from_pretrained(run_dir / "final")
    changed = [
        any(not torch.equal(a, b) for a, b in zip(x.parameters(), y.parameters(), strict=True))
        for x, y in zip(sft.agents, final.agents, strict=True)
    ]
    assert any(changed), "RL changed no agent's parameters"


def test_killed_run_resumes_to_the_same_result(tmp_path):
    common = ["debug=smoke", "rl.cycles=2", "eval.before_rl=false"]
    whole = read_state(run_cli(tmp_path, *common, name="whole"))
    part_dir = run_cli(tmp_path, *common, "rl.stop_after=2", name="part")
    assert "eval_after" not in read_state(part_dir)
    run_cli(tmp_path, *common, f"resume={part_dir}", name="resumed")
    resumed = read_state(part_dir)
    assert resumed["eval_after"] == whole["eval_after"]
