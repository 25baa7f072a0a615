"""The collector's batches and the learner's updates: gradient reaches exactly the agents with
something to learn, forks turn contested steps into preference pairs of the winner's bids, and
micro-batched updates equal whole-batch ones while no forward sees more than its budget."""

from __future__ import annotations

import random
from contextlib import contextmanager
from dataclasses import replace
from types import SimpleNamespace

import lightning as L
import pytest
import torch

from bidswarm.agents.policy import FrozenReference
from bidswarm.agents.population import Population, agent_folder_name
from bidswarm.agents.prompts import PromptTemplate, parse_bid
from bidswarm.algorithms.credit import CreditConfig, bucket_brigade_credit, make_credit
from bidswarm.config import BidSlotWithoutBids, ModelConfig, RLConfig, TinyArchConfig
from bidswarm.coordination import Decision
from bidswarm.coordination.auction import Auction
from bidswarm.coordination.fixed import RoundRobin
from bidswarm.envs.crafting import CraftingConfig, CraftingEnv
from bidswarm.envs.experts import play_expert_episode
from bidswarm.lit.swarm_module import SwarmModule
from bidswarm.rollout.batches import ActionBatch, BidBatch, credited_batches, preference_batches
from bidswarm.rollout.collector import Collected, Collector, UpdateKind
from bidswarm.rollout.forks import choose_fork_steps, fork_pairs, forkable_steps
from bidswarm.rollout.loop import RolloutLoop
from bidswarm.rollout.records import Episode, PreferencePair, Reply, StepRecord
from bidswarm.rollout.swarm import Swarm
from conftest import hf_engine, tiny_crafting_swarm

LEVELS = [0.0, 0.2, 0.4, 0.6, 0.8]


def make_env() -> CraftingEnv:
    return CraftingEnv(CraftingConfig(max_decisions=12))


@pytest.fixture(scope="module")
def module() -> SwarmModule:
    env, population, loop = tiny_crafting_swarm(max_decisions=12)
    collector = Collector(
        loop, RLConfig(), make_credit(CreditConfig("bucket_brigade")), env.train_seeds(), seed=0
    )
    return SwarmModule(population, collector, RLConfig(), temperature=1.0)


@pytest.fixture
def rl(module):
    """The module's RL settings, restored after the test."""
    kept = module.rl
    yield module.rl
    module.rl = kept


def loop_of(module: SwarmModule) -> RolloutLoop:
    return module.collector.loop


def reply(
    module: SwarmModule, agent: int, text: str, observation: str = "inventory: empty."
) -> Reply:
    policy = module.population.agents[agent]
    prompt = loop_of(module).swarm.prompts.action(policy.role, f"step 1 of 12. {observation}")
    return Reply(agent, policy.encode_prompts([prompt])[0], policy.encode_reply(text), text)


def acting(index: int, agent: int, reward: float, module: SwarmModule) -> StepRecord:
    action = reply(module, agent, "chop a tree")
    return StepRecord(index, Decision(actor=agent, winning_bid=0.4), action=action, reward=reward)


def grads(module: SwarmModule) -> list[torch.Tensor | None]:
    """Per agent: the concatenated gradient, or None if no parameter has one."""
    out = []
    for agent in module.population.agents:
        gs = [p.grad.flatten() for p in agent.parameters() if p.grad is not None]
        out.append(torch.cat(gs) if gs else None)
    return out


def backward(agent: int, loss: torch.Tensor) -> None:
    loss.backward()


@contextmanager
def forward_tokens(module: SwarmModule):
    """The tokens (rows x columns) of every forward of every agent's model inside the block."""
    seen: list[int] = []
    hooks = [
        agent.model.register_forward_pre_hook(
            lambda mod, args, kwargs: seen.append(kwargs["input_ids"].numel()), with_kwargs=True
        )
        for agent in module.population.agents
    ]
    try:
        yield seen
    finally:
        for hook in hooks:
            hook.remove()


# -- the collector's batches -------------------------------------------------------------------
def test_credit_is_the_collectors_step_and_batches_are_per_agent(module):
    episodes = [
        Episode(0, [acting(0, 0, 5.0, module), acting(1, 1, 0.0, module)]),
        Episode(1, [acting(0, 1, 0.0, module), acting(1, 1, 3.0, module)]),
    ]
    batches, discarded = credited_batches(
        episodes, make_credit(CreditConfig("bucket_brigade")), random.Random(0), LEVELS
    )
    assert [b.agent for b in batches] == [0, 1]  # agent 2 never acted: no batch
    first, first_lost = bucket_brigade_credit([5.0, 0.0], [0.4, 0.4])
    second, second_lost = bucket_brigade_credit([0.0, 3.0], [0.4, 0.4])
    assert batches[0].credit == [first[0]]
    assert batches[1].credit == [first[1], *second]
    assert batches[1].decisions == [1, 0, 1]  # each row's decision index
    assert discarded == pytest.approx((first_lost + second_lost) / 2)
    rows = zip(batches[1].prompt_ids, batches[1].reply_ids, strict=True)
    policy = module.population.agents[1]
    assert policy.prompt_head_length(batches[1].prompt_ids) == 0  # compact prompts: none
    assert batches[1].learner_tokens(policy, None) == sum(len(p) + len(r) for p, r in rows)


