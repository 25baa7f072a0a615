"""Threads per job: the jobs of a parallel local sweep share the cores instead of each taking
all of them (``scripts/bench_threads.py`` measures why)."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

from bidswarm.train import threads_per_job
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
