"""The PettingZoo and Gymnasium views of every task at their edges: replies of any length, steps
before a reset and after the end, odd seeds, dict configs, snapshots of another task, render
modes, pickles, vector envs, and forks through Gymnasium's wrappers (``docs/environments.md``)."""

from __future__ import annotations

import copy
import os
import pickle
import random
import re

import gymnasium
import numpy as np
import pytest
from gymnasium.spaces import Text
from gymnasium.vector import AsyncVectorEnv, SyncVectorEnv
from gymnasium.wrappers import RecordEpisodeStatistics

from bidswarm.envs import MONOLITHIC, TASKS, env_class
from bidswarm.envs import gymnasium as bidswarm_gymnasium
from bidswarm.envs import pettingzoo as bidswarm_pettingzoo
from bidswarm.envs.base import EpisodeNotRunning
from bidswarm.envs.conformance import random_reply
from bidswarm.envs.gymnasium import MonolithicTextEnv, restore_wrapped, snapshot_wrapped
from bidswarm.envs.interop import (
    ACTION_CHARSET,
    ACTION_MAX_LENGTH,
    OBSERVATION_CHARSET,
    OBSERVATION_MAX_LENGTH,
    action_space,
    observation_space,
)
from bidswarm.envs.memory import MemoryConfig
from bidswarm.envs.pettingzoo import round_robin
from bidswarm.envs.research.config import ResearchConfig
from bidswarm.envs.research.env import index_cache_dir

NAMES = sorted(TASKS)
WRAPPERS = ["aec", "parallel", "gymnasium"]
MEMORY = {"size": 4, "top_k": 3, "note_words": 8}
"""The shared memory on, given as YAML or ``gymnasium.make`` keyword arguments give it."""


def make_wrapper(kind: str, name: str, **config):
    if kind == "aec":
        return bidswarm_pettingzoo.env(name, **config)
    if kind == "parallel":
        return bidswarm_pettingzoo.parallel_env(name, round_robin, **config)
    return MonolithicTextEnv(name, **config)


def reset(env, seed):
    """Reset any of the three wrappers; return the first role's (or the one) observation."""
    if isinstance(env, bidswarm_pettingzoo.TextAuctionEnv):
        env.reset(seed=seed)
        return env.observe(env.agent_selection)
    observations, _ = env.reset(seed=seed)
    return observations if isinstance(observations, str) else next(iter(observations.values()))


def play_to_the_end(env, rng: random.Random, reply=None) -> None:
    """Random bids and replies (``reply(role)``, if given, for actions) until the episode ends;
    the AEC env: until every role has left."""
    reply = reply or (lambda role: random_reply(env.task, role, rng))
    if isinstance(env, bidswarm_pettingzoo.TextAuctionEnv):
        for role in env.agent_iter():
            _, _, terminated, truncated, info = env.last()
            if terminated or truncated:
                env.step(None)
            elif info["phase"] == "bid":
                env.step(rng.choice(["0.8", "0.4", "0"]))
            else:
                env.step(reply(role))
    elif isinstance(env, bidswarm_pettingzoo.TextParallelEnv):
        while env.agents:
            env.step({role: reply(role) for role in env.agents})
    else:
        while not env.task.done:
            env.step(reply(MONOLITHIC))


def step_once(env):
    """One step of any wrapper with a harmless reply."""
    if isinstance(env, bidswarm_pettingzoo.TextParallelEnv):
        return env.step({role: "pass" for role in env.possible_agents})
    return env.step("pass")


# -- long replies: observations stay in the space -----------------------------------------------
LONG_REPLIES = [
    "x" * 20_000,  # one 20,000-character word
    "word " * 4_000,  # 4,000 words
    "\U0001f600" * 5_000,  # characters beyond the Basic Multilingual Plane
    "".join(chr(0xD800 + i % 0x800) for i in range(5_000)),  # lone surrogates
]


