"""Coordination rules beyond the auction: Graph-of-Agents and AgentNet, on tiny real agents."""

from __future__ import annotations

import random

import pytest
import torch
from hydra import compose, initialize_config_dir

from bidswarm.agents.population import Population
from bidswarm.agents.prompts import PromptTemplate
from bidswarm.config import ModelConfig, TinyArchConfig, register_configs
from bidswarm.coordination import RULES, make_coordination
from bidswarm.coordination.agentnet import (
    AgentNet,
    SuccessMemory,
    observation_tokens,
    token_overlap,
)
from bidswarm.coordination.base import Decision
from bidswarm.coordination.graph_of_agents import GraphOfAgents, best_proposal, peer_scores
from bidswarm.envs import make_env
from bidswarm.envs.base import MONOLITHIC
from bidswarm.envs.crafting.config import CraftingConfig
from bidswarm.rollout.loop import RolloutLoop
from bidswarm.rollout.swarm import Swarm
from conftest import CONF

LEVELS = [0.0, 0.2, 0.4, 0.6, 0.8]


def task(max_decisions: int = 6) -> CraftingConfig:
    return CraftingConfig(name="crafting", target="wooden_pickaxe", max_decisions=max_decisions)


def build_swarm(monolithic: bool = False, seed: int = 0) -> Swarm:
    env = make_env(task())
    torch.manual_seed(seed)
    arch = TinyArchConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    model = ModelConfig(name="tiny", source="tiny", prompt_style="compact", tiny=arch)
    corpus = [env.task_description, *(env.role_description(r) for r in env.roles)]
    env.reset(0)
    corpus += [env.observation(r) for r in env.roles]
    roles = [MONOLITHIC] if monolithic else list(env.roles)
    population = Population.build(model, roles, 1, corpus)
    prompts = PromptTemplate.for_env(env, "compact", population.agents[0].tokenizer, LEVELS)
    return Swarm(population, prompts, max_bid_tokens=3, max_action_tokens=6, temperature=1.0)


def envs_at(seeds: list[int], max_decisions: int = 6):
    envs = [make_env(task(max_decisions)) for _ in seeds]
    for env, seed in zip(envs, seeds, strict=True):
        env.reset(seed)
    return envs


def seeded(seed: int) -> torch.Generator:
    generator = torch.Generator()
    generator.manual_seed(seed)
    return generator


# -- registry and configs ----------------------------------------------------------------------
@pytest.mark.parametrize("name", ["graph_of_agents", "agentnet"])
def test_new_rules_are_selectable_from_the_config(name):
    register_configs()
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=[f"coordination={name}"])
    assert cfg.coordination.name == name
    assert type(make_coordination(name)) is RULES[name]
    assert not RULES[name].asks_bids


# -- Graph-of-Agents ---------------------------------------------------------------------------
def test_peer_scores_leave_out_the_proposers_own_score():
    scores = [[9.0, -1.0, -3.0], [-2.0, 9.0, -1.0], [-4.0, -2.0, 9.0]]
    assert peer_scores(scores) == [-3.0, -1.5, -2.0]
    assert peer_scores([[-0.5]]) == [-0.5]


def test_best_proposal_breaks_ties_uniformly():
    rng = random.Random(0)
    picks = {best_proposal([-1.0, -0.5, -0.5, -2.0], rng) for _ in range(50)}
    assert picks == {1, 2}


def test_swarm_score_is_the_mean_token_logprob_and_is_counted():
    swarm = build_swarm()
    envs = envs_at([1, 2])
    replies = swarm.act(0, envs, seeded(0))
    tokens_before = swarm.usage.rollout_tokens
    scores = swarm.score(1, envs, replies)
    policy = swarm.population.agents[1]
    for env, reply, score in zip(envs, replies, scores, strict=True):
        prompt = policy.encode_prompts([swarm.prompts.action("miner", env.observation("miner"))])
        with torch.no_grad():
            logp, mask = policy.reply_token_logprobs(prompt, [reply.reply_ids])
        assert score == pytest.approx(float(logp.sum() / mask.sum()), abs=1e-5)
    scored = sum(
        len(p) + len(r.reply_ids)
        for p, r in zip(
            policy.encode_prompts(
                [swarm.prompts.action("miner", e.observation("miner")) for e in envs]
            ),
            replies,
            strict=True,
        )
    )
    assert swarm.usage.rollout_tokens - tokens_before == scored


def test_graph_of_agents_acts_with_the_best_peer_scored_proposal():
    swarm = build_swarm()
    envs = envs_at([3, 4, 5])
    decisions = GraphOfAgents().decide(swarm, envs, random.Random(0), seeded(7))
    # The same generator seed reproduces every agent's proposals; score them independently.
    again = seeded(7)
    proposals = [swarm.act(agent, envs, again) for agent in range(swarm.n_agents)]
    for e, decision in enumerate(decisions):
        scores = [[0.0] * 3 for _ in range(3)]
        for scorer in range(3):
            for proposer in range(3):
                if scorer != proposer:
                    value = swarm.score(scorer, [envs[e]], [proposals[proposer][e]])[0]
                    scores[scorer][proposer] = value
        peer = peer_scores(scores)
        assert decision.action.agent == decision.actor
        assert decision.action.reply_ids == proposals[decision.actor][e].reply_ids
        assert peer[decision.actor] == pytest.approx(max(peer), abs=1e-5)
        assert decision.winning_bid == 0.0 and decision.bids == []


