"""A rule's capabilities per decision (``Decision.bids_read``, ``Decision.forkable``): a rule
that runs the auction at some steps and picks at random at others; the collector records each
step's own value, and the forks, credit and metrics read it, not the rule's class."""

from __future__ import annotations

import random

import pytest

from bidswarm.algorithms.auction import run_auction
from bidswarm.algorithms.credit import bucket_brigade_credit, make_credit
from bidswarm.algorithms.credit.base import CreditConfig
from bidswarm.config import RLConfig
from bidswarm.coordination.auction import Auction
from bidswarm.coordination.base import CoordinationRule, Decision, Situation
from bidswarm.coordination.fixed import RoundRobin
from bidswarm.rollout.batches import credited_batches
from bidswarm.rollout.forks import ForkExample, fork_pairs
from bidswarm.rollout.keyed import seeded_randomness
from bidswarm.rollout.loop import RolloutLoop
from bidswarm.rollout.metrics import episode_metrics
from conftest import tiny_crafting_swarm

LEVELS = [0.0, 0.2, 0.4, 0.6, 0.8]


class AuctionOnEvenSteps(CoordinationRule):
    """The auction at even decisions (capabilities unsaid: the class's); at odd ones a random
    present agent acts, and the decision says its bids were not read and it is no fork point,
    though it carries a winning and a runner-up bid (a reader of the class, or of those
    numbers, would count them)."""

    asks_bids = True
    makes_contested_steps = True
    records_winning_bids = True
    name = "auction_on_even_steps"

    def bidders(self, situation: Situation) -> list[int]:
        return situation.present

    def decide(self, situations: list[Situation], rng: random.Random) -> list[Decision]:
        decisions = []
        for s in situations:
            bids = [s.bids.get(a, 0.0) for a in range(s.n_agents)]
            outcome = run_auction(bids, rng)
            if s.decision % 2 == 0:
                decisions.append(
                    Decision(
                        outcome.winner,
                        outcome.winning_bid,
                        outcome.runner_up,
                        outcome.runner_up_bid,
                    )
                )
            else:
                actor = rng.choice(s.present)
                others = [a for a in s.present if a != actor]
                decisions.append(
                    Decision(
                        actor,
                        winning_bid=0.8,
                        runner_up=others[0],
                        runner_up_bid=0.6,
                        bids_read=False,
                        forkable=False,
                    )
                )
        return decisions


def test_unsaid_capabilities_are_the_rules_declarations():
    bids = {0: 0.8, 1: 0.4, 2: 0.0}
    rule = AuctionOnEvenSteps()
    decided = rule.decide(
        [Situation(3, 0, bids=bids), Situation(3, 1, bids=bids)], random.Random(0)
    )
    assert [(d.bids_read, d.forkable) for d in decided] == [(None, None), (False, False)]
    even, odd = rule.settle(decided)
    assert (even.bids_read, even.forkable, even.contested) == (True, True, True)
    assert (odd.bids_read, odd.forkable, odd.contested) == (False, False, False)
    assert odd.runner_up_bid == 0.6 and odd.credited_bid == 0.0 and even.credited_bid == 0.8
    assert odd.credited_runner_up_bid == 0.0 and even.credited_runner_up_bid == even.runner_up_bid
    # The existing rules say nothing per decision: their class holds at every step.
    (auction,) = Auction().settle(Auction().decide([Situation(3, 0, bids=bids)], random.Random(0)))
    assert (auction.bids_read, auction.forkable) == (True, True)
    (rotation,) = RoundRobin().settle(RoundRobin().decide([Situation(3, 0)], random.Random(0)))
    assert (rotation.bids_read, rotation.forkable) == (False, False)


def test_a_decision_cannot_make_a_fork_point_of_a_rule_without_bid_updates():
    with pytest.raises(ValueError, match=r"coordination=round_robin: .*forkable=True"):
        RoundRobin().settle([Decision(0, runner_up=1, runner_up_bid=0.4, forkable=True)])


@pytest.fixture(scope="module")
def played():
    """The mixed rule's episodes in the real loop (tiny agents), with snapshots for forks."""
    _, _, auction_loop = tiny_crafting_swarm(max_decisions=8)
    loop = RolloutLoop(auction_loop.make_env, auction_loop.swarm, AuctionOnEvenSteps())
    rng, generator = seeded_randomness("capabilities", "cpu")
    episodes = loop.run(list(range(6)), rng, generator, keep_snapshots=True)
    return loop, episodes


def test_the_collector_records_each_steps_own_capabilities(played):
    _, episodes = played
    steps = [s for e in episodes for s in e.steps]
    assert len(steps) == 6 * 8
    for step in steps:
        auction_step = step.index % 2 == 0
        assert (step.decision.bids_read, step.decision.forkable) == (auction_step, auction_step)
        assert len(step.bids) == 3  # the bids were sampled at every step
        # a snapshot only where a fork may start: contested auction steps
        assert (step.snapshot is not None) == (auction_step and step.decision.runner_up_bid > 0)
    assert any(s.contested for s in steps), "some auction step was contested"


def test_forks_start_only_at_forkable_steps(played):
    loop, episodes = played
    rng, generator = seeded_randomness("capabilities/forks", "cpu")
    examples: list[ForkExample] = []
    # A draw among the levels below plays every chosen fork (the untrained agents rarely reply
    # a parsed bid, which the default redraw needs).
    rl = RLConfig(fork_budget=100, bid_resample="below_runner_up")
    _, stats = fork_pairs(loop, episodes, rl, rng, generator, examples)
    forkable = sum(s.contested for e in episodes for s in e.steps)
    assert stats.contested == stats.chosen == forkable > 0
    assert examples and all(example.step.index % 2 == 0 for example in examples)


def test_credit_reads_the_winning_bid_only_where_the_bids_decided(played):
    _, episodes = played
    credit = make_credit(CreditConfig("bucket_brigade"))
    batches, _ = credited_batches(episodes, credit, random.Random(0), LEVELS)
    got = sorted(c for batch in batches for c in batch.credit)
    expected = []
    for episode in episodes:
        acting = episode.acting_steps
        bids = [s.decision.winning_bid if s.index % 2 == 0 else 0.0 for s in acting]
        expected += bucket_brigade_credit([s.reward for s in acting], bids)[0]
    assert got == pytest.approx(sorted(expected))


def test_metrics_count_contested_and_winning_bids_per_step(played):
    loop, episodes = played
    metrics = episode_metrics(episodes, loop.swarm.roles, LEVELS)
    acting = [s for e in episodes for s in e.steps if s.actor is not None]
    contested = [s for s in acting if s.index % 2 == 0 and s.decision.runner_up_bid > 0]
    assert metrics["contested_fraction"] == pytest.approx(len(contested) / len(acting))
    read = [s for s in acting if s.index % 2 == 0]
    for role in {loop.swarm.roles[s.actor] for s in read}:
        mine = [s.decision.winning_bid for s in read if loop.swarm.roles[s.actor] == role]
        assert metrics[f"bids/winning/{role}/mean"] == pytest.approx(sum(mine) / len(mine))
