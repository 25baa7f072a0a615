"""Every registered task keeps the fork contract (restore-then-replay reproduces the future) and
the task contract (``envs/conformance.py``): the registry, not a list, says which tasks run."""

from __future__ import annotations

import pickle

import pytest

from bidswarm.envs import EPISODE_METRICS, TASKS, env_class
from bidswarm.envs.conformance import check_fork_contract, check_task_contract
from bidswarm.envs.crafting import CraftingConfig, CraftingEnv


@pytest.mark.parametrize("name", sorted(TASKS))
def test_fork_contract(name: str) -> None:
    cls = env_class(name)
    check_fork_contract(lambda: cls(cls.Config(name=name)), seeds=[0, 1, 2, 3, 7, 11])


@pytest.mark.parametrize("name", sorted(TASKS))
def test_task_contract(name: str) -> None:
    cls = env_class(name)
    check_task_contract(lambda: cls(cls.Config()), seeds=[0, 1, 2])


def test_the_pass_at_k_metric_is_part_of_the_contract():
    assert "success" in EPISODE_METRICS


class WithoutSuccess(CraftingEnv):
    def episode_metrics(self) -> dict[str, float]:
        return {k: v for k, v in super().episode_metrics().items() if k != "success"}


class RewardNotSummed(CraftingEnv):
    def episode_metrics(self) -> dict[str, float]:
        return super().episode_metrics() | {"reward": 1.0}


class IntegerDecisions(CraftingEnv):
    def episode_metrics(self) -> dict[str, float]:
        return super().episode_metrics() | {"decisions": self.decisions_made}


class TiedExperts(CraftingEnv):
    """Every role's expert bids the same top level: the auction must break ties at every step."""

    def expert_bid(self, role: str) -> float:
        return 0.0 if self.done else 0.8


@pytest.mark.parametrize(
    "broken, named",
    [
        (WithoutSuccess, r"lacks \['success'\]"),
        (RewardNotSummed, r"\['reward'\] = 1\.0, the steps' rewards sum to 0\.0"),
        (IntegerDecisions, r"\['decisions'\] = 0: metrics are floats"),
        (
            TiedExperts,
            r"seed 0, decision 0: the experts' top bids tie \(logger, miner, smith all bid 0\.8\)"
            r"\. The no-tie rule",
        ),
    ],
    ids=["no_success", "reward", "int", "tied_experts"],
)
def test_the_task_contract_refuses_a_broken_task_naming_what(broken, named):
    config = CraftingConfig(target="wooden_pickaxe", max_decisions=6)
    with pytest.raises(AssertionError, match=named):
        check_task_contract(lambda: broken(config), seeds=[0])


@pytest.mark.parametrize("name", sorted(TASKS))
def test_a_bare_task_refuses_another_tasks_snapshot_before_anything_changes(name: str) -> None:
    cls = env_class(name)
    env = cls(cls.Config())
    env.reset(1)
    before = pickle.dumps(env.snapshot())
    for other in sorted(TASKS.keys() - {name}):
        theirs = env_class(other)(env_class(other).Config())
        theirs.reset(1)
        message = f"^a snapshot of task '{other}' cannot restore an env of task '{name}'$"
        with pytest.raises(ValueError, match=message):
            env.restore(theirs.snapshot())
    with pytest.raises(ValueError, match=f"restore\\(\\) of a '{name}' env takes what snapshot"):
        env.restore(env.fork_state())  # the task's own part, not a snapshot
    assert pickle.dumps(env.snapshot()) == before
    fresh = cls(cls.Config())
    fresh.restore(env.snapshot())  # never reset: a restored env plays an episode
    assert fresh.episode_started and fresh.observation(None) == env.observation(None)
