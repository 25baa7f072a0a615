"""A conformance test for markets: every bid rule and every credit rule on a contextual who-acts
bandit whose values are known.

The bandit: C contexts, N agents, and a known value v[agent, context] in [0, 1], the mean
reward of that agent acting in that context (each draw adds Gaussian noise, sd
:data:`REWARD_NOISE`). A round draws a context uniformly, every agent samples a bid from its
tabular policy (logits over the paper's five levels {0, 0.2, 0.4, 0.6, 0.8} per agent and
context, shape [N, C, L]), and the auction of Eq. 1 (``run_auction``) picks who acts. Forks are
free here: any agent can act from the same context, so every counterfactual is one more draw.

Values are in bid units as v * 0.8: the price scale is 1 / 0.8 (the largest value priced at the
top level, as ``credit.price_scale`` 175 = 140 / 0.8 prices crafting's 140), so a truthful bid
of value v is 0.8 v, and the levels' range [0, 0.8] holds every value.

- The calibrated bid loss [ours] (``algorithms/calibration.py``) claims truthful bids: every
  agent's bid distribution is trained toward the two-hot target of its measured reward in that
  context. Asserted: each expected bid within :data:`TRUTHFUL_TOLERANCE` of 0.8 v, and the
  auction over the expected bids picks the agent of highest value in >= 90% of contexts.
- The paper's Bradley-Terry rule (Eq. 3, ``bradley_terry_loss``): at a contested round the
  winner's bid is redrawn below the runner-up's (``draw_below``, weighted by the chance that
  three tries keep the fork), the runner-up acts in the counterfactual, and the branch that
  earned more labels the preferred bid; only the winner learns. It claims no truthfulness: its
  calibration error is printed, and asserted is what it does do, moving wins toward the agent
  of highest value.
- Every registered credit rule on chains of the bandit played as episodes of several rounds
  (skipped rounds dropped): a rule that claims to conserve the return (``conserves_return``)
  does, on every chain, and a rule that does not claim it fails it on some chain.

Run with ``-s`` to see what each rule reached.
"""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
import torch

from bidswarm.algorithms.auction import PAPER_BID_LEVELS, AuctionOutcome, run_auction
from bidswarm.algorithms.calibration import (
    calibrated_bid_loss,
    calibration_error,
    expected_bid,
    two_hot_targets,
)
from bidswarm.algorithms.credit import CREDIT_RULES, make_credit
from bidswarm.algorithms.losses import bradley_terry_loss, fork_preference
from bidswarm.algorithms.resampling import draw_below, rejection_keep_probability

LEVELS = PAPER_BID_LEVELS
TOP_LEVEL = LEVELS[-1]
PRICE_SCALE = 1.0 / TOP_LEVEL
"""Reward units per bid unit: the largest value (1) priced at the top level."""

VALUES = torch.tensor(
    [
        [0.90, 0.20, 0.50, 0.10, 0.65, 0.30],
        [0.40, 0.85, 0.30, 0.60, 0.15, 0.75],
        [0.10, 0.50, 0.95, 0.35, 0.40, 0.45],
    ],
    dtype=torch.float64,
)
"""v[agent, context]: each context has one best agent, 0.15 to 0.45 above the next."""
N_AGENTS, N_CONTEXTS = VALUES.shape
BEST = VALUES.argmax(dim=0)
REWARD_NOISE = 0.05
TRUTHFUL_TOLERANCE = 0.05
"""How far (bid units) a truthful rule's expected bid may be from 0.8 v after training."""

ROUNDS_PER_STEP = 64
STEPS = 300
LEARNING_RATE = 0.05


