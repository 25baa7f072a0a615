"""Scripted experts of the crafting task: a bill-of-materials planner and a hand-written bid rule.

The planner walks the target's recipe tree against the inventory (tools are kept, ingredients and
fuel are used up) and lists, in order, the instructions still needed. Its first entry is the
bottleneck; wood comes first while the player stands on the surface, because climbing back up
later costs decisions. The experts read only what an agent's observation shows: the inventory,
the depth and whether the player stands in stone and in the iron layer, the trees and ore in
sight, and the furnace's fuel.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

from bidswarm.envs.crafting import techtree


class PlanState(Protocol):
    """What the planner reads: the embedded world, or a view built from a real game's inventory."""

    config: Any
    inventory: dict[str, int]
    depth: int
    trees: int
    in_stone: bool
    in_iron_layer: bool
    coal_seen: int
    iron_seen: int
    fuel_left: float
    plan_cache: list[tuple[str, str]] | None


BOTTLENECK_BID = 0.8
"""Bid of the role that owns the next step of the plan."""
HELPER_BID = 0.4
"""``two_level`` bids: the bid of a role that owns a later step of the plan."""
GRADED_BIDS = (0.8, 0.6, 0.4, 0.2)
"""``graded`` bids [ours]: the bid of a role whose first step is the plan's k-th (k = 0, 1, 2,
later); a role the plan does not need passes (0)."""
EXPERT_BIDS = ("graded", "two_level")

CRAFT_INSTRUCTION = {
    "oak_planks": "craft planks",
    "stick": "craft sticks",
    "crafting_table": "craft a crafting table",
    "wooden_pickaxe": "craft a wooden pickaxe",
    "stone_pickaxe": "craft a stone pickaxe",
    "furnace": "craft a furnace",
    "iron_pickaxe": "craft an iron pickaxe",
    "torch": "craft a torch",
    "stone_bricks": "craft stone bricks",
}
SMELT_INSTRUCTION = {"iron_ore": "smelt iron ore", "cobblestone": "smelt cobblestone"}
ROLE_OF_SOURCE = {"oak_log": "logger", "cobblestone": "miner", "coal": "miner", "iron_ore": "miner"}


class _Planner:
    """One pass over the recipe tree from the current state; ``steps`` is the ordered plan."""

    def __init__(self, env: PlanState):
        self.env = env
        self.stock = dict(env.inventory)
        self.tools = {item for item, n in env.inventory.items() if n}
        self.fuel_left = env.fuel_left
        self.steps: list[tuple[str, str]] = []

    def need(self, item: str, count: int) -> None:
        have = self.stock.get(item, 0)
        if have >= count:
            self.stock[item] = have - count
            return
        count -= have
        self.stock[item] = 0
        if item in techtree.SOURCE_BLOCKS:
            self.gather(item)
        elif item in techtree.SMELTING.values():
            source = next(key for key, value in techtree.SMELTING.items() if value == item)
            self.need_tool("furnace")
            self.need(source, count)
            self.need_fuel(count)
            self.steps.append(("smith", SMELT_INSTRUCTION[source]))
        else:
            recipe = techtree.recipe(item)
            if recipe.needs_table:
                self.need_tool("crafting_table")
            batches = math.ceil(count / recipe.count)
            for ingredient, per_batch in recipe.ingredients:
                self.need(ingredient, per_batch * batches)
            self.steps.extend([("smith", CRAFT_INSTRUCTION[item])] * batches)
            self.stock[item] = self.stock.get(item, 0) + batches * recipe.count - count

    def need_tool(self, tool: str) -> None:
        """Tools are not used up: obtain one unless it (or a better pickaxe) is at hand."""
        if tool in techtree.PICKAXE_SPEED:
            tiers = list(techtree.PICKAXE_SPEED)
            if any(t in self.tools for t in tiers[tiers.index(tool) :]):
                return
        elif tool in self.tools:
            return
        self.need(tool, 1)
        self.tools.add(tool)

    def need_fuel(self, items: int) -> None:
        missing = items - self.fuel_left
        self.fuel_left = max(0.0, self.fuel_left - items)
        if missing <= 0:
            return
        coal_needed = math.ceil(missing / techtree.FUEL_ITEMS_SMELTED["coal"])
        if self.stock.get("coal", 0) >= coal_needed:
            self.stock["coal"] -= coal_needed
            self.fuel_left += coal_needed * techtree.FUEL_ITEMS_SMELTED["coal"] - missing
            return
        planks = math.ceil(missing / techtree.FUEL_ITEMS_SMELTED["oak_planks"])
        self.need("oak_planks", planks)
        self.fuel_left += planks * techtree.FUEL_ITEMS_SMELTED["oak_planks"] - missing

    def gather(self, item: str) -> None:
        tool = techtree.weakest_tool(techtree.SOURCE_BLOCKS[item])
        if tool:
            self.need_tool(tool)
        env = self.env
        if item == "oak_log":
            if env.depth > 0:
                action = "go to the surface"
            else:
                action = "chop a tree" if env.trees else "find trees"
        elif not env.in_stone:
            action = "dig down"
        elif item == "cobblestone":
            action = "mine stone"
        elif item == "coal":
            action = "mine coal" if env.coal_seen else "explore the cave"
        elif env.iron_seen:
            action = "mine iron ore"
        else:
            action = "explore the cave" if env.in_iron_layer else "dig down"
        self.steps.append((ROLE_OF_SOURCE[item], action))


