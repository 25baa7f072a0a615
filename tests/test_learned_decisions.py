"""Decisions a coordination rule learns from the experts' demonstrations instead of bids:
Graph-of-Agents' trained peer scores, AgentNet's trained router, the centralised router's
decider. The rules as pure decisions first, then what the collector reads for them (tiny real
models), their demonstrations, their SFT and budget, and their labels in the swarm's states."""

from __future__ import annotations

import math
import random

import pytest
import torch

from bidswarm import metric_names as names
from bidswarm.agents.population import DECIDER_FOLDER, Population
from bidswarm.agents.prompts import PromptTemplate
from bidswarm.config import SFTConfig, SFTDemonstrations
from bidswarm.coordination.agentnet import AgentNet, AgentNetConfig
from bidswarm.coordination.auction import Auction
from bidswarm.coordination.base import (
    ACTION_LOGPROB,
    DECIDER,
    DECIDER_NAME,
    OWN_SCORE,
    PICK,
    ROUTE,
    SCORE,
    USEFULNESS,
    CoordinationRule,
    Decision,
    Situation,
    likeliest,
)
from bidswarm.coordination.bid_readers import Expected
from bidswarm.coordination.graph_of_agents import GraphOfAgents, GraphOfAgentsConfig
from bidswarm.coordination.proposal_auction import ProposalAuction
from bidswarm.coordination.router import Router
from bidswarm.envs import make_env
from bidswarm.envs.base import MONOLITHIC
from bidswarm.envs.crafting import CraftingConfig
from bidswarm.envs.experts import (
    expert_levels,
    expert_owners,
    format_bid,
    play_expert_episode,
)
from bidswarm.lit.sft import plan_sft, run_sft
from bidswarm.rollout.loop import RolloutLoop
from bidswarm.rollout.records import Episode
from bidswarm.rollout.swarm import Swarm
from bidswarm.run.decision_demonstrations import (
    decision_demonstrations,
    state_demonstrations,
    with_learned_decisions,
)
from bidswarm.run.relabel import (
    RELABEL_DECISIONS,
    RoundTraining,
    decision_round_kinds,
    relabel_decisions,
)
from conftest import hf_engine
from test_coordination import LEVELS, envs_at, seeded, task

ROLES = ["logger", "miner", "smith"]


def situation(decision: int = 0, n: int = 3, **fields) -> Situation:
    return Situation(n_agents=n, decision=decision, **fields)


def log_softmax(values: dict[int, float]) -> dict[int, float]:
    total = math.log(sum(math.exp(v) for v in values.values()))
    return {a: v - total for a, v in values.items()}


# -- the rules, as pure decisions --------------------------------------------------------------
def test_graph_of_agents_scores_by_logprob_unless_its_scoring_is_trained():
    untrained = GraphOfAgents()
    assert untrained.proposal_scoring == ACTION_LOGPROB and not untrained.decisions_learned
    trained = GraphOfAgents(GraphOfAgentsConfig(name="graph_of_agents", scoring="trained"))
    assert trained.proposal_scoring == USEFULNESS and trained.decisions_learned == {SCORE}
    config = GraphOfAgentsConfig(name="graph_of_agents", relabel_rounds=1)
    assert any("relabel_rounds=1" in line for line in GraphOfAgents.problems(config))
    config.scoring = "trained"
    assert GraphOfAgents.problems(config) == []


def test_the_proposal_auction_lets_the_highest_own_bid_act_and_credit_read_it():
    own = ((0.3, 0.0, 0.0), (0.0, 0.7, 0.0), (0.0, 0.0, 0.5))  # the diagonal: each its own bid
    rule = ProposalAuction()
    (decision,) = rule.settle(
        rule.decide([situation(peer_scores=own, own_scores=True)], random.Random(0))
    )
    assert (decision.actor, decision.winning_bid) == (1, 0.7)
    assert (decision.runner_up, decision.runner_up_bid) == (2, 0.5)
    assert decision.credited_bid == 0.7 and not decision.contested
    # An absent agent neither bids nor acts; tied bids are broken uniformly.
    gone = situation(peer_scores=own, own_scores=True, absent=frozenset({1}))
    assert rule.decide([gone], random.Random(0))[0].actor == 2
    tied = ((0.6, 0.0), (0.0, 0.6))
    picks = {
        rule.decide([situation(n=2, peer_scores=tied, own_scores=True)], random.Random(s))[0].actor
        for s in range(40)
    }
    assert picks == {0, 1}
    assert rule.decisions_learned == {OWN_SCORE} and rule.scores_own_proposal


