"""The embedded crafting world: instructions, parsing, recipes, milestones, budget, experts."""

from __future__ import annotations

import math
import re
import statistics
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import minecraft_data
import pytest

from bidswarm.envs.crafting import ROLE_INSTRUCTIONS, CraftingConfig, CraftingEnv, expert, techtree
from bidswarm.envs.experts import play_expert_episode

BID_LEVELS = [0.0, 0.2, 0.4, 0.6, 0.8]
CONF = Path(__file__).resolve().parents[1] / "conf"


def make(**overrides) -> CraftingEnv:
    env = CraftingEnv(CraftingConfig(**overrides))
    env.reset(0)
    return env


# -- instructions and parsing ------------------------------------------------------------------
def _listed(description: str) -> set[str]:
    return set(description.split(": ", 1)[1].rstrip(".").split("; "))


def test_instruction_sets_are_disjoint_and_monolithic_owns_their_union() -> None:
    sets = [set(ROLE_INSTRUCTIONS[role]) for role in CraftingEnv.roles]
    union = set().union(*sets)
    assert sum(len(s) for s in sets) == len(union)
    env = make()
    for role, instructions in zip(env.roles, sets, strict=True):
        assert _listed(env.role_description(role)) == instructions
    assert _listed(env.role_description(None)) == union


@pytest.mark.parametrize(
    "reply",
    ["", "   ", "???", "dance wildly", "0.4", "craft the moon", "chop", "chop a tree please"],
)
def test_garbage_is_a_wasted_turn_with_feedback(reply: str) -> None:
    env = make()
    before = env.fork_state()
    result = env.step("logger", reply)
    assert not result.valid and result.reward == 0.0
    assert env.decisions_made == 1
    assert env.inventory == dict(before["inventory"])
    assert "not a logger instruction" in env.observation("miner")
    assert env.episode_metrics()["invalid_replies"] == 1.0


def test_another_roles_instruction_is_invalid_but_the_monolithic_agent_owns_it() -> None:
    env = make()
    assert not env.step("smith", "chop a tree").valid
    assert env.step(None, "chop a tree").valid
    assert not env.step("logger", "craft planks").valid


@pytest.mark.parametrize(
    "reply",
    ["chop a tree", "Chop a Tree.", "  CHOP   a tree!! ", "We need wood first.\nchop a tree\n"],
)
def test_parsing_ignores_case_spacing_punctuation_and_accepts_a_last_line(reply: str) -> None:
    env = make()
    result = env.step("logger", reply)
    assert result.valid
    assert "logger chop a tree" in env.observation("logger")


def test_reasoning_that_does_not_end_in_an_instruction_is_invalid() -> None:
    env = make()
    assert not env.step("logger", "chop a tree\nand then craft planks").valid


def test_unknown_role_and_target_are_clear_errors() -> None:
    env = make()
    with pytest.raises(ValueError, match="unknown role"):
        env.step("builder", "chop a tree")
    with pytest.raises(ValueError, match=r"task\.target"):
        CraftingEnv(CraftingConfig(target="diamond_sword"))


# -- the game data -----------------------------------------------------------------------------
def _raw_variants(data, item: str) -> list[tuple[dict[str, int], bool, int]]:
    """Every recipe variant of ``item``, re-read from the raw data: (counts, needs table, yield)."""
    variants = []
    for raw in data.recipes[str(data.items_name[item]["id"])]:
        if "inShape" in raw:
            cells = [c for row in raw["inShape"] for c in row if c is not None]
            big = len(raw["inShape"]) > 2 or any(len(row) > 2 for row in raw["inShape"])
        else:
            cells, big = raw["ingredients"], len(raw["ingredients"]) > 4
        counts: dict[str, int] = {}
        for cell in cells:
            name = data.items[cell]["name"]
            counts[name] = counts.get(name, 0) + 1
        variants.append((counts, big, raw["result"]["count"]))
    return variants


