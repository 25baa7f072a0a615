"""The Minecraft crafting task (iron pickaxe and other tech-tree targets) on an embedded world."""

from __future__ import annotations

from bidswarm.envs.crafting.config import CraftingConfig
from bidswarm.envs.crafting.env import ROLE_INSTRUCTIONS, CraftingEnv

__all__ = ["ROLE_INSTRUCTIONS", "CraftingConfig", "CraftingEnv"]