def trained_agentnet(**fields) -> AgentNet:
    return AgentNet(AgentNetConfig(name="agentnet", router="trained", **fields))


def test_trained_agentnet_asks_the_holders_route_not_its_bid():
    rule = trained_agentnet()
    assert not rule.asks_bids and rule.asks_routes and rule.decisions_learned == {ROUTE}
    assert AgentNet().asks_bids and not AgentNet().asks_routes  # the bid router, as before
    held = situation(5, previous_actor=2)
    assert rule.bidders(held) == [] and rule.routers(held) == [2]
    assert rule.routers(situation(4)) == [1], "no holder: the entry agent decision mod N routes"
    assert rule.routers(situation(4, absent=frozenset({1}))) == [2]


def test_trained_agentnet_keeps_when_the_holder_names_itself_and_forwards_otherwise():
    rule = trained_agentnet()
    keep = situation(3, previous_actor=1, routes={1: log_softmax({0: -3.0, 1: -0.1, 2: -2.0})})
    forward = situation(3, previous_actor=1, routes={1: log_softmax({0: -3.0, 1: -2, 2: -0.2})})
    gone = situation(3, previous_actor=1, absent=frozenset({2}), routes=forward.routes)
    decisions = rule.decide([keep, forward, gone], random.Random(0))
    assert [d.actor for d in decisions] == [1, 2, 1]  # an absent destination cannot act
    assert all(d.winning_bid == 0.0 and not d.contested for d in decisions)


def test_trained_agentnets_memory_weight_mixes_the_memorys_votes_into_the_route():
    observation = "inventory: 2 oak planks. near: forest"
    routes = {0: log_softmax({0: 0.0, 1: -0.5, 2: -5.0})}  # the router prefers itself a little
    for weight, expected in ((0.0, 0), (0.5, 1)):
        rule = trained_agentnet(memory_weight=weight, min_overlap=0.5)
        rule.record_outcomes([situation(observation=observation)], [Decision(actor=1)], [10.0])
        held = situation(2, previous_actor=0, observation=observation, routes=routes)
        assert rule.decide([held], random.Random(0))[0].actor == expected


def test_the_router_asks_its_decider_and_picks_the_likeliest_present_agent():
    rule = Router()
    assert rule.needs_decider and rule.asks_routes and rule.decisions_learned == {PICK}
    assert not (rule.asks_bids or rule.asks_proposals)
    assert rule.routers(situation()) == [DECIDER]
    routes = {DECIDER: {0: -2.0, 1: -3.0, 2: -0.1}}
    assert rule.decide([situation(routes=routes)], random.Random(0))[0].actor == 2
    smith_gone = situation(routes=routes, absent=frozenset({2}))
    assert rule.decide([smith_gone], random.Random(0))[0].actor == 0
    nobody = situation(absent=frozenset({0, 1, 2}))
    assert rule.routers(nobody) == [] and rule.decide([nobody], random.Random(0))[0].actor is None


def test_likeliest_breaks_ties_uniformly():
    tied = {0: -1.0, 1: -1.0, 2: -4.0}  # two replicas of one role read alike
    picks = {likeliest(tied, random.Random(seed)) for seed in range(40)}
    assert picks == {0, 1}
    assert likeliest({}, random.Random(0)) is None


# -- what the collector reads for them (tiny real models) --------------------------------------
def build_swarm(decider: bool = False) -> Swarm:
    from test_coordination import build_swarm as plain

    swarm = plain()
    if decider:
        swarm.population = swarm.population.with_decider(tiny_model_config())
    return swarm


def tiny_model_config():
    from bidswarm.config import ModelConfig, TinyArchConfig

    arch = TinyArchConfig(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128)
    return ModelConfig(name="tiny", source="tiny", prompt_style="compact", tiny=arch)