def long_reply(role: str | None, rng: random.Random, env) -> str:
    """A long reply, a tool call or instruction quoting one, each with a long note, or not."""
    text = rng.choice(LONG_REPLIES)
    action = rng.choice(
        [
            text,
            f"browser.search({text})",
            f"browser.find({text})",
            f"browser.open({text})",
            f"answer({text})",
            env.task.expert_action(role) or "pass",
        ]
    )
    return rng.choice([action, f"{action} note: {rng.choice(LONG_REPLIES)}"])


@pytest.mark.parametrize("kind", WRAPPERS)
@pytest.mark.parametrize("name", NAMES)
def test_observations_quoting_long_replies_lie_in_the_space(name, kind, config):
    env = make_wrapper(kind, name, memory=MEMORY, **config(name))
    space = observation_space()
    rng = random.Random(0)
    longest = 0
    for seed in range(3):
        reset(env, seed)

        def reply(role, env=env):
            for viewer in [*env.task.roles, MONOLITHIC]:
                observation = env.task.observation(viewer)
                assert observation in space, (len(observation), observation[:300])
                nonlocal longest
                longest = max(longest, len(observation))
            return long_reply(role, rng, env)

        play_to_the_end(env, rng, reply)
    assert longest > 150  # the replies were quoted, and cut
    assert longest < OBSERVATION_MAX_LENGTH // 4


# -- steps before a reset and after the end ----------------------------------------------------
@pytest.mark.parametrize("kind", WRAPPERS)
@pytest.mark.parametrize("name", NAMES)
def test_a_step_before_reset_raises_the_same_error_and_changes_nothing(name, kind, config):
    env = make_wrapper(kind, name, memory=MEMORY, **config(name))
    message = f"^{name}: step\\(\\) before reset\\(\\); call reset\\(seed\\) first$"
    with pytest.raises(EpisodeNotRunning, match=message):
        step_once(env)
    with pytest.raises(EpisodeNotRunning, match=message):
        step_once(env)
    # Nothing was counted or written: the first episode is the one a fresh env plays.
    fresh = make_wrapper(kind, name, memory=MEMORY, **config(name))
    assert reset(env, 4) == reset(fresh, 4)
    assert env.snapshot() == fresh.snapshot()


@pytest.mark.parametrize("kind", WRAPPERS)
@pytest.mark.parametrize("name", NAMES)
def test_a_step_after_the_end_raises_the_same_error_and_changes_nothing(name, kind, config):
    env = make_wrapper(kind, name, memory=MEMORY, max_decisions=6, **config(name))
    rng = random.Random(1)
    reset(env, 2)
    play_to_the_end(env, rng)
    state = pickle.dumps(env.snapshot())
    metrics = env.task.episode_metrics()
    message = (
        f"^{name}: step\\(\\) after the episode ended \\(decision \\d+ of 6\\); "
        "call reset\\(seed\\) to play another$"
    )
    for _ in range(2):
        with pytest.raises(EpisodeNotRunning, match=message):
            step_once(env) if kind != "gymnasium" else env.step("pass note: written late")
    assert pickle.dumps(env.snapshot()) == state
    assert env.task.episode_metrics() == metrics
    reset(env, 3)  # a reset starts another
    step_once(env)


@pytest.mark.parametrize("name", NAMES)
def test_the_tasks_themselves_refuse_steps_and_skips_with_no_episode(name, config):
    cls = env_class(name)
    task = cls(cls.Config(name=name, memory=MemoryConfig(size=4), **config(name)))
    for call in (lambda: task.step(task.roles[0], "pass"), task.skip):
        with pytest.raises(EpisodeNotRunning, match=f"^{name}: .* before reset"):
            call()
    with pytest.raises(EpisodeNotRunning, match=f"^{name}: observation\\(\\) before reset"):
        task.observation(task.roles[0])
    task.reset(0)
    while not task.done:
        task.skip()
    state = task.snapshot()
    for call in (lambda: task.step(None, "pass note: late"), task.skip):
        with pytest.raises(EpisodeNotRunning, match=f"^{name}: .* after the episode ended"):
            call()
    assert task.snapshot() == state
    # A restored env plays the snapshot's episode, also one never reset.
    other = cls(cls.Config(name=name, memory=MemoryConfig(size=4), **config(name)))
    other.restore(state)
    with pytest.raises(EpisodeNotRunning, match="after the episode ended"):
        other.skip()


