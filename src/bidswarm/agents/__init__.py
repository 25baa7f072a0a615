"""LLM agents: models, tokenizer, prompt templates, the per-agent policy and the population."""

from __future__ import annotations

from bidswarm.agents.models import load_model_and_tokenizer
from bidswarm.agents.policy import AgentPolicy
from bidswarm.agents.population import Population
from bidswarm.agents.prompts import PromptTemplate, parse_bid
from bidswarm.agents.tokenizer import build_tokenizer

__all__ = [
    "AgentPolicy",
    "Population",
    "PromptTemplate",
    "build_tokenizer",
    "load_model_and_tokenizer",
    "parse_bid",
]
