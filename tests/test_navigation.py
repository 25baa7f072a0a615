"""The embedded VLN-CE-style navigation task: actions, world, metrics, fork contract, experts."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from bidswarm.envs import make_env
from bidswarm.envs.base import EpisodeNotRunning
from bidswarm.envs.conformance import check_fork_contract
from bidswarm.envs.experts import play_expert_episode
from bidswarm.envs.navigation import NavigationConfig, NavigationEnv
from bidswarm.envs.navigation.actions import NavAction, parse_action
from bidswarm.envs.navigation.metrics import PathMetrics, resample_path
from bidswarm.envs.navigation.scene import (
    AGENT_RADIUS,
    distance_to_segment,
    node_room,
    read_route,
    route_points,
)

BID_LEVELS = [0.0, 0.2, 0.4, 0.6, 0.8]
CONF_TASK = Path(__file__).resolve().parents[1] / "conf" / "task" / "navigation_r2r.yaml"


@pytest.fixture
def env() -> NavigationEnv:
    return NavigationEnv(NavigationConfig())


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("turn left 30 degree", NavAction("turn_left", 30)),
        ("Turn RIGHT 90 degrees", NavAction("turn_right", 45)),
        ("turn left 20", NavAction("turn_left", 15)),
        ("move forward 60 cm", NavAction("move_forward", 50)),
        ("I see the door, move forward 75 cm.", NavAction("move_forward", 75)),
        ("move forward 10 cm", NavAction("move_forward", 25)),
        ("stop", NavAction("stop")),
        ("stop.", NavAction("stop")),
        ("", None),
        ("turn around", None),
        ("move backward 50 cm", None),
        ("0.8", None),
    ],
)
def test_parse_action_snaps_to_the_action_language(reply, expected):
    assert parse_action(reply) == expected


def test_registered_and_built_from_config():
    env = make_env(NavigationConfig())
    assert isinstance(env, NavigationEnv)
    assert env.roles == ("turner", "mover", "stopper")
    assert env.config.max_decisions == 64 and env.config.n_heldout_seeds == 88


def test_yaml_matches_the_schema():
    raw = OmegaConf.load(CONF_TASK)
    assert list(raw.pop("defaults")) == ["navigation_schema", "_self_"]
    merged = OmegaConf.merge(OmegaConf.structured(NavigationConfig), raw)
    assert OmegaConf.to_object(merged) == NavigationConfig()


def test_fork_contract(env):
    check_fork_contract(lambda: NavigationEnv(NavigationConfig()), seeds=list(range(25)))


def test_experts_solve_heldout_episodes(env):
    seeds = env.heldout_seeds()[:30]
    episodes = [play_expert_episode(env, seed, BID_LEVELS) for seed in seeds]
    assert all(e.metrics["success"] == 1.0 for e in episodes)
    assert sum(e.metrics["spl"] for e in episodes) / len(episodes) > 0.9
    for episode in episodes:
        assert episode.metrics["decisions"] <= env.config.max_decisions
        # Every role's demonstrations use only that role's own actions.
        for demo in episode.demonstrations:
            if demo.kind == "action" and demo.role is not None:
                assert parse_action(demo.reply).role == demo.role
        assert set(episode.actors) == set(env.roles)


def test_expert_reward_is_progress_plus_success_bonus(env):
    episode = play_expert_episode(env, env.heldout_seeds()[3], BID_LEVELS)
    shortest = env.episode.shortest_distance
    progress = (shortest - episode.metrics["navigation_error"]) / shortest
    assert episode.total_reward == pytest.approx(progress + 1.0)
    assert episode.metrics["reward"] == pytest.approx(episode.total_reward)
    assert episode.total_reward > 1.0  # the paper's navigation reward can exceed 1.0


def test_open_reward_is_what_the_rest_of_an_expert_episode_earns(env):
    """At every state of an expert episode (the experts walk the shortest path and stop at the
    goal) the reward still open is the reward the rest of the episode earns."""
    seed = env.heldout_seeds()[3]
    env.reset(seed)
    start = env.open_reward()
    assert start == pytest.approx(env.config.progress_weight + env.config.success_bonus)
    episode = play_expert_episode(env, seed, BID_LEVELS)
    left = episode.metrics["navigation_error"] / env.episode.shortest_distance
    assert episode.total_reward + left == pytest.approx(start)  # stopped within reach, not on it
    assert env.open_reward() == 0.0
    env.reset(seed)
    before = env.open_reward()
    moved = env.act("mover", "move forward 50 cm").reward
    assert moved != 0.0
    assert env.open_reward() == pytest.approx(before - moved)  # toward the goal or away from it
    env.act("stopper", "stop")
    assert env.open_reward() == 0.0


def test_observations_are_short_and_name_the_room_and_its_doorways(env):
    for seed in range(40):
        episode = play_expert_episode(env, seed, BID_LEVELS)
        for demo in episode.demonstrations:
            assert len(demo.observation.split()) < 80, demo.observation
    env.reset(7)
    text = env.observation("mover")
    assert env.episode.instruction in text
    scene = env.episode.scene
    room = scene.room_of(env.position)
    assert f"in: {scene.room_names[room]};" in text
    assert re.search(r"wall [\d.]+ m ahead", text)
    for door in (scene.doors[k] for k in scene.room_doors[room]):
        other = scene.room_names[door.b if door.a == room else door.a]
        assert re.search(rf"door to {other} [\d.]+ m (ahead|behind|here|(left|right) \d+)", text)


VIEW = (
    r"{label} (?P<metres>[\d.]+) m "
    r"(?P<where>ahead|behind|here|(?P<side>left|right) (?P<deg>\d+))"
)


def _command_read_from(text: str, label: str) -> str:
    """The command a walker heading for ``label`` would read off the observation ``text``."""
    view = re.search(VIEW.format(label=re.escape(label)), text)
    assert view is not None, (label, text)
    metres = float(view["metres"])
    if not label.startswith("door to") and metres <= 0.5:
        return "stop"
    if view["deg"] is not None or view["where"] == "behind":
        degrees = 180 if view["deg"] is None else int(view["deg"])
        return f"turn {view['side'] or 'left'} {min(degrees, 45)} degree"
    return f"move forward {min(max(round(metres / 0.25), 1), 3) * 25} cm"


def _target_read_from(text: str) -> str:
    """What a reader of ``text`` heads for: the doorway to the room the instruction names after
    the current one, or the goal landmark in the last room it names."""
    instruction, room = re.match(r"go: (.*?\.) in: ([^;]+);", text).groups()
    rooms = [re.match(r"leave the ([^,]+),", instruction)[1]]
    rooms += re.findall(r"into the ([^,]+),", instruction)
    goal = re.search(r"stop by the ([^,]+)\.$", instruction)[1]
    following = rooms.index(room) + 1
    return f"door to {rooms[following]}" if following < len(rooms) else goal


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_the_experts_next_command_can_be_read_off_the_observation(env, split):
    """Every command of the experts follows from the observation text alone: the instruction
    and the current room say which doorway (or the goal) is next, its direction and distance
    give the command. Imitation is then a well-posed problem for a small model."""
    seeds = env.train_seeds()[:30] if split == "train" else env.heldout_seeds()[:30]
    disagree, total = [], 0
    for seed in seeds:
        env.reset(seed)
        while not env.done:
            text = env.observation(None)
            command = env.expert_command()
            read = _command_read_from(text, _target_read_from(text))
            if read != command.text:
                disagree.append((command.text, read, text))
            total += 1
            env.step(None, command.text)
    assert total > 300
    assert not disagree, f"{len(disagree)}/{total} disagree, e.g. {disagree[:3]}"


def test_instruction_is_r2r_style(env):
    env.reset(11)
    instruction = env.episode.instruction
    start_room = env.episode.scene.room_names[env.episode.scene.room_of(env.episode.start)]
    assert instruction.startswith(f"leave the {start_room}")
    assert instruction.endswith(f"stop by the {env.episode.goal_landmark.name}.")
    assert "into the" in instruction
    # The experts read the route's rooms and goal back off the instruction.
    for seed in range(40):
        episode = env.episode_of(seed)
        scene = episode.scene
        _, nodes = route_points(scene, episode.field, episode.start)
        rooms = [scene.room_names[scene.room_of(episode.start)]]
        rooms += [scene.room_names[node_room(scene, node)] for node in nodes[1::2]]
        assert read_route(episode.instruction) == (tuple(rooms), episode.goal_landmark.name)


def test_wrong_role_wastes_a_turn_with_a_message(env):
    env.reset(3)
    before = (env.position, env.heading)
    result = env.step("mover", "turn left 30 degree")
    assert not result.valid and result.reward == 0.0 and not result.done
    assert env.decisions_made == 1 and (env.position, env.heading) == before
    assert "mover cannot turn left" in env.observation("mover")
    result = env.step("turner", "fly to the moon")
    assert not result.valid and "is not an action" in env.observation("turner")


def test_roles_own_their_actions(env):
    env.reset(4)
    heading = env.heading
    assert env.step("turner", "turn left 45 degree").valid
    assert env.heading == (heading + 45) % 360
    assert env.step("turner", "turn right 15 degree").valid
    assert env.heading == (heading + 30) % 360
    result = env.step(None, "stop")  # the monolithic actor owns every action
    assert result.valid and result.done and env.done
    state = env.snapshot()
    with pytest.raises(EpisodeNotRunning, match="after the episode ended"):
        env.step("turner", "turn left 15 degree")
    assert env.snapshot() == state


def test_walls_stop_the_robot(env):
    env.reset(5)
    scene = env.episode.scene
    for _ in range(env.config.max_decisions):
        if env.done:
            break
        env.step("mover", "move forward 75 cm")
        room = scene.room_of(env.position)
        assert all(
            distance_to_segment(env.position, wall) >= AGENT_RADIUS - 1e-9
            for wall in scene.room_walls[room]
        )
    assert env.done and env.decisions_made == env.config.max_decisions
    assert "blocked by a wall" in env.observation("mover")
    assert env.episode_metrics()["success"] == 0.0  # never stopped


def test_skip_spends_budget_only(env):
    env.reset(8)
    pose = (env.position, env.heading)
    result = env.skip()
    assert result.reward == 0.0 and env.decisions_made == 1 and (env.position, env.heading) == pose
    assert "no one acted" in env.observation("stopper")


def test_geodesic_distance_is_consistent(env):
    env.reset(12)
    episode = env.episode
    assert env.distance_to_goal() == pytest.approx(episode.shortest_distance)
    assert episode.shortest_distance >= math.dist(episode.start, episode.goal_landmark.position)


def test_train_and_heldout_houses_are_disjoint(env):
    train = {env.scene_id(seed) for seed in env.train_seeds()}
    heldout = {env.scene_id(seed) for seed in env.heldout_seeds()}
    assert train and heldout and not train & heldout
    train_layouts = {env.episode_of(seed).scene.fingerprint() for seed in env.train_seeds()}
    heldout_layouts = {env.episode_of(seed).scene.fingerprint() for seed in env.heldout_seeds()}
    assert not train_layouts & heldout_layouts
    # Several episodes share each training house (R2R has several routes per house).
    assert len(train) < len(env.train_seeds())


def test_path_metrics_follow_vln_ce_definitions():
    reference = resample_path([(0.0, 0.0), (4.0, 0.0)], spacing=0.25)
    metrics = PathMetrics(reference, shortest_distance=4.0, success_distance=3.0)
    metrics.start(reference[0])
    for point in reference[1:]:
        metrics.add(point)
    exact = metrics.summary(distance_to_goal=0.0, stopped=True)
    assert exact["success"] == 1.0 and exact["spl"] == pytest.approx(1.0)
    assert exact["ndtw"] == pytest.approx(1.0)
    assert metrics.summary(distance_to_goal=0.0, stopped=False)["success"] == 0.0
    assert metrics.summary(distance_to_goal=3.5, stopped=True)["success"] == 0.0

    detour = PathMetrics(reference, shortest_distance=4.0, success_distance=3.0)
    detour.start((0.0, 0.0))
    for point in [(0.0, 2.0), (4.0, 2.0), (4.0, 0.0)]:
        detour.add(point)
    result = detour.summary(distance_to_goal=0.0, stopped=True)
    assert result["spl"] == pytest.approx(4.0 / 8.0)
    assert 0.0 < result["ndtw"] < exact["ndtw"]


def test_incremental_dtw_matches_the_full_table():
    reference = [(0.0, 0.0), (1.0, 0.0), (2.0, 1.0), (3.0, 1.0)]
    path = [(0.0, 0.5), (0.5, 0.5), (1.5, 0.0), (2.5, 1.5), (3.0, 1.0), (3.5, 1.0)]
    metrics = PathMetrics(reference, shortest_distance=3.0, success_distance=3.0)
    metrics.start(path[0])
    for point in path[1:]:
        metrics.add(point)
    table = [[math.inf] * (len(path) + 1) for _ in range(len(reference) + 1)]
    table[0][0] = 0.0
    for i, r in enumerate(reference, 1):
        for j, q in enumerate(path, 1):
            best = min(table[i - 1][j], table[i][j - 1], table[i - 1][j - 1])
            table[i][j] = math.dist(r, q) + best
    assert metrics.dtw == pytest.approx(table[-1][-1])
