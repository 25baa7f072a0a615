"""The metrics canary (``tests/canary.py``): a change that moves a fixed-seed run's numbers
fails here, so that the tables measured on it are re-run on purpose, not moved by accident."""

from __future__ import annotations

import json

from canary import OVERRIDES, PIN, moved, platform_tag, run_canary


def test_a_fixed_seed_run_reproduces_its_pinned_metrics(tmp_path):
    pin = json.loads(PIN.read_text())
    assert pin["overrides"] == list(OVERRIDES), "the canary's overrides changed: re-pin it"
    changes = moved(pin["metrics"], run_canary(tmp_path))
    assert not changes, (
        f"This change moves the numbers of the fixed-seed canary run ({len(changes)} metrics; "
        f"pinned at {pin['written_at']} on {pin['platform']}, measured on {platform_tag()}):\n  "
        + "\n  ".join(changes[:40])
        + "\nEvery table in docs/results.md that this change affects must be re-run (each "
        "section names its command and commit). When the change is meant to move them, re-pin "
        "with `.venv/bin/python tests/canary.py --write` and commit canary.json with it."
    )


def test_the_canary_compares_every_metric_and_ignores_float_noise():
    pinned = {"reward/mean": 22.25, "loss_action": -0.39, "gone": 1.0}
    measured = {"reward/mean": 22.25 * (1 + 1e-7), "loss_action": -0.40, "new": 2.0}
    assert moved(pinned, measured) == [
        "gone: 1.0 -> None",
        "loss_action: -0.39 -> -0.4",
        "new: None -> 2.0",
    ]
