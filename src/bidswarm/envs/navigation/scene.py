"""Procedural indoor houses and R2R-style episodes for the embedded navigation task.

A house is a grid of rectangular rooms (bedroom, kitchen, hallway, ...) separated by straight
walls with doorways; each room holds a few named landmarks ("kitchen table", "sofa", "bed").
Walls are axis-aligned segments; landmarks are points one can walk past. Rooms are convex, so the
shortest path is a chain of straight legs through doorways: a small graph with two nodes per
doorway (one on each side) gives exact geodesic distances to the goal and the route the
instruction describes.

Everything here is immutable and built from integers (a seed and the config's scene knobs), so
houses and episodes are cached and shared between environments and their snapshots. One module
over 400 lines on purpose: the houses and the routes through them share one wall-and-doorway
geometry.
"""

from __future__ import annotations

import bisect
import functools
import heapq
import itertools
import math
import random
from dataclasses import dataclass

from bidswarm.envs.navigation.metrics import Point, resample_path

AGENT_RADIUS = 0.2
"""Clearance the agent keeps from walls (metres)."""
DOOR_NODE_OFFSET = 0.5
"""Route nodes sit this far in front of a doorway, on each side."""
WALL_MARGIN = 0.6
"""Starts and landmarks keep this far from walls."""
REFERENCE_SPACING = 0.25
"""nDTW's reference path is the shortest path sampled at the 25 cm step of a move."""

ROOM_TYPES: dict[str, tuple[str, ...]] = {
    "bedroom": ("bed", "wardrobe", "nightstand"),
    "kitchen": ("kitchen table", "fridge", "stove"),
    "hallway": ("coat rack", "potted plant"),
    "living room": ("sofa", "tv", "armchair"),
    "bathroom": ("bathtub", "sink"),
    "office": ("desk", "bookshelf"),
    "dining room": ("dining table", "cabinet"),
    "laundry room": ("washing machine", "ironing board"),
    "playroom": ("toy box", "piano"),
}

Segment = tuple[float, float, float, float]
"""An axis-aligned wall piece (x0, y0, x1, y1) with x0 <= x1 and y0 <= y1."""


@dataclass(frozen=True)
class SceneParams:
    """The config knobs that shape houses and episodes (hashable, for the caches)."""

    max_rooms_per_side: int
    min_room_size: float
    max_room_size: float
    door_width: float
    extra_door_probability: float
    min_route_rooms: int
    max_route_rooms: int


@dataclass(frozen=True)
class Door:
    """A doorway between rooms ``a`` and ``b``; ``normal`` points from ``a`` into ``b``."""

    a: int
    b: int
    center: Point
    normal: Point

    def node(self, side: int) -> Point:
        """The route node in front of the doorway in room ``a`` (side 0) or ``b`` (side 1)."""
        sign = -1.0 if side == 0 else 1.0
        return (
            self.center[0] + sign * DOOR_NODE_OFFSET * self.normal[0],
            self.center[1] + sign * DOOR_NODE_OFFSET * self.normal[1],
        )


@dataclass(frozen=True)
class Landmark:
    name: str
    room: int
    position: Point


@dataclass(frozen=True)
class Scene:
    """A house: room grid, names, doorways, landmarks and wall pieces."""

    scene_id: int
    xs: tuple[float, ...]
    ys: tuple[float, ...]
    room_names: tuple[str, ...]
    doors: tuple[Door, ...]
    landmarks: tuple[Landmark, ...]
    room_walls: tuple[tuple[Segment, ...], ...]
    room_doors: tuple[tuple[int, ...], ...]
    all_walls: tuple[Segment, ...]

    @property
    def cols(self) -> int:
        return len(self.xs) - 1

    def room_of(self, point: Point) -> int:
        """The room whose cell holds ``point`` (points on a wall go to the higher cell)."""
        col = min(max(bisect.bisect_right(self.xs, point[0]) - 1, 0), len(self.xs) - 2)
        row = min(max(bisect.bisect_right(self.ys, point[1]) - 1, 0), len(self.ys) - 2)
        return row * self.cols + col

    def room_box(self, room: int) -> tuple[float, float, float, float]:
        """(x0, y0, x1, y1) of ``room``."""
        row, col = divmod(room, self.cols)
        return self.xs[col], self.ys[row], self.xs[col + 1], self.ys[row + 1]

    def fingerprint(self) -> tuple:
        """What makes two houses the same house (layout, names, doors, landmarks)."""
        return (
            tuple(round(x, 3) for x in self.xs),
            tuple(round(y, 3) for y in self.ys),
            self.room_names,
            tuple((d.a, d.b, round(d.center[0], 3), round(d.center[1], 3)) for d in self.doors),
        )


