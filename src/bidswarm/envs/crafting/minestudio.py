"""The crafting task on real Minecraft: MineStudio's ``MinecraftSim`` driven by STEVE-1.

Each decision the acting agent's instruction becomes STEVE-1's text condition for
``frames_per_instruction`` frames (40 in the paper). The observation text is built from the game's
inventory; milestone rewards come from MineStudio's ``RewardsCallback`` (one payment per item).
Minecraft has no cheap world snapshot, so a fork replays the world seed and the instruction
prefix from a fresh reset (see docs/minestudio.md for the cost); the policy's sampling is seeded
per instruction so that a replay draws the same actions.

MineStudio is optional and imported lazily; the pure parts below (inventory -> text, inventory ->
milestones, instruction -> STEVE-1 prompt, reward-callback config) need none of it.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Any

from bidswarm.envs.base import StepResult, TextEnv, role_name
from bidswarm.envs.crafting import expert, techtree
from bidswarm.envs.crafting.config import CraftingConfig
from bidswarm.envs.crafting.env import (
    ROLE_INSTRUCTIONS,
    describe_role,
    describe_task,
    normalize,
    parse_instruction,
)

STEVE_1_CHECKPOINT = "CraftJarvis/MineStudio_STEVE-1.official"
"""STEVE-1 weights on the Hugging Face hub, loaded through ``SteveOnePolicy.from_pretrained``."""

STEVE_PROMPTS: dict[str, str] = {
    "chop a tree": "chop a tree",
    "find trees": "go explore and find trees",
    "go to the surface": "climb up to the surface",
    "dig down": "dig down",
    "mine stone": "mine stone",
    "mine coal": "mine coal",
    "mine iron ore": "mine iron ore",
    "explore the cave": "explore the cave",
    "craft planks": "craft wooden planks",
    "craft sticks": "craft sticks",
    "craft a crafting table": "craft a crafting table",
    "craft a wooden pickaxe": "craft a wooden pickaxe",
    "craft a stone pickaxe": "craft a stone pickaxe",
    "craft a furnace": "craft a furnace",
    "smelt iron ore": "smelt iron ore in the furnace",
    "craft an iron pickaxe": "craft an iron pickaxe",
    "craft a torch": "craft torches",
    "smelt cobblestone": "smelt cobblestone in the furnace",
    "craft stone bricks": "craft stone bricks",
}
"""Our instruction -> STEVE-1's text condition (short, goal-directed, as STEVE-1 was tuned on)."""


def steve_prompt(instruction: str) -> str:
    """The STEVE-1 text condition for one of our instructions."""
    return STEVE_PROMPTS[instruction]


def inventory_counts(raw: dict[Any, Any]) -> dict[str, int]:
    """Item -> count from MineStudio's ``info["inventory"]``.

    MineStudio reports slots, ``{slot: {"type": name, "quantity": n}}``; MineRL's flat handler
    reports ``{name: n}``. Both are summed per item; ``air`` and the ``minecraft:`` prefix go.
    """
    counts: dict[str, int] = {}
    for key, value in raw.items():
        if isinstance(value, dict):
            name, quantity = str(value["type"]), int(value["quantity"])
        else:
            name, quantity = str(key), int(value)
        name = name.removeprefix("minecraft:")
        if name in ("air", "none") or quantity <= 0:
            continue
        counts[name] = counts.get(name, 0) + quantity
    return counts


def observation_text(
    step: int, max_decisions: int, counts: dict[str, int], history: list[str]
) -> str:
    """The same short text the embedded world shows, from what the real game reports."""
    inventory = ", ".join(
        f"{n} {techtree.display_name(item)}"
        for item, n in counts.items()
        if item in techtree.game_data().items_name
    )
    events = "; ".join(history) or "nothing yet"
    return (
        f"step {min(step, max_decisions)} of {max_decisions}. "
        f"inventory: {inventory or 'empty'}. last: {events}."
    )


def new_milestones(
    counts: dict[str, int], milestones: dict[str, float], obtained: set[str]
) -> float:
    """Reward of the milestones first held now; adds them to ``obtained`` (each is paid once)."""
    reward = 0.0
    for item, value in milestones.items():
        if counts.get(item, 0) > 0 and item not in obtained:
            obtained.add(item)
            reward += value
    return reward


