"""The recipes of ``docs/architecture.md`` followed to the letter: a new coordination rule, a new
credit rule and a new task are a class registered in their own module plus a YAML in ``conf/``,
nothing else; and README's lists of choices are the registries'."""

from __future__ import annotations

import random
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from bidswarm.algorithms.credit import CREDIT_RULES, CreditConfig, CreditRule, Reads, make_credit
from bidswarm.checks import Parameter, Problems, at_least, unit_interval
from bidswarm.config import ConfigError, register_configs, validate
from bidswarm.coordination import (
    RULES,
    CoordinationConfig,
    CoordinationRule,
    Decision,
    Situation,
    make_coordination,
)
from bidswarm.envs import TASKS, StepResult, TaskConfig, TextEnv, make_env, register_task
from bidswarm.envs.conformance import check_fork_contract, check_task_contract
from conftest import CONF, ROOT


@pytest.fixture
def registries():
    """The registries as they were, after the test (its throwaway rules leave no trace)."""
    saved = dict(RULES), dict(CREDIT_RULES), dict(TASKS)
    yield
    for registry, before in zip((RULES, CREDIT_RULES, TASKS), saved, strict=True):
        registry.clear()
        registry.update(before)


@pytest.fixture
def conf(tmp_path):
    """A copy of ``conf/`` to add a rule's YAML to."""
    return shutil.copytree(CONF, tmp_path / "conf")


def compose_train(conf_dir, overrides):
    register_configs()
    with initialize_config_dir(str(conf_dir), version_base="1.3"):
        return compose("train", overrides=overrides)


def test_a_new_coordination_rule_is_its_module_and_its_yaml(registries, conf):
    # 1. the module: a registered CoordinationRule with its Config, parameters and decide
    from bidswarm.coordination.base import register

    @dataclass
    class LowestConfig(CoordinationConfig):
        offset: int = 0

    @register("lowest_recipe")
    class Lowest(CoordinationRule):
        Config = LowestConfig

        def __init__(self, offset: int) -> None:
            self.offset = offset

        @classmethod
        def parameters(cls) -> list[Parameter]:
            return [*super().parameters(), Parameter("offset", at_least(0))]

        @classmethod
        def from_config(cls, config: LowestConfig) -> Lowest:
            return cls(config.offset)

        def decide(self, situations: list[Situation], rng: random.Random) -> list[Decision]:
            return [Decision(actor=(self.offset + s.decision) % s.n_agents) for s in situations]

    # 2. its YAML
    (conf / "coordination" / "lowest_recipe.yaml").write_text(
        "defaults: [lowest_recipe_schema, _self_]\nname: lowest_recipe\noffset: 1\n"
    )
    cfg = compose_train(conf, ["coordination=lowest_recipe"])
    validate(cfg)
    rule = make_coordination(OmegaConf.to_object(cfg.coordination))
    assert isinstance(rule, Lowest) and rule.offset == 1
    assert rule.decide([Situation(n_agents=3, decision=4)], random.Random(0))[0].actor == 2
    cfg.coordination.offset = -1
    with pytest.raises(ConfigError, match=r"coordination\.offset=-1: must be >= 0"):
        validate(cfg)


def test_a_new_credit_rule_is_its_module_and_its_yaml(registries, conf):
    # 1. the module: the equation as a function, and a registered CreditRule that calls it
    from bidswarm.algorithms.credit.base import register

    def kept_share_credit(rewards: Sequence[float], share: float) -> tuple[list[float], float]:
        """Each acting step keeps ``share`` of its own reward; the rest is discarded."""
        return [share * r for r in rewards], (1 - share) * sum(rewards)

    @dataclass
    class KeptShareConfig(CreditConfig):
        share: float = 0.5

    @register("kept_share_recipe")
    class KeptShare(CreditRule):
        Config = KeptShareConfig

        def __init__(self, share: float) -> None:
            self.share = share

        @classmethod
        def parameters(cls) -> list[Parameter]:
            return [Parameter("share", unit_interval())]

        @classmethod
        def from_config(cls, config: KeptShareConfig) -> KeptShare:
            return cls(config.share)

        def __call__(
            self,
            rewards: Sequence[float],
            bids: Sequence[float],
            runner_up_bids: Sequence[float],
            rng: random.Random,
            levels: Sequence[float],
            reads: Reads = (),
        ) -> tuple[list[float], float]:
            return kept_share_credit(rewards, self.share)

    # 2. its YAML
    (conf / "credit" / "kept_share_recipe.yaml").write_text(
        "defaults: [kept_share_recipe_schema, _self_]\nname: kept_share_recipe\nshare: 0.25\n"
    )
    cfg = compose_train(conf, ["credit=kept_share_recipe"])
    validate(cfg)
    rule = make_credit(OmegaConf.to_object(cfg.credit))
    assert rule([4.0, 8.0], [0.0, 0.0], [0.0, 0.0], random.Random(0), []) == ([1.0, 2.0], 9.0)
    cfg.credit.share = 1.5
    with pytest.raises(ConfigError, match=r"credit\.share=1\.5: must lie in \[0, 1\]"):
        validate(cfg)