# -- geometry --------------------------------------------------------------------------------------
def distance_to_segment(point: Point, wall: Segment) -> float:
    x0, y0, x1, y1 = wall
    dx = point[0] - min(max(point[0], x0), x1)
    dy = point[1] - min(max(point[1], y0), y1)
    return math.hypot(dx, dy)


def crosses(start: Point, end: Point, wall: Segment) -> bool:
    """Whether the straight move ``start -> end`` crosses ``wall``."""
    x0, y0, x1, y1 = wall
    if x0 == x1:  # vertical wall
        if (start[0] - x0) * (end[0] - x0) > 0 or start[0] == end[0]:
            return False
        t = (x0 - start[0]) / (end[0] - start[0])
        y = start[1] + t * (end[1] - start[1])
        return y0 <= y <= y1
    if (start[1] - y0) * (end[1] - y0) > 0 or start[1] == end[1]:
        return False
    t = (y0 - start[1]) / (end[1] - start[1])
    x = start[0] + t * (end[0] - start[0])
    return x0 <= x <= x1


def ray_distance(origin: Point, angle_degrees: float, walls: tuple[Segment, ...]) -> float:
    """Distance from ``origin`` along ``angle_degrees`` to the first wall (inf when none)."""
    dx = math.cos(math.radians(angle_degrees))
    dy = math.sin(math.radians(angle_degrees))
    best = math.inf
    for x0, y0, x1, y1 in walls:
        if x0 == x1:
            if abs(dx) < 1e-12:
                continue
            t = (x0 - origin[0]) / dx
            if 0 < t < best and y0 <= origin[1] + t * dy <= y1:
                best = t
        else:
            if abs(dy) < 1e-12:
                continue
            t = (y0 - origin[1]) / dy
            if 0 < t < best and x0 <= origin[0] + t * dx <= x1:
                best = t
    return best


def bearing(start: Point, end: Point) -> float:
    """Direction from ``start`` to ``end`` in degrees (0 = +x, counter-clockwise)."""
    return math.degrees(math.atan2(end[1] - start[1], end[0] - start[0]))


def wrap_degrees(angle: float) -> float:
    """``angle`` in (-180, 180]."""
    angle = (angle + 180.0) % 360.0 - 180.0
    return 180.0 if angle == -180.0 else angle


# -- houses ----------------------------------------------------------------------------------------
def _sizes(rng: random.Random, count: int, params: SceneParams) -> tuple[float, ...]:
    edges = [0.0]
    for _ in range(count):
        edges.append(round(edges[-1] + rng.uniform(params.min_room_size, params.max_room_size), 2))
    return tuple(edges)


def _connecting_pairs(rng: random.Random, cols: int, rows: int, extra: float) -> list[tuple]:
    """Adjacent room pairs that get a door: a random spanning tree plus a few extra doors."""
    pairs = [(r * cols + c, r * cols + c + 1) for r in range(rows) for c in range(cols - 1)]
    pairs += [(r * cols + c, (r + 1) * cols + c) for r in range(rows - 1) for c in range(cols)]
    rng.shuffle(pairs)
    parent = list(range(cols * rows))

    def root(room: int) -> int:
        while parent[room] != room:
            room = parent[room]
        return room

    chosen = []
    for a, b in pairs:
        if root(a) != root(b):
            parent[root(a)] = root(b)
            chosen.append((a, b))
        elif rng.random() < extra:
            chosen.append((a, b))
    return sorted(chosen)


def _split_wall(fixed: float, low: float, high: float, gaps: list[float], half: float, vertical):
    """Pieces of a wall from ``low`` to ``high`` with doorway gaps centred at ``gaps``."""
    pieces = []
    cursor = low
    for gap in sorted(gaps):
        pieces.append((cursor, gap - half))
        cursor = gap + half
    pieces.append((cursor, high))
    if vertical:
        return [(fixed, a, fixed, b) for a, b in pieces if b > a]
    return [(a, fixed, b, fixed) for a, b in pieces if b > a]


