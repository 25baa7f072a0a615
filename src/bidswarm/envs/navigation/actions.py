"""NaVILA's action language, split between the three navigation roles.

"turn left N degree" / "turn right N degree" (N snapped to 15/30/45), "move forward N cm" (N
snapped to 25/50/75) and "stop". A command runs as atomic steps of 15 degrees or 25 cm, the step
sizes of VLN-CE. Shared by the embedded task and the Habitat adapter.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from bidswarm.envs.quoting import quote

TURN_DEGREES = (15, 30, 45)
MOVE_CENTIMETRES = (25, 50, 75)
TURN_STEP_DEGREES = 15
MOVE_STEP_CENTIMETRES = 25

TURNER, MOVER, STOPPER = "turner", "mover", "stopper"
ROLES = (TURNER, MOVER, STOPPER)
ROLE_OF_KIND = {"turn_left": TURNER, "turn_right": TURNER, "move_forward": MOVER, "stop": STOPPER}
"""Which role owns each kind of action (the monolithic actor owns all)."""

_ACTION_PATTERN = re.compile(
    r"\b(?:turn\s+(?P<side>left|right)\s+(?P<degrees>\d+)\s*(?:degrees?|deg)?"
    r"|move\s+forward\s+(?P<centimetres>\d+)\s*(?:cm|centimetres?|centimeters?)?"
    r"|(?P<stop>stop))\b",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class NavAction:
    """A parsed command: ``kind`` in ROLE_OF_KIND, ``amount`` in degrees or cm (0 for stop)."""

    kind: str
    amount: int = 0

    @property
    def role(self) -> str:
        """The role that owns this kind of action."""
        return ROLE_OF_KIND[self.kind]

    @property
    def atomic_steps(self) -> int:
        """How many 15 degree / 25 cm steps the command is executed as (1 for stop)."""
        if self.kind == "move_forward":
            return self.amount // MOVE_STEP_CENTIMETRES
        if self.kind == "stop":
            return 1
        return self.amount // TURN_STEP_DEGREES

    @property
    def text(self) -> str:
        """The canonical reply that says this command."""
        if self.kind == "move_forward":
            return f"move forward {self.amount} cm"
        if self.kind == "stop":
            return "stop"
        return f"turn {self.kind.removeprefix('turn_')} {self.amount} degree"


def snap(value: int, levels: tuple[int, ...]) -> int:
    """The level nearest to ``value`` (ties go to the smaller level)."""
    return min(levels, key=lambda level: (abs(level - value), level))


def parse_action(reply: str) -> NavAction | None:
    """The first command said in ``reply``, numbers snapped; None when there is none."""
    match = _ACTION_PATTERN.search(reply)
    if match is None:
        return None
    if match.group("stop"):
        return NavAction("stop")
    if match.group("side"):
        degrees = snap(_number(match.group("degrees")), TURN_DEGREES)
        return NavAction(f"turn_{match.group('side').lower()}", degrees)
    return NavAction("move_forward", snap(_number(match.group("centimetres")), MOVE_CENTIMETRES))


def _number(digits: str) -> int:
    """The number a reply says; a huge one (Python refuses to convert more than 4300 digits)
    stands for a large number, which snaps to the largest level as any large number does."""
    return int(digits) if len(digits) <= 9 else 10**9


def role_may_act(role: str | None, action: NavAction) -> bool:
    """Whether an agent of ``role`` (None: monolithic) owns ``action``."""
    return role is None or action.role == role


def rejection_message(role: str | None, reply: str, action: NavAction | None) -> str:
    """Feedback for a wasted turn, shown in the next observation."""
    shown = quote(reply)[:40]
    if action is None:
        return f"'{shown}' is not an action"
    return f"{role} cannot {action.kind.replace('_', ' ')}: {action.role}'s action"


def steer(
    position: tuple[float, float],
    heading: float,
    target: tuple[float, float],
    distance_to_goal: float,
    stop_distance: float,
) -> NavAction:
    """The scripted experts' next command toward ``target`` (the next point of the path).

    Stop within ``stop_distance`` of the goal; otherwise turn (15/30/45) when the target is more
    than half a turn step off the heading, else move forward up to 75 cm toward it.
    Headings in degrees, counter-clockwise (turning left adds).
    """
    if distance_to_goal <= stop_distance:
        return NavAction("stop")
    dx, dy = target[0] - position[0], target[1] - position[1]
    turn = (math.degrees(math.atan2(dy, dx)) - heading + 180.0) % 360.0 - 180.0
    if abs(turn) > TURN_STEP_DEGREES / 2:
        degrees = snap(TURN_STEP_DEGREES * round(abs(turn) / TURN_STEP_DEGREES), TURN_DEGREES)
        return NavAction("turn_left" if turn > 0 else "turn_right", degrees)
    steps = round(math.hypot(dx, dy) * 100 / MOVE_STEP_CENTIMETRES)
    return NavAction("move_forward", MOVE_STEP_CENTIMETRES * min(max(steps, 1), 3))