def teacher_forced(policy, prompt: str, reply: str, prompts: PromptTemplate) -> float:
    prompt_ids = policy.encode_prompts([prompt])
    reply_ids = [policy.encode_reply(prompts.reply_text(reply))]
    with torch.no_grad():
        logp, mask = policy.reply_token_logprobs(prompt_ids, reply_ids, temperature=1.0)
    return float((logp * mask).sum())


def test_routes_are_the_teacher_forced_logprobs_of_each_roles_name_and_are_counted():
    swarm = build_swarm(decider=True)
    loop = RolloutLoop(lambda: make_env(task()), swarm, Router())
    envs = envs_at([1, 2])
    tokens = swarm.usage.rollout_tokens
    found = loop.decisions.routes(envs, [[DECIDER, 2], [1]], [[0, 1, 2], [0, 2]])
    assert sorted(found[0]) == [DECIDER, 2] and sorted(found[1]) == [1]
    assert sorted(found[1][1]) == [0, 2], "only the present agents are scored"
    decider, smith = swarm.population.decider, swarm.population.agents[2]
    for agent, role in enumerate(ROLES):
        prompt = swarm.prompts.route(DECIDER_NAME, envs[0].observation(MONOLITHIC))
        expected = teacher_forced(decider, prompt, role, swarm.prompts)
        assert found[0][DECIDER][agent] == pytest.approx(expected, abs=1e-4)
        prompt = swarm.prompts.route("smith", envs[0].observation("smith"))
        expected = teacher_forced(smith, prompt, role, swarm.prompts)
        assert found[0][2][agent] == pytest.approx(expected, abs=1e-4)
    assert swarm.usage.rollout_tokens > tokens


GATHER_SEEDS = (3, 4)


def gathering(rule: CoordinationRule) -> tuple[Swarm, RolloutLoop, list]:
    """A fresh swarm, its rollout loop under ``rule`` and envs at :data:`GATHER_SEEDS`."""
    swarm = build_swarm()
    return swarm, RolloutLoop(lambda: make_env(task()), swarm, rule), envs_at(list(GATHER_SEEDS))


def gather(loop: RolloutLoop, envs: list) -> tuple[list, list, list]:
    """One step's gathering of ``loop`` on ``envs``: (situations, bids, proposals)."""
    episodes = [Episode(seed) for seed in GATHER_SEEDS]
    return loop._gather(envs, episodes, seeded(7), random.Random(0))


def test_trained_peer_scores_are_the_expected_usefulness_level_of_the_score_prompt():
    rule = GraphOfAgents(GraphOfAgentsConfig(name="graph_of_agents", scoring="trained"))
    swarm, loop, envs = gathering(rule)
    situations, _, proposals = gather(loop, envs)
    for e, s in enumerate(situations):
        for scorer, role in enumerate(ROLES):
            policy = swarm.population.agents[scorer]
            for proposer in range(3):
                if proposer == scorer:
                    continue
                prompt = swarm.prompts.score(
                    role, envs[e].observation(role), proposals[e][proposer].text
                )
                row = [teacher_forced(policy, prompt, format_bid(v), swarm.prompts) for v in LEVELS]
                expected = Expected().read(row, LEVELS, 1.0)
                assert s.peer_scores[scorer][proposer] == pytest.approx(expected, abs=1e-4)
    assert swarm.usage.bids_made == 0


def test_the_proposal_auctions_bids_are_each_agents_expected_level_on_its_own_proposal():
    swarm, loop, envs = gathering(ProposalAuction())
    situations, _, proposals = gather(loop, envs)
    for e, s in enumerate(situations):
        for agent, role in enumerate(ROLES):
            policy = swarm.population.agents[agent]
            prompt = swarm.prompts.score(
                role, envs[e].observation(role), proposals[e][agent].text, own=True
            )
            assert " mine: " in prompt
            row = [teacher_forced(policy, prompt, format_bid(v), swarm.prompts) for v in LEVELS]
            expected = Expected().read(row, LEVELS, 1.0)
            assert s.proposal_scores[agent] == pytest.approx(expected, abs=1e-4)
            others = [s.peer_scores[agent][p] for p in range(3) if p != agent]
            assert others == [0.0, 0.0], "nobody scores another's proposal"
    assert swarm.usage.bids_made == 0


