"""The navigation roles on real VLN-CE R2R episodes in habitat-lab (optional backend).

Same roles, action language, reward and metrics as the embedded task; the world is habitat-sim
with Matterport3D houses and the episodes are VLN-CE's R2R (``docs/habitat.md`` installs both).
A command runs as habitat's atomic ``turn_left`` / ``turn_right`` (15 degrees) and
``move_forward`` (25 cm) actions. The text observation summarises three depth views (ahead, left,
right), with object names from the semantic sensor when the scene has annotations.

Fork contract: ``set_agent_state`` restores only the pose. The snapshot also holds habitat's step
counter, its episode-over and stop flags, and our own metric state (path length, nDTW table); the
metrics are ours (``PathMetrics``), not habitat's measures, whose internals are not restorable.

The pure parts (action names, view summaries, floor-plane geometry) need neither habitat nor its
data and are tested on their own; ``habitat`` and ``habitat_sim`` are imported only when a
:class:`HabitatNavigationEnv` is built.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from bidswarm.envs.base import StepResult
from bidswarm.envs.navigation.actions import (
    NavAction,
    steer,
)
from bidswarm.envs.navigation.common import NavigationRules
from bidswarm.envs.navigation.config import NavigationConfig
from bidswarm.envs.navigation.metrics import PathMetrics, Point

HABITAT_ACTION_NAMES = {
    "turn_left": "turn_left",
    "turn_right": "turn_right",
    "move_forward": "move_forward",
    "stop": "stop",
}
"""Our action kinds -> habitat-lab's VLN task action names."""
BACKGROUND_LABELS = frozenset({"", "void", "wall", "floor", "ceiling", "misc", "objects"})
"""Semantic categories that are not worth naming in a view."""
EXPERT_STOP_DISTANCE = 0.5
WAYPOINT_TOLERANCE = 0.2


@dataclass
class HabitatNavigationConfig(NavigationConfig):
    """Where habitat finds VLN-CE R2R; seeds index episodes of ``split``.

    Train on ``split=train``, evaluate on ``split=val_unseen`` (unseen houses).
    """

    name: str = "navigation_habitat"
    habitat_config: str = "benchmark/nav/vln_r2r.yaml"
    """habitat-lab's VLN R2R benchmark config (RGB-D agent, 15 degree turns, 25 cm steps)."""
    split: str = "val_unseen"
    data_path: str = "data/datasets/R2R_VLNCE_v1-3_preprocessed/{split}/{split}.json.gz"
    scenes_dir: str = "data/scene_datasets/"


# -- pure parts ---------------------------------------------------------------------------------
def habitat_actions(command: NavAction) -> list[str]:
    """The atomic habitat actions a command runs as (``turn left 45 degree`` -> 3 turns)."""
    return [HABITAT_ACTION_NAMES[command.kind]] * command.atomic_steps


def floor_point(position: Any) -> Point:
    """A habitat position (x, y up, z) on our floor plane, oriented so that left turns add.

    habitat turns left by rotating about +y, which is clockwise in (x, z): using (x, -z) makes
    headings counter-clockwise as in the embedded task.
    """
    return (float(position[0]), -float(position[2]))


def heading_of(forward: Any) -> float:
    """Heading in [0, 360) degrees of a habitat forward vector (x, y, z) on the floor plane."""
    return math.degrees(math.atan2(-float(forward[2]), float(forward[0]))) % 360.0


