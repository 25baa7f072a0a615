"""What the collector derives from a key: the rows that share it (:func:`group_by`: one batch per
agent) and the randomness it names (:func:`seeded_randomness`: an update's or an evaluation's
name replays its rollouts)."""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable, Iterable
from typing import Any, TypeVar

import torch

Item = TypeVar("Item")


def group_by(items: Iterable[Item], key: Callable[[Item], Any]) -> list[tuple[Any, list[Item]]]:
    """``(key, [items with that key])`` in increasing key order, items in their given order:
    how every per-agent batch of the collector is formed."""
    groups: dict[Hashable, list[Item]] = {}
    for item in items:
        groups.setdefault(key(item), []).append(item)
    return sorted(groups.items(), key=lambda group: group[0])


def seeded_randomness(
    key: str, device: torch.device | str
) -> tuple[random.Random, torch.Generator]:
    """The ``random.Random`` (auction ties, world draws) and the ``torch.Generator`` on
    ``device`` (sampling) that ``key`` determines: the same key replays the same rollouts."""
    rng = random.Random(key)
    generator = torch.Generator(device=device)
    generator.manual_seed(rng.randrange(2**63))
    return rng, generator