class Bandit:
    """The contextual who-acts bandit with its seeded streams (torch for draws, ``random`` for
    the auction's tie-breaks)."""

    def __init__(self, seed: int) -> None:
        self.generator = torch.Generator().manual_seed(seed)
        self.rng = random.Random(seed)

    def contexts(self, rounds: int) -> torch.Tensor:
        return torch.randint(N_CONTEXTS, (rounds,), generator=self.generator)

    def rewards(self, agents: torch.Tensor, contexts: torch.Tensor) -> torch.Tensor:
        """One noisy reward per (agent, context) pair, shape [R]."""
        noise = REWARD_NOISE * torch.randn(len(agents), generator=self.generator).double()
        return VALUES[agents, contexts] + noise

    def bid_indices(self, logits: torch.Tensor, contexts: torch.Tensor) -> torch.Tensor:
        """Every agent's sampled level index at each round's context, shape [N, R]."""
        probs = torch.softmax(logits.detach()[:, contexts], dim=-1)  # [N, R, L]
        flat = torch.multinomial(probs.reshape(-1, len(LEVELS)), 1, generator=self.generator)
        return flat.reshape(N_AGENTS, len(contexts))

    def auctions(self, bid_indices: torch.Tensor) -> list[AuctionOutcome]:
        return [
            run_auction([LEVELS[int(i)] for i in bid_indices[:, r]], self.rng)
            for r in range(bid_indices.shape[1])
        ]


def best_agent_wins(outcomes: list[AuctionOutcome], contexts: torch.Tensor) -> int:
    """How many auctions the agent of highest value in its context won (skipped: not won)."""
    return sum(o.winner == int(BEST[c]) for o, c in zip(outcomes, contexts.tolist(), strict=True))


def best_agent_win_rate(logits: torch.Tensor, bandit: Bandit, rounds: int = 3000) -> float:
    """The share of rounds (contexts uniform, bids sampled) that the agent of highest value wins."""
    contexts = bandit.contexts(rounds)
    return best_agent_wins(bandit.auctions(bandit.bid_indices(logits, contexts)), contexts) / rounds


def expected_bids(logits: torch.Tensor) -> torch.Tensor:
    """E[bid] per agent and context, shape [N, C]."""
    return expected_bid(logits.detach().reshape(-1, len(LEVELS)), LEVELS).reshape(
        N_AGENTS, N_CONTEXTS
    )


def mean_abs_bid_error(logits: torch.Tensor) -> float:
    truthful = (TOP_LEVEL * VALUES).flatten()
    return float(calibration_error(expected_bids(logits).flatten(), truthful))


def train_calibrated(bandit: Bandit) -> tuple[torch.Tensor, float]:
    """The calibrated rule: every agent's bid at the round's context toward the two-hot target
    of the reward it earns acting there (its fork). Returns the logits and the best agent's
    share of the auctions won during training."""
    logits = torch.zeros(N_AGENTS, N_CONTEXTS, len(LEVELS), requires_grad=True)
    optimizer = torch.optim.Adam([logits], lr=LEARNING_RATE)
    best_wins = 0
    for _ in range(STEPS):
        contexts = bandit.contexts(ROUNDS_PER_STEP)
        outcomes = bandit.auctions(bandit.bid_indices(logits, contexts))
        best_wins += best_agent_wins(outcomes, contexts)
        agents = torch.arange(N_AGENTS).repeat_interleave(ROUNDS_PER_STEP)
        at = contexts.repeat(N_AGENTS)
        values = TOP_LEVEL * bandit.rewards(agents, at)
        terms = calibrated_bid_loss(logits[agents, at], two_hot_targets(values, LEVELS).float())
        optimizer.zero_grad()
        terms["loss_calibration"].backward()
        optimizer.step()
    return logits.detach(), best_wins / (STEPS * ROUNDS_PER_STEP)


def bradley_terry_pairs(
    logits: torch.Tensor, bandit: Bandit
) -> tuple[list[tuple[int, int, int, int, float]], int]:
    """One step's preference pairs (agent, context, preferred level, other level, weight) of the
    paper's rule, and how many rounds were contested."""
    contexts = bandit.contexts(ROUNDS_PER_STEP)
    bid_indices = bandit.bid_indices(logits, contexts)
    pairs, contested = [], 0
    for r, outcome in enumerate(bandit.auctions(bid_indices)):
        if not outcome.contested:  # skipped or alone: never forked
            continue
        contested += 1
        winner, runner_up, context = outcome.winner, outcome.runner_up, int(contexts[r])
        below = [i for i, level in enumerate(LEVELS) if level < outcome.runner_up_bid]
        logprobs = torch.log_softmax(logits.detach()[winner, context], dim=-1)[below]
        drawn, mass = draw_below(logprobs, bandit.generator)
        weight = rejection_keep_probability(mass, 3)
        scores = bandit.rewards(torch.tensor([winner, runner_up]), torch.tensor([context] * 2))
        preference = fork_preference(float(scores[0]), float(scores[1]))
        original, redrawn = int(bid_indices[winner, r]), below[drawn]
        if preference == 1:
            pairs.append((winner, context, original, redrawn, weight))
        elif preference == -1:
            pairs.append((winner, context, redrawn, original, weight))
    return pairs, contested