def summarize_view(
    depth: np.ndarray,
    semantic: np.ndarray | None = None,
    labels: dict[int, str] | None = None,
    min_share: float = 0.1,
) -> tuple[str, float]:
    """(what, distance in metres) in the middle of a view.

    Looks at the central third of columns in the horizon band (middle third of rows). ``what`` is
    the most common named object there (``semantic`` ids mapped by ``labels``, background like
    walls and floors ignored) when it covers at least ``min_share`` of the band; its distance is
    its median depth. Otherwise ``wall`` at the 10th percentile of the band's depth.
    """
    depth = np.asarray(depth, dtype=np.float32)
    if depth.ndim == 3:
        depth = depth[..., 0]
    rows, cols = depth.shape
    band = (
        slice(rows // 3, max(2 * rows // 3, rows // 3 + 1)),
        slice(cols // 3, max(2 * cols // 3, cols // 3 + 1)),
    )
    band_depth = depth[band]
    valid = band_depth > 0
    if semantic is not None and labels:
        ids = np.asarray(semantic)[band]
        names = Counter(
            labels.get(int(i), "") for i in ids[valid].ravel() if labels.get(int(i), "")
        )
        for name, count in names.most_common():
            if name.lower() in BACKGROUND_LABELS:
                continue
            if count >= min_share * band_depth.size:
                mask = valid & np.isin(ids, [i for i, n in labels.items() if n == name])
                return name, float(np.median(band_depth[mask]))
            break
    if not valid.any():
        return "wall", 0.0
    return "wall", float(np.percentile(band_depth[valid], 10))


def describe_views(views: list[tuple[str, str, float]]) -> str:
    """``ahead: sofa 1.5 m; left: wall 0.5 m; ...`` from (direction, what, metres) triples."""
    return "; ".join(f"{side}: {what} {round(metres * 2) / 2:g} m" for side, what, metres in views)


# -- the environment -------------------------------------------------------------------------------
def _import_habitat():
    try:
        import habitat
        import habitat_sim
    except ImportError as error:  # pragma: no cover - depends on the user's installation
        raise ImportError(
            "the Habitat navigation backend needs habitat-sim (conda) and habitat-lab; see "
            "docs/habitat.md"
        ) from error
    return habitat, habitat_sim


class HabitatNavigationEnv(NavigationRules):
    """Turner / Mover / Stopper on habitat-lab VLN-CE R2R episodes (see the module docstring)."""

    Config = HabitatNavigationConfig
    setting = "a real house"

    def __init__(self, config: HabitatNavigationConfig):
        super().__init__(config)
        if config.actions != "split":
            raise ValueError(
                f"task.actions={config.actions!r}: the Habitat adapter has the split variant "
                "only; use split"
            )
        if self.memory.enabled:
            raise ValueError(
                f"task.memory.size={config.memory.size}: the Habitat adapter has no shared "
                "memory; use 0"
            )
        self.config: HabitatNavigationConfig = config
        habitat, habitat_sim = _import_habitat()
        self._quaternions = habitat_sim.utils.common
        overrides = [
            f"habitat.dataset.split={config.split}",
            f"habitat.dataset.data_path={config.data_path}",
            f"habitat.dataset.scenes_dir={config.scenes_dir}",
            # Up to 3 atomic actions per decision; the decision budget is ours.
            f"habitat.environment.max_episode_steps={3 * config.max_decisions + 1}",
        ]
        habitat_config = habitat.get_config(config.habitat_config, overrides=overrides)
        self._check_step_sizes(habitat_config)
        depth_sensor = habitat_config.habitat.simulator.agents.main_agent.sim_sensors.depth_sensor
        self._depth_scale = depth_sensor.max_depth if depth_sensor.normalize_depth else 1.0
        self._env = habitat.Env(config=habitat_config)
        self._episodes = list(self._env.episodes)
        self._seed: int | None = None
        self._views_cache: tuple | None = None

    @staticmethod
    def _check_step_sizes(habitat_config: Any) -> None:
        task, sim = habitat_config.habitat.task, habitat_config.habitat.simulator
        sizes = (task.actions.turn_left.turn_angle, task.actions.turn_right.turn_angle)
        if sizes != (15, 15) or abs(sim.forward_step_size - 0.25) > 1e-9:
            raise ValueError(
                "the navigation action language needs 15 degree turns and 25 cm steps; got "
                f"turns {sizes}, step {sim.forward_step_size} m"
            )

    # -- seeds ---------------------------------------------------------------------------------
    def train_seeds(self) -> list[int]:
        return list(range(min(self.config.n_train_seeds, len(self._episodes))))

    def heldout_seeds(self) -> list[int]:
        return list(range(min(self.config.n_heldout_seeds, len(self._episodes))))

    # -- text ----------------------------------------------------------------------------------
    # -- habitat state -------------------------------------------------------------------------
    @property
    def _sim(self):
        return self._env.sim

    def _pose(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        state = self._sim.get_agent_state()
        position = tuple(float(v) for v in state.position)
        rotation = tuple(float(v) for v in self._quaternions.quat_to_coeffs(state.rotation))
        return position, rotation

    def _heading(self) -> float:
        state = self._sim.get_agent_state()
        forward = self._quaternions.quat_rotate_vector(state.rotation, np.array([0.0, 0.0, -1.0]))
        return heading_of(forward)

    def _goal(self) -> Any:
        return self._env.current_episode.goals[0].position

    def _geodesic(self) -> float:
        position = self._sim.get_agent_state().position
        return float(self._sim.geodesic_distance(position, self._goal()))

    # -- episode -------------------------------------------------------------------------------
    def reset(self, seed: int) -> None:
        seed = self.begin_episode(seed)
        self._env.current_episode = self._episodes[seed % len(self._episodes)]
        self._env.reset()
        self._seed = seed
        episode = self._env.current_episode
        reference = [floor_point(p) for p in [*episode.reference_path, self._goal()]]
        start = floor_point(episode.start_position)
        self._shortest = float(self._sim.geodesic_distance(episode.start_position, self._goal()))
        self._metrics = PathMetrics(
            [start, *reference], self._shortest, self.config.success_distance
        )
        self._metrics.start(start)
        self._decisions = 0
        self._done = False
        self._stopped = False
        self._total_reward = 0.0
        self._last = "start"
        self._distance_to_goal = self._shortest
        self._views_cache = None

    def screen(self, role: str | None) -> str:
        instruction = self._env.current_episode.instruction.instruction_text.strip()
        return f"go: {instruction} {describe_views(self._views())}; last: {self._last}."

    def _views(self) -> list[tuple[str, str, float]]:
        """Ahead / left / right summaries at the current pose (cached until the pose changes)."""
        position, rotation = self._pose()
        if self._views_cache is not None and self._views_cache[0] == (position, rotation):
            return self._views_cache[1]
        labels = self._semantic_labels()
        current = self._quaternions.quat_from_coeffs(np.array(rotation))
        views = []
        for side, degrees in (("ahead", 0.0), ("left", 90.0), ("right", -90.0)):
            turn = self._quaternions.quat_from_angle_axis(
                math.radians(degrees), np.array([0.0, 1.0, 0.0])
            )
            seen = self._sim.get_observations_at(
                np.array(position), turn * current, keep_agent_at_new_pose=False
            )
            what, metres = summarize_view(
                seen["depth"] * self._depth_scale, seen.get("semantic"), labels
            )
            views.append((side, what, metres))
        self._views_cache = ((position, rotation), views)
        return views

    def _semantic_labels(self) -> dict[int, str]:
        scene = self._sim.semantic_annotations()
        if scene is None:
            return {}
        return {
            obj.semantic_id: obj.category.name()
            for obj in scene.objects
            if obj is not None and obj.category is not None
        }

    def act(self, actor_role: str | None, action: str) -> StepResult:
        command, wasted = self._take_decision(actor_role, action)
        if wasted is not None:
            return wasted
        before = self._distance_to_goal
        bonus = 0.0
        moved = 0
        for name in habitat_actions(command):
            if self._env.episode_over:
                break
            start = floor_point(self._sim.get_agent_state().position)
            self._env.step(name)
            end = floor_point(self._sim.get_agent_state().position)
            if name == "move_forward":
                if math.dist(start, end) > 1e-4:
                    self._metrics.add(end)
                # habitat slides along walls; a step that advanced < 20 cm hit something.
                moved += 25 if math.dist(start, end) > 0.2 else 0
        self._distance_to_goal = self._geodesic()
        if command.kind == "stop":
            self._stopped = True
            self._last = "stopped"
            if self._distance_to_goal <= self.config.success_distance:
                bonus = self.config.success_bonus
        elif command.kind == "move_forward":
            self._last = (
                f"moved forward {moved} cm"
                if moved == command.amount
                else f"moved {moved} of {command.amount} cm, then a wall"
            )
        else:
            self._last = command.text.replace("turn", "turned")
        progress = (before - self._distance_to_goal) / max(self._shortest, 1e-6)
        reward = self.config.progress_weight * progress + bonus
        self._total_reward += reward
        self._done = (
            self._stopped or self._env.episode_over or self._decisions >= self.config.max_decisions
        )
        return StepResult(reward, self._done, valid=True, message=self._last)

    # -- fork contract -------------------------------------------------------------------------
    def fork_state(self) -> dict[str, Any]:
        position, rotation = self._pose()
        return {
            "seed": self._seed,
            "position": position,
            "rotation": rotation,
            "elapsed_steps": int(self._env._elapsed_steps),
            "episode_over": bool(self._env._episode_over),
            "stop_called": bool(self._env.task.is_stop_called),
            "decisions": self._decisions,
            "done": self._done,
            "stopped": self._stopped,
            "total_reward": self._total_reward,
            "last": self._last,
            "distance_to_goal": self._distance_to_goal,
            "metrics": self._metrics.state(),
        }

    def load_fork_state(self, state: dict[str, Any]) -> None:
        if self._seed != state["seed"]:
            self.reset(state["seed"])
        self._sim.set_agent_state(np.array(state["position"]), list(state["rotation"]))
        # set_agent_state restores only the pose: habitat's counters and flags come back here.
        self._env._elapsed_steps = state["elapsed_steps"]
        self._env._episode_over = state["episode_over"]
        self._env.task.is_stop_called = state["stop_called"]
        self._decisions = state["decisions"]
        self._done = state["done"]
        self._stopped = state["stopped"]
        self._total_reward = state["total_reward"]
        self._last = state["last"]
        self._distance_to_goal = state["distance_to_goal"]
        self._metrics.load(state["metrics"])
        self._views_cache = None

    # -- scripted experts ----------------------------------------------------------------------
    def expert_command(self) -> NavAction | None:
        """Next command along habitat's shortest path to the goal (None once over)."""
        if self._done:
            return None
        here = self._sim.get_agent_state().position
        points = self._sim.get_straight_shortest_path_points(here, self._goal())
        position = floor_point(here)
        target = floor_point(self._goal())
        for point in points:
            if math.dist(position, floor_point(point)) >= WAYPOINT_TOLERANCE:
                target = floor_point(point)
                break
        return steer(
            position, self._heading(), target, self._distance_to_goal, EXPERT_STOP_DISTANCE
        )

    def close(self) -> None:
        """Release the simulator."""
        self._env.close()
