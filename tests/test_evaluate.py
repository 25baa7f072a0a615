"""``python -m bidswarm.evaluate``: configs from the run, mixed checkpoints, MLflow, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from bidswarm.agents.population import Population
from bidswarm.config import register_configs
from bidswarm.envs import make_env
from bidswarm.evaluate import (
    build_loop,
    evaluation_run_name,
    register_evaluate_config,
    resolve_from_run,
    run_evaluation,
    validate_evaluation,
)
from bidswarm.rollout.evaluation import evaluate
from bidswarm.rollout.usage import Usage
from bidswarm.statistics import pass_at_k, summarize
from conftest import CONF, ROOT


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A run folder as training leaves it: config, state, ``sft/`` and ``final/`` populations."""
    run_dir = tmp_path_factory.mktemp("run")
    register_configs()
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose(
            "train", overrides=["debug=smoke", "task.max_decisions=6", "model.tiny.hidden_size=32"]
        )
    sections = {key: OmegaConf.to_container(cfg[key]) for key in ("task", "model", "coordination")}
    (run_dir / "resolved_config.yaml").write_text(OmegaConf.to_yaml(sections))
    (run_dir / "state.json").write_text(json.dumps({"mlflow_run_id": "trainingrun0"}))
    env = make_env(OmegaConf.to_object(cfg.task))
    env.reset(0)
    corpus = [env.task_description, *(env.role_description(r) for r in env.roles)]
    corpus += [env.observation(r) for r in env.roles]
    for folder, seed in (("sft", 0), ("final", 1)):
        torch.manual_seed(seed)
        Population.build(cfg.model, list(env.roles), 1, corpus).save_pretrained(run_dir / folder)
    return run_dir


def evaluation_config(run_dir: Path, tmp_path: Path, *overrides: str):
    register_evaluate_config()
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose(
            "evaluate",
            overrides=[
                f"run_dir={run_dir}",
                f"output_dir={tmp_path / 'eval'}",
                f"logger.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
                "max_seeds=2",
                "runs_per_seed=2",
                *overrides,
            ],
        )
    cfg = resolve_from_run(cfg)
    validate_evaluation(cfg)
    return cfg


def test_task_model_and_coordination_default_to_the_runs(finished_run, tmp_path):
    cfg = evaluation_config(finished_run, tmp_path)
    assert cfg.task.max_decisions == 6 and cfg.model.tiny.hidden_size == 32
    assert cfg.coordination.name == "auction"
    swapped = evaluation_config(finished_run, tmp_path, "coordination=round_robin")
    assert swapped.coordination.name == "round_robin" and swapped.task.max_decisions == 6


def test_keys_without_the_group_change_the_runs_section(finished_run, tmp_path):
    cfg = evaluation_config(finished_run, tmp_path, "+model.engine=vllm", "+task.max_decisions=4")
    assert cfg.model.engine == "vllm" and cfg.model.tiny.hidden_size == 32
    assert cfg.model.name == "tiny" and cfg.task.max_decisions == 4
    with pytest.raises(Exception, match="no_such_key"):
        evaluation_config(finished_run, tmp_path, "+model.no_such_key=1")


@pytest.mark.parametrize(
    ("ablation", "bids", "actions", "rule"),
    [
        ("initial_bids", "sft", "final", "auction"),
        ("initial_actions", "final", "sft", "auction"),
        ("initial_both", "sft", "sft", "auction"),
        ("goa", "final", "final", "graph_of_agents"),
        ("agentnet", "final", "final", "agentnet"),
    ],
)
def test_ablations_compose_as_evaluation_configs(
    finished_run, tmp_path, ablation, bids, actions, rule
):
    cfg = evaluation_config(finished_run, tmp_path, f"ablation={ablation}")
    assert (cfg.bids_from, cfg.actions_from, cfg.coordination.name) == (bids, actions, rule)


def same_parameters(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))


def test_bids_and_actions_come_from_the_chosen_checkpoints(finished_run, tmp_path):
    loop = build_loop(evaluation_config(finished_run, tmp_path, "ablation=initial_bids"))
    sft = Population.from_pretrained(finished_run / "sft")
    final = Population.from_pretrained(finished_run / "final")
    assert same_parameters(loop.swarm.bid_population, sft)
    assert same_parameters(loop.swarm.population, final)
    assert not same_parameters(sft, final)