# -- seeds ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", WRAPPERS)
@pytest.mark.parametrize("name", NAMES)
def test_integer_like_seeds_play_the_same_world(name, kind, config):
    env = make_wrapper(kind, name, **config(name))
    first = reset(env, 5)
    state = env.snapshot()
    for seed in (np.int64(5), np.uint8(5), np.int32(5)):
        assert reset(env, seed) == first
        assert env.snapshot() == state


ODD_SEEDS = [
    ("abc", TypeError, "not str"),
    (1.5, TypeError, "not float"),
    (np.float64(2.0), TypeError, "not float64"),
    (True, TypeError, "not a bool"),
    (-1, ValueError, "integer >= 0"),
    (np.int64(-3), ValueError, "integer >= 0"),
]


@pytest.mark.parametrize("kind", [*WRAPPERS, "task"])
@pytest.mark.parametrize("name", NAMES)
def test_odd_seeds_fail_at_reset_naming_the_seed_on_every_task(name, kind, config):
    if kind == "task":
        cls = env_class(name)
        env = cls(cls.Config(name=name, **config(name)))
    else:
        env = make_wrapper(kind, name, **config(name))
    for seed, error, reason in ODD_SEEDS:
        with pytest.raises(error, match=f"^seed={re.escape(repr(seed))}: a world seed .*{reason}"):
            env.reset(seed) if kind == "task" else env.reset(seed=seed)
        with pytest.raises(EpisodeNotRunning):  # nothing started
            step_once(env) if kind != "task" else env.skip()


# -- configs given as dicts ----------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_a_memory_config_given_as_a_dict(name, config):
    made = gymnasium.make(bidswarm_gymnasium.env_id(name), memory=MEMORY, **config(name))
    assert made.unwrapped.task.config.memory == MemoryConfig(**MEMORY)
    made.reset(seed=0)
    _, _, _, _, _ = made.step("pass note: iron at depth 12")
    assert "Memo: monolithic: iron at depth 12" in made.unwrapped.task.observation(MONOLITHIC)
    game = bidswarm_pettingzoo.env(name, memory={"size": 2}, **config(name))
    assert game.task.memory.enabled and game.task.config.memory.size == 2
    with pytest.raises(TypeError, match=r"task\.memory=\{'sise': 4\}: .*'sise'"):
        bidswarm_pettingzoo.env(name, memory={"sise": 4}, **config(name))
    with pytest.raises(ValueError, match=r"task\.memory\.size=-1"):
        MonolithicTextEnv(name, memory={"size": -1}, **config(name))


# -- snapshots of another task or wrapper --------------------------------------------------------
@pytest.mark.parametrize("kind", WRAPPERS)
@pytest.mark.parametrize("name", NAMES)
def test_a_snapshot_of_another_task_is_refused_naming_both(name, kind, config):
    env = make_wrapper(kind, name, **config(name))
    reset(env, 1)
    before = pickle.dumps(env.snapshot())
    for other in NAMES:
        if other == name:
            continue
        theirs = make_wrapper(kind, other, **config(other))
        reset(theirs, 1)
        message = f"^a snapshot of task '{other}' cannot restore an env of task '{name}'$"
        with pytest.raises(ValueError, match=message):
            env.restore(theirs.snapshot())
    for other_kind in WRAPPERS:
        if other_kind != kind:
            theirs = make_wrapper(other_kind, name, **config(name))
            reset(theirs, 1)
            with pytest.raises(ValueError, match=f"snapshot of a {other_kind} env cannot"):
                env.restore(theirs.snapshot())
    with pytest.raises(ValueError, match=f"restore\\(\\) of a {kind} env of task '{name}'"):
        env.restore(env.task.snapshot())  # the task's own snapshot, not the wrapper's
    assert pickle.dumps(env.snapshot()) == before