def test_the_collector_hands_over_batches_metrics_and_counts_what_it_trains(module):
    collector = module.collector
    collector.rl = RLConfig(envs_per_update=2, bid_envs_per_update=3, fork_budget=2)
    try:
        kept = collector.loop.swarm.usage
        counted_before = kept.as_dict()
        action = collector.collect(update=0)
        assert action.kind == UpdateKind.action and all(
            isinstance(b, ActionBatch) for b in action.batches
        )
        # The update's own counts (the learner sums them over processes into the run's).
        budget, agents = collector.rl.micro_batch_tokens, module.population.agents
        learned = sum(b.learner_tokens(agents[b.agent], budget) for b in action.batches)
        assert action.usage.train_tokens == learned
        assert action.usage.rollout_tokens > 0 and action.usage.bids_made > 0
        assert collector.loop.swarm.usage is kept and kept.as_dict() == counted_before
        assert action.metrics["episodes"] == 2.0 and "credit/discarded" in action.metrics
        bid = collector.collect(update=4)
        assert bid.kind == UpdateKind.bid and all(isinstance(b, BidBatch) for b in bid.batches)
        assert bid.metrics["episodes"] == 3.0  # rl.bid_envs_per_update worlds
        assert bid.metrics["forks/pairs"] == sum(len(b.prompt_ids) for b in bid.batches)
        again = collector.collect(update=0)  # randomness from (seed, rank, update): replayed
        assert [b.credit for b in again.batches] == [b.credit for b in action.batches]
    finally:
        collector.rl = RLConfig()


# -- the learner -------------------------------------------------------------------------------
def test_action_gradient_reaches_only_agents_whose_credit_varies(module):
    module.population.zero_grad(set_to_none=True)
    episodes = [
        Episode(0, [acting(0, 0, 5.0, module), acting(1, 1, 0.0, module)]),
        Episode(1, [acting(0, 0, 0.0, module), acting(1, 1, 0.0, module)]),
    ]
    batches, _ = credited_batches(
        episodes, make_credit(CreditConfig("bucket_brigade")), random.Random(0), LEVELS
    )
    assert [b.agent for b in batches] == [0, 1]
    for batch in batches:
        module.action_loss(batch, backward)
    logger, miner, smith = grads(module)
    assert logger is not None and logger.abs().sum() > 0  # credits 4.0*0.6 vs 0: varies
    assert miner is not None and miner.abs().sum() == 0  # equal credits: baseline cancels
    assert smith is None  # never acted: no gradient, so AdamW skips it
    module.population.zero_grad(set_to_none=True)


def test_bid_loss_raises_the_preferred_bid_of_that_agent_only(module):
    module.population.zero_grad(set_to_none=True)
    policy = module.population.agents[2]
    prompts = loop_of(module).swarm.prompts
    prompt = policy.encode_prompts([prompts.bid("smith", "inventory: empty.")])[0]
    pair = PreferencePair(2, prompt, policy.encode_reply("0.8"), policy.encode_reply("0.0"))
    (batch,) = preference_batches([pair])

    def margin() -> float:
        with torch.no_grad():
            return float(module.bid_loss(batch, lambda agent, loss: None))

    before = margin()
    module.bid_loss(batch, backward)
    logger, miner, smith = grads(module)
    assert logger is None and miner is None and smith.abs().sum() > 0
    torch.optim.SGD(policy.parameters(), lr=0.5).step()
    assert margin() < before
    module.population.zero_grad(set_to_none=True)


def action_batch(module: SwarmModule, agent: int = 1) -> ActionBatch:
    observations = [f"inventory: {n} oak log. near: forest" for n in range(1, 9)]
    texts = ["chop a tree", "mine stone", "craft planks", "chop a tree now please"] * 2
    rows = [reply(module, agent, t, o) for t, o in zip(texts, observations, strict=True)]
    return ActionBatch(
        agent,
        [r.prompt_ids for r in rows],
        [r.reply_ids for r in rows],
        [5.0, 0.0, 1.5, -2.0, 3.0, 0.5, 0.0, 4.0],
        [0, 1, 2, 3, 0, 1, 2, 3],
        [r.sampled_logprobs for r in rows],
    )


def gradient_of(module: SwarmModule, loss_of, batch) -> torch.Tensor:
    module.population.zero_grad(set_to_none=True)
    loss = loss_of(batch, backward)
    agent = module.population.agents[batch.agent]
    gradient = torch.cat([p.grad.flatten() for p in agent.parameters()])
    module.population.zero_grad(set_to_none=True)
    return torch.cat([gradient, loss.reshape(-1)])


@contextmanager
def references_of(module: SwarmModule, moved: bool = True):
    """Frozen references of the module's agents taken now; with ``moved``, every agent's
    weights are then nudged (restored after the block), so that the policy differs from its
    reference and the KL term has a value and a gradient."""
    kept = [[p.detach().clone() for p in agent.parameters()] for agent in module.population]
    module.references = [FrozenReference(agent) for agent in module.population.agents]
    if moved:
        generator = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for agent in module.population:
                for p in agent.parameters():
                    p.add_(0.05 * torch.randn(p.shape, generator=generator))
    try:
        yield module.references
    finally:
        module.references = None
        with torch.no_grad():
            for old, agent in zip(kept, module.population, strict=True):
                for value, p in zip(old, agent.parameters(), strict=True):
                    p.copy_(value)


