"""The Lightning strategy object for ``trainer.strategy`` (a name in the trainer config).

Two names need arguments Lightning's defaults get wrong for bidswarm's learners:

- ``ddp``: agents that did not act in an update have no gradient, so DDP must allow unused
  parameters.
- ``deepspeed_stage_2`` / ``deepspeed_stage_3``: Lightning asks DeepSpeed for a micro-batch size
  and, unless given one, reads it from the train dataloader's ``batch_sampler``. The learners'
  dataloaders yield one update (or SFT step) at a time with ``batch_size=None``, so there is no
  batch sampler and the strategy dies at start. DeepSpeed uses the number only for throughput
  logging; an update is one "batch", so it is 1.
"""

from __future__ import annotations

from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, Strategy

DEEPSPEED_STAGES = {"deepspeed_stage_2": 2, "deepspeed_stage_3": 3}


def build_strategy(name: str) -> str | Strategy:
    """The strategy for ``trainer.strategy=name``; other names go to Lightning unchanged."""
    if name == "ddp":
        return DDPStrategy(find_unused_parameters=True)
    if name in DEEPSPEED_STAGES:
        return DeepSpeedStrategy(stage=DEEPSPEED_STAGES[name], logging_batch_size_per_gpu=1)
    return name