def plan(env: PlanState) -> list[tuple[str, str]]:
    """The remaining (role, instruction) steps to the target, the one to take now first."""
    if env.plan_cache is None:
        planner = _Planner(env)
        planner.need(env.config.target, 1)
        steps = planner.steps
        wood = [step for step in steps if step[0] == "logger"]
        # While on the surface gather all the wood the plan needs before anything else.
        if env.depth == 0 and wood and steps[0][0] != "logger":
            steps = [wood[0], *steps]
        env.plan_cache = steps
    return env.plan_cache


def expert_action(env: PlanState, role: str | None) -> str | None:
    """The next plan step owned by ``role`` (None: the first step of all), or None."""
    for owner, instruction in plan(env):
        if role is None or owner == role:
            return instruction
    return None


WOOD_REQUEST = "need wood"
"""``private_inventory`` [ours]: the Smith's note when the plan needs wood next."""
WOOD_ANSWER = "got wood"
"""``private_inventory`` [ours]: the note of the Logger's chop that answers the request."""


def wood_action(env: PlanState) -> str:
    """The Logger's way to wood from where the player is (the planner's oak-log step)."""
    if env.depth > 0:
        return "go to the surface"
    return "chop a tree" if env.trees else "find trees"


def sighting_note(env: PlanState) -> str | None:
    """[ours] The note the experts write with a Miner's instruction when the memory is on: the
    ore in sight and the depth (iron first), e.g. ``iron ore at depth 23``; None: none in sight."""
    for count, ore in ((env.iron_seen, "iron ore"), (env.coal_seen, "coal ore")):
        if count:
            return f"{ore} at depth {env.depth}"
    return None


def expert_bid(env: PlanState, role: str, scheme: str = "graded") -> float:
    """How urgently ``role`` should act: 0 when the plan does not need it, else by how soon.

    ``graded`` [ours]: :data:`GRADED_BIDS` by the position of the role's first step in the plan
    (0.8 for the next step, then 0.6, 0.4, 0.2). ``two_level``: 0.8 for the next step, 0.4 for a
    later one. Graded bids give the auction close races (a runner-up one level below the
    winner), where a counterfactual fork can still flip who acts.
    """
    owners = [owner for owner, _ in plan(env)]
    if role not in owners:
        return 0.0
    position = owners.index(role)
    if scheme == "two_level":
        return BOTTLENECK_BID if position == 0 else HELPER_BID
    if scheme == "graded":
        return GRADED_BIDS[min(position, len(GRADED_BIDS) - 1)]
    raise ValueError(f"task.expert_bids={scheme!r}: choose one of {EXPERT_BIDS}")
