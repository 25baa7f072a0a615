"""Config of the crafting task; importable without torch (Hydra schema ``task/crafting_schema``)."""

from __future__ import annotations

from dataclasses import dataclass

from bidswarm.checks import Problems
from bidswarm.envs.base import TaskConfig


@dataclass
class CraftingConfig(TaskConfig):
    """The Minecraft crafting task: three roles obtain ``target`` from an empty inventory.

    target: the item to obtain, one of ``techtree.TARGETS`` (``iron_pickaxe``, ``wooden_pickaxe``,
        ``stone_pickaxe``, ``furnace``, ``torch``, ``stone_bricks``).
    max_decisions: decision budget of an episode (skipped steps count).
    n_heldout_seeds: held-out worlds (the paper evaluates 32).
    milestone_rewards: item -> reward paid on its first acquisition. None: the default split over
        the target's tech path, scaled to sum to 140 (the paper's cap; the split is ours). For the
        iron pickaxe: oak log 2, oak planks 3, stick 4, crafting table 5, wooden pickaxe 8,
        cobblestone 8, stone pickaxe 12, furnace 12, iron ore 18, iron ingot 24, iron pickaxe 44.
        Other targets weigh their own path's items alike (coal 10, torch 20, stone 16, stone
        bricks 20) and rescale to 140.
    frames_per_instruction: frames of play the skill model gets per instruction (STEVE-1 runs 40);
        more frames mean larger yields and fewer timeouts.
    history_length: recent events (who did what, with what result) shown in observations.
    frames_per_hardness: frames to break a block of hardness 1 by hand; a pickaxe divides it by
        its tier speed. Time is compressed against the real game (20 frames/s) so that one
        instruction harvests a few blocks, as STEVE-1's short instruction segments do.
    expert_bids: how the scripted experts bid (their bids are the SFT bid demonstrations):
        ``graded`` [ours] by how soon the plan needs the role (0.8 next, then 0.6, 0.4, 0.2;
        0 when not needed), ``two_level`` 0.8 next / 0.4 later / 0. The paper does not report
        its demonstrations' bids.

    private_inventory: see the field (the memory experiment's variant, docs/memory.md).
    actions: ``split`` (the paper's) or ``shared`` [ours]: every role may give every
        instruction and a skill drawn per world decides whose works (``crafting/shared.py``).
    """

    name: str = "crafting"
    target: str = "iron_pickaxe"
    max_decisions: int = 120
    n_heldout_seeds: int = 32
    milestone_rewards: dict[str, float] | None = None
    frames_per_instruction: int = 40
    history_length: int = 3
    frames_per_hardness: float = 5.0
    expert_bids: str = "graded"
    private_inventory: bool = False
    """[ours] The Logger sees neither the inventory nor the others' events, only the surface
    and its own; the Smith asks for wood with a note (``need wood``) and the Logger answers it:
    the shared memory carries what one role needs from another (needs ``task.memory.size`` >=
    1; the experts follow it for targets whose wood the Logger gathers on the surface)."""

    def problems(self) -> list[str]:
        from bidswarm.envs.crafting import techtree
        from bidswarm.envs.crafting.expert import EXPERT_BIDS

        problems = Problems(super().problems())
        problems.one_of("task.target", self.target, techtree.TARGETS)
        problems.one_of("task.expert_bids", self.expert_bids, EXPERT_BIDS)
        if self.milestone_rewards is not None:
            known = set(techtree.game_data().items_name)
            for item, reward in self.milestone_rewards.items():
                key = f"task.milestone_rewards.{item}"
                problems.require(item in known, key, reward, "not a Minecraft 1.16 item name")
                problems.non_negative(key, reward)
        problems.at_least("task.frames_per_instruction", self.frames_per_instruction, 1)
        problems.at_least("task.history_length", self.history_length, 0)
        problems.positive("task.frames_per_hardness", self.frames_per_hardness)
        problems.require(
            not self.private_inventory or self.memory.size >= 1,
            "task.private_inventory",
            self.private_inventory,
            "needs the shared memory: set task.memory.size >= 1",
        )
        problems.require(
            not (self.private_inventory and self.actions == "shared"),
            "task.actions",
            self.actions,
            "task.private_inventory's protocol is the split variant's: use task.actions=split",
        )
        return problems