@pytest.mark.parametrize("target", techtree.TARGETS)
def test_every_item_on_each_path_is_real_1_16_data(target: str) -> None:
    data = minecraft_data("1.16.4")
    techtree.check_names()
    for item in techtree.tech_path(target):
        assert item in data.items_name, item
        if item in techtree.SOURCE_BLOCKS:
            source = techtree.SOURCE_BLOCKS[item]
            drops = {entry["item"] for entry in data.blockLoot[source]}
            assert item in drops, (source, drops)
        elif item not in techtree.SMELTING.values():
            recipe = techtree.recipe(item)
            ours = (dict(recipe.ingredients), recipe.needs_table, recipe.count)
            assert ours in _raw_variants(data, item), item


def test_known_facts_of_the_iron_pickaxe_path() -> None:
    assert techtree.recipe("iron_pickaxe").ingredients == (("iron_ingot", 3), ("stick", 2))
    assert techtree.recipe("iron_pickaxe").needs_table
    assert techtree.recipe("furnace").ingredients == (("cobblestone", 8),)
    assert not techtree.recipe("crafting_table").needs_table
    assert techtree.weakest_tool("stone") == "wooden_pickaxe"
    assert techtree.weakest_tool("iron_ore") == "stone_pickaxe"
    assert techtree.weakest_tool("oak_log") is None
    assert set(techtree.tech_path("iron_pickaxe")) == set(
        techtree.default_milestones("iron_pickaxe")
    )


def test_mining_stone_without_a_wooden_pickaxe_fails() -> None:
    env = make()
    env.depth = env.stone_depth
    result = env.step("miner", "mine stone")
    assert result.valid and result.reward == 0.0
    assert "needs a wooden pickaxe" in result.message
    assert "cobblestone" not in env.inventory
    env.inventory["wooden_pickaxe"] = 1
    env.inventory["stone_pickaxe"] = 0
    for _ in range(10):
        env.step("miner", "mine stone")
    assert env.inventory.get("cobblestone", 0) > 0


def test_iron_ore_needs_a_stone_pickaxe() -> None:
    env = make()
    env.inventory["wooden_pickaxe"] = 1
    env.depth, env.iron_seen = env.iron_depth, 2
    assert "needs a stone pickaxe" in env.step("miner", "mine iron ore").message


# -- milestones, budget, skip, determinism -----------------------------------------------------
@pytest.mark.parametrize("target", techtree.TARGETS)
def test_default_milestones_sum_to_140(target: str) -> None:
    milestones = techtree.default_milestones(target)
    assert math.isclose(sum(milestones.values()), 140.0)
    assert target in milestones


def test_iron_pickaxe_split_is_the_documented_one() -> None:
    assert techtree.default_milestones("iron_pickaxe") == {
        "oak_log": 2,
        "oak_planks": 3,
        "stick": 4,
        "crafting_table": 5,
        "wooden_pickaxe": 8,
        "cobblestone": 8,
        "stone_pickaxe": 12,
        "iron_ore": 18,
        "furnace": 12,
        "iron_ingot": 24,
        "iron_pickaxe": 44,
    }


def test_milestones_are_paid_once() -> None:
    env = make()
    env.trees = 5
    rewards = []
    while env.inventory.get("oak_log", 0) < 4:
        rewards.append(env.step("logger", "chop a tree").reward)
    assert sum(rewards) == 2.0
    assert env.episode_metrics()["milestone/oak_log"] == 1.0
    assert env.episode_metrics()["milestone/oak_planks"] == 0.0


def test_custom_milestones_override_the_default() -> None:
    env = make(milestone_rewards={"oak_log": 1.5})
    env.trees = 5
    total = sum(env.step("logger", "chop a tree").reward for _ in range(6))
    assert total == 1.5
    assert set(env.episode_metrics()) >= {"milestone/oak_log", "success", "reward", "decisions"}


