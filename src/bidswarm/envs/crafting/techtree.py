"""The Minecraft 1.16 tech tree of the crafting task, read from the ``minecraft-data`` package.

Recipes (ingredients, counts, whether a crafting table is needed), which tool harvests which
block, what a block drops and how hard it is come from the real game data, loaded once. Only
smelting and fuel are absent from that data; :data:`SMELTING` and :data:`FUEL_ITEMS_SMELTED` are
the minimal tables this task needs, and :func:`check_names` verifies every name against the data.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import minecraft_data

MINECRAFT_VERSION = "1.16.4"

SMELTING: dict[str, str] = {"iron_ore": "iron_ingot", "cobblestone": "stone"}
"""Furnace input -> output (vanilla 1.16 furnace recipes used by the task)."""

FUEL_ITEMS_SMELTED: dict[str, float] = {
    "coal": 8.0,
    "charcoal": 8.0,
    "oak_log": 1.5,
    "oak_planks": 1.5,
    "stick": 0.5,
}
"""Fuel item -> items it smelts (vanilla burn time / 200 ticks)."""

PICKAXE_SPEED: dict[str, float] = {
    "wooden_pickaxe": 2.0,
    "stone_pickaxe": 4.0,
    "iron_pickaxe": 6.0,
    "diamond_pickaxe": 8.0,
}
"""Mining speed multiplier of each pickaxe (vanilla tool tiers; the hand is 1)."""

SOURCE_BLOCKS: dict[str, str] = {
    "oak_log": "oak_log",
    "cobblestone": "stone",
    "coal": "coal_ore",
    "iron_ore": "iron_ore",
}
"""Raw item -> the block it is harvested from (the drop itself is checked against the data)."""

WOOD_FAMILY = "oak"
"""Recipes with several wood variants use this one (the embedded world grows oak trees)."""

TARGETS = (
    "iron_pickaxe",
    "wooden_pickaxe",
    "stone_pickaxe",
    "furnace",
    "torch",
    "stone_bricks",
)
"""Targets with a task config (``conf/task/crafting_<target>.yaml``)."""


@dataclass(frozen=True)
class Recipe:
    """A crafting recipe: ``count`` of ``result`` from ``ingredients``; 3x3 shapes need a table."""

    result: str
    count: int
    ingredients: tuple[tuple[str, int], ...]
    needs_table: bool


@dataclass(frozen=True)
class Block:
    """A harvestable block: its hardness, the pickaxes that harvest it (empty: any), its drop."""

    name: str
    hardness: float
    harvest_tools: frozenset[str]
    drop: str
    drop_range: tuple[int, int]


@functools.cache
def game_data() -> minecraft_data.mod:
    """The minecraft-data tables of :data:`MINECRAFT_VERSION` (loaded once)."""
    return minecraft_data(MINECRAFT_VERSION)


def _item_name(item_id: int) -> str:
    return game_data().items[item_id]["name"]


def _recipe_ingredients(raw: dict) -> tuple[tuple[tuple[str, int], ...], bool]:
    counts: dict[str, int] = {}
    if "inShape" in raw:
        rows = raw["inShape"]
        cells = [cell for row in rows for cell in row if cell is not None]
        needs_table = len(rows) > 2 or max(len(row) for row in rows) > 2
    else:
        cells = list(raw["ingredients"])
        needs_table = len(cells) > 4
    for cell in cells:
        name = _item_name(cell)
        counts[name] = counts.get(name, 0) + 1
    return tuple(sorted(counts.items())), needs_table


@functools.cache
def recipe(result: str) -> Recipe:
    """The recipe of ``result`` from the data, preferring oak wood and the first listed variant."""
    data = game_data()
    if result not in data.items_name:
        raise KeyError(f"{result!r} is not a Minecraft {MINECRAFT_VERSION} item")
    variants = data.recipes.get(str(data.items_name[result]["id"])) or data.recipes.get(
        data.items_name[result]["id"]
    )
    if not variants:
        raise KeyError(f"{result!r} has no crafting recipe in the data")
    parsed = [(*_recipe_ingredients(raw), raw["result"]["count"]) for raw in variants]

    def preference(entry: tuple) -> int:
        ingredients = entry[0]
        wooden = [name for name, _ in ingredients if name.endswith(("_planks", "_log"))]
        if wooden:
            return 0 if all(name.startswith(WOOD_FAMILY) for name in wooden) else 2
        return 1

    ingredients, needs_table, count = min(parsed, key=preference)
    return Recipe(result, count, ingredients, needs_table)


@functools.cache
def block(name: str) -> Block:
    """A block's hardness, harvest tools and (non-silk-touch) drop, from the data."""
    data = game_data()
    raw = data.blocks_name[name]
    tools = frozenset(_item_name(int(i)) for i in (raw.get("harvestTools") or {}))
    loot = [entry for entry in data.blockLoot[name] if not entry.get("silkTouch")]
    drop = loot[0]
    low, high = drop.get("stackSizeRange", [1, 1])
    return Block(name, float(raw["hardness"]), tools, drop["item"], (int(low), int(high or low)))


