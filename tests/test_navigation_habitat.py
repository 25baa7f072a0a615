"""The Habitat navigation adapter: pure parts without habitat; the simulator only when present."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

from bidswarm.envs.navigation.actions import NavAction, steer
from bidswarm.envs.navigation.habitat import (
    HabitatNavigationConfig,
    describe_views,
    floor_point,
    habitat_actions,
    heading_of,
    summarize_view,
)


def test_commands_become_atomic_habitat_actions():
    assert habitat_actions(NavAction("turn_left", 45)) == ["turn_left"] * 3
    assert habitat_actions(NavAction("turn_right", 15)) == ["turn_right"]
    assert habitat_actions(NavAction("move_forward", 75)) == ["move_forward"] * 3
    assert habitat_actions(NavAction("stop")) == ["stop"]


def test_floor_plane_turns_left_counter_clockwise():
    # habitat looks down -z; a left turn rotates +90 degrees about +y, to look down -x.
    ahead, after_left_turn = np.array([0.0, 0.0, -1.0]), np.array([-1.0, 0.0, 0.0])
    assert heading_of(ahead) == pytest.approx(90.0)
    assert heading_of(after_left_turn) == pytest.approx(180.0)
    assert floor_point([1.0, 0.3, -2.0]) == (1.0, 2.0)
    # Walking forward from the origin facing -z moves +y on the floor plane: along the heading.
    start, end = floor_point([0.0, 0.0, 0.0]), floor_point([0.0, 0.0, -0.25])
    assert math.degrees(math.atan2(end[1] - start[1], end[0] - start[0])) == pytest.approx(90.0)


def test_steering_matches_the_geometry():
    assert steer((0.0, 0.0), 90.0, (0.0, 2.0), 5.0, 0.5) == NavAction("move_forward", 75)
    assert steer((0.0, 0.0), 90.0, (0.0, 0.3), 5.0, 0.5) == NavAction("move_forward", 25)
    assert steer((0.0, 0.0), 90.0, (-2.0, 0.0), 5.0, 0.5) == NavAction("turn_left", 45)
    assert steer((0.0, 0.0), 90.0, (1.0, 1.0), 5.0, 0.5) == NavAction("turn_right", 45)
    assert steer((0.0, 0.0), 90.0, (0.3, 1.0), 5.0, 0.5) == NavAction("turn_right", 15)
    assert steer((0.0, 0.0), 90.0, (9.0, 9.0), 0.4, 0.5) == NavAction("stop")


def test_depth_view_summary_reports_the_nearest_obstacle():
    depth = np.full((30, 30), 4.0, dtype=np.float32)
    depth[10:20, 10:20] = 1.5
    what, metres = summarize_view(depth)
    assert what == "wall" and metres == pytest.approx(1.5)
    assert summarize_view(np.zeros((9, 9, 1)))[0] == "wall"


def test_semantic_view_summary_names_objects_not_background():
    depth = np.full((30, 30), 3.0, dtype=np.float32)
    semantic = np.full((30, 30), 1)  # wall everywhere
    semantic[10:20, 12:18] = 7  # a sofa in the middle
    depth[10:20, 12:18] = 2.0
    labels = {1: "wall", 7: "sofa"}
    assert summarize_view(depth, semantic, labels) == ("sofa", pytest.approx(2.0))
    only_wall = np.full((30, 30), 1)
    assert summarize_view(depth, only_wall, labels)[0] == "wall"


def test_view_text_matches_the_embedded_task():
    text = describe_views([("ahead", "sofa", 1.4), ("left", "wall", 0.3), ("right", "door", 2.0)])
    assert text == "ahead: sofa 1.5 m; left: wall 0.5 m; right: door 2 m"


def test_config_points_at_the_vln_ce_layout():
    config = HabitatNavigationConfig()
    assert config.data_path.format(split="val_unseen") == (
        "data/datasets/R2R_VLNCE_v1-3_preprocessed/val_unseen/val_unseen.json.gz"
    )
    assert config.max_decisions == 64 and config.success_distance == 3.0


def test_habitat_fork_contract():
    pytest.importorskip("habitat", reason="habitat-lab is not installed (see docs/habitat.md)")
    pytest.importorskip("habitat_sim", reason="habitat-sim is not installed (see docs/habitat.md)")
    config = HabitatNavigationConfig()
    if not os.path.exists(config.data_path.format(split=config.split)):
        pytest.skip(f"VLN-CE R2R episodes not found at {config.data_path}")
    from bidswarm.envs.conformance import check_fork_contract
    from bidswarm.envs.navigation.habitat import HabitatNavigationEnv

    env = HabitatNavigationEnv(config)
    try:
        check_fork_contract(lambda: env, seeds=[0, 1], prefix_steps=5, horizon=8)
    finally:
        env.close()
