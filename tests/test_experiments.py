"""The machinery of docs/method.md section 8's remaining experiments: pass@k, replicas of a trained
swarm, dropout at evaluation, adaptation from a trained run's checkpoint (``init_from=``)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file, save_file

from bidswarm.coordination.agentnet import AgentNet
from bidswarm.coordination.auction import Auction
from bidswarm.coordination.fixed import Monolithic, RoundRobin
from bidswarm.coordination.graph_of_agents import GraphOfAgents
from bidswarm.envs import make_env
from bidswarm.rollout.loop import RolloutLoop
from bidswarm.statistics import pass_at_k, pass_at_k_over_worlds, summarize_share
from test_coordination import build_swarm, seeded, situation, task
from test_train import read_state, run_cli

# -- pass@k ---------------------------------------------------------------------------------


def test_pass_at_k_matches_hand_computed_cases():
    assert pass_at_k(3, 0, 1) == 0.0
    assert pass_at_k(3, 3, 1) == 1.0
    assert pass_at_k(3, 1, 1) == pytest.approx(1 / 3)
    assert pass_at_k(3, 1, 2) == pytest.approx(2 / 3)  # 1 - C(2,2)/C(3,2) = 1 - 1/3
    assert pass_at_k(3, 1, 3) == 1.0
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(10, 3, 4) == pytest.approx(1 - 35 / 210)  # 1 - C(7,4)/C(10,4)
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_pass_at_k_over_worlds_averages_worlds_not_attempts():
    # world 1: 1 of 2 succeed; world 2: 0 of 4 (more attempts must not weigh more)
    successes = [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    worlds = [1, 1, 2, 2, 2, 2]
    summary, per_world = pass_at_k_over_worlds(successes, worlds, 1)
    assert per_world == {1: 0.5, 2: 0.0}
    assert summary.mean == pytest.approx(0.25) and summary.n == 2
    summary2, per_world2 = pass_at_k_over_worlds(successes, worlds, 2)
    assert per_world2 == {1: 1.0, 2: 0.0} and summary2.mean == pytest.approx(0.5)


def test_pass_at_k_interval_is_wilson_and_stays_within_0_and_1():
    z = 1.959963984540054
    # every world succeeds: the Wilson lower bound n / (n + z^2), the upper bound 1 (a t
    # interval would collapse to the point 1)
    summary, _ = pass_at_k_over_worlds([1.0] * 12, list(range(12)), 1)
    assert (summary.mean, summary.ci_high) == (1.0, 1.0)
    assert summary.ci_low == pytest.approx(12 / (12 + z * z))
    # 3 of 4 worlds: centre (p + z^2/2n) / (1 + z^2/n), half-width z sqrt(p(1-p)/n + z^2/4n^2)
    # / (1 + z^2/n), by hand for p = 0.75, n = 4
    summary, _ = pass_at_k_over_worlds([1.0, 1.0, 1.0, 0.0], [0, 1, 2, 3], 1)
    centre = (0.75 + z * z / 8) / (1 + z * z / 4)
    half = z * (0.75 * 0.25 / 4 + z * z / 64) ** 0.5 / (1 + z * z / 4)
    assert summary.ci_low == pytest.approx(centre - half)
    assert summary.ci_high == pytest.approx(centre + half)
    assert 0.0 <= summary.ci_low < summary.mean < summary.ci_high <= 1.0
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        summarize_share([0.5, 1.5])


# -- dropout: rules route around absent agents ----------------------------------------------


def test_absent_agents_neither_win_the_auction_nor_are_asked_to_bid():
    s = situation(bids={0: 0.2, 2: 0.4}, absent=frozenset({1}))
    assert Auction().bidders(s) == [0, 2]
    decision = Auction().decide([s], random.Random(0))[0]
    assert decision.actor == 2 and decision.runner_up == 0
    everyone_gone = situation(absent=frozenset({0, 1, 2}))
    assert Auction().bidders(everyone_gone) == []
    assert Auction().decide([everyone_gone], random.Random(0))[0].actor is None


def test_round_robin_skips_absent_agents_and_monolithic_wastes_the_step():
    assert RoundRobin().decide([situation(decision=4, absent=frozenset({1}))], None)[0].actor == 2
    assert RoundRobin().decide([situation(decision=2, absent=frozenset({2}))], None)[0].actor == 0
    gone = situation(decision=0, absent=frozenset({0, 1, 2}))
    assert RoundRobin().decide([gone], None)[0].actor is None
    assert Monolithic().decide([situation(n=1, absent=frozenset({0}))], None)[0].actor is None
    assert Monolithic().decide([situation(n=1)], None)[0].actor == 0


def test_graph_of_agents_and_agentnet_pick_only_present_agents():
    # agent 1's proposal would be best, but it is absent
    scores = ((0.0, -0.1, -5.0), (-5.0, 0.0, -5.0), (-5.0, -0.1, 0.0))
    s = situation(peer_scores=scores, absent=frozenset({1}))
    assert GraphOfAgents().decide([s], random.Random(0))[0].actor in (0, 2)
    rule = AgentNet()
    held = situation(decision=3, previous_actor=1, absent=frozenset({1, 2}))
    assert rule.bidders(held) == []  # an absent holder does not route
    assert rule.decide([held], random.Random(0))[0].actor == 0
    assert rule.decide([situation(absent=frozenset({0, 1, 2}))], random.Random(0))[0].actor is None


# -- dropout in the loop ---------------------------------------------------------------------


def play(dropout: float | None, rule=None):
    swarm = build_swarm(seed=1)
    rule = rule or Auction()
    if dropout is None:
        loop = RolloutLoop(lambda: make_env(task()), swarm, rule)
    else:
        loop = RolloutLoop(lambda: make_env(task()), swarm, rule, dropout=dropout)
    return loop.run([0, 1, 2], random.Random(3), seeded(3)), swarm


def trace(episodes):
    return [
        [(s.actor, s.action.text if s.action else None, s.reward) for s in e.steps]
        for e in episodes
    ]


def test_dropout_zero_equals_no_dropout():
    plain, _ = play(None)
    zero, _ = play(0.0)
    assert trace(plain) == trace(zero)


@pytest.mark.parametrize("rule", [Auction(), RoundRobin(), GraphOfAgents()])
def test_dropout_one_skips_every_step_and_asks_nobody(rule):
    episodes, swarm = play(1.0, rule)
    assert all(len(e.steps) == 6 for e in episodes)
    assert all(step.actor is None for e in episodes for step in e.steps)
    assert swarm.usage.bids_made == 0 and swarm.usage.actions_made == 0
    assert swarm.usage.rollout_tokens == 0


def test_dropout_changes_who_acts_but_only_present_agents_act():
    episodes, _ = play(0.8, RoundRobin())  # the untrained auction's bids are mostly 0
    actors = [s.actor for e in episodes for s in e.steps]
    assert any(a is None for a in actors) and any(a is not None for a in actors)
    with pytest.raises(ValueError, match="dropout"):
        RolloutLoop(lambda: make_env(task()), build_swarm(), Auction(), dropout=1.5)


# -- replicas of a trained swarm -------------------------------------------------------------


def test_replicas_are_distinct_parameter_copies_in_role_order():
    population = build_swarm().population
    replicated = population.replicate(3)
    assert replicated.roles == [r for r in population.roles for _ in range(3)]
    for index, agent in enumerate(replicated.agents):
        source = population.agents[index // 3]
        for (name, p), (_, q) in zip(
            agent.named_parameters(), source.named_parameters(), strict=True
        ):
            assert torch.equal(p, q), name
            assert p.data_ptr() != q.data_ptr(), name
    first = next(replicated.agents[0].parameters())
    with torch.no_grad():
        first.add_(1.0)
    assert not torch.equal(first, next(replicated.agents[1].parameters()))
    assert population.replicate(1) is population


# -- adaptation: init_from ---------------------------------------------------------------------


@pytest.mark.slow
def test_adaptation_starts_from_the_source_checkpoint_not_sft(tmp_path):
    source = run_cli(tmp_path, "debug=smoke", name="source")
    # Mark the source's final weights, so that they differ from its SFT weights and from any
    # fresh initialisation whatever the smoke run's RL did.
    agents = ("agent0_logger", "agent1_miner", "agent2_smith")
    for agent in agents:
        path = source / "final" / agent / "model.safetensors"
        save_file({k: v + 0.25 for k, v in load_file(path).items()}, path)
    adapted = run_cli(
        tmp_path,
        "debug=smoke",
        "task=crafting_torch",
        "task.max_decisions=12",
        f"init_from={source}",
        "sft.enabled=false",
        "rl.cycles=1",
        name="adapted",
    )
    assert read_state(adapted)["sft_done"]
    for agent in agents:
        start = load_file(adapted / "sft" / agent / "model.safetensors")
        trained = load_file(source / "final" / agent / "model.safetensors")
        cold = load_file(source / "sft" / agent / "model.safetensors")
        assert all(torch.equal(start[k], trained[k]) for k in trained)
        assert any(not torch.equal(start[k], cold[k]) for k in cold)


def test_init_from_is_refused_before_any_model_loads(tmp_path):
    import subprocess
    import sys

    from conftest import ROOT

    command = [
        sys.executable,
        "-m",
        "bidswarm.train",
        f"hydra.run.dir={tmp_path / 'run'}",
        f"init_from={tmp_path / 'nothing'}",
        "sft.enabled=false",
        "logger=csv",
    ]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "init_from=" in result.stdout + result.stderr
    assert not (tmp_path / "run").exists()
    result = subprocess.run(
        [*command[:-2], "logger=csv"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert "sft.enabled=false" in result.stdout + result.stderr


# -- participation at fixed decisions --------------------------------------------------------


def test_participation_at_decisions_counts_who_acted_at_that_decision():
    from bidswarm.coordination.base import Decision
    from bidswarm.rollout.metrics import participation_at_decisions
    from bidswarm.rollout.records import Episode, StepRecord

    def episode(actors):
        e = Episode(seed=0)
        e.steps = [StepRecord(i, Decision(actor=a), {}, None) for i, a in enumerate(actors)]
        return e

    long = episode([0] * 9 + [1] + [2] * 19 + [None])  # 30 decisions
    short = episode([0] * 9 + [2] + [0] * 2)  # 12 decisions
    metrics = participation_at_decisions([long, short], ["logger", "miner", "smith"])
    assert metrics["participation_at/10/miner"] == 0.5
    assert metrics["participation_at/10/smith"] == 0.5
    assert metrics["participation_at/30/logger"] == 0.0  # only `long` got there, and skipped
    assert metrics["participation_at/last/logger"] == 0.5
    assert "participation_at/30/miner" in metrics


@pytest.mark.slow
def test_flop_budget_ends_rl_once_spent(tmp_path):
    run_dir = run_cli(tmp_path, "debug=smoke", "rl.cycles=3", "rl.flop_budget=1.0", "logger=csv")
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)
    assert len(checkpoint["bidswarm"]["history"]) == 1  # of 6 scheduled updates
    assert "eval_after" in read_state(run_dir)  # a spent budget finishes the run
    # resumed (as after a crash between the last checkpoint and the end), it makes no update
    run_cli(
        tmp_path / "again",
        "debug=smoke",
        "rl.cycles=3",
        "rl.flop_budget=1.0",
        "logger=csv",
        f"resume={run_dir}",
    )
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)
    assert len(checkpoint["bidswarm"]["history"]) == 1


# -- winning bids per role (what bucket-brigade credit sees) ---------------------------------


def test_winning_bids_per_role_are_shares_of_its_acting_steps_by_level():
    from bidswarm.coordination.base import Decision
    from bidswarm.rollout.metrics import episode_metrics, winning_bid_metrics
    from bidswarm.rollout.records import Episode, StepRecord

    def episode(decisions):
        e = Episode(seed=0)
        e.steps = [StepRecord(i, d) for i, d in enumerate(decisions)]
        return e

    levels = [0.0, 0.2, 0.4, 0.6, 0.8]
    # agent 3 is a second logger (replicas): its steps count for the role
    roles = ["logger", "miner", "smith", "logger"]
    episodes = [
        episode([Decision(0, 0.8), Decision(0, 0.8), Decision(None), Decision(1, 0.4)]),
        episode([Decision(3, 0.6), Decision(1, 0.4), Decision(1, 0.8)]),
    ]
    metrics = winning_bid_metrics(episodes, roles, levels)
    assert metrics["bids/winning/logger/0.8"] == pytest.approx(2 / 3)
    assert metrics["bids/winning/logger/0.6"] == pytest.approx(1 / 3)
    assert metrics["bids/winning/logger/0.2"] == 0.0
    assert metrics["bids/winning/logger/mean"] == pytest.approx((0.8 + 0.8 + 0.6) / 3)
    assert metrics["bids/winning/miner/0.4"] == pytest.approx(2 / 3)
    assert metrics["bids/winning/miner/mean"] == pytest.approx((0.4 + 0.4 + 0.8) / 3)
    assert "bids/winning/logger/0" not in metrics, "no zero bid won a step"
    assert not any(key.startswith("bids/winning/smith/") for key in metrics), "smith never acted"
    for role in ("logger", "miner"):
        shares = [metrics[f"bids/winning/{role}/{level:g}"] for level in levels[1:]]
        assert sum(shares) == pytest.approx(1.0)
    assert episode_metrics(episodes, roles, levels).items() >= metrics.items()
    # a level reader's expected bids lie between the levels: each counts at its nearest one
    expected = [episode([Decision(2, 0.71), Decision(2, 0.55), Decision(2, 0.13)])]
    read = winning_bid_metrics(expected, roles, levels)
    assert [read[f"bids/winning/smith/{level:g}"] for level in levels[1:]] == pytest.approx(
        [1 / 3, 0.0, 1 / 3, 1 / 3]
    )
    assert read["bids/winning/smith/mean"] == pytest.approx((0.71 + 0.55 + 0.13) / 3)
    # steps decided without the bids (``winning_bid`` 0) log none, rather than "all at 0"
    unread = [episode([replace(s.decision, bids_read=False) for s in e.steps]) for e in episodes]
    assert not any(key.startswith("bids/") for key in episode_metrics(unread, roles, levels))


def test_winning_bids_count_only_the_steps_the_bids_decided_and_a_zero_bid_that_won():
    """A rule that reads the bids at some steps only, and may let a zero bidder act there."""
    from bidswarm.coordination.base import Decision
    from bidswarm.rollout.metrics import winning_bid_metrics
    from bidswarm.rollout.records import Episode, StepRecord

    decisions = [
        Decision(0, 0.8, bids_read=True),
        Decision(0, 0.0, bids_read=True),  # read, and the zero bidder acted
        Decision(0, 0.6, bids_read=False),  # decided otherwise: not a bid
        Decision(0, 0.0, bids_read=False),
    ]
    episodes = [Episode(0, [StepRecord(i, d) for i, d in enumerate(decisions)])]
    metrics = winning_bid_metrics(episodes, ["logger"], [0.0, 0.4, 0.8])
    assert metrics == {
        "bids/winning/logger/0": 0.5,
        "bids/winning/logger/0.4": 0.0,
        "bids/winning/logger/0.8": 0.5,
        "bids/winning/logger/mean": 0.4,
    }


def test_the_bid_parse_rate_is_the_share_of_the_bids_read_that_parsed():
    from bidswarm.coordination.base import Decision
    from bidswarm.rollout.metrics import episode_metrics
    from bidswarm.rollout.records import Bid, Episode, Reply, StepRecord

    def bids(*parsed: bool) -> dict[int, Bid]:
        return {i: Bid(0.4 if ok else 0.0, Reply(i, [], [], ""), ok) for i, ok in enumerate(parsed)}

    episodes = [
        Episode(0, [StepRecord(0, Decision(0, 0.4), bids(True, False, True))]),
        Episode(1, [StepRecord(0, Decision(None), bids(False, False, True))]),
    ]
    metrics = episode_metrics(episodes, ["logger", "miner", "smith"], [0.0, 0.4])
    assert metrics["bids/parse_rate"] == pytest.approx(3 / 6)


@pytest.mark.parametrize("rule", [Auction(), AgentNet(), RoundRobin(), GraphOfAgents()])
def test_every_evaluation_logs_the_bid_parse_rate_of_rules_that_ask_for_bids(rule):
    from bidswarm.rollout.evaluation import evaluate

    loop = RolloutLoop(lambda: make_env(task()), build_swarm(seed=1), rule)
    evaluation = evaluate(loop, [0, 1], runs_per_seed=1, seed=0)
    read = [b.parsed for e in evaluation.episodes for s in e.steps for b in s.bids.values()]
    if rule.asks_bids:
        assert evaluation.metrics["bids/parse_rate"] == pytest.approx(sum(read) / len(read))
    else:
        assert not read and "bids/parse_rate" not in evaluation.metrics


@pytest.mark.parametrize(
    ("rule", "records"),
    [(Auction(), True), (RoundRobin(), False), (GraphOfAgents(), False), (AgentNet(), False)],
)
def test_only_the_auction_records_winning_bids_in_evaluation(rule, records):
    """The held-out evaluation (``eval_before``, ``eval_after``, ``bidswarm.evaluate``) logs
    winning bids through the collector's own ``episode_metrics``, for rules that record them."""
    from bidswarm.rollout.evaluation import evaluate

    swarm = build_swarm(seed=1)
    loop = RolloutLoop(lambda: make_env(task()), swarm, rule)
    evaluation = evaluate(loop, [0, 1], runs_per_seed=1, seed=0)
    steps = [s for e in evaluation.episodes for s in e.steps]
    assert {s.decision.bids_read for s in steps} == {records}  # the rule's declaration
    acted = {
        swarm.roles[s.actor] for e in evaluation.episodes for s in e.steps if s.actor is not None
    }
    logged = {key.split("/")[2] for key in evaluation.metrics if key.startswith("bids/winning/")}
    assert logged == (acted if records else set())
    assert Monolithic.records_winning_bids is False
