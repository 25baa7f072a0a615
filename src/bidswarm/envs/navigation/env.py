"""The embedded VLN-CE-style navigation task: three roles share one body in a procedural house.

The Turner owns "turn left/right N degree", the Mover "move forward N cm", the Stopper "stop"
(docs/method.md section 6). The pose is continuous (x, y in metres, heading in degrees);
commands run as 15 degree / 25 cm atomic steps and a step into a wall is refused (the move ends
there). Observations are short text: the instruction, the current room, the wall ahead, every
doorway and landmark of the room with its distance (quarter metres) and direction (``ahead``,
``left 30``, ``right 45``, ``behind``: the turn step), and the result of the last decision. The
experts read nothing else: the instruction names the rooms of the route, the current room says which
doorway (or the goal) comes next, and its view (distance, direction) gives the command [ours].

Reward [ours]: progress along the shortest path, normalised by the start's geodesic distance (so
reaching the goal sums to ``progress_weight``), plus ``success_bonus`` for a ``stop`` within
``success_distance``; an episode can score above 1.0 as in the paper.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from bidswarm.envs.base import StepResult, register_task
from bidswarm.envs.navigation import shared
from bidswarm.envs.navigation.actions import (
    MOVE_CENTIMETRES,
    MOVE_STEP_CENTIMETRES,
    TURN_DEGREES,
    NavAction,
)
from bidswarm.envs.navigation.common import NavigationRules
from bidswarm.envs.navigation.config import NavigationConfig
from bidswarm.envs.navigation.metrics import PathMetrics, Point
from bidswarm.envs.navigation.scene import (
    AGENT_RADIUS,
    Episode,
    SceneParams,
    bearing,
    build_episode,
    crosses,
    distance_to_segment,
    first_hop,
    ray_distance,
    read_route,
    wrap_degrees,
)

EXPERT_STOP_DISTANCE = 0.5
"""The scripted experts stop when the goal is seen this close (metres, as the view rounds it)."""
WAYPOINT_TOLERANCE = 0.2
"""A route node this close is reached: its doorway is then seen at the node across it."""
DIRECTION_STEP_DEGREES = 15
"""Directions in observations are rounded to the turn step, so a seen bearing is a turn."""
DISTANCE_STEP_METRES = 0.25
"""Distances in observations are rounded to the atomic move."""


@dataclass(frozen=True)
class View:
    """One thing the robot sees, exactly as the observation says it (``door to kitchen 1.75 m
    left 30``).

    metres:  the distance rounded to the atomic move.
    degrees: the bearing relative to the heading (left positive) rounded to the turn step, in
             [-180, 180]; None when the thing is ``here`` (closer than ``WAYPOINT_TOLERANCE``).
    """

    label: str
    metres: float
    degrees: int | None

    @property
    def text(self) -> str:
        """Side before degrees, in the order a turn command says them (``turn left 30``)."""
        if self.degrees is None:
            where = "here"
        elif self.degrees == 0:
            where = "ahead"
        elif abs(self.degrees) == 180:
            where = "behind"
        else:
            where = f"{'left' if self.degrees > 0 else 'right'} {abs(self.degrees)}"
        return f"{self.label} {self.metres:g} m {where}"


def seen(label: str, distance: float, relative: float | None) -> View:
    """The view of a thing ``distance`` metres away at ``relative`` degrees (None: here)."""
    metres = round(distance / DISTANCE_STEP_METRES) * DISTANCE_STEP_METRES
    if relative is None:
        return View(label, metres, None)
    return View(label, metres, DIRECTION_STEP_DEGREES * round(relative / DIRECTION_STEP_DEGREES))


def command_toward(view: View, is_goal: bool) -> NavAction:
    """The scripted experts' command toward a seen doorway or the goal, read off its view.

    Stop when the goal is seen within ``EXPERT_STOP_DISTANCE``; turn toward a thing seen off
    ahead (up to 45 degrees at a time, left when it is behind); else move forward up to 75 cm,
    as far as the view says it is.
    """
    if is_goal and view.metres <= EXPERT_STOP_DISTANCE:
        return NavAction("stop")
    if view.degrees:
        side = "left" if view.degrees > 0 or abs(view.degrees) == 180 else "right"
        return NavAction(f"turn_{side}", min(abs(view.degrees), max(TURN_DEGREES)))
    steps = round(view.metres * 100 / MOVE_STEP_CENTIMETRES)
    most = max(MOVE_CENTIMETRES) // MOVE_STEP_CENTIMETRES
    return NavAction("move_forward", MOVE_STEP_CENTIMETRES * min(max(steps, 1), most))


@register_task("navigation")
class NavigationEnv(NavigationRules):
    """Follow an R2R-style route instruction in a procedural house (see the module docstring)."""

    Config = NavigationConfig

    def __init__(self, config: NavigationConfig):
        super().__init__(config)
        self.config: NavigationConfig = config
        self._params = SceneParams(
            max_rooms_per_side=config.max_rooms_per_side,
            min_room_size=config.min_room_size,
            max_room_size=config.max_room_size,
            door_width=config.door_width,
            extra_door_probability=config.extra_door_probability,
            min_route_rooms=config.min_route_rooms,
            max_route_rooms=config.max_route_rooms,
        )
        self._episode: Episode | None = None
        self._position: Point = (0.0, 0.0)
        self._heading = 0
        self._decisions = 0
        self._done = False
        self._stopped = False
        self._total_reward = 0.0
        self._last = ""
        self._distance_to_goal = 0.0
        self._metrics: PathMetrics | None = None
        self.room_knower: tuple[int, ...] = ()
        """``task.actions=shared``: room -> the index of the role that knows it (per episode)."""

    # -- seeds ---------------------------------------------------------------------------------
    def scene_id(self, seed: int) -> int:
        """The house a seed's episode takes place in."""
        return seed // self.config.episodes_per_scene

    def episode_of(self, seed: int) -> Episode:
        """The (cached, immutable) episode of ``seed``."""
        return build_episode(seed, self.config.episodes_per_scene, self._params)

    # -- text ----------------------------------------------------------------------------------
    # -- episode -------------------------------------------------------------------------------
    def reset(self, seed: int) -> None:
        seed = self.begin_episode(seed)
        episode = self.episode_of(seed)
        self._episode = episode
        self._position = episode.start
        self._heading = episode.start_heading
        self._decisions = 0
        self._done = False
        self._stopped = False
        self._total_reward = 0.0
        self._last = "start"
        self._distance_to_goal = episode.shortest_distance
        self._metrics = PathMetrics(
            episode.reference, episode.shortest_distance, self.config.success_distance
        )
        self._metrics.start(episode.start)
        self.memory.clear()
        if self.config.actions == "shared":
            rooms = len(episode.scene.room_names)
            self.room_knower = shared.draw_rooms(seed, rooms, len(self.roles))

    @property
    def episode(self) -> Episode:
        if self._episode is None:
            self.require_started("using the world")
        return self._episode

    @property
    def position(self) -> Point:
        return self._position

    @property
    def heading(self) -> int:
        """Degrees, 0 = +x, counter-clockwise (turning left adds)."""
        return self._heading

    def distance_to_goal(self) -> float:
        """Geodesic distance from the current position to the goal (metres)."""
        return self._distance_to_goal

    def open_reward(self) -> float:
        """The reward still open: the progress reward of the geodesic distance left (a whole
        route's ``progress_weight`` from the start) plus the success bonus; 0 once the episode
        has ended. Moving away from the goal raises it: the reward to win back grows."""
        if self._done:
            return 0.0
        progress = self._distance_to_goal / max(self.episode.shortest_distance, 1e-6)
        return self.config.progress_weight * progress + self.config.success_bonus

    def screen(self, role: str | None) -> str:
        """The instruction, the room, the views (under shared actions, only the wall ahead in
        a room ``role`` does not know) and the last result."""
        seen_views = self._views() if self.knows(role) else self._views()[:1]
        views = "; ".join(view.text for view in seen_views)
        if not self.knows(role):
            views += f"; {shared.UNKNOWN_ROOM}"
        room = self._room_name()
        return f"go: {self.episode.instruction} in: {room}; {views}; last: {self._last}."

    def knows(self, role: str | None) -> bool:
        if self.config.actions == "split" or role is None:
            return True
        room = self.episode.scene.room_of(self._position)
        return self.room_knower[room] == self.roles.index(role)

    def _room_name(self) -> str:
        scene = self.episode.scene
        return scene.room_names[scene.room_of(self._position)]

    def _views(self) -> list[View]:
        """The wall ahead, then each doorway and landmark of the current room: how far, which
        way. A doorway is seen at its route node on this side, or on the far side once that is
        reached (where a walker heads next to pass through it)."""
        scene = self.episode.scene
        room = scene.room_of(self._position)
        ahead = ray_distance(self._position, self._heading, scene.room_walls[room])
        if math.isinf(ahead):  # the ray leaves through a doorway
            ahead = ray_distance(self._position, self._heading, scene.all_walls)
        views = [seen("wall", ahead, 0.0)]
        items = []
        for door in (scene.doors[k] for k in scene.room_doors[room]):
            side = 0 if door.a == room else 1
            point = door.node(side)
            if math.dist(self._position, point) < WAYPOINT_TOLERANCE:
                point = door.node(1 - side)
            items.append((f"door to {scene.room_names[door.b if side == 0 else door.a]}", point))
        items += [(mark.name, mark.position) for mark in scene.landmarks if mark.room == room]
        for label, point in items:
            distance = math.dist(self._position, point)
            relative = wrap_degrees(bearing(self._position, point) - self._heading)
            views.append(seen(label, distance, None if distance < WAYPOINT_TOLERANCE else relative))
        return views

    def act(self, actor_role: str | None, action: str) -> StepResult:
        command, wasted = self._take_decision(actor_role, action)
        if wasted is not None:
            return wasted
        before = self._distance_to_goal
        bonus = 0.0
        if command.kind == "stop":
            self._stopped = True
            self._done = True
            self._last = "stopped"
            if self._distance_to_goal <= self.config.success_distance:
                bonus = self.config.success_bonus
        elif command.kind == "move_forward":
            self._last = self._move(command)
        else:
            sign = 1 if command.kind == "turn_left" else -1
            self._heading = (self._heading + sign * command.amount) % 360
            self._last = command.text.replace("turn", "turned")
        progress = (before - self._distance_to_goal) / max(self.episode.shortest_distance, 1e-6)
        reward = self.config.progress_weight * progress + bonus
        self._total_reward += reward
        self._done = self._done or self._decisions >= self.config.max_decisions
        return StepResult(reward, self._done, valid=True, message=self._last)

    def _move(self, command: NavAction) -> str:
        """Advance in 25 cm steps until done or a wall is in the way; the result text."""
        scene = self.episode.scene
        step = MOVE_STEP_CENTIMETRES / 100
        dx = step * math.cos(math.radians(self._heading))
        dy = step * math.sin(math.radians(self._heading))
        moved = 0
        for _ in range(command.atomic_steps):
            here = self._position
            there = (here[0] + dx, here[1] + dy)
            walls = scene.room_walls[scene.room_of(here)]
            if scene.room_of(there) != scene.room_of(here):
                walls = walls + scene.room_walls[scene.room_of(there)]
            if any(
                crosses(here, there, wall) or distance_to_segment(there, wall) < AGENT_RADIUS
                for wall in walls
            ):
                break
            self._position = there
            self._metrics.add(there)
            moved += MOVE_STEP_CENTIMETRES
        self._distance_to_goal = first_hop(scene, self.episode.field, self._position)[0]
        if moved == command.amount:
            return f"moved forward {moved} cm"
        if moved == 0:
            return "blocked by a wall"
        return f"moved {moved} of {command.amount} cm, then a wall"

    # -- fork contract -------------------------------------------------------------------------
    def fork_state(self) -> dict[str, Any]:
        """Pose, counters, reward, last message and metric state; the house comes from the seed.

        Nothing random happens after ``reset``: the seed's RNG is spent on drawing the house and
        the episode, so the seed stands for the RNG state.
        """
        return {
            "seed": self.episode.seed,
            "position": self._position,
            "heading": self._heading,
            "decisions": self._decisions,
            "done": self._done,
            "stopped": self._stopped,
            "total_reward": self._total_reward,
            "last": self._last,
            "distance_to_goal": self._distance_to_goal,
            "metrics": self._metrics.state(),
            "memory": self.memory.state(),
        }

    def load_fork_state(self, state: dict[str, Any]) -> None:
        if self._episode is None or self._episode.seed != state["seed"]:
            self.reset(state["seed"])
        self._position = state["position"]
        self._heading = state["heading"]
        self._decisions = state["decisions"]
        self._done = state["done"]
        self._stopped = state["stopped"]
        self._total_reward = state["total_reward"]
        self._last = state["last"]
        self._distance_to_goal = state["distance_to_goal"]
        self._metrics.load(state["metrics"])
        self.memory.load(state["memory"])

    # -- scripted experts ----------------------------------------------------------------------
    def expert_command(self) -> NavAction | None:
        """The next command of the route the instruction describes, from the observation alone.

        In the i-th room the instruction names, head for the doorway to the next one (in the
        last, for the goal landmark) by its view. None once the episode is over, or off the
        described route (nothing on screen says the way back).
        """
        if self._done:
            return None
        rooms, goal = read_route(self.episode.instruction)
        room = self._room_name()
        if room not in rooms:
            return None
        following = rooms.index(room) + 1
        label = f"door to {rooms[following]}" if following < len(rooms) else goal
        view = next((view for view in self._views() if view.label == label), None)
        return None if view is None else command_toward(view, is_goal=label == goal)


__all__ = ["NavigationEnv"]