def reward_callback_config(milestones: dict[str, float]) -> list[dict[str, Any]]:
    """``RewardsCallback`` entries paying each milestone once.

    Gathered items count on ``pickup``, crafted and smelted ones on ``craft_item`` (Minecraft's
    ``crafted`` statistic also counts items taken out of a furnace).
    """
    config = []
    for item, value in milestones.items():
        event = "pickup" if item in techtree.SOURCE_BLOCKS else "craft_item"
        config.append(
            {
                "event": event,
                "identity": f"milestone {item}",
                "objects": [item],
                "reward": float(value),
                "max_reward_times": 1,
            }
        )
    return config


def require_minestudio() -> None:
    """Raise a clear ImportError when MineStudio is not installed."""
    if importlib.util.find_spec("minestudio") is None:
        raise ImportError(
            "The MineStudio crafting backend needs `pip install minestudio` in its own "
            "environment (it pins an OpenCV built for numpy 1.x), JDK 8 and xvfb; "
            "see docs/minestudio.md. The embedded world (task.name=crafting) needs none of it."
        )


@dataclass
class _InventoryView:
    """What the scripted planner reads, built from the real inventory alone.

    Depth, trees and ore sightings are unknown in the real game: the view puts the player where
    every gathering instruction can start, so the plan names the instruction and STEVE-1 finds
    the place.
    """

    config: CraftingConfig
    inventory: dict[str, int]
    depth: int = 0
    trees: int = 1
    in_stone: bool = True
    in_iron_layer: bool = True
    coal_seen: int = 1
    iron_seen: int = 1
    fuel_left: float = 0.0
    plan_cache: list[tuple[str, str]] | None = field(default=None)


