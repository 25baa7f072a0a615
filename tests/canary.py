"""The metrics canary: a short fixed-seed run whose numbers are pinned in ``canary.json``.

Every table in docs/results.md was measured at a named commit. A change that moves what a
fixed-seed run computes (SFT plan, sampling, credit, forks, losses, evaluation) moves those
tables too, so ``test_canary.py`` fails on it and says which tables to re-run; a change that
only restructures code leaves every pinned number equal.

After a change that is *meant* to move the numbers, re-pin (and re-run the affected tables):

    .venv/bin/python tests/canary.py --write
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
PIN = Path(__file__).with_name("canary.json")

OVERRIDES = (
    # conf/debug/reward.yaml: the main job's SFT and fork sizes, cut to 2 action updates and 1
    # bid update on 8 worlds (a run that earns training reward).
    "debug=reward",
    # The paper's bid channel, named: the canary pins the paper's method whatever the default.
    "bids=paper",
    "seed=0",
    "logger=csv",
)
"""What the canary runs: ``python -m bidswarm.train`` with these overrides (~20 s on 2 cores)."""

RELATIVE_TOLERANCE = 1e-3
"""Float noise below this is not a change; a sampled token that flips moves far more. The
same commit measures up to 2.1e-4 apart on CPUs of other vector widths (AVX2 against AVX512:
an agent's bid loss, after an SFT loss 2e-5 apart)."""


def is_pinned(name: str) -> bool:
    """Wall-clock times and memory vary from run to run, and ``engine/*`` (the rollout
    engine's log-probs against the learner's: ~1e-7, float noise of the kernels) from CPU to
    CPU; everything else is computed."""
    return not name.startswith(("time/", "memory/", "system/", "engine/"))


def run_canary(folder: Path) -> dict[str, float]:
    """Run the canary into ``folder``; return its pinned metrics by name.

    Names: ``sft/...`` from the cold start, ``eval_before/...`` and ``eval_after/...`` from
    the held-out evaluations, ``update<u>/...`` from each RL update's logged metrics.
    """
    run_dir = folder / "run"
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{folder / 'mlflow.db'}"}
    command = [sys.executable, "-m", "bidswarm.train", f"hydra.run.dir={run_dir}", *OVERRIDES]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        output = result.stdout[-3000:] + result.stderr[-5000:]
        raise RuntimeError(f"the canary run failed:\n{output}")
    state = json.loads((run_dir / "state.json").read_text())
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)
    sources = {"": state["sft"], "eval_before/": state["eval_before"]}
    sources["eval_after/"] = state["eval_after"]
    for update, logged in enumerate(checkpoint["bidswarm"]["history"]):
        sources[f"update{update}/"] = logged
    return {
        prefix + name: float(value)
        for prefix, logged in sources.items()
        for name, value in logged.items()
        if is_pinned(name)
    }


def platform_tag() -> str:
    """Where the pin was written: float results can differ across torch builds and CPUs."""
    capability = torch.backends.cpu.get_cpu_capability()
    return f"torch {torch.__version__}, {platform.machine()}, {capability}"


def moved(pinned: dict[str, float], measured: dict[str, float]) -> list[str]:
    """One line per metric that differs beyond float noise, appeared or disappeared."""
    lines = []
    for name in sorted(pinned.keys() | measured.keys()):
        old, new = pinned.get(name), measured.get(name)
        if old is None or new is None:
            lines.append(f"{name}: {old} -> {new}")
        elif not math.isclose(old, new, rel_tol=RELATIVE_TOLERANCE, abs_tol=1e-9):
            lines.append(f"{name}: {old!r} -> {new!r}")
    return lines


def write_pin(folder: Path) -> None:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    pin = {
        "overrides": list(OVERRIDES),
        "written_at": commit,
        "platform": platform_tag(),
        "metrics": run_canary(folder),
    }
    PIN.write_text(json.dumps(pin, indent=1, sort_keys=True) + "\n")
    print(f"pinned {len(pin['metrics'])} metrics in {PIN.relative_to(ROOT)}")


if __name__ == "__main__":
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="run the canary and re-pin it")
    if parser.parse_args().write:
        with tempfile.TemporaryDirectory() as tmp:
            write_pin(Path(tmp))
    else:
        parser.print_help()
