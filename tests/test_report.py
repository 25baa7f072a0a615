"""``bidswarm.report`` (``scripts/report.py``): strategies pooled over seeds, statistics over
(training seed, world) cells, paired differences to a reference strategy, the plots,
a real sweep."""

from __future__ import annotations

import importlib.util
import math
import os
import random
import subprocess
import sys

import pytest

from bidswarm import statistics, tracking
from bidswarm.report import command, figures, provenance, reading, strategies, tables
from conftest import ROOT, sweep_command


def test_overrides_every_run_shares_do_not_name_a_strategy():
    runs = [
        reading.RunResult(str(i), reading.strategy_of(name), 1.0, 0.1, 1e9)
        for i, name in enumerate(
            [
                "experiment=tables,seed=0",
                "experiment=tables_monolithic,seed=0",
                "experiment=tables,seed=1",
            ]
        )
    ]
    assert sorted(reading.group_by_strategy(runs)) == [
        "experiment=tables",
        "experiment=tables_monolithic",
    ]
    same = [
        reading.RunResult("a", "experiment=tables,ablation=none", 1.0, 0.1, 1e9),
        reading.RunResult("b", "experiment=tables,ablation=random_credit", 1.0, 0.1, 1e9),
    ]
    assert sorted(reading.group_by_strategy(same)) == ["ablation=none", "ablation=random_credit"]


def test_strategy_pools_seeds_evaluation_sizes_and_threads():
    assert reading.strategy_of("ablation=monolithic,seed=2") == "ablation=monolithic"
    assert reading.strategy_of("model.torch_threads=1,rl.lr=1e-05,seed=1") == "rl.lr=1e-05"
    assert reading.strategy_of("experiment=tables,seed=0") == "experiment=tables"
    assert reading.strategy_of("eval coordination=agentnet,max_seeds=8") == "coordination=agentnet"
    assert reading.strategy_of("default") == reading.DEFAULT_STRATEGY


def result(strategy: str, mean: float, se: float = 0.5, flops: float = 1e9):
    return reading.RunResult("id", strategy, mean, se, flops)


def test_without_world_rewards_the_summary_is_over_runs_and_names_the_winner():
    groups = reading.group_by_strategy(
        [result("a", 4.0), result("a", 6.0), result("b", 2.0, se=0.25), result("c", None)]
    )
    rows = strategies.strategy_rows(groups)
    assert [r.strategy for r in rows] == ["a", "b"]
    assert rows[0].mean == 5.0 and rows[0].se == pytest.approx(1.0) and rows[0].runs == 2
    assert rows[1].se == 0.25, "one run keeps its own SE over worlds"
    table = tables.markdown_table(rows)
    # t_{0.975, 1} = 12.706: 5 +- 12.71.
    assert "| a | 5.00 ± 1.00 | -7.71 .. 17.71 | 2 runs | 2 | 1e+09 | best |" in table
    assert "| b | 2.00 ± 0.25 | n/a | 1 run¹ | 1 | 1e+09 | -3.00 |" in table
    assert table.endswith(f"¹ {strategies.ONE_SEED}.")
    assert "**a**" in tables.verdict(rows) and "+3.00 (+150%)" in tables.verdict(rows)
    assert "no interval to tell them apart" in tables.verdict(rows)


def trained(strategy: str, seed: int | None, worlds: dict[int, float] | None) -> reading.RunResult:
    mean = sum(worlds.values()) / len(worlds) if worlds else 1.0
    return reading.RunResult(
        f"{strategy}/{seed}", strategy, mean, 0.5, 1e9, training_seed=seed, world_rewards=worlds
    )


def test_cells_pair_strategies_by_training_seed_and_world():
    base = {10: 2.0, 11: 4.0, 12: 9.0}
    runs = [
        trained(reading.DEFAULT_STRATEGY, 0, base),
        trained(reading.DEFAULT_STRATEGY, 1, {w: r + 1 for w, r in base.items()}),
        trained("better", 0, {w: r + 3 for w, r in base.items()}),
        trained("better", 1, {w: r + 4 for w, r in base.items()}),
        trained("better", 1, {w: r + 4 for w, r in base.items()}),  # same seed again: averaged
        trained("elsewhere", 7, base),
        trained("old", 0, None),
    ]
    rows = strategies.strategy_rows(reading.group_by_strategy(runs))
    by_name = {row.strategy: row for row in rows}
    default = by_name[reading.DEFAULT_STRATEGY]
    # Two training seeds: the two-way cluster bootstrap over seeds and worlds, not the t
    # interval over the 6 cells taken as independent.
    expected = statistics.clustered_summary(default.cells)
    assert default.n == 6 and default.unit == "cells" and default.cells[(1, 12)] == 10.0
    assert default.seeds == 2 and default.counts_seeds
    assert (default.mean, default.se, default.ci_low, default.ci_high) == pytest.approx(
        (expected.mean, expected.se, expected.ci_low, expected.ci_high)
    )
    assert by_name["better"].n == 6 and by_name["better"].runs == 3
    assert by_name["old"].unit == "runs" and not by_name["old"].cells
    # One training seed: the t interval over its worlds, labelled as such.
    lone = statistics.summarize(list(base.values()))
    assert by_name["elsewhere"].seeds == 1 and not by_name["elsewhere"].counts_seeds
    assert (by_name["elsewhere"].se, by_name["elsewhere"].ci_low) == pytest.approx(
        (lone.se, lone.ci_low)
    )
    table = tables.markdown_table(rows)
    assert "| 2 seeds, 6 cells |" in table and "| 1 seed, 3 worlds¹ |" in table
    assert f"¹ {strategies.ONE_SEED}." in table

    reference = strategies.reference_strategy(rows, None)
    assert reference == reading.DEFAULT_STRATEGY, "the MPT defaults, although not the best"
    differences = {d.strategy: d.difference for d in strategies.paired_differences(rows, reference)}
    assert differences["better"].mean == pytest.approx(3.0) and differences["better"].n == 6
    assert differences["better"].verdict == f"better > {reading.DEFAULT_STRATEGY}"
    assert differences["elsewhere"] is None and differences["old"] is None
    table = tables.difference_table(strategies.paired_differences(rows, reference), reference)
    assert f"| better | +3.00 | +3.00 .. +3.00 | 6 | better > {reference} |" in table
    assert "| old | n/a | n/a | 0 | not paired: no shared cell |" in table

    assert strategies.reference_strategy(rows, "better") == "better"
    with pytest.raises(SystemExit, match="nothing"):
        strategies.reference_strategy(rows, "nothing")
    without_default = [row for row in rows if row.strategy != reading.DEFAULT_STRATEGY]
    assert strategies.reference_strategy(without_default, None) == without_default[0].strategy


