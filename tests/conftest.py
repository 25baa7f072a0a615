"""Shared fixtures: the config folder, and a guard against tests leaking environment variables."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"


def sweep_command(sweep_dir: Path, *overrides: str) -> list[str]:
    """``python -m bidswarm.train -m <overrides>`` with its sweep folder ``sweep_dir``."""
    return [
        sys.executable,
        "-m",
        "bidswarm.train",
        "-m",
        *overrides,
        f"hydra.sweep.dir={sweep_dir}",
    ]


TINY_BID_LEVELS = [0.0, 0.2, 0.4, 0.6, 0.8]


def hf_engine():
    """The ``hf`` rollout engine as a run's config makes it by default (the schema's)."""
    from bidswarm.config import ModelConfig
    from bidswarm.engines.hf import HFEngine

    return HFEngine.from_config(ModelConfig())


def tiny_crafting_swarm(max_decisions: int):
    """A seeded one-layer tiny population, one agent per crafting role with compact prompts,
    in a rollout loop under the auction: ``(env, population, loop)``, the same weights in every
    process that calls it."""
    from bidswarm.agents.population import Population
    from bidswarm.agents.prompts import PromptTemplate
    from bidswarm.config import ModelConfig, TinyArchConfig
    from bidswarm.coordination.auction import Auction
    from bidswarm.envs.crafting import CraftingConfig, CraftingEnv
    from bidswarm.rollout.loop import RolloutLoop
    from bidswarm.rollout.swarm import Swarm

    def make_env() -> CraftingEnv:
        return CraftingEnv(CraftingConfig(max_decisions=max_decisions))

    env = make_env()
    env.reset(0)
    texts = PromptTemplate.for_env(env, "compact", None, TINY_BID_LEVELS)
    corpus = [texts.action(r, env.observation(r)) + " chop a tree 0.8" for r in env.roles]
    arch = TinyArchConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    model = ModelConfig(name="tiny", source="tiny", prompt_style="compact", tiny=arch)
    torch.manual_seed(0)
    population = Population.build(model, list(env.roles), 1, corpus)
    prompts = PromptTemplate.for_env(
        env, "compact", population.agents[0].tokenizer, TINY_BID_LEVELS
    )
    loop = RolloutLoop(make_env, Swarm(population, prompts, 3, 6, 1.0, hf_engine()), Auction())
    return env, population, loop


# Two cores shared by everything on CI: one intra-op thread keeps tests predictable.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _no_leaked_environment():
    before = dict(os.environ)
    yield
    after = dict(os.environ)
    leaked = {k for k in after.keys() ^ before.keys()} | {
        k for k in after.keys() & before.keys() if after[k] != before[k]
    }
    # Libraries set a few process-wide variables on first import; those are not test leaks.
    leaked = {
        k
        for k in leaked
        if not k.startswith(
            (
                "KMP_",
                "OMP_",
                "MKL_",
                "TOKENIZERS_",
                "PYTEST_",
                "TORCHINDUCTOR_",
                "_MLFLOW_TELEMETRY_",
                # DeepSpeed and Lightning set it when first imported (transformers' save path
                # may be the first to import DeepSpeed).
                "PYTORCH_NVML_BASED_CUDA_CHECK",
            )
        )
    }
    assert not leaked, f"test leaked environment variables: {sorted(leaked)}"


@pytest.fixture(scope="module")
def research_cache(tmp_path_factory) -> str:
    """A temporary folder for the research task's BM25 index, built once per test module."""
    return str(tmp_path_factory.mktemp("research_cache"))


@pytest.fixture
def config(research_cache):
    """Per task, the config fields that keep it cheap in tests (research: the BM25 index in a
    temporary folder, built once for the module)."""
    return lambda name: {"cache_dir": research_cache} if name == "research" else {}
