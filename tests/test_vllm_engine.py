"""``model.engine=vllm``: vLLM's CPU build, started from its own environment (``make vllm``),
serving tiny agents: the replies are the learner's, the weights follow every update, LoRA
agents each get their own replies, forks and evaluations run through it, and a dead engine
gives a clear error. Tier ``vllm`` (``make test-vllm``, CI): it needs .venv-vllm."""

from __future__ import annotations

import os
import random
import signal

import pytest
import torch

from bidswarm import metric_names as names
from bidswarm.agents.population import Population
from bidswarm.agents.prompts import PromptTemplate, parse_bid
from bidswarm.config import ModelConfig, RLConfig, TinyArchConfig
from bidswarm.config.machine import vllm_python
from bidswarm.coordination import RULES
from bidswarm.coordination.auction import Auction
from bidswarm.engines import PromptBatch
from bidswarm.engines.hf import HFEngine
from bidswarm.engines.vllm_engine import EngineStopped, VLLMEngine
from bidswarm.envs.base import MONOLITHIC
from bidswarm.envs.crafting import CraftingConfig, CraftingEnv
from bidswarm.envs.experts import format_bid
from bidswarm.envs.memory import MemoryConfig
from bidswarm.rollout.evaluation import evaluate
from bidswarm.rollout.forks import fork_pairs
from bidswarm.rollout.loop import RolloutLoop
from bidswarm.rollout.swarm import Swarm
from test_agents import ROLES, corpus

pytestmark = pytest.mark.vllm

LEVELS = [0.0, 0.2, 0.4, 0.6, 0.8]
MAX_MODEL_LEN = 320


def vllm_config(**overrides) -> ModelConfig:
    """A tiny model vLLM's CPU attention computes: head size 32 (64 / 2 heads)."""
    arch = TinyArchConfig(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128)
    return ModelConfig(
        name="tiny", source="tiny", prompt_style="compact", tiny=arch, max_prompt_tokens=256,
        **overrides,
    )  # fmt: skip


def engine_for(population: Population, block_size: int | None = None) -> VLLMEngine:
    python = vllm_python(ModelConfig().vllm)
    assert python is not None, "the vllm tier needs vLLM's environment: run `make vllm`"
    settings = ModelConfig().vllm
    served = 1 if population.is_lora else len(population)
    return VLLMEngine(
        python, torch.float32, MAX_MODEL_LEN, settings.kv_cache_gib,
        settings.gpu_memory_utilization, settings.enforce_eager, 1, settings.start_timeout_s,
        served, seed=0, block_size=block_size,
    )  # fmt: skip


def varied(population: Population) -> Population:
    """Large random weights (LoRA: adapters' B too): greedy replies differ from token to
    token, prompt to prompt and agent to agent (a fresh tiny model repeats one token)."""
    with torch.no_grad():
        for agent in population:
            for name, parameter in agent.model.named_parameters():
                if "lora_B" in name or (parameter.dim() == 2 and "lora_" not in name):
                    parameter.normal_(0.0, 0.3)
    return population


@pytest.fixture(scope="module")
def full() -> tuple[Population, VLLMEngine]:
    torch.manual_seed(0)
    population = varied(Population.build(vllm_config(), ROLES, 1, corpus()))
    engine = engine_for(population)
    yield population, engine
    engine.close()


def greedy(engine, population: Population, prompts: list[str], tokens: int = 6):
    batches = [PromptBatch(agent, agent.encode_prompts(prompts)) for agent in population]
    return [
        [g.reply_ids for g in replies] for replies in engine.generate(batches, tokens, 0.0, None)
    ]


PROMPTS = ["logger bid: step 3 ->", "miner bid: inventory: oak log ->", "smith act: step 7 ->"]


def test_greedy_replies_and_their_logprobs_are_the_learners(full):
    population, engine = full
    hf = HFEngine.from_config(vllm_config())
    batches = [PromptBatch(agent, agent.encode_prompts(PROMPTS)) for agent in population]
    served = engine.generate(batches, 6, 0.0, None)
    learned = hf.generate(batches, 6, 0.0, None)
    assert served == learned  # the same tokens, agent by agent and prompt by prompt
    assert len({tuple(g.reply_ids) for replies in served for g in replies}) == 9
    for replies in served:
        for generation in replies:
            policy = population[served.index(replies)]
            logprobs, _ = policy.reply_token_logprobs(
                [generation.prompt_ids], [generation.reply_ids]
            )
            torch.testing.assert_close(
                torch.tensor(generation.logprobs), logprobs[0].detach(), atol=1e-3, rtol=0
            )


