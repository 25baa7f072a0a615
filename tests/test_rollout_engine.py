"""The rollout engine's settings: the KV cache and the compiled decode step (the decode loop
itself is tested in test_agents.py, which also runs on the oldest transformers)."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

from bidswarm.config import ConfigError, register_configs, validate
from conftest import CONF

register_configs()


def compose_train(overrides: list[str]):
    with initialize_config_dir(str(CONF), version_base="1.3"):
        return compose("train", overrides=overrides)


def test_compiling_the_decode_step_needs_a_cache_of_fixed_shapes():
    validate(compose_train(["model.kv_cache=static", "model.compile_decode=true"]))
    validate(compose_train(["model.compile_decode=true"]))  # auto: static on CUDA
    cfg = compose_train(["model.kv_cache=dynamic", "model.compile_decode=true"])
    with pytest.raises(ConfigError, match=r"model\.kv_cache='dynamic': static or auto"):
        validate(cfg)
