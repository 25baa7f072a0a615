"""``debug=reward`` (the canary's profile) earns training reward on every registered task
(``envs.TASKS``, so a new task is run here without an edit), and its last lines say so: crafting
at the canary's sizes, navigation and research at their own (``conf/debug/task/reward_<task>.yaml``,
docs/architecture.md "Seeing a new rule work")."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest
import yaml

from bidswarm.envs import TASKS
from canary import OVERRIDES
from conftest import CONF, ROOT
from test_check_readme import load_script as load_check_readme


def task_overrides(names: Iterable[str], conf: Path) -> dict[str, str]:
    """Per task name, the ``task=<option>`` that picks it: the ``conf/task`` option whose
    defaults start from the task's schema (``<name>_schema``); of several, the default task of
    ``conf/train.yaml`` if it is one, else the first by name. A task without one is an error."""
    train = yaml.safe_load((conf / "train.yaml").read_text())["defaults"]
    default = next(entry["task"] for entry in train if isinstance(entry, dict) and "task" in entry)
    overrides = {}
    for name in names:
        options = sorted(
            path.stem
            for path in (conf / "task").glob("*.yaml")
            if f"{name}_schema" in (yaml.safe_load(path.read_text()) or {}).get("defaults", [])
        )
        if not options:
            raise ValueError(f"task {name!r}: no conf/task/<option>.yaml starts from {name}_schema")
        overrides[name] = f"task={default if default in options else options[0]}"
    return overrides


SMOKE_TASKS = task_overrides(TASKS, CONF)
"""Every registered task -> the override that picks it."""


def test_every_registered_task_is_picked_by_an_option_of_its_own(tmp_path):
    assert SMOKE_TASKS == {
        "crafting": "task=crafting_wooden_pickaxe",
        "navigation": "task=navigation_r2r",
        "research": "task=research",
    }
    conf = shutil.copytree(CONF, tmp_path / "conf")
    (conf / "task" / "relay_small.yaml").write_text("defaults: [relay_schema, _self_]\n")
    (conf / "task" / "relay_big.yaml").write_text("defaults:\n  - relay_schema\n  - _self_\n")
    found = task_overrides([*TASKS, "relay"], conf)
    assert found["relay"] == "task=relay_big"  # a new task is run too, without an edit here
    with pytest.raises(ValueError, match=r"task 'courier': no conf/task/<option>\.yaml"):
        task_overrides(["courier"], conf)


@pytest.mark.slow
@pytest.mark.parametrize("task", sorted(SMOKE_TASKS))
def test_the_canary_sizes_earn_training_reward_and_print_it(task, tmp_path):
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    command = [
        sys.executable,
        "-m",
        "bidswarm.train",
        *OVERRIDES,
        f"hydra.run.dir={tmp_path / 'run'}",
        SMOKE_TASKS[task],
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
