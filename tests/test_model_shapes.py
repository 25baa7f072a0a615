"""Model configs shaped like public models: their parameter counts, built on the meta device."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from bidswarm.agents.models import load_model_and_tokenizer
from test_agents import corpus
from test_config import compose_train

# Parameters of the public checkpoints (their safetensors), and what the Llama block lacks.
LLAMA_3_2_1B = 1_235_814_400
QWEN3_4B = 4_022_468_096
QWEN3_4B_QK_NORMS = 36 * 2 * 128  # per layer a q and a k RMSNorm of head_dim weights


@pytest.mark.parametrize(
    "model, public", [("llama_1b", LLAMA_3_2_1B), ("llama_4b", QWEN3_4B - QWEN3_4B_QK_NORMS)]
)
def test_real_shaped_configs_have_the_public_models_parameter_count(model, public):
    cfg = compose_train([f"model={model}"]).model
    with torch.device("meta"):
        built, tokenizer = load_model_and_tokenizer(OmegaConf.to_object(cfg), corpus())
    assert sum(p.numel() for p in built.parameters()) == public
    assert built.dtype == torch.bfloat16
    assert built.get_input_embeddings().num_embeddings > len(tokenizer)
    assert built.is_gradient_checkpointing == cfg.gradient_checkpointing


def test_embedding_rows_below_the_tokenizer_fail():
    cfg = compose_train(["model=tiny", "model.tiny.embedding_rows=8"]).model
    with pytest.raises(ValueError, match="embedding_rows=8"):
        load_model_and_tokenizer(OmegaConf.to_object(cfg), corpus())