def test_relabelling_labels_each_own_bid_at_its_roles_expert_bid_in_the_swarms_state():
    swarm, loop, envs = gathering(ProposalAuction())
    with loop.decisions.labelling() as labels:
        gather(loop, envs)
    levels = [expert_levels(env, LEVELS) for env in envs]
    assert all(len(expert_owners(env_levels)) == 1 for env_levels in levels)
    wanted = [  # one batch per agent, its envs in order
        (agent, format_bid(env_levels[role]))
        for agent, role in enumerate(ROLES)
        for env_levels in levels
    ]
    assert len(labels) == len(wanted)
    for label, (agent, reply) in zip(labels, wanted, strict=True):
        policy = swarm.population.agents[agent]
        assert label.policy is policy
        assert label.reply_ids == policy.encode_reply(swarm.prompts.reply_text(reply))
    assert len({reply for _, reply in wanted}) > 1  # the labels tell the agents apart


def test_decision_rounds_rehearse_the_actions_of_agents_that_learn_the_decision():
    in_agents = [
        ProposalAuction(),
        GraphOfAgents(GraphOfAgentsConfig(name="graph_of_agents", scoring="trained")),
        trained_agentnet(),
    ]
    for rule in in_agents:
        assert "action" in decision_round_kinds(rule), rule.name
        assert set(rule.decisions_learned) - {PICK} <= set(decision_round_kinds(rule))
    assert "action" not in decision_round_kinds(Router())  # the decider never acts


def test_whole_episodes_under_each_trained_rule_read_only_what_they_declare():
    rules = {
        "router": Router(),
        "agentnet": trained_agentnet(),
        "goa": GraphOfAgents(GraphOfAgentsConfig(name="graph_of_agents", scoring="trained")),
        "proposal_auction": ProposalAuction(),
    }
    for name, rule in rules.items():
        swarm = build_swarm(decider=name == "router")
        loop = RolloutLoop(lambda: make_env(task()), swarm, rule)
        episodes = loop.run([0, 1], random.Random(0), seeded(0))
        assert swarm.usage.bids_made == 0, name
        for episode in episodes:
            assert len(episode.steps) == 6
            for step in episode.steps:
                assert step.actor is not None and not step.bids and not step.contested
                assert bool(step.proposal_scores) == (name in ("goa", "proposal_auction"))


def test_the_router_needs_a_decider_and_says_how_to_get_one():
    swarm = build_swarm()
    loop = RolloutLoop(lambda: make_env(task()), swarm, Router())
    with pytest.raises(ValueError, match="coordination=router"):
        loop.run([0], random.Random(0), seeded(0))


# -- the demonstrations ------------------------------------------------------------------------
def test_decision_demonstrations_label_every_expert_state_with_its_owner():
    env = make_env(task(max_decisions=30))
    learned = frozenset({ROUTE, PICK, SCORE})
    demos = decision_demonstrations(env, [0, 1], LEVELS, learned)
    states = []
    for world in (0, 1):
        play_expert_episode(
            env, world, LEVELS, on_state=lambda e, levels: states.append(expert_owners(levels))
        )
    owned = [owners for owners in states if len(owners) == 1]
    routes = [d for d in demos if d.kind == ROUTE and d.role != DECIDER_NAME]
    picks = [d for d in demos if d.kind == ROUTE and d.role == DECIDER_NAME]
    assert len(routes) == 3 * len(owned) and len(picks) == len(owned)
    assert [d.reply for d in picks] == [next(iter(o)) for o in owned]
    assert [d.reply for d in routes] == [next(iter(o)) for o in owned for _ in ROLES]
    scores = [d for d in demos if d.kind == SCORE]
    assert {d.reply for d in scores} == {"0.8", "0.0"} and all(d.proposal for d in scores)
    assert all(d.role != d.proposal.split()[0] for d in scores)
    # The logger chops only while logs are needed: later its "chop a tree" is a useless reply.
    chop = [d.reply for d in scores if d.proposal == "chop a tree"]
    assert "0.8" in chop and "0.0" in chop


