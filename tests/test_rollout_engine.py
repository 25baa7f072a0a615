"""The rollout engine: its settings (KV cache, compiled decode step; the decode loop itself is
tested in test_agents.py, which also runs on the oldest transformers) and the bids and actions
of LoRA agents generated in one batch across their adapters, each after its own prompt head."""

from __future__ import annotations

import pytest
import torch
from hydra import compose, initialize_config_dir

from bidswarm.agents.branching import branch_logprobs
from bidswarm.agents.policy import shared_prefix_length
from bidswarm.agents.population import Population
from bidswarm.agents.prompts import PromptTemplate
from bidswarm.config import ConfigError, register_configs, validate
from bidswarm.engines import PromptBatch
from bidswarm.engines.hf import HFEngine
from bidswarm.envs.crafting import CraftingConfig, CraftingEnv
from bidswarm.rollout.swarm import Swarm
from bidswarm.rollout.usage import Usage
from bidswarm.run.build import build_rollout_loop
from conftest import CONF, hf_engine
from test_agents import OBSERVATIONS, ROLES, corpus, shared_header_prompts, tiny_config

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


# -- bids of LoRA agents in one generation batch -----------------------------------------------
def lora_swarm(adapter: str, temperature: float) -> Swarm:
    """Three agents whose replies differ from agent to agent and from prompt to prompt: large
    random base weights, and (LoRA) each adapter's B perturbed (adapters start at B = 0)."""
    torch.manual_seed(0)
    population = Population.build(tiny_config(adapter=adapter), ROLES, 1, corpus())
    with torch.no_grad():
        for agent in population:
            for name, parameter in agent.model.named_parameters():
                if "lora_B" in name or (parameter.dim() == 2 and "lora_" not in name):
                    parameter.normal_(0.0, 0.3)
    env = CraftingEnv(CraftingConfig(max_decisions=6))
    prompts = PromptTemplate.for_env(env, "compact", population[0].tokenizer, [0.0, 0.5, 1.0])
    return Swarm(population, prompts, 3, 6, temperature, hf_engine())


def worlds(seeds: range) -> list[CraftingEnv]:
    envs = []
    for seed in seeds:
        env = CraftingEnv(CraftingConfig(max_decisions=6))
        env.reset(seed)
        envs.append(env)
    return envs


AGENTS = [0, 1, 2]
ENVS = [worlds(range(0, 3)), worlds(range(1, 5)), worlds(range(7, 8))]


def count_forwards(swarm: Swarm) -> list[int]:
    """Rows of every forward of the real model (the transformer under peft's wrappers)."""
    rows: list[int] = []
    swarm.population[0].model.get_base_model().model.register_forward_hook(
        lambda module, args, kwargs, output: rows.append(kwargs["input_ids"].shape[0]),
        with_kwargs=True,
    )
    return rows


def test_lora_agents_bid_in_one_generation_batch_what_they_bid_one_by_one():
    swarm = lora_swarm("lora", temperature=0.0)
    per_agent = [
        swarm.bid(agent, envs, torch.Generator()) for agent, envs in zip(AGENTS, ENVS, strict=True)
    ]
    usage_per_agent, swarm.usage = swarm.usage, Usage()
    forwards = count_forwards(swarm)
    batched = swarm.bid_many(AGENTS, ENVS, torch.Generator())

    assert batched == per_agent
    assert swarm.usage == usage_per_agent  # tokens, FLOPs and bids counted per agent alike
    assert len({bid.reply.text for bids in batched for bid in bids}) > 3  # adapters differ
    assert forwards and len(forwards) <= swarm.max_bid_tokens  # one decode loop for all agents
    assert set(forwards) == {sum(len(envs) for envs in ENVS)}


def test_sampled_bids_across_adapters_are_reproducible():
    swarm = lora_swarm("lora", temperature=1.0)

    def sample(seed: int) -> list[list[str]]:
        bids = swarm.bid_many(AGENTS, ENVS, torch.Generator().manual_seed(seed))
        return [[bid.reply.text for bid in agent_bids] for agent_bids in bids]

    assert sample(1) == sample(1)
    assert sample(1) != sample(2)


def test_agents_with_their_own_weights_bid_one_batch_each_as_before():
    swarm = lora_swarm("full", temperature=1.0)
    generator = torch.Generator().manual_seed(0)
    one_by_one = [
        swarm.bid(agent, envs, generator) for agent, envs in zip(AGENTS, ENVS, strict=True)
    ]
    # Sampled alike: the same draws from the generator, in the same order.
    assert swarm.bid_many(AGENTS, ENVS, torch.Generator().manual_seed(0)) == one_by_one


def test_a_rollout_dtype_is_refused_under_deepspeed_only():
    validate(compose_train(["model.rollout_dtype=bfloat16"]))
    validate(compose_train(["model.rollout_dtype=bfloat16", "model.adapter=lora"]))
    deepspeed = compose_train(["model.rollout_dtype=bfloat16", "trainer=deepspeed_stage_2"])
    with pytest.raises(ConfigError, match=r"model\.rollout_dtype=.*DeepSpeed writes the weights"):
        validate(deepspeed)