# -- render modes --------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", WRAPPERS)
def test_render_modes_are_checked_against_the_metadata(kind, config):
    factories = {
        "aec": lambda **kw: bidswarm_pettingzoo.env("crafting", **kw),
        "parallel": lambda **kw: bidswarm_pettingzoo.parallel_env("crafting", round_robin, **kw),
        "gymnasium": lambda **kw: MonolithicTextEnv("crafting", **kw),
    }
    make = factories[kind]
    with pytest.raises(ValueError, match=r"render_mode='bogus': choose one of \['ansi'\] or None"):
        make(render_mode="bogus")
    env = make(render_mode="ansi")
    reset(env, 0)
    assert env.render() == env.task.observation(MONOLITHIC)
    quiet = make()
    reset(quiet, 0)
    assert quiet.render() is None
    with pytest.raises(ValueError, match="bogus"):
        gymnasium.make(bidswarm_gymnasium.env_id("crafting"), render_mode="bogus")


# -- the text spaces -----------------------------------------------------------------------------
def test_text_spaces_share_their_tables_and_print_short():
    first, second = observation_space(), observation_space()
    assert first.character_set is second.character_set  # built once per process
    plain = Text(OBSERVATION_MAX_LENGTH, min_length=0, charset=OBSERVATION_CHARSET)
    assert first == plain and len(first.character_list) == len(plain.character_list) == 63488
    for space in (first, action_space(), gymnasium.spaces.Tuple([first, first])):
        assert len(repr(space)) < 300, repr(space)[:300]
    with pytest.raises(AssertionError) as error:  # what an error message shows of a space
        assert "\U0001f600" in first
    assert len(str(error.value)) < 1000
    # Same samples as gymnasium's own space, and a copy or pickle keeps the generator.
    ours = action_space()
    ours.seed(3)
    theirs = Text(ACTION_MAX_LENGTH, min_length=0, charset=ACTION_CHARSET, seed=3)
    assert [ours.sample() for _ in range(3)] == [theirs.sample() for _ in range(3)]
    for copied in (copy.deepcopy(ours), pickle.loads(pickle.dumps(ours))):
        assert repr(copied) == repr(ours) and copied == ours
        assert copied.sample() == copy.deepcopy(ours).sample()
    assert len(pickle.dumps(first)) < 1000


# -- pickles -------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", WRAPPERS)
@pytest.mark.parametrize("name", NAMES)
def test_every_wrapper_pickles_mid_episode_and_plays_on_the_same(name, kind, config):
    env = make_wrapper(kind, name, memory=MEMORY, **config(name))
    reset(env, 7)
    for _ in range(3):
        step_once(env)
    frozen = pickle.dumps(env)
    assert len(frozen) < 100_000  # research: the shared corpus and index stay out
    clones = [pickle.loads(frozen), copy.deepcopy(env)]
    traces = []
    for each in [env, *clones]:
        rng = random.Random(11)
        seen = []
        play_to_the_end(each, rng, lambda role, e=each, r=rng, s=seen: _noted(e, role, r, s))
        traces.append((seen, each.task.episode_metrics()))
    assert traces[0] == traces[1] == traces[2]
    assert traces[0][0]  # something was played


def _noted(env, role, rng, seen: list) -> str:
    seen.append(env.task.observation(role))
    return random_reply(env.task, role, rng)


def test_research_shares_its_corpus_and_index_with_its_unpickled_copies(config):
    env = MonolithicTextEnv("research", **config("research"))
    assert pickle.loads(pickle.dumps(env)).task.data is env.task.data


def test_the_research_index_is_cached_in_the_user_cache_never_the_working_dir(
    tmp_path, monkeypatch
):
    work, cache = tmp_path / "work", tmp_path / "cache"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    env = bidswarm_pettingzoo.env("research", max_hops=2)
    env.reset(seed=0)
    assert list(work.iterdir()) == []
    folder = cache / "bidswarm" / "research"
    assert index_cache_dir(env.task.config) == folder.resolve()
    assert any(path.name == "complete.json" for path in folder.rglob("*"))
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    home = (tmp_path / "home").resolve()
    assert index_cache_dir(ResearchConfig()) == home / ".cache" / "bidswarm" / "research"
    assert index_cache_dir(ResearchConfig(cache_dir="~/indexes")) == home / "indexes"
    assert os.getcwd() == str(work) and list(work.iterdir()) == []


