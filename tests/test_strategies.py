"""Lightning strategies: DeepSpeed without a batch sampler on CPU; every trainer config on a GPU.

The ``gpu`` tests run ``debug=smoke`` with each trainer on one CUDA device (``pytest -m gpu``;
``scripts/gpu_check.sh`` runs them with the other GPU checks) and skip without CUDA.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from hydra import compose, initialize_config_dir
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.pytorch.strategies import DDPStrategy
from torch.distributed.constants import default_pg_timeout
from torch.utils.data import DataLoader

from bidswarm.config import ConfigError, register_configs, validate
from bidswarm.lit.memory import gpu_memory
from bidswarm.lit.strategy import ExplainingLauncher, build_strategy
from conftest import ROOT
from test_train import read_state, run_cli

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


class OneUpdatePerEpoch(L.LightningModule):
    """The learners' dataloader shape: one item per step, ``batch_size=None`` (no sampler)."""

    def train_dataloader(self) -> DataLoader:
        return DataLoader([0], batch_size=None)


def deepspeed_config_for(strategy) -> dict:
    """The micro-batch part of the DeepSpeed config, as Lightning formats it at setup."""
    module = OneUpdatePerEpoch()
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False)
    module.trainer = trainer
    trainer.fit_loop._data_source.instance = module
    strategy._lightning_module = module
    strategy._format_batch_size_and_grad_accum_config()
    return strategy.config


@pytest.mark.parametrize("name, stage", [("deepspeed_stage_2", 2), ("deepspeed_stage_3", 3)])
def test_deepspeed_strategy_starts_without_a_batch_sampler(name, stage, tmp_path):
    pytest.importorskip("deepspeed")
    from lightning.pytorch.strategies import DeepSpeedStrategy

    # Lightning's default reads the batch size from the dataloader's batch sampler: None here.
    with pytest.raises(AttributeError, match="batch_size"):
        deepspeed_config_for(DeepSpeedStrategy(stage=stage))
    config = deepspeed_config_for(build_strategy(name, tmp_path))
    assert config["train_micro_batch_size_per_gpu"] == 1
    assert config["zero_optimization"]["stage"] == stage
    assert config["gradient_clipping"] == 0.0


@pytest.mark.parametrize("name", ["deepspeed_stage_2", "multinode", "deepspeed_stage_3"])
def test_under_deepspeed_its_global_clip_applies_and_the_per_agent_clip_is_refused(name, tmp_path):
    """ZeRO keeps gradients in its own buffers (``p.grad`` stays empty), so the per-agent clip
    would clip nothing: the config check refuses it, naming DeepSpeed's ``gradient_clipping``,
    and the trainer config's norm reaches the DeepSpeed config of the strategy object."""
    pytest.importorskip("deepspeed")
    register_configs()
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        per_agent = compose("train", overrides=[f"trainer={name}"])
        cfg = compose("train", overrides=[f"trainer={name}", "rl.grad_clip=0", "bids=anchored"])
    with pytest.raises(
        ConfigError, match=r"rl\.grad_clip=1\.0: must be 0 under .*gradient_clipping"
    ):
        validate(per_agent)
    validate(cfg)
    strategy = build_strategy(cfg.trainer.strategy, tmp_path, cfg.trainer.gradient_clipping)
    assert (
        deepspeed_config_for(strategy)["gradient_clipping"] == cfg.trainer.gradient_clipping == 1.0
    )


def test_gpu_memory_is_measured_on_cuda_devices_only():
    figures: dict[str, float] = {}
    with gpu_memory(figures, "collect", torch.device("cpu")):
        torch.ones(1000)
    assert figures == {}


@pytest.mark.gpu
@needs_cuda
def test_gpu_memory_peaks_hold_what_the_phase_allocated():
    device = torch.device("cuda")
    figures: dict[str, float] = {}
    with gpu_memory(figures, "update_action", device):
        block = torch.empty(256 * 2**20, dtype=torch.uint8, device=device)  # 0.25 GiB
        del block
    assert figures["memory/peak_gpu_gib/update_action"] >= 0.25
    assert figures["memory/peak_reserved_gpu_gib/update_action"] >= 0.25