OPTIONS = {
    "paper": {},
    "kl_entropy": {"kl_coef": 0.3, "entropy_coef": 0.05},
    "role_decision_normalized": {"baseline": "role_decision_mean", "normalize_advantage": True},
    "no_baseline": {"baseline": "none"},
}


@pytest.mark.parametrize("options", list(OPTIONS), ids=list(OPTIONS))
@pytest.mark.parametrize("normalization", ["token_mean", "sequence_sum"])
def test_micro_batched_action_update_equals_the_whole_batch(module, rl, normalization, options):
    batch = action_batch(module)
    widest = max(len(p) + len(r) for p, r in zip(batch.prompt_ids, batch.reply_ids, strict=True))
    settings = {"loss_normalization": normalization, **OPTIONS[options]}
    means = [4.0, None, 0.5, None, 1.0, 2.0, None, 3.0]  # role_decision_mean's group means

    def loss_of(batch, backward):
        extra = {}
        total = module.action_loss(batch, backward, means, extra)
        return torch.cat([total.reshape(1), *[v.reshape(1) for v in extra.values()]])

    with references_of(module):
        module.rl = RLConfig(**settings, micro_batch_tokens=10**9)
        with forward_tokens(module) as whole_forwards:
            whole = gradient_of(module, loss_of, batch)
        budget = 2 * widest + 1  # at most two rows per forward
        module.rl = RLConfig(**settings, micro_batch_tokens=budget)
        with forward_tokens(module) as forwards:
            split = gradient_of(module, loss_of, batch)
    assert len(whole_forwards) == 1 and len(forwards) >= 4  # the agent's (a copy is the KL's)
    assert max(forwards) <= budget
    torch.testing.assert_close(split, whole, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "weights", [[1.0] * 6, [0.2, 1.0, 0.05, 0.7, 0.4, 0.9]], ids=["unweighted", "weighted"]
)
@pytest.mark.parametrize("kl_coef", [0.0, 0.5], ids=["paper", "kl"])
def test_micro_batched_bid_update_equals_the_whole_batch(module, rl, weights, kl_coef):
    policy = module.population.agents[0]
    prompts = loop_of(module).swarm.prompts
    observations = [f"inventory: {n} planks. near: forest" for n in range(6)]
    prompt_ids = policy.encode_prompts([prompts.bid("logger", o) for o in observations])
    levels = ["0.8", "0.0", "0.6", "0.2", "0.4", "0.8"]
    batch = BidBatch(
        0,
        prompt_ids,
        [policy.encode_reply(level) for level in levels],
        [policy.encode_reply(level) for level in reversed(levels)],
        weights,
        [()] * len(levels),
        [()] * len(levels),
        [False] * len(levels),
    )

    def loss_of(batch, backward):
        extra = {}
        total = module.bid_loss(batch, backward, extra)
        return torch.cat([total.reshape(1), *[v.reshape(1) for v in extra.values()]])

    with references_of(module):
        module.rl = RLConfig(micro_batch_tokens=10**9, kl_coef=kl_coef)
        whole = gradient_of(module, loss_of, batch)
        longest = max(len(p) + len(w) for p, w in zip(prompt_ids, batch.preferred_ids, strict=True))
        budget = 2 * 2 * longest  # two pairs (four rows) per forward
        module.rl = RLConfig(micro_batch_tokens=budget, kl_coef=kl_coef)
        with forward_tokens(module) as forwards:
            split = gradient_of(module, loss_of, batch)
    assert len(forwards) == 3 and max(forwards) <= budget
    assert (
        len(whole) == len(split) == sum(p.numel() for p in policy.parameters()) + 1 + (kl_coef > 0)
    )
    torch.testing.assert_close(split, whole, rtol=1e-5, atol=1e-6)


class FixedCollector:
    """A collector that always hands over the same batches: the learner needs nothing else."""

    def __init__(self, collector: Collector, batches: list[ActionBatch]):
        self.total_updates = 1
        self.batches = batches

    def collect(self, update: int, rank: int = 0) -> Collected:
        return Collected(UpdateKind.action, self.batches, {"reward/mean": 0.0})


