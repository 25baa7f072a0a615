"""``bidswarm.statistics``: t quantiles, summaries over worlds, paired differences of arms."""

from __future__ import annotations

import math
import random

import pytest

from bidswarm.statistics import (
    clustered_summary,
    paired_difference,
    per_world_means,
    summarize,
    t_cdf,
    t_quantile,
)


@pytest.mark.parametrize(
    ("df", "expected"), [(1, 12.706), (2, 4.303), (5, 2.571), (10, 2.228), (30, 2.042)]
)
def test_t_quantile_matches_the_tables(df, expected):
    assert t_quantile(0.975, df) == pytest.approx(expected, abs=5e-4)
    assert t_quantile(0.025, df) == pytest.approx(-expected, abs=5e-4)


def test_t_cdf_is_symmetric_and_approaches_the_normal():
    assert t_cdf(0.0, 3) == pytest.approx(0.5)
    assert t_cdf(1.0, 1) == pytest.approx(0.75)  # Cauchy: 1/2 + atan(1)/pi
    assert t_quantile(0.975, 10_000) == pytest.approx(1.960, abs=1e-3)
    assert t_quantile(0.5, 4) == 0.0


def test_per_world_means_average_the_runs_of_each_world():
    assert per_world_means([1.0, 3.0, 10.0, 5.0], [7, 7, 2, 2]) == {2: 7.5, 7: 2.0}


def test_summarize_by_hand():
    # mean 5; sample variance (9 + 1 + 1 + 9) / 3 = 20/3; SE = sqrt(20/3 / 4) = 1.29099;
    # t_{0.975, 3} = 3.18245, half width 4.10850.
    s = summarize([2.0, 4.0, 6.0, 8.0])
    assert (s.mean, s.n) == (5.0, 4)
    assert s.se == pytest.approx(math.sqrt(5 / 3))
    assert (s.ci_low, s.ci_high) == pytest.approx((0.89150, 9.10850), abs=1e-4)
    one = summarize([3.0])
    assert (one.mean, one.se, one.ci_low, one.ci_high, one.n) == (3.0, 0.0, 3.0, 3.0, 1)
    with pytest.raises(ValueError):
        summarize([])


def test_identical_arms_differ_by_nothing():
    worlds = {w: float(w * w) for w in range(8)}
    diff = paired_difference(worlds, dict(worlds))
    assert (diff.mean, diff.se, diff.ci_low, diff.ci_high) == (0.0, 0.0, 0.0, 0.0)
    assert diff.n == 8 and diff.verdict == "no difference detected"
    cells = {(s, w): float(s + w) for s in range(3) for w in range(4)}
    assert paired_difference(cells, dict(cells)).verdict == "no difference detected"


@pytest.mark.parametrize("keyed_by_seed", [False, True])
def test_a_constant_shift_is_detected(keyed_by_seed):
    rng = random.Random(0)
    keys = [(s, w) for s in range(3) for w in range(6)] if keyed_by_seed else list(range(6))
    b = {key: rng.uniform(0, 100) for key in keys}
    a = {key: value + 5.0 for key, value in b.items()}
    diff = paired_difference(a, b, "RL", "SFT")
    assert diff.mean == pytest.approx(5.0) and diff.verdict == "RL > SFT"
    assert diff.ci_low == pytest.approx(5.0) and diff.ci_high == pytest.approx(5.0)
    assert paired_difference(b, a, "RL", "SFT").verdict == "RL < SFT"


def test_noisy_shift_gets_a_t_interval_around_it():
    a = {0: 10.0, 1: 12.0, 2: 9.0, 3: 11.0}
    b = {0: 8.0, 1: 8.0, 2: 8.0, 3: 8.0}
    # differences 2, 4, 1, 3: the summary of those.
    expected = summarize([2.0, 4.0, 1.0, 3.0])
    diff = paired_difference(a, b)
    assert (diff.mean, diff.se, diff.ci_low, diff.ci_high) == pytest.approx(
        (expected.mean, expected.se, expected.ci_low, expected.ci_high)
    )
    assert diff.verdict == "A > B"


def test_only_shared_keys_are_paired():
    a = {0: 1.0, 1: 2.0, 2: 100.0}
    b = {1: 1.0, 0: 0.0, 5: -100.0}
    diff = paired_difference(a, b)
    assert diff.n == 2 and diff.mean == 1.0
    with pytest.raises(ValueError, match="share no key"):
        paired_difference({0: 1.0}, {1: 1.0})


def shifted_for_one_training_seed() -> tuple[dict, dict]:
    """Three training seeds x 12 worlds: B - A is 1 +- 0.5 everywhere, plus 20 for seed 0."""
    rng = random.Random(1)
    b = {(s, w): rng.uniform(0, 50) for s in range(3) for w in range(12)}
    a = {(s, w): v + 1.0 + rng.gauss(0, 0.5) + (20.0 if s == 0 else 0.0) for (s, w), v in b.items()}
    return a, b


def test_bootstrap_is_deterministic_for_a_fixed_seed():
    a, b = shifted_for_one_training_seed()
    assert paired_difference(a, b, seed=3) == paired_difference(a, b, seed=3)
    assert paired_difference(a, b, seed=3).ci_low != paired_difference(a, b, seed=4).ci_low


def test_a_shift_of_one_training_seed_widens_the_two_way_interval():
    a, b = shifted_for_one_training_seed()
    clustered = paired_difference(a, b)

    def world_means(cells: dict) -> dict[int, float]:
        return {w: sum(cells[(s, w)] for s in range(3)) / 3 for w in range(12)}

    world_only = paired_difference(world_means(a), world_means(b))
    assert clustered.mean == pytest.approx(world_only.mean)
    assert clustered.ci_high - clustered.ci_low > 5 * (world_only.ci_high - world_only.ci_low)
    assert clustered.ci_low < world_only.ci_low and clustered.ci_high > world_only.ci_high


def test_a_clustered_summary_spans_the_spread_of_training_seeds():
    """One strategy's cells over 3 training seeds x 12 worlds: constant cells give the point
    itself; seeds whose levels differ by 30 widen the interval far past the t interval over
    the 36 cells taken as independent, around the cells' mean."""
    constant = {(s, w): 0.25 for s in range(3) for w in range(12)}
    summary = clustered_summary(constant)
    assert (summary.mean, summary.ci_low, summary.ci_high, summary.n) == (0.25, 0.25, 0.25, 36)
    rng = random.Random(2)
    cells = {(s, w): 30.0 * s + rng.gauss(0, 1) for s in range(3) for w in range(12)}
    summary = clustered_summary(cells)
    naive = summarize(list(cells.values()))
    assert summary.mean == pytest.approx(naive.mean)
    assert summary.ci_low < summary.mean < summary.ci_high
    assert summary.ci_high - summary.ci_low > 1.5 * (naive.ci_high - naive.ci_low)
    with pytest.raises(ValueError, match="at least one cell"):
        clustered_summary({})
