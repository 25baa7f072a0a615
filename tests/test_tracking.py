"""MLflow as the lab notebook (docs/mlflow.md): a real sweep's parent run and its summary, the
children's params, episode transcripts as traces, where artifacts go; and the pieces alone."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from bidswarm import tracking, transcripts
from bidswarm.config.schemas import FOLDER_NAME_CHARS, folder_name
from bidswarm.coordination.base import Decision
from bidswarm.rollout.records import Bid, Episode, Reply, StepRecord
from bidswarm.sweep import arm_metric_name
from conftest import ROOT, sweep_command


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> tuple[str, Path]:
    """A real two-job sweep (two arms, one seed) into a fresh sqlite store: (URI, its folder)."""
    root = tmp_path_factory.mktemp("sweep")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "OMP_NUM_THREADS": "1"}
    command = sweep_command(
        root / "sweep",
        "debug=smoke",
        "ablation=none,random_credit",
        "seed=0",
        "task.n_heldout_seeds=2",
        "sft.demo_episodes=2",
        "eval.every=1",
        # agents this barely trained rarely reply a bid that parses below the runner-up, which
        # the default redraw needs: a draw among the levels below plays every chosen fork
        "rl.bid_resample=below_runner_up",
    )
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    (root / "console.txt").write_text(result.stdout + result.stderr)
    return uri, root


def runs_of(uri: str):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("bidswarm")
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if tracking.SWEEP_TAG in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    return client, experiment, parents, children


def test_sweep_parent_is_named_from_the_sweep_and_summarises_its_arms(sweep):
    uri, _ = sweep
    client, _, parents, children = runs_of(uri)
    assert len(parents) == 1 and len(children) == 2
    parent = parents[0]
    assert parent.info.run_name == (
        "sweep debug=smoke ablation=none,random_credit seed=0 task.n_heldout_seeds=2 "
        "sft.demo_episodes=2 eval.every=1 rl.bid_resample=below_runner_up"
    )
    assert parent.info.status == "FINISHED"
    # It ended after its last child, not when it was made.
    assert parent.info.end_time >= max(c.info.end_time for c in children)
    for arm, child in (
        ("ablation-none", "ablation=none"),
        ("ablation-random_credit", "ablation=random_credit"),
    ):
        run = next(c for c in children if c.info.run_name.startswith(child))
        after = run.data.metrics["eval_after/reward/mean"]
        assert parent.data.metrics[f"arm/{arm}/heldout_reward/mean"] == pytest.approx(after)
        assert parent.data.metrics[f"arm/{arm}/runs"] == 1.0
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id, "summary")}
    assert {"summary/report.md", "summary/arms.json", "summary/reward_vs_flops.png"} <= artifacts
    report = Path(client.download_artifacts(parent.info.run_id, "summary/report.md"))
    assert "| ablation=random_credit |" in report.read_text()


def test_children_params_have_no_paths_or_none_and_name_their_setting(sweep):
    uri, _ = sweep
    _, _, _, children = runs_of(uri)
    for child in children:
        params = child.data.params
        assert "output_dir" not in params and "resume" not in params
        assert "None" not in params.values()
        assert "model/sft_epochs" not in params and params["sft/epochs"] == "4"
        assert params["ablation"] in ("none", "random_credit") and params["experiment"] == "none"
        assert params["agents/roles"] == "logger,miner,smith"
        assert int(params["agents/agent0_logger/params"]) > 0
        assert params["system/torch_threads"] == "1"  # OMP_NUM_THREADS=1, a sequential sweep
        assert child.data.tags[tracking.OVERRIDES_TAG].startswith("debug=smoke ablation=")
        assert "epoch" not in child.data.metrics and "update" not in child.data.metrics
        assert any(key.startswith("system/cpu") for key in child.data.metrics), "no system metrics"


def test_each_sampled_episode_is_a_trace_with_a_span_per_step(sweep):
    uri, _ = sweep
    client, experiment, _, children = runs_of(uri)
    for child in children:
        traces = client.search_traces(
            locations=[experiment.experiment_id],
            filter_string=f"metadata.`mlflow.sourceRun` = '{child.info.run_id}'",
        )
        for trace in traces:
            root = next(s for s in trace.data.spans if s.parent_id is None)
            assert len(trace.data.spans) == 1 + root.outputs["steps"]
        artifacts = {a.path for a in client.list_artifacts(child.info.run_id, "transcripts")}
        evaluations = [t for t in traces if "bidswarm.evaluation" in t.info.tags]
        # Two held-out worlds x one run each, three evaluations (before, during, after RL).
        assert len(evaluations) == 6
        # The last bid update's forks: the recorded and the counterfactual branch of each
        # played fork (at most three forks).
        played = client.get_metric_history(child.info.run_id, "forks/resampled_below")[-1].value
        forks = [t for t in traces if "bidswarm.forks" in t.info.tags]
        assert played > 0, "no fork was played: nothing to check"
        assert len(forks) == 2 * min(3, int(played))
        pages = {f"transcripts/{key}.html" for key in ("eval_before", "eval_during", "eval_after")}
        assert artifacts == pages | ({"transcripts/forks.html"} if played else set())


def test_artifacts_go_beside_the_store_not_into_mlruns(sweep):
    uri, root = sweep
    _, experiment, parents, children = runs_of(uri)
    assert Path(experiment.artifact_location) == root / "mlartifacts"
    for run in parents + children:
        assert Path(run.info.artifact_uri).is_relative_to(root / "mlartifacts")
    assert (root / "mlartifacts" / children[0].info.run_id / "artifacts" / "final").is_dir()
    assert not (ROOT / "mlruns").exists() or not any(
        (ROOT / "mlruns").glob(f"*/{children[0].info.run_id}")
    )
    log = next((root / "sweep").glob("0_*/train.log")).read_text()
    assert "[bidswarm] eval_after: held-out reward" in log


def test_the_default_store_keeps_artifacts_under_outputs():
    location = tracking.artifact_location(tracking.DEFAULT_TRACKING_URI)
    assert Path(location) == (Path("outputs") / "mlartifacts").resolve()
    assert tracking.artifact_location("http://127.0.0.1:5000") is None


def test_params_drop_paths_none_and_superseded_model_defaults():
    cfg = OmegaConf.create(
        {
            "output_dir": "/somewhere/run",
            "resume": None,
            "logger": {"name": "mlflow", "tracking_uri": None},
            "model": {"name": "tiny", "sft_epochs": 6, "path": None},
            "sft": {"epochs": 4},
            "seed": 3,
        }
    )
    params = tracking.run_params(cfg, {"ablation": "random_credit", "experiment": None})
    assert params == {
        "model/name": "tiny",
        "sft/epochs": 4,
        "seed": 3,
        "ablation": "random_credit",
        "experiment": "none",
        "debug": "none",
    }


def test_arm_names_become_valid_metric_names():
    assert arm_metric_name("ablation=random_credit") == "ablation-random_credit"
    assert arm_metric_name("mpt (defaults)") == "mpt _defaults_"
    assert arm_metric_name("a=1,b=2") == "a-1 b-2"
    # a one-arm sweep's arm is named by every override, a tracking URI among them
    long = "coordination=graph_of_agents,logger.tracking_uri=sqlite:////" + "x/" * 150
    other = long + "y"  # differs only past the cut: the hash keeps them apart
    name = arm_metric_name(long)
    assert len(f"arm/{name}/heldout_reward/ci_high") <= 250
    assert name.startswith("coordination-graph_of_agents logger.tracking_uri-sqlite")
    assert arm_metric_name(other) != name and len(arm_metric_name(other)) == len(name)


def test_a_transcript_shows_bids_actor_action_reply_reward_and_credit():
    def reply(agent: int, text: str) -> Reply:
        return Reply(agent, [1], [2], text)

    contested = StepRecord(
        0,
        Decision(actor=1, winning_bid=0.6, runner_up=0, runner_up_bid=0.2),
        bids={0: Bid(0.2, reply(0, "0.2"), True), 1: Bid(0.6, reply(1, "0.6"), True)},
        action=reply(1, "mine stone"),
        reward=1.0,
        message="you mined 1 stone",
    )
    skipped = StepRecord(1, Decision(actor=None), bids={0: Bid(0.0, reply(0, "??"), False)})
    episode = Episode(seed=7, steps=[contested, skipped])
    written = transcripts.transcript(episode, "eval_after episode 0", ["logger", "miner"], {0: 0.4})
    first, second = written.steps
    assert first.bids == {"agent0_logger": "0.2", "agent1_miner": "0.6"}
    assert (first.actor, first.action, first.reply) == (
        "agent1_miner",
        "mine stone",
        "you mined 1 stone",
    )
    assert (first.reward, first.credit) == (1.0, 0.4)
    assert second.actor == "nobody (skipped)" and second.credit is None
    assert second.bids == {"agent0_logger": "malformed: '??'"}
    page = transcripts.render_html("eval_after", [written])
    assert "world 7, total reward 1" in page and "you mined 1 stone" in page


def test_the_console_shows_our_lines_and_no_library_chatter(sweep):
    _, root = sweep
    console = (root / "console.txt").read_text()
    assert "[bidswarm] eval_after: held-out reward" in console
    assert "[bidswarm] sweep parent run: http://127.0.0.1:5000/#/experiments/" in console
    for chatter in (
        "litlogger",
        "GPU available",
        "TPU available",
        "module(s) in eval mode",
        "_pytree",
        "Experiment with name",
        "Creating initial MLflow database tables",
        "real_accelerator",
        "Writing model shards",
    ):
        assert chatter not in console, f"{chatter!r} reached the console"
    # ... it went to the jobs' train.log instead.
    log = next((root / "sweep").glob("0_*/train.log")).read_text()
    assert "GPU available" in log


def test_held_out_evaluations_sit_at_their_update_on_the_training_axis(sweep):
    uri, _ = sweep
    client, _, _, children = runs_of(uri)
    for child in children:
        steps = {
            key: [m.step for m in client.get_metric_history(child.info.run_id, key)]
            for key in (
                "reward/mean",
                *(f"{e}/reward/mean" for e in ("eval_before", "eval_during", "eval_after")),
            )
        }
        # debug=smoke: two updates (0, 1); eval.every=1 evaluates after the first.
        assert steps == {
            "reward/mean": [0, 1],
            "eval_before/reward/mean": [0],
            "eval_during/reward/mean": [1],
            "eval_after/reward/mean": [2],
        }


def test_a_sweep_whose_job_fails_ends_its_parent_failed(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    command = sweep_command(
        tmp_path / "sweep",
        "debug=smoke",
        "rl.envs_per_update=0",  # refused by the job's own check, before any model loads
    )
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    _, _, parents, _ = runs_of(uri)
    assert [p.info.status for p in parents] == ["FAILED"]
    assert parents[0].info.run_name == "sweep debug=smoke rl.envs_per_update=0"


def test_a_sweep_job_with_a_long_override_list_gets_a_folder_it_can_make(tmp_path):
    """Hydra names a job's folder after its overrides; past the file system's 255 bytes the
    job failed with "File name too long" before it ran. The name is now cut and ended by a
    hash: the job gets its folder and runs (here into its own config check, before any model)."""
    long_name = "x" * 240
    command = sweep_command(
        tmp_path / "sweep",
        "debug=smoke",
        "rl.envs_per_update=0",
        f"logger.experiment_name={long_name}",
    )
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert "File name too long" not in result.stderr, result.stderr[-2000:]
    assert "rl.envs_per_update" in result.stderr  # the job ran: its own check refused it
    (folder,) = [p for p in (tmp_path / "sweep").iterdir() if p.is_dir()]
    assert folder.name.startswith("0_debug=smoke,logger.experiment_name=xxx")
    assert len(folder.name) == FOLDER_NAME_CHARS and folder.name[-9] == "~"
    assert (folder / ".hydra" / "overrides.yaml").exists()


def test_long_folder_names_are_cut_to_distinct_names():
    short = "0_seed=1,rl.lr=1e-4"
    assert folder_name(short) == short
    one, other = "0_" + "a=1," * 80 + "b=1", "0_" + "a=1," * 80 + "b=2"
    assert len(folder_name(one)) == FOLDER_NAME_CHARS and folder_name(one) != folder_name(other)
    wide = "0_name=" + "é" * 150  # 2 bytes a character: cut to 255 bytes as well
    assert len(folder_name(wide).encode()) <= 255


def test_a_sweep_parent_names_its_folders_short(tmp_path):
    runs = [tmp_path / "multirun" / name for name in ("0_seed=0,ablation=none", "1_seed=1")]
    for run in runs:
        run.mkdir(parents=True)
    quoted = ",".join(f"'{run}'" for run in runs)
    assert (
        tracking.sweep_run_name(
            ["experiment=table2", f"run_dir={quoted}", "coordination=auction,agentnet"], tmp_path
        )
        == "sweep experiment=table2 run_dir=<2 folders in multirun> coordination=auction,agentnet"
    )
    # one folder inside the working directory: relative; outside it, or not a folder: as given
    assert tracking.sweep_run_name([f"run_dir='{runs[0]}'"], tmp_path) == (
        "sweep run_dir=multirun/0_seed=0,ablation=none"
    )
    assert tracking.sweep_run_name([f"run_dir='{runs[1]}'"], tmp_path / "elsewhere") == (
        f"sweep run_dir={runs[1]}"
    )
    uri = f"logger.tracking_uri=sqlite:///{tmp_path}/mlflow.db"
    assert tracking.sweep_run_name([uri, "seed=0,1"], tmp_path) == f"sweep {uri} seed=0,1"


FIRST_USE = """
import sys, time
from pathlib import Path
import mlflow.tracking
from bidswarm import tracking
go = Path(sys.argv[2])
Path(sys.argv[3]).touch()
while not go.exists():
    time.sleep(0.01)
client, experiment = tracking.open_experiment(sys.argv[1], "bidswarm")
print(experiment)
"""


def test_runs_started_together_on_a_new_store_share_one_experiment(tmp_path):
    """Two plain runs (or a parallel launcher's jobs, or a sweep beside a run) that first use a
    new sqlite store at the same moment: MLflow's table migrations and the experiment's
    creation fail when two processes run them at once, so they go one at a time."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    go = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    ready = [tmp_path / f"ready{index}" for index in range(4)]
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", FIRST_USE, uri, str(go), str(flag)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for flag in ready
    ]
    deadline = time.monotonic() + 120
    while not all(flag.exists() for flag in ready) and time.monotonic() < deadline:
        time.sleep(0.05)  # every process has imported MLflow and waits for `go`
    go.touch()
    results = [process.communicate(timeout=120) for process in processes]
    for process, (_, err) in zip(processes, results, strict=True):
        assert process.returncode == 0, err[-2000:]
    assert len({out.strip() for out, _ in results}) == 1
