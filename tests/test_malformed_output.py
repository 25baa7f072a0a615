"""Malformed model output is never fatal: arbitrary replies (unicode, control characters, 10k
characters, nested or unbalanced calls, paths outside the corpus, numbers out of range) go to
every env's ``step`` and to bid parsing. Nothing raises; a rejected reply is a wasted turn
(``valid=False``, counted) that changes nothing of the world, only the turn's bookkeeping; and
the fork contract still holds after it."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bidswarm.agents.prompts import parse_bid
from bidswarm.envs.crafting import CraftingEnv
from bidswarm.envs.crafting.config import CraftingConfig
from bidswarm.envs.navigation import NavigationEnv
from bidswarm.envs.navigation.config import NavigationConfig
from bidswarm.envs.research import ResearchEnv
from bidswarm.envs.research.config import ResearchConfig

LEVELS = [0.0, 0.2, 0.4, 0.6, 0.8]

BOOKKEEPING = {
    "crafting": {"decisions", "history", "counters", "done"},
    "navigation": {"decisions", "done", "last"},
    "research": {"decisions", "done", "message", "invalid_turns", "last_call", "last_caller"},
}
"""Snapshot keys a wasted turn may change (its turn counter and the feedback shown next):
the rest is the world."""

INVALID_COUNTER = {"crafting": "invalid_replies", "research": "invalid_turns"}
"""Episode metric that counts wasted turns, for the envs that keep one (the collector counts
``valid=False`` for every env)."""

HOSTILE = [
    "",
    "\x00\x01\x02\x1b[31m\r\n\t",
    "x" * 10_000,
    "9" * 10_000,
    "turn left " + "9" * 5000 + " degree",
    "move forward " + "9" * 5000 + " cm",
    "turn left -45 degree",
    "move forward 1e309 cm",
    "turn right ² degree",
    "browser.open(../../../etc/passwd)",
    "browser.open(/etc/passwd)",
    "browser.open(file:///etc/shadow)",
    "browser.open(²)",
    "browser.open(٣)",
    "browser.open(1, ²)",
    "browser.open(1, " + "9" * 5000 + ")",
    "browser.open(" + "9" * 5000 + ")",
    "browser.open(-1)",
    "browser.open(0, 0)",
    "browser.open(1, -3)",
    "browser.search(" * 200,
    "answer(answer(answer(",
    "browser.find(browser.find(browser.find(x)))",
    "browser.find((((((((((((((((((((((((((((",
    "browser.find(.*+?[)",
    "answer(" + ")" * 5000,
    "))))(((( browser.search ) ( answer",
    "craft craft craft " * 500,
    "mine " + "\u202e" * 100 + "iron",
    "\ud7ff\ue000\uffff" * 50,
    "🦄" * 2000,
    "stop" + "\x00" * 100,
]

replies = st.one_of(
    st.sampled_from(HOSTILE),
    st.text(max_size=300),
    st.text(alphabet=st.characters(codec="utf-8"), min_size=1000, max_size=3000),
    st.builds(
        lambda tool, argument: f"{tool}({argument}",
        st.sampled_from(["browser.search", "browser.open", "browser.find", "answer"]),
        st.text(max_size=80),
    ),
    st.builds(
        lambda verb, number, unit: f"{verb} {number} {unit}",
        st.sampled_from(["turn left", "turn right", "move forward", "mine", "craft"]),
        st.one_of(st.integers(), st.floats(allow_nan=True, allow_infinity=True)),
        st.sampled_from(["degree", "cm", "", "blocks"]),
    ),
)


@pytest.fixture(scope="module")
def envs():
    return {
        "crafting": CraftingEnv(CraftingConfig()),
        "navigation": NavigationEnv(NavigationConfig()),
        "research": ResearchEnv(ResearchConfig()),
    }


def world(name: str, snapshot: dict) -> dict:
    """The snapshot without the turn's bookkeeping (nested parts, e.g. ``state``, included)."""
    return {
        key: world(name, value) if isinstance(value, dict) else value
        for key, value in snapshot.items()
        if key not in BOOKKEEPING[name]
    }


def check_reply(name: str, env, role: str | None, reply: str, seed: int) -> None:
    env.reset(seed)
    env.step(role, reply)  # a second reply: after one that may have changed the world
    if env.done:
        env.reset(seed)
    before = env.snapshot()
    metrics_before = env.episode_metrics()
    result = env.step(role, reply)
    after = env.snapshot()
    assert isinstance(result.valid, bool) and math.isfinite(result.reward)
    assert env.decisions_made == metrics_before["decisions"] + 1
    assert isinstance(env.observation(role), str)
    if not result.valid:
        assert result.reward == 0.0
        assert world(name, after) == world(name, before), "a rejected reply changed the world"
        if name in INVALID_COUNTER:
            counter = INVALID_COUNTER[name]
            assert env.episode_metrics()[counter] == metrics_before[counter] + 1
    # The fork contract after the reply: restore and replay gives the same future.
    env.restore(before)
    again = env.step(role, reply)
    assert again == result and env.snapshot() == after


@pytest.mark.parametrize("name", ["crafting", "navigation", "research"])
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(reply=replies, role_index=st.integers(0, 3), seed=st.integers(0, 50))
def test_any_reply_to_any_role_is_a_turn_never_an_exception(envs, name, reply, role_index, seed):
    env = envs[name]
    roles = [*env.roles, None]
    check_reply(name, env, roles[role_index], reply, seed)


@pytest.mark.parametrize("name", ["crafting", "navigation", "research"])
@pytest.mark.parametrize("reply", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_replies_are_rejected_and_counted(envs, name, reply):
    env = envs[name]
    for role in [*env.roles, None]:
        check_reply(name, env, role, reply, seed=3)


def test_paths_outside_the_corpus_open_nothing(envs):
    env = envs["research"]
    for reply in HOSTILE:
        if reply.startswith("browser.open("):
            env.reset(0)
            result = env.step("opener", reply)
            assert not result.valid and "p1/" not in env.observation("opener"), reply


@settings(max_examples=300, deadline=None)
@given(text=st.one_of(st.text(), st.sampled_from(HOSTILE)))
def test_bid_parsing_never_raises_and_counts_malformed_replies(text):
    level, parsed = parse_bid(text, LEVELS)
    assert level in LEVELS
    if not parsed:
        assert level == 0.0


@pytest.mark.parametrize("text", ["1e309", "-0.5", "2", "nan", "inf", "٠.٤", "0." + "9" * 5000])
def test_out_of_range_bids_are_malformed(text):
    level, parsed = parse_bid(text, LEVELS)
    assert (level, parsed) == (0.0, False) or (parsed and level in LEVELS)
