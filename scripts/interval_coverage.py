"""Coverage and width of the report's 95% intervals over (training seed, world) cells.

Simulates what an experiment's held-out scores look like, cell = mu + seed effect + world
effect + residual (each normal, SDs per mix below; a cell is the mean of a world's runs), on
32 worlds for 1, 3 and 5 training seeds, and scores two estimators of the mean's interval:

* ``old``: the two-way cluster bootstrap (training seeds and worlds each resampled with
  replacement, 2000 draws, percentile interval) that ``bidswarm.statistics`` used before;
  re-implemented here, vectorised, as it was;
* ``new``: ``bidswarm.statistics.crossed_intervals``, what ``clustered_summary`` and
  ``paired_difference`` now compute (two-way random-effects ANOVA, Satterthwaite's t); with
  one seed both are the report's t interval over worlds, the old one the bootstrap over worlds.

Per row: coverage of the true mean (with one seed: of that seed's own mean, the only one an
interval over worlds can claim), the SE ratio (mean SE over the mean's true SD: 1.0 when the
spread is estimated right) and the width ratio (mean interval width over 2 x 1.96 x the true
SD: 1.0 for an interval that knew the variance; an interval that must learn a seed effect
from 3 seeds pays Student's t of about 2 degrees of freedom, 4.30 instead of 1.96).
``paired`` rows score the difference of two arms that share large seed and world effects
(they cancel in the per-cell differences) and differ by their own; ``missing`` rows leave
10% of the cells out (a fixed pattern), the unbalanced path.

    PYTHONPATH=src .venv/bin/python scripts/interval_coverage.py            # ~3 min, 1 core
    PYTHONPATH=src .venv/bin/python scripts/interval_coverage.py --replications 500
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import numpy as np

from bidswarm.statistics import CONFIDENCE, crossed_forms, crossed_intervals, summarize

Z = 1.959963984540054
"""The normal 0.975 quantile: the width ratio's yardstick."""


@dataclass(frozen=True)
class Mix:
    """SDs of the seed effect, the world effect and the residual of one cell."""

    name: str
    seed: float
    world: float
    resid: float
    paired: bool = False
    missing: float = 0.0


MIXES = (
    Mix("seed + world + residual", 10.0, 25.0, 20.0),
    Mix("large seed effect", 20.0, 10.0, 20.0),
    Mix("small seed effect", 3.0, 25.0, 20.0),
    Mix("no seed effect", 0.0, 25.0, 20.0),
    Mix("no world effect", 10.0, 0.0, 20.0),
    Mix("residual only", 0.0, 0.0, 20.0),
    Mix("paired A - B", 8.0, 10.0, 20.0, paired=True),
    Mix("10% cells missing", 10.0, 25.0, 20.0, missing=0.1),
)


def simulate(mix: Mix, seeds: int, worlds: int, replications: int, rng: np.random.Generator):
    """Cells of ``replications`` experiments, shape [R, S, W], and each one's target, [R].

    A paired mix draws two arms with shared seed (SD 15) and world (SD 30) effects and takes
    their per-cell difference; the difference's own effects have the mix's SDs."""
    shape = (replications, seeds, worlds)
    seed_effect = rng.normal(0.0, mix.seed, (replications, seeds, 1))
    world_effect = rng.normal(0.0, mix.world, (replications, 1, worlds))
    if mix.paired:
        shared = rng.normal(0.0, 15.0, (replications, seeds, 1))
        shared = shared + rng.normal(0.0, 30.0, (replications, 1, worlds))
        arm_b = 50.0 + shared + rng.normal(0.0, mix.resid / np.sqrt(2), shape)
        arm_a = 55.0 + shared + seed_effect + world_effect
        arm_a = arm_a + rng.normal(0.0, mix.resid / np.sqrt(2), shape)
        cells, truth = arm_a - arm_b, np.full(replications, 5.0)
    else:
        cells = 50.0 + seed_effect + world_effect + rng.normal(0.0, mix.resid, shape)
        truth = np.full(replications, 50.0)
    if seeds == 1:  # an interval over worlds is about this seed's mean
        truth = truth + seed_effect[:, 0, 0]
    return cells, truth


