"""The embedded Minecraft world: three roles obtain a tech-tree item by STEVE-1-style instructions.

One avatar lives in the world; each decision step the acting agent gives it one instruction and a
stochastic skill model, standing for STEVE-1's ``frames_per_instruction`` frames of play, carries
it out. Whether it works and how much it yields depends on the world of the seed (tree density,
depth to stone and to iron, ore abundance), on the tools held and on what is nearby. Recipes,
harvest tools, hardness and drops are Minecraft 1.16's own (``techtree``). One module over 400
lines on purpose: the skills, their yields, the observation and the milestones all read and
write one world state; the recipe data (``techtree``) and the expert (``expert``) live apart.
"""

from __future__ import annotations

import math
import random
import re
from typing import Any

from bidswarm.envs.base import StepResult, TextEnv, register_task, role_name
from bidswarm.envs.crafting import expert, shared, techtree
from bidswarm.envs.crafting.config import CraftingConfig
from bidswarm.envs.memory import memo_entries
from bidswarm.envs.quoting import quote

ROLE_INSTRUCTIONS: dict[str, tuple[str, ...]] = {
    "logger": ("chop a tree", "find trees", "go to the surface"),
    "miner": ("dig down", "mine stone", "mine coal", "mine iron ore", "explore the cave"),
    "smith": (
        "craft planks",
        "craft sticks",
        "craft a crafting table",
        "craft a wooden pickaxe",
        "craft a stone pickaxe",
        "craft a furnace",
        "smelt iron ore",
        "craft an iron pickaxe",
        "craft a torch",
        "smelt cobblestone",
        "craft stone bricks",
    ),
}
"""Each role's instructions, in STEVE-1's style; the sets are disjoint."""

CRAFTED_ITEM: dict[str, str] = {
    "craft planks": "oak_planks",
    "craft sticks": "stick",
    "craft a crafting table": "crafting_table",
    "craft a wooden pickaxe": "wooden_pickaxe",
    "craft a stone pickaxe": "stone_pickaxe",
    "craft a furnace": "furnace",
    "craft an iron pickaxe": "iron_pickaxe",
    "craft a torch": "torch",
    "craft stone bricks": "stone_bricks",
}
SMELTED_INPUT: dict[str, str] = {"smelt iron ore": "iron_ore", "smelt cobblestone": "cobblestone"}

FOLLOW_PROBABILITY: dict[str, float] = {
    "chop a tree": 0.85,
    "find trees": 0.9,
    "go to the surface": 0.9,
    "dig down": 0.9,
    "mine stone": 0.85,
    "mine coal": 0.8,
    "mine iron ore": 0.8,
    "explore the cave": 0.75,
    "smelt iron ore": 0.9,
    "smelt cobblestone": 0.9,
}
"""Chance that the skill model follows an instruction at all (crafting: 0.92 at the 2x2 grid,
0.85 at a table, whose larger GUI is harder to operate)."""

FUEL_ORDER = ("coal", "charcoal", "oak_planks", "oak_log", "stick")
"""The furnace burns the first fuel held in this order."""

MAX_DEPTH = 60
STAIR_FRAMES = 6
"""Frames to step down (or ``CLIMB_FRAMES`` up) one block of a staircase."""
CLIMB_FRAMES = 5
SMELT_FRAMES = 10
"""Compressed smelting time of one item (the real furnace takes 200 ticks)."""

_NON_WORD = re.compile(r"[^a-z0-9]+")


def normalize(text: str) -> str:
    """Lower case, punctuation to spaces, single spaces: the form instructions are matched in."""
    return _NON_WORD.sub(" ", text.lower()).strip()


def parse_instruction(reply: str, allowed: frozenset[str]) -> str | None:
    """The instruction ``reply`` gives: the whole reply, or its last non-empty line."""
    whole = normalize(reply)
    if whole in allowed:
        return whole
    lines = [line for line in reply.splitlines() if line.strip()]
    if lines:
        last = normalize(lines[-1])
        if last in allowed:
            return last
    return None


def _count_text(inventory: dict[str, int]) -> str:
    return ", ".join(f"{n} {techtree.display_name(item)}" for item, n in inventory.items() if n)