def test_graph_of_agents_plays_whole_episodes_with_one_or_many_agents():
    for monolithic in (False, True):
        swarm = build_swarm(monolithic=monolithic)
        loop = RolloutLoop(lambda: make_env(task()), swarm, GraphOfAgents())
        episodes = loop.run([0, 1], random.Random(0), seeded(0))
        for episode in episodes:
            assert len(episode.steps) == 6
            for step in episode.steps:
                assert step.actor is not None and step.action.agent == step.actor
                assert step.winning_bid == 0.0 and not step.contested
        assert swarm.usage.bids_made == 0


# -- AgentNet ----------------------------------------------------------------------------------
def test_token_overlap_and_memory_votes():
    a = observation_tokens("inventory: 3 oak log. near: forest")
    b = observation_tokens("inventory: 3 oak log. near: stone")
    assert token_overlap(a, a) == 1.0 and 0.0 < token_overlap(a, b) < 1.0
    memory = SuccessMemory(capacity=3, neighbours=3, min_overlap=0.5)
    memory.add(a, actor=0, reward=0.0)
    assert len(memory) == 0, "a step without reward is not a success"
    assert memory.suggest(a) is None
    memory.add(b, actor=1, reward=1.0)
    memory.add(a, actor=2, reward=1.0)
    assert memory.suggest(a) == 2  # the exact match (1.0) outvotes the near one (5/7)
    memory.add(b, actor=1, reward=1.0)
    assert memory.suggest(a) == 1  # two near successes (2 * 5/7) outvote it
    assert memory.suggest(observation_tokens("completely unrelated words")) is None
    memory = SuccessMemory(capacity=3, neighbours=2, min_overlap=0.5)
    for actor in range(4):
        memory.add(b, actor=actor, reward=1.0)
    assert len(memory) == 3, "the memory keeps only the newest entries"


def agentnet(keep_bid: float, min_overlap: float) -> AgentNet:
    rule = AgentNet()
    rule.keep_bid = keep_bid
    rule.memory.min_overlap = min_overlap
    return rule


def test_agentnet_that_never_keeps_and_has_no_memory_is_round_robin():
    swarm = build_swarm()
    loop = RolloutLoop(lambda: make_env(task()), swarm, agentnet(keep_bid=2.0, min_overlap=2.0))
    episodes = loop.run([0, 1, 2], random.Random(0), seeded(0))
    for episode in episodes:
        assert [s.actor for s in episode.steps] == [d % 3 for d in range(6)]
        assert all(s.winning_bid == 0.0 for s in episode.steps)
    # One router bid per env and step except the first (no holder yet).
    assert swarm.usage.bids_made == 3 * 5


def test_agentnet_holder_that_always_keeps_acts_every_step():
    swarm = build_swarm()
    loop = RolloutLoop(lambda: make_env(task()), swarm, agentnet(keep_bid=0.0, min_overlap=2.0))
    for episode in loop.run([0, 1], random.Random(0), seeded(0)):
        assert [s.actor for s in episode.steps] == [0] * 6


def test_agentnet_forwards_to_the_agent_the_memory_suggests():
    swarm = build_swarm()
    rule = agentnet(keep_bid=2.0, min_overlap=0.99)
    env = envs_at([5])[0]
    first = rule.decide(swarm, [env], random.Random(0), seeded(0))
    assert first[0].actor == 0  # no holder, empty memory: rotation
    # Pretend agent 2 acting here earned reward: the memory now points at agent 2 for this view.
    tokens = observation_tokens(env.observation(MONOLITHIC))
    rule.record_outcomes([env], [Decision(actor=2)], [5.0])
    assert rule.memory.suggest(tokens) == 2
    other = envs_at([5])[0]
    assert rule.decide(swarm, [other], random.Random(0), seeded(0))[0].actor == 2


def test_agentnet_holder_follows_steps_and_is_dropped_by_a_restore():
    swarm = build_swarm()
    rule = agentnet(keep_bid=0.0, min_overlap=2.0)
    env, twin = envs_at([7, 7], max_decisions=10)
    decision = rule.decide(swarm, [env], random.Random(0), seeded(0))[0]
    before = env.snapshot()
    env.step(swarm.role(decision.actor), "chop a tree")
    rule.record_outcomes([env], [decision], [0.0])
    assert rule.holder(env) == decision.actor
    twin.restore(env.snapshot())
    assert rule.holder(twin) is None, "the holder belongs to the env object it was set in"
    env.restore(before)
    assert rule.holder(env) is None, "a restore to another state drops the holder"
    env.reset(8)
    assert rule.holder(env) is None
    # A forced actor (a fork branch's first step) becomes the holder.
    rule.record_outcomes([env], [Decision(actor=1)], [0.0])
    assert rule.holder(env) == 1