# -- vector envs ---------------------------------------------------------------------------------
def vector_of(vector_class, name: str, n: int, config: dict, **kwargs):
    def make():
        return gymnasium.make(bidswarm_gymnasium.env_id(name), max_decisions=4, **config)

    return vector_class([make] * n, **kwargs)


def expert_replies(vec: SyncVectorEnv) -> tuple[str, ...]:
    """The monolithic expert's reply in each sub-env (ignored by one about to reset)."""
    return tuple(env.unwrapped.task.expert_action(MONOLITHIC) or "pass" for env in vec.envs)


def single_env_play(name: str, config: dict, seed: int, replies: list[str]) -> list[tuple]:
    """What one env gives for ``replies`` from ``reset(seed)``, resetting (unseeded) after an
    end as a vector env's next step does."""
    env = gymnasium.make(bidswarm_gymnasium.env_id(name), max_decisions=4, **config)
    observation, _ = env.reset(seed=seed)
    trace, ended = [], False
    for reply in replies:
        if ended:
            observation, _ = env.reset()
            trace.append((observation, 0.0, False, False))
            ended = False
            continue
        observation, reward, terminated, truncated, _ = env.step(reply)
        trace.append((observation, reward, terminated, truncated))
        ended = terminated or truncated
    return trace


@pytest.mark.parametrize("name", NAMES)
def test_a_sync_vector_env_plays_what_single_envs_play(name, config):
    vec = vector_of(SyncVectorEnv, name, 2, config(name))
    vec.reset(seed=[3, 8])
    replies, trace = [], []
    for _ in range(11):  # across two autoresets
        actions = expert_replies(vec)
        replies.append(actions)
        observations, rewards, terminations, truncations, _ = vec.step(actions)
        trace.append((observations, rewards.tolist(), terminations.tolist(), truncations.tolist()))
    for i, seed in enumerate([3, 8]):
        alone = single_env_play(name, config(name), seed, [step[i] for step in replies])
        ours = [(o[i], r[i], te[i], tr[i]) for o, r, te, tr in trace]
        assert ours == alone
    assert any(any(step[3]) for step in trace)  # an episode ended inside


def test_an_async_vector_env_plays_what_the_sync_one_plays(config):
    replies = [("chop a tree", "dig down"), ("find trees", "pass"), ("craft planks", "mine stone")]
    results = []
    for vector_class, kwargs in ((SyncVectorEnv, {}), (AsyncVectorEnv, {"shared_memory": False})):
        vec = vector_of(vector_class, "crafting", 2, config("crafting"), **kwargs)
        try:
            first, _ = vec.reset(seed=[0, 1])
            trace = [first]
            for _ in range(3):
                for actions in replies:
                    observations, rewards, *_ = vec.step(actions)
                    trace.append((observations, rewards.tolist()))
            results.append(trace)
        finally:
            vec.close()
    assert results[0] == results[1]


# -- forks through gymnasium's wrappers ----------------------------------------------------------
def play_wrapped(env, rng: random.Random, steps: int) -> list[str]:
    """``steps`` random replies through ``env`` and its wrappers, resetting (unseeded) after an
    end; every result, as text."""
    trace = []
    for _ in range(steps):
        task = env.unwrapped.task
        result = env.step(random_reply(task, MONOLITHIC, rng))
        trace.append(repr(result))
        if result[2] or result[3]:
            trace.append(repr(env.reset()))
    return trace


@pytest.mark.parametrize("name", NAMES)
def test_a_fork_through_time_limit_replays_the_original(name, config):
    def make():
        return gymnasium.make(bidswarm_gymnasium.env_id(name), max_episode_steps=7, **config(name))

    for seed in range(3):
        rng = random.Random(seed)
        env = make()
        env.reset(seed=seed)
        play_wrapped(env, rng, rng.randrange(1, 7))
        state = snapshot_wrapped(env)
        frozen = pickle.dumps(state)
        replay_seed = rng.randrange(2**31)
        first = play_wrapped(env, random.Random(replay_seed), 20)
        assert pickle.dumps(state) == frozen
        play_wrapped(env, random.Random(replay_seed + 1), 5)  # diverge
        restore_wrapped(env, state)
        assert play_wrapped(env, random.Random(replay_seed), 20) == first
        fresh = make()
        fresh.reset(seed=seed + 1)
        restore_wrapped(fresh, state)
        assert play_wrapped(fresh, random.Random(replay_seed), 20) == first