def test_one_training_step_changes_the_agents_with_data_only(module):
    batch = action_batch(module, agent=1)
    learner = SwarmModule(
        module.population, FixedCollector(module.collector, [batch]), RLConfig(lr=1e-3), 1.0
    )
    before = [[p.detach().clone() for p in agent.parameters()] for agent in module.population]
    trainer = L.Trainer(
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    trainer.fit(learner)
    changed = [
        any(not torch.equal(a, p) for a, p in zip(old, agent.parameters(), strict=True))
        for old, agent in zip(before, module.population, strict=True)
    ]
    assert changed == [False, True, False]
    acted = agent_folder_name(1, module.population[1].role)  # the only agent with data
    assert learner.history[0]["loss_action"] == learner.history[0][f"loss_action/{acted}"]
    with torch.no_grad():
        for old, agent in zip(before, module.population, strict=True):
            for value, p in zip(old, agent.parameters(), strict=True):
                p.copy_(value)


def test_gradients_are_clipped_per_agent(module, rl):
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


# -- the schedule --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "bid_slot, updates", [(BidSlotWithoutBids.skip, 3 * 4), (BidSlotWithoutBids.action, 3 * 5)]
)
def test_a_rule_without_bids_makes_the_auctions_action_updates_unless_told_to_fill(
    module, bid_slot, updates
):
    """By default the bid slot of a rule without contested steps stays empty: it makes the
    auction's cycles x action_updates action updates; ``action`` fills each slot (old count)."""
    rl = RLConfig(cycles=3, bid_slot_without_bids=bid_slot)
    seeds = make_env().train_seeds()
    credit = make_credit(CreditConfig("bucket_brigade"))
    rotation = Collector(
        RolloutLoop(make_env, loop_of(module).swarm, RoundRobin()), rl, credit, seeds, 0
    )
    auction = Collector(loop_of(module), rl, credit, seeds, seed=0)
    assert rotation.total_updates == updates
    assert {rotation.update_kind(u) for u in range(updates)} == {UpdateKind.action}
    assert rotation.updates_made(updates - 1) == {"updates/action": updates, "updates/bid": 0}
    # The auction's schedule is the 4:1 cycle whatever the option: 12 action + 3 bid updates.
    assert auction.total_updates == 15
    kinds = [auction.update_kind(u) for u in range(15)]
    assert kinds == ([UpdateKind.action] * 4 + [UpdateKind.bid]) * 3
    for update in range(15):
        made = kinds[: update + 1]
        assert auction.updates_made(update) == {
            "updates/action": made.count(UpdateKind.action),
            "updates/bid": made.count(UpdateKind.bid),
        }
    if bid_slot == BidSlotWithoutBids.skip:
        assert rotation.total_updates == kinds.count(UpdateKind.action)


# -- forks (Eq. 3) -----------------------------------------------------------------------------
def test_forks_turn_contested_steps_into_pairs_of_the_winners_bids(module):
    loop = loop_of(module)
    rng, generator = random.Random(3), torch.Generator().manual_seed(3)
    episodes = loop.run(list(range(6)), rng, generator, keep_snapshots=True)
    contested = [s for e in episodes for s in e.steps if s.contested]
    assert contested and all(s.snapshot is not None for s in contested)
    assert all(s.snapshot is None for e in episodes for s in e.steps if not s.contested)
    pairs, stats = fork_pairs(loop, episodes, RLConfig(fork_budget=2), rng, generator)
    expected = sum(min(2, sum(s.contested for s in e.steps)) for e in episodes)
    assert stats.contested == stats.eligible == len(contested)
    assert stats.chosen == expected
    assert stats.resampled_below <= stats.chosen
    assert len(pairs) == stats.pairs == stats.resampled_below - stats.tied
    winners_prompts = {(s.actor, tuple(s.bids[s.actor].reply.prompt_ids)) for s in contested}
    recorded = {tuple(s.bids[s.actor].reply.reply_ids) for s in contested}
    for pair in pairs:
        # The pair compares the winner's own bids in the recorded context.
        assert (pair.agent, tuple(pair.prompt_ids)) in winners_prompts
        assert tuple(pair.preferred_ids) in recorded or tuple(pair.rejected_ids) in recorded


def test_zero_fork_budget_makes_no_pairs(module):
    rng, generator = random.Random(4), torch.Generator().manual_seed(4)
    episodes = loop_of(module).run([0, 1], rng, generator, keep_snapshots=True)
    pairs, stats = fork_pairs(loop_of(module), episodes, RLConfig(fork_budget=0), rng, generator)
    assert pairs == [] and stats.chosen == 0 and stats.resampled_below == 0


