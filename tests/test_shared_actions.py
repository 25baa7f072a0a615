"""``task.actions=shared`` on every task: every role may issue every action, and a competence
or a view drawn per world decides whose action works (``envs/<task>/shared.py``). The task and
fork contracts, the PettingZoo and Gymnasium views and their own test suites, the experts
(competence-aware, never tied at the top, deciding from the observation alone, successful on
the training worlds), the monolithic agent's view, and each task's draw and its effects."""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys

import pytest

import test_envs_edges
import test_envs_wrappers
from bidswarm.config import ConfigError, validate
from bidswarm.envs import MONOLITHIC, TASKS, env_class
from bidswarm.envs.conformance import check_fork_contract, check_task_contract
from bidswarm.envs.crafting import CraftingConfig, CraftingEnv, shared
from bidswarm.envs.experts import play_expert_episode
from bidswarm.envs.memory import MemoryConfig
from bidswarm.envs.navigation import shared as navigation_shared
from bidswarm.envs.research import shared as research_shared
from canary import OVERRIDES
from conftest import ROOT
from test_config_errors import compose_train
from test_experts import expert_decisions

NAMES = sorted(TASKS)
LEVELS = [0.0, 0.2, 0.4, 0.6, 0.8]
SIZES = {"crafting": {"target": "wooden_pickaxe", "max_decisions": 30}}
"""Per task, the sizes of the variant's main job (crafting: the wooden pickaxe, 30 decisions)."""
EXPERT_SUCCESS = {"crafting": 1.0, "navigation": 1.0, "research": 1.0}
"""The experts' success on the first 200 training worlds of each shared variant, as
docs/environments.md states it (the split variant's, world for world)."""


@pytest.fixture
def shared_config(config):
    """Per task, the wrapper keyword arguments of its shared variant at the main job's sizes."""
    return lambda name: {**config(name), **SIZES.get(name, {}), "actions": "shared"}


def make(name: str, config, actions: str = "shared"):
    cls = env_class(name)
    return cls(cls.Config(**{**config(name), **SIZES.get(name, {}), "actions": actions}))


# -- the config ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_split_is_the_default_and_another_value_is_refused_naming_the_key(name, config):
    cls = env_class(name)
    assert cls.Config().actions == "split"
    with pytest.raises(
        ValueError, match=r"task\.actions='bad': choose one of \['shared', 'split'\]"
    ):
        cls(cls.Config(**config(name), actions="bad"))


@pytest.mark.parametrize("option", ["crafting_wooden_pickaxe", "navigation_r2r", "research"])
def test_a_run_config_with_a_bad_actions_value_is_refused_before_anything_starts(option):
    with pytest.raises(ConfigError, match=r"task\.actions='bad'"):
        validate(compose_train([f"task={option}", "task.actions=bad"]))
    validate(compose_train([f"task={option}", "task.actions=shared"]))


def test_the_variants_built_for_split_actions_refuse_shared_ones():
    with pytest.raises(ValueError, match=r"task\.actions='shared'.*private_inventory"):
        CraftingEnv(
            CraftingConfig(actions="shared", private_inventory=True, memory=MemoryConfig(size=2))
        )


# -- contracts -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_the_task_and_fork_contracts_hold(name, config):
    check_task_contract(lambda: make(name, config), seeds=[0, 1, 2, 5])
    check_fork_contract(lambda: make(name, config), seeds=[0, 1, 2, 3, 7, 11])


WRAPPER_CHECKS = [
    test_envs_wrappers.test_pettingzoo_api_test,
    test_envs_wrappers.test_pettingzoo_parallel_api_test,
    test_envs_wrappers.test_gymnasium_check_env,
    test_envs_wrappers.test_real_observations_lie_in_the_text_space,
    test_envs_wrappers.test_fork_contract_through_the_aec_env,
    test_envs_wrappers.test_fork_contract_through_the_parallel_env,
    test_envs_wrappers.test_fork_contract_through_the_gymnasium_env,
    test_envs_wrappers.test_experts_through_the_aec_env_earn_what_our_expert_loop_earns,
    test_envs_wrappers.test_experts_through_the_parallel_env_earn_what_our_expert_loop_earns,
    test_envs_wrappers.test_the_monolithic_expert_through_gymnasium_earns_what_our_loop_earns,
    test_envs_edges.test_integer_like_seeds_play_the_same_world,
    test_envs_edges.test_every_wrapper_pickles_mid_episode_and_plays_on_the_same,
]
"""The wrappers' own suites (``tests/test_envs_wrappers.py``, ``tests/test_envs_edges.py``),
run on the shared variants."""


