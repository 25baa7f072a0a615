"""Config schema of the navigation task (importable without torch)."""

from __future__ import annotations

from dataclasses import dataclass

from bidswarm.checks import Problems
from bidswarm.envs.base import TaskConfig


@dataclass
class NavigationConfig(TaskConfig):
    """VLN-CE R2R-style navigation by a Turner, a Mover and a Stopper (docs/method.md section 6).

    The paper does not report its navigation reward; ours (documented, configurable) is the
    progress along the shortest path, normalised so that reaching the goal from the start sums to
    ``progress_weight``, plus ``success_bonus`` when the team stops within ``success_distance``.
    """

    name: str = "navigation"
    max_decisions: int = 64
    n_heldout_seeds: int = 88
    """The paper's held-out set size (88 episodes)."""
    heldout_seed_offset: int = 1_000_000
    """Held-out seeds start here; a multiple of ``episodes_per_scene`` keeps their houses unseen."""

    # -- reward [ours] ---------------------------------------------------------------------------
    progress_weight: float = 1.0
    """Total progress reward for going from the start to the goal along the shortest path."""
    success_bonus: float = 1.0
    """Reward of a ``stop`` within ``success_distance`` of the goal."""
    success_distance: float = 3.0
    """VLN-CE success radius in metres (also the nDTW distance threshold)."""

    # -- procedural houses -----------------------------------------------------------------------
    episodes_per_scene: int = 4
    """Episodes (start, goal, instruction) drawn per house: seed // this number picks the house."""
    max_rooms_per_side: int = 3
    """Houses are grids of 2..this many rooms along each side."""
    min_room_size: float = 3.0
    """Smallest room side in metres."""
    max_room_size: float = 5.5
    """Largest room side in metres."""
    door_width: float = 1.2
    """Width of a doorway in metres."""
    extra_door_probability: float = 0.25
    """Chance of a door between two adjacent rooms beyond those that connect the house."""
    min_route_rooms: int = 2
    """Fewest rooms the shortest route passes through (start room and goal room included)."""
    max_route_rooms: int = 4
    """Most rooms the shortest route passes through (keeps instructions short)."""

    def problems(self) -> list[str]:
        problems = Problems(super().problems())
        problems.non_negative("task.progress_weight", self.progress_weight)
        problems.non_negative("task.success_bonus", self.success_bonus)
        problems.positive("task.success_distance", self.success_distance)
        problems.at_least("task.episodes_per_scene", self.episodes_per_scene, 1)
        problems.at_least("task.max_rooms_per_side", self.max_rooms_per_side, 2)
        problems.positive("task.min_room_size", self.min_room_size)
        problems.require(
            self.max_room_size >= self.min_room_size,
            "task.max_room_size",
            self.max_room_size,
            f"must be >= task.min_room_size ({self.min_room_size})",
        )
        problems.require(
            0 < self.door_width < self.min_room_size,
            "task.door_width",
            self.door_width,
            f"must lie in (0, task.min_room_size={self.min_room_size})",
        )
        problems.unit_interval("task.extra_door_probability", self.extra_door_probability)
        problems.require(
            1 <= self.min_route_rooms <= self.max_route_rooms,
            "task.min_route_rooms",
            self.min_route_rooms,
            f"need 1 <= min_route_rooms <= max_route_rooms ({self.max_route_rooms})",
        )
        return problems