def test_the_budget_ends_the_episode() -> None:
    env = make(max_decisions=5)
    results = [env.step("miner", "dig down") for _ in range(4)] + [env.skip()]
    assert [r.done for r in results] == [False] * 4 + [True]
    assert env.done and env.episode_metrics()["decisions"] == 5.0
    assert env.episode_metrics()["success"] == 0.0
    with pytest.raises(RuntimeError):
        env.step("miner", "dig down")


def test_skip_advances_only_the_decision_counter() -> None:
    env = make()
    env.step("logger", "find trees")
    before = env.fork_state()
    result = env.skip()
    after = env.fork_state()
    assert result.reward == 0.0
    assert after["decisions"] == before["decisions"] + 1
    assert {k: v for k, v in after.items() if k != "decisions"} == {
        k: v for k, v in before.items() if k != "decisions"
    }


def _trace(seed: int) -> list:
    env = make()
    env.reset(seed)
    trace = []
    while not env.done:
        role = env.roles[env.decisions_made % 3]
        result = env.step(role, env.expert_action(role) or "wait")
        trace.append((result, env.observation(role)))
    return trace


def test_same_seed_same_episode_different_seeds_different_worlds() -> None:
    assert _trace(5) == _trace(5)
    worlds = set()
    env = make()
    for seed in range(20):
        env.reset(seed)
        worlds.add((env.stone_depth, env.iron_depth, round(env.iron_rate, 6)))
    assert len(worlds) > 15


def test_train_and_heldout_seeds_are_disjoint() -> None:
    env = make()
    assert len(env.heldout_seeds()) == 32
    assert not set(env.train_seeds()) & set(env.heldout_seeds())


def test_observations_are_short() -> None:
    env = make()
    lengths = []
    for seed in env.heldout_seeds()[:6]:
        episode = play_expert_episode(env, seed, BID_LEVELS)
        lengths += [len(d.observation.split()) for d in episode.demonstrations]
    assert statistics.mean(lengths) < 60
    assert max(lengths) < 75


# -- experts -----------------------------------------------------------------------------------
def test_expert_actions_belong_to_their_role_and_bids_are_in_range() -> None:
    env = make()
    for seed in (1, 2):
        env.reset(seed)
        while not env.done:
            for role in env.roles:
                action = env.expert_action(role)
                assert action is None or action in ROLE_INSTRUCTIONS[role]
                assert 0.0 <= env.expert_bid(role) <= 1.0
                assert (env.expert_bid(role) == 0.0) == (action is None)
            top = max(env.roles, key=env.expert_bid)
            env.step(top, env.expert_action(top))


@dataclass
class _SeenState:
    """The planner's inputs as read back from an observation's text alone."""

    config: CraftingConfig
    inventory: dict[str, int]
    depth: int
    trees: int
    in_stone: bool
    in_iron_layer: bool
    coal_seen: int
    iron_seen: int
    fuel_left: float
    plan_cache: None = None


def _read_observation(text: str, config: CraftingConfig) -> _SeenState:
    """Parse ``CraftingEnv.observation`` back into what the expert may use (test-only reader)."""
    item_of = {techtree.display_name(i): i for i in techtree.game_data().items_name}
    inventory_text = re.search(r"inventory: (.*?)\.(?: furnace| near)", text).group(1)
    inventory = {}
    if inventory_text != "empty":
        for part in inventory_text.split(", "):
            count, name = part.split(" ", 1)
            inventory[item_of[name]] = int(count)
    fuel = re.search(r"furnace fuel: ([0-9.]+) items", text)
    near = re.search(r"near: (.*?)\. last:", text).group(1)
    trees = re.match(r"surface, (no|\d+) trees?", near)
    depth = re.match(r"depth (\d+)", near)
    coal = re.search(r"(\d+) coal ore", near)
    iron = re.search(r"(\d+) iron ore", near)
    return _SeenState(
        config=config,
        inventory=inventory,
        depth=int(depth.group(1)) if depth else 0,
        trees=0 if trees is None or trees.group(1) == "no" else int(trees.group(1)),
        in_stone=depth is not None and "dirt" not in near,
        in_iron_layer="iron layer" in near,
        coal_seen=int(coal.group(1)) if coal else 0,
        iron_seen=int(iron.group(1)) if iron else 0,
        fuel_left=float(fuel.group(1)) if fuel else 0.0,
    )