def test_a_setting_as_reference_pairs_each_strategy_within_the_levels_of_the_others():
    base = {10: 2.0, 11: 4.0, 12: 9.0}

    def arm(labels: str, ablation: str, gain: float) -> list[reading.RunResult]:
        name = f"labels={labels},ablation={ablation}"
        return [
            trained(name, seed, {w: r + gain + seed for w, r in base.items()}) for seed in (0, 1)
        ]

    runs = [
        *arm("paper", "none", 3.0),
        *arm("paper", "initial_bids", 1.0),
        *arm("tie", "none", 10.0),
        *arm("tie", "initial_bids", 2.0),
        *arm("tie", "monolithic", 0.0),
        trained("labels=other,ablation=none", 0, base),  # no initial_bids of its own
    ]
    rows = strategies.strategy_rows(reading.group_by_strategy(runs))
    reference = strategies.reference_strategy(rows, "ablation=initial_bids")
    differences = {d.strategy: d for d in strategies.paired_differences(rows, reference)}
    assert set(differences) == {
        "labels=paper,ablation=none",
        "labels=tie,ablation=none",
        "labels=tie,ablation=monolithic",
    }
    paper, tie = differences["labels=paper,ablation=none"], differences["labels=tie,ablation=none"]
    assert paper.reference == "labels=paper,ablation=initial_bids"
    assert paper.difference.mean == pytest.approx(2.0) and paper.difference.n == 6
    assert tie.reference == "labels=tie,ablation=initial_bids"
    assert tie.difference.mean == pytest.approx(8.0)
    assert differences["labels=tie,ablation=monolithic"].difference.mean == pytest.approx(-2.0)
    table = tables.difference_table(list(differences.values()), reference)
    assert "the strategy that differs only in **ablation=initial_bids**" in table
    assert "| labels=paper,ablation=none | labels=paper,ablation=initial_bids | +2.00 |" in table
    # a strategy is still a reference of its own; a setting no strategy has is refused
    assert {
        d.reference for d in strategies.paired_differences(rows, "labels=other,ablation=none")
    } == {"labels=other,ablation=none"}
    with pytest.raises(SystemExit, match="nor a setting"):
        strategies.reference_strategy(rows, "ablation=nothing")


def test_arms_that_differ_in_more_than_the_reference_are_paired_by_the_keys_given():
    """MPT arms (``replicas``) against the monolithic agent (none) at each dropout level:
    ``pair_by`` pairs each with the monolithic arm of the same dropout, never across levels."""
    base = {10: 2.0, 11: 4.0, 12: 9.0}

    def arm(name: str, gain: float) -> list[reading.RunResult]:
        return [
            trained(name, seed, {w: r + gain + seed for w, r in base.items()}) for seed in (0, 1)
        ]

    runs = [
        *arm("ablation=none,dropout=0.3,replicas=4", 9.0),
        *arm("ablation=none,dropout=0.3,replicas=1", 5.0),
        *arm("ablation=none,dropout=0.7,replicas=4", 7.0),
        *arm("ablation=none,replicas=4", 12.0),  # dropout at its default: the reference's too
        *arm("ablation=monolithic,dropout=0.3", 1.0),
        *arm("ablation=monolithic", 3.0),
    ]  # no monolithic arm at dropout 0.7: that MPT arm stays unpaired
    rows = strategies.strategy_rows(reading.group_by_strategy(runs))
    # alone, the reference names the one monolithic arm at the default dropout
    assert {d.reference for d in strategies.paired_differences(rows, "ablation=monolithic")} == {
        "ablation=monolithic"
    }
    reference = strategies.reference_strategy(rows, "ablation=monolithic", ["dropout"])
    differences = {
        d.strategy: d for d in strategies.paired_differences(rows, reference, ["dropout"])
    }
    assert {name: d.reference for name, d in differences.items()} == {
        "ablation=none,dropout=0.3,replicas=4": "ablation=monolithic,dropout=0.3",
        "ablation=none,dropout=0.3,replicas=1": "ablation=monolithic,dropout=0.3",
        "ablation=none,replicas=4": "ablation=monolithic",
    }
    assert differences["ablation=none,dropout=0.3,replicas=4"].difference.mean == pytest.approx(8)
    assert differences["ablation=none,replicas=4"].difference.mean == pytest.approx(9.0)
    table = tables.difference_table(list(differences.values()), reference, ["dropout"])
    assert "the strategy with **ablation=monolithic** and the same **dropout**" in table
    with pytest.raises(SystemExit, match="needs one setting"):
        strategies.reference_strategy(rows, "ablation=none,replicas=4", ["dropout"])
    with pytest.raises(SystemExit, match="droput"):
        strategies.reference_strategy(rows, "ablation=monolithic", ["droput"])


def log_training_run(client, experiment_id, name, rewards, parent=None, worlds=None):
    """A training run's metrics, and when ``worlds`` its per-world held-out rewards after RL."""
    tags = {"mlflow.parentRunId": parent} if parent else {}
    run = client.create_run(experiment_id, run_name=name, tags=tags)
    if worlds is not None:
        worlds_json = {str(w): r for w, r in worlds.items()}
        client.log_dict(run.info.run_id, worlds_json, "heldout/eval_after_worlds.json")
    for step, reward in enumerate(rewards):
        for key, value in (
            ("reward/mean", reward),
            ("reward/se", 0.1),
            ("flops/total", 1e6 * (step + 1)),
            ("participation/miner", 0.5),
        ):
            client.log_metric(run.info.run_id, key, value, step=step)
    client.log_metric(run.info.run_id, "eval_after/reward/mean", rewards[-1])
    client.log_metric(run.info.run_id, "eval_after/reward/se", 0.2)
    return run.info.run_id


