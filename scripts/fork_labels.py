"""How much signal each way of labelling forks gives, on the same forks of trained swarms.

For each run folder: load its population (``--source``: ``sft`` or ``final``), play
``--worlds`` training worlds once (snapshots kept), then label the same recorded episodes
under every fork-label variant of :data:`VARIANTS` (each from the same random stream), and
count per variant: played forks, pairs, effective pairs (``forks/effective_pairs``), the
untied share of paper pairs (``forks/untied``) and of control pairs (``forks/control_untied``:
the recorded winner acting again, nothing about who acts changed), and the fork branches'
tokens. The variants differ only in ``rl.*`` fork options; a variant's signal over its noise
is its untied share over the control's.

    PYTHONPATH=src .venv/bin/python scripts/fork_labels.py <run folder> [<run folder> ...] \
        --worlds 16 --out outputs/fork_labels.json

Prints a markdown table (mean over runs, with the standard error over runs) and writes every
run's counts as JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from bidswarm.config import RLConfig
from bidswarm.evaluate import build_loop, register_evaluate_config, resolve_from_run
from bidswarm.rollout.forks import fork_pairs
from bidswarm.rollout.keyed import seeded_randomness

CONF = Path(__file__).resolve().parents[1] / "conf"

VARIANTS: dict[str, dict] = {
    "paper (K=1, uniform)": {},
    "K=2 branches": {"fork_branches": 2},
    "open_reward selection": {"fork_selection": "open_reward"},
    "tie-break": {"fork_tie_break": True},
    "half-label ties": {"bt_ties": "half_label"},
    "K=2 + tie-break": {"fork_branches": 2, "fork_tie_break": True},
}
"""The fork-label variants compared: ``rl.*`` overrides of the training run's own RL config."""


def run_config(run_dir: Path, source: str):
    """The evaluation config of ``run_dir`` with both policies from ``source``."""
    register_evaluate_config()
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose(
            "evaluate",
            overrides=[
                f"run_dir='{run_dir}'",
                f"output_dir='{run_dir / 'fork_labels'}'",
                f"bids_from={source}",
                f"actions_from={source}",
            ],
        )
    return resolve_from_run(cfg)


def trained_rl(run_dir: Path) -> RLConfig:
    """The training run's RL section (``resolved_config.yaml``), typed."""
    saved = OmegaConf.load(run_dir / "resolved_config.yaml")
    typed = OmegaConf.merge(OmegaConf.structured(RLConfig), saved.rl)
    return OmegaConf.to_object(typed)


def label_counts(run_dir: Path, source: str, worlds: int, control: float) -> dict:
    cfg = run_config(run_dir, source)
    loop = build_loop(cfg)
    rl = trained_rl(run_dir)
    env = loop.make_env()
    seeds = env.train_seeds()[:worlds]
    rng, generator = seeded_randomness(f"fork_labels/{run_dir.name}", "cpu")
    with torch.no_grad():
        episodes = loop.run(seeds, rng, generator, keep_snapshots=True)
    result = {}
    for name, overrides in VARIANTS.items():
        variant = dataclasses.replace(rl, control_forks=control, **overrides)
        rng, generator = seeded_randomness(f"fork_labels/{run_dir.name}/forks", "cpu")
        tokens_before = loop.swarm.usage.rollout_tokens
        started = time.perf_counter()
        with torch.no_grad():
            _, stats = fork_pairs(loop, episodes, variant, rng, generator)
        metrics = stats.as_metrics()
        metrics["seconds"] = time.perf_counter() - started
        metrics["tokens"] = float(loop.swarm.usage.rollout_tokens - tokens_before)
        result[name] = metrics
        print(
            f"[fork_labels] {run_dir.name} {name}: pairs {stats.pairs}, effective "
            f"{stats.effective_pairs:.2f}, untied {metrics.get('forks/untied', float('nan')):.2f}, "
            f"control untied {metrics.get('forks/control_untied', float('nan')):.2f} "
            f"({metrics['seconds']:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
    return result


def mean_se(values: list[float]) -> tuple[float, float]:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return float("nan"), float("nan")
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, float("nan")
    variance = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return mean, math.sqrt(variance / len(values))


def table(runs: dict[str, dict]) -> str:
    keys = [
        ("forks/resampled_below", "played forks"),
        ("forks/pairs", "pairs"),
        ("forks/effective_pairs", "effective pairs"),
        ("forks/untied", "untied (paper)"),
        ("forks/control_untied", "untied (control)"),
        ("tokens", "tokens"),
    ]
    lines = [
        "| variant | " + " | ".join(label for _, label in keys) + " |",
        "|---" * (len(keys) + 1) + "|",
    ]
    for name in VARIANTS:
        cells = []
        for key, _ in keys:
            mean, se = mean_se([run[name].get(key, float("nan")) for run in runs.values()])
            cells.append(f"{mean:.3g} ± {se:.2g}" if not math.isnan(se) else f"{mean:.3g}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="training run folders")
    parser.add_argument("--source", default="sft", choices=["sft", "final"])
    parser.add_argument("--worlds", type=int, default=16, help="training worlds per run")
    parser.add_argument(
        "--control", type=float, default=1.0, help="share of played forks with a control"
    )
    parser.add_argument("--out", type=Path, default=Path("outputs/fork_labels.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    runs = {
        str(run): label_counts(run, args.source, args.worlds, args.control) for run in args.runs
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(runs, indent=1))
    print(table(runs))
    print(json.dumps({"runs": len(runs), "out": str(args.out)}))


if __name__ == "__main__":
    main()