def test_a_new_task_is_its_package_and_its_yaml(registries, conf):
    # 1. the package: a config (its defaults and problems) and a registered TextEnv
    @dataclass
    class CounterConfig(TaskConfig):
        name: str = "counter_recipe"
        target: int = 3

        def problems(self) -> list[str]:
            problems = Problems(super().problems())
            problems.at_least("task.target", self.target, 1)
            return problems

    @register_task("counter_recipe")
    class CounterEnv(TextEnv):
        Config = CounterConfig
        roles = ("counter",)

        def reset(self, seed: int) -> None:
            self.begin_episode(seed)
            self.state = {"count": 0, "decisions": 0, "reward": 0.0}

        task_description = "Count to the target."

        def role_description(self, role: str | None) -> str:
            return "Reply: count."

        def screen(self, role: str | None) -> str:
            return f"count {self.state['count']} of {self.config.target}"

        def act(self, actor_role: str | None, action: str) -> StepResult:
            valid = action.strip() == "count"
            reward = float(valid and self.state["count"] < self.config.target)
            self.state["count"] += valid
            return self._spend(reward, valid)

        def note_turn(self, actor_role: str | None) -> StepResult:
            return self._spend(0.0, True)

        def skip(self) -> StepResult:
            self.require_running("skip()")
            return self._spend(0.0, True)

        def _spend(self, reward: float, valid: bool) -> StepResult:
            self.state["decisions"] += 1
            self.state["reward"] += reward
            return StepResult(reward, self.done, valid)

        @property
        def decisions_made(self) -> int:
            return self.state["decisions"]

        @property
        def done(self) -> bool:
            full = self.state["count"] >= self.config.target
            return full or self.decisions_made >= self.config.max_decisions

        def episode_metrics(self) -> dict[str, float]:
            success = float(self.state["count"] >= self.config.target)
            s = self.state
            return {"success": success, "reward": s["reward"], "decisions": float(s["decisions"])}

        def fork_state(self) -> dict:
            return dict(self.state)

        def load_fork_state(self, state: dict) -> None:
            self.state = dict(state)

        def expert_action(self, role: str | None) -> str | None:
            return None if self.done else "count"

        def expert_bid(self, role: str) -> float:
            return 0.0 if self.done else 0.8

    # 2. its YAML: only what differs from the schema's defaults
    (conf / "task" / "counter_recipe.yaml").write_text(
        "defaults: [counter_recipe_schema, _self_]\ntarget: 5\nmax_decisions: 8\n"
    )
    cfg = compose_train(conf, ["task=counter_recipe"])
    validate(cfg)
    for profile in ("debug=smoke", "debug=reward"):  # its budget is its own in a debug run too
        assert compose_train(conf, ["task=counter_recipe", profile]).task.max_decisions == 8
    env = make_env(OmegaConf.to_object(cfg.task))
    assert isinstance(env, CounterEnv) and env.config.target == 5
    # 3. the conformance checks every registered task runs (tests/test_fork_contract.py)
    check_task_contract(lambda: make_env(OmegaConf.to_object(cfg.task)), seeds=[0, 1])
    check_fork_contract(lambda: make_env(OmegaConf.to_object(cfg.task)), seeds=[0, 1])
    cfg.task.target = 0
    with pytest.raises(ConfigError, match=r"task\.target=0: must be >= 1"):
        validate(cfg)


@pytest.mark.parametrize(
    "group, registry", [("coordination", RULES), ("credit", CREDIT_RULES)], ids=["coord", "credit"]
)
def test_readme_lists_every_registered_rule_and_conf_has_its_yaml(group, registry):
    readme = (ROOT / "README.md").read_text()
    listed = re.search(rf"`{group}=((?:[a-z_]+\|)+[a-z_]+)`", readme)
    assert listed, f"README lists no {group}=a|b|..."
    assert sorted(listed.group(1).split("|")) == sorted(registry)
    assert {path.stem for path in (CONF / group).glob("*.yaml")} == set(registry)
