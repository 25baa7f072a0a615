"""The fork-contract conformance check that every environment must pass (DESIGN.md).

From random mid-episode states: take a snapshot, play a random continuation, restore, replay the
same continuation: observations, rewards, ``done``, metrics and the shared memory's reads and
writes (``StepResult.memory``) must be identical. The snapshot
must not alias live state: playing on after ``snapshot()`` must not change what it restores to.
"""

from __future__ import annotations

import pickle
import random
from collections.abc import Callable

from bidswarm.envs.base import TextEnv


def random_reply(env: TextEnv, role: str | None, rng: random.Random) -> str:
    """A reply mixing expert moves, wasted turns and garbage, to reach varied states; with the
    shared memory on, some replies write a note (alone or after the action), some too long."""
    reply = _random_action(env, role, rng)
    if env.memory.enabled and rng.random() < 0.3:
        note = " ".join(rng.choice(NOTE_WORDS) for _ in range(rng.randint(0, 12)))
        reply = f"{reply if rng.random() < 0.5 else ''} note: {note}".strip()
    return reply


NOTE_WORDS = ("iron", "ore", "depth", "12", "page", "d0412", "kitchen", "left", "stone", "the")


def _random_action(env: TextEnv, role: str | None, rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.6:
        return env.expert_action(role) or "pass"
    if roll < 0.8 and env.roles:
        other = rng.choice(env.roles)
        return env.expert_action(other) or "nothing"
    return rng.choice(["", "???", "dance wildly", "0.4", "craft the moon"])


def _play(env: TextEnv, rng: random.Random, steps: int) -> list[tuple]:
    """Play ``steps`` random decisions; return what was seen at each (the trace to compare)."""
    trace = []
    for _ in range(steps):
        if env.done:
            break
        roles = [*env.roles, None]
        if rng.random() < 0.1:
            result = env.skip()
            actor = "skip"
        else:
            actor = rng.choice(roles)
            result = env.step(actor, random_reply(env, actor, rng))
        observations = tuple(env.observation(r) for r in roles)
        trace.append((actor, result, observations, env.decisions_made, env.done))
    trace.append(tuple(sorted(env.episode_metrics().items())))
    return trace


def check_fork_contract(
    make_env: Callable[[], TextEnv], seeds: list[int], prefix_steps: int = 15, horizon: int = 30
) -> None:
    """Raise AssertionError if restore-then-replay differs from the original continuation."""
    for seed in seeds:
        rng = random.Random(seed)
        env = make_env()
        env.reset(seed)
        _play(env, rng, rng.randrange(prefix_steps + 1))
        state = env.snapshot()
        frozen = pickle.dumps(state)
        replay_seed = rng.randrange(2**31)
        first = _play(env, random.Random(replay_seed), horizon)
        # Playing on must not have changed the snapshot (no aliasing of live state).
        assert pickle.dumps(state) == frozen, f"seed {seed}: snapshot changed while playing on"
        env.restore(state)
        second = _play(env, random.Random(replay_seed), horizon)
        assert first == second, f"seed {seed}: replay after restore differs from the original"
        # The same snapshot restores again, into a fresh environment too.
        other = make_env()
        other.reset(seed + 1)
        other.restore(state)
        third = _play(other, random.Random(replay_seed), horizon)
        assert first == third, f"seed {seed}: restore into a fresh environment differs"
