"""``bidswarm.statistics``: t quantiles, summaries over worlds, paired differences of arms."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from bidswarm.statistics import (
    clustered_summary,
    crossed_intervals,
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


def test_a_difference_of_the_detectable_size_is_found_about_four_times_in_five():
    rng = random.Random(3)

    def draw(effect: float) -> object:
        before = {w: rng.gauss(0, 5) for w in range(30)}
        return paired_difference(
            {w: v + effect + rng.gauss(0, 1) for w, v in before.items()}, before
        )

    size = sum(draw(0.0).detectable for _ in range(200)) / 200
    # sd 1 over 30 worlds: (1.96 + 0.84) / sqrt(30) ~ 0.51, a little more for t's tails.
    assert 0.48 < size < 0.58
    found = sum(draw(size).verdict == "A > B" for _ in range(400)) / 400
    assert 0.72 < found < 0.90
    assert paired_difference({0: 1.0, 1: 1.0}, {0: 0.0, 1: 0.0}).detectable == 0.0


def shifted_for_one_training_seed() -> tuple[dict, dict]:
    """Three training seeds x 12 worlds: B - A is 1 +- 0.5 everywhere, plus 20 for seed 0."""
    rng = random.Random(1)
    b = {(s, w): rng.uniform(0, 50) for s in range(3) for w in range(12)}
    a = {(s, w): v + 1.0 + rng.gauss(0, 0.5) + (20.0 if s == 0 else 0.0) for (s, w), v in b.items()}
    return a, b


def test_a_full_grid_gets_the_two_way_anova_interval_by_hand():
    """3 seeds x 4 worlds, cell = seed level + world level + a residual: the variance of the
    mean is (MS_seed + MS_world - MS_resid) / 12 and the t has Satterthwaite's df."""
    seed_levels, world_levels = (0.0, 6.0, -3.0), (1.0, 2.0, 4.0, 9.0)
    residuals = ((1.0, -1.0, 0.5, -0.5), (-2.0, 1.0, 0.0, 1.0), (1.0, 0.0, -0.5, -0.5))
    cells = {
        (s, w): seed_levels[s] + world_levels[w] + residuals[s][w]
        for s in range(3)
        for w in range(4)
    }
    grid = [[cells[(s, w)] for w in range(4)] for s in range(3)]
    mean = sum(map(sum, grid)) / 12
    seed_means = [sum(row) / 4 for row in grid]
    world_means = [sum(grid[s][w] for s in range(3)) / 3 for w in range(4)]
    ms_seed = 4 * sum((m - mean) ** 2 for m in seed_means) / 2
    ms_world = 3 * sum((m - mean) ** 2 for m in world_means) / 3
    ms_resid = (
        sum(
            (grid[s][w] - seed_means[s] - world_means[w] + mean) ** 2
            for s in range(3)
            for w in range(4)
        )
        / 6
    )
    variance = (ms_seed + ms_world - ms_resid) / 12
    df = (ms_seed + ms_world - ms_resid) ** 2 / (ms_seed**2 / 2 + ms_world**2 / 3 + ms_resid**2 / 6)
    half = t_quantile(0.975, df) * math.sqrt(variance)
    s = clustered_summary(cells)
    assert (s.mean, s.se, s.n) == (pytest.approx(mean), pytest.approx(math.sqrt(variance)), 12)
    assert (s.ci_low, s.ci_high) == pytest.approx((mean - half, mean + half))
    # The same on a stack of grids (a simulation's replications).
    stacked = crossed_intervals(np.array([grid, grid]), np.ones((3, 4), dtype=bool))
    assert stacked[:, 1] == pytest.approx([mean, math.sqrt(variance), mean - half, mean + half])


def test_a_component_estimated_below_zero_drops_out():
    """Seeds that agree better than their cells' noise says (MS_seed < MS_resid): the seed
    component is 0, and the interval rests on the world mean square alone (its df, 3)."""
    grid = [[1.0, 5.0, 2.0, 8.0], [2.0, 3.0, 4.0, 7.0], [0.0, 6.0, 3.0, 7.0]]
    cells = {(s, w): grid[s][w] for s in range(3) for w in range(4)}
    world_means = [sum(grid[s][w] for s in range(3)) / 3 for w in range(4)]
    mean = sum(world_means) / 4
    ms_world = 3 * sum((m - mean) ** 2 for m in world_means) / 3
    s = clustered_summary(cells)
    assert s.se == pytest.approx(math.sqrt(ms_world / 12))
    assert s.ci_high - s.mean == pytest.approx(t_quantile(0.975, 3) * s.se)


def test_one_seed_gets_the_t_interval_over_its_worlds_and_missing_cells_are_left_out():
    worlds = {(0, w): float(w * w) for w in range(6)}
    over_worlds = summarize([float(w * w) for w in range(6)])
    assert clustered_summary(worlds) == over_worlds
    # A grid with holes: the mean is over the cells present; the interval still counts seeds.
    rng = random.Random(4)
    cells = {(s, w): 10.0 * s + w + rng.gauss(0, 1) for s in range(3) for w in range(8)}
    del cells[(0, 3)], cells[(2, 5)]
    holed = clustered_summary(cells)
    assert holed.n == 22 and holed.mean == pytest.approx(sum(cells.values()) / 22)
    assert holed.ci_high - holed.ci_low > 3 * (
        summarize(list(cells.values())).ci_high - summarize(list(cells.values())).ci_low
    )
    # Seeds on disjoint worlds cannot be told from worlds: the t interval over seed means.
    apart = {(0, 1): 1.0, (0, 2): 3.0, (1, 5): 10.0, (1, 6): 12.0}
    assert clustered_summary(apart) == summarize([2.0, 11.0])


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
