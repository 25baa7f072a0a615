"""What a config asks of this machine (CUDA, GPUs, DeepSpeed, vLLM's environment, the judge's
key variable): the one config check that imports torch, kept apart so that the schemas and
:func:`validate` do not."""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path
from typing import Any

from bidswarm.checks import Problems
from bidswarm.config.validation import ConfigError


def check_machine(cfg: Any) -> None:
    """What the config asks of this machine: CUDA for a GPU trainer, enough GPUs, DeepSpeed
    installed, the LLM judge's key variable set. Raises :class:`ConfigError`."""
    import torch

    problems = Problems()
    trainer = cfg.trainer
    if trainer.accelerator in ("gpu", "cuda"):
        problems.require(
            torch.cuda.is_available(),
            "trainer.accelerator",
            trainer.accelerator,
            "no CUDA device is visible on this machine; use trainer=cpu (or trainer=ddp on CPU)",
        )
        wanted = trainer.devices if isinstance(trainer.devices, int) else 0
        problems.require(
            not torch.cuda.is_available() or wanted <= torch.cuda.device_count(),
            "trainer.devices",
            trainer.devices,
            f"this machine has {torch.cuda.device_count()} CUDA devices",
        )
    if str(trainer.strategy).startswith("deepspeed"):
        problems.require(
            importlib.util.find_spec("deepspeed") is not None,
            "trainer.strategy",
            trainer.strategy,
            "needs DeepSpeed: pip install -e '.[deepspeed]'",
        )
    if cfg.model.engine == "vllm":
        _vllm_problems(cfg.model, problems, torch.cuda.is_available())
    key_env = cfg.task.get("judge_api_key_env") if cfg.task.get("judge") == "llm" else None
    if key_env:
        problems.require(
            key_env in os.environ,
            "task.judge_api_key_env",
            key_env,
            "names an environment variable that is not set",
        )
    if problems:
        raise ConfigError("this machine cannot run the config:\n  " + "\n  ".join(problems))


def vllm_python(settings: Any) -> str | None:
    """The interpreter of vLLM's environment (``model.vllm``): ``python`` when set, else
    ``BIDSWARM_VLLM_PYTHON``, else ``.venv-vllm/bin/python`` beside the project (``make vllm``)
    when it exists; None when there is none."""
    if settings.python:
        return settings.python
    named = os.environ.get("BIDSWARM_VLLM_PYTHON")
    if named:
        return named
    beside = Path(__file__).resolve().parents[3] / ".venv-vllm" / "bin" / "python"
    return str(beside) if beside.exists() else None


VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""The attention head sizes vLLM's CPU attention computes (vllm-cpu 0.32)."""
VLLM_CPU_BLOCK_MULTIPLE = 32
"""vLLM's CPU attention takes KV cache blocks of a multiple of this many tokens (vllm-cpu
0.32)."""


def _vllm_problems(model: Any, problems: Problems, cuda: bool) -> None:
    """``model.engine=vllm``: an interpreter that has vLLM (``make vllm``), and on a CPU a
    tiny model's head size that vLLM's CPU attention computes."""
    python = vllm_python(model.vllm)
    if python is None:
        problems.require(
            False,
            "model.engine",
            model.engine,
            "needs vLLM's environment: run `make vllm` (installs .venv-vllm) or set "
            "model.vllm.python (or BIDSWARM_VLLM_PYTHON) to an interpreter that has vllm",
        )
        return
    found = subprocess.run(
        [
            python,
            "-I",
            "-c",
            "import importlib.util as u, sys; sys.exit(u.find_spec('vllm') is None)",
        ],
        capture_output=True,
    )
    problems.require(
        found.returncode == 0,
        "model.vllm.python",
        python,
        "must be an interpreter that has vllm (`make vllm` installs .venv-vllm)",
    )
    block = model.vllm.block_size
    if block is not None and block > 0 and not cuda:
        problems.require(
            block % VLLM_CPU_BLOCK_MULTIPLE == 0,
            "model.vllm.block_size",
            block,
            f"a multiple of {VLLM_CPU_BLOCK_MULTIPLE} on a CPU (vLLM's CPU attention), "
            "e.g. 32, 64 or 128",
        )
    if model.source == "tiny" and not cuda:
        head = model.tiny.head_dim or model.tiny.hidden_size // max(model.tiny.num_heads, 1)
        problems.require(
            head in VLLM_CPU_HEAD_SIZES,
            "model.tiny.head_dim",
            head,
            f"one of {list(VLLM_CPU_HEAD_SIZES)} with model.engine=vllm on a CPU (vLLM's CPU "
            "attention); e.g. model.tiny.num_heads=2 for hidden_size 64",
        )