@functools.lru_cache(maxsize=512)
def build_scene(scene_id: int, params: SceneParams) -> Scene:
    """The house of ``scene_id`` (deterministic; cached)."""
    rng = random.Random(f"navigation-scene-{scene_id}")
    cols = rng.randint(2, params.max_rooms_per_side)
    rows = rng.randint(2, params.max_rooms_per_side)
    xs, ys = _sizes(rng, cols, params), _sizes(rng, rows, params)
    names = tuple(rng.sample(sorted(ROOM_TYPES), cols * rows))
    half = params.door_width / 2
    doors = []
    for a, b in _connecting_pairs(rng, cols, rows, params.extra_door_probability):
        row, col = divmod(a, cols)
        if b == a + 1:  # east neighbour: a door in the vertical wall x = xs[col + 1]
            low, high = ys[row] + half + 0.3, ys[row + 1] - half - 0.3
            doors.append(Door(a, b, (xs[col + 1], round(rng.uniform(low, high), 2)), (1.0, 0.0)))
        else:  # north neighbour: a door in the horizontal wall y = ys[row + 1]
            low, high = xs[col] + half + 0.3, xs[col + 1] - half - 0.3
            doors.append(Door(a, b, (round(rng.uniform(low, high), 2), ys[row + 1]), (0.0, 1.0)))
    room_walls, room_doors, landmarks = [], [], []
    for room in range(cols * rows):
        row, col = divmod(room, cols)
        x0, y0, x1, y1 = xs[col], ys[row], xs[col + 1], ys[row + 1]
        mine = [k for k, door in enumerate(doors) if room in (door.a, door.b)]
        room_doors.append(tuple(mine))
        on = {side: [] for side in ("west", "east", "south", "north")}
        for k in mine:
            door = doors[k]
            if door.normal == (1.0, 0.0):
                on["east" if door.a == room else "west"].append(door.center[1])
            else:
                on["north" if door.a == room else "south"].append(door.center[0])
        walls = (
            _split_wall(x0, y0, y1, on["west"], half, vertical=True)
            + _split_wall(x1, y0, y1, on["east"], half, vertical=True)
            + _split_wall(y0, x0, x1, on["south"], half, vertical=False)
            + _split_wall(y1, x0, x1, on["north"], half, vertical=False)
        )
        room_walls.append(tuple(walls))
        kinds = ROOM_TYPES[names[room]]
        for name in rng.sample(kinds, rng.randint(1, min(2, len(kinds)))):
            landmarks.append(Landmark(name, room, _near_wall_point(rng, (x0, y0, x1, y1))))
    return Scene(
        scene_id=scene_id,
        xs=xs,
        ys=ys,
        room_names=names,
        doors=tuple(doors),
        landmarks=tuple(landmarks),
        room_walls=tuple(room_walls),
        room_doors=tuple(room_doors),
        all_walls=tuple(sorted({wall for walls in room_walls for wall in walls})),
    )


def _near_wall_point(rng: random.Random, box: tuple[float, float, float, float]) -> Point:
    x0, y0, x1, y1 = box
    side = rng.randrange(4)
    along_x = rng.uniform(x0 + WALL_MARGIN + 0.1, x1 - WALL_MARGIN - 0.1)
    along_y = rng.uniform(y0 + WALL_MARGIN + 0.1, y1 - WALL_MARGIN - 0.1)
    point = [
        (x0 + WALL_MARGIN, along_y),
        (x1 - WALL_MARGIN, along_y),
        (along_x, y0 + WALL_MARGIN),
        (along_x, y1 - WALL_MARGIN),
    ][side]
    return (round(point[0], 2), round(point[1], 2))


# -- shortest paths --------------------------------------------------------------------------------
@dataclass(frozen=True)
class GoalField:
    """Geodesic distances to one goal: per route node (2 per doorway) and the next hop."""

    goal: Point
    goal_room: int
    node_distance: tuple[float, ...]
    next_node: tuple[int, ...]
    """Next route node toward the goal; -1: the goal itself."""