@pytest.mark.parametrize("target", ["iron_pickaxe", "stone_pickaxe", "torch"])
@pytest.mark.parametrize("expert_bids", expert.EXPERT_BIDS)
def test_expert_decisions_replay_from_the_observation_alone(target: str, expert_bids: str) -> None:
    """Every expert bid and action follows from the text an agent sees: no hidden world state
    (e.g. the true iron depth) decides what the experts demonstrate."""
    env = make(target=target, expert_bids=expert_bids)
    checked = 0
    for seed in env.train_seeds()[:25]:
        env.reset(seed)
        while not env.done:
            for role in env.roles:
                seen = _read_observation(env.observation(role), env.config)
                assert expert.expert_action(seen, role) == env.expert_action(role), seed
                assert expert.expert_bid(seen, role, expert_bids) == env.expert_bid(role), seed
                checked += 1
            top = max(env.roles, key=env.expert_bid)
            if env.expert_bid(top) == 0.0:
                env.skip()
            else:
                env.step(top, env.expert_action(top))
    assert checked > 500


def test_graded_expert_bids_use_every_level() -> None:
    """``graded`` demonstrations hold every non-zero level, not only the top two (close races
    are what counterfactual forks can flip)."""
    env = make()
    levels = Counter(
        d.reply
        for seed in env.train_seeds()[:8]
        for d in play_expert_episode(env, seed, BID_LEVELS).demonstrations
        if d.kind == "bid"
    )
    assert {"0.2", "0.4", "0.6", "0.8"} <= set(levels)
    assert all(levels[level] >= 10 for level in ("0.2", "0.4", "0.6", "0.8")), levels


def test_expert_team_obtains_the_iron_pickaxe_on_most_heldout_seeds() -> None:
    env = make()
    episodes = [play_expert_episode(env, seed, BID_LEVELS) for seed in env.heldout_seeds()[:10]]
    success = [e.metrics["success"] for e in episodes]
    assert statistics.mean(success) >= 0.7
    for episode in episodes:
        assert episode.decisions <= 120
        assert math.isclose(episode.total_reward, episode.metrics["reward"])
        if episode.metrics["success"]:
            assert math.isclose(episode.total_reward, 140.0)


@pytest.mark.parametrize("target", [t for t in techtree.TARGETS if t != "iron_pickaxe"])
def test_expert_team_obtains_every_other_target(target: str) -> None:
    env = make(target=target)
    for seed in env.heldout_seeds()[:3]:
        episode = play_expert_episode(env, seed, BID_LEVELS)
        assert episode.metrics["success"] == 1.0, (target, seed)
        assert math.isclose(episode.total_reward, 140.0)


def test_monolithic_expert_plays_alone() -> None:
    env = make()
    env.reset(1_000_001)
    while not env.done:
        env.step(None, env.expert_action(None) or "")
    assert env.episode_metrics()["milestone/stone_pickaxe"] == 1.0


# -- configs -----------------------------------------------------------------------------------
@pytest.mark.parametrize("target", techtree.TARGETS)
def test_task_yaml_composes_against_the_schema(target: str) -> None:
    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    ConfigStore.instance().store(group="task", name="crafting_schema", node=CraftingConfig)
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose(overrides=[f"+task=crafting_{target}"])
    GlobalHydra.instance().clear()
    config = OmegaConf.to_object(cfg.task)
    assert isinstance(config, CraftingConfig)
    assert config.target == target
    env = CraftingEnv(config)
    assert math.isclose(sum(env.milestones.values()), 140.0)