@pytest.mark.parametrize("check", WRAPPER_CHECKS, ids=lambda check: check.__name__[5:])
@pytest.mark.parametrize("name", NAMES)
def test_the_pettingzoo_and_gymnasium_suites_pass(check, name, shared_config):
    arguments = check.__code__.co_varnames[: check.__code__.co_argcount]
    given = {"name": name, "config": shared_config}
    for kind in ("aec", "parallel", "gymnasium") if "kind" in arguments else [None]:
        check(**{key: given.get(key, kind) for key in arguments})


@pytest.mark.parametrize("option", ["open_order", "open_hops"])
@pytest.mark.parametrize("actions", ["split", "shared"])
@pytest.mark.parametrize("check", WRAPPER_CHECKS, ids=lambda check: check.__name__[5:])
def test_the_suites_pass_on_research_with_an_open_order(check, actions, option, config):
    """The same suites on research's ``task.open_order`` and ``task.open_hops``
    (docs/environments.md), whose experts bid for two roles at the steps they open."""
    arguments = check.__code__.co_varnames[: check.__code__.co_argcount]
    given = {
        "name": "research",
        "config": lambda name: {**config(name), "actions": actions, option: True},
    }
    for kind in ("aec", "parallel", "gymnasium") if "kind" in arguments else [None]:
        check(**{key: given.get(key, kind) for key in arguments})


# -- the experts ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_the_experts_succeed_on_the_training_worlds_at_the_stated_rate(name, config):
    env = make(name, config)
    episodes = [play_expert_episode(env, seed, LEVELS) for seed in env.train_seeds()[:200]]
    assert statistics.fmean(e.metrics["success"] for e in episodes) >= EXPERT_SUCCESS[name]
    assert all(episode.skipped == 0 for episode in episodes)


@pytest.mark.parametrize("name", NAMES)
def test_the_top_bid_is_never_tied_and_its_owners_action_is_valid(name, config):
    env = make(name, config)
    for seed in env.train_seeds()[:40]:
        env.reset(seed)
        while not env.done:
            bids = sorted(((env.expert_bid(role), role) for role in env.roles), reverse=True)
            assert bids[0][0] > bids[1][0], (seed, env.decisions_made, bids)
            assert env.step(bids[0][1], env.expert_action(bids[0][1]) or "").valid


@pytest.mark.parametrize("name", NAMES)
def test_the_experts_decide_from_what_each_role_sees(name, config):
    """Each role's bid and action, and the monolithic agent's action, are functions of its
    observation: what it knows of the draw is on its screen (``tests/test_experts.py``)."""
    env = make(name, config)
    seen = expert_decisions(env, env.train_seeds()[:300])
    conflicts = {key: decisions for key, decisions in seen.items() if len(decisions) > 1}
    assert not conflicts, list(conflicts.items())[:2]


@pytest.mark.parametrize("name", NAMES)
def test_the_monolithic_agent_earns_what_the_team_of_experts_earns(name, config):
    """The monolithic agent has the team's best competence and sees the union of the views."""
    env = make(name, config)
    for seed in env.heldout_seeds()[:12]:
        team = play_expert_episode(env, seed, LEVELS)
        env.reset(seed)
        while not env.done:
            assert env.step(MONOLITHIC, env.expert_action(MONOLITHIC) or "").valid
        assert env.episode_metrics() == team.metrics


@pytest.mark.parametrize("name", NAMES)
def test_no_fixed_role_is_the_experts_choice_in_every_world(name, config):
    """Over worlds, every role is sometimes the one the experts pick and sometimes not."""
    env = make(name, config)
    chosen = {role: 0 for role in env.roles}
    for seed in env.heldout_seeds()[:24]:
        episode = play_expert_episode(env, seed, LEVELS)
        for role in set(episode.actors):
            chosen[role] += 1
    assert all(0 < count < 24 for count in chosen.values()), chosen


def role_actions(episode, roles: bool) -> list:
    """The episode's action demonstrations to role agents (``roles``), or every other one (the
    bids and the monolithic agent's actions)."""
    return [
        d for d in episode.demonstrations if (d.kind == "action" and d.role is not None) == roles
    ]