def true_sd(mix: Mix, present: np.ndarray) -> float:
    """SD of the mean of the present cells around its target."""
    n = present.sum()
    seed_pairs = float((present.sum(axis=1) ** 2).sum())
    world_pairs = float((present.sum(axis=0) ** 2).sum())
    if present.shape[0] == 1:
        seed_pairs = 0.0
    variance = mix.seed**2 * seed_pairs + mix.world**2 * world_pairs + mix.resid**2 * n
    return float(np.sqrt(variance) / n)


def old_bootstrap(cells: np.ndarray, present: np.ndarray, rng, resamples: int) -> np.ndarray:
    """The old two-way cluster bootstrap per replication: SE (the draws' SD) and interval,
    shape [3, R]."""
    replications, seeds, worlds = cells.shape
    bounds = np.empty((3, replications))
    values = np.where(present, cells, 0.0)
    weights = present.astype(float)
    tail = 50 * (1 - CONFIDENCE)
    for start in range(0, replications, 50):
        stop = min(start + 50, replications)
        count = stop - start
        by_seed = rng.multinomial(seeds, np.full(seeds, 1 / seeds), (count, resamples))
        by_world = rng.multinomial(worlds, np.full(worlds, 1 / worlds), (count, resamples))
        totals = np.einsum("rbi,rij,rbj->rb", by_seed, values[start:stop], by_world)
        counted = np.einsum("rbi,ij,rbj->rb", by_seed, weights, by_world)
        draws = np.where(counted > 0, totals / np.maximum(counted, 1), np.nan)
        bounds[0, start:stop] = np.nanstd(draws, axis=1, ddof=1)
        bounds[1:, start:stop] = np.nanpercentile(draws, [tail, 100 - tail], axis=1)
    return bounds


def new_intervals(cells: np.ndarray, present: np.ndarray) -> np.ndarray:
    """``bidswarm.statistics``' SE and interval per replication, shape [3, R]."""
    if cells.shape[1] == 1:
        summaries = [summarize(list(row[0][present[0]])) for row in cells]
        return np.array([[getattr(s, name) for s in summaries] for name in FIELDS])
    forms = crossed_forms(present)
    _, se, low, high = crossed_intervals(cells, present, forms)
    return np.stack([se, low, high])


FIELDS = ("se", "ci_low", "ci_high")


def score(found: np.ndarray, truth: np.ndarray, sd: float) -> tuple[float, float, float]:
    """Coverage of ``truth``, mean SE over ``sd`` and mean width over 2 Z ``sd``."""
    se, low, high = found
    covered = float(np.mean((low <= truth) & (truth <= high)))
    return covered, float(np.mean(se) / sd), float(np.mean(high - low) / (2 * Z * sd))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replications", type=int, default=2000)
    parser.add_argument("--resamples", type=int, default=2000, help="old bootstrap's draws")
    parser.add_argument("--worlds", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    started = time.time()
    print(
        f"{args.replications} replications, {args.worlds} worlds; SDs seed / world / residual; "
        "coverage of the 95% interval and width / (2 x 1.96 x true SD)"
    )
    print("| seeds | mix | SDs | old: coverage | SE | width | new: coverage | SE | width |")
    print("|---|---|---|---|---|---|---|---|---|")
    for seeds in (1, 3, 5):
        for mix in MIXES:
            if seeds == 1 and (mix.paired or mix.missing):
                continue
            present = np.ones((seeds, args.worlds), dtype=bool)
            if mix.missing:
                pattern = np.random.default_rng(1000 + seeds)
                present = pattern.random(present.shape) >= mix.missing
            cells, truth = simulate(mix, seeds, args.worlds, args.replications, rng)
            sd = true_sd(mix, present)
            old = score(old_bootstrap(cells, present, rng, args.resamples), truth, sd)
            new = score(new_intervals(cells, present), truth, sd)
            sds = f"{mix.seed:g} / {mix.world:g} / {mix.resid:g}"
            print(
                f"| {seeds} | {mix.name} | {sds} | {old[0]:.3f} | {old[1]:.2f} | {old[2]:.2f} "
                f"| {new[0]:.3f} | {new[1]:.2f} | {new[2]:.2f} |",
                flush=True,
            )
    print(f"({time.time() - started:.0f} s)")


if __name__ == "__main__":
    main()
