"""Configs: the schemas of every group (``schemas.py``, their fixed choices in ``choices.py``),
the value checks on a composed config (``validation.py``), the key a misspelled one meant
(``keys.py``) and what a config asks of this machine (``machine.py``, the only one that imports
torch). The public names are re-exported here: ``from bidswarm.config import RLConfig,
validate``, with the group schemas that live beside their pieces (``CoordinationConfig``,
``CreditConfig``, ``TaskConfig``)."""

from __future__ import annotations

from bidswarm.algorithms.credit import CreditConfig
from bidswarm.checks import Problems
from bidswarm.config.choices import (
    Adapter,
    BidResampling,
    BidSlotWithoutBids,
    BidTies,
    DType,
    Engine,
    ForkSelection,
    ForkSteps,
    KVCache,
    MalformedResample,
    ModelSource,
    PromptStyle,
    SFTDemonstrations,
    SFTMatch,
)
from bidswarm.config.machine import check_machine
from bidswarm.config.schemas import (
    EvalConfig,
    LoggerConfig,
    LoraSettings,
    ModelConfig,
    RLConfig,
    SFTConfig,
    TinyArchConfig,
    TrainConfig,
    TrainerConfig,
    VLLMSettings,
    register_configs,
)
from bidswarm.config.validation import (
    ACCELERATORS,
    GROUPS,
    LOGGERS,
    OPTIONAL_GROUPS,
    PRECISIONS,
    STRATEGIES,
    TRACKING_SCHEMES,
    ConfigError,
    refuse_misspelled_keys,
    refuse_unknown_choices,
    tracking_uri_problems,
    unknown_keys,
    validate,
)
from bidswarm.coordination import CoordinationConfig
from bidswarm.envs.base import TaskConfig

__all__ = [
    "ACCELERATORS",
    "GROUPS",
    "LOGGERS",
    "OPTIONAL_GROUPS",
    "PRECISIONS",
    "STRATEGIES",
    "TRACKING_SCHEMES",
    "Adapter",
    "BidResampling",
    "BidSlotWithoutBids",
    "BidTies",
    "ConfigError",
    "CoordinationConfig",
    "CreditConfig",
    "DType",
    "Engine",
    "EvalConfig",
    "ForkSelection",
    "ForkSteps",
    "KVCache",
    "LoggerConfig",
    "LoraSettings",
    "MalformedResample",
    "ModelConfig",
    "ModelSource",
    "Problems",
    "PromptStyle",
    "RLConfig",
    "SFTConfig",
    "SFTDemonstrations",
    "SFTMatch",
    "TaskConfig",
    "TinyArchConfig",
    "TrainConfig",
    "TrainerConfig",
    "VLLMSettings",
    "check_machine",
    "refuse_misspelled_keys",
    "refuse_unknown_choices",
    "register_configs",
    "tracking_uri_problems",
    "unknown_keys",
    "validate",
]