def test_the_run_config_sets_how_every_agent_decodes():
    overrides = ["model.rollout_dtype=bfloat16", "model.kv_cache=static"]
    cfg = compose_train([*overrides, "model.compile_decode=true"])
    torch.manual_seed(0)
    population = Population.build(tiny_config(), ROLES, 1, corpus())
    loop = build_rollout_loop(cfg, population)
    assert loop.swarm.population is population
    for agent in population:
        decoder = loop.swarm.engine.decoder(agent)
        assert decoder.rollout_dtype == torch.bfloat16
        assert decoder.kv_cache == "static" and decoder.compile_decode
    default = build_rollout_loop(compose_train([]), population)
    assert default.swarm.engine.name == "hf"
    for agent in default.swarm.population:
        decoder = default.swarm.engine.decoder(agent)
        assert decoder.rollout_dtype is None
        assert decoder.kv_cache == "auto" and not decoder.compile_decode


def test_lora_agents_generate_on_one_cast_copy_each_through_its_own_adapter():
    """``model.rollout_dtype`` with LoRA agents: one bfloat16 copy of the shared peft model for
    all of them, each agent's rows through its own adapter whether it generates alone, with
    the others (one batch across adapters) or scores (its replies score on the copy as its own
    float32 weights score them, not as another agent's), refreshed after an update."""
    swarm = lora_swarm("lora", temperature=0.0)
    agents = list(swarm.population)
    engine = HFEngine("dynamic", False, torch.bfloat16)
    envs = worlds(range(4))
    prompt_ids = [
        agent.encode_prompts(
            [swarm.prompts.bid(agent.role, env.observation(agent.role)) for env in envs]
        )
        for agent in agents
    ]
    together = engine.generate(
        [PromptBatch(agent, ids) for agent, ids in zip(agents, prompt_ids, strict=True)],
        6,
        0.0,
        None,
    )
    alone = [  # in reverse order: the copy's adapter is switched between calls
        engine.generate([PromptBatch(agents[i], prompt_ids[i])], 6, 0.0, None)[0]
        for i in reversed(range(len(agents)))
    ][::-1]
    assert alone == together
    copies = {id(engine.decoder(agent).rollout_model()) for agent in agents}
    assert len(copies) == 1
    assert engine.decoder(agents[0]).rollout_model().dtype == torch.bfloat16

    def learner(agent, index: int) -> torch.Tensor:
        return agent.sequence_logprobs(prompt_ids[index], [g.reply_ids for g in alone[index]])[0]

    for index in reversed(range(len(agents))):
        agent, replies = agents[index], [g.reply_ids for g in alone[index]]
        on_copy = engine.score(agent, prompt_ids[index], replies, 1.0, None)[0].float()
        assert torch.allclose(on_copy, learner(agent, index), atol=0.6)  # bf16 vs fp32, 6 tokens
        for other in agents:
            if other is not agent:  # another adapter finds these replies far less likely
                assert learner(other, index).sum() < learner(agent, index).sum() - 1.0

    replies = [g.reply_ids for g in alone[0]]
    before = engine.score(agents[0], prompt_ids[0], replies, 1.0, None)[0].float()
    with torch.no_grad():  # an update of agent 0's adapter
        for name, parameter in agents[0].model.named_parameters():
            if f".{agents[0].adapter}." in name and "lora_B" in name:
                parameter.normal_(0.0, 0.3)
    after = engine.score(agents[0], prompt_ids[0], replies, 1.0, None)[0].float()
    assert not torch.allclose(after, before, atol=0.5)
    assert torch.allclose(after, learner(agents[0], 0), atol=0.6)


def headed_prompts(swarm: Swarm) -> list[list[list[int]]]:
    """Per agent, prompts that share a long head of its own (of a length of its own), each
    after an observation; the third agent's batch is one prompt (no head to share)."""
    prompts = []
    for index, agent in enumerate(swarm.population):
        header = f"{agent.role} bid: " + " ".join(["inventory: 3 oak log, 2 stick."] * (2 + index))
        observations = OBSERVATIONS if index < 2 else OBSERVATIONS[:1]
        prompts.append(agent.encode_prompts([f"{header} {obs} ->" for obs in observations]))
    return prompts