def train_bradley_terry(bandit: Bandit) -> tuple[torch.Tensor, int, int]:
    """The paper's rule (Eq. 3) from uniform bids. Returns the logits, the pairs learned from
    and the contested rounds."""
    logits = torch.zeros(N_AGENTS, N_CONTEXTS, len(LEVELS), requires_grad=True)
    optimizer = torch.optim.Adam([logits], lr=LEARNING_RATE)
    pair_count = contested_count = 0
    for _ in range(STEPS):
        pairs, contested = bradley_terry_pairs(logits, bandit)
        contested_count += contested
        if not pairs:
            continue
        pair_count += len(pairs)
        columns = zip(*pairs, strict=True)
        agent, context, preferred, other, weight = (torch.tensor(column) for column in columns)
        log_levels = torch.log_softmax(logits[agent, context], dim=-1)
        terms = bradley_terry_loss(
            log_levels.gather(1, preferred[:, None]).squeeze(1),
            log_levels.gather(1, other[:, None]).squeeze(1),
            weights=weight.float(),
        )
        optimizer.zero_grad()
        terms["loss_bid"].backward()
        optimizer.step()
    return logits.detach(), pair_count, contested_count


def test_the_calibrated_rule_recovers_truthful_bids_and_picks_the_best_agent() -> None:
    bandit = Bandit(seed=0)
    start = torch.zeros(N_AGENTS, N_CONTEXTS, len(LEVELS))
    before_error, before_wins = mean_abs_bid_error(start), best_agent_win_rate(start, bandit)
    logits, wins_in_training = train_calibrated(bandit)
    bids = expected_bids(logits)
    errors = (bids - TOP_LEVEL * VALUES.float()).abs()
    picks = [run_auction(bids[:, c].tolist(), bandit.rng).winner for c in range(N_CONTEXTS)]
    picked_best = sum(p == int(b) for p, b in zip(picks, BEST.tolist(), strict=True))
    after_wins = best_agent_win_rate(logits, bandit)
    print(
        f"\ncalibrated: mean |E[bid] - 0.8 v| {before_error:.3f} -> {float(errors.mean()):.3f} "
        f"(max {float(errors.max()):.3f}); auction over E[bid] picks the best agent in "
        f"{picked_best}/{N_CONTEXTS} contexts; best agent's share of sampled auctions "
        f"{before_wins:.2f} -> {after_wins:.2f} ({wins_in_training:.2f} during training)"
    )
    assert float(errors.max()) <= TRUTHFUL_TOLERANCE, errors
    assert picked_best >= math.ceil(0.9 * N_CONTEXTS)
    assert after_wins > before_wins


def test_the_papers_bradley_terry_rule_as_it_is() -> None:
    """Eq. 3 claims no truthfulness; asserted only that training moves the auctions toward the
    agent of highest value (above chance, and above the uniform start)."""
    bandit = Bandit(seed=1)
    start = torch.zeros(N_AGENTS, N_CONTEXTS, len(LEVELS))
    before_wins = best_agent_win_rate(start, bandit)
    logits, pairs, contested = train_bradley_terry(bandit)
    after_wins = best_agent_win_rate(logits, bandit)
    bids = expected_bids(logits)
    best_bids = bids[BEST, torch.arange(N_CONTEXTS)]
    print(
        f"\nBradley-Terry: mean |E[bid] - 0.8 v| {mean_abs_bid_error(start):.3f} -> "
        f"{mean_abs_bid_error(logits):.3f}; best agent's share of sampled auctions "
        f"{before_wins:.2f} -> {after_wins:.2f}; {pairs} pairs from {contested} contested of "
        f"{STEPS * ROUNDS_PER_STEP} rounds; best agent's E[bid] {best_bids.mean():.2f}, "
        f"the others' {(bids.sum() - best_bids.sum()) / (bids.numel() - N_CONTEXTS):.2f}"
    )
    assert after_wins > max(before_wins, 1.0 / N_AGENTS) + 0.1


