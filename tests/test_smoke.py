"""``debug=reward`` (the canary's profile) earns training reward on every task, and its last lines
say so: crafting at the canary's sizes, navigation and research at their own
(``conf/debug/task/reward_<task>.yaml``, docs/architecture.md "Seeing a new rule work")."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from canary import OVERRIDES
from conftest import ROOT
from test_check_readme import load_script as load_check_readme

TASKS = {"crafting": [], "navigation": ["task=navigation_r2r"], "research": ["task=research"]}
"""Task -> the overrides that pick it (crafting is the default task)."""


@pytest.mark.slow
@pytest.mark.parametrize("task", sorted(TASKS))
def test_the_canary_sizes_earn_training_reward_and_print_it(task, tmp_path):
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    command = [
        sys.executable,
        "-m",
        "bidswarm.train",
        *OVERRIDES,
        f"hydra.run.dir={tmp_path / 'run'}",
        *TASKS[task],
    ]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    tail = result.stdout.strip().splitlines()[-6:]
    line = next((x for x in tail if "training reward per RL update" in x), None)
    assert line, f"the last lines do not show the training reward:\n{tail}"
    rewards = [float(v) for v in re.findall(r"(-?\d+\.\d+)", line.split(":", 1)[1])]
    assert len(rewards) == 3  # 2 action updates, 1 bid update
    assert sum(rewards) > 0.0, line  # navigation's progress reward can be negative
    # scripts/check_readme.py reads the README's headline figures from these same lines
    printed = load_check_readme().printed_headline(result.stdout)
    assert printed.ci_low <= printed.difference <= printed.ci_high