@pytest.mark.parametrize("kv_cache", ["dynamic", "static"])
def test_lora_agents_in_one_batch_share_each_its_own_prompt_head(kv_cache):
    """One batch across adapters: each agent's rows after its own prompt head (computed once
    under its adapter, kept across calls), heads of different lengths and a row without one in
    one cache; the greedy replies of each agent's own loop, and the share of prompt tokens not
    computed (``engine/prefix_cached_frac``) as its own loop's."""
    swarm = lora_swarm("lora", temperature=0.0)
    agents = list(swarm.population)
    prompts = headed_prompts(swarm)
    batches = [PromptBatch(agent, ids) for agent, ids in zip(agents, prompts, strict=True)]

    def engine() -> HFEngine:
        made = HFEngine(kv_cache, False, None)
        for agent in agents:
            made.decoder(agent).min_shared_prefix = 8
        return made

    alone_engine = engine()
    alone = [alone_engine.generate([batch], 6, 0.0, None)[0] for batch in batches]
    alone_frac = alone_engine.metrics()["engine/prefix_cached_frac"]
    together_engine = engine()
    shapes: list[tuple[int, int]] = []
    agents[0].model.get_base_model().model.register_forward_hook(
        lambda module, args, kwargs, output: shapes.append(tuple(kwargs["input_ids"].shape)),
        with_kwargs=True,
    )
    together = together_engine.generate(batches, 6, 0.0, None)

    assert together == alone
    assert len({g.text for replies in alone for g in replies}) > 2  # the adapters differ
    heads = [shared_prefix_length(ids) for ids in prompts[:2]]
    assert heads[0] < heads[1]  # heads of different lengths in one cache
    assert [g.shared_prefix for g in together[0]] == [heads[0]] * len(prompts[0])
    assert [g.shared_prefix for g in together[2]] == [0]
    rows = sum(map(len, prompts))
    assert shapes[:2] == [(1, heads[0]), (1, heads[1])]  # each head once, one row
    rests = [len(ids) - heads[a] for a in range(2) for ids in prompts[a]] + [len(prompts[2][0])]
    assert shapes[2] == (rows, max(rests))  # then every row's rest, in one batch
    frac = together_engine.metrics()["engine/prefix_cached_frac"]
    assert frac == pytest.approx(alone_frac)
    given = sum(len(ids) for agent_prompts in prompts for ids in agent_prompts)
    assert frac == pytest.approx(1 - (sum(heads) + sum(rests)) / given)
    shapes.clear()  # again: the heads are kept, only the rows' rest runs
    assert together_engine.generate(batches, 6, 0.0, None) == alone
    assert [shape for shape in shapes if shape[0] == 1] == []
    assert together_engine.metrics()["engine/prefix_cached_frac"] > frac
    assert together_engine.metrics() == {}  # nothing generated since the last reading


def test_actions_of_a_decision_step_go_to_the_engine_in_one_call():
    """``Swarm.act_many``: LoRA agents' actions in one batch across adapters (greedy: what
    each acts alone); agents with their own weights sample what they sample one by one."""
    swarm = lora_swarm("lora", temperature=0.0)
    alone = [
        swarm.act(agent, envs, torch.Generator()) for agent, envs in zip(AGENTS, ENVS, strict=True)
    ]
    forwards = count_forwards(swarm)
    assert swarm.act_many(AGENTS, ENVS, torch.Generator()) == alone
    assert set(forwards) == {sum(len(envs) for envs in ENVS)}  # one decode loop for all
    full = lora_swarm("full", temperature=1.0)
    generator = torch.Generator().manual_seed(0)
    one_by_one = [
        full.act(agent, envs, generator) for agent, envs in zip(AGENTS, ENVS, strict=True)
    ]
    assert full.act_many(AGENTS, ENVS, torch.Generator().manual_seed(0)) == one_by_one


@pytest.mark.parametrize("adapter", ["full", "lora"])
def test_level_reads_take_the_prompt_head_from_the_kept_heads(adapter):
    """``HFEngine.score_branches``: what branch_logprobs scores on the rollout model, the
    prompts' shared head computed on the first call only (kept with the generation's heads),
    and its prompt tokens counted in ``engine/prefix_cached_frac``."""
    swarm = lora_swarm(adapter, temperature=0.0)
    agent = swarm.population[0]
    prompt_ids = agent.encode_prompts(shared_header_prompts())
    replies = [agent.encode_reply(text) for text in [" 0.5", " 1.0", ""]]
    head = agent.prompt_head_length(prompt_ids, with_gradient=False)
    assert head > 0
    engine = HFEngine("dynamic", False, None)
    shapes: list[tuple[int, int]] = []
    model = agent.model.get_base_model() if adapter == "lora" else agent.model
    model.model.register_forward_hook(
        lambda module, args, kwargs, output: shapes.append(tuple(kwargs["input_ids"].shape)),
        with_kwargs=True,
    )
    first = engine.score_branches(agent, prompt_ids, replies, 1.0, None)
    assert shapes[0] == (1, head)
    given = sum(map(len, prompt_ids))
    computed = head + given - head * len(prompt_ids)
    assert engine.metrics()["engine/prefix_cached_frac"] == pytest.approx(1 - computed / given)
    shapes.clear()
    again = engine.score_branches(agent, prompt_ids, replies, 1.0, None)
    assert (1, head) not in shapes and shapes[0][0] == len(prompt_ids)  # the head was kept
    assert engine.metrics()["engine/prefix_cached_frac"] == pytest.approx(
        1 - (computed - head) / given
    )
    torch.testing.assert_close(again, first)
    torch.testing.assert_close(
        first, branch_logprobs(agent, prompt_ids, replies), atol=1e-4, rtol=0
    )
