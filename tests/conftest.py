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
