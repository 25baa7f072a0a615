"""Rollout engines: what generates the agents' replies (``model.engine``).

``hf`` (``engines/hf.py``) is bidswarm's own decode loop, ``vllm`` (``engines/vllm_engine.py``)
the engine the field uses, in a process of its own environment. Both answer
:class:`~bidswarm.engines.base.RolloutEngine`'s one call; the collector never knows which ran.
"""

from __future__ import annotations

from typing import Any

from bidswarm.agents.models import torch_dtype
from bidswarm.config import Engine
from bidswarm.config.machine import vllm_python
from bidswarm.engines.base import Generation, PromptBatch, RolloutEngine, rollout_dtype


def make_engine(model_cfg: Any, max_model_len: int, engines: int, seed: int) -> RolloutEngine:
    """The engine ``model.engine`` names. ``max_model_len``: prompt + reply tokens of the
    longest request; ``engines``: how many models it will serve (a vLLM engine per fully
    fine-tuned agent, one per LoRA base); ``seed``: the run's."""
    if Engine(model_cfg.engine) == Engine.hf:
        from bidswarm.engines.hf import HFEngine

        return HFEngine.from_config(model_cfg)
    from bidswarm.engines.vllm_engine import VLLMEngine

    settings = model_cfg.vllm
    python = vllm_python(settings)
    if python is None:
        raise FileNotFoundError(
            "model.engine=vllm needs vLLM's environment: `make vllm` installs it "
            "(.venv-vllm), or set model.vllm.python to an interpreter that has vllm"
        )
    return VLLMEngine(
        python=python,
        dtype=rollout_dtype(model_cfg) or torch_dtype(model_cfg.dtype),
        max_model_len=max_model_len,
        kv_cache_gib=settings.kv_cache_gib,
        gpu_memory_utilization=settings.gpu_memory_utilization,
        enforce_eager=settings.enforce_eager,
        threads=model_cfg.torch_threads,
        start_timeout_s=settings.start_timeout_s,
        engines=engines,
        seed=seed,
        block_size=settings.block_size,
    )


__all__ = ["Generation", "PromptBatch", "RolloutEngine", "make_engine", "rollout_dtype"]
