"""Statistics that separate arms: per-world means, t intervals, paired differences.

Held-out evaluation plays every held-out world several times; those runs of one world are not
independent samples of the arm, so every interval here is over *worlds* (and, when arms were
trained with several seeds, over training seeds too), never over episodes.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.95
POWER = 0.8
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

    @property
    def detectable(self) -> float:
        """The smallest true difference this design finds with probability :data:`POWER` at
        the two-sided level 1 - :data:`CONFIDENCE`: (z_{0.975} + z_{0.8}) / z_{0.975} times the
        interval's half-width (the normal approximation, 1.43x; with few degrees of freedom
        the exact t quantiles give a smaller factor, so this errs large). 0 with no spread."""
        z = _normal_quantile(0.5 + CONFIDENCE / 2)
        return (self.ci_high - self.ci_low) / 2 * (z + _normal_quantile(POWER)) / z


def paired_difference(
    a: Mapping[Hashable, float],
    b: Mapping[Hashable, float],
    label_a: str = "A",
    label_b: str = "B",
) -> Difference:
    """A - B over the keys both hold, with a 95% interval that respects how the data cluster.

    Keys are either

    * world ids: one trained model compared before and after a phase (or two rules on one
      model) on the same worlds. The worlds are the independent units: a paired t interval
      over the per-world differences (mean +- t_{0.975, n-1} * SD / sqrt(n)).
    * ``(training_seed, world)`` tuples: arms trained with several seeds, each evaluated on the
      same worlds. A bad training seed shifts every world of that seed and a hard world every
      seed, so the cells are not independent: the interval is :func:`clustered_summary`'s over
      the per-cell differences (a two-way random-effects analysis of the training seed x world
      grid, Satterthwaite's t; one seed: the t interval over its worlds).

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
    keyed_by_seed = tuples.pop()
    s = clustered_summary(differences) if keyed_by_seed else summarize(list(differences.values()))
    verdict = NO_DIFFERENCE
    if len(shared) >= 2 and s.ci_low > 0:
        verdict = f"{label_a} > {label_b}"
    elif len(shared) >= 2 and s.ci_high < 0:
        verdict = f"{label_a} < {label_b}"
    return Difference(s.mean, s.se, s.ci_low, s.ci_high, len(shared), verdict)


def clustered_summary(cells: Mapping[tuple[Hashable, Hashable], float]) -> Summary:
    """Mean of the ``(training_seed, world)`` cells, its SE and 95% interval under the crossed
    random-effects model y_sw = mu + a_s + b_w + e_sw (a training-seed effect, a world effect
    and a residual, with variances s2_seed, s2_world, s2_resid).

    Every run of an experiment is scored on the same held-out worlds, so seeds and worlds
    cross. The variance of the mean of a full S x W grid is s2_seed/S + s2_world/W +
    s2_resid/(S W); the components come from the grid's mean squares (the two-way ANOVA
    without replication; on a grid with missing cells, Henderson's method III: each effect's
    sum of squares after the other's, :func:`crossed_intervals`), each clipped at 0, and the
    interval is mean +- t * SE with Satterthwaite's degrees of freedom. At 3 seeds a large
    seed effect leaves about 2 of them (t = 4.3), which is the price of knowing the seed
    spread from 3 draws; with no seed effect the interval is about as wide as one over worlds.
    ``scripts/interval_coverage.py`` measures its coverage (docs/results.md, "Intervals over
    training seeds and worlds").

    One training seed (or one world): the t interval over the cells, which cannot count the
    other effect. A grid that does not cross them (seeds on disjoint worlds, or too few cells
    to leave a residual): the t interval over the seeds' means.
    """
    if not cells:
        raise ValueError("clustered_summary needs at least one cell")
    seeds = sorted({key[0] for key in cells}, key=str)
    worlds = sorted({key[1] for key in cells}, key=str)
    if len(seeds) < 2 or len(worlds) < 2:
        return summarize(list(cells.values()))
    seed_index = {seed: i for i, seed in enumerate(seeds)}
    world_index = {world: j for j, world in enumerate(worlds)}
    grid = np.zeros((len(seeds), len(worlds)))
    present = np.zeros(grid.shape, dtype=bool)
    for (seed, world), value in cells.items():
        grid[seed_index[seed], world_index[world]] = value
        present[seed_index[seed], world_index[world]] = True
    forms = crossed_forms(present)
    if forms is None:
        means = [float(grid[i][present[i]].mean()) for i in range(len(seeds))]
        return summarize(means)
    mean, se, low, high = (float(x) for x in crossed_intervals(grid, present, forms))
    return Summary(mean, se, low, high, len(cells))


@dataclass(frozen=True)
class CrossedForms:
    """The quadratic forms of a training seed x world grid of ``n`` present cells (taken in
    row-major order): y' Q_m y for m = seed, world, residual (Henderson's method III: the
    seed's sum of squares after the world's, the world's after the seed's, the residual of the
    additive fit), what they estimate, and what the variance of the cells' mean is made of."""

    rows: np.ndarray
    """Seed index of each present cell, shape [n]."""
    cols: np.ndarray
    """World index of each present cell, shape [n]."""
    forms: np.ndarray
    """Q_seed, Q_world, Q_resid, shape [3, n, n]."""
    df: np.ndarray
    """Their degrees of freedom (ranks), shape [3]."""
    traces: np.ndarray
    """tr(Q_seed K_seed), tr(Q_world K_world), with K_seed[k, l] = 1 when cells k and l share a
    seed (K_world: a world): E[y'Q_seed y] = traces[0] s2_seed + df[0] s2_resid, shape [2]."""
    loads: np.ndarray
    """Var(mean of the cells) = (loads . (s2_seed, s2_world, s2_resid)) / n^2: the number of
    cell pairs that share a seed, that share a world, and n, shape [3]."""
    fourth: np.ndarray
    """tr(Q_m K_i Q_l K_j) (K_resid = I), shape [3, 3, 3, 3]: Var(y'Qy) = 2 tr((Q Sigma)^2)
    for normal y, Sigma = sum_i s2_i K_i."""


def crossed_forms(present: np.ndarray) -> CrossedForms | None:
    """The :class:`CrossedForms` of the cells ``present`` (bool, shape [S, W]); None when the
    grid leaves a component no degree of freedom (it does not cross seeds and worlds)."""
    present = np.asarray(present, dtype=bool)
    return _forms_of(present.shape, present.tobytes())


@functools.lru_cache(maxsize=64)
def _forms_of(shape: tuple[int, int], cells: bytes) -> CrossedForms | None:
    """:func:`crossed_forms` by grid shape and cells (a report asks for the same grid often)."""
    present = np.frombuffer(cells, dtype=bool).reshape(shape)
    rows, cols = np.nonzero(present)
    n = len(rows)
    by_seed = np.eye(present.shape[0])[rows]
    by_world = np.eye(present.shape[1])[cols]

    def projector(x: np.ndarray) -> np.ndarray:
        return x @ np.linalg.pinv(x)

    full = projector(np.hstack([by_seed, by_world]))
    seed_only, world_only = projector(by_seed), projector(by_world)
    forms = np.stack([full - world_only, full - seed_only, np.eye(n) - full])
    df = np.rint([np.trace(q) for q in forms])
    shared = np.stack([by_seed @ by_seed.T, by_world @ by_world.T, np.eye(n)])
    traces = np.array([np.sum(forms[0] * shared[0]), np.sum(forms[1] * shared[1])])
    if np.any(df < 1) or np.any(traces < 1e-9):
        return None
    products = np.einsum("mab,ibc->miac", forms, shared)
    fourth = np.einsum("miac,ljca->milj", products, products)
    loads = shared.sum(axis=(1, 2))
    return CrossedForms(rows, cols, forms, df, traces, loads, fourth)


def crossed_intervals(
    grid: np.ndarray, present: np.ndarray, forms: CrossedForms | None = None
) -> np.ndarray:
    """Mean, SE and 95% interval of the present cells of each grid (:func:`clustered_summary`),
    for one grid or a stack of them on the same cells (a simulation's replications).

    Args:
        grid: cell values, shape [..., S, W] (values where ``present`` is False are ignored).
        present: which cells hold a value, shape [S, W].
        forms: ``crossed_forms(present)``, when the caller holds it (None: computed here).

    Returns:
        shape [4, ...]: mean, SE, CI low, CI high. Variance components from the quadratic
        forms (clipped at 0; a clipped component drops out of the estimate and of its
        Satterthwaite degrees of freedom, df = 2 V^2 / Var(V) with Var(V) from the estimated
        components, at least 1). A grid without spread gives the point itself.
    """
    forms = crossed_forms(present) if forms is None else forms
    if forms is None:
        raise ValueError("the cells do not cross training seeds and worlds")
    y = grid[..., forms.rows, forms.cols]
    n = y.shape[-1]
    mean = y.mean(axis=-1)
    # The forms annihilate constants; centring first keeps their rounding off a flat grid.
    centred = y - mean[..., None]
    squares = np.einsum("...k,mkl,...l->...m", centred, forms.forms, centred)
    resid = squares[..., 2] / forms.df[2]
    raw = (squares[..., :2] - forms.df[:2] * resid[..., None]) / forms.traces
    kept = raw > 0
    components = np.concatenate([np.where(kept, raw, 0.0), resid[..., None]], axis=-1)
    variance = components @ forms.loads / n**2
    # The estimate as a combination of the three sums of squares, to carry its variance.
    weights = np.where(kept, forms.loads[:2] / forms.traces, 0.0)
    resid_weight = forms.loads[2] - (weights * forms.df[:2]).sum(axis=-1)
    weights = np.concatenate([weights, (resid_weight / forms.df[2])[..., None]], axis=-1) / n**2
    spread = 2 * np.einsum(
        "...m,...i,...l,...j,milj->...", weights, components, weights, components, forms.fourth
    )
    scale = np.maximum(np.abs(mean), 1.0)
    flat = variance <= (1e-12 * scale) ** 2
    df = np.where(flat | (spread <= 0), np.inf, 2 * variance**2 / np.where(spread > 0, spread, 1))
    se = np.sqrt(np.maximum(variance, 0.0))
    quantiles = np.vectorize(_two_sided_t)(np.maximum(df, 1.0))
    half = np.where(flat, 0.0, quantiles * se)
    return np.stack([mean, np.where(flat, 0.0, se), mean - half, mean + half])


def _two_sided_t(df: float) -> float:
    """t_{0.5 + CONFIDENCE/2, df}; the normal quantile for infinite df."""
    if math.isinf(df):
        return _normal_quantile(0.5 + CONFIDENCE / 2)
    return t_quantile(0.5 + CONFIDENCE / 2, df)


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
