"""The PettingZoo and Gymnasium views of every task (``envs/pettingzoo.py``, ``envs/gymnasium.py``):
the libraries' own API checks, the fork contract through the wrappers, and the same rewards as our
own expert loop."""

from __future__ import annotations

import pickle
import random
import subprocess
import sys
import warnings

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env
from pettingzoo.test import api_test, parallel_api_test

from bidswarm.algorithms.auction import PAPER_BID_LEVELS, run_auction
from bidswarm.envs import MONOLITHIC, TASKS, env_class
from bidswarm.envs import gymnasium as bidswarm_gymnasium
from bidswarm.envs import pettingzoo as bidswarm_pettingzoo
from bidswarm.envs.conformance import random_reply
from bidswarm.envs.experts import format_bid, play_expert_episode, snap_to_level
from bidswarm.envs.pettingzoo import TextAuctionEnv, TextParallelEnv, Turn, round_robin

NAMES = sorted(TASKS)
LEVELS = list(PAPER_BID_LEVELS)
SEEDS = [0, 1, 2]


def expert_bid_text(env: TextAuctionEnv | TextParallelEnv, role: str) -> str:
    return format_bid(snap_to_level(env.task.expert_bid(role), LEVELS))


def expert_winner(env: TextParallelEnv, rng: random.Random) -> str | None:
    """The auction over the scripted experts' bids, as a caller-supplied rule."""
    bids = [snap_to_level(env.task.expert_bid(role), LEVELS) for role in env.possible_agents]
    winner = run_auction(bids, rng).winner
    return None if winner is None else env.possible_agents[winner]


# -- the libraries' own checks -------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_pettingzoo_api_test(name, config):
    env = bidswarm_pettingzoo.env(name, **config(name))
    for role in env.possible_agents:
        env.action_space(role).seed(0)
    api_test(env, num_cycles=1000)


@pytest.mark.parametrize("name", NAMES)
def test_pettingzoo_parallel_api_test(name, config):
    env = bidswarm_pettingzoo.parallel_env(name, round_robin, **config(name))
    for role in env.possible_agents:
        env.action_space(role).seed(0)
    parallel_api_test(env, num_cycles=1000)


@pytest.mark.parametrize("name", NAMES)
def test_gymnasium_check_env(name, config):
    env = gymnasium.make(bidswarm_gymnasium.env_id(name), **config(name)).unwrapped
    env.action_space.seed(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env)
    # The only complaint: ``render_fps``, which an ``ansi`` render has no use for.
    assert [str(w.message) for w in caught if "render fps" not in str(w.message)] == []


def test_every_task_is_registered_under_the_bidswarm_namespace():
    ours = {env_id for env_id in gymnasium.registry if env_id.startswith("bidswarm/")}
    assert ours == {f"bidswarm/{name.capitalize()}-v0" for name in NAMES}
    for name in NAMES:
        assert gymnasium.spec(bidswarm_gymnasium.env_id(name)).kwargs == {"task": name}
    made = gymnasium.make("bidswarm/Crafting-v0", target="wooden_pickaxe").unwrapped
    assert made.task.config.target == "wooden_pickaxe"


@pytest.mark.parametrize("name", NAMES)
def test_real_observations_lie_in_the_text_space(name, config):
    """Observations of expert play and of random replies (quoted garbage included)."""
    env = bidswarm_pettingzoo.env(name, **config(name))
    space = env.observation_space(env.possible_agents[0])
    rng = random.Random(0)
    for seed in SEEDS:
        env.reset(seed=seed)
        for role in env.agent_iter():
            observation, _, terminated, truncated, info = env.last()
            assert observation in space, observation
            assert env.task.observation(MONOLITHIC) in space
            if terminated or truncated:
                env.step(None)
            elif info["phase"] == "bid":
                env.step(expert_bid_text(env, role))
            elif rng.random() < 0.5:
                env.step(random_reply(env.task, role, rng))
            else:
                env.step("".join(chr(rng.randrange(0xD800)) for _ in range(300)))