def test_a_forks_counterfactual_bid_always_parsed_below_the_runner_up(module):
    """A malformed resample would count as bid 0, but it is never the counterfactual reply of a
    preference pair: the untrained agents here reply garbage often, and every pair's other reply
    still parses to a level below the runner-up's bid."""
    loop = loop_of(module)
    rng, generator = random.Random(5), torch.Generator().manual_seed(5)
    episodes = loop.run(list(range(8)), rng, generator, keep_snapshots=True)
    rl = RLConfig(
        fork_budget=4, bid_resample="rejection", max_bid_resamples=3, bid_resample_temperature=3.0
    )
    pairs, stats = fork_pairs(loop, episodes, rl, rng, generator)
    assert stats.unparsed_resamples > 0, "the guard was never exercised"
    contested = [s for e in episodes for s in e.steps if s.contested]
    recorded = {
        (s.actor, tuple(s.bids[s.actor].reply.reply_ids)): s.decision.runner_up_bid
        for s in contested
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


def step_at(index: int, reward: float, contested: bool) -> StepRecord:
    decision = Decision(
        actor=0,
        winning_bid=0.8,
        runner_up=1 if contested else None,
        runner_up_bid=0.6 if contested else 0.0,
    )
    return StepRecord(index, decision, reward=reward, snapshot={} if contested else None)


def test_fork_selection_until_the_last_reward():
    steps = [step_at(0, 0.0, True), step_at(1, 2.0, True), step_at(2, 0.0, False)]
    steps += [step_at(3, 5.0, False), step_at(4, 0.0, True), step_at(5, 0.0, True)]
    episode = Episode(0, steps)
    assert [s.index for s in forkable_steps(episode, "all")] == [0, 1, 4, 5]
    assert [s.index for s in forkable_steps(episode, "until_last_reward")] == [0, 1]
    unrewarded = Episode(1, [step_at(0, 0.0, True), step_at(1, 0.0, True)])
    assert len(forkable_steps(unrewarded, "until_last_reward")) == 2


def test_bids_drawn_below_the_runner_up_follow_the_policy(module):
    """``bid_below`` returns well-formed levels under each ceiling; at a tiny temperature it
    picks the level that sampling at that temperature emits most likely among them."""
    swarm = loop_of(module).swarm
    envs = [make_env() for _ in range(4)]
    for seed, env in enumerate(envs):
        env.reset(seed)
    ceilings = [0.8, 0.6, 0.4, 0.2]
    generator = torch.Generator().manual_seed(0)
    drawn, masses = swarm.bid_below(1, envs, ceilings, generator, temperature=1.0)
    assert all(0.0 < q <= 1.0 for q in masses)
    policy = swarm.population.agents[1]
    for reply_, ceiling in zip(drawn, ceilings, strict=True):
        level, parsed = parse_bid(reply_.text, LEVELS)
        assert parsed and level < ceiling
        assert reply_.reply_ids == policy.encode_reply(swarm.prompts.reply_text(reply_.text))
    greedy = swarm.bid_below(1, envs[:1], [0.8], generator, temperature=1e-4)[0][0]
    prompt = policy.encode_prompts([swarm.prompts.bid("miner", envs[0].observation("miner"))])[0]
    candidates = [0.0, 0.2, 0.4, 0.6]
    replies = [policy.encode_reply(swarm.prompts.reply_text(f"{c:.1f}")) for c in candidates]
    with torch.no_grad():
        logp, mask = policy.reply_token_logprobs([prompt] * 4, replies, temperature=1e-4)
    best = candidates[int((logp * mask).sum(dim=1).argmax())]
    assert greedy.text == f"{best:.1f}"


def test_scoring_forwards_stay_within_the_token_budget(module):
    """Graph-of-Agents' peer scores and the draws below the runner-up score many rows: in
    forwards of at most ``token_budget`` tokens, with the same scores as one forward."""
    swarm = loop_of(module).swarm
    envs = [make_env() for _ in range(6)]
    for seed, env in enumerate(envs):
        env.reset(seed)
    replies = swarm.act(0, envs, torch.Generator().manual_seed(0))
    whole = swarm.score(1, envs, replies)
    policy = swarm.population.agents[1]
    prompts = policy.encode_prompts(
        [swarm.prompts.action("miner", env.observation("miner")) for env in envs]
    )
    bid_prompts = policy.encode_prompts(
        [swarm.prompts.bid("miner", env.observation("miner")) for env in envs]
    )
    longest_bid = max(
        len(policy.encode_reply(swarm.prompts.reply_text(f"{b:.1f}"))) for b in LEVELS
    )
    widest = max(
        *(len(p) + len(r.reply_ids) for p, r in zip(prompts, replies, strict=True)),
        *(len(p) + longest_bid for p in bid_prompts),
    )
    swarm.token_budget = 2 * widest
    try:
        with forward_tokens(module) as forwards:
            split = swarm.score(1, envs, replies)
            swarm.bid_below(1, envs, [0.8] * 6, torch.Generator().manual_seed(1))
    finally:
        swarm.token_budget = None
    assert len(forwards) >= 3 + 4 and max(forwards) <= 2 * widest
    assert split == pytest.approx(whole, abs=1e-5)


# -- the default fork feed: bids drawn below the runner-up, weighted as 3 rejection tries ----
BID_SPREAD = [0.15, 0.2, 0.2, 0.2, 0.25]
"""How often each level's reply is in the bid demonstrations of :func:`bidding_swarm`."""


@pytest.fixture(scope="module")
def bidding_swarm() -> Swarm:
    """A tiny swarm fitted, briefly, to the scripted experts' actions (so that who acts
    changes the reward) and to reply each canonical bid level with the frequencies of
    ``BID_SPREAD`` (a spread bid policy: its mass below a runner-up is neither ~0 nor ~1).
    Its bid budget fits every canonical bid reply."""
    env = make_env()
    demos = [d for seed in range(4) for d in play_expert_episode(env, seed, LEVELS).demonstrations]
    texts = PromptTemplate.for_env(env, "compact", None, LEVELS)
    bids = [d for d in demos if d.kind == "bid"]
    actions = [d for d in demos if d.kind == "action" and d.role is not None]
    corpus = [texts.bid(d.role, d.observation) for d in bids]
    corpus += [texts.action(d.role, d.observation) + texts.reply_text(d.reply) for d in actions]
    corpus += [texts.reply_text(f"{level:.1f}") for level in LEVELS] * 20
    arch = TinyArchConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    cfg = ModelConfig(name="tiny", source="tiny", prompt_style="compact", tiny=arch)
    torch.manual_seed(0)
    population = Population.build(cfg, list(env.roles), 1, corpus)
    prompts = PromptTemplate.for_env(env, "compact", population.agents[0].tokenizer, LEVELS)
    for agent in population.agents:
        mine = [d for d in actions if d.role == agent.role]
        bid_prompts = [prompts.bid(agent.role, d.observation) for d in bids if d.role == agent.role]
        rows = [(prompts.action(agent.role, d.observation), d.reply, 1.0) for d in mine]
        rows += [
            (prompt, f"{level:.1f}", share)
            for prompt in bid_prompts[:: max(len(bid_prompts) // 12, 1)]
            for level, share in zip(LEVELS, BID_SPREAD, strict=True)
        ]
        prompt_ids = agent.encode_prompts([prompt for prompt, _, _ in rows])
        reply_ids = [agent.encode_reply(prompts.reply_text(reply)) for _, reply, _ in rows]
        weights = torch.tensor([weight for _, _, weight in rows])
        optimizer = torch.optim.Adam(agent.parameters(), lr=2e-2)
        for _ in range(80):
            logp, mask = agent.reply_token_logprobs(prompt_ids, reply_ids)
            loss = -((logp * mask).sum(dim=1) * weights).sum() / weights.sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    policy = population.agents[0]
    longest = max(len(policy.encode_reply(prompts.reply_text(f"{b:.1f}"))) for b in LEVELS)
    return Swarm(population, prompts, longest + 1, 12, 1.0, hf_engine())


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_the_mass_below_is_the_chance_that_one_sampled_bid_is_a_level_below(
    bidding_swarm, temperature
):
    """``bid_below``'s q is the chance that one bid sampled at the same temperature (what a
    rejection try draws) is the canonical reply of a level below the ceiling: checked against
    the frequency among 3000 sampled replies (token-by-token tempering, as generation does)."""
    swarm = bidding_swarm
    envs = [make_env() for _ in range(3)]
    for seed, env in enumerate(envs):
        env.reset(seed)
    ceilings = [0.8, 0.6, 0.2]
    _, masses = swarm.bid_below(
        1, envs, ceilings, torch.Generator().manual_seed(0), temperature=temperature
    )
    samples = 3000
    bids = swarm.bid(
        1, envs, torch.Generator().manual_seed(1), copies=samples, temperature=temperature
    )
    policy = swarm.population.agents[1]
    for k, (ceiling, q) in enumerate(zip(ceilings, masses, strict=True)):
        canonical = [
            policy.encode_reply(swarm.prompts.reply_text(f"{level:.1f}"))
            for level in LEVELS
            if level < ceiling
        ]
        drawn = bids[k * samples : (k + 1) * samples]
        frequency = sum(bid.reply.reply_ids in canonical for bid in drawn) / samples
        assert 0.02 < q < 0.98, "the fitted policy should spread its bids"
        assert abs(frequency - q) < 4 * (q * (1 - q) / samples) ** 0.5, (ceiling, frequency, q)


def fork_feed(swarm: Swarm, rl: RLConfig):
    loop = RolloutLoop(make_env, swarm, Auction())
    rng, generator = random.Random(7), torch.Generator().manual_seed(7)
    episodes = loop.run(list(range(6)), rng, generator, keep_snapshots=True)
    pairs, stats = fork_pairs(loop, episodes, rl, rng, generator)
    return episodes, pairs, stats


def test_weighted_forks_carry_the_chance_that_three_tries_keep_them(bidding_swarm):
    """The canonical feed plays every chosen fork and weights its pair by 1 - (1 - q)^3, q the
    policy's mass on the levels below the runner-up (recomputed here from the bid prompt); the
    funnel reports the weight sum and the effective number of pairs."""
    swarm = bidding_swarm
    rl = RLConfig(fork_budget=3, bid_resample="weighted_below_runner_up")
    assert rl.fork_steps == "all"
    episodes, pairs, stats = fork_feed(swarm, rl)
    assert stats.resampled_below == stats.chosen > 0 and pairs
    weights = [pair.weight for pair in pairs]
    assert all(0.0 < w <= 1.0 for w in weights) and min(weights) < 0.99
    metrics = stats.as_metrics()
    assert metrics["forks/pairs"] == len(pairs)
    assert metrics["forks/pair_weight"] == pytest.approx(sum(weights))
    effective = sum(weights) ** 2 / sum(w * w for w in weights)
    assert metrics["forks/effective_pairs"] == pytest.approx(effective)
    assert 1.0 <= effective <= len(pairs)
    # Contested steps of one agent may share a bid prompt (the same observation) and differ in
    # their runner-up: a pair's weight is that of one of the steps with its prompt.
    runner_ups: dict[tuple, set[float]] = {}
    for step in (s for e in episodes for s in e.steps if s.contested):
        key = (step.actor, tuple(step.bids[step.actor].reply.prompt_ids))
        runner_ups.setdefault(key, set()).add(step.decision.runner_up_bid)
    for pair in pairs:
        policy = swarm.bid_population.agents[pair.agent]
        expected = []
        for runner_up in runner_ups[pair.agent, tuple(pair.prompt_ids)]:
            below = [level for level in LEVELS if level < runner_up]
            replies = [policy.encode_reply(swarm.prompts.reply_text(f"{b:.1f}")) for b in below]
            sums, _ = policy.sequence_logprobs([pair.prompt_ids] * len(below), replies)
            expected.append(1 - (1 - float(sums.double().exp().sum())) ** 3)
        assert any(pair.weight == pytest.approx(w, rel=1e-4) for w in expected), (
            pair.weight,
            expected,
        )


def test_unweighted_forks_have_unit_weights(bidding_swarm):
    _, pairs, stats = fork_feed(
        bidding_swarm, RLConfig(fork_budget=3, bid_resample="below_runner_up")
    )
    assert pairs and all(pair.weight == 1.0 for pair in pairs)
    assert stats.pair_weight == stats.effective_pairs == stats.pairs == len(pairs)
    (batch, *_) = preference_batches(pairs)
    assert batch.weights == [1.0] * len(batch.prompt_ids)


# -- options for long horizons [ours] ------------------------------------------------------------
def test_reply_entropy_is_that_of_the_full_next_token_distribution(module):
    """``reply_token_scores(entropy=True)``: per reply token, -sum_v p_v log p_v of the whole
    vocabulary at the sampling temperature, each row computed on its own (no padding)."""
    batch = action_batch(module)
    policy = module.population.agents[batch.agent]
    rows = range(3)
    temperature = 0.7
    scores = policy.reply_token_scores(
        [batch.prompt_ids[i] for i in rows], [batch.reply_ids[i] for i in rows], temperature, True
    )
    with torch.no_grad():
        for row in rows:
            prompt, reply_ids = batch.prompt_ids[row], batch.reply_ids[row]
            ids = torch.tensor([prompt + reply_ids])
            logits = policy.model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
            probs = torch.softmax(logits / temperature, dim=-1)
            expected = -(probs * probs.log()).sum(dim=-1)
            n = len(reply_ids)
            torch.testing.assert_close(scores.entropy[row, :n], expected, rtol=1e-4, atol=1e-5)
            assert torch.all(scores.entropy[row, n:] == 0)
    plain = policy.reply_token_logprobs(
        [batch.prompt_ids[i] for i in rows], [batch.reply_ids[i] for i in rows], temperature
    )
    assert torch.equal(plain[0], scores.logprobs) and torch.equal(plain[1], scores.mask)


def test_kl_to_a_reference_equal_to_the_policy_adds_nothing(module, rl):
    """At the start of RL the policy is its reference: k3 = 0 and its gradient 0 at every
    token, so the update is the plain REINFORCE one; once the weights moved, KL > 0."""
    batch = action_batch(module)
    module.rl = RLConfig()
    plain = gradient_of(module, module.action_loss, batch)
    module.rl = RLConfig(kl_coef=1.0)
    extra = {}
    with references_of(module, moved=False):
        penalised = gradient_of(
            module, lambda b, back: module.action_loss(b, back, None, extra), batch
        )
    assert float(extra["loss_action/kl"]) == 0.0
    torch.testing.assert_close(penalised, plain)
    with references_of(module, moved=True):
        module.action_loss(batch, lambda agent, loss: None, None, extra)
    assert float(extra["loss_action/kl"]) > 0.0


def test_without_a_baseline_equal_credits_still_give_a_gradient(module, rl):
    batch = action_batch(module)
    equal = replace(batch, credit=[2.0] * 8)
    module.rl = RLConfig()
    assert gradient_of(module, module.action_loss, equal)[:-1].abs().sum() == 0
    module.rl = RLConfig(baseline="none")
    assert gradient_of(module, module.action_loss, equal)[:-1].abs().sum() > 0


def test_role_decision_baselines_group_the_updates_rows_by_role_and_decision():
    """Two agents of one role (replicas) share their groups; another role's rows never mix."""
    roles = {0: SimpleNamespace(role="logger"), 1: SimpleNamespace(role="logger")}
    roles[2] = SimpleNamespace(role="miner")
    learner = SimpleNamespace(rl=RLConfig(baseline="role_decision_mean"), population=roles)
    batches = [
        ActionBatch(0, [[1]] * 3, [[2]] * 3, [1.0, 2.0, 6.0], [0, 1, 5], [()] * 3),
        ActionBatch(1, [[1]] * 2, [[2]] * 2, [3.0, 10.0], [0, 1], [()] * 2),
        ActionBatch(2, [[1]] * 2, [[2]] * 2, [7.0, 9.0], [0, 0], [()] * 2),
    ]
    found = SwarmModule.role_decision_baselines(learner, batches)
    assert found == {0: [2.0, 6.0, None], 1: [2.0, 6.0], 2: [8.0, 8.0]}
    learner.rl = RLConfig()
    assert SwarmModule.role_decision_baselines(learner, batches) == {}


def test_fork_selection_by_margin_and_by_nearness_to_the_next_reward():
    def contested(index: int, winning: float, runner_up: float, reward: float = 0.0):
        decision = Decision(actor=0, winning_bid=winning, runner_up=1, runner_up_bid=runner_up)
        return StepRecord(index, decision, reward=reward, snapshot={})

    steps = [contested(0, 0.8, 0.6), contested(1, 0.8, 0.2), contested(2, 0.6, 0.4, 3.0)]
    steps += [contested(3, 0.8, 0.4), contested(4, 0.4, 0.2), contested(5, 0.8, 0.6, 1.0)]
    steps += [contested(6, 0.8, 0.2)]
    episode = Episode(0, steps)

    def chosen(selection, budget, seed=0):
        picked = choose_fork_steps(episode, steps, selection, budget, random.Random(seed))
        return [s.index for s in picked]

    # margins 0.2 at steps 0, 2, 4, 5; 0.4 at 3; 0.6 at 1 and 6
    for seed in range(5):
        assert sorted(chosen("margin", 4, seed)) == [0, 2, 4, 5]
        assert chosen("margin", 5, seed)[4] == 3
    # ties in random order: 0.8-0.6, 0.6-0.4 and 0.4-0.2 are one margin, each first sometimes
    assert {chosen("margin", 1, seed)[0] for seed in range(40)} == {0, 2, 4, 5}
    # next reward at 2 (3.0) and 5 (1.0): distances 2, 1, 0, 2, 1, 0 and none for step 6
    assert sorted(chosen("near_reward", 2)) == [2, 5]
    assert sorted(chosen("near_reward", 4)) == [1, 2, 4, 5]
    assert chosen("near_reward", 7)[-1] == 6  # after the last reward: chosen last
    # without replacement, deterministic per draw, never more than there are
    assert chosen("near_reward", 7, 3) == chosen("near_reward", 7, 3)
    assert sorted(chosen("uniform", 10)) == list(range(7))
    assert chosen("uniform", 3, 1) == [s.index for s in random.Random(1).sample(steps, 3)]


def test_the_learning_rate_schedule_and_the_new_terms_reach_the_history(module):
    """Three updates under a linear schedule: lr, then 2/3 and 1/3 of it, set in every param
    group; the KL term is 0 at the first update (the reference is the policy) and above 0
    once the weights moved; the entropy term is logged."""
    batch = action_batch(module, agent=1)
    collector = FixedCollector(module.collector, [batch])
    collector.total_updates = 3
    rl = RLConfig(lr=1e-3, lr_schedule="linear", kl_coef=0.1, entropy_coef=0.01)
    before = [[p.detach().clone() for p in agent.parameters()] for agent in module.population]
    learner = SwarmModule(module.population, collector, rl, 1.0)
    trainer = L.Trainer(
        max_epochs=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    try:
        trainer.fit(learner)
        history = learner.history
        assert [h["lr"] for h in history] == pytest.approx([1e-3, 2e-3 / 3, 1e-3 / 3])
        assert all(g["lr"] == pytest.approx(1e-3 / 3) for g in learner.optimizers().param_groups)
        assert history[0]["loss_action/kl"] == 0.0 and history[2]["loss_action/kl"] > 0.0
        assert all(h["entropy"] > 0.0 for h in history)
        plain = SwarmModule(
            module.population, FixedCollector(module.collector, [batch]), RLConfig(), 1.0
        )
        assert plain.references is None  # kl_coef 0: no copy is made
    finally:
        with torch.no_grad():
            for old, agent in zip(before, module.population, strict=True):
                for value, p in zip(old, agent.parameters(), strict=True):
                    p.copy_(value)


def test_the_kl_references_forwards_are_counted_as_scored_tokens(module):
    """The same update (an action batch of one agent, a bid batch of another) with and without
    the KL penalty: the ledger differs by exactly 2 x params per token the references
    forwarded (counted here on their models, padding left out), and in nothing else."""
    prompts = loop_of(module).swarm.prompts
    smith = module.population.agents[2]
    bid_prompt = smith.encode_prompts([prompts.bid("smith", "inventory: 2 oak log.")])[0]
    pair = PreferencePair(2, bid_prompt, smith.encode_reply("0.8"), smith.encode_reply("0.0"))
    batches = [action_batch(module, agent=1), *preference_batches([pair])]
    before = [[p.detach().clone() for p in agent.parameters()] for agent in module.population]
    ledgers, forwarded = {}, []
    for kl_coef in (0.0, 0.5):
        learner = SwarmModule(
            module.population,
            FixedCollector(module.collector, batches),
            RLConfig(lr=1e-3, kl_coef=kl_coef),
            1.0,
        )
        hooks = [
            reference.copy.model.register_forward_pre_hook(
                lambda mod, args, kwargs, agent=i: forwarded.append(
                    (agent, int(kwargs["attention_mask"].sum()))
                ),
                with_kwargs=True,
            )
            for i, reference in enumerate(learner.references or [])
        ]
        trainer = L.Trainer(
            max_epochs=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            accelerator="cpu",
        )
        try:
            trainer.fit(learner)
        finally:
            for hook in hooks:
                hook.remove()
            with torch.no_grad():  # each run starts from the same weights
                for old, agent in zip(before, module.population, strict=True):
                    for value, p in zip(old, agent.parameters(), strict=True):
                        p.copy_(value)
        ledgers[kl_coef] = learner.usage
    plain, penalised = ledgers[0.0], ledgers[0.5]
    assert {agent for agent, _ in forwarded} == {1, 2}
    tokens = sum(n for _, n in forwarded)
    budget = RLConfig().micro_batch_tokens
    assert tokens == sum(
        b.learner_tokens(module.population.agents[b.agent], budget) for b in batches
    )
    flops = sum(
        2 * sum(p.numel() for p in module.population.agents[agent].parameters()) * n
        for agent, n in forwarded
    )
    assert penalised.rollout_tokens - plain.rollout_tokens == tokens
    assert penalised.rollout_flops - plain.rollout_flops == pytest.approx(flops)
    assert (penalised.train_tokens, penalised.train_flops) == (
        plain.train_tokens,
        plain.train_flops,
    )