def test_evaluation_is_over_worlds_and_leaves_training_usage_alone(finished_run, tmp_path):
    loop = build_loop(evaluation_config(finished_run, tmp_path))
    training = Usage(rollout_tokens=7, train_tokens=5, rollout_flops=1e6, train_flops=3e6)
    loop.swarm.usage = training
    before = training.as_dict()
    seeds = loop.make_env().heldout_seeds()[:2]
    evaluation = evaluate(loop, seeds, runs_per_seed=3, seed=0)
    assert loop.swarm.usage is training and training.as_dict() == before
    assert evaluation.usage.rollout_tokens > 0 and evaluation.usage.rollout_flops > 0
    assert len(evaluation.episodes) == 6 and sorted(evaluation.world_rewards) == sorted(seeds)
    world = seeds[0]
    runs = [e.total_reward for e in evaluation.episodes if e.seed == world]
    assert evaluation.world_rewards[world] == pytest.approx(sum(runs) / 3)
    over_worlds = summarize(list(evaluation.world_rewards.values()))
    metrics = evaluation.metrics
    assert metrics["worlds"] == 2.0 and metrics["episodes"] == 6.0
    assert metrics["reward/mean"] == pytest.approx(over_worlds.mean)
    assert metrics["reward/se"] == pytest.approx(over_worlds.se)
    assert (metrics["reward/ci_low"], metrics["reward/ci_high"]) == pytest.approx(
        (over_worlds.ci_low, over_worlds.ci_high)
    )
    assert sorted(evaluation.world_pass_at_k) == [1, 2, 3]
    successes = sum(e.metrics["success"] > 0.5 for e in evaluation.episodes if e.seed == world)
    for k, per_world in evaluation.world_pass_at_k.items():
        assert per_world[world] == pytest.approx(pass_at_k(3, successes, k))
        assert sum(per_world.values()) / 2 == pytest.approx(metrics[f"pass_at_{k}/mean"])


def test_evaluation_logs_mean_and_se_tagged_with_the_source_run(
    finished_run, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)  # MLflow's default artifact root is ./mlruns
    cfg = evaluation_config(finished_run, tmp_path, "coordination=round_robin")
    metrics = run_evaluation(cfg)
    assert metrics["episodes"] == 4.0 and metrics["seeds"] == 2.0 and metrics["worlds"] == 2.0
    assert metrics["reward/se"] >= 0.0 and metrics["flops/rollout"] > 0
    # the per-step cost: every decision's tokens and FLOPs, and a wall clock that moved
    decisions = metrics["flops/rollout"] / metrics["flops_per_decision"]
    assert metrics["tokens_per_decision"] * decisions == pytest.approx(metrics["tokens/rollout"])
    assert metrics["seconds_per_decision"] > 0.0
    assert metrics["reward/ci_low"] <= metrics["reward/mean"] <= metrics["reward/ci_high"]
    saved = json.loads((tmp_path / "eval" / "evaluation.json").read_text())
    assert saved == pytest.approx(metrics)
    worlds = json.loads((tmp_path / "eval" / "heldout" / "eval_worlds.json").read_text())
    assert len(worlds) == 2
    assert sum(worlds.values()) / 2 == pytest.approx(metrics["reward/mean"])

    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("bidswarm").experiment_id])
    assert run.data.tags["bidswarm.source_run"] == "trainingrun0"
    assert run.data.tags["bidswarm.kind"] == "evaluate"
    assert run.data.metrics["eval/reward/mean"] == pytest.approx(metrics["reward/mean"])
    assert run.data.params["coordination.name"] == "round_robin"
    logged = client.download_artifacts(run.info.run_id, "heldout/eval_worlds.json", str(tmp_path))
    assert json.loads(Path(logged).read_text()) == worlds
    for k in (1, 2):  # runs_per_seed=2 here
        name = f"heldout/eval_pass_at_{k}_worlds.json"
        logged = client.download_artifacts(run.info.run_id, name, str(tmp_path))
        pass_per_world = json.loads(Path(logged).read_text())
        assert pass_per_world.keys() == worlds.keys()
        assert sum(pass_per_world.values()) / 2 == pytest.approx(metrics[f"pass_at_{k}/mean"])
    # The same evaluation seed replays the same episodes.
    again = run_evaluation(
        evaluation_config(finished_run, tmp_path, "coordination=round_robin", "logger=csv")
    )
    assert again["reward/mean"] == metrics["reward/mean"]
    assert again["tokens/rollout"] == metrics["tokens/rollout"]