def test_a_fork_through_env_unwrapped_alone_loses_the_time_limits_count(config):
    """Why :func:`snapshot_wrapped` exists: ``TimeLimit`` counts its steps outside the env."""
    env = gymnasium.make(bidswarm_gymnasium.env_id("crafting"), max_episode_steps=5)
    env.reset(seed=0)
    state = env.unwrapped.snapshot()
    first = [env.step("pass")[3] for _ in range(5)]
    env.unwrapped.restore(state)
    assert first == [False] * 4 + [True]
    assert env.step("pass")[3]  # truncated after one step: the count ran on


def test_a_fork_of_a_sync_vector_env_replays_across_autoresets(config):
    vec = vector_of(SyncVectorEnv, "navigation", 3, config("navigation"))
    vec.reset(seed=[0, 1, 2])
    rng = random.Random(5)

    def play(steps: int, rng: random.Random) -> list[str]:
        trace = []
        for _ in range(steps):
            actions = tuple(
                rng.choice(["turn left 30 degree", "move forward 75 cm", "stop", "?"])
                for _ in range(vec.num_envs)
            )
            trace.append(repr(vec.step(actions)))
        return trace

    play(3, rng)
    while not vec._autoreset_envs.any():  # fork where a sub-env resets at the next step
        play(1, rng)
    state = snapshot_wrapped(vec)
    first = play(12, random.Random(9))
    play(4, random.Random(10))
    restore_wrapped(vec, state)
    assert play(12, random.Random(9)) == first
    with pytest.raises(
        ValueError, match="a snapshot of 3 envs cannot restore a SyncVectorEnv of 2"
    ):
        restore_wrapped(vector_of(SyncVectorEnv, "navigation", 2, {}), state)


def test_forks_it_cannot_make_are_refused_clearly(config):
    wrapped = RecordEpisodeStatistics(gymnasium.make(bidswarm_gymnasium.env_id("crafting")))
    wrapped.reset(seed=0)
    with pytest.raises(TypeError, match="cannot fork through RecordEpisodeStatistics"):
        snapshot_wrapped(wrapped)
    vec = vector_of(AsyncVectorEnv, "crafting", 1, {}, shared_memory=False)
    try:
        with pytest.raises(TypeError, match="cannot fork through AsyncVectorEnv"):
            snapshot_wrapped(vec)
    finally:
        vec.close()
    limited = gymnasium.make(bidswarm_gymnasium.env_id("crafting"), max_episode_steps=5)
    plain = gymnasium.make(bidswarm_gymnasium.env_id("crafting"))
    limited.reset(seed=0)
    plain.reset(seed=0)
    with pytest.raises(ValueError, match="cannot restore one in"):
        restore_wrapped(plain, snapshot_wrapped(limited))
    navigation = gymnasium.make(bidswarm_gymnasium.env_id("navigation"), max_episode_steps=5)
    navigation.reset(seed=0)
    with pytest.raises(
        ValueError, match="task 'navigation' cannot restore an env of task 'crafting'"
    ):
        restore_wrapped(limited, snapshot_wrapped(navigation))


def test_an_async_vector_env_in_shared_memory_loses_text_observations():
    """gymnasium 1.4's limit, which docs/environments.md states: with ``shared_memory=True`` (the
    default) an AsyncVectorEnv reads a Text observation from its shared memory once, when it is
    built, so every observation reads as ``"\\x00" * 8192``. Hence ``shared_memory=False``."""
    vec = vector_of(AsyncVectorEnv, "crafting", 2, {})
    try:
        observations, _ = vec.reset(seed=[0, 1])
        assert set(observations) == {"\x00" * OBSERVATION_MAX_LENGTH}
    finally:
        vec.close()