def test_own_scores_label_each_roles_own_reply_at_its_experts_bid():
    # Shared crafting: every role's expert replies the plan's step, its bid says whose works.
    env = make_env(
        CraftingConfig(name="crafting", target="wooden_pickaxe", max_decisions=30, actions="shared")
    )
    demos, states = [], []

    def collect(state, levels):
        states.append(levels)
        demos.append(state_demonstrations(state, levels, LEVELS, frozenset({OWN_SCORE}), {}))

    for world in (0, 1, 2):
        play_expert_episode(env, world, LEVELS, on_state=collect)
    owned = [(levels, found) for levels, found in zip(states, demos, strict=True) if found]
    assert owned and all(len(expert_owners(levels)) == 1 for levels, _ in owned)
    for levels, found in owned:
        assert {d.kind for d in found} == {OWN_SCORE}
        assert {d.role: d.reply for d in found} == {r: format_bid(levels[r]) for r in ROLES}
        assert len({d.proposal for d in found}) == 1, "one plan step, whoever proposes it"
    labels = {d.reply for _, found in owned for d in found}
    assert {"0.8", "0.6", "0.0"} <= labels  # skilled, novice, unable


def test_a_rule_that_learns_a_decision_adds_its_demonstrations_to_the_auctions():
    env = make_env(task(max_decisions=30))
    played = play_expert_episode(env, 0, LEVELS).demonstrations
    assert with_learned_decisions(played, env, [0], LEVELS, Auction()) == played
    assert with_learned_decisions(played, env, [0], LEVELS, GraphOfAgents()) == played
    with_picks = with_learned_decisions(played, env, [0], LEVELS, Router())
    assert with_picks[: len(played)] == played
    assert {d.kind for d in with_picks[len(played) :]} == {ROUTE}


# -- SFT, its budget, and the labels in the swarm's own states ---------------------------------
def sft_config(**fields) -> SFTConfig:
    return SFTConfig(epochs=3, lr=3e-3, batch_size=8, demo_episodes=2, **fields)


def sft_swarm(rule, seed: int = 0):
    """A fresh tiny swarm (with a decider if ``rule`` needs one) and its SFT demonstrations."""
    env = make_env(task(max_decisions=30))
    demos = with_learned_decisions(
        [d for w in (0, 1) for d in play_expert_episode(env, w, LEVELS).demonstrations],
        env,
        [0, 1],
        LEVELS,
        rule,
    )
    texts = PromptTemplate.for_env(env, "compact", None, LEVELS)
    plain = [d for d in demos if d.kind in ("bid", "action")]
    corpus = [env.task_description, *texts.demonstration_texts(plain)]
    torch.manual_seed(seed)
    population = Population.build(tiny_model_config(), ROLES, 1, corpus, rule.needs_decider)
    prompts = PromptTemplate.for_env(env, "compact", population.agents[0].tokenizer, LEVELS)
    return population, prompts, demos


def weights(policy) -> list[torch.Tensor]:
    return [p.detach().clone() for p in policy.parameters()]


def changed(before: list[torch.Tensor], policy) -> bool:
    return any(not torch.equal(a, b) for a, b in zip(before, policy.parameters(), strict=True))


def test_the_routers_agents_learn_exactly_the_auctions_sft_and_the_decider_its_picks():
    auction, prompts, demos = sft_swarm(Auction())
    routed, routed_prompts, routed_demos = sft_swarm(Router())
    start = weights(routed.decider)
    run_sft(auction, demos, prompts, sft_config())
    result = run_sft(routed, routed_demos, routed_prompts, sft_config())
    for mine, theirs in zip(routed.agents, auction.agents, strict=True):
        for a, b in zip(mine.parameters(), theirs.parameters(), strict=True):
            assert torch.equal(a, b), "the router's agents are the auction's, bit for bit"
    assert changed(start, routed.decider)
    decision_tokens = result[f"{names.SFT_DECISION_TOKENS}/{DECIDER_FOLDER}"]
    assert decision_tokens == result[names.SFT_DECISION_TOKENS] > 0
    assert result[f"{names.SFT_FLOPS}/{DECIDER_FOLDER}"] > 0
    assert result[f"{names.SFT_BID_TOKENS}/{DECIDER_FOLDER}"] == 0
    assert names.SFT_DECISION_TOKENS not in run_sft(auction, demos, prompts, sft_config())