def test_the_weights_follow_every_update_and_only_the_changed_agent_reloads(full):
    population, engine = full
    hf = HFEngine.from_config(vllm_config())
    before = greedy(engine, population, PROMPTS)
    loads = engine.metrics()[names.ENGINE_WEIGHT_LOADS]
    policy = population[1]
    optimizer = torch.optim.SGD(policy.parameters(), lr=2.0)
    logprobs, mask = policy.reply_token_logprobs(
        policy.encode_prompts(PROMPTS), [policy.encode_reply(" chop a tree")] * 3
    )
    (-(logprobs * mask).sum()).backward()
    optimizer.step()
    after = greedy(engine, population, PROMPTS)
    assert after == greedy(hf, population, PROMPTS)  # the learner's new greedy replies
    assert after[1] != before[1] and after[0] == before[0] and after[2] == before[2]
    assert engine.metrics()[names.ENGINE_WEIGHT_LOADS] == loads + 1


def test_sampling_is_reproducible_from_the_callers_generator(full):
    population, engine = full
    batches = [PromptBatch(agent, agent.encode_prompts(PROMPTS * 4)) for agent in population]

    def sample(seed: int):
        return engine.generate(batches, 6, 1.0, torch.Generator().manual_seed(seed))

    first = sample(3)
    assert sample(3) == first
    assert sample(4) != first
    assert len({tuple(g.reply_ids) for g in first[0]}) > 4  # rows sample independently


def test_lora_agents_each_get_their_own_replies_under_a_fresh_name_per_version():
    torch.manual_seed(0)
    population = varied(Population.build(vllm_config(adapter="lora"), ROLES, 1, corpus()))
    engine = engine_for(population)
    try:
        hf = HFEngine.from_config(vllm_config(adapter="lora"))
        served = greedy(engine, population, PROMPTS)
        per_agent = [greedy(hf, Population([agent]), PROMPTS)[0] for agent in population]
        assert served == per_agent
        assert served[0] != served[1] != served[2]
        names = dict(next(iter(engine._served.values())).adapters)
        with torch.no_grad():
            for parameter in population[2].trainable_parameters():
                parameter.add_(0.5 * torch.randn_like(parameter))
        after = greedy(engine, population, PROMPTS)
        assert after[2] == greedy(hf, Population([population[2]]), PROMPTS)[0] != served[2]
        renamed = next(iter(engine._served.values())).adapters
        assert renamed[id(population[2])][:2] != names[id(population[2])][:2]  # name and id
        assert renamed[id(population[0])] == names[id(population[0])]
    finally:
        engine.close()


def test_the_prefix_cache_serves_a_shared_prompt_start_in_whole_blocks():
    """``model.vllm.block_size``: prompts sharing a start of ~70 tokens, asked twice; vLLM's
    prefix cache serves whole blocks of it, so blocks of 32 tokens serve a share of the prompt
    tokens (``engine/prefix_cached_frac``) and its CPU default of 128 none."""
    torch.manual_seed(0)
    population = Population.build(vllm_config(), ROLES[:1], 1, corpus())
    agent = population[0]
    header = "logger bid: " + " ".join(["inventory: 3 oak log, 2 stick."] * 8)
    prompts = agent.encode_prompts([f"{header} step {n} ->" for n in range(4)])
    shared = min(len(ids) for ids in prompts) - 4
    assert 64 < shared < 128
    found = {}
    for block_size in (32, None):
        engine = engine_for(population, block_size)
        try:
            replies = [engine.generate([PromptBatch(agent, prompts)], 4, 0.0, None) for _ in "ab"]
            found[block_size] = engine.metrics()[names.ENGINE_PREFIX_CACHED_FRAC]
            assert replies[0] == replies[1]
            assert names.ENGINE_PREFIX_CACHED_FRAC not in engine.metrics()  # read: counted anew
        finally:
            engine.close()
    given = 2 * sum(map(len, prompts))
    assert found[None] == 0.0
    # at least the second call's whole blocks of the shared start (64 tokens a prompt)
    assert found[32] >= 4 * 64 / given


def bid_trained(population: Population, template: PromptTemplate, env: CraftingEnv) -> None:
    """A few steps of supervised bids (the canonical reply of a level) so that bid replies
    parse, as after the SFT cold start."""
    for agent in population:
        optimizer = torch.optim.Adam(agent.parameters(), lr=1e-2)
        prompts = agent.encode_prompts([template.bid(agent.role, env.observation(agent.role))])
        reply = agent.encode_reply(template.reply_text(format_bid(0.4)))
        for _ in range(40):
            logprobs, mask = agent.reply_token_logprobs(prompts, [reply])
            optimizer.zero_grad()
            (-(logprobs * mask).sum()).backward()
            optimizer.step()


