"""The conformance checks that every registered task must pass (``envs/base.py``; the
contracts in words: docs/architecture.md, "The task contract").

The fork contract (:func:`check_fork_contract`): from random mid-episode states, take a
snapshot, play a random continuation, restore, replay the same continuation: observations,
rewards, ``done``, metrics and the shared memory's reads and writes (``StepResult.memory``) must
be identical. The snapshot must not alias live state: playing on after ``snapshot()`` must not
change what it restores to.

The task contract (:func:`check_task_contract`): the task's roles and seeds, its config's
name, the experts' bids in [0, 1], the no-tie rule of the experts' top bids, the decision
budget, and the metrics of :data:`~bidswarm.envs.base.EPISODE_METRICS` in every episode, each
holding what it must.
``tests/test_fork_contract.py`` runs both on every task of ``envs.TASKS``.
"""

from __future__ import annotations

import pickle
import random
from collections.abc import Callable

from bidswarm.algorithms.auction import PAPER_BID_LEVELS
from bidswarm.envs.base import EPISODE_METRICS, EpisodeNotRunning, TextEnv
from bidswarm.envs.experts import snap_to_level


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


def check_task_contract(make_env: Callable[[], TextEnv], seeds: list[int]) -> None:
    """Raise AssertionError, naming the task's class and what it broke, unless every episode of
    random play from ``seeds`` keeps the task contract (the module docstring)."""
    env = make_env()
    task = type(env).__name__
    roles = env.roles
    assert roles and len(set(roles)) == len(roles), f"{task}.roles: distinct roles, got {roles}"
    assert all(isinstance(role, str) and role for role in roles), f"{task}.roles: {roles}"
    name = env.config.name
    assert type(env.config).__dataclass_fields__["name"].default == name, (
        f"{task}: config name {name!r} is not its config class's default"
    )
    assert not set(env.train_seeds()) & set(env.heldout_seeds()), (
        f"{task}: training and held-out worlds overlap"
    )
    _check_refused(make_env(), task, "before reset()")
    for seed in seeds:
        rng = random.Random(seed)
        env.reset(seed)
        _check_episode_metrics(env, task, seed, total_reward=0.0)
        total = 0.0
        while not env.done:
            for role in roles:
                bid = env.expert_bid(role)
                assert 0.0 <= bid <= 1.0, f"{task}.expert_bid({role!r}) = {bid!r}: not in [0, 1]"
            if rng.random() < 0.1:
                result = env.skip()
            else:
                actor = rng.choice([*roles, None])
                result = env.step(actor, random_reply(env, actor, rng))
            total += result.reward
            assert result.done == env.done, f"{task} seed {seed}: StepResult.done != env.done"
            assert env.decisions_made <= env.config.max_decisions, (
                f"{task} seed {seed}: {env.decisions_made} decisions, past task.max_decisions"
            )
            _check_episode_metrics(env, task, seed, total)
        _check_refused(env, task, f"after the episode of seed {seed} ended")
        ended = env.snapshot()
        env.reset(seed)
        env.restore(ended)
        _check_refused(env, task, f"after restoring the ended episode of seed {seed}")
        _check_experts_never_tie(env, task, seed)


def _check_experts_never_tie(env: TextEnv, task: str, seed: int) -> None:
    """The no-tie rule: at every step of the experts' own episode of ``seed`` (the auction over
    their bids, snapped to the bid levels), the highest bid is one role's, or every bid is 0.
    The expert loop (``envs/experts.py``) and the PettingZoo and Gymnasium views draw a tie's
    winner from different random streams, so tied experts play different episodes in each."""
    env.reset(seed)
    levels = list(PAPER_BID_LEVELS)
    while not env.done:
        bids = {role: snap_to_level(env.expert_bid(role), levels) for role in env.roles}
        top = max(bids.values())
        if top <= 0.0:
            env.skip()
            continue
        tied = [role for role, bid in bids.items() if bid == top]
        assert len(tied) == 1, (
            f"{task} seed {seed}, decision {env.decisions_made}: the experts' top bids tie "
            f"({', '.join(tied)} all bid {top}). The no-tie rule: in every state the experts "
            "reach, one role's expert_bid is the highest (after snapping to the bid levels "
            f"{levels}), or all are 0; otherwise the PettingZoo and Gymnasium views, which "
            "break ties with another random stream, play other episodes than the expert loop "
            '(docs/architecture.md, "The task contract")'
        )
        env.step(tied[0], env.expert_action(tied[0]) or "")


def _check_refused(env: TextEnv, task: str, when: str) -> None:
    """``step`` and ``skip`` raise :class:`EpisodeNotRunning` and change nothing ``when``."""
    for call in (lambda: env.step(env.roles[0], "x"), env.skip):
        before = env.decisions_made if env.episode_started else None
        try:
            call()
        except EpisodeNotRunning:
            pass
        else:
            raise AssertionError(
                f"{task}: a step {when} did not raise EpisodeNotRunning (reset starts with "
                "begin_episode, skip with require_running: envs/base.py)"
            )
        after = env.decisions_made if env.episode_started else None
        assert after == before, f"{task}: a refused step {when} changed decisions_made"


def _check_episode_metrics(env: TextEnv, task: str, seed: int, total_reward: float) -> None:
    metrics = env.episode_metrics()
    where = f"{task}.episode_metrics() (seed {seed}, decision {env.decisions_made})"
    missing = sorted(EPISODE_METRICS.keys() - metrics.keys())
    assert not missing, f"{where} lacks {missing}: every task reports {sorted(EPISODE_METRICS)}"
    for key, value in metrics.items():
        assert type(value) is float, f"{where}[{key!r}] = {value!r}: metrics are floats"
    assert metrics["success"] in (0.0, 1.0), f"{where}['success'] = {metrics['success']!r}"
    assert abs(metrics["reward"] - total_reward) <= 1e-9 * max(1.0, abs(total_reward)), (
        f"{where}['reward'] = {metrics['reward']!r}, the steps' rewards sum to {total_reward!r}"
    )
    assert metrics["decisions"] == env.decisions_made, (
        f"{where}['decisions'] = {metrics['decisions']!r}, decisions_made = {env.decisions_made}"
    )
