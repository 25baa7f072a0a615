"""SwarmModule's updates: gradient reaches exactly the agents with something to learn, and the
rollout loop's forks turn contested steps into preference pairs of the winner's bids."""

from __future__ import annotations

import random

import pytest
import torch

from bidswarm.agents.population import Population
from bidswarm.agents.prompts import PromptTemplate, parse_bid
from bidswarm.config import ModelConfig, RLConfig, TinyArchConfig
from bidswarm.coordination import make_coordination
from bidswarm.envs.crafting import CraftingConfig, CraftingEnv
from bidswarm.lit.swarm_module import SwarmModule
from bidswarm.rollout.loop import RolloutLoop, forkable_steps
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
    assert stats.contested == stats.eligible == len(contested)
    assert stats.chosen == expected
    assert stats.resampled_below <= stats.chosen
    assert len(pairs) == stats.pairs == stats.resampled_below - stats.tied
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
    assert pairs == [] and stats.chosen == 0 and stats.resampled_below == 0


def test_a_forks_counterfactual_bid_always_parsed_below_the_runner_up(module):
    """A malformed resample would count as bid 0, but it is never the counterfactual reply of a
    preference pair: the untrained agents here reply garbage often, and every pair's other reply
    still parses to a level below the runner-up's bid."""
    loop = module.loop
    rng, generator = random.Random(5), torch.Generator().manual_seed(5)
    episodes = loop.run(list(range(8)), rng, generator, keep_snapshots=True)
    pairs, stats = loop.fork(
        episodes, budget=4, max_resamples=3, rng=rng, generator=generator, resample_temperature=3.0
    )
    assert stats.unparsed_resamples > 0, "the guard was never exercised"
    contested = [s for e in episodes for s in e.steps if s.contested]
    recorded = {
        (s.actor, tuple(s.bid_replies[s.actor].reply_ids)): s.runner_up_bid for s in contested
    }
    tokenizer = module.population.agents[0].tokenizer
    for pair in pairs:
        for mine, other in (
            (pair.preferred_ids, pair.rejected_ids),
            (pair.rejected_ids, pair.preferred_ids),
        ):
            if (pair.agent, tuple(mine)) in recorded:
                level, parsed = parse_bid(tokenizer.decode(other), LEVELS)
                assert parsed and level < recorded[pair.agent, tuple(mine)]
                break
        else:
            raise AssertionError("neither reply of the pair is a recorded winning bid")


def step_at(decision: int, reward: float, contested: bool) -> StepRecord:
    return StepRecord(
        actor=0,
        winning_bid=0.8,
        runner_up=1 if contested else None,
        runner_up_bid=0.6 if contested else 0.0,
        decision=decision,
        reward=reward,
        snapshot={} if contested else None,
    )


def test_fork_selection_until_the_last_reward():
    steps = [step_at(0, 0.0, True), step_at(1, 2.0, True), step_at(2, 0.0, False)]
    steps += [step_at(3, 5.0, False), step_at(4, 0.0, True), step_at(5, 0.0, True)]
    episode = Episode(0, steps)
    assert [s.decision for s in forkable_steps(episode, "all")] == [0, 1, 4, 5]
    assert [s.decision for s in forkable_steps(episode, "until_last_reward")] == [0, 1]
    unrewarded = Episode(1, [step_at(0, 0.0, True), step_at(1, 0.0, True)])
    assert len(forkable_steps(unrewarded, "until_last_reward")) == 2
    with pytest.raises(ValueError, match="rl.fork_steps"):
        forkable_steps(episode, "sometimes")


def test_gradients_are_clipped_per_agent(module):
    """One agent's huge gradient must not shrink another agent's step (per-agent clipping)."""
    module.rl = RLConfig(grad_clip=1.0)
    optimizer = module.configure_optimizers()
    agents = module.population.agents
    for scale, agent in zip((1000.0, 1e-4, None), agents, strict=True):
        for p in agent.parameters():
            p.grad = None if scale is None else torch.full_like(p, scale)
    small_before = [p.grad.clone() for p in agents[1].parameters()]
    module._clip_per_agent(optimizer)
    big_norm = torch.linalg.vector_norm(
        torch.cat([p.grad.reshape(-1) for p in agents[0].parameters()])
    )
    assert big_norm == pytest.approx(1.0, rel=1e-4)
    for before, p in zip(small_before, agents[1].parameters(), strict=True):
        assert torch.equal(before, p.grad)
    assert all(p.grad is None for p in agents[2].parameters())
    module.population.zero_grad(set_to_none=True)


def test_bids_drawn_below_the_runner_up_follow_the_policy(module):
    """``bid_below`` returns well-formed levels under each ceiling; at a tiny temperature it
    picks the level the policy scores highest among them."""
    swarm = module.loop.swarm
    envs = [CraftingEnv(CraftingConfig(max_decisions=12)) for _ in range(4)]
    for seed, env in enumerate(envs):
        env.reset(seed)
    ceilings = [0.8, 0.6, 0.4, 0.2]
    generator = torch.Generator().manual_seed(0)
    drawn = swarm.bid_below(1, envs, ceilings, generator, temperature=1.0)
    policy = swarm.population.agents[1]
    for reply, ceiling, env in zip(drawn, ceilings, envs, strict=True):
        level, parsed = parse_bid(reply.text, LEVELS)
        assert parsed and level < ceiling
        assert reply.reply_ids == policy.encode_reply(swarm.prompts.reply_text(reply.text))
    greedy = swarm.bid_below(1, envs[:1], [0.8], generator, temperature=1e-4)[0]
    prompt = policy.encode_prompts([swarm.prompts.bid("miner", envs[0].observation("miner"))])[0]
    candidates = [0.0, 0.2, 0.4, 0.6]
    replies = [policy.encode_reply(swarm.prompts.reply_text(f"{c:.1f}")) for c in candidates]
    with torch.no_grad():
        logp, mask = policy.reply_token_logprobs([prompt] * 4, replies)
    best = candidates[int((logp * mask).sum(dim=1).argmax())]
    assert greedy.text == f"{best:.1f}"
