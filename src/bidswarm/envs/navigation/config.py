"""Config schema of the navigation task (importable without torch)."""

from __future__ import annotations

from dataclasses import dataclass

from bidswarm.envs.base import TaskConfig


@dataclass
class NavigationConfig(TaskConfig):
    """VLN-CE R2R-style navigation by a Turner, a Mover and a Stopper (PAPER.md section 6).

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