def test_bids_parse_and_a_fork_and_an_evaluation_run_through_vllm(full):
    torch.manual_seed(1)
    population = Population.build(vllm_config(), ROLES, 1, corpus())
    make_env = lambda: CraftingEnv(CraftingConfig(max_decisions=5))  # noqa: E731
    env = make_env()
    env.reset(0)
    template = PromptTemplate.for_env(env, "compact", population[0].tokenizer, LEVELS)
    bid_trained(population, template, env)
    engine = engine_for(population)
    try:
        swarm = Swarm(population, template, 3, 6, 1.0, engine)
        loop = RolloutLoop(make_env, swarm, Auction())
        evaluation = evaluate(loop, [1_000_000, 1_000_001], 2, seed=0, batch_size=4)
        assert len(evaluation.episodes) == 4
        bids = [bid for e in evaluation.episodes for s in e.steps for bid in s.bids.values()]
        assert bids and sum(bid.parsed for bid in bids) / len(bids) > 0.9
        assert all(parse_bid(b.reply.text, LEVELS) == (b.level, b.parsed) for b in bids)
        assert all(bid.reply.sampled_logprobs for bid in bids)  # the engine's, per token
        generator = torch.Generator().manual_seed(0)
        episodes = loop.run([0, 1, 2, 3], random.Random(0), generator, keep_snapshots=True)
        rl = RLConfig(fork_budget=4)
        pairs, stats = fork_pairs(loop, episodes, rl, random.Random(0), generator)
        # the default redraw samples the winner's replies through the engine; a fork whose
        # samples never parse below the runner-up is not played
        assert stats.chosen > 0 and 0 < stats.resampled_below <= stats.chosen
        assert stats.pairs + stats.tied == stats.resampled_below
        assert all(p.preferred_sampled_logprobs or p.rejected_sampled_logprobs for p in pairs)
    finally:
        engine.close()


@pytest.fixture(scope="module")
def monolithic(full) -> Population:
    """One agent that owns every role, served by the same engine process as ``full``."""
    torch.manual_seed(2)
    return varied(Population.build(vllm_config(), [MONOLITHIC], 1, corpus()))


@pytest.mark.parametrize("rule", sorted(RULES))
def test_every_rule_evaluates_through_vllm_with_the_shared_memory_on(full, monolithic, rule):
    population, engine = full
    rule_class = RULES[rule]
    agents = monolithic if rule_class.monolithic else population
    if rule_class.needs_decider:  # the decider is read on the learner's weights, as the hf engine
        agents = agents.with_decider(vllm_config())
    config = CraftingConfig(max_decisions=4, memory=MemoryConfig(size=4))
    env = CraftingEnv(config)
    template = PromptTemplate.for_env(env, "compact", agents[0].tokenizer, LEVELS)
    swarm = Swarm(agents, template, 3, 6, 1.0, engine)
    loop = RolloutLoop(
        lambda: CraftingEnv(config), swarm, rule_class.from_config(rule_class.Config(name=rule))
    )
    evaluation = evaluate(loop, [1_000_000, 1_000_001], 1, seed=0, batch_size=2)
    steps = [step for episode in evaluation.episodes for step in episode.steps]
    assert len(evaluation.episodes) == 2 and steps
    # Every reply the rule asked for (bids, actions; these untrained agents' bids rarely parse,
    # so an auction may skip every step) was sampled by the engine, with its log-probs.
    replies = [bid.reply for step in steps for bid in step.bids.values()]
    replies += [step.action for step in steps if step.action is not None]
    assert replies and all(len(r.sampled_logprobs) == len(r.reply_ids) > 0 for r in replies)


def test_a_dead_engine_stops_the_next_call_naming_it_and_its_log(full):
    torch.manual_seed(2)
    population = Population.build(vllm_config(), ROLES[:1], 1, corpus())
    engine = engine_for(population)
    greedy(engine, population, PROMPTS)
    process = engine._process
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    with pytest.raises(EngineStopped, match=rf"vLLM engine process \(pid {process.pid}.*log"):
        greedy(engine, population, PROMPTS)
    folder = engine._folder
    engine.close()
    assert folder is None or not folder.exists()


def test_closing_ends_the_process_and_removes_its_folder(full):
    torch.manual_seed(3)
    population = Population.build(vllm_config(), ROLES[:1], 1, corpus())
    engine = engine_for(population)
    greedy(engine, population, PROMPTS)
    process, folder = engine._process, engine._folder
    assert folder.is_dir() and process.poll() is None
    engine.close()
    assert process.poll() is not None and not folder.exists()
