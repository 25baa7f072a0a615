"""Statistics that separate arms: per-world means, t intervals, paired differences.

Held-out evaluation plays every held-out world several times; those runs of one world are not
independent samples of the arm, so every interval here is over *worlds* (and, when arms were
trained with several seeds, over training seeds too), never over episodes.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.95
"""Coverage of every interval in this module."""
NO_DIFFERENCE = "no difference detected"


def per_world_means(values: Sequence[float], worlds: Sequence[int]) -> dict[int, float]:
    """Mean of ``values`` per world id (``worlds[i]`` is the world of ``values[i]``), by id."""
    totals: dict[int, list[float]] = {}
    for value, world in zip(values, worlds, strict=True):
        totals.setdefault(world, []).append(value)
    return {world: sum(v) / len(v) for world, v in sorted(totals.items())}


def _continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz's method)."""
    tiny, eps = 1e-300, 1e-15
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 1000):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def regularized_incomplete_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b) for a, b > 0 and 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    # The continued fraction converges fast on this side of the mean; use symmetry otherwise.
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _continued_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _continued_fraction(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * regularized_incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (bisection on the CDF,
    to 1e-10); ``t_quantile(0.975, 1) == 12.706...``."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p={p}: must lie strictly between 0 and 1")
    if df <= 0:
        raise ValueError(f"df={df}: must be positive")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    if p == 0.5:
        return 0.0
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        low, high = high, 2.0 * high
    while high - low > 1e-10 * max(1.0, high):
        middle = 0.5 * (low + high)
        low, high = (middle, high) if t_cdf(middle, df) < p else (low, middle)
    return 0.5 * (low + high)


@dataclass(frozen=True)
class Summary:
    """Mean, standard error of the mean and its 95% Student-t interval over ``n`` values."""

    mean: float
    se: float
    ci_low: float
    ci_high: float
    n: int


def summarize(values: Sequence[float]) -> Summary:
    """Mean, SE (sample SD / sqrt(n)) and the 95% interval mean +- t_{0.975, n-1} * SE.

    Fewer than two values have no spread to estimate: SE 0 and the interval (mean, mean).
    """
    n = len(values)
    if n == 0:
        raise ValueError("summarize needs at least one value")
    mean = sum(values) / n
    if n < 2:
        return Summary(mean, 0.0, mean, mean, n)
    se = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)
    half = t_quantile(0.5 + CONFIDENCE / 2, n - 1) * se
    return Summary(mean, se, mean - half, mean + half, n)


@dataclass(frozen=True)
class Difference:
    """A paired difference A - B: mean, SE, 95% interval, how many pairs, and the verdict."""

    mean: float
    se: float
    ci_low: float
    ci_high: float
    n: int
    verdict: str


def paired_difference(
    a: Mapping[Hashable, float],
    b: Mapping[Hashable, float],
    label_a: str = "A",
    label_b: str = "B",
    resamples: int = 2000,
    seed: int = 0,
) -> Difference:
    """A - B over the keys both hold, with a 95% interval that respects how the data cluster.

    Keys are either

    * world ids: one trained model compared before and after a phase (or two rules on one
      model) on the same worlds. The worlds are the independent units: a paired t interval
      over the per-world differences (mean +- t_{0.975, n-1} * SD / sqrt(n)).
    * ``(training_seed, world)`` tuples: arms trained with several seeds, each evaluated on the
      same worlds. A bad training seed shifts every world of that seed, so the cells are not
      independent: the interval is a two-way cluster bootstrap, resampling training seeds and
      worlds (each with replacement, independently) and taking the mean of the differences of
      the selected cells; its 2.5 and 97.5 percentiles over ``resamples`` draws (an
      ``numpy.random.default_rng(seed)``, so the result is reproducible) are the interval and
      the SD of the draws the SE. Cells missing from the grid are left out of each draw's mean.

    The verdict is ``"{label_a} > {label_b}"`` when the interval lies above 0,
    ``"{label_a} < {label_b}"`` below it, else ``"no difference detected"`` (always so with
    fewer than two pairs, whose interval is only the point itself).
    """
    shared = [key for key in a if key in b]
    if not shared:
        raise ValueError(
            f"{label_a} and {label_b} share no key: {label_a} has {sorted(map(str, a))[:8]}, "
            f"{label_b} has {sorted(map(str, b))[:8]}"
        )
    tuples = {isinstance(key, tuple) for key in shared}
    if len(tuples) > 1:
        raise ValueError("keys mix world ids and (training_seed, world) tuples")
    differences = {key: a[key] - b[key] for key in shared}
    if tuples.pop():
        mean, se, low, high = _cluster_bootstrap(differences, resamples, seed)
    else:
        s = summarize(list(differences.values()))
        mean, se, low, high = s.mean, s.se, s.ci_low, s.ci_high
    verdict = NO_DIFFERENCE
    if len(shared) >= 2 and low > 0:
        verdict = f"{label_a} > {label_b}"
    elif len(shared) >= 2 and high < 0:
        verdict = f"{label_a} < {label_b}"
    return Difference(mean, se, low, high, len(shared), verdict)


