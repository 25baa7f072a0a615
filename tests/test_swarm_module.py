"""SwarmModule's updates: gradient reaches exactly the agents with something to learn, and the
rollout loop's forks turn contested steps into preference pairs of the winner's bids."""

from __future__ import annotations

import random

import pytest
import torch

from bidswarm.agents.population import Population
from bidswarm.agents.prompts import PromptTemplate
from bidswarm.config import ModelConfig, RLConfig, TinyArchConfig
from bidswarm.coordination import make_coordination
from bidswarm.envs.crafting import CraftingConfig, CraftingEnv
from bidswarm.lit.swarm_module import SwarmModule
from bidswarm.rollout.loop import RolloutLoop
from bidswarm.rollout.records import Episode, PreferencePair, Reply, StepRecord
from bidswarm.rollout.swarm import Swarm

LEVELS = [0.0, 0.2, 0.4, 0.6, 0.8]


@pytest.fixture(scope="module")
def module() -> SwarmModule:
    env = CraftingEnv(CraftingConfig(max_decisions=12))
    texts = PromptTemplate.for_env(env, "compact", None, LEVELS)
    corpus = [texts.action(r, env.observation(r)) + " chop a tree 0.8" for r in env.roles]
    arch = TinyArchConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    cfg = ModelConfig(name="tiny", source="tiny", prompt_style="compact", tiny=arch)
    torch.manual_seed(0)
    population = Population.build(cfg, list(env.roles), 1, corpus)
    prompts = PromptTemplate.for_env(env, "compact", population.agents[0].tokenizer, LEVELS)
    swarm = Swarm(population, prompts, 3, 6, 1.0)
    loop = RolloutLoop(
        lambda: CraftingEnv(CraftingConfig(max_decisions=12)), swarm, make_coordination("auction")
    )
    return SwarmModule(loop, RLConfig(), "bucket_brigade", env.train_seeds(), seed=0)


def reply(module: SwarmModule, agent: int, text: str) -> Reply:
    policy = module.population.agents[agent]
    prompt = module.loop.swarm.prompts.action(policy.role, "step 1 of 12. inventory: empty.")
    return Reply(agent, policy.encode_prompts([prompt])[0], policy.encode_reply(text), text)


def acting(decision: int, agent: int, reward: float, module: SwarmModule) -> StepRecord:
    action = reply(module, agent, "chop a tree")
    return StepRecord(actor=agent, winning_bid=0.4, action=action, decision=decision, reward=reward)


def grads(module: SwarmModule) -> list[torch.Tensor | None]:
    """Per agent: the concatenated gradient, or None if no parameter has one."""
    out = []
    for agent in module.population.agents:
        gs = [p.grad.flatten() for p in agent.parameters() if p.grad is not None]
        out.append(torch.cat(gs) if gs else None)
    return out


def test_action_gradient_reaches_only_agents_whose_credit_varies(module):
    module.population.zero_grad(set_to_none=True)
    episodes = [
        Episode(0, [acting(0, 0, 5.0, module), acting(1, 1, 0.0, module)]),
        Episode(1, [acting(0, 0, 0.0, module), acting(1, 1, 0.0, module)]),
    ]
    losses, metrics = module.action_losses(episodes, random.Random(0))
    assert len(losses) == 2 and "loss_action/agent2" not in metrics
    torch.stack(losses).sum().backward()
    logger, miner, smith = grads(module)
    assert logger is not None and logger.abs().sum() > 0  # credits 4.0*0.6 vs 0: varies
    assert miner is not None and miner.abs().sum() == 0  # equal credits: baseline cancels
    assert smith is None  # never acted: no gradient, so AdamW skips it


def test_bid_loss_raises_the_preferred_bid_of_that_agent_only(module):
    module.population.zero_grad(set_to_none=True)
    policy = module.population.agents[2]
    prompt = policy.encode_prompts([module.loop.swarm.prompts.bid("smith", "inventory: empty.")])[0]
    pair = PreferencePair(2, prompt, policy.encode_reply("0.8"), policy.encode_reply("0.0"))

    def margin() -> float:
        with torch.no_grad():
            losses, _ = module.bid_losses([pair])
        return float(losses[0])

    before = margin()
    losses, _ = module.bid_losses([pair])
    torch.stack(losses).sum().backward()
    logger, miner, smith = grads(module)
    assert logger is None and miner is None and smith.abs().sum() > 0
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.5)
    optimizer.step()
    assert margin() < before


def test_forks_turn_contested_steps_into_pairs_of_the_winners_bids(module):
    loop = module.loop
    rng, generator = random.Random(3), torch.Generator().manual_seed(3)
    episodes = loop.run(list(range(6)), rng, generator, keep_snapshots=True)
    contested = [s for e in episodes for s in e.steps if s.contested]
    assert contested and all(s.snapshot is not None for s in contested)
    assert all(s.snapshot is None for e in episodes for s in e.steps if not s.contested)
    pairs, stats = loop.fork(episodes, budget=2, max_resamples=3, rng=rng, generator=generator)
    expected = sum(min(2, sum(s.contested for s in e.steps)) for e in episodes)
    assert stats.made + stats.dropped == expected
    assert len(pairs) == stats.made - stats.tied
    winners_prompts = {(s.actor, tuple(s.bid_replies[s.actor].prompt_ids)) for s in contested}
    for pair in pairs:
        # The pair compares the winner's own bids in the recorded context.
        assert (pair.agent, tuple(pair.prompt_ids)) in winners_prompts
        recorded = {tuple(s.bid_replies[s.actor].reply_ids) for s in contested}
        assert tuple(pair.preferred_ids) in recorded or tuple(pair.rejected_ids) in recorded


def test_zero_fork_budget_makes_no_pairs(module):
    rng, generator = random.Random(4), torch.Generator().manual_seed(4)
    episodes = module.loop.run([0, 1], rng, generator, keep_snapshots=True)
    pairs, stats = module.loop.fork(
        episodes, budget=0, max_resamples=3, rng=rng, generator=generator
    )
    assert pairs == [] and stats.made == 0