def test_ddp_lets_agents_without_data_skip_the_gradient(tmp_path):
    strategy = build_strategy("ddp", tmp_path)
    assert isinstance(strategy, DDPStrategy)
    assert strategy._ddp_kwargs["find_unused_parameters"] is True
    # the processes Lightning starts are watched by the watcher that names a dead one
    strategy.cluster_environment = LightningEnvironment()
    strategy._configure_launcher()
    assert isinstance(strategy.launcher, ExplainingLauncher)
    assert build_strategy("auto", tmp_path) == "auto"


@pytest.mark.parametrize("trainer", ["ddp", "deepspeed_stage_2", "deepspeed_stage_3", "multinode"])
def test_the_collective_timeout_reaches_the_process_group(trainer, tmp_path):
    """``trainer.collective_timeout_s`` is the timeout each multi-process strategy gives the
    process group it makes (torch's 30 minutes unless set)."""
    from bidswarm.run.phases import Run

    register_configs()
    # DeepSpeed clips one global norm and runs no relabel rounds (the trainers' command lines)
    clip = [] if trainer == "ddp" else ["rl.grad_clip=0", "bids=anchored"]
    if trainer != "ddp":
        pytest.importorskip("deepspeed")
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        default = compose("train", overrides=[f"trainer={trainer}", *clip])
        cfg = compose(
            "train", overrides=[f"trainer={trainer}", *clip, "trainer.collective_timeout_s=90"]
        )
    validate(cfg)
    strategies = [
        Run.trainer_kwargs(SimpleNamespace(cfg=c, logger=None, run_dir=tmp_path))["strategy"]
        for c in (cfg, default)
    ]
    assert strategies[0]._timeout == timedelta(seconds=90)
    assert strategies[1]._timeout == default_pg_timeout == timedelta(minutes=30)


def test_a_csv_logged_run_needs_no_mlflow(tmp_path):
    """GPU images often lack MLflow (scripts/gpu_check.sh's runs log to CSV): with
    ``logger=csv`` a run imports none of it, here with ``import mlflow`` made to fail."""
    run_dir = tmp_path / "run"
    without_mlflow = (
        "import runpy, sys; sys.modules['mlflow'] = None; sys.argv[0] = 'bidswarm.train'; "
        "runpy.run_module('bidswarm.train', run_name='__main__')"
    )
    command = [sys.executable, "-c", without_mlflow, f"hydra.run.dir={run_dir}", *SMOKE[:2]]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    finished(run_dir)


# -- one CUDA device ---------------------------------------------------------------------------
SMOKE = ("debug=smoke", "logger=csv", "trainer.devices=1")


def finished(run_dir: Path) -> dict:
    state = read_state(run_dir)
    assert "eval_after" in state and (run_dir / "final").is_dir()
    return state


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("trainer", ["gpu", "deepspeed_stage_2", "deepspeed_stage_3"])
def test_smoke_on_one_gpu(tmp_path, trainer):
    if trainer.startswith("deepspeed"):
        pytest.importorskip("deepspeed")
    deepspeed = trainer.startswith("deepspeed")  # one global clip, no relabel rounds
    clip = ("rl.grad_clip=0", "bids=anchored") if deepspeed else ()
    run_dir = run_cli(tmp_path, *SMOKE, f"trainer={trainer}", *clip)
    finished(run_dir)
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)
    for update in checkpoint["bidswarm"]["history"]:
        kind = "update_bid" if update["update_is_bid"] else "update_action"
        for phase in ("collect", kind):
            peak = update[f"memory/peak_gpu_gib/{phase}"]
            assert 0 < peak <= update[f"memory/peak_reserved_gpu_gib/{phase}"]
            assert update[f"memory/gpu_used_gib/{phase}"] > 0


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize(
    "overrides",
    [
        ("trainer=ddp", "trainer.accelerator=gpu"),
        # the README's srun line, on one node
        ("trainer=multinode", "rl.grad_clip=0", "bids=anchored", "trainer.num_nodes=1"),
    ],
    ids=["ddp", "multinode"],
)
def test_torchrun_launch_on_one_gpu(tmp_path, overrides):
    """The README's launch command (``torchrun ... -m bidswarm.train``) with one process."""
    if "trainer=multinode" in overrides:
        pytest.importorskip("deepspeed")  # its strategy is ZeRO-2
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    run_dir = tmp_path / "run"
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    command = [torchrun or "torchrun", "--nproc_per_node=1", "-m", "bidswarm.train"]
    command += [f"hydra.run.dir={run_dir}", *SMOKE, *overrides]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert finished(run_dir)["rl_world_size"] == 1