def weakest_tool(block_name: str) -> str | None:
    """The cheapest pickaxe that harvests ``block_name`` (None: the hand suffices)."""
    tools = block(block_name).harvest_tools
    if not tools:
        return None
    ranked = [tool for tool in PICKAXE_SPEED if tool in tools]
    if not ranked:
        raise ValueError(f"no known pickaxe harvests {block_name}: {sorted(tools)}")
    return ranked[0]


def break_frames(block_name: str, tool_speed: float, frames_per_hardness: float) -> int:
    """Frames the skill model needs to break one block: hardness x scale / tool speed."""
    return max(1, math.ceil(block(block_name).hardness * frames_per_hardness / tool_speed))


def display_name(item: str) -> str:
    """The in-game name in lower case (``oak_planks`` -> ``oak planks``)."""
    data = game_data()
    entry = data.items_name.get(item) or data.blocks_name[item]
    return entry["displayName"].lower()


@functools.cache
def requirements(item: str) -> tuple[str, ...]:
    """Items that must be obtained before ``item``: ingredients, tables, furnace, pickaxes.

    Fuel is not listed: planks burn, so a path never needs coal unless a recipe asks for it.
    """
    if item in SOURCE_BLOCKS:
        tool = weakest_tool(SOURCE_BLOCKS[item])
        return (tool,) if tool else ()
    if item in SMELTING.values():
        source = next(key for key, value in SMELTING.items() if value == item)
        return (source, "furnace")
    rule = recipe(item)
    needed = [name for name, _ in rule.ingredients]
    if rule.needs_table:
        needed.append("crafting_table")
    return tuple(needed)


@functools.cache
def tech_path(target: str) -> tuple[str, ...]:
    """Every item on the way to ``target`` (itself included), prerequisites first."""
    order: list[str] = []

    def visit(item: str) -> None:
        if item in order:
            return
        for needed in requirements(item):
            visit(needed)
        order.append(item)

    visit(target)
    return tuple(order)


MILESTONE_WEIGHTS: dict[str, float] = {
    "oak_log": 2,
    "oak_planks": 3,
    "stick": 4,
    "crafting_table": 5,
    "wooden_pickaxe": 8,
    "cobblestone": 8,
    "stone_pickaxe": 12,
    "furnace": 12,
    "iron_ore": 18,
    "iron_ingot": 24,
    "iron_pickaxe": 44,
    "coal": 10,
    "torch": 20,
    "stone": 16,
    "stone_bricks": 20,
}
"""Relative value of each tech-tree item; the iron-pickaxe path sums to 140 as it stands."""

REWARD_CAP = 140.0
"""What a full path is worth (docs/method.md section 6: milestones, cap 140)."""


def default_milestones(target: str) -> dict[str, float]:
    """Milestones of ``target``'s path, :data:`MILESTONE_WEIGHTS` scaled to sum to 140."""
    path = tech_path(target)
    missing = [item for item in path if item not in MILESTONE_WEIGHTS]
    if missing:
        raise ValueError(f"no milestone weight for {missing} on the path to {target}")
    total = sum(MILESTONE_WEIGHTS[item] for item in path)
    return {item: MILESTONE_WEIGHTS[item] * REWARD_CAP / total for item in path}


def check_names() -> None:
    """Raise ValueError if any hand-listed item or block name is not in the game data."""
    data = game_data()
    items = [*SMELTING, *SMELTING.values(), *FUEL_ITEMS_SMELTED, *PICKAXE_SPEED, *TARGETS]
    items += [*SOURCE_BLOCKS, *MILESTONE_WEIGHTS]
    unknown = [name for name in items if name not in data.items_name]
    unknown += [name for name in SOURCE_BLOCKS.values() if name not in data.blocks_name]
    if unknown:
        raise ValueError(f"not Minecraft {MINECRAFT_VERSION} names: {sorted(set(unknown))}")
    for item, source in SOURCE_BLOCKS.items():
        if block(source).drop != item:
            raise ValueError(f"{source} drops {block(source).drop}, not {item}")