# -- the auction of the AEC env ------------------------------------------------------------------
def test_all_zero_and_unparseable_bids_skip_the_step(config):
    env = bidswarm_pettingzoo.env("crafting", **config("crafting"))
    env.reset(seed=0)
    for bid in ["0", "no idea", "7"]:  # 7 lies outside [0, 1]: malformed, counts as 0
        assert env.infos[env.agent_selection]["phase"] == "bid"
        env.step(bid)
    assert env.task.decisions_made == 1
    assert env.agent_selection == env.possible_agents[0]
    assert all(info["actor"] is None for info in env.infos.values())
    assert env.snapshot()["counts"] == {"bids_malformed": 2, "actions_invalid": 0}


def test_the_highest_bid_acts_and_ties_draw_from_the_seeded_rng(config):
    def winner(seed: int, bids: list[str]) -> str:
        env = bidswarm_pettingzoo.env("crafting", **config("crafting"))
        env.reset(seed=seed)
        for bid in bids:
            env.step(bid)
        assert env.infos[env.agent_selection] == {"phase": "act"}
        return env.agent_selection

    assert winner(0, ["0.2", "bid 0.6 please", "0.4"]) == "miner"
    tied = [winner(seed, ["0.8", "0.8", "0.8"]) for seed in range(12)]
    assert tied == [winner(seed, ["0.8", "0.8", "0.8"]) for seed in range(12)]
    assert set(tied) == {"logger", "miner", "smith"}


def test_an_invalid_action_is_a_counted_wasted_turn(config):
    env = bidswarm_pettingzoo.env("crafting", **config("crafting"))
    env.reset(seed=0)
    for bid in ["0.8", "0", "0"]:
        env.step(bid)
    env.step("craft the moon")
    assert env.task.decisions_made == 1
    assert env.infos["logger"]["valid"] is False and env.infos["logger"]["actor"] == "logger"
    assert env.snapshot()["counts"]["actions_invalid"] == 1


def test_a_caller_rule_returning_an_unknown_role_fails_loudly():
    env = bidswarm_pettingzoo.parallel_env("crafting", lambda turn, rng: "king")
    observations, _ = env.reset(seed=0)
    with pytest.raises(ValueError, match="king"):
        env.step(dict.fromkeys(observations, "pass"))


# -- forks through the wrappers ------------------------------------------------------------------
def play_aec(env: TextAuctionEnv, rng: random.Random, steps: int) -> list[tuple]:
    """``steps`` AEC steps of random bids and replies; what each agent saw and got."""
    trace = []
    for _ in range(steps):
        if not env.agents:
            break
        agent = env.agent_selection
        observation, reward, terminated, truncated, info = env.last()
        if terminated or truncated:
            action = None
        elif info["phase"] == "bid":
            action = rng.choice([*map(format_bid, LEVELS), "", "??", "0.7", "1"])
        else:
            action = random_reply(env.task, agent, rng)
        env.step(action)
        trace.append((agent, observation, reward, terminated, truncated, repr(info), action))
    return trace


def play_parallel(env: TextParallelEnv, rng: random.Random, steps: int) -> list[tuple]:
    trace = []
    for _ in range(steps):
        if not env.agents:
            break
        actions = {role: random_reply(env.task, role, rng) for role in env.agents}
        trace.append(repr(env.step(actions)))
    return trace


def play_gymnasium(env: bidswarm_gymnasium.MonolithicTextEnv, rng, steps: int) -> list[tuple]:
    trace = []
    for _ in range(steps):
        if env.task.done:
            break
        trace.append(repr(env.step(random_reply(env.task, MONOLITHIC, rng))))
    return trace


def check_fork_through(make, play, seed: int) -> None:
    """Play, snapshot, diverge, restore, replay: identical observations and rewards; the same
    snapshot restores into a fresh wrapper too, and playing on does not change it."""
    rng = random.Random(seed)
    env = make()
    env.reset(seed=seed)
    play(env, rng, rng.randrange(40))
    state = env.snapshot()
    frozen = pickle.dumps(state)
    replay_seed = rng.randrange(2**31)
    first = play(env, random.Random(replay_seed), 60)
    assert pickle.dumps(state) == frozen, "snapshot changed while playing on"
    play(env, random.Random(replay_seed + 1), 20)  # diverge
    env.restore(state)
    assert play(env, random.Random(replay_seed), 60) == first
    fresh = make()
    fresh.reset(seed=seed + 1)
    fresh.restore(state)
    assert play(fresh, random.Random(replay_seed), 60) == first