def test_report_from_an_mlflow_experiment_and_from_a_sweep_parent(tmp_path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment_id = client.create_experiment("grid", str(tmp_path / "artifacts"))
    parent = client.create_run(experiment_id, run_name="sweep", tags={"bidswarm.sweep_dir": "x"})
    parent_id = parent.info.run_id
    source = log_training_run(
        client, experiment_id, "seed=0", [1.0, 3.0], parent_id, {10: 2.0, 11: 4.0}
    )
    log_training_run(client, experiment_id, "seed=1", [1.0, 5.0], parent_id, {10: 4.0, 11: 6.0})
    # Logged before per-world rewards existed: summarized from its own SE, never paired.
    log_training_run(client, experiment_id, "ablation=monolithic,seed=0", [1.0, 1.5], parent_id)
    log_training_run(client, experiment_id, "unrelated", [9.0])  # not in the sweep
    evaluation = client.create_run(
        experiment_id,
        run_name="eval coordination=round_robin",
        tags={"bidswarm.kind": "evaluate", "bidswarm.source_run": source},
    )
    client.log_metric(evaluation.info.run_id, "eval/reward/mean", 2.0)
    client.log_metric(evaluation.info.run_id, "eval/reward/se", 0.3)
    client.log_dict(evaluation.info.run_id, {"10": 1.0, "11": 3.0}, "heldout/eval_worlds.json")

    text = command.write_report(client, parent_id, [], tmp_path / "sweep")
    # Cells 2, 4 (seed 0) and 4, 6 (seed 1): two-way cluster bootstrap over seeds and worlds.
    s = statistics.clustered_summary({(0, 10): 2.0, (0, 11): 4.0, (1, 10): 4.0, (1, 11): 6.0})
    assert (
        f"| mpt (defaults) | 4.00 ± {s.se:.2f} | {s.ci_low:.2f} .. {s.ci_high:.2f} "
        "| 2 seeds, 4 cells | 2 | 2e+06 | best |"
    ) in text
    assert "| ablation=monolithic | 1.50 ± 0.20 | n/a | 1 run¹ | 1 | 2e+06 | -2.50 |" in text
    assert "| − mpt (defaults) |" in text
    assert "| ablation=monolithic | n/a | n/a | 0 | not paired: no shared cell |" in text
    assert "unrelated" not in text and "round_robin" not in text
    for name in ("report.md", "reward_vs_flops.png", "participation.png"):
        assert (tmp_path / "sweep" / name).stat().st_size > 0
    assert (tmp_path / "sweep" / "report.md").read_text() == text + "\n"

    text = command.write_report(client, None, ["grid"], tmp_path / "all")
    # One training seed (its source run's, 0), worlds 1 and 3: SE 1, half width
    # t_{0.975, 1} = 12.71, labelled as over worlds only; the FLOPs of its source run.
    assert (
        "| coordination=round_robin | 2.00 ± 1.00 | -10.71 .. 14.71 | 1 seed, 2 worlds¹ | 1 "
        "| 2e+06 |"
    ) in text
    # Paired with the seed-0 cells of its source run (training seed 0): 1 - 2 and 3 - 4.
    assert (
        "| coordination=round_robin | -1.00 | -1.00 .. -1.00 | 2 "
        "| coordination=round_robin < mpt (defaults) |"
    ) in text
    assert "unrelated" in text and "sweep" not in text.split("\n", 2)[2]

    text = command.write_report(
        client, None, ["grid"], tmp_path / "all", reference="coordination=round_robin"
    )
    assert (
        "| mpt (defaults) | +1.00 | +1.00 .. +1.00 | 2 "
        "| mpt (defaults) > coordination=round_robin |"
    ) in text, "only the two cells both hold"


def test_arms_trained_into_two_experiments_are_paired_as_one(tmp_path, capsys, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # undone: main sets it

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    first = client.create_experiment("labels", str(tmp_path / "artifacts"))
    later = client.create_experiment("credit", str(tmp_path / "artifacts"))
    for seed in (0, 1):
        log_training_run(client, first, f"seed={seed}", [3.0], worlds={10: 3.0, 11: 5.0 + seed})
        log_training_run(
            client, later, f"credit=reward_to_go,seed={seed}", [5.0], worlds={10: 4.0, 11: 7.0}
        )
    results = tmp_path / "results.md"
    argv = ["--experiment", "labels", "credit", "--tracking-uri", uri, "--out", str(tmp_path)]
    command.main([*argv, "--results", str(results)])
    text = capsys.readouterr().out
    assert "# Strategy comparison (experiments `labels`, `credit`)" in text
    # Cells (seed, world): 4 - 3, 7 - 5 (seed 0); 4 - 3, 7 - 6 (seed 1).
    s = statistics.clustered_summary({(0, 10): 1.0, (0, 11): 2.0, (1, 10): 1.0, (1, 11): 1.0})
    assert f"| credit=reward_to_go | +1.25 | {s.ci_low:+.2f} .. {s.ci_high:+.2f} | 4 |" in text
    assert "<!-- report:labels+credit -->" in results.read_text()
    assert client.search_runs([first], filter_string="tags.`bidswarm.kind` = 'report'")
    with pytest.raises(SystemExit, match="no MLflow experiment named 'nope'"):
        command.main(["--experiment", "labels", "nope", "--tracking-uri", uri])


def test_a_sweep_parent_logs_each_arms_interval_over_training_seeds_and_worlds(tmp_path):
    from mlflow.tracking import MlflowClient

    from bidswarm.sweep import summarise_sweep

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment_id = client.create_experiment("grid", str(tmp_path / "artifacts"))
    parent = client.create_run(experiment_id, run_name="sweep", tags={"bidswarm.sweep_dir": "x"})
    parent_id = parent.info.run_id
    cells = {}
    for seed in (0, 1, 2):
        worlds = {w: 10.0 * seed + w for w in range(4)}
        cells |= {(seed, w): r for w, r in worlds.items()}
        name = f"ablation=none,seed={seed}"
        log_training_run(client, experiment_id, name, [1.0, 2.0], parent_id, worlds)
    lone = {10: 2.0, 11: 5.0, 12: 3.0}
    log_training_run(client, experiment_id, "ablation=monolithic,seed=0", [1.0], parent_id, lone)
    text = summarise_sweep(client, parent_id, tmp_path / "summary")

    metrics = client.get_run(parent_id).data.metrics
    expected = statistics.clustered_summary(cells)
    naive = statistics.summarize(list(cells.values()))
    arm = "arm/ablation-none/heldout_reward"
    assert (metrics[f"{arm}/mean"], metrics[f"{arm}/ci_low"], metrics[f"{arm}/ci_high"]) == (
        pytest.approx((expected.mean, expected.ci_low, expected.ci_high))
    )
    assert metrics[f"{arm}/se"] == pytest.approx(expected.se) and expected.se > 1.5 * naive.se
    assert metrics["arm/ablation-none/seeds"] == 3.0 and metrics["arm/ablation-none/runs"] == 3.0
    # One training seed: over worlds only, and the parent says it counts one seed.
    over_worlds = statistics.summarize(list(lone.values()))
    assert metrics["arm/ablation-monolithic/heldout_reward/se"] == pytest.approx(over_worlds.se)
    assert metrics["arm/ablation-monolithic/seeds"] == 1.0
    assert "| ablation=monolithic |" in text and "| 1 seed, 3 worlds¹ |" in text
    assert f"¹ {strategies.ONE_SEED}." in text


def crossed_runs(rng: random.Random, seeds: int, sds: tuple[float, float, float]):
    """One strategy's runs: ``seeds`` training seeds x 32 worlds, each cell 50 + a seed effect
    + a world effect + a residual with SDs ``sds``."""
    seed_sd, world_sd, resid_sd = sds
    world_effects = [rng.gauss(0, world_sd) for _ in range(32)]
    runs = []
    for seed in range(seeds):
        level = 50.0 + rng.gauss(0, seed_sd)
        worlds = {w: level + b + rng.gauss(0, resid_sd) for w, b in enumerate(world_effects)}
        runs.append(trained("mpt", seed, worlds))
    return runs


def test_a_clustered_interval_covers_the_true_mean_when_seeds_and_worlds_vary():
    """3 training seeds x 32 worlds, a seed effect of SD 15, a world effect of SD 20 and cell
    noise of SD 20: the strategy's 95% interval of :func:`strategies.strategy_rows` covers the
    true mean about 95% of the time (here 0.94); the two-way cluster bootstrap it replaced
    covered it 0.87 of the time, the t interval over the 96 cells as independent about half
    the time."""
    rng = random.Random(7)
    replications = 300
    clustered = naive = 0
    for _ in range(replications):
        runs = crossed_runs(rng, 3, (15.0, 20.0, 20.0))
        (row,) = strategies.strategy_rows(reading.group_by_strategy(runs))
        assert row.counts_seeds and row.seeds == 3
        clustered += row.ci_low <= 50.0 <= row.ci_high
        cells = statistics.summarize(list(row.cells.values()))
        naive += cells.ci_low <= 50.0 <= cells.ci_high
    assert clustered / replications >= 0.92
    assert naive / replications < 0.70


def test_a_clustered_interval_is_not_too_wide_when_nothing_but_the_cells_vary():
    """5 training seeds x 32 worlds of independent cells (no seed, no world effect): the SE
    stays within 1.3x the mean's true SD, 20 / sqrt(160) (here 1.16; the two-way cluster
    bootstrap counted the cell noise about 2.5 times: 1.57)."""
    rng = random.Random(8)
    ses = []
    for _ in range(200):
        (row,) = strategies.strategy_rows(
            reading.group_by_strategy(crossed_runs(rng, 5, (0.0, 0.0, 20.0)))
        )
        ses.append(row.se)
    assert 0.9 < sum(ses) / len(ses) / (20.0 / math.sqrt(160)) < 1.3


def separated_by_naive_ses(shared_seeds: bool) -> list[reading.RunResult]:
    """Two strategies 2 apart over 3 training seeds x 20 worlds, whose training seeds scatter
    them by several points: the SEs over cells taken as independent do not overlap; an
    interval over training seeds cannot tell them apart."""
    rng = random.Random(3)
    runs = []
    for index, shift in enumerate((8.0, -4.0, 2.0)):
        base = {w: 10.0 + rng.gauss(0, 1) for w in range(20)}
        seed_b = index if shared_seeds else index + 10
        runs.append(trained("b", seed_b, base))
        runs.append(trained("a", index, {w: r + shift for w, r in base.items()}))
    return runs


@pytest.mark.parametrize("shared_seeds", [True, False])
def test_the_verdict_rests_on_intervals_over_training_seeds_not_on_naive_ses(shared_seeds):
    rows = strategies.strategy_rows(reading.group_by_strategy(separated_by_naive_ses(shared_seeds)))
    first, second = rows
    a = [v for (s, _), v in first.cells.items()]
    b = [v for (s, _), v in second.cells.items()]
    gap = first.mean - second.mean
    assert gap > statistics.summarize(a).se + statistics.summarize(b).se, "naive SEs separate"
    text = tables.verdict(rows)
    assert "**a**" in text and "separated" not in text
    if shared_seeds:
        assert "paired on 60 (training seed, world) cells" in text
        assert "no difference detected" in text
    else:
        assert "their 95% intervals overlap" in text
    # a real, consistent gap paired on the same cells is told apart
    clear = [r for r in separated_by_naive_ses(True) if r.strategy == "b"]
    clear += [
        trained("a", r.training_seed, {w: v + 2.0 for w, v in r.world_rewards.items()})
        for r in clear
    ]
    assert "a > b" in tables.verdict(strategies.strategy_rows(reading.group_by_strategy(clear)))


@pytest.mark.slow
def test_a_real_two_job_sweep_has_one_parent_and_reports(tmp_path):
    """Two smoke jobs (in parallel when the joblib launcher is installed) -> one parent run."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "OMP_NUM_THREADS": "1"}
    launcher = []
    if importlib.util.find_spec("hydra_plugins.hydra_joblib_launcher") is not None:
        launcher = ["hydra/launcher=local"]
    command = sweep_command(
        tmp_path / "sweep",
        "debug=smoke",
        "seed=0,1",
        "task.max_decisions=8",
        "task.n_heldout_seeds=2",
        "sft.demo_episodes=2",
        *launcher,
    )
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]

    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("bidswarm").experiment_id])
    parents = [r for r in runs if "bidswarm.sweep_dir" in r.data.tags]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId")]
    assert len(parents) == 1, f"expected one sweep parent run, got {len(parents)}"
    assert len(children) == 2
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}
    if launcher:  # two jobs at once share the cores this process may run on
        shared = max(1, len(os.sched_getaffinity(0)) // 2)
        assert {c.data.params["system/torch_threads"] for c in children} == {str(shared)}

    out = tmp_path / "report"
    shown = subprocess.run(
        [
            sys.executable,
            "scripts/report.py",
            "--parent",
            parents[0].info.run_id,
            "--out",
            str(out),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert "Downloading artifacts" not in shown.stderr, "one progress bar per artifact read"
    assert (
        "| debug=smoke,sft.demo_episodes=2,task.max_decisions=8,task.n_heldout_seeds=2 |"
        in (shown.stdout)
        and "| 2 |" in shown.stdout
    )
    assert (out / "reward_vs_flops.png").exists() and (out / "participation.png").exists()
    # The report starts with the one command that makes both runs again, and their commit.
    remake = (
        "python -m bidswarm.train -m debug=smoke seed=0,1 task.max_decisions=8 "
        "task.n_heldout_seeds=2 sft.demo_episodes=2"
    )
    commit = tracking.code_commit()
    assert shown.stdout.index(remake) < shown.stdout.index("| strategy |")
    assert commit is None or f"Reproduce at `{commit[:7]}" in shown.stdout
    # Each run logged its per-world pass@k after SFT and after RL: the gain is paired on cells.
    success = shown.stdout[shown.stdout.index("Task success and pass@k on the held-out") :]
    row = next(line for line in success.splitlines() if line.startswith("| debug=smoke"))
    assert row.endswith("| 2 |") and "²" not in row and " .. " in row


def test_the_command_of_an_evaluation_sweep_counts_its_folders_and_quotes_values(tmp_path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.create_experiment("x")
    for folder, rule in (
        ("0_seed=0,a=b", "auction"),
        ("1_seed=1", "auction"),
        ("0_seed=0,a=b", "agentnet"),
    ):
        tags = {
            reading.KIND_TAG: "evaluate",
            tracking.OVERRIDES_TAG: (
                f"experiment=table2 run_dir='/r/multirun/{folder}' coordination={rule}"
            ),
            tracking.COMMIT_TAG: "0123456789abcdef-dirty",
        }
        client.create_run(experiment, tags=tags)
    runs = client.search_runs([experiment])
    assert provenance.sweep_commands(runs) == [
        "python -m bidswarm.evaluate -m experiment=table2 "
        "run_dir=<2 folders in /r/multirun> coordination=auction,agentnet"
    ]
    assert provenance.commits(runs) == ["0123456-dirty"]
    client.create_run(experiment)  # a run from before the tags: counted, not guessed
    text = provenance.provenance(client.search_runs([experiment]))
    assert text.startswith("Reproduce at `0123456-dirty` (1 of 4 runs recorded no command)")
    # the counted folders are named below the command, so it can be remade exactly
    assert text.endswith(
        "`run_dir=<2 folders in /r/multirun>`, quoted and comma-separated: "
        "`0_seed=0,a=b`, `1_seed=1`."
    )
    # one folder is named, quoted as Hydra needs it (its name holds '=' and ',')
    single = [r for r in runs if "0_seed=0,a=b" in r.data.tags[tracking.OVERRIDES_TAG]]
    assert provenance.sweep_commands(single) == [
        "python -m bidswarm.evaluate -m experiment=table2 run_dir='/r/multirun/0_seed=0,a=b' "
        "coordination=auction,agentnet"
    ]


def test_arms_that_set_other_keys_get_a_command_each(tmp_path):
    """Two sweeps of one experiment, one over ``rl.fork_tie_break``, the other setting
    ``rl.fork_selection``: one cartesian command would make arms that never ran and drop one
    that did."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.create_experiment("x")
    arms = ["rl.fork_tie_break=false", "rl.fork_tie_break=true", "rl.fork_selection=open_reward"]
    for arm in arms:
        for seed in (0, 1):
            tags = {tracking.OVERRIDES_TAG: f"experiment=long_horizon seed={seed} {arm}"}
            client.create_run(experiment, tags=tags)
    # the same keys written in another order are the same sweep shape
    tags = {tracking.OVERRIDES_TAG: "experiment=long_horizon rl.fork_tie_break=true seed=2"}
    client.create_run(experiment, tags=tags)
    start = "python -m bidswarm.train -m experiment=long_horizon seed=0,1"
    assert provenance.sweep_commands(client.search_runs([experiment])) == [
        f"{start},2 rl.fork_tie_break=false,true",
        f"{start} rl.fork_selection=open_reward",
    ]


def test_rl_gain_and_participation_shift_per_strategy():
    worlds = range(6)
    runs = []
    for seed in (0, 1, 2):
        run = trained("mpt", seed, {w: 10.0 + w + seed for w in worlds})
        run.before_world_rewards = {w: 4.0 + w + seed for w in worlds}
        run.participation = {
            "before": {"logger": 0.8, "miner": 0.2},
            "after": {"logger": 0.5, "miner": 0.5},
        }
        runs.append(run)
    flat = trained("flat", 0, dict.fromkeys(worlds, 3.0))
    flat.before_world_rewards = dict.fromkeys(worlds, 3.0)
    groups = reading.group_by_strategy([*runs, flat])
    gains = tables.rl_gain_table(groups)
    # Each mean with its two-way clustered interval over the 3 seeds x 6 worlds.
    sft = statistics.clustered_summary({(s, w): 4.0 + w + s for s in (0, 1, 2) for w in worlds})
    rl = statistics.clustered_summary({(s, w): 10.0 + w + s for s in (0, 1, 2) for w in worlds})
    assert (
        f"| mpt | 7.50 ({sft.ci_low:.2f} .. {sft.ci_high:.2f}) "
        f"| 13.50 ({rl.ci_low:.2f} .. {rl.ci_high:.2f}) | +6.00 | +6.00 .. +6.00 | 0.00 "
        "| after RL > after SFT |"
    ) in gains
    assert sft.ci_low < 7.5 < sft.ci_high
    # One seed: over its worlds only, marked.
    assert "| flat | 3.00 (3.00 .. 3.00)¹ | 3.00 (3.00 .. 3.00)¹ | +0.00 |" in gains
    assert "no difference detected" in gains and gains.endswith(f"¹ {strategies.ONE_SEED}.")
    shift = tables.participation_table(groups)
    assert "| mpt | logger 80% → 50%; miner 20% → 50% | 3 |" in shift
    assert "flat" not in shift, "a run without participation metrics has no row"
    assert tables.rl_gain_table(reading.group_by_strategy([trained("x", 0, {0: 1.0})])) == ""


def test_milestones_show_where_the_swarm_stalls_in_the_order_most_episodes_reach_them():
    runs = []
    for seed, log in ((0, 0.6), (1, 0.8)):
        run = trained("mpt", seed, {0: 1.0})
        run.milestones = {
            "before": {"oak_log": log, "stick": 0.1, "wooden_pickaxe": 0.0},
            "after": {"oak_log": 1.0, "stick": 0.5, "wooden_pickaxe": 0.3},
        }
        runs.append(run)
    unmeasured = trained("flat", 0, {0: 1.0})
    funnel = tables.milestone_table(reading.group_by_strategy([*runs, unmeasured]))
    assert "| mpt | oak_log 70% → 100%; stick 10% → 50%; wooden_pickaxe 0% → 30% | 2 |" in funnel
    assert "flat" not in funnel, "a run without milestone metrics has no row"
    assert tables.milestone_table(reading.group_by_strategy([unmeasured])) == ""


def test_task_success_after_sft_and_after_rl_read_from_mlflow_and_paired_on_worlds(tmp_path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment_id = client.create_experiment("long", str(tmp_path / "artifacts"))
    worlds = range(4)
    for seed in (0, 1, 2):
        run_id = log_training_run(client, experiment_id, f"seed={seed}", [1.0, 2.0])
        for when, share in (("before", 0.1), ("after", 0.4)):
            per_world = {str(w): share + 0.1 * (w % 2) + 0.05 * seed for w in worlds}
            client.log_dict(run_id, per_world, f"heldout/eval_{when}_pass_at_3_worlds.json")
            mean = sum(per_world.values()) / len(per_world)
            client.log_metric(run_id, f"eval_{when}/pass_at_3/mean", mean)
            client.log_metric(run_id, f"eval_{when}/pass_at_1/mean", mean / 2)
            client.log_metric(run_id, f"eval_{when}/task/success", mean / 2)
            client.log_metric(run_id, f"eval_{when}/task/milestone/stick", 2 * share)
    # Logged before per-world pass@k existed: the gain's interval is over its runs.
    for seed, gain in ((0, 0.1), (1, 0.3)):
        run_id = log_training_run(client, experiment_id, f"credit=x,seed={seed}", [1.0, 2.0])
        client.log_metric(run_id, "eval_before/pass_at_3/mean", 0.2)
        client.log_metric(run_id, "eval_after/pass_at_3/mean", 0.2 + gain)
    runs = reading.find_runs(client, None, ["long"])
    results = [reading.read_run(client, run) for run in runs]
    mpt = next(r for r in results if r.strategy == reading.DEFAULT_STRATEGY)
    assert sorted(mpt.world_success) == ["after", "before"]
    assert mpt.world_success["after"][3][1] == pytest.approx(0.5 + 0.05 * mpt.training_seed)
    assert mpt.milestones == {"before": {"stick": 0.2}, "after": {"stick": 0.8}}
    table = tables.success_gain_table(reading.group_by_strategy(results))
    # Every cell gains exactly 30 points: the paired cluster bootstrap interval is a point.
    mpt_row = "| 10% → 25% | 10% → 25% | 20% → 50% | +30.0 | +30.0 .. +30.0 | 3 |"
    assert f"| {reading.DEFAULT_STRATEGY} {mpt_row}" in table
    over_runs = statistics.summarize([0.1, 0.3])
    assert (
        f"| credit=x |  |  | 20% → 40% | +20.0 | {100 * over_runs.ci_low:+.1f} .. "
        f"{100 * over_runs.ci_high:+.1f}² | 2 |"
    ) in table
    assert table.endswith("no per-world pass@k logged.")
    lone = [r for r in results if r.strategy == "credit=x" and r.training_seed == 0]
    assert "| +10.0 | ² | 1 |" in tables.success_gain_table({"credit=x": lone})
    assert tables.success_gain_table({"x": [trained("x", 0, {0: 1.0})]}) == ""


def log_evaluated_run(client, experiment_id, name, before, after, forks=()):
    """A training run scored on the held-out worlds after SFT (``before``: world -> reward) and
    after RL, with success, participation and, per bid update, (played, tied, effective pairs)
    of its forks."""
    run_id = log_training_run(client, experiment_id, name, [1.0] * max(len(forks), 1))
    for when, worlds in (("before", before), ("after", after)):
        client.log_dict(
            run_id, {str(w): r for w, r in worlds.items()}, f"heldout/eval_{when}_worlds.json"
        )
        client.log_metric(run_id, f"eval_{when}/reward/mean", sum(worlds.values()) / len(worlds))
        client.log_metric(run_id, f"eval_{when}/task/success", 0.25 if when == "after" else 0.0)
        shares = (
            {"logger": 0.1, "smith": 0.9} if when == "before" else {"logger": 0.3, "smith": 0.7}
        )
        for role, share in shares.items():
            client.log_metric(run_id, f"eval_{when}/participation/{role}", share)
    for update, (played, tied, pairs) in enumerate(forks):
        for key, value in (
            ("forks/resampled_below", played),
            ("forks/tied", tied),
            ("forks/effective_pairs", pairs),
        ):
            client.log_metric(run_id, key, value, step=5 * update + 4)
    return run_id


def test_the_per_run_table_reads_each_runs_gain_and_forks_from_mlflow(tmp_path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment_id = client.create_experiment("long", str(tmp_path / "artifacts"))
    before = {0: 10.0, 1: 20.0, 2: 30.0, 3: 40.0}
    gains = {0: 4.0, 1: 6.0, 2: 5.0, 3: 9.0}
    after = {w: before[w] + gains[w] for w in before}
    # Three bid updates: 8 of 10 forks tied, 6 of 20, 5 of 10; 1.5, 12.5, 2.0 effective pairs.
    forks = [(10, 8, 1.5), (20, 6, 12.5), (10, 5, 2.0)]
    run = log_evaluated_run(client, experiment_id, "seed=1", before, after, forks)
    # Untied paper pairs 20% then 70%; one control measured, half of it untied.
    for update, untied in enumerate((0.2, 0.7)):
        client.log_metric(run, "forks/untied", untied, step=5 * update + 4)
    client.log_metric(run, "forks/control_untied", 0.5, step=4)
    log_evaluated_run(client, experiment_id, "rl.fork_budget=0,seed=0", before, before)
    results = [reading.read_run(client, run) for run in reading.find_runs(client, None, ["long"])]
    table = tables.run_table(reading.group_by_strategy(results))
    gain = statistics.summarize(list(gains.values()))
    assert "| strategy | seed | after SFT | after RL | RL − SFT |" in table
    assert "participation % logger/smith |" in table
    assert (
        f"| {reading.DEFAULT_STRATEGY} | 1 | 25.0 | 31.0 | +6.0 | {gain.ci_low:+.1f} .. "
        f"{gain.ci_high:+.1f} | 0% → 25% | 10/90 → 30/70 | 53% | 5.3 (2.0) | 45% / 50% |"
    ) in table
    assert "| rl.fork_budget=0 | 0 | 25.0 | 25.0 | +0.0 | +0.0 .. +0.0 | 0% → 25% " in table
    assert table.splitlines()[-1].endswith("| – | – | – |")
    # The report holds it; a run scored only after RL has no row, and no such run no table.
    text = command.write_report(client, None, ["long"], tmp_path / "report")
    assert table in text
    assert tables.run_table({"x": [trained("x", 0, {0: 1.0})]}) == ""


def test_results_file_sections_are_replaced_not_duplicated(tmp_path):
    figures = tmp_path / "out"
    figures.mkdir()
    (figures / "participation.png").write_bytes(b"png")
    results = tmp_path / "docs" / "results.md"
    results.parent.mkdir()
    results.write_text("# Results\n\nintro\n")
    text = "# Strategy comparison (experiment `x`)\n\nold\n\n![p](participation.png)"
    command.update_results(results, "x", text, figures, "python scripts/report.py --experiment x")
    command.update_results(results, "x", text.replace("old", "new"), figures, "cmd")
    command.update_results(results, "y", "other", figures, "cmd")
    body = results.read_text()
    assert body.startswith("# Results\n\nintro\n")
    assert body.count("<!-- report:x -->") == 1 and "new" in body and "old" not in body
    assert "](results/x_participation.png)" in body and "<!-- report:y -->" in body
    assert (results.parent / "results" / "x_participation.png").read_bytes() == b"png"


def test_the_swept_number_is_the_x_axis_and_the_rest_of_the_name_the_series():
    key, points = figures.swept_setting(
        [
            "coordination=auction,replicas=1",
            "coordination=auction,replicas=4",
            "coordination=round_robin,replicas=1",
        ]
    )
    assert key == "replicas"
    assert points["coordination=auction,replicas=4"] == (4.0, "coordination=auction")
    assert points["coordination=round_robin,replicas=1"] == (1.0, "coordination=round_robin")
    # dropout takes more values than replicas: it is the axis, replicas a series; a strategy
    # with no other override is the default series
    key, points = figures.swept_setting(
        [
            "dropout=0.0,replicas=1",
            "dropout=0.5,replicas=1",
            "dropout=0.9,replicas=4",
            "dropout=0.5",
        ]
    )
    assert key == "dropout"
    assert points["dropout=0.9,replicas=4"] == (0.9, "replicas=4")
    assert points["dropout=0.5"] == (0.5, reading.DEFAULT_STRATEGY)
    assert figures.swept_setting(["ablation=none", "ablation=monolithic"]) is None
    assert figures.swept_setting(["replicas=2", "replicas=2,coordination=auction"]) is None


def test_evaluation_only_reports_draw_outcomes_not_empty_training_figures(tmp_path):
    runs = []
    for replicas in (1, 2, 4):
        for seed in (0, 1):
            run = reading.RunResult(
                f"{replicas}-{seed}",
                f"coordination=auction,replicas={replicas}",
                None,
                None,
                None,
                training_seed=seed,
                world_rewards={w: 10.0 * replicas + w + seed for w in range(4)},
                outcomes={"agents": 3.0 * replicas, "pass_at_3/mean": 0.1 * replicas},
            )
            run.heldout_mean = sum(run.world_rewards.values()) / 4
            runs.append(run)
    groups = reading.group_by_strategy(runs)
    rows = strategies.strategy_rows(groups)
    assert figures.plot_reward_vs_flops_per_strategy(groups, tmp_path / "r.png") is None
    assert figures.plot_participation_per_strategy(groups, tmp_path / "p.png") is None
    assert not (tmp_path / "r.png").exists() and not (tmp_path / "p.png").exists()
    drawn = figures.plot_outcomes(rows, groups, tmp_path / "outcomes.png")
    assert drawn is not None and drawn.stat().st_size > 0
    unswept = reading.group_by_strategy([runs[0]])
    assert (
        figures.plot_outcomes(strategies.strategy_rows(unswept), unswept, tmp_path / "x.png")
        is None
    )


def test_the_outcome_table_gives_pass_at_k_a_clustered_interval_over_seeds_and_worlds():
    def evaluation(seed: int, pass_3: dict[int, float] | None) -> reading.RunResult:
        mean = sum(pass_3.values()) / len(pass_3) if pass_3 else 0.4
        return reading.RunResult(
            f"run-{seed}",
            "replicas=2",
            None,
            None,
            None,
            training_seed=seed,
            outcomes={"agents": 6.0, "pass_at_3/mean": mean},
            world_pass_at_k={3: pass_3} if pass_3 else {},
        )

    per_world = {s: {w: min(1.0, 0.2 * s + 0.1 * w) for w in range(5)} for s in range(3)}
    table = tables.outcome_table({"replicas=2": [evaluation(s, per_world[s]) for s in range(3)]})
    cells = {(s, w): v for s, worlds in per_world.items() for w, v in worlds.items()}
    expected = statistics.clustered_summary(cells)
    assert "pass@3 95% CI" in table.splitlines()[2]
    row = table.splitlines()[-1].split(" | ")
    assert row[4] == f"{100 * expected.ci_low:.1f}% .. {100 * expected.ci_high:.1f}%"
    assert expected.ci_low < expected.mean < expected.ci_high
    # a run that logged no per-world pass@k leaves the interval out
    older = tables.outcome_table({"replicas=2": [evaluation(0, per_world[0]), evaluation(1, None)]})
    assert older.splitlines()[-1].split(" | ")[4] == ""
    # a share's interval stays within 0% .. 100% where the t interval would leave it
    rare = {s: {w: float((s, w) == (0, 0)) for w in range(5)} for s in range(3)}
    rare_cells = {(s, w): v for s, worlds in rare.items() for w, v in worlds.items()}
    unclipped = statistics.clustered_summary(rare_cells)
    assert unclipped.ci_low < 0
    clipped = tables.outcome_table({"replicas=2": [evaluation(s, rare[s]) for s in range(3)]})
    assert clipped.splitlines()[-1].split(" | ")[4] == f"0.0% .. {100 * unclipped.ci_high:.1f}%"
    # against a reference strategy: the paired difference on the (seed, world) cells both hold
    fewer = [evaluation(s, {w: v / 2 for w, v in per_world[s].items()}) for s in range(3)]
    for run in fewer:
        run.strategy = "replicas=1"
    groups = {"replicas=1": fewer, "replicas=2": [evaluation(s, per_world[s]) for s in range(3)]}
    # a reference without evaluation outcomes leaves the paired column out
    assert "(95% CI)" not in tables.outcome_table(groups, "replicas=9").splitlines()[2]
    table = tables.outcome_table(groups, reference="replicas=1").splitlines()
    assert "pass@3 − replicas=1 (95% CI)" in table[2]
    assert table[-2].split(" | ")[5] == "reference"
    halves = {key: value / 2 for key, value in cells.items()}
    d = statistics.paired_difference(cells, halves)
    assert d.ci_low > 0
    expected = f"{100 * d.mean:+.1f} ({100 * d.ci_low:+.1f} .. {100 * d.ci_high:+.1f})"
    assert table[-1].split(" | ")[5] == expected


def test_evaluation_runs_show_who_acted_how_far_episodes_got_and_what_peer_scoring_saw(tmp_path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment_id = client.create_experiment("swap", str(tmp_path / "artifacts"))
    for seed, miner in ((0, 0.7), (1, 0.9)):
        run = client.create_run(
            experiment_id,
            run_name=f"eval coordination=graph_of_agents,seed={seed}",
            tags={reading.KIND_TAG: "evaluate"},
        )
        for key, value in (
            ("eval/reward/mean", 5.0),
            ("eval/participation/miner", miner),
            ("eval/participation/smith", 1 - miner),
            ("eval/task/milestone/oak_log", 0.1 * (seed + 1)),
            ("eval/task/milestone/stick", 0.0),
            ("eval/peer_scores/received/miner", -4.0 - seed),
            ("eval/peer_scores/received/smith", -6.0),
            ("eval/peer_scores/margin", 1.0 + seed),
            ("eval/participation_at/10/miner", 1.0),  # not a role's share of acting steps
        ):
            client.log_metric(run.info.run_id, key, value)
    runs = [reading.read_run(client, r) for r in client.search_runs([experiment_id])]
    table = tables.evaluation_behaviour_table(reading.group_by_strategy(runs))
    assert table.splitlines()[-1] == (
        "| coordination=graph_of_agents | miner 80%; smith 20% | oak_log 15%; stick 0% "
        "| miner -4.50; smith -6.00; margin 1.50 | 2 |"
    )
    assert tables.evaluation_behaviour_table({"a": [result("a", 1.0)]}) == ""


def test_the_outcome_table_shows_each_rules_cost_per_decision_over_the_runs_that_logged_it():
    def evaluation(seed: int, cost: dict[str, float]) -> reading.RunResult:
        outcomes = {"agents": 3.0, "task/success": 0.1, **cost}
        return reading.RunResult(
            f"r{seed}", "coordination=agentnet", None, None, None, seed, outcomes=outcomes
        )

    costs = {"flops_per_decision": 2e7, "tokens_per_decision": 300.0, "seconds_per_decision": 0.5}
    older = {"flops_per_decision": 4e7}  # an evaluation from before tokens and wall were logged
    table = tables.outcome_table(
        {"coordination=agentnet": [evaluation(0, costs), evaluation(1, older)]}
    )
    header, row = table.splitlines()[2], table.splitlines()[-1]
    assert header.endswith("| FLOPs/decision | tokens/decision | s/decision | runs |")
    assert row.endswith("| 3e+07 | 300 | 0.5 | 2 |")


def test_long_panel_titles_wrap_at_commas():
    title = "eval.max_seeds=16,experiment=tables,logger.experiment_name=participation,rl.cycles=8"
    lines = figures.wrapped(title, width=40).split("\n")
    assert len(lines) == 3 and "".join(lines) == title
    assert all(len(line) <= 40 or "," not in line[:-1] for line in lines)
    assert figures.wrapped("short") == "short"


def test_heldout_points_along_training_sit_at_the_flops_of_their_update(tmp_path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment_id = client.create_experiment("adapt", str(tmp_path / "artifacts"))
    runs = []
    for seed, shift in ((0, 0.0), (1, 2.0)):
        run_id = log_training_run(client, experiment_id, f"seed={seed}", [1.0, 2.0, 3.0, 4.0])
        client.log_metric(run_id, "eval_before/reward/mean", 10.0 + shift, step=0)
        client.log_metric(run_id, "eval_during/reward/mean", 20.0 + shift, step=2)  # after update 2
        runs.append(reading.read_run(client, client.get_run(run_id)))
    # flops/total is 1e6 * (step + 1): update 2 (step 1) ends at 2e6, the last at 4e6
    assert runs[0].heldout_curve == {
        "before": (0.0, 10.0),
        "update 2": (2e6, 20.0),
        "after": (4e6, 4.0),
    }
    groups = reading.group_by_strategy(runs)
    drawn = figures.plot_reward_vs_flops_per_strategy(groups, tmp_path / "curve.png")
    assert drawn is not None and drawn.stat().st_size > 0


def test_flops_to_reach_interpolates_between_the_held_out_points_around_the_target():
    curve = {"before": (0.0, 10.0), "update 10": (2.0, 30.0), "after": (4.0, 20.0)}
    assert strategies.flops_to_reach(curve, 20.0) == pytest.approx(1.0)  # halfway to update 10
    assert strategies.flops_to_reach(curve, 30.0) == 2.0  # the first point at or above it
    assert strategies.flops_to_reach(curve, 5.0) == 0.0  # the SFT start already does
    assert strategies.flops_to_reach(curve, 31.0) is None


def test_catch_up_pairs_seeds_both_ways_and_says_which_seeds_never_reach():
    def run(strategy: str, seed: int, curve: dict[str, tuple[float, float]]):
        return reading.RunResult(
            f"{strategy}/{seed}", strategy, curve["after"][1], 1.0, curve["after"][0],
            training_seed=seed, heldout_curve=curve,
        )  # fmt: skip

    groups = {
        "mpt": [
            run("mpt", 0, {"before": (0.0, 10.0), "update 5": (4.0, 50.0), "after": (8.0, 60.0)}),
            run("mpt", 1, {"before": (0.0, 40.0), "update 5": (4.0, 45.0), "after": (8.0, 70.0)}),
        ],
        "mono": [
            run("mono", 0, {"before": (0.0, 10.0), "update 5": (1.0, 20.0), "after": (2.0, 30.0)}),
            run("mono", 1, {"before": (0.0, 20.0), "update 5": (1.0, 30.0), "after": (2.0, 35.0)}),
            run("mono", 2, {"before": (0.0, 20.0), "update 5": (1.0, 30.0), "after": (2.0, 35.0)}),
        ],
    }
    rows = {(row.strategy, row.target): row for row in strategies.catch_up(groups, "mpt")}
    # mono's seed 0 ends at 30 after 2 FLOPs; mpt's seed 0 passes 30 halfway to 4 FLOPs: 2 / 2;
    # mpt's seed 1 starts at 40, above mono's final 35
    assert rows["mpt", "mono"].fractions == {0: pytest.approx(1.0), 1: 0.0}
    # mono never reaches mpt's 60 and 70: it stopped at 2 of mpt's 8 FLOPs (seed 2: no mpt run)
    assert rows["mono", "mpt"].fractions == {0: None, 1: None}
    assert rows["mono", "mpt"].short_of == {0: 0.25, 1: 0.25}
    table = tables.catch_up_table(groups, "mpt")
    assert "| mpt | mono | 0.50 (" in table and "| 2 of 2 | 0: 1.00, 1: 0.00 |" in table
    assert "| mono | mpt | n/a | 0 of 2 | 0: > 0.25, 1: > 0.25 |" in table
    assert tables.catch_up_table(groups, "round_robin") == ""  # no such strategy


def test_heldout_whiskers_are_a_t_interval_from_three_runs_and_the_range_below():
    assert figures.heldout_whiskers([4.0]) == (4.0, 4.0, 4.0)
    # two runs: their range, not the t interval (t = 12.7 makes it 60 points wide here)
    assert figures.heldout_whiskers([10.0, 16.0]) == (13.0, 10.0, 16.0)
    wide = statistics.summarize([10.0, 16.0])
    assert wide.ci_high - wide.ci_low > 30
    rewards = [10.0, 16.0, 13.0, 11.0]
    summary = statistics.summarize(rewards)
    assert figures.heldout_whiskers(rewards) == (summary.mean, summary.ci_low, summary.ci_high)
    assert summary.ci_low < min(rewards) and summary.ci_high > max(rewards)


def test_who_acts_at_a_fixed_decision_counts_only_the_runs_that_measured_it():
    def run(name: str, at: dict[str, dict[str, float]]) -> reading.RunResult:
        return reading.RunResult(name, "credit=reward_to_go", None, None, None, participation=at)

    finished = {
        "before_at": {"10/logger": 0.2, "10/smith": 0.8},
        "after_at": {"10/logger": 0.4, "10/smith": 0.6},
    }
    still_running = run("b", {})  # no held-out evaluation after RL yet
    table = tables.participation_at_table(
        {"credit=reward_to_go": [run("a", finished), still_running]}
    )
    assert "| credit=reward_to_go | 10 | logger 20% → 40%; smith 80% → 60% | 1 |" in table


def test_the_budget_table_shows_what_each_strategy_spent(tmp_path):
    """SFT tokens by kind, SFT FLOPs, RL updates of each kind and RL FLOPs per strategy (the
    final logged values, averaged over seeds); an evaluation run shows its source run's."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment_id = client.create_experiment("budget", str(tmp_path / "artifacts"))
    budgets = {
        "seed=0": (1000.0, 500.0, 6e9, 48.0, 12.0),
        "seed=1": (1200.0, 700.0, 8e9, 48.0, 12.0),
        "ablation=monolithic,seed=0": (900.0, 0.0, 2e9, 48.0, 0.0),
    }
    ids = {}
    for name, (action, bid, sft_flops, action_updates, bid_updates) in budgets.items():
        ids[name] = log_training_run(client, experiment_id, name, [1.0, 2.0])
        for key, value in (
            ("sft/action_tokens", action),
            ("sft/bid_tokens", bid),
            ("sft/flops", sft_flops),
        ):
            client.log_metric(ids[name], key, value, step=0)
        for update in range(int(action_updates + bid_updates)):  # counted so far: last = total
            made = min(update + 1, action_updates)
            client.log_metric(ids[name], "updates/action", made, step=update)
            client.log_metric(ids[name], "updates/bid", update + 1 - made, step=update)
    # Logged before the budget was: only its RL FLOPs.
    log_training_run(client, experiment_id, "ablation=round_robin,seed=0", [1.0])
    # Killed before its held-out evaluation: its partial budget is not averaged in.
    unfinished = client.create_run(experiment_id, run_name="seed=2").info.run_id
    client.log_metric(unfinished, "sft/action_tokens", 10.0, step=0)
    client.log_metric(unfinished, "updates/action", 3.0, step=2)
    evaluation = client.create_run(
        experiment_id,
        run_name="eval coordination=agentnet",
        tags={"bidswarm.kind": "evaluate", "bidswarm.source_run": ids["seed=0"]},
    )
    client.log_metric(evaluation.info.run_id, "eval/reward/mean", 2.0)
    client.log_metric(evaluation.info.run_id, "eval/reward/se", 0.3)

    text = command.write_report(client, None, ["budget"], tmp_path / "out")
    assert (
        "| strategy | SFT action tokens | SFT bid tokens | SFT decision tokens | SFT FLOPs "
        "| RL action updates | RL bid updates | training FLOPs (RL) | runs |"
    ) in text
    # Only a rule that learns its own decision logs decision tokens (the others: n/a).
    assert "| mpt (defaults) | 1.1e+03 | 600 | n/a | 7e+09 | 48 | 12 | 2e+06 | 2 |" in text
    assert "| ablation=monolithic | 900 | 0 | n/a | 2e+09 | 48 | 0 | 2e+06 | 1 |" in text
    assert "| coordination=agentnet | 1e+03 | 500 | n/a | 6e+09 | 48 | 12 | 2e+06 | 1 |" in text
    assert "| ablation=round_robin | n/a | n/a | n/a | n/a | n/a | n/a | 1e+06 | 1 |" in text


def test_winning_bids_per_role_before_and_after_rl_are_a_table_and_a_figure(tmp_path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment_id = client.create_experiment("credit", str(tmp_path / "artifacts"))
    # After SFT every winning bid is the experts' 0.8; after RL the miner spreads out.
    for seed, miner_low in ((0, 0.2), (1, 0.4)):
        run_id = log_training_run(client, experiment_id, f"seed={seed}", [1.0, 2.0])
        for key, value in (
            ("eval_before/bids/winning/logger/0.8", 1.0),
            ("eval_before/bids/winning/logger/0.4", 0.0),
            ("eval_before/bids/winning/logger/mean", 0.8),
            ("eval_before/bids/winning/miner/0.8", 1.0),
            ("eval_before/bids/winning/miner/0.4", 0.0),
            ("eval_before/bids/winning/miner/mean", 0.8),
            ("eval_after/bids/winning/logger/0.8", 1.0),
            ("eval_after/bids/winning/logger/0.4", 0.0),
            ("eval_after/bids/winning/logger/mean", 0.8),
            ("eval_after/bids/winning/miner/0.8", 1.0 - miner_low),
            ("eval_after/bids/winning/miner/0.4", miner_low),
            ("eval_after/bids/winning/miner/mean", 0.8 - 0.4 * miner_low),
        ):
            client.log_metric(run_id, key, value)
    # a rule without bids logs none: no row, whatever it did
    log_training_run(client, experiment_id, "ablation=round_robin,seed=0", [1.0, 2.0])
    evaluation = client.create_run(
        experiment_id, run_name="eval bids_from=sft", tags={"bidswarm.kind": "evaluate"}
    )
    client.log_metric(evaluation.info.run_id, "eval/reward/mean", 1.0)
    client.log_metric(evaluation.info.run_id, "eval/bids/winning/smith/0.8", 0.5)
    client.log_metric(evaluation.info.run_id, "eval/bids/winning/smith/0.4", 0.5)
    client.log_metric(evaluation.info.run_id, "eval/bids/winning/smith/mean", 0.6)

    runs = [reading.read_run(client, r) for r in reading.find_runs(client, None, ["credit"])]
    trained_run = next(r for r in runs if r.strategy == reading.DEFAULT_STRATEGY)
    assert trained_run.winning_bids["before"]["miner"] == {"0.8": 1.0, "0.4": 0.0, "mean": 0.8}
    assert set(trained_run.winning_bids) == {"before", "after"}
    groups = reading.group_by_strategy(runs)
    table = tables.winning_bid_table(groups)
    assert "| strategy | role | 0.4 | 0.8 | mean bid | runs |" in table
    # miner after RL: mean over the two runs of 0.2 and 0.4 at 0.4 -> 30%
    assert "| mpt (defaults) | miner | 0% → 30% | 100% → 70% | 0.80 → 0.68 | 2 |" in table
    assert "| mpt (defaults) | logger | 0% → 0% | 100% → 100% | 0.80 → 0.80 | 2 |" in table
    assert "| bids_from=sft | smith | 50% | 50% | 0.60 | 1 |" in table
    assert "round_robin" not in table

    text = command.write_report(client, None, ["credit"], tmp_path / "out")
    assert table in text
    assert "winning_bids.png" in figures.FIGURES
    assert f"![{figures.FIGURES['winning_bids.png']}](winning_bids.png)" in text
    assert (tmp_path / "out" / "winning_bids.png").stat().st_size > 0
    # without winning bids: neither table nor figure
    without = reading.group_by_strategy([r for r in runs if not r.winning_bids])
    assert tables.winning_bid_table(without) == ""
    assert figures.plot_winning_bids(without, tmp_path / "none.png") is None
