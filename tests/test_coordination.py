"""Coordination rules as pure decisions (no model anywhere in the first part), and the rollout
loop sampling exactly what each rule declares it needs (tiny real agents)."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from bidswarm.agents.population import Population
from bidswarm.agents.prompts import PromptTemplate
from bidswarm.config import ModelConfig, TinyArchConfig, register_configs
from bidswarm.coordination import RULES, make_coordination
from bidswarm.coordination.agentnet import (
    AgentNet,
    AgentNetConfig,
    SuccessMemory,
    observation_tokens,
    token_overlap,
)
from bidswarm.coordination.auction import Auction
from bidswarm.coordination.base import Decision, Situation, peer_scores
from bidswarm.coordination.fixed import Monolithic, RoundRobin
from bidswarm.coordination.graph_of_agents import GraphOfAgents, best_proposal
from bidswarm.envs import make_env
from bidswarm.envs.base import MONOLITHIC, role_name
from bidswarm.envs.crafting.config import CraftingConfig
from bidswarm.rollout.loop import RolloutLoop
from bidswarm.rollout.metrics import PEER_SCORE_NEAR_TIE, episode_metrics
from bidswarm.rollout.records import Episode
from bidswarm.rollout.swarm import Swarm
from conftest import CONF, hf_engine

LEVELS = [0.0, 0.2, 0.4, 0.6, 0.8]


def situation(decision: int = 0, n: int = 3, **fields) -> Situation:
    return Situation(n_agents=n, decision=decision, **fields)


# -- registry and configs ----------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(RULES))
def test_every_rule_is_selectable_from_the_config(name):
    register_configs()
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=[f"coordination={name}"])
    assert cfg.coordination.name == name
    rule = make_coordination(OmegaConf.to_object(cfg.coordination))
    assert type(rule) is RULES[name]


def test_agentnet_reads_its_thresholds_and_memory_size_from_its_yaml():
    register_configs()
    overrides = ["coordination=agentnet", "coordination.keep_bid=0.8", "coordination.neighbours=3"]
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    config = OmegaConf.to_object(cfg.coordination)
    assert isinstance(config, AgentNetConfig)
    rule = make_coordination(config)
    assert rule.keep_bid == 0.8 and rule.memory.neighbours == 3
    assert rule.memory.entries.maxlen == config.memory_size == 2048


@pytest.mark.parametrize("name", sorted(RULES))
def test_what_each_rule_asks_the_collector_for(name):
    """What a rule declares is consistent, whatever rule the registry holds."""
    rule_class = RULES[name]
    assert rule_class.name == name
    rule = rule_class.from_config(rule_class.Config(name=name))
    if not rule.asks_bids:
        assert rule.bidders(situation(n=3)) == []  # no bids asked: nobody named to bid
    if rule.makes_contested_steps:  # a contested step is one where bids compete (Eq. 3)
        assert rule.asks_bids and rule.records_winning_bids
    if rule.records_winning_bids:  # bid replies, or each agent's own score of its proposal
        assert rule.asks_bids or (rule.asks_proposals and rule.scores_own_proposal)
    if rule.scores_own_proposal:
        assert rule.asks_proposals
    if rule.monolithic:  # a single agent owns every role: there is nobody to bid against
        assert not (rule.asks_bids or rule.asks_proposals)


@pytest.mark.parametrize("name", sorted(RULES))
def test_every_parameter_of_every_rule_is_checked(name):
    """Each field of a rule's schema has declared allowed values, and each declared value the
    check refuses is refused (``tests/test_config_errors.py`` runs them through ``validate``)."""
    rule = RULES[name]
    fields = {f.name for f in dataclasses.fields(rule.Config)} - {"name"}
    declared = [parameter.key for parameter in rule.parameters()]
    assert set(declared) == fields
    for key, allowed in rule.parameters():
        assert not allowed.accepts(allowed.refuses), (key, allowed.refuses)
        config = rule.Config(name=name, **{key: allowed.refuses})
        assert any(line.startswith(f"coordination.{key}=") for line in rule.problems(config))
    assert rule.problems(rule.Config(name=name)) == []  # the schema's defaults are allowed


# -- the auction (Eq. 1) -----------------------------------------------------------------------
def test_auction_asks_every_agent_and_decides_from_the_parsed_bids():
    rule = Auction()
    assert rule.bidders(situation(n=3)) == [0, 1, 2]
    bids = [{0: 0.2, 1: 0.8, 2: 0.4}, {0: 0.0, 1: 0.0, 2: 0.0}, {0: 0.6, 1: 0.0, 2: 0.0}]
    decisions = rule.decide([situation(bids=b) for b in bids], random.Random(0))
    assert decisions[0] == Decision(actor=1, winning_bid=0.8, runner_up=2, runner_up_bid=0.4)
    assert decisions[0].contested
    assert decisions[1].actor is None and not decisions[1].contested  # all zero: skipped
    assert decisions[2] == Decision(actor=0, winning_bid=0.6)  # alone: not contested


def test_auction_with_equal_bids_is_a_uniform_random_actor():
    rule = Auction()
    rng = random.Random(0)
    tied = situation(bids={0: 0.4, 1: 0.4, 2: 0.4})
    actors = [rule.decide([tied], rng)[0].actor for _ in range(300)]
    assert {a: actors.count(a) for a in range(3)} == pytest.approx({0: 100, 1: 100, 2: 100}, abs=30)


# -- fixed rules -------------------------------------------------------------------------------
def test_round_robin_and_monolithic_need_nothing_but_the_step():
    decisions = RoundRobin().decide([situation(d) for d in range(5)], random.Random(0))
    assert [d.actor for d in decisions] == [0, 1, 2, 0, 1]
    assert RoundRobin().bidders(situation()) == []
    assert [d.actor for d in Monolithic().decide([situation(n=1)] * 2, random.Random(0))] == [0, 0]
    with pytest.raises(ValueError, match="1 agent"):
        Monolithic().decide([situation(n=3)], random.Random(0))


# -- Graph-of-Agents ---------------------------------------------------------------------------
def test_peer_scores_leave_out_the_proposers_own_score():
    scores = [[9.0, -1.0, -3.0], [-2.0, 9.0, -1.0], [-4.0, -2.0, 9.0]]
    assert peer_scores(scores) == [-3.0, -1.5, -2.0]
    assert peer_scores([[-0.5]]) == [-0.5]


def test_best_proposal_breaks_ties_uniformly():
    rng = random.Random(0)
    picks = {best_proposal([-1.0, -0.5, -0.5, -2.0], rng) for _ in range(50)}
    assert picks == {1, 2}


def test_graph_of_agents_acts_with_the_best_peer_scored_proposal():
    scores = ((0.0, -1.0, -3.0), (-2.0, 0.0, -1.0), (-4.0, -0.5, 0.0))
    decision = GraphOfAgents().decide([situation(peer_scores=scores)], random.Random(0))[0]
    assert decision == Decision(actor=1)  # peer means: -3.0, -0.75, -2.0
    lone = GraphOfAgents().decide([situation(n=1, peer_scores=((-0.5,),))], random.Random(0))
    assert lone[0].actor == 0


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
    return AgentNet(AgentNetConfig(name="agentnet", keep_bid=keep_bid, min_overlap=min_overlap))


def test_agentnet_asks_only_the_holder_and_keeps_on_a_high_bid():
    rule = agentnet(keep_bid=0.6, min_overlap=2.0)
    assert rule.bidders(situation(previous_actor=None)) == []
    assert rule.bidders(situation(previous_actor=2)) == [2]
    keeps = situation(decision=4, previous_actor=2, bids={2: 0.6})
    passes = situation(decision=4, previous_actor=2, bids={2: 0.4})
    start = situation(decision=4)
    decisions = rule.decide([keeps, passes, start], random.Random(0))
    # keeps; forwards to the next agent (no usable memory); no holder: decision mod N
    assert [d.actor for d in decisions] == [2, 0, 1]
    assert all(d.winning_bid == 0.0 and not d.contested for d in decisions)


def test_agentnet_forwards_to_the_agent_its_memory_suggests():
    rule = agentnet(keep_bid=2.0, min_overlap=0.99)
    seen = situation(decision=3, previous_actor=0, observation="stone pickaxe: ready", bids={0: 0})
    assert rule.decide([seen], random.Random(0))[0].actor == 1  # empty memory: rotation
    rule.record_outcomes([seen], [Decision(actor=2)], [5.0])  # agent 2 earned reward here
    assert rule.memory.suggest(observation_tokens(seen.observation)) == 2
    assert rule.decide([seen], random.Random(0))[0].actor == 2
    fresh = situation(decision=0, observation="stone pickaxe: ready")
    assert rule.decide([fresh], random.Random(0))[0].actor == 2  # no holder: the memory's choice
    rule.record_outcomes([seen], [Decision(actor=1)], [0.0])
    assert len(rule.memory) == 1, "a step without reward is not remembered"


# -- the loop samples what the rule declares (tiny real agents) ---------------------------------
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
    return Swarm(
        population,
        prompts,
        max_bid_tokens=3,
        max_action_tokens=6,
        temperature=1.0,
        engine=hf_engine(),
    )


def envs_at(seeds: list[int], max_decisions: int = 6):
    envs = [make_env(task(max_decisions)) for _ in seeds]
    for env, seed in zip(envs, seeds, strict=True):
        env.reset(seed)
    return envs


def seeded(seed: int) -> torch.Generator:
    generator = torch.Generator()
    generator.manual_seed(seed)
    return generator


def test_swarm_score_is_the_mean_token_logprob_and_is_counted():
    swarm = build_swarm()
    envs = envs_at([1, 2])
    replies = swarm.act(0, envs, seeded(0))
    tokens_before = swarm.usage.rollout_tokens
    scores = swarm.score(1, envs, replies)
    policy = swarm.population.agents[1]
    prompts = policy.encode_prompts(
        [swarm.prompts.action("miner", env.observation("miner")) for env in envs]
    )
    for prompt, reply, score in zip(prompts, replies, scores, strict=True):
        with torch.no_grad():
            logp, mask = policy.reply_token_logprobs([prompt], [reply.reply_ids])
        assert score == pytest.approx(float(logp.sum() / mask.sum()), abs=1e-5)
    scored = sum(len(p) + len(r.reply_ids) for p, r in zip(prompts, replies, strict=True))
    assert swarm.usage.rollout_tokens - tokens_before == scored


def test_graph_of_agents_plays_proposals_peers_scored_highest():
    swarm = build_swarm()
    loop = RolloutLoop(lambda: make_env(task()), swarm, GraphOfAgents())
    envs = envs_at([3, 4, 5])
    situations, _, proposals = loop._gather(
        envs, [Episode(s) for s in (3, 4, 5)], seeded(7), random.Random(0)
    )
    again = seeded(7)  # the same generator seed reproduces every agent's proposals
    redone = [swarm.act(agent, envs, again) for agent in range(swarm.n_agents)]
    for e, (s, env_proposals) in enumerate(zip(situations, proposals, strict=True)):
        assert [p.reply_ids for p in env_proposals] == [redone[a][e].reply_ids for a in range(3)]
        for scorer in range(3):
            for proposer in range(3):
                if scorer != proposer:
                    value = swarm.score(scorer, [envs[e]], [redone[proposer][e]])[0]
                    assert s.peer_scores[scorer][proposer] == pytest.approx(value, abs=1e-5)
    decisions = loop.coordination.decide(situations, random.Random(0))
    best = [max(peer_scores(s.peer_scores)) for s in situations]
    for d, s, top in zip(decisions, situations, best, strict=True):
        assert peer_scores(s.peer_scores)[d.actor] == top


def test_graph_of_agents_plays_whole_episodes_with_one_or_many_agents():
    for monolithic in (False, True):
        swarm = build_swarm(monolithic=monolithic)
        loop = RolloutLoop(lambda: make_env(task()), swarm, GraphOfAgents())
        episodes = loop.run([0, 1], random.Random(0), seeded(0))
        for episode in episodes:
            assert len(episode.steps) == 6
            for step in episode.steps:
                assert step.actor is not None and step.action.agent == step.actor
                assert step.decision.winning_bid == 0.0 and not step.contested
                # the step keeps what the rule read: the actor's proposal scored highest
                scores = step.proposal_scores
                assert sorted(scores) == list(range(swarm.n_agents))
                assert scores[step.actor] == max(scores.values())
        assert swarm.usage.bids_made == 0
        roles = [swarm.role(a) for a in range(swarm.n_agents)]
        metrics = episode_metrics(episodes, roles, LEVELS)
        steps = [s for e in episodes for s in e.steps]
        for role in {role_name(r) for r in roles}:
            got = [
                v
                for s in steps
                for a, v in s.proposal_scores.items()
                if role_name(roles[a]) == role
            ]
            assert metrics[f"peer_scores/received/{role}"] == pytest.approx(sum(got) / len(got))
        if monolithic:  # a lone agent: nothing to compare
            assert "peer_scores/margin" not in metrics
        else:
            gaps = [
                (lambda v: v[0] - v[1])(sorted(s.proposal_scores.values(), reverse=True))
                for s in steps
            ]
            assert metrics["peer_scores/margin"] == pytest.approx(sum(gaps) / len(gaps))
            assert metrics["peer_scores/margin"] >= 0.0
            near = sum(g < PEER_SCORE_NEAR_TIE for g in gaps) / len(gaps)
            assert metrics["peer_scores/near_tie"] == pytest.approx(near)
    bidders = build_swarm()
    played = RolloutLoop(lambda: make_env(task()), bidders, Auction()).run(
        [0], random.Random(0), seeded(0)
    )
    roles = [bidders.role(a) for a in range(bidders.n_agents)]
    assert not any(s.proposal_scores for s in played[0].steps)
    assert not any(k.startswith("peer_scores/") for k in episode_metrics(played, roles, LEVELS))


def test_agentnet_that_never_keeps_and_has_no_memory_is_round_robin():
    swarm = build_swarm()
    loop = RolloutLoop(lambda: make_env(task()), swarm, agentnet(keep_bid=2.0, min_overlap=2.0))
    episodes = loop.run([0, 1, 2], random.Random(0), seeded(0))
    for episode in episodes:
        assert [s.actor for s in episode.steps] == [d % 3 for d in range(6)]
        assert all(s.decision.winning_bid == 0.0 for s in episode.steps)
        # The loop sampled exactly the holder's bid, from the second step on.
        assert [sorted(s.bids) for s in episode.steps] == [[]] + [
            [(d - 1) % 3] for d in range(1, 6)
        ]
    assert swarm.usage.bids_made == 3 * 5


def test_agentnet_holder_that_always_keeps_acts_every_step():
    swarm = build_swarm()
    loop = RolloutLoop(lambda: make_env(task()), swarm, agentnet(keep_bid=0.0, min_overlap=2.0))
    for episode in loop.run([0, 1], random.Random(0), seeded(0)):
        assert [s.actor for s in episode.steps] == [0] * 6


def test_a_forced_first_actor_is_the_holder_of_the_branch():
    swarm = build_swarm()
    loop = RolloutLoop(lambda: make_env(task()), swarm, agentnet(keep_bid=0.0, min_overlap=2.0))
    envs = envs_at([7])
    branch = Episode(7)
    loop.play(envs, [branch], random.Random(0), seeded(0), first_actors=[2])
    assert [s.actor for s in branch.steps] == [2] * 6