def node_room(scene: Scene, node: int) -> int:
    door = scene.doors[node // 2]
    return door.a if node % 2 == 0 else door.b


def node_point(scene: Scene, node: int) -> Point:
    return scene.doors[node // 2].node(node % 2)


def goal_field(scene: Scene, goal: Point) -> GoalField:
    """Dijkstra from the goal over the doorway nodes (rooms are convex: legs are straight)."""
    goal_room = scene.room_of(goal)
    count = 2 * len(scene.doors)
    distance = [math.inf] * count
    next_node = [-1] * count
    heap = []
    for room_node in _room_nodes(scene, goal_room):
        distance[room_node] = math.dist(node_point(scene, room_node), goal)
        heap.append((distance[room_node], room_node))
    heapq.heapify(heap)
    while heap:
        dist, node = heapq.heappop(heap)
        if dist > distance[node]:
            continue
        # Neighbours: the node across the same doorway, and every node of its own room.
        neighbours = [node ^ 1, *_room_nodes(scene, node_room(scene, node))]
        for other in neighbours:
            if other == node:
                continue
            candidate = dist + math.dist(node_point(scene, node), node_point(scene, other))
            if candidate < distance[other] - 1e-12:
                distance[other] = candidate
                next_node[other] = node
                heapq.heappush(heap, (candidate, other))
    return GoalField(goal, goal_room, tuple(distance), tuple(next_node))


def _room_nodes(scene: Scene, room: int) -> list[int]:
    return [2 * k + (0 if scene.doors[k].a == room else 1) for k in scene.room_doors[room]]


def first_hop(scene: Scene, field: GoalField, point: Point) -> tuple[float, int]:
    """(geodesic distance from ``point`` to the goal, first route node; -1: straight to goal)."""
    room = scene.room_of(point)
    if room == field.goal_room:
        return math.dist(point, field.goal), -1
    best, best_node = math.inf, -1
    for node in _room_nodes(scene, room):
        candidate = math.dist(point, node_point(scene, node)) + field.node_distance[node]
        if candidate < best:
            best, best_node = candidate, node
    return best, best_node


def route_points(scene: Scene, field: GoalField, start: Point) -> tuple[list[Point], list[int]]:
    """The shortest path from ``start``: its points (start ... goal) and its route nodes."""
    _, node = first_hop(scene, field, start)
    points, nodes = [start], []
    while node != -1:
        nodes.append(node)
        points.append(node_point(scene, node))
        node = field.next_node[node]
    points.append(field.goal)
    return points, nodes


# -- episodes --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Episode:
    """One R2R-style episode in a house: start pose, goal landmark, instruction, route."""

    seed: int
    scene: Scene
    start: Point
    start_heading: int
    goal_landmark: Landmark
    field: GoalField
    instruction: str
    reference: tuple[Point, ...]
    shortest_distance: float


def _turn_word(entering: float, leaving: float) -> str:
    turn = wrap_degrees(leaving - entering)
    if abs(turn) < 35:
        return "go straight"
    return "turn left" if turn > 0 else "turn right"


def describe_route(scene: Scene, points: list[Point], nodes: list[int], goal_name: str) -> str:
    """An R2R-style instruction: leave the room, turn into each next room, stop by the goal."""
    rooms = [scene.room_of(points[0])]
    phrases = [f"leave the {scene.room_names[rooms[0]]}"]
    # A doorway is crossed between a node and its partner across it; the turn taken after
    # entering a room is measured between the doorway's direction and the leg that follows.
    for j in range(len(nodes) - 1):
        if nodes[j + 1] != nodes[j] ^ 1:
            continue
        near, far, following = points[j + 1], points[j + 2], points[j + 3]
        word = _turn_word(bearing(near, far), bearing(far, following))
        phrases.append(f"{word} into the {scene.room_names[node_room(scene, nodes[j + 1])]}")
    phrases.append(f"stop by the {goal_name}")
    return ", ".join(phrases) + "."


def read_route(instruction: str) -> tuple[tuple[str, ...], str]:
    """The rooms an instruction of :func:`describe_route` walks through, in order, and its goal
    landmark: what a reader of the instruction knows of the route."""
    phrases = instruction.removesuffix(".").split(", ")
    rooms = [phrases[0].removeprefix("leave the ")]
    rooms += [phrase.split(" into the ", 1)[1] for phrase in phrases[1:-1]]
    return tuple(rooms), phrases[-1].removeprefix("stop by the ")


@functools.lru_cache(maxsize=4096)
def build_episode(seed: int, episodes_per_scene: int, params: SceneParams) -> Episode:
    """The episode of ``seed`` in house ``seed // episodes_per_scene`` (deterministic; cached)."""
    scene = build_scene(seed // episodes_per_scene, params)
    rng = random.Random(f"navigation-episode-{seed}")
    rooms = list(range(len(scene.room_names)))
    for _ in range(100):
        start_room = rng.choice(rooms)
        x0, y0, x1, y1 = scene.room_box(start_room)
        start = (
            round(rng.uniform(x0 + WALL_MARGIN, x1 - WALL_MARGIN), 2),
            round(rng.uniform(y0 + WALL_MARGIN, y1 - WALL_MARGIN), 2),
        )
        candidates = []
        for landmark in scene.landmarks:
            field = goal_field(scene, landmark.position)
            points, nodes = route_points(scene, field, start)
            route_rooms = 1 + sum(b == a ^ 1 for a, b in itertools.pairwise(nodes))
            if params.min_route_rooms <= route_rooms <= params.max_route_rooms:
                candidates.append((landmark, field, points, nodes))
        if candidates:
            break
    else:  # pragma: no cover - every house has rooms two doorways apart
        raise RuntimeError(f"seed {seed}: no goal satisfies the route length limits")
    landmark, field, points, nodes = rng.choice(candidates)
    shortest = first_hop(scene, field, start)[0]
    return Episode(
        seed=seed,
        scene=scene,
        start=start,
        start_heading=15 * rng.randrange(24),
        goal_landmark=landmark,
        field=field,
        instruction=describe_route(scene, points, nodes, landmark.name),
        reference=tuple(resample_path(points, spacing=REFERENCE_SPACING)),
        shortest_distance=shortest,
    )