@pytest.mark.parametrize("actions", ["split", "shared"])
@pytest.mark.parametrize("name", NAMES)
def test_same_reply_teaches_each_action_to_every_role_whose_expert_says_it(name, actions, config):
    """``sft.action_roles=same_reply``: a step's action demonstration goes to the actor and to
    every role whose expert replies the same there; bids, actors and rewards are unchanged.
    Split actions are disjoint, so nothing is added there; on shared crafting every role's
    expert replies the plan's next step, so every agent learns every step."""
    env = make(name, config, actions)
    for seed in env.train_seeds()[:6]:
        actor_only = play_expert_episode(env, seed, LEVELS)
        every = play_expert_episode(env, seed, LEVELS, same_reply=True)
        assert (every.actors, every.total_reward) == (actor_only.actors, actor_only.total_reward)
        assert role_actions(every, False) == role_actions(actor_only, False)
        taught = role_actions(every, True)
        replies = [d.reply for d in role_actions(actor_only, False) if d.kind == "action"]
        if actions == "split" or name != "crafting":
            assert taught == role_actions(actor_only, True)
        else:
            assert len(taught) == len(env.roles) * len(replies)
            assert [d.reply for d in taught] == [r for r in replies for _ in env.roles]
            assert [d.role for d in taught] == list(env.roles) * len(replies)


# -- crafting: skills ----------------------------------------------------------------------------
def crafting(**overrides) -> CraftingEnv:
    env = CraftingEnv(CraftingConfig(**{**SIZES["crafting"], "actions": "shared", **overrides}))
    env.reset(0)
    return env


def test_the_skill_draw_varies_across_worlds_with_one_skilled_role_per_skill():
    roles = CraftingEnv.roles
    draws = [shared.Skills(seed, roles).levels for seed in range(200)]
    assert len({tuple(d.items()) for d in draws}) > 150
    for skill in shared.SKILLS:
        for draw in draws:
            assert sorted(draw[skill])[1:] in (["skilled", "unable"], ["unable", "unable"])
            assert draw[skill].count("skilled") == 1
        for index in range(len(roles)):
            levels = [draw[skill][index] for draw in draws]
            assert {"skilled", "novice", "unable"} == set(levels)
            alone = [d for d in draws if d[skill][index] == "skilled" and "novice" not in d[skill]]
            assert alone, f"{roles[index]} is never the only one able at {skill}"


def test_each_role_sees_its_own_skills_and_the_monolithic_agent_every_roles():
    env = crafting()
    for role in env.roles:
        own = ", ".join(f"{s} {env.skills.level(role, s)}" for s in env.skills_shown)
        assert env.observation(role).endswith(f"your skills: {own}.")
    assert env.skills_shown == ["woodcutting", "handcrafting", "toolmaking"]
    team = env.observation(MONOLITHIC)
    for skill in env.skills_shown:
        for role, level in zip(env.roles, env.skills.levels[skill], strict=True):
            assert (f"{role} {level}" in team) == (level != "unable")


def test_every_role_may_give_every_instruction_and_its_skill_decides_the_outcome():
    env = crafting()
    env.inventory = {"oak_log": 2}
    env._touch()
    levels = dict(zip(env.roles, env.skills.levels["handcrafting"], strict=True))
    unable = next(role for role, level in levels.items() if level == "unable")
    skilled = next(role for role, level in levels.items() if level == "skilled")
    result = env.step(unable, "craft planks")
    assert (
        result.valid
        and result.message == "craft planks: failed, no handcrafting skill, 1 oak log spoilt"
    )
    assert env.inventory["oak_log"] == 1
    outcomes = []
    for seed in range(60):
        env.reset(seed)
        env.inventory = {"oak_log": 1}
        env._touch()
        levels = dict(zip(env.roles, env.skills.levels["handcrafting"], strict=True))
        skilled = next(role for role, level in levels.items() if level == "skilled")
        outcomes.append(env.step(skilled, "craft planks").message)
    assert all("no handcrafting skill" not in m and "novice" not in m for m in outcomes)
    assert sum(m == "craft planks: +4 oak planks" for m in outcomes) > 45
    assert "not an instruction" in env.step(unable, "craft the moon").message


@pytest.mark.parametrize("target", ["iron_pickaxe", "stone_bricks", "torch"])
@pytest.mark.parametrize("bids", ["graded", "two_level"])
def test_longer_targets_list_their_skills_and_never_tie_at_the_top(target, bids):
    env = CraftingEnv(CraftingConfig(target=target, expert_bids=bids, actions="shared"))
    for seed in range(8):
        episode = play_expert_episode(env, seed, LEVELS)
        bid_steps = [d for d in episode.demonstrations if d.kind == "bid"]
        for step in range(0, len(bid_steps), len(env.roles)):
            top = sorted((float(d.reply) for d in bid_steps[step : step + 3]), reverse=True)
            assert top[0] == 0.8 and top[1] < 0.8
    assert set(env.skills_shown) <= set(shared.SKILLS) and "handcrafting" in env.skills_shown


