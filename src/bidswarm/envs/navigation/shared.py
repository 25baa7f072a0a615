"""[ours] The navigation task with shared actions (``task.actions=shared``): every role may give
every command, and each room's layout is known to one role, drawn per episode.

Each episode (its seed) draws, for every room of the house, the one role that knows it. In a
room it knows, a role sees the room's doorways and landmarks as the split variant shows them;
in any other room it sees only the wall ahead (``you do not know this room``). Which role can
steer therefore changes from room to room and from episode to episode: no role, and no fixed
assignment of roles to kinds of command, steers in every room. The monolithic agent sees every
room (the union of the roles' views), as the split variant's does.

The experts: the role that knows the current room bids 0.8 and replies the split variant's
expert command; the others bid 0 and have no reply. One role knows each room, so the top bid
never ties.
"""

from __future__ import annotations

import random

EXPERT_BID = 0.8
UNKNOWN_ROOM = "you do not know this room"


def draw_rooms(seed: int, n_rooms: int, n_roles: int) -> tuple[int, ...]:
    """Room -> the index of the role that knows it, for the episode of ``seed``."""
    rng = random.Random(f"navigation-rooms-{seed}")
    return tuple(rng.randrange(n_roles) for _ in range(n_rooms))


def describe(role: str | None, commands: str) -> str:
    """The role description under shared actions (``commands``: the replies and their sizes)."""
    if role is None:
        return f"You control the robot and know every room: reply {commands}."
    return (
        f"You are the {role}. Any of you may reply {commands}. Each of you knows the layout of "
        "some rooms only, drawn per episode: in a room you do not know, you see no doorways "
        "and no landmarks."
    )