def clustered_summary(
    cells: Mapping[tuple[Hashable, Hashable], float], resamples: int = 2000, seed: int = 0
) -> Summary:
    """Mean over ``(training_seed, world)`` cells with the 95% interval of the two-way cluster
    bootstrap (:func:`paired_difference`): what one strategy scores when its training seeds
    and its worlds both vary. SE is the SD of the bootstrap draws."""
    if not cells:
        raise ValueError("clustered_summary needs at least one cell")
    mean, se, low, high = _cluster_bootstrap(cells, resamples, seed)
    return Summary(mean, se, low, high, len(cells))


def _cluster_bootstrap(
    cells: Mapping[tuple[Hashable, Hashable], float], resamples: int, seed: int
) -> tuple[float, float, float, float]:
    """Mean, bootstrap SE and percentile interval of values keyed by (cluster, world)."""
    clusters = sorted({key[0] for key in cells}, key=str)
    worlds = sorted({key[1] for key in cells}, key=str)
    cluster_index = {c: i for i, c in enumerate(clusters)}
    world_index = {w: i for i, w in enumerate(worlds)}
    grid = np.zeros((len(clusters), len(worlds)))
    present = np.zeros_like(grid)
    for (cluster, world), value in cells.items():
        grid[cluster_index[cluster], world_index[world]] = value
        present[cluster_index[cluster], world_index[world]] = 1.0
    mean = float(grid.sum() / present.sum())
    rng = np.random.default_rng(seed)
    cluster_counts = _draw_counts(rng, len(clusters), resamples)
    world_counts = _draw_counts(rng, len(worlds), resamples)
    totals = np.einsum("ri,ij,rj->r", cluster_counts, grid, world_counts)
    weights = np.einsum("ri,ij,rj->r", cluster_counts, present, world_counts)
    draws = totals[weights > 0] / weights[weights > 0]
    low, high = np.percentile(draws, [50 * (1 - CONFIDENCE), 50 * (1 + CONFIDENCE)])
    se = float(draws.std(ddof=1)) if len(draws) > 1 else 0.0
    return mean, se, float(low), float(high)


def _draw_counts(rng: np.random.Generator, size: int, resamples: int) -> np.ndarray:
    """How often each of ``size`` items is drawn in each of ``resamples`` draws of ``size``
    with replacement: shape (resamples, size)."""
    draws = rng.integers(0, size, size=(resamples, size))
    return np.stack([np.bincount(row, minlength=size) for row in draws])


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one world: ``1 - C(n - c, k) / C(n, k)``, the chance that at
    least one of ``k`` attempts drawn without replacement from ``n`` attempts, ``c`` of them
    successful, succeeds (Chen et al. 2021). Needs ``1 <= k <= n`` and ``0 <= c <= n``."""
    if not 1 <= k <= n:
        raise ValueError(f"pass@{k} needs 1 <= k <= n attempts (n={n})")
    if not 0 <= c <= n:
        raise ValueError(f"{c} successes out of {n} attempts")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def summarize_share(values: Sequence[float]) -> Summary:
    """Mean and SE of ``values`` in [0, 1] (per-world success rates, pass@k), with the 95%
    Wilson score interval of the mean over ``n = len(values)``.

    A t interval leaves [0, 1] near the ends and collapses to a point when every world agrees
    (all 0 or all 1); the Wilson interval does neither. It is exact in form for 0/1 values and
    conservative for fractional ones: a variable in [0, 1] with mean p has variance at most
    p (1 - p), the binomial variance the interval assumes.
    """
    if any(not 0.0 <= v <= 1.0 for v in values):
        raise ValueError(f"summarize_share needs values in [0, 1], got {sorted(values)[:8]}")
    s = summarize(values)
    z = _normal_quantile(0.5 + CONFIDENCE / 2)
    n, p = s.n, s.mean
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return Summary(p, s.se, max(0.0, centre - half), min(1.0, centre + half), n)


def _normal_quantile(p: float) -> float:
    """The ``p`` quantile of the standard normal (bisection on ``erf``, to 1e-12)."""
    low, high = -40.0, 40.0
    while high - low > 1e-12:
        middle = 0.5 * (low + high)
        below = 0.5 * (1 + math.erf(middle / math.sqrt(2))) < p
        low, high = (middle, high) if below else (low, middle)
    return 0.5 * (low + high)


def pass_at_k_over_worlds(
    successes: Sequence[float], worlds: Sequence[int], k: int
) -> tuple[Summary, dict[int, float]]:
    """pass@k per world (from that world's attempts, ``successes[i]`` in {0, 1} the outcome of
    an attempt on ``worlds[i]``), and its mean over worlds with the 95% Wilson interval
    (:func:`summarize_share`: it stays in [0, 1])."""
    attempts: dict[int, list[float]] = {}
    for success, world in zip(successes, worlds, strict=True):
        attempts.setdefault(world, []).append(success)
    per_world = {
        world: pass_at_k(len(outcomes), int(sum(o > 0.5 for o in outcomes)), k)
        for world, outcomes in sorted(attempts.items())
    }
    return summarize_share(list(per_world.values())), per_world