def test_a_novice_succeeds_about_as_often_as_stated():
    env, tries, worked = crafting(), 0, 0
    for seed in range(400):
        env.reset(seed)
        levels = env.skills.levels["woodcutting"]
        if "novice" not in levels:
            continue
        novice = env.roles[levels.index("novice")]
        tries += 1
        worked += "novice" not in env.step(novice, "find trees").message
    assert tries > 100
    assert abs(worked / tries - shared.NOVICE_SUCCESS) < 0.12


def test_the_split_variant_shows_no_skills_and_keeps_its_own_instructions():
    env = CraftingEnv(CraftingConfig(**SIZES["crafting"]))
    env.reset(0)
    assert env.skills is None and "skills" not in env.observation("logger")
    assert not env.step("smith", "chop a tree").valid


# -- navigation: who knows the room --------------------------------------------------------------
def test_only_the_role_that_knows_the_room_sees_its_doorways(config):
    env = make("navigation", config)
    knowers = set()
    for seed in env.heldout_seeds()[:24]:
        env.reset(seed)
        knower = [role for role in env.roles if env.knows(role)]
        assert len(knower) == 1
        knowers.add(knower[0])
        for role in env.roles:
            sees_doors = "door to" in env.observation(role)
            assert sees_doors == (role == knower[0])
            assert (navigation_shared.UNKNOWN_ROOM in env.observation(role)) != sees_doors
        assert "door to" in env.observation(MONOLITHIC)
        # Any role's command is carried out, known room or not.
        other = next(role for role in env.roles if role != knower[0])
        assert env.step(other, "turn left 15 degree").valid
    assert knowers == set(env.roles)


# -- research: whose tools work ------------------------------------------------------------------
def test_a_tool_works_for_the_role_the_world_drew_and_no_other(config):
    env = make("research", config)
    owners = set()
    for seed in env.heldout_seeds()[:12]:
        env.reset(seed)
        tools = research_shared.draw_tools(seed, env.roles)
        owners |= set(tools.items())
        works = tools["browser.search"]
        for role in env.roles:
            own = [tool for tool in research_shared.TOOLS if tools[tool] == role]
            assert f"Tools: {', '.join(own) or 'none'}." in env.observation(role)
            if role != works:
                result = env.step(role, "browser.search(anything)")
                assert not result.valid
                assert result.message == f"the {role}'s browser.search does not work in this world"
        assert env.step(works, "browser.search(anything)").valid
        assert "Tools:" not in env.observation(MONOLITHIC)
    assert len(owners) == len(env.roles) * len(research_shared.TOOLS)


def test_the_draws_are_fixed_by_the_seed_and_differ_between_seeds():
    roles = ("a", "b", "c")
    tools = [tuple(research_shared.draw_tools(seed, roles).values()) for seed in range(40)]
    assert tools == [tuple(research_shared.draw_tools(s, roles).values()) for s in range(40)]
    assert len(set(tools)) > 20
    rooms = [navigation_shared.draw_rooms(seed, 6, 3) for seed in range(40)]
    assert rooms == [navigation_shared.draw_rooms(seed, 6, 3) for seed in range(40)]
    assert len(set(rooms)) > 30


# -- a run -----------------------------------------------------------------------------------------
SHARED_RUNS = {
    "crafting": ["task=crafting_wooden_pickaxe_shared"],
    "navigation": ["task=navigation_r2r", "task.actions=shared"],
    "research": ["task=research", "task.actions=shared"],
}
"""Task -> the overrides of its shared variant (crafting's main job has an option of its own,
whose ``debug=reward`` sizes are ``conf/debug/task/reward_crafting_wooden_pickaxe_shared.yaml``)."""


@pytest.mark.slow
@pytest.mark.parametrize("task", sorted(SHARED_RUNS))
def test_debug_reward_earns_training_reward_with_shared_actions(task, tmp_path):
    """``debug=reward`` (each task's own sizes) on the shared variant: its last lines print a
    training reward above 0 (about 70 s crafting, 60 s navigation, 90 s research on 2 cores)."""
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    command = [
        sys.executable,
        "-m",
        "bidswarm.train",
        *OVERRIDES,
        f"hydra.run.dir={tmp_path / 'run'}",
        *SHARED_RUNS[task],
    ]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "actions: shared" in (tmp_path / "run" / "resolved_config.yaml").read_text()
    tail = result.stdout.strip().splitlines()[-6:]
    line = next(x for x in tail if "training reward per RL update" in x)
    rewards = [float(v) for v in re.findall(r"(-?\d+\.\d+)", line.split(":", 1)[1])]
    assert len(rewards) == 3 and sum(rewards) > 0.0, line
