"""The MineStudio backend's pure parts, and its clear failure when MineStudio is absent."""

from __future__ import annotations

import importlib.util

import pytest

from bidswarm.envs.crafting import ROLE_INSTRUCTIONS, CraftingConfig, techtree
from bidswarm.envs.crafting.minestudio import (
    STEVE_PROMPTS,
    MineStudioCraftingEnv,
    inventory_counts,
    new_milestones,
    observation_text,
    reward_callback_config,
    steve_prompt,
)

HAS_MINESTUDIO = importlib.util.find_spec("minestudio") is not None


def test_slot_inventory_is_summed_per_item() -> None:
    raw = {
        0: {"type": "oak_log", "quantity": 3},
        1: {"type": "air", "quantity": 0},
        5: {"type": "minecraft:oak_log", "quantity": 2},
        7: {"type": "stick", "quantity": 4},
    }
    assert inventory_counts(raw) == {"oak_log": 5, "stick": 4}


def test_flat_inventory_drops_empty_entries() -> None:
    assert inventory_counts({"cobblestone": 9, "air": 3, "coal": 0}) == {"cobblestone": 9}


def test_observation_text_is_short_and_names_items_in_game_words() -> None:
    text = observation_text(
        4, 120, {"oak_planks": 3, "crafting_table": 1}, ["smith craft planks: done"]
    )
    assert text == (
        "step 4 of 120. inventory: 3 oak planks, 1 crafting table. last: smith craft planks: done."
    )
    assert "empty" in observation_text(1, 120, {}, [])


def test_milestones_from_inventory_are_paid_once() -> None:
    milestones = techtree.default_milestones("iron_pickaxe")
    obtained: set[str] = set()
    assert new_milestones({"oak_log": 2}, milestones, obtained) == 2.0
    assert new_milestones({"oak_log": 5}, milestones, obtained) == 0.0
    assert new_milestones({"oak_log": 5, "stick": 4, "dirt": 3}, milestones, obtained) == 4.0
    assert obtained == {"oak_log", "stick"}


def test_reward_callback_config_pays_each_milestone_once() -> None:
    milestones = techtree.default_milestones("stone_pickaxe")
    config = reward_callback_config(milestones)
    assert sum(entry["reward"] for entry in config) == pytest.approx(140.0)
    assert all(entry["max_reward_times"] == 1 for entry in config)
    events = {entry["objects"][0]: entry["event"] for entry in config}
    assert events["oak_log"] == "pickup" and events["cobblestone"] == "pickup"
    assert events["stone_pickaxe"] == "craft_item"
    assert len({entry["identity"] for entry in config}) == len(config)


def test_every_instruction_has_a_steve_prompt() -> None:
    every = {i for instructions in ROLE_INSTRUCTIONS.values() for i in instructions}
    assert set(STEVE_PROMPTS) == every
    assert all(steve_prompt(i) for i in every)


@pytest.mark.skipif(HAS_MINESTUDIO, reason="MineStudio is installed: the missing-package path")
def test_missing_minestudio_is_a_clear_error() -> None:
    with pytest.raises(ImportError, match="pip install minestudio"):
        MineStudioCraftingEnv(CraftingConfig())


def test_minestudio_reward_callback_accepts_our_config() -> None:
    callbacks = pytest.importorskip(
        "minestudio.simulator.callbacks", reason="MineStudio is not installed"
    )
    callback = callbacks.RewardsCallback(
        reward_callback_config(techtree.default_milestones("torch"))
    )
    assert len(callback.reward_cfg) == len(techtree.tech_path("torch"))
