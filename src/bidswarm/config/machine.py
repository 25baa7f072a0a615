"""What a config asks of this machine (CUDA, GPUs, DeepSpeed, the judge's key variable): the
one config check that imports torch, kept apart so that the schemas and :func:`validate` do not."""

from __future__ import annotations

import importlib.util
import os
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