def test_evaluation_runs_are_named_after_their_source_arm_and_their_own_overrides(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text(
        "- experiment=tables\n- ablation=monolithic\n- seed=2\n- coordination=auction\n"
    )
    # the evaluation's own value wins where both set a key
    assert evaluation_run_name(run_dir, "coordination=round_robin,dropout=0.5") == (
        "eval experiment=tables,ablation=monolithic,seed=2,coordination=round_robin,dropout=0.5"
    )
    assert evaluation_run_name(run_dir, "default") == (
        "eval experiment=tables,ablation=monolithic,seed=2,coordination=auction"
    )
    # a folder without Hydra's record (a run started from Python) keeps the evaluation's name
    assert evaluation_run_name(tmp_path, "replicas=4") == "eval replicas=4"
    assert evaluation_run_name(tmp_path, "default") == "eval default"


def test_bad_inputs_fail_with_the_key_named(finished_run, tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        build_loop(evaluation_config(finished_run, tmp_path, f"bids_from={tmp_path / 'nowhere'}"))
    with pytest.raises(ValueError, match="monolithic"):
        build_loop(evaluation_config(finished_run, tmp_path, "coordination=monolithic"))
    with pytest.raises(ValueError, match="runs_per_seed"):
        evaluation_config(finished_run, tmp_path, "runs_per_seed=0")
    with pytest.raises(FileNotFoundError, match="run_dir"):
        evaluation_config(tmp_path / "missing", tmp_path)


@pytest.mark.slow
def test_cli_evaluates_a_run_folder(finished_run, tmp_path):
    command = [
        sys.executable,
        "-m",
        "bidswarm.evaluate",
        f"run_dir={finished_run}",
        "max_seeds=1",
        "runs_per_seed=1",
        "coordination=graph_of_agents",
        "logger=csv",
        f"hydra.run.dir={tmp_path / 'cli'}",
    ]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "held-out reward" in result.stdout
    assert json.loads((tmp_path / "cli" / "evaluation.json").read_text())["episodes"] == 1.0


def test_an_evaluation_sweep_ends_its_parent_with_the_arms_summary(finished_run, tmp_path):
    """``python -m bidswarm.evaluate -m run_dir=... coordination=a,b`` as a new user types it:
    the parent run is made before the jobs, named from the sweep's overrides (the folder as
    given), and ends FINISHED after them with each arm's held-out reward."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    command = [
        sys.executable,
        "-m",
        "bidswarm.evaluate",
        "-m",
        f"run_dir={finished_run}",
        "coordination=auction,round_robin",
        "max_seeds=2",
        "runs_per_seed=1",
        f"logger.tracking_uri={uri}",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
    ]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("bidswarm").experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(children) == 2
    parent = parents[0]
    assert parent.info.run_name == (
        f"sweep run_dir={finished_run} coordination=auction,round_robin max_seeds=2 "
        f"runs_per_seed=1 logger.tracking_uri={uri}"
    )
    assert parent.info.status == "FINISHED"
    assert parent.info.end_time >= max(c.info.end_time for c in children)
    for child in children:
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        rule = child.data.params["coordination.name"]
        arm = next(
            k for k in parent.data.metrics if k.endswith("/heldout_reward/mean") and rule in k
        )
        assert parent.data.metrics[arm] == pytest.approx(child.data.metrics["eval/reward/mean"])
    assert "sweep parent run:" in result.stdout


def test_a_held_out_evaluation_shows_its_progress_on_stderr(finished_run, tmp_path, capfd):
    """A run's (and ``bidswarm.evaluate``'s) held-out evaluation draws a bar over its lock-step
    decisions, ``task.max_decisions`` per batch; a plain call draws none."""
    loop = build_loop(evaluation_config(finished_run, tmp_path))
    seeds = loop.make_env().heldout_seeds()[:3]
    evaluate(loop, seeds, runs_per_seed=2, seed=0, batch_size=4)
    assert "held-out" not in capfd.readouterr().err
    evaluate(loop, seeds, runs_per_seed=2, seed=0, batch_size=4, progress=True)
    err = capfd.readouterr().err
    total = 2 * loop.horizon  # 6 episodes in batches of 4: two batches
    assert "held-out: 100%" in err and f"{total}/{total}" in err and "batch=2/2" in err, err[-500:]