@dataclasses.dataclass
class Chain:
    """One bandit episode's acting rounds, as the collector hands them to a credit rule, and
    each acting agent's known value there (for the report)."""

    rewards: list[float]
    bids: list[float]
    runner_up_bids: list[float]
    actor_values: list[float]


def bandit_chains(logits: torch.Tensor, bandit: Bandit, episodes: int, rounds: int) -> list[Chain]:
    chains = []
    for _ in range(episodes):
        contexts = bandit.contexts(rounds)
        outcomes = bandit.auctions(bandit.bid_indices(logits, contexts))
        acting = [(o, int(c)) for o, c in zip(outcomes, contexts, strict=True) if not o.skipped]
        winners = torch.tensor([o.winner for o, _ in acting], dtype=torch.long)
        at = torch.tensor([c for _, c in acting], dtype=torch.long)
        chains.append(
            Chain(
                bandit.rewards(winners, at).tolist(),
                [o.winning_bid for o, _ in acting],
                [o.runner_up_bid for o, _ in acting],
                VALUES[winners, at].tolist(),
            )
        )
    return chains


@pytest.fixture(scope="module")
def chains() -> dict[str, list[Chain]]:
    """Episodes of 6 rounds: 100 from the uniform start (many contested rounds, some skipped),
    100 from the calibrated policies (bids ~ values)."""
    bandit = Bandit(seed=2)
    calibrated, _ = train_calibrated(Bandit(seed=3))
    uniform = torch.zeros(N_AGENTS, N_CONTEXTS, len(LEVELS))
    return {
        "uniform": bandit_chains(uniform, bandit, 100, 6),
        "calibrated": bandit_chains(calibrated, bandit, 100, 6),
    }


def bandit_rule(name: str):
    """The registered rule ``name`` with its schema's defaults, priced in the bandit's units
    where it has a price scale."""
    config = CREDIT_RULES[name].Config(name=name)
    if hasattr(config, "price_scale"):
        config.price_scale = PRICE_SCALE
    return make_credit(config)


def correlation(xs: list[float], ys: list[float]) -> float:
    x, y = torch.tensor(xs, dtype=torch.float64), torch.tensor(ys, dtype=torch.float64)
    return float(torch.corrcoef(torch.stack([x, y]))[0, 1])


@pytest.mark.parametrize("name", sorted(CREDIT_RULES))
def test_every_credit_rule_keeps_its_conservation_claim_on_bandit_chains(name, chains) -> None:
    """A rule that claims conservation conserves on every chain; one that does not, fails on
    some. A rule that reads the shared memory gets no reads (the bandit has no memory), which
    leaves it its base rule. Printed: the correlation of each acting round's credit with the
    acting agent's known value (on the calibrated chains), how much a credit tells of the
    action it rewards."""
    rule = bandit_rule(name)
    rng = random.Random(4)
    report = []
    for start, episodes in chains.items():
        gaps, credits_all, values_all = [], [], []
        for chain in episodes:
            credits, discarded = rule(chain.rewards, chain.bids, chain.runner_up_bids, rng, LEVELS)
            assert len(credits) == len(chain.rewards)
            gaps.append(abs(sum(credits) + discarded - sum(chain.rewards)))
            credits_all += credits
            values_all += chain.actor_values
        report.append((start, max(gaps), correlation(credits_all, values_all)))
        if rule.conserves_return:
            assert max(gaps) <= 1e-9, f"{name} claims to conserve the return ({start} chains)"
    print(
        f"\n{name}: conserves_return={rule.conserves_return}; "
        + "; ".join(
            f"{start} chains: largest |credits + discarded - return| {gap:.1e}, "
            f"corr(credit, actor's value) {corr:+.2f}"
            for start, gap, corr in report
        )
    )
    if not rule.conserves_return:
        assert max(gap for _, gap, _ in report) > 1e-6, f"{name} conserves but does not claim it"