def test_decision_demonstrations_only_train_the_decision_and_keep_its_bid_passes():
    rule = trained_agentnet()
    population, prompts, demos = sft_swarm(rule)
    plans = plan_sft(population, demos, prompts, sft_config(), 0)
    kinds = {kind for plan in plans for kind in (e.kind for e in plan.examples)}
    assert kinds == {"action", "bid", "route"}
    only = sft_config(demonstrations=SFTDemonstrations.decisions)
    plans = plan_sft(population, demos, prompts, only, 0)
    assert {e.kind for plan in plans for e in plan.examples} == {"route"}
    routes = sum(d.kind == "route" for d in demos)
    assert sum(len(plan.stream) for plan in plans) == 3 * routes  # sft.epochs passes


def test_sft_teaches_the_decider_the_experts_owner():
    population, prompts, demos = sft_swarm(Router())
    config = SFTConfig(epochs=30, lr=3e-3, batch_size=8, demo_episodes=2)
    run_sft(population, demos, prompts, config)
    swarm = Swarm(population, prompts, 3, 6, 1.0, hf_engine())
    loop = RolloutLoop(lambda: make_env(task(max_decisions=30)), swarm, Router())
    picks = [d for d in demos if d.kind == ROUTE]
    envs, owners = [], []

    def keep(env, levels):
        if len(expert_owners(levels)) == 1:
            clone = make_env(task(max_decisions=30))
            clone.restore(env.snapshot())
            envs.append(clone)
            owners.append(next(iter(expert_owners(levels))))

    play_expert_episode(make_env(task(max_decisions=30)), 0, LEVELS, on_state=keep)
    routes = loop.decisions.routes(envs, [[DECIDER]] * len(envs), [[0, 1, 2]] * len(envs))
    named = [ROLES[max(r[DECIDER], key=r[DECIDER].get)] for r in routes]
    assert len(picks) > len(envs)  # two worlds' picks, read back on the first world's states
    assert sum(a == b for a, b in zip(named, owners, strict=True)) >= 0.9 * len(owners)


def test_relabel_rounds_train_the_decider_on_the_experts_owner_where_the_swarm_goes():
    population, prompts, _ = sft_swarm(Router())
    swarm = Swarm(population, prompts, 3, 6, 1.0, hf_engine())
    loop = RolloutLoop(lambda: make_env(task()), swarm, Router())
    before = weights(population.decider)
    agents = [weights(agent) for agent in population.agents]
    metrics = relabel_decisions(loop, [0, 1, 2], 1, RoundTraining(3e-3, 4), 0)
    assert metrics[f"{RELABEL_DECISIONS}/0/labels"] == 3 * 6  # every decision of 3 episodes
    assert 0.0 <= metrics[f"{RELABEL_DECISIONS}/0/agreement"] <= 1.0
    assert metrics[f"{RELABEL_DECISIONS}/flops"] > 0
    assert changed(before, population.decider)
    for kept, agent in zip(agents, population.agents, strict=True):
        assert all(torch.equal(a, b) for a, b in zip(kept, agent.parameters(), strict=True))
    # the labels are the expert's owner of each state the swarm reached
    with loop.decisions.labelling() as labels:
        episodes = loop.run([3], random.Random(0), seeded(0))
    owners = [next(iter(s.expert_owners)) for s in episodes[0].steps if len(s.expert_owners) == 1]
    tokenizer = population.decider.tokenizer
    replies = [tokenizer.decode(label.reply_ids, skip_special_tokens=True) for label in labels]
    assert [r.strip() for r in replies] == owners


def test_each_decision_demonstration_labels_the_model_that_learns_it():
    from bidswarm.run.relabel import demonstration_labels

    population, prompts, demos = sft_swarm(Router())
    labels = demonstration_labels(population, demos, prompts)
    picks = [d for d in demos if d.kind == ROUTE]
    assert len(labels) == len(picks) > 0, "the bid and action demonstrations are no labels"
    assert all(label.policy is population.decider for label in labels)
    tokenizer = population.decider.tokenizer
    replies = [tokenizer.decode(label.reply_ids, skip_special_tokens=True) for label in labels]
    assert [r.strip() for r in replies] == [d.reply for d in picks]
    population, prompts, demos = sft_swarm(trained_agentnet())
    by_role = {}
    for label in demonstration_labels(population, demos, prompts):
        by_role.setdefault(label.policy.role, 0)
        by_role[label.policy.role] += 1
    routes = [d for d in demos if d.kind == ROUTE]
    assert by_role == {role: sum(d.role == role for d in routes) for role in ROLES}


