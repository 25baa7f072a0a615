"""FLOPs per token (``agents/flops.py``): full fine-tuning and LoRA, worked out by hand."""

from __future__ import annotations

import pytest
import torch

from bidswarm.agents.flops import ParameterCounts
from bidswarm.agents.models import load_model_and_tokenizer
from bidswarm.agents.policy import AgentPolicy
from bidswarm.agents.population import Population
from bidswarm.lit.sft import AgentPlan, SFTExample, sft_budget
from bidswarm.rollout.batches import ActionBatch
from bidswarm.rollout.swarm import _generated_tokens
from bidswarm.rollout.usage import Usage
from test_agents import (
    ROLES,
    corpus,
    hf_decoder,
    shared_header_prompts,
    tiny_config,
    varied_agent,
)

HIDDEN, INTERMEDIATE, LAYERS = 32, 64, 2  # tiny_config()'s shape


def llama_weights(vocab: int, tied: bool) -> int:
    """The tiny Llama's weights, by hand: embedding (and output layer unless tied), per layer
    q, k, v, o (hidden x hidden), gate, up, down (hidden x intermediate) and two norms, the
    final norm."""
    layer = 4 * HIDDEN * HIDDEN + 3 * HIDDEN * INTERMEDIATE + 2 * HIDDEN
    return vocab * HIDDEN * (1 if tied else 2) + LAYERS * layer + HIDDEN


def adapter_weights(rank: int) -> int:
    """One LoRA adapter on every linear layer of a block: rank x (in + out) per layer."""
    layer = 4 * rank * (HIDDEN + HIDDEN) + 3 * rank * (HIDDEN + INTERMEDIATE)
    return LAYERS * layer


def test_a_token_costs_two_flops_per_weight_forward_and_six_trained_when_fully_fine_tuned():
    usage = Usage()
    weights = ParameterCounts(frozen=0, trained=1000)
    usage.count_rollout(weights, tokens=10)
    usage.count_trained(weights, tokens=3)
    assert usage.rollout_flops == 2 * 1000 * 10
    assert usage.train_flops == 6 * 1000 * 3


def test_a_lora_token_trains_the_adapter_at_six_and_backpropagates_through_the_base_at_four():
    usage = Usage()
    weights = ParameterCounts(frozen=1000, trained=10)
    usage.count_rollout(weights, tokens=10)
    usage.count_trained(weights, tokens=3)
    assert usage.rollout_flops == 2 * (1000 + 10) * 10
    # forward 2 x 1010, activation gradients 2 x 1010, weight gradients 2 x 10 (adapter only)
    assert usage.train_flops == (2 * 1010 + 2 * 1010 + 2 * 10) * 3 == (4 * 1000 + 6 * 10) * 3


def test_a_fully_fine_tuned_agent_counts_every_weight_as_trained():
    torch.manual_seed(0)
    model, tokenizer = load_model_and_tokenizer(tiny_config(), corpus())
    agent = AgentPolicy(model, tokenizer, "logger", max_prompt_tokens=768)
    tied = model.config.tie_word_embeddings
    assert agent.parameter_counts() == ParameterCounts(0, llama_weights(len(tokenizer), tied))


def test_a_lora_agent_runs_through_the_base_and_its_own_adapter_only():
    pytest.importorskip("peft")
    torch.manual_seed(0)
    config = tiny_config(adapter="lora")
    population = Population.build(config, ROLES, replicas=2, corpus=corpus())  # 6 adapters
    vocab = len(population[0].tokenizer)
    base = llama_weights(vocab, population[0].model.config.tie_word_embeddings)
    for agent in population:
        assert agent.parameter_counts() == ParameterCounts(base, adapter_weights(config.lora.rank))


def test_sft_flops_follow_the_same_rate():
    pytest.importorskip("peft")
    torch.manual_seed(0)
    config = tiny_config(adapter="lora")
    population = Population.build(config, ROLES, replicas=1, corpus=corpus())
    examples = [SFTExample([1] * 7, [2] * 3, "action"), SFTExample([1] * 4, [2], "bid")]
    plan = AgentPlan(examples, stream=[0, 1, 0], batch_size=2)  # 10 + 5 + 10 tokens
    budget = sft_budget(population, [plan] * len(population), None)
    vocab = len(population[0].tokenizer)
    base = llama_weights(vocab, population[0].model.config.tie_word_embeddings)
    per_agent = 25 * (4 * base + 6 * adapter_weights(config.lora.rank))
    assert budget["sft/flops/agent0_logger"] == per_agent
    assert budget["sft/flops"] == len(population) * per_agent


def test_a_prompt_prefix_computed_once_is_counted_once():
    torch.manual_seed(0)
    model, tokenizer = load_model_and_tokenizer(tiny_config(), corpus())
    agent = varied_agent(AgentPolicy(model, tokenizer, "logger", max_prompt_tokens=768))
    decoder = hf_decoder(agent)
    prompts = shared_header_prompts()
    rows = agent.encode_prompts(prompts)
    decoder.min_shared_prefix = 10**6  # never share
    apart = decoder.generate(rows, max_new_tokens=4, temperature=0.0)
    decoder.min_shared_prefix = 8
    shared = decoder.generate(rows, max_new_tokens=4, temperature=0.0)
    prefix = shared[0].shared_prefix
    assert prefix >= 8 and all(g.shared_prefix == prefix for g in shared)
    assert all(g.shared_prefix == 0 for g in apart)
    every_row = sum(len(p) for p in rows) + sum(len(g.reply_ids) for g in apart)
    assert _generated_tokens(apart) == every_row
    assert _generated_tokens(shared) == every_row - (len(rows) - 1) * prefix


def test_a_prompt_head_the_learner_computes_once_is_counted_once():
    torch.manual_seed(0)
    model, tokenizer = load_model_and_tokenizer(tiny_config(), corpus())
    agent = AgentPolicy(model, tokenizer, "logger", max_prompt_tokens=768)
    prompts = agent.encode_prompts(shared_header_prompts())
    replies = [agent.encode_reply(text) for text in ["chop a tree", "0.8", "mine stone"]]
    replies = (replies * 3)[: len(prompts)]
    rows = len(prompts)
    head = agent.prompt_head_length(prompts)
    every_row = sum(len(p) + len(r) for p, r in zip(prompts, replies, strict=True))
    once = every_row - (rows - 1) * head
    assert head > 0 and agent.forward_tokens(prompts, replies) == once
    batch = ActionBatch(0, prompts, replies, [1.0] * rows, [0] * rows, [()] * rows)
    assert batch.learner_tokens(agent, None) == once
    two_rows = 2 * max(agent.forward_row_tokens(prompts, replies))
    forwards = batch.forwards(agent, two_rows)
    assert len(forwards) == -(-rows // 2)
    counted = batch.learner_tokens(agent, two_rows)
    assert counted == sum(agent.forward_tokens(f.prompt_ids, f.reply_ids) for f in forwards)
    assert counted > once  # a head per forward (a forward of one row computes it in full)
    examples = [SFTExample(p, r, "action") for p, r in zip(prompts, replies, strict=True)]
    plan = AgentPlan(examples, stream=list(range(rows)), batch_size=rows)
    assert plan.forward_tokens(agent, None) == once
