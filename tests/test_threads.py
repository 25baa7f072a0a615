"""Threads per job: the jobs of a parallel local sweep share the cores instead of each taking
all of them (``scripts/bench_threads.py`` measures why)."""

from __future__ import annotations

import os

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from bidswarm.run.threads import SWEEP_JOBS_ENV, SweepJobs, sweep_jobs, threads_per_job
from conftest import ROOT


def hydra_node(*overrides: str):
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        return compose("train", overrides=list(overrides), return_hydra_config=True).hydra


@pytest.mark.parametrize("n_jobs, cores, threads", [(2, 8, 4), (3, 8, 2), (4, 2, 1), (-1, 8, 1)])
def test_a_local_sweep_splits_the_cores_among_its_parallel_jobs(n_jobs, cores, threads):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    node = hydra_node(
        "hydra/launcher=local", f"hydra.launcher.n_jobs={n_jobs}", "hydra.mode=MULTIRUN"
    )
    assert threads_per_job(node, cores=cores) == threads


def test_a_single_run_or_a_sequential_sweep_keeps_torchs_default():
    assert threads_per_job(hydra_node("hydra.mode=RUN"), cores=8) is None
    assert threads_per_job(hydra_node("hydra.mode=MULTIRUN"), cores=8) is None  # basic launcher


def test_a_sweep_of_fewer_jobs_than_n_jobs_gives_each_job_more_threads(monkeypatch):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    node = hydra_node("hydra/launcher=local", "hydra.launcher.n_jobs=2", "hydra.mode=MULTIRUN")
    assert threads_per_job(node, cores=8, jobs_in_sweep=1) == 8
    assert threads_per_job(node, cores=8, jobs_in_sweep=5) == 4
    monkeypatch.setenv(SWEEP_JOBS_ENV, "1")  # what SweepJobs tells the launcher's jobs
    assert threads_per_job(node, cores=2) == 2


@pytest.mark.parametrize(
    "overrides, jobs",
    [
        (["seed=0", "model=tiny"], 1),
        (["seed=0,1,2", "ablation=none,random_credit"], 6),
        (["seed=range(0,4)", "rl.lr=1e-4"], 4),
        (["task=glob(crafting_*)"], None),  # only Hydra knows what a glob matches
    ],
)
def test_the_job_count_of_a_sweep_is_the_product_of_its_sweeps(overrides, jobs):
    assert sweep_jobs(overrides) == jobs


def test_the_sweep_callback_counts_command_line_and_sweeper_params(monkeypatch):
    monkeypatch.setenv(SWEEP_JOBS_ENV, "0")  # undone after the test, whatever the callback sets
    config = OmegaConf.create(
        {
            "hydra": {
                "overrides": {"task": ["seed=0,1"]},
                "sweeper": {"params": {"rl.lr": "1e-4,1e-5,1e-6"}},
            }
        }
    )
    SweepJobs().on_multirun_start(config)
    assert os.environ[SWEEP_JOBS_ENV] == "6"
