"""Every registered task keeps the fork contract: restore-then-replay reproduces the future."""

from __future__ import annotations

import pytest

from bidswarm.envs import TASKS, env_class
from bidswarm.envs.conformance import check_fork_contract


@pytest.mark.parametrize("name", sorted(TASKS))
def test_fork_contract(name: str) -> None:
    cls = env_class(name)
    check_fork_contract(lambda: cls(cls.Config(name=name)), seeds=[0, 1, 2, 3, 7, 11])