def describe_task(config: CraftingConfig) -> str:
    """The team's goal, shown to every agent (embedded and MineStudio worlds alike)."""
    target = techtree.display_name(config.target)
    return (
        f"A team of three plays Minecraft and must obtain {target} from an empty inventory "
        f"within {config.max_decisions} steps. Each step one member gives the player one "
        "instruction. Rewards come the first time each item on the way is obtained."
    )


def describe_role(role: str | None) -> str:
    """The exact instructions ``role`` may reply with (None: every role's)."""
    ordered = [i for r, own in ROLE_INSTRUCTIONS.items() if role in (None, r) for i in own]
    who = "You" if role is None else f"You are the {role}. You"
    return f"{who} may reply with exactly one of: " + "; ".join(ordered) + "."


@register_task("crafting")
class CraftingEnv(TextEnv):
    """The crafting task (docs/method.md section 6) on the embedded world of the module
    docstring."""

    Config = CraftingConfig
    roles = ("logger", "miner", "smith")

    def __init__(self, config: CraftingConfig):
        super().__init__(config)  # refuses what CraftingConfig.problems names
        techtree.check_names()
        self.milestones = (
            dict(config.milestone_rewards)
            if config.milestone_rewards is not None
            else techtree.default_milestones(config.target)
        )
        everything = frozenset().union(*ROLE_INSTRUCTIONS.values())
        self._allowed: dict[str | None, frozenset[str]] = {
            role: everything if config.actions == "shared" else frozenset(instructions)
            for role, instructions in ROLE_INSTRUCTIONS.items()
        }
        self._allowed[None] = everything
        self.skills: shared.Skills | None = None
        """The world's skills under ``task.actions=shared`` (``crafting/shared.py``), else None."""
        self.skills_shown: list[str] = []
        self._frames_hand = {
            name: techtree.break_frames(name, 1.0, config.frames_per_hardness)
            for name in ("dirt", "oak_log")
        }
        self.reset(0)  # every attribute exists; an episode starts with the caller's reset
        self.episode_started = False

    # -- seeds and world -------------------------------------------------------------------
    def _draw_world(self, seed: int) -> None:
        world = random.Random(f"crafting-world-{seed}")
        self.tree_density = world.uniform(0.15, 0.9)
        self.stone_depth = world.randint(1, 6)
        self.iron_depth = self.stone_depth + world.randint(6, 32)
        self.coal_rate = world.uniform(0.1, 0.6)
        # Log-uniform: a few worlds are iron-poor, which makes a careless plan run out of time.
        self.iron_rate = math.exp(world.uniform(math.log(0.01), math.log(0.3)))
        self.trees = world.randint(0, 2 + int(5 * self.tree_density))
        if self.config.actions == "shared":
            self.skills = shared.Skills(seed, self.roles)

    def reset(self, seed: int) -> None:
        seed = self.begin_episode(seed)
        self.seed = seed
        self._draw_world(seed)
        self.rng = random.Random(seed)
        self.inventory: dict[str, int] = {}
        self.depth = 0
        self.coal_seen = 0
        self.iron_seen = 0
        self.fuel_left = 0.0
        self._decisions = 0
        self.total_reward = 0.0
        self.obtained: set[str] = set()
        self.history: list[str] = []
        self._done = False
        self.invalid_replies = 0
        self.frames_used = 0
        self.memory.clear()
        self._touch()
        if self.skills is not None and not self.skills_shown:
            self.skills_shown = shared.skills_needed(self)

    def _touch(self) -> None:
        """Invalidate what is cached per state (observation text, expert plan)."""
        self._observation: str | None = None
        self.plan_cache: Any = None

    # -- text ------------------------------------------------------------------------------
    @property
    def task_description(self) -> str:
        return describe_task(self.config)

    def role_description(self, role: str | None) -> str:
        if self.skills is not None:
            everything = [i for own in ROLE_INSTRUCTIONS.values() for i in own]
            return shared.describe(role, everything) + self.memory_hint
        return describe_role(role) + self.memory_hint

    def _near(self) -> str:
        if self.depth == 0:
            return f"surface, {self.trees or 'no'} tree{'s' if self.trees != 1 else ''}"
        if self.depth < self.stone_depth:
            return f"depth {self.depth}, dirt, stone {self.stone_depth - self.depth} blocks down"
        seen = [
            f"{n} {name}"
            for n, name in ((self.coal_seen, "coal ore"), (self.iron_seen, "iron ore"))
            if n
        ]
        layer = ["iron layer"] if self.in_iron_layer else []
        return ", ".join([f"depth {self.depth}, stone", *layer, *seen])

    @property
    def in_stone(self) -> bool:
        """Whether the player digs in stone (shown as ``stone`` in the observation)."""
        return self.depth >= self.stone_depth

    @property
    def in_iron_layer(self) -> bool:
        """Whether iron ore can be sighted at this depth (shown as ``iron layer``): the depth
        reading a player has in the real game, where ores keep to their height ranges."""
        return self.depth >= self.iron_depth

    def screen(self, role: str | None) -> str:
        """Step, inventory, furnace fuel, what is near, the last events; with
        ``private_inventory`` the Logger sees only the step, what is near and its own events;
        with shared actions, then the skills ``role`` sees."""
        if self.config.private_inventory and role == "logger":
            step = min(self._decisions + 1, self.config.max_decisions)
            own = "; ".join(e for e in self.history if e.startswith("logger ")) or "nothing yet"
            return f"step {step} of {self.config.max_decisions}. near: {self._near()}. last: {own}."
        if self.skills is not None:
            return self._public_screen() + self.skills.text(role, self.skills_shown)
        return self._public_screen()

    def _public_screen(self) -> str:
        if self._observation is None:
            step = min(self._decisions + 1, self.config.max_decisions)
            events = "; ".join(self.history) or "nothing yet"
            fuel = f" furnace fuel: {self.fuel_left:g} items." if self.fuel_left else ""
            self._observation = (
                f"step {step} of {self.config.max_decisions}. "
                f"inventory: {_count_text(self.inventory) or 'empty'}.{fuel} "
                f"near: {self._near()}. last: {events}."
            )
        return self._observation

    # -- episode ---------------------------------------------------------------------------
    @property
    def decisions_made(self) -> int:
        return self._decisions

    @property
    def done(self) -> bool:
        return self._done

    def skip(self) -> StepResult:
        self.require_running("skip()")
        self._decisions += 1
        self._done = self._decisions >= self.config.max_decisions
        self._touch()
        return StepResult(0.0, self._done)

    def note_turn(self, actor_role: str | None) -> StepResult:
        self.require_running("step()")
        self._decisions += 1
        self.history.append(f"{role_name(actor_role)} wrote a note")
        del self.history[: -self.config.history_length or len(self.history)]
        self._done = self._decisions >= self.config.max_decisions
        self._touch()
        return StepResult(0.0, self._done, True, "wrote a note")

    def act(self, actor_role: str | None, action: str) -> StepResult:
        self.require_running("step()")
        if actor_role not in self._allowed:
            raise ValueError(f"unknown role {actor_role!r}; roles are {self.roles} or None")
        who = role_name(actor_role)
        instruction = parse_instruction(action, self._allowed[actor_role])
        before = dict(self.inventory)
        if instruction is None:
            self.invalid_replies += 1
            said = quote(normalize(action), 4) or "nothing"
            owner = f"a {actor_role}" if actor_role and self.skills is None else "an"
            message = f"{who} said '{said}': not {owner} instruction"
            event = message
        else:
            failure = self.skills.failure(actor_role, instruction, self) if self.skills else ""
            outcome = failure or self._carry_out(instruction)
            message = f"{instruction}: {outcome}"
            event = f"{who} {message}"
        reward = self._pay_milestones(before)
        self._decisions += 1
        self.history.append(event)
        del self.history[: -self.config.history_length or len(self.history)]
        self._done = (
            self.inventory.get(self.config.target, 0) > 0
            or self._decisions >= self.config.max_decisions
        )
        self._touch()
        return StepResult(reward, self._done, instruction is not None, message)

    def _pay_milestones(self, before: dict[str, int]) -> float:
        reward = 0.0
        for item, count in self.inventory.items():
            gained = count > before.get(item, 0)
            if gained and item in self.milestones and item not in self.obtained:
                self.obtained.add(item)
                reward += self.milestones[item]
        self.total_reward += reward
        return reward

    def episode_metrics(self) -> dict[str, float]:
        metrics = {f"milestone/{item}": float(item in self.obtained) for item in self.milestones}
        metrics["success"] = float(self.inventory.get(self.config.target, 0) > 0)
        metrics["reward"] = self.total_reward
        metrics["decisions"] = float(self._decisions)
        metrics["invalid_replies"] = float(self.invalid_replies)
        metrics["frames"] = float(self.frames_used)
        if self.memory.enabled:
            metrics |= self.memory.metrics()
        return metrics

    def open_reward(self) -> float:
        """The milestones' rewards not yet earned (0 once the episode has ended)."""
        if self._done:
            return 0.0
        return sum(reward for item, reward in self.milestones.items() if item not in self.obtained)

    def progress(self) -> float:
        """Minus the steps the scripted experts' plan still needs to reach the target (0 once
        it is held)."""
        if self.inventory.get(self.config.target, 0) > 0:
            return 0.0
        return -float(len(expert.plan(self)))

    # -- the skill model -------------------------------------------------------------------
    def _gain(self, item: str, count: int) -> None:
        self.inventory[item] = self.inventory.get(item, 0) + count

    def _pickaxe_speed(self, block_name: str) -> float | None:
        """Speed of the best held pickaxe that harvests the block (1 by hand; None: cannot)."""
        tools = techtree.block(block_name).harvest_tools
        best = None
        for tool, speed in techtree.PICKAXE_SPEED.items():
            if self.inventory.get(tool) and (not tools or tool in tools):
                best = speed
        if best is None and not tools:
            return 1.0
        return best

    def _missing_tool_text(self, block_name: str) -> str:
        tool = techtree.weakest_tool(block_name)
        return f"failed, needs a {techtree.display_name(tool)}"

    def _carry_out(self, instruction: str) -> str:
        """Run the skill model on one instruction; return the result text."""
        frames = self.config.frames_per_instruction
        if instruction in CRAFTED_ITEM:
            return self._craft(CRAFTED_ITEM[instruction])
        if instruction in SMELTED_INPUT:
            return self._smelt(SMELTED_INPUT[instruction], instruction)
        precondition = self._precondition(instruction)
        if precondition:
            return precondition
        self.frames_used += frames
        if self.rng.random() >= FOLLOW_PROBABILITY[instruction]:
            return "failed, wandered off"
        if instruction == "chop a tree":
            return self._chop(frames)
        if instruction == "find trees":
            return self._find_trees()
        if instruction == "go to the surface":
            self.depth = max(0, self.depth - frames // CLIMB_FRAMES)
            self.coal_seen = self.iron_seen = 0
            return f"climbed to {'the surface' if self.depth == 0 else f'depth {self.depth}'}"
        if instruction == "dig down":
            return self._dig_down(frames)
        if instruction == "explore the cave":
            return self._explore()
        return self._mine(instruction, frames)

    def _precondition(self, instruction: str) -> str:
        """Why ``instruction`` cannot start here ("" if it can); such a failure costs no frames."""
        if instruction in ("chop a tree", "find trees") and self.depth > 0:
            return "failed, underground"
        if instruction == "chop a tree" and self.trees == 0:
            return "failed, no trees nearby"
        if instruction == "go to the surface" and self.depth == 0:
            return "failed, already on the surface"
        if instruction in ("mine stone", "explore the cave") and self.depth < self.stone_depth:
            return "failed, no stone here"
        if instruction == "mine coal" and not self.coal_seen:
            return "failed, no coal ore in sight"
        if instruction == "mine iron ore" and not self.iron_seen:
            return "failed, no iron ore in sight"
        block_name = {"mine stone": "stone", "mine coal": "coal_ore", "mine iron ore": "iron_ore"}
        if instruction in block_name and self._pickaxe_speed(block_name[instruction]) is None:
            return self._missing_tool_text(block_name[instruction])
        return ""

    def _chop(self, frames: int) -> str:
        travel = self.rng.randint(0, int(30 * (1.0 - self.tree_density)))
        logs = (frames - travel) // self._frames_hand["oak_log"]
        if logs <= 0:
            return "failed, no time left after reaching a tree"
        self._gain("oak_log", logs)
        if self.rng.random() < 0.5:
            self.trees -= 1
        return f"+{logs} oak log"

    def _find_trees(self) -> str:
        if self.rng.random() >= 0.3 + 0.6 * self.tree_density:
            return "failed, found no trees"
        self.trees += self.rng.randint(1, 2 + int(5 * self.tree_density))
        return f"found trees, {self.trees} nearby"

    def _sight_ores(self, boost: float) -> None:
        self.coal_seen = self.iron_seen = 0
        if self.depth >= self.stone_depth and self.rng.random() < self.coal_rate * boost:
            self.coal_seen = self.rng.randint(1, 4)
        if self.depth >= self.iron_depth and self.rng.random() < self.iron_rate * boost:
            self.iron_seen = self.rng.randint(1, 3)

    def _dig_down(self, frames: int) -> str:
        start, cobblestone, blocked = self.depth, 0, ""
        while self.depth < MAX_DEPTH:
            block_name = "dirt" if self.depth < self.stone_depth else "stone"
            speed = self._pickaxe_speed(block_name)
            if speed is None:
                blocked = ", hit stone, " + self._missing_tool_text(block_name)[len("failed, ") :]
                break
            cost = STAIR_FRAMES + techtree.break_frames(
                block_name, speed, self.config.frames_per_hardness
            )
            if cost > frames:
                break
            frames -= cost
            self.depth += 1
            if block_name == "stone":
                cobblestone += 1
        if self.depth == start:
            return "failed" + (blocked or ", cannot dig deeper")
        self._sight_ores(boost=1.0)
        if cobblestone:
            self._gain("cobblestone", cobblestone)
        got = f", +{cobblestone} cobblestone" if cobblestone else ""
        return f"down {self.depth - start} blocks{got}{blocked}"

    def _explore(self) -> str:
        self._sight_ores(boost=1.5)
        seen = [
            f"{n} {name}"
            for n, name in ((self.coal_seen, "coal ore"), (self.iron_seen, "iron ore"))
            if n
        ]
        return "found " + (", ".join(seen) if seen else "no ore")

    def _mine(self, instruction: str, frames: int) -> str:
        block_name = {"mine stone": "stone", "mine coal": "coal_ore", "mine iron ore": "iron_ore"}[
            instruction
        ]
        speed = self._pickaxe_speed(block_name)
        per_block = techtree.break_frames(block_name, speed, self.config.frames_per_hardness)
        travel = self.rng.randint(0, 20 if block_name != "stone" else 8)
        count = (frames - travel) // per_block
        if block_name == "coal_ore":
            count = min(count, self.coal_seen)
            self.coal_seen -= count
        elif block_name == "iron_ore":
            count = min(count, self.iron_seen)
            self.iron_seen -= count
        if count <= 0:
            return "failed, no time left after reaching it"
        info = techtree.block(block_name)
        low, high = info.drop_range
        dropped = sum(self.rng.randint(low, high) for _ in range(count))
        self._gain(info.drop, dropped)
        return f"+{dropped} {techtree.display_name(info.drop)}"

    def _craft(self, item: str) -> str:
        recipe = techtree.recipe(item)
        if recipe.needs_table and not self.inventory.get("crafting_table"):
            return "failed, needs a crafting table"
        for ingredient, count in recipe.ingredients:
            if self.inventory.get(ingredient, 0) < count:
                return f"failed, needs {count} {techtree.display_name(ingredient)}"
        self.frames_used += self.config.frames_per_instruction
        if self.rng.random() >= (0.85 if recipe.needs_table else 0.92):
            return "failed, fumbled the crafting grid"
        for ingredient, count in recipe.ingredients:
            self.inventory[ingredient] -= count
        self._gain(item, recipe.count)
        return f"+{recipe.count} {techtree.display_name(item)}"

    def _smelt(self, source: str, instruction: str) -> str:
        if not self.inventory.get("furnace"):
            return "failed, needs a furnace"
        if not self.inventory.get(source):
            return f"failed, needs {techtree.display_name(source)}"
        batch = min(self.inventory[source], self.config.frames_per_instruction // SMELT_FRAMES)
        while self.fuel_left < batch:
            fuel = next((name for name in FUEL_ORDER if self.inventory.get(name)), None)
            if fuel is None:
                break
            self.inventory[fuel] -= 1
            self.fuel_left += techtree.FUEL_ITEMS_SMELTED[fuel]
        batch = min(batch, int(self.fuel_left))
        if batch == 0:
            return "failed, needs fuel"
        self.frames_used += self.config.frames_per_instruction
        if self.rng.random() >= FOLLOW_PROBABILITY[instruction]:
            return "failed, wandered off"
        self.fuel_left -= batch
        self.inventory[source] -= batch
        output = techtree.SMELTING[source]
        self._gain(output, batch)
        return f"+{batch} {techtree.display_name(output)}"

    # -- fork contract ---------------------------------------------------------------------
    def fork_state(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "world": (
                self.tree_density,
                self.stone_depth,
                self.iron_depth,
                self.coal_rate,
                self.iron_rate,
            ),
            "rng": self.rng.getstate(),
            "inventory": tuple(self.inventory.items()),
            "place": (self.depth, self.trees, self.coal_seen, self.iron_seen, self.fuel_left),
            "decisions": self._decisions,
            "total_reward": self.total_reward,
            "obtained": tuple(sorted(self.obtained)),
            "history": tuple(self.history),
            "done": self._done,
            "counters": (self.invalid_replies, self.frames_used),
            "memory": self.memory.state(),
        }

    def load_fork_state(self, state: dict[str, Any]) -> None:
        self.seed = state["seed"]
        (self.tree_density, self.stone_depth, self.iron_depth, self.coal_rate, self.iron_rate) = (
            state["world"]
        )
        self.rng.setstate(state["rng"])
        self.inventory = dict(state["inventory"])
        self.depth, self.trees, self.coal_seen, self.iron_seen, self.fuel_left = state["place"]
        self._decisions = state["decisions"]
        self.total_reward = state["total_reward"]
        self.obtained = set(state["obtained"])
        self.history = list(state["history"])
        self._done = state["done"]
        self.invalid_replies, self.frames_used = state["counters"]
        self.memory.load(state["memory"])
        if self.skills is not None:
            self.skills = shared.Skills(self.seed, self.roles)
        self._touch()

    # -- scripted experts ------------------------------------------------------------------
    def expert_action(self, role: str | None) -> str | None:
        """The plan's next step for ``role``; with the memory on, a Miner's instruction carries
        a note of the ore in sight unless the observation's memo already shows it. With
        ``private_inventory`` the Logger and the Smith follow :meth:`_wood_protocol`."""
        if self.config.private_inventory and role in ("logger", "smith"):
            return self._wood_protocol(role)
        # Shared actions: every role's best reply is the plan's next step.
        action = expert.expert_action(self, None if self.skills else role)
        if action is None or not self.memory.enabled or action not in ROLE_INSTRUCTIONS["miner"]:
            return action
        note = expert.sighting_note(self)
        if note is None or f": {note}" in self.observation(role):
            return action
        return f"{action} note: {note}"

    def expert_bid(self, role: str) -> float:
        if self.skills is not None:
            return self.skills.expert_bid(role, self)
        if self.config.private_inventory and role == "logger":
            return expert.BOTTLENECK_BID if self._wood_protocol(role) else 0.0
        if self.config.private_inventory and role == "smith" and self._wood_is_next():
            return expert.BOTTLENECK_BID if self._wood_protocol(role) else 0.0
        return expert.expert_bid(self, role, self.config.expert_bids)

    def _wood_is_next(self) -> bool:
        steps = expert.plan(self)
        return bool(steps) and steps[0][0] == "logger"

    def _wood_protocol(self, role: str) -> str | None:
        """``private_inventory`` [ours]: when the plan needs wood next, the Smith (who sees the
        inventory) notes ``need wood`` unless that is the newest note; the Logger, who does not,
        acts while the newest note it is shown is that request, and answers it with ``got wood``
        on its chop. Otherwise the Smith follows the plan and the Logger passes."""
        newest = next(iter(memo_entries(self.observation(role))), "")
        requested = newest == f"smith: {expert.WOOD_REQUEST}"
        if role == "logger":
            if not requested:
                return None
            action = expert.wood_action(self)
            return f"{action} note: {expert.WOOD_ANSWER}" if action == "chop a tree" else action
        if self._wood_is_next():
            return None if requested else f"note: {expert.WOOD_REQUEST}"
        return expert.expert_action(self, role)