@pytest.mark.parametrize("name", NAMES)
def test_fork_contract_through_the_aec_env(name, config):
    for seed in SEEDS:
        check_fork_through(lambda: bidswarm_pettingzoo.env(name, **config(name)), play_aec, seed)


@pytest.mark.parametrize("name", NAMES)
def test_fork_contract_through_the_parallel_env(name, config):
    def random_or_skip(turn: Turn, rng: random.Random) -> str | None:
        return rng.choice([*sorted(turn.proposals), None])

    def make():
        return bidswarm_pettingzoo.parallel_env(name, random_or_skip, **config(name))

    for seed in SEEDS:
        check_fork_through(make, play_parallel, seed)


@pytest.mark.parametrize("name", NAMES)
def test_fork_contract_through_the_gymnasium_env(name, config):
    def make():
        return bidswarm_gymnasium.MonolithicTextEnv(name, **config(name))

    for seed in SEEDS:
        check_fork_through(make, play_gymnasium, seed)


# -- same worlds, same numbers -------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_experts_through_the_aec_env_earn_what_our_expert_loop_earns(name, config):
    cls = env_class(name)
    ours = cls(cls.Config(name=name, **config(name)))
    env = bidswarm_pettingzoo.env(name, **config(name))
    for seed in SEEDS:
        reference = play_expert_episode(ours, seed, LEVELS)
        env.reset(seed=seed)
        returns = dict.fromkeys(env.possible_agents, 0.0)
        actors, metrics = [], {}
        for role in env.agent_iter():
            _, reward, terminated, truncated, info = env.last()
            returns[role] += reward
            if terminated or truncated:
                metrics = info["metrics"]
                env.step(None)
            elif info["phase"] == "bid":
                env.step(expert_bid_text(env, role))
            else:
                actors.append(role)
                env.step(env.task.expert_action(role) or "")
        assert actors == reference.actors
        assert set(returns.values()) == {reference.total_reward}, (returns, reference.total_reward)
        assert metrics == {**reference.metrics, "bids_malformed": 0, "actions_invalid": 0}


@pytest.mark.parametrize("name", NAMES)
def test_experts_through_the_parallel_env_earn_what_our_expert_loop_earns(name, config):
    cls = env_class(name)
    ours = cls(cls.Config(name=name, **config(name)))
    env = bidswarm_pettingzoo.parallel_env(
        name, lambda turn, rng: expert_winner(env, rng), **config(name)
    )
    for seed in SEEDS:
        reference = play_expert_episode(ours, seed, LEVELS)
        env.reset(seed=seed)
        total, actors = 0.0, []
        while env.agents:
            actions = {role: env.task.expert_action(role) or "" for role in env.agents}
            _, rewards, _, _, infos = env.step(actions)
            assert len(set(rewards.values())) == 1
            total += next(iter(rewards.values()))
            actors.append(next(iter(infos.values()))["actor"])
        assert actors == reference.actors
        assert total == reference.total_reward


@pytest.mark.parametrize("name", NAMES)
def test_the_monolithic_expert_through_gymnasium_earns_what_our_loop_earns(name, config):
    """Our loop under the monolithic rule: the one agent acts every step (``env.step(None, .)``)."""
    cls = env_class(name)
    ours = cls(cls.Config(name=name, **config(name)))
    env = gymnasium.make(bidswarm_gymnasium.env_id(name), **config(name))
    for seed in SEEDS:
        ours.reset(seed)
        expected = []
        while not ours.done:
            expected.append(ours.step(MONOLITHIC, ours.expert_action(MONOLITHIC) or "").reward)
        env.reset(seed=seed)
        rewards, done = [], False
        while not done:
            action = env.unwrapped.task.expert_action(MONOLITHIC) or ""
            _, reward, terminated, truncated, info = env.step(action)
            rewards.append(reward)
            done = terminated or truncated
        assert rewards == expected
        assert info["metrics"] == {**ours.episode_metrics(), "actions_invalid": 0}


# -- optional and light --------------------------------------------------------------------------
def test_the_package_imports_neither_pettingzoo_nor_gymnasium():
    modules = [
        "bidswarm",
        "bidswarm.envs",
        "bidswarm.envs.conformance",
        "bidswarm.envs.experts",
        *(env_class(name).__module__ for name in NAMES),
        "bidswarm.algorithms.auction",
        "bidswarm.coordination",
    ]
    probe = (
        f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pettingzoo', 'gymnasium')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