def test_a_population_saves_and_loads_its_decider(tmp_path):
    population, _, _ = sft_swarm(Router())
    population.save_pretrained(tmp_path / "pop")
    loaded = Population.from_pretrained(tmp_path / "pop")
    assert loaded.decider is not None and loaded.decider.role == DECIDER_NAME
    assert len(loaded.agents) == 3 and loaded.roles == ROLES
    for a, b in zip(population.decider.parameters(), loaded.decider.parameters(), strict=True):
        assert torch.equal(a, b)
    plain, _, _ = sft_swarm(Auction())
    plain.save_pretrained(tmp_path / "plain")
    assert Population.from_pretrained(tmp_path / "plain").decider is None


# -- the report's decision table ---------------------------------------------------------------
def test_the_decision_table_puts_each_runs_choice_after_sft_beside_its_cost():
    from bidswarm.report.market import decision_table
    from bidswarm.report.reading import RunResult, budget_of, market_of

    metrics = {
        f"eval_before/{names.EXPERT_OWNER_AGREEMENT}": 0.75,
        f"eval_before/{names.EXPERT_OWNER_AGREEMENT}/on_path": 1.0,
        f"eval_before/{names.EXPERT_OWNER_AGREEMENT}/off_path": 0.5,
        f"eval_before/{names.EXPERT_OWNER_RECALL}/logger": 0.25,
        f"eval_before/{names.EXPERT_OWNER_RECALL}/smith": 0.875,
        "eval_before/flops": 6.0e9,
        "eval_before/episodes": 10.0,
        "eval_before/task/decisions": 30.0,
        names.SFT_ACTION_TOKENS: 100.0,
        names.SFT_BID_TOKENS: 300.0,
        names.SFT_DECISION_TOKENS: 100.0,
        names.SFT_FLOPS: 1.1e9,
        "sft/decision_relabel/flops": 1.0e8,
    }
    market = market_of(metrics, "eval_before/")
    assert market["flops_per_decision"] == pytest.approx(6.0e9 / 300)
    run = RunResult("r", "coordination=router", None, None, None, training_seed=3)
    run.market, run.budget = {"before": market}, budget_of(metrics)
    row = decision_table({"coordination=router": [run]}).splitlines()[-1]
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    # SFT without the rounds is 1e9 over 500 tokens: the bids' 300, the decision's 100 + rounds.
    assert cells == [
        "coordination=router",
        "3",
        "75%",
        "100% / 50%",
        "0.25 0.88",
        "2e+07",
        "6e+08",
        "3e+08",
        "1.1e+09",
    ]


def test_a_lora_population_gets_its_decider_as_one_more_adapter(tmp_path):
    pytest.importorskip("peft")
    from test_agents import corpus
    from test_agents import tiny_config as agent_config

    torch.manual_seed(0)
    config = agent_config(adapter="lora")
    population = Population.build(config, ROLES, 1, corpus(), decider=True)
    decider = population.decider
    assert decider.adapter == DECIDER_NAME and decider.model is population.agents[0].model
    trained = {id(p) for p in decider.trainable_parameters()}
    assert trained and all(
        not trained & {id(p) for p in agent.trainable_parameters()} for agent in population
    )
    with torch.no_grad():  # a trained adapter, to see that it is the one saved and loaded
        for parameter in decider.trainable_parameters():
            parameter.add_(0.01)
    prompt, reply = [[5, 6, 7, 8]], [[9, 10]]
    with torch.no_grad():
        decider.use_own_adapter()
        expected = decider.reply_token_logprobs(prompt, reply)[0]
    population.save_pretrained(tmp_path / "pop")
    loaded = Population.from_pretrained(tmp_path / "pop").decider
    with torch.no_grad():
        loaded.use_own_adapter()
        assert torch.allclose(loaded.reply_token_logprobs(prompt, reply)[0], expected)