class MineStudioCraftingEnv(TextEnv):
    """The crafting task on MineStudio's MinecraftSim with a frozen STEVE-1 (module docstring)."""

    Config = CraftingConfig
    roles = ("logger", "miner", "smith")

    def __init__(
        self,
        config: CraftingConfig,
        checkpoint: str = STEVE_1_CHECKPOINT,
        device: str = "cuda",
        cond_scale: float = 4.0,
        obs_size: tuple[int, int] = (128, 128),
    ):
        super().__init__(config)
        if self.memory.enabled:
            # Its forks replay the action prefix; the notes would need a snapshot of their own.
            raise ValueError(
                f"task.memory.size={config.memory.size}: the MineStudio adapter has no shared "
                "memory; use 0"
            )
        if config.actions != "split":
            raise ValueError(
                f"task.actions={config.actions!r}: the MineStudio adapter has the split "
                "variant only; use split"
            )
        require_minestudio()
        from minestudio.models import SteveOnePolicy

        self.milestones = (
            dict(config.milestone_rewards)
            if config.milestone_rewards is not None
            else techtree.default_milestones(config.target)
        )
        self.cond_scale = cond_scale
        self.obs_size = obs_size
        self.policy = SteveOnePolicy.from_pretrained(checkpoint).to(device).eval()
        self._allowed = {role: frozenset(i) for role, i in ROLE_INSTRUCTIONS.items()}
        self._allowed[None] = frozenset().union(*self._allowed.values())
        self.sim: Any = None

    # -- the game --------------------------------------------------------------------------
    def _open_world(self, seed: int) -> None:
        from minestudio.simulator import MinecraftSim
        from minestudio.simulator.callbacks import RewardsCallback

        if self.sim is not None:
            self.sim.close()
        self.sim = MinecraftSim(
            seed=seed,
            obs_size=self.obs_size,
            callbacks=[RewardsCallback(reward_callback_config(self.milestones))],
        )
        self._obs, info = self.sim.reset()
        self._memory = None
        self.counts = inventory_counts(info.get("inventory", {}))

    def _play_instruction(self, instruction: str, index: int) -> float:
        """Run STEVE-1 on ``instruction`` for the configured frames; the callback's reward."""
        import torch

        # Seeded per (world, instruction index): a fork's replay samples the same actions.
        torch.manual_seed(self.seed * 100_003 + index)
        condition = {"cond_scale": self.cond_scale, "text": steve_prompt(instruction)}
        reward = 0.0
        for _ in range(self.config.frames_per_instruction):
            self._obs["condition"] = condition
            action, self._memory = self.policy.get_action(self._obs, self._memory, input_shape="*")
            # MinecraftSim.step mutates the action it is given.
            self._obs, frame_reward, _, _, info = self.sim.step(dict(action))
            reward += float(frame_reward)
        self.counts = inventory_counts(info.get("inventory", {}))
        return reward

    # -- TextEnv ---------------------------------------------------------------------------
    @property
    def task_description(self) -> str:
        return describe_task(self.config)

    def role_description(self, role: str | None) -> str:
        return describe_role(role)

    def reset(self, seed: int) -> None:
        seed = self.begin_episode(seed)
        self.seed = seed
        self._open_world(seed)
        self.prefix: list[tuple[str | None, str] | None] = []
        self.history: list[str] = []
        self.obtained: set[str] = set()
        self.total_reward = 0.0
        self._done = False
        self.invalid_replies = 0

    def screen(self, role: str | None) -> str:
        return observation_text(
            len(self.prefix) + 1, self.config.max_decisions, self.counts, self.history
        )

    @property
    def decisions_made(self) -> int:
        return len(self.prefix)

    @property
    def done(self) -> bool:
        return self._done

    def _finish_step(self) -> None:
        self._done = (
            self.counts.get(self.config.target, 0) > 0
            or len(self.prefix) >= self.config.max_decisions
        )

    def skip(self) -> StepResult:
        self.require_running("skip()")
        self.prefix.append(None)
        self._finish_step()
        return StepResult(0.0, self._done)

    def note_turn(self, actor_role: str | None) -> StepResult:
        raise AssertionError("the MineStudio adapter refuses task.memory, so no reply is a note")

    def act(self, actor_role: str | None, action: str) -> StepResult:
        who = role_name(actor_role)
        instruction = parse_instruction(action, self._allowed[actor_role])
        index = len(self.prefix)
        self.prefix.append((actor_role, action))
        if instruction is None:
            self.invalid_replies += 1
            said = " ".join(normalize(action).split()[:4]) or "nothing"
            owner = f"a {actor_role}" if actor_role else "an"
            message = f"{who} said '{said}': not {owner} instruction"
            reward = 0.0
            self.history.append(message)
        else:
            reward = self._play_instruction(instruction, index)
            new_milestones(self.counts, self.milestones, self.obtained)
            message = f"{instruction}: done"
            self.history.append(f"{who} {message}")
        del self.history[: -self.config.history_length or len(self.history)]
        self.total_reward += reward
        self._finish_step()
        return StepResult(reward, self._done, instruction is not None, message)

    def episode_metrics(self) -> dict[str, float]:
        metrics = {f"milestone/{item}": float(item in self.obtained) for item in self.milestones}
        metrics["success"] = float(self.counts.get(self.config.target, 0) > 0)
        metrics["reward"] = self.total_reward
        metrics["decisions"] = float(len(self.prefix))
        metrics["invalid_replies"] = float(self.invalid_replies)
        return metrics

    # -- forks replay the prefix -----------------------------------------------------------
    def fork_state(self) -> dict[str, Any]:
        return {"seed": self.seed, "prefix": tuple(self.prefix)}

    def load_fork_state(self, state: dict[str, Any]) -> None:
        """Reset to the seed and replay every instruction: minutes for a long prefix."""
        self.reset(state["seed"])
        for entry in state["prefix"]:
            if entry is None:
                self.skip()
            else:
                self.step(*entry)

    # -- scripted experts (inventory only) -------------------------------------------------
    def _view(self) -> _InventoryView:
        return _InventoryView(config=self.config, inventory=dict(self.counts))

    def expert_action(self, role: str | None) -> str | None:
        return expert.expert_action(self._view(), role)

    def expert_bid(self, role: str) -> float:
        return expert.expert_bid(self._view(), role, self.config.expert_bids)


__all__ = [
    "MineStudioCraftingEnv",
    "inventory_counts",
    "new_milestones",
    "observation_text",
    "require_minestudio",
    "reward_callback_config",
    "steve_prompt",
]
