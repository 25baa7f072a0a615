"""``scripts/choice_room.py``: the room who acts leaves on a task, measured with scripted
policies. On the crafting main job's shared variant the one-step fork oracle beats every
non-adaptive way of choosing the actor; on its split variant nothing beats the owner schedule."""

from __future__ import annotations

import importlib.util
import random
import sys

from bidswarm.envs.experts import play_expert_episode
from conftest import ROOT


def load_script():
    spec = importlib.util.spec_from_file_location("choice_room", ROOT / "scripts/choice_room.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


choice_room = load_script()
WORLDS = 12


def crafting(actions: str):
    env = choice_room.build_env("crafting_wooden_pickaxe", actions, [], WORLDS)
    return env, env.heldout_seeds()[:WORLDS]


def test_the_shared_crafting_variant_has_room_above_15_points_with_an_interval_above_0():
    env, seeds = crafting("shared")
    room = choice_room.measure(env, seeds, branches=2)
    assert room.room_mean >= 15.0 and room.room_low > 0.0, room
    oracle = room.rewards["one-step fork oracle"]
    for name in ("best fixed schedule", "best single agent", "round-robin"):
        assert all(oracle[seed] >= room.rewards[name][seed] for seed in seeds), name
    assert sum(room.share.values()) > 0  # some steps have a novice beside the skilled role


def test_the_split_crafting_variant_has_no_room_and_its_best_schedule_is_the_owners():
    env, seeds = crafting("split")
    room = choice_room.measure(env, seeds, branches=2)
    assert room.room_mean == 0.0
    assert room.schedule == {
        "woodcutting": "logger",
        "handcrafting": "smith",
        "toolmaking": "smith",
    }
    assert room.rewards["best fixed schedule"] == room.rewards["expert owner"]


def test_the_expert_owner_plays_what_the_expert_loop_plays():
    env, seeds = crafting("shared")
    for seed in seeds:
        episode = play_expert_episode(env, seed, choice_room.LEVELS)
        owner = choice_room.play_world(env, seed, choice_room.expert_owner(random.Random(seed)))
        assert owner == episode.total_reward


def test_a_single_agent_is_the_fixed_schedule_that_sends_every_kind_to_it():
    env, seeds = crafting("shared")
    _, _, singles = choice_room.best_fixed_schedule(env, seeds[:4])
    for role in env.roles:
        for seed in seeds[:4]:
            always = choice_room.play_world(env, seed, lambda env, role=role: role)
            assert singles[role][seed] == always


def test_the_kind_of_a_step_is_what_its_task_groups_actions_by():
    env, _ = crafting("shared")
    env.reset(0)
    assert choice_room.step_kind(env) == "woodcutting"
    env.inventory = {"oak_log": 3}
    env._touch()
    assert choice_room.step_kind(env) == "handcrafting"
    navigation = choice_room.build_env("navigation_r2r", "shared", [], 1)
    navigation.reset(0)
    assert choice_room.step_kind(navigation) in {"turn", "move", "stop"}
